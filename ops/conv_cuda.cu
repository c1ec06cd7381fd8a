/* ops/conv_cuda.cu: CUDA twin of ops/conv_cpu.c: conv2d (NCHW; stride, padding, dilation,
 * groups) and its two backward ops through cuDNN's legacy convolution API (kept in cuDNN 9);
 * and the kernel slots of those ops.
 * Owns: the descriptors of one call (tensors NCHW fully packed, the filter, the convolution
 *   with its group count and math type), the choice of algorithm (cuDNN's heuristics, first
 *   deterministic one whose workspace can be had; f32 and f64 restricted to FMA kernels, so
 *   no TF32; bf16 and f16 may use tensor cores, f32 accumulation), and asymmetric padding,
 *   which cuDNN lacks: x is copied into a zero-padded buffer and the convolution runs
 *   unpadded (backward input computes the padded gradient and crops it).
 * Strided inputs are packed into contiguous temporaries first (cuDNN takes no negative
 *   strides). Results agree with the CPU twin's im2col + GEMM to the rounding of a different
 *   summation order.
 * Not here: the op definitions (conv.c), pooling (pool_cuda.cu). */
#include "cuda_common.h"

#include <limits.h>

enum { CV_FWD, CV_BWD_INPUT, CV_BWD_FILTER };

static const char *const cv_names[] = { "conv2d", "conv2d_backward_input",
                                        "conv2d_backward_filter" };

struct cv_geom {
    int64_t N, C, H, W, O, KH, KW, OH, OW, G, sh, sw, dh, dw;
    int64_t pad[4];
};

/* The CPU twin's geometry and checks. */
static int geom(const char *op, const wf_conv_params *p, wf_shape xs, wf_shape ws, cv_geom *g)
{
    char s1[160], s2[160];
    if (!p)
        return wf__err(WF_EINVAL, "%s: params is NULL", op);
    g->sh = p->stride[0] ? p->stride[0] : 1;
    g->sw = p->stride[1] ? p->stride[1] : 1;
    g->dh = p->dilation[0] ? p->dilation[0] : 1;
    g->dw = p->dilation[1] ? p->dilation[1] : 1;
    g->G = p->groups ? p->groups : 1;
    bool bad = g->sh < 1 || g->sw < 1 || g->dh < 1 || g->dw < 1 || g->G < 1;
    for (int i = 0; i < 4; i++) {
        g->pad[i] = p->padding[i];
        bad = bad || p->padding[i] < 0;
    }
    if (bad)
        return wf__err(WF_EINVAL,
                       "%s: x is %s and w is %s: stride [%d, %d], dilation [%d, %d], groups %d "
                       "and padding [%d, %d, %d, %d] must not be negative",
                       op, wf_shape_str(xs, s1, sizeof s1), wf_shape_str(ws, s2, sizeof s2),
                       p->stride[0], p->stride[1], p->dilation[0], p->dilation[1], p->groups,
                       p->padding[0], p->padding[1], p->padding[2], p->padding[3]);
    if (xs.rank != 4 || ws.rank != 4)
        return wf__err(WF_ESHAPE, "%s: x is %s and w is %s; both must have rank 4", op,
                       wf_shape_str(xs, s1, sizeof s1), wf_shape_str(ws, s2, sizeof s2));
    g->N = xs.dims[0];
    g->C = xs.dims[1];
    g->H = xs.dims[2];
    g->W = xs.dims[3];
    g->O = ws.dims[0];
    g->KH = ws.dims[2];
    g->KW = ws.dims[3];
    if (g->O % g->G != 0 || g->C % g->G != 0 || g->C != ws.dims[1] * g->G)
        return wf__err(WF_ESHAPE,
                       "%s: x is %s but w is %s: x has %lld channels, w expects %lld x groups "
                       "%lld (groups must divide both channel counts)",
                       op, wf_shape_str(xs, s1, sizeof s1), wf_shape_str(ws, s2, sizeof s2),
                       (long long)g->C, (long long)ws.dims[1], (long long)g->G);
    int64_t span_h = g->dh * (g->KH - 1) + 1, span_w = g->dw * (g->KW - 1) + 1;
    int64_t ph = g->H + g->pad[0] + g->pad[1], pw = g->W + g->pad[2] + g->pad[3];
    if (span_h > ph || span_w > pw)
        return wf__err(WF_ESHAPE,
                       "%s: x is %s but w is %s: the dilated kernel %lld x %lld is larger than "
                       "the padded input %lld x %lld",
                       op, wf_shape_str(xs, s1, sizeof s1), wf_shape_str(ws, s2, sizeof s2),
                       (long long)span_h, (long long)span_w, (long long)ph, (long long)pw);
    g->OH = (ph - span_h) / g->sh + 1;
    g->OW = (pw - span_w) / g->sw + 1;
    const int64_t dims[] = { g->N, g->C, ph, pw, g->O, g->KH, g->KW, g->OH, g->OW };
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
        if (dims[i] > INT_MAX)
            return wf__err(WF_EINVAL, "%s: x is %s and w is %s: a dimension exceeds cuDNN's int",
                           op, wf_shape_str(xs, s1, sizeof s1), wf_shape_str(ws, s2, sizeof s2));
    return 0;
}

/* One call's cuDNN descriptors and temporaries, released together. */
struct cv_call {
    cudaStream_t s = NULL;
    cudnnTensorDescriptor_t xd = NULL, yd = NULL;
    cudnnFilterDescriptor_t wd = NULL;
    cudnnConvolutionDescriptor_t cd = NULL;
    void *tmp[4] = { NULL, NULL, NULL, NULL }; /* packed a, packed b, padded x or dx, workspace */

    ~cv_call()
    {
        if (cd)
            cudnnDestroyConvolutionDescriptor(cd);
        if (wd)
            cudnnDestroyFilterDescriptor(wd);
        if (yd)
            cudnnDestroyTensorDescriptor(yd);
        if (xd)
            cudnnDestroyTensorDescriptor(xd);
        for (int i = 0; i < 4; i++)
            wf__cuda_tmp_free(s, tmp[i]);
    }
};

/* t's data, packed into call temporary 'slot' when t is not contiguous. */
static int packed(cv_call &c, const char *op, const wf_tensor *t, int slot, const void **data)
{
    *data = t->data;
    if (t->contiguous)
        return 0;
    int rc = wf__cuda_tmp(c.s, (size_t)t->numel * wf_dtype_size(t->dtype), op, &c.tmp[slot]);
    if (rc == 0)
        rc = wf__cuda_pack(c.s, t, c.tmp[slot], op);
    *data = c.tmp[slot];
    return rc;
}

/* Picks the first usable algorithm among cuDNN's ranked results 'res[0 .. n)' whose
 * workspace can be had, preferring, in this order: deterministic and of the wanted math
 * (FMA only for f32/f64: no TF32), the wanted math, deterministic, any that succeeded. Sets
 * the convolution's math type to the algorithm's and gives its workspace. */
template <class R>
static int pick(cv_call &c, const char *op, const R *res, int n, bool fma_only, int *algo,
                size_t *ws_bytes)
{
    for (int pass = 0; pass < 4; pass++)
        for (int i = 0; i < n; i++) {
            bool det = res[i].determinism == CUDNN_DETERMINISTIC;
            bool math = !fma_only || res[i].mathType == CUDNN_FMA_MATH;
            if (res[i].status != CUDNN_STATUS_SUCCESS || (pass == 0 && !(det && math)) ||
                (pass == 1 && !math) || (pass == 2 && !det))
                continue;
            void *ws = NULL;
            if (res[i].memory > 0 && wf__cuda_tmp(c.s, res[i].memory, op, &ws) < 0) {
                (void)cudaGetLastError(); /* not sticky: clear it for the launches after */
                continue;                 /* too large now: the next algorithm */
            }
            cudnnStatus_t st = cudnnSetConvolutionMathType(c.cd, res[i].mathType);
            if (st != CUDNN_STATUS_SUCCESS) {
                wf__cuda_tmp_free(c.s, ws);
                return wf__cudnn_fail(st, op, "cudnnSetConvolutionMathType");
            }
            c.tmp[3] = ws;
            *algo = (int)res[i].algo;
            *ws_bytes = res[i].memory;
            return 0;
        }
    return wf__err(WF_EDEVICE, "%s: cuDNN offers no usable algorithm among %d", op, n);
}

static int entry(const wf_kernel_ctx *ctx, int kind, const wf_conv_params *p, const wf_tensor *a,
                 const wf_tensor *b, wf_tensor *out)
{
    const char *op = cv_names[kind];
    const char *an = kind == CV_BWD_INPUT ? "dy" : "x", *bn = kind == CV_BWD_FILTER ? "dy" : "w";
    char s1[160], s2[160], s3[160], s4[160];
    if (!a || !b || !out)
        return wf__err(WF_EINVAL, "%s: %s is NULL", op, !a ? an : !b ? bn : "out");
    if (a->dtype != b->dtype)
        return wf__err(WF_EDTYPE, "%s: %s is %s %s but %s is %s %s", op, an,
                       wf_dtype_name(a->dtype), wf_shape_str(a->shape, s1, sizeof s1), bn,
                       wf_dtype_name(b->dtype), wf_shape_str(b->shape, s2, sizeof s2));
    wf_dtype dt = a->dtype;
    if (!wf_dtype_is_float(dt))
        return wf__err(WF_EDTYPE, "%s: %s and %s are %s; %s takes f32, f64, bf16 or f16", op, an,
                       bn, wf_dtype_name(dt), op);
    wf_shape xs = kind == CV_FWD || kind == CV_BWD_FILTER ? a->shape : out->shape;
    wf_shape ws = kind == CV_BWD_FILTER ? out->shape : b->shape;
    cv_geom g = cv_geom(); /* zeroed: gcc cannot see geom() fill it on success */
    int rc = geom(op, p, xs, ws, &g);
    if (rc < 0)
        return rc;
    wf_shape ys;
    ys.rank = 4;
    ys.dims[0] = g.N;
    ys.dims[1] = g.O;
    ys.dims[2] = g.OH;
    ys.dims[3] = g.OW;
    rc = wf__kernel_check_out(op, out, dt, kind == CV_FWD ? ys : kind == CV_BWD_INPUT ? xs : ws);
    if (rc < 0)
        return rc;
    if (kind != CV_FWD) {
        const wf_tensor *dy = kind == CV_BWD_INPUT ? a : b;
        if (!wf_shape_equal(dy->shape, ys))
            return wf__err(WF_ESHAPE, "%s: dy is %s but conv2d of x %s with w %s gives %s", op,
                           wf_shape_str(dy->shape, s1, sizeof s1), wf_shape_str(xs, s2, sizeof s2),
                           wf_shape_str(ws, s3, sizeof s3), wf_shape_str(ys, s4, sizeof s4));
    }
    const wf__cuda_queue *q;
    if ((rc = wf__cuda_enter(ctx, op, &q)) < 0 || out->numel == 0)
        return rc;
    if (!q->cudnn)
        return wf__err(WF_EDEVICE, "%s: the device has no cuDNN handle", op);
    cv_call c;
    c.s = q->stream;
    size_t es = wf_dtype_size(dt);
    /* cuDNN pads symmetrically: asymmetric padding goes through a padded x (or dx). */
    bool sym = g.pad[0] == g.pad[1] && g.pad[2] == g.pad[3];
    int64_t Hp = sym ? g.H : g.H + g.pad[0] + g.pad[1], Wp = sym ? g.W : g.W + g.pad[2] + g.pad[3];
    int pad_h = sym ? (int)g.pad[0] : 0, pad_w = sym ? (int)g.pad[2] : 0;
    const void *ad, *bd;
    if ((rc = packed(c, op, a, 0, &ad)) < 0 || (rc = packed(c, op, b, 1, &bd)) < 0)
        return rc;
    const void *xdata = kind == CV_BWD_INPUT ? NULL : ad;
    void *xpad = NULL; /* padded x (forward, filter) or padded dx (input) */
    int64_t pst[4] = { g.C * Hp * Wp, Hp * Wp, Wp, 1 },
            xst[4] = { g.C * g.H * g.W, g.H * g.W, g.W, 1 };
    int64_t xdims[4] = { g.N, g.C, g.H, g.W };
    char *interior = NULL;
    if (!sym) {
        size_t bytes = (size_t)(g.N * g.C * Hp * Wp) * es;
        if ((rc = wf__cuda_tmp(c.s, bytes, op, &xpad)) < 0)
            return rc;
        c.tmp[2] = xpad;
        interior = (char *)xpad + (g.pad[0] * Wp + g.pad[2]) * (int64_t)es;
        if (kind != CV_BWD_INPUT) {
            WF_CU_TRY(cudaMemsetAsync(xpad, 0, bytes, c.s), op, "zeroing the padded x");
            rc = wf__cuda_copy_nd(c.s, op, dt, 4, xdims, interior, pst, (const char *)xdata, xst);
            if (rc < 0)
                return rc;
            xdata = xpad;
        }
    }
    wf__cuda_types types = wf__cuda_types_of(dt); /* no TF32: f32 stays f32, as the CPU's */
    cudnnDataType_t dtype = types.dnn, compute = types.dnn_compute;
    cudnnMathType_t math = types.dnn_math;
    WF_CUDNN_TRY(cudnnCreateTensorDescriptor(&c.xd), op, "cudnnCreateTensorDescriptor");
    WF_CUDNN_TRY(cudnnCreateTensorDescriptor(&c.yd), op, "cudnnCreateTensorDescriptor");
    WF_CUDNN_TRY(cudnnCreateFilterDescriptor(&c.wd), op, "cudnnCreateFilterDescriptor");
    WF_CUDNN_TRY(cudnnCreateConvolutionDescriptor(&c.cd), op, "cudnnCreateConvolutionDescriptor");
    WF_CUDNN_TRY(cudnnSetTensor4dDescriptor(c.xd, CUDNN_TENSOR_NCHW, dtype, (int)g.N, (int)g.C,
                                            (int)Hp, (int)Wp),
                 op, "the x descriptor");
    WF_CUDNN_TRY(cudnnSetTensor4dDescriptor(c.yd, CUDNN_TENSOR_NCHW, dtype, (int)g.N, (int)g.O,
                                            (int)g.OH, (int)g.OW),
                 op, "the y descriptor");
    WF_CUDNN_TRY(cudnnSetFilter4dDescriptor(c.wd, dtype, CUDNN_TENSOR_NCHW, (int)g.O,
                                            (int)(g.C / g.G), (int)g.KH, (int)g.KW),
                 op, "the filter descriptor");
    WF_CUDNN_TRY(cudnnSetConvolution2dDescriptor(c.cd, pad_h, pad_w, (int)g.sh, (int)g.sw,
                                                 (int)g.dh, (int)g.dw, CUDNN_CROSS_CORRELATION,
                                                 compute),
                 op, "the convolution descriptor");
    WF_CUDNN_TRY(cudnnSetConvolutionGroupCount(c.cd, (int)g.G), op,
                 "cudnnSetConvolutionGroupCount");
    WF_CUDNN_TRY(cudnnSetConvolutionMathType(c.cd, math), op, "cudnnSetConvolutionMathType");
    bool fma_only = math == CUDNN_FMA_MATH;
    const double one64 = 1, zero64 = 0;
    const float one32 = 1, zero32 = 0;
    const void *alpha = dt == WF_F64 ? (const void *)&one64 : (const void *)&one32;
    const void *beta = dt == WF_F64 ? (const void *)&zero64 : (const void *)&zero32;
    int algo = 0, n = 0;
    size_t wsb = 0;
    cudnnHandle_t h = q->cudnn;

    enum { MAX_ALGOS = 16 };

    if (kind == CV_FWD) {
        cudnnConvolutionFwdAlgoPerf_t res[MAX_ALGOS];
        WF_CUDNN_TRY(
            cudnnGetConvolutionForwardAlgorithm_v7(h, c.xd, c.wd, c.cd, c.yd, MAX_ALGOS, &n, res),
            op, "cudnnGetConvolutionForwardAlgorithm_v7");
        if ((rc = pick(c, op, res, n, fma_only, &algo, &wsb)) < 0)
            return rc;
        WF_CUDNN_TRY(cudnnConvolutionForward(h, alpha, c.xd, xdata, c.wd, bd, c.cd,
                                             (cudnnConvolutionFwdAlgo_t)algo, c.tmp[3], wsb, beta,
                                             c.yd, out->data),
                     op, "cudnnConvolutionForward");
        return 0;
    }
    if (kind == CV_BWD_FILTER) {
        cudnnConvolutionBwdFilterAlgoPerf_t res[MAX_ALGOS];
        WF_CUDNN_TRY(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, c.xd, c.yd, c.cd, c.wd,
                                                                   MAX_ALGOS, &n, res),
                     op, "cudnnGetConvolutionBackwardFilterAlgorithm_v7");
        if ((rc = pick(c, op, res, n, fma_only, &algo, &wsb)) < 0)
            return rc;
        WF_CUDNN_TRY(cudnnConvolutionBackwardFilter(h, alpha, c.xd, xdata, c.yd, bd, c.cd,
                                                    (cudnnConvolutionBwdFilterAlgo_t)algo, c.tmp[3],
                                                    wsb, beta, c.wd, out->data),
                     op, "cudnnConvolutionBackwardFilter");
        return 0;
    }
    cudnnConvolutionBwdDataAlgoPerf_t res[MAX_ALGOS];
    WF_CUDNN_TRY(
        cudnnGetConvolutionBackwardDataAlgorithm_v7(h, c.wd, c.yd, c.cd, c.xd, MAX_ALGOS, &n, res),
        op, "cudnnGetConvolutionBackwardDataAlgorithm_v7");
    if ((rc = pick(c, op, res, n, fma_only, &algo, &wsb)) < 0)
        return rc;
    void *dx = sym ? out->data : xpad;
    WF_CUDNN_TRY(cudnnConvolutionBackwardData(h, alpha, c.wd, bd, c.yd, ad, c.cd,
                                              (cudnnConvolutionBwdDataAlgo_t)algo, c.tmp[3], wsb,
                                              beta, c.xd, dx),
                 op, "cudnnConvolutionBackwardData");
    if (sym)
        return 0;
    /* crop the padded gradient's interior into out */
    return wf__cuda_copy_nd(c.s, op, dt, 4, xdims, out->data, xst, interior, pst);
}

int wf__conv2d_cuda(const wf_kernel_ctx *ctx, const wf_conv_params *p, const wf_tensor *x,
                    const wf_tensor *w, wf_tensor *out)
{
    return entry(ctx, CV_FWD, p, x, w, out);
}

int wf__conv2d_backward_input_cuda(const wf_kernel_ctx *ctx, const wf_conv_params *p,
                                   const wf_tensor *dy, const wf_tensor *w, wf_tensor *out)
{
    return entry(ctx, CV_BWD_INPUT, p, dy, w, out);
}

int wf__conv2d_backward_filter_cuda(const wf_kernel_ctx *ctx, const wf_conv_params *p,
                                    const wf_tensor *x, const wf_tensor *dy, wf_tensor *out)
{
    return entry(ctx, CV_BWD_FILTER, p, x, dy, out);
}

/* ---- The op defs' CUDA slots (conv.c's kernels) ------------------------------------------ */

int wf__cuda_kernel_conv2d(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                           wf_tensor **out)
{
    wf_conv_params p = wf__ops_conv_params(n);
    return wf__conv2d_cuda(ctx, &p, in[0], in[1], *out);
}

int wf__cuda_kernel_conv2d_backward_input(const wf_kernel_ctx *ctx, const wf_node *n,
                                          wf_tensor *const *in, wf_tensor **out)
{
    wf_conv_params p = wf__ops_conv_params(n);
    return wf__conv2d_backward_input_cuda(ctx, &p, in[0], in[1], *out);
}

int wf__cuda_kernel_conv2d_backward_filter(const wf_kernel_ctx *ctx, const wf_node *n,
                                           wf_tensor *const *in, wf_tensor **out)
{
    wf_conv_params p = wf__ops_conv_params(n);
    return wf__conv2d_backward_filter_cuda(ctx, &p, in[0], in[1], *out);
}
