/* perf/sched/impl_tbb.cpp: sched_bench's workloads written idiomatically with oneTBB.
 * Owns: the oneTBB side of the benchmark: a global_control and a task_arena of N threads
 * (the caller's included) in which every run executes; fib and wide with task_group
 * run/wait; chain and dag as flow graphs of continue_nodes built inside the timed run (and
 * destroyed in cleanup(), outside it); chain_replay as one pre-built flow graph triggered
 * again at each run.
 * Invariant: a flow graph and its nodes are built, run and destroyed inside the arena.
 * Not here: the per-node work (workloads.h), timing and output (sched_bench.c). */
#include "impl.h"

#include <cstdio>
#include <deque>
#include <memory>
#include <oneapi/tbb/flow_graph.h>
#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/task_arena.h>
#include <oneapi/tbb/task_group.h>
#include <oneapi/tbb/version.h>

namespace
{

namespace flow = tbb::flow;
using node_t = flow::continue_node<flow::continue_msg>;

/* A flow graph and its nodes, declared after it so that they are destroyed first. */
struct graph {
    flow::graph g;
    std::deque<node_t> nodes;
};

struct tbb_ctx {
    tbb::global_control limit;
    tbb::task_arena arena;
    uint64_t count = 0;            /* tasks run by a chain; each runs after the previous one */
    std::unique_ptr<graph> replay; /* chain_replay's, between prepare() and finish() */
    std::unique_ptr<graph> built;  /* the last chain or dag run's, until cleanup() */

    explicit tbb_ctx(int threads)
        : limit(tbb::global_control::max_allowed_parallelism, (size_t)threads), arena(threads)
    {
    }
};

/* fib: a task per call; both calls run in the task_group, then the caller waits. */
uint64_t fib(int n)
{
    if (n < 2)
        return (uint64_t)n;
    uint64_t x, y;
    tbb::task_group g;
    g.run([&] { x = fib(n - 1); });
    g.run([&] { y = fib(n - 2); });
    g.wait();
    return x + y;
}

void wide(int64_t n)
{
    tbb::task_group root;
    root.run([n] {
        tbb::task_group g;
        for (int64_t i = 0; i < n; i++)
            g.run([] { sb_empty(); });
        g.wait();
    });
    root.wait();
}

std::unique_ptr<graph> chain_build(tbb_ctx *c, int64_t n)
{
    std::unique_ptr<graph> gr(new graph);
    uint64_t *count = &c->count;
    for (int64_t i = 0; i < n; i++) {
        /* plain: the edges order the tasks, so a lost update means a bug */
        gr->nodes.emplace_back(gr->g, [count](const flow::continue_msg &) { ++*count; });
        if (i > 0)
            flow::make_edge(gr->nodes[i - 1], gr->nodes[i]);
    }
    return gr;
}

void chain_run(graph *gr)
{
    gr->nodes.front().try_put(flow::continue_msg());
    gr->g.wait_for_all();
}

std::unique_ptr<graph> dag(const sb_dag *d, uint64_t *val)
{
    std::unique_ptr<graph> gr(new graph);
    for (int64_t i = 0; i < d->n; i++) {
        gr->nodes.emplace_back(
            gr->g, [d, val, i](const flow::continue_msg &) { val[i] = sb_dag_node(d, val, i); });
        if (i >= d->width)
            for (int k = 0; k < SB_DAG_PREDS; k++)
                flow::make_edge(gr->nodes[d->pred[SB_DAG_PREDS * i + k]], gr->nodes[i]);
    }
    for (int64_t i = 0; i < d->width; i++)
        gr->nodes[i].try_put(flow::continue_msg());
    gr->g.wait_for_all();
    return gr;
}

int tbb_start(void **out, int threads, char *info, size_t len)
{
    *out = nullptr;
    try {
        tbb_ctx *c = new tbb_ctx(threads);
        c->arena.initialize();
        std::snprintf(
            info, len, "oneTBB %s (runtime %s): task_arena(%d), max_allowed_parallelism %d",
            TBB_VERSION_STRING, TBB_runtime_version(), c->arena.max_concurrency(),
            (int)tbb::global_control::active_value(tbb::global_control::max_allowed_parallelism));
        *out = c;
        return 0;
    } catch (const std::exception &e) {
        std::fprintf(stderr, "tbb: start: %s\n", e.what());
        return -1;
    }
}

void tbb_stop(void *ctx)
{
    tbb_ctx *c = static_cast<tbb_ctx *>(ctx);
    if (c != nullptr)
        c->arena.execute([c] {
            c->built.reset();
            c->replay.reset();
        });
    delete c;
}

const char *tbb_skip(int)
{
    return nullptr;
}

int tbb_prepare(void *ctx, int bench, const sb_inputs *in)
{
    tbb_ctx *c = static_cast<tbb_ctx *>(ctx);
    if (bench != SB_CHAIN_REPLAY)
        return 0;
    try {
        c->arena.execute([&] { c->replay = chain_build(c, in->chain_n); });
        return 0;
    } catch (const std::exception &e) {
        std::fprintf(stderr, "tbb: chain_replay: build: %s\n", e.what());
        return -1;
    }
}

int tbb_run(void *ctx, int bench, const sb_inputs *in, uint64_t *result)
{
    tbb_ctx *c = static_cast<tbb_ctx *>(ctx);
    *result = 0;
    try {
        switch (bench) {
        case SB_FIB:
            c->arena.execute([&] {
                tbb::task_group g;
                g.run([&] { *result = fib(in->fib_n); });
                g.wait();
            });
            return 0;
        case SB_WIDE:
            c->arena.execute([&] { wide(in->wide_n); });
            return 0;
        case SB_CHAIN:
            c->count = 0;
            c->arena.execute([&] {
                c->built = chain_build(c, in->chain_n);
                chain_run(c->built.get());
            });
            *result = c->count;
            return 0;
        case SB_CHAIN_REPLAY:
            c->count = 0;
            c->arena.execute([&] { chain_run(c->replay.get()); });
            *result = c->count;
            return 0;
        case SB_DAG:
            c->arena.execute([&] { c->built = dag(in->dag, in->val); });
            return 0;
        }
    } catch (const std::exception &e) {
        std::fprintf(stderr, "tbb: run: %s\n", e.what());
    }
    return -1;
}

void tbb_cleanup(void *ctx, int)
{
    tbb_ctx *c = static_cast<tbb_ctx *>(ctx);
    c->arena.execute([c] { c->built.reset(); });
}

void tbb_finish(void *ctx, int bench)
{
    tbb_ctx *c = static_cast<tbb_ctx *>(ctx);
    if (bench == SB_CHAIN_REPLAY)
        c->arena.execute([c] { c->replay.reset(); });
}

} // namespace

extern "C" const sb_impl sb_impl_tbb = {
    "tbb", tbb_start, tbb_stop, tbb_skip, tbb_prepare, tbb_run, tbb_cleanup, tbb_finish,
};
