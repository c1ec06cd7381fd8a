/* placement/ps.c: the parameter-server rewrite (placement/ps.h), synchronous.
 * Owns: which server holds which variable, and the nodes each role adds: the workers' pushes
 *   and pulls, the servers' sums and updates.
 * Roles: ranks 0 .. K-1 are servers, K .. N-1 the W = N - K workers. Worker w is replica w of
 *   a data-parallel rewrite over W replicas (wf__replicate(), one bucket per gradient, whose
 *   dp_reduce the session runs without a communicator: the weighted sum of the worker's own
 *   shards, in the fixed tree); it sends each such partial gradient to the server of its
 *   variable, each partial scalar (a loss) to every server, then receives each variable an
 *   update writes (not its optimizer slots) from its server and writes it into its own copy
 *   (ps_assign), once every push and scalar of the step is done (so after every read of the
 *   old value), and the global scalars from server 0. A server receives the W partials of
 *   each gradient it holds, adds them in the fixed tree over the workers, runs the user's
 *   updates of its variables (the optimizer state is its own) and sends each updated
 *   variable to every worker; every server sums the scalars, so a server's run can fetch the
 *   global loss too.
 * Why the sums equal MultiWorkerMirrored's bits: a worker's partial is what a rank of the same
 *   shards computes there, and the server's add tree over the W partials (split at the
 *   largest power of two below the count, left first) is the tree of dp_reduce's owner over
 *   the S shards in blocks of S / W (transport/coll_ops.h: each block is a subtree, so the
 *   splits fall between blocks at the same places); a+b is one rounding either way.
 * Assignment (the same on every rank): the updates that read gradients, largest first (the
 *   bytes of every variable they write: the variable and its optimizer slots; ties by node
 *   order), each to the server with the fewest bytes so far (ties: the lowest rank), as
 *   TensorFlow's greedy load balancer does by size. Updates that read no gradient (the step
 *   counter's increment) run on every server.
 * Edges: from o->edge_base, in node order: one per gradient push, one per scalar push, one per
 *   variable pull, one per scalar result; the same numbers on every rank.
 * Not here: the kernels (core/op_ps.c, transport/), the session's side (runtime/). */
#include "ps.h"

#include "../core/error.h"
#include "../ops/table.h"

#include <weft/ops.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct ps {
    wf_graph *g;
    const wf__ps_opts *o;
    int n;
    uint8_t *kind, *is_grad;
    int *owner;    /* per node: the server of an update (or of a gradient), -1 */
    int *edge;     /* per node: the push edge of a gradient or scalar, the pull edge of an
                      update (var), -1 */
    int *res_edge; /* per scalar node: the result edge */
    bool *scalar;  /* per node: a scalar the replicas compute */
    int hdr_edge;  /* asynchronous: the edge of the servers' reply headers */
    wf__ps_async *a;
} ps;

static int fail_node(const wf_node *n, int code, const char *what)
{
    char desc[WF_ERRMSG_MAX];
    return wf__err(code, "parameter-server rewrite: %s: %s", wf__node_desc(n, desc, sizeof desc),
                   what);
}

static int graph_rc(wf_graph *g)
{
    return wf_graph_status(g) < 0 ? wf_graph_status(g) : WF_ENOMEM;
}

static bool reads_grad(const ps *p, const wf_node *v)
{
    for (int j = 0; j < v->n_inputs; j++)
        if (p->is_grad[v->inputs[j]->id])
            return true;
    return false;
}

static int64_t update_bytes(const wf_node *u)
{
    int64_t b = 0;
    for (int k = 0; k < u->op->n_assign; k++)
        b += wf_shape_numel(u->inputs[k]->shape) * (int64_t)wf_dtype_size(u->inputs[k]->dtype);
    return b;
}

static int by_size(const void *a, const void *b)
{
    const wf_node *x = *(wf_node *const *)a, *y = *(wf_node *const *)b;
    int64_t bx = update_bytes(x), by = update_bytes(y);
    return bx != by ? (bx > by ? -1 : 1) : (x->id > y->id) - (x->id < y->id);
}

/* Owners of the updates and their gradients, and every edge. */
static int plan(ps *p)
{
    const wf__ps_opts *o = p->o;
    int n = p->n, n_upd = 0, rc = 0;
    wf_node **upd = malloc((size_t)(n ? n : 1) * sizeof *upd);
    int64_t *load = calloc((size_t)o->servers, sizeof *load);
    if (!upd || !load) {
        free(upd);
        free(load);
        return wf__err(WF_ENOMEM, "parameter-server rewrite: no memory");
    }
    for (int id = 0; id < n && rc == 0; id++) {
        wf_node *v = wf_graph_node(p->g, id);
        p->scalar[id] = p->kind[id] == WF__KIND_REPLICA && !p->is_grad[id] && v->shape.rank == 0 &&
                        v->dtype == WF_F32;
        if (p->kind[id] != WF__KIND_GLOBAL || !reads_grad(p, v))
            continue;
        if (v->op->n_assign < 1)
            rc = fail_node(v, WF_EINVAL,
                           "reads a gradient but is no update: under parameter servers only "
                           "updates read gradients");
        upd[n_upd++] = v;
    }
    qsort(upd, (size_t)n_upd, sizeof *upd, by_size);
    for (int i = 0; i < n_upd && rc == 0; i++) {
        int best = 0;
        for (int q = 1; q < o->servers; q++)
            if (load[q] < load[best])
                best = q;
        load[best] += update_bytes(upd[i]);
        p->owner[upd[i]->id] = best;
        for (int j = 0; j < upd[i]->n_inputs && rc == 0; j++) {
            const wf_node *x = upd[i]->inputs[j];
            if (!p->is_grad[x->id])
                continue;
            if (p->owner[x->id] >= 0 && p->owner[x->id] != best)
                rc = fail_node(x, WF_EINVAL,
                               "a gradient read by updates on two servers (one update per "
                               "gradient under parameter servers)");
            p->owner[x->id] = best;
        }
    }
    free(upd);
    free(load);
    for (int id = 0; id < n && rc == 0 && p->a; id++) {
        const wf_node *u = wf_graph_node(p->g, id);
        if (p->kind[id] != WF__KIND_GLOBAL || u->op->n_assign < 1)
            continue;
        for (int k = 0; k < u->op->n_assign; k++) {
            int *vo = &p->a->var_owner[u->inputs[k]->id];
            if (u->inputs[k]->op == &wf_op_variable && (*vo < 0 || p->owner[id] >= 0))
                *vo = p->owner[id] >= 0 ? p->owner[id] : 0;
        }
    }
    int e = o->edge_base;
    for (int pass = 0; pass < 4 && rc == 0; pass++)
        for (int id = 0; id < n; id++) {
            const wf_node *v = wf_graph_node(p->g, id);
            bool pull = p->kind[id] == WF__KIND_GLOBAL && p->owner[id] >= 0;
            if ((pass == 0 && p->is_grad[id]) || (pass == 1 && p->scalar[id]) ||
                (pass == 2 && pull))
                p->edge[id] = e++;
            else if (pass == 3 && p->scalar[id])
                p->res_edge[id] = e++;
            if (e >= (1 << 15))
                return fail_node(v, WF_EINVAL,
                                 "more gradients, scalars and variables than key "
                                 "edges (16384)");
        }
    if (rc == 0 && o->staleness > 0 && (p->hdr_edge = e++) >= (1 << 15))
        rc = wf__err(WF_EINVAL, "parameter-server rewrite: no key edge left for the replies' "
                                "headers (16384 edges)");
    return rc;
}

/* The fixed tree over 'v[lo .. hi)': split at lo + the largest power of two below hi - lo. */
static wf_node *tree(wf_graph *g, wf_node **v, int lo, int hi)
{
    if (hi - lo == 1)
        return v[lo];
    int m = 1;
    while (m * 2 < hi - lo)
        m *= 2;
    wf_node *a = tree(g, v, lo, lo + m), *b = a ? tree(g, v, lo + m, hi) : NULL;
    return b ? (wf_add)(g, a, b) : NULL;
}

static wf_node *join(ps *p, wf_node **v, int k)
{
    return k ? wf__node_add_ex(p->g, &wf_op_ps_join, NULL, v, k, NULL, (wf_srcloc){ 0 }) : NULL;
}

static int worker(ps *p, wf__replica_map *m)
{
    const wf__ps_opts *o = p->o;
    int n = p->n, K = o->servers, W = o->size - K;
    wf__replicate_opts ro = { .rank = o->rank - K,
                              .size = W,
                              .shards = o->shards,
                              .aggregation = o->aggregation,
                              .bucket_bytes = 1,
                              .first_bucket_bytes = 1,
                              .edge_base = o->edge_base };
    int rc = wf__replicate(p->g, &ro, m);
    if (rc < 0)
        return rc;
    /* 'after': what every pull's write waits for (every read of this step is behind a push
     * or a scalar); 'steps': the writes, then the token of the step. */
    wf_node **after = malloc((size_t)(n ? n : 1) * (size_t)(K + 1) * sizeof *after);
    wf_node **steps = malloc((size_t)(n + K + 1) * sizeof *steps);
    int n_after = 0, n_steps = 0;
    if (!after || !steps) {
        free(after);
        free(steps);
        return wf__err(WF_ENOMEM, "parameter-server rewrite: no memory");
    }
    for (int id = 0; id < n && rc == 0; id++) {
        wf_node *part = m->remap[id];
        if (p->is_grad[id]) {
            wf_node *s = part ? (wf_send)(p->g, part, p->owner[id], p->edge[id]) : NULL;
            if (!s)
                rc = graph_rc(p->g);
            after[n_after++] = s;
            m->remap[id] = NULL; /* a worker's partial gradient is not the global one */
        } else if (p->scalar[id]) {
            if (!part) {
                rc = fail_node(wf_graph_node(p->g, id), WF_EINVAL, "no key edge left");
                break;
            }
            int first = wf_graph_node_count(p->g);
            for (int q = 0; q < K && rc == 0; q++) {
                wf_node *snd = (wf_send)(p->g, part, q, p->edge[id]);
                if (!snd)
                    rc = graph_rc(p->g);
                else if (o->staleness > 0) /* pushed with the step's gradients only */
                    after[n_after++] = snd;
            }
            if (rc == 0 && o->staleness > 0) {
                /* Asynchronous: no global value exists; the worker's own rows' estimate of
                 * it (its partial times W), computed here, so an evaluation run transfers
                 * nothing. */
                wf_node *w = (wf_scalar)(p->g, WF_F32, (double)W);
                if (!(m->remap[id] = w ? (wf_mul)(p->g, part, w) : NULL))
                    rc = graph_rc(p->g);
                continue;
            }
            wf_node *r = rc == 0 ? (wf_recv)(p->g, WF_F32, part->shape, 0, p->res_edge[id]) : NULL;
            for (int q = 0; r && q < K; q++) /* the sends are nodes first .. first + K - 1 */
                if (wf__node_add_control(r, wf_graph_node(p->g, first + q)) < 0)
                    r = NULL;
            if (!r)
                rc = graph_rc(p->g);
            after[n_after++] = part;
            m->remap[id] = r;
        }
    }
    for (int id = 0; id < n && rc == 0; id++) {
        wf_node *u = wf_graph_node(p->g, id);
        if (p->kind[id] != WF__KIND_GLOBAL || p->owner[id] < 0)
            continue;
        wf_node *var = u->inputs[0];
        wf_node *r = (wf_recv)(p->g, var->dtype, var->shape, p->owner[id], p->edge[id]);
        wf_node *in[2] = { var, r };
        wf_node *a = r ? wf__node_add_ex(p->g, &wf_op_ps_assign, NULL, in, 2, NULL,
                                         (wf_srcloc){ u->file, u->line })
                       : NULL;
        for (int k = 0; a && k < n_after; k++)
            if (wf__node_add_control(a, after[k]) < 0)
                a = NULL;
        if (!a)
            rc = graph_rc(p->g);
        steps[n_steps++] = a;
    }
    /* Asynchronous: each server's reply starts with its header (its version and clocks),
     * which ps_note records for the session (wf_session_ps_stats()). */
    for (int q = 0; q < K && rc == 0 && o->staleness > 0; q++) {
        wf_node *r = (wf_recv)(p->g, WF_I64, WF_SHAPE(4), q, p->hdr_edge);
        wf_node *nt =
            r ? wf__node_add_ex(p->g, &wf_op_ps_note, NULL, &r, 1, NULL, (wf_srcloc){ 0 }) : NULL;
        if (!nt)
            rc = graph_rc(p->g);
        steps[n_steps++] = nt;
    }
    if (rc == 0 && n_steps == 0)
        rc = wf__err(WF_EINVAL, "parameter-server rewrite: no update reads a gradient: nothing "
                                "to push");
    wf_node *tok = rc == 0 ? join(p, steps, n_steps) : NULL;
    if (rc == 0 && !tok)
        rc = graph_rc(p->g);
    for (int id = 0; id < n && rc == 0; id++)
        if (p->kind[id] == WF__KIND_GLOBAL)
            m->remap[id] = tok;
    free(after);
    free(steps);
    return rc;
}

/* The copy of global node 'u' on this server, or NULL (not this server's: another's update,
 * or what reads one); 'glob' holds the copies made so far and the summed gradients. */
static wf_node *server_copy(ps *p, wf_node *u, wf_node **glob, int *rc)
{
    int me = p->o->rank;
    if (p->owner[u->id] >= 0 && p->owner[u->id] != me)
        return NULL;
    wf_node **in = malloc((size_t)(u->n_inputs ? u->n_inputs : 1) * sizeof *in);
    if (!in) {
        *rc = wf__err(WF_ENOMEM, "parameter-server rewrite: no memory");
        return NULL;
    }
    bool mine = true;
    for (int k = 0; k < u->n_inputs && mine; k++) {
        wf_node *x = u->inputs[k];
        in[k] = p->kind[x->id] == WF__KIND_SHARED ? x : glob[x->id];
        mine = in[k] != NULL;
    }
    wf_node *c = mine ? wf__node_add_ex(p->g, u->op, NULL, in, u->n_inputs, u->attrs,
                                        (wf_srcloc){ u->file, u->line })
                      : NULL;
    free(in);
    for (int k = 0; c && k < u->n_control; k++) {
        wf_node *x = u->control[k];
        wf_node *cx = p->kind[x->id] == WF__KIND_SHARED   ? x
                      : p->kind[x->id] == WF__KIND_GLOBAL ? glob[x->id]
                                                          : NULL; /* a worker's read */
        if (cx && wf__node_add_control(c, cx) < 0)
            c = NULL;
    }
    if (mine && !c)
        *rc = graph_rc(p->g);
    return c;
}

static int server(ps *p, wf__replica_map *m)
{
    const wf__ps_opts *o = p->o;
    int n = p->n, K = o->servers, W = o->size - K, me = o->rank, rc = 0;
    m->remap = calloc((size_t)(n ? n : 1), sizeof *m->remap);
    wf_node **glob = calloc((size_t)(n ? n : 1), sizeof *glob);
    wf_node **parts = malloc((size_t)W * sizeof *parts);
    wf_node **steps = malloc((size_t)(n * W + 1) * sizeof *steps);
    int n_steps = 0;
    if (!m->remap || !glob || !parts || !steps) {
        rc = wf__err(WF_ENOMEM, "parameter-server rewrite: no memory");
        goto done;
    }
    for (int id = 0; id < n && rc == 0; id++) {
        wf_node *v = wf_graph_node(p->g, id);
        if (p->kind[id] == WF__KIND_SHARED) {
            m->remap[id] = v;
            continue;
        }
        bool grad = p->is_grad[id] && p->owner[id] == me;
        if (grad || p->scalar[id]) {
            for (int w = 0; w < W && rc == 0; w++)
                if (!(parts[w] = (wf_recv)(p->g, WF_F32, v->shape, K + w, p->edge[id])))
                    rc = graph_rc(p->g);
            wf_node *sum = rc == 0 ? tree(p->g, parts, 0, W) : NULL;
            if (rc == 0 && !sum)
                rc = graph_rc(p->g);
            glob[id] = sum;
            if (rc < 0 || !p->scalar[id])
                continue;
            m->remap[id] = sum;
            if (me != 0)
                continue;
            /* server 0 returns the global scalar; the fetched value waits for the sends */
            wf_node *in[1 + 64], **vin = W < 64 ? in : malloc((size_t)(W + 1) * sizeof *vin);
            if (!vin) {
                rc = wf__err(WF_ENOMEM, "parameter-server rewrite: no memory");
                break;
            }
            vin[0] = sum;
            for (int w = 0; w < W && rc == 0; w++)
                if (!(vin[1 + w] = (wf_send)(p->g, sum, K + w, p->res_edge[id])))
                    rc = graph_rc(p->g);
            if (rc == 0 && !(m->remap[id] = join(p, vin, W + 1)))
                rc = graph_rc(p->g);
            if (vin != in)
                free(vin);
        } else if (p->kind[id] == WF__KIND_GLOBAL) {
            wf_node *c = server_copy(p, v, glob, &rc);
            glob[id] = c;
            if (!c)
                continue;
            if (p->owner[id] < 0) {
                steps[n_steps++] = c;
                continue;
            }
            for (int w = 0; w < W && rc == 0; w++)
                if (!(steps[n_steps++] = (wf_send)(p->g, c, K + w, p->edge[id])))
                    rc = graph_rc(p->g);
        }
    }
    wf_node *tok = NULL;
    if (rc == 0 && n_steps == 0)
        rc = wf__err(WF_EINVAL,
                     "parameter-server rewrite: server %d holds no variable and runs no "
                     "update (fewer updates than servers?)",
                     me);
    if (rc == 0 && !(tok = join(p, steps, n_steps)))
        rc = graph_rc(p->g);
    for (int id = 0; id < n && rc == 0; id++)
        if (p->kind[id] == WF__KIND_GLOBAL)
            m->remap[id] = tok;
done:
    free(glob);
    free(parts);
    free(steps);
    return rc;
}

void wf__ps_async_free(wf__ps_async *a)
{
    if (!a)
        return;
    free(a->var_owner);
    free(a->grad_edge);
    free(a->grad_in);
    free(a->scalar_edge);
    free(a->scalar_in);
    free(a->pull_edge);
    free(a->pull_var);
    memset(a, 0, sizeof *a);
}

/* A placeholder that stands for user node 'v' (a gradient or a scalar) on an asynchronous
 * server: the loop feeds it. */
static wf_node *stand_in(ps *p, const wf_node *v, const char *what)
{
    char name[64];
    snprintf(name, sizeof name, "ps/%s:%d", what, v->id);
    return (wf_placeholder)(p->g, name, WF_F32, v->shape);
}

/* An asynchronous server: no transfer nodes (its loop posts them, runtime/strategy_ps.c);
 * each owned gradient and each scalar is a placeholder the loop feeds, and 'tok' runs every
 * update of this server once. */
static int server_async(ps *p, wf__replica_map *m)
{
    int n = p->n, me = p->o->rank, rc = 0;
    wf__ps_async *a = p->a;
    size_t c = (size_t)(n ? n : 1);
    m->remap = calloc(c, sizeof *m->remap);
    wf_node **glob = calloc(c, sizeof *glob);
    wf_node **steps = malloc(c * sizeof *steps);
    a->grad_edge = malloc(c * sizeof *a->grad_edge);
    a->grad_in = malloc(c * sizeof *a->grad_in);
    a->scalar_edge = malloc(c * sizeof *a->scalar_edge);
    a->scalar_in = malloc(c * sizeof *a->scalar_in);
    a->pull_edge = malloc(c * sizeof *a->pull_edge);
    a->pull_var = malloc(c * sizeof *a->pull_var);
    a->hdr_edge = p->hdr_edge;
    int n_steps = 0;
    if (!m->remap || !glob || !steps || !a->grad_edge || !a->grad_in || !a->scalar_edge ||
        !a->scalar_in || !a->pull_edge || !a->pull_var) {
        rc = wf__err(WF_ENOMEM, "parameter-server rewrite: no memory");
        goto done;
    }
    for (int id = 0; id < n && rc == 0; id++) {
        wf_node *v = wf_graph_node(p->g, id);
        if (p->kind[id] == WF__KIND_SHARED) {
            m->remap[id] = v;
        } else if (p->is_grad[id] && p->owner[id] == me) {
            if (!(glob[id] = stand_in(p, v, "grad")))
                rc = graph_rc(p->g);
            a->grad_edge[a->n_grads] = p->edge[id];
            a->grad_in[a->n_grads++] = glob[id];
        } else if (p->scalar[id]) {
            if (!(glob[id] = m->remap[id] = stand_in(p, v, "scalar")))
                rc = graph_rc(p->g);
            a->scalar_edge[a->n_scalars] = p->edge[id];
            a->scalar_in[a->n_scalars++] = glob[id];
        } else if (p->kind[id] == WF__KIND_GLOBAL) {
            wf_node *cp = server_copy(p, v, glob, &rc);
            if (!(glob[id] = cp))
                continue;
            steps[n_steps++] = cp;
            if (p->owner[id] >= 0) {
                a->pull_edge[a->n_pulls] = p->edge[id];
                a->pull_var[a->n_pulls++] = v->inputs[0];
            }
        }
    }
    if (rc == 0 && a->n_pulls == 0)
        rc = wf__err(WF_EINVAL,
                     "parameter-server rewrite: server %d holds no variable (fewer updates than "
                     "servers?)",
                     me);
    if (rc == 0 && !(a->tok = join(p, steps, n_steps)))
        rc = graph_rc(p->g);
    for (int id = 0; id < n && rc == 0; id++)
        if (p->kind[id] == WF__KIND_GLOBAL)
            m->remap[id] = a->tok;
done:
    free(glob);
    free(steps);
    return rc;
}

int wf__ps_rewrite(wf_graph *g, const wf__ps_opts *o, wf__replica_map *m, wf__ps_async *a)
{
    memset(m, 0, sizeof *m);
    if (a)
        memset(a, 0, sizeof *a);
    if (o && o->staleness > 0 && !a)
        return wf__err(WF_EINVAL, "parameter-server rewrite: asynchronous without a plan");
    if (!g || !o || o->servers < 1 || o->servers >= o->size || o->rank < 0 || o->rank >= o->size ||
        o->shards < 1 || o->shards % (o->size - o->servers))
        return wf__err(WF_EINVAL, "parameter-server rewrite: bad options");
    if (wf_graph_mode(g) != WF_STATIC)
        return wf__err(WF_EINVAL, "parameter-server rewrite: the graph is eager; a strategy "
                                  "rewrites static graphs");
    int n = wf_graph_node_count(g), rc;
    ps p = { .g = g, .o = o, .n = n, .a = a };
    size_t c = (size_t)(n ? n : 1);
    p.kind = calloc(c, 1);
    p.is_grad = calloc(c, 1);
    p.scalar = calloc(c, sizeof *p.scalar);
    p.owner = malloc(c * sizeof *p.owner);
    p.edge = malloc(c * sizeof *p.edge);
    p.res_edge = malloc(c * sizeof *p.res_edge);
    wf_node *ref;
    if (a && (a->var_owner = malloc(c * sizeof *a->var_owner)))
        for (int id = 0; id < n; id++)
            a->var_owner[id] = -1;
    if (!p.kind || !p.is_grad || !p.scalar || !p.owner || !p.edge || !p.res_edge ||
        (a && !a->var_owner)) {
        rc = wf__err(WF_ENOMEM, "parameter-server rewrite: no memory for %d nodes", n);
        goto done;
    }
    for (int id = 0; id < n; id++)
        p.owner[id] = p.edge[id] = p.res_edge[id] = -1;
    if ((rc = wf__replicate_kinds(g, p.kind, p.is_grad, &ref)) < 0 || (rc = plan(&p)) < 0)
        goto done;
    rc = o->rank >= o->servers ? worker(&p, m)
         : o->staleness > 0    ? server_async(&p, m)
                               : server(&p, m);
    if (rc == 0) {
        m->n = n;
        m->n_local = o->rank < o->servers ? 0 : o->shards / (o->size - o->servers);
        m->n_buckets = 0;
        for (int id = 0; id < n; id++)
            m->n_buckets += p.is_grad[id];
    }
done:
    free(p.kind);
    free(p.is_grad);
    free(p.scalar);
    free(p.owner);
    free(p.edge);
    free(p.res_edge);
    if (rc < 0) {
        wf__replica_map_free(m);
        wf__ps_async_free(a);
    }
    return rc;
}
