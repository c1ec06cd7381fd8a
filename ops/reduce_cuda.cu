/* ops/reduce_cuda.cu: CUDA twin of ops/reduce_cpu.c: sum, mean, max, min, prod, argmax and
 * logsumexp over any set of axes, with keepdims; and the kernel slots of those ops.
 * Owns: the reduction plan on the device (kept axes: the output's row-major order; reduced
 *   axes: size-1 axes dropped, contiguous neighbours merged, which keeps the row-major order
 *   of the reduced sub-block that argmax reports positions in, as the CPU twin) and two
 *   kernels: a block per output (each thread folds positions tid, tid + 256, ... in order,
 *   then a fixed shared-memory tree combines the 256 partials) for reductions along rows,
 *   and a thread per output folding its positions in order for reductions down the columns
 *   of a row-major matrix (coalesced across neighbouring outputs). Few outputs over long
 *   ranges (a loss's mean, a full sum) cut each range into fixed chunks of RD_CHUNK
 *   positions, a block each, whose partials a second kernel combines in chunk order.
 * Invariants: the bits depend only on the shapes (fixed fold order, no atomics); floating
 *   sums and products accumulate in f64, integer ones in wrapping 64-bit; max, min and argmax
 *   take the first NaN, else the first extreme in row-major order (ties keep the earlier
 *   position), whatever the order partials are combined in; empty ranges give the CPU's
 *   identities (0, 1, NaN for mean, -inf for logsumexp) or its WF_EINVAL.
 * Not here: the op definitions (reduce.c), softmax (softmax_cuda.cu). */
#include "cuda_common.h"

#include <math.h>
#include <type_traits>

#define RD_THREADS 256
#define RD_CHUNK   16384 /* reduced positions per block when few outputs share a long range */

/* One partial: floating ops use 'v' (and 's' for logsumexp's sum), integer ops 'iv'; max,
 * min and argmax keep the position of their value in 'idx' (-1: none yet). */
struct rd_acc {
    double v, s;
    int64_t iv, idx;
};

/* The plan: out element o is kept position o; its reduced positions 0 .. m-1. */
struct rd_plan {
    int op;
    wf__reduce_geom g;      /* the axes, sizes and strides read (as the CPU twin's) */
    int64_t chunk, nchunks; /* reduced positions per block item, items per output */
};

__device__ __forceinline__ void rd_init(int op, rd_acc &a)
{
    a.v = op == WF__REDUCE_PROD ? 1.0 : op == WF__REDUCE_LOGSUMEXP ? -INFINITY : 0.0;
    a.s = 0;
    a.iv = op == WF__REDUCE_PROD ? 1 : 0;
    a.idx = -1;
}

/* True when (v, pos) beats the extreme (m, idx) so far: better, or the first NaN; on ties and
 * between NaNs the earlier position wins. 'sign' 1 for max, -1 for min. */
__device__ __forceinline__ bool wins_f(double v, int64_t pos, double m, int64_t idx, int sign)
{
    if (idx < 0)
        return true;
    bool vn = v != v, mn = m != m;
    if (vn || mn)
        return vn && (!mn || pos < idx);
    if (v == m)
        return pos < idx;
    return sign > 0 ? v > m : v < m;
}

__device__ __forceinline__ bool wins_i(int64_t v, int64_t pos, int64_t m, int64_t idx, int sign)
{
    if (idx < 0)
        return true;
    if (v == m)
        return pos < idx;
    return sign > 0 ? v > m : v < m;
}

/* Folds element value x (at reduced position 'pos') into a. For logsumexp's second pass
 * (lse_pass 2) 'a.v' holds the row's maximum and the exponential is summed into 'a.s'. */
template <class S>
__device__ __forceinline__ void rd_fold(int op, int lse_pass, rd_acc &a, S x, int64_t pos)
{
    if constexpr (std::is_integral<S>::value) {
        int64_t v = (int64_t)x;
        switch (op) {
        case WF__REDUCE_SUM:
            a.iv = (int64_t)((uint64_t)a.iv + (uint64_t)v);
            break;
        case WF__REDUCE_PROD:
            a.iv = (int64_t)((uint64_t)a.iv * (uint64_t)v);
            break;
        case WF__REDUCE_MIN:
            if (wins_i(v, pos, a.iv, a.idx, -1)) {
                a.iv = v;
                a.idx = pos;
            }
            break;
        default: /* max, argmax */
            if (wins_i(v, pos, a.iv, a.idx, 1)) {
                a.iv = v;
                a.idx = pos;
            }
        }
    } else {
        double v = (double)wf_cu_ld<typename wf_cu_compute<S>::type>(x);
        switch (op) {
        case WF__REDUCE_SUM:
        case WF__REDUCE_MEAN:
            a.v += v;
            break;
        case WF__REDUCE_PROD:
            a.v *= v;
            break;
        case WF__REDUCE_MIN:
            if (wins_f(v, pos, a.v, a.idx, -1)) {
                a.v = v;
                a.idx = pos;
            }
            break;
        case WF__REDUCE_LOGSUMEXP:
            if (lse_pass == 2) {
                a.s += exp(v - a.v);
                break;
            }
            if (wins_f(v, pos, a.v, a.idx, 1)) {
                a.v = v;
                a.idx = pos;
            }
            break;
        default: /* max, argmax */
            if (wins_f(v, pos, a.v, a.idx, 1)) {
                a.v = v;
                a.idx = pos;
            }
        }
    }
}

/* Combines partial b (later positions' or another thread's) into a. */
template <bool INT>
__device__ __forceinline__ void rd_combine(int op, int lse_pass, rd_acc &a, const rd_acc &b)
{
    switch (op) {
    case WF__REDUCE_SUM:
    case WF__REDUCE_MEAN:
        a.v += b.v;
        a.iv = (int64_t)((uint64_t)a.iv + (uint64_t)b.iv);
        break;
    case WF__REDUCE_PROD:
        a.v *= b.v;
        a.iv = (int64_t)((uint64_t)a.iv * (uint64_t)b.iv);
        break;
    case WF__REDUCE_LOGSUMEXP:
        if (lse_pass == 2) {
            a.s += b.s;
            break;
        }
        /* fall through: the first pass is a max */
    default: {
        if (b.idx < 0)
            break;
        int sign = op == WF__REDUCE_MIN ? -1 : 1;
        bool w =
            INT ? wins_i(b.iv, b.idx, a.iv, a.idx, sign) : wins_f(b.v, b.idx, a.v, a.idx, sign);
        if (w)
            a = b;
    }
    }
}

/* The offset of kept position o and of reduced position j, in elements. */
__device__ __forceinline__ int64_t kept_offset(const rd_plan &p, int64_t o)
{
    int64_t off = 0;
    for (int d = p.g.kr - 1; d >= 0; d--) {
        off += (o % p.g.kdims[d]) * p.g.kst[d];
        o /= p.g.kdims[d];
    }
    return off;
}

__device__ __forceinline__ int64_t reduced_offset(const rd_plan &p, int64_t j)
{
    int64_t off = 0;
    for (int d = p.g.rr - 1; d >= 0; d--) {
        off += (j % p.g.rdims[d]) * p.g.rst[d];
        j /= p.g.rdims[d];
    }
    return off;
}

/* Writes the result of partial a for output o. */
template <class S, class R>
__device__ __forceinline__ void rd_finish(const rd_plan &p, const rd_acc &a, R *out, int64_t o)
{
    switch (p.op) {
    case WF__REDUCE_ARGMAX:
        out[o] = (R)a.idx;
        return;
    case WF__REDUCE_MEAN:
        out[o] = wf_cu_st<R>((typename wf_cu_compute<R>::type)(a.v / (double)p.g.m));
        return;
    case WF__REDUCE_LOGSUMEXP: {
        double r = isfinite(a.v) ? a.v + log(a.s) : a.v;
        out[o] = wf_cu_st<R>((typename wf_cu_compute<R>::type)r);
        return;
    }
    default:
        break;
    }
    if constexpr (std::is_integral<S>::value)
        out[o] = (R)a.iv; /* i32 keeps the low 32 bits: wraps as the CPU's */
    else
        out[o] = wf_cu_st<R>((typename wf_cu_compute<R>::type)a.v);
}

/* A block per item: item k is output k / nchunks, chunk k % nchunks of its reduced range
 * (positions [c chunk, (c + 1) chunk)); grid-stride over items. With one chunk the block
 * writes the output, else its partial into 'part[k]' (combined by reduce_chunks_k). */
template <class S, class R>
static __global__ void reduce_rows_k(rd_plan p, const S *x, R *out, rd_acc *part)
{
    __shared__ rd_acc sh[RD_THREADS];
    const bool is_int = std::is_integral<S>::value;
    int tid = threadIdx.x;
    int passes = p.op == WF__REDUCE_LOGSUMEXP ? 2 : 1;
    int64_t items = p.g.nout * p.nchunks;
    for (int64_t k = blockIdx.x; k < items; k += gridDim.x) {
        int64_t o = k / p.nchunks, lo = k % p.nchunks * p.chunk;
        int64_t hi = lo + p.chunk < p.g.m ? lo + p.chunk : p.g.m;
        const S *base = x + kept_offset(p, o);
        rd_acc a;
        rd_init(p.op, a);
        for (int pass = 1; pass <= passes; pass++) {
            if (pass == 2) {
                double m = sh[0].v;
                __syncthreads(); /* everyone has read sh[0] before it is overwritten */
                if (!isfinite(m))
                    break; /* NaN, +inf or an all -inf range decides alone (the sum stays 0) */
                a.v = m;
                a.s = 0;
            }
            for (int64_t j = lo + tid; j < hi; j += RD_THREADS)
                rd_fold<S>(p.op, pass, a, base[reduced_offset(p, j)], j);
            sh[tid] = a;
            __syncthreads();
            for (int w = RD_THREADS / 2; w > 0; w >>= 1) {
                if (tid < w)
                    rd_combine<is_int>(p.op, pass, sh[tid], sh[tid + w]);
                __syncthreads();
            }
            a = sh[0];
        }
        if (tid == 0) {
            if (p.nchunks == 1)
                rd_finish<S, R>(p, a, out, o);
            else
                part[k] = a;
        }
        __syncthreads(); /* sh[0] is read by everyone above before the next item */
    }
}

/* Combines the chunk partials of each output in chunk order (a thread per output). */
template <class S, class R>
static __global__ void reduce_chunks_k(rd_plan p, const rd_acc *part, R *out)
{
    const bool is_int = std::is_integral<S>::value;
    for (int64_t o = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; o < p.g.nout;
         o += (int64_t)gridDim.x * blockDim.x) {
        rd_acc a = part[o * p.nchunks];
        for (int64_t c = 1; c < p.nchunks; c++) {
            const rd_acc &b = part[o * p.nchunks + c];
            if (p.op == WF__REDUCE_LOGSUMEXP) { /* rescale both sums to the larger maximum */
                double av = a.v, bv = b.v;
                double m = av != av ? av : bv != bv ? bv : av > bv ? av : bv;
                if (isfinite(m))
                    a.s = a.s * exp(av - m) + b.s * exp(bv - m);
                a.v = m;
            } else {
                rd_combine<is_int>(p.op, 1, a, b);
            }
        }
        rd_finish<S, R>(p, a, out, o);
    }
}

/* A thread per output, folding its reduced positions in order (one reduced axis). */
template <class S, class R> static __global__ void reduce_cols_k(rd_plan p, const S *x, R *out)
{
    for (int64_t o = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; o < p.g.nout;
         o += (int64_t)gridDim.x * blockDim.x) {
        const S *base = x + kept_offset(p, o);
        rd_acc a;
        rd_init(p.op, a);
        for (int64_t j = 0; j < p.g.m; j++)
            rd_fold<S>(p.op, 1, a, base[j * p.g.rst[0]], j);
        if (p.op == WF__REDUCE_LOGSUMEXP && isfinite(a.v)) {
            a.s = 0;
            for (int64_t j = 0; j < p.g.m; j++)
                rd_fold<S>(p.op, 2, a, base[j * p.g.rst[0]], j);
        }
        rd_finish<S, R>(p, a, out, o);
    }
}

/* ---- The entry ------------------------------------------------------------------------------- */

template <class S, class R>
static int launch_reduce(const char *name, cudaStream_t s, const rd_plan &p, bool cols,
                         const void *x, void *out)
{
    if (cols) {
        reduce_cols_k<S, R><<<wf__cuda_blocks(p.g.nout, WF_CU_THREADS), WF_CU_THREADS, 0, s>>>(
            p, (const S *)x, (R *)out);
        WF_CU_LAUNCHED(name);
        return 0;
    }
    int64_t items = p.g.nout * p.nchunks;
    unsigned blocks = (unsigned)(items < 65535 ? items : 65535);
    void *part = NULL;
    if (p.nchunks > 1) {
        int rc = wf__cuda_tmp(s, (size_t)items * sizeof(rd_acc), name, &part);
        if (rc < 0)
            return rc;
    }
    reduce_rows_k<S, R><<<blocks, RD_THREADS, 0, s>>>(p, (const S *)x, (R *)out, (rd_acc *)part);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess && p.nchunks > 1) {
        reduce_chunks_k<S, R><<<wf__cuda_blocks(p.g.nout, WF_CU_THREADS), WF_CU_THREADS, 0, s>>>(
            p, (const rd_acc *)part, (R *)out);
        e = cudaGetLastError();
    }
    wf__cuda_tmp_free(s, part);
    return e == cudaSuccess ? 0 : wf__cuda_fail(e, name, "kernel launch");
}

int wf__reduce_cuda(const wf_kernel_ctx *ctx, wf__reduce_kind op, const int *axes, int n_axes,
                    bool keepdims, const wf_tensor *x, wf_tensor *out)
{
    bool mask[WF_MAX_RANK];
    int rc = wf__ops_reduce_check(op, axes, n_axes, keepdims, x, out, mask);
    if (rc < 0)
        return rc;
    const char *name = wf__ops_reduce_name(op);
    rd_plan p;
    p.op = op;
    wf__ops_reduce_geom(x, mask, &p.g);
    if (p.g.m == 0 && (op == WF__REDUCE_MAX || op == WF__REDUCE_MIN || op == WF__REDUCE_ARGMAX)) {
        char sb[160];
        return wf__err(WF_EINVAL, "%s: x %s has an empty reduced range; %s has no identity", name,
                       wf_shape_str(x->shape, sb, sizeof sb), name);
    }
    const wf__cuda_queue *q;
    if ((rc = wf__cuda_enter(ctx, name, &q)) < 0)
        return rc;
    if (p.g.nout == 0)
        return 0;
    /* Down the columns: one reduced axis not of unit stride, the kept innermost axis of unit
     * stride, and enough outputs to fill the device with a thread each. */
    bool cols = p.g.rr == 1 && p.g.rst[0] != 1 && p.g.kr > 0 && p.g.kst[p.g.kr - 1] == 1 &&
                p.g.nout >= 2048;
    /* Few outputs over long ranges: fixed chunks of RD_CHUNK positions, a block each, their
     * partials combined in order (the chunking depends on the shapes only). */
    p.chunk = p.g.m > 0 ? p.g.m : 1;
    p.nchunks = 1;
    if (!cols && p.g.nout < 4096 && p.g.m > 2 * RD_CHUNK) {
        p.chunk = RD_CHUNK;
        p.nchunks = (p.g.m + RD_CHUNK - 1) / RD_CHUNK;
    }
    wf_dtype dt = x->dtype;
    if (op == WF__REDUCE_ARGMAX) {
        switch (dt) {
        case WF_I32:
            return launch_reduce<int32_t, int64_t>(name, q->stream, p, cols, x->data, out->data);
        case WF_I64:
            return launch_reduce<int64_t, int64_t>(name, q->stream, p, cols, x->data, out->data);
        default:
            WF_CU_FLOAT_SWITCH(
                dt,
                return (launch_reduce<S, int64_t>(name, q->stream, p, cols, x->data, out->data)),
                break)
        }
    } else {
        switch (dt) {
        case WF_I32:
            return launch_reduce<int32_t, int32_t>(name, q->stream, p, cols, x->data, out->data);
        case WF_I64:
            return launch_reduce<int64_t, int64_t>(name, q->stream, p, cols, x->data, out->data);
        default:
            WF_CU_FLOAT_SWITCH(
                dt, return (launch_reduce<S, S>(name, q->stream, p, cols, x->data, out->data)),
                break)
        }
    }
    return wf__err(WF_EDTYPE, "%s: x is %s", name, wf_dtype_name(dt));
}

/* ---- The op defs' CUDA slots (reduce.c's run_reduce) ----------------------------------------- */

static int run_reduce(const wf_kernel_ctx *ctx, wf__reduce_kind op, const wf_node *n,
                      const wf_tensor *x, wf_tensor *out)
{
    int axes[WF_MAX_RANK];
    int k = wf__ops_reduce_axes(n, axes);
    return wf__reduce_cuda(ctx, op, k ? axes : NULL, k, n->attrs->keepdims, x, out);
}

#define REDUCE_SLOT(id, OP)                                                                    \
    int wf__cuda_kernel_##id(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in, \
                             wf_tensor **out)                                                  \
    {                                                                                          \
        return run_reduce(ctx, WF__REDUCE_##OP, n, in[0], *out);                               \
    }
REDUCE_SLOT(sum, SUM)
REDUCE_SLOT(mean, MEAN)
REDUCE_SLOT(max, MAX)
REDUCE_SLOT(min, MIN)
REDUCE_SLOT(prod, PROD)
REDUCE_SLOT(argmax, ARGMAX)
REDUCE_SLOT(logsumexp, LOGSUMEXP)
