/* sched/pfor.c: wf_parallel_for with lazy binary splitting.
 * Owns: the splitting policy. A worker holding a range splits it in half only while its
 * own deque is empty (Tzannes et al., "Lazy Binary Splitting", PPoPP 2010): if nobody has
 * stolen the last half it pushed, other workers are busy and splitting more would only add
 * tasks. Otherwise it runs 'grain' iterations and looks again. So the number of tasks adapts
 * to how hungry the other workers are, and never goes below 'grain' iterations a call.
 * Not here: reductions with fixed split points (ops/ owns those, so results do not depend
 * on the worker count). */
#include "internal.h"
#include "probes.h"

typedef struct pfor {
    wf_range_fn fn;
    void *ctx;
    int64_t grain;
    wf__group *grp;
    bool traced; /* called by a graph node while tracing: chunks carry its 'tctx' */
    wf__tctx tctx;
} pfor;

/* Lengths as unsigned: a range may span more than INT64_MAX iterations. */
static inline uint64_t span(int64_t lo, int64_t hi)
{
    return (uint64_t)hi - (uint64_t)lo;
}

static void range_loop(wf__worker *w, pfor *pf, int64_t lo, int64_t hi)
{
    uint64_t grain = (uint64_t)pf->grain;
    while (lo < hi) {
        if (WF_UNLIKELY(atomic_load_explicit(&pf->grp->err, memory_order_relaxed)))
            return;
        /* Split only into halves of at least 'grain' each. */
        if (span(lo, hi) / 2 >= grain && wf__deque_size(&w->dq) <= 0) {
            wf__task *t = wf__task_alloc(w->rt, w);
            if (t && wf__group_add(pf->grp, 1) < 0) {
                wf__task_free(w, t);
                t = NULL;
            }
            if (t) { /* else: no memory to split, so run it here */
                int64_t mid = (int64_t)((uint64_t)lo + span(lo, hi) / 2);
                t->kind = WF__TK_RANGE;
                t->grp = pf->grp;
                t->owner = pf;
                t->name = "parallel_for";
                t->u.r.lo = mid;
                t->u.r.hi = hi;
                wf__push_local(w, t);
                hi = mid;
                continue;
            }
        }
        /* A piece of 'grain' iterations, or all that is left if less than two pieces are: no
         * call ever gets fewer than 'grain' iterations unless the whole range is smaller. */
        uint64_t n = span(lo, hi) < 2 * grain ? span(lo, hi) : grain;
        int64_t end = (int64_t)((uint64_t)lo + n);
        w->fail_set = 0;
        int rc = pf->fn(pf->ctx, lo, end);
        if (WF_UNLIKELY(rc < 0)) {
            wf__group_fail(pf->grp, w, "parallel_for", rc);
            return;
        }
        lo = end;
    }
}

void wf__range_run(wf__worker *w, wf__task *t)
{
    pfor *pf = t->owner;
    wf__group *g = t->grp;
    int64_t lo = t->u.r.lo, hi = t->u.r.hi;
    wf__task_free(w, t);
    uint64_t t0 = w->ring ? wf__now_ns() : 0;
    WF_PROBE2(task_begin, w->index, "parallel_for");
    range_loop(w, pf, lo, hi);
    int rc = 0; /* a variable, not a constant: perf wants the same arguments at every site */
    WF_PROBE3(task_end, w->index, "parallel_for", rc);
    if (w->ring)
        wf__trace_event(w, WF__EV_TASK, t0 - w->rt->t_start, wf__now_ns() - w->rt->t_start,
                        "parallel_for", 0, pf->traced ? &pf->tctx : NULL);
    WF__INC(w, tasks_run, 1);
    wf__group_done(g, 1);
}

int wf_parallel_for(wf_runtime *rt, int64_t begin, int64_t end, int64_t grain, wf_range_fn fn,
                    void *ctx)
{
    if (!rt || !fn)
        return wf__err(WF_EINVAL, "wf_parallel_for: %s is NULL", rt ? "fn" : "rt");
    if (end < begin || grain < 0)
        return wf__err(WF_EINVAL, "wf_parallel_for: bad range [%lld, %lld) or grain %lld",
                       (long long)begin, (long long)end, (long long)grain);
    if (end == begin)
        return 0;
    if (grain == 0) {
        uint64_t g = span(begin, end) / ((uint64_t)rt->nw * 64);
        grain = g < 1 ? 1 : g > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)g;
    }
    wf_group g;
    if (wf_group_init(&g, rt) < 0) /* cannot fail: both arguments are set */
        return WF_EINVAL;
    pfor pf = { fn, ctx, grain, (wf__group *)&g, false, { 0 } };
    wf__worker *w = wf__worker_of(rt);
    /* Chunks run for a graph node are that node's time in a trace (weft-trace adds them to
     * its op kind), wherever they run. */
    if (w && w->ring && w->current && w->current->kind == WF__TK_GRAPH) {
        wf__graph_trace_ctx(w->current, &pf.tctx);
        pf.tctx.chunk = true;
        pf.traced = true;
    }
    if (w) {
        range_loop(w, &pf, begin, end);
    } else {
        wf__task *t = wf__task_alloc(rt, NULL);
        if (!t) {
            wf_group_deinit(&g);
            return wf__err(WF_ENOMEM, "wf_parallel_for: no memory for a task");
        }
        t->kind = WF__TK_RANGE;
        t->grp = pf.grp;
        t->owner = &pf;
        t->name = "parallel_for";
        t->u.r.lo = begin;
        t->u.r.hi = end;
        wf__group_add(pf.grp, 1);
        wf__submit_outside(rt, t);
    }
    int rc = wf__group_wait(pf.grp);
    if (rc < 0)
        wf__err(rc, "%s", wf_group_errmsg(&g));
    wf_group_deinit(&g);
    return rc;
}
