/* core/internal.h: what the files of core/ share and nobody else sees.
 * Owns: the layout of struct wf_graph (node chunks, the arena, the name table, the first
 *   error, the slab of eager outputs), the initializer checks init.c gives graph.c, and the
 *   slabs tensor.c gives graph.c.
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

/* Slabs (core/tensor.c): the small outputs of an eager graph's default execution are
 * carved one after another from 64 KiB slabs instead of each being a malloc() (that and
 * free() were a quarter of an eager 1-element add's instructions). A block stays valid while
 * its tensor lives, even after the graph is gone: a slab is freed when the graph has
 * retired it and all its tensors are released (so one kept value keeps its slab's 64 KiB).
 * Only the graph's thread carves; releases may come from any thread. */
typedef struct wf__tensor_slab wf__tensor_slab;

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
    wf__file_name *files;  /* interned source file names, most recent first */
    wf__tensor_slab *slab; /* where eager outputs are carved (NULL: none yet) */
    wf_eager_fn eager_fn;
    void *eager_ctx;
    int status;
    char errmsg[WF_ERRMSG_MAX];
};

/* wf__tensor_alloc() from '*slab' (a new slab replaces it, retired, when it is full or NULL;
 * outputs over 1 KiB get an allocation of their own). Returns NULL with wf_last_errmsg() set
 * (WF_ENOMEM or WF_EINVAL). */
wf_tensor *wf__tensor_alloc_slab(wf__tensor_slab **slab, wf_dtype dt, wf_shape shape);

/* The owner stops carving from 's' (NULL: no-op); it is freed once its tensors are gone. */
void wf__tensor_slab_retire(wf__tensor_slab *s);

/* Writes "<op> '<name>' (<file>:<line>): " (or without the location) into 'buf'; returns
 * what snprintf() returns. */
int wf__node_prefix(const wf_node *n, char *buf, size_t size);

/* Checks an initializer for 'dt' and 'shape'; returns 0 or WF_EINVAL with the reason in
 * 'err' (no node name). */
int wf__init_check(wf_init init, wf_dtype dt, wf_shape shape, char *err, size_t errlen);

#endif /* WF_CORE_INTERNAL_H */
