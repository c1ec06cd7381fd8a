/* placement/replicate.c: the data-parallel rewrite (placement/replicate.h).
 * Owns: sorting the user's nodes into three kinds, the per-shard copies, the gradient
 *   buckets, and the global copies of the updates.
 * Kinds: a node is "replica" (R) when it depends on a batch placeholder (a -1 first
 *   dimension) through data or control edges and neither is nor depends on an update; it is
 *   "global" (Q) when it is an update (op->n_assign > 0) that depends on a batch, reads a
 *   replica gradient of a variable as wf_gradients() marked it (node.is_gradient: so that
 *   clipping by the global norm, or any other use of the gradients, sees the global ones),
 *   or depends on a global node; else it is shared (variables, constants, what reads only
 *   them). The gradients are the replica nodes that global nodes read as data.
 * Copies: for each local shard i (global shard k0 + i) every replica node is added again
 *   with its replica inputs replaced by shard i's copies; a batch placeholder becomes
 *   shard_rows(x, k, S). Gradients, in creation order (the order backward makes them),
 *   fill buckets (one closes once it holds its limit, the gradient that reaches it included,
 *   as DDP's); each bucket is one dp_reduce over the bucket's gradients of every local
 *   shard. When nothing else reads the gradients' shard copies (no replica node, no other
 *   stage, no device copy: Mirrored's devices), the bucket reduces in place, into the first
 *   local shard's tensors, and a dp_grad per gradient (over those bytes) is the global
 *   gradient: nothing is packed into a flat bucket and sliced out again, ~2 + 2 ms of a
 *   2-rank dp_bench step; else a slice + reshape per gradient of the flat result is. Every scalar
 * f32 replica node gets a dp_reduce of its own (it runs only when fetched), which adds the shards'
 * values up when the node is a sum (a count of correct rows), weights them by rows when it is a
 * mean (a loss), and else aggregates as the gradients do. Global nodes are added once, reading
 * global gradients and global copies; a control edge on a replica node becomes one on each shard's
 * copy (an update still runs after every read). Devices (Mirrored, opts 'shard_device'): shard i's
 * copies are placed on its device where they can run there (shard_device_of()); placement (place.c)
 * then adds the copies: the shard's rows and the variables to the device, the gradients back to the
 * host, where the dp_reduce nodes and the updates run. Why the tree lives in dp_reduce and not in
 * add nodes: the same code sums a rank's own shards and the ranks' partial sums, so the bits cannot
 * depend on the world size. In place over 3 or more local shards (a pipeline's micro-batches,
 * a rank's several shards) each inner sum of that tree is a dp_reduce node of its own
 * (tree_node()), which runs once both halves exist: the shards' gradients are summed as they
 * finish, about log2(b) partial sums stay alive instead of all b, and the sum after the last
 * backward is one addition, not b - 1; the additions, and so the bits, are those of one node. Not
 * here: the kernels (core/op_dist.c, transport/coll_ops.c), runtime wiring. */
#include "replicate.h"

#include "../core/error.h"
#include "../ops/table.h"

#include <weft/ops.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { K_SHARED = WF__KIND_SHARED, K_REPLICA = WF__KIND_REPLICA, K_GLOBAL = WF__KIND_GLOBAL };

static bool is_batch(const wf_node *n)
{
    return n->op == &wf_op_placeholder && n->shape.rank >= 1 && n->shape.dims[0] < 0;
}

/* The dp_reduce node of 'vals' (b per value) and its attributes, with [lo, hi) (hi > lo) a
 * node of the fixed tree over the local shards (core/op.h); NULL on failure. */
static wf_node *reduce_node(wf_graph *g, const wf__replicate_opts *o, int b, wf_node **ins,
                            int n_ins, int edge, const char *name, bool inplace, int lo, int hi)
{
    wf_attrs a = { 0 };
    a.keepdims = inplace;
    if (hi > lo) {
        a.begin[1] = lo;
        a.end[1] = hi;
        a.step[1] = 1;
    }
    a.begin[0] = (int64_t)o->rank * b;
    a.end[0] = o->shards;
    a.step[0] = b;
    a.axis = o->aggregation;
    a.edge = edge;
    const char *nm = name && !wf_graph_find(g, name) ? name : NULL;
    return wf__node_add_ex(g, &wf_op_dp_reduce, nm, ins, n_ins, &a, (wf_srcloc){ 0 });
}

/* Slices value 'off' .. 'off + numel(like)' of flat 'f' back into 'like''s shape. */
static wf_node *unpack(wf_graph *g, wf_node *f, int64_t off, const wf_node *like)
{
    int64_t begin[1] = { off }, end[1] = { off + wf_shape_numel(like->shape) };
    wf_node *s = (wf_slice)(g, f, begin, end, NULL);
    return s ? (wf_reshape)(g, s, like->shape) : NULL;
}

typedef struct rw {
    wf_graph *g;
    const wf__replicate_opts *o;
    int n, b;
    uint8_t *kind;
    wf_node **shard; /* b * n: shard[i * n + id] */
    wf_node **glob;  /* n: the global node of a gradient or of a global node */
    wf_node *ref;    /* the first batch placeholder */
    int edge;
    /* a pipeline's: cross[id] the other stages that read id's per-shard value, edge0[id] the
     * first of its edges within a shard, per_shard the edges of one shard, recv[i * n + id] */
    uint64_t *cross;
    int *edge0, per_shard;
    wf_node **recv;
    /* a pipeline's values of the step (a reduced gradient, a global node) that other stages'
     * global nodes read: gcross[id] those stages, gedge0[id] the first of its edges (after
     * every shard's), n_gcross the edges of them all, grecv[id] the recv here */
    uint64_t *gcross;
    int *gedge0, n_gcross;
    wf_node **grecv;
    /* a pipeline's shapes of every node for a micro-batch of sh_rows[k] rows (at most two
     * sizes: B / m rounded down and up), for the recvs (mb_shape()) */
    int64_t sh_rows[2];
    wf_shape *sh[2];
    wf__replica_map *map;
    /* own[id]: gradient id may be reduced in place (reduce_all()); a pipeline's gradients summed
     * as the micro-batches' backward parts are made (grow_trees()): tgi[id] their index (-1:
     * none), tcache[(tgi * (b + 1) + lo) * (b + 1) + hi] the tree node over [lo, hi) */
    uint8_t *own;
    int *tgi;
    wf_node **tcache;
} rw;

/* Whether node 'id' runs on this rank (always, without a pipeline). */
static bool local(const rw *w, int id)
{
    if (!w->o->stage_of)
        return true;
    int s = w->o->stage_of[id];
    return s == w->o->stage || s == WF__STAGE_ALL || s == WF__STAGE_SHARED;
}

/* The key edge of shard i's value of node 'id' to stage 'dst'. */
static int p2p_edge(const rw *w, int i, int id, int dst)
{
    uint64_t below = dst ? w->cross[id] & ((1ull << dst) - 1) : 0;
    return w->o->p2p_edge_base + i * w->per_shard + w->edge0[id] + __builtin_popcountll(below);
}

/* Every node's shape for a micro-batch of 'rows' rows (the batch placeholders' first
 * dimension), by each op's inference over the user's graph (ids are in topological order);
 * NULL on failure. Why: a value's -1 dimensions need not be the rows (a [B T, d] stream is
 * B*T rows), and the recv's buffer is made before the value comes. */
static const wf_shape *mb_shapes(rw *w, int64_t rows)
{
    for (int k = 0; k < 2; k++)
        if (w->sh[k] && w->sh_rows[k] == rows)
            return w->sh[k];
    int k = w->sh[0] ? 1 : 0;
    free(w->sh[k]);
    wf_shape *s = w->sh[k] = malloc((size_t)(w->n ? w->n : 1) * sizeof *s);
    if (!s)
        return NULL;
    w->sh_rows[k] = rows;
    wf_dtype dts[16];
    wf_shape shs[16];
    for (int id = 0; id < w->n; id++) {
        const wf_node *v = wf_graph_node(w->g, id);
        s[id] = v->shape;
        if (w->kind[id] != K_REPLICA || v->n_inputs > 16 || v->n_inputs == 0) {
            if (is_batch(v))
                s[id].dims[0] = rows;
            continue;
        }
        for (int j = 0; j < v->n_inputs; j++) {
            dts[j] = v->inputs[j]->dtype;
            shs[j] = s[v->inputs[j]->id];
        }
        wf_dtype dt;
        wf_shape out;
        if (wf__op_infer(v, dts, shs, &dt, &out) == 0)
            s[id] = out; /* else its own -1 dimensions: taken as the rows, below */
    }
    return s;
}

/* Shard i's value of 'x' (another stage's) received here: one recv per (value, shard), of
 * x's shape for the shard's rows (mb_shapes(); a -1 inference left is taken as the rows).
 * NULL on failure. */
static wf_node *recv_of(rw *w, int i, const wf_node *x)
{
    wf_node **slot = &w->recv[(size_t)i * w->n + x->id];
    if (*slot)
        return *slot;
    int64_t lo, hi;
    wf__shard_rows_range(w->o->batch_rows, i, w->o->shards, &lo, &hi);
    wf_attrs a = { 0 };
    a.peer = w->o->stage_of[x->id];
    a.edge = p2p_edge(w, i, x->id, w->o->stage);
    a.dtype = x->dtype;
    a.shape = x->shape;
    const wf_shape *sh = wf_shape_numel(x->shape) < 0 ? mb_shapes(w, hi - lo) : NULL;
    if (sh)
        a.shape = sh[x->id];
    for (int d = 0; d < a.shape.rank; d++)
        if (a.shape.dims[d] < 0)
            a.shape.dims[d] = hi - lo;
    char name[256];
    snprintf(name, sizeof name, "%s/mb%d/recv", x->name, i);
    *slot = wf__node_add_ex(w->g, &wf_op_recv, wf_graph_find(w->g, name) ? NULL : name, NULL, 0, &a,
                            (wf_srcloc){ x->file, x->line });
    return *slot;
}

/* The key edge of the step's value of node 'id' (a reduced gradient or a global node) to
 * stage 'dst': after every shard's edges. */
static int global_edge(const rw *w, int id, int dst)
{
    uint64_t below = dst ? w->gcross[id] & ((1ull << dst) - 1) : 0;
    return w->o->p2p_edge_base + w->per_shard * w->o->shards + w->gedge0[id] +
           __builtin_popcountll(below);
}

/* The step's value of 'x' (another stage's reduced gradient or global node) received here:
 * one recv per value; NULL on failure. */
static wf_node *recv_global(rw *w, const wf_node *x)
{
    wf_node **slot = &w->grecv[x->id];
    if (*slot)
        return *slot;
    wf_attrs a = { 0 };
    a.peer = w->o->stage_of[x->id];
    a.edge = global_edge(w, x->id, w->o->stage);
    a.dtype = x->dtype;
    a.shape = x->shape;
    char name[256];
    snprintf(name, sizeof name, "%s/recv", x->name);
    *slot = wf__node_add_ex(w->g, &wf_op_recv, wf_graph_find(w->g, name) ? NULL : name, NULL, 0, &a,
                            (wf_srcloc){ x->file, x->line });
    return *slot;
}

/* A send of 'c' (standing for user node 'src') to stage 'dst' on key edge 'edge', recorded in
 * the map ('scalar': a fetched scalar's global value, sent to every stage). */
static int add_send(rw *w, wf_node *c, int src, int dst, int edge, bool scalar)
{
    wf__replica_map *m = w->map;
    if (m->n_sends == m->cap_sends) {
        int cap = m->cap_sends ? 2 * m->cap_sends : 16;
        wf_node **s = realloc(m->sends, sizeof *s * (size_t)cap);
        if (s)
            m->sends = s;
        int *a = realloc(m->send_src, sizeof *a * (size_t)cap);
        if (a)
            m->send_src = a;
        int *b = realloc(m->send_dst, sizeof *b * (size_t)cap);
        if (b)
            m->send_dst = b;
        if (!s || !a || !b)
            return wf__err(WF_ENOMEM, "pipeline rewrite: no memory");
        m->cap_sends = cap;
    }
    wf_attrs at = { 0 };
    at.peer = dst;
    at.edge = edge;
    wf_node *s = wf__node_add_ex(w->g, &wf_op_send, NULL, &c, 1, &at, (wf_srcloc){ 0 });
    if (!s)
        return wf_graph_status(w->g) < 0 ? wf_graph_status(w->g) : WF_ENOMEM;
    m->sends[m->n_sends] = s;
    m->send_src[m->n_sends] = src;
    m->send_dst[m->n_sends++] = scalar ? -1 : dst;
    return 0;
}

/* Sends shard i's copy 'c' of node 'id' to every other stage that reads it. */
static int send_to_readers(rw *w, int i, int id, wf_node *c)
{
    int rc = 0;
    for (int dst = 0; dst < w->o->stages && rc == 0; dst++)
        if (w->cross[id] >> dst & 1)
            rc = add_send(w, c, id, dst, p2p_edge(w, i, id, dst), false);
    return rc;
}

/* Sends the step's value 'c' of node 'id' to every other stage whose global nodes read it. */
static int send_global(rw *w, int id, wf_node *c)
{
    int rc = 0;
    for (int dst = 0; w->gcross && dst < w->o->stages && rc == 0; dst++)
        if (w->gcross[id] >> dst & 1)
            rc = add_send(w, c, id, dst, global_edge(w, id, dst), false);
    return rc;
}

static int fail_node(const wf_node *n, int code, const char *what)
{
    char desc[WF_ERRMSG_MAX];
    return wf__err(code, "data-parallel rewrite: %s: %s", wf__node_desc(n, desc, sizeof desc),
                   what);
}

/* The device shard 'i''s copy 'c' of a node runs on (Mirrored): the shard's, when the node
 * is a kernel the device can run as the placement rule would put it there (placement/
 * place.c: kernel_able(); sim devices run the CPU kernels), else -1 (the session's rule:
 * the host). The row split stays on the host, so that only a shard's rows cross. */
static int shard_device_of(const rw *w, int i, const wf_node *c)
{
    const wf__replicate_opts *o = w->o;
    if (!o->shard_device || c->op == &wf_op_shard_rows)
        return -1;
    int id = o->shard_device[i];
    int kind = id < o->n_real ? WF_KERNEL_CUDA : WF_KERNEL_CPU;
    if ((c->op->flags & (WF_OP_SOURCE | WF_OP_DYNAMIC_SHAPE | WF_OP_ASYNC)) ||
        !wf__op_kernel_ok(c->op, c, kind) || c->dtype == WF_F64)
        return -1;
    for (int k = 0; k < c->n_inputs; k++)
        if (c->inputs[k]->dtype == WF_F64)
            return -1;
    return id;
}

/* The node of the fixed tree over local shards [lo, hi) (hi - lo >= 2) of bucket 'members'
 * (n_mem gradients), reduced in place, over its halves' nodes 'halves' (NULL: a one-shard half,
 * the shard's own value); named 'name'. NULL on failure. */
static wf_node *tree_one(rw *w, const int *members, int n_mem, int lo, int hi,
                         wf_node *const *halves, const char *name)
{
    int mid = wf__dp_tree_split(lo, hi), k = 0;
    wf_node **ins = malloc((size_t)(3 + 2 * n_mem) * sizeof *ins);
    if (!ins)
        return NULL;
    ins[k++] = w->ref;
    for (int j = 0; j < n_mem; j++) {
        ins[k++] = w->shard[lo * w->n + members[j]];
        ins[k++] = w->shard[mid * w->n + members[j]];
    }
    for (int h = 0; h < 2; h++)
        if (halves[h])
            ins[k++] = halves[h];
    wf_node *t = reduce_node(w->g, w->o, w->b, ins, k, w->edge, name, true, lo, hi);
    free(ins);
    return t;
}

/* The whole tree over [lo, hi), its halves' nodes first, so each runs once both halves exist
 * and the shards' gradients are summed as they finish, not all kept until the last; only the
 * node over every local shard exchanges. NULL on failure. */
static wf_node *tree_node(rw *w, const int *members, int n_mem, int lo, int hi, const char *name)
{
    int mid = wf__dp_tree_split(lo, hi);
    wf_node *halves[2] = { mid - lo > 1 ? tree_node(w, members, n_mem, lo, mid, NULL) : NULL,
                           hi - mid > 1 ? tree_node(w, members, n_mem, mid, hi, NULL) : NULL };
    if ((mid - lo > 1 && !halves[0]) || (hi - mid > 1 && !halves[1]))
        return NULL;
    return tree_one(w, members, n_mem, lo, hi, halves, name);
}

static wf_node **tslot(const rw *w, int id, int lo, int hi)
{
    return &w->tcache[((size_t)w->tgi[id] * (size_t)(w->b + 1) + (size_t)lo) * (size_t)(w->b + 1) +
                      (size_t)hi];
}

/* A pipeline's tree of gradient 'id' over [lo, hi): makes the nodes that end at or before
 * local shard 'upto' (whose shards' backward parts exist) and are not made yet. */
static int grow_tree(rw *w, int id, int lo, int hi, int upto)
{
    if (hi - lo < 2)
        return 0;
    int mid = wf__dp_tree_split(lo, hi), rc;
    if ((rc = grow_tree(w, id, lo, mid, upto)) < 0 || (rc = grow_tree(w, id, mid, hi, upto)) < 0)
        return rc;
    if (hi > upto || *tslot(w, id, lo, hi))
        return 0;
    wf_node *halves[2] = { mid - lo > 1 ? *tslot(w, id, lo, mid) : NULL,
                           hi - mid > 1 ? *tslot(w, id, mid, hi) : NULL };
    if (!(*tslot(w, id, lo, hi) = tree_one(w, &id, 1, lo, hi, halves, NULL)))
        return wf_graph_status(w->g) < 0 ? wf_graph_status(w->g) : WF_ENOMEM;
    return 0;
}

/* After local shard i's backward part: the tree nodes of every such gradient that end there. */
static int grow_trees(rw *w, int i)
{
    int rc = 0;
    for (int id = 0; w->tgi && id < w->n && rc == 0; id++)
        if (w->tgi[id] >= 0)
            rc = grow_tree(w, id, 0, w->b, i + 1);
    return rc;
}

/* Shard i's copy 'c' of such a gradient is written after the tree nodes that end at shard i
 * (they read the bytes it may then take: the memory plan sees the order); 0 or an error. */
static int after_trees(rw *w, int i, int id, wf_node *c)
{
    for (int lo = 0; w->tgi && w->tgi[id] >= 0 && lo + 1 < i; lo++) {
        wf_node *t = *tslot(w, id, lo, i);
        if (t && wf__node_add_control(c, t) < 0)
            return wf_graph_status(w->g) < 0 ? wf_graph_status(w->g) : WF_ENOMEM;
    }
    return 0;
}

/* Which gradients may be reduced in place (over their shards' own tensors: no copy into a
 * flat bucket and back): those whose dp_reduce is the only reader of their shards' copies (no
 * replica node reads them, no other stage receives them, and no device copy stands between:
 * Mirrored's placement adds those after the rewrite). A pipeline whose schedule makes the
 * backward parts in micro-batch order sums those of 3 or more micro-batches as each part is
 * made (grow_trees()); 0 or WF_ENOMEM. */
static int plan_inplace(rw *w, const uint8_t *is_grad)
{
    size_t nn = (size_t)(w->n ? w->n : 1);
    if (!(w->own = malloc(nn)))
        return wf__err(WF_ENOMEM, "data-parallel rewrite: no memory");
    for (int id = 0; id < w->n; id++)
        w->own[id] = !w->o->shard_device && !(w->cross && w->cross[id]);
    for (int id = 0; id < w->n; id++) {
        const wf_node *v = wf_graph_node(w->g, id);
        if (w->kind[id] != K_REPLICA)
            continue;
        for (int j = 0; j < v->n_inputs; j++)
            w->own[v->inputs[j]->id] = 0;
        for (int j = 0; j < v->n_control; j++)
            w->own[v->control[j]->id] = 0;
    }
    const int *order = w->o->order;
    if (!order || w->b < 3)
        return 0;
    for (int p = 0, next = 0; p < 2 * w->b; p++)
        if (order[p] < 0 && -1 - order[p] != next++)
            return 0; /* backward parts out of micro-batch order: the trees come at the end */
    int n_t = 0;
    if (!(w->tgi = malloc(nn * sizeof *w->tgi)))
        return wf__err(WF_ENOMEM, "data-parallel rewrite: no memory");
    for (int id = 0; id < w->n; id++)
        w->tgi[id] = is_grad[id] && local(w, id) && w->own[id] ? n_t++ : -1;
    size_t cells = (size_t)n_t * (size_t)(w->b + 1) * (size_t)(w->b + 1);
    if (!(w->tcache = calloc(cells ? cells : 1, sizeof *w->tcache)))
        return wf__err(WF_ENOMEM, "data-parallel rewrite: no memory for the gradients' trees");
    return 0;
}

static int copy_shards(rw *w)
{
    wf_node *stack_in[16], **in = stack_in;
    int cap = 16, rc = 0;
    /* Without a schedule: shard by shard. With one: its compute actions in order (a
     * micro-batch's forward or backward part), so that each part's nodes are made after the
     * part before it and a control edge can order them (placement/pipeline.c). */
    const int *order = w->o->order;
    int n_parts = order ? 2 * w->b : w->b;
    for (int p = 0; p < n_parts && rc == 0; p++) {
        for (int id = 0; id < w->n && rc == 0; id++) {
            int i = order ? (order[p] >= 0 ? order[p] : -1 - order[p]) : p;
            wf_node *n = wf_graph_node(w->g, id);
            if (w->kind[id] != K_REPLICA || !local(w, id) ||
                (order && w->o->backward[id] != (order[p] < 0)))
                continue;
            wf_node *c;
            /* a pipeline's copies are named by micro-batch ("fc1/mb2"): traces, dumps */
            char name[256];
            const char *nm = NULL;
            if (order) {
                snprintf(name, sizeof name, "%s/mb%d", n->name, i);
                nm = wf_graph_find(w->g, name) ? NULL : name;
            }
            if (is_batch(n)) {
                wf_attrs a = { 0 };
                a.begin[0] = (int64_t)w->o->rank * w->b + i;
                a.end[0] = w->o->shards;
                c = wf__node_add_ex(w->g, &wf_op_shard_rows, nm, &n, 1, &a, (wf_srcloc){ 0 });
            } else {
                if (n->n_inputs > cap) {
                    wf_node **m =
                        realloc(in == stack_in ? NULL : in, (size_t)n->n_inputs * sizeof *m);
                    if (!m) {
                        rc = wf__err(WF_ENOMEM, "data-parallel rewrite: no memory");
                        break;
                    }
                    in = m;
                    cap = n->n_inputs;
                }
                for (int k = 0; k < n->n_inputs; k++) {
                    wf_node *x = n->inputs[k];
                    in[k] = w->kind[x->id] != K_REPLICA ? x
                            : local(w, x->id)           ? w->shard[i * w->n + x->id]
                                                        : recv_of(w, i, x);
                    if (!in[k])
                        rc = wf_graph_status(w->g) < 0 ? wf_graph_status(w->g) : WF_ENOMEM;
                }
                if (rc < 0)
                    break;
                c = wf__node_add_ex(w->g, n->op, nm, in, n->n_inputs, n->attrs,
                                    (wf_srcloc){ n->file, n->line });
                for (int k = 0; c && k < n->n_control; k++) {
                    wf_node *x = n->control[k];
                    wf_node *cx = w->kind[x->id] == K_REPLICA ? w->shard[i * w->n + x->id] : x;
                    if (wf__node_add_control(c, cx) < 0)
                        c = NULL;
                }
            }
            if (!c)
                rc = wf_graph_status(w->g) < 0 ? wf_graph_status(w->g) : WF_ENOMEM;
            else
                c->device = shard_device_of(w, i, c);
            w->shard[i * w->n + id] = c;
            if (c && w->cross && w->cross[id])
                rc = send_to_readers(w, i, id, c);
            if (c && rc == 0)
                rc = after_trees(w, i, id, c);
        }
        if (rc == 0 && order && order[p] < 0)
            rc = grow_trees(w, -1 - order[p]);
    }
    if (in != stack_in)
        free(in);
    return rc;
}

/* Buckets of the gradients ('is_grad'), then the scalars. */
static int reduce_all(rw *w, const uint8_t *is_grad, wf__replica_map *m)
{
    const wf__replicate_opts *o = w->o;
    int b = w->b, rc = 0;
    int max_in = 1 + b * w->n;
    wf_node **ins = malloc((size_t)max_in * sizeof *ins);
    int *members = malloc((size_t)(w->n ? w->n : 1) * sizeof *members);
    const uint8_t *own = w->own;
    if (!ins || !members) {
        free(ins);
        free(members);
        return wf__err(WF_ENOMEM, "data-parallel rewrite: no memory");
    }
    /* a pipeline's gradients whose trees were made with the copies (grow_trees()) */
    for (int id = 0; w->tgi && id < w->n && rc == 0; id++) {
        if (w->tgi[id] < 0)
            continue;
        wf_node *two[2] = { w->shard[id], *tslot(w, id, 0, b) };
        if (!two[1] || !(w->glob[id] = wf__node_add_ex(w->g, &wf_op_dp_grad, NULL, two, 2,
                                                       &(wf_attrs){ 0 }, (wf_srcloc){ 0 })))
            rc = wf_graph_status(w->g) < 0 ? wf_graph_status(w->g) : WF_ENOMEM;
        m->n_grads++;
    }
    int n_mem = 0;
    bool inplace = true; /* every member of the open bucket may be reduced in place */
    size_t bytes = 0, limit = o->first_bucket_bytes;
    for (int id = 0; id <= w->n && rc == 0; id++) {
        bool g = id < w->n && is_grad[id] && local(w, id) && !(w->tgi && w->tgi[id] >= 0);
        size_t gb = g ? (size_t)wf_shape_numel(wf_graph_node(w->g, id)->shape) * 4 : 0;
        if (g) {
            members[n_mem++] = id;
            bytes += gb;
            inplace &= own[id];
        }
        /* DDP's rule (c10d's compute_bucket_assignment_by_size): the gradient that reaches the
         * limit joins the bucket, which then closes; so with the 1 MiB first bucket the second
         * gradient to come, however large, starts its reduction while backward goes on */
        bool close = n_mem > 0 && (id == w->n || bytes >= limit);
        if (close) {
            if (w->edge + 1 >= (1 << 15)) {
                rc = wf__err(WF_EINVAL, "data-parallel rewrite: more than %d buckets and scalars",
                             ((1 << 15) - o->edge_base) / 2);
                break;
            }
            int k = 0;
            ins[k++] = w->ref;
            for (int j = 0; j < n_mem; j++)
                for (int i = 0; i < b; i++)
                    ins[k++] = w->shard[i * w->n + members[j]];
            char name[64];
            snprintf(name, sizeof name, "dp_bucket_%d", m->n_buckets);
            /* in place over 3 or more local shards: the tree as nodes (tree_node()) */
            wf_node *f = inplace && b > 2
                             ? tree_node(w, members, n_mem, 0, b, name)
                             : reduce_node(w->g, o, b, ins, k, w->edge, name, inplace, 0, 0);
            w->edge += 2;
            int64_t off = 0;
            for (int j = 0; f && j < n_mem; j++) {
                wf_node *like = wf_graph_node(w->g, members[j]);
                wf_node *two[2] = { w->shard[members[j]], f };
                w->glob[members[j]] = inplace ? wf__node_add_ex(w->g, &wf_op_dp_grad, NULL, two, 2,
                                                                &(wf_attrs){ 0 }, (wf_srcloc){ 0 })
                                              : unpack(w->g, f, off, like);
                off += wf_shape_numel(like->shape);
                if (!w->glob[members[j]])
                    f = NULL;
            }
            if (!f) {
                rc = wf_graph_status(w->g) < 0 ? wf_graph_status(w->g) : WF_ENOMEM;
                break;
            }
            m->n_buckets++;
            m->n_grads += n_mem;
            n_mem = 0;
            bytes = 0;
            inplace = true;
            limit = o->bucket_bytes;
        }
    }
    /* Scalars the shards compute: global values for fetches. A pipeline's are sent from
     * their stage to every other one, so any rank can fetch them (edges after the shards'). */
    int scalar = 0, scalar_base = o->p2p_edge_base + w->per_shard * o->shards + w->n_gcross;
    for (int id = 0; id < w->n && rc == 0; id++) {
        wf_node *n = wf_graph_node(w->g, id);
        if (w->kind[id] != K_REPLICA || is_grad[id] || n->shape.rank != 0 || n->dtype != WF_F32)
            continue;
        if (o->stage_of) {
            int e0 = scalar_base + scalar++ * o->stages;
            if (e0 + o->stages > o->edge_base) {
                rc = wf__err(WF_EINVAL,
                             "pipeline rewrite: more scalars computed from the batch than the "
                             "%d send/recv edges there are",
                             o->edge_base - o->p2p_edge_base);
                break;
            }
            if (!local(w, id)) {
                wf_attrs a = { 0 };
                a.peer = o->stage_of[id];
                a.edge = e0 + o->stage;
                a.dtype = WF_F32;
                a.shape = n->shape;
                if (!(m->remap[id] = wf__node_add_ex(w->g, &wf_op_recv, NULL, NULL, 0, &a,
                                                     (wf_srcloc){ n->file, n->line })))
                    rc = wf_graph_status(w->g) < 0 ? wf_graph_status(w->g) : WF_ENOMEM;
                continue;
            }
        }
        if (w->edge + 1 >= (1 << 15))
            break; /* no edges left: such a scalar is then not fetchable (remap NULL) */
        int k = 0;
        ins[k++] = w->ref;
        for (int i = 0; i < b; i++)
            ins[k++] = w->shard[i * w->n + id];
        /* a sum over rows adds up over the shards; a mean is weighted by rows */
        wf__replicate_opts so = *o;
        if (n->op == &wf_op_sum)
            so.aggregation = WF__AGG_SUM;
        else if (n->op == &wf_op_mean)
            so.aggregation = WF__AGG_MEAN;
        wf_node *f = reduce_node(w->g, &so, b, ins, k, w->edge, NULL, false, 0, 0);
        w->edge += 2;
        wf_node *s = f ? (wf_reshape)(w->g, f, n->shape) : NULL;
        if (!s)
            rc = wf_graph_status(w->g) < 0 ? wf_graph_status(w->g) : WF_ENOMEM;
        m->remap[id] = s;
        for (int dst = 0; o->stage_of && dst < o->stages && rc == 0; dst++)
            if (dst != o->stage)
                rc = add_send(w, s, id, dst, scalar_base + (scalar - 1) * o->stages + dst, true);
    }
    free(ins);
    free(members);
    return rc;
}

static int copy_globals(rw *w, const uint8_t *is_grad)
{
    int rc = 0;
    /* a pipeline's reduced gradients that another stage's global nodes read (clipping by the
     * global norm): sent once per step */
    for (int id = 0; w->gcross && id < w->n && rc == 0; id++)
        if (is_grad[id] && local(w, id) && w->gcross[id])
            rc = send_global(w, id, w->glob[id]);
    for (int id = 0; id < w->n && rc == 0; id++) {
        wf_node *n = wf_graph_node(w->g, id);
        if (w->kind[id] != K_GLOBAL || !local(w, id))
            continue;
        wf_node **in = malloc((size_t)(n->n_inputs ? n->n_inputs : 1) * sizeof *in);
        if (!in)
            return wf__err(WF_ENOMEM, "data-parallel rewrite: no memory");
        for (int k = 0; k < n->n_inputs; k++) {
            wf_node *x = n->inputs[k];
            in[k] = w->kind[x->id] == K_SHARED ? x
                    : local(w, x->id)          ? w->glob[x->id]
                                               : recv_global(w, x);
            if (!in[k] && local(w, x->id))
                rc = fail_node(n, WF_EINVAL,
                               "an update reads a per-replica value that is no "
                               "gradient");
            else if (!in[k])
                rc = wf_graph_status(w->g) < 0 ? wf_graph_status(w->g) : WF_ENOMEM;
        }
        wf_node *c = NULL;
        if (rc == 0) {
            c = wf__node_add_ex(w->g, n->op, NULL, in, n->n_inputs, n->attrs,
                                (wf_srcloc){ n->file, n->line });
            for (int k = 0; c && k < n->n_control; k++) {
                wf_node *x = n->control[k];
                if (!local(w, x->id))
                    continue; /* a pipeline's node of every stage: ordered after its own */
                if (w->kind[x->id] == K_REPLICA) {
                    for (int i = 0; c && i < w->b; i++)
                        if (wf__node_add_control(c, w->shard[i * w->n + x->id]) < 0)
                            c = NULL;
                } else if (wf__node_add_control(c, w->kind[x->id] ? w->glob[x->id] : x) < 0) {
                    c = NULL;
                }
            }
            if (!c)
                rc = wf_graph_status(w->g) < 0 ? wf_graph_status(w->g) : WF_ENOMEM;
        }
        free(in);
        w->glob[id] = c;
        if (rc == 0 && w->gcross && w->gcross[id])
            rc = send_global(w, id, c);
    }
    return rc;
}

int wf__replicate_kinds(const wf_graph *g, uint8_t *kind, uint8_t *is_grad, wf_node **ref)
{
    int n = wf_graph_node_count(g);
    *ref = NULL;
    memset(is_grad, 0, (size_t)n);
    for (int id = 0; id < n; id++) {
        const wf_node *v = wf_graph_node(g, id);
        int k = K_SHARED;
        if (is_batch(v)) {
            k = K_REPLICA;
            if (!*ref)
                *ref = (wf_node *)v;
        }
        bool reads_grad = false;
        for (int j = 0; j < v->n_inputs; j++) {
            const wf_node *x = v->inputs[j];
            k = k > kind[x->id] ? k : kind[x->id];
            reads_grad |= x->is_gradient && kind[x->id] == K_REPLICA;
        }
        if (reads_grad)
            k = K_GLOBAL;
        for (int j = 0; j < v->n_control; j++)
            k = k > kind[v->control[j]->id] ? k : kind[v->control[j]->id];
        if (k == K_REPLICA && v->op->n_assign > 0)
            k = K_GLOBAL;
        kind[id] = (uint8_t)k;
    }
    if (!*ref)
        return wf__err(WF_EINVAL, "data-parallel rewrite: no placeholder has a -1 first dimension "
                                  "(a batch to shard)");
    for (int id = 0; id < n; id++) {
        const wf_node *v = wf_graph_node(g, id);
        if (kind[id] != K_GLOBAL)
            continue;
        for (int j = 0; j < v->n_inputs; j++) {
            const wf_node *x = v->inputs[j];
            if (kind[x->id] != K_REPLICA)
                continue;
            if (x->dtype != WF_F32 || wf_shape_numel(x->shape) < 0)
                return fail_node(x, WF_EINVAL, "a gradient must be f32 with a static shape");
            is_grad[x->id] = 1;
        }
    }
    return 0;
}

/* A pipeline's edges across stages: which stages read each per-shard value, and the checks
 * that only such values cross (an update, and every control edge, stays on its stage). */
static int plan_crossings(rw *w, const uint8_t *is_grad)
{
    const int *st = w->o->stage_of;
    int total = 0;
    for (int id = 0; id < w->n; id++) {
        const wf_node *v = wf_graph_node(w->g, id);
        int sv = st[id];
        if (w->kind[id] == K_SHARED)
            continue;
        for (int j = 0; j < v->n_inputs + v->n_control; j++) {
            const wf_node *x = j < v->n_inputs ? v->inputs[j] : v->control[j - v->n_inputs];
            int sx = st[x->id];
            if (w->kind[x->id] == K_SHARED || sx == sv)
                continue;
            char desc[WF_ERRMSG_MAX];
            wf__node_desc(x, desc, sizeof desc);
            char why[WF_ERRMSG_MAX];
            if (j >= v->n_inputs) {
                if (sv == WF__STAGE_ALL)
                    continue; /* a node of every stage is ordered after its own stage's */
                snprintf(why, sizeof why,
                         "on stage %d is ordered after %s on stage %d: a control edge across "
                         "stages is not supported",
                         sv, desc, sx);
                return fail_node(v, WF_EINVAL, why);
            }
            if (w->kind[id] == K_GLOBAL && (sv >= 0 || sv == WF__STAGE_ALL) && sx >= 0 &&
                (w->kind[x->id] == K_GLOBAL || is_grad[x->id])) {
                /* the step's value crosses once (a gradient after its reduction) */
                if (wf_shape_numel(x->shape) < 0) {
                    snprintf(why, sizeof why,
                             "on stage %d reads %s of stage %d, whose shape is not static", sv,
                             desc, sx);
                    return fail_node(v, WF_EINVAL, why);
                }
                uint64_t every = w->o->stages >= 64 ? ~0ull : (1ull << w->o->stages) - 1;
                w->gcross[x->id] |= sv >= 0 ? 1ull << sv : every & ~(1ull << sx);
                continue;
            }
            if (w->kind[id] == K_GLOBAL || w->kind[x->id] == K_GLOBAL || sv < 0) {
                snprintf(why, sizeof why,
                         "on stage %d reads %s of stage %d: an update and what it reads must be "
                         "on one stage (the stage of the variable)",
                         sv, desc, sx);
                return fail_node(v, WF_EINVAL, why);
            }
            w->cross[x->id] |= 1ull << sv;
        }
    }
    for (int id = 0; id < w->n; id++) {
        w->edge0[id] = total;
        total += __builtin_popcountll(w->cross[id]);
    }
    w->per_shard = total;
    for (int id = 0; id < w->n; id++) {
        w->gedge0[id] = w->n_gcross;
        w->n_gcross += __builtin_popcountll(w->gcross[id]);
    }
    if ((long long)total * w->o->shards + w->n_gcross + w->o->p2p_edge_base > w->o->edge_base)
        return wf__err(WF_EINVAL,
                       "pipeline rewrite: %d values cross stages in each of %d micro-batches "
                       "and %d once per step: more than the %d send/recv edges there are",
                       total, w->o->shards, w->n_gcross, w->o->edge_base - w->o->p2p_edge_base);
    return 0;
}

void wf__replica_map_free(wf__replica_map *m)
{
    if (!m)
        return;
    free(m->remap);
    free(m->sends);
    free(m->send_src);
    free(m->send_dst);
    free(m->shard);
    free(m->stage);
    free(m->order);
    memset(m, 0, sizeof *m);
}

int wf__replicate(wf_graph *g, const wf__replicate_opts *o, wf__replica_map *m)
{
    memset(m, 0, sizeof *m);
    if (!g || !o || o->size < 1 || o->rank < 0 || o->rank >= o->size || o->shards < o->size ||
        o->shards % o->size || !o->bucket_bytes || !o->first_bucket_bytes ||
        (o->stage_of && (o->size != 1 || o->stages < 1 || o->stages > 64 || o->stage < 0 ||
                         o->stage >= o->stages || o->batch_rows < o->shards)))
        return wf__err(WF_EINVAL, "data-parallel rewrite: bad options");
    if (wf_graph_mode(g) != WF_STATIC)
        return wf__err(WF_EINVAL, "data-parallel rewrite: the graph is eager; a strategy "
                                  "rewrites static graphs");
    rw w = { .g = g, .o = o, .n = wf_graph_node_count(g), .b = o->shards / o->size, .map = m };
    w.edge = o->edge_base;
    int n = w.n, rc = 0;
    size_t nn = (size_t)(n ? n : 1);
    w.kind = calloc(nn, 1);
    uint8_t *is_grad = calloc(nn, 1);
    w.shard = calloc((size_t)w.b * nn, sizeof *w.shard);
    w.glob = calloc(nn, sizeof *w.glob);
    m->remap = calloc(nn, sizeof *m->remap);
    if (o->stage_of) {
        w.cross = calloc(nn, sizeof *w.cross);
        w.edge0 = calloc(nn, sizeof *w.edge0);
        w.recv = calloc((size_t)w.b * nn, sizeof *w.recv);
        w.gcross = calloc(nn, sizeof *w.gcross);
        w.gedge0 = calloc(nn, sizeof *w.gedge0);
        w.grecv = calloc(nn, sizeof *w.grecv);
    }
    if (!w.kind || !is_grad || !w.shard || !w.glob || !m->remap ||
        (o->stage_of && (!w.cross || !w.edge0 || !w.recv || !w.gcross || !w.gedge0 || !w.grecv))) {
        rc = wf__err(WF_ENOMEM, "data-parallel rewrite: no memory for %d nodes", n);
        goto done;
    }
    if ((rc = wf__replicate_kinds(g, w.kind, is_grad, &w.ref)) < 0)
        goto done;
    if (o->stage_of && (rc = plan_crossings(&w, is_grad)) < 0)
        goto done;
    if ((rc = plan_inplace(&w, is_grad)) < 0 || (rc = copy_shards(&w)) < 0 ||
        (rc = reduce_all(&w, is_grad, m)) < 0 || (rc = copy_globals(&w, is_grad)) < 0)
        goto done;
    for (int id = 0; id < n; id++) {
        if (w.kind[id] == K_SHARED)
            m->remap[id] = wf_graph_node(g, id);
        else if (w.kind[id] == K_GLOBAL)
            m->remap[id] = w.glob[id];
        else if (is_grad[id])
            m->remap[id] = w.glob[id];
    }
    m->n = n;
    m->n_local = w.b;
    if (o->stage_of) { /* the schedule orders the shards' copies (placement/pipeline.c) */
        m->shard = w.shard;
        w.shard = NULL;
        if (!(m->stage = malloc(nn * sizeof *m->stage))) {
            rc = wf__err(WF_ENOMEM, "pipeline rewrite: no memory");
            goto done;
        }
        memcpy(m->stage, o->stage_of, (size_t)n * sizeof *m->stage);
    }
done:
    free(w.kind);
    free(is_grad);
    free(w.shard);
    free(w.glob);
    free(w.cross);
    free(w.edge0);
    free(w.recv);
    free(w.gcross);
    free(w.gedge0);
    free(w.grecv);
    free(w.sh[0]);
    free(w.sh[1]);
    free(w.own);
    free(w.tgi);
    free(w.tcache);
    if (rc < 0)
        wf__replica_map_free(m);
    return rc;
}
