/* ops/backward_cpu.c: the CPU kernel of slice_backward (the gradient of slice).
 * Owns: writing dy into a zeroed 'out' at the positions a slice of 'out's shape reads: per
 *   axis the first index and count come from wf__slice_dim() (shape_cpu.c, the same
 *   clamping as the forward slice), so the two can never disagree.
 * Invariants: 'out' is contiguous and never overlaps dy; elements move as bytes (any dtype,
 *   bit-exact); positions a slice does not read stay zero (all-zero bytes are 0 in every
 *   dtype); distinct dy elements land on distinct positions (steps are non-zero), so the
 *   order of the walk does not matter.
 * Not here: inference and the op def (backward.c), the forward copy (shape_cpu.c). */
#include "../core/error.h"
#include "../core/tensor.h"
#include "kernels.h"
#include "layout.h"

#include <stdio.h>
#include <string.h>

int wf__ops_slice_backward_layout(const int64_t *begin, const int64_t *end, const int64_t *step,
                                  const wf_tensor *dy, const wf_tensor *out, int64_t *ds,
                                  int64_t *off)
{
    char s1[160], s2[160];
    int r = out->shape.rank;
    if (dy->shape.rank != r)
        return wf__err(WF_ESHAPE, "slice_backward: dy is %s but x is %s",
                       wf_shape_str(dy->shape, s1, sizeof s1),
                       wf_shape_str(out->shape, s2, sizeof s2));
    *off = 0;
    for (int d = 0; d < r; d++) {
        int64_t start, len;
        if (wf__slice_dim(out->shape.dims[d], begin[d], end[d], step[d], &start, &len) < 0)
            return wf__err(WF_EINVAL, "slice_backward: step 0 on axis %d", d);
        if (len != dy->shape.dims[d])
            return wf__err(WF_ESHAPE,
                           "slice_backward: x is %s, whose slice has %lld elements on axis %d, "
                           "but dy is %s",
                           wf_shape_str(out->shape, s1, sizeof s1), (long long)len, d,
                           wf_shape_str(dy->shape, s2, sizeof s2));
        ds[d] = out->strides[d] * step[d];
        if (len > 0)
            *off += start * out->strides[d];
    }
    return 0;
}

int wf__slice_backward_cpu(const wf_kctx *ctx, const int64_t *begin, const int64_t *end,
                           const int64_t *step, const wf_tensor *dy, wf_tensor *out)
{
    (void)ctx;
    if (!dy || !out || !begin || !end || !step)
        return wf__err(WF_EINVAL, "slice_backward: NULL argument");
    int rc = wf__kernel_check_out("slice_backward", out, dy->dtype, out->shape);
    if (rc < 0)
        return rc;
    int r = out->shape.rank;
    int64_t ds[WF_MAX_RANK], off;
    if ((rc = wf__ops_slice_backward_layout(begin, end, step, dy, out, ds, &off)) < 0)
        return rc;
    size_t es = wf_dtype_size(out->dtype);
    memset(out->data, 0, (size_t)out->numel * es);
    if (dy->numel == 0)
        return 0;
    /* Walk dy in row-major order; 'so' and 'dof' follow the source and destination. */
    int64_t idx[WF_MAX_RANK] = { 0 }, so = 0, dof = off;
    for (int64_t i = 0; i < dy->numel; i++) {
        memcpy(out->data + dof * (int64_t)es, dy->data + so * (int64_t)es, es);
        for (int d = r - 1; d >= 0; d--) {
            so += dy->strides[d];
            dof += ds[d];
            if (++idx[d] < dy->shape.dims[d])
                break;
            so -= dy->strides[d] * dy->shape.dims[d];
            dof -= ds[d] * dy->shape.dims[d];
            idx[d] = 0;
        }
    }
    return 0;
}
