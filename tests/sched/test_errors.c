/* tests/sched/test_errors.c: failures. A failing graph node (returning a negative code, or
 * through wf_task_fail()) cancels its descendants, and the waiter gets its code with a
 * message naming the node and carrying the wf_task_fail() text; a graph with a cycle is
 * refused with WF_EINVAL naming a node on the cycle and runs nothing. In groups: the first
 * error wins, tasks not started by then are canceled, and the group can be reused. */
#include "wf_test.h"

#include <weft/weft.h>

#include <criterion/criterion.h>

#include <stdlib.h>
#include <string.h>

TestSuite(sched_errors, .fini = wf_test_fini, .timeout = WF_TEST_TIMEOUT(60));

#define DEADLINE_NS (10ull * 1000000000u)

/* ---- Graph nodes that fail ----------------------------------------------------------------- */

typedef struct gnode {
    atomic_int runs;
    int fail_code; /* 0: succeed; < 0: return it; WF_TASK_FAIL_MSG: use wf_task_fail */
    int fail_runs; /* fail only on the first 'fail_runs' runs (0: always) */
    atomic_int run_no;
} gnode;

enum { USE_TASK_FAIL = 1 };

static int gnode_fn(void *arg)
{
    gnode *n = arg;
    atomic_fetch_add(&n->runs, 1);
    int run = atomic_fetch_add(&n->run_no, 1);
    if (n->fail_code == 0 || (n->fail_runs > 0 && run >= n->fail_runs))
        return 0;
    if (n->fail_code == USE_TASK_FAIL)
        return wf_task_fail(WF_EFORMAT, "bad magic 0x%x in %s", 0xdead, "shard-7.bin");
    return n->fail_code;
}

typedef struct small_graph {
    wf_runtime *rt;
    wf_taskgraph *g;
    gnode nodes[16];
    int n;
} small_graph;

static int add_node(small_graph *s, const char *name, int fail_code)
{
    int i = s->n++;
    s->nodes[i].fail_code = fail_code;
    int id = wf_taskgraph_add(s->g, gnode_fn, &s->nodes[i], name);
    cr_assert_eq(id, i, "%s", wf_taskgraph_errmsg(s->g));
    return id;
}

static void edge(small_graph *s, int a, int b)
{
    int rc = wf_taskgraph_precede(s->g, a, b);
    cr_assert_eq(rc, 0, "precede(%d, %d): %s", a, b, wf_taskgraph_errmsg(s->g));
}

static small_graph *small_graph_new(int n_workers)
{
    small_graph *s = calloc(1, sizeof *s);
    cr_assert_not_null(s);
    s->rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = n_workers });
    cr_assert_eq(wf_taskgraph_create(s->rt, &s->g), 0);
    return s;
}

static void small_graph_free(small_graph *s)
{
    wf_taskgraph_destroy(s->g);
    wf_runtime_destroy(s->rt);
    free(s);
}

/* load_shard fails; below it: a chain, a direct child, and a join with an innocent parent.
 * 'other' and 'other_child' are unrelated. */
typedef struct failing_shape {
    int load, parse, decode, stats, join, innocent, other, other_child;
} failing_shape;

static failing_shape build_failing_shape(small_graph *s, int fail_code)
{
    failing_shape f;
    f.innocent = add_node(s, "innocent", 0);
    f.load = add_node(s, "load_shard", fail_code);
    f.parse = add_node(s, "parse", 0);
    f.decode = add_node(s, "decode", 0);
    f.stats = add_node(s, "stats", 0);
    f.join = add_node(s, "join", 0);
    f.other = add_node(s, "other", 0);
    f.other_child = add_node(s, "other_child", 0);
    edge(s, f.load, f.parse);
    edge(s, f.parse, f.decode);
    edge(s, f.load, f.stats);
    edge(s, f.decode, f.join);
    edge(s, f.innocent, f.join);
    edge(s, f.other, f.other_child);
    return f;
}

Test(sched_errors, a_failing_node_cancels_all_its_descendants)
{
    small_graph *s = small_graph_new(4);
    failing_shape f = build_failing_shape(s, WF_EIO);
    for (int r = 0; r < 20; r++) {
        int rc = wf_taskgraph_run(s->g);
        cr_assert_eq(rc, WF_EIO, "run %d: %s", r, wf_err_name(rc));
    }
    cr_assert_eq(atomic_load(&s->nodes[f.load].runs), 20);
    int desc[] = { f.parse, f.decode, f.stats, f.join };
    for (size_t i = 0; i < sizeof desc / sizeof desc[0]; i++)
        cr_assert_eq(atomic_load(&s->nodes[desc[i]].runs), 0,
                     "descendant #%d of the failing node ran %d times", desc[i],
                     atomic_load(&s->nodes[desc[i]].runs));
    small_graph_free(s);
}

Test(sched_errors, a_failed_run_returns_the_code_of_the_failing_node)
{
    small_graph *s = small_graph_new(2);
    build_failing_shape(s, WF_EDEVICE);
    int rc = wf_taskgraph_run(s->g);
    cr_assert_eq(rc, WF_EDEVICE, "got %s", wf_err_name(rc));
    small_graph_free(s);
}

Test(sched_errors, a_failed_run_message_names_the_failing_node)
{
    small_graph *s = small_graph_new(2);
    build_failing_shape(s, WF_EIO);
    int rc = wf_taskgraph_run(s->g);
    cr_assert_eq(rc, WF_EIO);
    const char *msg = wf_taskgraph_errmsg(s->g);
    cr_assert(strstr(msg, "load_shard") != NULL, "message \"%s\" does not name 'load_shard'", msg);
    small_graph_free(s);
}

Test(sched_errors, task_fail_gives_its_code_and_its_message_with_the_node_name)
{
    small_graph *s = small_graph_new(2);
    build_failing_shape(s, USE_TASK_FAIL);
    int rc = wf_taskgraph_run(s->g);
    cr_assert_eq(rc, WF_EFORMAT, "got %s", wf_err_name(rc));
    const char *msg = wf_taskgraph_errmsg(s->g);
    cr_assert(strstr(msg, "load_shard") != NULL, "message \"%s\" does not name the node", msg);
    cr_assert(strstr(msg, "bad magic 0xdead in shard-7.bin") != NULL,
              "message \"%s\" lacks the wf_task_fail text", msg);
    small_graph_free(s);
}

Test(sched_errors, a_submitted_graph_fails_its_group_with_the_node_code_and_name)
{
    small_graph *s = small_graph_new(2);
    build_failing_shape(s, USE_TASK_FAIL);
    wf_group g;
    cr_assert_eq(wf_group_init(&g, s->rt), 0);
    cr_assert_eq(wf_taskgraph_submit(s->g, &g), 0);
    int rc = wf_group_wait(&g);
    cr_assert_eq(rc, WF_EFORMAT, "got %s", wf_err_name(rc));
    cr_assert(strstr(wf_group_errmsg(&g), "load_shard") != NULL, "\"%s\"", wf_group_errmsg(&g));
    cr_assert(strstr(wf_group_errmsg(&g), "bad magic 0xdead") != NULL, "\"%s\"",
              wf_group_errmsg(&g));
    wf_group_deinit(&g);
    small_graph_free(s);
}

Test(sched_errors, a_graph_runs_completely_after_a_failed_run)
{
    small_graph *s = small_graph_new(2);
    failing_shape f = build_failing_shape(s, WF_EIO);
    s->nodes[f.load].fail_runs = 1; /* fails on the first run only */
    cr_assert_eq(wf_taskgraph_run(s->g), WF_EIO);
    int rc = wf_taskgraph_run(s->g);
    cr_assert_eq(rc, 0, "second run: %s: %s", wf_err_name(rc), wf_taskgraph_errmsg(s->g));
    for (int i = 0; i < s->n; i++)
        cr_assert_geq(atomic_load(&s->nodes[i].runs), 1, "node %d never ran", i);
    cr_assert_eq(atomic_load(&s->nodes[f.decode].runs), 1);
    small_graph_free(s);
}

/* A random DAG (edges go from lower to higher ids) with one failing node: none of its
 * descendants runs, and all of its ancestors have run, on every replay. */
typedef struct big_node {
    atomic_int runs;
    int fail;
} big_node;

static int big_fn(void *arg)
{
    big_node *b = arg;
    atomic_fetch_add(&b->runs, 1);
    return b->fail ? wf_task_fail(WF_EIO, "node failed on purpose") : 0;
}

Test(sched_errors, no_descendant_of_a_failing_node_runs_in_a_random_dag)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 4 });

    enum { N = 2000, PREDS = 3 };

    int failing = N / 20; /* early: edges go to random earlier nodes, so it has many descendants */
    big_node *nodes = calloc(N, sizeof *nodes);
    int *from = calloc(N * PREDS, sizeof *from), *to = calloc(N * PREDS, sizeof *to);
    char *desc = calloc(N, 1), *anc = calloc(N, 1);
    cr_assert(nodes && from && to && desc && anc);
    nodes[failing].fail = 1;
    wf_taskgraph *g;
    cr_assert_eq(wf_taskgraph_create(rt, &g), 0);
    for (int i = 0; i < N; i++)
        cr_assert_eq(wf_taskgraph_add(g, big_fn, &nodes[i], "big"), i);
    uint64_t rng = 0xfa11;
    int n_edges = 0;
    for (int i = 1; i < N; i++) {
        int first = n_edges; /* this node's edges so far: from[first .. n_edges) */
        for (int k = 0; k < PREDS; k++) {
            int p = (int)wf_test_rand_below(&rng, (uint64_t)i), dup = 0;
            for (int e = first; e < n_edges; e++)
                dup |= from[e] == p && to[e] == i;
            if (dup)
                continue;
            cr_assert_eq(wf_taskgraph_precede(g, p, i), 0);
            from[n_edges] = p;
            to[n_edges++] = i;
        }
    }
    /* Edges were made in increasing 'to' order and go up in id: one pass forwards finds
     * every descendant, one pass backwards every ancestor. */
    desc[failing] = 1;
    for (int e = 0; e < n_edges; e++)
        desc[to[e]] |= desc[from[e]];
    anc[failing] = 1;
    for (int e = n_edges - 1; e >= 0; e--)
        anc[from[e]] |= anc[to[e]];
    int runs = (int)wf_test_scaled(20, 5);
    for (int r = 0; r < runs; r++) {
        int rc = wf_taskgraph_run(g);
        cr_assert_eq(rc, WF_EIO, "run %d: %s", r, wf_err_name(rc));
    }
    int n_desc = 0;
    for (int i = 0; i < N; i++) {
        if (desc[i] && i != failing) {
            n_desc++;
            cr_assert_eq(atomic_load(&nodes[i].runs), 0, "descendant %d ran %d times", i,
                         atomic_load(&nodes[i].runs));
        }
        if (anc[i])
            cr_assert_eq(atomic_load(&nodes[i].runs), runs, "ancestor %d ran %d of %d times", i,
                         atomic_load(&nodes[i].runs), runs);
    }
    cr_assert_gt(n_desc, 100, "the test wants a failing node with many descendants, not %d",
                 n_desc);
    wf_taskgraph_destroy(g);
    free(nodes);
    free(from);
    free(to);
    free(desc);
    free(anc);
    wf_runtime_destroy(rt);
}

/* ---- Cycles ---------------------------------------------------------------------------- */

Test(sched_errors, a_graph_with_a_cycle_is_refused_with_einval_naming_a_node_on_it)
{
    small_graph *s = small_graph_new(2);
    int pre = add_node(s, "upstream", 0);
    int a = add_node(s, "cyc_a", 0);
    int b = add_node(s, "cyc_b", 0);
    int c = add_node(s, "cyc_c", 0);
    int post = add_node(s, "downstream", 0);
    add_node(s, "unrelated", 0);
    edge(s, pre, a);
    edge(s, a, b);
    edge(s, b, c);
    edge(s, c, a);
    edge(s, c, post);
    int rc = wf_taskgraph_run(s->g);
    cr_assert_eq(rc, WF_EINVAL, "got %s", wf_err_name(rc));
    const char *msg = wf_taskgraph_errmsg(s->g);
    cr_assert(strstr(msg, "cyc_a") || strstr(msg, "cyc_b") || strstr(msg, "cyc_c"),
              "message \"%s\" names no node of the cycle", msg);
    small_graph_free(s);
}

Test(sched_errors, a_graph_with_a_cycle_runs_no_node)
{
    small_graph *s = small_graph_new(2);
    int a = add_node(s, "cyc_a", 0);
    int b = add_node(s, "cyc_b", 0);
    add_node(s, "unrelated", 0);
    edge(s, a, b);
    edge(s, b, a);
    cr_assert_eq(wf_taskgraph_run(s->g), WF_EINVAL);
    wf_group g;
    cr_assert_eq(wf_group_init(&g, s->rt), 0);
    cr_assert_eq(wf_taskgraph_submit(s->g, &g), WF_EINVAL);
    cr_assert_eq(wf_group_wait(&g), 0, "a refused submit left work in the group");
    wf_group_deinit(&g);
    wf_test_sleep_us(10000);
    for (int i = 0; i < s->n; i++)
        cr_assert_eq(atomic_load(&s->nodes[i].runs), 0, "node %d ran in a refused run", i);
    small_graph_free(s);
}

static int nop(void *arg)
{
    return 0;
}

Test(sched_errors, a_cycle_behind_a_long_chain_is_found_and_named)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 2 });
    wf_taskgraph *g;
    cr_assert_eq(wf_taskgraph_create(rt, &g), 0);

    enum { CHAIN = 50000, LOOP = 10, AFTER = 1000 };

    for (int i = 0; i < CHAIN; i++)
        cr_assert_eq(wf_taskgraph_add(g, nop, NULL, "chain"), i);
    for (int i = 0; i < LOOP; i++)
        cr_assert_eq(wf_taskgraph_add(g, nop, NULL, "loop"), CHAIN + i);
    for (int i = 0; i < AFTER; i++)
        cr_assert_eq(wf_taskgraph_add(g, nop, NULL, "after"), CHAIN + LOOP + i);
    for (int i = 1; i < CHAIN + LOOP + AFTER; i++)
        cr_assert_eq(wf_taskgraph_precede(g, i - 1, i), 0);
    cr_assert_eq(wf_taskgraph_precede(g, CHAIN + LOOP - 1, CHAIN), 0); /* close the loop */
    int rc = wf_taskgraph_run(g);
    cr_assert_eq(rc, WF_EINVAL, "got %s", wf_err_name(rc));
    cr_assert(strstr(wf_taskgraph_errmsg(g), "loop") != NULL,
              "message \"%s\" does not name a node of the cycle", wf_taskgraph_errmsg(g));
    wf_taskgraph_destroy(g);
    wf_runtime_destroy(rt);
}

/* ---- Groups ------------------------------------------------------------------------------ */

static int fail_reader(void *arg)
{
    return wf_task_fail(WF_EIO, "file %s missing", "weights.bin");
}

static int count_task(void *arg)
{
    atomic_fetch_add((atomic_int *)arg, 1);
    return 0;
}

Test(sched_errors, group_wait_returns_the_error_and_errmsg_names_the_task)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 2 });
    wf_group g;
    cr_assert_eq(wf_group_init(&g, rt), 0);
    cr_assert_str_eq(wf_group_errmsg(&g), "");
    atomic_int ok = 0;
    cr_assert_eq(wf_spawn_named(&g, count_task, &ok, "fine"), 0);
    cr_assert_eq(wf_spawn_named(&g, fail_reader, NULL, "reader"), 0);
    int rc = wf_group_wait(&g);
    cr_assert_eq(rc, WF_EIO, "got %s", wf_err_name(rc));
    const char *msg = wf_group_errmsg(&g);
    cr_assert(strstr(msg, "reader") != NULL, "message \"%s\" does not name the task", msg);
    cr_assert(strstr(msg, "file weights.bin missing") != NULL, "message \"%s\"", msg);
    wf_group_deinit(&g);
    wf_runtime_destroy(rt);
}

static int return_enodev(void *arg)
{
    return WF_ENODEV;
}

Test(sched_errors, a_task_returning_a_negative_code_fails_the_group_with_it)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 2 });
    wf_group g;
    cr_assert_eq(wf_group_init(&g, rt), 0);
    cr_assert_eq(wf_spawn_named(&g, return_enodev, NULL, "probe_device"), 0);
    cr_assert_eq(wf_group_wait(&g), WF_ENODEV);
    cr_assert(strstr(wf_group_errmsg(&g), "probe_device") != NULL, "\"%s\"", wf_group_errmsg(&g));
    wf_group_deinit(&g);
    wf_runtime_destroy(rt);
}

static int return_unknown(void *arg)
{
    return -1000;
}

/* base.h: WF_ETASK is "a task failed (its code was positive or unknown)". */
Test(sched_errors, a_task_returning_an_unknown_negative_code_fails_the_group_with_etask)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 1 });
    wf_group g;
    cr_assert_eq(wf_group_init(&g, rt), 0);
    cr_assert_eq(wf_spawn_named(&g, return_unknown, NULL, "weird"), 0);
    int rc = wf_group_wait(&g);
    cr_assert_eq(rc, WF_ETASK, "got %d (%s)", rc, wf_err_name(rc));
    wf_group_deinit(&g);
    wf_runtime_destroy(rt);
}

/* Two tasks run at once; 'first_failure' fails, then 'second_failure' fails after it. */
typedef struct race2 {
    atomic_int started2, failed1;
} race2;

static int first_failure(void *arg)
{
    race2 *r = arg;
    uint64_t end = wf_test_now_ns() + DEADLINE_NS;
    while (!atomic_load(&r->started2) && wf_test_now_ns() < end)
        wf_test_sleep_us(50);
    atomic_store(&r->failed1, 1);
    return wf_task_fail(WF_EIO, "first");
}

static int second_failure(void *arg)
{
    race2 *r = arg;
    atomic_store(&r->started2, 1);
    uint64_t end = wf_test_now_ns() + DEADLINE_NS;
    while (!atomic_load(&r->failed1) && wf_test_now_ns() < end)
        wf_test_sleep_us(50);
    /* 'first_failure' has returned or is about to: give weft ample time to record it. */
    wf_test_sleep_us(100000);
    return wf_task_fail(WF_EINVAL, "second");
}

Test(sched_errors, the_first_error_of_a_group_wins)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 2 });
    wf_group g;
    cr_assert_eq(wf_group_init(&g, rt), 0);
    race2 r = { 0 };
    cr_assert_eq(wf_spawn_named(&g, first_failure, &r, "first_failure"), 0);
    cr_assert_eq(wf_spawn_named(&g, second_failure, &r, "second_failure"), 0);
    int rc = wf_group_wait(&g);
    cr_assert(atomic_load(&r.started2), "the two tasks never ran at the same time");
    cr_assert_eq(rc, WF_EIO, "got %s: %s", wf_err_name(rc), wf_group_errmsg(&g));
    cr_assert(strstr(wf_group_errmsg(&g), "first_failure") != NULL, "\"%s\"", wf_group_errmsg(&g));
    wf_group_deinit(&g);
    wf_runtime_destroy(rt);
}

typedef struct parent_ctx {
    wf_group *g;
    atomic_int children_ran;
} parent_ctx;

static int count_child(void *arg)
{
    atomic_fetch_add(&((parent_ctx *)arg)->children_ran, 1);
    return 0;
}

/* On one worker, children pushed by their parent cannot start before the parent returns. */
static int spawn_then_fail(void *arg)
{
    parent_ctx *p = arg;
    for (int i = 0; i < 100; i++)
        if (wf_spawn(p->g, count_child, p) != 0)
            return WF_ENOMEM;
    return wf_task_fail(WF_EIO, "parent failed after spawning");
}

Test(sched_errors, tasks_not_started_before_the_first_error_are_canceled)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 1 });
    wf_group g;
    cr_assert_eq(wf_group_init(&g, rt), 0);
    parent_ctx p = { .g = &g };
    cr_assert_eq(wf_spawn_named(&g, spawn_then_fail, &p, "parent"), 0);
    int rc = wf_group_wait(&g);
    cr_assert_eq(rc, WF_EIO, "got %s", wf_err_name(rc));
    cr_assert_eq(atomic_load(&p.children_ran), 0, "%d canceled children ran",
                 atomic_load(&p.children_ran));
    wf_group_deinit(&g);
    wf_runtime_destroy(rt);
}

Test(sched_errors, a_group_is_reusable_after_a_failed_wait)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 2 });
    wf_group g;
    cr_assert_eq(wf_group_init(&g, rt), 0);
    cr_assert_eq(wf_spawn_named(&g, fail_reader, NULL, "reader"), 0);
    cr_assert_eq(wf_group_wait(&g), WF_EIO);
    atomic_int ok = 0;
    for (int i = 0; i < 10; i++)
        cr_assert_eq(wf_spawn(&g, count_task, &ok), 0);
    int rc = wf_group_wait(&g);
    cr_assert_eq(rc, 0, "the wait after a failed one returned %s: %s", wf_err_name(rc),
                 wf_group_errmsg(&g));
    cr_assert_eq(atomic_load(&ok), 10);
    wf_group_deinit(&g);
    wf_runtime_destroy(rt);
}

/* wf_group_errmsg(): "the message of the first failure of the group, or "" when none". */
Test(sched_errors, group_errmsg_is_empty_after_a_reused_group_succeeds)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 2 });
    wf_group g;
    cr_assert_eq(wf_group_init(&g, rt), 0);
    cr_assert_eq(wf_spawn_named(&g, fail_reader, NULL, "reader"), 0);
    cr_assert_eq(wf_group_wait(&g), WF_EIO);
    atomic_int ok = 0;
    cr_assert_eq(wf_spawn(&g, count_task, &ok), 0);
    cr_assert_eq(wf_group_wait(&g), 0);
    cr_assert_str_eq(wf_group_errmsg(&g), "",
                     "after a successful wait the group still reports \"%s\"", wf_group_errmsg(&g));
    wf_group_deinit(&g);
    wf_runtime_destroy(rt);
}

typedef struct nested {
    wf_runtime *rt;
} nested;

static int nested_parent(void *arg)
{
    nested *n = arg;
    wf_group inner;
    int rc = wf_group_init(&inner, n->rt);
    if (rc != 0)
        return rc;
    rc = wf_spawn_named(&inner, fail_reader, NULL, "inner_reader");
    if (rc == 0)
        rc = wf_group_wait(&inner);
    wf_group_deinit(&inner);
    return rc;
}

Test(sched_errors, an_error_returned_through_a_nested_group_reaches_the_outer_waiter)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 2 });
    nested n = { rt };
    wf_group g;
    cr_assert_eq(wf_group_init(&g, rt), 0);
    cr_assert_eq(wf_spawn_named(&g, nested_parent, &n, "outer"), 0);
    int rc = wf_group_wait(&g);
    cr_assert_eq(rc, WF_EIO, "got %s", wf_err_name(rc));
    cr_assert(strstr(wf_group_errmsg(&g), "outer") != NULL, "\"%s\"", wf_group_errmsg(&g));
    wf_group_deinit(&g);
    wf_runtime_destroy(rt);
}

Test(sched_errors, task_fail_outside_a_task_returns_its_code_and_sets_last_errmsg)
{
    int rc = wf_task_fail(WF_ETIMEDOUT, "waited %d ms for %s", 250, "rank 3");
    cr_assert_eq(rc, WF_ETIMEDOUT);
    cr_assert(strstr(wf_last_errmsg(), "waited 250 ms for rank 3") != NULL, "\"%s\"",
              wf_last_errmsg());
}
