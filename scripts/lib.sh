# shellcheck shell=bash
# scripts/lib.sh: helpers shared by the scripts (sourced, not run).
# WF_JOBS sets the build parallelism (default: every core); WF_CMAKE_ARGS adds configure
# options to every build the scripts make.

WF_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WF_JOBS="${WF_JOBS:-$(nproc)}"

# wf_configure DIR [cmake args...]: configures DIR with Ninja (or the generator it already has).
wf_configure()
{
    local dir="$1"
    shift
    local gen=(-G Ninja)
    [[ -f "$dir/CMakeCache.txt" ]] && gen=()
    # shellcheck disable=SC2086 # WF_CMAKE_ARGS is a list of words on purpose
    cmake -S "$WF_ROOT" -B "$dir" "${gen[@]}" "$@" ${WF_CMAKE_ARGS:-}
}

# wf_build DIR [targets...]: builds DIR (all targets when none are named).
wf_build()
{
    local dir="$1"
    shift
    local t=()
    for x in "$@"; do t+=(--target "$x"); done
    cmake --build "$dir" --parallel "$WF_JOBS" "${t[@]}"
}

# wf_tsan_prefix: prints the command prefix ThreadSanitizer needs here: nothing, or
# 'setarch <arch> -R' where the kernel's mmap layout makes TSan fail with "unexpected memory
# mapping" (high vm.mmap_rnd_bits with older TSan runtimes); ASLR off avoids it.
wf_tsan_prefix()
{
    local tmp
    tmp="$(mktemp -d)"
    printf '#include <pthread.h>\nstatic void *f(void *a) { return a; }\nint main(void) { pthread_t t; pthread_create(&t, 0, f, 0); return pthread_join(t, 0); }\n' >"$tmp/p.c"
    if ! cc -fsanitize=thread -pthread "$tmp/p.c" -o "$tmp/p" 2>"$tmp/err"; then
        echo "wf_tsan_prefix: cannot build a TSan probe:" >&2
        cat "$tmp/err" >&2
        rm -rf "$tmp"
        return 1
    fi
    if "$tmp/p" >/dev/null 2>&1; then
        :
    elif setarch "$(uname -m)" -R "$tmp/p" >/dev/null 2>&1; then
        echo "setarch $(uname -m) -R"
    else
        echo "wf_tsan_prefix: a TSan probe fails even with ASLR off:" >&2
        "$tmp/p" >&2 || true
        rm -rf "$tmp"
        return 1
    fi
    rm -rf "$tmp"
}
