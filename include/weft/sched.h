/* weft/sched.h: the task runtime: workers, task groups, task graphs, parallel_for, actors,
 * counters and traces.
 * Owns: the public contract of sched/. Every graph node, device and network actor of weft
 * runs through these calls; they are also usable alone, as a task library.
 * Not here: tensors and graphs of ops (weft/core.h), devices, transport. */
#ifndef WEFT_SCHED_H
#define WEFT_SCHED_H

#include <weft/base.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- The runtime -------------------------------------------------------------------- */

typedef struct wf_runtime wf_runtime; /* opaque: owns the workers and everything they run */

#define WF_MAX_WORKERS 1024 /* more is refused with WF_EINVAL */

enum {
    WF_RT_NO_PIN = 1u << 0, /* do not bind workers to cores */
};

typedef struct wf_runtime_opts {
    int n_workers;        /* 0: one per core of the topology */
    uint32_t flags;       /* WF_RT_* bits */
    const char *topology; /* NULL: this machine (hwloc). Else an hwloc synthetic description,
                             e.g. "pack:2 numa:2 core:2 pu:1"; workers are then not pinned. */
    size_t trace_events;  /* 0: tracing off. Else each worker keeps its last 'trace_events'
                             events (task begin/end, steal, park, actor message); at most
                             2^26. */
    uint32_t spin_us;     /* 0: 50. How long an idle worker looks for work before it parks;
                             at most 1000000. */
    int local_rank;       /* This process's index among the 'local_size' processes of one
                             job on this machine (weft-run's WEFT_LOCAL_RANK), 0 to
                             local_size - 1. */
    int local_size;       /* 0 or 1: this process has the machine's cores to itself. Else the
                             cores are split into 'local_size' disjoint runs, one per local
                             rank (rank l: cores [l*C/L, (l+1)*C/L) of C), its workers are
                             pinned in its own run and n_workers 0 means one per core of it;
                             with more local ranks than cores, rank l's worker i is on core
                             (l + i) mod C, and n_workers 0 means 1. */
} wf_runtime_opts;

/* Creates a runtime: one worker thread per core (or 'n_workers'; per core of its local
 * rank's run when 'local_size' > 1), pinned with hwloc and
 * grouped by NUMA node, named "weft-w0", "weft-w1", ... Idle workers sleep; they burn no CPU.
 * Returns 0, WF_EINVAL (bad option: n_workers < 0 or above WF_MAX_WORKERS, trace_events or
 * spin_us above their limits, local_size < 0 or above 4096, local_rank outside
 * [0, local_size)), WF_ETOPO (the
 * topology string or the machine could not be read), WF_ENOMEM or WF_ESYS; the reason is in
 * wf_last_errmsg().
 * Ownership: on success the caller owns '*out' (free with wf_runtime_destroy()); on failure
 *   '*out' is NULL. 'opts' may be NULL (all defaults) and is not kept.
 * Threads: safe from any thread; runtimes are independent of each other. */
WF_API WF_NODISCARD int wf_runtime_create(wf_runtime **out, const wf_runtime_opts *opts);

/* Stops and joins the workers and frees the runtime. Every group, task graph run and actor
 * of this runtime must have been waited for or destroyed first. NULL is a no-op.
 * Threads: not from a worker of 'rt'. */
WF_API void wf_runtime_destroy(wf_runtime *rt);

/* Fills 'opts' from the environment, for tools, examples and tests (the library itself
 * reads no environment): WEFT_WORKERS (n_workers), WEFT_TOPOLOGY (topology), WEFT_NO_PIN=1,
 * WEFT_TRACE=FILE (sets trace_events to 1<<20 when it is 0, and '*trace_path' to FILE),
 * WEFT_LOCAL_RANK and WEFT_LOCAL_SIZE (local_rank, local_size; weft-run sets them).
 * Fields not named there are left as they are. 'trace_path' may be NULL.
 * Returns 0, or WF_EINVAL with a message for a malformed value (opts is then unchanged).
 * Ownership: '*trace_path' is borrowed from the environment. Threads: any. */
WF_API WF_NODISCARD int wf_runtime_opts_from_env(wf_runtime_opts *opts, const char **trace_path);

/* Returns the number of workers. Threads: any. */
WF_API int wf_runtime_worker_count(const wf_runtime *rt);

/* Returns the number of NUMA nodes the workers are spread over (at least 1). */
WF_API int wf_runtime_numa_count(const wf_runtime *rt);

/* Returns the index of the calling thread among the workers of 'rt', or -1 when the caller
 * is not one of them. Threads: any. */
WF_API int wf_runtime_current_worker(const wf_runtime *rt);

/* Returns the NUMA node index (0 .. wf_runtime_numa_count() - 1) of worker 'worker', or
 * WF_EINVAL for a NULL runtime or an index out of range. How memory/ binds a worker's
 * allocations to its node. Threads: any. */
WF_API int wf_runtime_worker_numa(const wf_runtime *rt, int worker);

struct hwloc_topology;

/* Returns the hwloc topology the runtime was built from (the machine's, or the synthetic
 * one of wf_runtime_opts.topology), for the modules that bind memory to NUMA nodes
 * (memory/), or NULL for a NULL runtime.
 * Ownership: borrowed; valid while 'rt' lives. Callers only read it (hwloc's binding calls
 * take it without changing it). Threads: any. */
WF_API struct hwloc_topology *wf_runtime_hwloc_topology(const wf_runtime *rt);

/* ---- Tasks and groups ---------------------------------------------------------------- */

/* A task body. Returns >= 0 on success, or a negative wf_status to fail the task: its
 * dependents are then canceled, and whoever waits gets this code with the task's name (and
 * the message given to wf_task_fail(), if it was used). A negative value that is not a
 * wf_status is reported as WF_ETASK, its value in the message. */
typedef int (*wf_task_fn)(void *arg);

/* A set of tasks that one caller waits for. Caller's storage: initialise with
 * wf_group_init(), release with wf_group_deinit(). Fields are private. */
typedef struct wf_group {
    uint64_t private_[8];
} wf_group;

/* Initialises 'g' on 'rt'. Returns 0 or WF_EINVAL (NULL argument).
 * Ownership: 'g' is the caller's; release with wf_group_deinit().
 * Threads: a group is waited for by one thread at a time. */
WF_API WF_NODISCARD int wf_group_init(wf_group *g, wf_runtime *rt);

/* Releases what a failed group holds (its message). NULL is a no-op. Only when no task of
 * the group is pending. */
WF_API void wf_group_deinit(wf_group *g);

/* Runs 'fn(arg)' as a task of 'g', on some worker, soon. 'name' (may be NULL) must stay
 * valid until the group is waited for; it names the task in errors, traces and probes.
 * From a worker the task goes to that worker's deque (others steal it); from any other
 * thread it goes to the inbox of a NUMA node. When the calling worker's deque already holds
 * 256 tasks, the task may instead run at once, inside this call (task throttling, as in
 * OpenMP runtimes): so a task must never wait for something its spawner does after
 * spawning it.
 * Returns 0, WF_EINVAL (NULL 'g' or 'fn'), or WF_ENOMEM.
 * Ownership: 'arg' is borrowed until the task runs.
 * Threads: from any thread, including tasks of 'g' (nested spawns). */
WF_API WF_NODISCARD int wf_spawn_named(wf_group *g, wf_task_fn fn, void *arg, const char *name);

/* wf_spawn_named() without a name. */
WF_API WF_NODISCARD int wf_spawn(wf_group *g, wf_task_fn fn, void *arg);

/* Waits until every task of 'g' has finished. A worker that waits runs other tasks
 * meanwhile; any other thread sleeps. Afterwards the group is empty and can be reused.
 * Returns 0, or the first error of a task of the group (its message is in
 * wf_group_errmsg()); tasks of the group that had not started soon after the first error
 * were canceled (not run): a worker notices the failure within a few dozen tasks.
 * Threads: one waiter at a time. */
WF_API WF_NODISCARD int wf_group_wait(wf_group *g);

/* Returns the message of the first failure of the group ("task 'load': file missing"), or
 * "" when none. Ownership: borrowed, valid until the next spawn or deinit of 'g'. */
WF_API const char *wf_group_errmsg(const wf_group *g);

/* From inside a task: records 'fmt' as the reason the current task fails and returns
 * 'code', so that a task body can end with 'return wf_task_fail(WF_EIO, "read %s", p);'.
 * Outside a task it only sets wf_last_errmsg(). */
WF_API int wf_task_fail(int code, const char *fmt, ...) WF_PRINTF(2, 3);

/* ---- Task graphs: built once, run many times ------------------------------------------ */

typedef struct wf_taskgraph wf_taskgraph; /* opaque */

/* Creates an empty task graph on 'rt'. Returns 0, WF_EINVAL or WF_ENOMEM.
 * Ownership: the caller owns '*out' (wf_taskgraph_destroy()). */
WF_API WF_NODISCARD int wf_taskgraph_create(wf_runtime *rt, wf_taskgraph **out);

/* Frees the graph; it must not be running. NULL is a no-op. */
WF_API void wf_taskgraph_destroy(wf_taskgraph *g);

/* Adds a node that runs 'fn(arg)'. 'name' (may be NULL) must outlive the graph.
 * Returns the node's id (>= 0, ids count up from 0), WF_EINVAL, WF_EBUSY (the graph is
 * running) or WF_ENOMEM; the message is in wf_taskgraph_errmsg(). */
WF_API WF_NODISCARD int wf_taskgraph_add(wf_taskgraph *g, wf_task_fn fn, void *arg,
                                         const char *name);

/* Names the kind of work node 'id' does (an op name such as "matmul"; NULL: none) for
 * traces: a traced run records it with the node's name, so tools can add up time per kind.
 * 'kind' must outlive the graph; traces copy at most 23 bytes of it.
 * Returns 0, WF_EINVAL (an unknown id), WF_EBUSY (the graph is running) or WF_ENOMEM. */
WF_API WF_NODISCARD int wf_taskgraph_set_kind(wf_taskgraph *g, int id, const char *kind);

/* Makes node 'after' run only once node 'before' has finished.
 * Returns 0, WF_EINVAL (an unknown id, before == after, or 'after' already has 2^30 - 1
 * predecessors), WF_EBUSY or WF_ENOMEM. A cycle is reported by the next run. */
WF_API WF_NODISCARD int wf_taskgraph_precede(wf_taskgraph *g, int before, int after);

/* Adds a node that runs 'fn(arg)' after each of the 'npred' nodes 'preds' (ids of nodes
 * already added; 'preds' may be NULL when 'npred' is 0): wf_taskgraph_add() and one
 * wf_taskgraph_precede() per predecessor in one call, which checks and grows the graph once
 * instead of once per edge. 'name' (may be NULL) must outlive the graph; 'preds' is not kept.
 * Returns the node's id (>= 0), WF_EINVAL (NULL fn, npred < 0, NULL preds with npred > 0,
 * an unknown predecessor), WF_EBUSY or WF_ENOMEM; on an error no node and no edge is added.
 * The message is in wf_taskgraph_errmsg(). */
WF_API WF_NODISCARD int wf_taskgraph_add_after(wf_taskgraph *g, wf_task_fn fn, void *arg,
                                               const char *name, const int *preds, int npred);

/* Adds 'n' nodes in one call, with their predecessors as compressed rows: node j of the
 * call (id first + j, 'first' being the node count before the call) runs
 * 'fn((char *)args + j * arg_stride)' ('arg_stride' 0: every node gets 'args') after the
 * nodes preds[pred_off[j]] .. preds[pred_off[j + 1] - 1], each an id below first + j (a node
 * added before, or an earlier node of this call), so the graph stays acyclic. 'pred_off' has
 * n + 1 non-decreasing entries, or is NULL: no node of the call has predecessors ('preds'
 * may then be NULL). This is the cheapest way to build a large graph: on an empty graph it
 * writes the run's successor arrays directly (two passes over 'preds'), where one
 * wf_taskgraph_add_after() per node keeps an edge list that the first run sorts.
 * 'name' (may be NULL) must outlive the graph; 'pred_off' and 'preds' are not kept.
 * Returns 'first' (>= 0), WF_EINVAL (NULL g or fn, n < 0, a decreasing 'pred_off', an
 * unknown, later or own predecessor, a row of 2^30 or more entries: the message names the
 * node and the entry), WF_EBUSY (the graph is running) or WF_ENOMEM; on an error no node and
 * no edge is added. The message is in wf_taskgraph_errmsg(). */
WF_API WF_NODISCARD int wf_taskgraph_add_nodes(wf_taskgraph *g, wf_task_fn fn, void *args,
                                               size_t arg_stride, const char *name, int n,
                                               const int64_t *pred_off, const int *preds);

/* Starts one run of every node of 'g' as tasks of group 'grp': each node runs once, after
 * all its predecessors. Wait with wf_group_wait(grp); a failing node cancels its
 * descendants and its error is the group's. The first run after a change checks the graph.
 * Returns 0, WF_EINVAL (a cycle: the message names a node on it), WF_EBUSY (the graph is
 * already running) or WF_ENOMEM.
 * Threads: one run of a graph at a time; the graph must not change while it runs. */
WF_API WF_NODISCARD int wf_taskgraph_submit(wf_taskgraph *g, wf_group *grp);

/* What a node's function returns when it has started work that finishes elsewhere (a
 * device, the network): the node is then finished only by wf_taskgraph_complete(), and its
 * successors wait until then. A positive value, so a plain task (wf_spawn) that returns it
 * has succeeded. */
#define WF_TASK_LATER 0x4c415445

/* Finishes node 'node' of the running graph 'g', whose function returns (or has returned)
 * WF_TASK_LATER in this run, with result 'rc': >= 0 releases its successors, a negative
 * wf_status fails the node as if its function had returned it. Call it exactly once per
 * such return, from any thread, even before the function has returned (whichever of the
 * two comes second finishes the node; successors go to the calling worker's deque, or to
 * an inbox from other threads).
 * Returns 0 or WF_EINVAL (NULL graph, an unknown id, a graph that is not running). */
WF_API WF_NODISCARD int wf_taskgraph_complete(wf_taskgraph *g, int node, int rc);

/* Runs the graph once and waits: wf_taskgraph_submit() plus wf_group_wait().
 * Returns 0 or the first error; the message is in wf_taskgraph_errmsg(). */
WF_API WF_NODISCARD int wf_taskgraph_run(wf_taskgraph *g);

/* Returns the number of nodes. */
WF_API int wf_taskgraph_node_count(const wf_taskgraph *g);

/* Returns the message of the last failed call or run on 'g', or "".
 * Ownership: borrowed, valid until the next call on 'g'. */
WF_API const char *wf_taskgraph_errmsg(const wf_taskgraph *g);

/* ---- Parallel loops --------------------------------------------------------------------- */

/* A loop body over [begin, end). Returns >= 0, or a negative wf_status to stop the loop. */
typedef int (*wf_range_fn)(void *ctx, int64_t begin, int64_t end);

/* Calls 'fn' over disjoint sub-ranges covering [begin, end), in parallel on the workers,
 * and waits. Ranges are split in halves while other workers are hungry (a split is only
 * made when the worker's deque is empty), never below 'grain' iterations (0: automatic).
 * A worker that calls it runs pieces itself; another thread sleeps until it is done.
 * Returns 0, WF_EINVAL (end < begin, negative grain, NULL fn) or the first error of 'fn'
 * (the message in wf_last_errmsg()).
 * Threads: any; may nest. */
WF_API WF_NODISCARD int wf_parallel_for(wf_runtime *rt, int64_t begin, int64_t end, int64_t grain,
                                        wf_range_fn fn, void *ctx);

/* ---- Actors --------------------------------------------------------------------------- */

/* Embed a wf_msg in your message struct and send a pointer to it; recover the struct with
 * offsetof. The field is private to weft while the message is in a mailbox. */
typedef struct wf_msg {
    struct wf_msg *next_;
} wf_msg;

typedef struct wf_actor wf_actor; /* opaque */

/* A message handler. 'msg' is NULL for a wake-up from wf_actor_poke(). Returns >= 0, or a
 * negative wf_status, which the actor records (wf_actor_status()) before going on. */
typedef int (*wf_actor_fn)(wf_actor *a, wf_msg *msg, void *ctx);

enum {
    WF_BIND_ANY = 0,    /* any worker may run the handler */
    WF_BIND_WORKER = 1, /* only worker 'bind_index' */
    WF_BIND_NUMA = 2,   /* only workers of NUMA node 'bind_index' (first steals its inbox) */
};

typedef struct wf_actor_opts {
    wf_actor_fn handler; /* required */
    void *ctx;           /* passed to the handler */
    const char *name;    /* NULL: "actor"; copied */
    int bind;            /* WF_BIND_* */
    int bind_index;      /* worker or NUMA node index, with bind */
    uint32_t batch;      /* 0: 64. Messages handled per turn before the actor yields. */
} wf_actor_opts;

/* Creates an actor: a mailbox plus a handler. At most one call of the handler runs at a
 * time; messages from one sender are handled in the order sent. The actor becomes a task
 * when its mailbox goes from empty to non-empty.
 * Returns 0, WF_EINVAL (no handler, bad bind index) or WF_ENOMEM.
 * Ownership: the caller owns '*out' (wf_actor_destroy()); 'opts' is not kept. */
WF_API WF_NODISCARD int wf_actor_create(wf_runtime *rt, const wf_actor_opts *opts, wf_actor **out);

/* Puts 'msg' in the mailbox. Never blocks, never allocates.
 * Returns 0 or WF_EINVAL (NULL argument).
 * Ownership: 'msg' is borrowed until the handler receives it; then it is the handler's.
 * Threads: any thread, including handlers of this and other actors. */
WF_API WF_NODISCARD int wf_actor_send(wf_actor *a, wf_msg *msg);

/* Asks for one call of the handler with msg == NULL (pokes made before that call starts
 * are merged into it): how something outside (a CUDA callback, an fd) says "look again".
 * Returns 0 or WF_EINVAL. Threads: any; async-signal-unsafe. */
WF_API WF_NODISCARD int wf_actor_poke(wf_actor *a);

/* Returns 0, or the first negative code a handler of 'a' returned. The message is in
 * wf_actor_errmsg(). */
WF_API int wf_actor_status(const wf_actor *a);

/* Returns the message recorded with the first failure of a handler, or "". */
WF_API const char *wf_actor_errmsg(const wf_actor *a);

enum {
    WF_FD_READ = 1u << 0,  /* readable (or closed by the peer) */
    WF_FD_WRITE = 1u << 1, /* writable */
};

/* Watches 'fd' for 'events' (WF_FD_* bits) on behalf of 'a': when the fd is ready, the actor
 * is poked once (its handler runs with msg == NULL) and the watch pauses; call this again
 * from the handler to watch again (one-shot, so a handler that leaves data unread is not
 * called in a loop). How an actor waits for a socket, an eventfd or a UCX worker without
 * blocking a worker: one thread of the runtime ("weft-poll", started at the first watch)
 * sleeps in epoll_wait and does nothing else.
 * Returns 0, WF_EINVAL (NULL actor, fd < 0, no event bit) or WF_ESYS (epoll refused the fd;
 * the message says why).
 * Threads: any. Unwatch before destroying the actor or closing the fd. */
WF_API WF_NODISCARD int wf_actor_watch_fd(wf_actor *a, int fd, uint32_t events);

/* Stops watching 'fd' for 'a'. After it returns, no poke from this watch happens.
 * Returns 0 (also when the fd was not watched) or WF_EINVAL. */
WF_API WF_NODISCARD int wf_actor_unwatch_fd(wf_actor *a, int fd);

/* Waits until the mailbox is empty and no handler runs, then frees the actor. No send may
 * race with it. NULL is a no-op. Threads: not from the actor's own handler. */
WF_API void wf_actor_destroy(wf_actor *a);

/* ---- Counters and traces -------------------------------------------------------------- */

typedef struct wf_worker_stats {
    uint64_t tasks_run;         /* tasks, graph nodes and actor turns run */
    uint64_t spawned;           /* tasks pushed on this worker's deque */
    uint64_t steals_tried;      /* steal attempts on a victim's deque */
    uint64_t steals_won;        /* of which took a task */
    uint64_t steals_won_local;  /* ... from a victim in the same NUMA node */
    uint64_t steals_won_remote; /* ... from a victim in another NUMA node */
    uint64_t inbox_taken;       /* tasks taken from an inbox (submitted from outside) */
    uint64_t parks;             /* times the worker went to sleep */
    uint64_t idle_ns;           /* time spent asleep, a sleep going on included */
    uint64_t actor_msgs;        /* actor messages handled */
    int numa;                   /* the worker's NUMA node index */
    int cpu;                    /* OS index of the PU it is pinned to, or -1 */
} wf_worker_stats;

/* Copies the counters of the first min(n, workers) workers to 'out', counted since creation
 * or since wf_runtime_stats_reset(). Counters are read while workers run: each is exact,
 * but they are not a snapshot of one instant.
 * Returns the number of workers, or WF_EINVAL. Threads: any. */
WF_API WF_NODISCARD int wf_runtime_stats(const wf_runtime *rt, wf_worker_stats *out, int n);

/* Starts the counters again from zero. Threads: any. */
WF_API void wf_runtime_stats_reset(wf_runtime *rt);

/* Writes the events kept in the trace rings as Chrome trace JSON (open it in
 * ui.perfetto.dev or chrome://tracing), then empties the rings. Safe while workers run;
 * tasks still running then are simply not in the file yet.
 * Returns the number of events written, WF_EINVAL (tracing is off, or NULL path) or WF_EIO
 * (with the path and errno's text in wf_last_errmsg()). */
WF_API WF_NODISCARD int wf_runtime_trace_write(wf_runtime *rt, const char *path);

#ifdef __cplusplus
}
#endif
#endif /* WEFT_SCHED_H */
