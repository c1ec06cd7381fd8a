/* memory/pool.h: what the modules above memory/ (devices/, ops/, runtime/) use of pools
 * beyond the public header (a module interface: not installed, not internal.h).
 * Owns: pool-backed buffers and uninitialised pool-backed tensors, for kernels that fill
 * their outputs.
 * Invariant: a buffer made here holds one reference on its pool until its last release,
 * which returns the block to that pool (core/tensor.h's free hook).
 * Not here: the pool's layout (memory/pool.c). */
#ifndef WF_MEMORY_POOL_H
#define WF_MEMORY_POOL_H

#include "../core/tensor.h"

#include <weft/memory.h>

/* A new buffer (one reference) of 'bytes' from 'p'. Returns 0, WF_EINVAL or WF_ENOMEM with
 * wf_last_errmsg() set. */
int wf__pool_buffer(wf_pool *p, size_t bytes, wf_buffer **out);

/* Buffers are released with wf__buffer_release() (core/tensor.h). */

/* A new contiguous tensor of 'dt' and 'shape' with uninitialised data from 'p', for
 * kernels to fill before they publish it. Returns NULL with wf_last_errmsg() set. */
wf_tensor *wf__pool_tensor_alloc(wf_pool *p, wf_dtype dt, wf_shape shape);

#endif /* WF_MEMORY_POOL_H */
