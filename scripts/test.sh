#!/usr/bin/env bash
# scripts/test.sh: sets up, builds and runs every test (ctest --output-on-failure).
# Usage: scripts/test.sh [ctest args...]    e.g. scripts/test.sh -L sched -R deque
# Env: WF_BUILD_DIR (default build-test), WF_JOBS, WF_CMAKE_ARGS, WF_TEST_TIMEOUT (seconds per
# test without a TIMEOUT of its own; default 600), WF_SETUP_SKIP=1. With CI=true the PyTorch
# parity tests fail instead of skipping when torch does not import.
set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "$0")/lib.sh"
cd "$WF_ROOT"

"$WF_ROOT/scripts/setup.sh" --tests # python3-torch for the parity tests, too
build="${WF_BUILD_DIR:-build-test}"
wf_configure "$build"
wf_build "$build"
ctest --test-dir "$build" --output-on-failure --no-tests=error \
    --timeout "${WF_TEST_TIMEOUT:-600}" "$@"
