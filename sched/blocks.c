/* sched/blocks.c: the runtime's cache of large blocks for task graphs.
 * Owns: blocks of at least BLOCK_MIN bytes that a destroyed (or recompiled) graph gave
 * back, kept for the next graph instead of being returned to the system. A graph of a
 * million nodes needs ~100 MB; memory that glibc maps afresh for each graph is faulted in
 * and zeroed page by page by the kernel, which took half of building a 1M-node chain here
 * (perf: clear_page_erms under wf_taskgraph_add). A block taken again is not zeroed.
 * Invariant: the cache holds at most MAX_BLOCKS blocks and MAX_BYTES bytes; a block is
 * either in the cache or owned by exactly one graph. The cache is reference counted (the
 * runtime holds one reference, every graph another), so a graph destroyed after its
 * runtime still has a cache to give its blocks back to.
 * Not here: what the blocks hold (taskgraph.c). */
#include "internal.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define BLOCK_MIN  ((size_t)1 << 20) /* smaller blocks: plain malloc, glibc reuses them */
#define HUGE_MIN   ((size_t)4 << 20) /* blocks this large ask for transparent huge pages */
#define MAX_BLOCKS 32
#define MAX_BYTES  ((size_t)512 << 20) /* cached at most; more goes back to the system */

struct wf__blocks {
    pthread_mutex_t mu;
    _Atomic int refs;
    int n;
    size_t bytes; /* sum of 'size' over the cached blocks */
    void *p[MAX_BLOCKS];
    size_t size[MAX_BLOCKS];
};

wf__blocks *wf__blocks_new(void)
{
    wf__blocks *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    pthread_mutex_init(&c->mu, NULL);
    atomic_init(&c->refs, 1);
    return c;
}

wf__blocks *wf__blocks_retain(wf__blocks *c)
{
    atomic_fetch_add_explicit(&c->refs, 1, memory_order_relaxed);
    return c;
}

void wf__blocks_release(wf__blocks *c)
{
    if (!c || atomic_fetch_sub_explicit(&c->refs, 1, memory_order_acq_rel) != 1)
        return;
    for (int i = 0; i < c->n; i++)
        free(c->p[i]);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

static void advise_huge(void *p, size_t bytes)
{
    if (bytes < HUGE_MIN)
        return;
    uintptr_t a = ((uintptr_t)p + 4095) & ~(uintptr_t)4095;
    uintptr_t b = ((uintptr_t)p + bytes) & ~(uintptr_t)4095;
    if (b > a)
        madvise((void *)a, b - a, MADV_HUGEPAGE);
}

void *wf__blocks_get(wf__blocks *c, size_t bytes)
{
    bytes = (bytes + WF_CACHELINE - 1) & ~(size_t)(WF_CACHELINE - 1);
    if (!bytes)
        bytes = WF_CACHELINE;
    if (bytes >= BLOCK_MIN) {
        /* The smallest cached block that fits and wastes at most half of itself. */
        pthread_mutex_lock(&c->mu);
        int best = -1;
        for (int i = 0; i < c->n; i++)
            if (c->size[i] >= bytes && c->size[i] / 2 <= bytes &&
                (best < 0 || c->size[i] < c->size[best]))
                best = i;
        void *p = NULL;
        if (best >= 0) {
            p = c->p[best];
            c->bytes -= c->size[best];
            c->n--;
            c->p[best] = c->p[c->n];
            c->size[best] = c->size[c->n];
        }
        pthread_mutex_unlock(&c->mu);
        if (p)
            return p;
    }
    void *p = aligned_alloc(WF_CACHELINE, bytes);
    if (p)
        advise_huge(p, bytes);
    return p;
}

void wf__blocks_put(wf__blocks *c, void *p, size_t bytes)
{
    if (!p)
        return;
    bytes = (bytes + WF_CACHELINE - 1) & ~(size_t)(WF_CACHELINE - 1);
    if (!bytes)
        bytes = WF_CACHELINE;
    if (bytes >= BLOCK_MIN) {
        pthread_mutex_lock(&c->mu);
        bool kept = c->n < MAX_BLOCKS && c->bytes + bytes <= MAX_BYTES;
        if (kept) {
            c->p[c->n] = p;
            c->size[c->n++] = bytes;
            c->bytes += bytes;
        }
        pthread_mutex_unlock(&c->mu);
        if (kept)
            return;
    }
    free(p);
}

void *wf__blocks_grow(wf__blocks *c, void *p, size_t used, size_t old_bytes, size_t new_bytes)
{
    void *q = wf__blocks_get(c, new_bytes);
    if (!q)
        return NULL;
    if (used)
        memcpy(q, p, used);
    wf__blocks_put(c, p, old_bytes);
    return q;
}
