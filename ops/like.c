/* ops/like.c: the backward helpers whose output takes the shape of a reference input, read
 * when the node runs, so gradients work with -1 dimensions anywhere:
 *   "reshape_like": dy given the reference's shape (the gradient of reshape, expand_dims,
 *   squeeze);
 *   "sum_like": dx (a gradient in the broadcast shape of an op's output) summed back to the
 *   reference's shape, with the axes to sum decided from the run-time shapes (as
 *   TensorFlow's BroadcastGradientArgs or PyTorch's sum_to_size): a -1 dimension of the
 *   reference that is 1 when the graph runs is summed, one that is not is kept.
 * Owns: wf_op_reshape_like, wf_op_sum_like and their internal constructors (ops/table.h).
 * Invariants: reshape_like's output is a contiguous copy of dy in row-major order (a reshape
 *   never reorders elements); dy and the reference must have the same element count when the
 *   node runs, which inference checks where both are known. sum_like sums exactly as the
 *   nodes grad/ makes where the shapes are known (the size-1 axes with keepdims first, then
 *   the leading axes, both with wf__reduce_cpu()), so a static graph with -1 dimensions and
 *   an eager one give the same bits.
 * Not here: the public reshape (shape.c), the reductions (reduce_cpu.c), gradients (grad/). */
#include "../core/error.h"
#include "../core/tensor.h"
#include "internal.h"

#include <stdio.h>
#include <string.h>

static int infer_reshape_like(wf_node *n, char *err, size_t errlen)
{
    const wf_node *dy = n->inputs[0], *ref = n->inputs[1];
    int64_t a = wf_shape_numel(dy->shape), b = wf_shape_numel(ref->shape);
    if (a >= 0 && b >= 0 && a != b) {
        char s1[160], s2[160];
        snprintf(err, errlen, "dy %s has %lld elements but the reference %s has %lld",
                 wf_shape_str(dy->shape, s1, sizeof s1), (long long)a,
                 wf_shape_str(ref->shape, s2, sizeof s2), (long long)b);
        return WF_ESHAPE;
    }
    n->dtype = dy->dtype;
    n->shape = ref->shape;
    return 0;
}

static int kernel_reshape_like(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                               wf_tensor **out)
{
    (void)ctx;
    (void)n;
    wf_tensor *o = *out;
    if (in[0]->numel != o->numel) {
        char s1[160], s2[160];
        return wf__err(WF_ESHAPE, "dy %s has %lld elements but the reference %s has %lld",
                       wf_shape_str(in[0]->shape, s1, sizeof s1), (long long)in[0]->numel,
                       wf_shape_str(o->shape, s2, sizeof s2), (long long)o->numel);
    }
    return wf_tensor_read(in[0], o->dtype, o->data, (size_t)o->numel * wf_dtype_size(o->dtype));
}

static void cost_reshape_like(const wf_node *n, double *flops, double *bytes)
{
    *flops = 0;
    *bytes = 2 * wf__ops_numel(n->shape) * (double)wf_dtype_size(n->dtype);
}

const wf_op_def wf_op_reshape_like = {
    .name = "reshape_like",
    .min_inputs = 2,
    .max_inputs = 2,
    .infer = infer_reshape_like,
    .kernel = { [WF_KERNEL_CPU] = kernel_reshape_like,
                [WF_KERNEL_CUDA] = WF__CUDA_KERNEL(reshape_like) },
    .cost = cost_reshape_like,
    .flags = 0,
};

wf_node *wf__reshape_like(wf_graph *g, wf_node *dy, wf_node *ref)
{
    wf_node *in[2] = { dy, ref };
    return wf__node_add(g, &wf_op_reshape_like, in, 2, NULL);
}

/* ---- sum_like ------------------------------------------------------------------------------ */

/* dx's shape broadcast from ref's: ref's rank is at most dx's and, right-aligned, each of its
 * dimensions is 1 or dx's (where either is unknown, it may be). */
static bool sums_to(wf_shape dx, wf_shape ref)
{
    if (ref.rank > dx.rank)
        return false;
    for (int d = 0, lead = dx.rank - ref.rank; d < ref.rank; d++) {
        int64_t r = ref.dims[d], x = dx.dims[d + lead];
        if (r != 1 && !wf__ops_dims_fit(r, x))
            return false;
    }
    return true;
}

static int infer_sum_like(wf_node *n, char *err, size_t errlen)
{
    const wf_node *dx = n->inputs[0], *ref = n->inputs[1];
    if (!wf_dtype_is_float(dx->dtype)) {
        snprintf(err, errlen, "dx is %s: only floating gradients are summed",
                 wf_dtype_name(dx->dtype));
        return WF_EDTYPE;
    }
    if (!sums_to(dx->shape, ref->shape)) {
        char s1[160], s2[160];
        snprintf(err, errlen, "dx %s is not a broadcast of the reference %s",
                 wf_shape_str(dx->shape, s1, sizeof s1), wf_shape_str(ref->shape, s2, sizeof s2));
        return WF_ESHAPE;
    }
    n->dtype = dx->dtype;
    n->shape = ref->shape;
    return 0;
}

static int kernel_sum_like(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                           wf_tensor **out)
{
    (void)n;
    const wf_tensor *dx = in[0];
    wf_tensor *o = *out;
    wf_shape ds = dx->shape, os = o->shape;
    char s1[160], s2[160];
    if (dx->dtype != o->dtype || !sums_to(ds, os) || wf_shape_numel(os) < 0)
        return wf__err(WF_ESHAPE, "sum_like: dx %s %s does not sum to %s %s",
                       wf_dtype_name(dx->dtype), wf_shape_str(ds, s1, sizeof s1),
                       wf_dtype_name(o->dtype), wf_shape_str(os, s2, sizeof s2));
    int lead = ds.rank - os.rank, ones[WF_MAX_RANK], m = 0, leads[WF_MAX_RANK];
    for (int d = lead; d < ds.rank; d++) {
        if (os.dims[d - lead] != ds.dims[d]) { /* sums_to: the reference has 1 there */
            ones[m++] = d;
        }
    }
    for (int d = 0; d < lead; d++)
        leads[d] = d;
    if (m == 0 && lead == 0)
        return wf_tensor_read(dx, o->dtype, o->data, (size_t)o->numel * wf_dtype_size(o->dtype));
    wf_kctx k = wf__ops_kctx(ctx);
    if (lead == 0)
        return wf__reduce_cpu(&k, WF__REDUCE_SUM, ones, m, true, dx, o);
    if (m == 0)
        return wf__reduce_cpu(&k, WF__REDUCE_SUM, leads, lead, false, dx, o);
    wf_shape mid = ds; /* dx with its size-1 axes summed, as grad/'s first reduce_sum */
    for (int i = 0; i < m; i++)
        mid.dims[ones[i]] = 1;
    wf_tensor *t = wf__tensor_alloc(dx->dtype, mid);
    if (!t)
        return WF_ENOMEM;
    int rc = wf__reduce_cpu(&k, WF__REDUCE_SUM, ones, m, true, dx, t);
    if (rc >= 0)
        rc = wf__reduce_cpu(&k, WF__REDUCE_SUM, leads, lead, false, t, o);
    wf_tensor_release(t);
    return rc;
}

/* One add per element of dx. */
static void cost_sum_like(const wf_node *n, double *flops, double *bytes)
{
    *flops = wf__ops_numel(n->inputs[0]->shape);
    *bytes = wf__ops_bytes(n);
}

/* No CUDA twin: grad/ makes this node only where a -1 dimension leaves the summed axes open
 * at build time (where they are known it makes reduce_sum nodes), and a NULL slot keeps the
 * node on the host (placement). */
const wf_op_def wf_op_sum_like = {
    .name = "sum_like",
    .min_inputs = 2,
    .max_inputs = 2,
    .infer = infer_sum_like,
    .kernel = { [WF_KERNEL_CPU] = kernel_sum_like },
    .cost = cost_sum_like,
    .flags = 0,
};

wf_node *wf__sum_like(wf_graph *g, wf_node *dx, wf_node *ref)
{
    wf_node *in[2] = { dx, ref };
    return wf__node_add(g, &wf_op_sum_like, in, 2, NULL);
}
