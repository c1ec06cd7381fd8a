/* ops/fused.h: the internal op 'fused_elementwise': a small program of elementwise ops run in
 * one pass over memory (a module interface of ops/ for runtime/'s fusion pass and dump: not
 * installed, not internal.h).
 * Owns: the program format (wf__fused_instr), its encoding in a node's attributes, the
 *   mapping from the elementwise op defs to instructions, and the CPU kernel's entry.
 * The program: registers 0 .. n_inputs-1 are the node's inputs (any broadcasting shapes,
 *   strided views allowed); instruction i writes register n_inputs + i from earlier
 *   registers; the last instruction's register is the output. Each instruction is the op it
 *   came from, with that op's dtype rules: it rounds to its own dtype, as the unfused node
 *   does, and runs that op's very loop (ops/scalar.h), so a fused node computes the unfused
 *   chain's bits. Constants are inputs (constant nodes), not instructions.
 * Encoding (wf_attrs has no room for pointers and a node's attributes are a plain struct):
 *   'n_axes' is the instruction count, each instruction one int64 of 'begin', 'end', 'step'
 *   (in that order, so at most 3 * WF_MAX_RANK), 'alpha' the one slope that the program's
 *   leaky_relu and leaky_relu_grad instructions share, 'dtype' the output's dtype.
 * Not here: choosing what to fuse (runtime/compile/pass_fuse.c), the loops (elementwise_cpu.c). */
#ifndef WF_OPS_FUSED_H
#define WF_OPS_FUSED_H

#include "../core/graph.h"
#include "../core/op.h"
#include "kernels.h"

#include <weft/core.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* At most as many inputs as a plan-owned node holds inline (runtime/compile/passes.c's
 * wf__pass_make()), and one instruction per int64 of begin/end/step. */
#define WF__FUSED_MAX_INPUTS 4
#define WF__FUSED_MAX_OPS    (3 * WF_MAX_RANK)

enum {
    WF__FI_UNARY = 1, /* op: wf_unary_op; a */
    WF__FI_BINARY,    /* op: wf_binary_op; a, b (broadcasting) */
    WF__FI_ACT_GRAD,  /* op: wf_act_grad_op; a (x or y), b (dy) */
    WF__FI_WHERE,     /* a (cond, bool), b, c */
    WF__FI_CAST,      /* a; to 'dtype' */
};

typedef struct wf__fused_instr {
    uint8_t kind;    /* WF__FI_* */
    uint8_t op;      /* by kind */
    uint8_t a, b, c; /* operand registers (unused ones 0) */
    uint8_t dtype;   /* the result's wf_dtype */
} wf__fused_instr;

extern const wf_op_def wf_op_fused_elementwise;

/* True when a node of op 'op' can be an instruction: sets 'out->kind' and 'out->op' (not the
 * operands nor the dtype). The op's node must still be checked for dtypes
 * (wf__fused_check()). */
bool wf__fused_classify(const wf_op_def *op, wf__fused_instr *out);

/* The name of the op an instruction came from ("add", "relu_grad"). */
const char *wf__fused_instr_name(const wf__fused_instr *ins);

/* Writes program 'ins[0 .. n-1]' with slope 'alpha' into 'a' (zeroed first). Returns 0 or
 * WF_EINVAL when it has more than WF__FUSED_MAX_OPS instructions (or none). */
int wf__fused_encode(wf_attrs *a, const wf__fused_instr *ins, int n, double alpha);

/* Reads the program of 'a' into 'ins' (room for WF__FUSED_MAX_OPS); returns the instruction
 * count, or WF_EINVAL when 'n_axes' is out of range. */
int wf__fused_decode(const wf_attrs *a, wf__fused_instr *ins);

/* Checks program 'ins[0 .. n-1]' over 'n_in' inputs of dtypes 'in_dt': operands name earlier
 * registers, each instruction's dtype follows its op's rule and the op has a loop for it
 * (ops/scalar.h: no bf16 nor f16). Returns 0 or WF_EINVAL/WF_EDTYPE with a message naming
 * the instruction in 'err'. */
int wf__fused_check(const wf__fused_instr *ins, int n, int n_in, const wf_dtype *in_dt, char *err,
                    size_t errlen);

/* Writes "fused(add, mul, relu)" for a fused node into 'buf' ('len' bytes); returns the length
 * it wanted (as snprintf), or -1 when 'n' is not a fused node. */
int wf__fused_describe(const wf_node *n, char *buf, size_t len);

/* The CPU kernel: runs the program of 'attrs' over 'in[0 .. n_in-1]' into 'out' (contiguous,
 * of the program's dtype and of the inputs' broadcast shape), in tiles across ctx->rt's
 * workers; the bits do not depend on the split. Returns 0 or a negative wf_status with the
 * message set (bad shapes, dtypes, program; an integer division by zero). */
int wf__fused_elementwise_cpu(const wf_kctx *ctx, const wf_attrs *attrs, const wf_tensor *const *in,
                              int n_in, wf_tensor *out);

#endif /* WF_OPS_FUSED_H */
