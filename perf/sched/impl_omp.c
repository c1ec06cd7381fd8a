/* perf/sched/impl_omp.c: sched_bench's workloads written idiomatically with OpenMP tasks.
 * Owns: the OpenMP side of the benchmark. Each run is one 'parallel num_threads(N)' region
 * whose 'single' thread creates the tasks: fib with 'task shared(x)' per call and
 * 'taskwait', wide with a root task, chain and dag with 'depend' clauses (the DAG names its
 * four predecessors as explicit 'in' items). Built with the compiler's OpenMP flags.
 * Invariant: OpenMP has no graph to keep and replay, so chain_replay is skipped.
 * Not here: the per-node work (workloads.h), timing and output (sched_bench.c). Nothing
 * sets OMP_WAIT_POLICY: the runtime's own spinning after a region is part of what the
 * idle_burn case measures. */
#ifndef _GNU_SOURCE
#    define _GNU_SOURCE /* dladdr(), to name the OpenMP runtime that is linked */
#endif
#include "impl.h"

#include <dlfcn.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct omp_ctx {
    int threads;
} omp_ctx;

static uint64_t fib(int n)
{
    uint64_t x, y;

    if (n < 2)
        return (uint64_t)n;
#pragma omp task shared(x)
    x = fib(n - 1);
#pragma omp task shared(y)
    y = fib(n - 2);
#pragma omp taskwait
    return x + y;
}

static uint64_t fib_root(int threads, int n)
{
    uint64_t r = 0;

#pragma omp parallel num_threads(threads)
#pragma omp single
    r = fib(n);
    return r;
}

static void wide(int threads, int64_t n)
{
#pragma omp parallel num_threads(threads)
#pragma omp single
#pragma omp task
    {
        for (int64_t i = 0; i < n; i++) {
#pragma omp task
            sb_empty();
        }
#pragma omp taskwait
    }
}

static uint64_t chain(int threads, int64_t n)
{
    uint64_t count = 0;
    char token; /* only its address matters: every task is 'inout' on it */

#pragma omp parallel num_threads(threads)
#pragma omp single
    for (int64_t i = 0; i < n; i++) {
#pragma omp task depend(inout : token) shared(count)
        count++; /* plain: 'depend' orders the tasks, so a lost update means a bug */
    }
    (void)token;
    return count;
}

static void dag(int threads, const sb_dag *d, uint64_t *val)
{
#pragma omp parallel num_threads(threads)
#pragma omp single
    for (int64_t i = 0; i < d->n; i++) {
        if (i < d->width) {
#pragma omp task depend(out : val[i])
            val[i] = sb_dag_node(d, val, i);
        } else {
            const uint32_t *p = d->pred + SB_DAG_PREDS * i;

#pragma omp task depend(in : val[p[0]], val[p[1]], val[p[2]], val[p[3]]) depend(out : val[i])
            val[i] = sb_dag_node(d, val, i);
        }
    }
}

static int omp_start(void **out, int threads, char *info, size_t len)
{
    omp_ctx *c = calloc(1, sizeof(*c));
    const char *policy = getenv("OMP_WAIT_POLICY");
    const char *spin = getenv("GOMP_SPINCOUNT");
    const char *lib = "unknown library";
    Dl_info dl;

    *out = NULL;
    if (c == NULL)
        return -1;
    c->threads = threads;
    if (dladdr((void *)omp_get_max_threads, &dl) && dl.dli_fname != NULL)
        lib = dl.dli_fname;
    snprintf(info, len, "OpenMP %d (%s): num_threads(%d), OMP_WAIT_POLICY=%s, GOMP_SPINCOUNT=%s",
             _OPENMP, lib, threads, policy ? policy : "unset", spin ? spin : "unset");
    *out = c;
    return 0;
}

static void omp_stop(void *ctx)
{
    free(ctx);
}

static const char *omp_skip(int bench)
{
    if (bench == SB_CHAIN_REPLAY)
        return "OpenMP has no pre-built task graph to replay";
    return NULL;
}

static int omp_run(void *ctx, int bench, const sb_inputs *in, uint64_t *result)
{
    omp_ctx *c = ctx;

    *result = 0;
    switch (bench) {
    case SB_FIB:
        *result = fib_root(c->threads, in->fib_n);
        return 0;
    case SB_WIDE:
        wide(c->threads, in->wide_n);
        return 0;
    case SB_CHAIN:
        *result = chain(c->threads, in->chain_n);
        return 0;
    case SB_DAG:
        dag(c->threads, in->dag, in->val);
        return 0;
    }
    return -1;
}

const sb_impl sb_impl_omp = {
    .name = "omp",
    .start = omp_start,
    .stop = omp_stop,
    .skip = omp_skip,
    .prepare = NULL,
    .run = omp_run,
    .cleanup = NULL, /* the runtime frees each task when it completes, inside the run */
    .finish = NULL,
};
