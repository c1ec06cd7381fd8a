/* weft/core.h: the vocabulary: dtypes, shapes, tensors, and graphs of ops.
 * Owns: the public contract of core/: what a tensor is (an immutable value: dtype, shape,
 * strides, a refcounted buffer), what a graph and a node are, placeholders, constants,
 * variables and their initializers.
 * Not here: the op constructors (weft/ops.h), sessions and eager execution (weft/runtime.h),
 * the scheduler (weft/sched.h). */
#ifndef WEFT_CORE_H
#define WEFT_CORE_H

#include <weft/base.h>
#include <weft/sched.h>

#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- dtypes ----------------------------------------------------------------------------- */

typedef enum wf_dtype {
    WF_DTYPE_INVALID = 0,
    WF_F32 = 1,
    WF_F64 = 2,
    WF_I32 = 3,
    WF_I64 = 4,
    WF_U8 = 5,
    WF_BOOL = 6, /* one byte, 0 or 1 */
    WF_BF16 = 7, /* storage only: converted to f32 on load, rounded to nearest even on store */
    WF_F16 = 8,  /* storage only, as bf16 */
} wf_dtype;

#define WF_DTYPE_COUNT 9

/* Returns the size of one element in bytes, or 0 for an invalid dtype. */
WF_API size_t wf_dtype_size(wf_dtype dt);

/* Returns "f32", "f64", "i32", "i64", "u8", "bool", "bf16", "f16", or "invalid". */
WF_API const char *wf_dtype_name(wf_dtype dt);

/* Returns true for f32, f64, bf16 and f16. */
WF_API bool wf_dtype_is_float(wf_dtype dt);

/* ---- Shapes ----------------------------------------------------------------------------- */

#define WF_MAX_RANK 8

/* A shape: up to WF_MAX_RANK dimensions. In a placeholder, -1 means "any size" (known when
 * fed); everywhere else dimensions are >= 0. Rank 0 is a scalar. */
typedef struct wf_shape {
    int32_t rank;
    int64_t dims[WF_MAX_RANK];
} wf_shape;

#define WF__NARG(...)                             WF__NARG_(__VA_ARGS__, 8, 7, 6, 5, 4, 3, 2, 1, 0)
#define WF__NARG_(a, b, c, d, e, f, g, h, N, ...) N
/* WF_SHAPE(256, 784) is a rank-2 shape (one to eight dimensions); WF_SCALAR is rank 0.
 * C only: C++ callers fill a wf_shape themselves. */
#define WF_SHAPE(...) ((wf_shape){ .rank = WF__NARG(__VA_ARGS__), .dims = { __VA_ARGS__ } })
#define WF_SCALAR     ((wf_shape){ .rank = 0 })

/* Returns the number of elements (1 for a scalar), or -1 if a dimension is -1 or the
 * product overflows int64. */
WF_API int64_t wf_shape_numel(wf_shape s);

/* Returns true if both have the same rank and dimensions. */
WF_API bool wf_shape_equal(wf_shape a, wf_shape b);

/* Writes "[256, 784]" (or "[]" for a scalar, "?" for -1) into 'buf' and returns 'buf'. */
WF_API char *wf_shape_str(wf_shape s, char *buf, size_t size);

/* NumPy broadcasting of 'a' and 'b' into '*out'. -1 broadcasts with anything (the result
 * is -1 unless the other is a size > 1).
 * Returns 0 or WF_ESHAPE with both shapes in wf_last_errmsg(). */
WF_API WF_NODISCARD int wf_shape_broadcast(wf_shape a, wf_shape b, wf_shape *out);

/* ---- Tensors ---------------------------------------------------------------------------- */

/* An immutable value: dtype, shape, strides (in elements) and a refcounted host buffer.
 * Tensors are never written after creation, so they may be shared between threads, graphs
 * and runs freely. */
typedef struct wf_tensor wf_tensor;

/* Creates a contiguous tensor holding a copy of 'data' (numel * dtype size bytes; NULL:
 * zeros). Returns 0, WF_EINVAL (invalid dtype, negative or -1 dimension, rank above
 * WF_MAX_RANK) or WF_ENOMEM, with the reason in wf_last_errmsg().
 * Ownership: on success the caller owns '*out' (wf_tensor_release()); 'data' is copied.
 * Threads: any. */
WF_API WF_NODISCARD int wf_tensor_create(wf_dtype dt, wf_shape shape, const void *data,
                                         wf_tensor **out);

/* wf_tensor_create() for expressions: returns the tensor, or NULL with the reason in
 * wf_last_errmsg(). Ownership: owned by the caller. */
WF_API wf_tensor *wf_tensor_from(wf_dtype dt, wf_shape shape, const void *data);

/* Creates a tensor that reads caller memory in place: element i of dimension d is at
 * 'data' + sum(index[d] * strides[d]) elements. 'strides' NULL: contiguous row-major.
 * Negative strides are allowed; the caller keeps 'data' alive and unchanged for the
 * tensor's life (and that of anything that retains it).
 * Returns 0, WF_EINVAL or WF_ENOMEM. Ownership: '*out' is owned; 'data' is borrowed. */
WF_API WF_NODISCARD int wf_tensor_view(wf_dtype dt, wf_shape shape, const int64_t *strides,
                                       const void *data, wf_tensor **out);

/* Adds a reference and returns 't'. NULL is returned as is. Threads: any. */
WF_API wf_tensor *wf_tensor_retain(wf_tensor *t);

/* Drops a reference; the last one frees the tensor (and its buffer, if it owns one).
 * NULL is a no-op. Threads: any. */
WF_API void wf_tensor_release(wf_tensor *t);

/* Tensor queries: the dtype, the shape and the number of elements (the product of the
 * dimensions). A NULL tensor gives WF_DTYPE_INVALID, rank 0 and 0. Threads: any. */
WF_API wf_dtype wf_tensor_dtype(const wf_tensor *t);
WF_API wf_shape wf_tensor_shape(const wf_tensor *t);
WF_API int64_t wf_tensor_numel(const wf_tensor *t);

/* The strides in elements, one per dimension (NULL for a NULL tensor).
 * Ownership: borrowed from 't'. */
WF_API const int64_t *wf_tensor_strides(const wf_tensor *t);

/* Returns true when the elements are stored densely in row-major order (a new tensor, or a
 * view whose strides are those), false for other views and for NULL. */
WF_API bool wf_tensor_is_contiguous(const wf_tensor *t);

/* The address of element 0 (borrowed, read-only: tensors are immutable). */
WF_API const void *wf_tensor_data(const wf_tensor *t);

/* wf_tensor_data() if 't' is a contiguous tensor of that dtype, else NULL. */
WF_API const float *wf_tensor_data_f32(const wf_tensor *t);
WF_API const double *wf_tensor_data_f64(const wf_tensor *t);
WF_API const int32_t *wf_tensor_data_i32(const wf_tensor *t);
WF_API const int64_t *wf_tensor_data_i64(const wf_tensor *t);

/* Copies the elements of 't', in row-major order, into 'dst' as dtype 'dt' (converting:
 * floats are rounded to nearest even, float to integer truncates toward zero, bool is
 * x != 0). 'bytes' must be at least numel * wf_dtype_size(dt).
 * Returns 0 or WF_EINVAL. Threads: any. */
WF_API WF_NODISCARD int wf_tensor_read(const wf_tensor *t, wf_dtype dt, void *dst, size_t bytes);

/* Reads element 'index' (row-major position) as a double. Returns NAN for a bad index. */
WF_API double wf_tensor_get(const wf_tensor *t, int64_t index);

/* ---- Graphs and nodes ------------------------------------------------------------------- */

typedef struct wf_graph wf_graph; /* opaque: owns its nodes */
typedef struct wf_node wf_node;   /* opaque: borrowed from its graph */

enum {
    WF_STATIC = 0, /* build, then run through a session */
    WF_EAGER = 1,  /* each node runs as it is added; its value is readable at once */
};

/* Creates an empty graph on 'rt' (its workers run eager nodes and sessions).
 * Returns the graph, or NULL with the reason in wf_last_errmsg() (NULL rt, bad mode, no
 * memory). Ownership: owned by the caller (wf_graph_destroy()). */
WF_API wf_graph *wf_graph_create(wf_runtime *rt, int mode);

/* Frees the graph, its nodes and what they retain. Sessions of the graph must be destroyed
 * first. NULL is a no-op. */
WF_API void wf_graph_destroy(wf_graph *g);

/* Returns 0, or the first error since the graph was created or wf_graph_clear_error():
 * node constructors return NULL on error and leave the code here, so a model can be built
 * and checked once at the end. A constructor given a NULL input returns NULL and keeps the
 * first error. Every constructor refuses a node whose shape has more than 2^59 elements
 * (its nonzero dimensions multiplied, -1 ones left out), or whose inference would form a
 * larger product or sum of dimensions, with WF_ESHAPE naming the shape. */
WF_API int wf_graph_status(const wf_graph *g);

/* Returns the message of the first error, naming the node, its op, where it was created
 * and the shapes involved: "matmul 'logits' (model.c:42): a is [3, 4] but b is [5, 2]".
 * "" when none. Ownership: borrowed, valid until the next call on 'g'. */
WF_API const char *wf_graph_errmsg(const wf_graph *g);

/* Forgets the first error, so building can go on after a mistake was handled. */
WF_API void wf_graph_clear_error(wf_graph *g);

/* Graph queries: the mode it was created with (WF_STATIC or WF_EAGER; WF_EINVAL for NULL),
 * its number of nodes (0 for NULL) and its runtime (borrowed; NULL for NULL). Threads: any,
 * while no thread adds nodes. */
WF_API int wf_graph_mode(const wf_graph *g);
WF_API int wf_graph_node_count(const wf_graph *g);
WF_API wf_runtime *wf_graph_runtime(const wf_graph *g);

/* Returns the node named 'name', or NULL. Ownership: borrowed. */
WF_API wf_node *wf_graph_find(const wf_graph *g, const char *name);

/* Returns node number 'i' (0 .. count-1, in creation order), or NULL. */
WF_API wf_node *wf_graph_node(const wf_graph *g, int i);

/* Node queries. Names are unique in a graph: given ones are kept (a clash is an error),
 * others are made from the op ("add_3"). */
WF_API const char *wf_node_name(const wf_node *n);
WF_API const char *wf_node_op(const wf_node *n);
WF_API wf_dtype wf_node_dtype(const wf_node *n);
WF_API wf_shape wf_node_shape(const wf_node *n);
WF_API wf_graph *wf_node_graph(const wf_node *n);
WF_API int wf_node_input_count(const wf_node *n);
WF_API wf_node *wf_node_input(const wf_node *n, int i);
/* Where the node was created ("model.c:42"), through the macros below; "?" if unknown. */
WF_API const char *wf_node_file(const wf_node *n);
WF_API int wf_node_line(const wf_node *n);

/* Renames a node. Returns 0, WF_EINVAL (NULL, empty, or a name another node has). */
WF_API WF_NODISCARD int wf_node_set_name(wf_node *n, const char *name);

/* Places a node on device 'device' of the runtime (weft/devices.h: 0 is the CPU, 1 .. n the
 * CUDA GPUs), or -1: let the session's placement decide (the default; see
 * wf_session_opts.device). Static graphs only: sessions compiled after the call see it;
 * nodes of an eager graph run on the CPU as they are created. Sources (placeholders,
 * constants, variables) hold host values; placing them only says where their readers are
 * expected. Checked when a session compiles a plan that needs the node: a device the
 * runtime does not have is WF_EINVAL, an op without a kernel for the device's kind is
 * WF_ENODEV, both naming the node and the device.
 * Returns 0, or WF_EINVAL (NULL node, device < -1) with wf_last_errmsg().
 * Threads: not while a session of the graph compiles. */
WF_API WF_NODISCARD int wf_node_set_device(wf_node *n, int device);

/* The device set with wf_node_set_device(), or -1 (none; also for NULL). */
WF_API int wf_node_device(const wf_node *n);

/* In an eager graph: the node's value (borrowed; valid while the graph lives; a variable's
 * is made from its initializer at its first read, so NULL only when there is no memory for
 * it). In a static graph: the value of a constant, else NULL. */
WF_API wf_tensor *wf_node_value(const wf_node *n);

/* Records where the next node on this thread is created. The op constructors are also
 * macros of the same name that call this first, so every node knows its file and line;
 * '(wf_add)(g, a, b)' calls the function without recording. Nested calls work: pending
 * locations form a stack and each constructor consumes the innermost one, so in
 * 'wf_add(g, wf_matmul(g, x, w), b)' both nodes get the line. */
WF_API void wf_set_source_location(const char *file, int line);
#define WF__HERE() wf_set_source_location(__FILE__, __LINE__)

/* ---- Inputs: placeholders, constants, variables ---------------------------------------- */

/* A value fed at each run. -1 dimensions match any size. Returns NULL on error. */
WF_API wf_node *wf_placeholder(wf_graph *g, const char *name, wf_dtype dt, wf_shape shape);
#define wf_placeholder(g, name, dt, shape) (WF__HERE(), (wf_placeholder)(g, name, dt, shape))

/* Boundaries between ranks: 'wf_send' sends x's value to rank 'peer', and 'wf_recv' takes
 * the value that rank 'peer' sends under the same 'edge' (0 .. 32767), of dtype 'dt' and
 * shape 'shape' (no -1). One pair per edge and step: each run of a session sends or
 * receives once, matched by the run count, so both ranks run their sessions in step. A
 * send's value is an f32 scalar 0, a token for targets and control edges. They run in a
 * session given a communicator (wf_session_opts.comm); elsewhere placement fails with
 * WF_ENODEV. A received value of another dtype or shape fails the receiving run with
 * WF_ESHAPE naming both ranks and both types; a dead peer fails it with WF_EPEER.
 * Returns the node, or NULL with the graph's error (negative peer, edge out of range, bad
 * dtype or shape). Ownership: borrowed from 'g'. */
WF_API wf_node *wf_send(wf_graph *g, wf_node *x, int peer, int edge);
#define wf_send(g, x, peer, edge) (WF__HERE(), (wf_send)(g, x, peer, edge))
/* The receiving half of a pair: see wf_send() above. Ownership: borrowed from 'g'. */
WF_API wf_node *wf_recv(wf_graph *g, wf_dtype dt, wf_shape shape, int peer, int edge);
#define wf_recv(g, dt, shape, peer, edge) (WF__HERE(), (wf_recv)(g, dt, shape, peer, edge))

/* Tensor parallelism, Megatron's pair over the ranks of the session's communicator (a group of
 * 'size' ranks: wf_session_opts.comm must have exactly that many). 'wf_tp_enter' is the
 * identity; its gradient is the all-reduce (sum) of the incoming gradient over the group.
 * 'wf_tp_reduce' is the all-reduce (sum) of x over the group: every rank gets the rank-ordered
 * sum x_0 + x_1 + ... + x_{size-1} (added in that order, so every rank gets the same bits
 * whatever the arrival order); its gradient is the identity. x is f32 or f64 of any shape, the
 * same on every rank (another size fails the run naming both ranks). 'edge' (0 .. 32767) keys
 * the messages as wf_send()'s does: a tp_reduce's edge must not be another transfer's, and a
 * tp_enter's edge is the one its gradient's all-reduce uses. Outside a session with a
 * communicator tp_reduce fails placement with WF_ENODEV. wf_tp_split_create()
 * (weft/placement.h) builds a whole split block with them. Returns the node, or NULL with the
 * graph's error (size < 1, edge out of range, another dtype). Ownership: borrowed from 'g'. */
WF_API wf_node *wf_tp_enter(wf_graph *g, wf_node *x, int size, int edge);
#define wf_tp_enter(g, x, size, edge) (WF__HERE(), (wf_tp_enter)(g, x, size, edge))
/* The all-reduce half of the pair: see wf_tp_enter() above. Ownership: borrowed from 'g'. */
WF_API wf_node *wf_tp_reduce(wf_graph *g, wf_node *x, int size, int edge);
#define wf_tp_reduce(g, x, size, edge) (WF__HERE(), (wf_tp_reduce)(g, x, size, edge))

/* A constant node. Ownership: retains 't'. Returns NULL on error. */
WF_API wf_node *wf_constant(wf_graph *g, wf_tensor *t);
#define wf_constant(g, t) (WF__HERE(), (wf_constant)(g, t))

/* A scalar constant of dtype 'dt' (f32/f64/i32/i64/bool). */
WF_API wf_node *wf_scalar(wf_graph *g, wf_dtype dt, double value);
#define wf_scalar(g, dt, value) (WF__HERE(), (wf_scalar)(g, dt, value))

/* How a variable gets its first value. The values depend only on (kind, seed, params,
 * shape), never on thread count or scheduling: element i is computed from a counter-based
 * generator (splitmix64 of seed and i). */
typedef struct wf_init {
    int kind; /* WF_INIT_* */
    uint64_t seed;
    double a, b; /* constant: a; uniform: [a, b); normal: mean a, stddev b */
    /* A shard (tensor parallelism): with part_full > 0 the tensor is the slice [part_begin,
     * part_begin + shape.dims[part_axis]) along axis part_axis of a full tensor whose
     * dims[part_axis] is part_full (the other dims are the shard's), and holds exactly the
     * values that slice of the full tensor gets from the same initializer (the same elements
     * drawn, the fans of the full shape). 0 (the constructors' default): no shard. */
    int part_axis;
    int64_t part_begin, part_full;
} wf_init;

enum {
    WF_INIT_ZEROS = 0,
    WF_INIT_ONES,
    WF_INIT_CONSTANT,
    WF_INIT_UNIFORM,
    WF_INIT_NORMAL,
    WF_INIT_GLOROT_UNIFORM, /* U(-l, l), l = sqrt(6 / (fan_in + fan_out)) */
    WF_INIT_GLOROT_NORMAL,  /* N(0, sqrt(2 / (fan_in + fan_out))) */
    WF_INIT_HE_UNIFORM,     /* U(-l, l), l = sqrt(6 / fan_in) */
    WF_INIT_HE_NORMAL,      /* N(0, sqrt(2 / fan_in)) */
};

static inline wf_init wf_init_zeros(void)
{
    wf_init r = { WF_INIT_ZEROS, 0, 0, 0, 0, 0, 0 };
    return r;
}

static inline wf_init wf_init_ones(void)
{
    wf_init r = { WF_INIT_ONES, 0, 0, 0, 0, 0, 0 };
    return r;
}

static inline wf_init wf_init_constant(double v)
{
    wf_init r = { WF_INIT_CONSTANT, 0, v, 0, 0, 0, 0 };
    return r;
}

static inline wf_init wf_init_uniform(uint64_t seed, double lo, double hi)
{
    wf_init r = { WF_INIT_UNIFORM, seed, lo, hi, 0, 0, 0 };
    return r;
}

static inline wf_init wf_init_normal(uint64_t seed, double mean, double stddev)
{
    wf_init r = { WF_INIT_NORMAL, seed, mean, stddev, 0, 0, 0 };
    return r;
}

static inline wf_init wf_init_glorot_uniform(uint64_t seed)
{
    wf_init r = { WF_INIT_GLOROT_UNIFORM, seed, 0, 0, 0, 0, 0 };
    return r;
}

static inline wf_init wf_init_glorot_normal(uint64_t seed)
{
    wf_init r = { WF_INIT_GLOROT_NORMAL, seed, 0, 0, 0, 0, 0 };
    return r;
}

static inline wf_init wf_init_he_uniform(uint64_t seed)
{
    wf_init r = { WF_INIT_HE_UNIFORM, seed, 0, 0, 0, 0, 0 };
    return r;
}

static inline wf_init wf_init_he_normal(uint64_t seed)
{
    wf_init r = { WF_INIT_HE_NORMAL, seed, 0, 0, 0, 0, 0 };
    return r;
}

/* Fills a new tensor of 'dt' and 'shape' from 'init' (fan_in is dims[0] and fan_out the
 * product of the other dims for rank 2, PyTorch's convention for [in, out] weights as
 * wf_matmul(x, w) uses them; for rank >= 3, [out, in, k...]: fan_in = in * k...,
 * fan_out = out * k...). Returns 0, WF_EINVAL or WF_ENOMEM. Ownership: '*out' is owned. */
WF_API WF_NODISCARD int wf_init_tensor(wf_init init, wf_dtype dt, wf_shape shape, wf_tensor **out);

/* 'init' for the shard [begin, begin + the shard's dims[axis]) along 'axis' of a full tensor
 * whose dims[axis] is 'full' (wf_init.part_*). A shard that does not fit in the full tensor is
 * refused where the initializer is used (WF_EINVAL naming the axis, the range and 'full'). */
static inline wf_init wf_init_part(wf_init init, int axis, int64_t begin, int64_t full)
{
    init.part_axis = axis;
    init.part_begin = begin;
    init.part_full = full;
    return init;
}

/* A named, mutable variable: its value is owned by each session (static graphs) or by the
 * graph (eager graphs), starts from 'init', and is written only by update nodes. In an eager
 * graph 'init' runs when the value is first needed (an op reads it, wf_node_value()), so a
 * wf_variable_set() before that costs no initialisation.
 * Returns NULL on error (a -1 dimension, an unnamed variable, a name in use). */
WF_API wf_node *wf_variable(wf_graph *g, const char *name, wf_dtype dt, wf_shape shape,
                            wf_init init);
#define wf_variable(g, name, dt, shape, init) (WF__HERE(), (wf_variable)(g, name, dt, shape, init))

/* Sets the value of variable 'var' of an EAGER graph to 'value' (same dtype and shape),
 * which the graph retains without copying: an update that finds nobody else holding it
 * writes it in place, else it copies first, so the caller's tensor never changes under it.
 * For eager training loops that build a graph per step and carry the variables over (a
 * session's variables are set with wf_session_assign()). Returns 0, or WF_EINVAL (not a
 * variable of an eager graph, NULL), WF_EDTYPE or WF_ESHAPE, with the reason in
 * wf_last_errmsg(); the graph's error state is not touched. */
WF_API WF_NODISCARD int wf_variable_set(wf_node *var, wf_tensor *value);

#ifdef __cplusplus
}
#endif
#endif /* WEFT_CORE_H */
