/* runtime/compile/pass_place.c: wiring placement/'s device assignment into a compiled plan.
 * Owns: the plan's side of placement: what wf__place() (placement/place.c, a pure
 *   function: the rule, the updates and resident variables, the copy nodes) is given (the
 *   plan's nodes and edges, the runtime's devices, the session's registry and rule), how its
 *   result replaces the plan's arrays (the partitioned node list with its copy nodes, the
 *   per-node kinds, uses, 'index_of', 'host_vars'), which devices the plan uses (opened
 *   through the compile input's open_device(): the session's, once per session,
 *   runtime/var_device.c), and the kernel each plan node runs (the registered one for its
 *   device's kind).
 * Devices are the session's: opened at the first plan that places a node there and shared
 *   by every plan, so the work of all plans and runs on a device is one in-order queue
 *   (devices/device.h), which is what lets one plan's update write a device value another
 *   plan's kernels read.
 * Without a GPU (or built without CUDA) the runtime has one device, nothing is placed
 *   elsewhere, and 'p->dev' stays NULL: CPU plans run exactly as before.
 *   TODO(#6): a first run on a real GPU (the CUDA path is compile-checked only; simulated
 *   devices test the placement and the residency).
 * Not here: the rule (placement/place.c), running placed nodes and the copies
 *   (exec_device.c), the device values of variables (var_device.c), the devices (devices/). */
#include "../../placement/place.h"
#include "plan.h"

#include <weft/devices.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The runtime's real devices (the CPU, then the CUDA GPUs): at least the CPU. */
static int real_devices(const wf__compile_in *c)
{
    int n = wf_device_count(c->rt);
    return n < 1 ? 1 : n;
}

/* What placement reads of the compile input 'c' alone (wf__place_check()). */
static wf__place_in compile_in(const wf__compile_in *c)
{
    return (wf__place_in){
        .kernels = c->kernels,
        .n_real = real_devices(c),
        .n_sim = c->n_sim,
        .device = c->device,
    };
}

int wf__place_check_node(const wf__compile_in *c, const wf_node *node)
{
    wf__place_in in = compile_in(c);
    return wf__place_check(&in, node);
}

void wf__plan_place_free(wf__plan *p)
{
    wf__plan_dev *pd = p->dev;
    if (!pd)
        return;
    free(pd->devs); /* the run side's devices: it closes them (wf_session_destroy()) */
    wf__placement_free(&pd->pl);
    free(pd);
    p->dev = NULL;
}

static bool has_any_dim(wf_shape s)
{
    for (int d = 0; d < s.rank; d++)
        if (s.dims[d] < 0)
            return true;
    return false;
}

/* Replaces the plan's node list and per-node arrays by the partitioned ones of 'pl' (copy
 * nodes: WF__PN_COPY, right after their values). Returns 0 or WF_ENOMEM. */
static int take_partition(wf__plan *p, wf__placement *pl)
{
    int n = p->n, N = pl->n;
    size_t m = (size_t)(N ? N : 1);
    uint8_t *kind = calloc(m, 1), *reinfer = calloc(m, 1);
    int32_t *var = malloc(m * sizeof *var), *uses0 = calloc(m, sizeof *uses0);
    if (!kind || !reinfer || !var || !uses0) {
        free(kind);
        free(reinfer);
        free(var);
        free(uses0);
        return wf__err(WF_ENOMEM, "placement: no memory for a plan of %d nodes", N);
    }
    for (int i = 0; i < N; i++) {
        kind[i] = WF__PN_COPY;
        var[i] = -1;
        reinfer[i] = has_any_dim(pl->nodes[i]->shape);
    }
    for (int i = 0; i < n; i++) {
        int32_t j = pl->new_index[i];
        kind[j] = p->kind[i];
        reinfer[j] = p->reinfer[i];
        var[j] = p->var[i];
    }
    for (int32_t e = 0; e < pl->in_off[N]; e++)
        uses0[pl->in_idx[e]]++;
    for (int id = 0; id < p->n_graph; id++)
        if (p->index_of[id] >= 0)
            p->index_of[id] = pl->new_index[p->index_of[id]];
    /* A fetched node on a GPU is handed out by its copy to the host. */
    for (int k = 0; k < p->n_key; k++)
        if (p->key[k] < p->n_graph && pl->key_at[k] >= 0)
            p->index_of[p->key[k]] = pl->key_at[k];
    for (int k = 0; k < p->n_placeholders; k++)
        p->placeholders[k] = pl->new_index[p->placeholders[k]];
    free(p->nodes);
    free(p->kind);
    free(p->reinfer);
    free(p->var);
    free(p->in_off);
    free(p->in_idx);
    free(p->uses0);
    free(p->order);
    p->n = N;
    p->nodes = pl->nodes;
    p->in_off = pl->in_off;
    p->in_idx = pl->in_idx;
    p->order = pl->order;
    p->n_order = pl->n_order;
    pl->nodes = NULL;
    pl->in_off = pl->in_idx = pl->order = NULL;
    pl->n_order = 0;
    p->kind = kind;
    p->reinfer = reinfer;
    p->var = var;
    p->uses0 = uses0;
    return 0;
}

/* Sets 'p->host_vars': the plan's variables read on the host (all of them without 'p->dev'),
 * whose host values a run needs current (var_device.c). Returns 0 or WF_ENOMEM. */
static int host_vars(wf__plan *p)
{
    free(p->host_vars);
    p->n_host_vars = 0;
    if (!(p->host_vars = malloc((size_t)(p->n ? p->n : 1) * sizeof *p->host_vars)))
        return wf__err(WF_ENOMEM, "placement: no memory for the variables of %d nodes", p->n);
    for (int i = 0; i < p->n; i++)
        if (p->kind[i] == WF__PN_VARIABLE && (!p->dev || p->dev->pl.where[i] == 0))
            p->host_vars[p->n_host_vars++] = i;
    return 0;
}

/* Places 'p' through wf__place() and opens the devices it uses. */
static int place(wf__plan *p, const wf__compile_in *c)
{
    int32_t *key = malloc((size_t)(p->n_key ? p->n_key : 1) * sizeof *key);
    if (!key)
        return wf__err(WF_ENOMEM, "placement: no memory for %d fetches", p->n_key);
    for (int k = 0; k < p->n_key; k++)
        key[k] = p->key[k] >= 0 && p->key[k] < p->n_graph ? p->index_of[p->key[k]] : -1;
    wf__place_in in = compile_in(c);
    in.n = p->n;
    in.nodes = p->nodes;
    in.in_off = p->in_off;
    in.in_idx = p->in_idx;
    in.n_key = p->n_key;
    in.key = key;
    in.small = p->run_inline;
    wf__placement pl;
    int rc = wf__place(&in, &pl);
    free(key);
    if (rc < 0)
        return rc;
    if (!pl.where) /* every node on the CPU */
        return host_vars(p);
    int n_dev = in.n_real + in.n_sim;
    wf__plan_dev *pd = calloc(1, sizeof *pd);
    if (!pd || !(pd->devs = calloc((size_t)n_dev, sizeof *pd->devs))) {
        free(pd);
        wf__placement_free(&pl);
        return wf__err(WF_ENOMEM, "placement: no memory for %d devices", n_dev);
    }
    pd->n_devices = n_dev;
    pd->pl = pl; /* the plan owns it from here */
    p->dev = pd;
    if ((rc = take_partition(p, &pd->pl)) >= 0)
        rc = host_vars(p);
    for (int i = 0; rc >= 0 && i < p->n; i++) {
        int id = pd->pl.where[i];
        if (id > 0 && !pd->devs[id]) {
            rc = c->open_device(c->ctx, id, n_dev, &pd->devs[id]);
            if (rc < 0) {
                char why[WF_ERRMSG_MAX], desc[WF_ERRMSG_MAX], dn[32];
                snprintf(why, sizeof why, "%s", wf_last_errmsg());
                rc = wf__err(rc, "placement: %s: opening device %d (%s): %s",
                             wf__rt_node_desc(p->nodes[i], desc, sizeof desc), id,
                             wf__place_dev_name(id, in.n_real, dn, sizeof dn), why);
            }
        }
    }
    if (rc < 0)
        return rc;         /* the plan is destroyed with 'p->dev' */
    p->run_inline = false; /* the task graph orders GPU work and copies */
    return 0;
}

/* Sets p->kernel[i] for every kernel and copy node: the session's registered kernel
 * (core/op.h) for the kind of the device it runs on (a copy: of the end that is not the
 * host), so a run never looks one up. A node whose op has no kernel there is WF_ENODEV
 * naming the node and the device (nodes a pass made included: their placement is their
 * origin's). */
static int resolve_kernels(wf__plan *p, const wf__compile_in *c)
{
    int n_real = real_devices(c);
    p->kernel = calloc((size_t)(p->n ? p->n : 1), sizeof *p->kernel);
    p->kdata = calloc((size_t)(p->n ? p->n : 1), sizeof *p->kdata);
    if (!p->kernel || !p->kdata)
        return wf__err(WF_ENOMEM, "placement: no memory for %d nodes", p->n);
    for (int i = 0; i < p->n; i++) {
        if (p->kind[i] != WF__PN_KERNEL && p->kind[i] != WF__PN_COPY)
            continue;
        const wf_node *node = p->nodes[i];
        bool copy = p->kind[i] == WF__PN_COPY;
        int id = copy ? (node->attrs->to_dev ? node->attrs->to_dev : node->attrs->from_dev)
                      : (p->dev ? p->dev->pl.where[i] : 0);
        int kk = wf__place_kernel_kind(id, n_real);
        p->kdata[i] = wf__kernels_data(c->kernels, node->op, kk);
        if ((p->kernel[i] = wf__kernels_find(c->kernels, node->op, kk)))
            continue;
        char desc[WF_ERRMSG_MAX], dn[32];
        if (copy)
            return wf__err(WF_ENODEV,
                           "placement: '%s' is read on device %d (%s), but no %s copy kernel "
                           "is registered",
                           node->inputs[0]->name, id, wf__place_dev_name(id, n_real, dn, sizeof dn),
                           kk == WF_KERNEL_CUDA ? "CUDA" : "CPU");
        return wf__err(WF_ENODEV,
                       "placement: %s runs on device %d (%s), but op '%s' has no %s kernel",
                       wf__rt_node_desc(node, desc, sizeof desc), id,
                       wf__place_dev_name(id, n_real, dn, sizeof dn), node->op->name,
                       kk == WF_KERNEL_CUDA ? "CUDA" : "CPU");
    }
    return 0;
}

int wf__plan_place(wf__plan *p, const wf__compile_in *c)
{
    int rc = place(p, c);
    if (rc >= 0)
        rc = resolve_kernels(p, c);
    return rc;
}
