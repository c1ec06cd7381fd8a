/* perf/sched/impl.h: the contract between sched_bench's driver and each runtime it measures.
 * Owns: the list of cases (sb_bench), their inputs (sb_inputs) and the table of calls every
 * implementation fills (sb_impl): weft (impl_weft.c), oneTBB's flow graph and task_group
 * (impl_tbb.cpp), oneTBB task_group with atomic successor counters (impl_tbb_counters.cpp),
 * OpenMP (impl_omp.c) and the serial reference (sched_bench.c).
 * Invariant: the driver times only run(); prepare(), cleanup() and finish() are outside the
 * clock, so whatever a case counts as its work (building a graph, say) must happen inside
 * run(), and freeing what run() built happens in cleanup() (timed on its own).
 * Not here: the workloads themselves (workloads.h), timing and output (sched_bench.c). */
#ifndef PERF_SCHED_IMPL_H
#define PERF_SCHED_IMPL_H

#include "workloads.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum sb_bench {
    SB_FIB,          /* fib(fib_n), one task per call, no serial cutoff */
    SB_WIDE,         /* one root task spawns wide_n empty tasks, then joins */
    SB_CHAIN,        /* chain_n tasks, each after the previous: build, run, free */
    SB_CHAIN_REPLAY, /* the same chain built once by prepare(), only the run timed */
    SB_DAG,          /* the layered DAG: build, run, free */
    SB_N_BENCH
} sb_bench;

typedef struct sb_inputs {
    int fib_n;
    int64_t wide_n;
    int64_t chain_n;
    const sb_dag *dag;
    uint64_t *val; /* dag->n slots: run(SB_DAG) writes every node's value here */
} sb_inputs;

typedef struct sb_impl {
    const char *name; /* "weft", "tbb", "tbb_counters", "omp", "serial": the JSON 'impl' */
    /* Starts the runtime with 'threads' threads in all (the caller's included where the
     * runtime uses it) and prints a one-line description to 'info' (at most 'len' bytes).
     * Returns 0 or -1 (the reason printed on stderr). */
    int (*start)(void **ctx, int threads, char *info, size_t len);
    void (*stop)(void *ctx);
    /* NULL when the implementation runs 'bench', else why it does not. */
    const char *(*skip)(int bench);
    /* Untimed, once before the warm-up of 'bench'. Returns 0 or -1. May be NULL. */
    int (*prepare)(void *ctx, int bench, const sb_inputs *in);
    /* Timed: one repetition. '*result' is fib's value, or the chain's count of tasks run
     * (0 for wide and dag, whose check is the checksum of 'val'). Returns 0 or -1. */
    int (*run)(void *ctx, int bench, const sb_inputs *in, uint64_t *result);
    /* Untimed, after each run(), failed or not: frees the graph run() built. May be NULL. */
    void (*cleanup)(void *ctx, int bench);
    /* Untimed, once after the last repetition of 'bench'. May be NULL. */
    void (*finish)(void *ctx, int bench);
} sb_impl;

extern const sb_impl sb_impl_weft;
#ifdef SB_HAVE_TBB
extern const sb_impl sb_impl_tbb;
extern const sb_impl sb_impl_tbb_counters;
#endif
#ifdef SB_HAVE_OMP
extern const sb_impl sb_impl_omp;
#endif

#ifdef __cplusplus
}
#endif
#endif /* PERF_SCHED_IMPL_H */
