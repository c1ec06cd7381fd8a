/* weft/placement.h: the placement planner as pure functions over a graph: the cluster
 *   description (ranks, devices with speed and memory, links with latency and bandwidth),
 *   per-op costs (the op's flops/bytes as the prior, measured times cached per op, shapes
 *   and device kind), user hints ("rank:1/cpu:0", for one node or a scope of nodes), the
 *   automatic split into pipeline stages, the partitioned graphs with send/recv pairs, the
 *   transfer keys, the pipeline schedules (GPipe, 1F1B) with their static check, and tensor
 *   parallelism's split of a two-matmul block (wf_tp_split_create()).
 * Owns: the public contract of placement/.
 * Pure: nothing here runs a kernel, touches a device or the network; every function takes a
 *   graph and descriptions and returns an assignment, a schedule or new graphs. Measuring
 *   (profile runs, link ping-pong) is done by the layers that own devices and the network,
 *   which hand their numbers in through wf_cost_table_put() and wf_cluster_set_link().
 * Threads (all): an object is used by one thread at a time; distinct objects are
 *   independent. A graph must not change while a plan or partition of it is being made.
 * Not here: running a partitioned graph or a schedule (runtime/), the kernels of send and
 *   recv (transport/). */
#ifndef WEFT_PLACEMENT_H
#define WEFT_PLACEMENT_H

#include <weft/base.h>
#include <weft/core.h>

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- The cluster ------------------------------------------------------------------------- */

/* Device kinds, the values of weft/devices.h's WF_DEVICE_CPU and WF_DEVICE_CUDA. */
enum { WF_PLACE_CPU = 0, WF_PLACE_CUDA = 1 };

typedef struct wf_cluster wf_cluster; /* opaque: devices and links */

typedef struct wf_cluster_device {
    int rank;           /* the process that owns it, >= 0 */
    int kind;           /* WF_PLACE_CPU or WF_PLACE_CUDA */
    int index;          /* among the rank's devices of that kind: "cpu:0", "cuda:1" */
    double flops_per_s; /* peak compute; 0: 1e11 */
    double bytes_per_s; /* memory bandwidth; 0: 2e10 */
    double mem_bytes;   /* memory cap the planner keeps to; 0: no cap */
} wf_cluster_device;

/* Creates an empty cluster. Links not set explicitly default to 2 us and 1e10 B/s between
 * devices of one rank and 20 us and 1e9 B/s between ranks.
 * Returns 0 or WF_ENOMEM. Ownership: the caller owns '*out' (wf_cluster_destroy()). */
WF_API WF_NODISCARD int wf_cluster_create(wf_cluster **out);

/* Frees a cluster. NULL is a no-op. */
WF_API void wf_cluster_destroy(wf_cluster *c);

/* Adds a device; the devices' order is the order of pipeline stages (stage k on device k).
 * Returns its index (>= 0), or WF_EINVAL (negative rank or index, unknown kind, negative
 * speed or memory, the same (rank, kind, index) twice, more than 256 devices) or WF_ENOMEM,
 * with the reason in wf_last_errmsg(). Ownership: 'd' is copied. */
WF_API WF_NODISCARD int wf_cluster_add_device(wf_cluster *c, const wf_cluster_device *d);

/* Sets the link between devices 'a' and 'b' (both directions): one-way latency in seconds
 * and bandwidth in bytes per second, e.g. from wf_cluster_link_from_pingpong().
 * Returns 0 or WF_EINVAL (index out of range, a == b, latency < 0, bandwidth <= 0). */
WF_API WF_NODISCARD int wf_cluster_set_link(wf_cluster *c, int a, int b, double latency_s,
                                            double bytes_per_s);

/* The link's latency and bandwidth (a == b: 0 and infinity). Returns 0 or WF_EINVAL. */
WF_API WF_NODISCARD int wf_cluster_get_link(const wf_cluster *c, int a, int b, double *latency_s,
                                            double *bytes_per_s);

/* The number of devices of 'c' (0 for NULL). */
WF_API int wf_cluster_device_count(const wf_cluster *c);

/* Device 'i', or NULL when out of range. Ownership: borrowed from 'c'. */
WF_API const wf_cluster_device *wf_cluster_get_device(const wf_cluster *c, int i);

/* The number of ranks: one more than the largest rank of a device (0 when empty). */
WF_API int wf_cluster_rank_count(const wf_cluster *c);

/* Parses a device string and finds it in the cluster: "rank:R/cpu:I", "rank:R/cuda:I",
 * or without the rank part ("cpu:0", "cuda:1") rank 0; "gpu" is accepted for "cuda".
 * Returns the device index, or WF_EINVAL (malformed: the message quotes the string and says
 * which part) or WF_ENOTFOUND (a rank or device the cluster does not have: the message names
 * it and says what the cluster has), with the reason in wf_last_errmsg(). */
WF_API WF_NODISCARD int wf_cluster_find(const wf_cluster *c, const char *device);

/* Writes the device string of device 'i' ("rank:1/cuda:0") into 'buf'; returns 'buf'
 * ("?" when out of range). */
WF_API const char *wf_cluster_device_name(const wf_cluster *c, int i, char *buf, size_t size);

/* A link's one-way latency and bandwidth from ping-pong round trips of two message sizes:
 * a round trip of 'small' bytes took 'rtt_small' seconds and one of 'large' bytes
 * 'rtt_large' (medians). One way t(s) = latency + s / bandwidth, fitted through both points.
 * Returns 0, or WF_EINVAL (small >= large, times not positive, the large message not slower
 * than the small one: the message gives the numbers). */
WF_API WF_NODISCARD int wf_cluster_link_from_pingpong(size_t small, double rtt_small, size_t large,
                                                      double rtt_large, double *latency_s,
                                                      double *bytes_per_s);

/* ---- Costs -------------------------------------------------------------------------------- */

typedef struct wf_cost_table wf_cost_table; /* opaque: measured seconds per (op, shapes, kind) */

/* Returns 0 or WF_ENOMEM. Ownership: the caller owns '*out' (wf_cost_table_destroy()). */
WF_API WF_NODISCARD int wf_cost_table_create(wf_cost_table **out);
WF_API void wf_cost_table_destroy(wf_cost_table *t);

/* Records that node 'n' (its op, dtype, input shapes and output shape: every node of the
 * same signature shares the entry) took 'seconds' on a device of kind 'kind' (WF_PLACE_*).
 * A second put for the same key replaces the first. Returns 0, WF_EINVAL (NULL, bad kind,
 * seconds < 0 or not finite) or WF_ENOMEM. */
WF_API WF_NODISCARD int wf_cost_table_put(wf_cost_table *t, const wf_node *n, int kind,
                                          double seconds);

/* Looks a node up. Returns 1 and sets '*seconds' when measured, 0 when not, or WF_EINVAL. */
WF_API WF_NODISCARD int wf_cost_table_get(const wf_cost_table *t, const wf_node *n, int kind,
                                          double *seconds);

/* The number of entries. */
WF_API int wf_cost_table_count(const wf_cost_table *t);

/* The prior: the op's flops and bytes (its cost function; without one, the bytes of its
 * inputs and output) on device 'd' as a roofline, max(flops / flops_per_s, bytes /
 * bytes_per_s). Sources (placeholders, constants, variables) cost 0. */
WF_API double wf_cost_prior(const wf_node *n, const wf_cluster_device *d);

/* The node's time on 'd': measured in 't' (may be NULL) if there, else the prior. */
WF_API double wf_cost_seconds(const wf_cost_table *t, const wf_node *n, const wf_cluster_device *d);

/* ---- User hints --------------------------------------------------------------------------- */

typedef struct wf_place_hints wf_place_hints; /* opaque: node -> device string */

/* Returns 0 or WF_ENOMEM. Ownership: the caller owns '*out' (wf_place_hints_destroy()). */
WF_API WF_NODISCARD int wf_place_hints_create(wf_place_hints **out);
WF_API void wf_place_hints_destroy(wf_place_hints *h);

/* Pins node 'n' to 'device' (a string for wf_cluster_find(), checked when a plan is made
 * against its cluster; the syntax is checked here). A later hint of the same node wins.
 * Returns 0, WF_EINVAL (NULL, malformed string) or WF_ENOMEM. Ownership: 'device' is copied. */
WF_API WF_NODISCARD int wf_place_hint(wf_place_hints *h, const wf_node *n, const char *device);

/* A scope: every node that 'g' gains between wf_place_scope_begin() and wf_place_scope_end()
 * is pinned to 'device' (unless it has a hint of its own). Scopes do not nest.
 * Returns 0, WF_EINVAL (NULL, malformed string, a scope already open or none open, another
 * graph) or WF_ENOMEM. */
WF_API WF_NODISCARD int wf_place_scope_begin(wf_place_hints *h, const wf_graph *g,
                                             const char *device);
WF_API WF_NODISCARD int wf_place_scope_end(wf_place_hints *h, const wf_graph *g);

/* ---- The stage planner -------------------------------------------------------------------- */

enum {
    WF_SCHEDULE_GPIPE = 0, /* all forwards, then all backwards: m micro-batches alive */
    WF_SCHEDULE_1F1B = 1,  /* PipeDream-Flush: stage k keeps at most p - k micro-batches */
};

enum {
    WF_PLAN_AUTO = 0,   /* exact over downsets when the graph has few, else over prefixes */
    WF_PLAN_EXACT = 1,  /* every downset (PipeDream's antichains): at most 64 ops, 4096 sets */
    WF_PLAN_PREFIX = 2, /* prefixes of the creation order: any size, O(n p log) */
};

typedef struct wf_plan_opts {
    int n_stages;                /* 0: one per device of the cluster; stage k runs on device k */
    int micro_batches;           /* m; 0: 1. GPipe keeps m micro-batches' activations alive */
    int schedule;                /* WF_SCHEDULE_* */
    double backward_factor;      /* backward time over forward time; 0: 2; < 0: no backward */
    double optimizer_factor;     /* optimizer state bytes per weight byte (Adam: 2); 0: none */
    const wf_cost_table *costs;  /* measured times; NULL: priors only */
    const wf_place_hints *hints; /* NULL: none */
    int method;                  /* WF_PLAN_* */
} wf_plan_opts;

typedef struct wf_plan wf_plan; /* opaque: the assignment and its predictions */

/* Splits the ops of 'g' into pipeline stages, minimising the slowest stage's time per
 * micro-batch: its compute (forward and backward), plus the transfers across its two
 * boundaries (activations forward, gradients back: latency + bytes / bandwidth of the link
 * to the neighbouring stage's device), under each device's memory cap (weights, optimizer
 * state, and the activations the schedule keeps alive). Sources (placeholders, constants,
 * variables) go with their first reader; hinted nodes stay on their device. A value that
 * crosses several boundaries is counted at each (as if relayed), an upper bound of a direct
 * send.
 * Returns 0, or WF_ENOTFOUND (a hint naming a device or rank the cluster does not have:
 * naming the node and the device), WF_EINVAL (NULL, bad option: named; a hint naming a device
 * past the stages: naming the node and the device; hints
 * that contradict the graph's order; no split within the memory caps: naming the device
 * and, if one node alone is too big, the node; fewer ops than stages) or WF_ENOMEM, with the
 * reason in wf_last_errmsg(). Ownership: the caller owns '*out' (wf_plan_destroy()); 'g',
 * 'c' and the opts' tables are borrowed for the call only. */
WF_API WF_NODISCARD int wf_plan_create(const wf_graph *g, const wf_cluster *c,
                                       const wf_plan_opts *opts, wf_plan **out);
WF_API void wf_plan_destroy(wf_plan *p);

/* Scores a given assignment with the planner's model: 'stage_of[id]' for every node id of
 * 'g', stages 0 .. p-1 with p from 'opts' (the entries of sources are ignored: they go with
 * their earliest reader, or their hint). Writes the slowest stage's seconds; memory caps are
 * not checked. For comparing with other splits (parameter balancing, a user's file).
 * Returns 0 or WF_EINVAL (a stage out of range, an edge that goes backwards: named). */
WF_API WF_NODISCARD int wf_plan_evaluate(const wf_graph *g, const wf_cluster *c,
                                         const wf_plan_opts *opts, const int *stage_of,
                                         double *slowest_s);

/* The number of stages of 'p' (0 for NULL). */
WF_API int wf_plan_stage_count(const wf_plan *p);

/* The stage of node 'n', or -1 (NULL, another graph). */
WF_API int wf_plan_node_stage(const wf_plan *p, const wf_node *n);

/* The cluster device of a stage, or -1. */
WF_API int wf_plan_stage_device(const wf_plan *p, int stage);

/* Predictions per stage (per micro-batch: compute with backward, transfers) and memory
 * (weights, optimizer state, live activations); 0 for a bad stage. */
WF_API double wf_plan_stage_seconds(const wf_plan *p, int stage);
WF_API double wf_plan_stage_mem_bytes(const wf_plan *p, int stage);

/* The slowest stage's seconds (what the planner minimised). */
WF_API double wf_plan_slowest_seconds(const wf_plan *p);

/* The schedule model's step time for the plan's m and schedule, and its bubble: the
 * fraction of p * step that the stages sit idle (wf_pipe_simulate()). */
WF_API double wf_plan_step_seconds(const wf_plan *p);
WF_API double wf_plan_bubble(const wf_plan *p);

/* 1 when the exact (downset) method made the plan, 0 for prefixes. */
WF_API int wf_plan_is_exact(const wf_plan *p);

/* Prints the plan: one line per stage with its device, op count, first and last op, the
 * predicted seconds and memory, then the step time and bubble. Returns 0, WF_EINVAL or
 * WF_EIO. */
WF_API WF_NODISCARD int wf_plan_print(const wf_plan *p, FILE *f);

/* ---- The partitioned graphs --------------------------------------------------------------- */

typedef struct wf_partition wf_partition; /* opaque: one graph per rank */

/* Rewrites 'g' into one static graph per rank, given each node's cluster device
 * ('device_of[id]' for every node id; a plan gives it by wf_plan_node_stage() and
 * wf_plan_stage_device()). Each node is copied into its rank's graph with its name, op,
 * attributes and source location, and placed on its device there (wf_node_set_device(): 0
 * the CPU, 1 + i CUDA device i). Every value that another rank reads gets one wf_send in
 * the producer's graph and one wf_recv in each reading rank's graph, shared by every reader
 * there; a control edge from another rank becomes a token (an f32 scalar ordered after the
 * predecessor, sent and received) that the successor is ordered after. Edges are numbered
 * 0, 1, ... in the order of 'g's nodes, the same on every rank.
 * Returns 0, or WF_EINVAL (NULL, a device out of range: naming the node; an update whose
 * variable is on another rank: naming both; more than 32768 edges), WF_ENOMEM or the error of
 * copying a node (the new graph's message), with the reason in wf_last_errmsg().
 * Ownership: the caller owns '*out' (wf_partition_destroy(), which destroys the graphs);
 * 'g' is borrowed for the call (its constants' tensors are retained by the copies). */
WF_API WF_NODISCARD int wf_partition_create(const wf_graph *g, const wf_cluster *c,
                                            const int *device_of, wf_partition **out);
WF_API void wf_partition_destroy(wf_partition *p);

/* The number of ranks (per-rank graphs) of 'p' (0 for NULL). */
WF_API int wf_partition_rank_count(const wf_partition *p);

/* Rank 'rank's graph, or NULL. Ownership: borrowed from 'p'. */
WF_API wf_graph *wf_partition_graph(const wf_partition *p, int rank);

/* The copy of 'g's node 'n' in its rank's graph, or NULL. Ownership: borrowed. */
WF_API wf_node *wf_partition_node(const wf_partition *p, const wf_node *n);

/* The send nodes of rank 'rank' (targets that each step must run): the count, and the i-th
 * (NULL out of range). Ownership: borrowed. */
WF_API int wf_partition_send_count(const wf_partition *p, int rank);
WF_API wf_node *wf_partition_send(const wf_partition *p, int rank, int i);

/* The number of send/recv pairs (edges) across all ranks. */
WF_API int wf_partition_edge_count(const wf_partition *p);

/* ---- Transfer keys ------------------------------------------------------------------------ */

/* What a graph transfer's key says. Source, destination and the sender's incarnation are put
 * in by the transport (each message carries them: a restarted peer's new incarnation never
 * matches a stale message), so the part packed here is (step, micro-batch, edge). */
typedef struct wf_xfer_key {
    uint32_t step;        /* training step, kept modulo 2^15 */
    uint32_t micro_batch; /* < 256 */
    uint32_t edge;        /* < 32768 (the edge of wf_send()/wf_recv()) */
} wf_xfer_key;

/* Packs a key below 2^39 (bit 0 left zero for the transport's header/data part):
 * step << 24 | micro_batch << 16 | edge << 1.
 * Returns 0, or WF_EINVAL (micro_batch or edge out of range: named). */
WF_API WF_NODISCARD int wf_xfer_key_pack(const wf_xfer_key *k, uint64_t *out);

/* The inverse of wf_xfer_key_pack() (the part bit is ignored). */
WF_API wf_xfer_key wf_xfer_key_unpack(uint64_t key);

/* ---- Pipeline schedules ------------------------------------------------------------------- */

typedef enum wf_pipe_op {
    WF_PIPE_FWD = 0,       /* forward of a micro-batch */
    WF_PIPE_BWD = 1,       /* backward of a micro-batch */
    WF_PIPE_SEND_ACT = 2,  /* its activations to stage + 1 */
    WF_PIPE_RECV_ACT = 3,  /* its activations from stage - 1 */
    WF_PIPE_SEND_GRAD = 4, /* its input gradient to stage - 1 */
    WF_PIPE_RECV_GRAD = 5, /* its output gradient from stage + 1 */
} wf_pipe_op;

typedef struct wf_pipe_action {
    int op;          /* wf_pipe_op */
    int micro_batch; /* 0 .. m-1 */
    int peer;        /* the other stage of a send or receive; -1 for compute */
} wf_pipe_action;

typedef struct wf_pipe_schedule wf_pipe_schedule; /* opaque: action lists per stage */

/* Makes every stage's action list for 'schedule' (WF_SCHEDULE_*) over 'stages' stages and
 * 'micro_batches' micro-batches: first one global order (a list scheduler that, in rounds,
 * lets each stage take its next compute action once what it needs has been sent), then each
 * stage's list as its projection, receives placed right before the compute that needs them
 * and sends right after the compute that makes them. The result passes wf_pipe_check().
 * Returns 0, or WF_EINVAL (unknown schedule, stages < 1 or > 1024, micro_batches < 1 or >
 * 65536: naming the option) or WF_ENOMEM. Ownership: the caller owns '*out'
 * (wf_pipe_schedule_destroy()). */
WF_API WF_NODISCARD int wf_pipe_schedule_create(int schedule, int stages, int micro_batches,
                                                wf_pipe_schedule **out);
WF_API void wf_pipe_schedule_destroy(wf_pipe_schedule *s);

/* The stages and the micro-batches 's' was made for (0 for NULL). */
WF_API int wf_pipe_schedule_stages(const wf_pipe_schedule *s);
WF_API int wf_pipe_schedule_micro_batches(const wf_pipe_schedule *s);

/* Stage 'stage's actions: the count in '*n' and the array (NULL for a bad stage).
 * Ownership: borrowed from 's'. */
WF_API const wf_pipe_action *wf_pipe_schedule_actions(const wf_pipe_schedule *s, int stage, int *n);

/* The static check of any action lists ('lists[k][0 .. lens[k]-1]' for stage k < stages,
 * 'micro_batches' m): every stage runs each micro-batch's forward once and then its
 * backward once; every send names a neighbour, has exactly one matching receive (same
 * micro-batch, kind and pair of stages) and vice versa; stage 0 receives no activations and
 * the last stage sends none; a compute action follows the receive it needs; and the
 * wait-for graph (each action waits for the one before it on its stage, and a receive for
 * its send; receives are pre-posted and sends do not wait) has no cycle, so every stage runs
 * to its end. Writes the largest number of micro-batches any stage keeps alive (forward
 * done, backward not) to '*max_in_flight' (may be NULL).
 * Returns 0, or WF_EINVAL with the first violation in wf_last_errmsg() (naming the stage,
 * the action's index, op and micro-batch; for a cycle, the actions on it). */
WF_API WF_NODISCARD int wf_pipe_check(int stages, int micro_batches,
                                      const wf_pipe_action *const *lists, const int *lens,
                                      int *max_in_flight);

/* Simulates a schedule: stage k's forward takes 'fwd_s[k]', its backward 'bwd_s[k]', and a
 * transfer between stage k and k + 1 'xfer_s[k]' (k < stages - 1; NULL: 0), each action as
 * soon as its stage and its message are ready. Writes the step time (the last action's end)
 * and the bubble (idle fraction of stages * step). Returns 0 or WF_EINVAL. */
WF_API WF_NODISCARD int wf_pipe_simulate(const wf_pipe_schedule *s, const double *fwd_s,
                                         const double *bwd_s, const double *xfer_s, double *step_s,
                                         double *bubble);

/* ---- Tensor parallelism ------------------------------------------------------------------- */

/* A two-matmul block of a graph, x·W1 (+ b1) -> act -> ·W2 (+ b2) (Megatron's MLP), named by
 * its variables: w1 [in, H] and w2 [H, out], read only by the block's two matmuls (no
 * transposes); b1 [H] and b2 [out] (NULL: none) added to the matmuls' values; act any
 * elementwise op of one input (relu, tanh, gelu, ...) between them, the one reader of the
 * first matmul's (+ b1) value and read only by the second matmul. */
typedef struct wf_tp_block {
    const wf_node *w1, *b1, *w2, *b2;
} wf_tp_block;

/* Builds rank 'rank''s graph of a tensor-parallel group of 'size' ranks from forward graph 'g'
 * (static; no gradients or updates yet): a copy of g in which each block of 'blocks' (n_blocks
 * of them) is split Megatron's way. W1 and b1 are split by columns and W2 by rows: rank r holds
 * the hidden range [r H / size, (r + 1) H / size), its variables of the same names with those
 * shapes and initializers that give them the full variables' slices (wf_init_part()), so the
 * split model starts where the single-process model does. A tp_enter ("<matmul1>/tp_enter":
 * the identity; its gradient all-reduces x's) comes before the first matmul, and a tp_reduce
 * ("<matmul2>/tp_reduce": the rank-ordered sum over the group) after the second, so b2 is
 * added once, after the sum, and everything after the block is computed whole on every rank.
 * Block k's pair uses key edges edge + 2k and edge + 2k + 1 (no other transfer of the rank's
 * sessions may use them). Every other node is copied with its name, attributes and source
 * location: find them in the new graph with wf_graph_find(). Then add the loss's gradients
 * and the optimizer to the new graph (wf_minimize) and run it in a session given a
 * communicator of 'size' ranks (wf_session_opts.comm). Use it when one matmul's weights
 * exceed a device's memory: each rank holds 1/size of W1, b1 and W2.
 * Returns 0, or WF_EINVAL with the message naming the node and its shape: a rank outside
 * 0 .. size - 1, an H that does not divide into 'size' parts, W2's rows not W1's columns, a
 * bias of another shape, a block whose structure differs (a variable read elsewhere, an inner
 * value read outside the block, no elementwise activation), a graph with gradients or
 * updates, edges beyond 2^15; or WF_ENOMEM. Ownership: the caller owns '*out'
 * (wf_graph_destroy()); 'g' is only read. */
WF_API WF_NODISCARD int wf_tp_split_create(const wf_graph *g, const wf_tp_block *blocks,
                                           int n_blocks, int rank, int size, int edge,
                                           wf_graph **out);

#ifdef __cplusplus
}
#endif

#endif /* WEFT_PLACEMENT_H */
