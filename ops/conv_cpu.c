/* ops/conv_cpu.c: CPU kernels of conv2d and its two backward ops (NCHW), as im2col + GEMM on
 * weft's private single-threaded OpenBLAS (wf__gemm(), ops/blas.c), and wf__nn_contiguous(),
 * shared with pool_cpu.c.
 * Owns: the convolution geometry, im2col and col2im, and how each kernel is cut into items:
 * - conv2d: item (image, group, tile of output pixels): im2col of the tile, then one GEMM
 *   out[n, group] (Og x tile) = w[group] (Og x K) col (K x tile), K = C/groups KH KW.
 * - backward_input: item (image, group, block of input channels): per pixel tile one GEMM
 *   dcol = w[group, block]^T dy[n, group, tile], then col2im adds dcol into dx in a fixed
 *   order; an item owns its block of dx, so no two items write one element.
 * - backward_filter: the batch and pixel sum is cut into at most CV_BWF_CHUNKS chunks of
 *   consecutive (image, pixel tile) slabs; a chunk accumulates dy col^T over its slabs into
 *   its own buffer (chunk 0 into out), and the buffers are added into out in chunk order.
 * Invariant (determinism): items, tiles, channel blocks and chunks depend on the shapes
 *   only; ctx->rt only decides which worker runs which item, so the bits never depend on the
 *   number of workers (nor on whether there is a runtime).
 * A 1x1 kernel with stride 1 and no padding needs no im2col: x's plane already is the column
 *   matrix (when its rows are contiguous), and dx is written by the GEMM directly.
 * Strided inputs: x is read through its strides by im2col (no copy); w and dy, which GEMMs
 *   read as matrices, are copied to contiguous when they are not (wf__nn_contiguous()).
 *   bf16 and f16 inputs are converted to f32 copies, the result computed in f32 and rounded
 *   once into out.
 * Scratch (the im2col tile, the partial sums) is malloc'ed per task and freed before it
 *   returns; failure is WF_ENOMEM with the sizes named.
 * GEMMs run on the calling worker (wf__gemm() is safe to call from several at once), so the
 *   items above run in parallel, GEMMs included.
 * Not here: the op definitions and shape inference (conv.c), pools (pool_cpu.c). */
#include "../core/error.h"
#include "../core/tensor.h"
#include "kernels.h"

#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define CV_COL_ELEMS  (1 << 17)  /* the im2col tile of one task, elements (512 KiB in f32) */
#define CV_PAR_FLOPS  (1 << 21)  /* convolutions below this run on the calling thread */
#define CV_ITEMS      16         /* backward_input splits channels until it has this many items */
#define CV_BWF_CHUNKS 8          /* at most this many partial sums of the filter gradient */
#define CV_PART_BYTES (32 << 20) /* and at most this many bytes of them */

#define SH(s, buf) wf_shape_str((s), (buf), sizeof(buf))

typedef struct cv_geom {
    int64_t N, C, H, W, O, KH, KW, OH, OW;
    int64_t G, Cg, Og, K, P;        /* groups; channels, outputs and taps per group; pixels */
    int64_t sh, sw, pt, pl, dh, dw; /* stride, top and left padding, dilation */
    int64_t tile, n_tiles;          /* output pixels per im2col tile (fixed by K), per image */
    bool unit;                      /* 1x1 kernel, stride 1, no padding: no im2col needed */
    double flops;                   /* 2 N O P K */
} cv_geom;

typedef struct cv_plan {
    cv_geom g;
    wf_dtype dt;
    int64_t es;
    const char *x; /* x at [0, 0, 0, 0] and its strides in elements */
    int64_t xst[4];
    bool x_direct;      /* unit and x's planes have contiguous rows: x is the column matrix */
    const char *w, *dy; /* contiguous */
    char *out;
    /* backward_input: channels per block, blocks per group, pixels per dcol tile */
    int64_t cblk, n_cblk, bi_tile;
    /* backward_filter: slabs (image, pixel tile), chunks, and the partial buffers */
    int64_t n_slabs, n_chunks;
    char *parts;
} cv_plan;

static const char *const cv_names[] = { "conv2d", "conv2d_backward_input",
                                        "conv2d_backward_filter" };

enum { CV_FWD, CV_BWD_INPUT, CV_BWD_FILTER };

/* ---- Shared helpers -------------------------------------------------------------------------- */

int wf__nn_contiguous(const wf_kctx *ctx, const wf_tensor *t, wf_dtype dt, wf_tensor **out)
{
    if (t->contiguous && t->dtype == dt) {
        *out = wf_tensor_retain((wf_tensor *)t); /* tensors are immutable: sharing is safe */
        return 0;
    }
    *out = wf__tensor_alloc(dt, t->shape);
    if (!*out)
        return WF_ENOMEM;
    int rc = wf__cast_cpu(ctx, t, *out);
    if (rc < 0) {
        wf_tensor_release(*out);
        *out = NULL;
    }
    return rc;
}

int wf__run_via_f32(const wf_kctx *ctx, const wf_tensor *a, const wf_tensor *b, wf_tensor *out,
                    wf_f32_fn fn, const void *arg)
{
    wf_tensor *fa = NULL, *fb = NULL, *fo = NULL;
    int rc = wf__nn_contiguous(ctx, a, WF_F32, &fa);
    if (rc >= 0)
        rc = wf__nn_contiguous(ctx, b, WF_F32, &fb);
    if (rc >= 0 && !(fo = wf__tensor_alloc(WF_F32, out->shape)))
        rc = WF_ENOMEM;
    if (rc >= 0)
        rc = fn(ctx, arg, fa, fb, fo);
    if (rc >= 0)
        rc = wf__cast_cpu(ctx, fo, out);
    wf_tensor_release(fa);
    wf_tensor_release(fb);
    wf_tensor_release(fo);
    return rc;
}

/* im2col of channels [0, cn) of one image and group of x (at 'x', strides 'xst') for output
 * pixels [p0, p0 + np): col[(c KH + kh) KW + kw][p - p0], zeros where the tap is padding.
 * col2im is its adjoint: dx[c, ih, iw] += col[...] for every tap inside x (dx a contiguous
 * [cn, H, W] block). Both walk taps and pixels in one fixed order. */
#define DEF_COLS(T, SUF)                                                                         \
    static void im2col_##SUF(const cv_geom *g, const T *x, const int64_t *xst, int64_t cn,       \
                             int64_t p0, int64_t np, T *col)                                     \
    {                                                                                            \
        for (int64_t c = 0; c < cn; c++)                                                         \
            for (int64_t kh = 0; kh < g->KH; kh++)                                               \
                for (int64_t kw = 0; kw < g->KW; kw++) {                                         \
                    T *row = col + ((c * g->KH + kh) * g->KW + kw) * np;                         \
                    int64_t oh = p0 / g->OW, ow = p0 % g->OW, iw0 = kw * g->dw - g->pl;          \
                    for (int64_t j = 0; j < np; oh++, ow = 0) {                                  \
                        int64_t seg = g->OW - ow < np - j ? g->OW - ow : np - j;                 \
                        int64_t ih = oh * g->sh - g->pt + kh * g->dh;                            \
                        if (ih < 0 || ih >= g->H) {                                              \
                            memset(row + j, 0, (size_t)seg * sizeof(T));                         \
                        } else {                                                                 \
                            const T *xr = x + c * xst[1] + ih * xst[2];                          \
                            for (int64_t q = 0; q < seg; q++) {                                  \
                                int64_t iw = (ow + q) * g->sw + iw0;                             \
                                row[j + q] = iw >= 0 && iw < g->W ? xr[iw * xst[3]] : (T)0;      \
                            }                                                                    \
                        }                                                                        \
                        j += seg;                                                                \
                    }                                                                            \
                }                                                                                \
    }                                                                                            \
    static void col2im_##SUF(const cv_geom *g, const T *col, int64_t cn, int64_t p0, int64_t np, \
                             T *dx)                                                              \
    {                                                                                            \
        for (int64_t c = 0; c < cn; c++)                                                         \
            for (int64_t kh = 0; kh < g->KH; kh++)                                               \
                for (int64_t kw = 0; kw < g->KW; kw++) {                                         \
                    const T *row = col + ((c * g->KH + kh) * g->KW + kw) * np;                   \
                    int64_t oh = p0 / g->OW, ow = p0 % g->OW, iw0 = kw * g->dw - g->pl;          \
                    for (int64_t j = 0; j < np; oh++, ow = 0) {                                  \
                        int64_t seg = g->OW - ow < np - j ? g->OW - ow : np - j;                 \
                        int64_t ih = oh * g->sh - g->pt + kh * g->dh;                            \
                        if (ih >= 0 && ih < g->H) {                                              \
                            T *dr = dx + (c * g->H + ih) * g->W;                                 \
                            for (int64_t q = 0; q < seg; q++) {                                  \
                                int64_t iw = (ow + q) * g->sw + iw0;                             \
                                if (iw >= 0 && iw < g->W)                                        \
                                    dr[iw] += row[j + q];                                        \
                            }                                                                    \
                        }                                                                        \
                        j += seg;                                                                \
                    }                                                                            \
                }                                                                                \
    }

DEF_COLS(float, f32)
DEF_COLS(double, f64)

static void im2col(const cv_plan *pl, const char *x, int64_t cn, int64_t p0, int64_t np, void *col)
{
    if (pl->dt == WF_F32)
        im2col_f32(&pl->g, (const float *)x, pl->xst, cn, p0, np, col);
    else
        im2col_f64(&pl->g, (const double *)x, pl->xst, cn, p0, np, col);
}

static void col2im(const cv_plan *pl, const void *col, int64_t cn, int64_t p0, int64_t np, char *dx)
{
    if (pl->dt == WF_F32)
        col2im_f32(&pl->g, col, cn, p0, np, (float *)dx);
    else
        col2im_f64(&pl->g, col, cn, p0, np, (double *)dx);
}

/* x of image n, group gi, channel 0 of the group. */
static const char *x_at(const cv_plan *pl, int64_t n, int64_t gi)
{
    return pl->x + (n * pl->xst[0] + gi * pl->g.Cg * pl->xst[1]) * pl->es;
}

/* The column matrix of (n, gi) for pixels [p0, p0 + np): x itself when direct (its row stride
 * in '*ld'), else im2col into 'col'. */
static const void *columns(const cv_plan *pl, int64_t n, int64_t gi, int64_t p0, int64_t np,
                           void *col, int64_t *ld)
{
    const char *x = x_at(pl, n, gi);
    if (pl->x_direct) {
        *ld = pl->g.Cg > 1 ? pl->xst[1] : pl->g.P;
        return x + p0 * pl->es;
    }
    im2col(pl, x, pl->g.Cg, p0, np, col);
    *ld = np;
    return col;
}

static void *scratch(const char *op, int64_t elems, int64_t es)
{
    void *p = malloc((size_t)(elems > 0 ? elems : 1) * (size_t)es);
    if (!p)
        wf__err(WF_ENOMEM, "%s: no memory for a scratch buffer of %lld elements", op,
                (long long)elems);
    return p;
}

/* ---- Geometry ------------------------------------------------------------------------------ */

/* Checks 'p' and the shapes of x (named 'xn') and w against each other and fills 'g'. */
static int geom(const char *op, const wf_conv_params *p, const char *xn, wf_shape xs,
                const char *wn, wf_shape ws, cv_geom *g)
{
    char s1[160], s2[160];
    if (!p)
        return wf__err(WF_EINVAL, "%s: params is NULL", op);
    int64_t sh = p->stride[0] ? p->stride[0] : 1, sw = p->stride[1] ? p->stride[1] : 1;
    int64_t dh = p->dilation[0] ? p->dilation[0] : 1, dw = p->dilation[1] ? p->dilation[1] : 1;
    int64_t G = p->groups ? p->groups : 1;
    if (sh < 1 || sw < 1 || dh < 1 || dw < 1 || G < 1 || p->padding[0] < 0 || p->padding[1] < 0 ||
        p->padding[2] < 0 || p->padding[3] < 0)
        return wf__err(WF_EINVAL,
                       "%s: %s is %s and %s is %s: stride [%d, %d], dilation [%d, %d], groups %d "
                       "and padding [%d, %d, %d, %d] must not be negative",
                       op, xn, SH(xs, s1), wn, SH(ws, s2), p->stride[0], p->stride[1],
                       p->dilation[0], p->dilation[1], p->groups, p->padding[0], p->padding[1],
                       p->padding[2], p->padding[3]);
    if (xs.rank != 4 || ws.rank != 4)
        return wf__err(WF_ESHAPE, "%s: %s is %s and %s is %s; both must have rank 4", op, xn,
                       SH(xs, s1), wn, SH(ws, s2));
    *g = (cv_geom){ .N = xs.dims[0],
                    .C = xs.dims[1],
                    .H = xs.dims[2],
                    .W = xs.dims[3],
                    .O = ws.dims[0],
                    .KH = ws.dims[2],
                    .KW = ws.dims[3],
                    .G = G,
                    .sh = sh,
                    .sw = sw,
                    .dh = dh,
                    .dw = dw,
                    .pt = p->padding[0],
                    .pl = p->padding[2] };
    g->Cg = ws.dims[1];
    if (g->O % G != 0 || g->C % G != 0 || g->C != g->Cg * G)
        return wf__err(WF_ESHAPE,
                       "%s: %s is %s but %s is %s: %s has %lld channels, %s expects "
                       "%lld x groups %lld (groups must divide both channel counts)",
                       op, xn, SH(xs, s1), wn, SH(ws, s2), xn, (long long)g->C, wn,
                       (long long)g->Cg, (long long)G);
    int64_t span_h = dh * (g->KH - 1) + 1, span_w = dw * (g->KW - 1) + 1;
    int64_t ph = g->H + p->padding[0] + p->padding[1], pw = g->W + p->padding[2] + p->padding[3];
    if (span_h > ph || span_w > pw)
        return wf__err(WF_ESHAPE,
                       "%s: %s is %s but %s is %s: the dilated kernel %lld x %lld is larger than "
                       "the padded input %lld x %lld",
                       op, xn, SH(xs, s1), wn, SH(ws, s2), (long long)span_h, (long long)span_w,
                       (long long)ph, (long long)pw);
    g->OH = (ph - span_h) / sh + 1;
    g->OW = (pw - span_w) / sw + 1;
    g->Og = g->O / G;
    g->K = g->Cg * g->KH * g->KW;
    g->P = g->OH * g->OW;
    if (g->K > INT_MAX || g->P > INT_MAX || g->Og > INT_MAX)
        return wf__err(WF_EINVAL, "%s: %s is %s and %s is %s: a GEMM dimension exceeds BLAS's int",
                       op, xn, SH(xs, s1), wn, SH(ws, s2));
    g->unit = g->KH == 1 && g->KW == 1 && sh == 1 && sw == 1 && p->padding[0] == 0 &&
              p->padding[1] == 0 && p->padding[2] == 0 && p->padding[3] == 0;
    int64_t t = CV_COL_ELEMS / (g->K > 0 ? g->K : 1);
    g->tile = t < 1 ? 1 : t > g->P ? (g->P > 0 ? g->P : 1) : t;
    g->n_tiles = (g->P + g->tile - 1) / g->tile;
    g->flops = 2.0 * (double)g->N * (double)g->O * (double)g->P * (double)g->K;
    return 0;
}

/* x is read in place as the column matrix when its planes have contiguous rows. */
static bool x_direct(const cv_geom *g, const int64_t *xst)
{
    return g->unit && (g->W <= 1 || xst[3] == 1) && (g->H <= 1 || xst[2] == g->W) &&
           (g->Cg <= 1 || (xst[1] >= g->P && xst[1] <= INT_MAX));
}

static int check_dy(const char *op, const cv_geom *g, const wf_tensor *dy, wf_shape xs, wf_shape ws)
{
    wf_shape want = { .rank = 4, .dims = { g->N, g->O, g->OH, g->OW } };
    if (wf_shape_equal(dy->shape, want))
        return 0;
    char s1[160], s2[160], s3[160], s4[160];
    return wf__err(WF_ESHAPE, "%s: dy is %s but conv2d of x %s with w %s gives %s", op,
                   SH(dy->shape, s1), SH(xs, s2), SH(ws, s3), SH(want, s4));
}

static bool use_workers(const wf_kctx *ctx, const cv_geom *g, int64_t items)
{
    return ctx && ctx->rt && items > 1 && g->flops >= CV_PAR_FLOPS;
}

/* ---- conv2d -------------------------------------------------------------------------------- */

static int fwd_items(void *ctx, int64_t lo, int64_t hi)
{
    const cv_plan *pl = ctx;
    const cv_geom *g = &pl->g;
    void *col = NULL;
    if (!pl->x_direct && !(col = scratch("conv2d", g->K * g->tile, pl->es)))
        return WF_ENOMEM;
    for (int64_t k = lo; k < hi; k++) {
        int64_t t = k % g->n_tiles, gi = (k / g->n_tiles) % g->G, n = k / g->n_tiles / g->G;
        int64_t p0 = t * g->tile, np = g->P - p0 < g->tile ? g->P - p0 : g->tile, ld;
        const void *b = columns(pl, n, gi, p0, np, col, &ld);
        wf__gemm(pl->dt, false, false, g->Og, np, g->K, pl->w + gi * g->Og * g->K * pl->es, g->K, b,
                 ld, false, pl->out + ((n * g->O + gi * g->Og) * g->P + p0) * pl->es, g->P);
    }
    free(col);
    return 0;
}

static int conv2d_run(const wf_kctx *ctx, const cv_plan *base, const wf_tensor *x,
                      const wf_tensor *w, wf_tensor *out)
{
    cv_plan pl = *base;
    wf_tensor *wc = NULL;
    int rc = wf__nn_contiguous(ctx, w, pl.dt, &wc);
    if (rc < 0)
        return rc;
    pl.x = x->data;
    memcpy(pl.xst, x->strides, sizeof pl.xst);
    pl.x_direct = x_direct(&pl.g, pl.xst);
    pl.w = wc->data;
    pl.out = out->data;
    int64_t items = pl.g.N * pl.g.G * pl.g.n_tiles;
    if (pl.g.Og > 0 && pl.g.P > 0 && items > 0) {
        if (use_workers(ctx, &pl.g, items))
            rc = wf_parallel_for(ctx->rt, 0, items, 1, fwd_items, &pl);
        else
            rc = fwd_items(&pl, 0, items);
    }
    wf_tensor_release(wc);
    return rc;
}

/* ---- conv2d_backward_input --------------------------------------------------------------------
 */

static int bi_items(void *ctx, int64_t lo, int64_t hi)
{
    const cv_plan *pl = ctx;
    const cv_geom *g = &pl->g;
    int64_t taps = g->KH * g->KW, es = pl->es;
    void *col = NULL;
    if (!g->unit && !(col = scratch("conv2d_backward_input", pl->cblk * taps * pl->bi_tile, es)))
        return WF_ENOMEM;
    for (int64_t k = lo; k < hi; k++) {
        int64_t b = k % pl->n_cblk, gi = (k / pl->n_cblk) % g->G, n = k / pl->n_cblk / g->G;
        int64_t c0 = b * pl->cblk, cn = g->Cg - c0 < pl->cblk ? g->Cg - c0 : pl->cblk;
        char *dx = pl->out + ((n * g->C + gi * g->Cg + c0) * g->H * g->W) * es;
        const char *w = pl->w + (gi * g->Og * g->K + c0 * taps) * es; /* column c0 KH KW */
        const char *dy = pl->dy + (n * g->O + gi * g->Og) * g->P * es;
        if (g->unit) { /* dx[block] (cn x P) = w[group][:, block]^T dy[n, group] */
            wf__gemm(pl->dt, true, false, cn, g->P, g->Og, w, g->K, dy, g->P, false, dx, g->P);
            continue;
        }
        memset(dx, 0, (size_t)(cn * g->H * g->W * es));
        for (int64_t p0 = 0; p0 < g->P; p0 += pl->bi_tile) {
            int64_t np = g->P - p0 < pl->bi_tile ? g->P - p0 : pl->bi_tile;
            wf__gemm(pl->dt, true, false, cn * taps, np, g->Og, w, g->K, dy + p0 * es, g->P, false,
                     col, np);
            col2im(pl, col, cn, p0, np, dx);
        }
    }
    free(col);
    return 0;
}

static int backward_input_run(const wf_kctx *ctx, const cv_plan *base, const wf_tensor *dy,
                              const wf_tensor *w, wf_tensor *out)
{
    cv_plan pl = *base;
    const cv_geom *g = &pl.g;
    if (out->numel == 0)
        return 0;
    wf_tensor *wc = NULL, *dyc = NULL;
    int rc = wf__nn_contiguous(ctx, w, pl.dt, &wc);
    if (rc >= 0)
        rc = wf__nn_contiguous(ctx, dy, pl.dt, &dyc);
    if (rc >= 0) {
        pl.w = wc->data;
        pl.dy = dyc->data;
        pl.out = out->data;
        /* Channel blocks: enough items for the workers, fixed by the shapes. */
        int64_t per = g->N * g->G, want = (CV_ITEMS + per - 1) / per;
        int64_t nb = want < g->Cg ? want : g->Cg;
        pl.cblk = nb > 0 ? (g->Cg + nb - 1) / nb : 1;
        pl.n_cblk = g->Cg > 0 ? (g->Cg + pl.cblk - 1) / pl.cblk : 0;
        int64_t rows = pl.cblk * g->KH * g->KW, t = CV_COL_ELEMS / (rows > 0 ? rows : 1);
        pl.bi_tile = t < 1 ? 1 : t > g->P ? g->P : t;
        int64_t items = g->N * g->G * pl.n_cblk;
        if (use_workers(ctx, g, items))
            rc = wf_parallel_for(ctx->rt, 0, items, 1, bi_items, &pl);
        else
            rc = bi_items(&pl, 0, items);
    }
    wf_tensor_release(wc);
    wf_tensor_release(dyc);
    return rc;
}

/* ---- conv2d_backward_filter -------------------------------------------------------------------
 */

static int bf_chunks(void *ctx, int64_t lo, int64_t hi)
{
    const cv_plan *pl = ctx;
    const cv_geom *g = &pl->g;
    int64_t es = pl->es;
    void *col = NULL;
    if (!pl->x_direct && !(col = scratch("conv2d_backward_filter", g->K * g->tile, es)))
        return WF_ENOMEM;
    for (int64_t c = lo; c < hi; c++) {
        char *dw = c == 0 ? pl->out : pl->parts + (c - 1) * g->O * g->K * es;
        int64_t s0 = c * pl->n_slabs / pl->n_chunks, s1 = (c + 1) * pl->n_slabs / pl->n_chunks;
        for (int64_t s = s0; s < s1; s++) {
            int64_t n = s / g->n_tiles, p0 = (s % g->n_tiles) * g->tile;
            int64_t np = g->P - p0 < g->tile ? g->P - p0 : g->tile;
            for (int64_t gi = 0; gi < g->G; gi++) {
                int64_t ld;
                const void *b = columns(pl, n, gi, p0, np, col, &ld);
                /* dw[group] (Og x K) += dy[n, group, tile] (Og x np) col^T (np x K) */
                const char *dy = pl->dy + ((n * g->O + gi * g->Og) * g->P + p0) * es;
                wf__gemm(pl->dt, false, true, g->Og, g->K, np, dy, g->P, b, ld, s > s0,
                         dw + gi * g->Og * g->K * es, g->K);
            }
        }
    }
    free(col);
    return 0;
}

#define DEF_ADD(T, SUF)                                                           \
    static void add_parts_##SUF(T *out, const T *parts, int64_t n, int64_t count) \
    {                                                                             \
        for (int64_t c = 0; c < count; c++)                                       \
            for (int64_t i = 0; i < n; i++)                                       \
                out[i] += parts[c * n + i];                                       \
    }

DEF_ADD(float, f32)
DEF_ADD(double, f64)

static int backward_filter_run(const wf_kctx *ctx, const cv_plan *base, const wf_tensor *x,
                               const wf_tensor *dy, wf_tensor *out)
{
    cv_plan pl = *base;
    const cv_geom *g = &pl.g;
    if (out->numel == 0)
        return 0;
    pl.n_slabs = g->N * g->n_tiles;
    if (pl.n_slabs == 0) { /* no images: the sum is empty */
        memset(out->data, 0, (size_t)(out->numel * pl.es));
        return 0;
    }
    wf_tensor *dyc = NULL;
    int rc = wf__nn_contiguous(ctx, dy, pl.dt, &dyc);
    if (rc < 0)
        return rc;
    pl.x = x->data;
    memcpy(pl.xst, x->strides, sizeof pl.xst);
    pl.x_direct = x_direct(g, pl.xst);
    pl.dy = dyc->data;
    pl.out = out->data;
    /* Chunks of the batch sum: fixed by the shapes (never by the runtime). */
    int64_t bytes = out->numel * pl.es, by_mem = CV_PART_BYTES / (bytes > 0 ? bytes : 1);
    int64_t nc = pl.n_slabs < CV_BWF_CHUNKS ? pl.n_slabs : CV_BWF_CHUNKS;
    if (nc > by_mem + 1)
        nc = by_mem + 1;
    if (g->flops < CV_PAR_FLOPS || nc < 1)
        nc = 1;
    pl.n_chunks = nc;
    if (nc > 1 && !(pl.parts = scratch("conv2d_backward_filter", (nc - 1) * out->numel, pl.es)))
        rc = WF_ENOMEM;
    if (rc >= 0) {
        if (use_workers(ctx, g, nc))
            rc = wf_parallel_for(ctx->rt, 0, nc, 1, bf_chunks, &pl);
        else
            rc = bf_chunks(&pl, 0, nc);
    }
    if (rc >= 0 && nc > 1) {
        if (pl.dt == WF_F32)
            add_parts_f32((float *)pl.out, (const float *)pl.parts, out->numel, nc - 1);
        else
            add_parts_f64((double *)pl.out, (const double *)pl.parts, out->numel, nc - 1);
    }
    free(pl.parts);
    wf_tensor_release(dyc);
    return rc;
}

/* ---- Entries ------------------------------------------------------------------------------- */

static int run(const wf_kctx *ctx, int kind, const cv_plan *pl, const wf_tensor *a,
               const wf_tensor *b, wf_tensor *out)
{
    if (kind == CV_FWD)
        return conv2d_run(ctx, pl, a, b, out);
    if (kind == CV_BWD_INPUT)
        return backward_input_run(ctx, pl, a, b, out);
    return backward_filter_run(ctx, pl, a, b, out);
}

/* bf16 and f16: the f32 result of f32 copies, rounded into 'out' (wf__run_via_f32). */
typedef struct half_arg {
    int kind;
    cv_plan pl;
} half_arg;

static int run_f32(const wf_kctx *ctx, const void *arg, const wf_tensor *a, const wf_tensor *b,
                   wf_tensor *out)
{
    const half_arg *h = arg;
    return run(ctx, h->kind, &h->pl, a, b, out);
}

static int run_half(const wf_kctx *ctx, int kind, const cv_plan *base, const wf_tensor *a,
                    const wf_tensor *b, wf_tensor *out)
{
    half_arg h = { kind, *base };
    h.pl.dt = WF_F32;
    h.pl.es = 4;
    return wf__run_via_f32(ctx, a, b, out, run_f32, &h);
}

/* Inputs a and b: (x, w), (dy, w) or (x, dy). Checks dtypes, shapes and out, then runs. */
static int entry(const wf_kctx *ctx, int kind, const wf_conv_params *p, const wf_tensor *a,
                 const wf_tensor *b, wf_tensor *out)
{
    const char *op = cv_names[kind];
    const char *an = kind == CV_BWD_INPUT ? "dy" : "x", *bn = kind == CV_BWD_FILTER ? "dy" : "w";
    char s1[160], s2[160];
    if (!a || !b || !out)
        return wf__err(WF_EINVAL, "%s: %s is NULL", op, !a ? an : !b ? bn : "out");
    if (a->dtype != b->dtype)
        return wf__err(WF_EDTYPE, "%s: %s is %s %s but %s is %s %s", op, an,
                       wf_dtype_name(a->dtype), SH(a->shape, s1), bn, wf_dtype_name(b->dtype),
                       SH(b->shape, s2));
    wf_dtype dt = a->dtype;
    if (!wf_dtype_is_float(dt))
        return wf__err(WF_EDTYPE, "%s: %s and %s are %s; %s takes f32, f64, bf16 or f16", op, an,
                       bn, wf_dtype_name(dt), op);
    cv_plan pl = { .dt = dt, .es = (int64_t)wf_dtype_size(dt) };
    wf_shape xs = kind == CV_FWD || kind == CV_BWD_FILTER ? a->shape : out->shape;
    wf_shape ws = kind == CV_BWD_FILTER ? out->shape : b->shape;
    int rc = geom(op, p, "x", xs, "w", ws, &pl.g);
    if (rc < 0)
        return rc;
    wf_shape ys = { .rank = 4, .dims = { pl.g.N, pl.g.O, pl.g.OH, pl.g.OW } };
    if (kind == CV_FWD)
        rc = wf__kernel_check_out(op, out, dt, ys);
    else
        rc = wf__kernel_check_out(op, out, dt, kind == CV_BWD_INPUT ? xs : ws);
    if (rc >= 0 && kind != CV_FWD)
        rc = check_dy(op, &pl.g, kind == CV_BWD_INPUT ? a : b, xs, ws);
    if (rc < 0)
        return rc;
    if (out->numel == 0)
        return 0;
    if (dt == WF_BF16 || dt == WF_F16)
        return run_half(ctx, kind, &pl, a, b, out);
    return run(ctx, kind, &pl, a, b, out);
}

int wf__conv2d_cpu(const wf_kctx *ctx, const wf_conv_params *p, const wf_tensor *x,
                   const wf_tensor *w, wf_tensor *out)
{
    return entry(ctx, CV_FWD, p, x, w, out);
}

int wf__conv2d_backward_input_cpu(const wf_kctx *ctx, const wf_conv_params *p, const wf_tensor *dy,
                                  const wf_tensor *w, wf_tensor *out)
{
    return entry(ctx, CV_BWD_INPUT, p, dy, w, out);
}

int wf__conv2d_backward_filter_cpu(const wf_kctx *ctx, const wf_conv_params *p, const wf_tensor *x,
                                   const wf_tensor *dy, wf_tensor *out)
{
    return entry(ctx, CV_BWD_FILTER, p, x, dy, out);
}
