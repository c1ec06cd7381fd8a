/* tests/ops/test_ops_eager.c: the op constructors of weft/ops.h through the public API:
 * every constructor in an eager graph against an f64 reference computed here (f32 and f64,
 * integer forms where the op takes them), dtype and shape inference in static graphs with -1
 * dimensions (examples/design_example.c's model), and the failures: shapes and dtypes that
 * do not fit (NULL, WF_ESHAPE / WF_EDTYPE / WF_EINVAL, a message naming the op, both shapes and the
 * file:line of the call), NULL inputs keeping the first error, and source locations that
 * stay right after failures. Links libweft.so. */
#include "eager_util.h"

TestSuite(ops_eager, .init = setup, .fini = teardown, .timeout = WF_TEST_TIMEOUT(60));

/* 'n' values in [lo, hi) from 'seed'. */
static void fill(double *v, int n, uint64_t seed, double lo, double hi)
{
    for (int i = 0; i < n; i++)
        v[i] = lo + (hi - lo) * (double)(wf_test_rand(&seed) >> 11) / 9007199254740992.0;
}

static double tol_for(wf_dtype dt)
{
    return dt == WF_F32 ? 2e-6 : dt == WF_F64 ? 1e-12 : 0;
}

/* Asserts that eager node 'y' exists and holds 'want' (dtype 'dt', shape 's'), each element
 * within tol * (1 + |want|). */
static void expect(const char *what, wf_graph *g, const wf_node *y, wf_dtype dt, wf_shape s,
                   const double *want, double tol)
{
    cr_assert_not_null(y, "%s: %s", what, wf_graph_errmsg(g));
    char a[160], b[160];
    cr_assert_eq(wf_node_dtype(y), dt, "%s: dtype %s, want %s", what,
                 wf_dtype_name(wf_node_dtype(y)), wf_dtype_name(dt));
    cr_assert(wf_shape_equal(wf_node_shape(y), s), "%s: shape %s, want %s", what,
              wf_shape_str(wf_node_shape(y), a, sizeof a), wf_shape_str(s, b, sizeof b));
    const wf_tensor *v = wf_node_value(y);
    cr_assert_not_null(v, "%s: an eager node has a value", what);
    cr_assert_eq(wf_tensor_dtype(v), dt, "%s", what);
    cr_assert(wf_shape_equal(wf_tensor_shape(v), s), "%s: value shape", what);
    int64_t n = wf_tensor_numel(v);
    for (int64_t i = 0; i < n; i++) {
        double got = wf_tensor_get(v, i), w = want[i];
        if (isnan(w)) {
            cr_assert(isnan(got), "%s[%lld]: got %.17g, want NaN", what, (long long)i, got);
            continue;
        }
        cr_assert(fabs(got - w) <= tol * (1 + fabs(w)), "%s[%lld]: got %.17g, want %.17g", what,
                  (long long)i, got, w);
    }
}

/* Asserts that the graph failed with 'code' and that its message holds each of 'needles'
 * (NULL-terminated). */
static void expect_fail(wf_graph *g, const wf_node *y, int code, const char *const *needles)
{
    cr_assert_null(y, "the call should fail");
    cr_assert_eq(wf_graph_status(g), code, "status %s, want %s: %s",
                 wf_err_name(wf_graph_status(g)), wf_err_name(code), wf_graph_errmsg(g));
    for (int i = 0; needles[i]; i++)
        cr_assert(strstr(wf_graph_errmsg(g), needles[i]), "message '%s' should contain '%s'",
                  wf_graph_errmsg(g), needles[i]);
}

static const char *here(int line, char *buf, size_t size)
{
    snprintf(buf, size, "test_ops_eager.c:%d", line);
    return buf;
}

/* ---- Unary ---------------------------------------------------------------------------------- */

typedef wf_node *(*unary_ctor)(wf_graph *, wf_node *);

static double r_sigmoid(double v)
{
    return 1 / (1 + exp(-v));
}

static double r_relu(double v)
{
    return v < 0 ? 0 : v;
}

static double r_silu(double v)
{
    return v * r_sigmoid(v);
}

static double r_sign(double v)
{
    return v > 0 ? 1 : v < 0 ? -1 : 0;
}

static double r_neg(double v)
{
    return -v;
}

static double r_square(double v)
{
    return v * v;
}

static double r_rsqrt(double v)
{
    return 1 / sqrt(v);
}

static const struct {
    const char *name;
    unary_ctor ctor;
    double (*ref)(double);
    bool positive; /* needs x > 0 */
} unary_cases[] = {
    { "neg", wf_neg, r_neg, false },
    { "abs", wf_abs, fabs, false },
    { "exp", wf_exp, exp, false },
    { "log", wf_log, log, true },
    { "sqrt", wf_sqrt, sqrt, true },
    { "rsqrt", wf_rsqrt, r_rsqrt, true },
    { "square", wf_square, r_square, false },
    { "tanh", wf_tanh, tanh, false },
    { "sigmoid", wf_sigmoid, r_sigmoid, false },
    { "relu", wf_relu, r_relu, false },
    { "silu", wf_silu, r_silu, false },
    { "sign", wf_sign, r_sign, false },
};

Test(ops_eager, every_unary_op_matches_an_f64_reference_in_f32_and_f64)
{
    static const wf_dtype dts[] = { WF_F32, WF_F64 };
    double x[12], want[12];
    for (size_t d = 0; d < 2; d++) {
        wf_graph *g = new_graph(WF_EAGER);
        for (size_t c = 0; c < sizeof unary_cases / sizeof unary_cases[0]; c++) {
            fill(x, 12, 17 + c, unary_cases[c].positive ? 0.05 : -4, 4);
            x[0] = unary_cases[c].positive ? 1 : 0;
            /* Round the inputs to the dtype first, so the reference sees what the op sees. */
            wf_node *xn = cst(g, dts[d], WF_SHAPE(3, 4), x);
            for (int i = 0; i < 12; i++)
                want[i] = unary_cases[c].ref(wf_tensor_get(wf_node_value(xn), i));
            wf_node *y = unary_cases[c].ctor(g, xn);
            char what[64];
            snprintf(what, sizeof what, "%s %s", unary_cases[c].name, wf_dtype_name(dts[d]));
            expect(what, g, y, dts[d], WF_SHAPE(3, 4), want, tol_for(dts[d]) * 4);
            cr_assert_str_eq(wf_node_op(y), unary_cases[c].name);
        }
        wf_graph_destroy(g);
    }
}

Test(ops_eager, leaky_relu_and_both_gelu_forms_match_their_formulas)
{
    wf_graph *g = new_graph(WF_EAGER);
    double x[8] = { -3, -1, -0.25, 0, 0.25, 1, 2, 5 }, w1[8], w2[8], w3[8];
    for (int i = 0; i < 8; i++) {
        w1[i] = x[i] < 0 ? 0.2 * x[i] : x[i];
        w2[i] = 0.5 * x[i] * (1 + erf(x[i] / sqrt(2.0)));
        w3[i] = 0.5 * x[i] *
                (1 + tanh(sqrt(2.0 / 3.14159265358979323846) * (x[i] + 0.044715 * pow(x[i], 3))));
    }
    wf_node *xn = cst(g, WF_F64, WF_SHAPE(8), x);
    expect("leaky_relu", g, wf_leaky_relu(g, xn, 0.2), WF_F64, WF_SHAPE(8), w1, 1e-12);
    wf_node *ge = wf_gelu(g, xn, false), *gt = wf_gelu(g, xn, true);
    expect("gelu", g, ge, WF_F64, WF_SHAPE(8), w2, 1e-12);
    expect("gelu_tanh", g, gt, WF_F64, WF_SHAPE(8), w3, 1e-12);
    cr_assert_str_eq(wf_node_op(ge), "gelu");
    cr_assert_str_eq(wf_node_op(gt), "gelu_tanh");
    wf_graph_destroy(g);
}

Test(ops_eager, integer_unary_ops_work_on_i32_and_i64)
{
    wf_graph *g = new_graph(WF_EAGER);
    double x[5] = { -7, -1, 0, 2, 9 };
    static const wf_dtype dts[] = { WF_I32, WF_I64 };
    for (int d = 0; d < 2; d++) {
        wf_node *xn = cst(g, dts[d], WF_SHAPE(5), x);
        double neg[5], ab[5], sq[5], re[5], sg[5];
        for (int i = 0; i < 5; i++) {
            neg[i] = -x[i];
            ab[i] = fabs(x[i]);
            sq[i] = x[i] * x[i];
            re[i] = r_relu(x[i]);
            sg[i] = r_sign(x[i]);
        }
        expect("neg", g, wf_neg(g, xn), dts[d], WF_SHAPE(5), neg, 0);
        expect("abs", g, wf_abs(g, xn), dts[d], WF_SHAPE(5), ab, 0);
        expect("square", g, wf_square(g, xn), dts[d], WF_SHAPE(5), sq, 0);
        expect("relu", g, wf_relu(g, xn), dts[d], WF_SHAPE(5), re, 0);
        expect("sign", g, wf_sign(g, xn), dts[d], WF_SHAPE(5), sg, 0);
    }
    wf_graph_destroy(g);
}

Test(ops_eager, cast_truncates_to_integers_and_makes_bools)
{
    wf_graph *g = new_graph(WF_EAGER);
    double x[4] = { -1.75, 2.5, 0, 3.75 };
    wf_node *xn = cst(g, WF_F32, WF_SHAPE(2, 2), x);
    double wi[4] = { -1, 2, 0, 3 }, wb[4] = { 1, 1, 0, 1 };
    wf_node *i = wf_cast(g, xn, WF_I32);
    expect("to i32", g, i, WF_I32, WF_SHAPE(2, 2), wi, 0);
    expect("to bool", g, wf_cast(g, xn, WF_BOOL), WF_BOOL, WF_SHAPE(2, 2), wb, 0);
    expect("i32 to f64", g, wf_cast(g, i, WF_F64), WF_F64, WF_SHAPE(2, 2), wi, 0);
    expect("f32 to f64", g, wf_cast(g, xn, WF_F64), WF_F64, WF_SHAPE(2, 2), x, 0);
    wf_graph_destroy(g);
}

Test(ops_eager, bf16_and_f16_are_taken_and_rounded_on_store)
{
    wf_graph *g = new_graph(WF_EAGER);
    double a[4] = { 1, -2, 0.5, 3 }, b[4] = { 0.25, 1, -4, 2 };
    static const wf_dtype dts[] = { WF_BF16, WF_F16 };
    for (int d = 0; d < 2; d++) {
        wf_node *an = cst(g, dts[d], WF_SHAPE(2, 2), a), *bn = cst(g, dts[d], WF_SHAPE(2, 2), b);
        double sum[4], rl[4], mm[4];
        for (int i = 0; i < 4; i++) {
            sum[i] = a[i] + b[i];
            rl[i] = r_relu(a[i]);
        }
        for (int i = 0; i < 2; i++)
            for (int j = 0; j < 2; j++)
                mm[i * 2 + j] = a[i * 2] * b[j] + a[i * 2 + 1] * b[2 + j];
        /* These values are exact in both formats. */
        expect("add", g, wf_add(g, an, bn), dts[d], WF_SHAPE(2, 2), sum, 0);
        expect("relu", g, wf_relu(g, an), dts[d], WF_SHAPE(2, 2), rl, 0);
        expect("matmul", g, wf_matmul(g, an, bn), dts[d], WF_SHAPE(2, 2), mm, 0);
        expect("sum", g, wf_sum(g, an), dts[d], WF_SCALAR, (double[]){ 2.5 }, 0);
    }
    wf_graph_destroy(g);
}

/* ---- Binary, comparisons, where ----------------------------------------------------------------
 */

typedef wf_node *(*binary_ctor)(wf_graph *, wf_node *, wf_node *);

static double r_add(double a, double b)
{
    return a + b;
}

static double r_sub(double a, double b)
{
    return a - b;
}

static double r_mul(double a, double b)
{
    return a * b;
}

static double r_div(double a, double b)
{
    return a / b;
}

static double r_max(double a, double b)
{
    return a > b ? a : b;
}

static double r_min(double a, double b)
{
    return a < b ? a : b;
}

static double r_eq(double a, double b)
{
    return a == b;
}

static double r_ne(double a, double b)
{
    return a != b;
}

static double r_lt(double a, double b)
{
    return a < b;
}

static double r_le(double a, double b)
{
    return a <= b;
}

static double r_gt(double a, double b)
{
    return a > b;
}

static double r_ge(double a, double b)
{
    return a >= b;
}

static const struct {
    const char *name;
    binary_ctor ctor;
    double (*ref)(double, double);
    bool cmp;
} binary_cases[] = {
    { "add", wf_add, r_add, false },
    { "sub", wf_sub, r_sub, false },
    { "mul", wf_mul, r_mul, false },
    { "div", wf_div, r_div, false },
    { "pow", wf_pow, pow, false },
    { "maximum", wf_maximum, r_max, false },
    { "minimum", wf_minimum, r_min, false },
    { "eq", wf_eq, r_eq, true },
    { "ne", wf_ne, r_ne, true },
    { "lt", wf_lt, r_lt, true },
    { "le", wf_le, r_le, true },
    { "gt", wf_gt, r_gt, true },
    { "ge", wf_ge, r_ge, true },
};

Test(ops_eager, every_binary_op_broadcasts_and_matches_an_f64_reference)
{
    static const wf_dtype dts[] = { WF_F32, WF_F64 };
    /* a [2, 3] op b [3]; a few equal pairs so that the comparisons see ties. */
    double a[6] = { 0.5, 1, 2, 3, 0.25, 1.5 }, b[3] = { 1, 2, 0.75 }, want[6];
    for (int d = 0; d < 2; d++) {
        wf_graph *g = new_graph(WF_EAGER);
        wf_node *an = cst(g, dts[d], WF_SHAPE(2, 3), a), *bn = cst(g, dts[d], WF_SHAPE(3), b);
        for (size_t c = 0; c < sizeof binary_cases / sizeof binary_cases[0]; c++) {
            for (int i = 0; i < 6; i++)
                want[i] = binary_cases[c].ref(a[i], b[i % 3]);
            char what[64];
            snprintf(what, sizeof what, "%s %s", binary_cases[c].name, wf_dtype_name(dts[d]));
            wf_node *y = binary_cases[c].ctor(g, an, bn);
            expect(what, g, y, binary_cases[c].cmp ? WF_BOOL : dts[d], WF_SHAPE(2, 3), want,
                   tol_for(dts[d]) * 4);
            /* And the other way round: [3] op [2, 3]. */
            for (int i = 0; i < 6; i++)
                want[i] = binary_cases[c].ref(b[i % 3], a[i]);
            y = binary_cases[c].ctor(g, bn, an);
            expect(what, g, y, binary_cases[c].cmp ? WF_BOOL : dts[d], WF_SHAPE(2, 3), want,
                   tol_for(dts[d]) * 4);
        }
        wf_graph_destroy(g);
    }
}

Test(ops_eager, integer_arithmetic_truncates_and_division_by_zero_fails_the_node)
{
    wf_graph *g = new_graph(WF_EAGER);
    double a[4] = { 7, -7, 9, 100 }, b[4] = { 2, 2, -4, 7 };
    wf_node *an = cst(g, WF_I32, WF_SHAPE(4), a), *bn = cst(g, WF_I32, WF_SHAPE(4), b);
    double q[4] = { 3, -3, -2, 14 }, s[4] = { 9, -5, 5, 107 };
    expect("div", g, wf_div(g, an, bn), WF_I32, WF_SHAPE(4), q, 0);
    expect("add", g, wf_add(g, an, bn), WF_I32, WF_SHAPE(4), s, 0);
    double z[1] = { 0 };
    wf_node *zn = cst(g, WF_I32, WF_SHAPE(1), z);
    int nodes = wf_graph_node_count(g);
    wf_node *y = wf_div(g, an, zn);
    expect_fail(g, y, WF_EINVAL, (const char *const[]){ "div", "division by zero", NULL });
    cr_assert_eq(wf_graph_node_count(g), nodes, "a failed node is not added");
    wf_graph_destroy(g);
}

Test(ops_eager, where_picks_with_broadcasting)
{
    wf_graph *g = new_graph(WF_EAGER);
    double c[3] = { 1, 0, 1 }, a[6] = { 1, 2, 3, 4, 5, 6 }, b[1] = { -1 };
    wf_node *cn = cst(g, WF_BOOL, WF_SHAPE(3), c);
    wf_node *an = cst(g, WF_F32, WF_SHAPE(2, 3), a), *bn = cst(g, WF_F32, WF_SHAPE(1), b);
    double want[6] = { 1, -1, 3, 4, -1, 6 };
    expect("where", g, wf_where(g, cn, an, bn), WF_F32, WF_SHAPE(2, 3), want, 0);
    /* cond from a comparison: relu written as where(x > 0, x, 0). */
    wf_node *zero = cst(g, WF_F32, WF_SCALAR, (double[]){ 0 });
    double x[4] = { -2, 3, 0, -0.5 }, wr[4] = { 0, 3, 0, 0 };
    wf_node *xn = cst(g, WF_F32, WF_SHAPE(4), x);
    expect("where(gt)", g, wf_where(g, wf_gt(g, xn, zero), xn, zero), WF_F32, WF_SHAPE(4), wr, 0);
    wf_graph_destroy(g);
}

/* ---- Reductions -------------------------------------------------------------------------------
 */

Test(ops_eager, reductions_over_axes_match_an_f64_reference)
{
    wf_graph *g = new_graph(WF_EAGER);
    double x[24];
    fill(x, 24, 5, -2, 2);
    wf_node *xn = cst(g, WF_F64, WF_SHAPE(2, 3, 4), x);
    /* Over axes {0, 2} (given as {-1, 0}): [3], or [1, 3, 1] with keepdims. */
    double s[3] = { 0 }, m[3], mx[3], mn[3], pr[3], lse[3];
    for (int j = 0; j < 3; j++) {
        mx[j] = -INFINITY;
        mn[j] = INFINITY;
        pr[j] = 1;
        double e = 0;
        for (int i = 0; i < 2; i++)
            for (int k = 0; k < 4; k++) {
                double v = x[i * 12 + j * 4 + k];
                s[j] += v;
                mx[j] = fmax(mx[j], v);
                mn[j] = fmin(mn[j], v);
                pr[j] *= v;
                e += exp(v);
            }
        m[j] = s[j] / 8;
        lse[j] = log(e);
    }
    const int axes[2] = { -1, 0 };
    expect("sum", g, wf_reduce_sum(g, xn, axes, 2, false), WF_F64, WF_SHAPE(3), s, 1e-12);
    expect("sum keepdims", g, wf_reduce_sum(g, xn, axes, 2, true), WF_F64, WF_SHAPE(1, 3, 1), s,
           1e-12);
    expect("mean", g, wf_reduce_mean(g, xn, axes, 2, false), WF_F64, WF_SHAPE(3), m, 1e-12);
    expect("max", g, wf_reduce_max(g, xn, axes, 2, false), WF_F64, WF_SHAPE(3), mx, 0);
    expect("min", g, wf_reduce_min(g, xn, axes, 2, false), WF_F64, WF_SHAPE(3), mn, 0);
    expect("prod", g, wf_reduce_prod(g, xn, axes, 2, false), WF_F64, WF_SHAPE(3), pr, 1e-12);
    expect("logsumexp", g, wf_reduce_logsumexp(g, xn, axes, 2, false), WF_F64, WF_SHAPE(3), lse,
           1e-12);
    wf_graph_destroy(g);
}

Test(ops_eager, short_forms_reduce_every_axis_to_a_scalar)
{
    wf_graph *g = new_graph(WF_EAGER);
    double x[6] = { 1, -2, 3.5, 4, 0.5, 2 };
    wf_node *xn = cst(g, WF_F32, WF_SHAPE(2, 3), x);
    double s = 9, e = 0;
    for (int i = 0; i < 6; i++)
        e += exp(x[i]);
    expect("sum", g, wf_sum(g, xn), WF_F32, WF_SCALAR, (double[]){ s }, 1e-6);
    expect("mean", g, wf_mean(g, xn), WF_F32, WF_SCALAR, (double[]){ s / 6 }, 1e-6);
    expect("max", g, wf_max(g, xn), WF_F32, WF_SCALAR, (double[]){ 4 }, 0);
    expect("min", g, wf_min(g, xn), WF_F32, WF_SCALAR, (double[]){ -2 }, 0);
    expect("prod", g, wf_prod(g, xn), WF_F32, WF_SCALAR, (double[]){ -28 }, 1e-6);
    expect("logsumexp", g, wf_logsumexp(g, xn), WF_F32, WF_SCALAR, (double[]){ log(e) }, 1e-6);
    /* Integer sums stay integers. */
    wf_node *in = cst(g, WF_I64, WF_SHAPE(3), (double[]){ 5, -9, 40 });
    expect("sum i64", g, wf_sum(g, in), WF_I64, WF_SCALAR, (double[]){ 36 }, 0);
    wf_graph_destroy(g);
}

Test(ops_eager, argmax_gives_i64_indices_of_the_first_maximum)
{
    wf_graph *g = new_graph(WF_EAGER);
    double x[6] = { 1, 7, 7, 4, 0, 9 };
    wf_node *xn = cst(g, WF_F32, WF_SHAPE(2, 3), x);
    expect("argmax -1", g, wf_argmax(g, xn, -1), WF_I64, WF_SHAPE(2), (double[]){ 1, 2 }, 0);
    expect("argmax 0", g, wf_argmax(g, xn, 0), WF_I64, WF_SHAPE(3), (double[]){ 1, 0, 1 }, 0);
    expect("argmax all", g, wf_reduce_argmax(g, xn, NULL, 0, false), WF_I64, WF_SCALAR,
           (double[]){ 5 }, 0);
    expect("argmax keepdims", g, wf_reduce_argmax(g, xn, (const int[]){ 1 }, 1, true), WF_I64,
           WF_SHAPE(2, 1), (double[]){ 1, 2 }, 0);
    wf_graph_destroy(g);
}

/* ---- Matrix products ------------------------------------------------------------------------ */

/* want[b][i][j] = sum_k A(b, i, k) B(b, k, j) for row-major a [nb, M, K] (or [nb, K, M] with
 * ta) and b [nbb, K, N] ([nbb, N, K] with tb); nbb 1 broadcasts. */
static void ref_matmul(const double *a, const double *b, double *want, int nb, int nbb, int M,
                       int K, int N, bool ta, bool tb)
{
    for (int q = 0; q < nb; q++)
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                double s = 0;
                const double *A = a + q * M * K, *B = b + (nbb == 1 ? 0 : q) * K * N;
                for (int k = 0; k < K; k++)
                    s += (ta ? A[k * M + i] : A[i * K + k]) * (tb ? B[j * K + k] : B[k * N + j]);
                want[(q * M + i) * N + j] = s;
            }
}

Test(ops_eager, matmul_2d_transposed_and_batched_match_a_reference)
{
    wf_graph *g = new_graph(WF_EAGER);
    double a[2 * 3 * 5], b[5 * 4], want[2 * 3 * 4];
    fill(a, 30, 1, -1, 1);
    fill(b, 20, 2, -1, 1);
    for (int t = 0; t < 4; t++) {
        bool ta = t & 1, tb = t & 2;
        wf_node *an = cst(g, WF_F64, ta ? WF_SHAPE(5, 3) : WF_SHAPE(3, 5), a);
        wf_node *bn = cst(g, WF_F64, tb ? WF_SHAPE(4, 5) : WF_SHAPE(5, 4), b);
        ref_matmul(a, b, want, 1, 1, 3, 5, 4, ta, tb);
        wf_node *y = ta || tb ? wf_matmul_ex(g, an, bn, ta, tb) : wf_matmul(g, an, bn);
        expect("matmul", g, y, WF_F64, WF_SHAPE(3, 4), want, 1e-12);
    }
    /* Batched: [2, 3, 5] x [5, 4] broadcasts b over the batch. */
    wf_node *an = cst(g, WF_F32, WF_SHAPE(2, 3, 5), a), *bn = cst(g, WF_F32, WF_SHAPE(5, 4), b);
    ref_matmul(a, b, want, 2, 1, 3, 5, 4, false, false);
    expect("batched", g, wf_matmul(g, an, bn), WF_F32, WF_SHAPE(2, 3, 4), want, 1e-5);
    wf_graph_destroy(g);
}

Test(ops_eager, a_large_matmul_split_over_workers_matches_the_reference)
{
    enum { M = 300, K = 70, N = 260 };

    double *a = malloc(M * K * sizeof *a), *b = malloc(K * N * sizeof *b);
    double *want = malloc(M * N * sizeof *want);
    fill(a, M * K, 3, -1, 1);
    fill(b, K * N, 4, -1, 1);
    ref_matmul(a, b, want, 1, 1, M, K, N, false, false);
    wf_graph *g = new_graph(WF_EAGER);
    wf_node *y = wf_matmul(g, cst(g, WF_F64, WF_SHAPE(M, K), a), cst(g, WF_F64, WF_SHAPE(K, N), b));
    expect("matmul", g, y, WF_F64, WF_SHAPE(M, N), want, 1e-12);
    wf_graph_destroy(g);
    free(a);
    free(b);
    free(want);
}

/* ---- Softmax and cross-entropy ----------------------------------------------------------------
 */

Test(ops_eager, softmax_and_log_softmax_along_any_axis_match_a_reference)
{
    wf_graph *g = new_graph(WF_EAGER);
    double x[6] = { 1, 2, 3, -1, 0, 1000 }, sm[6], lsm[6], sm0[6];
    for (int r = 0; r < 2; r++) {
        double mx = fmax(fmax(x[3 * r], x[3 * r + 1]), x[3 * r + 2]), s = 0;
        for (int j = 0; j < 3; j++)
            s += exp(x[3 * r + j] - mx);
        for (int j = 0; j < 3; j++) {
            sm[3 * r + j] = exp(x[3 * r + j] - mx) / s;
            lsm[3 * r + j] = x[3 * r + j] - mx - log(s);
        }
    }
    for (int j = 0; j < 3; j++) {
        double mx = fmax(x[j], x[3 + j]), s = exp(x[j] - mx) + exp(x[3 + j] - mx);
        sm0[j] = exp(x[j] - mx) / s;
        sm0[3 + j] = exp(x[3 + j] - mx) / s;
    }
    wf_node *xn = cst(g, WF_F64, WF_SHAPE(2, 3), x);
    expect("softmax -1", g, wf_softmax(g, xn, -1), WF_F64, WF_SHAPE(2, 3), sm, 1e-12);
    expect("log_softmax 1", g, wf_log_softmax(g, xn, 1), WF_F64, WF_SHAPE(2, 3), lsm, 1e-12);
    expect("softmax 0", g, wf_softmax(g, xn, 0), WF_F64, WF_SHAPE(2, 3), sm0, 1e-12);
    wf_graph_destroy(g);
}

Test(ops_eager, softmax_cross_entropy_gives_per_example_losses_and_mean_gives_the_loss)
{
    wf_graph *g = new_graph(WF_EAGER);
    double x[8] = { 1, 2, 3, 4, 0.5, -1, 2, 0 }, lab[2] = { 3, 1 }, want[2];
    for (int r = 0; r < 2; r++) {
        double s = 0;
        for (int j = 0; j < 4; j++)
            s += exp(x[4 * r + j]);
        want[r] = log(s) - x[4 * r + (int)lab[r]];
    }
    wf_node *logits = cst(g, WF_F32, WF_SHAPE(2, 4), x);
    static const wf_dtype lt[] = { WF_I32, WF_I64 };
    for (int d = 0; d < 2; d++) {
        wf_node *y = cst(g, lt[d], WF_SHAPE(2), lab);
        wf_node *per = wf_softmax_cross_entropy(g, logits, y);
        expect("xent", g, per, WF_F32, WF_SHAPE(2), want, 1e-6);
        expect("mean", g, wf_mean(g, per), WF_F32, WF_SCALAR, (double[]){ (want[0] + want[1]) / 2 },
               1e-6);
    }
    /* A label out of range fails when the node runs, naming it. */
    wf_node *bad = cst(g, WF_I32, WF_SHAPE(2), (double[]){ 0, 4 });
    expect_fail(g, wf_softmax_cross_entropy(g, logits, bad), WF_EINVAL,
                (const char *const[]){ "softmax_cross_entropy", "4", NULL });
    wf_graph_destroy(g);
}

/* ---- Static graphs: inference with -1 dimensions ----------------------------------------- */

#define expect_type(n, dt, s) expect_type_(g, n, dt, s)

static void expect_type_(wf_graph *g, const wf_node *n, wf_dtype dt, wf_shape s)
{
    char a[160], b[160];
    cr_assert_not_null(n, "%s", wf_graph_errmsg(g));
    cr_assert_eq(wf_node_dtype(n), dt, "%s: dtype %s", wf_node_name(n),
                 wf_dtype_name(wf_node_dtype(n)));
    cr_assert(wf_shape_equal(wf_node_shape(n), s), "%s: shape %s, want %s", wf_node_name(n),
              wf_shape_str(wf_node_shape(n), a, sizeof a), wf_shape_str(s, b, sizeof b));
}

Test(ops_eager, design_example_model_infers_minus_one_batch_dimensions)
{
    wf_graph *g = new_graph(WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(-1, 784));
    wf_node *y = wf_placeholder(g, "y", WF_I32, WF_SHAPE(-1));
    wf_node *w = wf_variable(g, "w", WF_F32, WF_SHAPE(784, 10), wf_init_glorot_uniform(42));
    wf_node *b = wf_variable(g, "b", WF_F32, WF_SHAPE(10), wf_init_zeros());
    wf_node *mm = wf_matmul(g, x, w);
    wf_node *logits = wf_add(g, mm, b);
    wf_node *per = wf_softmax_cross_entropy(g, logits, y);
    wf_node *loss = wf_mean(g, per);
    cr_assert_eq(wf_graph_status(g), 0, "%s", wf_graph_errmsg(g));
    expect_type(mm, WF_F32, WF_SHAPE(-1, 10));
    expect_type(logits, WF_F32, WF_SHAPE(-1, 10));
    expect_type(per, WF_F32, WF_SHAPE(-1));
    expect_type(loss, WF_F32, WF_SCALAR);
    cr_assert_null(wf_node_value(loss), "static graphs compute nothing at build time");
    /* More -1 flows: reductions keep it, argmax too, softmax keeps the shape. */
    expect_type(wf_reduce_sum(g, logits, (const int[]){ 1 }, 1, false), WF_F32, WF_SHAPE(-1));
    expect_type(wf_reduce_max(g, logits, (const int[]){ 0 }, 1, true), WF_F32, WF_SHAPE(1, 10));
    expect_type(wf_argmax(g, logits, -1), WF_I64, WF_SHAPE(-1));
    expect_type(wf_softmax(g, logits, -1), WF_F32, WF_SHAPE(-1, 10));
    expect_type(wf_eq(g, wf_cast(g, wf_argmax(g, logits, 1), WF_I32), y), WF_BOOL, WF_SHAPE(-1));
    expect_type(wf_relu(g, logits), WF_F32, WF_SHAPE(-1, 10));
    wf_node *col = wf_placeholder(g, "col", WF_F32, WF_SHAPE(-1, 1));
    wf_node *row = wf_placeholder(g, "row", WF_F32, WF_SHAPE(1, 5));
    expect_type(wf_mul(g, col, row), WF_F32, WF_SHAPE(-1, 5));
    /* Labels of a known batch fit logits of an unknown one. */
    wf_node *y32 = wf_placeholder(g, "y32", WF_I64, WF_SHAPE(32));
    expect_type(wf_softmax_cross_entropy(g, logits, y32), WF_F32, WF_SHAPE(32));
    /* Batched matmul with an unknown batch and an unknown inner dimension. */
    wf_node *ba = wf_placeholder(g, "ba", WF_F64, WF_SHAPE(-1, 4, -1));
    wf_node *bb = wf_placeholder(g, "bb", WF_F64, WF_SHAPE(3, 6));
    expect_type(wf_matmul(g, ba, bb), WF_F64, WF_SHAPE(-1, 4, 6));
    wf_node *bt = wf_placeholder(g, "bt", WF_F64, WF_SHAPE(6, 3));
    expect_type(wf_matmul_ex(g, ba, bt, false, true), WF_F64, WF_SHAPE(-1, 4, 6));
    wf_node *b42 = wf_placeholder(g, "b42", WF_F64, WF_SHAPE(4, 2));
    expect_type(wf_matmul_ex(g, ba, b42, true, false), WF_F64, WF_SHAPE(-1, -1, 2));
    cr_assert_eq(wf_graph_status(g), 0, "%s", wf_graph_errmsg(g));
    wf_graph_destroy(g);
}

/* ---- Errors --------------------------------------------------------------------------------- */

Test(ops_eager, shapes_that_do_not_broadcast_fail_with_both_shapes_and_the_call_site)
{
    static const int modes[] = { WF_STATIC, WF_EAGER };
    for (int m = 0; m < 2; m++) {
        wf_graph *g = new_graph(modes[m]);
        double z[12] = { 0 };
        wf_node *a = cst(g, WF_F32, WF_SHAPE(2, 3), z), *b = cst(g, WF_F32, WF_SHAPE(4), z);
        int nodes = wf_graph_node_count(g);
        wf_node *y = wf_add(g, a, b);
        int line = __LINE__ - 1;
        char at[64];
        expect_fail(g, y, WF_ESHAPE,
                    (const char *const[]){ "add", "[2, 3]", "[4]", here(line, at, sizeof at),
                                           "broadcast", NULL });
        cr_assert_eq(wf_graph_node_count(g), nodes);
        wf_graph_destroy(g);
    }
}

Test(ops_eager, different_dtypes_fail_with_edtype_naming_both)
{
    wf_graph *g = new_graph(WF_STATIC);
    wf_node *a = wf_placeholder(g, "a", WF_F32, WF_SHAPE(-1, 3));
    wf_node *b = wf_placeholder(g, "b", WF_F64, WF_SHAPE(3));
    wf_node *y = wf_mul(g, a, b);
    int line = __LINE__ - 1;
    char at[64];
    expect_fail(g, y, WF_EDTYPE,
                (const char *const[]){ "mul", "f32", "f64", "[?, 3]", "[3]", "wf_cast",
                                       here(line, at, sizeof at), NULL });
    wf_graph_clear_error(g);
    expect_fail(g, wf_matmul(g, a, wf_placeholder(g, "w", WF_F64, WF_SHAPE(3, 2))), WF_EDTYPE,
                (const char *const[]){ "matmul", "f32", "f64", NULL });
    wf_graph_clear_error(g);
    expect_fail(g, wf_where(g, wf_gt(g, a, a), a, b), WF_EDTYPE,
                (const char *const[]){ "where", "f32", "f64", NULL });
    wf_graph_destroy(g);
}

Test(ops_eager, dtypes_an_op_does_not_take_fail_with_edtype)
{
    wf_graph *g = new_graph(WF_STATIC);
    wf_node *i = wf_placeholder(g, "i", WF_I32, WF_SHAPE(4));
    wf_node *f = wf_placeholder(g, "f", WF_F32, WF_SHAPE(4));
    wf_node *bl = wf_placeholder(g, "bl", WF_BOOL, WF_SHAPE(4));
    wf_node *m = wf_placeholder(g, "m", WF_I32, WF_SHAPE(2, 2));
    wf_node *l = wf_placeholder(g, "l", WF_F32, WF_SHAPE(2, 3));
    wf_node *lab = wf_placeholder(g, "lab", WF_F32, WF_SHAPE(2));
    expect_fail(g, wf_exp(g, i), WF_EDTYPE,
                (const char *const[]){ "exp", "x is i32 [4]", "f32, f64, bf16 or f16", NULL });
    wf_graph_clear_error(g);
    expect_fail(g, wf_pow(g, m, m), WF_EDTYPE,
                (const char *const[]){ "pow", "i32 [2, 2] and [2, 2]", NULL });
    for (int k = 0; k < 10; k++) {
        wf_graph_clear_error(g);
        const char *op = NULL;
        wf_node *y = NULL;
        switch (k) {
        case 0:
            y = wf_exp(g, i), op = "exp";
            break;
        case 1:
            y = wf_pow(g, i, i), op = "pow";
            break;
        case 2:
            y = wf_mean(g, i), op = "mean";
            break;
        case 3:
            y = wf_logsumexp(g, i), op = "logsumexp";
            break;
        case 4:
            y = wf_softmax(g, i, 0), op = "softmax";
            break;
        case 5:
            y = wf_add(g, bl, bl), op = "add";
            break;
        case 6:
            y = wf_matmul(g, m, m), op = "matmul";
            break;
        case 7:
            y = wf_where(g, f, f, f), op = "where";
            break;
        case 8:
            y = wf_softmax_cross_entropy(g, l, lab), op = "softmax_cross_entropy";
            break;
        case 9:
            y = wf_leaky_relu(g, i, 0.1), op = "leaky_relu";
            break;
        }
        expect_fail(g, y, WF_EDTYPE, (const char *const[]){ op, NULL });
    }
    wf_graph_destroy(g);
}

Test(ops_eager, matmul_shape_errors_name_both_shapes)
{
    wf_graph *g = new_graph(WF_STATIC);
    wf_node *a = wf_placeholder(g, "a", WF_F32, WF_SHAPE(3, 4));
    wf_node *b = wf_placeholder(g, "b", WF_F32, WF_SHAPE(5, 2));
    wf_node *y = wf_matmul(g, a, b);
    int line = __LINE__ - 1;
    char at[64];
    expect_fail(g, y, WF_ESHAPE,
                (const char *const[]){ "matmul", "[3, 4]", "[5, 2]", "inner",
                                       here(line, at, sizeof at), NULL });
    wf_graph_clear_error(g);
    expect_fail(g, wf_matmul_ex(g, a, b, true, false), WF_ESHAPE,
                (const char *const[]){ "transposed", "[3, 4]", "[5, 2]", NULL });
    wf_graph_clear_error(g);
    wf_node *v = wf_placeholder(g, "v", WF_F32, WF_SHAPE(4));
    expect_fail(g, wf_matmul(g, a, v), WF_ESHAPE,
                (const char *const[]){ "[3, 4]", "[4]", "rank >= 2", NULL });
    wf_graph_clear_error(g);
    wf_node *p = wf_placeholder(g, "p", WF_F32, WF_SHAPE(2, 3, 4));
    wf_node *q = wf_placeholder(g, "q", WF_F32, WF_SHAPE(3, 4, 2));
    expect_fail(g, wf_matmul(g, p, q), WF_ESHAPE,
                (const char *const[]){ "[2, 3, 4]", "[3, 4, 2]", "batch", NULL });
    wf_graph_destroy(g);
}

Test(ops_eager, bad_axes_fail_with_einval_naming_the_axis_and_shape)
{
    wf_graph *g = new_graph(WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(2, 3));
    expect_fail(g, wf_reduce_sum(g, x, (const int[]){ 2 }, 1, false), WF_EINVAL,
                (const char *const[]){ "sum", "axis 2", "[2, 3]", NULL });
    wf_graph_clear_error(g);
    const int twice[2] = { 1, -1 }, three[3] = { 0, 1, 0 };
    expect_fail(g, wf_reduce_max(g, x, twice, 2, false), WF_EINVAL,
                (const char *const[]){ "max", "twice", NULL });
    wf_graph_clear_error(g);
    expect_fail(g, wf_reduce_mean(g, x, three, 3, false), WF_EINVAL,
                (const char *const[]){ "mean", "3 axes", "[2, 3]", NULL });
    wf_graph_clear_error(g);
    expect_fail(g, wf_reduce_mean(g, x, (const int[]){ 0 }, -1, false), WF_EINVAL,
                (const char *const[]){ "mean", "-1 axes", NULL });
    wf_graph_clear_error(g);
    expect_fail(g, wf_argmax(g, x, -3), WF_EINVAL,
                (const char *const[]){ "argmax", "axis -3", "[2, 3]", NULL });
    wf_graph_clear_error(g);
    expect_fail(g, wf_softmax(g, x, 2), WF_EINVAL,
                (const char *const[]){ "softmax", "axis 2", "[2, 3]", NULL });
    wf_graph_clear_error(g);
    expect_fail(g, wf_log_softmax(g, wf_sum(g, x), 0), WF_ESHAPE,
                (const char *const[]){ "log_softmax", "scalar", NULL });
    wf_graph_clear_error(g);
    expect_fail(g, wf_cast(g, x, (wf_dtype)99), WF_EINVAL,
                (const char *const[]){ "cast", "99", NULL });
    wf_graph_destroy(g);
}

Test(ops_eager, cross_entropy_labels_of_the_wrong_shape_fail_with_both_shapes)
{
    wf_graph *g = new_graph(WF_STATIC);
    wf_node *l = wf_placeholder(g, "l", WF_F32, WF_SHAPE(-1, 10));
    wf_node *y = wf_placeholder(g, "y", WF_I32, WF_SHAPE(-1, 10));
    expect_fail(g, wf_softmax_cross_entropy(g, l, y), WF_ESHAPE,
                (const char *const[]){ "softmax_cross_entropy", "[?, 10]", "[?]", NULL });
    wf_graph_clear_error(g);
    wf_node *l2 = wf_placeholder(g, "l2", WF_F32, WF_SHAPE(8, 10));
    wf_node *y2 = wf_placeholder(g, "y2", WF_I32, WF_SHAPE(9));
    expect_fail(g, wf_softmax_cross_entropy(g, l2, y2), WF_ESHAPE,
                (const char *const[]){ "[8, 10]", "[8]", "[9]", NULL });
    wf_graph_destroy(g);
}

Test(ops_eager, null_inputs_return_null_and_keep_the_first_error)
{
    wf_graph *g = new_graph(WF_EAGER);
    double z[6] = { 0 };
    wf_node *a = cst(g, WF_F32, WF_SHAPE(2, 3), z), *b = cst(g, WF_F32, WF_SHAPE(2), z);
    /* The inner call fails; every outer one gets NULL and keeps the inner error. */
    wf_node *y = wf_mean(g, wf_relu(g, wf_matmul_ex(g, wf_add(g, a, b), a, false, true)));
    cr_assert_null(y);
    cr_assert_eq(wf_graph_status(g), WF_ESHAPE);
    char first[512];
    snprintf(first, sizeof first, "%s", wf_graph_errmsg(g));
    cr_assert(strstr(first, "add"), "%s", first);
    cr_assert_null(wf_softmax_cross_entropy(g, NULL, NULL));
    cr_assert_null(wf_where(g, NULL, a, NULL));
    cr_assert_null(wf_cast(g, NULL, WF_F64));
    cr_assert_null(wf_reduce_sum(g, NULL, (const int[]){ 0 }, 1, true));
    cr_assert_null(wf_argmax(g, NULL, 0));
    cr_assert_null(wf_gelu(g, NULL, true));
    cr_assert_eq(wf_graph_status(g), WF_ESHAPE);
    cr_assert_str_eq(wf_graph_errmsg(g), first);
    /* Without an earlier error, a NULL input is itself the error. */
    wf_graph_clear_error(g);
    cr_assert_null(wf_exp(g, NULL));
    cr_assert_eq(wf_graph_status(g), WF_EINVAL);
    cr_assert(strstr(wf_graph_errmsg(g), "exp") && strstr(wf_graph_errmsg(g), "NULL"), "%s",
              wf_graph_errmsg(g));
    wf_graph_destroy(g);
    /* A NULL graph: NULL, with the reason in the thread's message. */
    cr_assert_null(wf_add(NULL, NULL, NULL));
    cr_assert(strstr(wf_last_errmsg(), "graph is NULL"), "%s", wf_last_errmsg());
}

Test(ops_eager, nodes_record_the_line_of_their_call_even_after_failures)
{
    wf_graph *g = new_graph(WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(-1, 4));
    wf_node *w = wf_placeholder(g, "w", WF_F32, WF_SHAPE(4, 3));
    wf_node *b = wf_placeholder(g, "b", WF_F32, WF_SHAPE(3));
    wf_node *y = wf_add(g, wf_matmul(g, x, w), b);
    int line = __LINE__ - 1;
    cr_assert_not_null(y, "%s", wf_graph_errmsg(g));
    cr_assert_eq(wf_node_line(y), line);
    cr_assert_eq(wf_node_line(wf_node_input(y, 0)), line);
    cr_assert(strstr(wf_node_file(y), "test_ops_eager.c"), "%s", wf_node_file(y));
    /* Failed calls, nested ones and ones given NULL inputs, leave no stale location behind. */
    cr_assert_null(wf_relu(g, wf_sigmoid(g, wf_matmul(g, w, w))));
    cr_assert_null(wf_softmax(g, wf_reduce_sum(g, x, (const int[]){ 5 }, 1, false), 0));
    cr_assert_null(wf_where(g, x, x, x));
    wf_graph_clear_error(g);
    wf_node *z = wf_tanh(g, x);
    cr_assert_eq(wf_node_line(z), __LINE__ - 1);
    /* The function form records nothing. */
    wf_node *u = (wf_exp)(g, x);
    cr_assert_eq(wf_node_line(u), 0);
    wf_graph_destroy(g);
}

Test(ops_eager, nodes_of_another_graph_are_refused)
{
    wf_graph *g = new_graph(WF_STATIC), *h = new_graph(WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(3));
    wf_node *o = wf_placeholder(h, "o", WF_F32, WF_SHAPE(3));
    expect_fail(g, wf_add(g, x, o), WF_EINVAL, (const char *const[]){ "another graph", NULL });
    wf_graph_destroy(g);
    wf_graph_destroy(h);
}
