/* tests/runtime/test_passes.c: the compile passes of sessions (constant folding, common
 * subexpression elimination, algebraic simplification) through the public API: each pass
 * does its job on a graph built to need it (node counts from wf_session_plan_stats()), never
 * folds or merges stateful nodes (dropout, optimizer updates), never lets a variable gain a
 * reader, keeps only exact identities (x + (+0.0) stays), and changes no result bit: random
 * graphs of elementwise, reduction, matmul and shape ops over constants, placeholders and
 * variables, with their wf_gradients() and with several wf_minimize() training steps, give
 * identical bits with every pass on, each pass off, and all off. The passes do not reorder
 * floating-point work (runtime/compile/passes.h), so bitwise equality is the right check. Also the
 * graph and plan dumps (text and DOT), the statistics, bad flags, and concurrent runs. */
#include "runtime_util.h"

#include <weft/weft.h>

#include <criterion/criterion.h>

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

TestSuite(runtime_passes, .init = wf_test_rt_setup, .fini = wf_test_rt_teardown,
          .timeout = WF_TEST_TIMEOUT(240));

/* ---- Each pass does its job ------------------------------------------------------------ */

Test(runtime_passes, folding_replaces_a_constant_subgraph_by_one_constant)
{
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    const float a[6] = { 1, 2, 3, 4, 5, 6 }, b[3] = { 0.5f, -1, 2 };
    wf_node *ca = wf_test_const_f32(g, WF_SHAPE(2, 3), a),
            *cb = wf_test_const_f32(g, WF_SHAPE(3), b);
    /* exp(reshape(transpose(a)) * b): five nodes of constants only. */
    int perm[2] = { 1, 0 };
    wf_node *k =
        wf_exp(g, wf_mul(g, wf_reshape(g, wf_transpose(g, ca, perm, 2), WF_SHAPE(2, 3)), cb));
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(-1, 3));
    wf_node *y = wf_add(g, x, k);
    cr_assert_not_null(y, "%s", wf_graph_errmsg(g));
    wf_session *on = wf_test_session(g, 0), *off = wf_test_session(g, WF_SESSION_NO_PASSES);
    wf_plan_stats st = wf_test_plan_stats(on, &y, 1);
    cr_assert_eq(st.nodes_after_prune, 8, "needed: a, b, transpose, reshape, mul, exp, x, add");
    cr_assert_eq(st.nodes_after_fold, 3, "x, the folded constant and add; got %d",
                 st.nodes_after_fold);
    cr_assert_eq(st.nodes_after_simplify, 3);
    cr_assert_geq(st.n_folded, 4);
    cr_assert_eq(wf_test_plan_stats(off, &y, 1).nodes_after_simplify, 8);
    const float xs[6] = { 0.25f, -3, 7, 1e-3f, 0, -0.0f };
    wf_tensor *xt = wf_test_f32(WF_SHAPE(2, 3), xs), *r1, *r2;
    wf_feed feed = { x, xt };
    for (int rep = 0; rep < 2; rep++) { /* the second run replays the plan */
        wf_test_run(on, &feed, 1, &y, 1, &r1, NULL, 0);
        wf_test_run(off, &feed, 1, &y, 1, &r2, NULL, 0);
        cr_assert(wf_test_same_bits(r1, r2), "folded and unfolded results differ");
        wf_tensor_release(r1);
        wf_tensor_release(r2);
    }
    wf_plan_stats latest;
    cr_assert_eq(wf_session_stats(on, &latest), 0);
    cr_assert_eq(latest.nodes_after_fold, 3);
    cr_assert_eq(latest.n_plans, 1);
    wf_tensor_release(xt);
    wf_session_destroy(on);
    wf_session_destroy(off);
    wf_graph_destroy(g);
}

Test(runtime_passes, folding_uses_shapes_known_statically_and_caps_the_size)
{
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    /* The gradient of mean(v) spreads a constant seed over v's static shape: it does not
     * depend on v's value, so it folds although v is a variable. */
    wf_node *v = wf_variable(g, "v", WF_F32, WF_SHAPE(3, 4), wf_init_uniform(3, -1, 1));
    wf_node *loss = wf_mean(g, v), *grad = NULL;
    cr_assert_eq(wf_gradients(g, loss, &v, 1, &grad), 0, "%s", wf_graph_errmsg(g));
    /* A broadcast of a scalar to 2^21 elements is above the cap: it stays a node. */
    wf_node *big = wf_broadcast_to(g, wf_scalar(g, WF_F32, 2.0), WF_SHAPE(2048, 1024));
    cr_assert_not_null(big, "%s", wf_graph_errmsg(g));
    wf_session *on = wf_test_session(g, 0), *off = wf_test_session(g, WF_SESSION_NO_PASSES);
    wf_plan_stats st = wf_test_plan_stats(on, &grad, 1);
    cr_assert_eq(st.nodes_after_simplify, 1, "the gradient is one constant, got %d nodes",
                 st.nodes_after_simplify);
    wf_tensor *r1, *r2;
    wf_test_run(on, NULL, 0, &grad, 1, &r1, NULL, 0);
    wf_test_run(off, NULL, 0, &grad, 1, &r2, NULL, 0);
    cr_assert(wf_test_same_bits(r1, r2));
    cr_assert_float_eq(wf_tensor_data_f32(r1)[5], 1.0f / 12, 1e-7);
    wf_tensor_release(r1);
    wf_tensor_release(r2);
    st = wf_test_plan_stats(on, &big, 1);
    cr_assert_eq(st.n_folded, 0);
    cr_assert_eq(st.nodes_after_simplify, 2, "the scalar and the broadcast");
    wf_session_destroy(on);
    wf_session_destroy(off);
    wf_graph_destroy(g);
}

Test(runtime_passes, a_node_with_many_constant_inputs_folds_too)
{
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *parts[6];
    for (int i = 0; i < 6; i++) {
        const float d[2] = { (float)i, (float)i + 0.5f };
        parts[i] = wf_test_const_f32(g, WF_SHAPE(2), d);
    }
    wf_node *cat = wf_concat(g, parts, 6, 0);
    cr_assert_not_null(cat, "%s", wf_graph_errmsg(g));
    wf_session *on = wf_test_session(g, 0);
    wf_plan_stats st = wf_test_plan_stats(on, &cat, 1);
    cr_assert_eq(st.nodes_after_prune, 7);
    cr_assert_eq(st.nodes_after_fold, 1);
    wf_tensor *r;
    wf_test_run(on, NULL, 0, &cat, 1, &r, NULL, 0);
    cr_assert_eq(wf_tensor_numel(r), 12);
    cr_assert_eq(wf_tensor_data_f32(r)[11], 5.5f);
    wf_tensor_release(r);
    wf_session_destroy(on);
    wf_graph_destroy(g);
}

Test(runtime_passes, a_constant_node_whose_kernel_fails_is_not_folded_and_fails_the_run)
{
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    const float p[3] = { 1, 2, 3 };
    const int32_t idx[2] = { 0, 7 }; /* 7 is out of range: only the kernel can tell */
    wf_tensor *it = wf_tensor_from(WF_I32, WF_SHAPE(2), idx);
    wf_node *gi = wf_constant(g, it);
    wf_tensor_release(it);
    wf_node *bad = wf_exp(g, wf_gather(g, wf_test_const_f32(g, WF_SHAPE(3), p), gi, 0));
    cr_assert_not_null(bad, "%s", wf_graph_errmsg(g));
    wf_session *on = wf_test_session(g, 0);
    wf_plan_stats st = wf_test_plan_stats(on, &bad, 1);
    cr_assert_eq(st.n_folded, 0);
    wf_tensor *r = NULL;
    int rc = wf_session_run(on, NULL, 0, &bad, 1, &r, NULL, 0);
    cr_assert_lt(rc, 0);
    cr_assert_null(r);
    cr_assert(strstr(wf_session_errmsg(on), "gather") &&
                  strstr(wf_session_errmsg(on), "test_passes.c:"),
              "%s", wf_session_errmsg(on));
    wf_session_destroy(on);
    wf_graph_destroy(g);
}

Test(runtime_passes, cse_merges_duplicate_subexpressions_into_one_node)
{
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(-1, 4));
    wf_node *y = wf_placeholder(g, "y", WF_F32, WF_SHAPE(-1, 4));
    wf_node *t1 = wf_tanh(g, wf_add(g, x, y)), *t2 = wf_tanh(g, wf_add(g, x, y));
    int axis = 1;
    wf_node *s1 = wf_reduce_sum(g, t1, &axis, 1, true), *s2 = wf_reduce_sum(g, t2, &axis, 1, true);
    wf_node *out = wf_mul(g, wf_mul(g, t1, t2), wf_sub(g, s1, s2));
    cr_assert_not_null(out, "%s", wf_graph_errmsg(g));
    wf_session *on = wf_test_session(g, 0), *off = wf_test_session(g, WF_SESSION_NO_PASSES);
    wf_plan_stats st = wf_test_plan_stats(on, &out, 1);
    cr_assert_eq(st.nodes_after_prune, 11);
    cr_assert_eq(st.n_merged, 3, "add, tanh and sum merge; got %d", st.n_merged);
    cr_assert_eq(st.nodes_after_cse, 8);
    float xs[8], ys[8];
    for (int i = 0; i < 8; i++) {
        xs[i] = (float)i / 3 - 1;
        ys[i] = (float)(7 - i) / 5;
    }
    wf_tensor *xt = wf_test_f32(WF_SHAPE(2, 4), xs), *yt = wf_test_f32(WF_SHAPE(2, 4), ys), *r1,
              *r2;
    wf_feed feeds[2] = { { x, xt }, { y, yt } };
    wf_test_run(on, feeds, 2, &out, 1, &r1, NULL, 0);
    wf_test_run(off, feeds, 2, &out, 1, &r2, NULL, 0);
    cr_assert(wf_test_same_bits(r1, r2));
    wf_tensor_release(r1);
    wf_tensor_release(r2);
    wf_tensor_release(xt);
    wf_tensor_release(yt);
    wf_session_destroy(on);
    wf_session_destroy(off);
    wf_graph_destroy(g);
}

Test(runtime_passes, simplify_removes_mul_by_one_neg_neg_and_a_double_transpose)
{
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(-1, 3));
    const float ones[3] = { 1, 1, 1 };
    wf_node *one = wf_test_const_f32(g, WF_SHAPE(3), ones);
    int perm[2] = { 1, 0 };
    wf_node *y = wf_mul(g, one, wf_neg(g, wf_neg(g, wf_div(g, x, wf_scalar(g, WF_F32, 1.0)))));
    wf_node *z = wf_transpose(g, wf_transpose(g, y, perm, 2), perm, 2);
    cr_assert_not_null(z, "%s", wf_graph_errmsg(g));
    wf_session *on = wf_test_session(g, 0), *off = wf_test_session(g, WF_SESSION_NO_PASSES);
    wf_plan_stats st = wf_test_plan_stats(on, &z, 1);
    cr_assert_eq(st.nodes_after_simplify, 1, "only x is left, got %d", st.nodes_after_simplify);
    cr_assert_eq(wf_test_plan_stats(off, &z, 1).nodes_after_simplify, 9);
    const float xs[6] = { 1.5f, -0.0f, NAN, INFINITY, -2e-40f, 3 };
    wf_tensor *xt = wf_test_f32(WF_SHAPE(2, 3), xs), *r1, *r2;
    wf_feed feed = { x, xt };
    wf_test_run(on, &feed, 1, &z, 1, &r1, NULL, 0);
    wf_test_run(off, &feed, 1, &z, 1, &r2, NULL, 0);
    cr_assert(wf_test_same_bits(r1, r2));
    cr_assert(wf_test_same_bits(r1, xt));
    wf_tensor_release(r1);
    wf_tensor_release(r2);
    wf_tensor_release(xt);
    wf_session_destroy(on);
    wf_session_destroy(off);
    wf_graph_destroy(g);
}

Test(runtime_passes, simplify_keeps_what_is_not_exact_or_changes_the_shape)
{
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(4));
    const float ones[8] = { 1, 1, 1, 1, 1, 1, 1, 1 };
    /* x + (+0.0) turns -0.0 into +0.0: kept. x * ones[2, 4] broadcasts: kept. */
    wf_node *p = wf_add(g, x, wf_scalar(g, WF_F32, 0.0));
    wf_node *b = wf_mul(g, x, wf_test_const_f32(g, WF_SHAPE(2, 4), ones));
    /* x + (-0.0) and x - (+0.0) are exact: gone. */
    wf_node *m = wf_sub(g, wf_add(g, x, wf_scalar(g, WF_F32, -0.0)), wf_scalar(g, WF_F32, 0.0));
    cr_assert_not_null(m, "%s", wf_graph_errmsg(g));
    wf_node *fetch[3] = { p, b, m };
    /* Integers have one zero: i + 0 and 0 + i are exact. */
    wf_node *i = wf_placeholder(g, "i", WF_I32, WF_SHAPE(3));
    wf_node *iz = wf_add(g, wf_scalar(g, WF_I32, 0), wf_add(g, i, wf_scalar(g, WF_I32, 0)));
    cr_assert_not_null(iz, "%s", wf_graph_errmsg(g));
    wf_session *on = wf_test_session(g, WF_SESSION_NO_FOLD),
               *off = wf_test_session(g, WF_SESSION_NO_PASSES);
    cr_assert_eq(wf_test_plan_stats(on, &p, 1).nodes_after_simplify, 3);
    cr_assert_eq(wf_test_plan_stats(on, &b, 1).nodes_after_simplify, 3);
    cr_assert_eq(wf_test_plan_stats(on, &m, 1).nodes_after_simplify, 1);
    cr_assert_eq(wf_test_plan_stats(on, &iz, 1).nodes_after_simplify, 1);
    const float xs[4] = { -0.0f, 0.0f, 1, -1 };
    wf_tensor *xt = wf_test_f32(WF_SHAPE(4), xs), *r1[3], *r2[3];
    wf_feed feed = { x, xt };
    wf_test_run(on, &feed, 1, fetch, 3, r1, NULL, 0);
    wf_test_run(off, &feed, 1, fetch, 3, r2, NULL, 0);
    for (int k = 0; k < 3; k++) {
        cr_assert(wf_test_same_bits(r1[k], r2[k]), "output %d", k);
        wf_tensor_release(r1[k]);
        wf_tensor_release(r2[k]);
    }
    wf_tensor_release(xt);
    wf_session_destroy(on);
    wf_session_destroy(off);
    wf_graph_destroy(g);
}

Test(runtime_passes, reshape_chains_casts_and_sums_of_broadcasts_collapse_with_the_same_bits)
{
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(-1, 6));
    wf_node *r =
        wf_cast(g, wf_reshape(g, wf_reshape(g, x, WF_SHAPE(-1, 2, 3)), WF_SHAPE(-1, 3)), WF_F32);
    wf_node *v = wf_placeholder(g, "v", WF_F32, WF_SHAPE(5));
    int axes[2] = { 0, 2 };
    wf_node *s = wf_reduce_sum(
        g, wf_broadcast_to(g, wf_reshape(g, v, WF_SHAPE(5, 1)), WF_SHAPE(7, 5, 3)), axes, 2, false);
    cr_assert_not_null(s, "%s", wf_graph_errmsg(g));
    wf_node *fetch[2] = { r, s };
    wf_session *on = wf_test_session(g, 0), *off = wf_test_session(g, WF_SESSION_NO_PASSES);
    wf_plan_stats st = wf_test_plan_stats(on, &r, 1);
    cr_assert_eq(st.nodes_after_simplify, 2, "x and one reshape, got %d", st.nodes_after_simplify);
    st = wf_test_plan_stats(on, &s, 1);
    cr_assert_geq(st.n_simplified, 1);
    cr_assert_eq(st.nodes_after_prune, 4);
    const float xs[24] = { 1, 2, 3, 4, 5, 6, -1, -2, -3, -4, -5, -6,
                           0, 0, 0, 0, 0, 0, 9,  8,  7,  6,  5,  4 };
    /* Values whose 21-fold sum rounds, -0.0 (the sum gives -0.0, as the product), a denormal, a
     * huge value. */
    const float vs[5] = { 0.1f, -0.0f, 1.17549435e-39f, 3e37f, 16777215.0f };
    wf_tensor *xt = wf_test_f32(WF_SHAPE(4, 6), xs), *vt = wf_test_f32(WF_SHAPE(5), vs), *r1[2],
              *r2[2];
    wf_feed feeds[2] = { { x, xt }, { v, vt } };
    wf_test_run(on, feeds, 2, fetch, 2, r1, NULL, 0);
    wf_test_run(off, feeds, 2, fetch, 2, r2, NULL, 0);
    for (int k = 0; k < 2; k++) {
        cr_assert(wf_test_same_bits(r1[k], r2[k]), "output %d differs", k);
        wf_tensor_release(r1[k]);
        wf_tensor_release(r2[k]);
    }
    cr_assert_eq(wf_test_plan_stats(on, fetch, 2).nodes_after_simplify, 2 + 1 + 1 + 3,
                 "x, reshape; v, reshape, k, mul");
    wf_tensor_release(xt);
    wf_tensor_release(vt);
    wf_session_destroy(on);
    wf_session_destroy(off);
    wf_graph_destroy(g);
}

Test(runtime_passes, stateful_nodes_are_never_folded_or_merged_and_variables_gain_no_reader)
{
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    float ones[64];
    for (int i = 0; i < 64; i++)
        ones[i] = 1;
    wf_node *c = wf_test_const_f32(g, WF_SHAPE(64), ones);
    /* Two identical dropouts of a constant: each run draws new masks, and two nodes are two
     * masks. */
    wf_node *d1 = wf_dropout(g, c, 0.5, 7), *d2 = wf_dropout(g, c, 0.5, 7);
    wf_node *v = wf_variable(g, "v", WF_F32, WF_SHAPE(64), wf_init_ones());
    wf_node *vm = wf_mul(g, v, wf_scalar(g, WF_F32, 1.0)); /* v * 1 stays: see passes.h */
    wf_node *loss = wf_sum(g, wf_mul(g, vm, d1));
    wf_node *step = wf_minimize(g, wf_sgd(0.5), loss);
    cr_assert_not_null(step, "%s", wf_graph_errmsg(g));
    wf_node *fetch[3] = { d1, d2, vm };
    wf_session *on = wf_test_session(g, 0), *off = wf_test_session(g, WF_SESSION_NO_PASSES);
    wf_plan_stats a = wf_test_plan_stats(on, fetch, 3), b = wf_test_plan_stats(off, fetch, 3);
    cr_assert_eq(a.n_folded + a.n_merged + a.n_simplified, 0);
    cr_assert_eq(a.nodes_after_simplify, b.nodes_after_simplify);
    /* Training steps: v read by v*1 before its update, in both sessions, same bits; the
     * dropout draws a new mask each run, so it was not folded into a constant. */
    wf_tensor *prev = NULL;
    for (int it = 0; it < 3; it++) {
        wf_tensor *r1[3], *r2[3];
        wf_test_run(on, NULL, 0, fetch, 3, r1, &step, 1);
        wf_test_run(off, NULL, 0, fetch, 3, r2, &step, 1);
        cr_assert(!prev || !wf_test_same_bits(prev, r1[0]),
                  "step %d: the dropout mask did not change", it);
        wf_tensor_release(prev);
        prev = wf_tensor_retain(r1[0]);
        for (int k = 0; k < 3; k++) {
            cr_assert(wf_test_same_bits(r1[k], r2[k]), "step %d output %d", it, k);
            wf_tensor_release(r1[k]);
            wf_tensor_release(r2[k]);
        }
    }
    wf_tensor_release(prev);
    wf_tensor *v1, *v2;
    cr_assert_eq(wf_session_variable(on, v, &v1), 0);
    cr_assert_eq(wf_session_variable(off, v, &v2), 0);
    cr_assert(wf_test_same_bits(v1, v2));
    wf_tensor_release(v1);
    wf_tensor_release(v2);
    wf_session_destroy(on);
    wf_session_destroy(off);
    wf_graph_destroy(g);
}

/* ---- Results do not change: random graphs, gradients, training ------------------------- */

enum { RG_D = 6, RG_OPS = 32 };

static const uint32_t configs[] = { 0, WF_SESSION_NO_FOLD, WF_SESSION_NO_CSE,
                                    WF_SESSION_NO_SIMPLIFY, WF_SESSION_NO_PASSES };
#define N_CONFIGS ((int)(sizeof configs / sizeof configs[0]))
#define RG_FETCH  6

typedef wf_test_rgraph rgraph;

static wf_node *rand_const(wf_graph *g, uint64_t *st, wf_shape shape)
{
    wf_tensor *t = wf_test_rand_f32(st, shape);
    wf_node *c = wf_constant(g, t);
    wf_tensor_release(t);
    cr_assert_not_null(c, "%s", wf_graph_errmsg(g));
    return c;
}

/* A random graph over [D, D] values: constants, placeholders and variables, ops that give
 * every pass something to do (constant subgraphs, repeated subexpressions, identities on
 * placeholders and on variables, shape chains, sums of broadcasts), and the gradients of a
 * loss with respect to both variables. */
static void random_graph(rgraph *r, uint64_t seed)
{
    uint64_t st = seed * 0x9e3779b97f4a7c15ull + 1;
    wf_graph *g = r->g = wf_graph_create(rt, WF_STATIC);
    wf_node *pool[RG_OPS + 8];
    int n = 0;
    pool[n++] = rand_const(g, &st, WF_SHAPE(RG_D, RG_D));
    pool[n++] = rand_const(g, &st, WF_SHAPE(RG_D, RG_D));
    wf_test_rg_inputs(r, pool, &n, seed, RG_D, &st);
    const float ones[RG_D] = { 1, 1, 1, 1, 1, 1 };
    int perm[2] = { 1, 0 };
    for (int i = 0; i < RG_OPS; i++) {
        wf_node *a = pool[wf_test_rand_below(&st, (uint64_t)n)];
        wf_node *b = pool[wf_test_rand_below(&st, (uint64_t)n)];
        int axis = (int)wf_test_rand_below(&st, 2);
        wf_node *o = NULL;
        switch (wf_test_rand_below(&st, 17)) {
        case 0:
            o = wf_add(g, a, b);
            break;
        case 1:
            o = wf_sub(g, a, wf_mul(g, a, b));
            break;
        case 2:
            o = wf_div(g, a, wf_exp(g, b));
            break;
        case 3:
            o = wf_tanh(g, wf_matmul(g, a, b));
            break;
        case 4: /* a repeated subexpression */
            o = wf_mul(g, wf_tanh(g, wf_add(g, a, b)), wf_tanh(g, wf_add(g, a, b)));
            break;
        case 5:
            o = wf_mul(g, a, wf_test_const_f32(g, WF_SHAPE(RG_D), ones));
            break;
        case 6:
            o = wf_neg(g, wf_neg(g, wf_relu(g, a)));
            break;
        case 7:
            o = wf_transpose(g, wf_transpose(g, a, perm, 2), perm, 2);
            break;
        case 8:
            o = wf_reshape(g, wf_reshape(g, a, WF_SHAPE(RG_D * RG_D)), WF_SHAPE(RG_D, RG_D));
            break;
        case 9:
            o = wf_add(g, a, wf_reduce_sum(g, wf_sigmoid(g, b), &axis, 1, true));
            break;
        case 10: { /* a sum that undoes a broadcast */
            int zero = 0;
            wf_node *row = wf_reduce_sum(g, b, &zero, 1, false);
            wf_node *bc = wf_broadcast_to(g, row, WF_SHAPE(RG_D + 1, RG_D));
            o = wf_add(g, a, wf_reduce_sum(g, bc, &zero, 1, true));
            break;
        }
        case 11: /* a foldable constant expression */
            o = wf_add(g, a, wf_exp(g, wf_mul(g, pool[0], pool[1])));
            break;
        case 12:
            o = wf_sub(g, wf_add(g, a, wf_scalar(g, WF_F32, 0.0)), wf_scalar(g, WF_F32, 0.0));
            break;
        case 13:
            o = wf_cast(g, wf_transpose(g, a, perm, 2), WF_F32);
            break;
        case 14:
            o = wf_maximum(g, a, wf_mul(g, wf_scalar(g, WF_F32, 1.0), b));
            break;
        case 15: /* same op, same input, same shape, other attributes: never merged */
            o = wf_sub(g, wf_softmax(g, a, axis), wf_softmax(g, a, 1 - axis));
            break;
        default:
            o = wf_mul(g, a, wf_reduce_mean(g, wf_tanh(g, b), &axis, 1, true));
            break;
        }
        cr_assert_not_null(o, "seed %llu: %s", (unsigned long long)seed, wf_graph_errmsg(g));
        pool[n++] = o;
    }
    wf_node *grads[2];
    wf_node *loss = wf_test_rg_loss(r, pool, n, seed, grads);
    r->fetch[0] = pool[n - 1];
    r->fetch[1] = wf_sum(g, pool[n - 3]);
    r->fetch[2] = wf_softmax(g, pool[n - 4], 1);
    r->fetch[3] = loss;
    r->fetch[4] = grads[0];
    r->fetch[5] = grads[1];
    cr_assert_not_null(r->fetch[2], "%s", wf_graph_errmsg(g));
}

/* Runs 'r' with every configuration, twice each, and checks every output against the
 * all-off session's. */
static void check_random(uint64_t seed)
{
    rgraph r;
    random_graph(&r, seed);
    wf_feed feeds[2] = { { r.ph[0], r.feed[0] }, { r.ph[1], r.feed[1] } };
    wf_tensor *want[RG_FETCH];
    wf_session *base = wf_test_session(r.g, WF_SESSION_NO_PASSES);
    wf_test_run(base, feeds, 2, r.fetch, RG_FETCH, want, NULL, 0);
    for (int c = 0; c < N_CONFIGS - 1; c++) {
        wf_session *s = wf_test_session(r.g, configs[c]);
        for (int rep = 0; rep < 2; rep++) {
            wf_tensor *got[RG_FETCH];
            wf_test_run(s, feeds, 2, r.fetch, RG_FETCH, got, NULL, 0);
            for (int k = 0; k < RG_FETCH; k++) {
                cr_assert(wf_test_same_bits(got[k], want[k]),
                          "seed %llu, flags 0x%x, output %d differs", (unsigned long long)seed,
                          configs[c], k);
                wf_tensor_release(got[k]);
            }
        }
        wf_session_destroy(s);
    }
    for (int k = 0; k < RG_FETCH; k++)
        wf_tensor_release(want[k]);
    wf_session_destroy(base);
    wf_test_rg_free(&r);
}

Test(runtime_passes, random_graphs_and_their_gradients_give_identical_bits_with_passes_on_and_off)
{
    long n = wf_test_scaled(100, 20);
    for (long seed = 1; seed <= n; seed++)
        check_random((uint64_t)seed);
}

Test(runtime_passes, random_graphs_have_work_for_every_pass)
{
    int folded = 0, merged = 0, simplified = 0;
    for (uint64_t seed = 1; seed <= 10; seed++) {
        rgraph r;
        random_graph(&r, seed);
        wf_session *s = wf_test_session(r.g, 0);
        wf_plan_stats st = wf_test_plan_stats(s, r.fetch, RG_FETCH);
        cr_assert_leq(st.nodes_after_simplify, st.nodes_after_prune);
        folded += st.n_folded;
        merged += st.n_merged;
        simplified += st.n_simplified;
        wf_session_destroy(s);
        wf_test_rg_free(&r);
    }
    cr_assert(folded > 0 && merged > 0 && simplified > 0, "folded %d, merged %d, simplified %d",
              folded, merged, simplified);
}

/* A small MLP with a foldable constant expression and a repeated subexpression, trained with
 * 'opt' for 'steps' steps in a session with 'flags'; returns the variables' final values
 * and the losses' bits summed into '*loss_bits' (a fingerprint of every step). */
static void train(uint32_t flags, wf_optimizer opt, int steps, wf_tensor **vals, double *losses)
{
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(-1, 4));
    wf_node *y = wf_placeholder(g, "y", WF_I32, WF_SHAPE(-1));
    wf_node *w1 = wf_variable(g, "w1", WF_F32, WF_SHAPE(4, 8), wf_init_glorot_uniform(1));
    wf_node *b1 = wf_variable(g, "b1", WF_F32, WF_SHAPE(8), wf_init_zeros());
    wf_node *w2 = wf_variable(g, "w2", WF_F32, WF_SHAPE(8, 3), wf_init_glorot_uniform(2));
    const float sc[4] = { 0.5f, 1, 2, 4 };
    wf_node *scale =
        wf_exp(g, wf_mul(g, wf_test_const_f32(g, WF_SHAPE(4), sc), wf_scalar(g, WF_F32, 0.1)));
    wf_node *xs = wf_mul(g, x, scale);
    wf_node *h = wf_relu(g, wf_add(g, wf_matmul(g, xs, w1), b1));
    wf_node *h2 = wf_relu(g, wf_add(g, wf_matmul(g, xs, w1), b1)); /* the same again */
    wf_node *logits = wf_matmul(g, wf_mul(g, wf_add(g, h, h2), wf_scalar(g, WF_F32, 0.5)), w2);
    wf_node *loss = wf_mean(g, wf_softmax_cross_entropy(g, logits, y));
    wf_node *step = wf_minimize(g, opt, loss);
    cr_assert_not_null(step, "%s", wf_graph_errmsg(g));
    wf_session *s = wf_test_session(g, flags);
    uint64_t st = 99;
    for (int it = 0; it < steps; it++) {
        float xd[16 * 4];
        int32_t yd[16];
        for (int k = 0; k < 16 * 4; k++)
            xd[k] = (float)((double)wf_test_rand_below(&st, 2000) / 1000.0 - 1.0);
        for (int k = 0; k < 16; k++)
            yd[k] = (int32_t)wf_test_rand_below(&st, 3);
        wf_tensor *xt = wf_test_f32(WF_SHAPE(16, 4), xd),
                  *yt = wf_tensor_from(WF_I32, WF_SHAPE(16), yd);
        wf_feed feeds[2] = { { x, xt }, { y, yt } };
        wf_tensor *l;
        wf_test_run(s, feeds, 2, &loss, 1, &l, &step, 1);
        losses[it] = wf_tensor_data_f32(l)[0];
        wf_tensor_release(l);
        wf_tensor_release(xt);
        wf_tensor_release(yt);
    }
    if (flags == 0) {
        wf_plan_stats ps;
        cr_assert_eq(wf_session_stats(s, &ps), 0);
        cr_assert_gt(ps.n_folded, 0);
        cr_assert_gt(ps.n_merged, 0);
    }
    wf_node *vars[3] = { w1, b1, w2 };
    for (int k = 0; k < 3; k++)
        cr_assert_eq(wf_session_variable(s, vars[k], &vals[k]), 0);
    wf_session_destroy(s);
    wf_graph_destroy(g);
}

static void check_training(wf_optimizer opt)
{
    enum { STEPS = 6 };

    wf_tensor *want[3];
    double want_loss[STEPS];
    train(WF_SESSION_NO_PASSES, opt, STEPS, want, want_loss);
    for (int c = 0; c < N_CONFIGS - 1; c++) {
        wf_tensor *got[3];
        double loss[STEPS];
        train(configs[c], opt, STEPS, got, loss);
        for (int it = 0; it < STEPS; it++)
            cr_assert_eq(loss[it], want_loss[it], "flags 0x%x, step %d", configs[c], it);
        for (int k = 0; k < 3; k++) {
            cr_assert(wf_test_same_bits(got[k], want[k]), "flags 0x%x: variable %d differs",
                      configs[c], k);
            wf_tensor_release(got[k]);
        }
    }
    cr_assert_lt(want_loss[STEPS - 1], want_loss[0] + 1, "training diverged");
    for (int k = 0; k < 3; k++)
        wf_tensor_release(want[k]);
}

Test(runtime_passes, training_steps_give_the_same_variables_with_passes_on_and_off)
{
    check_training(wf_adam(0.05));
    check_training(wf_momentum(0.1, 0.9, true));
}

/* ---- Dumps, statistics, options, threads ----------------------------------------------- */

static char *dump_to_string(wf_session *s, wf_graph *g, wf_node *fetch, int format)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    cr_assert_not_null(f);
    int rc = s ? wf_session_dump(s, &fetch, 1, NULL, 0, f, format) : wf_graph_dump(g, f, format);
    cr_assert_eq(rc, 0, "%s: %s", wf_err_name(rc), wf_last_errmsg());
    fclose(f);
    return buf;
}

Test(runtime_passes, dumps_show_the_graph_and_the_plan_after_the_passes)
{
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(-1, 2));
    const float c[2] = { 1, 2 };
    wf_node *k = wf_exp(g, wf_test_const_f32(g, WF_SHAPE(2), c));
    wf_node *y = wf_mul(g, wf_tanh(g, wf_add(g, x, k)), wf_tanh(g, wf_add(g, x, k)));
    cr_assert_not_null(y, "%s", wf_graph_errmsg(g));
    /* Without elementwise fusion: it would take the merged tanh into one fused node, and the
     * "cse +1" mark with it (tests/runtime/test_fuse.c dumps fused nodes). */
    wf_session *s = wf_test_session(g, WF_SESSION_NO_FUSE);
    char *text = dump_to_string(NULL, g, y, WF_DUMP_TEXT);
    cr_assert(strstr(text, "= exp(") && strstr(text, "on cpu @ test_passes.c:"), "%s", text);
    free(text);
    text = dump_to_string(s, g, y, WF_DUMP_TEXT);
    cr_assert(strstr(text, "[folded]"), "%s", text);
    cr_assert(strstr(text, "cse +1"), "%s", text);
    cr_assert(strstr(text, "# cse: ") && strstr(text, "# folded: "), "%s", text);
    cr_assert(strstr(text, "# plan: graph 8 nodes, pruned 8"), "%s", text);
    free(text);
    char *dot = dump_to_string(s, g, y, WF_DUMP_DOT);
    cr_assert(strncmp(dot, "digraph", 7) == 0 && strstr(dot, "lightblue") && strstr(dot, "->"),
              "%s", dot);
    cr_assert_eq(dot[strlen(dot) - 2], '}');
    free(dot);
    dot = dump_to_string(NULL, g, y, WF_DUMP_DOT);
    cr_assert(strncmp(dot, "digraph", 7) == 0, "%s", dot);
    free(dot);
    cr_assert_eq(wf_graph_dump(g, stdout, 7), WF_EINVAL);
    cr_assert_eq(wf_graph_dump(NULL, stdout, WF_DUMP_TEXT), WF_EINVAL);
    cr_assert_eq(wf_session_dump(s, &y, 1, NULL, 0, NULL, WF_DUMP_TEXT), WF_EINVAL);
    wf_node *none = NULL;
    cr_assert_eq(wf_session_dump(s, &none, 1, NULL, 0, stdout, WF_DUMP_TEXT), WF_EINVAL);
    cr_assert(strstr(wf_session_errmsg(s), "wf_session_dump: fetch 0 is NULL"), "%s",
              wf_session_errmsg(s));
    wf_session_destroy(s);
    wf_graph_destroy(g);
}

Test(runtime_passes, stats_start_empty_and_bad_flags_are_refused)
{
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(2));
    cr_assert_not_null(wf_neg(g, x));
    wf_session *s = NULL;
    int rc = wf_session_create(g, &(wf_session_opts){ .flags = 1u << 9 }, &s);
    cr_assert_eq(rc, WF_EINVAL);
    cr_assert_null(s);
    cr_assert(strstr(wf_graph_errmsg(g), "unknown flags 0x200"), "%s", wf_graph_errmsg(g));
    wf_graph_destroy(g);
    g = wf_graph_create(rt, WF_STATIC);
    x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(2));
    s = wf_test_session(g, WF_SESSION_NO_PASSES);
    wf_plan_stats st;
    cr_assert_eq(wf_session_stats(s, &st), 0);
    cr_assert_eq(st.nodes_graph, 1);
    cr_assert_eq(st.n_plans + st.nodes_after_prune, 0);
    cr_assert_eq(wf_session_stats(s, NULL), WF_EINVAL);
    cr_assert_eq(wf_session_stats(NULL, &st), WF_EINVAL);
    wf_session_destroy(s);
    wf_graph_destroy(g);
}

typedef struct conc {
    wf_session *s;
    wf_node *x, *y;
    int id;
    long runs;
    _Atomic int *bad;
} conc;

static void *conc_thread(void *p)
{
    conc *c = p;
    for (long r = 0; r < c->runs; r++) {
        float xs[4];
        for (int k = 0; k < 4; k++)
            xs[k] = (float)(c->id * 100 + r + k);
        wf_tensor *xt = wf_tensor_from(WF_F32, WF_SHAPE(4), xs), *out = NULL;
        wf_feed feed = { c->x, xt };
        if (wf_session_run(c->s, &feed, 1, &c->y, 1, &out, NULL, 0) < 0) {
            atomic_fetch_add(c->bad, 1);
        } else {
            const float *o = wf_tensor_data_f32(out);
            for (int k = 0; k < 4; k++) /* y = x * 1 + (2 + 3) */
                if (o[k] != xs[k] + 5.0f)
                    atomic_fetch_add(c->bad, 1);
        }
        wf_tensor_release(out);
        wf_tensor_release(xt);
    }
    return NULL;
}

Test(runtime_passes, four_threads_compile_and_run_one_session_at_once)
{
    for (int round = 0; round < 5; round++) {
        wf_graph *g = wf_graph_create(rt, WF_STATIC);
        wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(4));
        wf_node *k = wf_add(g, wf_scalar(g, WF_F32, 2.0), wf_scalar(g, WF_F32, 3.0));
        wf_node *y = wf_add(g, wf_mul(g, x, wf_scalar(g, WF_F32, 1.0)), k);
        cr_assert_not_null(y, "%s", wf_graph_errmsg(g));
        wf_session *s = wf_test_session(g, 0);
        _Atomic int bad = 0;
        pthread_t th[4];
        conc cs[4];
        for (int i = 0; i < 4; i++) {
            cs[i] = (conc){ s, x, y, i, wf_test_scaled(200, 20), &bad };
            pthread_create(&th[i], NULL, conc_thread, &cs[i]);
        }
        for (int i = 0; i < 4; i++)
            pthread_join(th[i], NULL);
        cr_assert_eq(atomic_load(&bad), 0);
        wf_plan_stats st;
        cr_assert_eq(wf_session_stats(s, &st), 0);
        cr_assert_eq(st.n_plans, 1, "one set of fetches, one plan");
        cr_assert_eq(st.nodes_after_simplify, 3, "x, the folded 5 and add");
        wf_session_destroy(s);
        wf_graph_destroy(g);
    }
}

/* runtime.h promises that no pass changes a bit; with a strided feed, simplify's dropping a
 * copy (squeeze of nothing) handed the reduction the strided view instead of a contiguous
 * copy, and the reduction summed a strided run in another order than a contiguous one (issue
 * 18: the last bit differed). Reductions now sum in the logical order whatever the layout. */
Test(runtime_passes, a_dropped_copy_of_a_strided_feed_changes_no_bit_of_a_reduction)
{
    enum { R = 70, C = 37 }; /* 70 rows: the column path's 32- and 8-row passes and a tail */

    static double buf[2 * R * C + 8], dense[R * C];
    uint64_t st = 18;
    for (int i = 0; i < R * C; i++)
        dense[i] = (double)wf_test_rand_below(&st, 2000001) / 1e6 - 1.0 + 1e-3 * (i % 7);
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F64, WF_SHAPE(R, C));
    wf_node *sx = wf_squeeze(g, x, WF_SQUEEZE_ALL); /* no size-1 axis: a copy of x */
    int ax0 = 0, ax1 = 1;
    wf_node *f[] = { wf_sum(g, sx),
                     wf_reduce_sum(g, sx, &ax0, 1, false),
                     wf_reduce_sum(g, sx, &ax1, 1, true),
                     wf_reduce_mean(g, sx, &ax1, 1, false),
                     wf_reduce_logsumexp(g, sx, &ax1, 1, false),
                     wf_reduce_prod(g, sx, &ax0, 1, false) };

    enum { NF = sizeof f / sizeof f[0] };

    wf_session *on = wf_test_session(g, 0), *off = wf_test_session(g, WF_SESSION_NO_PASSES);
    /* layouts: contiguous, every element 2 apart, column-major (transposed) */
    const int64_t steps[3][2] = { { C, 1 }, { 2 * C, 2 }, { 1, R } };
    wf_tensor *ref[NF];
    for (int l = 0; l < 3; l++) {
        for (int i = 0; i < R; i++)
            for (int j = 0; j < C; j++)
                buf[i * steps[l][0] + j * steps[l][1]] = dense[i * C + j];
        wf_tensor *t;
        cr_assert_eq(wf_tensor_view(WF_F64, WF_SHAPE(R, C), steps[l], buf, &t), 0);
        wf_feed fd = { x, t };
        wf_tensor *a[NF], *b[NF];
        wf_test_run(on, &fd, 1, f, NF, a, NULL, 0);
        wf_test_run(off, &fd, 1, f, NF, b, NULL, 0);
        for (int k = 0; k < NF; k++) {
            cr_assert(wf_test_same_bits(a[k], b[k]), "layout %d, fetch %d: passes changed bits", l,
                      k);
            if (l == 0)
                ref[k] = wf_tensor_retain(a[k]);
            else
                cr_assert(wf_test_same_bits(a[k], ref[k]),
                          "layout %d, fetch %d: not the bits of "
                          "the contiguous feed",
                          l, k);
            wf_tensor_release(a[k]);
            wf_tensor_release(b[k]);
        }
        wf_tensor_release(t);
    }
    for (int k = 0; k < NF; k++)
        wf_tensor_release(ref[k]);
    wf_session_destroy(on);
    wf_session_destroy(off);
    wf_graph_destroy(g);
}
