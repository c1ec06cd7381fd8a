/* tests/ops/test_backward_ops.c: the backward helper ops of weft/nn.h through the public
 * API: each activation gradient against central finite differences of its forward op in f64
 * (and f32 against f64); scatter_add against a loop (repeated indices, every axis, i32 and
 * i64 indices, f32, f64, i32 and bf16 updates), 1 vs 2 workers bit for bit, and its
 * run-time index error; slice_backward against the positions wf_slice reads (random slices,
 * negative steps) and the adjoint identity <slice_backward(R), X> = <R, slice(X)>; every
 * error with its code and a message naming the shapes and the file:line. */
#include "nn2_util.h"

TestSuite(ops_backward, .init = setup, .fini = teardown, .timeout = WF_TEST_TIMEOUT(60));

/* ---- Activation gradients ----------------------------------------------------------------- */

/* The forward op of 'act' on eager node 'x'. */
static wf_node *forward(wf_graph *g, wf_activation act, wf_node *x, double alpha)
{
    switch (act) {
    case WF_ACT_RELU:
        return wf_relu(g, x);
    case WF_ACT_LEAKY_RELU:
        return wf_leaky_relu(g, x, alpha);
    case WF_ACT_GELU:
        return wf_gelu(g, x, false);
    case WF_ACT_GELU_TANH:
        return wf_gelu(g, x, true);
    case WF_ACT_SILU:
        return wf_silu(g, x);
    case WF_ACT_SIGMOID:
        return wf_sigmoid(g, x);
    default:
        return wf_tanh(g, x);
    }
}

static const char *const act_ops[WF_ACT_COUNT] = {
    "relu_grad", "leaky_relu_grad", "gelu_grad", "gelu_tanh_grad",
    "silu_grad", "sigmoid_grad",    "tanh_grad",
};

Test(ops_backward, each_activation_grad_matches_finite_differences_of_its_forward)
{
    /* Points away from the kinks of relu and leaky_relu (|x| >= 0.3 > h). Central
     * differences with h = 1e-6 in f64 are good to ~1e-9; tolerance 1e-7 (1 + |fd|). f32 is
     * checked against the f64 result with 1e-5 (1 + |ref|). */
    enum { K = 9 };

    const double xs[K] = { -3.1, -1.7, -0.9, -0.3, 0.35, 0.8, 1.3, 2.2, 4.05 };
    double dy[K];
    uint64_t st = 17;
    rand_fill(&st, dy, K, -2, 2);
    const double alpha = 0.13, h = 1e-6;
    wf_graph *g = new_graph(WF_EAGER);
    for (int a = 0; a < WF_ACT_COUNT; a++) {
        wf_activation act = (wf_activation)a;
        bool from_y = act == WF_ACT_SIGMOID || act == WF_ACT_TANH;
        wf_node *x64 = cst(g, WF_F64, WF_SHAPE(3, 3), xs);
        wf_node *in64 = from_y ? forward(g, act, x64, alpha) : x64;
        wf_node *dx = wf_activation_grad(g, act, in64, cst(g, WF_F64, WF_SHAPE(3, 3), dy), alpha);
        cr_assert_not_null(dx, "%s", wf_graph_errmsg(g));
        cr_assert_str_eq(wf_node_op(dx), act_ops[a]);
        double *got = node_f64(g, dx);
        double xp[K], xm[K];
        for (int i = 0; i < K; i++) {
            xp[i] = xs[i] + h;
            xm[i] = xs[i] - h;
        }
        double *fp = node_f64(g, forward(g, act, cst(g, WF_F64, WF_SHAPE(3, 3), xp), alpha));
        double *fm = node_f64(g, forward(g, act, cst(g, WF_F64, WF_SHAPE(3, 3), xm), alpha));
        /* f32: the same op on rounded inputs. */
        double xr[K], dyr[K];
        for (int i = 0; i < K; i++) {
            xr[i] = (float)xs[i];
            dyr[i] = (float)dy[i];
        }
        wf_node *x32 = cst(g, WF_F32, WF_SHAPE(3, 3), xr);
        wf_node *in32 = from_y ? forward(g, act, x32, alpha) : x32;
        double *got32 = node_f64(
            g, wf_activation_grad(g, act, in32, cst(g, WF_F32, WF_SHAPE(3, 3), dyr), alpha));
        double *ref32 = node_f64(g, wf_activation_grad(g, act, cst(g, WF_F64, WF_SHAPE(3, 3), xr),
                                                       cst(g, WF_F64, WF_SHAPE(3, 3), dyr), alpha));
        if (from_y) { /* the f64 reference of the f32 case takes y = f(x) from the f64 op */
            free(ref32);
            wf_node *y64 = forward(g, act, cst(g, WF_F64, WF_SHAPE(3, 3), xr), alpha);
            ref32 = node_f64(
                g, wf_activation_grad(g, act, y64, cst(g, WF_F64, WF_SHAPE(3, 3), dyr), alpha));
        }
        for (int i = 0; i < K; i++) {
            double fd = dy[i] * (fp[i] - fm[i]) / (2 * h);
            cr_assert(fabs(got[i] - fd) <= 1e-7 * (1 + fabs(fd)),
                      "%s at x = %g: got %.12g, finite differences %.12g", act_ops[a], xs[i],
                      got[i], fd);
            cr_assert(fabs(got32[i] - ref32[i]) <= 1e-5 * (1 + fabs(ref32[i])),
                      "%s f32 at x = %g: got %.9g, f64 %.9g", act_ops[a], xs[i], got32[i],
                      ref32[i]);
        }
        free(got);
        free(fp);
        free(fm);
        free(got32);
        free(ref32);
    }
    wf_graph_destroy(g);
}

Test(ops_backward, activation_grad_reads_strided_inputs_and_runs_in_a_session)
{
    wf_graph *g = new_graph(WF_STATIC);
    double xt[6] = { -1, 2, 0.5, -3, 4, 1.5 }, dy[6] = { 1, 2, 3, 4, 5, 6 };
    const int64_t strides[2] = { 1, 2 }; /* x [2, 3]: (i, j) = xt[2j + i] */
    wf_node *dx = wf_activation_grad(g, WF_ACT_RELU, view(g, WF_SHAPE(2, 3), strides, xt),
                                     cst(g, WF_F64, WF_SHAPE(2, 3), dy), 0);
    wf_tensor *out = NULL;
    run_once(g, &dx, 1, &out);
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++)
            cr_assert_eq(wf_tensor_get(out, i * 3 + j), xt[2 * j + i] > 0 ? dy[i * 3 + j] : 0);
    wf_tensor_release(out);
    wf_graph_destroy(g);
}

Test(ops_backward, activation_grad_of_halves_is_the_f32_result_rounded_once)
{
    /* bf16 and f16 are computed in f32 and rounded on store: equal to casting the f32 op. */
    static const wf_dtype halves[] = { WF_BF16, WF_F16 };
    double x[8] = { -2.5, -1, -0.25, 0.125, 0.5, 1, 2, 3.5 }, dy[8];
    uint64_t st = 31;
    rand_fill(&st, dy, 8, -2, 2);
    wf_graph *g = new_graph(WF_EAGER);
    for (int h = 0; h < 2; h++)
        for (int a = 0; a < WF_ACT_COUNT; a++) {
            wf_node *xh = cst(g, halves[h], WF_SHAPE(8), x),
                    *dh = cst(g, halves[h], WF_SHAPE(8), dy);
            wf_node *yh = wf_activation_grad(g, (wf_activation)a, xh, dh, 0.2);
            wf_node *y32 = wf_activation_grad(g, (wf_activation)a, wf_cast(g, xh, WF_F32),
                                              wf_cast(g, dh, WF_F32), 0.2);
            wf_node *want = wf_cast(g, y32, halves[h]);
            cr_assert_not_null(yh, "%s", wf_graph_errmsg(g));
            cr_assert_not_null(want, "%s", wf_graph_errmsg(g));
            cr_assert(same_bits(wf_node_value(yh), wf_node_value(want)), "%s %s",
                      wf_dtype_name(halves[h]), act_ops[a]);
        }
    wf_graph_destroy(g);
}

Test(ops_backward, activation_grad_errors_name_shapes_and_the_call_site)
{
    double v[12] = { 0 };
    char loc[64];
    wf_graph *g = new_graph(WF_STATIC);
    wf_node *a = cst(g, WF_F32, WF_SHAPE(3, 4), v), *b = cst(g, WF_F32, WF_SHAPE(4), v);
    WHERE_NEXT(loc);
    wf_node *y = wf_activation_grad(g, WF_ACT_SILU, a, b, 0);
    check_error(g, y, WF_ESHAPE,
                (const char *[]){ "silu_grad", "[3, 4]", "[4]", "no broadcasting", loc, NULL });
    wf_graph_clear_error(g);
    y = wf_activation_grad(g, WF_ACT_TANH, a, cst(g, WF_F64, WF_SHAPE(3, 4), v), 0);
    check_error(g, y, WF_EDTYPE, (const char *[]){ "tanh_grad", "f32", "f64", NULL });
    wf_graph_clear_error(g);
    wf_node *ai = cst(g, WF_I32, WF_SHAPE(3, 4), v);
    y = wf_activation_grad(g, WF_ACT_RELU, ai, ai, 0);
    check_error(g, y, WF_EDTYPE, (const char *[]){ "relu_grad", "i32", NULL });
    wf_graph_clear_error(g);
    WHERE_NEXT(loc);
    y = wf_activation_grad(g, (wf_activation)42, a, a, 0);
    check_error(g, y, WF_EINVAL, (const char *[]){ "42", "wf_activation", loc, NULL });
    wf_graph_clear_error(g);
    /* The location was consumed: the next node gets its own line. */
    WHERE_NEXT(loc);
    y = wf_activation_grad(g, WF_ACT_RELU, a, b, 0);
    check_error(g, y, WF_ESHAPE, (const char *[]){ loc, NULL });
    wf_graph_destroy(g);
}

/* ---- scatter_add --------------------------------------------------------------------------- */

/* out (shape 'os') = loop reference of scatter_add along 'axis' with 'n_idx' indices (1-D or
 * 2-D 'is'), accumulated in index order in 'dt' (f32 rounds each add, as the kernel). */
static void ref_scatter(wf_dtype dt, wf_shape os, int axis, const double *idx, int64_t n_idx,
                        const double *upd, double *out)
{
    int64_t outer = 1, inner = 1, dim = os.dims[axis];
    for (int d = 0; d < axis; d++)
        outer *= os.dims[d];
    for (int d = axis + 1; d < os.rank; d++)
        inner *= os.dims[d];
    memset(out, 0, (size_t)(outer * dim * inner) * sizeof *out);
    for (int64_t o = 0; o < outer; o++)
        for (int64_t j = 0; j < n_idx; j++)
            for (int64_t k = 0; k < inner; k++) {
                double *p = &out[(o * dim + (int64_t)idx[j]) * inner + k];
                double u = upd[(o * n_idx + j) * inner + k];
                *p = dt == WF_F32 || dt == WF_BF16 ? (double)((float)*p + (float)u) : *p + u;
            }
}

Test(ops_backward, scatter_add_matches_a_loop_on_every_axis_with_repeated_indices)
{
    static const wf_dtype idts[] = { WF_I32, WF_I64 };
    static const wf_dtype dts[] = { WF_F32, WF_F64, WF_I32, WF_BF16 };
    const int64_t od[3] = { 3, 4, 5 };
    const double idx[6] = { 2, 0, 2, 1, 2, 0 }; /* [2, 3], repeats; valid on every axis */
    uint64_t st = 23;
    wf_graph *g = new_graph(WF_EAGER);
    int checked = 0;
    for (int ii = 0; ii < 2; ii++)
        for (int di = 0; di < 4; di++)
            for (int axis = 0; axis < 3; axis++) {
                wf_dtype dt = dts[di];
                wf_shape os = WF_SHAPE(od[0], od[1], od[2]);
                wf_shape us = { .rank = 4 };
                for (int d = 0, k = 0; d < 3; d++) {
                    if (d == axis) {
                        us.dims[k++] = 2;
                        us.dims[k++] = 3;
                    } else {
                        us.dims[k++] = od[d];
                    }
                }
                double upd[120], want[60];
                int64_t nu = wf_shape_numel(us);
                rand_fill(&st, upd, nu, -4, 4);
                for (int64_t i = 0; i < nu; i++) /* values exact in every dtype */
                    upd[i] = dt == WF_I32    ? round(upd[i])
                             : dt == WF_BF16 ? round(upd[i] * 4) / 4
                                             : upd[i];
                if (dt == WF_F32)
                    for (int64_t i = 0; i < nu; i++)
                        upd[i] = (float)upd[i];
                wf_node *un = cst(g, dt, us, upd), *in = cst(g, idts[ii], WF_SHAPE(2, 3), idx);
                int ax_arg = ii ? axis - 3 : axis; /* negative axes with i64 */
                wf_node *y = wf_scatter_add(g, un, in, ax_arg, od[axis]);
                cr_assert_not_null(y, "%s", wf_graph_errmsg(g));
                cr_assert_str_eq(wf_node_op(y), "scatter_add");
                cr_assert(wf_shape_equal(wf_node_shape(y), os));
                ref_scatter(dt, os, axis, idx, 6, upd, want);
                double *got = node_f64(g, y);
                for (int64_t i = 0; i < 60; i++) {
                    double w = dt == WF_BF16
                                   ? (double)wf_tensor_get(
                                         wf_node_value(cst(g, WF_BF16, WF_SCALAR, &want[i])), 0)
                                   : want[i];
                    cr_assert(got[i] == w, "%s %s axis %d [%lld]: %.9g want %.9g",
                              wf_dtype_name(idts[ii]), wf_dtype_name(dt), axis, (long long)i,
                              got[i], w);
                }
                free(got);
                checked++;
            }
    cr_assert_eq(checked, 24);
    wf_graph_destroy(g);
}

Test(ops_backward, scatter_add_is_the_adjoint_of_gather)
{
    /* <scatter_add(R), X> == <R, gather(X)>: the defining property of gather's gradient. */
    wf_graph *g = new_graph(WF_EAGER);
    double x[20], r[16];
    const double idx[4] = { 3, 1, 3, 0 };
    uint64_t st = 8;
    rand_fill(&st, x, 20, -1, 1);
    rand_fill(&st, r, 16, -1, 1);
    wf_node *xn = cst(g, WF_F64, WF_SHAPE(4, 5), x), *in = cst(g, WF_I32, WF_SHAPE(4), idx);
    /* along axis 1 of x [4, 5]: gather gives [4, 4] */
    double *gx = node_f64(g, wf_gather(g, xn, in, 1));
    double *sr = node_f64(g, wf_scatter_add(g, cst(g, WF_F64, WF_SHAPE(4, 4), r), in, 1, 5));
    double lhs = 0, rhs = 0;
    for (int i = 0; i < 20; i++)
        lhs += sr[i] * x[i];
    for (int i = 0; i < 16; i++)
        rhs += r[i] * gx[i];
    cr_assert(fabs(lhs - rhs) <= 1e-12, "%.17g vs %.17g", lhs, rhs);
    free(gx);
    free(sr);
    wf_graph_destroy(g);
}

/* scatter_add of [ROWS, 64] f32 updates into [DIM, 64] on a runtime of 'workers'. */
static wf_tensor *big_scatter(int workers, const double *upd, const double *idx, int64_t rows,
                              int64_t dim, int axis)
{
    wf_runtime *r2 =
        wf_test_runtime(&(wf_runtime_opts){ .n_workers = workers, .flags = WF_RT_NO_PIN });
    wf_graph *g = wf_graph_create(r2, WF_STATIC);
    wf_shape us = axis == 0 ? WF_SHAPE(rows, 64) : WF_SHAPE(64, rows);
    wf_node *y =
        wf_scatter_add(g, cst(g, WF_F32, us, upd), cst(g, WF_I64, WF_SHAPE(rows), idx), axis, dim);
    cr_assert_not_null(y, "%s", wf_graph_errmsg(g));
    wf_tensor *out = NULL;
    run_once(g, &y, 1, &out);
    wf_graph_destroy(g);
    wf_runtime_destroy(r2);
    return out;
}

Test(ops_backward, scatter_add_gives_the_same_bits_for_one_and_two_workers)
{
    enum { ROWS = 6000, DIM = 300 }; /* 384000 adds: split over the workers */

    double *upd = malloc(ROWS * 64 * sizeof *upd), *idx = malloc(ROWS * sizeof *idx);
    uint64_t st = 77;
    rand_fill(&st, upd, ROWS * 64, -1, 1);
    for (int i = 0; i < ROWS; i++)
        idx[i] = (double)wf_test_rand_below(&st, DIM); /* ~20 repeats per row */
    for (int axis = 0; axis < 2; axis++)
        for (int rep = 0; rep < 2; rep++) {
            wf_tensor *a = big_scatter(1, upd, idx, ROWS, DIM, axis);
            wf_tensor *b = big_scatter(2, upd, idx, ROWS, DIM, axis);
            cr_assert(same_bits(a, b), "axis %d rep %d", axis, rep);
            if (axis == 0 && rep == 0) { /* and equal to the loop, add for add */
                double *want = malloc(DIM * 64 * sizeof *want), *u32 = malloc(ROWS * 64 * 8);
                for (int i = 0; i < ROWS * 64; i++)
                    u32[i] = (float)upd[i];
                ref_scatter(WF_F32, WF_SHAPE(DIM, 64), 0, idx, ROWS, u32, want);
                for (int i = 0; i < DIM * 64; i++)
                    cr_assert(wf_tensor_get(a, i) == want[i], "[%d]", i);
                free(want);
                free(u32);
            }
            wf_tensor_release(a);
            wf_tensor_release(b);
        }
    free(upd);
    free(idx);
}

Test(ops_backward, scatter_add_errors_name_shapes_indices_and_the_call_site)
{
    double v[24] = { 0 };
    const double bad[3] = { 1, 7, 0 }, neg[2] = { -1, 0 };
    char loc[64];
    wf_graph *g = new_graph(WF_EAGER);
    wf_node *u = cst(g, WF_F32, WF_SHAPE(3, 4), v), *ib = cst(g, WF_I32, WF_SHAPE(3), bad);
    wf_node *i2 = cst(g, WF_I32, WF_SHAPE(2), v);
    WHERE_NEXT(loc);
    wf_node *y = wf_scatter_add(g, u, ib, 0, 5);
    check_error(g, y, WF_EINVAL,
                (const char *[]){ "scatter_add", "index 7 at position 1", "[0, 5)", loc, NULL });
    wf_graph_clear_error(g);
    y = wf_scatter_add(g, cst(g, WF_F32, WF_SHAPE(2, 4), v), cst(g, WF_I64, WF_SHAPE(2), neg), 0,
                       5);
    check_error(g, y, WF_EINVAL, (const char *[]){ "index -1 at position 0", NULL });
    wf_graph_clear_error(g);
    WHERE_NEXT(loc);
    y = wf_scatter_add(g, u, i2, 0, 5);
    check_error(g, y, WF_ESHAPE,
                (const char *[]){ "updates are [3, 4]", "indices [2]", loc, NULL });
    wf_graph_clear_error(g);
    y = wf_scatter_add(g, u, cst(g, WF_F32, WF_SHAPE(3), v), 0, 5);
    check_error(g, y, WF_EDTYPE, (const char *[]){ "indices are f32 [3]", NULL });
    wf_graph_clear_error(g);
    y = wf_scatter_add(g, u, cst(g, WF_I32, WF_SHAPE(3), v), 2, 5);
    check_error(g, y, WF_EINVAL, (const char *[]){ "axis 2", NULL });
    wf_graph_clear_error(g);
    y = wf_scatter_add(g, u, cst(g, WF_I32, WF_SHAPE(3), v), 0, -1);
    check_error(g, y, WF_EINVAL, (const char *[]){ "dim -1", NULL });
    wf_graph_clear_error(g);
    y = wf_scatter_add(g, cst(g, WF_BOOL, WF_SHAPE(3), v), cst(g, WF_I32, WF_SHAPE(3), v), 0, 5);
    check_error(g, y, WF_EDTYPE, (const char *[]){ "bool", NULL });
    wf_graph_destroy(g);
}

/* ---- slice_backward ------------------------------------------------------------------------ */

/* A random begin/end/step for an axis of size 'dim': ends past the edges, negative values and
 * negative steps included; sometimes the default (INT64_MIN/MAX as wf_slice's NULL does). */
static void rand_slice(uint64_t *st, int64_t dim, int64_t *b, int64_t *e, int64_t *s)
{
    static const int64_t steps[] = { 1, 2, 3, -1, -2, -3 };
    *s = steps[wf_test_rand_below(st, 6)];
    *b = (int64_t)wf_test_rand_below(st, (uint64_t)(2 * dim + 5)) - dim - 2;
    *e = (int64_t)wf_test_rand_below(st, (uint64_t)(2 * dim + 5)) - dim - 2;
    if (wf_test_rand_below(st, 4) != 0 && (*s > 0) == (*b > *e)) { /* mostly non-empty */
        int64_t t = *b;
        *b = *e;
        *e = t;
    }
    if (wf_test_rand_below(st, 5) == 0)
        *b = *s > 0 ? INT64_MIN : INT64_MAX;
    if (wf_test_rand_below(st, 5) == 0)
        *e = *s > 0 ? INT64_MAX : INT64_MIN;
}

Test(ops_backward, slice_backward_writes_dy_where_slice_reads_and_is_its_adjoint)
{
    const wf_shape xs = WF_SHAPE(5, 6, 4);
    double pos[120], x[120];
    iota(pos, 120); /* slicing positions tells which elements a slice reads */
    uint64_t st = 4242;
    rand_fill(&st, x, 120, -1, 1);
    int nonempty = 0;
    for (int rep = 0; rep < 200; rep++) {
        wf_graph *g = new_graph(WF_EAGER);
        int64_t b[3], e[3], s[3];
        for (int d = 0; d < 3; d++)
            rand_slice(&st, xs.dims[d], &b[d], &e[d], &s[d]);
        wf_node *sl = wf_slice(g, cst(g, WF_F64, xs, pos), b, e, s);
        cr_assert_not_null(sl, "%s", wf_graph_errmsg(g));
        wf_shape ys = wf_node_shape(sl);
        int64_t ny = wf_shape_numel(ys);
        double r[120], want[120] = { 0 };
        rand_fill(&st, r, ny, -1, 1);
        double *at = node_f64(g, sl);
        for (int64_t i = 0; i < ny; i++)
            want[(int64_t)at[i]] = r[i];
        wf_node *dx = wf_slice_backward(g, cst(g, WF_F64, ys, r), xs, b, e, s);
        cr_assert_not_null(dx, "%s", wf_graph_errmsg(g));
        cr_assert_str_eq(wf_node_op(dx), "slice_backward");
        double *got = node_f64(g, dx);
        for (int i = 0; i < 120; i++)
            cr_assert(got[i] == want[i], "rep %d [%d]: %g want %g", rep, i, got[i], want[i]);
        /* <slice_backward(R), X> == <R, slice(X)> */
        double *sx = node_f64(g, wf_slice(g, cst(g, WF_F64, xs, x), b, e, s)), lhs = 0, rhs = 0;
        for (int i = 0; i < 120; i++)
            lhs += got[i] * x[i];
        for (int64_t i = 0; i < ny; i++)
            rhs += r[i] * sx[i];
        cr_assert(fabs(lhs - rhs) <= 1e-12, "rep %d: %.17g vs %.17g", rep, lhs, rhs);
        nonempty += ny > 0;
        free(at);
        free(got);
        free(sx);
        wf_graph_destroy(g);
    }
    cr_assert(nonempty > 60, "only %d non-empty slices", nonempty);
}

Test(ops_backward, slice_backward_takes_the_null_defaults_and_an_unknown_whole_axis)
{
    wf_graph *g = new_graph(WF_STATIC);
    wf_node *dy = wf_placeholder(g, "dy", WF_F32, WF_SHAPE(-1, 2));
    const int64_t b[2] = { 0, 1 }, e[2] = { INT64_MAX, 4 }, s[2] = { 1, 2 };
    /* axis 0 is taken whole (begin 0, end INT64_MAX, step 1): its size comes from dy. */
    wf_node *dx = wf_slice_backward(g, dy, WF_SHAPE(-1, 5), b, e, s);
    cr_assert_not_null(dx, "%s", wf_graph_errmsg(g));
    cr_assert(wf_shape_equal(wf_node_shape(dx), WF_SHAPE(-1, 5)));
    const int64_t sd[2] = { -1, -1 };
    wf_node *rev = wf_slice_backward(g, dy, WF_SHAPE(-1, 2), NULL, NULL, NULL);
    wf_node *neg = wf_slice_backward(g, wf_placeholder(g, "d2", WF_F32, WF_SHAPE(2, 2)),
                                     WF_SHAPE(2, 2), NULL, NULL, sd);
    cr_assert_not_null(rev, "%s", wf_graph_errmsg(g));
    cr_assert_not_null(neg, "%s", wf_graph_errmsg(g));
    wf_session *sess = NULL;
    cr_assert_eq(wf_session_create(g, NULL, &sess), 0, "%s", wf_graph_errmsg(g));
    const float dv[6] = { 1, 2, 3, 4, 5, 6 };
    wf_tensor *dt = wf_tensor_from(WF_F32, WF_SHAPE(3, 2), dv);
    wf_tensor *d2 = wf_tensor_from(WF_F32, WF_SHAPE(2, 2), dv);
    wf_feed feeds[2] = { { dy, dt }, { wf_graph_find(g, "d2"), d2 } };
    wf_node *f[3] = { dx, rev, neg };
    wf_tensor *out[3] = { NULL, NULL, NULL };
    int rc = wf_session_run(sess, feeds, 2, f, 3, out, NULL, 0);
    cr_assert_eq(rc, 0, "%s", wf_session_errmsg(sess));
    const double want[15] = { 0, 1, 0, 2, 0, 0, 3, 0, 4, 0, 0, 5, 0, 6, 0 };
    cr_assert(wf_shape_equal(wf_tensor_shape(out[0]), WF_SHAPE(3, 5)));
    for (int i = 0; i < 15; i++)
        cr_assert_eq(wf_tensor_get(out[0], i), want[i], "[%d]", i);
    for (int i = 0; i < 6; i++)
        cr_assert_eq(wf_tensor_get(out[1], i), dv[i]);
    const double wneg[4] = { 4, 3, 2, 1 }; /* x[::-1, ::-1] read backwards */
    for (int i = 0; i < 4; i++)
        cr_assert_eq(wf_tensor_get(out[2], i), wneg[i]);
    for (int i = 0; i < 3; i++)
        wf_tensor_release(out[i]);
    wf_tensor_release(dt);
    wf_tensor_release(d2);
    wf_session_destroy(sess);
    wf_graph_destroy(g);
}

Test(ops_backward, slice_backward_errors_name_shapes_and_the_call_site)
{
    double v[12] = { 0 };
    char loc[64];
    wf_graph *g = new_graph(WF_STATIC);
    wf_node *dy = cst(g, WF_F32, WF_SHAPE(2, 3), v);
    const int64_t b[2] = { 0, 0 }, e[2] = { 4, 3 }, s[2] = { 2, 1 }, s0[2] = { 1, 0 };
    WHERE_NEXT(loc);
    wf_node *y = wf_slice_backward(g, dy, WF_SHAPE(5, 3), b, e, s);
    cr_assert_not_null(y, "%s", wf_graph_errmsg(g)); /* [0:4:2] of 5 has 2: fits */
    y = wf_slice_backward(g, dy, WF_SHAPE(6, 3), NULL, NULL, s);
    check_error(g, y, WF_ESHAPE,
                (const char *[]){ "slice_backward", "x is [6, 3]", "3 elements on axis 0",
                                  "dy is [2, 3]", NULL });
    wf_graph_clear_error(g);
    WHERE_NEXT(loc);
    y = wf_slice_backward(g, dy, WF_SHAPE(5, 3), b, e, s0);
    check_error(g, y, WF_EINVAL, (const char *[]){ "step 0 on axis 1", loc, NULL });
    wf_graph_clear_error(g);
    y = wf_slice_backward(g, dy, WF_SHAPE(-1, 3), b, e, s);
    check_error(g, y, WF_ESHAPE, (const char *[]){ "unknown (-1)", "axis 0", NULL });
    wf_graph_clear_error(g);
    y = wf_slice_backward(g, dy, WF_SHAPE(2, 3, 1), NULL, NULL, NULL);
    check_error(g, y, WF_ESHAPE, (const char *[]){ "ranks differ", "[2, 3, 1]", NULL });
    wf_graph_destroy(g);
}
