/* runtime/pass_place.c: placement of a plan's nodes on devices.
 * Owns: wf_node_set_device() (the per-node placement of the public API), the placement of
 *   a compiled plan (wf__plan_dev: the device of every node, which values cross devices),
 *   and the devices a plan opens.
 * The rule (DESIGN.md, "Placement": user hints first): a node placed with
 *   wf_node_set_device() goes there (checked: WF_EINVAL for a device the runtime lacks,
 *   WF_ENODEV for an op without a kernel for it, naming the node and the device); the
 *   others follow wf_session_opts.device: -1 keeps them on the CPU, D >= 1 puts them on
 *   device D where their op has a kernel for it, and 0 (the default) puts a node where its
 *   inputs are and prefers the GPU for ops with a CUDA kernel. Under the rule these stay on
 *   the CPU: sources (their values are host tensors: fed, constant, or the session's
 *   variables), updates of variables (variables are host values in this version), ops that
 *   allocate their own output, f64 nodes (see gpu_able()), and every node of a plan small
 *   enough to run inline (a copy to a GPU costs more than such a plan).
 * Copies: an edge from the CPU to a GPU copies the value when it is made
 *   (exec_device.c: once per value and GPU, whatever the number of readers); an edge from a
 *   GPU to the CPU, and a fetched GPU value, copy it back. The executor does them within
 *   the producing node's task, so no copy node enters the plan and the plan's order, its
 *   edges and its task graph stay those of the graph.
 * Why the plan opens its devices: the session's layout (session.c) has no device table;
 *   one open per plan gives each plan its own streams and pool, which is what its runs
 *   use, and closes them with the plan. A session with a training and an evaluation plan
 *   opens a GPU twice (two pools and cuBLAS handles: a few tens of MiB).
 * Without a GPU (or built without CUDA) the runtime has one device, nothing is placed
 *   elsewhere, and 'p->dev' stays NULL: CPU plans run exactly as before.
 * Not here: running placed nodes and the copies (exec_device.c), the devices (devices/). */
#include "../devices/device.h"
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>

int wf_node_set_device(wf_node *n, int device)
{
    if (!n)
        return wf__err(WF_EINVAL, "wf_node_set_device: node is NULL");
    if (device < -1)
        return wf__err(WF_EINVAL,
                       "wf_node_set_device: %s '%s': device %d is not a device id (0 .. n-1) "
                       "nor -1",
                       n->op ? n->op->name : "?", n->name ? n->name : "?", device);
    n->device = device;
    return 0;
}

int wf_node_device(const wf_node *n)
{
    return n ? n->device : -1;
}

/* "cpu:0" or "cuda:K" for device 'id' of a runtime with CUDA devices after the CPU. */
static const char *dev_name(int id, char *buf, size_t size)
{
    if (id == 0)
        snprintf(buf, size, "cpu:0");
    else
        snprintf(buf, size, "cuda:%d", id - 1);
    return buf;
}

static int place_fail(const wf_node *n, int code, const char *fmt, int a, int b)
{
    char desc[WF_ERRMSG_MAX], why[256];
    snprintf(why, sizeof why, fmt, a, b);
    return wf__err(code, "placement: %s: %s", wf__rt_node_desc(n, desc, sizeof desc), why);
}

/* Whether the rule may put 'n' (a kernel node) on a GPU at all. f64 stays on the CPU: most
 * GPUs run it at 1/32 to 1/64 of their f32 rate, and f64 graphs are gradient checks. */
static bool gpu_able(const wf_node *n)
{
    if (!n->op->kernel[WF_KERNEL_CUDA] || n->op->n_assign > 0 ||
        (n->op->flags & WF_OP_DYNAMIC_SHAPE) || n->dtype == WF_F64)
        return false;
    for (int k = 0; k < n->n_inputs; k++)
        if (n->inputs[k]->dtype == WF_F64)
            return false;
    return true;
}

void wf__plan_place_free(wf__plan *p)
{
    wf__plan_dev *pd = p->dev;
    if (!pd)
        return;
    for (int id = 0; pd->devs && id < pd->n_devices; id++)
        wf_device_close(pd->devs[id]);
    free(pd->devs);
    free(pd->where);
    free(pd->copy_to);
    free(pd->to_host);
    free(pd);
    p->dev = NULL;
}

int wf__plan_place(wf__plan *p)
{
    wf_session *s = p->sess;
    int n = p->n;
    int n_dev = wf_device_count(s->rt);
    if (n_dev < 1)
        n_dev = 1;
    char dn[32];
    const char *none = n_dev == 1 ? " (cpu:0; no CUDA device: none found, or weft is built "
                                    "without CUDA)"
                                  : "";
    /* Explicit placements first: checked whether or not anything else is placed. */
    bool explicit_gpu = false;
    for (int i = 0; i < n; i++) {
        const wf_node *node = p->nodes[i];
        int want = node->device;
        if (want < 0)
            continue;
        if (want >= n_dev) {
            char desc[WF_ERRMSG_MAX];
            return wf__err(WF_EINVAL,
                           "placement: %s is placed on device %d, but this runtime has %d "
                           "device%s%s",
                           wf__rt_node_desc(node, desc, sizeof desc), want, n_dev,
                           n_dev == 1 ? "" : "s", none);
        }
        if (want == 0 || p->kind[i] != WF__PN_KERNEL)
            continue;
        if (!node->op->kernel[WF_KERNEL_CUDA]) {
            char desc[WF_ERRMSG_MAX];
            return wf__err(WF_ENODEV,
                           "placement: %s is placed on device %d (%s), but op '%s' has no CUDA "
                           "kernel",
                           wf__rt_node_desc(node, desc, sizeof desc), want,
                           dev_name(want, dn, sizeof dn), node->op->name);
        }
        if (node->op->n_assign > 0) {
            char desc[WF_ERRMSG_MAX];
            return wf__err(WF_ENOSYS,
                           "placement: %s is placed on device %d (%s), but it updates "
                           "variables, which live on the host in this version",
                           wf__rt_node_desc(node, desc, sizeof desc), want,
                           dev_name(want, dn, sizeof dn));
        }
        explicit_gpu = true;
    }
    if (s->device < -1 || s->device >= n_dev)
        return wf__err(WF_EINVAL,
                       "placement: wf_session_opts.device is %d, but this runtime has %d "
                       "device%s%s",
                       s->device, n_dev, n_dev == 1 ? "" : "s", none);
    bool rule_gpu = n_dev > 1 && s->device != -1 && !p->run_inline;
    if (!explicit_gpu && !rule_gpu)
        return 0; /* every node on the CPU */

    wf__plan_dev *pd = calloc(1, sizeof *pd);
    if (!pd)
        return wf__err(WF_ENOMEM, "placement: no memory for %d nodes", n);
    p->dev = pd;
    pd->n_devices = n_dev;
    size_t m = (size_t)(n ? n : 1);
    pd->devs = calloc((size_t)n_dev, sizeof *pd->devs);
    pd->where = calloc(m, sizeof *pd->where);
    pd->copy_to = calloc(m, sizeof *pd->copy_to);
    pd->to_host = calloc(m, 1);
    if (!pd->devs || !pd->where || !pd->copy_to || !pd->to_host) {
        wf__plan_place_free(p);
        return wf__err(WF_ENOMEM, "placement: no memory for %d nodes", n);
    }
    /* Plan order is topological: each node's inputs are placed before it. */
    for (int i = 0; i < n; i++) {
        const wf_node *node = p->nodes[i];
        int where = 0;
        if (p->kind[i] != WF__PN_KERNEL) {
            where = 0;
        } else if (node->device >= 0) {
            where = node->device;
        } else if (rule_gpu && gpu_able(node)) {
            if (s->device >= 1) {
                where = s->device;
            } else {
                where = 1; /* prefer the (first) GPU, unless an input is on another one */
                for (int32_t e = p->in_off[i]; e < p->in_off[i + 1]; e++)
                    if (pd->where[p->in_idx[e]] > 0) {
                        where = pd->where[p->in_idx[e]];
                        break;
                    }
            }
        }
        pd->where[i] = (int16_t)where;
        pd->n_gpu += where > 0;
    }
    if (pd->n_gpu == 0) {
        wf__plan_place_free(p);
        return 0;
    }
    /* Which values cross devices. */
    for (int i = 0; i < n; i++) {
        int wi = pd->where[i];
        for (int32_t e = p->in_off[i]; e < p->in_off[i + 1]; e++) {
            int j = p->in_idx[e], wj = pd->where[j];
            if (wj > 0 && wi == 0) {
                pd->to_host[j] = 1;
            } else if (wj == 0 && wi > 0) {
                if (pd->copy_to[j] && pd->copy_to[j] != wi) {
                    wf__plan_place_free(p);
                    return place_fail(p->nodes[j], WF_ENOSYS,
                                      "its value is read on two GPUs (devices %d and %d): "
                                      "place its readers on one",
                                      pd->copy_to[j], wi);
                }
                pd->copy_to[j] = (int16_t)wi;
            } else if (wj > 0 && wi > 0 && wj != wi) {
                const wf_node *node = p->nodes[i];
                wf__plan_place_free(p);
                return place_fail(node, WF_ENOSYS,
                                  "it runs on device %d but reads a value of device %d: copies "
                                  "between GPUs are not supported yet (place both on one)",
                                  wi, wj);
            }
        }
    }
    for (int k = 0; k < p->n_key; k++) {
        int32_t id = p->key[k];
        int32_t i = id >= 0 && id < s->n_nodes ? p->index_of[id] : -1;
        if (i >= 0 && pd->where[i] > 0)
            pd->to_host[i] = 1; /* fetched (or a target: its value is then dropped) */
    }
    for (int i = 0; i < n; i++) {
        int id = pd->where[i];
        if (id > 0 && !pd->devs[id]) {
            int rc = wf_device_open(s->rt, id, NULL, &pd->devs[id]);
            if (rc < 0) {
                char why[WF_ERRMSG_MAX];
                snprintf(why, sizeof why, "%s", wf_last_errmsg());
                const wf_node *node = p->nodes[i];
                wf__plan_place_free(p);
                char desc[WF_ERRMSG_MAX];
                return wf__err(rc, "placement: %s: opening device %d (%s): %s",
                               wf__rt_node_desc(node, desc, sizeof desc), id,
                               dev_name(id, dn, sizeof dn), why);
            }
        }
    }
    p->run_inline = false; /* the task graph orders GPU work and copies */
    return 0;
}
