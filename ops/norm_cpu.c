/* ops/norm_cpu.c: CPU kernels of layer normalization: the forward pass and the fused gradient
 * with respect to x; also wf__contiguous_cpu(), the copy-if-strided helper the kernels of
 * norm_cpu.c, dropout_cpu.c and index_cpu.c's scatter_add share.
 * Owns: the row loop. x is viewed as [rows, n] (n = the product of the normalized axes);
 *   each row is loaded into an f64 buffer, its mean and biased variance are taken in two
 *   passes in f64 (stable for any offset: no E[x^2] - E[x]^2 cancellation; each sum in four
 *   partial sums of a fixed order, sum4()), and the result is computed in f64 and rounded
 *   once on store. gamma and beta are converted to f64 once.
 * Invariants: rows are independent and each is computed by one task, in one order, so the
 *   bits never depend on the worker count or the split; strided inputs are first copied to
 *   contiguous ones (wf__contiguous_cpu); 'out' is contiguous and never overlaps an input.
 * Not here: inference and op defs (norm.c), dgamma and dbeta (the gradient composes them
 *   from layer_norm without affine and sums). */
#include "../core/error.h"
#include "../core/tensor.h"
#include "kernels.h"
#include "layout.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#define LN_GRAIN 16384 /* elements per parallel piece, at least (whole rows) */

wf_tensor *wf__contiguous_cpu(const wf_kctx *ctx, const wf_tensor *t)
{
    if (t->contiguous)
        return wf_tensor_retain((wf_tensor *)t);
    wf_tensor *c = wf__tensor_alloc(t->dtype, t->shape);
    if (c && wf__cast_cpu(ctx, t, c) < 0) {
        wf_tensor_release(c);
        return NULL;
    }
    return c;
}

static void load_row(wf_dtype dt, const char *src, int64_t n, double *dst)
{
    if (dt == WF_F32) {
        const float *s = (const float *)(const void *)src;
        for (int64_t i = 0; i < n; i++)
            dst[i] = s[i];
    } else if (dt == WF_F64) {
        const double *s = (const double *)(const void *)src;
        for (int64_t i = 0; i < n; i++)
            dst[i] = s[i];
    } else {
        size_t es = wf_dtype_size(dt);
        for (int64_t i = 0; i < n; i++)
            dst[i] = wf__load_f64(dt, src + (size_t)i * es);
    }
}

static void store_row(wf_dtype dt, char *dst, int64_t n, const double *src)
{
    if (dt == WF_F32) {
        float *d = (float *)(void *)dst;
        for (int64_t i = 0; i < n; i++)
            d[i] = (float)src[i];
    } else if (dt == WF_F64) {
        double *d = (double *)(void *)dst;
        for (int64_t i = 0; i < n; i++)
            d[i] = src[i];
    } else {
        size_t es = wf_dtype_size(dt);
        for (int64_t i = 0; i < n; i++)
            wf__store_f64(dt, dst + (size_t)i * es, src[i]);
    }
}

/* One call's arguments, all contiguous; gamma and beta as f64 (NULL: absent). */
typedef struct ln_job {
    const wf_tensor *x, *dy;
    const double *gamma, *beta;
    wf_tensor *out;
    int64_t n; /* elements per row */
    double eps;
    bool backward;
} ln_job;

/* The sum of 'v[0..n)' in four interleaved partial sums (element i goes to sum i % 4; the
 * last n % 4 to the first), added as (s0 + s1) + (s2 + s3): a fixed order, so the bits depend
 * on n alone. One serial sum waited on each add's latency: at n = 128 the layer norms of the
 * GPT step (15 passes over [2048, 128]) took 7.5% of its CPU time; four chains vectorize and
 * overlap (with the gamma/beta tests out of the loops below: [2048, 128] f32 forward 0.72 ->
 * 0.43 ms, input gradient 1.02 -> 0.60 ms of CPU time). */
static double sum4(const double *v, int64_t n)
{
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        s0 += v[i];
        s1 += v[i + 1];
        s2 += v[i + 2];
        s3 += v[i + 3];
    }
    for (; i < n; i++)
        s0 += v[i];
    return (s0 + s1) + (s2 + s3);
}

/* The sum of (v[i] - m)^2, in sum4()'s order. */
static double sq_dev4(const double *v, int64_t n, double m)
{
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        s0 += (v[i] - m) * (v[i] - m);
        s1 += (v[i + 1] - m) * (v[i + 1] - m);
        s2 += (v[i + 2] - m) * (v[i + 2] - m);
        s3 += (v[i + 3] - m) * (v[i + 3] - m);
    }
    for (; i < n; i++)
        s0 += (v[i] - m) * (v[i] - m);
    return (s0 + s1) + (s2 + s3);
}

/* The sum of a[i] * b[i], in sum4()'s order. */
static double dot4(const double *a, const double *b, int64_t n)
{
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        s0 += a[i] * b[i];
        s1 += a[i + 1] * b[i + 1];
        s2 += a[i + 2] * b[i + 2];
        s3 += a[i + 3] * b[i + 3];
    }
    for (; i < n; i++)
        s0 += a[i] * b[i];
    return (s0 + s1) + (s2 + s3);
}

/* Mean and 1 / sqrt(var + eps) of 'v[0..n)', two passes. */
static void row_stats(const double *v, int64_t n, double eps, double *mean, double *rstd)
{
    double m = sum4(v, n) / (double)n;
    *mean = m;
    *rstd = 1.0 / sqrt(sq_dev4(v, n, m) / (double)n + eps);
}

/* The loops test gamma and beta once per row, not per element, so that each vectorizes. */
static void forward_row(const ln_job *j, double *v)
{
    double mean, rstd;
    int64_t n = j->n;
    row_stats(v, n, j->eps, &mean, &rstd);
    for (int64_t i = 0; i < n; i++)
        v[i] = (v[i] - mean) * rstd;
    if (j->gamma)
        for (int64_t i = 0; i < n; i++)
            v[i] *= j->gamma[i];
    if (j->beta)
        for (int64_t i = 0; i < n; i++)
            v[i] += j->beta[i];
}

/* 'v' holds x's row, 'g' dy's; dx is written over 'v'. */
static void backward_row(const ln_job *j, double *v, double *g)
{
    double mean, rstd;
    int64_t n = j->n;
    row_stats(v, n, j->eps, &mean, &rstd);
    for (int64_t i = 0; i < n; i++)
        v[i] = (v[i] - mean) * rstd; /* xhat */
    if (j->gamma)
        for (int64_t i = 0; i < n; i++)
            g[i] *= j->gamma[i];
    double m1 = sum4(g, n) / (double)n, m2 = dot4(g, v, n) / (double)n;
    for (int64_t i = 0; i < n; i++)
        v[i] = rstd * (g[i] - m1 - v[i] * m2);
}

static int ln_rows(void *arg, int64_t lo, int64_t hi)
{
    const ln_job *j = arg;
    wf_dtype dt = j->x->dtype;
    size_t row_bytes = (size_t)j->n * wf_dtype_size(dt);
    double *v = malloc((size_t)j->n * (j->backward ? 2 : 1) * sizeof *v);
    if (!v)
        return wf__err(WF_ENOMEM, "layer_norm: no memory for a row of %lld", (long long)j->n);
    for (int64_t r = lo; r < hi; r++) {
        load_row(dt, j->x->data + (size_t)r * row_bytes, j->n, v);
        if (j->backward) {
            load_row(dt, j->dy->data + (size_t)r * row_bytes, j->n, v + j->n);
            backward_row(j, v, v + j->n);
        } else {
            forward_row(j, v);
        }
        store_row(dt, j->out->data + (size_t)r * row_bytes, j->n, v);
    }
    free(v);
    return 0;
}

/* gamma or beta as a fresh f64 array of 'n' (NULL tensor: NULL, no error). */
static int param_f64(const wf_kctx *ctx, const wf_tensor *p, int64_t n, double **out)
{
    *out = NULL;
    if (!p)
        return 0;
    wf_tensor *c = wf__contiguous_cpu(ctx, p);
    double *d = malloc((size_t)(n ? n : 1) * sizeof *d);
    if (!c || !d) {
        wf_tensor_release(c);
        free(d);
        return wf__err(WF_ENOMEM, "layer_norm: no memory for gamma or beta");
    }
    load_row(c->dtype, c->data, n, d);
    wf_tensor_release(c);
    *out = d;
    return 0;
}

/* The checks both entries share, and norm_cuda.cu's (ops/layout.h): x floating with rank >
 * begin_axis, the others x's dtype, gamma/dy shapes, out. */
int wf__ops_layer_norm_check(const char *op, int begin_axis, double eps, const wf_tensor *x,
                             const wf_tensor *gamma, const wf_tensor *beta, const wf_tensor *dy,
                             const wf_tensor *out)
{
    char s1[160], s2[160];
    if (!x)
        return wf__err(WF_EINVAL, "%s: x is NULL", op);
    if (!wf_dtype_is_float(x->dtype))
        return wf__err(WF_EDTYPE, "%s: x is %s %s; %s takes f32, f64, bf16 or f16", op,
                       wf_dtype_name(x->dtype), wf_shape_str(x->shape, s1, sizeof s1), op);
    if (begin_axis < 0 || begin_axis >= x->shape.rank)
        return wf__err(WF_EINVAL, "%s: x is %s; begin axis %d is outside [0, %d)", op,
                       wf_shape_str(x->shape, s1, sizeof s1), begin_axis, (int)x->shape.rank);
    if (!(eps >= 0) || !isfinite(eps))
        return wf__err(WF_EINVAL, "%s: eps %g must be finite and >= 0", op, eps);
    wf_shape norm = { .rank = x->shape.rank - begin_axis };
    for (int d = 0; d < norm.rank; d++)
        norm.dims[d] = x->shape.dims[begin_axis + d];
    const wf_tensor *ps[2] = { gamma, beta };
    const char *const names[2] = { "gamma", "beta" };
    for (int k = 0; k < 2; k++) {
        const wf_tensor *p = ps[k];
        if (p && (p->dtype != x->dtype || !wf_shape_equal(p->shape, norm)))
            return wf__err(p->dtype != x->dtype ? WF_EDTYPE : WF_ESHAPE,
                           "%s: x is %s %s, so %s must be %s %s, not %s %s", op,
                           wf_dtype_name(x->dtype), wf_shape_str(x->shape, s1, sizeof s1), names[k],
                           wf_dtype_name(x->dtype), wf_shape_str(norm, s2, sizeof s2),
                           wf_dtype_name(p->dtype), wf_shape_str(p->shape, s1, sizeof s1));
    }
    if (dy && (dy->dtype != x->dtype || !wf_shape_equal(dy->shape, x->shape)))
        return wf__err(dy->dtype != x->dtype ? WF_EDTYPE : WF_ESHAPE,
                       "%s: x is %s %s but dy is %s %s", op, wf_dtype_name(x->dtype),
                       wf_shape_str(x->shape, s1, sizeof s1), wf_dtype_name(dy->dtype),
                       wf_shape_str(dy->shape, s2, sizeof s2));
    return wf__kernel_check_out(op, out, x->dtype, x->shape);
}

static int layer_norm_run(const wf_kctx *ctx, const char *op, int begin_axis, double eps,
                          const wf_tensor *x, const wf_tensor *gamma, const wf_tensor *beta,
                          const wf_tensor *dy, wf_tensor *out)
{
    int rc = wf__ops_layer_norm_check(op, begin_axis, eps, x, gamma, beta, dy, out);
    if (rc < 0 || out->numel == 0)
        return rc;
    int64_t n = 1;
    for (int d = begin_axis; d < x->shape.rank; d++)
        n *= x->shape.dims[d];
    ln_job j = { .n = n, .eps = eps, .backward = dy != NULL, .out = out };
    wf_tensor *xc = wf__contiguous_cpu(ctx, x);
    wf_tensor *dyc = dy ? wf__contiguous_cpu(ctx, dy) : NULL;
    double *gm = NULL, *bt = NULL;
    if (!xc || (dy && !dyc))
        rc = WF_ENOMEM;
    if (rc >= 0)
        rc = param_f64(ctx, gamma, n, &gm);
    if (rc >= 0)
        rc = param_f64(ctx, beta, n, &bt);
    if (rc >= 0) {
        j.x = xc;
        j.dy = dyc;
        j.gamma = gm;
        j.beta = bt;
        int64_t rows = out->numel / n, grain = LN_GRAIN / n + 1;
        if (ctx && ctx->rt && rows > grain)
            rc = wf_parallel_for(ctx->rt, 0, rows, grain, ln_rows, &j);
        else
            rc = ln_rows(&j, 0, rows);
    }
    free(gm);
    free(bt);
    wf_tensor_release(xc);
    wf_tensor_release(dyc);
    return rc;
}

int wf__layer_norm_cpu(const wf_kctx *ctx, int begin_axis, double eps, const wf_tensor *x,
                       const wf_tensor *gamma, const wf_tensor *beta, wf_tensor *out)
{
    return layer_norm_run(ctx, "layer_norm", begin_axis, eps, x, gamma, beta, NULL, out);
}

int wf__layer_norm_backward_input_cpu(const wf_kctx *ctx, int begin_axis, double eps,
                                      const wf_tensor *x, const wf_tensor *gamma,
                                      const wf_tensor *dy, wf_tensor *out)
{
    if (!dy)
        return wf__err(WF_EINVAL, "layer_norm_backward_input: dy is NULL");
    return layer_norm_run(ctx, "layer_norm_backward_input", begin_axis, eps, x, gamma, NULL, dy,
                          out);
}
