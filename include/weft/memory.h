/* weft/memory.h: host memory pools.
 * Owns: the public contract of memory/: size-class pools of host memory bound to a NUMA
 * node, their statistics, a byte limit, trimming, a fail-after-N hook for tests, and
 * tensors whose buffers come from a pool.
 * Not here: device memory and copies (weft/devices.h), the static memory planner of
 * compiled graphs (runtime/). */
#ifndef WEFT_MEMORY_H
#define WEFT_MEMORY_H

#include <weft/base.h>
#include <weft/core.h>
#include <weft/sched.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct wf_pool wf_pool; /* opaque: layout private to memory/ */

/* Blocks are served in size classes: 64 B, 128 B, then steps of 1.5x and 2x (192, 256,
 * 384, 512, 768, ...) up to WF_POOL_MAX_CLASS; every block is 64-byte aligned. Larger
 * requests are mapped directly and returned to the system when freed (never cached). */
#define WF_POOL_MIN_CLASS ((size_t)64)
#define WF_POOL_MAX_CLASS ((size_t)64 << 20)
#define WF_POOL_ALIGN     64

#define WF_POOL_NUMA_CALLER (-1) /* wf_pool_opts.numa: the calling worker's node */

typedef struct wf_pool_opts {
    size_t limit_bytes; /* 0: no limit. Else the most bytes the pool may hold from the system
                           (live plus cached, in class sizes); an allocation that would go
                           above it first releases the cached blocks, then fails with
                           WF_ENOMEM. */
    int numa;           /* NUMA node the memory is bound to: 0 .. wf_runtime_numa_count()-1
                           (0, the default, is node 0), or WF_POOL_NUMA_CALLER: the node of
                           the calling worker (node 0 from a thread that is not a worker). */
    uint32_t flags;     /* none yet: must be 0 */
    int64_t fail_after; /* 0: never. N > 0: the Nth call of wf_pool_alloc() (counting from
                           the pool's creation, wf_pool_tensor() included) fails with
                           WF_ENOMEM as if the system had no memory; for tests of
                           out-of-memory paths. Only that one call fails. */
} wf_pool_opts;

/* Creates a host memory pool of 'rt'. On a machine (or synthetic topology) with more than
 * one NUMA node, blocks of a page or more are bound to the pool's node with hwloc; smaller
 * blocks are placed by the first touch of the allocating thread. Each worker of 'rt' keeps
 * a small cache of freed blocks per class, so that a worker reuses its own blocks without
 * taking a shared lock.
 * Returns 0, WF_EINVAL (NULL argument, a node out of range, unknown flags, a negative
 * fail_after) or WF_ENOMEM; the reason is in wf_last_errmsg().
 * Ownership: on success the caller owns '*out' (free with wf_pool_destroy()); on failure
 *   '*out' is NULL. 'o' may be NULL (all defaults) and is not kept. 'rt' is borrowed and
 *   must outlive the pool and every tensor made by wf_pool_tensor().
 * Threads: any. */
WF_API WF_NODISCARD int wf_pool_create(wf_runtime *rt, const wf_pool_opts *o, wf_pool **out);

/* Returns every cached block to the system and frees the pool. Blocks still held through
 * wf_pool_alloc() must have been freed; tensors made by wf_pool_tensor() may outlive this
 * call (their buffers then go back to the system on their last release). NULL is a no-op.
 * Threads: no other call on 'p' may run at the same time (tensor releases may). */
WF_API void wf_pool_destroy(wf_pool *p);

/* Allocates 'bytes' (0 is served as the smallest class) aligned to WF_POOL_ALIGN.
 * Returns 0 with the block in '*out', WF_EINVAL (NULL argument, or 'bytes' too large to
 * round up) or WF_ENOMEM (the system refused, the limit would be exceeded even after the
 * cached blocks were released, or the fail_after hook fired); the reason is in
 * wf_last_errmsg() and '*out' is NULL.
 * Ownership: the caller owns the block; return it with wf_pool_free(p, block, bytes).
 * Threads: any thread, workers of the pool's runtime or not. */
WF_API WF_NODISCARD int wf_pool_alloc(wf_pool *p, size_t bytes, void **out);

/* Returns a block from wf_pool_alloc() of the same pool; 'bytes' must be the size that was
 * asked for (the pool finds the size class from it). NULL 'p' or 'block' is a no-op.
 * Ownership: steals 'block'. Threads: any thread, not necessarily the allocating one. */
WF_API void wf_pool_free(wf_pool *p, void *block, size_t bytes);

typedef struct wf_pool_stats {
    uint64_t bytes_live;     /* handed out and not yet freed, in class sizes */
    uint64_t bytes_peak;     /* the most bytes_live at one time */
    uint64_t bytes_cached;   /* freed blocks kept for reuse */
    uint64_t bytes_reserved; /* held from the system: bytes_live + bytes_cached */
    uint64_t allocs;         /* successful allocations */
    uint64_t frees;          /* blocks returned */
    uint64_t cache_hits;     /* allocations served by a cached block */
    uint64_t sys_allocs;     /* blocks taken from the system */
    uint64_t sys_frees;      /* blocks given back to the system */
    uint64_t failed;         /* allocations that returned WF_ENOMEM */
    uint64_t bind_failed;    /* blocks the system would not bind to the node (a synthetic
                                topology, a restricted process): used anyway */
    int numa;                /* the NUMA node the pool is bound to */
    int bound;               /* 1 if blocks are bound with hwloc (more than one NUMA node) */
} wf_pool_stats;

/* Copies the pool's counters to '*out'. Each counter is exact; while other threads
 * allocate they are not a snapshot of one instant.
 * Returns 0 or WF_EINVAL. Threads: any. */
WF_API WF_NODISCARD int wf_pool_get_stats(const wf_pool *p, wf_pool_stats *out);

/* Returns every cached block (the shared lists and every worker's cache) to the system.
 * Returns 0 or WF_EINVAL. Threads: any; allocations may run meanwhile. */
WF_API WF_NODISCARD int wf_pool_trim(wf_pool *p);

/* Creates a contiguous tensor whose buffer comes from 'p' and goes back to it on the last
 * release of the tensor and its views. 'data' (numel * dtype size bytes) is copied in;
 * NULL gives zeros.
 * Returns 0, WF_EINVAL (invalid dtype, a negative dimension, rank above WF_MAX_RANK, NULL
 * 'p' or 'out') or WF_ENOMEM; the reason is in wf_last_errmsg().
 * Ownership: on success the caller owns '*out' (wf_tensor_release()); 'data' is copied.
 *   The tensor keeps the pool's memory alive, not its caches: see wf_pool_destroy().
 * Threads: any. */
WF_API WF_NODISCARD int wf_pool_tensor(wf_pool *p, wf_dtype dt, wf_shape shape, const void *data,
                                       wf_tensor **out);

#ifdef __cplusplus
}
#endif
#endif /* WEFT_MEMORY_H */
