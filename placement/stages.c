/* placement/stages.c: the automatic split of a graph into pipeline stages.
 * Owns: wf_plan_create(), wf_plan_evaluate(), the plan's queries and wf_plan_print().
 * The model (one place; both methods and the evaluator use it): stage k runs on cluster
 *   device k. Per micro-batch, stage k takes (1 + b) * compute_k + x * (in_k + out_k), where
 *   compute_k sums its ops' seconds on its device (wf_cost_seconds()), b is the backward
 *   factor (0 without backward), x is 2 with backward (activations forward, gradients of the
 *   same size back) and 1 without, and in_k / out_k are the transfer times over the links to
 *   stages k - 1 and k + 1 of the bytes that cross that boundary (every value made on or
 *   before it and read after it, once however many readers). Memory of stage k: weights
 *   (variables times 1 + the optimizer factor; constants), plus the activations (every op's
 *   output and the placeholders it reads) times the micro-batches its schedule keeps alive
 *   (GPipe m, 1F1B min(m, p - k)), plus hinted sources. A source goes with its earliest
 *   reader.
 * Two methods:
 *   - exact: a stage is the difference of two downsets (sets closed under predecessors:
 *     PipeDream's antichain formulation, which handles branches), dp[k][B] = min over downsets
 *     A in B of max(dp[k-1][A], time_k(B \ A)); O(p * D^2) for D downsets, so only for at
 *     most 64 ops and 4096 downsets;
 *   - prefix: stages are consecutive runs of the creation order (a topological order).
 *     Binary search on the slowest stage's time T; whether T is reachable is one sweep per
 *     stage: stage k may end at j after i if i was reachable, memory allows (i >= lo(j),
 *     nondecreasing in j) and (1+b) (S_k[j] - S_k[i]) + x (in_k(C[i]) + out_k(C[j])) <= T,
 *     i.e. f(i) = (1+b) S_k[i] - x in_k(C[i]) >= (1+b) S_k[j] + x out_k(C[j]) - T, so a
 *     sliding-window maximum of f over [lo(j), j-1] decides it: O(p n) per probe.
 * Not here: the schedules and their simulation (schedule.c), send/recv (partition.c). */
#include "../ops/table.h"
#include "internal.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define EXACT_MAX_OPS     64
#define EXACT_MAX_DOWNSET 4096

typedef struct model {
    const wf_graph *g;
    const wf_cluster *c;
    int N;             /* nodes of the graph */
    int n;             /* ops (non-sources) */
    int P;             /* stages */
    int *pos;          /* by node id: position among ops, or -1 for a source */
    int *ops;          /* by position: node id */
    int *pin;          /* by node id: the hinted stage, or -1 */
    double *t;         /* P x n: op seconds on stage k's device */
    double *wmem;      /* by node id: weight bytes (variables with optimizer state, constants) */
    double *amem;      /* by node id: activation bytes per micro-batch */
    double *vbytes;    /* by node id: the value's bytes when sent */
    double fixed[256]; /* by stage: hinted sources' memory */
    double cap[256];   /* by stage: memory cap, INFINITY when none */
    double inflight[256];
    double b, x;
} model;

static void model_free(model *m)
{
    free(m->pos);
    free(m->ops);
    free(m->pin);
    free(m->t);
    free(m->wmem);
    free(m->amem);
    free(m->vbytes);
}

static bool is_source(const wf_node *n)
{
    return (n->op->flags & WF_OP_SOURCE) != 0;
}

static const char *where(const wf_node *n, char *buf, size_t size)
{
    return wf__node_where(n, buf, size);
}

/* Fills 'm' from the graph, the cluster and the options. Returns 0 or an error. */
static int model_init(model *m, const wf_graph *g, const wf_cluster *c, const wf_plan_opts *o)
{
    memset(m, 0, sizeof *m);
    if (!g || !c)
        return wf__err(WF_EINVAL, "plan: NULL graph or cluster");
    if (o->n_stages < 0 || o->n_stages > c->n_devices)
        return wf__err(WF_EINVAL, "plan: option n_stages %d: the cluster has %d devices",
                       o->n_stages, c->n_devices);
    if (c->n_devices < 1)
        return wf__err(WF_EINVAL, "plan: the cluster has no devices");
    if (o->micro_batches < 0)
        return wf__err(WF_EINVAL, "plan: option micro_batches %d is negative", o->micro_batches);
    if (o->schedule != WF_SCHEDULE_GPIPE && o->schedule != WF_SCHEDULE_1F1B)
        return wf__err(WF_EINVAL,
                       "plan: option schedule %d: WF_SCHEDULE_GPIPE or "
                       "WF_SCHEDULE_1F1B",
                       o->schedule);
    if (!isfinite(o->backward_factor) || !(o->optimizer_factor >= 0) ||
        !isfinite(o->optimizer_factor))
        return wf__err(WF_EINVAL,
                       "plan: option backward_factor %g or optimizer_factor %g is "
                       "not a finite number (optimizer_factor >= 0)",
                       o->backward_factor, o->optimizer_factor);
    if (o->method < WF_PLAN_AUTO || o->method > WF_PLAN_PREFIX)
        return wf__err(WF_EINVAL, "plan: option method %d is not a WF_PLAN_*", o->method);
    m->g = g;
    m->c = c;
    m->N = wf_graph_node_count(g);
    m->P = o->n_stages ? o->n_stages : c->n_devices;
    int mb = o->micro_batches ? o->micro_batches : 1;
    m->b = o->backward_factor == 0 ? 2 : o->backward_factor < 0 ? 0 : o->backward_factor;
    m->x = m->b > 0 ? 2 : 1;
    size_t N = (size_t)m->N + 1;
    m->pos = malloc(sizeof *m->pos * N);
    m->ops = malloc(sizeof *m->ops * N);
    m->pin = malloc(sizeof *m->pin * N);
    m->wmem = calloc(N, sizeof *m->wmem);
    m->amem = calloc(N, sizeof *m->amem);
    m->vbytes = calloc(N, sizeof *m->vbytes);
    if (!m->pos || !m->ops || !m->pin || !m->wmem || !m->amem || !m->vbytes)
        return wf__err(WF_ENOMEM, "plan: no memory");
    for (int id = 0; id < m->N; id++) {
        const wf_node *v = wf_graph_node(g, id);
        m->pos[id] = is_source(v) ? -1 : m->n;
        if (!is_source(v))
            m->ops[m->n++] = id;
        m->vbytes[id] = wf__place_value_bytes(v);
        if (v->op == &wf_op_variable)
            m->wmem[id] = m->vbytes[id] * (1 + o->optimizer_factor);
        else if (v->op == &wf_op_constant)
            m->wmem[id] = m->vbytes[id];
        else
            m->amem[id] = m->vbytes[id];
        int d = wf__place_hint_device(o->hints, c, v);
        if (d < -1)
            return d;
        if (d >= m->P) {
            char dn[64], w[128];
            return wf__err(WF_EINVAL,
                           "%s '%s' (%s): hinted to device %s, which is past the "
                           "plan's %d stages (devices 0 .. %d)",
                           v->op->name, v->name, where(v, w, sizeof w),
                           wf_cluster_device_name(c, d, dn, sizeof dn), m->P, m->P - 1);
        }
        m->pin[id] = d;
    }
    if (m->n < m->P)
        return wf__err(WF_EINVAL, "plan: option n_stages %d: the graph has only %d ops", m->P,
                       m->n);
    m->t = malloc(sizeof *m->t * (size_t)m->P * (size_t)m->n);
    if (!m->t)
        return wf__err(WF_ENOMEM, "plan: no memory");
    for (int k = 0; k < m->P; k++) {
        const wf_cluster_device *d = &c->devices[k];
        for (int j = 0; j < m->n; j++)
            m->t[(size_t)k * m->n + j] = wf_cost_seconds(o->costs, wf_graph_node(g, m->ops[j]), d);
        m->cap[k] = d->mem_bytes > 0 ? d->mem_bytes : INFINITY;
        if (m->b == 0)
            m->inflight[k] = 1;
        else if (o->schedule == WF_SCHEDULE_GPIPE)
            m->inflight[k] = mb;
        else
            m->inflight[k] = mb < m->P - k ? mb : m->P - k;
        m->fixed[k] = 0;
    }
    for (int id = 0; id < m->N; id++)
        if (m->pos[id] < 0 && m->pin[id] >= 0) {
            int k = m->pin[id];
            m->fixed[k] += m->wmem[id] + m->inflight[k] * m->amem[id];
        }
    return 0;
}

/* The transfer seconds of 'bytes' between stage k and k + 1 (x included). */
static double xfer(const model *m, int k, double bytes)
{
    return m->x * wf__place_xfer_seconds(m->c, k, k + 1, bytes);
}

/* ---- Scoring a complete assignment --------------------------------------------------------- */

typedef struct score {
    double *sec, *mem, *comp, *cut; /* by stage; cut[k]: bytes across boundary k | k+1 */
} score;

/* Sources take their earliest reader's stage (or their hinted one; a source nobody reads
 * stage 0), so 'stage_of' is completed in place. Then each stage's time and memory. Returns 0
 * or WF_EINVAL for an edge that goes backwards or a stage out of range. */
static int score_assignment(const model *m, int *stage_of, score *s)
{
    for (int id = 0; id < m->N; id++)
        if (m->pos[id] >= 0 && (stage_of[id] < 0 || stage_of[id] >= m->P)) {
            const wf_node *v = wf_graph_node(m->g, id);
            return wf__err(WF_EINVAL, "plan: %s '%s': stage %d is not in 0 .. %d", v->op->name,
                           v->name, stage_of[id], m->P - 1);
        }
    for (int id = 0; id < m->N; id++)
        if (m->pos[id] < 0)
            stage_of[id] = m->pin[id] >= 0 ? m->pin[id] : -1;
    /* Earliest readers of the sources; edges that go backwards. */
    for (int id = 0; id < m->N; id++) {
        const wf_node *v = wf_graph_node(m->g, id);
        for (int i = 0; i < v->n_inputs + v->n_control; i++) {
            const wf_node *u = i < v->n_inputs ? v->inputs[i] : v->control[i - v->n_inputs];
            if (m->pos[u->id] < 0 && m->pin[u->id] < 0) {
                if (stage_of[u->id] < 0 || stage_of[v->id] < stage_of[u->id])
                    stage_of[u->id] = stage_of[v->id];
            } else if (m->pos[u->id] >= 0 && stage_of[u->id] > stage_of[id]) {
                return wf__err(WF_EINVAL,
                               "plan: %s '%s' on stage %d reads %s '%s' of the later "
                               "stage %d",
                               v->op->name, v->name, stage_of[id], u->op->name, u->name,
                               stage_of[u->id]);
            }
        }
    }
    for (int k = 0; k < m->P; k++) {
        s->comp[k] = 0;
        s->cut[k] = 0;
        s->mem[k] = m->fixed[k];
    }
    for (int id = 0; id < m->N; id++) {
        if (stage_of[id] < 0)
            stage_of[id] = 0;
        int k = stage_of[id];
        if (m->pos[id] >= 0)
            s->comp[k] += m->t[(size_t)k * m->n + m->pos[id]];
        if (m->pos[id] >= 0 || m->pin[id] < 0)
            s->mem[k] += m->wmem[id] + m->inflight[k] * m->amem[id];
    }
    /* Each value crosses the boundaries from its stage up to its last reader's. */
    int *last = malloc(sizeof *last * ((size_t)m->N + 1));
    if (!last)
        return wf__err(WF_ENOMEM, "plan: no memory");
    for (int id = 0; id < m->N; id++)
        last[id] = stage_of[id];
    for (int id = 0; id < m->N; id++) {
        const wf_node *v = wf_graph_node(m->g, id);
        for (int i = 0; i < v->n_inputs; i++)
            if (stage_of[id] > last[v->inputs[i]->id])
                last[v->inputs[i]->id] = stage_of[id];
    }
    for (int id = 0; id < m->N; id++)
        if (m->pos[id] >= 0 || m->pin[id] < 0)
            for (int k = stage_of[id]; k < last[id]; k++)
                s->cut[k] += m->vbytes[id];
    free(last);
    for (int k = 0; k < m->P; k++) {
        double in = k > 0 ? xfer(m, k - 1, s->cut[k - 1]) : 0;
        double out = k < m->P - 1 ? xfer(m, k, s->cut[k]) : 0;
        s->sec[k] = (1 + m->b) * s->comp[k] + in + out;
    }
    return 0;
}

/* ---- The prefix method ------------------------------------------------------------------- */

typedef struct prefix {
    double *S;            /* P x (n+1): prefix sums of op seconds per stage device */
    double *W, *A;        /* n+1: prefix sums of weight and activation bytes (sources at their
                             first reader) */
    double *C;            /* n+1: bytes crossing a boundary before position b */
    int *lo_pin, *hi_pin; /* by stage: boundary b_k must be in [lo_pin, hi_pin] */
    int *choice;          /* P x (n+1): where stage k began when it ends at j */
    double *f;            /* n+1 scratch */
    int *dq;              /* n+1 scratch */
    unsigned char *reach; /* 2 x (n+1) */
} prefix;

static void prefix_free(prefix *p)
{
    free(p->S);
    free(p->W);
    free(p->A);
    free(p->C);
    free(p->lo_pin);
    free(p->hi_pin);
    free(p->choice);
    free(p->f);
    free(p->dq);
    free(p->reach);
}

static int prefix_init(const model *m, prefix *p)
{
    int n = m->n, P = m->P;
    size_t n1 = (size_t)n + 1;
    memset(p, 0, sizeof *p);
    p->S = calloc((size_t)P * n1, sizeof *p->S);
    p->W = calloc(n1, sizeof *p->W);
    p->A = calloc(n1, sizeof *p->A);
    p->C = calloc(n1 + 1, sizeof *p->C);
    p->lo_pin = malloc(sizeof *p->lo_pin * (size_t)P);
    p->hi_pin = malloc(sizeof *p->hi_pin * (size_t)P);
    p->choice = malloc(sizeof *p->choice * (size_t)P * n1);
    p->f = malloc(sizeof *p->f * n1);
    p->dq = malloc(sizeof *p->dq * n1);
    p->reach = malloc(2 * n1);
    int *anchor = malloc(sizeof *anchor * ((size_t)m->N + 1));
    int *lastp = malloc(sizeof *lastp * ((size_t)m->N + 1));
    if (!p->S || !p->W || !p->A || !p->C || !p->lo_pin || !p->hi_pin || !p->choice || !p->f ||
        !p->dq || !p->reach || !anchor || !lastp) {
        free(anchor);
        free(lastp);
        return wf__err(WF_ENOMEM, "plan: no memory");
    }
    for (int k = 0; k < P; k++)
        for (int j = 0; j < n; j++)
            p->S[(size_t)k * n1 + j + 1] = p->S[(size_t)k * n1 + j] + m->t[(size_t)k * n + j];
    /* Anchors: an op at its position, a source at its first reader's (0 if none). */
    for (int id = 0; id < m->N; id++) {
        anchor[id] = m->pos[id] >= 0 ? m->pos[id] : -1;
        lastp[id] = anchor[id];
    }
    for (int id = 0; id < m->N; id++) {
        const wf_node *v = wf_graph_node(m->g, id);
        int q = m->pos[id];
        if (q < 0)
            continue;
        for (int i = 0; i < v->n_inputs + v->n_control; i++) {
            const wf_node *u = i < v->n_inputs ? v->inputs[i] : v->control[i - v->n_inputs];
            if (anchor[u->id] < 0)
                anchor[u->id] = q;
            if (i < v->n_inputs && q > lastp[u->id])
                lastp[u->id] = q;
        }
    }
    double *dW = calloc(n1, sizeof *dW), *dA = calloc(n1, sizeof *dA);
    if (!dW || !dA) {
        free(dW);
        free(dA);
        free(anchor);
        free(lastp);
        return wf__err(WF_ENOMEM, "plan: no memory");
    }
    for (int id = 0; id < m->N; id++) {
        if (m->pos[id] < 0 && m->pin[id] >= 0)
            continue; /* a hinted source: fixed memory, no transfer modelled */
        int a = anchor[id] < 0 ? 0 : anchor[id], l = lastp[id] < a ? a : lastp[id];
        dW[a] += m->wmem[id];
        dA[a] += m->amem[id];
        /* crosses boundary b (ops < b before it) when a < b <= l */
        p->C[a + 1] += m->vbytes[id];
        p->C[l + 1] -= m->vbytes[id];
    }
    for (int j = 0; j < n; j++) {
        p->W[j + 1] = p->W[j] + dW[j];
        p->A[j + 1] = p->A[j] + dA[j];
    }
    for (size_t b = 1; b <= n1; b++)
        p->C[b] += p->C[b - 1];
    for (size_t b = 0; b < n1; b++)
        if (p->C[b] < 0)
            p->C[b] = 0; /* rounding of the running sum */
    p->C[0] = p->C[n] = 0;
    /* Hinted ops: boundary b_k >= (last pinned pos <= k) + 1 and <= first pinned pos > k. */
    for (int k = 0; k < P; k++) {
        p->lo_pin[k] = k + 1;
        p->hi_pin[k] = n - (P - 1 - k);
    }
    for (int q = 0; q < n; q++) {
        int s = m->pin[m->ops[q]];
        if (s < 0)
            continue;
        for (int k = s; k < P; k++)
            if (p->lo_pin[k] < q + 1)
                p->lo_pin[k] = q + 1;
        for (int k = 0; k < s; k++)
            if (p->hi_pin[k] > q)
                p->hi_pin[k] = q;
    }
    p->lo_pin[P - 1] = p->hi_pin[P - 1] = n;
    free(dW);
    free(dA);
    free(anchor);
    free(lastp);
    return 0;
}

/* Whether a split with every stage at most T exists ('use_mem' false: ignore caps). Fills
 * 'choice'. */
static bool prefix_feasible(const model *m, prefix *p, double T, bool use_mem)
{
    int n = m->n, P = m->P;
    size_t n1 = (size_t)n + 1;
    unsigned char *prev = p->reach, *cur = p->reach + n1;
    memset(prev, 0, n1);
    prev[0] = 1;
    for (int k = 0; k < P; k++) {
        const double *S = p->S + (size_t)k * n1;
        double a = 1 + m->b;
        memset(cur, 0, n1);
        for (int i = 0; i <= n; i++)
            p->f[i] = a * S[i] - (k > 0 ? xfer(m, k - 1, p->C[i]) : 0);
        int head = 0, tail = 0, next = 0, lo = 0;
        double mult = m->inflight[k];
        for (int j = p->lo_pin[k]; j <= p->hi_pin[k]; j++) {
            /* admit i < j into the window */
            for (; next < j; next++) {
                if (!prev[next])
                    continue;
                while (tail > head && p->f[p->dq[tail - 1]] <= p->f[next])
                    tail--;
                p->dq[tail++] = next;
            }
            if (use_mem) {
                double gj = p->W[j] + mult * p->A[j];
                while (lo < j &&
                       gj - (p->W[lo] + mult * p->A[lo]) + m->fixed[k] > m->cap[k] * (1 + 1e-12))
                    lo++;
            }
            while (tail > head && p->dq[head] < lo)
                head++;
            if (tail == head)
                continue;
            int i = p->dq[head];
            double need = a * S[j] + (k < P - 1 ? xfer(m, k, p->C[j]) : 0) - T;
            if (p->f[i] >= need) {
                cur[j] = 1;
                p->choice[(size_t)k * n1 + j] = i;
            }
        }
        unsigned char *t = prev;
        prev = cur;
        cur = t;
    }
    if (prev != p->reach) /* keep the last row in reach[0 .. n] for the caller */
        memcpy(p->reach, prev, n1);
    return p->reach[n] != 0;
}

static double upper_bound(const model *m, const double *S, const double *C)
{
    size_t n1 = (size_t)m->n + 1;
    double comp = 0, cut = 0;
    for (int k = 0; k < m->P; k++)
        if (S[(size_t)k * n1 + m->n] > comp)
            comp = S[(size_t)k * n1 + m->n];
    for (size_t b = 0; b < n1; b++)
        for (int k = 0; k + 1 < m->P; k++)
            if (xfer(m, k, C[b]) > cut)
                cut = xfer(m, k, C[b]);
    return (1 + m->b) * comp + 2 * cut + 1e-30;
}

/* Splits by prefixes; writes every op's stage into 'stage_of'. */
static int plan_prefix(const model *m, int *stage_of, int *fail_kind)
{
    prefix p;
    int rc = prefix_init(m, &p);
    if (rc < 0) {
        prefix_free(&p);
        return rc;
    }
    for (int k = 0; k < m->P; k++)
        if (p.lo_pin[k] > p.hi_pin[k]) {
            *fail_kind = 1;
            prefix_free(&p);
            return WF_EINVAL;
        }
    if (!prefix_feasible(m, &p, INFINITY, false)) {
        *fail_kind = 1; /* hints */
        prefix_free(&p);
        return WF_EINVAL;
    }
    if (!prefix_feasible(m, &p, INFINITY, true)) {
        *fail_kind = 2; /* memory */
        prefix_free(&p);
        return WF_EINVAL;
    }
    double lo = 0, hi = upper_bound(m, p.S, p.C);
    for (int it = 0; it < 100 && hi - lo > 1e-12 * hi; it++) {
        double mid = 0.5 * (lo + hi);
        if (prefix_feasible(m, &p, mid, true))
            hi = mid;
        else
            lo = mid;
    }
    bool ok = prefix_feasible(m, &p, hi, true);
    if (!ok) /* cannot happen: hi was feasible or is the bound; keep the caps' answer */
        prefix_feasible(m, &p, INFINITY, true);
    size_t n1 = (size_t)m->n + 1;
    int j = m->n;
    for (int k = m->P - 1; k >= 0; k--) {
        int i = p.choice[(size_t)k * n1 + j];
        for (int q = i; q < j; q++)
            stage_of[m->ops[q]] = k;
        j = i;
    }
    prefix_free(&p);
    return 0;
}

/* ---- The exact method (downsets) ---------------------------------------------------------- */

typedef struct downsets {
    uint64_t *set;
    int n, cap;
    uint64_t *hash; /* open addressing of set values + 1 (0: empty) */
    int hcap;
} downsets;

static bool ds_insert(downsets *d, uint64_t s, bool *full)
{
    uint64_t key = s + 1;
    for (int i = (int)((s * 0x9E3779B97F4A7C15ull) >> 40) & (d->hcap - 1);;
         i = (i + 1) & (d->hcap - 1)) {
        if (d->hash[i] == key)
            return false;
        if (d->hash[i] == 0) {
            if (d->n == d->cap) {
                *full = true;
                return false;
            }
            d->hash[i] = key;
            d->set[d->n++] = s;
            return true;
        }
    }
}

/* Enumerates the downsets of the ops' order (data and control edges), smallest first (BFS).
 * Returns the count, 0 when more than EXACT_MAX_DOWNSET, or an error. */
static int enumerate(const model *m, const uint64_t *pred, downsets *d)
{
    d->cap = EXACT_MAX_DOWNSET;
    d->hcap = 4 * EXACT_MAX_DOWNSET;
    d->set = malloc(sizeof *d->set * (size_t)d->cap);
    d->hash = calloc((size_t)d->hcap, sizeof *d->hash);
    if (!d->set || !d->hash)
        return wf__err(WF_ENOMEM, "plan: no memory");
    bool full = false;
    ds_insert(d, 0, &full);
    for (int q = 0; q < d->n && !full; q++) {
        uint64_t s = d->set[q];
        for (int v = 0; v < m->n && !full; v++)
            if (!(s >> v & 1) && (pred[v] & ~s) == 0)
                ds_insert(d, s | 1ull << v, &full);
    }
    return full ? 0 : d->n;
}

static int plan_exact(const model *m, int *stage_of, int *fail_kind, bool *used)
{
    int n = m->n, P = m->P, rc = 0;
    *used = false;
    if (n > EXACT_MAX_OPS)
        return 0;
    uint64_t *pred = calloc((size_t)n, sizeof *pred);
    uint64_t *cons = calloc((size_t)m->N + 1, sizeof *cons); /* data readers of each value */
    uint64_t *rdr = calloc((size_t)m->N + 1, sizeof *rdr);   /* data and control readers */
    downsets d = { 0 };
    double *T = NULL, *M = NULL, *C = NULL, *dp = NULL;
    int *from = NULL;
    if (!pred || !cons || !rdr) {
        rc = wf__err(WF_ENOMEM, "plan: no memory");
        goto out;
    }
    for (int q = 0; q < n; q++) {
        const wf_node *v = wf_graph_node(m->g, m->ops[q]);
        for (int i = 0; i < v->n_inputs + v->n_control; i++) {
            const wf_node *u = i < v->n_inputs ? v->inputs[i] : v->control[i - v->n_inputs];
            if (m->pos[u->id] >= 0)
                pred[q] |= 1ull << m->pos[u->id];
            if (i < v->n_inputs)
                cons[u->id] |= 1ull << q;
            rdr[u->id] |= 1ull << q;
        }
    }
    int D = enumerate(m, pred, &d);
    if (D <= 0) {
        rc = D;
        goto out;
    }
    *used = true;
    /* Per downset: seconds on each stage device, memory for each stage, crossing bytes. */
    T = calloc((size_t)D * P, sizeof *T);
    M = calloc((size_t)D * P, sizeof *M);
    C = calloc((size_t)D, sizeof *C);
    dp = malloc(sizeof *dp * (size_t)D * P);
    from = malloc(sizeof *from * (size_t)D * P);
    if (!T || !M || !C || !dp || !from) {
        rc = wf__err(WF_ENOMEM, "plan: no memory");
        goto out;
    }
    for (int s = 0; s < D; s++) {
        uint64_t A = d.set[s];
        for (int id = 0; id < m->N; id++) {
            int q = m->pos[id];
            bool in, crosses;
            if (q >= 0) {
                in = A >> q & 1;
                crosses = in && (cons[id] & ~A);
            } else {
                if (m->pin[id] >= 0)
                    continue;
                in = (rdr[id] & A) != 0 || (rdr[id] == 0 && A != 0);
                crosses = in && (cons[id] & ~A);
            }
            if (!in)
                continue;
            for (int k = 0; k < P; k++) {
                if (q >= 0)
                    T[(size_t)s * P + k] += m->t[(size_t)k * n + q];
                M[(size_t)s * P + k] += m->wmem[id] + m->inflight[k] * m->amem[id];
            }
            if (crosses)
                C[s] += m->vbytes[id];
        }
    }
    /* Hints: the downset ending stage k holds every op pinned to <= k and none pinned later. */
    uint64_t le[256] = { 0 }, gt[256] = { 0 };
    for (int q = 0; q < n; q++) {
        int st = m->pin[m->ops[q]];
        if (st < 0)
            continue;
        for (int k = 0; k < P; k++)
            if (st <= k)
                le[k] |= 1ull << q;
            else
                gt[k] |= 1ull << q;
    }
    uint64_t all = n == 64 ? ~0ull : (1ull << n) - 1;
    for (int pass = 0; pass < 3; pass++) {
        /* pass 0: no caps, no times (hints only); 1: caps; 2: the optimum */
        for (int k = 0; k < P; k++)
            for (int s = 0; s < D; s++) {
                uint64_t B = d.set[s];
                double best = INFINITY;
                int arg = -1;
                dp[(size_t)k * D + s] = INFINITY;
                if ((B & le[k]) != le[k] || (B & gt[k]) || (k == P - 1 && B != all))
                    continue;
                for (int r = 0; r < s; r++) { /* BFS order: a proper subset comes earlier */
                    uint64_t A = d.set[r];
                    if ((A & B) != A || A == B)
                        continue;
                    double prev = k == 0 ? (A == 0 ? 0 : INFINITY) : dp[(size_t)(k - 1) * D + r];
                    if (prev == INFINITY)
                        continue;
                    double mem = M[(size_t)s * P + k] - M[(size_t)r * P + k] + m->fixed[k];
                    if (pass >= 1 && mem > m->cap[k] * (1 + 1e-12))
                        continue;
                    double t = 0;
                    if (pass == 2) {
                        t = (1 + m->b) * (T[(size_t)s * P + k] - T[(size_t)r * P + k]);
                        t += k > 0 ? xfer(m, k - 1, C[r]) : 0;
                        t += k < P - 1 ? xfer(m, k, C[s]) : 0;
                    }
                    double v = prev > t ? prev : t;
                    if (v < best) {
                        best = v;
                        arg = r;
                    }
                }
                dp[(size_t)k * D + s] = best;
                from[(size_t)k * D + s] = arg;
            }
        int last = -1;
        for (int s = 0; s < D; s++)
            if (d.set[s] == all)
                last = s;
        if (last < 0 || dp[(size_t)(P - 1) * D + last] == INFINITY) {
            *fail_kind = pass == 0 ? 1 : 2;
            rc = WF_EINVAL;
            goto out;
        }
        if (pass < 2)
            continue;
        int s = last;
        for (int k = P - 1; k >= 0; k--) {
            int r = from[(size_t)k * D + s];
            uint64_t stage = d.set[s] & ~d.set[r];
            for (int q = 0; q < n; q++)
                if (stage >> q & 1)
                    stage_of[m->ops[q]] = k;
            s = r;
        }
    }
out:
    free(pred);
    free(cons);
    free(rdr);
    free(d.set);
    free(d.hash);
    free(T);
    free(M);
    free(C);
    free(dp);
    free(from);
    return rc;
}

/* ---- The plan -------------------------------------------------------------------------------- */

typedef struct stage_info {
    double sec, mem, comp, cut;
    int n_ops;
    char first[64], last[64];
} stage_info;

struct wf_plan {
    const wf_graph *g; /* identity only: never read after wf_plan_create() */
    int N, P;
    int *stage_of;
    int exact;
    double slowest, step, bubble;
    int schedule, micro_batches;
    char dev[256][48];
    stage_info st[];
};

/* Says why no split was found (kind 1: hints; 2: memory). */
static int explain(const model *m, int kind)
{
    if (kind == 1)
        return wf__err(WF_EINVAL,
                       "plan: the hints cannot all hold: a hinted op is ordered "
                       "before an op hinted to an earlier device, or a stage would be empty");
    double biggest = 0, cap = 0;
    int who = -1;
    for (int k = 0; k < m->P; k++)
        if (m->cap[k] > cap)
            cap = m->cap[k];
    for (int id = 0; id < m->N; id++) {
        double mem = m->wmem[id] + m->inflight[0] * m->amem[id];
        if (mem > biggest) {
            biggest = mem;
            who = id;
        }
    }
    char dn[64];
    int small = 0;
    for (int k = 1; k < m->P; k++)
        if (m->cap[k] < m->cap[small])
            small = k;
    if (who >= 0 && biggest > cap) {
        const wf_node *v = wf_graph_node(m->g, who);
        char w[128];
        /* a matmul's weight: tensor parallelism splits it over ranks (placement/tensor_split.c) */
        bool matmul_weight = false;
        for (int id = 0; id < m->N && !matmul_weight; id++) {
            const wf_node *u = wf_graph_node(m->g, id);
            matmul_weight = u->op == &wf_op_matmul && u->n_inputs > 1 && u->inputs[1] == v;
        }
        return wf__err(WF_EINVAL,
                       "plan: %s '%s' (%s) alone needs %.0f bytes, more than any "
                       "device's memory cap (the largest is %.0f)%s",
                       v->op->name, v->name, where(v, w, sizeof w), biggest, cap,
                       matmul_weight ? "; it is a matmul's weight: split it over the ranks with "
                                       "wf_tp_split_create() (weft/placement.h: W1 by columns, "
                                       "W2 by rows of a two-matmul block, each rank holding 1/N)"
                                     : "");
    }
    return wf__err(WF_EINVAL,
                   "plan: no split into %d stages fits the devices' memory caps "
                   "(the smallest: %s with %.0f bytes); the largest node is %s with %.0f",
                   m->P, wf_cluster_device_name(m->c, small, dn, sizeof dn), m->cap[small],
                   who >= 0 ? wf_graph_node(m->g, who)->name : "?", biggest);
}

static int make_score(const model *m, score *s, double **buf)
{
    *buf = calloc(4 * (size_t)m->P, sizeof **buf);
    if (!*buf)
        return wf__err(WF_ENOMEM, "plan: no memory");
    s->sec = *buf;
    s->mem = *buf + m->P;
    s->comp = *buf + 2 * m->P;
    s->cut = *buf + 3 * m->P;
    return 0;
}

int wf_plan_create(const wf_graph *g, const wf_cluster *c, const wf_plan_opts *opts, wf_plan **out)
{
    if (!out)
        return wf__err(WF_EINVAL, "wf_plan_create: NULL out");
    *out = NULL;
    wf_plan_opts o = opts ? *opts : (wf_plan_opts){ 0 };
    model m;
    double *sbuf = NULL;
    int *stage_of = NULL, fail = 0;
    wf_plan *p = NULL;
    int rc = model_init(&m, g, c, &o);
    if (rc < 0)
        goto out;
    stage_of = malloc(sizeof *stage_of * ((size_t)m.N + 1));
    if (!stage_of) {
        rc = wf__err(WF_ENOMEM, "plan: no memory");
        goto out;
    }
    bool exact = false;
    if (o.method != WF_PLAN_PREFIX) {
        rc = plan_exact(&m, stage_of, &fail, &exact);
        if (rc == 0 && !exact && o.method == WF_PLAN_EXACT)
            rc = wf__err(WF_EINVAL,
                         "plan: option method WF_PLAN_EXACT: the graph has %d ops "
                         "(at most %d) or more than %d downsets",
                         m.n, EXACT_MAX_OPS, EXACT_MAX_DOWNSET);
    }
    if (rc == 0 && !exact)
        rc = plan_prefix(&m, stage_of, &fail);
    if (rc < 0) {
        if (fail)
            rc = explain(&m, fail);
        goto out;
    }
    score s;
    if ((rc = make_score(&m, &s, &sbuf)) < 0 || (rc = score_assignment(&m, stage_of, &s)) < 0)
        goto out;
    p = calloc(1, sizeof *p + sizeof p->st[0] * (size_t)m.P);
    if (!p) {
        rc = wf__err(WF_ENOMEM, "plan: no memory");
        goto out;
    }
    p->g = g;
    p->N = m.N;
    p->P = m.P;
    p->stage_of = stage_of;
    stage_of = NULL;
    p->exact = exact;
    p->schedule = o.schedule;
    p->micro_batches = o.micro_batches ? o.micro_batches : 1;
    for (int k = 0; k < m.P; k++) {
        stage_info *si = &p->st[k];
        si->sec = s.sec[k];
        si->mem = s.mem[k];
        si->comp = s.comp[k];
        si->cut = s.cut[k];
        if (si->sec > p->slowest)
            p->slowest = si->sec;
        wf_cluster_device_name(c, k, p->dev[k], sizeof p->dev[k]);
    }
    for (int q = 0; q < m.n; q++) {
        const wf_node *v = wf_graph_node(g, m.ops[q]);
        stage_info *si = &p->st[p->stage_of[v->id]];
        if (si->n_ops++ == 0)
            snprintf(si->first, sizeof si->first, "%s", v->name);
        snprintf(si->last, sizeof si->last, "%s", v->name);
    }
    /* The schedule model: forward, backward and transfer times per stage. */
    wf_pipe_schedule *sch = NULL;
    double *f = calloc(3 * (size_t)m.P, sizeof *f);
    if (!f || (rc = wf_pipe_schedule_create(o.schedule, m.P, p->micro_batches, &sch)) < 0) {
        free(f);
        rc = rc < 0 ? rc : wf__err(WF_ENOMEM, "plan: no memory");
        goto out;
    }
    for (int k = 0; k < m.P; k++) {
        f[k] = s.comp[k];
        f[m.P + k] = m.b * s.comp[k];
        f[2 * m.P + k] = k < m.P - 1 ? wf__place_xfer_seconds(c, k, k + 1, s.cut[k]) : 0;
    }
    rc = wf_pipe_simulate(sch, f, f + m.P, f + 2 * m.P, &p->step, &p->bubble);
    wf_pipe_schedule_destroy(sch);
    free(f);
out:
    if (rc < 0) {
        wf_plan_destroy(p);
        p = NULL;
    }
    free(stage_of);
    free(sbuf);
    model_free(&m);
    *out = p;
    return rc < 0 ? rc : 0;
}

void wf_plan_destroy(wf_plan *p)
{
    if (!p)
        return;
    free(p->stage_of);
    free(p);
}

int wf_plan_evaluate(const wf_graph *g, const wf_cluster *c, const wf_plan_opts *opts,
                     const int *stage_of, double *slowest_s)
{
    if (!stage_of || !slowest_s)
        return wf__err(WF_EINVAL, "wf_plan_evaluate: NULL argument");
    wf_plan_opts o = opts ? *opts : (wf_plan_opts){ 0 };
    model m;
    double *sbuf = NULL;
    int *st = NULL;
    int rc = model_init(&m, g, c, &o);
    score s;
    if (rc == 0 && !(st = malloc(sizeof *st * ((size_t)m.N + 1))))
        rc = wf__err(WF_ENOMEM, "plan: no memory");
    if (rc == 0) {
        memcpy(st, stage_of, sizeof *st * (size_t)m.N);
        rc = make_score(&m, &s, &sbuf);
    }
    if (rc == 0 && (rc = score_assignment(&m, st, &s)) == 0) {
        *slowest_s = 0;
        for (int k = 0; k < m.P; k++)
            if (s.sec[k] > *slowest_s)
                *slowest_s = s.sec[k];
    }
    free(st);
    free(sbuf);
    model_free(&m);
    return rc;
}

int wf_plan_stage_count(const wf_plan *p)
{
    return p ? p->P : 0;
}

int wf_plan_node_stage(const wf_plan *p, const wf_node *n)
{
    if (!p || !n || n->graph != p->g || n->id < 0 || n->id >= p->N)
        return -1;
    return p->stage_of[n->id];
}

int wf_plan_stage_device(const wf_plan *p, int stage)
{
    return p && stage >= 0 && stage < p->P ? stage : -1;
}

double wf_plan_stage_seconds(const wf_plan *p, int stage)
{
    return p && stage >= 0 && stage < p->P ? p->st[stage].sec : 0;
}

double wf_plan_stage_mem_bytes(const wf_plan *p, int stage)
{
    return p && stage >= 0 && stage < p->P ? p->st[stage].mem : 0;
}

double wf_plan_slowest_seconds(const wf_plan *p)
{
    return p ? p->slowest : 0;
}

double wf_plan_step_seconds(const wf_plan *p)
{
    return p ? p->step : 0;
}

double wf_plan_bubble(const wf_plan *p)
{
    return p ? p->bubble : 0;
}

int wf_plan_is_exact(const wf_plan *p)
{
    return p ? p->exact : 0;
}

int wf_plan_print(const wf_plan *p, FILE *f)
{
    if (!p || !f)
        return wf__err(WF_EINVAL, "wf_plan_print: NULL argument");
    int rc = fprintf(f, "plan: %d stages, %s, %s, m=%d\n", p->P,
                     p->exact ? "exact (downsets)" : "prefixes of the creation order",
                     p->schedule == WF_SCHEDULE_1F1B ? "1F1B" : "GPipe", p->micro_batches);
    for (int k = 0; k < p->P && rc >= 0; k++) {
        const stage_info *s = &p->st[k];
        rc = fprintf(f,
                     "  stage %d on %s: %d ops (%s .. %s), %.6g s per micro-batch (compute %.6g "
                     "s, sends %.0f B), memory %.0f B\n",
                     k, p->dev[k], s->n_ops, s->first, s->last, s->sec, s->comp,
                     k < p->P - 1 ? s->cut : 0.0, s->mem);
    }
    if (rc >= 0)
        rc = fprintf(f, "  slowest stage %.6g s; step %.6g s; bubble %.1f%%\n", p->slowest, p->step,
                     100 * p->bubble);
    return rc < 0 ? wf__err(WF_EIO, "wf_plan_print: write failed") : 0;
}
