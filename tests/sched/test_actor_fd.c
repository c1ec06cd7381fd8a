/* tests/sched/test_actor_fd.c: actors that wait on file descriptors (wf_actor_watch_fd).
 * Checks that readiness reaches the handler as a poke, that a watch is one-shot until
 * re-armed, that unwatch stops pokes, and that bad arguments are refused. */
#include "wf_test.h"

#include <sys/eventfd.h>
#include <unistd.h>

static wf_runtime *rt;

static void setup(void)
{
    cr_assert_eq(wf_runtime_create(&rt, &(wf_runtime_opts){ .n_workers = 2 }), 0, "%s",
                 wf_last_errmsg());
}

static void teardown(void)
{
    wf_runtime_destroy(rt);
}

TestSuite(sched_actor_fd, .init = setup, .fini = teardown, .timeout = 60);

typedef struct fdctx {
    int fd;
    bool rearm;
    atomic_int pokes;
    atomic_llong total;
} fdctx;

static int on_ready(wf_actor *a, wf_msg *m, void *p)
{
    fdctx *c = p;
    if (m)
        return 0;
    uint64_t v;
    if (read(c->fd, &v, sizeof v) == sizeof v)
        atomic_fetch_add(&c->total, (long long)v);
    atomic_fetch_add(&c->pokes, 1);
    if (c->rearm)
        return wf_actor_watch_fd(a, c->fd, WF_FD_READ);
    return 0;
}

static bool wait_for(atomic_llong *v, long long want)
{
    for (int i = 0; i < 200000; i++) { /* 10 s at most */
        if (atomic_load(v) >= want)
            return true;
        usleep(50);
    }
    return false;
}

Test(sched_actor_fd, every_write_to_a_rearmed_eventfd_reaches_the_handler)
{
    fdctx c = { .fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC), .rearm = true };
    cr_assert_geq(c.fd, 0);
    wf_actor *a;
    cr_assert_eq(wf_actor_create(rt, &(wf_actor_opts){ .handler = on_ready, .ctx = &c }, &a), 0);
    cr_assert_eq(wf_actor_watch_fd(a, c.fd, WF_FD_READ), 0, "%s", wf_last_errmsg());
    for (long long i = 1; i <= 2000; i++) {
        uint64_t one = 1;
        cr_assert_eq(write(c.fd, &one, sizeof one), (ssize_t)sizeof one);
        cr_assert(wait_for(&c.total, i), "write %lld never reached the handler", i);
    }
    cr_assert_eq(wf_actor_unwatch_fd(a, c.fd), 0);
    wf_actor_destroy(a);
    close(c.fd);
}

Test(sched_actor_fd, a_watch_is_one_shot_until_rearmed)
{
    fdctx c = { .fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC), .rearm = false };
    wf_actor *a;
    cr_assert_eq(wf_actor_create(rt, &(wf_actor_opts){ .handler = on_ready, .ctx = &c }, &a), 0);
    cr_assert_eq(wf_actor_watch_fd(a, c.fd, WF_FD_READ), 0);
    uint64_t one = 1;
    cr_assert_eq(write(c.fd, &one, sizeof one), (ssize_t)sizeof one);
    cr_assert(wait_for(&c.total, 1));
    cr_assert_eq(write(c.fd, &one, sizeof one), (ssize_t)sizeof one);
    usleep(100000); /* not re-armed: the second write must not poke */
    cr_assert_eq(atomic_load(&c.pokes), 1);
    cr_assert_eq(wf_actor_watch_fd(a, c.fd, WF_FD_READ), 0);
    cr_assert(wait_for(&c.total, 2), "re-arming did not deliver the pending write");
    cr_assert_eq(wf_actor_unwatch_fd(a, c.fd), 0);
    wf_actor_destroy(a);
    close(c.fd);
}

Test(sched_actor_fd, unwatch_stops_pokes)
{
    fdctx c = { .fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC), .rearm = true };
    wf_actor *a;
    cr_assert_eq(wf_actor_create(rt, &(wf_actor_opts){ .handler = on_ready, .ctx = &c }, &a), 0);
    cr_assert_eq(wf_actor_watch_fd(a, c.fd, WF_FD_READ), 0);
    cr_assert_eq(wf_actor_unwatch_fd(a, c.fd), 0);
    uint64_t one = 1;
    cr_assert_eq(write(c.fd, &one, sizeof one), (ssize_t)sizeof one);
    usleep(100000);
    cr_assert_eq(atomic_load(&c.pokes), 0);
    wf_actor_destroy(a);
    close(c.fd);
}

static int noop(wf_actor *a, wf_msg *m, void *p)
{
    return 0;
}

Test(sched_actor_fd, bad_arguments_are_refused_with_einval)
{
    wf_actor *a;
    cr_assert_eq(wf_actor_create(rt, &(wf_actor_opts){ .handler = noop }, &a), 0);
    cr_assert_eq(wf_actor_watch_fd(NULL, 0, WF_FD_READ), WF_EINVAL);
    cr_assert_eq(wf_actor_watch_fd(a, -1, WF_FD_READ), WF_EINVAL);
    cr_assert_eq(wf_actor_watch_fd(a, 0, 0), WF_EINVAL);
    cr_assert_eq(wf_actor_watch_fd(a, 0, 0x80), WF_EINVAL);
    cr_assert_neq(strlen(wf_last_errmsg()), 0);
    int r = wf_actor_watch_fd(a, 987654, WF_FD_READ); /* not an open fd */
    cr_assert_eq(r, WF_ESYS, "got %s", wf_err_name(r));
    cr_assert(strstr(wf_last_errmsg(), "987654"), "message: %s", wf_last_errmsg());
    cr_assert_eq(wf_actor_unwatch_fd(a, 987654), 0);
    wf_actor_destroy(a);
}
