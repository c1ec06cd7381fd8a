/* ops/index_cuda.cu: CUDA twins of ops/index_cpu.c's gather (embedding lookup) and of
 * scatter_add (its backward); and the kernel slots of those ops.
 * Owns: gather as a thread per output element (out [outer, n_idx, inner] read from params
 *   through its strides), scatter_add as a thread per update element adding into the zeroed
 *   output with atomics (bf16 and f16 through an f32 accumulator rounded once, as the CPU's).
 * Invariants: indices are validated on the device: the first bad position is recorded, and
 *   the entry waits for the stream and fails with the CPU twin's message (gather then leaves
 *   zeros where an index was bad, scatter_add adds nothing for it). Floating scatter_add sums
 *   in atomic order: equal to the CPU's index-order sum up to rounding (integer sums wrap and
 *   are exact).
 * Not here: the op definitions (index.c), one_hot (no CUDA kernel yet). */
#include "cuda_common.h"

#include <type_traits>

struct ix_plan {
    int pr, axis;
    int64_t outer, n_idx, inner, dim, n;
    int64_t pdims[WF_MAX_RANK], pst[WF_MAX_RANK];
};

template <class L> __device__ __forceinline__ int64_t index_of(const L *idx, int64_t q)
{
    return (int64_t)idx[q];
}

template <class E, class L>
static __global__ void gather_k(ix_plan p, const E *params, const L *idx, E *out,
                                unsigned long long *bad)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < p.n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t k = i % p.inner, t = i / p.inner, q = t % p.n_idx, o = t / p.n_idx;
        int64_t v = index_of(idx, q);
        if (v < 0 || v >= p.dim) {
            atomicMin(bad, (unsigned long long)q);
            out[i] = E();
            continue;
        }
        int64_t off = v * p.pst[p.axis];
        for (int d = p.pr - 1; d > p.axis; d--) {
            off += (k % p.pdims[d]) * p.pst[d];
            k /= p.pdims[d];
        }
        for (int d = p.axis - 1; d >= 0; d--) {
            off += (o % p.pdims[d]) * p.pst[d];
            o /= p.pdims[d];
        }
        out[i] = params[off];
    }
}

/* Adds update element i (row-major over updates' shape, read through map 'm') into acc. */
template <class S, class A, class L>
static __global__ void scatter_add_k(ix_plan p, wf_cu_map m, const S *upd, const L *idx, A *acc,
                                     unsigned long long *bad)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < p.n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t k = i % p.inner, t = i / p.inner, q = t % p.n_idx, o = t / p.n_idx;
        int64_t v = index_of(idx, q);
        if (v < 0 || v >= p.dim) {
            atomicMin(bad, (unsigned long long)q);
            continue;
        }
        int64_t off[WF_CU_MAX_IN];
        wf_cu_offsets(m, i, off);
        A *dst = acc + (o * p.dim + v) * p.inner + k;
        if constexpr (std::is_same<A, int64_t>::value)
            atomicAdd((unsigned long long *)dst, (unsigned long long)upd[off[0]]);
        else if constexpr (std::is_same<A, int32_t>::value)
            atomicAdd((int *)dst, (int)upd[off[0]]);
        else
            atomicAdd(dst, (A)wf_cu_ld<typename wf_cu_compute<S>::type>(upd[off[0]]));
    }
}

template <class S> static __global__ void round_k(const float *acc, S *out, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        out[i] = wf_cu_st<S>(acc[i]);
}

/* Indices as a contiguous array (a packed temporary when strided) and a zeroed bad flag. */
static int prepare(cudaStream_t s, const char *op, const wf_tensor *indices, const void **idx,
                   void **idx_tmp, void **flag)
{
    *idx_tmp = *flag = NULL;
    *idx = indices->data;
    int rc = 0;
    if (!indices->contiguous) {
        rc = wf__cuda_tmp(s, (size_t)indices->numel * wf_dtype_size(indices->dtype), op, idx_tmp);
        if (rc == 0)
            rc = wf__cuda_pack(s, indices, *idx_tmp, op);
        *idx = *idx_tmp;
    }
    if (rc == 0)
        rc = wf__cuda_flag(s, op, flag);
    return rc;
}

/* Waits for the flag; on a bad position reads its index and fails with the CPU's message. */
static int check_flag(cudaStream_t s, const char *op, const wf_tensor *indices, const void *idx,
                      const void *flag, int64_t dim, const wf_tensor *other, int axis)
{
    int64_t bad = -1;
    int rc = wf__cuda_read_flag(s, (const int64_t *)flag, op, &bad);
    if (rc < 0 || bad == -1)
        return rc;
    int64_t v = 0;
    size_t es = wf_dtype_size(indices->dtype);
    WF_CU_TRY(
        cudaMemcpyAsync(&v, (const char *)idx + bad * (int64_t)es, es, cudaMemcpyDeviceToHost, s),
        op, "reading a bad index");
    WF_CU_TRY(cudaStreamSynchronize(s), op, "reading a bad index");
    if (es == 4)
        v = (int64_t)(int32_t)v;
    char s1[160], s2[160];
    return wf__err(
        WF_EINVAL,
        "%s: index %lld at position %lld of indices %s is outside [0, %lld) (%s %s, axis "
        "%d)",
        op, (long long)v, (long long)bad, wf_shape_str(indices->shape, s1, sizeof s1),
        (long long)dim, op[0] == 'g' ? "params" : "out", wf_shape_str(other->shape, s2, sizeof s2),
        axis);
}

template <class E>
static void launch_gather(cudaStream_t s, const ix_plan &p, bool l64, const void *params,
                          const void *idx, void *out, void *flag)
{
    unsigned blocks = wf__cuda_blocks(p.n, WF_CU_THREADS);
    if (l64)
        gather_k<E, int64_t><<<blocks, WF_CU_THREADS, 0, s>>>(
            p, (const E *)params, (const int64_t *)idx, (E *)out, (unsigned long long *)flag);
    else
        gather_k<E, int32_t><<<blocks, WF_CU_THREADS, 0, s>>>(
            p, (const E *)params, (const int32_t *)idx, (E *)out, (unsigned long long *)flag);
}

int wf__gather_cuda(const wf_kernel_ctx *ctx, int axis, const wf_tensor *params,
                    const wf_tensor *indices, wf_tensor *out)
{
    const wf__cuda_queue *q;
    int rc = wf__ops_gather_check(axis, params, indices, out);
    if (rc < 0 || (rc = wf__cuda_enter(ctx, "gather", &q)) < 0)
        return rc;
    int pr = params->shape.rank;
    ix_plan p;
    p.pr = pr;
    p.axis = axis;
    p.outer = p.inner = 1;
    for (int d = 0; d < pr; d++) {
        p.pdims[d] = params->shape.dims[d];
        p.pst[d] = params->strides[d];
        if (d < axis)
            p.outer *= p.pdims[d];
        else if (d > axis)
            p.inner *= p.pdims[d];
    }
    p.dim = params->shape.dims[axis];
    p.n_idx = indices->numel;
    p.n = out->numel;
    if (p.n == 0)
        return 0;
    cudaStream_t s = q->stream;
    const void *idx;
    void *idx_tmp, *flag;
    rc = prepare(s, "gather", indices, &idx, &idx_tmp, &flag);
    if (rc == 0) {
        bool l64 = indices->dtype == WF_I64;
        switch (wf_dtype_size(params->dtype)) {
        case 1:
            launch_gather<uint8_t>(s, p, l64, params->data, idx, out->data, flag);
            break;
        case 2:
            launch_gather<uint16_t>(s, p, l64, params->data, idx, out->data, flag);
            break;
        case 4:
            launch_gather<uint32_t>(s, p, l64, params->data, idx, out->data, flag);
            break;
        default:
            launch_gather<uint64_t>(s, p, l64, params->data, idx, out->data, flag);
        }
        cudaError_t e = cudaGetLastError();
        rc = e == cudaSuccess ? 0 : wf__cuda_fail(e, "gather", "kernel launch");
    }
    if (rc == 0)
        rc = check_flag(s, "gather", indices, idx, flag, p.dim, params, axis);
    wf__cuda_tmp_free(s, idx_tmp);
    wf__cuda_tmp_free(s, flag);
    return rc;
}

template <class S, class A>
static void launch_scatter(cudaStream_t s, const ix_plan &p, const wf_cu_map &m, bool l64,
                           const void *upd, const void *idx, void *acc, void *flag)
{
    unsigned blocks = wf__cuda_blocks(p.n, WF_CU_THREADS);
    if (l64)
        scatter_add_k<S, A, int64_t><<<blocks, WF_CU_THREADS, 0, s>>>(
            p, m, (const S *)upd, (const int64_t *)idx, (A *)acc, (unsigned long long *)flag);
    else
        scatter_add_k<S, A, int32_t><<<blocks, WF_CU_THREADS, 0, s>>>(
            p, m, (const S *)upd, (const int32_t *)idx, (A *)acc, (unsigned long long *)flag);
}

int wf__scatter_add_cuda(const wf_kernel_ctx *ctx, int axis, const wf_tensor *updates,
                         const wf_tensor *indices, wf_tensor *out)
{
    int rc = wf__ops_scatter_add_check(axis, updates, indices, out);
    const wf__cuda_queue *q;
    if (rc < 0 || (rc = wf__cuda_enter(ctx, "scatter_add", &q)) < 0)
        return rc;
    cudaStream_t s = q->stream;
    ix_plan p;
    p.axis = axis;
    p.pr = out->shape.rank;
    p.outer = p.inner = 1;
    for (int d = 0; d < axis; d++)
        p.outer *= out->shape.dims[d];
    for (int d = axis + 1; d < out->shape.rank; d++)
        p.inner *= out->shape.dims[d];
    p.dim = out->shape.dims[axis];
    p.n_idx = indices->numel;
    p.n = updates->numel;
    wf_dtype dt = out->dtype;
    bool half = dt == WF_BF16 || dt == WF_F16;
    size_t acc_bytes = (size_t)out->numel * (half ? sizeof(float) : wf_dtype_size(dt));
    void *acc = out->data, *acc_tmp = NULL;
    if (half) {
        rc = wf__cuda_tmp(s, acc_bytes, "scatter_add", &acc_tmp);
        acc = acc_tmp;
    }
    if (rc == 0 && acc_bytes > 0) {
        cudaError_t e = cudaMemsetAsync(acc, 0, acc_bytes, s);
        if (e != cudaSuccess)
            rc = wf__cuda_fail(e, "scatter_add", "zeroing the output");
    }
    const void *idx = NULL;
    void *idx_tmp = NULL, *flag = NULL;
    if (rc == 0 && p.n > 0) {
        rc = prepare(s, "scatter_add", indices, &idx, &idx_tmp, &flag);
        if (rc == 0) {
            wf_cu_map m;
            wf__cuda_map_init(&m, updates->shape, &updates, 1);
            bool l64 = indices->dtype == WF_I64;
            const void *u = updates->data;
            switch (dt) {
            case WF_F32:
                launch_scatter<float, float>(s, p, m, l64, u, idx, acc, flag);
                break;
            case WF_F64:
                launch_scatter<double, double>(s, p, m, l64, u, idx, acc, flag);
                break;
            case WF_I32:
                launch_scatter<int32_t, int32_t>(s, p, m, l64, u, idx, acc, flag);
                break;
            case WF_I64:
                launch_scatter<int64_t, int64_t>(s, p, m, l64, u, idx, acc, flag);
                break;
            case WF_BF16:
                launch_scatter<__nv_bfloat16, float>(s, p, m, l64, u, idx, acc, flag);
                break;
            default:
                launch_scatter<__half, float>(s, p, m, l64, u, idx, acc, flag);
            }
            cudaError_t e = cudaGetLastError();
            rc = e == cudaSuccess ? 0 : wf__cuda_fail(e, "scatter_add", "kernel launch");
        }
    }
    if (rc == 0 && half && out->numel > 0) {
        unsigned blocks = wf__cuda_blocks(out->numel, WF_CU_THREADS);
        if (dt == WF_BF16)
            round_k<__nv_bfloat16><<<blocks, WF_CU_THREADS, 0, s>>>(
                (const float *)acc, (__nv_bfloat16 *)out->data, out->numel);
        else
            round_k<__half><<<blocks, WF_CU_THREADS, 0, s>>>((const float *)acc,
                                                             (__half *)out->data, out->numel);
        cudaError_t e = cudaGetLastError();
        rc = e == cudaSuccess ? 0 : wf__cuda_fail(e, "scatter_add", "kernel launch");
    }
    if (rc == 0 && flag)
        rc = check_flag(s, "scatter_add", indices, idx, flag, p.dim, out, axis);
    wf__cuda_tmp_free(s, idx_tmp);
    wf__cuda_tmp_free(s, flag);
    wf__cuda_tmp_free(s, acc_tmp);
    return rc;
}

/* ---- The op defs' CUDA slots (index.c's kernels) --------------------------------------------- */

int wf__cuda_kernel_gather(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                           wf_tensor **out)
{
    int ax = n->attrs->axis;
    if (ax < 0)
        ax += in[0]->shape.rank;
    return wf__gather_cuda(ctx, ax, in[0], in[1], *out);
}

int wf__cuda_kernel_scatter_add(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                                wf_tensor **out)
{
    int ax = n->attrs->axis;
    if (ax < 0)
        ax += (*out)->shape.rank;
    return wf__scatter_add_cuda(ctx, ax, in[0], in[1], *out);
}
