/* weft-train.c: trains a classifier with weft and shows it happening: the bundled handwritten
 * digits (or a CSV, MNIST IDX or .npy dataset), an MLP or a small CNN, any of weft's
 * optimizers, a progress bar with loss, accuracy and samples/s, the test accuracy after each
 * epoch, a checkpoint, a per-step JSON log, a Perfetto trace and a plot of the losses.
 *   weft-train                                  the digits, an MLP 64-128-10, Adam
 *   weft-train --model cnn --epochs 15          a conv/pool/linear stack
 *   weft-train --data-idx train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz
 *   weft-train --save model.safetensors --log steps.jsonl --trace trace.json
 *   weft-train --plot curves.svg                loss and accuracy per step and evaluation
 *   weft-run -n 2 weft-train --strategy pipeline --stages 2 --micro-batches 8
 *                                               the layers split into 2 stages, one per rank,
 *                                               8 micro-batches per step (GPipe or 1F1B);
 *                                               --placement auto: the planner's stages (it
 *                                               prints its plan), --placement FILE: lines
 *                                               "fc1 rank:0/cpu:0" (stages.h)
 *   weft-train --checkpoint-every 100 --checkpoint-dir ckpt --resume
 *                                               a checkpoint every 100 steps (written in the
 *                                               background, the newest 3 kept); after a crash
 *                                               or a kill the same command goes on from the
 *                                               newest, and ends with the same weights, bit
 *                                               for bit, as a run never stopped
 *   weft-run -n 2 weft-train --strategy multiworker   data parallel over 2 ranks
 *   weft-train --strategy mirrored --devices 2  one replica per device (GPUs, or simulated
 *                                               devices where there are too few)
 *   weft-run -n 3 --restarts 5 weft-train --strategy multiworker --checkpoint-every 50
 *            --checkpoint-dir ckpt --resume     data parallel; when a rank dies weft-run
 *                                               starts all three again and every rank goes
 *                                               on from rank 0's newest checkpoint
 *   weft-run -n 3 weft-train --strategy ps --ps-ranks 1
 *                                               parameter servers: rank 0 holds the weights,
 *                                               ranks 1 and 2 train (the bits of
 *                                               --strategy multiworker on 2 ranks)
 * Ctrl-C stops training after the current step: the log, the plot and the trace so far are
 * written (the checkpoint is not: it would look like a finished run), and the exit status
 * is 130. A second Ctrl-C kills the program as usual.
 * Static mode (the default) builds one graph (forward, wf_minimize's backward and update
 * nodes) and runs it as a session once per step; --eager builds an eager graph per step, its
 * variables carried over from the last (wf_variable_set()): the two give the same losses.
 * Names and layouts are PyTorch's (fc1.weight is [out, in]; conv1.weight [out, in, kh, kw])
 * so checkpoints load into the same model there; perf/torch_train_compare.py replays a run in
 * PyTorch from its --init file and compares the losses step by step.
 * Public API only, as every example. */
#include "bundled.h"
#include "data.h"
#include "plot.h"
#include "progress.h"
#include "ranks.h"
#include "resume.h"
#include "stages.h"

#include <weft/weft.h>

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#ifndef WT_DIGITS_SOURCE
#    define WT_DIGITS_SOURCE "digits.csv.gz"
#endif
#ifndef WT_DATADIR
#    define WT_DATADIR "share" /* the install's data folder, relative to its prefix */
#endif

#define MAX_LAYERS 8
#define MAX_PARAMS (2 * MAX_LAYERS + 4)

typedef struct options {
    const char *csv, *idx[2], *npy[2];
    const char *model;
    int hidden[MAX_LAYERS], n_hidden;
    const char *optimizer;
    double lr;
    int batch;
    long steps, epochs;
    uint64_t seed;
    int threads;
    bool eager, shuffle, quiet, normalize;
    bool mixed_bf16; /* --mixed-bf16: products in bf16, f32 master weights */
    double test_fraction;
    uint64_t split_seed; /* 0: the test set is the last rows */
    const char *init, *save, *log, *trace, *plot;
    const char *dump_graph; /* --dump-graph: the step's plan as Graphviz DOT */
    long ckpt_every;        /* --checkpoint-every K: 0 none */
    const char *ckpt_dir;   /* --checkpoint-dir D */
    int keep;               /* --keep N: 0 the library's default (3) */
    bool resume;            /* --resume: from the newest complete checkpoint of D */
    const char *strategy;   /* --strategy multiworker: data parallel over weft-run's ranks;
                               mirrored: over the devices of this process; ps: parameter
                               servers over weft-run's ranks; pipeline: the layers split
                               into stages, one per rank */
    int shards;             /* --shards S (0: the number of ranks, devices or workers) */
    int devices;            /* --devices N: mirrored's devices (0: every GPU) */
    int ps_ranks;           /* --strategy ps --ps-ranks K: ranks 0 .. K-1 are servers */
    int staleness;          /* --staleness s (0: synchronous) */
    bool staleness_set;
    bool pipeline;         /* --strategy pipeline */
    int stages;            /* --stages P (0: the number of ranks) */
    int micro_batches;     /* --micro-batches M (0: 1) */
    int schedule;          /* --schedule gpipe|1f1b (WF_SCHEDULE_*) */
    bool save_any;         /* --save on any rank (a pipeline's ranks send rank 0 weights) */
    bool schedule_set;     /* --schedule given */
    const char *placement; /* --placement auto (the planner) or FILE (stages.h); NULL: the
                              layers split evenly */
} options;

/* The rank that prints, logs and saves: 0, or under --strategy ps the first worker (a
 * server's copy of the variables it does not hold is not updated). */
static int writer_rank(const options *o)
{
    return o->strategy && strcmp(o->strategy, "ps") == 0 ? o->ps_ranks : 0;
}

/* ---- The model --------------------------------------------------------------------------- */

typedef struct param {
    char name[32];
    wf_shape shape;
    wf_init init;
} param;

typedef struct model {
    bool cnn;
    int n_params;
    param p[MAX_PARAMS];
    int n_fc;      /* linear layers */
    int conv_c[2]; /* cnn: output channels of conv1, conv2 */
    bool pool2;    /* cnn: pool after conv2 too (images of 16 x 16 and more) */
    wf_shape in;   /* one sample's shape */
    int classes;
} model;

/* PyTorch's default init for Linear and Conv2d: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for the
 * weight and the bias. */
static void add_layer(model *m, const char *name, wf_shape wshape, int64_t fan_in, uint64_t seed)
{
    double b = 1.0 / sqrt((double)fan_in);
    param *w = &m->p[m->n_params++], *bias = &m->p[m->n_params++];
    snprintf(w->name, sizeof w->name, "%s.weight", name);
    w->shape = wshape;
    w->init = wf_init_uniform(seed, -b, b);
    snprintf(bias->name, sizeof bias->name, "%s.bias", name);
    bias->shape = (wf_shape){ .rank = 1, .dims = { wshape.dims[0] } };
    bias->init = wf_init_uniform(seed + 1000, -b, b);
}

static int make_model(const options *o, const wt_dataset *ds, model *m, char *err, size_t errlen)
{
    memset(m, 0, sizeof *m);
    m->classes = ds->n_classes;
    m->in.rank = ds->rank;
    for (int d = 0; d < ds->rank; d++)
        m->in.dims[d] = ds->dims[d];
    uint64_t seed = o->seed * 7919;
    if (strcmp(o->model, "mlp") == 0) {
        int64_t prev = ds->n_features;
        for (int i = 0; i <= o->n_hidden; i++) {
            int64_t out = i < o->n_hidden ? o->hidden[i] : ds->n_classes;
            char name[16];
            snprintf(name, sizeof name, "fc%d", i + 1);
            add_layer(m, name, WF_SHAPE(out, prev), prev, seed + (uint64_t)i);
            prev = out;
        }
        m->n_fc = o->n_hidden + 1;
        return 0;
    }
    if (strcmp(o->model, "cnn") != 0) {
        snprintf(err, errlen, "--model %s: expected mlp or cnn", o->model);
        return WF_EINVAL;
    }
    /* conv 3x3 32 (pad 1) + ReLU + maxpool 2, conv 3x3 64 (pad 1) + ReLU (+ maxpool 2 for
     * images of 16 x 16 and more: 8 x 8 digits keep their 4 x 4 map), linear 128 + ReLU,
     * linear classes */
    if (ds->rank != 3 || ds->dims[1] < 4 || ds->dims[2] < 4) {
        snprintf(err, errlen,
                 "--model cnn needs images [C, H, W] with H, W >= 4 (the data "
                 "has %d feature dimension(s))",
                 ds->rank);
        return WF_EINVAL;
    }
    m->cnn = true;
    m->conv_c[0] = 32;
    m->conv_c[1] = 64;
    m->pool2 = ds->dims[1] >= 16 && ds->dims[2] >= 16;
    int64_t c = ds->dims[0], f = m->pool2 ? 4 : 2;
    add_layer(m, "conv1", WF_SHAPE(32, c, 3, 3), c * 9, seed);
    add_layer(m, "conv2", WF_SHAPE(64, 32, 3, 3), 32 * 9, seed + 1);
    int64_t flat = 64 * (ds->dims[1] / f) * (ds->dims[2] / f);
    add_layer(m, "fc1", WF_SHAPE(128, flat), flat, seed + 2);
    add_layer(m, "fc2", WF_SHAPE(ds->n_classes, 128), 128, seed + 3);
    m->n_fc = 2;
    return 0;
}

/* Logits [B, classes] of x [B, ...] with the variables 'v' (model order). */
/* A pipeline's stage of layer 'j' of 'n' (convolutions first, then the linear layers) over
 * 'stages' stages: contiguous runs of layers, as even as the counts allow. */
static int layer_stage(int j, int n, int stages)
{
    return (int)((int64_t)j * stages / n);
}

/* Layer 'j''s name ("fc1", "conv2": its weight's name without ".weight"). */
static void layer_name(const model *m, int j, char *buf, size_t size)
{
    snprintf(buf, size, "%.*s", (int)strcspn(m->p[2 * j].name, "."), m->p[2 * j].name);
}

/* Opens the scope of layer 'j''s stage in 'h' (NULL: no pipeline): the even split, or with
 * 'pf' (--placement FILE) the file's device of the layer (none: no scope). Returns 1 when a
 * scope is open, 0 when not, or an error. */
static int stage_scope(wf_place_hints *h, wt_place_file *pf, const wf_graph *g, const model *m,
                       int j, int stages)
{
    if (!h)
        return 0;
    char dev[32], name[32];
    layer_name(m, j, name, sizeof name);
    const char *d = pf ? wt_place_file_layer(pf, name) : dev;
    snprintf(dev, sizeof dev, "rank:%d/cpu:0", layer_stage(j, (m->cnn ? 2 : 0) + m->n_fc, stages));
    if (!d)
        return 0;
    int rc = wf_place_scope_begin(h, g, d);
    return rc < 0 ? rc : 1;
}

/* The logits; with 'h' (a pipeline of 'stages'), each layer's nodes hinted to its stage (by
 * 'pf' when given). */
static wf_node *forward(wf_graph *g, const model *m, wf_node *const *v, wf_node *x,
                        wf_place_hints *h, wt_place_file *pf, int stages)
{
    int k = 0, j = 0;
    wf_node *a = x;
    if (m->cnn) {
        const wf_conv2d_opts same = { .padding = { 1, 1, 1, 1 } };
        const wf_pool2d_opts pool = { .window = { 2, 2 } };
        for (int i = 0; i < 2; i++, k += 2, j++) {
            int sc = stage_scope(h, pf, g, m, j, stages);
            if (sc < 0)
                return NULL;
            wf_node *b = wf_reshape(g, v[k + 1], WF_SHAPE(m->conv_c[i], 1, 1));
            a = wf_relu(g, wf_add(g, wf_conv2d(g, a, v[k], &same), b));
            if (i == 0 || m->pool2)
                a = wf_max_pool2d(g, a, &pool);
            if (sc && wf_place_scope_end(h, g) < 0)
                return NULL;
        }
    }
    for (int i = 0; i < m->n_fc; i++, k += 2, j++) {
        int sc = stage_scope(h, pf, g, m, j, stages);
        if (sc < 0)
            return NULL;
        if (i == 0) /* flatten to [B, features]: -1 keeps the batch open */
            a = wf_reshape(g, a, WF_SHAPE(-1, m->p[k].shape.dims[1]));
        a = wf_add(g, wf_matmul_ex(g, a, v[k], false, true), v[k + 1]);
        if (i + 1 < m->n_fc)
            a = wf_relu(g, a);
        if (sc && wf_place_scope_end(h, g) < 0)
            return NULL;
    }
    return a;
}

static wf_shape batch_shape(const model *m, int64_t b)
{
    wf_shape s = { .rank = m->in.rank + 1 };
    s.dims[0] = b;
    for (int d = 0; d < m->in.rank; d++)
        s.dims[d + 1] = m->in.dims[d];
    return s;
}

static int parse_optimizer(const options *o, wf_optimizer *opt, char *err, size_t errlen)
{
    const char *k = o->optimizer;
    double lr = o->lr;
    if (strcmp(k, "sgd") == 0)
        *opt = wf_sgd(lr > 0 ? lr : 0.05);
    else if (strcmp(k, "momentum") == 0)
        *opt = wf_momentum(lr > 0 ? lr : 0.02, 0.9, false);
    else if (strcmp(k, "adam") == 0)
        *opt = wf_adam(lr > 0 ? lr : 1e-3);
    else if (strcmp(k, "adamw") == 0)
        *opt = wf_adamw(lr > 0 ? lr : 1e-3, 0.01);
    else if (strcmp(k, "rmsprop") == 0)
        *opt = wf_rmsprop(lr > 0 ? lr : 1e-3);
    else if (strcmp(k, "adagrad") == 0)
        *opt = wf_adagrad(lr > 0 ? lr : 0.05);
    else {
        snprintf(err, errlen,
                 "--optimizer %s: expected sgd, momentum, adam, adamw, rmsprop or "
                 "adagrad",
                 k);
        return WF_EINVAL;
    }
    if (wf_optimizer_check(opt) < 0) {
        snprintf(err, errlen, "%s", wf_last_errmsg());
        return WF_EINVAL;
    }
    return 0;
}

/* ---- One training setup, static or eager --------------------------------------------------- */

typedef struct trainer {
    const options *o;
    const model *m;
    wf_runtime *rt;
    wf_optimizer opt;
    wf_comm *comm;         /* --strategy: the ranks (weft-run's environment) */
    wf_strategy *strategy; /* --strategy: NULL otherwise */
    wf_place_hints *hints; /* --strategy pipeline: each layer's stage (NULL: --placement auto) */
    wt_place_file *pfile;  /* --placement FILE */
    int n_user;            /* the graph's nodes before the session's rewrite */
    int rank;              /* 0 without --strategy; only rank 0 prints, logs and saves */
    /* static mode */
    wf_graph *g;
    wf_session *s;
    wf_node *x, *y, *loss, *correct, *train;
    /* eager mode: every variable's value between steps, by name */
    int n_state;
    wf_named_tensor state[4 * MAX_PARAMS + 4];
    char names[4 * MAX_PARAMS + 4][96];
} trainer;

static wf_node *count_correct(wf_graph *g, wf_node *logits, wf_node *y)
{
    wf_node *hit = wf_eq(g, wf_argmax(g, logits, 1), wf_cast(g, y, WF_I64));
    return wf_sum(g, wf_cast(g, hit, WF_F32));
}

static int trainer_static(trainer *t, char *err, size_t errlen)
{
    const model *m = t->m;
    wf_graph *g = t->g = wf_graph_create(t->rt, WF_STATIC);
    if (!g) {
        snprintf(err, errlen, "%s", wf_last_errmsg());
        return WF_ENOMEM;
    }
    wf_node *v[MAX_PARAMS];
    t->x = wf_placeholder(g, "x", WF_F32, batch_shape(m, -1));
    t->y = wf_placeholder(g, "y", WF_I32, WF_SHAPE(-1));
    for (int i = 0; i < m->n_params; i++)
        v[i] = wf_variable(g, m->p[i].name, WF_F32, m->p[i].shape, m->p[i].init);
    wf_node *logits = forward(g, m, v, t->x, t->hints, t->pfile, wf_strategy_size(t->strategy));
    t->loss = wf_mean(g, wf_softmax_cross_entropy(g, logits, t->y));
    t->correct = count_correct(g, logits, t->y);
    t->train = wf_minimize(g, t->opt, t->loss);
    int rc = wf_graph_status(g);
    if (rc == 0 && t->pfile) { /* the file's node entries, over the layers' scopes */
        char layers[256] = "";
        for (int j = 0; j < (m->cnn ? 2 : 0) + m->n_fc; j++) {
            char name[32];
            layer_name(m, j, name, sizeof name);
            snprintf(layers + strlen(layers), sizeof layers - strlen(layers), "%s%s", j ? ", " : "",
                     name);
        }
        if ((rc = wt_place_file_hint_nodes(t->pfile, g, t->hints, layers, err, errlen)) < 0)
            return rc;
    }
    t->n_user = wf_graph_node_count(g);
    if (rc == 0)
        rc = wf_session_create(
            g,
            &(wf_session_opts){ .flags = t->o->mixed_bf16 ? WF_SESSION_MIXED_BF16 : 0,
                                .strategy = t->strategy },
            &t->s);
    if (rc < 0) {
        snprintf(err, errlen, "building the model: %s", wf_graph_errmsg(g));
        return rc;
    }
    const char *plan = wf_session_pipeline_plan(t->s); /* --placement auto */
    if (plan && t->rank == 0 && !t->o->quiet)
        printf("weft-train: %s", plan);
    if (t->o->init &&
        (rc = wf_checkpoint_load(t->s, t->o->init, WF_CHECKPOINT_ALLOW_MISSING)) < 0) {
        snprintf(err, errlen, "--init: %s", wf_session_errmsg(t->s));
        return rc;
    }
    return 0;
}

/* The eager state entry named 'name', or NULL. */
static wf_named_tensor *state_find(trainer *t, const char *name)
{
    for (int i = 0; i < t->n_state; i++)
        if (strcmp(t->state[i].name, name) == 0)
            return &t->state[i];
    return NULL;
}

/* Records the values of every variable of eager graph 'g' (retained) as the state. */
static void state_take(trainer *t, wf_graph *g)
{
    for (int i = 0; i < wf_graph_node_count(g); i++) {
        wf_node *n = wf_graph_node(g, i);
        if (strcmp(wf_node_op(n), "variable") != 0)
            continue;
        wf_named_tensor *e = state_find(t, wf_node_name(n));
        if (!e) {
            if (t->n_state == (int)(sizeof t->state / sizeof t->state[0]))
                continue;
            e = &t->state[t->n_state];
            snprintf(t->names[t->n_state], sizeof t->names[0], "%s", wf_node_name(n));
            e->name = t->names[t->n_state++];
            e->tensor = NULL;
        }
        wf_tensor_release(e->tensor);
        e->tensor = wf_tensor_retain(wf_node_value(n));
    }
}

/* An eager graph holding every variable of the state (the model's first, in model order,
 * written to 'v'), with their current values. */
static wf_graph *eager_graph(trainer *t, wf_node **v)
{
    wf_graph *g = wf_graph_create(t->rt, WF_EAGER);
    if (!g)
        return NULL;
    for (int i = 0; i < t->m->n_params; i++) {
        const param *p = &t->m->p[i];
        v[i] = wf_variable(g, p->name, WF_F32, p->shape, p->init);
    }
    for (int i = 0; i < t->n_state; i++) {
        wf_node *n = wf_graph_find(g, t->state[i].name);
        wf_tensor *val = t->state[i].tensor;
        if (!n)
            n = wf_variable(g, t->state[i].name, wf_tensor_dtype(val), wf_tensor_shape(val),
                            wf_init_zeros());
        if (!n || wf_variable_set(n, val) < 0) {
            wf_graph_destroy(g);
            return NULL;
        }
    }
    /* the graph holds the values now: drop ours so updates can write them in place */
    for (int i = 0; i < t->n_state; i++) {
        wf_tensor_release(t->state[i].tensor);
        t->state[i].tensor = NULL;
    }
    return g;
}

static int trainer_eager(trainer *t, char *err, size_t errlen)
{
    if (t->o->init) {
        wf_named_tensor *ts;
        int n;
        int rc = wf_safetensors_read(t->o->init, &ts, &n);
        if (rc < 0) {
            snprintf(err, errlen, "--init: %s", wf_last_errmsg());
            return rc;
        }
        for (int i = 0; i < n && t->n_state < MAX_PARAMS * 4; i++) {
            snprintf(t->names[t->n_state], sizeof t->names[0], "%s", ts[i].name);
            t->state[t->n_state].name = t->names[t->n_state];
            t->state[t->n_state++].tensor = wf_tensor_retain(ts[i].tensor);
        }
        wf_safetensors_free(ts, n);
    }
    return 0;
}

/* One step on x, y (count rows): the loss before the update and the number right. */
static int train_step(trainer *t, wf_tensor *x, wf_tensor *y, double *loss, double *correct,
                      char *err, size_t errlen)
{
    if (!t->o->eager) {
        wf_feed f[2] = { { t->x, x }, { t->y, y } };
        wf_node *fetch[2] = { t->loss, t->correct };
        wf_tensor *out[2];
        int rc = wf_session_run(t->s, f, 2, fetch, 2, out, &t->train, 1);
        if (rc < 0) {
            snprintf(err, errlen, "%s", wf_session_errmsg(t->s));
            return rc;
        }
        *loss = wf_tensor_get(out[0], 0);
        *correct = wf_tensor_get(out[1], 0);
        wf_tensor_release(out[0]);
        wf_tensor_release(out[1]);
        return 0;
    }
    wf_node *v[MAX_PARAMS];
    wf_graph *g = eager_graph(t, v);
    if (!g) {
        snprintf(err, errlen, "eager step: %s", wf_last_errmsg());
        return WF_ENOMEM;
    }
    wf_node *xs = wf_constant(g, x), *ys = wf_constant(g, y);
    wf_node *logits = forward(g, t->m, v, xs, NULL, NULL, 1);
    wf_node *l = wf_mean(g, wf_softmax_cross_entropy(g, logits, ys));
    wf_node *c = count_correct(g, logits, ys);
    wf_node *step = l && c ? wf_minimize(g, t->opt, l) : NULL;
    int rc = wf_graph_status(g);
    if (rc < 0 || !step) {
        snprintf(err, errlen, "eager step: %s", wf_graph_errmsg(g));
        wf_graph_destroy(g);
        return rc < 0 ? rc : WF_EINVAL;
    }
    *loss = wf_tensor_get(wf_node_value(l), 0);
    *correct = wf_tensor_get(wf_node_value(c), 0);
    state_take(t, g);
    wf_graph_destroy(g);
    return 0;
}

/* Fills rows at .. at + cnt - 1 of 'ds' (through 'perm', NULL: in order) into a batch of cnt
 * rows, but only those this rank's shards read (wf_strategy_local_rows(): under --strategy
 * multiworker or ps each rank reads only its rows of the global batch); the others keep what
 * the buffers held, which no shard reads: new_batch_buffers() makes them NaN (x) and 0 (labels),
 * so a shard that read a row of another rank's would make the loss NaN, which the training loop
 * reports. */
static int fill_own_rows(const trainer *t, const wt_dataset *ds, const int64_t *perm, int64_t at,
                         int64_t cnt, float *xb, int32_t *yb)
{
    long long lo = 0, hi = cnt;
    if (t->strategy && wf_strategy_local_rows(t->strategy, cnt, &lo, &hi) < 0)
        return WF_EINVAL;
    return wt_batch(ds, perm, at + lo, hi - lo, xb + lo * ds->n_features, yb + lo);
}

/* The buffers of a batch of 'rows' rows of 'nf' features, x NaN and labels 0 (fill_own_rows());
 * 0 or WF_ENOMEM (both NULL). */
static int new_batch_buffers(int64_t rows, int64_t nf, float **xb, int32_t **yb)
{
    *xb = malloc((size_t)rows * (size_t)nf * sizeof **xb);
    *yb = calloc((size_t)rows, sizeof **yb);
    if (!*xb || !*yb) {
        free(*xb);
        free(*yb);
        *xb = NULL;
        *yb = NULL;
        return WF_ENOMEM;
    }
    for (int64_t i = 0; i < rows * nf; i++)
        (*xb)[i] = NAN;
    return 0;
}

/* Test loss and accuracy over 'ds', in chunks. */
static int evaluate(trainer *t, const wt_dataset *ds, double *loss, double *acc, char *err,
                    size_t errlen)
{
    /* A pipeline runs batches of --batch rows only: the rows past the last whole one are
     * not evaluated. */
    int64_t CHUNK = t->o->pipeline ? t->o->batch : 512, n_eval = 0;
    float *xb;
    int32_t *yb;
    double lsum = 0, right = 0;
    int rc = new_batch_buffers(CHUNK, ds->n_features, &xb, &yb);
    for (int64_t at = 0; rc == 0 && at < ds->n; at += CHUNK) {
        int64_t cnt = ds->n - at < CHUNK ? ds->n - at : CHUNK;
        if (t->o->pipeline && cnt < CHUNK)
            break;
        n_eval += cnt;
        if ((rc = fill_own_rows(t, ds, NULL, at, cnt, xb, yb)) < 0) {
            snprintf(err, errlen, "the rows %lld .. %lld: %s", (long long)at,
                     (long long)(at + cnt - 1), wf_last_errmsg());
            break;
        }
        wf_tensor *x = wf_tensor_from(WF_F32, batch_shape(t->m, cnt), xb);
        wf_tensor *y = wf_tensor_from(WF_I32, WF_SHAPE(cnt), yb);
        if (!x || !y) {
            rc = WF_ENOMEM;
        } else if (!t->o->eager) {
            wf_feed f[2] = { { t->x, x }, { t->y, y } };
            wf_node *fetch[2] = { t->loss, t->correct };
            wf_tensor *out[2];
            if ((rc = wf_session_run(t->s, f, 2, fetch, 2, out, NULL, 0)) < 0) {
                snprintf(err, errlen, "%s", wf_session_errmsg(t->s));
            } else {
                lsum += wf_tensor_get(out[0], 0) * (double)cnt;
                right += wf_tensor_get(out[1], 0);
                wf_tensor_release(out[0]);
                wf_tensor_release(out[1]);
            }
        } else {
            wf_node *v[MAX_PARAMS];
            wf_graph *g = eager_graph(t, v);
            if (!g) {
                rc = WF_ENOMEM;
            } else {
                wf_node *xs = wf_constant(g, x), *ys = wf_constant(g, y);
                wf_node *logits = forward(g, t->m, v, xs, NULL, NULL, 1);
                wf_node *l = wf_mean(g, wf_softmax_cross_entropy(g, logits, ys));
                wf_node *c = count_correct(g, logits, ys);
                if ((rc = wf_graph_status(g)) < 0) {
                    snprintf(err, errlen, "%s", wf_graph_errmsg(g));
                } else {
                    lsum += wf_tensor_get(wf_node_value(l), 0) * (double)cnt;
                    right += wf_tensor_get(wf_node_value(c), 0);
                }
                state_take(t, g);
                wf_graph_destroy(g);
            }
        }
        wf_tensor_release(x);
        wf_tensor_release(y);
    }
    free(xb);
    free(yb);
    *loss = n_eval ? lsum / (double)n_eval : NAN;
    *acc = n_eval ? right / (double)n_eval : NAN;
    return rc;
}

static int save(trainer *t, const char *path, char *err, size_t errlen)
{
    int rc;
    if (!t->o->eager) {
        if ((rc = wf_checkpoint_save(t->s, path)) < 0)
            snprintf(err, errlen, "--save: %s", wf_session_errmsg(t->s));
        return rc;
    }
    if ((rc = wf_safetensors_write(path, t->state, t->n_state)) < 0)
        snprintf(err, errlen, "--save: %s", wf_last_errmsg());
    return rc;
}

/* ---- Checkpoints every K steps, and resuming ---------------------------------------------- */

/* The extras of weft-train's checkpoints, beside the variables: the options that decide the
 * run's bits (resume.h's text, U8 bytes) and the data position (I64 [4]: steps done, steps
 * per epoch, training rows, batch). The position is all the data loader's state: epoch e's
 * order is a permutation drawn from (--seed, e), so steps done and steps per epoch say which
 * batch comes next. weft-train draws no other random numbers while it trains (no dropout;
 * the initial weights come from the seeds, and a resume replaces them all). */
#define X_OPTIONS  "weft-train.options"
#define X_POSITION "weft-train.position"

/* The options that decide the bits of a run, one "--option value" line each (resume.h). The
 * data hash covers the training rows after the split and the normalisation, so a changed
 * file is refused too; the explicit split and normalisation lines come first so that a
 * changed option is named as such. */
static int run_identity(const options *o, const trainer *t, const wt_dataset *train, char *buf,
                        size_t cap)
{
    char hidden[128] = "";
    for (int i = 0, at = 0; i < o->n_hidden && at < (int)sizeof hidden - 12; i++)
        at += snprintf(hidden + at, sizeof hidden - (size_t)at, i ? ",%d" : "%d", o->hidden[i]);
    size_t len = 0;
    buf[0] = '\0';
    int bad = 0;
    bad |= wt_runid_add(buf, cap, &len, "--model", "%s", o->model);
    if (strcmp(o->model, "mlp") == 0)
        bad |= wt_runid_add(buf, cap, &len, "--hidden", "%s", hidden);
    bad |= wt_runid_add(buf, cap, &len, "--optimizer", "%s", o->optimizer);
    bad |= wt_runid_add(buf, cap, &len, "--lr", "%.17g", t->opt.lr);
    bad |= wt_runid_add(buf, cap, &len, "--batch", "%d", o->batch);
    bad |= wt_runid_add(buf, cap, &len, "--seed", "%" PRIu64, o->seed);
    bad |= wt_runid_add(buf, cap, &len, "--no-shuffle", "%s", o->shuffle ? "off" : "on");
    bad |= wt_runid_add(buf, cap, &len, "--eager", "%s", o->eager ? "on" : "off");
    bad |= wt_runid_add(buf, cap, &len, "--mixed-bf16", "%s", o->mixed_bf16 ? "on" : "off");
    bad |= wt_runid_add(buf, cap, &len, "--test-fraction", "%.17g", o->test_fraction);
    bad |= wt_runid_add(buf, cap, &len, "--split-seed", "%" PRIu64, o->split_seed);
    bad |= wt_runid_add(buf, cap, &len, "--no-normalize", "%s", o->normalize ? "off" : "on");
    bad |= wt_runid_add(buf, cap, &len, "data", "%016" PRIx64 " (the hash of %lld training rows)",
                        wt_dataset_hash(train), (long long)train->n);
    return bad ? WF_ENOMEM : 0;
}

/* --strategy ps: every rank gets the servers' variables and optimizer state (a collective). */
static int ps_gather(trainer *t, char *err, size_t errlen)
{
    int rc = wf_session_ps_sync(t->s);
    if (rc < 0)
        snprintf(err, errlen, "gathering the servers' state: %s", wf_session_errmsg(t->s));
    return rc;
}

/* Hands the snapshot of 'step' (steps done) to the checkpointer. */
static int checkpoint_now(trainer *t, wf_checkpointer *c, long step, const char *runid,
                          int64_t per_epoch, int64_t n_train, char *err, size_t errlen)
{
    int64_t pos[4] = { step, per_epoch, n_train, t->o->batch };
    wf_tensor *id = wf_tensor_from(WF_U8, WF_SHAPE((int64_t)strlen(runid)), runid);
    wf_tensor *at = wf_tensor_from(WF_I64, WF_SHAPE(4), pos);
    wf_named_tensor xs[4 * MAX_PARAMS + 6];
    int n = 0;
    for (int i = 0; t->o->eager && i < t->n_state; i++)
        xs[n++] = t->state[i];
    xs[n++] = (wf_named_tensor){ X_OPTIONS, id };
    xs[n++] = (wf_named_tensor){ X_POSITION, at };
    int rc = id && at ? wf_checkpointer_save(c, t->o->eager ? NULL : t->s, step, xs, n) : WF_ENOMEM;
    if (rc < 0)
        snprintf(err, errlen, "--checkpoint-dir %s: %s", t->o->ckpt_dir, wf_last_errmsg());
    wf_tensor_release(id);
    wf_tensor_release(at);
    return rc;
}

/* Checks a checkpoint's extras against this run: the options and the data position. */
static int check_extras(const char *path, const wf_tensor *id, const wf_tensor *at, int64_t step,
                        const char *runid, const int64_t want[4], char *err, size_t errlen)
{
    char why[1024];
    if (!id || !at || wf_tensor_dtype(id) != WF_U8 || wf_tensor_shape(id).rank != 1 ||
        !wf_tensor_data_i64(at) || wf_tensor_numel(at) != 4) {
        snprintf(err, errlen,
                 "--resume %s: not a checkpoint of weft-train (no U8 '" X_OPTIONS
                 "' and I64 [4] '" X_POSITION "')",
                 path);
        return WF_EFORMAT;
    }
    if (wt_runid_check(wf_tensor_data(id), (size_t)wf_tensor_numel(id), runid, why, sizeof why) <
        0) {
        snprintf(err, errlen, "--resume %s: %s", path, why);
        return WF_EINVAL;
    }
    const int64_t *pos = wf_tensor_data_i64(at);
    if (pos[0] != step || pos[1] != want[1] || pos[2] != want[2] || pos[3] != want[3]) {
        snprintf(err, errlen,
                 "--resume %s: its data position (step %lld, %lld steps per epoch, %lld rows, "
                 "batch %lld) does not fit this run (step %lld, %lld, %lld, %lld)",
                 path, (long long)pos[0], (long long)pos[1], (long long)pos[2], (long long)pos[3],
                 (long long)step, (long long)want[1], (long long)want[2], (long long)want[3]);
        return WF_EINVAL;
    }
    return 0;
}

/* --strategy: which checkpoint every rank resumes from. Rank 0 picks the newest complete one
 * of --checkpoint-dir and sends its name to the others, so that all of them load the same
 * file: ranks picking for themselves could differ when one becomes complete between their
 * picks (weft-run ends every rank of a start before the next, another launcher may not).
 * 'rc' is rank 0's result (WF_ENOTFOUND: no checkpoint yet, a fresh start for all). */
typedef struct resume_pick {
    int64_t step, rc;
    char name[256]; /* the file's name inside --checkpoint-dir */
} resume_pick;

/* The newest complete checkpoint of --checkpoint-dir: its path and step, on this rank (rank
 * 0's choice on every rank under --strategy). Returns 0, WF_ENOTFOUND (none yet) or the
 * error, with the message in 'err': rank 0's result, the same on every rank. 'path' is
 * empty (with the message in 'err') when rank 0's choice does not fit it on this rank. */
static int resume_pick_file(trainer *t, char *path, size_t cap, int64_t *st, char *err,
                            size_t errlen)
{
    const char *dir = t->o->ckpt_dir;
    resume_pick pk = { .step = 0, .rc = 0 };
    if (!t->comm || t->rank == 0) {
        pk.rc = wf_checkpoint_latest(dir, path, cap, &pk.step);
        if (pk.rc < 0 && pk.rc != WF_ENOTFOUND)
            snprintf(err, errlen, "--resume: %s", wf_last_errmsg());
        const char *base = strrchr(path, '/');
        base = base ? base + 1 : path;
        if (pk.rc == 0 && strlen(base) >= sizeof pk.name) {
            snprintf(err, errlen, "--resume %s: the file name is longer than %zu bytes", path,
                     sizeof pk.name - 1);
            pk.rc = WF_EINVAL;
        }
        if (pk.rc == 0)
            snprintf(pk.name, sizeof pk.name, "%s", base);
    }
    if (t->comm) {
        int rc = wf_comm_broadcast(t->comm, &pk, sizeof pk, 0);
        if (rc < 0) {
            snprintf(err, errlen, "--resume: receiving rank 0's choice of checkpoint: %s",
                     wf_last_errmsg());
            return rc;
        }
        pk.name[sizeof pk.name - 1] = '\0';
        if (t->rank != 0 && pk.rc < 0 && pk.rc != WF_ENOTFOUND)
            snprintf(err, errlen, "--resume: rank 0 could not pick a checkpoint of %s (%s)", dir,
                     wf_err_name((int)pk.rc));
        /* a path that does not fit fails the load, not the pick: every rank must reach
         * resume_agree() for the others not to wait for it */
        if (t->rank != 0 && pk.rc == 0 &&
            (size_t)snprintf(path, cap, "%s/%s", dir, pk.name) >= cap) {
            snprintf(err, errlen, "--resume: the path of %s in %s is too long", pk.name, dir);
            path[0] = '\0';
        }
    }
    *st = pk.step;
    return (int)pk.rc;
}

/* --strategy, after every rank has loaded (or failed to load) the checkpoint of 'step':
 * every rank learns every other's result and the hash of what it read, so that all of them
 * go on from the same values or all of them fail, naming the rank that differs. */
static int resume_agree(trainer *t, int rc, int64_t step, uint64_t hash, const char *path,
                        char *err, size_t errlen)
{
    int n = wf_comm_size(t->comm);
    int64_t mine[3] = { rc, step, (int64_t)hash };
    int64_t *all = malloc((size_t)n * sizeof mine);
    int cr = all ? wf_comm_allgather(t->comm, mine, all, sizeof mine) : WF_ENOMEM;
    if (cr < 0) {
        if (rc == 0)
            snprintf(err, errlen, "--resume: comparing the checkpoint with the other ranks: %s",
                     cr == WF_ENOMEM ? "no memory" : wf_last_errmsg());
        free(all);
        return rc < 0 ? rc : cr;
    }
    for (int r = 0; rc == 0 && r < n; r++) {
        const int64_t *o = all + 3 * r;
        if (o[0] < 0) {
            snprintf(err, errlen,
                     "--resume %s: rank %d could not load it (%s; its own message "
                     "says why)",
                     path, r, wf_err_name((int)o[0]));
            rc = WF_EPEER;
        } else if (o[1] != step || o[2] != (int64_t)hash) {
            snprintf(err, errlen,
                     "--resume %s: rank %d read other values (step %lld, hash "
                     "%016" PRIx64 ") than rank %d (step %lld, hash %016" PRIx64 "): give every "
                     "rank the same --checkpoint-dir",
                     path, r, (long long)o[1], (uint64_t)o[2], t->rank, (long long)step, hash);
            rc = WF_EINVAL;
        }
    }
    free(all);
    return rc;
}

/* Loads the checkpoint 'path' of step 'st' into the trainer, after checking its extras. Its
 * tensors' hash goes to '*hash'. */
static int resume_load(trainer *t, const char *path, int64_t st, const char *runid,
                       int64_t per_epoch, int64_t n_train, uint64_t *hash, char *err, size_t errlen)
{
    const options *o = t->o;
    /* The extras first, so that a run of other options is refused naming the option rather
     * than the first variable whose shape it changed. */
    wf_named_tensor *ts = NULL;
    int n = 0;
    int rc = wf_safetensors_read(path, &ts, &n);
    if (rc < 0) {
        snprintf(err, errlen, "--resume %s: %s", path, wf_last_errmsg());
        return rc;
    }
    *hash = wt_tensors_hash(ts, n);
    const wf_tensor *id = NULL, *at = NULL;
    for (int i = 0; i < n; i++)
        if (strcmp(ts[i].name, X_OPTIONS) == 0)
            id = ts[i].tensor;
        else if (strcmp(ts[i].name, X_POSITION) == 0)
            at = ts[i].tensor;
    const int64_t want[4] = { st, per_epoch, n_train, o->batch };
    rc = check_extras(path, id, at, st, runid, want, err, errlen);
    if (rc == 0 && !o->eager) {
        /* A session loads its variables itself (all of them, checked); the file may hold
         * nothing else but the two extras. */
        wf_named_tensor *ex = NULL;
        int n_ex = 0;
        int64_t fstep = -1;
        if ((rc = wf_checkpoint_restore(t->s, path, &fstep, &ex, &n_ex)) < 0)
            snprintf(err, errlen, "--resume %s: %s", path, wf_session_errmsg(t->s));
        if (rc == 0 && fstep != st) { /* the file changed since it was picked */
            snprintf(err, errlen, "--resume %s: its step is %lld, not %lld as when it was picked",
                     path, (long long)fstep, (long long)st);
            rc = WF_EINVAL;
        }
        for (int i = 0; rc == 0 && i < n_ex; i++)
            if (strcmp(ex[i].name, X_OPTIONS) != 0 && strcmp(ex[i].name, X_POSITION) != 0) {
                snprintf(err, errlen, "--resume %s: tensor '%s' is not a variable of the model",
                         path, ex[i].name);
                rc = WF_EINVAL;
            }
        wf_safetensors_free(ex, n_ex);
    }
    /* An eager run's variables: the rest of the file, instead of any --init values. */
    for (int i = 0; rc == 0 && o->eager && i < t->n_state; i++) {
        wf_tensor_release(t->state[i].tensor);
        t->state[i].tensor = NULL;
    }
    if (rc == 0 && o->eager)
        t->n_state = 0;
    for (int i = 0; rc == 0 && o->eager && i < n; i++) {
        if (ts[i].tensor == id || ts[i].tensor == at)
            continue;
        if (t->n_state == MAX_PARAMS * 4) {
            snprintf(err, errlen, "--resume %s: more than %d tensors", path, MAX_PARAMS * 4);
            rc = WF_EINVAL;
            break;
        }
        snprintf(t->names[t->n_state], sizeof t->names[0], "%s", ts[i].name);
        t->state[t->n_state].name = t->names[t->n_state];
        t->state[t->n_state++].tensor = wf_tensor_retain(ts[i].tensor);
    }
    wf_safetensors_free(ts, n);
    return rc;
}

/* --resume: loads the newest complete checkpoint of --checkpoint-dir into the trainer and
 * sets '*step' to its step; with none there, '*step' is 0 (a fresh start). Under --strategy
 * every rank loads rank 0's choice and all of them check that they read the same values. */
static int resume(trainer *t, const char *runid, int64_t per_epoch, int64_t n_train, long *step,
                  char *err, size_t errlen)
{
    const options *o = t->o;
    char path[4096] = "";
    int64_t st = 0;
    *step = 0;
    int rc = resume_pick_file(t, path, sizeof path, &st, err, errlen);
    if (rc == WF_ENOTFOUND) {
        if (!o->quiet)
            printf("weft-train: --resume: no checkpoint in %s yet, starting at step 0\n",
                   o->ckpt_dir);
        return 0;
    }
    if (rc < 0)
        return rc;
    uint64_t hash = 0;
    rc = path[0] ? resume_load(t, path, st, runid, per_epoch, n_train, &hash, err, errlen)
                 : WF_EINVAL;
    if (t->comm)
        rc = resume_agree(t, rc, st, hash, path, err, errlen);
    if (rc < 0)
        return rc;
    *step = (long)st;
    if (!o->quiet && t->comm && wf_comm_size(t->comm) > 1)
        printf("weft-train: resuming from %s (step %ld) on all %d ranks (hash %016" PRIx64 ")\n",
               path, *step, wf_comm_size(t->comm), hash);
    else if (!o->quiet)
        printf("weft-train: resuming from %s (step %ld)\n", path, *step);
    return 0;
}

/* ---- Command line -------------------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(
        f, "usage: weft-train [options]\n"
           "data (default: the bundled 8x8 handwritten digits):\n"
           "  --data-csv FILE          features then label per line (.gz read as gzip)\n"
           "  --data-idx IMAGES LABELS MNIST IDX files (raw or .gz)\n"
           "  --data-npy X.npy Y.npy   float32 [N, ...] features, int32/int64 [N] labels\n"
           "  --test-fraction F        the last F of the rows are the test set (0.2)\n"
           "  --split-seed S           draw the test set at random with seed S instead\n"
           "  --no-normalize           keep the features as read (default: standardise)\n"
           "model and training:\n"
           "  --model mlp|cnn          (mlp)\n"
           "  --hidden N[,N...]        mlp hidden layer sizes (128)\n"
           "  --optimizer sgd|momentum|adam|adamw|rmsprop|adagrad   (adam)\n"
           "  --lr LR                  (adam 1e-3; sgd 0.05; momentum 0.02; ...)\n"
           "  --batch B                (32)\n"
           "  --epochs E | --steps S   (15 epochs)\n"
           "  --seed S                 initial weights and shuffling (1)\n"
           "  --no-shuffle             batch t is rows [tB, (t+1)B) in file order\n"
           "  --threads N              weft workers (default: one per core)\n"
           "  --eager                  eager execution (a graph per step) instead of a session\n"
           "  --mixed-bf16             mixed precision: matmuls and convolutions in bf16, with\n"
           "                           f32 master weights (WF_SESSION_MIXED_BF16)\n"
           "files:\n"
           "  --init FILE.safetensors  start from these weights (PyTorch names: fc1.weight ...)\n"
           "  --save FILE.safetensors  write the weights and optimizer state at the end\n"
           "  --log FILE.jsonl         one JSON object per step, and per evaluation\n"
           "  --plot FILE.svg          loss and accuracy per step (train) and per evaluation\n"
           "                           (test) as an SVG picture; open it in a browser\n"
           "  --trace FILE.json        a Perfetto/chrome://tracing trace of the scheduler;\n"
           "                           weft-trace FILE.json summarises it (time per op,\n"
           "                           critical path, idle and steals; --svg: a timeline)\n"
           "  --dump-graph FILE.dot    the training step after the compile passes, as Graphviz\n"
           "                           DOT (render: dot -Tsvg FILE.dot > graph.svg)\n"
           "  --checkpoint-every K     a checkpoint every K steps into --checkpoint-dir, written\n"
           "                           in the background (weights, optimizer state, data\n"
           "                           position, options)\n"
           "  --checkpoint-dir D       the folder of the checkpoints (made if missing)\n"
           "  --keep N                 keep the newest N checkpoints (3)\n"
           "  --resume                 go on from the newest complete checkpoint of D (none:\n"
           "                           start at step 0); refused if the options differ.\n"
           "                           Under --strategy every rank loads rank 0's newest\n"
           "                           (rank 0 writes them; give all ranks the same D)\n"
           "  --strategy multiworker   data parallel over the ranks of weft-run -n N: --batch\n"
           "                           is the global batch, of which each rank fills only the\n"
           "                           rows of its shards; only rank 0 prints, logs and saves\n"
           "  --shards S               its shards (default: the number of ranks); any number of\n"
           "                           ranks dividing S trains the same bits\n"
           "  --strategy mirrored      data parallel over devices of this process: one replica\n"
           "                           per device, gradients summed on the host, the bits of\n"
           "                           one process with the same --shards (default: devices)\n"
           "  --devices N              mirrored's devices: the first N GPUs, or, with fewer\n"
           "                           GPUs than N, N simulated devices (CPU kernels on memory\n"
           "                           of their own: a check, not a speed-up)\n"
           "  --strategy ps --ps-ranks K\n"
           "                           parameter servers: ranks 0 .. K-1 hold the variables and\n"
           "                           the optimizer state, the others train (shards: the\n"
           "                           workers); rank K prints, logs and saves, rank 0 writes the\n"
           "                           checkpoints (each gathers the servers' optimizer state)\n"
           "  --staleness s            0 (the default): synchronous, the bits of multiworker\n"
           "                           over the workers; s > 0: asynchronous, each push applied\n"
           "                           as it arrives, no worker more than s steps ahead of the\n"
           "                           slowest (rank K's losses and test accuracy are its own\n"
           "                           rows' estimates)\n"
           "  --strategy pipeline      the layers split into stages, one per rank of weft-run\n"
           "                           -n N, each step's batch into micro-batches: the bits of\n"
           "                           multiworker with as many shards on one rank; epochs drop\n"
           "                           the last partial batch, evaluations the rows past the\n"
           "                           last whole batch; each checkpoint gathers the stages'\n"
           "                           weights and optimizer state to rank 0, which writes it\n"
           "  --stages P               its stages: the number of ranks (the default)\n"
           "  --micro-batches M        micro-batches per step (default 1; at most 64, --batch)\n"
           "  --schedule gpipe|1f1b    their order (default 1f1b: at most P micro-batches of\n"
           "                           activations alive)\n"
           "  --placement auto|FILE    the stages: auto, the planner's (it prints its plan:\n"
           "                           nodes, predicted times, bubble, memory per stage); FILE,\n"
           "                           lines \"NAME rank:K/cpu:0\" (NAME a layer, fc1 ..,\n"
           "                           conv1 .., or a node's name; '#' comments); default:\n"
           "                           the layers split evenly. With --dump-graph, FILE.dot\n"
           "                           draws the stages and their send/recv pairs\n"
           "  --quiet                  only the final line\n"
           "Ctrl-C stops after the current step and writes the log, plot and trace so far\n"
           "(not the checkpoint); the exit status is then 130.\n");
}

static int parse_hidden(const char *s, options *o)
{
    o->n_hidden = 0;
    while (*s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v <= 0 || v > 1 << 20 || o->n_hidden == MAX_LAYERS - 1)
            return -1;
        o->hidden[o->n_hidden++] = (int)v;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',')
            return -1;
    }
    return o->n_hidden ? 0 : -1;
}

/* Option 'name''s value 's', a count from 1 to 'max', into '*out'; -1 (said) otherwise. */
static int parse_count(const char *name, const char *s, int max, int *out)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (*end || end == s || v < 1 || v > max) {
        fprintf(stderr, "weft-train: %s %s: expected a count from 1 to %d\n", name, s, max);
        return -1;
    }
    *out = (int)v;
    return 0;
}

static int parse_args(int argc, char **argv, options *o)
{
    *o = (options){ .model = "mlp",
                    .optimizer = "adam",
                    .batch = 32,
                    .seed = 1,
                    .shuffle = true,
                    .normalize = true,
                    .test_fraction = 0.2,
                    .hidden = { 128 },
                    .n_hidden = 1,
                    .schedule = WF_SCHEDULE_1F1B };
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
#define ARG(n) argv[i + (n)] /* after NEED(n) */
#define NEED(n)                                                          \
    do {                                                                 \
        if (i + (n) >= argc) {                                           \
            fprintf(stderr, "weft-train: %s needs %d value(s)\n", a, n); \
            return -1;                                                   \
        }                                                                \
    } while (0)
        char *end = NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            exit(0);
        } else if (strcmp(a, "--data-csv") == 0) {
            NEED(1);
            o->csv = argv[++i];
        } else if (strcmp(a, "--data-idx") == 0) {
            NEED(2);
            o->idx[0] = argv[++i];
            o->idx[1] = argv[++i];
        } else if (strcmp(a, "--data-npy") == 0) {
            NEED(2);
            o->npy[0] = argv[++i];
            o->npy[1] = argv[++i];
        } else if (strcmp(a, "--model") == 0) {
            NEED(1);
            o->model = argv[++i];
        } else if (strcmp(a, "--hidden") == 0) {
            NEED(1);
            if (parse_hidden(argv[++i], o) < 0) {
                fprintf(stderr, "weft-train: --hidden %s: expected sizes like 128 or 256,128\n",
                        argv[i]);
                return -1;
            }
        } else if (strcmp(a, "--optimizer") == 0) {
            NEED(1);
            o->optimizer = argv[++i];
        } else if (strcmp(a, "--lr") == 0 || strcmp(a, "--test-fraction") == 0) {
            NEED(1);
            double v = strtod(ARG(1), &end);
            if (*end || end == ARG(1)) {
                fprintf(stderr, "weft-train: %s %s: not a number\n", a, ARG(1));
                return -1;
            }
            *(a[2] == 'l' ? &o->lr : &o->test_fraction) = v;
            i++;
        } else if (strcmp(a, "--batch") == 0 || strcmp(a, "--steps") == 0 ||
                   strcmp(a, "--epochs") == 0 || strcmp(a, "--seed") == 0 ||
                   strcmp(a, "--threads") == 0 || strcmp(a, "--split-seed") == 0 ||
                   strcmp(a, "--checkpoint-every") == 0 || strcmp(a, "--keep") == 0) {
            NEED(1);
            long long v = strtoll(ARG(1), &end, 10);
            if (*end || end == ARG(1) || v < 0 ||
                (v == 0 && strcmp(a, "--seed") != 0 && strcmp(a, "--threads") != 0)) {
                fprintf(stderr, "weft-train: %s %s: expected a positive integer\n", a, ARG(1));
                return -1;
            }
            if (strcmp(a, "--split-seed") == 0) /* not a[3]: "--epochs" has a 'p' there too */
                o->split_seed = (uint64_t)v;
            else if (strcmp(a, "--checkpoint-every") == 0)
                o->ckpt_every = v > 1L << 40 ? 1L << 40 : (long)v;
            else if (strcmp(a, "--keep") == 0)
                o->keep = v > 1 << 20 ? 1 << 20 : (int)v;
            else if (a[2] == 'b')
                o->batch = v > 1 << 20 ? 1 << 20 : (int)v;
            else if (a[3] == 't')
                o->steps = (long)v;
            else if (a[2] == 'e')
                o->epochs = (long)v;
            else if (a[3] == 'e')
                o->seed = (uint64_t)v;
            else
                o->threads = (int)v;
            i++;
        } else if (strcmp(a, "--strategy") == 0) {
            NEED(1);
            o->strategy = argv[++i];
            o->pipeline = strcmp(o->strategy, "pipeline") == 0;
            if (strcmp(o->strategy, "multiworker") != 0 && strcmp(o->strategy, "mirrored") != 0 &&
                strcmp(o->strategy, "ps") != 0 && !o->pipeline) {
                fprintf(stderr,
                        "weft-train: --strategy %s: expected multiworker, mirrored, ps or "
                        "pipeline\n",
                        o->strategy);
                return -1;
            }
        } else if (strcmp(a, "--stages") == 0 || strcmp(a, "--micro-batches") == 0) {
            NEED(1);
            if (parse_count(a, argv[++i], 64, a[2] == 's' ? &o->stages : &o->micro_batches) < 0)
                return -1;
        } else if (strcmp(a, "--placement") == 0) {
            NEED(1);
            o->placement = argv[++i];
        } else if (strcmp(a, "--schedule") == 0) {
            NEED(1);
            const char *v = argv[++i];
            if (strcmp(v, "gpipe") != 0 && strcmp(v, "1f1b") != 0) {
                fprintf(stderr, "weft-train: --schedule %s: expected gpipe or 1f1b\n", v);
                return -1;
            }
            o->schedule = strcmp(v, "gpipe") == 0 ? WF_SCHEDULE_GPIPE : WF_SCHEDULE_1F1B;
            o->schedule_set = true;
        } else if (strcmp(a, "--ps-ranks") == 0 || strcmp(a, "--staleness") == 0) {
            NEED(1);
            char *end;
            long v = strtol(argv[++i], &end, 10);
            if (*end || v < -4096 || v > 4096) {
                fprintf(stderr, "weft-train: %s %s: expected a count\n", a, argv[i]);
                return -1;
            }
            if (a[2] == 'p') {
                o->ps_ranks = (int)v;
            } else {
                o->staleness = (int)v;
                o->staleness_set = true;
            }
        } else if (strcmp(a, "--devices") == 0 || strcmp(a, "--shards") == 0) {
            NEED(1);
            bool dev = a[2] == 'd';
            if (parse_count(a, argv[++i], dev ? 64 : 4096, dev ? &o->devices : &o->shards) < 0)
                return -1;
        } else if (strcmp(a, "--eager") == 0) {
            o->eager = true;
        } else if (strcmp(a, "--mixed-bf16") == 0) {
            o->mixed_bf16 = true;
        } else if (strcmp(a, "--no-shuffle") == 0) {
            o->shuffle = false;
        } else if (strcmp(a, "--no-normalize") == 0) {
            o->normalize = false;
        } else if (strcmp(a, "--quiet") == 0) {
            o->quiet = true;
        } else if (strcmp(a, "--resume") == 0) {
            o->resume = true;
        } else if (strcmp(a, "--checkpoint-dir") == 0) {
            NEED(1);
            o->ckpt_dir = argv[++i];
        } else if (strcmp(a, "--init") == 0 || strcmp(a, "--save") == 0 ||
                   strcmp(a, "--log") == 0 || strcmp(a, "--trace") == 0 ||
                   strcmp(a, "--dump-graph") == 0 || strcmp(a, "--plot") == 0) {
            NEED(1);
            const char **dst = a[2] == 'd'   ? &o->dump_graph
                               : a[2] == 'p' ? &o->plot
                               : a[2] == 'i' ? &o->init
                               : a[2] == 's' ? &o->save
                               : a[2] == 'l' ? &o->log
                                             : &o->trace;
            *dst = argv[++i];
        } else {
            fprintf(stderr, "weft-train: unknown option '%s' (--help lists them)\n", a);
            return -1;
        }
#undef ARG
#undef NEED
    }
    if (o->mixed_bf16 && o->eager) {
        fprintf(stderr, "weft-train: --mixed-bf16 is a compile pass: not with --eager\n");
        return -1;
    }
    if ((o->ckpt_every || o->resume) && !o->ckpt_dir) {
        fprintf(stderr, "weft-train: %s needs --checkpoint-dir D\n",
                o->resume ? "--resume" : "--checkpoint-every");
        return -1;
    }
    if (o->keep && !o->ckpt_every) {
        fprintf(stderr, "weft-train: --keep needs --checkpoint-every K\n");
        return -1;
    }
    if (o->strategy && o->eager) {
        fprintf(stderr, "weft-train: --strategy rewrites a static graph: not with --eager\n");
        return -1;
    }
    if (o->shards && (!o->strategy || o->pipeline)) {
        fprintf(stderr, "weft-train: --shards needs --strategy multiworker, mirrored or ps (a "
                        "pipeline's are --micro-batches)\n");
        return -1;
    }
    if (o->devices && !(o->strategy && strcmp(o->strategy, "mirrored") == 0)) {
        fprintf(stderr, "weft-train: --devices needs --strategy mirrored\n");
        return -1;
    }
    bool ps = o->strategy && strcmp(o->strategy, "ps") == 0;
    if ((o->ps_ranks || o->staleness_set) && !ps) {
        fprintf(stderr, "weft-train: --ps-ranks and --staleness need --strategy ps\n");
        return -1;
    }
    if (ps && !o->ps_ranks) {
        fprintf(stderr, "weft-train: --strategy ps needs --ps-ranks K (the server ranks)\n");
        return -1;
    }
    if ((o->stages || o->micro_batches || o->schedule_set || o->placement) && !o->pipeline) {
        fprintf(stderr, "weft-train: --stages, --micro-batches, --schedule and --placement need "
                        "--strategy pipeline\n");
        return -1;
    }
    o->save_any = o->save != NULL;
    if (o->steps && o->epochs) {
        fprintf(stderr, "weft-train: give --steps or --epochs, not both\n");
        return -1;
    }
    if (!o->steps && !o->epochs)
        o->epochs = 15;
    return 0;
}

static int read_data(const options *o, wt_dataset *ds, char *err, size_t errlen)
{
    if (o->idx[0])
        return wt_load_idx(o->idx[0], o->idx[1], ds, err, errlen);
    if (o->npy[0])
        return wt_load_npy(o->npy[0], o->npy[1], ds, err, errlen);
    if (o->csv)
        return wt_load_csv(o->csv, ds, err, errlen);
    /* the bundled digits: WEFT_DIGITS, else installed in <program>/../share/weft/ (wherever
     * the prefix was moved), else in the source tree */
    char path[4096], tried[3 * 4096 + 8];
    if (wt_bundled_find(getenv("WEFT_DIGITS"), WT_DATADIR, "digits.csv.gz", WT_DIGITS_SOURCE, path,
                        sizeof path, tried, sizeof tried) == 0) {
        if (!o->quiet)
            printf("weft-train: the bundled digits: %s\n", path);
        return wt_load_csv(path, ds, err, errlen);
    }
    snprintf(err, errlen,
             "the bundled digits were not found (%s); give --data-csv FILE or "
             "set WEFT_DIGITS",
             tried);
    return WF_ENOTFOUND;
}

/* The data, with square images given as flat rows (the digits' 64 pixels) seen as
 * [1, side, side] by the CNN. */
static int load_data(const options *o, wt_dataset *ds, char *err, size_t errlen)
{
    int rc = read_data(o, ds, err, errlen);
    if (rc < 0 || strcmp(o->model, "cnn") != 0 || ds->rank != 1)
        return rc;
    int64_t side = (int64_t)(sqrt((double)ds->n_features) + 0.5);
    if (side * side != ds->n_features)
        return 0; /* make_model() says why the CNN cannot take it */
    return wt_dataset_reshape(ds, 3, (const int64_t[]){ 1, side, side }, err, errlen);
}

/* Set by the first Ctrl-C (SIGINT): the training loop stops after the step it is in. A
 * handler can only talk to the program through such a flag; it is the program's one
 * mutable global. */
static volatile sig_atomic_t interrupted;

static void on_sigint(int sig)
{
    (void)sig;
    interrupted = 1;
}

/* Writes the plot, if one was asked for, and says where; 'rc' is the run's status so far,
 * returned unless writing fails. */
static int finish_plot(wt_plot *plot, const options *o, const trainer *t, long steps, int rc,
                       char *err, size_t errlen)
{
    if (!o->plot)
        return rc;
    char title[256];
    snprintf(title, sizeof title, "weft-train: %s model, %s lr %g, batch %d, %ld steps%s", o->model,
             o->optimizer, t->opt.lr, o->batch, steps,
             rc < 0        ? " (stopped by an error)"
             : interrupted ? " (interrupted)"
                           : "");
    char perr[600];
    if (wt_plot_finish(plot, title, perr, sizeof perr) < 0) {
        if (rc < 0) { /* keep the first error; this one is printed */
            fprintf(stderr, "weft-train: %s\n", perr);
            return rc;
        }
        snprintf(err, errlen, "%s", perr);
        return WF_EIO;
    }
    printf("weft-train: plot of %ld steps in %s (open it in a browser)\n", plot->train_loss.n,
           o->plot);
    return rc;
}

/* The stage of variable 'name' (wt_ranks_gather()): the session's (the planner's or the
 * --placement file's, wf_session_pipeline_stage(): the lowest stage reading it); 0 for what
 * every stage keeps current (the step counters). */
static int param_stage(const char *name, void *ctx)
{
    const trainer *t = ctx;
    for (int id = 0; id < t->n_user; id++) {
        wf_node *n = wf_graph_node(t->g, id);
        if (strcmp(wf_node_op(n), "variable") == 0 && strcmp(wf_node_name(n), name) == 0) {
            int st = wf_session_pipeline_stage(t->s, n);
            return st > 0 ? st : 0;
        }
    }
    return 0;
}

/* --strategy pipeline, before rank 0 saves: each variable of a layer on another stage is
 * current only on that stage's rank, which broadcasts it, and rank 0 takes it (the optimizer
 * state "<param>/..." goes with its parameter; the step counters are current everywhere). */
static int gather_stages(trainer *t, char *err, size_t errlen)
{
    return wt_ranks_gather(t->comm, t->s, t->g, param_stage, t, err, errlen);
}

/* --strategy: the communicator of weft-run's ranks (WEFT_RANK, WEFT_SIZE, ... or Slurm's,
 * Open MPI's) and the strategy over it. Ranks other than writer_rank() go quiet and write no
 * files. */
static int join_ranks(options *o, trainer *t, char *err, size_t errlen)
{
    int rc;
    if (strcmp(o->strategy, "mirrored") == 0)
        return wt_mirrored(t->rt, o->devices, o->shards, "weft-train", o->quiet, &t->strategy, err,
                           errlen);
    if ((rc = wt_ranks_comm(t->rt, &t->comm, err, errlen)) < 0)
        return rc;
    t->rank = wf_comm_rank(t->comm);
    bool planner = o->placement && strcmp(o->placement, "auto") == 0;
    if (o->pipeline && !planner && (rc = wf_place_hints_create(&t->hints)) < 0) {
        snprintf(err, errlen, "--strategy: %s", wf_last_errmsg());
        return rc;
    }
    if (o->pipeline && o->placement && !planner) {
        if (!(t->pfile = malloc(sizeof *t->pfile))) {
            snprintf(err, errlen, "--placement: no memory");
            return WF_ENOMEM;
        }
        int ranks = o->stages ? o->stages : wf_comm_size(t->comm);
        if ((rc = wt_place_file_read(o->placement, ranks, t->pfile, err, errlen)) < 0)
            return rc;
    }
    if (o->pipeline)
        rc = wf_strategy_pipeline(
            t->comm,
            &(wf_pipeline_opts){ .stages = o->stages,
                                 .micro_batches = o->micro_batches,
                                 .schedule = o->schedule,
                                 .batch_rows = o->batch,
                                 .hints = t->hints,
                                 .placement = planner ? WF_PIPELINE_PLACE_AUTO : 0 },
            &t->strategy);
    else if (o->ps_ranks)
        rc = wf_strategy_ps(
            t->comm,
            &(wf_ps_opts){ .servers = o->ps_ranks, .staleness = o->staleness, .shards = o->shards },
            &t->strategy);
    else
        rc = wf_strategy_multiworker(t->comm, &(wf_strategy_opts){ .shards = o->shards },
                                     &t->strategy);
    if (rc < 0) {
        snprintf(err, errlen, "--strategy: %s", wf_last_errmsg());
        return rc;
    }
    return 0;
}

/* --strategy, before any file is opened: a rank other than writer_rank() (from the environment)
 * writes no log, plot, checkpoint, trace or graph, and prints nothing (its errors still go to
 * stderr). */
static int quiet_other_ranks(options *o)
{
    int rank = wt_ranks_env_rank();
    if (rank < 0) {
        fprintf(stderr, "weft-train: --strategy: %s\n", wf_last_errmsg());
        return -1;
    }
    if (rank != writer_rank(o)) {
        o->quiet = true;
        o->log = o->plot = o->save = o->trace = o->dump_graph = NULL;
        if (!freopen("/dev/null", "w", stdout))
            return -1;
    }
    return 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv)
{
    options o;
    if (parse_args(argc, argv, &o) < 0 ||
        (o.strategy && strcmp(o.strategy, "mirrored") != 0 && quiet_other_ranks(&o) < 0))
        return 2;
    /* Each line as it is printed, also into a pipe (weft-run's): a rank killed before its
     * buffer was full would otherwise take lines already printed ("resuming from ...") along. */
    setvbuf(stdout, NULL, _IOLBF, 0);
    char err[1024] = "";
    wt_dataset all = { 0 }, train = { 0 }, test = { 0 };
    model m;
    trainer t = { .o = &o, .m = &m };
    FILE *log = NULL;
    wf_checkpointer *ckpt = NULL; /* --checkpoint-every */
    int rc = load_data(&o, &all, err, sizeof err);
    if (rc == 0)
        rc = wt_split(&all, o.test_fraction, o.split_seed, &train, &test, err, sizeof err);
    if (rc == 0 && o.normalize)
        rc = wt_normalize(&train, &test, err, sizeof err);
    if (rc == 0)
        rc = make_model(&o, &train, &m, err, sizeof err);
    if (rc == 0)
        rc = parse_optimizer(&o, &t.opt, err, sizeof err);
    /* a resumed run's log goes on after the steps the earlier run logged */
    if (rc == 0 && o.log && !(log = fopen(o.log, o.resume ? "a" : "w"))) {
        snprintf(err, sizeof err, "--log %s: cannot open it for writing", o.log);
        rc = WF_EIO;
    }
    /* One write per line, so that a run killed (then resumed, appending) leaves whole lines:
     * a full buffer cut mid-line would glue half a line to the next run's first. */
    if (log)
        setvbuf(log, NULL, _IOLBF, 0);
    /* The plot's file is opened now, so a bad path fails before any training is done. */
    wt_plot plot = { 0 };
    if (rc == 0 && o.plot && wt_plot_open(&plot, o.plot, err, sizeof err) < 0)
        rc = WF_EIO;
    /* WEFT_WORKERS, WEFT_NO_PIN, WEFT_TOPOLOGY, WEFT_TRACE as every tool; options win. */
    wf_runtime_opts ro = { 0 };
    const char *env_trace = NULL;
    if (rc == 0 && (rc = wf_runtime_opts_from_env(&ro, &env_trace)) < 0)
        snprintf(err, sizeof err, "environment: %s", wf_last_errmsg());
    if (!o.trace)
        o.trace = env_trace;
    if (o.threads)
        ro.n_workers = o.threads;
    if (o.trace && !ro.trace_events)
        ro.trace_events = 1u << 18;
    if (rc == 0 && (rc = wf_runtime_create(&t.rt, &ro)) < 0)
        snprintf(err, sizeof err, "runtime: %s", wf_last_errmsg());
    if (rc == 0 && o.strategy)
        rc = join_ranks(&o, &t, err, sizeof err);
    if (rc == 0)
        rc = o.eager ? trainer_eager(&t, err, sizeof err) : trainer_static(&t, err, sizeof err);
    if (rc < 0) {
        fprintf(stderr, "weft-train: %s\n", err);
        goto out;
    }
    /* a pipeline is fed --batch rows in every step: its epochs drop the last partial batch */
    int64_t per_epoch = o.pipeline ? train.n / o.batch : (train.n + o.batch - 1) / o.batch;
    if (rc == 0 && per_epoch < 1) {
        fprintf(stderr,
                "weft-train: --strategy pipeline: %lld training rows, fewer than --batch %d\n",
                (long long)train.n, o.batch);
        rc = WF_EINVAL;
        goto out;
    }
    long total_steps = o.steps ? o.steps : (long)(o.epochs * per_epoch);
    long n_epochs = (total_steps + per_epoch - 1) / per_epoch;
    /* Checkpoints: the folder (made when missing), this run's identity, and the step to
     * start at (0, or the newest checkpoint's with --resume). */
    char runid[2048] = "";
    long step0 = 0;
    if (o.ckpt_dir && mkdir(o.ckpt_dir, 0777) != 0 && errno != EEXIST) {
        snprintf(err, sizeof err, "--checkpoint-dir %s: %s", o.ckpt_dir, strerror(errno));
        rc = WF_EIO;
    }
    if (rc == 0 && o.ckpt_dir && run_identity(&o, &t, &train, runid, sizeof runid) < 0) {
        snprintf(err, sizeof err, "--checkpoint-dir: the options do not fit %zu bytes",
                 sizeof runid);
        rc = WF_ENOMEM;
    }
    if (rc == 0 && o.ckpt_every && t.rank == 0 && /* one writer: rank 0 */
        (rc = wf_checkpointer_create(&(wf_checkpointer_opts){ .dir = o.ckpt_dir, .keep = o.keep },
                                     &ckpt)) < 0)
        snprintf(err, sizeof err, "--checkpoint-dir %s: %s", o.ckpt_dir, wf_last_errmsg());
    if (rc == 0 && o.resume)
        rc = resume(&t, runid, per_epoch, train.n, &step0, err, sizeof err);
    if (rc < 0) {
        fprintf(stderr, "weft-train: %s\n", err);
        goto out;
    }
    if (!o.quiet) {
        int64_t n_weights = 0;
        for (int i = 0; i < m.n_params; i++)
            n_weights += wf_shape_numel(m.p[i].shape);
        printf("weft-train: %lld train / %lld test samples, %lld features, %d classes; %s model "
               "(%lld weights), %s lr %g, batch %d, %ld steps, %s, %d workers\n",
               (long long)train.n, (long long)test.n, (long long)train.n_features, train.n_classes,
               o.model, (long long)n_weights, o.optimizer, t.opt.lr, o.batch, total_steps,
               o.eager ? "eager" : "static graph", wf_runtime_worker_count(t.rt));
    }
    float *xb = NULL;
    int32_t *yb = NULL;
    int64_t *perm = malloc((size_t)train.n * sizeof *perm);
    if (new_batch_buffers(o.batch, train.n_features, &xb, &yb) < 0 || !perm) {
        fprintf(stderr, "weft-train: no memory for a batch\n");
        rc = WF_ENOMEM;
        goto out_batch;
    }
    double t0 = now_s(), test_loss = NAN, test_acc = NAN;
    long step = step0 < total_steps ? step0 : total_steps;
    wt_progress bar;
    wt_progress_opts po = { .quiet = o.quiet };
    struct sigaction sa = { .sa_handler = on_sigint, .sa_flags = SA_RESETHAND | SA_RESTART };
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    /* A resumed run starts inside the epoch of its step, at the batch after it: epoch e's
     * order depends only on (--seed, e). */
    for (long epoch = step / per_epoch + 1; epoch <= n_epochs && rc == 0 && !interrupted; epoch++) {
        wt_permutation(train.n, o.shuffle ? o.seed * 1000003 + (uint64_t)epoch : WT_SPLIT_IN_ORDER,
                       perm);
        int64_t first = step - (epoch - 1) * per_epoch; /* > 0 only in a resumed epoch */
        int64_t this_epoch = per_epoch;
        if ((epoch - 1) * per_epoch + this_epoch > total_steps)
            this_epoch = total_steps - (epoch - 1) * per_epoch;
        int64_t n_samples = this_epoch == per_epoch ? train.n : this_epoch * o.batch;
        if (n_samples > train.n)
            n_samples = train.n;
        n_samples -= first * o.batch;
        wt_progress_begin(&bar, &po, (int)epoch, (int)n_epochs, n_samples);
        double lsum = 0, right = 0;
        int64_t seen = 0;
        for (int64_t b = first; b < this_epoch && rc == 0 && !interrupted; b++, step++) {
            int64_t at = b * o.batch, cnt = train.n - at < o.batch ? train.n - at : o.batch;
            if ((rc = fill_own_rows(&t, &train, perm, at, cnt, xb, yb)) < 0) {
                snprintf(err, sizeof err, "step %ld: the batch's rows: %s", step, wf_last_errmsg());
                break;
            }
            wf_tensor *x = wf_tensor_from(WF_F32, batch_shape(&m, cnt), xb);
            wf_tensor *y = wf_tensor_from(WF_I32, WF_SHAPE(cnt), yb);
            double loss = NAN, correct = 0;
            rc = x && y ? train_step(&t, x, y, &loss, &correct, err, sizeof err) : WF_ENOMEM;
            wf_tensor_release(x);
            wf_tensor_release(y);
            if (rc < 0)
                break;
            if (!isfinite(loss)) {
                snprintf(err, sizeof err, "step %ld: the loss is %g (try a smaller --lr)", step,
                         loss);
                rc = WF_EINVAL;
                break;
            }
            lsum += loss * (double)cnt;
            right += correct;
            seen += cnt;
            if (log)
                fprintf(log, "{\"step\":%ld,\"loss\":%.9g,\"accuracy\":%.6f}\n", step, loss,
                        correct / (double)cnt);
            if (o.plot && wt_plot_step(&plot, step, loss, correct / (double)cnt) < 0) {
                snprintf(err, sizeof err, "--plot: no memory for step %ld", step);
                rc = WF_ENOMEM;
                break;
            }
            wt_progress_update(&bar, seen, lsum / (double)seen, right / (double)seen);
            /* --strategy ps: every rank gathers the servers' state, which rank 0 saves */
            if (o.ps_ranks && o.ckpt_every && (step + 1) % o.ckpt_every == 0 &&
                (rc = ps_gather(&t, err, sizeof err)) < 0)
                break;
            /* --strategy pipeline: every rank sends rank 0 its stage's state, which it saves */
            if (o.pipeline && o.ckpt_every && (step + 1) % o.ckpt_every == 0 &&
                (rc = gather_stages(&t, err, sizeof err)) < 0)
                break;
            if (ckpt && (step + 1) % o.ckpt_every == 0 &&
                (rc = checkpoint_now(&t, ckpt, step + 1, runid, per_epoch, train.n, err,
                                     sizeof err)) < 0) {
                step++; /* this step is done; its checkpoint failed */
                break;
            }
        }
        if (rc == 0 && test.n > 0 && !interrupted) {
            rc = evaluate(&t, &test, &test_loss, &test_acc, err, sizeof err);
            if (rc == 0 && log)
                fprintf(log, "{\"step\":%ld,\"eval\":\"test\",\"loss\":%.9g,\"accuracy\":%.6f}\n",
                        step, test_loss, test_acc);
            if (rc == 0 && o.plot && wt_plot_eval(&plot, step, test_loss, test_acc) < 0) {
                snprintf(err, sizeof err, "--plot: no memory for an evaluation");
                rc = WF_ENOMEM;
            }
        }
        char note[64];
        snprintf(note, sizeof note, "test acc %.1f%%", 100 * test_acc);
        wt_progress_end_note(&bar, rc == 0 && test.n > 0 ? note : NULL);
    }
    /* The last checkpoint is written (and its failure seen) before the run says it is done. */
    if (ckpt && (rc == 0 || interrupted)) {
        int cr = wf_checkpointer_wait(ckpt);
        if (cr < 0 && rc == 0) {
            snprintf(err, sizeof err, "--checkpoint-dir %s: %s", o.ckpt_dir, wf_last_errmsg());
            rc = cr;
        }
    }
    if (rc < 0) { /* the plot of the steps done may show why */
        fprintf(stderr, "weft-train: %s\n", err);
        finish_plot(&plot, &o, &t, step, rc, err, sizeof err);
        goto out_batch;
    }
    double secs = now_s() - t0;
    if (interrupted)
        printf("weft-train: interrupted (Ctrl-C) after %ld steps in %.2f s; no checkpoint "
               "saved\n",
               step, secs);
    else
        printf("weft-train: %ld steps in %.2f s (%.0f samples/s%s); test accuracy %.2f%% (loss "
               "%.4f)\n",
               step - step0, secs, (double)(step - step0) * o.batch / secs,
               step0 ? ", resumed at a checkpoint" : "", 100 * test_acc, test_loss);
    if (o.pipeline && o.save_any && !interrupted && (rc = gather_stages(&t, err, sizeof err)) < 0)
        fprintf(stderr, "weft-train: %s\n", err);
    if (o.ps_ranks && o.save_any && !interrupted && rc == 0 &&
        (rc = ps_gather(&t, err, sizeof err)) < 0)
        fprintf(stderr, "weft-train: %s\n", err);
    if (rc == 0 && o.save && !interrupted && (rc = save(&t, o.save, err, sizeof err)) == 0)
        printf("weft-train: saved %s (safetensors: weights and optimizer state)\n", o.save);
    if (o.trace) {
        int ev = wf_runtime_trace_write(t.rt, o.trace);
        if (ev < 0) {
            snprintf(err, sizeof err, "--trace: %s", wf_last_errmsg());
            rc = ev;
        } else {
            printf("weft-train: trace of %d events in %s (open it at https://ui.perfetto.dev)\n",
                   ev, o.trace);
        }
    }
    if (rc == 0)
        rc = finish_plot(&plot, &o, &t, step, rc, err, sizeof err);
    if (o.dump_graph && rc == 0) { /* the plan of a training step, after the passes */
        FILE *df = t.s ? fopen(o.dump_graph, "w") : NULL;
        wf_node *fetch[2] = { t.loss, t.correct };
        int dr = !df          ? WF_EIO
                 : o.pipeline ? wt_stages_dot(t.s, t.g, t.n_user, wf_strategy_size(t.strategy), df)
                              : wf_session_dump(t.s, fetch, 2, &t.train, 1, df, WF_DUMP_DOT);
        if (df && fclose(df) != 0 && dr == 0)
            dr = WF_EIO;
        if (dr < 0) {
            snprintf(err, sizeof err, "--dump-graph %s: %s", o.dump_graph,
                     !t.s ? "needs a session (not --eager)"
                     : df ? wf_last_errmsg()
                          : "cannot open it for writing");
            rc = dr;
        } else {
            printf("weft-train: graph in %s (render: dot -Tsvg %s > graph.svg)\n", o.dump_graph,
                   o.dump_graph);
        }
    }
    if (rc < 0)
        fprintf(stderr, "weft-train: %s\n", err);
out_batch:
    free(xb);
    free(yb);
    free(perm);
out:
    wf_checkpointer_destroy(ckpt); /* before the session whose values it copied */
    wt_plot_free(&plot);
    if (log)
        fclose(log);
    for (int i = 0; i < t.n_state; i++)
        wf_tensor_release(t.state[i].tensor);
    wf_session_destroy(t.s);
    wf_graph_destroy(t.g);
    wf_strategy_destroy(t.strategy);
    wf_place_hints_destroy(t.hints);
    free(t.pfile);
    wf_comm_destroy(t.comm);
    wf_runtime_destroy(t.rt);
    wt_dataset_free(&all);
    wt_dataset_free(&train);
    wt_dataset_free(&test);
    return rc < 0 ? 1 : interrupted ? 130 : 0;
}
