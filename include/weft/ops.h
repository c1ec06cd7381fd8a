/* weft/ops.h: the op constructors: elementwise math and activations, binary arithmetic and
 * comparisons with broadcasting, where, cast, reductions, matrix products, softmax and the
 * cross-entropy loss, shape ops (reshape, transpose, slice, split, concat, stack, pad,
 * broadcast_to, expand_dims, squeeze) and indexing (gather, one_hot).
 * Owns: the public contract of ops/: what each constructor adds to a graph, the dtypes it
 *   takes, the dtype and shape of its node, and how it fails.
 * Shared by every constructor below:
 * - Each adds one node to 'g' (the graph of its inputs), infers its dtype and shape at once
 *   and, in a WF_EAGER graph, computes its value at once (wf_node_value()).
 * - Returns the node (borrowed from 'g'), or NULL with the graph's first error set
 *   (wf_graph_status(), wf_graph_errmsg()): WF_ESHAPE (shapes that do not fit), WF_EDTYPE
 *   (a dtype the op does not take, or two inputs of different dtypes), WF_EINVAL (a bad
 *   axis or attribute, a NULL input, an input of another graph), WF_ENOMEM. The message
 *   names the op, the node, the file:line of the call and every shape involved:
 *   "matmul 'matmul_4' (model.c:42): a is [3, 4] but b is [5, 2]: inner dimensions 4 and 5
 *   differ". An input that is NULL because an earlier constructor failed makes the call
 *   return NULL and keeps that first error, so a model can be built and checked once.
 * - No implicit promotion: inputs that combine (a and b of a binary op, where's a and b,
 *   matmul's a and b) must have equal dtypes, else WF_EDTYPE naming both; convert one with
 *   wf_cast(). Comparisons give bool; argmax gives i64; everything else keeps its input's
 *   dtype.
 * - Broadcasting follows NumPy. A -1 dimension (a placeholder's "any size") flows through
 *   inference: [-1, 784] x [784, 10] is [-1, 10], and + [10] stays [-1, 10].
 * - bf16 and f16 are computed in f32 and rounded on store (weft/core.h).
 * - Every constructor is also a macro of the same name that records the caller's file and
 *   line first (wf_set_source_location() in weft/core.h); '(wf_add)(g, a, b)' skips that.
 * Ownership (all): the node is borrowed from 'g'; inputs and 'axes' are not kept.
 * Threads (all): one thread at a time per graph.
 * Not here: gradients and optimizers (weft/grad.h), sessions (weft/runtime.h); convolutions,
 *   pooling, normalization and dropout (later). */
#ifndef WEFT_OPS_H
#define WEFT_OPS_H

#include <weft/base.h>
#include <weft/core.h>

#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Elementwise: unary ----------------------------------------------------------------- */

/* y = f(x), same dtype and shape. Floating dtypes (f32, f64, bf16, f16) for all; i32 and i64
 * also for wf_neg, wf_abs, wf_square, wf_relu and wf_sign (integer neg and abs wrap:
 * abs(INT32_MIN) is INT32_MIN). */
WF_API wf_node *wf_neg(wf_graph *g, wf_node *x);
WF_API wf_node *wf_abs(wf_graph *g, wf_node *x);
WF_API wf_node *wf_exp(wf_graph *g, wf_node *x);
WF_API wf_node *wf_log(wf_graph *g, wf_node *x);
WF_API wf_node *wf_sqrt(wf_graph *g, wf_node *x);
WF_API wf_node *wf_rsqrt(wf_graph *g, wf_node *x); /* 1 / sqrt(x) */
WF_API wf_node *wf_square(wf_graph *g, wf_node *x);
WF_API wf_node *wf_tanh(wf_graph *g, wf_node *x);
WF_API wf_node *wf_sigmoid(wf_graph *g, wf_node *x); /* 1 / (1 + exp(-x)), stable */
WF_API wf_node *wf_relu(wf_graph *g, wf_node *x);    /* max(x, 0); NaN stays NaN */
WF_API wf_node *wf_silu(wf_graph *g, wf_node *x);    /* x * sigmoid(x) */
WF_API wf_node *wf_sign(wf_graph *g, wf_node *x);    /* -1, 0 or 1; NaN stays NaN */
/* x < 0 ? alpha * x : x. */
WF_API wf_node *wf_leaky_relu(wf_graph *g, wf_node *x, double alpha);
/* 0.5 x (1 + erf(x / sqrt(2))), or with 'approximate_tanh' the tanh form
 * 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))) (two ops: "gelu" and "gelu_tanh"). */
WF_API wf_node *wf_gelu(wf_graph *g, wf_node *x, bool approximate_tanh);

#define wf_neg(g, x)               (WF__HERE(), (wf_neg)(g, x))
#define wf_abs(g, x)               (WF__HERE(), (wf_abs)(g, x))
#define wf_exp(g, x)               (WF__HERE(), (wf_exp)(g, x))
#define wf_log(g, x)               (WF__HERE(), (wf_log)(g, x))
#define wf_sqrt(g, x)              (WF__HERE(), (wf_sqrt)(g, x))
#define wf_rsqrt(g, x)             (WF__HERE(), (wf_rsqrt)(g, x))
#define wf_square(g, x)            (WF__HERE(), (wf_square)(g, x))
#define wf_tanh(g, x)              (WF__HERE(), (wf_tanh)(g, x))
#define wf_sigmoid(g, x)           (WF__HERE(), (wf_sigmoid)(g, x))
#define wf_relu(g, x)              (WF__HERE(), (wf_relu)(g, x))
#define wf_silu(g, x)              (WF__HERE(), (wf_silu)(g, x))
#define wf_sign(g, x)              (WF__HERE(), (wf_sign)(g, x))
#define wf_leaky_relu(g, x, alpha) (WF__HERE(), (wf_leaky_relu)(g, x, alpha))
#define wf_gelu(g, x, approx_tanh) (WF__HERE(), (wf_gelu)(g, x, approx_tanh))

/* y = x converted to 'dtype' (any pair of dtypes; same shape). Floating to integer truncates
 * toward zero and saturates (NaN gives 0); integer to a narrower integer wraps; anything to
 * bool is x != 0; to bf16 and f16 rounds to nearest even. */
WF_API wf_node *wf_cast(wf_graph *g, wf_node *x, wf_dtype dtype);
#define wf_cast(g, x, dtype) (WF__HERE(), (wf_cast)(g, x, dtype))

/* ---- Elementwise: binary, with broadcasting ------------------------------------------------ */

/* y = a op b: a and b have equal dtypes and broadcastable shapes; y has their dtype and the
 * broadcast shape. Floating dtypes for all; i32 and i64 also for add, sub, mul, div, maximum
 * and minimum (add, sub and mul wrap; div truncates toward zero, and an integer division by
 * zero fails when the node runs). maximum and minimum propagate NaN. */
WF_API wf_node *wf_add(wf_graph *g, wf_node *a, wf_node *b);
WF_API wf_node *wf_sub(wf_graph *g, wf_node *a, wf_node *b);
WF_API wf_node *wf_mul(wf_graph *g, wf_node *a, wf_node *b);
WF_API wf_node *wf_div(wf_graph *g, wf_node *a, wf_node *b);
WF_API wf_node *wf_pow(wf_graph *g, wf_node *a, wf_node *b);
WF_API wf_node *wf_maximum(wf_graph *g, wf_node *a, wf_node *b);
WF_API wf_node *wf_minimum(wf_graph *g, wf_node *a, wf_node *b);

#define wf_add(g, a, b)     (WF__HERE(), (wf_add)(g, a, b))
#define wf_sub(g, a, b)     (WF__HERE(), (wf_sub)(g, a, b))
#define wf_mul(g, a, b)     (WF__HERE(), (wf_mul)(g, a, b))
#define wf_div(g, a, b)     (WF__HERE(), (wf_div)(g, a, b))
#define wf_pow(g, a, b)     (WF__HERE(), (wf_pow)(g, a, b))
#define wf_maximum(g, a, b) (WF__HERE(), (wf_maximum)(g, a, b))
#define wf_minimum(g, a, b) (WF__HERE(), (wf_minimum)(g, a, b))

/* y = a cmp b, bool, with broadcasting: a and b have equal dtypes (any dtype). NaN compares
 * unequal to everything (wf_ne gives true). */
WF_API wf_node *wf_eq(wf_graph *g, wf_node *a, wf_node *b);
WF_API wf_node *wf_ne(wf_graph *g, wf_node *a, wf_node *b);
WF_API wf_node *wf_lt(wf_graph *g, wf_node *a, wf_node *b);
WF_API wf_node *wf_le(wf_graph *g, wf_node *a, wf_node *b);
WF_API wf_node *wf_gt(wf_graph *g, wf_node *a, wf_node *b);
WF_API wf_node *wf_ge(wf_graph *g, wf_node *a, wf_node *b);

#define wf_eq(g, a, b) (WF__HERE(), (wf_eq)(g, a, b))
#define wf_ne(g, a, b) (WF__HERE(), (wf_ne)(g, a, b))
#define wf_lt(g, a, b) (WF__HERE(), (wf_lt)(g, a, b))
#define wf_le(g, a, b) (WF__HERE(), (wf_le)(g, a, b))
#define wf_gt(g, a, b) (WF__HERE(), (wf_gt)(g, a, b))
#define wf_ge(g, a, b) (WF__HERE(), (wf_ge)(g, a, b))

/* y = cond ? a : b elementwise: 'cond' is bool; a and b have equal dtypes (any dtype); the
 * three shapes broadcast to y's. */
WF_API wf_node *wf_where(wf_graph *g, wf_node *cond, wf_node *a, wf_node *b);
#define wf_where(g, cond, a, b) (WF__HERE(), (wf_where)(g, cond, a, b))

/* ---- Reductions ------------------------------------------------------------------------- */

/* Reduces 'x' over 'axes[0 .. n_axes-1]' (negative counts from the end; each axis at most
 * once; 'axes' NULL or 'n_axes' 0: every axis). 'keepdims': reduced axes stay as size 1,
 * else they are dropped (every axis without keepdims gives a scalar).
 * dtypes: sum, prod, max, min and argmax take floating dtypes, i32 and i64 (integer sums and
 * products wrap); mean and logsumexp floating only. y has x's dtype, except argmax: i64, the
 * row-major position of the first maximum inside the reduced sub-block (for one axis, the
 * index along it). Floating sums accumulate in f64. max, min and argmax propagate NaN.
 * Reducing an empty range gives 0 (sum), 1 (prod), NaN (mean), -inf (logsumexp), and fails
 * when the node runs for max, min and argmax.
 * Errors: WF_EINVAL for an axis out of range or repeated, or 'n_axes' < 0 or above the rank.
 * Pass 'axes' as a named array ('const int ax[] = { 0, 2 };'): the commas of a compound
 * literal would split the macro's arguments. */
WF_API wf_node *wf_reduce_sum(wf_graph *g, wf_node *x, const int *axes, int n_axes, bool keepdims);
WF_API wf_node *wf_reduce_mean(wf_graph *g, wf_node *x, const int *axes, int n_axes, bool keepdims);
WF_API wf_node *wf_reduce_max(wf_graph *g, wf_node *x, const int *axes, int n_axes, bool keepdims);
WF_API wf_node *wf_reduce_min(wf_graph *g, wf_node *x, const int *axes, int n_axes, bool keepdims);
WF_API wf_node *wf_reduce_prod(wf_graph *g, wf_node *x, const int *axes, int n_axes, bool keepdims);
WF_API wf_node *wf_reduce_argmax(wf_graph *g, wf_node *x, const int *axes, int n_axes,
                                 bool keepdims);
WF_API wf_node *wf_reduce_logsumexp(wf_graph *g, wf_node *x, const int *axes, int n_axes,
                                    bool keepdims);

#define wf_reduce_sum(g, x, axes, n_axes, keepdims) \
    (WF__HERE(), (wf_reduce_sum)(g, x, axes, n_axes, keepdims))
#define wf_reduce_mean(g, x, axes, n_axes, keepdims) \
    (WF__HERE(), (wf_reduce_mean)(g, x, axes, n_axes, keepdims))
#define wf_reduce_max(g, x, axes, n_axes, keepdims) \
    (WF__HERE(), (wf_reduce_max)(g, x, axes, n_axes, keepdims))
#define wf_reduce_min(g, x, axes, n_axes, keepdims) \
    (WF__HERE(), (wf_reduce_min)(g, x, axes, n_axes, keepdims))
#define wf_reduce_prod(g, x, axes, n_axes, keepdims) \
    (WF__HERE(), (wf_reduce_prod)(g, x, axes, n_axes, keepdims))
#define wf_reduce_argmax(g, x, axes, n_axes, keepdims) \
    (WF__HERE(), (wf_reduce_argmax)(g, x, axes, n_axes, keepdims))
#define wf_reduce_logsumexp(g, x, axes, n_axes, keepdims) \
    (WF__HERE(), (wf_reduce_logsumexp)(g, x, axes, n_axes, keepdims))

/* The short forms: over every axis, to a scalar ('wf_mean(g, loss)'). */
WF_API wf_node *wf_sum(wf_graph *g, wf_node *x);
WF_API wf_node *wf_mean(wf_graph *g, wf_node *x);
WF_API wf_node *wf_max(wf_graph *g, wf_node *x);
WF_API wf_node *wf_min(wf_graph *g, wf_node *x);
WF_API wf_node *wf_prod(wf_graph *g, wf_node *x);
WF_API wf_node *wf_logsumexp(wf_graph *g, wf_node *x);
/* argmax along one axis (negative counts from the end), which is dropped: the i64 index of
 * the first maximum along 'axis' (wf_argmax(g, logits, -1) gives each example's class). */
WF_API wf_node *wf_argmax(wf_graph *g, wf_node *x, int axis);

#define wf_sum(g, x)          (WF__HERE(), (wf_sum)(g, x))
#define wf_mean(g, x)         (WF__HERE(), (wf_mean)(g, x))
#define wf_max(g, x)          (WF__HERE(), (wf_max)(g, x))
#define wf_min(g, x)          (WF__HERE(), (wf_min)(g, x))
#define wf_prod(g, x)         (WF__HERE(), (wf_prod)(g, x))
#define wf_logsumexp(g, x)    (WF__HERE(), (wf_logsumexp)(g, x))
#define wf_argmax(g, x, axis) (WF__HERE(), (wf_argmax)(g, x, axis))

/* ---- Matrix products -------------------------------------------------------------------- */

/* y = op(a) @ op(b), op(t) = t transposed (its last two axes) when the flag is set. a is
 * [..., M, K] ([..., K, M] transposed) and b [..., K, N] ([..., N, K]); both have rank >= 2
 * (no 1-D vectors: make them [1, K] or [K, 1]); the batch axes broadcast as in NumPy, and y
 * is [..., M, N]. a and b have equal floating dtypes (f32, f64, bf16, f16); y has it too.
 * Errors: WF_ESHAPE when the inner dimensions differ, a rank is below 2, or the batch axes
 * do not broadcast; WF_EDTYPE for other dtypes or different ones. */
WF_API wf_node *wf_matmul(wf_graph *g, wf_node *a, wf_node *b);
WF_API wf_node *wf_matmul_ex(wf_graph *g, wf_node *a, wf_node *b, bool transpose_a,
                             bool transpose_b);
#define wf_matmul(g, a, b) (WF__HERE(), (wf_matmul)(g, a, b))
#define wf_matmul_ex(g, a, b, transpose_a, transpose_b) \
    (WF__HERE(), (wf_matmul_ex)(g, a, b, transpose_a, transpose_b))

/* ---- Softmax and losses ----------------------------------------------------------------- */

/* y = softmax(x) along 'axis' (negative counts from the end): exp(x - max) / sum, with the
 * maximum subtracted first (stable for any input). Floating dtypes, rank >= 1; y has x's
 * dtype and shape. */
WF_API wf_node *wf_softmax(wf_graph *g, wf_node *x, int axis);
/* y = log(softmax(x)) along 'axis', computed as x - max - log(sum(exp(x - max))). */
WF_API wf_node *wf_log_softmax(wf_graph *g, wf_node *x, int axis);
/* Per-example loss: y[i] = -log(softmax(logits[i, :])[labels[i]]) over the last axis of
 * 'logits' [..., C] (floating); 'labels' [...] are class indices (i32 or i64) and y is [...]
 * with the logits' dtype; take wf_mean() of it for the batch loss. A label outside [0, C)
 * fails when the node runs (WF_EINVAL naming the example and the label).
 * Errors: WF_ESHAPE unless labels' shape is logits' without its last axis. */
WF_API wf_node *wf_softmax_cross_entropy(wf_graph *g, wf_node *logits, wf_node *labels);

#define wf_softmax(g, x, axis)     (WF__HERE(), (wf_softmax)(g, x, axis))
#define wf_log_softmax(g, x, axis) (WF__HERE(), (wf_log_softmax)(g, x, axis))
#define wf_softmax_cross_entropy(g, logits, labels) \
    (WF__HERE(), (wf_softmax_cross_entropy)(g, logits, labels))

/* ---- Shape ops ------------------------------------------------------------------------- */

/* Every shape op keeps x's dtype (any dtype), moves elements bit-exactly, and gives a fresh
 * contiguous tensor (a copy, never a view of x: strided inputs read correctly either way).
 * A -1 dimension (placeholder) flows through where the result does not depend on it.
 * Errors name the op, the node, the file:line and every shape involved. Pass arrays ('perm',
 * 'begin', 'xs', ...) as named arrays: the commas of a compound literal would split the macro's
 * arguments. */

/* y = x with shape 'shape' in row-major order. One dimension may be -1: it is inferred
 * from x's element count. Errors: WF_ESHAPE when the counts differ (or -1 cannot be
 * inferred), WF_EINVAL for two -1 or another negative dimension. */
WF_API wf_node *wf_reshape(wf_graph *g, wf_node *x, wf_shape shape);
/* y = x with axes permuted: y.dims[d] = x.dims[perm[d]]; 'perm' has n = rank entries
 * (negative count from the end). 'perm' NULL (or n 0): the axes reversed (the matrix
 * transpose for rank 2, NumPy's default). Errors: WF_EINVAL unless perm is a permutation. */
WF_API wf_node *wf_transpose(wf_graph *g, wf_node *x, const int *perm, int n);
/* y = x[begin[d]:end[d]:step[d], ...] with NumPy semantics per axis: negative begin/end count
 * from the end, out-of-range ones clamp, negative steps walk backwards, an empty range gives
 * size 0. Each array has rank entries; NULL means the default per axis: step 1; begin the
 * first element in the step's direction; end past the last (INT64_MAX / INT64_MIN do the same
 * for either sign). Errors: WF_EINVAL for a step of 0. */
WF_API wf_node *wf_slice(wf_graph *g, wf_node *x, const int64_t *begin, const int64_t *end,
                         const int64_t *step);
/* Splits x into 'n_parts' equal parts along 'axis', written to 'outs[0 .. n_parts-1]'. Core
 * nodes have one output, so this adds 'n_parts' nodes of op "split" (each one part; all
 * with the caller's file:line). Returns 0, or the graph's error with every 'outs' entry
 * NULL: WF_ESHAPE when the axis's size is not a multiple of n_parts, WF_EINVAL for a bad
 * axis, n_parts < 1 or a NULL 'outs' (then no node is added). */
WF_API WF_NODISCARD int wf_split(wf_graph *g, wf_node *x, int axis, int n_parts, wf_node **outs);
/* y = xs[0 .. n-1] joined along 'axis' (negative counts from the end): equal dtypes and
 * ranks (>= 1), equal dimensions off the axis. Errors: WF_EDTYPE, WF_ESHAPE, WF_EINVAL (bad
 * axis, n < 1). */
WF_API wf_node *wf_concat(wf_graph *g, wf_node *const *xs, int n, int axis);
/* y = xs[0 .. n-1] (equal dtypes and shapes) stacked along a new axis 'axis' in
 * [-(rank+1), rank]. */
WF_API wf_node *wf_stack(wf_graph *g, wf_node *const *xs, int n, int axis);
/* y = x with before[d] and after[d] elements of 'value' (converted to x's dtype) added on
 * each side of axis d (rank entries each; NULL: zeros). Errors: WF_EINVAL for a negative
 * amount. */
WF_API wf_node *wf_pad(wf_graph *g, wf_node *x, const int64_t *before, const int64_t *after,
                       double value);
/* y = x broadcast to 'shape' (NumPy rules: x's rank at most shape's; each of x's dimensions
 * is 1 or equal to the target's). Errors: WF_ESHAPE, WF_EINVAL (negative target). */
WF_API wf_node *wf_broadcast_to(wf_graph *g, wf_node *x, wf_shape shape);
/* y = x with a new size-1 axis at 'axis' in [-(rank+1), rank]. */
WF_API wf_node *wf_expand_dims(wf_graph *g, wf_node *x, int axis);
/* y = x without axis 'axis' (negative counts from the end), which must have size 1
 * (WF_ESHAPE otherwise); 'axis' WF_SQUEEZE_ALL drops every size-1 axis (none: a copy). -1 is
 * the last axis, as everywhere, not "all". */
WF_API wf_node *wf_squeeze(wf_graph *g, wf_node *x, int axis);
#define WF_SQUEEZE_ALL (-2147483647 - 1)

#define wf_reshape(g, x, shape)             (WF__HERE(), (wf_reshape)(g, x, shape))
#define wf_transpose(g, x, perm, n)         (WF__HERE(), (wf_transpose)(g, x, perm, n))
#define wf_slice(g, x, begin, end, step)    (WF__HERE(), (wf_slice)(g, x, begin, end, step))
#define wf_split(g, x, axis, n_parts, outs) (WF__HERE(), (wf_split)(g, x, axis, n_parts, outs))
#define wf_concat(g, xs, n, axis)           (WF__HERE(), (wf_concat)(g, xs, n, axis))
#define wf_stack(g, xs, n, axis)            (WF__HERE(), (wf_stack)(g, xs, n, axis))
#define wf_pad(g, x, before, after, value)  (WF__HERE(), (wf_pad)(g, x, before, after, value))
#define wf_broadcast_to(g, x, shape)        (WF__HERE(), (wf_broadcast_to)(g, x, shape))
#define wf_expand_dims(g, x, axis)          (WF__HERE(), (wf_expand_dims)(g, x, axis))
#define wf_squeeze(g, x, axis)              (WF__HERE(), (wf_squeeze)(g, x, axis))

/* ---- Indexing ---------------------------------------------------------------------------- */

/* y = params taken at 'indices' (i32 or i64, any shape) along 'axis' (negative counts from
 * the end): y's shape is params[:axis] + indices + params[axis+1:], dtype params'. Indices
 * must be in [0, dim) (no negative indices): one outside fails when the node runs, with
 * WF_EINVAL naming its position and value. Errors: WF_EDTYPE (indices), WF_EINVAL (axis). */
WF_API wf_node *wf_gather(wf_graph *g, wf_node *params, wf_node *indices, int axis);
/* y[..., k] = (indices[...] == k), in 'dtype' (any), shape indices + [depth]; indices are
 * i32 or i64; one outside [0, depth) gives an all-zero row (TensorFlow's rule). Errors:
 * WF_EDTYPE (indices), WF_EINVAL (depth < 0, bad dtype). No gradient. */
WF_API wf_node *wf_one_hot(wf_graph *g, wf_node *indices, int64_t depth, wf_dtype dtype);

#define wf_gather(g, params, indices, axis)  (WF__HERE(), (wf_gather)(g, params, indices, axis))
#define wf_one_hot(g, indices, depth, dtype) (WF__HERE(), (wf_one_hot)(g, indices, depth, dtype))

#ifdef __cplusplus
}
#endif
#endif /* WEFT_OPS_H */
