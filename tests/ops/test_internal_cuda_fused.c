/* tests/ops/test_internal_cuda_fused.c: the CUDA twins of the fused kernels against their CPU
 * twins: the fused elementwise program (ops/fused_cuda.cu against ops/fused_cpu.c) and the
 * multi-tensor optimizer update's CUDA slot (grad/optim_cpu.c's multi_update defs, through
 * ops/optim_cuda.cu, against the same defs' CPU kernel).
 * Fused programs: f32 and f64 chains of unary, binary and activation-gradient instructions
 *   over broadcast, permuted and flipped (negative-stride) inputs; comparisons and where;
 *   casts through integers and integer arithmetic; sizes 1, 7, 1000 and 70001. Tolerances
 *   (|got - want| <= abs + rel |want|): f32 (1e-5, 1e-5) and f64 (1e-12, 1e-12) for the
 *   chains (each instruction rounds to its dtype on both sides; libdevice's exp, tanh and erf
 *   differ from glibc's by a few ulp, which a chain of up to five instructions compounds),
 *   exact for integer, bool and where programs. An integer division by zero fails naming
 *   the smallest element, as the CPU does.
 * multi_update: SGD with momentum (and Nesterov), Adam and AdamW at step 2 (bias corrections
 *   and the schedule read from the device), f32 and f64, three variables of 70000, 5 and 33
 *   elements: variables and states within f32 (1e-6, 1e-5), f64 (1e-14, 1e-12) of the CPU
 *   kernel's (both round each operation in the variable's type); RMSProp is WF_ENODEV.
 * TF32 (WF_SESSION_TF32 marks nodes: ops/cuda_kernels.h, WF__MATMUL_TF32): a marked f32
 *   matmul node agrees with the CPU's product within TF32's (3e-2, 1e-2), an unmarked one
 *   within f32's (1e-4, 1e-4) (K = 96, values in [-1, 1], as test_internal_cuda_ops.c).
 * The kernels are called on a hand-made device queue (cuda_queue.h, as test_internal_cuda_ops.c).
 * Without a CUDA device the device tests skip with "no CUDA device"; the checks that fail
 * before any device work (no queue, a bad program) and the slots' registration run wherever
 * weft is built with CUDA; without CUDA the suite is one test that skips. */
#include "../../core/graph.h"
#include "../../core/tensor.h"
#include "../../grad/internal.h"
#include "../../grad/update.h"
#include "../../ops/fused.h"
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

TestSuite(ops_cuda_fused, .fini = wf_test_fini, .timeout = WF_TEST_TIMEOUT(300));

#ifndef WF_HAVE_CUDA

Test(ops_cuda_fused, skipped_without_cuda)
{
    cr_skip_test("built without CUDA");
}

#else

static const wf_kctx serial = { .rt = NULL };

#    include "fused_program.h"

/* ---- The device queue (cuda_queue.h, shared with test_internal_cuda_ops.c) ------------------ */

#    include "cuda_queue.h"

/* Runs program 'ins' (dtypes filled in here) over host inputs 'in' on the CPU and on the
 * device and compares the outputs with 'tol'. */
static void check_program(const char *what, wf__fused_instr *ins, int n, double alpha,
                          const wf_tensor *const *in, int n_in, ot_tol tol)
{
    wf_dtype odt = type_program(ins, n, in, n_in);
    wf_attrs at;
    cr_assert_eq(wf__fused_encode(&at, ins, n, alpha), 0, "%s", wf_last_errmsg());
    wf_shape sh = wf_tensor_shape(in[0]);
    for (int k = 1; k < n_in; k++)
        cr_assert_eq(wf_shape_broadcast(sh, wf_tensor_shape(in[k]), &sh), 0);
    wf_tensor *want = ot_out(odt, sh);
    cr_assert_eq(wf__fused_elementwise_cpu(&serial, &at, in, n_in, want), 0, "%s: cpu: %s", what,
                 wf_last_errmsg());
    wf_tensor *din[WF__FUSED_MAX_INPUTS];
    for (int k = 0; k < n_in; k++)
        din[k] = to_dev(in[k]);
    wf_tensor *got = dev_out(odt, sh);
    int rc = wf__fused_elementwise_cuda(&dev.ctx, &at, (const wf_tensor *const *)din, n_in, got);
    cr_assert_eq(rc, 0, "%s: cuda: %s", what, wf_last_errmsg());
    expect_close(what, want, got, tol);
    for (int k = 0; k < n_in; k++)
        wf_tensor_release(din[k]);
    wf_tensor_release(got);
    wf_tensor_release(want);
}

/* ---- Checks without a device ----------------------------------------------------------------- */

Test(ops_cuda_fused, the_fused_ops_have_cuda_slots)
{
    cr_assert_not_null(wf_op_fused_elementwise.kernel[WF_KERNEL_CUDA]);
    for (int a = 1; a <= 12; a++)
        cr_assert_not_null(wf__update_multi_def(a)->kernel[WF_KERNEL_CUDA], "n_assign %d", a);
    const wf_op_def *single[] = { &wf__op_update_1, &wf__op_update_2, &wf__op_update_3,
                                  &wf__op_update_4, &wf__op_increment };
    for (int i = 0; i < 5; i++)
        cr_assert_not_null(single[i]->kernel[WF_KERNEL_CUDA], "%s", single[i]->name);
}

/* Placement asks kernel_ok whether a CUDA kernel computes a node: an update of RMSProp or
 * Adagrad (read from its constant hyperparameters) has none, SGD, Adam and AdamW have one;
 * unknown hyperparameters (not a constant) leave it to the kernel; the CPU takes all. */
Test(ops_cuda_fused, updates_of_optimizers_without_a_cuda_kernel_stay_on_the_cpu)
{
    const int kinds[] = { WF_OPT_SGD, WF_OPT_ADAM, WF_OPT_ADAMW, WF_OPT_RMSPROP, WF_OPT_ADAGRAD };
    const bool on_cuda[] = { true, true, true, false, false };
    const wf_op_def *defs[] = { &wf__op_update_2, wf__update_multi_def(2) };
    wf_node parts[5], nd;
    memset(parts, 0, sizeof parts);
    wf_node *ins[5] = { &parts[0], &parts[1], &parts[2], &parts[3], &parts[4] };
    parts[4].op = &wf_op_constant;
    for (int d = 0; d < 2; d++)
        for (int i = 0; i < 5; i++) {
            double hpv[WF__HP_COUNT] = { [WF__HP_KIND] = kinds[i], [WF__HP_LR] = 0.1 };
            parts[4].value = wf_tensor_from(WF_F64, WF_SHAPE(WF__HP_COUNT), hpv);
            memset(&nd, 0, sizeof nd);
            nd.op = defs[d];
            nd.n_inputs = 5; /* variable, state, gradient, step, hyperparameters */
            nd.inputs = ins;
            cr_assert_eq(wf__op_kernel_ok(nd.op, &nd, WF_KERNEL_CUDA), on_cuda[i], "%s, kind %d",
                         nd.op->name, kinds[i]);
            cr_assert(wf__op_kernel_ok(nd.op, &nd, WF_KERNEL_CPU), "%s on the cpu", nd.op->name);
            parts[4].op = &wf_op_placeholder;
            cr_assert(wf__op_kernel_ok(nd.op, &nd, WF_KERNEL_CUDA), "%s, fed hyperparameters",
                      nd.op->name);
            parts[4].op = &wf_op_constant;
            wf_tensor_release(parts[4].value);
        }
}

Test(ops_cuda_fused, a_fused_program_without_a_device_queue_is_einval_not_a_crash)
{
    wf_tensor *x = wf_tensor_from(WF_F32, WF_SHAPE(2), (float[]){ 1, 2 });
    wf_tensor *o = ot_out(WF_F32, WF_SHAPE(2));
    wf__fused_instr ins[2] = { U(EXP, 0), B(ADD, 1, 0) };
    const wf_tensor *in[1] = { x };
    type_program(ins, 2, in, 1);
    wf_attrs at;
    cr_assert_eq(wf__fused_encode(&at, ins, 2, 0), 0);
    cr_assert_eq(wf__fused_elementwise_cuda(NULL, &at, in, 1, o), WF_EINVAL);
    cr_assert(strstr(wf_last_errmsg(), "fused_elementwise"), "%s", wf_last_errmsg());
    /* A program reading a register not yet written fails its check first. */
    ins[1] = B(ADD, 2, 0);
    ins[1].dtype = WF_F32;
    cr_assert_eq(wf__fused_encode(&at, ins, 2, 0), 0);
    wf_kernel_ctx none = { 0 };
    cr_assert_eq(wf__fused_elementwise_cuda(&none, &at, in, 1, o), WF_EINVAL);
    cr_assert(strstr(wf_last_errmsg(), "not yet written"), "%s", wf_last_errmsg());
    wf_tensor_release(x);
    wf_tensor_release(o);
}

Test(ops_cuda_fused, multi_update_without_a_device_queue_is_einval_not_a_crash)
{
    const wf_op_def *def = wf__update_multi_def(1); /* one SGD variable without momentum */
    wf_tensor *w = wf_tensor_from(WF_F32, WF_SHAPE(2), (float[]){ 1, 2 });
    wf_tensor *g = wf_tensor_from(WF_F32, WF_SHAPE(2), (float[]){ 1, 2 });
    wf_tensor *step = wf_tensor_from(WF_I64, WF_SCALAR, (int64_t[]){ 0 });
    double hpv[WF__HP_COUNT] = { [WF__HP_KIND] = WF_OPT_SGD, [WF__HP_LR] = 0.1 };
    wf_tensor *hp = wf_tensor_from(WF_F64, WF_SHAPE(WF__HP_COUNT), hpv);
    wf_node nd;
    memset(&nd, 0, sizeof nd);
    nd.op = def;
    nd.n_inputs = 4;
    wf_tensor *in[4] = { w, g, step, hp }, *out = NULL;
    cr_assert_eq(def->kernel[WF_KERNEL_CUDA](NULL, &nd, in, &out), WF_EINVAL);
    cr_assert(strstr(wf_last_errmsg(), "multi_update"), "%s", wf_last_errmsg());
    wf_tensor_release(w);
    wf_tensor_release(g);
    wf_tensor_release(step);
    wf_tensor_release(hp);
}

/* ---- Fused programs -------------------------------------------------------------------------- */

static const int64_t sizes[] = { 1, 7, 1000, 70001 };

Test(ops_cuda_fused, float_chains_match_the_cpu_on_broadcast_and_strided_inputs)
{
    NEED_DEVICE();
    static const int perm[] = { 1, 0 };
    const ot_layout lay[] = { OT_CONTIG, { perm, 0, 0 }, { NULL, 0x1, 0 } };
    const wf_dtype dts[] = { WF_F32, WF_F64 };
    for (int di = 0; di < 2; di++)
        for (int si = 0; si < 4; si++)
            for (int li = 0; li < 3; li++) {
                wf_dtype dt = dts[di];
                int64_t n = sizes[si], rows = n >= 1000 ? 10 : 1, cols = n / rows;
                ot_tensor x = ot_random(dt, WF_SHAPE(rows, cols), lay[li], 700 + si, -2, 2);
                ot_tensor y = ot_random(dt, WF_SHAPE(rows, cols), OT_CONTIG, 710 + si, -2, 2);
                ot_tensor b = ot_random(dt, WF_SHAPE(cols), OT_CONTIG, 720 + si, -1, 1);
                const wf_tensor *in[3] = { x.t, y.t, b.t };
                ot_tol tol = dt == WF_F32 ? (ot_tol){ 1e-5, 1e-5 } : (ot_tol){ 1e-12, 1e-12 };
                char what[96];
                /* relu(x * y + b), then sigmoid, then tanh_grad against x */
                wf__fused_instr p1[] = { B(MUL, 0, 1), B(ADD, 3, 2), U(RELU, 4), U(SIGMOID, 5),
                                         G(TANH, 6, 0) };
                snprintf(what, sizeof what, "chain 1 %s n %lld layout %d", wf_dtype_name(dt),
                         (long long)n, li);
                check_program(what, p1, 5, 0, in, 3, tol);
                /* leaky_relu (slope 0.1) of x - b, gelu_grad with y, exp, max with x */
                wf__fused_instr p2[] = { B(SUB, 0, 2), U(LEAKY_RELU, 3), G(GELU_ERF, 4, 1),
                                         U(EXP, 5), B(MAXIMUM, 6, 0) };
                snprintf(what, sizeof what, "chain 2 %s n %lld layout %d", wf_dtype_name(dt),
                         (long long)n, li);
                check_program(what, p2, 5, 0.1, in, 3, tol);
                ot_release(&x);
                ot_release(&y);
                ot_release(&b);
            }
}

Test(ops_cuda_fused, comparisons_where_and_integer_casts_give_the_cpus_bits)
{
    NEED_DEVICE();
    const ot_tol exact = { 0, 0 };
    for (int si = 0; si < 4; si++) {
        int64_t n = sizes[si];
        ot_tensor x = ot_random(WF_F32, WF_SHAPE(n), OT_CONTIG, 800 + si, -50, 50);
        ot_tensor y = ot_random(WF_F32, WF_SHAPE(n), OT_CONTIG, 810 + si, -50, 50);
        const wf_tensor *in[2] = { x.t, y.t };
        char what[64];
        /* where(x > y, x, -y) */
        wf__fused_instr p1[] = { B(GT, 0, 1), U(NEG, 1), W(2, 0, 3) };
        snprintf(what, sizeof what, "where n %lld", (long long)n);
        check_program(what, p1, 3, 0, in, 2, exact);
        /* f32 -> i32 (truncates), * itself, abs, -> f64; and (x < y) as f32 */
        wf__fused_instr p2[] = { C(0, WF_I32), B(MUL, 2, 2), U(ABS, 3), C(4, WF_F64) };
        snprintf(what, sizeof what, "int cast n %lld", (long long)n);
        check_program(what, p2, 4, 0, in, 2, exact);
        wf__fused_instr p3[] = { B(LT, 0, 1), C(2, WF_F32), B(ADD, 3, 0) };
        snprintf(what, sizeof what, "bool cast n %lld", (long long)n);
        check_program(what, p3, 3, 0, in, 2, exact);
        ot_release(&x);
        ot_release(&y);
    }
}

Test(ops_cuda_fused, integer_division_by_zero_fails_naming_the_element)
{
    NEED_DEVICE();
    int32_t av[6] = { 7, -7, 9, 1, 2, 3 }, bv[6] = { 2, 2, -1, 0, 5, 0 };
    wf_tensor *a = wf_tensor_from(WF_I32, WF_SHAPE(6), av);
    wf_tensor *b = wf_tensor_from(WF_I32, WF_SHAPE(6), bv);
    const wf_tensor *in[2] = { a, b };
    wf__fused_instr p[] = { B(DIV, 0, 1), U(NEG, 2) };
    type_program(p, 2, in, 2);
    wf_attrs at;
    cr_assert_eq(wf__fused_encode(&at, p, 2, 0), 0);
    wf_tensor *da = to_dev(a), *db = to_dev(b), *o = dev_out(WF_I32, WF_SHAPE(6));
    const wf_tensor *din[2] = { da, db };
    int rc = wf__fused_elementwise_cuda(&dev.ctx, &at, din, 2, o);
    cr_assert_eq(rc, WF_EINVAL, "got %s", wf_err_name(rc));
    cr_assert(strstr(wf_last_errmsg(), "division by zero at element 3"), "%s", wf_last_errmsg());
    /* Without the zero divisors: the CPU's truncating division. */
    bv[3] = 3;
    bv[5] = -3;
    wf_tensor *b2 = wf_tensor_from(WF_I32, WF_SHAPE(6), bv);
    const wf_tensor *in2[2] = { a, b2 };
    check_program("integer division", p, 2, 0, in2, 2, (ot_tol){ 0, 0 });
    wf_tensor_release(a);
    wf_tensor_release(b);
    wf_tensor_release(b2);
    wf_tensor_release(da);
    wf_tensor_release(db);
    wf_tensor_release(o);
}

/* ---- multi_update's CUDA slot ---------------------------------------------------------------- */

/* Runs an update def of one optimizer ('hpv', step 2) over 'm' variables (1: update_K, 3:
 * multi_update) on the CPU and on the device and compares every variable and state. */
static void check_update_def(const char *what, const double *hpv, int k, wf_dtype dt, int m)
{
    const int64_t n[3] = { 70000, 5, 33 };
    const int a = m * k;
    const wf_op_def *single[] = { NULL, &wf__op_update_1, &wf__op_update_2, &wf__op_update_3 };
    const wf_op_def *def = m == 1 ? single[k] : wf__update_multi_def(a);
    wf_node nd;
    memset(&nd, 0, sizeof nd);
    nd.op = def;
    nd.n_inputs = a + m + 2;
    wf_tensor *hin[16], *din[16], *out = NULL;
    ot_tensor keep[16];
    for (int j = 0; j < m; j++) {
        for (int s = 0; s < k; s++) { /* variable, then states (Adam's v >= 0) */
            ot_tensor t =
                ot_random(dt, WF_SHAPE(n[j]), OT_CONTIG, 900 + j * 8 + s, s == 2 ? 0 : -1, 1);
            keep[j * k + s] = t;
            hin[j * k + s] = t.t;
        }
        keep[a + j] = ot_random(dt, WF_SHAPE(n[j]), OT_CONTIG, 950 + j, -1, 1);
        hin[a + j] = keep[a + j].t;
    }
    hin[a + m] = wf_tensor_from(WF_I64, WF_SCALAR, (int64_t[]){ 2 });
    hin[a + m + 1] = wf_tensor_from(WF_F64, WF_SHAPE(WF__HP_COUNT), hpv);
    for (int i = 0; i < a + m + 2; i++)
        din[i] = to_dev(hin[i]);
    int rc = def->kernel[WF_KERNEL_CUDA](&dev.ctx, &nd, din, &out);
    cr_assert_eq(rc, 0, "%s: cuda: %s", what, wf_last_errmsg());
    rc = def->kernel[WF_KERNEL_CPU](&(wf_kernel_ctx){ 0 }, &nd, hin, &out);
    cr_assert_eq(rc, 0, "%s: cpu: %s", what, wf_last_errmsg());
    ot_tol tol = dt == WF_F32 ? (ot_tol){ 1e-6, 1e-5 } : (ot_tol){ 1e-14, 1e-12 };
    for (int i = 0; i < a; i++) {
        char w[96];
        snprintf(w, sizeof w, "%s %s: assigned input %d", what, wf_dtype_name(dt), i);
        expect_close(w, hin[i], din[i], tol);
    }
    for (int i = 0; i < a + m + 2; i++)
        wf_tensor_release(din[i]);
    for (int i = 0; i < a + m; i++)
        ot_release(&keep[i]);
    wf_tensor_release(hin[a + m]);
    wf_tensor_release(hin[a + m + 1]);
}

static void check_multi(const char *what, const double *hpv, int k, wf_dtype dt)
{
    check_update_def(what, hpv, k, dt, 3);
    check_update_def(what, hpv, k, dt, 1);
}

Test(ops_cuda_fused, multi_update_on_the_device_matches_the_cpu_kernel)
{
    NEED_DEVICE();
    const wf_dtype dts[] = { WF_F32, WF_F64 };
    for (int di = 0; di < 2; di++) {
        double hp[WF__HP_COUNT] = { [WF__HP_KIND] = WF_OPT_SGD,
                                    [WF__HP_LR] = 0.1,
                                    [WF__HP_MOMENTUM] = 0.9,
                                    [WF__HP_WD] = 0.01 };
        check_multi("sgd momentum", hp, 2, dts[di]);
        hp[WF__HP_NESTEROV] = 1;
        check_multi("sgd nesterov", hp, 2, dts[di]);
        double adam[WF__HP_COUNT] = {
            [WF__HP_KIND] = WF_OPT_ADAM, [WF__HP_LR] = 1e-3,  [WF__HP_BETA1] = 0.9,
            [WF__HP_BETA2] = 0.999,      [WF__HP_EPS] = 1e-8, [WF__HP_WD] = 0.01,
            [WF__HP_WARMUP] = 4
        }; /* the schedule: step 2 of 4 */
        check_multi("adam", adam, 3, dts[di]);
        adam[WF__HP_KIND] = WF_OPT_ADAMW;
        adam[WF__HP_WD] = 0.1;
        check_multi("adamw", adam, 3, dts[di]);
    }
}

/* The step counter's increment on the device, i64 (past 2^32) and i32, three times each. */
Test(ops_cuda_fused, increment_on_the_device_adds_one)
{
    NEED_DEVICE();
    wf_node nd;
    memset(&nd, 0, sizeof nd);
    nd.op = &wf__op_increment;
    nd.n_inputs = 1;
    int64_t v64 = ((int64_t)1 << 40) + 5;
    int32_t v32 = 1000000;
    wf_tensor *h[2] = { wf_tensor_from(WF_I64, WF_SCALAR, &v64),
                        wf_tensor_from(WF_I32, WF_SCALAR, &v32) };
    for (int i = 0; i < 2; i++) {
        wf_tensor *d = to_dev(h[i]), *out = NULL;
        for (int rep = 0; rep < 3; rep++)
            cr_assert_eq(wf__op_increment.kernel[WF_KERNEL_CUDA](&dev.ctx, &nd, &d, &out), 0, "%s",
                         wf_last_errmsg());
        wf_tensor *back = to_host(d);
        long long got = i ? ((const int32_t *)back->data)[0] : ((const int64_t *)back->data)[0];
        long long want = i ? 1000003 : ((long long)1 << 40) + 8;
        cr_assert_eq(got, want, "%s counter: %lld, expected %lld", i ? "i32" : "i64", got, want);
        wf_tensor_release(back);
        wf_tensor_release(d);
        wf_tensor_release(h[i]);
    }
}

Test(ops_cuda_fused, multi_update_of_rmsprop_has_no_cuda_kernel)
{
    NEED_DEVICE();
    const wf_op_def *def = wf__update_multi_def(2);
    float wv[2] = { 1, 2 }, gv[2] = { 3, 4 }, sv[2] = { 0, 0 };
    wf_tensor *h[5] = { wf_tensor_from(WF_F32, WF_SHAPE(2), wv),
                        wf_tensor_from(WF_F32, WF_SHAPE(2), sv),
                        wf_tensor_from(WF_F32, WF_SHAPE(2), gv),
                        wf_tensor_from(WF_I64, WF_SCALAR, (int64_t[]){ 0 }), NULL };
    double hpv[WF__HP_COUNT] = {
        [WF__HP_KIND] = WF_OPT_RMSPROP, [WF__HP_LR] = 0.01, [WF__HP_RHO] = 0.99, [WF__HP_EPS] = 1e-8
    };
    h[4] = wf_tensor_from(WF_F64, WF_SHAPE(WF__HP_COUNT), hpv);
    wf_tensor *d[5], *out = NULL;
    for (int i = 0; i < 5; i++)
        d[i] = to_dev(h[i]);
    wf_node nd;
    memset(&nd, 0, sizeof nd);
    nd.op = def;
    nd.n_inputs = 5;
    int rc = def->kernel[WF_KERNEL_CUDA](&dev.ctx, &nd, d, &out);
    cr_assert_eq(rc, WF_ENODEV, "got %s", wf_err_name(rc));
    cr_assert(strstr(wf_last_errmsg(), "RMSProp"), "%s", wf_last_errmsg());
    for (int i = 0; i < 5; i++) {
        wf_tensor_release(d[i]);
        wf_tensor_release(h[i]);
    }
}

/* ---- TF32 marks ----------------------------------------------------------------------------- */

Test(ops_cuda_fused, a_tf32_marked_matmul_node_stays_within_tf32_tolerance)
{
    NEED_DEVICE();
    ot_tensor a = ot_random(WF_F32, WF_SHAPE(64, 96), OT_CONTIG, 1234, -1, 1);
    ot_tensor b = ot_random(WF_F32, WF_SHAPE(96, 48), OT_CONTIG, 1235, -1, 1);
    wf_tensor *want = ot_out(WF_F32, WF_SHAPE(64, 48));
    cr_assert_eq(wf__matmul_cpu(&serial, false, false, a.t, b.t, want), 0, "%s", wf_last_errmsg());
    wf_tensor *din[2] = { to_dev(a.t), to_dev(b.t) };
    for (int mark = 0; mark < 2; mark++) {
        wf_attrs at;
        memset(&at, 0, sizeof at);
        at.dtype = mark ? WF__MATMUL_TF32 : WF_DTYPE_INVALID;
        wf_node nd;
        memset(&nd, 0, sizeof nd);
        nd.op = &wf_op_matmul;
        nd.n_inputs = 2;
        nd.attrs = &at;
        wf_tensor *got = dev_out(WF_F32, WF_SHAPE(64, 48));
        int rc = wf_op_matmul.kernel[WF_KERNEL_CUDA](&dev.ctx, &nd, din, &got);
        cr_assert_eq(rc, 0, "%s", wf_last_errmsg());
        expect_close(mark ? "tf32" : "f32", want, got,
                     mark ? (ot_tol){ 3e-2, 1e-2 } : (ot_tol){ 1e-4, 1e-4 });
        wf_tensor_release(got);
    }
    wf_tensor_release(din[0]);
    wf_tensor_release(din[1]);
    wf_tensor_release(want);
    ot_release(&a);
    ot_release(&b);
}

#endif /* WF_HAVE_CUDA */
