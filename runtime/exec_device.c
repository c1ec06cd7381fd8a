/* runtime/exec_device.c: running plan nodes placed on a GPU, and the copies between the
 *   host and GPUs (DESIGN.md, "The path of one training step", step 4).
 * Owns: a run slot's device values ('sl->dev': per plan node, its value on a GPU: the
 *   output of a GPU node, or the copy of a host value that GPU nodes read), what the task
 *   of a GPU node does, and the copies.
 * How a GPU node runs: its task (on a worker, like every node) takes its inputs' device
 *   values, allocates its output from the device's pool, and hands the kernel
 *   (op->kernel[WF_KERNEL_CUDA], with the device's queue as wf_kernel_ctx.stream) to the
 *   device, which enqueues it on its compute stream and returns. The task then ends: its
 *   readers on the same device are released while the GPU has not even started, and their
 *   kernels queue behind it (the device completes its work in order, devices/device.h).
 *   A value a CPU node reads (or a fetch) is copied back within the producing task, which
 *   waits for that copy's event: only edges from a GPU to the CPU wait, and they wait in
 *   the task of the producer, so CPU readers see finished data.
 *   TODO(#6): release CPU readers from the copy's completion instead (a task-graph node
 *   completed later by the device actor), so that no worker waits for a GPU->CPU copy.
 * Copies to a GPU: the task that made a host value its GPU readers need enqueues its copy
 *   (staged through pinned memory, so the host value may change afterwards: an update of
 *   a variable after its readers cannot reach a copy already made).
 * Lifetimes: a device value is dropped with its host value, at its last use (exec.c's
 *   drop_use()); what is left at the end of the run (a fetched GPU value) is dropped by
 *   wf__exec_device_finish(), which also waits for the devices' work so that a kernel's
 *   late (asynchronous) error fails this run, not the next one.
 * Not here: placement (pass_place.c), the devices (devices/), CPU nodes (exec.c). */
#include "../devices/device.h"
#include "../memory/pool.h"
#include "internal.h"

#ifdef WF_HAVE_CUDA
#    include "../devices/cuda.h"
#endif

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A slot's device state. */
typedef struct wf__slot_dev {
    wf_tensor **dvals; /* per plan node: its device value, or NULL */
    wf_event **events; /* per device id: this slot's event on it (NULL for the CPU) */
    int n_devices;
} wf__slot_dev;

int wf__slot_dev_init(wf__slot *sl)
{
    const wf__plan_dev *pd = sl->plan->dev;
    if (!pd)
        return 0;
    wf__slot_dev *sd = calloc(1, sizeof *sd);
    if (!sd)
        return wf__err(WF_ENOMEM, "wf_session_run: no memory for a run's device values");
    sl->dev = sd;
    sd->n_devices = pd->n_devices;
    sd->dvals = calloc((size_t)(sl->plan->n ? sl->plan->n : 1), sizeof *sd->dvals);
    sd->events = calloc((size_t)pd->n_devices, sizeof *sd->events);
    if (!sd->dvals || !sd->events)
        return wf__err(WF_ENOMEM, "wf_session_run: no memory for a run's device values");
    for (int id = 1; id < pd->n_devices; id++) {
        wf_device *d = pd->devs[id];
        if (d) {
            int rc = d->ops->event_create(d, &sd->events[id]);
            if (rc < 0)
                return rc;
        }
    }
    return 0;
}

void wf__slot_dev_free(wf__slot *sl)
{
    wf__slot_dev *sd = sl->dev;
    if (!sd)
        return;
    const wf__plan_dev *pd = sl->plan->dev;
    if (sd->dvals)
        for (int i = 0; i < sl->plan->n; i++)
            wf_tensor_release(sd->dvals[i]);
    for (int id = 1; sd->events && id < sd->n_devices; id++)
        if (sd->events[id])
            pd->devs[id]->ops->event_destroy(pd->devs[id], sd->events[id]);
    free(sd->dvals);
    free(sd->events);
    free(sd);
    sl->dev = NULL;
}

/* A new device tensor of 'dt' and 'shape' on 'd'. Returns NULL with wf_last_errmsg(). */
static wf_tensor *device_tensor(wf_device *d, wf_dtype dt, wf_shape shape)
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

/* Copies device value 't' of node 'i' back into a new host tensor: sl->vals[i]. A strided
 * view (a kernel may return one, as CPU kernels do) comes back as the same view of a host
 * copy of its whole buffer. */
static int to_host(wf__slot *sl, int i, wf_device *d, int id, wf_tensor *t)
{
    const wf_node *n = sl->plan->nodes[i];
    size_t esize = wf_dtype_size(t->dtype);
    bool whole = !t->contiguous;
    wf_shape hs = whole ? WF_SHAPE((int64_t)(t->buf->bytes / esize)) : t->shape;
    wf_tensor *h = wf__pool_tensor_alloc(sl->plan->sess->pool, t->dtype, hs);
    if (!h)
        return wf__slot_fail(sl, n, WF_ENOMEM, wf_last_errmsg());
    size_t elem_off = (size_t)(t->data - (char *)t->buf->data);
    size_t bytes = whole ? (size_t)h->numel * esize : (size_t)t->numel * esize;
    size_t off = whole ? 0 : elem_off;
    wf_event *ev = sl->dev->events[id];
    int rc = d->ops->copy_to_host(d, t->buf, off, h->data, bytes, ev);
    if (rc >= 0)
        rc = d->ops->event_sync(d, ev, 0); /* the latest record: ours or a later one */
    if (rc < 0) {
        char why[WF_ERRMSG_MAX];
        snprintf(why, sizeof why, "copying its value from %s to the host: %s", d->info.name,
                 wf_last_errmsg());
        wf_tensor_release(h);
        return wf__slot_fail(sl, n, rc, why);
    }
    if (whole) {
        wf_tensor *v = wf__tensor_alias(h, t->shape, t->strides, (int64_t)(elem_off / esize));
        wf_tensor_release(h); /* the view retains it */
        if (!v)
            return wf__slot_fail(sl, n, WF_ENOMEM, wf_last_errmsg());
        h = v;
    }
    sl->vals[i] = h;
    return 0;
}

#define STACK_INPUTS 8

int wf__exec_device_node(wf__slot *sl, int i)
{
    const wf__plan *p = sl->plan;
    const wf__plan_dev *pd = p->dev;
    const wf_node *n = p->nodes[i];
    int id = pd->where[i];
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
        in[k] = sl->dev->dvals[idx[k]];
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
    bool dynamic = n->op->flags & WF_OP_DYNAMIC_SHAPE;
    if (!dynamic && !(out = device_tensor(d, dt, shape))) {
        char why[WF_ERRMSG_MAX];
        snprintf(why, sizeof why, "its output on %s: %s", d->info.name, wf_last_errmsg());
        rc = wf__slot_fail(sl, n, WF_ENOMEM, why);
        goto done;
    }
    wf_kernel_ctx ctx = {
        .rt = p->sess->rt,
        .device = d->info.index,
        .step = sl->step,
    };
#ifdef WF_HAVE_CUDA
    ctx.stream = wf__cuda_device_queue(d);
#endif
    kernel_call call = { n->op->kernel[d->info.kind], &ctx, n, in, &out };
    if (!call.fn) { /* placement checked it; a pass's node may lack it */
        rc =
            wf__slot_fail(sl, n, WF_ENODEV, "its op has no kernel for the device it was placed on");
        goto done;
    }
    rc = d->ops->run(d, call_kernel, &call, n->name, NULL);
    if (rc < 0) {
        char why[WF_ERRMSG_MAX];
        snprintf(why, sizeof why, "on %s: %s", d->info.name, wf_last_errmsg());
        rc = wf__slot_fail(sl, n, rc, why);
        goto done;
    }
    if ((rc = wf__slot_check_out(sl, n, d->info.name, out, dt, shape, dynamic)) < 0)
        goto done;
    sl->dev->dvals[i] = out;
    out = NULL;
    if (pd->to_host[i])
        rc = to_host(sl, i, d, id, sl->dev->dvals[i]);
done:
    wf_tensor_release(out);
    if (in != in_stack) {
        free(in);
        free(dts);
        free(shapes);
    }
    return rc;
}

int wf__exec_device_after(wf__slot *sl, int i)
{
    const wf__plan_dev *pd = sl->plan->dev;
    int id = pd->copy_to[i];
    wf_tensor *h = sl->vals[i];
    if (id <= 0 || !h || sl->dev->dvals[i])
        return 0;
    const wf_node *n = sl->plan->nodes[i];
    wf_device *d = pd->devs[id];
    size_t bytes = (size_t)h->numel * wf_dtype_size(h->dtype);
    const void *src = h->data;
    void *tmp = NULL;
    if (!h->contiguous && bytes) { /* a strided feed or view: gather it first */
        if (!(tmp = malloc(bytes)))
            return wf__slot_fail(sl, n, WF_ENOMEM,
                                 "no memory to gather a strided value for a copy");
        if (wf_tensor_read(h, h->dtype, tmp, bytes) < 0) {
            free(tmp);
            return wf__slot_fail(sl, n, WF_EINVAL, wf_last_errmsg());
        }
        src = tmp;
    }
    wf_tensor *t = device_tensor(d, h->dtype, h->shape);
    int rc = t ? 0 : WF_ENOMEM;
    if (t && bytes)
        rc = d->ops->copy_from_host(d, t->buf, 0, src, bytes, NULL); /* staged: 'src' is free
                                                                        to go on return */
    free(tmp);
    if (rc < 0) {
        char why[WF_ERRMSG_MAX];
        snprintf(why, sizeof why, "copying its value to %s: %s", d->info.name, wf_last_errmsg());
        wf_tensor_release(t);
        return wf__slot_fail(sl, n, rc, why);
    }
    sl->dev->dvals[i] = t;
    return 0;
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
        if (sl->dev->dvals[i])
            wf__exec_device_drop(sl, i);
    return rc;
}
