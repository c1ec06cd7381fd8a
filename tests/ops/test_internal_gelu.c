/* tests/ops/test_internal_gelu.c: the f32 gelu (erf form) and its gradient, which
 * ops/elementwise_cpu.c computes with its own vectorizing exp and erfc (not libm's expf and
 * erff), against f64 references on a dense grid well past where the tails underflow:
 *   gelu:      |got - want| <= 2e-7 + (2e-6 + 2e-7 x^2) |want| (in the left tail gelu is
 *              x e^(-x^2/2) times a slow factor, so rounding x / sqrt 2 to f32 alone moves
 *              it by about x^2 6e-8 relative: measured worst 0.15 of this bound);
 *   gelu_grad: |got - want| <= 3e-7 + 2e-6 |want| on the grid (measured worst 0.31 of it),
 *              and 2e-5 |want| relative in the left tail down to f32's smallest normal
 *              (measured 4e-6), where libm's 1 + erff(z) had no correct bit left.
 * Also: the special values give what libm's forms give (NaN in, NaN out; gelu(+inf) = +inf,
 * gelu(-inf) and the gradient at +-inf NaN, as 0.5 x (1 + erf) and inf * 0 do), and the loop
 * the fused kernels and GEMM epilogues share (ops/scalar.h) gives the kernel's bits. */
#include "../../ops/kernels.h"
#include "../../ops/scalar.h"
#include "ops_test.h"

#include <float.h>
#include <stdlib.h>

TestSuite(ops_gelu, .fini = wf_test_fini, .timeout = WF_TEST_TIMEOUT(60));

static const wf_kctx serial = { .rt = NULL };

#define GRID 400001 /* x from -12 to 12 in steps of 6e-5 */

static double ref_gelu(double x)
{
    return 0.5 * x * erfc(-x / sqrt(2.0));
}

static double ref_dgelu(double x)
{
    return 0.5 * erfc(-x / sqrt(2.0)) + x * exp(-0.5 * x * x) / sqrt(2 * M_PI);
}

/* An f32 tensor of 'v[0..n)'. */
static wf_tensor *f32s(const float *v, int64_t n)
{
    wf_tensor *t = wf_tensor_from(WF_F32, WF_SHAPE(n), v);
    cr_assert_not_null(t, "%s", wf_last_errmsg());
    return t;
}

/* The grid (each value exactly representable, so the reference reads the kernel's very
 * input), or n ones. */
static wf_tensor *grid(bool ones)
{
    float *v = malloc(GRID * sizeof *v);
    cr_assert_not_null(v);
    for (int i = 0; i < GRID; i++)
        v[i] = ones ? 1.0f : (float)(-12.0 + 24.0 * i / (GRID - 1));
    wf_tensor *t = f32s(v, GRID);
    free(v);
    return t;
}

Test(ops_gelu, f32_gelu_matches_f64_reference_on_a_dense_grid_into_the_tails)
{
    wf_tensor *x = grid(false), *out = ot_out(WF_F32, WF_SHAPE(GRID));
    cr_assert_eq(wf__gelu_erf_cpu(&serial, x, out), 0, "%s", wf_last_errmsg());
    const float *xv = wf_tensor_data_f32(x), *o = wf_tensor_data_f32(out);
    double worst = 0;
    for (int i = 0; i < GRID; i++) {
        double want = ref_gelu(xv[i]), err = fabs(o[i] - want);
        double x2 = (double)xv[i] * xv[i], tol = 2e-7 + (2e-6 + 2e-7 * x2) * fabs(want);
        cr_assert(err <= tol, "gelu(%.9g) = %.9g, want %.9g (error %.3g > %.3g)", xv[i], o[i], want,
                  err, tol);
        if (err / tol > worst)
            worst = err / tol;
    }
    cr_log_info("gelu: worst error %.3g of the tolerance", worst);
    wf_tensor_release(x);
    wf_tensor_release(out);
}

Test(ops_gelu, f32_gelu_grad_matches_f64_reference_on_a_dense_grid)
{
    wf_tensor *x = grid(false), *dy = grid(true), *out = ot_out(WF_F32, WF_SHAPE(GRID));
    cr_assert_eq(wf__activation_grad_cpu(&serial, WF_ACT_GRAD_GELU_ERF, 0, x, dy, out), 0, "%s",
                 wf_last_errmsg());
    const float *xv = wf_tensor_data_f32(x), *o = wf_tensor_data_f32(out);
    for (int i = 0; i < GRID; i++) {
        double want = ref_dgelu(xv[i]), err = fabs(o[i] - want);
        cr_assert(err <= 3e-7 + 2e-6 * fabs(want), "gelu'(%.9g) = %.9g, want %.9g (error %.3g)",
                  xv[i], o[i], want, err);
    }
    wf_tensor_release(x);
    wf_tensor_release(dy);
    wf_tensor_release(out);
}

/* x = -sqrt(2 t) for t in [1, 86]: gelu'(x) = Phi(x) + x e^-t / sqrt(2 pi) is negative and
 * tiny, a difference of two terms that f32 must get in relative terms, through exp and
 * erfc of arguments up to 86. */
Test(ops_gelu, f32_gelu_grad_keeps_relative_precision_in_the_underflowing_left_tail)
{
    enum { N = 2001 };

    float xs[N], ones[N];
    for (int i = 0; i < N; i++) {
        xs[i] = (float)-sqrt(2.0 * (1.0 + 85.0 * i / (N - 1)));
        ones[i] = 1.0f;
    }
    wf_tensor *x = f32s(xs, N), *dy = f32s(ones, N), *out = ot_out(WF_F32, WF_SHAPE(N));
    cr_assert_eq(wf__activation_grad_cpu(&serial, WF_ACT_GRAD_GELU_ERF, 0, x, dy, out), 0, "%s",
                 wf_last_errmsg());
    const float *o = wf_tensor_data_f32(out);
    for (int i = 0; i < N; i++) {
        double want = ref_dgelu(xs[i]);
        cr_assert(want < 0, "the reference at %.9g is %.9g", xs[i], want);
        if (-want < FLT_MIN) /* subnormal: f32 keeps fewer bits than the tolerance asks */
            continue;
        cr_assert(fabs(o[i] - want) <= 2e-5 * fabs(want),
                  "gelu'(%.9g) = %.9g, want %.9g (relative error %.3g)", xs[i], o[i], want,
                  fabs(o[i] - want) / fabs(want));
    }
    wf_tensor_release(x);
    wf_tensor_release(dy);
    wf_tensor_release(out);
}

Test(ops_gelu, special_values_give_what_the_libm_forms_give)
{
    const float in[] = {
        NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 1e-30f, -1e-30f, FLT_MAX, -FLT_MAX
    };

    enum { N = sizeof in / sizeof *in };

    float ones[N];
    for (int i = 0; i < N; i++)
        ones[i] = 1.0f;
    wf_tensor *x = f32s(in, N), *dy = f32s(ones, N);
    wf_tensor *y = ot_out(WF_F32, WF_SHAPE(N)), *g = ot_out(WF_F32, WF_SHAPE(N));
    cr_assert_eq(wf__gelu_erf_cpu(&serial, x, y), 0, "%s", wf_last_errmsg());
    cr_assert_eq(wf__activation_grad_cpu(&serial, WF_ACT_GRAD_GELU_ERF, 0, x, dy, g), 0, "%s",
                 wf_last_errmsg());
    const float *yv = wf_tensor_data_f32(y), *gv = wf_tensor_data_f32(g);
    for (int i = 0; i < N; i++) {
        /* libm's forms in f32, as the kernel computed them before: NaN, infinities and
         * zeros exactly, finite values within 1e-6 relative */
        float v = in[i];
        float want_y = 0.5f * v * (1.0f + erff(v * 0.7071067811865476f));
        float want_g = 0.5f * (1.0f + erff(v * 0.7071067811865476f)) +
                       v * 0.3989422804014327f * expf(-0.5f * v * v);
        cr_assert(isnan(want_y)                     ? isnan(yv[i])
                  : isinf(want_y) || want_y == 0.0f ? yv[i] == want_y
                                                    : fabs(yv[i] - want_y) <= 1e-6 * fabs(want_y),
                  "gelu(%g) = %g, want %g", v, yv[i], want_y);
        cr_assert(isnan(want_g) ? isnan(gv[i]) : fabs(gv[i] - want_g) <= 1e-6 * fabs(want_g),
                  "gelu'(%g) = %g, want %g", v, gv[i], want_g);
        if (v == 0) /* gelu(+-0) keeps the sign of zero */
            cr_assert_eq(signbit(yv[i]), signbit(v), "gelu(%g) = %g", v, yv[i]);
    }
    wf_tensor_release(x);
    wf_tensor_release(dy);
    wf_tensor_release(y);
    wf_tensor_release(g);
}

Test(ops_gelu, shared_loops_give_the_kernels_bits)
{
    wf_tensor *x = grid(false), *y = ot_out(WF_F32, WF_SHAPE(GRID));
    wf_tensor *g = ot_out(WF_F32, WF_SHAPE(GRID));
    /* dy = x: any values will do */
    cr_assert_eq(wf__gelu_erf_cpu(&serial, x, y), 0, "%s", wf_last_errmsg());
    cr_assert_eq(wf__activation_grad_cpu(&serial, WF_ACT_GRAD_GELU_ERF, 0, x, x, g), 0, "%s",
                 wf_last_errmsg());
    const float *xv = wf_tensor_data_f32(x);
    float *a = malloc(GRID * sizeof *a), *b = malloc(GRID * sizeof *b);
    cr_assert(a && b);
    memcpy(a, xv, GRID * sizeof *a);
    cr_assert_eq(wf__ew_apply_unary(WF_UNARY_GELU_ERF, 0, WF_F32, a, GRID), 0);
    cr_assert_eq(wf__ew_apply_act_grad(WF_ACT_GRAD_GELU_ERF, 0, WF_F32, b, xv, xv, GRID), 0);
    cr_assert_eq(memcmp(a, wf_tensor_data_f32(y), GRID * sizeof *a), 0, "gelu: the bits differ");
    cr_assert_eq(memcmp(b, wf_tensor_data_f32(g), GRID * sizeof *b), 0,
                 "gelu_grad: the bits differ");
    free(a);
    free(b);
    wf_tensor_release(x);
    wf_tensor_release(y);
    wf_tensor_release(g);
}
