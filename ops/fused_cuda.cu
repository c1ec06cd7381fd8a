/* ops/fused_cuda.cu: CUDA twin of ops/fused_cpu.c: the 'fused_elementwise' program (ops/fused.h)
 * run in one pass over the output, and the op's kernel slot.
 * Owns: the device interpreter of a program: one thread per output element (grid-stride),
 *   which loads its element of each input through the broadcast strides (merged axes, as the
 *   CPU twin's plan), runs every instruction in order into per-thread registers, each
 *   instruction the elementwise CUDA kernels' own per-element code (ops/cuda_scalar.h) in
 *   its own dtype, and stores the last register. So a fused node computes on the GPU what
 *   the unfused chain's CUDA kernels compute, element by element, and what the CPU twin
 *   computes within the elementwise kernels' tolerances (libdevice maths).
 * Registers: a union per register (f32, f64, i32, i64, u8/bool, and 16-bit bits for a where
 *   that copies bf16/f16, the one instruction a program may run on halves: ops/fused.c's
 *   check refuses every other); WF__FUSED_MAX_INPUTS + WF__FUSED_MAX_OPS of them per thread.
 * Invariants: the program is checked on the host first (wf__fused_check(), the CPU twin's
 *   check, then fu_supported() for what this interpreter computes), so the device switches
 *   meet only cases they handle; element i of the output is computed from element i of each
 *   input alone (the bits do not depend on the launch shape); the output is contiguous and
 *   never overlaps an input (the op is not WF_OP_INPLACE). Integer division by zero, which
 *   the CPU reports, is found on the device (the smallest such element) and fails the call,
 *   which then waits for the stream, as elementwise_cuda.cu's division.
 * Not here: the program's format and checks (fused.c), the per-element maths (cuda_scalar.h),
 *   choosing what to fuse (runtime/compile/pass_fuse.c). */
#include "cuda_common.h"
#include "cuda_scalar.h"
extern "C" {
#include "fused.h" /* its own includes are cuda_common.h's, already read as C */
}

#include <string.h>

#define FU_MAX_REG (WF__FUSED_MAX_INPUTS + WF__FUSED_MAX_OPS)

/* One register of one thread. */
union fu_reg {
    float f;
    double d;
    int32_t i;
    int64_t l;
    uint8_t b;  /* u8 and bool (0 or 1) */
    uint16_t h; /* bf16 and f16 bits (where only) */
};

/* A launch: the program, its registers' dtypes, and the layout of the inputs over the
 * contiguous output (strides in elements, merged axes). */
struct fu_prog {
    int n_in, n_ins, rank;
    int64_t n;
    double alpha;
    uint8_t dt[FU_MAX_REG]; /* wf_dtype of each register */
    wf__fused_instr ins[WF__FUSED_MAX_OPS];
    int64_t dims[WF_MAX_RANK];
    int64_t st[WF__FUSED_MAX_INPUTS][WF_MAX_RANK];
    const void *in[WF__FUSED_MAX_INPUTS];
    void *out;
};

/* ---- Registers ------------------------------------------------------------------------------- */

template <class T> __device__ __forceinline__ T rget(const fu_reg &r);

template <> __device__ __forceinline__ float rget<float>(const fu_reg &r)
{
    return r.f;
}

template <> __device__ __forceinline__ double rget<double>(const fu_reg &r)
{
    return r.d;
}

template <> __device__ __forceinline__ int32_t rget<int32_t>(const fu_reg &r)
{
    return r.i;
}

template <> __device__ __forceinline__ int64_t rget<int64_t>(const fu_reg &r)
{
    return r.l;
}

template <> __device__ __forceinline__ uint8_t rget<uint8_t>(const fu_reg &r)
{
    return r.b;
}

template <> __device__ __forceinline__ wf_cu_bool rget<wf_cu_bool>(const fu_reg &r)
{
    return wf_cu_bool{ r.b };
}

__device__ __forceinline__ void rset(fu_reg &r, float v)
{
    r.f = v;
}

__device__ __forceinline__ void rset(fu_reg &r, double v)
{
    r.d = v;
}

__device__ __forceinline__ void rset(fu_reg &r, int32_t v)
{
    r.i = v;
}

__device__ __forceinline__ void rset(fu_reg &r, int64_t v)
{
    r.l = v;
}

__device__ __forceinline__ void rset(fu_reg &r, uint8_t v)
{
    r.b = v;
}

__device__ __forceinline__ void rset(fu_reg &r, wf_cu_bool v)
{
    r.b = v.v != 0;
}

/* Loads element 'off' of an array of dtype 'dt' into 'r' (element size decides for where's
 * bit copies). */
__device__ __forceinline__ void load(fu_reg &r, int dt, const void *p, int64_t off)
{
    switch (dt) {
    case WF_F32:
        r.f = ((const float *)p)[off];
        break;
    case WF_F64:
        r.d = ((const double *)p)[off];
        break;
    case WF_I32:
        r.i = ((const int32_t *)p)[off];
        break;
    case WF_I64:
        r.l = ((const int64_t *)p)[off];
        break;
    case WF_BF16:
    case WF_F16:
        r.h = ((const uint16_t *)p)[off];
        break;
    default: /* u8, bool */
        r.b = ((const uint8_t *)p)[off];
        break;
    }
}

__device__ __forceinline__ void store(const fu_reg &r, int dt, void *p, int64_t i)
{
    switch (dt) {
    case WF_F32:
        ((float *)p)[i] = r.f;
        break;
    case WF_F64:
        ((double *)p)[i] = r.d;
        break;
    case WF_I32:
        ((int32_t *)p)[i] = r.i;
        break;
    case WF_I64:
        ((int64_t *)p)[i] = r.l;
        break;
    case WF_BF16:
    case WF_F16:
        ((uint16_t *)p)[i] = r.h;
        break;
    default:
        ((uint8_t *)p)[i] = r.b;
        break;
    }
}

/* ---- Instructions ---------------------------------------------------------------------------- */

/* Integer division as elementwise_cuda.cu's: truncates toward zero, INT_MIN / -1 wraps; a zero
 * divisor records element 'i' in '*bad' (the smallest wins) and gives 0. */
template <class T> __device__ __forceinline__ T idiv(T x, T y, int64_t i, unsigned long long *bad)
{
    typedef typename std::make_unsigned<T>::type U;
    if (y == 0) {
        atomicMin(bad, (unsigned long long)i);
        return 0;
    }
    return y == -1 ? (T)((U)0 - (U)x) : x / y;
}

/* Calls BODY with 'T' the register type of dtype 'dt' among f32, f64, i32, i64 and u8/bool
 * (bool as uint8_t: comparisons of bools compare their bytes, as the CPU's u8 loops). */
#define FU_NUM_SWITCH(dt, BODY)              \
    switch (dt) {                            \
        WF_CU_CASE(WF_F32, float, T, BODY)   \
        WF_CU_CASE(WF_F64, double, T, BODY)  \
        WF_CU_CASE(WF_I32, int32_t, T, BODY) \
        WF_CU_CASE(WF_I64, int64_t, T, BODY) \
    default: { /* u8, bool */                \
        typedef uint8_t T;                   \
        BODY;                                \
    } break;                                 \
    }

/* Calls BODY with 'C' the element type cast converts dtype 'dt' as (ops/cuda_scalar.h). */
#define FU_CAST_SWITCH(dt, C, BODY)          \
    switch (dt) {                            \
        WF_CU_CASE(WF_F32, float, C, BODY)   \
        WF_CU_CASE(WF_F64, double, C, BODY)  \
        WF_CU_CASE(WF_I32, int32_t, C, BODY) \
        WF_CU_CASE(WF_I64, int64_t, C, BODY) \
        WF_CU_CASE(WF_U8, uint8_t, C, BODY)  \
    default: { /* bool */                    \
        typedef wf_cu_bool C;                \
        BODY;                                \
    } break;                                 \
    }

/* Runs instruction 'x' of program 'P' for output element 'i' into register 'dst'. */
__device__ __forceinline__ void run_ins(const fu_prog &P, const wf__fused_instr &x, fu_reg *r,
                                        int dst, int64_t i, unsigned long long *bad)
{
    const fu_reg &a = r[x.a], &b = r[x.b];
    int dt = P.dt[x.a];
    switch (x.kind) {
    case WF__FI_UNARY:
        FU_NUM_SWITCH(dt, {
            if constexpr (std::is_floating_point<T>::value)
                rset(r[dst], wf_cu_unary<T>(x.op, rget<T>(a), (T)P.alpha));
            else if constexpr (!std::is_same<T, uint8_t>::value)
                rset(r[dst], wf_cu_unary<T>(x.op, rget<T>(a), (T)0));
        })
        break;
    case WF__FI_BINARY:
        if (x.op >= WF_BINARY_EQ) {
            FU_NUM_SWITCH(dt,
                          { r[dst].b = wf_cu_compare<T>(x.op, rget<T>(a), rget<T>(b)) ? 1 : 0; })
        } else {
            FU_NUM_SWITCH(dt, {
                if constexpr (std::is_floating_point<T>::value) {
                    rset(r[dst], wf_cu_binary<T>(x.op, rget<T>(a), rget<T>(b), (T)P.alpha));
                } else if constexpr (!std::is_same<T, uint8_t>::value) {
                    if (x.op == WF_BINARY_DIV)
                        rset(r[dst], idiv<T>(rget<T>(a), rget<T>(b), i, bad));
                    else
                        rset(r[dst], wf_cu_binary<T>(x.op, rget<T>(a), rget<T>(b), (T)0));
                }
            })
        }
        break;
    case WF__FI_ACT_GRAD:
        if (dt == WF_F64)
            r[dst].d = wf_cu_binary<double>(WF_CU_ACT_BASE + x.op, a.d, b.d, P.alpha);
        else
            r[dst].f = wf_cu_binary<float>(WF_CU_ACT_BASE + x.op, a.f, b.f, (float)P.alpha);
        break;
    case WF__FI_WHERE:
        r[dst] = a.b ? b : r[x.c];
        break;
    default: /* WF__FI_CAST */
        FU_CAST_SWITCH(
            dt, S, { FU_CAST_SWITCH(x.dtype, D, { rset(r[dst], wf_cu_cast<D, S>(rget<S>(a))); }) })
        break;
    }
}

#define GRID_STRIDE(i, n)                                                     \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
         i += (int64_t)gridDim.x * blockDim.x)

static __global__ void fused_k(fu_prog P, unsigned long long *bad)
{
    GRID_STRIDE(i, P.n)
    {
        fu_reg r[FU_MAX_REG];
        int64_t rem = i, off[WF__FUSED_MAX_INPUTS];
        for (int k = 0; k < P.n_in; k++)
            off[k] = 0;
        for (int d = P.rank - 1; d >= 0; d--) {
            int64_t c = rem % P.dims[d];
            rem /= P.dims[d];
            for (int k = 0; k < P.n_in; k++)
                off[k] += c * P.st[k][d];
        }
        for (int k = 0; k < P.n_in; k++)
            load(r[k], P.dt[k], P.in[k], off[k]);
        for (int j = 0; j < P.n_ins; j++)
            run_ins(P, P.ins[j], r, P.n_in + j, i, bad);
        int last = P.n_in + P.n_ins - 1;
        store(r[last], P.dt[last], P.out, i);
    }
}

/* ---- The entry ------------------------------------------------------------------------------- */

static bool is_num(wf_dtype dt)
{
    return dt == WF_F32 || dt == WF_F64 || dt == WF_I32 || dt == WF_I64;
}

/* Whether the interpreter computes instruction 'x' over registers of dtypes 'dt' (after
 * wf__fused_check(), which follows the CPU's loops; this says the same for the device
 * switches above, so a case one has and the other lacks is an error, never a wrong value). */
static bool fu_supported(const wf__fused_instr *x, const wf_dtype *dt)
{
    wf_dtype a = dt[x->a];
    bool flt = a == WF_F32 || a == WF_F64;
    switch (x->kind) {
    case WF__FI_UNARY:
        return flt ||
               ((a == WF_I32 || a == WF_I64) &&
                (x->op == WF_UNARY_NEG || x->op == WF_UNARY_ABS || x->op == WF_UNARY_SQUARE ||
                 x->op == WF_UNARY_RELU || x->op == WF_UNARY_SIGN));
    case WF__FI_BINARY:
        if (x->op >= WF_BINARY_EQ)
            return is_num(a) || a == WF_U8 || a == WF_BOOL;
        return flt || ((a == WF_I32 || a == WF_I64) && x->op != WF_BINARY_POW);
    case WF__FI_ACT_GRAD:
        return flt;
    case WF__FI_WHERE:
        return a == WF_BOOL;
    case WF__FI_CAST: {
        wf_dtype d = (wf_dtype)x->dtype;
        return (is_num(a) || a == WF_U8 || a == WF_BOOL) &&
               (is_num(d) || d == WF_U8 || d == WF_BOOL);
    }
    default:
        return false;
    }
}

int wf__fused_elementwise_cuda(const wf_kernel_ctx *ctx, const wf_attrs *attrs,
                               const wf_tensor *const *in, int n_in, wf_tensor *out)
{
    const char *op = "fused_elementwise";
    char err[WF_ERRMSG_MAX], s1[160], s2[160];
    if (!attrs || !in || !out)
        return wf__err(WF_EINVAL, "%s: %s is NULL", op, !attrs ? "attrs" : !in ? "in" : "out");
    if (n_in < 1 || n_in > WF__FUSED_MAX_INPUTS)
        return wf__err(WF_EINVAL, "%s: %d inputs (1 to %d)", op, n_in, WF__FUSED_MAX_INPUTS);
    fu_prog P;
    memset(&P, 0, sizeof P);
    int m = wf__fused_decode(attrs, P.ins);
    if (m < 0)
        return m;
    wf_dtype dt[FU_MAX_REG];
    wf_shape shape;
    for (int k = 0; k < n_in; k++) {
        if (!in[k])
            return wf__err(WF_EINVAL, "%s: input %d is NULL", op, k);
        dt[k] = in[k]->dtype;
        if (k == 0) {
            shape = in[0]->shape;
        } else if (wf_shape_broadcast(shape, in[k]->shape, &shape) < 0) {
            return wf__err(WF_ESHAPE, "%s: input %d is %s, which does not broadcast with %s", op, k,
                           wf_shape_str(in[k]->shape, s1, sizeof s1),
                           wf_shape_str(in[0]->shape, s2, sizeof s2));
        }
    }
    int rc = wf__fused_check(P.ins, m, n_in, dt, err, sizeof err);
    if (rc < 0)
        return wf__err(rc, "%s: %s", op, err);
    bool has_idiv = false;
    for (int j = 0; j < m; j++) {
        const wf__fused_instr *x = &P.ins[j];
        if (!fu_supported(x, dt))
            return wf__err(WF_EDTYPE, "%s: instruction %d (%s) of %s has no CUDA kernel", op, j,
                           wf__fused_instr_name(x), wf_dtype_name(dt[x->a]));
        has_idiv = has_idiv || (x->kind == WF__FI_BINARY && x->op == WF_BINARY_DIV &&
                                (dt[x->a] == WF_I32 || dt[x->a] == WF_I64));
        dt[n_in + j] = (wf_dtype)x->dtype;
    }
    rc = wf__kernel_check_out(op, out, dt[n_in + m - 1], shape);
    const wf__cuda_queue *q;
    if (rc < 0 || (rc = wf__cuda_enter(ctx, op, &q)) < 0)
        return rc;
    if (out->numel == 0)
        return 0;
    /* The layout: operand 0 the output (contiguous), 1 .. n_in the inputs, in elements. */
    int r = out->shape.rank;
    int64_t full[WF__FUSED_MAX_INPUTS + 1][WF_MAX_RANK], st[WF__FUSED_MAX_INPUTS + 1][WF_MAX_RANK];
    wf__ops_bcast_strides(out, r, 1, full[0]);
    for (int k = 0; k < n_in; k++)
        wf__ops_bcast_strides(in[k], r, 1, full[k + 1]);
    P.rank = wf__ops_merge_axes(out->shape, n_in + 1, full, P.dims, st);
    for (int k = 0; k < n_in; k++) {
        memcpy(P.st[k], st[k + 1], sizeof P.st[k]);
        P.in[k] = in[k]->data;
    }
    P.n_in = n_in;
    P.n_ins = m;
    P.n = out->numel;
    P.alpha = attrs->alpha;
    P.out = out->data;
    for (int k = 0; k < n_in + m; k++)
        P.dt[k] = (uint8_t)dt[k];
    cudaStream_t s = q->stream;
    void *flag = NULL;
    if (has_idiv && (rc = wf__cuda_flag(s, op, &flag)) < 0)
        return rc;
    fused_k<<<wf__cuda_blocks(P.n, WF_CU_THREADS), WF_CU_THREADS, 0, s>>>(
        P, (unsigned long long *)flag);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        rc = wf__cuda_fail(e, op, "kernel launch");
    int64_t bad = -1;
    if (rc == 0 && has_idiv)
        rc = wf__cuda_read_flag(s, (const int64_t *)flag, op, &bad);
    if (flag)
        wf__cuda_tmp_free(s, flag);
    if (rc == 0 && bad != -1)
        rc = wf__err(WF_EINVAL, "div: integer division by zero at element %lld", (long long)bad);
    return rc;
}

/* ---- The op def's CUDA slot (fused.c) -------------------------------------------------------- */

int wf__cuda_kernel_fused_elementwise(const wf_kernel_ctx *ctx, const wf_node *n,
                                      wf_tensor *const *in, wf_tensor **out)
{
    return wf__fused_elementwise_cuda(ctx, n->attrs, (const wf_tensor *const *)in, n->n_inputs,
                                      *out);
}
