/* tests/ops/test_internal_elementwise.c: the elementwise CPU kernels of ops/ against f64
 * references: every unary op on f32, f64, bf16 and f16 (and the integer ones on i32, i64)
 * over contiguous, transposed, negative-stride and zero-stride inputs; binary ops and
 * comparisons with NumPy broadcasting; where; cast between all dtypes; bad shapes and dtypes
 * answered with the right code and a message naming both shapes, and the dtypes the checks
 * shared with the CUDA twins (ops/layout.h) accept; results bitwise equal with no runtime, a
 * 1-worker and a 2-worker runtime.
 * Tolerances (ops_test.h): f32 1e-6 + 1e-5 |want|, f64 1e-13 + 1e-12 |want|, bf16 1e-2 +
 * 8e-3 |want|, f16 1e-3 + 1e-3 |want|, integers exact. The reference reads the (already
 * rounded) inputs, so only the op's own error is measured. */
#include "../../ops/kernels.h"
#include "../../ops/layout.h"
#include "ops_test.h"

#include <limits.h>

TestSuite(ops_elementwise, .fini = wf_test_fini, .timeout = WF_TEST_TIMEOUT(120));

static const wf_kctx serial = { .rt = NULL };

static const wf_dtype float_dtypes[] = { WF_F32, WF_F64, WF_BF16, WF_F16 };

/* The layouts every unary op is tried on, with their shapes. */
static const int perm_rev2[] = { 1, 0 };
static const int perm_3[] = { 2, 0, 1 };

typedef struct shaped {
    wf_shape shape;
    ot_layout layout;
    const char *what;
} shaped;

static shaped unary_cases(int i)
{
    switch (i) {
    case 0:
        return (shaped){ WF_SHAPE(37, 53), OT_CONTIG, "contiguous [37, 53]" };
    case 1:
        return (shaped){ WF_SHAPE(23, 41), (ot_layout){ perm_rev2, 0, 0 }, "transposed [23, 41]" };
    case 2:
        return (shaped){ WF_SHAPE(5, 7, 9), (ot_layout){ perm_3, 0x5, 0 },
                         "permuted, axes 0 and 2 negative [5, 7, 9]" };
    case 3:
        return (shaped){ WF_SHAPE(6, 11), (ot_layout){ NULL, 0x2, 0x1 },
                         "axis 0 zero stride, axis 1 negative [6, 11]" };
    default:
        return (shaped){ WF_SCALAR, OT_CONTIG, "scalar" };
    }
}

#define N_UNARY_CASES 5

static double ref_unary(wf_unary_op op, double v, double alpha)
{
    switch (op) {
    case WF_UNARY_NEG:
        return -v;
    case WF_UNARY_ABS:
        return fabs(v);
    case WF_UNARY_EXP:
        return exp(v);
    case WF_UNARY_LOG:
        return log(v);
    case WF_UNARY_SQRT:
        return sqrt(v);
    case WF_UNARY_RSQRT:
        return 1 / sqrt(v);
    case WF_UNARY_SQUARE:
        return v * v;
    case WF_UNARY_TANH:
        return tanh(v);
    case WF_UNARY_SIGMOID:
        return 1 / (1 + exp(-v));
    case WF_UNARY_RELU:
        return v < 0 ? 0 : v;
    case WF_UNARY_LEAKY_RELU:
        return v < 0 ? alpha * v : v;
    case WF_UNARY_GELU_TANH:
        return 0.5 * v * (1 + tanh(sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
    case WF_UNARY_GELU_ERF:
        return 0.5 * v * (1 + erf(v / sqrt(2)));
    case WF_UNARY_SILU:
        return v / (1 + exp(-v));
    case WF_UNARY_SIGN:
        return v > 0 ? 1 : v < 0 ? -1 : 0;
    default:
        return NAN;
    }
}

static bool positive_domain(wf_unary_op op)
{
    return op == WF_UNARY_LOG || op == WF_UNARY_SQRT || op == WF_UNARY_RSQRT;
}

Test(ops_elementwise, every_unary_op_matches_f64_reference_on_every_float_dtype_and_layout)
{
    for (int op = 0; op < WF_UNARY_COUNT; op++)
        for (size_t di = 0; di < sizeof float_dtypes / sizeof *float_dtypes; di++)
            for (int c = 0; c < N_UNARY_CASES; c++) {
                wf_dtype dt = float_dtypes[di];
                shaped sc = unary_cases(c);
                double lo = positive_domain(op) ? 0.05 : -4, hi = 4;
                ot_tensor x = ot_random(dt, sc.shape, sc.layout, 100 + op * 7 + c, lo, hi);
                wf_tensor *out = ot_out(dt, sc.shape);
                int rc = wf__unary_cpu(&serial, op, 0.1, x.t, out);
                cr_assert_eq(rc, 0, "op %d %s %s: %s", op, wf_dtype_name(dt), sc.what,
                             wf_last_errmsg());
                ot_tol tol = ot_tol_elementwise(dt);
                for (int64_t i = 0; i < wf_tensor_numel(out); i++) {
                    double want = ref_unary(op, wf_tensor_get(x.t, i), 0.1);
                    double got = wf_tensor_get(out, i);
                    cr_assert(ot_close(got, want, tol), "op %d %s %s element %lld: %.9g, want %.9g",
                              op, wf_dtype_name(dt), sc.what, (long long)i, got, want);
                }
                wf_tensor_release(out);
                ot_release(&x);
            }
}

Test(ops_elementwise, integer_unary_ops_wrap_instead_of_overflowing)
{
    const wf_unary_op ops[] = { WF_UNARY_NEG, WF_UNARY_ABS, WF_UNARY_SQUARE, WF_UNARY_RELU,
                                WF_UNARY_SIGN };
    int32_t v32[] = { INT32_MIN, -7, -1, 0, 1, 5, INT32_MAX };
    int64_t v64[] = { INT64_MIN, -7, -1, 0, 1, 5, INT64_MAX };
    for (size_t k = 0; k < sizeof ops / sizeof *ops; k++) {
        wf_tensor *x32 = wf_tensor_from(WF_I32, WF_SHAPE(7), v32);
        wf_tensor *x64 = wf_tensor_from(WF_I64, WF_SHAPE(7), v64);
        wf_tensor *o32 = ot_out(WF_I32, WF_SHAPE(7)), *o64 = ot_out(WF_I64, WF_SHAPE(7));
        cr_assert_eq(wf__unary_cpu(&serial, ops[k], 0, x32, o32), 0, "%s", wf_last_errmsg());
        cr_assert_eq(wf__unary_cpu(&serial, ops[k], 0, x64, o64), 0, "%s", wf_last_errmsg());
        const int32_t *r32 = wf_tensor_data_i32(o32);
        const int64_t *r64 = wf_tensor_data_i64(o64);
        for (int i = 0; i < 7; i++) {
            uint32_t u = (uint32_t)v32[i];
            uint64_t w = (uint64_t)v64[i];
            int32_t e32;
            int64_t e64;
            switch (ops[k]) {
            case WF_UNARY_NEG:
                e32 = (int32_t)(0u - u);
                e64 = (int64_t)(0u - w);
                break;
            case WF_UNARY_ABS:
                e32 = v32[i] < 0 ? (int32_t)(0u - u) : v32[i];
                e64 = v64[i] < 0 ? (int64_t)(0u - w) : v64[i];
                break;
            case WF_UNARY_SQUARE:
                e32 = (int32_t)(u * u);
                e64 = (int64_t)(w * w);
                break;
            case WF_UNARY_RELU:
                e32 = v32[i] < 0 ? 0 : v32[i];
                e64 = v64[i] < 0 ? 0 : v64[i];
                break;
            default:
                e32 = (v32[i] > 0) - (v32[i] < 0);
                e64 = (v64[i] > 0) - (v64[i] < 0);
                break;
            }
            cr_assert_eq(r32[i], e32, "op %d i32 element %d", ops[k], i);
            cr_assert_eq(r64[i], e64, "op %d i64 element %d", ops[k], i);
        }
        wf_tensor_release(x32);
        wf_tensor_release(x64);
        wf_tensor_release(o32);
        wf_tensor_release(o64);
    }
}

Test(ops_elementwise, transcendental_op_on_integers_is_edtype)
{
    wf_tensor *x = ot_out(WF_I32, WF_SHAPE(3));
    wf_tensor *out = ot_out(WF_I32, WF_SHAPE(3));
    int rc = wf__exp_cpu(&serial, x, out);
    cr_assert_eq(rc, WF_EDTYPE, "got %s", wf_err_name(rc));
    cr_assert(strstr(wf_last_errmsg(), "i32"), "%s", wf_last_errmsg());
    wf_tensor_release(x);
    wf_tensor_release(out);
}

Test(ops_elementwise, nan_passes_through_relu_sign_and_maximum)
{
    double v[] = { NAN, -1, 2 };
    wf_tensor *x = wf_tensor_from(WF_F64, WF_SHAPE(3), v);
    wf_tensor *out = ot_out(WF_F64, WF_SHAPE(3));
    cr_assert_eq(wf__relu_cpu(&serial, x, out), 0);
    cr_assert(isnan(wf_tensor_get(out, 0)));
    cr_assert_eq(wf__sign_cpu(&serial, x, out), 0);
    cr_assert(isnan(wf_tensor_get(out, 0)));
    double w[] = { 0, NAN, 1 };
    wf_tensor *y = wf_tensor_from(WF_F64, WF_SHAPE(3), w);
    cr_assert_eq(wf__maximum_cpu(&serial, x, y, out), 0);
    cr_assert(isnan(wf_tensor_get(out, 0)) && isnan(wf_tensor_get(out, 1)));
    cr_assert_eq(wf_tensor_get(out, 2), 2);
    cr_assert_eq(wf__minimum_cpu(&serial, x, y, out), 0);
    cr_assert(isnan(wf_tensor_get(out, 0)) && isnan(wf_tensor_get(out, 1)));
    cr_assert_eq(wf_tensor_get(out, 2), 1);
    wf_tensor_release(x);
    wf_tensor_release(y);
    wf_tensor_release(out);
}

/* ---- Binary ---------------------------------------------------------------------------------- */

static double ref_binary(wf_binary_op op, double a, double b)
{
    switch (op) {
    case WF_BINARY_ADD:
        return a + b;
    case WF_BINARY_SUB:
        return a - b;
    case WF_BINARY_MUL:
        return a * b;
    case WF_BINARY_DIV:
        return a / b;
    case WF_BINARY_POW:
        return pow(a, b);
    case WF_BINARY_MAXIMUM:
        return a > b ? a : b;
    case WF_BINARY_MINIMUM:
        return a < b ? a : b;
    case WF_BINARY_EQ:
        return a == b;
    case WF_BINARY_NE:
        return a != b;
    case WF_BINARY_LT:
        return a < b;
    case WF_BINARY_LE:
        return a <= b;
    case WF_BINARY_GT:
        return a > b;
    case WF_BINARY_GE:
        return a >= b;
    default:
        return NAN;
    }
}

typedef struct pair_case {
    wf_shape a, b, out;
    ot_layout la, lb;
} pair_case;

static pair_case pair_cases(int i)
{
    switch (i) {
    case 0:
        return (pair_case){ WF_SHAPE(31, 67), WF_SHAPE(31, 67), WF_SHAPE(31, 67), OT_CONTIG,
                            OT_CONTIG };
    case 1: /* bias: a row broadcast down the batch */
        return (pair_case){ WF_SHAPE(9, 13), WF_SHAPE(13), WF_SHAPE(9, 13), OT_CONTIG, OT_CONTIG };
    case 2:
        return (pair_case){ WF_SHAPE(4, 1, 5), WF_SHAPE(3, 1), WF_SHAPE(4, 3, 5), OT_CONTIG,
                            OT_CONTIG };
    case 3: /* a scalar on either side */
        return (pair_case){ WF_SCALAR, WF_SHAPE(2, 3), WF_SHAPE(2, 3), OT_CONTIG, OT_CONTIG };
    case 4:
        return (pair_case){ WF_SHAPE(6, 5), WF_SCALAR, WF_SHAPE(6, 5), OT_CONTIG, OT_CONTIG };
    case 5: /* transposed against negative strides */
        return (pair_case){ WF_SHAPE(17, 19), WF_SHAPE(17, 19), WF_SHAPE(17, 19),
                            (ot_layout){ perm_rev2, 0, 0 }, (ot_layout){ NULL, 0x3, 0 } };
    default: /* zero strides in a view, broadcast against a permuted view */
        return (pair_case){ WF_SHAPE(5, 7, 9), WF_SHAPE(7, 1), WF_SHAPE(5, 7, 9),
                            (ot_layout){ perm_3, 0x2, 0x1 }, (ot_layout){ perm_rev2, 0x1, 0 } };
    }
}

#define N_PAIR_CASES 7

static void check_binary(wf_binary_op op, wf_dtype dt, int c, double lo, double hi, double blo,
                         double bhi)
{
    pair_case pc = pair_cases(c);
    ot_tensor a = ot_random(dt, pc.a, pc.la, 7 + c * 31 + op, lo, hi);
    ot_tensor b = ot_random(dt, pc.b, pc.lb, 9 + c * 17 + op, blo, bhi);
    bool cmp = op >= WF_BINARY_EQ;
    wf_tensor *out = ot_out(cmp ? WF_BOOL : dt, pc.out);
    int rc = wf__binary_cpu(&serial, op, a.t, b.t, out);
    cr_assert_eq(rc, 0, "op %d %s case %d: %s", op, wf_dtype_name(dt), c, wf_last_errmsg());
    ot_tol tol = cmp ? (ot_tol){ 0, 0 } : ot_tol_elementwise(dt);
    for (int64_t i = 0; i < wf_tensor_numel(out); i++) {
        double av = wf_tensor_get(a.t, ot_bcast_index(pc.out, pc.a, i));
        double bv = wf_tensor_get(b.t, ot_bcast_index(pc.out, pc.b, i));
        double want = ref_binary(op, av, bv), got = wf_tensor_get(out, i);
        if (!cmp && (dt == WF_I32 || dt == WF_I64) && op == WF_BINARY_DIV)
            want = trunc(av / bv);
        cr_assert(ot_close(got, want, tol),
                  "op %d %s case %d element %lld: %g op %g = %.9g, want %.9g", op,
                  wf_dtype_name(dt), c, (long long)i, av, bv, got, want);
    }
    wf_tensor_release(out);
    ot_release(&a);
    ot_release(&b);
}

Test(ops_elementwise, binary_float_ops_broadcast_and_match_f64_reference)
{
    for (int op = WF_BINARY_ADD; op <= WF_BINARY_MINIMUM; op++)
        for (size_t di = 0; di < sizeof float_dtypes / sizeof *float_dtypes; di++)
            for (int c = 0; c < N_PAIR_CASES; c++) {
                bool pw = op == WF_BINARY_POW, dv = op == WF_BINARY_DIV;
                check_binary(op, float_dtypes[di], c, pw ? 0.1 : -3, 3,
                             pw   ? -2
                             : dv ? 0.5
                                  : -3,
                             pw ? 2 : 3);
            }
}

Test(ops_elementwise, binary_integer_ops_broadcast_and_div_truncates_toward_zero)
{
    const wf_binary_op ops[] = { WF_BINARY_ADD, WF_BINARY_SUB, WF_BINARY_MUL, WF_BINARY_MAXIMUM,
                                 WF_BINARY_MINIMUM };
    const wf_dtype dts[] = { WF_I32, WF_I64 };
    for (size_t k = 0; k < sizeof ops / sizeof *ops; k++)
        for (int d = 0; d < 2; d++)
            for (int c = 0; c < N_PAIR_CASES; c++)
                check_binary(ops[k], dts[d], c, -1000, 1000, -1000, 1000);
    for (int d = 0; d < 2; d++)
        for (int c = 0; c < N_PAIR_CASES; c++)
            check_binary(WF_BINARY_DIV, dts[d], c, -1000, 1000, 1, 50); /* positive divisors */
    /* negative divisors and INT_MIN / -1 */
    int32_t a[] = { -7, 7, -7, INT32_MIN, 9 }, b[] = { 2, -2, -2, -1, -4 };
    int32_t want[] = { -3, -3, 3, INT32_MIN, -2 };
    wf_tensor *ta = wf_tensor_from(WF_I32, WF_SHAPE(5), a),
              *tb = wf_tensor_from(WF_I32, WF_SHAPE(5), b);
    wf_tensor *out = ot_out(WF_I32, WF_SHAPE(5));
    cr_assert_eq(wf__div_cpu(&serial, ta, tb, out), 0, "%s", wf_last_errmsg());
    for (int i = 0; i < 5; i++)
        cr_assert_eq(wf_tensor_data_i32(out)[i], want[i], "%d / %d", a[i], b[i]);
    wf_tensor_release(ta);
    wf_tensor_release(tb);
    wf_tensor_release(out);
}

Test(ops_elementwise, integer_division_by_zero_is_einval_naming_the_element)
{
    int64_t a[] = { 1, 2, 3, 4 }, b[] = { 1, 1, 0, 1 };
    wf_tensor *ta = wf_tensor_from(WF_I64, WF_SHAPE(4), a),
              *tb = wf_tensor_from(WF_I64, WF_SHAPE(4), b);
    wf_tensor *out = ot_out(WF_I64, WF_SHAPE(4));
    int rc = wf__div_cpu(&serial, ta, tb, out);
    cr_assert_eq(rc, WF_EINVAL, "got %s", wf_err_name(rc));
    cr_assert(strstr(wf_last_errmsg(), "element 2"), "%s", wf_last_errmsg());
    wf_tensor_release(ta);
    wf_tensor_release(tb);
    wf_tensor_release(out);
}

Test(ops_elementwise, comparisons_give_bool_on_every_dtype_with_broadcasting)
{
    const wf_dtype dts[] = { WF_F32, WF_F64, WF_BF16, WF_F16, WF_I32, WF_I64, WF_U8 };
    for (int op = WF_BINARY_EQ; op <= WF_BINARY_GE; op++)
        for (size_t d = 0; d < sizeof dts / sizeof *dts; d++)
            for (int c = 0; c < N_PAIR_CASES; c++)
                check_binary(op, dts[d], c, 0, 4, 0, 4); /* small integers: many ties */
}

Test(ops_elementwise, pow_on_integers_and_mixed_dtypes_are_edtype)
{
    wf_tensor *a = ot_out(WF_I32, WF_SHAPE(2)), *b = ot_out(WF_I32, WF_SHAPE(2));
    wf_tensor *f = ot_out(WF_F32, WF_SHAPE(2)), *out = ot_out(WF_I32, WF_SHAPE(2));
    cr_assert_eq(wf__pow_cpu(&serial, a, b, out), WF_EDTYPE);
    int rc = wf__add_cpu(&serial, a, f, out);
    cr_assert_eq(rc, WF_EDTYPE, "got %s", wf_err_name(rc));
    cr_assert(strstr(wf_last_errmsg(), "i32") && strstr(wf_last_errmsg(), "f32"), "%s",
              wf_last_errmsg());
    wf_tensor_release(a);
    wf_tensor_release(b);
    wf_tensor_release(f);
    wf_tensor_release(out);
}

/* The CUDA twins take the dtypes these shared checks accept, which are the ones the CPU has
 * loops for: pinned here to the rule the CUDA entries had before they shared the checks. */
Test(ops_elementwise, shared_checks_accept_the_dtypes_every_device_computes_in)
{
    for (int d = 1; d < WF_DTYPE_COUNT; d++) {
        wf_dtype dt = (wf_dtype)d;
        bool fl = wf_dtype_is_float(dt), in = dt == WF_I32 || dt == WF_I64;
        wf_tensor *x = ot_out(dt, WF_SHAPE(2));
        const char *name = NULL;
        for (int op = 0; op < WF_UNARY_COUNT; op++) {
            bool int_op = op == WF_UNARY_NEG || op == WF_UNARY_ABS || op == WF_UNARY_SQUARE ||
                          op == WF_UNARY_RELU || op == WF_UNARY_SIGN;
            int want = fl || (in && int_op) ? 0 : WF_EDTYPE;
            int rc = wf__ops_unary_check((wf_unary_op)op, x, &name);
            cr_assert_eq(rc, want, "unary %d on %s: got %s", op, wf_dtype_name(dt),
                         wf_err_name(rc));
        }
        for (int op = 0; op < WF_BINARY_COUNT; op++) {
            bool cmp = op >= WF_BINARY_EQ;
            bool ok = fl || (in && op != WF_BINARY_POW) || (cmp && (dt == WF_U8 || dt == WF_BOOL));
            int rc = wf__ops_binary_check((wf_binary_op)op, x, x, &name);
            cr_assert_eq(rc, ok ? 0 : WF_EDTYPE, "binary %d on %s: got %s", op, wf_dtype_name(dt),
                         wf_err_name(rc));
        }
        int rc = wf__ops_act_grad_check(WF_ACT_GRAD_RELU, x, x, x, &name);
        cr_assert_eq(rc, fl ? 0 : WF_EDTYPE, "relu_grad on %s: got %s", wf_dtype_name(dt),
                     wf_err_name(rc));
        wf_tensor_release(x);
    }
}

Test(ops_elementwise, shapes_that_do_not_broadcast_are_eshape_naming_both)
{
    wf_tensor *a = ot_out(WF_F32, WF_SHAPE(3, 4)), *b = ot_out(WF_F32, WF_SHAPE(5, 4));
    wf_tensor *out = ot_out(WF_F32, WF_SHAPE(3, 4));
    int rc = wf__add_cpu(&serial, a, b, out);
    cr_assert_eq(rc, WF_ESHAPE, "got %s", wf_err_name(rc));
    ot_assert_names(wf_last_errmsg(), WF_SHAPE(3, 4), WF_SHAPE(5, 4));
    wf_tensor_release(a);
    wf_tensor_release(b);
    wf_tensor_release(out);
}

Test(ops_elementwise, wrong_out_shape_or_dtype_is_refused_naming_both_shapes)
{
    wf_tensor *a = ot_out(WF_F32, WF_SHAPE(2, 3)), *b = ot_out(WF_F32, WF_SHAPE(3));
    wf_tensor *bad_shape = ot_out(WF_F32, WF_SHAPE(3, 2)), *bad_dt = ot_out(WF_F64, WF_SHAPE(2, 3));
    int rc = wf__mul_cpu(&serial, a, b, bad_shape);
    cr_assert_eq(rc, WF_ESHAPE, "got %s", wf_err_name(rc));
    ot_assert_names(wf_last_errmsg(), WF_SHAPE(3, 2), WF_SHAPE(2, 3));
    rc = wf__mul_cpu(&serial, a, b, bad_dt);
    cr_assert_eq(rc, WF_EDTYPE, "got %s", wf_err_name(rc));
    rc = wf__lt_cpu(&serial, a, b, bad_dt); /* comparisons want bool */
    cr_assert_eq(rc, WF_EDTYPE, "got %s", wf_err_name(rc));
    rc = wf__tanh_cpu(&serial, a, bad_shape);
    cr_assert_eq(rc, WF_ESHAPE, "got %s", wf_err_name(rc));
    ot_assert_names(wf_last_errmsg(), WF_SHAPE(3, 2), WF_SHAPE(2, 3));
    cr_assert_eq(wf__tanh_cpu(&serial, NULL, bad_shape), WF_EINVAL);
    cr_assert_eq(wf__tanh_cpu(&serial, a, NULL), WF_EINVAL);
    cr_assert_eq(wf__unary_cpu(&serial, (wf_unary_op)99, 0, a, bad_shape), WF_EINVAL);
    wf_tensor_release(a);
    wf_tensor_release(b);
    wf_tensor_release(bad_shape);
    wf_tensor_release(bad_dt);
}

/* ---- where and cast ----------------------------------------------------------------------- */

Test(ops_elementwise, where_broadcasts_all_three_operands_on_every_dtype)
{
    const wf_dtype dts[] = { WF_F32, WF_F64, WF_BF16, WF_I32, WF_I64, WF_U8 };
    for (size_t d = 0; d < sizeof dts / sizeof *dts; d++) {
        ot_tensor c = ot_random(WF_BOOL, WF_SHAPE(4, 1, 6), (ot_layout){ NULL, 0x4, 0 }, 3, 0, 2);
        ot_tensor a = ot_random(dts[d], WF_SHAPE(5, 6), (ot_layout){ perm_rev2, 0, 0 }, 4, 0, 100);
        ot_tensor b = ot_random(dts[d], WF_SHAPE(1), OT_CONTIG, 5, 0, 100);
        wf_shape os = WF_SHAPE(4, 5, 6);
        wf_tensor *out = ot_out(dts[d], os);
        cr_assert_eq(wf__where_cpu(&serial, c.t, a.t, b.t, out), 0, "%s", wf_last_errmsg());
        for (int64_t i = 0; i < 120; i++) {
            double cv = wf_tensor_get(c.t, ot_bcast_index(os, WF_SHAPE(4, 1, 6), i));
            double want = cv != 0 ? wf_tensor_get(a.t, ot_bcast_index(os, WF_SHAPE(5, 6), i))
                                  : wf_tensor_get(b.t, 0);
            cr_assert_eq(wf_tensor_get(out, i), want, "%s element %lld", wf_dtype_name(dts[d]),
                         (long long)i);
        }
        wf_tensor_release(out);
        ot_release(&a);
        ot_release(&b);
        ot_release(&c);
    }
    wf_tensor *c = ot_out(WF_F32, WF_SHAPE(2)), *a = ot_out(WF_F32, WF_SHAPE(2));
    wf_tensor *out = ot_out(WF_F32, WF_SHAPE(2));
    cr_assert_eq(wf__where_cpu(&serial, c, a, a, out), WF_EDTYPE); /* cond must be bool */
    wf_tensor_release(c);
    wf_tensor_release(a);
    wf_tensor_release(out);
}

Test(ops_elementwise, where_on_contiguous_operands_takes_the_fast_path_correctly)
{
    const wf_dtype dts[] = { WF_U8, WF_F16, WF_F32, WF_F64 };
    for (size_t d = 0; d < sizeof dts / sizeof *dts; d++) {
        ot_tensor c = ot_random(WF_BOOL, WF_SHAPE(3, 101), OT_CONTIG, 21, 0, 2);
        ot_tensor a = ot_random(dts[d], WF_SHAPE(3, 101), OT_CONTIG, 22, 0, 100);
        ot_tensor b = ot_random(dts[d], WF_SHAPE(3, 101), OT_CONTIG, 23, 0, 100);
        wf_tensor *out = ot_out(dts[d], WF_SHAPE(3, 101));
        cr_assert_eq(wf__where_cpu(&serial, c.t, a.t, b.t, out), 0, "%s", wf_last_errmsg());
        for (int64_t i = 0; i < 303; i++) {
            double want =
                wf_tensor_get(c.t, i) != 0 ? wf_tensor_get(a.t, i) : wf_tensor_get(b.t, i);
            cr_assert_eq(wf_tensor_get(out, i), want, "%s element %lld", wf_dtype_name(dts[d]),
                         (long long)i);
        }
        wf_tensor_release(out);
        ot_release(&a);
        ot_release(&b);
        ot_release(&c);
    }
}

Test(ops_elementwise, cast_between_all_dtypes_follows_core_conversion_rules)
{
    const wf_dtype all[] = { WF_F32, WF_F64, WF_I32, WF_I64, WF_U8, WF_BOOL, WF_BF16, WF_F16 };
    double vals[] = { 0,    1,     -1,  2.5,      -2.5,      3.75, 100,   -100, 300,
                      1e10, -1e10, NAN, INFINITY, -INFINITY, 0.3,  65504, 7 };
    int n = sizeof vals / sizeof *vals;
    wf_tensor *src64 = wf_tensor_from(WF_F64, WF_SHAPE(n), vals);
    for (size_t s = 0; s < 8; s++) {
        /* The source: the values as dtype 's', read through a negative-stride view. */
        wf_tensor *src = ot_out(all[s], WF_SHAPE(n));
        cr_assert_eq(wf__cast_cpu(&serial, src64, src), 0, "%s", wf_last_errmsg());
        size_t es = wf_dtype_size(all[s]);
        wf_tensor *view = NULL;
        int64_t st = -1;
        cr_assert_eq(wf_tensor_view(all[s], WF_SHAPE(n), &st,
                                    (const char *)wf_tensor_data(src) + (n - 1) * es, &view),
                     0);
        int64_t exact[sizeof vals / sizeof *vals]; /* integer sources, without a double */
        cr_assert_eq(wf_tensor_read(view, WF_I64, exact, sizeof exact), 0);
        for (size_t d = 0; d < 8; d++) {
            wf_tensor *out = ot_out(all[d], WF_SHAPE(n));
            cr_assert_eq(wf__cast_cpu(&serial, view, out), 0, "%s", wf_last_errmsg());
            for (int i = 0; i < n; i++) {
                double v = wf_tensor_get(view, i), got = wf_tensor_get(out, i), want;
                bool int_src = all[s] == WF_I32 || all[s] == WF_I64 || all[s] == WF_U8;
                bool int_dst = all[d] == WF_I32 || all[d] == WF_I64 || all[d] == WF_U8;
                if (int_src && int_dst) { /* integer to integer wraps */
                    int64_t iv = exact[i];
                    want = all[d] == WF_I32  ? (double)(int32_t)(uint32_t)iv
                           : all[d] == WF_U8 ? (double)(uint8_t)iv
                                             : (double)iv;
                } else {
                    /* core's rule: what wf_tensor_read gives */
                    char buf[8];
                    wf_tensor *one = wf_tensor_from(WF_F64, WF_SCALAR, &v);
                    cr_assert_eq(wf_tensor_read(one, all[d], buf, sizeof buf), 0);
                    wf_tensor *conv = wf_tensor_from(all[d], WF_SCALAR, buf);
                    want = wf_tensor_get(conv, 0);
                    wf_tensor_release(one);
                    wf_tensor_release(conv);
                }
                cr_assert(ot_close(got, want, (ot_tol){ 0, 0 }), "%s -> %s: %g gave %g, want %g",
                          wf_dtype_name(all[s]), wf_dtype_name(all[d]), v, got, want);
            }
            wf_tensor_release(out);
        }
        wf_tensor_release(view);
        wf_tensor_release(src);
    }
    wf_tensor_release(src64);
}

Test(ops_elementwise, cast_needs_matching_shapes)
{
    wf_tensor *x = ot_out(WF_F32, WF_SHAPE(2, 3)), *out = ot_out(WF_I32, WF_SHAPE(6));
    int rc = wf__cast_cpu(&serial, x, out);
    cr_assert_eq(rc, WF_ESHAPE, "got %s", wf_err_name(rc));
    ot_assert_names(wf_last_errmsg(), WF_SHAPE(6), WF_SHAPE(2, 3));
    wf_tensor_release(x);
    wf_tensor_release(out);
}

Test(ops_elementwise, kernels_may_write_in_place_over_an_input)
{
    const wf_dtype dts[] = { WF_F32, WF_BF16 };
    for (int d = 0; d < 2; d++) {
        ot_tensor x = ot_random(dts[d], WF_SHAPE(1001), OT_CONTIG, 31, -2, 2);
        ot_tensor y = ot_random(dts[d], WF_SHAPE(1001), OT_CONTIG, 31, -2, 2); /* a copy */
        ot_tensor b = ot_random(dts[d], WF_SHAPE(1), OT_CONTIG, 32, -2, 2);
        wf_tensor *ref = ot_out(dts[d], WF_SHAPE(1001));
        cr_assert_eq(wf__add_cpu(&serial, y.t, b.t, ref), 0);
        cr_assert_eq(wf__add_cpu(&serial, x.t, b.t, x.t), 0, "%s", wf_last_errmsg());
        ot_assert_same_bits(x.t, ref, "in-place add");
        cr_assert_eq(wf__exp_cpu(&serial, ref, ref), 0);
        cr_assert_eq(wf__exp_cpu(&serial, x.t, x.t), 0);
        ot_assert_same_bits(x.t, ref, "in-place exp");
        wf_tensor_release(ref);
        ot_release(&x);
        ot_release(&y);
        ot_release(&b);
    }
}

/* ---- Determinism and parallel splitting ------------------------------------------------------ */

Test(ops_elementwise, big_ops_give_identical_bits_with_0_1_and_2_workers)
{
    ot_rts rts = ot_rts_create();
    const wf_kctx ctxs[3] = { { .rt = NULL }, { .rt = rts.one }, { .rt = rts.two } };
    wf_shape big = WF_SHAPE(300, 701);
    ot_tensor a = ot_random(WF_F32, big, (ot_layout){ perm_rev2, 0x1, 0 }, 11, -3, 3);
    ot_tensor b = ot_random(WF_F32, WF_SHAPE(701), OT_CONTIG, 12, -3, 3);
    ot_tensor h = ot_random(WF_BF16, big, OT_CONTIG, 13, -3, 3);
    wf_tensor *outs[3][3];
    for (int k = 0; k < 3; k++) {
        outs[k][0] = ot_out(WF_F32, big);
        outs[k][1] = ot_out(WF_F32, big);
        outs[k][2] = ot_out(WF_BF16, big);
        cr_assert_eq(wf__add_cpu(&ctxs[k], a.t, b.t, outs[k][0]), 0, "%s", wf_last_errmsg());
        cr_assert_eq(wf__gelu_tanh_cpu(&ctxs[k], a.t, outs[k][1]), 0, "%s", wf_last_errmsg());
        cr_assert_eq(wf__sigmoid_cpu(&ctxs[k], h.t, outs[k][2]), 0, "%s", wf_last_errmsg());
    }
    for (int k = 1; k < 3; k++)
        for (int j = 0; j < 3; j++)
            ot_assert_same_bits(outs[0][j], outs[k][j], "elementwise");
    /* and the parallel result is right */
    for (int64_t i = 0; i < wf_tensor_numel(outs[2][0]); i += 997) {
        double want = wf_tensor_get(a.t, i) + wf_tensor_get(b.t, i % 701);
        cr_assert(ot_close(wf_tensor_get(outs[2][0], i), want, ot_tol_elementwise(WF_F32)));
    }
    for (int k = 0; k < 3; k++)
        for (int j = 0; j < 3; j++)
            wf_tensor_release(outs[k][j]);
    ot_release(&a);
    ot_release(&b);
    ot_release(&h);
    ot_rts_destroy(&rts);
}

Test(ops_elementwise, division_by_zero_in_a_parallel_piece_fails_the_call)
{
    ot_rts rts = ot_rts_create();
    const wf_kctx ctx = { .rt = rts.two };
    int64_t n = 100000;
    wf_tensor *a = ot_out(WF_I32, WF_SHAPE(n)), *b = ot_out(WF_I32, WF_SHAPE(n));
    int32_t *bd = (int32_t *)wf_tensor_data(b); /* fresh, not yet shared: fill it */
    for (int64_t i = 0; i < n; i++)
        bd[i] = i == 77777 ? 0 : 3;
    wf_tensor *out = ot_out(WF_I32, WF_SHAPE(n));
    int rc = wf__div_cpu(&ctx, a, b, out);
    cr_assert_eq(rc, WF_EINVAL, "got %s", wf_err_name(rc));
    wf_tensor_release(a);
    wf_tensor_release(b);
    wf_tensor_release(out);
    ot_rts_destroy(&rts);
}
