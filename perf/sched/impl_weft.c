/* perf/sched/impl_weft.c: sched_bench's workloads written idiomatically with weft.
 * Owns: the weft runtime of the benchmark (created with wf_runtime_opts_from_env(), so
 * WEFT_TRACE, WEFT_TOPOLOGY and WEFT_NO_PIN apply; --threads sets n_workers), the
 * pre-built chain of chain_replay, the trace file written after the first case, and the
 * per-worker counters (wf_runtime_stats()) of each case's timed runs, printed on stderr.
 * Invariant: every task is a real weft task: fib spawns both calls (one task per call, as
 * the peers do), and the graph cases build a wf_taskgraph inside the timed run (and free
 * it in cleanup(), outside it) with one wf_taskgraph_add_nodes() call: weft's bulk form,
 * the predecessors as compressed rows (offsets and ids), which on an empty graph writes the
 * run's successor arrays directly, as the tbb_counters peer builds its own. Writing those
 * rows (and the DAG's per-node arguments) is inside the timed run too. Node ids count up
 * from 0, so DAG node i is graph node i. Both build and run from one task on a worker
 * (graph_case_task()), as tbb_counters does inside its arena.
 * Not here: the per-node work (workloads.h), timing and output (sched_bench.c). */
#include "impl.h"

#include <weft/sched.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What every node of one DAG run shares. */
typedef struct dag_run {
    const sb_dag *d;
    uint64_t *val;
} dag_run;

typedef struct weft_ctx {
    wf_runtime *rt;
    const char *trace_path; /* WEFT_TRACE, or NULL */
    int trace_written;
    wf_taskgraph *replay; /* chain_replay's graph, between prepare() and finish() */
    wf_taskgraph *built;  /* the graph of the last chain or dag run, until cleanup() */
    void *built_args;     /* its per-node arguments */
    dag_run dag;          /* shared by the nodes of the DAG being run */
    uint64_t count;       /* tasks run by a chain; each task runs after the previous one */
    /* Per-worker counters of the current case: 'at' before a run, 'sum' over its timed runs
     * (the warm-up, run 0, left out), printed by finish(). */
    int nw, runs;
    wf_worker_stats *at, *now, *sum;
} weft_ctx;

static int fail(const char *what, int rc, const char *msg)
{
    fprintf(stderr, "weft: %s: %s (%s)\n", what, wf_strerror(rc), msg);
    return -1;
}

/* ---- fib: a task per call; both calls are spawned, then the task waits ---------------- */

typedef struct fib_arg {
    wf_runtime *rt;
    int n;
    uint64_t r;
} fib_arg;

static int fib_task(void *p)
{
    fib_arg *a = p;
    fib_arg x, y;
    wf_group g;
    int rc, wrc;

    if (a->n < 2) {
        a->r = (uint64_t)a->n;
        return 0;
    }
    x = (fib_arg){ a->rt, a->n - 1, 0 };
    y = (fib_arg){ a->rt, a->n - 2, 0 };
    rc = wf_group_init(&g, a->rt);
    if (rc < 0)
        return rc;
    rc = wf_spawn(&g, fib_task, &x);
    if (rc == 0)
        rc = wf_spawn(&g, fib_task, &y);
    wrc = wf_group_wait(&g); /* also after a failed spawn: 'x' may be running */
    wf_group_deinit(&g);
    a->r = x.r + y.r;
    return rc < 0 ? rc : wrc;
}

/* ---- wide: one root task spawns n empty tasks into its own group and joins ------------ */

typedef struct wide_arg {
    wf_runtime *rt;
    int64_t n;
} wide_arg;

static int empty_task(void *p)
{
    (void)p;
    sb_empty();
    return 0;
}

static int wide_root(void *p)
{
    wide_arg *a = p;
    wf_group g;
    int rc, wrc;

    rc = wf_group_init(&g, a->rt);
    if (rc < 0)
        return rc;
    for (int64_t i = 0; i < a->n && rc == 0; i++)
        rc = wf_spawn(&g, empty_task, NULL);
    wrc = wf_group_wait(&g);
    wf_group_deinit(&g);
    return rc < 0 ? rc : wrc;
}

/* Runs 'fn(arg)' as one task from the driver's thread and waits for it (and its tree). */
static int run_root(weft_ctx *c, const char *what, wf_task_fn fn, void *arg)
{
    wf_group g;
    int rc = wf_group_init(&g, c->rt);

    if (rc < 0)
        return fail(what, rc, wf_last_errmsg());
    rc = wf_spawn(&g, fn, arg);
    if (rc < 0) {
        wf_group_deinit(&g);
        return fail(what, rc, wf_last_errmsg());
    }
    rc = wf_group_wait(&g);
    if (rc < 0)
        fail(what, rc, wf_group_errmsg(&g));
    wf_group_deinit(&g);
    return rc < 0 ? -1 : 0;
}

/* ---- chain: n nodes of a wf_taskgraph, node i after node i - 1 ------------------------- */

static int chain_task(void *p)
{
    weft_ctx *c = p;

    c->count++; /* plain: the chain orders the tasks, so a lost update means a bug */
    return 0;
}

/* The chain as compressed predecessor rows (node 0 none, node i node i - 1), added in one
 * wf_taskgraph_add_nodes() call. The rows are written here, inside the timed run: they are
 * the graph's description, as the peers' predecessor loops are. */
static int chain_build(weft_ctx *c, int64_t n, wf_taskgraph **out)
{
    wf_taskgraph *g;
    int64_t *off = malloc((size_t)(n + 1) * sizeof *off);
    int *pred = malloc((size_t)(n > 1 ? n - 1 : 1) * sizeof *pred);
    int rc;

    *out = NULL;
    if (off == NULL || pred == NULL) {
        free(off);
        free(pred);
        fprintf(stderr, "weft: chain: out of memory\n");
        return -1;
    }
    off[0] = 0;
    for (int64_t i = 0; i < n; i++) {
        off[i + 1] = i; /* node i's row: pred[i - 1], empty for node 0 */
        if (i > 0)
            pred[i - 1] = (int)(i - 1);
    }
    rc = wf_taskgraph_create(c->rt, &g);
    if (rc < 0) {
        free(off);
        free(pred);
        return fail("chain: wf_taskgraph_create", rc, wf_last_errmsg());
    }
    rc = wf_taskgraph_add_nodes(g, chain_task, c, 0, "chain", (int)n, off, pred);
    free(off);
    free(pred);
    if (rc < 0) {
        fail("chain: build", rc, wf_taskgraph_errmsg(g));
        wf_taskgraph_destroy(g);
        return -1;
    }
    *out = g;
    return 0;
}

static int graph_run(wf_taskgraph *g, const char *what)
{
    int rc = wf_taskgraph_run(g);

    return rc < 0 ? fail(what, rc, wf_taskgraph_errmsg(g)) : 0;
}

/* ---- dag: one wf_taskgraph node per DAG node, an edge per predecessor ------------------ */

typedef struct dag_arg {
    const dag_run *run;
    int64_t i;
} dag_arg;

static int dag_task(void *p)
{
    const dag_arg *a = p;

    a->run->val[a->i] = sb_dag_node(a->run->d, a->run->val, a->i);
    return 0;
}

/* The DAG's predecessor lists are already compressed rows of SB_DAG_PREDS entries from
 * node 'width' on (workloads.h), so only the row offsets are written; the per-node arguments
 * are part of building the graph too, as the peers' captures are. */
static int dag_once(weft_ctx *c, const sb_inputs *in)
{
    const sb_dag *d = in->dag;
    dag_arg *args = malloc((size_t)d->n * sizeof(*args));
    int64_t *off = malloc((size_t)(d->n + 1) * sizeof(*off));
    wf_taskgraph *g = NULL;
    int rc;

    if (args == NULL || off == NULL) {
        free(args);
        free(off);
        fprintf(stderr, "weft: dag: out of memory\n");
        return -1;
    }
    c->built_args = args;
    c->dag = (dag_run){ d, in->val };
    for (int64_t i = 0; i < d->n; i++) {
        args[i] = (dag_arg){ &c->dag, i };
        off[i] = i < d->width ? 0 : SB_DAG_PREDS * (i - d->width);
    }
    off[d->n] = d->n < d->width ? 0 : SB_DAG_PREDS * (d->n - d->width);
    rc = wf_taskgraph_create(c->rt, &g);
    if (rc < 0) {
        free(off);
        return fail("dag: wf_taskgraph_create", rc, wf_last_errmsg());
    }
    c->built = g;
    /* uint32_t and int may alias; every id is below 2^30. */
    rc = wf_taskgraph_add_nodes(g, dag_task, args, sizeof(*args), "dag", (int)d->n, off,
                                (const int *)d->pred + SB_DAG_PREDS * d->width);
    free(off);
    if (rc < 0)
        return fail("dag: build", rc, wf_taskgraph_errmsg(g));
    return graph_run(g, "dag: run");
}

/* ---- per-worker counters of a case --------------------------------------------------- */

static void stats_add(weft_ctx *c)
{
    if (wf_runtime_stats(c->rt, c->now, c->nw) < 0)
        return;
    for (int i = 0; i < c->nw && c->runs > 0; i++) {
        wf_worker_stats *s = &c->sum[i];
        const wf_worker_stats *a = &c->at[i], *b = &c->now[i];

        s->tasks_run += b->tasks_run - a->tasks_run;
        s->spawned += b->spawned - a->spawned;
        s->steals_tried += b->steals_tried - a->steals_tried;
        s->steals_won += b->steals_won - a->steals_won;
        s->parks += b->parks - a->parks;
        s->idle_ns += b->idle_ns - a->idle_ns;
    }
    c->runs++;
}

/* One line per worker on stderr (stdout stays the table or the JSON lines), per timed run.
 * 'idle' is time asleep counted when a worker wakes: a sleep begun in the --gap-ms pause
 * before a run and ended in it counts whole, so only with --gap-ms 0 is it the runs' own. */
static void stats_print(weft_ctx *c, int bench)
{
    static const char *const names[SB_N_BENCH] = { "fib", "wide", "chain", "chain_replay", "dag" };
    double n = c->runs > 1 ? c->runs - 1 : 1;

    if (c->runs < 2)
        return;
    fflush(stdout);
    for (int i = 0; i < c->nw; i++) {
        const wf_worker_stats *s = &c->sum[i];

        fprintf(stderr,
                "# weft %s worker %d, per run: %.0f tasks, %.0f pushed, %.0f of %.0f steals won, "
                "%.1f parks, %.2f ms idle\n",
                names[bench], i, (double)s->tasks_run / n, (double)s->spawned / n,
                (double)s->steals_won / n, (double)s->steals_tried / n, (double)s->parks / n,
                (double)s->idle_ns / n / 1e6);
    }
}

/* ---- the sb_impl table ------------------------------------------------------------------ */

static void weft_cleanup(void *ctx, int bench)
{
    weft_ctx *c = ctx;

    (void)bench;
    wf_taskgraph_destroy(c->built);
    free(c->built_args);
    c->built = NULL;
    c->built_args = NULL;
}

static void weft_stop(void *ctx);

static int weft_start(void **out, int threads, char *info, size_t len)
{
    weft_ctx *c = calloc(1, sizeof(*c));
    wf_runtime_opts opts = { 0 };
    int rc;

    *out = NULL;
    if (c == NULL)
        return -1;
    rc = wf_runtime_opts_from_env(&opts, &c->trace_path);
    if (rc < 0) {
        free(c);
        return fail("wf_runtime_opts_from_env", rc, wf_last_errmsg());
    }
    opts.n_workers = threads;
    rc = wf_runtime_create(&c->rt, &opts);
    if (rc < 0) {
        free(c);
        return fail("wf_runtime_create", rc, wf_last_errmsg());
    }
    snprintf(info, len, "weft %d.%d.%d: %d workers, %d NUMA node(s)%s%s",
             (wf_version() >> 16) & 0xff, (wf_version() >> 8) & 0xff, wf_version() & 0xff,
             wf_runtime_worker_count(c->rt), wf_runtime_numa_count(c->rt),
             c->trace_path ? ", tracing to " : "", c->trace_path ? c->trace_path : "");
    c->nw = wf_runtime_worker_count(c->rt);
    c->at = calloc((size_t)c->nw, sizeof(*c->at));
    c->now = calloc((size_t)c->nw, sizeof(*c->now));
    c->sum = calloc((size_t)c->nw, sizeof(*c->sum));
    if (c->at == NULL || c->now == NULL || c->sum == NULL) {
        weft_stop(c);
        return -1;
    }
    *out = c;
    return 0;
}

static void weft_stop(void *ctx)
{
    weft_ctx *c = ctx;

    if (c == NULL)
        return;
    free(c->at);
    free(c->now);
    free(c->sum);
    weft_cleanup(c, SB_N_BENCH);
    wf_taskgraph_destroy(c->replay);
    wf_runtime_destroy(c->rt);
    free(c);
}

static const char *weft_skip(int bench)
{
    (void)bench;
    return NULL;
}

static int weft_prepare(void *ctx, int bench, const sb_inputs *in)
{
    weft_ctx *c = ctx;

    c->runs = 0;
    memset(c->sum, 0, (size_t)c->nw * sizeof(*c->sum));
    if (bench != SB_CHAIN_REPLAY)
        return 0;
    return chain_build(c, in->chain_n, &c->replay);
}

/* chain and dag are built and run by one task on a worker, as the tbb_counters peer builds
 * and runs inside its arena: the arrays the build writes are in that worker's cache when its
 * run starts, and the roots go to its own deque rather than through an inbox. */
typedef struct graph_case {
    weft_ctx *c;
    int bench;
    const sb_inputs *in;
} graph_case;

static int graph_case_task(void *p)
{
    graph_case *a = p;
    weft_ctx *c = a->c;
    int rc;

    if (a->bench == SB_DAG)
        return dag_once(c, a->in) < 0 ? WF_ETASK : 0;
    rc = chain_build(c, a->in->chain_n, &c->built);
    if (rc == 0)
        rc = graph_run(c->built, "chain: run");
    return rc < 0 ? WF_ETASK : 0;
}

static int weft_run(void *ctx, int bench, const sb_inputs *in, uint64_t *result)
{
    weft_ctx *c = ctx;
    int rc = -1;

    *result = 0;
    if (wf_runtime_stats(c->rt, c->at, c->nw) < 0)
        return fail("wf_runtime_stats", WF_EINVAL, wf_last_errmsg());
    switch (bench) {
    case SB_FIB: {
        fib_arg a = { c->rt, in->fib_n, 0 };

        rc = run_root(c, "fib", fib_task, &a);
        *result = a.r;
        break;
    }
    case SB_WIDE: {
        wide_arg a = { c->rt, in->wide_n };

        rc = run_root(c, "wide", wide_root, &a);
        break;
    }
    case SB_CHAIN: {
        graph_case a = { c, bench, in };

        c->count = 0;
        rc = run_root(c, "chain", graph_case_task, &a);
        *result = c->count;
        break;
    }
    case SB_CHAIN_REPLAY:
        c->count = 0;
        rc = graph_run(c->replay, "chain_replay: run");
        *result = c->count;
        break;
    case SB_DAG: {
        graph_case a = { c, bench, in };

        rc = run_root(c, "dag", graph_case_task, &a);
        break;
    }
    }
    stats_add(c);
    return rc;
}

/* Frees chain_replay's graph and, after the first case only, writes the trace: the rings
 * then hold that case's last runs (choose the case with --only). */
static void weft_finish(void *ctx, int bench)
{
    weft_ctx *c = ctx;

    stats_print(c, bench);
    if (bench == SB_CHAIN_REPLAY) {
        wf_taskgraph_destroy(c->replay);
        c->replay = NULL;
    }
    if (c->trace_path != NULL && !c->trace_written) {
        int rc = wf_runtime_trace_write(c->rt, c->trace_path);

        c->trace_written = 1;
        if (rc < 0)
            fail("wf_runtime_trace_write", rc, wf_last_errmsg());
        else
            fprintf(stderr, "weft: wrote %d trace events to %s (open it in ui.perfetto.dev)\n", rc,
                    c->trace_path);
    }
}

const sb_impl sb_impl_weft = {
    .name = "weft",
    .start = weft_start,
    .stop = weft_stop,
    .skip = weft_skip,
    .prepare = weft_prepare,
    .run = weft_run,
    .cleanup = weft_cleanup,
    .finish = weft_finish,
};
