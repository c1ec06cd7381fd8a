/* core/op_run.c: the one routine that runs a kernel node (wf__node_run(), core/op.h).
 * Owns: the steps every place that runs a node shares, in their order: an update's writable
 *   variables, the output, the kernel call, an update's value, the output's check against
 *   inference, and the message of a failure ("<op> '<name>' (<file>:<line>): <why>").
 * Why one routine: eager graphs, the CPU executor, the device executor and constant folding
 *   each had a copy of these steps, and every boundary op (copy, send, recv) would have
 *   needed another; what differs (where outputs and variables live, how a kernel is handed
 *   to a device) is a small table of hooks (wf__node_env).
 * Cost: one indirect call for the output (and one for the kernel on a device) per node; the
 *   message is formatted only on failure.
 * Not here: gathering inputs and re-inferring -1 dimensions (the callers know where values
 *   live), what the kernels compute (ops/). */
#include "error.h"
#include "graph.h"
#include "tensor.h"

#include <stdio.h>

const char *wf__node_desc(const struct wf_node *n, char *buf, size_t size)
{
    char where[256];
    snprintf(buf, size, "%s '%s' (%s)", n && n->op ? n->op->name : "?",
             n && n->name ? n->name : "?", wf__node_where(n, where, sizeof where));
    return buf;
}

/* Records the failure of 'n' as "<desc>: [<pre><on>: ]<why>" in 'msg' and this thread's
 * message; returns 'code'. */
static int fail(const wf_node *n, int code, const char *pre, const char *on, const char *why,
                char *msg, size_t msglen)
{
    char desc[WF_ERRMSG_MAX], buf[WF_ERRMSG_MAX];
    wf__node_desc(n, desc, sizeof desc);
    if (on)
        snprintf(buf, sizeof buf, "%s: %s%s: %s", desc, pre, on, why);
    else
        snprintf(buf, sizeof buf, "%s: %s", desc, why);
    wf__err(code, "%s", buf);
    if (msg && msglen)
        snprintf(msg, msglen, "%s", buf);
    return code;
}

/* Whether the kernel's output fits the inferred 'dt' and 'shape' (a -1 dimension of an op
 * that allocates its own output takes any size). */
static bool fits(const wf_tensor *out, wf_dtype dt, const wf_shape *shape, bool dynamic)
{
    bool ok = out && out->dtype == dt && out->shape.rank == shape->rank;
    for (int d = 0; ok && d < shape->rank; d++)
        ok = out->shape.dims[d] == shape->dims[d] || (dynamic && shape->dims[d] < 0);
    return ok;
}

int wf__node_run(const wf__node_env *env, void *arg, wf_kernel_fn k, const wf_kernel_ctx *ctx,
                 const struct wf_node *n, struct wf_tensor **in, wf_dtype dt, const wf_shape *shape,
                 const char *where, struct wf_tensor **out, char *msg, size_t msglen)
{
    *out = NULL;
    if (!k)
        return fail(n, WF_ENODEV, "", NULL, "its op has no kernel for the device it was placed on",
                    msg, msglen);
    const wf_op_def *op = n->op;
    int n_assign = op->n_assign, rc;
    bool dynamic = op->flags & WF_OP_DYNAMIC_SHAPE;
    wf_tensor *o = NULL;
    if (n_assign > 0) {
        if ((rc = env->writable(arg, n, in)) < 0)
            return fail(n, rc, "", NULL, wf_last_errmsg(), msg, msglen);
    } else if (!dynamic && !(o = env->alloc(arg, n, dt, shape))) {
        return fail(n, WF_ENOMEM, "its output on ", where, wf_last_errmsg(), msg, msglen);
    }
    rc = env->call ? env->call(arg, k, ctx, n, in, &o) : k(ctx, n, in, &o);
    if (n_assign > 0) {
        if (rc >= 0) /* the node's value is its first variable's (core/op.h: n_assign) */
            o = wf_tensor_retain(in[0]);
        if (env->written)
            env->written(arg, n, rc >= 0);
        for (int i = 0; i < n_assign; i++)
            wf_tensor_release(in[i]); /* env->writable()'s references */
    }
    if (rc < 0) {
        wf_tensor_release(o);
        return fail(n, rc, "on ", where, wf_last_errmsg(), msg, msglen);
    }
    if (rc == WF_KERNEL_PENDING && (op->flags & WF_OP_ASYNC) && ctx->complete) {
        *out = o; /* being written until ctx->complete: the caller keeps it meanwhile */
        return WF_KERNEL_PENDING;
    }
    if (!fits(o, dt, shape, dynamic)) {
        char why[WF_ERRMSG_MAX], a[160], b[160];
        const char *kn = where ? where : "CPU";
        if (o)
            snprintf(why, sizeof why, "the %s kernel gave %s %s but inference said %s %s", kn,
                     wf_dtype_name(o->dtype), wf_shape_str(o->shape, a, sizeof a),
                     wf_dtype_name(dt), wf_shape_str(*shape, b, sizeof b));
        else
            snprintf(why, sizeof why, "the %s kernel returned no tensor", kn);
        wf_tensor_release(o);
        return fail(n, WF_EINVAL, "", NULL, why, msg, msglen);
    }
    *out = o;
    return 0;
}
