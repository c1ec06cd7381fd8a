/* core/internal.h: what the files of core/ share and nobody else sees.
 * Owns: the layout of struct wf_graph (node chunks, the arena, the name table, the first
 *   error), the initializer checks init.c gives graph.c, and the value allocator tensor.c
 *   gives graph.c.
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

/* wf__tensor_alloc() for a value core makes and hands out as it is (an eager graph's
 * outputs, scalars): when the data is at most 1 KiB, the tensor, its buffer and the data are
 * one malloc() (so no other free hook can be swapped in). Measured on an eager 1-element add
 * (2 vCPUs, 10^6 adds): ~240 ns per add against ~310 ns with per-graph 64 KiB slabs of
 * values, whose freed pages malloc gave back to the system, so that every graph faulted them
 * in again (85k page faults against 58k here, at ~2.3 us each on these VMs).
 * Returns NULL with wf_last_errmsg() set (WF_ENOMEM or WF_EINVAL). */
wf_tensor *wf__tensor_alloc_value(wf_dtype dt, wf_shape shape);

/* Writes "<op> '<name>' (<file>:<line>): " (or without the location) into 'buf'; returns
 * what snprintf() returns. */
int wf__node_prefix(const wf_node *n, char *buf, size_t size);

/* Checks an initializer for 'dt' and 'shape'; returns 0 or WF_EINVAL with the reason in
 * 'err' (no node name). */
int wf__init_check(wf_init init, wf_dtype dt, wf_shape shape, char *err, size_t errlen);

#endif /* WF_CORE_INTERNAL_H */
