#!/usr/bin/env bash
# scripts/demo.sh: sets up, builds (Release) and runs the scheduler demo, examples/sched_demo.c.
# Usage: scripts/demo.sh [sched_demo args...]    e.g. scripts/demo.sh --tiles 256 --reps 5
# Env: WEFT_WORKERS, WEFT_TOPOLOGY, WEFT_NO_PIN, WEFT_TRACE (see README.md); WF_BUILD_DIR
# (default build), WF_JOBS, WF_CMAKE_ARGS, WF_SETUP_SKIP=1.
set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "$0")/lib.sh"
cd "$WF_ROOT"

"$WF_ROOT/scripts/setup.sh"
build="${WF_BUILD_DIR:-build}"
wf_configure "$build" -DCMAKE_BUILD_TYPE=Release -DWF_BUILD_EXAMPLES=ON
wf_build "$build" sched_demo
# Run inside the build tree, so that the trace file it writes stays out of the sources.
cd "$build/examples"
exec ./sched_demo "$@"
