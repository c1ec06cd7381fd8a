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
    bool incl;
    int64_t N, C, H, W, OH, OW, KH, KW, sh, sw, pt, pl;
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
    span(oh, p.sh, p.pt, p.KH, p.H, &h0, &h1);
    span(ow, p.sw, p.pl, p.KW, p.W, &w0, &w1);
    T m = wf_cu_ld<T>(x[h0 * p.xst[2] + w0 * p.xst[3]]);
    int64_t at = h0 * p.W + w0;
    for (int64_t ih = h0; ih < h1 && m == m; ih++)
        for (int64_t iw = ih == h0 ? w0 + 1 : w0; iw < w1; iw++) {
            T v = wf_cu_ld<T>(x[ih * p.xst[2] + iw * p.xst[3]]);
            if (v > m || v != v) {
                m = v;
                at = ih * p.W + iw;
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
    int64_t per = bwd ? p.H * p.W : p.OH * p.OW, n = p.N * p.C * per;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t plane = i / per, e = i % per, b = plane / p.C, c = plane % p.C;
        const S *xp = x ? x + b * p.xst[0] + c * p.xst[1] : NULL;
        const S *dp = dy ? dy + b * p.dst[0] + c * p.dst[1] : NULL;
        if (!bwd) {
            int64_t oh = e / p.OW, ow = e % p.OW;
            if (p.kind == PL_MAX) {
                T m;
                window_max<S, T>(p, xp, oh, ow, &m);
                out[i] = wf_cu_st<S>(m);
                continue;
            }
            int64_t h0, h1, w0, w1;
            span(oh, p.sh, p.pt, p.KH, p.H, &h0, &h1);
            span(ow, p.sw, p.pl, p.KW, p.W, &w0, &w1);
            double div = p.incl ? (double)(p.KH * p.KW) : (double)((h1 - h0) * (w1 - w0));
            double s = 0;
            for (int64_t ih = h0; ih < h1; ih++)
                for (int64_t iw = w0; iw < w1; iw++)
                    s += (double)wf_cu_ld<T>(xp[ih * p.xst[2] + iw * p.xst[3]]);
            out[i] = wf_cu_st<S>((T)(s / div));
            continue;
        }
        /* the windows (oh, ow) that cover input (ih, iw), in window order */
        int64_t ih = e / p.W, iw = e % p.W;
        int64_t oh0 = ih + p.pt - p.KH + 1, ow0 = iw + p.pl - p.KW + 1;
        oh0 = oh0 <= 0 ? 0 : (oh0 + p.sh - 1) / p.sh;
        ow0 = ow0 <= 0 ? 0 : (ow0 + p.sw - 1) / p.sw;
        int64_t oh1 = (ih + p.pt) / p.sh, ow1 = (iw + p.pl) / p.sw;
        if (oh1 > p.OH - 1)
            oh1 = p.OH - 1;
        if (ow1 > p.OW - 1)
            ow1 = p.OW - 1;
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
                span(oh, p.sh, p.pt, p.KH, p.H, &h0, &h1);
                span(ow, p.sw, p.pl, p.KW, p.W, &w0, &w1);
                double div = p.incl ? (double)(p.KH * p.KW) : (double)((h1 - h0) * (w1 - w0));
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
    bool bwd = kind == PL_MAX_BWD || kind == PL_AVG_BWD;
    char s1[160], s2[160], s3[160];
    if (!prm || !out || (kind != PL_AVG_BWD && !x) || (bwd && !dy))
        return wf__err(WF_EINVAL, "%s: %s is NULL", op,
                       !prm                         ? "params"
                       : !out                       ? "out"
                       : (kind != PL_AVG_BWD && !x) ? "x"
                                                    : "dy");
    const wf_tensor *first = x ? x : dy;
    wf_dtype dt = first->dtype;
    if (x && dy && x->dtype != dy->dtype)
        return wf__err(WF_EDTYPE, "%s: x is %s %s but dy is %s %s", op, wf_dtype_name(x->dtype),
                       wf_shape_str(x->shape, s1, sizeof s1), wf_dtype_name(dy->dtype),
                       wf_shape_str(dy->shape, s2, sizeof s2));
    if (!wf_dtype_is_float(dt))
        return wf__err(WF_EDTYPE, "%s: %s is %s %s; %s takes f32, f64, bf16 or f16", op,
                       x ? "x" : "dy", wf_dtype_name(dt), wf_shape_str(first->shape, s1, sizeof s1),
                       op);
    wf_shape xs = kind == PL_AVG_BWD ? out->shape : x->shape;
    const int32_t *wn = prm->window, *st = prm->stride, *pd = prm->padding;
    pl_plan p;
    p.kind = kind;
    p.incl = prm->count_include_pad;
    p.KH = wn[0];
    p.KW = wn[1];
    p.sh = st[0] ? st[0] : wn[0];
    p.sw = st[1] ? st[1] : wn[1];
    p.pt = pd[0];
    p.pl = pd[2];
    bool bad = p.KH < 1 || p.KW < 1 || p.sh < 1 || p.sw < 1;
    for (int i = 0; i < 4; i++)
        bad = bad || pd[i] < 0 || pd[i] >= wn[i / 2];
    if (bad)
        return wf__err(WF_EINVAL,
                       "%s: x is %s: window [%d, %d], stride [%d, %d] and padding [%d, %d, %d, "
                       "%d]: the window must be positive, the stride not negative, each padding "
                       "in [0, window)",
                       op, wf_shape_str(xs, s1, sizeof s1), wn[0], wn[1], st[0], st[1], pd[0],
                       pd[1], pd[2], pd[3]);
    if (xs.rank != 4)
        return wf__err(WF_ESHAPE, "%s: x is %s; it must have rank 4 (NCHW)", op,
                       wf_shape_str(xs, s1, sizeof s1));
    p.N = xs.dims[0];
    p.C = xs.dims[1];
    p.H = xs.dims[2];
    p.W = xs.dims[3];
    int64_t ph = p.H + pd[0] + pd[1], pw = p.W + pd[2] + pd[3];
    if (p.KH > ph || p.KW > pw)
        return wf__err(WF_ESHAPE,
                       "%s: x is %s: the window %lld x %lld is larger than the padded "
                       "input %lld x %lld",
                       op, wf_shape_str(xs, s1, sizeof s1), (long long)p.KH, (long long)p.KW,
                       (long long)ph, (long long)pw);
    p.OH = (ph - p.KH) / p.sh + 1;
    p.OW = (pw - p.KW) / p.sw + 1;
    wf_shape ys;
    ys.rank = 4;
    ys.dims[0] = p.N;
    ys.dims[1] = p.C;
    ys.dims[2] = p.OH;
    ys.dims[3] = p.OW;
    int rc = wf__kernel_check_out(op, out, dt, bwd ? xs : ys);
    if (rc < 0)
        return rc;
    if (bwd && !wf_shape_equal(dy->shape, ys))
        return wf__err(WF_ESHAPE, "%s: dy is %s but pooling x %s gives %s", op,
                       wf_shape_str(dy->shape, s1, sizeof s1), wf_shape_str(xs, s2, sizeof s2),
                       wf_shape_str(ys, s3, sizeof s3));
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

static wf_pool_params params(const wf_node *n)
{
    const wf_attrs *a = n->attrs;
    wf_pool_params p;
    memcpy(p.window, a->window, sizeof p.window);
    memcpy(p.stride, a->stride, sizeof p.stride);
    memcpy(p.padding, a->padding, sizeof p.padding);
    p.count_include_pad = a->keepdims;
    return p;
}

int wf__cuda_kernel_max_pool2d(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                               wf_tensor **out)
{
    wf_pool_params p = params(n);
    return wf__max_pool2d_cuda(ctx, &p, in[0], *out);
}

int wf__cuda_kernel_avg_pool2d(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                               wf_tensor **out)
{
    wf_pool_params p = params(n);
    return wf__avg_pool2d_cuda(ctx, &p, in[0], *out);
}

int wf__cuda_kernel_max_pool2d_backward(const wf_kernel_ctx *ctx, const wf_node *n,
                                        wf_tensor *const *in, wf_tensor **out)
{
    wf_pool_params p = params(n);
    return wf__max_pool2d_backward_cuda(ctx, &p, in[0], in[1], *out);
}

int wf__cuda_kernel_avg_pool2d_backward(const wf_kernel_ctx *ctx, const wf_node *n,
                                        wf_tensor *const *in, wf_tensor **out)
{
    wf_pool_params p = params(n);
    return wf__avg_pool2d_backward_cuda(ctx, &p, in[0], *out);
}
