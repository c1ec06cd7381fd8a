/* runtime/internal.h: what the files of runtime/ share and nobody else sees.
 * Owns: the layout of a session (struct wf_session), of a compiled plan (wf__plan) and of a
 *   run slot (wf__slot), and the calls between session.c, plan.c and exec.c.
 * Invariants (stated here once):
 *   - a plan's nodes are what its key (the fetches and targets) needs after the compile
 *     passes (runtime/passes.h): graph nodes, nodes the passes made, which the plan
 *     owns ('made'), and the copy nodes placement inserted ('dev->copy_nodes'), in a
 *     topological order (ascending id when no pass made a node and nothing crosses
 *     devices);
 *     plan index i runs task i of every slot's task graph; 'index_of' maps every graph
 *     node to the plan node whose value a run hands out for it (itself, its replacement,
 *     or for a fetched node on a GPU its copy to the host);
 *   - 'uses0[i]' is the number of input edges of plan nodes that read node i; at the start
 *     of a run 'uses[i]' is 'uses0[i]' plus one per fetch of i, and the value of node i is
 *     released when 'uses[i]' reaches 0, so between runs every value slot is NULL;
 *   - a slot is either on its plan's free list or held by exactly one run;
 *   - the session's variable values are replaced, never written: a run retains the value
 *     it reads, under 'var_lock';
 *   - a variable's host value or its device value (wf__var_dev) is current, or both:
 *     'host_ver == ver' or ('dval' and 'dev_ver == ver'), under 'var_lock'
 *     (runtime/var_device.c).
 * Not here: the public contract (weft/runtime.h). */
#ifndef WF_RUNTIME_INTERNAL_H
#define WF_RUNTIME_INTERNAL_H

#include "../core/error.h"
#include "../core/graph.h"
#include "../core/op.h"
#include "../core/tensor.h"
#include "../devices/device.h"
#include "../memory/plan.h"
#include "../placement/place.h"

#include <weft/memory.h>
#include <weft/runtime.h>
#include <weft/sched.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

typedef struct wf__plan wf__plan;

/* Seconds of CLOCK_MONOTONIC (the profile run's and the planner's measurements). */
static inline double wf__rt_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A static memory plan (runtime/memplan.c): where each planned output of a plan lives in a
 * run slot's arena (memory/plan.h's plan, 'm': offsets, in-place marks, the arena's size,
 * ordering edges), with the dtype and shape of each planned output. Made once per static
 * plan at compile time, or per slot for the feed shapes of its latest run when placeholders
 * have -1 dimensions. Read-only once made. */
typedef struct wf__memplan {
    wf__mem_plan *m; /* owned; never NULL in a made plan */
    wf_dtype *dtype; /* per plan node: the planned dtype (planned nodes only) */
    wf_shape *shape; /* per plan node: the planned shape (planned nodes only) */
} wf__memplan;

enum {
    WF__PN_KERNEL = 0,  /* runs its kernel (wf__plan.kernel) */
    WF__PN_PLACEHOLDER, /* its value is the feed, set before the run starts */
    WF__PN_CONSTANT,    /* its value is the node's tensor */
    WF__PN_VARIABLE,    /* its value is the session's current value of the variable */
    WF__PN_COPY,        /* a node of core's copy op that placement inserted: its input's
                           value on another device (exec_device.c: wf__exec_copy_node()) */
};

/* The most dead values an inline run keeps for reuse (a strict chain needs one or two). */
#define WF__SPARE_MAX 8

/* One task's argument: which node of which run. */
typedef struct wf__task_arg {
    struct wf__slot *slot;
    int32_t index; /* plan index */
} wf__task_arg;

/* The state of one run of a plan. */
typedef struct wf__slot {
    struct wf__slot *next_free;
    wf__plan *plan;
    wf_taskgraph *tg; /* one node per plan node, edges as the plan's */
    wf_group grp;
    bool grp_ok;                     /* 'grp' is initialised */
    wf__task_arg *args;              /* 'plan->n' entries */
    wf_tensor **vals;                /* 'plan->n' value slots (NULL between runs) */
    _Atomic int32_t *uses;           /* remaining reads of each value this run */
    _Atomic int failed;              /* the first failing task sets it and writes 'errmsg' */
    int n_spare;                     /* entries of 'spare' */
    wf_tensor *spare[WF__SPARE_MAX]; /* inline plans only: dead values of this slot, kept
                                        (and owned) for reuse as outputs (exec.c: spare_take) */
    uint64_t step;                   /* this run's number (wf_kernel_ctx.step) */
    uint64_t xfer_step;              /* its number among transferring runs (.xfer_step) */
    struct wf__slot_dev *dev;        /* exec_device.c: this run's values on GPUs; NULL when
                                        the plan has no 'dev' */
    /* The arena (runtime/memplan.c), kept across runs; NULL 'planned': outputs come from
     * the session's pool. */
    const wf__memplan *mp; /* the plan's 'mp', or 'own_mp' (plans with -1 dimensions) */
    wf__memplan *own_mp;   /* made for 'fed' (plans with -1 dimensions), owned */
    wf_shape *fed;         /* 'plan->n_placeholders' feed shapes 'own_mp' was made for */
    void *arena;           /* 'arena_bytes' from the session's pool */
    size_t arena_bytes;    /* the size asked of the pool (at least 1) */
    wf_tensor **planned;   /* per plan node: a tensor over its bytes of the arena (one
                              reference, the slot's), or NULL: not planned */
    int err;
    char errmsg[WF_ERRMSG_MAX];
} wf__slot;

/* The largest value (in elements) of a plan that runs inline: with every value this small,
 * a node costs less than a task round trip, so handing a chain of them between workers only
 * adds latency. Measured on a 10^5-node chain of f32 scalar adds (2 workers, same session,
 * best of 15): ~155 ns per node through the task graph, ~135 ns inline, ~75 ns inline with
 * dead values reused as outputs (exec.c: spare_put). */
#define WF__INLINE_NUMEL 256

struct wf__plan {
    wf__plan *next;          /* the session's list of plans */
    int32_t *key;            /* sorted, distinct ids of fetches and targets */
    int n_key;               /* entries of 'key' */
    int n;                   /* plan nodes */
    wf_node **nodes;         /* 'n', in a topological order (see above) */
    uint8_t *kind;           /* WF__PN_* per plan node */
    wf_kernel_fn *kernel;    /* per plan node: the kernel it runs (kernel nodes; NULL for the
                                others), the session's registered one for the kind of its
                                device (pass_place.c: resolve_kernels()) */
    void **kdata;            /* per plan node: the data registered with that kernel (its
                                wf_kernel_ctx.data), or NULL */
    uint8_t *reinfer;        /* 1: the shape depends on fed sizes: infer at kernel time */
    int32_t *var;            /* variable index per plan node (-1: not a variable) */
    int32_t *in_off;         /* CSR of input plan indices: node i reads in_idx[in_off[i] ..
                                in_off[i + 1]) */
    int32_t *in_idx;         /* one per input edge */
    int32_t *uses0;          /* see the invariant above */
    int32_t *index_of;       /* plan index per graph node id (-1: not in the plan) */
    bool run_inline;         /* every node's value is static and at most WF__INLINE_NUMEL
                                elements: runs go node by node on the calling thread */
    bool transfers;          /* a node's op is WF_OP_TRANSFER: runs count in n_xfer_runs */
    int32_t *placeholders;   /* plan indices of placeholders */
    int n_placeholders;      /* entries of 'placeholders' */
    int32_t *prio_order;     /* plan indices by critical-path priority, highest first
                                (priority.c); NULL: plan order (WF_SESSION_NO_PRIORITY) */
    pthread_mutex_t mu;      /* guards 'free_slots', 'n_slots', 'all_slots' */
    pthread_cond_t cv;       /* signalled when a slot is returned */
    wf__slot *free_slots;    /* idle slots */
    int n_slots, max_slots;  /* made (or being made) so far; the most allowed */
    wf__slot **all_slots;    /* 'max_slots' entries: the slots made, NULL elsewhere */
    struct wf_session *sess; /* owner */
    wf_node **made;          /* 'n_made' nodes the passes made (passes.c), owned */
    int n_made;
    struct wf__rewrite *log; /* 'n_log' replacements, for wf_session_dump() */
    int n_log;
    wf_plan_stats stats;      /* what the passes did */
    struct wf__plan_dev *dev; /* pass_place.c: where nodes run when some run on a GPU;
                                 NULL: every node on the CPU (the usual case) */
    wf__memplan *mp;          /* static shapes: the memory plan, owned (NULL: none) */
    bool mp_dynamic;          /* placeholders with -1 dimensions: each slot plans at its run */
    int32_t *host_vars;       /* plan indices of the variables read on the host (all of them
                                 when 'dev' is NULL): made current there before a run */
    int n_host_vars;
    int32_t *order; /* 'n_order' (before, after) pairs of plan indices: orderings
                       that are neither input nor control edges (pass_place.c: a
                       fetched resident variable's copy after its updates) */
    int n_order;
};

/* A variable's value on a device (runtime/var_device.c), guarded by the session's
 * 'var_lock'. 'ver' counts the writes of the variable (assign, checkpoint load, host or
 * device update); 'host_ver' and 'dev_ver' say which write each copy holds, so the host
 * value is current when 'host_ver == ver' and the device value when 'dval' is set and
 * 'dev_ver == ver' (both: the two are equal). */
typedef struct wf__var_dev {
    struct wf_tensor *dval; /* the value on device 'dev', or NULL (never made) */
    int dev;                /* its device id (placement/place.c numbering) */
    int writing;            /* updates given 'dval' to write that have not yet handed their
                               kernel to the device (a copy back waits for them) */
    uint64_t ver, host_ver, dev_ver;
} wf__var_dev;

struct wf_session {
    wf_graph *g;
    wf_runtime *rt;
    int n_nodes;                     /* nodes of 'g' at creation: the ones this session runs */
    wf_pool *pool;                   /* intermediate values and outputs */
    int n_vars;                      /* variables of 'g' among the first 'n_nodes' */
    int32_t *var_of;                 /* variable index per node id (-1: not a variable) */
    wf_tensor **var_vals;            /* 'n_vars' current values, guarded by 'var_lock'; NULL:
                                        not made yet (a pipeline stage's, 'lazy_vars') */
    int32_t *var_node;               /* the node id of each variable index */
    bool lazy_vars;                  /* values are made from their wf_init when first needed
                                        (wf__session_var_need()), not at creation: a pipeline
                                        stage holds only the variables its plans read */
    pthread_rwlock_t var_lock;       /* readers: runs and wf_session_variable(); writer: assign,
                                        updates, and 'var_dev' changes */
    wf__var_dev *var_dev;            /* 'n_vars' device values and versions, under 'var_lock' */
    _Atomic int n_var_dev;           /* variables that have had a device value: 0 skips every
                                        check of the host values' currency */
    _Atomic uint64_t var_copies_in;  /* variable copies to a device value (host or peer) */
    _Atomic uint64_t var_copies_out; /* variable copies from a device value to the host */
    pthread_mutex_t dev_mu;          /* guards opening 'devtab''s devices */
    wf__device_table devtab;         /* the devices by placement's ids ('n' of them): each
                                        opened once, at the first plan that places a node
                                        there, shared by every plan, closed by
                                        wf_session_destroy() (runtime/var_device.c); the copy
                                        kernels' data (devices/copy.c) */
    pthread_mutex_t plans_mu;        /* guards 'plans' and 'errmsg' */
    wf__plan *plans;                 /* compiled plans, most recent first */
    int max_slots;                   /* per plan (wf_session_opts.n_run_slots) */
    _Atomic uint64_t n_runs;         /* runs started: each run's wf_kernel_ctx.step */
    _Atomic uint64_t n_xfer_runs;    /* of those, runs of plans that 'transfer' (.xfer_step) */
    uint32_t flags;                  /* wf_session_opts.flags: WF_SESSION_NO_* passes */
    int device;                      /* wf_session_opts.device (placement/place.c) */
    int n_sim;                       /* simulated devices (devices/sim.c) numbered after the
                                        runtime's devices, for placement: a Mirrored strategy's
                                        (wf_strategy_opts.simulated_devices, set at creation),
                                        or tests' (test_internal_*.c set it before the first
                                        run) */
    uint32_t sim_delay_us;           /* their wf__sim_opts (devices/device.h): delay, */
    int64_t sim_fail_alloc;          /* the allocation that fails, */
    int64_t sim_fail_notice;         /* the completion that faults */
    wf__kernels *kernels;            /* the kernels by (op, device kind) (core/op.h): the op
                                        defs' own, and what the layers below registered at
                                        creation; read-only once the session is made */
    int n_plans;                     /* plans compiled, guarded by 'plans_mu' */
    wf_plan_stats last_stats;        /* of the latest compiled plan, guarded by 'plans_mu' */
    char errmsg[WF_ERRMSG_MAX];      /* the latest failure */
    struct wf__dp *dp;               /* a strategy's rewrite (runtime/strategy.c), or NULL */
};

/* session.c: makes variable 'k''s value from its wf_init unless it has one (a 'lazy_vars'
 * session's, which has none until first needed; every other session's are made at
 * creation). Called before anything reads var_vals[k]: a plan that reads the variable (when
 * it is compiled), a read of the host value (wf__var_host_current()). Returns 0, or the
 * initialiser's error with a message naming the variable. Takes 'var_lock'. */
int wf__session_var_need(wf_session *s, int k);

/* session.c: the variables' fields of 'out' (n_variables, n_variables_held,
 * bytes_variables), read under 'var_lock'. */
void wf__session_var_stats(wf_session *s, wf_plan_stats *out);

/* strategy.c: sessions given a strategy (weft/distribute.h). */

/* Before the session exists: checks that every rank has the same graph and options (a
 * hash exchanged), then rewrites 'g' (placement/replicate.h); '*comm' (the session's
 * opts.comm: NULL or the strategy's) becomes the strategy's communicator, and for a
 * Mirrored strategy '*device' (opts.device) 0 becomes -1 (the host). Returns 0 with
 * '*out' (free with wf__dp_free()) or a negative status with the message set on 'g'. */
int wf__dp_prepare(wf_graph *g, const wf_strategy *st, wf_comm **comm, int *device,
                   struct wf__dp **out);

/* The simulated devices a Mirrored strategy's session opens (wf_session.n_sim), or 0. */
int wf__dp_sim_devices(const struct wf__dp *dp);

/* Whether 'dp' (may be NULL) is a pipeline's: its session's variables are made lazily. */
bool wf__dp_is_pipeline(const struct wf__dp *dp);

/* Once the session's variables exist: registers dp_reduce's kernel, broadcasts every
 * variable from rank 0 and checks them equal by a hash on every rank. Returns 0 or a
 * negative status with the message set. */
int wf__dp_start(wf_session *s);

/* The communicator of the session's strategy (NULL: none, or one process). */
wf_comm *wf__dp_comm(const struct wf__dp *dp);

/* Replaces fetches or targets 'in[0 .. n-1]' by the nodes that stand for them in the
 * rewritten graph, into 'out'; 'what' ("fetch", "target") names them in messages. Returns 0
 * or WF_EINVAL (a per-replica value) with the message set on 's'. */
int wf__dp_map(wf_session *s, wf_node *const *in, int n, wf_node **out, const char *what);

/* The most nodes wf__dp_extra_targets() can give (a pipeline rank's sends; 0 otherwise). */
int wf__dp_max_extra(const struct wf__dp *dp);

/* The nodes a run of the user's 'req' (fetches and targets) targets besides them: a pipeline
 * rank's sends that the run needs, into 'out' (room for wf__dp_max_extra()). Returns the
 * count, or a negative status with the session's message set. */
int wf__dp_extra_targets(wf_session *s, wf_node *const *req, int n_req, wf_node **out);

/* Adds a pipeline's schedule to plan 'p' of a strategy's session: each ordering of the
 * rewrite whose later end is in the plan, from its earlier end or, when the plan does not
 * run that, from its nearest ancestors that it runs. Returns 0 or WF_ENOMEM. */
int wf__dp_plan_order(wf__plan *p);

void wf__dp_free(struct wf__dp *dp);

/* A pipeline strategy's measurements for its planner (runtime/plan_measure.c). */
typedef struct wf__plan_measure wf__plan_measure;
struct wf__pipeline_opts;
struct wf_cost_table;

/* Returns 0 or WF_ENOMEM. Ownership: the caller frees '*out' (wf__plan_measure_free()). */
int wf__plan_measure_create(wf__plan_measure **out);
void wf__plan_measure_free(wf__plan_measure *pm);

/* Fills the planner's options 'po' of a session of 'g' (placement auto) with what is
 * measured: the links of 'comm' (every rank, probed once per 'pm') and, when po->costs is
 * NULL, the forward's op times profiled on every rank (the fastest rank's, in '*table', which the
 * caller destroys after the rewrite); 'note' gets the plan's line that says so. Every rank
 * calls it at the same point. Returns 0, or the probe's, the profile's or the exchange's
 * error (message set). */
int wf__plan_measure_run(wf__plan_measure *pm, wf_comm *comm, const wf_graph *g,
                         struct wf__pipeline_opts *po, struct wf_cost_table **table, char *note,
                         size_t size);

/* A strategy of 'comm' with options 'o' (checked by the caller) and 'servers' parameter
 * servers (0: MultiWorkerMirrored). Returns 0 or WF_ENOMEM. */
int wf__strategy_new(wf_comm *comm, const wf_strategy_opts *o, int servers, int staleness,
                     wf_strategy **out);
int wf__strategy_servers(const wf_strategy *st);

/* How a strategy's messages name its replicas: the default of 'shards', many, one. */
typedef struct wf__strategy_replicas {
    const char *deflt, *many, *one;
} wf__strategy_replicas;

/* Checks 'shards' (0 becomes 'n', the replicas) and 'aggregation' for 'fn': the shards a
 * multiple of n, each replica's shards a subtree of the fixed tree, at most 64 per replica.
 * Returns 0 or WF_EINVAL with the message naming the values. */
int wf__strategy_check(const char *fn, const wf__strategy_replicas *r, int n, int *shards,
                       int aggregation);

/* strategy_ps.c: the parameter-server rewrite of 'g' for this rank of 'comm'
 * (placement/ps.h), its message on wf_last_errmsg(); with staleness > 0 also the state of
 * the asynchronous mode into '*out' (wf__ps_free()), else NULL. */
struct wf__replica_map;
struct wf__ps_run;
int wf__ps_prepare(wf_graph *g, wf_comm *comm, const wf_strategy_opts *o, int servers,
                   int staleness, int edge_base, struct wf__replica_map *map,
                   struct wf__ps_run **out);
/* Registers a worker's ps_note kernel (records the servers' headers); 0 on a server. */
int wf__ps_start(wf_session *s, struct wf__ps_run *ps);
/* Whether this rank is an asynchronous server (its runs are wf__ps_serve()). */
bool wf__ps_serves(const struct wf__ps_run *ps);
/* An asynchronous server's run: the loop of strategy_ps.c, then the (mapped) fetches. */
int wf__ps_serve(wf_session *s, struct wf__ps_run *ps, wf_node *const *fetches, int n_fetches,
                 wf_tensor **outs, wf_node *const *targets, int n_targets);
void wf__ps_free(struct wf__ps_run *ps);
/* An asynchronous worker's plan with no send or recv (an evaluation: its dp_reduce sums its
 * own shards) is no transferring run: its servers count only the training runs' steps. */
void wf__ps_plan_local(const struct wf__ps_run *ps, wf__plan *p);
/* strategy.c: the asynchronous parameter servers' state of 'dp', or NULL. */
struct wf__ps_run *wf__dp_ps(const struct wf__dp *dp);
/* session.c: a run of the rewritten graph's own nodes, with no strategy's mapping. */
int wf__session_run_plain(wf_session *s, const wf_feed *feeds, int n_feeds, wf_node *const *fetches,
                          int n_fetches, wf_tensor **outs, wf_node *const *targets, int n_targets);

/* session.c */

/* Records a failure of a call on 's' as its message (wf_session_errmsg()) and this thread's
 * (wf_last_errmsg()); returns 'code'. */
int wf__session_fail(wf_session *s, int code, const char *fmt, ...) WF_PRINTF(3, 4);

/* Validates 'fetches' and 'targets' as wf_session_run() does ('fn' names the caller in
 * messages) and finds or compiles their plan. Returns 0 with '*out' (NULL when there is
 * nothing to run), or a negative status with the message set on 's'. */
int wf__session_plan(wf_session *s, const char *fn, wf_node *const *fetches, int n_fetches,
                     wf_node *const *targets, int n_targets, wf__plan **out);

/* plan.c */

/* Finds or compiles the plan for the set 'key' (sorted, distinct node ids of 's''s graph).
 * Returns 0 with the plan in '*out' or a negative wf_status with the reason in
 * wf_last_errmsg(). Threads: any (takes 'plans_mu'). */
int wf__plan_get(wf_session *s, const int32_t *key, int n_key, wf__plan **out);

/* Frees a plan and its slots; none may be running. */
void wf__plan_destroy(wf__plan *p);

/* exec.c */

/* Takes an idle slot of 'p' (making one, or waiting for one when all are busy).
 * Returns 0 or a negative wf_status with wf_last_errmsg() set. */
int wf__slot_take(wf__plan *p, wf__slot **out);

/* Returns a slot taken with wf__slot_take(); its value slots must all be NULL. */
void wf__slot_give(wf__slot *sl);

/* Frees a slot (plan destruction). */
void wf__slot_destroy(wf__slot *sl);

/* Runs the plan of 'sl' once; the placeholders' values are in 'sl->vals' and the uses are
 * set. Returns 0 or the first error, with the message in 'sl->errmsg'. Afterwards every
 * value that is still referenced by a use is left in 'sl->vals' for the caller to collect. */
int wf__slot_run(wf__slot *sl);

/* memplan.c */

/* Plans 'p' at compile time (after build()): a static plan gets 'p->mp' and its statistics,
 * a plan with -1 dimensions 'p->mp_dynamic'. Never fails: without memory, or for a plan too
 * big to analyse, outputs come from the pool. */
void wf__memplan_compile(wf__plan *p);

/* Makes the memory plan of 'p' for the dtypes and shapes 'dt[i]', 'sh[i]' of its nodes (a
 * -1 dimension: not planned); with 'may_add_edges' the plan may order nodes further
 * ('edges', before the slots' task graphs are made). Returns 0 with '*out' (NULL when
 * nothing can be planned) or WF_ENOMEM. */
int wf__memplan_make(const wf__plan *p, const wf_dtype *dt, const wf_shape *sh, bool may_add_edges,
                     wf__memplan **out);

void wf__memplan_free(wf__memplan *mp);

/* Checks 'mp' against 'p' independently of the planner (a depth-first reachability per
 * node): every two planned outputs whose bytes overlap are ordered by the plan's edges, or
 * the later one is an in-place output over the earlier. Returns 0 or WF_EINVAL with the
 * first violation in wf_last_errmsg(). For tests: O(n * (n + edges)). */
int wf__memplan_check(const wf__plan *p, const wf__memplan *mp);

/* Before a run of 'sl' (feeds set): makes the slot's arena on its first run, and for plans
 * with -1 dimensions plans again when the feed shapes changed. Without memory the run
 * uses the pool. */
void wf__memplan_slot_ready(wf__slot *sl);

/* Frees the slot's arena, its tensors and its own plan (slot destruction, re-planning). */
void wf__memplan_slot_release(wf__slot *sl);

/* The planned output of node 'i' (a new reference) if the slot has one of exactly 'dt' and
 * 'shape' that nobody else holds, else NULL. */
wf_tensor *wf__memplan_out(wf__slot *sl, int i, wf_dtype dt, wf_shape shape);

/* Whether 't' shares memory with an arena (a value that must not leave its run). */
bool wf__memplan_aliases(const wf_tensor *t);

/* Debug builds (no NDEBUG): fills the bytes of node 'i''s planned output with 0xff (NaN
 * for floats) when 't', its value, dies, unless a reader took them in place or something
 * still holds it, so that a plan that let two live outputs share bytes gives wrong results
 * instead of lucky ones. */
void wf__memplan_poison(const wf__slot *sl, int i, const wf_tensor *t);

/* priority.c */

/* Sets 'p->prio_order' (after build()): each node's priority is its cost (the op registry's
 * flops and bytes) plus the highest priority among its successors (data and control), so
 * the longest remaining path to a sink; exec.c adds each node's successor edges in this
 * order, so the worker that finishes a node keeps its most critical ready successor. Leaves
 * NULL (plan order) under WF_SESSION_NO_PRIORITY or without memory; never fails. */
void wf__plan_priority(wf__plan *p);

/* "<op> '<name>' (<file>:<line>)" of a node, into 'buf': core's wf__node_desc(), inline so
 * that no file of the run side calls into plan.c (the compile side) for it. */
static inline const char *wf__rt_node_desc(const wf_node *n, char *buf, size_t size)
{
    return wf__node_desc(n, buf, size);
}

/* exec.c, shared with exec_device.c: the steps of a node's task that do not depend on its
 * device. */

/* Records the first failure of the run (later ones are consequences or races) as
 * "<node>: <why>" and returns 'code' (WF_ETASK for an unknown or non-negative one) for the
 * task graph, which then skips the nodes that had not started. */
int wf__slot_fail(wf__slot *sl, const wf_node *n, int code, const char *why);

/* Infers the concrete dtype and shape of node 'n' from its input values 'in' (its
 * 'n_inputs' of them; 'dts' and 'shapes' are scratch of that length). Returns 0, or the
 * failure of wf__op_infer(), recorded in 'sl' with its message kept whole. */
int wf__slot_reinfer(wf__slot *sl, const wf_node *n, wf_tensor *const *in, wf_dtype *dts,
                     wf_shape *shapes, wf_dtype *dt, wf_shape *shape);

/* Records a failure whose message 'msg' is whole (it names the node already: wf__node_run(),
 * wf__op_infer()), as wf__slot_fail() does. */
int wf__slot_fail_msg(wf__slot *sl, int code, const char *msg);

/* pass_place.c and exec_device.c: nodes on GPUs (docs/architecture.md, "Devices"). */

/* Where a plan's nodes run, when some run on a GPU: placement/'s result (placement/
 * place.h: 'where' per plan node, the resident variables, the copies and their nodes, the
 * orderings), which the plan's arrays were made from (pass_place.c), and the session's
 * devices the plan uses. Every value lives where its node ran ('pl.where'). Read-only
 * after compile. */
typedef struct wf__plan_dev {
    int n_devices;           /* the runtime's devices (ids 0 .. n_devices-1), simulated ones
                                (wf_session.n_sim) included */
    struct wf_device **devs; /* per id: the session's device when a node runs there (not
                                owned: wf__session_device()), else NULL (also for the CPU,
                                whose kernels run directly) */
    wf__placement pl;        /* owned; its node list and edges moved to the plan */
} wf__plan_dev;

/* A slot's device state (exec_device.c). */
typedef struct wf__slot_dev {
    wf_tensor **dvals; /* per plan node on a GPU: its value there (a resident variable's: a
                          reference to the session's device value; a copy's: the copy),
                          or NULL */
} wf__slot_dev;

/* Places the nodes of 'p' (after build(), before the memory plan) with wf__place()
 * (placement/place.h: explicit placements checked, the rule, updates and resident
 * variables, a copy node for every value that crosses devices), takes its partitioned node
 * list into the plan, opens the session's devices used (once per session), resolves each
 * node's kernel and sets 'p->host_vars'. Leaves 'p->dev' NULL when every node runs
 * on the CPU. Returns 0 or a negative status naming the node and the device
 * (wf_last_errmsg()). */
int wf__plan_place(wf__plan *p);

/* wf__place_check() (placement/place.h) of 'node' against the devices and registry of
 * 's': the compile runs it on every node it needs before any pass may fold it away. */
int wf__place_check_node(wf_session *s, const wf_node *node);

/* Frees 'p->dev' (after the slots, whose values use its devices, which the session closes). */
void wf__plan_place_free(wf__plan *p);

/* Sets up and frees 'sl->dev' (slot_make(), wf__slot_destroy()). Returns 0 or WF_ENOMEM. */
int wf__slot_dev_init(wf__slot *sl);
void wf__slot_dev_free(wf__slot *sl);

/* Runs plan node 'i', placed on a GPU: its kernel for that device on the device's queue.
 * Returns 0 or the run's failure (recorded in 'sl'). */
int wf__exec_device_node(wf__slot *sl, int i);

/* Runs copy node 'i' (WF__PN_COPY): its kernel (devices/copy.c, from the session's registry)
 * from its input's device to its own. Returns 0, WF_KERNEL_PENDING (a copy to the host that
 * lands later: the device's notice finishes the node through wf__slot_node_complete()), or
 * the run's failure (recorded in 'sl'). A copy whose value nobody reads this run (a target's)
 * copies nothing. */
int wf__exec_copy_node(wf__slot *sl, int i);

/* The value of plan node 'j' this run: on its GPU, or on the host. */
static inline wf_tensor *wf__slot_value(const wf__slot *sl, int32_t j)
{
    return sl->dev && sl->plan->dev->pl.where[j] ? sl->dev->dvals[j] : sl->vals[j];
}

/* The last use of value 'j' is done: drops its value on a device. */
void wf__exec_device_drop(wf__slot *sl, int32_t j);

/* At the end of a run ('rc' its result so far): waits for the GPUs' work, reports a
 * device's late error, and drops the run's remaining device values. Returns the run's
 * result. */
int wf__exec_device_finish(wf__slot *sl, int rc);

/* A new device tensor of 'dt' and 'shape' on 'd' (exec_device.c). Returns NULL with
 * wf_last_errmsg(). */
wf_tensor *wf__device_tensor(struct wf_device *d, wf_dtype dt, wf_shape shape);

/* exec.c: how a node whose kernel pended (WF_KERNEL_PENDING) finishes: called once by the
 * kernel's completion ('token' is its &sl->args[i]; 'rc' < 0: it failed, recorded unless a
 * failure was already), it drops the node's input uses and finishes its task. */
void wf__slot_node_complete(void *token, int rc);

/* var_device.c: the session's devices and the variables resident on them. */

/* Device 'id' of 's' (one of 'n_dev'), opened on the first call, shared by every plan.
 * Returns 0 or the open's failure. Threads: any (takes 'dev_mu'). */
int wf__session_device(wf_session *s, int id, int n_dev, struct wf_device **out);

/* Releases the variables' device values and closes the session's devices (after its plans). */
void wf__session_devices_close(wf_session *s);

/* Makes the host value of variable 'k' current (copying the device value back and waiting
 * for it when the device holds the latest write); 'fn' names the caller in messages. With
 * 'out', returns a reference to the value (the current one; under concurrent device
 * updates, a copy of a recent one). Returns 0 or a negative status with the message (naming
 * the variable and the device) in wf_last_errmsg(). Threads: any thread that may wait for
 * a device (not a task on the only worker the device's actor could run on). */
int wf__var_host_current(wf_session *s, int k, const char *fn, wf_tensor **out);

/* The task of a variable node resident on a device: its current device value into
 * 'sl->dev->dvals[i]', copied in (from the host, or from another device) when the device
 * value is stale or was never made. Returns 0 or the run's failure (recorded in 'sl'; an
 * allocation failure names the variable and the device and leaves the host value as it
 * was). */
int wf__var_device_read(wf__slot *sl, int i);

/* For update node 'i' on a device: replaces in[0 .. n_assign-1] by the device values it
 * may write (each with a reference of the caller's), copying one that someone else holds,
 * as exec.c's take_writable() does on the host. Returns 0 or a negative status with the
 * reason in wf_last_errmsg() (wf__node_run() records it as the node's failure). */
int wf__var_device_writable(wf__slot *sl, int i, wf_tensor **in);

/* After update node 'i' has been given to its device ('ok': its kernel was): its
 * variables' device values hold the latest write (their host values become stale). Ends
 * what wf__var_device_writable() began, whether or not 'ok'. */
void wf__var_device_written(wf__slot *sl, int i, bool ok);

/* A host write of variable 'k' (assign, checkpoint load, a host update): the host value is
 * the current one. Under the write lock of 'var_lock'. */
static inline void wf__var_host_written(wf_session *s, int k)
{
    s->var_dev[k].host_ver = ++s->var_dev[k].ver;
}

/* Before a run of 'p': makes the host values of the variables it reads on the host current
 * (wf__var_host_current()). Returns 0 or a negative status with wf_last_errmsg() set. */
int wf__plan_vars_ready(wf__plan *p);

/* ---- Checkpoints (checkpoint.c, checkpointer.c) ---- */

#define WF__STR_(x) #x
#define WF__STR(x)  WF__STR_(x)
/* The version written into every checkpoint's metadata ("weft": "1.2.3"). */
#define WF__VERSION_STRING \
    WF__STR(WF_VERSION_MAJOR) "." WF__STR(WF_VERSION_MINOR) "." WF__STR(WF_VERSION_PATCH)

struct wf__st_header;

/* Every variable of 's' into 'ts[k]' (its node name, borrowed, and a reference to its host
 * value, copied back from a device first), all taken under one read lock of 'var_lock' so
 * that a load on another thread is wholly in or wholly out; 'fn' names the caller.
 * Returns 0 or a negative status with the message in wf_session_errmsg(s) and
 * wf_last_errmsg(); on failure no reference is taken. */
int wf__checkpoint_take(wf_session *s, const char *fn, wf_named_tensor *ts);

/* The step of a checkpointer's file: its "weft.step" metadata, 1 to 18 decimal digits
 * without a leading zero. 'what' names the file in messages.
 * Returns 0 or WF_EFORMAT (missing, empty or not such a number), with the message in
 * wf_last_errmsg(). */
int wf__checkpoint_step(const struct wf__st_header *h, const char *what, int64_t *step);

#endif /* WF_RUNTIME_INTERNAL_H */
