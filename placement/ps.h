/* placement/ps.h: the parameter-server rewrite of a graph written for one replica (a module
 * interface for runtime/: not installed, not internal.h).
 * Owns: wf__ps_rewrite() and the assignment of variables to servers (wf__ps_owner()).
 * Not here: the data-parallel copies it builds on (placement/replicate.h), the transfers'
 *   kernels (transport/), the session's side (runtime/strategy.c). */
#ifndef WF_PLACEMENT_PS_H
#define WF_PLACEMENT_PS_H

#include "replicate.h"

typedef struct wf__ps_opts {
    int rank, size;  /* this rank, the world size N */
    int servers;     /* K: ranks 0 .. K-1 are servers, K .. N-1 workers; 1 <= K < N */
    int shards;      /* S: a multiple of the workers N - K */
    int aggregation; /* WF__AGG_* (core/op.h) */
    int edge_base;   /* the first key edge of the rewrite's sends and receives */
} wf__ps_opts;

/* Rewrites 'g' (static, no error) for rank o->rank and fills '*m' as wf__replicate() does
 * (the caller frees m->remap with free()); m->n_buckets counts the gradients pushed.
 * Returns 0, WF_EINVAL (bad options; no batch; an update that reads gradients of two
 * servers, or a per-replica value that is not an update; more transfers than key edges:
 * the message names the node), WF_ENOMEM, or the error of a node it could not add. */
int wf__ps_rewrite(wf_graph *g, const wf__ps_opts *o, wf__replica_map *m);

#endif /* WF_PLACEMENT_PS_H */
