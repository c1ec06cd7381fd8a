/* transport/p2p_ops.c: the CPU kernels of core's send and recv ops (core/op.h), registered
 *   for a session by wf__transport_register_kernels() (transport/post.h).
 * Owns: the wire form of a tensor between ranks and the key scheme of graph transfers; the
 *   registration also covers tp_reduce (tp_ops.c), the other transfer op a session may run.
 * Wire form: two messages per value, a header (magic, dtype, rank, dimensions) and the
 *   bytes, so the receiver checks dtype and shape against its own node before it hands
 *   anything on: a mismatch fails the receiving run naming both ranks and both types, never
 *   a wrong value (a data message of another size is refused by its size check anyway).
 * Keys: WF__POST_KEY_GRAPH | step (23 bits, the session's count of transferring runs,
 * wf_kernel_ctx.xfer_step) << 16 | edge (15 bits)
 *   << 1 | part (0 header, 1 data); the transport adds the sender's rank and incarnation, so
 *   a restarted peer never matches a stale receive, and consecutive runs never mix.
 * Both kernels pend (WF_KERNEL_PENDING): they post their transfers and return; the
 *   transport's actor calls ctx->complete once both messages are done, so no worker waits.
 * Not here: the ops' defs (core/op_comm.c), the actor (post.c), the executor (runtime/). */
#include "../core/graph.h"
#include "../core/tensor.h"
#include "internal.h"
#include "post.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HDR_MAGIC 0x57465452u /* "RTFW" */

/* The header message: what the sender sent. */
typedef struct wire_hdr {
    uint32_t magic;
    int32_t dtype;
    int32_t rank;
    int32_t pad;
    int64_t dims[WF_MAX_RANK];
} wire_hdr;

static uint64_t key_of(uint64_t step, int edge, int part)
{
    return WF__POST_KEY_GRAPH | ((step & 0x7fffffu) << 16) | ((uint64_t)(edge & 0x7fff) << 1) |
           (uint64_t)part;
}

/* One value's two transfers; the second to finish completes the node (or the caller's). */
typedef struct xfer {
    wf_comm *c;
    int peer, edge;
    wf_dtype dtype; /* recv: what the receiver expects */
    wf_shape shape;
    const char *name; /* borrowed: the node's, or the caller's (for the flight record) */
    void (*complete)(void *token, int rc);
    void *token;
    wf_tensor *keep; /* send: the value sent (a reference until both are done) */
    wire_hdr hdr;    /* send: what goes; recv: what came */
    _Atomic int left;
    uint64_t ticket; /* the flight recorder's entry of this transfer */
    int rc;          /* the first failure (written before 'left' drops) */
    char why[WF_ERRMSG_MAX];
} xfer;

static void type_str(wf_dtype dt, wf_shape s, char *buf, size_t size)
{
    char sh[160];
    snprintf(buf, size, "%s %s", wf_dtype_name(dt), wf_shape_str(s, sh, sizeof sh));
}

/* The recv's check of what came against its node; 0 or WF_ESHAPE with both types. */
static int check_hdr(xfer *x)
{
    const wire_hdr *h = &x->hdr;
    char want[200], got[200];
    type_str(x->dtype, x->shape, want, sizeof want);
    if (h->magic != HDR_MAGIC || h->rank < 0 || h->rank > WF_MAX_RANK ||
        !wf_dtype_size((wf_dtype)h->dtype))
        return wf__err(WF_EFORMAT,
                       "rank %d expected %s from rank %d, which sent a malformed "
                       "header",
                       wf_comm_rank(x->c), want, x->peer);
    wf_shape s = { .rank = h->rank };
    for (int i = 0; i < h->rank; i++)
        s.dims[i] = h->dims[i];
    if ((wf_dtype)h->dtype == x->dtype && wf_shape_equal(s, x->shape))
        return 0;
    type_str((wf_dtype)h->dtype, s, got, sizeof got);
    return wf__err(WF_ESHAPE, "rank %d expected %s from rank %d, which sent %s", wf_comm_rank(x->c),
                   want, x->peer, got);
}

/* A transfer of 'x' is done (on the transport's actor). The header's failure (or its
 * mismatch) is the one reported: it says more than the data's size check. */
static void part_done(xfer *x, int rc, bool is_hdr)
{
    if (rc < 0 && (x->rc == 0 || is_hdr)) {
        x->rc = rc;
        snprintf(x->why, sizeof x->why, "%s", wf_last_errmsg());
    }
    if (is_hdr && rc >= 0 && !x->keep && (rc = check_hdr(x)) < 0) {
        x->rc = rc;
        snprintf(x->why, sizeof x->why, "%s", wf_last_errmsg());
    }
    if (atomic_fetch_sub_explicit(&x->left, 1, memory_order_acq_rel) != 1)
        return;
    rc = x->rc;
    wf__flight_set(x->c, x->ticket, rc < 0 ? WF__FS_FAILED : WF__FS_DONE, rc);
    if (rc < 0)
        wf__err(rc, "%s", x->why);
    wf_tensor_release(x->keep);
    void (*complete)(void *, int) = x->complete;
    void *token = x->token;
    free(x);
    complete(token, rc);
}

static void hdr_done(void *arg, int rc)
{
    part_done(arg, rc, true);
}

static void data_done(void *arg, int rc)
{
    part_done(arg, rc, false);
}

/* Starts 'x''s two transfers; on failure of the first post nothing runs, of the second the
 * first one's completion finishes the node with the error. */
static int start(xfer *x, bool is_recv, void *data, size_t bytes, uint64_t step)
{
    int peer = x->peer;
    atomic_init(&x->left, 2);
    x->ticket = wf__flight_node(x->c, is_recv ? WF__K_RECV : WF__K_SEND, key_of(step, x->edge, 1),
                                bytes, bytes, peer, x->name, x->edge, step);
    int rc = is_recv ? wf__comm_post_recv(x->c, peer, key_of(step, x->edge, 0), &x->hdr,
                                          sizeof x->hdr, hdr_done, x)
                     : wf__comm_post_send(x->c, peer, key_of(step, x->edge, 0), &x->hdr,
                                          sizeof x->hdr, hdr_done, x);
    if (rc < 0) {
        wf__flight_set(x->c, x->ticket, WF__FS_FAILED, rc);
        wf_tensor_release(x->keep);
        free(x);
        return rc;
    }
    rc = is_recv
             ? wf__comm_post_recv(x->c, peer, key_of(step, x->edge, 1), data, bytes, data_done, x)
             : wf__comm_post_send(x->c, peer, key_of(step, x->edge, 1), data, bytes, data_done, x);
    if (rc < 0)
        data_done(x, rc); /* the node completes (failed) once the header's transfer ends */
    return WF_KERNEL_PENDING;
}

static xfer *xfer_new(wf_comm *c, int peer, int edge, const char *name, wf__post_fn complete,
                      void *token)
{
    xfer *x = calloc(1, sizeof *x);
    if (!x)
        return NULL;
    x->c = c;
    x->peer = peer;
    x->edge = edge;
    x->name = name;
    x->complete = complete;
    x->token = token;
    return x;
}

/* The header of a sent value 't'. */
static void set_hdr(xfer *x, const wf_tensor *t)
{
    x->hdr = (wire_hdr){ .magic = HDR_MAGIC, .dtype = (int32_t)t->dtype, .rank = t->shape.rank };
    for (int i = 0; i < t->shape.rank; i++)
        x->hdr.dims[i] = t->shape.dims[i];
}

static int check_ctx(const wf_kernel_ctx *ctx, const wf_node *n)
{
    if (!ctx->data)
        return wf__err(WF_ENODEV, "no communicator (wf_session_opts.comm)");
    if (!ctx->complete)
        return wf__err(WF_ENOSYS, "%s runs only in a session's run (it finishes later)",
                       n->op->name);
    int size = wf_comm_size(ctx->data);
    if (n->attrs->peer >= size || n->attrs->peer == wf_comm_rank(ctx->data))
        return wf__err(WF_EINVAL,
                       "peer rank %d: the communicator has ranks 0 .. %d and "
                       "this is rank %d",
                       n->attrs->peer, size - 1, wf_comm_rank(ctx->data));
    return 0;
}

static int send_kernel(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                       wf_tensor **out)
{
    int rc = check_ctx(ctx, n);
    if (rc < 0)
        return rc;
    const wf_tensor *t = in[0];
    size_t bytes = (size_t)t->numel * wf_dtype_size(t->dtype);
    wf_tensor *keep = NULL;
    if (t->contiguous) {
        keep = wf_tensor_retain((wf_tensor *)t);
    } else { /* a strided view goes gathered */
        if (!(keep = wf__tensor_alloc(t->dtype, t->shape)))
            return wf__err(WF_ENOMEM, "no memory to gather a strided value of %zu bytes", bytes);
        if ((rc = wf_tensor_read(t, t->dtype, (void *)keep->data, bytes)) < 0) {
            wf_tensor_release(keep);
            return rc;
        }
    }
    xfer *x = xfer_new(ctx->data, n->attrs->peer, (int)n->attrs->edge, n->name, ctx->complete,
                       ctx->token);
    if (!x) {
        wf_tensor_release(keep);
        return wf__err(WF_ENOMEM, "no memory for a transfer");
    }
    x->keep = keep;
    set_hdr(x, t);
    memset((void *)(*out)->data, 0, wf_dtype_size((*out)->dtype)); /* the token: 0 */
    return start(x, false, (void *)keep->data, bytes, ctx->xfer_step);
}

static int recv_kernel(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                       wf_tensor **out)
{
    (void)in;
    int rc = check_ctx(ctx, n);
    if (rc < 0)
        return rc;
    xfer *x = xfer_new(ctx->data, n->attrs->peer, (int)n->attrs->edge, n->name, ctx->complete,
                       ctx->token);
    if (!x)
        return wf__err(WF_ENOMEM, "no memory for a transfer");
    x->dtype = n->dtype;
    x->shape = n->shape;
    wf_tensor *o = *out;
    return start(x, true, (void *)o->data, (size_t)o->numel * wf_dtype_size(o->dtype),
                 ctx->xfer_step);
}

int wf__p2p_post(wf_comm *c, bool is_recv, int peer, int edge, uint64_t step, wf_tensor *t,
                 const char *name, wf__post_fn done, void *arg)
{
    if (!c || !t || !done || !t->contiguous || peer < 0 || peer >= wf_comm_size(c) ||
        peer == wf_comm_rank(c) || edge < 0 || edge >= (1 << 15))
        return wf__err(WF_EINVAL, "wf__p2p_post: bad arguments (peer %d, edge %d)", peer, edge);
    xfer *x = xfer_new(c, peer, edge, name, done, arg);
    if (!x)
        return wf__err(WF_ENOMEM, "no memory for a transfer");
    size_t bytes = (size_t)t->numel * wf_dtype_size(t->dtype);
    if (is_recv) {
        x->dtype = t->dtype;
        x->shape = t->shape;
    } else {
        x->keep = wf_tensor_retain(t);
        set_hdr(x, t);
    }
    int rc = start(x, is_recv, (void *)t->data, bytes, step);
    return rc == WF_KERNEL_PENDING ? 0 : rc;
}

int wf__transport_register_kernels(wf__kernels *r, wf_comm *c)
{
    if (!r || !c)
        return wf__err(WF_EINVAL, "wf__transport_register_kernels: NULL %s",
                       r ? "comm" : "registry");
    int rc = wf__kernels_register(r, &wf_op_send, WF_KERNEL_CPU, send_kernel, NULL, c);
    if (rc >= 0)
        rc = wf__kernels_register(r, &wf_op_recv, WF_KERNEL_CPU, recv_kernel, NULL, c);
    if (rc >= 0) /* tensor parallelism's all-reduce (tp_ops.c) */
        rc = wf__tp_register_kernels(r, c);
    return rc;
}
