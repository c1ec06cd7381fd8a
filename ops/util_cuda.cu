/* ops/util_cuda.cu: the shared host side of ops/' CUDA twins (ops/cuda_common.h): CUDA,
 * cuBLAS and cuDNN statuses as weft's, the cuBLAS and cuDNN types of a dtype, entering a
 * kernel context, stream-ordered temporaries, reading a device-side check, the strided index
 * map, and the layout check of the C structs as C++ sees them.
 * Owns: nothing with state (the library handles are the device queue's, devices/cuda.h).
 * Invariants: every CUDA call's status is checked.
 * Not here: kernels (the other ops/NAME_cuda.cu files). */
#include "cuda_common.h"

#include <stdio.h>
#include <string.h>

/* ---- Statuses -------------------------------------------------------------------------------- */

int wf__cuda_fail(cudaError_t e, const char *op, const char *what)
{
    int code = e == cudaErrorMemoryAllocation ? WF_ENOMEM : WF_EDEVICE;
    return wf__err(code, "%s: %s: %s (%s)", op, what, cudaGetErrorString(e), cudaGetErrorName(e));
}

int wf__cublas_fail(cublasStatus_t s, const char *op, const char *what)
{
    int code = s == CUBLAS_STATUS_ALLOC_FAILED ? WF_ENOMEM : WF_EDEVICE;
    return wf__err(code, "%s: %s: cuBLAS %s (%s)", op, what, cublasGetStatusString(s),
                   cublasGetStatusName(s));
}

int wf__cudnn_fail(cudnnStatus_t s, const char *op, const char *what)
{
    int code = s == CUDNN_STATUS_ALLOC_FAILED ? WF_ENOMEM : WF_EDEVICE;
    return wf__err(code, "%s: %s: cuDNN %s", op, what, cudnnGetErrorString(s));
}

/* ---- Library types --------------------------------------------------------------------------- */

/* { storage, cuBLAS compute, f64 alpha/beta, cuDNN storage, cuDNN compute, cuDNN math } */
static const wf__cuda_types types_f64 = { CUDA_R_64F,        CUBLAS_COMPUTE_64F, true,
                                          CUDNN_DATA_DOUBLE, CUDNN_DATA_DOUBLE,  CUDNN_FMA_MATH };
static const wf__cuda_types types_bf16 = {
    CUDA_R_16BF,         CUBLAS_COMPUTE_32F, false,
    CUDNN_DATA_BFLOAT16, CUDNN_DATA_FLOAT,   CUDNN_TENSOR_OP_MATH
};
static const wf__cuda_types types_f16 = {
    CUDA_R_16F, CUBLAS_COMPUTE_32F, false, CUDNN_DATA_HALF, CUDNN_DATA_FLOAT, CUDNN_TENSOR_OP_MATH
};
static const wf__cuda_types types_f32 = {
    CUDA_R_32F, CUBLAS_COMPUTE_32F, false, CUDNN_DATA_FLOAT, CUDNN_DATA_FLOAT, CUDNN_FMA_MATH
}; /* no TF32 */

wf__cuda_types wf__cuda_types_of(wf_dtype dt)
{
    switch (dt) {
    case WF_F64:
        return types_f64;
    case WF_BF16:
        return types_bf16;
    case WF_F16:
        return types_f16;
    default:
        return types_f32;
    }
}

/* ---- Contexts and handles -------------------------------------------------------------------- */

int wf__cuda_enter(const wf_kernel_ctx *ctx, const char *op, const wf__cuda_queue **q)
{
    const wf__cuda_queue *queue = wf__cuda_queue_of(ctx);
    if (!queue || !queue->stream)
        return wf__err(WF_EINVAL,
                       "%s: a CUDA kernel needs the context of a CUDA device (%s is NULL)", op,
                       !ctx     ? "ctx"
                       : !queue ? "ctx->stream"
                                : "its queue's stream");
    int cur = -1;
    WF_CU_TRY(cudaGetDevice(&cur), op, "cudaGetDevice");
    if (cur != queue->ordinal)
        WF_CU_TRY(cudaSetDevice(queue->ordinal), op, "cudaSetDevice");
    *q = queue;
    return 0;
}

/* ---- Temporaries and device-side checks ------------------------------------------------------ */

int wf__cuda_tmp(cudaStream_t stream, size_t bytes, const char *op, void **p)
{
    *p = NULL;
    if (bytes == 0)
        return 0;
    cudaError_t e = cudaMallocAsync(p, bytes, stream);
    if (e != cudaSuccess) {
        *p = NULL;
        char what[96];
        snprintf(what, sizeof what, "a temporary of %zu bytes", bytes);
        return wf__cuda_fail(e, op, what);
    }
    return 0;
}

void wf__cuda_tmp_free(cudaStream_t stream, void *p)
{
    if (p)
        (void)cudaFreeAsync(p, stream); /* an error here is the stream's, seen by its next user */
}

int wf__cuda_flag(cudaStream_t s, const char *op, void **flag)
{
    int rc = wf__cuda_tmp(s, sizeof(int64_t), op, flag);
    if (rc < 0)
        return rc;
    cudaError_t e = cudaMemsetAsync(*flag, 0xff, sizeof(int64_t), s);
    if (e != cudaSuccess) {
        wf__cuda_tmp_free(s, *flag);
        *flag = NULL;
        return wf__cuda_fail(e, op, "cudaMemsetAsync");
    }
    return 0;
}

int wf__cuda_read_flag(cudaStream_t stream, const int64_t *dev, const char *op, int64_t *host)
{
    WF_CU_TRY(cudaMemcpyAsync(host, dev, sizeof *host, cudaMemcpyDeviceToHost, stream), op,
              "reading a device-side check");
    WF_CU_TRY(cudaStreamSynchronize(stream), op, "waiting for a device-side check");
    return 0;
}

/* ---- The strided index map ------------------------------------------------------------------- */

void wf__cuda_map_init(wf_cu_map *m, wf_shape out_shape, const wf_tensor *const *in, int n_in)
{
    int r = out_shape.rank;
    int64_t st[WF_CU_MAX_IN][WF_MAX_RANK];
    m->n_in = n_in;
    m->flat = true;
    m->scalar = 0;
    for (int k = 0; k < n_in; k++) {
        const wf_tensor *t = in[k];
        bool same = t->shape.rank == r;
        for (int d = 0; same && d < r; d++)
            same = t->shape.dims[d] == out_shape.dims[d];
        if (t->contiguous && t->numel == 1)
            m->scalar |= 1u << k;
        else if (!(t->contiguous && same))
            m->flat = false;
        wf__ops_bcast_strides(t, r, 1, st[k]);
    }
    /* As the CPU iterator (elementwise_cpu.c), with element strides. */
    m->rank = wf__ops_merge_axes(out_shape, n_in, st, m->dims, m->st);
}

/* ---- Packing --------------------------------------------------------------------------------- */

template <class E> static __global__ void pack_k(wf_cu_map m, E *out, const E *x, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t off[WF_CU_MAX_IN];
        wf_cu_offsets(m, i, off);
        out[i] = x[off[0]];
    }
}

int wf__cuda_pack(cudaStream_t s, const wf_tensor *t, void *dst, const char *op)
{
    int64_t n = t->numel;
    if (n == 0)
        return 0;
    wf_cu_map m;
    wf__cuda_map_init(&m, t->shape, &t, 1);
    unsigned blocks = wf__cuda_blocks(n, WF_CU_THREADS);
    switch (wf_dtype_size(t->dtype)) {
    case 1:
        pack_k<uint8_t>
            <<<blocks, WF_CU_THREADS, 0, s>>>(m, (uint8_t *)dst, (const uint8_t *)t->data, n);
        break;
    case 2:
        pack_k<uint16_t>
            <<<blocks, WF_CU_THREADS, 0, s>>>(m, (uint16_t *)dst, (const uint16_t *)t->data, n);
        break;
    case 4:
        pack_k<uint32_t>
            <<<blocks, WF_CU_THREADS, 0, s>>>(m, (uint32_t *)dst, (const uint32_t *)t->data, n);
        break;
    case 8:
        pack_k<uint64_t>
            <<<blocks, WF_CU_THREADS, 0, s>>>(m, (uint64_t *)dst, (const uint64_t *)t->data, n);
        break;
    default:
        return wf__err(WF_EDTYPE, "%s: cannot pack a %s tensor", op, wf_dtype_name(t->dtype));
    }
    WF_CU_LAUNCHED(op);
    return 0;
}

/* ---- Checks ---------------------------------------------------------------------------------- */

int wf__cuda_layout_check(const size_t *sizes, int n)
{
    const size_t mine[] = {
        sizeof(wf_tensor),
        offsetof(wf_tensor, dtype),
        offsetof(wf_tensor, shape),
        offsetof(wf_tensor, strides),
        offsetof(wf_tensor, numel),
        offsetof(wf_tensor, data),
        sizeof(wf_node),
        offsetof(wf_node, attrs),
        sizeof(wf_attrs),
        offsetof(wf_attrs, alpha),
    };
    static const char *const names[] = {
        "sizeof(wf_tensor)",
        "offsetof(wf_tensor, dtype)",
        "offsetof(wf_tensor, shape)",
        "offsetof(wf_tensor, strides)",
        "offsetof(wf_tensor, numel)",
        "offsetof(wf_tensor, data)",
        "sizeof(wf_node)",
        "offsetof(wf_node, attrs)",
        "sizeof(wf_attrs)",
        "offsetof(wf_attrs, alpha)",
    };
    const int count = (int)(sizeof mine / sizeof mine[0]);
    if (n != count)
        return wf__err(WF_EINVAL, "cuda layout check: %d sizes given, %d expected", n, count);
    for (int i = 0; i < count; i++)
        if (sizes[i] != mine[i])
            return wf__err(WF_EINVAL, "cuda layout check: %s is %zu in C but %zu in CUDA C++",
                           names[i], sizes[i], mine[i]);
    return 0;
}

bool wf__cuda_have_device(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError(); /* clear the sticky "no driver" error for later callers */
        return false;
    }
    return n > 0;
}
