/* perf/train/ckpt_bench.c: what checkpointing every K steps costs a training step.
 *   train_ckpt_k<K>_mlp_adam_b256  MLP 784-1024-1024-10, ReLU, softmax cross-entropy, Adam,
 *                                  batch 256, f32: 1.86 M weights, so each checkpoint holds
 *                                  5.6 M floats (weights and both Adam moments, 22 MB)
 * One session, one synthetic batch. Each round runs --steps steps without checkpoints, then
 * --steps steps with a wf_checkpointer taking a snapshot every K steps (at steps K/2, K/2 +
 * K, ...: the last write overlaps the segment's last K/2 steps, and the segment ends with
 * wf_checkpointer_wait(), timed, so a write the steps did not hide is counted), then the
 * other order in the next round, so both modes see the same machine. The checkpoints go
 * into --dir (default: a new folder under the current one, on its disk, removed at the end;
 * /tmp may be memory).
 * There is no peer: the comparison is weft without checkpoints in the same run. The lines
 * (--json: one JSON object each) are the median time per step of each mode over the rounds;
 * the checkpointing one adds "overhead_pct" (its median over the plain median, minus 1),
 * "snapshot_ms" (median time of one wf_checkpointer_save(): the copy the step waits for),
 * "ckpt_bytes" (one file) and "checkpoints". "cpu_s" is the process's CPU time per step
 * (every thread: the workers, and the checkpointer's copy and write), steadier than the
 * wall time when other processes share the cores; "overhead_cpu_pct" compares those.
 * Usage: ckpt_bench [--json] [--rounds N] [--steps N] [--every K] [--threads N] [--dir D]
 *                   [--quick]   (--quick: a smoke run, a small MLP, not a measurement) */
#include "../bench_util.h"

#include <weft/weft.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct cfg {
    bool json, quick;
    int rounds, steps, every, threads;
    const char *dir;
} cfg;

typedef struct model {
    wf_graph *g;
    wf_session *s;
    wf_node *x, *y, *train;
    wf_tensor *xs, *ys;
} model;

static int build(wf_runtime *rt, const cfg *c, model *m)
{
    int in = c->quick ? 64 : 784, hid = c->quick ? 64 : 1024, batch = c->quick ? 32 : 256;
    m->g = wf_graph_create(rt, WF_STATIC);
    m->x = wf_placeholder(m->g, "x", WF_F32, WF_SHAPE(batch, in));
    m->y = wf_placeholder(m->g, "y", WF_I32, WF_SHAPE(batch));
    wf_node *h = m->x;
    int dims[4] = { in, hid, hid, 10 };
    for (int l = 0; l < 3; l++) {
        char wn[16], bn[16];
        snprintf(wn, sizeof wn, "fc%d.weight", l + 1);
        snprintf(bn, sizeof bn, "fc%d.bias", l + 1);
        wf_node *w = wf_variable(m->g, wn, WF_F32, WF_SHAPE(dims[l + 1], dims[l]),
                                 wf_init_glorot_uniform(11 + (uint64_t)l));
        wf_node *b = wf_variable(m->g, bn, WF_F32, WF_SHAPE(dims[l + 1]), wf_init_zeros());
        h = wf_add(m->g, wf_matmul_ex(m->g, h, w, false, true), b);
        if (l < 2)
            h = wf_relu(m->g, h);
    }
    wf_node *loss = wf_mean(m->g, wf_softmax_cross_entropy(m->g, h, m->y));
    m->train = wf_minimize(m->g, wf_adam(1e-3), loss);
    int rc = wf_graph_status(m->g);
    if (rc == 0)
        rc = wf_session_create(m->g, NULL, &m->s);
    if (rc < 0) {
        fprintf(stderr, "ckpt_bench: %s\n", wf_graph_errmsg(m->g));
        return rc;
    }
    float *xd = malloc((size_t)batch * (size_t)in * sizeof *xd);
    int32_t *yd = malloc((size_t)batch * sizeof *yd);
    if (!xd || !yd)
        return WF_ENOMEM;
    uint64_t st = 12345;
    for (int i = 0; i < batch * in; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        xd[i] = (float)((double)(st >> 40) / (double)(1u << 24)) - 0.5f;
    }
    for (int i = 0; i < batch; i++)
        yd[i] = i % 10;
    m->xs = wf_tensor_from(WF_F32, WF_SHAPE(batch, in), xd);
    m->ys = wf_tensor_from(WF_I32, WF_SHAPE(batch), yd);
    free(xd);
    free(yd);
    return m->xs && m->ys ? 0 : WF_ENOMEM;
}

static int step(model *m)
{
    wf_feed f[2] = { { m->x, m->xs }, { m->y, m->ys } };
    int rc = wf_session_run(m->s, f, 2, NULL, 0, NULL, &m->train, 1);
    if (rc < 0)
        fprintf(stderr, "ckpt_bench: %s\n", wf_session_errmsg(m->s));
    return rc;
}

/* One segment of 'c->steps' steps; with 'ck', a snapshot every K steps. Returns the seconds
 * per step, or a negative value; adds each snapshot's seconds to 'snap' ('*n_snap'). */
static double segment(const cfg *c, model *m, wf_checkpointer *ck, int64_t *global, double *snap,
                      int *n_snap, double *cpu)
{
    double t0 = bench_now_s(), c0 = bench_process_cpu_s();
    for (int i = 0; i < c->steps; i++, (*global)++) {
        if (step(m) < 0)
            return -1;
        if (ck && (i + 1) % c->every == c->every / 2) {
            double s0 = bench_now_s();
            if (wf_checkpointer_save(ck, m->s, *global + 1, NULL, 0) < 0) {
                fprintf(stderr, "ckpt_bench: %s\n", wf_last_errmsg());
                return -1;
            }
            snap[(*n_snap)++] = bench_now_s() - s0;
        }
    }
    if (ck && wf_checkpointer_wait(ck) < 0) {
        fprintf(stderr, "ckpt_bench: %s\n", wf_last_errmsg());
        return -1;
    }
    *cpu = (bench_process_cpu_s() - c0) / c->steps;
    return (bench_now_s() - t0) / c->steps;
}

/* Removes the files of 'dir' and 'dir' (a folder this program made). */
static void remove_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    char p[4096];
    for (struct dirent *e; (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            (void)unlink(p);
        }
    closedir(d);
    (void)rmdir(dir);
}

static int parse(int argc, char **argv, cfg *c)
{
    *c = (cfg){ .rounds = 7, .steps = 200, .every = 100, .threads = bench_default_threads() };
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int *dst = strcmp(a, "--rounds") == 0    ? &c->rounds
                   : strcmp(a, "--steps") == 0   ? &c->steps
                   : strcmp(a, "--every") == 0   ? &c->every
                   : strcmp(a, "--threads") == 0 ? &c->threads
                                                 : NULL;
        if (strcmp(a, "--json") == 0) {
            c->json = true;
        } else if (strcmp(a, "--quick") == 0) {
            c->quick = true;
        } else if (strcmp(a, "--dir") == 0 && v) {
            c->dir = v;
            i++;
        } else if (dst && bench_parse_int(v, 1, 1 << 24, dst) == 0) {
            i++;
        } else {
            fprintf(stderr, "usage: ckpt_bench [--json] [--rounds N] [--steps N] [--every K] "
                            "[--threads N] [--dir D] [--quick]\n");
            return -1;
        }
    }
    if (c->quick) {
        c->rounds = c->rounds < 2 ? c->rounds : 2;
        c->steps = 20;
        c->every = 10;
    }
    return 0;
}

int main(int argc, char **argv)
{
    cfg c;
    if (parse(argc, argv, &c) < 0)
        return 2;
    char made[64] = "";
    if (!c.dir) {
        snprintf(made, sizeof made, "./ckpt_bench.XXXXXX");
        if (!mkdtemp(made)) {
            perror("ckpt_bench: mkdtemp");
            return 1;
        }
        c.dir = made;
    }
    wf_runtime *rt = NULL;
    model m = { 0 };
    wf_checkpointer *ck = NULL;
    int rc = wf_runtime_create(&rt, &(wf_runtime_opts){ .n_workers = c.threads });
    if (rc < 0)
        fprintf(stderr, "ckpt_bench: %s\n", wf_last_errmsg());
    if (rc == 0)
        rc = build(rt, &c, &m);
    if (rc == 0 && (rc = wf_checkpointer_create(&(wf_checkpointer_opts){ .dir = c.dir }, &ck)) < 0)
        fprintf(stderr, "ckpt_bench: %s\n", wf_last_errmsg());
    double *plain = calloc((size_t)c.rounds, sizeof *plain);
    double *with = calloc((size_t)c.rounds, sizeof *with);
    double *cpu_plain = calloc((size_t)c.rounds, sizeof *cpu_plain);
    double *cpu_with = calloc((size_t)c.rounds, sizeof *cpu_with);
    int per = c.steps / c.every + 1, n_snap = 0;
    double *snap = calloc((size_t)(c.rounds * per), sizeof *snap);
    if (rc == 0 && (!plain || !with || !snap || !cpu_plain || !cpu_with))
        rc = WF_ENOMEM;
    int64_t global = 0;
    for (int i = 0; rc == 0 && i < 3; i++, global++) /* warm-up: the plan, the pools */
        rc = step(&m);
    for (int r = 0; rc == 0 && r < c.rounds; r++) {
        for (int k = 0; k < 2 && rc == 0; k++) {
            bool ckpt = (k == 0) == (r % 2 == 1); /* plain first in even rounds */
            double cpu = 0, t = segment(&c, &m, ckpt ? ck : NULL, &global, snap, &n_snap, &cpu);
            if (t < 0)
                rc = WF_EIO;
            (ckpt ? with : plain)[r] = t;
            (ckpt ? cpu_with : cpu_plain)[r] = cpu;
        }
    }
    if (rc == 0) {
        char last[4096];
        int64_t at;
        struct stat st = { 0 };
        if (wf_checkpoint_latest(c.dir, last, sizeof last, &at) == 0)
            (void)stat(last, &st);
        double mp = bench_median(plain, c.rounds), mw = bench_median(with, c.rounds);
        double cp = bench_median(cpu_plain, c.rounds), cw = bench_median(cpu_with, c.rounds);
        double ms = n_snap ? bench_median(snap, n_snap) : 0;
        char bench[64];
        snprintf(bench, sizeof bench, "train_ckpt_k%d_mlp_adam_b%d%s", c.every, c.quick ? 32 : 256,
                 c.quick ? "_quick" : "");
        if (c.json) {
            printf("{\"bench\": \"%s\", \"impl\": \"weft\", \"checkpoint\": false, "
                   "\"threads\": %d, \"median_s\": %.6g, \"cpu_s\": %.6g, \"reps\": %d, "
                   "\"steps\": %d}\n",
                   bench, c.threads, mp, cp, c.rounds, c.steps);
            printf("{\"bench\": \"%s\", \"impl\": \"weft\", \"checkpoint\": true, "
                   "\"threads\": %d, \"median_s\": %.6g, \"cpu_s\": %.6g, \"reps\": %d, "
                   "\"steps\": %d, \"every\": %d, \"overhead_pct\": %.3f, "
                   "\"overhead_cpu_pct\": %.3f, \"snapshot_ms\": %.3f, \"ckpt_bytes\": %lld, "
                   "\"checkpoints\": %d}\n",
                   bench, c.threads, mw, cw, c.rounds, c.steps, c.every, 100 * (mw / mp - 1),
                   100 * (cw / cp - 1), 1e3 * ms, (long long)st.st_size, n_snap);
        } else {
            printf("%s, %d threads, %d rounds of %d steps (no peer: the same run without "
                   "checkpoints)\n",
                   bench, c.threads, c.rounds, c.steps);
            printf("  no checkpoints      %8.3f ms/step  %8.3f ms CPU/step\n", 1e3 * mp, 1e3 * cp);
            printf("  every %4d steps    %8.3f ms/step  %8.3f ms CPU/step  (%+.2f%%, CPU "
                   "%+.2f%%; snapshot %.2f ms, %lld bytes, %d checkpoints)\n",
                   c.every, 1e3 * mw, 1e3 * cw, 100 * (mw / mp - 1), 100 * (cw / cp - 1), 1e3 * ms,
                   (long long)st.st_size, n_snap);
        }
    }
    free(plain);
    free(with);
    free(cpu_plain);
    free(cpu_with);
    free(snap);
    wf_checkpointer_destroy(ck);
    wf_tensor_release(m.xs);
    wf_tensor_release(m.ys);
    wf_session_destroy(m.s);
    wf_graph_destroy(m.g);
    wf_runtime_destroy(rt);
    if (made[0])
        remove_dir(made);
    return rc < 0 ? 1 : 0;
}
