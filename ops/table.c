/* ops/table.c: the table of every op def of ops/ (ops/table.h says how runtime/ and tools
 * use it) and lookup by name.
 * Owns: wf__ops_table, a 'static const'-style list with static storage (no mutable
 *   registry: docs/conventions.md, "State"); adding an op to ops/ means adding its def here.
 * Not here: the defs themselves (elementwise.c, reduce.c, matmul.c, softmax.c). */
#include "internal.h"

const wf_op_def *const wf__ops_table[] = {
    &wf_op_neg,
    &wf_op_abs,
    &wf_op_exp,
    &wf_op_log,
    &wf_op_sqrt,
    &wf_op_rsqrt,
    &wf_op_square,
    &wf_op_tanh,
    &wf_op_sigmoid,
    &wf_op_relu,
    &wf_op_leaky_relu,
    &wf_op_gelu,
    &wf_op_gelu_tanh,
    &wf_op_silu,
    &wf_op_sign,
    &wf_op_cast,
    &wf_op_add,
    &wf_op_sub,
    &wf_op_mul,
    &wf_op_div,
    &wf_op_pow,
    &wf_op_maximum,
    &wf_op_minimum,
    &wf_op_eq,
    &wf_op_ne,
    &wf_op_lt,
    &wf_op_le,
    &wf_op_gt,
    &wf_op_ge,
    &wf_op_where,
    &wf_op_sum,
    &wf_op_mean,
    &wf_op_max,
    &wf_op_min,
    &wf_op_prod,
    &wf_op_argmax,
    &wf_op_logsumexp,
    &wf_op_unreduce,
    &wf_op_prod_grad,
    &wf_op_matmul,
    &wf_op_softmax,
    &wf_op_log_softmax,
    &wf_op_softmax_cross_entropy,
    &wf_op_reshape,
    &wf_op_expand_dims,
    &wf_op_squeeze,
    &wf_op_transpose,
    &wf_op_slice,
    &wf_op_split,
    &wf_op_concat,
    &wf_op_stack,
    &wf_op_pad,
    &wf_op_broadcast_to,
    &wf_op_reshape_like,
    &wf_op_sum_like,
    &wf_op_gather,
    &wf_op_one_hot,
    /* Convolution and pooling (ops/conv.c, ops/pool.c). */
    &wf_op_conv2d,
    &wf_op_conv2d_backward_input,
    &wf_op_conv2d_backward_filter,
    &wf_op_max_pool2d,
    &wf_op_avg_pool2d,
    &wf_op_max_pool2d_backward,
    &wf_op_avg_pool2d_backward,
    /* Normalization, dropout and backward helpers (ops/norm.c, ops/dropout.c, ops/backward.c). */
    &wf_op_layer_norm,
    &wf_op_layer_norm_backward_input,
    &wf_op_dropout,
    &wf_op_slice_backward,
    &wf_op_relu_grad,
    &wf_op_leaky_relu_grad,
    &wf_op_gelu_grad,
    &wf_op_gelu_tanh_grad,
    &wf_op_silu_grad,
    &wf_op_sigmoid_grad,
    &wf_op_tanh_grad,
    &wf_op_scatter_add,
};

const size_t wf__ops_table_len = sizeof wf__ops_table / sizeof wf__ops_table[0];

const wf_op_def *wf__ops_find(const char *name)
{
    return wf__op_find(wf__ops_table, wf__ops_table_len, name);
}
