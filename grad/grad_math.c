/* grad/grad_math.c: the gradient functions of the elementwise ops (unary math, activations,
 * cast, binary arithmetic with broadcasting, where) and of the reductions.
 * Owns: wf__grad_math[], the table of those ops and their gradient functions.
 * Conventions (every function): the signature and rules of core/op.h's wf_grad_fn; 'x' and
 *   'a'/'b' are the forward inputs, 'y' the forward node itself (its value is the forward
 *   output), 'dy' the gradient flowing in. Binary ops undo broadcasting with
 *   wf__grad_unbroadcast(). Derivatives at kinks follow PyTorch: relu'(0) = 0, |x|'(0) = 0,
 *   maximum/minimum give a tie to a.
 * Not here: wf_gradients itself (gradients.c), the other ops (grad_nn.c). */
#include "internal.h"

#include <math.h>

#define GRAD_FN(name) \
    static int name(wf_graph *g, const wf_node *n, wf_node *dy, uint32_t need, wf_node **dx)

#define X0   wf__grad_mut(n->inputs[0])
#define X1   wf__grad_mut(n->inputs[1])
#define Y    wf__grad_mut(n)
#define K(v) wf__grad_scalar(g, n, (v))

/* ---- Unary ---------------------------------------------------------------------------- */

GRAD_FN(grad_neg)
{
    (void)need;
    dx[0] = wf_neg(g, dy);
    return 0;
}

GRAD_FN(grad_abs)
{
    (void)need;
    dx[0] = wf_mul(g, dy, wf_sign(g, X0));
    return 0;
}

GRAD_FN(grad_exp)
{
    (void)need;
    dx[0] = wf_mul(g, dy, Y);
    return 0;
}

GRAD_FN(grad_log)
{
    (void)need;
    dx[0] = wf_div(g, dy, X0);
    return 0;
}

GRAD_FN(grad_sqrt) /* dy / (2 sqrt(x)) */
{
    (void)need;
    dx[0] = wf_div(g, dy, wf_mul(g, Y, K(2)));
    return 0;
}

GRAD_FN(grad_rsqrt) /* -dy / 2 * x^-3/2 = -0.5 dy y^3 */
{
    (void)need;
    dx[0] = wf_mul(g, wf_mul(g, dy, K(-0.5)), wf_mul(g, Y, wf_square(g, Y)));
    return 0;
}

GRAD_FN(grad_square)
{
    (void)need;
    dx[0] = wf_mul(g, dy, wf_mul(g, X0, K(2)));
    return 0;
}

/* The activations: one fused backward op each (weft/nn.h: wf_activation_grad). */
#define ACT_GRAD(name, ACT, INPUT)                                      \
    GRAD_FN(name)                                                       \
    {                                                                   \
        (void)need;                                                     \
        dx[0] = wf_activation_grad(g, ACT, INPUT, dy, n->attrs->alpha); \
        return 0;                                                       \
    }
ACT_GRAD(grad_relu, WF_ACT_RELU, X0)
ACT_GRAD(grad_leaky_relu, WF_ACT_LEAKY_RELU, X0)
ACT_GRAD(grad_gelu, WF_ACT_GELU, X0)
ACT_GRAD(grad_gelu_tanh, WF_ACT_GELU_TANH, X0)
ACT_GRAD(grad_silu, WF_ACT_SILU, X0)
ACT_GRAD(grad_sigmoid, WF_ACT_SIGMOID, Y)
ACT_GRAD(grad_tanh, WF_ACT_TANH, Y)

GRAD_FN(grad_cast) /* back to the input's dtype; integer inputs get none (wf_gradients) */
{
    (void)need;
    dx[0] = wf_cast(g, dy, n->inputs[0]->dtype);
    return 0;
}

/* ---- Binary ---------------------------------------------------------------------------- */

GRAD_FN(grad_add)
{
    if (WF__NEED(need, 0))
        dx[0] = wf__grad_unbroadcast(g, dy, n, 0);
    if (WF__NEED(need, 1))
        dx[1] = wf__grad_unbroadcast(g, dy, n, 1);
    return 0;
}

GRAD_FN(grad_sub)
{
    if (WF__NEED(need, 0))
        dx[0] = wf__grad_unbroadcast(g, dy, n, 0);
    if (WF__NEED(need, 1))
        dx[1] = wf__grad_unbroadcast(g, wf_neg(g, dy), n, 1);
    return 0;
}

GRAD_FN(grad_mul)
{
    if (WF__NEED(need, 0))
        dx[0] = wf__grad_unbroadcast(g, wf_mul(g, dy, X1), n, 0);
    if (WF__NEED(need, 1))
        dx[1] = wf__grad_unbroadcast(g, wf_mul(g, dy, X0), n, 1);
    return 0;
}

GRAD_FN(grad_div) /* y = a / b: da = dy / b, db = -dy a / b^2 = -dy y / b */
{
    if (WF__NEED(need, 0))
        dx[0] = wf__grad_unbroadcast(g, wf_div(g, dy, X1), n, 0);
    if (WF__NEED(need, 1))
        dx[1] = wf__grad_unbroadcast(g, wf_neg(g, wf_mul(g, dy, wf_div(g, Y, X1))), n, 1);
    return 0;
}

GRAD_FN(grad_pow) /* y = a^b: da = dy b a^(b-1), db = dy y log(a) (0 where a <= 0) */
{
    if (WF__NEED(need, 0))
        dx[0] = wf__grad_unbroadcast(
            g, wf_mul(g, dy, wf_mul(g, X1, wf_pow(g, X0, wf_sub(g, X1, K(1))))), n, 0);
    if (WF__NEED(need, 1)) {
        wf_node *loga = wf_where(g, wf_gt(g, X0, K(0)), wf_log(g, X0), K(0));
        dx[1] = wf__grad_unbroadcast(g, wf_mul(g, dy, wf_mul(g, Y, loga)), n, 1);
    }
    return 0;
}

/* maximum (a >= b) and minimum (a <= b): the gradient goes to a where the test holds (ties
 * included), to b elsewhere. */
static int grad_select(wf_graph *g, const wf_node *n, wf_node *dy, uint32_t need, wf_node **dx,
                       wf_node *to_a)
{
    if (WF__NEED(need, 0))
        dx[0] = wf__grad_unbroadcast(g, wf_where(g, to_a, dy, K(0)), n, 0);
    if (WF__NEED(need, 1))
        dx[1] = wf__grad_unbroadcast(g, wf_where(g, to_a, K(0), dy), n, 1);
    return 0;
}

GRAD_FN(grad_maximum)
{
    return grad_select(g, n, dy, need, dx, wf_ge(g, X0, X1));
}

GRAD_FN(grad_minimum)
{
    return grad_select(g, n, dy, need, dx, wf_le(g, X0, X1));
}

GRAD_FN(grad_where) /* where(cond, a, b): cond (bool) gets none */
{
    wf_node *c = X0;
    if (WF__NEED(need, 1))
        dx[1] = wf__grad_unbroadcast(g, wf_where(g, c, dy, K(0)), n, 1);
    if (WF__NEED(need, 2))
        dx[2] = wf__grad_unbroadcast(g, wf_where(g, c, K(0), dy), n, 2);
    return 0;
}

/* ---- Reductions ------------------------------------------------------------------------ */

/* The reduction 'op' of 'v' with the forward node's axes and keepdims. */
static wf_node *reduce_like(wf_graph *g, const wf_node *n, const wf_op_def *op, wf_node *v)
{
    return wf__node_add(g, op, &v, 1, n->attrs);
}

GRAD_FN(grad_sum)
{
    (void)need;
    dx[0] = wf__unreduce(g, dy, X0, n->attrs, false);
    return 0;
}

GRAD_FN(grad_mean)
{
    (void)need;
    dx[0] = wf__unreduce(g, dy, X0, n->attrs, true);
    return 0;
}

/* max and min: dy shared equally among the elements equal to the result (TensorFlow's rule;
 * NaN results give NaN). */
GRAD_FN(grad_extreme)
{
    (void)need;
    wf_node *hit = wf_cast(g, wf_eq(g, X0, wf__unreduce(g, Y, X0, n->attrs, false)), n->dtype);
    wf_node *count = reduce_like(g, n, &wf_op_sum, hit);
    dx[0] = wf_mul(g, hit, wf__unreduce(g, wf_div(g, dy, count), X0, n->attrs, false));
    return 0;
}

/* dy times the product of the other elements (ops/ prod_grad: prefix and suffix products),
 * not dy y / x, which is NaN where x is 0 (TensorFlow's fast path; zeros from ReLU, padding
 * and masks are common). */
GRAD_FN(grad_prod)
{
    (void)need;
    dx[0] = wf__prod_grad(g, X0, dy, n->attrs);
    return 0;
}

GRAD_FN(grad_logsumexp) /* dy exp(x - y) */
{
    (void)need;
    dx[0] = wf_mul(g, wf__unreduce(g, dy, X0, n->attrs, false),
                   wf_exp(g, wf_sub(g, X0, wf__unreduce(g, Y, X0, n->attrs, false))));
    return 0;
}

GRAD_FN(grad_unreduce) /* the adjoint of spreading: the sum again (mean: divided by the count) */
{
    (void)need;
    wf_attrs a = *n->attrs;
    a.alpha = 0;
    dx[0] = wf__node_add(g, n->attrs->alpha != 0 ? &wf_op_mean : &wf_op_sum, &dy, 1, &a);
    return 0;
}

const wf__grad_entry wf__grad_math[] = {
    { &wf_op_neg, grad_neg },
    { &wf_op_abs, grad_abs },
    { &wf_op_exp, grad_exp },
    { &wf_op_log, grad_log },
    { &wf_op_sqrt, grad_sqrt },
    { &wf_op_rsqrt, grad_rsqrt },
    { &wf_op_square, grad_square },
    { &wf_op_tanh, grad_tanh },
    { &wf_op_sigmoid, grad_sigmoid },
    { &wf_op_relu, grad_relu },
    { &wf_op_leaky_relu, grad_leaky_relu },
    { &wf_op_gelu, grad_gelu },
    { &wf_op_gelu_tanh, grad_gelu_tanh },
    { &wf_op_silu, grad_silu },
    { &wf_op_cast, grad_cast },
    { &wf_op_add, grad_add },
    { &wf_op_sub, grad_sub },
    { &wf_op_mul, grad_mul },
    { &wf_op_div, grad_div },
    { &wf_op_pow, grad_pow },
    { &wf_op_maximum, grad_maximum },
    { &wf_op_minimum, grad_minimum },
    { &wf_op_where, grad_where },
    { &wf_op_sum, grad_sum },
    { &wf_op_mean, grad_mean },
    { &wf_op_max, grad_extreme },
    { &wf_op_min, grad_extreme },
    { &wf_op_prod, grad_prod },
    { &wf_op_logsumexp, grad_logsumexp },
    { &wf_op_unreduce, grad_unreduce },
};

const int wf__grad_math_len = (int)(sizeof wf__grad_math / sizeof wf__grad_math[0]);
