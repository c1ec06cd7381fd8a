/* tests/ops/test_internal_epilogue.c: the GEMM epilogue kernel of ops/
 * (wf__matmul_epilogue_cpu) and the matmul_epilogue op from the inside: bitwise equal to
 * wf__matmul_cpu, then wf__add_cpu, then the activation's kernel, for every activation,
 * bias shapes [N], [1, N] and [1], bias first or second, strided and negatively strided
 * biases, transposed and batched operands, shapes across the tile size, f32, f64, bf16 and
 * f16, with no runtime, 1 and 2 workers; against a naive f64 reference (relu(x w + b), with
 * |got - want| <= 1e-4 sqrt(K) (1 + |want|) for f32, inputs in [-1, 1]); bad biases, dtypes
 * and activations refused with messages naming the shapes; the node's inference and the
 * attribute encoding. */
#include "../../core/graph.h"
#include "../../ops/kernels.h"
#include "../../ops/table.h"
#include "ops_test.h"

static ot_rts rts;

static void setup(void)
{
    rts = ot_rts_create();
}

static void teardown(void)
{
    ot_rts_destroy(&rts);
    wf_test_fini();
}

TestSuite(ops_epilogue, .init = setup, .fini = teardown, .timeout = WF_TEST_TIMEOUT(120));

static const int acts[] = { -1,
                            WF_UNARY_RELU,
                            WF_UNARY_LEAKY_RELU,
                            WF_UNARY_GELU_ERF,
                            WF_UNARY_GELU_TANH,
                            WF_UNARY_TANH,
                            WF_UNARY_SIGMOID,
                            WF_UNARY_SILU };

/* The separate kernels, as three nodes run them, into a new tensor. */
static wf_tensor *separate(const wf_kctx *k, bool ta, bool tb, const wf_epilogue *ep,
                           const wf_tensor *a, const wf_tensor *b, const wf_tensor *bias,
                           wf_shape os)
{
    wf_dtype dt = wf_tensor_dtype(a);
    wf_tensor *p = ot_out(dt, os), *q = ot_out(dt, os), *r = ot_out(dt, os);
    cr_assert_eq(wf__matmul_cpu(k, ta, tb, a, b, p), 0, "%s", wf_last_errmsg());
    const wf_tensor *cur = p;
    if (bias) {
        int rc = ep->bias_first ? wf__add_cpu(k, bias, p, q) : wf__add_cpu(k, p, bias, q);
        cr_assert_eq(rc, 0, "%s", wf_last_errmsg());
        cur = q;
    }
    if (ep->act >= 0) {
        cr_assert_eq(wf__unary_cpu(k, (wf_unary_op)ep->act, ep->alpha, cur, r), 0, "%s",
                     wf_last_errmsg());
        cur = r;
    }
    wf_tensor *res = wf_tensor_retain((wf_tensor *)cur);
    wf_tensor_release(p);
    wf_tensor_release(q);
    wf_tensor_release(r);
    return res;
}

/* One case, every activation: fused equals separate bit for bit, on each context. */
static void check_bits(wf_dtype dt, bool ta, bool tb, wf_shape as, wf_shape bs, int bias_kind,
                       ot_layout bias_layout, bool bias_first, const char *what)
{
    ot_tensor a = ot_random(dt, as, OT_CONTIG, 11 + (uint64_t)as.dims[0], -1, 1);
    ot_tensor b = ot_random(dt, bs, OT_CONTIG, 12 + (uint64_t)bs.dims[0], -1, 1);
    int64_t M = as.dims[as.rank - (ta ? 1 : 2)], N = bs.dims[bs.rank - (tb ? 2 : 1)];
    wf_shape os = as;
    os.dims[os.rank - 2] = M;
    os.dims[os.rank - 1] = N;
    wf_shape bsh = bias_kind == 1 ? WF_SHAPE(N) : bias_kind == 2 ? WF_SHAPE(1, N) : WF_SHAPE(1);
    ot_tensor bias = { NULL, NULL };
    if (bias_kind)
        bias = ot_random(dt, bsh, bias_layout, 13, -1, 1);
    const wf_kctx ctxs[3] = { { .rt = NULL }, { .rt = rts.one }, { .rt = rts.two } };
    for (size_t i = 0; i < sizeof acts / sizeof acts[0]; i++) {
        wf_epilogue ep = { .act = acts[i], .alpha = 0.2, .bias_first = bias_first };
        if (ep.act < 0 && !bias_kind)
            continue;
        wf_tensor *want = separate(&ctxs[0], ta, tb, &ep, a.t, b.t, bias.t, os);
        for (int c = 0; c < 3; c++) {
            wf_tensor *got = ot_out(dt, os);
            int rc = wf__matmul_epilogue_cpu(&ctxs[c], ta, tb, &ep, a.t, b.t, bias.t, got);
            cr_assert_eq(rc, 0, "%s act %d: %s", what, ep.act, wf_last_errmsg());
            char desc[160];
            snprintf(desc, sizeof desc, "%s %s act %d ctx %d", what, wf_dtype_name(dt), ep.act, c);
            ot_assert_same_bits(got, want, desc);
            wf_tensor_release(got);
        }
        wf_tensor_release(want);
    }
    ot_release(&a);
    ot_release(&b);
    ot_release(&bias);
}

Test(ops_epilogue, equals_matmul_add_activation_bit_for_bit_for_every_activation)
{
    const wf_dtype dts[4] = { WF_F32, WF_F64, WF_BF16, WF_F16 };
    for (int d = 0; d < 4; d++)
        check_bits(dts[d], false, false, WF_SHAPE(19, 7), WF_SHAPE(7, 13), 1, OT_CONTIG, false,
                   "small");
}

Test(ops_epilogue, bias_shapes_order_and_strides_give_the_same_bits)
{
    for (int kind = 1; kind <= 3; kind++)
        for (int first = 0; first <= 1; first++)
            check_bits(WF_F32, false, false, WF_SHAPE(9, 5), WF_SHAPE(5, 11), kind, OT_CONTIG,
                       first, "bias");
    /* a bias read backwards (negative stride) and a bias of one repeated value (stride 0) */
    check_bits(WF_F32, false, false, WF_SHAPE(9, 5), WF_SHAPE(5, 11), 1, (ot_layout){ NULL, 1u, 0 },
               false, "flipped bias");
    check_bits(WF_F64, false, false, WF_SHAPE(9, 5), WF_SHAPE(5, 11), 1, (ot_layout){ NULL, 0, 1u },
               true, "broadcast bias");
    check_bits(WF_F32, false, false, WF_SHAPE(9, 5), WF_SHAPE(5, 11), 0, OT_CONTIG, false,
               "no bias");
}

Test(ops_epilogue, transposed_batched_and_multi_tile_products_give_the_same_bits)
{
    for (int t = 0; t < 4; t++) {
        bool ta = t & 1, tb = t >> 1;
        check_bits(WF_F32, ta, tb, ta ? WF_SHAPE(40, 300) : WF_SHAPE(300, 40),
                   tb ? WF_SHAPE(270, 40) : WF_SHAPE(40, 270), 1, OT_CONTIG, t == 3, "multi-tile");
    }
    check_bits(WF_F64, false, true, WF_SHAPE(2, 260, 16), WF_SHAPE(2, 300, 16), 2, OT_CONTIG, false,
               "batched multi-tile");
    check_bits(WF_F32, false, false, WF_SHAPE(3, 7, 0), WF_SHAPE(3, 0, 6), 1, OT_CONTIG, false,
               "K = 0");
}

Test(ops_epilogue, matches_an_f64_reference)
{
    const int64_t M = 70, K = 300, N = 290;
    ot_tensor a = ot_random(WF_F32, WF_SHAPE(M, K), OT_CONTIG, 21, -1, 1);
    ot_tensor b = ot_random(WF_F32, WF_SHAPE(K, N), OT_CONTIG, 22, -1, 1);
    ot_tensor bias = ot_random(WF_F32, WF_SHAPE(N), OT_CONTIG, 23, -1, 1);
    wf_tensor *out = ot_out(WF_F32, WF_SHAPE(M, N));
    wf_kctx k = { .rt = rts.two };
    wf_epilogue ep = { .act = WF_UNARY_RELU };
    cr_assert_eq(wf__matmul_epilogue_cpu(&k, false, false, &ep, a.t, b.t, bias.t, out), 0, "%s",
                 wf_last_errmsg());
    const float *av = wf_tensor_data_f32(a.t), *bv = wf_tensor_data_f32(b.t),
                *cv = wf_tensor_data_f32(bias.t), *ov = wf_tensor_data_f32(out);
    double tol = 1e-4 * sqrt((double)K);
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double acc = cv[j];
            for (int64_t q = 0; q < K; q++)
                acc += (double)av[i * K + q] * bv[q * N + j];
            double want = acc < 0 ? 0 : acc;
            cr_assert_leq(fabs(ov[i * N + j] - want), tol * (1 + fabs(want)),
                          "[%lld, %lld]: %g, reference %g", (long long)i, (long long)j,
                          ov[i * N + j], want);
        }
    wf_tensor_release(out);
    ot_release(&a);
    ot_release(&b);
    ot_release(&bias);
}

Test(ops_epilogue, bad_bias_dtype_activation_and_epilogue_are_refused_with_messages)
{
    ot_tensor a = ot_random(WF_F32, WF_SHAPE(4, 3), OT_CONTIG, 31, -1, 1);
    ot_tensor b = ot_random(WF_F32, WF_SHAPE(3, 5), OT_CONTIG, 32, -1, 1);
    wf_tensor *out = ot_out(WF_F32, WF_SHAPE(4, 5));
    wf_epilogue ep = { .act = WF_UNARY_RELU };
    const wf_kctx k = { .rt = NULL };
    /* a column, a wrong length, a bias of higher rank */
    const wf_shape bad[3] = { WF_SHAPE(4, 1), WF_SHAPE(6), WF_SHAPE(1, 1, 5) };
    for (int i = 0; i < 3; i++) {
        ot_tensor bias = ot_random(WF_F32, bad[i], OT_CONTIG, 33, -1, 1);
        int rc = wf__matmul_epilogue_cpu(&k, false, false, &ep, a.t, b.t, bias.t, out);
        cr_assert_eq(rc, WF_ESHAPE, "bias %d: %s", i, wf_err_name(rc));
        ot_assert_names(wf_last_errmsg(), bad[i], WF_SHAPE(4, 5));
        cr_assert(strstr(wf_last_errmsg(), "matmul_epilogue") != NULL, "%s", wf_last_errmsg());
        ot_release(&bias);
    }
    ot_tensor b64 = ot_random(WF_F64, WF_SHAPE(5), OT_CONTIG, 34, -1, 1);
    cr_assert_eq(wf__matmul_epilogue_cpu(&k, false, false, &ep, a.t, b.t, b64.t, out), WF_EDTYPE);
    ot_release(&b64);
    wf_epilogue bad_act = { .act = WF_UNARY_EXP };
    cr_assert_eq(wf__matmul_epilogue_cpu(&k, false, false, &bad_act, a.t, b.t, NULL, out),
                 WF_EINVAL);
    cr_assert(strstr(wf_last_errmsg(), "activation") != NULL, "%s", wf_last_errmsg());
    cr_assert_eq(wf__matmul_epilogue_cpu(&k, false, false, NULL, a.t, b.t, NULL, out), WF_EINVAL);
    /* the product's own checks keep the op's name */
    ot_tensor b2 = ot_random(WF_F32, WF_SHAPE(4, 5), OT_CONTIG, 35, -1, 1);
    cr_assert_eq(wf__matmul_epilogue_cpu(&k, false, false, &ep, a.t, b2.t, NULL, out), WF_ESHAPE);
    cr_assert(strstr(wf_last_errmsg(), "matmul_epilogue: ") != NULL, "%s", wf_last_errmsg());
    ot_release(&b2);
    wf_tensor_release(out);
    ot_release(&a);
    ot_release(&b);
}

Test(ops_epilogue, the_node_infers_the_product_and_checks_its_bias_and_attributes)
{
    wf_runtime *rt = rts.two;
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(-1, 3));
    wf_node *w = wf_placeholder(g, "w", WF_F32, WF_SHAPE(5, 3));
    wf_node *bias = wf_placeholder(g, "bias", WF_F32, WF_SHAPE(1, 5));
    wf_attrs at;
    memset(&at, 0, sizeof at);
    at.transpose_b = true;
    at.axis = WF_UNARY_LEAKY_RELU + 1;
    at.alpha = 0.25;
    at.groups = 1;
    wf_node *in[3] = { x, w, bias };
    wf_node *n = wf__node_add(g, &wf_op_matmul_epilogue, in, 3, &at);
    cr_assert_not_null(n, "%s", wf_graph_errmsg(g));
    cr_assert(wf_shape_equal(n->shape, WF_SHAPE(-1, 5)));
    wf_epilogue ep = wf__matmul_epilogue_of(n);
    cr_assert_eq(ep.act, WF_UNARY_LEAKY_RELU);
    cr_assert_eq(ep.alpha, 0.25);
    cr_assert(ep.bias_first);
    wf_node *w2 = wf_placeholder(g, "w2", WF_F32, WF_SHAPE(3, 5));
    wf_node *plain_in[2] = { x, w2 };
    wf_node *plain = wf__node_add(g, &wf_op_matmul_epilogue, plain_in, 2, NULL);
    cr_assert_not_null(plain, "%s", wf_graph_errmsg(g));
    cr_assert_eq(wf__matmul_epilogue_of(plain).act, -1, "zero attributes: no activation");
    wf_node *col = wf_placeholder(g, "col", WF_F32, WF_SHAPE(4, 1));
    wf_node *bad[3] = { x, w, col };
    cr_assert_null(wf__node_add(g, &wf_op_matmul_epilogue, bad, 3, &at));
    cr_assert(strstr(wf_graph_errmsg(g), "[4, 1]") != NULL, "%s", wf_graph_errmsg(g));
    wf_graph_destroy(g);
    g = wf_graph_create(rt, WF_STATIC);
    x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(2, 3));
    w = wf_placeholder(g, "w", WF_F32, WF_SHAPE(3, 5));
    at.transpose_b = false;
    at.axis = WF_UNARY_EXP + 1;
    wf_node *in2[2] = { x, w };
    cr_assert_null(wf__node_add(g, &wf_op_matmul_epilogue, in2, 2, &at));
    cr_assert(strstr(wf_graph_errmsg(g), "activation") != NULL, "%s", wf_graph_errmsg(g));
    wf_graph_destroy(g);
}
