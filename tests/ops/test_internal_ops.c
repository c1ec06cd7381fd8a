/* tests/ops/test_internal_ops.c: the op defs of ops/ from the inside: the table (names,
 * arity, inference, a CPU kernel and a cost on every entry, no gradient yet, flags), lookup by
 * name, every public constructor landing on a def of the table, eager values bitwise equal to
 * a direct call of the CPU kernel (also on strided inputs), canonical attributes (equal
 * reductions share one bag), re-inference with a fed batch size, and costs.
 * Links libweft.a (the op defs and kernels are hidden in libweft.so). */
#include "../../core/graph.h"
#include "../../core/op.h"
#include "../../core/tensor.h"
#include "../../ops/kernels.h"
#include "../../ops/table.h"
#include "ops_test.h"

static wf_runtime *rt;

static void setup(void)
{
    rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 2, .flags = WF_RT_NO_PIN });
}

static void teardown(void)
{
    wf_runtime_destroy(rt);
    rt = NULL;
    wf_test_fini();
}

TestSuite(ops_internal_ops, .init = setup, .fini = teardown, .timeout = WF_TEST_TIMEOUT(60));

static bool in_table(const wf_op_def *op)
{
    for (size_t i = 0; i < wf__ops_table_len; i++)
        if (wf__ops_table[i] == op)
            return true;
    return false;
}

#ifdef WF_HAVE_CUDA
/* Backward helpers without a CUDA twin (ops/table.h says so of each): a NULL slot keeps
 * their nodes on the host. */
static bool host_only(const wf_op_def *op)
{
    return op == &wf_op_prod_grad || op == &wf_op_sum_like;
}
#endif

Test(ops_internal_ops, table_is_valid_and_every_entry_has_a_cpu_kernel_and_a_cost)
{
    cr_assert_eq(wf__op_check_table(wf__ops_table, wf__ops_table_len), 0, "%s", wf_last_errmsg());
    cr_assert_geq(wf__ops_table_len, 53); /* the next test checks that it is complete */
    for (size_t i = 0; i < wf__ops_table_len; i++) {
        const wf_op_def *op = wf__ops_table[i];
        cr_assert_not_null(op->kernel[WF_KERNEL_CPU], "%s has no CPU kernel", op->name);
#ifdef WF_HAVE_CUDA /* every op has a CUDA twin (ops/cuda_kernels.h) but the host-only helpers */
        if (!host_only(op))
            cr_assert_not_null(op->kernel[WF_KERNEL_CUDA], "%s has no CUDA kernel", op->name);
        else
            cr_assert_null(op->kernel[WF_KERNEL_CUDA], "%s is host-only", op->name);
#else
        cr_assert_null(op->kernel[WF_KERNEL_CUDA], "%s: built without CUDA", op->name);
#endif
        cr_assert_not_null(op->cost, "%s has no cost", op->name);
        cr_assert_null(op->grad, "%s: gradients are grad/'s", op->name);
        /* dropout alone is stateful: its mask changes from run to run (weft/nn.h) */
        uint32_t banned =
            WF_OP_SOURCE | WF_OP_DYNAMIC_SHAPE | (op == &wf_op_dropout ? 0 : WF_OP_STATEFUL);
        cr_assert_eq(op->flags & banned, 0, "%s", op->name);
        cr_assert_eq(op->n_assign, 0, "%s: ops/ has no update ops", op->name);
        cr_assert_eq(wf__ops_find(op->name), op, "%s found by name", op->name);
    }
    cr_assert_eq(wf__ops_find("placeholder"), &wf_op_placeholder);
    cr_assert_null(wf__ops_find("no_such_op"));
    cr_assert_null(wf__ops_find(NULL));
    cr_assert(wf_op_add.flags & WF_OP_ELEMENTWISE);
    cr_assert(wf_op_where.flags & WF_OP_ELEMENTWISE);
    cr_assert(wf_op_cast.flags & WF_OP_ELEMENTWISE);
    cr_assert(wf_op_gelu_tanh.flags & WF_OP_ELEMENTWISE);
    cr_assert(wf_op_lt.flags & WF_OP_NO_GRAD);
    cr_assert(wf_op_argmax.flags & WF_OP_NO_GRAD);
    cr_assert_eq(wf_op_matmul.flags & WF_OP_ELEMENTWISE, 0);
    cr_assert_eq(wf_op_sum.flags & WF_OP_ELEMENTWISE, 0);
    cr_assert_eq(wf_op_softmax.flags & WF_OP_ELEMENTWISE, 0);
}

Test(ops_internal_ops, every_constructor_makes_a_node_of_a_table_op_and_covers_the_table)
{
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(-1, 4));
    wf_node *w = wf_placeholder(g, "w", WF_F32, WF_SHAPE(4, 4));
    wf_node *y = wf_placeholder(g, "y", WF_I32, WF_SHAPE(-1));
    wf_node *c = wf_gt(g, x, w);
    const int ax[1] = { 1 };
    wf_node *parts[2] = { NULL, NULL };
    cr_assert_eq(wf_split(g, w, 0, 2, parts), 0, "%s", wf_graph_errmsg(g));
    wf_node *pair[2] = { x, x };
    wf_node *x4 = wf_placeholder(g, "x4", WF_F32, WF_SHAPE(2, 8));
    wf_node *img = wf_placeholder(g, "img", WF_F32, WF_SHAPE(-1, 2, 6, 6));
    wf_node *k33 = wf_placeholder(g, "k33", WF_F32, WF_SHAPE(3, 2, 3, 3));
    const wf_pool2d_opts pool = { { 2, 2 }, { 0, 0 }, { 0, 0, 0, 0 }, false };
    wf_node *made[] = {
        wf_neg(g, x),
        wf_abs(g, x),
        wf_exp(g, x),
        wf_log(g, x),
        wf_sqrt(g, x),
        wf_rsqrt(g, x),
        wf_square(g, x),
        wf_tanh(g, x),
        wf_sigmoid(g, x),
        wf_relu(g, x),
        wf_leaky_relu(g, x, 0.1),
        wf_gelu(g, x, false),
        wf_gelu(g, x, true),
        wf_silu(g, x),
        wf_sign(g, x),
        wf_cast(g, x, WF_F64),
        wf_add(g, x, w),
        wf_sub(g, x, w),
        wf_mul(g, x, w),
        wf_div(g, x, w),
        wf_pow(g, x, w),
        wf_maximum(g, x, w),
        wf_minimum(g, x, w),
        wf_eq(g, x, w),
        wf_ne(g, x, w),
        wf_lt(g, x, w),
        wf_le(g, x, w),
        c,
        wf_ge(g, x, w),
        wf_where(g, c, x, w),
        wf_reduce_sum(g, x, ax, 1, false),
        wf_reduce_mean(g, x, ax, 1, false),
        wf_reduce_max(g, x, ax, 1, false),
        wf_reduce_min(g, x, ax, 1, false),
        wf_reduce_prod(g, x, ax, 1, false),
        wf_reduce_argmax(g, x, ax, 1, false),
        wf_reduce_logsumexp(g, x, ax, 1, false),
        wf_sum(g, x),
        wf_mean(g, x),
        wf_max(g, x),
        wf_min(g, x),
        wf_prod(g, x),
        wf_logsumexp(g, x),
        wf_argmax(g, x, -1),
        wf_matmul(g, x, w),
        wf_matmul_ex(g, x, w, false, true),
        wf_softmax(g, x, -1),
        wf_log_softmax(g, x, 0),
        wf_softmax_cross_entropy(g, x, y),
        wf_reshape(g, x, WF_SHAPE(-1, 2, 2)),
        wf_expand_dims(g, x, 0),
        wf_squeeze(g, wf_expand_dims(g, x, 0), 0),
        wf_transpose(g, x, NULL, 0),
        wf_slice(g, x, NULL, NULL, NULL),
        parts[0],
        wf_concat(g, pair, 2, 1),
        wf_stack(g, pair, 2, 0),
        wf_pad(g, x, NULL, NULL, 0),
        wf_broadcast_to(g, w, WF_SHAPE(2, 4, 4)),
        wf_gather(g, w, y, 0),
        wf_one_hot(g, y, 3, WF_F32),
        wf__unreduce(g, wf_sum(g, x), x, &(wf_attrs){ 0 }, false),
        wf__reshape_like(g, w, x4),
        wf__prod_grad(g, x, wf_prod(g, x), &(wf_attrs){ 0 }),
        wf__sum_like(g, wf_add(g, x, w), x),
        wf_conv2d(g, img, k33, NULL),
        wf_conv2d_backward_input(g, wf_conv2d(g, img, k33, NULL), k33, WF_SHAPE(-1, 2, 6, 6), NULL),
        wf_conv2d_backward_filter(g, img, wf_conv2d(g, img, k33, NULL), WF_SHAPE(3, 2, 3, 3), NULL),
        wf_max_pool2d(g, img, &pool),
        wf_avg_pool2d(g, img, &pool),
        wf_max_pool2d_backward(g, img, wf_max_pool2d(g, img, &pool), &pool),
        wf_avg_pool2d_backward(g, wf_avg_pool2d(g, img, &pool), WF_SHAPE(-1, 2, 6, 6), &pool),
        wf_layer_norm(g, x, NULL, NULL, -1, 1e-5),
        wf_layer_norm_backward_input(g, x, NULL, x, -1, 1e-5),
        wf_dropout(g, x, 0.5, 1),
        wf_activation_grad(g, WF_ACT_RELU, x, x, 0),
        wf_activation_grad(g, WF_ACT_LEAKY_RELU, x, x, 0.1),
        wf_activation_grad(g, WF_ACT_GELU, x, x, 0),
        wf_activation_grad(g, WF_ACT_GELU_TANH, x, x, 0),
        wf_activation_grad(g, WF_ACT_SILU, x, x, 0),
        wf_activation_grad(g, WF_ACT_SIGMOID, x, x, 0),
        wf_activation_grad(g, WF_ACT_TANH, x, x, 0),
        wf_scatter_add(g, x, y, 0, 5),
        wf_slice_backward(g, wf_slice(g, w, NULL, NULL, NULL), WF_SHAPE(4, 4), NULL, NULL, NULL),
    };
    cr_assert_eq(wf_graph_status(g), 0, "%s", wf_graph_errmsg(g));
    bool seen[128] = { false };
    cr_assert_leq(wf__ops_table_len, 128);
    for (size_t i = 0; i < sizeof made / sizeof made[0]; i++) {
        cr_assert_not_null(made[i]);
        cr_assert(in_table(made[i]->op), "%s is not in the table", made[i]->op->name);
        for (size_t k = 0; k < wf__ops_table_len; k++)
            if (wf__ops_table[k] == made[i]->op)
                seen[k] = true;
    }
    for (size_t k = 0; k < wf__ops_table_len; k++)
        cr_assert(seen[k], "no constructor makes '%s'", wf__ops_table[k]->name);
    wf_graph_destroy(g);
}

/* ---- Eager values against direct kernel calls -------------------------------------------- */

/* Asserts that eager node 'n' holds the same bytes as 'direct'. */
static void same_bits(wf_graph *g, const wf_node *n, wf_tensor *direct, const char *what)
{
    cr_assert_not_null(n, "%s: %s", what, wf_graph_errmsg(g));
    cr_assert_not_null(n->value, "%s", what);
    cr_assert_eq(n->value->dtype, direct->dtype, "%s", what);
    cr_assert(wf_shape_equal(n->value->shape, direct->shape), "%s", what);
    ot_assert_same_bits(n->value, direct, what);
    wf_tensor_release(direct);
}

/* A constant node holding 't' (a strided view is kept as it is). */
static wf_node *constant(wf_graph *g, wf_tensor *t)
{
    wf_node *c = wf_constant(g, t);
    cr_assert_not_null(c, "%s", wf_graph_errmsg(g));
    return c;
}

static const int perm_rev2[] = { 1, 0 };

Test(ops_internal_ops, eager_values_equal_the_cpu_kernels_bit_for_bit)
{
    const wf_kctx k = { .rt = rt };
    wf_graph *g = wf_graph_create(rt, WF_EAGER);
    /* x is a transposed view [300, 200] (strided), b a row [200]: big enough to split. */
    ot_tensor xt = ot_random(WF_F32, WF_SHAPE(300, 200), (ot_layout){ perm_rev2, 0, 0 }, 7, -2, 2);
    ot_tensor bt = ot_random(WF_F32, WF_SHAPE(200), OT_CONTIG, 8, 0.5, 2);
    ot_tensor lt = ot_random(WF_I32, WF_SHAPE(300), OT_CONTIG, 9, 0, 200);
    wf_node *x = constant(g, xt.t), *b = constant(g, bt.t), *lab = constant(g, lt.t);
    wf_shape s = WF_SHAPE(300, 200);

    static const struct {
        const wf_op_def *op;
        wf_unary_op u;
    } unaries[] = {
        { &wf_op_neg, WF_UNARY_NEG },
        { &wf_op_abs, WF_UNARY_ABS },
        { &wf_op_exp, WF_UNARY_EXP },
        { &wf_op_log, WF_UNARY_LOG },
        { &wf_op_sqrt, WF_UNARY_SQRT },
        { &wf_op_rsqrt, WF_UNARY_RSQRT },
        { &wf_op_square, WF_UNARY_SQUARE },
        { &wf_op_tanh, WF_UNARY_TANH },
        { &wf_op_sigmoid, WF_UNARY_SIGMOID },
        { &wf_op_relu, WF_UNARY_RELU },
        { &wf_op_leaky_relu, WF_UNARY_LEAKY_RELU },
        { &wf_op_gelu, WF_UNARY_GELU_ERF },
        { &wf_op_gelu_tanh, WF_UNARY_GELU_TANH },
        { &wf_op_silu, WF_UNARY_SILU },
        { &wf_op_sign, WF_UNARY_SIGN },
    };

    for (size_t i = 0; i < sizeof unaries / sizeof unaries[0]; i++) {
        wf_attrs a;
        memset(&a, 0, sizeof a);
        a.alpha = 0.125;
        wf_node *n = wf__node_add(g, unaries[i].op, &x, 1, &a);
        wf_tensor *d = wf__tensor_alloc(WF_F32, s);
        cr_assert_eq(wf__unary_cpu(&k, unaries[i].u, 0.125, xt.t, d), 0, "%s", wf_last_errmsg());
        same_bits(g, n, d, unaries[i].op->name);
    }

    static const struct {
        const wf_op_def *op;
        wf_binary_op bo;
    } binaries[] = {
        { &wf_op_add, WF_BINARY_ADD },         { &wf_op_sub, WF_BINARY_SUB },
        { &wf_op_mul, WF_BINARY_MUL },         { &wf_op_div, WF_BINARY_DIV },
        { &wf_op_pow, WF_BINARY_POW },         { &wf_op_maximum, WF_BINARY_MAXIMUM },
        { &wf_op_minimum, WF_BINARY_MINIMUM }, { &wf_op_eq, WF_BINARY_EQ },
        { &wf_op_ne, WF_BINARY_NE },           { &wf_op_lt, WF_BINARY_LT },
        { &wf_op_le, WF_BINARY_LE },           { &wf_op_gt, WF_BINARY_GT },
        { &wf_op_ge, WF_BINARY_GE },
    };

    wf_node *xb[2] = { x, b };
    for (size_t i = 0; i < sizeof binaries / sizeof binaries[0]; i++) {
        wf_node *n = wf__node_add(g, binaries[i].op, xb, 2, NULL);
        wf_tensor *d = wf__tensor_alloc(binaries[i].bo >= WF_BINARY_EQ ? WF_BOOL : WF_F32, s);
        cr_assert_eq(wf__binary_cpu(&k, binaries[i].bo, xt.t, bt.t, d), 0, "%s", wf_last_errmsg());
        same_bits(g, n, d, binaries[i].op->name);
    }

    wf_node *cond = wf_gt(g, x, b);
    wf_node *wh = wf_where(g, cond, x, b);
    wf_tensor *d = wf__tensor_alloc(WF_F32, s);
    cr_assert_eq(wf__where_cpu(&k, cond->value, xt.t, bt.t, d), 0);
    same_bits(g, wh, d, "where");

    wf_node *ca = wf_cast(g, x, WF_BF16);
    d = wf__tensor_alloc(WF_BF16, s);
    cr_assert_eq(wf__cast_cpu(&k, xt.t, d), 0);
    same_bits(g, ca, d, "cast");

    static const struct {
        const wf_op_def *op;
        wf__reduce_kind r;
    } reds[] = {
        { &wf_op_sum, WF__REDUCE_SUM },
        { &wf_op_mean, WF__REDUCE_MEAN },
        { &wf_op_max, WF__REDUCE_MAX },
        { &wf_op_min, WF__REDUCE_MIN },
        { &wf_op_prod, WF__REDUCE_PROD },
        { &wf_op_argmax, WF__REDUCE_ARGMAX },
        { &wf_op_logsumexp, WF__REDUCE_LOGSUMEXP },
    };

    for (size_t i = 0; i < sizeof reds / sizeof reds[0]; i++)
        for (int form = 0; form < 3; form++) {
            /* Form 0: axis 0 kept; 1: axis 1 dropped; 2: every axis. */
            int axes[1] = { form };
            wf_attrs a;
            memset(&a, 0, sizeof a);
            a.n_axes = form < 2 ? 1 : 0;
            a.axes[0] = form;
            a.keepdims = form == 0;
            wf_node *n = wf__node_add(g, reds[i].op, &x, 1, &a);
            wf_shape os;
            cr_assert_eq(
                wf__reduce_shape(s, form < 2 ? axes : NULL, form < 2 ? 1 : 0, form == 0, &os), 0);
            d = wf__tensor_alloc(reds[i].r == WF__REDUCE_ARGMAX ? WF_I64 : WF_F32, os);
            cr_assert_eq(wf__reduce_cpu(&k, reds[i].r, form < 2 ? axes : NULL, form < 2 ? 1 : 0,
                                        form == 0, xt.t, d),
                         0, "%s", wf_last_errmsg());
            same_bits(g, n, d, reds[i].op->name);
        }

    ot_tensor wt = ot_random(WF_F32, WF_SHAPE(150, 200), OT_CONTIG, 10, -1, 1);
    wf_node *w = constant(g, wt.t);
    wf_node *mm = wf_matmul_ex(g, x, w, false, true);
    d = wf__tensor_alloc(WF_F32, WF_SHAPE(300, 150));
    cr_assert_eq(wf__matmul_cpu(&k, false, true, xt.t, wt.t, d), 0, "%s", wf_last_errmsg());
    same_bits(g, mm, d, "matmul");

    wf_node *sm = wf_softmax(g, x, -2);
    d = wf__tensor_alloc(WF_F32, s);
    cr_assert_eq(wf__softmax_cpu(&k, 0, xt.t, d), 0);
    same_bits(g, sm, d, "softmax");
    wf_node *lsm = wf_log_softmax(g, x, 1);
    d = wf__tensor_alloc(WF_F32, s);
    cr_assert_eq(wf__log_softmax_cpu(&k, 1, xt.t, d), 0);
    same_bits(g, lsm, d, "log_softmax");
    wf_node *xe = wf_softmax_cross_entropy(g, x, lab);
    d = wf__tensor_alloc(WF_F32, WF_SHAPE(300));
    cr_assert_eq(wf__softmax_cross_entropy_cpu(&k, xt.t, lt.t, d), 0, "%s", wf_last_errmsg());
    same_bits(g, xe, d, "softmax_cross_entropy");

    wf_graph_destroy(g);
    ot_release(&xt);
    ot_release(&bt);
    ot_release(&lt);
    ot_release(&wt);
}

/* ---- Attributes, re-inference, costs ------------------------------------------------------ */

Test(ops_internal_ops, equal_reductions_get_equal_canonical_attributes)
{
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(2, 3, 4));
    const int a1[2] = { -1, 0 }, a2[2] = { 0, 2 }, all[3] = { 2, 0, 1 };
    wf_node *r1 = wf_reduce_sum(g, x, a1, 2, true), *r2 = wf_reduce_sum(g, x, a2, 2, true);
    cr_assert_eq(memcmp(r1->attrs, r2->attrs, sizeof *r1->attrs), 0);
    cr_assert_eq(r1->attrs->n_axes, 2);
    cr_assert_eq(r1->attrs->axes[0], 0);
    cr_assert_eq(r1->attrs->axes[1], 2);
    wf_node *r3 = wf_reduce_sum(g, x, all, 3, false), *r4 = wf_sum(g, x);
    cr_assert_eq(memcmp(r3->attrs, r4->attrs, sizeof *r3->attrs), 0, "every axis is n_axes 0");
    wf_node *s1 = wf_softmax(g, x, -1), *s2 = wf_softmax(g, x, 2);
    cr_assert_eq(s1->attrs->axis, 2);
    cr_assert_eq(memcmp(s1->attrs, s2->attrs, sizeof *s1->attrs), 0);
    wf_node *m1 = wf_matmul(g, x, x), *m2 = wf_matmul_ex(g, x, x, false, true);
    cr_assert_null(m1, "[2, 3, 4] x [2, 3, 4] does not fit");
    wf_graph_clear_error(g);
    m1 = wf_matmul_ex(g, x, x, false, true);
    cr_assert_not_null(m2);
    cr_assert_eq(memcmp(m1->attrs, m2->attrs, sizeof *m1->attrs), 0);
    wf_graph_destroy(g);
}

Test(ops_internal_ops, reinference_with_a_fed_batch_gives_concrete_shapes_or_names_the_clash)
{
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(-1, 784));
    wf_node *w = wf_variable(g, "w", WF_F32, WF_SHAPE(784, 10), wf_init_zeros());
    wf_node *y = wf_placeholder(g, "y", WF_I32, WF_SHAPE(-1));
    wf_node *mm = wf_matmul(g, x, w);
    wf_node *xe = wf_softmax_cross_entropy(g, mm, y);
    cr_assert_not_null(xe, "%s", wf_graph_errmsg(g));
    wf_dtype dts[2] = { WF_F32, WF_F32 }, dt;
    wf_shape shs[2] = { WF_SHAPE(32, 784), WF_SHAPE(784, 10) }, sh;
    cr_assert_eq(wf__op_infer(mm, dts, shs, &dt, &sh), 0, "%s", wf_last_errmsg());
    cr_assert(wf_shape_equal(sh, WF_SHAPE(32, 10)));
    wf_dtype xd[2] = { WF_F32, WF_I32 };
    wf_shape xs[2] = { WF_SHAPE(32, 10), WF_SHAPE(31) };
    cr_assert_eq(wf__op_infer(xe, xd, xs, &dt, &sh), WF_ESHAPE);
    cr_assert(strstr(wf_last_errmsg(), "[32, 10]") && strstr(wf_last_errmsg(), "[31]"), "%s",
              wf_last_errmsg());
    wf_graph_destroy(g);
}

Test(ops_internal_ops, costs_count_flops_and_bytes_with_unknown_dimensions_as_one)
{
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(-1, 784));
    wf_node *w = wf_placeholder(g, "w", WF_F32, WF_SHAPE(784, 10));
    wf_node *mm = wf_matmul(g, x, w);
    double flops, bytes;
    mm->op->cost(mm, &flops, &bytes);
    cr_assert_eq(flops, 2.0 * 10 * 784);
    cr_assert_eq(bytes, 4.0 * (784 + 784 * 10 + 10));
    wf_node *b = wf_placeholder(g, "b", WF_F64, WF_SHAPE(8, 16));
    wf_node *ad = wf_add(g, b, b);
    ad->op->cost(ad, &flops, &bytes);
    cr_assert_eq(flops, 128);
    cr_assert_eq(bytes, 3 * 128 * 8.0);
    wf_node *s = wf_sum(g, b);
    s->op->cost(s, &flops, &bytes);
    cr_assert_eq(flops, 128);
    cr_assert_eq(bytes, 129 * 8.0);
    wf_graph_destroy(g);
}
