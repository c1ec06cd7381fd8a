/* tests/runtime/test_epilogue.c: GEMM epilogue fusion (runtime/compile/pass_epilogue.c) through the
 * public API: matmul -> add(bias row) -> activation becomes one node for every activation,
 * with and without the bias, with transpose flags, batched, in f32, f64, bf16 and f16, on
 * shapes that split into several tiles, with 1 and 2 workers, and the results are bitwise
 * equal to the same graph compiled without the pass (WF_SESSION_NO_EPILOGUE) and with no
 * pass at all: the fused kernel runs the elementwise kernels' own per-element code, so
 * bitwise equality is the right check (plus one f64 reference, in case both were wrong
 * alike). Also what must not fuse (a pre-activation read elsewhere or fetched, a product
 * read twice, a bias that is not a row), concurrent runs of one fused plan from three
 * threads, training graphs (relu layers fuse whole once relu's gradient reads relu's
 * output, sigmoid layers too; optimizer updates are ordered after the fused nodes): an MLP
 * trained for several steps with the pass on and off gives bitwise equal losses and
 * variables; and the dump. */
#include "runtime_util.h"

#include <weft/weft.h>

#include <criterion/criterion.h>

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

TestSuite(runtime_epilogue, .init = wf_test_rt_setup_both, .fini = wf_test_rt_teardown,
          .timeout = WF_TEST_TIMEOUT(240));

/* Only the epilogue pass (the reference for it is every pass off). */
#define ONLY_EPILOGUE (WF_SESSION_NO_PASSES & ~(uint32_t)WF_SESSION_NO_EPILOGUE)

/* A tensor of 'dt' (f32 or f64) and 'shape' with values in [-2, 2) from 'seed', and a few
 * special values (NaN with a payload of its own, +-inf, -0.0) when 'specials'. */
static wf_tensor *random_tensor(wf_dtype dt, wf_shape shape, uint64_t seed, bool specials)
{
    int64_t n = wf_shape_numel(shape);
    double *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    cr_assert_not_null(v);
    uint64_t st = seed * 0x9e3779b97f4a7c15ull + 1;
    for (int64_t i = 0; i < n; i++)
        v[i] = (double)(wf_test_rand(&st) >> 11) * 0x1p-53 * 4.0 - 2.0;
    if (specials && n > 7) {
        v[1] = -0.0;
        v[3] = INFINITY;
        v[5] = -INFINITY;
        v[7] = NAN;
    }
    wf_tensor *t = NULL;
    if (dt == WF_F64) {
        t = wf_tensor_from(WF_F64, shape, v);
    } else {
        float *f = malloc((size_t)(n ? n : 1) * sizeof *f);
        cr_assert_not_null(f);
        for (int64_t i = 0; i < n; i++)
            f[i] = (float)v[i];
        if (specials && n > 7) { /* a NaN whose payload differs from the default one */
            uint32_t bits = 0x7fc12345u;
            memcpy(&f[7], &bits, sizeof bits);
        }
        t = wf_tensor_from(WF_F32, shape, f);
        free(f);
    }
    free(v);
    cr_assert_not_null(t, "%s", wf_last_errmsg());
    return t;
}

enum {
    ACT_NONE = -1,
    ACT_RELU,
    ACT_LEAKY,
    ACT_GELU,
    ACT_GELU_TANH,
    ACT_TANH,
    ACT_SIGMOID,
    ACT_SILU,
    ACT_COUNT
};

static const char *const act_names[ACT_COUNT] = { "relu", "leaky_relu", "gelu", "gelu_tanh",
                                                  "tanh", "sigmoid",    "silu" };

static wf_node *activation(wf_graph *g, int act, wf_node *x)
{
    switch (act) {
    case ACT_RELU:
        return wf_relu(g, x);
    case ACT_LEAKY:
        return wf_leaky_relu(g, x, 0.125);
    case ACT_GELU:
        return wf_gelu(g, x, false);
    case ACT_GELU_TANH:
        return wf_gelu(g, x, true);
    case ACT_TANH:
        return wf_tanh(g, x);
    case ACT_SIGMOID:
        return wf_sigmoid(g, x);
    case ACT_SILU:
        return wf_silu(g, x);
    default:
        return x;
    }
}

/* One case: y = act(op(x) @ op(w) (+ bias)), x fed, w and bias constants. */
typedef struct ep_case {
    wf_dtype dt;
    int64_t batch; /* 0: 2-D x; else x has this leading batch axis */
    int64_t M, K, N;
    bool ta, tb;
    int bias;        /* 0: none, 1: [N], 2: [1, N], 3: [1] */
    bool bias_first; /* bias + product */
    int act;         /* ACT_* */
    bool specials;   /* NaN, inf and -0.0 among the inputs */
} ep_case;

static void case_name(const ep_case *c, char *buf, size_t size)
{
    snprintf(buf, size, "%s %s%lldx%lldx%lld%s%s bias %d%s %s", wf_dtype_name(c->dt),
             c->batch ? "batched " : "", (long long)c->M, (long long)c->K, (long long)c->N,
             c->ta ? " ta" : "", c->tb ? " tb" : "", c->bias, c->bias_first ? " first" : "",
             c->act >= 0 ? act_names[c->act] : "none");
}

/* Builds the case, runs it with only the pass, with every pass but the pass, with every
 * pass off, on 'r'; asserts one fused node and the same bits. */
static void check_case(wf_runtime *r, const ep_case *c)
{
    char name[160];
    case_name(c, name, sizeof name);
    wf_graph *g = wf_graph_create(r, WF_STATIC);
    wf_shape xs = c->ta ? WF_SHAPE(c->K, c->M) : WF_SHAPE(c->M, c->K);
    if (c->batch) {
        xs.rank = 3;
        xs.dims[2] = xs.dims[1];
        xs.dims[1] = xs.dims[0];
        xs.dims[0] = c->batch;
    }
    wf_shape ws = c->tb ? WF_SHAPE(c->N, c->K) : WF_SHAPE(c->K, c->N);
    wf_shape ph = xs;
    ph.dims[0] = -1; /* a fed size: the fused node is inferred again at run time */
    /* bf16 and f16 values come from f32 ones through a cast node. */
    bool half = c->dt == WF_BF16 || c->dt == WF_F16;
    wf_dtype tdt = half ? WF_F32 : c->dt;
    wf_node *x = wf_placeholder(g, "x", tdt, ph), *xc = half ? wf_cast(g, x, c->dt) : x;
    wf_tensor *wt = random_tensor(tdt, ws, 2, c->specials);
    wf_node *w = wf_constant(g, wt);
    wf_tensor_release(wt);
    wf_node *y = wf_matmul_ex(g, xc, half ? wf_cast(g, w, c->dt) : w, c->ta, c->tb);
    if (c->bias) {
        wf_shape bs = c->bias == 1   ? WF_SHAPE(c->N)
                      : c->bias == 2 ? WF_SHAPE(1, c->N)
                                     : WF_SHAPE(1);
        wf_tensor *bt = random_tensor(tdt, bs, 3, c->specials);
        wf_node *b = wf_constant(g, bt);
        wf_tensor_release(bt);
        if (half)
            b = wf_cast(g, b, c->dt);
        y = c->bias_first ? wf_add(g, b, y) : wf_add(g, y, b);
    }
    y = activation(g, c->act, y);
    cr_assert_not_null(y, "%s: %s", name, wf_graph_errmsg(g));
    wf_session *on = wf_test_session(g, ONLY_EPILOGUE),
               *off = wf_test_session(g, WF_SESSION_NO_EPILOGUE),
               *none = wf_test_session(g, WF_SESSION_NO_PASSES);
    wf_plan_stats st = wf_test_plan_stats_targets(on, &y, 1, NULL, 0);
    int members = 1 + (c->bias != 0) + (c->act >= 0);
    cr_assert_eq(st.n_epilogue, 1, "%s: %d epilogues", name, st.n_epilogue);
    cr_assert_eq(st.nodes_after_epilogue, st.nodes_after_simplify - (members - 1),
                 "%s: %d nodes before, %d after", name, st.nodes_after_simplify,
                 st.nodes_after_epilogue);
    cr_assert_eq(wf_test_plan_stats_targets(off, &y, 1, NULL, 0).n_epilogue, 0, "%s", name);
    wf_tensor *xt = random_tensor(tdt, xs, 1, c->specials);
    wf_feed feed = { x, xt };
    for (int rep = 0; rep < 2; rep++) { /* the second run replays the plans */
        wf_tensor *r_on, *r_off, *r_none;
        wf_test_run(on, &feed, 1, &y, 1, &r_on, NULL, 0);
        wf_test_run(off, &feed, 1, &y, 1, &r_off, NULL, 0);
        wf_test_run(none, &feed, 1, &y, 1, &r_none, NULL, 0);
        cr_assert(wf_test_same_bits(r_on, r_none), "%s: fused and unfused results differ", name);
        cr_assert(wf_test_same_bits(r_off, r_none), "%s: the other passes changed bits", name);
        wf_tensor_release(r_on);
        wf_tensor_release(r_off);
        wf_tensor_release(r_none);
    }
    wf_tensor_release(xt);
    wf_session_destroy(on);
    wf_session_destroy(off);
    wf_session_destroy(none);
    wf_graph_destroy(g);
}

/* ---- Fused, and bitwise equal ------------------------------------------------------------ */

Test(runtime_epilogue, matmul_bias_relu_becomes_one_node_with_the_same_bits)
{
    check_case(rt, &(ep_case){ .dt = WF_F32,
                               .M = 37,
                               .K = 19,
                               .N = 23,
                               .bias = 1,
                               .act = ACT_RELU,
                               .specials = true });
}

Test(runtime_epilogue, every_activation_with_and_without_bias_fuses_bitwise_equal)
{
    for (int act = ACT_NONE; act < ACT_COUNT; act++)
        for (int bias = 0; bias <= 1; bias++) {
            if (act == ACT_NONE && !bias)
                continue; /* a bare matmul has nothing to fuse */
            for (int f64 = 0; f64 <= 1; f64++)
                check_case(rt, &(ep_case){ .dt = f64 ? WF_F64 : WF_F32,
                                           .M = 29,
                                           .K = 13,
                                           .N = 31,
                                           .bias = bias,
                                           .act = act,
                                           .specials = true });
        }
}

Test(runtime_epilogue, bias_shapes_and_operand_order_are_kept)
{
    for (int bias = 1; bias <= 3; bias++)
        for (int first = 0; first <= 1; first++)
            check_case(rt, &(ep_case){ .dt = WF_F32,
                                       .M = 17,
                                       .K = 9,
                                       .N = 21,
                                       .bias = bias,
                                       .bias_first = first,
                                       .act = ACT_SIGMOID,
                                       .specials = true });
}

Test(runtime_epilogue, transposed_and_batched_products_fuse_bitwise_equal)
{
    for (int t = 0; t < 4; t++)
        check_case(rt, &(ep_case){ .dt = WF_F32,
                                   .M = 33,
                                   .K = 17,
                                   .N = 20,
                                   .ta = t & 1,
                                   .tb = t >> 1,
                                   .bias = 1,
                                   .act = ACT_GELU_TANH });
    check_case(rt, &(ep_case){ .dt = WF_F32,
                               .batch = 3,
                               .M = 21,
                               .K = 11,
                               .N = 19,
                               .bias = 2,
                               .act = ACT_SILU,
                               .specials = true });
    check_case(rt, &(ep_case){ .dt = WF_F64,
                               .batch = 2,
                               .M = 40,
                               .K = 8,
                               .N = 33,
                               .tb = true,
                               .bias = 1,
                               .act = ACT_LEAKY });
}

Test(runtime_epilogue, products_of_several_tiles_fuse_bitwise_equal_on_1_and_2_workers)
{
    /* 300 x 270: 2 x 2 tiles of at most 256 x 256, split over the workers (private BLAS). */
    ep_case cases[] = {
        { .dt = WF_F32, .M = 300, .K = 64, .N = 270, .bias = 1, .act = ACT_RELU },
        { .dt = WF_F64, .M = 260, .K = 40, .N = 300, .tb = true, .bias = 1, .act = ACT_TANH },
        { .dt = WF_F32,
          .batch = 2,
          .M = 270,
          .K = 48,
          .N = 257,
          .ta = true,
          .bias = 2,
          .act = ACT_GELU },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        check_case(rt, &cases[i]);
        check_case(rt1, &cases[i]);
    }
}

Test(runtime_epilogue, half_precision_rounds_like_the_separate_nodes)
{
    check_case(rt,
               &(ep_case){ .dt = WF_BF16, .M = 24, .K = 16, .N = 40, .bias = 1, .act = ACT_GELU });
    check_case(rt, &(ep_case){ .dt = WF_F16,
                               .M = 9,
                               .K = 12,
                               .N = 10,
                               .bias = 2,
                               .bias_first = true,
                               .act = ACT_SIGMOID });
}

Test(runtime_epilogue, an_empty_inner_dimension_gives_the_activation_of_the_bias)
{
    check_case(rt,
               &(ep_case){ .dt = WF_F32, .M = 5, .K = 0, .N = 7, .bias = 1, .act = ACT_SIGMOID });
}

Test(runtime_epilogue, the_fused_result_matches_an_f64_reference)
{
    /* Guards against both paths being wrong alike: relu(x w + b) against a naive f64 loop,
     * within 1e-5 relative (f32 products of 50 terms). */
    const int M = 40, K = 50, N = 30;
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_tensor *xt = random_tensor(WF_F32, WF_SHAPE(M, K), 5, false);
    wf_tensor *wt = random_tensor(WF_F32, WF_SHAPE(K, N), 6, false);
    wf_tensor *bt = random_tensor(WF_F32, WF_SHAPE(N), 7, false);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(M, K));
    cr_assert_not_null(xt);
    wf_node *y = wf_relu(g, wf_add(g, wf_matmul(g, x, wf_constant(g, wt)), wf_constant(g, bt)));
    cr_assert_not_null(y, "%s", wf_graph_errmsg(g));
    wf_session *s = wf_test_session(g, 0);
    cr_assert_eq(wf_test_plan_stats_targets(s, &y, 1, NULL, 0).n_epilogue, 1);
    wf_feed feed = { x, xt };
    wf_tensor *out;
    wf_test_run(s, &feed, 1, &y, 1, &out, NULL, 0);
    const float *xv = wf_tensor_data_f32(xt), *wv = wf_tensor_data_f32(wt),
                *bv = wf_tensor_data_f32(bt), *ov = wf_tensor_data_f32(out);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double acc = bv[j];
            for (int k = 0; k < K; k++)
                acc += (double)xv[i * K + k] * wv[k * N + j];
            double ref = acc < 0 ? 0 : acc;
            cr_assert_leq(fabs(ov[i * N + j] - ref), 1e-5 * (1 + fabs(ref)),
                          "[%d, %d]: %g, reference %g", i, j, ov[i * N + j], ref);
        }
    wf_tensor_release(out);
    wf_tensor_release(xt);
    wf_tensor_release(wt);
    wf_tensor_release(bt);
    wf_session_destroy(s);
    wf_graph_destroy(g);
}

/* ---- Concurrent runs ------------------------------------------------------------------- */

typedef struct conc_arg {
    wf_session *s;
    wf_node *x, *y;
    wf_tensor *xt;
    const wf_tensor *want;
    int runs, bad, failed;
} conc_arg;

static void *conc_main(void *p)
{
    conc_arg *a = p;
    wf_feed feed = { a->x, a->xt };
    for (int r = 0; r < a->runs; r++) {
        wf_tensor *out = NULL;
        if (wf_session_run(a->s, &feed, 1, &a->y, 1, &out, NULL, 0) < 0) {
            a->failed++;
            continue;
        }
        a->bad += !wf_test_same_bits(out, a->want);
        wf_tensor_release(out);
    }
    return NULL;
}

Test(runtime_epilogue, concurrent_runs_of_a_fused_plan_give_the_same_bits)
{
    /* Three threads run one session at once (each run has its own slot; the fused node's
     * tiles of all runs share the 2 workers), repeated, against the unfused result. */
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(-1, 64));
    wf_tensor *wt = random_tensor(WF_F32, WF_SHAPE(64, 270), 41, false);
    wf_tensor *bt = random_tensor(WF_F32, WF_SHAPE(270), 42, false);
    wf_node *y = wf_silu(g, wf_add(g, wf_matmul(g, x, wf_constant(g, wt)), wf_constant(g, bt)));
    wf_tensor_release(wt);
    wf_tensor_release(bt);
    cr_assert_not_null(y, "%s", wf_graph_errmsg(g));
    wf_session *on = wf_test_session(g, 0), *none = wf_test_session(g, WF_SESSION_NO_PASSES);
    cr_assert_eq(wf_test_plan_stats_targets(on, &y, 1, NULL, 0).n_epilogue, 1);
    wf_tensor *xt = random_tensor(WF_F32, WF_SHAPE(300, 64), 43, true), *want;
    wf_feed feed = { x, xt };
    wf_test_run(none, &feed, 1, &y, 1, &want, NULL, 0);
    conc_arg args[3];
    pthread_t th[3];
    for (int i = 0; i < 3; i++) {
        args[i] = (conc_arg){
            .s = on, .x = x, .y = y, .xt = xt, .want = want, .runs = (int)wf_test_scaled(12, 3)
        };
        cr_assert_eq(pthread_create(&th[i], NULL, conc_main, &args[i]), 0);
    }
    for (int i = 0; i < 3; i++) {
        pthread_join(th[i], NULL);
        cr_assert_eq(args[i].failed, 0, "thread %d: %s", i, wf_session_errmsg(on));
        cr_assert_eq(args[i].bad, 0, "thread %d: %d runs gave other bits", i, args[i].bad);
    }
    wf_tensor_release(want);
    wf_tensor_release(xt);
    wf_session_destroy(on);
    wf_session_destroy(none);
    wf_graph_destroy(g);
}

/* ---- Not fused --------------------------------------------------------------------------- */

/* x [-1, 6] @ w [6, 5] + b [5] -> relu, with the nodes for the callers. */
typedef struct small {
    wf_graph *g;
    wf_node *x, *w, *mm, *add, *act;
    wf_tensor *xt;
} small;

static small small_make(void)
{
    small m = { .g = wf_graph_create(rt, WF_STATIC) };
    wf_tensor *wt = random_tensor(WF_F32, WF_SHAPE(6, 5), 11, false);
    wf_tensor *bt = random_tensor(WF_F32, WF_SHAPE(5), 12, false);
    m.x = wf_placeholder(m.g, "x", WF_F32, WF_SHAPE(-1, 6));
    m.w = wf_constant(m.g, wt);
    m.mm = wf_matmul(m.g, m.x, m.w);
    m.add = wf_add(m.g, m.mm, wf_constant(m.g, bt));
    m.act = wf_relu(m.g, m.add);
    cr_assert_not_null(m.act, "%s", wf_graph_errmsg(m.g));
    m.xt = random_tensor(WF_F32, WF_SHAPE(4, 6), 13, true);
    wf_tensor_release(wt);
    wf_tensor_release(bt);
    return m;
}

static void small_free(small *m)
{
    wf_tensor_release(m->xt);
    wf_graph_destroy(m->g);
}

/* Runs 'fetches' with the pass and without any; asserts equal bits; returns the stats. */
static wf_plan_stats small_check(small *m, wf_node *const *fetches, int n)
{
    wf_session *on = wf_test_session(m->g, ONLY_EPILOGUE),
               *none = wf_test_session(m->g, WF_SESSION_NO_PASSES);
    wf_plan_stats st = wf_test_plan_stats_targets(on, fetches, n, NULL, 0);
    wf_tensor *r_on[4], *r_none[4];
    wf_feed feed = { m->x, m->xt };
    wf_test_run(on, &feed, 1, fetches, n, r_on, NULL, 0);
    wf_test_run(none, &feed, 1, fetches, n, r_none, NULL, 0);
    for (int k = 0; k < n; k++) {
        cr_assert(wf_test_same_bits(r_on[k], r_none[k]), "fetch %d differs", k);
        wf_tensor_release(r_on[k]);
        wf_tensor_release(r_none[k]);
    }
    wf_session_destroy(on);
    wf_session_destroy(none);
    return st;
}

Test(runtime_epilogue, a_fetched_pre_activation_keeps_its_activation_apart)
{
    small m = small_make();
    wf_node *f[2] = { m.add, m.act };
    wf_plan_stats st = small_check(&m, f, 2);
    cr_assert_eq(st.n_epilogue, 1, "matmul + bias only");
    cr_assert_eq(st.nodes_after_epilogue, st.nodes_after_simplify - 1);
    small_free(&m);
}

Test(runtime_epilogue, a_fetched_product_is_not_fused)
{
    small m = small_make();
    wf_node *f[2] = { m.mm, m.act };
    wf_plan_stats st = small_check(&m, f, 2);
    cr_assert_eq(st.n_epilogue, 0);
    cr_assert_eq(st.nodes_after_epilogue, st.nodes_after_simplify);
    small_free(&m);
}

Test(runtime_epilogue, a_pre_activation_read_elsewhere_fuses_only_matmul_and_bias)
{
    small m = small_make();
    wf_node *other = wf_exp(m.g, m.add); /* a second reader of the add */
    wf_node *f[2] = { m.act, other };
    wf_plan_stats st = small_check(&m, f, 2);
    cr_assert_eq(st.n_epilogue, 1);
    cr_assert_eq(st.nodes_after_epilogue, st.nodes_after_simplify - 1, "only the add went");
    small_free(&m);
}

Test(runtime_epilogue, a_product_read_twice_is_not_fused)
{
    small m = small_make();
    wf_node *twice = wf_relu(m.g, wf_add(m.g, m.mm, m.mm)); /* no bias: the product itself */
    wf_node *f[1] = { twice };
    wf_plan_stats st = small_check(&m, f, 1);
    cr_assert_eq(st.n_epilogue, 0);
    small_free(&m);
}

Test(runtime_epilogue, a_bias_that_broadcasts_the_product_is_not_fused)
{
    small m = small_make();
    /* [4, 1] against [-1, 5]: a column, not a row; and [2, 1, 5] adds a batch axis. */
    wf_tensor *ct = random_tensor(WF_F32, WF_SHAPE(4, 1), 14, false);
    wf_tensor *bt = random_tensor(WF_F32, WF_SHAPE(2, 1, 5), 15, false);
    wf_node *col = wf_relu(m.g, wf_add(m.g, wf_matmul(m.g, m.x, m.w), wf_constant(m.g, ct)));
    wf_node *bat = wf_tanh(m.g, wf_add(m.g, wf_matmul(m.g, m.x, m.w), wf_constant(m.g, bt)));
    wf_tensor_release(ct);
    wf_tensor_release(bt);
    cr_assert_not_null(bat, "%s", wf_graph_errmsg(m.g));
    /* The activations read the adds, not the products, so neither chain fuses at all. */
    wf_node *f[2] = { col, bat };
    wf_plan_stats st = small_check(&m, f, 2);
    cr_assert_eq(st.n_epilogue, 0);
    small_free(&m);
}

/* ---- Training graphs --------------------------------------------------------------------- */

/* An MLP as weft-train builds it (linear layers with the weight [out, in] read transposed,
 * a bias row, relu between), a softmax cross-entropy loss and Adam. */
typedef struct mlp {
    wf_graph *g;
    wf_node *x, *y, *loss, *train;
    wf_node *vars[6];
} mlp;

static mlp mlp_make(wf_runtime *r, int in, int hidden, int classes, int act)
{
    mlp m = { .g = wf_graph_create(r, WF_STATIC) };
    wf_graph *g = m.g;
    m.x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(-1, in));
    m.y = wf_placeholder(g, "y", WF_I32, WF_SHAPE(-1));
    const int dims[4] = { in, hidden, hidden, classes };
    wf_node *h = m.x;
    for (int l = 0; l < 3; l++) {
        char wn[16], bn[16];
        snprintf(wn, sizeof wn, "fc%d.weight", l + 1);
        snprintf(bn, sizeof bn, "fc%d.bias", l + 1);
        double lim = 1.0 / sqrt(dims[l]);
        wf_node *w = wf_variable(g, wn, WF_F32, WF_SHAPE(dims[l + 1], dims[l]),
                                 wf_init_uniform(100 + (uint64_t)l, -lim, lim));
        wf_node *b = wf_variable(g, bn, WF_F32, WF_SHAPE(dims[l + 1]),
                                 wf_init_uniform(200 + (uint64_t)l, -lim, lim));
        m.vars[2 * l] = w;
        m.vars[2 * l + 1] = b;
        h = wf_add(g, wf_matmul_ex(g, h, w, false, true), b);
        if (l < 2)
            h = activation(g, act, h);
    }
    m.loss = wf_mean(g, wf_softmax_cross_entropy(g, h, m.y));
    m.train = wf_minimize(g, wf_adam(1e-2), m.loss);
    cr_assert_not_null(m.train, "%s", wf_graph_errmsg(g));
    return m;
}

/* 'steps' training steps of 'm' on fixed batches with session flags 'flags': the losses into
 * 'losses' and the final variables into 'vals' (the caller releases them). */
static void mlp_train(const mlp *m, uint32_t flags, int steps, int batch, int in, int classes,
                      wf_tensor **losses, wf_tensor **vals, wf_plan_stats *st)
{
    wf_session *s = wf_test_session(m->g, flags);
    *st = wf_test_plan_stats_targets(s, &m->loss, 1, &m->train, 1);
    for (int step = 0; step < steps; step++) {
        wf_tensor *xt = random_tensor(WF_F32, WF_SHAPE(batch, in), 1000 + (uint64_t)step, false);
        int32_t *labels = malloc((size_t)batch * sizeof *labels);
        for (int i = 0; i < batch; i++)
            labels[i] = (i * 7 + step) % classes;
        wf_tensor *yt = wf_tensor_from(WF_I32, WF_SHAPE(batch), labels);
        free(labels);
        wf_feed feeds[2] = { { m->x, xt }, { m->y, yt } };
        wf_test_run(s, feeds, 2, &m->loss, 1, &losses[step], &m->train, 1);
        wf_tensor_release(xt);
        wf_tensor_release(yt);
    }
    for (int v = 0; v < 6; v++)
        cr_assert_eq(wf_session_variable(s, m->vars[v], &vals[v]), 0, "%s", wf_session_errmsg(s));
    wf_session_destroy(s);
}

static void mlp_compare(wf_runtime *r, int act, int expect_epilogues, int expect_removed)
{
    const int in = 64, hidden = 48, classes = 10, batch = 32, steps = 5;
    mlp m = mlp_make(r, in, hidden, classes, act);
    wf_tensor *l_on[5], *l_off[5], *v_on[6], *v_off[6];
    wf_plan_stats s_on, s_off;
    mlp_train(&m, 0, steps, batch, in, classes, l_on, v_on, &s_on);
    mlp_train(&m, WF_SESSION_NO_EPILOGUE, steps, batch, in, classes, l_off, v_off, &s_off);
    cr_assert_eq(s_on.n_epilogue, expect_epilogues, "%d epilogues", s_on.n_epilogue);
    cr_assert_eq(s_on.nodes_after_simplify - s_on.nodes_after_epilogue, expect_removed,
                 "%d -> %d nodes", s_on.nodes_after_simplify, s_on.nodes_after_epilogue);
    cr_assert_eq(s_off.n_epilogue, 0);
    for (int k = 0; k < steps; k++) {
        cr_assert(wf_test_same_bits(l_on[k], l_off[k]),
                  "step %d: loss %.9g with the pass, %.9g without", k,
                  wf_tensor_data_f32(l_on[k])[0], wf_tensor_data_f32(l_off[k])[0]);
        wf_tensor_release(l_on[k]);
        wf_tensor_release(l_off[k]);
    }
    for (int v = 0; v < 6; v++) {
        cr_assert(wf_test_same_bits(v_on[v], v_off[v]), "variable %d differs after training", v);
        wf_tensor_release(v_on[v]);
        wf_tensor_release(v_off[v]);
    }
    wf_graph_destroy(m.g);
}

Test(runtime_epilogue, an_mlp_trains_bitwise_equal_with_the_pass_on_and_off)
{
    /* relu's gradient reads the add; the pass makes it read the relu instead (the same
     * bits), so layers 1 and 2 fuse matmul + bias + relu (2 nodes gone each) and layer 3
     * matmul + bias (1). The optimizer's updates, ordered after the readers of the weights
     * and biases, are then ordered after the fused nodes. */
    mlp_compare(rt, ACT_RELU, 3, 5);
    mlp_compare(rt1, ACT_RELU, 3, 5);
}

Test(runtime_epilogue, sigmoid_layers_fuse_whole_in_training)
{
    /* sigmoid's gradient reads its output: layers 1 and 2 fuse matmul + bias + sigmoid (2
     * nodes gone each), layer 3 matmul + bias (1). */
    mlp_compare(rt, ACT_SIGMOID, 3, 5);
}

Test(runtime_epilogue, gelu_layers_fuse_only_matmul_and_bias_in_training)
{
    /* gelu's gradient reads its input (the add), which then has two readers: each layer
     * fuses matmul + bias only (1 node gone each), and the gelus stay nodes. */
    mlp_compare(rt, ACT_GELU, 3, 3);
}

/* ---- Dumps --------------------------------------------------------------------------------- */

Test(runtime_epilogue, the_dump_names_the_fused_node_and_its_members)
{
    small m = small_make();
    wf_session *s = wf_test_session(m.g, 0);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    cr_assert_not_null(f);
    int rc = wf_session_dump(s, &m.act, 1, NULL, 0, f, WF_DUMP_TEXT);
    fclose(f);
    cr_assert_eq(rc, 0, "%s", wf_session_errmsg(s));
    cr_assert(strstr(buf, "matmul_epilogue(") != NULL, "%s", buf);
    cr_assert(strstr(buf, "[epilogue(bias, relu)]") != NULL, "%s", buf);
    cr_assert(strstr(buf, ".epilogue") != NULL, "%s", buf);
    cr_assert(strstr(buf, "# epilogue: ") != NULL && strstr(buf, "(matmul) -> ") != NULL, "%s",
              buf);
    cr_assert(strstr(buf, " = matmul(") == NULL, "the product is gone: %s", buf);
    free(buf);
    wf_session_destroy(s);
    small_free(&m);
}
