/* core/op_ps.c: the three ops the parameter-server rewrite inserts (core/op.h): ps_assign,
 * which writes a value a worker pulled from its server into the worker's copy of a variable,
 * ps_join, input 0's value once every other input exists (a scalar that must come after
 *   the sends that carry it, or a token that stands for the whole step of a rank), and
 *   ps_note, an asynchronous server's reply header on a worker (the runtime's kernel records
 *   it).
 * Owns: their defs (arity, inference, flags) and CPU kernels (copies).
 * Why here: the rewrite (placement/ps.c) may use only core and ops, and neither op needs more
 *   than memcpy; the transfers around them are plain send and recv nodes (core/op_comm.c).
 * Not here: the rewrite (placement/ps.c), the transfers (transport/p2p_ops.c). */
#include "error.h"
#include "graph.h"
#include "internal.h"
#include "tensor.h"

#include <stdio.h>
#include <string.h>

static int infer_ps_assign(wf_node *n, char *err, size_t errlen)
{
    const wf_node *v = n->inputs[0], *x = n->inputs[1];
    if (v->dtype != x->dtype || !wf_shape_equal(v->shape, x->shape)) {
        char a[160], b[160];
        snprintf(err, errlen, "variable '%s' is %s %s but the value '%s' is %s %s", v->name,
                 wf_dtype_name(v->dtype), wf_shape_str(v->shape, a, sizeof a), x->name,
                 wf_dtype_name(x->dtype), wf_shape_str(x->shape, b, sizeof b));
        return WF_ESHAPE;
    }
    n->dtype = v->dtype;
    n->shape = v->shape;
    return 0;
}

static int ps_assign_kernel(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                            wf_tensor **out)
{
    (void)ctx;
    (void)n;
    (void)out; /* the node's value is the variable's (core/op.h: n_assign) */
    size_t bytes = (size_t)in[0]->numel * wf_dtype_size(in[0]->dtype);
    if (in[1]->contiguous) {
        memcpy(in[0]->data, in[1]->data, bytes);
        return 0;
    }
    return wf_tensor_read(in[1], in[0]->dtype, in[0]->data, bytes);
}

const wf_op_def wf_op_ps_assign = {
    .name = "ps_assign",
    .min_inputs = 2,
    .max_inputs = 2,
    .infer = infer_ps_assign,
    .kernel = { [WF_KERNEL_CPU] = ps_assign_kernel },
    .flags = WF_OP_STATEFUL | WF_OP_NO_GRAD,
    .n_assign = 1,
};

static int infer_ps_join(wf_node *n, char *err, size_t errlen)
{
    (void)err;
    (void)errlen;
    n->dtype = n->inputs[0]->dtype;
    n->shape = n->inputs[0]->shape;
    return 0;
}

static int ps_join_kernel(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                          wf_tensor **out)
{
    (void)ctx;
    (void)n;
    size_t bytes = (size_t)in[0]->numel * wf_dtype_size(in[0]->dtype);
    if (in[0]->contiguous) {
        memcpy((*out)->data, in[0]->data, bytes);
        return 0;
    }
    return wf_tensor_read(in[0], in[0]->dtype, (*out)->data, bytes);
}

static int infer_ps_note(wf_node *n, char *err, size_t errlen)
{
    const wf_node *x = n->inputs[0];
    if (x->dtype != WF_I64 || x->shape.rank != 1 || x->shape.dims[0] != 4) {
        snprintf(err, errlen, "ps_note reads an i64 [4] header, not '%s'", x->name);
        return WF_ESHAPE;
    }
    n->dtype = WF_I64;
    n->shape = x->shape;
    return 0;
}

/* The default kernel passes the header on; the runtime registers one that also records it
 * (runtime/strategy_ps.c). */
const wf_op_def wf_op_ps_note = {
    .name = "ps_note",
    .min_inputs = 1,
    .max_inputs = 1,
    .infer = infer_ps_note,
    .kernel = { [WF_KERNEL_CPU] = ps_join_kernel },
    .flags = WF_OP_STATEFUL | WF_OP_NO_GRAD,
};

const wf_op_def wf_op_ps_join = {
    .name = "ps_join",
    .min_inputs = 1,
    .max_inputs = -1,
    .infer = infer_ps_join,
    .kernel = { [WF_KERNEL_CPU] = ps_join_kernel },
    .flags = WF_OP_STATEFUL | WF_OP_NO_GRAD,
};
