/* ops/index_cpu.c: CPU kernels of the indexing ops: gather, one_hot, and scatter_add (the
 * gradient of gather).
 * Owns: reading integer indices (i32 or i64, any strides) and their range checks; the
 *   scatter_add split: pieces are (outer position, block of inner positions) pairs, and a
 *   piece owns every out element of its pair, zeroes them and adds the updates in index
 *   order, so repeated indices accumulate in one fixed order whatever the worker count.
 * Invariants: 'out' is contiguous and never overlaps an input (kernels.h); an out-of-range
 *   gather index fails the whole call with WF_EINVAL naming its position and value, after
 *   which 'out' holds garbage the caller discards.
 * Not here: inference and op defs (index.c), the strided copies of the shape ops
 *   (shape_cpu.c). */
#include "../core/error.h"
#include "../core/tensor.h"
#include "kernels.h"
#include "layout.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Element 'i' (row-major position) of the integer tensor 't'. */
static int64_t index_at(const wf_tensor *t, int64_t i)
{
    int64_t off = 0;
    for (int d = t->shape.rank - 1; d >= 0; d--) {
        int64_t dim = t->shape.dims[d];
        off += (i % dim) * t->strides[d];
        i /= dim;
    }
    if (t->dtype == WF_I32)
        return ((const int32_t *)(const void *)t->data)[off];
    return ((const int64_t *)(const void *)t->data)[off];
}

/* ---- Checks shared with the CUDA kernels (ops/layout.h) ------------------------------------ */

int wf__ops_gather_check(int axis, const wf_tensor *params, const wf_tensor *indices,
                         const wf_tensor *out)
{
    char s1[160], s2[160];
    if (!params || !indices || !out)
        return wf__err(WF_EINVAL, "gather: NULL tensor");
    if (indices->dtype != WF_I32 && indices->dtype != WF_I64)
        return wf__err(WF_EDTYPE, "gather: indices are %s %s but must be i32 or i64",
                       wf_dtype_name(indices->dtype), wf_shape_str(indices->shape, s1, sizeof s1));
    int pr = params->shape.rank, ir = indices->shape.rank;
    if (axis < 0 || axis >= pr || pr + ir - 1 > WF_MAX_RANK)
        return wf__err(WF_EINVAL, "gather: axis %d does not fit params %s and indices %s", axis,
                       wf_shape_str(params->shape, s1, sizeof s1),
                       wf_shape_str(indices->shape, s2, sizeof s2));
    wf_shape s = { .rank = pr + ir - 1 };
    for (int d = 0; d < axis; d++)
        s.dims[d] = params->shape.dims[d];
    for (int d = 0; d < ir; d++)
        s.dims[axis + d] = indices->shape.dims[d];
    for (int d = axis + 1; d < pr; d++)
        s.dims[ir + d - 1] = params->shape.dims[d];
    return wf__kernel_check_out("gather", out, params->dtype, s);
}

int wf__ops_one_hot_check(const wf_tensor *indices, const wf_tensor *out)
{
    char s1[160], s2[160];
    if (!indices || !out)
        return wf__err(WF_EINVAL, "one_hot: NULL tensor");
    if (indices->dtype != WF_I32 && indices->dtype != WF_I64)
        return wf__err(WF_EDTYPE, "one_hot: indices are %s %s but must be i32 or i64",
                       wf_dtype_name(indices->dtype), wf_shape_str(indices->shape, s1, sizeof s1));
    bool ok = out->contiguous && out->shape.rank == indices->shape.rank + 1;
    for (int d = 0; ok && d < indices->shape.rank; d++)
        ok = out->shape.dims[d] == indices->shape.dims[d];
    if (!ok)
        return wf__err(WF_ESHAPE, "one_hot: indices are %s but out is %s",
                       wf_shape_str(indices->shape, s1, sizeof s1),
                       wf_shape_str(out->shape, s2, sizeof s2));
    return 0;
}

int wf__gather_cpu(const wf_kctx *ctx, int axis, const wf_tensor *params, const wf_tensor *indices,
                   wf_tensor *out)
{
    (void)ctx;
    char s1[160], s2[160];
    int rc = wf__ops_gather_check(axis, params, indices, out);
    if (rc < 0)
        return rc;
    int pr = params->shape.rank;
    int64_t outer = 1, inner = 1, dim = params->shape.dims[axis];
    for (int d = 0; d < axis; d++)
        outer *= params->shape.dims[d];
    for (int d = axis + 1; d < pr; d++)
        inner *= params->shape.dims[d];
    size_t es = wf_dtype_size(params->dtype);
    int64_t n_idx = indices->numel;
    if (out->numel == 0)
        return 0;
    /* The axes after 'axis' are row-major in params: each gathered row is one memcpy. */
    bool inner_packed = true;
    int64_t want = 1;
    for (int d = pr - 1; d > axis; d--) {
        inner_packed = inner_packed && (params->shape.dims[d] == 1 || params->strides[d] == want);
        want *= params->shape.dims[d];
    }
    /* Element (o, j, k) of out is params[o, idx[j], k]: walk it in row-major order. */
    int64_t pidx[WF_MAX_RANK];
    char *dst = out->data;
    for (int64_t j = 0; j < n_idx; j++) {
        int64_t v = index_at(indices, j);
        if (v < 0 || v >= dim)
            return wf__err(WF_EINVAL,
                           "gather: index %lld at position %lld of indices %s is outside "
                           "[0, %lld) (params %s, axis %d)",
                           (long long)v, (long long)j, wf_shape_str(indices->shape, s1, sizeof s1),
                           (long long)dim, wf_shape_str(params->shape, s2, sizeof s2), axis);
    }
    for (int64_t o = 0; o < outer; o++) {
        int64_t r = o;
        for (int d = axis - 1; d >= 0; d--) {
            pidx[d] = r % params->shape.dims[d];
            r /= params->shape.dims[d];
        }
        int64_t base = 0;
        for (int d = 0; d < axis; d++)
            base += pidx[d] * params->strides[d];
        for (int64_t j = 0; j < n_idx; j++) {
            int64_t row = base + index_at(indices, j) * params->strides[axis];
            if (inner_packed) { /* one row of 'inner' contiguous elements */
                memcpy(dst, params->data + row * (int64_t)es, (size_t)inner * es);
                dst += (size_t)inner * es;
                continue;
            }
            for (int64_t k = 0; k < inner; k++) {
                int64_t kk = k, off = row;
                for (int d = pr - 1; d > axis; d--) {
                    off += (kk % params->shape.dims[d]) * params->strides[d];
                    kk /= params->shape.dims[d];
                }
                memcpy(dst, params->data + off * (int64_t)es, es);
                dst += es;
            }
        }
    }
    return 0;
}

int wf__one_hot_cpu(const wf_kctx *ctx, const wf_tensor *indices, wf_tensor *out)
{
    (void)ctx;
    int rc = wf__ops_one_hot_check(indices, out);
    if (rc < 0)
        return rc;
    int64_t depth = out->shape.dims[out->shape.rank - 1];
    size_t es = wf_dtype_size(out->dtype);
    char one[16];
    wf__store_f64(out->dtype, one, 1.0);
    memset(out->data, 0, (size_t)out->numel * es);
    for (int64_t j = 0; j < indices->numel; j++) {
        int64_t v = index_at(indices, j);
        if (v >= 0 && v < depth)
            memcpy(out->data + (j * depth + v) * (int64_t)es, one, es);
    }
    return 0;
}

/* ---- scatter_add --------------------------------------------------------------------------- */

#define SA_BLOCK   512   /* inner positions per piece */
#define SA_PAR_MIN 32768 /* elements added (or zeroed) before a runtime splits the work */

typedef struct sa_job {
    const char *upd; /* contiguous [outer, n_idx, inner] */
    char *out;       /* contiguous [outer, dim, inner] */
    const int64_t *idx;
    int64_t outer, n_idx, dim, inner, nblk;
} sa_job;

/* One loop per accumulation type; integer adds wrap through the unsigned twin U. */
#define SA_PIECES(name, T, U)                                                                    \
    static int name(void *arg, int64_t lo, int64_t hi)                                           \
    {                                                                                            \
        const sa_job *j = arg;                                                                   \
        const T *up = (const T *)(const void *)j->upd;                                           \
        T *o = (T *)(void *)j->out;                                                              \
        for (int64_t t = lo; t < hi; t++) {                                                      \
            int64_t oo = t / j->nblk, k0 = t % j->nblk * SA_BLOCK, k1 = k0 + SA_BLOCK;           \
            if (k1 > j->inner)                                                                   \
                k1 = j->inner;                                                                   \
            for (int64_t v = 0; v < j->dim; v++)                                                 \
                memset(o + (oo * j->dim + v) * j->inner + k0, 0, (size_t)(k1 - k0) * sizeof(T)); \
            for (int64_t q = 0; q < j->n_idx; q++) {                                             \
                T *dst = o + (oo * j->dim + j->idx[q]) * j->inner;                               \
                const T *src = up + (oo * j->n_idx + q) * j->inner;                              \
                for (int64_t k = k0; k < k1; k++)                                                \
                    dst[k] = (T)((U)dst[k] + (U)src[k]);                                         \
            }                                                                                    \
        }                                                                                        \
        return 0;                                                                                \
    }
SA_PIECES(sa_f32, float, float)
SA_PIECES(sa_f64, double, double)
SA_PIECES(sa_i32, int32_t, uint32_t)
SA_PIECES(sa_i64, int64_t, uint64_t)

int wf__ops_scatter_add_check(int axis, const wf_tensor *u, const wf_tensor *indices,
                              const wf_tensor *out)
{
    char s1[160], s2[160], s3[160];
    if (!u || !indices || !out)
        return wf__err(WF_EINVAL, "scatter_add: NULL tensor");
    if (indices->dtype != WF_I32 && indices->dtype != WF_I64)
        return wf__err(WF_EDTYPE, "scatter_add: indices are %s %s but must be i32 or i64",
                       wf_dtype_name(indices->dtype), wf_shape_str(indices->shape, s1, sizeof s1));
    wf_dtype dt = u->dtype;
    if (!wf_dtype_is_float(dt) && dt != WF_I32 && dt != WF_I64)
        return wf__err(WF_EDTYPE,
                       "scatter_add: updates are %s; scatter_add takes f32, f64, "
                       "bf16, f16, i32 or i64",
                       wf_dtype_name(dt));
    int r = out->shape.rank, ir = indices->shape.rank;
    bool ok = axis >= 0 && axis < r && u->shape.rank == r - 1 + ir;
    for (int d = 0; ok && d < u->shape.rank; d++) {
        int64_t want = d < axis        ? out->shape.dims[d]
                       : d < axis + ir ? indices->shape.dims[d - axis]
                                       : out->shape.dims[d - ir + 1];
        ok = u->shape.dims[d] == want;
    }
    if (!ok || out->dtype != dt)
        return wf__err(out->dtype != dt ? WF_EDTYPE : WF_ESHAPE,
                       "scatter_add: updates %s %s, indices %s and out %s %s do not fit at axis %d",
                       wf_dtype_name(dt), wf_shape_str(u->shape, s1, sizeof s1),
                       wf_shape_str(indices->shape, s2, sizeof s2), wf_dtype_name(out->dtype),
                       wf_shape_str(out->shape, s3, sizeof s3), axis);
    return wf__kernel_check_out("scatter_add", out, dt, out->shape);
}

int wf__scatter_add_cpu(const wf_kctx *ctx, int axis, const wf_tensor *updates,
                        const wf_tensor *indices, wf_tensor *out)
{
    int rc = wf__ops_scatter_add_check(axis, updates, indices, out);
    if (rc < 0)
        return rc;
    char s1[160], s2[160];
    int r = out->shape.rank;
    sa_job j = { .n_idx = indices->numel, .dim = out->shape.dims[axis], .outer = 1, .inner = 1 };
    for (int d = 0; d < axis; d++)
        j.outer *= out->shape.dims[d];
    for (int d = axis + 1; d < r; d++)
        j.inner *= out->shape.dims[d];
    int64_t *idx = malloc((size_t)(j.n_idx ? j.n_idx : 1) * sizeof *idx);
    if (!idx)
        return wf__err(WF_ENOMEM, "scatter_add: no memory for %lld indices", (long long)j.n_idx);
    for (int64_t q = 0; q < j.n_idx; q++) {
        idx[q] = index_at(indices, q);
        if (idx[q] < 0 || idx[q] >= j.dim) {
            rc = wf__err(WF_EINVAL,
                         "scatter_add: index %lld at position %lld of indices %s is outside "
                         "[0, %lld) (out %s, axis %d)",
                         (long long)idx[q], (long long)q,
                         wf_shape_str(indices->shape, s1, sizeof s1), (long long)j.dim,
                         wf_shape_str(out->shape, s2, sizeof s2), axis);
            free(idx);
            return rc;
        }
    }
    j.idx = idx;
    j.nblk = (j.inner + SA_BLOCK - 1) / SA_BLOCK;
    /* bf16 and f16 accumulate in f32 buffers: updates converted, the sum rounded once. */
    bool half = updates->dtype == WF_BF16 || updates->dtype == WF_F16;
    wf_dtype acc = half ? WF_F32 : updates->dtype;
    wf_tensor *u, *o = out;
    if (half) {
        u = wf__tensor_alloc(WF_F32, updates->shape);
        o = wf__tensor_alloc(WF_F32, out->shape);
        if (u && wf__cast_cpu(ctx, updates, u) < 0) {
            wf_tensor_release(u);
            u = NULL;
        }
    } else {
        u = wf__contiguous_cpu(ctx, updates);
    }
    if (!u || !o) {
        rc = WF_ENOMEM;
    } else if (j.outer * j.nblk > 0) {
        int (*fn)(void *, int64_t, int64_t) = acc == WF_F32   ? sa_f32
                                              : acc == WF_F64 ? sa_f64
                                              : acc == WF_I32 ? sa_i32
                                                              : sa_i64;
        j.upd = u->data;
        j.out = o->data;
        int64_t pieces = j.outer * j.nblk,
                per = (j.n_idx + j.dim) * (j.inner < SA_BLOCK ? j.inner : SA_BLOCK);
        if (ctx && ctx->rt && pieces > 1 && per * pieces > SA_PAR_MIN)
            rc = wf_parallel_for(ctx->rt, 0, pieces, SA_PAR_MIN / (per + 1) + 1, fn, &j);
        else
            rc = fn(&j, 0, pieces);
    }
    if (rc >= 0 && half)
        rc = wf__cast_cpu(ctx, o, out);
    wf_tensor_release(u);
    if (half)
        wf_tensor_release(o);
    free(idx);
    return rc;
}
