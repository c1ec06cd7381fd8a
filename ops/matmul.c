/* ops/matmul.c: the matmul op: validation, shape inference (2-D and batched, transpose flags,
 * NumPy broadcasting of the batch axes, -1 dimensions), cost, and its op-table entry.
 * Owns: wf_op_matmul (ops/table.h), wf_matmul() and wf_matmul_ex().
 * Invariant: inference accepts exactly what wf__matmul_cpu() accepts once -1 dimensions are
 *   known, so a static graph that builds runs (short of a fed shape that contradicts it).
 * Not here: the GEMM (matmul_cpu.c), the gradient (grad/), fused epilogues (runtime/). */
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
    .kernel = { [WF_KERNEL_CPU] = kernel_matmul },
    .cost = cost_matmul,
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
