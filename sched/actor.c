/* sched/actor.c: actors: a mailbox (an intrusive MPSC queue, after D. Vyukov) plus a handler.
 * Owns: the mailbox, the one task that runs the actor's turns (embedded: scheduling an actor
 * allocates nothing), the poke message, and the actor's first error.
 * Invariant: 'count' is the number of messages sent and not yet handled (pokes included).
 * The sender that moves it from 0 to 1 schedules the turn; the turn that moves it back to 0
 * ends; so at most one turn runs, and messages of one sender are handled in send order.
 * A turn handles at most 'batch' messages, then queues itself again (without touching
 * 'count') so actors share workers fairly.
 * Not here: what handlers do (a CUDA device, the transport); how a bound task reaches its
 * worker (the inboxes of worker.c). */
#include "internal.h"
#include "probes.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct wf_actor {
    wf__task task; /* first: the embedded turn */
    wf_runtime *rt;
    wf_actor_fn handler;
    void *ctx;
    int bind, bind_index;
    uint32_t batch;
    _Alignas(WF_CACHELINE) _Atomic(wf_msg *) head; /* producers */
    _Atomic int64_t count;
    _Alignas(WF_CACHELINE) wf_msg *tail; /* the consumer (the running turn) */
    wf_msg stub;
    wf_msg poke;
    _Atomic int poke_queued;
    _Atomic int running; /* turns between their start and their last touch */
    _Atomic int32_t status;
    char name[48];
    char errmsg[WF_ERRMSG_MAX];
};

/* Mailbox: push is wait-free; pop may see a producer between its exchange and its link, and
 * then returns NULL although 'count' says a message exists: the caller retries. */
static void mb_push(wf_actor *a, wf_msg *m)
{
    atomic_store_explicit((_Atomic(wf_msg *) *)&m->next_, NULL, memory_order_relaxed);
    wf_msg *prev = atomic_exchange_explicit(&a->head, m, memory_order_acq_rel);
    atomic_store_explicit((_Atomic(wf_msg *) *)&prev->next_, m, memory_order_release);
}

static wf_msg *mb_next(wf_msg *m)
{
    return atomic_load_explicit((_Atomic(wf_msg *) *)&m->next_, memory_order_acquire);
}

static wf_msg *mb_pop(wf_actor *a)
{
    wf_msg *tail = a->tail, *next = mb_next(tail);
    if (tail == &a->stub) {
        if (!next)
            return NULL;
        a->tail = tail = next;
        next = mb_next(next);
    }
    if (next) {
        a->tail = next;
        return tail;
    }
    if (tail != atomic_load_explicit(&a->head, memory_order_acquire))
        return NULL;
    mb_push(a, &a->stub);
    next = mb_next(tail);
    if (next) {
        a->tail = next;
        return tail;
    }
    return NULL;
}

int wf_actor_create(wf_runtime *rt, const wf_actor_opts *o, wf_actor **out)
{
    if (!out)
        return wf__err(WF_EINVAL, "wf_actor_create: out is NULL");
    *out = NULL;
    if (!rt || !o || !o->handler)
        return wf__err(WF_EINVAL, "wf_actor_create: %s",
                       !rt  ? "rt is NULL"
                       : !o ? "opts is NULL"
                            : "opts.handler is NULL");
    if (o->bind == WF_BIND_WORKER && (o->bind_index < 0 || o->bind_index >= rt->nw))
        return wf__err(WF_EINVAL, "wf_actor_create: bind_index %d is not a worker (0..%d)",
                       o->bind_index, rt->nw - 1);
    if (o->bind == WF_BIND_NUMA && (o->bind_index < 0 || o->bind_index >= rt->nnuma))
        return wf__err(WF_EINVAL, "wf_actor_create: bind_index %d is not a NUMA node (0..%d)",
                       o->bind_index, rt->nnuma - 1);
    if (o->bind != WF_BIND_ANY && o->bind != WF_BIND_WORKER && o->bind != WF_BIND_NUMA)
        return wf__err(WF_EINVAL, "wf_actor_create: bind %d is not a WF_BIND_* value", o->bind);
    wf_actor *a =
        aligned_alloc(WF_CACHELINE, (sizeof *a + WF_CACHELINE - 1) & ~(size_t)(WF_CACHELINE - 1));
    if (!a)
        return wf__err(WF_ENOMEM, "wf_actor_create: no memory");
    memset(a, 0, sizeof *a);
    a->rt = rt;
    a->handler = o->handler;
    a->ctx = o->ctx;
    a->bind = o->bind;
    a->bind_index = o->bind_index;
    a->batch = o->batch ? o->batch : 64;
    snprintf(a->name, sizeof a->name, "%s", o->name ? o->name : "actor");
    a->task.kind = WF__TK_ACTOR;
    a->task.owner = a;
    a->task.name = a->name;
    atomic_init(&a->head, &a->stub);
    a->tail = &a->stub;
    atomic_init(&a->count, 0);
    *out = a;
    return 0;
}

/* Queues the actor's turn. 'yield': the turn follows a full batch, so it goes behind the
 * work already waiting (a FIFO inbox), not on top of the LIFO deque. Everything needed is
 * read before the put: once queued, the turn may run, and the actor be destroyed, before
 * this returns. */
static void schedule(wf_actor *a, bool yield)
{
    wf_runtime *rt = a->rt;
    wf__worker *w = wf__worker_of(rt);
    wf__task *t = &a->task;
    int bind = a->bind, idx = a->bind_index;
    switch (bind) {
    case WF_BIND_WORKER:
        wf__inbox_put(&rt->w[idx]->inbox, t);
        if (!w || w->index != idx)
            wf__notify_all(rt); /* only that worker can take it: wake them all */
        break;
    case WF_BIND_NUMA:
        wf__inbox_put(&rt->nodes[idx].bound, t);
        if (!w || w->numa != idx)
            wf__notify_all(rt);
        break;
    default:
        if (w && yield) {
            wf__inbox_put(&rt->nodes[w->numa].open, t);
            wf__notify_one(rt);
        } else if (w) {
            wf__push_local(w, t);
        } else {
            wf__submit_outside(rt, t);
        }
    }
}

int wf_actor_send(wf_actor *a, wf_msg *m)
{
    if (WF_UNLIKELY(!a || !m))
        return wf__err(WF_EINVAL, "wf_actor_send: %s is NULL", a ? "msg" : "actor");
    mb_push(a, m);
    if (atomic_fetch_add_explicit(&a->count, 1, memory_order_acq_rel) == 0)
        schedule(a, false);
    return 0;
}

int wf_actor_poke(wf_actor *a)
{
    if (!a)
        return wf__err(WF_EINVAL, "wf_actor_poke: actor is NULL");
    if (atomic_exchange_explicit(&a->poke_queued, 1, memory_order_acq_rel))
        return 0; /* a poke is already waiting: this one merges into it */
    return wf_actor_send(a, &a->poke);
}

wf_runtime *wf__actor_runtime(const wf_actor *a)
{
    return a->rt;
}

int wf_actor_status(const wf_actor *a)
{
    return a ? atomic_load_explicit(&a->status, memory_order_acquire) : WF_EINVAL;
}

const char *wf_actor_errmsg(const wf_actor *a)
{
    return a && atomic_load_explicit(&a->status, memory_order_acquire) ? a->errmsg : "";
}

void wf__actor_turn(wf__worker *w, wf__task *t)
{
    wf_actor *a = t->owner;
    atomic_fetch_add_explicit(&a->running, 1, memory_order_acq_rel);
    uint64_t t0 = w->ring ? wf__now_ns() : 0;
    uint32_t handled = 0;
    bool more;
    WF_PROBE2(actor_msg, w->index, a->name);
    do {
        wf_msg *m;
        while (!(m = mb_pop(a)))
            wf__cpu_relax(); /* a sender is between its exchange and its link */
        if (m == &a->poke) {
            atomic_store_explicit(&a->poke_queued, 0, memory_order_release);
            m = NULL;
        }
        w->fail_set = 0;
        int rc = a->handler(a, m, a->ctx);
        if (WF_UNLIKELY(rc < 0) && atomic_load_explicit(&a->status, memory_order_relaxed) == 0) {
            /* Turns never overlap: the message is written before the code is published. */
            snprintf(a->errmsg, sizeof a->errmsg, "actor '%s': %s", a->name,
                     w->fail_set ? w->failmsg : wf_strerror(rc));
            atomic_store_explicit(&a->status, rc, memory_order_release);
        }
        handled++;
        more = atomic_fetch_sub_explicit(&a->count, 1, memory_order_acq_rel) > 1;
    } while (more && handled < a->batch);
    WF__INC(w, actor_msgs, handled);
    WF__INC(w, tasks_run, 1);
    if (w->ring)
        wf__trace_event(w, WF__EV_ACTOR, t0 - w->rt->t_start, wf__now_ns() - w->rt->t_start,
                        a->name, handled, NULL);
    if (more)
        schedule(a, true); /* 'count' still holds our messages: nobody else schedules */
    /* The last touch of 'a': wf_actor_destroy() waits for 'count' and then 'running' to be 0
     * (a counter, since the next turn may start on another worker before this one ends). */
    atomic_fetch_sub_explicit(&a->running, 1, memory_order_release);
}

void wf_actor_destroy(wf_actor *a)
{
    if (!a)
        return;
    wf__worker *w = wf__worker_of(a->rt);
    while (atomic_load_explicit(&a->count, memory_order_acquire) != 0 ||
           atomic_load_explicit(&a->running, memory_order_acquire)) {
        wf__task *t = w ? wf__find_task(w) : NULL;
        if (!t && w)
            t = wf__steal_round(w);
        if (t) {
            wf__run_task(w, t);
        } else {
            struct timespec ts = { 0, 20000 };
            nanosleep(&ts, NULL);
        }
    }
    free(a);
}
