/* grad/update.h: the optimizers' update ops as runtime/ sees them, for optimizer fusion
 * (runtime/compile/pass_optim_fuse.c) (a module interface: not installed, not internal.h).
 * Owns: which ops are per-variable updates (wf__update_is_member), and the multi-tensor
 *   update op defs (wf__update_multi_def), one static def per number of assigned inputs.
 * The multi-tensor update: one node that does what M update nodes of one optimizer do (same
 *   op update_K, same step counter, same hyperparameter vector, same dtype), in one pass over
 *   all their elements in tiles of WF__UPDATE_TILE, one scheduled task per tile. Inputs:
 *     [w_0, state_0_1 .. state_0_{K-1}, w_1, state_1_1 .., ..., w_{M-1}, ...]  (M*K: the
 *        op's n_assign, written in place as core/op.h says),
 *     [grad_0, .., grad_{M-1}], step, hyperparameters;
 *   its value is w_0 (core/op.h: n_assign). Every element gets the arithmetic of the same
 *   loop as update_K's kernel (grad/optim_cpu.c), so the results are the same bits.
 * Why one def per n_assign: core/op.h says an op def is immutable and static and the
 *   executor reads n_assign from the def (runtime/exec.c: take_writable); a table of
 *   WF__UPDATE_MULTI_MAX defs keeps both true. A group with more assigned inputs than that is
 *   split by the pass.
 * Devices: the defs' CUDA slot (with CUDA) runs SGD, Adam and AdamW through
 *   ops/optim_cuda.cu's fused multi-tensor kernel (grad/optim_cpu.c: kernel_multi_cuda);
 *   placement keeps updates on the host in this version, so only a caller that places one
 *   there (a test) runs it.
 * Not here: building update nodes (optim.c), the fusion pass
 *   (runtime/compile/pass_optim_fuse.c). */
#ifndef WF_GRAD_UPDATE_H
#define WF_GRAD_UPDATE_H

#include "../core/op.h"

#include <stdbool.h>

/* The most assigned inputs (M*K) of one multi-tensor update node. */
#define WF__UPDATE_MULTI_MAX 256

/* Elements per tile (one task each) of a multi-tensor update. */
#define WF__UPDATE_TILE ((int64_t)1 << 16)

/* True when 'op' is a per-variable update (update_1 .. update_4) that fusion may group. */
bool wf__update_is_member(const wf_op_def *op);

/* The multi-tensor def with 'n_assign' assigned inputs (1 .. WF__UPDATE_MULTI_MAX), or
 * NULL outside that range. */
const wf_op_def *wf__update_multi_def(int n_assign);

#endif /* WF_GRAD_UPDATE_H */
