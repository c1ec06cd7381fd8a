/* devices/cuda.h: what CUDA kernels (ops/<op>_cuda.cu) and transport/ (NCCL) need of a CUDA
 * device (a module interface: not installed, not internal.h; only with WF_HAVE_CUDA).
 * Owns: the layout of what a CUDA kernel's wf_kernel_ctx.stream points to (wf__cuda_queue:
 *   the device's compute stream with its cuBLAS, cuBLASLt and cuDNN handles bound to it and
 *   their workspace), stream-ordered scratch memory from the device's pool, device tensors
 *   for ops that allocate their own output, and the conversion of CUDA, cuBLAS and cuDNN
 *   status codes into a wf_status plus a message (docs/conventions.md, "Errors").
 * Invariants:
 * - A kernel enqueues its work on wf__cuda_stream(ctx) only, and returns once it is queued
 *   (never synchronises the stream): the executor orders everything else through events.
 * - At most one thread enqueues on a device's compute stream at a time (devices/cuda.c:
 *   the device's run lock), so the handles below, which are not thread-safe, are used by
 *   one thread at a time and need no lock of the kernel's own.
 * - Device memory of a wf_tensor on a CUDA device is device memory: host code never reads
 *   t->data; copies go through the device interface (devices/device.h).
 * Not here: the device itself (devices/cuda.c), its pool (devices/cuda_pool.c), which node
 *   runs where (runtime/compile/pass_place.c). */
#ifndef WF_DEVICES_CUDA_H
#define WF_DEVICES_CUDA_H

#ifdef WF_HAVE_CUDA

#    include "../core/op.h" /* C and C++: .cu files include this header (not core/tensor.h,
                                which uses C11 atomics) */

#    include <weft/devices.h>

#    include <cublasLt.h>
#    include <cublas_v2.h>
#    include <cuda_runtime.h>

#    include <cudnn.h>
#    include <stddef.h>

#    ifdef __cplusplus
extern "C" {
#    endif

typedef struct wf__cuda_device wf__cuda_device; /* devices/cuda.c */

/* What wf_kernel_ctx.stream points to for a kernel placed on a CUDA device. Owned by the
 * device (one per open device, for its compute stream); kernels only read it. */
typedef struct wf__cuda_queue {
    wf__cuda_device *dev;
    int ordinal;               /* the CUDA device ordinal: current on the calling thread */
    cudaStream_t stream;       /* the device's compute stream */
    cublasHandle_t cublas;     /* bound to 'stream' and to 'workspace' */
    cublasLtHandle_t cublaslt; /* pass 'stream' and 'workspace' to cublasLtMatmul */
    cudnnHandle_t cudnn;       /* bound to 'stream' */
    void *workspace;           /* device memory for cuBLAS/cuBLASLt (WF__CUDA_WORKSPACE) */
    size_t workspace_bytes;
    int sm_major, sm_minor; /* compute capability */
    int multiprocessors;    /* for grid sizes of grid-stride loops */
} wf__cuda_queue;

/* cuBLAS's and cuBLASLt's workspace per device: 32 MiB, what cuBLAS recommends for Hopper. */
#    define WF__CUDA_WORKSPACE ((size_t)32 << 20)

/* The queue of a kernel ctx (NULL when the ctx is not a CUDA device's). */
static inline const wf__cuda_queue *wf__cuda_queue_of(const wf_kernel_ctx *ctx)
{
    return ctx ? (const wf__cuda_queue *)ctx->stream : NULL;
}

/* The stream a CUDA kernel enqueues on. */
static inline cudaStream_t wf__cuda_stream(const wf_kernel_ctx *ctx)
{
    const wf__cuda_queue *q = wf__cuda_queue_of(ctx);
    return q ? q->stream : (cudaStream_t)0;
}

static inline cublasHandle_t wf__cuda_cublas(const wf_kernel_ctx *ctx)
{
    const wf__cuda_queue *q = wf__cuda_queue_of(ctx);
    return q ? q->cublas : NULL;
}

static inline cublasLtHandle_t wf__cuda_cublaslt(const wf_kernel_ctx *ctx)
{
    const wf__cuda_queue *q = wf__cuda_queue_of(ctx);
    return q ? q->cublaslt : NULL;
}

static inline cudnnHandle_t wf__cuda_cudnn(const wf_kernel_ctx *ctx)
{
    const wf__cuda_queue *q = wf__cuda_queue_of(ctx);
    return q ? q->cudnn : NULL;
}

/* Scratch device memory for one kernel, stream-ordered: valid for work the kernel enqueues
 * on wf__cuda_stream(ctx) before it calls wf__cuda_scratch_free(ctx, p) (which may be right
 * after the enqueue: the block is reused only by later work on the same stream, or on
 * another stream after an event says the work is done).
 * Returns 0 with '*out' set, WF_EINVAL (not a CUDA ctx) or WF_ENOMEM ("cuda:0: out of
 * device memory: 1.5 GiB requested, ..." after freeing the device's cached blocks). */
int wf__cuda_scratch(const wf_kernel_ctx *ctx, size_t bytes, void **out);

/* Gives scratch memory back (stream-ordered, see above). NULL is a no-op. */
void wf__cuda_scratch_free(const wf_kernel_ctx *ctx, void *p);

/* A new contiguous tensor of device memory on the ctx's device (from its pool), for ops
 * with WF_OP_DYNAMIC_SHAPE, which allocate their own output. Its last release gives the
 * memory back to the pool in stream order.
 * Returns 0 or WF_EINVAL/WF_ENOMEM (message set). Ownership: the caller owns '*out'. */
int wf__cuda_tensor_alloc(const wf_kernel_ctx *ctx, wf_dtype dt, wf_shape shape, wf_tensor **out);

/* The wf__cuda_queue of an open CUDA device, for the executor to put in wf_kernel_ctx.stream
 * (runtime/exec_device.c); NULL when 'd' is not a CUDA device. Borrowed from 'd'. */
void *wf__cuda_device_queue(wf_device *d);

/* Converts a status into a wf_status plus wf_last_errmsg(): 0 for success, else
 * WF_EDEVICE (WF_ENOMEM for cudaErrorMemoryAllocation and the libraries' allocation
 * failures) with "<node>: <what>: <error name>: <error string>" ('node' may be NULL: then
 * "cuda: <what>: ..."). Use at each call: 'if ((rc = wf__cuda_check(cudaGetLastError(),
 * "relu launch", n->name)) < 0) return rc;'. A sticky CUDA error (a failed kernel) stays on
 * the device: every later call of that device returns it too. */
int wf__cuda_check(cudaError_t e, const char *what, const char *node);
int wf__cublas_check(cublasStatus_t s, const char *what, const char *node);
int wf__cudnn_check(cudnnStatus_t s, const char *what, const char *node);

#    ifdef __cplusplus
}
#    endif

#endif /* WF_HAVE_CUDA */
#endif /* WF_DEVICES_CUDA_H */
