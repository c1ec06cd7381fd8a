/* tests/ops/test_internal_cuda_ops.c: every CUDA kernel of ops/ (ops/cuda_kernels.h) against
 * its CPU twin (ops/kernels.h) on random inputs: contiguous, permuted, flipped (negative
 * strides) and broadcast (zero strides) views, several shapes and dtypes; the device-side
 * checks (integer division by zero, bad labels, bad indices) as errors naming the element;
 * dropout's mask (the CPU's for the same seed and step); the fused optimizer updates against
 * the update rules; and, with no device needed, the C-versus-C++ layout check of the
 * structs the .cu files read and the argument checks that fail before any device work.
 * The kernels are called directly on a hand-made device queue (devices/cuda.h: a stream and
 * cuBLAS, cuBLASLt and cuDNN handles), so these tests need no executor.
 * Without a CUDA device the device tests skip with "no CUDA device"; in a build without CUDA
 * the suite is one test that skips with "built without CUDA".
 * Tolerances (|got - want| <= abs + rel |want|): elementwise, softmax, layer norm, unreduce:
 *   ot_tol_elementwise (f32 (1e-6, 1e-5), f64 (1e-13, 1e-12), bf16 (1e-2, 8e-3)); cast,
 *   where, comparisons, gather, shape ops, f32/f64 pools: exact; reductions: f32 (1e-5, 1e-5)
 *   (both sum in f64; the order differs), f64 (1e-12, 1e-12), integer ops exact; matmul
 *   (K <= 96, values in [-1, 1]): f32 (1e-4, 1e-4), f64 (1e-12, 1e-12), bf16/f16
 *   (3e-2, 2e-2), TF32 (3e-2, 1e-2); convolutions: f32 (1e-4, 1e-4), f64 (1e-12, 1e-12), bf16
 *   (5e-2, 2e-2); scatter_add f32 (1e-5, 1e-5) (atomic order); optimizer updates against an
 *   f64 evaluation of the rules: f32 (1e-6, 1e-5), f64 (1e-14, 1e-12). */
#include "../../core/graph.h"
#include "../../core/tensor.h"
#include "../../ops/kernels.h"
#include "../../ops/table.h"
#include "ops_test.h"

#include <stddef.h>

#ifdef WF_HAVE_CUDA
#    include "../../devices/cuda.h"

#    include <cublasLt.h>
#    include <cublas_v2.h>
#    include <cuda_runtime_api.h>

#    include <cudnn.h>
#endif

TestSuite(ops_cuda, .fini = wf_test_fini, .timeout = WF_TEST_TIMEOUT(300));

#ifndef WF_HAVE_CUDA

Test(ops_cuda, skipped_without_cuda)
{
    cr_skip_test("built without CUDA");
}

#else

static const wf_kctx serial = { .rt = NULL };

/* ---- The device queue ------------------------------------------------------------------------ */

#    include "cuda_queue.h"

static const int perm3[] = { 2, 0, 1 };
static const ot_layout layouts[] = { OT_CONTIG, { perm3, 0x1, 0 }, { NULL, 0x6, 0 } };
#    define N_LAYOUTS 3

/* ---- Checks without a device ----------------------------------------------------------------- */

Test(ops_cuda, the_cuda_files_see_the_c_layout_of_tensors_and_nodes)
{
    const size_t sizes[] = {
        sizeof(wf_tensor),
        offsetof(wf_tensor, dtype),
        offsetof(wf_tensor, shape),
        offsetof(wf_tensor, strides),
        offsetof(wf_tensor, numel),
        offsetof(wf_tensor, data),
        sizeof(wf_node),
        offsetof(wf_node, attrs),
        sizeof(wf_attrs),
        offsetof(wf_attrs, alpha),
    };
    cr_assert_eq(wf__cuda_layout_check(sizes, (int)(sizeof sizes / sizeof sizes[0])), 0, "%s",
                 wf_last_errmsg());
    size_t wrong[10];
    memcpy(wrong, sizes, sizeof wrong);
    wrong[5]++;
    cr_assert_eq(wf__cuda_layout_check(wrong, 10), WF_EINVAL);
    cr_assert(strstr(wf_last_errmsg(), "offsetof(wf_tensor, data)"), "%s", wf_last_errmsg());
}

Test(ops_cuda, a_kernel_without_a_device_queue_is_einval_not_a_crash)
{
    wf_tensor *x = wf_tensor_from(WF_F32, WF_SHAPE(2), (float[]){ 1, 2 });
    wf_tensor *o = ot_out(WF_F32, WF_SHAPE(2));
    cr_assert_eq(wf__unary_cuda(NULL, WF_UNARY_EXP, 0, x, o), WF_EINVAL);
    cr_assert(strstr(wf_last_errmsg(), "exp"), "%s", wf_last_errmsg());
    wf_kernel_ctx none = { 0 };
    cr_assert_eq(wf__matmul_cuda(&none, false, false, x, x, o), WF_ESHAPE); /* checks first */
    cr_assert_eq(wf__softmax_cuda(&none, 0, x, o), WF_EINVAL);
    wf_tensor_release(x);
    wf_tensor_release(o);
}

Test(ops_cuda, a_bad_update_is_einval_before_any_device_work)
{
    wf_cuda_update u = { .kind = 7 };
    wf_tensor *w = wf_tensor_from(WF_F32, WF_SHAPE(2), (float[]){ 1, 2 });
    wf_tensor *g = wf_tensor_from(WF_F64, WF_SHAPE(2), (double[]){ 1, 2 });
    const wf_tensor *gs[1] = { g };
    cr_assert_eq(wf__update_multi_cuda(NULL, &u, 1, &w, gs, NULL, NULL), WF_EINVAL);
    u.kind = WF_CU_OPT_SGD;
    cr_assert_eq(wf__update_multi_cuda(NULL, &u, 1, &w, gs, NULL, NULL), WF_EINVAL);
    cr_assert(strstr(wf_last_errmsg(), "operand 1 is f64"), "%s", wf_last_errmsg());
    wf_tensor_release(w);
    wf_tensor_release(g);
}

/* ---- Elementwise ----------------------------------------------------------------------------- */

Test(ops_cuda, unary_ops_match_the_cpu_on_every_layout_and_dtype)
{
    NEED_DEVICE();
    const wf_dtype dts[] = { WF_F32, WF_F64, WF_BF16, WF_F16, WF_I32, WF_I64 };
    for (int op = 0; op < WF_UNARY_COUNT; op++)
        for (size_t di = 0; di < 6; di++) {
            wf_dtype dt = dts[di];
            bool ints = dt == WF_I32 || dt == WF_I64;
            if (ints && op != WF_UNARY_NEG && op != WF_UNARY_ABS && op != WF_UNARY_SQUARE &&
                op != WF_UNARY_RELU && op != WF_UNARY_SIGN)
                continue;
            bool pos = op == WF_UNARY_LOG || op == WF_UNARY_SQRT || op == WF_UNARY_RSQRT;
            for (int l = 0; l < N_LAYOUTS; l++) {
                wf_shape s = WF_SHAPE(5, 7, 9);
                ot_tensor x =
                    ot_random(dt, s, layouts[l], 100 + op * 16 + di * 3 + l, pos ? 0.1 : -4, 4);
                wf_tensor *want = ot_out(dt, s), *got = dev_out(dt, s);
                wf_tensor *xd = to_dev(x.t);
                cr_assert_eq(wf__unary_cpu(&serial, op, 0.1, x.t, want), 0, "%s", wf_last_errmsg());
                cr_assert_eq(wf__unary_cuda(&dev.ctx, op, 0.1, xd, got), 0, "%s", wf_last_errmsg());
                char what[64];
                snprintf(what, sizeof what, "unary %d %s layout %d", op, wf_dtype_name(dt), l);
                expect_close(what, want, got, ot_tol_elementwise(dt));
                wf_tensor_release(want);
                wf_tensor_release(got);
                wf_tensor_release(xd);
                ot_release(&x);
            }
        }
}

Test(ops_cuda, binary_ops_and_comparisons_broadcast_as_the_cpu)
{
    NEED_DEVICE();
    const wf_dtype dts[] = { WF_F32, WF_F64, WF_BF16, WF_I32, WF_I64 };
    const wf_shape as[] = { WF_SHAPE(4, 5, 6), WF_SHAPE(4, 5, 6), WF_SHAPE(5, 1),
                            WF_SHAPE(4, 5, 6) };
    const wf_shape bs[] = { WF_SHAPE(4, 5, 6), WF_SHAPE(6), WF_SHAPE(4, 1, 6), WF_SHAPE(1) };
    for (int op = 0; op < WF_BINARY_COUNT; op++)
        for (size_t di = 0; di < 5; di++) {
            wf_dtype dt = dts[di];
            bool ints = dt == WF_I32 || dt == WF_I64;
            if (ints && op == WF_BINARY_POW)
                continue;
            for (int c = 0; c < 4; c++) {
                ot_layout la = c == 0 ? layouts[1] : OT_CONTIG;
                ot_layout lb = c == 0 ? layouts[2] : OT_CONTIG;
                uint64_t seed = 500 + op * 64 + di * 8 + c;
                ot_tensor a = ot_random(dt, as[c], la, seed, op == WF_BINARY_POW ? 0.1 : -9, 9);
                /* integer divisors in [1, 9); comparisons see equal values often */
                ot_tensor b =
                    ot_random(dt, bs[c], lb, seed + 1, ints && op == WF_BINARY_DIV ? 1 : -9, 9);
                wf_shape os;
                cr_assert_eq(wf_shape_broadcast(as[c], bs[c], &os), 0);
                wf_dtype odt = op >= WF_BINARY_EQ ? WF_BOOL : dt;
                wf_tensor *want = ot_out(odt, os), *got = dev_out(odt, os);
                wf_tensor *ad = to_dev(a.t), *bd = to_dev(b.t);
                cr_assert_eq(wf__binary_cpu(&serial, op, a.t, b.t, want), 0, "%s",
                             wf_last_errmsg());
                cr_assert_eq(wf__binary_cuda(&dev.ctx, op, ad, bd, got), 0, "%s", wf_last_errmsg());
                char what[64];
                snprintf(what, sizeof what, "binary %d %s case %d", op, wf_dtype_name(dt), c);
                expect_close(what, want, got, ot_tol_elementwise(odt == WF_BOOL ? WF_I32 : dt));
                wf_tensor_release(want);
                wf_tensor_release(got);
                wf_tensor_release(ad);
                wf_tensor_release(bd);
                ot_release(&a);
                ot_release(&b);
            }
        }
}

Test(ops_cuda, integer_division_by_zero_fails_naming_the_element)
{
    NEED_DEVICE();
    wf_tensor *a = wf_tensor_from(WF_I32, WF_SHAPE(4), (int32_t[]){ 7, -7, 5, INT32_MIN });
    wf_tensor *b = wf_tensor_from(WF_I32, WF_SHAPE(4), (int32_t[]){ 2, 2, 0, -1 });
    wf_tensor *ad = to_dev(a), *bd = to_dev(b), *o = dev_out(WF_I32, WF_SHAPE(4));
    cr_assert_eq(wf__binary_cuda(&dev.ctx, WF_BINARY_DIV, ad, bd, o), WF_EINVAL);
    cr_assert(strstr(wf_last_errmsg(), "division by zero at element 2"), "%s", wf_last_errmsg());
    wf_tensor *b2 = wf_tensor_from(WF_I32, WF_SHAPE(4), (int32_t[]){ 2, 2, 3, -1 });
    wf_tensor *b2d = to_dev(b2);
    cr_assert_eq(wf__binary_cuda(&dev.ctx, WF_BINARY_DIV, ad, b2d, o), 0, "%s", wf_last_errmsg());
    wf_tensor *h = to_host(o);
    const int32_t *r = (const int32_t *)h->data;
    cr_assert(r[0] == 3 && r[1] == -3 && r[2] == 1 && r[3] == INT32_MIN, "%d %d %d %d", r[0], r[1],
              r[2], r[3]);
    wf_tensor_release(h);
    wf_tensor_release(a);
    wf_tensor_release(b);
    wf_tensor_release(b2);
    wf_tensor_release(ad);
    wf_tensor_release(bd);
    wf_tensor_release(b2d);
    wf_tensor_release(o);
}

Test(ops_cuda, where_cast_and_activation_gradients_match_the_cpu)
{
    NEED_DEVICE();
    wf_shape s = WF_SHAPE(3, 8, 5);
    /* where: cond broadcast over the first axis, a strided, b a scalar */
    const wf_dtype wdts[] = { WF_F32, WF_F64, WF_BF16, WF_I64, WF_BOOL };
    for (size_t di = 0; di < 5; di++) {
        ot_tensor c0 = ot_random(WF_F32, WF_SHAPE(8, 5), OT_CONTIG, 900 + di, -1, 1);
        wf_tensor *cond = ot_out(WF_BOOL, WF_SHAPE(8, 5)),
                  *zero = wf_tensor_from(WF_F32, WF_SHAPE(1), (float[]){ 0 });
        cr_assert_eq(wf__binary_cpu(&serial, WF_BINARY_GT, c0.t, zero, cond), 0);
        ot_tensor a = ot_random(wdts[di], s, layouts[1], 910 + di, -3, 3);
        ot_tensor b = ot_random(wdts[di], WF_SHAPE(1), OT_CONTIG, 920 + di, -3, 3);
        wf_tensor *want = ot_out(wdts[di], s), *got = dev_out(wdts[di], s);
        wf_tensor *cd = to_dev(cond), *ad = to_dev(a.t), *bd = to_dev(b.t);
        cr_assert_eq(wf__where_cpu(&serial, cond, a.t, b.t, want), 0, "%s", wf_last_errmsg());
        cr_assert_eq(wf__where_cuda(&dev.ctx, cd, ad, bd, got), 0, "%s", wf_last_errmsg());
        expect_close("where", want, got, (ot_tol){ 0, 0 });
        wf_tensor_release(want);
        wf_tensor_release(got);
        wf_tensor_release(cd);
        wf_tensor_release(ad);
        wf_tensor_release(bd);
        wf_tensor_release(cond);
        wf_tensor_release(zero);
        ot_release(&c0);
        ot_release(&a);
        ot_release(&b);
    }
    /* cast: every pair of f32, f64, bf16, f16, i32, i64, u8, bool, values past the integer
     * ranges included (saturation) */
    const wf_dtype cdts[] = { WF_F32, WF_F64, WF_BF16, WF_F16, WF_I32, WF_I64, WF_U8, WF_BOOL };
    for (size_t si = 0; si < 8; si++)
        for (size_t di = 0; di < 8; di++) {
            double lo = cdts[si] == WF_U8 || cdts[si] == WF_BOOL ? 0 : -300;
            double hi = cdts[si] == WF_BOOL ? 2 : cdts[si] == WF_U8 ? 255 : 300;
            ot_tensor x = ot_random(cdts[si], s, layouts[2], 1000 + si * 8 + di, lo, hi);
            wf_tensor *want = ot_out(cdts[di], s), *got = dev_out(cdts[di], s);
            wf_tensor *xd = to_dev(x.t);
            cr_assert_eq(wf__cast_cpu(&serial, x.t, want), 0, "%s", wf_last_errmsg());
            cr_assert_eq(wf__cast_cuda(&dev.ctx, xd, got), 0, "%s", wf_last_errmsg());
            char what[64];
            snprintf(what, sizeof what, "cast %s -> %s", wf_dtype_name(cdts[si]),
                     wf_dtype_name(cdts[di]));
            expect_close(what, want, got, (ot_tol){ 0, 0 });
            wf_tensor_release(want);
            wf_tensor_release(got);
            wf_tensor_release(xd);
            ot_release(&x);
        }
    /* activation gradients */
    const wf_dtype gdts[] = { WF_F32, WF_F64, WF_BF16 };
    for (int op = 0; op < WF_ACT_GRAD_COUNT; op++)
        for (size_t di = 0; di < 3; di++) {
            ot_tensor x = ot_random(gdts[di], s, layouts[1], 1100 + op * 4 + di, -3, 3);
            ot_tensor dy = ot_random(gdts[di], s, OT_CONTIG, 1200 + op * 4 + di, -1, 1);
            wf_tensor *want = ot_out(gdts[di], s), *got = dev_out(gdts[di], s);
            wf_tensor *xd = to_dev(x.t), *dyd = to_dev(dy.t);
            cr_assert_eq(wf__activation_grad_cpu(&serial, op, 0.2, x.t, dy.t, want), 0, "%s",
                         wf_last_errmsg());
            cr_assert_eq(wf__activation_grad_cuda(&dev.ctx, op, 0.2, xd, dyd, got), 0, "%s",
                         wf_last_errmsg());
            char what[64];
            snprintf(what, sizeof what, "activation grad %d %s", op, wf_dtype_name(gdts[di]));
            expect_close(what, want, got, ot_tol_elementwise(gdts[di]));
            wf_tensor_release(want);
            wf_tensor_release(got);
            wf_tensor_release(xd);
            wf_tensor_release(dyd);
            ot_release(&x);
            ot_release(&dy);
        }
}

/* ---- Reductions ------------------------------------------------------------------------------ */

static ot_tol reduce_tol(wf_dtype dt)
{
    return dt == WF_F32   ? (ot_tol){ 1e-5, 1e-5 }
           : dt == WF_F64 ? (ot_tol){ 1e-12, 1e-12 }
                          : (ot_tol){ 0, 0 };
}

Test(ops_cuda, reductions_match_the_cpu_over_any_axes)
{
    NEED_DEVICE();
    const wf_dtype dts[] = { WF_F32, WF_F64, WF_I32, WF_I64 };
    const int ax0[] = { 0 }, ax1[] = { 1 }, ax02[] = { 0, 2 }, axm1[] = { -1 };
    const int *axes[] = { NULL, ax0, ax1, ax02, axm1 };
    const int n_axes[] = { 0, 1, 1, 2, 1 };
    /* [6, 700, 5]: the middle axis crosses the 256-thread block; [3000, 4, 3]: columns;
     * [20000, 2, 2]: long ranges cut into chunks. */
    const wf_shape shapes[] = { WF_SHAPE(6, 700, 5), WF_SHAPE(3000, 4, 3), WF_SHAPE(20000, 2, 2) };
    for (int op = 0; op < WF__REDUCE_COUNT; op++)
        for (size_t di = 0; di < 4; di++) {
            wf_dtype dt = dts[di];
            bool ints = dt == WF_I32 || dt == WF_I64;
            if (ints && (op == WF__REDUCE_MEAN || op == WF__REDUCE_LOGSUMEXP))
                continue;
            for (int sh = 0; sh < 3; sh++)
                for (int a = 0; a < 5; a++)
                    for (int keep = 0; keep < 2; keep++) {
                        int l = (a + keep + sh) % N_LAYOUTS;
                        /* prod over many elements: values near 1 keep it finite */
                        double lo = op == WF__REDUCE_PROD ? (ints ? -1 : 0.999) : -50;
                        double hi = op == WF__REDUCE_PROD ? (ints ? 3 : 1.001) : 50;
                        ot_tensor x = ot_random(dt, shapes[sh], layouts[l],
                                                2000 + op * 97 + di * 13 + a * 3 + keep, lo, hi);
                        wf_shape os;
                        cr_assert_eq(wf__reduce_shape(shapes[sh], axes[a], n_axes[a], keep, &os),
                                     0);
                        wf_dtype odt = op == WF__REDUCE_ARGMAX ? WF_I64 : dt;
                        wf_tensor *want = ot_out(odt, os), *got = dev_out(odt, os);
                        wf_tensor *xd = to_dev(x.t);
                        cr_assert_eq(
                            wf__reduce_cpu(&serial, op, axes[a], n_axes[a], keep, x.t, want), 0,
                            "%s", wf_last_errmsg());
                        cr_assert_eq(
                            wf__reduce_cuda(&dev.ctx, op, axes[a], n_axes[a], keep, xd, got), 0,
                            "%s", wf_last_errmsg());
                        char what[80];
                        snprintf(what, sizeof what, "reduce %d %s shape %d axes %d keep %d", op,
                                 wf_dtype_name(dt), sh, a, keep);
                        expect_close(what, want, got, reduce_tol(odt));
                        wf_tensor_release(want);
                        wf_tensor_release(got);
                        wf_tensor_release(xd);
                        ot_release(&x);
                    }
        }
}

Test(ops_cuda, max_and_argmax_take_the_first_nan_and_the_first_tie)
{
    NEED_DEVICE();
    float v[600];
    for (int i = 0; i < 600; i++)
        v[i] = (float)(i % 7);
    v[599] = NAN; /* row 1 (300 .. 599) has a NaN at its end, row 0 ties at 6 */
    v[450] = NAN;
    wf_tensor *x = wf_tensor_from(WF_F32, WF_SHAPE(2, 300), v), *xd = to_dev(x);
    const int ax[] = { 1 };
    wf_tensor *am = dev_out(WF_I64, WF_SHAPE(2)), *mx = dev_out(WF_F32, WF_SHAPE(2));
    cr_assert_eq(wf__reduce_cuda(&dev.ctx, WF__REDUCE_ARGMAX, ax, 1, false, xd, am), 0);
    cr_assert_eq(wf__reduce_cuda(&dev.ctx, WF__REDUCE_MAX, ax, 1, false, xd, mx), 0);
    wf_tensor *h = to_host(am), *hm = to_host(mx);
    cr_assert_eq(((int64_t *)h->data)[0], 6, "first 6 of row 0");
    cr_assert_eq(((int64_t *)h->data)[1], 150, "first NaN of row 1");
    cr_assert(isnan(((float *)hm->data)[1]));
    wf_tensor_release(h);
    wf_tensor_release(hm);
    wf_tensor *e = dev_out(WF_F32, WF_SHAPE(0, 3)), *eo = dev_out(WF_F32, WF_SHAPE(3));
    const int ax0[] = { 0 };
    cr_assert_eq(wf__reduce_cuda(&dev.ctx, WF__REDUCE_MAX, ax0, 1, false, e, eo), WF_EINVAL);
    cr_assert_eq(wf__reduce_cuda(&dev.ctx, WF__REDUCE_SUM, ax0, 1, false, e, eo), 0);
    wf_tensor *he = to_host(eo);
    cr_assert_eq(((float *)he->data)[2], 0.0f);
    wf_tensor_release(he);
    wf_tensor_release(e);
    wf_tensor_release(eo);
    wf_tensor_release(x);
    wf_tensor_release(xd);
    wf_tensor_release(am);
    wf_tensor_release(mx);
}

/* ---- Matrix products ------------------------------------------------------------------------- */

static ot_tol mm_tol(wf_dtype dt, bool tf32)
{
    if (tf32)
        return (ot_tol){ 3e-2, 1e-2 };
    return dt == WF_F32   ? (ot_tol){ 1e-4, 1e-4 }
           : dt == WF_F64 ? (ot_tol){ 1e-12, 1e-12 }
                          : (ot_tol){ 3e-2, 2e-2 };
}

Test(ops_cuda, matmul_matches_the_cpu_with_transposes_batches_and_strides)
{
    NEED_DEVICE();

    /* a, b shapes as stored (transposed when the flag is set), and the flags */
    struct {
        wf_shape a, b;
        bool ta, tb;
        ot_layout la;
    } cases[] = {
        { WF_SHAPE(33, 17), WF_SHAPE(17, 29), false, false, OT_CONTIG },
        { WF_SHAPE(17, 33), WF_SHAPE(17, 29), true, false, OT_CONTIG },
        { WF_SHAPE(33, 17), WF_SHAPE(29, 17), false, true, OT_CONTIG },
        { WF_SHAPE(17, 33), WF_SHAPE(29, 17), true, true, OT_CONTIG },
        { WF_SHAPE(2, 3, 20, 96), WF_SHAPE(96, 8), false, false, OT_CONTIG }, /* b broadcast */
        { WF_SHAPE(3, 1, 12, 10), WF_SHAPE(1, 4, 10, 6), false, false, OT_CONTIG }, /* per matrix */
        { WF_SHAPE(4, 12, 10), WF_SHAPE(4, 10, 6), false, false, { perm3, 0, 0 } }, /* packed */
        { WF_SHAPE(4, 12, 10), WF_SHAPE(10, 6), false, false, { NULL, 0x2, 0 } },   /* flipped */
        { WF_SHAPE(5, 0), WF_SHAPE(0, 7), false, false, OT_CONTIG },                /* K = 0 */
    };

    const wf_dtype dts[] = { WF_F32, WF_F64, WF_BF16, WF_F16 };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (size_t di = 0; di < 4; di++)
            for (int tf32 = 0; tf32 < (dts[di] == WF_F32 ? 2 : 1); tf32++) {
                wf_dtype dt = dts[di];
                ot_tensor a = ot_random(dt, cases[c].a, cases[c].la, 3000 + c * 8 + di, -1, 1);
                ot_tensor b = ot_random(dt, cases[c].b, OT_CONTIG, 3100 + c * 8 + di, -1, 1);
                wf_shape sa = cases[c].a, sb = cases[c].b, ba = sa, bb = sb, os;
                ba.rank -= 2;
                bb.rank -= 2;
                cr_assert_eq(wf_shape_broadcast(ba, bb, &os), 0);
                os.dims[os.rank++] = sa.dims[sa.rank - (cases[c].ta ? 1 : 2)];
                os.dims[os.rank++] = sb.dims[sb.rank - (cases[c].tb ? 2 : 1)];
                wf_tensor *want = ot_out(dt, os), *got = dev_out(dt, os);
                wf_tensor *ad = to_dev(a.t), *bd = to_dev(b.t);
                cr_assert_eq(wf__matmul_cpu(&serial, cases[c].ta, cases[c].tb, a.t, b.t, want), 0,
                             "%s", wf_last_errmsg());
                wf__matmul_cuda_set_tf32(tf32);
                cr_assert_eq(wf__matmul_cuda(&dev.ctx, cases[c].ta, cases[c].tb, ad, bd, got), 0,
                             "%s", wf_last_errmsg());
                wf__matmul_cuda_set_tf32(false);
                char what[64];
                snprintf(what, sizeof what, "matmul case %zu %s%s", c, wf_dtype_name(dt),
                         tf32 ? " tf32" : "");
                expect_close(what, want, got, mm_tol(dt, tf32));
                wf_tensor_release(want);
                wf_tensor_release(got);
                wf_tensor_release(ad);
                wf_tensor_release(bd);
                ot_release(&a);
                ot_release(&b);
            }
}

Test(ops_cuda, matmul_epilogues_match_the_cpu_fused_or_not)
{
    NEED_DEVICE();
    const int acts[] = { -1, WF_UNARY_RELU, WF_UNARY_GELU_TANH, WF_UNARY_LEAKY_RELU,
                         WF_UNARY_SILU };
    const wf_dtype dts[] = { WF_F32, WF_BF16, WF_F64 };
    for (int ai = 0; ai < 5; ai++)
        for (size_t di = 0; di < 3; di++)
            for (int shape = 0; shape < 3; shape++) {
                wf_dtype dt = dts[di];
                wf_shape sa = shape == 2 ? WF_SHAPE(3, 16, 48) : WF_SHAPE(64, 48);
                wf_shape sb = WF_SHAPE(48, 40),
                         os = shape == 2 ? WF_SHAPE(3, 16, 40) : WF_SHAPE(64, 40);
                wf_shape sbias = shape == 1 ? WF_SHAPE(1, 1) : WF_SHAPE(40);
                ot_tensor a = ot_random(dt, sa, OT_CONTIG, 3500 + ai * 9 + di * 3 + shape, -1, 1);
                ot_tensor b = ot_random(dt, sb, OT_CONTIG, 3600 + ai * 9 + di * 3 + shape, -1, 1);
                ot_tensor bias = ot_random(dt, sbias, OT_CONTIG, 3700 + ai, -1, 1);
                wf_epilogue ep = { .act = acts[ai], .alpha = 0.1, .bias_first = shape == 1 };
                wf_tensor *want = ot_out(dt, os), *got = dev_out(dt, os);
                wf_tensor *ad = to_dev(a.t), *bd = to_dev(b.t), *cd = to_dev(bias.t);
                cr_assert_eq(
                    wf__matmul_epilogue_cpu(&serial, false, false, &ep, a.t, b.t, bias.t, want), 0,
                    "%s", wf_last_errmsg());
                cr_assert_eq(wf__matmul_epilogue_cuda(&dev.ctx, false, false, &ep, ad, bd, cd, got),
                             0, "%s", wf_last_errmsg());
                char what[64];
                snprintf(what, sizeof what, "epilogue act %d %s shape %d", acts[ai],
                         wf_dtype_name(dt), shape);
                expect_close(what, want, got, mm_tol(dt, false));
                wf_tensor_release(want);
                wf_tensor_release(got);
                wf_tensor_release(ad);
                wf_tensor_release(bd);
                wf_tensor_release(cd);
                ot_release(&a);
                ot_release(&b);
                ot_release(&bias);
            }
}

/* ---- Softmax, cross-entropy, layer norm ------------------------------------------------------ */

Test(ops_cuda, softmax_and_log_softmax_match_the_cpu_along_every_axis)
{
    NEED_DEVICE();
    const wf_dtype dts[] = { WF_F32, WF_F64, WF_BF16 };
    const wf_shape shapes[] = { WF_SHAPE(4, 5, 6), WF_SHAPE(3, 1000, 2) };
    for (size_t di = 0; di < 3; di++)
        for (int sh = 0; sh < 2; sh++)
            for (int axis = -1; axis < 3; axis++)
                for (int lg = 0; lg < 2; lg++) {
                    wf_dtype dt = dts[di];
                    ot_tensor x = ot_random(dt, shapes[sh], layouts[(axis + 1 + lg) % N_LAYOUTS],
                                            4000 + di * 40 + sh * 10 + axis * 2 + lg, -8, 8);
                    wf_tensor *want = ot_out(dt, shapes[sh]), *got = dev_out(dt, shapes[sh]);
                    wf_tensor *xd = to_dev(x.t);
                    if (lg) {
                        cr_assert_eq(wf__log_softmax_cpu(&serial, axis, x.t, want), 0);
                        cr_assert_eq(wf__log_softmax_cuda(&dev.ctx, axis, xd, got), 0, "%s",
                                     wf_last_errmsg());
                    } else {
                        cr_assert_eq(wf__softmax_cpu(&serial, axis, x.t, want), 0);
                        cr_assert_eq(wf__softmax_cuda(&dev.ctx, axis, xd, got), 0, "%s",
                                     wf_last_errmsg());
                    }
                    char what[64];
                    snprintf(what, sizeof what, "%s %s shape %d axis %d",
                             lg ? "log_softmax" : "softmax", wf_dtype_name(dt), sh, axis);
                    expect_close(what, want, got, ot_tol_elementwise(dt));
                    wf_tensor_release(want);
                    wf_tensor_release(got);
                    wf_tensor_release(xd);
                    ot_release(&x);
                }
}

Test(ops_cuda, cross_entropy_and_its_backward_match_the_cpu_and_bad_labels_fail)
{
    NEED_DEVICE();
    const wf_dtype ldts[] = { WF_I32, WF_I64 };
    for (int li = 0; li < 2; li++)
        for (int C = 3; C <= 700; C += 697) {
            wf_shape s = WF_SHAPE(6, 7, C), ls = WF_SHAPE(6, 7);
            ot_tensor x = ot_random(WF_F32, s, layouts[li + 1], 4500 + li * 2 + (C > 3), -6, 6);
            ot_tensor lab = ot_random(ldts[li], ls, OT_CONTIG, 4600 + li, 0, C);
            wf_tensor *want = ot_out(WF_F32, ls), *got = dev_out(WF_F32, ls);
            wf_tensor *xd = to_dev(x.t), *ld = to_dev(lab.t);
            cr_assert_eq(wf__softmax_cross_entropy_cpu(&serial, x.t, lab.t, want), 0);
            cr_assert_eq(wf__softmax_cross_entropy_cuda(&dev.ctx, xd, ld, got), 0, "%s",
                         wf_last_errmsg());
            expect_close("cross entropy", want, got, ot_tol_elementwise(WF_F32));
            /* backward: (softmax - onehot) * dloss against the CPU's softmax */
            ot_tensor dl = ot_random(WF_F32, ls, OT_CONTIG, 4700 + li, -1, 1);
            wf_tensor *sm = ot_out(WF_F32, s), *dx = dev_out(WF_F32, s), *dld = to_dev(dl.t);
            cr_assert_eq(wf__softmax_cpu(&serial, -1, x.t, sm), 0);
            cr_assert_eq(wf__softmax_cross_entropy_backward_cuda(&dev.ctx, xd, ld, dld, dx), 0,
                         "%s", wf_last_errmsg());
            wf_tensor *hdx = to_host(dx);
            for (int64_t i = 0; i < sm->numel; i++) {
                int64_t row = i / C, j = i % C;
                double w = (wf_tensor_get(sm, i) - (wf_tensor_get(lab.t, row) == (double)j)) *
                           wf_tensor_get(dl.t, row);
                cr_assert(ot_close(wf_tensor_get(hdx, i), w, ot_tol_elementwise(WF_F32)),
                          "dlogits %lld: %g, want %g", (long long)i, wf_tensor_get(hdx, i), w);
            }
            wf_tensor_release(hdx);
            wf_tensor_release(sm);
            wf_tensor_release(dx);
            wf_tensor_release(dld);
            ot_release(&dl);
            wf_tensor_release(want);
            wf_tensor_release(got);
            wf_tensor_release(xd);
            wf_tensor_release(ld);
            ot_release(&x);
            ot_release(&lab);
        }
    wf_tensor *x = wf_tensor_from(WF_F32, WF_SHAPE(3, 2), (float[]){ 1, 2, 3, 4, 5, 6 });
    wf_tensor *l = wf_tensor_from(WF_I64, WF_SHAPE(3), (int64_t[]){ 0, 1, 9 });
    wf_tensor *xd = to_dev(x), *ld = to_dev(l), *o = dev_out(WF_F32, WF_SHAPE(3));
    cr_assert_eq(wf__softmax_cross_entropy_cuda(&dev.ctx, xd, ld, o), WF_EINVAL);
    cr_assert(strstr(wf_last_errmsg(), "label 9 of example 2"), "%s", wf_last_errmsg());
    wf_tensor_release(x);
    wf_tensor_release(l);
    wf_tensor_release(xd);
    wf_tensor_release(ld);
    wf_tensor_release(o);
}

Test(ops_cuda, layer_norm_and_its_input_gradient_match_the_cpu)
{
    NEED_DEVICE();
    const wf_dtype dts[] = { WF_F32, WF_F64, WF_BF16 };
    for (size_t di = 0; di < 3; di++)
        for (int begin = 1; begin < 3; begin++)
            for (int affine = 0; affine < 4; affine++) {
                wf_dtype dt = dts[di];
                wf_shape s = WF_SHAPE(5, 6, 300), ns = { .rank = 3 - begin };
                for (int d = 0; d < ns.rank; d++)
                    ns.dims[d] = s.dims[begin + d];
                uint64_t seed = 5000 + di * 32 + begin * 8 + affine;
                ot_tensor x = ot_random(dt, s, layouts[affine % N_LAYOUTS], seed, 2, 6);
                ot_tensor g = ot_random(dt, ns, OT_CONTIG, seed + 1, -2, 2);
                ot_tensor b = ot_random(dt, ns, OT_CONTIG, seed + 2, -2, 2);
                ot_tensor dy = ot_random(dt, s, OT_CONTIG, seed + 3, -1, 1);
                const wf_tensor *gm = affine & 1 ? g.t : NULL, *bt = affine & 2 ? b.t : NULL;
                wf_tensor *xd = to_dev(x.t), *gd = to_dev(g.t), *bd = to_dev(b.t),
                          *dyd = to_dev(dy.t);
                wf_tensor *want = ot_out(dt, s), *got = dev_out(dt, s);
                cr_assert_eq(wf__layer_norm_cpu(&serial, begin, 1e-5, x.t, gm, bt, want), 0);
                cr_assert_eq(wf__layer_norm_cuda(&dev.ctx, begin, 1e-5, xd, gm ? gd : NULL,
                                                 bt ? bd : NULL, got),
                             0, "%s", wf_last_errmsg());
                expect_close("layer_norm", want, got, ot_tol_elementwise(dt));
                cr_assert_eq(
                    wf__layer_norm_backward_input_cpu(&serial, begin, 1e-5, x.t, gm, dy.t, want),
                    0);
                cr_assert_eq(wf__layer_norm_backward_input_cuda(&dev.ctx, begin, 1e-5, xd,
                                                                gm ? gd : NULL, dyd, got),
                             0, "%s", wf_last_errmsg());
                expect_close("layer_norm_backward_input", want, got, ot_tol_elementwise(dt));
                wf_tensor_release(want);
                wf_tensor_release(got);
                wf_tensor_release(xd);
                wf_tensor_release(gd);
                wf_tensor_release(bd);
                wf_tensor_release(dyd);
                ot_release(&x);
                ot_release(&g);
                ot_release(&b);
                ot_release(&dy);
            }
}

/* ---- Indexing -------------------------------------------------------------------------------- */

Test(ops_cuda, gather_and_scatter_add_match_the_cpu_and_bad_indices_fail)
{
    NEED_DEVICE();
    const wf_dtype dts[] = { WF_F32, WF_F64, WF_BF16, WF_I32, WF_I64 };
    for (size_t di = 0; di < 5; di++)
        for (int axis = 0; axis < 3; axis++) {
            wf_dtype dt = dts[di];
            wf_shape ps = WF_SHAPE(7, 9, 11), is = WF_SHAPE(4, 5);
            ot_tensor p = ot_random(dt, ps, layouts[axis], 6000 + di * 4 + axis, -5, 5);
            ot_tensor idx =
                ot_random(di & 1 ? WF_I64 : WF_I32, is, OT_CONTIG, 6100 + di, 0, ps.dims[axis]);
            wf_shape os = { .rank = 4 };
            for (int d = 0, k = 0; d < 3; d++) {
                if (d == axis) {
                    os.dims[k++] = 4;
                    os.dims[k++] = 5;
                } else {
                    os.dims[k++] = ps.dims[d];
                }
            }
            wf_tensor *want = ot_out(dt, os), *got = dev_out(dt, os);
            wf_tensor *pd = to_dev(p.t), *id = to_dev(idx.t);
            cr_assert_eq(wf__gather_cpu(&serial, axis, p.t, idx.t, want), 0, "%s",
                         wf_last_errmsg());
            cr_assert_eq(wf__gather_cuda(&dev.ctx, axis, pd, id, got), 0, "%s", wf_last_errmsg());
            expect_close("gather", want, got, (ot_tol){ 0, 0 });
            /* scatter_add of random updates back into params' shape */
            ot_tensor u =
                ot_random(dt, os, layouts[(axis + 1) % N_LAYOUTS == 1 ? 0 : 2], 6200 + di, -5, 5);
            wf_tensor *swant = ot_out(dt, ps), *sgot = dev_out(dt, ps), *ud = to_dev(u.t);
            cr_assert_eq(wf__scatter_add_cpu(&serial, axis, u.t, idx.t, swant), 0, "%s",
                         wf_last_errmsg());
            cr_assert_eq(wf__scatter_add_cuda(&dev.ctx, axis, ud, id, sgot), 0, "%s",
                         wf_last_errmsg());
            ot_tol tol = dt == WF_BF16 ? ot_tol_elementwise(dt) : reduce_tol(dt);
            expect_close("scatter_add", swant, sgot, tol);
            wf_tensor_release(swant);
            wf_tensor_release(sgot);
            wf_tensor_release(ud);
            ot_release(&u);
            wf_tensor_release(want);
            wf_tensor_release(got);
            wf_tensor_release(pd);
            wf_tensor_release(id);
            ot_release(&p);
            ot_release(&idx);
        }
    wf_tensor *p = wf_tensor_from(WF_F32, WF_SHAPE(3, 2), (float[]){ 1, 2, 3, 4, 5, 6 });
    wf_tensor *i = wf_tensor_from(WF_I32, WF_SHAPE(3), (int32_t[]){ 0, -1, 2 });
    wf_tensor *pd = to_dev(p), *id = to_dev(i), *o = dev_out(WF_F32, WF_SHAPE(3, 2));
    cr_assert_eq(wf__gather_cuda(&dev.ctx, 0, pd, id, o), WF_EINVAL);
    cr_assert(strstr(wf_last_errmsg(), "index -1 at position 1"), "%s", wf_last_errmsg());
    cr_assert_eq(wf__scatter_add_cuda(&dev.ctx, 0, pd, id, o), WF_EINVAL);
    cr_assert(strstr(wf_last_errmsg(), "index -1 at position 1"), "%s", wf_last_errmsg());
    wf_tensor_release(p);
    wf_tensor_release(i);
    wf_tensor_release(pd);
    wf_tensor_release(id);
    wf_tensor_release(o);
}

/* ---- Shape ops, one_hot, unreduce ----------------------------------------------------------- */

/* Runs 'cpu' and 'gpu' (the same op) on x and its device copy into fresh outputs of 'shape'
 * and asserts equal bits. */
#    define SAME_AS_CPU(what, dt, shape, x, CPU_CALL, GPU_CALL)             \
        do {                                                                \
            wf_tensor *want = ot_out(dt, shape), *got = dev_out(dt, shape); \
            wf_tensor *xd = to_dev(x);                                      \
            (void)xd;                                                       \
            cr_assert_eq((CPU_CALL), 0, "%s: %s", what, wf_last_errmsg());  \
            cr_assert_eq((GPU_CALL), 0, "%s: %s", what, wf_last_errmsg());  \
            expect_close(what, want, got, (ot_tol){ 0, 0 });                \
            wf_tensor_release(want);                                        \
            wf_tensor_release(got);                                         \
            wf_tensor_release(xd);                                          \
        } while (0)

Test(ops_cuda, shape_ops_copy_exactly_what_the_cpu_copies)
{
    NEED_DEVICE();
    const wf_dtype dts[] = { WF_F32, WF_F64, WF_BF16, WF_I64, WF_BOOL };
    for (size_t di = 0; di < 5; di++)
        for (int l = 0; l < N_LAYOUTS; l++) {
            wf_dtype dt = dts[di];
            wf_shape s = WF_SHAPE(4, 6, 5);
            ot_tensor x = ot_random(dt, s, layouts[l], 7000 + di * 4 + l, -3, 3);
            /* reshape */
            wf_shape rs = WF_SHAPE(8, 15);
            SAME_AS_CPU("reshape", dt, rs, x.t, wf__reshape_cpu(&serial, x.t, want),
                        wf__reshape_cuda(&dev.ctx, xd, got));
            /* transpose */
            const int perm[] = { 1, 2, 0 };
            wf_shape ts = WF_SHAPE(6, 5, 4);
            SAME_AS_CPU("transpose", dt, ts, x.t, wf__transpose_cpu(&serial, perm, 3, x.t, want),
                        wf__transpose_cuda(&dev.ctx, perm, 3, xd, got));
            /* slice with a negative step */
            const int64_t b[] = { 1, 5, 0 }, e[] = { 4, 0, 5 }, st[] = { 2, -2, 1 };
            wf_shape ss = WF_SHAPE(2, 3, 5);
            SAME_AS_CPU("slice", dt, ss, x.t, wf__slice_cpu(&serial, b, e, st, x.t, want),
                        wf__slice_cuda(&dev.ctx, b, e, st, xd, got));
            /* slice_backward of that slice: dy of the slice's shape into x's */
            ot_tensor dy = ot_random(dt, ss, OT_CONTIG, 7100 + di, -3, 3);
            {
                wf_tensor *want = ot_out(dt, s), *got = dev_out(dt, s), *dyd = to_dev(dy.t);
                cr_assert_eq(wf__slice_backward_cpu(&serial, b, e, st, dy.t, want), 0);
                cr_assert_eq(wf__slice_backward_cuda(&dev.ctx, b, e, st, dyd, got), 0, "%s",
                             wf_last_errmsg());
                expect_close("slice_backward", want, got, (ot_tol){ 0, 0 });
                wf_tensor_release(want);
                wf_tensor_release(got);
                wf_tensor_release(dyd);
            }
            ot_release(&dy);
            /* broadcast_to from [6, 1] */
            ot_tensor small = ot_random(dt, WF_SHAPE(6, 1), OT_CONTIG, 7200 + di, -3, 3);
            wf_shape bs = WF_SHAPE(3, 6, 4);
            SAME_AS_CPU("broadcast_to", dt, bs, small.t,
                        wf__broadcast_to_cpu(&serial, small.t, want),
                        wf__broadcast_to_cuda(&dev.ctx, xd, got));
            ot_release(&small);
            /* pad */
            const int64_t before[] = { 1, 0, 2 }, after[] = { 0, 3, 1 };
            wf_shape ps = WF_SHAPE(5, 9, 8);
            SAME_AS_CPU("pad", dt, ps, x.t, wf__pad_cpu(&serial, before, after, 1.0, x.t, want),
                        wf__pad_cuda(&dev.ctx, before, after, 1.0, xd, got));
            /* concat along 1 and stack along 0 of x and a second tensor */
            ot_tensor y = ot_random(dt, s, OT_CONTIG, 7300 + di, -3, 3);
            {
                wf_tensor *yd = to_dev(y.t), *xd = to_dev(x.t);
                const wf_tensor *hx[2] = { x.t, y.t }, *dx[2] = { xd, yd };
                wf_shape cs = WF_SHAPE(4, 12, 5), ks = WF_SHAPE(2, 4, 6, 5);
                wf_tensor *want = ot_out(dt, cs), *got = dev_out(dt, cs);
                cr_assert_eq(wf__concat_cpu(&serial, 1, hx, 2, want), 0);
                cr_assert_eq(wf__concat_cuda(&dev.ctx, 1, dx, 2, got), 0, "%s", wf_last_errmsg());
                expect_close("concat", want, got, (ot_tol){ 0, 0 });
                wf_tensor_release(want);
                wf_tensor_release(got);
                want = ot_out(dt, ks);
                got = dev_out(dt, ks);
                cr_assert_eq(wf__stack_cpu(&serial, 0, hx, 2, want), 0);
                cr_assert_eq(wf__stack_cuda(&dev.ctx, 0, dx, 2, got), 0, "%s", wf_last_errmsg());
                expect_close("stack", want, got, (ot_tol){ 0, 0 });
                wf_tensor_release(want);
                wf_tensor_release(got);
                wf_tensor_release(xd);
                wf_tensor_release(yd);
            }
            ot_release(&y);
            ot_release(&x);
        }
    /* one_hot, an out-of-range index giving a zero row */
    wf_tensor *idx = wf_tensor_from(WF_I32, WF_SHAPE(2, 2), (int32_t[]){ 0, 3, -1, 2 });
    wf_shape os = WF_SHAPE(2, 2, 3);
    SAME_AS_CPU("one_hot", WF_F32, os, idx, wf__one_hot_cpu(&serial, idx, want),
                wf__one_hot_cuda(&dev.ctx, xd, got));
    wf_tensor_release(idx);
}

Test(ops_cuda, unreduce_spreads_sums_and_means_back_as_the_cpu)
{
    NEED_DEVICE();
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 1, .flags = WF_RT_NO_PIN });
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(4, 5, 6));
    const int ax[] = { 0, 2 };
    for (int mean = 0; mean < 2; mean++)
        for (int keep = 0; keep < 2; keep++) {
            wf_node *r =
                mean ? wf_reduce_mean(g, x, ax, 2, keep) : wf_reduce_sum(g, x, ax, 2, keep);
            cr_assert_not_null(r, "%s", wf_graph_errmsg(g));
            wf_node *dy = wf_placeholder(g, NULL, WF_F32, wf_node_shape(r));
            wf_node *u = wf__unreduce(g, dy, x, r->attrs, mean);
            cr_assert_not_null(u, "%s", wf_graph_errmsg(g));
            cr_assert_not_null(u->op->kernel[WF_KERNEL_CUDA]);
            ot_tensor dv =
                ot_random(WF_F32, wf_node_shape(r), layouts[2], 7400 + mean * 2 + keep, -3, 3);
            ot_tensor xv = ot_random(WF_F32, WF_SHAPE(4, 5, 6), OT_CONTIG, 7500, -1, 1);
            wf_tensor *want = ot_out(WF_F32, WF_SHAPE(4, 5, 6));
            wf_tensor *got = dev_out(WF_F32, WF_SHAPE(4, 5, 6));
            wf_tensor *dd = to_dev(dv.t), *xd = to_dev(xv.t);
            wf_kernel_ctx cpu = { 0 };
            wf_tensor *hin[2] = { dv.t, xv.t }, *din[2] = { dd, xd };
            cr_assert_eq(u->op->kernel[WF_KERNEL_CPU](&cpu, u, hin, &want), 0, "%s",
                         wf_last_errmsg());
            cr_assert_eq(u->op->kernel[WF_KERNEL_CUDA](&dev.ctx, u, din, &got), 0, "%s",
                         wf_last_errmsg());
            expect_close("unreduce", want, got, ot_tol_elementwise(WF_F32));
            wf_tensor_release(want);
            wf_tensor_release(got);
            wf_tensor_release(dd);
            wf_tensor_release(xd);
            ot_release(&dv);
            ot_release(&xv);
        }
    wf_graph_destroy(g);
    wf_runtime_destroy(rt);
}

/* ---- Convolution and pooling ---------------------------------------------------------------- */

Test(ops_cuda, pools_and_their_gradients_give_the_cpu_bits)
{
    NEED_DEVICE();
    const wf_pool_params ps[] = {
        { { 2, 2 }, { 0, 0 }, { 0, 0, 0, 0 }, false },
        { { 3, 3 }, { 2, 1 }, { 1, 2, 0, 1 }, false },
        { { 3, 2 }, { 1, 2 }, { 2, 0, 1, 1 }, true },
    };
    const wf_dtype dts[] = { WF_F32, WF_F64, WF_BF16 };
    for (size_t pi = 0; pi < 3; pi++)
        for (size_t di = 0; di < 3; di++) {
            wf_dtype dt = dts[di];
            wf_shape xs = WF_SHAPE(2, 3, 9, 10);
            ot_tensor x = ot_random(dt, xs, layouts[0], 8000 + pi * 4 + di, -4, 4);
            const wf_pool_params *p = &ps[pi];
            int64_t OH = (9 + p->padding[0] + p->padding[1] - p->window[0]) /
                             (p->stride[0] ? p->stride[0] : p->window[0]) +
                         1;
            int64_t OW = (10 + p->padding[2] + p->padding[3] - p->window[1]) /
                             (p->stride[1] ? p->stride[1] : p->window[1]) +
                         1;
            wf_shape ys = WF_SHAPE(2, 3, OH, OW);
            ot_tensor dy = ot_random(dt, ys, OT_CONTIG, 8100 + pi * 4 + di, -1, 1);
            wf_tensor *xd = to_dev(x.t), *dyd = to_dev(dy.t);
            for (int kind = 0; kind < 4; kind++) {
                bool bwd = kind >= 2;
                wf_shape os = bwd ? xs : ys;
                wf_tensor *want = ot_out(dt, os), *got = dev_out(dt, os);
                int r1, r2;
                switch (kind) {
                case 0:
                    r1 = wf__max_pool2d_cpu(&serial, p, x.t, want);
                    r2 = wf__max_pool2d_cuda(&dev.ctx, p, xd, got);
                    break;
                case 1:
                    r1 = wf__avg_pool2d_cpu(&serial, p, x.t, want);
                    r2 = wf__avg_pool2d_cuda(&dev.ctx, p, xd, got);
                    break;
                case 2:
                    r1 = wf__max_pool2d_backward_cpu(&serial, p, x.t, dy.t, want);
                    r2 = wf__max_pool2d_backward_cuda(&dev.ctx, p, xd, dyd, got);
                    break;
                default:
                    r1 = wf__avg_pool2d_backward_cpu(&serial, p, dy.t, want);
                    r2 = wf__avg_pool2d_backward_cuda(&dev.ctx, p, dyd, got);
                }
                cr_assert_eq(r1, 0, "%s", wf_last_errmsg());
                cr_assert_eq(r2, 0, "%s", wf_last_errmsg());
                char what[64];
                snprintf(what, sizeof what, "pool kind %d params %zu %s", kind, pi,
                         wf_dtype_name(dt));
                expect_close(what, want, got,
                             dt == WF_BF16 ? ot_tol_elementwise(dt) : (ot_tol){ 0, 0 });
                wf_tensor_release(want);
                wf_tensor_release(got);
            }
            wf_tensor_release(xd);
            wf_tensor_release(dyd);
            ot_release(&x);
            ot_release(&dy);
        }
}

static ot_tol conv_tol(wf_dtype dt)
{
    return dt == WF_F32   ? (ot_tol){ 1e-4, 1e-4 }
           : dt == WF_F64 ? (ot_tol){ 1e-12, 1e-12 }
                          : (ot_tol){ 5e-2, 2e-2 };
}

Test(ops_cuda, convolutions_and_their_gradients_match_the_cpu)
{
    NEED_DEVICE();
    const wf_conv_params ps[] = {
        { { 1, 1 }, { 1, 1, 1, 1 }, { 1, 1 }, 1 },
        { { 2, 1 }, { 0, 2, 1, 0 }, { 1, 2 }, 2 }, /* asymmetric padding, dilation, groups */
        { { 1, 1 }, { 0, 0, 0, 0 }, { 1, 1 }, 1 }, /* 1 x 1 */
    };
    const int kh[] = { 3, 3, 1 }, kw[] = { 3, 2, 1 };
    const wf_dtype dts[] = { WF_F32, WF_F64, WF_BF16 };
    for (size_t pi = 0; pi < 3; pi++)
        for (size_t di = 0; di < 3; di++) {
            wf_dtype dt = dts[di];
            const wf_conv_params *p = &ps[pi];
            int G = p->groups;
            wf_shape xs = WF_SHAPE(2, 4, 9, 8), ws = WF_SHAPE(6, 4 / G, kh[pi], kw[pi]);
            int64_t OH = (9 + p->padding[0] + p->padding[1] - (p->dilation[0] * (kh[pi] - 1) + 1)) /
                             p->stride[0] +
                         1;
            int64_t OW = (8 + p->padding[2] + p->padding[3] - (p->dilation[1] * (kw[pi] - 1) + 1)) /
                             p->stride[1] +
                         1;
            wf_shape ys = WF_SHAPE(2, 6, OH, OW);
            ot_tensor x = ot_random(dt, xs, pi == 1 ? (ot_layout){ NULL, 0x4, 0 } : OT_CONTIG,
                                    8200 + pi * 4 + di, -1, 1);
            ot_tensor w = ot_random(dt, ws, OT_CONTIG, 8300 + pi * 4 + di, -1, 1);
            ot_tensor dy = ot_random(dt, ys, OT_CONTIG, 8400 + pi * 4 + di, -1, 1);
            wf_tensor *xd = to_dev(x.t), *wd = to_dev(w.t), *dyd = to_dev(dy.t);
            for (int kind = 0; kind < 3; kind++) {
                wf_shape os = kind == 0 ? ys : kind == 1 ? xs : ws;
                wf_tensor *want = ot_out(dt, os), *got = dev_out(dt, os);
                int r1, r2;
                if (kind == 0) {
                    r1 = wf__conv2d_cpu(&serial, p, x.t, w.t, want);
                    r2 = wf__conv2d_cuda(&dev.ctx, p, xd, wd, got);
                } else if (kind == 1) {
                    r1 = wf__conv2d_backward_input_cpu(&serial, p, dy.t, w.t, want);
                    r2 = wf__conv2d_backward_input_cuda(&dev.ctx, p, dyd, wd, got);
                } else {
                    r1 = wf__conv2d_backward_filter_cpu(&serial, p, x.t, dy.t, want);
                    r2 = wf__conv2d_backward_filter_cuda(&dev.ctx, p, xd, dyd, got);
                }
                cr_assert_eq(r1, 0, "%s", wf_last_errmsg());
                cr_assert_eq(r2, 0, "%s", wf_last_errmsg());
                char what[64];
                snprintf(what, sizeof what, "conv kind %d params %zu %s", kind, pi,
                         wf_dtype_name(dt));
                expect_close(what, want, got, conv_tol(dt));
                wf_tensor_release(want);
                wf_tensor_release(got);
            }
            wf_tensor_release(xd);
            wf_tensor_release(wd);
            wf_tensor_release(dyd);
            ot_release(&x);
            ot_release(&w);
            ot_release(&dy);
        }
}

/* ---- Dropout -------------------------------------------------------------------------------- */

Test(ops_cuda, dropout_draws_the_cpus_mask_for_the_same_seed_and_step)
{
    NEED_DEVICE();
    const wf_dtype dts[] = { WF_F32, WF_F64, WF_BF16 };
    for (size_t di = 0; di < 3; di++)
        for (int l = 0; l < N_LAYOUTS; l++) {
            wf_dtype dt = dts[di];
            wf_shape s = WF_SHAPE(7, 30, 11);
            ot_tensor x = ot_random(dt, s, layouts[l], 8500 + di * 4 + l, -2, 2);
            wf_tensor *want = ot_out(dt, s), *got = dev_out(dt, s), *xd = to_dev(x.t);
            const wf_kctx cpu = { .rt = NULL, .step = 5 };
            wf_kernel_ctx gpu = dev.ctx;
            gpu.step = 5;
            cr_assert_eq(wf__dropout_cpu(&cpu, 0.3, 42, x.t, want), 0, "%s", wf_last_errmsg());
            cr_assert_eq(wf__dropout_cuda(&gpu, 0.3, 42, xd, got), 0, "%s", wf_last_errmsg());
            expect_close("dropout", want, got,
                         dt == WF_BF16 ? ot_tol_elementwise(dt) : (ot_tol){ 0, 0 });
            wf_tensor_release(want);
            wf_tensor_release(got);
            wf_tensor_release(xd);
            ot_release(&x);
        }
}

/* ---- Optimizer updates ------------------------------------------------------------------- */

/* grad/optim_cpu.c's loops for one element, in double (the reference; the kernel rounds in
 * the variable's type, so f32 results agree to a few ulp). */
static void update_ref(const wf_cuda_update *u, double *w, double g, double *s0, double *s1)
{
    if (u->kind == WF_CU_OPT_SGD) {
        double gi = g + u->weight_decay * *w;
        if (u->momentum <= 0) {
            *w -= u->lr * gi;
        } else {
            double vi = u->momentum * *s0 + gi;
            *s0 = vi;
            *w -= u->lr * (u->nesterov ? gi + u->momentum * vi : vi);
        }
        return;
    }
    double decay = u->kind == WF_CU_OPT_ADAMW ? 1 - u->lr * u->weight_decay : 1;
    double l2 = u->kind == WF_CU_OPT_ADAM ? u->weight_decay : 0;
    double p = *w * decay, gi = g + l2 * *w;
    double mi = u->beta1 * *s0 + (1 - u->beta1) * gi,
           vi = u->beta2 * *s1 + (1 - u->beta2) * gi * gi;
    *s0 = mi;
    *s1 = vi;
    *w = p - u->lr / u->bias_correction1 * mi / (sqrt(vi) / sqrt(u->bias_correction2) + u->eps);
}

Test(ops_cuda, fused_multi_tensor_updates_follow_the_optimizers_rules)
{
    NEED_DEVICE();
    const wf_cuda_update kinds[] = {
        { WF_CU_OPT_SGD, 0.1, 0, 0, 0, 0, 0.01, 1, 1, false },
        { WF_CU_OPT_SGD, 0.1, 0.9, 0, 0, 0, 0.01, 1, 1, false },
        { WF_CU_OPT_SGD, 0.1, 0.9, 0, 0, 0, 0, 1, 1, true },
        { WF_CU_OPT_ADAM, 1e-3, 0, 0.9, 0.999, 1e-8, 0.01, 1 - 0.9 * 0.9, 1 - 0.999 * 0.999,
          false },
        { WF_CU_OPT_ADAMW, 1e-3, 0, 0.9, 0.999, 1e-8, 0.1, 1 - 0.9, 1 - 0.999, false },
    };
    const int64_t sizes[] = { 70000, 5, 33 }; /* the first spans two chunks */
    const wf_dtype dts[] = { WF_F32, WF_F64 };
    for (size_t ki = 0; ki < 5; ki++)
        for (size_t di = 0; di < 2; di++) {
            const wf_cuda_update *u = &kinds[ki];
            wf_dtype dt = dts[di];
            ot_tensor hw[3], hg[3], h0[3], h1[3];
            wf_tensor *dw[3], *dg[3], *d0[3], *d1[3];
            for (int i = 0; i < 3; i++) {
                wf_shape sh = WF_SHAPE(sizes[i]);
                uint64_t seed = 9000 + ki * 40 + di * 20 + i * 4;
                hw[i] = ot_random(dt, sh, OT_CONTIG, seed, -1, 1);
                hg[i] = ot_random(dt, sh, OT_CONTIG, seed + 1, -1, 1);
                h0[i] = ot_random(dt, sh, OT_CONTIG, seed + 2, -1, 1);
                h1[i] = ot_random(dt, sh, OT_CONTIG, seed + 3, 0, 1); /* v >= 0 */
                dw[i] = to_dev(hw[i].t);
                dg[i] = to_dev(hg[i].t);
                d0[i] = to_dev(h0[i].t);
                d1[i] = to_dev(h1[i].t);
            }
            cr_assert_eq(
                wf__update_multi_cuda(&dev.ctx, u, 3, dw, (const wf_tensor *const *)dg, d0, d1), 0,
                "%s", wf_last_errmsg());
            ot_tol tol = dt == WF_F32 ? (ot_tol){ 1e-6, 1e-5 } : (ot_tol){ 1e-14, 1e-12 };
            for (int i = 0; i < 3; i++) {
                wf_tensor *rw = to_host(dw[i]), *r0 = to_host(d0[i]), *r1 = to_host(d1[i]);
                for (int64_t e = 0; e < sizes[i]; e++) {
                    double w = wf_tensor_get(hw[i].t, e), s0 = wf_tensor_get(h0[i].t, e);
                    double s1 = wf_tensor_get(h1[i].t, e);
                    update_ref(u, &w, wf_tensor_get(hg[i].t, e), &s0, &s1);
                    cr_assert(ot_close(wf_tensor_get(rw, e), w, tol),
                              "kind %zu %s tensor %d element %lld: w %.9g, want %.9g", ki,
                              wf_dtype_name(dt), i, (long long)e, wf_tensor_get(rw, e), w);
                    bool has0 = u->kind != WF_CU_OPT_SGD || u->momentum > 0;
                    bool has1 = u->kind != WF_CU_OPT_SGD;
                    cr_assert(!has0 || ot_close(wf_tensor_get(r0, e), s0, tol), "state 0");
                    cr_assert(!has1 || ot_close(wf_tensor_get(r1, e), s1, tol), "state 1");
                }
                wf_tensor_release(rw);
                wf_tensor_release(r0);
                wf_tensor_release(r1);
                wf_tensor_release(dw[i]);
                wf_tensor_release(dg[i]);
                wf_tensor_release(d0[i]);
                wf_tensor_release(d1[i]);
                ot_release(&hw[i]);
                ot_release(&hg[i]);
                ot_release(&h0[i]);
                ot_release(&h1[i]);
            }
        }
}

#endif /* WF_HAVE_CUDA */
