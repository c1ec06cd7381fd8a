/* devices/copy.c: the kernels of core's copy op (core/op.h) between the host and devices and
 *   between devices, registered for a session by wf__devices_register_kernels()
 *   (devices/device.h).
 * Owns: how a value crosses between two devices of one process, through the device
 *   interface only (copy_from_host, copy_to_host, copy_peer, notify), so one kernel serves
 *   every kind of device: the simulated device (devices/sim.c), the CPU device and CUDA.
 * The three directions (attrs.from_dev and attrs.to_dev, 0 the host, index the session's
 *   device table, the kernel's wf_kernel_ctx.data):
 *   - host to device: a strided host value is gathered first; the copy is staged (pinned
 *     memory on CUDA), so the host value may change once the kernel returns, and the copy's
 *     readers on the device queue behind it (work given to one device completes in order);
 *   - device to device: the destination copies after the source's work so far (copy_peer),
 *     in order with its own work; the kernel returns at once, as above;
 *   - device to host: the copy is queued, then the device is asked to notify its
 *     completion, and the kernel pends (WF_KERNEL_PENDING): the device's actor calls
 *     ctx->complete once the bytes have landed, so no worker waits. Without ctx->complete
 *     (nothing can wait) the kernel waits for the device itself.
 * A device value is contiguous (device kernels write the contiguous output their caller
 *   allocated); a strided one is refused (WF_ENOSYS), never copied wrongly.
 * Not here: where copies go in a plan (runtime/compile/pass_place.c), the op's def
 *   (core/op_comm.c). */
#include "../core/error.h"
#include "../core/graph.h"
#include "../core/op.h"
#include "device.h"

#include <stdio.h>
#include <stdlib.h>

/* Device 'id' of the table ('t' NULL or 'id' 0: the host, NULL). Sets '*bad' for an id
 * that names no open device. */
static wf_device *dev_at(const wf__device_table *t, int id, bool *bad)
{
    if (id == 0)
        return NULL;
    if (!t || id < 0 || id >= t->n || !t->devs[id]) {
        *bad = true;
        return NULL;
    }
    return t->devs[id];
}

/* A copy to the host waiting for its device: what to call when it has landed. */
typedef struct landing {
    void (*complete)(void *token, int rc);
    void *token;
} landing;

static void landed(void *arg, int status)
{
    landing l = *(landing *)arg;
    free(arg);
    l.complete(l.token, status); /* a failure's message is the device's, naming it */
}

static int copy_kernel(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                       wf_tensor **out)
{
    const wf__device_table *t = ctx->data;
    bool bad = false;
    wf_device *from = dev_at(t, n->attrs->from_dev, &bad), *to = dev_at(t, n->attrs->to_dev, &bad);
    if (bad)
        return wf__err(WF_EINVAL, "a copy from device %d to device %d: no such open device",
                       (int)n->attrs->from_dev, (int)n->attrs->to_dev);
    const wf_tensor *x = in[0];
    wf_tensor *o = *out;
    size_t bytes = (size_t)x->numel * wf_dtype_size(x->dtype);
    if (from && !x->contiguous)
        return wf__err(WF_ENOSYS,
                       "a strided value on %s cannot be copied (device values are "
                       "contiguous)",
                       from->info.name);
    if (!bytes)
        return 0;
    int rc;
    if (!from) { /* host to device */
        void *tmp = NULL;
        const void *src = x->data;
        if (!x->contiguous) {
            if (!(tmp = malloc(bytes)))
                return wf__err(WF_ENOMEM, "no memory to gather a strided value of %zu bytes",
                               bytes);
            if ((rc = wf_tensor_read(x, x->dtype, tmp, bytes)) < 0) {
                free(tmp);
                return rc;
            }
            src = tmp;
        }
        rc = to->ops->copy_from_host(to, o->buf, (size_t)(o->data - (char *)o->buf->data), src,
                                     bytes, NULL); /* staged: 'src' may go now */
        free(tmp);
        return rc;
    }
    size_t src_off = (size_t)(x->data - (char *)x->buf->data);
    if (to) /* device to device, in the destination's order */
        return to->ops->copy_peer(to, o->buf, (size_t)(o->data - (char *)o->buf->data), from,
                                  x->buf, src_off, bytes);
    /* Device to host: lands later. */
    if ((rc = from->ops->copy_to_host(from, x->buf, src_off, (void *)o->data, bytes, NULL)) < 0)
        return rc;
    landing *l = ctx->complete ? malloc(sizeof *l) : NULL;
    if (l) {
        *l = (landing){ ctx->complete, ctx->token };
        if (from->ops->notify(from, landed, l) == 0)
            return WF_KERNEL_PENDING;
        free(l);
    }
    /* Nothing can wait (or no memory to): the output must not go while the copy is queued. */
    if ((rc = from->ops->sync(from)) < 0)
        return wf__err(rc, "copying to the host from %s: %s", from->info.name, wf_last_errmsg());
    return 0;
}

int wf__devices_register_kernels(wf__kernels *r, const wf__device_table *t)
{
    if (!r || !t)
        return wf__err(WF_EINVAL, "wf__devices_register_kernels: NULL %s",
                       r ? "device table" : "registry");
    /* The simulated devices (and the CPU device) are of the CPU kind. */
    int rc = wf__kernels_register(r, &wf_op_copy, WF_KERNEL_CPU, copy_kernel, NULL, (void *)t);
#ifdef WF_HAVE_CUDA
    if (rc >= 0)
        rc = wf__kernels_register(r, &wf_op_copy, WF_KERNEL_CUDA, copy_kernel, NULL, (void *)t);
#endif
    return rc;
}
