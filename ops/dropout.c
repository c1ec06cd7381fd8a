/* ops/dropout.c: dropout: its constructor, inference, cost and op-table entry.
 * Owns: wf_op_dropout (ops/table.h) and wf_dropout() (weft/nn.h).
 * Invariants: the attributes are 'rate' and 'seed' and nothing else, so two dropout nodes
 *   made with equal attributes draw the same mask in one run (the gradient of a dropout is a
 *   dropout of dy with the same bag: grad/ adds it with wf__node_add(g, &wf_op_dropout, &dy,
 *   1, n->attrs), not through wf_dropout(), which in eager graphs would mix a new seed). The
 *   rate is checked in inference (message with the node's prefix); the kernel checks again.
 * Why WF_OP_STATEFUL: dropout is a pure function of (x, seed, step), but 'step' is the run
 *   count, so its value changes between runs of one session: constant folding or caching it
 *   across runs would freeze the mask. The flag keeps passes away from it.
 * Not here: the mask and the loop (dropout_cpu.c), the generator (core/rng.h). */
#include "../core/rng.h"
#include "internal.h"

#include <stdio.h>
#include <string.h>

static int infer_dropout(wf_node *n, char *err, size_t errlen)
{
    const wf_node *x = n->inputs[0];
    double rate = n->attrs->rate;
    if (!wf_dtype_is_float(x->dtype))
        return wf__ops_bad_dtype(n, 1, "x", false, err, errlen);
    if (!(rate >= 0 && rate < 1)) {
        char s[160];
        snprintf(err, errlen, "x is %s; rate %g is outside [0, 1)",
                 wf_shape_str(x->shape, s, sizeof s), rate);
        return WF_EINVAL;
    }
    n->dtype = x->dtype;
    n->shape = x->shape;
    return 0;
}

static int kernel_dropout(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                          wf_tensor **out)
{
    wf_kctx k = wf__ops_kctx(ctx);
    return wf__dropout_cpu(&k, n->attrs->rate, n->attrs->seed, in[0], *out);
}

/* Per element: two hashes (~5 flops of integer work counted as flops), a compare, a scale. */
static void cost_dropout(const wf_node *n, double *flops, double *bytes)
{
    wf__ops_cost_elementwise(n, 6, flops, bytes);
}

const wf_op_def wf_op_dropout = {
    .name = "dropout",
    .min_inputs = 1,
    .max_inputs = 1,
    .infer = infer_dropout,
    .kernel = { [WF_KERNEL_CPU] = kernel_dropout, [WF_KERNEL_CUDA] = WF__CUDA_KERNEL(dropout) },
    .cost = cost_dropout,
    .flags = WF_OP_STATEFUL | WF_OP_INPLACE,
};

wf_node *(wf_dropout)(wf_graph *g, wf_node *x, double rate, uint64_t seed)
{
    wf_attrs a;
    memset(&a, 0, sizeof a); /* padding too: equal bags are shared (core/graph.h) */
    a.rate = rate;
    a.seed = seed;
    /* Eager graphs run every node at step 0: the node count makes each call's mask new. */
    if (g && wf_graph_mode(g) == WF_EAGER)
        a.seed = wf__rng_bits(seed, (uint64_t)wf_graph_node_count(g));
    return wf__node_add(g, &wf_op_dropout, &x, 1, &a);
}
