/* tests/grad/test_gradcheck.c: every differentiable op's gradient against central finite
 * differences in f64 (tests/grad/gradcheck.h states the tolerance), on random inputs and
 * several shapes: elementwise math and activations, broadcasting binary ops, where,
 * reductions over axes with and without keepdims, matmul with every transpose flag and batch
 * broadcasting, softmax, log_softmax, cross-entropy, every shape op, gather, convolution,
 * pooling, layer norm, dropout; and compositions (fan-out summed, second derivatives). */
#include "gradcheck.h"

TestSuite(gradcheck, .init = gc_setup, .fini = gc_teardown, .timeout = WF_TEST_TIMEOUT(120));

/* ---- Unary ------------------------------------------------------------------------------ */

typedef wf_node *(*unary_fn)(wf_graph *, wf_node *);

static wf_node *apply_unary(wf_graph *g, wf_node *const *x, const void *ctx)
{
    return ((unary_fn)(uintptr_t)ctx)(g, x[0]);
}

#define UNARY_CASE(fn, lo, hi)                                                           \
    do {                                                                                 \
        gc_in in[] = { { WF_SHAPE(3, 5), lo, hi, false, 0, NULL } };                     \
        gradcheck(#fn, apply_unary, (const void *)(uintptr_t)(unary_fn)(fn), 1, in, 11); \
    } while (0)

static wf_node *leaky(wf_graph *g, wf_node *x)
{
    return (wf_leaky_relu)(g, x, 0.2);
}

static wf_node *gelu_erf(wf_graph *g, wf_node *x)
{
    return (wf_gelu)(g, x, false);
}

static wf_node *gelu_tanh(wf_graph *g, wf_node *x)
{
    return (wf_gelu)(g, x, true);
}

Test(gradcheck, unary_math)
{
    UNARY_CASE(wf_neg, -2, 2);
    UNARY_CASE(wf_abs, 0.1, 2); /* away from the kink */
    UNARY_CASE(wf_exp, -2, 2);
    UNARY_CASE(wf_log, 0.2, 3);
    UNARY_CASE(wf_sqrt, 0.2, 3);
    UNARY_CASE(wf_rsqrt, 0.2, 3);
    UNARY_CASE(wf_square, -2, 2);
}

Test(gradcheck, activations)
{
    UNARY_CASE(wf_tanh, -2, 2);
    UNARY_CASE(wf_sigmoid, -3, 3);
    UNARY_CASE(wf_relu, 0.05, 2);
    UNARY_CASE(wf_relu, -2, -0.05);
    UNARY_CASE(wf_silu, -3, 3);
    UNARY_CASE(leaky, -2, -0.05);
    UNARY_CASE(leaky, 0.05, 2);
    UNARY_CASE(gelu_erf, -3, 3);
    UNARY_CASE(gelu_tanh, -3, 3);
}

Test(gradcheck, abs_of_negative_values)
{
    UNARY_CASE(wf_abs, -2, -0.1);
}

/* ---- Binary with broadcasting ----------------------------------------------------------- */

typedef wf_node *(*binary_fn)(wf_graph *, wf_node *, wf_node *);

static wf_node *apply_binary(wf_graph *g, wf_node *const *x, const void *ctx)
{
    return ((binary_fn)(uintptr_t)ctx)(g, x[0], x[1]);
}

static void binary_cases(const char *what, binary_fn fn, double lo, double hi, bool distinct)
{
    static const wf_shape sa[] = {
        { 2, { 3, 4 } }, { 2, { 3, 4 } }, { 3, { 2, 1, 4 } }, { 0, { 0 } }
    };
    static const wf_shape sb[] = {
        { 2, { 3, 4 } }, { 1, { 4 } }, { 2, { 3, 1 } }, { 2, { 2, 3 } }
    };
    for (int k = 0; k < 4; k++) {
        gc_in in[] = { { sa[k], lo, hi, distinct, 0, NULL }, { sb[k], lo, hi, distinct, 0, NULL } };
        char name[64];
        snprintf(name, sizeof name, "%s case %d", what, k);
        gradcheck(name, apply_binary, (const void *)(uintptr_t)fn, 2, in, 100 + (uint64_t)k);
    }
}

Test(gradcheck, binary_broadcasting)
{
    binary_cases("add", (wf_add), -2, 2, false);
    binary_cases("sub", (wf_sub), -2, 2, false);
    binary_cases("mul", (wf_mul), -2, 2, false);
    binary_cases("div", (wf_div), 0.5, 2, false);
    binary_cases("pow", (wf_pow), 0.5, 2, false);
}

static wf_node *max_shifted(wf_graph *g, wf_node *a, wf_node *b) /* no ties: b moved off a's grid */
{
    return (wf_maximum)(g, a, (wf_add)(g, b, (wf_scalar)(g, WF_F64, 0.0007)));
}

static wf_node *min_shifted(wf_graph *g, wf_node *a, wf_node *b)
{
    return (wf_minimum)(g, a, (wf_add)(g, b, (wf_scalar)(g, WF_F64, 0.0007)));
}

Test(gradcheck, maximum_minimum)
{
    binary_cases("maximum", max_shifted, -2, 2, true);
    binary_cases("minimum", min_shifted, -2, 2, true);
}

static wf_node *where_gt(wf_graph *g, wf_node *const *x, const void *ctx)
{
    (void)ctx;
    return wf_where(g, wf_gt(g, x[0], wf_scalar(g, WF_F64, 0)), x[1], x[2]);
}

Test(gradcheck, where)
{
    gc_in in[] = { { WF_SHAPE(3, 4), -1, 1, false, 0, NULL },
                   { WF_SHAPE(4), -2, 2, false, 0, NULL },
                   { WF_SHAPE(3, 1), -2, 2, false, 0, NULL } };
    gradcheck("where", where_gt, NULL, 3, in, 5);
}

/* ---- Reductions ------------------------------------------------------------------------- */

typedef struct red_case {
    wf_node *(*fn)(wf_graph *, wf_node *, const int *, int, bool);
    int n_axes;
    int axes[3];
    bool keepdims;
} red_case;

static wf_node *apply_reduce(wf_graph *g, wf_node *const *x, const void *ctx)
{
    const red_case *c = ctx;
    return c->fn(g, x[0], c->axes, c->n_axes, c->keepdims);
}

static void reduce_cases(const char *what,
                         wf_node *(*fn)(wf_graph *, wf_node *, const int *, int, bool), double lo,
                         double hi, bool distinct)
{
    const red_case cs[] = { { fn, 0, { 0 }, false },
                            { fn, 1, { 1 }, false },
                            { fn, 1, { -1 }, true },
                            { fn, 2, { 0, 2 }, false },
                            { fn, 2, { 2, 0 }, true } };
    for (int k = 0; k < 5; k++) {
        gc_in in[] = { { WF_SHAPE(2, 3, 4), lo, hi, distinct, 0, NULL } };
        char name[64];
        snprintf(name, sizeof name, "%s case %d", what, k);
        gradcheck(name, apply_reduce, &cs[k], 1, in, 200 + (uint64_t)k);
    }
}

Test(gradcheck, reductions)
{
    reduce_cases("sum", (wf_reduce_sum), -2, 2, false);
    reduce_cases("mean", (wf_reduce_mean), -2, 2, false);
    reduce_cases("max", (wf_reduce_max), -2, 2, true);
    reduce_cases("min", (wf_reduce_min), -2, 2, true);
    reduce_cases("prod", (wf_reduce_prod), 0.5, 1.5, false);
    reduce_cases("logsumexp", (wf_reduce_logsumexp), -2, 2, false);
}

/* prod with zeros in x (issue 18: its gradient was dy y / x, NaN there): prod is linear in
 * each element, so the central differences are exact up to rounding at and around 0. */
Test(gradcheck, prod_with_zeros_every_axis)
{
    const red_case cs[] = { { (wf_reduce_prod), 0, { 0 }, false },
                            { (wf_reduce_prod), 1, { 1 }, false },
                            { (wf_reduce_prod), 1, { -1 }, true },
                            { (wf_reduce_prod), 2, { 0, 2 }, false },
                            { (wf_reduce_prod), 2, { 2, 0 }, true } };
    for (int z = 0; z < 3; z++) {
        double v[24];
        uint64_t st = 31 + (uint64_t)z;
        for (int i = 0; i < 24; i++)
            v[i] = 0.5 + (double)wf_test_rand_below(&st, 1001) / 1000.0;
        v[7] = 0; /* one zero */
        if (z >= 1)
            v[4] = 0; /* two in one range for every axis setting that reduces axis 2 */
        if (z == 2)
            v[19] = v[3] = 0;
        for (int k = 0; k < 5; k++) {
            gc_in in[] = { { WF_SHAPE(2, 3, 4), 0, 0, false, 0, v } };
            char name[64];
            snprintf(name, sizeof name, "prod with zeros %d case %d", z, k);
            gradcheck(name, apply_reduce, &cs[k], 1, in, 250 + (uint64_t)k);
        }
    }
}

/* ---- matmul ------------------------------------------------------------------------------ */

typedef struct mm_case {
    bool ta, tb;
} mm_case;

static wf_node *apply_matmul(wf_graph *g, wf_node *const *x, const void *ctx)
{
    const mm_case *c = ctx;
    return wf_matmul_ex(g, x[0], x[1], c->ta, c->tb);
}

Test(gradcheck, matmul_every_transpose_and_batch_broadcast)
{
    for (int t = 0; t < 4; t++) {
        mm_case c = { t & 1, t >> 1 };
        wf_shape a = c.ta ? WF_SHAPE(4, 3) : WF_SHAPE(3, 4),
                 b = c.tb ? WF_SHAPE(5, 4) : WF_SHAPE(4, 5);
        gc_in in[] = { { a, -1, 1, false, 0, NULL }, { b, -1, 1, false, 0, NULL } };
        gradcheck("matmul 2-D", apply_matmul, &c, 2, in, 300 + (uint64_t)t);
        /* batched: a [2, 1, 3, 4] with b [3, 4, 5]: batch dims broadcast to [2, 3] */
        a.rank = 4;
        memmove(a.dims + 2, a.dims, 2 * sizeof a.dims[0]);
        a.dims[0] = 2;
        a.dims[1] = 1;
        b.rank = 3;
        memmove(b.dims + 1, b.dims, 2 * sizeof b.dims[0]);
        b.dims[0] = 3;
        gc_in inb[] = { { a, -1, 1, false, 0, NULL }, { b, -1, 1, false, 0, NULL } };
        gradcheck("matmul batched", apply_matmul, &c, 2, inb, 310 + (uint64_t)t);
    }
}

/* ---- softmax and the loss ---------------------------------------------------------------- */

static wf_node *apply_softmax(wf_graph *g, wf_node *const *x, const void *ctx)
{
    return wf_softmax(g, x[0], *(const int *)ctx);
}

static wf_node *apply_log_softmax(wf_graph *g, wf_node *const *x, const void *ctx)
{
    return wf_log_softmax(g, x[0], *(const int *)ctx);
}

static wf_node *apply_xent(wf_graph *g, wf_node *const *x, const void *ctx)
{
    (void)ctx;
    return wf_softmax_cross_entropy(g, x[0], x[1]);
}

Test(gradcheck, softmax_log_softmax_cross_entropy)
{
    for (int axis = -1; axis <= 1; axis++) {
        gc_in in[] = { { WF_SHAPE(3, 4, 2), -2, 2, false, 0, NULL } };
        gradcheck("softmax", apply_softmax, &axis, 1, in, 400 + (uint64_t)(axis + 1));
        gradcheck("log_softmax", apply_log_softmax, &axis, 1, in, 410 + (uint64_t)(axis + 1));
    }
    static const double labels[] = { 0, 3, 1, 4, 2, 2 };
    gc_in in[] = { { WF_SHAPE(2, 3, 5), -3, 3, false, 0, NULL },
                   { WF_SHAPE(2, 3), 0, 0, false, WF_I32, labels } };
    gradcheck("softmax_cross_entropy", apply_xent, NULL, 2, in, 420);
}

/* ---- Shape ops --------------------------------------------------------------------------- */

static wf_node *shape_ops(wf_graph *g, wf_node *const *x, const void *ctx)
{
    int which = *(const int *)ctx;
    wf_node *v = x[0]; /* [2, 3, 4] */
    switch (which) {
    case 0:
        return wf_reshape(g, v, WF_SHAPE(4, -1));
    case 1: {
        static const int perm[] = { 2, 0, 1 };
        return wf_transpose(g, v, perm, 3);
    }
    case 2: {
        static const int64_t b[] = { 1, 0, 3 }, e[] = { 2, 3, -5 }, s[] = { 1, 2, -2 };
        return wf_slice(g, v, b, e, s);
    }
    case 3: {
        wf_node *parts[2];
        cr_assert_eq(wf_split(g, v, 2, 2, parts), 0);
        return wf_mul(g, parts[0], wf_exp(g, parts[1])); /* both parts used differently */
    }
    case 4: {
        wf_node *xs[3] = { v, wf_square(g, v), x[1] }; /* x[1] is [2, 3, 2] */
        return wf_concat(g, xs, 3, -1);
    }
    case 5: {
        wf_node *xs[2] = { v, wf_exp(g, v) };
        return wf_stack(g, xs, 2, 1);
    }
    case 6: {
        static const int64_t before[] = { 0, 2, 1 }, after[] = { 1, 0, 3 };
        return wf_pad(g, v, before, after, 0.5);
    }
    case 7:
        return wf_broadcast_to(g, x[1], WF_SHAPE(4, 2, 3, 2));
    case 8:
        return wf_squeeze(g, wf_expand_dims(g, v, 1), 1);
    case 9: { /* negative entries count from the end (issue 18: the gradient ignored that) */
        static const int perm[] = { -1, 0, -2 };
        return wf_transpose(g, v, perm, 3);
    }
    default:
        return NULL;
    }
}

Test(gradcheck, shape_ops)
{
    for (int k = 0; k <= 9; k++) {
        gc_in in[] = { { WF_SHAPE(2, 3, 4), -2, 2, false, 0, NULL },
                       { WF_SHAPE(2, 3, 2), -2, 2, false, 0, NULL } };
        char name[32];
        snprintf(name, sizeof name, "shape op %d", k);
        gradcheck(name, shape_ops, &k, 2, in, 500 + (uint64_t)k);
    }
}

/* ---- gather ------------------------------------------------------------------------------ */

static wf_node *apply_gather(wf_graph *g, wf_node *const *x, const void *ctx)
{
    return wf_gather(g, x[0], x[1], *(const int *)ctx);
}

Test(gradcheck, gather_with_repeated_indices)
{
    static const double idx[] = { 2, 0, 2, 1, 2, 0 }; /* [2, 3], repeats accumulate */
    for (int axis = 0; axis < 2; axis++) {
        gc_in in[] = { { WF_SHAPE(3, 3, 2), -2, 2, false, 0, NULL },
                       { WF_SHAPE(2, 3), 0, 0, false, WF_I64, idx } };
        gradcheck("gather", apply_gather, &axis, 2, in, 600 + (uint64_t)axis);
    }
}

/* ---- Convolution and pooling -------------------------------------------------------------- */

static wf_node *apply_conv(wf_graph *g, wf_node *const *x, const void *ctx)
{
    return wf_conv2d(g, x[0], x[1], ctx);
}

Test(gradcheck, conv2d)
{
    const wf_conv2d_opts os[] = {
        { { 1, 1 }, { 0, 0, 0, 0 }, { 1, 1 }, 1 },
        { { 2, 1 }, { 1, 0, 2, 1 }, { 1, 1 }, 1 },
        { { 1, 1 }, { 1, 1, 1, 1 }, { 2, 2 }, 2 },
    };
    for (int k = 0; k < 3; k++) {
        gc_in in[] = { { WF_SHAPE(2, 4, 6, 5), -1, 1, false, 0, NULL },
                       { k == 2 ? WF_SHAPE(4, 2, 2, 3) : WF_SHAPE(3, 4, 3, 2), -1, 1, false, 0,
                         NULL } };
        gradcheck("conv2d", apply_conv, &os[k], 2, in, 700 + (uint64_t)k);
    }
}

static wf_node *apply_pool(wf_graph *g, wf_node *const *x, const void *ctx)
{
    const wf_pool2d_opts *o = ctx;
    return o->count_include_pad || o->window[0] == 2 ? wf_avg_pool2d(g, x[0], o)
                                                     : wf_max_pool2d(g, x[0], o);
}

Test(gradcheck, pools)
{
    const wf_pool2d_opts os[] = {
        { { 3, 3 }, { 2, 2 }, { 1, 1, 1, 1 }, false }, /* max, overlapping, padded */
        { { 2, 2 }, { 0, 0 }, { 0, 0, 0, 0 }, false }, /* avg */
        { { 3, 3 }, { 1, 2 }, { 1, 0, 1, 2 }, true },  /* avg counting the padding */
    };
    for (int k = 0; k < 3; k++) {
        gc_in in[] = { { WF_SHAPE(2, 2, 6, 6), -2, 2, true, 0, NULL } };
        gradcheck("pool", apply_pool, &os[k], 1, in, 800 + (uint64_t)k);
    }
}

/* ---- Layer norm and dropout -------------------------------------------------------------- */

static wf_node *apply_ln(wf_graph *g, wf_node *const *x, const void *ctx)
{
    int mode = *(const int *)ctx; /* 0: affine over the last axis; 1: plain over the last two */
    return mode == 0 ? wf_layer_norm(g, x[0], x[1], x[2], -1, 1e-5)
                     : wf_layer_norm(g, x[0], NULL, NULL, 1, 1e-5);
}

Test(gradcheck, layer_norm)
{
    for (int mode = 0; mode < 2; mode++) {
        gc_in in[] = { { WF_SHAPE(3, 2, 5), -2, 2, false, 0, NULL },
                       { WF_SHAPE(5), 0.5, 1.5, false, 0, NULL },
                       { WF_SHAPE(5), -1, 1, false, 0, NULL } };
        gradcheck("layer_norm", apply_ln, &mode, mode == 0 ? 3 : 1, in, 900 + (uint64_t)mode);
    }
}

static wf_node *apply_dropout(wf_graph *g, wf_node *const *x, const void *ctx)
{
    (void)ctx;
    return wf_dropout(g, wf_tanh(g, x[0]), 0.4, 1234);
}

Test(gradcheck, dropout_uses_the_forward_mask)
{
    gc_in in[] = { { WF_SHAPE(8, 8), -2, 2, false, 0, NULL } };
    gradcheck("dropout", apply_dropout, NULL, 1, in, 1000);
}

/* ---- Compositions ------------------------------------------------------------------------- */

static wf_node *fan_out(wf_graph *g, wf_node *const *x, const void *ctx)
{
    (void)ctx; /* x used four times: the contributions must be summed */
    wf_node *a = wf_mul(g, x[0], x[0]);
    return wf_add(g, wf_mul(g, a, wf_tanh(g, x[0])), x[0]);
}

Test(gradcheck, fan_out_is_summed)
{
    gc_in in[] = { { WF_SHAPE(2, 3), -2, 2, false, 0, NULL } };
    gradcheck("fan-out", fan_out, NULL, 1, in, 1100);
}

/* A small MLP: the path a training step takes. */
static wf_node *mlp(wf_graph *g, wf_node *const *x, const void *ctx)
{
    (void)ctx;
    wf_node *h = wf_relu(g, wf_add(g, wf_matmul(g, x[0], x[1]), x[2]));
    return wf_softmax_cross_entropy(g, wf_matmul(g, h, x[3]), wf_argmax(g, x[0], 1));
}

Test(gradcheck, mlp_with_cross_entropy)
{
    gc_in in[] = { { WF_SHAPE(4, 5), -1, 1, false, 0, NULL },
                   { WF_SHAPE(5, 6), -1, 1, false, 0, NULL },
                   { WF_SHAPE(6), 0.1, 0.5, false, 0, NULL },
                   { WF_SHAPE(6, 5), -1, 1, false, 0, NULL } };
    gradcheck("mlp", mlp, NULL, 4, in, 1200);
}
