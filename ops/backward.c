/* ops/backward.c: slice_backward, the gradient of slice: its constructor, inference, cost and
 * op-table entry. (The other backward helpers live beside their forward ops: the activation
 * gradients in elementwise.c, scatter_add in index.c, layer_norm_backward_input in norm.c.)
 * Owns: wf_op_slice_backward (ops/table.h) and wf_slice_backward() (weft/nn.h).
 * Invariants: the attributes are the forward slice's begin, end and step, normalized by the
 *   same helper wf_slice() uses (wf__slice_attrs(), shape.c), plus 'shape', the sliced
 *   tensor's shape; every check is in inference (messages with the node's prefix naming
 *   both shapes); the constructor calls wf__node_add() once.
 * Not here: the copy (backward_cpu.c), the gradient function that calls it (grad/). */
#include "internal.h"

#include <stdio.h>
#include <string.h>

#define SH(s, buf) wf_shape_str((s), (buf), sizeof(buf))

/* The slice takes axis 'd' whole whatever its size: the defaults of a step-1 slice. */
static bool whole_axis(const wf_attrs *a, int d)
{
    return a->step[d] == 1 && (a->begin[d] == 0 || a->begin[d] == INT64_MIN) &&
           a->end[d] == INT64_MAX;
}

static int infer_slice_backward(wf_node *n, char *err, size_t errlen)
{
    const wf_node *dy = n->inputs[0];
    const wf_attrs *a = n->attrs;
    wf_shape xs = a->shape, s = xs;
    char s1[160], s2[160];
    if (xs.rank < 0 || xs.rank > WF_MAX_RANK) {
        snprintf(err, errlen, "dy is %s; x's rank %d is outside [0, %d]", SH(dy->shape, s1),
                 (int)xs.rank, WF_MAX_RANK);
        return WF_EINVAL;
    }
    if (dy->shape.rank != xs.rank || wf_dtype_size(dy->dtype) == 0) {
        snprintf(err, errlen, "x is %s but dy is %s %s: the ranks differ", SH(xs, s1),
                 wf_dtype_name(dy->dtype), SH(dy->shape, s2));
        return dy->shape.rank != xs.rank ? WF_ESHAPE : WF_EDTYPE;
    }
    for (int d = 0; d < xs.rank; d++) {
        if (a->step[d] == 0 || xs.dims[d] < -1) {
            snprintf(err, errlen, "x is %s and dy %s; %s on axis %d", SH(xs, s1), SH(dy->shape, s2),
                     a->step[d] == 0 ? "step 0" : "a negative dimension", d);
            return WF_EINVAL;
        }
    }
    for (int d = 0; d < xs.rank; d++) {
        int64_t start, len, dd = dy->shape.dims[d];
        if (xs.dims[d] == -1) {
            if (!whole_axis(a, d)) {
                snprintf(err, errlen,
                         "x is %s and dy %s: axis %d of x is unknown (-1) but the slice does not "
                         "take it whole, so its size cannot be known",
                         SH(xs, s1), SH(dy->shape, s2), d);
                return WF_ESHAPE;
            }
            s.dims[d] = dd;
            continue;
        }
        (void)wf__slice_dim(xs.dims[d], a->begin[d], a->end[d], a->step[d], &start, &len);
        if (!wf__ops_dims_fit(len, dd)) {
            snprintf(err, errlen, "x is %s, whose slice has %lld elements on axis %d, but dy is %s",
                     SH(xs, s1), (long long)len, d, SH(dy->shape, s2));
            return WF_ESHAPE;
        }
    }
    n->dtype = dy->dtype;
    n->shape = s;
    return 0;
}

static int kernel_slice_backward(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                                 wf_tensor **out)
{
    wf_kctx k = wf__ops_kctx(ctx);
    return wf__slice_backward_cpu(&k, n->attrs->begin, n->attrs->end, n->attrs->step, in[0], *out);
}

/* No arithmetic: dy read once, out written once. */
static void cost_slice_backward(const wf_node *n, double *flops, double *bytes)
{
    *flops = 0;
    *bytes = wf__ops_bytes(n);
}

const wf_op_def wf_op_slice_backward = {
    .name = "slice_backward",
    .min_inputs = 1,
    .max_inputs = 1,
    .infer = infer_slice_backward,
    .kernel = { [WF_KERNEL_CPU] = kernel_slice_backward,
                [WF_KERNEL_CUDA] = WF__CUDA_KERNEL(slice_backward) },
    .cost = cost_slice_backward,
};

wf_node *(wf_slice_backward)(wf_graph *g, wf_node *dy, wf_shape x_shape, const int64_t *begin,
                             const int64_t *end, const int64_t *step)
{
    wf_attrs a;
    memset(&a, 0, sizeof a); /* padding too: equal bags are shared (core/graph.h) */
    a.shape = x_shape;
    wf__slice_attrs(x_shape.rank, begin, end, step, a.begin, a.end, a.step);
    return wf__node_add(g, &wf_op_slice_backward, &dy, 1, &a);
}
