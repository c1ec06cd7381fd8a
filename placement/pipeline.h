/* placement/pipeline.h: the pipeline rewrite of a graph written for one model (a module
 * interface for runtime/: not installed, not internal.h).
 * Owns: wf__pipeline() and its options.
 * The rewrite (placement/pipeline.c, a pure graph pass: core and ops only) is the
 *   data-parallel one (replicate.h) with micro-batches for shards, on one rank's share of
 *   the stages: every node gets a stage, this rank keeps its stage's copies, values of a
 *   micro-batch that another stage reads cross by send/recv nodes, and the schedule's order
 *   (GPipe or 1F1B) becomes orderings between the micro-batches' parts (m->order). With
 *   placement auto the forward nodes' stages are the planner's (wf__pipeline_plan()).
 * Not here: the strategy object and the session's side (runtime/strategy.c), send/recv's
 *   kernels (transport/). */
#ifndef WF_PLACEMENT_PIPELINE_H
#define WF_PLACEMENT_PIPELINE_H

#include "replicate.h"

#include <weft/placement.h>

typedef struct wf__pipeline_opts {
    int stage, stages;           /* this rank's stage (its rank) and the stage count */
    int micro_batches;           /* m: 1 .. 64 */
    int schedule;                /* WF_SCHEDULE_GPIPE or WF_SCHEDULE_1F1B */
    int64_t batch_rows;          /* the global batch B every run is fed (>= m) */
    const wf_place_hints *hints; /* the forward nodes' stages ("rank:K/cpu:0": stage K) */
    int aggregation;             /* WF__AGG_* (core/op.h) */
    size_t bucket_bytes, first_bucket_bytes;
    int edge_base; /* the first key edge dp_reduce nodes use; send/recv use 0 .. edge_base-1 */
    /* The planner's stages (placement/pipeline_plan.c): */
    bool planner;               /* the forward nodes' stages from the planner, not the hints */
    double mem_bytes;           /* planner: each stage's memory cap (0: none) */
    const wf_cost_table *costs; /* planner: measured seconds (NULL: the priors) */
    char **plan_text;           /* planner, may be NULL: the plan's text (malloc'd) goes here */
    const char *plan_note;      /* planner, may be NULL: a line the text gives after its head */
    /* planner: the links between ranks a and b, [a * stages + b] (a < b read), one-way
     * latency in seconds and bytes per second (measured: runtime/strategy.c); NULL: the
     * cluster's defaults */
    const double *link_latency_s, *link_bytes_per_s;
} wf__pipeline_opts;

/* The planner's stages of the forward nodes of 'g' (kinds from wf__replicate_kinds(),
 * 'backward' the nodes a gradient made or that read one): 'pin[id]' the stage of every
 * forward op, -1 for the rest; with 'text', the plan's text (malloc'd; the caller frees it).
 * The user's hints are kept (the planner places the rest). Returns 0, or the planner's error
 * (a hint's rank that does not exist: WF_ENOTFOUND; no split within the memory caps: naming
 * the stage's device and the bytes: WF_EINVAL) or WF_ENOMEM, with the reason in
 * wf_last_errmsg(). */
int wf__pipeline_plan(const wf_graph *g, const wf__pipeline_opts *o, const uint8_t *kind,
                      const uint8_t *backward, int *pin, char **text);

/* The graph the planner splits (pipeline_plan.c): the forward part of 'g' (kinds and
 * 'backward' as for wf__pipeline_plan()) copied into a new static graph at one micro-batch's
 * rows, node for node in 'g's order, so the same 'g' and options give the same graph on every
 * rank. For the runtime's profile run: a node of it and its twin in the planner's own copy
 * share a cost-table key. Returns 0 or the copy's error. Ownership: the caller destroys
 * '*out'. */
int wf__pipeline_plan_forward(const wf_graph *g, const wf__pipeline_opts *o, const uint8_t *kind,
                              const uint8_t *backward, wf_graph **out);

/* The same for 'g' alone: its kinds and backward nodes found as wf__pipeline() finds them.
 * Returns 0, the kinds' error or the copy's. */
int wf__pipeline_forward_graph(const wf_graph *g, const wf__pipeline_opts *o, wf_graph **out);

/* Rewrites 'g' (static, no error) for stage 'o->stage' and fills '*m' as wf__replicate()
 * does (m->sends: the sends each run must target). Stages: a node hinted to "rank:K/..." is
 * on stage K; a node a gradient function made is on the stage of the node it differentiates;
 * an update that reads only variables and constants (an optimizer's step counter), or whose
 * variable several stages read (a tied embedding), is on every stage; a global node that is
 * no update (clipping by the global norm) is on the stage of its largest input; a batch
 * placeholder is on the stage of its first reader; any other node is on the latest stage of
 * its inputs (stage 0 without one);
 * variables, constants and what reads only them are computed where they are read.
 * Returns 0, or WF_EINVAL (a bad option: named; a hint of a rank that does not exist: naming
 * the node and the device; a node of every stage reading another stage's per-micro-batch
 * value), WF_ENOTFOUND (a hint's
 * device), WF_ENOMEM, with the reason in wf_last_errmsg(). */
int wf__pipeline(wf_graph *g, const wf__pipeline_opts *o, wf__replica_map *m);

/* The sends of this rank (m from wf__pipeline()) that a run of the user's nodes 'req' (its
 * fetches and targets, the same on every rank) needs, into 'out' (room for m->n_sends): a
 * value's send to stage d when a reader of it on d is needed (an ancestor of 'req', through
 * data or control edges), a scalar's global value when it is fetched. Every rank decides
 * alike, so each send has its receive. Returns the count, or WF_ENOMEM. */
int wf__pipeline_sends(const wf_graph *g, const wf__replica_map *m, wf_node *const *req, int n_req,
                       wf_node **out);

#endif /* WF_PLACEMENT_PIPELINE_H */
