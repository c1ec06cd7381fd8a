/* tests/runtime/test_fuse.c: elementwise fusion (runtime/compile/pass_fuse.c) through the public
 * API: a 5-op chain with broadcasting becomes one fused node (statistics and both dumps say so)
 * whose results are bitwise those of the same session with WF_SESSION_NO_FUSE, for f32 and
 * f64, sizes 1, 7, 1000 and 100003 (split across the workers), a non-contiguous fed input, on
 * 1- and 2-worker runtimes; random elementwise graphs (broadcasting, comparisons, where,
 * casts, activation gradients) fetched at interior nodes too, an MLP's wf_gradients() and an
 * MLP trained with Adam give the same bits with the pass on and off. A node read outside the
 * group, a fetched node and a node an update is ordered after (a control edge) are never
 * folded into a group's interior. Fusion does not reorder floating-point work (each member
 * runs its own loop and rounds to its dtype), so bitwise equality is the right check. */
#include "runtime_util.h"

#include <weft/weft.h>

#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

TestSuite(runtime_fuse, .init = wf_test_rt_setup_both, .fini = wf_test_rt_teardown,
          .timeout = WF_TEST_TIMEOUT(240));

/* A contiguous tensor of 'shape' with values in [lo, hi) (f32 or f64). */
static wf_tensor *rand_tensor(wf_dtype dt, wf_shape shape, uint64_t seed, double lo, double hi)
{
    int64_t n = wf_shape_numel(shape);
    double *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    uint64_t st = seed * 0x9e3779b97f4a7c15ull + 7;
    for (int64_t i = 0; i < n; i++)
        v[i] = lo + (hi - lo) * (double)wf_test_rand_below(&st, 1000003) / 1000003.0;
    wf_tensor *t64 = wf_tensor_from(WF_F64, shape, v), *t = NULL;
    cr_assert_not_null(t64, "%s", wf_last_errmsg());
    if (dt == WF_F64) {
        t = t64;
    } else {
        cr_assert_eq(wf_tensor_create(dt, shape, NULL, &t), 0);
        cr_assert_eq(
            wf_tensor_read(t64, dt, (void *)wf_tensor_data(t), (size_t)n * wf_dtype_size(dt)), 0);
        wf_tensor_release(t64);
    }
    free(v);
    return t;
}

static char *dump_to_string(wf_session *s, wf_node *fetch, int format)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    cr_assert_not_null(f);
    int rc = wf_session_dump(s, &fetch, 1, NULL, 0, f, format);
    cr_assert_eq(rc, 0, "%s: %s", wf_err_name(rc), wf_last_errmsg());
    fclose(f);
    return buf;
}

/* ---- A 5-op chain ------------------------------------------------------------------------ */

/* relu(tanh(x * w + b) - x) over x [n] or [rows, cols] (fed transposed: a strided view), w of
 * x's shape, b a row of x's last axis; with 'flags', on 'r'; the result (owned). */
static wf_tensor *chain5(wf_runtime *r, wf_dtype dt, wf_shape shape, bool strided, uint32_t flags,
                         bool check_stats)
{
    wf_graph *g = wf_graph_create(r, WF_STATIC);
    wf_shape row = WF_SHAPE(shape.dims[shape.rank - 1]);
    wf_node *x = wf_placeholder(g, "x", dt, shape);
    wf_node *w = wf_placeholder(g, "w", dt, shape);
    wf_node *b = wf_placeholder(g, "b", dt, row);
    wf_node *y = wf_relu(g, wf_sub(g, wf_tanh(g, wf_add(g, wf_mul(g, x, w), b)), x));
    cr_assert_not_null(y, "%s", wf_graph_errmsg(g));
    wf_tensor *xt = rand_tensor(dt, shape, 1, -2, 2), *wt = rand_tensor(dt, shape, 2, -2, 2);
    wf_tensor *bt = rand_tensor(dt, row, 3, -1, 1), *xv = NULL;
    if (strided) { /* x's values read column-major from a [cols, rows] buffer */
        int64_t rows = shape.dims[0], cols = shape.dims[1];
        wf_tensor *back = rand_tensor(dt, WF_SHAPE(cols, rows), 4, -2, 2);
        int64_t strides[2] = { 1, rows };
        cr_assert_eq(wf_tensor_view(dt, shape, strides, wf_tensor_data(back), &xv), 0, "%s",
                     wf_last_errmsg());
        wf_tensor_release(xt);
        xt = xv;
        xv = back;
    }
    wf_session *s = wf_test_session(g, flags);
    if (check_stats && !(flags & WF_SESSION_NO_FUSE)) {
        wf_plan_stats st = wf_test_plan_stats(s, &y, 1);
        cr_assert_eq(st.n_fused, 1);
        cr_assert_eq(st.n_fused_members, 5);
        cr_assert_eq(st.nodes_after_fuse, 4, "x, w, b and the fused node (%d)",
                     st.nodes_after_fuse);
        char *text = dump_to_string(s, y, WF_DUMP_TEXT);
        cr_assert(strstr(text, "fused(mul, add, tanh, sub, relu)"), "%s", text);
        cr_assert(strstr(text, "fused_elementwise(") && !strstr(text, "= tanh("), "%s", text);
        cr_assert(strstr(text, "# fuse: 4 nodes after, 1 fused nodes of 5 members"), "%s", text);
        free(text);
        char *dot = dump_to_string(s, y, WF_DUMP_DOT);
        cr_assert(strstr(dot, "\\nfused(mul, add, tanh, sub, relu)"), "%s", dot);
        free(dot);
    }
    wf_feed feeds[3] = { { x, xt }, { w, wt }, { b, bt } };
    wf_tensor *out = NULL;
    wf_test_run(s, feeds, 3, &y, 1, &out, NULL, 0);
    wf_session_destroy(s);
    wf_graph_destroy(g);
    wf_tensor_release(xt);
    wf_tensor_release(xv);
    wf_tensor_release(wt);
    wf_tensor_release(bt);
    return out;
}

Test(runtime_fuse, a_five_op_chain_becomes_one_fused_node_with_the_unfused_bits)
{
    const wf_dtype dts[2] = { WF_F32, WF_F64 };

    struct {
        wf_shape shape;
        bool strided;
    } cases[] = {
        { WF_SHAPE(1), false },      { WF_SHAPE(7), false },      { WF_SHAPE(10, 100), false },
        { WF_SHAPE(10, 100), true }, { WF_SHAPE(100003), false }, { WF_SHAPE(331, 307), true },
    };

    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int d = 0; d < 2; d++) {
            wf_tensor *want =
                chain5(rt, dts[d], cases[i].shape, cases[i].strided, WF_SESSION_NO_FUSE, false);
            wf_runtime *rts[2] = { rt1, rt };
            for (int k = 0; k < 2; k++) {
                wf_tensor *got = chain5(rts[k], dts[d], cases[i].shape, cases[i].strided, 0, true);
                cr_assert(wf_test_same_bits(got, want), "case %zu, %s, %d worker(s): bits differ",
                          i, wf_dtype_name(dts[d]), k + 1);
                wf_tensor_release(got);
            }
            wf_tensor_release(want);
        }
}

/* ---- Random elementwise graphs ---------------------------------------------------------- */

enum { RG_R = 9, RG_C = 13, RG_OPS = 40, RG_FETCH = 5 };

typedef wf_test_rgraph rgraph;

/* Placeholders [R, C], [C] and [R, 1] (f32) and random elementwise ops over them and over
 * earlier results: unary math, activations, binary ops with broadcasting, comparisons and
 * where, casts through f64 and i32, activation gradients, a reduction now and then (a reader
 * outside any group). Fetches the last results and two interior ones. */
static void random_graph(rgraph *r, uint64_t seed)
{
    uint64_t st = seed * 0x2545f4914f6cdd1dull + 3;
    wf_graph *g = r->g = wf_graph_create(rt, WF_STATIC);
    const wf_shape shapes[3] = { WF_SHAPE(RG_R, RG_C), WF_SHAPE(RG_C), WF_SHAPE(RG_R, 1) };
    wf_node *pool[RG_OPS + 8];
    int n = 0;
    r->n_ph = 3;
    for (int i = 0; i < 3; i++) {
        char name[8];
        snprintf(name, sizeof name, "p%d", i);
        pool[n++] = r->ph[i] = wf_placeholder(g, name, WF_F32, shapes[i]);
        r->feed[i] = rand_tensor(WF_F32, shapes[i], seed * 3 + (uint64_t)i, -2, 2);
    }
    pool[n++] = wf_scalar(g, WF_F32, 0.5);
    for (int i = 0; i < RG_OPS; i++) {
        wf_node *a = pool[wf_test_rand_below(&st, (uint64_t)n)];
        wf_node *b = pool[n - 1 - (int)wf_test_rand_below(&st, (uint64_t)(n < 4 ? n : 4))];
        wf_node *o = NULL;
        switch (wf_test_rand_below(&st, 16)) {
        case 0:
            o = wf_add(g, a, b);
            break;
        case 1:
            o = wf_mul(g, a, b);
            break;
        case 2:
            o = wf_sub(g, a, b);
            break;
        case 3:
            o = wf_div(g, a, wf_add(g, wf_abs(g, b), wf_scalar(g, WF_F32, 1.0)));
            break;
        case 4:
            o = wf_tanh(g, a);
            break;
        case 5:
            o = wf_gelu(g, a, wf_test_rand_below(&st, 2) == 0);
            break;
        case 6:
            o = wf_sigmoid(g, wf_exp(g, wf_neg(g, wf_square(g, a))));
            break;
        case 7:
            o = wf_where(g, wf_lt(g, a, b), a, wf_maximum(g, a, b));
            break;
        case 8:
            o = wf_cast(g, wf_sqrt(g, wf_cast(g, wf_abs(g, a), WF_F64)), WF_F32);
            break;
        case 9:
            o = wf_mul(
                g, wf_cast(g, wf_cast(g, wf_mul(g, a, wf_scalar(g, WF_F32, 8)), WF_I32), WF_F32),
                b);
            break;
        case 10:
            o = wf_leaky_relu(g, a, 0.2);
            break;
        case 11:
            if (wf_shape_equal(wf_node_shape(a), wf_node_shape(b)))
                o = wf_activation_grad(g, WF_ACT_TANH, wf_tanh(g, a), b, 0);
            else
                o = wf_silu(g, wf_minimum(g, a, b));
            break;
        case 12:
            o = wf_add(g, a, wf_sum(g, wf_relu(g, b)));
            break;
        case 13:
            o = wf_sign(g, wf_sub(g, a, b));
            break;
        case 14:
            o = wf_rsqrt(g, wf_add(g, wf_square(g, a), wf_scalar(g, WF_F32, 1.0)));
            break;
        default:
            o = wf_log(g, wf_add(g, wf_exp(g, a), wf_exp(g, b)));
            break;
        }
        cr_assert_not_null(o, "seed %llu: %s", (unsigned long long)seed, wf_graph_errmsg(g));
        pool[n++] = o;
    }
    r->fetch[0] = pool[n - 1];
    r->fetch[1] = pool[n - 2];
    r->fetch[2] = wf_sum(g, pool[n - 3]);
    r->fetch[3] = pool[3 + RG_OPS / 2]; /* interior nodes, fetched */
    r->fetch[4] = pool[3 + RG_OPS / 3];
    cr_assert_not_null(r->fetch[2], "%s", wf_graph_errmsg(g));
}

Test(runtime_fuse, random_elementwise_graphs_give_the_same_bits_with_fusion_on_and_off)
{
    long n = wf_test_scaled(60, 15);
    int fused = 0, members = 0;
    for (long seed = 1; seed <= n; seed++) {
        rgraph r;
        random_graph(&r, (uint64_t)seed);
        wf_feed feeds[3] = { { r.ph[0], r.feed[0] },
                             { r.ph[1], r.feed[1] },
                             { r.ph[2], r.feed[2] } };
        wf_session *off = wf_test_session(r.g, WF_SESSION_NO_FUSE), *on = wf_test_session(r.g, 0);
        wf_tensor *want[RG_FETCH], *got[RG_FETCH];
        wf_test_run(off, feeds, 3, r.fetch, RG_FETCH, want, NULL, 0);
        for (int rep = 0; rep < 2; rep++) {
            wf_test_run(on, feeds, 3, r.fetch, RG_FETCH, got, NULL, 0);
            for (int k = 0; k < RG_FETCH; k++) {
                cr_assert(wf_test_same_bits(got[k], want[k]), "seed %ld, output %d differs", seed,
                          k);
                wf_tensor_release(got[k]);
            }
        }
        wf_plan_stats st = wf_test_plan_stats(on, r.fetch, RG_FETCH);
        cr_assert_leq(st.nodes_after_fuse, st.nodes_after_simplify);
        cr_assert_eq(st.nodes_after_simplify - st.nodes_after_fuse, st.n_fused_members - st.n_fused,
                     "seed %ld: each group of k nodes is 1", seed);
        fused += st.n_fused;
        members += st.n_fused_members;
        for (int k = 0; k < RG_FETCH; k++)
            wf_tensor_release(want[k]);
        wf_session_destroy(on);
        wf_session_destroy(off);
        wf_test_rg_free(&r);
    }
    cr_assert_gt(fused, n, "fused %d groups of %d members in %ld graphs", fused, members, n);
}

/* ---- Groups that must stop ---------------------------------------------------------------- */

Test(runtime_fuse, outside_readers_and_fetched_nodes_stay_outside_a_group)
{
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(4, 5));
    wf_node *y = wf_placeholder(g, "y", WF_F32, WF_SHAPE(5));
    wf_node *t = wf_tanh(g, wf_mul(g, x, y));                          /* read twice below */
    wf_node *u = wf_relu(g, wf_add(g, t, wf_scalar(g, WF_F32, 0.25))); /* group 2 */
    wf_node *v = wf_sum(g, t);                                         /* outside reader */
    wf_node *fetch[2] = { u, v };
    wf_node *fetch3[3] = { u, t, wf_mul(g, x, y) };
    wf_node *lone = wf_exp(g, x);
    wf_tensor *xt = rand_tensor(WF_F32, WF_SHAPE(4, 5), 1, -2, 2);
    wf_tensor *yt = rand_tensor(WF_F32, WF_SHAPE(5), 2, -2, 2);
    wf_feed feeds[2] = { { x, xt }, { y, yt } };
    wf_session *on = wf_test_session(g, 0), *off = wf_test_session(g, WF_SESSION_NO_FUSE);
    wf_plan_stats st = wf_test_plan_stats(on, fetch, 2);
    cr_assert_eq(st.n_fused, 2, "{mul, tanh} and {add, relu}: tanh has a reader outside");
    cr_assert_eq(st.n_fused_members, 4);
    wf_tensor *got[2], *want[2];
    wf_test_run(on, feeds, 2, fetch, 2, got, NULL, 0);
    wf_test_run(off, feeds, 2, fetch, 2, want, NULL, 0);
    for (int k = 0; k < 2; k++) {
        cr_assert(wf_test_same_bits(got[k], want[k]), "output %d", k);
        wf_tensor_release(got[k]);
        wf_tensor_release(want[k]);
    }
    /* 't' fetched too: it is computed (a group root), and u's group starts after it */
    st = wf_test_plan_stats(on, fetch3, 3);
    cr_assert_eq(st.n_fused, 1, "only {add, relu}: tanh and mul are fetched");
    wf_tensor *got3[3], *want3[3];
    wf_test_run(on, feeds, 2, fetch3, 3, got3, NULL, 0);
    wf_test_run(off, feeds, 2, fetch3, 3, want3, NULL, 0);
    for (int k = 0; k < 3; k++) {
        cr_assert(wf_test_same_bits(got3[k], want3[k]), "output %d", k);
        wf_tensor_release(got3[k]);
        wf_tensor_release(want3[k]);
    }
    /* one node alone is never "fused" */
    st = wf_test_plan_stats(on, &lone, 1);
    cr_assert_eq(st.n_fused, 0);
    wf_session_destroy(on);
    wf_session_destroy(off);
    wf_tensor_release(xt);
    wf_tensor_release(yt);
    wf_graph_destroy(g);
}

/* ---- Gradients and training -------------------------------------------------------------- */

/* An MLP [B, 6] -> 16 (gelu) -> 16 (tanh) -> 3 with a softmax cross-entropy loss and an L2
 * term that reads the first weight elementwise (square(w1): an update is ordered after that
 * reader, so it must stay a node of its own). 'step' (may be NULL) is an Adam step. */
typedef struct mlp {
    wf_graph *g;
    wf_node *x, *y, *w[3], *loss, *grads[3], *step;
} mlp;

static void mlp_build(mlp *m, bool train)
{
    wf_graph *g = m->g = wf_graph_create(rt, WF_STATIC);
    m->x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(-1, 6));
    m->y = wf_placeholder(g, "y", WF_I32, WF_SHAPE(-1));
    m->w[0] = wf_variable(g, "w1", WF_F32, WF_SHAPE(6, 16), wf_init_glorot_uniform(1));
    m->w[1] = wf_variable(g, "w2", WF_F32, WF_SHAPE(16, 16), wf_init_glorot_uniform(2));
    m->w[2] = wf_variable(g, "w3", WF_F32, WF_SHAPE(16, 3), wf_init_glorot_uniform(3));
    wf_node *b1 = wf_variable(g, "b1", WF_F32, WF_SHAPE(16), wf_init_zeros());
    wf_node *h = wf_gelu(g, wf_add(g, wf_matmul(g, m->x, m->w[0]), b1), true);
    h = wf_mul(g, wf_tanh(g, wf_matmul(g, h, m->w[1])), wf_scalar(g, WF_F32, 1.5));
    wf_node *logits = wf_matmul(g, h, m->w[2]);
    wf_node *l2 = wf_mul(g, wf_sum(g, wf_square(g, m->w[0])), wf_scalar(g, WF_F32, 1e-3));
    m->loss = wf_add(g, wf_mean(g, wf_softmax_cross_entropy(g, logits, m->y)), l2);
    cr_assert_not_null(m->loss, "%s", wf_graph_errmsg(g));
    m->step = NULL;
    if (train) {
        m->step = wf_minimize(g, wf_adam(0.02), m->loss);
        cr_assert_not_null(m->step, "%s", wf_graph_errmsg(g));
    } else {
        cr_assert_eq(wf_gradients(g, m->loss, m->w, 3, m->grads), 0, "%s", wf_graph_errmsg(g));
    }
}

static void batch(uint64_t *st, wf_tensor **xt, wf_tensor **yt)
{
    enum { B = 32 };

    float xd[B * 6];
    int32_t yd[B];
    for (int k = 0; k < B * 6; k++)
        xd[k] = (float)((double)wf_test_rand_below(st, 2000) / 1000.0 - 1.0);
    for (int k = 0; k < B; k++)
        yd[k] = (int32_t)wf_test_rand_below(st, 3);
    *xt = wf_tensor_from(WF_F32, WF_SHAPE(B, 6), xd);
    *yt = wf_tensor_from(WF_I32, WF_SHAPE(B), yd);
}

Test(runtime_fuse, an_mlps_gradients_give_the_same_bits_with_fusion_on_and_off)
{
    mlp m;
    mlp_build(&m, false);
    uint64_t st = 5;
    wf_tensor *xt, *yt;
    batch(&st, &xt, &yt);
    wf_feed feeds[2] = { { m.x, xt }, { m.y, yt } };
    wf_node *fetch[4] = { m.loss, m.grads[0], m.grads[1], m.grads[2] };
    wf_session *on = wf_test_session(m.g, 0), *off = wf_test_session(m.g, WF_SESSION_NO_FUSE);
    wf_plan_stats ps = wf_test_plan_stats(on, fetch, 4);
    cr_assert_gt(ps.n_fused, 0, "the backward of tanh * 1.5 and of gelu has chains to fuse");
    wf_tensor *got[4], *want[4];
    wf_test_run(on, feeds, 2, fetch, 4, got, NULL, 0);
    wf_test_run(off, feeds, 2, fetch, 4, want, NULL, 0);
    for (int k = 0; k < 4; k++) {
        cr_assert(wf_test_same_bits(got[k], want[k]), "output %d differs", k);
        wf_tensor_release(got[k]);
        wf_tensor_release(want[k]);
    }
    wf_session_destroy(on);
    wf_session_destroy(off);
    wf_tensor_release(xt);
    wf_tensor_release(yt);
    wf_graph_destroy(m.g);
}

/* Trains the MLP for 'steps' Adam steps with 'flags'; the losses and variables (owned). */
static void train(uint32_t flags, int steps, double *losses, wf_tensor **vals)
{
    mlp m;
    mlp_build(&m, true);
    wf_session *s = wf_test_session(m.g, flags);
    for (int it = 0; it < steps; it++) {
        wf_tensor *xt, *yt, *l;
        uint64_t st = 77; /* one batch, so the loss falls step by step */
        batch(&st, &xt, &yt);
        wf_feed feeds[2] = { { m.x, xt }, { m.y, yt } };
        wf_test_run(s, feeds, 2, &m.loss, 1, &l, &m.step, 1);
        losses[it] = wf_tensor_data_f32(l)[0];
        wf_tensor_release(l);
        wf_tensor_release(xt);
        wf_tensor_release(yt);
    }
    if (!(flags & WF_SESSION_NO_FUSE)) {
        wf_plan_stats ps;
        cr_assert_eq(wf_session_stats(s, &ps), 0);
        cr_assert_gt(ps.n_fused, 0);
        char *text = dump_to_string(s, m.loss, WF_DUMP_TEXT);
        cr_assert(strstr(text, "= square(%"), "square(w1) stays (an update follows it):\n%s", text);
        free(text);
    }
    for (int k = 0; k < 3; k++)
        cr_assert_eq(wf_session_variable(s, m.w[k], &vals[k]), 0);
    wf_session_destroy(s);
    wf_graph_destroy(m.g);
}

Test(runtime_fuse, adam_training_gives_the_same_bits_with_fusion_on_and_off)
{
    enum { STEPS = 5 };

    double want_loss[STEPS], loss[STEPS];
    wf_tensor *want[3], *got[3];
    train(WF_SESSION_NO_FUSE, STEPS, want_loss, want);
    train(0, STEPS, loss, got);
    for (int it = 0; it < STEPS; it++)
        cr_assert_eq(loss[it], want_loss[it], "step %d", it);
    for (int k = 0; k < 3; k++) {
        cr_assert(wf_test_same_bits(got[k], want[k]), "variable %d differs", k);
        wf_tensor_release(got[k]);
        wf_tensor_release(want[k]);
    }
    cr_assert_lt(want_loss[STEPS - 1], want_loss[0], "training did not learn");
}
