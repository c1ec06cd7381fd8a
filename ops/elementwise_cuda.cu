/* ops/elementwise_cuda.cu: CUDA twins of ops/elementwise_cpu.c: unary math and activations,
 * binary arithmetic and comparisons with NumPy broadcasting, the activations' gradients,
 * where, and cast; and the kernel slots (wf__cuda_kernel_<id>) of those ops.
 * Owns: one grid-stride kernel per family and (storage, compute) type pair, with the op a
 *   warp-uniform switch (an op code, as the CPU twin's tables, not one kernel per op), reading
 *   every input through the strided index map of ops/cuda_common.h (broadcast axes at stride
 *   0, any strides, merged axes) into a contiguous output.
 * Invariants: element i of the output is computed by one thread from element i of each input
 *   alone, so 'out' may be input 0 (in place) and the bits never depend on the launch shape;
 *   bf16 and f16 compute in f32 and round once on store; integer ops wrap as the CPU's (no
 *   undefined behaviour: negation and products go through the unsigned type); integer
 *   division by zero is found on the device and fails the call (the entry waits for it).
 * Not here: the per-element maths (cuda_scalar.h, shared with the fused programs of
 *   fused_cuda.cu), reductions (reduce_cuda.cu), GEMM (matmul_cuda.cu), the op defs
 *   (elementwise.c). */
#include "cuda_common.h"
#include "cuda_scalar.h"

#include <type_traits>

/* ---- Kernels --------------------------------------------------------------------------------- */

#define GRID_STRIDE(i, n)                                                     \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
         i += (int64_t)gridDim.x * blockDim.x)

template <class S, class T>
static __global__ void unary_k(int op, T alpha, wf_cu_map m, S *out, const S *x, int64_t n)
{
    GRID_STRIDE(i, n)
    {
        int64_t off[WF_CU_MAX_IN];
        wf_cu_offsets(m, i, off);
        out[i] = wf_cu_st<S>(wf_cu_unary<T>(op, wf_cu_ld<T>(x[off[0]]), alpha));
    }
}

template <class S, class T>
static __global__ void binary_k(int op, T alpha, wf_cu_map m, S *out, const S *a, const S *b,
                                int64_t n)
{
    GRID_STRIDE(i, n)
    {
        int64_t off[WF_CU_MAX_IN];
        wf_cu_offsets(m, i, off);
        T x = wf_cu_ld<T>(a[off[0]]), y = wf_cu_ld<T>(b[off[1]]);
        out[i] = wf_cu_st<S>(wf_cu_binary<T>(op, x, y, alpha));
    }
}

/* Integer division: truncates toward zero, INT_MIN / -1 wraps; a zero divisor records the
 * smallest such element in '*bad' (all ones when none) and writes 0 there. */
template <class T>
static __global__ void idiv_k(wf_cu_map m, T *out, const T *a, const T *b, int64_t n,
                              unsigned long long *bad)
{
    typedef typename std::make_unsigned<T>::type U;
    GRID_STRIDE(i, n)
    {
        int64_t off[WF_CU_MAX_IN];
        wf_cu_offsets(m, i, off);
        T x = a[off[0]], y = b[off[1]];
        if (y == 0) {
            atomicMin(bad, (unsigned long long)i);
            out[i] = 0;
        } else {
            out[i] = y == -1 ? (T)((U)0 - (U)x) : x / y;
        }
    }
}

template <class S, class T>
static __global__ void compare_k(int op, wf_cu_map m, uint8_t *out, const S *a, const S *b,
                                 int64_t n)
{
    GRID_STRIDE(i, n)
    {
        int64_t off[WF_CU_MAX_IN];
        wf_cu_offsets(m, i, off);
        out[i] = wf_cu_compare<T>(op, wf_cu_ld<T>(a[off[0]]), wf_cu_ld<T>(b[off[1]])) ? 1 : 0;
    }
}

/* where copies bits: by element size. */
template <class E>
static __global__ void where_k(wf_cu_map m, E *out, const uint8_t *c, const E *a, const E *b,
                               int64_t n)
{
    GRID_STRIDE(i, n)
    {
        int64_t off[WF_CU_MAX_IN];
        wf_cu_offsets(m, i, off);
        out[i] = c[off[0]] ? a[off[1]] : b[off[2]];
    }
}

template <class S, class D>
static __global__ void cast_k(wf_cu_map m, D *out, const S *x, int64_t n)
{
    GRID_STRIDE(i, n)
    {
        int64_t off[WF_CU_MAX_IN];
        wf_cu_offsets(m, i, off);
        out[i] = wf_cu_cast<D, S>(x[off[0]]);
    }
}

/* ---- Launchers ------------------------------------------------------------------------------- */

template <class K, class... A>
static int launch(const char *op, cudaStream_t s, int64_t n, K kernel, A... args)
{
    if (n == 0)
        return 0;
    kernel<<<wf__cuda_blocks(n, WF_CU_THREADS), WF_CU_THREADS, 0, s>>>(args...);
    WF_CU_LAUNCHED(op);
    return 0;
}

/* Calls BODY with 'S' the storage type of any dtype weft's kernels compute in (floating, i32,
 * i64, u8, bool as u8); ELSE otherwise. */
#define ANY_SWITCH(dt, BODY, ELSE)         \
    switch (dt) {                          \
    case WF_I32: {                         \
        typedef int32_t S;                 \
        BODY;                              \
    } break;                               \
    case WF_I64: {                         \
        typedef int64_t S;                 \
        BODY;                              \
    } break;                               \
    case WF_U8:                            \
    case WF_BOOL: {                        \
        typedef uint8_t S;                 \
        BODY;                              \
    } break;                               \
    default:                               \
        WF_CU_FLOAT_SWITCH(dt, BODY, ELSE) \
    }

int wf__unary_cuda(const wf_kernel_ctx *ctx, wf_unary_op op, double alpha, const wf_tensor *x,
                   wf_tensor *out)
{
    const char *name;
    int rc = wf__ops_unary_check(op, x, &name);
    if (rc == 0)
        rc = wf__kernel_check_out(name, out, x->dtype, x->shape);
    const wf__cuda_queue *q;
    if (rc < 0 || (rc = wf__cuda_enter(ctx, name, &q)) < 0)
        return rc;
    cudaStream_t s = q->stream;
    wf_cu_map m;
    wf__cuda_map_init(&m, out->shape, &x, 1);
    int64_t n = out->numel;
    switch (x->dtype) {
    case WF_I32:
        return launch(name, s, n, unary_k<int32_t, int32_t>, (int)op, (int32_t)0, m,
                      (int32_t *)out->data, (const int32_t *)x->data, n);
    case WF_I64:
        return launch(name, s, n, unary_k<int64_t, int64_t>, (int)op, (int64_t)0, m,
                      (int64_t *)out->data, (const int64_t *)x->data, n);
    default:
        WF_CU_FLOAT_SWITCH(
            x->dtype,
            {
                typedef typename wf_cu_compute<S>::type T;
                return launch(name, s, n, unary_k<S, T>, (int)op, (T)alpha, m, (S *)out->data,
                              (const S *)x->data, n);
            },
            break)
    }
    return wf__err(WF_EDTYPE, "%s: x is %s", name, wf_dtype_name(x->dtype));
}

static int integer_div(const char *name, cudaStream_t s, const wf_cu_map &m, const wf_tensor *a,
                       const wf_tensor *b, wf_tensor *out)
{
    int64_t n = out->numel;
    if (n == 0)
        return 0;
    void *flag;
    int rc = wf__cuda_flag(s, name, &flag);
    if (rc < 0)
        return rc;
    if (a->dtype == WF_I32)
        rc = launch(name, s, n, idiv_k<int32_t>, m, (int32_t *)out->data, (const int32_t *)a->data,
                    (const int32_t *)b->data, n, (unsigned long long *)flag);
    else
        rc = launch(name, s, n, idiv_k<int64_t>, m, (int64_t *)out->data, (const int64_t *)a->data,
                    (const int64_t *)b->data, n, (unsigned long long *)flag);
    int64_t bad = -1;
    if (rc == 0)
        rc = wf__cuda_read_flag(s, (const int64_t *)flag, name, &bad);
    wf__cuda_tmp_free(s, flag);
    if (rc == 0 && bad != -1)
        rc = wf__err(WF_EINVAL, "div: integer division by zero at element %lld", (long long)bad);
    return rc;
}

int wf__binary_cuda(const wf_kernel_ctx *ctx, wf_binary_op op, const wf_tensor *a,
                    const wf_tensor *b, wf_tensor *out)
{
    const char *name;
    int rc = wf__ops_binary_check(op, a, b, &name);
    if (rc < 0)
        return rc;
    bool cmp = op >= WF_BINARY_EQ;
    wf_dtype dt = a->dtype;
    const wf_tensor *in[2] = { a, b };
    const char *const names[2] = { "a", "b" };
    wf_shape shape;
    rc = wf__ops_broadcast_shapes(name, in, names, 2, &shape);
    if (rc < 0)
        return rc;
    rc = wf__kernel_check_out(name, out, cmp ? WF_BOOL : dt, shape);
    const wf__cuda_queue *q;
    if (rc < 0 || (rc = wf__cuda_enter(ctx, name, &q)) < 0)
        return rc;
    cudaStream_t s = q->stream;
    wf_cu_map m;
    wf__cuda_map_init(&m, out->shape, in, 2);
    int64_t n = out->numel;
    if (cmp) {
        ANY_SWITCH(
            dt,
            {
                typedef typename wf_cu_compute<S>::type T;
                return launch(name, s, n, compare_k<S, T>, (int)op, m, (uint8_t *)out->data,
                              (const S *)a->data, (const S *)b->data, n);
            },
            break)
        return wf__err(WF_EDTYPE, "%s: a and b are %s", name, wf_dtype_name(dt));
    }
    if (op == WF_BINARY_DIV && (dt == WF_I32 || dt == WF_I64))
        return integer_div(name, s, m, a, b, out);
    switch (dt) {
    case WF_I32:
        return launch(name, s, n, binary_k<int32_t, int32_t>, (int)op, (int32_t)0, m,
                      (int32_t *)out->data, (const int32_t *)a->data, (const int32_t *)b->data, n);
    case WF_I64:
        return launch(name, s, n, binary_k<int64_t, int64_t>, (int)op, (int64_t)0, m,
                      (int64_t *)out->data, (const int64_t *)a->data, (const int64_t *)b->data, n);
    default:
        WF_CU_FLOAT_SWITCH(
            dt,
            {
                typedef typename wf_cu_compute<S>::type T;
                return launch(name, s, n, binary_k<S, T>, (int)op, (T)0, m, (S *)out->data,
                              (const S *)a->data, (const S *)b->data, n);
            },
            break)
    }
    return wf__err(WF_EDTYPE, "%s: a and b are %s", name, wf_dtype_name(dt));
}

int wf__activation_grad_cuda(const wf_kernel_ctx *ctx, wf_act_grad_op op, double alpha,
                             const wf_tensor *x, const wf_tensor *dy, wf_tensor *out)
{
    const char *name;
    int rc = wf__ops_act_grad_check(op, x, dy, out, &name);
    const wf__cuda_queue *q;
    if (rc < 0 || (rc = wf__cuda_enter(ctx, name, &q)) < 0)
        return rc;
    cudaStream_t s = q->stream;
    const wf_tensor *in[2] = { x, dy };
    wf_cu_map m;
    wf__cuda_map_init(&m, out->shape, in, 2);
    int64_t n = out->numel;
    WF_CU_FLOAT_SWITCH(
        x->dtype,
        {
            typedef typename wf_cu_compute<S>::type T;
            return launch(name, s, n, binary_k<S, T>, WF_CU_ACT_BASE + (int)op, (T)alpha, m,
                          (S *)out->data, (const S *)x->data, (const S *)dy->data, n);
        },
        break)
    return wf__err(WF_EDTYPE, "%s: x is %s", name, wf_dtype_name(x->dtype));
}

int wf__where_cuda(const wf_kernel_ctx *ctx, const wf_tensor *cond, const wf_tensor *a,
                   const wf_tensor *b, wf_tensor *out)
{
    wf_shape shape;
    int rc = wf__ops_where_check(cond, a, b, out, &shape);
    const wf_tensor *in[3] = { cond, a, b };
    const wf__cuda_queue *q;
    if (rc < 0 || (rc = wf__cuda_enter(ctx, "where", &q)) < 0)
        return rc;
    cudaStream_t s = q->stream;
    wf_cu_map m;
    wf__cuda_map_init(&m, out->shape, in, 3);
    int64_t n = out->numel;
    const uint8_t *c = (const uint8_t *)cond->data;
    switch (wf_dtype_size(a->dtype)) {
    case 1:
        return launch("where", s, n, where_k<uint8_t>, m, (uint8_t *)out->data, c,
                      (const uint8_t *)a->data, (const uint8_t *)b->data, n);
    case 2:
        return launch("where", s, n, where_k<uint16_t>, m, (uint16_t *)out->data, c,
                      (const uint16_t *)a->data, (const uint16_t *)b->data, n);
    case 4:
        return launch("where", s, n, where_k<uint32_t>, m, (uint32_t *)out->data, c,
                      (const uint32_t *)a->data, (const uint32_t *)b->data, n);
    case 8:
        return launch("where", s, n, where_k<uint64_t>, m, (uint64_t *)out->data, c,
                      (const uint64_t *)a->data, (const uint64_t *)b->data, n);
    default:
        return wf__err(WF_EDTYPE, "where: dtype %s is not supported", wf_dtype_name(a->dtype));
    }
}

/* Calls BODY with 'T' the element type of cast source or destination dtype 'dt' (every dtype
 * cast supports; bool as wf_cu_bool); 'ELSE' runs for any other. Nests: the destination's
 * switch goes in the source's BODY, with another name for T. */
#define CAST_SWITCH(dt, T, BODY, ELSE)           \
    switch (dt) {                                \
        WF_CU_FLOAT_CASES(T, BODY)               \
        WF_CU_CASE(WF_I32, int32_t, T, BODY)     \
        WF_CU_CASE(WF_I64, int64_t, T, BODY)     \
        WF_CU_CASE(WF_U8, uint8_t, T, BODY)      \
        WF_CU_CASE(WF_BOOL, wf_cu_bool, T, BODY) \
    default:                                     \
        ELSE;                                    \
    }

int wf__cast_cuda(const wf_kernel_ctx *ctx, const wf_tensor *x, wf_tensor *out)
{
    if (!x || !out)
        return wf__err(WF_EINVAL, "cast: %s is NULL", !x ? "x" : "out");
    int rc = wf__kernel_check_out("cast", out, out->dtype, x->shape);
    if (rc < 0)
        return rc;
    const wf__cuda_queue *q;
    if ((rc = wf__cuda_enter(ctx, "cast", &q)) < 0)
        return rc;
    cudaStream_t s = q->stream;
    wf_cu_map m;
    wf__cuda_map_init(&m, out->shape, &x, 1);
    int64_t n = out->numel;
    /* Same-dtype halves are a bit copy, as the CPU's (no f32 round trip). */
    if (x->dtype == out->dtype && (x->dtype == WF_BF16 || x->dtype == WF_F16))
        return launch("cast", s, n, cast_k<uint16_t, uint16_t>, m, (uint16_t *)out->data,
                      (const uint16_t *)x->data, n);
    bool known = false;
    CAST_SWITCH(x->dtype, S,
                { CAST_SWITCH(
                    out->dtype, D,
                    {
                        known = true;
                        rc = launch("cast", s, n, cast_k<S, D>, m, (D *)out->data,
                                    (const S *)x->data, n);
                    },
                    break) },
                break)
    if (!known)
        return wf__err(WF_EDTYPE, "cast: from %s to %s is not supported", wf_dtype_name(x->dtype),
                       wf_dtype_name(out->dtype));
    return rc;
}

/* ---- The op defs' CUDA slots (elementwise.c's kernels, with their attributes) ---------------- */

#define UNARY_SLOTS(X)        \
    X(neg, NEG)               \
    X(abs, ABS)               \
    X(exp, EXP)               \
    X(log, LOG)               \
    X(sqrt, SQRT)             \
    X(rsqrt, RSQRT)           \
    X(square, SQUARE)         \
    X(tanh, TANH)             \
    X(sigmoid, SIGMOID)       \
    X(relu, RELU)             \
    X(leaky_relu, LEAKY_RELU) \
    X(gelu, GELU_ERF)         \
    X(gelu_tanh, GELU_TANH)   \
    X(silu, SILU)             \
    X(sign, SIGN)

#define UNARY_SLOT(id, OP)                                                                     \
    int wf__cuda_kernel_##id(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in, \
                             wf_tensor **out)                                                  \
    {                                                                                          \
        return wf__unary_cuda(ctx, WF_UNARY_##OP, n->attrs->alpha, in[0], *out);               \
    }
UNARY_SLOTS(UNARY_SLOT)

#define BINARY_SLOTS(X) \
    X(add, ADD)         \
    X(sub, SUB)         \
    X(mul, MUL)         \
    X(div, DIV)         \
    X(pow, POW)         \
    X(maximum, MAXIMUM) \
    X(minimum, MINIMUM) \
    X(eq, EQ)           \
    X(ne, NE)           \
    X(lt, LT)           \
    X(le, LE)           \
    X(gt, GT)           \
    X(ge, GE)

#define BINARY_SLOT(id, OP)                                                                    \
    int wf__cuda_kernel_##id(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in, \
                             wf_tensor **out)                                                  \
    {                                                                                          \
        (void)n;                                                                               \
        return wf__binary_cuda(ctx, WF_BINARY_##OP, in[0], in[1], *out);                       \
    }
BINARY_SLOTS(BINARY_SLOT)

#define ACT_GRAD_SLOTS(X)          \
    X(relu_grad, RELU)             \
    X(leaky_relu_grad, LEAKY_RELU) \
    X(gelu_grad, GELU_ERF)         \
    X(gelu_tanh_grad, GELU_TANH)   \
    X(silu_grad, SILU)             \
    X(sigmoid_grad, SIGMOID)       \
    X(tanh_grad, TANH)

#define ACT_GRAD_SLOT(id, OP)                                                                  \
    int wf__cuda_kernel_##id(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in, \
                             wf_tensor **out)                                                  \
    {                                                                                          \
        return wf__activation_grad_cuda(ctx, WF_ACT_GRAD_##OP, n->attrs->alpha, in[0], in[1],  \
                                        *out);                                                 \
    }
ACT_GRAD_SLOTS(ACT_GRAD_SLOT)

int wf__cuda_kernel_cast(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                         wf_tensor **out)
{
    (void)n;
    return wf__cast_cuda(ctx, in[0], *out);
}

int wf__cuda_kernel_where(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                          wf_tensor **out)
{
    (void)n;
    return wf__where_cuda(ctx, in[0], in[1], in[2], *out);
}
