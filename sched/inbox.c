/* sched/inbox.c: FIFO queues of tasks submitted from outside a worker, or bound to one
 * worker or NUMA node.
 * Owns: nothing but the links; tasks belong to whoever takes them.
 * Invariant: 'n' equals the number of linked tasks whenever the lock is free; readers that
 * skip the lock use it only as a hint and take the lock before trusting it.
 * Not here: waking workers (park.c). A mutex is enough: these are the rare paths, the hot
 * path is the deque. */
#include "internal.h"

void wf__inbox_init(wf__inbox *q)
{
    pthread_mutex_init(&q->mu, NULL);
    q->head = q->tail = NULL;
    atomic_init(&q->n, 0);
}

void wf__inbox_deinit(wf__inbox *q)
{
    pthread_mutex_destroy(&q->mu);
}

void wf__inbox_put(wf__inbox *q, wf__task *t)
{
    t->next = NULL;
    pthread_mutex_lock(&q->mu);
    if (q->tail)
        q->tail->next = t;
    else
        q->head = t;
    q->tail = t;
    atomic_fetch_add_explicit(&q->n, 1, memory_order_seq_cst);
    pthread_mutex_unlock(&q->mu);
}

wf__task *wf__inbox_take(wf__inbox *q)
{
    if (atomic_load_explicit(&q->n, memory_order_relaxed) == 0)
        return NULL;
    pthread_mutex_lock(&q->mu);
    wf__task *t = q->head;
    if (t) {
        q->head = t->next;
        if (!q->head)
            q->tail = NULL;
        atomic_fetch_sub_explicit(&q->n, 1, memory_order_relaxed);
    }
    pthread_mutex_unlock(&q->mu);
    return t;
}
