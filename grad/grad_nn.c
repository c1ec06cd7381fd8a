/* grad/grad_nn.c: the gradient functions of matmul, softmax and the cross-entropy loss, the
 * shape ops, indexing, convolution and pooling, layer norm and dropout, and of the backward
 * helper ops themselves where a second derivative is a plain op (slice_backward, scatter_add,
 * reshape_like, sum_like).
 * Owns: wf__grad_nn[], the table of those ops and their gradient functions.
 * Conventions: those of grad_math.c (core/op.h's wf_grad_fn; X0, X1 the forward inputs, Y
 *   the forward node, dy the gradient flowing in). Axes stored by a constructor may be
 *   negative (concat, stack, split, gather); they are made non-negative here with the rank
 *   the op used.
 * Not here: wf_gradients (gradients.c), elementwise ops and reductions (grad_math.c). */
#include "internal.h"

#include <stdint.h>
#include <string.h>

#define GRAD_FN(name) \
    static int name(wf_graph *g, const wf_node *n, wf_node *dy, uint32_t need, wf_node **dx)

#define X0 wf__grad_mut(n->inputs[0])
#define X1 wf__grad_mut(n->inputs[1])
#define Y  wf__grad_mut(n)

static int norm_axis(int axis, int rank)
{
    return axis < 0 ? axis + rank : axis;
}

/* A gradient that needs a dimension the graph does not know yet. */
static int unknown_dim(wf_graph *g, const wf_node *n, const char *what)
{
    char where[256], s[160];
    return wf__graph_fail(g, WF_ESHAPE,
                          "wf_gradients: op '%s' (node '%s', %s): the gradient needs %s, "
                          "unknown in %s",
                          n->op->name, n->name, wf__node_where(n, where, sizeof where), what,
                          wf_shape_str(n->inputs[0]->shape, s, sizeof s));
}

/* ---- matmul ---------------------------------------------------------------------------- */

/* y = A B with A = a or a^T, B = b or b^T: dA = dy B^T, dB = A^T dy, transposed back where a
 * or b was; batch dimensions that were broadcast are summed back. */
GRAD_FN(grad_matmul)
{
    bool ta = n->attrs->transpose_a, tb = n->attrs->transpose_b;
    wf_node *a = X0, *b = X1, *da = NULL, *db = NULL;
    if (WF__NEED(need, 0)) {
        da = ta ? (wf_matmul_ex)(g, b, dy, tb, true) : (wf_matmul_ex)(g, dy, b, false, !tb);
        dx[0] = wf__grad_unbroadcast(g, da, n, 0);
    }
    if (WF__NEED(need, 1)) {
        db = tb ? (wf_matmul_ex)(g, dy, a, true, ta) : (wf_matmul_ex)(g, a, dy, !ta, false);
        dx[1] = wf__grad_unbroadcast(g, db, n, 1);
    }
    return 0;
}

/* ---- softmax and the loss -------------------------------------------------------------- */

GRAD_FN(grad_softmax) /* y (dy - sum(dy y)) over the axis */
{
    (void)need;
    int axis = n->attrs->axis;
    wf_node *s = wf_reduce_sum(g, wf_mul(g, dy, Y), &axis, 1, true);
    dx[0] = wf_mul(g, Y, wf_sub(g, dy, s));
    return 0;
}

GRAD_FN(grad_log_softmax) /* dy - exp(y) sum(dy) over the axis */
{
    (void)need;
    int axis = n->attrs->axis;
    wf_node *s = wf_reduce_sum(g, dy, &axis, 1, true);
    dx[0] = wf_sub(g, dy, wf_mul(g, wf_exp(g, Y), s));
    return 0;
}

GRAD_FN(grad_xent) /* (softmax(logits) - one_hot(labels)) dy[..., None]; labels get none */
{
    (void)need;
    const wf_node *logits = n->inputs[0];
    int64_t classes = logits->shape.dims[logits->shape.rank - 1];
    if (classes < 0)
        return unknown_dim(g, n, "the number of classes");
    wf_node *p = wf_softmax(g, X0, -1);
    wf_node *t = wf_one_hot(g, X1, classes, logits->dtype);
    dx[0] = wf_mul(g, wf_sub(g, p, t), wf_expand_dims(g, dy, -1));
    return 0;
}

/* ---- Shape ops ------------------------------------------------------------------------- */

GRAD_FN(grad_reshape) /* reshape, expand_dims, squeeze, reshape_like: back to the input's shape */
{
    (void)need;
    dx[0] = wf__reshape_like(g, dy, X0);
    return 0;
}

/* The inverse permutation, of the forward's normalised one: perm entries may be negative
 * (counted from the end), and indexing 'inv' with one wrote outside it. */
GRAD_FN(grad_transpose)
{
    (void)need;
    int r = n->inputs[0]->shape.rank, perm[WF_MAX_RANK], inv[WF_MAX_RANK];
    if (!wf__transpose_perm(n->attrs, r, perm)) /* inference accepted it: cannot happen */
        return wf__graph_fail(g, WF_EINVAL, "wf_gradients: transpose '%s' has no permutation",
                              n->name);
    for (int d = 0; d < r; d++)
        inv[perm[d]] = d;
    dx[0] = wf_transpose(g, dy, inv, r);
    return 0;
}

GRAD_FN(grad_slice)
{
    (void)need;
    const wf_attrs *a = n->attrs;
    dx[0] = wf_slice_backward(g, dy, n->inputs[0]->shape, a->begin, a->end, a->step);
    return 0;
}

GRAD_FN(grad_slice_backward) /* its adjoint is the slice again */
{
    (void)need;
    const wf_attrs *a = n->attrs;
    dx[0] = wf_slice(g, dy, a->begin, a->end, a->step);
    return 0;
}

GRAD_FN(grad_split) /* part k of n: zeros of x's shape with dy in the part's place */
{
    (void)need;
    const wf_node *x = n->inputs[0];
    int rank = x->shape.rank, axis = norm_axis(n->attrs->axis, rank);
    int64_t dim = x->shape.dims[axis];
    if (dim < 0)
        return unknown_dim(g, n, "the size of the split axis");
    int64_t part = dim / n->attrs->groups, b[WF_MAX_RANK], e[WF_MAX_RANK], s[WF_MAX_RANK];
    for (int d = 0; d < rank; d++) {
        b[d] = 0;
        e[d] = INT64_MAX;
        s[d] = 1;
    }
    b[axis] = part * n->attrs->depth;
    e[axis] = b[axis] + part;
    dx[0] = wf_slice_backward(g, dy, x->shape, b, e, s);
    return 0;
}

/* concat and stack: input i is the slice of dy it filled (stack: then without the axis). */
static int grad_join(wf_graph *g, const wf_node *n, wf_node *dy, uint32_t need, wf_node **dx,
                     bool stack)
{
    int rank = n->shape.rank, axis = norm_axis(n->attrs->axis, rank);
    int64_t b[WF_MAX_RANK], e[WF_MAX_RANK], s[WF_MAX_RANK], at = 0;
    for (int d = 0; d < rank; d++) {
        b[d] = 0;
        e[d] = INT64_MAX;
        s[d] = 1;
    }
    for (int i = 0; i < n->n_inputs; i++) {
        int64_t len = stack ? 1 : n->inputs[i]->shape.dims[axis];
        if (len < 0)
            return unknown_dim(g, n, "the inputs' sizes along the concat axis");
        b[axis] = at;
        e[axis] = at + len;
        at += len;
        if (!WF__NEED(need, i))
            continue;
        wf_node *part = wf_slice(g, dy, b, e, s);
        dx[i] = stack ? wf__reshape_like(g, part, wf__grad_mut(n->inputs[i])) : part;
    }
    return 0;
}

GRAD_FN(grad_concat)
{
    return grad_join(g, n, dy, need, dx, false);
}

GRAD_FN(grad_stack)
{
    return grad_join(g, n, dy, need, dx, true);
}

GRAD_FN(grad_pad) /* the middle of dy */
{
    (void)need;
    int rank = n->shape.rank;
    int64_t b[WF_MAX_RANK], e[WF_MAX_RANK], s[WF_MAX_RANK];
    for (int d = 0; d < rank; d++) {
        b[d] = n->attrs->begin[d];
        e[d] = n->attrs->end[d] > 0 ? -n->attrs->end[d] : INT64_MAX;
        s[d] = 1;
    }
    dx[0] = wf_slice(g, dy, b, e, s);
    return 0;
}

GRAD_FN(grad_broadcast_to)
{
    (void)need;
    dx[0] = wf__grad_unbroadcast(g, dy, n, 0);
    return 0;
}

/* sum_like(dx, ref)'s adjoint: dy (ref's shape) spread back over dx's shape. where(c, dy, dy)
 * with c of dx's shape is that broadcast exactly, whatever the run-time shapes. */
GRAD_FN(grad_sum_like)
{
    (void)need;
    dx[0] = wf_where(g, wf_eq(g, X0, X0), dy, dy);
    return 0;
}

/* ---- Indexing -------------------------------------------------------------------------- */

GRAD_FN(grad_gather) /* params get dy added at the indices; indices get none */
{
    (void)need;
    const wf_node *p = n->inputs[0];
    int axis = norm_axis(n->attrs->axis, p->shape.rank);
    int64_t dim = p->shape.dims[axis];
    if (dim < 0)
        return unknown_dim(g, n, "the size of the gathered axis");
    dx[0] = wf_scatter_add(g, dy, X1, axis, dim);
    return 0;
}

GRAD_FN(grad_scatter_add) /* its adjoint is the gather */
{
    (void)need;
    dx[0] = wf_gather(g, dy, X1, n->attrs->axis);
    return 0;
}

/* ---- Convolution and pooling ----------------------------------------------------------- */

static wf_conv2d_opts conv_opts(const wf_attrs *a)
{
    wf_conv2d_opts o;
    memset(&o, 0, sizeof o);
    for (int i = 0; i < 2; i++) {
        o.stride[i] = a->stride[i];
        o.dilation[i] = a->dilation[i];
    }
    for (int i = 0; i < 4; i++)
        o.padding[i] = a->padding[i];
    o.groups = a->groups;
    return o;
}

static wf_pool2d_opts pool_opts(const wf_attrs *a)
{
    wf_pool2d_opts o;
    memset(&o, 0, sizeof o);
    for (int i = 0; i < 2; i++) {
        o.window[i] = a->window[i];
        o.stride[i] = a->stride[i];
    }
    for (int i = 0; i < 4; i++)
        o.padding[i] = a->padding[i];
    o.count_include_pad = a->keepdims; /* ops/pool.c keeps it there */
    return o;
}

GRAD_FN(grad_conv2d)
{
    wf_conv2d_opts o = conv_opts(n->attrs);
    if (WF__NEED(need, 0))
        dx[0] = wf_conv2d_backward_input(g, dy, X1, n->inputs[0]->shape, &o);
    if (WF__NEED(need, 1))
        dx[1] = wf_conv2d_backward_filter(g, X0, dy, n->inputs[1]->shape, &o);
    return 0;
}

GRAD_FN(grad_max_pool2d)
{
    (void)need;
    wf_pool2d_opts o = pool_opts(n->attrs);
    dx[0] = wf_max_pool2d_backward(g, X0, dy, &o);
    return 0;
}

GRAD_FN(grad_avg_pool2d)
{
    (void)need;
    wf_pool2d_opts o = pool_opts(n->attrs);
    dx[0] = wf_avg_pool2d_backward(g, dy, n->inputs[0]->shape, &o);
    return 0;
}

/* ---- Layer norm and dropout ------------------------------------------------------------ */

/* layer_norm(x[, gamma][, beta]): dx from the fused backward op; dgamma = sum(dy xhat) and
 * dbeta = sum(dy) over the leading (row) axes. attrs->groups says which inputs exist
 * (bit 0 gamma, bit 1 beta; ops/norm.c). */
GRAD_FN(grad_layer_norm)
{
    int begin = n->attrs->axis, mask = n->attrs->groups, i = 1;
    double eps = n->attrs->epsilon;
    wf_node *gamma = (mask & 1) ? wf__grad_mut(n->inputs[i++]) : NULL;
    int ig = (mask & 1) ? 1 : -1, ib = (mask & 2) ? i : -1;
    int rows[WF_MAX_RANK];
    for (int d = 0; d < begin; d++)
        rows[d] = d;
    if (WF__NEED(need, 0))
        dx[0] = wf_layer_norm_backward_input(g, X0, gamma, dy, begin, eps);
    if (ig > 0 && WF__NEED(need, ig)) {
        wf_node *xhat = wf_layer_norm(g, X0, NULL, NULL, begin, eps);
        wf_node *p = wf_mul(g, dy, xhat);
        dx[ig] = begin ? wf_reduce_sum(g, p, rows, begin, false) : p;
    }
    if (ib > 0 && WF__NEED(need, ib))
        dx[ib] = begin ? wf_reduce_sum(g, dy, rows, begin, false) : dy;
    return 0;
}

GRAD_FN(grad_dropout) /* the same mask on dy: equal attributes draw equal masks in one run */
{
    (void)need;
    dx[0] = wf__node_add(g, n->op, &dy, 1, n->attrs);
    return 0;
}

const wf__grad_entry wf__grad_nn[] = {
    { &wf_op_matmul, grad_matmul },
    { &wf_op_softmax, grad_softmax },
    { &wf_op_log_softmax, grad_log_softmax },
    { &wf_op_softmax_cross_entropy, grad_xent },
    { &wf_op_reshape, grad_reshape },
    { &wf_op_expand_dims, grad_reshape },
    { &wf_op_squeeze, grad_reshape },
    { &wf_op_reshape_like, grad_reshape },
    { &wf_op_transpose, grad_transpose },
    { &wf_op_slice, grad_slice },
    { &wf_op_slice_backward, grad_slice_backward },
    { &wf_op_split, grad_split },
    { &wf_op_concat, grad_concat },
    { &wf_op_stack, grad_stack },
    { &wf_op_pad, grad_pad },
    { &wf_op_broadcast_to, grad_broadcast_to },
    { &wf_op_sum_like, grad_sum_like },
    { &wf_op_gather, grad_gather },
    { &wf_op_scatter_add, grad_scatter_add },
    { &wf_op_conv2d, grad_conv2d },
    { &wf_op_max_pool2d, grad_max_pool2d },
    { &wf_op_avg_pool2d, grad_avg_pool2d },
    { &wf_op_layer_norm, grad_layer_norm },
    { &wf_op_dropout, grad_dropout },
};

const int wf__grad_nn_len = (int)(sizeof wf__grad_nn / sizeof wf__grad_nn[0]);
