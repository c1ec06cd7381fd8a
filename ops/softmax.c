/* ops/softmax.c: softmax, log_softmax and softmax_cross_entropy: their constructors,
 * inference, costs and op-table entries.
 * Owns: wf_op_softmax, wf_op_log_softmax, wf_op_softmax_cross_entropy (ops/table.h) and the
 *   public constructors of weft/ops.h's softmax section.
 * Invariants: softmax's axis is stored non-negative when it is valid (equal nodes, equal
 *   attribute bags); an invalid one is kept and inference names it. Cross-entropy's labels
 *   must have the logits' shape without the last axis, where a -1 dimension on either side
 *   fits any size and the output takes the known one. Each constructor calls wf__node_add()
 *   once (one pending source location consumed).
 * Not here: the row loops (softmax_cpu.c), gradients (grad/). */
#include "internal.h"

#include <stdio.h>
#include <string.h>

static int check_x(const wf_node *n, const char *what, char *err, size_t errlen)
{
    const wf_node *x = n->inputs[0];
    if (!wf_dtype_is_float(x->dtype))
        return wf__ops_bad_dtype(n, 1, what, false, err, errlen);
    if (x->shape.rank == 0) {
        snprintf(err, errlen, "%s is a scalar []; %s needs rank >= 1", what, n->op->name);
        return WF_ESHAPE;
    }
    return 0;
}

static int infer_softmax(wf_node *n, char *err, size_t errlen)
{
    int rc = check_x(n, "x", err, errlen);
    if (rc < 0)
        return rc;
    const wf_node *x = n->inputs[0];
    int axis = n->attrs->axis, rank = x->shape.rank;
    if (axis < -rank || axis >= rank) {
        char s[160];
        snprintf(err, errlen, "axis %d is out of range for x of shape %s", axis,
                 wf_shape_str(x->shape, s, sizeof s));
        return WF_EINVAL;
    }
    n->dtype = x->dtype;
    n->shape = x->shape;
    return 0;
}

static int kernel_softmax(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                          wf_tensor **out)
{
    wf_kctx k = wf__ops_kctx(ctx);
    return wf__softmax_cpu(&k, n->attrs->axis, in[0], *out);
}

static int kernel_log_softmax(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                              wf_tensor **out)
{
    wf_kctx k = wf__ops_kctx(ctx);
    return wf__log_softmax_cpu(&k, n->attrs->axis, in[0], *out);
}

/* Per element of x: a max, a subtraction, an exp (~10) and a sum or a division. */
static void cost_softmax(const wf_node *n, double *flops, double *bytes)
{
    *flops = 14.0 * wf__ops_numel(n->inputs[0]->shape);
    *bytes = wf__ops_bytes(n);
}

const wf_op_def wf_op_softmax = {
    .name = "softmax",
    .min_inputs = 1,
    .max_inputs = 1,
    .infer = infer_softmax,
    .kernel = { [WF_KERNEL_CPU] = kernel_softmax, [WF_KERNEL_CUDA] = WF__CUDA_KERNEL(softmax) },
    .cost = cost_softmax,
    .flags = 0,
};

const wf_op_def wf_op_log_softmax = {
    .name = "log_softmax",
    .min_inputs = 1,
    .max_inputs = 1,
    .infer = infer_softmax,
    .kernel = { [WF_KERNEL_CPU] = kernel_log_softmax,
                [WF_KERNEL_CUDA] = WF__CUDA_KERNEL(log_softmax) },
    .cost = cost_softmax,
    .flags = 0,
};

static wf_node *softmax(wf_graph *g, const wf_op_def *op, wf_node *x, int axis)
{
    wf_attrs a;
    memset(&a, 0, sizeof a); /* padding too: equal bags are shared (core/graph.h) */
    a.axis = axis;
    if (x && axis < 0 && axis >= -x->shape.rank)
        a.axis = axis + x->shape.rank;
    return wf__node_add(g, op, &x, 1, &a);
}

wf_node *(wf_softmax)(wf_graph *g, wf_node *x, int axis)
{
    return softmax(g, &wf_op_softmax, x, axis);
}

wf_node *(wf_log_softmax)(wf_graph *g, wf_node *x, int axis)
{
    return softmax(g, &wf_op_log_softmax, x, axis);
}

/* ---- softmax_cross_entropy ------------------------------------------------------------------ */

static int infer_xent(wf_node *n, char *err, size_t errlen)
{
    int rc = check_x(n, "logits", err, errlen);
    if (rc < 0)
        return rc;
    const wf_node *x = n->inputs[0], *l = n->inputs[1];
    char s1[160], s2[160], s3[160];
    if (l->dtype != WF_I32 && l->dtype != WF_I64) {
        snprintf(err, errlen, "labels are %s %s but must be i32 or i64 class indices",
                 wf_dtype_name(l->dtype), wf_shape_str(l->shape, s1, sizeof s1));
        return WF_EDTYPE;
    }
    wf_shape want = { .rank = x->shape.rank - 1 };
    memcpy(want.dims, x->shape.dims, (size_t)want.rank * sizeof want.dims[0]);
    bool fits = l->shape.rank == want.rank;
    for (int d = 0; fits && d < want.rank; d++) {
        fits = wf__ops_dims_fit(want.dims[d], l->shape.dims[d]);
        if (want.dims[d] == -1)
            want.dims[d] = l->shape.dims[d];
    }
    if (!fits) {
        wf_shape_str(x->shape, s1, sizeof s1);
        want.rank = x->shape.rank - 1;
        memcpy(want.dims, x->shape.dims, (size_t)want.rank * sizeof want.dims[0]);
        snprintf(err, errlen, "logits are %s, so labels must be %s, not %s", s1,
                 wf_shape_str(want, s2, sizeof s2), wf_shape_str(l->shape, s3, sizeof s3));
        return WF_ESHAPE;
    }
    n->dtype = x->dtype;
    n->shape = want;
    return 0;
}

static int kernel_xent(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                       wf_tensor **out)
{
    wf_kctx k = wf__ops_kctx(ctx);
    return wf__softmax_cross_entropy_cpu(&k, in[0], in[1], *out);
}

const wf_op_def wf_op_softmax_cross_entropy = {
    .name = "softmax_cross_entropy",
    .min_inputs = 2,
    .max_inputs = 2,
    .infer = infer_xent,
    .kernel = { [WF_KERNEL_CPU] = kernel_xent,
                [WF_KERNEL_CUDA] = WF__CUDA_KERNEL(softmax_cross_entropy) },
    .cost = cost_softmax,
    .flags = 0,
};

wf_node *(wf_softmax_cross_entropy)(wf_graph *g, wf_node *logits, wf_node *labels)
{
    wf_node *in[2] = { logits, labels };
    return wf__node_add(g, &wf_op_softmax_cross_entropy, in, 2, NULL);
}
