/* ops/fused_cpu.c: the CPU kernel of 'fused_elementwise' (ops/fused.h): a program of
 * elementwise ops computed in one pass over the output.
 * Owns: the kernel's iterator: the inputs broadcast against the output by zero strides, size-1
 *   axes dropped and axes merged where every operand is contiguous across them (as
 *   elementwise_cpu.c's plan); the output walked in row-major runs along the innermost axis,
 *   each run cut into blocks of FU_BLOCK elements. In a block every instruction runs the
 *   elementwise kernel's own loop (ops/scalar.h) over the block: inputs are read in place
 *   through their strides, results go to per-instruction block registers (unit stride), and
 *   the last instruction writes the output. So the inner loops are the kernels' vectorised
 *   loops, and each element's value is computed by the same code as in the unfused chain,
 *   each instruction rounding to its own dtype: the bits are the chain's.
 * Invariants: each element is computed alone, so the bits do not depend on how
 *   wf_parallel_for splits the output (split points are fixed: FU_GRAIN at least); the
 *   output never overlaps an input (the op is not WF_OP_INPLACE).
 * Not here: the loops (elementwise_cpu.c), the program's checks (fused.c). */
#include "../core/error.h"
#include "../core/tensor.h"
#include "fused.h"
#include "layout.h"
#include "scalar.h"

#include <stdio.h>
#include <string.h>

#define FU_BLOCK   512   /* elements per block: 4 KiB per f64 register (L1 holds a few) */
#define FU_PAR_MIN 32768 /* as elementwise_cpu.c: split ops with more elements than this */
#define FU_GRAIN   16384 /* elements per parallel piece, at least */
#define FU_MAX_REG (WF__FUSED_MAX_INPUTS + WF__FUSED_MAX_OPS)

typedef struct fu_plan {
    int n_in, n_ins, rank;
    int64_t numel;
    int64_t dims[WF_MAX_RANK];
    int64_t st[WF__FUSED_MAX_INPUTS + 1][WF_MAX_RANK]; /* bytes; [0] is the output */
    char *base[WF__FUSED_MAX_INPUTS + 1];
    wf__fused_instr ins[WF__FUSED_MAX_OPS];
    wf__ew_loop fn[WF__FUSED_MAX_OPS];
    int64_t es[FU_MAX_REG];      /* element size per register */
    int slot[WF__FUSED_MAX_OPS]; /* block buffer of each instruction's result (-1: output) */
    int n_slots;
    wf__ew_arg arg;
} fu_plan;

/* Lays out inputs and output (shapes checked: every input broadcasts to 'out'). */
static void plan_layout(fu_plan *pl, wf_tensor *out, const wf_tensor *const *in)
{
    int r = out->shape.rank, n_ops = pl->n_in + 1;
    int64_t st[WF__FUSED_MAX_INPUTS + 1][WF_MAX_RANK];
    for (int k = 0; k < n_ops; k++) {
        const wf_tensor *t = k ? in[k - 1] : out;
        pl->base[k] = t->data;
        wf__ops_bcast_strides(t, r, (int64_t)wf_dtype_size(t->dtype), st[k]);
    }
    pl->rank = wf__ops_merge_axes(out->shape, n_ops, st, pl->dims, pl->st);
    pl->numel = out->numel;
}

/* Runs the program over 'm' consecutive elements of one run: input k at 'p[k + 1]' with byte
 * stride 's[k + 1]', the output at 'p[0]' (unit stride); 'pos' is the first element's index. */
static int run_block(const fu_plan *pl, char (*buf)[FU_BLOCK * 8], char *const *p, const int64_t *s,
                     int64_t m, int64_t pos)
{
    for (int i = 0; i < pl->n_ins; i++) {
        const wf__fused_instr *x = &pl->ins[i];
        int regs[3] = { x->a, x->b, x->c };
        int n_ops = x->kind == WF__FI_WHERE                                  ? 3
                    : x->kind == WF__FI_BINARY || x->kind == WF__FI_ACT_GRAD ? 2
                                                                             : 1;
        char *q[4];
        int64_t qs[4];
        q[0] = pl->slot[i] < 0 ? p[0] : buf[pl->slot[i]];
        qs[0] = pl->es[pl->n_in + i];
        for (int k = 0; k < n_ops; k++) {
            int r = regs[k];
            if (r < pl->n_in) {
                q[k + 1] = p[r + 1];
                qs[k + 1] = s[r + 1];
            } else {
                q[k + 1] = buf[pl->slot[r - pl->n_in]];
                qs[k + 1] = pl->es[r];
            }
        }
        int rc = pl->fn[i](&pl->arg, q, qs, m, pos);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* Runs the output elements [lo, hi) in row-major order. */
static int plan_range(void *ctx, int64_t lo, int64_t hi)
{
    const fu_plan *pl = ctx;
    char buf[pl->n_slots > 0 ? pl->n_slots : 1][FU_BLOCK * 8] __attribute__((aligned(64)));
    int last = pl->rank - 1, n_ops = pl->n_in + 1;
    int64_t idx[WF_MAX_RANK], rem = lo;
    for (int d = last; d >= 0; d--) {
        idx[d] = rem % pl->dims[d];
        rem /= pl->dims[d];
    }
    char *p[WF__FUSED_MAX_INPUTS + 1];
    int64_t s[WF__FUSED_MAX_INPUTS + 1];
    for (int k = 0; k < n_ops; k++) {
        int64_t off = 0;
        for (int d = 0; d <= last; d++)
            off += idx[d] * pl->st[k][d];
        p[k] = pl->base[k] + off;
        s[k] = pl->st[k][last];
    }
    for (int64_t pos = lo; pos < hi;) {
        int64_t n = pl->dims[last] - idx[last];
        if (n > hi - pos)
            n = hi - pos;
        for (int64_t j = 0; j < n; j += FU_BLOCK) {
            int64_t m = n - j < FU_BLOCK ? n - j : FU_BLOCK;
            char *q[WF__FUSED_MAX_INPUTS + 1];
            for (int k = 0; k < n_ops; k++)
                q[k] = p[k] + j * s[k];
            int rc = run_block(pl, buf, q, s, m, pos + j);
            if (rc < 0)
                return rc;
        }
        pos += n;
        if (pos >= hi)
            break;
        for (int k = 0; k < n_ops; k++)
            p[k] += n * s[k];
        idx[last] += n;
        for (int d = last; d > 0 && idx[d] == pl->dims[d]; d--) {
            idx[d] = 0;
            idx[d - 1]++;
            for (int k = 0; k < n_ops; k++)
                p[k] += pl->st[k][d - 1] - pl->dims[d] * pl->st[k][d];
        }
    }
    return 0;
}

/* The loop of instruction 'x' given its operands' dtypes (checked by wf__fused_check()). */
static wf__ew_loop loop_of(const wf__fused_instr *x, const wf_dtype *dt)
{
    switch (x->kind) {
    case WF__FI_UNARY:
        return wf__ew_unary_loop((wf_unary_op)x->op, dt[x->a]);
    case WF__FI_BINARY:
        return wf__ew_binary_loop((wf_binary_op)x->op, dt[x->a]);
    case WF__FI_ACT_GRAD:
        return wf__ew_act_grad_loop((wf_act_grad_op)x->op, dt[x->a]);
    case WF__FI_WHERE:
        return wf__ew_where_loop(dt[x->b]);
    default:
        return wf__ew_cast_loop(dt[x->a], (wf_dtype)x->dtype);
    }
}

/* Gives each instruction's result a block buffer, reusing one after its register's last
 * reader (the program is in order, so a buffer freed before instruction i is free for it). */
static void assign_slots(fu_plan *pl)
{
    int last_use[FU_MAX_REG], owner[WF__FUSED_MAX_OPS], n_in = pl->n_in;
    for (int r = 0; r < n_in + pl->n_ins; r++)
        last_use[r] = -1;
    for (int i = 0; i < pl->n_ins; i++) {
        const wf__fused_instr *x = &pl->ins[i];
        int n_ops = x->kind == WF__FI_WHERE                                  ? 3
                    : x->kind == WF__FI_BINARY || x->kind == WF__FI_ACT_GRAD ? 2
                                                                             : 1;
        int regs[3] = { x->a, x->b, x->c };
        for (int k = 0; k < n_ops; k++)
            last_use[regs[k]] = i;
    }
    pl->n_slots = 0;
    for (int i = 0; i < pl->n_ins; i++) {
        if (i == pl->n_ins - 1) {
            pl->slot[i] = -1; /* the output */
            break;
        }
        /* A buffer whose value was last read before instruction i: never one that i reads,
         * since operands and result may differ in element size (where's bool cond). */
        int sl = -1;
        for (int b = 0; b < pl->n_slots && sl < 0; b++)
            if (last_use[n_in + owner[b]] < i)
                sl = b;
        if (sl < 0)
            sl = pl->n_slots++;
        owner[sl] = i;
        pl->slot[i] = sl;
    }
}

int wf__fused_elementwise_cpu(const wf_kctx *ctx, const wf_attrs *attrs, const wf_tensor *const *in,
                              int n_in, wf_tensor *out)
{
    char err[WF_ERRMSG_MAX], s1[160], s2[160];
    if (!attrs || !in || !out)
        return wf__err(WF_EINVAL, "fused_elementwise: %s is NULL",
                       !attrs ? "attrs"
                       : !in  ? "in"
                              : "out");
    if (n_in < 1 || n_in > WF__FUSED_MAX_INPUTS)
        return wf__err(WF_EINVAL, "fused_elementwise: %d inputs (1 to %d)", n_in,
                       WF__FUSED_MAX_INPUTS);
    fu_plan pl;
    memset(&pl, 0, sizeof pl);
    pl.n_in = n_in;
    int m = wf__fused_decode(attrs, pl.ins);
    if (m < 0)
        return m;
    pl.n_ins = m;
    wf_dtype dt[FU_MAX_REG];
    wf_shape shape;
    for (int k = 0; k < n_in; k++) {
        if (!in[k])
            return wf__err(WF_EINVAL, "fused_elementwise: input %d is NULL", k);
        dt[k] = in[k]->dtype;
        if (k == 0) {
            shape = in[0]->shape;
        } else if (wf_shape_broadcast(shape, in[k]->shape, &shape) < 0) {
            return wf__err(WF_ESHAPE,
                           "fused_elementwise: input %d is %s, which does not "
                           "broadcast with %s",
                           k, wf_shape_str(in[k]->shape, s1, sizeof s1),
                           wf_shape_str(in[0]->shape, s2, sizeof s2));
        }
    }
    int rc = wf__fused_check(pl.ins, m, n_in, dt, err, sizeof err);
    if (rc < 0)
        return wf__err(rc, "fused_elementwise: %s", err);
    for (int i = 0; i < m; i++) {
        dt[n_in + i] = (wf_dtype)pl.ins[i].dtype;
        pl.fn[i] = loop_of(&pl.ins[i], dt);
    }
    for (int r = 0; r < n_in + m; r++)
        pl.es[r] = (int64_t)wf_dtype_size(dt[r]);
    rc = wf__kernel_check_out("fused_elementwise", out, dt[n_in + m - 1], shape);
    if (rc < 0)
        return rc;
    pl.arg.alpha = attrs->alpha;
    assign_slots(&pl);
    plan_layout(&pl, out, in);
    if (pl.numel == 0)
        return 0;
    if (ctx && ctx->rt && pl.numel > FU_PAR_MIN)
        return wf_parallel_for(ctx->rt, 0, pl.numel, FU_GRAIN, plan_range, &pl);
    return plan_range(&pl, 0, pl.numel);
}
