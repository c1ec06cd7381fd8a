/* core/internal.h: what the files of core/ share and nobody else sees.
 * Owns: the layout of struct wf_graph (node chunks, the arena, the name table, the first
 *   error), the initializer checks init.c gives graph.c, the value allocator tensor.c
 *   gives graph.c, and the per-thread cache of freed graph memory graph.c gives tensor.c.
 * Invariants (stated here once):
 *   - node i lives at chunks[i >> WF__CHUNK_SHIFT][i & WF__CHUNK_MASK]; chunks never move,
 *     so node pointers are stable for the graph's life;
 *   - every committed node with a name the user gave ('name_hash' != 0) is in exactly one
 *     slot of the name table, under the hash of its current name; a node with an automatic
 *     name ('name_hash' 0) and a node being built are in none (graph.c finds automatic
 *     names by the id in them); 'n_named' slots are used, at most half of them;
 *   - attribute copies are never written after creation, so equal ones may be shared;
 *   - 'status' is 0 or the first error since creation or wf_graph_clear_error(), and
 *     'errmsg' is its message ("" when 'status' is 0);
 *   - everything a node points at (name, attrs, input and control arrays, file names) is in
 *     the arena or static, except 'value' (a retained tensor) and 'rt_data' (not ours).
 * Not here: the node layout (core/graph.h: upper modules read it). */
#ifndef WF_CORE_INTERNAL_H
#define WF_CORE_INTERNAL_H

#include "error.h"
#include "graph.h"

#define WF__CHUNK_SHIFT 10
#define WF__CHUNK_NODES (1 << WF__CHUNK_SHIFT)
#define WF__CHUNK_MASK  (WF__CHUNK_NODES - 1)
#define WF__ATTRS_CACHE 61 /* a prime: hashes modulo it use all bits */

/* A bump allocator: a list of blocks, freed all at once. */
typedef struct wf__arena_block {
    struct wf__arena_block *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
} wf__arena_block;

typedef struct wf__name_slot {
    uint64_t hash;
    wf_node *node; /* NULL: empty */
} wf__name_slot;

typedef struct wf__file_name {
    struct wf__file_name *next;
    const char *copy;
} wf__file_name;

struct wf_graph {
    wf_runtime *rt;
    int mode;
    int n_nodes;
    wf_node **chunks;
    int n_chunks, cap_chunks;
    wf__arena_block *arena;
    wf__name_slot *slots; /* name table: open addressing, 'n_slots' a power of two */
    size_t n_slots;
    size_t n_named;                               /* used slots of the name table */
    const wf_attrs *attrs_cache[WF__ATTRS_CACHE]; /* recent attribute copies, shared by
                                                    equal ones (graph.c: share_attrs) */
    wf__file_name *files; /* interned source file names, most recent first */
    wf_eager_fn eager_fn;
    void *eager_ctx;
    int status;
    char errmsg[WF_ERRMSG_MAX];
};

/* ---- The per-thread cache of freed graph memory (graph.c) ---------------------------------
 * An eager program makes and destroys a graph per step: node chunks, arena blocks and small
 * values. Given back to malloc(), their pages went back to the system (glibc trims the top
 * of its heap and unmaps big chunks) and the next graph faulted them in again: on the eager
 * 1-element add that was ~0.06 page faults per add at ~2.3 us each, plus a malloc() and a
 * free() per value: more than half of the time. So freed node chunks, full-size arena blocks
 * and small value blocks (tensor.c) go to a cache of the freeing thread, and the next graph
 * or value made on that thread takes them from there, warm.
 * Invariants: a cached item is on exactly one list of exactly one thread's cache and is used
 *   by nobody; every item of a list has that list's size; 'bytes' is the sum of the sizes of
 *   the items held and never exceeds WF__CACHE_MAX (an item that does not fit is freed); a
 *   thread's cache is emptied when the thread exits (a pthread key's destructor), and is off
 *   for that thread from then on.
 * Why per thread (the third exception to docs/conventions.md, "State", with the error slot and the
 *   pending source locations): graphs of one runtime are built on many threads at once, so
 *   a per-runtime cache would need a lock or a lock-free list per node chunk and value; a
 *   per-thread one needs nothing, like malloc's own tcache. It holds only free memory, so two
 *   runtimes cannot see each other through it.
 * Under AddressSanitizer the cache is off, so that use after free and leaks stay visible. */
#define WF__CACHE_MAX     ((size_t)64 << 20) /* bytes per thread (glibc's per-thread heap size) */
#define WF__VALUE_CLASSES 9 /* value blocks by data capacity: 16 B, 32 B, ... 4 KiB */
/* Large value blocks (data past 4 KiB, up to WF__LARGE_MAX): four classes per power of two,
 * so a block wastes less than a quarter of its data capacity (tensor.c: value_class). */
#define WF__LARGE_CLASSES 52
#define WF__LARGE_MAX     ((size_t)32 << 20)

typedef struct wf__cache_item {
    struct wf__cache_item *next;
} wf__cache_item;

/* The lists of a cache: node chunks, full-size arena blocks, value blocks per class (the
 * small classes, then the large ones from WF__CACHE_LARGE). */
enum {
    WF__CACHE_CHUNK,
    WF__CACHE_ARENA,
    WF__CACHE_VALUE,
    WF__CACHE_LARGE = WF__CACHE_VALUE + WF__VALUE_CLASSES,
    WF__CACHE_LISTS = WF__CACHE_LARGE + WF__LARGE_CLASSES
};

typedef struct wf__cache_stats {
    size_t bytes;               /* held in all lists */
    int count[WF__CACHE_LISTS]; /* items per list */
} wf__cache_stats;

/* An item of list 'list' from this thread's cache ('bytes': the list's item size), or NULL
 * (the list is empty, or the cache is off). */
void *wf__cache_take(int list, size_t bytes);

/* Gives 'p' (a malloc() block, 'bytes' long, the item size of 'list') to this thread's
 * cache, or free()s it when the cache is full or off. */
void wf__cache_put(int list, void *p, size_t bytes);

/* wf__cache_tick() frees the items of this thread's cache that nobody took since the last
 * wf__cache_mark() (each list's low-water mark), so that the cache keeps what the next graph
 * is likely to need, not what a graph of other sizes left long ago; wf__cache_mark() starts
 * a new interval. wf_graph_destroy() ticks before it gives the graph's memory to the cache
 * and marks after. Measured: without them, the 1000-element eager add run after the
 * 1-element one took 2x its time: its memory was faulted in fresh beside 64 MiB of cached
 * 1-element values. */
void wf__cache_tick(void);
void wf__cache_mark(void);

/* What this thread's cache holds (all zero when it is off or empty). */
wf__cache_stats wf__cache_get_stats(void);

/* Whether caching is compiled in (false under AddressSanitizer). */
bool wf__cache_enabled(void);

/* wf__tensor_alloc() for a value core makes and hands out as it is (an eager graph's
 * outputs, scalars): when the data is at most WF__LARGE_MAX, the tensor, its buffer and the
 * data are one block (so no other free hook can be swapped in), from this thread's cache if
 * it has one of the value's class (see above), else from malloc(). Measured on an eager
 * 1-element add (2 vCPUs, 10^6 adds): ~240 ns per add against ~310 ns with per-graph 64 KiB
 * slabs of values, whose freed pages malloc gave back to the system, so that every graph
 * faulted them in again (85k page faults against 58k here, at ~2.3 us each on these VMs).
 * The large classes are PyTorch's caching allocator for eager steps: before them, an eager
 * MLP step (64-1024-1024-10, batch 256, Adam) took ~1700 page faults, its megabyte values
 * unmapped by free() and faulted in again by the next step's kernels.
 * Returns NULL with wf_last_errmsg() set (WF_ENOMEM or WF_EINVAL). */
wf_tensor *wf__tensor_alloc_value(wf_dtype dt, wf_shape shape);

/* Writes "<op> '<name>' (<file>:<line>): " (or without the location) into 'buf'; returns
 * what snprintf() returns. */
int wf__node_prefix(const wf_node *n, char *buf, size_t size);

/* Checks the value type of a source-like op's attributes (attrs.dtype, attrs.shape with
 * every dimension >= 'min_dim': -1 allows "any"); returns 0 or WF_EINVAL with the reason in
 * 'err' (op.c; placeholders, constants, variables, recv). */
int wf__op_check_type(const wf_attrs *a, int64_t min_dim, char *err, size_t errlen);

/* Checks an initializer for 'dt' and 'shape'; returns 0 or WF_EINVAL with the reason in
 * 'err' (no node name). */
int wf__init_check(wf_init init, wf_dtype dt, wf_shape shape, char *err, size_t errlen);

/* A kernel whose value is input 0's bytes (core/op_dist.c): nothing to do when the planner gave
 * the output input 0's storage (an op with WF_OP_INPLACE), else a copy. For dp_grad and
 * tp_enter (core/op_tp.c). */
int wf__pass_kernel(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                    wf_tensor **out);

#endif /* WF_CORE_INTERNAL_H */
