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
    int staleness;   /* s: 0 synchronous; > 0 asynchronous (the server's loop does the
                        transfers of its side: runtime/strategy_ps.c) */
} wf__ps_opts;

/* What the session needs of the rewrite beside the map: on every rank, the server whose
 * updates write each variable (for gathering the servers' state); on an asynchronous server
 * (o->staleness > 0), the edges the workers' nodes use and the server graph's nodes its loop
 * feeds, reads or targets (zero otherwise). */
typedef struct wf__ps_async {
    int *var_owner;      /* per user node: the server rank whose updates write it (a
                            variable or an optimizer slot; 0 for what every server updates,
                            such as the step counter), -1: not written by an update */
    int hdr_edge;        /* each reply's header (i64 [4]: runtime/strategy_ps.c) */
    int n_grads;         /* gradients this server holds */
    int *grad_edge;      /* their push edges */
    wf_node **grad_in;   /* the placeholders the loop feeds with a worker's push */
    int n_scalars;       /* scalars (a loss) every worker pushes to every server with its
                            gradients */
    int *scalar_edge;    /* their push edges */
    wf_node **scalar_in; /* the placeholders a run's fetch of the scalar reads */
    int n_pulls;         /* variables this server updates and sends back */
    int *pull_edge;      /* their pull edges */
    wf_node **pull_var;  /* the variables */
    wf_node *tok;        /* the target of one update (every update of this server) */
} wf__ps_async;

/* Frees what '*a' holds (not 'a'). */
void wf__ps_async_free(wf__ps_async *a);

/* Rewrites 'g' (static, no error) for rank o->rank and fills '*m' as wf__replicate() does
 * (the caller frees m->remap with free()); m->n_buckets counts the gradients pushed; '*a'
 * (see wf__ps_async; NULL: not wanted, only with o->staleness 0) as said there.
 * Returns 0, WF_EINVAL (bad options; no batch; an update that reads gradients of two
 * servers, or a per-replica value that is not an update; more transfers than key edges:
 * the message names the node), WF_ENOMEM, or the error of a node it could not add. */
int wf__ps_rewrite(wf_graph *g, const wf__ps_opts *o, wf__replica_map *m, wf__ps_async *a);

#endif /* WF_PLACEMENT_PS_H */
