/* ops/norm.c: layer normalization: layer_norm and layer_norm_backward_input: their
 * constructors, dtype and shape inference, costs and op-table entries.
 * Owns: wf_op_layer_norm and wf_op_layer_norm_backward_input (ops/table.h) and their public
 *   constructors (weft/nn.h).
 * Invariants: as the other op files: every argument check is in inference (messages get the
 *   node's prefix and name every shape), each constructor calls wf__node_add() once. The
 *   begin axis is stored non-negative when valid (equal nodes, equal bags); an invalid one is
 *   kept for inference to name. Optional inputs: layer_norm's inputs are x, then gamma if
 *   given, then beta if given, and the attribute 'groups' says which are there (bit 0 gamma,
 *   bit 1 beta: one op covers the four cases, and grad/ reads the bits to know which input
 *   is which); layer_norm_backward_input's are x, dy, then gamma if given (its arity says).
 * Not here: the row loops (norm_cpu.c), the gradient function (grad/). */
#include "../core/tensor.h"
#include "internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define LN_GAMMA 1 /* bits of attrs->groups (layer_norm) */
#define LN_BETA  2

#define SH(s, buf) wf_shape_str((s), (buf), sizeof(buf))

/* x floating of rank >= 1, a valid begin axis and eps; '*norm' = x.shape[begin:]. */
static int check_x(const wf_node *n, wf_shape *norm, char *err, size_t errlen)
{
    const wf_node *x = n->inputs[0];
    int r = x->shape.rank, b = n->attrs->axis;
    double eps = n->attrs->epsilon;
    char s1[160];
    if (!wf_dtype_is_float(x->dtype))
        return wf__ops_bad_dtype(n, 1, "x", false, err, errlen);
    if (r == 0) {
        snprintf(err, errlen, "x is a scalar []; %s needs rank >= 1", n->op->name);
        return WF_ESHAPE;
    }
    if (b < -r || b >= r) {
        snprintf(err, errlen, "x is %s; begin axis %d is outside [%d, %d)", SH(x->shape, s1), b, -r,
                 r);
        return WF_EINVAL;
    }
    if (!(eps >= 0) || !isfinite(eps)) {
        snprintf(err, errlen, "x is %s; eps %g must be finite and >= 0", SH(x->shape, s1), eps);
        return WF_EINVAL;
    }
    if (b < 0)
        b += r;
    norm->rank = r - b;
    for (int d = 0; d < norm->rank; d++)
        norm->dims[d] = x->shape.dims[b + d];
    return 0;
}

/* Input 'i' (named 'what') must be x's dtype and the shape 'want' (x.shape[begin:] or x's). */
static int check_like(const wf_node *n, int i, const char *what, wf_shape want, char *err,
                      size_t errlen)
{
    const wf_node *x = n->inputs[0], *p = n->inputs[i];
    char s1[160], s2[160], s3[160];
    bool fits = p->shape.rank == want.rank;
    for (int d = 0; fits && d < want.rank; d++)
        fits = wf__ops_dims_fit(p->shape.dims[d], want.dims[d]);
    if (p->dtype == x->dtype && fits)
        return 0;
    snprintf(err, errlen, "x is %s %s, so %s must be %s %s, not %s %s", wf_dtype_name(x->dtype),
             SH(x->shape, s1), what, wf_dtype_name(x->dtype), SH(want, s2), wf_dtype_name(p->dtype),
             SH(p->shape, s3));
    return p->dtype != x->dtype ? WF_EDTYPE : WF_ESHAPE;
}

static int infer_layer_norm(wf_node *n, char *err, size_t errlen)
{
    wf_shape norm;
    int rc = check_x(n, &norm, err, errlen), mask = n->attrs->groups, i = 1;
    if (rc < 0)
        return rc;
    int want = 1 + !!(mask & LN_GAMMA) + !!(mask & LN_BETA);
    if ((mask & ~(LN_GAMMA | LN_BETA)) || n->n_inputs != want) {
        snprintf(err, errlen, "%d inputs but the affine bits %d say %d", n->n_inputs, mask, want);
        return WF_EINVAL;
    }
    if ((mask & LN_GAMMA) && (rc = check_like(n, i++, "gamma", norm, err, errlen)) < 0)
        return rc;
    if ((mask & LN_BETA) && (rc = check_like(n, i, "beta", norm, err, errlen)) < 0)
        return rc;
    n->dtype = n->inputs[0]->dtype;
    n->shape = n->inputs[0]->shape;
    return 0;
}

static int begin_axis(const wf_node *n, const wf_tensor *x)
{
    int b = n->attrs->axis;
    return b < 0 ? b + x->shape.rank : b;
}

static int kernel_layer_norm(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                             wf_tensor **out)
{
    wf_kctx k = wf__ops_kctx(ctx);
    int mask = n->attrs->groups, i = 1;
    const wf_tensor *gamma = mask & LN_GAMMA ? in[i++] : NULL;
    const wf_tensor *beta = mask & LN_BETA ? in[i] : NULL;
    return wf__layer_norm_cpu(&k, begin_axis(n, in[0]), n->attrs->epsilon, in[0], gamma, beta,
                              *out);
}

/* Per element: two passes for the statistics, a subtraction, a product, scale and shift. */
static void cost_layer_norm(const wf_node *n, double *flops, double *bytes)
{
    wf__ops_cost_elementwise(n, 8, flops, bytes);
}

const wf_op_def wf_op_layer_norm = {
    .name = "layer_norm",
    .min_inputs = 1,
    .max_inputs = 3,
    .infer = infer_layer_norm,
    .kernel = { [WF_KERNEL_CPU] = kernel_layer_norm,
                [WF_KERNEL_CUDA] = WF__CUDA_KERNEL(layer_norm) },
    .cost = cost_layer_norm,
};

static wf_attrs ln_attrs(const wf_node *x, int begin, double eps)
{
    wf_attrs a;
    memset(&a, 0, sizeof a); /* padding too: equal bags are shared (core/graph.h) */
    a.axis = begin;
    if (x && begin < 0 && begin >= -x->shape.rank)
        a.axis = begin + x->shape.rank;
    a.epsilon = eps;
    return a;
}

wf_node *(wf_layer_norm)(wf_graph *g, wf_node *x, wf_node *gamma, wf_node *beta, int begin_axis,
                         double eps)
{
    wf_attrs a = ln_attrs(x, begin_axis, eps);
    wf_node *in[3] = { x, NULL, NULL };
    int k = 1;
    if (gamma) {
        a.groups |= LN_GAMMA;
        in[k++] = gamma;
    }
    if (beta) {
        a.groups |= LN_BETA;
        in[k++] = beta;
    }
    return wf__node_add(g, &wf_op_layer_norm, in, k, &a);
}

/* ---- layer_norm_backward_input ------------------------------------------------------------ */

static int infer_ln_backward(wf_node *n, char *err, size_t errlen)
{
    wf_shape norm;
    int rc = check_x(n, &norm, err, errlen);
    if (rc < 0)
        return rc;
    const wf_node *x = n->inputs[0], *dy = n->inputs[1];
    if ((rc = check_like(n, 1, "dy", x->shape, err, errlen)) < 0)
        return rc;
    if (n->n_inputs == 3 && (rc = check_like(n, 2, "gamma", norm, err, errlen)) < 0)
        return rc;
    wf_shape s = x->shape;
    for (int d = 0; d < s.rank; d++)
        if (s.dims[d] == -1)
            s.dims[d] = dy->shape.dims[d];
    n->dtype = x->dtype;
    n->shape = s;
    return 0;
}

static int kernel_ln_backward(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                              wf_tensor **out)
{
    wf_kctx k = wf__ops_kctx(ctx);
    return wf__layer_norm_backward_input_cpu(&k, begin_axis(n, in[0]), n->attrs->epsilon, in[0],
                                             n->n_inputs == 3 ? in[2] : NULL, in[1], *out);
}

/* Per element: the statistics again, xhat, two row means and the combination. */
static void cost_ln_backward(const wf_node *n, double *flops, double *bytes)
{
    wf__ops_cost_elementwise(n, 14, flops, bytes);
}

const wf_op_def wf_op_layer_norm_backward_input = {
    .name = "layer_norm_backward_input",
    .min_inputs = 2,
    .max_inputs = 3,
    .infer = infer_ln_backward,
    .kernel = { [WF_KERNEL_CPU] = kernel_ln_backward,
                [WF_KERNEL_CUDA] = WF__CUDA_KERNEL(layer_norm_backward_input) },
    .cost = cost_ln_backward,
};

wf_node *(wf_layer_norm_backward_input)(wf_graph *g, wf_node *x, wf_node *gamma, wf_node *dy,
                                        int begin_axis, double eps)
{
    wf_attrs a = ln_attrs(x, begin_axis, eps);
    wf_node *in[3] = { x, dy, gamma };
    return wf__node_add(g, &wf_op_layer_norm_backward_input, in, gamma ? 3 : 2, &a);
}
