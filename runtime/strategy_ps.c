/* runtime/strategy_ps.c: the parameter-server strategy (wf_strategy_ps(), weft/distribute.h).
 * Owns: its options' checks, the role of a rank (wf_strategy_is_server()), the call of the
 *   rewrite (placement/ps.h) for the session (runtime/strategy.c calls wf__ps_prepare()), the
 *   asynchronous mode's server loop and statistics (wf_session_ps_stats(), below), and the
 *   gather of the servers' state (wf_session_ps_sync()).
 * How a synchronous step runs: every rank's wf_session_run() is one step. A worker's run computes
 * its shards' gradients, pushes them and pulls the updated variables before it returns; a server's
 * run receives one step of every worker's gradients, applies its updates and sends the variables
 * back, so a server needs no batch (feeds it gets are ignored) but makes the same runs, with the
 * same fetches and targets, as the workers. The rest (the agreement of the ranks, the broadcast of
 * the variables, failing the communicator when a run fails by itself) is MultiWorkerMirrored's
 * (runtime/strategy.c). Not here: the rewrite (placement/ps.c), the transfers (transport/). */
#include "../core/op.h"
#include "../core/tensor.h"
#include "../placement/ps.h"
#include "../transport/post.h"
#include "internal.h"

#include <weft/distribute.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int wf_strategy_ps(wf_comm *comm, const wf_ps_opts *opts, wf_strategy **out)
{
    if (!out)
        return wf__err(WF_EINVAL, "wf_strategy_ps: out is NULL");
    *out = NULL;
    if (!opts)
        return wf__err(WF_EINVAL, "wf_strategy_ps: opts is NULL (servers is required)");
    if (!comm)
        return wf__err(WF_EINVAL, "wf_strategy_ps: comm is NULL: parameter servers need at "
                                  "least one server and one worker rank");
    int size = wf_comm_size(comm), rank = wf_comm_rank(comm);
    if (size < 1 || rank < 0)
        return wf__err(WF_EINVAL, "wf_strategy_ps: the communicator is not valid");
    wf_ps_opts p = *opts;
    if (p.servers < 1 || p.servers >= size)
        return wf__err(WF_EINVAL,
                       "wf_strategy_ps: %d servers in a world of %d ranks: the servers are "
                       "ranks 0 .. K-1 and at least one rank must be a worker (1 <= K <= %d)",
                       p.servers, size, size - 1);
    if (p.staleness < 0)
        return wf__err(WF_EINVAL, "wf_strategy_ps: staleness %d is negative (0: synchronous)",
                       p.staleness);
    int workers = size - p.servers, rc;
    char deflt[48];
    snprintf(deflt, sizeof deflt, "the %d workers", workers);
    if ((rc = wf__strategy_check("wf_strategy_ps",
                                 &(wf__strategy_replicas){ deflt, "workers", "worker" }, workers,
                                 &p.shards, p.aggregation)) < 0)
        return rc;
    wf_strategy_opts o = { .shards = p.shards, .aggregation = p.aggregation };
    return wf__strategy_new(comm, &o, p.servers, p.staleness, out);
}

int wf_strategy_is_server(const wf_strategy *st)
{
    if (!st)
        return wf__err(WF_EINVAL, "wf_strategy_is_server: strategy is NULL");
    return wf_strategy_rank(st) < wf__strategy_servers(st) ? 1 : 0;
}

/* ---- Asynchronous mode (staleness s > 0) --------------------------------------------------
 * Versions and clocks: a server's version is its count of applied updates (one per worker
 *   push, every worker's together); worker w's clock is its count of pushes the server has
 *   applied (a worker's runs so far, once its reply came), and the least clock over the
 *   workers is the min clock m. The bound (SSP): a worker computes its step c (its run
 *   c + 1, on the copy the reply of its step c - 1 brought) only on a copy that holds every
 *   update of every worker's steps below c - s, i.e. c - m <= s with m the min clock when the
 *   reply was sent. The server keeps it by holding a reply back (the fast worker waits, its
 *   run pending on the reply's receive) until m >= c - s; the least-clocked worker is never
 *   held, so the workers never all wait.
 * The server's loop (its wf_session_run()): receives pushes from every worker (receives
 *   posted in the wire form of the workers' send nodes, transport/post.h), applies each as it
 *   arrives (the earliest completed first: one run of the server's updates, fed with that
 *   worker's partial gradients times W, or times 1 under WF_AGG_SUM: the worker's own
 *   gradient when W divides the batch), then sends each reply the bound allows: a snapshot
 *   of the server's variables, the header [version, min clock, the worker's clock, the
 *   staleness of the push just applied (the updates applied since the worker's copy)]. A run
 *   returns once it has applied W pushes (so every rank still makes the same number of
 *   runs) and its sends have finished; its fetched scalars are the mean over those pushes.
 *   No worker thread of the runtime waits: the loop runs on the caller's thread, and the
 *   transfers complete on the network's actor. */

typedef struct srv_worker {
    int64_t clock;     /* pushes applied */
    int64_t base;      /* the version its copy has (the last reply's) */
    int posted;        /* receives of push 'clock' posted (0: none) */
    int pending;       /* of them, not finished */
    uint64_t arrival;  /* when the last one finished (the loop's order), 0: not all */
    bool reply_due;    /* applied, reply not yet sent */
    int64_t staleness; /* of its last applied push */
    wf_tensor **in;    /* n_grads then n_scalars receive buffers */
} srv_worker;

struct wf__ps_run {
    int rank, size, K, W, s, agg;
    int n_user; /* the user's nodes (a.var_owner's entries) */
    wf_comm *comm;
    wf__ps_async a;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs; /* the session's, and one per posted transfer */
    int rc;   /* the first failed transfer's */
    char why[WF_ERRMSG_MAX];
    uint64_t arrivals; /* completed pushes so far */
    int sending;       /* replies' sends in flight */
    srv_worker *w;
    int64_t version;
    double *scal; /* server: the scalars' sums over the last training run's pushes */
    bool trained; /* a training run has finished */
    wf_ps_stats st;
    int64_t hdr[WF_COMM_MAX_RANKS][4]; /* worker: the last header of each server */
};

/* A posted transfer's context: the state (kept alive by its reference) and the worker. */
typedef struct ps_xfer {
    struct wf__ps_run *ps;
    int worker; /* -1: a send */
} ps_xfer;

static void ps_unref(struct wf__ps_run *ps)
{
    pthread_mutex_lock(&ps->mu);
    int left = --ps->refs;
    pthread_mutex_unlock(&ps->mu);
    if (left)
        return;
    for (int w = 0; ps->w && w < ps->W; w++) {
        for (int i = 0; ps->w[w].in && i < ps->a.n_grads + ps->a.n_scalars; i++)
            wf_tensor_release(ps->w[w].in[i]);
        free(ps->w[w].in);
    }
    free(ps->w);
    free(ps->scal);
    wf__ps_async_free(&ps->a);
    pthread_mutex_destroy(&ps->mu);
    pthread_cond_destroy(&ps->cv);
    free(ps);
}

static void xfer_done(void *arg, int rc)
{
    ps_xfer *x = arg;
    struct wf__ps_run *ps = x->ps;
    pthread_mutex_lock(&ps->mu);
    if (rc < 0 && ps->rc == 0) {
        ps->rc = rc;
        snprintf(ps->why, sizeof ps->why, "%s", wf_last_errmsg());
    }
    if (x->worker < 0)
        ps->sending--;
    else if (--ps->w[x->worker].pending == 0)
        ps->w[x->worker].arrival = ++ps->arrivals;
    pthread_cond_broadcast(&ps->cv);
    pthread_mutex_unlock(&ps->mu);
    free(x);
    ps_unref(ps);
}

/* Posts one transfer of 't' with 'ps' (a receive for worker 'worker', or a send: -1). */
static int post(struct wf__ps_run *ps, bool recv, int peer, int edge, uint64_t step, wf_tensor *t,
                int worker)
{
    ps_xfer *x = malloc(sizeof *x);
    if (!x)
        return wf__err(WF_ENOMEM, "parameter server: no memory for a transfer");
    *x = (ps_xfer){ ps, worker };
    pthread_mutex_lock(&ps->mu); /* a receive's 'pending' was counted by post_push() */
    ps->refs++;
    if (worker < 0)
        ps->sending++;
    pthread_mutex_unlock(&ps->mu);
    int rc = wf__p2p_post(ps->comm, recv, peer, edge, step, t, recv ? "ps push" : "ps reply",
                          xfer_done, x);
    if (rc < 0) { /* 'done' never runs */
        pthread_mutex_lock(&ps->mu);
        ps->refs--;
        if (worker >= 0)
            ps->w[worker].pending--;
        else
            ps->sending--;
        pthread_mutex_unlock(&ps->mu);
        free(x);
    }
    return rc;
}

/* Posts the receives of worker w's next push. */
static int post_push(struct wf__ps_run *ps, int w)
{
    srv_worker *sw = &ps->w[w];
    const wf__ps_async *a = &ps->a;
    int n = a->n_grads + a->n_scalars, rc = 0;
    pthread_mutex_lock(&ps->mu); /* all counted first: 'arrival' is set when the last ends */
    sw->arrival = 0;
    sw->posted = n;
    sw->pending = n;
    pthread_mutex_unlock(&ps->mu);
    for (int i = 0; i < n && rc == 0; i++) {
        const wf_node *ph = i < a->n_grads ? a->grad_in[i] : a->scalar_in[i - a->n_grads];
        int edge = i < a->n_grads ? a->grad_edge[i] : a->scalar_edge[i - a->n_grads];
        wf_tensor_release(sw->in[i]);
        if (!(sw->in[i] = wf__tensor_alloc(WF_F32, ph->shape)))
            rc = wf__err(WF_ENOMEM, "parameter server: no memory for a push");
        else
            rc = post(ps, true, ps->K + w, edge, (uint64_t)sw->clock, sw->in[i], w);
    }
    if (rc < 0) { /* never to be applied: the run fails */
        pthread_mutex_lock(&ps->mu);
        sw->pending = n + 1; /* never reaches 0 */
        pthread_mutex_unlock(&ps->mu);
    }
    return rc;
}

static int64_t min_clock(const struct wf__ps_run *ps)
{
    int64_t m = ps->w[0].clock;
    for (int w = 1; w < ps->W; w++)
        if (ps->w[w].clock < m)
            m = ps->w[w].clock;
    return m;
}

/* Sends worker w's reply: the variables now, the header, server 0's scalars. */
static int send_reply(wf_session *s, struct wf__ps_run *ps, int w)
{
    srv_worker *sw = &ps->w[w];
    const wf__ps_async *a = &ps->a;
    int peer = ps->K + w, rc = 0;
    uint64_t step = (uint64_t)(sw->clock - 1);
    for (int i = 0; i < a->n_pulls && rc == 0; i++) {
        wf_tensor *v = NULL, *snap = NULL;
        rc = wf_session_variable(s, a->pull_var[i], &v);
        if (rc == 0 && !(snap = wf__tensor_alloc(v->dtype, v->shape)))
            rc = wf__err(WF_ENOMEM, "parameter server: no memory for a reply");
        if (rc == 0)
            rc = wf_tensor_read(v, v->dtype, (void *)snap->data,
                                (size_t)snap->numel * wf_dtype_size(snap->dtype));
        if (rc == 0)
            rc = post(ps, false, peer, a->pull_edge[i], step, snap, -1);
        wf_tensor_release(snap);
        wf_tensor_release(v);
    }
    int64_t h[4] = { ps->version, min_clock(ps), sw->clock, sw->staleness };
    wf_tensor *ht = rc == 0 ? wf_tensor_from(WF_I64, WF_SHAPE(4), h) : NULL;
    if (rc == 0 && !ht)
        rc = WF_ENOMEM;
    if (rc == 0)
        rc = post(ps, false, peer, a->hdr_edge, step, ht, -1);
    wf_tensor_release(ht);
    pthread_mutex_lock(&ps->mu); /* 'st' may be read meanwhile (wf_session_ps_stats()) */
    if (sw->clock - min_clock(ps) > ps->st.max_lag)
        ps->st.max_lag = sw->clock - min_clock(ps);
    pthread_mutex_unlock(&ps->mu);
    sw->reply_due = false;
    sw->base = ps->version;
    return rc;
}

/* Waits (the caller holds ps->mu) for 'ready' or a failure, polling the comm's health. */
static int wait_for(struct wf__ps_run *ps, bool (*ready)(const struct wf__ps_run *, int *),
                    int *which)
{
    for (;;) {
        if (ps->rc < 0)
            return wf__err(ps->rc, "%s", ps->why);
        if (ready(ps, which))
            return 0;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 50 * 1000000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&ps->cv, &ps->mu, &ts);
        int st = wf_comm_status(ps->comm);
        if (st < 0 && ps->rc == 0) {
            ps->rc = st;
            snprintf(ps->why, sizeof ps->why, "%s", wf_last_errmsg());
        }
    }
}

/* The worker whose push finished first, into '*which'. */
static bool push_ready(const struct wf__ps_run *ps, int *which)
{
    uint64_t best = 0;
    for (int w = 0; w < ps->W; w++) {
        const srv_worker *sw = &ps->w[w];
        if (sw->posted && sw->arrival && (!best || sw->arrival < best)) {
            best = sw->arrival;
            *which = w;
        }
    }
    return best != 0;
}

static bool sends_done(const struct wf__ps_run *ps, int *which)
{
    (void)which;
    return ps->sending == 0;
}

/* Applies worker w's push: its gradients scaled into the worker's own, one run of 'tok';
 * its scalars (times W: the worker's estimate of the global value) added to 'ps->scal'. */
static int apply(wf_session *s, struct wf__ps_run *ps, int w)
{
    srv_worker *sw = &ps->w[w];
    const wf__ps_async *a = &ps->a;
    int n = a->n_grads + a->n_scalars;
    for (int i = 0; i < n; i++) {
        float f = ps->agg == WF_AGG_SUM && i < a->n_grads ? 1.0f : (float)ps->W;
        float *d = (float *)sw->in[i]->data;
        for (int64_t k = 0; k < sw->in[i]->numel; k++)
            d[k] *= f;
    }
    for (int j = 0; j < a->n_scalars; j++)
        ps->scal[j] += ((const float *)sw->in[a->n_grads + j]->data)[0];
    wf_feed stack[16],
        *feeds = a->n_grads <= 16 ? stack : malloc((size_t)a->n_grads * sizeof *feeds);
    if (!feeds)
        return wf__err(WF_ENOMEM, "parameter server: no memory");
    for (int i = 0; i < a->n_grads; i++)
        feeds[i] = (wf_feed){ a->grad_in[i], sw->in[i] };
    int rc = wf__session_run_plain(s, feeds, a->n_grads, NULL, 0, NULL, &ps->a.tok, 1);
    if (feeds != stack)
        free(feeds);
    if (rc < 0)
        return rc;
    sw->staleness = ps->version - sw->base;
    pthread_mutex_lock(&ps->mu);
    if (sw->staleness > ps->st.max_staleness)
        ps->st.max_staleness = sw->staleness;
    pthread_mutex_unlock(&ps->mu);
    ps->version++;
    sw->clock++;
    sw->posted = 0;
    sw->reply_due = true;
    return 0;
}

/* One training run of the server: W pushes applied, the replies the bound allows sent. */
static int serve_pushes(wf_session *s, struct wf__ps_run *ps)
{
    int rc = 0;
    memset(ps->scal, 0, sizeof *ps->scal * (size_t)ps->a.n_scalars);
    for (int done = 0; done < ps->W && rc == 0;) {
        for (int w = 0; w < ps->W && rc == 0; w++)
            if (!ps->w[w].posted && !ps->w[w].reply_due)
                rc = post_push(ps, w);
        int w = -1;
        if (rc == 0) {
            pthread_mutex_lock(&ps->mu);
            rc = wait_for(ps, push_ready, &w);
            pthread_mutex_unlock(&ps->mu);
        }
        if (rc == 0 && (rc = apply(s, ps, w)) == 0)
            done++;
        /* Every reply the bound allows. */
        int64_t m = rc == 0 ? min_clock(ps) : 0;
        for (int v = 0; v < ps->W && rc == 0; v++) {
            if (!ps->w[v].reply_due)
                continue;
            if (ps->w[v].clock - m > ps->s) {
                pthread_mutex_lock(&ps->mu);
                ps->st.held += v == w;
                pthread_mutex_unlock(&ps->mu);
                continue;
            }
            rc = send_reply(s, ps, v);
        }
    }
    if (rc == 0) {
        pthread_mutex_lock(&ps->mu);
        rc = wait_for(ps, sends_done, NULL);
        pthread_mutex_unlock(&ps->mu);
    }
    ps->trained |= rc == 0;
    pthread_mutex_lock(&ps->mu);
    ps->st.clock = ps->st.version = ps->version;
    ps->st.min_clock = min_clock(ps);
    pthread_mutex_unlock(&ps->mu);
    return rc;
}

int wf__ps_serve(wf_session *s, struct wf__ps_run *ps, wf_node *const *fetches, int n_fetches,
                 wf_tensor **outs, wf_node *const *targets, int n_targets)
{
    const wf__ps_async *a = &ps->a;
    bool train = false;
    for (int i = 0; i < n_targets; i++)
        train |= targets[i] == a->tok;
    for (int i = 0; i < n_fetches; i++)
        if (fetches[i] == a->tok)
            return wf__session_fail(s, WF_EINVAL,
                                    "wf_session_run: fetch %d: an asynchronous server's run "
                                    "applies the updates itself; fetch scalars or variables",
                                    i);
    int rc = train ? serve_pushes(s, ps) : 0;
    if (rc < 0)
        return wf__session_fail(s, rc, "wf_session_run: parameter server %d: %s", ps->rank,
                                wf_last_errmsg());
    /* The fetches: each scalar the mean over this run's pushes; in a run that does not
     * update (an evaluation, which the workers compute alone), the last training run's. */
    wf_feed fstack[16],
        *feeds = a->n_scalars <= 16 ? fstack : malloc((size_t)a->n_scalars * sizeof *feeds);
    for (int j = 0; feeds && j < a->n_scalars; j++) {
        float v = ps->trained ? (float)(ps->scal[j] / ps->W) : 0.0f;
        feeds[j] =
            (wf_feed){ a->scalar_in[j], wf_tensor_from(WF_F32, (wf_shape){ .rank = 0 }, &v) };
    }
    if (!feeds)
        rc = wf__session_fail(s, WF_ENOMEM, "wf_session_run: no memory");
    if (rc == 0 && n_fetches)
        rc = wf__session_run_plain(s, feeds, a->n_scalars, fetches, n_fetches, outs, NULL, 0);
    for (int j = 0; feeds && j < a->n_scalars; j++)
        wf_tensor_release(feeds[j].value);
    if (feeds != fstack)
        free(feeds);
    return rc;
}

/* The worker's ps_note kernel: records the header of server 'peer' (the recv's). */
static int note_kernel(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                       wf_tensor **out)
{
    struct wf__ps_run *ps = ctx->data;
    const int64_t *h = (const int64_t *)in[0]->data;
    int q = n->inputs[0]->attrs->peer;
    memcpy((void *)(*out)->data, h, 4 * sizeof *h);
    pthread_mutex_lock(&ps->mu);
    if (q >= 0 && q < ps->K)
        memcpy(ps->hdr[q], h, sizeof ps->hdr[q]);
    if (h[2] - h[1] > ps->st.max_lag)
        ps->st.max_lag = h[2] - h[1];
    if (h[3] > ps->st.max_staleness)
        ps->st.max_staleness = h[3];
    pthread_mutex_unlock(&ps->mu);
    return 0;
}

int wf__ps_start(wf_session *s, struct wf__ps_run *ps)
{
    if (!ps || ps->s == 0 || ps->rank < ps->K)
        return 0;
    return wf__kernels_register(s->kernels, &wf_op_ps_note, WF_KERNEL_CPU, note_kernel, NULL, ps);
}

bool wf__ps_serves(const struct wf__ps_run *ps)
{
    return ps && ps->s > 0 && ps->rank < ps->K;
}

void wf__ps_plan_local(const struct wf__ps_run *ps, wf__plan *p)
{
    if (!ps || ps->s == 0)
        return;
    for (int i = 0; i < p->n; i++)
        if (p->nodes[i]->op == &wf_op_send || p->nodes[i]->op == &wf_op_recv)
            return;
    p->transfers = false;
}

void wf__ps_free(struct wf__ps_run *ps)
{
    if (ps)
        ps_unref(ps);
}

int wf_session_ps_stats(wf_session *s, wf_ps_stats *out)
{
    if (!s || !out)
        return wf__err(WF_EINVAL, "wf_session_ps_stats: %s is NULL", s ? "out" : "session");
    struct wf__ps_run *ps = wf__dp_ps(s->dp);
    if (!ps || ps->s == 0)
        return wf__session_fail(s, WF_EINVAL,
                                "wf_session_ps_stats: the session has no asynchronous "
                                "parameter-server strategy (staleness > 0)");
    pthread_mutex_lock(&ps->mu);
    *out = ps->st;
    if (ps->rank >= ps->K) {
        out->clock = ps->hdr[0][2];
        out->min_clock = ps->hdr[0][1];
        out->version = 0;
        for (int q = 0; q < ps->K; q++) {
            out->version += ps->hdr[q][0];
            if (ps->hdr[q][1] < out->min_clock)
                out->min_clock = ps->hdr[q][1];
        }
    }
    pthread_mutex_unlock(&ps->mu);
    return 0;
}

int wf__ps_prepare(wf_graph *g, wf_comm *comm, const wf_strategy_opts *o, int servers,
                   int staleness, int edge_base, wf__replica_map *map, struct wf__ps_run **out)
{
    *out = NULL;
    int rank = wf_comm_rank(comm), size = wf_comm_size(comm);
    wf__ps_opts po = { .rank = rank,
                       .size = size,
                       .servers = servers,
                       .shards = o->shards,
                       .aggregation = o->aggregation,
                       .edge_base = edge_base,
                       .staleness = staleness };
    struct wf__ps_run *ps = calloc(1, sizeof *ps);
    if (!ps)
        return wf__err(WF_ENOMEM, "parameter servers: no memory");
    *ps = (struct wf__ps_run){ .rank = rank,
                               .size = size,
                               .K = servers,
                               .W = size - servers,
                               .s = staleness,
                               .agg = o->aggregation,
                               .comm = comm,
                               .refs = 1 };
    pthread_mutex_init(&ps->mu, NULL);
    pthread_cond_init(&ps->cv, NULL);
    int rc = wf__ps_rewrite(g, &po, map, &ps->a);
    ps->n_user = map->n;
    if (rc == 0 && rank < servers && staleness > 0) {
        ps->w = calloc((size_t)ps->W, sizeof *ps->w);
        for (int w = 0; ps->w && w < ps->W && rc == 0; w++)
            if (!(ps->w[w].in =
                      calloc((size_t)(ps->a.n_grads + ps->a.n_scalars) + 1, sizeof *ps->w[w].in)))
                rc = wf__err(WF_ENOMEM, "parameter servers: no memory");
        if (!ps->w || !(ps->scal = calloc((size_t)ps->a.n_scalars + 1, sizeof *ps->scal)))
            rc = wf__err(WF_ENOMEM, "parameter servers: no memory");
    }
    if (rc < 0) {
        ps_unref(ps);
        return rc;
    }
    *out = ps;
    return 0;
}

int wf_session_ps_sync(wf_session *s)
{
    if (!s)
        return wf__err(WF_EINVAL, "wf_session_ps_sync: session is NULL");
    struct wf__ps_run *ps = wf__dp_ps(s->dp);
    if (!ps)
        return wf__session_fail(s, WF_EINVAL,
                                "wf_session_ps_sync: the session has no parameter-server "
                                "strategy");
    /* Every rank walks the user's variables in node order, so the broadcasts pair up. */
    int rc = 0;
    for (int id = 0; id < ps->n_user && rc == 0; id++) {
        int root = ps->a.var_owner[id];
        if (root < 0)
            continue;
        wf_node *var = wf_graph_node(s->g, id);
        wf_tensor *t = wf__tensor_alloc(var->dtype, var->shape), *v = NULL;
        size_t bytes = t ? (size_t)t->numel * wf_dtype_size(t->dtype) : 0;
        if (!t)
            rc = wf__err(WF_ENOMEM, "no memory for %s", var->name);
        if (rc == 0 && ps->rank == root && (rc = wf_session_variable(s, var, &v)) == 0)
            rc = wf_tensor_read(v, var->dtype, (void *)t->data, bytes);
        wf_tensor_release(v);
        if (rc == 0 && (rc = wf_comm_broadcast(ps->comm, (void *)t->data, bytes, root)) < 0)
            rc = wf__err(rc, "broadcasting '%s' from server %d: %s", var->name, root,
                         wf_last_errmsg());
        if (rc == 0 && ps->rank != root)
            rc = wf_session_assign(s, var, t);
        wf_tensor_release(t);
    }
    if (rc < 0) {
        char why[WF_ERRMSG_MAX];
        snprintf(why, sizeof why, "%s", wf_last_errmsg());
        return wf__session_fail(s, rc, "wf_session_ps_sync: %s", why);
    }
    return 0;
}
