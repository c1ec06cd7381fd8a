/* tests/ops/test_internal_fused.c: the fused_elementwise kernel (ops/fused.h) against the
 * chain it replaces: each program is also run op by op with the elementwise kernels
 * (wf__unary_cpu, wf__binary_cpu, ...) into intermediate tensors, and the fused output must
 * hold the same bits, for f32 and f64 (and integer, bool and cast programs), sizes 1, 7,
 * 1000 and 100003 (the last is split across the workers), broadcast, transposed,
 * negative-stride and zero-stride inputs, serially and on 1- and 2-worker runtimes. One chain
 * is also checked against a naive f64 reference (f32 tolerance 1e-5 + 1e-5 |want|: five
 * roundings of f32 ops with tanh's libm error). Bad programs, shapes and dtypes are refused
 * with a code and a message. */
#include "../../ops/fused.h"
#include "../../ops/kernels.h"
#include "../../ops/scalar.h"
#include "fused_program.h"
#include "ops_test.h"

TestSuite(ops_fused, .fini = wf_test_fini, .timeout = WF_TEST_TIMEOUT(120));

static wf_shape bshape(wf_shape a, wf_shape b)
{
    wf_shape r;
    cr_assert_eq(wf_shape_broadcast(a, b, &r), 0);
    return r;
}

/* The chain run op by op with the elementwise kernels; returns the last value (owned). */
static wf_tensor *run_chain(const wf_kctx *ctx, const wf__fused_instr *ins, int n, double alpha,
                            const wf_tensor *const *in, int n_in)
{
    const wf_tensor *reg[64];
    wf_tensor *made[64];
    for (int k = 0; k < n_in; k++)
        reg[k] = in[k];
    for (int i = 0; i < n; i++) {
        const wf__fused_instr *x = &ins[i];
        const wf_tensor *a = reg[x->a], *b = reg[x->b], *c = reg[x->c];
        wf_shape s = wf_tensor_shape(a);
        if (x->kind == WF__FI_BINARY || x->kind == WF__FI_ACT_GRAD || x->kind == WF__FI_WHERE)
            s = bshape(s, wf_tensor_shape(b));
        if (x->kind == WF__FI_WHERE)
            s = bshape(s, wf_tensor_shape(c));
        wf_tensor *o = made[i] = ot_out((wf_dtype)x->dtype, s);
        int rc;
        switch (x->kind) {
        case WF__FI_UNARY:
            rc = wf__unary_cpu(ctx, (wf_unary_op)x->op, alpha, a, o);
            break;
        case WF__FI_BINARY:
            rc = wf__binary_cpu(ctx, (wf_binary_op)x->op, a, b, o);
            break;
        case WF__FI_ACT_GRAD:
            rc = wf__activation_grad_cpu(ctx, (wf_act_grad_op)x->op, alpha, a, b, o);
            break;
        case WF__FI_WHERE:
            rc = wf__where_cpu(ctx, a, b, c, o);
            break;
        default:
            rc = wf__cast_cpu(ctx, a, o);
            break;
        }
        cr_assert_eq(rc, 0, "instruction %d: %s", i, wf_last_errmsg());
        reg[n_in + i] = o;
    }
    for (int i = 0; i < n - 1; i++)
        wf_tensor_release(made[i]);
    return made[n - 1];
}

/* The fused kernel's output (owned), asserting success. */
static wf_tensor *run_fused(const wf_kctx *ctx, const wf__fused_instr *ins, int n, double alpha,
                            const wf_tensor *const *in, int n_in, wf_shape out_shape)
{
    wf_attrs a;
    cr_assert_eq(wf__fused_encode(&a, ins, n, alpha), 0);
    wf_tensor *o = ot_out((wf_dtype)ins[n - 1].dtype, out_shape);
    int rc = wf__fused_elementwise_cpu(ctx, &a, in, n_in, o);
    cr_assert_eq(rc, 0, "%s", wf_last_errmsg());
    return o;
}

/* Runs the program fused and op by op, serially and on both runtimes: all bitwise equal. */
static void check_program(const char *what, wf__fused_instr *ins, int n, double alpha,
                          const wf_tensor *const *in, int n_in, ot_rts *rts)
{
    type_program(ins, n, in, n_in);
    wf_shape s = wf_tensor_shape(in[0]);
    for (int k = 1; k < n_in; k++)
        s = bshape(s, wf_tensor_shape(in[k]));
    const wf_kctx serial = { .rt = NULL }, one = { .rt = rts->one }, two = { .rt = rts->two };
    wf_tensor *want = run_chain(&serial, ins, n, alpha, in, n_in);
    const wf_kctx *ctxs[3] = { &serial, &one, &two };
    for (int c = 0; c < 3; c++) {
        wf_tensor *got = run_fused(ctxs[c], ins, n, alpha, in, n_in, s);
        char msg[200];
        snprintf(msg, sizeof msg, "%s, context %d", what, c);
        cr_assert(wf_shape_equal(wf_tensor_shape(got), wf_tensor_shape(want)), "%s", msg);
        size_t bytes = (size_t)wf_tensor_numel(got) * wf_dtype_size(wf_tensor_dtype(got));
        cr_assert(memcmp(wf_tensor_data(got), wf_tensor_data(want), bytes) == 0,
                  "%s: fused and unfused bits differ", msg);
        wf_tensor_release(got);
    }
    wf_tensor_release(want);
}

static const int rev2[] = { 1, 0 };

Test(ops_fused, a_five_op_chain_gives_the_unfused_bits_for_every_size_layout_and_dtype)
{
    ot_rts rts = ot_rts_create();
    const wf_dtype dts[2] = { WF_F32, WF_F64 };

    /* (size, the three inputs' shapes and layouts): a contiguous, b strided, c broadcast */
    struct {
        wf_shape sa, sb, sc;
        ot_layout la, lb, lc;
        const char *what;
    } cases[] = {
        { WF_SHAPE(1), WF_SHAPE(1), WF_SCALAR, OT_CONTIG, OT_CONTIG, OT_CONTIG, "size 1" },
        { WF_SHAPE(7), WF_SHAPE(7), WF_SHAPE(1), OT_CONTIG, (ot_layout){ NULL, 1, 0 }, OT_CONTIG,
          "size 7, b flipped" },
        { WF_SHAPE(10, 100), WF_SHAPE(10, 100), WF_SHAPE(100), OT_CONTIG, (ot_layout){ rev2, 0, 0 },
          OT_CONTIG, "size 1000, b transposed, c a row" },
        { WF_SHAPE(10, 100), WF_SHAPE(10, 100), WF_SHAPE(10, 1), (ot_layout){ NULL, 2, 0 },
          (ot_layout){ NULL, 0, 1 }, OT_CONTIG, "size 1000, a flipped, b zero stride, c a column" },
        { WF_SHAPE(100003), WF_SHAPE(100003), WF_SCALAR, OT_CONTIG, (ot_layout){ NULL, 1, 0 },
          OT_CONTIG, "size 100003, b flipped, c a scalar" },
        { WF_SHAPE(307, 331), WF_SHAPE(307, 331), WF_SHAPE(331), (ot_layout){ rev2, 0, 0 },
          OT_CONTIG, OT_CONTIG, "size 101617, a transposed, c a row" },
    };

    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int d = 0; d < 2; d++) {
            ot_tensor a = ot_random(dts[d], cases[i].sa, cases[i].la, 10 + i, -2, 2);
            ot_tensor b = ot_random(dts[d], cases[i].sb, cases[i].lb, 20 + i, -2, 2);
            ot_tensor c = ot_random(dts[d], cases[i].sc, cases[i].lc, 30 + i, -1, 1);
            const wf_tensor *in[3] = { a.t, b.t, c.t };
            /* relu(tanh(a * b + c) * a) - c: mul, add, tanh, mul, relu, sub (6 ops) */
            wf__fused_instr p[6] = { B(MUL, 0, 1), B(ADD, 3, 2), U(TANH, 4),
                                     B(MUL, 5, 0), U(RELU, 6),   B(SUB, 7, 2) };
            char what[160];
            snprintf(what, sizeof what, "%s, %s", cases[i].what, wf_dtype_name(dts[d]));
            check_program(what, p, 6, 0, in, 3, &rts);
            /* A 5-op chain of transcendental ops and an activation gradient. */
            wf__fused_instr q[5] = { U(SIGMOID, 0), B(DIV, 3, 1), U(GELU_ERF, 4), G(SILU, 5, 0),
                                     U(SQUARE, 6) };
            check_program(what, q, 5, 0, in, 3, &rts);
            ot_release(&a);
            ot_release(&b);
            ot_release(&c);
        }
    ot_rts_destroy(&rts);
}

Test(ops_fused, a_chain_matches_a_naive_f64_reference)
{
    enum { N = 1000 };

    ot_tensor a = ot_random(WF_F32, WF_SHAPE(10, 100), OT_CONTIG, 1, -2, 2);
    ot_tensor b = ot_random(WF_F32, WF_SHAPE(100), OT_CONTIG, 2, -2, 2);
    const wf_tensor *in[2] = { a.t, b.t };
    wf__fused_instr p[5] = { B(MUL, 0, 1), U(TANH, 2), B(ADD, 3, 0), U(LEAKY_RELU, 4),
                             B(MAXIMUM, 5, 1) };
    type_program(p, 5, in, 2);
    wf_tensor *got = run_fused(NULL, p, 5, 0.25, in, 2, WF_SHAPE(10, 100));
    const float *x = wf_tensor_data_f32(a.t), *y = wf_tensor_data_f32(b.t);
    const float *o = wf_tensor_data_f32(got);
    for (int i = 0; i < N; i++) {
        double u = (double)x[i], v = (double)y[i % 100];
        double t = tanh(u * v) + u;
        t = t < 0 ? 0.25 * t : t;
        double want = t > v ? t : v;
        cr_assert(ot_close(o[i], want, (ot_tol){ 1e-5, 1e-5 }), "element %d: %g vs %g", i,
                  (double)o[i], want);
    }
    wf_tensor_release(got);
    ot_release(&a);
    ot_release(&b);
}

Test(ops_fused, integer_bool_where_and_cast_programs_give_the_unfused_bits)
{
    ot_rts rts = ot_rts_create();
    ot_tensor a = ot_random(WF_I32, WF_SHAPE(50, 40), OT_CONTIG, 3, -100, 100);
    ot_tensor b = ot_random(WF_I32, WF_SHAPE(40), OT_CONTIG, 4, -100, 100);
    ot_tensor f = ot_random(WF_F32, WF_SHAPE(50, 1), OT_CONTIG, 5, -3, 3);
    const wf_tensor *in[3] = { a.t, b.t, f.t };
    /* where(a > b, a, b) * a -> cast f32 -> * f -> neg; and a cast to f64 and back */
    wf__fused_instr p[7] = { B(GT, 0, 1),  W(3, 0, 1),   B(MUL, 4, 0), C(5, WF_F32),
                             B(MUL, 6, 2), C(7, WF_F64), U(NEG, 8) };
    check_program("i32 where and casts", p, 7, 0, in, 3, &rts);
    /* comparisons of floats, a bool where over floats, and integer division */
    ot_tensor g = ot_random(WF_F64, WF_SHAPE(50, 40), (ot_layout){ rev2, 0, 0 }, 6, -3, 3);
    ot_tensor h = ot_random(WF_F64, WF_SHAPE(40), OT_CONTIG, 7, -3, 3);
    const wf_tensor *in2[2] = { g.t, h.t };
    wf__fused_instr q[6] = { B(LE, 0, 1), B(MINIMUM, 0, 1), B(POW, 3, 1),
                             W(2, 4, 0),  U(ABS, 5),        U(SQRT, 6) };
    check_program("f64 compare, pow, where", q, 6, 0, in2, 2, &rts);
    ot_tensor d = ot_random(WF_I64, WF_SHAPE(100), OT_CONTIG, 8, 1, 50);
    const wf_tensor *in3[2] = { d.t, d.t };
    wf__fused_instr r[3] = { U(SQUARE, 0), B(DIV, 2, 1), U(SIGN, 3) };
    check_program("i64 division", r, 3, 0, in3, 2, &rts);
    ot_release(&a);
    ot_release(&b);
    ot_release(&f);
    ot_release(&g);
    ot_release(&h);
    ot_release(&d);
    ot_rts_destroy(&rts);
}

Test(ops_fused, leaky_slopes_and_a_long_program_reuse_registers_without_changing_bits)
{
    ot_rts rts = ot_rts_create();
    ot_tensor a = ot_random(WF_F32, WF_SHAPE(300, 129), OT_CONTIG, 9, -2, 2);
    ot_tensor b = ot_random(WF_F32, WF_SHAPE(300, 129), (ot_layout){ NULL, 3, 0 }, 10, -2, 2);
    const wf_tensor *in[2] = { a.t, b.t };
    wf__fused_instr p[WF__FUSED_MAX_OPS];
    int n = 0;
    p[n++] = U(LEAKY_RELU, 0);
    p[n++] = G(LEAKY_RELU, 0, 1);
    while (n < WF__FUSED_MAX_OPS) {
        /* alternate ops over the latest results ('r': the register of the last) and b */
        int r = 2 + n - 1;
        switch (n % 4) {
        case 0:
            p[n] = B(ADD, (uint8_t)r, (uint8_t)(r - 1));
            break;
        case 1:
            p[n] = U(TANH, (uint8_t)r);
            break;
        case 2:
            p[n] = B(MUL, (uint8_t)r, 1);
            break;
        default:
            p[n] = G(TANH, (uint8_t)r, (uint8_t)(r - 2));
            break;
        }
        n++;
    }
    check_program("24 instructions with slope 0.1", p, n, 0.1, in, 2, &rts);
    ot_release(&a);
    ot_release(&b);
    ot_rts_destroy(&rts);
}

Test(ops_fused, bad_programs_shapes_and_dtypes_are_refused_with_a_message)
{
    ot_tensor a = ot_random(WF_F32, WF_SHAPE(4, 3), OT_CONTIG, 1, -1, 1);
    ot_tensor b = ot_random(WF_F32, WF_SHAPE(5), OT_CONTIG, 2, -1, 1);
    ot_tensor h = ot_random(WF_BF16, WF_SHAPE(4, 3), OT_CONTIG, 3, -1, 1);
    ot_tensor z = ot_random(WF_I32, WF_SHAPE(4), OT_CONTIG, 4, 0, 0);
    wf_attrs at;
    wf_tensor *o = ot_out(WF_F32, WF_SHAPE(4, 3));
    /* a register not yet written */
    wf__fused_instr p[2] = { B(ADD, 0, 2), U(NEG, 2) };
    p[0].dtype = p[1].dtype = WF_F32;
    cr_assert_eq(wf__fused_encode(&at, p, 2, 0), 0);
    const wf_tensor *in1[1] = { a.t };
    int rc = wf__fused_elementwise_cpu(NULL, &at, in1, 1, o);
    cr_assert_eq(rc, WF_EINVAL);
    cr_assert(strstr(wf_last_errmsg(), "reads register 2"), "%s", wf_last_errmsg());
    /* shapes that do not broadcast */
    wf__fused_instr q[1] = { B(ADD, 0, 1) };
    q[0].dtype = WF_F32;
    cr_assert_eq(wf__fused_encode(&at, q, 1, 0), 0);
    const wf_tensor *in2[2] = { a.t, b.t };
    rc = wf__fused_elementwise_cpu(NULL, &at, in2, 2, o);
    cr_assert_eq(rc, WF_ESHAPE);
    cr_assert(strstr(wf_last_errmsg(), "[5]") && strstr(wf_last_errmsg(), "[4, 3]"), "%s",
              wf_last_errmsg());
    /* bf16 is not fused */
    const wf_tensor *in3[2] = { h.t, h.t };
    q[0].dtype = WF_BF16;
    cr_assert_eq(wf__fused_encode(&at, q, 1, 0), 0);
    rc = wf__fused_elementwise_cpu(NULL, &at, in3, 2, o);
    cr_assert_eq(rc, WF_EDTYPE);
    cr_assert(strstr(wf_last_errmsg(), "bf16"), "%s", wf_last_errmsg());
    /* an output of the wrong shape */
    wf_tensor *small = ot_out(WF_F32, WF_SHAPE(3));
    q[0].dtype = WF_F32;
    cr_assert_eq(wf__fused_encode(&at, q, 1, 0), 0);
    const wf_tensor *in4[2] = { a.t, a.t };
    rc = wf__fused_elementwise_cpu(NULL, &at, in4, 2, small);
    cr_assert_eq(rc, WF_ESHAPE, "%s", wf_last_errmsg());
    /* integer division by zero fails the call instead of trapping */
    wf__fused_instr r[2] = { B(DIV, 0, 0), U(NEG, 1) };
    r[0].dtype = r[1].dtype = WF_I32;
    cr_assert_eq(wf__fused_encode(&at, r, 2, 0), 0);
    wf_tensor *oi = ot_out(WF_I32, WF_SHAPE(4));
    const wf_tensor *in5[1] = { z.t };
    rc = wf__fused_elementwise_cpu(NULL, &at, in5, 1, oi);
    cr_assert_eq(rc, WF_EINVAL);
    cr_assert(strstr(wf_last_errmsg(), "division by zero"), "%s", wf_last_errmsg());
    /* too many instructions, NULLs, too many inputs */
    wf__fused_instr many[WF__FUSED_MAX_OPS + 1];
    for (int i = 0; i <= WF__FUSED_MAX_OPS; i++)
        many[i] = U(NEG, (uint8_t)i);
    cr_assert_eq(wf__fused_encode(&at, many, WF__FUSED_MAX_OPS + 1, 0), WF_EINVAL);
    cr_assert_eq(wf__fused_elementwise_cpu(NULL, NULL, in1, 1, o), WF_EINVAL);
    const wf_tensor *in6[5] = { a.t, a.t, a.t, a.t, a.t };
    cr_assert_eq(wf__fused_encode(&at, q, 1, 0), 0);
    cr_assert_eq(wf__fused_elementwise_cpu(NULL, &at, in6, 5, o), WF_EINVAL);
    wf_tensor_release(o);
    wf_tensor_release(small);
    wf_tensor_release(oi);
    ot_release(&a);
    ot_release(&b);
    ot_release(&h);
    ot_release(&z);
}

Test(ops_fused, the_scalar_loops_apply_to_plain_arrays_with_the_kernels_bits)
{
    enum { N = 515 };

    ot_tensor a = ot_random(WF_F32, WF_SHAPE(N), OT_CONTIG, 11, -3, 3);
    ot_tensor b = ot_random(WF_F32, WF_SHAPE(N), OT_CONTIG, 12, -3, 3);
    wf_tensor *want = ot_out(WF_F32, WF_SHAPE(N));
    cr_assert_eq(wf__binary_cpu(NULL, WF_BINARY_ADD, a.t, b.t, want), 0);
    cr_assert_eq(wf__unary_cpu(NULL, WF_UNARY_GELU_TANH, 0, want, want), 0);
    float got[N];
    memcpy(got, wf_tensor_data_f32(a.t), sizeof got);
    cr_assert_eq(
        wf__ew_apply_binary(WF_BINARY_ADD, WF_F32, got, got, 1, wf_tensor_data_f32(b.t), 1, N), 0);
    cr_assert_eq(wf__ew_apply_unary(WF_UNARY_GELU_TANH, 0, WF_F32, got, N), 0);
    cr_assert(memcmp(got, wf_tensor_data_f32(want), sizeof got) == 0);
    cr_assert_eq(wf__ew_apply_unary(WF_UNARY_EXP, 0, WF_BF16, got, N), WF_EDTYPE);
    cr_assert_eq(wf__ew_apply_binary(WF_BINARY_LT, WF_F32, got, got, 1, got, 1, N), WF_EDTYPE);
    float dy[N];
    cr_assert_eq(wf__ew_apply_act_grad(WF_ACT_GRAD_RELU, 0, WF_F32, dy, wf_tensor_data_f32(a.t),
                                       wf_tensor_data_f32(b.t), N),
                 0);
    for (int i = 0; i < N; i++)
        cr_assert_eq(dy[i], wf_tensor_data_f32(a.t)[i] > 0 ? wf_tensor_data_f32(b.t)[i] : 0.0f);
    wf_tensor_release(want);
    ot_release(&a);
    ot_release(&b);
}

Test(ops_fused, the_description_names_the_members_in_order)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 1, .flags = WF_RT_NO_PIN });
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(3));
    wf__fused_instr p[3] = { B(ADD, 0, 0), B(MUL, 1, 0), U(RELU, 2) };
    for (int i = 0; i < 3; i++)
        p[i].dtype = WF_F32;
    wf_attrs a;
    cr_assert_eq(wf__fused_encode(&a, p, 3, 0), 0);
    wf_node *f = wf__node_add(g, &wf_op_fused_elementwise, &x, 1, &a);
    cr_assert_not_null(f, "%s", wf_graph_errmsg(g));
    char buf[64];
    cr_assert_eq(wf__fused_describe(f, buf, sizeof buf), (int)strlen("fused(add, mul, relu)"));
    cr_assert_str_eq(buf, "fused(add, mul, relu)");
    char tiny[8];
    cr_assert_eq(wf__fused_describe(f, tiny, sizeof tiny), (int)strlen("fused(add, mul, relu)"));
    cr_assert_str_eq(tiny, "fused(a");
    cr_assert_eq(wf__fused_describe(x, buf, sizeof buf), -1);
    /* inference checks the program: a bf16 input is refused with the instruction named */
    wf_node *h = wf_placeholder(g, "h", WF_BF16, WF_SHAPE(3));
    cr_assert_null(wf__node_add(g, &wf_op_fused_elementwise, &h, 1, &a));
    cr_assert(strstr(wf_graph_errmsg(g), "instruction 0 (add)"), "%s", wf_graph_errmsg(g));
    wf_graph_destroy(g);
    wf_runtime_destroy(rt);
}
