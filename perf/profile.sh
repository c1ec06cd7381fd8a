#!/usr/bin/env bash
# perf/profile.sh: how to profile weft's scheduler, shown on sched_bench's dag case.
# Owns: nothing but this walk-through. It runs four steps, each of which says what it runs
# and degrades with a clear message where a tool or a permission is missing:
#   1. perf stat (software events: these VMs have no hardware counters),
#   2. perf record -e cpu-clock -g, then the top lines of perf report (by thread and symbol),
#   3. the USDT probes of libweft.so (readelf; perf buildid-cache + perf list sdt; perf probe),
#   4. a Chrome/Perfetto trace through WEFT_TRACE, to open in ui.perfetto.dev.
# Usage: perf/profile.sh [BUILD_DIR]      (default: build; needs perf/sched_bench built)
# Environment: SB_ARGS (default "--only dag --impl weft --reps 3 --gap-ms 0"), SDT_ARGS (the
# smaller run that step 3 records probes on), OUT (where the files go, default
# BUILD_DIR/profile), PERF (default: perf).
# Not here: the benchmark itself (perf/sched/).
set -u

BUILD=${1:-build}
OUT=${OUT:-$BUILD/profile}
PERF=${PERF:-perf}
SB_ARGS=${SB_ARGS:---only dag --impl weft --reps 3 --gap-ms 0}
SDT_ARGS=${SDT_ARGS:---quick --only wide --impl weft --reps 1 --gap-ms 0}
BENCH=$BUILD/perf/sched_bench
LIB=$BUILD/libweft.so

say() { printf '\n== %s\n' "$*"; }
run() { printf '$ %s\n' "$*"; "$@"; }

if [ ! -x "$BENCH" ]; then
    echo "profile.sh: $BENCH not found. Build it first, e.g.:" >&2
    echo "  cmake -S . -B $BUILD -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo && cmake --build $BUILD" >&2
    echo "(RelWithDebInfo keeps symbols and line numbers for perf report.)" >&2
    exit 2
fi
mkdir -p "$OUT" || exit 2
LIB=$(readlink -f "$LIB" 2>/dev/null || echo "$LIB")

have_perf=0
if ! command -v "$PERF" >/dev/null 2>&1; then
    echo "profile.sh: '$PERF' is not installed (Debian: apt-get install linux-perf); steps 1-3 skipped."
elif ! "$PERF" stat -e task-clock -o /dev/null true >/dev/null 2>&1; then
    echo "profile.sh: '$PERF' cannot open events here (kernel.perf_event_paranoid is" \
        "$(cat /proc/sys/kernel/perf_event_paranoid 2>/dev/null || echo '?'), or no" \
        "perf_event_open in this container); steps 1-3 skipped."
else
    have_perf=1
fi

# shellcheck disable=SC2086 # SB_ARGS is a list of words on purpose.
if [ $have_perf = 1 ]; then
    say "1. perf stat: CPU time, context switches and migrations of one benchmark run"
    run "$PERF" stat -e task-clock,context-switches,cpu-migrations,page-faults \
        -- "$BENCH" $SB_ARGS

    say "2. perf record -e cpu-clock -g, then perf report (top lines)"
    echo "(cpu-clock: a software timer event; hardware cycles are not available in these VMs."
    echo " -g follows frame pointers; for full stacks through -O2 code use --call-graph dwarf,"
    echo " or configure with -DCMAKE_C_FLAGS=-fno-omit-frame-pointer.)"
    if run "$PERF" record -e cpu-clock -F 2000 -g -o "$OUT/perf.data" -- "$BENCH" $SB_ARGS \
        >"$OUT/record.log" 2>&1; then
        tail -n 3 "$OUT/record.log"
        echo "-- by thread (weft-w0, weft-w1, ... are weft's workers):"
        "$PERF" report -i "$OUT/perf.data" --stdio --no-children --sort comm -g none \
            2>/dev/null | grep -v '^#' | grep -v '^$' | head -n 12
        echo "-- by symbol (self time):"
        "$PERF" report -i "$OUT/perf.data" --stdio --no-children --sort comm,dso,symbol \
            --percent-limit 1 -g none 2>/dev/null | grep -v '^#' | grep -v '^$' | head -n 30
        echo "(Browse it: $PERF report -i $OUT/perf.data)"
    else
        echo "profile.sh: perf record failed; its output:"
        cat "$OUT/record.log"
    fi
fi

say "3. USDT probes of $LIB (sdt_weft:*)"
if [ ! -f "$LIB" ]; then
    echo "profile.sh: $LIB not found (a static-only build?); no probes to list."
elif ! command -v readelf >/dev/null 2>&1; then
    echo "profile.sh: readelf (binutils) is not installed; cannot read the probe notes."
elif ! readelf -n "$LIB" 2>/dev/null | grep -q stapsdt; then
    echo "profile.sh: $LIB has no USDT notes: it was built without sys/sdt.h"
    echo "(apt-get install systemtap-sdt-dev, then reconfigure; CMake says 'USDT probes are off')."
else
    echo "-- the probes, as readelf sees them (no privileges needed):"
    readelf -n "$LIB" | awk '/Provider:/ {p=$2} /Name:/ {print "  " p ":" $2}' | sort -u
    if [ $have_perf = 1 ]; then
        echo "-- perf: cache the library's build-id, then list its SDT events:"
        run "$PERF" buildid-cache --add "$LIB" && run "$PERF" list sdt 2>/dev/null | grep -i weft
        echo "-- perf probe turns them into events (needs root and a writable tracefs), one name"
        echo "   at a time: with 'sdt_weft:*' perf stops at the first name it cannot add."
        preexisting=$("$PERF" probe -l 'sdt_weft:*' 2>/dev/null)
        added=()
        for name in $(readelf -n "$LIB" | awk '/Name:/ {print $2}' | sort -u); do
            if "$PERF" probe -x "$LIB" --add "sdt_weft:$name" >"$OUT/probe.log" 2>&1; then
                added+=("sdt_weft:$name")
            else
                echo "   perf probe --add sdt_weft:$name failed (sites of one name must have the"
                echo "   same arguments; perf drops constant ones such as 0):"
                tail -n 2 "$OUT/probe.log" | sed 's/^/     /'
            fi
        done
        if [ ${#added[@]} -gt 0 ]; then
            events=$(IFS=,; echo "${added[*]}")
            # shellcheck disable=SC2086
            run "$PERF" record -q -e "$events" -o "$OUT/sdt.data" -- "$BENCH" $SDT_ARGS \
                >/dev/null 2>&1
            echo "-- events per probe (perf script -i $OUT/sdt.data shows each with its arguments):"
            "$PERF" script -i "$OUT/sdt.data" 2>/dev/null |
                awk '{for (i = 1; i <= NF; i++) if ($i ~ /^sdt_weft:/) n[$i]++}
                     END {for (e in n) printf "  %9d  %s\n", n[e], e}' | sort -k2
            if [ -z "$preexisting" ]; then
                "$PERF" probe -q -d 'sdt_weft:*' >/dev/null 2>&1
                echo "(removed the probes again: $PERF probe -d 'sdt_weft:*')"
            fi
        else
            echo "profile.sh: no probe could be added (not root, or tracefs is read-only here)."
            echo "   bpftrace reads the same notes: bpftrace -l 'usdt:$LIB:*'"
        fi
    fi
fi

say "4. A trace of weft's runs: WEFT_TRACE=FILE"
echo "(sched_bench reads it through wf_runtime_opts_from_env() and writes the trace after"
echo " the last weft run of the first case it runs; tracing slows weft down a little.)"
TRACE=$OUT/sched_bench.trace.json
# shellcheck disable=SC2086
if WEFT_TRACE=$TRACE run "$BENCH" $SB_ARGS && [ -s "$TRACE" ]; then
    echo "Wrote $TRACE ($(du -h "$TRACE" | cut -f1)): open it in https://ui.perfetto.dev"
    echo "(Open trace file) or chrome://tracing."
else
    echo "profile.sh: no trace was written to $TRACE (see the lines above)."
fi
