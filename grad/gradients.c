/* grad/gradients.c: wf_gradients(), symbolic reverse mode over the graph IR, and the
 * aggregation helpers (wf_add_n, wf_mean_n) it and the optimizers use.
 * Owns: which nodes lie between the xs and the ys, the order backward nodes are made in, the
 *   summing of fanned-out gradients, and the lookup of gradient functions.
 * How: creation order is a topological order (core/graph.h), so one pass down the node ids
 *   from the last y visits every node after all of its consumers: when a node is reached,
 *   every gradient flowing into it is known; they are summed (wf_add_n: a balanced tree in a
 *   fixed order, so the bits do not depend on scheduling) and handed to the op's gradient
 *   function, which adds the backward nodes for its inputs. Only nodes that depend on an x
 *   and that a y depends on take part, and only floating values carry gradients.
 * Invariant: the backward nodes of a forward node carry its file:line (set after its gradient
 *   function ran), so errors in them point at the user's line, not at grad/.
 * Not here: the gradient functions (grad_math.c, grad_nn.c), optimizers (optim.c). */
#include "internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { ANC = 1, FROM = 2 };

typedef struct contrib {
    wf_node *dx;
    int next; /* index in the pool, -1: end */
} contrib;

typedef struct gstate {
    wf_graph *g;
    int n;           /* nodes when the call started */
    uint8_t *mark;   /* ANC, FROM per node id */
    int *head;       /* first contribution per node id (-1: none) */
    contrib *pool;   /* contributions */
    int n_pool, cap; /* used, allocated */
} gstate;

static int push(gstate *st, int id, wf_node *dx)
{
    if (st->n_pool == st->cap) {
        int cap = st->cap ? 2 * st->cap : 64;
        contrib *p = realloc(st->pool, (size_t)cap * sizeof *p);
        if (!p)
            return wf__graph_fail(st->g, WF_ENOMEM, "wf_gradients: no memory");
        st->pool = p;
        st->cap = cap;
    }
    /* Appended at the tail would keep creation order; prepending and reversing at the sum
     * gives the same fixed order more cheaply. */
    st->pool[st->n_pool] = (contrib){ dx, st->head[id] };
    st->head[id] = st->n_pool++;
    return 0;
}

/* The sum of the contributions to node 'id' in the order they were made, or NULL if none. */
static wf_node *total(gstate *st, int id)
{
    int k = 0;
    for (int c = st->head[id]; c >= 0; c = st->pool[c].next)
        k++;
    if (k == 0)
        return NULL;
    if (k == 1)
        return st->pool[st->head[id]].dx;
    wf_node *stack[64], **xs = k <= 64 ? stack : malloc((size_t)k * sizeof *xs);
    if (!xs) {
        wf__graph_fail(st->g, WF_ENOMEM, "wf_gradients: no memory");
        return NULL;
    }
    int i = k;
    for (int c = st->head[id]; c >= 0; c = st->pool[c].next)
        xs[--i] = st->pool[c].dx;
    const wf_node *v = wf_graph_node(st->g, id);
    wf_set_source_location(v->file, v->line);
    wf_node *s = (wf_add_n)(st->g, xs, k);
    if (xs != stack)
        free(xs);
    return s;
}

/* Ones (or zeros) of x's shape, which may have -1 dimensions: a scalar spread over x. */
static wf_node *filled_like(wf_graph *g, wf_node *x, double v)
{
    wf_node *s = wf__grad_scalar(g, x, v);
    if (!s || x->shape.rank == 0)
        return s;
    wf_attrs all;
    memset(&all, 0, sizeof all); /* n_axes 0: every axis, no keepdims */
    return wf__unreduce(g, s, x, &all, false);
}

static bool shapes_fit(wf_shape a, wf_shape b)
{
    if (a.rank != b.rank)
        return false;
    for (int d = 0; d < a.rank; d++)
        if (a.dims[d] != b.dims[d] && a.dims[d] != -1 && b.dims[d] != -1)
            return false;
    return true;
}

/* Runs node n's gradient function with 'dy' and queues what it gives for n's inputs. */
static int backprop(gstate *st, wf_node *n, wf_node *dy)
{
    wf_graph *g = st->g;
    char where[256];
    uint32_t need = 0;
    bool any = false;
    for (int i = 0; i < n->n_inputs; i++) {
        const wf_node *in = n->inputs[i];
        if ((st->mark[in->id] & FROM) && wf_dtype_is_float(in->dtype)) {
            any = true;
            if (i < 32)
                need |= 1u << i;
        }
    }
    if (!any || (n->op->flags & WF_OP_SOURCE))
        return 0;
    wf_grad_fn fn = wf__grad_find(n->op);
    if (!fn) {
        if (n->op->flags & WF_OP_NO_GRAD)
            return 0;
        return wf__graph_fail(g, WF_EINVAL, "wf_gradients: op '%s' (node '%s', %s) has no gradient",
                              n->op->name, n->name, wf__node_where(n, where, sizeof where));
    }
    wf_node *stack[8] = { 0 }, **dx = stack;
    if (n->n_inputs > 8 && !(dx = calloc((size_t)n->n_inputs, sizeof *dx)))
        return wf__graph_fail(g, WF_ENOMEM, "wf_gradients: no memory");
    int first = wf_graph_node_count(g);
    int rc = fn(g, n, dy, need, dx);
    int last = wf_graph_node_count(g);
    for (int id = first; id < last; id++) { /* the backward nodes point at the forward line */
        wf_node *b = wf_graph_node(g, id);
        b->file = n->file;
        b->line = n->line;
        b->grad_of = n->id; /* and at the node (a pipeline's stage of it) */
    }
    if (rc >= 0 && wf_graph_status(g) < 0)
        rc = wf_graph_status(g);
    for (int i = 0; rc >= 0 && i < n->n_inputs; i++) {
        const wf_node *in = n->inputs[i];
        if (!dx[i] || !WF__NEED(need, i) || !(st->mark[in->id] & FROM) ||
            !wf_dtype_is_float(in->dtype))
            continue;
        if (dx[i]->dtype != in->dtype || !shapes_fit(dx[i]->shape, in->shape)) {
            char a[160], b[160];
            rc =
                wf__graph_fail(g, WF_EINVAL,
                               "wf_gradients: the gradient of op '%s' (node '%s', %s) for input "
                               "%d is %s %s but the input is %s %s",
                               n->op->name, n->name, wf__node_where(n, where, sizeof where), i,
                               wf_dtype_name(dx[i]->dtype), wf_shape_str(dx[i]->shape, a, sizeof a),
                               wf_dtype_name(in->dtype), wf_shape_str(in->shape, b, sizeof b));
            break;
        }
        rc = push(st, in->id, dx[i]);
    }
    if (dx != stack)
        free(dx);
    return rc;
}

static int check_arg(wf_graph *g, const wf_node *v, const char *what, int i)
{
    char where[256];
    if (!v)
        return wf__graph_fail(g, WF_EINVAL, "wf_gradients: %s[%d] is NULL", what, i);
    if (v->graph != g)
        return wf__graph_fail(g, WF_EINVAL, "wf_gradients: %s[%d] ('%s') belongs to another graph",
                              what, i, v->name);
    if (!wf_dtype_is_float(v->dtype))
        return wf__graph_fail(g, WF_EINVAL,
                              "wf_gradients: %s[%d] ('%s', %s) is %s: only floating values have "
                              "gradients",
                              what, i, v->name, wf__node_where(v, where, sizeof where),
                              wf_dtype_name(v->dtype));
    return 0;
}

/* Marks the gradient of each variable among xs (node.is_gradient). One that another node
 * made since 'first' (the backward) also reads (an add passing dy to a variable and to an
 * activation of its shape) is first given a node of its own, times one (exact), so that the
 * mark never covers the rest of the backward. */
static int mark_gradients(wf_graph *g, wf_node *const *xs, int n, wf_node **res, int first)
{
    int total = wf_graph_node_count(g);
    uint8_t *read = calloc((size_t)(total ? total : 1), 1);
    if (!read)
        return wf__graph_fail(g, WF_ENOMEM, "wf_gradients: no memory for %d nodes", total);
    for (int id = first; id < total; id++) {
        const wf_node *v = wf_graph_node(g, id);
        for (int k = 0; k < v->n_inputs; k++)
            read[v->inputs[k]->id] = 1;
    }
    int rc = 0;
    for (int i = 0; i < n && rc >= 0; i++) {
        if (xs[i]->op != &wf_op_variable || res[i]->id < first)
            continue; /* not a variable, or a node the caller made (a dy) */
        if (res[i]->id < total && read[res[i]->id]) {
            wf_node *own = wf_mul(g, res[i], wf__grad_scalar(g, res[i], 1.0));
            if (!own) {
                rc = wf_graph_status(g) < 0 ? wf_graph_status(g) : WF_ENOMEM;
                break;
            }
            res[i] = own;
        }
        res[i]->is_gradient = true;
    }
    free(read);
    return rc;
}

int wf_gradients_ex(wf_graph *g, wf_node *const *ys, wf_node *const *dys, int n_ys,
                    wf_node *const *xs, int n, wf_node **grads)
{
    if (!g)
        return wf__err(WF_EINVAL, "wf_gradients: graph is NULL");
    for (int i = 0; grads && i < n; i++)
        grads[i] = NULL;
    if (wf_graph_status(g) < 0)
        return wf_graph_status(g); /* a model that failed to build: keep its first error */
    if (n_ys < 1 || !ys || n < 0 || (n > 0 && (!xs || !grads)))
        return wf__graph_fail(g, WF_EINVAL, "wf_gradients: %d ys, %d xs (ys %s, xs %s, grads %s)",
                              n_ys, n, ys ? "set" : "NULL", xs ? "set" : "NULL",
                              grads ? "set" : "NULL");
    int rc = 0;
    for (int j = 0; j < n_ys && rc == 0; j++)
        rc = check_arg(g, ys[j], "ys", j);
    for (int i = 0; i < n && rc == 0; i++)
        rc = check_arg(g, xs[i], "xs", i);
    for (int j = 0; dys && j < n_ys && rc == 0; j++) {
        if (!dys[j])
            continue;
        if ((rc = check_arg(g, dys[j], "dys", j)) < 0)
            break;
        if (dys[j]->dtype != ys[j]->dtype || !shapes_fit(dys[j]->shape, ys[j]->shape)) {
            char a[160], b[160];
            rc = wf__graph_fail(
                g, WF_ESHAPE, "wf_gradients: dys[%d] is %s %s but ys[%d] is %s %s", j,
                wf_dtype_name(dys[j]->dtype), wf_shape_str(dys[j]->shape, a, sizeof a), j,
                wf_dtype_name(ys[j]->dtype), wf_shape_str(ys[j]->shape, b, sizeof b));
        }
    }
    if (rc < 0)
        return rc;

    gstate st = { .g = g, .n = wf_graph_node_count(g) };
    st.mark = calloc((size_t)st.n, 1);
    st.head = malloc((size_t)st.n * sizeof *st.head);
    wf_node **res = calloc((size_t)(n ? n : 1), sizeof *res);
    if (!st.mark || !st.head || !res) {
        rc = wf__graph_fail(g, WF_ENOMEM, "wf_gradients: no memory for %d nodes", st.n);
        goto out;
    }
    for (int id = 0; id < st.n; id++)
        st.head[id] = -1;
    /* Ancestors of the ys (down the ids), then descendants of the xs (up the ids). */
    int top = 0, bottom = st.n;
    for (int j = 0; j < n_ys; j++) {
        st.mark[ys[j]->id] |= ANC;
        top = ys[j]->id > top ? ys[j]->id : top;
    }
    for (int id = top; id >= 0; id--) {
        if (!(st.mark[id] & ANC))
            continue;
        const wf_node *v = wf_graph_node(g, id);
        for (int k = 0; k < v->n_inputs; k++)
            st.mark[v->inputs[k]->id] |= ANC;
    }
    for (int i = 0; i < n; i++) {
        st.mark[xs[i]->id] |= FROM;
        bottom = xs[i]->id < bottom ? xs[i]->id : bottom;
    }
    for (int id = bottom; id <= top; id++) {
        const wf_node *v = wf_graph_node(g, id);
        for (int k = 0; !(st.mark[id] & FROM) && k < v->n_inputs; k++)
            if (st.mark[v->inputs[k]->id] & FROM)
                st.mark[id] |= FROM;
    }
    /* Seeds: dys, or ones. */
    for (int j = 0; j < n_ys && rc == 0; j++) {
        wf_node *dy = dys && dys[j] ? dys[j] : filled_like(g, ys[j], 1.0);
        rc = dy ? push(&st, ys[j]->id, dy) : wf_graph_status(g);
    }
    for (int id = top; id >= bottom && rc >= 0; id--) {
        if ((st.mark[id] & (ANC | FROM)) != (ANC | FROM) || st.head[id] < 0)
            continue;
        wf_node *v = wf_graph_node(g, id);
        wf_node *dy = total(&st, id);
        if (!dy) {
            rc = wf_graph_status(g) < 0 ? wf_graph_status(g) : WF_ENOMEM;
            break;
        }
        for (int i = 0; i < n; i++)
            if (xs[i] == v)
                res[i] = dy;
        rc = backprop(&st, v, dy);
    }
    for (int i = 0; i < n && rc >= 0; i++) {
        if (!res[i] && !(res[i] = filled_like(g, xs[i], 0.0)))
            rc = wf_graph_status(g) < 0 ? wf_graph_status(g) : WF_ENOMEM;
    }
    if (rc >= 0)
        rc = mark_gradients(g, xs, n, res, st.n);
    if (rc >= 0)
        memcpy(grads, res, (size_t)n * sizeof *grads);
out:
    if (rc >= 0 && wf_graph_status(g) < 0)
        rc = wf_graph_status(g);
    if (rc < 0)
        for (int i = 0; grads && i < n; i++)
            grads[i] = NULL;
    free(st.mark);
    free(st.head);
    free(st.pool);
    free(res);
    return rc < 0 ? rc : 0;
}

int wf_gradients(wf_graph *g, wf_node *y, wf_node *const *xs, int n, wf_node **grads)
{
    wf__srcloc_take(); /* the nodes get the forward nodes' lines, not this call's */
    return wf_gradients_ex(g, &y, NULL, 1, xs, n, grads);
}

/* ---- Aggregation ------------------------------------------------------------------------- */

/* The sum of xs[0 .. n-1] as a balanced tree of adds, each made at 'loc'. */
static wf_node *add_tree(wf_graph *g, wf_node *const *xs, int n, wf_srcloc loc)
{
    if (n == 1)
        return xs[0];
    wf_node *a = add_tree(g, xs, n / 2, loc), *b = add_tree(g, xs + n / 2, n - n / 2, loc);
    wf_set_source_location(loc.file, loc.line);
    return (wf_add)(g, a, b);
}

wf_node *(wf_add_n)(wf_graph *g, wf_node *const *xs, int n)
{
    wf_srcloc loc = wf__srcloc_take();
    if (!g) {
        wf__err(WF_EINVAL, "wf_add_n: graph is NULL");
        return NULL;
    }
    if (n < 1 || !xs) {
        wf__graph_fail(g, WF_EINVAL, "wf_add_n: %d inputs (need at least 1)", n);
        return NULL;
    }
    for (int i = 0; i < n; i++)
        if (!xs[i]) {
            if (wf_graph_status(g) == 0)
                wf__graph_fail(g, WF_EINVAL, "wf_add_n: input %d is NULL", i);
            return NULL;
        }
    return add_tree(g, xs, n, loc);
}

wf_node *(wf_mean_n)(wf_graph *g, wf_node *const *xs, const double *weights, int n)
{
    wf_srcloc loc = wf__srcloc_take();
    if (!g) {
        wf__err(WF_EINVAL, "wf_mean_n: graph is NULL");
        return NULL;
    }
    if (n < 1 || !xs) {
        wf__graph_fail(g, WF_EINVAL, "wf_mean_n: %d inputs (need at least 1)", n);
        return NULL;
    }
    double wsum = 0;
    for (int i = 0; weights && i < n; i++) {
        if (!isfinite(weights[i])) {
            wf__graph_fail(g, WF_EINVAL, "wf_mean_n: weight %d is %g", i, weights[i]);
            return NULL;
        }
        wsum += weights[i];
    }
    if (weights && wsum == 0) {
        wf__graph_fail(g, WF_EINVAL, "wf_mean_n: the %d weights sum to 0", n);
        return NULL;
    }
    for (int i = 0; i < n; i++)
        if (!xs[i]) {
            if (wf_graph_status(g) == 0)
                wf__graph_fail(g, WF_EINVAL, "wf_mean_n: input %d is NULL", i);
            return NULL;
        }
    wf_node *stack[16], **terms = n <= 16 ? stack : malloc((size_t)n * sizeof *terms);
    if (!terms) {
        wf__graph_fail(g, WF_ENOMEM, "wf_mean_n: no memory");
        return NULL;
    }
    wf_node *r = NULL;
    int i = 0;
    for (; i < n; i++) {
        terms[i] = xs[i];
        if (weights) {
            wf_set_source_location(loc.file, loc.line);
            wf_node *w = wf__grad_scalar(g, xs[i], weights[i] / wsum);
            wf_set_source_location(loc.file, loc.line);
            if (!(terms[i] = (wf_mul)(g, xs[i], w)))
                break;
        }
    }
    if (i == n) {
        r = add_tree(g, terms, n, loc);
        if (r && !weights) {
            wf_set_source_location(loc.file, loc.line);
            wf_node *w = wf__grad_scalar(g, r, 1.0 / n);
            wf_set_source_location(loc.file, loc.line);
            r = (wf_mul)(g, r, w);
        }
    }
    if (terms != stack)
        free(terms);
    return r;
}

/* ---- Helpers for the gradient functions -------------------------------------------------- */

wf_node *wf__grad_scalar(wf_graph *g, const wf_node *like, double v)
{
    return (wf_scalar)(g, like->dtype, v);
}

/* The shapes input 'i' of 'n' was broadcast against, into 'peers' (their count returned):
 * the other inputs; matmul's other operand with its matrix axes 1 (only the batch axes
 * broadcast); broadcast_to's output. */
static int broadcast_peers(const wf_node *n, int i, wf_shape *peers)
{
    if (n->op == &wf_op_broadcast_to) {
        peers[0] = n->shape;
        return 1;
    }
    int k = 0;
    for (int j = 0; j < n->n_inputs && k < WF__UNBROADCAST_PEERS; j++) {
        if (j == i)
            continue;
        peers[k] = n->inputs[j]->shape;
        if (n->op == &wf_op_matmul)
            for (int d = peers[k].rank - 2; d < peers[k].rank; d++)
                if (d >= 0)
                    peers[k].dims[d] = 1;
        k++;
    }
    return k;
}

/* True when axis 'd' of dx (rank 'r') may or may not be summed depending on the run-time
 * shapes: x's dimension there is unknown, dx's is not known to be 1, and some peer may
 * broadcast x along it (its dimension there is not 1). */
static bool open_axis(const wf_node *x, const wf_node *dx, const wf_shape *peers, int n_peers,
                      int d)
{
    int r = dx->shape.rank, lead = r - x->shape.rank;
    if (d < lead || x->shape.dims[d - lead] != -1 || dx->shape.dims[d] == 1)
        return false;
    for (int k = 0; k < n_peers; k++) {
        int pd = d - (r - peers[k].rank);
        if (pd >= 0 && peers[k].dims[pd] != 1)
            return true;
    }
    return false;
}

wf_node *wf__grad_unbroadcast(wf_graph *g, wf_node *dx, const wf_node *n, int i)
{
    if (!dx)
        return NULL;
    const wf_node *x = n->inputs[i];
    int r = dx->shape.rank, k = x->shape.rank, lead = r - k;
    wf_shape peers[WF__UNBROADCAST_PEERS];
    int n_peers = broadcast_peers(n, i, peers);
    for (int d = lead; d < r; d++)
        if (open_axis(x, dx, peers, n_peers, d)) /* decided when the node runs */
            return wf__sum_like(g, dx, wf__grad_mut(x));
    int axes[WF_MAX_RANK], m = 0;
    for (int d = lead; d < r; d++)
        if (x->shape.dims[d - lead] == 1 && dx->shape.dims[d] != 1)
            axes[m++] = d;
    if (m > 0 && !(dx = (wf_reduce_sum)(g, dx, axes, m, true)))
        return NULL;
    if (lead > 0) {
        for (int d = 0; d < lead; d++)
            axes[d] = d;
        dx = (wf_reduce_sum)(g, dx, axes, lead, false);
    }
    return dx;
}

wf_grad_fn wf__grad_find(const wf_op_def *op)
{
    if (op->grad)
        return op->grad;
    for (int i = 0; i < wf__grad_math_len; i++)
        if (wf__grad_math[i].op == op)
            return wf__grad_math[i].fn;
    for (int i = 0; i < wf__grad_nn_len; i++)
        if (wf__grad_nn[i].op == op)
            return wf__grad_nn[i].fn;
    for (int i = 0; i < wf__grad_dist_len; i++)
        if (wf__grad_dist[i].op == op)
            return wf__grad_dist[i].fn;
    return NULL;
}
