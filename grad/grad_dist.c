/* grad/grad_dist.c: the gradients of the distributed ops defined in core/ that have one:
 *   tensor parallelism's pair (core/op_tp.c).
 * Owns: the table wf__grad_dist (grad/internal.h), which wf__grad_find() searches.
 * Megatron's pair: the gradient of tp_enter (f, the identity) is the all-reduce of dy over the
 *   group (a tp_reduce of tp_enter's attributes: its edge is reserved for this), because every
 *   rank's slice of the block contributes a part of x's gradient; the gradient of tp_reduce
 *   (g, the all-reduce) is the identity on every rank (a tp_enter of tp_reduce's attributes,
 *   which sends nothing), because every rank's input feeds the one sum with weight 1.
 * Not here: the ops (core/op_tp.c), the all-reduce's kernel (transport/tp_ops.c). */
#include "internal.h"

static int grad_tp_enter(wf_graph *g, const wf_node *n, wf_node *dy, uint32_t need, wf_node **dx)
{
    if (!WF__NEED(need, 0))
        return 0;
    dx[0] = (wf_tp_reduce)(g, dy, (int)n->attrs->peer, (int)n->attrs->edge);
    return dx[0] ? 0 : wf_graph_status(g);
}

static int grad_tp_reduce(wf_graph *g, const wf_node *n, wf_node *dy, uint32_t need, wf_node **dx)
{
    if (!WF__NEED(need, 0))
        return 0;
    dx[0] = (wf_tp_enter)(g, dy, (int)n->attrs->peer, (int)n->attrs->edge);
    return dx[0] ? 0 : wf_graph_status(g);
}

const wf__grad_entry wf__grad_dist[] = {
    { &wf_op_tp_enter, grad_tp_enter },
    { &wf_op_tp_reduce, grad_tp_reduce },
};

const int wf__grad_dist_len = (int)(sizeof wf__grad_dist / sizeof wf__grad_dist[0]);
