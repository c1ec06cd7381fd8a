/* perf/sched/workloads.h: the four workloads of sched_bench, defined once for every runtime.
 * Owns: the sizes, the splitmix64 stream, the DAG's structure and its generation, the work
 * of one DAG node and the checksum. weft, oneTBB, OpenMP and the serial loop all call these
 * same inline functions, so the per-node work is identical and the comparison is fair.
 * Invariant: DAG node i is in layer i / width; a node of layer L >= 1 has exactly
 * SB_DAG_PREDS distinct predecessors, all in layer L - 1, kept in drawing order.
 * Not here: timing and output (sched_bench.c), any runtime (impl_*.c, impl_tbb.cpp).
 * Compiles as C11 and as C++17. */
#ifndef PERF_SCHED_WORKLOADS_H
#define PERF_SCHED_WORKLOADS_H

#include <stdint.h>
#include <stdlib.h>

#define SB_FIB_N        30      /* fib(30): 2,692,537 calls, one task each */
#define SB_WIDE_N       1000000 /* empty tasks spawned by one root */
#define SB_CHAIN_N      1000000 /* tasks in the chain */
#define SB_DAG_LAYERS   1000
#define SB_DAG_WIDTH    1000
#define SB_DAG_PREDS    4                     /* distinct predecessors of a node past layer 0 */
#define SB_DAG_ROUNDS   200                   /* mixing rounds of the node work */
#define SB_DAG_SEED     0x5eed2024c0ffee11ull /* the one splitmix64 stream's first state */
#define SB_FNV_PRIME    0x100000001B3ull
#define SB_FNV_OFFSET   0xcbf29ce484222325ull
#define SB_GOLDEN_GAMMA 0x9E3779B97F4A7C15ull

/* The number of calls (and so of tasks, one per call) of the naive fib(n). */
static inline uint64_t sb_fib_calls(int n)
{
    uint64_t a = 1, b = 1; /* calls(0), calls(1) */
    for (int i = 2; i <= n; i++) {
        uint64_t c = a + b + 1;
        a = b;
        b = c;
    }
    return n < 1 ? 1 : b;
}

/* fib(n) by iteration: what every runtime's recursive fib must return. */
static inline uint64_t sb_fib_expected(int n)
{
    uint64_t a = 0, b = 1;
    for (int i = 0; i < n; i++) {
        uint64_t c = a + b;
        a = b;
        b = c;
    }
    return a;
}

/* The body of an "empty" task (wide): a compiler barrier and nothing else. GCC drops an
 * OpenMP task with an empty body, and then the loop that created it. */
static inline void sb_empty(void)
{
    __asm__ __volatile__("" ::: "memory");
}

static inline uint64_t sb_splitmix64(uint64_t *state)
{
    uint64_t z;
    *state += SB_GOLDEN_GAMMA;
    z = *state;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* The layered random DAG: n = layers * width nodes. */
typedef struct sb_dag {
    int64_t n;      /* nodes */
    int64_t width;  /* nodes per layer */
    uint32_t *pred; /* pred[SB_DAG_PREDS * i + k]: k-th predecessor of node i (i >= width) */
} sb_dag;

/* Draws the DAG's edges: each node of layer >= 1 draws 'base + next() % width' from one
 * splitmix64 stream, walked over the nodes in order, until it has SB_DAG_PREDS distinct
 * predecessors. Returns 0, or -1 when out of memory. */
static inline int sb_dag_generate(sb_dag *d, int64_t layers, int64_t width)
{
    uint64_t state = SB_DAG_SEED;

    d->n = layers * width;
    d->width = width;
    d->pred = (uint32_t *)malloc((size_t)d->n * SB_DAG_PREDS * sizeof(uint32_t));
    if (d->pred == NULL)
        return -1;
    for (int64_t i = width; i < d->n; i++) {
        uint32_t *p = d->pred + SB_DAG_PREDS * i;
        uint64_t base = (uint64_t)(i / width - 1) * (uint64_t)width;
        int got = 0;

        while (got < SB_DAG_PREDS) {
            uint32_t cand = (uint32_t)(base + sb_splitmix64(&state) % (uint64_t)width);
            int dup = 0;

            for (int k = 0; k < got; k++)
                dup |= p[k] == cand;
            if (!dup)
                p[got++] = cand;
        }
    }
    return 0;
}

static inline void sb_dag_free(sb_dag *d)
{
    free(d->pred);
    d->pred = NULL;
}

/* The work of node i: reads its predecessors' values (which must be final) and returns
 * its own. About 1,200 dependent integer operations, ~0.3 us. */
static inline uint64_t sb_dag_node(const sb_dag *d, const uint64_t *val, int64_t i)
{
    uint64_t x = (uint64_t)i * SB_FNV_PRIME + SB_FNV_OFFSET;

    if (i >= d->width) {
        const uint32_t *p = d->pred + SB_DAG_PREDS * i;

        for (int k = 0; k < SB_DAG_PREDS; k++)
            x = (x ^ val[p[k]]) * SB_FNV_PRIME;
    }
    for (int r = 0; r < SB_DAG_ROUNDS; r++) {
        x ^= x >> 31;
        x *= SB_GOLDEN_GAMMA;
        x ^= x >> 29;
    }
    return x;
}

/* The checksum over all values; equal to the serial loop's only if every node saw its
 * predecessors' final values. */
static inline uint64_t sb_dag_checksum(const uint64_t *val, int64_t n)
{
    uint64_t s = 0;

    for (int64_t i = 0; i < n; i++)
        s = s * 31 + val[i];
    return s;
}

#endif /* PERF_SCHED_WORKLOADS_H */
