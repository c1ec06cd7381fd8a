/* core/op_comm.c: the boundary ops: between ranks, send and recv (core/op.h), and their
 * constructors wf_send() and wf_recv() (weft/core.h); between devices, copy.
 * Owns: their defs (arity, inference, flags) and the checks of their attributes.
 * Why here and kernel-less: the planner (placement/) inserts them as plain graph ops, and only
 *   the layer that owns the network (transport/) knows how to move bytes, so their kernels are
 *   registered per session (the kernel registry of core/op.h) when the session is given a
 *   communicator; a session without one fails placement with WF_ENODEV naming the node.
 *   A copy is the same kind of op for the devices of one process: its kernels are devices/'
 *   (devices/copy.c), registered for every session.
 * Not here: the kernels and the key scheme (transport/p2p_ops.c, devices/copy.c), running a
 *   node that finishes later (runtime/exec.c). */
#include "error.h"
#include "graph.h"
#include "internal.h"

#include <stdio.h>

/* The most edges a key holds (transport/post.h: 15 bits, beside the step and the part). */
#define MAX_EDGE (1 << 15)

static int check_route(const wf_attrs *a, char *err, size_t errlen)
{
    if (a->peer < 0) {
        snprintf(err, errlen, "peer rank %d is negative", (int)a->peer);
        return WF_EINVAL;
    }
    if (a->edge < 0 || a->edge >= MAX_EDGE) {
        snprintf(err, errlen, "edge %d is not in 0 .. %d", (int)a->edge, MAX_EDGE - 1);
        return WF_EINVAL;
    }
    return 0;
}

static int infer_send(wf_node *n, char *err, size_t errlen)
{
    int rc = check_route(n->attrs, err, errlen);
    if (rc < 0)
        return rc;
    n->dtype = WF_F32; /* a token: the sent value stays where it is */
    n->shape = (wf_shape){ .rank = 0 };
    return 0;
}

static int infer_recv(wf_node *n, char *err, size_t errlen)
{
    const wf_attrs *a = n->attrs;
    int rc = check_route(a, err, errlen);
    if (rc < 0)
        return rc;
    if ((rc = wf__op_check_type(a, 0, err, errlen)) < 0)
        return rc;
    n->dtype = a->dtype;
    n->shape = a->shape;
    return 0;
}

const wf_op_def wf_op_send = {
    .name = "send",
    .min_inputs = 1,
    .max_inputs = 1,
    .infer = infer_send,
    .flags = WF_OP_STATEFUL | WF_OP_NO_GRAD | WF_OP_ASYNC | WF_OP_TRANSFER,
};

const wf_op_def wf_op_recv = {
    .name = "recv",
    .min_inputs = 0,
    .max_inputs = 0,
    .infer = infer_recv,
    .flags = WF_OP_STATEFUL | WF_OP_NO_GRAD | WF_OP_ASYNC | WF_OP_TRANSFER,
};

static int infer_copy(wf_node *n, char *err, size_t errlen)
{
    const wf_attrs *a = n->attrs;
    if (a->from_dev < 0 || a->to_dev < 0 || a->from_dev == a->to_dev) {
        snprintf(err, errlen, "a copy from device %d to device %d (two distinct ids >= 0)",
                 (int)a->from_dev, (int)a->to_dev);
        return WF_EINVAL;
    }
    n->dtype = n->inputs[0]->dtype;
    n->shape = n->inputs[0]->shape;
    return 0;
}

const wf_op_def wf_op_copy = {
    .name = "copy",
    .min_inputs = 1,
    .max_inputs = 1,
    .infer = infer_copy,
    .flags = WF_OP_NO_GRAD | WF_OP_ASYNC,
};

wf_node *(wf_send)(wf_graph *g, wf_node *x, int peer, int edge)
{
    wf_attrs a = { 0 };
    a.peer = peer;
    a.edge = edge;
    return wf__node_add(g, &wf_op_send, &x, 1, &a);
}

wf_node *(wf_recv)(wf_graph *g, wf_dtype dt, wf_shape shape, int peer, int edge)
{
    wf_attrs a = { 0 };
    a.peer = peer;
    a.edge = edge;
    a.dtype = dt;
    a.shape = shape;
    return wf__node_add(g, &wf_op_recv, NULL, 0, &a);
}
