/* tests/sched/test_taskgraph.c: task graphs built once and replayed. Random DAGs from fixed
 * seeds (node ids in a shuffled order, so that ids say nothing about the order), a deep
 * chain, a wide fan-out/fan-in: each node takes a global sequence number when it starts and
 * when it ends, and every run must run each node exactly once and start it only after all
 * its predecessors ended. Also: ids, replays after a change, runs from inside a task,
 * WF_EBUSY while a run is in flight, one worker's order of ready successors, and graphs built
 * with wf_taskgraph_add_nodes() (alone, grown by every other call, bad rows). Failing nodes and
 * cycles are in test_errors.c. */
#include "wf_test.h"

#include <weft/weft.h>

#include <criterion/criterion.h>

#include <stdlib.h>
#include <string.h>

TestSuite(sched_taskgraph, .fini = wf_test_fini, .timeout = WF_TEST_TIMEOUT(120));

typedef struct dag dag;

typedef struct dnode {
    dag *d;
    int id;
    uint32_t work;     /* busy-loop iterations, to vary interleavings */
    atomic_long start; /* sequence number at start, this run */
    atomic_long end;   /* sequence number at end, this run */
    atomic_int runs;   /* times run, this run */
} dnode;

typedef struct edge {
    int before, after;
} edge;

struct dag {
    wf_taskgraph *g;
    dnode *nodes;
    int n;
    edge *edges;
    int n_edges, cap_edges;
    atomic_long seq;
};

static int dnode_fn(void *arg)
{
    dnode *x = arg;
    atomic_store(&x->start, atomic_fetch_add(&x->d->seq, 1));
    atomic_fetch_add(&x->runs, 1);
    for (volatile uint32_t i = 0; i < x->work; i++) {
    }
    atomic_store(&x->end, atomic_fetch_add(&x->d->seq, 1));
    return 0;
}

/* A graph with room for 'cap' nodes; the graph keeps pointers into 'nodes', so the array
 * never moves. */
static dag *dag_new(wf_runtime *rt, int cap)
{
    dag *d = calloc(1, sizeof *d);
    cr_assert_not_null(d);
    int rc = wf_taskgraph_create(rt, &d->g);
    cr_assert_eq(rc, 0, "wf_taskgraph_create: %s: %s", wf_err_name(rc), wf_last_errmsg());
    d->nodes = calloc((size_t)cap, sizeof *d->nodes);
    cr_assert_not_null(d->nodes);
    return d;
}

/* Adds 'count' nodes, each with up to 'max_work' iterations of busy work. */
static void dag_add(dag *d, int count, uint64_t *rng, uint32_t max_work)
{
    for (int k = 0; k < count; k++) {
        int i = d->n++;
        dnode *x = &d->nodes[i];
        x->d = d;
        x->id = i;
        x->work = max_work ? (uint32_t)wf_test_rand_below(rng, max_work) : 0;
        int id = wf_taskgraph_add(d->g, dnode_fn, x, "dag_node");
        cr_assert_eq(id, i, "wf_taskgraph_add returned %d for the node added as #%d (%s)", id, i,
                     wf_taskgraph_errmsg(d->g));
    }
}

/* Records an edge the graph has, for dag_check(). */
static void dag_note_edge(dag *d, int before, int after)
{
    if (d->n_edges == d->cap_edges) {
        d->cap_edges = d->cap_edges ? 2 * d->cap_edges : 1024;
        d->edges = realloc(d->edges, (size_t)d->cap_edges * sizeof *d->edges);
        cr_assert_not_null(d->edges);
    }
    d->edges[d->n_edges++] = (edge){ before, after };
}

static void dag_edge(dag *d, int before, int after)
{
    int rc = wf_taskgraph_precede(d->g, before, after);
    cr_assert_eq(rc, 0, "precede(%d, %d): %s: %s", before, after, wf_err_name(rc),
                 wf_taskgraph_errmsg(d->g));
    dag_note_edge(d, before, after);
}

/* dag_edge() unless the edge exists: whether a duplicate edge is allowed is not promised. */
static void dag_edge_once(dag *d, int before, int after)
{
    for (int e = 0; e < d->n_edges; e++)
        if (d->edges[e].before == before && d->edges[e].after == after)
            return;
    dag_edge(d, before, after);
}

static void dag_free(dag *d)
{
    wf_taskgraph_destroy(d->g);
    free(d->nodes);
    free(d->edges);
    free(d);
}

static void dag_reset(dag *d)
{
    for (int i = 0; i < d->n; i++) {
        atomic_store(&d->nodes[i].start, -1);
        atomic_store(&d->nodes[i].end, -1);
        atomic_store(&d->nodes[i].runs, 0);
    }
}

/* Every node ran once, and started after each predecessor ended. */
static void dag_check(const dag *d, int run)
{
    for (int i = 0; i < d->n; i++)
        if (atomic_load(&d->nodes[i].runs) != 1)
            cr_assert_fail("run %d: node %d ran %d times", run, i, atomic_load(&d->nodes[i].runs));
    for (int e = 0; e < d->n_edges; e++) {
        const dnode *b = &d->nodes[d->edges[e].before], *a = &d->nodes[d->edges[e].after];
        if (atomic_load(&a->start) <= atomic_load(&b->end))
            cr_assert_fail("run %d: node %d started (seq %ld) before its predecessor %d ended "
                           "(seq %ld)",
                           run, a->id, atomic_load(&a->start), b->id, atomic_load(&b->end));
    }
}

static void dag_run_and_check(dag *d, int runs)
{
    for (int r = 0; r < runs; r++) {
        dag_reset(d);
        int rc = wf_taskgraph_run(d->g);
        cr_assert_eq(rc, 0, "run %d: %s: %s", r, wf_err_name(rc), wf_taskgraph_errmsg(d->g));
        dag_check(d, r);
    }
}

/* A random DAG: a random topological order is mapped onto the ids; each node gets up to
 * 'max_preds' distinct predecessors among the 'window' nodes before it in that order
 * (window 0: any earlier node). */
static dag *random_dag(wf_runtime *rt, uint64_t seed, int n, int max_preds, int window)
{
    uint64_t rng = seed;
    dag *d = dag_new(rt, n);
    dag_add(d, n, &rng, 200);
    int *order = malloc((size_t)n * sizeof *order); /* position -> id */
    cr_assert_not_null(order);
    for (int i = 0; i < n; i++)
        order[i] = i;
    for (int i = n - 1; i > 0; i--) {
        int j = (int)wf_test_rand_below(&rng, (uint64_t)i + 1);
        int t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    int *picked = malloc((size_t)(max_preds + 1) * sizeof *picked);
    cr_assert_not_null(picked);
    for (int pos = 1; pos < n; pos++) {
        int lo = window > 0 && pos > window ? pos - window : 0;
        int k = (int)wf_test_rand_below(&rng, (uint64_t)max_preds + 1), n_picked = 0;
        for (int t = 0; t < k; t++) {
            int p = lo + (int)wf_test_rand_below(&rng, (uint64_t)(pos - lo));
            int dup = 0;
            for (int q = 0; q < n_picked; q++)
                dup |= picked[q] == p;
            if (dup)
                continue;
            picked[n_picked++] = p;
            dag_edge(d, order[p], order[pos]);
        }
    }
    free(picked);
    free(order);
    return d;
}

static int replays(void)
{
    return (int)wf_test_scaled(50, 10);
}

Test(sched_taskgraph, a_sparse_random_dag_with_long_edges_runs_each_node_once_after_its_preds)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 4 });
    dag *d = random_dag(rt, 0x5eed0001, 3000, 3, 0);
    dag_run_and_check(d, replays());
    dag_free(d);
    wf_runtime_destroy(rt);
}

Test(sched_taskgraph, a_dense_random_dag_with_local_edges_runs_each_node_once_after_its_preds)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 4 });
    dag *d = random_dag(rt, 0x5eed0002, 4000, 8, 16);
    dag_run_and_check(d, replays());
    dag_free(d);
    wf_runtime_destroy(rt);
}

Test(sched_taskgraph, a_layered_random_dag_runs_each_node_once_after_its_preds)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 3 });

    enum { LAYERS = 20, WIDTH = 100, PREDS = 5 };

    uint64_t rng = 0x5eed0003;
    dag *d = dag_new(rt, LAYERS * WIDTH);
    dag_add(d, LAYERS * WIDTH, &rng, 500);
    for (int l = 1; l < LAYERS; l++)
        for (int i = 0; i < WIDTH; i++) {
            int seen[PREDS], n_seen = 0;
            for (int k = 0; k < PREDS; k++) {
                int p = (int)wf_test_rand_below(&rng, WIDTH), dup = 0;
                for (int q = 0; q < n_seen; q++)
                    dup |= seen[q] == p;
                if (!dup) {
                    seen[n_seen++] = p;
                    dag_edge(d, (l - 1) * WIDTH + p, l * WIDTH + i);
                }
            }
        }
    dag_run_and_check(d, replays());
    dag_free(d);
    wf_runtime_destroy(rt);
}

Test(sched_taskgraph, random_dags_run_correctly_on_a_single_worker)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 1 });
    dag *d = random_dag(rt, 0x5eed0004, 2000, 4, 0);
    dag_run_and_check(d, (int)wf_test_scaled(20, 5));
    dag_free(d);
    wf_runtime_destroy(rt);
}

/* A 100k-node chain, added last to first, so that each edge goes from a higher id to a
 * lower one. Also catches a recursive cycle check that overflows the stack. */
Test(sched_taskgraph, a_chain_of_100000_nodes_runs_in_order)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 2 });
    int n = 100000;
    uint64_t rng = 1;
    dag *d = dag_new(rt, n);
    dag_add(d, n, &rng, 0);
    for (int i = n - 1; i > 0; i--)
        dag_edge(d, i, i - 1);
    dag_run_and_check(d, 3);
    dag_free(d);
    wf_runtime_destroy(rt);
}

Test(sched_taskgraph, a_wide_fan_out_and_fan_in_runs_the_join_after_every_branch)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 4 });
    int width = (int)wf_test_scaled(100000, 10000);
    uint64_t rng = 2;
    dag *d = dag_new(rt, width + 2);
    dag_add(d, width + 2, &rng, 0);
    for (int i = 1; i <= width; i++) {
        dag_edge(d, 0, i);
        dag_edge(d, i, width + 1);
    }
    dag_run_and_check(d, 5);
    dag_free(d);
    wf_runtime_destroy(rt);
}

Test(sched_taskgraph, node_ids_count_up_from_zero_and_node_count_follows)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 1 });
    wf_taskgraph *g;
    cr_assert_eq(wf_taskgraph_create(rt, &g), 0);
    cr_assert_eq(wf_taskgraph_node_count(g), 0);
    dnode dummy = { 0 };
    for (int i = 0; i < 100; i++) {
        cr_assert_eq(wf_taskgraph_add(g, dnode_fn, &dummy, NULL), i);
        cr_assert_eq(wf_taskgraph_node_count(g), i + 1);
    }
    wf_taskgraph_destroy(g);
    wf_runtime_destroy(rt);
}

Test(sched_taskgraph, an_empty_graph_runs_and_returns_zero)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 2 });
    wf_taskgraph *g;
    cr_assert_eq(wf_taskgraph_create(rt, &g), 0);
    for (int r = 0; r < 3; r++)
        cr_assert_eq(wf_taskgraph_run(g), 0, "%s", wf_taskgraph_errmsg(g));
    wf_taskgraph_destroy(g);
    wf_runtime_destroy(rt);
}

Test(sched_taskgraph, a_graph_grown_between_runs_runs_its_new_nodes_in_order)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 4 });
    uint64_t rng = 0x5eed0005;
    dag *d = dag_new(rt, 1000);
    dag_add(d, 500, &rng, 100);
    for (int i = 1; i < 500; i++)
        dag_edge_once(d, (int)wf_test_rand_below(&rng, (uint64_t)i), i);
    dag_run_and_check(d, 3);
    /* New nodes, each after two older ones, and new edges between old nodes. */
    dag_add(d, 500, &rng, 100);
    for (int i = 500; i < 1000; i++)
        for (int k = 0; k < 2; k++)
            dag_edge_once(d, (int)wf_test_rand_below(&rng, (uint64_t)i), i);
    for (int k = 0; k < 100; k++) {
        int lo = (int)wf_test_rand_below(&rng, 499);
        dag_edge_once(d, lo, lo + 1 + (int)wf_test_rand_below(&rng, (uint64_t)(499 - lo)));
    }
    dag_run_and_check(d, 3);
    dag_free(d);
    wf_runtime_destroy(rt);
}

/* ---- Runs from inside a task, and concurrent runs through one group ------------------ */

typedef struct inner_runs {
    dag *d;
    int runs;
    atomic_int failures;
    atomic_int bad_node;
} inner_runs;

static int run_graph_from_task(void *arg)
{
    inner_runs *ir = arg;
    for (int r = 0; r < ir->runs; r++) {
        dag_reset(ir->d);
        if (wf_taskgraph_run(ir->d->g) != 0)
            atomic_fetch_add(&ir->failures, 1);
        for (int i = 0; i < ir->d->n; i++)
            if (atomic_load(&ir->d->nodes[i].runs) != 1)
                atomic_store(&ir->bad_node, i + 1);
    }
    return 0;
}

Test(sched_taskgraph, a_graph_run_from_inside_a_task_completes)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 2 });
    dag *d = random_dag(rt, 0x5eed0007, 1000, 3, 0);
    inner_runs ir = { .d = d, .runs = (int)wf_test_scaled(20, 5) };
    wf_group g;
    cr_assert_eq(wf_group_init(&g, rt), 0);
    cr_assert_eq(wf_spawn(&g, run_graph_from_task, &ir), 0);
    cr_assert_eq(wf_group_wait(&g), 0, "%s", wf_group_errmsg(&g));
    cr_assert_eq(atomic_load(&ir.failures), 0);
    cr_assert_eq(atomic_load(&ir.bad_node), 0, "node %d did not run exactly once",
                 atomic_load(&ir.bad_node) - 1);
    wf_group_deinit(&g);
    dag_free(d);
    wf_runtime_destroy(rt);
}

Test(sched_taskgraph, a_graph_run_from_inside_a_task_on_a_single_worker_completes)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 1 });
    dag *d = random_dag(rt, 0x5eed0008, 300, 3, 0);
    inner_runs ir = { .d = d, .runs = 5 };
    wf_group g;
    cr_assert_eq(wf_group_init(&g, rt), 0);
    cr_assert_eq(wf_spawn(&g, run_graph_from_task, &ir), 0);
    cr_assert_eq(wf_group_wait(&g), 0, "%s", wf_group_errmsg(&g));
    cr_assert_eq(atomic_load(&ir.failures), 0);
    cr_assert_eq(atomic_load(&ir.bad_node), 0);
    wf_group_deinit(&g);
    dag_free(d);
    wf_runtime_destroy(rt);
}

Test(sched_taskgraph, two_graphs_submitted_to_one_group_both_complete)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 4 });
    dag *a = random_dag(rt, 0x5eed0009, 1500, 3, 0);
    dag *b = random_dag(rt, 0x5eed000a, 1500, 5, 30);
    wf_group g;
    cr_assert_eq(wf_group_init(&g, rt), 0);
    for (int r = 0; r < (int)wf_test_scaled(20, 5); r++) {
        dag_reset(a);
        dag_reset(b);
        cr_assert_eq(wf_taskgraph_submit(a->g, &g), 0, "%s", wf_taskgraph_errmsg(a->g));
        cr_assert_eq(wf_taskgraph_submit(b->g, &g), 0, "%s", wf_taskgraph_errmsg(b->g));
        cr_assert_eq(wf_group_wait(&g), 0, "%s", wf_group_errmsg(&g));
        dag_check(a, r);
        dag_check(b, r);
    }
    wf_group_deinit(&g);
    dag_free(a);
    dag_free(b);
    wf_runtime_destroy(rt);
}

/* ---- A running graph refuses a second run and changes -------------------------------- */

static atomic_int gate_open;
static atomic_int gate_reached;

static int gate_fn(void *arg)
{
    atomic_store(&gate_reached, 1);
    while (!atomic_load(&gate_open))
        wf_test_sleep_us(100);
    return 0;
}

static int nop_fn(void *arg)
{
    return 0;
}

Test(sched_taskgraph, a_running_graph_refuses_submit_add_and_precede_with_ebusy)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 2 });
    wf_taskgraph *tg;
    cr_assert_eq(wf_taskgraph_create(rt, &tg), 0);
    int a = wf_taskgraph_add(tg, gate_fn, NULL, "gate");
    int b = wf_taskgraph_add(tg, nop_fn, NULL, "after_gate");
    cr_assert_eq(wf_taskgraph_precede(tg, a, b), 0);
    wf_group g1, g2;
    cr_assert_eq(wf_group_init(&g1, rt), 0);
    cr_assert_eq(wf_group_init(&g2, rt), 0);
    cr_assert_eq(wf_taskgraph_submit(tg, &g1), 0, "%s", wf_taskgraph_errmsg(tg));
    while (!atomic_load(&gate_reached))
        wf_test_sleep_us(100);
    int rc = wf_taskgraph_submit(tg, &g2);
    int rc_add = wf_taskgraph_add(tg, nop_fn, NULL, "late");
    int rc_pre = wf_taskgraph_precede(tg, b, a);
    atomic_store(&gate_open, 1);
    cr_assert_eq(wf_group_wait(&g1), 0, "%s", wf_group_errmsg(&g1));
    cr_assert_eq(wf_group_wait(&g2), 0);
    cr_assert_eq(rc, WF_EBUSY, "second submit: %s", wf_err_name(rc));
    cr_assert_eq(rc_add, WF_EBUSY, "add while running: %s", wf_err_name(rc_add));
    cr_assert_eq(rc_pre, WF_EBUSY, "precede while running: %s", wf_err_name(rc_pre));
    cr_assert_eq(wf_taskgraph_node_count(tg), 2);
    wf_group_deinit(&g1);
    wf_group_deinit(&g2);
    wf_taskgraph_destroy(tg);
    wf_runtime_destroy(rt);
}

Test(sched_taskgraph, a_graph_can_run_again_once_its_run_was_waited_for)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 2 });
    dag *d = random_dag(rt, 0x5eed000b, 200, 3, 0);
    wf_group g;
    cr_assert_eq(wf_group_init(&g, rt), 0);
    for (int r = 0; r < 100; r++) {
        dag_reset(d);
        int rc = wf_taskgraph_submit(d->g, &g);
        cr_assert_eq(rc, 0, "run %d: %s: %s", r, wf_err_name(rc), wf_taskgraph_errmsg(d->g));
        cr_assert_eq(wf_group_wait(&g), 0);
        dag_check(d, r);
    }
    wf_group_deinit(&g);
    dag_free(d);
    wf_runtime_destroy(rt);
}

typedef struct ordered {
    atomic_int *next;
    int *at; /* at[id]: the position node 'id' started at */
    int id;
} ordered;

static int ordered_fn(void *arg)
{
    ordered *o = arg;
    o->at[o->id] = atomic_fetch_add(o->next, 1);
    return 0;
}

/* With one worker nobody steals, so a node's ready successors run in the order of its
 * successor list (the order its edges were added; a session adds them by priority). They
 * ran last first: the owner pops its pushes in reverse, and a gradient bucket's small last
 * input, early in the list, waited for the whole rest of backward. */
Test(sched_taskgraph, one_worker_runs_ready_successors_in_their_list_order)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 1 });
    wf_taskgraph *g = NULL;
    cr_assert_eq(wf_taskgraph_create(rt, &g), 0, "%s", wf_last_errmsg());

    enum { N = 6 };

    atomic_int next = 0;
    int at[N];
    ordered o[N];
    for (int i = 0; i < N; i++) {
        o[i] = (ordered){ &next, at, i };
        cr_assert_eq(wf_taskgraph_add(g, ordered_fn, &o[i], NULL), i);
    }
    for (int i = 1; i < N; i++)
        cr_assert_eq(wf_taskgraph_precede(g, 0, i), 0, "%s", wf_taskgraph_errmsg(g));
    for (int run = 0; run < 3; run++) {
        atomic_store(&next, 0);
        cr_assert_eq(wf_taskgraph_run(g), 0, "%s", wf_taskgraph_errmsg(g));
        for (int i = 0; i < N; i++)
            cr_assert_eq(at[i], i, "run %d: node %d ran %d-th", run, i, at[i]);
    }
    wf_taskgraph_destroy(g);
    wf_runtime_destroy(rt);
}

/* ---- Edges in order of their source, and memory a graph gives back ------------------- */

/* Edges added in order of their source are the successor array as they are: this chain
 * (with every tenth node also after the node two back, so that some nodes have one
 * predecessor and some two) grows past the edge array's first capacities between runs,
 * which moves the successors the compiled graph points at. */
Test(sched_taskgraph, a_chain_added_in_source_order_and_grown_between_runs_runs_in_order)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 2 });
    uint64_t rng = 0x5eed000c;
    dag *d = dag_new(rt, 5000);
    int sizes[] = { 300, 1000, 5000 };
    for (int s = 0; s < 3; s++) {
        int from = d->n;
        dag_add(d, sizes[s] - from, &rng, 50);
        for (int i = from; i < sizes[s]; i++) {
            if (i == 0)
                continue;
            if (i % 10 == 0 && i >= 2)
                dag_edge(d, i - 2, i);
            dag_edge(d, i - 1, i);
        }
        dag_run_and_check(d, 3);
    }
    dag_free(d);
    wf_runtime_destroy(rt);
}

/* Graphs built one after another reuse the blocks the last one gave back, which hold that
 * graph's old nodes and counters: each new graph must still run each node once, in order.
 * The last graph is destroyed after its runtime (its blocks have a cache to go back to:
 * AddressSanitizer checks it). */
Test(sched_taskgraph, graphs_built_on_reused_memory_run_correctly_and_may_outlive_the_runtime)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 2 });
    int n = (int)wf_test_scaled(200000, 50000);
    dag *last = NULL;
    for (int r = 0; r < 3; r++) {
        uint64_t rng = 0x5eed000d + (uint64_t)r;
        dag *d = dag_new(rt, n);
        dag_add(d, n, &rng, 0);
        /* Layers of 100: each node after 1 to 3 nodes of the layer before, sources random. */
        for (int i = 100; i < n; i++) {
            int base = (i / 100 - 1) * 100, k = 1 + (i + r) % 3;
            int start = (int)wf_test_rand_below(&rng, 100);
            for (int j = 0; j < k; j++) /* distinct: 37 * j mod 100 differ for j < 3 */
                dag_edge(d, base + (start + 37 * j) % 100, i);
        }
        dag_run_and_check(d, 2);
        if (last)
            dag_free(last);
        last = d;
    }
    wf_runtime_destroy(rt);
    dag_free(last);
}

/* ---- wf_taskgraph_add_after: a node and its predecessors in one call ------------------ */

/* A layered random DAG built with one wf_taskgraph_add_after() per node (1 to 4
 * predecessors drawn from the layer before, as sched_bench's DAG) runs like one built with
 * wf_taskgraph_add() and wf_taskgraph_precede(): each node once, after its predecessors. */
Test(sched_taskgraph, a_dag_built_with_add_after_runs_each_node_once_after_its_preds)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 2 });
    int width = 50, n = (int)wf_test_scaled(20000, 5000);
    uint64_t rng = 0x5eed000e;
    dag *d = dag_new(rt, n);
    for (int i = 0; i < n; i++) {
        int preds[4], np = 0;
        if (i >= width) {
            int base = (i / width - 1) * width, want = 1 + (int)wf_test_rand_below(&rng, 4);
            int start = (int)wf_test_rand_below(&rng, (uint64_t)width);
            for (int k = 0; k < want; k++) /* distinct: 13 * k mod 50 differ for k < 4 */
                preds[np++] = base + (start + 13 * k) % width;
        }
        dnode *x = &d->nodes[i];
        x->d = d;
        x->id = i;
        x->work = (uint32_t)wf_test_rand_below(&rng, 100);
        int id = wf_taskgraph_add_after(d->g, dnode_fn, x, "dag_node", preds, np);
        cr_assert_eq(id, i, "add_after returned %d for node #%d: %s", id, i,
                     wf_taskgraph_errmsg(d->g));
        d->n++;
        for (int k = 0; k < np; k++)
            dag_note_edge(d, preds[k], i);
    }
    dag_run_and_check(d, 5);
    dag_free(d);
    wf_runtime_destroy(rt);
}

/* Bad arguments add nothing: no node, and the graph still runs what it had. */
Test(sched_taskgraph, add_after_with_a_bad_predecessor_adds_nothing_and_says_why)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 1 });
    dag *d = dag_new(rt, 3);
    uint64_t rng = 1;
    dag_add(d, 2, &rng, 0);
    int unknown[2] = { 0, 2 }, negative[1] = { -1 };
    int rc = wf_taskgraph_add_after(d->g, dnode_fn, &d->nodes[2], "late", unknown, 2);
    cr_assert_eq(rc, WF_EINVAL, "an unknown predecessor: %s", wf_err_name(rc));
    cr_assert(strstr(wf_taskgraph_errmsg(d->g), "predecessor 1 is node 2") != NULL, "%s",
              wf_taskgraph_errmsg(d->g));
    cr_assert(strstr(wf_taskgraph_errmsg(d->g), "'late'") != NULL, "%s", wf_taskgraph_errmsg(d->g));
    rc = wf_taskgraph_add_after(d->g, dnode_fn, &d->nodes[2], "late", negative, 1);
    cr_assert_eq(rc, WF_EINVAL, "a negative predecessor: %s", wf_err_name(rc));
    rc = wf_taskgraph_add_after(d->g, dnode_fn, &d->nodes[2], "late", NULL, 1);
    cr_assert_eq(rc, WF_EINVAL, "NULL preds: %s", wf_err_name(rc));
    rc = wf_taskgraph_add_after(d->g, dnode_fn, &d->nodes[2], "late", unknown, -1);
    cr_assert_eq(rc, WF_EINVAL, "npred -1: %s", wf_err_name(rc));
    rc = wf_taskgraph_add_after(d->g, NULL, &d->nodes[2], "late", unknown, 1);
    cr_assert_eq(rc, WF_EINVAL, "a NULL function: %s", wf_err_name(rc));
    cr_assert_eq(wf_taskgraph_add_after(NULL, dnode_fn, NULL, "late", NULL, 0), WF_EINVAL);
    cr_assert_eq(wf_taskgraph_node_count(d->g), 2);
    dag_edge(d, 0, 1);
    dag_run_and_check(d, 2);
    /* A good call after the bad ones: node 2 after node 0. */
    d->nodes[2] = (dnode){ .d = d, .id = 2 };
    cr_assert_eq(wf_taskgraph_add_after(d->g, dnode_fn, &d->nodes[2], "late", unknown, 1), 2);
    d->n = 3;
    dag_note_edge(d, 0, 2);
    dag_run_and_check(d, 2);
    dag_free(d);
    wf_runtime_destroy(rt);
}

/* ---- wf_taskgraph_add_nodes: many nodes and their predecessors in one call ------------ */

/* Predecessor rows for nodes first .. first + count - 1 in layers of 'width' ids: each node
 * past the first layer gets 1 to 4 distinct predecessors of the layer before (which may be
 * nodes of an earlier call). Fills the nodes and notes the edges; the caller frees the rows. */
static void bulk_rows(dag *d, int first, int count, int width, uint64_t *rng, int64_t **off_out,
                      int **pred_out)
{
    int64_t *off = malloc((size_t)(count + 1) * sizeof *off);
    int *pred = malloc((size_t)(4 * count + 1) * sizeof *pred);
    cr_assert(off && pred);
    off[0] = 0;
    for (int j = 0; j < count; j++) {
        int i = first + j, np = 0;
        if (i >= width) {
            int base = (i / width - 1) * width, want = 1 + (int)wf_test_rand_below(rng, 4);
            int start = (int)wf_test_rand_below(rng, (uint64_t)width);
            for (int k = 0; k < want; k++) { /* distinct: 13 * k mod 50 differ for k < 4 */
                pred[off[j] + np] = base + (start + 13 * k) % width;
                dag_note_edge(d, pred[off[j] + np], i);
                np++;
            }
        }
        off[j + 1] = off[j] + np;
        d->nodes[i] = (dnode){ .d = d, .id = i, .work = (uint32_t)wf_test_rand_below(rng, 100) };
    }
    *off_out = off;
    *pred_out = pred;
}

/* Adds nodes first .. first + count - 1 with one wf_taskgraph_add_nodes() call. */
static void bulk_add(dag *d, int count, int width, uint64_t *rng)
{
    int64_t *off;
    int *pred, first = d->n;
    bulk_rows(d, first, count, width, rng, &off, &pred);
    int rc = wf_taskgraph_add_nodes(d->g, dnode_fn, &d->nodes[first], sizeof(dnode), "bulk", count,
                                    off, pred);
    cr_assert_eq(rc, first, "add_nodes returned %d (%s), not the first id %d: %s", rc,
                 wf_err_name(rc), first, wf_taskgraph_errmsg(d->g));
    d->n += count;
    cr_assert_eq(wf_taskgraph_node_count(d->g), d->n);
    free(off);
    free(pred);
}

/* The DAG of a_dag_built_with_add_after_..., added in one call to an empty graph (the call
 * that writes the run's arrays directly): each node once, after its predecessors. */
Test(sched_taskgraph, a_dag_added_in_one_add_nodes_call_runs_each_node_once_after_its_preds)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 2 });
    int n = (int)wf_test_scaled(20000, 5000);
    uint64_t rng = 0x5eed000f;
    dag *d = dag_new(rt, n);
    bulk_add(d, n, 50, &rng);
    dag_run_and_check(d, 5);
    dag_free(d);
    wf_runtime_destroy(rt);
}

/* A graph built by add_nodes, then grown between runs by add_nodes (predecessors in both
 * calls), add_after, add and precede (an edge from a new node to node 0, against the ids'
 * order): every run runs every node once after its predecessors. */
Test(sched_taskgraph, a_graph_from_add_nodes_grown_by_every_kind_of_call_runs_in_order)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 2 });
    uint64_t rng = 0x5eed0010;
    dag *d = dag_new(rt, 3002);
    bulk_add(d, 1000, 50, &rng);
    dag_run_and_check(d, 2);
    bulk_add(d, 2000, 50, &rng);
    dag_run_and_check(d, 2);
    int preds[2] = { 10, 2990 };
    d->nodes[3000] = (dnode){ .d = d, .id = 3000 };
    cr_assert_eq(wf_taskgraph_add_after(d->g, dnode_fn, &d->nodes[3000], "after", preds, 2), 3000,
                 "%s", wf_taskgraph_errmsg(d->g));
    d->n++;
    dag_note_edge(d, 10, 3000);
    dag_note_edge(d, 2990, 3000);
    dag_add(d, 1, &rng, 0);
    dag_edge(d, 3001, 0);
    dag_edge(d, 5, 7);
    dag_run_and_check(d, 3);
    dag_free(d);
    wf_runtime_destroy(rt);
}

static int count_fn(void *arg)
{
    atomic_fetch_add((atomic_long *)arg, 1);
    return 0;
}

/* 'arg_stride' 0 gives every node the same argument; without 'pred_off' every node is a
 * root, on an empty graph and on one that has nodes already. */
Test(sched_taskgraph, add_nodes_with_stride_0_and_no_rows_gives_every_node_the_same_arg)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 2 });
    wf_taskgraph *g;
    atomic_long count = 0;
    cr_assert_eq(wf_taskgraph_create(rt, &g), 0);
    cr_assert_eq(wf_taskgraph_add_nodes(g, count_fn, &count, 0, "count", 5000, NULL, NULL), 0, "%s",
                 wf_taskgraph_errmsg(g));
    cr_assert_eq(wf_taskgraph_add_nodes(g, count_fn, &count, 0, "count", 3000, NULL, NULL), 5000,
                 "%s", wf_taskgraph_errmsg(g));
    cr_assert_eq(wf_taskgraph_add_nodes(g, count_fn, &count, 0, "count", 0, NULL, NULL), 8000);
    for (int r = 1; r <= 3; r++) {
        cr_assert_eq(wf_taskgraph_run(g), 0, "%s", wf_taskgraph_errmsg(g));
        cr_assert_eq(atomic_load(&count), 8000L * r, "run %d: %ld nodes ran", r,
                     atomic_load(&count));
    }
    wf_taskgraph_destroy(g);
    wf_runtime_destroy(rt);
}

/* Each bad call returns WF_EINVAL, says why, and adds nothing, on an empty graph (the direct
 * build) and on one with nodes (the general path); a good call afterwards works. */
Test(sched_taskgraph, add_nodes_with_bad_rows_adds_nothing_and_says_why)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 1 });
    dag *d = dag_new(rt, 6);
    for (int pass = 0; pass < 2; pass++) {
        int first = d->n;
        dnode *x = &d->nodes[first];
        int64_t off[4] = { 0, 0, 1, 2 }, down[4] = { 1, 1, 0, 1 }, back[4] = { 2, 2, 2, 0 };
        int64_t past[4] = { 0, 3, 1, 2 }; /* row 0 would read preds[2], past the 2 entries */
        int later[2] = { 0, first + 2 }, own[2] = { first + 1, first }, neg[2] = { -1, 0 };

        struct {
            const int64_t *off;
            const int *pred;
            const char *says;
        } bad[] = {
            { off, later, "preds[1] is node" },
            { off, own, "an earlier node" },
            { off, neg, "preds[0] is node -1" },
            { down, own, "pred_off[1] 1 > pred_off[2] 0" },
            { back, own, "pred_off[3] 0 < pred_off[0] 2" },
            { past, own, "pred_off[1] 3 is past pred_off[3] 2" },
            { off, NULL, "NULL preds" },
        };

        for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
            int rc = wf_taskgraph_add_nodes(d->g, dnode_fn, x, sizeof *x, "bad", 3, bad[b].off,
                                            bad[b].pred);
            cr_assert_eq(rc, WF_EINVAL, "pass %d, case %zu: %s", pass, b, wf_err_name(rc));
            cr_assert(strstr(wf_taskgraph_errmsg(d->g), bad[b].says) != NULL,
                      "pass %d, case %zu: '%s' lacks '%s'", pass, b, wf_taskgraph_errmsg(d->g),
                      bad[b].says);
            cr_assert_eq(wf_taskgraph_node_count(d->g), first);
        }
        cr_assert_eq(wf_taskgraph_add_nodes(d->g, NULL, x, 0, "bad", 3, NULL, NULL), WF_EINVAL);
        cr_assert_eq(wf_taskgraph_add_nodes(d->g, dnode_fn, x, 0, "bad", -1, NULL, NULL),
                     WF_EINVAL);
        cr_assert_eq(wf_taskgraph_node_count(d->g), first);
        /* A good call: node first + 1 after first, first + 2 after both (and, in the second
         * pass, node first after the first pass's last node). */
        int64_t good_off[4] = { 0, first > 0, 1 + (first > 0), 3 + (first > 0) };
        int good[4] = { first - 1, first, first, first + 1 };
        const int *rows = first > 0 ? good : good + 1;
        for (int j = 0; j < 3; j++) {
            d->nodes[first + j] = (dnode){ .d = d, .id = first + j };
            for (int64_t k = good_off[j]; k < good_off[j + 1]; k++)
                dag_note_edge(d, rows[k], first + j);
        }
        cr_assert_eq(
            wf_taskgraph_add_nodes(d->g, dnode_fn, x, sizeof *x, "good", 3, good_off, rows), first,
            "%s", wf_taskgraph_errmsg(d->g));
        d->n += 3;
        dag_run_and_check(d, 2);
    }
    cr_assert_eq(wf_taskgraph_add_nodes(NULL, dnode_fn, NULL, 0, "bad", 1, NULL, NULL), WF_EINVAL);
    dag_free(d);
    wf_runtime_destroy(rt);
}

/* Pushes counted by the workers (wf_runtime_stats), summed. */
static uint64_t pushes(wf_runtime *rt, uint64_t *ran)
{
    wf_worker_stats s[4];
    int nw = wf_runtime_stats(rt, s, 4);
    uint64_t p = 0;
    cr_assert_gt(nw, 0);
    *ran = 0;
    for (int i = 0; i < nw; i++) {
        p += s[i].spawned;
        *ran += s[i].tasks_run;
    }
    return p;
}

static int fail_at_fn(void *arg)
{
    const int *id = arg;
    return *id == 1234 ? wf_task_fail(WF_EINVAL, "node %d refuses", *id) : 0;
}

/* A node is no task: a chain runs with no push at all (each node's end makes the next one
 * ready on the same worker), and a fan-out of 1000 from one root pushes exactly the 999 leaves
 * its worker does not keep; the join is kept by whoever ends the last leaf. If nodes went
 * through the deque (or had tasks of their own), the counts would be higher. */
Test(sched_taskgraph, a_ready_node_goes_through_a_deque_only_when_its_releaser_keeps_another)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 2 });
    int n = 100000, w = 1000;
    int64_t *off = malloc((size_t)(n + 1) * sizeof *off);
    int *pred = malloc((size_t)n * sizeof *pred); /* n - 1 for the chain, 2w for the fan */
    atomic_long count = 0;
    uint64_t ran;
    cr_assert(off && pred);
    off[0] = 0;
    for (int i = 0; i < n; i++) {
        off[i + 1] = i;
        if (i > 0)
            pred[i - 1] = i - 1;
    }
    wf_taskgraph *g;
    cr_assert_eq(wf_taskgraph_create(rt, &g), 0);
    cr_assert_eq(wf_taskgraph_add_nodes(g, count_fn, &count, 0, "link", n, off, pred), 0);
    for (int r = 0; r < 3; r++) {
        wf_runtime_stats_reset(rt);
        cr_assert_eq(wf_taskgraph_run(g), 0, "%s", wf_taskgraph_errmsg(g));
        cr_assert_eq(pushes(rt, &ran), 0, "a chain of %d nodes pushed some", n);
        cr_assert_eq(ran, (uint64_t)n);
    }
    wf_taskgraph_destroy(g);
    /* root 0, leaves 1..w, join w + 1 */
    off[0] = off[1] = 0;
    for (int i = 1; i <= w; i++) {
        off[i + 1] = i;
        pred[i - 1] = 0;
    }
    off[w + 2] = 2 * w;
    for (int i = 0; i < w; i++)
        pred[w + i] = 1 + i;
    cr_assert_eq(wf_taskgraph_create(rt, &g), 0);
    cr_assert_eq(wf_taskgraph_add_nodes(g, count_fn, &count, 0, "fan", w + 2, off, pred), 0);
    for (int r = 0; r < 20; r++) {
        wf_runtime_stats_reset(rt);
        cr_assert_eq(wf_taskgraph_run(g), 0, "%s", wf_taskgraph_errmsg(g));
        cr_assert_eq(pushes(rt, &ran), (uint64_t)(w - 1), "run %d", r);
        cr_assert_eq(ran, (uint64_t)(w + 2));
    }
    wf_taskgraph_destroy(g);
    free(off);
    free(pred);
    wf_runtime_destroy(rt);
}

/* Nodes of different calls live in different segments: each runs its own function on its own
 * argument, and a failure names the failing node by the name its call gave. */
Test(sched_taskgraph, nodes_of_every_kind_of_call_run_their_own_function_and_fail_by_name)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 2 });

    enum { N = 3000 };

    static int ids[N];
    atomic_long count = 0;
    wf_taskgraph *g;
    for (int i = 0; i < N; i++)
        ids[i] = i;
    cr_assert_eq(wf_taskgraph_create(rt, &g), 0);
    cr_assert_eq(wf_taskgraph_add(g, count_fn, &count, "single"), 0);
    cr_assert_eq(
        wf_taskgraph_add_nodes(g, fail_at_fn, &ids[1], sizeof ids[0], "bulk", 2000, NULL, NULL), 1);
    /* bulk node j is graph node 1 + j with argument ids[1 + j]: graph node 1234 fails, and a
     * chain of list nodes hangs from it */
    for (int i = 2001; i < N; i++)
        cr_assert_eq(wf_taskgraph_add_after(g, count_fn, &count, "after",
                                            &(int){ i == 2001 ? 1234 : i - 1 }, 1),
                     i);
    for (int r = 0; r < 3; r++) {
        atomic_store(&count, 0);
        cr_assert_eq(wf_taskgraph_run(g), WF_EINVAL);
        cr_assert(strstr(wf_taskgraph_errmsg(g), "bulk") && strstr(wf_taskgraph_errmsg(g), "1234"),
                  "the message names the node: %s", wf_taskgraph_errmsg(g));
        cr_assert_leq(atomic_load(&count), 1, "run %d: %ld nodes after the failing one ran", r,
                      atomic_load(&count) - 1);
    }
    ids[1234] = 0; /* now it succeeds: every node runs */
    atomic_store(&count, 0);
    cr_assert_eq(wf_taskgraph_run(g), 0, "%s", wf_taskgraph_errmsg(g));
    cr_assert_eq(atomic_load(&count), 1 + N - 2001);
    wf_taskgraph_destroy(g);
    wf_runtime_destroy(rt);
}
