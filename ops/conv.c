/* ops/conv.c: the 2-D convolution (NCHW) and its two backward ops: constructors, dtype and
 * shape inference, costs and op-table entries.
 * Owns: wf_op_conv2d, wf_op_conv2d_backward_input, wf_op_conv2d_backward_filter (ops/table.h)
 *   and the conv2d constructors of weft/nn.h's "Convolution and pooling" section.
 * Attributes (core/graph.h's wf_attrs): stride[2], padding[4], dilation[2], groups; the
 *   backward ops also 'shape': x_shape (backward_input) or w_shape (backward_filter).
 * Invariants: the constructors store stride, dilation and groups of 0 as 1 (equal
 *   convolutions share one attribute bag) and keep negative values for inference to name;
 *   every check of arguments is in inference, so each message gets the node's prefix with
 *   its file:line; each constructor calls wf__node_add() once (one pending location).
 *   Inference accepts exactly what the kernels (conv_cpu.c) accept once -1 dimensions are
 *   known.
 * Not here: im2col, GEMM and col2im (conv_cpu.c), the gradient functions (grad/), pools
 *   (pool.c). */
#include "../core/tensor.h"
#include "internal.h"
#include "layout.h"

#include <stdio.h>
#include <string.h>

#define SH(s, buf) wf_shape_str((s), (buf), sizeof(buf))

/* The output size along one axis: -1 when the input or kernel size is unknown, 0 when the
 * dilated kernel does not fit the padded input. */
/* The extent of a kernel of 'k' (>= 0) taps 'dil' apart; past WF__MAX_NUMEL (larger than
 * any input) it is WF__MAX_NUMEL + 1, so that dilation times kernel never overflows. */
static int64_t kernel_span(int dil, int64_t k)
{
    int64_t span;
    if (k == 0)
        return 1 - (int64_t)dil; /* as dil * (k - 1) + 1 */
    return wf__dims_mul(dil, k - 1, &span) ? span + 1 : WF__MAX_NUMEL + 1;
}

static int64_t out_dim(int64_t in, int64_t k, int pad0, int pad1, int stride, int dil)
{
    if (in < 0 || k < 0)
        return -1;
    int64_t span = kernel_span(dil, k), padded = in + pad0 + pad1; /* in <= 2^59 */
    return span > padded ? 0 : (padded - span) / stride + 1;
}

/* Checks the attributes of 'n' and the shapes x [N, C, H, W] and w [O, C/groups, KH, KW]
 * (named 'xn' and 'wn' in messages) and gives conv2d's output shape. */
static int conv_shape(const wf_node *n, const char *xn, wf_shape xs, const char *wn, wf_shape ws,
                      wf_shape *ys, char *err, size_t errlen)
{
    const wf_attrs *a = n->attrs;
    char s1[160], s2[160];
    SH(xs, s1);
    SH(ws, s2);
    if (a->stride[0] < 1 || a->stride[1] < 1 || a->dilation[0] < 1 || a->dilation[1] < 1 ||
        a->groups < 1) {
        snprintf(err, errlen,
                 "%s is %s and %s is %s: stride [%d, %d], dilation [%d, %d] and groups %d must be "
                 "positive (0 means 1)",
                 xn, s1, wn, s2, a->stride[0], a->stride[1], a->dilation[0], a->dilation[1],
                 a->groups);
        return WF_EINVAL;
    }
    for (int i = 0; i < 4; i++)
        if (a->padding[i] < 0) {
            snprintf(err, errlen,
                     "%s is %s and %s is %s: padding [%d, %d, %d, %d] (top, bottom, left, right) "
                     "must not be negative",
                     xn, s1, wn, s2, a->padding[0], a->padding[1], a->padding[2], a->padding[3]);
            return WF_EINVAL;
        }
    if (xs.rank != 4 || ws.rank != 4) {
        snprintf(err, errlen, "%s is %s and %s is %s; both must have rank 4 (%s)", xn, s1, wn, s2,
                 xs.rank != 4 ? "NCHW" : "O, C / groups, KH, KW");
        return WF_ESHAPE;
    }
    int64_t N = xs.dims[0], C = xs.dims[1], O = ws.dims[0], Cg = ws.dims[1], G = a->groups;
    if (O >= 0 && O % G != 0) {
        snprintf(err, errlen, "%s is %s but %s is %s: groups %lld does not divide its %lld outputs",
                 xn, s1, wn, s2, (long long)G, (long long)O);
        return WF_ESHAPE;
    }
    if (C >= 0 && C % G != 0) {
        snprintf(err, errlen,
                 "%s is %s but %s is %s: groups %lld does not divide the %lld channels of %s", xn,
                 s1, wn, s2, (long long)G, (long long)C, xn);
        return WF_ESHAPE;
    }
    if (C >= 0 && Cg >= 0 && C != Cg * G) {
        snprintf(err, errlen,
                 "%s is %s but %s is %s: %s has %lld channels, %s expects %lld x groups %lld", xn,
                 s1, wn, s2, xn, (long long)C, wn, (long long)Cg, (long long)G);
        return WF_ESHAPE;
    }
    int64_t OH =
        out_dim(xs.dims[2], ws.dims[2], a->padding[0], a->padding[1], a->stride[0], a->dilation[0]);
    int64_t OW =
        out_dim(xs.dims[3], ws.dims[3], a->padding[2], a->padding[3], a->stride[1], a->dilation[1]);
    if (OH == 0 || OW == 0) {
        int h = OH == 0, d = h ? 2 : 3;
        int64_t span = kernel_span(a->dilation[h ? 0 : 1], ws.dims[d]);
        int p0 = a->padding[h ? 0 : 2], p1 = a->padding[h ? 1 : 3];
        char sp[32];
        if (span > WF__MAX_NUMEL)
            snprintf(sp, sizeof sp, "more than " WF__MAX_NUMEL_STR);
        else
            snprintf(sp, sizeof sp, "%lld", (long long)span);
        snprintf(err, errlen,
                 "%s is %s but %s is %s: the kernel %s (%s with dilation %d) is larger than the "
                 "padded input %s %lld (%lld + %d + %d), so the output %s would be 0",
                 xn, s1, wn, s2, h ? "height" : "width", sp, a->dilation[h ? 0 : 1],
                 h ? "height" : "width", (long long)(xs.dims[d] + p0 + p1), (long long)xs.dims[d],
                 p0, p1, h ? "height" : "width");
        return WF_ESHAPE;
    }
    *ys = (wf_shape){ .rank = 4, .dims = { N, O, OH, OW } };
    return 0;
}

/* Both floating and equal dtypes; 'a' and 'b' name inputs 0 and 1. */
static int check_dtypes(const wf_node *n, const char *an, const char *bn, char *err, size_t errlen)
{
    const wf_node *a = n->inputs[0], *b = n->inputs[1];
    char s1[160], s2[160];
    if (a->dtype != b->dtype) {
        snprintf(err, errlen,
                 "%s is %s %s but %s is %s %s: the dtypes must be equal (no implicit promotion; "
                 "convert one with wf_cast)",
                 an, wf_dtype_name(a->dtype), SH(a->shape, s1), bn, wf_dtype_name(b->dtype),
                 SH(b->shape, s2));
        return WF_EDTYPE;
    }
    if (!wf_dtype_is_float(a->dtype)) {
        char what[64];
        snprintf(what, sizeof what, "%s and %s", an, bn);
        return wf__ops_bad_dtype(n, 2, what, false, err, errlen);
    }
    return 0;
}

/* dy must be 'want' (conv2d's output), -1 on either side fitting anything. */
static int check_dy(const wf_node *dy, wf_shape want, const char *xn, wf_shape xs, wf_shape ws,
                    char *err, size_t errlen)
{
    bool fits = dy->shape.rank == 4;
    for (int d = 0; fits && d < 4; d++)
        fits = wf__ops_dims_fit(dy->shape.dims[d], want.dims[d]);
    if (!fits) {
        char s1[160], s2[160], s3[160], s4[160];
        snprintf(err, errlen, "dy is %s but conv2d of %s %s with w %s gives %s", SH(dy->shape, s1),
                 xn, SH(xs, s2), SH(ws, s3), SH(want, s4));
        return WF_ESHAPE;
    }
    return 0;
}

/* ---- conv2d -------------------------------------------------------------------------------- */

static int infer_conv2d(wf_node *n, char *err, size_t errlen)
{
    int rc = check_dtypes(n, "x", "w", err, errlen);
    if (rc < 0)
        return rc;
    wf_shape ys;
    rc = conv_shape(n, "x", n->inputs[0]->shape, "w", n->inputs[1]->shape, &ys, err, errlen);
    if (rc < 0)
        return rc;
    n->dtype = n->inputs[0]->dtype;
    n->shape = ys;
    return 0;
}

wf_conv_params wf__ops_conv_params(const wf_node *n)
{
    const wf_attrs *a = n->attrs;
    wf_conv_params p;
    memcpy(p.stride, a->stride, sizeof p.stride);
    memcpy(p.padding, a->padding, sizeof p.padding);
    memcpy(p.dilation, a->dilation, sizeof p.dilation);
    p.groups = a->groups;
    return p;
}

static int kernel_conv2d(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                         wf_tensor **out)
{
    wf_kctx k = wf__ops_kctx(ctx);
    wf_conv_params p = wf__ops_conv_params(n);
    return wf__conv2d_cpu(&k, &p, in[0], in[1], *out);
}

/* 2 flops per multiply-add: N O OH OW (output elements) times C/groups KH KW (taps). Every op
 * of this file does the same products: 'taps' is w's element count over O. */
static void conv_cost(const wf_node *n, wf_shape ys, wf_shape ws, double *flops, double *bytes)
{
    double taps = 1;
    for (int d = 1; d < 4 && d < ws.rank; d++)
        taps *= ws.dims[d] >= 0 ? (double)ws.dims[d] : 1.0;
    *flops = 2.0 * wf__ops_numel(ys) * taps;
    *bytes = wf__ops_bytes(n);
}

static void cost_conv2d(const wf_node *n, double *flops, double *bytes)
{
    conv_cost(n, n->shape, n->inputs[1]->shape, flops, bytes);
}

const wf_op_def wf_op_conv2d = {
    .name = "conv2d",
    .min_inputs = 2,
    .max_inputs = 2,
    .infer = infer_conv2d,
    .kernel = { [WF_KERNEL_CPU] = kernel_conv2d, [WF_KERNEL_CUDA] = WF__CUDA_KERNEL(conv2d) },
    .cost = cost_conv2d,
    .flags = 0,
};

/* The attribute bag of a convolution: defaults made explicit (0 -> 1). */
static wf_attrs conv_attrs(const wf_conv2d_opts *o)
{
    wf_attrs a;
    memset(&a, 0, sizeof a); /* padding too: equal bags are shared (core/graph.h) */
    wf_conv2d_opts d;
    memset(&d, 0, sizeof d);
    if (!o)
        o = &d;
    for (int i = 0; i < 2; i++) {
        a.stride[i] = o->stride[i] ? o->stride[i] : 1;
        a.dilation[i] = o->dilation[i] ? o->dilation[i] : 1;
    }
    for (int i = 0; i < 4; i++)
        a.padding[i] = o->padding[i];
    a.groups = o->groups ? o->groups : 1;
    return a;
}

wf_node *(wf_conv2d)(wf_graph *g, wf_node *x, wf_node *w, const wf_conv2d_opts *opts)
{
    wf_attrs a = conv_attrs(opts);
    wf_node *in[2] = { x, w };
    return wf__node_add(g, &wf_op_conv2d, in, 2, &a);
}

/* ---- conv2d_backward_input ------------------------------------------------------------------ */

/* Inputs dy, w; attrs.shape is x_shape. */
static int infer_backward_input(wf_node *n, char *err, size_t errlen)
{
    int rc = check_dtypes(n, "dy", "w", err, errlen);
    if (rc < 0)
        return rc;
    const wf_node *dy = n->inputs[0], *w = n->inputs[1];
    const wf_attrs *a = n->attrs;
    wf_shape xs = a->shape, ws = w->shape;
    char s1[160], s2[160], s3[160];
    if (xs.rank != 4) {
        snprintf(err, errlen, "x_shape is %s (dy %s, w %s); it must have rank 4 (NCHW)", SH(xs, s1),
                 SH(dy->shape, s2), SH(ws, s3));
        return WF_ESHAPE;
    }
    for (int d = 0; d < 4; d++)
        if (xs.dims[d] < -1) {
            snprintf(err, errlen, "x_shape is %s: dimension %d is %lld", SH(xs, s1), d,
                     (long long)xs.dims[d]);
            return WF_EINVAL;
        }
    /* Unknown dimensions of x_shape from dy (batch, and H or W with stride 1) and w (C). */
    bool dy4 = dy->shape.rank == 4, w4 = ws.rank == 4;
    if (xs.dims[0] == -1 && dy4)
        xs.dims[0] = dy->shape.dims[0];
    if (xs.dims[1] == -1 && w4 && ws.dims[1] >= 0 && a->groups >= 1 &&
        !wf__dims_mul(ws.dims[1], a->groups, &xs.dims[1])) {
        snprintf(err, errlen,
                 "x_shape is %s (w %s): its channels, %lld x groups %d, would be more "
                 "than " WF__MAX_NUMEL_STR,
                 SH(a->shape, s1), SH(ws, s2), (long long)ws.dims[1], a->groups);
        return WF_ESHAPE;
    }
    for (int h = 0; h < 2; h++) {
        int d = 2 + h;
        if (a->shape.dims[d] != -1)
            continue;
        if (a->stride[h] != 1) {
            snprintf(err, errlen,
                     "x_shape is %s (dy %s, w %s): its %s is unknown and cannot be recovered from "
                     "dy with stride %d",
                     SH(a->shape, s1), SH(dy->shape, s2), SH(ws, s3), h ? "width" : "height",
                     a->stride[h]);
            return WF_EINVAL;
        }
        if (dy4 && w4 && dy->shape.dims[d] >= 0 && ws.dims[d] >= 0 && a->dilation[h] >= 1) {
            int64_t span = kernel_span(a->dilation[h], ws.dims[d]);
            int64_t v = dy->shape.dims[d] - 1 + span - a->padding[2 * h] - a->padding[2 * h + 1];
            xs.dims[d] = v >= 0 ? v : 0;
        }
    }
    wf_shape want;
    rc = conv_shape(n, "x_shape", xs, "w", ws, &want, err, errlen);
    if (rc < 0)
        return rc;
    rc = check_dy(dy, want, "x_shape", xs, ws, err, errlen);
    if (rc < 0)
        return rc;
    n->dtype = dy->dtype;
    n->shape = xs;
    return 0;
}

static int kernel_backward_input(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                                 wf_tensor **out)
{
    wf_kctx k = wf__ops_kctx(ctx);
    wf_conv_params p = wf__ops_conv_params(n);
    return wf__conv2d_backward_input_cpu(&k, &p, in[0], in[1], *out);
}

static void cost_backward_input(const wf_node *n, double *flops, double *bytes)
{
    conv_cost(n, n->inputs[0]->shape, n->inputs[1]->shape, flops, bytes);
}

const wf_op_def wf_op_conv2d_backward_input = {
    .name = "conv2d_backward_input",
    .min_inputs = 2,
    .max_inputs = 2,
    .infer = infer_backward_input,
    .kernel = { [WF_KERNEL_CPU] = kernel_backward_input,
                [WF_KERNEL_CUDA] = WF__CUDA_KERNEL(conv2d_backward_input) },
    .cost = cost_backward_input,
    .flags = 0,
};

wf_node *(wf_conv2d_backward_input)(wf_graph *g, wf_node *dy, wf_node *w, wf_shape x_shape,
                                    const wf_conv2d_opts *opts)
{
    wf_attrs a = conv_attrs(opts);
    a.shape = x_shape;
    wf_node *in[2] = { dy, w };
    return wf__node_add(g, &wf_op_conv2d_backward_input, in, 2, &a);
}

/* ---- conv2d_backward_filter ---------------------------------------------------------------- */

/* Inputs x, dy; attrs.shape is w_shape. */
static int infer_backward_filter(wf_node *n, char *err, size_t errlen)
{
    int rc = check_dtypes(n, "x", "dy", err, errlen);
    if (rc < 0)
        return rc;
    const wf_node *x = n->inputs[0], *dy = n->inputs[1];
    wf_shape ws = n->attrs->shape;
    char s1[160], s2[160], s3[160];
    bool known = ws.rank == 4;
    for (int d = 0; known && d < 4; d++)
        known = ws.dims[d] >= 0;
    if (!known) {
        snprintf(err, errlen,
                 "w_shape is %s (x %s, dy %s); it must have rank 4 (O, C / groups, KH, KW) and "
                 "known dimensions",
                 SH(ws, s1), SH(x->shape, s2), SH(dy->shape, s3));
        return ws.rank != 4 ? WF_ESHAPE : WF_EINVAL;
    }
    wf_shape want;
    rc = conv_shape(n, "x", x->shape, "w_shape", ws, &want, err, errlen);
    if (rc < 0)
        return rc;
    rc = check_dy(dy, want, "x", x->shape, ws, err, errlen);
    if (rc < 0)
        return rc;
    n->dtype = x->dtype;
    n->shape = ws;
    return 0;
}

static int kernel_backward_filter(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                                  wf_tensor **out)
{
    wf_kctx k = wf__ops_kctx(ctx);
    wf_conv_params p = wf__ops_conv_params(n);
    return wf__conv2d_backward_filter_cpu(&k, &p, in[0], in[1], *out);
}

static void cost_backward_filter(const wf_node *n, double *flops, double *bytes)
{
    conv_cost(n, n->inputs[1]->shape, n->shape, flops, bytes);
}

const wf_op_def wf_op_conv2d_backward_filter = {
    .name = "conv2d_backward_filter",
    .min_inputs = 2,
    .max_inputs = 2,
    .infer = infer_backward_filter,
    .kernel = { [WF_KERNEL_CPU] = kernel_backward_filter,
                [WF_KERNEL_CUDA] = WF__CUDA_KERNEL(conv2d_backward_filter) },
    .cost = cost_backward_filter,
    .flags = 0,
};

wf_node *(wf_conv2d_backward_filter)(wf_graph *g, wf_node *x, wf_node *dy, wf_shape w_shape,
                                     const wf_conv2d_opts *opts)
{
    wf_attrs a = conv_attrs(opts);
    a.shape = w_shape;
    wf_node *in[2] = { x, dy };
    return wf__node_add(g, &wf_op_conv2d_backward_filter, in, 2, &a);
}
