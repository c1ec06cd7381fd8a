/* tests/ops/fused_program.h: writing fused elementwise programs (ops/fused.h) in tests: the
 * instruction makers U (unary), B (binary), G (activation gradient), W (where), C (cast),
 * and type_program(), which fills in each instruction's result dtype as the fusion pass
 * does. Shared by the CPU and CUDA fused kernel tests. */
#ifndef WF_TESTS_OPS_FUSED_PROGRAM_H
#define WF_TESTS_OPS_FUSED_PROGRAM_H

#define U(op, a)    ((wf__fused_instr){ WF__FI_UNARY, WF_UNARY_##op, a, 0, 0, 0 })
#define B(op, a, b) ((wf__fused_instr){ WF__FI_BINARY, WF_BINARY_##op, a, b, 0, 0 })
#define G(op, a, b) ((wf__fused_instr){ WF__FI_ACT_GRAD, WF_ACT_GRAD_##op, a, b, 0, 0 })
#define W(c, a, b)  ((wf__fused_instr){ WF__FI_WHERE, 0, c, a, b, 0 })
#define C(a, dt)    ((wf__fused_instr){ WF__FI_CAST, 0, a, 0, 0, (uint8_t)(dt) })

/* Fills in each instruction's result dtype from its operands (the pass takes it from the
 * node); returns the output's dtype. */
static wf_dtype type_program(wf__fused_instr *ins, int n, const wf_tensor *const *in, int n_in)
{
    wf_dtype dt[64];
    for (int k = 0; k < n_in; k++)
        dt[k] = wf_tensor_dtype(in[k]);
    for (int i = 0; i < n; i++) {
        wf__fused_instr *x = &ins[i];
        wf_dtype r = dt[x->a];
        if (x->kind == WF__FI_BINARY && x->op >= WF_BINARY_EQ)
            r = WF_BOOL;
        else if (x->kind == WF__FI_WHERE)
            r = dt[x->b];
        else if (x->kind == WF__FI_CAST)
            r = (wf_dtype)x->dtype;
        x->dtype = (uint8_t)r;
        dt[n_in + i] = r;
    }
    return dt[n_in + n - 1];
}

#endif
