/* ops/shape_cpu.c: CPU kernels of the shape ops: reshape (also expand_dims and squeeze),
 * transpose, slice (also split), concat, stack, pad and broadcast_to.
 * Owns: one strided N-d copy (copy_nd) that every kernel here runs through: each op builds a
 *   view of its input (permuted, offset, stepped or zero strides) and copies it, element by
 *   element, into a contiguous region of 'out' (all of it, or a sub-box for concat, stack and
 *   pad). Elements are moved as bytes, so every dtype works and values are bit-exact.
 * Invariants: 'out' is contiguous and never overlaps an input (kernels.h); inputs may have
 *   any strides (also 0 and negative).
 * Not here: inference and op defs (shape.c), gather and one_hot (index_cpu.c). */
#include "../core/error.h"
#include "../core/tensor.h"
#include "kernels.h"
#include "layout.h"

#include <stdio.h>
#include <string.h>

/* Copies the box 'dims[0..rank)' from 'src' (element strides 'ss') to 'dst' (element strides
 * 'ds'), 'es' bytes per element. */
static void copy_nd(size_t es, int rank, const int64_t *dims, char *dst, const int64_t *ds,
                    const char *src, const int64_t *ss)
{
    int64_t total = 1;
    for (int d = 0; d < rank; d++)
        total *= dims[d];
    if (total == 0)
        return;
    if (rank == 0) {
        memcpy(dst, src, es);
        return;
    }
    int64_t idx[WF_MAX_RANK] = { 0 };
    int last = rank - 1;
    int64_t n = dims[last], sst = ss[last] * (int64_t)es, dst_ = ds[last] * (int64_t)es;
    for (int64_t done = 0; done < total; done += n) {
        int64_t so = 0, dof = 0;
        for (int d = 0; d < last; d++) {
            so += idx[d] * ss[d];
            dof += idx[d] * ds[d];
        }
        const char *s = src + so * (int64_t)es;
        char *o = dst + dof * (int64_t)es;
        if (sst == (int64_t)es && dst_ == (int64_t)es) {
            memcpy(o, s, (size_t)n * es);
        } else {
            switch (es) {
            case 1:
                for (int64_t i = 0; i < n; i++)
                    o[i * dst_] = s[i * sst];
                break;
            case 2:
                for (int64_t i = 0; i < n; i++)
                    memcpy(o + i * dst_, s + i * sst, 2);
                break;
            case 4:
                for (int64_t i = 0; i < n; i++)
                    memcpy(o + i * dst_, s + i * sst, 4);
                break;
            default:
                for (int64_t i = 0; i < n; i++)
                    memcpy(o + i * dst_, s + i * sst, es);
            }
        }
        for (int d = last - 1; d >= 0; d--) {
            if (++idx[d] < dims[d])
                break;
            idx[d] = 0;
        }
    }
}

int wf__ops_shape_check(const char *op, const wf_tensor *x, const wf_tensor *out)
{
    char s1[160], s2[160];
    if (!x || !out)
        return wf__err(WF_EINVAL, "%s: NULL tensor", op);
    if (x->dtype != out->dtype || !out->contiguous)
        return wf__err(WF_EDTYPE, "%s: x is %s %s but out is %s %s (contiguous, same dtype)", op,
                       wf_dtype_name(x->dtype), wf_shape_str(x->shape, s1, sizeof s1),
                       wf_dtype_name(out->dtype), wf_shape_str(out->shape, s2, sizeof s2));
    return 0;
}

/* ---- Argument checks and layouts, shared with shape_cuda.cu (ops/layout.h) ----------------- */

int wf__ops_reshape_check(const wf_tensor *x, const wf_tensor *out)
{
    if (x->numel != out->numel) {
        char s1[160], s2[160];
        return wf__err(WF_ESHAPE, "reshape: x is %s (%lld elements) but out is %s (%lld)",
                       wf_shape_str(x->shape, s1, sizeof s1), (long long)x->numel,
                       wf_shape_str(out->shape, s2, sizeof s2), (long long)out->numel);
    }
    return 0;
}

int wf__ops_transpose_layout(const int *perm, int n, const wf_tensor *x, const wf_tensor *out,
                             wf_shape *sh, int64_t *ss)
{
    wf_shape s = x->shape;
    bool seen[WF_MAX_RANK] = { false };
    bool ok = n == x->shape.rank;
    for (int d = 0; ok && d < n; d++) {
        ok = perm[d] >= 0 && perm[d] < n && !seen[perm[d]];
        if (ok) {
            seen[perm[d]] = true;
            s.dims[d] = x->shape.dims[perm[d]];
            ss[d] = x->strides[perm[d]];
        }
    }
    if (!ok)
        return wf__err(WF_EINVAL, "transpose: the permutation does not fit x's rank %d",
                       x->shape.rank);
    *sh = s;
    return wf__kernel_check_out("transpose", out, x->dtype, s);
}

int wf__ops_slice_layout(const int64_t *begin, const int64_t *end, const int64_t *step,
                         const wf_tensor *x, const wf_tensor *out, wf_shape *sh, int64_t *ss,
                         int64_t *off)
{
    wf_shape s = x->shape;
    *off = 0;
    for (int d = 0; d < s.rank; d++) {
        int64_t st = step[d], start, len;
        if (wf__slice_dim(x->shape.dims[d], begin[d], end[d], st, &start, &len) < 0)
            return wf__err(WF_EINVAL, "slice: step 0 on axis %d", d);
        s.dims[d] = len;
        ss[d] = x->strides[d] * st;
        if (len > 0)
            *off += start * x->strides[d];
    }
    *sh = s;
    return wf__kernel_check_out("slice", out, x->dtype, s);
}

int wf__ops_broadcast_layout(const wf_tensor *x, const wf_tensor *out, int64_t *ss)
{
    int r = out->shape.rank, k = r - x->shape.rank;
    bool ok = k >= 0;
    for (int d = 0; ok && d < r; d++) {
        int xd = d - k;
        if (xd < 0) {
            ss[d] = 0;
            continue;
        }
        int64_t xs = x->shape.dims[xd];
        ok = xs == out->shape.dims[d] || xs == 1;
        ss[d] = xs == 1 ? 0 : x->strides[xd];
    }
    if (!ok) {
        char s1[160], s2[160];
        return wf__err(WF_ESHAPE, "broadcast_to: x is %s and does not broadcast to %s",
                       wf_shape_str(x->shape, s1, sizeof s1),
                       wf_shape_str(out->shape, s2, sizeof s2));
    }
    return 0;
}

int wf__ops_join_layout(const char *op, bool stack, int axis, int i, const wf_tensor *x,
                        const wf_tensor *out, int64_t pos, int64_t *dims, int64_t *ss, int *rank)
{
    int r = 0;
    for (int d = 0; d < x->shape.rank + (stack ? 1 : 0) && r < WF_MAX_RANK; d++) {
        if (stack && d == axis) {
            dims[r] = 1;
            ss[r++] = 0;
        }
        if (d < x->shape.rank && r < WF_MAX_RANK) {
            dims[r] = x->shape.dims[d];
            ss[r++] = x->strides[d];
        }
    }
    bool ok = r == out->shape.rank && axis >= 0 && axis < r;
    for (int d = 0; ok && d < r; d++)
        ok = d == axis || dims[d] == out->shape.dims[d];
    ok = ok && pos + dims[axis] <= out->shape.dims[axis];
    if (!ok) {
        char s1[160], s2[160];
        return wf__err(WF_ESHAPE, "%s: input %d is %s but out is %s (axis %d)", op, i,
                       wf_shape_str(x->shape, s1, sizeof s1),
                       wf_shape_str(out->shape, s2, sizeof s2), axis);
    }
    *rank = r;
    return 0;
}

int wf__ops_pad_layout(const int64_t *before, const int64_t *after, const wf_tensor *x,
                       const wf_tensor *out, int64_t *off)
{
    wf_shape s = x->shape;
    for (int d = 0; d < s.rank; d++) {
        if (before[d] < 0 || after[d] < 0)
            return wf__err(WF_EINVAL, "pad: negative padding on axis %d", d);
        s.dims[d] += before[d] + after[d];
    }
    int rc = wf__kernel_check_out("pad", out, x->dtype, s);
    if (rc < 0)
        return rc;
    *off = 0;
    for (int d = 0; d < s.rank; d++)
        *off += before[d] * out->strides[d];
    return 0;
}

int wf__reshape_cpu(const wf_kctx *ctx, const wf_tensor *x, wf_tensor *out)
{
    (void)ctx;
    int rc = wf__ops_shape_check("reshape", x, out);
    if (rc < 0 || (rc = wf__ops_reshape_check(x, out)) < 0)
        return rc;
    int64_t ds[WF_MAX_RANK];
    wf__contiguous_strides(x->shape, ds);
    copy_nd(wf_dtype_size(x->dtype), x->shape.rank, x->shape.dims, out->data, ds, x->data,
            x->strides);
    return 0;
}

int wf__transpose_cpu(const wf_kctx *ctx, const int *perm, int n, const wf_tensor *x,
                      wf_tensor *out)
{
    (void)ctx;
    wf_shape s;
    int64_t ss[WF_MAX_RANK];
    int rc = wf__ops_shape_check("transpose", x, out);
    if (rc < 0 || (rc = wf__ops_transpose_layout(perm, n, x, out, &s, ss)) < 0)
        return rc;
    copy_nd(wf_dtype_size(x->dtype), s.rank, s.dims, out->data, out->strides, x->data, ss);
    return 0;
}

int wf__slice_dim(int64_t dim, int64_t begin, int64_t end, int64_t step, int64_t *start,
                  int64_t *len)
{
    if (step == 0)
        return WF_EINVAL;
    int64_t b = begin, e = end;
    if (step > 0) {
        if (b < 0)
            b = b < -dim ? 0 : b + dim;
        if (b > dim)
            b = dim;
        if (e < 0)
            e = e < -dim ? 0 : e + dim;
        if (e > dim)
            e = dim;
        *start = b;
        *len = e > b ? (e - b + step - 1) / step : 0;
    } else {
        if (b < 0)
            b = b < -dim ? -1 : b + dim;
        if (b > dim - 1)
            b = dim - 1;
        if (e < 0)
            e = e < -dim ? -1 : e + dim;
        if (e > dim - 1)
            e = dim - 1;
        *start = b;
        *len = b > e ? (b - e + (-step) - 1) / (-step) : 0;
    }
    return 0;
}

int wf__slice_cpu(const wf_kctx *ctx, const int64_t *begin, const int64_t *end, const int64_t *step,
                  const wf_tensor *x, wf_tensor *out)
{
    (void)ctx;
    wf_shape s;
    int64_t ss[WF_MAX_RANK], off;
    int rc = wf__ops_shape_check("slice", x, out);
    if (rc < 0 || (rc = wf__ops_slice_layout(begin, end, step, x, out, &s, ss, &off)) < 0)
        return rc;
    if (out->numel == 0)
        return 0;
    copy_nd(wf_dtype_size(x->dtype), s.rank, s.dims, out->data, out->strides,
            x->data + off * (int64_t)wf_dtype_size(x->dtype), ss);
    return 0;
}

int wf__broadcast_to_cpu(const wf_kctx *ctx, const wf_tensor *x, wf_tensor *out)
{
    (void)ctx;
    int64_t ss[WF_MAX_RANK];
    int rc = wf__ops_shape_check("broadcast_to", x, out);
    if (rc < 0 || (rc = wf__ops_broadcast_layout(x, out, ss)) < 0)
        return rc;
    copy_nd(wf_dtype_size(x->dtype), out->shape.rank, out->shape.dims, out->data, out->strides,
            x->data, ss);
    return 0;
}

int wf__ops_join_check(const char *op, const wf_tensor *const *xs, int n, const wf_tensor *out)
{
    if (n < 1 || !xs || !out)
        return wf__err(WF_EINVAL, "%s: no inputs", op);
    return 0;
}

int wf__ops_join_filled(const char *op, int axis, int64_t pos, const wf_tensor *out)
{
    if (pos != out->shape.dims[axis])
        return wf__err(WF_ESHAPE, "%s: the inputs fill %lld of out's %lld along axis %d", op,
                       (long long)pos, (long long)out->shape.dims[axis], axis);
    return 0;
}

/* concat and stack: input i goes to the box of 'out' that starts at 'pos' along 'axis';
 * 'stack' inserts 'axis' into each input's shape as a size-1 axis first. */
static int join(const char *op, bool stack, int axis, const wf_tensor *const *xs, int n,
                wf_tensor *out)
{
    int rc = wf__ops_join_check(op, xs, n, out);
    if (rc < 0)
        return rc;
    int64_t pos = 0;
    size_t es = wf_dtype_size(out->dtype);
    for (int i = 0; i < n; i++) {
        const wf_tensor *x = xs[i];
        int64_t dims[WF_MAX_RANK], ss[WF_MAX_RANK];
        int r;
        rc = wf__ops_shape_check(op, x, out);
        if (rc < 0 || (rc = wf__ops_join_layout(op, stack, axis, i, x, out, pos, dims, ss, &r)) < 0)
            return rc;
        copy_nd(es, r, dims, out->data + pos * out->strides[axis] * (int64_t)es, out->strides,
                x->data, ss);
        pos += dims[axis];
    }
    return wf__ops_join_filled(op, axis, pos, out);
}

int wf__concat_cpu(const wf_kctx *ctx, int axis, const wf_tensor *const *xs, int n, wf_tensor *out)
{
    (void)ctx;
    return join("concat", false, axis, xs, n, out);
}

int wf__stack_cpu(const wf_kctx *ctx, int axis, const wf_tensor *const *xs, int n, wf_tensor *out)
{
    (void)ctx;
    return join("stack", true, axis, xs, n, out);
}

int wf__pad_cpu(const wf_kctx *ctx, const int64_t *before, const int64_t *after, double value,
                const wf_tensor *x, wf_tensor *out)
{
    (void)ctx;
    int64_t off;
    int rc = wf__ops_shape_check("pad", x, out);
    if (rc < 0 || (rc = wf__ops_pad_layout(before, after, x, out, &off)) < 0)
        return rc;
    size_t es = wf_dtype_size(x->dtype);
    if (out->numel > 0) {
        char one[16];
        wf__store_f64(x->dtype, one, value);
        for (int64_t i = 0; i < out->numel; i++)
            memcpy(out->data + i * (int64_t)es, one, es);
    }
    copy_nd(es, x->shape.rank, x->shape.dims, out->data + off * (int64_t)es, out->strides, x->data,
            x->strides);
    return 0;
}
