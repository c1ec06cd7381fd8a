/* core/op_tp.c: the two ops of tensor (intra-op) parallelism, Megatron's pair (core/op.h):
 *   tp_enter (Megatron's f: the identity forward; its gradient all-reduces over the
 *   tensor-parallel group) and tp_reduce (g: the all-reduce (sum) forward; the identity
 *   gradient), and their constructors wf_tp_enter() / wf_tp_reduce() (weft/core.h).
 * Owns: their defs (arity, inference, flags) and the checks of their attributes; tp_enter's
 *   CPU kernel is the identity that dp_grad uses too (wf__pass_kernel(), core/op_dist.c: its
 *   bytes, or nothing when the planner gave the output input 0's storage, WF_OP_INPLACE).
 * Why here: the split rewrite (placement/tensor_split.c) inserts them as plain graph ops, and
 *   only the layer that owns the network (transport/tp_ops.c) can run tp_reduce, so, as send
 *   and recv (core/op_comm.c), its kernel is registered per session given a communicator.
 * Attributes: both: attrs.edge the key's edge (below 2^15), attrs.peer the group's size (the
 *   communicator's: checked when tp_reduce runs). tp_enter's forward sends nothing; its edge
 *   is the one its gradient (a tp_reduce) uses, and tp_reduce's gradient (a tp_enter) keeps
 *   tp_reduce's edge, so one edge per pair direction is ever on the wire.
 * Not here: the kernel of tp_reduce and its sum order (transport/tp_ops.c), the gradients
 *   (grad/grad_dist.c), the rewrite (placement/tensor_split.c). */
#include "error.h"
#include "graph.h"
#include "internal.h"

#include <stdio.h>

#define MAX_EDGE (1 << 15)

static int infer_tp(wf_node *n, char *err, size_t errlen)
{
    const wf_attrs *a = n->attrs;
    const wf_node *x = n->inputs[0];
    if (a->edge < 0 || a->edge >= MAX_EDGE) {
        snprintf(err, errlen, "edge %d is not in 0 .. %d", (int)a->edge, MAX_EDGE - 1);
        return WF_EINVAL;
    }
    if (a->peer < 1) {
        snprintf(err, errlen, "a tensor-parallel group of %d ranks (at least 1)", (int)a->peer);
        return WF_EINVAL;
    }
    if (x->dtype != WF_F32 && x->dtype != WF_F64) {
        snprintf(err, errlen, "'%s' is %s: only f32 and f64 are reduced", x->name,
                 wf_dtype_name(x->dtype));
        return WF_EDTYPE;
    }
    n->dtype = x->dtype;
    n->shape = x->shape;
    return 0;
}

const wf_op_def wf_op_tp_enter = {
    .name = "tp_enter",
    .min_inputs = 1,
    .max_inputs = 1,
    .infer = infer_tp,
    .kernel = { [WF_KERNEL_CPU] = wf__pass_kernel },
    .flags = WF_OP_INPLACE,
};

const wf_op_def wf_op_tp_reduce = {
    .name = "tp_reduce",
    .min_inputs = 1,
    .max_inputs = 1,
    .infer = infer_tp,
    .flags = WF_OP_STATEFUL | WF_OP_ASYNC | WF_OP_TRANSFER,
};

static wf_node *tp_node(wf_graph *g, const wf_op_def *op, wf_node *x, int size, int edge)
{
    wf_attrs a = { 0 };
    a.peer = size;
    a.edge = edge;
    return wf__node_add(g, op, &x, 1, &a);
}

wf_node *(wf_tp_enter)(wf_graph *g, wf_node *x, int size, int edge)
{
    return tp_node(g, &wf_op_tp_enter, x, size, edge);
}

wf_node *(wf_tp_reduce)(wf_graph *g, wf_node *x, int size, int edge)
{
    return tp_node(g, &wf_op_tp_reduce, x, size, edge);
}
