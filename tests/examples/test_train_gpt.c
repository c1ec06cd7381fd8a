/* tests/examples/test_train_gpt.c: the GPT of examples/train_gpt/gpt_model.c: its logits
 * against a naive f64 reference of the same transformer (random weights, separate and tied
 * heads, one and two layers), causality (a token changes no earlier position's logits), the
 * loss falling over 50 steps on a repetitive text, bit-for-bit the same in two runs of one
 * seed, and the config checks.
 * Not here: train_gpt itself (examples/train_gpt/CMakeLists.txt runs it). */
#include "wf_test.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <train_gpt/gpt_model.h>

static wf_runtime *rt;

/* Two workers, so that independent nodes (the q, k and v products, the two gradients of
 * each matmul) run at once: the bit-for-bit test below caught concurrent BLAS calls racing
 * (ops/blas.c). */
static void setup(void)
{
    rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 2 });
}

static void teardown(void)
{
    wf_runtime_destroy(rt);
    wf_test_fini();
}

TestSuite(examples_train_gpt, .init = setup, .fini = teardown, .timeout = WF_TEST_TIMEOUT(120));

/* A model in a static graph with an i32 input [batch, t] and its logits, and a session. */
typedef struct fixture {
    wf_graph *g;
    wf_session *s;
    gpt_model m;
    wf_node *idx, *logits;
} fixture;

static void fixture_init(fixture *f, const gpt_config *c, int batch, int t)
{
    char err[256] = "";
    f->g = wf_graph_create(rt, WF_STATIC);
    cr_assert_not_null(f->g);
    int rc = gpt_build(f->g, c, &f->m, err, sizeof err);
    cr_assert_eq(rc, 0, "gpt_build: %s", err);
    f->idx = wf_placeholder(f->g, "idx", WF_I32, WF_SHAPE(batch, t));
    f->logits = gpt_logits(f->g, &f->m, f->idx, false);
    cr_assert_not_null(f->logits, "gpt_logits: %s", wf_graph_errmsg(f->g));
    rc = wf_session_create(f->g, NULL, &f->s);
    cr_assert_eq(rc, 0, "session: %s", wf_graph_errmsg(f->g));
}

static void fixture_fini(fixture *f)
{
    wf_session_destroy(f->s);
    wf_graph_destroy(f->g);
}

/* Sets every parameter to uniform(-a, a) noise (layer norm scales around 1), so that biases,
 * scales and every head matter in the comparison. */
static void randomize(fixture *f, uint64_t seed, double a)
{
    for (int i = 0; i < f->m.n_params; i++) {
        wf_shape s = wf_node_shape(f->m.p[i]);
        int64_t n = wf_shape_numel(s);
        float *v = malloc((size_t)n * sizeof *v);
        bool scale =
            strstr(wf_node_name(f->m.p[i]), "ln_") && strstr(wf_node_name(f->m.p[i]), ".weight");
        for (int64_t j = 0; j < n; j++)
            v[j] = (float)((scale ? 1.0 : 0.0) +
                           a * (2.0 * (double)(wf_test_rand(&seed) >> 11) * 0x1.0p-53 - 1.0));
        wf_tensor *t = wf_tensor_from(WF_F32, s, v);
        free(v);
        int rc = wf_session_assign(f->s, f->m.p[i], t);
        cr_assert_eq(rc, 0, "assign %s: %s", wf_node_name(f->m.p[i]), wf_session_errmsg(f->s));
        wf_tensor_release(t);
    }
}

/* Parameter i's current value as f64 (malloc'd). */
static double *param64(fixture *f, int i)
{
    wf_tensor *t = NULL;
    int rc = wf_session_variable(f->s, f->m.p[i], &t);
    cr_assert_eq(rc, 0);
    int64_t n = wf_tensor_numel(t);
    double *v = malloc((size_t)n * sizeof *v);
    rc = wf_tensor_read(t, WF_F64, v, (size_t)n * sizeof *v);
    cr_assert_eq(rc, 0);
    wf_tensor_release(t);
    return v;
}

static void run_logits(fixture *f, const int32_t *ids, int batch, int t, float *out)
{
    wf_tensor *x = wf_tensor_from(WF_I32, WF_SHAPE(batch, t), ids), *y = NULL;
    wf_feed feed = { f->idx, x };
    int rc = wf_session_run(f->s, &feed, 1, &f->logits, 1, &y, NULL, 0);
    cr_assert_eq(rc, 0, "run: %s", wf_session_errmsg(f->s));
    int64_t n = (int64_t)batch * t * f->m.c.vocab;
    cr_assert_eq(wf_tensor_numel(y), n);
    rc = wf_tensor_read(y, WF_F32, out, (size_t)n * sizeof *out);
    cr_assert_eq(rc, 0);
    wf_tensor_release(x);
    wf_tensor_release(y);
}

/* ---- The naive f64 reference: nanoGPT's forward, one sequence at a time ----------------- */

static void ref_layer_norm(const double *x, const double *w, const double *b, int d, double *y)
{
    double mean = 0, var = 0;
    for (int i = 0; i < d; i++)
        mean += x[i];
    mean /= d;
    for (int i = 0; i < d; i++)
        var += (x[i] - mean) * (x[i] - mean);
    var /= d;
    for (int i = 0; i < d; i++)
        y[i] = (x[i] - mean) / sqrt(var + 1e-5) * w[i] + b[i];
}

/* y[o] = sum_i w[o, i] x[i] + b[o] (b may be NULL). */
static void ref_linear(const double *x, const double *w, const double *b, int in, int out,
                       double *y)
{
    for (int o = 0; o < out; o++) {
        double s = b ? b[o] : 0;
        for (int i = 0; i < in; i++)
            s += w[(int64_t)o * in + i] * x[i];
        y[o] = s;
    }
}

/* The logits [t, vocab] of one sequence 'ids' [t]. */
static void ref_forward(fixture *f, const int32_t *ids, int t, double *logits)
{
    const gpt_config *c = &f->m.c;
    int d = c->d_model, H = c->heads, dh = d / H, V = c->vocab;
    double *p[GPT_MAX_PARAMS];
    for (int i = 0; i < f->m.n_params; i++)
        p[i] = param64(f, i);
    double *x = calloc((size_t)t * d, sizeof *x), *h = calloc((size_t)t * d, sizeof *h);
    double *qkv = calloc((size_t)t * 3 * d, sizeof *qkv), *y = calloc((size_t)t * d, sizeof *y);
    double *fc = calloc((size_t)4 * d, sizeof *fc), *tmp = calloc((size_t)d, sizeof *tmp);
    double *att = calloc((size_t)t, sizeof *att);
    for (int i = 0; i < t; i++)
        for (int k = 0; k < d; k++)
            x[i * d + k] = p[0][ids[i] * d + k] + p[1][i * d + k];
    for (int l = 0; l < c->layers; l++) {
        double **q = &p[2 + GPT_PARAMS_PER_LAYER * l];
        for (int i = 0; i < t; i++) {
            ref_layer_norm(&x[i * d], q[0], q[1], d, &h[i * d]);
            ref_linear(&h[i * d], q[2], q[3], d, 3 * d, &qkv[i * 3 * d]);
        }
        /* head j of query i: q = qkv[i, j dh ..], k = qkv[s, d + j dh ..], v = qkv[s, 2d + ..] */
        for (int i = 0; i < t; i++)
            for (int j = 0; j < H; j++) {
                double mx = -INFINITY, sum = 0;
                for (int s = 0; s <= i; s++) {
                    double dot = 0;
                    for (int k = 0; k < dh; k++)
                        dot += qkv[i * 3 * d + j * dh + k] * qkv[s * 3 * d + d + j * dh + k];
                    att[s] = dot / sqrt((double)dh);
                    mx = fmax(mx, att[s]);
                }
                for (int s = 0; s <= i; s++)
                    sum += (att[s] = exp(att[s] - mx));
                for (int k = 0; k < dh; k++) {
                    double acc = 0;
                    for (int s = 0; s <= i; s++)
                        acc += att[s] / sum * qkv[s * 3 * d + 2 * d + j * dh + k];
                    y[i * d + j * dh + k] = acc;
                }
            }
        for (int i = 0; i < t; i++) {
            ref_linear(&y[i * d], q[4], q[5], d, d, tmp);
            for (int k = 0; k < d; k++)
                x[i * d + k] += tmp[k];
            ref_layer_norm(&x[i * d], q[6], q[7], d, &h[i * d]);
            ref_linear(&h[i * d], q[8], q[9], d, 4 * d, fc);
            for (int k = 0; k < 4 * d; k++)
                fc[k] = 0.5 * fc[k] * (1 + erf(fc[k] / sqrt(2.0)));
            ref_linear(fc, q[10], q[11], 4 * d, d, tmp);
            for (int k = 0; k < d; k++)
                x[i * d + k] += tmp[k];
        }
    }
    int fi = 2 + GPT_PARAMS_PER_LAYER * c->layers;
    const double *head = c->tie_head ? p[0] : p[fi + 2];
    for (int i = 0; i < t; i++) {
        ref_layer_norm(&x[i * d], p[fi], p[fi + 1], d, &h[i * d]);
        ref_linear(&h[i * d], head, NULL, d, V, &logits[i * V]);
    }
    for (int i = 0; i < f->m.n_params; i++)
        free(p[i]);
    free(x);
    free(h);
    free(qkv);
    free(y);
    free(fc);
    free(tmp);
    free(att);
}

/* Compares the model's logits on a random batch with the reference: |a - r| <= 1e-4 (1 +
 * |r|) (f32 sums of at most 4 d products of values below ~3, against f64). */
static void check_against_reference(gpt_config c, int batch, int t)
{
    fixture f;
    fixture_init(&f, &c, batch, t);
    randomize(&f, 1234 + (uint64_t)c.layers, 0.3);
    uint64_t seed = 99;
    int32_t *ids = malloc((size_t)batch * t * sizeof *ids);
    for (int i = 0; i < batch * t; i++)
        ids[i] = (int32_t)wf_test_rand_below(&seed, (uint64_t)c.vocab);
    float *got = malloc((size_t)batch * t * c.vocab * sizeof *got);
    double *want = malloc((size_t)t * c.vocab * sizeof *want);
    run_logits(&f, ids, batch, t, got);
    double worst = 0;
    for (int b = 0; b < batch; b++) {
        ref_forward(&f, &ids[b * t], t, want);
        for (int i = 0; i < t * c.vocab; i++) {
            double a = got[(int64_t)b * t * c.vocab + i], r = want[i];
            cr_assert(fabs(a - r) <= 1e-4 * (1 + fabs(r)),
                      "batch %d, position %d, token %d: weft %.7g, reference %.7g", b, i / c.vocab,
                      i % c.vocab, a, r);
            worst = fmax(worst, fabs(r));
        }
    }
    cr_assert_gt(worst, 0.1, "the logits are all near 0: the comparison would prove little");
    free(ids);
    free(got);
    free(want);
    fixture_fini(&f);
}

Test(examples_train_gpt, logits_match_an_f64_reference_transformer)
{
    check_against_reference(
        (gpt_config){ .vocab = 7, .context = 6, .d_model = 8, .heads = 2, .layers = 1, .seed = 1 },
        2, 6);
}

Test(examples_train_gpt, logits_match_the_reference_with_two_layers_a_tied_head_and_t_below_context)
{
    check_against_reference((gpt_config){ .vocab = 5,
                                          .context = 8,
                                          .d_model = 12,
                                          .heads = 3,
                                          .layers = 2,
                                          .tie_head = true,
                                          .seed = 2 },
                            3, 5);
}

Test(examples_train_gpt, a_token_changes_no_earlier_positions_logits)
{
    gpt_config c = { .vocab = 9, .context = 8, .d_model = 16, .heads = 4, .layers = 2, .seed = 3 };
    fixture f;
    fixture_init(&f, &c, 1, 8);
    randomize(&f, 5, 0.3);
    int32_t a[8] = { 1, 2, 3, 4, 5, 6, 7, 8 }, b[8];
    float la[8 * 9], lb[8 * 9];
    run_logits(&f, a, 1, 8, la);
    for (int j = 0; j < 8; j++) {
        memcpy(b, a, sizeof a);
        b[j] = (a[j] + 4) % 9;
        run_logits(&f, b, 1, 8, lb);
        for (int i = 0; i < 8; i++) {
            bool same = memcmp(&la[i * 9], &lb[i * 9], sizeof(float) * 9) == 0;
            if (i < j)
                cr_assert(same, "changing token %d changed the logits of position %d", j, i);
            else
                cr_assert(!same, "changing token %d left position %d's logits unchanged", j, i);
        }
    }
    fixture_fini(&f);
}

/* Trains 'steps' steps on "abcdefgh" repeated (batches: windows at offsets 0, 1, 2, ...,
 * fixed) and writes the losses. */
static void train_repetitive(int steps, double *losses)
{
    enum { B = 8, T = 16, V = 8 };

    gpt_config c = { .vocab = V, .context = T, .d_model = 32, .heads = 2, .layers = 1, .seed = 7 };
    char err[256] = "";
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    gpt_model m;
    int rc = gpt_build(g, &c, &m, err, sizeof err);
    cr_assert_eq(rc, 0, "%s", err);
    wf_node *x = wf_placeholder(g, "x", WF_I32, WF_SHAPE(B, T));
    wf_node *y = wf_placeholder(g, "y", WF_I32, WF_SHAPE(B, T));
    wf_node *loss = gpt_loss(g, gpt_logits(g, &m, x, true), y), *step[2];
    gpt_train_opts o = { .lr = 3e-3, .weight_decay = 0.1, .clip_norm = 1.0 };
    rc = gpt_train_step(g, &m, loss, &o, step);
    cr_assert_eq(rc, 0, "%s", wf_graph_errmsg(g));
    wf_session *s;
    rc = wf_session_create(g, NULL, &s);
    cr_assert_eq(rc, 0, "%s", wf_graph_errmsg(g));
    int32_t xb[B * T], yb[B * T];
    for (int k = 0; k < steps; k++) {
        for (int b = 0; b < B; b++)
            for (int i = 0; i < T; i++) {
                int o0 = (k * B + b) % V;
                xb[b * T + i] = (o0 + i) % V;
                yb[b * T + i] = (o0 + i + 1) % V;
            }
        wf_tensor *tx = wf_tensor_from(WF_I32, WF_SHAPE(B, T), xb);
        wf_tensor *ty = wf_tensor_from(WF_I32, WF_SHAPE(B, T), yb), *out;
        wf_feed f[2] = { { x, tx }, { y, ty } };
        rc = wf_session_run(s, f, 2, &loss, 1, &out, step, 2);
        cr_assert_eq(rc, 0, "step %d: %s", k, wf_session_errmsg(s));
        losses[k] = wf_tensor_get(out, 0);
        wf_tensor_release(out);
        wf_tensor_release(tx);
        wf_tensor_release(ty);
    }
    wf_session_destroy(s);
    wf_graph_destroy(g);
}

Test(examples_train_gpt, loss_falls_over_50_steps_on_a_repetitive_text)
{
    double l[50];
    train_repetitive(50, l);
    /* small initial weights: the first loss is about ln 8 = 2.08 (uniform predictions) */
    cr_assert(fabs(l[0] - log(8.0)) < 0.1, "first loss %g, expected about ln 8 = %g", l[0],
              log(8.0));
    cr_assert_lt(l[49], 0.5 * l[0], "loss %g after 50 steps, %g at the start", l[49], l[0]);
    double first10 = 0, last10 = 0;
    for (int i = 0; i < 10; i++)
        first10 += l[i], last10 += l[40 + i];
    cr_assert_lt(last10, first10, "the last ten losses are not below the first ten");
}

Test(examples_train_gpt, one_seed_gives_the_same_losses_bit_for_bit)
{
    double a[10], b[10];
    train_repetitive(10, a);
    train_repetitive(10, b);
    for (int i = 0; i < 10; i++)
        cr_assert(a[i] == b[i], "step %d: %.17g then %.17g", i, a[i], b[i]);
}

Test(examples_train_gpt, each_step_advances_both_optimizer_step_counters_by_one)
{
    gpt_config c = { .vocab = 5, .context = 4, .d_model = 8, .heads = 2, .layers = 1, .seed = 1 };
    fixture f = { 0 };
    char err[256] = "";
    f.g = wf_graph_create(rt, WF_STATIC);
    cr_assert_eq(gpt_build(f.g, &c, &f.m, err, sizeof err), 0, "%s", err);
    wf_node *x = wf_placeholder(f.g, "x", WF_I32, WF_SHAPE(2, 4));
    wf_node *loss = gpt_loss(f.g, gpt_logits(f.g, &f.m, x, true), x), *step[2];
    gpt_train_opts o = { .lr = 1e-3, .weight_decay = 0.1, .clip_norm = 1.0 };
    cr_assert_eq(gpt_train_step(f.g, &f.m, loss, &o, step), 0, "%s", wf_graph_errmsg(f.g));
    wf_node *counters[2] = { wf_graph_find(f.g, "adamw/step"), wf_graph_find(f.g, "adam/step") };
    cr_assert(counters[0] && counters[1], "the step counters are not named adamw/step, adam/step");
    cr_assert_eq(wf_session_create(f.g, NULL, &f.s), 0, "%s", wf_graph_errmsg(f.g));
    int32_t ids[8] = { 0, 1, 2, 3, 4, 3, 2, 1 };
    wf_tensor *tx = wf_tensor_from(WF_I32, WF_SHAPE(2, 4), ids);
    wf_feed feed = { x, tx };
    for (int k = 0; k < 3; k++) {
        int rc = wf_session_run(f.s, &feed, 1, NULL, 0, NULL, step, 2);
        cr_assert_eq(rc, 0, "%s", wf_session_errmsg(f.s));
    }
    for (int i = 0; i < 2; i++) {
        wf_tensor *v = NULL;
        cr_assert_eq(wf_session_variable(f.s, counters[i], &v), 0);
        cr_assert_eq(wf_tensor_get(v, 0), 3.0, "%s is %g after 3 steps", wf_node_name(counters[i]),
                     wf_tensor_get(v, 0));
        wf_tensor_release(v);
    }
    wf_tensor_release(tx);
    fixture_fini(&f);
}

Test(examples_train_gpt, config_check_rejects_d_model_not_a_multiple_of_heads)
{
    char err[256] = "";
    gpt_config c = { .vocab = 10, .context = 8, .d_model = 10, .heads = 4, .layers = 1 };
    cr_assert_eq(gpt_config_check(&c, err, sizeof err), WF_EINVAL);
    cr_assert(strstr(err, "d_model 10, heads 4"), "message: %s", err);
    c.d_model = 12;
    c.layers = GPT_MAX_LAYERS + 1;
    cr_assert_eq(gpt_config_check(&c, err, sizeof err), WF_EINVAL);
    cr_assert(strstr(err, "layers"), "message: %s", err);
    c.layers = 1;
    c.vocab = 1;
    cr_assert_eq(gpt_config_check(&c, err, sizeof err), WF_EINVAL);
    cr_assert(strstr(err, "vocabulary"), "message: %s", err);
}

Test(examples_train_gpt, a_sequence_longer_than_the_context_fails_naming_shapes)
{
    gpt_config c = { .vocab = 5, .context = 4, .d_model = 8, .heads = 2, .layers = 1 };
    char err[256] = "";
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    gpt_model m;
    cr_assert_eq(gpt_build(g, &c, &m, err, sizeof err), 0, "%s", err);
    wf_node *x = wf_placeholder(g, "x", WF_I32, WF_SHAPE(2, 6));
    cr_assert_null(gpt_logits(g, &m, x, false));
    cr_assert_eq(wf_graph_status(g), WF_ESHAPE, "%s", wf_graph_errmsg(g));
    cr_assert(strstr(wf_graph_errmsg(g), "[2, 6, 8]") && strstr(wf_graph_errmsg(g), "[4, 8]"),
              "message: %s", wf_graph_errmsg(g));
    wf_graph_destroy(g);
}
