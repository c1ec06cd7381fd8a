/* memory/arena.h: a static memory plan's outputs as tensors in one block of a pool (a module
 *   interface of memory/ for runtime/: wf__ names, not installed).
 * Owns: wf__arena: the block (one allocation of a wf_pool, so the pool's statistics count
 *   it, advised to use transparent huge pages, memory/huge.h) and one tensor header per
 *   planned output over its bytes at the plan's offset (memory/plan.h: wf__mem_plan); handing
 *   one out only when nobody else holds it; telling whether a tensor lies in an arena; the
 *   debug-build poisoning of a dead output.
 * What it knows: a plan's offsets and, per planned output, its dtype and shape. No graph,
 *   op or run: the caller (runtime/arena.c, per run slot) says when to make, hand out and
 *   release.
 * Invariant: an arena's tensor has one reference (the arena's) when unused, and one more per
 *   holder; wf__arena_take() hands it out only when the arena's is the only one.
 * Not here: the planner (memory/plan.h), the pools (memory/pool.h). */
#ifndef WF_MEMORY_ARENA_H
#define WF_MEMORY_ARENA_H

#include "../core/tensor.h"
#include "plan.h"

#include <weft/memory.h>

#include <stdbool.h>
#include <stddef.h>

typedef struct wf__arena {
    wf_pool *pool; /* where 'block' came from */
    void *block;   /* 'bytes' from 'pool', or NULL: no arena */
    size_t bytes;  /* the size asked of the pool (at least 1) */
    int n;         /* entries of 't' */
    wf_tensor **t; /* per node: a tensor over its bytes of 'block' (one reference, the
                      arena's), or NULL: not planned */
} wf__arena;

/* Makes '*a' for plan 'm' ('m->n' nodes) from 'pool': node i's tensor, of 'dt[i]' and
 * 'sh[i]', at 'm->offset[i]' (none where it is -1). Returns 0 or WF_ENOMEM; on failure
 * '*a' is released (no arena). */
int wf__arena_make(wf__arena *a, wf_pool *pool, const wf__mem_plan *m, const wf_dtype *dt,
                   const wf_shape *sh);

/* Drops the arena's tensors and gives its block back to its pool; '*a' becomes empty. A
 * tensor someone still holds keeps its header, but not its bytes: release only when no
 * value of the arena lives. Empty arenas are a no-op. */
void wf__arena_release(wf__arena *a);

/* Node 'i''s tensor (a new reference) if it is exactly 'dt' and 'shape' and nobody else
 * holds it, else NULL. */
wf_tensor *wf__arena_take(const wf__arena *a, int i, wf_dtype dt, wf_shape shape);

/* Whether 't' lies in an arena (a value that must not outlive its arena's next use). */
bool wf__arena_holds(const wf_tensor *t);

/* Debug builds (no NDEBUG): fills node 'i''s bytes with 0xff (NaN for floats) when 't' is
 * its tensor, it is not 'given' (a reader took them in place), and only the arena and the
 * dying value hold it, so that a plan that let two live outputs share bytes gives wrong
 * results instead of lucky ones. Release builds: nothing. */
void wf__arena_poison(const wf__arena *a, int i, const wf_tensor *t, bool given);

#endif /* WF_MEMORY_ARENA_H */
