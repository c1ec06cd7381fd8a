/* tests/sched/test_actor.c: actors. Handler calls of one actor never overlap, messages of
 * one sender are handled in the order sent and each exactly once (senders: outside threads
 * and tasks at once); WF_BIND_WORKER and WF_BIND_NUMA keep the handler on its worker or
 * node; pokes call the handler with NULL and merge; handler errors show in
 * wf_actor_status()/wf_actor_errmsg(); a handler may send to its own actor; destroy waits
 * for queued messages; a full batch yields to other actors. */
#include "wf_test.h"

#include <weft/weft.h>

#include <criterion/criterion.h>

#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>

TestSuite(sched_actor, .fini = wf_test_fini, .timeout = WF_TEST_TIMEOUT(120));

#define DEADLINE_S 30.0

typedef struct amsg {
    wf_msg m;
    int sender;
    long seq;
    atomic_int handled;
} amsg;

#define AMSG(msg) ((amsg *)((char *)(msg)-offsetof(amsg, m)))

/* ---- Many senders, one actor ------------------------------------------------------------- */

enum { THREAD_SENDERS = 3, TASK_SENDERS = 8, SENDERS = THREAD_SENDERS + TASK_SENDERS };

typedef struct flood {
    wf_runtime *rt;
    wf_actor *a;
    amsg *msgs; /* sender s owns msgs[s * per_sender ...] */
    long per_sender;
    /* Written only by the handler, without atomics on purpose: calls of one actor must be
     * ordered by weft (each call sees the previous one's writes), and ThreadSanitizer
     * reports these accesses if they are not. */
    long last_seq[SENDERS];
    atomic_int inside;
    atomic_long overlaps, out_of_order, duplicates, handled, send_failures, null_msgs;
    /* Binding checks: the worker the handler must run on, or the node (-1: any). */
    int want_worker, want_node;
    int node_of[64];
    atomic_long wrong_place;
} flood;

static int flood_handler(wf_actor *a, wf_msg *msg, void *ctx)
{
    flood *f = ctx;
    if (msg == NULL) {
        atomic_fetch_add(&f->null_msgs, 1);
        return 0;
    }
    if (atomic_exchange(&f->inside, 1) != 0)
        atomic_fetch_add(&f->overlaps, 1);
    amsg *m = AMSG(msg);
    if (atomic_fetch_add(&m->handled, 1) != 0)
        atomic_fetch_add(&f->duplicates, 1);
    if (m->seq != f->last_seq[m->sender] + 1)
        atomic_fetch_add(&f->out_of_order, 1);
    f->last_seq[m->sender] = m->seq;
    int w = wf_runtime_current_worker(f->rt);
    if ((f->want_worker >= 0 && w != f->want_worker) ||
        (f->want_node >= 0 && (w < 0 || f->node_of[w] != f->want_node)))
        atomic_fetch_add(&f->wrong_place, 1);
    for (volatile int i = 0; i < 50; i++) {
    }
    atomic_store(&f->inside, 0);
    atomic_fetch_add(&f->handled, 1);
    return 0;
}

typedef struct sender {
    flood *f;
    int id;
} sender;

static void send_all(flood *f, int id)
{
    for (long i = 0; i < f->per_sender; i++)
        if (wf_actor_send(f->a, &f->msgs[id * f->per_sender + i].m) != 0)
            atomic_fetch_add(&f->send_failures, 1);
}

static void *thread_sender(void *arg)
{
    sender *s = arg;
    send_all(s->f, s->id);
    return NULL;
}

static int task_sender(void *arg)
{
    sender *s = arg;
    send_all(s->f, s->id);
    return 0;
}

static flood *flood_new(const wf_runtime_opts *rt_opts, wf_actor_opts aopts)
{
    flood *f = calloc(1, sizeof *f);
    cr_assert_not_null(f);
    f->rt = wf_test_runtime(rt_opts);
    f->per_sender = wf_test_scaled(20000, 2000);
    f->msgs = calloc((size_t)(SENDERS * f->per_sender), sizeof *f->msgs);
    cr_assert_not_null(f->msgs);
    for (int s = 0; s < SENDERS; s++) {
        f->last_seq[s] = -1;
        for (long i = 0; i < f->per_sender; i++) {
            f->msgs[s * f->per_sender + i].sender = s;
            f->msgs[s * f->per_sender + i].seq = i;
        }
    }
    f->want_worker = f->want_node = -1;
    aopts.handler = flood_handler;
    aopts.ctx = f;
    int rc = wf_actor_create(f->rt, &aopts, &f->a);
    cr_assert_eq(rc, 0, "wf_actor_create: %s: %s", wf_err_name(rc), wf_last_errmsg());
    return f;
}

/* Sends from THREAD_SENDERS threads and TASK_SENDERS tasks at once, then waits until the
 * actor handled everything. */
static void flood_run(flood *f)
{
    pthread_t t[THREAD_SENDERS];
    sender s[SENDERS];
    wf_group g;
    cr_assert_eq(wf_group_init(&g, f->rt), 0);
    for (int i = 0; i < SENDERS; i++)
        s[i] = (sender){ f, i };
    for (int i = 0; i < TASK_SENDERS; i++)
        cr_assert_eq(wf_spawn(&g, task_sender, &s[THREAD_SENDERS + i]), 0);
    for (int i = 0; i < THREAD_SENDERS; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, thread_sender, &s[i]), 0);
    for (int i = 0; i < THREAD_SENDERS; i++)
        pthread_join(t[i], NULL);
    cr_assert_eq(wf_group_wait(&g), 0);
    wf_group_deinit(&g);
    long total = SENDERS * f->per_sender;
    cr_assert_eq(atomic_load(&f->send_failures), 0);
    cr_assert(wf_test_wait_for(&f->handled, total, DEADLINE_S),
              "the actor handled %ld of %ld messages in %.0f s", atomic_load(&f->handled), total,
              DEADLINE_S);
}

static void flood_free(flood *f)
{
    wf_actor_destroy(f->a);
    wf_runtime_destroy(f->rt);
    free(f->msgs);
    free(f);
}

Test(sched_actor, handler_calls_of_one_actor_never_overlap)
{
    /* batch = 1: the actor yields after every message, so it is rescheduled as often as it
     * can be, on whichever worker comes first. */
    flood *f = flood_new(&(wf_runtime_opts){ .n_workers = 4 }, (wf_actor_opts){ .batch = 1 });
    flood_run(f);
    cr_assert_eq(atomic_load(&f->overlaps), 0, "%ld handler calls overlapped another",
                 atomic_load(&f->overlaps));
    flood_free(f);
}

Test(sched_actor, messages_from_one_sender_are_handled_in_the_order_sent)
{
    flood *f = flood_new(&(wf_runtime_opts){ .n_workers = 4 }, (wf_actor_opts){ .batch = 3 });
    flood_run(f);
    cr_assert_eq(atomic_load(&f->out_of_order), 0, "%ld messages came out of their sender's order",
                 atomic_load(&f->out_of_order));
    flood_free(f);
}

Test(sched_actor, every_message_is_handled_exactly_once)
{
    flood *f = flood_new(&(wf_runtime_opts){ .n_workers = 4 }, (wf_actor_opts){ 0 });
    flood_run(f);
    /* Let a late duplicate show up before counting. */
    wf_test_sleep_us(20000);
    cr_assert_eq(atomic_load(&f->duplicates), 0, "%ld messages were handled twice",
                 atomic_load(&f->duplicates));
    cr_assert_eq(atomic_load(&f->handled), SENDERS * f->per_sender);
    cr_assert_eq(atomic_load(&f->null_msgs), 0, "the handler got NULL without a poke");
    flood_free(f);
}

Test(sched_actor, a_worker_bound_actor_runs_its_handler_only_on_that_worker)
{
    for (int bound = 1; bound < 4; bound += 2) {
        flood *f = flood_new(&(wf_runtime_opts){ .n_workers = 4 },
                             (wf_actor_opts){ .bind = WF_BIND_WORKER, .bind_index = bound });
        f->want_worker = bound;
        flood_run(f);
        cr_assert_eq(atomic_load(&f->wrong_place), 0,
                     "%ld of %ld calls of an actor bound to worker %d ran on another thread",
                     atomic_load(&f->wrong_place), atomic_load(&f->handled), bound);
        flood_free(f);
    }
}

Test(sched_actor, a_numa_bound_actor_runs_its_handler_only_on_workers_of_that_node)
{
    for (int node = 0; node < 2; node++) {
        flood *f = flood_new(&(wf_runtime_opts){ .topology = "pack:2 numa:1 core:2 pu:1" },
                             (wf_actor_opts){ .bind = WF_BIND_NUMA, .bind_index = node });
        int n = wf_runtime_worker_count(f->rt);
        cr_assert_eq(n, 4);
        wf_worker_stats st[4];
        cr_assert_eq(wf_runtime_stats(f->rt, st, 4), 4);
        for (int w = 0; w < 4; w++)
            f->node_of[w] = st[w].numa;
        f->want_node = node;
        flood_run(f);
        cr_assert_eq(atomic_load(&f->wrong_place), 0,
                     "%ld of %ld calls of an actor bound to node %d ran elsewhere",
                     atomic_load(&f->wrong_place), atomic_load(&f->handled), node);
        flood_free(f);
    }
}

/* ---- Pokes ------------------------------------------------------------------------------ */

typedef struct poked {
    atomic_long null_calls, msg_calls;
    atomic_int entered, release;
    wf_msg *blocker;
    wf_actor *self;
    void *ctx_seen;
    wf_actor *actor_seen;
} poked;

static int poke_handler(wf_actor *a, wf_msg *msg, void *ctx)
{
    poked *p = ctx;
    p->ctx_seen = ctx;
    p->actor_seen = a;
    if (msg == NULL) {
        atomic_fetch_add(&p->null_calls, 1);
        return 0;
    }
    if (msg == p->blocker) {
        atomic_store(&p->entered, 1);
        while (!atomic_load(&p->release))
            wf_test_sleep_us(100);
    }
    atomic_fetch_add(&p->msg_calls, 1);
    return 0;
}

static wf_actor *poked_actor(wf_runtime *rt, poked *p)
{
    wf_actor *a;
    int rc = wf_actor_create(rt, &(wf_actor_opts){ .handler = poke_handler, .ctx = p }, &a);
    cr_assert_eq(rc, 0, "%s: %s", wf_err_name(rc), wf_last_errmsg());
    p->self = a;
    return a;
}

Test(sched_actor, poke_calls_the_handler_with_a_null_message)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 2 });
    poked p = { 0 };
    wf_actor *a = poked_actor(rt, &p);
    cr_assert_eq(wf_actor_poke(a), 0);
    cr_assert(wf_test_wait_for(&p.null_calls, 1, DEADLINE_S), "no handler call after a poke");
    cr_assert_eq(atomic_load(&p.msg_calls), 0);
    wf_actor_destroy(a);
    wf_runtime_destroy(rt);
}

Test(sched_actor, the_handler_gets_its_actor_and_ctx)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 2 });
    poked p = { 0 };
    wf_actor *a = poked_actor(rt, &p);
    wf_msg m;
    cr_assert_eq(wf_actor_send(a, &m), 0);
    cr_assert(wf_test_wait_for(&p.msg_calls, 1, DEADLINE_S));
    wf_actor_destroy(a);
    cr_assert_eq(p.actor_seen, a);
    cr_assert_eq(p.ctx_seen, &p);
    wf_runtime_destroy(rt);
}

Test(sched_actor, pokes_made_while_the_handler_runs_are_merged_into_one_call)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 2 });
    poked p = { 0 };
    wf_msg block, sentinel;
    p.blocker = &block;
    wf_actor *a = poked_actor(rt, &p);
    cr_assert_eq(wf_actor_send(a, &block), 0);
    while (!atomic_load(&p.entered))
        wf_test_sleep_us(100);
    /* Every poke is made before the poke call can start: they are one call. */
    for (int i = 0; i < 100; i++)
        cr_assert_eq(wf_actor_poke(a), 0);
    atomic_store(&p.release, 1);
    cr_assert(wf_test_wait_for(&p.null_calls, 1, DEADLINE_S), "no call for 100 pokes");
    /* A second poke call, if any, has had its chance once a later message is handled. */
    cr_assert_eq(wf_actor_send(a, &sentinel), 0);
    cr_assert(wf_test_wait_for(&p.msg_calls, 2, DEADLINE_S));
    wf_test_sleep_us(20000);
    cr_assert_eq(atomic_load(&p.null_calls), 1,
                 "100 pokes made while the handler ran gave %ld calls", atomic_load(&p.null_calls));
    wf_actor_destroy(a);
    wf_runtime_destroy(rt);
}

Test(sched_actor, a_poke_after_the_poke_call_started_gives_another_call)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 2 });
    poked p = { 0 };
    wf_actor *a = poked_actor(rt, &p);
    for (long i = 1; i <= 50; i++) {
        cr_assert_eq(wf_actor_poke(a), 0);
        cr_assert(wf_test_wait_for(&p.null_calls, i, DEADLINE_S), "poke %ld gave no call", i);
    }
    wf_actor_destroy(a);
    wf_runtime_destroy(rt);
}

/* ---- Handler errors ----------------------------------------------------------------------- */

typedef struct failing {
    atomic_long calls;
    long fail_at[2]; /* seq numbers that fail: the first with WF_EIO, the second WF_EINVAL */
} failing;

static int failing_handler(wf_actor *a, wf_msg *msg, void *ctx)
{
    failing *f = ctx;
    long seq = AMSG(msg)->seq;
    int rc = 0;
    if (seq == f->fail_at[0])
        rc = wf_task_fail(WF_EIO, "bad message %ld (first)", seq);
    else if (seq == f->fail_at[1])
        rc = wf_task_fail(WF_EINVAL, "bad message %ld (second)", seq);
    atomic_fetch_add(&f->calls, 1);
    return rc;
}

/* Sends messages 0..n-1 and waits until the last one is being handled: the handler's status
 * is recorded before the next call, so every earlier failure is visible by then. */
static wf_actor *run_failing(wf_runtime *rt, failing *f, amsg *msgs, int n)
{
    wf_actor *a;
    int rc = wf_actor_create(
        rt, &(wf_actor_opts){ .handler = failing_handler, .ctx = f, .name = "flaky" }, &a);
    cr_assert_eq(rc, 0);
    cr_assert_eq(wf_actor_status(a), 0, "a new actor has status %s",
                 wf_err_name(wf_actor_status(a)));
    cr_assert_str_eq(wf_actor_errmsg(a), "");
    for (int i = 0; i < n; i++) {
        msgs[i].seq = i;
        cr_assert_eq(wf_actor_send(a, &msgs[i].m), 0);
    }
    cr_assert(wf_test_wait_for(&f->calls, n, DEADLINE_S), "handled %ld of %d",
              atomic_load(&f->calls), n);
    return a;
}

Test(sched_actor, a_failing_handler_sets_the_actor_status_and_message)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 2 });
    failing f = { .fail_at = { 3, -1 } };
    amsg msgs[6] = { 0 };
    wf_actor *a = run_failing(rt, &f, msgs, 6);
    cr_assert_eq(wf_actor_status(a), WF_EIO, "status %s", wf_err_name(wf_actor_status(a)));
    cr_assert(strstr(wf_actor_errmsg(a), "bad message 3 (first)") != NULL, "errmsg \"%s\"",
              wf_actor_errmsg(a));
    wf_actor_destroy(a);
    wf_runtime_destroy(rt);
}

Test(sched_actor, an_actor_keeps_handling_messages_after_a_handler_error)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 2 });
    failing f = { .fail_at = { 0, -1 } };
    amsg msgs[20] = { 0 };
    wf_actor *a = run_failing(rt, &f, msgs, 20);
    cr_assert_eq(atomic_load(&f.calls), 20);
    wf_actor_destroy(a);
    wf_runtime_destroy(rt);
}

Test(sched_actor, actor_status_keeps_the_first_error)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 2 });
    failing f = { .fail_at = { 2, 4 } };
    amsg msgs[6] = { 0 };
    wf_actor *a = run_failing(rt, &f, msgs, 6);
    cr_assert_eq(wf_actor_status(a), WF_EIO, "status %s", wf_err_name(wf_actor_status(a)));
    cr_assert(strstr(wf_actor_errmsg(a), "first") != NULL, "errmsg \"%s\"", wf_actor_errmsg(a));
    cr_assert(strstr(wf_actor_errmsg(a), "second") == NULL, "errmsg \"%s\"", wf_actor_errmsg(a));
    wf_actor_destroy(a);
    wf_runtime_destroy(rt);
}

/* ---- Self-sends, destroy, batches --------------------------------------------------------- */

typedef struct echo_self {
    atomic_long hops;
    long target;
    atomic_int failures;
} echo_self;

static int self_handler(wf_actor *a, wf_msg *msg, void *ctx)
{
    echo_self *e = ctx;
    if (msg && atomic_fetch_add(&e->hops, 1) + 1 < e->target && wf_actor_send(a, msg) != 0)
        atomic_fetch_add(&e->failures, 1);
    return 0;
}

Test(sched_actor, a_handler_may_send_to_its_own_actor)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 2 });
    echo_self e = { .target = wf_test_scaled(100000, 10000) };
    wf_actor *a;
    cr_assert_eq(wf_actor_create(rt, &(wf_actor_opts){ .handler = self_handler, .ctx = &e }, &a),
                 0);
    wf_msg m;
    cr_assert_eq(wf_actor_send(a, &m), 0);
    cr_assert(wf_test_wait_for(&e.hops, e.target, DEADLINE_S), "stopped at %ld of %ld hops",
              atomic_load(&e.hops), e.target);
    cr_assert_eq(atomic_load(&e.failures), 0);
    wf_actor_destroy(a);
    wf_runtime_destroy(rt);
}

typedef struct slow {
    atomic_long handled;
} slow;

static int slow_handler(wf_actor *a, wf_msg *msg, void *ctx)
{
    wf_test_busy_ns(10000);
    atomic_fetch_add(&((slow *)ctx)->handled, 1);
    return 0;
}

Test(sched_actor, destroy_waits_until_queued_messages_are_handled)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 2 });
    slow s = { 0 };
    wf_actor *a;
    cr_assert_eq(wf_actor_create(rt, &(wf_actor_opts){ .handler = slow_handler, .ctx = &s }, &a),
                 0);

    enum { N = 1000 };

    wf_msg *msgs = calloc(N, sizeof *msgs);
    cr_assert_not_null(msgs);
    for (int i = 0; i < N; i++)
        cr_assert_eq(wf_actor_send(a, &msgs[i]), 0);
    wf_actor_destroy(a);
    long at_destroy = atomic_load(&s.handled);
    wf_test_sleep_us(20000);
    cr_assert_eq(at_destroy, N, "wf_actor_destroy returned with %ld of %d messages handled",
                 at_destroy, N);
    cr_assert_eq(atomic_load(&s.handled), N, "a handler ran after wf_actor_destroy returned");
    free(msgs);
    wf_runtime_destroy(rt);
}

typedef struct turns {
    atomic_int log_len;
    char log[256];
    wf_actor *a, *b;
    wf_msg ma[100], mb[100];
    atomic_int send_failures;
} turns;

typedef struct turn_actor {
    turns *t;
    char id;
} turn_actor;

static int turn_handler(wf_actor *a, wf_msg *msg, void *ctx)
{
    turn_actor *ta = ctx;
    int i = atomic_fetch_add(&ta->t->log_len, 1);
    if (i < (int)sizeof ta->t->log)
        ta->t->log[i] = ta->id;
    return 0;
}

/* Sends 100 messages to A, then 100 to B, from a task: both actors are scheduled on this
 * worker, and neither can start before the task returns (there is one worker). */
static int send_to_both(void *arg)
{
    turns *t = arg;
    for (int i = 0; i < 100; i++)
        if (wf_actor_send(t->a, &t->ma[i]) != 0)
            atomic_fetch_add(&t->send_failures, 1);
    for (int i = 0; i < 100; i++)
        if (wf_actor_send(t->b, &t->mb[i]) != 0)
            atomic_fetch_add(&t->send_failures, 1);
    return 0;
}

/* One worker; actors A and B each have 100 messages waiting. With batch = 4, whichever runs
 * first yields after 4 messages, and the other must get its turn within the next batch:
 * a yield that puts the actor straight back where the worker takes its next task from makes
 * 'batch' meaningless. */
Test(sched_actor, an_actor_yields_to_another_after_a_full_batch)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 1 });
    turns *t = calloc(1, sizeof *t);
    cr_assert_not_null(t);
    turn_actor ta = { t, 'A' }, tb = { t, 'B' };
    cr_assert_eq(
        wf_actor_create(rt, &(wf_actor_opts){ .handler = turn_handler, .ctx = &ta, .batch = 4 },
                        &t->a),
        0);
    cr_assert_eq(
        wf_actor_create(rt, &(wf_actor_opts){ .handler = turn_handler, .ctx = &tb, .batch = 4 },
                        &t->b),
        0);
    wf_group g;
    cr_assert_eq(wf_group_init(&g, rt), 0);
    cr_assert_eq(wf_spawn(&g, send_to_both, t), 0);
    cr_assert_eq(wf_group_wait(&g), 0);
    wf_group_deinit(&g);
    wf_actor_destroy(t->a);
    wf_actor_destroy(t->b);
    cr_assert_eq(atomic_load(&t->send_failures), 0);
    cr_assert_eq(atomic_load(&t->log_len), 200);
    char first = t->log[0];
    int other_at = -1;
    for (int i = 0; i < 200 && other_at < 0; i++)
        if (t->log[i] != first)
            other_at = i;
    cr_assert(other_at >= 0 && other_at <= 8,
              "with batch = 4, actor %c handled %d messages before the other got a turn: %.200s",
              first, other_at, t->log);
    free(t);
    wf_runtime_destroy(rt);
}
