/* tests/sched/test_wakeup.c: no lost wake-ups, and no burned CPU when idle. 10^5 ping-pongs
 * (10^4 under ThreadSanitizer, which runs them 5-15x slower) between an outside thread and
 * the workers (spawn and wait; actor message and reply; poke and reply), and between two
 * actors; mostly with spin_us = 1, so that workers park between pings, which is what exposes
 * a lost wake-up. Each wait has its own deadline, so a lost wake-up fails with the iteration
 * it happened at, well before the suite's timeout. */
#include "wf_test.h"

#include <weft/weft.h>

#include <criterion/criterion.h>

#include <errno.h>
#include <semaphore.h>
#include <stddef.h>
#include <time.h>

TestSuite(sched_wakeup, .fini = wf_test_fini, .timeout = WF_TEST_TIMEOUT(150));

/* A reply that takes longer than this is taken as lost. */
#define STALL_SECONDS 10

static long pings(void)
{
    return wf_test_scaled(100000, 10000);
}

/* sem_wait() with a deadline; false when it passed. */
static bool sem_wait_for(sem_t *s, double seconds)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    long long ns = ts.tv_nsec + (long long)(seconds * 1e9);
    ts.tv_sec += ns / 1000000000;
    ts.tv_nsec = ns % 1000000000;
    int rc;
    while ((rc = sem_timedwait(s, &ts)) != 0 && errno == EINTR) {
    }
    return rc == 0;
}

/* ---- Outside thread: spawn one task, wait for it -------------------------------------- */

static int count_task(void *arg)
{
    atomic_fetch_add((atomic_long *)arg, 1);
    return 0;
}

static void spawn_wait_ping_pong(const wf_runtime_opts *opts)
{
    wf_runtime *rt = wf_test_runtime(opts);
    wf_group g;
    cr_assert_eq(wf_group_init(&g, rt), 0);
    atomic_long count = 0;
    long n = pings();
    for (long i = 0; i < n; i++) {
        int rc = wf_spawn(&g, count_task, &count);
        cr_assert_eq(rc, 0, "ping %ld: wf_spawn: %s", i, wf_err_name(rc));
        rc = wf_group_wait(&g);
        cr_assert_eq(rc, 0, "ping %ld: wf_group_wait: %s", i, wf_err_name(rc));
        cr_assert_eq(atomic_load(&count), i + 1,
                     "ping %ld: wf_group_wait returned before its task ran", i);
    }
    wf_group_deinit(&g);
    wf_runtime_destroy(rt);
}

Test(sched_wakeup, spawn_and_wait_from_outside_never_loses_a_wakeup_with_parking_workers)
{
    spawn_wait_ping_pong(&(wf_runtime_opts){ .n_workers = 2, .spin_us = 1 });
}

Test(sched_wakeup, spawn_and_wait_from_outside_never_loses_a_wakeup_on_one_parking_worker)
{
    spawn_wait_ping_pong(&(wf_runtime_opts){ .n_workers = 1, .spin_us = 1 });
}

Test(sched_wakeup, spawn_and_wait_from_outside_never_loses_a_wakeup_with_more_workers_than_cores)
{
    spawn_wait_ping_pong(&(wf_runtime_opts){ .n_workers = 4 });
}

/* ---- Outside thread: message an actor, wait for its reply ----------------------------- */

typedef struct echo {
    sem_t reply;
    atomic_long handled;
    atomic_long null_msgs;
    atomic_long wrong_msgs;
    wf_msg *expected;
} echo;

typedef struct ping_msg {
    wf_msg m;
    long seq;
} ping_msg;

static int echo_handler(wf_actor *a, wf_msg *msg, void *ctx)
{
    echo *e = ctx;
    if (msg == NULL)
        atomic_fetch_add(&e->null_msgs, 1);
    else if (msg != e->expected)
        atomic_fetch_add(&e->wrong_msgs, 1);
    atomic_fetch_add(&e->handled, 1);
    sem_post(&e->reply);
    return 0;
}

static void message_ping_pong(const wf_runtime_opts *opts)
{
    wf_runtime *rt = wf_test_runtime(opts);
    echo e = { 0 };
    cr_assert_eq(sem_init(&e.reply, 0, 0), 0);
    wf_actor *a;
    int rc = wf_actor_create(rt, &(wf_actor_opts){ .handler = echo_handler, .ctx = &e }, &a);
    cr_assert_eq(rc, 0, "wf_actor_create: %s: %s", wf_err_name(rc), wf_last_errmsg());
    /* One message, sent again once the handler has it back: a mailbox that keeps a pointer
     * to a handled message would corrupt itself here. */
    ping_msg m = { 0 };
    e.expected = &m.m;
    long n = pings();
    for (long i = 0; i < n; i++) {
        m.seq = i;
        rc = wf_actor_send(a, &m.m);
        cr_assert_eq(rc, 0, "ping %ld: wf_actor_send: %s", i, wf_err_name(rc));
        cr_assert(sem_wait_for(&e.reply, STALL_SECONDS),
                  "ping %ld: no reply within %d s: lost wake-up (%ld handled)", i, STALL_SECONDS,
                  atomic_load(&e.handled));
    }
    wf_actor_destroy(a);
    cr_assert_eq(atomic_load(&e.handled), n);
    cr_assert_eq(atomic_load(&e.null_msgs), 0);
    cr_assert_eq(atomic_load(&e.wrong_msgs), 0);
    sem_destroy(&e.reply);
    wf_runtime_destroy(rt);
}

Test(sched_wakeup, actor_message_from_outside_never_loses_a_wakeup_with_parking_workers)
{
    message_ping_pong(&(wf_runtime_opts){ .n_workers = 2, .spin_us = 1 });
}

Test(sched_wakeup, actor_message_from_outside_never_loses_a_wakeup_with_more_workers_than_cores)
{
    message_ping_pong(&(wf_runtime_opts){ .n_workers = 4 });
}

/* ---- Outside thread: poke an actor, wait for its reply -------------------------------- */

Test(sched_wakeup, actor_poke_from_outside_never_loses_a_wakeup_with_parking_workers)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 2, .spin_us = 1 });
    echo e = { 0 };
    cr_assert_eq(sem_init(&e.reply, 0, 0), 0);
    wf_actor *a;
    cr_assert_eq(wf_actor_create(rt, &(wf_actor_opts){ .handler = echo_handler, .ctx = &e }, &a),
                 0);
    long n = pings();
    for (long i = 0; i < n; i++) {
        int rc = wf_actor_poke(a);
        cr_assert_eq(rc, 0, "poke %ld: %s", i, wf_err_name(rc));
        cr_assert(sem_wait_for(&e.reply, STALL_SECONDS),
                  "poke %ld: no handler call within %d s: lost wake-up", i, STALL_SECONDS);
    }
    wf_actor_destroy(a);
    cr_assert_eq(atomic_load(&e.null_msgs), n, "%ld of %ld calls had msg == NULL",
                 atomic_load(&e.null_msgs), n);
    sem_destroy(&e.reply);
    wf_runtime_destroy(rt);
}

/* ---- Two actors bounce one message ------------------------------------------------------ */

typedef struct rally {
    wf_actor *a, *b;
    atomic_long hits; /* times A got the ball */
    long target;
    atomic_int send_failures;
    atomic_int done;
} rally;

static int rally_a(wf_actor *self, wf_msg *msg, void *ctx)
{
    rally *r = ctx;
    if (msg == NULL)
        return 0;
    if (atomic_fetch_add(&r->hits, 1) + 1 >= r->target) {
        atomic_store(&r->done, 1);
        return 0;
    }
    if (wf_actor_send(r->b, msg) != 0)
        atomic_fetch_add(&r->send_failures, 1);
    return 0;
}

static int rally_b(wf_actor *self, wf_msg *msg, void *ctx)
{
    rally *r = ctx;
    if (msg != NULL && wf_actor_send(r->a, msg) != 0)
        atomic_fetch_add(&r->send_failures, 1);
    return 0;
}

/* Waits for the rally to end, failing when 'hits' stops moving for STALL_SECONDS. */
static void wait_rally(rally *r)
{
    long last = -1;
    uint64_t last_change = wf_test_now_ns();
    while (!atomic_load(&r->done)) {
        long h = atomic_load(&r->hits);
        if (h != last) {
            last = h;
            last_change = wf_test_now_ns();
        }
        cr_assert_lt(wf_test_now_ns() - last_change, (uint64_t)STALL_SECONDS * 1000000000u,
                     "the rally stalled at %ld of %ld hits: lost wake-up", h, r->target);
        wf_test_sleep_us(1000);
    }
}

static void actor_rally(const wf_runtime_opts *opts, int bind, int index_a, int index_b)
{
    wf_runtime *rt = wf_test_runtime(opts);
    rally r = { .target = pings() };
    int rc = wf_actor_create(
        rt,
        &(wf_actor_opts){
            .handler = rally_a, .ctx = &r, .name = "rally_a", .bind = bind, .bind_index = index_a },
        &r.a);
    cr_assert_eq(rc, 0, "%s: %s", wf_err_name(rc), wf_last_errmsg());
    rc = wf_actor_create(
        rt,
        &(wf_actor_opts){
            .handler = rally_b, .ctx = &r, .name = "rally_b", .bind = bind, .bind_index = index_b },
        &r.b);
    cr_assert_eq(rc, 0, "%s: %s", wf_err_name(rc), wf_last_errmsg());
    ping_msg ball = { 0 };
    cr_assert_eq(wf_actor_send(r.b, &ball.m), 0);
    wait_rally(&r);
    cr_assert_eq(atomic_load(&r.send_failures), 0);
    cr_assert_eq(atomic_load(&r.hits), r.target);
    /* B first: its last handler call, which sent the ball to A, has then returned, so no
     * send to A can still be running when A is destroyed ("no send may race with it"). */
    wf_actor_destroy(r.b);
    wf_actor_destroy(r.a);
    wf_runtime_destroy(rt);
}

Test(sched_wakeup, two_actors_bounce_a_message_without_losing_a_wakeup_with_parking_workers)
{
    actor_rally(&(wf_runtime_opts){ .n_workers = 2, .spin_us = 1 }, WF_BIND_ANY, 0, 0);
}

Test(sched_wakeup, two_actors_bound_to_different_workers_bounce_a_message_without_losing_a_wakeup)
{
    /* Every message crosses workers, so every hop must wake a parked one. */
    actor_rally(&(wf_runtime_opts){ .n_workers = 2, .spin_us = 1 }, WF_BIND_WORKER, 0, 1);
}

Test(sched_wakeup, two_actors_bounce_a_message_without_losing_a_wakeup_on_four_workers)
{
    actor_rally(&(wf_runtime_opts){ .n_workers = 4 }, WF_BIND_ANY, 0, 0);
}

/* ---- A busy worker's new task wakes a parked thief ------------------------------------- */

typedef struct handoff {
    atomic_int child_ran;
    atomic_int timed_out;
} handoff;

static int handoff_child(void *arg)
{
    atomic_store(&((handoff *)arg)->child_ran, 1);
    return 0;
}

typedef struct handoff_ctx {
    wf_group *g;
    handoff h;
} handoff_ctx;

/* Spawns a child onto its own deque and does not return until the child ran: only the other
 * worker, parked when the spawn happened, can run it. */
static int handoff_busy_parent(void *arg)
{
    handoff_ctx *c = arg;
    if (wf_spawn(c->g, handoff_child, &c->h) != 0)
        return WF_ENOMEM;
    uint64_t deadline = wf_test_now_ns() + (uint64_t)STALL_SECONDS * 1000000000u;
    while (!atomic_load(&c->h.child_ran)) {
        if (wf_test_now_ns() > deadline) {
            atomic_store(&c->h.timed_out, 1);
            break;
        }
        wf_test_sleep_us(20);
    }
    return 0;
}

Test(sched_wakeup, a_task_spawned_by_a_busy_worker_wakes_a_parked_worker)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 2, .spin_us = 1 });
    wf_group g;
    cr_assert_eq(wf_group_init(&g, rt), 0);
    long n = wf_test_scaled(2000, 300);
    for (long i = 0; i < n; i++) {
        handoff_ctx c = { .g = &g };
        cr_assert_eq(wf_spawn(&g, handoff_busy_parent, &c), 0);
        int rc = wf_group_wait(&g);
        cr_assert_eq(rc, 0, "round %ld: %s: %s", i, wf_err_name(rc), wf_group_errmsg(&g));
        cr_assert_eq(atomic_load(&c.h.timed_out), 0,
                     "round %ld: the child waited %d s on the busy worker's deque while the other "
                     "worker slept: lost wake-up",
                     i, STALL_SECONDS);
        wf_test_sleep_us(200); /* let the other worker park again */
    }
    wf_group_deinit(&g);
    wf_runtime_destroy(rt);
}

/* ---- Idle workers sleep ------------------------------------------------------------------ */

static uint64_t process_cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

Test(sched_wakeup, idle_workers_burn_no_cpu)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 4 });
    wf_group g;
    cr_assert_eq(wf_group_init(&g, rt), 0);
    atomic_long count = 0;
    for (int i = 0; i < 10000; i++)
        cr_assert_eq(wf_spawn(&g, count_task, &count), 0);
    cr_assert_eq(wf_group_wait(&g), 0);
    wf_test_sleep_us(100000); /* default spin_us is 50 us: every worker is parked by now */
    uint64_t cpu0 = process_cpu_ns(), wall0 = wf_test_now_ns();
    wf_test_sleep_us(500000);
    uint64_t cpu = process_cpu_ns() - cpu0, wall = wf_test_now_ns() - wall0;
    /* 4 spinning workers would use up to 2 cores (1000 ms); parked ones use ~0. The bound
     * leaves room for ThreadSanitizer's background thread and timer noise. */
    uint64_t limit = wall / (WF_TEST_TSAN || WF_TEST_ASAN ? 10 : 20);
    cr_assert_lt(cpu, limit, "4 idle workers used %.1f ms of CPU in %.1f ms", cpu / 1e6,
                 wall / 1e6);
    wf_group_deinit(&g);
    wf_runtime_destroy(rt);
}

Test(sched_wakeup, idle_workers_count_their_parks_and_sleep_time)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 2, .spin_us = 1 });
    wf_group g;
    cr_assert_eq(wf_group_init(&g, rt), 0);
    atomic_long count = 0;
    for (int round = 0; round < 20; round++) {
        cr_assert_eq(wf_spawn(&g, count_task, &count), 0);
        cr_assert_eq(wf_group_wait(&g), 0);
        wf_test_sleep_us(5000);
    }
    wf_worker_stats st[2];
    cr_assert_eq(wf_runtime_stats(rt, st, 2), 2);
    cr_assert_gt(WF_TEST_SUM(st, 2, parks), 0, "workers idle for 100 ms never parked");
    cr_assert_gt(WF_TEST_SUM(st, 2, idle_ns), 0, "parked workers report no time asleep");
    wf_group_deinit(&g);
    wf_runtime_destroy(rt);
}
