/* placement/replicate.h: the data-parallel rewrite of a graph written for one replica (a
 * module interface for runtime/: not installed, not internal.h).
 * Owns: wf__replicate() and what it returns: which node of the rewritten graph stands for
 *   each node of the user's graph.
 * The rewrite (placement/replicate.c, a pure graph pass: core and ops only) appends to the
 *   graph: for each local shard a copy of every node that depends on a batch (a placeholder
 *   whose first dimension is -1; in the copy, that placeholder is read through shard_rows),
 *   up to the gradients the updates read; one dp_reduce node per gradient bucket (and per
 *   scalar the shards compute) with slices back to each gradient's shape (or, in place, a
 *   dp_grad per gradient over its first shard's tensor); and one copy of every update (and
 *   what follows the updates) reading the reduced gradients. With
 *   'shard_device' (Mirrored), each shard's copies carry their device's placement hint.
 * Not here: running dp_reduce (transport/coll_ops.c), the session's side (runtime/). */
#ifndef WF_PLACEMENT_REPLICATE_H
#define WF_PLACEMENT_REPLICATE_H

#include "../core/graph.h"

#include <stddef.h>
#include <stdint.h>

typedef struct wf__replicate_opts {
    int rank, size;            /* this rank, the world size N */
    int shards;                /* S: a multiple of N, S / N a power of two */
    int aggregation;           /* WF__AGG_* (core/op.h) */
    size_t bucket_bytes;       /* > 0 */
    size_t first_bucket_bytes; /* > 0 */
    int edge_base;             /* the first key edge dp_reduce nodes use (two each) */
    const int *shard_device;   /* NULL, or per local shard the device (placement's id, > 0)
                                  its copies run on (Mirrored): each copy that can run there
                                  is placed there with wf_node_set_device() */
    int n_real;                /* with 'shard_device': the runtime's devices (the CPU and the
                                  GPUs; ids from it up are simulated ones, which run the CPU
                                  kernels) */
    /* A pipeline (placement/pipeline.c; NULL 'stage_of': none): the stage of every user node
     * ('stage_of[id]': >= 0 a stage, WF__STAGE_ALL every stage, WF__STAGE_SHARED where it is
     * read); this rank runs only stage 'stage''s copies, and every per-shard value another
     * stage reads crosses by a send here and a recv there (edges 'p2p_edge_base' + ...), as
     * does, once per step, a reduced gradient or global node that another stage's global
     * node reads (clipping by the global norm; an update of every stage). */
    const int *stage_of;
    int stage, stages;
    int64_t batch_rows; /* the global batch B: a recv has its value's shape for its shard's rows */
    int p2p_edge_base;
    /* The order the shards' copies are made in (NULL: shard by shard): 2 * shards parts, k
     * for shard k's forward nodes, -1 - k for its backward ones ('backward[id]' 1). */
    const int *order;
    const uint8_t *backward;
} wf__replicate_opts;

enum { WF__STAGE_ALL = -1, WF__STAGE_SHARED = -2 };

/* What stands for each node of the user's graph (ids below 'n'). */
typedef struct wf__replica_map {
    int n;           /* the user's nodes */
    wf_node **remap; /* 'n' entries: the node to run in its place (itself when it depends on
                        no batch); NULL: a per-replica value that cannot be fetched */
    int n_buckets;   /* gradient buckets made */
    int n_grads;     /* gradients reduced */
    int n_local;     /* local shards b */
    /* A pipeline's (stage_of set): this rank's sends, each of user node send_src[k]'s value
     * to stage send_dst[k] (-1: a fetched scalar's global value, to every other stage); every
     * local shard's copies, shard[i * n + id] (NULL: not on this stage); the stages. */
    wf_node **sends;
    int *send_src, *send_dst;
    int n_sends, cap_sends;
    wf_node **shard;
    int *stage;
    /* A pipeline's schedule (placement/pipeline.c): 'n_order' pairs of node ids, order[2k]
     * before order[2k + 1], kept by a run's plan when both ends are in it. */
    int *order;
    int n_order, cap_order;
} wf__replica_map;

/* Frees what '*m' holds. */
void wf__replica_map_free(wf__replica_map *m);

/* The kinds of the user's nodes (placement/replicate.c says which is which). */
enum { WF__KIND_SHARED = 0, WF__KIND_REPLICA = 1, WF__KIND_GLOBAL = 2 };

/* Sorts the nodes of 'g' into kinds: 'kind' and 'is_grad' (a replica node an update reads:
 * a gradient) get one entry per node; '*ref' the first batch placeholder. Returns 0 or
 * WF_EINVAL (no batch placeholder; a gradient that is not f32 with a static shape: the
 * message names the node). */
int wf__replicate_kinds(const wf_graph *g, uint8_t *kind, uint8_t *is_grad, wf_node **ref);

/* Rewrites 'g' (static, no error) for 'o', appending nodes, and fills '*m' (the caller frees
 * it with wf__replica_map_free()). Returns 0, WF_EINVAL (no batch placeholder; a gradient an update
 * reads that is not f32 with a static shape; too many buckets for the key edges; in a
 * pipeline, an update or a control edge across stages: the message names the node), WF_ENOMEM, or
 * the error of a node it could not add (the graph keeps it). The message is in wf_last_errmsg(). */
int wf__replicate(wf_graph *g, const wf__replicate_opts *o, wf__replica_map *m);

#endif /* WF_PLACEMENT_REPLICATE_H */
