/* grad/internal.h: what the files of grad/ share: the table of gradient functions of ops/'s
 * ops, the helpers those functions use, and the optimizers' update ops.
 * Owns: wf__grad_find() (op -> gradient function), wf__grad_unbroadcast(), the scalar and
 *   "need" helpers, and the update op defs of optim_cpu.c with the layout of their
 *   hyperparameter vector.
 * Invariant: a gradient function only adds nodes with the public constructors (or ops/'s
 *   internal ones), so every backward node is an ordinary node: it has a kernel, an inferred
 *   shape, and its own gradient (second derivatives work where the ops used have one).
 * Not here: the public API (weft/grad.h). Never included from another folder. */
#ifndef WF_GRAD_INTERNAL_H
#define WF_GRAD_INTERNAL_H

#include "../core/error.h"
#include "../core/graph.h"
#include "../core/op.h"
#include "../ops/table.h"

#include <weft/grad.h>
#include <weft/nn.h>
#include <weft/ops.h>

#include <stdbool.h>
#include <stdint.h>

/* Input i of the node needs a gradient (wf_grad_fn's 'need'). */
#define WF__NEED(need, i) ((i) >= 32 || (((need) >> (i)) & 1u))

/* The gradient function of 'op': its own slot first, then grad/'s tables; NULL if none. */
wf_grad_fn wf__grad_find(const wf_op_def *op);

/* The tables of grad_math.c (elementwise and reductions) and grad_nn.c (the rest of ops/). */
typedef struct wf__grad_entry {
    const wf_op_def *op;
    wf_grad_fn fn;
} wf__grad_entry;

extern const wf__grad_entry wf__grad_math[];
extern const int wf__grad_math_len;
extern const wf__grad_entry wf__grad_nn[];
extern const int wf__grad_nn_len;
/* grad_dist.c: the distributed ops of core/ (tensor parallelism's tp_enter and tp_reduce). */
extern const wf__grad_entry wf__grad_dist[];
extern const int wf__grad_dist_len;

/* 'dx' (a gradient with the broadcast shape of node n's output) summed back to the shape of
 * n's input 'i': over the leading axes the input lacks and over the axes where it has size 1
 * and dx does not. Where a -1 dimension of the input leaves that open (it may be 1 when the
 * graph runs while another input of n is not), one sum_like node (ops/like.c) decides from
 * the run-time shapes; otherwise reduce_sum nodes, which sum the same way. Returns dx itself
 * when nothing is to sum, NULL on error (the graph's error set). */
#define WF__UNBROADCAST_PEERS 3 /* where() has the most inputs that broadcast */
wf_node *wf__grad_unbroadcast(wf_graph *g, wf_node *dx, const wf_node *n, int i);

/* A scalar constant of n's dtype. */
wf_node *wf__grad_scalar(wf_graph *g, const wf_node *like, double v);

/* The non-const node, for passing a forward node (known to be of 'g') as an input. */
static inline wf_node *wf__grad_mut(const wf_node *n)
{
    return (wf_node *)(uintptr_t)n;
}

/* ---- Optimizer update ops (optim_cpu.c) ------------------------------------------------------ */

/* The hyperparameter vector every update node takes as its last input (an f64 constant). */
enum {
    WF__HP_KIND, /* wf_optimizer_kind */
    WF__HP_LR,
    WF__HP_MOMENTUM,
    WF__HP_NESTEROV, /* 0 or 1 */
    WF__HP_CENTERED, /* 0 or 1 */
    WF__HP_BETA1,
    WF__HP_BETA2,
    WF__HP_RHO,
    WF__HP_EPS,
    WF__HP_WD,
    WF__HP_SCHED, /* wf_lr_kind */
    WF__HP_WARMUP,
    WF__HP_STEP_SIZE,
    WF__HP_GAMMA,
    WF__HP_TOTAL,
    WF__HP_MIN_LR,
    WF__HP_COUNT
};

/* Update ops: inputs [variable, its state variables (the op's n_assign in all), gradient,
 * step (the i64 counter's value before this step), hyperparameters]; the kernel writes the
 * variable and its state in place (core/op.h: n_assign). One def per number of state
 * variables; the kernel reads the kind from the hyperparameters:
 *   update_1: SGD without momentum;
 *   update_2: SGD with momentum (velocity), RMSProp (square average), Adagrad (sum);
 *   update_3: Adam and AdamW (m, v), RMSProp centered or with momentum (square average, then
 *             the gradient average or the momentum buffer);
 *   update_4: RMSProp centered with momentum (square average, gradient average, buffer). */
extern const wf_op_def wf__op_update_1, wf__op_update_2, wf__op_update_3, wf__op_update_4;
/* "increment": input a variable (i64 or i32 scalar), adds 1 in place. */
extern const wf_op_def wf__op_increment;

/* The learning rate at 'step' for hyperparameters 'hp' (WF__HP_COUNT entries). */
double wf__optim_lr(const double *hp, int64_t step);

#endif /* WF_GRAD_INTERNAL_H */
