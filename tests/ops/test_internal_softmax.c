/* tests/ops/test_internal_softmax.c: softmax, log_softmax and softmax_cross_entropy CPU
 * kernels of ops/ against f64 references along every axis, on contiguous, permuted and
 * negative-stride inputs; stability for huge logits; NaN rows; labels out of range, bad
 * shapes and dtypes; bitwise-identical results with no runtime, 1 and 2 workers.
 * Tolerances: |got - want| <= abs + rel |want| with (1e-6, 1e-5) for f32, (1e-13, 1e-12) for
 * f64 and (1e-2, 8e-3) for bf16 (ops_test.h). */
#include "../../ops/kernels.h"
#include "ops_test.h"

TestSuite(ops_softmax, .fini = wf_test_fini, .timeout = WF_TEST_TIMEOUT(120));

static const wf_kctx serial = { .rt = NULL };

static const int perm_3[] = { 2, 0, 1 };

/* The reference for element 'i' (row-major) of x along 'axis': softmax or log_softmax. */
static double ref_at(const wf_tensor *x, int axis, int64_t i, bool log_form)
{
    wf_shape s = wf_tensor_shape(x);
    int64_t inner = 1;
    for (int d = axis + 1; d < s.rank; d++)
        inner *= s.dims[d];
    int64_t C = s.dims[axis], k = (i / inner) % C, first = i - k * inner;
    double m = -INFINITY;
    for (int64_t j = 0; j < C; j++)
        m = fmax(m, wf_tensor_get(x, first + j * inner));
    double sum = 0;
    for (int64_t j = 0; j < C; j++)
        sum += exp(wf_tensor_get(x, first + j * inner) - m);
    double v = wf_tensor_get(x, i) - m;
    return log_form ? v - log(sum) : exp(v) / sum;
}

Test(ops_softmax, softmax_and_log_softmax_match_reference_along_every_axis)
{
    const wf_dtype dts[] = { WF_F32, WF_F64, WF_BF16 };
    const ot_layout layouts[] = { OT_CONTIG, { perm_3, 0x6, 0 } };
    for (size_t d = 0; d < 3; d++)
        for (size_t l = 0; l < 2; l++)
            for (int axis = -1; axis < 3; axis++) {
                wf_shape s = WF_SHAPE(4, 5, 6);
                ot_tensor x = ot_random(dts[d], s, layouts[l], 60 + d * 3 + l, -5, 5);
                wf_tensor *o1 = ot_out(dts[d], s), *o2 = ot_out(dts[d], s);
                cr_assert_eq(wf__softmax_cpu(&serial, axis, x.t, o1), 0, "%s", wf_last_errmsg());
                cr_assert_eq(wf__log_softmax_cpu(&serial, axis, x.t, o2), 0, "%s",
                             wf_last_errmsg());
                int a = axis < 0 ? axis + 3 : axis;
                ot_tol tol = ot_tol_elementwise(dts[d]);
                for (int64_t i = 0; i < 120; i++) {
                    double w1 = ref_at(x.t, a, i, false), w2 = ref_at(x.t, a, i, true);
                    cr_assert(ot_close(wf_tensor_get(o1, i), w1, tol),
                              "softmax %s axis %d element %lld: %g, want %g", wf_dtype_name(dts[d]),
                              axis, (long long)i, wf_tensor_get(o1, i), w1);
                    cr_assert(ot_close(wf_tensor_get(o2, i), w2, tol),
                              "log_softmax %s axis %d element %lld: %g, want %g",
                              wf_dtype_name(dts[d]), axis, (long long)i, wf_tensor_get(o2, i), w2);
                }
                wf_tensor_release(o1);
                wf_tensor_release(o2);
                ot_release(&x);
            }
}

Test(ops_softmax, huge_logits_stay_finite_and_nan_rows_give_nan)
{
    float v[] = { 1e30f, 1e30f, -1e30f, 0, NAN, 1 };
    wf_tensor *x = wf_tensor_from(WF_F32, WF_SHAPE(2, 3), v);
    wf_tensor *o = ot_out(WF_F32, WF_SHAPE(2, 3)), *lo = ot_out(WF_F32, WF_SHAPE(2, 3));
    cr_assert_eq(wf__softmax_cpu(&serial, 1, x, o), 0);
    cr_assert_eq(wf_tensor_get(o, 0), 0.5);
    cr_assert_eq(wf_tensor_get(o, 2), 0);
    cr_assert(isnan(wf_tensor_get(o, 3)) && isnan(wf_tensor_get(o, 5)));
    cr_assert_eq(wf__log_softmax_cpu(&serial, -1, x, lo), 0);
    cr_assert(fabs(wf_tensor_get(lo, 0) + log(2)) < 1e-6);
    wf_tensor_release(x);
    wf_tensor_release(o);
    wf_tensor_release(lo);
}

Test(ops_softmax, cross_entropy_matches_reference_for_i32_and_i64_labels)
{
    const wf_dtype dts[] = { WF_F32, WF_F64 };
    for (int d = 0; d < 2; d++)
        for (int li = 0; li < 2; li++) {
            ot_tensor x =
                ot_random(dts[d], WF_SHAPE(3, 7, 10), (ot_layout){ perm_3, 0x1, 0 }, 80 + d, -4, 4);
            ot_tensor y = ot_random(li ? WF_I64 : WF_I32, WF_SHAPE(3, 7), OT_CONTIG, 81, 0, 10);
            wf_tensor *out = ot_out(dts[d], WF_SHAPE(3, 7));
            cr_assert_eq(wf__softmax_cross_entropy_cpu(&serial, x.t, y.t, out), 0, "%s",
                         wf_last_errmsg());
            for (int64_t r = 0; r < 21; r++) {
                int64_t label = (int64_t)wf_tensor_get(y.t, r);
                double want = -ref_at(x.t, 2, r * 10 + label, true);
                cr_assert(ot_close(wf_tensor_get(out, r), want, ot_tol_elementwise(dts[d])),
                          "row %lld: %g, want %g", (long long)r, wf_tensor_get(out, r), want);
            }
            wf_tensor_release(out);
            ot_release(&x);
            ot_release(&y);
        }
}

Test(ops_softmax, cross_entropy_refuses_bad_labels_shapes_and_dtypes)
{
    wf_tensor *x = ot_out(WF_F32, WF_SHAPE(4, 3)), *out = ot_out(WF_F32, WF_SHAPE(4));
    int32_t lv[] = { 0, 2, 3, 1 };
    wf_tensor *y = wf_tensor_from(WF_I32, WF_SHAPE(4), lv);
    int rc = wf__softmax_cross_entropy_cpu(&serial, x, y, out);
    cr_assert_eq(rc, WF_EINVAL, "got %s", wf_err_name(rc));
    cr_assert(strstr(wf_last_errmsg(), "label 3 of example 2"), "%s", wf_last_errmsg());
    wf_tensor *y5 = ot_out(WF_I32, WF_SHAPE(5));
    rc = wf__softmax_cross_entropy_cpu(&serial, x, y5, out);
    cr_assert_eq(rc, WF_ESHAPE, "got %s", wf_err_name(rc));
    ot_assert_names(wf_last_errmsg(), WF_SHAPE(4, 3), WF_SHAPE(5));
    wf_tensor *yf = ot_out(WF_F32, WF_SHAPE(4));
    cr_assert_eq(wf__softmax_cross_entropy_cpu(&serial, x, yf, out), WF_EDTYPE);
    wf_tensor *xi = ot_out(WF_I32, WF_SHAPE(4, 3)), *oi = ot_out(WF_I32, WF_SHAPE(4, 3));
    cr_assert_eq(wf__softmax_cpu(&serial, 0, xi, oi), WF_EDTYPE);
    wf_tensor *o43 = ot_out(WF_F32, WF_SHAPE(4, 3));
    cr_assert_eq(wf__softmax_cpu(&serial, 2, x, o43), WF_EINVAL);
    rc = wf__softmax_cpu(&serial, 0, x, out);
    cr_assert_eq(rc, WF_ESHAPE, "got %s", wf_err_name(rc));
    ot_assert_names(wf_last_errmsg(), WF_SHAPE(4), WF_SHAPE(4, 3));
    wf_tensor *all[] = { x, out, y, y5, yf, xi, oi, o43 };
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        wf_tensor_release(all[i]);
}

Test(ops_softmax, results_are_bitwise_identical_with_0_1_and_2_workers)
{
    ot_rts rts = ot_rts_create();
    const wf_kctx ctxs[3] = { { .rt = NULL }, { .rt = rts.one }, { .rt = rts.two } };
    ot_tensor x = ot_random(WF_F32, WF_SHAPE(2000, 37), OT_CONTIG, 5, -6, 6);
    ot_tensor y = ot_random(WF_I64, WF_SHAPE(2000), OT_CONTIG, 6, 0, 37);
    wf_tensor *o[3][3];
    for (int k = 0; k < 3; k++) {
        o[k][0] = ot_out(WF_F32, WF_SHAPE(2000, 37));
        o[k][1] = ot_out(WF_F32, WF_SHAPE(2000, 37));
        o[k][2] = ot_out(WF_F32, WF_SHAPE(2000));
        cr_assert_eq(wf__softmax_cpu(&ctxs[k], 0, x.t, o[k][0]), 0, "%s", wf_last_errmsg());
        cr_assert_eq(wf__log_softmax_cpu(&ctxs[k], 1, x.t, o[k][1]), 0, "%s", wf_last_errmsg());
        cr_assert_eq(wf__softmax_cross_entropy_cpu(&ctxs[k], x.t, y.t, o[k][2]), 0, "%s",
                     wf_last_errmsg());
    }
    for (int k = 1; k < 3; k++)
        for (int j = 0; j < 3; j++)
            ot_assert_same_bits(o[0][j], o[k][j], "softmax");
    for (int k = 0; k < 3; k++)
        for (int j = 0; j < 3; j++)
            wf_tensor_release(o[k][j]);
    ot_release(&x);
    ot_release(&y);
    ot_rts_destroy(&rts);
}
