/* memory/plan.h: the static memory planner, the module interface of memory/ that runtime/
 *   uses (wf__ names; not installed).
 * Owns: the contract of wf__mem_plan_make(): given nodes in a topological order, each with
 *   the bytes of its output, its data inputs and its other ordering predecessors, the byte
 *   offset of each output in one arena, such that two outputs share bytes only when every
 *   read of one is ordered before the other is written (or the later one is written in
 *   place over the earlier, its input 0); and its independent checker.
 * What it knows: integers. No graph, op, tensor or plan: the caller says which outputs are
 *   planned (bytes > 0) and which may take input 0's bytes (its op writes in place, same
 *   dtype and shape, runtime/compile/memplan.c), and memory/arena.h turns the offsets into
 *   tensors.
 * Not here: which outputs a plan may place (runtime/compile/memplan.c), the arenas and their
 *   tensors (memory/arena.h), when a run slot makes its arena (runtime/arena.c), the pools
 *   (memory/pool.h). */
#ifndef WF_MEMORY_PLAN_H
#define WF_MEMORY_PLAN_H

#include <stdbool.h>
#include <stdint.h>

/* The problem: 'n' nodes in a topological order. */
typedef struct wf__mem_graph {
    int n;
    const int32_t *in_off;      /* CSR of data inputs: node i reads the outputs of in_idx[in_off[i]
                                   .. in_off[i + 1]) (n + 1 entries); input 0 comes first */
    const int32_t *in_idx;      /* one per input edge */
    const int32_t *dep_off;     /* CSR of other predecessors (control edges, orderings): node i
                                   runs after dep_idx[dep_off[i] .. dep_off[i + 1]); NULL: none */
    const int32_t *dep_idx;     /* one per such edge */
    const int64_t *bytes;       /* per node: the bytes of its output to place; 0: not planned */
    const uint8_t *may_inplace; /* per node: its output may take input 0's bytes */
    bool seq;                   /* the nodes run one at a time in this order (ancestor then
                                   means earlier in the order) */
} wf__mem_graph;

/* A plan: where each planned output lives in the arena. Read-only once made. */
typedef struct wf__mem_plan {
    int n;                       /* nodes */
    int64_t *offset;             /* per node: byte offset in the arena; -1: not planned */
    uint8_t *inplace;            /* per node: 1 when it took input 0's bytes */
    uint8_t *given;              /* per node: 1 when a reader took its bytes in place */
    int64_t arena_bytes;         /* the arena: the end of the highest planned output */
    int64_t bytes_intermediates; /* the bytes of every planned output, summed */
    int64_t bytes_live_min;      /* the most bytes of planned outputs live at once in the
                                    nodes' order (the liveness minimum) */
    int n_planned, n_inplace;    /* planned outputs; of them, in place over input 0 */
    int32_t *edges;              /* 'n_edges' (before, after) pairs of nodes: ordering edges the
                                    caller must add so that outputs can share bytes */
    int n_edges;
} wf__mem_plan;

/* Plans 'g': in order for 'seq' graphs; otherwise largest first over the conflicts the
 * graph's order leaves, and, with 'may_add_edges' and an arena above 1.25x the liveness
 * minimum, again with ordering edges where they keep the arena from growing (memory/plan.c
 * says when they are kept). Returns 0 with '*out' (NULL: nothing to plan, or a graph too
 * big to analyse) or WF_ENOMEM. Ownership: '*out' is owned (wf__mem_plan_free()).
 * Threads: any; reads only 'g'. */
int wf__mem_plan_make(const wf__mem_graph *g, bool may_add_edges, wf__mem_plan **out);

/* Frees a plan; NULL is a no-op. */
void wf__mem_plan_free(wf__mem_plan *mp);

/* Checks 'mp' against 'g' independently of the planner (a depth-first reachability per
 * node): every two planned outputs whose bytes overlap are ordered by the graph's edges and
 * the plan's, or the later one is in place over the earlier. Returns 0, WF_ENOMEM, or
 * WF_EINVAL with the two nodes in '*bad_u', '*bad_v' (an output outside the arena: both
 * 'v') and the reason in wf_last_errmsg(). For tests: O(n * (n + edges)). */
int wf__mem_plan_check(const wf__mem_graph *g, const wf__mem_plan *mp, int *bad_u, int *bad_v);

#endif /* WF_MEMORY_PLAN_H */
