/* memory/arena.c: a static memory plan's outputs as tensors in one block of a pool.
 * Owns: making and releasing an arena (memory/arena.h), handing out its tensors, poisoning.
 * Why one block: a training step's intermediates then cost one pool allocation per run slot
 *   for its whole life (made at the slot's first run, kept across runs), and outputs
 *   that the planner let share bytes do so at no cost.
 * Not here: the offsets (memory/plan.c), which node's output is planned (runtime/compile/
 *   memplan.c), when a slot makes or drops its arena (runtime/arena.c). */
#include "arena.h"

#include "huge.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* The free hook of an arena tensor's buffer: the block outlives it and is freed whole. */
static void arena_keep(void *ctx, void *data, size_t bytes)
{
    (void)ctx;
    (void)data;
    (void)bytes;
}

bool wf__arena_holds(const wf_tensor *t)
{
    return t && t->buf && t->buf->free_fn == arena_keep;
}

void wf__arena_release(wf__arena *a)
{
    if (a->t)
        for (int i = 0; i < a->n; i++)
            wf_tensor_release(a->t[i]);
    free(a->t);
    if (a->block)
        wf_pool_free(a->pool, a->block, a->bytes);
    memset(a, 0, sizeof *a);
}

int wf__arena_make(wf__arena *a, wf_pool *pool, const wf__mem_plan *m, const wf_dtype *dt,
                   const wf_shape *sh)
{
    memset(a, 0, sizeof *a);
    a->pool = pool;
    a->bytes = (size_t)(m->arena_bytes ? m->arena_bytes : 1);
    int rc = wf_pool_alloc(pool, a->bytes, &a->block);
    if (rc < 0) {
        memset(a, 0, sizeof *a);
        return rc;
    }
    /* Transparent huge pages over the whole 2 MiB pages of the arena (memory/huge.h; when THP is in
     * "madvise" mode, Debian's default, nothing else gets them). A training step streams through
     * its arena several times: the GPT step's is 53 MB, 13000 pages of 4 KiB against about 2000
     * second-level TLB entries. Measured there (perf/train/train_bench, "cpu_s", 5 interleaved
     * pairs of processes): 126 -> 122 ms of CPU a step, peak RSS the same. With 2 MiB pages the
     * arena's cache-set mapping also stops depending on which physical pages a process happened to
     * get. Advice only: its failure changes nothing. */
    wf__advise_huge(a->block, a->bytes);
    a->n = m->n;
    if (!(a->t = calloc((size_t)(m->n ? m->n : 1), sizeof *a->t))) {
        wf__arena_release(a);
        return WF_ENOMEM;
    }
    for (int i = 0; i < m->n; i++) {
        if (m->offset[i] < 0)
            continue;
        size_t b = 0;
        (void)wf__tensor_check("memplan", dt[i], sh[i], &b);
        a->t[i] =
            wf__tensor_adopt(dt[i], sh[i], (char *)a->block + m->offset[i], b, arena_keep, NULL);
        if (!a->t[i]) {
            wf__arena_release(a);
            return WF_ENOMEM;
        }
    }
    return 0;
}

wf_tensor *wf__arena_take(const wf__arena *a, int i, wf_dtype dt, wf_shape shape)
{
    wf_tensor *t = a->t ? a->t[i] : NULL;
    if (!t || t->dtype != dt || !wf_shape_equal(t->shape, shape) ||
        atomic_load_explicit(&t->refs, memory_order_acquire) != 1 ||
        atomic_load_explicit(&t->buf->refs, memory_order_acquire) != 1)
        return NULL;
    return wf_tensor_retain(t);
}

void wf__arena_poison(const wf__arena *a, int i, const wf_tensor *t, bool given)
{
#ifdef NDEBUG
    (void)a;
    (void)i;
    (void)t;
    (void)given;
#else
    /* Only when nobody else holds it: the arena's reference and the dying value's. */
    if (t && a->t && a->t[i] == t && !given &&
        atomic_load_explicit(&t->refs, memory_order_acquire) == 2 &&
        atomic_load_explicit(&t->buf->refs, memory_order_acquire) == 1)
        memset(t->data, 0xff, t->buf->bytes);
#endif
}
