/* placement/place.c: device assignment of a plan's nodes, a pure function (placement/
 *   place.h): nodes, devices, registry and rule in; a device per node and the partitioned
 *   node list, with a copy node per crossing value, out. It opens no device and touches no
 *   session: runtime/compile/pass_place.c wires the result into a plan.
 * The rule (user hints first, as TensorFlow's placer): a node placed with
 *   wf_node_set_device() goes there (checked: WF_EINVAL for a device the runtime lacks,
 *   WF_ENODEV for an op without a kernel for it, naming the node and the device); the
 *   others follow the rule (wf_session_opts.device): -1 keeps them on the CPU, D >= 1 puts
 *   them on device D where their op has a kernel for it, and 0 (the default) puts a node
 *   where its inputs are and prefers the GPU for ops with a CUDA kernel. Under the rule these
 *   stay on the CPU: sources (placeholders and constants are host tensors; variables, see
 *   below), ops that allocate their own output, f64 nodes (see kernel_able()), and every
 *   node of a plan small enough to run inline (a copy to a GPU costs more than such a plan).
 * Variables on devices (issue 6; place_updates()): updates (optimizers' update nodes, the
 *   fused multi_update, the step counter's increment: core/op.h n_assign) are placed last.
 *   The rule moves an update to the device where every other reader of the variables it
 *   assigns runs (repeatedly: the increment follows the updates that read the counter), if
 *   its op has a kernel there; an update left on a device whose variables are also read
 *   elsewhere goes back to the host, or, placed there by the caller, is WF_ENOSYS naming
 *   the update, the variable and the other device. Then a variable whose readers (updates
 *   included) all run on one device is resident there: its node's 'where' is that device,
 *   its readers read the session's device value with no copy, and its updates write that
 *   value in place (runtime/var_device.c). On CUDA, update_K, multi_update and the
 *   increment have kernels (grad/optim_cpu.c); an update of RMSProp or Adagrad, which the
 *   CUDA kernel does not compute, stays on the host (its op's kernel_ok), and its
 *   variables with it.
 * Copies (insert_copies()): every value read on another device than its own (host to GPU,
 *   GPU to host, GPU to GPU), and every key value on a GPU (to the host), gets one copy per
 *   destination device, whatever the number of its readers there: a node of core's copy op
 *   (attrs from_dev, to_dev) inserted right after its value (a fetched resident
 *   variable's copy to the host after the last update of it, which it is ordered after), so
 *   the order stays topological, and read by the value's readers on its destination.
 * Simulated devices (tests): numbered after the runtime's; they run the CPU kernels, so
 *   their placement checks the CPU kernel.
 * Not here: the devices (devices/), opening them and the kernels a plan runs (runtime/
 *   pass_place.c), running nodes and copies (runtime/exec*.c). */
#include "place.h"

#include "../core/error.h"

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

const char *wf__place_dev_name(int id, int n_real, char *buf, size_t size)
{
    if (id == 0)
        snprintf(buf, size, "cpu:0");
    else if (id < n_real)
        snprintf(buf, size, "cuda:%d", id - 1);
    else
        snprintf(buf, size, "sim:%d", id - n_real);
    return buf;
}

int wf__place_kernel_kind(int id, int n_real)
{
    return id > 0 && id < n_real ? WF_KERNEL_CUDA : WF_KERNEL_CPU;
}

/* What a node is to placement. */
enum { K_KERNEL, K_SOURCE, K_VARIABLE };

/* One placement at work. */
typedef struct pctx {
    const wf__place_in *in;
    int n_real, n_dev;
    uint8_t *kind;  /* K_* per node */
    int16_t *where; /* per node */
    int n_gpu, n_resident;
} pctx;

static int real_devices(const wf__place_in *in)
{
    return in->n_real < 1 ? 1 : in->n_real;
}

/* The edges into node i. */
static inline int32_t in_at(const pctx *c, int i, int k)
{
    return c->in->in_idx[c->in->in_off[i] + k];
}

/* Whether the rule may put 'n' (a kernel node) on device 'id' (a GPU) at all. f64 stays on
 * the CPU: most GPUs run it at 1/32 to 1/64 of their f32 rate, and f64 graphs are gradient
 * checks. */
static bool kernel_able(const wf__kernels *kr, const wf_node *n, int id, int n_real)
{
    if (!wf__kernels_ok(kr, n->op, n, wf__place_kernel_kind(id, n_real)) ||
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
    if (!wf__kernels_ok(kr, n->op, n, wf__place_kernel_kind(id, n_real)) ||
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

void wf__placement_free(wf__placement *pl)
{
    if (!pl)
        return;
    free(pl->nodes);
    free(pl->in_off);
    free(pl->in_idx);
    free(pl->new_index);
    free(pl->key_at);
    free(pl->where);
    for (int k = 0; pl->copy_nodes && k < pl->n_copies; k++)
        free(pl->copy_nodes[k]); /* one block with its attributes and name (copy_node()) */
    free(pl->copy_nodes);
    free(pl->copies);
    free(pl->order);
    memset(pl, 0, sizeof *pl);
}

/* A copy node (core's copy op) with its attributes and name in one block, as the passes'
 * nodes are. */
typedef struct copy_block {
    wf_node node; /* first: the node pointer is the block pointer */
    wf_attrs attrs;
    char name[];
} copy_block;

/* The node of a copy of 'v' from device 'from' to 'to', named "<value>.to<to>", where the
 * value was made. NULL: no memory. */
static wf_node *copy_node(const wf_node *v, int from, int to)
{
    char name[256];
    snprintf(name, sizeof name, "%s.to%d", v->name ? v->name : "?", to);
    size_t len = strlen(name) + 1;
    copy_block *b = calloc(1, sizeof *b + len);
    if (!b)
        return NULL;
    memcpy(b->name, name, len);
    b->attrs.from_dev = (int16_t)from;
    b->attrs.to_dev = (int16_t)to;
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
    n->device = to;
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

/* Whether update 'u' (a kernel node) assigns node 'v'. */
static bool assigns(const pctx *c, int u, int32_t v)
{
    if (c->kind[u] != K_KERNEL)
        return false;
    for (int a = 0; a < c->in->nodes[u]->op->n_assign; a++)
        if (in_at(c, u, a) == v)
            return true;
    return false;
}

/* Makes the copies ('where' set) and the partitioned node list into 'out' (the header's
 * "Copies"): copy k right after its value (a fetched resident variable's copy to the host
 * right after the last update of it), readers on its destination reading it, a key
 * node on a GPU handed out by its copy to the host, and a fetched resident variable's copy
 * ordered after the updates that write it in place ('order'), so the fetch gets the value
 * after the step, as on the host. Returns 0 or WF_ENOMEM. */
static int insert_copies(pctx *pc, wf__placement *out)
{
    const wf__place_in *in = pc->in;
    int n = in->n;
    int32_t n_edges = in->in_off[n];
    /* At most one per crossing edge and one per key: collect, sort, remove repeats. */
    wf__copy *c = malloc((size_t)(n_edges + in->n_key + 1) * sizeof *c);
    if (!c)
        return wf__err(WF_ENOMEM, "placement: no memory for the copies of %d nodes", n);
    out->copies = c;
    int nc = 0;
    for (int i = 0; i < n; i++)
        for (int32_t e = in->in_off[i]; e < in->in_off[i + 1]; e++) {
            int32_t j = in->in_idx[e];
            if (pc->where[j] != pc->where[i])
                c[nc++] = (wf__copy){ j, -1, pc->where[j], pc->where[i] };
        }
    for (int k = 0; k < in->n_key; k++) {
        int32_t i = in->key[k];
        if (i >= 0 && pc->where[i] > 0)
            c[nc++] = (wf__copy){ i, -1, pc->where[i], 0 };
    }
    qsort(c, (size_t)nc, sizeof *c, cmp_copy);
    int kept = 0;
    for (int k = 0; k < nc; k++)
        if (!kept || cmp_copy(&c[kept - 1], &c[k]) != 0)
            c[kept++] = c[k];
    out->n_copies = kept;
    if (!(out->copy_nodes = calloc((size_t)(kept ? kept : 1), sizeof *out->copy_nodes)))
        return wf__err(WF_ENOMEM, "placement: no memory for %d copies", kept);
    for (int k = 0; k < kept; k++)
        if (!(out->copy_nodes[k] = copy_node(in->nodes[c[k].value], c[k].from, c[k].to)))
            return wf__err(WF_ENOMEM, "placement: no memory for %d copies", kept);

    int N = n + kept;
    size_t m = (size_t)(N ? N : 1);
    int32_t *first = malloc(((size_t)n + 1) * sizeof *first); /* first copy of each node */
    out->n = N;
    out->nodes = malloc(m * sizeof *out->nodes);
    out->in_off = malloc((m + 1) * sizeof *out->in_off);
    out->in_idx = malloc(((size_t)n_edges + (size_t)kept + 1) * sizeof *out->in_idx);
    out->new_index = malloc((size_t)(n ? n : 1) * sizeof *out->new_index);
    out->key_at = malloc((size_t)(in->n_key ? in->n_key : 1) * sizeof *out->key_at);
    out->where = malloc(m * sizeof *out->where);
    if (!first || !out->nodes || !out->in_off || !out->in_idx || !out->new_index || !out->key_at ||
        !out->where) {
        free(first);
        return wf__err(WF_ENOMEM, "placement: no memory for a plan of %d nodes", N);
    }
    int32_t *nw = out->new_index;
    for (int i = 0, k = 0; i <= n; i++) { /* copies are sorted by value */
        while (k < kept && c[k].value < i)
            k++;
        first[i] = k;
    }
    /* Where each copy goes: right after its value, but a fetched resident variable's copy
     * to the host after the last update of it, so the order stays topological with the
     * orderings ('order') included. 'by_at' lists the copies by that node, stably. */
    int32_t *anchor = malloc((size_t)(kept ? kept : 1) * sizeof *anchor);
    int32_t *by_at = malloc((size_t)(kept ? kept : 1) * sizeof *by_at);
    int32_t *at_off = calloc((size_t)n + 1, sizeof *at_off);
    if (!anchor || !by_at || !at_off) {
        free(first);
        free(anchor);
        free(by_at);
        free(at_off);
        return wf__err(WF_ENOMEM, "placement: no memory for a plan of %d nodes", N);
    }
    for (int k = 0; k < kept; k++) {
        anchor[k] = c[k].value;
        if (pc->kind[c[k].value] == K_VARIABLE && c[k].to == 0)
            for (int u = c[k].value + 1; u < n; u++)
                if (assigns(pc, u, c[k].value))
                    anchor[k] = u;
        at_off[anchor[k] + 1]++;
    }
    for (int i = 0; i < n; i++)
        at_off[i + 1] += at_off[i];
    for (int k = 0; k < kept; k++)
        by_at[at_off[anchor[k]]++] = k;
    for (int i = n; i > 0; i--) /* at_off[i] was advanced to the end of node i's copies */
        at_off[i] = at_off[i - 1];
    at_off[0] = 0;
    int pos = 0;
    for (int i = 0; i < n; i++) {
        nw[i] = pos;
        out->nodes[pos] = in->nodes[i];
        out->where[pos++] = pc->where[i];
        for (int32_t q = at_off[i]; q < at_off[i + 1]; q++) {
            int32_t k = by_at[q];
            c[k].at = pos;
            out->nodes[pos] = out->copy_nodes[k];
            out->where[pos++] = c[k].to;
        }
    }
    free(anchor);
    free(by_at);
    free(at_off);
    /* Edges: a reader on another device than its input's reads the input's copy there. */
    int32_t e2 = 0;
    int n_order = 0;
    for (int i = 0; i < n; i++) {
        for (int32_t k = first[i]; k < first[i + 1]; k++)
            if (pc->kind[i] == K_VARIABLE && c[k].to == 0)
                for (int u = 0; u < n; u++)
                    n_order += assigns(pc, u, i);
    }
    int32_t *copy_at = malloc((size_t)N * sizeof *copy_at); /* per new index: its copy, or -1 */
    if (!copy_at) {
        free(first);
        return wf__err(WF_ENOMEM, "placement: no memory for a plan of %d nodes", N);
    }
    for (int q = 0; q < N; q++)
        copy_at[q] = -1;
    for (int k = 0; k < kept; k++)
        copy_at[c[k].at] = k;
    int32_t *old_of = malloc((size_t)N * sizeof *old_of);
    if (!old_of) {
        free(first);
        free(copy_at);
        return wf__err(WF_ENOMEM, "placement: no memory for a plan of %d nodes", N);
    }
    for (int i = 0; i < n; i++)
        old_of[nw[i]] = i;
    for (int q = 0; q < N; q++) {
        out->in_off[q] = e2;
        if (copy_at[q] >= 0) {
            out->in_idx[e2++] = nw[c[copy_at[q]].value];
            continue;
        }
        int i = old_of[q];
        for (int32_t e = in->in_off[i]; e < in->in_off[i + 1]; e++) {
            int32_t j = in->in_idx[e];
            int32_t k = pc->where[j] == pc->where[i]
                            ? -1
                            : find_copy(c, first[j], first[j + 1], pc->where[i]);
            out->in_idx[e2++] = k >= 0 ? c[k].at : nw[j];
        }
    }
    free(copy_at);
    free(old_of);
    out->in_off[N] = e2;
    if (n_order && !(out->order = malloc((size_t)n_order * 2 * sizeof *out->order))) {
        free(first);
        return wf__err(WF_ENOMEM, "placement: no memory for a plan of %d nodes", N);
    }
    for (int k = 0; k < kept; k++)
        if (pc->kind[c[k].value] == K_VARIABLE && c[k].to == 0)
            for (int u = 0; u < n; u++)
                if (assigns(pc, u, c[k].value)) {
                    out->order[2 * out->n_order] = nw[u];
                    out->order[2 * out->n_order + 1] = c[k].at;
                    out->n_order++;
                }
    /* A key node on a GPU hands out its copy to the host. */
    for (int k = 0; k < in->n_key; k++) {
        int32_t i = in->key[k];
        out->key_at[k] = i >= 0 ? nw[i] : -1;
        if (i >= 0 && pc->where[i] > 0)
            out->key_at[k] = c[find_copy(c, first[i], first[i + 1], 0)].at;
    }
    for (int k = 0; k < kept; k++)
        c[k].value = nw[c[k].value];
    free(first);
    return 0;
}

/* The readers of each variable: CSR over node indices (a reader that reads it twice is
 * there twice). */
typedef struct readers {
    int32_t *off, *idx;
} readers;

static int readers_make(const pctx *c, readers *r)
{
    const wf__place_in *in = c->in;
    int n = in->n;
    int32_t n_edges = in->in_off[n];
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
        if (c->kind[in->in_idx[e]] == K_VARIABLE)
            r->off[in->in_idx[e] + 1]++;
    for (int i = 0; i < n; i++)
        r->off[i + 1] += r->off[i];
    for (int i = 0; i < n; i++)
        for (int32_t e = in->in_off[i]; e < in->in_off[i + 1]; e++) {
            int32_t j = in->in_idx[e];
            if (c->kind[j] == K_VARIABLE)
                r->idx[r->off[j] + fill[j]++] = i;
        }
    free(fill);
    return 0;
}

/* Whether every assigned input of update node 'i' is a variable. */
static bool assigns_variables(const pctx *c, int i)
{
    for (int k = 0; k < c->in->nodes[i]->op->n_assign; k++)
        if (c->kind[in_at(c, i, k)] != K_VARIABLE)
            return false;
    return true;
}

/* The one device every reader of the variables that update 'i' assigns runs on, 'i' and
 * the updates in 'skip' aside: a device id, -2 when there is no such reader, -1 when they
 * run on several. */
static int readers_device(const pctx *c, const readers *r, int i, const uint8_t *skip)
{
    int dev = -2;
    for (int k = 0; k < c->in->nodes[i]->op->n_assign; k++) {
        int32_t v = in_at(c, i, k);
        for (int32_t e = r->off[v]; e < r->off[v + 1]; e++) {
            int32_t j = r->idx[e];
            if (j == i || (skip && skip[j]))
                continue;
            dev = dev == -2 || dev == c->where[j] ? c->where[j] : -1;
        }
    }
    return dev;
}

/* The error of update 'i', placed by the caller on a device whose variables are read
 * elsewhere (or that assigns something that is not a variable). */
static int update_misplaced(const pctx *c, const readers *r, int i)
{
    const wf_node *node = c->in->nodes[i];
    char desc[WF_ERRMSG_MAX], dn[32], dn2[32];
    int want = c->where[i];
    const wf_node *var = NULL;
    int other = 0;
    for (int k = 0; k < node->op->n_assign && !var; k++) {
        int32_t v = in_at(c, i, k);
        if (c->kind[v] != K_VARIABLE) {
            var = c->in->nodes[v];
            other = -1;
        }
        for (int32_t e = r->off[v]; !var && e < r->off[v + 1]; e++)
            if (c->where[r->idx[e]] != want) {
                var = c->in->nodes[v];
                other = c->where[r->idx[e]];
            }
    }
    if (other < 0)
        return wf__err(WF_ENOSYS,
                       "placement: %s is placed on device %d (%s), but it assigns '%s', which "
                       "is not a variable of the session",
                       wf__node_desc(node, desc, sizeof desc), want,
                       wf__place_dev_name(want, c->n_real, dn, sizeof dn), var ? var->name : "?");
    return wf__err(WF_ENOSYS,
                   "placement: %s is placed on device %d (%s), but it updates variable '%s', "
                   "which is also read on %s: a variable updated on a device must be read only "
                   "there (its value lives there)",
                   wf__node_desc(node, desc, sizeof desc), want,
                   wf__place_dev_name(want, c->n_real, dn, sizeof dn), var ? var->name : "?",
                   wf__place_dev_name(other, c->n_real, dn2, sizeof dn2));
}

/* Places the updates and makes variables resident (the header's "Variables on devices").
 * Returns 0 or a negative status. */
static int place_updates(pctx *c, bool rule_gpu)
{
    const wf__place_in *in = c->in;
    int n = in->n, rc = 0;
    readers r;
    if ((rc = readers_make(c, &r)) < 0)
        return rc;
    uint8_t *open = calloc((size_t)(n ? n : 1), 1);  /* updates the rule may still move */
    uint8_t *moved = calloc((size_t)(n ? n : 1), 1); /* updates the rule moved */
    if (!open || !moved)
        rc = wf__err(WF_ENOMEM, "placement: no memory for %d nodes", n);
    for (int i = 0; rc == 0 && rule_gpu && i < n; i++) {
        const wf_node *node = in->nodes[i];
        open[i] = c->kind[i] == K_KERNEL && node->op->n_assign > 0 && node->device < 0 &&
                  c->where[i] == 0 && assigns_variables(c, i);
    }
    for (bool changed = rc == 0; changed;) {
        changed = false;
        for (int i = 0; i < n; i++) {
            if (!open[i])
                continue;
            int dev = readers_device(c, &r, i, open);
            if (dev > 0 && update_able(in->kernels, in->nodes[i], dev, c->n_real)) {
                c->where[i] = (int16_t)dev;
                c->n_gpu++;
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
            const wf_node *node = in->nodes[i];
            if (c->kind[i] != K_KERNEL || node->op->n_assign == 0 || c->where[i] == 0)
                continue;
            int dev = readers_device(c, &r, i, NULL);
            if (assigns_variables(c, i) && (dev == -2 || dev == c->where[i]))
                continue;
            if (moved[i]) {
                c->where[i] = 0;
                c->n_gpu--;
                moved[i] = 0;
                changed = true;
                continue;
            }
            rc = update_misplaced(c, &r, i);
        }
    }
    /* Resident variables: every reader on one device (updates included). */
    for (int j = 0; rc == 0 && j < n; j++) {
        if (c->kind[j] != K_VARIABLE || r.off[j] == r.off[j + 1])
            continue;
        int dev = c->where[r.idx[r.off[j]]];
        for (int32_t e = r.off[j]; e < r.off[j + 1]; e++)
            if (c->where[r.idx[e]] != dev)
                dev = -1;
        if (dev > 0) {
            c->where[j] = (int16_t)dev;
            c->n_resident++;
        }
    }
    free(open);
    free(moved);
    free(r.off);
    free(r.idx);
    return rc;
}

int wf__place_check(const wf__place_in *in, const wf_node *node)
{
    int want = node->device;
    if (want < 0)
        return 0;
    int n_real = real_devices(in);
    int n_dev = n_real + in->n_sim;
    char dn[32], desc[WF_ERRMSG_MAX];
    if (want >= n_dev)
        return wf__err(WF_EINVAL,
                       "placement: %s is placed on device %d, but this runtime has %d "
                       "device%s%s",
                       wf__node_desc(node, desc, sizeof desc), want, n_dev, n_dev == 1 ? "" : "s",
                       n_dev == 1 ? " (cpu:0; no CUDA device: none found, or weft is built "
                                    "without CUDA)"
                                  : "");
    /* Sources hold host values: placing one only says where its readers are expected. */
    if (want == 0 || (node->op->flags & WF_OP_SOURCE))
        return 0;
    int kk = wf__place_kernel_kind(want, n_real);
    if (!wf__kernels_ok(in->kernels, node->op, node, kk))
        return wf__err(WF_ENODEV,
                       "placement: %s is placed on device %d (%s), but op '%s' has no %s "
                       "kernel%s",
                       wf__node_desc(node, desc, sizeof desc), want,
                       wf__place_dev_name(want, n_real, dn, sizeof dn), node->op->name,
                       kk == WF_KERNEL_CUDA ? "CUDA" : "CPU",
                       wf__kernels_find(in->kernels, node->op, kk)
                           ? " for this node (its attributes or inputs)"
                           : "");
    return 0;
}

/* The rule's device for kernel node 'i' (its inputs placed). */
static int rule_device(const pctx *c, int i)
{
    const wf__place_in *in = c->in;
    int want = in->device;
    if (want < 1) {
        want = 1; /* prefer the (first) GPU, unless an input is on another one */
        for (int32_t e = in->in_off[i]; e < in->in_off[i + 1]; e++)
            if (c->where[in->in_idx[e]] > 0) {
                want = c->where[in->in_idx[e]];
                break;
            }
    }
    return gpu_able(in->kernels, in->nodes[i], want, c->n_real) ? want : 0;
}

static int place(pctx *c, wf__placement *out)
{
    const wf__place_in *in = c->in;
    int n = in->n;
    const char *none = c->n_dev == 1 ? " (cpu:0; no CUDA device: none found, or weft is built "
                                       "without CUDA)"
                                     : "";
    /* Explicit placements first: checked whether or not anything else is placed. */
    bool explicit_gpu = false;
    for (int i = 0; i < n; i++) {
        const wf_node *node = in->nodes[i];
        int rc = wf__place_check(in, node);
        if (rc < 0)
            return rc;
        /* an update's variables are checked in place_updates() */
        explicit_gpu |= node->device > 0 && c->kind[i] == K_KERNEL;
    }
    if (in->device < -1 || in->device >= c->n_dev)
        return wf__err(WF_EINVAL,
                       "placement: wf_session_opts.device is %d, but this runtime has %d "
                       "device%s%s",
                       in->device, c->n_dev, c->n_dev == 1 ? "" : "s", none);
    bool rule_gpu = c->n_dev > 1 && in->device != -1 && !in->small;
    if (!explicit_gpu && !rule_gpu)
        return 0; /* every node on the CPU */
    /* The order is topological: each node's inputs are placed before it. */
    for (int i = 0; i < n; i++) {
        const wf_node *node = in->nodes[i];
        int where = 0;
        if (c->kind[i] == K_KERNEL)
            where = node->device >= 0 ? node->device : rule_gpu ? rule_device(c, i) : 0;
        c->where[i] = (int16_t)where;
        c->n_gpu += where > 0;
    }
    if (c->n_gpu == 0)
        return 0;
    int rc = place_updates(c, rule_gpu);
    if (rc >= 0)
        rc = insert_copies(c, out);
    if (rc >= 0) {
        out->n_gpu = c->n_gpu;
        out->n_resident = c->n_resident;
    }
    return rc;
}

int wf__place(const wf__place_in *in, wf__placement *out)
{
    memset(out, 0, sizeof *out);
    pctx c = { .in = in, .n_real = real_devices(in) };
    c.n_dev = c.n_real + in->n_sim;
    size_t m = (size_t)(in->n ? in->n : 1);
    c.kind = malloc(m);
    c.where = calloc(m, sizeof *c.where);
    if (!c.kind || !c.where) {
        free(c.kind);
        free(c.where);
        return wf__err(WF_ENOMEM, "placement: no memory for %d nodes", in->n);
    }
    for (int i = 0; i < in->n; i++) {
        const wf_op_def *op = in->nodes[i]->op;
        c.kind[i] = op == &wf_op_variable        ? K_VARIABLE
                    : (op->flags & WF_OP_SOURCE) ? K_SOURCE
                                                 : K_KERNEL;
    }
    int rc = place(&c, out);
    free(c.kind);
    free(c.where);
    if (rc < 0)
        wf__placement_free(out);
    return rc;
}
