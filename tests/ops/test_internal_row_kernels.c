/* tests/ops/test_internal_row_kernels.c: the row kernels the GPT step spends its time in,
 * where their inner loops were rewritten to vectorize, against f64 references:
 *   softmax with its own exp (ops/softmax_cpu.c: exp_vec): causal-mask rows (-inf above the
 *     diagonal), rows spanning 0 to -800 (exps that underflow, subnormal and zero), on f64
 *     within 1e-15 + 1e-13 |want| (exp_vec is within 1 ulp where normal) and f32 within
 *     1e-7 + 1e-6 |want|, and softmax_cross_entropy over the same rows;
 *   layer norm forward and its input gradient (ops/norm_cpu.c: sums in four fixed partial
 *     sums) on row lengths 1 to 9, 127, 128, 130 (every remainder of 4), f64 within
 *     1e-13 + 1e-12 |want| and f32 within 1e-6 + 1e-5 |want|, with and without gamma/beta,
 *     and rows with a large common offset (1e4 + noise in [-2, 2]: the two-pass variance
 *     keeps f64 within 1e-11 + 1e-11 |want|, where E[x^2] - E[x]^2 would lose 8 digits);
 * and that results are bitwise identical with no runtime and with 2 workers. */
#include "../../ops/kernels.h"
#include "ops_test.h"

#include <stdlib.h>

TestSuite(ops_row_kernels, .fini = wf_test_fini, .timeout = WF_TEST_TIMEOUT(60));

static const wf_kctx serial = { .rt = NULL };

static wf_tensor *from_f64(wf_dtype dt, wf_shape s, const double *v)
{
    int64_t n = wf_shape_numel(s);
    wf_tensor *t = NULL;
    if (dt == WF_F64) {
        t = wf_tensor_from(dt, s, v);
    } else {
        float *f = malloc((size_t)(n ? n : 1) * sizeof *f);
        cr_assert_not_null(f);
        for (int64_t i = 0; i < n; i++)
            f[i] = (float)v[i];
        t = wf_tensor_from(dt, s, f);
        free(f);
    }
    cr_assert_not_null(t, "%s", wf_last_errmsg());
    return t;
}

/* Row r's max in '*m' and its sum of exp(x - max), in f64 (the reference of both tests). */
static double row_sum_exp(const wf_tensor *x, int64_t r, int64_t C, double *m)
{
    double mx = -INFINITY, sum = 0;
    for (int64_t j = 0; j < C; j++)
        mx = fmax(mx, wf_tensor_get(x, r * C + j));
    for (int64_t j = 0; j < C; j++)
        sum += exp(wf_tensor_get(x, r * C + j) - mx);
    *m = mx;
    return sum;
}

/* Rows of C logits: row r < C is a causal-mask row (0..r finite, then -inf), the others
 * spread over [0, -800] and random. */
static double *logits(int64_t rows, int64_t C, uint64_t seed)
{
    double *v = malloc((size_t)(rows * C) * sizeof *v);
    cr_assert_not_null(v);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < C; j++) {
            double u = ot_uniform(&seed, -3, 3);
            if (r < C)
                v[r * C + j] = j <= r ? u : -INFINITY;
            else if (r % 2)
                v[r * C + j] = -800.0 * (double)j / (double)(C - 1) + u;
            else
                v[r * C + j] = u;
        }
    return v;
}

Test(ops_row_kernels, softmax_with_masks_and_underflowing_exps_matches_f64_reference)
{
    const int64_t rows = 80, C = 64;
    double *v = logits(rows, C, 7);
    const wf_dtype dts[] = { WF_F64, WF_F32 };
    for (int d = 0; d < 2; d++) {
        wf_tensor *x = from_f64(dts[d], WF_SHAPE(rows, C), v);
        wf_tensor *out = ot_out(dts[d], WF_SHAPE(rows, C));
        cr_assert_eq(wf__softmax_cpu(&serial, -1, x, out), 0, "%s", wf_last_errmsg());
        double abs_tol = d == 0 ? 1e-15 : 1e-7, rel_tol = d == 0 ? 1e-13 : 1e-6;
        for (int64_t r = 0; r < rows; r++) {
            double m, sum = row_sum_exp(x, r, C, &m);
            for (int64_t j = 0; j < C; j++) {
                double want = exp(wf_tensor_get(x, r * C + j) - m) / sum;
                double got = wf_tensor_get(out, r * C + j);
                cr_assert(fabs(got - want) <= abs_tol + rel_tol * want,
                          "%s row %lld col %lld: %.17g, want %.17g", wf_dtype_name(dts[d]),
                          (long long)r, (long long)j, got, want);
                if (isinf(wf_tensor_get(x, r * C + j)))
                    cr_assert(got == 0, "a masked entry gives exactly 0, not %g", got);
            }
        }
        wf_tensor_release(x);
        wf_tensor_release(out);
    }
    free(v);
}

Test(ops_row_kernels, cross_entropy_over_wide_rows_matches_f64_reference)
{
    const int64_t rows = 90, C = 65;
    double *v = logits(rows, C, 11);
    int32_t labels[90];
    for (int64_t r = 0; r < rows; r++)
        labels[r] = (int32_t)(r < C ? r * 7 % (r + 1) : r % C); /* never a masked entry */
    wf_tensor *y = wf_tensor_from(WF_I32, WF_SHAPE(rows), labels);
    const wf_dtype dts[] = { WF_F64, WF_F32 };
    for (int d = 0; d < 2; d++) {
        wf_tensor *x = from_f64(dts[d], WF_SHAPE(rows, C), v);
        wf_tensor *out = ot_out(dts[d], WF_SHAPE(rows));
        cr_assert_eq(wf__softmax_cross_entropy_cpu(&serial, x, y, out), 0, "%s", wf_last_errmsg());
        double abs_tol = d == 0 ? 1e-13 : 1e-6, rel_tol = d == 0 ? 1e-13 : 1e-6;
        for (int64_t r = 0; r < rows; r++) {
            double m, sum = row_sum_exp(x, r, C, &m);
            double want = m + log(sum) - wf_tensor_get(x, r * C + labels[r]);
            double got = wf_tensor_get(out, r);
            cr_assert(fabs(got - want) <= abs_tol + rel_tol * fabs(want),
                      "%s row %lld: %.17g, want %.17g", wf_dtype_name(dts[d]), (long long)r, got,
                      want);
        }
        wf_tensor_release(x);
        wf_tensor_release(out);
    }
    wf_tensor_release(y);
    free(v);
}

/* The f64 reference of layer norm over rows of n (gamma/beta NULL: absent), forward or the
 * input gradient for 'dy'. */
static void ref_layer_norm(const double *x, const double *dy, const double *gamma,
                           const double *beta, int64_t rows, int64_t n, double eps, double *out)
{
    for (int64_t r = 0; r < rows; r++) {
        const double *v = x + r * n;
        long double s = 0, q = 0;
        for (int64_t i = 0; i < n; i++)
            s += v[i];
        long double mean = s / n;
        for (int64_t i = 0; i < n; i++)
            q += (v[i] - mean) * (v[i] - mean);
        long double rstd = 1 / sqrtl(q / n + eps), m1 = 0, m2 = 0;
        for (int64_t i = 0; i < n; i++) {
            long double xh = (v[i] - mean) * rstd;
            if (!dy) {
                out[r * n + i] = (double)(xh * (gamma ? gamma[i] : 1) + (beta ? beta[i] : 0));
            } else {
                long double g = dy[r * n + i] * (gamma ? gamma[i] : 1);
                m1 += g;
                m2 += g * xh;
            }
        }
        if (dy)
            for (int64_t i = 0; i < n; i++) {
                long double xh = (v[i] - mean) * rstd, g = dy[r * n + i] * (gamma ? gamma[i] : 1);
                out[r * n + i] = (double)(rstd * (g - m1 / n - xh * m2 / n));
            }
    }
}

static void check_layer_norm(wf_dtype dt, int64_t rows, int64_t n, bool affine, double offset,
                             uint64_t seed, ot_tol tol)
{
    int64_t N = rows * n;
    double *x = malloc((size_t)N * sizeof *x), *dy = malloc((size_t)N * sizeof *dy);
    double *g = malloc((size_t)n * sizeof *g), *b = malloc((size_t)n * sizeof *b);
    double *want = malloc((size_t)N * sizeof *want);
    cr_assert(x && dy && g && b && want);
    for (int64_t i = 0; i < N; i++) {
        x[i] = offset + ot_uniform(&seed, -2, 2);
        dy[i] = ot_uniform(&seed, -1, 1);
    }
    for (int64_t i = 0; i < n; i++) {
        g[i] = ot_uniform(&seed, 0.5, 1.5);
        b[i] = ot_uniform(&seed, -0.5, 0.5);
    }
    if (dt == WF_F32) /* the reference reads the rounded inputs */
        for (int64_t i = 0; i < N; i++) {
            x[i] = (float)x[i];
            dy[i] = (float)dy[i];
        }
    if (dt == WF_F32)
        for (int64_t i = 0; i < n; i++) {
            g[i] = (float)g[i];
            b[i] = (float)b[i];
        }
    wf_tensor *tx = from_f64(dt, WF_SHAPE(rows, n), x), *tdy = from_f64(dt, WF_SHAPE(rows, n), dy);
    wf_tensor *tg = affine ? from_f64(dt, WF_SHAPE(n), g) : NULL;
    wf_tensor *tb = affine ? from_f64(dt, WF_SHAPE(n), b) : NULL;
    for (int pass = 0; pass < 2; pass++) {
        wf_tensor *out = ot_out(dt, WF_SHAPE(rows, n));
        int rc = pass == 0 ? wf__layer_norm_cpu(&serial, 1, 1e-5, tx, tg, tb, out)
                           : wf__layer_norm_backward_input_cpu(&serial, 1, 1e-5, tx, tg, tdy, out);
        cr_assert_eq(rc, 0, "%s", wf_last_errmsg());
        ref_layer_norm(x, pass ? dy : NULL, affine ? g : NULL, affine ? b : NULL, rows, n, 1e-5,
                       want);
        for (int64_t i = 0; i < N; i++)
            cr_assert(ot_close(wf_tensor_get(out, i), want[i], tol),
                      "%s %s n %lld%s offset %g element %lld: %.17g, want %.17g",
                      pass ? "layer_norm_backward_input" : "layer_norm", wf_dtype_name(dt),
                      (long long)n, affine ? " affine" : "", offset, (long long)i,
                      wf_tensor_get(out, i), want[i]);
        wf_tensor_release(out);
    }
    wf_tensor_release(tx);
    wf_tensor_release(tdy);
    wf_tensor_release(tg);
    wf_tensor_release(tb);
    free(x);
    free(dy);
    free(g);
    free(b);
    free(want);
}

Test(ops_row_kernels, layer_norm_matches_f64_reference_for_every_row_length_remainder)
{
    const int64_t ns[] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 127, 128, 130 };
    const wf_dtype dts[] = { WF_F64, WF_F32 };
    for (size_t k = 0; k < sizeof ns / sizeof *ns; k++)
        for (int d = 0; d < 2; d++)
            for (int affine = 0; affine < 2; affine++)
                check_layer_norm(dts[d], 7, ns[k], affine, 0, 100 + k, ot_tol_elementwise(dts[d]));
}

Test(ops_row_kernels, layer_norm_keeps_precision_under_a_large_common_offset)
{
    /* f64: x - mean is exact to the rounding of the mean (about 1e4 * 2^-52 * a few), so the
     * tolerance grows with the offset; f32: the f64 internals leave only the output rounding */
    check_layer_norm(WF_F64, 5, 130, true, 1e4, 3, (ot_tol){ 1e-11, 1e-11 });
    check_layer_norm(WF_F32, 5, 128, true, 1e3, 4, ot_tol_elementwise(WF_F32));
}

Test(ops_row_kernels, results_are_bitwise_identical_with_no_runtime_and_two_workers)
{
    wf_runtime *rt = NULL;
    cr_assert_eq(wf_runtime_create(&rt, &(wf_runtime_opts){ .n_workers = 2 }), 0, "%s",
                 wf_last_errmsg());
    const wf_kctx par = { .rt = rt };
    const int64_t rows = 2048, C = 64; /* both kernels split this over the workers */
    double *v = logits(rows, C, 5);
    for (int64_t i = 0; i < rows * C; i++)
        if (isinf(v[i]))
            v[i] = -30; /* layer norm needs finite rows */
    wf_tensor *x = from_f64(WF_F32, WF_SHAPE(rows, C), v);
    for (int kernel = 0; kernel < 3; kernel++) {
        wf_tensor *a = ot_out(WF_F32, WF_SHAPE(rows, C)), *b = ot_out(WF_F32, WF_SHAPE(rows, C));
        for (int k = 0; k < 2; k++) {
            const wf_kctx *c = k ? &par : &serial;
            wf_tensor *o = k ? b : a;
            int rc = kernel == 0   ? wf__softmax_cpu(c, -1, x, o)
                     : kernel == 1 ? wf__layer_norm_cpu(c, 1, 1e-5, x, NULL, NULL, o)
                                   : wf__layer_norm_backward_input_cpu(c, 1, 1e-5, x, NULL, x, o);
            cr_assert_eq(rc, 0, "%s", wf_last_errmsg());
        }
        cr_assert_eq(memcmp(wf_tensor_data_f32(a), wf_tensor_data_f32(b),
                            (size_t)(rows * C) * sizeof(float)),
                     0, "kernel %d: the bits depend on the runtime", kernel);
        wf_tensor_release(a);
        wf_tensor_release(b);
    }
    wf_tensor_release(x);
    free(v);
    wf_runtime_destroy(rt);
}
