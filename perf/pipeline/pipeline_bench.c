/* perf/pipeline/pipeline_bench.c: pipeline training (wf_strategy_pipeline, weft/distribute.h)
 * of one model split in 2 stages on 2 ranks (1 worker each, pinned to disjoint cores), GPipe
 * and 1F1B, m = 4, 8, 16 micro-batches of a global batch, against the same model split by
 * hand into 2 PyTorch processes (torch.distributed, gloo send/recv, GPipe, 1 thread each:
 * perf/pipeline/pipeline_bench_torch.py) and against weft in one process, in the same run.
 * Model: mlp, 1024-1024-1024-1024-1024-10 (ReLU, softmax cross-entropy, Adam 1e-3, batch
 *   256 of synthetic rows): stage 0 holds the first two layers, stage 1 the other two and the
 *   head, so the stages do the same matmuls within 0.5% (the head is 1024 x 10) and neither
 *   idles because of the split itself; what is left is the schedule's bubble and the
 *   transfers, which is what the bench measures.
 * Model: gpt (--only gpt), examples/train_gpt's model (gpt_model.c, linked): 4 blocks, 2 per
 *   stage, against the same model in PyTorch split the same way (pipeline_bench_torch.py
 *   --model gpt, which imports examples/train_gpt/torch_compare.py's modules); not run by
 *   default (--only mlp is).
 * Reported per case (JSON with --json): the median step time (rank 0's; a step ends on
 *   rank 0 with its optimizer update, the last of the flush), the peak RSS of the largest
 *   stage, and predicted_s, the schedule model's step time from the stage times measured in
 *   the same run:
 *     predicted_s = (m + p - 1) * max_k F_k + 2 (p - 1) * X + U_0
 *   with p = 2 stages, F_k the forward and backward of one micro-batch on stage k (the sum of
 *   the durations of stage k's per-micro-batch tasks, those named ".../mb<i>", in the run's
 *   trace, divided by m: one worker runs them one at a time), X the one-way transfer of one
 *   micro-batch's activation (half the round trip of wf_comm_probe_links() with that many
 *   bytes; the gradient that comes back has the same size), and U_0 stage 0's once-per-step
 *   work (its other tasks: the sum of the micro-batches' gradients and the update), which
 *   follows the flush's last backward. GPipe and 1F1B (PipeDream-Flush) have the same bubble,
 *   m + p - 1 slots of the slowest stage; 1F1B keeps fewer activations alive. Medians over
 *   the timed steps. predicted_over_measured is predicted_s / median_s: the share of the
 *   model's throughput reached (goal >= 0.9).
 *   The ratio line of each case gives weft's step over PyTorch's (GPipe's peer for both
 *   schedules; goal <= 0.7) and the largest stage's peak RSS over the single process's
 *   (goal <= 0.75).
 *   stage1_other_s: the last stage's tasks of no micro-batch, as U_0 is stage 0's: mostly
 *   the gradients' tree sums, which run between its micro-batches (each once both halves
 *   exist), on the slowest stage of 1F1B's steady state, and which the model leaves out.
 *   send_span_s: per stage, the median time its sends of one micro-batch's activation (or
 *   gradient) took in the run, from post to completion (the trace's transfer spans), against
 *   transfer_s, what the same bytes take alone: the rendezvous of a large message needs the
 *   sender's progress, which the transport's actor makes only between the worker's tasks.
 *   Every process traces (the stages' times come from the trace), the single one too, so the
 *   trace's memory is on both sides of the RSS ratio.
 *   fixed_rss_mb: the largest process's peak RSS once its runtime (and comm, after the link
 *   probe) exist, before any graph: the part of the process that the split cannot shrink.
 *   vars_mb and arena_mb: the largest stage's (or the single process's) bytes of variable
 *   values (wf_plan_stats.bytes_variables: a stage makes only its partition's) and of the
 *   training plan's arena (bytes_planned: a stage's holds about log2(m) + 1 partial sums of
 *   its gradients, the fixed tree's over the micro-batches, summed as they finish).
 * Checks: every rank's first loss (before any update) equals the single process's within
 *   1e-5 relative (the pipeline sums the micro-batches' means in another order), and every
 *   number is finite; else the bench fails (exit 1), which is what its smoke test checks.
 * Usage: pipeline_bench [--json] [--quick] [--steps N] [--warmup W] [--micro-batches LIST]
 *                       [--only mlp,gpt] [--python PATH] [--no-torch] [--trace PREFIX]
 *   --trace keeps each rank's trace of each case as PREFIX-<model>-m<m>-<schedule>-rank<r>.json;
 *   --quick: 3 timed steps after 1 warm-up, m = 4 only.
 * Not here: the pipeline rewrite (placement/pipeline.c), the schedules (placement/). */
#ifndef _GNU_SOURCE
#    define _GNU_SOURCE
#endif
#include "../bench_util.h"

#include <weft/weft.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <train_gpt/gpt_model.h>
#include <unistd.h>

#define BATCH    256
#define WIDTH    1024
#define CLASSES  10
#define STAGES   2
#define MAXSTEPS 256

typedef struct result {
    double median_s, rss_mb, loss0, fixed_mb; /* fixed_mb: the peak RSS before the graph */
    double vars_mb, arena_mb; /* the session's variables and the training plan's arena */
    double fb_s, upd_s, x_s;  /* this rank's F_k and U_k, the one-way transfer */
    double span_s;            /* the median span of this rank's posted activation-sized sends */
    int ok, rank;
} result;

typedef struct model {
    wf_node *x, *y, *loss, *train[2];
    int n_train;
} model;

/* A model of the bench: its graph (the stages by 'hints' when not NULL), its batch (every
 * step's; 'batch' rows), and the bytes per row of the activation that crosses the stages. */
typedef struct model_def {
    const char *name;
    int batch;
    size_t row_bytes;
    int (*build)(wf_graph *g, wf_place_hints *hints, model *m);
    void (*fill)(wf_tensor **x, wf_tensor **y);
} model_def;

static const model_def *the_model; /* the case's, set before the fork */

/* Opens the scope of stage 'k' (no-op without hints). */
static int scope(wf_place_hints *h, wf_graph *g, int k)
{
    char dev[32];
    snprintf(dev, sizeof dev, "rank:%d/cpu:0", k);
    if (!h)
        return 0;
    if (k > 0 && wf_place_scope_end(h, g) < 0)
        return -1;
    return wf_place_scope_begin(h, g, dev);
}

static wf_node *dense(wf_graph *g, wf_node *h, int in, int out, int i, bool relu)
{
    char name[16];
    snprintf(name, sizeof name, "w%d", i);
    wf_node *w = wf_variable(g, name, WF_F32, WF_SHAPE(in, out), wf_init_glorot_uniform(i));
    snprintf(name, sizeof name, "b%d", i);
    wf_node *b = wf_variable(g, name, WF_F32, WF_SHAPE(out), wf_init_zeros());
    wf_node *z = wf_add(g, wf_matmul(g, h, w), b);
    return relu ? wf_relu(g, z) : z;
}

/* The MLP: layers 1-2 on stage 0, layers 3-4 and the head on stage 1 (with hints). */
static int build_mlp(wf_graph *g, wf_place_hints *hints, model *m)
{
    m->x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(-1, WIDTH));
    m->y = wf_placeholder(g, "y", WF_I32, WF_SHAPE(-1));
    wf_node *h = m->x;
    for (int i = 1; i <= 5; i++) {
        if ((i == 1 || i == 3) && scope(hints, g, i == 1 ? 0 : 1) < 0)
            return -1;
        h = dense(g, h, WIDTH, i == 5 ? CLASSES : WIDTH, i, i < 5);
    }
    m->loss = wf_mean(g, wf_softmax_cross_entropy(g, h, m->y));
    if (hints && wf_place_scope_end(hints, g) < 0)
        return -1;
    m->train[0] = wf_minimize(g, wf_adam(1e-3), m->loss);
    m->n_train = 1;
    return m->train[0] ? 0 : -1;
}

/* The batch: rows of an LCG in [-1, 1) and labels (7 i) mod 10, as the PyTorch peer. */
static void fill_mlp(wf_tensor **xt, wf_tensor **yt)
{
    float *xs = malloc(sizeof(float) * BATCH * WIDTH);
    int32_t ys[BATCH];
    uint64_t seed = 7;
    for (int i = 0; i < BATCH * WIDTH; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        xs[i] = (float)((double)(seed >> 11) / 9007199254740992.0 * 2.0 - 1.0);
    }
    for (int i = 0; i < BATCH; i++)
        ys[i] = (i * 7) % CLASSES;
    *xt = wf_tensor_from(WF_F32, WF_SHAPE(BATCH, WIDTH), xs);
    *yt = wf_tensor_from(WF_I32, WF_SHAPE(BATCH), ys);
    free(xs);
}

/* The GPT: examples/train_gpt's model (gpt_model.c, linked), 4 blocks of d_model 128, 4
 * heads, context 64, a character vocabulary of 65, AdamW as train_gpt without clipping (a
 * clip by the global norm reads every stage's gradients), batch 32 sequences. Stage 0: the
 * embeddings and blocks 0-1; stage 1: blocks 2-3, the final layer norm, the head and the loss.
 * gpt_logits() builds the whole forward in one call, so the stages are hints per node: every
 * forward node from the first reader of block 2's first parameter on is on stage 1. */
#define GPT_BATCH  32
#define GPT_T      64
#define GPT_D      128
#define GPT_VOCAB  65
#define GPT_LAYERS 4

static int build_gpt(wf_graph *g, wf_place_hints *hints, model *md)
{
    gpt_config c = { .vocab = GPT_VOCAB,
                     .context = GPT_T,
                     .d_model = GPT_D,
                     .heads = 4,
                     .layers = GPT_LAYERS,
                     .seed = 1 };
    gpt_model gm;
    char err[256];
    if (gpt_build(g, &c, &gm, err, sizeof err) < 0) {
        fprintf(stderr, "pipeline_bench: gpt: %s\n", err);
        return -1;
    }
    md->x = wf_placeholder(g, "x", WF_I32, WF_SHAPE(-1, GPT_T));
    md->y = wf_placeholder(g, "y", WF_I32, WF_SHAPE(-1, GPT_T));
    int first = wf_graph_node_count(g);
    md->loss = gpt_loss(g, gpt_logits(g, &gm, md->x, false), md->y);
    if (!md->loss)
        return -1;
    char cut_name[64];
    snprintf(cut_name, sizeof cut_name, "transformer.h.%d.ln_1.weight", GPT_LAYERS / 2);
    const wf_node *cut_var = wf_graph_find(g, cut_name);
    int last = wf_graph_node_count(g), cut = last;
    for (int id = first; id < last && cut == last && cut_var; id++)
        for (int j = 0; j < wf_node_input_count(wf_graph_node(g, id)); j++)
            if (wf_node_input(wf_graph_node(g, id), j) == cut_var)
                cut = id;
    if (cut == last) {
        fprintf(stderr, "pipeline_bench: gpt: no reader of '%s'\n", cut_name);
        return -1;
    }
    for (int id = first; id < last && hints; id++)
        if (wf_place_hint(hints, wf_graph_node(g, id), id < cut ? "rank:0/cpu:0" : "rank:1/cpu:0") <
            0)
            return -1;
    gpt_train_opts o = { .lr = 3e-4, .weight_decay = 0.1, .clip_norm = 0 };
    md->n_train = 2;
    return gpt_train_step(g, &gm, md->loss, &o, md->train);
}

/* Tokens of an LCG; each target is the token after its input in one long stream. */
static void fill_gpt(wf_tensor **xt, wf_tensor **yt)
{
    static int32_t xs[GPT_BATCH * GPT_T], ys[GPT_BATCH * GPT_T];
    uint64_t seed = 11;
    int32_t stream[GPT_BATCH * GPT_T + 1];
    for (int i = 0; i <= GPT_BATCH * GPT_T; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        stream[i] = (int32_t)((seed >> 33) % GPT_VOCAB);
    }
    for (int i = 0; i < GPT_BATCH * GPT_T; i++) {
        xs[i] = stream[i];
        ys[i] = stream[i + 1];
    }
    *xt = wf_tensor_from(WF_I32, WF_SHAPE(GPT_BATCH, GPT_T), xs);
    *yt = wf_tensor_from(WF_I32, WF_SHAPE(GPT_BATCH, GPT_T), ys);
}

static const model_def models[] = {
    { "mlp", BATCH, sizeof(float) * WIDTH, build_mlp, fill_mlp },
    { "gpt", GPT_BATCH, sizeof(float) * GPT_T *GPT_D, build_gpt, fill_gpt },
};

/* The per-micro-batch ("/mb<i>" in the name) and the other task seconds of run 'run' of a
 * Chrome trace (one worker: their sums are the busy time). A parallel_for's chunks are left
 * out: with one worker they run inside their node's own span. Returns 0, or -1 without
 * tasks. */
static int stage_times(const char *buf, long run, double *mb_s, double *other_s)
{
    double mb = 0, other = 0;
    int n = 0;
    for (const char *p = strstr(buf, "{\"name\":\""); p; p = strstr(p + 1, "{\"name\":\"")) {
        const char *e = strstr(p, "}}");
        const char *cat = strstr(p, "\"cat\":\"task\""), *d = strstr(p, "\"dur\":");
        const char *r = strstr(p, "\"run\":"), *q = strchr(p + 9, '"');
        const char *chunk = strstr(p, "\"chunk\":1");
        if (!e || !cat || !d || !r || !q || cat > e || d > e || r > e ||
            strtol(r + 6, NULL, 10) != run || (chunk && chunk < e))
            continue;
        double dur = strtod(d + 6, NULL) * 1e-6; /* the trace is in microseconds */
        bool per_mb = memmem(p + 9, (size_t)(q - (p + 9)), "/mb", 3) != NULL;
        *(per_mb ? &mb : &other) += dur;
        n++;
    }
    *mb_s = mb;
    *other_s = other;
    return n ? 0 : -1;
}

static const char *trace_prefix; /* --trace */
static const char *const sched_names[] = { "gpipe", "1f1b" };

/* The median duration of the trace's transfer spans of sends of 'bytes' (posted to done:
 * what a transfer of the pipeline took in the run), or -1 without one. */
static double send_span(const char *buf, size_t bytes)
{
    enum { MAXX = 8192 };

    static double d[MAXX];
    static const char key[] = "{\"name\":\"send\",\"cat\":\"transfer\"";
    char pat[48];
    int n = 0;
    snprintf(pat, sizeof pat, "\"args\":{\"bytes\":%zu}", bytes);
    for (const char *p = strstr(buf, key); p && n < MAXX; p = strstr(p + 1, key)) {
        const char *e = strstr(p, "}}"), *du = strstr(p, "\"dur\":"), *b = strstr(p, pat);
        if (e && du && b && du < e && b < e)
            d[n++] = strtod(du + 6, NULL) * 1e-6;
    }
    return n ? bench_median(d, n) : -1;
}

/* This rank's trace of the timed runs: the medians of F (per micro-batch) and U. */
static int trace_medians(wf_runtime *rt, int warmup, int steps, int m, int schedule, result *r)
{
    char path[512];
    if (trace_prefix)
        snprintf(path, sizeof path, "%s-%s-m%d-%s-rank%d.json", trace_prefix, the_model->name, m,
                 sched_names[schedule], r->rank);
    else
        snprintf(path, sizeof path, "/tmp/pipeline_bench-%d.json", (int)getpid());
    FILE *fp = NULL;
    size_t cap = 64u << 20;
    char *buf = malloc(cap);
    int rc = -1;
    if (buf && wf_runtime_trace_write(rt, path) > 0 && (fp = fopen(path, "r"))) {
        size_t len = fread(buf, 1, cap - 1, fp);
        buf[len] = 0;
        fclose(fp);
        double f[MAXSTEPS], u[MAXSTEPS];
        int n = 0;
        for (int i = 0; i < steps; i++)
            if (stage_times(buf, warmup + i, &f[n], &u[n]) == 0)
                n++;
        if (n > 0) {
            for (int i = 0; i < n; i++)
                f[i] /= m;
            r->fb_s = bench_median(f, n);
            r->upd_s = bench_median(u, n);
            r->span_s = send_span(buf, the_model->row_bytes * (size_t)(the_model->batch / m));
            rc = 0;
        }
    }
    if (!trace_prefix)
        unlink(path);
    free(buf);
    return rc;
}

/* One process of a case: stages 0 (one process, a plain session) or 2 (this rank of the
 * pipeline, m micro-batches, 'schedule'). Trains 'warmup + steps' steps and fills 'r'. */
static int run_case(int rank, int stages, int m, int schedule, int port, int steps, int warmup,
                    result *r)
{
    wf_runtime *rt = NULL;
    wf_comm *c = NULL;
    wf_strategy *st = NULL;
    wf_place_hints *h = NULL;
    int rc = wf_runtime_create(&rt, &(wf_runtime_opts){ .n_workers = 1,
                                                        .trace_events = 1u << 18,
                                                        .local_rank = stages ? rank : 0,
                                                        .local_size = stages });
    char addr[32];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    if (rc == 0 && stages)
        rc = wf_comm_create(
            rt,
            &(wf_comm_opts){
                .rank = rank, .size = stages, .addr = addr, .token = "pipeline_bench" },
            &c);
    double rtt_s[STAGES * STAGES], rtt_l[STAGES * STAGES];
    size_t act_bytes = the_model->row_bytes * (size_t)(the_model->batch / (m ? m : 1));
    if (rc == 0 && stages)
        rc = wf_comm_probe_links(c, 64, act_bytes, 20, rtt_s, rtt_l);
    if (rc == 0 && stages)
        rc = wf_place_hints_create(&h);
    if (rc == 0 && stages)
        rc = wf_strategy_pipeline(c,
                                  &(wf_pipeline_opts){ .micro_batches = m,
                                                       .schedule = schedule,
                                                       .batch_rows = the_model->batch,
                                                       .hints = h },
                                  &st);
    if (rc < 0) {
        fprintf(stderr, "pipeline_bench: rank %d: %s\n", rank, wf_last_errmsg());
        return 1;
    }
    r->x_s = stages ? 0.5 * rtt_l[1] : 0;
    r->fixed_mb = bench_peak_rss_mb();
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    model md = { 0 };
    wf_session *s = NULL;
    if (the_model->build(g, h, &md) < 0 ||
        wf_session_create(g, &(wf_session_opts){ .strategy = st }, &s) < 0) {
        fprintf(stderr, "pipeline_bench: rank %d: %s / %s\n", rank, wf_graph_errmsg(g),
                wf_last_errmsg());
        return 1;
    }
    wf_tensor *xt = NULL, *yt = NULL;
    the_model->fill(&xt, &yt);
    wf_feed f[] = { { md.x, xt }, { md.y, yt } };
    double t[MAXSTEPS];
    for (int i = 0; i < warmup + steps && rc == 0; i++) {
        wf_tensor *out = NULL;
        double t0 = bench_now_s();
        rc = wf_session_run(s, f, 2, &md.loss, 1, &out, md.train, md.n_train);
        if (i >= warmup)
            t[i - warmup] = bench_now_s() - t0;
        if (rc == 0 && i == 0)
            r->loss0 = wf_tensor_data_f32(out)[0];
        wf_tensor_release(out);
    }
    if (rc < 0) {
        fprintf(stderr, "pipeline_bench: rank %d: %s\n", rank, wf_session_errmsg(s));
        return 1;
    }
    r->rss_mb = bench_peak_rss_mb();
    r->median_s = bench_median(t, steps);
    wf_plan_stats ps;
    if (wf_session_stats(s, &ps) == 0) { /* the training step's plan is the one compiled last */
        r->vars_mb = (double)ps.bytes_variables / (1 << 20);
        r->arena_mb = (double)ps.bytes_planned / (1 << 20);
    }
    if (stages && trace_medians(rt, warmup, steps, m, schedule, r) < 0) {
        fprintf(stderr, "pipeline_bench: rank %d: no tasks in the trace (%s)\n", rank,
                wf_last_errmsg());
        return 1;
    }
    r->ok = 1;
    wf_tensor_release(xt);
    wf_tensor_release(yt);
    wf_session_destroy(s);
    wf_graph_destroy(g);
    wf_strategy_destroy(st);
    wf_place_hints_destroy(h);
    wf_comm_destroy(c);
    wf_runtime_destroy(rt);
    return 0;
}

typedef struct case_args {
    int stages, m, schedule, port, steps, warmup;
} case_args;

static int case_main(int rank, void *res, void *ctx)
{
    const case_args *a = ctx;
    result *r = res;
    r->rank = rank;
    return run_case(rank, a->stages, a->m, a->schedule, a->port, a->steps, a->warmup, r);
}

/* Runs a case in fresh processes (one, or one per stage): rank 0's result, the largest RSS;
 * 'per_rank' (may be NULL) gets every rank's result. */
static result spawn_case(int stages, int m, int schedule, int steps, int warmup,
                         result per_rank[STAGES])
{
    case_args a = { stages, m, schedule, bench_free_port(29531), steps, warmup };
    result rs[STAGES] = { 0 };
    int procs = stages ? stages : 1;
    int bad = bench_fork_ranks(procs, case_main, &a, rs, sizeof rs[0]);
    result out = rs[0];
    out.rss_mb = out.fixed_mb = 0;
    for (int r = 0; r < procs; r++) {
        if (rs[r].rss_mb > out.rss_mb) { /* the largest stage's memory counters */
            out.vars_mb = rs[r].vars_mb;
            out.arena_mb = rs[r].arena_mb;
        }
        out.rss_mb = rs[r].rss_mb > out.rss_mb ? rs[r].rss_mb : out.rss_mb;
        out.fixed_mb = rs[r].fixed_mb > out.fixed_mb ? rs[r].fixed_mb : out.fixed_mb;
        if (per_rank)
            per_rank[r] = rs[r];
    }
    out.ok = !bad && out.ok;
    return out;
}

/* The PyTorch peer (GPipe, 2 processes); ok 0 when it could not run. */
static result torch_case(const char *python, const model_def *md, int m, int steps, int warmup)
{
    result r = { 0 };
    char cmd[1024];
    /* The script has its own deadlines and retries; timeout(1) is the last guard. */
    snprintf(cmd, sizeof cmd,
             "timeout -k 10 600 %s %s/pipeline_bench_torch.py --model %s --micro-batches %d "
             "--batch %d --width %d --steps %d --warmup %d",
             python, PB_SCRIPT_DIR, md->name, m, md->batch, WIDTH, steps, warmup);
    double v[3];
    if (bench_peer_line(cmd, (const char *const[]){ "median_s", "peak_rss_mb", "loss0" }, v, 3) < 0)
        return r;
    r.median_s = v[0];
    r.rss_mb = v[1];
    r.loss0 = v[2];
    r.ok = 1;
    return r;
}

static bool finite_all(const double *v, int n)
{
    for (int i = 0; i < n; i++)
        if (!isfinite(v[i]))
            return false;
    return true;
}

typedef struct bench_opts {
    bool json, torch;
    int steps, warmup, ms[8], n_m;
    const char *python;
} bench_opts;

/* Every case of model 'md': one process, then each m and schedule (and PyTorch's GPipe for
 * the MLP). Returns the number of failed cases. */
static int bench_model(const model_def *md, const bench_opts *o)
{
    the_model = md;
    char bench[64];
    snprintf(bench, sizeof bench, "pipeline_%s_1s", md->name);
    result one = spawn_case(0, 0, 0, o->steps, o->warmup, NULL);
    if (!one.ok || !finite_all((double[]){ one.median_s, one.loss0 }, 2)) {
        fprintf(stderr, "pipeline_bench: %s failed\n", bench);
        return 1;
    }
    if (o->json)
        printf("{\"bench\": \"%s\", \"impl\": \"weft\", \"threads\": 1, \"reps\": %d, "
               "\"median_s\": %.6f, \"peak_rss_mb\": %.1f, \"fixed_rss_mb\": %.1f, "
               "\"vars_mb\": %.1f, \"arena_mb\": %.1f, \"loss0\": %.7f}\n",
               bench, o->steps, one.median_s, one.rss_mb, one.fixed_mb, one.vars_mb, one.arena_mb,
               one.loss0);
    else
        printf("%-28s %-8s %9.2f %9s %8s %6.1f\n", bench, "weft", 1e3 * one.median_s, "", "",
               one.rss_mb);
    int fails = 0;
    for (int mi = 0; mi < o->n_m; mi++) {
        int m = o->ms[mi];
        if (md->batch % m) {
            fprintf(stderr, "pipeline_bench: %s: m = %d does not divide the batch %d\n", md->name,
                    m, md->batch);
            fails++;
            continue;
        }
        result tr = o->torch ? torch_case(o->python, md, m, o->steps, o->warmup) : (result){ 0 };
        for (int sc = 0; sc < 2; sc++) {
            snprintf(bench, sizeof bench, "pipeline_%s_%ds_m%d_%s", md->name, STAGES, m,
                     sched_names[sc]);
            result rk[STAGES] = { 0 };
            result w = spawn_case(STAGES, m, sc, o->steps, o->warmup, rk);
            double fmax = rk[0].fb_s > rk[1].fb_s ? rk[0].fb_s : rk[1].fb_s;
            double pred = (m + STAGES - 1) * fmax + 2 * (STAGES - 1) * rk[0].x_s + rk[0].upd_s;
            double v[] = { w.median_s, pred, rk[0].loss0, rk[1].loss0 };
            bool same = fabs(rk[0].loss0 - one.loss0) <= 1e-5 * fabs(one.loss0) &&
                        fabs(rk[1].loss0 - one.loss0) <= 1e-5 * fabs(one.loss0);
            if (!w.ok || !finite_all(v, 4) || !same) {
                fprintf(stderr,
                        "pipeline_bench: %s failed (ok %d, first losses %.7f %.7f, one "
                        "process %.7f)\n",
                        bench, w.ok, rk[0].loss0, rk[1].loss0, one.loss0);
                fails++;
                continue;
            }
            if (o->json)
                printf("{\"bench\": \"%s\", \"impl\": \"weft\", \"threads\": 1, \"reps\": %d, "
                       "\"median_s\": %.6f, \"peak_rss_mb\": %.1f, \"predicted_s\": %.6f, "
                       "\"predicted_over_measured\": %.3f, \"stage_fb_s\": [%.6f, %.6f], "
                       "\"stage0_update_s\": %.6f, \"stage1_other_s\": %.6f, "
                       "\"transfer_s\": %.6f, "
                       "\"send_span_s\": [%.6f, %.6f], \"fixed_rss_mb\": %.1f, "
                       "\"vars_mb\": %.1f, \"arena_mb\": %.1f, \"loss0\": %.7f}\n",
                       bench, o->steps, w.median_s, w.rss_mb, pred, pred / w.median_s, rk[0].fb_s,
                       rk[1].fb_s, rk[0].upd_s, rk[1].upd_s, rk[0].x_s, rk[0].span_s, rk[1].span_s,
                       w.fixed_mb, w.vars_mb, w.arena_mb, rk[0].loss0);
            else
                printf("%-28s %-8s %9.2f %9.2f %8.3f %6.1f %4.2f/%4.2f %7.3f\n", bench, "weft",
                       1e3 * w.median_s, 1e3 * pred, pred / w.median_s, w.rss_mb, 1e3 * rk[0].fb_s,
                       1e3 * rk[1].fb_s, 1e3 * rk[0].x_s);
            char peer[64];
            snprintf(peer, sizeof peer, "pipeline_%s_%ds_m%d_gpipe", md->name, STAGES, m);
            if (tr.ok && sc == 0 && o->json)
                printf("{\"bench\": \"%s\", \"impl\": \"pytorch\", \"threads\": 1, \"reps\": %d, "
                       "\"median_s\": %.6f, \"peak_rss_mb\": %.1f, \"loss0\": %.7f}\n",
                       peer, o->steps, tr.median_s, tr.rss_mb, tr.loss0);
            else if (tr.ok && sc == 0)
                printf("%-28s %-8s %9.2f %9s %8s %6.1f\n", peer, "pytorch", 1e3 * tr.median_s, "",
                       "", tr.rss_mb);
            else if (o->torch && sc == 0)
                printf(o->json ? "{\"bench\": \"%s\", \"impl\": \"pytorch\", \"skipped\": \"%s\"}\n"
                               : "%-28s pytorch  skipped: %s\n",
                       peer, "the peer or torch failed");
            char ratio[32] = "null"; /* JSON has no NaN */
            if (tr.ok)
                snprintf(ratio, sizeof ratio, "%.3f", w.median_s / tr.median_s);
            if (o->json)
                printf("{\"bench\": \"%s\", \"impl\": \"ratio\", \"weft_over_pytorch_gpipe\": "
                       "%s, \"rss_over_single_process\": %.3f}\n",
                       bench, ratio, w.rss_mb / one.rss_mb);
            else
                printf("%-28s weft / pytorch gpipe %s   largest stage RSS / one process "
                       "%.3f\n",
                       bench, ratio, w.rss_mb / one.rss_mb);
            fflush(stdout);
        }
    }
    return fails;
}

int main(int argc, char **argv)
{
    bench_opts o = { .torch = true,
                     .steps = 20,
                     .warmup = 3,
                     .ms = { 4, 8, 16 },
                     .n_m = 3,
                     .python = "/usr/bin/python3" };
    bool quick = false;
    static const char *const names[] = { "mlp", "gpt" };
    unsigned only = 1; /* the GPT only when asked (--only gpt): see the header */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json"))
            o.json = true;
        else if (!strcmp(argv[i], "--quick"))
            quick = true;
        else if (!strcmp(argv[i], "--no-torch"))
            o.torch = false;
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc &&
                 bench_parse_int(argv[i + 1], 1, MAXSTEPS, &o.steps) == 0)
            i++;
        else if (!strcmp(argv[i], "--warmup") && i + 1 < argc &&
                 bench_parse_int(argv[i + 1], 1, 100, &o.warmup) == 0)
            i++;
        else if (!strcmp(argv[i], "--trace") && i + 1 < argc)
            trace_prefix = argv[++i];
        else if (!strcmp(argv[i], "--python") && i + 1 < argc)
            o.python = argv[++i];
        else if (!strcmp(argv[i], "--only") && i + 1 < argc &&
                 bench_parse_list("pipeline_bench", argv[i + 1], names, 2, &only) == 0)
            i++;
        else if (!strcmp(argv[i], "--micro-batches") && i + 1 < argc) {
            char buf[64], *save = NULL;
            snprintf(buf, sizeof buf, "%s", argv[++i]);
            o.n_m = 0;
            for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
                if (o.n_m == 8 || bench_parse_int(tok, 1, 64, &o.ms[o.n_m++]) < 0) {
                    fprintf(stderr, "pipeline_bench: --micro-batches: 1 to 8 values in 1..64\n");
                    return 2;
                }
        } else {
            fprintf(stderr, "usage: pipeline_bench [--json] [--quick] [--steps N] [--warmup W] "
                            "[--micro-batches LIST] [--only mlp,gpt] [--python PATH] "
                            "[--no-torch] [--trace PREFIX]\n");
            return 2;
        }
    }
    if (quick) {
        o.steps = 3;
        o.warmup = 1;
        o.n_m = 1;
        o.ms[0] = 4;
    }
    if (!o.json)
        printf("%-28s %-8s %9s %9s %8s %6s %9s %7s\n", "bench", "impl", "step ms", "pred ms",
               "pred/me", "RSS MB", "F0/F1 ms", "X ms");
    int fails = 0;
    for (int k = 0; k < 2; k++)
        if (only & (1u << k))
            fails += bench_model(&models[k], &o);
    return fails ? 1 : 0;
}
