/* ops/table.h: the op defs of ops/ and the table of them, for runtime/, grad/ and placement/
 * (a module interface: not installed, not internal.h).
 * Owns: the names of the op defs ('wf_op_<name>', each a 'const wf_op_def' with static
 *   storage, core/op.h) and 'wf__ops_table', the list of every one of them.
 * How to use it: a node's op is compared by address ('n->op == &wf_op_matmul'); a kernel is
 *   'n->op->kernel[WF_KERNEL_CPU]' (core/op.h gives the calling convention); lookup by name
 *   (loading a saved graph, tools) is wf__ops_find(), which searches core's built-ins and
 *   then this table. An op added to ops/ must be added to the table (ops/table.c); the
 *   internal test checks the table with wf__op_check_table() and that every entry has a
 *   CPU kernel and a cost.
 * Attributes each op reads (core/graph.h's wf_attrs): leaky_relu: alpha; cast: dtype;
 *   reductions (argmax included): n_axes and axes (sorted, non-negative; n_axes 0 means
 *   every axis) and keepdims; matmul: transpose_a, transpose_b; softmax and log_softmax:
 *   axis (non-negative). The others read none. The grad slot of every def is NULL: the
 *   gradients of these ops are in grad/'s table (core/op.h, wf_grad_fn).
 * WF_OP_INPLACE (unary ops, arithmetic binary ops): the kernel may write over input 0 only
 *   when input 0 has the output's shape and dtype: a broadcast input (a [3] added to a
 *   [2, 3]) is smaller than the output, so the memory planner checks the shape too.
 * Not here: the constructors (ops/elementwise.c, reduce.c, matmul.c, softmax.c), the kernels
 *   (ops/kernels.h). */
#ifndef WF_OPS_TABLE_H
#define WF_OPS_TABLE_H

#include "../core/op.h"

#include <stdbool.h>
#include <stddef.h>

/* Unary elementwise (ops/elementwise.c). */
extern const wf_op_def wf_op_neg, wf_op_abs, wf_op_exp, wf_op_log, wf_op_sqrt, wf_op_rsqrt,
    wf_op_square, wf_op_tanh, wf_op_sigmoid, wf_op_relu, wf_op_leaky_relu, wf_op_gelu,
    wf_op_gelu_tanh, wf_op_silu, wf_op_sign, wf_op_cast;
/* Binary elementwise and where (ops/elementwise.c). */
extern const wf_op_def wf_op_add, wf_op_sub, wf_op_mul, wf_op_div, wf_op_pow, wf_op_maximum,
    wf_op_minimum, wf_op_eq, wf_op_ne, wf_op_lt, wf_op_le, wf_op_gt, wf_op_ge, wf_op_where;
/* Reductions (ops/reduce.c). */
extern const wf_op_def wf_op_sum, wf_op_mean, wf_op_max, wf_op_min, wf_op_prod, wf_op_argmax,
    wf_op_logsumexp;
/* Backward helpers for grad/ (internal constructors; the public ones are in weft/ops.h):
 * unreduce (ops/reduce.c): dy, of the shape reducing x with 'reduce_attrs' (n_axes, axes,
 *   keepdims, as a reduction node holds them) gives, spread back over x's shape (taken from
 *   x's tensor when the node runs), divided by the reduced count when 'mean'; its attrs are
 *   the reduction's plus alpha 1 for mean.
 * reshape_like (ops/like.c): dy's elements, row-major, in the shape of 'ref' (from its
 *   tensor when the node runs).
 * sum_like (ops/like.c): dx, a gradient in a broadcast shape, summed back to the shape of
 *   'ref' (from its tensor when the node runs): over the leading axes ref lacks and the axes
 *   where ref has size 1 and dx does not. No CUDA kernel.
 * prod_grad (ops/reduce.c): the gradient of prod(x) over 'reduce_attrs' (n_axes, axes,
 *   keepdims) for dy of the reduced shape: dy times the product of the other elements of
 *   each element's reduced range, from prefix and suffix products (exact where x has zeros,
 *   where dy y / x is NaN). No CUDA kernel: a NULL slot keeps the node on the host. */
extern const wf_op_def wf_op_unreduce, wf_op_reshape_like, wf_op_sum_like, wf_op_prod_grad;
struct wf_attrs;
wf_node *wf__unreduce(wf_graph *g, wf_node *dy, wf_node *x, const struct wf_attrs *reduce_attrs,
                      bool mean);
wf_node *wf__reshape_like(wf_graph *g, wf_node *dy, wf_node *ref);
wf_node *wf__sum_like(wf_graph *g, wf_node *dx, wf_node *ref);
wf_node *wf__prod_grad(wf_graph *g, wf_node *x, wf_node *dy, const struct wf_attrs *reduce_attrs);
/* Matrix products (ops/matmul.c). */
extern const wf_op_def wf_op_matmul;
/* matmul with a GEMM epilogue (ops/matmul.c): a plan-only op that runtime/compile/pass_epilogue.c
 * makes; not in wf__ops_table (ops/matmul.c says why). Inputs a, b and optionally a bias row;
 * attributes: transpose_a, transpose_b, axis (the activation's wf_unary_op + 1, 0: none),
 * alpha (the activation's), groups (1: the add was bias + product). */
extern const wf_op_def wf_op_matmul_epilogue;
/* Softmax and losses (ops/softmax.c). */
extern const wf_op_def wf_op_softmax, wf_op_log_softmax, wf_op_softmax_cross_entropy;
/* Shape ops (ops/shape.c; attributes listed in its header). */
extern const wf_op_def wf_op_reshape, wf_op_expand_dims, wf_op_squeeze, wf_op_transpose,
    wf_op_slice, wf_op_split, wf_op_concat, wf_op_stack, wf_op_pad, wf_op_broadcast_to;
/* transpose (ops/shape.c): the permutation a transpose node with attributes 'a' applies to
 * an input of rank 'r', into 'perm[0..r)', every entry made non-negative (the constructor
 * keeps negative entries, which count from the end; n_axes 0: the axes reversed). False when
 * 'a' is not a permutation of r axes. Inference, the kernel and the gradient all read the
 * permutation through it. */
bool wf__transpose_perm(const struct wf_attrs *a, int r, int *perm);
/* Indexing (ops/index.c). */
extern const wf_op_def wf_op_gather, wf_op_one_hot;
/* Convolution and pooling (ops/conv.c, ops/pool.c). */
/* Attributes: stride, padding, dilation, groups (conv2d and its backward ops: stored
 *   canonical, 0 -> 1); window, stride (0 -> window), padding (pools); 'shape': x_shape of
 *   conv2d_backward_input and avg_pool2d_backward, w_shape of conv2d_backward_filter;
 *   'keepdims': count_include_pad of avg_pool2d and avg_pool2d_backward. */
extern const wf_op_def wf_op_conv2d, wf_op_conv2d_backward_input, wf_op_conv2d_backward_filter,
    wf_op_max_pool2d, wf_op_avg_pool2d, wf_op_max_pool2d_backward, wf_op_avg_pool2d_backward;
/* Normalization, dropout and backward helpers (ops/norm.c, ops/dropout.c, ops/backward.c). */
extern const wf_op_def wf_op_layer_norm, wf_op_layer_norm_backward_input, wf_op_dropout,
    wf_op_slice_backward;
/* Activation gradients (ops/elementwise.c) and scatter_add (ops/index.c); attributes:
 *   layer_norm and its backward: axis (begin axis, non-negative), epsilon, groups (layer_norm:
 *   bit 0 gamma and bit 1 beta are inputs); dropout: rate, seed; leaky_relu_grad: alpha;
 *   scatter_add: axis (non-negative when valid), depth (dim); slice_backward: shape (x's),
 *   begin, end, step (as slice). */
extern const wf_op_def wf_op_relu_grad, wf_op_leaky_relu_grad, wf_op_gelu_grad,
    wf_op_gelu_tanh_grad, wf_op_silu_grad, wf_op_sigmoid_grad, wf_op_tanh_grad, wf_op_scatter_add;
/* Fused elementwise programs (ops/fused.c): plan-only, made by runtime/compile/pass_fuse.c; like
 *   matmul_epilogue not in wf__ops_table (no constructor, no gradient, nothing names it). The
 *   program's format and its encoding in the attributes are in ops/fused.h. */
extern const wf_op_def wf_op_fused_elementwise;

/* Every op def of ops/, in the order above; no NULL entries. */
extern const wf_op_def *const wf__ops_table[];
extern const size_t wf__ops_table_len;

/* wf__op_find() over core's built-ins and wf__ops_table: the def named 'name', or NULL. */
const wf_op_def *wf__ops_find(const char *name);

#endif /* WF_OPS_TABLE_H */
