/* runtime/internal.h: what the files of runtime/ share and nobody else sees.
 * Owns: the run side's layouts: a session (struct wf_session), a run slot (wf__slot), a
 *   variable's device value, and the calls between the run side's files (session.c,
 *   plans.c, exec.c, exec_device.c, var_device.c, arena.c, the strategies, checkpoints).
 *   The compiled plan (wf__plan) is runtime/compile/plan.h's: this side includes it, never
 *   the other way round.
 * Invariants (stated here once; the plan's own are runtime/compile/plan.h's):
 *   - at the start of a run 'uses[i]' is the plan's 'uses0[i]' plus one per fetch of i, and
 *     the value of node i is released when 'uses[i]' reaches 0, so between runs every value
 *     slot is NULL;
 *   - a slot is either on its plan's free list or held by exactly one run;
 *   - the session's variable values are replaced, never written: a run retains the value
 *     it reads, under 'var_lock';
 *   - a variable's host value or its device value (wf__var_dev) is current, or both:
 *     'host_ver == ver' or ('dval' and 'dev_ver == ver'), under 'var_lock'
 *     (runtime/var_device.c).
 * Not here: the public contract (weft/runtime.h), compiling (runtime/compile/). */
#ifndef WF_RUNTIME_INTERNAL_H
#define WF_RUNTIME_INTERNAL_H

#include "../core/error.h"
#include "../core/graph.h"
#include "../core/op.h"
#include "../core/tensor.h"
#include "../devices/device.h"
#include "../memory/arena.h"
#include "../memory/plan.h"
#include "../placement/place.h"
#include "compile/plan.h"

#include <weft/memory.h>
#include <weft/runtime.h>
#include <weft/sched.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

/* Seconds of CLOCK_MONOTONIC (the profile run's and the planner's measurements). */
static inline double wf__rt_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

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
    /* The arena (runtime/arena.c, memory/arena.h), kept across runs; no block: outputs
     * come from the session's pool. */
    const wf__memplan *mp; /* the plan's 'mp', or 'own_mp' (plans with -1 dimensions) */
    wf__memplan *own_mp;   /* made for 'fed' (plans with -1 dimensions), owned */
    wf_shape *fed;         /* 'plan->n_placeholders' feed shapes 'own_mp' was made for */
    wf__arena arena;       /* its tensors over the session's pool, per plan node */
    int err;
    char errmsg[WF_ERRMSG_MAX];
} wf__slot;

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
int wf__dp_plan_order(wf_session *s, wf__plan *p);

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

/* plans.c: the session's cache of plans (the compile input made from the session, the
 * plan's run-side fields). */

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

/* arena.c: each slot's arena (the memory plan's offsets in one block of the pool). */

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

/* exec_device.c: nodes on GPUs (docs/architecture.md, "Devices"; where they run is the
 * plan's wf__plan_dev, runtime/compile/plan.h). */

/* A slot's device state (exec_device.c). */
typedef struct wf__slot_dev {
    wf_tensor **dvals; /* per plan node on a GPU: its value there (a resident variable's: a
                          reference to the session's device value; a copy's: the copy),
                          or NULL */
} wf__slot_dev;

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
