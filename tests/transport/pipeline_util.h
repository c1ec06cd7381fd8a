/* tests/transport/pipeline_util.h: what the pipeline tests share (test_pipeline.c, and
 * test_internal_pipeline_delays.c with random delays in its kernels): the models (an MLP, a
 * CNN, examples/train_gpt's GPT when WF_TEST_HAVE_GPT), training one on a pipeline's ranks
 * or in this process (with MultiWorkerMirrored shards, or plain), gathering the stages'
 * results, and comparing them bit for bit or within 1e-6. A pipeline's ranks place the net by
 * the hints of its layers' scopes (and per node, 'node_set'), or by the planner (placement
 * auto, optionally with a measured cost table); each reports every variable's and forward
 * op's stage, and the planner's rank 0 the plan's text.
 * pp_session_hook, when set (before the ranks start: a constructor), runs on each pipeline
 * rank's session after its creation, before its first run, and once more (with NULL) after
 * its last run.
 * Public API only; the hook's user may do more. */
#ifndef WF_TEST_PIPELINE_UTIL_H
#define WF_TEST_PIPELINE_UTIL_H

#include "strategy_util.h"
#include "transport_util.h"

#include <weft/placement.h>

#ifdef WF_TEST_HAVE_GPT
#    include <train_gpt/gpt_model.h>
#endif

#include <fcntl.h>
#include <math.h>

static void (*pp_session_hook)(wf_session *s, int stage);

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
 * their global norm across the stages). NET_MLP_SHARED is the MLP whose last layer also reads
 * w1 (M_SHARED_VAR), NET_GPT_TIED the GPT whose head is the token table: a variable read on
 * the first and the last stage. */
enum { NET_MLP, NET_CNN, NET_GPT, NET_MLP_SHARED, NET_GPT_TIED };

#define MAXW    16384 /* floats of every model's weights */
#define MAXVARS 64
#define GPT_V   16
#define GPT_T   8
#define FWD     32 /* the MLP's forward: its node ids are below this */

typedef struct pp_arg {
    int mode, model;
    int stages, micro, schedule, steps, batch;
    int placement;  /* WF_PIPELINE_PLACE_AUTO: the planner's stages, no hints */
    bool node_set;  /* hints: node_st[id] (>= 0) for each forward op, after the scopes */
    double heavy_s; /* > 0: a cost table gives the MLP's first and last matmul these seconds */
    signed char node_st[FWD];
    int ready_fd;   /* M_KILL: each rank writes a byte once its session is made */
    char path[160]; /* rank r writes "<path>.<r>" (and with the planner "<path>.plan.<r>") */
} pp_arg;

typedef struct pp_result {
    int steps, nw;
    int owner[MAXVARS]; /* a pipeline's: each variable's stage (wf_session_pipeline_stage()) */
    signed char node_st[FWD]; /* and each forward op's (ids up to the loss's, below FWD; else -1) */
    float loss[MAXSTEP];
    float eval[MAXSTEP]; /* after every 4th step: the loss of a forward-only run */
    float w[MAXW];
} pp_result;

/* The global batch of step 's': the same on every rank. */
static inline void batch_of(int s, int rows, float *x, int32_t *y)
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
static int gpt_net_build(wf_runtime *rt, net *n, wf_place_hints *h, int stages, bool tied)
{
    wf_graph *g = n->g = wf_graph_create(rt, WF_STATIC);
    gpt_model m;
    char err[256];
    const gpt_config c = {
        .vocab = GPT_V,
        .context = GPT_T,
        .d_model = 16,
        .heads = 2,
        .layers = 2,
        .tie_head = tied,
        .seed = 3,
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
    if (model == NET_GPT || model == NET_GPT_TIED)
        return gpt_net_build(rt, n, h, stages, model == NET_GPT_TIED);
#endif
    if (model != NET_MLP && model != NET_MLP_SHARED)
        return -1;
    mlp m;
    int rc = mlp_build(rt, &m, h, stages, model == NET_MLP ? M_TRAIN : M_SHARED_VAR);
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
    if (n->model == NET_GPT || n->model == NET_GPT_TIED) {
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

/* Pipeline rank 'stage''s session 's' of 'n': where each variable and each forward op up to
 * the loss (node 'loss_id') is, into 'res' (checked against the hints, the net's owners when
 * only scopes placed them); with the planner, each rank writes the plan's text to
 * "<path>.plan.<stage>". */
static int report_stages(const wf_session *s, const net *n, const pp_arg *a, int loss_id, int stage,
                         pp_result *res)
{
    for (int k = 0; k < n->n_vars; k++) {
        res->owner[k] = wf_session_pipeline_stage(s, n->vars[k]);
        TU_CHECK(res->owner[k] >= 0, "variable %d: stage %d: %s", k, res->owner[k],
                 wf_last_errmsg());
        TU_CHECK(a->placement == WF_PIPELINE_PLACE_AUTO || a->node_set ||
                     res->owner[k] == n->owner[k],
                 "variable %d is on stage %d, hinted to %d", k, res->owner[k], n->owner[k]);
    }
    for (int id = 0; id < FWD; id++) {
        const wf_node *v = id <= loss_id ? wf_graph_node(n->g, id) : NULL;
        bool op = v && wf_node_input_count(v) > 0; /* not a source */
        res->node_st[id] = (signed char)(op ? wf_session_pipeline_stage(s, v) : -1);
        /* every op on a stage: also one that reads only variables and whose reader does too
         * (the shared MLP's sum of w1, scaled and added on the last stage) */
        TU_CHECK(!op || (res->node_st[id] >= 0 && res->node_st[id] < a->stages),
                 "node %d (%s %s): stage %d", id, wf_node_op(v), wf_node_name(v), res->node_st[id]);
        TU_CHECK(!a->node_set || res->node_st[id] == a->node_st[id],
                 "node %d is on stage %d, hinted to %d", id, res->node_st[id], a->node_st[id]);
    }
    const char *plan = wf_session_pipeline_plan(s);
    TU_CHECK(!plan == (a->placement != WF_PIPELINE_PLACE_AUTO), "the plan's text is %s",
             plan ? "there without the planner" : "missing");
    if (plan) { /* for the test to print and compare */
        char path[200];
        snprintf(path, sizeof path, "%s.plan.%d", a->path, stage);
        FILE *f = fopen(path, "w");
        TU_CHECK(f && fputs(plan, f) >= 0 && fclose(f) == 0, "write %s", path);
    }
    return 0;
}

/* Trains 'a->steps' steps with 'st' (NULL: a plain session); 'stage' is this process's
 * stage (-1: all of them: a reference run). Fills the losses and the weights of the stage's
 * variables. */
static int train(wf_runtime *rt, const wf_strategy *st, const pp_arg *a, int stage,
                 wf_place_hints *h, pp_result *res)
{
    net n;
    TU_CHECK(net_build(rt, &n, a->model, h, a->stages) == 0, "build: %s", wf_graph_errmsg(n.g));
    int loss_id = 0; /* the forward's last node */
    while (wf_graph_node(n.g, loss_id) && wf_graph_node(n.g, loss_id) != n.loss)
        loss_id++;
    TU_CHECK(loss_id < FWD || (!a->node_set && a->placement != WF_PIPELINE_PLACE_AUTO),
             "the loss is node %d", loss_id);
    for (int id = 0; a->node_set && h && id <= loss_id; id++) { /* node hints win over scopes */
        char dev[32];
        snprintf(dev, sizeof dev, "rank:%d/cpu:0", a->node_st[id]);
        if (a->node_st[id] >= 0)
            TU_OK(wf_place_hint(h, wf_graph_node(n.g, id), dev));
    }
    wf_session *s = NULL;
    TU_OK(wf_session_create(n.g, &(wf_session_opts){ .strategy = st }, &s));
    TU_CHECK(a->batch <= 256, "batch %d", a->batch);
    if (pp_session_hook && stage >= 0)
        pp_session_hook(s, stage);
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
    if (stage >= 0)
        TU_CHECK(report_stages(s, &n, a, loss_id, stage, res) == 0, "stage %d's stages", stage);
    else
        TU_CHECK(!wf_session_pipeline_plan(s), "a plan's text without a pipeline");
    size_t off = 0;
    for (int k = 0; k < n.n_vars; k++) {
        size_t cnt = (size_t)var_numel(&n, k);
        TU_CHECK(off + cnt <= MAXW, "more than %d weights", MAXW);
        if (stage < 0 || res->owner[k] == stage) {
            wf_tensor *v = NULL;
            TU_OK(wf_session_variable(s, n.vars[k], &v));
            TU_OK(wf_tensor_read(v, WF_F32, res->w + off, cnt * sizeof(float)));
            wf_tensor_release(v);
        }
        off += cnt;
    }
    res->nw = (int)off;
    if (pp_session_hook && stage >= 0)
        pp_session_hook(NULL, stage); /* the rank's last run is done */
    wf_session_destroy(s);
    wf_graph_destroy(n.g);
    return 0;
}

static int rank_train(wf_comm *c, int rank, int size, void *argp)
{
    (void)size;
    const pp_arg *a = argp;
    wf_place_hints *h = NULL;
    if (a->placement != WF_PIPELINE_PLACE_AUTO)
        TU_OK(wf_place_hints_create(&h));
    wf_cost_table *costs = NULL;
    if (a->heavy_s > 0) { /* the signatures of the copy the planner sees: a micro-batch's rows */
        wf_graph *cg = wf_graph_create(tu_rt, WF_STATIC);
        int64_t rows = (a->batch + a->micro - 1) / a->micro;
        wf_node *mm3 = wf_matmul(cg, wf_placeholder(cg, "a", WF_F32, WF_SHAPE(rows, HID)),
                                 wf_variable(cg, "w", WF_F32, WF_SHAPE(HID, OUT), wf_init_zeros()));
        wf_node *mm1 = wf_matmul(cg, wf_placeholder(cg, "x", WF_F32, WF_SHAPE(rows, IN)),
                                 wf_variable(cg, "v", WF_F32, WF_SHAPE(IN, HID), wf_init_zeros()));
        TU_OK(wf_cost_table_create(&costs));
        TU_CHECK(mm1 && mm3, "the costed matmuls: %s", wf_graph_errmsg(cg));
        TU_OK(wf_cost_table_put(costs, mm3, WF_PLACE_CPU, a->heavy_s));
        TU_OK(wf_cost_table_put(costs, mm1, WF_PLACE_CPU, a->heavy_s));
        wf_graph_destroy(cg);
    }
    wf_strategy *st = NULL;
    TU_OK(wf_strategy_pipeline(c,
                               &(wf_pipeline_opts){ .stages = a->stages,
                                                    .micro_batches = a->micro,
                                                    .schedule = a->schedule,
                                                    .batch_rows = a->batch,
                                                    .hints = h,
                                                    .placement = a->placement,
                                                    .costs = costs },
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
    wf_cost_table_destroy(costs);
    return rc;
}
TU_REGISTER(rank_train)

/* The stages' files into one result: the last stage's losses, each variable from the stage
 * that reports it (every rank reports the same stages). */
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
        if (r == 0) {
            memcpy(out->owner, part.owner, sizeof out->owner);
            memcpy(out->node_st, part.node_st, sizeof out->node_st);
        }
        cr_assert(!memcmp(out->owner, part.owner, sizeof out->owner) &&
                      !memcmp(out->node_st, part.node_st, sizeof out->node_st),
                  "rank %d puts the nodes on other stages than rank 0", r);
        size_t off = 0;
        for (int k = 0; k < n.n_vars; off += (size_t)var_numel(&n, k), k++)
            if (part.owner[k] == r)
                memcpy(out->w + off, part.w + off, sizeof(float) * (size_t)var_numel(&n, k));
    }
    for (int r = 0; r < a->stages; r++)
        cr_assert(!memcmp(losses[r].loss, out->loss, sizeof out->loss) &&
                      !memcmp(losses[r].eval, out->eval, sizeof out->eval),
                  "stage %d fetched other losses than the last stage", r);
    wf_graph_destroy(n.g);
    wf_runtime_destroy(rt);
}

/* Runs 'arg' (as M_TRAIN) on its stages' ranks and gathers what they saw; 'arg->path' is
 * set to the files' prefix. */
static void run_pipeline(pp_arg *arg, pp_result *r)
{
    arg->mode = M_TRAIN;
    snprintf(arg->path, sizeof arg->path, "/tmp/weft-pipeline-%d-%d%d%d%d", (int)getpid(),
             arg->model, arg->stages, arg->schedule, arg->placement);
    const pp_arg a = *arg;
    tu_run t = { .size = a.stages,
                 .body = rank_train,
                 .arg = arg,
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
    static const char *const names[] = { "mlp", "cnn", "gpt", "mlp (w1 on two stages)",
                                         "gpt (tied head)" };
    printf("pipeline %s, %d stages, m = %d, %s%s: %d steps in %.2f s\n", names[a.model], a.stages,
           a.micro, a.schedule == WF_SCHEDULE_1F1B ? "1f1b" : "gpipe",
           a.placement == WF_PIPELINE_PLACE_AUTO ? ", planner" : "", a.steps,
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
    a.placement = WF_PIPELINE_PLACE_HINTS, a.node_set = false, a.heavy_s = 0; /* no pipeline */
    wf_strategy *st = NULL;
    if (shards)
        cr_assert_eq(wf_strategy_multiworker(NULL, &(wf_strategy_opts){ .shards = shards }, &st), 0,
                     "%s", wf_last_errmsg());
    cr_assert_eq(train(rt, st, &a, -1, NULL, r), 0, "the local run failed");
    wf_strategy_destroy(st);
    wf_runtime_destroy(rt);
}

/* Losses within 1e-6 relative; with 'weights', the final weights too (the norm of the
 * difference). */
static void assert_close(const pp_result *a, const pp_result *b, const char *what, bool weights)
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
    cr_assert(!weights || sqrt(d2 / n2) <= 1e-6, "%s: the weights differ by %.3g relative", what,
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

/* The pipeline of 'a' against one process with as many shards as micro-batches (bit for bit)
 * and, with 'close' (1: losses, 2: and weights), against plain training (within 1e-6). */
static void check_run(const pp_arg *a, int close)
{
    static pp_result pipe, local, plain;
    pp_arg p = *a;
    run_pipeline(&p, &pipe);
    run_local(a, a->micro, &local);
    assert_bitwise(&pipe, &local, "pipeline vs one process with as many shards");
    if (close) {
        run_local(a, 0, &plain);
        assert_close(&pipe, &plain, "pipeline vs plain training", close > 1);
    }
}

/* 'model' in 'stages' stages, m = 4, 12 steps of 30 rows (micro-batches of 8, 8, 7 and 7):
 * the bits of one process with 4 shards, and close to plain training. */
static inline void check_model(int model, int stages, int schedule)
{
    pp_arg a = {
        .model = model, .stages = stages, .micro = 4, .schedule = schedule, .steps = 12, .batch = 30
    };
    check_run(&a, 2);
}

#endif /* WF_TEST_PIPELINE_UTIL_H */
