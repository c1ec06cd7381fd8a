/* ops/matmul.c: the matmul op: validation, shape inference (2-D and batched, transpose flags,
 * NumPy broadcasting of the batch axes, -1 dimensions), cost, and its op-table entry; and
 * matmul_epilogue, matmul with a bias row and an activation applied to each output tile.
 * Owns: wf_op_matmul (ops/table.h), wf_matmul() and wf_matmul_ex(); wf_op_matmul_epilogue.
 * Invariant: inference accepts exactly what wf__matmul_cpu() accepts once -1 dimensions are
 *   known, so a static graph that builds runs (short of a fed shape that contradicts it).
 * Why matmul_epilogue is an op of its own and not matmul with optional inputs: it exists
 *   only in compiled plans (runtime/compile/pass_epilogue.c makes it after wf_gradients() has run,
 *   so it needs no gradient and no constructor), and code that reads a node of op matmul
 *   (its gradient, a pass, the cost model) may keep assuming a plain product of two inputs.
 *   For the same reason it is not in wf__ops_table (no saved graph or tool can name it).
 * Not here: the GEMM and the epilogue (matmul_cpu.c), the gradient (grad/), which nodes get
 *   an epilogue (runtime/compile/pass_epilogue.c). */
#include "internal.h"

#include <stdio.h>
#include <string.h>

static int infer_matmul(wf_node *n, char *err, size_t errlen)
{
    const wf_node *a = n->inputs[0], *b = n->inputs[1];
    bool ta = n->attrs->transpose_a, tb = n->attrs->transpose_b;
    char sa[160], sb[160];
    wf_shape_str(a->shape, sa, sizeof sa);
    wf_shape_str(b->shape, sb, sizeof sb);
    if (a->dtype != b->dtype) {
        snprintf(err, errlen,
                 "a is %s %s but b is %s %s: the dtypes must be equal (no implicit promotion; "
                 "convert one with wf_cast)",
                 wf_dtype_name(a->dtype), sa, wf_dtype_name(b->dtype), sb);
        return WF_EDTYPE;
    }
    if (!wf_dtype_is_float(a->dtype))
        return wf__ops_bad_dtype(n, 2, "a and b", false, err, errlen);
    int ra = a->shape.rank, rb = b->shape.rank;
    if (ra < 2 || rb < 2) {
        snprintf(err, errlen, "a is %s and b is %s; both need rank >= 2", sa, sb);
        return WF_ESHAPE;
    }
    int64_t M = a->shape.dims[ra - (ta ? 1 : 2)], K = a->shape.dims[ra - (ta ? 2 : 1)];
    int64_t Kb = b->shape.dims[rb - (tb ? 1 : 2)], N = b->shape.dims[rb - (tb ? 2 : 1)];
    if (!wf__ops_dims_fit(K, Kb)) {
        snprintf(err, errlen, "a is %s%s but b is %s%s: inner dimensions %lld and %lld differ", sa,
                 ta ? " (transposed)" : "", sb, tb ? " (transposed)" : "", (long long)K,
                 (long long)Kb);
        return WF_ESHAPE;
    }
    wf_shape ba = { .rank = ra - 2 }, bb = { .rank = rb - 2 }, out;
    memcpy(ba.dims, a->shape.dims, (size_t)ba.rank * sizeof ba.dims[0]);
    memcpy(bb.dims, b->shape.dims, (size_t)bb.rank * sizeof bb.dims[0]);
    if (wf_shape_broadcast(ba, bb, &out) < 0 || out.rank + 2 > WF_MAX_RANK) {
        snprintf(err, errlen, "a is %s and b is %s: the batch axes do not broadcast", sa, sb);
        return WF_ESHAPE;
    }
    out.dims[out.rank++] = M;
    out.dims[out.rank++] = N;
    n->dtype = a->dtype;
    n->shape = out;
    return 0;
}

static int kernel_matmul(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                         wf_tensor **out)
{
    wf_kctx k = wf__ops_kctx(ctx);
    return wf__matmul_cpu(&k, n->attrs->transpose_a, n->attrs->transpose_b, in[0], in[1], *out);
}

/* 2 M N K flops per batch matrix: the output's elements times 2K. */
static void cost_matmul(const wf_node *n, double *flops, double *bytes)
{
    const wf_node *a = n->inputs[0];
    int64_t K = a->shape.dims[a->shape.rank - (n->attrs->transpose_a ? 2 : 1)];
    *flops = 2.0 * wf__ops_numel(n->shape) * (K >= 0 ? (double)K : 1.0);
    *bytes = wf__ops_bytes(n);
}

const wf_op_def wf_op_matmul = {
    .name = "matmul",
    .min_inputs = 2,
    .max_inputs = 2,
    .infer = infer_matmul,
    .kernel = { [WF_KERNEL_CPU] = kernel_matmul, [WF_KERNEL_CUDA] = WF__CUDA_KERNEL(matmul) },
    .cost = cost_matmul,
    .flags = 0,
};

/* matmul_epilogue: inputs a, b and optionally the bias; attributes those of matmul plus
 * 'axis' = the activation's wf_unary_op + 1 (0: none), 'alpha' (the activation's) and
 * 'groups' 1 when the add was bias + product (ops/table.h). */
wf_epilogue wf__matmul_epilogue_of(const wf_node *n)
{
    wf_epilogue ep = { .act = n->attrs->axis - 1,
                       .alpha = n->attrs->alpha,
                       .bias_first = n->attrs->groups == 1 };
    return ep;
}

static int infer_matmul_epilogue(wf_node *n, char *err, size_t errlen)
{
    int rc = infer_matmul(n, err, errlen);
    if (rc < 0)
        return rc;
    wf_epilogue ep = wf__matmul_epilogue_of(n);
    if (ep.act != -1 && ep.act != WF_UNARY_RELU && ep.act != WF_UNARY_LEAKY_RELU &&
        ep.act != WF_UNARY_GELU_ERF && ep.act != WF_UNARY_GELU_TANH && ep.act != WF_UNARY_TANH &&
        ep.act != WF_UNARY_SIGMOID && ep.act != WF_UNARY_SILU) {
        snprintf(err, errlen,
                 "activation %d is not relu, leaky_relu, gelu, gelu_tanh, tanh, sigmoid or silu",
                 ep.act);
        return WF_EINVAL;
    }
    if (n->n_inputs < 3)
        return 0;
    const wf_node *bias = n->inputs[2];
    char sb[160], so[160];
    wf_shape_str(bias->shape, sb, sizeof sb);
    wf_shape_str(n->shape, so, sizeof so);
    if (bias->dtype != n->dtype) {
        snprintf(err, errlen, "the bias is %s %s but the product is %s %s",
                 wf_dtype_name(bias->dtype), sb, wf_dtype_name(n->dtype), so);
        return WF_EDTYPE;
    }
    int r = bias->shape.rank;
    bool ok = r >= 1 && r <= n->shape.rank;
    for (int d = 0; ok && d < r - 1; d++)
        ok = bias->shape.dims[d] == 1;
    if (ok) {
        int64_t bn = bias->shape.dims[r - 1];
        ok = bn == 1 || wf__ops_dims_fit(bn, n->shape.dims[n->shape.rank - 1]);
    }
    if (!ok) {
        snprintf(err, errlen,
                 "the bias is %s but the product is %s: a bias is one row ([N], or 1 in every "
                 "dimension but the last, which is N or 1)",
                 sb, so);
        return WF_ESHAPE;
    }
    return 0;
}

static int kernel_matmul_epilogue(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                                  wf_tensor **out)
{
    wf_kctx k = wf__ops_kctx(ctx);
    wf_epilogue ep = wf__matmul_epilogue_of(n);
    return wf__matmul_epilogue_cpu(&k, n->attrs->transpose_a, n->attrs->transpose_b, &ep, in[0],
                                   in[1], n->n_inputs > 2 ? in[2] : NULL, *out);
}

/* matmul's flops plus one per output element for the bias and a few for the activation (the
 * elementwise ops' own costs: ops/elementwise.c). */
static void cost_matmul_epilogue(const wf_node *n, double *flops, double *bytes)
{
    cost_matmul(n, flops, bytes);
    wf_epilogue ep = wf__matmul_epilogue_of(n);
    double per = (n->n_inputs > 2 ? 1.0 : 0.0) + (ep.act < 0                ? 0.0
                                                  : ep.act == WF_UNARY_RELU ? 1.0
                                                                            : 16.0);
    *flops += per * wf__ops_numel(n->shape);
}

const wf_op_def wf_op_matmul_epilogue = {
    .name = "matmul_epilogue",
    .min_inputs = 2,
    .max_inputs = 3,
    .infer = infer_matmul_epilogue,
    .kernel = { [WF_KERNEL_CPU] = kernel_matmul_epilogue,
                [WF_KERNEL_CUDA] = WF__CUDA_KERNEL(matmul_epilogue) },
    .cost = cost_matmul_epilogue,
    .flags = 0,
};

wf_node *(wf_matmul_ex)(wf_graph *g, wf_node *a, wf_node *b, bool transpose_a, bool transpose_b)
{
    wf_attrs at;
    memset(&at, 0, sizeof at); /* padding too: equal bags are shared (core/graph.h) */
    at.transpose_a = transpose_a;
    at.transpose_b = transpose_b;
    wf_node *in[2] = { a, b };
    return wf__node_add(g, &wf_op_matmul, in, 2, &at);
}

wf_node *(wf_matmul)(wf_graph *g, wf_node *a, wf_node *b)
{
    wf_node *in[2] = { a, b };
    return wf__node_add(g, &wf_op_matmul, in, 2, NULL);
}
