/* tests/ops/test_internal_reduce.c: the reduction CPU kernels of ops/ (sum, mean, max, min,
 * prod, argmax, logsumexp) against f64 references over many axis sets, with and without
 * keepdims, on contiguous, permuted, negative-stride and zero-stride inputs, including
 * reduced ranges longer than one block; NaN, ties, empty ranges, integer wrapping; bad axes,
 * shapes and dtypes; bitwise-identical results with no runtime, 1 and 2 workers.
 * Tolerances: |got - want| <= rel * (|want| + mean |x| * sqrt(n)) with rel 1e-6 for f32
 * output (accumulation is f64, so this is the output rounding), 1e-12 for f64, 8e-3 for
 * bf16; integers exact. */
#include "../../ops/kernels.h"
#include "ops_test.h"

#include <limits.h>

TestSuite(ops_reduce, .fini = wf_test_fini, .timeout = WF_TEST_TIMEOUT(120));

static const wf_kctx serial = { .rt = NULL };

static const int perm_3[] = { 2, 0, 1 };
static const int perm_rev2[] = { 1, 0 };

/* The reference: per output, the reduced values in row-major order of the sub-block. */
typedef struct ref {
    int64_t nout;
    double *sum, *sumabs, *prod, *max, *min, *lse, *cnt;
    int64_t *argmax;
} ref;

static ref reference(const wf_tensor *x, const bool *mask)
{
    wf_shape s = wf_tensor_shape(x);
    int64_t nout = 1, n = wf_tensor_numel(x);
    for (int d = 0; d < s.rank; d++)
        if (!mask[d])
            nout *= s.dims[d];
    ref r = { .nout = nout };
    r.sum = calloc((size_t)nout + 1, sizeof(double));
    r.sumabs = calloc((size_t)nout + 1, sizeof(double));
    r.prod = calloc((size_t)nout + 1, sizeof(double));
    r.max = calloc((size_t)nout + 1, sizeof(double));
    r.min = calloc((size_t)nout + 1, sizeof(double));
    r.lse = calloc((size_t)nout + 1, sizeof(double));
    r.cnt = calloc((size_t)nout + 1, sizeof(double));
    r.argmax = calloc((size_t)nout + 1, sizeof(int64_t));
    for (int64_t o = 0; o < nout; o++) {
        r.prod[o] = 1;
        r.argmax[o] = -1;
    }
    for (int pass = 0; pass < 2; pass++)
        for (int64_t i = 0; i < n; i++) {
            int64_t rem = i, o = 0, omul = 1, rpos = 0, rmul = 1;
            for (int d = s.rank - 1; d >= 0; d--) {
                int64_t k = rem % s.dims[d];
                rem /= s.dims[d];
                if (mask[d]) {
                    rpos += k * rmul;
                    rmul *= s.dims[d];
                } else {
                    o += k * omul;
                    omul *= s.dims[d];
                }
            }
            double v = wf_tensor_get(x, i);
            if (pass == 0) {
                r.sum[o] += v;
                r.sumabs[o] += fabs(v);
                r.prod[o] *= v;
                r.cnt[o] += 1;
                /* rpos grows with i inside one output, so the first maximum wins ties */
                if (r.argmax[o] < 0 || v > r.max[o] || (isnan(v) && !isnan(r.max[o]))) {
                    r.max[o] = v;
                    r.argmax[o] = rpos;
                }
                if (r.cnt[o] == 1 || v < r.min[o] || (isnan(v) && !isnan(r.min[o])))
                    r.min[o] = v;
            } else {
                r.lse[o] += exp(v - r.max[o]);
            }
        }
    for (int64_t o = 0; o < nout; o++)
        r.lse[o] = r.max[o] + log(r.lse[o]);
    return r;
}

static void ref_free(ref *r)
{
    free(r->sum);
    free(r->sumabs);
    free(r->prod);
    free(r->max);
    free(r->min);
    free(r->lse);
    free(r->cnt);
    free(r->argmax);
}

static double rel_for(wf_dtype dt)
{
    return dt == WF_F32 ? 1e-6 : dt == WF_F64 ? 1e-12 : dt == WF_BF16 ? 8e-3 : 0;
}

/* Runs every op valid for 'dt' over 'axes' of 'x' and checks each output element. */
static void check_all_ops(const wf_tensor *x, const int *axes, int n_axes, const char *what)
{
    wf_shape s = wf_tensor_shape(x);
    wf_dtype dt = wf_tensor_dtype(x);
    bool is_int = dt == WF_I32 || dt == WF_I64;
    bool mask[WF_MAX_RANK] = { false };
    for (int d = 0; d < s.rank; d++)
        mask[d] = axes == NULL;
    for (int i = 0; axes && i < n_axes; i++)
        mask[axes[i] < 0 ? axes[i] + s.rank : axes[i]] = true;
    ref r = reference(x, mask);
    for (int keep = 0; keep < 2; keep++)
        for (int op = 0; op < WF__REDUCE_COUNT; op++) {
            if (is_int && (op == WF__REDUCE_MEAN || op == WF__REDUCE_LOGSUMEXP))
                continue;
            wf_shape os;
            cr_assert_eq(wf__reduce_shape(s, axes, n_axes, keep, &os), 0, "%s", wf_last_errmsg());
            wf_tensor *out = ot_out(op == WF__REDUCE_ARGMAX ? WF_I64 : dt, os);
            int rc = wf__reduce_cpu(&serial, op, axes, n_axes, keep, x, out);
            cr_assert_eq(rc, 0, "%s op %d %s: %s", what, op, wf_dtype_name(dt), wf_last_errmsg());
            cr_assert_eq(wf_tensor_numel(out), r.nout);
            for (int64_t o = 0; o < r.nout; o++) {
                double want, got = wf_tensor_get(out, o), scale = r.sumabs[o];
                switch (op) {
                case WF__REDUCE_SUM:
                    want = r.sum[o];
                    break;
                case WF__REDUCE_MEAN:
                    want = r.sum[o] / r.cnt[o];
                    scale /= r.cnt[o];
                    break;
                case WF__REDUCE_MAX:
                    want = r.max[o];
                    break;
                case WF__REDUCE_MIN:
                    want = r.min[o];
                    break;
                case WF__REDUCE_PROD:
                    want = r.prod[o];
                    scale = 0;
                    break;
                case WF__REDUCE_ARGMAX:
                    want = (double)r.argmax[o];
                    break;
                default:
                    want = r.lse[o];
                    scale = 1;
                    break;
                }
                double rel = op == WF__REDUCE_ARGMAX ? 0 : rel_for(dt);
                double tol = rel * (fabs(want) + scale * 1e-3);
                cr_assert(ot_close(got, want, (ot_tol){ tol, 0 }),
                          "%s op %d %s keepdims %d output %lld: %.10g, want %.10g", what, op,
                          wf_dtype_name(dt), keep, (long long)o, got, want);
            }
            wf_tensor_release(out);
        }
    ref_free(&r);
}

Test(ops_reduce, every_op_over_every_axis_set_matches_f64_reference)
{
    const wf_dtype dts[] = { WF_F32, WF_F64, WF_BF16, WF_I32, WF_I64 };
    const ot_layout layouts[] = {
        OT_CONTIG, { perm_3, 0, 0 }, { perm_3, 0x5, 0 }, { NULL, 0x2, 0x4 }
    };
    const char *names[] = { "contiguous", "permuted", "permuted+negative", "zero+negative" };
    const int ax0[] = { 0 }, ax1[] = { -1 }, ax02[] = { 0, 2 }, ax21[] = { 2, 1 }, axm[] = { 1 };

    struct {
        const int *axes;
        int n;
    } sets[] = { { NULL, 0 }, { ax0, 1 }, { ax1, 1 }, { ax02, 2 },
                 { ax21, 2 }, { axm, 1 }, { ax0, 0 } };

    for (size_t d = 0; d < sizeof dts / sizeof *dts; d++)
        for (size_t l = 0; l < sizeof layouts / sizeof *layouts; l++) {
            bool is_int = dts[d] == WF_I32 || dts[d] == WF_I64;
            /* prod wants values near 1; integers small to keep products exact */
            ot_tensor x = ot_random(dts[d], WF_SHAPE(5, 6, 7), layouts[l], 40 + d * 5 + l,
                                    is_int ? -3 : 0.5, is_int ? 4 : 1.5);
            for (size_t k = 0; k < sizeof sets / sizeof *sets; k++)
                check_all_ops(x.t, sets[k].axes, sets[k].n, names[l]);
            ot_release(&x);
        }
}

Test(ops_reduce, reduced_ranges_longer_than_a_block_combine_partials)
{
    const int ax1[] = { 1 }, ax0[] = { 0 };
    ot_tensor x = ot_random(WF_F32, WF_SHAPE(3, 10007), OT_CONTIG, 5, -2, 2);
    check_all_ops(x.t, ax1, 1, "rows of 10007");
    check_all_ops(x.t, NULL, 0, "all of 3x10007");
    ot_release(&x);
    ot_tensor y = ot_random(WF_F64, WF_SHAPE(9000, 3), (ot_layout){ perm_rev2, 0x1, 0 }, 6, -2, 2);
    check_all_ops(y.t, ax0, 1, "columns of 9000, transposed and negative");
    ot_release(&y);
}

/* Column sums (innermost kept axis at unit stride) take their own loop; it must give the
 * bits of the general loop, which a view with a kept stride of 2 forces. */
Test(ops_reduce, column_sums_give_the_bits_of_the_general_path)
{
    const wf_dtype dts[] = { WF_F32, WF_I32, WF_BF16 };
    for (int d = 0; d < 3; d++) {
        int64_t R = 9000, C = 300;
        ot_tensor wide = ot_random(dts[d], WF_SHAPE(R, 2 * C), OT_CONTIG, 90 + d, -50, 50);
        wf_tensor *even = NULL, *dense = ot_out(dts[d], WF_SHAPE(R, C));
        int64_t st[2] = { 2 * C, 2 };
        cr_assert_eq(wf_tensor_view(dts[d], WF_SHAPE(R, C), st, wf_tensor_data(wide.t), &even), 0);
        cr_assert_eq(wf__cast_cpu(&serial, even, dense), 0); /* the same values, contiguous */
        const int ax0[] = { 0 };
        for (int op = WF__REDUCE_SUM; op <= WF__REDUCE_MEAN; op++) {
            if (op == WF__REDUCE_MEAN && dts[d] == WF_I32)
                continue;
            wf_tensor *o1 = ot_out(dts[d], WF_SHAPE(1, C)), *o2 = ot_out(dts[d], WF_SHAPE(1, C));
            cr_assert_eq(wf__reduce_cpu(&serial, op, ax0, 1, true, dense, o1), 0, "%s",
                         wf_last_errmsg());
            cr_assert_eq(wf__reduce_cpu(&serial, op, ax0, 1, true, even, o2), 0, "%s",
                         wf_last_errmsg());
            ot_assert_same_bits(o1, o2, "column path against general path");
            wf_tensor_release(o1);
            wf_tensor_release(o2);
        }
        if (dts[d] != WF_I32) /* i32 products of 9000 values wrap; f64 ones do not */
            check_all_ops(dense, ax0, 1, "columns of 9000 x 300");
        wf_tensor_release(even);
        wf_tensor_release(dense);
        ot_release(&wide);
    }
}

Test(ops_reduce, argmax_takes_the_first_maximum_and_max_propagates_nan)
{
    float v[] = { 1, 5, 5, 2, /* ties */ 3, NAN, 7, NAN /* first NaN */ };
    wf_tensor *x = wf_tensor_from(WF_F32, WF_SHAPE(2, 4), v);
    const int ax[] = { 1 };
    wf_tensor *am = ot_out(WF_I64, WF_SHAPE(2)), *mx = ot_out(WF_F32, WF_SHAPE(2));
    wf_tensor *mn = ot_out(WF_F32, WF_SHAPE(2)), *sm = ot_out(WF_F32, WF_SHAPE(2));
    cr_assert_eq(wf__argmax_cpu(&serial, ax, 1, false, x, am), 0, "%s", wf_last_errmsg());
    cr_assert_eq(wf_tensor_data_i64(am)[0], 1);
    cr_assert_eq(wf_tensor_data_i64(am)[1], 1);
    cr_assert_eq(wf__max_cpu(&serial, ax, 1, false, x, mx), 0);
    cr_assert_eq(wf_tensor_get(mx, 0), 5);
    cr_assert(isnan(wf_tensor_get(mx, 1)));
    cr_assert_eq(wf__min_cpu(&serial, ax, 1, false, x, mn), 0);
    cr_assert_eq(wf_tensor_get(mn, 0), 1);
    cr_assert(isnan(wf_tensor_get(mn, 1)));
    cr_assert_eq(wf__sum_cpu(&serial, ax, 1, false, x, sm), 0);
    cr_assert(isnan(wf_tensor_get(sm, 1)));
    wf_tensor_release(x);
    wf_tensor_release(am);
    wf_tensor_release(mx);
    wf_tensor_release(mn);
    wf_tensor_release(sm);
}

Test(ops_reduce, logsumexp_is_stable_for_large_and_infinite_inputs)
{
    double v[] = { 1000, 1000, -INFINITY, -INFINITY, INFINITY, 1 };
    wf_tensor *x = wf_tensor_from(WF_F64, WF_SHAPE(3, 2), v);
    const int ax[] = { 1 };
    wf_tensor *out = ot_out(WF_F64, WF_SHAPE(3));
    cr_assert_eq(wf__logsumexp_cpu(&serial, ax, 1, false, x, out), 0, "%s", wf_last_errmsg());
    cr_assert(fabs(wf_tensor_get(out, 0) - (1000 + log(2))) < 1e-12);
    cr_assert_eq(wf_tensor_get(out, 1), -INFINITY);
    cr_assert_eq(wf_tensor_get(out, 2), INFINITY);
    wf_tensor_release(x);
    wf_tensor_release(out);
}

Test(ops_reduce, integer_sum_and_prod_wrap)
{
    int32_t v[] = { INT32_MAX, 1, 65536, 65536 };
    wf_tensor *x = wf_tensor_from(WF_I32, WF_SHAPE(2, 2), v);
    const int ax[] = { 1 };
    wf_tensor *s = ot_out(WF_I32, WF_SHAPE(2)), *p = ot_out(WF_I32, WF_SHAPE(2));
    cr_assert_eq(wf__sum_cpu(&serial, ax, 1, false, x, s), 0);
    cr_assert_eq(wf_tensor_data_i32(s)[0], INT32_MIN);
    cr_assert_eq(wf__prod_cpu(&serial, ax, 1, false, x, p), 0);
    cr_assert_eq(wf_tensor_data_i32(p)[1], 0);
    wf_tensor_release(x);
    wf_tensor_release(s);
    wf_tensor_release(p);
}

Test(ops_reduce, empty_ranges_give_identities_or_einval)
{
    wf_tensor *x = ot_out(WF_F32, WF_SHAPE(3, 0));
    const int ax[] = { 1 };
    wf_tensor *out = ot_out(WF_F32, WF_SHAPE(3)), *am = ot_out(WF_I64, WF_SHAPE(3));
    cr_assert_eq(wf__sum_cpu(&serial, ax, 1, false, x, out), 0);
    cr_assert_eq(wf_tensor_get(out, 2), 0);
    cr_assert_eq(wf__prod_cpu(&serial, ax, 1, false, x, out), 0);
    cr_assert_eq(wf_tensor_get(out, 2), 1);
    cr_assert_eq(wf__mean_cpu(&serial, ax, 1, false, x, out), 0);
    cr_assert(isnan(wf_tensor_get(out, 0)));
    cr_assert_eq(wf__logsumexp_cpu(&serial, ax, 1, false, x, out), 0);
    cr_assert_eq(wf_tensor_get(out, 0), -INFINITY);
    int rc = wf__max_cpu(&serial, ax, 1, false, x, out);
    cr_assert_eq(rc, WF_EINVAL, "got %s", wf_err_name(rc));
    cr_assert(strstr(wf_last_errmsg(), "[3, 0]"), "%s", wf_last_errmsg());
    cr_assert_eq(wf__argmax_cpu(&serial, ax, 1, false, x, am), WF_EINVAL);
    wf_tensor_release(x);
    wf_tensor_release(out);
    wf_tensor_release(am);
}

Test(ops_reduce, bad_axes_shapes_and_dtypes_are_refused)
{
    wf_tensor *x = ot_out(WF_F32, WF_SHAPE(4, 5)), *xi = ot_out(WF_I32, WF_SHAPE(4, 5));
    wf_tensor *o4 = ot_out(WF_F32, WF_SHAPE(4)), *o5 = ot_out(WF_F32, WF_SHAPE(5));
    wf_tensor *o4i = ot_out(WF_I32, WF_SHAPE(4));
    const int bad[] = { 2 }, twice[] = { 1, -1 }, ax1[] = { 1 };
    cr_assert_eq(wf__sum_cpu(&serial, bad, 1, false, x, o4), WF_EINVAL);
    cr_assert(strstr(wf_last_errmsg(), "[4, 5]"), "%s", wf_last_errmsg());
    cr_assert_eq(wf__sum_cpu(&serial, twice, 2, false, x, o4), WF_EINVAL);
    int rc = wf__sum_cpu(&serial, ax1, 1, false, x, o5);
    cr_assert_eq(rc, WF_ESHAPE, "got %s", wf_err_name(rc));
    ot_assert_names(wf_last_errmsg(), WF_SHAPE(5), WF_SHAPE(4));
    rc = wf__sum_cpu(&serial, ax1, 1, true, x, o4); /* keepdims wants [4, 1] */
    cr_assert_eq(rc, WF_ESHAPE, "got %s", wf_err_name(rc));
    ot_assert_names(wf_last_errmsg(), WF_SHAPE(4), WF_SHAPE(4, 1));
    cr_assert_eq(wf__mean_cpu(&serial, ax1, 1, false, xi, o4i), WF_EDTYPE);
    cr_assert_eq(wf__argmax_cpu(&serial, ax1, 1, false, x, o4), WF_EDTYPE); /* wants i64 */
    cr_assert_eq(wf__sum_cpu(&serial, ax1, 1, false, NULL, o4), WF_EINVAL);
    wf_tensor_release(x);
    wf_tensor_release(xi);
    wf_tensor_release(o4);
    wf_tensor_release(o5);
    wf_tensor_release(o4i);
}

Test(ops_reduce, results_are_bitwise_identical_with_0_1_and_2_workers)
{
    ot_rts rts = ot_rts_create();
    const wf_kctx ctxs[3] = { { .rt = NULL }, { .rt = rts.one }, { .rt = rts.two } };
    ot_tensor x = ot_random(WF_F32, WF_SHAPE(1000, 517), OT_CONTIG, 77, -1, 1);
    ot_tensor t =
        ot_random(WF_F32, WF_SHAPE(517, 1000), (ot_layout){ perm_rev2, 0x2, 0 }, 78, -1, 1);
    const int rows[] = { 1 }, cols[] = { 0 };

    struct {
        const wf_tensor *x;
        wf__reduce_kind op;
        const int *axes;
        int n;
        wf_shape os;
        wf_dtype dt;
    } cases[] = {
        { x.t, WF__REDUCE_SUM, NULL, 0, WF_SCALAR, WF_F32 },
        { x.t, WF__REDUCE_LOGSUMEXP, rows, 1, WF_SHAPE(1000), WF_F32 },
        { x.t, WF__REDUCE_MEAN, cols, 1, WF_SHAPE(517), WF_F32 },
        { t.t, WF__REDUCE_SUM, rows, 1, WF_SHAPE(517), WF_F32 },
        { t.t, WF__REDUCE_ARGMAX, NULL, 0, WF_SCALAR, WF_I64 },
        { t.t, WF__REDUCE_PROD, cols, 1, WF_SHAPE(1000), WF_F32 },
    };

    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        wf_tensor *outs[3];
        for (int k = 0; k < 3; k++) {
            outs[k] = ot_out(cases[c].dt, cases[c].os);
            int rc = wf__reduce_cpu(&ctxs[k], cases[c].op, cases[c].axes, cases[c].n, false,
                                    cases[c].x, outs[k]);
            cr_assert_eq(rc, 0, "case %zu: %s", c, wf_last_errmsg());
        }
        ot_assert_same_bits(outs[0], outs[1], "reduce, 1 worker");
        ot_assert_same_bits(outs[0], outs[2], "reduce, 2 workers");
        for (int k = 0; k < 3; k++)
            wf_tensor_release(outs[k]);
    }
    ot_release(&x);
    ot_release(&t);
    ot_rts_destroy(&rts);
}
