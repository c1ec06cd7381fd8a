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
 *   axis (non-negative). The others read none. The grad slot of every def is NULL for now:
 *   grad/ fills it (the autodiff issue).
 * WF_OP_INPLACE (unary ops, arithmetic binary ops): the kernel may write over input 0 only
 *   when input 0 has the output's shape and dtype: a broadcast input (a [3] added to a
 *   [2, 3]) is smaller than the output, so the memory planner checks the shape too.
 * Not here: the constructors (ops/elementwise.c, reduce.c, matmul.c, softmax.c), the kernels
 *   (ops/kernels.h). */
#ifndef WF_OPS_TABLE_H
#define WF_OPS_TABLE_H

#include "../core/op.h"

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
/* Matrix products (ops/matmul.c). */
extern const wf_op_def wf_op_matmul;
/* Softmax and losses (ops/softmax.c). */
extern const wf_op_def wf_op_softmax, wf_op_log_softmax, wf_op_softmax_cross_entropy;
/* Shape ops (ops/shape.c; attributes listed in its header). */
extern const wf_op_def wf_op_reshape, wf_op_expand_dims, wf_op_squeeze, wf_op_transpose,
    wf_op_slice, wf_op_split, wf_op_concat, wf_op_stack, wf_op_pad, wf_op_broadcast_to;
/* Indexing (ops/index.c). */
extern const wf_op_def wf_op_gather, wf_op_one_hot;
/* Convolution and pooling (ops/conv.c, ops/pool.c). */
/* Normalization, dropout and backward helpers (ops/norm.c, ops/dropout.c, ops/backward.c). */

/* Every op def of ops/, in the order above; no NULL entries. */
extern const wf_op_def *const wf__ops_table[];
extern const size_t wf__ops_table_len;

/* wf__op_find() over core's built-ins and wf__ops_table: the def named 'name', or NULL. */
const wf_op_def *wf__ops_find(const char *name);

#endif /* WF_OPS_TABLE_H */
