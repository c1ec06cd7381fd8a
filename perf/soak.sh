#!/usr/bin/env bash
# perf/soak.sh: the soak of weft-run --restarts on loopback (what it does, checks and
# reports: perf/soak.py's header). Builds weft-run and restart_train in the build directory
# first when they are missing.
# Usage: perf/soak.sh [--short] [--build DIR] [--duration S] [--events N] [--seed N]
#   full: 10 minutes; --short: 45 s (the ctest perf_soak_short).
set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "$0")/../scripts/lib.sh"
B="${WF_BUILD_DIR:-$WF_ROOT/build}"
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
    [[ "${args[$i]}" == --build ]] && B="${args[$((i + 1))]:-$B}"
done
if [[ ! -x "$B/tools/weft-run" || ! -x "$B/tests/restart_train" ]]; then
    wf_build "$B" weft-run restart_train
fi
exec /usr/bin/python3 "$WF_ROOT/perf/soak.py" --build "$B" "$@"
