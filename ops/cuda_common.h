/* ops/cuda_common.h: what the CUDA twins of ops/ (ops/NAME_cuda.cu) share: the C headers they
 * read tensors and nodes through, turning CUDA, cuBLAS and cuDNN statuses into weft's, the
 * cuBLAS and cuDNN types of each floating dtype, entering a kernel context (its device queue:
 * stream and library handles), stream-ordered temporaries, launch sizes, the strided N-d
 * index map of the elementwise and reduction kernels, and element conversions for bf16 and
 * f16 storage (a module interface of ops/ for its .cu files only: C++, never included from C).
 * Owns: the C++ view of the C headers: core/tensor.h declares its reference counts
 *   '_Atomic int64_t', which C++ cannot parse; here '_Atomic' reads as 'volatile', which has
 *   the same size and alignment for int64_t on every target CUDA supports (x86-64, aarch64),
 *   so struct wf_tensor, wf_buffer and wf_node have the C layout. The .cu files never touch
 *   those counts (they only read shapes, strides, data pointers and attributes);
 *   wf__cuda_layout_check() lets a C test compare the two layouts field by field.
 * Invariants: every entry (an 'extern "C"' wf__<op>_cuda function) validates its tensors on
 *   the host, enqueues work on its device queue's stream only (devices/cuda.h; never the
 *   legacy default stream), never
 *   synchronises the stream except where its header says so (results checked on the host:
 *   integer division by zero, indices out of range), and turns every failure into a
 *   negative wf_status with a message naming the op, the shapes and the CUDA error.
 *   Kernels index with int64_t and loop grid-stride, so any numel fits any grid.
 * Not here: the device actor, its streams and its memory pool (devices/), the kernels
 *   themselves (ops/NAME_cuda.cu), their C declarations (ops/cuda_kernels.h). */
#ifndef WF_OPS_CUDA_COMMON_H
#define WF_OPS_CUDA_COMMON_H

#ifndef __cplusplus
#    error "ops/cuda_common.h is for the .cu files of ops/ (C++)"
#endif

/* CUDA's headers first (C++ templates: never inside the extern "C" block below, where the
 * C headers would include them again). */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cudnn.h>

/* The C headers under C++: skip C's <stdatomic.h> and read '_Atomic T' as 'volatile T'
 * (see the header comment). */
#define _STDATOMIC_H 1
#define _Atomic volatile
extern "C" {
#include "../core/error.h"
#include "../core/graph.h"
#include "../core/op.h"
#include "../core/tensor.h"
#include "../devices/cuda.h"
#include "cuda_kernels.h"
#include "kernels.h"
#include "layout.h"
}
#undef _Atomic

#include <stddef.h>
#include <stdint.h>

/* ---- Statuses -------------------------------------------------------------------------------- */

/* Sets "<op>: <what>: <CUDA's name and sentence>" and returns WF_ENOMEM for an allocation
 * failure, else WF_EDEVICE. */
int wf__cuda_fail(cudaError_t e, const char *op, const char *what);
int wf__cublas_fail(cublasStatus_t s, const char *op, const char *what);
int wf__cudnn_fail(cudnnStatus_t s, const char *op, const char *what);

/* 'return' the status of a failed CUDA / cuBLAS / cuDNN call from the enclosing function. */
#define WF_CU_TRY(call, op, what)                       \
    do {                                                \
        cudaError_t wf_cu_e_ = (call);                  \
        if (wf_cu_e_ != cudaSuccess)                    \
            return wf__cuda_fail(wf_cu_e_, (op), what); \
    } while (0)
#define WF_CUBLAS_TRY(call, op, what)                     \
    do {                                                  \
        cublasStatus_t wf_cb_s_ = (call);                 \
        if (wf_cb_s_ != CUBLAS_STATUS_SUCCESS)            \
            return wf__cublas_fail(wf_cb_s_, (op), what); \
    } while (0)
#define WF_CUDNN_TRY(call, op, what)                     \
    do {                                                 \
        cudnnStatus_t wf_dn_s_ = (call);                 \
        if (wf_dn_s_ != CUDNN_STATUS_SUCCESS)            \
            return wf__cudnn_fail(wf_dn_s_, (op), what); \
    } while (0)
/* After a launch: the launch's own error (bad configuration, no kernel image). */
#define WF_CU_LAUNCHED(op) WF_CU_TRY(cudaGetLastError(), (op), "kernel launch")

/* ---- Contexts, handles, temporaries ---------------------------------------------------------- */

/* The queue of a CUDA kernel's ctx (devices/cuda.h: ctx->stream points to the device's
 * wf__cuda_queue: its compute stream, and the cuBLAS, cuBLASLt and cuDNN handles bound to
 * it, which only the thread holding the device's run lock uses), after making its device
 * current on this thread when it is not. A ctx without a queue is refused (WF_EINVAL):
 * weft's kernels never use the legacy default stream, which would serialise against every
 * other stream of the device. */
int wf__cuda_enter(const wf_kernel_ctx *ctx, const char *op, const wf__cuda_queue **q);

/* Stream-ordered device memory (cudaMallocAsync on the device's default pool): valid for
 * work enqueued on 'stream' after the call; freed in stream order. bytes 0 gives NULL. */
int wf__cuda_tmp(cudaStream_t stream, size_t bytes, const char *op, void **p);
void wf__cuda_tmp_free(cudaStream_t stream, void *p);

/* A stream-ordered int64 at device address '*flag', set to -1 (all bits) on stream 's': where
 * the kernels that validate data on the device record the first bad position (atomicMin),
 * read back with wf__cuda_read_flag(). Free it with wf__cuda_tmp_free(); on failure '*flag'
 * is NULL. */
int wf__cuda_flag(cudaStream_t s, const char *op, void **flag);

/* Copies an int64 the kernels wrote at device address 'dev' to the host, waiting for the
 * stream: how the entries that validate data on the device (indices, integer divisors) learn
 * the result. Returns 0 or the CUDA failure. */
int wf__cuda_read_flag(cudaStream_t stream, const int64_t *dev, const char *op, int64_t *host);

/* Copies the elements of 't' (any strides) in row-major order into contiguous device memory
 * 'dst' (numel elements of t's dtype), on stream 's'. */
int wf__cuda_pack(cudaStream_t s, const wf_tensor *t, void *dst, const char *op);

/* Copies the box 'dims' (rank 'rank') of dtype 'dt' elements from 'src' (strides 'ss', in
 * elements, any sign, 0 for a broadcast read) to 'dst' (strides 'ds'), on stream 's'; the
 * destination box must not overlap itself or the source (ops/shape_cuda.cu). */
int wf__cuda_copy_nd(cudaStream_t s, const char *op, wf_dtype dt, int rank, const int64_t *dims,
                     char *dst, const int64_t *ds, const char *src, const int64_t *ss);

/* Blocks of 'threads' for 'n' elements in a grid-stride loop: enough to fill the device,
 * never more than the elements need; at least 1. */
static inline unsigned wf__cuda_blocks(int64_t n, int threads)
{
    int64_t b = (n + threads - 1) / threads;
    const int64_t cap = 65535; /* ~ 32 resident blocks per SM on 132 SMs, many times over */
    if (b > cap)
        b = cap;
    return b < 1 ? 1u : (unsigned)b;
}

#define WF_CU_THREADS 256

/* ---- Library types --------------------------------------------------------------------------- */

/* How cuBLAS and cuDNN see a floating dtype, one map for matmul_cuda.cu and conv_cuda.cu: f64
 * stores and computes in f64 (FMA math); bf16 and f16 store 16 bits and compute in f32
 * (tensor-op math); f32 stores and computes in f32 with FMA math and no TF32 (f32 stays f32,
 * as the CPU's; matmul_cuda.cu alone may opt in to TF32). */
typedef struct wf__cuda_types {
    cudaDataType_t blas;              /* storage, for cuBLAS and cuBLASLt */
    cublasComputeType_t blas_compute; /* CUBLAS_COMPUTE_64F or _32F */
    bool f64;                         /* cuBLAS's alpha and beta are doubles */
    cudnnDataType_t dnn, dnn_compute; /* storage and compute, for cuDNN */
    cudnnMathType_t dnn_math;
} wf__cuda_types;

wf__cuda_types wf__cuda_types_of(wf_dtype dt);

/* ---- The strided index map ------------------------------------------------------------------- */

#define WF_CU_MAX_IN 3

/* The inputs of an elementwise kernel laid over its contiguous output: size-1 axes dropped,
 * broadcast axes at stride 0, axes merged where every operand is contiguous across them.
 * Strides in elements. 'flat' when every input is contiguous with the output's shape (or a
 * single broadcast element, 'scalar' bit k): then element i of input k is at i (or 0). */
typedef struct wf_cu_map {
    int rank, n_in;
    bool flat;
    unsigned scalar;
    int64_t dims[WF_MAX_RANK];
    int64_t st[WF_CU_MAX_IN][WF_MAX_RANK];
} wf_cu_map;

/* Fills 'm' for 'in[0..n_in)' broadcast against 'out_shape' (shapes already checked). */
void wf__cuda_map_init(wf_cu_map *m, wf_shape out_shape, const wf_tensor *const *in, int n_in);

/* The element offsets of output element 'i' in each input. */
__device__ __forceinline__ void wf_cu_offsets(const wf_cu_map &m, int64_t i, int64_t *off)
{
    if (m.flat) {
        for (int k = 0; k < m.n_in; k++)
            off[k] = (m.scalar >> k) & 1 ? 0 : i;
        return;
    }
    for (int k = 0; k < m.n_in; k++)
        off[k] = 0;
    for (int d = m.rank - 1; d >= 0; d--) {
        int64_t c = i % m.dims[d];
        i /= m.dims[d];
        for (int k = 0; k < m.n_in; k++)
            off[k] += c * m.st[k][d];
    }
}

/* ---- Elements -------------------------------------------------------------------------------- */

/* Loads a stored element as compute type T and stores T as a storage type: bf16 and f16 are
 * computed in f32 and stored rounded to nearest even, as the CPU twins do. */
template <class T, class S> __device__ __forceinline__ T wf_cu_ld(S v)
{
    return (T)v;
}

template <> __device__ __forceinline__ float wf_cu_ld<float, __nv_bfloat16>(__nv_bfloat16 v)
{
    return __bfloat162float(v);
}

template <> __device__ __forceinline__ float wf_cu_ld<float, __half>(__half v)
{
    return __half2float(v);
}

template <class S, class T> __device__ __forceinline__ S wf_cu_st(T v)
{
    return (S)v;
}

template <> __device__ __forceinline__ __nv_bfloat16 wf_cu_st<__nv_bfloat16, float>(float v)
{
    return __float2bfloat16_rn(v);
}

template <> __device__ __forceinline__ __half wf_cu_st<__half, float>(float v)
{
    return __float2half_rn(v);
}

/* The compute type of a storage type: f32 for bf16 and f16, else itself. */
template <class S> struct wf_cu_compute {
    typedef S type;
};

template <> struct wf_cu_compute<__nv_bfloat16> {
    typedef float type;
};

template <> struct wf_cu_compute<__half> {
    typedef float type;
};

/* One case label of a dtype switch: for dtype E, BODY runs with 'T' the type TYPE. The
 * dtype switches of the CUDA files are lists of these. */
#define WF_CU_CASE(E, TYPE, T, BODY) \
case E: {                            \
    typedef TYPE T;                  \
    BODY;                            \
} break;

/* The case labels of the floating dtypes (f32, f64, bf16, f16), each calling BODY with 'T'
 * its storage type: the shared part of the dtype switches below and in the kernel files. */
#define WF_CU_FLOAT_CASES(T, BODY)              \
    WF_CU_CASE(WF_F32, float, T, BODY)          \
    WF_CU_CASE(WF_F64, double, T, BODY)         \
    WF_CU_CASE(WF_BF16, __nv_bfloat16, T, BODY) \
    WF_CU_CASE(WF_F16, __half, T, BODY)

/* Calls BODY with 'S' the storage type of floating dtype 'dt' (f32, f64, bf16, f16); 'ELSE'
 * runs for any other dtype. */
#define WF_CU_FLOAT_SWITCH(dt, BODY, ELSE) \
    switch (dt) {                          \
        WF_CU_FLOAT_CASES(S, BODY)         \
    default:                               \
        ELSE;                              \
    }

/* ---- Block reductions ------------------------------------------------------------------------ */

/* The block's maximum of 'v' (NaN wins) and sum of 'v', through a fixed tree over 'sh' (at
 * least blockDim.x doubles of shared memory; blockDim.x a power of two): the same bits for
 * the same inputs on every run. Every thread of the block must call them. */
__device__ __forceinline__ double wf_cu_block_max(double v, double *sh)
{
    int tid = threadIdx.x;
    sh[tid] = v;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w >>= 1) {
        if (tid < w) {
            double a = sh[tid], b = sh[tid + w];
            sh[tid] = a != a ? a : b != b ? b : a > b ? a : b;
        }
        __syncthreads();
    }
    double r = sh[0];
    __syncthreads();
    return r;
}

__device__ __forceinline__ double wf_cu_block_sum(double v, double *sh)
{
    int tid = threadIdx.x;
    sh[tid] = v;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w >>= 1) {
        if (tid < w)
            sh[tid] += sh[tid + w];
        __syncthreads();
    }
    double r = sh[0];
    __syncthreads();
    return r;
}

#endif /* WF_OPS_CUDA_COMMON_H */
