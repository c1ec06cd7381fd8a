/* sched/internal.h: the private structures of sched/, shared by its files only.
 * Owns: the layouts of the runtime, workers, tasks, groups, inboxes and trace rings, and the
 * membership invariants:
 * - A task is in exactly one place: a worker's free list, the runtime's pool, one deque, one
 *   inbox, or running on one worker. Graph and actor tasks are embedded in their owner and
 *   never visit a free list.
 * - A group's 'state' holds its count of unfinished tasks in the low 30 bits, plus two
 *   waiter bits. The decrement that reaches zero is the last touch of the group by a task;
 *   after it only futex/eventcount wakes (which tolerate a reused address) may follow.
 * - 'n_sleeping' counts workers between ec_prepare() and the end of their wait; notifiers read
 *   it after a seq_cst fence (two-phase event count: park.c), so no wake-up is lost.
 * Not here: anything about tensors or devices. */
#ifndef WF_SCHED_INTERNAL_H
#define WF_SCHED_INTERNAL_H

#include "../core/error.h"

#include <weft/sched.h>

#include <hwloc.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#define WF_CACHELINE 64

#if defined(__x86_64__) || defined(__i386__)
#    define wf__cpu_relax() __builtin_ia32_pause()
#elif defined(__aarch64__)
#    define wf__cpu_relax() __asm__ __volatile__("yield")
#else
#    define wf__cpu_relax() ((void)0)
#endif

#define WF_LIKELY(x)   __builtin_expect(!!(x), 1)
#define WF_UNLIKELY(x) __builtin_expect(!!(x), 0)

#ifdef WF_DEBUG_ASSERTS
#    include <stdio.h>
#    include <stdlib.h>
/* Internal invariants only (docs/conventions.md, "Errors"): never for caller input. */
#    define WF_ASSERT(c)                                                                       \
        do {                                                                                   \
            if (!(c)) {                                                                        \
                fprintf(stderr, "weft: internal invariant failed: %s (%s:%d)\n", #c, __FILE__, \
                        __LINE__);                                                             \
                abort();                                                                       \
            }                                                                                  \
        } while (0)
#else
#    define WF_ASSERT(c) ((void)0)
#endif

/* ---- Tasks ---- */

enum { WF__TK_PLAIN, WF__TK_GRAPH, WF__TK_ACTOR, WF__TK_RANGE };

typedef struct wf__group wf__group;
typedef struct wf__blocks wf__blocks; /* blocks.c */

typedef struct wf__task {
    struct wf__task *next; /* free list or inbox link */

    wf__group *grp; /* plain and range tasks; NULL for actor turns */
    const char *name;
    void *owner; /* the taskgraph, actor or parallel_for of this task */

    union {
        struct {
            wf_task_fn fn;
            void *arg;
        } f;

        struct {
            int64_t lo, hi;
        } r;
    } u;

    uint32_t node;          /* graph: the ready node this task carries (taskgraph.c) */
    uint8_t kind;           /* WF__TK_* */
    _Atomic uint8_t cancel; /* graph: a predecessor of that node failed */
} __attribute__((aligned(WF_CACHELINE))) wf__task;

_Static_assert(sizeof(wf__task) == WF_CACHELINE, "a task is one cache line");

/* ---- Groups: overlaid on the caller's wf_group ---- */

#define WF__GRP_COUNT       0x3fffffffu
#define WF__GRP_WAIT_EXT    0x40000000u /* a non-worker sleeps on the futex 'state' */
#define WF__GRP_WAIT_WORKER 0x80000000u /* a worker sleeps on the runtime's event count */

struct wf__group {
    wf_runtime *rt;
    _Atomic uint32_t state;
    _Atomic int32_t err; /* first error, 0 if none: also the cancel flag */
    char *_Atomic msg;   /* the first error's message (malloc), or NULL */
    uint32_t magic;
};

#define WF__GROUP_MAGIC 0x77666772u

_Static_assert(sizeof(wf__group) <= sizeof(wf_group), "wf_group too small");

/* ---- Chase-Lev deque (Le, Pop, Cohen, Zappa Nardelli, PPoPP 2013) ---- */

typedef struct wf__ring {
    int64_t cap; /* a power of two */
    struct wf__ring *retired;
    _Atomic(wf__task *) buf[];
} wf__ring;

typedef struct wf__deque {
    _Alignas(WF_CACHELINE) _Atomic int64_t top;    /* thieves */
    _Alignas(WF_CACHELINE) _Atomic int64_t bottom; /* owner */
    _Atomic(wf__ring *) ring;
    int64_t top_seen; /* owner's last read of 'top': a lower bound, so 'bottom - top_seen'
                         never underestimates the size. Saves a read of the thieves' line
                         per push. */
} wf__deque;

/* ---- Inboxes: submissions from outside a worker, and bound actors ---- */

typedef struct wf__inbox {
    pthread_mutex_t mu;
    wf__task *head, *tail;
    _Atomic int64_t n; /* read without the lock as a hint */
} wf__inbox;

/* ---- Trace rings ---- */

enum { WF__EV_TASK, WF__EV_STEAL, WF__EV_PARK, WF__EV_ACTOR, WF__EV_XFER };

typedef struct wf__tev {
    uint64_t t0, t1; /* ns since the runtime started */
    uint32_t type, arg;
    char name[24];
    /* A graph node (or a parallel_for chunk of one, 'chunk'): the op kind given to
     * wf_taskgraph_set_kind() (copied, "" if none), the graph, its run, the node, the
     * predecessor whose end made it ready and the one with the longest chain of work before
     * it (-1: a root). 'graph' 0: not a graph node. */
    char kind[24];
    uint32_t graph, run;
    int32_t node, after, crit;
    bool chunk;
} wf__tev;

/* What a trace event of a graph node records beside its name (see wf__tev). */
typedef struct wf__tctx {
    const char *kind;
    uint32_t graph, run;
    int32_t node, after, crit;
    bool chunk;
} wf__tctx;

/* ---- Counters: written by the owner only (relaxed load + store), read by anyone ---- */

/* No count of steals won: wf_runtime_stats() gives local + remote, so a reader never sees a
 * steal counted as won but not yet as local or remote (TSan CI caught a snapshot between the
 * two increments: "won 418 local 416 remote 1"). */
typedef struct wf__counters {
    _Atomic uint64_t tasks_run, spawned, steals_tried, steals_won_local, steals_won_remote,
        inbox_taken, parks, idle_ns, actor_msgs;
} wf__counters;

#define WF__INC(w, field, v)                                                                 \
    atomic_store_explicit(&(w)->ctr.field,                                                   \
                          atomic_load_explicit(&(w)->ctr.field, memory_order_relaxed) + (v), \
                          memory_order_relaxed)

/* ---- Workers and NUMA nodes ---- */

typedef struct wf__worker {
    wf__deque dq;
    /* Read-mostly: thieves and notifiers read these. */
    _Alignas(WF_CACHELINE) wf_runtime *rt;
    int index, numa, cpu;
    int *victims;  /* other workers, nearest first */
    int *tier_end; /* victims[tier_end[k-1] .. tier_end[k]) are equally near */
    int ntiers;
    /* Owner-only, written per task. */
    _Alignas(WF_CACHELINE) uint64_t rng;
    wf__task *free;
    uint32_t nfree;
    uint32_t tick;         /* tasks taken: odd ones look at the node's inboxes first */
    uint32_t inline_depth; /* spawns run at once, nested (see wf_spawn_named) */
    uint32_t throttled;    /* spawns left to run at once before the deque is looked at */
    uint32_t steal_pause;  /* ns to wait before the next steal (worker.c, tiny tasks) */
    wf__group *err_g;      /* the group whose 'err' was last read, and what it said */
    int32_t err_seen;
    uint32_t err_tick;
    wf__group *done_g; /* finished tasks of 'done_g' not yet subtracted from it */
    uint32_t done_n;
    uint32_t gdone_n;     /* finished nodes of 'gdone_graph' not yet given to it */
    void *gdone_graph;    /* (taskgraph.c, wf__graph_flush()) */
    wf__group *gdone_grp; /* its run's group */
    wf__task *current;
    wf__tev *ring; /* trace ring, NULL when tracing is off */
    uint64_t ring_head;
    pthread_mutex_t ring_mu;
    int fail_set;
    char failmsg[WF_ERRMSG_MAX];
    pthread_t thread;
    wf__inbox inbox; /* tasks only this worker may run (bound actors) */
    wf__counters ctr;
    wf__counters base; /* values at the last stats reset */
    /* When the current sleep began (wf__now_ns()), 0 while awake: written by the owner, read
     * by wf_runtime_stats(), so 'idle_ns' includes a sleep still going on. */
    _Atomic uint64_t parked_at;
} wf__worker;

typedef struct wf__node {
    wf__inbox open;  /* outside submissions: any worker may take them, own node first */
    wf__inbox bound; /* actors bound to this node: only its workers take them */
    int *workers;
    int nworkers;
} wf__node;

struct wf_runtime {
    int nw, nnuma;
    wf__worker **w;
    wf__node *nodes;
    int *numa_dist; /* nnuma x nnuma */
    hwloc_topology_t topo;
    uint64_t spin_ns;
    bool pin;
    int core_lo, core_n; /* worker i's core: (core_lo + i mod core_n) mod the cores (topo.c:
                            the local rank's run) */
    size_t trace_cap;
    uint64_t t_start;
    _Atomic uint32_t graph_ids; /* task graphs created: a graph's id in traces (from 1) */
    wf__blocks *blocks;         /* large blocks that graphs gave back (blocks.c) */
    /* Two-phase event count. */
    _Alignas(WF_CACHELINE) _Atomic uint32_t epoch;
    _Atomic int32_t n_sleeping;
    _Alignas(WF_CACHELINE) _Atomic int32_t n_searching;
    _Atomic int stop;
    _Atomic uint32_t rr; /* round robin over nodes for outside submissions */
    /* Task pool shared by workers (batches) and outside threads. */
    _Alignas(WF_CACHELINE) pthread_mutex_t pool_mu;
    wf__task *pool;
    uint32_t npool;
    int fail_pool; /* fault injection, for tests only (under pool_mu): nonzero makes the pool
                      look empty and unable to grow, so wf__task_alloc() fails once the
                      caller's free list is empty (tests/sched/test_internal_taskgraph.c) */
    void **slabs;
    size_t nslabs, capslabs;
    pthread_barrier_t ready;
    pthread_mutex_t poll_mu; /* guards starting 'poller' */
    struct wf__poller *poller;
};

typedef struct wf__poller wf__poller;

/* The worker the calling thread is, or NULL. Thread-local like the error slot: it holds no
 * state of its own, only which worker this thread is (docs/conventions.md, "State"). */
extern _Thread_local wf__worker *wf__self;

static inline wf__worker *wf__worker_of(const wf_runtime *rt)
{
    wf__worker *w = wf__self;
    return (w && w->rt == rt) ? w : NULL;
}

/* clock.c-free helpers */
uint64_t wf__now_ns(void);

/* deque.c */
int wf__deque_init(wf__deque *d, int64_t cap);
void wf__deque_deinit(wf__deque *d);
int wf__deque_push(wf__deque *d, wf__task *t);
wf__task *wf__deque_take(wf__deque *d);
wf__task *wf__deque_steal(wf__deque *d, bool *lost_race);

static inline int64_t wf__deque_size(wf__deque *d)
{
    int64_t b = atomic_load_explicit(&d->bottom, memory_order_relaxed);
    int64_t t = atomic_load_explicit(&d->top, memory_order_relaxed);
    return b - t;
}

/* The owner's estimate of its deque's size, reading the thieves' line only when the cheap
 * estimate (an upper bound) reaches 'limit'. Returns true if the size is at least 'limit'. */
static inline bool wf__deque_at_least(wf__deque *d, int64_t limit)
{
    int64_t b = atomic_load_explicit(&d->bottom, memory_order_relaxed);
    if (b - d->top_seen < limit)
        return false;
    d->top_seen = atomic_load_explicit(&d->top, memory_order_relaxed);
    return b - d->top_seen >= limit;
}

/* inbox */
void wf__inbox_init(wf__inbox *q);
void wf__inbox_deinit(wf__inbox *q);
void wf__inbox_put(wf__inbox *q, wf__task *t);
wf__task *wf__inbox_take(wf__inbox *q);

/* park.c: the event count */
void wf__notify_one(wf_runtime *rt);
void wf__notify_all(wf_runtime *rt);
uint32_t wf__ec_prepare(wf_runtime *rt);
void wf__ec_cancel(wf_runtime *rt);
bool wf__ec_commit(wf_runtime *rt, uint32_t key); /* true: nobody woke us (timeout) */
int wf__futex_wait(_Atomic uint32_t *addr, uint32_t val);
void wf__futex_wake(_Atomic uint32_t *addr, int n);

/* worker.c */
void *wf__worker_main(void *arg);
void wf__run_task(wf__worker *w, wf__task *t);
/* Runs one task body of group 'g' (skipped if the group failed), with probes, trace and
 * counters; records its failure in 'g'. */
void wf__run_body(wf__worker *w, wf__group *g, wf_task_fn fn, void *arg, const char *name);
wf__task *wf__find_task(wf__worker *w);
wf__task *wf__steal_round(wf__worker *w);
bool wf__work_visible(wf__worker *w);
void wf__push_local(wf__worker *w, wf__task *t);
void wf__submit_outside(wf_runtime *rt, wf__task *t);

/* task.c: pools and groups */
wf__task *wf__task_alloc(wf_runtime *rt, wf__worker *w);
void wf__task_free(wf__worker *w, wf__task *t);
/* Frees task 't' to 'w''s list, or to the shared pool when 'w' is NULL (not a worker). */
void wf__task_release(wf_runtime *rt, wf__worker *w, wf__task *t);
void wf__pool_destroy(wf_runtime *rt);
int wf__group_add(wf__group *g, uint32_t n); /* WF_ENOMEM past WF__GRP_COUNT */
void wf__group_done(wf__group *g, uint32_t n);

/* Counts one finished task of 'g' now or later: a worker running many tasks of one group
 * (a fan-out) subtracts them in one go, so the group's counter does not bounce between the
 * spawning and the running core. wf__flush_done() must run before the worker parks, waits
 * or searches in vain (worker.c, task.c do). */
void wf__graph_flush(wf__worker *w); /* taskgraph.c: gives w->gdone_n to its graph */

static inline void wf__flush_done(wf__worker *w)
{
    if (w->gdone_n)
        wf__graph_flush(w);
    if (w->done_n) {
        wf__group *g = w->done_g;
        uint32_t n = w->done_n;
        w->done_g = NULL;
        w->done_n = 0;
        wf__group_done(g, n);
    }
}

static inline void wf__done_later(wf__worker *w, wf__group *g)
{
    if (w->done_g != g) {
        wf__flush_done(w);
        w->done_g = g;
    }
    if (++w->done_n >= 256)
        wf__flush_done(w);
}

void wf__group_fail(wf__group *g, wf__worker *w, const char *name, int rc);
int wf__group_wait(wf__group *g);

/* actor.c */
void wf__actor_turn(wf__worker *w, wf__task *t);
wf_runtime *wf__actor_runtime(const wf_actor *a);

/* poll.c */
void wf__poll_stop(wf_runtime *rt);

/* pfor.c */
void wf__range_run(wf__worker *w, wf__task *t);

/* blocks.c: the runtime's cache of large blocks for task graphs (reference counted: the
 * runtime and each graph hold one). wf__blocks_get() returns a block of at least 'bytes'
 * (64-byte aligned, not zeroed) or NULL; wf__blocks_put() takes back one of 'bytes' bytes
 * (as asked for when it was got; NULL is a no-op); wf__blocks_grow() moves the first 'used'
 * bytes of 'p' (of 'old_bytes') into a new block of 'new_bytes' and gives 'p' back, or
 * returns NULL and leaves 'p' as it was. */
wf__blocks *wf__blocks_new(void);
wf__blocks *wf__blocks_retain(wf__blocks *c);
void wf__blocks_release(wf__blocks *c);
void *wf__blocks_get(wf__blocks *c, size_t bytes);
void wf__blocks_put(wf__blocks *c, void *p, size_t bytes);
void *wf__blocks_grow(wf__blocks *c, void *p, size_t used, size_t old_bytes, size_t new_bytes);

/* taskgraph.c */
void wf__graph_run_node(wf__worker *w, wf__task *t);

/* topo.c */
int wf__topo_build(wf_runtime *rt, const wf_runtime_opts *o, int *n_workers);
void wf__topo_pin(wf_runtime *rt, wf__worker *w);

/* trace.c */
void wf__trace_event(wf__worker *w, uint32_t type, uint64_t t0, uint64_t t1, const char *name,
                     uint32_t arg, const wf__tctx *ctx);

/* taskgraph.c: the trace context of graph node task 't' in its current run (its kind, graph,
 * run and node; 'after' -1). */
void wf__graph_trace_ctx(const wf__task *t, wf__tctx *out);

#endif /* WF_SCHED_INTERNAL_H */
