#!/usr/bin/env bash
# scripts/check-format.sh: fails when a C, C++ or CUDA file of the repo is not formatted as the
# repo's .clang-format says (clang-format --dry-run -Werror). Checks the files git tracks plus
# the new ones it does not ignore, so it says the same before a commit as CI says after it.
# Usage: scripts/check-format.sh [--fix]   (--fix rewrites the files with clang-format -i)
set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "$0")/lib.sh"
cd "$WF_ROOT"

if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    mapfile -t files < <(git ls-files --cached --others --exclude-standard -- \
        '*.c' '*.h' '*.cu' '*.cuh' '*.cpp' '*.hpp' | sort -u)
else
    mapfile -t files < <(find . -path './build*' -prune -o -path './.git' -prune -o -type f \
        \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' -o -name '*.cpp' \
        -o -name '*.hpp' \) -print | sed 's|^\./||' | sort)
fi
existing=()
for f in "${files[@]}"; do [[ -f "$f" ]] && existing+=("$f"); done
if ((${#existing[@]} == 0)); then
    echo "check-format: no C/C++/CUDA files found" >&2
    exit 1
fi

echo "check-format: $(clang-format --version | head -1); ${#existing[@]} files"
if [[ "${1:-}" == --fix ]]; then
    clang-format -i "${existing[@]}"
    echo "check-format: formatted ${#existing[@]} files"
    exit 0
fi
if ! clang-format --dry-run -Werror "${existing[@]}"; then
    echo "check-format: FAILED; fix with scripts/check-format.sh --fix" >&2
    exit 1
fi
echo "check-format: ok"
