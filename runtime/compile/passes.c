/* runtime/compile/passes.c: the framework of the compile passes, and pass 1, pruning.
 * Owns: the pass context's arrays (passes.h), the replacement map and its log, the
 *   plan-owned nodes the passes make, the topological order of the working set, and
 *   pruning (reverse reachability from the fetches and targets over replaced input edges
 *   and control edges).
 * Invariants: those of runtime/compile/passes.h.
 * Cost: O(nodes + edges) per prune; a pass is one sweep in order, so a compile with every
 *   pass on is a small constant times the old prune-only compile.
 * Not here: the passes themselves (pass_*.c), the plan (plan.c). */
#include "passes.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A plan-owned node and the storage it points into. */
typedef struct made_node {
    wf_node node; /* first: the node pointer is the block pointer */
    wf_attrs attrs;
    char name[];
} made_node;

static int grow(wf__pass_ctx *c, int need)
{
    if (need <= c->cap)
        return 0;
    int cap = c->cap * 2 > need ? c->cap * 2 : need;
    wf_node **node = realloc(c->node, (size_t)cap * sizeof *node);
    if (node)
        c->node = node;
    int32_t *repl = realloc(c->repl, (size_t)cap * sizeof *repl);
    if (repl)
        c->repl = repl;
    int32_t *order = realloc(c->order, (size_t)cap * sizeof *order);
    if (order)
        c->order = order;
    uint8_t *live = realloc(c->live, (size_t)cap);
    if (live)
        c->live = live;
    uint8_t *made = realloc(c->made, (size_t)cap);
    if (made)
        c->made = made;
    int32_t *stack = realloc(c->stack, (size_t)cap * sizeof *stack);
    if (stack)
        c->stack = stack;
    if (!node || !repl || !order || !live || !made || !stack)
        return wf__err(WF_ENOMEM, "wf_session_run: no memory to compile %d nodes", cap);
    c->cap = cap;
    return 0;
}

int wf__pass_init(wf__pass_ctx *c, const wf__compile_in *in, const int32_t *key, int n_key)
{
    memset(c, 0, sizeof *c);
    c->in = in;
    c->key = key;
    c->n_key = n_key;
    c->n_orig = in->n_nodes;
    int rc = grow(c, c->n_orig + 16);
    if (rc < 0)
        return rc;
    for (int id = 0; id < c->n_orig; id++) {
        c->node[id] = wf_graph_node(in->g, id);
        c->repl[id] = id;
        c->order[id] = id;
        c->live[id] = 0;
        c->made[id] = WF__RW_NONE;
    }
    c->n = c->n_orig;
    return 0;
}

static void free_made(wf_node *n)
{
    wf_tensor_release(n->value);
    free(n);
}

void wf__pass_free_nodes(wf_node **nodes, int n)
{
    for (int i = 0; i < n; i++)
        free_made(nodes[i]);
    free(nodes);
}

void wf__pass_take_nodes(wf__pass_ctx *c, wf_node ***nodes, int *n)
{
    int m = c->n - c->n_orig;
    *nodes = NULL;
    *n = 0;
    if (m == 0)
        return;
    wf_node **out = malloc((size_t)m * sizeof *out);
    if (!out) /* then the context keeps them; the caller checks '*nodes' */
        return;
    memcpy(out, c->node + c->n_orig, (size_t)m * sizeof *out);
    c->n = c->n_orig; /* no longer the context's to free */
    *nodes = out;
    *n = m;
}

void wf__pass_deinit(wf__pass_ctx *c)
{
    for (int id = c->n_orig; id < c->n; id++)
        free_made(c->node[id]);
    free(c->node);
    free(c->repl);
    free(c->order);
    free(c->live);
    free(c->made);
    free(c->stack);
    free(c->log);
    memset(c, 0, sizeof *c);
}

int32_t wf__pass_find(wf__pass_ctx *c, int32_t id)
{
    int32_t r = id;
    while (c->repl[r] != r)
        r = c->repl[r];
    while (c->repl[id] != r) { /* compress, so chains stay short over a compile */
        int32_t next = c->repl[id];
        c->repl[id] = r;
        id = next;
    }
    return r;
}

wf_node *wf__pass_input(wf__pass_ctx *c, const wf_node *n, int k)
{
    return c->node[wf__pass_find(c, n->inputs[k]->id)];
}

int wf__pass_prune(wf__pass_ctx *c)
{
    memset(c->live, 0, (size_t)c->n);
    int top = 0, count = 0;
    for (int k = 0; k < c->n_key; k++) {
        int32_t r = wf__pass_find(c, c->key[k]);
        if (!c->live[r]) {
            c->live[r] = 1;
            c->stack[top++] = r;
            count++;
        }
    }
    while (top > 0) {
        const wf_node *n = c->node[c->stack[--top]];
        for (int e = 0; e < n->n_inputs + n->n_control; e++) {
            const wf_node *m = e < n->n_inputs ? n->inputs[e] : n->control[e - n->n_inputs];
            int32_t r = wf__pass_find(c, m->id);
            if (!c->live[r]) {
                c->live[r] = 1;
                c->stack[top++] = r;
                count++;
            }
        }
    }
    c->n_live = count;
    return count;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

int wf__pass_order(wf__pass_ctx *c, int32_t *out)
{
    int m = 0;
    bool sorted = true;
    for (int id = 0; id < c->n; id++)
        if (c->live[id]) {
            if (m > 0 && c->order[id] < c->order[out[m - 1]])
                sorted = false;
            out[m++] = id;
        }
    if (sorted)
        return m;
    /* Only when new nodes are live (they take earlier order keys): sort by (order key, id),
     * packed into one integer (both are non-negative int32). */
    int64_t *keys = malloc((size_t)m * sizeof *keys);
    if (!keys)
        return wf__err(WF_ENOMEM, "wf_session_run: no memory to order %d nodes", m);
    for (int i = 0; i < m; i++)
        keys[i] = (int64_t)c->order[out[i]] << 32 | out[i];
    qsort(keys, (size_t)m, sizeof *keys, cmp_i64);
    for (int i = 0; i < m; i++)
        out[i] = (int32_t)(keys[i] & 0xffffffff);
    free(keys);
    return m;
}

int wf__pass_replace(wf__pass_ctx *c, int32_t id, int32_t by, int kind)
{
    if (c->n_log == c->cap_log) {
        int cap = c->cap_log ? 2 * c->cap_log : 64;
        wf__rewrite *log = realloc(c->log, (size_t)cap * sizeof *log);
        if (!log)
            return wf__err(WF_ENOMEM, "wf_session_run: no memory for the rewrite log");
        c->log = log;
        c->cap_log = cap;
    }
    c->log[c->n_log++] = (wf__rewrite){ c->node[id], c->node[by], (uint8_t)kind };
    c->repl[id] = by;
    c->live[by] = c->live[by] || c->live[id];
    return 0;
}

bool wf__pass_replaceable(const wf_node *n)
{
    const wf_op_def *op = n->op;
    return n->n_control == 0 && !(op->flags & (WF_OP_STATEFUL | WF_OP_SOURCE)) && op->n_assign == 0;
}

bool wf__pass_static(wf_shape s)
{
    for (int d = 0; d < s.rank; d++)
        if (s.dims[d] < 0)
            return false;
    return true;
}

wf_node *wf__pass_make(wf__pass_ctx *c, int32_t for_id, const wf_op_def *op, wf_node *const *inputs,
                       int n_inputs, const wf_attrs *attrs, wf_tensor *value, bool any_type,
                       int kind)
{
    const wf_node *like = c->node[for_id];
    if (n_inputs > WF_NODE_INLINE_INPUTS || c->n == INT32_MAX || grow(c, c->n + 1) < 0)
        return NULL;
    char name[256];
    snprintf(name, sizeof name, "%s.%s%d", like->name ? like->name : "?",
             kind == WF__RW_FOLDED ? "folded" : "simplified", c->n - c->n_orig);
    size_t len = strlen(name) + 1;
    made_node *m = calloc(1, sizeof *m + len);
    if (!m)
        return NULL;
    memcpy(m->name, name, len);
    wf_node *n = &m->node;
    if (attrs) {
        m->attrs = *attrs;
    } else if (value) { /* a constant's bag holds its type (core/op.h) */
        m->attrs.dtype = value->dtype;
        m->attrs.shape = value->shape;
    }
    n->op = op;
    n->graph = like->graph;
    n->name = m->name;
    n->id = c->n;
    n->n_inputs = n_inputs;
    n->inputs = n->inline_inputs;
    for (int k = 0; k < n_inputs; k++)
        n->inputs[k] = inputs[k];
    n->attrs = &m->attrs;
    n->file = like->file;
    n->line = like->line;
    n->device = -1;
    n->rt_index = -1;
    n->rt_flags = (uint32_t)kind; /* which pass made it, for the dump */
    if (value) {
        n->dtype = value->dtype;
        n->shape = value->shape;
    } else {
        char err[WF_ERRMSG_MAX];
        if (op->infer(n, err, sizeof err) < 0) {
            free(m);
            return NULL;
        }
    }
    if (!any_type && (n->dtype != like->dtype || !wf_shape_equal(n->shape, like->shape))) {
        free(m);
        return NULL;
    }
    n->value = value ? wf_tensor_retain(value) : NULL;
    int32_t id = c->n++;
    c->node[id] = n;
    c->repl[id] = id;
    c->order[id] = c->order[for_id];
    c->live[id] = 0;
    c->made[id] = (uint8_t)kind;
    return n;
}
