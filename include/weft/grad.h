/* weft/grad.h: automatic differentiation and training: wf_gradients (symbolic reverse mode
 * that adds backward nodes to the same graph), optimizers as update nodes (SGD with momentum
 * and Nesterov, Adam, AdamW, RMSProp, Adagrad), learning-rate schedules, clipping by global
 * norm, gradient aggregation, and wf_minimize.
 * Owns: the public contract of grad/.
 * How a training step looks: 'train = wf_minimize(g, wf_adam(1e-3), loss)' adds the gradient
 *   nodes of 'loss' with respect to every variable it depends on, one update node per
 *   variable (ordered after every other reader of that variable), and a step counter; running
 *   'train' as a target of wf_session_run() (weft/runtime.h) is one step. In a WF_EAGER graph
 *   every call computes at once: wf_gradients() gives the gradients' values (the graph is the
 *   tape) and wf_minimize() applies one step.
 * Threads (all): one thread at a time per graph.
 * Not here: the forward ops (weft/ops.h, weft/nn.h), checkpoints (weft/runtime.h). */
#ifndef WEFT_GRAD_H
#define WEFT_GRAD_H

#include <weft/base.h>
#include <weft/core.h>

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Gradients ---------------------------------------------------------------------------- */

/* Adds to 'g' the nodes computing d(sum of y's elements)/d xs[i] for i < n, and writes them to
 * 'grads[0 .. n-1]' (each of xs[i]'s dtype and shape). Gradients are summed where a value
 * fans out; broadcasting is undone (summed back to each input's shape); integer and bool
 * values carry none. An x that 'y' does not depend on gets zeros (TensorFlow's
 * UnconnectedGradients.ZERO). The backward nodes carry the file:line of the forward node they
 * differentiate, so an error in one names the user's line.
 * Errors (the graph's first error, also returned): WF_EINVAL for NULL or foreign arguments, a
 * y or x that is not floating point, or an op on the path without a gradient function
 * ("wf_gradients: op 'argsort' (node 'argsort_7', model.c:12) has no gradient"); inference
 * errors of backward nodes; WF_ENOMEM. On error 'grads' is all NULL; nodes added before the
 * error stay in the graph (they are unreachable from the fetches and cost nothing).
 * Ownership: the nodes are borrowed from 'g'. */
WF_API WF_NODISCARD int wf_gradients(wf_graph *g, wf_node *y, wf_node *const *xs, int n,
                                     wf_node **grads);

/* wf_gradients() of several outputs at once with given output gradients: the gradient of
 * sum_j <ys[j], dys[j]>. 'dys' NULL, or an entry NULL: ones (of ys[j]'s shape). */
WF_API WF_NODISCARD int wf_gradients_ex(wf_graph *g, wf_node *const *ys, wf_node *const *dys,
                                        int n_ys, wf_node *const *xs, int n, wf_node **grads);

/* ---- Aggregation -------------------------------------------------------------------------- */

/* The sum of xs[0 .. n-1] (n >= 1; equal dtypes; shapes broadcast): one node for n == 1,
 * else a balanced tree of adds (a fixed order: the same bits for any worker count). */
WF_API wf_node *wf_add_n(wf_graph *g, wf_node *const *xs, int n);
/* The mean of xs[0 .. n-1], or with 'weights' (n finite numbers, not all zero) the weighted
 * mean sum(w_i x_i) / sum(w_i): how data-parallel replicas combine their gradients. */
WF_API wf_node *wf_mean_n(wf_graph *g, wf_node *const *xs, const double *weights, int n);

/* Scales grads[0 .. n-1] by min(1, clip_norm / global_norm), global_norm = sqrt(sum over i of
 * sum(grads[i]^2)), writing the scaled gradients to 'out[0 .. n-1]' and, when 'norm' is not
 * NULL, the global-norm node to '*norm' (f32 or the grads' dtype). clip_norm > 0. Returns 0
 * or the graph's error (WF_EINVAL: bad clip_norm, mixed dtypes). */
WF_API WF_NODISCARD int wf_clip_by_global_norm(wf_graph *g, wf_node *const *grads, int n,
                                               double clip_norm, wf_node **out, wf_node **norm);

/* ---- Optimizers --------------------------------------------------------------------------- */

typedef enum wf_optimizer_kind {
    WF_OPT_SGD = 1, /* w -= lr (g + wd w); with momentum m > 0: v = m v + g', w -= lr v, or
                       Nesterov: w -= lr (g' + m v) (PyTorch's torch.optim.SGD, dampening 0) */
    WF_OPT_ADAM,    /* PyTorch's Adam: L2 weight decay added to g, bias-corrected moments */
    WF_OPT_ADAMW,   /* PyTorch's AdamW: decoupled weight decay w *= 1 - lr wd, then Adam */
    WF_OPT_RMSPROP, /* PyTorch's RMSprop: alpha (here 'rho'), eps outside the sqrt, 'centered'
                       and 'momentum' options */
    WF_OPT_ADAGRAD, /* PyTorch's Adagrad (no lr decay): sum += g^2, w -= lr g / (sqrt(sum) + eps) */
} wf_optimizer_kind;

typedef enum wf_lr_kind {
    WF_LR_CONSTANT = 0, /* lr */
    WF_LR_STEP,         /* lr * gamma^floor(step / step_size) */
    WF_LR_COSINE,       /* min_lr + (lr - min_lr) (1 + cos(pi t / T)) / 2, t = step - warmup,
                           T = total_steps - warmup; min_lr after T */
} wf_lr_kind;

/* A learning-rate schedule over the optimizer's step counter (0 for the first step). Every
 * kind first warms up linearly over 'warmup_steps' (lr (step + 1) / warmup_steps). */
typedef struct wf_lr_schedule {
    wf_lr_kind kind;
    int64_t warmup_steps; /* 0: none */
    int64_t step_size;    /* WF_LR_STEP: steps per decay (> 0) */
    double gamma;         /* WF_LR_STEP: factor per decay */
    int64_t total_steps;  /* WF_LR_COSINE: the step where min_lr is reached (> warmup) */
    double min_lr;        /* WF_LR_COSINE */
} wf_lr_schedule;

/* An optimizer: its kind and hyperparameters, a plain value (start from wf_sgd(), wf_adam(),
 * ... and change fields). Defaults are PyTorch's. */
typedef struct wf_optimizer {
    wf_optimizer_kind kind;
    double lr;                  /* > 0 */
    double momentum;            /* SGD and RMSProp: 0 = none */
    bool nesterov;              /* SGD with momentum */
    bool centered;              /* RMSProp */
    double beta1, beta2;        /* Adam, AdamW: 0.9, 0.999 */
    double rho;                 /* RMSProp's smoothing constant alpha: 0.99 */
    double eps;                 /* Adam, AdamW, RMSProp: 1e-8; Adagrad: 1e-10 */
    double weight_decay;        /* L2 (SGD, Adam, RMSProp, Adagrad) or decoupled (AdamW: 0.01) */
    double initial_accumulator; /* Adagrad: 0 */
    double clip_norm;           /* > 0: clip the gradients by global norm first */
    wf_lr_schedule schedule;    /* zero: constant lr */
} wf_optimizer;

static inline wf_optimizer wf_sgd(double lr)
{
    wf_optimizer o = {
        WF_OPT_SGD, lr, 0, false, false, 0, 0, 0, 0, 0, 0, 0, { WF_LR_CONSTANT, 0, 0, 0, 0, 0 }
    };
    return o;
}

static inline wf_optimizer wf_momentum(double lr, double momentum, bool nesterov)
{
    wf_optimizer o = wf_sgd(lr);
    o.momentum = momentum;
    o.nesterov = nesterov;
    return o;
}

static inline wf_optimizer wf_adam(double lr)
{
    wf_optimizer o = wf_sgd(lr);
    o.kind = WF_OPT_ADAM;
    o.beta1 = 0.9;
    o.beta2 = 0.999;
    o.eps = 1e-8;
    return o;
}

static inline wf_optimizer wf_adamw(double lr, double weight_decay)
{
    wf_optimizer o = wf_adam(lr);
    o.kind = WF_OPT_ADAMW;
    o.weight_decay = weight_decay;
    return o;
}

static inline wf_optimizer wf_rmsprop(double lr)
{
    wf_optimizer o = wf_sgd(lr);
    o.kind = WF_OPT_RMSPROP;
    o.rho = 0.99;
    o.eps = 1e-8;
    return o;
}

static inline wf_optimizer wf_adagrad(double lr)
{
    wf_optimizer o = wf_sgd(lr);
    o.kind = WF_OPT_ADAGRAD;
    o.eps = 1e-10;
    return o;
}

static inline wf_lr_schedule wf_lr_cosine(int64_t warmup_steps, int64_t total_steps, double min_lr)
{
    wf_lr_schedule s = { WF_LR_COSINE, warmup_steps, 0, 0, total_steps, min_lr };
    return s;
}

static inline wf_lr_schedule wf_lr_step(int64_t step_size, double gamma, int64_t warmup_steps)
{
    wf_lr_schedule s = { WF_LR_STEP, warmup_steps, step_size, gamma, 0, 0 };
    return s;
}

/* The learning rate 'opt' uses at step 'step' (0-based): what the update nodes compute. */
WF_API double wf_optimizer_lr(const wf_optimizer *opt, int64_t step);

/* Checks an optimizer's fields; returns 0 or WF_EINVAL with the field named in
 * wf_last_errmsg(). wf_minimize() and wf_apply_gradients() call it. */
WF_API WF_NODISCARD int wf_optimizer_check(const wf_optimizer *opt);

/* Adds the update of every vars[i] by grads[i] (same dtype and shape; f32 or f64) to 'g': the
 * optimizer's state as variables named "<var>/<slot>" ("fc1.weight/adam_m", zeros at start;
 * saved by checkpoints like any variable), a step counter variable "<kind>/step" (i64), one
 * update node per variable ordered
 * after every node that reads the variable (control edges: a step reads the old values), and
 * the counter's increment after all updates, which is returned: run it as a target. With
 * clip_norm > 0 the gradients are clipped by global norm first. A state variable or counter
 * of that name that exists with the right dtype and shape and that no update writes yet is
 * taken over (an eager loop that rebuilds its graph each step continues its state so);
 * otherwise new ones get a suffix ("adam/step_1", "w/adam_m_1"): two optimizers of one graph
 * (parameter groups) never share a counter or a slot.
 * Returns the step node, or NULL with the graph's first error (WF_EINVAL: a bad optimizer, a
 * vars[i] that is not a variable, a gradient of another dtype or shape). */
WF_API wf_node *wf_apply_gradients(wf_graph *g, wf_optimizer opt, wf_node *const *vars,
                                   wf_node *const *grads, int n);

/* wf_gradients() of 'loss' (a floating scalar, or any shape: its sum) with respect to every
 * floating variable it depends on, then wf_apply_gradients(). Returns the step node (run it
 * as a target), or NULL with the graph's first error (also when the loss depends on no
 * variable). */
WF_API wf_node *wf_minimize(wf_graph *g, wf_optimizer opt, wf_node *loss);

#define wf_add_n(g, xs, n)                  (WF__HERE(), (wf_add_n)(g, xs, n))
#define wf_mean_n(g, xs, weights, n)        (WF__HERE(), (wf_mean_n)(g, xs, weights, n))
#define wf_apply_gradients(g, opt, v, d, n) (WF__HERE(), (wf_apply_gradients)(g, opt, v, d, n))
#define wf_minimize(g, opt, loss)           (WF__HERE(), (wf_minimize)(g, opt, loss))

#ifdef __cplusplus
}
#endif
#endif /* WEFT_GRAD_H */
