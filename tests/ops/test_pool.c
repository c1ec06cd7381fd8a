/* tests/ops/test_pool.c: max_pool2d, avg_pool2d and their backward ops (weft/nn.h) through
 * the public API: eager values against naive f64 references (windows, strides, asymmetric
 * padding, count_include_pad both ways) in f64 (exact for max, 1e-12 for avg), f32 (1e-6)
 * and bf16 (1e-2); strided inputs; NaN propagation and padding that never wins a max; the
 * backward ops against central finite differences of L = sum(pool(x) * R) in f64 (max pool
 * on distinct values, so the derivative exists); ties and NaN giving the gradient to the
 * first position; a -1 batch through static sessions; every error with its code and a
 * message naming the shapes and the file:line; the same bits with 1 and 2 workers. */
#include "nn_util.h"

TestSuite(ops_pool, .init = setup, .fini = teardown, .timeout = WF_TEST_TIMEOUT(120));

typedef struct pool_cfg {
    int64_t N, C, H, W;
    wf_pool2d_opts o;
} pool_cfg;

typedef struct pool_dims {
    int64_t KH, KW, sh, sw, pt, pl, OH, OW;
} pool_dims;

static pool_dims dims_of(const pool_cfg *c)
{
    const wf_pool2d_opts *o = &c->o;
    pool_dims d = { .KH = o->window[0],
                    .KW = o->window[1],
                    .sh = o->stride[0] ? o->stride[0] : o->window[0],
                    .sw = o->stride[1] ? o->stride[1] : o->window[1],
                    .pt = o->padding[0],
                    .pl = o->padding[2] };
    d.OH = (c->H + o->padding[0] + o->padding[1] - d.KH) / d.sh + 1;
    d.OW = (c->W + o->padding[2] + o->padding[3] - d.KW) / d.sw + 1;
    return d;
}

static wf_shape x_shape(const pool_cfg *c)
{
    return WF_SHAPE(c->N, c->C, c->H, c->W);
}

static wf_shape y_shape(const pool_cfg *c)
{
    pool_dims d = dims_of(c);
    return WF_SHAPE(c->N, c->C, d.OH, d.OW);
}

/* The naive pools: y (max: the first NaN, else the largest real element; avg: the mean of
 * the real elements or the sum over the whole window) and, with 'dy', dx. */
static void ref_pool(const pool_cfg *c, bool max, const double *x, double *y, const double *dy,
                     double *dx)
{
    pool_dims d = dims_of(c);
    if (dx)
        memset(dx, 0, (size_t)nn_numel(x_shape(c)) * sizeof *dx);
    for (int64_t p = 0; p < c->N * c->C; p++)
        for (int64_t i = 0; i < d.OH; i++)
            for (int64_t j = 0; j < d.OW; j++) {
                double m = -INFINITY, s = 0;
                int64_t at = -1, count = 0;
                for (int64_t kh = 0; kh < d.KH; kh++)
                    for (int64_t kw = 0; kw < d.KW; kw++) {
                        int64_t ih = i * d.sh - d.pt + kh, iw = j * d.sw - d.pl + kw;
                        if (ih < 0 || ih >= c->H || iw < 0 || iw >= c->W)
                            continue;
                        int64_t xi = (p * c->H + ih) * c->W + iw;
                        count++;
                        s += x[xi];
                        if (at < 0 || (!isnan(m) && (x[xi] > m || isnan(x[xi])))) {
                            m = x[xi];
                            at = xi;
                        }
                    }
                double div = c->o.count_include_pad ? (double)(d.KH * d.KW) : (double)count;
                int64_t yi = (p * d.OH + i) * d.OW + j;
                if (y)
                    y[yi] = max ? m : s / div;
                if (!dx)
                    continue;
                if (max) {
                    dx[at] += dy[yi];
                    continue;
                }
                for (int64_t kh = 0; kh < d.KH; kh++)
                    for (int64_t kw = 0; kw < d.KW; kw++) {
                        int64_t ih = i * d.sh - d.pt + kh, iw = j * d.sw - d.pl + kw;
                        if (ih >= 0 && ih < c->H && iw >= 0 && iw < c->W)
                            dx[(p * c->H + ih) * c->W + iw] += dy[yi] / div;
                    }
            }
}

static wf_node *pool_node(wf_graph *g, bool max, wf_node *x, const pool_cfg *c)
{
    return max ? wf_max_pool2d(g, x, &c->o) : wf_avg_pool2d(g, x, &c->o);
}

static const pool_cfg configs[] = {
    { 2, 3, 6, 6, { .window = { 2, 2 } } },
    { 1, 2, 7, 9, { .window = { 3, 3 }, .stride = { 2, 2 }, .padding = { 1, 1, 1, 1 } } },
    { 2, 2, 8, 7, { .window = { 3, 2 }, .stride = { 1, 2 }, .padding = { 1, 0, 0, 1 } } },
    { 1, 3, 5, 5, { .window = { 3, 3 }, .stride = { 1, 1 }, .padding = { 2, 1, 0, 2 } } },
    { 1, 1, 5, 4, { .window = { 5, 4 } } },
    { 2,
      1,
      9,
      6,
      { .window = { 2, 3 },
        .stride = { 3, 1 },
        .padding = { 1, 1, 2, 0 },
        .count_include_pad = true } },
    { 1,
      2,
      6,
      6,
      { .window = { 3, 3 },
        .stride = { 2, 2 },
        .padding = { 1, 1, 1, 1 },
        .count_include_pad = true } },
};
#define N_CONFIGS (sizeof configs / sizeof configs[0])

static void check_forward(const pool_cfg *c, int k, bool max, wf_dtype dt, double tol)
{
    wf_graph *g = new_graph(WF_EAGER);
    int64_t nx = nn_numel(x_shape(c)), ny = nn_numel(y_shape(c));
    double *x = malloc((size_t)nx * sizeof *x), *y = malloc((size_t)ny * sizeof *y);
    nn_random(x, nx, 50 + (uint64_t)k);
    for (int64_t i = 0; i < nx; i++)
        x[i] -= 2; /* all negative: a padded 0 winning a max would show */
    wf_node *xn = cst(g, dt, x_shape(c), x);
    cr_assert_eq(wf_tensor_read(wf_node_value(xn), WF_F64, x, (size_t)nx * sizeof *x), 0);
    ref_pool(c, max, x, y, NULL, NULL);
    char what[64];
    snprintf(what, sizeof what, "config %d %s %s", k, max ? "max" : "avg", wf_dtype_name(dt));
    double *got = nn_read(g, pool_node(g, max, xn, c), y_shape(c), what);
    nn_close(what, got, y, NULL, ny, tol);
    free(got);
    free(x);
    free(y);
    wf_graph_destroy(g);
}

Test(ops_pool, forward_pools_match_the_naive_reference)
{
    for (size_t k = 0; k < N_CONFIGS; k++) {
        check_forward(&configs[k], (int)k, true, WF_F64, 0);
        check_forward(&configs[k], (int)k, false, WF_F64, 1e-12);
        check_forward(&configs[k], (int)k, true, WF_F32, 0);
        check_forward(&configs[k], (int)k, false, WF_F32, 1e-6);
        check_forward(&configs[k], (int)k, true, WF_BF16, 0);
        check_forward(&configs[k], (int)k, false, WF_BF16, 1e-2);
    }
}

Test(ops_pool, count_include_pad_changes_only_the_divisor_of_border_windows)
{
    wf_graph *g = new_graph(WF_EAGER);
    wf_node *x = cst(g, WF_F64, WF_SHAPE(1, 1, 2, 2), (double[4]){ 1, 2, 3, 4 });
    wf_pool2d_opts o = { .window = { 2, 2 }, .stride = { 1, 1 }, .padding = { 1, 0, 1, 0 } };
    /* Windows: {1}, {1, 2}, {1, 3}, {1, 2, 3, 4}. */
    check_value("exclude", g, wf_avg_pool2d(g, x, &o), WF_F64, WF_SHAPE(1, 1, 2, 2),
                (double[4]){ 1, 1.5, 2, 2.5 });
    o.count_include_pad = true;
    check_value("include", g, wf_avg_pool2d(g, x, &o), WF_F64, WF_SHAPE(1, 1, 2, 2),
                (double[4]){ 0.25, 0.75, 1, 2.5 });
    wf_graph_destroy(g);
}

Test(ops_pool, pools_read_strided_views)
{
    const pool_cfg c = {
        2, 3, 5, 6, { .window = { 3, 2 }, .stride = { 2, 1 }, .padding = { 1, 1, 1, 0 } }
    };
    double x[180], nhwc[180], y[200];
    int64_t nx = 180, ny = nn_numel(y_shape(&c));
    nn_random(x, nx, 77);
    for (int64_t n = 0; n < 2; n++)
        for (int64_t ch = 0; ch < 3; ch++)
            for (int64_t i = 0; i < 5; i++)
                for (int64_t j = 0; j < 6; j++)
                    nhwc[((n * 5 + i) * 6 + j) * 3 + ch] = x[((n * 3 + ch) * 5 + i) * 6 + j];
    const int64_t st[4] = { 90, 1, 18, 3 };
    wf_graph *g = new_graph(WF_EAGER);
    wf_node *xv = view(g, x_shape(&c), st, nhwc);
    for (int max = 0; max < 2; max++) {
        ref_pool(&c, max, x, y, NULL, NULL);
        double *got = nn_read(g, pool_node(g, max, xv, &c), y_shape(&c), "strided");
        nn_close(max ? "strided max" : "strided avg", got, y, NULL, ny, 1e-12);
        free(got);
    }
    wf_graph_destroy(g);
}

Test(ops_pool, max_pool_propagates_nan_and_never_picks_padding)
{
    wf_graph *g = new_graph(WF_EAGER);
    double v[8] = { -5, NAN, -1, -2, -3, -4, -6, -7 };
    wf_node *x = cst(g, WF_F64, WF_SHAPE(1, 2, 2, 2), v);
    const wf_pool2d_opts o = { .window = { 2, 2 }, .stride = { 2, 2 }, .padding = { 1, 1, 1, 1 } };
    /* Plane 0: windows {-5}, {NaN}, {-1}, {-2}; plane 1: {-3}, {-4}, {-6}, {-7}. */
    double *got = nn_read(g, wf_max_pool2d(g, x, &o), WF_SHAPE(1, 2, 2, 2), "nan");
    double want[8] = { -5, NAN, -1, -2, -3, -4, -6, -7 };
    nn_close("nan", got, want, NULL, 8, 0);
    free(got);
    wf_node *y = wf_max_pool2d(g, x, &(wf_pool2d_opts){ .window = { 2, 2 } });
    got = nn_read(g, y, WF_SHAPE(1, 2, 1, 1), "window with NaN");
    cr_assert(isnan(got[0]), "got %g", got[0]);
    cr_assert_eq(got[1], -3);
    free(got);
    wf_graph_destroy(g);
}

/* ---- Backward ops ------------------------------------------------------------------------- */

/* L = sum(pool(x) * R), the pool by weft in f64. */
static double loss(const pool_cfg *c, bool max, const double *x, const double *r)
{
    wf_graph *g = new_graph(WF_EAGER);
    wf_node *y = pool_node(g, max, cst(g, WF_F64, x_shape(c), x), c);
    cr_assert_not_null(y, "%s", wf_graph_errmsg(g));
    const double *v = wf_tensor_data_f64(wf_node_value(y));
    double l = 0;
    for (int64_t i = 0; i < nn_numel(y_shape(c)); i++)
        l += v[i] * r[i];
    wf_graph_destroy(g);
    return l;
}

Test(ops_pool, backward_ops_match_finite_differences)
{
    for (size_t k = 0; k < N_CONFIGS; k++) {
        const pool_cfg *c = &configs[k];
        int64_t nx = nn_numel(x_shape(c)), ny = nn_numel(y_shape(c));
        double *x = malloc((size_t)nx * sizeof *x), *r = malloc((size_t)ny * sizeof *r);
        double *fd = malloc((size_t)nx * sizeof *fd);
        /* Distinct values at least 1/nx apart (a shuffled ramp), so a step of 1e-4 never
         * changes which element is a window's maximum. */
        for (int64_t i = 0; i < nx; i++)
            x[i] = (double)((i * 37 + 11) % nx) / (double)nx;
        nn_random(r, ny, 900 + k);
        for (int max = 0; max < 2; max++) {
            const double h = 1e-4;
            for (int64_t i = 0; i < nx; i++) {
                double keep = x[i];
                x[i] = keep + h;
                double lp = loss(c, max, x, r);
                x[i] = keep - h;
                double lm = loss(c, max, x, r);
                x[i] = keep;
                fd[i] = (lp - lm) / (2 * h);
            }
            wf_graph *g = new_graph(WF_EAGER);
            wf_node *rn = cst(g, WF_F64, y_shape(c), r);
            wf_node *dx = max ? wf_max_pool2d_backward(g, cst(g, WF_F64, x_shape(c), x), rn, &c->o)
                              : wf_avg_pool2d_backward(g, rn, x_shape(c), &c->o);
            char what[64];
            snprintf(what, sizeof what, "config %zu %s", k, max ? "max" : "avg");
            double *got = nn_read(g, dx, x_shape(c), what);
            nn_close(what, got, fd, NULL, nx, 1e-9);
            /* f32 agrees. */
            wf_node *r32 = cst(g, WF_F32, y_shape(c), r);
            wf_node *dx32 =
                max ? wf_max_pool2d_backward(g, cst(g, WF_F32, x_shape(c), x), r32, &c->o)
                    : wf_avg_pool2d_backward(g, r32, x_shape(c), &c->o);
            double *got32 = nn_read(g, dx32, x_shape(c), what);
            nn_close(what, got32, got, NULL, nx, 1e-6);
            free(got32);
            free(got);
            wf_graph_destroy(g);
        }
        free(x);
        free(r);
        free(fd);
    }
}

Test(ops_pool, max_pool_backward_gives_ties_to_the_first_maximum_and_nan_wins)
{
    wf_graph *g = new_graph(WF_EAGER);
    /* Overlapping 2x2 windows over equal values: each window's top-left element is first. */
    wf_node *x = cst(g, WF_F64, WF_SHAPE(1, 1, 3, 3), (double[9]){ 0 });
    wf_node *dy = cst(g, WF_F64, WF_SHAPE(1, 1, 2, 2), (double[4]){ 1, 10, 100, 1000 });
    const wf_pool2d_opts o = { .window = { 2, 2 }, .stride = { 1, 1 } };
    check_value("ties", g, wf_max_pool2d_backward(g, x, dy, &o), WF_F64, WF_SHAPE(1, 1, 3, 3),
                (double[9]){ 1, 10, 0, 100, 1000, 0, 0, 0, 0 });
    /* A tie between positions 1 and 2 of a window, in row-major order. */
    wf_node *x2 = cst(g, WF_F32, WF_SHAPE(1, 1, 2, 2), (double[4]){ 1, 3, 3, 2 });
    wf_node *dy2 = cst(g, WF_F32, WF_SHAPE(1, 1, 1, 1), (double[1]){ 5 });
    check_value("row-major", g,
                wf_max_pool2d_backward(g, x2, dy2, &(wf_pool2d_opts){ .window = { 2, 2 } }), WF_F32,
                WF_SHAPE(1, 1, 2, 2), (double[4]){ 0, 5, 0, 0 });
    /* NaN takes the gradient, the first one if there are two. */
    wf_node *x3 = cst(g, WF_F64, WF_SHAPE(1, 1, 2, 2), (double[4]){ 9, NAN, 8, NAN });
    wf_node *dy3 = cst(g, WF_F64, WF_SHAPE(1, 1, 1, 1), (double[1]){ 5 });
    check_value("nan", g,
                wf_max_pool2d_backward(g, x3, dy3, &(wf_pool2d_opts){ .window = { 2, 2 } }), WF_F64,
                WF_SHAPE(1, 1, 2, 2), (double[4]){ 0, 5, 0, 0 });
    wf_graph_destroy(g);
}

/* ---- Static graphs: -1 batch ----------------------------------------------------------------- */

Test(ops_pool, minus_one_batch_flows_through_inference_and_static_sessions)
{
    const pool_cfg c = {
        2, 3, 7, 7, { .window = { 3, 3 }, .stride = { 2, 2 }, .padding = { 1, 1, 1, 1 } }
    };
    wf_graph *g = new_graph(WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F64, WF_SHAPE(-1, 3, 7, 7));
    wf_node *mx = wf_max_pool2d(g, x, &c.o), *av = wf_avg_pool2d(g, x, &c.o);
    cr_assert_not_null(mx, "%s", wf_graph_errmsg(g));
    cr_assert_not_null(av, "%s", wf_graph_errmsg(g));
    cr_assert(wf_shape_equal(wf_node_shape(mx), WF_SHAPE(-1, 3, 4, 4)));
    wf_node *dmx = wf_max_pool2d_backward(g, x, mx, &c.o);
    wf_node *dav = wf_avg_pool2d_backward(g, av, WF_SHAPE(-1, 3, 7, 7), &c.o);
    cr_assert_not_null(dmx, "%s", wf_graph_errmsg(g));
    cr_assert_not_null(dav, "%s", wf_graph_errmsg(g));
    cr_assert(wf_shape_equal(wf_node_shape(dav), WF_SHAPE(-1, 3, 7, 7)));
    wf_session *s = NULL;
    cr_assert_eq(wf_session_create(g, NULL, &s), 0, "%s", wf_graph_errmsg(g));
    double xv[294], y[96], dx[294];
    nn_random(xv, 294, 5);
    wf_tensor *xt = wf_tensor_from(WF_F64, x_shape(&c), xv);
    wf_tensor *outs[4] = { NULL };
    wf_node *fetch[4] = { mx, av, dmx, dav };
    cr_assert_eq(wf_session_run(s, &(wf_feed){ x, xt }, 1, fetch, 4, outs, NULL, 0), 0, "%s",
                 wf_session_errmsg(s));
    double got[294];
    for (int m = 0; m < 2; m++) {
        bool max = m == 0;
        ref_pool(&c, max, xv, y, NULL, NULL);
        ref_pool(&c, max, xv, NULL, y, dx);
        cr_assert(wf_shape_equal(wf_tensor_shape(outs[m]), y_shape(&c)));
        cr_assert_eq(wf_tensor_read(outs[m], WF_F64, got, sizeof got), 0);
        nn_close("y", got, y, NULL, 96, 1e-12);
        cr_assert(wf_shape_equal(wf_tensor_shape(outs[2 + m]), x_shape(&c)));
        cr_assert_eq(wf_tensor_read(outs[2 + m], WF_F64, got, sizeof got), 0);
        nn_close("dx", got, dx, NULL, 294, 1e-12);
    }
    for (int i = 0; i < 4; i++)
        wf_tensor_release(outs[i]);
    wf_tensor_release(xt);
    wf_session_destroy(s);
    wf_graph_destroy(g);
}

/* ---- Errors ---------------------------------------------------------------------------------- */

#define AT(line) nn_at("test_pool.c", line, where, sizeof where)

Test(ops_pool, a_wrong_rank_or_a_window_larger_than_the_padded_input_fails_with_eshape)
{
    char where[64];
    wf_graph *g = new_graph(WF_STATIC);
    wf_node *x3 = wf_placeholder(g, "x3", WF_F32, WF_SHAPE(3, 8, 8));
    wf_node *y = wf_max_pool2d(g, x3, &(wf_pool2d_opts){ .window = { 2, 2 } });
    int line = __LINE__ - 1;
    check_error(g, y, WF_ESHAPE,
                (const char *[]){ "max_pool2d", "x is [3, 8, 8]", "rank 4", AT(line), NULL });
    wf_graph_clear_error(g);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(1, 2, 4, 3));
    y = wf_avg_pool2d(g, x, &(wf_pool2d_opts){ .window = { 2, 5 }, .padding = { 0, 0, 1, 0 } });
    line = __LINE__ - 1;
    check_error(g, y, WF_ESHAPE,
                (const char *[]){ "avg_pool2d", "x is [1, 2, 4, 3]", "window width 5",
                                  "padded input width 4", "output width would be 0", AT(line),
                                  NULL });
    wf_graph_destroy(g);
}

Test(ops_pool, bad_windows_strides_and_paddings_fail_with_einval)
{
    char where[64];
    wf_graph *g = new_graph(WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(1, 2, 8, 8));
    wf_node *y = wf_max_pool2d(g, x, NULL);
    int line = __LINE__ - 1;
    check_error(g, y, WF_EINVAL,
                (const char *[]){ "max_pool2d", "[1, 2, 8, 8]", "window [0, 0]", AT(line), NULL });
    wf_graph_clear_error(g);
    check_error(g, wf_avg_pool2d(g, x, &(wf_pool2d_opts){ .window = { 2, -1 } }), WF_EINVAL,
                (const char *[]){ "window [2, -1]", NULL });
    wf_graph_clear_error(g);
    check_error(g,
                wf_max_pool2d(g, x, &(wf_pool2d_opts){ .window = { 2, 2 }, .stride = { -1, 1 } }),
                WF_EINVAL, (const char *[]){ "stride [-1, 1]", "[1, 2, 8, 8]", NULL });
    wf_graph_clear_error(g);
    y = wf_max_pool2d(g, x, &(wf_pool2d_opts){ .window = { 2, 2 }, .padding = { 0, -1, 0, 0 } });
    line = __LINE__ - 1;
    check_error(g, y, WF_EINVAL,
                (const char *[]){ "padding [0, -1, 0, 0]", "-1 on the bottom", "[1, 2, 8, 8]",
                                  AT(line), NULL });
    wf_graph_clear_error(g);
    check_error(
        g, wf_avg_pool2d(g, x, &(wf_pool2d_opts){ .window = { 3, 2 }, .padding = { 0, 0, 2, 0 } }),
        WF_EINVAL, (const char *[]){ "2 on the left must be in [0, 2)", NULL });
    wf_graph_destroy(g);
}

Test(ops_pool, dtypes_and_dy_shapes_are_checked)
{
    char where[64];
    wf_graph *g = new_graph(WF_STATIC);
    wf_node *xi = wf_placeholder(g, "xi", WF_I32, WF_SHAPE(1, 2, 8, 8));
    wf_node *y = wf_max_pool2d(g, xi, &(wf_pool2d_opts){ .window = { 2, 2 } });
    int line = __LINE__ - 1;
    check_error(g, y, WF_EDTYPE,
                (const char *[]){ "max_pool2d", "i32 [1, 2, 8, 8]", "f32, f64", AT(line), NULL });
    wf_graph_clear_error(g);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(1, 2, 8, 8));
    wf_node *dy64 = wf_placeholder(g, "dy64", WF_F64, WF_SHAPE(1, 2, 4, 4));
    check_error(g, wf_max_pool2d_backward(g, x, dy64, &(wf_pool2d_opts){ .window = { 2, 2 } }),
                WF_EDTYPE,
                (const char *[]){ "x is f32 [1, 2, 8, 8] but dy is f64 [1, 2, 4, 4]", NULL });
    wf_graph_clear_error(g);
    wf_node *dy = wf_placeholder(g, "dy", WF_F32, WF_SHAPE(1, 2, 4, 3));
    y = wf_max_pool2d_backward(g, x, dy, &(wf_pool2d_opts){ .window = { 2, 2 } });
    line = __LINE__ - 1;
    check_error(
        g, y, WF_ESHAPE,
        (const char *[]){ "max_pool2d_backward",
                          "dy is [1, 2, 4, 3] but pooling x [1, 2, 8, 8] gives [1, 2, 4, 4]",
                          AT(line), NULL });
    wf_graph_clear_error(g);
    check_error(g,
                wf_avg_pool2d_backward(g, dy, WF_SHAPE(1, 2, 8, 8),
                                       &(wf_pool2d_opts){ .window = { 2, 2 } }),
                WF_ESHAPE, (const char *[]){ "avg_pool2d_backward", "dy is [1, 2, 4, 3]", NULL });
    wf_graph_clear_error(g);
    check_error(g,
                wf_avg_pool2d_backward(g, dy, WF_SHAPE(1, 2, -1, 8),
                                       &(wf_pool2d_opts){ .window = { 2, 2 } }),
                WF_EINVAL, (const char *[]){ "x_shape is [1, 2, ?, 8]", "stride 2", NULL });
    wf_graph_destroy(g);
}

/* ---- Workers ------------------------------------------------------------------------------- */

Test(ops_pool, results_are_bitwise_equal_with_one_and_two_workers)
{
    wf_runtime *rt1 = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 1, .flags = WF_RT_NO_PIN });
    const pool_cfg c = {
        4, 16, 32, 30, { .window = { 3, 3 }, .stride = { 2, 2 }, .padding = { 1, 1, 1, 1 } }
    };
    int64_t nx = nn_numel(x_shape(&c)), ny = nn_numel(y_shape(&c));
    double *x = malloc((size_t)nx * sizeof *x), *r = malloc((size_t)ny * sizeof *r);
    double *y = malloc((size_t)ny * sizeof *y), *dx = malloc((size_t)nx * sizeof *dx);
    nn_random(x, nx, 31);
    nn_random(r, ny, 32);
    static const wf_dtype dts[2] = { WF_F32, WF_F64 };
    for (int t = 0; t < 2; t++) {
        const wf_tensor *vals[NN_RUNS][4];
        /* 1 worker, then 2 workers eight times (each a different split, the same bits). */
        wf_runtime *rts[NN_RUNS] = { rt1, rt, rt, rt, rt, rt, rt, rt, rt };
        wf_graph *gs[NN_RUNS];
        for (int m = 0; m < NN_RUNS; m++)
            gs[m] = wf_graph_create(rts[m], WF_EAGER);
        for (int m = 0; m < NN_RUNS; m++) {
            wf_graph *g = gs[m];
            wf_node *xn = cst(g, dts[t], x_shape(&c), x), *rn = cst(g, dts[t], y_shape(&c), r);
            wf_node *ys[4] = { wf_max_pool2d(g, xn, &c.o), wf_avg_pool2d(g, xn, &c.o),
                               wf_max_pool2d_backward(g, xn, rn, &c.o),
                               wf_avg_pool2d_backward(g, rn, x_shape(&c), &c.o) };
            for (int i = 0; i < 4; i++) {
                cr_assert_not_null(ys[i], "%s", wf_graph_errmsg(g));
                vals[m][i] = wf_node_value(ys[i]);
            }
        }
        for (int i = 0; i < 4; i++) {
            char what[64];
            snprintf(what, sizeof what, "%s op %d", wf_dtype_name(dts[t]), i);
            for (int m = 1; m < NN_RUNS; m++)
                nn_same_bits(what, vals[0][i], vals[m][i]);
            if (dts[t] != WF_F64)
                continue;
            ref_pool(&c, i % 2 == 0, x, i < 2 ? y : NULL, i < 2 ? NULL : r, i < 2 ? NULL : dx);
            int64_t n = i < 2 ? ny : nx;
            double *got = malloc((size_t)n * sizeof *got);
            cr_assert_eq(wf_tensor_read(vals[0][i], WF_F64, got, (size_t)n * sizeof *got), 0);
            nn_close(what, got, i < 2 ? y : dx, NULL, n, 1e-12);
            free(got);
        }
        for (int m = 0; m < NN_RUNS; m++)
            wf_graph_destroy(gs[m]);
    }
    free(x);
    free(r);
    free(y);
    free(dx);
    wf_runtime_destroy(rt1);
}
