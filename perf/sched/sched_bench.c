/* perf/sched/sched_bench.c: the scheduler benchmark's driver: weft against oneTBB and
 * OpenMP on fib, wide, chain, chain_replay and dag, plus the idle CPU burn after a burst.
 * Owns: options, the order of runs, the checks of every result, and the output
 * (a table, or with --json one object per line as docs/conventions.md,
 * "Benchmarks", asks). Also the serial reference of the DAG (impl "serial").
 * Invariants: every case is warmed up once and timed --reps times; implementations take
 * turns within each round (the order rotates by one each round) with a --gap-ms sleep
 * before each run, so that noise hits all of them alike and no runtime's idle spinning
 * steals a core from the next one. Only sb_impl.run() is inside the clock; for chain and
 * dag that includes building the graph in every implementation, while freeing it
 * (cleanup()) is timed apart and shown as cleanup_s (OpenMP frees its tasks as they
 * complete, inside the run, so it has no cleanup_s). A wrong
 * result (fib's value, the chain's count, the DAG's checksum against the serial loop)
 * fails the run: exit status 1.
 * glibc's malloc thresholds are fixed at the start (main()), so that no implementation's
 * frees change whether another's large arrays are faulted in afresh.
 * Not here: the workloads (workloads.h), the runtimes' code (impl_*.c, impl_tbb*.cpp), the
 * clocks, medians and option parsing shared with the other drivers (../bench_util.h). */
#ifndef _GNU_SOURCE
#    define _GNU_SOURCE /* sched_getaffinity(), CPU_COUNT() */
#endif
#include "../bench_util.h"
#include "impl.h"

#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_IMPLS 5
#define MAX_REPS  1000

static const char *const bench_names[SB_N_BENCH] = { "fib", "wide", "chain", "chain_replay",
                                                     "dag" };
#define IDLE_BURN SB_N_BENCH /* the bit of --only that selects idle_burn */

typedef struct options {
    int threads;
    int reps;
    int gap_ms;
    int json;
    int quick;
    unsigned only;  /* bit b: run case b (IDLE_BURN included) */
    unsigned impls; /* bit i: run implementation i of the table in main() */
} options;

/* One implementation's state during the run. */
typedef struct impl_state {
    const sb_impl *impl;
    void *ctx;
    int started;
    int failed; /* in the current case: stop timing it */
    int n;      /* timed repetitions of the current case */
    double t[MAX_REPS];
    double tc[MAX_REPS]; /* the cleanup() after each, timed on its own */
    double median, min, max, cleanup_median;
} impl_state;

static void summarize(impl_state *s)
{
    double t[MAX_REPS];

    memcpy(t, s->t, (size_t)s->n * sizeof(double));
    s->median = bench_median(t, s->n);
    s->min = t[0];
    s->max = t[s->n - 1];
    memcpy(t, s->tc, (size_t)s->n * sizeof(double));
    s->cleanup_median = bench_median(t, s->n);
}

/* ---- the serial reference: the DAG's nodes in index order, a topological order --------- */

static int serial_start(void **ctx, int threads, char *info, size_t len)
{
    (void)threads;
    *ctx = NULL;
    snprintf(info, len, "serial: dag only, a plain loop over the nodes in topological order");
    return 0;
}

static void serial_stop(void *ctx)
{
    (void)ctx;
}

static const char *serial_skip(int bench)
{
    return bench == SB_DAG ? NULL : "the serial reference is for dag only";
}

static int serial_run(void *ctx, int bench, const sb_inputs *in, uint64_t *result)
{
    (void)ctx;
    *result = 0;
    if (bench != SB_DAG)
        return -1;
    for (int64_t i = 0; i < in->dag->n; i++)
        in->val[i] = sb_dag_node(in->dag, in->val, i);
    return 0;
}

static const sb_impl impl_serial = {
    .name = "serial",
    .start = serial_start,
    .stop = serial_stop,
    .skip = serial_skip,
    .run = serial_run,
};

/* ---- options ------------------------------------------------------------------------ */

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: sched_bench [--threads N] [--reps N] [--only LIST] [--impl LIST] [--json]\n"
        "                   [--gap-ms N] [--quick]\n"
        "  --threads N   threads per runtime (default: the cores this process may use)\n"
        "  --reps N      timed repetitions per case, after one warm-up (default 5)\n"
        "  --only LIST   cases, comma-separated: fib,wide,chain,chain_replay,dag,"
        "idle_burn\n"
        "                (default: all)\n"
        "  --impl LIST   implementations: weft,tbb,tbb_counters,omp,serial (default: all built)\n"
        "  --json        one JSON object per line instead of the table\n"
        "  --gap-ms N    sleep before each run, so the last runtime's spinning has died\n"
        "                down (default 300)\n"
        "  --quick       sizes / 10 (fib 25, 100k tasks, 100 DAG layers): a smoke test\n"
        "Environment: WEFT_TRACE=FILE writes a trace of weft's runs of the first case;\n"
        "WEFT_TOPOLOGY, WEFT_NO_PIN apply to weft (see wf_runtime_opts_from_env()).\n");
}

static int parse_options(int argc, char **argv, const char *const *impl_names, int n_impls,
                         options *o)
{
    static const char *const case_names[] = { "fib",          "wide", "chain",
                                              "chain_replay", "dag",  "idle_burn" };

    *o = (options){
        .threads = bench_default_threads(), .reps = 5, .gap_ms = 300, .only = ~0u, .impls = ~0u
    };
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;

        if (strcmp(a, "--threads") == 0)
            bad = bench_parse_int(v, 1, 1024, &o->threads), i++;
        else if (strcmp(a, "--reps") == 0)
            bad = bench_parse_int(v, 1, MAX_REPS, &o->reps), i++;
        else if (strcmp(a, "--gap-ms") == 0)
            bad = bench_parse_int(v, 0, 60000, &o->gap_ms), i++;
        else if (strcmp(a, "--only") == 0)
            bad = bench_parse_list("sched_bench", v, case_names, SB_N_BENCH + 1, &o->only), i++;
        else if (strcmp(a, "--impl") == 0)
            bad = bench_parse_list("sched_bench", v, impl_names, n_impls, &o->impls), i++;
        else if (strcmp(a, "--json") == 0)
            o->json = 1;
        else if (strcmp(a, "--quick") == 0)
            o->quick = 1;
        else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            exit(0);
        } else
            bad = 1;
        if (bad) {
            fprintf(stderr, "sched_bench: unknown option, or a bad or missing value: '%s'\n", a);
            usage(stderr);
            return -1;
        }
    }
    return 0;
}

/* ---- the driver ---------------------------------------------------------------------- */

typedef struct driver {
    options o;
    impl_state st[MAX_IMPLS];
    int n_st;
    const impl_state *last_run; /* the implementation that ran last: no gap before itself */
    uint64_t dag_checksum;      /* the serial loop's, computed once before any timing */
    int failed;
} driver;

/* A note for humans: stdout with the table, stderr with --json (stdout stays JSON). */
static FILE *notes(const driver *dr)
{
    return dr->o.json ? stderr : stdout;
}

static uint64_t bench_tasks(int bench, const sb_inputs *in)
{
    switch (bench) {
    case SB_FIB:
        return sb_fib_calls(in->fib_n);
    case SB_WIDE:
        return (uint64_t)in->wide_n;
    case SB_CHAIN:
    case SB_CHAIN_REPLAY:
        return (uint64_t)in->chain_n;
    default:
        return (uint64_t)in->dag->n;
    }
}

/* Runs one repetition of 'bench' on 's', then its cleanup (time in '*cleanup_s'), and
 * checks the result. Returns the wall time of the run, or a negative number on failure
 * (recorded in 's' and 'dr'). */
static double run_once(driver *dr, impl_state *s, int bench, const sb_inputs *in, double *cleanup_s)
{
    const char *name = bench_names[bench];
    uint64_t result = 0;
    double t0, t1, t2;
    int rc;

    if (dr->last_run != NULL && dr->last_run != s && dr->o.gap_ms > 0)
        bench_sleep_s(dr->o.gap_ms * 1e-3);
    if (bench == SB_DAG)
        memset(in->val, 0, (size_t)in->dag->n * sizeof(uint64_t));
    t0 = bench_now_s();
    rc = s->impl->run(s->ctx, bench, in, &result);
    t1 = bench_now_s();
    if (s->impl->cleanup != NULL)
        s->impl->cleanup(s->ctx, bench);
    t2 = bench_now_s();
    *cleanup_s = t2 - t1;
    dr->last_run = s;
    if (rc == 0 && bench == SB_FIB && result != sb_fib_expected(in->fib_n)) {
        fprintf(stderr, "FAIL: %s %s: fib(%d) gave %llu, not %llu\n", name, s->impl->name,
                in->fib_n, (unsigned long long)result,
                (unsigned long long)sb_fib_expected(in->fib_n));
        rc = -1;
    }
    if (rc == 0 && (bench == SB_CHAIN || bench == SB_CHAIN_REPLAY) &&
        result != (uint64_t)in->chain_n) {
        fprintf(stderr, "FAIL: %s %s: %llu of %lld chain tasks counted\n", name, s->impl->name,
                (unsigned long long)result, (long long)in->chain_n);
        rc = -1;
    }
    if (rc == 0 && bench == SB_DAG) {
        uint64_t sum = sb_dag_checksum(in->val, in->dag->n);

        if (sum != dr->dag_checksum) {
            fprintf(stderr, "FAIL: dag %s: checksum %016llx, serial gives %016llx\n", s->impl->name,
                    (unsigned long long)sum, (unsigned long long)dr->dag_checksum);
            rc = -1;
        }
    }
    if (rc != 0) {
        if (!s->failed)
            fprintf(stderr, "FAIL: %s %s: the run failed; no more runs of it in this case\n", name,
                    s->impl->name);
        s->failed = 1;
        dr->failed = 1;
        return -1;
    }
    return t1 - t0;
}

static int impl_threads(const driver *dr, const impl_state *s)
{
    return s->impl == &impl_serial ? 1 : dr->o.threads;
}

static void report_case(driver *dr, int bench, const sb_inputs *in, impl_state **part, int np)
{
    const char *name = bench_names[bench];
    uint64_t tasks = bench_tasks(bench, in);
    const impl_state *weft = NULL, *best = NULL, *serial = NULL;

    for (int j = 0; j < np; j++) {
        impl_state *s = part[j];

        if (s->n == 0)
            continue;
        summarize(s);
        if (s->impl == &sb_impl_weft)
            weft = s;
        else if (s->impl == &impl_serial)
            serial = s;
        else if (best == NULL || s->median < best->median)
            best = s;
        if (dr->o.json) {
            printf("{\"bench\":\"%s\",\"impl\":\"%s\",\"threads\":%d,\"median_s\":%.6g,"
                   "\"min_s\":%.6g,\"max_s\":%.6g,\"reps\":%d,\"tasks\":%llu,"
                   "\"ns_per_task\":%.1f",
                   name, s->impl->name, impl_threads(dr, s), s->median, s->min, s->max, s->n,
                   (unsigned long long)tasks, s->median * 1e9 / (double)tasks);
            if ((bench == SB_CHAIN || bench == SB_DAG) && s->impl->cleanup != NULL)
                printf(",\"cleanup_s\":%.6g", s->cleanup_median);
            if (bench == SB_DAG)
                printf(",\"checksum\":\"%016llx\"", (unsigned long long)dr->dag_checksum);
            printf("}\n");
        } else {
            printf("%-13s %-12s %7d %10.4f %10.4f %10.4f %9.1f %9llu", name, s->impl->name,
                   impl_threads(dr, s), s->median, s->min, s->max, s->median * 1e9 / (double)tasks,
                   (unsigned long long)tasks);
            if ((bench == SB_CHAIN || bench == SB_DAG) && s->impl->cleanup != NULL)
                printf(" %10.4f", s->cleanup_median);
            printf("\n");
        }
    }
    if (weft == NULL || (best == NULL && serial == NULL))
        return;
    if (dr->o.json) {
        printf("{\"bench\":\"%s\",\"impl\":\"ratio\",\"threads\":%d", name, dr->o.threads);
        if (best != NULL)
            printf(",\"weft_over_best_peer\":%.3f,\"best_peer\":\"%s\"",
                   weft->median / best->median, best->impl->name);
        for (int j = 0; j < np; j++)
            if (part[j] != weft && part[j]->n > 0)
                printf(",\"weft_over_%s\":%.3f", part[j]->impl->name,
                       weft->median / part[j]->median);
        printf("}\n");
    } else {
        printf("%-13s", "");
        if (best != NULL)
            printf(" weft / best peer (%s): %.2f%s", best->impl->name, weft->median / best->median,
                   serial != NULL ? ";" : "");
        if (serial != NULL)
            printf(" weft / serial: %.2f", weft->median / serial->median);
        printf("\n");
    }
}

static void run_case(driver *dr, int bench, const sb_inputs *in)
{
    impl_state *part[MAX_IMPLS];
    int np = 0;

    for (int j = 0; j < dr->n_st; j++) {
        impl_state *s = &dr->st[j];
        const char *why = s->started ? s->impl->skip(bench) : NULL;

        if (!s->started)
            continue;
        s->failed = 0;
        s->n = 0;
        if (why != NULL) {
            if (s->impl != &impl_serial)
                fprintf(notes(dr), "# %s %s: skipped: %s\n", bench_names[bench], s->impl->name,
                        why);
            continue;
        }
        if (s->impl->prepare != NULL && s->impl->prepare(s->ctx, bench, in) != 0) {
            fprintf(stderr, "FAIL: %s %s: prepare failed\n", bench_names[bench], s->impl->name);
            dr->failed = 1;
            continue;
        }
        part[np++] = s;
    }
    for (int r = -1; r < dr->o.reps; r++) { /* round -1 is the warm-up */
        for (int k = 0; k < np; k++) {
            impl_state *s = part[(k + (r < 0 ? 0 : r)) % np];
            double t, tc;

            if (s->failed)
                continue;
            t = run_once(dr, s, bench, in, &tc);
            if (t >= 0 && r >= 0) {
                s->tc[s->n] = tc;
                s->t[s->n++] = t;
            }
        }
    }
    for (int k = 0; k < np; k++)
        if (part[k]->impl->finish != NULL)
            part[k]->impl->finish(part[k]->ctx, bench);
    report_case(dr, bench, in, part, np);
}

/* After a burst of work in one runtime (the others idle for the gap before), the CPU time
 * the whole process burns while the main thread sleeps one second. 's' NULL: no burst, the
 * baseline of all runtimes idle. */
static void idle_burn(driver *dr, impl_state *s, const sb_inputs *burst)
{
    uint64_t result;
    double c0, c1, w0, w1, ms;
    char what[32];

    snprintf(what, sizeof(what), "fib(%d)", burst->fib_n);
    bench_sleep_s(dr->o.gap_ms > 300 ? dr->o.gap_ms * 1e-3 : 0.3);
    if (s != NULL && s->impl->run(s->ctx, SB_FIB, burst, &result) != 0) {
        fprintf(stderr, "FAIL: idle_burn %s: the burst failed\n", s->impl->name);
        dr->failed = 1;
        return;
    }
    c0 = bench_process_cpu_s();
    w0 = bench_now_s();
    bench_sleep_s(1.0);
    c1 = bench_process_cpu_s();
    w1 = bench_now_s();
    ms = (c1 - c0) * 1e3 / (w1 - w0);
    if (dr->o.json) {
        printf("{\"bench\":\"idle_burn\",\"impl\":\"%s\",\"threads\":%d,\"cpu_ms_per_s\":%.3f,"
               "\"burst\":\"%s\"}\n",
               s ? s->impl->name : "baseline", dr->o.threads, ms, s ? what : "none");
        return;
    }
    printf("%-13s %-12s %7d %10.3f ms CPU per idle second", "idle_burn",
           s ? s->impl->name : "baseline", dr->o.threads, ms);
    if (s == NULL)
        printf(" (no burst, every runtime idle)");
    else if (s->impl == &sb_impl_weft)
        printf(" (goal <= 1: %s)", ms <= 1.0 ? "met" : "MISSED");
    else if (strcmp(s->impl->name, "omp") == 0)
        printf(" (OpenMP threads spin after a region unless OMP_WAIT_POLICY=passive)");
    printf("\n");
}

int main(int argc, char **argv)
{
    const sb_impl *table[MAX_IMPLS];
    const char *names[MAX_IMPLS];
    const char *missing[MAX_IMPLS];
    int n_table = 0, n_missing = 0;
    driver dr = { 0 };
    sb_dag dag = { 0 };
    sb_inputs in;
    int scale;

    setvbuf(stdout, NULL, _IOLBF, 0); /* keep the table and the FAIL lines in order */
    /* glibc maps a large block afresh (and the kernel faults and zeroes its pages) unless an
     * earlier free raised its mmap threshold, so one implementation's frees decided whether
     * the next one's arrays cost page faults (tbb_counters' chain: 21-33 ns/task after
     * weft freed its 32 MB chunks, 47-62 ns when weft kept its blocks). Fixed thresholds
     * serve every implementation's blocks up to 32 MB from the reused heap alike. */
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
    table[n_table++] = &sb_impl_weft;
#ifdef SB_HAVE_TBB
    table[n_table++] = &sb_impl_tbb;
    table[n_table++] = &sb_impl_tbb_counters;
#else
    missing[n_missing++] = "tbb: skipped: oneTBB was not found when this was configured";
    missing[n_missing++] = "tbb_counters: skipped: oneTBB was not found when this was configured";
#endif
#ifdef SB_HAVE_OMP
    table[n_table++] = &sb_impl_omp;
#else
    missing[n_missing++] = "omp: skipped: OpenMP was not found when this was configured";
#endif
    table[n_table++] = &impl_serial;
    for (int i = 0; i < n_table; i++)
        names[i] = table[i]->name;
    if (parse_options(argc, argv, names, n_table, &dr.o) != 0)
        return 2;
    scale = dr.o.quick ? 10 : 1;
    in = (sb_inputs){ .fib_n = dr.o.quick ? 25 : SB_FIB_N,
                      .wide_n = SB_WIDE_N / scale,
                      .chain_n = SB_CHAIN_N / scale };

    if (!dr.o.json)
        printf("sched_bench: %d threads, median of %d timed runs after 1 warm-up, "
               "implementations interleaved with a %d ms gap\n",
               dr.o.threads, dr.o.reps, dr.o.gap_ms);
    for (int i = 0; i < n_missing; i++)
        fprintf(notes(&dr), "# %s\n", missing[i]);
    for (int i = 0; i < n_table; i++) {
        impl_state *s = &dr.st[dr.n_st++];
        char info[512] = "";

        s->impl = table[i];
        if (!(dr.o.impls & (1u << i)))
            continue;
        if (s->impl->start(&s->ctx, dr.o.threads, info, sizeof(info)) != 0) {
            fprintf(stderr, "sched_bench: %s failed to start\n", s->impl->name);
            dr.failed = 1;
            continue;
        }
        s->started = 1;
        fprintf(notes(&dr), "# %s\n", info);
    }

    if (dr.o.only & (1u << SB_DAG)) {
        int64_t layers = SB_DAG_LAYERS / scale;

        if (sb_dag_generate(&dag, layers, SB_DAG_WIDTH) != 0 ||
            (in.val = calloc((size_t)dag.n, sizeof(uint64_t))) == NULL) {
            fprintf(stderr, "sched_bench: out of memory for the DAG\n");
            return 2;
        }
        in.dag = &dag;
        for (int64_t i = 0; i < dag.n; i++)
            in.val[i] = sb_dag_node(&dag, in.val, i);
        dr.dag_checksum = sb_dag_checksum(in.val, dag.n);
        fprintf(
            notes(&dr),
            "# dag: %lld layers x %lld nodes, %d predecessors each, %d rounds per node; "
            "serial checksum %016llx; building the graph is timed in every impl, freeing it is not "
            "(cleanup_s)\n",
            (long long)layers, (long long)SB_DAG_WIDTH, SB_DAG_PREDS, SB_DAG_ROUNDS,
            (unsigned long long)dr.dag_checksum);
    }

    if (!dr.o.json)
        printf("%-13s %-12s %7s %10s %10s %10s %9s %9s %10s\n", "bench", "impl", "threads",
               "median_s", "min_s", "max_s", "ns/task", "tasks", "cleanup_s");
    for (int b = 0; b < SB_N_BENCH; b++)
        if (dr.o.only & (1u << b))
            run_case(&dr, b, &in);

    if (dr.o.only & (1u << IDLE_BURN)) {
        sb_inputs burst = { .fib_n = dr.o.quick ? 22 : 27 };

        idle_burn(&dr, NULL, &burst);
        for (int j = 0; j < dr.n_st; j++)
            if (dr.st[j].started && dr.st[j].impl != &impl_serial)
                idle_burn(&dr, &dr.st[j], &burst);
    }

    for (int j = 0; j < dr.n_st; j++)
        if (dr.st[j].started)
            dr.st[j].impl->stop(dr.st[j].ctx);
    free(in.val);
    sb_dag_free(&dag);
    if (dr.failed)
        fprintf(stderr, "sched_bench: FAILED (see the FAIL lines above)\n");
    return dr.failed ? 1 : 0;
}
