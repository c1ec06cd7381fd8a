/* runtime/compile/plan.c: compiling one set of fetches and targets into an executable plan.
 * Owns: the compile pipeline (pruning, then the passes in the order docs/architecture.md
 *   gives, each a file of its own that the compile input's flags can switch off:
 *   runtime/compile/passes.h), the plan's order, its input CSR arrays and consumer counts,
 *   and freeing what a compile made (wf__plan_free()).
 * Direction: everything comes in through wf__compile_in (plan.h) and goes out as the plan;
 *   what the session does for a compile (a lazy variable's value, opening a device, a
 *   pipeline's orderings) are the input's hooks. The session's cache of plans, keyed by the
 *   set of fetched and targeted node ids, is the run side's (runtime/plans.c).
 * Cost: O(nodes + edges) of the needed subgraph per pass, plus a few bytes per graph node
 *   for the marks and 'index_of'. Measured on a 100,000-node chain of adds (thread CPU time
 *   of the first run, which compiles): ~17 ms with every pass off, ~50 ms with all on
 *   (CSE's hash table and the four prunes are most of the difference).
 * Not here: running a plan (exec.c), the session API (session.c), the passes (pass_*.c),
 *   placement (pass_place.c), the memory plan (memplan.c), priorities (priority.c). */
#include "passes.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void wf__plan_free(wf__plan *p)
{
    if (!p)
        return;
    wf__plan_place_free(p);
    free(p->key);
    free(p->nodes);
    free(p->kind);
    free(p->kernel);
    free(p->kdata);
    free(p->reinfer);
    free(p->var);
    free(p->in_off);
    free(p->in_idx);
    free(p->uses0);
    free(p->index_of);
    free(p->placeholders);
    free(p->host_vars);
    free(p->order);
    free(p->prio_order);
    wf__memplan_free(p->mp);
    wf__pass_free_nodes(p->made, p->n_made);
    free(p->log);
    free(p);
}

static bool has_any_dim(wf_shape s)
{
    for (int d = 0; d < s.rank; d++)
        if (s.dims[d] < 0)
            return true;
    return false;
}

/* Fills the plan's per-node arrays from the live nodes of 'c', 'ids[0 .. n-1]' in
 * topological order. Returns 0 or a negative status with wf_last_errmsg(). */
static int build(const wf__compile_in *in, wf__plan *p, wf__pass_ctx *c, const int32_t *ids, int n)
{
    char desc[WF_ERRMSG_MAX];
    int64_t edges = 0;
    int32_t *pidx = malloc((size_t)c->n * sizeof *pidx); /* plan index per working id */
    if (!pidx)
        return wf__err(WF_ENOMEM, "wf_session_run: no memory for a plan of %d nodes", n);
    for (int id = 0; id < c->n; id++)
        pidx[id] = -1;
    for (int i = 0; i < n; i++) {
        wf_node *node = c->node[ids[i]];
        pidx[ids[i]] = i;
        p->nodes[i] = node;
        edges += node->n_inputs;
    }
    for (int id = 0; id < in->n_nodes; id++)
        p->index_of[id] = pidx[wf__pass_find(c, id)];
    if (edges > INT32_MAX) {
        free(pidx);
        return wf__err(WF_ENOMEM, "wf_session_run: %lld input edges are too many",
                       (long long)edges);
    }
    if (!(p->in_idx = malloc((size_t)(edges ? edges : 1) * sizeof *p->in_idx))) {
        free(pidx);
        return wf__err(WF_ENOMEM, "wf_session_run: no memory for %lld edges", (long long)edges);
    }
    int32_t e = 0;
    int rc = 0;
    p->run_inline = true;
    for (int i = 0; i < n && rc == 0; i++) {
        wf_node *node = p->nodes[i];
        const wf_op_def *op = node->op;
        /* See 'run_inline' in plan.h; a -1 dimension or a dynamic output may be big. */
        if (has_any_dim(node->shape) || (op->flags & (WF_OP_DYNAMIC_SHAPE | WF_OP_ASYNC)) ||
            wf_shape_numel(node->shape) > WF__INLINE_NUMEL)
            p->run_inline = false;
        if (op->flags & WF_OP_TRANSFER)
            p->transfers = true;
        p->in_off[i] = e;
        p->var[i] = -1;
        if (op == &wf_op_placeholder) {
            p->kind[i] = WF__PN_PLACEHOLDER;
            p->placeholders[p->n_placeholders++] = i;
        } else if (op == &wf_op_constant) {
            p->kind[i] = WF__PN_CONSTANT;
            if (!node->value)
                rc = wf__err(WF_EINVAL, "%s: the constant has no value",
                             wf__rt_node_desc(node, desc, sizeof desc));
        } else if (op == &wf_op_variable) {
            p->kind[i] = WF__PN_VARIABLE;
            p->var[i] = in->var_of[node->id];
            rc = in->var_need(in->ctx, p->var[i]); /* a pipeline stage's, made now */
        } else if (op->flags & WF_OP_SOURCE) {
            rc = wf__err(WF_EINVAL, "%s: a source op the session cannot feed",
                         wf__rt_node_desc(node, desc, sizeof desc));
        } else {
            p->kind[i] = WF__PN_KERNEL; /* its kernel: after placement (pass_place.c) */
            bool dyn = has_any_dim(node->shape);
            for (int k = 0; k < node->n_inputs; k++)
                dyn = dyn || has_any_dim(wf__pass_input(c, node, k)->shape);
            p->reinfer[i] = dyn;
        }
        /* Inputs through the replacements: a node whose input was folded, merged or
         * simplified reads the replacement (same dtype and shape, same values). */
        for (int k = 0; k < node->n_inputs; k++) {
            int32_t j = pidx[wf__pass_find(c, node->inputs[k]->id)];
            p->in_idx[e++] = j;
            p->uses0[j]++;
        }
    }
    p->in_off[n] = e;
    free(pidx);
    return rc;
}

/* A pass of the pipeline: its function, the flag that switches it off, and where its node
 * count goes. Pruning runs first and after each pass (what a pass replaced is unneeded). */
typedef struct pass_def {
    int (*run)(wf__pass_ctx *c);
    uint32_t off_flag;
    size_t count_at; /* offsetof(wf_plan_stats, nodes_after_...) */
} pass_def;

static const pass_def passes[] = {
    { wf__pass_fold, WF_SESSION_NO_FOLD, offsetof(wf_plan_stats, nodes_after_fold) },
    { wf__pass_cse, WF_SESSION_NO_CSE, offsetof(wf_plan_stats, nodes_after_cse) },
    { wf__pass_simplify, WF_SESSION_NO_SIMPLIFY, offsetof(wf_plan_stats, nodes_after_simplify) },
    { wf__pass_epilogue, WF_SESSION_NO_EPILOGUE, offsetof(wf_plan_stats, nodes_after_epilogue) },
    /* the precision options, on only by their own flags (pass_mixed.c) */
    { wf__pass_mixed, 0, offsetof(wf_plan_stats, nodes_after_mixed) },
    { wf__pass_fuse, WF_SESSION_NO_FUSE, offsetof(wf_plan_stats, nodes_after_fuse) },
    /* last (optimizer fusion: pass_optim_fuse.c) */
    { wf__pass_optim_fuse, WF_SESSION_NO_OPTIM_FUSE,
      offsetof(wf_plan_stats, nodes_after_optim_fuse) },
};

/* Runs the pipeline on 'c'; fills 'st'. Returns 0 or a negative status. */
static int run_passes(const wf__compile_in *in, wf__pass_ctx *c, wf_plan_stats *st)
{
    st->nodes_graph = in->n_nodes;
    int live = st->nodes_after_prune = wf__pass_prune(c);
    /* Every needed node's placement is checked, also of those a pass removes (a folded
     * constant would otherwise take a wrong device with it, unseen). */
    for (int id = 0; id < c->n_orig; id++)
        if (c->live[id]) {
            int rc = wf__place_check_node(in, c->node[id]);
            if (rc < 0)
                return rc;
        }
    for (size_t k = 0; k < sizeof passes / sizeof passes[0]; k++) {
        if (!(in->flags & passes[k].off_flag)) {
            int rc = passes[k].run(c);
            if (rc < 0)
                return rc;
            live = wf__pass_prune(c);
        }
        *(int *)((char *)st + passes[k].count_at) = live;
    }
    st->n_folded = c->n_folded;
    st->n_merged = c->n_merged;
    st->n_simplified = c->n_simplified;
    st->n_fused = c->n_fused;
    st->n_fused_members = c->n_fused_members;
    st->n_optim_fused = c->n_optim_fused;
    st->n_epilogue = c->n_epilogue;
    st->n_mixed = c->n_mixed;
    st->n_tf32 = c->n_tf32;
    return 0;
}

int wf__plan_compile(const wf__compile_in *in, const int32_t *key, int n_key, wf__plan **out)
{
    *out = NULL;
    int nn = in->n_nodes;
    wf__pass_ctx c;
    int rc = wf__pass_init(&c, in, key, n_key);
    wf__plan *p = rc < 0 ? NULL : calloc(1, sizeof *p);
    if (!p) {
        wf__pass_deinit(&c);
        return wf__err(WF_ENOMEM, "wf_session_run: no memory to compile %d nodes", nn);
    }
    p->n_key = n_key;
    p->n_graph = nn;
    int32_t *ids = NULL;
    rc = run_passes(in, &c, &p->stats);
    int n = 0;
    if (rc == 0 && !(ids = malloc((size_t)c.n * sizeof *ids)))
        rc = wf__err(WF_ENOMEM, "wf_session_run: no memory to compile %d nodes", c.n);
    if (rc == 0 && (n = wf__pass_order(&c, ids)) < 0)
        rc = n;
    if (rc == 0) {
        p->n = n;
        p->key = malloc((size_t)n_key * sizeof *p->key);
        p->nodes = malloc((size_t)(n ? n : 1) * sizeof *p->nodes);
        p->kind = calloc((size_t)(n ? n : 1), 1);
        p->reinfer = calloc((size_t)(n ? n : 1), 1);
        p->var = malloc((size_t)(n ? n : 1) * sizeof *p->var);
        p->in_off = malloc((size_t)(n + 1) * sizeof *p->in_off);
        p->uses0 = calloc((size_t)(n ? n : 1), sizeof *p->uses0);
        p->index_of = malloc((size_t)(nn ? nn : 1) * sizeof *p->index_of);
        p->placeholders = malloc((size_t)(n ? n : 1) * sizeof *p->placeholders);
        if (!p->key || !p->nodes || !p->kind || !p->reinfer || !p->var || !p->in_off || !p->uses0 ||
            !p->index_of || !p->placeholders)
            rc = wf__err(WF_ENOMEM, "wf_session_run: no memory for a plan of %d nodes", n);
    }
    if (rc == 0) {
        memcpy(p->key, key, (size_t)n_key * sizeof *key);
        rc = build(in, p, &c, ids, n);
    }
    if (rc == 0) /* devices (pass_place.c): after build(), before the memory plan */
        rc = wf__plan_place(p, in);
    if (rc == 0 && in->add_order) /* a pipeline's schedule, among the nodes of this plan */
        rc = in->add_order(in->ctx, p);
    if (rc == 0) /* critical-path priority (priority.c) */
        wf__plan_priority(p, in);
    if (rc == 0 && c.n > c.n_orig) {
        wf__pass_take_nodes(&c, &p->made, &p->n_made);
        if (!p->made)
            rc = wf__err(WF_ENOMEM, "wf_session_run: no memory for the plan's nodes");
    }
    if (rc == 0) /* after the order and the edges are final (runtime/compile/memplan.c) */
        wf__memplan_compile(p, in->flags);
    if (rc == 0) { /* the log points at graph nodes and 'made': both outlive the plan's use */
        p->log = c.log;
        p->n_log = c.n_log;
        c.log = NULL;
    }
    free(ids);
    wf__pass_deinit(&c);
    if (rc < 0) {
        wf__plan_free(p);
        return rc;
    }
    *out = p;
    return 0;
}
