/* ops/softmax_cpu.c: CPU kernels of softmax, log_softmax (along any axis) and
 * softmax_cross_entropy (logits [..., C] against integer labels [...]).
 * Owns: the row walk these share: a row is the 'axis' line through one position of the other
 * axes; it is loaded into an f64 buffer, its maximum is subtracted before exp (stable for any
 * input size; exp_vec(), a vectorizing exp within 1 ulp), and its results are stored
 * rounded to out's dtype.
 * Invariant: each row is computed by one worker, alone and in a fixed order, so results do
 * not depend on ctx->rt or its worker count.
 * Not here: the gradients (grad/), fusing softmax into a GEMM epilogue. */
#include "../core/error.h"
#include "../core/tensor.h"
#include "kernels.h"
#include "layout.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define SM_PAR_MIN 32768 /* a runtime splits work on more elements than this */

enum { SM_SOFTMAX, SM_LOG_SOFTMAX, SM_XENT };

typedef struct sm_plan {
    int kind;
    const wf_tensor *x, *labels;
    wf_tensor *out;
    int axis;
    wf__softmax_geom g; /* the rows and the axis */
} sm_plan;

/* Row 'r' of x as f64 into 'buf'. */
static void load_row(const sm_plan *pl, const char *p, double *buf)
{
    wf_dtype dt = pl->x->dtype;
    int64_t s = pl->g.x_axis_st, es = (int64_t)wf_dtype_size(dt);
    if (dt == WF_F32) {
        for (int64_t j = 0; j < pl->g.C; j++)
            buf[j] = ((const float *)p)[j * s];
    } else if (dt == WF_F64) {
        for (int64_t j = 0; j < pl->g.C; j++)
            buf[j] = ((const double *)p)[j * s];
    } else {
        for (int64_t j = 0; j < pl->g.C; j++)
            buf[j] = wf__load_f64(dt, p + j * s * es);
    }
}

/* e^x in f64 in branch-free arithmetic, so that the loop over a row vectorizes (libm's exp
 * is a scalar call: with two calls an element it was 60% of the GPT step's softmax time).
 * Cody-Waite reduction by ln 2 (fdlibm's split, exact in n * ln2_hi for |n| < 2^21), the
 * Taylor polynomial of degree 13 on [-ln2/2, ln2/2] (truncation below 5e-18 relative), and
 * 2^n built in the exponent bits: within 1 ulp of e^x where the result is normal (measured
 * 0.82 ulp over 2e7 random points of [-708.3, 709.78] against expl; subnormal results are
 * rounded twice), 0 below -745.2 and +inf above 709.79; NaN stays NaN. n is read from the
 * bits of the rounding sum, never converted from a double, so no input reaches an undefined
 * conversion. With one exp an element and the f32 store loop below: softmax over
 * [8192, 64] f32 6.1 -> 2.4 ms of CPU time here. tests/ops/test_internal_row_kernels.c checks
 * masked rows and underflowing exps against f64 references. */
static inline double exp_vec(double x0)
{
    const double magic = 6755399441055744.0; /* 1.5 * 2^52: adding it rounds to an integer */
    double x = x0 < -745.2 ? -745.2 : x0;
    x = x > 709.79 ? 709.79 : x;
    double t = x * 1.4426950408889634 + magic, n = t - magic;
    double r = x - n * 6.93147180369123816490e-01;
    r = r - n * 1.90821492927058770002e-10;
    double p = 1.0 / 6227020800.0;
    p = p * r + 1.0 / 479001600.0;
    p = p * r + 1.0 / 39916800.0;
    p = p * r + 1.0 / 3628800.0;
    p = p * r + 1.0 / 362880.0;
    p = p * r + 1.0 / 40320.0;
    p = p * r + 1.0 / 5040.0;
    p = p * r + 1.0 / 720.0;
    p = p * r + 1.0 / 120.0;
    p = p * r + 1.0 / 24.0;
    p = p * r + 1.0 / 6.0;
    p = p * r + 0.5;
    p = p * r + 1.0;
    p = p * r + 1.0;
    /* 2^n as 2^h 2^(n-h), h about n/2, so that both factors are normal for every n in
     * [-1075, 1024] (subnormal and largest results included) */
    double h = (n * 0.5 + magic) - magic, t1 = h + magic, t2 = (n - h) + magic, s1, s2;
    uint64_t b1, b2, mb;
    memcpy(&b1, &t1, sizeof b1);
    memcpy(&b2, &t2, sizeof b2);
    memcpy(&mb, &magic, sizeof mb);
    b1 = (b1 - mb + 1023u) << 52;
    b2 = (b2 - mb + 1023u) << 52;
    memcpy(&s1, &b1, sizeof s1);
    memcpy(&s2, &b2, sizeof s2);
    double y = p * s1 * s2;
    y = x0 < -745.2 ? 0.0 : y;
    return x0 > 709.79 ? INFINITY : y;
}

/* e[j] = exp(v[j] - m) for a row, built twice: as compiled and for AVX2 (4 doubles a
 * register, no FMA, so the same IEEE operations and bits), chosen by the CPU. */
#define EXP_ROW(name, ATTR)                                                \
    ATTR static void name(const double *v, double *e, int64_t n, double m) \
    {                                                                      \
        for (int64_t j = 0; j < n; j++)                                    \
            e[j] = exp_vec(v[j] - m);                                      \
    }
#if defined(__x86_64__) || defined(__i386__)
EXP_ROW(exp_row_base, )
EXP_ROW(exp_row_avx2, __attribute__((target("avx2"))))
#    define EXP_ROW_FN (__builtin_cpu_supports("avx2") ? exp_row_avx2 : exp_row_base)
#else
EXP_ROW(exp_row_base, )
#    define EXP_ROW_FN exp_row_base
#endif

/* The maximum of the row 'buf' (NaN if any element is NaN), each exp(x - max) in 'e' (when
 * the maximum is finite) and their sum, added in element order. */
static void row_stats(const double *buf, double *e, int64_t C, double *max, double *sum)
{
    double m = -INFINITY;
    for (int64_t j = 0; j < C; j++) {
        if (buf[j] != buf[j]) { /* NaN decides */
            m = buf[j];
            break;
        }
        if (buf[j] > m)
            m = buf[j];
    }
    double s = 0;
    if (isfinite(m)) {
        EXP_ROW_FN(buf, e, C, m);
        for (int64_t j = 0; j < C; j++)
            s += e[j];
    }
    *max = m;
    *sum = s;
}

static int rows(void *ctx, int64_t lo, int64_t hi)
{
    const sm_plan *pl = ctx;
    double *buf = malloc((size_t)(pl->g.C ? pl->g.C : 1) * 2 * sizeof *buf), *e = buf + pl->g.C;
    if (!buf)
        return wf__err(WF_ENOMEM, "softmax: no memory for a row of %lld", (long long)pl->g.C);
    int64_t es_x = (int64_t)wf_dtype_size(pl->x->dtype);
    int64_t es_o = (int64_t)wf_dtype_size(pl->out->dtype);
    int rc = 0;
    for (int64_t r = lo; r < hi && rc == 0; r++) {
        int64_t rem = r, xo = 0, oo = 0, lo_ = 0;
        for (int d = pl->g.orank - 1; d >= 0; d--) {
            int64_t k = rem % pl->g.odims[d];
            rem /= pl->g.odims[d];
            xo += k * pl->g.xst[d];
            oo += k * pl->g.ost[d];
            lo_ += k * pl->g.lst[d];
        }
        load_row(pl, pl->x->data + xo * es_x, buf);
        double m, s;
        row_stats(buf, e, pl->g.C, &m, &s);
        char *o = pl->out->data + oo * es_o;
        if (pl->kind == SM_XENT) {
            const char *lp = pl->labels->data + lo_ * (int64_t)wf_dtype_size(pl->labels->dtype);
            int64_t label =
                pl->labels->dtype == WF_I32 ? *(const int32_t *)lp : *(const int64_t *)lp;
            if (label < 0 || label >= pl->g.C) {
                rc = wf__err(WF_EINVAL,
                             "softmax_cross_entropy: label %lld of example %lld is outside "
                             "[0, %lld)",
                             (long long)label, (long long)r, (long long)pl->g.C);
                break;
            }
            /* -log softmax[label] = max + log(sum) - x[label] */
            double loss = isfinite(m) ? m + log(s) - buf[label] : m - buf[label];
            wf__store_f64(pl->out->dtype, o, loss);
            continue;
        }
        if (pl->kind == SM_SOFTMAX && isfinite(m) && pl->out->dtype == WF_F32 &&
            pl->g.out_axis_st == 1) { /* the common case, in a loop that vectorizes */
            float *of = (float *)(void *)o;
            for (int64_t j = 0; j < pl->g.C; j++)
                of[j] = (float)(e[j] / s);
            continue;
        }
        double ls = log(s);
        for (int64_t j = 0; j < pl->g.C; j++) {
            double y;
            if (!isfinite(m)) /* NaN or +inf in the row: NaN; all -inf: NaN as 0/0 */
                y = NAN;
            else if (pl->kind == SM_SOFTMAX)
                y = e[j] / s;
            else
                y = buf[j] - m - ls;
            wf__store_f64(pl->out->dtype, o + j * pl->g.out_axis_st * es_o, y);
        }
    }
    free(buf);
    return rc;
}

/* Shared with softmax_cuda.cu (ops/layout.h). */
int wf__ops_softmax_check(const char *name, int axis, const wf_tensor *x, const wf_tensor *labels,
                          int *axis_out, wf_shape *lshape)
{
    char s1[160], s2[160], s3[160];
    if (!wf_dtype_is_float(x->dtype))
        return wf__err(WF_EDTYPE, "%s: x is %s; %s takes f32, f64, bf16 or f16", name,
                       wf_dtype_name(x->dtype), name);
    int rank = x->shape.rank;
    if (rank == 0)
        return wf__err(WF_ESHAPE, "%s: x is a scalar; it needs an axis", name);
    int a = axis < 0 ? axis + rank : axis;
    if (a < 0 || a >= rank)
        return wf__err(WF_EINVAL, "%s: axis %d is out of range for shape %s", name, axis,
                       wf_shape_str(x->shape, s1, sizeof s1));
    *axis_out = a;
    lshape->rank = 0;
    for (int d = 0; d < rank; d++)
        if (d != a)
            lshape->dims[lshape->rank++] = x->shape.dims[d];
    if (labels) {
        if (labels->dtype != WF_I32 && labels->dtype != WF_I64)
            return wf__err(WF_EDTYPE, "%s: labels are %s but must be i32 or i64", name,
                           wf_dtype_name(labels->dtype));
        if (!wf_shape_equal(labels->shape, *lshape))
            return wf__err(WF_ESHAPE, "%s: logits are %s, so labels must be %s, not %s", name,
                           wf_shape_str(x->shape, s1, sizeof s1),
                           wf_shape_str(*lshape, s2, sizeof s2),
                           wf_shape_str(labels->shape, s3, sizeof s3));
    }
    return 0;
}

void wf__ops_softmax_geom(int axis, bool per_row, const wf_tensor *x, const wf_tensor *labels,
                          const wf_tensor *dloss, const wf_tensor *out, wf__softmax_geom *g)
{
    int64_t ostr[WF_MAX_RANK];
    wf__contiguous_strides(out->shape, ostr);
    *g = (wf__softmax_geom){ .C = x->shape.dims[axis], .rows = 1, .x_axis_st = x->strides[axis] };
    for (int d = 0, k = 0; d < x->shape.rank; d++) {
        if (d == axis)
            continue;
        g->odims[g->orank] = x->shape.dims[d];
        g->xst[g->orank] = x->strides[d];
        g->ost[g->orank] = per_row ? ostr[k] : ostr[d];
        g->lst[g->orank] = labels ? labels->strides[k] : 0;
        g->dst[g->orank] = dloss ? dloss->strides[k] : 0;
        g->rows *= x->shape.dims[d];
        g->orank++;
        k++;
    }
    g->out_axis_st = per_row ? 0 : ostr[axis];
}

static const char *const sm_names[] = { "softmax", "log_softmax", "softmax_cross_entropy" };

static int run(const wf_kctx *ctx, int kind, int axis, const wf_tensor *x, const wf_tensor *labels,
               wf_tensor *out)
{
    const char *name = sm_names[kind];
    if (!x || !out || (kind == SM_XENT && !labels))
        return wf__err(WF_EINVAL, "%s: %s is NULL", name, !x ? "x" : !out ? "out" : "labels");
    int a;
    wf_shape lshape;
    int rc = wf__ops_softmax_check(name, axis, x, kind == SM_XENT ? labels : NULL, &a, &lshape);
    if (rc < 0)
        return rc;
    sm_plan pl = { .kind = kind, .x = x, .labels = labels, .out = out, .axis = a };
    rc = wf__kernel_check_out(name, out, x->dtype, kind == SM_XENT ? lshape : x->shape);
    if (rc < 0)
        return rc;
    wf__ops_softmax_geom(a, kind == SM_XENT, x, kind == SM_XENT ? labels : NULL, NULL, out, &pl.g);
    if (pl.g.rows == 0 || (pl.g.C == 0 && kind != SM_XENT))
        return 0;
    if (ctx && ctx->rt && pl.g.rows * pl.g.C > SM_PAR_MIN) {
        int64_t grain = SM_PAR_MIN / 2 / (pl.g.C ? pl.g.C : 1);
        return wf_parallel_for(ctx->rt, 0, pl.g.rows, grain > 0 ? grain : 1, rows, &pl);
    }
    return rows(&pl, 0, pl.g.rows);
}

int wf__softmax_cpu(const wf_kctx *ctx, int axis, const wf_tensor *x, wf_tensor *out)
{
    return run(ctx, SM_SOFTMAX, axis, x, NULL, out);
}

int wf__log_softmax_cpu(const wf_kctx *ctx, int axis, const wf_tensor *x, wf_tensor *out)
{
    return run(ctx, SM_LOG_SOFTMAX, axis, x, NULL, out);
}

int wf__softmax_cross_entropy_cpu(const wf_kctx *ctx, const wf_tensor *logits,
                                  const wf_tensor *labels, wf_tensor *out)
{
    return run(ctx, SM_XENT, logits ? logits->shape.rank - 1 : 0, logits, labels, out);
}
