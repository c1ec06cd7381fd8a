#!/usr/bin/env bash
# scripts/check-headers.sh: every public header compiles on its own (docs/conventions.md,
# "Layout"): for each include/weft/*.h, a file that includes only it (twice, for the include
# guard) must compile as strict C11 with the C compiler and as C++11 and C++17 with the C++
# compiler, -Wall -Wextra -Wpedantic -Werror. It must also not need a private header or a
# third-party one.
# Usage: scripts/check-headers.sh     (CC and CXX choose the compilers; default cc and c++)
set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "$0")/lib.sh"
cd "$WF_ROOT"

cc="${CC:-cc}"
cxx="${CXX:-c++}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
warn=(-Wall -Wextra -Wpedantic -Werror)
fail=0
n=0
for h in include/weft/*.h; do
    name="$(basename "$h")"
    printf '#include <weft/%s>\n#include <weft/%s>\n' "$name" "$name" >"$tmp/one.c"
    cp "$tmp/one.c" "$tmp/one.cpp"
    n=$((n + 1))
    # -nostdinc is too strong (libc is fine); -I only the public folder: no private header.
    if ! "$cc" -std=c11 "${warn[@]}" -fsyntax-only -Iinclude "$tmp/one.c" 2>"$tmp/err"; then
        echo "check-headers: $h does not compile alone as C11:" >&2
        cat "$tmp/err" >&2
        fail=1
    fi
    for std in c++11 c++17; do
        if ! "$cxx" -std="$std" "${warn[@]}" -fsyntax-only -Iinclude "$tmp/one.cpp" 2>"$tmp/err"; then
            echo "check-headers: $h does not compile alone as $std:" >&2
            cat "$tmp/err" >&2
            fail=1
        fi
    done
    # Anything it includes with quotes would be a private header of the source tree.
    if grep -nE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$h" >&2; then
        echo "check-headers: $h includes a quoted (private) header" >&2
        fail=1
    fi
done

# The umbrella includes every other public header, and nothing else.
for h in include/weft/*.h; do
    name="$(basename "$h")"
    [[ "$name" == weft.h ]] && continue
    if ! grep -qE "^#[[:space:]]*include <weft/$name>" include/weft/weft.h; then
        echo "check-headers: include/weft/weft.h does not include <weft/$name>" >&2
        fail=1
    fi
done

if ((fail)); then
    echo "check-headers: FAILED" >&2
    exit 1
fi
echo "check-headers: ok ($n headers; $("$cc" --version | head -1); C11, C++11, C++17)"
