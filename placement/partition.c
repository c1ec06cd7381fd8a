/* placement/partition.c: the partitioned graphs: one graph per rank with send/recv pairs.
 * Owns: wf_partition_* (weft/placement.h): copying each node into its rank's graph, one
 *   wf_send/wf_recv pair per (source output, destination rank) shared by every reader there,
 *   control edges across ranks as token messages, and the edge numbering.
 * Invariants: 'copy[id]' is node id's copy in its rank's graph; 'recv[id * R + r]' is the
 *   receive of node id's value on rank r (or NULL), 'token[id * R + r]' the receive of its
 *   token; edge numbers are given in the order of the original graph's nodes (then of their
 *   inputs, then of their control edges), so every rank that builds the partition from the
 *   same graph and assignment numbers the same pairs alike.
 * Why new graphs and not a rewrite in place: a rank runs only its part, and the original
 *   stays the user's (names, node counts, other sessions). Names are kept; the boundary nodes
 *   are named "<value>/send:<rank>", "<value>/recv", "<value>/token:<rank>" and
 *   "<value>/token_recv".
 * Not here: which rank a node goes to (stages.c, or the caller), the kernels of send and
 *   recv (transport/), device copies inside a rank. */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct wf_partition {
    const wf_graph *orig; /* identity only */
    int N, R, n_edges;
    wf_graph **graphs;
    wf_node **copy;
    wf_node **recv, **token;
    wf_node ***sends;
    int *n_sends, *cap_sends;
};

void wf_partition_destroy(wf_partition *p)
{
    if (!p)
        return;
    for (int r = 0; p->graphs && r < p->R; r++)
        wf_graph_destroy(p->graphs[r]);
    for (int r = 0; p->sends && r < p->R; r++)
        free(p->sends[r]);
    free(p->graphs);
    free(p->copy);
    free(p->recv);
    free(p->token);
    free(p->sends);
    free(p->n_sends);
    free(p->cap_sends);
    free(p);
}

/* The error of a failed add in graph 'h', returned as a code with the thread's message. */
static int copy_fail(wf_graph *h, const wf_node *n, int r)
{
    int code = wf_graph_status(h);
    return wf__err(code < 0 ? code : WF_ENOMEM, "partition: copying %s '%s' to rank %d: %s",
                   n->op->name, n->name, r, wf_graph_errmsg(h));
}

static int add_send(wf_partition *p, int r, wf_node *s)
{
    if (p->n_sends[r] == p->cap_sends[r]) {
        int cap = p->cap_sends[r] ? 2 * p->cap_sends[r] : 16;
        wf_node **a = realloc(p->sends[r], sizeof *a * (size_t)cap);
        if (!a)
            return wf__err(WF_ENOMEM, "partition: no memory");
        p->sends[r] = a;
        p->cap_sends[r] = cap;
    }
    p->sends[r][p->n_sends[r]++] = s;
    return 0;
}

/* A pair for 'u's value (token false) or its token (true) from u's rank 'ru' to rank 'r';
 * returns the receive on 'r' (made once), or NULL with the error in '*rc'. */
static wf_node *pair(wf_partition *p, const wf_node *u, int ru, int r, bool token, int *rc)
{
    wf_node **slot = &(token ? p->token : p->recv)[(size_t)u->id * p->R + r];
    if (*slot)
        return *slot;
    if (p->n_edges >= 1 << 15) {
        *rc = wf__err(WF_EINVAL, "partition: more than %d send/recv pairs (at %s '%s')", 1 << 15,
                      u->op->name, u->name);
        return NULL;
    }
    int edge = p->n_edges++;
    wf_graph *src = p->graphs[ru], *dst = p->graphs[r];
    wf_srcloc loc = { u->file, u->line };
    char name[512];
    wf_node *x = p->copy[u->id];
    if (token) {
        /* A token: a scalar ordered after 'u', so its send leaves once 'u' has run. */
        snprintf(name, sizeof name, "%s/token:%d", u->name, r);
        wf_node *t = (wf_scalar)(src, WF_F32, 0);
        if (!t || wf_node_set_name(t, name) < 0 || wf__node_add_control(t, x) < 0) {
            *rc = copy_fail(src, u, ru);
            return NULL;
        }
        x = t;
    }
    wf_attrs a = { 0 };
    a.peer = r;
    a.edge = edge;
    snprintf(name, sizeof name, "%s/send:%d%s", u->name, r, token ? "/token" : "");
    wf_node *s = wf__node_add_ex(src, &wf_op_send, name, &x, 1, &a, loc);
    if (!s) {
        *rc = copy_fail(src, u, ru);
        return NULL;
    }
    if ((*rc = add_send(p, ru, s)) < 0)
        return NULL;
    a.peer = ru;
    a.dtype = x->dtype;
    a.shape = x->shape;
    snprintf(name, sizeof name, "%s/%s", u->name, token ? "token_recv" : "recv");
    wf_node *v = wf__node_add_ex(dst, &wf_op_recv, name, NULL, 0, &a, loc);
    if (!v) {
        *rc = copy_fail(dst, u, r);
        return NULL;
    }
    *slot = v;
    return v;
}

wf_node *wf__place_copy_source(wf_graph *h, const wf_node *n, int64_t rows, bool value)
{
    wf_set_source_location(n->file, n->line);
    if (n->op == &wf_op_placeholder) {
        wf_shape sh = n->attrs->shape;
        if (rows > 0 && sh.rank > 0 && sh.dims[0] < 0)
            sh.dims[0] = rows;
        return (wf_placeholder)(h, n->name, n->attrs->dtype, sh);
    }
    if (n->op == &wf_op_variable) {
        wf_node *v = (wf_variable)(h, n->name, n->attrs->dtype, n->attrs->shape, n->attrs->init);
        if (v && value && n->value && wf_variable_set(v, n->value) < 0)
            return NULL;
        return v;
    }
    wf_node *c = (wf_constant)(h, n->value);
    if (c && wf_node_set_name(c, n->name) < 0)
        return NULL;
    return c;
}

static int rank_of(const wf_cluster *c, const int *device_of, const wf_node *n, int *dev)
{
    int d = device_of[n->id];
    if (d < 0 || d >= c->n_devices)
        return wf__err(WF_EINVAL, "partition: %s '%s': device %d is not in 0 .. %d", n->op->name,
                       n->name, d, c->n_devices - 1);
    *dev = d;
    return c->devices[d].rank;
}

int wf_partition_create(const wf_graph *g, const wf_cluster *c, const int *device_of,
                        wf_partition **out)
{
    if (!out)
        return wf__err(WF_EINVAL, "wf_partition_create: NULL out");
    *out = NULL;
    if (!g || !c || !device_of)
        return wf__err(WF_EINVAL, "wf_partition_create: NULL argument");
    if (wf_graph_mode(g) != WF_STATIC)
        return wf__err(WF_EINVAL, "wf_partition_create: the graph is eager");
    wf_partition *p = calloc(1, sizeof *p);
    if (!p)
        return wf__err(WF_ENOMEM, "partition: no memory");
    p->orig = g;
    p->N = wf_graph_node_count(g);
    p->R = wf_cluster_rank_count(c);
    size_t NR = (size_t)p->N * (size_t)p->R + 1;
    int rc = 0;
    if (!(p->graphs = calloc((size_t)p->R + 1, sizeof *p->graphs)) ||
        !(p->copy = calloc((size_t)p->N + 1, sizeof *p->copy)) ||
        !(p->recv = calloc(NR, sizeof *p->recv)) || !(p->token = calloc(NR, sizeof *p->token)) ||
        !(p->sends = calloc((size_t)p->R + 1, sizeof *p->sends)) ||
        !(p->n_sends = calloc((size_t)p->R + 1, sizeof *p->n_sends)) ||
        !(p->cap_sends = calloc((size_t)p->R + 1, sizeof *p->cap_sends))) {
        rc = wf__err(WF_ENOMEM, "partition: no memory");
        goto out;
    }
    for (int r = 0; r < p->R; r++)
        if (!(p->graphs[r] = wf_graph_create(wf_graph_runtime(g), WF_STATIC))) {
            rc = wf__err(WF_ENOMEM, "partition: graph for rank %d: %s", r, wf_last_errmsg());
            goto out;
        }
    for (int id = 0; id < p->N && rc == 0; id++) {
        const wf_node *n = wf_graph_node(g, id);
        int dev = -1, r = rank_of(c, device_of, n, &dev);
        if (r < 0) {
            rc = r;
            break;
        }
        wf_graph *h = p->graphs[r];
        wf_node *inl[8], **in = n->n_inputs <= 8 ? inl : malloc(sizeof *in * (size_t)n->n_inputs);
        if (!in) {
            rc = wf__err(WF_ENOMEM, "partition: no memory");
            break;
        }
        for (int i = 0; i < n->n_inputs && rc == 0; i++) {
            const wf_node *u = n->inputs[i];
            int du, ru = rank_of(c, device_of, u, &du);
            if (ru < 0) {
                rc = ru;
            } else if (ru == r) {
                in[i] = p->copy[u->id];
            } else if (i < n->op->n_assign) {
                rc = wf__err(WF_EINVAL,
                             "partition: %s '%s' on rank %d updates variable '%s' on "
                             "rank %d: an update must be on its variable's rank",
                             n->op->name, n->name, r, u->name, ru);
            } else {
                in[i] = pair(p, u, ru, r, false, &rc);
            }
        }
        /* Control predecessors on other ranks: their token receives exist before 'n'. */
        for (int i = 0; i < n->n_control && rc == 0; i++) {
            int du, ru = rank_of(c, device_of, n->control[i], &du);
            if (ru < 0)
                rc = ru;
            else if (ru != r)
                pair(p, n->control[i], ru, r, true, &rc);
        }
        wf_node *x = NULL;
        if (rc == 0) {
            if (n->op->flags & WF_OP_SOURCE)
                x = wf__place_copy_source(h, n, 0, true);
            else
                x = wf__node_add_ex(h, n->op, n->name, in, n->n_inputs, n->attrs,
                                    (wf_srcloc){ n->file, n->line });
            if (!x)
                rc = copy_fail(h, n, r);
        }
        if (in != inl)
            free(in);
        for (int i = 0; i < n->n_control && rc == 0; i++) {
            const wf_node *u = n->control[i];
            int du, ru = rank_of(c, device_of, u, &du);
            wf_node *before = ru == r ? p->copy[u->id] : p->token[(size_t)u->id * p->R + r];
            if (rc == 0 && wf__node_add_control(x, before) < 0)
                rc = copy_fail(h, n, r);
        }
        if (rc == 0) {
            const wf_cluster_device *d = &c->devices[dev];
            if (wf_node_set_device(x, d->kind == WF_PLACE_CUDA ? 1 + d->index : 0) < 0)
                rc = copy_fail(h, n, r);
            p->copy[id] = x;
        }
    }
out:
    if (rc < 0) {
        wf_partition_destroy(p);
        return rc;
    }
    *out = p;
    return 0;
}

int wf_partition_rank_count(const wf_partition *p)
{
    return p ? p->R : 0;
}

wf_graph *wf_partition_graph(const wf_partition *p, int rank)
{
    return p && rank >= 0 && rank < p->R ? p->graphs[rank] : NULL;
}

wf_node *wf_partition_node(const wf_partition *p, const wf_node *n)
{
    if (!p || !n || n->graph != p->orig || n->id < 0 || n->id >= p->N)
        return NULL;
    return p->copy[n->id];
}

int wf_partition_send_count(const wf_partition *p, int rank)
{
    return p && rank >= 0 && rank < p->R ? p->n_sends[rank] : 0;
}

wf_node *wf_partition_send(const wf_partition *p, int rank, int i)
{
    if (!p || rank < 0 || rank >= p->R || i < 0 || i >= p->n_sends[rank])
        return NULL;
    return p->sends[rank][i];
}

int wf_partition_edge_count(const wf_partition *p)
{
    return p ? p->n_edges : 0;
}
