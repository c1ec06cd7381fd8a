/* ops/scalar.h: the elementwise kernels' per-element loops, for code of ops/ that must compute
 * exactly the bits those kernels compute: the fused elementwise kernel (fused_cpu.c) and GEMM
 * epilogues (a bias add and an activation over a matmul's output tile). A module interface
 * of ops/ (not installed, not internal.h).
 * Owns: the loop signature (wf__ew_loop), its argument (wf__ew_arg), the lookups of the loops
 *   by (op, dtype), and wf__ew_apply_*(): those loops over plain contiguous arrays.
 * Invariants: a loop is THE function the elementwise kernel of that op and dtype runs
 *   (elementwise_cpu.c defines both), so code calling it computes the same bits. Each element
 *   is computed alone and element i is read before it is written, so 'out' may be an input
 *   (the same pointer, unit stride), and any split of a range gives the same bits.
 * dtypes: loops exist for f32 and f64 (ints where the op supports them; bool/u8 for
 *   comparisons, where and cast). bf16 and f16 have none: the kernels load those as f32, run
 *   the f32 loop and round the result to the half type, which a caller must do the same way
 *   (wf__bf16_to_f32()/wf__f32_to_bf16() of core/), or not at all.
 * Not here: the strided N-d iterator and the kernels' argument checks (elementwise_cpu.c). */
#ifndef WF_OPS_SCALAR_H
#define WF_OPS_SCALAR_H

#include "kernels.h"

#include <weft/core.h>

#include <stdint.h>

/* One run of 'n' elements: 'p[0]' is the output (unit stride), 'p[1..]' the inputs (unary: 1,
 * binary and activation gradients: 2 (x or y, then dy), where: 3 (cond, a, b), cast: 1), 's[k]'
 * the byte stride of operand k (any, 0 included; s[0] is ignored: the output has unit
 * stride); 'pos' is the index of the run's first element, for messages. 'arg' points to a
 * wf__ew_arg (NULL allowed for ops without alpha). Returns 0 or a negative wf_status with the
 * message set (integer division by zero is the only failure). */
typedef int (*wf__ew_loop)(const void *arg, char *const *p, const int64_t *s, int64_t n,
                           int64_t pos);

typedef struct wf__ew_arg {
    double alpha; /* leaky_relu and leaky_relu_grad: the slope */
} wf__ew_arg;

/* The loops, or NULL when the kernel has none for that dtype (halves: see above).
 * binary: 'dt' is the operands' dtype (comparisons write bool). cast: from 'from' to 'to'
 * (same-dtype halves are a bit copy in the kernel: NULL here). */
wf__ew_loop wf__ew_unary_loop(wf_unary_op op, wf_dtype dt);
wf__ew_loop wf__ew_binary_loop(wf_binary_op op, wf_dtype dt);
wf__ew_loop wf__ew_act_grad_loop(wf_act_grad_op op, wf_dtype dt);
wf__ew_loop wf__ew_where_loop(wf_dtype dt);
wf__ew_loop wf__ew_cast_loop(wf_dtype from, wf_dtype to);

/* The loops over plain arrays of 'n' elements of 'dt' (f32 or f64; unary and binary also i32
 * and i64 where the op takes them), for GEMM epilogues:
 *   unary:    x[i] = op(x[i]) in place;
 *   binary:   out[i] = op(a[i * sa], b[i * sb]), 'sa' and 'sb' in elements (0: broadcast one
 *             value, e.g. a bias row against one output row is 'sa' 1, 'sb' 1; a scalar 'sb'
 *             0); 'out' may be 'a' or 'b' (unit stride); not comparisons (they write bool);
 *   act_grad: out[i] = d op(x[i]) * dy[i] (x, or y for sigmoid and tanh, as the kernel).
 * Returns 0, WF_EDTYPE (no loop for that op and dtype, halves included) or the loop's status,
 * with the message set. */
int wf__ew_apply_unary(wf_unary_op op, double alpha, wf_dtype dt, void *x, int64_t n);
int wf__ew_apply_binary(wf_binary_op op, wf_dtype dt, void *out, const void *a, int64_t sa,
                        const void *b, int64_t sb, int64_t n);
int wf__ew_apply_act_grad(wf_act_grad_op op, double alpha, wf_dtype dt, void *out, const void *x,
                          const void *dy, int64_t n);

#endif /* WF_OPS_SCALAR_H */
