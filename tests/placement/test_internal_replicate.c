/* tests/placement/test_internal_replicate.c: the data-parallel rewrite as a pure graph pass
 *   (placement/replicate.c, wf__replicate()) with the Mirrored strategy's devices
 *   ('shard_device'), on a graph without any session: every node of shard i's copy that
 *   the device can run carries shard i's device, the row split of the batch, the
 *   reductions, the updates and the user's own nodes carry none (the host), and an f64
 *   replica node stays on the host; without 'shard_device' no node is placed. A bucket that
 *   only its dp_reduce reads is reduced in place (dp_grad nodes); others keep the flat value.
 *   A pipeline's micro-batch gradients are summed by the fixed tree's nodes, each made after
 *   the backward parts it sums and ordered before the next micro-batch's gradient. A bucket
 *   closes once it holds its limit, the gradient that reaches it included (DDP's rule).
 * Internal: calls placement/replicate.h. */
#include "../../core/graph.h"
#include "../../placement/replicate.h"
#include "runtime_util.h"

#include <weft/weft.h>

#include <criterion/criterion.h>

#include <stdlib.h>
#include <string.h>

TestSuite(placement_internal_replicate, .init = wf_test_rt_setup, .fini = wf_test_rt_teardown,
          .timeout = WF_TEST_TIMEOUT(30));

typedef struct net {
    wf_graph *g;
    wf_node *x, *y, *loss, *train, *f64;
    int n; /* the user's nodes */
} net;

/* A linear softmax model trained by SGD, and an f64 value of the batch (a per-replica node
 * no device of the rule takes). */
static net build(void)
{
    net m;
    m.g = wf_graph_create(rt, WF_STATIC);
    m.x = wf_placeholder(m.g, "x", WF_F32, WF_SHAPE(-1, 6));
    m.y = wf_placeholder(m.g, "y", WF_I32, WF_SHAPE(-1));
    wf_node *w = wf_variable(m.g, "w", WF_F32, WF_SHAPE(6, 3), wf_init_glorot_uniform(1));
    wf_node *logits = wf_matmul(m.g, m.x, w);
    m.loss = wf_mean(m.g, wf_softmax_cross_entropy(m.g, logits, m.y));
    m.f64 = wf_sum(m.g, wf_cast(m.g, m.x, WF_F64));
    m.train = wf_minimize(m.g, wf_sgd(0.1), m.loss);
    cr_assert_not_null(m.train, "%s", wf_graph_errmsg(m.g));
    m.n = wf_graph_node_count(m.g);
    return m;
}

/* The rewrite of 'm' with 3 local shards on devices 4, 5 and 6 (any ids above the CPU: the
 * pass reads them only to tell GPUs, below 'n_real', from simulated devices). */
static int rewrite(net *m, const int *dev, wf__replica_map *map)
{
    wf__replicate_opts o = { .rank = 0,
                             .size = 1,
                             .shards = 3,
                             .aggregation = 0,
                             .bucket_bytes = 1 << 20,
                             .first_bucket_bytes = 1 << 20,
                             .edge_base = 16384,
                             .shard_device = dev,
                             .n_real = 1 };
    return wf__replicate(m->g, &o, map);
}

Test(placement_internal_replicate, each_shard_runs_on_its_device_and_the_rest_on_the_host)
{
    net m = build();
    static const int dev[3] = { 4, 5, 6 };
    wf__replica_map map;
    int rc = rewrite(&m, dev, &map);
    cr_assert_eq(rc, 0, "%s: %s", wf_err_name(rc), wf_last_errmsg());
    cr_assert_eq(map.n_local, 3);
    int on[7] = { 0 }, rows = 0, reduces = 0, f64_host = 0;
    int total = wf_graph_node_count(m.g);
    for (int id = 0; id < total; id++) {
        const wf_node *n = wf_graph_node(m.g, id);
        if (id < m.n) {
            cr_assert_eq(n->device, -1, "the user's node '%s' was placed", n->name);
            continue;
        }
        if (strcmp(n->op->name, "shard_rows") == 0) {
            rows++;
            cr_assert_eq(n->device, -1, "a row split is on device %d", n->device);
        } else if (strcmp(n->op->name, "dp_reduce") == 0) {
            reduces++;
            cr_assert_eq(n->device, -1, "a reduction is on device %d", n->device);
        } else if (n->op->n_assign > 0) {
            cr_assert_eq(n->device, -1, "update '%s' is on device %d", n->name, n->device);
        } else if (n->dtype == WF_F64 || (n->n_inputs && n->inputs[0]->dtype == WF_F64)) {
            cr_assert_eq(n->device, -1, "f64 node '%s' is on device %d", n->name, n->device);
            f64_host++;
        }
        if (n->device >= 0) {
            cr_assert(n->device >= 4 && n->device <= 6, "'%s' on device %d", n->name, n->device);
            on[n->device]++;
        }
    }
    cr_assert_eq(rows, 2 * 3, "a row split per batch placeholder and shard");
    cr_assert_geq(reduces, 2, "the gradient bucket and the loss");
    cr_assert_geq(f64_host, 3, "each shard's f64 nodes");
    cr_assert(on[4] >= 8 && on[5] == on[4] && on[6] == on[4],
              "every shard places the same nodes: %d %d %d", on[4], on[5], on[6]);
    free(map.remap);
    wf_graph_destroy(m.g);
}

Test(placement_internal_replicate, without_devices_nothing_is_placed)
{
    net m = build();
    wf__replica_map map;
    int rc = rewrite(&m, NULL, &map);
    cr_assert_eq(rc, 0, "%s: %s", wf_err_name(rc), wf_last_errmsg());
    int total = wf_graph_node_count(m.g);
    cr_assert_gt(total, m.n);
    for (int id = 0; id < total; id++)
        cr_assert_eq(wf_graph_node(m.g, id)->device, -1, "node %d is placed", id);
    free(map.remap);
    wf_graph_destroy(m.g);
}

/* The dp_reduce of the gradient bucket of 'm' (after the rewrite), or NULL. */
static const wf_node *bucket_of(const net *m)
{
    int total = wf_graph_node_count(m->g);
    for (int id = m->n; id < total; id++) {
        const wf_node *n = wf_graph_node(m->g, id);
        if (strcmp(n->op->name, "dp_reduce") == 0 && strncmp(n->name, "dp_bucket_", 10) == 0)
            return n;
    }
    return NULL;
}

/* How many nodes of the rewritten graph of op 'op' read 'x' as data. */
static int readers_of(const net *m, const wf_node *x, const char *op)
{
    int total = wf_graph_node_count(m->g), k = 0;
    for (int id = m->n; id < total; id++) {
        const wf_node *n = wf_graph_node(m->g, id);
        for (int j = 0; j < n->n_inputs; j++)
            k += n->inputs[j] == x && strcmp(n->op->name, op) == 0;
    }
    return k;
}

/* Nothing but the bucket reads the gradients' shard copies: it reduces them in place (its
 * value a token) and the update reads a dp_grad over the first shard's copy, not a slice. */
Test(placement_internal_replicate, a_bucket_only_it_reads_is_reduced_in_place)
{
    net m = build();
    wf__replica_map map;
    int rc = rewrite(&m, NULL, &map);
    cr_assert_eq(rc, 0, "%s: %s", wf_err_name(rc), wf_last_errmsg());
    const wf_node *b = bucket_of(&m);
    cr_assert_not_null(b, "no gradient bucket");
    cr_assert(b->attrs->keepdims, "the bucket is not reduced in place");
    cr_assert_eq(b->shape.rank, 0, "the in-place bucket's value is not a scalar token");
    cr_assert_eq(readers_of(&m, b, "dp_grad"), 1, "one gradient, one dp_grad");
    cr_assert_eq(readers_of(&m, b, "slice"), 0, "a slice of an in-place bucket");
    int total = wf_graph_node_count(m.g), updates = 0;
    for (int id = m.n; id < total; id++) {
        const wf_node *n = wf_graph_node(m.g, id);
        if (strcmp(n->op->name, "dp_grad") == 0)
            cr_assert_eq(n->inputs[0], b->inputs[1], "dp_grad reads another value than shard 0's");
        if (n->op->n_assign > 0 && strncmp(n->op->name, "update", 6) == 0) {
            updates++;
            cr_assert(n->inputs[1]->op == &wf_op_dp_grad, "the update reads '%s' (%s)",
                      n->inputs[1]->name, n->inputs[1]->op->name);
        }
    }
    cr_assert_eq(updates, 1);
    free(map.remap);
    wf_graph_destroy(m.g);
}

/* A replica node ordered after a gradient (a control edge) might read its shard copies while
 * the bucket would write over them: that bucket is packed into its flat value and sliced. So
 * is every bucket of Mirrored's devices (the copies placement adds read the shards' values). */
Test(placement_internal_replicate, a_gradient_something_else_reads_keeps_the_flat_bucket)
{
    for (int devices = 0; devices < 2; devices++) {
        net m = build();
        static const int dev[3] = { 4, 5, 6 };
        if (!devices) {
            const wf_node *grad = NULL;
            for (int id = 0; id < m.n && !grad; id++)
                if (wf_graph_node(m.g, id)->is_gradient)
                    grad = wf_graph_node(m.g, id);
            cr_assert_not_null(grad, "no node is marked a gradient");
            wf_node *peek = wf_relu(m.g, m.x);
            cr_assert_eq(wf__node_add_control(peek, (wf_node *)grad), 0);
            m.n = wf_graph_node_count(m.g);
        }
        wf__replica_map map;
        int rc = rewrite(&m, devices ? dev : NULL, &map);
        cr_assert_eq(rc, 0, "%s: %s", wf_err_name(rc), wf_last_errmsg());
        const wf_node *b = bucket_of(&m);
        cr_assert_not_null(b, "no gradient bucket");
        cr_assert(!b->attrs->keepdims, "the bucket is reduced in place (devices %d)", devices);
        cr_assert_eq(b->shape.rank, 1);
        cr_assert_eq(readers_of(&m, b, "slice"), 1, "one gradient, one slice");
        cr_assert_eq(readers_of(&m, b, "dp_grad"), 0);
        free(map.remap);
        wf_graph_destroy(m.g);
    }
}

/* A pipeline of one stage, 5 micro-batches made in GPipe's order (every forward part, then the
 * backward parts in micro-batch order): the one gradient's fixed tree over the micro-batches
 * is 4 dp_reduce nodes of [lo, hi) split at the largest power of two below the count (0..2,
 * 2..4, 0..4, 0..5), each made right after micro-batch hi - 1's backward part, and micro-batch
 * i's gradient copy is ordered after the nodes ending at i (so its bytes may be those the
 * sums freed); the update reads a dp_grad of the node over every micro-batch. */
Test(placement_internal_replicate, a_pipeline_sums_the_micro_batches_gradients_as_they_finish)
{
    net m = build();

    enum { B = 5 };

    int fwd_end = m.loss->id; /* the user's nodes after the loss are the backward part's */
    int *stage_of = calloc((size_t)m.n, sizeof *stage_of);
    uint8_t *backward = calloc((size_t)m.n, 1);
    int order[2 * B];
    for (int i = 0; i < B; i++) {
        order[i] = i;
        order[B + i] = -1 - i;
    }
    const wf_node *grad = NULL;
    for (int id = 0; id < m.n; id++) {
        backward[id] = id > fwd_end;
        if (wf_graph_node(m.g, id)->is_gradient)
            grad = wf_graph_node(m.g, id);
    }
    cr_assert_not_null(grad);
    wf__replicate_opts o = { .size = 1,
                             .shards = B,
                             .bucket_bytes = 1 << 20,
                             .first_bucket_bytes = 1 << 20,
                             .edge_base = 16384,
                             .p2p_edge_base = 0,
                             .stage_of = stage_of,
                             .stages = 1,
                             .batch_rows = 20,
                             .order = order,
                             .backward = backward };
    wf__replica_map map;
    int rc = wf__replicate(m.g, &o, &map);
    cr_assert_eq(rc, 0, "%s: %s", wf_err_name(rc), wf_last_errmsg());
    const wf_node *shard[B] = { 0 }, *tree[B + 1][B + 1] = { { 0 } }, *top = NULL;
    int n_tree = 0, total = wf_graph_node_count(m.g);
    for (int i = 0; i < B; i++)
        shard[i] = map.shard[i * m.n + grad->id];
    for (int id = m.n; id < total; id++) {
        const wf_node *n = wf_graph_node(m.g, id);
        if (n->op != &wf_op_dp_reduce || n->attrs->step[1] != 1)
            continue;
        int lo = (int)n->attrs->begin[1], hi = (int)n->attrs->end[1];
        cr_assert(lo >= 0 && hi <= B && hi - lo >= 2, "tree node over %d .. %d", lo, hi);
        tree[lo][hi] = n;
        n_tree++;
        cr_assert_eq(n->inputs[1], shard[lo], "node %d..%d does not sum into shard %d", lo, hi, lo);
        if (hi < B)
            cr_assert_lt(n->id, shard[hi]->id, "node %d..%d made after shard %d's gradient", lo, hi,
                         hi);
        if (hi == B && lo == 0)
            top = n;
    }
    cr_assert_eq(n_tree, 4, "%d tree nodes for 5 micro-batches", n_tree);
    cr_assert(tree[0][2] && tree[2][4] && tree[0][4] && top,
              "not the fixed tree 0..2 2..4 0..4 0..5");
    for (int i = 2; i < B; i++)
        for (int lo = 0; lo + 1 < i; lo++) {
            if (!tree[lo][i])
                continue;
            bool after = false;
            for (int k = 0; k < shard[i]->n_control; k++)
                after |= shard[i]->control[k] == tree[lo][i];
            cr_assert(after, "shard %d's gradient is not ordered after node %d..%d", i, lo, i);
        }
    const wf_node *g = map.remap[grad->id];
    cr_assert(g && g->op == &wf_op_dp_grad && g->inputs[1] == top,
              "the global gradient is no dp_grad of the node over every micro-batch");
    wf__replica_map_free(&map);
    free(stage_of);
    free(backward);
    wf_graph_destroy(m.g);
}

/* The gradients of bucket 'name' after the rewrite (one local shard): their element counts in
 * 'numel' (at most 'cap'); the count, or -1 when there is no such bucket. */
static int bucket_members(const wf_graph *g, const char *name, int64_t *numel, int cap)
{
    const wf_node *b = wf_graph_find((wf_graph *)g, name);
    if (!b || strcmp(b->op->name, "dp_reduce") != 0)
        return -1;
    int k = 0;
    for (int j = 1; j < b->n_inputs && k < cap; j++) /* inputs[0]: the batch (its rows) */
        numel[k++] = wf_shape_numel(b->inputs[j]->shape);
    return k;
}

/* DDP's buckets (c10d's compute_bucket_assignment_by_size): a 1 MiB first bucket, then 25
 * MiB, each closing once it holds its limit. Backward makes the gradients of w3 (24 KiB), w2
 * (1.4 MiB) and w1 (1.8 MiB) in that order: the first bucket takes w3 and w2 (reaching 1 MiB),
 * so w2's reduction starts while w1's gradient is computed, and the second holds w1 alone
 * (the rule "close when the next would not fit" gave {w3} and {w2, w1}: nothing large
 * overlapped backward). */
Test(placement_internal_replicate, a_bucket_closes_once_the_gradient_reaching_its_limit_joins)
{
    enum { IN = 784, H = 600, OUT = 10 };

    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(-1, IN));
    wf_node *y = wf_placeholder(g, "y", WF_I32, WF_SHAPE(-1));
    wf_node *w1 = wf_variable(g, "w1", WF_F32, WF_SHAPE(IN, H), wf_init_glorot_uniform(1));
    wf_node *w2 = wf_variable(g, "w2", WF_F32, WF_SHAPE(H, H), wf_init_glorot_uniform(2));
    wf_node *w3 = wf_variable(g, "w3", WF_F32, WF_SHAPE(H, OUT), wf_init_glorot_uniform(3));
    wf_node *h = wf_relu(g, wf_matmul(g, wf_relu(g, wf_matmul(g, x, w1)), w2));
    wf_node *loss = wf_mean(g, wf_softmax_cross_entropy(g, wf_matmul(g, h, w3), y));
    cr_assert_not_null(wf_minimize(g, wf_sgd(0.1), loss), "%s", wf_graph_errmsg(g));
    wf__replicate_opts o = { .size = 1,
                             .shards = 1,
                             .bucket_bytes = 25u << 20,
                             .first_bucket_bytes = 1u << 20,
                             .edge_base = 16384 };
    wf__replica_map map;
    int rc = wf__replicate(g, &o, &map);
    cr_assert_eq(rc, 0, "%s: %s", wf_err_name(rc), wf_last_errmsg());
    cr_assert_eq(map.n_buckets, 2, "%d buckets", map.n_buckets);
    int64_t n0[4], n1[4];
    cr_assert_eq(bucket_members(g, "dp_bucket_0", n0, 4), 2);
    cr_assert_eq(n0[0], (int64_t)H * OUT, "the first bucket starts with %lld values",
                 (long long)n0[0]);
    cr_assert_eq(n0[1], (int64_t)H * H, "w2's gradient is not in the first bucket");
    cr_assert_eq(bucket_members(g, "dp_bucket_1", n1, 4), 1);
    cr_assert_eq(n1[0], (int64_t)IN * H);
    wf__replica_map_free(&map);
    wf_graph_destroy(g);
}
