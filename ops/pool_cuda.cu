/* ops/pool_cuda.cu: CUDA twin of ops/pool_cpu.c: max_pool2d, avg_pool2d and their backward
 * ops (NCHW); and the kernel slots of those ops.
 * Owns: the window walk on the device, the CPU twin's: window (i, j) covers rows
 *   i stride_h - top .. + KH - 1 and columns alike, clipped to x; the max of a window is its
 *   first NaN if it holds one, else its first maximum in row-major order; averages sum in
 *   f64 and divide by the real elements (or KH x KW with count_include_pad). Forward: a
 *   thread per output element. Backward: a thread per input element, adding the gradients of
 *   the windows that cover it (for max, those whose winner it is) in window order, which is
 *   the order the CPU twin adds them in: the same bits, with no atomics.
 * Inputs are read through their strides; bf16 and f16 compute in f32 and round once.
 * Not here: the op definitions and shape inference (pool.c), convolutions (conv_cuda.cu). */
#include "cuda_common.h"

enum { PL_MAX, PL_AVG, PL_MAX_BWD, PL_AVG_BWD };

static const char *const pl_names[] = { "max_pool2d", "avg_pool2d", "max_pool2d_backward",
                                        "avg_pool2d_backward" };

struct pl_plan {
    int kind;
    wf__pool_geom g; /* from wf__ops_pool_check, as the CPU's */
    int64_t xst[4], dst[4];
};

__device__ __forceinline__ void span(int64_t o, int64_t s, int64_t pad, int64_t k, int64_t in,
                                     int64_t *lo, int64_t *hi)
{
    int64_t a = o * s - pad, b = a + k;
    *lo = a < 0 ? 0 : a;
    *hi = b > in ? in : b;
}

/* The winner of window (oh, ow) of plane x: its row-major position in the plane (h W + w)
 * and its value. */
template <class S, class T>
__device__ __forceinline__ int64_t window_max(const pl_plan &p, const S *x, int64_t oh, int64_t ow,
                                              T *value)
{
    int64_t h0, h1, w0, w1;
    span(oh, p.g.sh, p.g.pt, p.g.KH, p.g.H, &h0, &h1);
    span(ow, p.g.sw, p.g.pl, p.g.KW, p.g.W, &w0, &w1);
    T m = wf_cu_ld<T>(x[h0 * p.xst[2] + w0 * p.xst[3]]);
    int64_t at = h0 * p.g.W + w0;
    for (int64_t ih = h0; ih < h1 && m == m; ih++)
        for (int64_t iw = ih == h0 ? w0 + 1 : w0; iw < w1; iw++) {
            T v = wf_cu_ld<T>(x[ih * p.xst[2] + iw * p.xst[3]]);
            if (v > m || v != v) {
                m = v;
                at = ih * p.g.W + iw;
                if (v != v)
                    break;
            }
        }
    *value = m;
    return at;
}

template <class S> static __global__ void pool_k(pl_plan p, const S *x, const S *dy, S *out)
{
    typedef typename wf_cu_compute<S>::type T;
    bool bwd = p.kind == PL_MAX_BWD || p.kind == PL_AVG_BWD;
    int64_t per = bwd ? p.g.H * p.g.W : p.g.OH * p.g.OW, n = p.g.N * p.g.C * per;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t plane = i / per, e = i % per, b = plane / p.g.C, c = plane % p.g.C;
        const S *xp = x ? x + b * p.xst[0] + c * p.xst[1] : NULL;
        const S *dp = dy ? dy + b * p.dst[0] + c * p.dst[1] : NULL;
        if (!bwd) {
            int64_t oh = e / p.g.OW, ow = e % p.g.OW;
            if (p.kind == PL_MAX) {
                T m;
                window_max<S, T>(p, xp, oh, ow, &m);
                out[i] = wf_cu_st<S>(m);
                continue;
            }
            int64_t h0, h1, w0, w1;
            span(oh, p.g.sh, p.g.pt, p.g.KH, p.g.H, &h0, &h1);
            span(ow, p.g.sw, p.g.pl, p.g.KW, p.g.W, &w0, &w1);
            double div = p.g.incl ? (double)(p.g.KH * p.g.KW) : (double)((h1 - h0) * (w1 - w0));
            double s = 0;
            for (int64_t ih = h0; ih < h1; ih++)
                for (int64_t iw = w0; iw < w1; iw++)
                    s += (double)wf_cu_ld<T>(xp[ih * p.xst[2] + iw * p.xst[3]]);
            out[i] = wf_cu_st<S>((T)(s / div));
            continue;
        }
        /* the windows (oh, ow) that cover input (ih, iw), in window order */
        int64_t ih = e / p.g.W, iw = e % p.g.W;
        int64_t oh0 = ih + p.g.pt - p.g.KH + 1, ow0 = iw + p.g.pl - p.g.KW + 1;
        oh0 = oh0 <= 0 ? 0 : (oh0 + p.g.sh - 1) / p.g.sh;
        ow0 = ow0 <= 0 ? 0 : (ow0 + p.g.sw - 1) / p.g.sw;
        int64_t oh1 = (ih + p.g.pt) / p.g.sh, ow1 = (iw + p.g.pl) / p.g.sw;
        if (oh1 > p.g.OH - 1)
            oh1 = p.g.OH - 1;
        if (ow1 > p.g.OW - 1)
            ow1 = p.g.OW - 1;
        T acc = 0;
        for (int64_t oh = oh0; oh <= oh1; oh++)
            for (int64_t ow = ow0; ow <= ow1; ow++) {
                T g = wf_cu_ld<T>(dp[oh * p.dst[2] + ow * p.dst[3]]);
                if (p.kind == PL_MAX_BWD) {
                    T m;
                    if (window_max<S, T>(p, xp, oh, ow, &m) == e)
                        acc += g;
                    continue;
                }
                int64_t h0, h1, w0, w1;
                span(oh, p.g.sh, p.g.pt, p.g.KH, p.g.H, &h0, &h1);
                span(ow, p.g.sw, p.g.pl, p.g.KW, p.g.W, &w0, &w1);
                double div = p.g.incl ? (double)(p.g.KH * p.g.KW) : (double)((h1 - h0) * (w1 - w0));
                acc += (T)((double)g / div);
            }
        out[i] = wf_cu_st<S>(acc);
    }
}

/* 'x' is the pool's input (NULL for avg backward, where out gives x's shape); 'dy' the
 * gradient of its output (backward ops only). The CPU twin's checks. */
static int run(const wf_kernel_ctx *ctx, int kind, const wf_pool_params *prm, const wf_tensor *x,
               const wf_tensor *dy, wf_tensor *out)
{
    const char *op = pl_names[kind];
    pl_plan p;
    p.kind = kind;
    wf_dtype dt;
    int rc = wf__ops_pool_check(op, kind == PL_MAX_BWD || kind == PL_AVG_BWD, kind == PL_AVG_BWD,
                                prm, x, dy, out, &p.g, &dt);
    if (rc < 0)
        return rc;
    const wf__cuda_queue *q;
    if ((rc = wf__cuda_enter(ctx, op, &q)) < 0 || out->numel == 0)
        return rc;
    for (int d = 0; d < 4; d++) {
        p.xst[d] = x ? x->strides[d] : 0;
        p.dst[d] = dy ? dy->strides[d] : 0;
    }
    unsigned blocks = wf__cuda_blocks(out->numel, WF_CU_THREADS);
    WF_CU_FLOAT_SWITCH(
        dt,
        (pool_k<S><<<blocks, WF_CU_THREADS, 0, q->stream>>>(
            p, x ? (const S *)x->data : NULL, dy ? (const S *)dy->data : NULL, (S *)out->data)),
        break)
    WF_CU_LAUNCHED(op);
    return 0;
}

int wf__max_pool2d_cuda(const wf_kernel_ctx *ctx, const wf_pool_params *p, const wf_tensor *x,
                        wf_tensor *out)
{
    return run(ctx, PL_MAX, p, x, NULL, out);
}

int wf__avg_pool2d_cuda(const wf_kernel_ctx *ctx, const wf_pool_params *p, const wf_tensor *x,
                        wf_tensor *out)
{
    return run(ctx, PL_AVG, p, x, NULL, out);
}

int wf__max_pool2d_backward_cuda(const wf_kernel_ctx *ctx, const wf_pool_params *p,
                                 const wf_tensor *x, const wf_tensor *dy, wf_tensor *out)
{
    return run(ctx, PL_MAX_BWD, p, x, dy, out);
}

int wf__avg_pool2d_backward_cuda(const wf_kernel_ctx *ctx, const wf_pool_params *p,
                                 const wf_tensor *dy, wf_tensor *out)
{
    return run(ctx, PL_AVG_BWD, p, NULL, dy, out);
}

/* ---- The op defs' CUDA slots (pool.c's kernels; 'keepdims' holds count_include_pad) ----- */

int wf__cuda_kernel_max_pool2d(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                               wf_tensor **out)
{
    wf_pool_params p = wf__ops_pool_params(n);
    return wf__max_pool2d_cuda(ctx, &p, in[0], *out);
}

int wf__cuda_kernel_avg_pool2d(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                               wf_tensor **out)
{
    wf_pool_params p = wf__ops_pool_params(n);
    return wf__avg_pool2d_cuda(ctx, &p, in[0], *out);
}

int wf__cuda_kernel_max_pool2d_backward(const wf_kernel_ctx *ctx, const wf_node *n,
                                        wf_tensor *const *in, wf_tensor **out)
{
    wf_pool_params p = wf__ops_pool_params(n);
    return wf__max_pool2d_backward_cuda(ctx, &p, in[0], in[1], *out);
}

int wf__cuda_kernel_avg_pool2d_backward(const wf_kernel_ctx *ctx, const wf_node *n,
                                        wf_tensor *const *in, wf_tensor **out)
{
    wf_pool_params p = wf__ops_pool_params(n);
    return wf__avg_pool2d_backward_cuda(ctx, &p, in[0], *out);
}
