#!/usr/bin/env bash
# scripts/sanitize.sh: builds weft with a sanitizer and runs tests under it.
#   scripts/sanitize.sh thread  [ctest args]   ThreadSanitizer, build-tsan: the scheduler's
#                                              tests, autodiff and the examples (ctest -L 'sched|runtime|examples|transport|grad')
#   scripts/sanitize.sh address [ctest args]   AddressSanitizer + UBSan, build-asan: every test
# Extra ctest args replace the default label selection (e.g. -R deque).
# Env: WF_JOBS, WF_CMAKE_ARGS, WF_TEST_TIMEOUT (default 900: sanitizers are slow), WF_SETUP_SKIP.
set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "$0")/lib.sh"
cd "$WF_ROOT"

kind="${1:-}"
shift || true
prefix=()
case "$kind" in
thread)
    build="${WF_BUILD_DIR:-build-tsan}"
    cfg=(-DWF_SANITIZE=thread -DWF_BUILD_PERF=OFF)
    sel=(-L 'sched|runtime|examples|transport|grad')
    # halt_on_error: the first race fails the test, with its two stacks.
    export TSAN_OPTIONS="${TSAN_OPTIONS:-halt_on_error=1 second_deadlock_stack=1}"
    tp="$(wf_tsan_prefix)"
    read -r -a prefix <<<"$tp"
    if ((${#prefix[@]})); then
        echo "sanitize: this kernel's mmap layout needs ASLR off for TSan: ${prefix[*]}"
    fi
    ;;
address)
    build="${WF_BUILD_DIR:-build-asan}"
    cfg=(-DWF_SANITIZE=address)
    sel=()
    export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1 detect_stack_use_after_return=1 strict_string_checks=1 check_initialization_order=1}"
    export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1 halt_on_error=1}"
    ;;
*)
    echo "usage: scripts/sanitize.sh thread|address [ctest args...]" >&2
    exit 2
    ;;
esac
(($#)) && sel=("$@")

"$WF_ROOT/scripts/setup.sh"
wf_configure "$build" "${cfg[@]}"
wf_build "$build"
"${prefix[@]}" ctest --test-dir "$build" --output-on-failure --no-tests=error \
    --timeout "${WF_TEST_TIMEOUT:-900}" "${sel[@]}"
