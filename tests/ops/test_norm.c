/* tests/ops/test_norm.c: layer normalization of weft/nn.h through the public API: values
 * against an f64 reference (several shapes and begin axes, with and without gamma and beta,
 * f32, f64, f16 and bf16), strided inputs, the fused backward against central finite differences of
 * sum(layer_norm(x) * R) in f64, 1 vs 2 workers bit for bit, a static session with a fed
 * batch, and every error with its code and a message naming the shapes and the file:line. */
#include "nn2_util.h"

TestSuite(ops_norm, .init = setup, .fini = teardown, .timeout = WF_TEST_TIMEOUT(60));

/* y = layer_norm(x) per row of 'n' in f64, optional gamma and beta. */
static void ref_layer_norm(const double *x, int64_t rows, int64_t n, const double *gm,
                           const double *bt, double eps, double *y)
{
    for (int64_t r = 0; r < rows; r++) {
        const double *v = x + r * n;
        double m = 0, q = 0;
        for (int64_t i = 0; i < n; i++)
            m += v[i];
        m /= (double)n;
        for (int64_t i = 0; i < n; i++)
            q += (v[i] - m) * (v[i] - m);
        double rs = 1 / sqrt(q / (double)n + eps);
        for (int64_t i = 0; i < n; i++)
            y[r * n + i] = (v[i] - m) * rs * (gm ? gm[i] : 1) + (bt ? bt[i] : 0);
    }
}

/* A constant of 'dt' from 'v', whose values 'v' then takes (rounded to 'dt'): the reference
 * uses what the op reads. */
static wf_node *cst_rounded(wf_graph *g, wf_dtype dt, wf_shape s, double *v)
{
    wf_node *c = cst(g, dt, s, v);
    double *r = node_f64(g, c);
    memcpy(v, r, (size_t)wf_shape_numel(s) * sizeof *v);
    free(r);
    return c;
}

Test(ops_norm, layer_norm_matches_an_f64_reference_for_shapes_axes_and_affine_choices)
{
    /* Tolerance: the kernel computes in f64 and rounds once, so results are within half an
     * ulp of the reference: f64 1e-12 (1 + |ref|), f32 1e-6 (1 + |ref|), f16 2^-11 |ref| and
     * bf16 2^-8 |ref| (plus 1e-6 for results near 0). */
    static const wf_shape shapes[] = {
        { 2, { 4, 6 } }, { 3, { 2, 3, 5 } }, { 4, { 3, 2, 2, 4 } }, { 1, { 7 } }
    };
    static const wf_dtype dts[] = { WF_F32, WF_F64, WF_F16, WF_BF16 };
    static const double ulp[] = { 1e-6, 1e-12, 0x1p-11, 0x1p-8 };
    uint64_t st = 11;
    wf_graph *g = new_graph(WF_EAGER);
    int cases = 0;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        wf_shape s = shapes[si];
        for (int b = -s.rank; b < s.rank; b++) {
            int begin = b < 0 ? b + s.rank : b;
            int64_t n = 1, total = wf_shape_numel(s);
            for (int d = begin; d < s.rank; d++)
                n *= s.dims[d];
            wf_shape ns = { .rank = s.rank - begin };
            memcpy(ns.dims, s.dims + begin, (size_t)ns.rank * sizeof ns.dims[0]);
            for (int di = 0; di < 4; di++) {
                for (int aff = 0; aff < 4; aff++) {
                    wf_dtype dt = dts[di];
                    double x[96], gm[96], bt[96], want[96];
                    rand_fill(&st, x, total, -3, 5);
                    x[0] += 100; /* an offset: catches E[x^2] - E[x]^2 cancellation */
                    rand_fill(&st, gm, n, 0.5, 2);
                    rand_fill(&st, bt, n, -1, 1);
                    double eps = 1e-5;
                    wf_node *xn = cst_rounded(g, dt, s, x);
                    wf_node *gn = aff & 1 ? cst_rounded(g, dt, ns, gm) : NULL;
                    wf_node *bn = aff & 2 ? cst_rounded(g, dt, ns, bt) : NULL;
                    wf_node *y = wf_layer_norm(g, xn, gn, bn, b, eps);
                    cr_assert_not_null(y, "%s", wf_graph_errmsg(g));
                    cr_assert_str_eq(wf_node_op(y), "layer_norm");
                    cr_assert_eq(wf_node_input_count(y), 1 + (aff & 1) + (aff >> 1));
                    cr_assert(wf_shape_equal(wf_node_shape(y), s));
                    cr_assert_eq(wf_node_dtype(y), dt);
                    ref_layer_norm(x, total / n, n, aff & 1 ? gm : NULL, aff & 2 ? bt : NULL, eps,
                                   want);
                    double *got = node_f64(g, y);
                    for (int64_t i = 0; i < total; i++) {
                        double tol =
                            di < 2 ? ulp[di] * (1 + fabs(want[i])) : ulp[di] * fabs(want[i]) + 1e-6;
                        cr_assert(fabs(got[i] - want[i]) <= tol,
                                  "shape %zu begin %d %s affine %d [%lld]: got %.17g want %.17g",
                                  si, b, wf_dtype_name(dt), aff, (long long)i, got[i], want[i]);
                    }
                    free(got);
                    cases++;
                }
            }
        }
    }
    cr_assert_eq(cases, (4 + 6 + 8 + 2) * 16); /* 2 * rank begin axes per shape */
    wf_graph_destroy(g);
}

Test(ops_norm, layer_norm_of_a_strided_view_equals_that_of_its_contiguous_copy)
{
    wf_graph *g = new_graph(WF_EAGER);
    double x[20], xt[20];
    uint64_t st = 5;
    rand_fill(&st, x, 20, -2, 2);
    for (int i = 0; i < 4; i++) /* xt is x [4, 5] stored column-major */
        for (int j = 0; j < 5; j++)
            xt[j * 4 + i] = x[i * 5 + j];
    const int64_t strides[2] = { 1, 4 };
    wf_node *a = wf_layer_norm(g, view(g, WF_SHAPE(4, 5), strides, xt), NULL, NULL, 1, 1e-3);
    wf_node *b = wf_layer_norm(g, cst(g, WF_F64, WF_SHAPE(4, 5), x), NULL, NULL, -1, 1e-3);
    cr_assert_not_null(a, "%s", wf_graph_errmsg(g));
    cr_assert_not_null(b, "%s", wf_graph_errmsg(g));
    cr_assert(same_bits(wf_node_value(a), wf_node_value(b)));
    wf_graph_destroy(g);
}

/* sum(layer_norm(x, gamma, beta) * R) with the op itself, in f64. */
static double loss(wf_graph *g, wf_shape s, const double *x, wf_node *gn, wf_node *bn, int b,
                   const double *r)
{
    wf_node *y = wf_layer_norm(g, cst(g, WF_F64, s, x), gn, bn, b, 1e-3);
    double *v = node_f64(g, y), sum = 0;
    for (int64_t i = 0; i < wf_shape_numel(s); i++)
        sum += v[i] * r[i];
    free(v);
    return sum;
}

Test(ops_norm, backward_input_matches_central_differences_in_f64)
{
    /* Central differences with h = 1e-5 are exact to ~1e-9 here (O(h^2) truncation plus
     * rounding of ~1e-16 / h); a wrong term in the formula is off by O(1). Tolerance 1e-6. */
    static const wf_shape shapes[] = { { 2, { 3, 5 } }, { 3, { 2, 3, 4 } } };
    static const int begins[] = { -1, 1 };
    uint64_t st = 99;
    for (int si = 0; si < 2; si++) {
        for (int with_gamma = 0; with_gamma < 2; with_gamma++) {
            wf_graph *g = new_graph(WF_EAGER);
            wf_shape s = shapes[si];
            int b = begins[si], begin = b < 0 ? b + s.rank : b;
            int64_t total = wf_shape_numel(s), n = 1;
            for (int d = begin; d < s.rank; d++)
                n *= s.dims[d];
            wf_shape ns = { .rank = s.rank - begin };
            memcpy(ns.dims, s.dims + begin, (size_t)ns.rank * sizeof ns.dims[0]);
            double x[24], r[24], gm[24], bt[24];
            rand_fill(&st, x, total, -2, 2);
            rand_fill(&st, r, total, -1, 1);
            rand_fill(&st, gm, n, 0.5, 1.5);
            rand_fill(&st, bt, n, -1, 1);
            wf_node *gn = with_gamma ? cst(g, WF_F64, ns, gm) : NULL;
            wf_node *bn = cst(g, WF_F64, ns, bt); /* beta does not change dx */
            wf_node *dx = wf_layer_norm_backward_input(g, cst(g, WF_F64, s, x), gn,
                                                       cst(g, WF_F64, s, r), b, 1e-3);
            cr_assert_not_null(dx, "%s", wf_graph_errmsg(g));
            cr_assert_str_eq(wf_node_op(dx), "layer_norm_backward_input");
            double *got = node_f64(g, dx);
            for (int64_t i = 0; i < total; i++) {
                const double h = 1e-5, x0 = x[i];
                x[i] = x0 + h;
                double lp = loss(g, s, x, gn, bn, b, r);
                x[i] = x0 - h;
                double lm = loss(g, s, x, gn, bn, b, r);
                x[i] = x0;
                double fd = (lp - lm) / (2 * h);
                cr_assert(fabs(got[i] - fd) <= 1e-6 * (1 + fabs(fd)),
                          "shape %d gamma %d [%lld]: dx %.12g, finite differences %.12g", si,
                          with_gamma, (long long)i, got[i], fd);
            }
            free(got);
            wf_graph_destroy(g);
        }
    }
}

/* layer_norm of [rows, 512] f32 on a runtime of 'workers', in a static session. */
static wf_tensor *big_layer_norm(int workers, const double *x, int64_t rows, bool backward)
{
    wf_runtime *r2 =
        wf_test_runtime(&(wf_runtime_opts){ .n_workers = workers, .flags = WF_RT_NO_PIN });
    wf_graph *g = wf_graph_create(r2, WF_STATIC);
    wf_shape s = WF_SHAPE(rows, 512);
    wf_node *xn = cst(g, WF_F32, s, x);
    wf_node *gm = cst(g, WF_F32, WF_SHAPE(512), x + 512);
    wf_node *y = backward ? wf_layer_norm_backward_input(g, xn, gm, xn, -1, 1e-5)
                          : wf_layer_norm(g, xn, gm, NULL, 1, 1e-5);
    wf_tensor *out = NULL;
    run_once(g, &y, 1, &out);
    wf_graph_destroy(g);
    wf_runtime_destroy(r2);
    return out;
}

Test(ops_norm, one_and_two_workers_give_the_same_bits)
{
    enum { ROWS = 256 }; /* 131072 elements: split over the workers */

    double *x = malloc(ROWS * 512 * sizeof *x);
    uint64_t st = 3;
    rand_fill(&st, x, ROWS * 512, -4, 4);
    for (int backward = 0; backward < 2; backward++) {
        wf_tensor *a = big_layer_norm(1, x, ROWS, backward);
        wf_tensor *b = big_layer_norm(2, x, ROWS, backward);
        cr_assert(same_bits(a, b), "backward %d", backward);
        wf_tensor_release(a);
        wf_tensor_release(b);
    }
    free(x);
}

Test(ops_norm, a_session_normalizes_each_fed_batch_size)
{
    wf_graph *g = new_graph(WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F64, WF_SHAPE(-1, 4));
    double gv[4] = { 1, 2, 0.5, -1 };
    wf_node *y = wf_layer_norm(g, x, cst(g, WF_F64, WF_SHAPE(4), gv), NULL, 1, 0);
    cr_assert_not_null(y, "%s", wf_graph_errmsg(g));
    cr_assert_eq(wf_node_shape(y).dims[0], -1);
    wf_session *s = NULL;
    cr_assert_eq(wf_session_create(g, NULL, &s), 0, "%s", wf_graph_errmsg(g));
    for (int64_t batch = 1; batch <= 3; batch++) {
        double xv[12], want[12];
        uint64_t st = (uint64_t)batch;
        rand_fill(&st, xv, batch * 4, -1, 1);
        wf_tensor *xt = wf_tensor_from(WF_F64, WF_SHAPE(batch, 4), xv), *out = NULL;
        int rc = wf_session_run(s, &(wf_feed){ x, xt }, 1, &y, 1, &out, NULL, 0);
        cr_assert_eq(rc, 0, "%s", wf_session_errmsg(s));
        cr_assert(wf_shape_equal(wf_tensor_shape(out), WF_SHAPE(batch, 4)));
        ref_layer_norm(xv, batch, 4, gv, NULL, 0, want);
        for (int64_t i = 0; i < batch * 4; i++)
            cr_assert(fabs(wf_tensor_get(out, i) - want[i]) <= 1e-12, "[%lld]", (long long)i);
        wf_tensor_release(out);
        wf_tensor_release(xt);
    }
    wf_session_destroy(s);
    wf_graph_destroy(g);
}

Test(ops_norm, bad_arguments_fail_with_codes_naming_the_shapes_and_the_call_site)
{
    double v[24] = { 0 };
    char loc[64];
    wf_graph *g = new_graph(WF_STATIC);
    wf_node *x = cst(g, WF_F32, WF_SHAPE(2, 3, 4), v);
    wf_node *g34 = cst(g, WF_F32, WF_SHAPE(3, 4), v), *g4 = cst(g, WF_F32, WF_SHAPE(4), v);
    wf_node *d34 = cst(g, WF_F64, WF_SHAPE(3, 4), v), *xi = cst(g, WF_I32, WF_SHAPE(2, 3, 4), v);

    WHERE_NEXT(loc);
    wf_node *y = wf_layer_norm(g, x, g4, NULL, 1, 1e-5);
    check_error(g, y, WF_ESHAPE,
                (const char *[]){ "layer_norm", loc, "gamma must be f32 [3, 4]", "[4]", NULL });
    wf_graph_clear_error(g);
    WHERE_NEXT(loc);
    y = wf_layer_norm(g, x, NULL, d34, -2, 1e-5);
    check_error(g, y, WF_EDTYPE, (const char *[]){ "beta", loc, "f64 [3, 4]", NULL });
    wf_graph_clear_error(g);
    WHERE_NEXT(loc);
    y = wf_layer_norm(g, x, g34, NULL, 3, 1e-5);
    check_error(g, y, WF_EINVAL, (const char *[]){ "begin axis 3", "[2, 3, 4]", loc, NULL });
    wf_graph_clear_error(g);
    y = wf_layer_norm(g, x, NULL, NULL, -4, 1e-5);
    check_error(g, y, WF_EINVAL, (const char *[]){ "begin axis -4", NULL });
    wf_graph_clear_error(g);
    y = wf_layer_norm(g, x, NULL, NULL, 1, -1);
    check_error(g, y, WF_EINVAL, (const char *[]){ "eps -1", NULL });
    wf_graph_clear_error(g);
    y = wf_layer_norm(g, x, NULL, NULL, 1, NAN);
    check_error(g, y, WF_EINVAL, (const char *[]){ "eps", NULL });
    wf_graph_clear_error(g);
    WHERE_NEXT(loc);
    y = wf_layer_norm(g, xi, NULL, NULL, 1, 1e-5);
    check_error(g, y, WF_EDTYPE, (const char *[]){ "i32", loc, NULL });
    wf_graph_clear_error(g);
    y = wf_layer_norm(g, wf_scalar(g, WF_F32, 1), NULL, NULL, 0, 1e-5);
    check_error(g, y, WF_ESHAPE, (const char *[]){ "scalar", NULL });
    wf_graph_clear_error(g);
    WHERE_NEXT(loc);
    y = wf_layer_norm_backward_input(g, x, NULL, g34, 1, 1e-5);
    check_error(g, y, WF_ESHAPE,
                (const char *[]){ "layer_norm_backward_input", loc, "dy must be f32 [2, 3, 4]",
                                  "not f32 [3, 4]", NULL });
    wf_graph_clear_error(g);
    y = wf_layer_norm_backward_input(g, x, g4, x, 1, 1e-5);
    check_error(g, y, WF_ESHAPE, (const char *[]){ "gamma must be f32 [3, 4]", NULL });
    wf_graph_clear_error(g);
    y = wf_layer_norm_backward_input(g, x, NULL, NULL, 1, 1e-5);
    cr_assert_null(y);
    cr_assert_eq(wf_graph_status(g), WF_EINVAL, "%s", wf_graph_errmsg(g));
    wf_graph_destroy(g);
}
