/* devices/cuda_pool.c: the caching, stream-ordered memory pool of one CUDA device.
 * Owns: the device allocations (cudaMalloc) of one device and the cache of freed blocks,
 *   by size class and by the stream they were last used on; the counters of wf_pool_stats;
 *   the limit and fail-after options.
 * How (after PyTorch's caching allocator, without block splitting): a freed block goes back
 *   to its class's free list tagged with its stream. Work on that stream that is enqueued
 *   later runs after the work that used the block, so the next allocation on the same
 *   stream reuses it at once (stream order). An allocation on another stream may take it
 *   too, after making its stream wait for an event recorded on the block's stream (the
 *   cross-stream case). A block that was also used on other streams
 *   (wf__cuda_pool_record_stream) is freed through events: it waits on a pending list
 *   until the events recorded on those streams at free time have completed, and only then
 *   joins a free list. When cudaMalloc fails or the limit would be passed, the cache is
 *   given back to the driver (cudaFree synchronises the device) and the allocation tried
 *   once more; then it is WF_ENOMEM with a message naming the device and the size.
 * Size classes: multiples of 512 B up to 1 MiB, then four classes per power of two (at
 *   most 25% waste): a training step asks for the same sizes every time, so classes reuse
 *   well while bounding the waste.
 * Invariants: every block is on exactly one of: the live table (handed out), a free list
 *   (cached), the pending list (freed, waiting for events). bytes_live + bytes_cached ==
 *   bytes_reserved (pending blocks count as cached). Everything under 'mu'.
 * Not here: the device (cuda.c), pinned staging buffers (cuda.c). */
#ifdef WF_HAVE_CUDA

#    include "../core/error.h"
#    include "cuda_internal.h"

#    include <pthread.h>
#    include <stdio.h>
#    include <stdlib.h>
#    include <string.h>

#    define SMALL_STEP   ((size_t)512)
#    define SMALL_MAX    ((size_t)1 << 20)
#    define N_SMALL      (SMALL_MAX / SMALL_STEP) /* classes 1 .. N_SMALL */
#    define N_CLASSES    ((int)(N_SMALL + 1 + 4 * 48))
#    define HASH_BUCKETS 4096 /* the live table; chains stay short for thousands of blocks */

typedef struct block {
    void *ptr;
    size_t size; /* the class size: what cudaMalloc gave */
    int cls;
    cudaStream_t stream;  /* allocated on; reused first on it */
    int n_uses;           /* other streams it was used on (record_stream) */
    cudaStream_t uses[4]; /* at most 4: more are merged into a device-wide sync at free */
    cudaEvent_t events[4];
    int n_events;
    struct block *next; /* free list, pending list or hash chain */
} block;

struct wf__cuda_pool {
    pthread_mutex_t mu;
    char name[64]; /* "cuda:0" */
    int ordinal;
    size_t limit; /* 0: none */
    int64_t fail_after, n_alloc_calls;
    block *free_[N_CLASSES];
    block *pending;
    block *live[HASH_BUCKETS];
    int64_t n_live;
    bool closed; /* the device is gone: the last live block frees the pool */
    wf_pool_stats st;
};

static int size_class(size_t bytes, size_t *size)
{
    if (bytes == 0)
        bytes = 1;
    if (bytes <= SMALL_MAX) {
        size_t k = (bytes + SMALL_STEP - 1) / SMALL_STEP;
        *size = k * SMALL_STEP;
        return (int)k;
    }
    int e = 63 - __builtin_clzll((unsigned long long)(bytes - 1)); /* 2^e < bytes <= 2^(e+1) */
    size_t base = (size_t)1 << e, q = base / 4;
    size_t k = (bytes - base + q - 1) / q; /* 1 .. 4 quarters above 2^e */
    *size = base + k * q;
    return (int)(N_SMALL + 1 + (size_t)(e - 20) * 4 + (k - 1));
}

static size_t hash_ptr(const void *p)
{
    uintptr_t x = (uintptr_t)p >> 9;
    x ^= x >> 17;
    return (size_t)(x * 0x9E3779B97F4A7C15ull >> 52) % HASH_BUCKETS;
}

int wf__cuda_pool_create(const char *name, int ordinal, size_t limit, int64_t fail_after,
                         wf__cuda_pool **out)
{
    *out = NULL;
    wf__cuda_pool *p = calloc(1, sizeof *p);
    if (!p)
        return wf__err(WF_ENOMEM, "%s: no memory for the device pool", name);
    pthread_mutex_init(&p->mu, NULL);
    snprintf(p->name, sizeof p->name, "%s", name);
    p->ordinal = ordinal;
    p->limit = limit;
    p->fail_after = fail_after;
    p->st.numa = -1;
    *out = p;
    return 0;
}

static void pool_free_struct(wf__cuda_pool *p)
{
    pthread_mutex_destroy(&p->mu);
    free(p);
}

/* Destroys the events of 'b' (its frees are done). */
static void drop_events(block *b)
{
    for (int i = 0; i < b->n_events; i++)
        (void)cudaEventDestroy(b->events[i]);
    b->n_events = 0;
    b->n_uses = 0;
}

/* Moves pending blocks whose events have all completed to their free lists. Under 'mu'. */
static void process_pending(wf__cuda_pool *p)
{
    block **pp = &p->pending;
    while (*pp) {
        block *b = *pp;
        bool done = true;
        for (int i = 0; done && i < b->n_events; i++) {
            cudaError_t e = cudaEventQuery(b->events[i]);
            if (e == cudaErrorNotReady) {
                done = false;
            } else if (e != cudaSuccess) {
                /* A sticky device error: the block can never be proven idle; keep it out of
                 * the cache (it is given back when the pool goes). */
                (void)cudaGetLastError();
                done = false;
            }
        }
        if (!done) {
            pp = &b->next;
            continue;
        }
        *pp = b->next;
        drop_events(b);
        b->next = p->free_[b->cls];
        p->free_[b->cls] = b;
    }
}

/* Gives every cached block back to the driver. Under 'mu'. */
static void release_cache(wf__cuda_pool *p)
{
    process_pending(p);
    for (int c = 0; c < N_CLASSES; c++) {
        while (p->free_[c]) {
            block *b = p->free_[c];
            p->free_[c] = b->next;
            (void)cudaFree(b->ptr);
            p->st.bytes_cached -= b->size;
            p->st.bytes_reserved -= b->size;
            p->st.sys_frees++;
            free(b);
        }
    }
}

static int oom(wf__cuda_pool *p, size_t bytes, size_t size, const char *why)
{
    p->st.failed++;
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
        (void)cudaGetLastError();
        free_b = total_b = 0;
    }
    return wf__err(WF_ENOMEM,
                   "%s: out of device memory: %zu bytes requested (class %zu) after freeing the "
                   "cache: %s (pool: %llu bytes live, limit %zu; device: %zu of %zu bytes free)",
                   p->name, bytes, size, why, (unsigned long long)p->st.bytes_live, p->limit,
                   free_b, total_b);
}

int wf__cuda_pool_alloc(wf__cuda_pool *p, size_t bytes, cudaStream_t stream, void **out)
{
    *out = NULL;
    if (bytes > ((size_t)1 << 48)) /* no GPU has 256 TiB; keeps the class maths in range */
        return wf__err(WF_ENOMEM, "%s: out of device memory: %zu bytes requested", p->name, bytes);
    size_t size;
    int cls = size_class(bytes, &size);
    pthread_mutex_lock(&p->mu);
    int rc = 0;
    block *b = NULL;
    p->n_alloc_calls++;
    if (p->fail_after > 0 && p->n_alloc_calls >= p->fail_after) {
        p->st.failed++;
        rc = wf__err(WF_ENOMEM, "%s: allocation %lld of %zu bytes failed (fail_after hook)",
                     p->name, (long long)p->n_alloc_calls, bytes);
        goto out;
    }
    if (p->pending)
        process_pending(p);
    /* A cached block of this stream first, else one of another stream, ordered by an event. */
    block **pp = &p->free_[cls], **other = NULL;
    for (; *pp; pp = &(*pp)->next) {
        if ((*pp)->stream == stream)
            break;
        if (!other)
            other = pp;
    }
    if (!*pp && other) {
        block *o = *other;
        cudaEvent_t ev;
        cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
        if (e == cudaSuccess) {
            e = cudaEventRecord(ev, o->stream);
            if (e == cudaSuccess)
                e = cudaStreamWaitEvent(stream, ev, 0);
            (void)cudaEventDestroy(ev); /* safe while the wait is queued (CUDA semantics) */
        }
        if (e != cudaSuccess) {
            rc = wf__cuda_check(e, "ordering a cached block across streams", p->name);
            goto out;
        }
        pp = other;
    }
    if (*pp) {
        b = *pp;
        *pp = b->next;
        b->stream = stream;
        p->st.bytes_cached -= b->size;
        p->st.cache_hits++;
    } else {
        if (p->limit && p->st.bytes_reserved + size > p->limit) {
            release_cache(p);
            if (p->st.bytes_reserved + size > p->limit) {
                char why[96];
                snprintf(why, sizeof why, "the pool's limit of %zu bytes would be passed",
                         p->limit);
                rc = oom(p, bytes, size, why);
                goto out;
            }
        }
        b = calloc(1, sizeof *b);
        if (!b) {
            rc = wf__err(WF_ENOMEM, "%s: no host memory for a block header", p->name);
            goto out;
        }
        cudaError_t e = cudaMalloc(&b->ptr, size);
        if (e == cudaErrorMemoryAllocation) {
            (void)cudaGetLastError();
            release_cache(p);
            e = cudaMalloc(&b->ptr, size);
            if (e == cudaErrorMemoryAllocation) {
                (void)cudaGetLastError();
                free(b);
                b = NULL;
                rc = oom(p, bytes, size, "cudaMalloc failed");
                goto out;
            }
        }
        if (e != cudaSuccess) {
            free(b);
            b = NULL;
            rc = wf__cuda_check(e, "cudaMalloc", p->name);
            goto out;
        }
        b->size = size;
        b->cls = cls;
        b->stream = stream;
        p->st.sys_allocs++;
        p->st.bytes_reserved += size;
    }
    size_t h = hash_ptr(b->ptr);
    b->next = p->live[h];
    p->live[h] = b;
    p->n_live++;
    p->st.allocs++;
    p->st.bytes_live += b->size;
    if (p->st.bytes_live > p->st.bytes_peak)
        p->st.bytes_peak = p->st.bytes_live;
    *out = b->ptr;
out:
    pthread_mutex_unlock(&p->mu);
    return rc;
}

/* Takes 'ptr''s block out of the live table, or NULL. Under 'mu'. */
static block *take_live(wf__cuda_pool *p, void *ptr)
{
    for (block **pp = &p->live[hash_ptr(ptr)]; *pp; pp = &(*pp)->next)
        if ((*pp)->ptr == ptr) {
            block *b = *pp;
            *pp = b->next;
            p->n_live--;
            return b;
        }
    return NULL;
}

static block *find_live(wf__cuda_pool *p, void *ptr)
{
    for (block *b = p->live[hash_ptr(ptr)]; b; b = b->next)
        if (b->ptr == ptr)
            return b;
    return NULL;
}

int wf__cuda_pool_record_stream(wf__cuda_pool *p, void *ptr, cudaStream_t stream)
{
    pthread_mutex_lock(&p->mu);
    block *b = find_live(p, ptr);
    int rc = 0;
    if (!b) {
        rc = wf__err(WF_EINVAL, "%s: record_stream: %p is not a live block of this pool", p->name,
                     ptr);
    } else if (stream != b->stream) {
        bool known = false;
        for (int i = 0; i < b->n_uses; i++)
            known |= b->uses[i] == stream;
        if (!known && b->n_uses < 4)
            b->uses[b->n_uses++] = stream;
        else if (!known)
            b->n_uses = 5; /* too many: free() synchronises the device instead */
    }
    pthread_mutex_unlock(&p->mu);
    return rc;
}

void wf__cuda_pool_free(wf__cuda_pool *p, void *ptr)
{
    if (!ptr)
        return;
    pthread_mutex_lock(&p->mu);
    block *b = take_live(p, ptr);
    if (!b) {
        /* An internal error (a double free, a foreign pointer): never crash on it. */
        wf__err(WF_EINVAL, "%s: free of %p, which is not a live block", p->name, ptr);
        pthread_mutex_unlock(&p->mu);
        return;
    }
    p->st.frees++;
    p->st.bytes_live -= b->size;
    int dev_prev = -1;
    if (p->closed) {
        /* The device is closed: its streams are gone and synchronised; give it back. */
        (void)cudaGetDevice(&dev_prev);
        (void)cudaSetDevice(p->ordinal);
        (void)cudaFree(b->ptr);
        p->st.bytes_reserved -= b->size;
        p->st.sys_frees++;
        free(b);
        bool last = p->n_live == 0;
        pthread_mutex_unlock(&p->mu);
        if (dev_prev >= 0)
            (void)cudaSetDevice(dev_prev);
        if (last) /* close() emptied the cache and the pending list */
            pool_free_struct(p);
        return;
    }
    p->st.bytes_cached += b->size;
    if (b->n_uses > 4) {
        (void)cudaDeviceSynchronize(); /* used on more streams than we track */
        b->n_uses = 0;
    }
    if (b->n_uses == 0) {
        b->next = p->free_[b->cls];
        p->free_[b->cls] = b;
        pthread_mutex_unlock(&p->mu);
        return;
    }
    bool ok = true;
    for (int i = 0; i < b->n_uses; i++) {
        cudaEvent_t ev;
        if (cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) != cudaSuccess) {
            ok = false;
            break;
        }
        b->events[b->n_events++] = ev;
        if (cudaEventRecord(ev, b->uses[i]) != cudaSuccess) {
            ok = false;
            break;
        }
    }
    if (!ok) {
        (void)cudaGetLastError();
        (void)cudaDeviceSynchronize(); /* cannot order it: wait for everything instead */
        drop_events(b);
        b->next = p->free_[b->cls];
        p->free_[b->cls] = b;
    } else {
        b->next = p->pending;
        p->pending = b;
    }
    pthread_mutex_unlock(&p->mu);
}

void wf__cuda_pool_process(wf__cuda_pool *p)
{
    pthread_mutex_lock(&p->mu);
    if (p->pending)
        process_pending(p);
    pthread_mutex_unlock(&p->mu);
}

void wf__cuda_pool_empty_cache(wf__cuda_pool *p)
{
    pthread_mutex_lock(&p->mu);
    release_cache(p);
    pthread_mutex_unlock(&p->mu);
}

void wf__cuda_pool_stats(wf__cuda_pool *p, wf_pool_stats *out)
{
    pthread_mutex_lock(&p->mu);
    *out = p->st;
    pthread_mutex_unlock(&p->mu);
}

void wf__cuda_pool_close(wf__cuda_pool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    /* The caller synchronised the device: pending events have completed. */
    release_cache(p);
    while (p->pending) { /* events that failed (a sticky error): give them back anyway */
        block *b = p->pending;
        p->pending = b->next;
        drop_events(b);
        (void)cudaFree(b->ptr);
        p->st.bytes_cached -= b->size;
        p->st.bytes_reserved -= b->size;
        free(b);
    }
    p->closed = true;
    bool last = p->n_live == 0;
    pthread_mutex_unlock(&p->mu);
    if (last)
        pool_free_struct(p);
}

#endif /* WF_HAVE_CUDA */
