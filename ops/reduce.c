/* ops/reduce.c: the reductions: sum, mean, max, min, prod, argmax and logsumexp over a set of
 * axes, with keepdims: their constructors, inference, costs and op-table entries.
 * Owns: the op defs wf_op_sum ... wf_op_logsumexp (ops/table.h) and the public constructors
 *   of weft/ops.h's reduction section.
 * Invariants: a node's attrs hold its axes in canonical form whenever they are valid:
 *   non-negative, sorted, and n_axes 0 for "every axis" (also when all of them were listed),
 *   so that equal reductions have equal attribute bags (CSE, shared bags). Invalid axes are
 *   kept as given, and inference reports them with the node's name and file:line. Each
 *   constructor calls wf__node_add() once (one pending source location consumed).
 * Not here: the reduction loops (reduce_cpu.c), gradients (grad/). */
#include "internal.h"

#include <stdio.h>
#include <string.h>

/* Checks n->attrs' axes against the input's rank and computes the output shape. */
static int infer_reduce(wf_node *n, bool ints, wf_dtype out_dtype, char *err, size_t errlen)
{
    const wf_node *x = n->inputs[0];
    const wf_attrs *a = n->attrs;
    if (!wf__ops_dtype_ok(x->dtype, ints))
        return wf__ops_bad_dtype(n, 1, "x", ints, err, errlen);
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
    n->dtype = out_dtype ? out_dtype : x->dtype;
    n->shape = r;
    return 0;
}

static int run_reduce(const wf_kernel_ctx *ctx, wf_reduce_op op, const wf_node *n,
                      const wf_tensor *x, wf_tensor *out)
{
    int axes[WF_MAX_RANK];
    int k = n->attrs->n_axes;
    for (int i = 0; i < k; i++)
        axes[i] = n->attrs->axes[i];
    wf_kctx kc = wf__ops_kctx(ctx);
    return wf__reduce_cpu(&kc, op, k ? axes : NULL, k, n->attrs->keepdims, x, out);
}

/* X(name, WF_REDUCE_ op, i32 and i64 too, output dtype (0: x's), flops per input element,
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
        return run_reduce(ctx, WF_REDUCE_##OP, n, in[0], *out);                              \
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
        .kernel = { [WF_KERNEL_CPU] = kernel_##id },                                         \
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
