/* runtime/compile/priority.c: critical-path priority of a plan's nodes.
 * Owns: each plan node's estimated cost (the op registry's flops and bytes, core/op.h, turned
 *   into nanoseconds), its priority (its cost plus the highest priority among its successors:
 *   the longest path from it to a sink, in estimated time), and 'prio_order', the plan
 *   indices by priority, highest first.
 * How it is used: exec.c adds each node's input and control edges to the slot's task graph
 *   in 'prio_order' (the destination's priority), so every node's successor list is sorted
 *   by priority, highest first; the scheduler's worker that finishes a node keeps the first
 *   successor that became ready and pushes the others in list order (sched/taskgraph.c), so
 *   it goes on along the critical path while thieves (which take the oldest push) get the
 *   next most critical. Results never depend on it: only which ready node runs first.
 *   Nodes of WF_OP_ASYNC ops (their work runs on another actor) get ASYNC_NS more, their
 *   inputs half that, theirs a quarter, and so on (the boost is not part of the path time
 *   that propagates), so a node that feeds an async node soon goes before a long chain.
 *   A pipeline stage's dp_reduce is not such a node (is_async()): it has no peer.
 * Why these weights: one task round trip costs about a microsecond here (exec.c's comment
 *   on inline plans measured ~0.15 us at best, more with a kernel's setup), a worker's
 *   GEMM runs at tens of GFLOP/s, and streaming memory at about 10 GB/s per core; only the
 *   ratios matter, and a chain of many tiny nodes still outweighs one tiny branch.
 * Not here: building the plan (plan.c), running it (exec.c), the cost functions (ops/). */
#include "plan.h"

#include <stdlib.h>

#define OVERHEAD_NS 1000.0 /* per kernel task */
#define SOURCE_NS   100.0  /* placeholders, constants, variables: no kernel */
#define NS_PER_FLOP 0.02   /* ~50 GFLOP/s */
#define NS_PER_BYTE 0.1    /* ~10 GB/s */
#define ASYNC_NS    1e9    /* added to nodes whose work finishes elsewhere (WF_OP_ASYNC) */

static double bytes_of(wf_dtype dt, wf_shape s)
{
    double e = 1;
    for (int d = 0; d < s.rank; d++)
        e *= s.dims[d] > 0 ? (double)s.dims[d] : 1; /* -1 counts as 1 (core/op.h) */
    return e * (double)wf_dtype_size(dt);
}

/* The estimated time of plan node 'i' in nanoseconds. */
static double cost_ns(const wf__plan *p, int i)
{
    const wf_node *n = p->nodes[i];
    if (p->kind[i] != WF__PN_KERNEL)
        return SOURCE_NS;
    double flops = 0, bytes = 0;
    if (n->op->cost) {
        n->op->cost(n, &flops, &bytes);
    } else { /* core/op.h: the bytes of inputs and output, no flops */
        bytes = bytes_of(n->dtype, n->shape);
        for (int k = 0; k < n->n_inputs; k++)
            bytes += bytes_of(n->inputs[k]->dtype, n->inputs[k]->shape);
    }
    if (!(flops >= 0)) /* a NaN or negative estimate counts as none */
        flops = 0;
    if (!(bytes >= 0))
        bytes = 0;
    return OVERHEAD_NS + flops * NS_PER_FLOP + bytes * NS_PER_BYTE;
}

typedef struct ranked {
    double prio;
    int32_t index;
} ranked;

static int by_priority(const void *a, const void *b)
{
    const ranked *x = a, *y = b;
    if (x->prio != y->prio)
        return x->prio > y->prio ? -1 : 1;
    return (x->index > y->index) - (x->index < y->index);
}

/* Whether plan node 'i''s work finishes on another actor. A pipeline's dp_reduce nodes
 * ('local_reduce') sum the stage's own micro-batches on the worker (no peer: runtime/
 * strategy.c registers them without a communicator), so they are no such node: boosted,
 * each tree node of a gradient ran as soon as its two halves existed, before the next
 * forward part whose send the other stage waits for. */
static bool is_async(const wf__plan *p, int i, bool local_reduce)
{
    const wf_op_def *op = p->nodes[i]->op;
    return (op->flags & WF_OP_ASYNC) && !(local_reduce && op == &wf_op_dp_reduce);
}

void wf__plan_priority(wf__plan *p, const wf__compile_in *in)
{
    p->prio_order = NULL;
    if ((in->flags & WF_SESSION_NO_PRIORITY) || p->n == 0 || p->run_inline)
        return; /* inline plans run in plan order on one thread: nothing to choose */
    int n = p->n;
    bool local_reduce = in->local_reduce;
    double *best = calloc((size_t)n, sizeof *best);   /* highest successor priority so far */
    double *boost = calloc((size_t)n, sizeof *boost); /* highest successor boost so far */
    ranked *r = malloc((size_t)n * sizeof *r);
    int32_t *order = malloc((size_t)n * sizeof *order);
    if (!best || !boost || !r || !order) {
        free(best);
        free(boost);
        free(r);
        free(order);
        return;
    }
    /* Plan order is topological (plan.h): successors come later, so one backward sweep
     * finishes every node's successors before the node. */
    for (int i = n - 1; i >= 0; i--) {
        double prio = cost_ns(p, i) + best[i];
        /* A node that hands its work to another actor (the network: send, recv, a gradient
         * bucket's reduction) costs a worker microseconds and starts work that runs beside
         * the rest of the step, so it goes first once ready, and what it waits for just
         * before it: the boost halves with each step back, so a bucket's last gradient is
         * made before backward goes on down its chain, and the reduction starts then (as
         * DDP's hooks launch it): communication overlaps the rest of backward. */
        double b = is_async(p, i, local_reduce) ? ASYNC_NS : boost[i] * 0.5;
        r[i] = (ranked){ prio + b, i };
        for (int32_t e = p->in_off[i]; e < p->in_off[i + 1]; e++) {
            if (best[p->in_idx[e]] < prio)
                best[p->in_idx[e]] = prio;
            if (boost[p->in_idx[e]] < b)
                boost[p->in_idx[e]] = b;
        }
        const wf_node *node = p->nodes[i];
        for (int k = 0; k < node->n_control; k++) {
            int32_t j = p->index_of[node->control[k]->id];
            if (j >= 0 && best[j] < prio)
                best[j] = prio;
            if (j >= 0 && boost[j] < b)
                boost[j] = b;
        }
    }
    qsort(r, (size_t)n, sizeof *r, by_priority);
    for (int i = 0; i < n; i++)
        order[i] = r[i].index;
    free(best);
    free(boost);
    free(r);
    p->prio_order = order;
}
