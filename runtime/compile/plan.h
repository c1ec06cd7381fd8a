/* runtime/compile/plan.h: a compiled plan as a value, and what a compile takes.
 * Owns: the compile's input (wf__compile_in: the graph, the session's options and kernel
 *   registry, the devices' counts, and the few things the run side does for a compile,
 *   handed in as hooks), the layout of a compiled plan (struct wf__plan) and of its memory
 *   plan (wf__memplan) and device placement (wf__plan_dev), the plan node kinds, and the
 *   calls into runtime/compile/ from the run side (runtime/plans.c, exec.c, ...).
 * Direction: the run side (runtime/ outside compile/) includes this header; nothing in compile/
 *   includes a run-side header (runtime/internal.h), so the compile sees no session, slot or
 *   variable value: what it needs of them comes through wf__compile_in
 *   (scripts/check-layers.sh enforces it).
 * Invariants (stated here once):
 *   - a plan's nodes are what its key (the fetches and targets) needs after the compile
 *     passes (runtime/compile/passes.h): graph nodes, nodes the passes made, which the plan
 *     owns ('made'), and the copy nodes placement inserted ('dev->copy_nodes'), in a
 *     topological order (ascending id when no pass made a node and nothing crosses
 *     devices);
 *     plan index i runs task i of every slot's task graph; 'index_of' maps every graph
 *     node to the plan node whose value a run hands out for it (itself, its replacement,
 *     or for a fetched node on a GPU its copy to the host);
 *   - 'uses0[i]' is the number of input edges of plan nodes that read node i (a run starts
 *     its own counters from it, runtime/internal.h);
 *   - everything a compile sets is read-only once wf__plan_compile() returns; the fields
 *     under "the run side's" are never read or written by runtime/compile/ (the compile
 *     leaves them zero, runtime/plans.c sets them when it keeps the plan).
 * Not here: running a plan, sessions, slots (runtime/internal.h), the passes' context
 *   (runtime/compile/passes.h), the public contract (weft/runtime.h). */
#ifndef WF_RUNTIME_COMPILE_PLAN_H
#define WF_RUNTIME_COMPILE_PLAN_H

#include "../../core/error.h"
#include "../../core/graph.h"
#include "../../core/op.h"
#include "../../core/tensor.h"
#include "../../memory/plan.h"
#include "../../placement/place.h"

#include <weft/runtime.h>

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct wf__plan wf__plan;
struct wf_device;
struct wf_session;
struct wf__slot;

/* What one compile reads (runtime/plans.c makes it from a session). Everything is borrowed
 * for the compile's duration; the hooks are the run side's ('ctx' is passed back). */
typedef struct wf__compile_in {
    wf_graph *g;                /* the graph */
    int n_nodes;                /* its nodes the session runs (ids 0 .. n_nodes-1) */
    const int32_t *var_of;      /* variable index per node id (-1: not a variable) */
    uint32_t flags;             /* wf_session_opts.flags: WF_SESSION_NO_* passes, precision */
    int device;                 /* wf_session_opts.device (placement/place.c) */
    int n_sim;                  /* simulated devices, numbered after the runtime's */
    wf_runtime *rt;             /* the workers (folding runs CPU kernels) and devices */
    const wf__kernels *kernels; /* the kernels by (op, device kind), read-only */
    bool local_reduce;          /* a pipeline stage's: its dp_reduce has no peer
                                   (priority.c) */
    void *ctx;                  /* the run side's, handed to the hooks */
    /* Makes variable 'k''s value if it has none yet (a pipeline stage's, made lazily).
     * Returns 0 or a negative status with wf_last_errmsg() set. */
    int (*var_need)(void *ctx, int k);
    /* Device 'id' (one of 'n_dev'), opened on the first call and kept by the run side.
     * Returns 0 or the open's failure. */
    int (*open_device)(void *ctx, int id, int n_dev, struct wf_device **out);
    /* NULL, or adds orderings to the built plan (a pipeline's schedule: runtime/strategy.c).
     * Returns 0 or WF_ENOMEM. */
    int (*add_order)(void *ctx, wf__plan *p);
} wf__compile_in;

/* A static memory plan (runtime/compile/memplan.c): where each planned output of a plan
 * lives in a run slot's arena (memory/plan.h's plan, 'm': offsets, in-place marks, the
 * arena's size, ordering edges), with the dtype and shape of each planned output. Made once
 * per static plan at compile time, or per slot for the feed shapes of its latest run when
 * placeholders have -1 dimensions. Read-only once made. */
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

/* The largest value (in elements) of a plan that runs inline: with every value this small,
 * a node costs less than a task round trip, so handing a chain of them between workers only
 * adds latency. Measured on a 10^5-node chain of f32 scalar adds (2 workers, same session,
 * best of 15): ~155 ns per node through the task graph, ~135 ns inline, ~75 ns inline with
 * dead values reused as outputs (exec.c: spare_put). */
#define WF__INLINE_NUMEL 256

/* Where a plan's nodes run, when some run on a GPU: placement/'s result (placement/
 * place.h: 'where' per plan node, the resident variables, the copies and their nodes, the
 * orderings), which the plan's arrays were made from (pass_place.c), and the devices the
 * plan uses. Every value lives where its node ran ('pl.where'). Read-only after compile. */
typedef struct wf__plan_dev {
    int n_devices;           /* the runtime's devices (ids 0 .. n_devices-1), simulated ones
                                (wf__compile_in.n_sim) included */
    struct wf_device **devs; /* per id: the device when a node runs there (not owned: the
                                compile input's open_device()), else NULL (also for the CPU,
                                whose kernels run directly) */
    wf__placement pl;        /* owned; its node list and edges moved to the plan */
} wf__plan_dev;

struct wf__plan {
    int32_t *key;          /* sorted, distinct ids of fetches and targets */
    int n_key;             /* entries of 'key' */
    int n_graph;           /* the graph's nodes compiled (wf__compile_in.n_nodes): entries
                              of 'index_of' */
    int n;                 /* plan nodes */
    wf_node **nodes;       /* 'n', in a topological order (see above) */
    uint8_t *kind;         /* WF__PN_* per plan node */
    wf_kernel_fn *kernel;  /* per plan node: the kernel it runs (kernel nodes; NULL for the
                              others), the registered one for the kind of its device
                              (pass_place.c: resolve_kernels()) */
    void **kdata;          /* per plan node: the data registered with that kernel (its
                              wf_kernel_ctx.data), or NULL */
    uint8_t *reinfer;      /* 1: the shape depends on fed sizes: infer at kernel time */
    int32_t *var;          /* variable index per plan node (-1: not a variable) */
    int32_t *in_off;       /* CSR of input plan indices: node i reads in_idx[in_off[i] ..
                              in_off[i + 1]) */
    int32_t *in_idx;       /* one per input edge */
    int32_t *uses0;        /* see the invariant above */
    int32_t *index_of;     /* plan index per graph node id (-1: not in the plan) */
    bool run_inline;       /* every node's value is static and at most WF__INLINE_NUMEL
                              elements: runs go node by node on the calling thread */
    bool transfers;        /* a node's op is WF_OP_TRANSFER: runs count in n_xfer_runs */
    int32_t *placeholders; /* plan indices of placeholders */
    int n_placeholders;    /* entries of 'placeholders' */
    int32_t *prio_order;   /* plan indices by critical-path priority, highest first
                              (priority.c); NULL: plan order (WF_SESSION_NO_PRIORITY) */
    wf_node **made;        /* 'n_made' nodes the passes made (passes.c), owned */
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

    /* The run side's (runtime/plans.c, exec.c): zero from the compile, set when the
     * session keeps the plan. */
    wf__plan *next;              /* the session's list of plans */
    struct wf_session *sess;     /* owner */
    pthread_mutex_t mu;          /* guards 'free_slots', 'n_slots', 'all_slots' */
    pthread_cond_t cv;           /* signalled when a slot is returned */
    struct wf__slot *free_slots; /* idle slots */
    int n_slots, max_slots;      /* made (or being made) so far; the most allowed */
    struct wf__slot **all_slots; /* 'max_slots' entries: the slots made, NULL elsewhere */
};

/* "<op> '<name>' (<file>:<line>)" of a node, into 'buf': core's wf__node_desc(), for both
 * sides' messages. */
static inline const char *wf__rt_node_desc(const wf_node *n, char *buf, size_t size)
{
    return wf__node_desc(n, buf, size);
}

/* plan.c */

/* Compiles the set 'key' (sorted, distinct node ids of in->g) into a new plan: the passes,
 * the order, the input CSR arrays and consumer counts, placement, the priorities and the
 * memory plan. Returns 0 with '*out' (free with wf__plan_free()) or a negative wf_status
 * with the reason in wf_last_errmsg(). Threads: any; 'in' is only read. */
int wf__plan_compile(const wf__compile_in *in, const int32_t *key, int n_key, wf__plan **out);

/* Frees what a compile made of 'p' (its run side's state must be gone already). */
void wf__plan_free(wf__plan *p);

/* memplan.c */

/* Plans 'p' at compile time (after build()): a static plan gets 'p->mp' and its statistics,
 * a plan with -1 dimensions 'p->mp_dynamic'. Nothing under WF_SESSION_NO_MEMPLAN in
 * 'flags'. Never fails: without memory, or for a plan too big to analyse, outputs come from
 * the pool. */
void wf__memplan_compile(wf__plan *p, uint32_t flags);

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

/* priority.c */

/* Sets 'p->prio_order' (after build()): each node's priority is its cost (the op registry's
 * flops and bytes) plus the highest priority among its successors (data and control), so
 * the longest remaining path to a sink; exec.c adds each node's successor edges in this
 * order, so the worker that finishes a node keeps its most critical ready successor. Leaves
 * NULL (plan order) under WF_SESSION_NO_PRIORITY in 'in->flags' or without memory; never
 * fails. */
void wf__plan_priority(wf__plan *p, const wf__compile_in *in);

/* pass_place.c */

/* Places the nodes of 'p' (after build(), before the memory plan) with wf__place()
 * (placement/place.h: explicit placements checked, the rule, updates and resident
 * variables, a copy node for every value that crosses devices), takes its partitioned node
 * list into the plan, opens the devices used (in->open_device()), resolves each node's
 * kernel and sets 'p->host_vars'. Leaves 'p->dev' NULL when every node runs on the CPU.
 * Returns 0 or a negative status naming the node and the device (wf_last_errmsg()). */
int wf__plan_place(wf__plan *p, const wf__compile_in *in);

/* wf__place_check() (placement/place.h) of 'node' against the devices and registry of
 * 'in': the compile runs it on every node it needs before any pass may fold it away. */
int wf__place_check_node(const wf__compile_in *in, const wf_node *node);

/* Frees 'p->dev' (after the slots, whose values use its devices, which the run side
 * closes). */
void wf__plan_place_free(wf__plan *p);

#endif /* WF_RUNTIME_COMPILE_PLAN_H */
