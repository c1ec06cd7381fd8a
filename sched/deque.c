/* sched/deque.c: the Chase-Lev work-stealing deque of one worker.
 * Owns: the ring buffers of the deque, including the retired ones (kept until the deque
 * is freed, so a thief that read an old ring pointer still reads valid memory).
 * Invariant: only the owner calls push/take; anyone calls steal. Memory orders follow
 * Le et al., "Correct and Efficient Work-Stealing for Weak Memory Models" (PPoPP 2013),
 * except that push publishes 'bottom' with a release store instead of a release fence
 * (the same code on x86, and visible to ThreadSanitizer).
 * Not here: which victim to steal from (worker.c). */
#include "internal.h"

#include <stdlib.h>

static wf__ring *ring_new(int64_t cap)
{
    wf__ring *r = malloc(sizeof *r + (size_t)cap * sizeof r->buf[0]);
    if (!r)
        return NULL;
    r->cap = cap;
    r->retired = NULL;
    return r;
}

int wf__deque_init(wf__deque *d, int64_t cap)
{
    wf__ring *r = ring_new(cap);
    if (!r)
        return WF_ENOMEM;
    atomic_init(&d->top, 0);
    atomic_init(&d->bottom, 0);
    atomic_init(&d->ring, r);
    d->top_seen = 0;
    return 0;
}

void wf__deque_deinit(wf__deque *d)
{
    wf__ring *r = atomic_load_explicit(&d->ring, memory_order_relaxed);
    while (r) {
        wf__ring *old = r->retired;
        free(r);
        r = old;
    }
    atomic_store_explicit(&d->ring, NULL, memory_order_relaxed);
}

static wf__ring *grow(wf__deque *d, wf__ring *r, int64_t t, int64_t b)
{
    wf__ring *n = ring_new(r->cap * 2);
    if (!n)
        return NULL;
    for (int64_t i = t; i < b; i++) {
        wf__task *x = atomic_load_explicit(&r->buf[i & (r->cap - 1)], memory_order_relaxed);
        atomic_store_explicit(&n->buf[i & (n->cap - 1)], x, memory_order_relaxed);
    }
    n->retired = r;
    atomic_store_explicit(&d->ring, n, memory_order_release);
    return n;
}

int wf__deque_push(wf__deque *d, wf__task *t)
{
    int64_t b = atomic_load_explicit(&d->bottom, memory_order_relaxed);
    wf__ring *r = atomic_load_explicit(&d->ring, memory_order_relaxed);
    if (WF_UNLIKELY(b - d->top_seen > r->cap - 1)) {
        int64_t top = atomic_load_explicit(&d->top, memory_order_acquire);
        d->top_seen = top;
        if (b - top > r->cap - 1) {
            r = grow(d, r, top, b);
            if (!r)
                return WF_ENOMEM;
        }
    }
    atomic_store_explicit(&r->buf[b & (r->cap - 1)], t, memory_order_relaxed);
    atomic_store_explicit(&d->bottom, b + 1, memory_order_release);
    return 0;
}

wf__task *wf__deque_take(wf__deque *d)
{
    int64_t b = atomic_load_explicit(&d->bottom, memory_order_relaxed) - 1;
    wf__ring *r = atomic_load_explicit(&d->ring, memory_order_relaxed);
    int64_t t = atomic_load_explicit(&d->top, memory_order_relaxed);
    if (t > b) /* empty: no need to announce anything to thieves */
        return NULL;
    atomic_store_explicit(&d->bottom, b, memory_order_relaxed);
    atomic_thread_fence(memory_order_seq_cst);
    t = atomic_load_explicit(&d->top, memory_order_relaxed);
    wf__task *x = NULL;
    if (t <= b) {
        x = atomic_load_explicit(&r->buf[b & (r->cap - 1)], memory_order_relaxed);
        if (t == b) { /* the last item: race the thieves for it */
            if (!atomic_compare_exchange_strong_explicit(&d->top, &t, t + 1, memory_order_seq_cst,
                                                         memory_order_relaxed))
                x = NULL;
            atomic_store_explicit(&d->bottom, b + 1, memory_order_relaxed);
        }
    } else {
        atomic_store_explicit(&d->bottom, b + 1, memory_order_relaxed);
    }
    return x;
}

wf__task *wf__deque_steal(wf__deque *d, bool *lost_race)
{
    int64_t t = atomic_load_explicit(&d->top, memory_order_acquire);
    atomic_thread_fence(memory_order_seq_cst);
    int64_t b = atomic_load_explicit(&d->bottom, memory_order_acquire);
    *lost_race = false;
    if (t >= b)
        return NULL;
    wf__ring *r = atomic_load_explicit(&d->ring, memory_order_acquire);
    wf__task *x = atomic_load_explicit(&r->buf[t & (r->cap - 1)], memory_order_relaxed);
    if (!atomic_compare_exchange_strong_explicit(&d->top, &t, t + 1, memory_order_seq_cst,
                                                 memory_order_relaxed)) {
        *lost_race = true;
        return NULL;
    }
    return x;
}
