/* tests/grad/test_gradients.c: what wf_gradients promises besides each op's derivative
 * (tests/grad/test_gradcheck.c has those): zeros for unconnected inputs, nothing through
 * integer paths, cast's gradient, a clear error for an op without a gradient, second
 * derivatives, backward nodes at the forward node's file:line, static graphs with -1 batch
 * dimensions giving the same bits as eager ones and for 1 and 2 workers, and the aggregation
 * and clipping helpers. */
#include "gradcheck.h"

TestSuite(gradients, .init = gc_setup, .fini = gc_teardown, .timeout = WF_TEST_TIMEOUT(60));

static wf_node *vec(wf_graph *g, int n, const double *v)
{
    return gc_const(g, WF_F64, (wf_shape){ .rank = 1, .dims = { n } }, v);
}

Test(gradients, unconnected_inputs_get_zeros_and_integer_paths_carry_nothing)
{
    wf_graph *g = wf_graph_create(rt, WF_EAGER);
    static const double a[] = { 1.5, -2.25, 3 }, b[] = { 4, 5 };
    wf_node *x = vec(g, 3, a), *z = vec(g, 2, b);
    /* y = sum(x + cast(cast(x, i32), f64)): the integer path adds nothing to dy/dx. */
    wf_node *y = wf_sum(g, wf_add(g, x, wf_cast(g, wf_cast(g, x, WF_I32), WF_F64)));
    wf_node *xs[2] = { x, z }, *gr[2];
    cr_assert_eq(wf_gradients(g, y, xs, 2, gr), 0, "%s", wf_graph_errmsg(g));
    for (int i = 0; i < 3; i++)
        cr_assert_eq(wf_tensor_get(wf_node_value(gr[0]), i), 1.0);
    cr_assert(wf_shape_equal(wf_node_shape(gr[1]), WF_SHAPE(2)));
    for (int i = 0; i < 2; i++)
        cr_assert_eq(wf_tensor_get(wf_node_value(gr[1]), i), 0.0);
    wf_graph_destroy(g);
}

Test(gradients, cast_gradient_is_cast_back)
{
    wf_graph *g = wf_graph_create(rt, WF_EAGER);
    static const double a[] = { 0.1, 0.2, 0.3 }, r[] = { 0.5, -0.25, 3.0 };
    wf_node *x = vec(g, 3, a);
    wf_node *rf = wf_cast(g, vec(g, 3, r), WF_F32);
    wf_node *y = wf_sum(g, wf_mul(g, wf_cast(g, x, WF_F32), rf));
    wf_node *gr;
    cr_assert_eq(wf_gradients(g, y, &x, 1, &gr), 0, "%s", wf_graph_errmsg(g));
    cr_assert_eq(wf_node_dtype(gr), WF_F64);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(wf_tensor_get(wf_node_value(gr), i), r[i]);
    wf_graph_destroy(g);
}

Test(gradients, an_op_without_gradient_is_an_error_naming_it)
{
    wf_graph *g = wf_graph_create(rt, WF_EAGER);
    static const double a[] = { 1, 2, 3, 4 };
    wf_node *x = gc_const(g, WF_F64, WF_SHAPE(2, 2), a);
    wf_node *dy = gc_const(g, WF_F64, WF_SHAPE(2, 2), a);
    int line = __LINE__ + 1;
    wf_node *b = wf_layer_norm_backward_input(g, x, NULL, dy, -1, 1e-5);
    wf_node *y = wf_sum(g, b), *gr = (wf_node *)1;
    cr_assert_not_null(y);
    cr_assert_eq(wf_gradients(g, y, &x, 1, &gr), WF_EINVAL);
    cr_assert_null(gr);
    char want[64];
    snprintf(want, sizeof want, "test_gradients.c:%d", line);
    const char *m = wf_graph_errmsg(g);
    cr_assert(strstr(m, "layer_norm_backward_input") && strstr(m, "has no gradient") &&
                  strstr(m, wf_node_name(b)) && strstr(m, want),
              "message: %s", m);
    wf_graph_destroy(g);
}

Test(gradients, bad_arguments)
{
    wf_graph *g = wf_graph_create(rt, WF_EAGER), *h = wf_graph_create(rt, WF_EAGER);
    static const double a[] = { 1, 2 };
    wf_node *x = vec(g, 2, a), *other = vec(h, 2, a), *gr;
    wf_node *yi = wf_cast(g, x, WF_I32);
    cr_assert_eq(wf_gradients(g, yi, &x, 1, &gr), WF_EINVAL);
    cr_assert(strstr(wf_graph_errmsg(g), "only floating values"), "%s", wf_graph_errmsg(g));
    wf_graph_clear_error(g);
    cr_assert_eq(wf_gradients(g, wf_sum(g, x), &other, 1, &gr), WF_EINVAL);
    cr_assert(strstr(wf_graph_errmsg(g), "another graph"), "%s", wf_graph_errmsg(g));
    wf_graph_clear_error(g);
    cr_assert_eq(wf_gradients(g, NULL, &x, 1, &gr), WF_EINVAL);
    cr_assert_eq(wf_gradients(NULL, x, &x, 1, &gr), WF_EINVAL);
    wf_graph_destroy(g);
    wf_graph_destroy(h);
}

Test(gradients, second_derivative)
{
    wf_graph *g = wf_graph_create(rt, WF_EAGER);
    static const double a[] = { -1.5, 0.5, 2 };
    wf_node *x = vec(g, 3, a);
    wf_node *y = wf_sum(g, wf_mul(g, wf_square(g, x), x)); /* sum x^3 */
    wf_node *g1, *g2;
    cr_assert_eq(wf_gradients(g, y, &x, 1, &g1), 0, "%s", wf_graph_errmsg(g));
    cr_assert_eq(wf_gradients(g, wf_sum(g, g1), &x, 1, &g2), 0, "%s", wf_graph_errmsg(g));
    for (int i = 0; i < 3; i++) {
        cr_assert_float_eq(wf_tensor_get(wf_node_value(g1), i), 3 * a[i] * a[i], 1e-12);
        cr_assert_float_eq(wf_tensor_get(wf_node_value(g2), i), 6 * a[i], 1e-12);
    }
    wf_graph_destroy(g);
}

Test(gradients, backward_nodes_carry_the_forward_line)
{
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(-1, 3));
    wf_node *w = wf_variable(g, "w", WF_F32, WF_SHAPE(3, 2), wf_init_ones());
    int line = __LINE__ + 1;
    wf_node *m = wf_matmul(g, x, w);
    wf_node *y = wf_sum(g, m), *gr;
    int before = wf_graph_node_count(g);
    cr_assert_eq(wf_gradients(g, y, &w, 1, &gr), 0, "%s", wf_graph_errmsg(g));
    int found = 0;
    for (int i = before; i < wf_graph_node_count(g); i++) {
        wf_node *b = wf_graph_node(g, i);
        if (strcmp(wf_node_op(b), "matmul") == 0) {
            cr_assert_eq(wf_node_line(b), line, "%s at line %d", wf_node_name(b), wf_node_line(b));
            cr_assert(strstr(wf_node_file(b), "test_gradients.c"));
            found++;
        }
    }
    cr_assert_eq(found, 1, "one backward matmul (dw = x^T dy)");
    wf_graph_destroy(g);
}

/* The gradients of a small model, computed in a static session with a -1 batch and in an
 * eager graph, for 1 and 2 workers: the same bits everywhere. */
static void model_grads(wf_runtime *r, bool eager, const float *xs, const int32_t *ys, float *out)
{
    wf_graph *g = wf_graph_create(r, eager ? WF_EAGER : WF_STATIC);
    wf_node *x, *y;
    if (eager) {
        wf_tensor *tx = wf_tensor_from(WF_F32, WF_SHAPE(16, 8), xs);
        wf_tensor *ty = wf_tensor_from(WF_I32, WF_SHAPE(16), ys);
        x = wf_constant(g, tx);
        y = wf_constant(g, ty);
        wf_tensor_release(tx);
        wf_tensor_release(ty);
    } else {
        x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(-1, 8));
        y = wf_placeholder(g, "y", WF_I32, WF_SHAPE(-1));
    }
    wf_node *w1 = wf_variable(g, "w1", WF_F32, WF_SHAPE(8, 32), wf_init_glorot_uniform(1));
    wf_node *b1 = wf_variable(g, "b1", WF_F32, WF_SHAPE(32), wf_init_uniform(2, -0.1, 0.1));
    wf_node *w2 = wf_variable(g, "w2", WF_F32, WF_SHAPE(32, 4), wf_init_glorot_uniform(3));
    wf_node *h = wf_gelu(g, wf_add(g, wf_matmul(g, x, w1), b1), false);
    wf_node *hn = wf_layer_norm(g, h, NULL, NULL, -1, 1e-5);
    wf_node *loss = wf_mean(g, wf_softmax_cross_entropy(g, wf_matmul(g, hn, w2), y));
    wf_node *vars[3] = { w1, b1, w2 }, *gr[3];
    cr_assert_eq(wf_gradients(g, loss, vars, 3, gr), 0, "%s", wf_graph_errmsg(g));
    const int sizes[3] = { 8 * 32, 32, 32 * 4 };
    wf_tensor *vals[3];
    if (eager) {
        for (int i = 0; i < 3; i++)
            vals[i] = wf_tensor_retain(wf_node_value(gr[i]));
    } else {
        wf_session *s;
        cr_assert_eq(wf_session_create(g, NULL, &s), 0, "%s", wf_graph_errmsg(g));
        wf_tensor *tx = wf_tensor_from(WF_F32, WF_SHAPE(16, 8), xs);
        wf_tensor *ty = wf_tensor_from(WF_I32, WF_SHAPE(16), ys);
        wf_feed f[2] = { { x, tx }, { y, ty } };
        cr_assert_eq(wf_session_run(s, f, 2, gr, 3, vals, NULL, 0), 0, "%s", wf_session_errmsg(s));
        wf_tensor_release(tx);
        wf_tensor_release(ty);
        wf_session_destroy(s);
    }
    for (int i = 0, o = 0; i < 3; o += sizes[i++]) {
        cr_assert_eq(wf_tensor_numel(vals[i]), sizes[i]);
        cr_assert_eq(wf_tensor_read(vals[i], WF_F32, out + o, (size_t)sizes[i] * 4), 0);
        wf_tensor_release(vals[i]);
    }
    wf_graph_destroy(g);
}

Test(gradients, static_and_eager_and_worker_counts_give_the_same_bits)
{
    float xs[16 * 8];
    int32_t ys[16];
    uint64_t st = 77;
    for (int i = 0; i < 16 * 8; i++)
        xs[i] = (float)wf_test_rand_below(&st, 2001) / 1000.0f - 1.0f;
    for (int i = 0; i < 16; i++)
        ys[i] = (int32_t)wf_test_rand_below(&st, 4);

    enum { N = 8 * 32 + 32 + 32 * 4 };

    static float ref[N], got[N];
    model_grads(rt, true, xs, ys, ref);
    double norm = 0;
    for (int i = 0; i < N; i++)
        norm += fabs(ref[i]);
    cr_assert_gt(norm, 1e-3, "the gradients should not be zero");
    wf_runtime *one = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 1, .flags = WF_RT_NO_PIN });
    wf_runtime *rts[2] = { one, rt };
    for (int k = 0; k < 2; k++) {
        model_grads(rts[k], false, xs, ys, got);
        cr_assert(memcmp(ref, got, sizeof ref) == 0, "static with %d worker(s) differs", k + 1);
        model_grads(rts[k], true, xs, ys, got);
        cr_assert(memcmp(ref, got, sizeof ref) == 0, "eager with %d worker(s) differs", k + 1);
    }
    wf_runtime_destroy(one);
}

Test(gradients, add_n_mean_n_and_clipping)
{
    wf_graph *g = wf_graph_create(rt, WF_EAGER);
    static const double a[] = { 1, 2 }, b[] = { 3, -4 }, c[] = { 0.5, 0.25 };
    wf_node *xs[3] = { vec(g, 2, a), vec(g, 2, b), vec(g, 2, c) };
    wf_node *s = wf_add_n(g, xs, 3);
    cr_assert_eq(wf_tensor_get(wf_node_value(s), 0), 4.5);
    cr_assert_eq(wf_tensor_get(wf_node_value(s), 1), -1.75);
    wf_node *m = wf_mean_n(g, xs, NULL, 3);
    cr_assert_float_eq(wf_tensor_get(wf_node_value(m), 0), 1.5, 1e-15);
    static const double wts[] = { 1, 3, 0 };
    wf_node *wm = wf_mean_n(g, xs, wts, 3);
    cr_assert_float_eq(wf_tensor_get(wf_node_value(wm), 1), (2 - 12) / 4.0, 1e-15);
    static const double zero[] = { 1, -1, 0 };
    cr_assert_null(wf_mean_n(g, xs, zero, 3));
    cr_assert(strstr(wf_graph_errmsg(g), "sum to 0"), "%s", wf_graph_errmsg(g));
    wf_graph_clear_error(g);
    /* global norm of (1, 2, 3, -4) is sqrt(30) ~ 5.48: clip to 2 scales by 2 / sqrt(30) */
    wf_node *out[2], *norm;
    cr_assert_eq(wf_clip_by_global_norm(g, xs, 2, 2.0, out, &norm), 0, "%s", wf_graph_errmsg(g));
    cr_assert_float_eq(wf_tensor_get(wf_node_value(norm), 0), sqrt(30.0), 1e-12);
    cr_assert_float_eq(wf_tensor_get(wf_node_value(out[1]), 1), -4 * 2 / sqrt(30.0), 1e-12);
    cr_assert_eq(wf_clip_by_global_norm(g, xs, 2, 100.0, out, NULL), 0);
    cr_assert_eq(wf_tensor_get(wf_node_value(out[1]), 1), -4.0, "below the clip: unchanged");
    cr_assert_eq(wf_clip_by_global_norm(g, xs, 2, -1.0, out, NULL), WF_EINVAL);
    wf_graph_destroy(g);
}

/* ---- Defects found by random graphs (issue 18) ------------------------------------------- */

/* wf_transpose takes negative perm entries (counted from the end); its gradient inverted the
 * permutation with them unnormalised, writing inv[-1] outside its array: on x [3, 1] with
 * perm {0, -1} wf_gradients failed with "perm ... [0, 22032] is not a permutation" (ASan: a
 * stack buffer overflow). */
Test(gradients, transpose_gradient_normalises_negative_perm_entries)
{
    static const struct {
        wf_shape s;
        int perm[3];
    } cs[] = { { { 2, { 3, 1 } }, { 0, -1 } },
               { { 2, { 5, 3 } }, { -1, 0 } },
               { { 3, { 2, 3, 4 } }, { -1, -3, 1 } } };

    for (int k = 0; k < 3; k++) {
        wf_graph *g = wf_graph_create(rt, WF_EAGER);
        int r = cs[k].s.rank;
        int64_t n = wf_shape_numel(cs[k].s);
        double xv[24], wv[24];
        for (int64_t i = 0; i < n; i++) {
            xv[i] = 0.5 * (double)i - 1;
            wv[i] = (double)(i * 7 % 11) - 5;
        }
        wf_node *x = gc_const(g, WF_F64, cs[k].s, xv);
        wf_node *y = wf_transpose(g, x, cs[k].perm, r);
        cr_assert_not_null(y, "case %d: %s", k, wf_graph_errmsg(g));
        wf_node *w = gc_const(g, WF_F64, wf_node_shape(y), wv);
        wf_node *loss = wf_sum(g, wf_mul(g, y, w)), *gr;
        cr_assert_eq(wf_gradients(g, loss, &x, 1, &gr), 0, "case %d: %s", k, wf_graph_errmsg(g));
        cr_assert(wf_shape_equal(wf_node_shape(gr), cs[k].s), "case %d", k);
        /* dL/dx[i] is the W element y[j] took x[i] into: y.dims[d] = x.dims[perm[d]] */
        wf_shape ys = wf_node_shape(y);
        for (int64_t j = 0; j < n; j++) {
            int64_t idx[3], rem = j, xi = 0;
            for (int d = r - 1; d >= 0; d--) {
                idx[d] = rem % ys.dims[d];
                rem /= ys.dims[d];
            }
            int64_t xidx[3];
            for (int d = 0; d < r; d++) {
                int p = cs[k].perm[d] < 0 ? cs[k].perm[d] + r : cs[k].perm[d];
                xidx[p] = idx[d];
            }
            for (int d = 0; d < r; d++)
                xi = xi * cs[k].s.dims[d] + xidx[d];
            cr_assert_eq(wf_tensor_get(wf_node_value(gr), xi), wv[j], "case %d: dx[%lld]", k,
                         (long long)xi);
        }
        wf_graph_destroy(g);
    }
}

/* prod's gradient was dy * y / x: NaN where x is 0 ([2, 0, 3] gave [0, nan, 0], [0, 0, 0]
 * NaN everywhere). It is the product of the other elements of each reduced range: checked
 * here exactly (small integers and halves: every product is exact) against a plain f64
 * loop, for every axis setting, with one zero, two zeros in one range, and all zeros. */
static void prod_grad_case(const double *xv, wf_shape s, const int *axes, int n_axes, bool keep,
                           const char *what)
{
    wf_graph *g = wf_graph_create(rt, WF_EAGER);
    wf_node *x = gc_const(g, WF_F64, s, xv);
    wf_node *y = wf_reduce_prod(g, x, axes, n_axes, keep), *gr;
    cr_assert_not_null(y, "%s: %s", what, wf_graph_errmsg(g));
    cr_assert_eq(wf_gradients(g, wf_sum(g, y), &x, 1, &gr), 0, "%s: %s", what, wf_graph_errmsg(g));
    bool red[WF_MAX_RANK];
    for (int d = 0; d < s.rank; d++)
        red[d] = n_axes == 0;
    for (int i = 0; i < n_axes; i++)
        red[axes[i] < 0 ? axes[i] + s.rank : axes[i]] = true;
    int64_t n = wf_shape_numel(s);
    for (int64_t i = 0; i < n; i++) {
        double want = 1;
        for (int64_t j = 0; j < n; j++) { /* j in i's range: equal on every kept axis */
            int64_t a = i, b = j;
            bool same = true;
            for (int d = s.rank - 1; d >= 0; d--) {
                if (!red[d] && a % s.dims[d] != b % s.dims[d])
                    same = false;
                a /= s.dims[d];
                b /= s.dims[d];
            }
            if (same && j != i)
                want *= xv[j];
        }
        double got = wf_tensor_get(wf_node_value(gr), i);
        cr_assert(got == want, "%s: dx[%lld] is %g, the product of the others %g", what,
                  (long long)i, got, want);
    }
    wf_graph_destroy(g);
}

Test(gradients, prod_gradient_is_the_product_of_the_others_where_x_has_zeros)
{
    prod_grad_case((const double[]){ 2, 0, 3 }, WF_SHAPE(3), NULL, 0, false, "[2, 0, 3]");
    prod_grad_case((const double[]){ 0, 0, 0 }, WF_SHAPE(3), NULL, 0, false, "[0, 0, 0]");
    prod_grad_case((const double[]){ 2, 0, 3 }, WF_SHAPE(3), NULL, 0, true, "keepdims");

    static const struct {
        int n, axes[3];
        bool keep;
    } cs[] = { { 0, { 0 }, false },      { 1, { 0 }, false },    { 1, { 1 }, true },
               { 1, { -1 }, false },     { 2, { 0, 2 }, false }, { 2, { 2, 1 }, true },
               { 3, { 0, 1, 2 }, false } };

    for (int z = 0; z < 4; z++) {
        double v[24];
        for (int i = 0; i < 24; i++)
            v[i] = (i % 5 == 0 ? -0.5 : 1.0) * (double)(1 + i % 3); /* -0.5 .. 3, exact */
        if (z == 1)
            v[5] = 0; /* one zero */
        if (z == 2) {
            v[5] = v[6] = 0;   /* two in one last-axis row */
            v[1] = v[13] = 0;  /* two along axis 0 */
            v[16] = v[20] = 0; /* two along axis 1 */
        }
        if (z == 3)
            for (int i = 0; i < 24; i++)
                v[i] = 0;
        for (size_t k = 0; k < sizeof cs / sizeof cs[0]; k++) {
            char what[64];
            snprintf(what, sizeof what, "zeros %d, case %zu", z, k);
            prod_grad_case(v, WF_SHAPE(2, 3, 4), cs[k].axes, cs[k].n, cs[k].keep, what);
        }
    }
}

/* Runs 'fetch' of static graph 'g' with 'x' fed 'xt' (released); the value, owned. */
static wf_tensor *run1(wf_graph *g, wf_node *x, wf_tensor *xt, wf_node *fetch)
{
    wf_session *s;
    cr_assert_eq(wf_session_create(g, NULL, &s), 0, "%s", wf_graph_errmsg(g));
    wf_feed f = { x, xt };
    wf_tensor *out = NULL;
    int rc = wf_session_run(s, &f, 1, &fetch, 1, &out, NULL, 0);
    cr_assert_eq(rc, 0, "%s", wf_session_errmsg(s));
    wf_session_destroy(s);
    wf_tensor_release(xt);
    return out;
}

/* Broadcasting undone when a -1 dimension is 1 at run time: x [-1] fed [1] times c [4]
 * gave dx of shape [4] (1 2 3 4) and no error; it is [1] holding sum(c) = 10. */
Test(gradients, broadcast_is_undone_when_a_minus_one_dimension_is_one_at_run_time)
{
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F64, WF_SHAPE(-1));
    wf_node *c = vec(g, 4, (const double[]){ 1, 2, 3, 4 });
    wf_node *loss = wf_sum(g, wf_mul(g, x, c)), *gr;
    cr_assert_eq(wf_gradients(g, loss, &x, 1, &gr), 0, "%s", wf_graph_errmsg(g));
    wf_tensor *v = run1(g, x, wf_tensor_from(WF_F64, WF_SHAPE(1), (const double[]){ 0.5 }), gr);
    cr_assert(wf_shape_equal(wf_tensor_shape(v), WF_SHAPE(1)), "dx has %lld elements",
              (long long)wf_tensor_numel(v));
    cr_assert_eq(wf_tensor_get(v, 0), 10.0);
    wf_tensor_release(v);
    /* fed [4], nothing is summed: dx = c */
    v = run1(g, x, wf_tensor_from(WF_F64, WF_SHAPE(4), (const double[]){ 1, 1, 1, 1 }), gr);
    cr_assert(wf_shape_equal(wf_tensor_shape(v), WF_SHAPE(4)));
    for (int i = 0; i < 4; i++)
        cr_assert_eq(wf_tensor_get(v, i), (double)(i + 1));
    wf_tensor_release(v);
    wf_graph_destroy(g);
}

/* The same through relu, which failed: "relu_grad: x is [1, 2, 3] but dy is [4, 2, 3]"; and
 * (next test) through a batched matmul whose batch was broadcast. */
Test(gradients, relu_gradient_with_a_minus_one_batch_fed_one)
{
    double cv[24], xv[6];
    for (int i = 0; i < 24; i++)
        cv[i] = (double)(i % 7) - 2.5;
    for (int i = 0; i < 6; i++)
        xv[i] = (double)i - 2.5; /* no zeros: relu's kink */
    {
        wf_graph *g = wf_graph_create(rt, WF_STATIC);
        wf_node *x = wf_placeholder(g, "x", WF_F64, WF_SHAPE(-1, 2, 3));
        wf_node *c = gc_const(g, WF_F64, WF_SHAPE(4, 2, 3), cv);
        wf_node *loss = wf_sum(g, wf_mul(g, wf_relu(g, x), c)), *gr;
        cr_assert_eq(wf_gradients(g, loss, &x, 1, &gr), 0, "%s", wf_graph_errmsg(g));
        wf_tensor *v = run1(g, x, wf_tensor_from(WF_F64, WF_SHAPE(1, 2, 3), xv), gr);
        cr_assert(wf_shape_equal(wf_tensor_shape(v), WF_SHAPE(1, 2, 3)));
        for (int i = 0; i < 6; i++) {
            double want = 0;
            for (int b = 0; b < 4; b++)
                want += xv[i] > 0 ? cv[b * 6 + i] : 0;
            cr_assert_eq(wf_tensor_get(v, i), want, "relu: dx[%d]", i);
        }
        wf_tensor_release(v);
        wf_graph_destroy(g);
    }
}

Test(gradients, matmul_gradient_with_a_minus_one_batch_fed_one)
{
    double xv[6], bv[60];
    for (int i = 0; i < 6; i++)
        xv[i] = (double)i - 2.5;
    for (int i = 0; i < 60; i++)
        bv[i] = (double)(i % 5) * 0.5 - 1;
    {
        /* a [-1, 2, 3] fed [1, 2, 3] times b [4, 3, 5]: da = sum over the batch of dy b^T */
        wf_graph *g = wf_graph_create(rt, WF_STATIC);
        wf_node *a = wf_placeholder(g, "a", WF_F64, WF_SHAPE(-1, 2, 3));
        wf_node *b = gc_const(g, WF_F64, WF_SHAPE(4, 3, 5), bv);
        wf_node *loss = wf_sum(g, wf_matmul(g, wf_tanh(g, a), b)), *gr;
        cr_assert_eq(wf_gradients(g, loss, &a, 1, &gr), 0, "%s", wf_graph_errmsg(g));
        wf_tensor *v = run1(g, a, wf_tensor_from(WF_F64, WF_SHAPE(1, 2, 3), xv), gr);
        cr_assert(wf_shape_equal(wf_tensor_shape(v), WF_SHAPE(1, 2, 3)));
        for (int i = 0; i < 2; i++)
            for (int k = 0; k < 3; k++) {
                double s = 0, t = tanh(xv[i * 3 + k]);
                for (int bb = 0; bb < 4; bb++)
                    for (int j = 0; j < 5; j++)
                        s += bv[bb * 15 + k * 5 + j];
                cr_assert_float_eq(wf_tensor_get(v, i * 3 + k), s * (1 - t * t), 1e-12,
                                   "matmul: da[%d, %d]", i, k);
            }
        wf_tensor_release(v);
        wf_graph_destroy(g);
    }
}
