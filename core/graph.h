/* core/graph.h: the graph IR as the modules above core see it (ops/, grad/, placement/,
 * runtime/; a module interface: not installed, not internal.h).
 * Owns: struct wf_node (op, inputs, attributes, inferred dtype and shape, name, source
 *   location, and slots for the runtime), the attribute bag wf_attrs, adding a node of a
 *   given op (wf__node_add(): arity check, inference, naming, eager execution), control
 *   edges, and the graph's first-error state as ops' constructors use it.
 * Invariants: every field of a node is set before the node is visible (counted in the graph
 *   and findable by name); a node's 'inputs' and 'control' point only at nodes of the same
 *   graph created before it, so creation order is a topological order; 'name' is unique in
 *   the graph; 'attrs' is never NULL, never written after creation, and may be shared by
 *   nodes with equal attributes (nodes without attributes share one zeroed bag).
 *   The struct wf_graph layout is private to core/ (core/internal.h); use the accessors.
 * Not here: the op defs of ops/ (core/op.h says how they plug in), sessions and executors
 *   (runtime/), gradients (grad/). */
#ifndef WF_CORE_GRAPH_H
#define WF_CORE_GRAPH_H

#include "op.h"

#include <weft/core.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Inputs up to this count live inside the node; more go to the graph's arena. */
#define WF_NODE_INLINE_INPUTS 4

/* Attributes of a node: one fixed bag that covers every built-in op, so nodes need no
 * per-op types, passes copy and compare attributes with memcpy/memcmp (CSE: same op, same
 * inputs, equal bags), and a graph stores equal bags once. Start from '(wf_attrs){ 0 }' or
 * memset() so that padding is zero (garbage there is harmless but defeats sharing). A field
 * means what the op that reads it says; zero means "default" where the op's doc says so. */
typedef struct wf_attrs {
    /* matmul: transpose a and/or b before multiplying. */
    bool transpose_a, transpose_b;
    /* reductions (sum, mean, max, ...): keep reduced dimensions as size 1. */
    bool keepdims;
    /* reductions: the axes (n_axes 0: all); transpose: the permutation (n_axes = rank). */
    int32_t n_axes;
    int32_t axes[WF_MAX_RANK];
    /* one axis: concat, softmax, gather, argmax, one_hot (negative counts from the end). */
    int32_t axis;
    /* cast: the target dtype; placeholder, constant, variable: the value's dtype. */
    wf_dtype dtype;
    /* reshape and broadcast_to: the target shape (one -1 allowed in reshape); placeholder,
     * constant, variable: the value's shape. */
    wf_shape shape;
    /* slice, per dimension of the input (n_axes unused): [begin, end) by step; step 0 means
     * 1. */
    int64_t begin[WF_MAX_RANK], end[WF_MAX_RANK], step[WF_MAX_RANK];
    /* conv2d, pools: [h, w] stride and dilation (0 means 1), padding [top, bottom, left,
     * right], pool window [h, w], groups (0 means 1). */
    int32_t stride[2], dilation[2], padding[4], window[2];
    int32_t groups;
    /* one_hot: the depth (number of classes). */
    int64_t depth;
    /* leaky_relu: slope alpha; elu/clip and others: alpha and beta; epsilon for norms. */
    double alpha, beta, epsilon;
    /* dropout: the drop probability; with 'seed', the mask depends only on (seed, step,
     * element). */
    double rate;
    uint64_t seed;
    /* variable: how the first value is made. */
    wf_init init;
    /* send, recv (core/op.h): the other rank, and the edge number of the message's key. */
    int32_t peer, edge;
    /* copy (core/op.h): the devices the value goes from and to (placement's ids: 0 the
     * host, the runtime's devices, then simulated ones). */
    int32_t from_dev, to_dev;
} wf_attrs;

/* A source location: file (e.g. __FILE__; the graph copies it when the node is made) and
 * line; file NULL and line 0 when unknown. */
typedef struct wf_srcloc {
    const char *file;
    int line;
} wf_srcloc;

struct wf_node {
    const wf_op_def *op; /* static storage (core/op.h) */
    wf_graph *graph;
    const char *name; /* unique in the graph; in the graph's arena */
    int id;           /* creation index: wf_graph_node(graph, id) == this node */
    int n_inputs;
    wf_node **inputs; /* n_inputs entries: 'inline_inputs' or the arena */
    int n_control;
    wf_node **control;     /* "ordered after" edges: this node runs after each of these has
                              finished, without reading their values (updates after reads) */
    wf_dtype dtype;        /* inferred at creation */
    wf_shape shape;        /* inferred at creation; -1 dimensions only downstream of placeholders */
    const wf_attrs *attrs; /* never NULL; the graph's copy */
    const char *file;      /* where the node was created (the graph's copy), or NULL */
    int line;              /* 0 when unknown */
    int grad_of;           /* -1, or the id of the forward node whose gradient function made
                              this node (grad/ sets it): a pipeline puts the node on that
                              node's stage */
    /* The value: a constant's tensor (static and eager graphs); in an eager graph, every
     * node's computed value, and a variable's current value. Retained by the node; released
     * with the graph. NULL otherwise. */
    wf_tensor *value;
    /* Slots for runtime/ and placement/; core sets them to their "none" value and never
     * reads them again. */
    int device;       /* -1: not placed; else a device index of the runtime */
    int32_t rt_index; /* -1: none; e.g. the node's position in a compiled plan */
    void *rt_data;    /* NULL: none; owned by whoever set it, who must clear it */
    uint32_t rt_flags;
    uint64_t name_hash; /* of 'name', for the name table; 0: an automatic name, in no
                           slot (core/graph.c only) */
    bool is_gradient;   /* set by grad/ on what wf_gradients() returns for a variable, a node
                           that nothing else of the backward reads: the data-parallel rewrite
                           (placement/replicate.c) reduces the shards there, so what is done
                           with a gradient after it (clipping by the global norm) is global */
    wf_node *inline_inputs[WF_NODE_INLINE_INPUTS];
};

/* Adds a node of 'op' with 'inputs[0 .. n_inputs-1]' and a copy of 'attrs' (NULL: all zero)
 * to 'g', names it "<op>_<id>" (or "<op>_<id>_<k>" if that is taken), records the pending
 * source location of this thread (wf_set_source_location(), then forgets it), and runs the
 * op's inference. In an eager graph it then computes the value (the graph's eager hook, or
 * else the op's CPU kernel on this thread).
 * Returns the node, or NULL with the graph's first error set (unless it was set already):
 * NULL 'g' (the reason is then in wf_last_errmsg()), NULL or foreign input (a node of another
 * graph), wrong arity, inference failure ("<op> '<name>' (<file>:<line>): <detail>"), no
 * kernel in an eager graph, or no memory. A failed call leaves the graph as it was.
 * Ownership: the node is borrowed from 'g'; 'attrs' is copied; 'inputs' is not kept. */
wf_node *wf__node_add(wf_graph *g, const wf_op_def *op, wf_node *const *inputs, int n_inputs,
                      const wf_attrs *attrs);

/* wf__node_add() with a given name (NULL: automatic; a name in use is an error) and a given
 * source location (the pending one is neither used nor forgotten). For constructors that
 * take a name, and for constructors that add several nodes: take the location once with
 * wf__srcloc_take() and pass it to each. */
wf_node *wf__node_add_ex(wf_graph *g, const wf_op_def *op, const char *name, wf_node *const *inputs,
                         int n_inputs, const wf_attrs *attrs, wf_srcloc loc);

/* Returns this thread's innermost pending source location and forgets it ({NULL, 0} when
 * none). Pending locations are a stack (constructor macros nest: in
 * 'wf_add(g, wf_matmul(g, x, w), b)' both record one, and matmul's node is made first), so
 * the rule for every constructor that a public macro wraps is: consume exactly one pending
 * location on every path. wf__node_add(), wf__graph_fail() and wf__node_fail() each consume
 * one; a constructor that returns early without them, or that adds several nodes, calls
 * wf__srcloc_take() once itself (and passes the result to wf__node_add_ex()). A constructor
 * that consumes none leaves a stale location for a later node; one that consumes two
 * steals its caller's. */
wf_srcloc wf__srcloc_take(void);

/* Adds an "ordered after" edge: 'n' runs after 'before' has finished. Both must be of the
 * same graph and 'before' must have been created before 'n' (the graph stays acyclic by
 * construction). Adding an edge twice is a no-op.
 * Returns 0, WF_EINVAL or WF_ENOMEM (with the graph's error set as by wf__node_add()). */
int wf__node_add_control(wf_node *n, wf_node *before);

/* Records an error on 'g' (if it has none yet), formatted with 'fmt', also sets
 * wf_last_errmsg(), forgets the pending source location, and returns 'code'. For op
 * constructors that refuse their arguments before adding a node. 'g' NULL: only the
 * thread's message. */
int wf__graph_fail(wf_graph *g, int code, const char *fmt, ...) WF_PRINTF(3, 4);

/* Records an error about node 'n' on its graph as "<op> '<name>' (<file>:<line>): <detail>",
 * as wf__graph_fail() does (first error kept, thread message set, pending location
 * forgotten); returns 'code'. For kernels and passes that find a problem with an existing
 * node. 'n' NULL: only the thread's message, without a prefix. */
int wf__node_fail(wf_node *n, int code, const char *fmt, ...) WF_PRINTF(3, 4);

/* How an eager graph computes a node's value: 'fn(ctx, n)' sets n->value (owned by the node)
 * from its inputs' values, or returns a negative wf_status with the reason in
 * wf_last_errmsg(). The default (fn NULL) runs op->kernel[WF_KERNEL_CPU] on the calling
 * thread with ctx.rt = the graph's runtime. runtime/ installs its own to place eager nodes
 * on devices. */
typedef int (*wf_eager_fn)(void *ctx, wf_node *n);
void wf__graph_set_eager(wf_graph *g, wf_eager_fn fn, void *ctx);

/* Allocates 'bytes' (8-byte aligned, zeroed) from the graph's arena; freed with the graph.
 * Returns NULL on no memory (nothing recorded). For per-graph data of upper modules. */
void *wf__graph_alloc(wf_graph *g, size_t bytes);

/* Frees what the calling thread's cache of freed graph memory holds (node chunks, arena
 * blocks, small values: core/internal.h), so that it holds nothing until graphs or values
 * are freed on this thread again. A thread's cache is freed when the thread exits anyway;
 * this is for a thread that built a big graph and goes on with small ones (and for
 * wf_runtime_destroy()). */
void wf__cache_trim(void);

/* Writes the graph to 'f', one node per line in creation (topological) order:
 *   "%3 logits: f32 [?, 10] = matmul(%0 x, %2 w) after(%1 b) @ model.c:42"
 * or, with 'dot' true, as a Graphviz digraph (control edges dashed). For debugging passes
 * (dump the graph before and after each to see what a pass did). Returns 0, WF_EINVAL
 * (NULL argument) or WF_EIO (a write failed). */
int wf__graph_dump(const wf_graph *g, FILE *f, bool dot);

/* "<basename of file>:<line>" of a node, or "?" (for messages). Writes into 'buf'. */
const char *wf__node_where(const wf_node *n, char *buf, size_t size);

#endif /* WF_CORE_GRAPH_H */
