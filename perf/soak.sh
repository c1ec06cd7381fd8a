#!/usr/bin/env bash
# perf/soak.sh: the soak of weft-run --restarts on loopback (what it does, checks and
# reports: perf/soak.py's header). Builds weft-run and the program (restart_train, or
# weft-train with --program weft-train) in the build directory first when they are missing.
# Usage: perf/soak.sh [--short] [--build DIR] [--duration S] [--events N] [--seed N]
#                     [--program restart_train|weft-train]
#   full: 10 minutes; --short: 45 s (the ctest transport_soak_short).
set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "$0")/../scripts/lib.sh"
B="${WF_BUILD_DIR:-$WF_ROOT/build}"
args=("$@")
prog=restart_train
for ((i = 0; i < ${#args[@]}; i++)); do
    [[ "${args[$i]}" == --build ]] && B="${args[$((i + 1))]:-$B}"
    [[ "${args[$i]}" == --program ]] && prog="${args[$((i + 1))]:-$prog}"
done
exe="$B/tests/restart_train"
[[ "$prog" == weft-train ]] && exe="$B/examples/weft-train/weft-train"
if [[ ! -x "$B/tools/weft-run" || ! -x "$exe" ]]; then
    wf_build "$B" weft-run "$prog"
fi
exec /usr/bin/python3 "$WF_ROOT/perf/soak.py" --build "$B" "$@"
