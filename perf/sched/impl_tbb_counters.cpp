/* perf/sched/impl_tbb_counters.cpp: chain and dag written with oneTBB the way a TBB expert
 * writes a dependency graph by hand: a task_group whose tasks decrement atomic successor
 * counters (impl "tbb_counters"), the peer weft's task graph is held against.
 * Owns: a global_control and a task_arena of N threads (the caller's included); the
 * hand-built graph of one run (successors as CSR arrays and one atomic counter per node,
 * built inside the timed run from the predecessor lists, freed in cleanup()); the run:
 * a finished node decrements its successors' counters, task_group::run()s every successor
 * that became ready but the last, and runs the last one itself in the same loop (the
 * continuation idiom: no spawn and no deque round trip along a chain).
 * Invariant: the node body is a template argument, so the peer pays no indirect call
 * per node (weft pays one: its nodes are function pointers). Large arrays ask for
 * transparent huge pages as weft's graph does, so neither side is timed on page faults
 * the other avoids.
 * Not here: the per-node work (workloads.h), the flow-graph peer (impl_tbb.cpp), timing
 * and output (sched_bench.c). */
#include "impl.h"

#include <atomic>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>
#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/task_arena.h>
#include <oneapi/tbb/task_group.h>
#include <oneapi/tbb/version.h>
#include <sys/mman.h>

namespace
{

/* Arrays this large (and larger) are advised to use huge pages. */
constexpr size_t huge_min = (size_t)4 << 20;

template <class T> std::unique_ptr<T[]> big_array(size_t n)
{
    std::unique_ptr<T[]> p(new T[n ? n : 1]); /* default-initialised: no zeroing pass */
    size_t bytes = n * sizeof(T);
    if (bytes >= huge_min) {
        uintptr_t a = ((uintptr_t)p.get() + 4095) & ~(uintptr_t)4095;
        uintptr_t b = ((uintptr_t)p.get() + bytes) & ~(uintptr_t)4095;
        if (b > a)
            madvise((void *)a, b - a, MADV_HUGEPAGE);
    }
    return p;
}

/* A dependency graph of n nodes: node i's successors are succ[off[i] .. off[i + 1]), and
 * pending[i] counts its predecessors not yet finished. */
struct cgraph {
    int64_t n = 0;
    std::unique_ptr<int64_t[]> off;
    std::unique_ptr<int32_t[]> succ;
    std::unique_ptr<std::atomic<int32_t>[]> pending;
    std::unique_ptr<int32_t[]> roots; /* the nodes without predecessors */
    int64_t nroots = 0;
};

/* Builds the graph from predecessor lists: preds(i, f) calls f(p) for each predecessor p
 * of node i. Two passes over them: out-degrees (and in-degrees), then a scatter. */
template <class Preds> void build(cgraph &g, int64_t n, Preds preds)
{
    g.n = n;
    g.off = big_array<int64_t>((size_t)n + 1);
    g.pending = big_array<std::atomic<int32_t>>((size_t)n);
    g.roots = big_array<int32_t>((size_t)n);
    g.nroots = 0;
    std::memset((void *)g.off.get(), 0, ((size_t)n + 1) * sizeof(int64_t));
    for (int64_t i = 0; i < n; i++) {
        int32_t np = 0;
        preds(i, [&](int64_t p) {
            g.off[p + 1]++;
            np++;
        });
        g.pending[i].store(np, std::memory_order_relaxed);
        if (np == 0)
            g.roots[g.nroots++] = (int32_t)i;
    }
    for (int64_t i = 0; i < n; i++)
        g.off[i + 1] += g.off[i];
    g.succ = big_array<int32_t>((size_t)g.off[n]);
    std::unique_ptr<int64_t[]> cur = big_array<int64_t>((size_t)n);
    std::memcpy(cur.get(), g.off.get(), (size_t)n * sizeof(int64_t));
    for (int64_t i = 0; i < n; i++)
        preds(i, [&](int64_t p) { g.succ[cur[p]++] = (int32_t)i; });
}

/* Runs node i and then, in the same loop, the last of its successors that became ready;
 * the others go to the task_group for any thread to take. */
template <class Body> struct runner {
    cgraph &g;
    Body body;
    tbb::task_group &tg;

    void operator()(int64_t i) const
    {
        for (;;) {
            body(i);
            int64_t next = -1;
            for (int64_t k = g.off[i], end = g.off[i + 1]; k < end; k++) {
                int32_t s = g.succ[k];
                if (g.pending[s].fetch_sub(1, std::memory_order_acq_rel) == 1) {
                    if (next >= 0) {
                        const runner *self = this;
                        tg.run([self, next] { (*self)(next); });
                    }
                    next = s;
                }
            }
            if (next < 0)
                return;
            i = next;
        }
    }
};

template <class Body> void run_graph(cgraph &g, Body body)
{
    tbb::task_group tg;
    runner<Body> r{ g, body, tg };
    /* From the list made while building: the counters change as soon as a root runs. */
    for (int64_t j = 0; j < g.nroots; j++)
        tg.run([&r, i = (int64_t)g.roots[j]] { r(i); });
    tg.wait();
}

struct ctx {
    tbb::global_control limit;
    tbb::task_arena arena;
    uint64_t count = 0; /* tasks run by a chain; each runs after the previous one */
    cgraph built;       /* the last run's graph, until cleanup() */

    explicit ctx(int threads)
        : limit(tbb::global_control::max_allowed_parallelism, (size_t)threads), arena(threads)
    {
    }
};

int tc_start(void **out, int threads, char *info, size_t len)
{
    *out = nullptr;
    try {
        ctx *c = new ctx(threads);
        c->arena.initialize();
        std::snprintf(info, len,
                      "tbb_counters: oneTBB %s, task_arena(%d), task_group + atomic successor "
                      "counters, the last ready successor run inline",
                      TBB_VERSION_STRING, c->arena.max_concurrency());
        *out = c;
        return 0;
    } catch (const std::exception &e) {
        std::fprintf(stderr, "tbb_counters: start: %s\n", e.what());
        return -1;
    }
}

void tc_stop(void *p)
{
    delete static_cast<ctx *>(p);
}

const char *tc_skip(int bench)
{
    if (bench == SB_CHAIN || bench == SB_DAG)
        return nullptr;
    return "tbb_counters is for chain and dag (tbb runs fib and wide with task_group)";
}

int tc_run(void *p, int bench, const sb_inputs *in, uint64_t *result)
{
    ctx *c = static_cast<ctx *>(p);
    *result = 0;
    try {
        if (bench == SB_CHAIN) {
            c->count = 0;
            c->arena.execute([&] {
                build(c->built, in->chain_n, [](int64_t i, auto f) {
                    if (i > 0)
                        f(i - 1);
                });
                uint64_t *count = &c->count;
                /* plain: the counters order the tasks, so a lost update means a bug */
                run_graph(c->built, [count](int64_t) { ++*count; });
            });
            *result = c->count;
            return 0;
        }
        if (bench == SB_DAG) {
            const sb_dag *d = in->dag;
            uint64_t *val = in->val;
            c->arena.execute([&] {
                build(c->built, d->n, [d](int64_t i, auto f) {
                    if (i >= d->width)
                        for (int k = 0; k < SB_DAG_PREDS; k++)
                            f((int64_t)d->pred[SB_DAG_PREDS * i + k]);
                });
                run_graph(c->built, [d, val](int64_t i) { val[i] = sb_dag_node(d, val, i); });
            });
            return 0;
        }
    } catch (const std::exception &e) {
        std::fprintf(stderr, "tbb_counters: run: %s\n", e.what());
    }
    return -1;
}

void tc_cleanup(void *p, int)
{
    static_cast<ctx *>(p)->built = cgraph();
}

} // namespace

extern "C" const sb_impl sb_impl_tbb_counters = {
    "tbb_counters", tc_start, tc_stop, tc_skip, nullptr, tc_run, tc_cleanup, nullptr,
};
