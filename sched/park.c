/* sched/park.c: sleeping and waking workers without losing a wake-up.
 * Owns: the two-phase event count of the runtime ('epoch', 'n_sleeping') and the futex calls.
 * Protocol (docs/architecture.md, "Scheduler"): a waiter announces itself (seq_cst increment of
 * 'n_sleeping'), reads 'epoch', re-checks every place work can appear, then either cancels
 * or sleeps on 'epoch' with the value it read. A notifier publishes its work, issues a seq_cst
 * read-modify-write of 'n_sleeping' (adding 0), and only if it is non-zero bumps 'epoch' and
 * wakes. Both sides read-modify-write the same word, so one of them comes second in its
 * modification order: either the waiter's re-check sees the work, or the notifier sees the
 * waiter, never neither. (An RMW rather than a fence plus a load: the same cost on x86, and
 * ThreadSanitizer understands it.)
 * Not here: deciding when to park (worker.c), or group waits (task.c). */
#include "internal.h"

#include <errno.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

int wf__futex_wait(_Atomic uint32_t *addr, uint32_t val)
{
    long rc = syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
    return rc == 0 ? 0 : errno;
}

/* A parked worker looks around every PARK_MAX_NS even if nobody woke it. The one wake-up
 * the protocol can miss is a push onto a busy worker's own deque (worker.c skips the fence
 * there, ~20 cycles a spawn): that task is never lost, its worker runs it, but if that
 * worker blocks in user code, this bounds how long the task can wait for a thief. Five
 * wake-ups a second cost each idle worker a few microseconds of CPU. */
#define PARK_MAX_NS 200000000

static bool futex_wait_bounded(_Atomic uint32_t *addr, uint32_t val)
{
    struct timespec ts = { 0, PARK_MAX_NS };
    long rc = syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT_PRIVATE, val, &ts, NULL, 0);
    return rc < 0 && errno == ETIMEDOUT;
}

void wf__futex_wake(_Atomic uint32_t *addr, int n)
{
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0);
}

uint64_t wf__now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void notify(wf_runtime *rt, int n)
{
    if (atomic_fetch_add_explicit(&rt->n_sleeping, 0, memory_order_seq_cst) == 0)
        return;
    atomic_fetch_add_explicit(&rt->epoch, 1, memory_order_seq_cst);
    wf__futex_wake(&rt->epoch, n);
}

void wf__notify_one(wf_runtime *rt)
{
    notify(rt, 1);
}

void wf__notify_all(wf_runtime *rt)
{
    notify(rt, 1 << 30);
}

uint32_t wf__ec_prepare(wf_runtime *rt)
{
    atomic_fetch_add_explicit(&rt->n_sleeping, 1, memory_order_seq_cst);
    return atomic_load_explicit(&rt->epoch, memory_order_seq_cst);
}

void wf__ec_cancel(wf_runtime *rt)
{
    atomic_fetch_sub_explicit(&rt->n_sleeping, 1, memory_order_seq_cst);
}

bool wf__ec_commit(wf_runtime *rt, uint32_t key)
{
    /* EAGAIN (epoch moved on) and EINTR both mean: look again. */
    bool timed_out = false;
    if (atomic_load_explicit(&rt->epoch, memory_order_seq_cst) == key)
        timed_out = futex_wait_bounded(&rt->epoch, key);
    atomic_fetch_sub_explicit(&rt->n_sleeping, 1, memory_order_seq_cst);
    return timed_out;
}
