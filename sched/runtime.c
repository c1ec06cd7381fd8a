/* sched/runtime.c: the runtime object: creating and stopping workers, options, counters.
 * Owns: struct wf_runtime's life cycle. The runtime is defined here, in sched/, because it is
 * the thing that owns the workers and everything above runs on them; upper modules keep
 * their own per-runtime state in their own objects (sessions, devices) that point to it.
 * Process-wide state (docs/conventions.md, "State"), all of it: the thread-local error slot
 * (core/error.c) and the thread-local "which worker am I" pointer (worker.c). Nothing else:
 * two runtimes in one process do not see each other.
 * Not here: what workers do (worker.c), the topology (topo.c). */
#include "internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void destroy_parts(wf_runtime *rt)
{
    for (int i = 0; rt->w && i < rt->nw; i++) {
        wf__worker *w = rt->w[i];
        if (!w)
            continue;
        wf__deque_deinit(&w->dq);
        wf__inbox_deinit(&w->inbox);
        pthread_mutex_destroy(&w->ring_mu);
        free(w->victims);
        free(w->tier_end);
        free(w->ring);
        free(w);
    }
    free(rt->w);
    for (int k = 0; rt->nodes && k < rt->nnuma; k++) {
        wf__inbox_deinit(&rt->nodes[k].open);
        wf__inbox_deinit(&rt->nodes[k].bound);
    }
    free(rt->nodes);
    free(rt->numa_dist);
    wf__pool_destroy(rt);
    wf__blocks_release(rt->blocks);
    pthread_mutex_destroy(&rt->pool_mu);
    pthread_mutex_destroy(&rt->poll_mu);
    if (rt->topo)
        hwloc_topology_destroy(rt->topo);
    free(rt);
}

int wf_runtime_create(wf_runtime **out, const wf_runtime_opts *opts)
{
    if (!out)
        return wf__err(WF_EINVAL, "wf_runtime_create: out is NULL");
    *out = NULL;
    wf_runtime_opts o = opts ? *opts : (wf_runtime_opts){ 0 };
    if (o.n_workers < 0 || o.n_workers > WF_MAX_WORKERS)
        return wf__err(WF_EINVAL,
                       "wf_runtime_create: n_workers is %d; it must be 0 (one per core) to %d",
                       o.n_workers, WF_MAX_WORKERS);
    if (o.trace_events > ((size_t)1 << 26))
        return wf__err(WF_EINVAL, "wf_runtime_create: trace_events is %zu, above 2^26",
                       o.trace_events);
    if (o.spin_us > 1000000)
        return wf__err(WF_EINVAL, "wf_runtime_create: spin_us is %u, above one second", o.spin_us);
    if (o.local_size < 0 || o.local_size > 4096 || o.local_rank < 0 ||
        o.local_rank >= (o.local_size > 1 ? o.local_size : 1))
        return wf__err(WF_EINVAL,
                       "wf_runtime_create: local_rank %d of local_size %d: local_size must be 0 "
                       "to 4096 and local_rank 0 to local_size - 1",
                       o.local_rank, o.local_size);
    wf_runtime *rt = calloc(1, sizeof *rt);
    if (!rt)
        return wf__err(WF_ENOMEM, "wf_runtime_create: no memory");
    pthread_mutex_init(&rt->pool_mu, NULL);
    pthread_mutex_init(&rt->poll_mu, NULL);
    rt->spin_ns = (uint64_t)(o.spin_us ? o.spin_us : 50) * 1000u;
    rt->pin = !(o.flags & WF_RT_NO_PIN) && !o.topology;
    rt->trace_cap = o.trace_events;
    rt->t_start = wf__now_ns();
    int nw = o.n_workers;
    int rc = wf__topo_build(rt, &o, &nw);
    if (rc < 0)
        goto fail;
    rc = WF_ENOMEM;
    rt->nodes = calloc((size_t)rt->nnuma, sizeof *rt->nodes);
    rt->blocks = wf__blocks_new();
    if (!rt->nodes || !rt->blocks) {
        wf__err(rc, "wf_runtime_create: no memory");
        goto fail;
    }
    for (int k = 0; k < rt->nnuma; k++) {
        wf__inbox_init(&rt->nodes[k].open);
        wf__inbox_init(&rt->nodes[k].bound);
    }
    for (int i = 0; i < rt->nw; i++) {
        wf__worker *w = rt->w[i];
        wf__inbox_init(&w->inbox);
        pthread_mutex_init(&w->ring_mu, NULL);
        w->rng = 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1) | 1;
        if (wf__deque_init(&w->dq, 1024) < 0 ||
            (rt->trace_cap && !(w->ring = calloc(rt->trace_cap, sizeof *w->ring)))) {
            wf__err(rc, "wf_runtime_create: no memory for worker %d", i);
            goto fail;
        }
    }
    pthread_barrier_init(&rt->ready, NULL, (unsigned)rt->nw + 1);
    for (int i = 0; i < rt->nw; i++) {
        int e = pthread_create(&rt->w[i]->thread, NULL, wf__worker_main, rt->w[i]);
        if (e) {
            /* Workers already started wait at the barrier: let them go and stop them. */
            atomic_store(&rt->stop, 1);
            for (int j = i; j < rt->nw; j++)
                pthread_barrier_wait(&rt->ready);
            for (int j = 0; j < i; j++)
                pthread_join(rt->w[j]->thread, NULL);
            pthread_barrier_destroy(&rt->ready);
            rc = wf__err_errno(e, "wf_runtime_create: pthread_create");
            goto fail;
        }
        char name[16];
        snprintf(name, sizeof name, "weft-w%d", i);
        pthread_setname_np(rt->w[i]->thread, name);
    }
    pthread_barrier_wait(&rt->ready);
    *out = rt;
    return 0;
fail:
    destroy_parts(rt);
    return rc;
}

void wf_runtime_destroy(wf_runtime *rt)
{
    if (!rt)
        return;
    wf__poll_stop(rt);
    atomic_store_explicit(&rt->stop, 1, memory_order_seq_cst);
    wf__notify_all(rt);
    for (int i = 0; i < rt->nw; i++)
        pthread_join(rt->w[i]->thread, NULL);
    pthread_barrier_destroy(&rt->ready);
    destroy_parts(rt);
}

static int env_int(const char *name, int lo, int hi, int *out)
{
    const char *s = getenv(name);
    if (!s || !*s)
        return 0;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < lo || v > hi)
        return wf__err(WF_EINVAL, "%s=\"%s\": expected an integer from %d to %d", name, s, lo, hi);
    *out = (int)v;
    return 1;
}

int wf_runtime_opts_from_env(wf_runtime_opts *opts, const char **trace_path)
{
    if (!opts)
        return wf__err(WF_EINVAL, "wf_runtime_opts_from_env: opts is NULL");
    wf_runtime_opts o = *opts;
    int v = 0;
    int rc = env_int("WEFT_WORKERS", 0, WF_MAX_WORKERS, &v);
    if (rc < 0)
        return rc;
    if (rc > 0)
        o.n_workers = v;
    rc = env_int("WEFT_NO_PIN", 0, 1, &v);
    if (rc < 0)
        return rc;
    if (rc > 0 && v)
        o.flags |= WF_RT_NO_PIN;
    int lr = o.local_rank, ls = o.local_size;
    if ((rc = env_int("WEFT_LOCAL_SIZE", 0, 4096, &ls)) < 0 ||
        (rc = env_int("WEFT_LOCAL_RANK", 0, 4095, &lr)) < 0)
        return rc;
    if (lr >= (ls > 1 ? ls : 1))
        return wf__err(WF_EINVAL, "WEFT_LOCAL_RANK=%d: expected 0 to WEFT_LOCAL_SIZE - 1 (%d)", lr,
                       (ls > 1 ? ls : 1) - 1);
    o.local_rank = lr;
    o.local_size = ls;
    const char *topo = getenv("WEFT_TOPOLOGY");
    if (topo && *topo)
        o.topology = topo;
    const char *tp = getenv("WEFT_TRACE");
    if (tp && *tp && !o.trace_events)
        o.trace_events = (size_t)1 << 20;
    if (trace_path)
        *trace_path = (tp && *tp) ? tp : NULL;
    *opts = o;
    return 0;
}

int wf_runtime_worker_count(const wf_runtime *rt)
{
    return rt ? rt->nw : WF_EINVAL;
}

int wf_runtime_numa_count(const wf_runtime *rt)
{
    return rt ? rt->nnuma : WF_EINVAL;
}

int wf_runtime_current_worker(const wf_runtime *rt)
{
    wf__worker *w = rt ? wf__worker_of(rt) : NULL;
    return w ? w->index : -1;
}

int wf_runtime_worker_numa(const wf_runtime *rt, int worker)
{
    if (!rt || worker < 0 || worker >= rt->nw)
        return WF_EINVAL;
    return rt->w[worker]->numa;
}

struct hwloc_topology *wf_runtime_hwloc_topology(const wf_runtime *rt)
{
    return rt ? rt->topo : NULL;
}

#define LD(c, f) atomic_load_explicit(&(c)->f, memory_order_relaxed)

/* How long worker 'w' has been asleep in its current sleep, 0 if awake. A worker that wakes
 * while it is read may be counted one sleep too much or too little in that read. */
static uint64_t asleep_ns(const wf__worker *w)
{
    uint64_t t0 = atomic_load_explicit(&w->parked_at, memory_order_relaxed);
    uint64_t now = t0 ? wf__now_ns() : 0;
    return t0 && now > t0 ? now - t0 : 0;
}

int wf_runtime_stats(const wf_runtime *rt, wf_worker_stats *out, int n)
{
    if (!rt || (n > 0 && !out))
        return wf__err(WF_EINVAL, "wf_runtime_stats: %s is NULL", rt ? "out" : "rt");
    for (int i = 0; i < n && i < rt->nw; i++) {
        const wf__worker *w = rt->w[i];
        const wf__counters *c = &w->ctr, *b = &w->base;
        /* Won steals before tried ones: each steal is counted as tried before it is counted
         * as won, so read in this order 'won' does not exceed 'tried' (on x86, where neither
         * stores nor loads pass one another; the counters are relaxed). */
        uint64_t local = LD(c, steals_won_local) - LD(b, steals_won_local),
                 remote = LD(c, steals_won_remote) - LD(b, steals_won_remote);
        out[i] = (wf_worker_stats){
            .tasks_run = LD(c, tasks_run) - LD(b, tasks_run),
            .spawned = LD(c, spawned) - LD(b, spawned),
            .steals_tried = LD(c, steals_tried) - LD(b, steals_tried),
            .steals_won = local + remote,
            .steals_won_local = local,
            .steals_won_remote = remote,
            .inbox_taken = LD(c, inbox_taken) - LD(b, inbox_taken),
            .parks = LD(c, parks) - LD(b, parks),
            .idle_ns = LD(c, idle_ns) - LD(b, idle_ns) + asleep_ns(w),
            .actor_msgs = LD(c, actor_msgs) - LD(b, actor_msgs),
            .numa = w->numa,
            .cpu = w->cpu,
        };
    }
    return rt->nw;
}

void wf_runtime_stats_reset(wf_runtime *rt)
{
    if (!rt)
        return;
    for (int i = 0; i < rt->nw; i++) {
        wf__worker *w = rt->w[i];
#define CP(f) atomic_store_explicit(&w->base.f, LD(&w->ctr, f), memory_order_relaxed)
        CP(tasks_run);
        CP(spawned);
        CP(steals_tried);
        CP(steals_won_local);
        CP(steals_won_remote);
        CP(inbox_taken);
        CP(parks);
        CP(actor_msgs);
#undef CP
        /* A sleep going on now counts from here on only. */
        atomic_store_explicit(&w->base.idle_ns, LD(&w->ctr, idle_ns) + asleep_ns(w),
                              memory_order_relaxed);
    }
}
