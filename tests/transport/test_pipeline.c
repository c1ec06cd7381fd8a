/* tests/transport/test_pipeline.c: pipeline training (wf_strategy_pipeline(), weft/
 * distribute.h) on real processes: an MLP 64-32-32-10 with Adam, a CNN (two convolutions and
 * a linear layer) and the GPT of examples/train_gpt (2 blocks, AdamW, gradients clipped by
 * their global norm across the stages), each split in 2 stages on 2 ranks (and in 3 on 3),
 * m = 4 micro-batches, GPipe and 1F1B, trains bit for bit as one process
 * with the MultiWorkerMirrored strategy and 4 shards (per-step losses and the final weights'
 * bytes, and the losses of forward-only runs between steps, which send no gradients), and
 * within 1e-6 relative of plain single-process training; every stage fetches the loss (the
 * global value); the schedule's order shows in a trace (1F1B: micro-batch 0's forward and
 * backward before micro-batch 1's forward; GPipe: every forward first); bad options (more stages
 * than ranks, m < 1, a hint naming a rank that does not exist, a variable read on two stages)
 * fail at creation naming what is wrong; a killed stage fails the other's run within 2 s with
 * WF_EPEER naming it.
 * Ranks are processes on loopback (transport_util.h); each writes what it saw (its stage's
 * weights, and the losses every stage fetched, which are equal) to a file the test reads. The
 * reference runs (no communicator) run in the test's own process. */
#include "strategy_util.h"
#include "transport_util.h"

#include <weft/placement.h>

#ifdef WF_TEST_HAVE_GPT
#    include <train_gpt/gpt_model.h>
#endif

#include <fcntl.h>
#include <math.h>

TestSuite(transport_pipeline, .timeout = WF_TEST_TIMEOUT(240), .fini = wf_test_fini);

#define IN      64
#define HID     32
#define OUT     10
#define NVARS   6
#define MAXSTEP 32

enum { M_TRAIN, M_KILL, M_SHARED_VAR };

/* The models the equivalence tests train: the MLP above, a CNN (conv 1->4 + ReLU + max pool,
 * conv 4->8 + ReLU, linear 128->10 on 8x8 images: a layer per stage with 3 stages, conv1 and
 * the rest with 2) and the GPT of examples/train_gpt (2 blocks; block k on its stage, the
 * embeddings on stage 0, the head on the last; AdamW and Adam groups, gradients clipped by
 * their global norm across the stages). */
enum { NET_MLP, NET_CNN, NET_GPT };

#define MAXW    16384 /* floats of every model's weights */
#define MAXVARS 64
#define GPT_V   16
#define GPT_T   8

typedef struct pp_arg {
    int mode, model;
    int stages, micro, schedule, steps, batch;
    int ready_fd;   /* M_KILL: each rank writes a byte once its session is made */
    char path[160]; /* rank r writes "<path>.<r>" */
} pp_arg;

typedef struct pp_result {
    int steps, nw;
    float loss[MAXSTEP];
    float eval[MAXSTEP]; /* after every 4th step: the loss of a forward-only run */
    float w[MAXW];
} pp_result;

/* The global batch of step 's': the same on every rank. */
static void batch_of(int s, int rows, float *x, int32_t *y)
{
    tu_batch_of(s, rows, IN, OUT, x, y);
}

typedef struct mlp {
    wf_graph *g;
    wf_node *x, *y, *loss, *train, *vars[NVARS];
    int owner[NVARS]; /* the stage of each variable */
} mlp;

/* Stage of layer 'l' (0, 1, 2) with 'stages' stages. */
static int layer_stage(int l, int stages)
{
    return stages == 3 ? l : stages == 2 ? (l == 0 ? 0 : 1) : 0;
}

static int scope(wf_place_hints *h, const wf_graph *g, int stage)
{
    char dev[32];
    snprintf(dev, sizeof dev, "rank:%d/cpu:0", stage);
    return h ? wf_place_scope_begin(h, g, dev) : 0;
}

static int scope_end(wf_place_hints *h, const wf_graph *g)
{
    return h ? wf_place_scope_end(h, g) : 0;
}

/* The MLP; with 'h', each layer in a scope of its stage. M_SHARED_VAR: layer 2 also reads
 * layer 0's weight w1 (a variable read on two stages). */
static int mlp_build(wf_runtime *rt, mlp *m, wf_place_hints *h, int stages, int mode)
{
    wf_graph *g = m->g = wf_graph_create(rt, WF_STATIC);
    m->x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(-1, IN));
    m->y = wf_placeholder(g, "y", WF_I32, WF_SHAPE(-1));
    static const int dims[4] = { IN, HID, HID, OUT };
    for (int l = 0; l < 3; l++) {
        char name[16];
        snprintf(name, sizeof name, "w%d", l + 1);
        m->vars[2 * l] = wf_variable(g, name, WF_F32, WF_SHAPE(dims[l], dims[l + 1]),
                                     wf_init_glorot_uniform((uint64_t)l + 1));
        snprintf(name, sizeof name, "b%d", l + 1);
        m->vars[2 * l + 1] = wf_variable(g, name, WF_F32, WF_SHAPE(dims[l + 1]), wf_init_zeros());
        m->owner[2 * l] = m->owner[2 * l + 1] = layer_stage(l, stages);
    }
    wf_node *a = m->x;
    for (int l = 0; l < 3; l++) {
        if (scope(h, g, layer_stage(l, stages)) < 0)
            return -1;
        a = wf_add(g, wf_matmul(g, a, m->vars[2 * l]), m->vars[2 * l + 1]);
        if (l == 2 && mode == M_SHARED_VAR)
            a = wf_add(g, a, wf_mul(g, wf_sum(g, m->vars[0]), wf_scalar(g, WF_F32, 1e-3)));
        if (l < 2)
            a = wf_relu(g, a);
        else if (wf_node_set_name(a, "logits") < 0)
            return -1;
        else
            m->loss = wf_mean(g, wf_softmax_cross_entropy(g, a, m->y));
        if (scope_end(h, g) < 0)
            return -1;
    }
    m->train = wf_minimize(g, wf_adam(1e-2), m->loss);
    return m->train ? 0 : -1;
}

/* Any of the models: its graph, feeds, loss, training targets and variables (each with the
 * stage that owns it). */
typedef struct net {
    int model;
    wf_graph *g;
    wf_node *x, *y, *loss, *train[2];
    int n_train, n_vars;
    wf_node *vars[MAXVARS];
    int owner[MAXVARS];
} net;

static int cnn_build(wf_runtime *rt, net *n, wf_place_hints *h, int stages)
{
    wf_graph *g = n->g = wf_graph_create(rt, WF_STATIC);
    n->x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(-1, 1, 8, 8));
    n->y = wf_placeholder(g, "y", WF_I32, WF_SHAPE(-1));
    static const wf_shape shapes[6] = { WF_SHAPE(4, 1, 3, 3), WF_SHAPE(4),
                                        WF_SHAPE(8, 4, 3, 3), WF_SHAPE(8),
                                        WF_SHAPE(OUT, 128),   WF_SHAPE(OUT) };
    for (int k = 0; k < 6; k++) {
        char name[16];
        snprintf(name, sizeof name, "%s%d", k % 2 ? "b" : "w", k / 2 + 1);
        n->vars[k] = wf_variable(g, name, WF_F32, shapes[k],
                                 k % 2 ? wf_init_zeros() : wf_init_glorot_uniform((uint64_t)k + 7));
        n->owner[k] = layer_stage(k / 2, stages);
    }
    n->n_vars = 6;
    const wf_conv2d_opts same = { .padding = { 1, 1, 1, 1 } };
    const wf_pool2d_opts pool = { .window = { 2, 2 } };
    wf_node *a = n->x;
    for (int l = 0; l < 3; l++) {
        if (scope(h, g, layer_stage(l, stages)) < 0)
            return -1;
        if (l < 2) {
            wf_node *b = wf_reshape(g, n->vars[2 * l + 1], WF_SHAPE(l ? 8 : 4, 1, 1));
            a = wf_relu(g, wf_add(g, wf_conv2d(g, a, n->vars[2 * l], &same), b));
            if (l == 0)
                a = wf_max_pool2d(g, a, &pool);
        } else {
            a = wf_reshape(g, a, WF_SHAPE(-1, 128));
            a = wf_add(g, wf_matmul_ex(g, a, n->vars[4], false, true), n->vars[5]);
            n->loss = wf_mean(g, wf_softmax_cross_entropy(g, a, n->y));
        }
        if (scope_end(h, g) < 0)
            return -1;
    }
    n->train[0] = wf_minimize(g, wf_adam(1e-2), n->loss);
    n->n_train = 1;
    return n->train[0] ? 0 : -1;
}

#ifdef WF_TEST_HAVE_GPT
static int gpt_net_build(wf_runtime *rt, net *n, wf_place_hints *h, int stages)
{
    wf_graph *g = n->g = wf_graph_create(rt, WF_STATIC);
    gpt_model m;
    char err[256];
    const gpt_config c = {
        .vocab = GPT_V, .context = GPT_T, .d_model = 16, .heads = 2, .layers = 2, .seed = 3
    };
    if (gpt_build(g, &c, &m, err, sizeof err) < 0 || m.n_params > MAXVARS)
        return -1;
    m.hints = h;
    m.stages = h ? stages : 0;
    n->x = wf_placeholder(g, "x", WF_I32, WF_SHAPE(-1, GPT_T));
    n->y = wf_placeholder(g, "y", WF_I32, WF_SHAPE(-1, GPT_T));
    wf_node *logits = gpt_logits(g, &m, n->x, true);
    if (gpt_stage_scope(g, &m, h ? stages - 1 : 0) < 0)
        return -1;
    n->loss = gpt_loss(g, logits, n->y);
    if (gpt_stage_scope(g, &m, -1) < 0 || !n->loss)
        return -1;
    gpt_train_opts to = { .lr = 1e-2, .weight_decay = 0.1, .clip_norm = 0.5 };
    if (gpt_train_step(g, &m, n->loss, &to, n->train) < 0)
        return -1;
    n->n_train = 2;
    n->n_vars = m.n_params;
    for (int i = 0; i < m.n_params; i++) {
        n->vars[i] = m.p[i];
        m.stages = stages;
        n->owner[i] = gpt_param_stage(&m, i);
    }
    return 0;
}
#endif

static int net_build(wf_runtime *rt, net *n, int model, wf_place_hints *h, int stages)
{
    *n = (net){ .model = model };
    if (model == NET_CNN)
        return cnn_build(rt, n, h, stages);
#ifdef WF_TEST_HAVE_GPT
    if (model == NET_GPT)
        return gpt_net_build(rt, n, h, stages);
#endif
    if (model != NET_MLP)
        return -1;
    mlp m;
    int rc = mlp_build(rt, &m, h, stages, M_TRAIN);
    n->g = m.g, n->x = m.x, n->y = m.y, n->loss = m.loss, n->train[0] = m.train;
    n->n_train = 1;
    n->n_vars = NVARS;
    memcpy(n->vars, m.vars, sizeof m.vars);
    memcpy(n->owner, m.owner, sizeof m.owner);
    return rc;
}

/* One run of 'n' on step 'step''s batch of 'rows' rows (the same on every rank): fetches the
 * loss; 'train' false: forward only. */
static int net_step(wf_session *s, const net *n, int rows, int step, bool train, float *loss)
{
    static float xf[256 * IN];
    static int32_t xi[256 * GPT_T], yi[256 * GPT_T];
    wf_tensor *xt, *yt;
    if (n->model == NET_GPT) {
        for (int i = 0; i < rows * GPT_T; i++) { /* a stream with a pattern to learn */
            xi[i] = (i * 5 + (i / GPT_T) * 3 + step * 7) % GPT_V;
            yi[i] = (xi[i] * 3 + 1) % GPT_V;
        }
        xt = wf_tensor_from(WF_I32, WF_SHAPE(rows, GPT_T), xi);
        yt = wf_tensor_from(WF_I32, WF_SHAPE(rows, GPT_T), yi);
    } else {
        tu_batch_of(step, rows, IN, OUT, xf, yi);
        xt = wf_tensor_from(WF_F32,
                            n->model == NET_CNN ? WF_SHAPE(rows, 1, 8, 8) : WF_SHAPE(rows, IN), xf);
        yt = wf_tensor_from(WF_I32, WF_SHAPE(rows), yi);
    }
    wf_feed f[] = { { n->x, xt }, { n->y, yt } };
    wf_tensor *out = NULL;
    int rc = wf_session_run(s, f, 2, &n->loss, 1, &out, n->train, train ? n->n_train : 0);
    wf_tensor_release(xt);
    wf_tensor_release(yt);
    if (rc == 0)
        *loss = wf_tensor_data_f32(out)[0];
    wf_tensor_release(out);
    return rc;
}

static int64_t var_numel(const net *n, int k)
{
    return wf_shape_numel(wf_node_shape(n->vars[k]));
}

/* Trains 'a->steps' steps with 'st' (NULL: a plain session); 'stage' is this process's
 * stage (-1: all of them: a reference run). Fills the losses and the weights of the stage's
 * variables. */
static int train(wf_runtime *rt, const wf_strategy *st, const pp_arg *a, int stage,
                 wf_place_hints *h, pp_result *res)
{
    net n;
    TU_CHECK(net_build(rt, &n, a->model, h, a->stages) == 0, "build: %s", wf_graph_errmsg(n.g));
    wf_session *s = NULL;
    TU_OK(wf_session_create(n.g, &(wf_session_opts){ .strategy = st }, &s));
    TU_CHECK(a->batch <= 256, "batch %d", a->batch);
    res->steps = a->steps;
    for (int step = 0; step < a->steps; step++) {
        int rc = net_step(s, &n, a->batch, step, true, &res->loss[step]);
        TU_CHECK(rc == 0, "stage %d, step %d: %s: %s", stage, step, wf_err_name(rc),
                 wf_session_errmsg(s));
        if (step % 4 == 3) { /* a forward-only run between steps: no backward, no update */
            rc = net_step(s, &n, a->batch, 1000 + step, false, &res->eval[step / 4]);
            TU_CHECK(rc == 0, "stage %d, evaluation after step %d: %s: %s", stage, step,
                     wf_err_name(rc), wf_session_errmsg(s));
        }
    }
    size_t off = 0;
    for (int k = 0; k < n.n_vars; k++) {
        size_t cnt = (size_t)var_numel(&n, k);
        TU_CHECK(off + cnt <= MAXW, "more than %d weights", MAXW);
        if (stage < 0 || n.owner[k] == stage) {
            wf_tensor *v = NULL;
            TU_OK(wf_session_variable(s, n.vars[k], &v));
            TU_OK(wf_tensor_read(v, WF_F32, res->w + off, cnt * sizeof(float)));
            wf_tensor_release(v);
        }
        off += cnt;
    }
    res->nw = (int)off;
    wf_session_destroy(s);
    wf_graph_destroy(n.g);
    return 0;
}

static int rank_train(wf_comm *c, int rank, int size, void *argp)
{
    (void)size;
    const pp_arg *a = argp;
    wf_place_hints *h = NULL;
    TU_OK(wf_place_hints_create(&h));
    wf_strategy *st = NULL;
    TU_OK(wf_strategy_pipeline(c,
                               &(wf_pipeline_opts){ .stages = a->stages,
                                                    .micro_batches = a->micro,
                                                    .schedule = a->schedule,
                                                    .batch_rows = a->batch,
                                                    .hints = h },
                               &st));
    pp_result *r = calloc(1, sizeof *r);
    TU_CHECK(r, "no memory");
    int rc = train(tu_rt, st, a, rank, h, r);
    if (rc == 0) {
        char path[200];
        snprintf(path, sizeof path, "%s.%d", a->path, rank);
        FILE *f = fopen(path, "wb");
        TU_CHECK(f, "open %s", path);
        TU_CHECK(fwrite(r, sizeof *r, 1, f) == 1, "write %s", path);
        fclose(f);
    }
    free(r);
    wf_strategy_destroy(st);
    wf_place_hints_destroy(h);
    return rc;
}
TU_REGISTER(rank_train)

/* The stages' files into one result: the last stage's losses, each variable from its own
 * stage. */
static void gather(const pp_arg *a, pp_result *out)
{
    net n;
    wf_runtime *rt = NULL;
    cr_assert_eq(wf_runtime_create(&rt, &(wf_runtime_opts){ .n_workers = 1 }), 0);
    cr_assert_eq(net_build(rt, &n, a->model, NULL, a->stages), 0);
    static pp_result part, losses[3];
    for (int r = 0; r < a->stages; r++) {
        char path[200];
        snprintf(path, sizeof path, "%s.%d", a->path, r);
        FILE *f = fopen(path, "rb");
        cr_assert_not_null(f, "no result from rank %d", r);
        cr_assert_eq(fread(&part, sizeof part, 1, f), 1);
        fclose(f);
        unlink(path);
        if (r == a->stages - 1) {
            out->steps = part.steps;
            out->nw = part.nw;
            memcpy(out->loss, part.loss, sizeof out->loss);
            memcpy(out->eval, part.eval, sizeof out->eval);
        }
        losses[r] = part; /* every stage fetched the loss: the global value, the same bits */
        size_t off = 0;
        for (int k = 0; k < n.n_vars; off += (size_t)var_numel(&n, k), k++)
            if (n.owner[k] == r)
                memcpy(out->w + off, part.w + off, sizeof(float) * (size_t)var_numel(&n, k));
    }
    for (int r = 0; r < a->stages; r++)
        cr_assert(!memcmp(losses[r].loss, out->loss, sizeof out->loss) &&
                      !memcmp(losses[r].eval, out->eval, sizeof out->eval),
                  "stage %d fetched other losses than the last stage", r);
    wf_graph_destroy(n.g);
    wf_runtime_destroy(rt);
}

static void run_pipeline(const pp_arg *arg, pp_result *r)
{
    pp_arg a = *arg;
    a.mode = M_TRAIN;
    snprintf(a.path, sizeof a.path, "/tmp/weft-pipeline-%d-%d%d%d", (int)getpid(), a.model,
             a.stages, a.schedule);
    tu_run t = { .size = a.stages,
                 .body = rank_train,
                 .arg = &a,
                 .arg_size = sizeof a,
                 .timeout_s = WF_TEST_TIMEOUT(60),
                 .with_rt = true };
    uint64_t t0 = wf_test_now_ns();
    tu_start(&t);
    cr_assert(tu_wait(&t), "%d stages did not finish in time", a.stages);
    for (int i = 0; i < a.stages; i++)
        cr_assert(WIFEXITED(t.status[i]) && WEXITSTATUS(t.status[i]) == 0,
                  "rank %d of %d failed (status %d; its stderr says why)", i, a.stages,
                  t.status[i]);
    static const char *const names[] = { "mlp", "cnn", "gpt" };
    printf("pipeline %s, %d stages, m = %d, %s: %d steps in %.2f s\n", names[a.model], a.stages,
           a.micro, a.schedule == WF_SCHEDULE_1F1B ? "1f1b" : "gpipe", a.steps,
           (double)(wf_test_now_ns() - t0) * 1e-9);
    gather(&a, r);
}

/* The same in this process: 'shards' shards of MultiWorkerMirrored without a communicator,
 * or (0) a plain session. */
static void run_local(const pp_arg *arg, int shards, pp_result *r)
{
    wf_runtime *rt = NULL;
    cr_assert_eq(wf_runtime_create(&rt, &(wf_runtime_opts){ .n_workers = 2 }), 0);
    pp_arg a = *arg;
    a.stages = 1;
    wf_strategy *st = NULL;
    if (shards)
        cr_assert_eq(wf_strategy_multiworker(NULL, &(wf_strategy_opts){ .shards = shards }, &st), 0,
                     "%s", wf_last_errmsg());
    cr_assert_eq(train(rt, st, &a, -1, NULL, r), 0, "the local run failed");
    wf_strategy_destroy(st);
    wf_runtime_destroy(rt);
}

static void assert_close(const pp_result *a, const pp_result *b, const char *what)
{
    for (int s = 0; s < a->steps; s++) {
        double d = fabs((double)a->loss[s] - (double)b->loss[s]);
        cr_assert(d <= 1e-6 * fabs((double)b->loss[s]),
                  "%s: step %d: loss %.9g vs %.9g (%.3g relative)", what, s, a->loss[s], b->loss[s],
                  d / fabs((double)b->loss[s]));
    }
    double d2 = 0, n2 = 0, worst = 0;
    for (int i = 0; i < a->nw; i++) {
        double d = fabs((double)a->w[i] - (double)b->w[i]);
        double scale = fabs((double)b->w[i]) > 1e-3 ? fabs((double)b->w[i]) : 1e-3;
        worst = d / scale > worst ? d / scale : worst;
        d2 += d * d;
        n2 += (double)b->w[i] * b->w[i];
    }
    printf("%s: weights differ by %.3g (norm) relative, at most %.3g per element\n", what,
           sqrt(d2 / n2), worst);
    cr_assert(sqrt(d2 / n2) <= 1e-6, "%s: the weights differ by %.3g relative", what,
              sqrt(d2 / n2));
}

static void assert_bitwise(const pp_result *a, const pp_result *b, const char *what)
{
    cr_assert(a->nw == b->nw && a->nw > 0, "%s: %d weights vs %d", what, a->nw, b->nw);
    for (int s = 0; s < a->steps; s++)
        cr_assert(!memcmp(&a->loss[s], &b->loss[s], sizeof(float)),
                  "%s: step %d: loss %.9g vs %.9g", what, s, a->loss[s], b->loss[s]);
    for (int k = 0; k < a->steps / 4; k++)
        cr_assert(!memcmp(&a->eval[k], &b->eval[k], sizeof(float)),
                  "%s: evaluation %d: loss %.9g vs %.9g", what, k, a->eval[k], b->eval[k]);
    for (int i = 0; i < a->nw; i++)
        cr_assert(!memcmp(&a->w[i], &b->w[i], sizeof(float)), "%s: weight %d: %.9g vs %.9g", what,
                  i, a->w[i], b->w[i]);
}

/* 'model' in 'stages' stages, m = 4, 12 steps of 30 rows (micro-batches of 8, 8, 7 and 7):
 * the bits of one process with 4 shards, and close to plain training. */
static void check_model(int model, int stages, int schedule)
{
    static pp_result pipe, local, plain;
    pp_arg a = {
        .model = model, .stages = stages, .micro = 4, .schedule = schedule, .steps = 12, .batch = 30
    };
    run_pipeline(&a, &pipe);
    run_local(&a, 4, &local);
    run_local(&a, 0, &plain);
    assert_bitwise(&pipe, &local, "pipeline vs one process with 4 shards");
    assert_close(&pipe, &plain, "pipeline vs plain training");
}

static void check_schedule(int stages, int schedule)
{
    check_model(NET_MLP, stages, schedule);
}

Test(transport_pipeline, two_stages_gpipe_train_the_bits_of_one_process_with_4_shards)
{
    check_schedule(2, WF_SCHEDULE_GPIPE);
}

Test(transport_pipeline, two_stages_1f1b_train_the_bits_of_one_process_with_4_shards)
{
    check_schedule(2, WF_SCHEDULE_1F1B);
}

Test(transport_pipeline, three_stages_1f1b_train_the_bits_of_one_process_with_4_shards)
{
    check_schedule(3, WF_SCHEDULE_1F1B);
}

Test(transport_pipeline, three_stages_gpipe_train_the_bits_of_one_process_with_4_shards)
{
    check_schedule(3, WF_SCHEDULE_GPIPE);
}

Test(transport_pipeline, a_cnn_in_two_stages_gpipe_trains_the_bits_of_4_shards)
{
    check_model(NET_CNN, 2, WF_SCHEDULE_GPIPE);
}

Test(transport_pipeline, a_cnn_in_two_stages_1f1b_trains_the_bits_of_4_shards)
{
    check_model(NET_CNN, 2, WF_SCHEDULE_1F1B);
}

Test(transport_pipeline, a_cnn_in_three_stages_1f1b_trains_the_bits_of_4_shards)
{
    check_model(NET_CNN, 3, WF_SCHEDULE_1F1B);
}

#ifdef WF_TEST_HAVE_GPT
Test(transport_pipeline, the_gpt_in_two_stages_gpipe_trains_the_bits_of_4_shards)
{
    check_model(NET_GPT, 2, WF_SCHEDULE_GPIPE);
}

Test(transport_pipeline, the_gpt_in_two_stages_1f1b_trains_the_bits_of_4_shards)
{
    check_model(NET_GPT, 2, WF_SCHEDULE_1F1B);
}

Test(transport_pipeline, the_gpt_in_three_stages_1f1b_trains_the_bits_of_4_shards)
{
    check_model(NET_GPT, 3, WF_SCHEDULE_1F1B);
}
#endif

/* The task spans of a Chrome trace whose node names have "/mb<k>": (k, start, end, is the
 * logits: the last of the forward). */
typedef struct mb_span {
    int mb;
    bool logits;
    double ts, end;
} mb_span;

static int mb_spans(const char *buf, mb_span *out, int cap)
{
    int n = 0;
    for (const char *p = strstr(buf, "{\"name\":\""); p && n < cap;
         p = strstr(p + 1, "{\"name\":\"")) {
        const char *e = strstr(p, "}}"), *cat = strstr(p, "\"cat\":\"task\"");
        const char *ts = strstr(p, "\"ts\":"), *dur = strstr(p, "\"dur\":");
        if (!e || !cat || !ts || !dur || cat > e || ts > e || dur > e)
            continue;
        char name[64];
        if (sscanf(p + 9, "%63[^\"]", name) != 1)
            continue;
        const char *mb = strstr(name, "/mb");
        if (!mb)
            continue;
        mb_span *sp = &out[n++];
        sp->mb = atoi(mb + 3);
        sp->logits = !strncmp(name, "logits/", 7);
        sp->ts = strtod(ts + 5, NULL);
        sp->end = sp->ts + strtod(dur + 6, NULL);
    }
    return n;
}

/* One stage (this process), m = 4, one step traced: under 1F1B every task of micro-batch 0
 * (forward and backward) ends before any of micro-batch 1 starts; under GPipe a task of
 * micro-batch 0 (its backward) starts after micro-batch 3's logits (its forward) end. */
static void check_order(int schedule)
{
    wf_runtime *rt = NULL;
    cr_assert_eq(
        wf_runtime_create(&rt, &(wf_runtime_opts){ .n_workers = 2, .trace_events = 1 << 14 }), 0);
    wf_strategy *st = NULL;
    cr_assert_eq(
        wf_strategy_pipeline(
            NULL, &(wf_pipeline_opts){ .micro_batches = 4, .schedule = schedule, .batch_rows = 64 },
            &st),
        0, "%s", wf_last_errmsg());
    mlp m;
    cr_assert_eq(mlp_build(rt, &m, NULL, 1, M_TRAIN), 0);
    wf_session *s = NULL;
    cr_assert_eq(wf_session_create(m.g, &(wf_session_opts){ .strategy = st }, &s), 0, "%s",
                 wf_last_errmsg());
    static float x[64 * IN];
    int32_t y[64];
    batch_of(0, 64, x, y);
    wf_tensor *xt = wf_tensor_from(WF_F32, WF_SHAPE(64, IN), x);
    wf_tensor *yt = wf_tensor_from(WF_I32, WF_SHAPE(64), y);
    wf_feed f[] = { { m.x, xt }, { m.y, yt } };
    int rc = wf_session_run(s, f, 2, NULL, 0, NULL, &m.train, 1);
    cr_assert_eq(rc, 0, "%s: %s", wf_err_name(rc), wf_session_errmsg(s));
    char path[64];
    snprintf(path, sizeof path, "/tmp/weft-pipeline-order-%d.json", (int)getpid());
    cr_assert_gt(wf_runtime_trace_write(rt, path), 0, "%s", wf_last_errmsg());
    FILE *fp = fopen(path, "r");
    cr_assert_not_null(fp);
    static char buf[1 << 23];
    size_t len = fread(buf, 1, sizeof buf - 1, fp);
    buf[len] = 0;
    fclose(fp);
    unlink(path);
    static mb_span sp[1 << 14];
    int n = mb_spans(buf, sp, 1 << 14);
    double end0 = 0, start1 = 1e300, logits3_end = 0, last0_start = 0;
    int n0 = 0, n1 = 0;
    for (int i = 0; i < n; i++) {
        if (sp[i].mb == 0) {
            n0++;
            end0 = sp[i].end > end0 ? sp[i].end : end0;
            last0_start = sp[i].ts > last0_start ? sp[i].ts : last0_start;
        }
        if (sp[i].mb == 1) {
            n1++;
            start1 = sp[i].ts < start1 ? sp[i].ts : start1;
        }
        if (sp[i].mb == 3 && sp[i].logits)
            logits3_end = sp[i].end;
    }
    printf("%s: %d tasks of micro-batch 0 (last ends at %.1f us, last starts at %.1f us), %d of "
           "micro-batch 1 (first starts at %.1f us); micro-batch 3's logits end at %.1f us\n",
           schedule == WF_SCHEDULE_1F1B ? "1f1b" : "gpipe", n0, end0, last0_start, n1, start1,
           logits3_end);
    cr_assert(n0 > 4 && n1 > 4, "too few micro-batch tasks in the trace (%d, %d)", n0, n1);
    if (schedule == WF_SCHEDULE_1F1B)
        cr_assert(end0 <= start1, "1F1B: micro-batch 1 started (%.1f us) before 0 ended (%.1f us)",
                  start1, end0);
    else
        cr_assert(logits3_end > 0 && last0_start >= logits3_end,
                  "GPipe: micro-batch 0's last task starts at %.1f us, before micro-batch 3's "
                  "logits end (%.1f us)",
                  last0_start, logits3_end);
    wf_tensor_release(xt);
    wf_tensor_release(yt);
    wf_session_destroy(s);
    wf_graph_destroy(m.g);
    wf_strategy_destroy(st);
    wf_runtime_destroy(rt);
}

Test(transport_pipeline, one_f_one_b_runs_micro_batch_0_before_micro_batch_1_starts)
{
    check_order(WF_SCHEDULE_1F1B);
}

Test(transport_pipeline, gpipe_runs_every_forward_before_the_first_backward)
{
    check_order(WF_SCHEDULE_GPIPE);
}

/* A 2-stage pipeline of 4 micro-batches of 16 rows over 'c' ('*h', '*st') and its MLP
 * ('*m', 'mode'); returns wf_session_create()'s status (the session in '*s'). */
typedef struct pp_setup {
    wf_place_hints *h;
    wf_strategy *st;
    mlp m;
    wf_session *s;
} pp_setup;

static int setup_two(wf_comm *c, int mode, pp_setup *p)
{
    *p = (pp_setup){ 0 };
    TU_OK(wf_place_hints_create(&p->h));
    TU_OK(wf_strategy_pipeline(
        c, &(wf_pipeline_opts){ .stages = 2, .micro_batches = 4, .batch_rows = 16, .hints = p->h },
        &p->st));
    TU_CHECK(mlp_build(tu_rt, &p->m, p->h, 2, mode) == 0, "build: %s", wf_graph_errmsg(p->m.g));
    return wf_session_create(p->m.g, &(wf_session_opts){ .strategy = p->st }, &p->s);
}

static void setup_free(pp_setup *p)
{
    wf_session_destroy(p->s);
    wf_graph_destroy(p->m.g);
    wf_strategy_destroy(p->st);
    wf_place_hints_destroy(p->h);
}

/* Rank 1 makes its session and then waits to be killed; rank 0's run, whose backward waits
 * for rank 1's gradients, fails within 2 s naming it. */
static int rank_kill(wf_comm *c, int rank, int size, void *argp)
{
    (void)size;
    const pp_arg *a = argp;
    pp_setup p;
    TU_OK(setup_two(c, M_TRAIN, &p));
    TU_CHECK(write(a->ready_fd, "r", 1) == 1, "ready");
    if (rank == 1)
        for (;;) /* until the test kills this rank, never running */
            wf_test_sleep_us(10000);
    static float x[16 * IN];
    int32_t y[16];
    float loss;
    uint64_t t0 = wf_test_now_ns();
    int rc = tu_step(p.s, p.m.x, p.m.y, IN, OUT, 16, 0, p.m.loss, p.m.train, x, y, &loss);
    double dt = (double)(wf_test_now_ns() - t0) * 1e-9;
    const char *msg = wf_session_errmsg(p.s);
    printf("stage 0: %s after %.3f s: %s\n", wf_err_name(rc), dt, msg);
    TU_CHECK(rc == WF_EPEER, "the run gave %s: %s", wf_err_name(rc), msg);
    TU_CHECK(strstr(msg, "rank 1"), "message: %s", msg);
    TU_CHECK(dt < 2.0, "the failure took %.2f s", dt);
    setup_free(&p);
    return 0;
}
TU_REGISTER(rank_kill)

Test(transport_pipeline, a_killed_stage_fails_the_others_run_within_2s_with_epeer)
{
    int fds[2];
    tu_ready_pipe(fds);
    pp_arg a = { .mode = M_KILL, .ready_fd = fds[1] };
    tu_run t = { .size = 2,
                 .body = rank_kill,
                 .arg = &a,
                 .arg_size = sizeof a,
                 .timeout_s = 60,
                 .with_rt = true };
    tu_kill_rank(&t, fds, 1, 3);
}

/* Both ranks fail session creation naming the variable read on two stages. */
static int rank_shared_var(wf_comm *c, int rank, int size, void *argp)
{
    (void)size;
    (void)argp;
    pp_setup p;
    int rc = setup_two(c, M_SHARED_VAR, &p);
    TU_CHECK(rc == WF_EINVAL, "rank %d: creation gave %s", rank, wf_err_name(rc));
    TU_CHECK(
        strstr(wf_graph_errmsg(p.m.g), "variable 'w1' is read on stage 0 and updated on stage 1"),
        "rank %d: %s", rank, wf_graph_errmsg(p.m.g));
    setup_free(&p);
    return 0;
}
TU_REGISTER(rank_shared_var)

Test(transport_pipeline, a_variable_read_on_two_stages_fails_creation_naming_it)
{
    tu_run t = {
        .size = 2, .body = rank_shared_var, .timeout_s = WF_TEST_TIMEOUT(30), .with_rt = true
    };
    tu_start(&t);
    cr_assert(tu_wait(&t), "the ranks did not finish in time");
    for (int i = 0; i < 2; i++)
        cr_assert(WIFEXITED(t.status[i]) && WEXITSTATUS(t.status[i]) == 0,
                  "rank %d failed (status %d; stderr says why)", i, t.status[i]);
}

Test(transport_pipeline, bad_options_fail_naming_them)
{
    wf_strategy *st = NULL;
    int rc = wf_strategy_pipeline(NULL, &(wf_pipeline_opts){ .stages = 2, .batch_rows = 8 }, &st);
    cr_assert_eq(rc, WF_EINVAL, "more stages than ranks gave %s", wf_err_name(rc));
    cr_assert(strstr(wf_last_errmsg(), "stages is 2, but the communicator has 1 rank"), "%s",
              wf_last_errmsg());
    cr_assert_null(st);
    rc = wf_strategy_pipeline(NULL, &(wf_pipeline_opts){ .micro_batches = -1, .batch_rows = 8 },
                              &st);
    cr_assert_eq(rc, WF_EINVAL, "m = -1 gave %s", wf_err_name(rc));
    cr_assert(strstr(wf_last_errmsg(), "micro_batches is -1"), "%s", wf_last_errmsg());
    rc =
        wf_strategy_pipeline(NULL, &(wf_pipeline_opts){ .micro_batches = 4, .batch_rows = 3 }, &st);
    cr_assert_eq(rc, WF_EINVAL, "3 rows for 4 micro-batches gave %s", wf_err_name(rc));
    cr_assert(strstr(wf_last_errmsg(), "batch_rows is 3"), "%s", wf_last_errmsg());
    rc = wf_strategy_pipeline(NULL, &(wf_pipeline_opts){ .schedule = 5, .batch_rows = 8 }, &st);
    cr_assert_eq(rc, WF_EINVAL, "schedule 5 gave %s", wf_err_name(rc));
    cr_assert(strstr(wf_last_errmsg(), "schedule is 5"), "%s", wf_last_errmsg());
    cr_assert_eq(wf_strategy_pipeline(NULL, NULL, NULL), WF_EINVAL);

    /* A hint naming rank 1 in a one-rank pipeline: session creation names node and device. */
    wf_runtime *rt = NULL;
    cr_assert_eq(wf_runtime_create(&rt, &(wf_runtime_opts){ .n_workers = 1 }), 0);
    wf_place_hints *h = NULL;
    cr_assert_eq(wf_place_hints_create(&h), 0);
    cr_assert_eq(
        wf_strategy_pipeline(
            NULL, &(wf_pipeline_opts){ .micro_batches = 2, .batch_rows = 8, .hints = h }, &st),
        0, "%s", wf_last_errmsg());
    mlp m;
    cr_assert_eq(mlp_build(rt, &m, h, 2, M_TRAIN), 0); /* hints for 2 stages: rank 1 */
    wf_session *s = NULL;
    rc = wf_session_create(m.g, &(wf_session_opts){ .strategy = st }, &s);
    cr_assert_eq(rc, WF_ENOTFOUND, "a hint of rank 1 gave %s: %s", wf_err_name(rc),
                 wf_graph_errmsg(m.g));
    cr_assert(strstr(wf_graph_errmsg(m.g), "rank:1/cpu:0") &&
                  strstr(wf_graph_errmsg(m.g), "matmul"),
              "%s", wf_graph_errmsg(m.g));
    printf("a hint of rank 1 on one rank: %s\n", wf_graph_errmsg(m.g));
    wf_graph_destroy(m.g);
    wf_strategy_destroy(st);
    wf_place_hints_destroy(h);
    wf_runtime_destroy(rt);
}
