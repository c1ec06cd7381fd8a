/* memory/pool.c: size-class pools of host memory, bound to one NUMA node.
 * Owns: the free lists, the blocks behind them, the pool's counters and limit, and
 * pool-backed buffers and tensors.
 * Design: a request is rounded up to a size class (64 B, 128 B, then alternating 1.5x and
 * 2x steps up to 64 MiB; all multiples of 64). Each class has a shared free list under its
 * own mutex; each worker of the runtime also has a small cache of the smaller classes
 * (up to CACHE_MAX_CLASS), guarded by a mutex that only its owner takes on the fast path
 * (uncontended: no cache-line ping-pong) and that wf_pool_trim() takes to drain it. Threads
 * that are not workers use the shared lists. A free block stores the next link in its
 * first word. Blocks above WF_POOL_MAX_CLASS are taken from and given back to the system
 * directly.
 * NUMA: with more than one node, a block of a page or more comes from hwloc_alloc() and is
 * bound with hwloc_set_area_membind() to the node's nodeset (MEMBIND_BIND). Where binding
 * is impossible (a synthetic topology, a restricted process) the block is still used and
 * 'bind_failed' counts it: misplaced memory is slower, not wrong. Smaller
 * blocks come from aligned_alloc() and are placed by first touch, since binding acts on
 * whole pages that they would share with other data. With one node every block comes from
 * aligned_alloc().
 * Invariants:
 * - A block of a class is in exactly one place: handed out (counted in 'live'), in one
 *   worker cache, or in its class's shared list. 'reserved' is the sum of the class sizes of
 *   all three; with a limit, 'reserved' never exceeds it (reserve() is a CAS loop).
 * - 'refs' is 1 for the owner (until wf_pool_destroy()) plus 1 per live pool-backed buffer;
 *   the last reference trims and frees the pool. After destroy ('dead'), frees go straight
 *   back to the system.
 * Not here: device memory (devices/), the static planner of compiled graphs. */
#include "pool.h"

#include "../core/error.h"

#include <weft/memory.h>

#include <hwloc.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NCLASS          40                /* 64 B .. 64 MiB */
#define CACHE_MAX_CLASS 23                /* classes up to 256 KiB have per-worker caches */
#define CACHE_BYTES     ((size_t)1 << 20) /* a worker caches up to this much per class... */
#define CACHE_MIN_N     4                 /* ... but at least this many blocks ... */
#define CACHE_MAX_N     32                /* ... and at most this many */

typedef struct flist {
    void *head;
    uint32_t n;
} flist;

typedef struct wcache {
    _Alignas(64) pthread_mutex_t mu;
    flist c[CACHE_MAX_CLASS + 1];
    /* Counts of the operations served by this cache, under 'mu': the fast path touches no
     * shared counter but 'live' (shared counters on every operation cost more than the rest
     * of an alloc+free pair on 2 workers). */
    uint64_t allocs, frees;
} wcache;

typedef struct sclass {
    _Alignas(64) pthread_mutex_t mu;
    void *head;
    uint64_t n;
} sclass;

struct wf_pool {
    wf_runtime *rt;
    hwloc_topology_t topo;
    hwloc_nodeset_t nodeset; /* the node's, when 'bind' */
    bool bind;
    int numa;
    size_t page;
    size_t limit;
    int64_t fail_after;
    int nw;
    wcache *wc; /* one per worker */
    _Atomic int64_t refs;
    _Atomic bool dead;
    _Atomic int64_t calls; /* wf_pool_alloc calls, counted only with fail_after */
    _Alignas(64) _Atomic uint64_t live, peak, reserved;
    _Alignas(64) _Atomic uint64_t allocs, frees, hits, sys_allocs, sys_frees, failed, bind_failed;
    sclass sc[NCLASS];
};

/* ---- Size classes ---- */

static size_t class_size(int c)
{
    if (c == 0)
        return 64;
    if (c & 1)
        return (size_t)1 << ((c + 13) / 2); /* 128, 256, 512, ... */
    return (size_t)3 << ((c + 14) / 2 - 2); /* 192, 384, 768, ... */
}

/* The class of a request, or -1 above WF_POOL_MAX_CLASS. */
static int class_of(size_t bytes)
{
    if (bytes <= 64)
        return 0;
    if (bytes <= 128)
        return 1;
    if (bytes > WF_POOL_MAX_CLASS)
        return -1;
    int p = 64 - __builtin_clzll((unsigned long long)(bytes - 1)); /* 2^p >= bytes */
    return bytes <= ((size_t)3 << (p - 2)) ? 2 * p - 14 : 2 * p - 13;
}

static uint32_t cache_cap(int c)
{
    size_t n = CACHE_BYTES / class_size(c);
    return n < CACHE_MIN_N ? CACHE_MIN_N : n > CACHE_MAX_N ? CACHE_MAX_N : (uint32_t)n;
}

/* ---- The system side ---- */

static void *sys_alloc(wf_pool *p, size_t size)
{
    if (!p->bind || size < p->page)
        return aligned_alloc(WF_POOL_ALIGN, size);
    /* hwloc_alloc() is page-aligned (mmap on Linux); hwloc_alloc_membind()'s fallback, when
     * it cannot bind, is a plain malloc() without our alignment, so bind separately. */
    void *b = hwloc_alloc(p->topo, size);
    if (b && hwloc_set_area_membind(p->topo, b, size, p->nodeset, HWLOC_MEMBIND_BIND,
                                    HWLOC_MEMBIND_BYNODESET) < 0)
        atomic_fetch_add_explicit(&p->bind_failed, 1, memory_order_relaxed);
    return b;
}

/* Pairs with sys_alloc(): the choice depends only on the pool and the size. */
static void sys_free(wf_pool *p, void *b, size_t size)
{
    if (p->bind && size >= p->page)
        hwloc_free(p->topo, b, size);
    else
        free(b);
}

#define RLX memory_order_relaxed

static void release_blocks(wf_pool *p, void *head, size_t size)
{
    uint64_t n = 0;
    while (head) {
        void *next = *(void **)head;
        sys_free(p, head, size);
        head = next;
        n++;
    }
    if (n) {
        atomic_fetch_sub_explicit(&p->reserved, n * size, RLX);
        atomic_fetch_add_explicit(&p->sys_frees, n, RLX);
    }
}

static void trim_all(wf_pool *p)
{
    for (int c = 0; c < NCLASS; c++) {
        pthread_mutex_lock(&p->sc[c].mu);
        void *head = p->sc[c].head;
        p->sc[c].head = NULL;
        p->sc[c].n = 0;
        pthread_mutex_unlock(&p->sc[c].mu);
        release_blocks(p, head, class_size(c));
    }
    for (int w = 0; w < p->nw; w++) {
        void *heads[CACHE_MAX_CLASS + 1];
        pthread_mutex_lock(&p->wc[w].mu);
        for (int c = 0; c <= CACHE_MAX_CLASS; c++) {
            heads[c] = p->wc[w].c[c].head;
            p->wc[w].c[c] = (flist){ NULL, 0 };
        }
        pthread_mutex_unlock(&p->wc[w].mu);
        for (int c = 0; c <= CACHE_MAX_CLASS; c++)
            release_blocks(p, heads[c], class_size(c));
    }
}

/* Counts 'size' more bytes held from the system, keeping under the limit: when the limit
 * would be passed, the cached blocks are released once and the count is tried again. */
static int reserve(wf_pool *p, size_t size, size_t bytes)
{
    if (!p->limit) {
        atomic_fetch_add_explicit(&p->reserved, size, RLX);
        return 0;
    }
    for (int tried = 0; tried < 2; tried++) {
        uint64_t cur = atomic_load_explicit(&p->reserved, RLX);
        while (cur + size <= p->limit)
            if (atomic_compare_exchange_weak_explicit(&p->reserved, &cur, cur + size, RLX, RLX))
                return 0;
        if (!tried)
            trim_all(p);
    }
    return wf__err(WF_ENOMEM,
                   "wf_pool_alloc: %zu bytes (a block of %zu) would bring the pool of NUMA "
                   "node %d to %llu bytes, above its limit of %zu (%llu bytes live)",
                   bytes, size, p->numa,
                   (unsigned long long)(atomic_load_explicit(&p->reserved, RLX) + size), p->limit,
                   (unsigned long long)atomic_load_explicit(&p->live, RLX));
}

/* ---- Create and destroy ---- */

int wf_pool_create(wf_runtime *rt, const wf_pool_opts *o, wf_pool **out)
{
    if (!out)
        return wf__err(WF_EINVAL, "wf_pool_create: out is NULL");
    *out = NULL;
    if (!rt)
        return wf__err(WF_EINVAL, "wf_pool_create: rt is NULL");
    wf_pool_opts opts = o ? *o : (wf_pool_opts){ 0 };
    int nnuma = wf_runtime_numa_count(rt);
    int numa = opts.numa;
    if (numa == WF_POOL_NUMA_CALLER) {
        int w = wf_runtime_current_worker(rt);
        numa = w >= 0 ? wf_runtime_worker_numa(rt, w) : 0;
    }
    if (numa < 0 || numa >= nnuma)
        return wf__err(WF_EINVAL,
                       "wf_pool_create: numa is %d, but the runtime has NUMA nodes 0..%d "
                       "(or WF_POOL_NUMA_CALLER)",
                       opts.numa, nnuma - 1);
    if (opts.flags)
        return wf__err(WF_EINVAL, "wf_pool_create: unknown flags 0x%x", (unsigned)opts.flags);
    if (opts.fail_after < 0)
        return wf__err(WF_EINVAL, "wf_pool_create: fail_after is %lld, not >= 0",
                       (long long)opts.fail_after);
    wf_pool *p = aligned_alloc(64, (sizeof *p + 63) & ~(size_t)63);
    if (!p)
        return wf__err(WF_ENOMEM, "wf_pool_create: no memory");
    memset(p, 0, sizeof *p);
    p->rt = rt;
    p->topo = wf_runtime_hwloc_topology(rt);
    p->numa = numa;
    long pg = sysconf(_SC_PAGESIZE);
    p->page = pg > 0 ? (size_t)pg : 4096;
    p->limit = opts.limit_bytes;
    p->fail_after = opts.fail_after;
    p->nw = wf_runtime_worker_count(rt);
    if (nnuma > 1 && p->topo) {
        hwloc_obj_t node = hwloc_get_obj_by_type(p->topo, HWLOC_OBJ_NUMANODE, (unsigned)numa);
        if (node && node->nodeset) {
            p->nodeset = hwloc_bitmap_dup(node->nodeset);
            if (!p->nodeset) {
                free(p);
                return wf__err(WF_ENOMEM, "wf_pool_create: no memory");
            }
            p->bind = true;
        }
    }
    p->wc = aligned_alloc(64, (size_t)(p->nw > 0 ? p->nw : 1) * sizeof *p->wc);
    if (!p->wc) {
        int nw = p->nw;
        hwloc_bitmap_free(p->nodeset);
        free(p);
        return wf__err(WF_ENOMEM, "wf_pool_create: no memory for %d worker caches", nw);
    }
    memset(p->wc, 0, (size_t)(p->nw > 0 ? p->nw : 1) * sizeof *p->wc);
    for (int w = 0; w < p->nw; w++)
        pthread_mutex_init(&p->wc[w].mu, NULL);
    for (int c = 0; c < NCLASS; c++)
        pthread_mutex_init(&p->sc[c].mu, NULL);
    atomic_init(&p->refs, 1);
    *out = p;
    return 0;
}

static void unref(wf_pool *p)
{
    if (atomic_fetch_sub_explicit(&p->refs, 1, memory_order_acq_rel) != 1)
        return;
    trim_all(p);
    for (int w = 0; w < p->nw; w++)
        pthread_mutex_destroy(&p->wc[w].mu);
    for (int c = 0; c < NCLASS; c++)
        pthread_mutex_destroy(&p->sc[c].mu);
    hwloc_bitmap_free(p->nodeset);
    free(p->wc);
    free(p);
}

void wf_pool_destroy(wf_pool *p)
{
    if (!p)
        return;
    atomic_store_explicit(&p->dead, true, memory_order_release);
    trim_all(p);
    unref(p);
}

/* ---- Allocate and free ---- */

static void note_live(wf_pool *p, size_t size)
{
    uint64_t live = atomic_fetch_add_explicit(&p->live, size, RLX) + size;
    uint64_t peak = atomic_load_explicit(&p->peak, RLX);
    while (live > peak && !atomic_compare_exchange_weak_explicit(&p->peak, &peak, live, RLX, RLX)) {
    }
}

static int fail(wf_pool *p, int code)
{
    atomic_fetch_add_explicit(&p->failed, 1, RLX);
    return code;
}

int wf_pool_alloc(wf_pool *p, size_t bytes, void **out)
{
    if (!out)
        return wf__err(WF_EINVAL, "wf_pool_alloc: out is NULL");
    *out = NULL;
    if (!p)
        return wf__err(WF_EINVAL, "wf_pool_alloc: pool is NULL");
    if (p->fail_after > 0 && atomic_fetch_add_explicit(&p->calls, 1, RLX) + 1 == p->fail_after)
        return fail(p, wf__err(WF_ENOMEM,
                               "wf_pool_alloc: allocation %lld of %zu bytes failed on purpose "
                               "(wf_pool_opts.fail_after)",
                               (long long)p->fail_after, bytes));
    int c = class_of(bytes);
    size_t size;
    void *b = NULL;
    if (c < 0) {
        if (bytes > SIZE_MAX - p->page)
            return fail(p, wf__err(WF_EINVAL, "wf_pool_alloc: %zu bytes is too large", bytes));
        size = (bytes + p->page - 1) & ~(p->page - 1);
    } else {
        size = class_size(c);
        int w = c <= CACHE_MAX_CLASS ? wf_runtime_current_worker(p->rt) : -1;
        if (w >= 0 && w < p->nw) {
            flist *f = &p->wc[w].c[c];
            pthread_mutex_lock(&p->wc[w].mu);
            if ((b = f->head)) {
                f->head = *(void **)b;
                f->n--;
                p->wc[w].allocs++; /* a cache hit too */
            }
            pthread_mutex_unlock(&p->wc[w].mu);
            if (b) {
                note_live(p, size);
                *out = b;
                return 0;
            }
        }
        if (!b) {
            pthread_mutex_lock(&p->sc[c].mu);
            if ((b = p->sc[c].head)) {
                p->sc[c].head = *(void **)b;
                p->sc[c].n--;
            }
            pthread_mutex_unlock(&p->sc[c].mu);
        }
        if (b) {
            atomic_fetch_add_explicit(&p->hits, 1, RLX);
            atomic_fetch_add_explicit(&p->allocs, 1, RLX);
            note_live(p, size);
            *out = b;
            return 0;
        }
    }
    int rc = reserve(p, size, bytes);
    if (rc < 0)
        return fail(p, rc);
    b = sys_alloc(p, size);
    if (!b) {
        atomic_fetch_sub_explicit(&p->reserved, size, RLX);
        return fail(p, wf__err(WF_ENOMEM,
                               "wf_pool_alloc: the system has no memory for %zu bytes (a block "
                               "of %zu) on NUMA node %d",
                               bytes, size, p->numa));
    }
    atomic_fetch_add_explicit(&p->sys_allocs, 1, RLX);
    atomic_fetch_add_explicit(&p->allocs, 1, RLX);
    note_live(p, size);
    *out = b;
    return 0;
}

void wf_pool_free(wf_pool *p, void *b, size_t bytes)
{
    if (!p || !b)
        return;
    int c = class_of(bytes);
    size_t size = c < 0 ? (bytes + p->page - 1) & ~(p->page - 1) : class_size(c);
    atomic_fetch_sub_explicit(&p->live, size, RLX);
    if (c < 0 || atomic_load_explicit(&p->dead, memory_order_acquire)) {
        atomic_fetch_add_explicit(&p->frees, 1, RLX);
        sys_free(p, b, size);
        atomic_fetch_sub_explicit(&p->reserved, size, RLX);
        atomic_fetch_add_explicit(&p->sys_frees, 1, RLX);
        return;
    }
    int w = c <= CACHE_MAX_CLASS ? wf_runtime_current_worker(p->rt) : -1;
    if (w >= 0 && w < p->nw) {
        flist *f = &p->wc[w].c[c];
        void *spill = NULL, *spill_tail = NULL;
        uint32_t nspill = 0;
        pthread_mutex_lock(&p->wc[w].mu);
        p->wc[w].frees++;
        *(void **)b = f->head;
        f->head = b;
        if (++f->n > cache_cap(c)) {
            /* Full: hand half of the cache to the shared list in one lock, so a worker that
             * only frees (a consumer of another's blocks) does not take the lock per free. */
            nspill = f->n / 2;
            spill = f->head;
            spill_tail = spill;
            for (uint32_t i = 1; i < nspill; i++)
                spill_tail = *(void **)spill_tail;
            f->head = *(void **)spill_tail;
            f->n -= nspill;
        }
        pthread_mutex_unlock(&p->wc[w].mu);
        if (!nspill)
            return;
        pthread_mutex_lock(&p->sc[c].mu);
        *(void **)spill_tail = p->sc[c].head;
        p->sc[c].head = spill;
        p->sc[c].n += nspill;
        pthread_mutex_unlock(&p->sc[c].mu);
        return;
    }
    atomic_fetch_add_explicit(&p->frees, 1, RLX);
    pthread_mutex_lock(&p->sc[c].mu);
    *(void **)b = p->sc[c].head;
    p->sc[c].head = b;
    p->sc[c].n++;
    pthread_mutex_unlock(&p->sc[c].mu);
}

int wf_pool_trim(wf_pool *p)
{
    if (!p)
        return wf__err(WF_EINVAL, "wf_pool_trim: pool is NULL");
    trim_all(p);
    return 0;
}

int wf_pool_get_stats(const wf_pool *p, wf_pool_stats *out)
{
    if (!p || !out)
        return wf__err(WF_EINVAL, "wf_pool_get_stats: %s is NULL", p ? "out" : "pool");
    wf_pool *q = (wf_pool *)(uintptr_t)p; /* atomics and locks need a non-const pointer */
    uint64_t wallocs = 0, wfrees = 0;
    for (int w = 0; w < q->nw; w++) {
        pthread_mutex_lock(&q->wc[w].mu);
        wallocs += q->wc[w].allocs;
        wfrees += q->wc[w].frees;
        pthread_mutex_unlock(&q->wc[w].mu);
    }
    uint64_t live = atomic_load_explicit(&q->live, RLX);
    uint64_t reserved = atomic_load_explicit(&q->reserved, RLX);
    *out = (wf_pool_stats){
        .bytes_live = live,
        .bytes_peak = atomic_load_explicit(&q->peak, RLX),
        .bytes_cached = reserved > live ? reserved - live : 0,
        .bytes_reserved = reserved,
        .allocs = atomic_load_explicit(&q->allocs, RLX) + wallocs,
        .frees = atomic_load_explicit(&q->frees, RLX) + wfrees,
        .cache_hits = atomic_load_explicit(&q->hits, RLX) + wallocs,
        .sys_allocs = atomic_load_explicit(&q->sys_allocs, RLX),
        .sys_frees = atomic_load_explicit(&q->sys_frees, RLX),
        .failed = atomic_load_explicit(&q->failed, RLX),
        .bind_failed = atomic_load_explicit(&q->bind_failed, RLX),
        .numa = p->numa,
        .bound = p->bind,
    };
    return 0;
}

/* ---- Pool-backed buffers and tensors ---- */

static void buffer_free(void *ctx, void *data, size_t bytes)
{
    wf_pool *p = ctx;
    wf_pool_free(p, data, bytes);
    unref(p);
}

int wf__pool_buffer(wf_pool *p, size_t bytes, wf_buffer **out)
{
    *out = NULL;
    wf_buffer *b = malloc(sizeof *b);
    if (!b)
        return wf__err(WF_ENOMEM, "wf_pool: no memory for a buffer header");
    void *data;
    int rc = wf_pool_alloc(p, bytes, &data);
    if (rc < 0) {
        free(b);
        return rc;
    }
    atomic_fetch_add_explicit(&p->refs, 1, RLX);
    atomic_init(&b->refs, 1);
    b->data = data;
    b->bytes = bytes;
    b->free_fn = buffer_free;
    b->free_ctx = p;
    *out = b;
    return 0;
}

/* A pool-backed tensor: its header and buffer are one malloc() (wf__tensor_adopt), not
 * two (a static graph of scalar nodes makes one per node and run). */
static wf_tensor *make_tensor(wf_pool *p, wf_dtype dt, wf_shape shape, size_t bytes)
{
    void *data;
    if (wf_pool_alloc(p, bytes, &data) < 0)
        return NULL;
    atomic_fetch_add_explicit(&p->refs, 1, RLX);
    wf_tensor *t = wf__tensor_adopt(dt, shape, data, bytes, buffer_free, p);
    if (!t)
        buffer_free(p, data, bytes); /* gives the block and the reference back */
    return t;
}

wf_tensor *wf__pool_tensor_alloc(wf_pool *p, wf_dtype dt, wf_shape shape)
{
    size_t bytes = 0;
    if (!p) {
        wf__err(WF_EINVAL, "wf_pool_tensor: pool is NULL");
        return NULL;
    }
    if (wf__tensor_check("wf_pool_tensor", dt, shape, &bytes) < 0)
        return NULL;
    return make_tensor(p, dt, shape, bytes);
}

int wf_pool_tensor(wf_pool *p, wf_dtype dt, wf_shape shape, const void *data, wf_tensor **out)
{
    if (!out)
        return wf__err(WF_EINVAL, "wf_pool_tensor: out is NULL");
    *out = NULL;
    if (!p)
        return wf__err(WF_EINVAL, "wf_pool_tensor: pool is NULL");
    size_t bytes = 0;
    int rc = wf__tensor_check("wf_pool_tensor", dt, shape, &bytes);
    if (rc < 0)
        return rc;
    wf_tensor *t = make_tensor(p, dt, shape, bytes);
    if (!t)
        return WF_ENOMEM;
    if (data)
        memcpy(t->data, data, bytes);
    else
        memset(t->data, 0, bytes);
    *out = t;
    return 0;
}
