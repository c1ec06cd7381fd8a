/* ops/internal.h: helpers shared by the op files of ops/ (elementwise.c, reduce.c, matmul.c,
 * softmax.c, table.c); never included from another folder.
 * Owns: the bridge from core's kernel convention (wf_kernel_ctx, a node, input tensors) to
 *   the CPU entries of ops/kernels.h (wf_kctx, attributes, tensors), the cost helpers, and
 *   the small shape and dtype checks that several inference functions share.
 * Invariant: inference functions write messages without the node's name ("a is [3, 4] but b
 *   is [5, 2]"); core prefixes "<op> '<name>' (<file>:<line>): " (core/op.h, wf_infer_fn).
 * Not here: the op defs' table (table.h), the kernels (kernels.h). */
#ifndef WF_OPS_INTERNAL_H
#define WF_OPS_INTERNAL_H

#include "../core/graph.h"
#include "../core/op.h"
#include "kernels.h"
#include "table.h"

#include <weft/core.h>
#include <weft/nn.h>
#include <weft/ops.h> /* the constructors' declarations carry WF_API (exported) */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The kernels' context for core's. */
static inline wf_kctx wf__ops_kctx(const wf_kernel_ctx *ctx)
{
    wf_kctx k = { ctx ? wf__kernel_par_rt(ctx->rt) : NULL, ctx ? ctx->step : 0 };
    return k;
}

/* Elements of 's' with -1 dimensions counted as 1 (core/op.h's rule for costs). */
double wf__ops_numel(wf_shape s);

/* Bytes of every input of 'n' plus its output, -1 dimensions counted as 1. */
double wf__ops_bytes(const wf_node *n);

/* Cost of an elementwise node: 'per_elem' flops per output element, wf__ops_bytes(). */
void wf__ops_cost_elementwise(const wf_node *n, double per_elem, double *flops, double *bytes);

/* True for f32, f64, bf16, f16 (and, with 'ints', i32 and i64). */
bool wf__ops_dtype_ok(wf_dtype dt, bool ints);

/* Writes "x is i32 [4]; exp takes f32, f64, bf16 or f16" (the dtype of input 0 and the shapes
 * of inputs 0 .. n_in-1; 'ints': the op also takes i32 and i64) into 'err' and returns
 * WF_EDTYPE. */
int wf__ops_bad_dtype(const wf_node *n, int n_in, const char *what, bool ints, char *err,
                      size_t errlen);

/* Two dimensions that must be equal: equal, or one of them -1 (unknown until fed). */
static inline bool wf__ops_dims_fit(int64_t a, int64_t b)
{
    return a == b || a == -1 || b == -1;
}

#endif /* WF_OPS_INTERNAL_H */
