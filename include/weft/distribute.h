/* weft/distribute.h: distribution strategies: one graph, written for one replica, trained
 * data-parallel over the ranks of a communicator (MultiWorkerMirrored) or over the devices
 * of one process (Mirrored, wf_strategy_mirrored()), or split into pipeline stages across
 * the ranks (wf_strategy_pipeline()).
 * Owns: the public contract of strategies (part of runtime/): the strategy object, its
 *   options, and what a session given one (wf_session_opts.strategy) does.
 * MultiWorkerMirrored (wf_strategy_multiworker()): one replica per rank. At
 *   wf_session_create() the graph is rewritten (a pure graph pass): every placeholder whose
 *   first dimension is -1 is a batch, fed whole (the global batch, B rows, the same on every
 *   rank) and split into S shards of contiguous rows (shard k: rows [k*B/S, (k+1)*B/S), the
 *   first B mod S shards one row longer); rank r computes the forward and backward of its
 *   shards r*S/N .. (r+1)*S/N - 1; each gradient is the sum over all S shards of the shard's
 *   gradient times its weight (the aggregation), in one fixed tree whatever the number of
 *   ranks, so 1 rank x 4 shards, 2 x 2 and 4 x 1 train bit for bit alike. Gradients travel
 *   in buckets (first_bucket_bytes, then bucket_bytes), filled in the order backward makes
 *   them; each bucket's reduction is a node of the dataflow that starts when its last
 *   gradient exists, on the network's actor (no worker waits), so communication overlaps the
 *   rest of backward. The optimizer's update then runs on every rank with the same gradient.
 *   A fetched f32 scalar computed from the batch is the global value, reduced as the
 *   gradients are, except that the shards' values of a wf_sum are added (a count of
 *   correct rows: the global count) and those of a wf_mean weighted by rows (a mean loss:
 *   the global mean); fetching a per-row value of a replica is refused (WF_EINVAL).
 *   At creation variables are broadcast from rank 0 and checked equal by a hash on every
 *   rank; ranks whose graphs or options differ fail creation with WF_EINVAL naming the
 *   ranks and the difference. A rank that dies fails the others' runs with WF_EPEER naming
 *   it (the communicator's failure detection); so does a rank whose wf_session_run fails
 *   by itself (a bad feed, no memory, a kernel's error): it fails the communicator with its
 *   error, which the others' runs return at once as WF_EPEER ("rank R: its step failed
 *   (code): message"). Either way the session is then unusable but destroyable.
 * The tree: shards [lo, hi) split at lo + the largest power of two below hi - lo, so S = 4
 *   sums as (s0 + s1) + (s2 + s3), S = 3 as (s0 + s1) + s2.
 * Limits: S must be a multiple of N, and each rank's S / N shards a subtree of the tree (a
 *   power of two, or N = 1, always is; S = 6 over N = 3 is, over N = 2 is not); at most 64
 *   shards per rank; the reduced values are f32; wf_send/wf_recv edges from 16384 up are
 *   the strategy's; every rank makes the same runs in the same order.
 * Not here: sessions (weft/runtime.h), communicators (weft/transport.h). */
#ifndef WEFT_DISTRIBUTE_H
#define WEFT_DISTRIBUTE_H

#include <weft/base.h>
#include <weft/transport.h>

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct wf_strategy wf_strategy; /* opaque */
typedef struct wf_session wf_session;   /* weft/runtime.h */

/* How the shards' values combine into the global one. */
typedef enum wf_aggregation {
    WF_AGG_MEAN = 0,      /* each shard weighted by its share of the batch's rows (n_k / B):
                             for a mean loss, the mean over the global batch, as one process
                             computes it, also when S does not divide B */
    WF_AGG_SUM = 1,       /* plain sum (a loss that sums over rows) */
    WF_AGG_SHARD_MEAN = 2 /* each shard weighted 1 / S, whatever its rows (DDP's average) */
} wf_aggregation;

typedef struct wf_strategy_opts {
    int shards;                /* S; 0: the communicator's size */
    int aggregation;           /* wf_aggregation; 0: WF_AGG_MEAN */
    size_t bucket_bytes;       /* 0: 25 MiB (PyTorch DDP's). Gradients join the open
                                  bucket in the order backward makes them; it closes once it
                                  holds at least its limit (the gradient that reaches it
                                  included) or backward has no more, as DDP's buckets do. */
    size_t first_bucket_bytes; /* 0: 1 MiB: the first bucket is small so that communication
                                  starts early in backward */
    /* Mirrored only (wf_strategy_mirrored(); 0 and NULL for MultiWorkerMirrored): */
    int n_devices;         /* D, the devices the replicas run on; 0: every GPU of the
                              runtime (or every simulated device) */
    const int *devices;    /* their ids as the runtime numbers them (1 + k: CUDA GPU k,
                              wf_device_count()), distinct; NULL: 1 .. D. Copied. */
    int simulated_devices; /* > 0: instead of GPUs, this many simulated devices ("sim:0",
                              "sim:1" and on, each with host memory of its own, running the CPU
                              kernels; copies and completions as a GPU's: later, from
                              the device's actor): a Mirrored run where there is no GPU,
                              for tests and demos; it computes what the CPU computes, no
                              faster). 'devices' then number them from 0. */
} wf_strategy_opts;

/* Makes a MultiWorkerMirrored strategy over 'comm' (NULL: this process alone, rank 0 of 1:
 * the single-process run with S shards, which any number of ranks reproduces bit for bit).
 * Returns 0, WF_EINVAL (NULL out, negative or unknown option, S not a multiple of the
 * world size N or a rank's shards not a subtree of the tree: the message names the
 * values) or WF_ENOMEM.
 * Ownership: the caller owns '*out' (wf_strategy_destroy()); 'comm' is borrowed and must
 * outlive every session made with the strategy; 'opts' (NULL: defaults) is copied.
 * Threads: any. */
WF_API WF_NODISCARD int wf_strategy_multiworker(wf_comm *comm, const wf_strategy_opts *opts,
                                                wf_strategy **out);

/* Makes a Mirrored strategy over devices of 'rt' in this process: one replica per device.
 * A session given it (the graph's runtime must be 'rt') rewrites the graph as
 * wf_strategy_multiworker(NULL, opts) does, S shards (opts.shards; 0: D) in one process,
 * and places shard k's copy of every per-replica node on device k * D / S (contiguous
 * blocks of shards per device); what it cannot run there (the batch's row split, ops with
 * no kernel for the device, f64 nodes) stays on the host. Variables stay on the host and
 * are copied to each device every step (one copy node per variable and device: the
 * mirror); the gradients come back to the host, where one reduction node per bucket sums
 * the S shards in the fixed tree, and one update per variable applies the result. The
 * bits are those of wf_strategy_multiworker() with the same S on any number of ranks, and
 * of the single-process run with S shards, whatever D. Without opts.device set, the
 * session's other nodes run on the CPU (wf_session_opts.device -1).
 * Returns 0, WF_EINVAL (NULL rt or out; zero devices (no GPU and no simulated ones); a
 * device id the runtime lacks or given twice; S below D or above 64; an option of
 * MultiWorkerMirrored's that does not apply: the message names the value) or WF_ENOMEM.
 * Limits: the reduction runs on host memory (no NCCL path yet); on a CUDA GPU it has not
 *   run (none was lent to this project: compile-checked only).
 * Ownership: the caller owns '*out' (wf_strategy_destroy()); 'rt' is borrowed and must
 * outlive it; 'opts' (NULL: defaults) and its device list are copied.
 * Threads: any. */
WF_API WF_NODISCARD int wf_strategy_mirrored(wf_runtime *rt, const wf_strategy_opts *opts,
                                             wf_strategy **out);

/* The devices of a Mirrored strategy (D), 0 for MultiWorkerMirrored, WF_EINVAL for NULL. */
WF_API int wf_strategy_device_count(const wf_strategy *st);

/* Options of parameter servers (wf_strategy_ps()). */
typedef struct wf_ps_opts {
    int servers;     /* K: ranks 0 .. K-1 are servers, the others workers; 1 <= K < N, required */
    int staleness;   /* s: 0: synchronous (each server sums one step of every worker before it
                        updates); s > 0: asynchronous with the staleness bound s (below) */
    int shards;      /* S; 0: the number of workers N - K */
    int aggregation; /* wf_aggregation; 0: WF_AGG_MEAN */
} wf_ps_opts;

/* Makes a parameter-server strategy (tf.distribute's ParameterServerStrategy, synchronous)
 * over 'comm'. Ranks 0 .. K-1 (the servers) hold the variables: each update that reads a
 * gradient goes, largest first (the bytes of its variable and optimizer slots), to the server
 * holding the fewest bytes so far (ties: the lowest rank); updates reading no gradient (the
 * step counter's increment) run on every server. The optimizer state lives there. Ranks K ..
 * N-1 (the W workers) split the global batch into S shards as MultiWorkerMirrored does over
 * W ranks (worker w takes shards w*S/W .. (w+1)*S/W - 1), push each gradient's weighted sum
 * over their shards to its server, and pull every updated variable back into their own copy
 * before their run returns. A server adds the W partials of a gradient in the fixed tree of
 * MultiWorkerMirrored, so a run with W workers gives the bits of MultiWorkerMirrored over W
 * ranks with the same shards (and of one process with S shards). A fetched scalar (a loss) is
 * the global value on every rank, servers included.
 * Every rank's wf_session_run() is one step: a server's receives, updates and sends; it needs
 * no batch (feeds are ignored) but makes the same runs, with the same fetches and targets, as
 * the workers. A dead rank, server or worker, fails every other rank's run with WF_EPEER
 * naming it; a run that fails by itself fails the others as under MultiWorkerMirrored.
 * Limits: as MultiWorkerMirrored's (with W for N); one update per gradient; a value that reads
 * a gradient must be an update; a worker's optimizer slots and step counter stay at their
 * initial values, and so does a server's copy of a variable another server holds: a worker
 * has every variable's value after each step, each server its own variables' optimizer
 * state (wf_session_ps_sync() gathers it on every rank, for a checkpoint).
 * Returns 0, WF_EINVAL (NULL out, opts or comm, K < 1 or K >= N, negative staleness, bad
 * shards or aggregation: the message names the values) or WF_ENOMEM.
 * Ownership: the caller owns '*out' (wf_strategy_destroy()); 'comm' is borrowed and must
 * outlive every session made with the strategy; 'opts' is copied. Threads: any. */
WF_API WF_NODISCARD int wf_strategy_ps(wf_comm *comm, const wf_ps_opts *opts, wf_strategy **out);

/* 1 if this rank is a parameter server of 'st', 0 if not (a worker, or another strategy),
 * WF_EINVAL for NULL. */
WF_API int wf_strategy_is_server(const wf_strategy *st);

/* The rows [*lo, *hi) of a global batch of 'rows' rows that this rank's shards read, so a
 * loader fills only those (the other rows of the batch fed are never read: any values do):
 * MultiWorkerMirrored's rank r takes shards r*S/N .. (r+1)*S/N - 1, a parameter-server worker
 * w those of worker w over the W workers, shard k being rows [k*b + min(k, e), that + b + (k <
 * e)) with b = rows / S and e = rows mod S (the first e shards one row longer); a server reads
 * no row (*lo = *hi = 0); Mirrored (one process) and a pipeline (its stages read the batch's
 * inputs and labels) read every row. Returns 0, or WF_EINVAL (NULL st, lo or hi; rows < 0).
 * Threads: any. */
WF_API WF_NODISCARD int wf_strategy_local_rows(const wf_strategy *st, long long rows, long long *lo,
                                               long long *hi);

/* Asynchronous parameter servers (staleness s > 0, stale-synchronous parallel: SSP).
 * Versions and clocks: a server's version is its count of applied updates; worker w's clock
 *   is its count of steps (runs) whose push the server has applied; the min clock m is the
 *   least clock over the workers. Each worker's push is applied by its servers as it arrives
 *   (one update per push, in arrival order, with the worker's own gradient: its partial times
 *   W, times 1 under WF_AGG_SUM, which is the mean over its rows when W divides the batch).
 * The bound: a worker computes its step c on a copy that holds every update of every
 *   worker's steps below c - s (c - m <= s, m the min clock when the copy was sent). A worker
 *   that gets ahead waits: its server holds its reply (the run pends on the receive, on the
 *   network's actor: no worker thread of the runtime blocks) until the slowest catches up.
 * A worker's training run (one that targets the updates): computes on its copy, pushes its
 *   gradients and scalars, and returns once every server's reply (the updated variables and
 *   a header) is in. No global value exists: a fetched scalar is the worker's own rows'
 *   estimate of it (its partial times W: the mean over its rows of a mean loss when W
 *   divides the batch, W times its rows' count of a wf_sum), and a run that does not update
 *   (an evaluation) computes it alone, with no transfer. A server's training run is a loop of
 *   the library on the caller's thread: it applies W pushes (from any workers, the earliest
 *   first), sends each reply the bound allows, and returns once its sends are done; a
 *   fetched scalar is the mean of those pushes' scalars; the feeds are ignored. A server's
 *   run that does not update does nothing but give the last training run's scalars. Every
 *   rank makes the same number of training runs.
 * Failures are the synchronous mode's: a dead server or worker fails the other ranks' runs
 *   with WF_EPEER naming it within the communicator's detection time. */
typedef struct wf_ps_stats {
    long long clock;         /* worker: its clock; server: its version (updates applied) */
    long long min_clock;     /* the min clock in the worker's copy (the least over its
                                servers) / now on the server */
    long long version;       /* worker: its copy's version (summed over the servers);
                                server: = clock */
    long long max_lag;       /* the most c - m over the copies so far (<= s: the bound) */
    long long max_staleness; /* the most updates applied between a gradient's copy and its
                                own update */
    long long held;          /* server: replies the bound held back (a fast worker waited);
                                worker: 0 */
} wf_ps_stats;

struct wf_session;

/* What this rank's asynchronous parameter-server session has seen so far. Returns 0, or
 * WF_EINVAL (NULL; a session without an asynchronous parameter-server strategy).
 * Threads: any, also while a run is under way. */
WF_API WF_NODISCARD int wf_session_ps_stats(struct wf_session *s, wf_ps_stats *out);

/* Gathers the servers' state into every rank's session (parameter servers, either mode):
 * each variable an update writes (the model's weights, the optimizer's slots, the step
 * counter) gets the value of the server whose updates write it (server 0 for what every
 * server updates), by one broadcast each, so that any rank then holds the whole training
 * state: a checkpoint written from it (wf_checkpointer_save(), wf_session_save()) holds the
 * variables and the servers' optimizer slots, and restoring that file on every rank
 * (wf_checkpoint_restore()) resumes the run: synchronously, bit for bit as one never stopped.
 * Collective: every rank calls it at the same point, between runs (after the same number of
 * training runs: in asynchronous mode every push is then applied).
 * Returns 0, WF_EINVAL (NULL; no parameter-server strategy), or the communicator's failure
 * (WF_EPEER naming the rank). Threads: the thread that runs the session's runs. */
WF_API WF_NODISCARD int wf_session_ps_sync(struct wf_session *s);

/* Pipeline parallelism (wf_strategy_pipeline()): one model split into stages, stage k on
 * rank k, each step's global batch (B rows, fed whole on every rank, as above) split into m
 * micro-batches that flow through the stages. At wf_session_create() the graph is rewritten
 * (a pure graph pass): the micro-batches are the shards above (rows [k*B/m, (k+1)*B/m)),
 * every node gets a stage (a node hinted to "rank:K/cpu:0" by 'hints' is on stage K; a node
 * a gradient function made is on the stage of the node it differentiates; an update that
 * reads only variables and constants, such as an optimizer's step counter, runs on every
 * stage, and so does the update of a variable that nodes of several stages read (a tied
 * embedding: each stage keeps a copy and applies the same update to it); a node computed
 * once per step from the gradients that is no update (clipping by the global norm) is on the
 * stage of its largest input; a batch placeholder is on the stage of its first reader; any
 * other node is on the latest stage of its inputs, stage 0 without one), this rank keeps its
 * stage's part, and each micro-batch's value that another stage reads crosses by a send/recv
 * pair of the graph (a receive is posted when the run starts; no worker waits), as does,
 * once per step, a reduced gradient or a value computed from them that another stage's
 * update or clipping reads (a gradient's squared norm, the clipping scale). A run sends only what
 * the other stages' parts of the same run need, so forward-only runs (an evaluation) send no
 * gradients. The stage's work follows the schedule's action list (weft/placement.h: GPipe,
 * or 1F1B, which keeps at most p - k micro-batches' activations alive on stage k): each
 * micro-batch's forward or backward part waits for the part before it (orderings a run
 * keeps when both parts are in it). Each gradient is the fixed tree sum over the m
 * micro-batches on the stage that owns its variable, so a pipeline trains bit for bit as one
 * process with the MultiWorkerMirrored strategy and m shards. A fetched f32 scalar computed
 * from the batch (the loss) is the global value on every rank (sent from its stage); other
 * values are fetched on their own stage, and a variable is read on its own stage
 * (wf_session_variable() on another rank gives its initial value). Every rank makes the same
 * runs in the same order. Failures are as above: a dead stage, or one whose run fails, fails
 * the other ranks' runs with WF_EPEER naming it.
 * Placement auto (wf_pipeline_opts.placement): at wf_session_create() the planner splits
 * the forward part of the graph (the nodes no gradient function made, at the rows of one
 * micro-batch) into the stages, one CPU per rank with the measured links and 'mem_bytes' as
 * each stage's cap, minimising the slowest stage (forward, backward modelled as twice the
 * forward, and transfers), keeping the hints the user gave; the optimizer's state is counted
 * as the bytes of the variables the forward does not read over those it reads. Links: once
 * per strategy, every rank takes part in a ping-pong of two sizes per pair of ranks
 * (wf_comm_probe_links(), the fastest of 12), fitted to a latency and a bandwidth. Costs:
 * the 'costs' table when given (looked up at one micro-batch's shapes: the largest
 * micro-batch's rows for the batch dimension); else every rank profiles the forward's ops at
 * those shapes (wf_profile_graph(), each signature once per strategy) and the planner takes
 * the fastest rank's time per op (an all-gather; each the fastest of its runs), the ops' priors for
 * what is not profiled. The plan is a deterministic function of the graph, the options and those
 * numbers, which every rank has alike, so every rank makes the same one. The backward, the updates
 * and the rest then follow as above. wf_session_pipeline_plan() gives its text. Creation fails with
 * the planner's error: WF_EINVAL when no split fits the caps (naming the device and the bytes),
 * WF_ENOTFOUND for a hint of a rank that does not exist (naming the node and the device).
 * Micro-batches: GPipe and 1F1B run any m >= 1, also m below the stages (the bubble grows).
 * Limits: stages = the world size, 1 .. 64; m 1 .. 64; B >= m and the same in every run (a
 * receive's shape is its value's for the micro-batch's rows, by each op's shape inference);
 * an update of every stage runs on all of them, also on stages between that do not read its
 * variable; no control edge across stages but an everywhere update's. */
typedef struct wf_pipeline_opts {
    int stages;                         /* 0: the communicator's size; must equal it */
    int micro_batches;                  /* m; 0: 1 */
    int schedule;                       /* WF_SCHEDULE_GPIPE (0) or WF_SCHEDULE_1F1B (1) */
    long long batch_rows;               /* B, the rows of every run's batch (> 0, >= m) */
    const struct wf_place_hints *hints; /* the stages of the forward nodes (weft/placement.h);
                                           NULL: every node on stage 0. Borrowed until
                                           wf_session_create() returns */
    int aggregation;                    /* wf_aggregation; 0: WF_AGG_MEAN */
    int placement;                      /* WF_PIPELINE_PLACE_HINTS (0) or _AUTO (1) */
    double mem_bytes;                   /* _AUTO: each stage's memory cap in bytes (0: none) */
    const struct wf_cost_table *costs;  /* _AUTO: measured op seconds (weft/placement.h), the
                                           same table on every rank (e.g. rank 0's, sent to
                                           all); NULL: the ops' priors. Borrowed as 'hints' */
} wf_pipeline_opts;

/* Where a pipeline's forward nodes go (wf_pipeline_opts.placement). */
enum {
    WF_PIPELINE_PLACE_HINTS = 0, /* the hints' stages; other nodes follow their inputs */
    WF_PIPELINE_PLACE_AUTO = 1   /* the planner's (wf_plan_create(), weft/placement.h) */
};

/* Makes a pipeline strategy over 'comm' (NULL: this process alone, one stage).
 * Returns 0, WF_EINVAL (NULL out; stages other than the world size: the message gives both;
 * micro_batches < 0 or > 64; an unknown schedule or aggregation; batch_rows < m) or
 * WF_ENOMEM. Ownership and threads: as wf_strategy_multiworker(). */
WF_API WF_NODISCARD int wf_strategy_pipeline(wf_comm *comm, const wf_pipeline_opts *opts,
                                             wf_strategy **out);

/* The text of a pipeline session's plan (placement auto): the planner's lines (per stage
 * its device, op count, first and last op, predicted seconds per micro-batch, memory; then
 * the step time and the bubble), then each stage's nodes by name. NULL when the session has
 * none (another strategy, or the hints' placement). Ownership: borrowed from 's' until it is
 * destroyed. */
WF_API const char *wf_session_pipeline_plan(const wf_session *s);

/* The stage of user node 'n' in a pipeline session: >= 0 its stage (a variable, constant or
 * what reads only them: the lowest stage that reads it; -1 when nothing on a stage does), -2
 * for a node that runs on every stage (an optimizer's step counter). Returns WF_EINVAL for
 * NULL, a node of another graph or a session without a pipeline. */
WF_API int wf_session_pipeline_stage(const wf_session *s, const wf_node *n);

/* This process's rank and the world size of a strategy (0 and 1 without a communicator,
 * and for Mirrored), or WF_EINVAL for NULL. */
WF_API int wf_strategy_rank(const wf_strategy *st);
WF_API int wf_strategy_size(const wf_strategy *st);

/* Frees a strategy (after every session made with it). NULL is a no-op. */
WF_API void wf_strategy_destroy(wf_strategy *st);

#ifdef __cplusplus
}
#endif
#endif /* WEFT_DISTRIBUTE_H */
