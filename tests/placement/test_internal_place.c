/* tests/placement/test_internal_place.c: device assignment as a pure function
 *   (placement/place.c, wf__place()), run on graphs without any session or device: the
 *   copy nodes it inserts (one per value and destination, right after the value, read by
 *   the readers there), a key node on a device handed out by its copy to the host, a
 *   variable read on one device only made resident there, the same result for the same
 *   input with the input untouched, and the errors naming the node and the device.
 * Internal: calls placement/place.h on node lists made from a graph's nodes in creation
 *   order (a topological order). */
#include "../../core/graph.h"
#include "../../placement/place.h"
#include "runtime_util.h"

#include <weft/weft.h>

#include <criterion/criterion.h>

#include <stdlib.h>
#include <string.h>

TestSuite(placement_internal_place, .init = wf_test_rt_setup, .fini = wf_test_rt_teardown,
          .timeout = WF_TEST_TIMEOUT(30));

#define MAXN 16

/* The nodes of a graph as placement's input: every node, inputs as CSR. */
typedef struct input {
    wf_node *nodes[MAXN];
    int32_t off[MAXN + 1], idx[4 * MAXN], key[2];
    wf__place_in in;
} input;

static void input_make(input *t, wf_node *const *nodes, int n, wf_node *const *key, int n_key)
{
    cr_assert_leq(n, MAXN);
    int32_t e = 0;
    for (int i = 0; i < n; i++) {
        t->nodes[i] = nodes[i];
        t->off[i] = e;
        for (int k = 0; k < nodes[i]->n_inputs; k++) {
            int j = 0;
            while (j < i && nodes[j] != nodes[i]->inputs[k])
                j++;
            cr_assert_lt(j, i, "input %d of '%s' is not an earlier node", k, nodes[i]->name);
            t->idx[e++] = j;
        }
    }
    t->off[n] = e;
    for (int k = 0; k < n_key; k++)
        for (int i = 0; i < n; i++)
            if (nodes[i] == key[k])
                t->key[k] = i;
    t->in = (wf__place_in){
        .n = n,
        .nodes = t->nodes,
        .in_off = t->off,
        .in_idx = t->idx,
        .n_key = n_key,
        .key = t->key,
        .kernels = NULL, /* the op defs' own kernels */
        .n_real = 1,     /* the CPU */
        .n_sim = 1,      /* sim:0, device 1 */
        .device = -1,    /* the rule keeps unplaced nodes on the CPU */
    };
}

/* x (placeholder), w (variable), h = x @ w on sim:0, r = relu(h) on the CPU. */
typedef struct small {
    wf_graph *g;
    wf_node *x, *w, *h, *r;
} small;

static small small_make(void)
{
    small m;
    m.g = wf_graph_create(rt, WF_STATIC);
    m.x = wf_placeholder(m.g, "x", WF_F32, WF_SHAPE(2, 3));
    m.w = wf_variable(m.g, "w", WF_F32, WF_SHAPE(3, 4), wf_init_zeros());
    m.h = wf_matmul(m.g, m.x, m.w);
    m.r = wf_relu(m.g, m.h);
    cr_assert_not_null(m.r, "%s", wf_graph_errmsg(m.g));
    cr_assert_eq(wf_node_set_device(m.h, 1), 0);
    return m;
}

Test(placement_internal_place, crossings_become_copy_nodes_after_their_values)
{
    small m = small_make();
    input t;
    input_make(&t, (wf_node *[]){ m.x, m.w, m.h, m.r }, 4, &m.r, 1);
    wf__placement pl;
    cr_assert_eq(wf__place(&t.in, &pl), 0, "%s", wf_last_errmsg());
    cr_assert_not_null(pl.where);
    /* w is read only on sim:0: resident there, no copy. x goes to sim:0, h to the host. */
    cr_assert_eq(pl.n_resident, 1);
    cr_assert_eq(pl.n_gpu, 1);
    cr_assert_eq(pl.n_copies, 2, "got %d copies", pl.n_copies);
    cr_assert_eq(pl.n, 6);
    int32_t ix = pl.new_index[0], iw = pl.new_index[1], ih = pl.new_index[2], ir = pl.new_index[3];
    cr_assert_eq(pl.where[iw], 1);
    cr_assert_eq(pl.where[ih], 1);
    cr_assert_eq(pl.where[ir], 0);
    for (int k = 0; k < pl.n_copies; k++) {
        const wf__copy *c = &pl.copies[k];
        const wf_node *cn = pl.nodes[c->at];
        cr_assert_eq(cn->op, &wf_op_copy);
        cr_assert_eq(c->at, c->value + 1, "a copy comes right after its value");
        cr_assert_eq(pl.where[c->at], c->to);
        cr_assert_eq(cn->attrs->from_dev, c->from);
        cr_assert_eq(cn->attrs->to_dev, c->to);
        cr_assert_eq(pl.in_idx[pl.in_off[c->at]], c->value);
        cr_assert(c->value == ix ? c->from == 0 && c->to == 1 : c->value == ih && c->to == 0);
    }
    /* h reads x's copy and w itself; r reads h's copy. */
    cr_assert_eq(pl.in_idx[pl.in_off[ih]], ix + 1);
    cr_assert_eq(pl.in_idx[pl.in_off[ih] + 1], iw);
    cr_assert_eq(pl.in_idx[pl.in_off[ir]], ih + 1);
    cr_assert_eq(pl.key_at[0], ir, "r is on the host: handed out as it is");
    wf__placement_free(&pl);
    wf_graph_destroy(m.g);
}

Test(placement_internal_place, a_key_node_on_a_device_is_handed_out_by_its_copy_to_the_host)
{
    small m = small_make();
    input t;
    input_make(&t, (wf_node *[]){ m.x, m.w, m.h }, 3, &m.h, 1);
    wf__placement pl;
    cr_assert_eq(wf__place(&t.in, &pl), 0, "%s", wf_last_errmsg());
    int32_t ih = pl.new_index[2];
    cr_assert_eq(pl.key_at[0], ih + 1);
    cr_assert_eq(pl.nodes[ih + 1]->op, &wf_op_copy);
    cr_assert_eq(pl.where[ih + 1], 0);
    wf__placement_free(&pl);
    wf_graph_destroy(m.g);
}

Test(placement_internal_place, the_same_input_gives_the_same_placement_and_stays_untouched)
{
    small m = small_make();
    input t;
    input_make(&t, (wf_node *[]){ m.x, m.w, m.h, m.r }, 4, &m.r, 1);
    input before = t;
    wf__placement a, b;
    cr_assert_eq(wf__place(&t.in, &a), 0, "%s", wf_last_errmsg());
    cr_assert_eq(wf__place(&t.in, &b), 0, "%s", wf_last_errmsg());
    cr_assert_eq(memcmp(before.nodes, t.nodes, sizeof t.nodes), 0);
    cr_assert_eq(memcmp(before.off, t.off, sizeof t.off), 0);
    cr_assert_eq(memcmp(before.idx, t.idx, sizeof t.idx), 0);
    cr_assert_eq(a.n, b.n);
    cr_assert_eq(memcmp(a.where, b.where, (size_t)a.n * sizeof *a.where), 0);
    cr_assert_eq(memcmp(a.in_idx, b.in_idx, (size_t)a.in_off[a.n] * sizeof *a.in_idx), 0);
    cr_assert_eq(memcmp(a.copies, b.copies, (size_t)a.n_copies * sizeof *a.copies), 0);
    wf__placement_free(&a);
    wf__placement_free(&b);
    wf_graph_destroy(m.g);
}

Test(placement_internal_place, everything_on_the_cpu_leaves_the_nodes_as_they_are)
{
    small m = small_make();
    cr_assert_eq(wf_node_set_device(m.h, -1), 0);
    input t;
    input_make(&t, (wf_node *[]){ m.x, m.w, m.h, m.r }, 4, &m.r, 1);
    wf__placement pl;
    cr_assert_eq(wf__place(&t.in, &pl), 0, "%s", wf_last_errmsg());
    cr_assert_null(pl.where);
    cr_assert_eq(pl.n_copies, 0);
    wf__placement_free(&pl);
    wf_graph_destroy(m.g);
}

Test(placement_internal_place, a_device_the_runtime_lacks_is_einval_naming_node_and_device)
{
    small m = small_make();
    cr_assert_eq(wf_node_set_device(m.h, 5), 0);
    input t;
    input_make(&t, (wf_node *[]){ m.x, m.w, m.h, m.r }, 4, &m.r, 1);
    wf__placement pl;
    cr_assert_eq(wf__place(&t.in, &pl), WF_EINVAL);
    const char *msg = wf_last_errmsg();
    cr_assert(strstr(msg, "matmul") && strstr(msg, "device 5") && strstr(msg, "2 devices"), "%s",
              msg);
    cr_assert_null(pl.where);
    wf_graph_destroy(m.g);
}

Test(placement_internal_place, a_bad_rule_is_einval_naming_the_option)
{
    small m = small_make();
    input t;
    input_make(&t, (wf_node *[]){ m.x, m.w, m.h, m.r }, 4, &m.r, 1);
    t.in.device = 7;
    wf__placement pl;
    cr_assert_eq(wf__place(&t.in, &pl), WF_EINVAL);
    cr_assert(strstr(wf_last_errmsg(), "wf_session_opts.device is 7"), "%s", wf_last_errmsg());
    wf_graph_destroy(m.g);
}
