/* runtime/pass_optim_fuse.c: optimizer fusion: the per-variable update nodes of one optimizer
 * become one multi-tensor update node (grad/update.h) that updates all its variables in
 * tiles of WF__UPDATE_TILE elements, one scheduled task per tile instead of one task (or a
 * parallel loop) per variable.
 * Owns: grouping the updates (same op update_K, same step counter and hyperparameter vector
 *   after replacement, same dtype: one wf_minimize()/wf_apply_gradients() call; and, in a
 *   data-parallel step, the same gradient bucket, so that the update of a bucket all-reduced
 *   early runs while later buckets are still on the network instead of after the last), the checks
 *   that make merging them safe, and the plan-owned fused nodes.
 * Why it is safe: runtime/compile/passes.h states the rule this pass adds to the framework (the
 *   exception for fused updates): members nobody reads as data and nobody fetches, no
 *   variable written twice, no member ordered after another, and (key, id) order stays
 *   topological. The fused node keeps every member's control edges (after every reader of
 *   every variable it writes), and the step counter's increment, ordered after each member,
 *   is ordered after it through the replacement map (compile/plan.h: 'index_of').
 * Results: each element gets the same loop as before (grad/optim_cpu.c), so a step gives the
 *   same bits with the pass on and off.
 * Cost: O(groups x (nodes + edges)); a graph has a handful of optimizers.
 * Not here: the multi-tensor kernel (grad/optim_cpu.c), the pass framework (passes.c). */
#include "../../grad/update.h"
#include "../../ops/table.h"
#include "passes.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A fused node and the storage it points into, one block (passes.c frees it with free()). */
typedef struct fused_node {
    wf_node node; /* first: the node pointer is the block pointer */
    wf_attrs attrs;
    wf_node *ptrs[]; /* inputs, then control edges, then the name's bytes */
} fused_node;

/* Updates of one optimizer whose gradients come from one data-parallel bucket (or from none). */
typedef struct group {
    const wf_op_def *op;
    int32_t step, hp; /* representatives of the step counter and the hyperparameters */
    int32_t bucket;   /* bucket_of() the members' gradients */
    wf_dtype dtype;
    int n;
    int32_t *mem; /* 'n' member ids, ascending */
} group;

/* Chunk stamps per working id of the compile's start (ids from 'n0' on are fused nodes,
 * never in the chunk being built): which chunk has it as a member, writes it (a variable or
 * state variable), or reads it as data (a gradient, the step, the hyperparameters). */
typedef struct state {
    wf__pass_ctx *c;
    int32_t n0;
    uint8_t *read; /* per id < n0: read as data by a live node, or fetched or targeted */
    int32_t *member, *writes, *reads;
    int32_t n_chunk; /* stamps used */
} state;

static int32_t rep(wf__pass_ctx *c, const wf_node *n)
{
    return wf__pass_find(c, n->id);
}

static bool stamped(const state *st, const int32_t *stamp, int32_t id, int32_t chunk)
{
    return id < st->n0 && stamp[id] == chunk;
}

/* True when update 'id' can join chunk 'chunk': it writes no variable the chunk writes or
 * reads, reads none the chunk writes, and is not ordered after a member. */
static bool admissible(const state *st, int32_t id, int32_t chunk)
{
    wf__pass_ctx *c = st->c;
    const wf_node *n = c->node[id];
    int k = n->op->n_assign;
    for (int e = 0; e < n->n_inputs; e++) {
        int32_t r = rep(c, n->inputs[e]);
        if (stamped(st, st->writes, r, chunk) || (e < k && stamped(st, st->reads, r, chunk)))
            return false;
    }
    for (int e = 0; e < n->n_control; e++)
        if (stamped(st, st->member, rep(c, n->control[e]), chunk))
            return false;
    return true;
}

static void admit(state *st, int32_t id, int32_t chunk)
{
    wf__pass_ctx *c = st->c;
    const wf_node *n = c->node[id];
    int k = n->op->n_assign;
    st->member[id] = chunk;
    for (int e = 0; e < n->n_inputs; e++) {
        int32_t r = rep(c, n->inputs[e]);
        if (r < st->n0)
            (e < k ? st->writes : st->reads)[r] = chunk;
    }
}

/* Checks that merging 'mem[0 .. m-1]' (stamped 'chunk') at order key 'key' keeps (key, id)
 * order topological (runtime/compile/passes.h). */
static bool orderable(const state *st, const int32_t *mem, int m, int32_t chunk, int32_t key)
{
    wf__pass_ctx *c = st->c;
    for (int j = 0; j < m; j++) { /* predecessors: no later than 'key' */
        const wf_node *n = c->node[mem[j]];
        for (int e = 0; e < n->n_inputs + n->n_control; e++) {
            const wf_node *p = e < n->n_inputs ? n->inputs[e] : n->control[e - n->n_inputs];
            if (c->order[rep(c, p)] > key)
                return false;
        }
    }
    for (int32_t id = 0; id < c->n; id++) { /* readers of members: later than 'key' */
        if (!c->live[id] || c->repl[id] != id || stamped(st, st->member, id, chunk) ||
            c->order[id] > key)
            continue;
        const wf_node *n = c->node[id];
        for (int e = 0; e < n->n_inputs + n->n_control; e++) {
            const wf_node *p = e < n->n_inputs ? n->inputs[e] : n->control[e - n->n_inputs];
            if (stamped(st, st->member, rep(c, p), chunk))
                return false;
        }
    }
    return true;
}

/* Makes the fused node of 'mem[0 .. m-1]' (K assigned inputs each) and replaces the members
 * by it. Returns 0 (also when the node cannot be made: nothing changes) or WF_ENOMEM. */
static int fuse(state *st, const int32_t *mem, int m)
{
    wf__pass_ctx *c = st->c;
    const wf_node *first = c->node[mem[0]], *last = c->node[mem[m - 1]];
    int k = first->op->n_assign, n_in = m * k + m + 2;
    const wf_op_def *op = wf__update_multi_def(m * k);
    const wf_node *hp = c->node[rep(c, first->inputs[k + 2])];
    if (!op || !hp->value)
        return 0;
    int n_ctl = 0;
    for (int j = 0; j < m; j++)
        n_ctl += c->node[mem[j]]->n_control;
    char name[256];
    snprintf(name, sizeof name, "%s.optim_fused%d", first->name ? first->name : "?", m);
    size_t len = strlen(name) + 1;
    fused_node *f = calloc(1, sizeof *f + (size_t)(n_in + n_ctl) * sizeof(wf_node *) + len);
    if (!f)
        return wf__err(WF_ENOMEM, "wf_session_run: no memory to fuse %d updates", m);
    wf_node *n = &f->node;
    n->name = memcpy((char *)(f->ptrs + n_in + n_ctl), name, len);
    n->op = op;
    n->graph = first->graph;
    n->n_inputs = n_in;
    n->inputs = f->ptrs;
    n->control = f->ptrs + n_in;
    n->attrs = &f->attrs;
    n->file = last->file;
    n->line = last->line;
    n->device = -1;
    n->rt_index = -1;
    n->rt_flags = WF__RW_OPTIM_FUSED;
    for (int j = 0; j < m; j++) {
        const wf_node *u = c->node[mem[j]];
        for (int a = 0; a < k; a++)
            n->inputs[j * k + a] = u->inputs[a];
        n->inputs[m * k + j] = u->inputs[k];
        for (int e = 0; e < u->n_control; e++) { /* graph nodes: exec.c maps them (index_of) */
            bool dup = false;
            for (int q = 0; !dup && q < n->n_control; q++)
                dup = n->control[q] == u->control[e];
            if (!dup)
                n->control[n->n_control++] = u->control[e];
        }
    }
    n->inputs[m * k + m] = first->inputs[k + 1];
    n->inputs[m * k + m + 1] = first->inputs[k + 2];
    char err[WF_ERRMSG_MAX];
    if (op->infer(n, err, sizeof err) < 0 || n->dtype != first->dtype) {
        free(f);
        return 0;
    }
    /* A slot of the working set through wf__pass_make(), which grows every per-id array and
     * sets the order key to the last member's; the fused node then takes the slot. */
    wf_node *slot = wf__pass_make(c, mem[m - 1], &wf_op_constant, NULL, 0, NULL, hp->value, true,
                                  WF__RW_OPTIM_FUSED);
    if (!slot) {
        free(f);
        return c->n == INT32_MAX ? 0 : wf__err(WF_ENOMEM, "wf_session_run: no memory to fuse");
    }
    n->id = slot->id;
    wf_tensor_release(slot->value);
    free(slot); /* a made node is one block (passes.c) */
    c->node[n->id] = n;
    for (int j = 0; j < m; j++) {
        int rc = wf__pass_replace(c, mem[j], n->id, WF__RW_OPTIM_FUSED);
        if (rc < 0)
            return rc;
    }
    c->n_optim_fused++;
    return 0;
}

/* Splits group 'g' into chunks of admissible members within WF__UPDATE_MULTI_MAX assigned
 * inputs and fuses each chunk of two or more. */
static int fuse_group(state *st, const group *g, int32_t *chunk_mem)
{
    wf__pass_ctx *c = st->c;
    int k = g->op->n_assign, i = 0;
    while (i < g->n) {
        int32_t chunk = ++st->n_chunk;
        int m = 0;
        for (; i < g->n && (m + 1) * k <= WF__UPDATE_MULTI_MAX; i++)
            if (admissible(st, g->mem[i], chunk)) { /* else it stays a per-variable update */
                chunk_mem[m++] = g->mem[i];
                admit(st, g->mem[i], chunk);
            }
        if (m < 2)
            continue;
        int last = 0; /* the member with the latest key goes last: the slot takes its key */
        for (int j = 1; j < m; j++)
            if (c->order[chunk_mem[j]] > c->order[chunk_mem[last]])
                last = j;
        int32_t t = chunk_mem[last], key = c->order[t];
        chunk_mem[last] = chunk_mem[m - 1];
        chunk_mem[m - 1] = t;
        if (!orderable(st, chunk_mem, m, chunk, key))
            continue;
        int rc = fuse(st, chunk_mem, m);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* The gradient bucket that gradient 'id' comes out of: the dp_reduce node that all-reduces it
 * with other ranks (placement/replicate.c), reached through the gradient's dp_grad (a bucket
 * reduced in place) or its slice and reshape (a flat bucket); -1 for a gradient of no such
 * bucket. A dp_reduce over this rank's shards alone (a pipeline's micro-batches, Mirrored's
 * devices: every shard local, attrs step[0] == end[0]) is no bucket: it has no network wait
 * for an earlier group's update to fill. */
static int32_t bucket_of(wf__pass_ctx *c, int32_t id)
{
    for (int hop = 0; hop < 3; hop++) {
        const wf_node *n = c->node[id];
        if (n->op == &wf_op_dp_reduce)
            return n->attrs->end[0] > n->attrs->step[0] ? id : -1;
        if (n->op == &wf_op_dp_grad)
            id = rep(c, n->inputs[1]);
        else if (n->op == &wf_op_reshape || n->op == &wf_op_slice)
            id = rep(c, n->inputs[0]);
        else
            return -1;
    }
    return -1;
}

static bool same_group(const group *g, const wf_node *n, int32_t step, int32_t hp, int32_t bucket)
{
    return g->op == n->op && g->step == step && g->hp == hp && g->bucket == bucket &&
           g->dtype == n->dtype;
}

int wf__pass_optim_fuse(wf__pass_ctx *c)
{
    int32_t n0 = c->n;
    state st = { .c = c, .n0 = n0 };
    int n_groups = 0, n_cand = 0, rc = 0;
    group *gs = NULL;
    st.read = calloc((size_t)n0 + 1, 1);
    st.member = calloc((size_t)n0 + 1, sizeof *st.member);
    st.writes = calloc((size_t)n0 + 1, sizeof *st.writes);
    st.reads = calloc((size_t)n0 + 1, sizeof *st.reads);
    int32_t *cand = malloc(((size_t)n0 + 1) * sizeof *cand);
    int32_t *gidx = malloc(((size_t)n0 + 1) * sizeof *gidx);
    int32_t *sorted = malloc(((size_t)n0 + 1) * sizeof *sorted);
    int32_t *chunk_mem = malloc(((size_t)n0 + 1) * sizeof *chunk_mem);
    if (!st.read || !st.member || !st.writes || !st.reads || !cand || !gidx || !sorted ||
        !chunk_mem) {
        rc = wf__err(WF_ENOMEM, "wf_session_run: no memory for optimizer fusion");
        goto done;
    }
    for (int32_t id = 0; id < n0; id++) {
        if (!c->live[id] || c->repl[id] != id)
            continue;
        const wf_node *n = c->node[id];
        for (int k = 0; k < n->n_inputs; k++)
            st.read[rep(c, n->inputs[k])] = 1;
    }
    for (int k = 0; k < c->n_key; k++)
        st.read[wf__pass_find(c, c->key[k])] = 1;
    /* The candidates, in id order, and their groups. */
    for (int32_t id = 0; id < n0; id++) {
        const wf_node *n = c->node[id];
        if (!c->live[id] || c->repl[id] != id || !wf__update_is_member(n->op) || st.read[id])
            continue;
        int k = n->op->n_assign;
        int32_t step = rep(c, n->inputs[k + 1]), hp = rep(c, n->inputs[k + 2]);
        int32_t bucket = bucket_of(c, rep(c, n->inputs[k]));
        int g = 0;
        while (g < n_groups && !same_group(&gs[g], n, step, hp, bucket))
            g++;
        if (g == n_groups) {
            group *more = realloc(gs, (size_t)(n_groups + 1) * sizeof *gs);
            if (!more) {
                rc = wf__err(WF_ENOMEM, "wf_session_run: no memory for optimizer fusion");
                goto done;
            }
            gs = more;
            gs[n_groups++] = (group){ n->op, step, hp, bucket, n->dtype, 0, NULL };
        }
        gs[g].n++;
        gidx[n_cand] = g;
        cand[n_cand++] = id;
    }
    for (int g = 0, at = 0; g < n_groups; g++) { /* each group's slice of 'sorted' */
        gs[g].mem = sorted + at;
        at += gs[g].n;
        gs[g].n = 0;
    }
    for (int i = 0; i < n_cand; i++)
        gs[gidx[i]].mem[gs[gidx[i]].n++] = cand[i];
    for (int g = 0; rc == 0 && g < n_groups; g++)
        if (gs[g].n >= 2)
            rc = fuse_group(&st, &gs[g], chunk_mem);
done:
    free(gs);
    free(st.read);
    free(st.member);
    free(st.writes);
    free(st.reads);
    free(cand);
    free(gidx);
    free(sorted);
    free(chunk_mem);
    return rc;
}
