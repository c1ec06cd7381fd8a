/* ops/shape_cuda.cu: CUDA twins of ops/shape_cpu.c (reshape, expand_dims, squeeze,
 * transpose, slice, split, concat, stack, pad, broadcast_to), of the backward helpers
 * unreduce (ops/reduce.c), reshape_like (ops/like.c) and slice_backward (ops/backward_cpu.c),
 * and of one_hot (ops/index_cpu.c); and the kernel slots of those ops.
 * Owns: the one strided copy every shape kernel is made of, as the CPU twin's copy_nd: a box
 *   of 'dims' read through source strides and written through destination strides (both in
 *   elements, any sign, 0 for broadcast reads), by element size, so every dtype is copied
 *   bit-exactly; the host builds the box of each op (a view of x, a box inside out) and
 *   launches the copy on the device queue's stream.
 * Invariants: as the CPU twins: 'out' is contiguous of x's dtype; a box never writes an
 *   element of 'out' twice (concat and stack boxes are disjoint; pad and slice_backward fill
 *   first, in stream order, then copy into the interior).
 * Not here: the op definitions (shape.c, like.c, backward.c, index.c). */
#include "cuda_common.h"

#include <string.h>

/* ---- The strided copy --------------------------------------------------------------------- */

template <class E> static __global__ void copy_k(wf_cu_map m, E *dst, const E *src, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t off[WF_CU_MAX_IN];
        wf_cu_offsets(m, i, off);
        dst[off[1]] = src[off[0]];
    }
}

template <class E> static __global__ void fill_k(E *dst, E v, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = v;
}

/* A host-side description of a strided box of 'base''s elements (a wf_tensor nobody
 * allocates: only the index map reads it). */
static void box(wf_tensor *v, wf_dtype dt, int rank, const int64_t *dims, const int64_t *strides,
                char *data)
{
    memset((void *)v, 0, sizeof *v);
    v->dtype = dt;
    v->shape.rank = rank;
    v->numel = 1;
    v->contiguous = true;
    int64_t want = 1;
    for (int d = rank - 1; d >= 0; d--) {
        v->shape.dims[d] = dims[d];
        v->strides[d] = strides[d];
        v->numel *= dims[d];
        if (dims[d] != 1 && strides[d] != want)
            v->contiguous = false;
        want *= dims[d];
    }
    v->data = data;
}

/* (ops/cuda_common.h) */
int wf__cuda_copy_nd(cudaStream_t s, const char *op, wf_dtype dt, int rank, const int64_t *dims,
                     char *dst, const int64_t *ds, const char *src, const int64_t *ss)
{
    wf_tensor vs, vd;
    box(&vs, dt, rank, dims, ss, (char *)src);
    box(&vd, dt, rank, dims, ds, dst);
    int64_t n = vs.numel;
    if (n == 0)
        return 0;
    const wf_tensor *in[2] = { &vs, &vd };
    wf_cu_map m;
    wf__cuda_map_init(&m, vs.shape, in, 2);
    unsigned blocks = wf__cuda_blocks(n, WF_CU_THREADS);
    switch (wf_dtype_size(dt)) {
    case 1:
        copy_k<uint8_t>
            <<<blocks, WF_CU_THREADS, 0, s>>>(m, (uint8_t *)dst, (const uint8_t *)src, n);
        break;
    case 2:
        copy_k<uint16_t>
            <<<blocks, WF_CU_THREADS, 0, s>>>(m, (uint16_t *)dst, (const uint16_t *)src, n);
        break;
    case 4:
        copy_k<uint32_t>
            <<<blocks, WF_CU_THREADS, 0, s>>>(m, (uint32_t *)dst, (const uint32_t *)src, n);
        break;
    case 8:
        copy_k<uint64_t>
            <<<blocks, WF_CU_THREADS, 0, s>>>(m, (uint64_t *)dst, (const uint64_t *)src, n);
        break;
    default:
        return wf__err(WF_EDTYPE, "%s: cannot copy %s elements", op, wf_dtype_name(dt));
    }
    WF_CU_LAUNCHED(op);
    return 0;
}

/* Fills contiguous 'out' with 'value' converted to its dtype (as wf__store_f64). */
static int fill(cudaStream_t s, const char *op, wf_tensor *out, double value)
{
    int64_t n = out->numel;
    if (n == 0)
        return 0;
    char one[16] = { 0 };
    wf__store_f64(out->dtype, one, value);
    unsigned blocks = wf__cuda_blocks(n, WF_CU_THREADS);
    switch (wf_dtype_size(out->dtype)) {
    case 1: {
        uint8_t v;
        memcpy(&v, one, sizeof v);
        fill_k<uint8_t><<<blocks, WF_CU_THREADS, 0, s>>>((uint8_t *)out->data, v, n);
    } break;
    case 2: {
        uint16_t v;
        memcpy(&v, one, sizeof v);
        fill_k<uint16_t><<<blocks, WF_CU_THREADS, 0, s>>>((uint16_t *)out->data, v, n);
    } break;
    case 4: {
        uint32_t v;
        memcpy(&v, one, sizeof v);
        fill_k<uint32_t><<<blocks, WF_CU_THREADS, 0, s>>>((uint32_t *)out->data, v, n);
    } break;
    case 8: {
        uint64_t v;
        memcpy(&v, one, sizeof v);
        fill_k<uint64_t><<<blocks, WF_CU_THREADS, 0, s>>>((uint64_t *)out->data, v, n);
    } break;
    default:
        return wf__err(WF_EDTYPE, "%s: cannot fill %s elements", op, wf_dtype_name(out->dtype));
    }
    WF_CU_LAUNCHED(op);
    return 0;
}

/* The CPU twin's check, then the queue. */
static int enter(const wf_kernel_ctx *ctx, const char *op, const wf_tensor *x, const wf_tensor *out,
                 cudaStream_t *s)
{
    const wf__cuda_queue *q;
    *s = NULL;
    int rc = wf__ops_shape_check(op, x, out);
    if (rc == 0)
        rc = wf__cuda_enter(ctx, op, &q);
    if (rc == 0)
        *s = q->stream;
    return rc;
}

/* ---- The entries ------------------------------------------------------------------------------
 */

int wf__reshape_cuda(const wf_kernel_ctx *ctx, const wf_tensor *x, wf_tensor *out)
{
    cudaStream_t s;
    int rc = enter(ctx, "reshape", x, out, &s);
    if (rc < 0 || (rc = wf__ops_reshape_check(x, out)) < 0)
        return rc;
    int64_t ds[WF_MAX_RANK];
    wf__contiguous_strides(x->shape, ds);
    return wf__cuda_copy_nd(s, "reshape", x->dtype, x->shape.rank, x->shape.dims, out->data, ds,
                            x->data, x->strides);
}

int wf__transpose_cuda(const wf_kernel_ctx *ctx, const int *perm, int n, const wf_tensor *x,
                       wf_tensor *out)
{
    cudaStream_t s;
    wf_shape sh;
    int64_t ss[WF_MAX_RANK];
    int rc = enter(ctx, "transpose", x, out, &s);
    if (rc < 0 || (rc = wf__ops_transpose_layout(perm, n, x, out, &sh, ss)) < 0)
        return rc;
    return wf__cuda_copy_nd(s, "transpose", x->dtype, sh.rank, sh.dims, out->data, out->strides,
                            x->data, ss);
}

int wf__slice_cuda(const wf_kernel_ctx *ctx, const int64_t *begin, const int64_t *end,
                   const int64_t *step, const wf_tensor *x, wf_tensor *out)
{
    cudaStream_t s;
    wf_shape sh;
    int64_t ss[WF_MAX_RANK], off;
    int rc = enter(ctx, "slice", x, out, &s);
    if (rc < 0 || (rc = wf__ops_slice_layout(begin, end, step, x, out, &sh, ss, &off)) < 0 ||
        out->numel == 0)
        return rc;
    return wf__cuda_copy_nd(s, "slice", x->dtype, sh.rank, sh.dims, out->data, out->strides,
                            x->data + off * (int64_t)wf_dtype_size(x->dtype), ss);
}

int wf__broadcast_to_cuda(const wf_kernel_ctx *ctx, const wf_tensor *x, wf_tensor *out)
{
    cudaStream_t s;
    int64_t ss[WF_MAX_RANK];
    int rc = enter(ctx, "broadcast_to", x, out, &s);
    if (rc < 0 || (rc = wf__ops_broadcast_layout(x, out, ss)) < 0)
        return rc;
    return wf__cuda_copy_nd(s, "broadcast_to", x->dtype, out->shape.rank, out->shape.dims,
                            out->data, out->strides, x->data, ss);
}

/* concat and stack: input i goes to the box of 'out' that starts at 'pos' along 'axis';
 * 'stack' inserts 'axis' into each input's shape as a size-1 axis first (as the CPU twin). */
static int join(const wf_kernel_ctx *ctx, const char *op, bool stack, int axis,
                const wf_tensor *const *xs, int n, wf_tensor *out)
{
    int rc = wf__ops_join_check(op, xs, n, out);
    if (rc < 0)
        return rc;
    int64_t pos = 0;
    size_t es = wf_dtype_size(out->dtype);
    for (int i = 0; i < n; i++) {
        const wf_tensor *x = xs[i];
        cudaStream_t s;
        int64_t dims[WF_MAX_RANK], ss[WF_MAX_RANK];
        int r;
        rc = enter(ctx, op, x, out, &s);
        if (rc < 0 || (rc = wf__ops_join_layout(op, stack, axis, i, x, out, pos, dims, ss, &r)) < 0)
            return rc;
        rc = wf__cuda_copy_nd(s, op, x->dtype, r, dims,
                              out->data + pos * out->strides[axis] * (int64_t)es, out->strides,
                              x->data, ss);
        if (rc < 0)
            return rc;
        pos += dims[axis];
    }
    return wf__ops_join_filled(op, axis, pos, out);
}

int wf__concat_cuda(const wf_kernel_ctx *ctx, int axis, const wf_tensor *const *xs, int n,
                    wf_tensor *out)
{
    return join(ctx, "concat", false, axis, xs, n, out);
}

int wf__stack_cuda(const wf_kernel_ctx *ctx, int axis, const wf_tensor *const *xs, int n,
                   wf_tensor *out)
{
    return join(ctx, "stack", true, axis, xs, n, out);
}

int wf__pad_cuda(const wf_kernel_ctx *ctx, const int64_t *before, const int64_t *after,
                 double value, const wf_tensor *x, wf_tensor *out)
{
    cudaStream_t s;
    int64_t off;
    int rc = enter(ctx, "pad", x, out, &s);
    if (rc < 0 || (rc = wf__ops_pad_layout(before, after, x, out, &off)) < 0 ||
        (rc = fill(s, "pad", out, value)) < 0)
        return rc;
    return wf__cuda_copy_nd(s, "pad", x->dtype, x->shape.rank, x->shape.dims,
                            out->data + off * (int64_t)wf_dtype_size(x->dtype), out->strides,
                            x->data, x->strides);
}

int wf__slice_backward_cuda(const wf_kernel_ctx *ctx, const int64_t *begin, const int64_t *end,
                            const int64_t *step, const wf_tensor *dy, wf_tensor *out)
{
    if (!dy || !out || !begin || !end || !step)
        return wf__err(WF_EINVAL, "slice_backward: NULL argument");
    cudaStream_t s;
    int rc = enter(ctx, "slice_backward", dy, out, &s);
    if (rc < 0)
        return rc;
    int r = out->shape.rank;
    int64_t ds[WF_MAX_RANK], off;
    if ((rc = wf__ops_slice_backward_layout(begin, end, step, dy, out, ds, &off)) < 0)
        return rc;
    if (out->numel > 0)
        WF_CU_TRY(cudaMemsetAsync(out->data, 0, (size_t)out->numel * wf_dtype_size(out->dtype), s),
                  "slice_backward", "zeroing the output");
    if (dy->numel == 0)
        return 0;
    return wf__cuda_copy_nd(s, "slice_backward", dy->dtype, r, dy->shape.dims,
                            out->data + off * (int64_t)wf_dtype_size(out->dtype), ds, dy->data,
                            dy->strides);
}

/* out *= f in out's type: f32 multiplies by (float)f, f64 by f, bf16 and f16 in f32. */
template <class S> static __global__ void scale_k(S *out, double f, int64_t n)
{
    typedef typename wf_cu_compute<S>::type T;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        out[i] = wf_cu_st<S>((T)(wf_cu_ld<T>(out[i]) * (T)f));
}

/* ---- one_hot ------------------------------------------------------------------------------- */

template <class L, class E>
static __global__ void one_hot_k(const L *idx, E *out, E one, int64_t depth, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        out[i] = (int64_t)idx[i / depth] == i % depth ? one : E();
}

template <class L>
static int launch_one_hot(cudaStream_t s, const void *idx, wf_tensor *out, int64_t depth)
{
    char one[16] = { 0 };
    wf__store_f64(out->dtype, one, 1.0);
    int64_t n = out->numel;
    unsigned blocks = wf__cuda_blocks(n, WF_CU_THREADS);
    switch (wf_dtype_size(out->dtype)) {
    case 1:
        one_hot_k<L, uint8_t><<<blocks, WF_CU_THREADS, 0, s>>>((const L *)idx, (uint8_t *)out->data,
                                                               *(uint8_t *)one, depth, n);
        break;
    case 2: {
        uint16_t v;
        memcpy(&v, one, sizeof v);
        one_hot_k<L, uint16_t>
            <<<blocks, WF_CU_THREADS, 0, s>>>((const L *)idx, (uint16_t *)out->data, v, depth, n);
    } break;
    case 4: {
        uint32_t v;
        memcpy(&v, one, sizeof v);
        one_hot_k<L, uint32_t>
            <<<blocks, WF_CU_THREADS, 0, s>>>((const L *)idx, (uint32_t *)out->data, v, depth, n);
    } break;
    default: {
        uint64_t v;
        memcpy(&v, one, sizeof v);
        one_hot_k<L, uint64_t>
            <<<blocks, WF_CU_THREADS, 0, s>>>((const L *)idx, (uint64_t *)out->data, v, depth, n);
    }
    }
    WF_CU_LAUNCHED("one_hot");
    return 0;
}

int wf__one_hot_cuda(const wf_kernel_ctx *ctx, const wf_tensor *indices, wf_tensor *out)
{
    const wf__cuda_queue *q;
    int rc = wf__ops_one_hot_check(indices, out);
    if (rc == 0)
        rc = wf__cuda_enter(ctx, "one_hot", &q);
    if (rc < 0 || out->numel == 0)
        return rc;
    cudaStream_t s = q->stream;
    int64_t depth = out->shape.dims[out->shape.rank - 1];
    const void *idx = indices->data;
    void *tmp = NULL;
    if (!indices->contiguous) {
        rc = wf__cuda_tmp(s, (size_t)indices->numel * wf_dtype_size(indices->dtype), "one_hot",
                          &tmp);
        if (rc == 0)
            rc = wf__cuda_pack(s, indices, tmp, "one_hot");
        idx = tmp;
    }
    if (rc == 0)
        rc = indices->dtype == WF_I64 ? launch_one_hot<int64_t>(s, idx, out, depth)
                                      : launch_one_hot<int32_t>(s, idx, out, depth);
    wf__cuda_tmp_free(s, tmp);
    return rc;
}

/* ---- The op defs' CUDA slots (shape.c, reduce.c's unreduce, like.c, backward.c, index.c) --- */

#define RESHAPE_SLOT(id)                                                                       \
    int wf__cuda_kernel_##id(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in, \
                             wf_tensor **out)                                                  \
    {                                                                                          \
        (void)n;                                                                               \
        return wf__reshape_cuda(ctx, in[0], *out);                                             \
    }
RESHAPE_SLOT(reshape)
RESHAPE_SLOT(expand_dims)
RESHAPE_SLOT(squeeze)

/* shape.c's transpose_perm: n_axes 0 is the reversal. */
int wf__cuda_kernel_transpose(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                              wf_tensor **out)
{
    int perm[WF_MAX_RANK], r = in[0]->shape.rank, k = n->attrs->n_axes;
    bool seen[WF_MAX_RANK] = { false };
    bool ok = k == 0 || k == r;
    for (int d = 0; ok && d < r; d++) {
        int p = k == 0 ? r - 1 - d : n->attrs->axes[d];
        if (p < 0)
            p += r;
        ok = p >= 0 && p < r && !seen[p];
        if (ok) {
            seen[p] = true;
            perm[d] = p;
        }
    }
    if (!ok)
        return wf__err(WF_EINVAL, "transpose: bad permutation for rank %d", r);
    return wf__transpose_cuda(ctx, perm, r, in[0], *out);
}

int wf__cuda_kernel_slice(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                          wf_tensor **out)
{
    return wf__slice_cuda(ctx, n->attrs->begin, n->attrs->end, n->attrs->step, in[0], *out);
}

/* split's part 'depth' of 'groups' equal parts along 'axis' (shape.c). */
int wf__cuda_kernel_split(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                          wf_tensor **out)
{
    const wf_tensor *x = in[0];
    int64_t begin[WF_MAX_RANK], end[WF_MAX_RANK], step[WF_MAX_RANK];
    int rc = wf__ops_split_box(n, x, begin, end, step);
    if (rc < 0)
        return rc;
    return wf__slice_cuda(ctx, begin, end, step, x, *out);
}

int wf__cuda_kernel_concat(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                           wf_tensor **out)
{
    int ax = n->attrs->axis;
    if (ax < 0)
        ax += (*out)->shape.rank;
    return wf__concat_cuda(ctx, ax, (const wf_tensor *const *)in, n->n_inputs, *out);
}

int wf__cuda_kernel_stack(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                          wf_tensor **out)
{
    int ax = n->attrs->axis;
    if (ax < 0)
        ax += (*out)->shape.rank;
    return wf__stack_cuda(ctx, ax, (const wf_tensor *const *)in, n->n_inputs, *out);
}

int wf__cuda_kernel_pad(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                        wf_tensor **out)
{
    return wf__pad_cuda(ctx, n->attrs->begin, n->attrs->end, n->attrs->alpha, in[0], *out);
}

int wf__cuda_kernel_broadcast_to(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                                 wf_tensor **out)
{
    (void)n;
    return wf__broadcast_to_cuda(ctx, in[0], *out);
}

int wf__cuda_kernel_slice_backward(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                                   wf_tensor **out)
{
    return wf__slice_backward_cuda(ctx, n->attrs->begin, n->attrs->end, n->attrs->step, in[0],
                                   *out);
}

int wf__cuda_kernel_one_hot(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                            wf_tensor **out)
{
    (void)n;
    return wf__one_hot_cuda(ctx, in[0], *out);
}

/* reshape_like: dy's elements, row-major, in the reference's shape (like.c). */
int wf__cuda_kernel_reshape_like(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                                 wf_tensor **out)
{
    (void)n;
    return wf__reshape_cuda(ctx, in[0], *out);
}

/* unreduce: dy spread back over x's shape (reduce.c): dy seen with the reduced axes as size 1
 * at stride 0, broadcast into out, then divided by the reduced count for mean (alpha != 0). */
int wf__cuda_kernel_unreduce(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                             wf_tensor **out)
{
    const wf_tensor *dy = in[0];
    wf_tensor *o = *out;
    wf_shape ks;
    int64_t st[WF_MAX_RANK];
    wf__ops_unreduce_view(n, dy, o, &ks, st);
    wf_tensor v;
    box(&v, dy->dtype, ks.rank, ks.dims, st, dy->data);
    int rc = wf__broadcast_to_cuda(ctx, &v, o);
    if (rc < 0 || n->attrs->alpha == 0 || o->numel == 0)
        return rc;
    /* mean: out *= count of dy / count of out, in out's dtype (as the CPU twin) */
    const wf__cuda_queue *q;
    if ((rc = wf__cuda_enter(ctx, "unreduce", &q)) < 0)
        return rc;
    double f = (double)dy->numel / (double)o->numel;
    int64_t cnt = o->numel;
    unsigned blocks = wf__cuda_blocks(cnt, WF_CU_THREADS);
    rc = WF_EDTYPE;
    WF_CU_FLOAT_SWITCH(
        o->dtype,
        (rc = 0, scale_k<S><<<blocks, WF_CU_THREADS, 0, q->stream>>>((S *)o->data, f, cnt)), break)
    if (rc < 0)
        return wf__err(WF_EDTYPE, "unreduce: mean of %s", wf_dtype_name(o->dtype));
    WF_CU_LAUNCHED("unreduce");
    return rc;
}
