/* core/op_dist.c: the two ops a data-parallel rewrite inserts (core/op.h): shard_rows, which
 * takes one shard's rows of a global batch, and dp_reduce, the deterministic reduction of
 * one gradient bucket (or one fetched scalar) over every shard of every rank.
 * Owns: their defs (arity, inference, flags), the row split of a batch into shards
 *   (wf__shard_rows_range()), shard_rows' CPU kernel (a copy of contiguous rows), and dp_grad,
 *   the reduced gradient of a dp_reduce that reduces in place, and its kernel (wf__pass_kernel(),
 *   the identity that tp_enter, core/op_tp.c, uses too).
 * Why here: the rewrite (placement/replicate.c) inserts them as plain graph ops, and only the
 *   layer that owns the network (transport/coll_ops.c) can run dp_reduce, so, as send and
 *   recv (core/op_comm.c), its kernel is registered per session; shard_rows needs nothing
 *   but memcpy, so its kernel lives with its def.
 * Attributes: shard_rows: begin[0] the shard k, end[0] the shard count S. dp_reduce: begin[0]
 *   the first local shard k0, end[0] the shard count S, step[0] the local shard count b,
 *   axis the aggregation (WF__AGG_*, core/op.h), edge the first of the two key edges the bucket
 * uses; a tree node (in place) also begin[1] .. end[1] its range of local shards, step[1] 1. Not
 * here: the rewrite (placement/), the kernel of dp_reduce and its wire form (transport/coll_ops.c).
 */
#include "error.h"
#include "graph.h"
#include "internal.h"
#include "tensor.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void wf__shard_rows_range(int64_t rows, int64_t k, int64_t shards, int64_t *lo, int64_t *hi)
{
    int64_t base = rows / shards, extra = rows % shards;
    *lo = k * base + (k < extra ? k : extra);
    *hi = *lo + base + (k < extra ? 1 : 0);
}

static int infer_shard_rows(wf_node *n, char *err, size_t errlen)
{
    const wf_attrs *a = n->attrs;
    const wf_node *x = n->inputs[0];
    if (a->end[0] < 1 || a->begin[0] < 0 || a->begin[0] >= a->end[0]) {
        snprintf(err, errlen, "shard %lld of %lld does not exist", (long long)a->begin[0],
                 (long long)a->end[0]);
        return WF_EINVAL;
    }
    if (x->shape.rank < 1) {
        snprintf(err, errlen, "a scalar has no rows to shard");
        return WF_ESHAPE;
    }
    n->dtype = x->dtype;
    n->shape = x->shape;
    int64_t rows = x->shape.dims[0];
    if (rows < 0)
        return 0; /* known at run time */
    if (rows < a->end[0]) {
        snprintf(err, errlen, "the batch has %lld rows, fewer than the %lld shards",
                 (long long)rows, (long long)a->end[0]);
        return WF_ESHAPE;
    }
    int64_t lo, hi;
    wf__shard_rows_range(rows, a->begin[0], a->end[0], &lo, &hi);
    n->shape.dims[0] = hi - lo;
    return 0;
}

static int shard_rows_kernel(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                             wf_tensor **out)
{
    (void)ctx;
    const wf_tensor *x = in[0];
    wf_tensor *o = *out;
    int64_t lo, hi;
    wf__shard_rows_range(x->shape.dims[0], n->attrs->begin[0], n->attrs->end[0], &lo, &hi);
    size_t es = wf_dtype_size(x->dtype);
    size_t row = (size_t)(x->shape.dims[0] ? x->numel / x->shape.dims[0] : 0) * es;
    if (x->contiguous) {
        memcpy(o->data, x->data + (size_t)lo * row, (size_t)(hi - lo) * row);
        return 0;
    }
    size_t all = (size_t)x->numel * es;
    char *tmp = malloc(all ? all : 1);
    if (!tmp)
        return wf__err(WF_ENOMEM, "no memory to gather a strided batch of %zu bytes", all);
    int rc = wf_tensor_read(x, x->dtype, tmp, all);
    if (rc == 0)
        memcpy(o->data, tmp + (size_t)lo * row, (size_t)(hi - lo) * row);
    free(tmp);
    return rc;
}

static void cost_shard_rows(const wf_node *n, double *flops, double *bytes)
{
    int64_t m = wf_shape_numel(n->shape);
    *flops = 0;
    *bytes = 2.0 * (double)(m < 0 ? 1 : m) * (double)wf_dtype_size(n->dtype);
}

const wf_op_def wf_op_shard_rows = {
    .name = "shard_rows",
    .min_inputs = 1,
    .max_inputs = 1,
    .infer = infer_shard_rows,
    .kernel = { [WF_KERNEL_CPU] = shard_rows_kernel },
    .cost = cost_shard_rows,
    .flags = WF_OP_NO_GRAD,
};

int wf__dp_tree_split(int lo, int hi)
{
    int p = 1;
    while (p * 2 < hi - lo)
        p *= 2;
    return lo + p;
}

int wf__dp_reduce_values(const wf_node *n)
{
    const wf_attrs *a = n->attrs;
    if (a->step[1] != 1)
        return a->step[0] > 0 ? (n->n_inputs - 1) / (int)a->step[0] : 0;
    int lo = (int)a->begin[1], hi = (int)a->end[1], m = wf__dp_tree_split(lo, hi);
    int tokens = (m - lo > 1) + (hi - m > 1);
    return (n->n_inputs - 1 - tokens) / 2;
}

/* A tree node's checks (attrs.step[1] 1): its range, in place, and 2 values per tensor (the
 * leaves' tensors where the two halves' sums lie) then a token per half that is no leaf. */
static int infer_dp_tree(wf_node *n, char *err, size_t errlen)
{
    const wf_attrs *a = n->attrs;
    int64_t lo = a->begin[1], hi = a->end[1], b = a->step[0];
    if (!a->keepdims || lo < 0 || hi > b || hi - lo < 2) {
        snprintf(err, errlen,
                 "tree range %lld .. %lld of %lld local shards (in place) is no subtree",
                 (long long)lo, (long long)hi, (long long)b);
        return WF_EINVAL;
    }
    int m = wf__dp_tree_split((int)lo, (int)hi), tokens = (m - lo > 1) + (hi - m > 1);
    int vals = n->n_inputs - 1 - tokens;
    if (vals < 2 || vals % 2) {
        snprintf(err, errlen, "%d inputs for a tree node of %d tokens", n->n_inputs, tokens);
        return WF_EINVAL;
    }
    for (int j = 1; j <= vals; j += 2) {
        const wf_node *v = n->inputs[j], *u = n->inputs[j + 1];
        if (v->dtype != WF_F32 || wf_shape_numel(v->shape) < 0 || u->dtype != v->dtype ||
            !wf_shape_equal(u->shape, v->shape)) {
            snprintf(err, errlen, "values '%s' and '%s' are not both f32 of one static shape",
                     v->name, u->name);
            return WF_ESHAPE;
        }
    }
    n->dtype = WF_F32;
    n->shape = (wf_shape){ .rank = 0 };
    return 0;
}

static int infer_dp_reduce(wf_node *n, char *err, size_t errlen)
{
    const wf_attrs *a = n->attrs;
    int64_t k0 = a->begin[0], shards = a->end[0], b = a->step[0];
    if (shards < 1 || b < 1 || k0 < 0 || k0 + b > shards) {
        snprintf(err, errlen, "local shards %lld .. %lld of %lld do not exist", (long long)k0,
                 (long long)(k0 + b - 1), (long long)shards);
        return WF_EINVAL;
    }
    if (a->axis < WF__AGG_MEAN || a->axis > WF__AGG_SHARD_MEAN) {
        snprintf(err, errlen, "unknown aggregation %d", (int)a->axis);
        return WF_EINVAL;
    }
    if (a->edge < 0 || a->edge + 1 >= (1 << 15)) {
        snprintf(err, errlen, "key edges %d and %d are not below 2^15", (int)a->edge,
                 (int)a->edge + 1);
        return WF_EINVAL;
    }
    if (a->step[1] == 1)
        return infer_dp_tree(n, err, errlen);
    int m = n->n_inputs - 1;
    if (m < 1 || m % b) {
        snprintf(err, errlen, "%d values for %lld local shards", m, (long long)b);
        return WF_EINVAL;
    }
    int64_t total = 0;
    for (int j = 0; j < m; j += (int)b) {
        const wf_node *v = n->inputs[1 + j];
        int64_t c = wf_shape_numel(v->shape);
        if (v->dtype != WF_F32 || c < 0) {
            char sh[160];
            snprintf(err, errlen, "value %d ('%s') is %s %s: only f32 with a static shape", j,
                     v->name, wf_dtype_name(v->dtype), wf_shape_str(v->shape, sh, sizeof sh));
            return c < 0 ? WF_ESHAPE : WF_EDTYPE;
        }
        for (int i = 1; i < b; i++) {
            const wf_node *w = n->inputs[1 + j + i];
            if (w->dtype != v->dtype || !wf_shape_equal(w->shape, v->shape)) {
                snprintf(err, errlen, "the shards of value %d ('%s', '%s') differ in type", j,
                         v->name, w->name);
                return WF_ESHAPE;
            }
        }
        total += c;
    }
    n->dtype = WF_F32;
    n->shape = a->keepdims ? (wf_shape){ .rank = 0 } : (wf_shape){ .rank = 1, .dims = { total } };
    return 0;
}

const wf_op_def wf_op_dp_reduce = {
    .name = "dp_reduce",
    .min_inputs = 2,
    .max_inputs = -1,
    .infer = infer_dp_reduce,
    .flags = WF_OP_STATEFUL | WF_OP_NO_GRAD | WF_OP_ASYNC | WF_OP_TRANSFER,
};

static int infer_dp_grad(wf_node *n, char *err, size_t errlen)
{
    const wf_node *g = n->inputs[0], *r = n->inputs[1];
    if (r->op != &wf_op_dp_reduce || !r->attrs->keepdims) {
        snprintf(err, errlen, "input 1 ('%s') is no dp_reduce that reduces in place", r->name);
        return WF_EINVAL;
    }
    n->dtype = g->dtype;
    n->shape = g->shape;
    return 0;
}

/* The value is input 0's (dp_grad's: reduced in place by then): nothing to do when the planner
 * gave the output input 0's bytes (WF_OP_INPLACE), else a copy. */
int wf__pass_kernel(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                    wf_tensor **out)
{
    (void)ctx;
    (void)n;
    size_t bytes = (size_t)in[0]->numel * wf_dtype_size(in[0]->dtype);
    if ((*out)->data == in[0]->data)
        return 0;
    if (in[0]->contiguous) {
        memcpy((*out)->data, in[0]->data, bytes);
        return 0;
    }
    return wf_tensor_read(in[0], in[0]->dtype, (*out)->data, bytes);
}

const wf_op_def wf_op_dp_grad = {
    .name = "dp_grad",
    .min_inputs = 2,
    .max_inputs = 2,
    .infer = infer_dp_grad,
    .kernel = { [WF_KERNEL_CPU] = wf__pass_kernel },
    .flags = WF_OP_STATEFUL | WF_OP_NO_GRAD | WF_OP_INPLACE,
};
