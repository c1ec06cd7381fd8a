/* ops/index_cpu.c: CPU kernels of the indexing ops: gather and one_hot.
 * Owns: reading integer indices (i32 or i64, any strides) and their range checks.
 * Invariants: 'out' is contiguous and never overlaps an input (kernels.h); an out-of-range
 *   gather index fails the whole call with WF_EINVAL naming its position and value, after
 *   which 'out' holds garbage the caller discards.
 * Not here: inference and op defs (index.c), the strided copies of the shape ops
 *   (shape_cpu.c). */
#include "../core/error.h"
#include "../core/tensor.h"
#include "kernels.h"

#include <stdio.h>
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

int wf__gather_cpu(const wf_kctx *ctx, int axis, const wf_tensor *params, const wf_tensor *indices,
                   wf_tensor *out)
{
    (void)ctx;
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
    int rc = wf__kernel_check_out("gather", out, params->dtype, s);
    if (rc < 0)
        return rc;
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
