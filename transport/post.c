/* transport/post.c: posted transfers and the transport's actor (transport/post.h).
 * Owns: the comm's actor "weft-ucx" (made at the first post), its timer fd, and the life of
 *   every posted request: posted (queued for "weft-net", which hands it to UCX:
 *   wf__post_hand), progressed by "weft-net" (the worker's event fd, net.c), completed by UCX
 *   (on whichever thread drove progress: "weft-net", a waiter) and handed to the actor as a
 *   message, finished by the actor (trace span, callback, free).
 * Why "weft-net" and not a worker talks to UCX for them: a rank's transfers must move while
 *   its workers run long kernels. Posted by a worker's actor turn and progressed only in the
 *   actor's turns, a pipeline stage's sends waited for the worker: the turn went on the
 *   worker's deque under every task pushed after it, and the rendezvous of a 256 KiB
 *   activation needs the sender's progress to answer the receiver, which came only between
 *   tasks (measured: 80-byte headers 3-10 ms from post to completion, 256 KiB sends 12-44 ms,
 *   on a stage whose one worker was busy). And one thread, not several: UCX's worker lock
 *   (UCS_THREAD_MODE_MULTI) is a spin lock, and a worker that posted itself while "weft-net"
 *   progressed spun 2-16 ms whenever the holder was preempted on a loaded machine.
 * Invariants:
 *  - Only "weft-net" hands a posted request to UCX, and cancels them after a failure
 *    (wf__post_cancel(); "weft-net" drives the UCX worker's progress, so no completion of
 *    the same request runs on another thread meanwhile: UCX's ucp_request_cancel() reads the
 *    request's "completed" flag before taking the worker's lock, and a completion between
 *    the two trips its assertion, seen here as "tag_match.c:92 Assertion
 *    `!(req->flags & UCP_REQUEST_FLAG_COMPLETED)'" when the actor canceled on a worker);
 *    once "weft-net" is gone, wf__post_fini() cancels, on the thread that then progresses.
 *    Only the actor frees a request, so one being canceled cannot be freed under it; the UCX
 *    completion callback (ucx.c, complete()) only fills in the status under 'mu' and sends
 *    the request to the actor (wf_actor_send() never blocks or allocates). A completion that
 *    arrives while "weft-net" is still in the UCX call of the request ('in_post') is held by
 *    the actor and sent again by "weft-net" once the call returned.
 *  - A request is on 'posted' (mu) from its post until the actor finishes it, and on
 *    'to_hand' (mu) until "weft-net" takes it; its wf_msg carries only its completion.
 *  - The actor watches its timer fd while anything is posted: a poke (one after each batch
 *    handed to UCX, the timer) checks the deadlines (a missed one fails the comm, which
 *    wakes "weft-net" to cancel everything posted).
 * Not here: the UCX calls themselves (ucx.c), the control plane and the progress of the
 *   worker (net.c), what a transfer means to a graph (p2p_ops.c). */
#include "post.h"

#include "../sched/trace.h"
#include "internal.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

static wf_comm_req *of_msg(wf_msg *m)
{
    return (wf_comm_req *)((char *)m - offsetof(wf_comm_req, msg));
}

/* Sets the timer fd to fire at 'at' (CLOCK_MONOTONIC ns; 0: disarm), if that changes it. */
static void timer_set(wf_comm *c, uint64_t at)
{
    if (c->timer_fd < 0 || at == c->timer_at)
        return;
    struct itimerspec its = { 0 };
    if (at) {
        its.it_value.tv_sec = (time_t)(at / 1000000000u);
        its.it_value.tv_nsec = (long)(at % 1000000000u);
    }
    if (timerfd_settime(c->timer_fd, TFD_TIMER_ABSTIME, &its, NULL) == 0)
        c->timer_at = at;
}

/* Finishes posted request 'r' whose UCX part is over: its span on the trace, its callback
 * with the final status (the comm's failure, a size mismatch naming both sizes, a UCX
 * error), and its memory. */
static void finish(wf_comm *c, wf_comm_req *r, int rc)
{
    pthread_mutex_lock(&c->mu);
    for (wf_comm_req **pp = &c->posted; *pp; pp = &(*pp)->next_posted)
        if (*pp == r) {
            *pp = r->next_posted;
            c->n_posted--;
            break;
        }
    pthread_mutex_unlock(&c->mu);
    char d[200];
    wf__req_describe(r, d, sizeof d);
    if (rc >= 0 && r->status < 0) {
        rc = r->status;
        if (atomic_load(&c->failed) && (rc == WF_ECANCELED || rc == WF_EDEVICE))
            rc = wf__comm_failed(c); /* the failure of the comm names the rank */
        else if (rc == WF_EFORMAT)
            wf__err(rc, "rank %d: %s: the message has %zu bytes", c->rank, d, r->info.length);
        else if (rc == WF_EDEVICE)
            rc = wf__comm_fail(c, WF_EPEER, r->peer, "rank %d: %s: UCX: %s", c->rank, d,
                               c->api.ucs_status_string(r->ust));
        else
            wf__err(rc, "rank %d: %s: %s", c->rank, d,
                    rc == WF_ECANCELED ? "canceled (the communicator is closing)" : "failed");
    }
    wf__trace_transfer(c->rt, r->is_recv ? "recv" : "send", r->t0, r->peer, r->bytes, r->is_recv);
    void (*done)(void *, int) = r->on_done;
    void *arg = r->done_arg;
    wf__req_free(r);
    if (rc < 0) { /* the message must survive the free, for the callback */
        char why[WF_ERRMSG_MAX];
        snprintf(why, sizeof why, "%s", wf_last_errmsg());
        wf__err(rc, "%s", why);
    }
    done(arg, rc);
}

void wf__post_cancel(wf_comm *c)
{
    for (;;) {
        void *ureq = NULL;
        pthread_mutex_lock(&c->mu);
        for (wf_comm_req *r = c->posted; r; r = r->next_posted)
            if (r->ureq && !atomic_load(&r->done) && !r->orphan) {
                r->orphan = true; /* here: "cancel asked", so each is canceled once */
                ureq = r->ureq;
                break;
            }
        pthread_mutex_unlock(&c->mu);
        if (!ureq)
            return;
        c->api.ucp_request_cancel(c->worker, ureq);
    }
}

/* The handler's turn without a message: progress, deadlines, failure, and the watches. */
static int look(wf_comm *c, wf_actor *a)
{
    uint64_t now = wf__net_now_ns(), next = 0;
    if (c->timer_fd >= 0) {
        uint64_t ticks;
        (void)!read(c->timer_fd, &ticks, sizeof ticks); /* nonblocking: clear it */
        c->timer_at = 0;
    }
    if (!atomic_load(&c->failed)) {
        char d[200];
        int late = -1;
        pthread_mutex_lock(&c->mu);
        for (wf_comm_req *r = c->posted; r; r = r->next_posted) {
            if (atomic_load(&r->done))
                continue;
            if (r->deadline_ns <= now && late < 0) {
                wf__req_describe(r, d, sizeof d);
                late = r->peer;
            } else if (!next || r->deadline_ns < next) {
                next = r->deadline_ns;
            }
        }
        pthread_mutex_unlock(&c->mu);
        if (late >= 0)
            wf__comm_fail(c, WF_ETIMEDOUT, late, "rank %d: no progress within %u ms: %s", c->rank,
                          c->op_timeout_ms, d);
    }
    pthread_mutex_lock(&c->mu);
    int pending = c->n_posted;
    pthread_mutex_unlock(&c->mu);
    if (!pending) {
        timer_set(c, 0);
        return 0;
    }
    timer_set(c, next);
    return c->timer_fd >= 0 ? wf_actor_watch_fd(a, c->timer_fd, WF_FD_READ) : 0;
}

static int handler(wf_actor *a, wf_msg *m, void *ctx)
{
    wf_comm *c = ctx;
    if (!m)
        return look(c, a);
    wf_comm_req *r = of_msg(m);
    if (r->handed) { /* back from UCX (complete() in ucx.c) */
        pthread_mutex_lock(&c->mu);
        bool held = r->in_post; /* its poster still holds it: it sends the message again */
        r->finish_held = held;
        pthread_mutex_unlock(&c->mu);
        if (!held)
            finish(c, r, 0);
        return 0;
    }
    return 0; /* every message is a completion (posts go to UCX in post()) */
}

/* Makes the comm's actor and timer at the first post. Under 'mu'. */
static int start_actor(wf_comm *c)
{
    if (atomic_load(&c->actor))
        return 0;
    if (!c->rt)
        return wf__err(WF_EINVAL,
                       "rank %d: posted transfers need a comm made with a runtime "
                       "(wf_comm_create's rt was NULL)",
                       c->rank);
    char name[32];
    snprintf(name, sizeof name, "weft-ucx r%d", c->rank);
    c->timer_fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (c->timer_fd < 0)
        return wf__err_errno(errno, "timerfd_create for the transport's actor");
    wf_actor *a = NULL;
    int rc =
        wf_actor_create(c->rt, &(wf_actor_opts){ .handler = handler, .ctx = c, .name = name }, &a);
    if (rc < 0) {
        close(c->timer_fd);
        c->timer_fd = -1;
        return rc;
    }
    atomic_store(&c->actor, a);
    return 0;
}

static int post(wf_comm *c, int peer, uint64_t key, void *buf, size_t bytes, bool is_recv,
                wf__post_fn done, void *arg)
{
    const char *fn = is_recv ? "wf__comm_post_recv" : "wf__comm_post_send";
    if (!c || !done)
        return wf__err(WF_EINVAL, "%s: NULL %s", fn, c ? "callback" : "comm");
    if (peer < 0 || peer >= c->size)
        return wf__err(WF_EINVAL, "%s: rank %d: peer %d out of range 0..%d", fn, c->rank, peer,
                       c->size - 1);
    if (key >> WF_COMM_KEY_BITS)
        return wf__err(WF_EINVAL, "%s: key %#llx is not below 2^%d", fn, (unsigned long long)key,
                       WF_COMM_KEY_BITS);
    if (!buf && bytes)
        return wf__err(WF_EINVAL, "%s: NULL buffer for %zu bytes", fn, bytes);
    wf_comm_req *r = calloc(1, sizeof *r);
    if (!r)
        return wf__err(WF_ENOMEM, "%s: no memory for a request", fn);
    r->c = c;
    r->peer = peer;
    r->key = key;
    r->buf = buf;
    r->bytes = bytes;
    r->is_recv = is_recv;
    r->on_done = done;
    r->done_arg = arg;
    r->t0 = wf__trace_clock();
    r->deadline_ns = wf__net_now_ns() + (uint64_t)c->op_timeout_ms * 1000000u;
    r->handed = true;
    r->in_post = true;
    pthread_mutex_lock(&c->mu);
    int rc = atomic_load(&c->failed) ? wf__comm_failed(c) : 0;
    if (rc == 0 && c->posting_closed)
        rc = wf__err(WF_EINVAL, "%s: rank %d: the communicator is being destroyed", fn, c->rank);
    if (rc == 0)
        rc = start_actor(c);
    if (rc == 0) {
        r->next_posted = c->posted;
        c->posted = r;
        c->n_posted++;
        r->next_hand = c->to_hand;
        c->to_hand = r;
    }
    pthread_mutex_unlock(&c->mu);
    if (rc < 0) {
        free(r);
        return rc;
    }
    wf__net_kick(c); /* "weft-net" hands it to UCX (wf__post_hand) */
    return 0;
}

bool wf__post_hand(wf_comm *c)
{
    pthread_mutex_lock(&c->mu);
    wf_comm_req *r = c->to_hand, *fifo = NULL;
    c->to_hand = NULL;
    pthread_mutex_unlock(&c->mu);
    if (!r)
        return false;
    while (r) { /* posted order: messages of one pair of ranks and one key match in order */
        wf_comm_req *next = r->next_hand;
        r->next_hand = fifo;
        fifo = r;
        r = next;
    }
    for (r = fifo; r;) {
        wf_comm_req *next = r->next_hand;
        int rc = wf__comm_failed(c);
        if (rc == 0)
            rc = wf__post_ucx(c, r, r->peer, r->key, r->buf, r->bytes, r->is_recv);
        pthread_mutex_lock(&c->mu);
        r->in_post = false;
        bool resend = r->finish_held;
        if (rc < 0) { /* never in UCX: the actor finishes it with the comm's failure */
            r->status = atomic_load(&c->failed) ? WF_ECANCELED : rc;
            atomic_store_explicit(&r->done, true, memory_order_release);
            resend = true;
        }
        pthread_mutex_unlock(&c->mu);
        if (resend)
            wf__post_completed(r);
        r = next;
    }
    /* The deadlines' timer. */
    wf__post_kick(c);
    return true;
}

int wf__comm_post_send(wf_comm *c, int peer, uint64_t key, const void *buf, size_t bytes,
                       wf__post_fn done, void *arg)
{
    return post(c, peer, key, (void *)buf, bytes, false, done, arg);
}

int wf__comm_post_recv(wf_comm *c, int peer, uint64_t key, void *buf, size_t bytes,
                       wf__post_fn done, void *arg)
{
    return post(c, peer, key, buf, bytes, true, done, arg);
}

void wf__post_completed(wf_comm_req *r)
{
    int rc = wf_actor_send(atomic_load(&r->c->actor), &r->msg);
    (void)rc; /* the actor lives while anything is posted (wf__post_fini) */
}

void wf__post_kick(wf_comm *c)
{
    wf_actor *a = atomic_load(&c->actor);
    if (a) {
        int rc = wf_actor_poke(a);
        (void)rc;
    }
}

void wf__post_fini(wf_comm *c)
{
    wf_actor *a = atomic_load(&c->actor);
    if (!a)
        return;
    pthread_mutex_lock(&c->mu);
    c->posting_closed = true;
    wf_comm_req *unhanded = c->to_hand; /* "weft-net" is gone: they never reach UCX */
    c->to_hand = NULL;
    for (wf_comm_req *r = unhanded; r; r = r->next_hand) {
        r->in_post = false;
        r->status = WF_ECANCELED;
        atomic_store_explicit(&r->done, true, memory_order_release);
    }
    pthread_mutex_unlock(&c->mu);
    while (unhanded) {
        wf_comm_req *next = unhanded->next_hand;
        wf__post_completed(unhanded);
        unhanded = next;
    }
    /* Whatever is still posted is canceled and finished by the actor (its callbacks get
     * WF_ECANCELED or the comm's failure); bounded, as in wf__ucx_fini(). */
    uint64_t end = wf__net_now_ns() + 1000000000u;
    for (;;) {
        pthread_mutex_lock(&c->mu);
        int left = c->n_posted;
        pthread_mutex_unlock(&c->mu);
        if (!left || wf__net_now_ns() >= end)
            break;
        if (!atomic_load(&c->failed))
            wf__comm_fail(c, WF_ECANCELED, -1,
                          "rank %d: the communicator was destroyed with "
                          "%d transfer%s posted",
                          c->rank, left, left == 1 ? "" : "s");
        wf__post_cancel(c); /* this thread progresses now: it cancels (see the invariants) */
        wf__post_kick(c);
        c->api.ucp_worker_progress(c->worker);
        struct timespec ts = { 0, 1000000 };
        nanosleep(&ts, NULL);
    }
    int rc = c->timer_fd >= 0 ? wf_actor_unwatch_fd(a, c->timer_fd) : 0;
    (void)rc; /* only WF_EINVAL for a NULL actor */
    wf_actor_destroy(a);
    atomic_store(&c->actor, NULL);
    if (c->timer_fd >= 0)
        close(c->timer_fd);
    c->timer_fd = -1;
    /* Requests UCX never gave back (a send to a dead shared-memory peer): their callbacks
     * cannot run any more; freed with the worker's requests (wf__ucx_fini FORCE-closes). */
    pthread_mutex_lock(&c->mu);
    while (c->posted) {
        wf_comm_req *r = c->posted;
        c->posted = r->next_posted;
        r->on_done = NULL;
        r->orphan = true;
        r->next_orphan = c->orphans;
        c->orphans = r;
    }
    c->n_posted = 0;
    pthread_mutex_unlock(&c->mu);
}
