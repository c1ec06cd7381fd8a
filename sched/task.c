/* sched/task.c: task storage, spawning, and task groups.
 * Owns: the per-worker free lists and the runtime's shared pool of tasks (slabs of 256,
 * freed with the runtime), and the group protocol (internal.h states its invariant).
 * Free lists: a worker allocates from and frees to its own list; the shared pool only trades
 * batches, so a producer/consumer pair (one worker spawns, another runs) costs one lock per
 * BATCH tasks and memory stays bounded.
 * Not here: where a spawned task goes (worker.c). */
#include "internal.h"
#include "probes.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SLAB         256
#define BATCH        128
#define HIWATER      4096
#define THROTTLE     256 /* deque depth above which a spawn runs at once */
#define THROTTLE_RUN 31  /* ... and how many more spawns run at once before checking again */

static int refill(wf_runtime *rt)
{
    if (rt->nslabs == rt->capslabs) {
        size_t cap = rt->capslabs ? rt->capslabs * 2 : 64;
        void **s = realloc(rt->slabs, cap * sizeof *s);
        if (!s)
            return WF_ENOMEM;
        rt->slabs = s;
        rt->capslabs = cap;
    }
    wf__task *slab = aligned_alloc(WF_CACHELINE, SLAB * sizeof *slab);
    if (!slab)
        return WF_ENOMEM;
    rt->slabs[rt->nslabs++] = slab;
    for (int i = 0; i < SLAB; i++) {
        slab[i].next = rt->pool;
        rt->pool = &slab[i];
    }
    rt->npool += SLAB;
    return 0;
}

wf__task *wf__task_alloc(wf_runtime *rt, wf__worker *w)
{
    if (WF_LIKELY(w && w->free)) {
        wf__task *t = w->free;
        w->free = t->next;
        w->nfree--;
        return t;
    }
    pthread_mutex_lock(&rt->pool_mu);
    wf__task *t = NULL;
    if (!rt->fail_pool && (rt->pool || refill(rt) == 0)) {
        t = rt->pool;
        rt->pool = t->next;
        rt->npool--;
        for (int i = 0; w && i < BATCH && rt->pool; i++) {
            wf__task *x = rt->pool;
            rt->pool = x->next;
            rt->npool--;
            x->next = w->free;
            w->free = x;
            w->nfree++;
        }
    }
    pthread_mutex_unlock(&rt->pool_mu);
    return t;
}

void wf__task_free(wf__worker *w, wf__task *t)
{
    t->next = w->free;
    w->free = t;
    if (WF_LIKELY(++w->nfree <= HIWATER))
        return;
    /* Give half back, so the spawning worker of a producer/consumer pair can reuse them. */
    wf__task *head = w->free, *last = head;
    for (int i = 1; i < HIWATER / 2; i++)
        last = last->next;
    w->free = last->next;
    w->nfree -= HIWATER / 2;
    wf_runtime *rt = w->rt;
    pthread_mutex_lock(&rt->pool_mu);
    last->next = rt->pool;
    rt->pool = head;
    rt->npool += HIWATER / 2;
    pthread_mutex_unlock(&rt->pool_mu);
}

void wf__task_release(wf_runtime *rt, wf__worker *w, wf__task *t)
{
    if (w) {
        wf__task_free(w, t);
        return;
    }
    pthread_mutex_lock(&rt->pool_mu);
    t->next = rt->pool;
    rt->pool = t;
    rt->npool++;
    pthread_mutex_unlock(&rt->pool_mu);
}

void wf__pool_destroy(wf_runtime *rt)
{
    for (size_t i = 0; i < rt->nslabs; i++)
        free(rt->slabs[i]);
    free(rt->slabs);
    rt->slabs = NULL;
    rt->nslabs = rt->capslabs = 0;
    rt->pool = NULL;
}

/* ---- Groups ---- */

static wf__group *grp(const wf_group *g)
{
    return (wf__group *)(uintptr_t)g;
}

int wf_group_init(wf_group *g, wf_runtime *rt)
{
    if (!g || !rt)
        return wf__err(WF_EINVAL, "wf_group_init: %s is NULL", g ? "rt" : "g");
    memset(g, 0, sizeof *g);
    wf__group *x = grp(g);
    x->rt = rt;
    atomic_init(&x->state, 0);
    atomic_init(&x->err, 0);
    atomic_init(&x->msg, NULL);
    x->magic = WF__GROUP_MAGIC;
    return 0;
}

void wf_group_deinit(wf_group *g)
{
    if (!g)
        return;
    wf__group *x = grp(g);
    free(atomic_load_explicit(&x->msg, memory_order_relaxed));
    atomic_store_explicit(&x->msg, NULL, memory_order_relaxed);
    x->magic = 0;
}

const char *wf_group_errmsg(const wf_group *g)
{
    if (!g)
        return "";
    char *m = atomic_load_explicit(&grp(g)->msg, memory_order_acquire);
    return m ? m : "";
}

int wf__group_add(wf__group *g, uint32_t n)
{
    uint32_t old = atomic_fetch_add_explicit(&g->state, n, memory_order_relaxed);
    if (WF_LIKELY((old & WF__GRP_COUNT) <= WF__GRP_COUNT - n))
        return 0;
    atomic_fetch_sub_explicit(&g->state, n, memory_order_relaxed);
    return wf__err(WF_ENOMEM, "a group holds at most %u unfinished tasks", WF__GRP_COUNT);
}

void wf__group_done(wf__group *g, uint32_t n)
{
    wf_runtime *rt = g->rt; /* read before the decrement: afterwards 'g' may be gone */
    uint32_t old = atomic_fetch_sub_explicit(&g->state, n, memory_order_acq_rel);
    WF_ASSERT((old & WF__GRP_COUNT) >= n);
    if ((old & WF__GRP_COUNT) != n)
        return;
    if (old & WF__GRP_WAIT_EXT)
        wf__futex_wake(&g->state, INT_MAX);
    if (old & WF__GRP_WAIT_WORKER)
        wf__notify_all(rt);
}

void wf__group_fail(wf__group *g, wf__worker *w, const char *name, int rc)
{
    int raw = rc;
    if (!wf__status_known(rc)) /* a code that is not a wf_status: say so, keep the value */
        rc = WF_ETASK;
    if (w) { /* this worker's own cache of the group's state (worker.c) learns it at once */
        w->err_g = g;
        w->err_seen = rc;
    }
    int32_t expect = 0;
    if (!atomic_compare_exchange_strong_explicit(&g->err, &expect, rc, memory_order_acq_rel,
                                                 memory_order_relaxed))
        return;
    char buf[WF_ERRMSG_MAX + 64];
    if (w && w->fail_set)
        snprintf(buf, sizeof buf, "task '%s': %s", name ? name : "(unnamed)", w->failmsg);
    else if (raw != rc)
        snprintf(buf, sizeof buf, "task '%s' failed with %d, which is not a wf_status",
                 name ? name : "(unnamed)", raw);
    else
        snprintf(buf, sizeof buf, "task '%s' failed: %s (%s)", name ? name : "(unnamed)",
                 wf_err_name(rc), wf_strerror(rc));
    char *m = strdup(buf); /* NULL on ENOMEM: the code still reaches the waiter */
    char *old = atomic_exchange_explicit(&g->msg, m, memory_order_acq_rel);
    free(old);
}

static void wait_worker(wf__worker *w, wf__group *g)
{
    wf_runtime *rt = w->rt;
    uint64_t t0 = 0;
    unsigned spins = 0;
    wf__flush_done(w); /* this worker may hold finished tasks of 'g' itself */
    for (;;) {
        if (w->done_g == g || w->gdone_grp == g)
            wf__flush_done(w);
        uint32_t s = atomic_load_explicit(&g->state, memory_order_acquire);
        if ((s & WF__GRP_COUNT) == 0)
            return;
        wf__task *t = wf__find_task(w);
        if (!t)
            t = wf__steal_round(w);
        if (t) {
            wf__run_task(w, t);
            t0 = 0;
            continue;
        }
        if ((++spins & 7) != 0 || !t0 || wf__now_ns() - t0 < rt->spin_ns) {
            if (!t0)
                t0 = wf__now_ns();
            wf__cpu_relax();
            continue;
        }
        wf__flush_done(w);
        if (!(s & WF__GRP_WAIT_WORKER)) {
            atomic_compare_exchange_weak_explicit(&g->state, &s, s | WF__GRP_WAIT_WORKER,
                                                  memory_order_seq_cst, memory_order_relaxed);
            continue;
        }
        uint32_t key = wf__ec_prepare(rt);
        if ((atomic_load_explicit(&g->state, memory_order_seq_cst) & WF__GRP_COUNT) == 0 ||
            wf__work_visible(w)) {
            wf__ec_cancel(rt);
            continue;
        }
        WF__INC(w, parks, 1);
        uint64_t p0 = wf__now_ns();
        (void)wf__ec_commit(rt, key); /* woken or timed out: look again either way */
        WF__INC(w, idle_ns, wf__now_ns() - p0);
    }
}

static void wait_outside(wf__group *g)
{
    uint64_t t0 = wf__now_ns(), spin = g->rt->spin_ns;
    for (unsigned i = 0;; i++) {
        uint32_t s = atomic_load_explicit(&g->state, memory_order_acquire);
        if ((s & WF__GRP_COUNT) == 0)
            return;
        if ((i & 15) == 0 && wf__now_ns() - t0 > spin)
            break;
        wf__cpu_relax();
    }
    for (;;) {
        uint32_t s = atomic_load_explicit(&g->state, memory_order_acquire);
        if ((s & WF__GRP_COUNT) == 0)
            return;
        if (!(s & WF__GRP_WAIT_EXT)) {
            atomic_compare_exchange_weak_explicit(&g->state, &s, s | WF__GRP_WAIT_EXT,
                                                  memory_order_seq_cst, memory_order_relaxed);
            continue;
        }
        wf__futex_wait(&g->state, s);
    }
}

int wf__group_wait(wf__group *g)
{
    wf__worker *w = wf__worker_of(g->rt);
    if (w)
        wait_worker(w, g);
    else
        wait_outside(g);
    /* Every task of the group has finished: only this thread touches 'g' now. */
    atomic_store_explicit(&g->state, 0, memory_order_relaxed);
    int rc = atomic_exchange_explicit(&g->err, 0, memory_order_acquire);
    if (rc == 0) /* a success forgets the message of an earlier failure */
        free(atomic_exchange_explicit(&g->msg, NULL, memory_order_relaxed));
    return rc;
}

int wf_group_wait(wf_group *g)
{
    if (!g || grp(g)->magic != WF__GROUP_MAGIC)
        return wf__err(WF_EINVAL, "wf_group_wait: the group is %s",
                       g ? "not initialised (wf_group_init)" : "NULL");
    int rc = wf__group_wait(grp(g));
    if (rc < 0)
        wf__err(rc, "%s", wf_group_errmsg(g));
    return rc;
}

int wf_spawn_named(wf_group *g, wf_task_fn fn, void *arg, const char *name)
{
    if (WF_UNLIKELY(!g || !fn || grp(g)->magic != WF__GROUP_MAGIC))
        return wf__err(WF_EINVAL, "wf_spawn: %s",
                       !g    ? "the group is NULL"
                       : !fn ? "the task function is NULL"
                             : "the group is not initialised");
    wf__group *x = grp(g);
    wf_runtime *rt = x->rt;
    wf__worker *w = wf__worker_of(rt);
    if (w && (w->throttled || WF_UNLIKELY(wf__deque_at_least(&w->dq, THROTTLE))) &&
        w->inline_depth < 8) {
        /* Throttling, as libgomp does: with this many tasks already waiting here, the
         * thieves have plenty, and one more in the deque would only cost memory and cache
         * misses. Run it now, and the next THROTTLE_RUN spawns too before looking at the
         * deque again: reading its 'top' each time would pull the thieves' cache line on
         * every spawn. Nesting is bounded so a spawn chain cannot overflow the stack. */
        w->throttled = w->throttled ? w->throttled - 1 : THROTTLE_RUN;
        int fail_set = w->fail_set;
        wf__task *cur = w->current;
        w->inline_depth++;
        wf__run_body(w, x, fn, arg, name);
        w->inline_depth--;
        w->current = cur;
        w->fail_set = fail_set;
        return 0;
    }
    if (WF_UNLIKELY(wf__group_add(x, 1) < 0))
        return WF_ENOMEM;
    wf__task *t = wf__task_alloc(rt, w);
    if (WF_UNLIKELY(!t)) {
        wf__group_done(x, 1);
        return wf__err(WF_ENOMEM, "wf_spawn: no memory for a task");
    }
    t->kind = WF__TK_PLAIN;
    t->grp = x;
    t->name = name;
    t->owner = NULL;
    t->u.f.fn = fn;
    t->u.f.arg = arg;
    if (w) {
        WF_PROBE2(spawn, w->index, name);
        wf__push_local(w, t);
    } else {
        wf__submit_outside(rt, t);
    }
    return 0;
}

int wf_spawn(wf_group *g, wf_task_fn fn, void *arg)
{
    return wf_spawn_named(g, fn, arg, NULL);
}

int wf_task_fail(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    wf__verr(code, fmt, ap);
    va_end(ap);
    wf__worker *w = wf__self;
    if (w && w->current) {
        snprintf(w->failmsg, sizeof w->failmsg, "%s", wf_last_errmsg());
        w->fail_set = 1;
    }
    return code;
}
