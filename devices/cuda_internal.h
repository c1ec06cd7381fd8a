/* devices/cuda_internal.h: what devices/cuda.c and devices/cuda_pool.c share (only with
 * WF_HAVE_CUDA; nothing outside devices/ includes it).
 * Owns: the calls of the caching device pool (cuda_pool.c states its invariants).
 * Not here: what kernels see (devices/cuda.h), the constructors device.c calls
 *   (devices/internal.h). */
#ifndef WF_DEVICES_CUDA_INTERNAL_H
#define WF_DEVICES_CUDA_INTERNAL_H

#ifdef WF_HAVE_CUDA

#    include "cuda.h"
#    include "device.h"

#    include <stdbool.h>
#    include <stdint.h>

typedef struct wf__cuda_pool wf__cuda_pool;

/* Creates the pool of CUDA device 'ordinal' ('name' is "cuda:N", for messages); 'limit' 0:
 * none; 'fail_after' > 0: the fail_after-th allocation fails (tests).
 * Returns 0 or WF_ENOMEM. */
int wf__cuda_pool_create(const char *name, int ordinal, size_t limit, int64_t fail_after,
                         wf__cuda_pool **out);

/* Stream-ordered allocation for work on 'stream' (the device must be current).
 * Returns 0, WF_ENOMEM (after giving the cache back; the message names the device and the
 * size) or WF_EDEVICE. */
int wf__cuda_pool_alloc(wf__cuda_pool *p, size_t bytes, cudaStream_t stream, void **out);

/* Says that live block 'ptr' is also used by work on 'stream': its free then waits for
 * that work through an event. Returns 0 or WF_EINVAL. */
int wf__cuda_pool_record_stream(wf__cuda_pool *p, void *ptr, cudaStream_t stream);

/* Frees 'ptr' in stream order (see cuda_pool.c). NULL is a no-op. Threads: any. */
void wf__cuda_pool_free(wf__cuda_pool *p, void *ptr);

/* Moves freed blocks whose events completed into the cache (the device actor calls it). */
void wf__cuda_pool_process(wf__cuda_pool *p);

/* Gives every cached block back to the driver. */
void wf__cuda_pool_empty_cache(wf__cuda_pool *p);

void wf__cuda_pool_stats(wf__cuda_pool *p, wf_pool_stats *out);

/* Gives the cache back and closes the pool (the device is synchronised and going away);
 * blocks still live free themselves directly later, and the last one frees the pool. */
void wf__cuda_pool_close(wf__cuda_pool *p);

#endif /* WF_HAVE_CUDA */
#endif /* WF_DEVICES_CUDA_INTERNAL_H */
