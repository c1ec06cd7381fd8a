/* tools/trace_analyze.c: what weft-trace computes from a trace's events.
 * Owns the definitions of the numbers it reports:
 * - busy time of a worker: the union of its task and actor spans. Spans on one worker nest
 *   (a node that waits for its parallel_for runs other tasks inside its own span), so each
 *   instant of that union is given to the innermost span open then (a sweep over the spans in
 *   start order with a stack). That is an op kind's self time, and the kinds' self times add
 *   up to the busy time exactly;
 * - network transfers ("cat":"transfer"): counted, with their bytes and time, by name; not
 *   busy time and no op kind's (the worker that records one may run tasks while it lasts);
 * - idle time: the trace's extent (first start to last end, over all workers) minus busy;
 *   parks are the part of it spent asleep;
 * - a step: one run of one task graph (args "graph", "run"); by default the graph with the
 *   most runs (a training loop's step);
 * - the critical path of a step: its longest chain of dependent work (trace_data.h), found
 *   from the "crit" links the trace carries. Each link's wait is the time from the
 *   predecessor's end to the node's start (a ready node waiting for a worker, or for another
 *   predecessor that ended later). Traces without "crit" follow "after" (the predecessor
 *   whose end released the node) back from the run's last node instead.
 * Not here: reading the file (trace_parse.c), printing (trace_report.c, trace_svg.c). */
#include "trace_data.h"

#include <stdlib.h>
#include <string.h>

/* The kind an event counts under: args.kind; else "actor:<name>" for actor turns; else the
 * name without a trailing "_<digits>" (an automatic node name: "matmul_12" -> "matmul"). */
static int kind_of(tr_trace *t, const tr_event *e)
{
    if (e->kind >= 0)
        return e->kind;
    const char *n = t->str[e->name];
    size_t len = strlen(n);
    if (e->cat == TR_ACTOR) {
        char buf[256];
        snprintf(buf, sizeof buf, "actor:%s", n);
        return tr_intern(t, buf, strlen(buf));
    }
    size_t k = len;
    while (k > 0 && n[k - 1] >= '0' && n[k - 1] <= '9')
        k--;
    if (k > 1 && k < len && n[k - 1] == '_')
        return tr_intern(t, n, k - 1);
    return e->name;
}

/* Comparators of event indices: 'ev' is the events array (qsort_r's argument). */
static int by_start(const void *a, const void *b, void *ev)
{
    const tr_event *x = (const tr_event *)ev + *(const size_t *)a,
                   *y = (const tr_event *)ev + *(const size_t *)b;
    if (x->tid != y->tid)
        return x->tid < y->tid ? -1 : 1;
    if (x->ts != y->ts)
        return x->ts < y->ts ? -1 : 1;
    if (x->dur != y->dur) /* the outer of two spans that start together first */
        return x->dur > y->dur ? -1 : 1;
    return *(const size_t *)a < *(const size_t *)b ? -1 : 1;
}

static int by_run(const void *a, const void *b, void *ev)
{
    const tr_event *x = (const tr_event *)ev + *(const size_t *)a,
                   *y = (const tr_event *)ev + *(const size_t *)b;
    if (x->graph != y->graph)
        return x->graph < y->graph ? -1 : 1;
    if (x->run != y->run)
        return x->run < y->run ? -1 : 1;
    if (x->ts != y->ts)
        return x->ts < y->ts ? -1 : 1;
    return *(const size_t *)a < *(const size_t *)b ? -1 : 1;
}

static int by_total(const void *a, const void *b)
{
    const tr_kind_stat *x = a, *y = b;
    if (x->total != y->total)
        return x->total > y->total ? -1 : 1;
    return x->kind < y->kind ? -1 : 1;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static bool is_busy(const tr_event *e)
{
    return e->cat == TR_TASK || e->cat == TR_ACTOR;
}

static tr_worker_stat *worker(tr_summary *s, int tid)
{
    for (int i = 0; i < s->nworkers; i++)
        if (s->workers[i].tid == tid)
            return &s->workers[i];
    return NULL;
}

/* Counts transfer 'e' under its name. 0, or -1 (no memory). */
static int add_xfer(tr_summary *s, const tr_event *e)
{
    int i = 0;
    while (i < s->nxfers && s->xfers[i].name != e->name)
        i++;
    if (i == s->nxfers) {
        tr_xfer_stat *n = realloc(s->xfers, (size_t)(i + 1) * sizeof *n);
        if (!n)
            return -1;
        s->xfers = n;
        s->xfers[s->nxfers++] = (tr_xfer_stat){ .name = e->name };
    }
    s->xfers[i].count++;
    s->xfers[i].bytes += e->bytes;
    s->xfers[i].total += e->dur;
    return 0;
}

static int xfer_by_total(const void *a, const void *b)
{
    const tr_xfer_stat *x = a, *y = b;
    if (x->total != y->total)
        return x->total > y->total ? -1 : 1;
    return x->name < y->name ? -1 : 1;
}

/* Self time per kind and busy time per worker: the sweep described at the top. */
static int sweep(const tr_trace *t, const int *ekind, tr_summary *s, double *self)
{
    size_t n = 0, *ix = malloc((t->n ? t->n : 1) * sizeof *ix);
    size_t *stack = malloc((t->n ? t->n : 1) * sizeof *stack);
    if (!ix || !stack) {
        free(ix);
        free(stack);
        return -1;
    }
    for (size_t i = 0; i < t->n; i++)
        if (is_busy(&t->ev[i]))
            ix[n++] = i;
    qsort_r(ix, n, sizeof *ix, by_start, t->ev);
    size_t k = 0;
    while (k < n) {
        int tid = t->ev[ix[k]].tid;
        tr_worker_stat *w = worker(s, tid);
        size_t top = 0;
        double cur = t->ev[ix[k]].ts, busy = 0;
        for (; k < n && t->ev[ix[k]].tid == tid; k++) {
            const tr_event *e = &t->ev[ix[k]];
            while (top > 0) {
                const tr_event *o = &t->ev[stack[top - 1]];
                double end = o->ts + o->dur;
                if (end > e->ts)
                    break;
                if (end > cur) {
                    self[stack[top - 1]] += end - cur;
                    busy += end - cur;
                    cur = end;
                }
                top--;
            }
            /* 'cur' <= e->ts here: it only moves to starts and to ends before e->ts */
            if (top > 0) {
                self[stack[top - 1]] += e->ts - cur;
                busy += e->ts - cur;
            }
            cur = e->ts;
            stack[top++] = ix[k];
        }
        while (top > 0) {
            const tr_event *o = &t->ev[stack[--top]];
            double end = o->ts + o->dur;
            if (end > cur) {
                self[stack[top]] += end - cur;
                busy += end - cur;
                cur = end;
            }
        }
        if (w)
            w->busy = busy;
        s->busy += busy;
    }
    for (size_t i = 0; i < t->n; i++)
        if (is_busy(&t->ev[i]))
            s->kinds[ekind[i]].total += self[i];
    free(ix);
    free(stack);
    return 0;
}

/* The node event that 'e' links back to (its "crit", or its "after" without one) in the
 * run mapped by 'map', or 'none'; '*missing' when it links to an event not in the trace. */
static size_t link_of(const tr_event *e, const size_t *map, size_t mapcap, bool *missing)
{
    int32_t l = e->crit >= -1 ? e->crit : e->after;
    *missing = l >= 0 && ((size_t)l >= mapcap || map[l] == (size_t)-1);
    return l >= 0 && !*missing ? map[l] : (size_t)-1;
}

/* The critical path of run 'r' (trace_data.h) into 'out' (room for r->nodes); returns its
 * length, and sets '*cut' when a predecessor's event is missing (overwritten in the ring).
 * 'map' and 'work' have room for the run's node ids. Events of a run are in start order,
 * and a node starts after its predecessors end, so one pass sums the chains. */
static int critical_path(const tr_trace *t, const tr_summary *s, const tr_run *r, size_t *map,
                         double *work, size_t mapcap, tr_path_node *out, bool *cut)
{
    const size_t none = (size_t)-1;
    for (size_t i = 0; i < mapcap; i++)
        map[i] = none;
    size_t end = none;
    for (size_t k = 0; k < r->count; k++) {
        size_t i = s->by_run[r->first + k];
        const tr_event *e = &t->ev[i];
        if (e->chunk || e->node < 0 || (size_t)e->node >= mapcap)
            continue;
        bool missing;
        size_t l = link_of(e, map, mapcap, &missing);
        work[e->node] = e->dur + (l != none ? work[t->ev[l].node] : 0);
        map[e->node] = i;
        /* the end: the most work behind it; without "crit", the last to end */
        if (end == none || (e->crit >= -1 ? work[e->node] > work[t->ev[end].node]
                                          : e->ts + e->dur > t->ev[end].ts + t->ev[end].dur))
            end = i;
    }
    int n = 0;
    *cut = false;
    for (size_t cur = end; cur != none && n < r->nodes;) {
        const tr_event *e = &t->ev[cur];
        bool missing;
        size_t prev = link_of(e, map, mapcap, &missing);
        *cut |= missing;
        double from = prev != none ? t->ev[prev].ts + t->ev[prev].dur : r->t0;
        out[n++] = (tr_path_node){ cur, e->ts - from };
        cur = prev;
    }
    for (int i = 0; i < n / 2; i++) { /* first node first */
        tr_path_node x = out[i];
        out[i] = out[n - 1 - i];
        out[n - 1 - i] = x;
    }
    return n;
}

static int runs(const tr_trace *t, tr_summary *s)
{
    size_t n = 0;
    for (size_t i = 0; i < t->n; i++)
        n += t->ev[i].graph != 0;
    s->by_run = malloc((n ? n : 1) * sizeof *s->by_run);
    if (!s->by_run)
        return -1;
    n = 0;
    for (size_t i = 0; i < t->n; i++)
        if (t->ev[i].graph != 0)
            s->by_run[n++] = i;
    qsort_r(s->by_run, n, sizeof *s->by_run, by_run, t->ev);
    size_t cap = 0;
    for (size_t k = 0; k < n;) {
        const tr_event *e0 = &t->ev[s->by_run[k]];
        if (s->nruns == cap) {
            cap = cap ? 2 * cap : 64;
            tr_run *nr = realloc(s->runs, cap * sizeof *nr);
            if (!nr)
                return -1;
            s->runs = nr;
        }
        tr_run *r = &s->runs[s->nruns++];
        *r = (tr_run){ e0->graph, e0->run, e0->ts, e0->ts + e0->dur, k, 0, 0 };
        for (; k < n; k++) {
            const tr_event *e = &t->ev[s->by_run[k]];
            if (e->graph != r->graph || e->run != r->run)
                break;
            r->count++;
            r->nodes += !e->chunk;
            if (e->ts < r->t0)
                r->t0 = e->ts;
            if (e->ts + e->dur > r->t1)
                r->t1 = e->ts + e->dur;
        }
    }
    return 0;
}

static int steps(const tr_trace *t, const tr_opts *o, tr_summary *s, const int *ekind, char *err,
                 size_t errlen)
{
    if (s->nruns == 0) {
        if (o->graph >= 0 || o->step >= 0) {
            snprintf(err, errlen,
                     "the trace has no task graph runs (no events with \"graph\" and \"run\" "
                     "args), so --graph and --step have nothing to choose");
            return -1;
        }
        return 0;
    }
    if (o->graph >= 0) {
        s->graph = (uint32_t)o->graph;
    } else { /* the graph with the most runs */
        long best = 0;
        for (size_t i = 0; i < s->nruns;) {
            size_t j = i;
            while (j < s->nruns && s->runs[j].graph == s->runs[i].graph)
                j++;
            if ((long)(j - i) > best) {
                best = (long)(j - i);
                s->graph = s->runs[i].graph;
            }
            i = j;
        }
    }
    size_t first = 0;
    while (first < s->nruns && s->runs[first].graph != s->graph)
        first++;
    size_t end = first;
    while (end < s->nruns && s->runs[end].graph == s->graph)
        end++;
    if (first == end) {
        snprintf(err, errlen, "--graph %ld: no such graph in the trace (graphs %u to %u)", o->graph,
                 s->runs[0].graph, s->runs[s->nruns - 1].graph);
        return -1;
    }
    s->steps = (long)(end - first);
    double *len = malloc((size_t)s->steps * sizeof *len);
    if (!len)
        return -1;
    double sum = 0;
    int maxnodes = 0;
    int32_t maxnode = 0;
    for (size_t i = first; i < end; i++) {
        len[i - first] = s->runs[i].t1 - s->runs[i].t0;
        sum += len[i - first];
        if (s->runs[i].nodes > maxnodes)
            maxnodes = s->runs[i].nodes;
        for (size_t k = 0; k < s->runs[i].count; k++) {
            int32_t nd = t->ev[s->by_run[s->runs[i].first + k]].node;
            if (nd > maxnode)
                maxnode = nd;
        }
    }
    s->step_mean = sum / (double)s->steps;
    double *sorted = malloc((size_t)s->steps * sizeof *sorted);
    if (!sorted) {
        free(len);
        return -1;
    }
    memcpy(sorted, len, (size_t)s->steps * sizeof *sorted);
    qsort(sorted, (size_t)s->steps, sizeof *sorted, cmp_double);
    s->step_min = sorted[0];
    s->step_max = sorted[s->steps - 1];
    s->step_median = sorted[(s->steps - 1) / 2];
    s->step = first;
    if (o->step >= 0) {
        while (s->step < end && s->runs[s->step].run != (uint32_t)o->step)
            s->step++;
        if (s->step == end) {
            snprintf(err, errlen,
                     "--step %ld: graph %u has no such run in the trace (runs %u to %u are)",
                     o->step, s->graph, s->runs[first].run, s->runs[end - 1].run);
            free(len);
            free(sorted);
            return -1;
        }
    } else {
        while (len[s->step - first] != s->step_median)
            s->step++;
    }
    free(sorted);
    free(len);
    /* Every step's critical path: by kind, and the shown step's in full. */
    size_t mapcap = (size_t)maxnode + 1;
    size_t *map = malloc(mapcap * sizeof *map);
    double *work = malloc(mapcap * sizeof *work);
    tr_path_node *path = malloc((size_t)(maxnodes ? maxnodes : 1) * sizeof *path);
    s->path = malloc((size_t)(maxnodes ? maxnodes : 1) * sizeof *s->path);
    double *pk = calloc((size_t)t->nstr, sizeof *pk);
    if (!map || !work || !path || !s->path || !pk) {
        free(map);
        free(work);
        free(path);
        free(pk);
        return -1;
    }
    for (size_t i = first; i < end; i++) {
        bool cut;
        int n = critical_path(t, s, &s->runs[i], map, work, mapcap, path, &cut);
        for (int k = 0; k < n; k++) {
            const tr_event *e = &t->ev[path[k].ev];
            pk[ekind[path[k].ev]] += e->dur;
            s->path_busy_all += e->dur;
        }
        s->step_total_all += s->runs[i].t1 - s->runs[i].t0;
        if (i == s->step) {
            memcpy(s->path, path, (size_t)n * sizeof *path);
            s->npath = n;
            s->path_cut = cut;
            s->by_after = n > 0 && t->ev[path[n - 1].ev].crit < -1;
        }
    }
    int nk = 0;
    for (int k = 0; k < t->nstr; k++)
        nk += pk[k] > 0;
    s->pkind = malloc((size_t)(nk ? nk : 1) * sizeof *s->pkind);
    if (s->pkind) {
        for (int k = 0; k < t->nstr; k++)
            if (pk[k] > 0)
                s->pkind[s->npkind++] = (tr_kind_stat){ k, 0, pk[k] };
        qsort(s->pkind, (size_t)s->npkind, sizeof *s->pkind, by_total);
    }
    free(map);
    free(work);
    free(path);
    free(pk);
    return s->pkind ? 0 : -1;
}

int tr_analyze(const tr_trace *tc, const tr_opts *o, tr_summary *s, char *err, size_t errlen)
{
    tr_trace *t = (tr_trace *)tc; /* kind_of() interns derived kinds */
    memset(s, 0, sizeof *s);
    int *ekind = malloc((t->n ? t->n : 1) * sizeof *ekind);
    double *self = calloc(t->n ? t->n : 1, sizeof *self);
    s->workers = malloc((size_t)(t->nthreads ? t->nthreads : 1) * sizeof *s->workers);
    int rc = -1;
    if (!ekind || !self || !s->workers)
        goto out;
    for (size_t i = 0; i < t->n; i++)
        if ((ekind[i] = kind_of(t, &t->ev[i])) < 0)
            goto out;
    for (int i = 0; i < t->nthreads; i++)
        s->workers[s->nworkers++] =
            (tr_worker_stat){ .tid = t->threads[i].tid, .name = t->threads[i].name };
    s->kinds = calloc((size_t)(t->nstr ? t->nstr : 1), sizeof *s->kinds);
    if (!s->kinds)
        goto out;
    s->t0 = t->n ? t->ev[0].ts : 0;
    s->t1 = s->t0;
    for (size_t i = 0; i < t->n; i++) {
        const tr_event *e = &t->ev[i];
        if (e->ts < s->t0)
            s->t0 = e->ts;
        if (e->ts + e->dur > s->t1)
            s->t1 = e->ts + e->dur;
        tr_worker_stat *w = worker(s, e->tid);
        if (e->cat == TR_PARK) {
            w->park += e->dur;
            w->parks++;
        } else if (e->cat == TR_STEAL) {
            w->steals++;
        } else if (e->cat == TR_XFER) {
            if (add_xfer(s, e) < 0)
                goto out;
        } else if (is_busy(e)) {
            w->tasks++;
            s->kinds[ekind[i]].count++;
        }
    }
    if (sweep(t, ekind, s, self) < 0)
        goto out;
    int nk = 0; /* the kinds that occur, by time */
    for (int k = 0; k < t->nstr; k++)
        if (s->kinds[k].count > 0) {
            s->kinds[k].kind = k;
            s->kinds[nk++] = s->kinds[k];
        }
    s->nkinds = nk;
    qsort(s->kinds, (size_t)nk, sizeof *s->kinds, by_total);
    if (s->nxfers)
        qsort(s->xfers, (size_t)s->nxfers, sizeof *s->xfers, xfer_by_total);
    if (runs(t, s) < 0)
        goto out;
    err[0] = '\0';
    rc = steps(t, o, s, ekind, err, errlen);
out:
    if (rc < 0 && !err[0])
        snprintf(err, errlen, "no memory to summarise %zu events", t->n);
    free(ekind);
    free(self);
    if (rc < 0)
        tr_summary_free(s);
    return rc;
}

void tr_summary_free(tr_summary *s)
{
    free(s->kinds);
    free(s->xfers);
    free(s->workers);
    free(s->runs);
    free(s->by_run);
    free(s->path);
    free(s->pkind);
    memset(s, 0, sizeof *s);
}
