/* ops/cuda_scalar.h: the per-element device maths of the elementwise ops, for the .cu files that
 * must compute exactly what the elementwise CUDA kernels compute: elementwise_cuda.cu (the
 * kernels) and fused_cuda.cu (the fused elementwise program), so a fused node's element is
 * the unfused chain's on the GPU too. The device twin of ops/scalar.h (C++ templates, for the
 * .cu files only; include it after cuda_common.h).
 * Owns: the formulas, as the CPU twin writes them (ops/elementwise_cpu.c: the same stable
 *   sigmoid, the same gelu constants, the same integer wrapping): wf_cu_unary (unary math and
 *   activations), wf_cu_binary (arithmetic but integer division, and the activation
 *   gradients as op WF_CU_ACT_BASE + wf_act_grad_op), wf_cu_compare, and wf_cu_cast (cast's
 *   conversions, with wf_cu_bool for bool elements).
 * Why not shared with the CPU's C source: the CPU loops are C macros over whole runs (they
 *   vectorise there); these are per-element C++ templates. Both follow the same formulas;
 *   libdevice's exp, tanh, erf and pow differ from glibc's by a few ulp (ops/cuda_kernels.h
 *   states the tolerances).
 * Invariants: T is the compute type (float for f32, bf16 and f16; double for f64; the integer
 *   type itself for integer ops); each function reads only its arguments.
 * Not here: loading and storing half types (cuda_common.h: wf_cu_ld, wf_cu_st), kernels. */
#ifndef WF_OPS_CUDA_SCALAR_H
#define WF_OPS_CUDA_SCALAR_H

#ifndef WF_OPS_CUDA_COMMON_H
#    error "include ops/cuda_common.h before ops/cuda_scalar.h"
#endif

#include <type_traits>

template <class T> __device__ __forceinline__ T wf_cu_sigmoid(T v)
{
    T e = exp(-fabs(v)), r = (T)1 / ((T)1 + e);
    return v >= 0 ? r : e * r;
}

template <class T> __device__ __forceinline__ T wf_cu_gelu_tanh(T v)
{
    return (T)0.5 * v * ((T)1 + tanh((T)0.7978845608028654 * (v + (T)0.044715 * v * v * v)));
}

template <class T> __device__ __forceinline__ T wf_cu_gelu_erf(T v)
{
    return (T)0.5 * v * ((T)1 + erf(v * (T)0.7071067811865476));
}

template <class T> __device__ __forceinline__ T wf_cu_dgelu_erf(T v)
{
    T cdf = (T)0.5 * ((T)1 + erf(v * (T)0.7071067811865476));
    return cdf + v * (T)0.3989422804014327 * exp((T)-0.5 * v * v);
}

template <class T> __device__ __forceinline__ T wf_cu_dgelu_tanh(T v)
{
    const T k = (T)0.7978845608028654, c = (T)0.044715;
    T t = tanh(k * (v + c * v * v * v));
    return (T)0.5 * ((T)1 + t) + (T)0.5 * v * ((T)1 - t * t) * k * ((T)1 + (T)3 * c * v * v);
}

template <class T> __device__ __forceinline__ T wf_cu_dsilu(T v)
{
    T sg = wf_cu_sigmoid(v);
    return sg * ((T)1 + v * ((T)1 - sg));
}

/* Unary op 'op' of compute type T (floating, or the integer ops of the CPU twin). */
template <class T> __device__ __forceinline__ T wf_cu_unary(int op, T v, T alpha)
{
    if constexpr (std::is_floating_point<T>::value) {
        switch (op) {
        case WF_UNARY_NEG:
            return -v;
        case WF_UNARY_ABS:
            return fabs(v);
        case WF_UNARY_EXP:
            return exp(v);
        case WF_UNARY_LOG:
            return log(v);
        case WF_UNARY_SQRT:
            return sqrt(v);
        case WF_UNARY_RSQRT:
            return (T)1 / sqrt(v);
        case WF_UNARY_SQUARE:
            return v * v;
        case WF_UNARY_TANH:
            return tanh(v);
        case WF_UNARY_SIGMOID:
            return wf_cu_sigmoid(v);
        case WF_UNARY_RELU:
            return v < 0 ? (T)0 : v;
        case WF_UNARY_LEAKY_RELU:
            return v < 0 ? alpha * v : v;
        case WF_UNARY_GELU_TANH:
            return wf_cu_gelu_tanh(v);
        case WF_UNARY_GELU_ERF:
            return wf_cu_gelu_erf(v);
        case WF_UNARY_SILU:
            return v * wf_cu_sigmoid(v);
        default: /* WF_UNARY_SIGN */
            return v > 0 ? (T)1 : v < 0 ? (T)-1 : v;
        }
    } else {
        typedef typename std::make_unsigned<T>::type U;
        switch (op) {
        case WF_UNARY_NEG:
            return (T)((U)0 - (U)v);
        case WF_UNARY_ABS:
            return v < 0 ? (T)((U)0 - (U)v) : v;
        case WF_UNARY_SQUARE:
            return (T)((U)v * (U)v);
        case WF_UNARY_RELU:
            return v < 0 ? (T)0 : v;
        default: /* WF_UNARY_SIGN */
            return (T)((v > 0) - (v < 0));
        }
    }
}

/* Binary arithmetic op 'op' (WF_BINARY_ADD .. MINIMUM), or an activation gradient (op
 * WF_CU_ACT_BASE + wf_act_grad_op; a is x or y, b is dy). Integer division is done by the kernel.
 */
#define WF_CU_ACT_BASE 100

template <class T> __device__ __forceinline__ T wf_cu_binary(int op, T a, T b, T alpha)
{
    if constexpr (std::is_floating_point<T>::value) {
        switch (op) {
        case WF_BINARY_ADD:
            return a + b;
        case WF_BINARY_SUB:
            return a - b;
        case WF_BINARY_MUL:
            return a * b;
        case WF_BINARY_DIV:
            return a / b;
        case WF_BINARY_POW:
            return pow(a, b);
        case WF_BINARY_MAXIMUM:
            return a > b || a != a ? a : b;
        case WF_BINARY_MINIMUM:
            return a < b || a != a ? a : b;
        case WF_CU_ACT_BASE + WF_ACT_GRAD_RELU:
            return a > 0 ? b : (T)0;
        case WF_CU_ACT_BASE + WF_ACT_GRAD_LEAKY_RELU:
            return a < 0 ? alpha * b : b;
        case WF_CU_ACT_BASE + WF_ACT_GRAD_GELU_ERF:
            return b * wf_cu_dgelu_erf(a);
        case WF_CU_ACT_BASE + WF_ACT_GRAD_GELU_TANH:
            return b * wf_cu_dgelu_tanh(a);
        case WF_CU_ACT_BASE + WF_ACT_GRAD_SILU:
            return b * wf_cu_dsilu(a);
        case WF_CU_ACT_BASE + WF_ACT_GRAD_SIGMOID:
            return b * a * ((T)1 - a);
        default: /* WF_CU_ACT_BASE + WF_ACT_GRAD_TANH */
            return b * ((T)1 - a * a);
        }
    } else {
        typedef typename std::make_unsigned<T>::type U;
        switch (op) {
        case WF_BINARY_ADD:
            return (T)((U)a + (U)b);
        case WF_BINARY_SUB:
            return (T)((U)a - (U)b);
        case WF_BINARY_MUL:
            return (T)((U)a * (U)b);
        case WF_BINARY_MAXIMUM:
            return a > b ? a : b;
        default: /* WF_BINARY_MINIMUM */
            return a < b ? a : b;
        }
    }
}

template <class T> __device__ __forceinline__ bool wf_cu_compare(int op, T a, T b)
{
    switch (op) {
    case WF_BINARY_EQ:
        return a == b;
    case WF_BINARY_NE:
        return a != b;
    case WF_BINARY_LT:
        return a < b;
    case WF_BINARY_LE:
        return a <= b;
    case WF_BINARY_GT:
        return a > b;
    default: /* WF_BINARY_GE */
        return a >= b;
    }
}

/* ---- cast: the CPU twin's conversions -------------------------------------------------------- */

/* A bool element, stored as a byte; any non-zero byte reads as true. */
struct wf_cu_bool {
    uint8_t v;
};

/* Floating to integer: truncate toward zero, saturate, NaN gives 0. */
template <class D> __device__ __forceinline__ D wf_cu_f2i(double v)
{
    if (v != v)
        return 0;
    if constexpr (std::is_same<D, int32_t>::value)
        return v >= 2147483647.0 ? INT32_MAX : v <= -2147483648.0 ? INT32_MIN : (int32_t)v;
    else if constexpr (std::is_same<D, int64_t>::value)
        return v >= 9.2233720368547758e18    ? INT64_MAX
               : v <= -9.2233720368547758e18 ? INT64_MIN
                                             : (int64_t)v;
    else
        return v <= 0 ? 0 : v >= 255 ? 255 : (uint8_t)v;
}

/* One element from S to D. bf16 and f16 sources read as f32, destinations are the f32 value
 * rounded once (as the CPU, which stages them through f32). */
template <class D, class S> __device__ __forceinline__ D wf_cu_cast(S s)
{
    if constexpr (std::is_same<S, __nv_bfloat16>::value || std::is_same<S, __half>::value) {
        return wf_cu_cast<D, float>(wf_cu_ld<float>(s));
    } else if constexpr (std::is_same<S, wf_cu_bool>::value) {
        return wf_cu_cast<D, uint8_t>((uint8_t)(s.v != 0));
    } else if constexpr (std::is_same<D, wf_cu_bool>::value) {
        return wf_cu_bool{ (uint8_t)(s != 0) };
    } else if constexpr (std::is_same<D, __nv_bfloat16>::value || std::is_same<D, __half>::value) {
        return wf_cu_st<D>(wf_cu_cast<float, S>(s));
    } else if constexpr (std::is_floating_point<S>::value && std::is_integral<D>::value) {
        return wf_cu_f2i<D>((double)s);
    } else {
        return (D)s; /* float <-> float, int -> float, int -> int (wraps) */
    }
}

#endif /* WF_OPS_CUDA_SCALAR_H */
