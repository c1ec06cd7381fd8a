/* tests/runtime/test_mixed.c: the precision options of a session
 * (runtime/compile/pass_mixed.c) on the CPU, through the public API: WF_SESSION_MIXED_BF16
 * (bf16 compute with f32 master weights) and WF_SESSION_TF32.
 * The model: an MLP 16-32-4 (relu) with softmax cross-entropy, trained with Adam on a fixed
 * batch of 64 samples whose labels a fixed linear rule gives. With the mixed option:
 *   - the plan's products (forward and backward matmuls, GEMM epilogues) compute in bf16:
 *     the plan statistics count them and the plan's dump shows bf16 matmuls (and no f32 one),
 *     while the variables, fetched after training, are still f32;
 *   - it trains: the loss after 60 steps is under half the first step's;
 *   - its per-step losses over the first 8 steps follow the f32 run's within
 *     MIXED_TOL = 5e-3 (absolute, on losses from 1.4 down to 1.05: bf16 keeps ~3 significant
 *     digits per product; the f32 and mixed runs start from the same weights and batch; the
 *     largest difference measured here was 2.0e-4) but are not the same bits (so the
 *     products did round through bf16).
 * A small CNN (conv 3x3 + bias + relu + max pool, linear; SGD with momentum) does the same
 * with its convolutions: they and their filter gradient compute in bf16, its first 5 losses
 * follow the f32 run's within MIXED_TOL, and it trains (loss halved in 30 steps).
 * TF32 changes nothing on the CPU: the same bits as without it, with every f32 matmul marked.
 * On a GPU (skipped without one): the mixed run's losses follow the CPU's mixed run, and a
 * TF32 run's the CPU's f32 run, within MIXED_TOL over 8 steps.
 * Unknown flags are still refused. */
#include "runtime_util.h"

#include <weft/weft.h>

#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

TestSuite(runtime_mixed, .init = wf_test_rt_setup, .fini = wf_test_rt_teardown,
          .timeout = WF_TEST_TIMEOUT(120));

#define MIXED_TOL 5e-3

/* Asserts that the first 'n' losses of a mixed run follow the f32 run's within MIXED_TOL and
 * that some differ (bits equal everywhere would mean nothing ran in bf16). */
static void expect_mixed_follows(const float *mixed, const float *f32, int n)
{
    bool differ = false;
    for (int i = 0; i < n; i++) {
        cr_assert_leq(fabsf(mixed[i] - f32[i]), MIXED_TOL, "step %d: mixed %.6f, f32 %.6f", i,
                      mixed[i], f32[i]);
        differ = differ || mixed[i] != f32[i];
    }
    cr_assert(differ, "the mixed run gave the f32 run's bits: nothing ran in bf16");
}

#define N_BATCH 64
#define N_IN    16
#define N_HID   32
#define N_OUT   4

typedef struct mlp {
    wf_graph *g;
    wf_node *x, *y, *loss, *train, *w1, *w2;
    wf_tensor *xs, *ys;
} mlp;

static wf_node *linear(wf_graph *g, wf_node *h, const char *name, int in, int out, uint64_t seed,
                       wf_node **w)
{
    char wn[64], bn[64];
    snprintf(wn, sizeof wn, "%s.weight", name);
    snprintf(bn, sizeof bn, "%s.bias", name);
    double b = 1 / sqrt((double)in);
    *w = wf_variable(g, wn, WF_F32, WF_SHAPE(out, in), wf_init_uniform(seed, -b, b));
    wf_node *bias = wf_variable(g, bn, WF_F32, WF_SHAPE(out), wf_init_uniform(seed + 1, -b, b));
    return wf_add(g, wf_matmul_ex(g, h, *w, false, true), bias);
}

/* A session of 'g' with 'flags' whose nodes go on device 'device' where they have a kernel
 * (wf_session_opts.device; -1: every node on the CPU, what most tests here check: on a GPU,
 * TF32 changes bits), or fails the test with the graph's message. */
static wf_session *dev_session(wf_graph *g, uint32_t flags, int device)
{
    wf_session *s = NULL;
    int rc = wf_session_create(g, &(wf_session_opts){ .flags = flags, .device = device }, &s);
    cr_assert_eq(rc, 0, "wf_session_create: %s: %s", wf_err_name(rc), wf_graph_errmsg(g));
    return s;
}

/* The model, its training step (Adam, lr 1e-2) and the fixed batch. */
static void mlp_make(mlp *m)
{
    m->g = wf_graph_create(rt, WF_STATIC);
    cr_assert_not_null(m->g, "%s", wf_last_errmsg());
    m->x = wf_placeholder(m->g, "x", WF_F32, WF_SHAPE(-1, N_IN));
    m->y = wf_placeholder(m->g, "y", WF_I32, WF_SHAPE(-1));
    wf_node *h = wf_relu(m->g, linear(m->g, m->x, "fc1", N_IN, N_HID, 11, &m->w1));
    h = linear(m->g, h, "fc2", N_HID, N_OUT, 13, &m->w2);
    m->loss = wf_mean(m->g, wf_softmax_cross_entropy(m->g, h, m->y));
    m->train = wf_minimize(m->g, wf_adam(1e-2), m->loss);
    cr_assert_not_null(m->train, "%s", wf_graph_errmsg(m->g));
    float xd[N_BATCH * N_IN];
    int32_t yd[N_BATCH];
    uint64_t st = 12345;
    for (int i = 0; i < N_BATCH; i++) {
        double score[N_OUT] = { 0 };
        for (int j = 0; j < N_IN; j++) {
            float v = (float)((double)wf_test_rand_below(&st, 2000) / 1000.0 - 1.0);
            xd[i * N_IN + j] = v;
            for (int c = 0; c < N_OUT; c++) /* a fixed rule: class c weighs input j by +-1 */
                score[c] += ((j + c) % 3 == 0 ? 1.0 : (j * c) % 2 ? -0.5 : 0.25) * v;
        }
        int best = 0;
        for (int c = 1; c < N_OUT; c++)
            if (score[c] > score[best])
                best = c;
        yd[i] = best;
    }
    m->xs = wf_test_f32(WF_SHAPE(N_BATCH, N_IN), xd);
    m->ys = wf_tensor_from(WF_I32, WF_SHAPE(N_BATCH), yd);
    cr_assert_not_null(m->ys, "%s", wf_last_errmsg());
}

static void mlp_free(mlp *m)
{
    wf_tensor_release(m->xs);
    wf_tensor_release(m->ys);
    wf_graph_destroy(m->g);
}

/* Trains 'steps' steps of a session with 'flags', writing each step's loss (before its
 * update) into 'loss'. */
static void train_on(mlp *m, uint32_t flags, int device, int steps, float *loss, wf_session **keep)
{
    wf_session *s = dev_session(m->g, flags, device);
    wf_feed feeds[] = { { m->x, m->xs }, { m->y, m->ys } };
    for (int i = 0; i < steps; i++) {
        wf_tensor *out = NULL;
        wf_test_run(s, feeds, 2, &m->loss, 1, &out, &m->train, 1);
        cr_assert_eq(wf_tensor_dtype(out), WF_F32);
        loss[i] = wf_tensor_data_f32(out)[0];
        cr_assert(isfinite(loss[i]), "step %d: loss %g", i, loss[i]);
        wf_tensor_release(out);
    }
    if (keep)
        *keep = s;
    else
        wf_session_destroy(s);
}

/* train_on() the CPU. */
static void train(mlp *m, uint32_t flags, int steps, float *loss, wf_session **keep)
{
    train_on(m, flags, -1, steps, loss, keep);
}

/* The text dump of the training step's plan of 's', in memory (owned; free()). */
static char *plan_text(mlp *m, wf_session *s)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    cr_assert_not_null(f);
    int rc = wf_session_dump(s, &m->loss, 1, &m->train, 1, f, WF_DUMP_TEXT);
    fclose(f);
    cr_assert_eq(rc, 0, "%s: %s", wf_err_name(rc), wf_session_errmsg(s));
    return buf;
}

/* How many lines of 'text' hold both 'a' and 'b'. */
static int lines_with(const char *text, const char *a, const char *b)
{
    int n = 0;
    for (const char *p = text; p && *p;) {
        const char *e = strchr(p, '\n');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        char line[1024];
        snprintf(line, sizeof line, "%.*s", (int)(len < sizeof line ? len : sizeof line - 1), p);
        n += strstr(line, a) && strstr(line, b);
        p = e ? e + 1 : NULL;
    }
    return n;
}

Test(runtime_mixed, products_compute_in_bf16_while_the_variables_stay_f32)
{
    mlp m;
    mlp_make(&m);
    wf_session *s;
    float loss[2];
    train(&m, WF_SESSION_MIXED_BF16, 2, loss, &s);
    wf_plan_stats st = wf_test_plan_stats_targets(s, &m.loss, 1, &m.train, 1);
    /* fc1 and fc2 forward, fc2's input gradient, both weight gradients: 5 products (fc1's
     * input gradient is not needed: x is a placeholder). */
    cr_assert_geq(st.n_mixed, 5, "n_mixed %d", st.n_mixed);
    char *text = plan_text(&m, s);
    cr_assert_geq(lines_with(text, ": bf16 ", "= matmul"), 5, "bf16 products:\n%s", text);
    cr_assert_eq(lines_with(text, ": f32 ", "= matmul"), 0, "an f32 product is left:\n%s", text);
    cr_assert_gt(lines_with(text, ": bf16 ", "= cast("), 0, "no cast to bf16:\n%s", text);
    free(text);
    wf_node *vars[] = { m.w1, m.w2 };
    for (int i = 0; i < 2; i++) {
        wf_tensor *v = NULL;
        int rc = wf_session_variable(s, vars[i], &v);
        cr_assert_eq(rc, 0, "%s", wf_session_errmsg(s));
        cr_assert_eq(wf_tensor_dtype(v), WF_F32, "variable %d is %s", i,
                     wf_dtype_name(wf_tensor_dtype(v)));
        wf_tensor_release(v);
    }
    wf_session_destroy(s);
    mlp_free(&m);
}

Test(runtime_mixed, an_mlp_trains_in_mixed_precision)
{
    mlp m;
    mlp_make(&m);
    float loss[60];
    train(&m, WF_SESSION_MIXED_BF16, 60, loss, NULL);
    cr_assert_lt(loss[59], 0.5f * loss[0], "loss %g at step 0, %g at step 59", loss[0], loss[59]);
    mlp_free(&m);
}

Test(runtime_mixed, mixed_losses_follow_the_f32_run_within_bf16_precision)
{
    mlp m;
    mlp_make(&m);
    float f32[8], mixed[8];
    train(&m, 0, 8, f32, NULL);
    train(&m, WF_SESSION_MIXED_BF16, 8, mixed, NULL);
    expect_mixed_follows(mixed, f32, 8);
    mlp_free(&m);
}

/* conv 3x3 1->8 (+ bias, relu, max pool 2), linear 128->4, batch 8 of 1x10x10, SGD with
 * momentum; losses per step into 'loss', and the plan's statistics. */
static wf_plan_stats cnn_train(uint32_t flags, int steps, float *loss)
{
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(8, 1, 10, 10));
    wf_node *y = wf_placeholder(g, "y", WF_I32, WF_SHAPE(8));
    wf_node *w =
        wf_variable(g, "conv.weight", WF_F32, WF_SHAPE(8, 1, 3, 3), wf_init_uniform(5, -0.3, 0.3));
    wf_node *b =
        wf_variable(g, "conv.bias", WF_F32, WF_SHAPE(8, 1, 1), wf_init_uniform(6, -0.3, 0.3));
    const wf_pool2d_opts pool = { .window = { 2, 2 } };
    wf_node *h = wf_max_pool2d(g, wf_relu(g, wf_add(g, wf_conv2d(g, x, w, NULL), b)), &pool);
    wf_node *fw;
    h = linear(g, wf_reshape(g, h, WF_SHAPE(8, 128)), "fc", 128, N_OUT, 7, &fw);
    wf_node *l = wf_mean(g, wf_softmax_cross_entropy(g, h, y));
    wf_optimizer opt = wf_sgd(0.05);
    opt.momentum = 0.9;
    wf_node *train = wf_minimize(g, opt, l);
    cr_assert_not_null(train, "%s", wf_graph_errmsg(g));
    float xd[8 * 100];
    int32_t yd[8];
    uint64_t st = 777;
    for (int i = 0; i < 8 * 100; i++)
        xd[i] = (float)((double)wf_test_rand_below(&st, 2000) / 1000.0 - 1.0);
    for (int i = 0; i < 8; i++)
        yd[i] = i % N_OUT;
    wf_tensor *xs = wf_test_f32(WF_SHAPE(8, 1, 10, 10), xd);
    wf_tensor *ys = wf_tensor_from(WF_I32, WF_SHAPE(8), yd);
    wf_session *s = dev_session(g, flags, -1);
    wf_feed feeds[] = { { x, xs }, { y, ys } };
    for (int i = 0; i < steps; i++) {
        wf_tensor *out = NULL;
        wf_test_run(s, feeds, 2, &l, 1, &out, &train, 1);
        loss[i] = wf_tensor_data_f32(out)[0];
        wf_tensor_release(out);
    }
    wf_plan_stats ps = wf_test_plan_stats_targets(s, &l, 1, &train, 1);
    wf_session_destroy(s);
    wf_tensor_release(xs);
    wf_tensor_release(ys);
    wf_graph_destroy(g);
    return ps;
}

Test(runtime_mixed, convolutions_and_their_gradients_compute_in_bf16_too)
{
    float f32[30], mixed[30];
    cnn_train(0, 30, f32);
    wf_plan_stats st = cnn_train(WF_SESSION_MIXED_BF16, 30, mixed);
    /* conv2d, its filter gradient (x is a placeholder: no input gradient), the linear
     * layer's forward and its weight gradient; the input gradient of fc feeds the pool. */
    cr_assert_geq(st.n_mixed, 4, "n_mixed %d", st.n_mixed);
    expect_mixed_follows(mixed, f32, 5);
    cr_assert_lt(mixed[29], 0.5f * mixed[0], "loss %g at step 0, %g at step 29", mixed[0],
                 mixed[29]);
}

Test(runtime_mixed, tf32_marks_f32_matmuls_and_changes_no_bit_on_the_cpu)
{
    mlp m;
    mlp_make(&m);
    float plain[4], tf32[4];
    train(&m, 0, 4, plain, NULL);
    wf_session *s;
    train(&m, WF_SESSION_TF32, 4, tf32, &s);
    wf_plan_stats st = wf_test_plan_stats_targets(s, &m.loss, 1, &m.train, 1);
    cr_assert_geq(st.n_tf32, 4, "n_tf32 %d", st.n_tf32);
    cr_assert_eq(st.n_mixed, 0);
    for (int i = 0; i < 4; i++)
        cr_assert_eq(memcmp(&plain[i], &tf32[i], sizeof(float)), 0, "step %d: %.9g vs %.9g", i,
                     plain[i], tf32[i]);
    wf_session_destroy(s);
    mlp_free(&m);
}

Test(runtime_mixed, unknown_session_flags_are_still_einval)
{
    mlp m;
    mlp_make(&m);
    wf_session *s = NULL;
    int rc = wf_session_create(m.g, &(wf_session_opts){ .flags = 1u << 20 }, &s);
    cr_assert_eq(rc, WF_EINVAL, "got %s", wf_err_name(rc));
    cr_assert_null(s);
    cr_assert(strstr(wf_graph_errmsg(m.g), "unknown flags"), "%s", wf_graph_errmsg(m.g));
    mlp_free(&m);
}

Test(runtime_mixed, on_a_gpu_mixed_and_tf32_runs_follow_the_cpu)
{
    if (wf_device_count(rt) < 2)
        cr_skip_test("no CUDA device");
    mlp m;
    mlp_make(&m);
    float cpu[8], gpu[8], f32[8], tf32[8];
    train(&m, WF_SESSION_MIXED_BF16, 8, cpu, NULL);
    train_on(&m, WF_SESSION_MIXED_BF16, 1, 8, gpu, NULL); /* device 1: the first GPU */
    train(&m, 0, 8, f32, NULL);
    train_on(&m, WF_SESSION_TF32, 1, 8, tf32, NULL);
    for (int i = 0; i < 8; i++) {
        /* bf16 products on both sides, summed in other orders: within bf16's precision. */
        cr_assert_leq(fabsf(gpu[i] - cpu[i]), MIXED_TOL, "step %d: gpu %.6f, cpu %.6f", i, gpu[i],
                      cpu[i]);
        cr_assert_leq(fabsf(tf32[i] - f32[i]), MIXED_TOL, "step %d: tf32 %.6f, f32 %.6f", i,
                      tf32[i], f32[i]);
    }
    mlp_free(&m);
}
