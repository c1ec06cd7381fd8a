/* weft/runtime.h: sessions: compiling a static graph into an executable plan and running it.
 * Owns: the public contract of runtime/: wf_session (create, run, destroy), feeds, and the
 * variable values a session owns (read and assign).
 * Not here: building graphs (weft/core.h), ops (weft/ops.h), the scheduler (weft/sched.h). */
#ifndef WEFT_RUNTIME_H
#define WEFT_RUNTIME_H

#include <weft/base.h>
#include <weft/core.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct wf_session wf_session; /* opaque: layout private to runtime/ */

/* A value for a placeholder in one run. */
typedef struct wf_feed {
    wf_node *node;    /* a placeholder of the session's graph */
    wf_tensor *value; /* its dtype; its shape matches the placeholder's (-1: any size) */
} wf_feed;

typedef struct wf_session_opts {
    int n_run_slots; /* 0: 4. How many runs of one set of fetches and targets may execute at
                        the same time; a further concurrent run waits for a free slot. Each
                        slot holds a task graph and the value slots of one run; slots are
                        made on first use. At most 1024. */
    uint32_t flags;  /* none yet: must be 0 */
} wf_session_opts;

/* Creates a session over the nodes 'g' has now (nodes added later cannot be run by it):
 * every variable of the graph gets a value owned by the session, made from its wf_init
 * (wf_init_tensor()). Plans are compiled per set of fetches and targets at their first run
 * (pruned to what they need, in topological order) and replayed afterwards.
 * Returns 0, WF_EINVAL (NULL argument, bad option, or the graph holds an error: its first
 * error is kept) or WF_ENOMEM; the reason is in wf_graph_errmsg(g) (and wf_last_errmsg()).
 * Ownership: on success the caller owns '*out' (wf_session_destroy()); on failure '*out' is
 *   NULL. 'g' is borrowed and must outlive the session; 'opts' may be NULL and is not kept.
 * Threads: not while another thread adds nodes to 'g'. */
WF_API WF_NODISCARD int wf_session_create(wf_graph *g, const wf_session_opts *opts,
                                          wf_session **out);

/* Runs the graph once: computes 'fetches[0 .. n_fetches-1]' into 'outs' and runs
 * 'targets[0 .. n_targets-1]' (for their effects) and everything they need, with 'feeds'
 * giving the placeholders' values. Only the needed nodes run; independent nodes run in
 * parallel on the runtime's workers. A placeholder that is needed must be fed; feeds of
 * placeholders that are not needed are checked and ignored.
 * Returns 0, WF_EINVAL (NULL argument, a feed or fetch of another graph or created after the
 * session, a fed node that is not a placeholder, a placeholder fed twice or not fed, an op
 * without a CPU kernel), WF_EDTYPE or WF_ESHAPE (a feed that does not match its placeholder,
 * or shapes that do not fit once placeholders' -1 dimensions are known), WF_ENOMEM, or the
 * error of a failing kernel, which cancels the rest of the run. The message, naming the node,
 * its op and where it was created, is in wf_session_errmsg(s) and wf_last_errmsg().
 * A failed run leaves the session usable and 'outs' all NULL.
 * Ownership: on success the caller owns each 'outs[i]' (wf_tensor_release()); the same node
 *   fetched twice gives two references to one tensor. 'feeds' values are retained during the
 *   run only. Arrays may be NULL when their count is 0.
 * Threads: any number of threads may run one session at once (see n_run_slots), from
 *   outside the runtime's workers or from its tasks (a task that waits for a run helps run
 *   other tasks; one that waits for a free run slot blocks its worker). */
WF_API WF_NODISCARD int wf_session_run(wf_session *s, const wf_feed *feeds, int n_feeds,
                                       wf_node *const *fetches, int n_fetches, wf_tensor **outs,
                                       wf_node *const *targets, int n_targets);

/* Returns the message of the latest failed run or call on 's' (of any thread: with runs on
 * several threads, wf_last_errmsg() right after the call is this thread's own), or "".
 * Ownership: borrowed, valid until the next call on 's'. */
WF_API const char *wf_session_errmsg(const wf_session *s);

/* Returns the current value of variable 'var' in '*out'.
 * Returns 0 or WF_EINVAL (NULL argument, not a variable of the session's graph), with the
 * message in wf_session_errmsg(s).
 * Ownership: '*out' is owned by the caller (a reference to the immutable current value; a
 *   later assign makes a new value and does not change it). Threads: any. */
WF_API WF_NODISCARD int wf_session_variable(wf_session *s, wf_node *var, wf_tensor **out);

/* Sets variable 'var' to a copy of 'value'; runs that start afterwards read it.
 * Returns 0, WF_EINVAL (NULL argument, not a variable of the session's graph), WF_EDTYPE or
 * WF_ESHAPE (not the variable's dtype or shape) or WF_ENOMEM, with the message in
 * wf_session_errmsg(s).
 * Ownership: 'value' is copied (not kept). Threads: any; a run in flight reads either the
 *   old or the new value. */
WF_API WF_NODISCARD int wf_session_assign(wf_session *s, wf_node *var, wf_tensor *value);

/* Frees the session, its plans and its variable values. No run may be in flight.
 * Tensors returned by runs stay valid. NULL is a no-op. */
WF_API void wf_session_destroy(wf_session *s);

#ifdef __cplusplus
}
#endif
#endif /* WEFT_RUNTIME_H */
