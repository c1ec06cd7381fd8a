/* tests/grad/grad_random_ops.h: the ops the randomized gradient checker draws
 * (test_grad_random.c): every op of the registry that has a gradient and a public
 * constructor. test_grad_random.c checks that its fixed CI seeds draw each of them;
 * test_internal_grad_ops.c checks that the list is exactly the registry's differentiable ops
 * (less the internal ones only gradients make), so an op added to ops/ with a gradient fails
 * that test until the checker draws it.
 * Not here: the generator itself (test_grad_random.c). */
#ifndef WF_TESTS_GRAD_RANDOM_OPS_H
#define WF_TESTS_GRAD_RANDOM_OPS_H

static const char *const gr_ops[] = {
    "neg",
    "abs",
    "exp",
    "log",
    "sqrt",
    "rsqrt",
    "square",
    "tanh",
    "sigmoid",
    "relu",
    "leaky_relu",
    "gelu",
    "gelu_tanh",
    "silu",
    "cast",
    "add",
    "sub",
    "mul",
    "div",
    "pow",
    "maximum",
    "minimum",
    "where",
    "sum",
    "mean",
    "max",
    "min",
    "prod",
    "logsumexp",
    "matmul",
    "softmax",
    "log_softmax",
    "softmax_cross_entropy",
    "reshape",
    "expand_dims",
    "squeeze",
    "transpose",
    "slice",
    "split",
    "concat",
    "stack",
    "pad",
    "broadcast_to",
    "gather",
    "scatter_add",
    "slice_backward",
    "conv2d",
    "max_pool2d",
    "avg_pool2d",
    "layer_norm",
    "dropout",
};

/* Ops with a gradient that no public constructor makes: gradients make them, so the checker
 * reaches them through the gradients it builds (and second derivatives are not drawn). */
static const char *const gr_internal_ops[] = { "unreduce", "reshape_like", "sum_like" };

#endif /* WF_TESTS_GRAD_RANDOM_OPS_H */
