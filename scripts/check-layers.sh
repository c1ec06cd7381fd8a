#!/usr/bin/env bash
# scripts/check-layers.sh: enforces the "who may use whom" table of docs/architecture.md ("Layers").
# For every C/C++/CUDA file of a module (core/ sched/ memory/ devices/ ops/ grad/ placement/
# transport/ runtime/) and of tests/ perf/ examples/ include/weft/:
#  - a quoted include ("x.h", "../sched/deque.h") is resolved as the compiler would (beside the
#    file, then from the repo root) and may only land in the file's own module or in a module
#    that the table lets it use; never in another module's internal.h;
#  - sched/ may use core/ only for status and errors: "../core/error.h" and nothing else;
#  - <weft/X.h> may name base.h, the module's own public header, or those of modules it may
#    use; <weft/weft.h> (the umbrella) is for users: tests, perf and examples only;
#  - a third-party library's headers (hwloc, CUDA, OpenBLAS, UCX, libuv, NCCL, USDT, Criterion,
#    TBB, OpenMP) appear only in the modules the table gives that library to;
#  - tests/ use the public API, except files named test_internal_*.c; perf/ and examples/ use
#    the public API only (their own helper headers are fine);
#  - a module's CMake target links only the weft_* modules it may use (docs/conventions.md,
#    "Layout");
#  - runtime/compile/ (compiling a plan) includes no header of the rest of runtime/ (running
#    one: internal.h, ...), so runtime/'s two halves depend one way, run -> compile.
# Usage: scripts/check-layers.sh     Exit 1 with one 'file:line: why' per violation.
set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "$0")/lib.sh"
cd "$WF_ROOT"

if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git ls-files --cached --others --exclude-standard -- '*.c' '*.h' '*.cu' '*.cuh' '*.cpp' \
        '*.hpp' '*/CMakeLists.txt' | sort -u >"${TMPDIR:-/tmp}/wf-layers.$$"
else
    find . -path './build*' -prune -o -path './.git' -prune -o -type f \( -name '*.c' \
        -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' -o -name '*.cpp' -o -name '*.hpp' \
        -o -name CMakeLists.txt \) -print | sed 's|^\./||' | sort >"${TMPDIR:-/tmp}/wf-layers.$$"
fi
trap 'rm -f "${TMPDIR:-/tmp}/wf-layers.$$"' EXIT

python3 - "${TMPDIR:-/tmp}/wf-layers.$$" <<'EOF'
import os
import re
import sys

# docs/architecture.md, "Layers", shows this table. Keep the two equal.
USES = {
    "core": [],
    "sched": ["core"],  # core: status and errors only (RESTRICT below)
    "memory": ["core", "sched"],
    "devices": ["core", "sched", "memory"],
    "ops": ["core", "sched", "memory", "devices"],
    "grad": ["core", "ops"],
    "placement": ["core", "ops"],
    "transport": ["core", "sched", "memory", "devices"],
    "runtime": ["core", "sched", "memory", "devices", "ops", "grad", "placement", "transport"],
}
MODULES = list(USES)
# Of a used module, only these files (relative to the repo root).
RESTRICT = {("sched", "core"): {"core/error.h"}}
# The public header of each module (docs/conventions.md, "Layout").
PUBLIC = {m: ("core.h" if m == "core" else m + ".h") for m in MODULES}
# Modules with a second public header (an area big enough for its own): header -> module.
MORE_PUBLIC = {"nn.h": "ops", "distribute.h": "runtime"}
# Third-party libraries: the first component of the include name -> who may include it.
# 'runtime' (everything above) may include any of them; tests/ and perf/ too.
LIBS = {
    "hwloc": ["sched", "memory"],  # memory/: binding pool blocks to NUMA nodes
    "sys/sdt.h": ["sched"],  # USDT probes live in sched/ (trace.h); others call it
    "cuda": ["devices", "ops", "transport"],  # transport: NCCL's API takes cudaStream_t
    "cuda_runtime": ["devices", "ops", "transport"],
    "cuda_runtime_api": ["devices", "ops", "transport"],
    "cuda_fp16": ["devices", "ops"],
    "cuda_bf16": ["devices", "ops"],
    "cublas": ["devices", "ops"],
    "cublas_v2": ["devices", "ops"],
    "cublasLt": ["devices", "ops"],
    "cudnn": ["devices", "ops"],
    "cblas": ["ops"],
    "openblas_config": ["ops"],
    "ucp": ["transport"],
    "ucs": ["transport"],
    "uct": ["transport"],
    "uv": ["transport"],
    "nccl": ["transport"],
    "criterion": ["tests"],
    "tbb": ["perf"],
    "oneapi": ["perf"],
    "omp": ["perf"],
}
USERS = ["tests", "perf", "examples"]
# runtime/'s two halves: the compile side (this folder) never includes a header of the run
# side (the rest of runtime/: internal.h, ...), so the dependency points run -> compile.
COMPILE = "runtime/compile/"

files = [l.strip() for l in open(sys.argv[1]) if l.strip()]
errors = []


def err(path, line, msg):
    errors.append(f"{path}:{line}: {msg}")


def top(path):
    return path.split("/", 1)[0] if "/" in path else ""


def lib_key(name):
    if name in LIBS:
        return name
    first = name.split("/", 1)[0]
    stem = first[:-2] if first.endswith(".h") else first
    return stem if stem in LIBS else None


inc_re = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')
n_files = 0
for path in files:
    owner = top(path)
    if path.endswith("CMakeLists.txt") or not os.path.isfile(path):
        continue
    if owner not in MODULES and owner not in USERS and not path.startswith("include/weft/"):
        continue
    n_files += 1
    base = os.path.basename(path)
    internal_test = owner == "tests" and base.startswith("test_internal_")
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.readlines()
    for ln, text in enumerate(lines, 1):
        m = inc_re.match(text)
        if not m:
            continue
        kind, name = m.groups()
        if kind == "<":
            if name.startswith("weft/"):
                hdr = name[5:]
                if not os.path.isfile(os.path.join("include", "weft", hdr)):
                    err(path, ln, f"<{name}> is not a public header (include/weft/{hdr})")
                elif owner in MODULES:
                    if hdr == "weft.h":
                        err(path, ln, "<weft/weft.h> is the users' umbrella; include the "
                            "headers of the modules this one may use")
                    elif hdr != "base.h":
                        mods = {owner} | {u for u in USES[owner] if (owner, u) not in RESTRICT}
                        allowed = {PUBLIC[m] for m in mods} | {
                            h for h, m in MORE_PUBLIC.items() if m in mods}
                        if hdr not in allowed:
                            err(path, ln, f"{owner}/ may not use <weft/{hdr}> (may use: "
                                f"{', '.join(USES[owner]) or 'nothing'}; docs/architecture.md)")
                continue
            key = lib_key(name)
            if key is None:
                continue  # libc, POSIX, compiler headers
            who = LIBS[key]
            if path.startswith("include/weft/"):
                err(path, ln, f"<{name}>: a public header names no third-party type")
            elif (owner in who or owner == "tests"
                  or (owner == "runtime" and not set(who) <= {"tests", "perf"})
                  or (owner == "perf" and key != "criterion")):
                pass
            else:
                err(path, ln, f"<{name}> belongs to {' and '.join(who)}/, not {owner}/ "
                    "(docs/architecture.md, \"Layers\")")
            continue
        # A quoted include: beside the file first, then from an include folder inside the
        # file's own top folder (tests/support, say), then from the repo root (-I.).
        here = os.path.normpath(os.path.join(os.path.dirname(path), name))
        inside = [os.path.normpath(os.path.join(d, name))
                  for d, _, _ in os.walk(owner or ".") if owner]
        inside = [p for p in inside if os.path.isfile(p)]
        if os.path.isfile(here):
            target = here
        elif inside:
            target = inside[0]
        elif os.path.isfile(os.path.normpath(name)):
            target = os.path.normpath(name)
        else:
            err(path, ln, f'"{name}" not found beside the file, in {owner or "its"}/ '
                "nor from the repo root")
            continue
        if target.startswith(".."):
            err(path, ln, f'"{name}" leaves the repository')
            continue
        to = top(target)
        if path.startswith(COMPILE) and target.startswith("runtime/") and \
                not target.startswith(COMPILE):
            err(path, ln, f'"{name}": {COMPILE} includes no run-side header ({target}); what '
                "a compile needs of a session comes in through wf__compile_in "
                "(runtime/compile/plan.h)")
            continue
        if target.startswith("include/"):
            err(path, ln, f'"{name}": include public headers as <weft/...>')
        elif to == owner:
            pass
        elif internal_test and to in MODULES:
            pass  # tests/**/test_internal_*.c may look inside
        elif owner in USERS or owner not in MODULES:
            err(path, ln, f'"{name}": {owner or "this file"}/ uses the public API only'
                + (" (name the file test_internal_*.c to test internals)"
                   if owner == "tests" else ""))
        elif to not in MODULES:
            err(path, ln, f'"{name}": a module includes only its own and other modules\' headers')
        elif os.path.basename(target) == "internal.h":
            err(path, ln, f'"{name}": {to}/internal.h is private to {to}/')
        elif to not in USES[owner]:
            err(path, ln, f'"{name}": {owner}/ may not use {to}/ (may use: '
                f"{', '.join(USES[owner]) or 'nothing'}; docs/architecture.md)")
        elif (owner, to) in RESTRICT and target not in RESTRICT[(owner, to)]:
            err(path, ln, f'"{name}": {owner}/ may use only '
                f"{', '.join(sorted(RESTRICT[(owner, to)]))} of {to}/")

# CMake: a module's target links only what it may use.
tll = re.compile(r"target_link_libraries\s*\(([^)]*)\)", re.S)
for m in MODULES:
    cm = os.path.join(m, "CMakeLists.txt")
    if not os.path.isfile(cm):
        continue
    text = open(cm, encoding="utf-8").read()
    for call in tll.finditer(text):
        args = call.group(1).split()
        if not args or args[0] != f"weft_{m}":
            continue
        line = text.count("\n", 0, call.start()) + 1
        for a in args[1:]:
            dep = re.fullmatch(r"(?:\$<TARGET_OBJECTS:)?weft_(\w+)>?", a)
            if dep and dep.group(1) in MODULES and dep.group(1) not in USES[m]:
                err(cm, line, f"weft_{m} links weft_{dep.group(1)}, which {m}/ may not use")

for e in errors:
    print(e, file=sys.stderr)
if errors:
    print(f"check-layers: FAILED: {len(errors)} violation(s) in {n_files} files", file=sys.stderr)
    sys.exit(1)
print(f"check-layers: ok ({n_files} files)")
EOF
