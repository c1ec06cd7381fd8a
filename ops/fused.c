/* ops/fused.c: the internal op 'fused_elementwise' (ops/fused.h): its program format, dtype
 * and shape inference, cost and op-table entry.
 * Owns: wf_op_fused_elementwise, the table from elementwise op defs to instructions, and the
 *   program's encoding in wf_attrs (fused.h says where each field goes).
 * Invariants: inference checks the whole program (operands, dtypes, loops) and the inputs'
 *   broadcast, so a node that exists can run; the kernel checks the tensors again (a -1
 *   dimension is known only then).
 * Not here: the kernels (fused_cpu.c, fused_cuda.cu), the pass that makes these nodes
 *   (runtime/compile/pass_fuse.c).
 *   There is no public constructor and no gradient: fused nodes exist only in compiled
 *   plans, made after wf_gradients() has run. */
#include "fused.h"

#include "../core/error.h"
#include "cuda_kernels.h"
#include "internal.h"
#include "scalar.h"

#include <stdio.h>
#include <string.h>

/* ---- Op defs -> instructions ---------------------------------------------------------------- */

typedef struct fuse_entry {
    const wf_op_def *def;
    uint8_t kind, op;
} fuse_entry;

static const fuse_entry entries[] = {
    { &wf_op_neg, WF__FI_UNARY, WF_UNARY_NEG },
    { &wf_op_abs, WF__FI_UNARY, WF_UNARY_ABS },
    { &wf_op_exp, WF__FI_UNARY, WF_UNARY_EXP },
    { &wf_op_log, WF__FI_UNARY, WF_UNARY_LOG },
    { &wf_op_sqrt, WF__FI_UNARY, WF_UNARY_SQRT },
    { &wf_op_rsqrt, WF__FI_UNARY, WF_UNARY_RSQRT },
    { &wf_op_square, WF__FI_UNARY, WF_UNARY_SQUARE },
    { &wf_op_tanh, WF__FI_UNARY, WF_UNARY_TANH },
    { &wf_op_sigmoid, WF__FI_UNARY, WF_UNARY_SIGMOID },
    { &wf_op_relu, WF__FI_UNARY, WF_UNARY_RELU },
    { &wf_op_leaky_relu, WF__FI_UNARY, WF_UNARY_LEAKY_RELU },
    { &wf_op_gelu_tanh, WF__FI_UNARY, WF_UNARY_GELU_TANH },
    { &wf_op_gelu, WF__FI_UNARY, WF_UNARY_GELU_ERF },
    { &wf_op_silu, WF__FI_UNARY, WF_UNARY_SILU },
    { &wf_op_sign, WF__FI_UNARY, WF_UNARY_SIGN },
    { &wf_op_add, WF__FI_BINARY, WF_BINARY_ADD },
    { &wf_op_sub, WF__FI_BINARY, WF_BINARY_SUB },
    { &wf_op_mul, WF__FI_BINARY, WF_BINARY_MUL },
    { &wf_op_div, WF__FI_BINARY, WF_BINARY_DIV },
    { &wf_op_pow, WF__FI_BINARY, WF_BINARY_POW },
    { &wf_op_maximum, WF__FI_BINARY, WF_BINARY_MAXIMUM },
    { &wf_op_minimum, WF__FI_BINARY, WF_BINARY_MINIMUM },
    { &wf_op_eq, WF__FI_BINARY, WF_BINARY_EQ },
    { &wf_op_ne, WF__FI_BINARY, WF_BINARY_NE },
    { &wf_op_lt, WF__FI_BINARY, WF_BINARY_LT },
    { &wf_op_le, WF__FI_BINARY, WF_BINARY_LE },
    { &wf_op_gt, WF__FI_BINARY, WF_BINARY_GT },
    { &wf_op_ge, WF__FI_BINARY, WF_BINARY_GE },
    { &wf_op_relu_grad, WF__FI_ACT_GRAD, WF_ACT_GRAD_RELU },
    { &wf_op_leaky_relu_grad, WF__FI_ACT_GRAD, WF_ACT_GRAD_LEAKY_RELU },
    { &wf_op_gelu_grad, WF__FI_ACT_GRAD, WF_ACT_GRAD_GELU_ERF },
    { &wf_op_gelu_tanh_grad, WF__FI_ACT_GRAD, WF_ACT_GRAD_GELU_TANH },
    { &wf_op_silu_grad, WF__FI_ACT_GRAD, WF_ACT_GRAD_SILU },
    { &wf_op_sigmoid_grad, WF__FI_ACT_GRAD, WF_ACT_GRAD_SIGMOID },
    { &wf_op_tanh_grad, WF__FI_ACT_GRAD, WF_ACT_GRAD_TANH },
    { &wf_op_where, WF__FI_WHERE, 0 },
    { &wf_op_cast, WF__FI_CAST, 0 },
};

#define N_ENTRIES ((int)(sizeof entries / sizeof entries[0]))

bool wf__fused_classify(const wf_op_def *op, wf__fused_instr *out)
{
    for (int i = 0; i < N_ENTRIES; i++)
        if (entries[i].def == op) {
            out->kind = entries[i].kind;
            out->op = entries[i].op;
            return true;
        }
    return false;
}

const char *wf__fused_instr_name(const wf__fused_instr *ins)
{
    for (int i = 0; i < N_ENTRIES; i++)
        if (entries[i].kind == ins->kind && entries[i].op == ins->op)
            return entries[i].def->name;
    return "?";
}

/* ---- Encoding --------------------------------------------------------------------------- */

static int64_t *slot(wf_attrs *a, int i)
{
    return i < WF_MAX_RANK       ? &a->begin[i]
           : i < 2 * WF_MAX_RANK ? &a->end[i - WF_MAX_RANK]
                                 : &a->step[i - 2 * WF_MAX_RANK];
}

int wf__fused_encode(wf_attrs *a, const wf__fused_instr *ins, int n, double alpha)
{
    memset(a, 0, sizeof *a); /* padding too (core/graph.h) */
    if (n < 1 || n > WF__FUSED_MAX_OPS)
        return wf__err(WF_EINVAL, "fused_elementwise: %d instructions (1 to %d)", n,
                       WF__FUSED_MAX_OPS);
    a->n_axes = n;
    a->alpha = alpha;
    for (int i = 0; i < n; i++)
        *slot(a, i) = (int64_t)((uint64_t)ins[i].kind | (uint64_t)ins[i].op << 8 |
                                (uint64_t)ins[i].a << 16 | (uint64_t)ins[i].b << 24 |
                                (uint64_t)ins[i].c << 32 | (uint64_t)ins[i].dtype << 40);
    a->dtype = (wf_dtype)ins[n - 1].dtype;
    return 0;
}

int wf__fused_decode(const wf_attrs *a, wf__fused_instr *ins)
{
    int n = a->n_axes;
    if (n < 1 || n > WF__FUSED_MAX_OPS)
        return wf__err(WF_EINVAL, "fused_elementwise: %d instructions (1 to %d)", n,
                       WF__FUSED_MAX_OPS);
    for (int i = 0; i < n; i++) {
        uint64_t v = (uint64_t)*slot((wf_attrs *)a, i);
        ins[i] = (wf__fused_instr){ (uint8_t)v,         (uint8_t)(v >> 8),  (uint8_t)(v >> 16),
                                    (uint8_t)(v >> 24), (uint8_t)(v >> 32), (uint8_t)(v >> 40) };
    }
    return n;
}

/* ---- Checks --------------------------------------------------------------------------------- */

int wf__fused_check(const wf__fused_instr *ins, int n, int n_in, const wf_dtype *in_dt, char *err,
                    size_t errlen)
{
    wf_dtype dt[WF__FUSED_MAX_INPUTS + WF__FUSED_MAX_OPS];
    if (n_in < 1 || n_in > WF__FUSED_MAX_INPUTS || n < 1 || n > WF__FUSED_MAX_OPS) {
        snprintf(err, errlen, "%d inputs and %d instructions (1 to %d and 1 to %d)", n_in, n,
                 WF__FUSED_MAX_INPUTS, WF__FUSED_MAX_OPS);
        return WF_EINVAL;
    }
    for (int k = 0; k < n_in; k++)
        dt[k] = in_dt[k];
    for (int i = 0; i < n; i++) {
        const wf__fused_instr *x = &ins[i];
        const char *name = wf__fused_instr_name(x);
        int n_ops = x->kind == WF__FI_WHERE                                  ? 3
                    : x->kind == WF__FI_BINARY || x->kind == WF__FI_ACT_GRAD ? 2
                    : x->kind == WF__FI_UNARY || x->kind == WF__FI_CAST      ? 1
                                                                             : 0;
        int r = n_in + i, reg[3] = { x->a, x->b, x->c };
        if (n_ops == 0) {
            snprintf(err, errlen, "instruction %d has kind %d", i, x->kind);
            return WF_EINVAL;
        }
        for (int k = 0; k < n_ops; k++)
            if (reg[k] >= r) {
                snprintf(err, errlen, "instruction %d (%s) reads register %d, not yet written", i,
                         name, reg[k]);
                return WF_EINVAL;
            }
        wf_dtype a = dt[x->a], b = n_ops > 1 ? dt[x->b] : a, res = a;
        bool ok = true;
        switch (x->kind) {
        case WF__FI_UNARY:
            ok = wf__ew_unary_loop((wf_unary_op)x->op, a) != NULL;
            break;
        case WF__FI_BINARY:
            ok = a == b && wf__ew_binary_loop((wf_binary_op)x->op, a) != NULL;
            res = x->op >= WF_BINARY_EQ ? WF_BOOL : a;
            break;
        case WF__FI_ACT_GRAD:
            ok = a == b && wf__ew_act_grad_loop((wf_act_grad_op)x->op, a) != NULL;
            break;
        case WF__FI_WHERE:
            ok = a == WF_BOOL && b == dt[x->c] && wf__ew_where_loop(b) != NULL;
            res = b;
            break;
        default: /* cast */
            res = (wf_dtype)x->dtype;
            ok = wf__ew_cast_loop(a, res) != NULL;
            break;
        }
        if (!ok || res != (wf_dtype)x->dtype) {
            snprintf(err, errlen,
                     "instruction %d (%s) of %s%s%s to %s: dtypes that do not fit or that it has "
                     "no loop for (bf16 and f16 are not fused)",
                     i, name, wf_dtype_name(a), n_ops > 1 ? " and " : "",
                     n_ops > 1 ? wf_dtype_name(b) : "", wf_dtype_name((wf_dtype)x->dtype));
            return WF_EDTYPE;
        }
        dt[r] = res;
    }
    return 0;
}

int wf__fused_describe(const wf_node *n, char *buf, size_t len)
{
    wf__fused_instr ins[WF__FUSED_MAX_OPS];
    int m = n && n->op == &wf_op_fused_elementwise ? wf__fused_decode(n->attrs, ins) : -1;
    if (m < 0)
        return -1;
    size_t k = 0;
    int want = snprintf(buf, len, "fused(");
    k = want > 0 ? (size_t)want : 0;
    for (int i = 0; i < m; i++) {
        int w = snprintf(k < len ? buf + k : NULL, k < len ? len - k : 0, "%s%s", i ? ", " : "",
                         wf__fused_instr_name(&ins[i]));
        k += w > 0 ? (size_t)w : 0;
    }
    int w = snprintf(k < len ? buf + k : NULL, k < len ? len - k : 0, ")");
    k += w > 0 ? (size_t)w : 0;
    return (int)k;
}

/* ---- The op --------------------------------------------------------------------------------- */

static int infer_fused(wf_node *n, char *err, size_t errlen)
{
    wf__fused_instr ins[WF__FUSED_MAX_OPS];
    int m = n->attrs->n_axes;
    if (m < 1 || m > WF__FUSED_MAX_OPS) {
        snprintf(err, errlen, "%d instructions (1 to %d)", m, WF__FUSED_MAX_OPS);
        return WF_EINVAL;
    }
    m = wf__fused_decode(n->attrs, ins);
    wf_dtype in_dt[WF__FUSED_MAX_INPUTS];
    for (int k = 0; k < n->n_inputs && k < WF__FUSED_MAX_INPUTS; k++)
        in_dt[k] = n->inputs[k]->dtype;
    int rc = wf__fused_check(ins, m, n->n_inputs, in_dt, err, errlen);
    if (rc < 0)
        return rc;
    wf_shape s = n->inputs[0]->shape;
    for (int k = 1; k < n->n_inputs; k++) {
        wf_shape t;
        if (wf_shape_broadcast(s, n->inputs[k]->shape, &t) < 0) {
            char s1[160], s2[160];
            snprintf(err, errlen, "input %d is %s, which does not broadcast with %s", k,
                     wf_shape_str(n->inputs[k]->shape, s1, sizeof s1),
                     wf_shape_str(s, s2, sizeof s2));
            return WF_ESHAPE;
        }
        s = t;
    }
    n->dtype = (wf_dtype)ins[m - 1].dtype;
    n->shape = s;
    return 0;
}

static int kernel_fused(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                        wf_tensor **out)
{
    wf_kctx k = wf__ops_kctx(ctx);
    return wf__fused_elementwise_cpu(&k, n->attrs, (const wf_tensor *const *)in, n->n_inputs, *out);
}

/* The members' flops (as the ops' own costs: ~10 for a libm call, 1 for arithmetic); the
 * bytes are the inputs' and the output's only: what fusion saves. */
static void cost_fused(const wf_node *n, double *flops, double *bytes)
{
    wf__fused_instr ins[WF__FUSED_MAX_OPS];
    int m = wf__fused_decode(n->attrs, ins);
    double per = 0;
    for (int i = 0; i < m; i++) {
        bool libm = ins[i].kind == WF__FI_ACT_GRAD ||
                    (ins[i].kind == WF__FI_UNARY && ins[i].op >= WF_UNARY_EXP &&
                     ins[i].op != WF_UNARY_SQUARE && ins[i].op != WF_UNARY_RELU &&
                     ins[i].op != WF_UNARY_SIGN && ins[i].op != WF_UNARY_LEAKY_RELU) ||
                    (ins[i].kind == WF__FI_BINARY && ins[i].op == WF_BINARY_POW);
        per += libm ? 10 : 1;
    }
    wf__ops_cost_elementwise(n, per, flops, bytes);
}

const wf_op_def wf_op_fused_elementwise = {
    .name = "fused_elementwise",
    .min_inputs = 1,
    .max_inputs = WF__FUSED_MAX_INPUTS,
    .infer = infer_fused,
    .kernel = { [WF_KERNEL_CPU] = kernel_fused,
                [WF_KERNEL_CUDA] = WF__CUDA_KERNEL(fused_elementwise) },
    .cost = cost_fused,
    .flags = WF_OP_ELEMENTWISE,
};
