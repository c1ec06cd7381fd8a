#!/usr/bin/env bash
# scripts/demo.sh: sets up, builds (Release) and runs the main demo: weft-train
# (examples/weft-train) trains an MLP on the bundled handwritten digits with a progress bar,
# prints the test accuracy, and saves a checkpoint, a Perfetto trace and a plot of the loss
# and accuracy (an SVG; weft-train prints its full path) in the build tree.
# Usage: scripts/demo.sh [weft-train args...]   e.g. scripts/demo.sh --model cnn --epochs 20
#        scripts/demo.sh --sched [sched_demo args...]   the scheduler demo (a traced DAG)
#        scripts/demo.sh --dp [weft-train args...]      the same training data parallel on two
#                                                       local ranks (weft-run -n 2, multiworker)
# Env: WEFT_WORKERS, WEFT_TOPOLOGY, WEFT_NO_PIN, WEFT_TRACE (see README.md); WF_BUILD_DIR
# (default build), WF_JOBS, WF_CMAKE_ARGS, WF_SETUP_SKIP=1.
set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "$0")/lib.sh"
cd "$WF_ROOT"

"$WF_ROOT/scripts/setup.sh"
build="${WF_BUILD_DIR:-build}"
wf_configure "$build" -DCMAKE_BUILD_TYPE=Release -DWF_BUILD_EXAMPLES=ON
if [[ "${1:-}" == --sched ]]; then
    shift
    wf_build "$build" sched_demo
    # Run inside the build tree, so that the trace file it writes stays out of the sources.
    cd "$build/examples"
    exec ./sched_demo "$@"
fi
# programs: the libraries and every tool, so that "cmake --install" works right after the demo.
wf_build "$build" programs
cd "$build/examples/weft-train"
if [[ "${1:-}" == --dp ]]; then
    shift
    [[ $# -gt 0 ]] || set -- --save digits-mlp-dp.safetensors
    exec ../../tools/weft-run -n 2 ./weft-train --strategy multiworker "$@"
fi
if [[ $# -eq 0 ]]; then
    set -- --save digits-mlp.safetensors --log steps.jsonl --trace weft-train.trace.json \
        --plot "$PWD/digits-mlp.svg"
fi
exec ./weft-train "$@"
