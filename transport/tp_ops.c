/* transport/tp_ops.c: the CPU kernel of core's tp_reduce op (core/op.h), the all-reduce (sum)
 *   of tensor parallelism (Megatron's g, and the gradient of its f), registered for a session
 *   with send and recv (wf__transport_register_kernels(), transport/p2p_ops.c).
 * Owns: the exchange, its keys and the order of the sum.
 * Exchange: every rank sends its whole value to every other rank and receives theirs (one
 *   message each way per pair of ranks, its size checked by the transport: a rank whose value
 *   has another size fails the run naming both sizes and the peer). The values of
 *   tensor-parallel blocks are activations (a batch's rows times the model width), small
 *   beside the weights, and the group is a few ranks, so the (N-1)x traffic of this direct
 *   exchange beats nothing a ring would save at these sizes; what matters is the order.
 * Order: once every value is in, each rank sums them in rank order, out = ((x_0 + x_1) + x_2)
 *   ..., in the value's dtype, so every rank computes the same additions on the same operands
 *   and gets the same bits, whatever order the messages arrived in.
 * Keys: as graph transfers (transport/post.h): step (wf_kernel_ctx.xfer_step) << 16 | edge << 1
 *   | 1; the transport adds the sender's rank and incarnation.
 * The kernel pends (WF_KERNEL_PENDING): it posts every transfer and returns; the transport's
 *   actor runs the callbacks, and the last one sums and completes the node, so no worker waits
 *   on the network. A failed comm fails every transfer and so the node.
 * Not here: the op's def (core/op_tp.c), its gradient (grad/grad_dist.c), the rewrite that
 *   inserts it (placement/tensor_split.c). */
#include "../core/graph.h"
#include "../core/tensor.h"
#include "internal.h"
#include "post.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct tpx {
    wf_comm *c;
    const wf_node *n;
    void (*complete)(void *token, int rc);
    void *token;
    int rank, size;
    wf_dtype dtype;
    size_t count;
    wf_tensor *mine; /* this rank's value, contiguous (a reference until every send is done) */
    wf_tensor *out;  /* the node's output (the caller's) */
    _Atomic int left;
    _Atomic int failed;
    int rc;
    char why[WF_ERRMSG_MAX];
    /* size values: val[rank] is mine's bytes, the others point into the received values,
     * (size - 1) * count elements after the array, in the same block: one allocation a run */
    char *val[];
} tpx;

static uint64_t key_of(uint64_t step, int edge)
{
    return WF__POST_KEY_GRAPH | ((step & 0x7fffffu) << 16) | ((uint64_t)(edge & 0x7fff) << 1) | 1u;
}

static void tpx_free(tpx *x)
{
    wf_tensor_release(x->mine);
    free(x);
}

/* The sum in rank order, into the output. */
static void rank_sum(tpx *x)
{
    size_t n = x->count;
    if (x->dtype == WF_F64) {
        double *o = (double *)x->out->data;
        memcpy(o, x->val[0], n * sizeof *o);
        for (int q = 1; q < x->size; q++) {
            const double *v = (const double *)x->val[q];
            for (size_t e = 0; e < n; e++)
                o[e] += v[e];
        }
        return;
    }
    float *o = (float *)x->out->data;
    memcpy(o, x->val[0], n * sizeof *o);
    for (int q = 1; q < x->size; q++) {
        const float *v = (const float *)x->val[q];
        for (size_t e = 0; e < n; e++)
            o[e] += v[e];
    }
}

static void done_one(void *arg, int rc)
{
    tpx *x = arg;
    if (rc < 0) {
        int zero = 0;
        if (atomic_compare_exchange_strong(&x->failed, &zero, 1)) {
            x->rc = rc;
            snprintf(x->why, sizeof x->why, "tp_reduce '%s' on rank %d: %s", x->n->name, x->rank,
                     wf_last_errmsg());
        }
    }
    if (atomic_fetch_sub_explicit(&x->left, 1, memory_order_acq_rel) != 1)
        return;
    rc = atomic_load(&x->failed) ? x->rc : 0;
    if (rc == 0)
        rank_sum(x);
    else
        wf__err(rc, "%s", x->why);
    void (*complete)(void *, int) = x->complete;
    void *token = x->token;
    tpx_free(x);
    complete(token, rc);
}

static int tp_reduce_kernel(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                            wf_tensor **out)
{
    wf_comm *c = ctx->data;
    if (!c)
        return wf__err(WF_ENODEV, "no communicator (wf_session_opts.comm)");
    int size = wf_comm_size(c), me = wf_comm_rank(c);
    if (n->attrs->peer != size)
        return wf__err(WF_EINVAL,
                       "tp_reduce '%s' is over a group of %d ranks, but the communicator has %d",
                       n->name, (int)n->attrs->peer, size);
    const wf_tensor *t = in[0];
    size_t es = wf_dtype_size(t->dtype), count = (size_t)t->numel;
    if (size == 1) { /* a group of one: the sum is the value */
        if (t->contiguous)
            memcpy((*out)->data, t->data, count * es);
        else
            return wf_tensor_read(t, t->dtype, (*out)->data, count * es);
        return 0;
    }
    if (!ctx->complete)
        return wf__err(WF_ENOSYS, "tp_reduce runs only in a session's run (it finishes later)");
    int rc = wf_comm_status(c);
    if (rc < 0)
        return rc;
    size_t head = sizeof(tpx) + (size_t)size * sizeof(char *);
    tpx *x = malloc(head + (size_t)(size - 1) * count * es);
    if (!x)
        return wf__err(WF_ENOMEM, "no memory for the all-reduce of %zu values", count);
    memset(x, 0, head);
    if (t->contiguous) {
        x->mine = wf_tensor_retain((wf_tensor *)t);
    } else if ((x->mine = wf__tensor_alloc(t->dtype, t->shape)) &&
               (rc = wf_tensor_read(t, t->dtype, (void *)x->mine->data, count * es)) < 0) {
        tpx_free(x);
        return rc;
    }
    if (!x->mine) {
        tpx_free(x);
        return wf__err(WF_ENOMEM, "no memory for the all-reduce of %zu values", count);
    }
    x->c = c;
    x->n = n;
    x->complete = ctx->complete;
    x->token = ctx->token;
    x->rank = me;
    x->size = size;
    x->dtype = t->dtype;
    x->count = count;
    x->out = *out;
    for (int q = 0, k = 0; q < size; q++)
        x->val[q] = q == me ? (char *)x->mine->data : (char *)x + head + (size_t)(k++) * count * es;
    /* a send and a receive per peer, and the poster's own hold */
    atomic_init(&x->left, 2 * (size - 1) + 1);
    uint64_t key = key_of(ctx->xfer_step, (int)n->attrs->edge);
    for (int q = 0; q < size; q++) {
        if (q == me)
            continue;
        if ((rc = wf__comm_post_recv(c, q, key, x->val[q], count * es, done_one, x)) < 0)
            done_one(x, rc);
        if ((rc = wf__comm_post_send(c, q, key, x->mine->data, count * es, done_one, x)) < 0)
            done_one(x, rc);
    }
    done_one(x, 0);
    return WF_KERNEL_PENDING;
}

int wf__tp_register_kernels(wf__kernels *r, wf_comm *c)
{
    return wf__kernels_register(r, &wf_op_tp_reduce, WF_KERNEL_CPU, tp_reduce_kernel, NULL, c);
}
