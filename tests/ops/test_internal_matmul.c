/* tests/ops/test_internal_matmul.c: the matmul CPU kernel of ops/ against a naive f64
 * product: f32, f64, bf16 and f16; all four transpose combinations; shapes below, at and
 * across the tile size; operands given transposed through strides (passed to BLAS as they
 * are), with negative strides (packed first) and with broadcast batch axes (zero strides);
 * K = 0 and empty outputs; bad shapes and dtypes refused naming both shapes; bitwise equal
 * results with no runtime, 1 and 2 workers (which also runs concurrent BLAS calls).
 * Tolerance: |got - want| <= tol * sqrt(K) * (1 + |want|) with tol 1e-4 for f32 (inputs in
 * [-1, 1]), 1e-12 for f64, 8e-3 for bf16 and 2e-3 for f16 (output rounding dominates). */
#include "../../ops/kernels.h"
#include "ops_test.h"

TestSuite(ops_matmul, .fini = wf_test_fini, .timeout = WF_TEST_TIMEOUT(120));

static const wf_kctx serial = { .rt = NULL };

static const int perm_rev2[] = { 1, 0 };
static const int perm_rev3_last2[] = { 0, 2, 1 };

static double tol_for(wf_dtype dt)
{
    return dt == WF_F32 ? 1e-4 : dt == WF_F64 ? 1e-12 : dt == WF_BF16 ? 8e-3 : 2e-3;
}

/* Element (i, j) of op(t) for batch position 'bpos' of out's batch shape. */
static double mat_get(const wf_tensor *t, wf_shape obatch, int64_t bpos, bool trans, int64_t i,
                      int64_t j)
{
    wf_shape s = wf_tensor_shape(t);
    wf_shape tb = { .rank = s.rank - 2 };
    for (int d = 0; d < tb.rank; d++)
        tb.dims[d] = s.dims[d];
    int64_t b = obatch.rank ? ot_bcast_index(obatch, tb, bpos) : 0;
    int64_t rows = s.dims[s.rank - 2], cols = s.dims[s.rank - 1];
    int64_t r = trans ? j : i, c = trans ? i : j;
    return wf_tensor_get(t, (b * rows + r) * cols + c);
}

static void check_product(wf_dtype dt, bool ta, bool tb, wf_shape as, wf_shape bs, ot_layout la,
                          ot_layout lb, const char *what)
{
    ot_tensor a = ot_random(dt, as, la, 1000 + as.dims[as.rank - 1], -1, 1);
    ot_tensor b = ot_random(dt, bs, lb, 2000 + bs.dims[bs.rank - 2], -1, 1);
    int64_t M = as.dims[as.rank - (ta ? 1 : 2)], K = as.dims[as.rank - (ta ? 2 : 1)];
    int64_t N = bs.dims[bs.rank - (tb ? 2 : 1)];
    int nb = (as.rank > bs.rank ? as.rank : bs.rank) - 2;
    wf_shape ob = { .rank = nb };
    for (int d = 0; d < nb; d++) {
        int ia = d - (nb - (as.rank - 2)), ib = d - (nb - (bs.rank - 2));
        int64_t x = ia >= 0 ? as.dims[ia] : 1, y = ib >= 0 ? bs.dims[ib] : 1;
        ob.dims[d] = x == 1 ? y : x;
    }
    wf_shape os = ob;
    os.rank = nb + 2;
    os.dims[nb] = M;
    os.dims[nb + 1] = N;
    wf_tensor *out = ot_out(dt, os);
    int rc = wf__matmul_cpu(&serial, ta, tb, a.t, b.t, out);
    cr_assert_eq(rc, 0, "%s %s: %s", what, wf_dtype_name(dt), wf_last_errmsg());
    int64_t nbatch = wf_shape_numel(ob);
    double tol = tol_for(dt) * sqrt((double)(K > 0 ? K : 1));
    for (int64_t p = 0; p < nbatch; p++)
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                double want = 0;
                for (int64_t k = 0; k < K; k++)
                    want += mat_get(a.t, ob, p, ta, i, k) * mat_get(b.t, ob, p, tb, k, j);
                double got = wf_tensor_get(out, (p * M + i) * N + j);
                cr_assert(fabs(got - want) <= tol * (1 + fabs(want)),
                          "%s %s ta %d tb %d batch %lld (%lld, %lld): %.9g, want %.9g", what,
                          wf_dtype_name(dt), ta, tb, (long long)p, (long long)i, (long long)j, got,
                          want);
            }
    wf_tensor_release(out);
    ot_release(&a);
    ot_release(&b);
}

/* Shapes of a and b for (M, K, N) and the flags. */
static wf_shape mk2(int64_t r, int64_t c, bool t)
{
    return t ? WF_SHAPE(c, r) : WF_SHAPE(r, c);
}

Test(ops_matmul, products_match_f64_reference_for_all_transposes_and_dtypes)
{
    const wf_dtype dts[] = { WF_F32, WF_F64, WF_BF16, WF_F16 };
    const int64_t mkn[][3] = { { 1, 1, 1 }, { 3, 5, 2 }, { 17, 33, 9 }, { 64, 1, 70 } };
    for (size_t d = 0; d < 4; d++)
        for (size_t s = 0; s < sizeof mkn / sizeof *mkn; s++)
            for (int ta = 0; ta < 2; ta++)
                for (int tb = 0; tb < 2; tb++)
                    check_product(dts[d], ta, tb, mk2(mkn[s][0], mkn[s][1], ta),
                                  mk2(mkn[s][1], mkn[s][2], tb), OT_CONTIG, OT_CONTIG, "2-D");
}

Test(ops_matmul, products_across_several_tiles_match_reference)
{
    /* 300 x 520 output: 2 x 3 tiles of 256 */
    check_product(WF_F32, false, false, WF_SHAPE(300, 70), WF_SHAPE(70, 520), OT_CONTIG, OT_CONTIG,
                  "tiled");
    check_product(WF_F64, true, true, WF_SHAPE(40, 260), WF_SHAPE(257, 40), OT_CONTIG, OT_CONTIG,
                  "tiled, transposed");
}

Test(ops_matmul, strided_views_are_used_in_place_or_packed)
{
    /* transposed through strides (column-major: BLAS flips its flag) */
    check_product(WF_F32, false, false, WF_SHAPE(19, 23), WF_SHAPE(23, 11),
                  (ot_layout){ perm_rev2, 0, 0 }, (ot_layout){ perm_rev2, 0, 0 }, "col-major");
    check_product(WF_F64, true, false, WF_SHAPE(23, 19), WF_SHAPE(23, 11),
                  (ot_layout){ perm_rev2, 0, 0 }, OT_CONTIG, "col-major, transposed");
    /* negative strides: packed */
    check_product(WF_F32, false, true, WF_SHAPE(13, 7), WF_SHAPE(9, 7), (ot_layout){ NULL, 0x1, 0 },
                  (ot_layout){ NULL, 0x2, 0 }, "negative");
    /* a row broadcast by a zero stride inside the matrix: packed */
    check_product(WF_F32, false, false, WF_SHAPE(6, 8), WF_SHAPE(8, 5), (ot_layout){ NULL, 0, 0x1 },
                  OT_CONTIG, "zero row stride");
}

Test(ops_matmul, batch_axes_broadcast_like_numpy)
{
    check_product(WF_F32, false, false, WF_SHAPE(2, 1, 7, 5), WF_SHAPE(3, 5, 4), OT_CONTIG,
                  OT_CONTIG, "batch [2, 1] x [3]");
    check_product(WF_F64, false, true, WF_SHAPE(4, 6, 3), WF_SHAPE(5, 3), OT_CONTIG, OT_CONTIG,
                  "batch [4] x matrix");
    /* batched operand with zero batch stride and transposed matrices */
    check_product(WF_F32, true, false, WF_SHAPE(3, 5, 7), WF_SHAPE(3, 5, 2),
                  (ot_layout){ perm_rev3_last2, 0, 0x1 }, (ot_layout){ NULL, 0x1, 0 },
                  "zero batch stride, transposed, negative batch");
}

Test(ops_matmul, empty_inner_dimension_gives_zeros)
{
    wf_tensor *a = ot_out(WF_F32, WF_SHAPE(3, 0)), *b = ot_out(WF_F32, WF_SHAPE(0, 4));
    wf_tensor *out = ot_out(WF_F32, WF_SHAPE(3, 4));
    float *o = (float *)wf_tensor_data(out);
    for (int i = 0; i < 12; i++)
        o[i] = 7;
    cr_assert_eq(wf__matmul_cpu(&serial, false, false, a, b, out), 0, "%s", wf_last_errmsg());
    for (int i = 0; i < 12; i++)
        cr_assert_eq(o[i], 0);
    wf_tensor *e = ot_out(WF_F32, WF_SHAPE(0, 4)), *a0 = ot_out(WF_F32, WF_SHAPE(0, 3));
    wf_tensor *b3 = ot_out(WF_F32, WF_SHAPE(3, 4));
    cr_assert_eq(wf__matmul_cpu(&serial, false, false, a0, b3, e), 0, "%s", wf_last_errmsg());
    wf_tensor_release(a);
    wf_tensor_release(b);
    wf_tensor_release(out);
    wf_tensor_release(e);
    wf_tensor_release(a0);
    wf_tensor_release(b3);
}

Test(ops_matmul, bad_shapes_and_dtypes_are_refused_naming_both_shapes)
{
    wf_tensor *a = ot_out(WF_F32, WF_SHAPE(3, 4)), *b = ot_out(WF_F32, WF_SHAPE(5, 2));
    wf_tensor *out = ot_out(WF_F32, WF_SHAPE(3, 2));
    int rc = wf__matmul_cpu(&serial, false, false, a, b, out);
    cr_assert_eq(rc, WF_ESHAPE, "got %s", wf_err_name(rc));
    ot_assert_names(wf_last_errmsg(), WF_SHAPE(3, 4), WF_SHAPE(5, 2));
    wf_tensor *v = ot_out(WF_F32, WF_SHAPE(4));
    rc = wf__matmul_cpu(&serial, false, false, a, v, out);
    cr_assert_eq(rc, WF_ESHAPE, "got %s", wf_err_name(rc));
    ot_assert_names(wf_last_errmsg(), WF_SHAPE(3, 4), WF_SHAPE(4));
    wf_tensor *ba = ot_out(WF_F32, WF_SHAPE(2, 3, 4)), *bb = ot_out(WF_F32, WF_SHAPE(3, 4, 2));
    rc = wf__matmul_cpu(&serial, false, false, ba, bb, out);
    cr_assert_eq(rc, WF_ESHAPE, "got %s", wf_err_name(rc));
    ot_assert_names(wf_last_errmsg(), WF_SHAPE(2, 3, 4), WF_SHAPE(3, 4, 2));
    wf_tensor *b42 = ot_out(WF_F32, WF_SHAPE(4, 2)), *wrong = ot_out(WF_F32, WF_SHAPE(2, 3));
    rc = wf__matmul_cpu(&serial, false, false, a, b42, wrong);
    cr_assert_eq(rc, WF_ESHAPE, "got %s", wf_err_name(rc));
    ot_assert_names(wf_last_errmsg(), WF_SHAPE(2, 3), WF_SHAPE(3, 2));
    wf_tensor *i1 = ot_out(WF_I32, WF_SHAPE(3, 4)), *i2 = ot_out(WF_I32, WF_SHAPE(4, 2));
    wf_tensor *io = ot_out(WF_I32, WF_SHAPE(3, 2)), *d = ot_out(WF_F64, WF_SHAPE(4, 2));
    cr_assert_eq(wf__matmul_cpu(&serial, false, false, i1, i2, io), WF_EDTYPE);
    cr_assert_eq(wf__matmul_cpu(&serial, false, false, a, d, out), WF_EDTYPE);
    cr_assert_eq(wf__matmul_cpu(&serial, false, false, NULL, d, out), WF_EINVAL);
    wf_tensor *all[] = { a, b, out, v, ba, bb, b42, wrong, i1, i2, io, d };
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        wf_tensor_release(all[i]);
}

Test(ops_matmul, tiled_products_give_identical_bits_with_0_1_and_2_workers)
{
    ot_rts rts = ot_rts_create();
    const wf_kctx ctxs[3] = { { .rt = NULL }, { .rt = rts.one }, { .rt = rts.two } };
    ot_tensor a = ot_random(WF_F32, WF_SHAPE(600, 300), OT_CONTIG, 1, -1, 1);
    ot_tensor b = ot_random(WF_F32, WF_SHAPE(700, 300), OT_CONTIG, 2, -1, 1);
    ot_tensor c = ot_random(WF_F64, WF_SHAPE(3, 200, 90), OT_CONTIG, 3, -1, 1);
    ot_tensor d = ot_random(WF_F64, WF_SHAPE(90, 300), (ot_layout){ perm_rev2, 0, 0 }, 4, -1, 1);
    wf_tensor *o1[3], *o2[3];
    for (int k = 0; k < 3; k++) {
        o1[k] = ot_out(WF_F32, WF_SHAPE(600, 700));
        o2[k] = ot_out(WF_F64, WF_SHAPE(3, 200, 300));
        cr_assert_eq(wf__matmul_cpu(&ctxs[k], false, true, a.t, b.t, o1[k]), 0, "%s",
                     wf_last_errmsg());
        cr_assert_eq(wf__matmul_cpu(&ctxs[k], false, false, c.t, d.t, o2[k]), 0, "%s",
                     wf_last_errmsg());
    }
    for (int k = 1; k < 3; k++) {
        ot_assert_same_bits(o1[0], o1[k], "sgemm");
        ot_assert_same_bits(o2[0], o2[k], "dgemm");
    }
    /* spot-check the parallel result */
    for (int64_t i = 0; i < 600; i += 97)
        for (int64_t j = 0; j < 700; j += 89) {
            double want = 0;
            for (int64_t k = 0; k < 300; k++)
                want += wf_tensor_get(a.t, i * 300 + k) * wf_tensor_get(b.t, j * 300 + k);
            double got = wf_tensor_get(o1[2], i * 700 + j);
            cr_assert(fabs(got - want) <= 1e-4 * sqrt(300.0) * (1 + fabs(want)),
                      "(%lld, %lld): %g, want %g", (long long)i, (long long)j, got, want);
        }
    for (int k = 0; k < 3; k++) {
        wf_tensor_release(o1[k]);
        wf_tensor_release(o2[k]);
    }
    ot_release(&a);
    ot_release(&b);
    ot_release(&c);
    ot_release(&d);
    ot_rts_destroy(&rts);
}
