/* runtime/internal.h: what the files of runtime/ share and nobody else sees.
 * Owns: the layout of a session (struct wf_session), of a compiled plan (wf__plan) and of a
 *   run slot (wf__slot), and the calls between session.c, plan.c and exec.c.
 * Invariants (stated here once):
 *   - a plan's nodes are what its key (the fetches and targets) needs after the compile
 *     passes (runtime/passes.h): graph nodes and nodes the passes made, which the plan
 *     owns ('made'), in a topological order (ascending id when no pass made a node);
 *     plan index i runs task i of every slot's task graph; 'index_of' maps every graph
 *     node to the plan node that computes its value (itself, or its replacement);
 *   - 'uses0[i]' is the number of input edges of plan nodes that read node i; at the start
 *     of a run 'uses[i]' is 'uses0[i]' plus one per fetch of i, and the value of node i is
 *     released when 'uses[i]' reaches 0, so between runs every value slot is NULL;
 *   - a slot is either on its plan's free list or held by exactly one run;
 *   - the session's variable values are replaced, never written: a run retains the value
 *     it reads, under 'var_lock'.
 * Not here: the public contract (weft/runtime.h). */
#ifndef WF_RUNTIME_INTERNAL_H
#define WF_RUNTIME_INTERNAL_H

#include "../core/error.h"
#include "../core/graph.h"
#include "../core/op.h"
#include "../core/tensor.h"

#include <weft/memory.h>
#include <weft/runtime.h>
#include <weft/sched.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct wf__plan wf__plan;

enum {
    WF__PN_KERNEL = 0,  /* runs the op's CPU kernel */
    WF__PN_PLACEHOLDER, /* its value is the feed, set before the run starts */
    WF__PN_CONSTANT,    /* its value is the node's tensor */
    WF__PN_VARIABLE,    /* its value is the session's current value of the variable */
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
    uint8_t *reinfer;        /* 1: the shape depends on fed sizes: infer at kernel time */
    int32_t *var;            /* variable index per plan node (-1: not a variable) */
    int32_t *in_off;         /* CSR of input plan indices: node i reads in_idx[in_off[i] ..
                                in_off[i + 1]) */
    int32_t *in_idx;         /* one per input edge */
    int32_t *uses0;          /* see the invariant above */
    int32_t *index_of;       /* plan index per graph node id (-1: not in the plan) */
    bool run_inline;         /* every node's value is static and at most WF__INLINE_NUMEL
                                elements: runs go node by node on the calling thread */
    int32_t *placeholders;   /* plan indices of placeholders */
    int n_placeholders;      /* entries of 'placeholders' */
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
    wf_plan_stats stats; /* what the passes did */
};

struct wf_session {
    wf_graph *g;
    wf_runtime *rt;
    int n_nodes;                /* nodes of 'g' at creation: the ones this session runs */
    wf_pool *pool;              /* intermediate values and outputs */
    int n_vars;                 /* variables of 'g' among the first 'n_nodes' */
    int32_t *var_of;            /* variable index per node id (-1: not a variable) */
    wf_tensor **var_vals;       /* 'n_vars' current values, guarded by 'var_lock' */
    pthread_rwlock_t var_lock;  /* readers: runs and wf_session_variable(); writer: assign */
    pthread_mutex_t plans_mu;   /* guards 'plans' and 'errmsg' */
    wf__plan *plans;            /* compiled plans, most recent first */
    int max_slots;              /* per plan (wf_session_opts.n_run_slots) */
    _Atomic uint64_t n_runs;    /* runs started: each run's wf_kernel_ctx.step */
    uint32_t flags;             /* wf_session_opts.flags: WF_SESSION_NO_* passes */
    int n_plans;                /* plans compiled, guarded by 'plans_mu' */
    wf_plan_stats last_stats;   /* of the latest compiled plan, guarded by 'plans_mu' */
    char errmsg[WF_ERRMSG_MAX]; /* the latest failure */
};

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

/* "<op> '<name>' (<file>:<line>)" of a node, into 'buf'. */
const char *wf__rt_node_desc(const wf_node *n, char *buf, size_t size);

#endif /* WF_RUNTIME_INTERNAL_H */
