/* tests/runtime/test_mirrored.c: the Mirrored strategy (weft/distribute.h,
 * wf_strategy_mirrored()): one process, one replica per device, here the simulated devices
 * (wf_strategy_opts.simulated_devices: memory of their own, the CPU kernels, copies and
 * completions from an actor, so a value read before its copy landed would be stale).
 * Checked: an MLP and a CNN trained on 2 and 3 devices give the bytes (per-step losses and
 * final weights) of the single-process run with the same shards (wf_strategy_multiworker()
 * without a communicator), and follow plain training within 1e-6 relative per step; 3
 * devices with a batch they do not divide (row-weighted mean), 6 shards over 3 devices, and
 * the other aggregations (sum, shard mean) give the same bytes as the single-process run;
 * the replicas' nodes really run on their devices (the plan's dump); bad input (zero
 * devices, a device that does not exist or is given twice, too few shards, an eager graph,
 * another runtime's strategy, device options given to MultiWorkerMirrored) is refused naming it.
 * Synthetic batches: the same rows for every run of a test. */
#include "runtime_util.h"

#include <weft/distribute.h>
#include <weft/nn.h>

#include <math.h>

TestSuite(runtime_mirrored, .init = wf_test_rt_setup, .fini = wf_test_rt_teardown,
          .timeout = WF_TEST_TIMEOUT(120));

#define IN      48
#define HID     24
#define OUT     10
#define MAXSTEP 24
#define MAXW    (IN * HID + HID + HID * OUT + OUT + 1024)
#define IMG     8 /* the CNN's images: 1 x 8 x 8 */

typedef struct model {
    wf_graph *g;
    wf_node *x, *y, *loss, *train, *vars[6];
    int n_vars;
    bool cnn;
} model;

typedef struct result {
    int steps;
    float loss[MAXSTEP];
    float w[MAXW];
    size_t n_w;
} result;

/* An MLP (IN-HID-OUT) or a CNN (conv 3x3 x4 + ReLU + max pool 2, then a linear layer); the
 * loss a mean over rows, or with 'sum_loss' a sum. */
static void build(model *m, bool cnn, bool sum_loss)
{
    memset(m, 0, sizeof *m);
    m->cnn = cnn;
    wf_graph *g = m->g = wf_graph_create(rt, WF_STATIC);
    cr_assert_not_null(g);
    wf_node *logits;
    if (cnn) {
        m->x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(-1, 1, IMG, IMG));
        m->vars[0] = wf_variable(g, "k1", WF_F32, WF_SHAPE(4, 1, 3, 3), wf_init_glorot_uniform(3));
        m->vars[1] = wf_variable(g, "c1", WF_F32, WF_SHAPE(4), wf_init_zeros());
        m->vars[2] = wf_variable(g, "w", WF_F32, WF_SHAPE(4 * (IMG / 2) * (IMG / 2), OUT),
                                 wf_init_glorot_uniform(4));
        m->vars[3] = wf_variable(g, "b", WF_F32, WF_SHAPE(OUT), wf_init_zeros());
        m->n_vars = 4;
        const wf_conv2d_opts same = { .padding = { 1, 1, 1, 1 } };
        const wf_pool2d_opts pool = { .window = { 2, 2 } };
        wf_node *h = wf_add(g, wf_conv2d(g, m->x, m->vars[0], &same),
                            wf_reshape(g, m->vars[1], WF_SHAPE(4, 1, 1)));
        h = wf_max_pool2d(g, wf_relu(g, h), &pool);
        h = wf_reshape(g, h, WF_SHAPE(-1, 4 * (IMG / 2) * (IMG / 2)));
        logits = wf_add(g, wf_matmul(g, h, m->vars[2]), m->vars[3]);
    } else {
        m->x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(-1, IN));
        m->vars[0] = wf_variable(g, "w1", WF_F32, WF_SHAPE(IN, HID), wf_init_glorot_uniform(1));
        m->vars[1] = wf_variable(g, "b1", WF_F32, WF_SHAPE(HID), wf_init_zeros());
        m->vars[2] = wf_variable(g, "w2", WF_F32, WF_SHAPE(HID, OUT), wf_init_glorot_uniform(2));
        m->vars[3] = wf_variable(g, "b2", WF_F32, WF_SHAPE(OUT), wf_init_zeros());
        m->n_vars = 4;
        wf_node *h = wf_relu(g, wf_add(g, wf_matmul(g, m->x, m->vars[0]), m->vars[1]));
        logits = wf_add(g, wf_matmul(g, h, m->vars[2]), m->vars[3]);
    }
    m->y = wf_placeholder(g, "y", WF_I32, WF_SHAPE(-1));
    wf_node *ce = wf_softmax_cross_entropy(g, logits, m->y);
    m->loss = sum_loss ? wf_sum(g, ce) : wf_mean(g, ce);
    m->train = wf_minimize(g, wf_adam(1e-2), m->loss);
    cr_assert_not_null(m->train, "%s", wf_graph_errmsg(g));
}

static int64_t row_len(const model *m)
{
    return m->cnn ? IMG * IMG : IN;
}

/* The global batch of step 's'. */
static void batch_of(const model *m, int s, int rows, float *x, int32_t *y)
{
    int64_t c = row_len(m);
    for (int i = 0; i < rows; i++) {
        for (int64_t j = 0; j < c; j++)
            x[i * c + j] = sinf(0.37f * (float)(i * c + j) + 1.3f * (float)s);
        y[i] = (i * 7 + s * 3) % OUT;
    }
}

/* Trains 'steps' steps of batch 'rows' under 'st' (NULL: a plain session). */
static void train(const model *m, const wf_strategy *st, int steps, int rows, result *r)
{
    wf_session *s = NULL;
    int rc = wf_session_create(m->g, &(wf_session_opts){ .strategy = st }, &s);
    cr_assert_eq(rc, 0, "%s: %s", wf_err_name(rc), wf_graph_errmsg(m->g));
    int64_t c = row_len(m);
    float *x = malloc(sizeof(float) * (size_t)(rows * c));
    int32_t *y = malloc(sizeof(int32_t) * (size_t)rows);
    cr_assert(x && y);
    r->steps = steps;
    wf_shape xs = m->cnn ? WF_SHAPE(rows, 1, IMG, IMG) : WF_SHAPE(rows, IN);
    for (int step = 0; step < steps; step++) {
        batch_of(m, step, rows, x, y);
        wf_tensor *xt = wf_tensor_from(WF_F32, xs, x);
        wf_tensor *yt = wf_tensor_from(WF_I32, WF_SHAPE(rows), y);
        wf_feed f[] = { { m->x, xt }, { m->y, yt } };
        wf_tensor *out = NULL;
        rc = wf_session_run(s, f, 2, &m->loss, 1, &out, &m->train, 1);
        wf_tensor_release(xt);
        wf_tensor_release(yt);
        cr_assert_eq(rc, 0, "step %d: %s: %s", step, wf_err_name(rc), wf_session_errmsg(s));
        r->loss[step] = wf_tensor_data_f32(out)[0];
        wf_tensor_release(out);
    }
    r->n_w = 0;
    for (int k = 0; k < m->n_vars; k++) {
        wf_tensor *v = NULL;
        cr_assert_eq(wf_session_variable(s, m->vars[k], &v), 0);
        size_t n = (size_t)wf_shape_numel(wf_tensor_shape(v));
        cr_assert(r->n_w + n <= MAXW);
        cr_assert_eq(wf_tensor_read(v, WF_F32, r->w + r->n_w, n * sizeof(float)), 0);
        r->n_w += n;
        wf_tensor_release(v);
    }
    free(x);
    free(y);
    wf_session_destroy(s);
}

static wf_strategy *mirrored(int devices, int shards, int agg)
{
    wf_strategy *st = NULL;
    int rc = wf_strategy_mirrored(
        rt,
        &(wf_strategy_opts){ .simulated_devices = devices, .shards = shards, .aggregation = agg },
        &st);
    cr_assert_eq(rc, 0, "%s: %s", wf_err_name(rc), wf_last_errmsg());
    cr_assert_eq(wf_strategy_device_count(st), devices);
    cr_assert_eq(wf_strategy_size(st), 1);
    return st;
}

static wf_strategy *single(int shards, int agg)
{
    wf_strategy *st = NULL;
    int rc = wf_strategy_multiworker(
        NULL, &(wf_strategy_opts){ .shards = shards, .aggregation = agg }, &st);
    cr_assert_eq(rc, 0, "%s", wf_last_errmsg());
    return st;
}

/* Trains a fresh model of the kind under 'st' (NULL: plain). */
static void train_fresh(bool cnn, bool sum_loss, const wf_strategy *st, int steps, int rows,
                        result *r)
{
    model m;
    build(&m, cnn, sum_loss);
    train(&m, st, steps, rows, r);
    wf_graph_destroy(m.g);
}

static void assert_bitwise(const result *a, const result *b, const char *what)
{
    for (int s = 0; s < a->steps; s++)
        cr_assert(!memcmp(&a->loss[s], &b->loss[s], sizeof(float)),
                  "%s: step %d: loss %.9g vs %.9g", what, s, a->loss[s], b->loss[s]);
    cr_assert_eq(a->n_w, b->n_w);
    for (size_t i = 0; i < a->n_w; i++)
        cr_assert(!memcmp(&a->w[i], &b->w[i], sizeof(float)), "%s: weight %zu: %.9g vs %.9g", what,
                  i, a->w[i], b->w[i]);
}

static void assert_close(const result *a, const result *b, const char *what)
{
    for (int s = 0; s < a->steps; s++) {
        double d = fabs((double)a->loss[s] - (double)b->loss[s]);
        cr_assert(d <= 1e-6 * fabs((double)b->loss[s]),
                  "%s: step %d: loss %.9g vs %.9g (%.3g relative)", what, s, a->loss[s], b->loss[s],
                  d / fabs((double)b->loss[s]));
    }
}

/* Mirrored on 'devices' devices with 'shards' shards against the single-process run with
 * those shards (bytes) and, for a mean loss, plain training (1e-6 relative per step). */
static void check(bool cnn, int devices, int shards, int agg, bool sum_loss, int steps, int rows)
{
    static result mir, one, plain;
    wf_strategy *sm = mirrored(devices, shards, agg);
    wf_strategy *s1 = single(shards ? shards : devices, agg);
    train_fresh(cnn, sum_loss, sm, steps, rows, &mir);
    train_fresh(cnn, sum_loss, s1, steps, rows, &one);
    char what[96];
    snprintf(what, sizeof what, "%s, %d devices x %d shards vs one process", cnn ? "cnn" : "mlp",
             devices, shards ? shards : devices);
    assert_bitwise(&mir, &one, what);
    if (agg == WF_AGG_MEAN && !sum_loss) {
        train_fresh(cnn, sum_loss, NULL, steps, rows, &plain);
        snprintf(what, sizeof what, "%s, %d devices vs plain training", cnn ? "cnn" : "mlp",
                 devices);
        assert_close(&mir, &plain, what);
    }
    wf_strategy_destroy(sm);
    wf_strategy_destroy(s1);
}

Test(runtime_mirrored, mlp_on_two_devices_equals_two_shards_bitwise_and_follows_plain_training)
{
    check(false, 2, 0, WF_AGG_MEAN, false, 20, 32);
}

Test(runtime_mirrored, mlp_on_three_devices_equals_three_shards_bitwise_and_follows_plain)
{
    check(false, 3, 0, WF_AGG_MEAN, false, 20, 33);
}

Test(runtime_mirrored, cnn_on_two_and_three_devices_equals_the_shards_bitwise)
{
    check(true, 2, 0, WF_AGG_MEAN, false, 8, 16);
    check(true, 3, 0, WF_AGG_MEAN, false, 8, 18);
}

Test(runtime_mirrored, an_uneven_batch_on_three_devices_is_the_row_weighted_mean)
{
    /* 10 rows: shards of 4, 3 and 3 rows, weighted 0.4, 0.3, 0.3 */
    check(false, 3, 0, WF_AGG_MEAN, false, 12, 10);
    check(true, 3, 0, WF_AGG_MEAN, false, 6, 10);
}

Test(runtime_mirrored, six_shards_over_three_devices_equal_six_shards_in_one_process)
{
    check(false, 3, 6, WF_AGG_MEAN, false, 12, 32);
}

Test(runtime_mirrored, the_sum_and_shard_mean_aggregations_equal_one_process_bitwise)
{
    check(false, 2, 0, WF_AGG_SUM, true, 10, 24);
    check(false, 3, 0, WF_AGG_SHARD_MEAN, false, 10, 24);
}

/* How many lines of the plan's text dump run on 'dev'. */
static int lines_on(const char *dump, const char *dev)
{
    int n = 0;
    char pat[32];
    snprintf(pat, sizeof pat, " on %s ", dev);
    for (const char *p = dump; (p = strstr(p, pat)); p++)
        n++;
    return n;
}

Test(runtime_mirrored, each_replica_runs_on_its_device_and_the_update_on_the_host)
{
    model m;
    build(&m, false, false);
    wf_strategy *st = mirrored(3, 0, WF_AGG_MEAN);
    wf_session *s = NULL;
    cr_assert_eq(wf_session_create(m.g, &(wf_session_opts){ .strategy = st }, &s), 0, "%s",
                 wf_graph_errmsg(m.g));
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    cr_assert_not_null(f);
    int rc = wf_session_dump(s, &m.loss, 1, &m.train, 1, f, WF_DUMP_TEXT);
    fclose(f);
    cr_assert_eq(rc, 0, "%s", wf_session_errmsg(s));
    int on[3];
    for (int d = 0; d < 3; d++) {
        char dev[32];
        snprintf(dev, sizeof dev, "device %d", wf_device_count(rt) + d);
        on[d] = lines_on(buf, dev);
    }
    /* every replica computes the same nodes (forward, loss, backward) on its own device */
    cr_assert(on[0] >= 10 && on[1] == on[0] && on[2] == on[0], "nodes on the devices: %d %d %d\n%s",
              on[0], on[1], on[2], buf);
    /* the reductions and the updates are not placed: the host */
    cr_assert_not_null(strstr(buf, "dp_reduce"), "%s", buf);
    for (const char *p = buf; (p = strstr(p, "= dp_reduce(")); p++) {
        const char *eol = strchr(p, '\n');
        const char *at = strstr(p, " on cpu ");
        cr_assert(at && (!eol || at < eol), "a reduction is not on the host:\n%.200s", p);
    }
    free(buf);
    wf_session_destroy(s);
    wf_strategy_destroy(st);
    wf_graph_destroy(m.g);
}

static void assert_refused(int rc, int want, const char *needle)
{
    cr_assert_eq(rc, want, "got %s: %s", wf_err_name(rc), wf_last_errmsg());
    cr_assert_not_null(strstr(wf_last_errmsg(), needle), "'%s' not in: %s", needle,
                       wf_last_errmsg());
}

Test(runtime_mirrored, bad_devices_and_options_are_refused_naming_them)
{
    wf_strategy *st = (wf_strategy *)&st; /* set to NULL by every failed call */
    if (wf_device_count(rt) <= 1) {       /* no GPU: zero devices without simulated ones */
        assert_refused(wf_strategy_mirrored(rt, NULL, &st), WF_EINVAL, "zero devices");
        cr_assert_null(st);
        assert_refused(wf_strategy_mirrored(
                           rt, &(wf_strategy_opts){ .devices = (int[]){ 1 }, .n_devices = 1 }, &st),
                       WF_EINVAL, "device 1 (entry 0) does not exist");
    }
    assert_refused(wf_strategy_mirrored(rt,
                                        &(wf_strategy_opts){ .simulated_devices = 2,
                                                             .devices = (int[]){ 0, 5 },
                                                             .n_devices = 2 },
                                        &st),
                   WF_EINVAL, "device 5 (entry 1) does not exist");
    assert_refused(wf_strategy_mirrored(rt,
                                        &(wf_strategy_opts){ .simulated_devices = 2,
                                                             .devices = (int[]){ 1, 1 },
                                                             .n_devices = 2 },
                                        &st),
                   WF_EINVAL, "simulated device 1 is given twice");
    assert_refused(wf_strategy_mirrored(
                       rt, &(wf_strategy_opts){ .simulated_devices = 2, .n_devices = 3 }, &st),
                   WF_EINVAL, "device 2 (entry 2) does not exist");
    assert_refused(
        wf_strategy_mirrored(rt, &(wf_strategy_opts){ .simulated_devices = 3, .shards = 2 }, &st),
        WF_EINVAL, "shards is 2");
    assert_refused(wf_strategy_mirrored(
                       rt, &(wf_strategy_opts){ .simulated_devices = 2, .aggregation = 7 }, &st),
                   WF_EINVAL, "unknown aggregation 7");
    assert_refused(wf_strategy_mirrored(NULL, NULL, &st), WF_EINVAL, "rt is NULL");
    assert_refused(
        wf_strategy_multiworker(NULL, &(wf_strategy_opts){ .simulated_devices = 2 }, &st),
        WF_EINVAL, "the device options are Mirrored's");
    cr_assert_null(st);
    cr_assert_eq(wf_strategy_device_count(NULL), WF_EINVAL);
}

Test(runtime_mirrored, an_eager_graph_or_another_runtime_fails_session_creation_naming_it)
{
    wf_strategy *st = mirrored(2, 0, WF_AGG_MEAN);
    /* an eager graph (which takes constants, not placeholders: nothing to shard) */
    wf_graph *eg = wf_graph_create(rt, WF_EAGER);
    cr_assert_not_null(wf_add(eg, wf_scalar(eg, WF_F32, 1.0), wf_scalar(eg, WF_F32, 2.0)));
    wf_session *s = (wf_session *)&s;
    int rc = wf_session_create(eg, &(wf_session_opts){ .strategy = st }, &s);
    cr_assert_eq(rc, WF_EINVAL, "got %s", wf_err_name(rc));
    cr_assert_null(s);
    cr_assert_not_null(strstr(wf_graph_errmsg(eg), "the graph is eager"), "%s",
                       wf_graph_errmsg(eg));
    wf_graph_destroy(eg);
    model m;

    /* another runtime's strategy */
    wf_runtime *other =
        wf_test_runtime(&(wf_runtime_opts){ .n_workers = 1, .flags = WF_RT_NO_PIN });
    wf_strategy *so = NULL;
    cr_assert_eq(wf_strategy_mirrored(other, &(wf_strategy_opts){ .simulated_devices = 2 }, &so),
                 0);
    build(&m, false, false);
    rc = wf_session_create(m.g, &(wf_session_opts){ .strategy = so }, &s);
    cr_assert_eq(rc, WF_EINVAL, "got %s", wf_err_name(rc));
    cr_assert_not_null(strstr(wf_graph_errmsg(m.g), "another runtime"), "%s", wf_graph_errmsg(m.g));
    wf_graph_destroy(m.g);
    wf_strategy_destroy(so);
    wf_runtime_destroy(other);
    wf_strategy_destroy(st);
}
