/* examples/train_gpt/train_gpt.c: trains a character-level GPT on a text file with weft and
 * shows it learning: a progress bar with the training loss, and every --sample-every steps
 * the validation loss and a sample of generated text.
 *   train_gpt                                  the bundled text (US founding documents)
 *   train_gpt --text input.txt --steps 5000 --layers 4 --d-model 256 --heads 8
 *   train_gpt --steps 1000 --save gpt.safetensors; train_gpt --init gpt.safetensors --steps 2000
 * The text is read as bytes; the vocabulary is the set of bytes it holds, sorted (65 for
 * nanoGPT's tiny Shakespeare). Batches are random windows of --context bytes of the first 90%
 * of the text; the last 10% is the validation text. The model is gpt_model.c's (nanoGPT's
 * names and init), trained by one static graph and session: AdamW (weight decay on matrices
 * only), gradients clipped to global norm 1, cosine learning-rate schedule after a linear
 * warm-up. Sampling runs a second forward pass of the same graph on a [1, context] input
 * (the last context bytes, left-aligned: the causal mask makes the padding after them
 * irrelevant), temperature sampling (greedy with --temperature 0).
 * Checkpoints hold every variable (weights, AdamW state, step counters) and the vocabulary
 * ("train_gpt.vocab", i32), so --init refuses a text of another vocabulary, and resumes at
 * the checkpoint's step: --steps is the step to reach, as nanoGPT's max_iters (the cosine
 * schedule spans it); a checkpoint at or past it only prints a sample.
 * Public API only, as every example. */
#include "../weft-train/bundled.h"
#include "../weft-train/progress.h"
#include "../weft-train/ranks.h"
#include "gpt_model.h"

#include <weft/weft.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef TG_TEXT_SOURCE
#    define TG_TEXT_SOURCE "us-founding-documents.txt"
#endif
#ifndef TG_DATADIR
#    define TG_DATADIR "share" /* the install's data folder, relative to its prefix */
#endif

#define MAX_TEXT_BYTES (1ll << 30)
#define EVAL_BATCHES   8

typedef struct options {
    const char *text, *init, *save, *log;
    gpt_config model;
    int batch;
    long steps, sample_every, sample_len;
    double lr, temperature;
    double clip_norm; /* --clip-norm C: 0, no clipping (1) */
    uint64_t seed;
    int threads;
    const char *strategy; /* --strategy multiworker: data parallel over weft-run's ranks;
                             mirrored: over devices of this process; ps: parameter servers
                             over weft-run's ranks; pipeline: the blocks split into stages,
                             one per rank */
    int shards;           /* --shards: 0, one per rank (device, worker) */
    bool pipeline;        /* --strategy pipeline */
    bool mirrored;        /* --strategy mirrored */
    int devices;          /* --devices N (mirrored): 0, every GPU */
    int ps_ranks;         /* --strategy ps --ps-ranks K: ranks 0 .. K-1 are servers */
    int staleness;        /* --staleness s (ps): 0, synchronous */
    bool staleness_set;   /* --staleness given */
    int stages;           /* --stages P (0: the number of ranks) */
    int micro_batches;    /* --micro-batches M (0: one) */
    int schedule;         /* --schedule gpipe|1f1b: WF_SCHEDULE_* (1f1b) */
    bool schedule_set;    /* --schedule given */
    bool sample_any;      /* every rank gathers (gather()) before the writer's samples */
    bool save_any;        /* ... and before its --save */
    bool quiet;
} options;

/* ---- Text and batches ------------------------------------------------------------------- */

typedef struct corpus {
    int vocab;
    unsigned char chars[256]; /* id -> byte */
    int id[256];              /* byte -> id, -1 if absent */
    int32_t *tokens;
    int64_t n, n_train; /* tokens [0, n_train) train, [n_train, n) validation */
} corpus;

static int read_text(const char *path, corpus *c, char *err, size_t errlen)
{
    memset(c, 0, sizeof *c);
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "--text %s: %s", path, strerror(errno));
        return WF_ENOTFOUND;
    }
    unsigned char *buf = NULL;
    int64_t n = 0, cap = 0;
    int rc = 0;
    for (;;) {
        if (n == cap) {
            int64_t ncap = cap ? 2 * cap : 1 << 16;
            unsigned char *nb = ncap <= MAX_TEXT_BYTES ? realloc(buf, (size_t)ncap) : NULL;
            if (!nb) {
                snprintf(err, errlen, "--text %s: larger than %lld bytes or out of memory", path,
                         MAX_TEXT_BYTES);
                rc = WF_ENOMEM;
                break;
            }
            buf = nb;
            cap = ncap;
        }
        size_t got = fread(buf + n, 1, (size_t)(cap - n), f);
        n += (int64_t)got;
        if (got == 0) {
            if (ferror(f)) {
                snprintf(err, errlen, "--text %s: read error", path);
                rc = WF_EIO;
            }
            break;
        }
    }
    fclose(f);
    if (rc == 0) {
        bool seen[256] = { false };
        for (int64_t i = 0; i < n; i++)
            seen[buf[i]] = true;
        for (int b = 0; b < 256; b++) {
            c->id[b] = seen[b] ? c->vocab : -1;
            if (seen[b])
                c->chars[c->vocab++] = (unsigned char)b;
        }
        c->tokens = malloc((size_t)(n > 0 ? n : 1) * sizeof *c->tokens);
        if (!c->tokens) {
            snprintf(err, errlen, "--text %s: out of memory for %lld tokens", path, (long long)n);
            rc = WF_ENOMEM;
        }
    }
    for (int64_t i = 0; rc == 0 && i < n; i++)
        c->tokens[i] = c->id[buf[i]];
    free(buf);
    c->n = n;
    c->n_train = n - n / 10;
    return rc;
}

/* splitmix64: the batches, the samples and nothing else (the weights come from wf_init). */
static uint64_t next_u64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double next_unit(uint64_t *s)
{
    return (double)(next_u64(s) >> 11) * 0x1.0p-53;
}

/* 'batch' random windows of tokens [lo, hi): x[b] = tokens[o .. o+t), y[b] the same shifted
 * by one. The range holds at least t + 1 tokens (checked by the caller). */
static void make_batch(const corpus *c, int64_t lo, int64_t hi, int batch, int t, uint64_t *rng,
                       int32_t *x, int32_t *y)
{
    int64_t span = hi - lo - t; /* window starts in [lo, lo + span) */
    for (int b = 0; b < batch; b++) {
        int64_t o = lo + (int64_t)(next_u64(rng) % (uint64_t)span);
        memcpy(x + (int64_t)b * t, c->tokens + o, (size_t)t * sizeof *x);
        memcpy(y + (int64_t)b * t, c->tokens + o + 1, (size_t)t * sizeof *y);
    }
}

/* ---- The graph -------------------------------------------------------------------------- */

typedef struct trainer {
    const options *o;
    const corpus *text;
    wf_runtime *rt;
    wf_graph *g;
    wf_session *s;
    gpt_model m;
    wf_node *x, *y, *loss, *eval_loss, *step[2];
    wf_node *sample_x, *sample_logits;
    wf_node *vocab;
    long start;            /* the step the optimizer's counter is at: 0, or the checkpoint's */
    wf_comm *comm;         /* --strategy: the ranks */
    wf_strategy *strategy; /* --strategy: NULL otherwise */
    wf_place_hints *hints; /* --strategy pipeline: each block's stage */
} trainer;

static int build(trainer *t, char *err, size_t errlen)
{
    const options *o = t->o;
    int b = o->batch, ctx = o->model.context;
    wf_graph *g = t->g = wf_graph_create(t->rt, WF_STATIC);
    if (!g) {
        snprintf(err, errlen, "%s", wf_last_errmsg());
        return WF_ENOMEM;
    }
    int rc = gpt_build(g, &o->model, &t->m, err, errlen);
    if (rc < 0)
        return rc;
    t->m.hints = t->hints;
    t->m.stages = t->hints ? wf_strategy_size(t->strategy) : 0;
    /* Under --strategy the batch is -1: the strategy gives each shard its rows of it. */
    int64_t rows = t->strategy ? -1 : b;
    t->x = wf_placeholder(g, "x", WF_I32, WF_SHAPE(rows, ctx));
    t->y = wf_placeholder(g, "y", WF_I32, WF_SHAPE(rows, ctx));
    wf_node *logits = gpt_logits(g, &t->m, t->x, true);
    int last = t->m.stages > 1 ? t->m.stages - 1 : 0; /* the loss with the head */
    if (gpt_stage_scope(g, &t->m, last) < 0 || !(t->loss = gpt_loss(g, logits, t->y)) ||
        gpt_stage_scope(g, &t->m, -1) < 0) {
        snprintf(err, errlen, "building the loss: %s",
                 wf_graph_status(g) < 0 ? wf_graph_errmsg(g) : wf_last_errmsg());
        return wf_graph_status(g) < 0 ? wf_graph_status(g) : WF_EINVAL;
    }
    t->vocab = wf_variable(g, "train_gpt.vocab", WF_I32, WF_SHAPE(o->model.vocab), wf_init_zeros());
    int64_t warmup = o->steps / 10 < 100 ? o->steps / 10 : 100;
    gpt_train_opts to = {
        .lr = o->lr,
        .weight_decay = 0.1,
        .clip_norm = o->clip_norm,
        .schedule = wf_lr_cosine(warmup, o->steps > warmup ? o->steps : warmup + 1, o->lr / 10),
    };
    if (t->loss)
        rc = gpt_train_step(g, &t->m, t->loss, &to, t->step);
    /* The forward passes that only read the weights come after the updates: an update is
     * ordered after the readers of its variable that exist when it is made, and a training
     * step must not wait for (nor need the feeds of) the sampling pass. With dropout,
     * evaluation needs a forward pass without it. */
    if (o->model.dropout > 0) {
        logits = gpt_logits(g, &t->m, t->x, false);
        if (gpt_stage_scope(g, &t->m, last) < 0 || !(t->eval_loss = gpt_loss(g, logits, t->y)) ||
            gpt_stage_scope(g, &t->m, -1) < 0) {
            snprintf(err, errlen, "building the evaluation: %s",
                     wf_graph_status(g) < 0 ? wf_graph_errmsg(g) : wf_last_errmsg());
            return wf_graph_status(g) < 0 ? wf_graph_status(g) : WF_EINVAL;
        }
    } else {
        t->eval_loss = t->loss;
    }
    /* the sampling pass reads a [1, context] input, no batch: a pipeline computes it on the
     * rank that fetches it (rank 0), with the weights gather_stages() brings there */
    t->m.hints = NULL;
    t->sample_x = wf_placeholder(g, "sample_x", WF_I32, WF_SHAPE(1, ctx));
    t->sample_logits = gpt_logits(g, &t->m, t->sample_x, false);
    t->m.hints = t->hints;
    if (rc == 0)
        rc = wf_graph_status(g);
    if (rc == 0)
        rc = wf_session_create(g, &(wf_session_opts){ .strategy = t->strategy }, &t->s);
    if (rc < 0) {
        snprintf(err, errlen, "building the model: %s", wf_graph_errmsg(g));
        return rc;
    }
    /* the vocabulary: this text's, unless --init brings one, which must then be the same */
    int32_t ids[256];
    for (int i = 0; i < t->text->vocab; i++)
        ids[i] = t->text->chars[i];
    wf_tensor *v = wf_tensor_from(WF_I32, WF_SHAPE(t->text->vocab), ids);
    rc = v ? wf_session_assign(t->s, t->vocab, v) : WF_ENOMEM;
    wf_tensor_release(v);
    if (rc == 0 && o->init) {
        if ((rc = wf_checkpoint_load(t->s, o->init, WF_CHECKPOINT_ALLOW_MISSING)) < 0) {
            snprintf(err, errlen, "--init: %s%s", wf_session_errmsg(t->s),
                     rc == WF_ESHAPE || rc == WF_EINVAL
                         ? " (--init needs the model options and the text's vocabulary of the "
                           "run that saved it)"
                         : "");
            return rc;
        }
        wf_tensor *got = NULL;
        if ((rc = wf_session_variable(t->s, t->vocab, &got)) == 0) {
            for (int i = 0; i < t->text->vocab && rc == 0; i++)
                if ((int32_t)wf_tensor_get(got, i) != ids[i]) {
                    snprintf(err, errlen,
                             "--init %s: its vocabulary differs from the text's at id %d "
                             "(byte %d there, %d here)",
                             o->init, i, (int)wf_tensor_get(got, i), ids[i]);
                    rc = WF_EINVAL;
                }
            wf_tensor_release(got);
        }
        /* resume where the checkpoint stopped: the counter drives the schedule */
        wf_node *counter = wf_graph_find(g, "adamw/step");
        if (rc == 0 && counter && (rc = wf_session_variable(t->s, counter, &got)) == 0) {
            t->start = (long)wf_tensor_get(got, 0);
            wf_tensor_release(got);
        }
    }
    if (rc < 0 && !err[0])
        snprintf(err, errlen, "%s", wf_session_errmsg(t->s));
    return rc;
}

/* One training step on x, y: the loss before the update. */
static int train_step(trainer *t, wf_tensor *x, wf_tensor *y, double *loss, char *err,
                      size_t errlen)
{
    wf_feed f[2] = { { t->x, x }, { t->y, y } };
    wf_tensor *out;
    int rc = wf_session_run(t->s, f, 2, &t->loss, 1, &out, t->step, 2);
    if (rc < 0) {
        snprintf(err, errlen, "%s", wf_session_errmsg(t->s));
        return rc;
    }
    *loss = wf_tensor_get(out, 0);
    wf_tensor_release(out);
    return 0;
}

/* The mean loss over EVAL_BATCHES batches of tokens [lo, hi), the same windows each time. */
static int evaluate(trainer *t, int64_t lo, int64_t hi, int32_t *xb, int32_t *yb, double *loss,
                    char *err, size_t errlen)
{
    const options *o = t->o;
    wf_shape bs = WF_SHAPE(o->batch, o->model.context);
    uint64_t rng = o->seed * 31 + 7;
    double sum = 0;
    for (int i = 0; i < EVAL_BATCHES; i++) {
        make_batch(t->text, lo, hi, o->batch, o->model.context, &rng, xb, yb);
        wf_tensor *x = wf_tensor_from(WF_I32, bs, xb), *y = wf_tensor_from(WF_I32, bs, yb);
        wf_feed f[2] = { { t->x, x }, { t->y, y } };
        wf_tensor *out = NULL;
        int rc = x && y ? wf_session_run(t->s, f, 2, &t->eval_loss, 1, &out, NULL, 0) : WF_ENOMEM;
        wf_tensor_release(x);
        wf_tensor_release(y);
        if (rc < 0) {
            snprintf(err, errlen, "evaluating: %s",
                     rc == WF_ENOMEM ? "out of memory" : wf_session_errmsg(t->s));
            return rc;
        }
        sum += wf_tensor_get(out, 0);
        wf_tensor_release(out);
    }
    *loss = sum / EVAL_BATCHES;
    return 0;
}

/* Generates o->sample_len bytes after 'prompt' into 'out' (NUL-terminated). */
static int sample(trainer *t, const int32_t *prompt, int n_prompt, uint64_t *rng, char *out,
                  char *err, size_t errlen)
{
    const options *o = t->o;
    int ctx = o->model.context, v = o->model.vocab;
    int32_t *seq = malloc((size_t)(n_prompt + o->sample_len) * sizeof *seq);
    int32_t *win = calloc((size_t)ctx, sizeof *win);
    double *p = malloc((size_t)v * sizeof *p);
    int rc = seq && win && p ? 0 : WF_ENOMEM;
    if (rc < 0)
        snprintf(err, errlen, "sampling: out of memory");
    if (rc == 0)
        memcpy(seq, prompt, (size_t)n_prompt * sizeof *seq);
    int64_t len = n_prompt;
    for (long k = 0; rc == 0 && k < o->sample_len; k++) {
        /* the last 'ctx' tokens, left-aligned; positions after them do not affect row n-1 */
        int64_t n = len < ctx ? len : ctx;
        memset(win, 0, (size_t)ctx * sizeof *win);
        memcpy(win, seq + len - n, (size_t)n * sizeof *win);
        wf_tensor *x = wf_tensor_from(WF_I32, WF_SHAPE(1, ctx), win), *logits = NULL;
        wf_feed f = { t->sample_x, x };
        rc = x ? wf_session_run(t->s, &f, 1, &t->sample_logits, 1, &logits, NULL, 0) : WF_ENOMEM;
        wf_tensor_release(x);
        if (rc < 0) {
            snprintf(err, errlen, "sampling: %s", wf_session_errmsg(t->s));
            break;
        }
        /* row n-1 of [ctx, vocab]: softmax at the temperature, or the argmax */
        int best = 0;
        double mx = -INFINITY, sum = 0;
        for (int j = 0; j < v; j++) {
            p[j] = wf_tensor_get(logits, (n - 1) * v + j);
            if (p[j] > mx)
                mx = p[j], best = j;
        }
        wf_tensor_release(logits);
        int next = best;
        if (o->temperature > 0) {
            for (int j = 0; j < v; j++)
                sum += (p[j] = exp((p[j] - mx) / o->temperature));
            double u = next_unit(rng) * sum;
            for (next = 0; next < v - 1 && (u -= p[next]) > 0; next++)
                ;
        }
        seq[len++] = next;
    }
    if (rc == 0) {
        for (long k = 0; k < o->sample_len; k++)
            out[k] = (char)t->text->chars[seq[n_prompt + k]];
        out[o->sample_len] = '\0';
    }
    free(seq);
    free(win);
    free(p);
    return rc;
}

/* ---- Command line ----------------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(f, "usage: train_gpt [options]\n"
               "  --text FILE          the text to learn (default: the bundled US Declaration of\n"
               "                       Independence and Constitution, 55 KB)\n"
               "model:\n"
               "  --context T          characters of context (64)\n"
               "  --d-model D          embedding width (128)\n"
               "  --heads H            attention heads; D must be a multiple (4)\n"
               "  --layers L           transformer blocks (2)\n"
               "  --tie-head           the output head is the token embedding transposed\n"
               "  --dropout P          on embeddings and residual branches while training (0)\n"
               "training:\n"
               "  --batch B            sequences per step (32)\n"
               "  --steps N            train to step N (1000); --init goes on from its step\n"
               "  --lr LR              AdamW peak learning rate, cosine to LR/10 (3e-4)\n"
               "  --clip-norm C        clip the gradients to global norm C; 0: no clipping (1)\n"
               "  --seed S             weights, batches and samples (1)\n"
               "  --threads N          weft workers (default: one per core)\n"
               "  --strategy multiworker   data parallel over the ranks of weft-run -n N: --batch\n"
               "                       stays the global batch; rank 0 prints, logs and saves\n"
               "  --shards S           the batch's shards (default: one per rank, device or\n"
               "                       worker): the same S trains the same bits on any number\n"
               "                       of ranks, devices or workers\n"
               "  --strategy mirrored  data parallel over devices of this process: the first\n"
               "                       --devices N GPUs, or N simulated devices without them\n"
               "  --devices N          mirrored: the devices (default: every GPU)\n"
               "  --strategy ps        parameter servers over the ranks of weft-run -n N: ranks\n"
               "                       0 .. K-1 hold the weights and AdamW state, the others\n"
               "                       compute; rank K prints, logs, samples and saves\n"
               "  --ps-ranks K         ps: the server ranks (required)\n"
               "  --staleness s        ps: 0 (the default), synchronous, the bits of\n"
               "                       multiworker over the workers; s > 0 asynchronous, no\n"
               "                       worker more than s steps ahead of the slowest\n"
               "  --strategy pipeline  the blocks split into stages, one per rank of weft-run -n\n"
               "                       P: the embeddings and the first blocks on rank 0, the rest\n"
               "                       and the head on the last rank (an even split of blocks)\n"
               "  --stages P           its stages: the number of ranks (the default)\n"
               "  --micro-batches M    the batch split into M micro-batches (1): trains the bits\n"
               "                       of --strategy multiworker --shards M on one rank\n"
               "  --schedule S         gpipe or 1f1b (the default)\n"
               "sampling:\n"
               "  --sample-every N     validation loss and a sample every N steps (200; 0: "
               "at the end only)\n"
               "  --sample-len N       characters per sample (200)\n"
               "  --temperature T      softmax temperature; 0: greedy (0.8)\n"
               "files:\n"
               "  --init FILE.safetensors  resume a checkpoint of the same model and text\n"
               "  --save FILE.safetensors  write the weights and AdamW state at the end\n"
               "  --log FILE.jsonl     one line per step: {\"step\": k, \"loss\": x}\n"
               "  --quiet              only the final lines\n");
}

static int parse_args(int argc, char **argv, options *o)
{
    *o = (options){
        .model = { .context = 64, .d_model = 128, .heads = 4, .layers = 2 },
        .batch = 32,
        .steps = 1000,
        .sample_every = 200,
        .sample_len = 200,
        .lr = 3e-4,
        .clip_norm = 1.0,
        .temperature = 0.8,
        .seed = 1,
    };
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            exit(0);
        } else if (strcmp(a, "--tie-head") == 0) {
            o->model.tie_head = true;
            continue;
        } else if (strcmp(a, "--quiet") == 0) {
            o->quiet = true;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "train_gpt: unknown option '%s' or it needs a value (--help)\n", a);
            return -1;
        }
        const char *val = argv[++i];
        if (strcmp(a, "--text") == 0) {
            o->text = val;
        } else if (strcmp(a, "--init") == 0) {
            o->init = val;
        } else if (strcmp(a, "--save") == 0) {
            o->save = val;
        } else if (strcmp(a, "--log") == 0) {
            o->log = val;
        } else if (strcmp(a, "--strategy") == 0) {
            if (strcmp(val, "multiworker") != 0 && strcmp(val, "pipeline") != 0 &&
                strcmp(val, "mirrored") != 0 && strcmp(val, "ps") != 0) {
                fprintf(stderr,
                        "train_gpt: --strategy %s: expected multiworker, mirrored, ps or "
                        "pipeline\n",
                        val);
                return -1;
            }
            o->strategy = val;
            o->pipeline = strcmp(val, "pipeline") == 0;
            o->mirrored = strcmp(val, "mirrored") == 0;
        } else if (strcmp(a, "--schedule") == 0) {
            if (strcmp(val, "gpipe") != 0 && strcmp(val, "1f1b") != 0) {
                fprintf(stderr, "train_gpt: --schedule %s: expected gpipe or 1f1b\n", val);
                return -1;
            }
            o->schedule = strcmp(val, "gpipe") == 0 ? WF_SCHEDULE_GPIPE : WF_SCHEDULE_1F1B;
            o->schedule_set = true;
        } else if (strcmp(a, "--lr") == 0 || strcmp(a, "--temperature") == 0 ||
                   strcmp(a, "--dropout") == 0 || strcmp(a, "--clip-norm") == 0) {
            char *end;
            double v = strtod(val, &end);
            bool lr = a[2] == 'l', temp = a[2] == 't', clip = a[2] == 'c';
            if (*end || end == val || !isfinite(v) || v < 0 || (lr && v <= 0) ||
                (!lr && !temp && !clip && v >= 1)) {
                fprintf(stderr, "train_gpt: %s %s: expected %s\n", a, val,
                        lr             ? "a positive number"
                        : temp || clip ? "a number >= 0"
                                       : "a number in [0, 1)");
                return -1;
            }
            *(lr ? &o->lr : temp ? &o->temperature : clip ? &o->clip_norm : &o->model.dropout) = v;
        } else {
            static const struct {
                const char *name;
                long lo, hi;
            } ints[] = { { "--context", 1, 1 << 16 },       { "--d-model", 1, 1 << 16 },
                         { "--heads", 1, 1 << 12 },         { "--layers", 1, GPT_MAX_LAYERS },
                         { "--batch", 1, 1 << 16 },         { "--steps", 0, 1l << 40 },
                         { "--seed", 0, 1l << 62 },         { "--threads", 0, 1024 },
                         { "--sample-every", 0, 1l << 40 }, { "--sample-len", 1, 1 << 20 },
                         { "--shards", 1, 1 << 16 },        { "--stages", 1, 64 },
                         { "--micro-batches", 1, 64 },      { "--devices", 1, 1 << 10 },
                         { "--ps-ranks", 1, 1 << 16 },      { "--staleness", 0, 1 << 20 } };

            size_t k = 0;
            while (k < sizeof ints / sizeof ints[0] && strcmp(a, ints[k].name) != 0)
                k++;
            if (k == sizeof ints / sizeof ints[0]) {
                fprintf(stderr, "train_gpt: unknown option '%s' (--help lists them)\n", a);
                return -1;
            }
            char *end;
            long long v = strtoll(val, &end, 10);
            if (*end || end == val || v < ints[k].lo || v > ints[k].hi) {
                fprintf(stderr, "train_gpt: %s %s: expected an integer in [%ld, %ld]\n", a, val,
                        ints[k].lo, ints[k].hi);
                return -1;
            }
            long *longs[] = {
                NULL,           NULL, NULL, NULL, NULL, &o->steps, NULL, NULL, &o->sample_every,
                &o->sample_len, NULL, NULL, NULL, NULL, NULL,      NULL
            };
            int *ints_at[] = { &o->model.context,
                               &o->model.d_model,
                               &o->model.heads,
                               &o->model.layers,
                               &o->batch,
                               NULL,
                               NULL,
                               &o->threads,
                               NULL,
                               NULL,
                               &o->shards,
                               &o->stages,
                               &o->micro_batches,
                               &o->devices,
                               &o->ps_ranks,
                               &o->staleness };
            o->staleness_set |= strcmp(a, "--staleness") == 0;
            if (k == 6)
                o->seed = (uint64_t)v;
            else if (longs[k])
                *longs[k] = (long)v;
            else
                *ints_at[k] = (int)v;
        }
    }
    bool ps = o->strategy && strcmp(o->strategy, "ps") == 0;
    if (o->shards && (!o->strategy || o->pipeline)) {
        fprintf(stderr, "train_gpt: --shards needs --strategy multiworker, mirrored or ps (a "
                        "pipeline's are --micro-batches)\n");
        return -1;
    }
    if (o->devices && !o->mirrored) {
        fprintf(stderr, "train_gpt: --devices needs --strategy mirrored\n");
        return -1;
    }
    if ((o->ps_ranks || o->staleness_set) && !ps) {
        fprintf(stderr, "train_gpt: --ps-ranks and --staleness need --strategy ps\n");
        return -1;
    }
    if (ps && !o->ps_ranks) {
        fprintf(stderr, "train_gpt: --strategy ps needs --ps-ranks K (the server ranks)\n");
        return -1;
    }
    if (ps && o->clip_norm > 0) {
        fprintf(stderr, "train_gpt: --strategy ps: the servers cannot clip the gradients by "
                        "their global norm (each holds a part of them, and only updates may "
                        "read a gradient there); give --clip-norm 0\n");
        return -1;
    }
    if ((o->stages || o->micro_batches || o->schedule_set) && !o->pipeline) {
        fprintf(stderr,
                "train_gpt: --stages, --micro-batches and --schedule need --strategy pipeline\n");
        return -1;
    }
    if (!o->schedule_set)
        o->schedule = WF_SCHEDULE_1F1B;
    o->model.seed = o->seed;
    return 0;
}

/* --strategy, before any file is opened: a rank other than the writer (0; under --strategy ps
 * the first worker, rank K), from the environment, writes no log or checkpoint and prints
 * nothing (its errors still go to stderr). */
static int quiet_other_ranks(options *o)
{
    int rank = wt_ranks_env_rank();
    if (rank < 0) {
        fprintf(stderr, "train_gpt: --strategy: %s\n", wf_last_errmsg());
        return -1;
    }
    o->sample_any = !o->quiet;
    o->save_any = o->save != NULL;
    if (rank != o->ps_ranks) { /* 0 but under --strategy ps */
        o->quiet = true;
        o->log = o->save = NULL;
        if (!freopen("/dev/null", "w", stdout))
            return -1;
    }
    return 0;
}

/* --strategy: mirrored over this process's devices; multiworker or parameter servers over
 * the ranks; or a pipeline over them (each block's stage in t->hints). */
static int make_strategy(trainer *t, char *err, size_t errlen)
{
    const options *o = t->o;
    int rc;
    if (o->mirrored)
        return wt_mirrored(t->rt, o->devices, o->shards, "train_gpt", o->quiet, &t->strategy, err,
                           errlen);
    if (o->ps_ranks)
        return wf_strategy_ps(
            t->comm,
            &(wf_ps_opts){ .servers = o->ps_ranks, .staleness = o->staleness, .shards = o->shards },
            &t->strategy);
    if (!o->pipeline)
        return wf_strategy_multiworker(t->comm, &(wf_strategy_opts){ .shards = o->shards },
                                       &t->strategy);
    int stages = o->stages ? o->stages : wf_comm_size(t->comm);
    if (o->model.layers < stages - 1) {
        snprintf(err, errlen,
                 "--strategy pipeline: %d stages need at least %d blocks (--layers %d): the "
                 "stages between the first and the last would be empty",
                 stages, stages - 1, o->model.layers);
        return WF_EINVAL;
    }
    rc = wf_place_hints_create(&t->hints);
    if (rc == 0)
        rc = wf_strategy_pipeline(t->comm,
                                  &(wf_pipeline_opts){ .stages = o->stages,
                                                       .micro_batches = o->micro_batches,
                                                       .schedule = o->schedule,
                                                       .batch_rows = o->batch,
                                                       .hints = t->hints },
                                  &t->strategy);
    return rc;
}

/* The stage of parameter 'name' of the model (wt_ranks_gather()). */
static int param_stage(const char *name, void *ctx)
{
    const trainer *t = ctx;
    for (int i = 0; i < t->m.n_params; i++)
        if (strcmp(wf_node_name(t->m.p[i]), name) == 0)
            return gpt_param_stage(&t->m, i);
    return 0;
}

/* Before the writer samples or saves: a pipeline's other stages' weights (and optimizer
 * state) to rank 0; parameter servers' weights and optimizer state to every rank (a
 * collective: every rank calls it at the same point). Nothing otherwise. */
static int gather(trainer *t, char *err, size_t errlen)
{
    if (t->o->ps_ranks) {
        int rc = wf_session_ps_sync(t->s);
        if (rc < 0)
            snprintf(err, errlen, "gathering the servers' state: %s", wf_session_errmsg(t->s));
        return rc;
    }
    if (!t->o->pipeline || wf_strategy_size(t->strategy) < 2)
        return 0;
    return wt_ranks_gather(t->comm, t->s, t->g, param_stage, t, err, errlen);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The bundled text: installed in <program>/../share/weft/ (wherever the prefix was moved), or
 * in the source tree. 0 with its path in 'path', or WF_ENOTFOUND with err naming the paths
 * tried. */
static int default_text(char *path, size_t pathlen, char *err, size_t errlen)
{
    char tried[2 * 4096 + 8];
    if (wt_bundled_find(NULL, TG_DATADIR, "us-founding-documents.txt", TG_TEXT_SOURCE, path,
                        pathlen, tried, sizeof tried) == 0)
        return 0;
    snprintf(err, errlen, "the bundled text was not found (%s); give --text FILE", tried);
    return WF_ENOTFOUND;
}

static void print_sample(trainer *t, long step, uint64_t *rng)
{
    const options *o = t->o;
    /* the prompt: a newline where the text has one, else its first token */
    int32_t prompt = t->text->id['\n'] >= 0 ? t->text->id['\n'] : 0;
    char *buf = malloc((size_t)o->sample_len + 1), err[512] = "";
    if (!buf || sample(t, &prompt, 1, rng, buf, err, sizeof err) < 0) {
        fprintf(stderr, "train_gpt: %s\n", buf ? err : "sampling: out of memory");
        free(buf);
        return;
    }
    printf("--- sample at step %ld (temperature %g) ---\n%s\n---\n", step, o->temperature, buf);
    fflush(stdout);
    free(buf);
}

int main(int argc, char **argv)
{
    options o;
    if (parse_args(argc, argv, &o) < 0 || (o.strategy && quiet_other_ranks(&o) < 0))
        return 2;
    char err[1024] = "";
    corpus text = { 0 };
    trainer t = { .o = &o, .text = &text };
    FILE *log = NULL;
    char bundled[4096];
    const char *path = o.text ? o.text : bundled;
    int rc = o.text ? 0 : default_text(bundled, sizeof bundled, err, sizeof err);
    if (rc == 0)
        rc = read_text(path, &text, err, sizeof err);
    int ctx = o.model.context;
    if (rc == 0 && text.n_train < ctx + 1) {
        snprintf(err, sizeof err,
                 "--text %s: %lld bytes; --context %d needs at least %lld (90%% of the text "
                 "trains)",
                 path, (long long)text.n, ctx, (long long)((ctx + 1) * 10 / 9 + 1));
        rc = WF_EINVAL;
    }
    o.model.vocab = text.vocab;
    if (rc == 0)
        rc = gpt_config_check(&o.model, err, sizeof err);
    if (rc == 0 && o.log && !(log = fopen(o.log, "w"))) {
        snprintf(err, sizeof err, "--log %s: %s", o.log, strerror(errno));
        rc = WF_EIO;
    }
    wf_runtime_opts ro = { .n_workers = o.threads };
    if (rc == 0 && (rc = wf_runtime_create(&t.rt, &ro)) < 0)
        snprintf(err, sizeof err, "runtime: %s", wf_last_errmsg());
    if (rc == 0 && o.strategy && !o.mirrored) /* mirrored: one process */
        rc = wt_ranks_comm(t.rt, &t.comm, err, sizeof err);
    if (rc == 0 && o.strategy && (rc = make_strategy(&t, err, sizeof err)) < 0 && !err[0])
        snprintf(err, sizeof err, "--strategy: %s", wf_last_errmsg());
    if (rc == 0)
        rc = build(&t, err, sizeof err);
    if (rc < 0) {
        fprintf(stderr, "train_gpt: %s\n", err);
        goto out;
    }
    bool have_val = text.n - text.n_train >= ctx + 1;
    if (!o.quiet)
        printf("train_gpt: %s: %lld characters, vocabulary %d; GPT %d layers, %d heads, "
               "d_model %d, context %d, %s head (%lld weights); AdamW lr %g, batch %d, %ld "
               "steps, %d workers\n",
               path, (long long)text.n, text.vocab, o.model.layers, o.model.heads, o.model.d_model,
               ctx, o.model.tie_head ? "tied" : "separate", (long long)gpt_weight_count(&t.m), o.lr,
               o.batch, o.steps, wf_runtime_worker_count(t.rt));
    size_t bn = (size_t)o.batch * (size_t)ctx;
    int32_t *xb = malloc(bn * sizeof *xb), *yb = malloc(bn * sizeof *yb);
    if (!xb || !yb) {
        fprintf(stderr, "train_gpt: no memory for a batch\n");
        rc = WF_ENOMEM;
        goto out_batch;
    }
    /* a resumed run draws other windows than the run it resumes */
    uint64_t batch_rng = o.seed * 0x2545f4914f6cdd1dull + 1 + (uint64_t)t.start * 7919u;
    uint64_t sample_rng = o.seed + 99;
    long every = o.sample_every > 0 ? o.sample_every : o.steps;
    double t0 = now_s(), last_loss = NAN, val_loss = NAN;
    wt_progress_opts po = { .quiet = o.quiet };
    wf_shape bs = WF_SHAPE(o.batch, ctx);
    if (t.start > 0 && !o.quiet)
        printf("train_gpt: %s is at step %ld; training on to step %ld\n", o.init, t.start, o.steps);
    long done = 0;
    for (long step = t.start; step < o.steps && rc == 0;) {
        long chunk = o.steps - step < every ? o.steps - step : every;
        wt_progress bar;
        wt_progress_begin(&bar, &po, 0, 0, (int64_t)chunk * o.batch);
        double lsum = 0;
        for (long k = 0; k < chunk && rc == 0; k++, step++, done++) {
            make_batch(&text, 0, text.n_train, o.batch, ctx, &batch_rng, xb, yb);
            wf_tensor *x = wf_tensor_from(WF_I32, bs, xb), *y = wf_tensor_from(WF_I32, bs, yb);
            rc = x && y ? train_step(&t, x, y, &last_loss, err, sizeof err) : WF_ENOMEM;
            wf_tensor_release(x);
            wf_tensor_release(y);
            if (rc == 0 && !isfinite(last_loss)) {
                snprintf(err, sizeof err, "step %ld: the loss is %g (try a smaller --lr)", step,
                         last_loss);
                rc = WF_EINVAL;
            }
            if (rc < 0)
                break;
            lsum += last_loss;
            if (log)
                fprintf(log, "{\"step\": %ld, \"loss\": %.9g}\n", step, last_loss);
            wt_progress_update(&bar, (k + 1) * o.batch, lsum / (double)(k + 1), -1);
        }
        char note[96];
        int nl = snprintf(note, sizeof note, "step %ld/%ld", step, o.steps);
        if (rc == 0 && have_val &&
            (rc = evaluate(&t, text.n_train, text.n, xb, yb, &val_loss, err, sizeof err)) == 0)
            snprintf(note + nl, sizeof note - (size_t)nl, "  val loss %.4f", val_loss);
        wt_progress_end_note(&bar, rc == 0 ? note : NULL);
        if (rc == 0 && o.sample_any) /* gather() does what the strategy needs */
            rc = gather(&t, err, sizeof err);
        if (rc == 0 && !o.quiet)
            print_sample(&t, step, &sample_rng);
    }
    if (rc < 0) {
        fprintf(stderr, "train_gpt: %s\n", err);
        goto out_batch;
    }
    double secs = now_s() - t0;
    if (done > 0) {
        char val[48] = "";
        if (have_val)
            snprintf(val, sizeof val, ", val loss %.4f", val_loss);
        printf("train_gpt: %ld steps in %.2f s (%.1f ms/step, %.0f tokens/s); last train loss "
               "%.4f%s\n",
               done, secs, 1e3 * secs / (double)done, (double)done * (double)bn / secs, last_loss,
               val);
    } else if (o.sample_any || !o.pipeline) {
        if ((rc = gather(&t, err, sizeof err)) == 0 && !o.quiet)
            print_sample(&t, t.start, &sample_rng);
    }
    if (rc == 0 && o.save_any && (rc = gather(&t, err, sizeof err)) < 0) {
        fprintf(stderr, "train_gpt: --save: %s\n", err);
        goto out_batch;
    }
    if (o.save) {
        if ((rc = wf_checkpoint_save(t.s, o.save)) < 0)
            fprintf(stderr, "train_gpt: --save: %s\n", wf_session_errmsg(t.s));
        else
            printf("train_gpt: saved %s (safetensors: weights, AdamW state, vocabulary)\n", o.save);
    }
out_batch:
    free(xb);
    free(yb);
out:
    if (log && fclose(log) != 0 && rc == 0) {
        fprintf(stderr, "train_gpt: --log %s: %s\n", o.log, strerror(errno));
        rc = WF_EIO;
    }
    wf_session_destroy(t.s);
    wf_graph_destroy(t.g);
    wf_strategy_destroy(t.strategy);
    wf_place_hints_destroy(t.hints);
    wf_comm_destroy(t.comm);
    wf_runtime_destroy(t.rt);
    free(text.tokens);
    return rc < 0 ? 1 : 0;
}
