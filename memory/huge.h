/* memory/huge.h: transparent huge pages for large host buffers (a module interface of memory/
 * for the modules above it: not installed, not internal.h).
 * Owns: the advice that asks Linux for 2 MiB pages over a buffer, and an allocation aligned
 *   for it.
 * Why: with THP in "madvise" mode (Debian's default) nothing else gets huge pages. A buffer
 *   that streams through the TLB (a training step's arena, memory/arena.c) or whose pages
 *   another process pins to copy (the single-copy all-reduce, transport/coll.c: every
 *   process_vm_readv/writev pins each 4 KiB page it touches) gains from them. Measured with
 *   perf/allreduce_bench --huge-pages, 2 ranks on shared memory, 16 MiB: 5.8-6.2 GB/s bus
 *   bandwidth against 3.7 on 4 KiB pages.
 * Not here: the pools (pool.c). */
#ifndef WF_MEMORY_HUGE_H
#define WF_MEMORY_HUGE_H

#include <stddef.h>

/* Advises huge pages over the whole 2 MiB pages inside [p, p + bytes). Advice only: it fails
 * silently and changes no content. */
void wf__advise_huge(void *p, size_t bytes);

/* Allocates 'bytes' (uninitialised) for free(): from 2 MiB on, 2 MiB-aligned, rounded up to
 * whole 2 MiB pages and advised for huge pages; below, plain malloc(). Returns NULL when
 * out of memory. */
void *wf__alloc_huge(size_t bytes);

#endif /* WF_MEMORY_HUGE_H */
