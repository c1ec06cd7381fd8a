/* weft/runtime.h: sessions: compiling a static graph into an executable plan and running it.
 * Owns: the public contract of runtime/: wf_session (create, run, destroy), feeds, the
 * variable values a session owns (read and assign), the compile passes' switches, graph and
 * plan dumps, compile statistics, and checkpoints.
 * Not here: building graphs (weft/core.h), ops (weft/ops.h), the scheduler (weft/sched.h). */
#ifndef WEFT_RUNTIME_H
#define WEFT_RUNTIME_H

#include <weft/base.h>
#include <weft/core.h>
#include <weft/distribute.h>
#include <weft/placement.h>
#include <weft/transport.h>

#include <stdio.h>

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
    uint32_t flags;  /* WF_SESSION_* bits (0: every compile pass on) */
    int device;      /* placement of nodes not placed with wf_node_set_device() (runtime/
                        pass_place.c): 0: the rule: a node goes where its inputs are, and a
                        node whose op has a kernel for a GPU goes on the GPU (the first one)
                        unless the plan is small enough to run inline or the node updates
                        variables, allocates its own output or computes in f64 (those stay
                        on the CPU);
                        -1: every such node on the CPU; D >= 1: on device D where its op has
                        a kernel for it, else on the CPU. Without a GPU every value is the
                        CPU. Edges between devices get copies. */
    wf_comm *comm;   /* NULL: none. The communicator the graph's send and recv nodes
                        (wf_send, wf_recv) use: the transport registers their kernels for
                        this session. Borrowed: it must outlive the session. */
    const wf_strategy *strategy; /* NULL: none. A distribution strategy (weft/distribute.h):
                        the graph, written for one replica, is rewritten at creation and
                        trained data-parallel over the strategy's communicator (which also
                        serves send and recv; 'comm', when set, must be the same). Creation
                        is then a collective call of every rank. Borrowed: it must outlive
                        the session. */
} wf_session_opts;

/* Flags of wf_session_opts: each switches one compile pass off. The passes run in this
 * order on the nodes a set of fetches and targets needs (pruning always runs first); none
 * changes a result bit (they do not reorder floating-point work), so they are on by
 * default and the flags are for debugging, measuring each pass, and tests.
 * Constant folding: a node whose inputs are all constants (also through other folded
 *   nodes; input shapes that are known statically count where the op reads only the shape)
 *   is computed once when the plan is compiled, with the kernel the run would use, and
 *   becomes a constant; not for stateful ops (dropout, updates), nodes with control edges,
 *   or outputs of more than 2^20 elements.
 * Common subexpression elimination: nodes with the same op, inputs and attributes (and
 *   equal constants) become one; never stateful nodes, updates or nodes with control edges.
 * Algebraic simplification: x*1, 1*x, x/1, x+(-0.0), x-0 (exact identities only: x+(+0.0)
 *   would turn -0.0 into +0.0), neg(neg(x)), transpose(transpose(x)), chains of reshapes,
 *   cast to the same dtype, and a sum over the axes a broadcast_to added (f32).
 * GEMM epilogue fusion: matmul, then an add of a bias row ([N] or [1, N] over an [M, N] or
 *   batched product), then an activation (relu, leaky_relu, gelu in both forms, tanh,
 *   sigmoid, silu), either tail optional, becomes one node ("matmul_epilogue" in dumps) that
 *   adds the bias and applies the activation to each output tile right after its GEMM, in
 *   the same task, with the elementwise kernels' own per-element code (same bits). Only
 *   when the matmul (and the add, when an activation follows) has no other reader and is
 *   not fetched. In a training graph the gradients of leaky_relu, gelu and silu read the
 *   add, so there only matmul + bias fuse; relu's gradient is made to read relu's output
 *   instead (x > 0 exactly when relu(x) > 0: the same bits), so relu layers fuse whole.
 *   Statistics: n_epilogue (chains fused), nodes_after_epilogue.
 * Elementwise fusion: a chain or tree of two or more elementwise nodes (unary math and
 *   activations, binary arithmetic with broadcasting, comparisons, where, cast, activation
 *   gradients; f32, f64 and integer dtypes, not bf16 or f16; never dropout) becomes one node
 *   ("fused(add, mul, relu)" in dumps) that reads the chain's inputs once, computes every
 *   member per block of elements with the members' own loops, each rounding to its own
 *   dtype (same bits), and writes the result once, in tiles across the workers. A node is
 *   fused into its readers only when they are all in the group, it has the group's output
 *   shape, it is not fetched or targeted, and nothing is ordered after it (control edges);
 *   at most 24 members and 4 distinct inputs per group; integer division stays a node of
 *   its own (its zero-divisor error names it); off in sessions that may place nodes on a
 *   GPU (no CUDA twin yet). Statistics: n_fused, n_fused_members, nodes_after_fuse.
 * Optimizer fusion (last): the update nodes of one wf_minimize()/wf_apply_gradients() call
 *   (same update rule, step counter, hyperparameters and dtype) become one multi-tensor
 *   update ("multi_update" in dumps) that updates every variable and its state in place, in
 *   tiles of 64K elements across all of them (one task per tile), with the per-variable
 *   loops (same bits). Under a data-parallel strategy, one such node per gradient bucket
 *   all-reduced with other ranks (an early bucket's update runs while later ones are
 *   reduced). Not for an update that is fetched or read as data, or that writes a variable
 *   another member writes or reads. Statistics: n_optim_fused, nodes_after_optim_fuse.
 * Critical-path priority (not a rewrite): each node's priority is its estimated time (the
 *   op's flops and bytes) plus the highest priority among the nodes after it; a worker that
 *   finishes a node goes on with its most critical ready successor and offers the others
 *   to idle workers most critical first. Off: successors in plan order.
 * Two precision options change result bits on purpose, so they are off unless asked for:
 * WF_SESSION_MIXED_BF16, bf16 compute with f32 master weights (mixed precision training, as
 *   PyTorch's autocast with bf16): every f32 product (matmul, the GEMM epilogues, conv2d and
 *   the convolution's backward ops: forward and backward) computes in bf16, between a cast
 *   of its f32 inputs to bf16 and a cast of its result back to f32; everything else
 *   (elementwise ops, reductions, softmax and the loss, the optimizer's updates) stays f32.
 *   So variables stay f32 and are read through a cast where a product reads them, the
 *   gradients that reach the updates are f32, and the updates write f32 master weights. On
 *   a GPU the bf16 products run on tensor cores with f32 accumulation; on the CPU they are
 *   computed in f32 from the bf16 inputs and rounded to bf16 (the same numerics, slower than
 *   f32 there). A loss then follows the f32 run's within bf16's precision (~3 significant
 *   digits per product), not bit for bit. Runs after GEMM epilogue fusion, so a fused
 *   matmul + bias + activation computes in bf16 as a whole. Statistics: n_mixed,
 *   nodes_after_mixed.
 * WF_SESSION_TF32: f32 matmuls placed on a GPU may use TF32 tensor cores (10-bit mantissa
 *   inputs, f32 accumulation: ~1e-3 relative error against f32, on tensor cores);
 *   without it they compute in exact f32 (the default, as PyTorch's since 1.12). Per
 *   session, not process-wide; nothing changes on the CPU. Statistics: n_tf32. */
enum {
    WF_SESSION_NO_FOLD = 1u << 0,       /* no constant folding */
    WF_SESSION_NO_CSE = 1u << 1,        /* no common subexpression elimination */
    WF_SESSION_NO_SIMPLIFY = 1u << 2,   /* no algebraic simplification */
    WF_SESSION_NO_FUSE = 1u << 3,       /* no elementwise fusion */
    WF_SESSION_NO_EPILOGUE = 1u << 4,   /* no GEMM epilogue fusion (matmul + bias + activation) */
    WF_SESSION_NO_OPTIM_FUSE = 1u << 5, /* no multi-tensor optimizer updates */
    WF_SESSION_NO_MEMPLAN = 1u << 6,    /* no memory planning (every output from the pool) */
    WF_SESSION_NO_PRIORITY = 1u << 7,   /* no critical-path priority (plan order instead) */
    /* The precision options: from bit 16 (bits 8 to 15 are left for switches of passes). */
    WF_SESSION_MIXED_BF16 = 1u << 16, /* products in bf16, f32 master weights (see above) */
    WF_SESSION_TF32 = 1u << 17,       /* f32 matmuls on GPUs may use TF32 (see above) */
    WF_SESSION_NO_PASSES = WF_SESSION_NO_FOLD | WF_SESSION_NO_CSE | WF_SESSION_NO_SIMPLIFY |
                           WF_SESSION_NO_FUSE | WF_SESSION_NO_EPILOGUE | WF_SESSION_NO_OPTIM_FUSE |
                           WF_SESSION_NO_MEMPLAN | WF_SESSION_NO_PRIORITY,
};

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

/* Returns the current value of variable 'var' in '*out'. A variable that training keeps on
 * a device (a GPU) is copied back to the host first, the call waiting for that copy; later
 * calls return the same host value until the next write.
 * Returns 0, WF_EINVAL (NULL argument, not a variable of the session's graph), WF_ENOMEM or
 * the device's error for a failed copy back, with the message in wf_session_errmsg(s).
 * Ownership: '*out' is owned by the caller (a reference to the immutable current value; a
 *   later assign or run makes a new value and does not change it). Threads: any, but not
 *   from inside a task of the runtime that runs the session: a copy back waits for the
 *   device, whose completion may need that worker. */
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

/* ---- Graph dumps and compile statistics -------------------------------------------------- */

/* Formats of wf_graph_dump() and wf_session_dump(). */
enum {
    WF_DUMP_TEXT = 0, /* one node a line: "%3 logits: f32 [?, 10] = matmul(%0 x, %2 w) on cpu
                         @ model.c:42" (control edges as "after(...)") */
    WF_DUMP_DOT = 1,  /* a Graphviz digraph: 'dot -Tsvg graph.dot > graph.svg' */
};

/* Writes every node of 'g' to 'f' in creation (topological) order: id, name, op, dtype,
 * shape (? for a -1 dimension), inputs, control edges, device ("cpu" when not placed) and
 * where it was made (file:line).
 * Returns 0, WF_EINVAL (NULL argument, unknown format) or WF_EIO (a write failed), with the
 * message in wf_last_errmsg().
 * Ownership: nothing is kept. Threads: not while another thread adds nodes to 'g'. */
WF_API WF_NODISCARD int wf_graph_dump(const wf_graph *g, FILE *f, int format);

/* Writes the plan that runs 'fetches' and 'targets' (the same arrays as wf_session_run()
 * takes; the plan is compiled now if it was not yet), i.e. the graph after the session's
 * passes: the nodes that run, in the order of the plan, with what the passes did marked
 * ("folded": a constant computed at compile time; "new": a node a pass made; "cse +2": two
 * identical nodes merged into this one) and, in the text format, a list of every
 * replacement and the node counts before and after each pass.
 * Returns 0 or the errors of wf_session_run() before it runs anything (bad fetches or
 * targets, WF_ENOMEM), WF_EINVAL (NULL 'f', unknown format) or WF_EIO, with the message in
 * wf_session_errmsg(s) and wf_last_errmsg().
 * Ownership: nothing is kept. Threads: any (as wf_session_run()). */
WF_API WF_NODISCARD int wf_session_dump(wf_session *s, wf_node *const *fetches, int n_fetches,
                                        wf_node *const *targets, int n_targets, FILE *f,
                                        int format);

/* What the compile passes did to one plan: node counts before and after each pass. */
typedef struct wf_plan_stats {
    int nodes_graph;             /* nodes of the session's graph */
    int nodes_after_prune;       /* what the fetches and targets need */
    int nodes_after_fold;        /* after constant folding (what it made unneeded is gone) */
    int nodes_after_cse;         /* after common subexpression elimination */
    int nodes_after_simplify;    /* after algebraic simplification */
    int nodes_after_epilogue;    /* after GEMM epilogue fusion */
    int nodes_after_fuse;        /* after elementwise fusion */
    int nodes_after_optim_fuse;  /* after optimizer fusion: the plan's nodes */
    int n_folded;                /* nodes replaced by constants computed at compile time */
    int n_merged;                /* nodes replaced by an identical node */
    int n_simplified;            /* nodes replaced by an algebraic identity */
    int n_epilogue;              /* matmuls that took a bias or activation epilogue */
    int n_fused;                 /* fused elementwise kernels made */
    int n_fused_members;         /* elementwise nodes those kernels replaced */
    int n_optim_fused;           /* multi-tensor optimizer update nodes made */
    int n_plans;                 /* plans the session has compiled so far */
    int64_t bytes_intermediates; /* sum of the bytes of every intermediate output of one run */
    int64_t bytes_planned;       /* the arena those outputs are planned into (0: no plan yet) */
    int nodes_after_mixed;       /* after the precision options (WF_SESSION_MIXED_BF16, _TF32) */
    int n_mixed;                 /* f32 products made to compute in bf16 (WF_SESSION_MIXED_BF16) */
    int n_tf32;                  /* f32 matmuls marked for TF32 on GPUs (WF_SESSION_TF32) */
    /* The session's variables now (not the plan's): how many the graph has, how many have a
     * host value, and those values' bytes. A pipeline stage makes only the variables its
     * plans read (its partition's weights and their optimizer state), so it holds fewer. */
    int n_variables;
    int n_variables_held;
    int64_t bytes_variables;
} wf_plan_stats;

/* Statistics of the plan the session compiled most recently (all zero but 'nodes_graph' and
 * the variables' counts before the first run).
 * Returns 0 or WF_EINVAL (NULL argument). Ownership: '*out' is the caller's. Threads: any. */
WF_API WF_NODISCARD int wf_session_stats(wf_session *s, wf_plan_stats *out);

/* Statistics of the plan that runs 'fetches' and 'targets' (compiled now if it was not).
 * Returns 0 or the errors of wf_session_dump() but WF_EIO. Threads: any. */
WF_API WF_NODISCARD int wf_session_plan_stats(wf_session *s, wf_node *const *fetches, int n_fetches,
                                              wf_node *const *targets, int n_targets,
                                              wf_plan_stats *out);

/* ---- Checkpoints ------------------------------------------------------------------------ */

/* Checkpoints are safetensors files (https://github.com/huggingface/safetensors): an 8-byte
 * little-endian header length, a JSON header naming each tensor's dtype ("F32", "F64",
 * "I32", "I64", "U8", "BOOL", "BF16", "F16"), shape and byte range, then the raw
 * little-endian data. PyTorch and Hugging Face tools read and write them; nothing in a file
 * is executed. A session's checkpoint holds every variable of its graph under the
 * variable's node name, so optimizer state kept in variables ("fc1.weight/adam_m") is saved
 * and restored with the weights. Names follow PyTorch where a layer exists there:
 * "fc1.weight" is [out, in]. Only little-endian hosts are supported (WF_ENOSYS elsewhere). */

/* Flags of wf_checkpoint_load(). */
enum {
    WF_CHECKPOINT_ALLOW_MISSING = 1u << 0,    /* variables absent from the file keep their
                                                 values (a partial load) */
    WF_CHECKPOINT_ALLOW_UNEXPECTED = 1u << 1, /* tensors of the file that are not variables
                                                 of the session are ignored */
};

/* A tensor with a name: the unit of wf_safetensors_read() and wf_safetensors_write(). */
typedef struct wf_named_tensor {
    const char *name;
    wf_tensor *tensor;
} wf_named_tensor;

/* Saves the current value of every variable of the session (those of its graph at
 * wf_session_create()) to 'path', named by node name, with the metadata
 * {"format": "pt", "weft": "<version>"}. The values are taken together under the session's
 * variable lock, so a load on another thread is either wholly in or wholly out. Save between
 * training steps: a run in flight that updates a variable in place may be caught mid-update.
 * The write is atomic: a temporary file beside 'path' ("<path>.tmp.<pid>.<tid>"), fsync,
 * rename over 'path', fsync of the directory. A failure before the rename removes the
 * temporary file and leaves any old 'path' as it was.
 * Returns 0, WF_EINVAL (NULL argument, empty path, a variable named "__metadata__" or whose
 * name is not valid UTF-8), WF_EIO (the OS's reason: directory missing, disk full, ...) or
 * WF_ENOMEM, with the message, naming the file, in wf_session_errmsg(s) and
 * wf_last_errmsg().
 * Ownership: nothing is kept. Threads: any; runs and other saves may go on meanwhile. */
WF_API WF_NODISCARD int wf_checkpoint_save(wf_session *s, const char *path);

/* Loads the variables of the session from the safetensors file 'path'. Every variable must
 * be in the file with its dtype and shape, and every tensor of the file must be a variable,
 * unless 'flags' (WF_CHECKPOINT_*) allow otherwise. The whole file is validated (size,
 * header length, JSON, dtypes, shapes, offsets inside the data section, no overlaps, no
 * duplicate names, BOOL bytes 0 or 1) and every value is read into a new tensor first; only
 * then are all the variables replaced at once, under the session's variable lock. So a bad
 * file, or any failure, leaves every variable as it was; runs that start afterwards read the
 * loaded values.
 * Returns 0, WF_EINVAL (NULL argument, empty path, unknown flags, a tensor of the file that
 * is not a variable), WF_ENOTFOUND (no such file, or a variable not in the file), WF_EDTYPE
 * or WF_ESHAPE (a tensor whose dtype or shape is not its variable's), WF_EFORMAT (a
 * malformed file: the message names the problem and the tensor, e.g. "checkpoint 'x':
 * tensor 'fc1.weight': data_offsets [0, 100] hold 100 bytes but F32 [5, 10] needs 200"),
 * WF_EIO or WF_ENOMEM, with the message in wf_session_errmsg(s) and wf_last_errmsg().
 * Ownership: nothing is kept. Threads: any; saves on other threads see all the old values or
 *   all the new ones, and so do runs that start after the load returns (a run in flight reads
 *   each variable when its node runs, so it may mix old and new values). */
WF_API WF_NODISCARD int wf_checkpoint_load(wf_session *s, const char *path, uint32_t flags);

/* Writes 'ts[0 .. n-1]' to the safetensors file 'path', atomically as wf_checkpoint_save()
 * does, without metadata. Tensors may be strided (written row-major).
 * Returns 0, WF_EINVAL (NULL argument, n < 0, a NULL tensor, a NULL, duplicate or
 * "__metadata__" name, a name that is not valid UTF-8), WF_EIO or WF_ENOMEM, with the
 * message in wf_last_errmsg().
 * Ownership: 'ts' and its tensors are borrowed for the call. Threads: any. */
WF_API WF_NODISCARD int wf_safetensors_write(const char *path, const wf_named_tensor *ts, int n);

/* Reads every tensor of the safetensors file 'path', validated as wf_checkpoint_load()
 * says, into '*out' ('*n' entries, in header order; "__metadata__" is not returned).
 * Returns 0, WF_EINVAL (NULL argument), WF_ENOTFOUND (no such file), WF_EFORMAT, WF_EIO or
 * WF_ENOMEM, with the message in wf_last_errmsg().
 * Ownership: on success the caller owns '*out', its names and its tensors: free all with
 *   wf_safetensors_free(*out, *n). On failure '*out' is NULL and '*n' 0. Threads: any. */
WF_API WF_NODISCARD int wf_safetensors_read(const char *path, wf_named_tensor **out, int *n);

/* Frees an array returned by wf_safetensors_read(): its names, its tensors (released) and
 * the array. NULL is a no-op. */
WF_API void wf_safetensors_free(wf_named_tensor *ts, int n);

/* ---- Checkpoints every K steps, and resuming from the newest --------------------------- */

/* A checkpointer takes a snapshot of a training run at a step boundary and writes it in the
 * background while training goes on (CheckFreq's split: the copy into host buffers is the
 * only part the training thread waits for; the file write, fsync and rename happen on the
 * checkpointer's own thread). Each snapshot becomes the file
 * "<dir>/ckpt-<step, 12 digits or more>.safetensors", written atomically as
 * wf_checkpoint_save() writes (a temporary file, fsync, rename), with the metadata
 * {"format": "pt", "weft": "<version>", "weft.step": "<step>"}; once it is complete, all but
 * the newest 'keep' checkpoints of 'dir' are removed. A failure of a background write (disk
 * full, the folder removed) is returned by the next call on the checkpointer; the
 * checkpoints already complete are never touched by a failed write. */
typedef struct wf_checkpointer wf_checkpointer;

typedef struct wf_checkpointer_opts {
    const char *dir; /* the folder of the checkpoints; it must exist (copied at creation) */
    int keep;        /* 0: 3. How many complete checkpoints are kept (the newest) */
} wf_checkpointer_opts;

/* Creates a checkpointer writing into 'opts->dir' and starts its thread.
 * Returns 0, WF_EINVAL (NULL argument, empty dir, keep < 0), WF_ENOTFOUND (no such folder),
 * WF_EIO (not a folder, or the OS refuses) or WF_ENOMEM, with the message in
 * wf_last_errmsg().
 * Ownership: on success the caller owns '*out' (wf_checkpointer_destroy()); on failure it is
 *   NULL. 'opts' is not kept. Threads: one thread at a time per checkpointer. */
WF_API WF_NODISCARD int wf_checkpointer_create(const wf_checkpointer_opts *opts,
                                               wf_checkpointer **out);

/* Takes the snapshot of step 'step' (the number of steps done, 0 to 10^18 - 1): every variable of
 * 's' (when 's' is not NULL; their host values, copied back from a device first, taken together
 * under the session's variable lock as wf_checkpoint_save() takes them), then the caller's
 * tensors 'extra[0 .. n_extra-1]' (the data loader's position, RNG counters, the run's
 * options as bytes, or an eager program's variables), each copied into a new host buffer.
 * Then it returns, and the checkpointer's thread writes the file. Call it between steps. If
 * the previous write is still under way, it waits for it first (one write at a time).
 * Returns 0; the failure of the previous background write (WF_EIO, WF_ENOMEM, ...; the
 *   message names the file), in which case no snapshot is taken and the error is cleared,
 *   so the next call tries again; WF_EINVAL (NULL checkpointer, a step out of range,
 *   n_extra < 0, a NULL extra tensor or name, an extra named like a variable or another
 *   extra); or WF_ENOMEM; the message is in wf_last_errmsg().
 * Memory: the snapshot written last is kept and the next one copies into its buffers when
 *   it holds the same tensors, so a run holds one snapshot's worth of host memory.
 * Ownership: 'extra' and its tensors are borrowed for the call (copied). Threads: one
 *   thread at a time per checkpointer; runs of 's' must not be in flight. */
WF_API WF_NODISCARD int wf_checkpointer_save(wf_checkpointer *c, wf_session *s, int64_t step,
                                             const wf_named_tensor *extra, int n_extra);

/* Waits until the checkpointer's thread has written every snapshot it was given.
 * Returns 0 or the failure of the last background write (cleared by returning it), with the
 * message in wf_last_errmsg(); WF_EINVAL for NULL. Threads: as wf_checkpointer_save(). */
WF_API WF_NODISCARD int wf_checkpointer_wait(wf_checkpointer *c);

/* Waits for the write under way, stops the thread and frees the checkpointer. A failure of
 * that last write is lost: call wf_checkpointer_wait() first to see it. NULL is a no-op. */
WF_API void wf_checkpointer_destroy(wf_checkpointer *c);

/* Finds the newest complete checkpoint of folder 'dir' (the files
 * "ckpt-<step>.safetensors" a checkpointer writes): the one with the highest step whose
 * header validates (as wf_checkpoint_load() validates it) and whose "weft.step" metadata is
 * the step of its name; temporary files and files that fail are skipped. Its path goes to
 * 'path' ('cap' bytes) and its step to '*step'.
 * Returns 0, WF_ENOTFOUND (no such folder, or no complete checkpoint in it: a fresh start),
 * WF_EINVAL (NULL argument, or 'cap' too small for the path), WF_EIO or WF_ENOMEM, with the
 * message in wf_last_errmsg(). Ownership: nothing is kept. Threads: any. */
WF_API WF_NODISCARD int wf_checkpoint_latest(const char *dir, char *path, size_t cap,
                                             int64_t *step);

/* Loads a checkpoint written by a checkpointer into 's': every variable must be in the file
 * (dtype and shape as wf_checkpoint_load() checks them, the whole file validated first, all
 * the variables replaced at once), its "weft.step" metadata must be a step number (written
 * to '*step'), and the file's other tensors (the extras given to wf_checkpointer_save())
 * are returned in '*extra' ('*n_extra' entries, in header order). A refused file leaves
 * every variable as it was.
 * Returns 0 or the errors of wf_checkpoint_load() (WF_EFORMAT also for a missing or bad
 * "weft.step"), with the message in wf_session_errmsg(s) and wf_last_errmsg().
 * Ownership: on success the caller owns '*extra' (wf_safetensors_free(*extra, *n_extra));
 *   on failure it is NULL and '*n_extra' 0. Threads: as wf_checkpoint_load(). */
WF_API WF_NODISCARD int wf_checkpoint_restore(wf_session *s, const char *path, int64_t *step,
                                              wf_named_tensor **extra, int *n_extra);

/* ---- Profiling for the placement planner --------------------------------------------------- */

/* The profile run: times every distinct signature (op, dtype, input and output shapes) of the
 * ops of 'g' that 't' has no entry for on the kind of runtime device 'device' (0 the CPU,
 * 1 + i CUDA device i), each alone in a one-node session on placeholders ('reps' timed runs
 * after a warm-up; the fastest, which includes the session's per-run cost), and records it
 * with wf_cost_table_put() for wf_plan_create() (weft/placement.h). Sources, updates, send
 * and recv, inputs with -1 dimensions and nodes that cannot run alone there are skipped
 * (they keep the flops/bytes prior).
 * Returns the number of signatures measured (>= 0), or WF_EINVAL (NULL, device < 0, reps not
 * in 1 .. 10000) or WF_ENOMEM. Ownership: 'g' is borrowed (not changed); 't' gains entries.
 * Threads: not while 'g' changes. */
WF_API WF_NODISCARD int wf_profile_graph(wf_runtime *rt, const wf_graph *g, int device, int reps,
                                         wf_cost_table *t);

#ifdef __cplusplus
}
#endif
#endif /* WEFT_RUNTIME_H */
