/* ops/like.c: "reshape_like": dy given the shape of a reference input, read when the node runs,
 * so the gradient of a reshape (or expand_dims, squeeze) works with -1 dimensions anywhere.
 * Owns: wf_op_reshape_like and its internal constructor wf__reshape_like() (ops/table.h).
 * Invariants: the output is a contiguous copy of dy in row-major order (a reshape never
 *   reorders elements); dy and the reference must have the same element count when the node
 *   runs, which inference checks where both are known.
 * Not here: the public reshape (shape.c), gradients (grad/). */
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
