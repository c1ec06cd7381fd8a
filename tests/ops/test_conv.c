/* tests/ops/test_conv.c: conv2d and its backward ops (weft/nn.h) through the public API:
 * eager values against a naive 7-loop f64 reference over many configurations (stride,
 * asymmetric padding, dilation, groups up to depthwise, non-square and 1x1 kernels) in f64
 * (tolerance 1e-12), f32 (1e-5) and bf16/f16 (1e-2), each relative to the sum of |terms| of
 * the output element; strided inputs (NHWC memory viewed as NCHW, sliced, transposed w);
 * backward_input and backward_filter against central finite differences of
 * L = sum(conv2d(x, w) * R) in f64; a -1 batch through static sessions; every error with its
 * code and a message naming the shapes and the file:line; the same bits with 1 and 2
 * workers, on shapes big enough for the kernels to split. */
#include "nn_util.h"

TestSuite(ops_conv, .init = setup, .fini = teardown, .timeout = WF_TEST_TIMEOUT(120));

typedef struct conv_cfg {
    int64_t N, C, H, W, O, KH, KW;
    wf_conv2d_opts o;
} conv_cfg;

typedef struct conv_dims {
    int64_t sh, sw, pt, pl, dh, dw, G, Cg, Og, OH, OW;
} conv_dims;

static conv_dims dims_of(const conv_cfg *c)
{
    const wf_conv2d_opts *o = &c->o;
    conv_dims d = { .sh = o->stride[0] ? o->stride[0] : 1,
                    .sw = o->stride[1] ? o->stride[1] : 1,
                    .pt = o->padding[0],
                    .pl = o->padding[2],
                    .dh = o->dilation[0] ? o->dilation[0] : 1,
                    .dw = o->dilation[1] ? o->dilation[1] : 1,
                    .G = o->groups ? o->groups : 1 };
    d.Cg = c->C / d.G;
    d.Og = c->O / d.G;
    d.OH = (c->H + o->padding[0] + o->padding[1] - d.dh * (c->KH - 1) - 1) / d.sh + 1;
    d.OW = (c->W + o->padding[2] + o->padding[3] - d.dw * (c->KW - 1) - 1) / d.sw + 1;
    return d;
}

static wf_shape x_shape(const conv_cfg *c)
{
    return WF_SHAPE(c->N, c->C, c->H, c->W);
}

static wf_shape w_shape(const conv_cfg *c)
{
    return WF_SHAPE(c->O, c->C / dims_of(c).G, c->KH, c->KW);
}

static wf_shape y_shape(const conv_cfg *c)
{
    conv_dims d = dims_of(c);
    return WF_SHAPE(c->N, c->O, d.OH, d.OW);
}

/* The naive 7-loop convolution in f64. Forward: y and, per element, the sum of |terms|
 * ('yscale'). With 'dy': dx += w dy and dw += x dy over the same loops (any output may be
 * NULL). */
static void ref_conv(const conv_cfg *c, const double *x, const double *w, double *y, double *yscale,
                     const double *dy, double *dx, double *dw)
{
    conv_dims d = dims_of(c);
    if (dx)
        memset(dx, 0, (size_t)nn_numel(x_shape(c)) * sizeof *dx);
    if (dw)
        memset(dw, 0, (size_t)nn_numel(w_shape(c)) * sizeof *dw);
    for (int64_t n = 0; n < c->N; n++)
        for (int64_t o = 0; o < c->O; o++)
            for (int64_t i = 0; i < d.OH; i++)
                for (int64_t j = 0; j < d.OW; j++) {
                    int64_t yi = ((n * c->O + o) * d.OH + i) * d.OW + j, g = o / d.Og;
                    double acc = 0, abs_ = 0;
                    for (int64_t cc = 0; cc < d.Cg; cc++)
                        for (int64_t kh = 0; kh < c->KH; kh++)
                            for (int64_t kw = 0; kw < c->KW; kw++) {
                                int64_t ih = i * d.sh - d.pt + kh * d.dh;
                                int64_t iw = j * d.sw - d.pl + kw * d.dw;
                                if (ih < 0 || ih >= c->H || iw < 0 || iw >= c->W)
                                    continue;
                                int64_t xi = ((n * c->C + g * d.Cg + cc) * c->H + ih) * c->W + iw;
                                int64_t wi = ((o * d.Cg + cc) * c->KH + kh) * c->KW + kw;
                                acc += w[wi] * x[xi];
                                abs_ += fabs(w[wi] * x[xi]);
                                if (dx)
                                    dx[xi] += w[wi] * dy[yi];
                                if (dw)
                                    dw[wi] += x[xi] * dy[yi];
                            }
                    if (y)
                        y[yi] = acc;
                    if (yscale)
                        yscale[yi] = abs_ + 1e-300;
                }
}

static wf_node *conv_node(wf_graph *g, wf_dtype dt, const conv_cfg *c, const double *x,
                          const double *w)
{
    return wf_conv2d(g, cst(g, dt, x_shape(c), x), cst(g, dt, w_shape(c), w), &c->o);
}

static const conv_cfg configs[] = {
    { 2, 3, 7, 6, 4, 3, 3, { .groups = 0 } },
    { 2, 4, 9, 8, 6, 3, 2, { .stride = { 2, 2 }, .padding = { 1, 0, 2, 1 }, .groups = 2 } },
    { 1,
      4,
      10,
      9,
      4,
      3,
      3,
      { .stride = { 1, 2 }, .padding = { 2, 2, 1, 1 }, .dilation = { 2, 2 }, .groups = 4 } },
    { 3, 6, 5, 5, 4, 1, 1, { .groups = 0 } },
    { 2, 4, 6, 7, 6, 1, 1, { .stride = { 2, 2 }, .padding = { 1, 0, 0, 1 }, .groups = 2 } },
    { 1,
      2,
      12,
      11,
      3,
      5,
      3,
      { .stride = { 3, 2 }, .padding = { 0, 2, 1, 0 }, .dilation = { 1, 3 } } },
    { 2, 3, 6, 6, 6, 3, 3, { .padding = { 1, 1, 1, 1 }, .groups = 3 } }, /* depthwise x2 */
    { 1, 5, 4, 3, 2, 4, 3, { .groups = 0 } },                            /* kernel = input */
    { 2, 2, 5, 5, 3, 2, 2, { .stride = { 4, 4 }, .padding = { 1, 1, 1, 1 } } },
};
#define N_CONFIGS (sizeof configs / sizeof configs[0])

static void check_forward(const conv_cfg *c, int k, wf_dtype dt, double tol)
{
    wf_graph *g = new_graph(WF_EAGER);
    int64_t nx = nn_numel(x_shape(c)), nw = nn_numel(w_shape(c)), ny = nn_numel(y_shape(c));
    double *x = malloc((size_t)nx * sizeof *x), *w = malloc((size_t)nw * sizeof *w);
    double *y = malloc((size_t)ny * sizeof *y), *sc = malloc((size_t)ny * sizeof *sc);
    nn_random(x, nx, 100 + (uint64_t)k);
    nn_random(w, nw, 200 + (uint64_t)k);
    if (dt != WF_F64) { /* the reference sees the values the kernel sees */
        wf_node *xr = cst(g, dt, x_shape(c), x), *wr = cst(g, dt, w_shape(c), w);
        cr_assert_eq(wf_tensor_read(wf_node_value(xr), WF_F64, x, (size_t)nx * sizeof *x), 0);
        cr_assert_eq(wf_tensor_read(wf_node_value(wr), WF_F64, w, (size_t)nw * sizeof *w), 0);
    }
    ref_conv(c, x, w, y, sc, NULL, NULL, NULL);
    char what[64];
    snprintf(what, sizeof what, "config %d %s", k, wf_dtype_name(dt));
    wf_node *yn = conv_node(g, dt, c, x, w);
    cr_assert_not_null(yn, "%s: %s", what, wf_graph_errmsg(g));
    cr_assert_eq(wf_node_dtype(yn), dt, "%s", what);
    double *got = nn_read(g, yn, y_shape(c), what);
    nn_close(what, got, y, sc, ny, tol);
    free(got);
    free(x);
    free(w);
    free(y);
    free(sc);
    wf_graph_destroy(g);
}

Test(ops_conv, forward_matches_the_naive_reference_in_f64)
{
    for (size_t k = 0; k < N_CONFIGS; k++)
        check_forward(&configs[k], (int)k, WF_F64, 1e-12);
}

Test(ops_conv, forward_matches_the_naive_reference_in_f32)
{
    for (size_t k = 0; k < N_CONFIGS; k++)
        check_forward(&configs[k], (int)k, WF_F32, 1e-5);
}

Test(ops_conv, forward_in_bf16_and_f16_is_computed_in_f32_and_rounded)
{
    for (size_t k = 0; k < 3; k++) {
        check_forward(&configs[k], (int)k, WF_BF16, 1e-2);
        check_forward(&configs[k], (int)k, WF_F16, 2e-3);
    }
}

Test(ops_conv, null_options_mean_stride_1_no_padding_one_group)
{
    const conv_cfg c = { 1, 2, 4, 4, 3, 3, 3, { .groups = 0 } };
    wf_graph *g = new_graph(WF_EAGER);
    double x[32], w[54], y[12], sc[12];
    nn_random(x, 32, 1);
    nn_random(w, 54, 2);
    ref_conv(&c, x, w, y, sc, NULL, NULL, NULL);
    wf_node *yn =
        wf_conv2d(g, cst(g, WF_F64, x_shape(&c), x), cst(g, WF_F64, w_shape(&c), w), NULL);
    double *got = nn_read(g, yn, WF_SHAPE(1, 3, 2, 2), "NULL opts");
    nn_close("NULL opts", got, y, sc, 12, 1e-12);
    free(got);
    wf_graph_destroy(g);
}

/* x [N, C, H, W] stored as NHWC (a permuted view) and as every other column of a wider
 * buffer; w [O, Cg, KH, KW] stored as [KH, KW, Cg, O]. */
Test(ops_conv, forward_reads_strided_views_of_x_and_w)
{
    const conv_cfg cs[2] = {
        { 2, 4, 6, 5, 6, 3, 2, { .stride = { 1, 2 }, .padding = { 1, 1, 0, 1 }, .groups = 2 } },
        { 2, 4, 6, 5, 6, 1, 1, { .groups = 0 } }, /* the 1x1 path that reads x as a matrix */
    };
    for (int k = 0; k < 2; k++) {
        const conv_cfg *c = &cs[k];
        conv_dims d = dims_of(c);
        int64_t nx = nn_numel(x_shape(c)), nw = nn_numel(w_shape(c)), ny = nn_numel(y_shape(c));
        double x[240], w[72], y[400], sc[400], nhwc[240], wide[480], wt[72];
        cr_assert(nx <= 240 && nw <= 72 && ny <= 400);
        nn_random(x, nx, 7);
        nn_random(w, nw, 8);
        ref_conv(c, x, w, y, sc, NULL, NULL, NULL);
        for (int64_t n = 0; n < c->N; n++)
            for (int64_t ch = 0; ch < c->C; ch++)
                for (int64_t i = 0; i < c->H; i++)
                    for (int64_t j = 0; j < c->W; j++) {
                        double v = x[((n * c->C + ch) * c->H + i) * c->W + j];
                        nhwc[((n * c->H + i) * c->W + j) * c->C + ch] = v;
                        wide[(((n * c->C + ch) * c->H + i) * c->W + j) * 2] = v;
                        wide[(((n * c->C + ch) * c->H + i) * c->W + j) * 2 + 1] = NAN;
                    }
        for (int64_t o = 0; o < c->O; o++)
            for (int64_t ch = 0; ch < d.Cg; ch++)
                for (int64_t i = 0; i < c->KH; i++)
                    for (int64_t j = 0; j < c->KW; j++)
                        wt[((i * c->KW + j) * d.Cg + ch) * c->O + o] =
                            w[((o * d.Cg + ch) * c->KH + i) * c->KW + j];
        const int64_t st_nhwc[4] = { c->H * c->W * c->C, 1, c->W * c->C, c->C };
        const int64_t st_wide[4] = { 2 * c->C * c->H * c->W, 2 * c->H * c->W, 2 * c->W, 2 };
        const int64_t st_wt[4] = { 1, c->O, c->KW * d.Cg * c->O, d.Cg * c->O };
        wf_graph *g = new_graph(WF_EAGER);
        wf_node *wv = view(g, w_shape(c), st_wt, wt), *wc = cst(g, WF_F64, w_shape(c), w);
        wf_node *xs[2] = { view(g, x_shape(c), st_nhwc, nhwc), view(g, x_shape(c), st_wide, wide) };
        for (int v = 0; v < 2; v++) {
            char what[64];
            snprintf(what, sizeof what, "config %d view %d", k, v);
            double *got = nn_read(g, wf_conv2d(g, xs[v], v ? wc : wv, &c->o), y_shape(c), what);
            nn_close(what, got, y, sc, ny, 1e-12);
            free(got);
        }
        wf_graph_destroy(g);
    }
}

/* ---- Backward ops against finite differences ------------------------------------------------ */

/* L = sum(conv2d(x, w) * R), conv2d by weft in f64. */
static double loss(const conv_cfg *c, const double *x, const double *w, const double *r)
{
    wf_graph *g = new_graph(WF_EAGER);
    wf_node *y = conv_node(g, WF_F64, c, x, w);
    cr_assert_not_null(y, "%s", wf_graph_errmsg(g));
    const double *v = wf_tensor_data_f64(wf_node_value(y));
    cr_assert_not_null(v);
    double l = 0;
    for (int64_t i = 0; i < nn_numel(y_shape(c)); i++)
        l += v[i] * r[i];
    wf_graph_destroy(g);
    return l;
}

/* Central differences of loss() with respect to each element of 'p' (x or w, 'n' values). */
static void finite_diff(const conv_cfg *c, double *x, double *w, const double *r, double *p,
                        int64_t n, double *out)
{
    const double h = 1e-3; /* L is linear in p: only rounding limits the accuracy */
    for (int64_t i = 0; i < n; i++) {
        double keep = p[i];
        p[i] = keep + h;
        double lp = loss(c, x, w, r);
        p[i] = keep - h;
        double lm = loss(c, x, w, r);
        p[i] = keep;
        out[i] = (lp - lm) / (2 * h);
    }
}

static const conv_cfg grad_configs[] = {
    { 2, 4, 5, 5, 4, 3, 3, { .padding = { 1, 1, 1, 1 }, .groups = 2 } },
    { 1, 3, 7, 6, 2, 3, 2, { .stride = { 2, 2 }, .padding = { 0, 1, 1, 0 } } },
    { 2,
      2,
      7,
      7,
      2,
      3,
      3,
      { .dilation = { 2, 1 }, .stride = { 1, 2 }, .padding = { 2, 0, 1, 1 } } },
    { 1, 4, 6, 5, 4, 3, 3, { .padding = { 1, 1, 1, 1 }, .groups = 4, .stride = { 2, 1 } } },
    { 2, 3, 4, 4, 2, 1, 1, { .groups = 0 } },
    { 1, 2, 5, 6, 3, 1, 1, { .stride = { 2, 3 }, .padding = { 1, 0, 0, 1 } } },
};

Test(ops_conv, backward_ops_match_finite_differences_of_sum_conv2d_times_r)
{
    for (size_t k = 0; k < sizeof grad_configs / sizeof grad_configs[0]; k++) {
        const conv_cfg *c = &grad_configs[k];
        int64_t nx = nn_numel(x_shape(c)), nw = nn_numel(w_shape(c)), ny = nn_numel(y_shape(c));
        double *x = malloc((size_t)nx * sizeof *x), *w = malloc((size_t)nw * sizeof *w);
        double *r = malloc((size_t)ny * sizeof *r), *fdx = malloc((size_t)nx * sizeof *fdx);
        double *fdw = malloc((size_t)nw * sizeof *fdw);
        nn_random(x, nx, 300 + k);
        nn_random(w, nw, 400 + k);
        nn_random(r, ny, 500 + k);
        finite_diff(c, x, w, r, x, nx, fdx);
        finite_diff(c, x, w, r, w, nw, fdw);
        wf_graph *g = new_graph(WF_EAGER);
        wf_node *xn = cst(g, WF_F64, x_shape(c), x), *wn = cst(g, WF_F64, w_shape(c), w);
        wf_node *rn = cst(g, WF_F64, y_shape(c), r);
        char what[64];
        snprintf(what, sizeof what, "config %zu dx", k);
        double *dx =
            nn_read(g, wf_conv2d_backward_input(g, rn, wn, x_shape(c), &c->o), x_shape(c), what);
        nn_close(what, dx, fdx, NULL, nx, 1e-8);
        snprintf(what, sizeof what, "config %zu dw", k);
        double *dw =
            nn_read(g, wf_conv2d_backward_filter(g, xn, rn, w_shape(c), &c->o), w_shape(c), what);
        nn_close(what, dw, fdw, NULL, nw, 1e-8);
        /* f32 backward ops agree with the f64 ones. */
        wf_node *x32 = cst(g, WF_F32, x_shape(c), x), *w32 = cst(g, WF_F32, w_shape(c), w);
        wf_node *r32 = cst(g, WF_F32, y_shape(c), r);
        double *dx32 = nn_read(g, wf_conv2d_backward_input(g, r32, w32, x_shape(c), &c->o),
                               x_shape(c), "dx f32");
        double *dw32 = nn_read(g, wf_conv2d_backward_filter(g, x32, r32, w_shape(c), &c->o),
                               w_shape(c), "dw f32");
        nn_close("dx f32", dx32, dx, NULL, nx, 1e-5);
        nn_close("dw f32", dw32, dw, NULL, nw, 1e-5);
        free(dx);
        free(dw);
        free(dx32);
        free(dw32);
        wf_graph_destroy(g);
        free(x);
        free(w);
        free(r);
        free(fdx);
        free(fdw);
    }
}

Test(ops_conv, backward_ops_read_strided_dy_and_w)
{
    const conv_cfg c = { 2, 2, 5, 4, 3, 2, 2, { .padding = { 1, 0, 0, 1 } } };
    int64_t nx = 80, nw = 24, ny = 2 * 3 * 5 * 4;
    cr_assert_eq(nn_numel(y_shape(&c)), ny);
    double x[80], w[24], r[120], dx[80], dw[24], wide_r[240], wt[24];
    nn_random(x, nx, 11);
    nn_random(w, nw, 12);
    nn_random(r, ny, 13);
    ref_conv(&c, x, w, NULL, NULL, r, dx, dw);
    for (int64_t i = 0; i < ny; i++) {
        wide_r[2 * i] = r[i];
        wide_r[2 * i + 1] = NAN;
    }
    for (int64_t o = 0; o < 3; o++) /* w as [O, Cg, KH, KW] with O the fastest axis */
        for (int64_t k = 0; k < 8; k++)
            wt[k * 3 + o] = w[o * 8 + k];
    const int64_t st_r[4] = { 2 * 60, 2 * 20, 2 * 4, 2 };
    const int64_t st_w[4] = { 1, 12, 6, 3 };
    wf_graph *g = new_graph(WF_EAGER);
    wf_node *rv = view(g, y_shape(&c), st_r, wide_r), *wv = view(g, w_shape(&c), st_w, wt);
    double *got = nn_read(g, wf_conv2d_backward_input(g, rv, wv, x_shape(&c), &c.o), x_shape(&c),
                          "dx strided");
    nn_close("dx strided", got, dx, NULL, nx, 1e-12);
    free(got);
    /* x transposed in H and W: a view with swapped strides. */
    double xt[80];
    for (int64_t nc = 0; nc < 4; nc++)
        for (int64_t i = 0; i < 5; i++)
            for (int64_t j = 0; j < 4; j++)
                xt[nc * 20 + j * 5 + i] = x[nc * 20 + i * 4 + j];
    const int64_t st_x[4] = { 40, 20, 1, 5 };
    wf_node *xv = view(g, x_shape(&c), st_x, xt);
    got = nn_read(g, wf_conv2d_backward_filter(g, xv, rv, w_shape(&c), &c.o), w_shape(&c),
                  "dw strided");
    nn_close("dw strided", got, dw, NULL, nw, 1e-12);
    free(got);
    wf_graph_destroy(g);
}

/* x as every other channel of a wider tensor: a 1x1 convolution reads it as a matrix with a
 * row stride of two planes (no im2col), forward and for the filter gradient. */
Test(ops_conv, one_by_one_kernels_read_a_channel_slice_of_x_in_place)
{
    const conv_cfg c = { 2, 3, 4, 5, 4, 1, 1, { .groups = 0 } };
    double x[120], w[12], r[160], y[160], sc[160], dx[120], dw[12], wide[240];
    nn_random(x, 120, 41);
    nn_random(w, 12, 42);
    nn_random(r, 160, 43);
    ref_conv(&c, x, w, y, sc, r, dx, dw);
    for (int64_t n = 0; n < 2; n++)
        for (int64_t ch = 0; ch < 6; ch++)
            for (int64_t p = 0; p < 20; p++)
                wide[(n * 6 + ch) * 20 + p] = ch % 2 ? NAN : x[(n * 3 + ch / 2) * 20 + p];
    const int64_t st[4] = { 120, 40, 5, 1 };
    wf_graph *g = new_graph(WF_EAGER);
    wf_node *xv = view(g, x_shape(&c), st, wide), *wn = cst(g, WF_F64, w_shape(&c), w);
    wf_node *rn = cst(g, WF_F64, y_shape(&c), r);
    double *got = nn_read(g, wf_conv2d(g, xv, wn, &c.o), y_shape(&c), "y");
    nn_close("y", got, y, sc, 160, 1e-12);
    free(got);
    got = nn_read(g, wf_conv2d_backward_filter(g, xv, rn, w_shape(&c), &c.o), w_shape(&c), "dw");
    nn_close("dw", got, dw, NULL, 12, 1e-12);
    free(got);
    got = nn_read(g, wf_conv2d_backward_input(g, rn, wn, x_shape(&c), &c.o), x_shape(&c), "dx");
    nn_close("dx", got, dx, NULL, 120, 1e-12);
    free(got);
    wf_graph_destroy(g);
}

/* ---- Static graphs: -1 batch -------------------------------------------------------------- */

Test(ops_conv, minus_one_batch_flows_through_inference_and_static_sessions)
{
    const conv_cfg c3 = { 3, 3, 8, 8, 4, 3, 3, { .stride = { 2, 2 }, .padding = { 1, 1, 1, 1 } } };
    wf_graph *g = new_graph(WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(-1, 3, 8, 8));
    double w[108];
    nn_random(w, 108, 21);
    wf_node *wn = cst(g, WF_F32, w_shape(&c3), w);
    wf_node *y = wf_conv2d(g, x, wn, &c3.o);
    cr_assert_not_null(y, "%s", wf_graph_errmsg(g));
    cr_assert(wf_shape_equal(wf_node_shape(y), WF_SHAPE(-1, 4, 4, 4)));
    /* The backward ops keep the -1 too: dx's batch comes from dy, dw has w's shape. */
    wf_node *dx = wf_conv2d_backward_input(g, y, wn, WF_SHAPE(-1, 3, 8, 8), &c3.o);
    wf_node *dw = wf_conv2d_backward_filter(g, x, y, w_shape(&c3), &c3.o);
    cr_assert_not_null(dx, "%s", wf_graph_errmsg(g));
    cr_assert_not_null(dw, "%s", wf_graph_errmsg(g));
    cr_assert(wf_shape_equal(wf_node_shape(dx), WF_SHAPE(-1, 3, 8, 8)));
    cr_assert(wf_shape_equal(wf_node_shape(dw), w_shape(&c3)));
    wf_session *s = NULL;
    cr_assert_eq(wf_session_create(g, NULL, &s), 0, "%s", wf_graph_errmsg(g));
    for (int64_t N = 1; N <= 3; N += 2) {
        conv_cfg c = c3;
        c.N = N;
        int64_t nx = nn_numel(x_shape(&c)), ny = nn_numel(y_shape(&c));
        double xv[192 * 3], yr[64 * 3], sc[64 * 3], dxr[192 * 3], dwr[108];
        nn_random(xv, nx, 22 + (uint64_t)N);
        float xf[192 * 3];
        for (int64_t i = 0; i < nx; i++)
            xf[i] = (float)xv[i];
        for (int64_t i = 0; i < nx; i++)
            xv[i] = xf[i];
        double wr[108];
        for (int i = 0; i < 108; i++)
            wr[i] = (float)w[i];
        ref_conv(&c, xv, wr, yr, sc, NULL, NULL, NULL);
        wf_tensor *xt = wf_tensor_from(WF_F32, x_shape(&c), xf);
        wf_tensor *outs[3] = { NULL, NULL, NULL };
        wf_node *fetch[3] = { y, dx, dw };
        int rc = wf_session_run(s, &(wf_feed){ x, xt }, 1, fetch, 3, outs, NULL, 0);
        cr_assert_eq(rc, 0, "%s", wf_session_errmsg(s));
        cr_assert(wf_shape_equal(wf_tensor_shape(outs[0]), y_shape(&c)));
        cr_assert(wf_shape_equal(wf_tensor_shape(outs[1]), x_shape(&c)));
        double got[192 * 3];
        cr_assert_eq(wf_tensor_read(outs[0], WF_F64, got, sizeof got), 0);
        nn_close("session y", got, yr, sc, ny, 1e-5);
        /* dx and dw from the f32 y itself, against the reference's. */
        double yf[64 * 3];
        cr_assert_eq(wf_tensor_read(outs[0], WF_F64, yf, sizeof yf), 0);
        ref_conv(&c, xv, wr, NULL, NULL, yf, dxr, dwr);
        cr_assert_eq(wf_tensor_read(outs[1], WF_F64, got, sizeof got), 0);
        nn_close("session dx", got, dxr, NULL, nx, 1e-4);
        cr_assert_eq(wf_tensor_read(outs[2], WF_F64, got, sizeof got), 0);
        nn_close("session dw", got, dwr, NULL, 108, 1e-4);
        for (int i = 0; i < 3; i++)
            wf_tensor_release(outs[i]);
        wf_tensor_release(xt);
    }
    wf_session_destroy(s);
    wf_graph_destroy(g);
}

Test(ops_conv, unknown_height_in_x_shape_is_taken_from_dy_with_stride_1)
{
    wf_graph *g = new_graph(WF_STATIC);
    wf_node *dy = wf_placeholder(g, "dy", WF_F64, WF_SHAPE(-1, 4, -1, 6));
    wf_node *w = wf_placeholder(g, "w", WF_F64, WF_SHAPE(4, 2, 3, 3));
    const wf_conv2d_opts o = { .padding = { 1, 0, 1, 1 } };
    wf_node *dx = wf_conv2d_backward_input(g, dy, w, WF_SHAPE(-1, 2, -1, 6), &o);
    cr_assert_not_null(dx, "%s", wf_graph_errmsg(g));
    cr_assert(wf_shape_equal(wf_node_shape(dx), WF_SHAPE(-1, 2, -1, 6)));
    wf_session *s = NULL;
    cr_assert_eq(wf_session_create(g, NULL, &s), 0, "%s", wf_graph_errmsg(g));
    wf_tensor *dyt = wf_tensor_from(WF_F64, WF_SHAPE(2, 4, 5, 6), NULL);
    wf_tensor *wt = wf_tensor_from(WF_F64, WF_SHAPE(4, 2, 3, 3), NULL);
    wf_tensor *out = NULL;
    wf_feed feeds[2] = { { dy, dyt }, { w, wt } };
    cr_assert_eq(wf_session_run(s, feeds, 2, &dx, 1, &out, NULL, 0), 0, "%s", wf_session_errmsg(s));
    /* 5 output rows of a 3-row kernel with 1 row of padding on top: 6 input rows. */
    cr_assert(wf_shape_equal(wf_tensor_shape(out), WF_SHAPE(2, 2, 6, 6)));
    wf_tensor_release(out);
    wf_tensor_release(dyt);
    wf_tensor_release(wt);
    wf_session_destroy(s);
    wf_graph_destroy(g);
}

/* A placeholder of unknown size gives an output of unknown size; each run infers it from the
 * fed shape, and a feed too small for the kernel fails that run only, naming the node. */
Test(ops_conv, unknown_spatial_sizes_are_inferred_per_run_and_checked)
{
    wf_graph *g = new_graph(WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F64, WF_SHAPE(-1, 2, -1, -1));
    wf_node *w = wf_placeholder(g, "w", WF_F64, WF_SHAPE(3, 2, 3, 2));
    const wf_conv2d_opts o = { .stride = { 2, 1 }, .dilation = { 1, 2 } };
    wf_node *y = wf_conv2d(g, x, w, &o);
    cr_assert_not_null(y, "%s", wf_graph_errmsg(g));
    cr_assert(wf_shape_equal(wf_node_shape(y), WF_SHAPE(-1, 3, -1, -1)));
    wf_session *s = NULL;
    cr_assert_eq(wf_session_create(g, NULL, &s), 0, "%s", wf_graph_errmsg(g));
    wf_tensor *wt = wf_tensor_from(WF_F64, WF_SHAPE(3, 2, 3, 2), NULL);
    wf_tensor *xt = wf_tensor_from(WF_F64, WF_SHAPE(1, 2, 7, 5), NULL);
    wf_tensor *out = NULL;
    wf_feed feeds[2] = { { x, xt }, { w, wt } };
    cr_assert_eq(wf_session_run(s, feeds, 2, &y, 1, &out, NULL, 0), 0, "%s", wf_session_errmsg(s));
    cr_assert(wf_shape_equal(wf_tensor_shape(out), WF_SHAPE(1, 3, 3, 3)));
    wf_tensor_release(out);
    out = NULL;
    wf_tensor *small = wf_tensor_from(WF_F64, WF_SHAPE(1, 2, 7, 2), NULL);
    feeds[0].value = small;
    int rc = wf_session_run(s, feeds, 2, &y, 1, &out, NULL, 0);
    cr_assert_eq(rc, WF_ESHAPE, "got %s: %s", wf_err_name(rc), wf_session_errmsg(s));
    cr_assert(strstr(wf_session_errmsg(s), "conv2d") &&
                  strstr(wf_session_errmsg(s), "[1, 2, 7, 2]") &&
                  strstr(wf_session_errmsg(s), "output width would be 0"),
              "%s", wf_session_errmsg(s));
    cr_assert_null(out);
    wf_tensor_release(small);
    wf_tensor_release(xt);
    wf_tensor_release(wt);
    wf_session_destroy(s);
    wf_graph_destroy(g);
}

/* ---- Errors ---------------------------------------------------------------------------------- */

#define AT(line) nn_at("test_conv.c", line, where, sizeof where)

Test(ops_conv, wrong_ranks_fail_with_eshape_naming_both_shapes)
{
    char where[64];
    wf_graph *g = new_graph(WF_EAGER);
    wf_node *x3 = cst(g, WF_F32, WF_SHAPE(3, 8, 8), (double[192]){ 0 });
    wf_node *w = cst(g, WF_F32, WF_SHAPE(4, 3, 3, 3), (double[108]){ 0 });
    wf_node *y = wf_conv2d(g, x3, w, NULL);
    int line = __LINE__ - 1;
    check_error(g, y, WF_ESHAPE,
                (const char *[]){ "conv2d", "x is [3, 8, 8]", "w is [4, 3, 3, 3]", "rank 4",
                                  AT(line), NULL });
    wf_graph_clear_error(g);
    wf_node *x = cst(g, WF_F32, WF_SHAPE(1, 3, 8, 8), (double[192]){ 0 });
    wf_node *w2 = cst(g, WF_F32, WF_SHAPE(4, 27), (double[108]){ 0 });
    check_error(g, wf_conv2d(g, x, w2, NULL), WF_ESHAPE,
                (const char *[]){ "[1, 3, 8, 8]", "[4, 27]", "rank 4", NULL });
    wf_graph_destroy(g);
}

Test(ops_conv, channel_mismatch_fails_naming_channels_and_groups)
{
    char where[64];
    wf_graph *g = new_graph(WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(2, 3, 8, 8));
    wf_node *w = wf_placeholder(g, "w", WF_F32, WF_SHAPE(4, 2, 3, 3));
    wf_node *y = wf_conv2d(g, x, w, NULL);
    int line = __LINE__ - 1;
    check_error(g, y, WF_ESHAPE,
                (const char *[]){ "conv2d",
                                  "x is [2, 3, 8, 8] but w is [4, 2, 3, 3]: x has 3 channels, w "
                                  "expects 2 x groups 1",
                                  AT(line), NULL });
    wf_graph_destroy(g);
}

Test(ops_conv, groups_that_do_not_divide_the_channels_fail)
{
    char where[64];
    wf_graph *g = new_graph(WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(2, 3, 8, 8));
    wf_node *w = wf_placeholder(g, "w", WF_F32, WF_SHAPE(4, 1, 3, 3));
    wf_node *y = wf_conv2d(g, x, w, &(wf_conv2d_opts){ .groups = 2 });
    int line = __LINE__ - 1;
    check_error(g, y, WF_ESHAPE,
                (const char *[]){ "[2, 3, 8, 8]", "[4, 1, 3, 3]",
                                  "groups 2 does not divide the 3 channels", AT(line), NULL });
    wf_graph_clear_error(g);
    wf_node *x4 = wf_placeholder(g, "x4", WF_F32, WF_SHAPE(2, 4, 8, 8));
    wf_node *w3 = wf_placeholder(g, "w3", WF_F32, WF_SHAPE(3, 2, 3, 3));
    check_error(
        g, wf_conv2d(g, x4, w3, &(wf_conv2d_opts){ .groups = 2 }), WF_ESHAPE,
        (const char *[]){ "[2, 4, 8, 8]", "[3, 2, 3, 3]", "groups 2 does not divide its 3", NULL });
    wf_graph_destroy(g);
}

Test(ops_conv, a_kernel_larger_than_the_padded_input_fails_with_no_output)
{
    char where[64];
    wf_graph *g = new_graph(WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(1, 1, 4, 4));
    wf_node *w = wf_placeholder(g, "w", WF_F32, WF_SHAPE(1, 1, 5, 5));
    wf_node *y = wf_conv2d(g, x, w, NULL);
    int line = __LINE__ - 1;
    check_error(g, y, WF_ESHAPE,
                (const char *[]){ "[1, 1, 4, 4]", "[1, 1, 5, 5]", "kernel height (5",
                                  "padded input height 4", "output height would be 0", AT(line),
                                  NULL });
    wf_graph_clear_error(g);
    /* With padding it fits: [1, 1, 2, 2]. */
    wf_node *ok = wf_conv2d(g, x, w, &(wf_conv2d_opts){ .padding = { 1, 1, 1, 1 } });
    cr_assert_not_null(ok, "%s", wf_graph_errmsg(g));
    cr_assert(wf_shape_equal(wf_node_shape(ok), WF_SHAPE(1, 1, 2, 2)));
    /* Dilation makes a 3-tap kernel span 7 columns of a 5-wide input. */
    wf_node *x5 = wf_placeholder(g, "x5", WF_F32, WF_SHAPE(1, 1, 9, 5));
    wf_node *w3 = wf_placeholder(g, "w3", WF_F32, WF_SHAPE(1, 1, 3, 3));
    check_error(g, wf_conv2d(g, x5, w3, &(wf_conv2d_opts){ .dilation = { 3, 3 } }), WF_ESHAPE,
                (const char *[]){ "[1, 1, 9, 5]", "kernel width (7 with dilation 3)",
                                  "output width would be 0", NULL });
    wf_graph_destroy(g);
}

Test(ops_conv, negative_options_fail_with_einval)
{
    char where[64];
    wf_graph *g = new_graph(WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(1, 2, 8, 8));
    wf_node *w = wf_placeholder(g, "w", WF_F32, WF_SHAPE(2, 2, 3, 3));
    wf_node *y = wf_conv2d(g, x, w, &(wf_conv2d_opts){ .padding = { 0, 0, -1, 0 } });
    int line = __LINE__ - 1;
    check_error(g, y, WF_EINVAL,
                (const char *[]){ "[1, 2, 8, 8]", "[2, 2, 3, 3]", "padding [0, 0, -1, 0]",
                                  "negative", AT(line), NULL });
    wf_graph_clear_error(g);
    check_error(g, wf_conv2d(g, x, w, &(wf_conv2d_opts){ .stride = { 1, -2 } }), WF_EINVAL,
                (const char *[]){ "stride [1, -2]", "[1, 2, 8, 8]", NULL });
    wf_graph_clear_error(g);
    check_error(g, wf_conv2d(g, x, w, &(wf_conv2d_opts){ .dilation = { -1, 1 } }), WF_EINVAL,
                (const char *[]){ "dilation [-1, 1]", NULL });
    wf_graph_clear_error(g);
    check_error(g, wf_conv2d(g, x, w, &(wf_conv2d_opts){ .groups = -2 }), WF_EINVAL,
                (const char *[]){ "groups -2", NULL });
    wf_graph_destroy(g);
}

Test(ops_conv, dtype_mismatch_and_integer_dtypes_fail_with_edtype)
{
    char where[64];
    wf_graph *g = new_graph(WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(1, 2, 8, 8));
    wf_node *w = wf_placeholder(g, "w", WF_F64, WF_SHAPE(2, 2, 3, 3));
    wf_node *y = wf_conv2d(g, x, w, NULL);
    int line = __LINE__ - 1;
    check_error(
        g, y, WF_EDTYPE,
        (const char *[]){ "x is f32 [1, 2, 8, 8] but w is f64 [2, 2, 3, 3]", AT(line), NULL });
    wf_graph_clear_error(g);
    wf_node *xi = wf_placeholder(g, "xi", WF_I32, WF_SHAPE(1, 2, 8, 8));
    wf_node *wi = wf_placeholder(g, "wi", WF_I32, WF_SHAPE(2, 2, 3, 3));
    check_error(g, wf_conv2d(g, xi, wi, NULL), WF_EDTYPE,
                (const char *[]){ "i32", "[1, 2, 8, 8]", "[2, 2, 3, 3]", "f32, f64", NULL });
    wf_graph_clear_error(g);
    wf_node *dy = wf_placeholder(g, "dy", WF_F64, WF_SHAPE(1, 2, 6, 6));
    check_error(g, wf_conv2d_backward_filter(g, x, dy, WF_SHAPE(2, 2, 3, 3), NULL), WF_EDTYPE,
                (const char *[]){ "x is f32 [1, 2, 8, 8] but dy is f64 [1, 2, 6, 6]", NULL });
    wf_graph_destroy(g);
}

Test(ops_conv, backward_ops_refuse_a_dy_of_the_wrong_shape_and_unknowable_shapes)
{
    char where[64];
    wf_graph *g = new_graph(WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(2, 3, 8, 8));
    wf_node *w = wf_placeholder(g, "w", WF_F32, WF_SHAPE(4, 3, 3, 3));
    wf_node *dy = wf_placeholder(g, "dy", WF_F32, WF_SHAPE(2, 4, 5, 6));
    wf_node *dx = wf_conv2d_backward_input(g, dy, w, WF_SHAPE(2, 3, 8, 8), NULL);
    int line = __LINE__ - 1;
    check_error(g, dx, WF_ESHAPE,
                (const char *[]){ "conv2d_backward_input",
                                  "dy is [2, 4, 5, 6] but conv2d of x_shape [2, 3, 8, 8] with w "
                                  "[4, 3, 3, 3] gives [2, 4, 6, 6]",
                                  AT(line), NULL });
    wf_graph_clear_error(g);
    check_error(g, wf_conv2d_backward_filter(g, x, dy, WF_SHAPE(4, 3, 3, 3), NULL), WF_ESHAPE,
                (const char *[]){ "conv2d_backward_filter", "dy is [2, 4, 5, 6]",
                                  "gives [2, 4, 6, 6]", NULL });
    wf_graph_clear_error(g);
    wf_node *dy2 = wf_placeholder(g, "dy2", WF_F32, WF_SHAPE(2, 4, 3, 3));
    check_error(g,
                wf_conv2d_backward_input(g, dy2, w, WF_SHAPE(2, 3, -1, 8),
                                         &(wf_conv2d_opts){ .stride = { 2, 2 } }),
                WF_EINVAL,
                (const char *[]){ "x_shape is [2, 3, ?, 8]", "height", "stride 2", NULL });
    wf_graph_clear_error(g);
    check_error(g, wf_conv2d_backward_filter(g, x, dy, WF_SHAPE(-1, 3, 3, 3), NULL), WF_EINVAL,
                (const char *[]){ "w_shape is [?, 3, 3, 3]", "known", NULL });
    wf_graph_clear_error(g);
    check_error(g, wf_conv2d_backward_input(g, dy, w, WF_SHAPE(2, 3, 8), NULL), WF_ESHAPE,
                (const char *[]){ "x_shape is [2, 3, 8]", "rank 4", NULL });
    wf_graph_destroy(g);
}

/* ---- Workers ------------------------------------------------------------------------------- */

/* conv2d, backward_input and backward_filter once on a 1-worker and eight times on a 2-worker
 * runtime: the same bits every time (each config is big enough to split: a data race or a
 * split that depends on the workers shows), and the values match the reference. */
Test(ops_conv, results_are_bitwise_equal_with_one_and_two_workers)
{
    wf_runtime *rt1 = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 1, .flags = WF_RT_NO_PIN });
    /* Every config is above the kernels' threshold for splitting (2^21 flops). */
    const conv_cfg cs[] = {
        /* batch items; the filter gradient's sum in 4 chunks */
        { 4, 16, 20, 20, 32, 3, 3, { .padding = { 1, 1, 1, 1 } } },
        /* groups, stride, asymmetric padding */
        { 3, 8, 48, 40, 16, 3, 3, { .stride = { 2, 1 }, .padding = { 1, 0, 2, 1 }, .groups = 2 } },
        /* one image, 1x1: channel blocks of dx, two pixel tiles */
        { 1, 32, 64, 72, 32, 1, 1, { .groups = 0 } },
        /* depthwise, dilated */
        { 4,
          16,
          64,
          64,
          16,
          3,
          3,
          { .dilation = { 2, 2 }, .groups = 16, .padding = { 2, 2, 2, 2 } } },
        /* K = 576 taps: three im2col tiles per image */
        { 2, 64, 24, 24, 8, 3, 3, { .padding = { 1, 1, 1, 1 } } },
    };
    static const wf_dtype dts[2] = { WF_F32, WF_F64 };
    for (size_t k = 0; k < sizeof cs / sizeof cs[0]; k++) {
        const conv_cfg *c = &cs[k];
        int64_t nx = nn_numel(x_shape(c)), nw = nn_numel(w_shape(c)), ny = nn_numel(y_shape(c));
        double *x = malloc((size_t)nx * sizeof *x), *w = malloc((size_t)nw * sizeof *w);
        double *r = malloc((size_t)ny * sizeof *r), *y = malloc((size_t)ny * sizeof *y);
        double *sc = malloc((size_t)ny * sizeof *sc), *dx = malloc((size_t)nx * sizeof *dx);
        double *dw = malloc((size_t)nw * sizeof *dw);
        nn_random(x, nx, 600 + k);
        nn_random(w, nw, 700 + k);
        nn_random(r, ny, 800 + k);
        ref_conv(c, x, w, y, sc, r, dx, dw);
        for (int t = 0; t < 2; t++) {
            wf_dtype dt = dts[t];
            double tol = dt == WF_F32 ? 1e-4 : 1e-10;
            const wf_tensor *vals[NN_RUNS][3];
            /* 1 worker, then 2 workers eight times (each a different split, the same bits). */
            wf_runtime *rts[NN_RUNS] = { rt1, rt, rt, rt, rt, rt, rt, rt, rt };
            wf_graph *gs[NN_RUNS];
            for (int m = 0; m < NN_RUNS; m++)
                gs[m] = wf_graph_create(rts[m], WF_EAGER);
            for (int m = 0; m < NN_RUNS; m++) {
                wf_graph *g = gs[m];
                cr_assert_not_null(g);
                wf_node *xn = cst(g, dt, x_shape(c), x), *wn = cst(g, dt, w_shape(c), w);
                wf_node *rn = cst(g, dt, y_shape(c), r);
                wf_node *ys[3] = { wf_conv2d(g, xn, wn, &c->o),
                                   wf_conv2d_backward_input(g, rn, wn, x_shape(c), &c->o),
                                   wf_conv2d_backward_filter(g, xn, rn, w_shape(c), &c->o) };
                for (int i = 0; i < 3; i++) {
                    cr_assert_not_null(ys[i], "%s", wf_graph_errmsg(g));
                    vals[m][i] = wf_node_value(ys[i]);
                }
            }
            static const char *const names[3] = { "y", "dx", "dw" };
            for (int i = 0; i < 3; i++) {
                char what[64];
                snprintf(what, sizeof what, "config %zu %s %s", k, wf_dtype_name(dt), names[i]);
                for (int m = 1; m < NN_RUNS; m++)
                    nn_same_bits(what, vals[0][i], vals[m][i]);
                int64_t n = wf_tensor_numel(vals[0][i]);
                double *got = malloc((size_t)n * sizeof *got);
                cr_assert_eq(wf_tensor_read(vals[0][i], WF_F64, got, (size_t)n * sizeof *got), 0);
                /* The gradients' sums mix signs: scale by the largest reference value. */
                const double *want = i == 0 ? y : i == 1 ? dx : dw;
                double big = 0;
                for (int64_t e = 0; e < n; e++)
                    big = fmax(big, fabs(want[e]));
                double *scale = malloc((size_t)n * sizeof *scale);
                for (int64_t e = 0; e < n; e++)
                    scale[e] = i == 0 ? sc[e] : fmax(big, 1.0);
                nn_close(what, got, want, scale, n, tol);
                free(scale);
                free(got);
            }
            for (int m = 0; m < NN_RUNS; m++)
                wf_graph_destroy(gs[m]);
        }
        free(x);
        free(w);
        free(r);
        free(y);
        free(sc);
        free(dx);
        free(dw);
    }
    wf_runtime_destroy(rt1);
}
