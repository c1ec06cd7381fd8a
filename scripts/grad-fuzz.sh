#!/usr/bin/env bash
# scripts/grad-fuzz.sh: a long run of the randomized gradient checker
# (tests/grad/test_grad_random.c), beyond the 300 seeds CI runs.
#   scripts/grad-fuzz.sh [COUNT [FIRST_SEED]]   default: 20000 graphs from seed 1000
# Env: WF_BUILD_DIR (default build): a configured build tree with the tests.
# A failing graph is printed with its seed and a command that reruns it alone
# (WF_GRAD_FUZZ_SEED=<seed> WF_GRAD_FUZZ_COUNT=1, WF_GRAD_FUZZ_PRINT=1 prints every graph).
set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "$0")/lib.sh"
cd "$WF_ROOT"

count="${1:-20000}"
first="${2:-1000}"
build="${WF_BUILD_DIR:-build}"
if [[ ! -f "$build/build.ninja" && ! -f "$build/Makefile" ]]; then
    echo "grad-fuzz: no build in '$build' (configure it first, or set WF_BUILD_DIR)" >&2
    exit 2
fi
cmake --build "$build" --target test_grad_grad_random
WF_GRAD_FUZZ_SEED="$first" WF_GRAD_FUZZ_COUNT="$count" \
    "$build/tests/test_grad_grad_random" --short-filename
