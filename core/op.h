/* core/op.h: the op registry: what an op is, for ops/, grad/, placement/ and runtime/ (a
 * module interface: not installed, not internal.h).
 * Owns: struct wf_op_def (name, arity, shape and dtype inference, default kernels per
 *   device kind, a gradient slot, a cost function, flags), the kernel calling convention
 *   (wf_kernel_ctx, wf_kernel_fn), the kernel registry keyed by (op, device kind) that
 *   sessions fill at start (op_kernels.c), the one routine that runs a node (op_run.c), the
 *   three op defs core itself needs (placeholder, constant, variable), and lookup by name.
 * How ops are registered: there is no mutable table of ops. Each op is a
 *   'const wf_op_def' defined once, in the file of ops/ that implements it
 *   ('const wf_op_def wf_op_add = { .name = "add", ... };'); the op's constructor hands its
 *   address to wf__node_add(), so a graph only ever holds ops by pointer. Lookup by name
 *   (for loading a saved graph, for tools) takes an explicit table: ops/ keeps one
 *   'static const wf_op_def *const' array of its defs and passes it to wf__op_find(), which
 *   searches core's built-ins first, then that table. Core cannot see ops/ (it is the floor
 *   below), so a table assembled "at link time" would need a linker section trick; an
 *   explicit table is plain C and costs one pointer per op.
 * Invariant: an op def is immutable and lives for the whole program (static storage), so a
 *   node's 'op' pointer never dangles and two defs are the same op iff their addresses are
 *   equal.
 * Not here: the ops themselves (ops/), gradient functions (grad/), running kernels on
 *   devices (devices/, runtime/). */
#ifndef WF_CORE_OP_H
#define WF_CORE_OP_H

#include <weft/core.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct wf_op_def wf_op_def;

/* Kernel slots, one per device kind: the values are those of wf_device_kind in
 * <weft/devices.h> (WF_DEVICE_CPU 0, WF_DEVICE_CUDA 1), which core cannot include (devices/
 * is above it), so runtime/ indexes 'kernel[info.kind]' directly. Keep the two equal. */
#define WF_KERNEL_CPU   0
#define WF_KERNEL_CUDA  1
#define WF_DEVICE_KINDS 2 /* the length of wf_op_def.kernel */

/* What a kernel gets besides its node and tensors. Zero means "none" for every field. */
typedef struct wf_kernel_ctx {
    wf_runtime *rt;       /* the runtime whose workers run the kernel: big CPU kernels split
                             themselves with wf_parallel_for(rt, ...) */
    int device;           /* index of the device among those of its kind (0: the first) */
    void *stream;         /* device kinds with queues (CUDA): the stream to enqueue on;
                             NULL for the CPU */
    void *scratch;        /* workspace the memory planner set aside for this node, or NULL */
    size_t scratch_bytes; /* its size */
    uint64_t step;        /* the session's run count (static graphs; 0 in eager graphs): random
                             ops (dropout) mix it into their seed, so each run draws a new
                             mask while a node and its gradient in one run draw the same */
    uint64_t xfer_step;   /* the session's count of runs before this one whose plan has a
                             WF_OP_TRANSFER node: what send, recv and dp_reduce put in their
                             keys, so that runs one rank makes alone (sampling, a local
                             evaluation) do not shift the keys of the runs all ranks make */
    void *data;           /* what the layer that registered the kernel gave with it
                             (wf__kernels_register()), or NULL (the op's own kernels) */
    /* Ops with WF_OP_ASYNC: a kernel that returns WF_KERNEL_PENDING calls
     * 'complete(token, rc)' exactly once later, from any thread, when its output is
     * written ('rc' 0, or a negative wf_status with wf_last_errmsg() set on that thread).
     * NULL where nothing can wait (eager graphs, constant folding): the kernel then fails
     * instead of pending. Copy both before returning: the context is the caller's. */
    void (*complete)(void *token, int rc);
    void *token;
} wf_kernel_ctx;

/* What a kernel of a WF_OP_ASYNC op returns when its work finishes later (ctx->complete):
 * positive, so it is no error. */
#define WF_KERNEL_PENDING 0x50454e44

/* A kernel: computes node 'n' (its op, attributes and dtype are read from 'n') from
 * 'in[0 .. n->n_inputs-1]' into '*out'.
 * Inputs have the dtype of the corresponding input node and its shape, except that a -1
 *   dimension (a placeholder's "any") is known here: kernels read shapes from the tensors,
 *   never from the nodes. Inputs may be strided views (any strides, also 0 and negative).
 * Output: '*out' is a contiguous tensor of n's dtype and of the shape inference gives for the
 *   inputs' concrete shapes (wf__op_infer()), allocated by the caller (the memory planner's
 *   arena, or wf__tensor_alloc() in eager graphs); nobody else sees it yet, so the kernel
 *   writes it. It does not overlap an input unless the op has WF_OP_INPLACE and the caller
 *   passed input 0's storage. Only for ops with WF_OP_DYNAMIC_SHAPE (output shape known
 *   only from the data) is '*out' NULL on entry: the kernel then allocates it
 *   (wf__tensor_alloc()) and the caller owns it.
 * Returns 0, or a negative wf_status with the reason in wf_last_errmsg() (the caller adds the
 *   node's name, op and location). On error a tensor the kernel allocated is released and
 *   '*out' is left as it came in.
 * Threads: called on a worker of ctx->rt (or the thread building an eager graph); a kernel
 *   keeps no state between calls. ops/kernels.h's entries (wf__<op>_cpu(ctx, attrs...,
 *   inputs..., out)) are wrapped into this shape by each op's table entry. */
typedef int (*wf_kernel_fn)(const wf_kernel_ctx *ctx, const struct wf_node *n, wf_tensor *const *in,
                            wf_tensor **out);

/* Shape and dtype inference: sets n->dtype and n->shape from the inputs' dtype and shape
 * and n->attrs. On error returns WF_ESHAPE, WF_EDTYPE or WF_EINVAL and writes into 'err' a
 * message naming the values, without the node's name ("a is [3, 4] but b is [5, 2]"): the
 * graph prefixes "matmul 'logits' (model.c:42): ".
 * Rules, so that the runtime can re-run it with the concrete shapes of fed placeholders
 * (wf__op_infer()): it reads only n->op, n->attrs, n->n_inputs and n->inputs[i]->dtype and
 * ->shape; it writes only n->dtype and n->shape; it keeps -1 dimensions flowing (a -1 in an
 * input gives -1 in the output where the output depends on it; wf_shape_broadcast() does
 * this). */
typedef int (*wf_infer_fn)(struct wf_node *n, char *err, size_t errlen);

/* A gradient: adds to n's graph the nodes computing the gradient of the loss with respect to
 * the inputs of 'n', given 'dy' (the gradient with respect to n's output, of n's dtype and
 * shape), and writes them into 'dx[0 .. n->n_inputs-1]' (which the caller zeroed). Input i
 * needs one when bit i of 'need' is set (inputs from 32 on: always); a NULL entry means "no
 * gradient flows there" (an integer input, a zero derivative), which wf_gradients treats as
 * zero. Each dx[i] must have input i's dtype and a shape that equals input i's (after
 * unbroadcasting). Returns 0 or a negative wf_status; the graph's error holds the message.
 * The ops of ops/ get theirs from grad/'s table (grad/ is above ops/, so it cannot fill
 * their const defs); this slot is for ops defined elsewhere (a user's own op def), and
 * wf_gradients() looks here first. */
typedef int (*wf_grad_fn)(wf_graph *g, const struct wf_node *n, struct wf_node *dy, uint32_t need,
                          struct wf_node **dx);

/* Estimated work of a node: floating-point operations and bytes moved (read + written), for
 * placement and the scheduler's cost model. -1 dimensions count as 1. */
typedef void (*wf_cost_fn)(const struct wf_node *n, double *flops, double *bytes);

/* Whether the op's kernel of kind 'kind' (WF_KERNEL_*, a slot that is set) computes node 'n'
 * at all: for ops whose device kernel covers only some of what the CPU kernel does, judged
 * from the node alone (its attributes, dtypes, constant inputs), at placement, so that such
 * a node stays on the CPU (or an explicit placement fails with WF_ENODEV) instead of failing
 * when it runs. */
typedef bool (*wf_kernel_ok_fn)(const struct wf_node *n, int kind);

enum {
    WF_OP_ELEMENTWISE = 1u << 0,   /* output element i depends only on input elements i (after
                                      broadcasting): fusable into one loop */
    WF_OP_STATEFUL = 1u << 1,      /* reads or writes state besides its inputs (variables,
                                      random ops): never constant-folded, CSE'd or pruned away
                                      when it writes */
    WF_OP_NO_GRAD = 1u << 2,       /* has no gradient and needs none (comparisons, argmax,
                                      integer ops): autodiff stops here without an error */
    WF_OP_SOURCE = 1u << 3,        /* takes no inputs and has no kernel: its value comes from
                                      outside (placeholder: fed; constant: the tensor;
                                      variable: the session or the eager graph) */
    WF_OP_INPLACE = 1u << 4,       /* the kernel may write its output over input 0 when the
                                      memory planner says input 0 dies here */
    WF_OP_DYNAMIC_SHAPE = 1u << 5, /* the output's shape depends on input values (inference
                                      gives -1 there): the kernel allocates its output */
    WF_OP_ASYNC = 1u << 6,         /* the kernel may finish later (WF_KERNEL_PENDING, the
                                      network's send and recv): the executor's task of the
                                      node ends when ctx->complete is called, and no worker
                                      waits for it */
    WF_OP_TRANSFER = 1u << 7,      /* the kernel talks to other ranks (send, recv, dp_reduce):
                                      its messages' keys carry ctx->xfer_step */
};

struct wf_op_def {
    const char *name;  /* unique among all ops: "matmul"; auto node names are "<name>_<id>" */
    int min_inputs;    /* arity: n_inputs must be in [min_inputs, max_inputs] */
    int max_inputs;    /* -1: no upper bound (concat, add_n) */
    wf_infer_fn infer; /* required (wf__node_add() refuses an op without one) */
    wf_kernel_fn kernel[WF_DEVICE_KINDS]; /* by device kind (WF_KERNEL_*); NULL: no kernel
                                             for that kind (placement: WF_ENODEV) */
    wf_grad_fn grad;                      /* NULL: no gradient (an error in wf_gradients unless
                                             WF_OP_NO_GRAD) */
    wf_cost_fn cost;           /* NULL: cost is the bytes of inputs and output, no flops */
    uint32_t flags;            /* WF_OP_* bits */
    int n_assign;              /* updates (optimizers, assign): inputs[0 .. n_assign-1] must be
                                  variable nodes (wf__node_add() checks), whose values the kernel
                                  writes in place. The caller hands it in[0 .. n_assign-1] as
                                  exclusive contiguous tensors (wf__tensor_writable(): a copy when
                                  anyone else holds the value, so values already read never change)
                                  that become the variables' new values, and '*out' as NULL: the
                                  kernel leaves it, and the node's value is then in[0] (so the node's
                                  dtype and shape are variable 0's). Such ops are WF_OP_STATEFUL. */
    wf_kernel_ok_fn kernel_ok; /* NULL: every set kernel slot computes every node of the op */
};

/* Whether node 'n' of op 'op' has a kernel of kind 'kind' that computes it (the slot, and
 * the op's kernel_ok). */
static inline bool wf__op_kernel_ok(const wf_op_def *op, const struct wf_node *n, int kind)
{
    return op->kernel[kind] && (!op->kernel_ok || op->kernel_ok(n, kind));
}

/* ---- The kernel registry ------------------------------------------------------------------
 * Which kernel computes an op on a kind of device, for one session (runtime/ owns one per
 * session and fills it when the session is created, before any plan exists). The op defs'
 * own 'kernel[]' slots are the defaults; a layer above ops/ registers (op, kind) -> kernel for
 * what it owns (devices/: copies between devices; transport/: send and receive; tests: their
 * own), which extends an op that has no kernel of that kind or overrides the op's own.
 * Placement asks the registry whether a node may run on a device, and the plan keeps the
 * kernel it found per node, so a run never looks anything up.
 * Why not a global table: two sessions (or two runtimes) in one process may be given
 * different devices and communicators, so their kernels may differ; the registry belongs to
 * the object that was given them.
 * Threads: registering is single-threaded (before the session is shared); lookups may be
 * concurrent with each other, never with registering. A NULL registry is a valid, empty
 * one: lookups give the op defs' own kernels (eager graphs, op tests). */
typedef struct wf__kernels wf__kernels;

/* Creates an empty registry. Returns 0 or WF_ENOMEM. Ownership: the caller owns '*out'
 * (wf__kernels_destroy()). */
int wf__kernels_create(wf__kernels **out);

/* Frees a registry. NULL is a no-op. */
void wf__kernels_destroy(wf__kernels *r);

/* Registers 'fn' as the kernel of 'op' on device kind 'kind' (WF_KERNEL_*), replacing an
 * earlier registration of the pair; 'ok' (may be NULL: every node) says which nodes it
 * computes, as an op's kernel_ok does; 'data' (may be NULL) reaches the kernel as
 * wf_kernel_ctx.data (a communicator, a device table). 'fn' NULL removes what 'op' can do
 * on 'kind', its own slot included (a test of placement's refusals).
 * Returns 0, WF_EINVAL (NULL registry or op, a kind out of range) or WF_ENOMEM. */
int wf__kernels_register(wf__kernels *r, const wf_op_def *op, int kind, wf_kernel_fn fn,
                         wf_kernel_ok_fn ok, void *data);

/* The kernel of 'op' on 'kind': a registered one, else the op's own slot (NULL: none). */
wf_kernel_fn wf__kernels_find(const wf__kernels *r, const wf_op_def *op, int kind);

/* The 'data' registered with the kernel of 'op' on 'kind', or NULL. */
void *wf__kernels_data(const wf__kernels *r, const wf_op_def *op, int kind);

/* Whether node 'n' (of op 'op') has a kernel on 'kind' that computes it: the registered
 * kernel and its 'ok', else the op's own slot and its kernel_ok (wf__op_kernel_ok()). */
bool wf__kernels_ok(const wf__kernels *r, const wf_op_def *op, const struct wf_node *n, int kind);

/* ---- Running one node ---------------------------------------------------------------------
 * wf__node_run() is the one routine that runs a kernel node, wherever it runs: eager graphs
 * (core/graph.c), the CPU executor (runtime/exec.c), the device executor (runtime/
 * exec_device.c) and constant folding (runtime/compile/pass_fold.c). It does, in order: an update's
 * writable inputs (op->n_assign), the output (unless the op allocates its own), the kernel
 * call, an update's value (its first variable), the check of the output against the
 * inferred dtype and shape, and on failure the message "<op> '<name>' (<file>:<line>):
 * <why>". What differs between those places is in a wf__node_env: where outputs and
 * writable variables come from, and how the kernel is called (directly, or on a device's
 * queue). Gathering the inputs and re-inferring -1 dimensions stay with the caller, which
 * knows where values live. */
typedef struct wf__node_env {
    /* A fresh output of 'dt' and 'shape' for 'n' (not an update, not WF_OP_DYNAMIC_SHAPE)
     * that only the kernel writes; NULL with wf_last_errmsg() set: the run fails with
     * WF_ENOMEM. Required. */
    struct wf_tensor *(*alloc)(void *arg, const struct wf_node *n, wf_dtype dt,
                               const wf_shape *shape);
    /* Updates: replaces in[0 .. n->op->n_assign-1] by exclusive contiguous tensors that
     * become the variables' values, one reference each for the routine (which releases them
     * after the kernel). Returns 0 or a negative wf_status with wf_last_errmsg() set (the
     * inputs then as they came in). Required for ops with n_assign > 0. */
    int (*writable)(void *arg, const struct wf_node *n, struct wf_tensor **in);
    /* Optional: after 'writable', whether the kernel was called successfully ('ok'). */
    void (*written)(void *arg, const struct wf_node *n, bool ok);
    /* Optional: calls 'k(ctx, n, in, out)' where the node runs (a device's queue) and
     * returns its result; NULL: called here, on the calling thread. */
    int (*call)(void *arg, wf_kernel_fn k, const wf_kernel_ctx *ctx, const struct wf_node *n,
                struct wf_tensor *const *in, struct wf_tensor **out);
} wf__node_env;

/* Runs kernel node 'n' with 'k' (NULL: fails with WF_ENODEV) on inputs 'in' (n->n_inputs
 * of them, borrowed; an update's first n_assign are replaced as env->writable says and
 * released again before the return) into '*out' (on success the value, one reference for
 * the caller; NULL on failure). 'dt' and '*shape' are the output's concrete type (n's, or
 * re-inferred; by pointer: a shape is 72 bytes, and copies of it were a third of the
 * routine's cost in an eager add). 'arg' goes to env's hooks, so an env can be a static const
 * table. 'where' is NULL for the CPU, else the device's name: messages then read "the <where>
 * kernel gave ..." and "on <where>: <why>". Returns 0, WF_KERNEL_PENDING (a WF_OP_ASYNC kernel that
 * will call ctx->complete: '*out' is its output, which it writes until then; its check is the
 * caller's once complete), or a negative wf_status, with the whole message in 'msg' ('msglen'
 * bytes; may be NULL) and in wf_last_errmsg(). Threads: any; 'n' is only read. */
int wf__node_run(const wf__node_env *env, void *arg, wf_kernel_fn k, const wf_kernel_ctx *ctx,
                 const struct wf_node *n, struct wf_tensor **in, wf_dtype dt, const wf_shape *shape,
                 const char *where, struct wf_tensor **out, char *msg, size_t msglen);

/* "<op> '<name>' (<file>:<line>)" of a node ("?" for what it lacks), for messages; writes
 * into 'buf' and returns it. */
const char *wf__node_desc(const struct wf_node *n, char *buf, size_t size);

/* The ops core defines itself (all WF_OP_SOURCE; attrs.dtype and attrs.shape hold the
 * value's type; a variable's initializer is attrs.init). */
extern const wf_op_def wf_op_placeholder; /* "placeholder": -1 dimensions allowed */
extern const wf_op_def wf_op_constant;    /* "constant": the node's 'value' is the tensor */
extern const wf_op_def wf_op_variable;    /* "variable": named; no -1 dimensions */

/* The boundary ops between ranks (core/op_comm.c): plain ops whose kernels only the layer
 * that owns the network registers (transport/, through runtime/ when a session is given a
 * communicator), so that the graph and the passes see them as any other node.
 *   send: input x; attrs.peer (the destination rank) and attrs.edge (the key's edge, below
 *     2^15); its value is an f32 scalar 0 (a token to order things after it).
 *   recv: no input; attrs.peer (the source rank), attrs.edge, attrs.dtype and attrs.shape
 *     (the value's, no -1 dimension).
 * Both are WF_OP_STATEFUL (never folded, merged or pruned away when targeted) and
 * WF_OP_ASYNC; keys are (step, edge) plus the transport's source rank and incarnation. */
extern const wf_op_def wf_op_send;
extern const wf_op_def wf_op_recv;

/* The boundary op between devices of one process (core/op_comm.c): input x, on device
 * attrs.from_dev; its value is x's bytes on device attrs.to_dev (ids as placement numbers
 * them: 0 the host). Kernel-less here: devices/ registers its kernels (one per device kind,
 * wf__devices_register_kernels()), keyed by the kind of the device that is not the host (both
 * ends' kind for a copy between devices). WF_OP_ASYNC: a copy to the host finishes when the
 * device says it has landed. No gradient: placement inserts copies after autodiff. */
extern const wf_op_def wf_op_copy;

/* The ops of data-parallel rewrites (core/op_dist.c; placement/replicate.c inserts them):
 *   shard_rows: input x [B, ...]; attrs.begin[0] the shard k, attrs.end[0] the shard count
 *     S; its value is rows [lo, hi) of x (wf__shard_rows_range()); a batch of fewer than S
 *     rows is refused (WF_ESHAPE). It has a CPU kernel.
 *   dp_reduce: inputs ref (the sharded batch: its rows give B) and b values per reduced
 *     tensor (grad-major: value j of local shard i is input 1 + j * b + i), all f32 with
 *     static shapes; attrs.begin[0] the first local shard k0, .end[0] the shard count S,
 *     .step[0] b, .axis the aggregation (WF__AGG_*), .edge the first of two key edges; its
 *     value is the f32 [sum of the tensors' sizes] of every tensor, each shard's value
 *     scaled by its weight and summed over every shard of every rank in one fixed tree.
 *     Kernel-less: the transport registers it per session (transport/coll_ops.h);
 *     WF_OP_STATEFUL | WF_OP_ASYNC. */
extern const wf_op_def wf_op_shard_rows;
extern const wf_op_def wf_op_dp_reduce;

/* dp_reduce in place (attrs.keepdims set): the reduced values are written over the inputs
 * of its first local shard (value j's input 1 + j * b; the other shards' inputs are scratch),
 * so no value is packed into a flat output and sliced out again; its value is then an f32
 * scalar token. The rewrite does so only for values no other node reads. dp_grad (core/
 * op_dist.c): inputs x (that first shard's value) and such a dp_reduce; its value is x's once
 * the reduction is done (WF_OP_INPLACE: over x's bytes when the planner allows, else a copy). */
extern const wf_op_def wf_op_dp_grad;

/* dp_reduce as one node of the fixed tree over a rank's b local shards (in place, attrs.step[1]
 * 1): it sums local shards [begin[1], end[1]) and splits them at wf__dp_tree_split(); inputs
 * ref, then per tensor two values (the tensors of local shards lo and split, where the halves'
 * sums lie: a one-shard half is that shard's value, scaled by its weight here), then the token of
 * each half that is itself a tree node. The sum ends in shard lo's tensor; only the node over
 * every local shard ([0, b)) talks to the other ranks. So a rank's shards are summed as they
 * finish (a node runs once both halves exist), the bits those of one dp_reduce over them. */
int wf__dp_tree_split(int lo, int hi);

/* The count of tensors dp_reduce node 'n' reduces (either form). */
int wf__dp_reduce_values(const wf_node *n);

/* The ops of the parameter-server rewrite (core/op_ps.c; placement/ps.c inserts them):
 *   ps_assign: inputs a variable and a value of its dtype and shape (what the worker pulled);
 *     writes the value into the variable (n_assign 1). ps_join: inputs x and any others; its
 *     value is x's, made once every input exists (a value ordered after the sends that carry
 *     it, or a token for a rank's whole step). */
extern const wf_op_def wf_op_ps_assign;
extern const wf_op_def wf_op_ps_join;
/* ps_note (asynchronous parameter servers): input a server's reply header (i64 [4]); its
 * value is the header's; the kernel the runtime registers also records it. */
extern const wf_op_def wf_op_ps_note;

/* Tensor parallelism, Megatron's pair (core/op_tp.c; placement/tensor_split.c inserts them):
 *   tp_enter: input x (f32 or f64); its value is x's (a CPU kernel here, WF_OP_INPLACE); its
 *     gradient (grad/grad_dist.c) is a tp_reduce of the same attributes.
 *   tp_reduce: input x; its value is the sum of x over the attrs.peer ranks of the
 *     communicator, added in rank order; attrs.edge keys its messages. Kernel-less: the
 *     transport registers it per session (transport/tp_ops.c); WF_OP_STATEFUL | WF_OP_ASYNC |
 *     WF_OP_TRANSFER. Its gradient is a tp_enter of the same attributes. */
extern const wf_op_def wf_op_tp_enter;
extern const wf_op_def wf_op_tp_reduce;

/* Aggregations of dp_reduce (attrs.axis); equal to wf_aggregation (weft/distribute.h):
 * MEAN weights shard k by its rows over the batch's (n_k / B: the mean over the global
 * batch), SUM by 1, SHARD_MEAN by 1 / S. */
enum { WF__AGG_MEAN = 0, WF__AGG_SUM = 1, WF__AGG_SHARD_MEAN = 2 };

/* Rows [*lo, *hi) of shard k of a batch of 'rows' rows split into 'shards' contiguous
 * shards, the first rows % shards of them one row longer. */
void wf__shard_rows_range(int64_t rows, int64_t k, int64_t shards, int64_t *lo, int64_t *hi);

/* Finds an op by name: core's built-ins first, then 'table[0 .. count-1]' (may be NULL
 * when 'count' is 0; NULL entries are skipped). Returns the def or NULL (also for a NULL
 * name). Linear search: tables are short and lookup by name is rare (loading graphs). */
const wf_op_def *wf__op_find(const wf_op_def *const *table, size_t count, const char *name);

/* Checks a table of op defs: every entry has a name and an infer function, sane arity, and
 * no two entries (nor an entry and a built-in) share a name. Returns 0 or WF_EINVAL with
 * the first problem in wf_last_errmsg(). For ops/' own tests. */
int wf__op_check_table(const wf_op_def *const *table, size_t count);

/* Runs n's inference as if its inputs had the dtypes 'in_dtypes' and shapes 'in_shapes'
 * (n->n_inputs of each) instead of their own, e.g. with a fed placeholder's concrete batch
 * size; 'n' is not changed. Writes the result into '*dtype' and '*shape'.
 * Returns 0 or the infer function's code with "<op> '<name>' (<file>:<line>): ..." in
 * wf_last_errmsg(). Threads: any ('n' is only read). */
int wf__op_infer(const struct wf_node *n, const wf_dtype *in_dtypes, const wf_shape *in_shapes,
                 wf_dtype *dtype, wf_shape *shape);

#endif /* WF_CORE_OP_H */
