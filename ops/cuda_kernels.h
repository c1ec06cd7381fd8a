/* ops/cuda_kernels.h: the CUDA twins of ops/kernels.h's CPU kernels, as C declarations (a
 * module interface of ops/: the op defs register them, runtime/ and the tests call them; not
 * installed; C and C++).
 * Owns: WF__CUDA_KERNEL(id), the value of an op def's kernel[WF_KERNEL_CUDA] slot (the
 *   kernel 'wf__cuda_kernel_<id>' when weft is built with CUDA, NULL without: placement
 *   then reports WF_ENODEV), the declarations of those kernels (core/op.h's wf_kernel_fn
 *   convention: tensors of device memory, ctx->stream a cudaStream_t of ctx->device), and
 *   the entries they wrap, wf__<op>_cuda(ctx, <attributes>, <tensors>), with their CPU
 *   twins' names, attributes and argument order (docs/conventions.md, "CUDA twins").
 * Contract shared by every entry, besides ops/kernels.h's (shapes, dtypes and strides as the
 * CPU twin takes them; 'out' contiguous, allocated by the caller, in device memory):
 * - ctx and ctx->stream are required (WF_EINVAL otherwise); the work is enqueued on that
 *   stream and the entry returns without waiting for it, except where an entry says it
 *   validates data on the device (it then waits for the stream before returning).
 * - Tensors' data pointers are device memory of ctx->device (or managed memory); shapes and
 *   strides are read on the host.
 * - Results equal the CPU twin's within the tolerances tests/ops/test_internal_cuda_ops.c
 *   states: elementwise ops compute in the same type with CUDA's libdevice maths (a few ulp
 *   for exp, tanh, erf, pow), reductions sum in a fixed tree order (in f64 for floating
 *   sums, as the CPU), GEMMs through cuBLAS (TF32 only when asked for).
 * - Failures: WF_EINVAL, WF_ESHAPE, WF_EDTYPE as the CPU twin; WF_EDEVICE (or WF_ENOMEM)
 *   with the CUDA error's name in the message.
 * Not here: the device, its streams and memory (devices/), the kernels (ops/NAME_cuda.cu). */
#ifndef WF_OPS_CUDA_KERNELS_H
#define WF_OPS_CUDA_KERNELS_H

#include "../core/op.h"
#include "kernels.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef WF_HAVE_CUDA
#    define WF__CUDA_KERNEL(id) wf__cuda_kernel_##id
#else
#    define WF__CUDA_KERNEL(id) NULL
#endif

/* The ops with a CUDA kernel: X(id) for each. */
/* clang-format off */
#define WF__CUDA_OPS(X)                                                                      \
    X(neg) X(abs) X(exp) X(log) X(sqrt) X(rsqrt) X(square) X(tanh) X(sigmoid) X(relu)        \
    X(leaky_relu) X(gelu) X(gelu_tanh) X(silu) X(sign) X(cast)                               \
    X(add) X(sub) X(mul) X(div) X(pow) X(maximum) X(minimum)                                 \
    X(eq) X(ne) X(lt) X(le) X(gt) X(ge) X(where)                                             \
    X(relu_grad) X(leaky_relu_grad) X(gelu_grad) X(gelu_tanh_grad) X(silu_grad)              \
    X(sigmoid_grad) X(tanh_grad)                                                             \
    X(sum) X(mean) X(max) X(min) X(prod) X(argmax) X(logsumexp) X(unreduce)                  \
    X(matmul) X(matmul_epilogue)                                                             \
    X(softmax) X(log_softmax) X(softmax_cross_entropy)                                       \
    X(layer_norm) X(layer_norm_backward_input)                                               \
    X(gather) X(scatter_add) X(one_hot)                                                      \
    X(reshape) X(expand_dims) X(squeeze) X(transpose) X(slice) X(split) X(concat) X(stack)   \
    X(pad) X(broadcast_to) X(reshape_like) X(slice_backward)                                 \
    X(max_pool2d) X(avg_pool2d) X(max_pool2d_backward) X(avg_pool2d_backward)                \
    X(conv2d) X(conv2d_backward_input) X(conv2d_backward_filter) X(dropout)                  \
    X(fused_elementwise)
/* clang-format on */

#define WF__CUDA_DECLARE(id)                                                    \
    int wf__cuda_kernel_##id(const wf_kernel_ctx *ctx, const struct wf_node *n, \
                             wf_tensor *const *in, wf_tensor **out);
#ifdef WF_HAVE_CUDA
WF__CUDA_OPS(WF__CUDA_DECLARE)
#endif

/* ---- Elementwise (elementwise_cuda.cu) ------------------------------------------------------- */

int wf__unary_cuda(const wf_kernel_ctx *ctx, wf_unary_op op, double alpha, const wf_tensor *x,
                   wf_tensor *out);
/* Integer div: a zero divisor fails the call with WF_EINVAL naming the first such element
 * (the entry then waits for the stream: integer division validates data on the device). */
int wf__binary_cuda(const wf_kernel_ctx *ctx, wf_binary_op op, const wf_tensor *a,
                    const wf_tensor *b, wf_tensor *out);
int wf__where_cuda(const wf_kernel_ctx *ctx, const wf_tensor *cond, const wf_tensor *a,
                   const wf_tensor *b, wf_tensor *out);
int wf__cast_cuda(const wf_kernel_ctx *ctx, const wf_tensor *x, wf_tensor *out);
int wf__activation_grad_cuda(const wf_kernel_ctx *ctx, wf_act_grad_op op, double alpha,
                             const wf_tensor *x, const wf_tensor *dy, wf_tensor *out);

/* ---- Reductions (reduce_cuda.cu) ------------------------------------------------------------- */

/* As wf__reduce_cpu: one thread block per output element, a fixed tree order over the
 * reduced elements (deterministic; floating sums in f64). */
int wf__reduce_cuda(const wf_kernel_ctx *ctx, wf__reduce_kind op, const int *axes, int n_axes,
                    bool keepdims, const wf_tensor *x, wf_tensor *out);

/* ---- Matrix products (matmul_cuda.cu) -------------------------------------------------------- */

/* As wf__matmul_cpu, through cuBLAS: f32 (cublasSgemm*; TF32 tensor cores when
 * wf__matmul_cuda_tf32 is set), f64, bf16 and f16 (cublasGemmEx with f32 accumulation).
 * Batch axes that broadcast by a single stride per operand go to one strided-batched call;
 * others to one call per batch matrix. Inputs whose last two axes have no unit stride are
 * packed into a temporary first. */
int wf__matmul_cuda(const wf_kernel_ctx *ctx, bool trans_a, bool trans_b, const wf_tensor *a,
                    const wf_tensor *b, wf_tensor *out);

/* TF32 for f32 products (process-wide; off by default: f32 results then match the CPU's to
 * ~1e-6 relative; on, to ~1e-3). For tests: sessions use WF_SESSION_TF32 (below). */
void wf__matmul_cuda_set_tf32(bool on);

/* The per-node TF32 mark: a matmul or matmul_epilogue node whose attrs->dtype is
 * WF__MATMUL_TF32 runs an f32 product on TF32 tensor cores (cuBLAS's
 * CUBLAS_COMPUTE_32F_FAST_TF32); attrs->dtype is otherwise unused by those ops (0), and the
 * CPU kernels ignore it. runtime/compile/pass_mixed.c sets it for sessions with WF_SESSION_TF32,
 * so the option is per session, not process-wide. */
#define WF__MATMUL_TF32 WF_F32

/* matmul_epilogue's kernel: as wf__matmul_epilogue_cpu (ops/kernels.h). cuBLASLt fuses the
 * bias and relu or gelu_tanh into the GEMM (f32, bf16, f16; b 2-D; a's batch rows one strided
 * matrix; the bias a contiguous [N] added after the product); other cases run the product,
 * then the add and the activation kernels in place. */
int wf__matmul_epilogue_cuda(const wf_kernel_ctx *ctx, bool trans_a, bool trans_b,
                             const wf_epilogue *ep, const wf_tensor *a, const wf_tensor *b,
                             const wf_tensor *bias, wf_tensor *out);

/* ---- Softmax, normalization, indexing (softmax_cuda.cu, norm_cuda.cu, index_cuda.cu) --------- */

int wf__softmax_cuda(const wf_kernel_ctx *ctx, int axis, const wf_tensor *x, wf_tensor *out);
int wf__log_softmax_cuda(const wf_kernel_ctx *ctx, int axis, const wf_tensor *x, wf_tensor *out);
/* Validates the labels on the device (waits for the stream). */
int wf__softmax_cross_entropy_cuda(const wf_kernel_ctx *ctx, const wf_tensor *logits,
                                   const wf_tensor *labels, wf_tensor *out);
/* dlogits = (softmax(logits) - onehot(labels)) * dloss[..., None]: the cross entropy's
 * backward in one pass (for a fused gradient node; labels as the forward, unchecked). */
int wf__softmax_cross_entropy_backward_cuda(const wf_kernel_ctx *ctx, const wf_tensor *logits,
                                            const wf_tensor *labels, const wf_tensor *dloss,
                                            wf_tensor *out);

int wf__layer_norm_cuda(const wf_kernel_ctx *ctx, int begin_axis, double eps, const wf_tensor *x,
                        const wf_tensor *gamma, const wf_tensor *beta, wf_tensor *out);
int wf__layer_norm_backward_input_cuda(const wf_kernel_ctx *ctx, int begin_axis, double eps,
                                       const wf_tensor *x, const wf_tensor *gamma,
                                       const wf_tensor *dy, wf_tensor *out);

/* Validate their indices on the device (wait for the stream). scatter_add sums with atomics:
 * floating results may differ from the CPU's index order in the last bits. */
int wf__gather_cuda(const wf_kernel_ctx *ctx, int axis, const wf_tensor *params,
                    const wf_tensor *indices, wf_tensor *out);
int wf__scatter_add_cuda(const wf_kernel_ctx *ctx, int axis, const wf_tensor *updates,
                         const wf_tensor *indices, wf_tensor *out);

/* ---- Shape ops, one_hot, slice_backward (shape_cuda.cu) ---------------------------------- */

/* As their CPU twins (ops/kernels.h): strided copies by element size, bit-exact for every
 * dtype. */
int wf__reshape_cuda(const wf_kernel_ctx *ctx, const wf_tensor *x, wf_tensor *out);
int wf__transpose_cuda(const wf_kernel_ctx *ctx, const int *perm, int n, const wf_tensor *x,
                       wf_tensor *out);
int wf__slice_cuda(const wf_kernel_ctx *ctx, const int64_t *begin, const int64_t *end,
                   const int64_t *step, const wf_tensor *x, wf_tensor *out);
int wf__broadcast_to_cuda(const wf_kernel_ctx *ctx, const wf_tensor *x, wf_tensor *out);
int wf__concat_cuda(const wf_kernel_ctx *ctx, int axis, const wf_tensor *const *xs, int n,
                    wf_tensor *out);
int wf__stack_cuda(const wf_kernel_ctx *ctx, int axis, const wf_tensor *const *xs, int n,
                   wf_tensor *out);
int wf__pad_cuda(const wf_kernel_ctx *ctx, const int64_t *before, const int64_t *after,
                 double value, const wf_tensor *x, wf_tensor *out);
int wf__slice_backward_cuda(const wf_kernel_ctx *ctx, const int64_t *begin, const int64_t *end,
                            const int64_t *step, const wf_tensor *dy, wf_tensor *out);
int wf__one_hot_cuda(const wf_kernel_ctx *ctx, const wf_tensor *indices, wf_tensor *out);

/* ---- Convolution and pooling (conv_cuda.cu, pool_cuda.cu) -------------------------------- */

/* As their CPU twins (ops/kernels.h). Pools: the CPU's window walk (first NaN, else first
 * maximum; f64 sums), the same bits for f32 and f64. Convolutions through cuDNN (its legacy
 * API, which cuDNN 9 keeps): f32 in f32 (no TF32), f64, bf16 and f16 with f32 accumulation;
 * asymmetric padding (which cuDNN lacks) through a zero-padded copy of x. */
int wf__max_pool2d_cuda(const wf_kernel_ctx *ctx, const wf_pool_params *p, const wf_tensor *x,
                        wf_tensor *out);
int wf__avg_pool2d_cuda(const wf_kernel_ctx *ctx, const wf_pool_params *p, const wf_tensor *x,
                        wf_tensor *out);
int wf__max_pool2d_backward_cuda(const wf_kernel_ctx *ctx, const wf_pool_params *p,
                                 const wf_tensor *x, const wf_tensor *dy, wf_tensor *out);
int wf__avg_pool2d_backward_cuda(const wf_kernel_ctx *ctx, const wf_pool_params *p,
                                 const wf_tensor *dy, wf_tensor *out);
int wf__conv2d_cuda(const wf_kernel_ctx *ctx, const wf_conv_params *p, const wf_tensor *x,
                    const wf_tensor *w, wf_tensor *out);
int wf__conv2d_backward_input_cuda(const wf_kernel_ctx *ctx, const wf_conv_params *p,
                                   const wf_tensor *dy, const wf_tensor *w, wf_tensor *out);
int wf__conv2d_backward_filter_cuda(const wf_kernel_ctx *ctx, const wf_conv_params *p,
                                    const wf_tensor *x, const wf_tensor *dy, wf_tensor *out);

/* ---- Dropout (dropout_cuda.cu) -------------------------------------------------------------- */

/* As wf__dropout_cpu, with ctx->step: the same mask for the same seed and step. */
int wf__dropout_cuda(const wf_kernel_ctx *ctx, double rate, uint64_t seed, const wf_tensor *x,
                     wf_tensor *out);

/* ---- Fused elementwise programs (fused_cuda.cu) ------------------------------------------ */

/* As wf__fused_elementwise_cpu (ops/fused.h): the program of 'attrs' over 'in[0 .. n_in-1]'
 * into 'out', one thread per element, each instruction the elementwise CUDA kernels'
 * per-element code in its own dtype (ops/cuda_scalar.h). A program with an integer division
 * validates its divisors on the device (the entry then waits for the stream). */
struct wf_attrs;
int wf__fused_elementwise_cuda(const wf_kernel_ctx *ctx, const struct wf_attrs *attrs,
                               const wf_tensor *const *in, int n_in, wf_tensor *out);

/* ---- Optimizer updates (optim_cuda.cu) ------------------------------------------------------ */

/* One fused launch per 32 variables updates each variable, its gradient's way, in place, with
 * grad/optim_cpu.c's arithmetic (each operation rounded alone in the variable's type: the
 * host loop's bits). The scalars are the update's after its schedule: 'lr' this step's rate,
 * 'bias_correction1/2' Adam's 1 - beta^(t + 1). */
typedef enum wf_cuda_opt_kind {
    WF_CU_OPT_SGD,   /* momentum > 0: one state (the velocity); nesterov as PyTorch */
    WF_CU_OPT_ADAM,  /* weight_decay as L2 on the gradient; states m, v */
    WF_CU_OPT_ADAMW, /* decoupled weight decay; states m, v */
} wf_cuda_opt_kind;

typedef struct wf_cuda_update {
    int kind; /* wf_cuda_opt_kind */
    double lr, momentum, beta1, beta2, eps, weight_decay, bias_correction1, bias_correction2;
    bool nesterov;
} wf_cuda_update;

/* Updates w[i] (and states s0[i], s1[i] as the kind needs; the arrays may be NULL when it
 * needs none) from g[i], i < n. Every tensor contiguous, f32 or f64, one dtype per call, each
 * state and gradient of its variable's shape (WF_EINVAL / WF_EDTYPE otherwise). */
int wf__update_multi_cuda(const wf_kernel_ctx *ctx, const wf_cuda_update *u, int n,
                          wf_tensor *const *w, const wf_tensor *const *g, wf_tensor *const *s0,
                          wf_tensor *const *s1);

/* Adds one to the counter 't' (one i64 or i32 element in device memory) in the order of ctx's
 * stream: the step counter's increment. Returns 0, WF_EINVAL (no device queue, not such a
 * counter) or WF_EDEVICE naming 'op'. */
int wf__increment_cuda(const wf_kernel_ctx *ctx, const char *op, wf_tensor *t);

/* Copies bytes[i] from src[i] (device memory of ctx's device, managed or host memory: the
 * direction is inferred from the pointer, cudaMemcpyDefault) to host memory dst[i], i < n, in
 * the order of ctx's stream, and waits for the stream once: how a kernel whose scalars live in
 * tensors reads them on the host (grad/optim_cpu.c: an update's step counter and
 * hyperparameters). Returns 0, WF_EINVAL (no device queue, NULL pointers) or WF_EDEVICE
 * naming 'op'. */
int wf__cuda_read_host(const wf_kernel_ctx *ctx, const char *op, int n, const void *const *src,
                       void *const *dst, const size_t *bytes);

/* ---- Checks ---------------------------------------------------------------------------------- */

/* Compares the C layout of struct wf_tensor and wf_node ('sizes': sizeof(wf_tensor),
 * offsetof dtype, shape, strides, numel, data, sizeof(wf_node), offsetof(wf_node, attrs),
 * sizeof(wf_attrs), offsetof(wf_attrs, alpha)) with what the .cu files see (ops/cuda_common.h).
 * Returns 0 or WF_EINVAL naming the first difference. Needs no device. */
int wf__cuda_layout_check(const size_t *sizes, int n);

/* True when the CUDA runtime sees at least one device (false also when there is no driver). */
bool wf__cuda_have_device(void);

#endif /* WF_OPS_CUDA_KERNELS_H */
