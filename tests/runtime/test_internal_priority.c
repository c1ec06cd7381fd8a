/* tests/runtime/test_internal_priority.c: critical-path priority (runtime/compile/priority.c): the
 * order in which kernels start, recorded by a test op made through core/op.h, on a graph
 * with a long chain hanging in the middle of many short branches of one input. With
 * priority, the worker that finishes the input keeps the chain's head and runs the whole
 * chain before any branch (one worker: exactly; two: the chain's head among the first three
 * starts, as a median); with WF_SESSION_NO_PRIORITY (plan order) a branch comes first and the
 * worker's LIFO deque runs the later branches before the chain. The results are the same either
 * way. Also the plan's priorities themselves (a node's is above each successor's), and a
 * pipeline stage's gradient sums ranked as plain nodes. */
#include "../../core/graph.h"
#include "../../core/op.h"
#include "../../core/tensor.h"
#include "../../runtime/internal.h"
#include "runtime_util.h"

#include <weft/weft.h>

#include <criterion/criterion.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define N_BRANCH 20
#define N_CHAIN  30
#define LEN      1000 /* elements per value: above WF__INLINE_NUMEL, so a task graph runs */

static atomic_long seq;
static long started[1 << 12];         /* per node id: its kernel's start rank, -1 never */
static pthread_t started_on[1 << 12]; /* per node id: the thread that ran its kernel */

static void teardown(void)
{
    wf_test_fini();
}

TestSuite(runtime_internal_priority, .fini = teardown, .timeout = WF_TEST_TIMEOUT(120));

/* "test_rec": y = x + 1, recording when it started. */
static int rec_cpu(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                   wf_tensor **out)
{
    (void)ctx;
    started[n->id] = atomic_fetch_add(&seq, 1);
    started_on[n->id] = pthread_self();
    const float *x = (const float *)in[0]->data;
    float *y = (float *)(*out)->data;
    for (int64_t i = 0; i < in[0]->numel; i++)
        y[i] = x[i] + 1;
    return 0;
}

/* Stateful: CSE must not merge the identical branches. */
static const wf_op_def op_rec = {
    .name = "test_rec",
    .min_inputs = 1,
    .max_inputs = 1,
    .infer = wf_test_infer_same,
    .kernel = { [WF_KERNEL_CPU] = rec_cpu },
    .flags = WF_OP_STATEFUL,
};

static wf_node *rec(wf_graph *g, wf_node *x)
{
    wf_node *n = wf__node_add(g, &op_rec, &x, 1, NULL);
    cr_assert_not_null(n, "%s", wf_graph_errmsg(g));
    return n;
}

typedef struct shape_graph {
    wf_graph *g;
    wf_node *x;
    wf_node *fetch[N_BRANCH + 1]; /* the branches, then the chain's end */
    wf_node *chain[N_CHAIN];
} shape_graph;

/* Half the branches, the chain, the other half: plan order puts the chain in the middle. */
static void build(wf_runtime *rt, shape_graph *sg)
{
    wf_graph *g = sg->g = wf_graph_create(rt, WF_STATIC);
    sg->x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(LEN));
    int b = 0;
    for (; b < N_BRANCH / 2; b++)
        sg->fetch[b] = rec(g, sg->x);
    wf_node *h = sg->x;
    for (int k = 0; k < N_CHAIN; k++)
        h = sg->chain[k] = rec(g, h);
    for (; b < N_BRANCH; b++)
        sg->fetch[b] = rec(g, sg->x);
    sg->fetch[N_BRANCH] = h;
    cr_assert_lt(wf_graph_node_count(g), (int)(sizeof started / sizeof started[0]));
}

/* One run; checks the values; returns the chain head's start rank and whether the chain ran
 * as the first N_CHAIN starts. */
static long run_once(shape_graph *sg, wf_session *s, bool *chain_first)
{
    atomic_store(&seq, 0);
    for (size_t i = 0; i < sizeof started / sizeof started[0]; i++)
        started[i] = -1;
    float xv[LEN];
    for (int i = 0; i < LEN; i++)
        xv[i] = (float)i;
    wf_tensor *tx = wf_tensor_from(WF_F32, WF_SHAPE(LEN), xv);
    wf_feed f = { sg->x, tx };
    wf_tensor *out[N_BRANCH + 1];
    int rc = wf_session_run(s, &f, 1, sg->fetch, N_BRANCH + 1, out, NULL, 0);
    cr_assert_eq(rc, 0, "%s: %s", wf_err_name(rc), wf_session_errmsg(s));
    for (int b = 0; b <= N_BRANCH; b++) {
        const float *y = wf_tensor_data_f32(out[b]);
        float add = b < N_BRANCH ? 1.0f : (float)N_CHAIN;
        for (int i = 0; i < LEN; i++)
            cr_assert_eq(y[i], (float)i + add, "output %d [%d]: %g", b, i, (double)y[i]);
        wf_tensor_release(out[b]);
    }
    wf_tensor_release(tx);
    *chain_first = true;
    for (int k = 0; k < N_CHAIN; k++)
        *chain_first = *chain_first && started[sg->chain[k]->id] == k;
    return started[sg->chain[0]->id];
}

/* After run_once(): how many branches the chain head's own worker started before it. */
static long same_thread_before_head(const shape_graph *sg)
{
    long head_id = sg->chain[0]->id, count = 0;
    for (int b = 0; b < N_BRANCH; b++) {
        long id = sg->fetch[b]->id;
        if (started[id] < started[head_id] && pthread_equal(started_on[id], started_on[head_id]))
            count++;
    }
    return count;
}

Test(runtime_internal_priority, one_worker_runs_the_critical_chain_first)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 1, .flags = WF_RT_NO_PIN });
    shape_graph sg;
    build(rt, &sg);
    wf_session *on = wf_test_session(sg.g, 0), *off = wf_test_session(sg.g, WF_SESSION_NO_PRIORITY);
    for (int rep = 0; rep < 20; rep++) {
        bool first = false;
        long head = run_once(&sg, on, &first);
        cr_assert_eq(head, 0, "rep %d: with priority the chain's head started %ld-th", rep, head);
        cr_assert(first, "rep %d: with priority the chain ran first, as a whole", rep);
        head = run_once(&sg, off, &first);
        cr_assert_gt(head, 5, "rep %d: in plan order the chain's head started %ld-th", rep, head);
    }
    wf_session_destroy(on);
    wf_session_destroy(off);
    wf_graph_destroy(sg.g);
    wf_runtime_destroy(rt);
}

static int cmp_long(const void *a, const void *b)
{
    long x = *(const long *)a, y = *(const long *)b;
    return (x > y) - (x < y);
}

/* Two workers: the thief may steal and start branches while the owner pushes them (more so
 * under a sanitizer or on a loaded machine), so the check is on the owner's own order: with
 * priority the chain's head is the first kernel its worker starts, in every run; in plan
 * order that worker first runs a branch and then the later branches from its LIFO deque (or,
 * as the thief, the older branches), so the median run starts several before the head. */
Test(runtime_internal_priority, two_workers_start_the_chain_early)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 2, .flags = WF_RT_NO_PIN });
    shape_graph sg;
    build(rt, &sg);
    wf_session *on = wf_test_session(sg.g, 0), *off = wf_test_session(sg.g, WF_SESSION_NO_PRIORITY);

    enum { REPS = 31 };

    long h_off[REPS];
    for (int rep = 0; rep < REPS; rep++) {
        bool first = false;
        run_once(&sg, on, &first);
        long before = same_thread_before_head(&sg);
        cr_assert_eq(before, 0,
                     "rep %d: with priority the chain head's worker started %ld branches "
                     "before it",
                     rep, before);
        run_once(&sg, off, &first);
        h_off[rep] = same_thread_before_head(&sg);
    }
    qsort(h_off, REPS, sizeof *h_off, cmp_long);
    cr_assert_geq(h_off[REPS / 2], 5,
                  "in plan order the chain head's worker started %ld branches "
                  "before it (median)",
                  h_off[REPS / 2]);
    wf_session_destroy(on);
    wf_session_destroy(off);
    wf_graph_destroy(sg.g);
    wf_runtime_destroy(rt);
}

Test(runtime_internal_priority, the_order_is_by_longest_path_and_off_means_none)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 1, .flags = WF_RT_NO_PIN });
    shape_graph sg;
    build(rt, &sg);
    wf_session *on = wf_test_session(sg.g, 0), *off = wf_test_session(sg.g, WF_SESSION_NO_PRIORITY);
    bool first;
    run_once(&sg, on, &first); /* compiles */
    run_once(&sg, off, &first);
    wf__plan *p = on->plans, *q = off->plans;
    cr_assert(p && q && !p->next && !q->next);
    cr_assert_null(q->prio_order);
    cr_assert_not_null(p->prio_order);
    int32_t *rank = malloc((size_t)p->n * sizeof *rank);
    cr_assert_not_null(rank);
    for (int r = 0; r < p->n; r++)
        rank[p->prio_order[r]] = r;
    /* every node ranks above each of its successors, and the chain (longest) above the
     * branches: x, then the chain in order */
    for (int i = 0; i < p->n; i++)
        for (int32_t e = p->in_off[i]; e < p->in_off[i + 1]; e++)
            cr_assert_lt(rank[p->in_idx[e]], rank[i], "node %d", i);
    cr_assert_eq(rank[p->index_of[sg.x->id]], 0);
    for (int k = 0; k < N_CHAIN - 1; k++) /* the last ties with the branches (one node) */
        cr_assert_eq(rank[p->index_of[sg.chain[k]->id]], 1 + k, "chain %d", k);
    free(rank);
    wf_session_destroy(on);
    wf_session_destroy(off);
    wf_graph_destroy(sg.g);
    wf_runtime_destroy(rt);
}

/* A pipeline stage's dp_reduce nodes sum its own micro-batches on the worker (no peer), so
 * they get no boost of an op whose work runs on another actor: each ranks below micro-batch
 * 0's first forward node, whose path runs through the backward into those sums. Boosted,
 * they ranked at the top and each tree node ran as soon as its halves existed, ahead of the
 * backward's chain towards the next stage's send. One stage, m = 4, no communicator. */
Test(runtime_internal_priority, a_pipeline_stage_runs_its_gradient_sums_as_plain_nodes)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 1, .flags = WF_RT_NO_PIN });
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(-1, 64));
    wf_node *y = wf_placeholder(g, "y", WF_I32, WF_SHAPE(-1));
    wf_node *h = x;
    for (int l = 0; l < 2; l++)
        h = wf_matmul(g, h,
                      wf_variable(g, l ? "w2" : "w1", WF_F32, WF_SHAPE(64, 64),
                                  wf_init_glorot_uniform((uint64_t)l + 1)));
    wf_node *loss = wf_mean(g, wf_softmax_cross_entropy(g, h, y));
    wf_node *train = wf_minimize(g, wf_adam(1e-3), loss);
    cr_assert_not_null(train, "%s", wf_graph_errmsg(g));
    wf_strategy *st = NULL;
    cr_assert_eq(wf_strategy_pipeline(NULL,
                                      &(wf_pipeline_opts){ .micro_batches = 4,
                                                           .schedule = WF_SCHEDULE_1F1B,
                                                           .batch_rows = 64 },
                                      &st),
                 0, "%s", wf_last_errmsg());
    wf_session *s = NULL;
    cr_assert_eq(wf_session_create(g, &(wf_session_opts){ .strategy = st }, &s), 0, "%s",
                 wf_last_errmsg());
    wf_plan_stats ps;
    cr_assert_eq(wf_session_plan_stats(s, NULL, 0, &train, 1, &ps), 0, "%s", wf_session_errmsg(s));
    wf__plan *p = s->plans;
    cr_assert(p && p->prio_order);
    int32_t *rank = malloc((size_t)p->n * sizeof *rank);
    cr_assert_not_null(rank);
    for (int r = 0; r < p->n; r++)
        rank[p->prio_order[r]] = r;
    int first = -1, n_reduce = 0;
    for (int i = 0; i < p->n; i++)
        if (!strcmp(p->nodes[i]->name, "x/mb0"))
            first = i;
    cr_assert_geq(first, 0, "no node x/mb0 in the plan");
    for (int i = 0; i < p->n; i++)
        if (p->nodes[i]->op == &wf_op_dp_reduce) {
            n_reduce++;
            cr_assert_gt(rank[i], rank[first], "%s ranks %d, above x/mb0 (%d)", p->nodes[i]->name,
                         rank[i], rank[first]);
        }
    cr_assert_geq(n_reduce, 3, "%d dp_reduce nodes (a tree of 4 micro-batches has 3)", n_reduce);
    free(rank);
    wf_session_destroy(s);
    wf_strategy_destroy(st);
    wf_graph_destroy(g);
    wf_runtime_destroy(rt);
}
