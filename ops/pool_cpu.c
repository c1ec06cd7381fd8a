/* ops/pool_cpu.c: CPU kernels of max_pool2d, avg_pool2d and their backward ops (NCHW).
 * Owns: the window walk they share. Window (i, j) covers rows i stride_h - top .. + KH - 1
 *   and columns alike, clipped to x: padded positions are never read (the max ignores them,
 *   as -inf; the average counts them as zeros, in its divisor only with count_include_pad).
 *   The max of a window is its first NaN if it holds one, else its first maximum in
 *   row-major order; the backward op gives that same position the window's gradient.
 * Invariant (determinism): one item is one (image, channel) plane, computed by one worker
 *   alone in a fixed order (a backward plane adds its windows' gradients in window order),
 *   so the bits never depend on ctx->rt or its worker count.
 * Inputs are read through their strides (no copy); bf16 and f16 go through f32 copies
 *   (wf__nn_contiguous(), conv_cpu.c) and are rounded once into out. Sums of the average
 *   are taken in f64.
 * Not here: the op definitions and shape inference (pool.c). */
#include "../core/error.h"
#include "../core/tensor.h"
#include "kernels.h"
#include "layout.h"

#include <string.h>

#define PL_PAR_MIN 65536 /* pools reading fewer elements than this run on the calling thread */

#define SH(s, buf) wf_shape_str((s), (buf), sizeof(buf))

enum { PL_MAX, PL_AVG, PL_MAX_BWD, PL_AVG_BWD };

static const char *const pl_names[] = { "max_pool2d", "avg_pool2d", "max_pool2d_backward",
                                        "avg_pool2d_backward" };

typedef struct pl_plan {
    int kind;
    wf_dtype dt;
    int64_t es;
    wf__pool_geom g;
    const char *x, *dy;     /* element 0; either may be unused */
    int64_t xst[4], dst[4]; /* their strides in elements */
    char *out;              /* contiguous */
} pl_plan;

/* Rows [*lo, *hi) of x under window row 'o' (clipped to [0, in)). */
static void span(int64_t o, int64_t s, int64_t pad, int64_t k, int64_t in, int64_t *lo, int64_t *hi)
{
    int64_t a = o * s - pad, b = a + k;
    *lo = a < 0 ? 0 : a;
    *hi = b > in ? in : b;
}

/* One plane of one op, for T = float or double. The max loops keep the first NaN (once 'm'
 * is NaN nothing replaces it) or else the first strict maximum. */
#define DEF_PLANE(T, SUF)                                                                      \
    static void plane_##SUF(const pl_plan *p, int64_t plane)                                   \
    {                                                                                          \
        int64_t n = plane / p->g.C, c = plane % p->g.C;                                        \
        const T *x = p->x ? (const T *)p->x + n * p->xst[0] + c * p->xst[1] : NULL;            \
        const T *dy = p->dy ? (const T *)p->dy + n * p->dst[0] + c * p->dst[1] : NULL;         \
        bool bwd = p->kind == PL_MAX_BWD || p->kind == PL_AVG_BWD;                             \
        T *out = (T *)p->out + plane * (bwd ? p->g.H * p->g.W : p->g.OH * p->g.OW);            \
        if (bwd)                                                                               \
            memset(out, 0, (size_t)(p->g.H * p->g.W) * sizeof(T));                             \
        for (int64_t oh = 0; oh < p->g.OH; oh++) {                                             \
            int64_t h0, h1;                                                                    \
            span(oh, p->g.sh, p->g.pt, p->g.KH, p->g.H, &h0, &h1);                             \
            for (int64_t ow = 0; ow < p->g.OW; ow++) {                                         \
                int64_t w0, w1;                                                                \
                span(ow, p->g.sw, p->g.pl, p->g.KW, p->g.W, &w0, &w1);                         \
                if (p->kind == PL_MAX || p->kind == PL_MAX_BWD) {                              \
                    T m = x[h0 * p->xst[2] + w0 * p->xst[3]];                                  \
                    int64_t at = h0 * p->g.W + w0;                                             \
                    for (int64_t ih = h0; ih < h1 && m == m; ih++)                             \
                        for (int64_t iw = ih == h0 ? w0 + 1 : w0; iw < w1; iw++) {             \
                            T v = x[ih * p->xst[2] + iw * p->xst[3]];                          \
                            if (v > m || v != v) {                                             \
                                m = v;                                                         \
                                at = ih * p->g.W + iw;                                         \
                                if (v != v)                                                    \
                                    break;                                                     \
                            }                                                                  \
                        }                                                                      \
                    if (p->kind == PL_MAX)                                                     \
                        out[oh * p->g.OW + ow] = m;                                            \
                    else                                                                       \
                        out[at] += dy[oh * p->dst[2] + ow * p->dst[3]];                        \
                    continue;                                                                  \
                }                                                                              \
                double div =                                                                   \
                    p->g.incl ? (double)(p->g.KH * p->g.KW) : (double)((h1 - h0) * (w1 - w0)); \
                if (p->kind == PL_AVG) {                                                       \
                    double s = 0;                                                              \
                    for (int64_t ih = h0; ih < h1; ih++)                                       \
                        for (int64_t iw = w0; iw < w1; iw++)                                   \
                            s += x[ih * p->xst[2] + iw * p->xst[3]];                           \
                    out[oh * p->g.OW + ow] = (T)(s / div);                                     \
                } else {                                                                       \
                    T gv = (T)(dy[oh * p->dst[2] + ow * p->dst[3]] / div);                     \
                    for (int64_t ih = h0; ih < h1; ih++)                                       \
                        for (int64_t iw = w0; iw < w1; iw++)                                   \
                            out[ih * p->g.W + iw] += gv;                                       \
                }                                                                              \
            }                                                                                  \
        }                                                                                      \
    }

DEF_PLANE(float, f32)
DEF_PLANE(double, f64)

static int planes(void *ctx, int64_t lo, int64_t hi)
{
    const pl_plan *p = ctx;
    for (int64_t k = lo; k < hi; k++) {
        if (p->dt == WF_F32)
            plane_f32(p, k);
        else
            plane_f64(p, k);
    }
    return 0;
}

static int exec(const wf_kctx *ctx, const pl_plan *p)
{
    int64_t n_planes = p->g.N * p->g.C;
    int64_t per = p->g.OH * p->g.OW * p->g.KH * p->g.KW; /* reads per plane */
    if (n_planes == 0)
        return 0;
    if (ctx && ctx->rt && n_planes > 1 && per * n_planes >= PL_PAR_MIN) {
        int64_t grain = PL_PAR_MIN / 2 / (per > 0 ? per : 1);
        return wf_parallel_for(ctx->rt, 0, n_planes, grain > 0 ? grain : 1, planes, (void *)p);
    }
    return planes((void *)p, 0, n_planes);
}

/* bf16 and f16: the f32 result of f32 copies of x and dy, rounded into 'out'. */
static int exec_half(const wf_kctx *ctx, const pl_plan *base, const wf_tensor *x,
                     const wf_tensor *dy, wf_tensor *out)
{
    pl_plan p = *base;
    p.dt = WF_F32;
    p.es = 4;
    wf_tensor *fx = NULL, *fdy = NULL, *fo = NULL;
    int rc = x ? wf__nn_contiguous(ctx, x, WF_F32, &fx) : 0;
    if (rc >= 0 && dy)
        rc = wf__nn_contiguous(ctx, dy, WF_F32, &fdy);
    if (rc >= 0 && !(fo = wf__tensor_alloc(WF_F32, out->shape)))
        rc = WF_ENOMEM;
    if (rc >= 0) {
        p.x = fx ? fx->data : NULL;
        p.dy = fdy ? fdy->data : NULL;
        if (fx)
            memcpy(p.xst, fx->strides, sizeof p.xst);
        if (fdy)
            memcpy(p.dst, fdy->strides, sizeof p.dst);
        p.out = fo->data;
        rc = exec(ctx, &p);
    }
    if (rc >= 0)
        rc = wf__cast_cpu(ctx, fo, out);
    wf_tensor_release(fx);
    wf_tensor_release(fdy);
    wf_tensor_release(fo);
    return rc;
}

/* 'x' is the pool's input (NULL for avg backward, where out gives x's shape); 'dy' the
 * gradient of its output (backward ops only). */
int wf__ops_pool_check(const char *op, bool bwd, bool avg_bwd, const wf_pool_params *prm,
                       const wf_tensor *x, const wf_tensor *dy, const wf_tensor *out,
                       wf__pool_geom *g, wf_dtype *dt)
{
    char s1[160], s2[160], s3[160];
    if (!prm || !out || (!avg_bwd && !x) || (bwd && !dy))
        return wf__err(WF_EINVAL, "%s: %s is NULL", op,
                       !prm               ? "params"
                       : !out             ? "out"
                       : (!avg_bwd && !x) ? "x"
                                          : "dy");
    const wf_tensor *first = x ? x : dy;
    *dt = first->dtype;
    if (x && dy && x->dtype != dy->dtype)
        return wf__err(WF_EDTYPE, "%s: x is %s %s but dy is %s %s", op, wf_dtype_name(x->dtype),
                       SH(x->shape, s1), wf_dtype_name(dy->dtype), SH(dy->shape, s2));
    if (!wf_dtype_is_float(*dt))
        return wf__err(WF_EDTYPE, "%s: %s is %s %s; %s takes f32, f64, bf16 or f16", op,
                       x ? "x" : "dy", wf_dtype_name(*dt), SH(first->shape, s1), op);
    wf_shape xs = avg_bwd ? out->shape : x->shape;
    const int32_t *wn = prm->window, *st = prm->stride, *pd = prm->padding;
    *g = (wf__pool_geom){ .KH = wn[0],
                          .KW = wn[1],
                          .sh = st[0] ? st[0] : wn[0],
                          .sw = st[1] ? st[1] : wn[1],
                          .pt = pd[0],
                          .pl = pd[2],
                          .incl = prm->count_include_pad };
    bool bad = g->KH < 1 || g->KW < 1 || g->sh < 1 || g->sw < 1;
    for (int i = 0; i < 4; i++)
        bad = bad || pd[i] < 0 || pd[i] >= wn[i / 2];
    if (bad)
        return wf__err(WF_EINVAL,
                       "%s: x is %s: window [%d, %d], stride [%d, %d] and padding [%d, %d, %d, "
                       "%d]: the window must be positive, the stride not negative, each padding "
                       "in [0, window)",
                       op, SH(xs, s1), wn[0], wn[1], st[0], st[1], pd[0], pd[1], pd[2], pd[3]);
    if (xs.rank != 4)
        return wf__err(WF_ESHAPE, "%s: x is %s; it must have rank 4 (NCHW)", op, SH(xs, s1));
    g->N = xs.dims[0];
    g->C = xs.dims[1];
    g->H = xs.dims[2];
    g->W = xs.dims[3];
    int64_t ph = g->H + pd[0] + pd[1], pw = g->W + pd[2] + pd[3];
    if (g->KH > ph || g->KW > pw)
        return wf__err(WF_ESHAPE,
                       "%s: x is %s: the window %lld x %lld is larger than the padded "
                       "input %lld x %lld",
                       op, SH(xs, s1), (long long)g->KH, (long long)g->KW, (long long)ph,
                       (long long)pw);
    g->OH = (ph - g->KH) / g->sh + 1;
    g->OW = (pw - g->KW) / g->sw + 1;
    wf_shape ys = { .rank = 4, .dims = { g->N, g->C, g->OH, g->OW } };
    int rc = wf__kernel_check_out(op, out, *dt, bwd ? xs : ys);
    if (rc < 0)
        return rc;
    if (bwd && !wf_shape_equal(dy->shape, ys))
        return wf__err(WF_ESHAPE, "%s: dy is %s but pooling x %s gives %s", op, SH(dy->shape, s1),
                       SH(xs, s2), SH(ys, s3));
    return 0;
}

static int run(const wf_kctx *ctx, int kind, const wf_pool_params *prm, const wf_tensor *x,
               const wf_tensor *dy, wf_tensor *out)
{
    pl_plan p = { .kind = kind };
    int rc = wf__ops_pool_check(pl_names[kind], kind == PL_MAX_BWD || kind == PL_AVG_BWD,
                                kind == PL_AVG_BWD, prm, x, dy, out, &p.g, &p.dt);
    if (rc < 0 || out->numel == 0)
        return rc;
    p.es = (int64_t)wf_dtype_size(p.dt);
    if (p.dt == WF_BF16 || p.dt == WF_F16)
        return exec_half(ctx, &p, x, dy, out);
    if (x) {
        p.x = x->data;
        memcpy(p.xst, x->strides, sizeof p.xst);
    }
    if (dy) {
        p.dy = dy->data;
        memcpy(p.dst, dy->strides, sizeof p.dst);
    }
    p.out = out->data;
    return exec(ctx, &p);
}

int wf__max_pool2d_cpu(const wf_kctx *ctx, const wf_pool_params *p, const wf_tensor *x,
                       wf_tensor *out)
{
    return run(ctx, PL_MAX, p, x, NULL, out);
}

int wf__avg_pool2d_cpu(const wf_kctx *ctx, const wf_pool_params *p, const wf_tensor *x,
                       wf_tensor *out)
{
    return run(ctx, PL_AVG, p, x, NULL, out);
}

int wf__max_pool2d_backward_cpu(const wf_kctx *ctx, const wf_pool_params *p, const wf_tensor *x,
                                const wf_tensor *dy, wf_tensor *out)
{
    return run(ctx, PL_MAX_BWD, p, x, dy, out);
}

int wf__avg_pool2d_backward_cpu(const wf_kctx *ctx, const wf_pool_params *p, const wf_tensor *dy,
                                wf_tensor *out)
{
    return run(ctx, PL_AVG_BWD, p, NULL, dy, out);
}
