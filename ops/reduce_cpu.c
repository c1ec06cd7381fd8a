/* ops/reduce_cpu.c: CPU kernels of the reductions: sum, mean, max, min, prod, argmax and
 * logsumexp over any set of axes, with keepdims.
 * Owns: the reduction plan: the kept axes (their row-major order is the output's) and the
 * reduced axes (size-1 axes dropped, contiguous neighbours merged, which keeps the row-major
 * order of the reduced sub-block that argmax reports positions in).
 * Invariant (determinism): the reduced range of every output element is cut into fixed
 * blocks of RD_BLOCK positions; each block gives a partial, and the partials are combined in
 * block order. Within a block, a floating sum puts reduced position p in lane p % 8 and adds
 * the 8 lanes in a fixed tree; the other ops fold positions one by one. Positions are the
 * row-major order of the reduced axes (the logical order, never the memory order), so the
 * bits depend on the values and the shape only, not on x's strides: a strided view and its
 * contiguous copy reduce to the same bits (a pass that drops a copy changes nothing).
 * Which worker computes a block never changes its bits, so results do not
 * depend on ctx->rt or its worker count; wf_parallel_for only decides who computes what.
 * Floating sums and products accumulate in f64, integer ones in wrapping 64-bit.
 * Sums and means down the columns of a row-major matrix take a column path (col_items) that
 * reads rows in order; it folds every output in the same order as the general path, so the
 * choice of path never changes a bit.
 * prod_grad (prod's gradient) walks each output's reduced range in the same row-major order,
 * with prefix and suffix products in f64.
 * Not here: elementwise kernels and the shared output check (elementwise_cpu.c). */
#include "../core/error.h"
#include "../core/tensor.h"
#include "kernels.h"
#include "layout.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define RD_BLOCK   4096  /* reduced positions per partial: fixed, never from the worker count */
#define RD_PAR_MIN 32768 /* a runtime splits reductions of more input elements than this */
#define RD_COLS    256   /* outputs per item of the column path */

/* One partial: floating ops use 'v' (and 's' for logsumexp's sum), integer ops 'iv';
 * max, min and argmax keep the position of their value in 'idx' (-1: none yet). */
typedef struct acc {
    double v, s;
    int64_t iv, idx;
    double l[8]; /* floating sums: lane k takes the reduced positions p with p % 8 == k */
} acc;

/* Folds 'n' elements at 'p' (stride 's' elements; the first is at reduced position 'pos'). */
typedef void (*rd_fn)(acc *a, const char *p, int64_t s, int64_t n, int64_t pos);

/* Better: larger, or the first NaN. Ties keep the earlier position. */
#define MAX_WINS(v, m, idx) ((idx) < 0 || (v) > (m) || ((v) != (v) && (m) == (m)))
#define MIN_WINS(v, m, idx) ((idx) < 0 || (v) < (m) || ((v) != (v) && (m) == (m)))

#define INT_MAX_WINS(v, m, idx) ((idx) < 0 || (v) > (m))
#define INT_MIN_WINS(v, m, idx) ((idx) < 0 || (v) < (m))
#define RD_ID(x)                (x)

/* An arg-extreme run: keeps in a->FIELD (and a->idx) the element for which WINS holds. */
#define RD_EXTREME(name, sfx, T, VT, LOAD, FIELD, WINS)                                \
    static void name##_##sfx(acc *a, const char *p, int64_t s, int64_t n, int64_t pos) \
    {                                                                                  \
        const T *x = (const T *)p;                                                     \
        for (int64_t i = 0; i < n; i++) {                                              \
            VT v = LOAD(x[i * s]);                                                     \
            if (WINS(v, a->FIELD, a->idx)) {                                           \
                a->FIELD = v;                                                          \
                a->idx = pos + i;                                                      \
            }                                                                          \
        }                                                                              \
    }

/* The run loops, once per dtype: T the element type, LOAD its value as double (or int64). */
#define RD_FLOAT_RUNS(sfx, T, LOAD)                                                  \
    static void sum_##sfx(acc *a, const char *p, int64_t s, int64_t n, int64_t pos)  \
    {                                                                                \
        const T *x = (const T *)p;                                                   \
        double l[8];                                                                 \
        memcpy(l, a->l, sizeof l);                                                   \
        int64_t i = 0;                                                               \
        for (; i < n && ((pos + i) & 7); i++) /* up to a position of lane 0 */       \
            l[(pos + i) & 7] += LOAD(x[i * s]);                                      \
        if (s == 1) {                                                                \
            for (; i + 8 <= n; i += 8)                                               \
                for (int j = 0; j < 8; j++)                                          \
                    l[j] += LOAD(x[i + j]);                                          \
        } else {                                                                     \
            for (; i + 8 <= n; i += 8)                                               \
                for (int j = 0; j < 8; j++)                                          \
                    l[j] += LOAD(x[(i + j) * s]);                                    \
        }                                                                            \
        for (; i < n; i++)                                                           \
            l[(pos + i) & 7] += LOAD(x[i * s]);                                      \
        memcpy(a->l, l, sizeof l);                                                   \
    }                                                                                \
    static void prod_##sfx(acc *a, const char *p, int64_t s, int64_t n, int64_t pos) \
    {                                                                                \
        const T *x = (const T *)p;                                                   \
        for (int64_t i = 0; i < n; i++)                                              \
            a->v *= LOAD(x[i * s]);                                                  \
    }                                                                                \
    RD_EXTREME(max, sfx, T, double, LOAD, v, MAX_WINS)                               \
    RD_EXTREME(min, sfx, T, double, LOAD, v, MIN_WINS)                               \
    static void lse_##sfx(acc *a, const char *p, int64_t s, int64_t n, int64_t pos)  \
    {                                                                                \
        const T *x = (const T *)p;                                                   \
        double t = a->s, m = a->v; /* in position order: no per-run partial */       \
        for (int64_t i = 0; i < n; i++)                                              \
            t += exp(LOAD(x[i * s]) - m);                                            \
        a->s = t;                                                                    \
    }

#define RD_INT_RUNS(sfx, T)                                                          \
    static void sum_##sfx(acc *a, const char *p, int64_t s, int64_t n, int64_t pos)  \
    {                                                                                \
        const T *x = (const T *)p;                                                   \
        uint64_t t = 0;                                                              \
        for (int64_t i = 0; i < n; i++)                                              \
            t += (uint64_t)(int64_t)x[i * s];                                        \
        a->iv = (int64_t)((uint64_t)a->iv + t);                                      \
    }                                                                                \
    static void prod_##sfx(acc *a, const char *p, int64_t s, int64_t n, int64_t pos) \
    {                                                                                \
        const T *x = (const T *)p;                                                   \
        uint64_t t = (uint64_t)a->iv;                                                \
        for (int64_t i = 0; i < n; i++)                                              \
            t *= (uint64_t)(int64_t)x[i * s];                                        \
        a->iv = (int64_t)t;                                                          \
    }                                                                                \
    RD_EXTREME(max, sfx, T, int64_t, RD_ID, iv, INT_MAX_WINS)                        \
    RD_EXTREME(min, sfx, T, int64_t, RD_ID, iv, INT_MIN_WINS)

/* Column sums (see col_items): 'w' adjacent outputs at unit stride, rows [0, n) at stride
 * 'rs' (row 0 at a position of lane 0). Row r goes to lane r % 8 of its column, in order, so
 * each lane sums exactly what sum_* gives that lane: the column path gives the bits of the
 * general one. 'tmp' holds 8 lanes of w accumulators, lane-major. */
typedef void (*rd_cols_fn)(const char *p, int64_t rs, int64_t n, int64_t w, void *tmp);
#define RD_COLS_FN(sfx, T, LOAD, A)                                                     \
    static void cols_##sfx(const char *p, int64_t rs, int64_t n, int64_t w, void *tmp)  \
    {                                                                                   \
        const T *x = (const T *)p;                                                      \
        A *t = tmp;                                                                     \
        int64_t r = 0;                                                                  \
        for (; r + 32 <= n; r += 32) /* per lane, its next 4 rows in one pass over t */ \
            for (int q = 0; q < 8; q++) {                                               \
                const T *x0 = x + (r + q) * rs, *x1 = x0 + 8 * rs, *x2 = x1 + 8 * rs;   \
                const T *x3 = x2 + 8 * rs;                                              \
                A *tq = t + q * w;                                                      \
                for (int64_t j = 0; j < w; j++) {                                       \
                    A v = tq[j];                                                        \
                    v += (A)LOAD(x0[j]);                                                \
                    v += (A)LOAD(x1[j]);                                                \
                    v += (A)LOAD(x2[j]);                                                \
                    v += (A)LOAD(x3[j]);                                                \
                    tq[j] = v;                                                          \
                }                                                                       \
            }                                                                           \
        for (; r + 8 <= n; r += 8) /* eight rows per pass, one lane each */             \
            for (int q = 0; q < 8; q++) {                                               \
                const T *xr = x + (r + q) * rs;                                         \
                A *tq = t + q * w;                                                      \
                for (int64_t j = 0; j < w; j++)                                         \
                    tq[j] += (A)LOAD(xr[j]);                                            \
            }                                                                           \
        for (; r < n; r++)                                                              \
            for (int64_t j = 0; j < w; j++)                                             \
                t[(r & 7) * w + j] += (A)LOAD(x[r * rs + j]);                           \
    }

#define LOAD_F32(x)  ((double)(x))
#define LOAD_F64(x)  (x)
#define LOAD_BF16(x) ((double)wf__bf16_to_f32(x))
#define LOAD_F16(x)  ((double)wf__f16_to_f32(x))
RD_FLOAT_RUNS(f32, float, LOAD_F32)
RD_FLOAT_RUNS(f64, double, LOAD_F64)
RD_FLOAT_RUNS(bf16, uint16_t, LOAD_BF16)
RD_FLOAT_RUNS(f16, uint16_t, LOAD_F16)
RD_INT_RUNS(i32, int32_t)
RD_INT_RUNS(i64, int64_t)
#define LOAD_INT(x) ((uint64_t)(int64_t)(x))
RD_COLS_FN(f32, float, LOAD_F32, double)
RD_COLS_FN(f64, double, LOAD_F64, double)
RD_COLS_FN(bf16, uint16_t, LOAD_BF16, double)
RD_COLS_FN(f16, uint16_t, LOAD_F16, double)
RD_COLS_FN(i32, int32_t, LOAD_INT, uint64_t)
RD_COLS_FN(i64, int64_t, LOAD_INT, uint64_t)

enum { K_SUM, K_PROD, K_MAX, K_MIN, K_LSE, K_COUNT };

enum { D_F32, D_F64, D_BF16, D_F16, D_I32, D_I64, D_COUNT };

#define RD_ROW(sfx)                                            \
    {                                                          \
        sum_##sfx, prod_##sfx, max_##sfx, min_##sfx, lse_##sfx \
    }
#define RD_IROW(sfx)                                      \
    {                                                     \
        sum_##sfx, prod_##sfx, max_##sfx, min_##sfx, NULL \
    }
static const rd_fn rd_fns[D_COUNT][K_COUNT] = {
    [D_F32] = RD_ROW(f32), [D_F64] = RD_ROW(f64),  [D_BF16] = RD_ROW(bf16),
    [D_F16] = RD_ROW(f16), [D_I32] = RD_IROW(i32), [D_I64] = RD_IROW(i64),
};

static const rd_cols_fn rd_cols[D_COUNT] = {
    [D_F32] = cols_f32, [D_F64] = cols_f64, [D_BF16] = cols_bf16,
    [D_F16] = cols_f16, [D_I32] = cols_i32, [D_I64] = cols_i64,
};

static int dtype_index(wf_dtype dt)
{
    switch (dt) {
    case WF_F32:
        return D_F32;
    case WF_F64:
        return D_F64;
    case WF_BF16:
        return D_BF16;
    case WF_F16:
        return D_F16;
    case WF_I32:
        return D_I32;
    case WF_I64:
        return D_I64;
    default:
        return -1;
    }
}

/* The run loop each op folds with (logsumexp: the maximum first, then lse_*). */
static const int reduce_kind[WF__REDUCE_COUNT] = {
    [WF__REDUCE_SUM] = K_SUM,       [WF__REDUCE_MEAN] = K_SUM,  [WF__REDUCE_MAX] = K_MAX,
    [WF__REDUCE_MIN] = K_MIN,       [WF__REDUCE_PROD] = K_PROD, [WF__REDUCE_ARGMAX] = K_MAX,
    [WF__REDUCE_LOGSUMEXP] = K_MAX,
};

static const char *const reduce_names[WF__REDUCE_COUNT] = {
    "sum", "mean", "max", "min", "prod", "argmax", "logsumexp",
};

/* ---- The plan -------------------------------------------------------------------------------- */

typedef struct rd_plan {
    wf__reduce_kind op;
    bool is_int;
    wf__reduce_geom g; /* the axes, sizes and strides read */
    int64_t nblocks;
    const char *base;
    int64_t es;
    rd_fn pass1, pass2; /* pass2: logsumexp's sum of exponentials */
    rd_cols_fn cols;    /* the column path's loop, or NULL */
    int64_t col_chunks; /* column path: chunks of RD_COLS outputs per row of outputs */
    acc *part;          /* nout * nblocks partials; NULL when nblocks <= 1 */
    wf_tensor *out;
} rd_plan;

/* Marks the reduced axes of a rank-'rank' shape in 'mask'; fails on a bad or repeated axis. */
static int axes_mask(const char *op, wf_shape s, const int *axes, int n_axes, bool *mask)
{
    for (int d = 0; d < s.rank; d++)
        mask[d] = axes == NULL;
    if (!axes)
        return 0;
    char sb[160];
    if (n_axes < 0 || n_axes > s.rank)
        return wf__err(WF_EINVAL, "%s: %d axes given for a tensor of shape %s", op, n_axes,
                       wf_shape_str(s, sb, sizeof sb));
    for (int i = 0; i < n_axes; i++) {
        int a = axes[i] < 0 ? axes[i] + s.rank : axes[i];
        if (a < 0 || a >= s.rank)
            return wf__err(WF_EINVAL, "%s: axis %d is out of range for shape %s", op, axes[i],
                           wf_shape_str(s, sb, sizeof sb));
        if (mask[a])
            return wf__err(WF_EINVAL, "%s: axis %d is given twice for shape %s", op, axes[i],
                           wf_shape_str(s, sb, sizeof sb));
        mask[a] = true;
    }
    return 0;
}

int wf__ops_reduce_check(wf__reduce_kind op, const int *axes, int n_axes, bool keepdims,
                         const wf_tensor *x, const wf_tensor *out, bool *mask)
{
    if ((unsigned)op >= WF__REDUCE_COUNT)
        return wf__err(WF_EINVAL, "reduce: op %d is not a wf__reduce_kind", (int)op);
    const char *name = reduce_names[op];
    if (!x)
        return wf__err(WF_EINVAL, "%s: x is NULL", name);
    bool is_int = x->dtype == WF_I32 || x->dtype == WF_I64;
    if (dtype_index(x->dtype) < 0 ||
        (is_int && (op == WF__REDUCE_MEAN || op == WF__REDUCE_LOGSUMEXP)))
        return wf__err(WF_EDTYPE, "%s: x is %s, which %s does not support", name,
                       wf_dtype_name(x->dtype), name);
    wf_shape oshape;
    int rc = axes_mask(name, x->shape, axes, n_axes, mask);
    if (rc == 0)
        rc = wf__reduce_shape(x->shape, axes, n_axes, keepdims, &oshape);
    if (rc == 0)
        rc = wf__kernel_check_out(name, out, op == WF__REDUCE_ARGMAX ? WF_I64 : x->dtype, oshape);
    return rc;
}

const char *wf__ops_reduce_name(wf__reduce_kind op)
{
    return (unsigned)op < WF__REDUCE_COUNT ? reduce_names[op] : "reduce";
}

int wf__reduce_shape(wf_shape x_shape, const int *axes, int n_axes, bool keepdims, wf_shape *out)
{
    bool mask[WF_MAX_RANK];
    if (x_shape.rank < 0 || x_shape.rank > WF_MAX_RANK || !out)
        return wf__err(WF_EINVAL, "reduce: bad shape rank %d or NULL out", x_shape.rank);
    int rc = axes_mask("reduce", x_shape, axes, n_axes, mask);
    if (rc < 0)
        return rc;
    wf_shape r = { .rank = 0 };
    for (int d = 0; d < x_shape.rank; d++) {
        if (!mask[d])
            r.dims[r.rank++] = x_shape.dims[d];
        else if (keepdims)
            r.dims[r.rank++] = 1;
    }
    *out = r;
    return 0;
}

/* The lanes' sum in a fixed tree. */
static double lanes(const double *l)
{
    return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

static void acc_init(const rd_plan *pl, acc *a)
{
    /* Lanes start at -0.0, the identity of IEEE addition (x + -0.0 is x for every x, -0.0
     * included), so a sum of one element is that element: summing a size-1 axis changes no
     * bit, and a static graph that sums an axis that is 1 at run time matches an eager one
     * that does not. An empty range still gives +0.0 (v). */
    for (int k = 0; k < 8; k++)
        a->l[k] = -0.0;
    a->v = pl->op == WF__REDUCE_PROD ? 1.0 : 0.0;
    a->s = 0;
    a->iv = pl->op == WF__REDUCE_PROD ? 1 : 0;
    a->idx = -1;
    if (pl->op == WF__REDUCE_LOGSUMEXP)
        a->v = -INFINITY;
}

/* Folds reduced positions [lo, hi) of the sub-block at 'base' with 'fn'. */
static void fold(const rd_plan *pl, const char *base, int64_t lo, int64_t hi, rd_fn fn, acc *a)
{
    int last = pl->g.rr - 1;
    int64_t idx[WF_MAX_RANK], rem = lo, off = 0;
    for (int d = last; d >= 0; d--) {
        idx[d] = rem % pl->g.rdims[d];
        rem /= pl->g.rdims[d];
        off += idx[d] * pl->g.rst[d];
    }
    for (int64_t pos = lo; pos < hi;) {
        int64_t n = pl->g.rdims[last] - idx[last];
        if (n > hi - pos)
            n = hi - pos;
        fn(a, base + off * pl->es, pl->g.rst[last], n, pos);
        pos += n;
        if (pos >= hi)
            break;
        off += n * pl->g.rst[last];
        idx[last] += n;
        for (int d = last; d > 0 && idx[d] == pl->g.rdims[d]; d--) {
            idx[d] = 0;
            idx[d - 1]++;
            off += pl->g.rst[d - 1] - pl->g.rdims[d] * pl->g.rst[d];
        }
    }
}

/* The partial of block 'b' of output 'o'. */
static void block(const rd_plan *pl, int64_t o, int64_t b, acc *a)
{
    int64_t off = 0, rem = o;
    for (int d = pl->g.kr - 1; d >= 0; d--) {
        off += (rem % pl->g.kdims[d]) * pl->g.kst[d];
        rem /= pl->g.kdims[d];
    }
    const char *base = pl->base + off * pl->es;
    int64_t lo = b * RD_BLOCK, hi = lo + RD_BLOCK < pl->g.m ? lo + RD_BLOCK : pl->g.m;
    acc_init(pl, a);
    fold(pl, base, lo, hi, pl->pass1, a);
    if ((pl->op == WF__REDUCE_SUM || pl->op == WF__REDUCE_MEAN) && !pl->is_int)
        a->v = lanes(a->l);
    if (pl->pass2) {
        if (isfinite(a->v))
            fold(pl, base, lo, hi, pl->pass2, a);
        else /* -inf: every element is -inf (the sum stays 0); +inf or NaN decide alone */
            a->s = a->v == -INFINITY ? 0 : 1;
    }
}

/* Folds partial 'b' into 'a', in block order. */
static void combine(const rd_plan *pl, acc *a, const acc *b)
{
    switch (pl->op) {
    case WF__REDUCE_SUM:
    case WF__REDUCE_MEAN:
        a->v += b->v;
        a->iv = (int64_t)((uint64_t)a->iv + (uint64_t)b->iv);
        break;
    case WF__REDUCE_PROD:
        a->v *= b->v;
        a->iv = (int64_t)((uint64_t)a->iv * (uint64_t)b->iv);
        break;
    case WF__REDUCE_MAX:
    case WF__REDUCE_ARGMAX:
        if (pl->is_int ? a->idx < 0 || b->iv > a->iv : MAX_WINS(b->v, a->v, a->idx))
            *a = *b;
        break;
    case WF__REDUCE_MIN:
        if (pl->is_int ? a->idx < 0 || b->iv < a->iv : MIN_WINS(b->v, a->v, a->idx))
            *a = *b;
        break;
    case WF__REDUCE_LOGSUMEXP: { /* rescale both sums to the larger maximum; NaN wins */
        double av = a->v, bv = b->v;
        double m = av != av ? av : bv != bv ? bv : av > bv ? av : bv;
        if (isfinite(m))
            a->s = a->s * exp(av - m) + b->s * exp(bv - m);
        a->v = m;
        break;
    }
    default:
        break;
    }
}

/* Writes the finished 'a' as output element 'o'. */
static void finish(const rd_plan *pl, int64_t o, const acc *a)
{
    wf_tensor *out = pl->out;
    char *p = out->data + o * (int64_t)wf_dtype_size(out->dtype);
    switch (pl->op) {
    case WF__REDUCE_ARGMAX:
        *(int64_t *)p = a->idx;
        return;
    case WF__REDUCE_MEAN:
        wf__store_f64(out->dtype, p, a->v / (double)pl->g.m);
        return;
    case WF__REDUCE_LOGSUMEXP:
        wf__store_f64(out->dtype, p, isfinite(a->v) ? a->v + log(a->s) : a->v);
        return;
    default:
        break;
    }
    if (out->dtype == WF_I32)
        *(int32_t *)p = (int32_t)a->iv;
    else if (out->dtype == WF_I64)
        *(int64_t *)p = a->iv;
    else
        wf__store_f64(out->dtype, p, a->v);
}

/* Parallel items: with one block per output, item o computes and writes output o; else item
 * k computes partial k (output k / nblocks, block k % nblocks). */
static int items(void *ctx, int64_t lo, int64_t hi)
{
    const rd_plan *pl = ctx;
    for (int64_t k = lo; k < hi; k++) {
        acc a;
        if (pl->nblocks == 1) {
            block(pl, k, 0, &a);
            finish(pl, k, &a);
        } else {
            block(pl, k / pl->nblocks, k % pl->nblocks, &pl->part[k]);
        }
    }
    return 0;
}

/* The column path, for sum and mean over one (merged) reduced axis whose innermost kept axis
 * has unit stride (a bias gradient: [batch, n] summed over the batch). The general path
 * would walk each column down a large stride; here item k sums a chunk of RD_COLS adjacent
 * outputs row by row, reading memory once, block by block as the general path does. */
static int col_items(void *ctx, int64_t lo, int64_t hi)
{
    const rd_plan *pl = ctx;
    int64_t nlast = pl->g.kdims[pl->g.kr - 1];
    for (int64_t k = lo; k < hi; k++) {
        int64_t q = k / pl->col_chunks, j0 = (k % pl->col_chunks) * RD_COLS, rem = q, off = j0;
        int64_t w = nlast - j0 < RD_COLS ? nlast - j0 : RD_COLS;
        for (int d = pl->g.kr - 2; d >= 0; d--) {
            off += (rem % pl->g.kdims[d]) * pl->g.kst[d];
            rem /= pl->g.kdims[d];
        }
        double dsum[RD_COLS], dblk[8 * RD_COLS];
        uint64_t isum[RD_COLS], iblk[8 * RD_COLS];
        for (int64_t b = 0; b < pl->nblocks; b++) {
            int64_t r0 = b * RD_BLOCK, n = pl->g.m - r0 < RD_BLOCK ? pl->g.m - r0 : RD_BLOCK;
            const char *p = pl->base + (off + r0 * pl->g.rst[0]) * pl->es;
            for (int64_t j = 0; j < 8 * w; j++) {
                dblk[j] = -0.0; /* acc_init's lanes */
                iblk[j] = 0;
            }
            pl->cols(p, pl->g.rst[0], n, w, pl->is_int ? (void *)iblk : (void *)dblk);
            for (int64_t j = 0; j < w; j++) { /* the block's partial, then block order */
                double l[8];
                uint64_t iv = 0;
                for (int q = 0; q < 8; q++) {
                    l[q] = dblk[q * w + j];
                    iv += iblk[q * w + j];
                }
                double v = lanes(l);
                dsum[j] = b == 0 ? v : dsum[j] + v;
                isum[j] = b == 0 ? iv : isum[j] + iv;
            }
        }
        for (int64_t j = 0; j < w; j++) {
            acc a = { .v = dsum[j], .iv = (int64_t)isum[j], .idx = -1 };
            finish(pl, q * nlast + j0 + j, &a);
        }
    }
    return 0;
}

void wf__ops_reduce_geom(const wf_tensor *x, const bool *mask, wf__reduce_geom *g)
{
    g->kr = g->rr = 0;
    g->nout = g->m = 1;
    for (int d = 0; d < x->shape.rank; d++) {
        int64_t dim = x->shape.dims[d], st = x->strides[d];
        if (!mask[d]) {
            g->nout *= dim;
            if (dim != 1) {
                g->kdims[g->kr] = dim;
                g->kst[g->kr++] = st;
            }
        } else {
            g->m *= dim;
            if (dim == 1)
                continue;
            if (g->rr > 0 && g->rst[g->rr - 1] == st * dim) { /* merge: order is kept */
                g->rdims[g->rr - 1] *= dim;
                g->rst[g->rr - 1] = st;
            } else {
                g->rdims[g->rr] = dim;
                g->rst[g->rr++] = st;
            }
        }
    }
    if (g->rr == 0) { /* nothing left to reduce: one position per output */
        g->rdims[0] = 1;
        g->rst[0] = 0;
        g->rr = 1;
    }
}

int wf__reduce_cpu(const wf_kctx *ctx, wf__reduce_kind op, const int *axes, int n_axes,
                   bool keepdims, const wf_tensor *x, wf_tensor *out)
{
    bool mask[WF_MAX_RANK];
    int rc = wf__ops_reduce_check(op, axes, n_axes, keepdims, x, out, mask);
    if (rc < 0)
        return rc;
    const char *name = reduce_names[op];
    int di = dtype_index(x->dtype);
    bool is_int = x->dtype == WF_I32 || x->dtype == WF_I64;

    rd_plan pl = { .op = op, .is_int = is_int, .base = x->data, .out = out };
    pl.es = (int64_t)wf_dtype_size(x->dtype);
    wf__ops_reduce_geom(x, mask, &pl.g);
    if (pl.g.nout == 0)
        return 0;
    if (pl.g.m == 0) {
        if (op == WF__REDUCE_MAX || op == WF__REDUCE_MIN || op == WF__REDUCE_ARGMAX) {
            char s[160];
            return wf__err(WF_EINVAL, "%s: x %s has an empty reduced range; %s has no identity",
                           name, wf_shape_str(x->shape, s, sizeof s), name);
        }
        for (int64_t o = 0; o < pl.g.nout; o++) {
            acc a;
            acc_init(&pl, &a);
            finish(&pl, o, &a);
        }
        return 0;
    }
    pl.nblocks = (pl.g.m + RD_BLOCK - 1) / RD_BLOCK;
    if ((op == WF__REDUCE_SUM || op == WF__REDUCE_MEAN) && pl.g.rr == 1 && pl.g.rdims[0] > 1 &&
        pl.g.rst[0] != 1 && pl.g.kr > 0 && pl.g.kst[pl.g.kr - 1] == 1) {
        pl.cols = rd_cols[di];
        pl.col_chunks = (pl.g.kdims[pl.g.kr - 1] + RD_COLS - 1) / RD_COLS;
        int64_t n_items = pl.g.nout / pl.g.kdims[pl.g.kr - 1] * pl.col_chunks;
        if (ctx && ctx->rt && pl.g.nout * pl.g.m > RD_PAR_MIN) {
            int64_t grain = RD_PAR_MIN / 2 / (pl.g.m * RD_COLS);
            return wf_parallel_for(ctx->rt, 0, n_items, grain > 0 ? grain : 1, col_items, &pl);
        }
        return col_items(&pl, 0, n_items);
    }
    pl.pass1 = rd_fns[di][reduce_kind[op]];
    pl.pass2 = op == WF__REDUCE_LOGSUMEXP ? rd_fns[di][K_LSE] : NULL;
    int64_t n_items = pl.g.nout * pl.nblocks;
    if (pl.nblocks > 1) {
        pl.part = malloc((size_t)n_items * sizeof *pl.part);
        if (!pl.part)
            return wf__err(WF_ENOMEM, "%s: no memory for %lld partials", name, (long long)n_items);
    }
    int64_t per_item = pl.g.m < RD_BLOCK ? pl.g.m : RD_BLOCK;
    if (ctx && ctx->rt && pl.g.nout * pl.g.m > RD_PAR_MIN) {
        int64_t grain = RD_PAR_MIN / 2 / per_item;
        rc = wf_parallel_for(ctx->rt, 0, n_items, grain > 0 ? grain : 1, items, &pl);
    } else {
        rc = items(&pl, 0, n_items);
    }
    if (rc >= 0 && pl.part) {
        for (int64_t o = 0; o < pl.g.nout; o++) {
            acc a = pl.part[o * pl.nblocks];
            for (int64_t b = 1; b < pl.nblocks; b++)
                combine(&pl, &a, &pl.part[o * pl.nblocks + b]);
            finish(&pl, o, &a);
        }
    }
    free(pl.part);
    return rc;
}

/* ---- prod's gradient --------------------------------------------------------------------- */

/* The plan of wf__prod_grad_cpu: the kept and the reduced axes of x (in x's order, so the
 * reduced positions are visited in row-major order), with x's and out's strides on each. */
typedef struct pg_plan {
    int kr, rr, dr;
    int64_t kdims[WF_MAX_RANK], kx[WF_MAX_RANK], ko[WF_MAX_RANK];
    int64_t rdims[WF_MAX_RANK], rx[WF_MAX_RANK], ro[WF_MAX_RANK];
    int64_t ddims[WF_MAX_RANK], dst[WF_MAX_RANK]; /* dy's shape and strides */
    int64_t m;                                    /* reduced positions per output */
    const wf_tensor *x, *dy;
    wf_tensor *out;
} pg_plan;

/* Outputs [lo, hi): for each, the prefix products of its reduced range in order and the
 * suffix products backwards, so out = dy * (prefix before it * suffix after it): exact where
 * x holds zeros, where dy * y / x gives inf or NaN. Products in f64, in the forward's order. */
static int pg_items(void *ctx, int64_t lo, int64_t hi)
{
    const pg_plan *pl = ctx;
    size_t xes = wf_dtype_size(pl->x->dtype), oes = wf_dtype_size(pl->out->dtype);
    double *v = malloc((size_t)(2 * pl->m) * sizeof *v), *suf = v ? v + pl->m : NULL;
    int64_t *oo = malloc((size_t)(pl->m ? pl->m : 1) * sizeof *oo);
    if (!v || !oo) {
        free(v);
        free(oo);
        return wf__err(WF_ENOMEM, "prod_grad: no memory for %lld positions", (long long)pl->m);
    }
    for (int64_t o = lo; o < hi; o++) {
        int64_t bx = 0, bo = 0, bd = 0, rem = o;
        for (int d = pl->kr - 1; d >= 0; d--) {
            int64_t i = rem % pl->kdims[d];
            rem /= pl->kdims[d];
            bx += i * pl->kx[d];
            bo += i * pl->ko[d];
        }
        rem = o;
        for (int d = pl->dr - 1; d >= 0; d--) {
            bd += (rem % pl->ddims[d]) * pl->dst[d];
            rem /= pl->ddims[d];
        }
        double dy = wf__load_f64(pl->dy->dtype, pl->dy->data + bd * (int64_t)xes);
        int64_t idx[WF_MAX_RANK] = { 0 }, ox = bx, oq = bo;
        for (int64_t p = 0; p < pl->m; p++) {
            v[p] = wf__load_f64(pl->x->dtype, pl->x->data + ox * (int64_t)xes);
            oo[p] = oq;
            for (int d = pl->rr - 1; d >= 0; d--) { /* next position, row-major */
                ox += pl->rx[d];
                oq += pl->ro[d];
                if (++idx[d] < pl->rdims[d])
                    break;
                ox -= pl->rdims[d] * pl->rx[d];
                oq -= pl->rdims[d] * pl->ro[d];
                idx[d] = 0;
            }
        }
        suf[pl->m - 1] = 1.0;
        for (int64_t p = pl->m - 2; p >= 0; p--)
            suf[p] = suf[p + 1] * v[p + 1];
        double pre = 1.0;
        for (int64_t p = 0; p < pl->m; p++) {
            wf__store_f64(pl->out->dtype, pl->out->data + oo[p] * (int64_t)oes,
                          dy * (pre * suf[p]));
            pre *= v[p];
        }
    }
    free(v);
    free(oo);
    return 0;
}

int wf__prod_grad_cpu(const wf_kctx *ctx, const int *axes, int n_axes, bool keepdims,
                      const wf_tensor *x, const wf_tensor *dy, wf_tensor *out)
{
    bool mask[WF_MAX_RANK];
    wf_shape ds;
    char s1[160], s2[160], s3[160];
    if (!x || !dy || !wf_dtype_is_float(x->dtype) || dy->dtype != x->dtype)
        return wf__err(WF_EDTYPE, "prod_grad: x is %s and dy %s (floating, equal dtypes)",
                       x ? wf_dtype_name(x->dtype) : "NULL",
                       dy ? wf_dtype_name(dy->dtype) : "NULL");
    int rc = axes_mask("prod_grad", x->shape, axes, n_axes, mask);
    if (rc == 0)
        rc = wf__reduce_shape(x->shape, axes, n_axes, keepdims, &ds);
    if (rc == 0 && !wf_shape_equal(ds, dy->shape))
        rc = wf__err(WF_ESHAPE, "prod_grad: dy is %s but reducing x of shape %s gives %s",
                     wf_shape_str(dy->shape, s1, sizeof s1), wf_shape_str(x->shape, s2, sizeof s2),
                     wf_shape_str(ds, s3, sizeof s3));
    if (rc == 0)
        rc = wf__kernel_check_out("prod_grad", out, x->dtype, x->shape);
    if (rc < 0)
        return rc;
    pg_plan pl = { .x = x, .dy = dy, .out = out, .m = 1, .dr = dy->shape.rank };
    int64_t nout = 1;
    for (int d = 0; d < x->shape.rank; d++) {
        int64_t dim = x->shape.dims[d];
        if (mask[d]) {
            pl.m *= dim;
            pl.rdims[pl.rr] = dim;
            pl.rx[pl.rr] = x->strides[d];
            pl.ro[pl.rr++] = out->strides[d];
        } else {
            nout *= dim;
            pl.kdims[pl.kr] = dim;
            pl.kx[pl.kr] = x->strides[d];
            pl.ko[pl.kr++] = out->strides[d];
        }
    }
    for (int d = 0; d < pl.dr; d++) {
        pl.ddims[d] = dy->shape.dims[d];
        pl.dst[d] = dy->strides[d];
    }
    if (nout == 0 || pl.m == 0)
        return 0;
    if (ctx && ctx->rt && nout * pl.m > RD_PAR_MIN) {
        int64_t grain = RD_PAR_MIN / 2 / pl.m;
        return wf_parallel_for(ctx->rt, 0, nout, grain > 0 ? grain : 1, pg_items, &pl);
    }
    return pg_items(&pl, 0, nout);
}

#define REDUCE_ENTRY(name, OP)                                                           \
    int wf__##name##_cpu(const wf_kctx *ctx, const int *axes, int n_axes, bool keepdims, \
                         const wf_tensor *x, wf_tensor *out)                             \
    {                                                                                    \
        return wf__reduce_cpu(ctx, WF__REDUCE_##OP, axes, n_axes, keepdims, x, out);     \
    }
REDUCE_ENTRY(sum, SUM)
REDUCE_ENTRY(mean, MEAN)
REDUCE_ENTRY(max, MAX)
REDUCE_ENTRY(min, MIN)
REDUCE_ENTRY(prod, PROD)
REDUCE_ENTRY(argmax, ARGMAX)
REDUCE_ENTRY(logsumexp, LOGSUMEXP)
