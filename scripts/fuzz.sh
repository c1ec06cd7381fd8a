#!/usr/bin/env bash
# scripts/fuzz.sh: builds the libFuzzer targets (fuzz/, clang with ASan, UBSan and libFuzzer)
# in their own build folder and runs each for a fixed time: first the saved crashing inputs
# of fuzz/regressions/<target>/ (each must now pass), then fuzzing from the seeds of
# fuzz/corpus/<target>/ and what earlier runs in this build folder found. Fails on any crash,
# leak, UBSan report, timeout or out-of-memory; prints per target the executions, the
# coverage (cov/ft of libFuzzer's last line) and the corpus size.
# Usage: scripts/fuzz.sh [seconds-per-target]   (default 60)
#   WF_FUZZ_BUILD_DIR (default build-fuzz), WF_FUZZ_TARGETS="csv npy" (default: all),
#   WF_JOBS (ninja -j, default 2). A crash leaves its input in <build>/artifacts/<target>/.
set -euo pipefail
cd "$(dirname "$0")/.."

secs="${1:-60}"
build="${WF_FUZZ_BUILD_DIR:-build-fuzz}"
targets="${WF_FUZZ_TARGETS:-safetensors checkpoint frame flight csv gzip idx npy}"

cc=""
for c in clang-14 clang; do
    if command -v "$c" >/dev/null; then
        cc="$c"
        break
    fi
done
if [[ -z "$cc" ]]; then
    echo "fuzz: no clang found (apt-get install clang libclang-rt-14-dev)" >&2
    exit 1
fi
cxx="${cc/clang/clang++}"

if [[ ! -f "$build/build.ninja" ]]; then
    CC="$cc" CXX="$cxx" cmake -S fuzz -B "$build" -G Ninja >"$build.cmake.log" 2>&1 || {
        cat "$build.cmake.log" >&2
        exit 1
    }
fi
ninja -C "$build" -j "${WF_JOBS:-2}" $(for t in $targets; do echo "fuzz_$t"; done)

export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:allocator_may_return_null=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"

failed=()
summary=()
for t in $targets; do
    exe="$build/fuzz_$t"
    work="$build/corpus/$t"
    art="$build/artifacts/$t"
    mkdir -p "$work" "$art"
    # The seeds are copied: libFuzzer writes what it finds (and may reduce inputs) in the
    # corpus folders it is given, and fuzz/corpus/ is tracked.
    cp -n "fuzz/corpus/$t"/* "$work/"
    log="$build/fuzz_$t.log"
    echo "==== fuzz_$t: regressions, then ${secs}s from fuzz/corpus/$t"
    regs=()
    if [[ -d "fuzz/regressions/$t" ]]; then
        mapfile -t regs < <(find "fuzz/regressions/$t" -type f | sort)
    fi
    if ((${#regs[@]})) && ! "$exe" -rss_limit_mb=2048 -timeout=20 "${regs[@]}" >"$log.reg" 2>&1; then
        tail -40 "$log.reg"
        failed+=("$t (a saved regression input fails again: $log.reg)")
        summary+=("$(printf '%-12s regression FAILED' "$t")")
        continue
    fi
    rc=0
    "$exe" -max_total_time="$secs" -print_final_stats=1 -rss_limit_mb=2048 -timeout=20 \
        -artifact_prefix="$art/" "$work" >"$log" 2>&1 || rc=$?
    last=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
    ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
    corp=$(find "$work" -type f | wc -l)
    line=$(printf '%-12s execs %-10s cov %-6s ft %-6s corpus %s files, %s regressions' \
        "$t" "${execs:-?}" "${cov:-?}" "${ft:-?}" "$corp" "${#regs[@]}")
    if ((rc != 0)); then
        grep -E 'ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error|SUMMARY|Test unit written' "$log" | head -20 || true
        failed+=("$t (exit $rc: $log, input in $art/)")
        line="$line  FAILED"
    fi
    summary+=("$line")
    echo "$line"
done

echo
echo "==== fuzz summary (${secs}s per target)"
printf '  %s\n' "${summary[@]}"
if ((${#failed[@]})); then
    printf 'fuzz: FAILED: %s\n' "${failed[@]}" >&2
    exit 1
fi
echo "fuzz: all ${#summary[@]} targets ran clean"
