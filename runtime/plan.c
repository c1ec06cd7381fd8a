/* runtime/plan.c: compiling one set of fetches and targets into an executable plan.
 * Owns: pruning (reverse reachability from the fetches and targets over input and control
 *   edges), the plan's order, its input CSR arrays and consumer counts, and the session's
 *   cache of plans keyed by the set of fetched and targeted node ids.
 * Why a cache keyed by the set: TensorFlow's DirectSession does the same (one executor per
 *   feed/fetch/target signature): the first run of a set compiles, every later run replays
 *   the plan and its pre-built task graphs (LESSONS.md, "replay pre-built graphs"). Feeds are
 *   not part of the key because only placeholders can be fed, and they prune nothing.
 * Cost: O(nodes + edges) of the needed subgraph, plus a byte and an int per graph node
 *   for the marks and 'index_of'; a 100,000-node chain compiles in a few milliseconds.
 * Not here: running a plan (exec.c), the session API (session.c), the passes DESIGN.md lists
 *   between pruning and the plan (folding, CSE, fusion, placement, memory planning: later,
 *   each a file of its own). */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *wf__rt_node_desc(const wf_node *n, char *buf, size_t size)
{
    char where[256];
    snprintf(buf, size, "%s '%s' (%s)", n->op ? n->op->name : "?", n->name ? n->name : "?",
             wf__node_where(n, where, sizeof where));
    return buf;
}

void wf__plan_destroy(wf__plan *p)
{
    if (!p)
        return;
    for (int i = 0; p->all_slots && i < p->max_slots; i++)
        wf__slot_destroy(p->all_slots[i]);
    free(p->all_slots);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->key);
    free(p->nodes);
    free(p->kind);
    free(p->reinfer);
    free(p->var);
    free(p->in_off);
    free(p->in_idx);
    free(p->uses0);
    free(p->index_of);
    free(p->placeholders);
    free(p);
}

static bool has_any_dim(wf_shape s)
{
    for (int d = 0; d < s.rank; d++)
        if (s.dims[d] < 0)
            return true;
    return false;
}

/* Marks every node 'key' needs; returns how many. 'stack' has room for n_nodes ids. */
static int prune(wf_session *s, const int32_t *key, int n_key, uint8_t *needed, int32_t *stack)
{
    int top = 0, count = 0;
    for (int k = 0; k < n_key; k++) {
        needed[key[k]] = 1;
        stack[top++] = key[k];
        count++;
    }
    while (top > 0) {
        const wf_node *n = wf_graph_node(s->g, stack[--top]);
        for (int e = 0; e < n->n_inputs + n->n_control; e++) {
            const wf_node *m = e < n->n_inputs ? n->inputs[e] : n->control[e - n->n_inputs];
            if (!needed[m->id]) {
                needed[m->id] = 1;
                stack[top++] = m->id;
                count++;
            }
        }
    }
    return count;
}

/* Fills the plan's per-node arrays. Returns 0 or a negative status with wf_last_errmsg(). */
static int build(wf_session *s, wf__plan *p, const uint8_t *needed)
{
    char desc[WF_ERRMSG_MAX];
    int n = 0;
    int64_t edges = 0;
    for (int id = 0; id < s->n_nodes; id++) {
        p->index_of[id] = -1;
        if (!needed[id])
            continue;
        wf_node *node = wf_graph_node(s->g, id);
        p->index_of[id] = n;
        p->nodes[n++] = node;
        edges += node->n_inputs;
    }
    if (edges > INT32_MAX)
        return wf__err(WF_ENOMEM, "wf_session_run: %lld input edges are too many",
                       (long long)edges);
    if (!(p->in_idx = malloc((size_t)(edges ? edges : 1) * sizeof *p->in_idx)))
        return wf__err(WF_ENOMEM, "wf_session_run: no memory for %lld edges", (long long)edges);
    int32_t e = 0;
    p->run_inline = true;
    for (int i = 0; i < n; i++) {
        wf_node *node = p->nodes[i];
        const wf_op_def *op = node->op;
        /* See 'run_inline' in internal.h; a -1 dimension or a dynamic output may be big. */
        if (has_any_dim(node->shape) || (op->flags & WF_OP_DYNAMIC_SHAPE) ||
            wf_shape_numel(node->shape) > WF__INLINE_NUMEL)
            p->run_inline = false;
        p->in_off[i] = e;
        p->var[i] = -1;
        if (op == &wf_op_placeholder) {
            p->kind[i] = WF__PN_PLACEHOLDER;
            p->placeholders[p->n_placeholders++] = i;
        } else if (op == &wf_op_constant) {
            p->kind[i] = WF__PN_CONSTANT;
            if (!node->value)
                return wf__err(WF_EINVAL, "%s: the constant has no value",
                               wf__rt_node_desc(node, desc, sizeof desc));
        } else if (op == &wf_op_variable) {
            p->kind[i] = WF__PN_VARIABLE;
            p->var[i] = s->var_of[node->id];
        } else if (op->flags & WF_OP_SOURCE) {
            return wf__err(WF_EINVAL, "%s: a source op the session cannot feed",
                           wf__rt_node_desc(node, desc, sizeof desc));
        } else {
            p->kind[i] = WF__PN_KERNEL;
            if (!op->kernel[WF_KERNEL_CPU])
                return wf__err(WF_EINVAL, "%s: op '%s' has no CPU kernel",
                               wf__rt_node_desc(node, desc, sizeof desc), op->name);
            bool dyn = has_any_dim(node->shape);
            for (int k = 0; k < node->n_inputs; k++)
                dyn = dyn || has_any_dim(node->inputs[k]->shape);
            p->reinfer[i] = dyn;
        }
        for (int k = 0; k < node->n_inputs; k++) {
            int32_t j = p->index_of[node->inputs[k]->id];
            p->in_idx[e++] = j;
            p->uses0[j]++;
        }
    }
    p->in_off[n] = e;
    return 0;
}

static int compile(wf_session *s, const int32_t *key, int n_key, wf__plan **out)
{
    *out = NULL;
    int nn = s->n_nodes;
    wf__plan *p = calloc(1, sizeof *p);
    uint8_t *needed = calloc((size_t)nn, 1);
    int32_t *stack = malloc((size_t)nn * sizeof *stack);
    if (!p || !needed || !stack) {
        free(p);
        free(needed);
        free(stack);
        return wf__err(WF_ENOMEM, "wf_session_run: no memory to compile %d nodes", nn);
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->sess = s;
    int n = prune(s, key, n_key, needed, stack);
    free(stack);
    p->n = n;
    p->n_key = n_key;
    p->max_slots = s->max_slots;
    p->key = malloc((size_t)n_key * sizeof *p->key);
    p->nodes = malloc((size_t)n * sizeof *p->nodes);
    p->kind = calloc((size_t)n, 1);
    p->reinfer = calloc((size_t)n, 1);
    p->var = malloc((size_t)n * sizeof *p->var);
    p->in_off = malloc((size_t)(n + 1) * sizeof *p->in_off);
    p->uses0 = calloc((size_t)n, sizeof *p->uses0);
    p->index_of = malloc((size_t)nn * sizeof *p->index_of);
    p->placeholders = malloc((size_t)n * sizeof *p->placeholders);
    p->all_slots = calloc((size_t)p->max_slots, sizeof *p->all_slots);
    int rc = 0;
    if (!p->key || !p->nodes || !p->kind || !p->reinfer || !p->var || !p->in_off || !p->uses0 ||
        !p->index_of || !p->placeholders || !p->all_slots)
        rc = wf__err(WF_ENOMEM, "wf_session_run: no memory for a plan of %d nodes", n);
    if (rc == 0) {
        memcpy(p->key, key, (size_t)n_key * sizeof *key);
        rc = build(s, p, needed);
    }
    free(needed);
    if (rc < 0) {
        wf__plan_destroy(p);
        return rc;
    }
    *out = p;
    return 0;
}

int wf__plan_get(wf_session *s, const int32_t *key, int n_key, wf__plan **out)
{
    pthread_mutex_lock(&s->plans_mu);
    for (wf__plan *p = s->plans; p; p = p->next)
        if (p->n_key == n_key && memcmp(p->key, key, (size_t)n_key * sizeof *key) == 0) {
            pthread_mutex_unlock(&s->plans_mu);
            *out = p;
            return 0;
        }
    /* Compiled under the lock, so a set is never compiled twice; other runs wait for it
     * only at their first step (this lookup), and compiling is O(needed nodes). */
    int rc = compile(s, key, n_key, out);
    if (rc == 0) {
        (*out)->next = s->plans;
        s->plans = *out;
    }
    pthread_mutex_unlock(&s->plans_mu);
    return rc;
}
