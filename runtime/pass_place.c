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
 * Copies: every value read on another device than its own (host to GPU, GPU to host, GPU
 *   to GPU), and every fetched GPU value (to the host), gets one copy step per destination
 *   device, whatever the number of its readers there (wf__plan_dev.copies). The copies are
 *   task-graph nodes of their own after the plan's nodes (exec_device.c): the plan's order
 *   and its nodes stay those of the graph; only the readers' edges go through the copies
 *   (wf__plan_edge_source()).
 * Simulated devices: a test may give the session simulated devices (wf_session.n_sim,
 *   devices/sim.c), numbered after the runtime's; they run the CPU kernels, so their
 *   placement checks the CPU kernel.
 * TODO(#6): variables resident on a GPU. Today a variable read on a GPU is copied there at
 *   every run and its gradient comes back for the host update. The plan: a variable whose
 *   readers and updates in a plan are all on one GPU gets a session-level device value
 *   (per variable: the device tensor and which copy is current, host, device or both,
 *   under 'var_lock', bumped by a version at each write); its readers read it with no copy
 *   step, its update nodes run there (exec_device.c taking the device value writable, as
 *   exec.c's take_writable() does on the host), and the host value becomes stale.
 *   wf_session_variable(), checkpoints and host readers copy it back on demand (then both
 *   are current); wf_session_assign() makes the host current and the device value stale.
 *   This needs the devices opened once per session, not per plan (below): two opens of a
 *   GPU have unordered streams, so they cannot share a value.
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

/* "cpu:0", "cuda:K" or "sim:K" for device 'id' of a runtime with 'n_real' devices (the CPU,
 * then the CUDA GPUs) and simulated ones after them. */
static const char *dev_name(int id, int n_real, char *buf, size_t size)
{
    if (id == 0)
        snprintf(buf, size, "cpu:0");
    else if (id < n_real)
        snprintf(buf, size, "cuda:%d", id - 1);
    else
        snprintf(buf, size, "sim:%d", id - n_real);
    return buf;
}

/* The kernel slot (WF_KERNEL_*) that runs on device 'id'. */
static int kernel_kind(int id, int n_real)
{
    return id > 0 && id < n_real ? WF_KERNEL_CUDA : WF_KERNEL_CPU;
}

/* Whether the rule may put 'n' (a kernel node) on device 'id' (a GPU) at all. f64 stays on
 * the CPU: most GPUs run it at 1/32 to 1/64 of their f32 rate, and f64 graphs are gradient
 * checks. */
static bool gpu_able(const wf_node *n, int id, int n_real)
{
    if (!n->op->kernel[kernel_kind(id, n_real)] || n->op->n_assign > 0 ||
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
    free(pd->copies);
    free(pd->copy_off);
    free(pd->in_copy);
    free(pd);
    p->dev = NULL;
}

static int cmp_copy(const void *a, const void *b)
{
    const wf__copy *x = a, *y = b;
    if (x->value != y->value)
        return x->value < y->value ? -1 : 1;
    return (x->to > y->to) - (x->to < y->to);
}

/* The copy of value 'j' to device 'to' (it exists: place_copies() made it). */
static int32_t find_copy(const wf__plan_dev *pd, int32_t j, int to)
{
    for (int32_t c = pd->copy_off[j]; c < pd->copy_off[j + 1]; c++)
        if (pd->copies[c].to == to)
            return c;
    return -1;
}

/* Makes the copy steps of 'p' ('where' set): one per value and destination device, for the
 * edges that cross devices and for the fetched GPU values (the key also holds targets,
 * whose copy finds no value to copy and does nothing: exec_device.c). Sets 'copies',
 * 'copy_off' and 'in_copy'. Returns 0 or WF_ENOMEM. */
static int place_copies(wf__plan *p)
{
    wf__plan_dev *pd = p->dev;
    int n = p->n;
    int32_t n_edges = p->in_off[n];
    /* At most one per crossing edge and one per key: collect, sort, remove repeats. */
    wf__copy *c = malloc((size_t)(n_edges + p->n_key + 1) * sizeof *c);
    if (!c)
        return wf__err(WF_ENOMEM, "placement: no memory for the copies of %d nodes", n);
    int nc = 0;
    for (int i = 0; i < n; i++)
        for (int32_t e = p->in_off[i]; e < p->in_off[i + 1]; e++) {
            int32_t j = p->in_idx[e];
            if (pd->where[j] != pd->where[i])
                c[nc++] = (wf__copy){ j, pd->where[j], pd->where[i] };
        }
    for (int k = 0; k < p->n_key; k++) {
        int32_t id = p->key[k];
        int32_t i = id >= 0 && id < p->sess->n_nodes ? p->index_of[id] : -1;
        if (i >= 0 && pd->where[i] > 0)
            c[nc++] = (wf__copy){ i, pd->where[i], 0 };
    }
    qsort(c, (size_t)nc, sizeof *c, cmp_copy);
    int kept = 0;
    for (int k = 0; k < nc; k++)
        if (!kept || cmp_copy(&c[kept - 1], &c[k]) != 0)
            c[kept++] = c[k];
    pd->copies = c;
    pd->n_copies = kept;
    for (int k = 0; k < kept; k++)
        pd->copy_off[c[k].value + 1]++;
    for (int i = 0; i < n; i++)
        pd->copy_off[i + 1] += pd->copy_off[i];
    for (int i = 0; i < n; i++)
        for (int32_t e = p->in_off[i]; e < p->in_off[i + 1]; e++) {
            int32_t j = p->in_idx[e];
            pd->in_copy[e] = pd->where[j] == pd->where[i] ? -1 : find_copy(pd, j, pd->where[i]);
        }
    return 0;
}

int wf__plan_place(wf__plan *p)
{
    wf_session *s = p->sess;
    int n = p->n;
    int n_real = wf_device_count(s->rt);
    if (n_real < 1)
        n_real = 1;
    int n_dev = n_real + s->n_sim;
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
        if (!node->op->kernel[kernel_kind(want, n_real)]) {
            char desc[WF_ERRMSG_MAX];
            return wf__err(WF_ENODEV,
                           "placement: %s is placed on device %d (%s), but op '%s' has no %s "
                           "kernel",
                           wf__rt_node_desc(node, desc, sizeof desc), want,
                           dev_name(want, n_real, dn, sizeof dn), node->op->name,
                           kernel_kind(want, n_real) == WF_KERNEL_CUDA ? "CUDA" : "CPU");
        }
        if (node->op->n_assign > 0) {
            char desc[WF_ERRMSG_MAX];
            return wf__err(WF_ENOSYS,
                           "placement: %s is placed on device %d (%s), but it updates "
                           "variables, which live on the host in this version",
                           wf__rt_node_desc(node, desc, sizeof desc), want,
                           dev_name(want, n_real, dn, sizeof dn));
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
    size_t n_edges = (size_t)p->in_off[n];
    pd->devs = calloc((size_t)n_dev, sizeof *pd->devs);
    pd->where = calloc(m, sizeof *pd->where);
    pd->copy_off = calloc(m + 1, sizeof *pd->copy_off);
    pd->in_copy = malloc((n_edges ? n_edges : 1) * sizeof *pd->in_copy);
    if (!pd->devs || !pd->where || !pd->copy_off || !pd->in_copy) {
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
        } else if (rule_gpu) {
            int want = s->device;
            if (want < 1) {
                want = 1; /* prefer the (first) GPU, unless an input is on another one */
                for (int32_t e = p->in_off[i]; e < p->in_off[i + 1]; e++)
                    if (pd->where[p->in_idx[e]] > 0) {
                        want = pd->where[p->in_idx[e]];
                        break;
                    }
            }
            if (gpu_able(node, want, n_real))
                where = want;
        }
        pd->where[i] = (int16_t)where;
        pd->n_gpu += where > 0;
    }
    if (pd->n_gpu == 0) {
        wf__plan_place_free(p);
        return 0;
    }
    int rc = place_copies(p);
    for (int i = 0; rc >= 0 && i < n; i++) {
        int id = pd->where[i];
        if (id > 0 && !pd->devs[id]) {
            wf__sim_opts so = { s->sim_delay_us, s->sim_fail_alloc, s->sim_fail_notice };
            rc = id < n_real ? wf_device_open(s->rt, id, NULL, &pd->devs[id])
                             : wf__sim_open(s->rt, id, id - n_real, &so, &pd->devs[id]);
            if (rc < 0) {
                char why[WF_ERRMSG_MAX], desc[WF_ERRMSG_MAX];
                snprintf(why, sizeof why, "%s", wf_last_errmsg());
                rc = wf__err(rc, "placement: %s: opening device %d (%s): %s",
                             wf__rt_node_desc(p->nodes[i], desc, sizeof desc), id,
                             dev_name(id, n_real, dn, sizeof dn), why);
            }
        }
    }
    if (rc < 0) {
        wf__plan_place_free(p);
        return rc;
    }
    p->run_inline = false; /* the task graph orders GPU work and copies */
    return 0;
}
