/* sched/worker.c: what a worker does: find a task, run it, steal, park.
 * Owns: the worker loop, the order in which places are searched (own inbox, own deque,
 * own node's inboxes, victims nearest first, other nodes' inboxes), the searching/parking
 * policy, and the dispatch of a task to its kind.
 * Policy (after Go's scheduler): a worker that runs out of work becomes a searcher for at
 * most 'spin_ns', then parks. A push from a worker wakes a sleeper only when nobody is
 * searching; a searcher that finds work, if it was the last one, wakes another. So one thief
 * stays awake while work exists and the rest sleep (idle workers burn no CPU). Pushes from a
 * worker skip the seq_cst fence: if their wake-up is missed, the pushing worker runs the
 * task itself. Every push from outside a worker notifies with the fence (an inbox task may
 * be the only work there is).
 * Not here: the event count (park.c), groups (task.c). */
#include "internal.h"
#include "probes.h"

#include <stdlib.h>
#include <time.h>

_Thread_local wf__worker *wf__self __attribute__((tls_model("initial-exec")));

void wf__push_local(wf__worker *w, wf__task *t)
{
    if (WF_UNLIKELY(wf__deque_push(&w->dq, t) < 0))
        wf__inbox_put(&w->inbox, t); /* could not grow: this worker still runs it */
    WF__INC(w, spawned, 1);
    wf_runtime *rt = w->rt;
    if (atomic_load_explicit(&rt->n_sleeping, memory_order_relaxed) > 0 &&
        atomic_load_explicit(&rt->n_searching, memory_order_relaxed) == 0)
        wf__notify_one(rt);
}

void wf__submit_outside(wf_runtime *rt, wf__task *t)
{
    uint32_t k = atomic_fetch_add_explicit(&rt->rr, 1, memory_order_relaxed);
    wf__inbox_put(&rt->nodes[k % (uint32_t)rt->nnuma].open, t);
    wf__notify_one(rt);
}

static wf__task *node_inboxes(wf__worker *w)
{
    wf__node *nd = &w->rt->nodes[w->numa];
    wf__task *t = wf__inbox_take(&nd->bound);
    if (!t)
        t = wf__inbox_take(&nd->open);
    if (t)
        WF__INC(w, inbox_taken, 1);
    return t;
}

/* Work of this worker and its node, without stealing. The node's inboxes go first every
 * other task while they hold work (wf__inbox_take() reads a count without the lock first), so
 * an actor poked from outside (the transport's, whose completions a rank's pipeline waits
 * for) or an outside submission waits at most a task or two behind a long run of local
 * tasks: looked at only every 64 tasks, sends of a pipeline stage whose one worker was busy
 * completed 12-44 ms late. Every other task only, so that an actor that yields behind its
 * full batches cannot starve the deque either. */
wf__task *wf__find_task(wf__worker *w)
{
    wf__task *t;
    if ((t = wf__inbox_take(&w->inbox))) /* it reads the count before it locks */
        return t;
    if ((++w->tick & 1) && (t = node_inboxes(w)))
        return t;
    if ((t = wf__deque_take(&w->dq)))
        return t;
    return node_inboxes(w);
}

static inline uint64_t next_rand(wf__worker *w)
{
    w->rng ^= w->rng << 13;
    w->rng ^= w->rng >> 7;
    w->rng ^= w->rng << 17;
    return w->rng;
}

/* One pass over the victims, nearest tier first, starting at a random victim within each
 * tier; then the open inboxes of the other nodes. */
wf__task *wf__steal_round(wf__worker *w)
{
    wf_runtime *rt = w->rt;
    int lo = 0;
    for (int k = 0; k < w->ntiers; k++) {
        int hi = w->tier_end[k], n = hi - lo;
        int start = (int)(next_rand(w) % (uint64_t)n);
        for (int j = 0; j < n; j++) {
            wf__worker *v = rt->w[w->victims[lo + (start + j) % n]];
            if (wf__deque_size(&v->dq) <= 0)
                continue;
            bool lost;
            WF__INC(w, steals_tried, 1);
            wf__task *t = wf__deque_steal(&v->dq, &lost);
            if (t) {
                if (v->numa == w->numa)
                    WF__INC(w, steals_won_local, 1);
                else
                    WF__INC(w, steals_won_remote, 1);
                WF_PROBE2(steal, w->index, v->index);
                if (w->ring) {
                    uint64_t now = wf__now_ns() - rt->t_start;
                    wf__trace_event(w, WF__EV_STEAL, now, now, t->name, (uint32_t)v->index, NULL);
                }
                return t;
            }
        }
        lo = hi;
    }
    for (int k = 1; k < rt->nnuma; k++) {
        wf__node *nd = &rt->nodes[(w->numa + k) % rt->nnuma];
        wf__task *t = wf__inbox_take(&nd->open);
        if (t) {
            WF__INC(w, inbox_taken, 1);
            return t;
        }
    }
    return NULL;
}

/* After wf__ec_prepare(): is there anything this worker could run? */
bool wf__work_visible(wf__worker *w)
{
    wf_runtime *rt = w->rt;
    if (atomic_load_explicit(&w->inbox.n, memory_order_relaxed) ||
        atomic_load_explicit(&rt->nodes[w->numa].bound.n, memory_order_relaxed))
        return true;
    for (int i = 0; i < rt->nw; i++)
        if (wf__deque_size(&rt->w[i]->dq) > 0)
            return true;
    for (int k = 0; k < rt->nnuma; k++)
        if (atomic_load_explicit(&rt->nodes[k].open.n, memory_order_relaxed))
            return true;
    return false;
}

/* Tiny stolen tasks: moving a task between cores costs a few cache misses (~300 ns on these
 * VMs, both sides). When what this worker stole ran shorter than that, stealing again at
 * once would cost the victim more than it saves (a fan-out of empty tasks ran 3x slower on
 * 2 workers than on 1), so the thief waits 'steal_pause' first: doubling from 0.5 us up to
 * 8 us while stolen tasks stay tiny, and back to 0 as soon as one is not. Tasks of a
 * microsecond or more are stolen at full speed. */
#define TINY_TASK_NS 300
#define PAUSE_MIN_NS 500
#define PAUSE_MAX_NS 8000

static void steal_pause(wf__worker *w)
{
    if (w->steal_pause >= PAUSE_MAX_NS) {
        /* Still tiny after several doublings: sleep instead of spinning, since a spinning
         * hardware thread also slows its sibling (the 2 vCPUs here may share a core). */
        struct timespec ts = { 0, PAUSE_MAX_NS };
        nanosleep(&ts, NULL);
        return;
    }
    uint64_t until = wf__now_ns() + w->steal_pause;
    while (wf__now_ns() < until && !atomic_load_explicit(&w->inbox.n, memory_order_relaxed))
        for (int i = 0; i < 16; i++)
            wf__cpu_relax();
}

static wf__task *search(wf__worker *w)
{
    wf_runtime *rt = w->rt;
    if (w->steal_pause)
        steal_pause(w);
    atomic_fetch_add_explicit(&rt->n_searching, 1, memory_order_seq_cst);
    uint64_t t0 = 0;
    unsigned backoff = 1, rounds = 0;
    wf__task *t;
    for (;;) {
        if ((t = wf__steal_round(w)) || (t = wf__find_task(w)))
            break;
        wf__flush_done(w); /* nothing at hand: let waiters see what finished */
        if (atomic_load_explicit(&rt->stop, memory_order_relaxed))
            break;
        for (unsigned i = 0; i < backoff; i++)
            wf__cpu_relax();
        if (backoff < 64)
            backoff *= 2;
        if ((++rounds & 7) == 0) {
            uint64_t now = wf__now_ns();
            if (!t0)
                t0 = now;
            else if (now - t0 > rt->spin_ns)
                break;
        }
    }
    int32_t left = atomic_fetch_sub_explicit(&rt->n_searching, 1, memory_order_seq_cst) - 1;
    if (t && left == 0 && atomic_load_explicit(&rt->n_sleeping, memory_order_relaxed) > 0)
        wf__notify_one(rt);
    return t;
}

static void park(wf__worker *w)
{
    wf_runtime *rt = w->rt;
    wf__flush_done(w);
    uint64_t t0 = 0;
    for (;;) {
        uint32_t key = wf__ec_prepare(rt);
        if (atomic_load_explicit(&rt->stop, memory_order_seq_cst) || wf__work_visible(w)) {
            wf__ec_cancel(rt);
            break;
        }
        if (!t0) {
            t0 = wf__now_ns();
            atomic_store_explicit(&w->parked_at, t0, memory_order_relaxed);
            WF__INC(w, parks, 1);
            WF_PROBE1(park, w->index);
        }
        /* After a timeout, look once (above) and sleep again: no spinning search, so an
         * idle runtime costs a few microseconds per worker per timeout. */
        if (!wf__ec_commit(rt, key))
            break;
    }
    if (!t0)
        return;
    uint64_t t1 = wf__now_ns();
    WF__INC(w, idle_ns, t1 - t0);
    atomic_store_explicit(&w->parked_at, 0, memory_order_relaxed);
    WF_PROBE2(unpark, w->index, t1 - t0);
    if (w->ring)
        wf__trace_event(w, WF__EV_PARK, t0 - rt->t_start, t1 - rt->t_start, "park", 0, NULL);
}

void wf__run_body(wf__worker *w, wf__group *g, wf_task_fn fn, void *arg, const char *name)
{
    int rc = 0;
    uint64_t t0 = w->ring ? wf__now_ns() : 0;
    WF_PROBE2(task_begin, w->index, name);
    /* Whether the group failed, read once per 32 tasks of the same group: the group's line
     * also holds the counter its spawner increments, and a read here per task would pull
     * that line away from the spawner each time (35% of a fan-out's time in perf). A task
     * that starts a few tasks after the first failure may still run. */
    if (g != w->err_g || w->err_seen || (++w->err_tick & 31) == 0) { /* a failure: re-read */
        w->err_g = g;
        w->err_seen = atomic_load_explicit(&g->err, memory_order_relaxed);
    }
    if (WF_LIKELY(w->err_seen == 0)) {
        w->fail_set = 0;
        rc = fn(arg);
        if (WF_UNLIKELY(rc < 0))
            wf__group_fail(g, w, name, rc);
    }
    WF_PROBE3(task_end, w->index, name, rc);
    if (w->ring)
        wf__trace_event(w, WF__EV_TASK, t0 - w->rt->t_start, wf__now_ns() - w->rt->t_start, name,
                        (uint32_t)rc, NULL);
    WF__INC(w, tasks_run, 1);
}

void wf__run_task(wf__worker *w, wf__task *t)
{
    wf__task *prev = w->current;
    w->current = t;
    w->throttled = 0; /* a new task: its spawns look at the deque afresh */
    /* A task of another group may run long: do not make this group's waiter wait for it. */
    if ((w->done_n && (t->kind != WF__TK_PLAIN || t->grp != w->done_g)) ||
        (w->gdone_n && (t->kind != WF__TK_GRAPH || t->owner != w->gdone_graph)))
        wf__flush_done(w);
    switch (t->kind) {
    case WF__TK_PLAIN: {
        wf__group *g = t->grp;
        wf__run_body(w, g, t->u.f.fn, t->u.f.arg, t->name);
        wf__task_free(w, t);
        wf__done_later(w, g);
        break;
    }
    case WF__TK_GRAPH:
        wf__graph_run_node(w, t);
        break;
    case WF__TK_ACTOR:
        wf__actor_turn(w, t);
        break;
    case WF__TK_RANGE:
        wf__range_run(w, t);
        break;
    default:
        WF_ASSERT(0);
    }
    w->current = prev;
}

void *wf__worker_main(void *arg)
{
    wf__worker *w = arg;
    wf_runtime *rt = w->rt;
    wf__self = w;
    wf__topo_pin(rt, w);
    pthread_barrier_wait(&rt->ready);
    while (!atomic_load_explicit(&rt->stop, memory_order_acquire)) {
        wf__task *t = wf__find_task(w);
        if (t) {
            wf__run_task(w, t);
        } else if ((t = search(w))) {
            uint64_t t0 = wf__now_ns();
            wf__run_task(w, t);
            if (wf__now_ns() - t0 >= TINY_TASK_NS)
                w->steal_pause = 0;
            else if (w->steal_pause < PAUSE_MAX_NS)
                w->steal_pause = w->steal_pause ? 2 * w->steal_pause : PAUSE_MIN_NS;
        } else {
            w->steal_pause = 0;
            park(w);
        }
    }
    wf__flush_done(w);
    wf__self = NULL;
    return NULL;
}
