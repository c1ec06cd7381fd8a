#!/usr/bin/env bash
# scripts/check-docs.sh: keeps the documents in the repository (docs/*.md, README.md and the
# folders' README.md files) true to the code and self-contained.
#  - No tracked file cites the developers' notes that are not part of the repository (the
#    design, style and lessons files kept beside a checkout): a user has only the repository,
#    so every reference points at docs/ or says its reason in place.
#  - Every C code block of docs/*.md sits between '<!-- PATH: begin -->' and
#    '<!-- PATH: end -->' markers and is the file PATH (relative to the repository root) byte
#    for byte, and PATH's program is registered in a CMakeLists.txt under examples/ (so the
#    test suite builds and runs it). Shell blocks are commands, not programs, and are exempt.
#  - Every weft name a document writes (wf_x, wf__x, WF_X) appears in some tracked file
#    outside the documents; those docs/guide.md writes (a user's tutorial) are public ones,
#    declared in include/weft/.
#  - Every relative link of a document ('[text](path)') names a file or folder that exists.
# Usage: scripts/check-docs.sh [--fix]   (--fix copies each PATH into its document's block)
set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "$0")/lib.sh"
cd "$WF_ROOT"

python3 - "${1:-}" <<'PY'
import difflib
import os
import re
import subprocess
import sys

fix = sys.argv[1] == "--fix"
errors = []
files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                       check=True, capture_output=True, text=True).stdout.split()
files = [f for f in files if os.path.isfile(f)]
self_path = "scripts/check-docs.sh"

# 1. No citation of the notes kept outside the repository. The names are assembled here so
# that this script does not match itself.
notes = ["DESIGN", "STYLE", "LESSONS"]
cite = re.compile(r"\.\./(?:\.\./)*shared/|\b(?:" + "|".join(notes) + r")\.md\b")
for f in files:
    if f == self_path:
        continue
    try:
        text = open(f, encoding="utf-8").read()
    except (UnicodeDecodeError, OSError):
        continue  # data files
    for ln, line in enumerate(text.splitlines(), 1):
        m = cite.search(line)
        if m:
            errors.append(f"{f}:{ln}: cites '{m.group(0)}', which is not in the repository; "
                          "point at docs/ or say the reason in place")

# 2. Every C code block of docs/*.md is a file of the repository that ctest runs.
docs = sorted(f for f in files if f.startswith("docs/") and f.endswith(".md"))
block = re.compile(r"<!-- (\S+): begin -->\n```c\n(.*?)```\n<!-- \1: end -->\n", re.S)
fence = re.compile(r"^```(\w*)\n(.*?)^```\n", re.S | re.M)
cmake = "".join(open(f, encoding="utf-8").read() for f in files
                if f.startswith("examples/") and f.endswith("CMakeLists.txt"))
n_blocks = 0
for d in docs:
    text = open(d, encoding="utf-8").read()
    marked = [(m.start(), m.end()) for m in block.finditer(text)]
    for m in fence.finditer(text):
        if m.group(1) in ("c", "C", "cpp", "h") and not any(a <= m.start() < b for a, b in marked):
            ln = text.count("\n", 0, m.start()) + 1
            errors.append(f"{d}:{ln}: a C code block outside '<!-- PATH: begin -->' markers "
                          "(every program of the docs is a file that the tests build and run)")
    out, at, changed = [], 0, False
    for m in block.finditer(text):
        path, body = m.group(1), m.group(2)
        ln = text.count("\n", 0, m.start()) + 1
        n_blocks += 1
        if not os.path.isfile(path):
            errors.append(f"{d}:{ln}: block of '{path}', which does not exist")
            continue
        src = open(path, encoding="utf-8").read()
        stem = os.path.splitext(os.path.basename(path))[0]
        if not re.search(r"\b" + re.escape(stem) + r"\b", cmake):
            errors.append(f"{d}:{ln}: '{path}' is not built by any examples/**/CMakeLists.txt")
        if body != src:
            if fix:
                out.append(text[at:m.start(2)] + src)
                at = m.end(2)
                changed = True
            else:
                sys.stderr.writelines(difflib.unified_diff(
                    body.splitlines(True), src.splitlines(True), d, path))
                errors.append(f"{d}:{ln}: the block differs from '{path}' "
                              "(scripts/check-docs.sh --fix copies the file in)")
    if changed:
        out.append(text[at:])
        open(d, "w", encoding="utf-8").write("".join(out))
        print(f"check-docs: copied the files into {d}")

# 3. Names written in the documents exist in the code.
readmes = sorted(f for f in files if os.path.basename(f) == "README.md")
prose = docs + [r for r in readmes if r not in docs]
public = "".join(open(f, encoding="utf-8").read() for f in files
                 if f.startswith("include/weft/") and f.endswith(".h"))
code_exts = (".c", ".h", ".cu", ".cmake", ".sh", ".txt", ".in", ".py", ".cpp")
code = "".join(open(f, encoding="utf-8", errors="replace").read() for f in files
               if f.endswith(code_exts) or f.startswith(".ci/"))
name = re.compile(r"\b(wf__?[a-z0-9_]*[a-z0-9]|WF_[A-Z0-9_]*[A-Z0-9])\b")
seen = {}
for d in prose:
    text = open(d, encoding="utf-8").read()
    for ln, line in enumerate(text.splitlines(), 1):
        for m in name.finditer(line):
            n = m.group(1)
            if n in seen:
                ok = seen[n]
            else:
                ok = re.search(r"\b" + re.escape(n) + r"\b", code) is not None
                seen[n] = ok
            # The guide is for users: what it names is public.
            if ok and d == "docs/guide.md" and n.startswith("wf_") and not n.startswith("wf__"):
                if not re.search(r"\b" + re.escape(n) + r"\b", public):
                    errors.append(f"{d}:{ln}: '{n}' is not in include/weft/")
            if not ok:
                errors.append(f"{d}:{ln}: '{n}' is not in the code")

# 4. Relative links name something that exists.
link = re.compile(r"\]\(([^)\s]+)\)")
for d in prose:
    text = open(d, encoding="utf-8").read()
    for ln, line in enumerate(text.splitlines(), 1):
        for m in link.finditer(line):
            target = m.group(1).split("#", 1)[0]
            if not target or re.match(r"[a-z]+:", target):
                continue
            p = os.path.normpath(os.path.join(os.path.dirname(d), target))
            if not os.path.exists(p):
                errors.append(f"{d}:{ln}: link to '{m.group(1)}', which does not exist")

for e in errors:
    print(e, file=sys.stderr)
if errors:
    print(f"check-docs: FAILED: {len(errors)} problem(s)", file=sys.stderr)
    sys.exit(1)
print(f"check-docs: ok ({len(files)} files without outside citations; {len(docs)} documents, "
      f"{n_blocks} program blocks equal to their files; {len(seen)} names found in the code)")
PY
