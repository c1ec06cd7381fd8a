/* ops/reduce.c: the reductions: sum, mean, max, min, prod, argmax and logsumexp over a set of
 * axes, with keepdims: their constructors, inference, costs and op-table entries.
 * Owns: the op defs wf_op_sum ... wf_op_logsumexp (ops/table.h) and the public constructors
 *   of weft/ops.h's reduction section; and "unreduce" (wf__unreduce(), ops/table.h), which
 *   spreads a reduction's gradient back over its input's shape (read from the tensor when
 *   the node runs, so -1 dimensions work), dividing by the count for mean; and "prod_grad"
 *   (wf__prod_grad()), prod's gradient as products of the other elements.
 * Invariants: a node's attrs hold its axes in canonical form whenever they are valid:
 *   non-negative, sorted, and n_axes 0 for "every axis" (also when all of them were listed),
 *   so that equal reductions have equal attribute bags (CSE, shared bags). Invalid axes are
 *   kept as given, and inference reports them with the node's name and file:line. Each
 *   constructor calls wf__node_add() once (one pending source location consumed).
 * Not here: the reduction loops (reduce_cpu.c), gradients (grad/). */
#include "../core/tensor.h"
#include "internal.h"
#include "layout.h"

#include <stdio.h>
#include <string.h>

/* Checks a's axes against x's rank and computes the reduced shape into '*out'. */
static int reduced_shape(const wf_attrs *a, const wf_node *x, wf_shape *out, char *err,
                         size_t errlen)
{
    char s[160];
    int rank = x->shape.rank;
    if (a->n_axes < 0 || a->n_axes > rank) {
        snprintf(err, errlen, "%d axes given for x of shape %s (rank %d)", (int)a->n_axes,
                 wf_shape_str(x->shape, s, sizeof s), rank);
        return WF_EINVAL;
    }
    bool mask[WF_MAX_RANK] = { false };
    for (int i = 0; i < a->n_axes; i++) {
        int ax = a->axes[i] < 0 ? a->axes[i] + rank : a->axes[i];
        if (ax < 0 || ax >= rank) {
            snprintf(err, errlen, "axis %d is out of range for x of shape %s", (int)a->axes[i],
                     wf_shape_str(x->shape, s, sizeof s));
            return WF_EINVAL;
        }
        if (mask[ax]) {
            snprintf(err, errlen, "axis %d is given twice for x of shape %s", (int)a->axes[i],
                     wf_shape_str(x->shape, s, sizeof s));
            return WF_EINVAL;
        }
        mask[ax] = true;
    }
    wf_shape r = { .rank = 0 };
    for (int d = 0; d < rank; d++) {
        if (a->n_axes && !mask[d])
            r.dims[r.rank++] = x->shape.dims[d];
        else if (a->keepdims)
            r.dims[r.rank++] = 1;
    }
    *out = r;
    return 0;
}

/* Checks n->attrs' axes against the input's rank and computes the output shape. */
static int infer_reduce(wf_node *n, bool ints, wf_dtype out_dtype, char *err, size_t errlen)
{
    const wf_node *x = n->inputs[0];
    if (!wf__ops_dtype_ok(x->dtype, ints))
        return wf__ops_bad_dtype(n, 1, "x", ints, err, errlen);
    int rc = reduced_shape(n->attrs, x, &n->shape, err, errlen);
    if (rc < 0)
        return rc;
    n->dtype = out_dtype ? out_dtype : x->dtype;
    return 0;
}

int wf__ops_reduce_axes(const wf_node *n, int *axes)
{
    int k = n->attrs->n_axes;
    for (int i = 0; i < k; i++)
        axes[i] = n->attrs->axes[i];
    return k;
}

static int run_reduce(const wf_kernel_ctx *ctx, wf__reduce_kind op, const wf_node *n,
                      const wf_tensor *x, wf_tensor *out)
{
    int axes[WF_MAX_RANK];
    int k = wf__ops_reduce_axes(n, axes);
    wf_kctx kc = wf__ops_kctx(ctx);
    return wf__reduce_cpu(&kc, op, k ? axes : NULL, k, n->attrs->keepdims, x, out);
}

/* X(name, WF__REDUCE_ op, i32 and i64 too, output dtype (0: x's), flops per input element,
 * flags) */
#define REDUCE_OPS(X)                                 \
    X(sum, SUM, true, 0, 1, 0)                        \
    X(mean, MEAN, false, 0, 1, 0)                     \
    X(max, MAX, true, 0, 1, 0)                        \
    X(min, MIN, true, 0, 1, 0)                        \
    X(prod, PROD, true, 0, 1, 0)                      \
    X(argmax, ARGMAX, true, WF_I64, 1, WF_OP_NO_GRAD) \
    X(logsumexp, LOGSUMEXP, false, 0, 12, 0)

#define DEF_REDUCE(id, OP, INTS, OUT, FLOPS, FLAGS)                                          \
    static int infer_##id(wf_node *n, char *err, size_t errlen)                              \
    {                                                                                        \
        return infer_reduce(n, INTS, OUT, err, errlen);                                      \
    }                                                                                        \
    static int kernel_##id(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in, \
                           wf_tensor **out)                                                  \
    {                                                                                        \
        return run_reduce(ctx, WF__REDUCE_##OP, n, in[0], *out);                             \
    }                                                                                        \
    static void cost_##id(const wf_node *n, double *flops, double *bytes)                    \
    {                                                                                        \
        *flops = FLOPS * wf__ops_numel(n->inputs[0]->shape);                                 \
        *bytes = wf__ops_bytes(n);                                                           \
    }                                                                                        \
    const wf_op_def wf_op_##id = {                                                           \
        .name = #id,                                                                         \
        .min_inputs = 1,                                                                     \
        .max_inputs = 1,                                                                     \
        .infer = infer_##id,                                                                 \
        .kernel = { [WF_KERNEL_CPU] = kernel_##id, [WF_KERNEL_CUDA] = WF__CUDA_KERNEL(id) }, \
        .cost = cost_##id,                                                                   \
        .flags = (FLAGS),                                                                    \
    };
REDUCE_OPS(DEF_REDUCE)

/* Puts 'axes' into a's canonical form (file header) when they are valid for 'x'. */
static void set_axes(wf_attrs *a, const wf_node *x, const int *axes, int n_axes)
{
    if (!axes || n_axes == 0)
        return; /* every axis */
    a->n_axes = n_axes;
    int k = n_axes < 0 ? 0 : n_axes > WF_MAX_RANK ? WF_MAX_RANK : n_axes;
    for (int i = 0; i < k; i++)
        a->axes[i] = axes[i];
    if (!x || n_axes < 0 || n_axes > x->shape.rank)
        return;
    int rank = x->shape.rank, norm[WF_MAX_RANK];
    bool seen[WF_MAX_RANK] = { false };
    for (int i = 0; i < n_axes; i++) {
        int ax = axes[i] < 0 ? axes[i] + rank : axes[i];
        if (ax < 0 || ax >= rank || seen[ax])
            return; /* inference says why */
        seen[ax] = true;
    }
    int m = 0;
    for (int d = 0; d < rank; d++)
        if (seen[d])
            norm[m++] = d;
    if (m == rank) {
        a->n_axes = 0;
        memset(a->axes, 0, sizeof a->axes);
        return;
    }
    for (int i = 0; i < m; i++)
        a->axes[i] = norm[i];
}

static wf_node *reduce(wf_graph *g, const wf_op_def *op, wf_node *x, const int *axes, int n_axes,
                       bool keepdims)
{
    wf_attrs a;
    memset(&a, 0, sizeof a); /* padding too: equal bags are shared (core/graph.h) */
    a.keepdims = keepdims;
    set_axes(&a, x, axes, n_axes);
    return wf__node_add(g, op, &x, 1, &a);
}

#define REDUCE_CTORS(name)                                                              \
    wf_node *(wf_reduce_##name)(wf_graph * g, wf_node * x, const int *axes, int n_axes, \
                                bool keepdims)                                          \
    {                                                                                   \
        return reduce(g, &wf_op_##name, x, axes, n_axes, keepdims);                     \
    }
REDUCE_CTORS(sum)
REDUCE_CTORS(mean)
REDUCE_CTORS(max)
REDUCE_CTORS(min)
REDUCE_CTORS(prod)
REDUCE_CTORS(argmax)
REDUCE_CTORS(logsumexp)

#define REDUCE_ALL(name)                                    \
    wf_node *(wf_##name)(wf_graph * g, wf_node * x)         \
    {                                                       \
        return reduce(g, &wf_op_##name, x, NULL, 0, false); \
    }
REDUCE_ALL(sum)
REDUCE_ALL(mean)
REDUCE_ALL(max)
REDUCE_ALL(min)
REDUCE_ALL(prod)
REDUCE_ALL(logsumexp)

wf_node *(wf_argmax)(wf_graph *g, wf_node *x, int axis)
{
    return reduce(g, &wf_op_argmax, x, &axis, 1, false);
}

/* ---- unreduce: a reduction's gradient spread back over its input ------------------------- */

/* dy has the shape of reducing x with 'a' (where both are known): unreduce's and prod_grad's
 * check. */
static int dy_fits(const wf_attrs *a, const wf_node *x, const wf_node *dy, char *err, size_t errlen)
{
    wf_shape r;
    int rc = reduced_shape(a, x, &r, err, errlen);
    if (rc < 0)
        return rc;
    bool fits = r.rank == dy->shape.rank;
    for (int d = 0; fits && d < r.rank; d++)
        fits = wf__ops_dims_fit(r.dims[d], dy->shape.dims[d]);
    if (!fits) {
        char s1[160], s2[160], s3[160];
        snprintf(err, errlen, "dy is %s but reducing x of shape %s gives %s",
                 wf_shape_str(dy->shape, s1, sizeof s1), wf_shape_str(x->shape, s2, sizeof s2),
                 wf_shape_str(r, s3, sizeof s3));
        return WF_ESHAPE;
    }
    return 0;
}

/* Inputs dy (the reduced shape of x under the attrs) and x (only its shape is used). */
static int infer_unreduce(wf_node *n, char *err, size_t errlen)
{
    const wf_node *dy = n->inputs[0], *x = n->inputs[1];
    if (!wf__ops_dtype_ok(dy->dtype, false))
        return wf__ops_bad_dtype(n, 1, "dy", false, err, errlen);
    int rc = dy_fits(n->attrs, x, dy, err, errlen);
    if (rc < 0)
        return rc;
    n->dtype = dy->dtype;
    n->shape = x->shape;
    return 0;
}

void wf__ops_unreduce_view(const wf_node *n, const wf_tensor *dy, const wf_tensor *out,
                           wf_shape *ks, int64_t *st)
{
    const wf_attrs *a = n->attrs;
    int rank = out->shape.rank;
    bool red[WF_MAX_RANK];
    for (int d = 0; d < rank; d++)
        red[d] = a->n_axes == 0;
    for (int i = 0; i < a->n_axes; i++)
        if (a->axes[i] >= 0 && a->axes[i] < rank)
            red[a->axes[i]] = true;
    *ks = (wf_shape){ .rank = rank };
    for (int d = 0, k = 0; d < rank; d++) {
        bool kept = !red[d] || a->keepdims;
        ks->dims[d] = red[d] ? 1 : out->shape.dims[d];
        st[d] = kept && k < dy->shape.rank ? dy->strides[k] : 0;
        k += kept;
    }
}

static int kernel_unreduce(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                           wf_tensor **out)
{
    const wf_tensor *dy = in[0];
    wf_tensor *o = *out;
    wf_shape ks;
    int64_t st[WF_MAX_RANK];
    wf__ops_unreduce_view(n, dy, o, &ks, st);
    wf_tensor *v = wf__tensor_alias(dy, ks, st, 0);
    if (!v)
        return WF_ENOMEM;
    wf_kctx kc = wf__ops_kctx(ctx);
    int rc = wf__broadcast_to_cpu(&kc, v, o);
    wf_tensor_release(v);
    if (rc < 0 || n->attrs->alpha == 0 || o->numel == 0)
        return rc;
    /* mean: divide by the count of reduced elements. */
    double scale = (double)dy->numel / (double)o->numel;
    if (o->dtype == WF_F32) {
        float *p = (float *)o->data, f = (float)scale;
        for (int64_t i = 0; i < o->numel; i++)
            p[i] *= f;
    } else if (o->dtype == WF_F64) {
        double *p = (double *)o->data;
        for (int64_t i = 0; i < o->numel; i++)
            p[i] *= scale;
    } else {
        size_t es = wf_dtype_size(o->dtype);
        for (int64_t i = 0; i < o->numel; i++)
            wf__store_f64(o->dtype, o->data + i * (int64_t)es,
                          wf__load_f64(o->dtype, o->data + i * (int64_t)es) * scale);
    }
    return 0;
}

static void cost_unreduce(const wf_node *n, double *flops, double *bytes)
{
    *flops = n->attrs->alpha != 0 ? wf__ops_numel(n->shape) : 0;
    *bytes = wf__ops_bytes(n);
}

const wf_op_def wf_op_unreduce = {
    .name = "unreduce",
    .min_inputs = 2,
    .max_inputs = 2,
    .infer = infer_unreduce,
    .kernel = { [WF_KERNEL_CPU] = kernel_unreduce, [WF_KERNEL_CUDA] = WF__CUDA_KERNEL(unreduce) },
    .cost = cost_unreduce,
    .flags = 0,
};

wf_node *wf__unreduce(wf_graph *g, wf_node *dy, wf_node *x, const wf_attrs *reduce_attrs, bool mean)
{
    wf_attrs a;
    memset(&a, 0, sizeof a);
    a.n_axes = reduce_attrs->n_axes;
    memcpy(a.axes, reduce_attrs->axes, sizeof a.axes);
    a.keepdims = reduce_attrs->keepdims;
    a.alpha = mean ? 1 : 0;
    wf_node *in[2] = { dy, x };
    return wf__node_add(g, &wf_op_unreduce, in, 2, &a);
}

/* ---- prod_grad: prod's gradient ------------------------------------------------------------ */

/* Inputs x and dy (the reduced shape of x under the attrs); the output has x's shape. */
static int infer_prod_grad(wf_node *n, char *err, size_t errlen)
{
    const wf_node *x = n->inputs[0], *dy = n->inputs[1];
    if (!wf__ops_dtype_ok(x->dtype, false))
        return wf__ops_bad_dtype(n, 0, "x", false, err, errlen);
    if (dy->dtype != x->dtype) {
        snprintf(err, errlen, "x is %s but dy is %s", wf_dtype_name(x->dtype),
                 wf_dtype_name(dy->dtype));
        return WF_EDTYPE;
    }
    int rc = dy_fits(n->attrs, x, dy, err, errlen);
    if (rc < 0)
        return rc;
    n->dtype = x->dtype;
    n->shape = x->shape;
    return 0;
}

static int kernel_prod_grad(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                            wf_tensor **out)
{
    int axes[WF_MAX_RANK];
    int k = wf__ops_reduce_axes(n, axes);
    wf_kctx kc = wf__ops_kctx(ctx);
    return wf__prod_grad_cpu(&kc, k ? axes : NULL, k, n->attrs->keepdims, in[0], in[1], *out);
}

/* Three multiplies per element (prefix, suffix, dy). */
static void cost_prod_grad(const wf_node *n, double *flops, double *bytes)
{
    *flops = 3 * wf__ops_numel(n->shape);
    *bytes = wf__ops_bytes(n);
}

/* No CUDA twin: a NULL slot keeps the node on the host (placement). */
const wf_op_def wf_op_prod_grad = {
    .name = "prod_grad",
    .min_inputs = 2,
    .max_inputs = 2,
    .infer = infer_prod_grad,
    .kernel = { [WF_KERNEL_CPU] = kernel_prod_grad },
    .cost = cost_prod_grad,
    .flags = 0,
};

wf_node *wf__prod_grad(wf_graph *g, wf_node *x, wf_node *dy, const wf_attrs *reduce_attrs)
{
    wf_attrs a;
    memset(&a, 0, sizeof a);
    a.n_axes = reduce_attrs->n_axes;
    memcpy(a.axes, reduce_attrs->axes, sizeof a.axes);
    a.keepdims = reduce_attrs->keepdims;
    wf_node *in[2] = { x, dy };
    return wf__node_add(g, &wf_op_prod_grad, in, 2, &a);
}
