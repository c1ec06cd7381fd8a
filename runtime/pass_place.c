/* runtime/pass_place.c: placement of a plan's nodes on devices.
 * Owns: wf_node_set_device() (the per-node placement of the public API), the placement of
 *   a compiled plan (wf__plan_dev: the device of every node, which values cross devices,
 *   which variables are resident on a device), and which of the session's devices a plan
 *   uses.
 * The rule (user hints first, as TensorFlow's placer): a node placed with
 *   wf_node_set_device() goes there (checked: WF_EINVAL for a device the runtime lacks,
 *   WF_ENODEV for an op without a kernel for it, naming the node and the device); the
 *   others follow wf_session_opts.device: -1 keeps them on the CPU, D >= 1 puts them on
 *   device D where their op has a kernel for it, and 0 (the default) puts a node where its
 *   inputs are and prefers the GPU for ops with a CUDA kernel. Under the rule these stay on
 *   the CPU: sources (placeholders and constants are host tensors; variables, see below),
 *   ops that allocate their own output, f64 nodes (see gpu_able()), and every node of a
 *   plan small enough to run inline (a copy to a GPU costs more than such a plan).
 * Variables on devices (issue 6; place_updates()): updates (optimizers' update nodes, the
 *   fused multi_update, the step counter's increment: core/op.h n_assign) are placed last.
 *   The rule moves an update to the device where every other reader of the variables it
 *   assigns runs (repeatedly: the increment follows the updates that read the counter), if
 *   its op has a kernel there; an update left on a device whose variables are also read
 *   elsewhere goes back to the host, or, placed there by the caller, is WF_ENOSYS naming
 *   the update, the variable and the other device. Then a variable whose readers in the
 *   plan (updates included) all run on one device is resident there: its node's 'where' is
 *   that device, its readers read the session's device value with no copy step, its
 *   updates write that value in place, and its host value becomes stale until something
 *   reads it on the host (runtime/var_device.c). A variable read on the host by this plan
 *   is in 'p->host_vars', made current before each run. On CUDA, update_K, multi_update
 *   and the increment have kernels (grad/optim_cpu.c); an update of RMSProp or Adagrad,
 *   which the CUDA kernel does not compute, stays on the host (its op's kernel_ok), and its
 *   variables with it.
 *   TODO(#6): a first run on a real GPU (the CUDA path is compile-checked only; simulated
 *   devices test the placement and the residency).
 * Copies: every value read on another device than its own (host to GPU, GPU to host, GPU
 *   to GPU), and every fetched GPU value (to the host), gets one copy per destination
 *   device, whatever the number of its readers there (wf__plan_dev.copies): a node of core's
 *   copy op (attrs from_dev, to_dev) with the session's kernel for it (devices/copy.c,
 *   registered by devices/ for the kind of the device that is not the host), inserted into
 *   the plan right after its value (insert_copies()), so the readers on its destination
 *   read it and the executor runs it as a task like any node (exec_device.c).
 * Simulated devices: a test may give the session simulated devices (wf_session.n_sim,
 *   devices/sim.c), numbered after the runtime's; they run the CPU kernels, so their
 *   placement checks the CPU kernel.
 * Devices are the session's (wf__session_device(), runtime/var_device.c): opened at the
 *   first plan that places a node there and shared by every plan, so the work of all plans
 *   and runs on a device is one in-order queue (devices/device.h), which is what lets one
 *   plan's update write a device value another plan's kernels read. (Before issue 6 each
 *   plan opened its own, with its own streams and pool.)
 * Without a GPU (or built without CUDA) the runtime has one device, nothing is placed
 *   elsewhere, and 'p->dev' stays NULL: CPU plans run exactly as before.
 * Not here: running placed nodes and the copies (exec_device.c), the device values of
 *   variables (var_device.c), the devices (devices/). */
#include "../devices/device.h"
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
static bool kernel_able(const wf__kernels *kr, const wf_node *n, int id, int n_real)
{
    if (!wf__kernels_ok(kr, n->op, n, kernel_kind(id, n_real)) ||
        (n->op->flags & (WF_OP_DYNAMIC_SHAPE | WF_OP_ASYNC)) || n->dtype == WF_F64)
        return false;
    for (int k = 0; k < n->n_inputs; k++)
        if (n->inputs[k]->dtype == WF_F64)
            return false;
    return true;
}

/* Whether update 'n' may run on device 'id': a kernel for it, and variables that are not
 * f64 (as above). Its other inputs may be: the step counter (i64) and the hyperparameters
 * (f64, read by the kernel as scalars). */
static bool update_able(const wf__kernels *kr, const wf_node *n, int id, int n_real)
{
    if (!wf__kernels_ok(kr, n->op, n, kernel_kind(id, n_real)) ||
        (n->op->flags & WF_OP_DYNAMIC_SHAPE))
        return false;
    for (int k = 0; k < n->op->n_assign; k++)
        if (n->inputs[k]->dtype == WF_F64)
            return false;
    return true;
}

/* Updates are placed after the other nodes, by where their variables are read
 * (place_updates()). */
static bool gpu_able(const wf__kernels *kr, const wf_node *n, int id, int n_real)
{
    return n->op->n_assign == 0 && kernel_able(kr, n, id, n_real);
}

void wf__plan_place_free(wf__plan *p)
{
    wf__plan_dev *pd = p->dev;
    if (!pd)
        return;
    free(pd->devs); /* the session's devices: wf_session_destroy() closes them */
    free(pd->where);
    for (int k = 0; pd->copy_nodes && k < pd->n_copies; k++)
        free(pd->copy_nodes[k]); /* one block with its attributes and name (copy_node()) */
    free(pd->copy_nodes);
    free(pd->copies);
    free(pd);
    p->dev = NULL;
}

/* A copy node (core's copy op) with its attributes and name in one block, as the passes'
 * nodes are. */
typedef struct copy_block {
    wf_node node; /* first: the node pointer is the block pointer */
    wf_attrs attrs;
    char name[];
} copy_block;

/* The node of copy 'c': the value of plan node 'c->value' from device 'c->from' to
 * 'c->to', named "<value>.to<to>", where the value was made. NULL: no memory. */
static wf_node *copy_node(const wf__plan *p, const wf__copy *c)
{
    const wf_node *v = p->nodes[c->value];
    char name[256];
    snprintf(name, sizeof name, "%s.to%d", v->name ? v->name : "?", (int)c->to);
    size_t len = strlen(name) + 1;
    copy_block *b = calloc(1, sizeof *b + len);
    if (!b)
        return NULL;
    memcpy(b->name, name, len);
    b->attrs.from_dev = c->from;
    b->attrs.to_dev = c->to;
    wf_node *n = &b->node;
    n->op = &wf_op_copy;
    n->graph = v->graph;
    n->name = b->name;
    n->id = -1; /* in no graph */
    n->n_inputs = 1;
    n->inputs = n->inline_inputs;
    n->inputs[0] = (wf_node *)v;
    n->attrs = &b->attrs;
    n->file = v->file;
    n->line = v->line;
    n->dtype = v->dtype;
    n->shape = v->shape;
    n->device = c->to;
    n->rt_index = -1;
    return n;
}

static int cmp_copy(const void *a, const void *b)
{
    const wf__copy *x = a, *y = b;
    if (x->value != y->value)
        return x->value < y->value ? -1 : 1;
    return (x->to > y->to) - (x->to < y->to);
}

/* The copy of value 'j' to device 'to' among 'c[lo .. hi)' (the copies of 'j'), or -1. */
static int32_t find_copy(const wf__copy *c, int32_t lo, int32_t hi, int to)
{
    for (int32_t k = lo; k < hi; k++)
        if (c[k].to == to)
            return k;
    return -1;
}

/* Whether update 'u' (a kernel node) assigns plan node 'v'. */
static bool assigns(const wf__plan *p, int u, int32_t v)
{
    if (p->kind[u] != WF__PN_KERNEL)
        return false;
    for (int a = 0; a < p->nodes[u]->op->n_assign; a++)
        if (p->in_idx[p->in_off[u] + a] == v)
            return true;
    return false;
}

/* The plan's arrays after inserting its copy nodes (insert_copies()). */
typedef struct grown {
    wf_node **nodes;
    uint8_t *kind, *reinfer;
    int32_t *var, *in_off, *in_idx, *uses0, *order;
    int16_t *where;
} grown;

static void grown_free(grown *g)
{
    free(g->nodes);
    free(g->kind);
    free(g->reinfer);
    free(g->var);
    free(g->in_off);
    free(g->in_idx);
    free(g->uses0);
    free(g->order);
    free(g->where);
}

static bool has_any_dim(wf_shape s)
{
    for (int d = 0; d < s.rank; d++)
        if (s.dims[d] < 0)
            return true;
    return false;
}

/* Makes the copies of 'p' ('where' set) and inserts them into the plan as nodes of their
 * own: one per value and destination device, for the edges that cross devices and for the
 * fetched GPU values (the key also holds targets: a target's copy that no fetch reads copies
 * nothing, exec_device.c). Copy k goes right after its value in the plan's order (which
 * stays topological), the readers on its destination read it instead of the value, and a
 * key node on a GPU is handed out (index_of) by its copy to the host. A fetched resident
 * variable's copy is ordered after the plan's updates of it ('p->order'), which write it in
 * place, so the fetch gets the value after the step, as on the host. Returns 0 or
 * WF_ENOMEM. */
static int insert_copies(wf__plan *p)
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
                c[nc++] = (wf__copy){ j, -1, pd->where[j], pd->where[i] };
        }
    for (int k = 0; k < p->n_key; k++) {
        int32_t id = p->key[k];
        int32_t i = id >= 0 && id < p->sess->n_nodes ? p->index_of[id] : -1;
        if (i >= 0 && pd->where[i] > 0)
            c[nc++] = (wf__copy){ i, -1, pd->where[i], 0 };
    }
    qsort(c, (size_t)nc, sizeof *c, cmp_copy);
    int kept = 0;
    for (int k = 0; k < nc; k++)
        if (!kept || cmp_copy(&c[kept - 1], &c[k]) != 0)
            c[kept++] = c[k];
    pd->copies = c;
    pd->n_copies = kept;
    if (!(pd->copy_nodes = calloc((size_t)(kept ? kept : 1), sizeof *pd->copy_nodes)))
        return wf__err(WF_ENOMEM, "placement: no memory for %d copies", kept);
    for (int k = 0; k < kept; k++)
        if (!(pd->copy_nodes[k] = copy_node(p, &c[k])))
            return wf__err(WF_ENOMEM, "placement: no memory for %d copies", kept);
    if (kept == 0)
        return 0;

    /* The new order: each old node, then its copies. */
    int N = n + kept;
    size_t m = (size_t)N;
    grown g = { 0 };
    int32_t *nw = malloc((size_t)n * sizeof *nw), *first = malloc(((size_t)n + 1) * sizeof *first);
    g.nodes = malloc(m * sizeof *g.nodes);
    g.kind = calloc(m, 1);
    g.reinfer = calloc(m, 1);
    g.var = malloc(m * sizeof *g.var);
    g.in_off = malloc((m + 1) * sizeof *g.in_off);
    g.in_idx = malloc(((size_t)n_edges + (size_t)kept) * sizeof *g.in_idx);
    g.uses0 = calloc(m, sizeof *g.uses0);
    g.where = malloc(m * sizeof *g.where);
    if (!nw || !first || !g.nodes || !g.kind || !g.reinfer || !g.var || !g.in_off || !g.in_idx ||
        !g.uses0 || !g.where) {
        free(nw);
        free(first);
        grown_free(&g);
        return wf__err(WF_ENOMEM, "placement: no memory for a plan of %d nodes", N);
    }
    /* first[i]: the first copy of old node i (copies are sorted by value). */
    for (int i = 0, k = 0; i <= n; i++) {
        while (k < kept && c[k].value < i)
            k++;
        first[i] = k;
    }
    int pos = 0;
    for (int i = 0; i < n; i++) {
        nw[i] = pos;
        g.nodes[pos] = p->nodes[i];
        g.kind[pos] = p->kind[i];
        g.reinfer[pos] = p->reinfer[i];
        g.var[pos] = p->var[i];
        g.where[pos] = pd->where[i];
        pos++;
        for (int32_t k = first[i]; k < first[i + 1]; k++) {
            c[k].at = pos;
            g.nodes[pos] = pd->copy_nodes[k];
            g.kind[pos] = WF__PN_COPY;
            g.reinfer[pos] = has_any_dim(p->nodes[i]->shape);
            g.var[pos] = -1;
            g.where[pos] = c[k].to;
            pos++;
        }
    }
    /* Edges: a reader on another device than its input's reads the input's copy there. */
    int32_t e2 = 0;
    int n_order = 0;
    for (int i = 0; i < n; i++) {
        int ni = nw[i];
        g.in_off[ni] = e2;
        for (int32_t e = p->in_off[i]; e < p->in_off[i + 1]; e++) {
            int32_t j = p->in_idx[e];
            int32_t k = pd->where[j] == pd->where[i]
                            ? -1
                            : find_copy(c, first[j], first[j + 1], pd->where[i]);
            g.in_idx[e2++] = k >= 0 ? c[k].at : nw[j];
        }
        for (int32_t k = first[i]; k < first[i + 1]; k++) {
            g.in_off[c[k].at] = e2;
            g.in_idx[e2++] = ni;
            if (p->kind[i] == WF__PN_VARIABLE && c[k].to == 0)
                for (int u = 0; u < n; u++)
                    n_order += assigns(p, u, i);
        }
    }
    g.in_off[N] = e2;
    for (int32_t e = 0; e < e2; e++)
        g.uses0[g.in_idx[e]]++;
    if (n_order && !(g.order = malloc((size_t)n_order * 2 * sizeof *g.order))) {
        free(nw);
        free(first);
        grown_free(&g);
        return wf__err(WF_ENOMEM, "placement: no memory for a plan of %d nodes", N);
    }
    n_order = 0;
    for (int k = 0; k < kept; k++)
        if (p->kind[c[k].value] == WF__PN_VARIABLE && c[k].to == 0)
            for (int u = 0; u < n; u++)
                if (assigns(p, u, c[k].value)) {
                    g.order[2 * n_order] = nw[u];
                    g.order[2 * n_order + 1] = c[k].at;
                    n_order++;
                }
    /* Graph nodes map to their value's new index; a key node on a GPU to its copy to the
     * host, which is what a fetch hands out. */
    for (int id = 0; id < p->sess->n_nodes; id++)
        if (p->index_of[id] >= 0)
            p->index_of[id] = nw[p->index_of[id]];
    for (int k = 0; k < p->n_placeholders; k++)
        p->placeholders[k] = nw[p->placeholders[k]];
    for (int k = 0; k < kept; k++)
        c[k].value = nw[c[k].value];
    for (int k = 0; k < p->n_key; k++) {
        int32_t id = p->key[k];
        int32_t i = id >= 0 && id < p->sess->n_nodes ? p->index_of[id] : -1;
        if (i >= 0 && g.where[i] > 0)
            for (int q = 0; q < kept; q++)
                if (c[q].value == i && c[q].to == 0)
                    p->index_of[id] = c[q].at;
    }
    free(nw);
    free(first);
    free(p->nodes);
    free(p->kind);
    free(p->reinfer);
    free(p->var);
    free(p->in_off);
    free(p->in_idx);
    free(p->uses0);
    free(p->order);
    free(pd->where);
    p->n = N;
    p->nodes = g.nodes;
    p->kind = g.kind;
    p->reinfer = g.reinfer;
    p->var = g.var;
    p->in_off = g.in_off;
    p->in_idx = g.in_idx;
    p->uses0 = g.uses0;
    p->order = g.order;
    p->n_order = n_order;
    pd->where = g.where;
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
        if (p->kind[i] == WF__PN_VARIABLE && (!p->dev || p->dev->where[i] == 0))
            p->host_vars[p->n_host_vars++] = i;
    return 0;
}

/* The readers of each variable of a plan: CSR over plan indices (a reader that reads it
 * twice is there twice). */
typedef struct readers {
    int32_t *off, *idx;
} readers;

static int readers_make(const wf__plan *p, readers *r)
{
    int n = p->n;
    int32_t n_edges = p->in_off[n];
    r->off = calloc((size_t)n + 1, sizeof *r->off);
    r->idx = malloc((size_t)(n_edges ? n_edges : 1) * sizeof *r->idx);
    int32_t *fill = calloc((size_t)(n ? n : 1), sizeof *fill);
    if (!r->off || !r->idx || !fill) {
        free(r->off);
        free(r->idx);
        free(fill);
        return wf__err(WF_ENOMEM, "placement: no memory for the readers of %d nodes", n);
    }
    for (int32_t e = 0; e < n_edges; e++)
        if (p->kind[p->in_idx[e]] == WF__PN_VARIABLE)
            r->off[p->in_idx[e] + 1]++;
    for (int i = 0; i < n; i++)
        r->off[i + 1] += r->off[i];
    for (int i = 0; i < n; i++)
        for (int32_t e = p->in_off[i]; e < p->in_off[i + 1]; e++) {
            int32_t j = p->in_idx[e];
            if (p->kind[j] == WF__PN_VARIABLE)
                r->idx[r->off[j] + fill[j]++] = i;
        }
    free(fill);
    return 0;
}

/* Whether every assigned input of update node 'i' is a variable of the session. */
static bool assigns_variables(const wf__plan *p, int i)
{
    for (int k = 0; k < p->nodes[i]->op->n_assign; k++)
        if (p->kind[p->in_idx[p->in_off[i] + k]] != WF__PN_VARIABLE)
            return false;
    return true;
}

/* The one device every reader of the variables that update 'i' assigns runs on, 'i' and
 * the updates in 'skip' aside: a device id, -2 when there is no such reader, -1 when they
 * run on several. */
static int readers_device(const wf__plan *p, const readers *r, int i, const uint8_t *skip)
{
    const int16_t *where = p->dev->where;
    int dev = -2;
    for (int k = 0; k < p->nodes[i]->op->n_assign; k++) {
        int32_t v = p->in_idx[p->in_off[i] + k];
        for (int32_t e = r->off[v]; e < r->off[v + 1]; e++) {
            int32_t j = r->idx[e];
            if (j == i || (skip && skip[j]))
                continue;
            dev = dev == -2 || dev == where[j] ? where[j] : -1;
        }
    }
    return dev;
}

/* Places the updates and makes variables resident (the header's "Variables on devices"):
 * an update the rule may move goes to the device where every other reader of its variables
 * runs (repeated, since an update is another's reader: the step counter's increment follows
 * the updates that read the counter); an update on a device whose variables are also read
 * elsewhere goes back to the host when the rule put it there, and is an error (WF_ENOSYS,
 * naming the update, the variable and the devices) when the caller did. Then every variable
 * whose readers all run on one device is resident there. Returns 0 or a negative status. */
static int place_updates(wf__plan *p, int n_real, bool rule_gpu)
{
    wf__plan_dev *pd = p->dev;
    int n = p->n, rc = 0;
    readers r;
    if ((rc = readers_make(p, &r)) < 0)
        return rc;
    uint8_t *open = calloc((size_t)(n ? n : 1), 1); /* updates the rule may still move */
    if (!open) {
        free(r.off);
        free(r.idx);
        return wf__err(WF_ENOMEM, "placement: no memory for %d nodes", n);
    }
    for (int i = 0; rule_gpu && i < n; i++) {
        const wf_node *node = p->nodes[i];
        open[i] = p->kind[i] == WF__PN_KERNEL && node->op->n_assign > 0 && node->device < 0 &&
                  pd->where[i] == 0 && assigns_variables(p, i);
    }
    uint8_t *moved = calloc((size_t)(n ? n : 1), 1);
    if (!moved)
        rc = wf__err(WF_ENOMEM, "placement: no memory for %d nodes", n);
    for (bool changed = rc == 0; changed;) {
        changed = false;
        for (int i = 0; i < n; i++) {
            if (!open[i])
                continue;
            int dev = readers_device(p, &r, i, open);
            if (dev > 0 && update_able(p->sess->kernels, p->nodes[i], dev, n_real)) {
                pd->where[i] = (int16_t)dev;
                pd->n_gpu++;
                open[i] = 0;
                moved[i] = 1;
                changed = true;
            }
        }
    }
    /* Every update on a device needs its variables read there only. */
    for (bool changed = rc == 0; changed && rc == 0;) {
        changed = false;
        for (int i = 0; i < n && rc == 0; i++) {
            const wf_node *node = p->nodes[i];
            if (p->kind[i] != WF__PN_KERNEL || node->op->n_assign == 0 || pd->where[i] == 0)
                continue;
            int dev = readers_device(p, &r, i, NULL);
            bool ok = assigns_variables(p, i) && (dev == -2 || dev == pd->where[i]);
            if (ok)
                continue;
            if (moved[i]) {
                pd->where[i] = 0;
                pd->n_gpu--;
                moved[i] = 0;
                changed = true;
                continue;
            }
            char desc[WF_ERRMSG_MAX], dn[32], dn2[32];
            int want = pd->where[i];
            const wf_node *var = NULL;
            int other = 0;
            for (int k = 0; k < node->op->n_assign && !var; k++) {
                int32_t v = p->in_idx[p->in_off[i] + k];
                if (p->kind[v] != WF__PN_VARIABLE) {
                    var = p->nodes[v];
                    other = -1;
                }
                for (int32_t e = r.off[v]; !var && e < r.off[v + 1]; e++)
                    if (pd->where[r.idx[e]] != want) {
                        var = p->nodes[v];
                        other = pd->where[r.idx[e]];
                    }
            }
            if (other < 0)
                rc = wf__err(WF_ENOSYS,
                             "placement: %s is placed on device %d (%s), but it assigns '%s', "
                             "which is not a variable of the session",
                             wf__rt_node_desc(node, desc, sizeof desc), want,
                             dev_name(want, n_real, dn, sizeof dn), var ? var->name : "?");
            else
                rc = wf__err(WF_ENOSYS,
                             "placement: %s is placed on device %d (%s), but it updates "
                             "variable '%s', which is also read on %s: a variable updated on a "
                             "device must be read only there (its value lives there)",
                             wf__rt_node_desc(node, desc, sizeof desc), want,
                             dev_name(want, n_real, dn, sizeof dn), var ? var->name : "?",
                             dev_name(other, n_real, dn2, sizeof dn2));
        }
    }
    /* Resident variables: every reader on one device (updates included). */
    for (int j = 0; rc == 0 && j < n; j++) {
        if (p->kind[j] != WF__PN_VARIABLE || r.off[j] == r.off[j + 1])
            continue;
        int dev = pd->where[r.idx[r.off[j]]];
        for (int32_t e = r.off[j]; e < r.off[j + 1]; e++)
            if (pd->where[r.idx[e]] != dev)
                dev = -1;
        if (dev > 0) {
            pd->where[j] = (int16_t)dev;
            pd->n_resident++;
        }
    }
    free(open);
    free(moved);
    free(r.off);
    free(r.idx);
    return rc;
}

int wf__place_check(wf_session *s, const wf_node *node)
{
    int want = node->device;
    if (want < 0)
        return 0;
    int n_real = wf_device_count(s->rt);
    if (n_real < 1)
        n_real = 1;
    int n_dev = n_real + s->n_sim;
    char dn[32], desc[WF_ERRMSG_MAX];
    if (want >= n_dev)
        return wf__err(WF_EINVAL,
                       "placement: %s is placed on device %d, but this runtime has %d "
                       "device%s%s",
                       wf__rt_node_desc(node, desc, sizeof desc), want, n_dev,
                       n_dev == 1 ? "" : "s",
                       n_dev == 1 ? " (cpu:0; no CUDA device: none found, or weft is built "
                                    "without CUDA)"
                                  : "");
    /* Sources hold host values: placing one only says where its readers are expected. */
    if (want == 0 || (node->op->flags & WF_OP_SOURCE))
        return 0;
    int kk = kernel_kind(want, n_real);
    if (!wf__kernels_ok(s->kernels, node->op, node, kk))
        return wf__err(
            WF_ENODEV,
            "placement: %s is placed on device %d (%s), but op '%s' has no %s "
            "kernel%s",
            wf__rt_node_desc(node, desc, sizeof desc), want, dev_name(want, n_real, dn, sizeof dn),
            node->op->name, kk == WF_KERNEL_CUDA ? "CUDA" : "CPU",
            wf__kernels_find(s->kernels, node->op, kk) ? " for this node (its attributes or inputs)"
                                                       : "");
    return 0;
}

static int place(wf__plan *p)
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
        int rc = wf__place_check(s, node);
        if (rc < 0)
            return rc;
        /* an update's variables are checked in place_updates() */
        explicit_gpu |= node->device > 0 && p->kind[i] == WF__PN_KERNEL;
    }
    if (s->device < -1 || s->device >= n_dev)
        return wf__err(WF_EINVAL,
                       "placement: wf_session_opts.device is %d, but this runtime has %d "
                       "device%s%s",
                       s->device, n_dev, n_dev == 1 ? "" : "s", none);
    bool rule_gpu = n_dev > 1 && s->device != -1 && !p->run_inline;
    if (!explicit_gpu && !rule_gpu)
        return host_vars(p); /* every node on the CPU */

    wf__plan_dev *pd = calloc(1, sizeof *pd);
    if (!pd)
        return wf__err(WF_ENOMEM, "placement: no memory for %d nodes", n);
    p->dev = pd;
    pd->n_devices = n_dev;
    size_t m = (size_t)(n ? n : 1);
    pd->devs = calloc((size_t)n_dev, sizeof *pd->devs);
    pd->where = calloc(m, sizeof *pd->where);
    if (!pd->devs || !pd->where) {
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
            if (gpu_able(s->kernels, node, want, n_real))
                where = want;
        }
        pd->where[i] = (int16_t)where;
        pd->n_gpu += where > 0;
    }
    if (pd->n_gpu == 0) {
        wf__plan_place_free(p);
        return host_vars(p);
    }
    int rc = place_updates(p, n_real, rule_gpu);
    if (rc >= 0)
        rc = insert_copies(p);
    if (rc >= 0)
        rc = host_vars(p);
    for (int i = 0; rc >= 0 && i < p->n; i++) {
        int id = pd->where[i];
        if (id > 0 && !pd->devs[id]) {
            rc = wf__session_device(s, id, n_dev, &pd->devs[id]);
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

/* Sets p->kernel[i] for every kernel node: the session's registered kernel (core/op.h) for
 * the kind of the device the node runs on, so a run never looks one up. A node whose op has
 * no kernel there is WF_ENODEV naming the node and the device (nodes a pass made included:
 * their placement is their origin's). */
static int resolve_kernels(wf__plan *p)
{
    wf_session *s = p->sess;
    int n_real = wf_device_count(s->rt);
    if (n_real < 1)
        n_real = 1;
    p->kernel = calloc((size_t)(p->n ? p->n : 1), sizeof *p->kernel);
    p->kdata = calloc((size_t)(p->n ? p->n : 1), sizeof *p->kdata);
    if (!p->kernel || !p->kdata)
        return wf__err(WF_ENOMEM, "placement: no memory for %d nodes", p->n);
    for (int i = 0; i < p->n; i++) {
        const wf_node *node = p->nodes[i];
        if (p->kind[i] == WF__PN_COPY) {
            /* A copy's kernel: of the kind of the device that is not the host (devices/). */
            int id = node->attrs->to_dev ? node->attrs->to_dev : node->attrs->from_dev;
            int kk = kernel_kind(id, n_real);
            p->kdata[i] = wf__kernels_data(s->kernels, &wf_op_copy, kk);
            if (!(p->kernel[i] = wf__kernels_find(s->kernels, &wf_op_copy, kk))) {
                char dn[32];
                return wf__err(WF_ENODEV,
                               "placement: '%s' is read on device %d (%s), but no %s copy "
                               "kernel is registered",
                               node->inputs[0]->name, id, dev_name(id, n_real, dn, sizeof dn),
                               kk == WF_KERNEL_CUDA ? "CUDA" : "CPU");
            }
            continue;
        }
        if (p->kind[i] != WF__PN_KERNEL)
            continue;
        int id = p->dev ? p->dev->where[i] : 0, kk = kernel_kind(id, n_real);
        p->kdata[i] = wf__kernels_data(s->kernels, node->op, kk);
        if (!(p->kernel[i] = wf__kernels_find(s->kernels, node->op, kk))) {
            char desc[WF_ERRMSG_MAX], dn[32];
            return wf__err(
                WF_ENODEV, "placement: %s runs on device %d (%s), but op '%s' has no %s kernel",
                wf__rt_node_desc(node, desc, sizeof desc), id, dev_name(id, n_real, dn, sizeof dn),
                node->op->name, kk == WF_KERNEL_CUDA ? "CUDA" : "CPU");
        }
    }
    return 0;
}

int wf__plan_place(wf__plan *p)
{
    int rc = place(p);
    if (rc >= 0 && (rc = resolve_kernels(p)) < 0)
        wf__plan_place_free(p);
    return rc;
}
