/* ops/index.c: the indexing ops: gather and one_hot, and scatter_add (gather's gradient):
 * their constructors, dtype and shape inference, costs and op-table entries.
 * Owns: the op defs wf_op_gather, wf_op_one_hot and wf_op_scatter_add (ops/table.h), the
 *   public constructors of weft/ops.h's "Indexing" section and wf_scatter_add() (weft/nn.h).
 * Invariants: as ops/shape.c: every argument check is in inference (messages get the node's
 *   prefix and name every shape); each constructor makes one wf__node_add() call. Index
 *   values are only known when the node runs, so an out-of-range gather index is a kernel
 *   error (WF_EINVAL naming the index), not an inference one.
 * Attributes (core/graph.h's wf_attrs): gather: axis; one_hot: depth and dtype; scatter_add:
 *   axis (an axis of the output, stored non-negative when valid) and depth (its size).
 * Not here: the loops (index_cpu.c), slicing (shape.c), gradients (grad/). */
#include "../core/tensor.h"
#include "internal.h"

#include <stdio.h>
#include <string.h>

#define SH(s, buf) wf_shape_str((s), (buf), sizeof(buf))

static bool is_index_dtype(wf_dtype dt)
{
    return dt == WF_I32 || dt == WF_I64;
}

static void cost_gather(const wf_node *n, double *flops, double *bytes)
{
    /* Reads what it writes plus the indices, not all of params. */
    double out = wf__ops_numel(n->shape) * (double)wf_dtype_size(n->dtype);
    const wf_node *idx = n->inputs[1];
    *flops = 0;
    *bytes = 2 * out + wf__ops_numel(idx->shape) * (double)wf_dtype_size(idx->dtype);
}

static void cost_one_hot(const wf_node *n, double *flops, double *bytes)
{
    *flops = 0;
    *bytes = wf__ops_bytes(n);
}

/* ---- gather -------------------------------------------------------------------------------- */

static int infer_gather(wf_node *n, char *err, size_t errlen)
{
    const wf_node *p = n->inputs[0], *idx = n->inputs[1];
    int pr = p->shape.rank, ir = idx->shape.rank, ax = n->attrs->axis;
    char s1[160], s2[160];
    if (!is_index_dtype(idx->dtype)) {
        snprintf(err, errlen, "params are %s %s but indices are %s %s; indices must be i32 or i64",
                 wf_dtype_name(p->dtype), SH(p->shape, s1), wf_dtype_name(idx->dtype),
                 SH(idx->shape, s2));
        return WF_EDTYPE;
    }
    if (ax < -pr || ax >= pr) {
        snprintf(err, errlen, "params are %s and indices %s; axis %d is outside [%d, %d)",
                 SH(p->shape, s1), SH(idx->shape, s2), ax, -pr, pr);
        return WF_EINVAL;
    }
    if (ax < 0)
        ax += pr;
    if (pr + ir - 1 > WF_MAX_RANK) {
        snprintf(err, errlen, "params are %s and indices %s: the result's rank %d passes %d",
                 SH(p->shape, s1), SH(idx->shape, s2), pr + ir - 1, WF_MAX_RANK);
        return WF_ESHAPE;
    }
    wf_shape s = { .rank = pr + ir - 1 };
    for (int d = 0; d < ax; d++)
        s.dims[d] = p->shape.dims[d];
    for (int d = 0; d < ir; d++)
        s.dims[ax + d] = idx->shape.dims[d];
    for (int d = ax + 1; d < pr; d++)
        s.dims[ir + d - 1] = p->shape.dims[d];
    n->dtype = p->dtype;
    n->shape = s;
    return 0;
}

static int kernel_gather(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                         wf_tensor **out)
{
    wf_kctx k = wf__ops_kctx(ctx);
    int ax = n->attrs->axis;
    if (ax < 0)
        ax += in[0]->shape.rank;
    return wf__gather_cpu(&k, ax, in[0], in[1], *out);
}

const wf_op_def wf_op_gather = {
    .name = "gather",
    .min_inputs = 2,
    .max_inputs = 2,
    .infer = infer_gather,
    .kernel = { [WF_KERNEL_CPU] = kernel_gather, [WF_KERNEL_CUDA] = WF__CUDA_KERNEL(gather) },
    .cost = cost_gather,
};

wf_node *(wf_gather)(wf_graph *g, wf_node *params, wf_node *indices, int axis)
{
    wf_attrs a;
    memset(&a, 0, sizeof a);
    a.axis = axis;
    wf_node *in[2] = { params, indices };
    return wf__node_add(g, &wf_op_gather, in, 2, &a);
}

/* ---- one_hot ------------------------------------------------------------------------------- */

static int infer_one_hot(wf_node *n, char *err, size_t errlen)
{
    const wf_node *idx = n->inputs[0];
    wf_dtype dt = n->attrs->dtype;
    int64_t depth = n->attrs->depth;
    char s1[160];
    if (!is_index_dtype(idx->dtype)) {
        snprintf(err, errlen, "indices are %s %s but must be i32 or i64", wf_dtype_name(idx->dtype),
                 SH(idx->shape, s1));
        return WF_EDTYPE;
    }
    if (dt == WF_DTYPE_INVALID || wf_dtype_size(dt) == 0) {
        snprintf(err, errlen, "indices are %s; the dtype %d is not a wf_dtype", SH(idx->shape, s1),
                 (int)dt);
        return WF_EINVAL;
    }
    if (depth < 0 || idx->shape.rank >= WF_MAX_RANK) {
        snprintf(err, errlen, "indices are %s; depth %lld must be >= 0 and the rank below %d",
                 SH(idx->shape, s1), (long long)depth, WF_MAX_RANK);
        return WF_EINVAL;
    }
    wf_shape s = idx->shape;
    s.dims[s.rank++] = depth;
    n->dtype = dt;
    n->shape = s;
    return 0;
}

static int kernel_one_hot(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                          wf_tensor **out)
{
    wf_kctx k = wf__ops_kctx(ctx);
    (void)n;
    return wf__one_hot_cpu(&k, in[0], *out);
}

const wf_op_def wf_op_one_hot = {
    .name = "one_hot",
    .min_inputs = 1,
    .max_inputs = 1,
    .infer = infer_one_hot,
    .kernel = { [WF_KERNEL_CPU] = kernel_one_hot, [WF_KERNEL_CUDA] = WF__CUDA_KERNEL(one_hot) },
    .cost = cost_one_hot,
    .flags = WF_OP_NO_GRAD,
};

wf_node *(wf_one_hot)(wf_graph *g, wf_node *indices, int64_t depth, wf_dtype dtype)
{
    wf_attrs a;
    memset(&a, 0, sizeof a);
    a.depth = depth;
    a.dtype = dtype;
    return wf__node_add(g, &wf_op_one_hot, &indices, 1, &a);
}

/* ---- scatter_add ----------------------------------------------------------------------------- */

static int infer_scatter_add(wf_node *n, char *err, size_t errlen)
{
    const wf_node *u = n->inputs[0], *idx = n->inputs[1];
    int ur = u->shape.rank, ir = idx->shape.rank, r = ur - ir + 1, ax = n->attrs->axis;
    int64_t dim = n->attrs->depth;
    char s1[160], s2[160];
    if (!is_index_dtype(idx->dtype)) {
        snprintf(err, errlen, "updates are %s %s but indices are %s %s; indices must be i32 or i64",
                 wf_dtype_name(u->dtype), SH(u->shape, s1), wf_dtype_name(idx->dtype),
                 SH(idx->shape, s2));
        return WF_EDTYPE;
    }
    if (!wf__ops_dtype_ok(u->dtype, true))
        return wf__ops_bad_dtype(n, 1, "updates", true, err, errlen);
    if (r < 1 || ax < -r || ax >= r || dim < 0) {
        snprintf(err, errlen,
                 "updates are %s and indices %s; axis %d (of a rank-%d result) or dim %lld is "
                 "out of range",
                 SH(u->shape, s1), SH(idx->shape, s2), ax, r, (long long)dim);
        return r < 1 ? WF_ESHAPE : WF_EINVAL;
    }
    if (ax < 0)
        ax += r;
    bool fits = true;
    for (int d = 0; fits && d < ir; d++)
        fits = wf__ops_dims_fit(u->shape.dims[ax + d], idx->shape.dims[d]);
    if (!fits) {
        snprintf(err, errlen,
                 "updates are %s but indices %s: updates' dimensions %d.. must be "
                 "the indices' shape",
                 SH(u->shape, s1), SH(idx->shape, s2), ax);
        return WF_ESHAPE;
    }
    wf_shape s = { .rank = r };
    for (int d = 0; d < r; d++)
        s.dims[d] = d < ax ? u->shape.dims[d] : d == ax ? dim : u->shape.dims[d + ir - 1];
    n->dtype = u->dtype;
    n->shape = s;
    return 0;
}

static int kernel_scatter_add(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                              wf_tensor **out)
{
    wf_kctx k = wf__ops_kctx(ctx);
    int ax = n->attrs->axis;
    if (ax < 0)
        ax += (*out)->shape.rank;
    return wf__scatter_add_cpu(&k, ax, in[0], in[1], *out);
}

/* One add per update, the output written once (zeroes), the indices read. */
static void cost_scatter_add(const wf_node *n, double *flops, double *bytes)
{
    *flops = wf__ops_numel(n->inputs[0]->shape);
    *bytes = wf__ops_bytes(n);
}

const wf_op_def wf_op_scatter_add = {
    .name = "scatter_add",
    .min_inputs = 2,
    .max_inputs = 2,
    .infer = infer_scatter_add,
    .kernel = { [WF_KERNEL_CPU] = kernel_scatter_add,
                [WF_KERNEL_CUDA] = WF__CUDA_KERNEL(scatter_add) },
    .cost = cost_scatter_add,
};

wf_node *(wf_scatter_add)(wf_graph *g, wf_node *updates, wf_node *indices, int axis, int64_t dim)
{
    wf_attrs a;
    memset(&a, 0, sizeof a);
    a.axis = axis;
    a.depth = dim;
    if (updates && indices) {
        int r = updates->shape.rank - indices->shape.rank + 1;
        if (r >= 1 && axis < 0 && axis >= -r)
            a.axis = axis + r;
    }
    wf_node *in[2] = { updates, indices };
    return wf__node_add(g, &wf_op_scatter_add, in, 2, &a);
}
