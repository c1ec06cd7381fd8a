/* runtime/exec_device.c: running plan nodes placed on a GPU, and the copy nodes between the
 *   host and GPUs and between GPUs (docs/architecture.md, "The path of a training step", Run).
 * Owns: a run slot's device values ('sl->dev': per plan node, its value on its GPU), what
 *   the task of a GPU node does, and what the task of a copy node does.
 * How a GPU node runs: its task (on a worker, like every node) takes its inputs' device
 *   values and runs it through wf__node_run() (core/op.h) with this file's hooks: the
 *   output from the device's pool, and the kernel the plan resolved from the session's
 *   registry for the device's kind (with the device's queue as wf_kernel_ctx.stream) handed
 *   to the device, which enqueues it on its compute stream and returns. The task then ends: its
 *   readers on the same device are released while the GPU has not even started, and their
 *   kernels queue behind it (the device completes its work in order, devices/device.h).
 * Copies are nodes of the plan (placement/place.c inserts them, nodes of core's copy op, each
 *   right after its value in the plan's order; the value's readers on the destination read
 *   the copy), scheduled as tasks like every node. A copy node runs through wf__node_run()
 *   with the copy kernel the plan resolved from the session's registry (devices/copy.c
 *   registers it; the output on the destination: a GPU's memory or the session's pool):
 *   - host to GPU, GPU to GPU: the kernel enqueues the copy in the destination's order and
 *     the task ends; the readers on that GPU queue behind it;
 *   - GPU to host: the kernel pends (WF_KERNEL_PENDING) and the task returns
 *     WF_TASK_LATER: no worker waits. The device's actor then finishes the node
 *     (copy_landed(), the kernel's ctx->complete: exec.c's wf__slot_node_complete(), as
 *     for every node that pends), which releases the host readers with the data in place.
 * Variables resident on the device (placement/place.c, var_device.c): the variable node's task
 *   takes the session's device value (copied in when stale); an update node's task takes
 *   its variables' device values writable (wf__var_device_writable(), as exec.c's
 *   take_writable() on the host), allocates no output (its value is its first variable's),
 *   and after giving its kernel to the device marks the device values as the latest write.
 *   A fetched resident variable is copied to the host after the run's updates of it.
 * Lifetimes: a value on a device is dropped at its last use (exec.c's drop_use()), as a
 *   host value is; a copy is a reader of its value and has readers of its own; what is left at the
 * end of the run (a fetched GPU value) is dropped by wf__exec_device_finish(), which also waits for
 * the devices' work so that a kernel's late (asynchronous) error fails this run, not the next one.
 * Not here: placement and where copies go (placement/place.c), the variables' device values
 *   (var_device.c), the devices (devices/), CPU nodes (exec.c). */
#include "../devices/device.h"
#include "../memory/pool.h"
#include "internal.h"

#ifdef WF_HAVE_CUDA
#    include "../devices/cuda.h"
#endif

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int wf__slot_dev_init(wf__slot *sl)
{
    const wf__plan_dev *pd = sl->plan->dev;
    if (!pd)
        return 0;
    wf__slot_dev *sd = calloc(1, sizeof *sd);
    if (!sd)
        return wf__err(WF_ENOMEM, "wf_session_run: no memory for a run's device values");
    sl->dev = sd;
    sd->dvals = calloc((size_t)(sl->plan->n ? sl->plan->n : 1), sizeof *sd->dvals);
    if (!sd->dvals)
        return wf__err(WF_ENOMEM, "wf_session_run: no memory for a run's device values");
    return 0;
}

void wf__slot_dev_free(wf__slot *sl)
{
    wf__slot_dev *sd = sl->dev;
    if (!sd)
        return;
    if (sd->dvals)
        for (int i = 0; i < sl->plan->n; i++)
            wf_tensor_release(sd->dvals[i]);
    free(sd->dvals);
    free(sd);
    sl->dev = NULL;
}

wf_tensor *wf__device_tensor(wf_device *d, wf_dtype dt, wf_shape shape)
{
    size_t bytes;
    if (wf__tensor_check("device tensor", dt, shape, &bytes) < 0)
        return NULL;
    wf_buffer *b;
    if (d->ops->alloc(d, bytes ? bytes : 1, &b) < 0)
        return NULL;
    return wf__tensor_wrap(dt, shape, b); /* releases 'b' on failure */
}

typedef struct kernel_call {
    wf_kernel_fn fn;
    const wf_kernel_ctx *ctx;
    const wf_node *n;
    wf_tensor *const *in;
    wf_tensor **out;
} kernel_call;

static int call_kernel(void *arg)
{
    kernel_call *k = arg;
    return k->fn(k->ctx, k->n, k->in, k->out);
}

/* Fails copy node 'i' of 'sl' ("<value's node>: copying its value from <a> to <b>: <why>"). */
static int copy_fail(wf__slot *sl, int i, int code, const char *why)
{
    const wf__plan *p = sl->plan;
    const wf__plan_dev *pd = p->dev;
    const wf_node *n = p->nodes[i];
    int from = n->attrs->from_dev, to = n->attrs->to_dev;
    char msg[WF_ERRMSG_MAX];
    snprintf(msg, sizeof msg, "copying its value from %s to %s: %s",
             from ? pd->devs[from]->info.name : "the host",
             to ? pd->devs[to]->info.name : "the host", why);
    return wf__slot_fail(sl, n->inputs[0], code, msg);
}

/* The device's notice that copy node 'arg' (to the host) has landed: finishes the node as
 * any node that pended (exec.c). Runs on the device's actor. */
static void copy_landed(void *arg, int status)
{
    const wf__task_arg *a = arg;
    int rc = status < 0 ? copy_fail(a->slot, a->index, status, wf_last_errmsg()) : 0;
    wf__slot_node_complete(arg, rc);
}

/* The copy nodes' side of wf__node_run() (core/op.h): the copy's output on its destination,
 * a GPU's memory or the session's pool; a copy to the host has its value in place before its
 * kernel starts, since the device's notice (copy_landed()) releases the readers. */
typedef struct copy_dst {
    wf__slot *sl;
    int i;
} copy_dst;

static wf_tensor *copy_alloc(void *arg, const wf_node *n, wf_dtype dt, const wf_shape *shape)
{
    const copy_dst *c = arg;
    wf__slot *sl = c->sl;
    const wf__plan_dev *pd = sl->plan->dev;
    if (n->attrs->to_dev)
        return wf__device_tensor(pd->devs[n->attrs->to_dev], dt, *shape);
    wf_tensor *t = wf__pool_tensor_alloc(sl->plan->sess->pool, dt, *shape);
    sl->vals[c->i] = t;
    return t;
}

static const wf__node_env copy_env = { .alloc = copy_alloc };

int wf__exec_copy_node(wf__slot *sl, int i)
{
    const wf__plan *p = sl->plan;
    const wf_node *n = p->nodes[i];
    /* A target's copy to the host that no fetch reads: nothing to hand out. */
    if (atomic_load_explicit(&sl->uses[i], memory_order_relaxed) == 0)
        return 0;
    wf_tensor *t = wf__slot_value(sl, p->in_idx[p->in_off[i]]);
    if (!t) /* an internal error: a value released too early or never made */
        return copy_fail(sl, i, WF_EINVAL, "the value is missing");
    wf_kernel_ctx ctx = {
        .rt = p->sess->rt,
        .step = sl->step,
        .xfer_step = sl->xfer_step,
        .data = p->kdata[i],
        .complete = copy_landed,
        .token = &sl->args[i],
    };
    wf_tensor *out = NULL;
    char msg[WF_ERRMSG_MAX];
    int rc = wf__node_run(&copy_env, &(copy_dst){ sl, i }, p->kernel[i], &ctx, n, &t, t->dtype,
                          &t->shape, NULL, &out, msg, sizeof msg);
    if (rc < 0) {
        if (!n->attrs->to_dev)
            sl->vals[i] = NULL; /* copy_alloc()'s alias of what wf__node_run() released */
        return copy_fail(sl, i, rc, msg);
    }
    if (n->attrs->to_dev)
        sl->dev->dvals[i] = out; /* in the destination's order: its readers queue behind it */
    /* To the host: the value is in 'sl->vals' since copy_alloc(); WF_KERNEL_PENDING until
     * copy_landed(). */
    return rc;
}

#define STACK_INPUTS 8

/* The device executor's side of wf__node_run() (core/op.h): outputs in the device's memory,
 * updates writing their variables' device values (var_device.c), kernels handed to the
 * device's queue. */
typedef struct dev_node {
    wf__slot *sl;
    int i;
    wf_device *d;
} dev_node;

static wf_tensor *dev_alloc(void *arg, const wf_node *n, wf_dtype dt, const wf_shape *shape)
{
    (void)n;
    return wf__device_tensor(((const dev_node *)arg)->d, dt, *shape);
}

static int dev_writable(void *arg, const wf_node *n, wf_tensor **in)
{
    (void)n;
    const dev_node *c = arg;
    return wf__var_device_writable(c->sl, c->i, in);
}

static void dev_written(void *arg, const wf_node *n, bool ok)
{
    (void)n;
    const dev_node *c = arg;
    wf__var_device_written(c->sl, c->i, ok);
}

static int dev_call(void *arg, wf_kernel_fn k, const wf_kernel_ctx *ctx, const wf_node *n,
                    wf_tensor *const *in, wf_tensor **out)
{
    wf_device *d = ((const dev_node *)arg)->d;
    kernel_call call = { k, ctx, n, in, out };
    return d->ops->run(d, call_kernel, &call, n->name, NULL);
}

static const wf__node_env dev_env = {
    .alloc = dev_alloc,
    .writable = dev_writable,
    .written = dev_written,
    .call = dev_call,
};

int wf__exec_device_node(wf__slot *sl, int i)
{
    const wf__plan *p = sl->plan;
    const wf__plan_dev *pd = p->dev;
    const wf_node *n = p->nodes[i];
    int id = pd->pl.where[i];
    wf_device *d = pd->devs[id];
    const int32_t *idx = p->in_idx + p->in_off[i];
    int n_in = n->n_inputs, rc = 0;
    wf_tensor *in_stack[STACK_INPUTS], **in = in_stack, *out = NULL;
    wf_dtype dt_stack[STACK_INPUTS], *dts = dt_stack;
    wf_shape sh_stack[STACK_INPUTS], *shapes = sh_stack;
    if (n_in > STACK_INPUTS) {
        in = malloc((size_t)n_in * sizeof *in);
        dts = malloc((size_t)n_in * sizeof *dts);
        shapes = malloc((size_t)n_in * sizeof *shapes);
        if (!in || !dts || !shapes) {
            rc = wf__slot_fail(sl, n, WF_ENOMEM, "no memory for the inputs");
            goto done;
        }
    }
    for (int k = 0; k < n_in; k++) {
        in[k] = sl->dev->dvals[idx[k]]; /* made here, or copied here by a copy node */
        if (!in[k]) { /* an internal error: a copy not made, or dropped too early */
            char why[128];
            snprintf(why, sizeof why, "input %d has no value on %s", k, d->info.name);
            rc = wf__slot_fail(sl, n, WF_EINVAL, why);
            goto done;
        }
    }
    wf_dtype dt = n->dtype;
    wf_shape shape = n->shape;
    if (p->reinfer[i] && (rc = wf__slot_reinfer(sl, n, in, dts, shapes, &dt, &shape)) < 0)
        goto done;
    wf_kernel_ctx ctx = {
        .rt = p->sess->rt,
        .device = d->info.index,
        .step = sl->step,
        .xfer_step = sl->xfer_step,
        .data = p->kdata[i],
    };
#ifdef WF_HAVE_CUDA
    ctx.stream = wf__cuda_device_queue(d);
#endif
    char msg[WF_ERRMSG_MAX];
    rc = wf__node_run(&dev_env, &(dev_node){ sl, i, d }, p->kernel[i], &ctx, n, in, dt, &shape,
                      d->info.name, &out, msg, sizeof msg);
    if (rc < 0) {
        rc = wf__slot_fail_msg(sl, rc, msg);
        goto done;
    }
    sl->dev->dvals[i] = out;
    out = NULL;
done:
    wf_tensor_release(out);
    if (in != in_stack) {
        free(in);
        free(dts);
        free(shapes);
    }
    return rc;
}

void wf__exec_device_drop(wf__slot *sl, int32_t j)
{
    wf_tensor *t = sl->dev->dvals[j];
    sl->dev->dvals[j] = NULL;
    wf_tensor_release(t); /* a device buffer goes back to its pool in stream order */
}

int wf__exec_device_finish(wf__slot *sl, int rc)
{
    const wf__plan_dev *pd = sl->plan->dev;
    for (int id = 1; id < pd->n_devices; id++) {
        wf_device *d = pd->devs[id];
        if (!d)
            continue;
        int r = d->ops->sync(d);
        if (r < 0 && rc >= 0) {
            snprintf(sl->errmsg, sizeof sl->errmsg, "wf_session_run: %s: %s", d->info.name,
                     wf_last_errmsg());
            sl->err = r;
            rc = r;
        }
    }
    for (int i = 0; i < sl->plan->n; i++)
        wf__exec_device_drop(sl, i);
    return rc;
}
