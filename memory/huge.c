/* memory/huge.c: transparent huge pages for large host buffers (memory/huge.h says why).
 * Owns: wf__advise_huge(), wf__alloc_huge().
 * Not here: the pools (pool.c). */
#include "huge.h"

#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>

#define HUGE ((size_t)2 << 20)

void wf__advise_huge(void *p, size_t bytes)
{
#ifdef MADV_HUGEPAGE
    uintptr_t lo = ((uintptr_t)p + HUGE - 1) & ~(uintptr_t)(HUGE - 1),
              hi = ((uintptr_t)p + bytes) & ~(uintptr_t)(HUGE - 1);
    if (p && hi > lo)
        (void)madvise((void *)lo, hi - lo, MADV_HUGEPAGE);
#else
    (void)p;
    (void)bytes;
#endif
}

void *wf__alloc_huge(size_t bytes)
{
    if (bytes < HUGE)
        return malloc(bytes ? bytes : 1);
    if (bytes > SIZE_MAX - HUGE)
        return NULL;
    size_t whole = (bytes + HUGE - 1) & ~(HUGE - 1);
    void *p = aligned_alloc(HUGE, whole);
    wf__advise_huge(p, whole);
    return p;
}
