#!/usr/bin/env bash
# scripts/check-readme.sh: keeps README.md honest.
#  - The code between '<!-- hello_tasks.c: begin -->' and '<!-- hello_tasks.c: end -->' is
#    examples/hello_tasks.c, byte for byte (that file is built and run by ctest).
#  - The README's first code block holds exactly two commands, and both are executable
#    scripts of this repository.
# Usage: scripts/check-readme.sh [--fix]   (--fix copies examples/hello_tasks.c into README.md)
set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "$0")/lib.sh"
cd "$WF_ROOT"

python3 - "${1:-}" <<'PY'
import os
import re
import sys

fix = sys.argv[1] == "--fix"
readme = open("README.md", encoding="utf-8").read()
src = open("examples/hello_tasks.c", encoding="utf-8").read()
fail = False

m = re.search(r"<!-- hello_tasks\.c: begin -->\n```c\n(.*?)```\n<!-- hello_tasks\.c: end -->",
              readme, re.S)
if not m:
    print("check-readme: README.md has no hello_tasks.c block between the markers",
          file=sys.stderr)
    sys.exit(1)
if m.group(1) != src:
    if fix:
        readme = readme[:m.start(1)] + src + readme[m.end(1):]
        open("README.md", "w", encoding="utf-8").write(readme)
        print("check-readme: copied examples/hello_tasks.c into README.md")
    else:
        import difflib
        sys.stderr.writelines(difflib.unified_diff(
            m.group(1).splitlines(True), src.splitlines(True), "README.md", "examples/hello_tasks.c"))
        print("check-readme: README.md's example differs from examples/hello_tasks.c "
              "(scripts/check-readme.sh --fix)", file=sys.stderr)
        fail = True

first = re.search(r"```(?:sh|bash)?\n(.*?)```", readme, re.S)
cmds = [l.split("#", 1)[0].strip() for l in first.group(1).splitlines()] if first else []
cmds = [c for c in cmds if c]
if len(cmds) != 2:
    print(f"check-readme: the first code block should hold two commands, not {cmds}",
          file=sys.stderr)
    fail = True
for c in cmds:
    exe = c.split()[0]
    if not (os.path.isfile(exe) and os.access(exe, os.X_OK)):
        print(f"check-readme: '{exe}' (from the README's first block) is not an executable "
              "script of the repository", file=sys.stderr)
        fail = True
if fail:
    sys.exit(1)
print(f"check-readme: ok (example = examples/hello_tasks.c; first commands: {'; '.join(cmds)})")
PY
