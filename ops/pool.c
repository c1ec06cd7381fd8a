/* ops/pool.c: the 2-D pools (NCHW max and average pooling) and their backward ops:
 * constructors, dtype and shape inference, costs and op-table entries.
 * Owns: wf_op_max_pool2d, wf_op_avg_pool2d, wf_op_max_pool2d_backward,
 *   wf_op_avg_pool2d_backward (ops/table.h) and the pool constructors of weft/nn.h's
 *   "Convolution and pooling" section.
 * Attributes (core/graph.h's wf_attrs): window[2], stride[2], padding[4]; 'keepdims' holds
 *   count_include_pad (avg_pool2d and its backward; false for the max pools, so equal max
 *   pools share one bag); avg_pool2d_backward also 'shape' (x_shape).
 * Invariants: the constructors store a stride of 0 as the window (when the window is
 *   positive) and keep every other value as given, for inference to check and name; each
 *   constructor calls wf__node_add() once (one pending location), also for NULL opts (a zero
 *   window that inference refuses, so the message carries the node and file:line).
 *   Padding is smaller than the window along its axis, so every window holds a real element
 *   (a max is never -inf from padding alone, an average never divides by 0).
 * Not here: the loops (pool_cpu.c), convolutions (conv.c), the gradient functions (grad/). */
#include "internal.h"
#include "layout.h"

#include <stdio.h>
#include <string.h>

#define SH(s, buf) wf_shape_str((s), (buf), sizeof(buf))

/* Checks the attributes of 'n' against x's shape 'xs' (named 'xn') and gives the pooled
 * shape [N, C, OH, OW] (-1 where xs has -1). */
static int pool_shape(const wf_node *n, const char *xn, wf_shape xs, wf_shape *ys, char *err,
                      size_t errlen)
{
    const wf_attrs *a = n->attrs;
    char s1[160];
    SH(xs, s1);
    if (a->window[0] < 1 || a->window[1] < 1) {
        snprintf(err, errlen,
                 "%s is %s: the window [%d, %d] must be positive (opts NULL or without a window?)",
                 xn, s1, a->window[0], a->window[1]);
        return WF_EINVAL;
    }
    if (a->stride[0] < 1 || a->stride[1] < 1) {
        snprintf(err, errlen, "%s is %s: stride [%d, %d] must not be negative (0: the window)", xn,
                 s1, a->stride[0], a->stride[1]);
        return WF_EINVAL;
    }
    for (int i = 0; i < 4; i++) {
        int k = a->window[i / 2];
        if (a->padding[i] < 0 || a->padding[i] >= k) {
            static const char *const side[4] = { "top", "bottom", "left", "right" };
            snprintf(err, errlen,
                     "%s is %s: padding [%d, %d, %d, %d] (top, bottom, left, right): %d on the %s "
                     "must be in [0, %d) for the window [%d, %d]",
                     xn, s1, a->padding[0], a->padding[1], a->padding[2], a->padding[3],
                     a->padding[i], side[i], k, a->window[0], a->window[1]);
            return WF_EINVAL;
        }
    }
    if (xs.rank != 4) {
        snprintf(err, errlen, "%s is %s; %s needs rank 4 (NCHW)", xn, s1, n->op->name);
        return WF_ESHAPE;
    }
    wf_shape ys_ = { .rank = 4, .dims = { xs.dims[0], xs.dims[1], -1, -1 } };
    for (int h = 0; h < 2; h++) {
        int64_t in = xs.dims[2 + h];
        if (in < 0)
            continue;
        int64_t padded = in + a->padding[2 * h] + a->padding[2 * h + 1];
        if (a->window[h] > padded) {
            snprintf(err, errlen,
                     "%s is %s: the window %s %d is larger than the padded input %s %lld (%lld + "
                     "%d + %d), so the output %s would be 0",
                     xn, s1, h ? "width" : "height", a->window[h], h ? "width" : "height",
                     (long long)padded, (long long)in, a->padding[2 * h], a->padding[2 * h + 1],
                     h ? "width" : "height");
            return WF_ESHAPE;
        }
        ys_.dims[2 + h] = (padded - a->window[h]) / a->stride[h] + 1;
    }
    *ys = ys_;
    return 0;
}

static int check_float(const wf_node *n, const char *what, char *err, size_t errlen)
{
    if (!wf_dtype_is_float(n->inputs[0]->dtype))
        return wf__ops_bad_dtype(n, n->n_inputs, what, false, err, errlen);
    return 0;
}

wf_pool_params wf__ops_pool_params(const wf_node *n)
{
    const wf_attrs *a = n->attrs;
    wf_pool_params p;
    memcpy(p.window, a->window, sizeof p.window);
    memcpy(p.stride, a->stride, sizeof p.stride);
    memcpy(p.padding, a->padding, sizeof p.padding);
    p.count_include_pad = a->keepdims;
    return p;
}

/* The output has 'taps' = KH KW reads per element: comparisons or additions. */
static void pool_cost(const wf_node *n, wf_shape ys, double *flops, double *bytes)
{
    *flops = wf__ops_numel(ys) * (double)n->attrs->window[0] * (double)n->attrs->window[1];
    *bytes = wf__ops_bytes(n);
}

/* ---- max_pool2d and avg_pool2d -----------------------------------------------------------------
 */

static int infer_pool(wf_node *n, char *err, size_t errlen)
{
    int rc = check_float(n, "x", err, errlen);
    if (rc < 0)
        return rc;
    wf_shape ys;
    rc = pool_shape(n, "x", n->inputs[0]->shape, &ys, err, errlen);
    if (rc < 0)
        return rc;
    n->dtype = n->inputs[0]->dtype;
    n->shape = ys;
    return 0;
}

static int kernel_max_pool(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                           wf_tensor **out)
{
    wf_kctx k = wf__ops_kctx(ctx);
    wf_pool_params p = wf__ops_pool_params(n);
    return wf__max_pool2d_cpu(&k, &p, in[0], *out);
}

static int kernel_avg_pool(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                           wf_tensor **out)
{
    wf_kctx k = wf__ops_kctx(ctx);
    wf_pool_params p = wf__ops_pool_params(n);
    return wf__avg_pool2d_cpu(&k, &p, in[0], *out);
}

static void cost_pool(const wf_node *n, double *flops, double *bytes)
{
    pool_cost(n, n->shape, flops, bytes);
}

const wf_op_def wf_op_max_pool2d = {
    .name = "max_pool2d",
    .min_inputs = 1,
    .max_inputs = 1,
    .infer = infer_pool,
    .kernel = { [WF_KERNEL_CPU] = kernel_max_pool, [WF_KERNEL_CUDA] = WF__CUDA_KERNEL(max_pool2d) },
    .cost = cost_pool,
    .flags = 0,
};

const wf_op_def wf_op_avg_pool2d = {
    .name = "avg_pool2d",
    .min_inputs = 1,
    .max_inputs = 1,
    .infer = infer_pool,
    .kernel = { [WF_KERNEL_CPU] = kernel_avg_pool, [WF_KERNEL_CUDA] = WF__CUDA_KERNEL(avg_pool2d) },
    .cost = cost_pool,
    .flags = 0,
};

static wf_attrs pool_attrs(const wf_pool2d_opts *o, bool avg)
{
    wf_attrs a;
    memset(&a, 0, sizeof a); /* padding too: equal bags are shared (core/graph.h) */
    if (!o)
        return a; /* window [0, 0]: inference names the problem */
    for (int i = 0; i < 2; i++) {
        a.window[i] = o->window[i];
        a.stride[i] = o->stride[i] == 0 && o->window[i] > 0 ? o->window[i] : o->stride[i];
    }
    for (int i = 0; i < 4; i++)
        a.padding[i] = o->padding[i];
    a.keepdims = avg && o->count_include_pad;
    return a;
}

wf_node *(wf_max_pool2d)(wf_graph *g, wf_node *x, const wf_pool2d_opts *opts)
{
    wf_attrs a = pool_attrs(opts, false);
    return wf__node_add(g, &wf_op_max_pool2d, &x, 1, &a);
}

wf_node *(wf_avg_pool2d)(wf_graph *g, wf_node *x, const wf_pool2d_opts *opts)
{
    wf_attrs a = pool_attrs(opts, true);
    return wf__node_add(g, &wf_op_avg_pool2d, &x, 1, &a);
}

/* ---- Backward ops ---------------------------------------------------------------------------- */

/* dy must be 'want' (the pool's output), -1 on either side fitting anything. */
static int check_dy(const wf_node *dy, wf_shape want, wf_shape xs, char *err, size_t errlen)
{
    bool fits = dy->shape.rank == 4;
    for (int d = 0; fits && d < 4; d++)
        fits = wf__ops_dims_fit(dy->shape.dims[d], want.dims[d]);
    if (fits)
        return 0;
    char s1[160], s2[160], s3[160];
    snprintf(err, errlen, "dy is %s but pooling x %s gives %s", SH(dy->shape, s1), SH(xs, s2),
             SH(want, s3));
    return WF_ESHAPE;
}

/* Inputs x, dy. */
static int infer_max_backward(wf_node *n, char *err, size_t errlen)
{
    const wf_node *x = n->inputs[0], *dy = n->inputs[1];
    char s1[160], s2[160];
    if (x->dtype != dy->dtype) {
        snprintf(err, errlen,
                 "x is %s %s but dy is %s %s: the dtypes must be equal (no implicit promotion; "
                 "convert one with wf_cast)",
                 wf_dtype_name(x->dtype), SH(x->shape, s1), wf_dtype_name(dy->dtype),
                 SH(dy->shape, s2));
        return WF_EDTYPE;
    }
    int rc = check_float(n, "x and dy", err, errlen);
    if (rc < 0)
        return rc;
    wf_shape want;
    rc = pool_shape(n, "x", x->shape, &want, err, errlen);
    if (rc >= 0)
        rc = check_dy(dy, want, x->shape, err, errlen);
    if (rc < 0)
        return rc;
    n->dtype = x->dtype;
    n->shape = x->shape;
    return 0;
}

static int kernel_max_backward(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                               wf_tensor **out)
{
    wf_kctx k = wf__ops_kctx(ctx);
    wf_pool_params p = wf__ops_pool_params(n);
    return wf__max_pool2d_backward_cpu(&k, &p, in[0], in[1], *out);
}

static void cost_backward(const wf_node *n, double *flops, double *bytes)
{
    pool_cost(n, n->inputs[n->n_inputs - 1]->shape, flops, bytes);
}

const wf_op_def wf_op_max_pool2d_backward = {
    .name = "max_pool2d_backward",
    .min_inputs = 2,
    .max_inputs = 2,
    .infer = infer_max_backward,
    .kernel = { [WF_KERNEL_CPU] = kernel_max_backward,
                [WF_KERNEL_CUDA] = WF__CUDA_KERNEL(max_pool2d_backward) },
    .cost = cost_backward,
    .flags = 0,
};

wf_node *(wf_max_pool2d_backward)(wf_graph *g, wf_node *x, wf_node *dy, const wf_pool2d_opts *opts)
{
    wf_attrs a = pool_attrs(opts, false);
    wf_node *in[2] = { x, dy };
    return wf__node_add(g, &wf_op_max_pool2d_backward, in, 2, &a);
}

/* Input dy; attrs.shape is x_shape. */
static int infer_avg_backward(wf_node *n, char *err, size_t errlen)
{
    int rc = check_float(n, "dy", err, errlen);
    if (rc < 0)
        return rc;
    const wf_node *dy = n->inputs[0];
    const wf_attrs *a = n->attrs;
    wf_shape xs = a->shape;
    char s1[160], s2[160];
    if (xs.rank != 4) {
        snprintf(err, errlen, "x_shape is %s (dy %s); it must have rank 4 (NCHW)", SH(xs, s1),
                 SH(dy->shape, s2));
        return WF_ESHAPE;
    }
    bool dy4 = dy->shape.rank == 4;
    for (int d = 0; d < 4; d++) {
        if (xs.dims[d] < -1) {
            snprintf(err, errlen, "x_shape is %s: dimension %d is %lld", SH(xs, s1), d,
                     (long long)xs.dims[d]);
            return WF_EINVAL;
        }
        if (xs.dims[d] != -1)
            continue;
        if (d < 2) { /* batch and channels: dy's */
            if (dy4)
                xs.dims[d] = dy->shape.dims[d];
            continue;
        }
        int h = d - 2;
        if (a->stride[h] != 1) {
            snprintf(err, errlen,
                     "x_shape is %s (dy %s): its %s is unknown and cannot be recovered from dy "
                     "with stride %d",
                     SH(xs, s1), SH(dy->shape, s2), h ? "width" : "height", a->stride[h]);
            return WF_EINVAL;
        }
        if (dy4 && dy->shape.dims[d] >= 0) {
            int64_t v =
                dy->shape.dims[d] - 1 + a->window[h] - a->padding[2 * h] - a->padding[2 * h + 1];
            xs.dims[d] = v >= 0 ? v : 0;
        }
    }
    wf_shape want;
    rc = pool_shape(n, "x_shape", xs, &want, err, errlen);
    if (rc >= 0)
        rc = check_dy(dy, want, xs, err, errlen);
    if (rc < 0)
        return rc;
    n->dtype = dy->dtype;
    n->shape = xs;
    return 0;
}

static int kernel_avg_backward(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                               wf_tensor **out)
{
    wf_kctx k = wf__ops_kctx(ctx);
    wf_pool_params p = wf__ops_pool_params(n);
    return wf__avg_pool2d_backward_cpu(&k, &p, in[0], *out);
}

const wf_op_def wf_op_avg_pool2d_backward = {
    .name = "avg_pool2d_backward",
    .min_inputs = 1,
    .max_inputs = 1,
    .infer = infer_avg_backward,
    .kernel = { [WF_KERNEL_CPU] = kernel_avg_backward,
                [WF_KERNEL_CUDA] = WF__CUDA_KERNEL(avg_pool2d_backward) },
    .cost = cost_backward,
    .flags = 0,
};

wf_node *(wf_avg_pool2d_backward)(wf_graph *g, wf_node *dy, wf_shape x_shape,
                                  const wf_pool2d_opts *opts)
{
    wf_attrs a = pool_attrs(opts, true);
    a.shape = x_shape;
    return wf__node_add(g, &wf_op_avg_pool2d_backward, &dy, 1, &a);
}
