/* perf/train/train_bench.c: one training step of two models, weft against PyTorch (Debian's
 * python3-torch) in the same run:
 *   mlp_adam_b256  MLP 784-1024-1024-10, ReLU, softmax cross-entropy, Adam, batch 256, f32
 *                  (about 2.86 GFLOP a step)
 *   cnn_sgdm_b64   conv 3x3 32 + ReLU + maxpool 2, conv 3x3 64 + ReLU + maxpool 2, linear
 *                  1600-128, ReLU, linear 128-10; SGD momentum 0.9; batch 64 of 1x28x28
 *   gpt_adamw_b32  examples/train_gpt's character-level GPT (gpt_model.c, built here from the
 *                  same source): vocab 65, context 64, d_model 128, 4 heads, 2 layers,
 *                  separate head, next-token cross-entropy over batch 32 x 64 tokens; AdamW
 *                  lr 3e-4, weight decay 0.1 on matrices, gradients clipped to norm 1
 * Each case runs in its own process (this program re-executed with --child, and
 * perf/train/train_bench_torch.py for PyTorch), so each peak_rss_mb is that process's alone.
 * Synthetic data; the step is a session run of wf_minimize's target (gpt: gpt_train_step's
 * two AdamW targets) for weft, or zero_grad/forward/backward/(clip)/step for PyTorch; median
 * of --reps timed steps after --warmup.
 * Each pass's contribution: '--passes-off NAME[,NAME...]' (repeatable) adds, for every case,
 * one more weft line per NAME with that compile pass switched off (WF_SESSION_NO_*; "all":
 * every pass; "a+b": both), marked '"passes_off": "NAME"'; '--ablate' does it for every
 * pass and "all".
 * The default run (no option) is unchanged.
 * Usage: train_bench [--json] [--reps N] [--warmup N] [--only a,b] [--threads N]
 *        [--python /usr/bin/python3] [--quick] [--passes-off NAME[,NAME...]]... [--ablate]
 * The weft child reads the WEFT_* environment (wf_runtime_opts_from_env; --threads wins over
 * WEFT_WORKERS): 'WEFT_TRACE=gpt.json train_bench --child gpt_adamw_b32' writes a Perfetto
 * trace of its timed steps; TB_DUMP=FILE writes the compiled step (wf_session_dump, text).
 * The weft JSON line also has "cpu_s", the process's CPU time per timed step (all threads,
 * the workers' idle spinning included): steadier than the wall time when other processes
 * share the cores, and the measure of the work a step costs.
 * Compare the ratio within one run: these machines are shared and noisy. */
#include "../bench_util.h"

#include <weft/weft.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <train_gpt/gpt_model.h>
#include <unistd.h>

#ifndef TB_TORCH_SCRIPT
#    define TB_TORCH_SCRIPT "train_bench_torch.py"
#endif

static const char *const cases[] = { "mlp_adam_b256", "cnn_sgdm_b64", "gpt_adamw_b32" };

/* The passes '--passes-off' names, in the pipeline's order (runtime/compile/plan.c), and "all". */
static const struct {
    const char *name;
    uint32_t flag;
} pass_names[] = {
    { "fold", WF_SESSION_NO_FOLD },         { "cse", WF_SESSION_NO_CSE },
    { "simplify", WF_SESSION_NO_SIMPLIFY }, { "epilogue", WF_SESSION_NO_EPILOGUE },
    { "fuse", WF_SESSION_NO_FUSE },         { "optim_fuse", WF_SESSION_NO_OPTIM_FUSE },
    { "memplan", WF_SESSION_NO_MEMPLAN },   { "priority", WF_SESSION_NO_PRIORITY },
    { "all", WF_SESSION_NO_PASSES },
};

#define N_PASS_NAMES  (int)(sizeof pass_names / sizeof pass_names[0])
#define MAX_ABLATIONS 32

static wf_node *linear(wf_graph *g, wf_node *h, const char *name, int in, int out, uint64_t seed)
{
    char wn[32], bn[32];
    snprintf(wn, sizeof wn, "%s.weight", name);
    snprintf(bn, sizeof bn, "%s.bias", name);
    double b = 1 / sqrt((double)in);
    wf_node *w = wf_variable(g, wn, WF_F32, WF_SHAPE(out, in), wf_init_uniform(seed, -b, b));
    wf_node *bias = wf_variable(g, bn, WF_F32, WF_SHAPE(out), wf_init_uniform(seed + 1, -b, b));
    return wf_add(g, wf_matmul_ex(g, h, w, false, true), bias);
}

static wf_node *conv(wf_graph *g, wf_node *h, const char *name, int in, int out, uint64_t seed)
{
    char wn[32], bn[32];
    snprintf(wn, sizeof wn, "%s.weight", name);
    snprintf(bn, sizeof bn, "%s.bias", name);
    double b = 1 / sqrt((double)in * 9);
    wf_node *w = wf_variable(g, wn, WF_F32, WF_SHAPE(out, in, 3, 3), wf_init_uniform(seed, -b, b));
    wf_node *bias =
        wf_variable(g, bn, WF_F32, WF_SHAPE(out, 1, 1), wf_init_uniform(seed + 1, -b, b));
    const wf_pool2d_opts pool = { .window = { 2, 2 } };
    return wf_max_pool2d(g, wf_relu(g, wf_add(g, wf_conv2d(g, h, w, NULL), bias)), &pool);
}

/* The GPT case: the model, its loss and its two AdamW update targets in 'g'; x and y are
 * [32, 64] token ids. Returns the loss, or NULL with the graph's error. */
static wf_node *gpt_case(wf_graph *g, wf_node **x, wf_node **y, wf_node *targets[2])
{
    gpt_config c = {
        .vocab = 65, .context = 64, .d_model = 128, .heads = 4, .layers = 2, .seed = 1
    };
    gpt_model m;
    char err[256];
    if (gpt_build(g, &c, &m, err, sizeof err) < 0) {
        fprintf(stderr, "train_bench: %s\n", err);
        return NULL;
    }
    *x = wf_placeholder(g, "x", WF_I32, WF_SHAPE(32, 64));
    *y = wf_placeholder(g, "y", WF_I32, WF_SHAPE(32, 64));
    wf_node *loss = gpt_loss(g, gpt_logits(g, &m, *x, true), *y);
    gpt_train_opts o = { .lr = 3e-4, .weight_decay = 0.1, .clip_norm = 1.0 };
    return loss && gpt_train_step(g, &m, loss, &o, targets) == 0 ? loss : NULL;
}

/* The CPU time of this process so far (every thread), in seconds. */
static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Runs one case in this process with session flags 'flags' and prints its JSON line
 * (with '"passes_off": off' unless 'off' is NULL). */
static int child(const char *name, int warmup, int reps, int threads, uint32_t flags,
                 const char *off)
{
    wf_runtime *rt;
    wf_runtime_opts ro = { 0 };
    const char *trace = NULL; /* WEFT_TRACE=FILE: a Perfetto trace of the timed steps */
    if (wf_runtime_opts_from_env(&ro, &trace) < 0) {
        fprintf(stderr, "train_bench: %s\n", wf_last_errmsg());
        return 1;
    }
    if (threads > 0)
        ro.n_workers = threads;
    if (wf_runtime_create(&rt, &ro) < 0) {
        fprintf(stderr, "train_bench: %s\n", wf_last_errmsg());
        return 1;
    }
    bool mlp = strcmp(name, "mlp_adam_b256") == 0, gpt = strcmp(name, "gpt_adamw_b32") == 0;
    int batch = mlp ? 256 : gpt ? 32 : 64;
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    /* gpt: x and y are [32, 64] i32 tokens; the others: f32 inputs and [batch] i32 labels */
    wf_shape xs = mlp ? WF_SHAPE(batch, 784) : gpt ? WF_SHAPE(32, 64) : WF_SHAPE(batch, 1, 28, 28);
    wf_shape ys = gpt ? WF_SHAPE(32, 64) : WF_SHAPE(batch);
    wf_node *x = NULL, *y = NULL, *h, *loss = NULL, *train[2] = { NULL, NULL };
    int n_train = 1;
    if (gpt) {
        loss = gpt_case(g, &x, &y, train);
        n_train = 2;
    } else {
        x = wf_placeholder(g, "x", WF_F32, xs);
        y = wf_placeholder(g, "y", WF_I32, ys);
        if (mlp) {
            h = wf_relu(g, linear(g, x, "fc1", 784, 1024, 1));
            h = wf_relu(g, linear(g, h, "fc2", 1024, 1024, 3));
            h = linear(g, h, "fc3", 1024, 10, 5);
        } else {
            h = conv(g, x, "conv1", 1, 32, 1);
            h = conv(g, h, "conv2", 32, 64, 3);
            h = wf_reshape(g, h, WF_SHAPE(batch, 1600));
            h = linear(g, wf_relu(g, linear(g, h, "fc1", 1600, 128, 5)), "fc2", 128, 10, 7);
        }
        loss = wf_mean(g, wf_softmax_cross_entropy(g, h, y));
        train[0] = wf_minimize(g, mlp ? wf_adam(1e-3) : wf_momentum(0.01, 0.9, false), loss);
    }
    wf_session *s = NULL;
    if (!train[0] || wf_session_create(g, &(wf_session_opts){ .flags = flags }, &s) < 0) {
        fprintf(stderr, "train_bench: %s\n", wf_graph_errmsg(g));
        return 1;
    }
    int64_t nx = wf_shape_numel(xs), ny = wf_shape_numel(ys);
    float *xd = malloc((size_t)nx * sizeof *xd);
    int32_t *yd = malloc((size_t)ny * sizeof *yd), *xi = malloc((size_t)nx * sizeof *xi);
    uint64_t st = 42;
    for (int64_t i = 0; i < nx; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        xd[i] = (float)(st >> 40) / (float)(1 << 24);
        xi[i] = (int32_t)((st >> 40) % 65); /* gpt: random tokens of the 65 */
    }
    for (int64_t i = 0; i < ny; i++)
        yd[i] = gpt ? xi[(i + 1) % nx] : (int32_t)(i % 10);
    wf_tensor *tx = gpt ? wf_tensor_from(WF_I32, xs, xi) : wf_tensor_from(WF_F32, xs, xd),
              *ty = wf_tensor_from(WF_I32, ys, yd);
    wf_feed f[2] = { { x, tx }, { y, ty } };
    const char *dump = getenv("TB_DUMP"); /* TB_DUMP=FILE: the compiled step as text */
    FILE *df = dump ? fopen(dump, "w") : NULL;
    if (df) {
        if (wf_session_dump(s, &loss, 1, train, n_train, df, WF_DUMP_TEXT) < 0)
            fprintf(stderr, "train_bench: %s\n", wf_session_errmsg(s));
        fclose(df);
    }
    double *t = malloc((size_t)reps * sizeof *t), last = 0, cpu0 = 0;
    for (int i = -warmup; i < reps; i++) {
        wf_tensor *l;
        if (trace && i == 0 && wf_runtime_trace_write(rt, "/dev/null") < 0)
            return 1; /* the trace keeps the timed steps only */
        if (i == 0)
            cpu0 = cpu_s();
        double t0 = bench_now_s();
        if (wf_session_run(s, f, 2, &loss, 1, &l, train, n_train) < 0) {
            fprintf(stderr, "train_bench: %s\n", wf_session_errmsg(s));
            return 1;
        }
        if (i >= 0)
            t[i] = bench_now_s() - t0;
        last = wf_tensor_get(l, 0);
        wf_tensor_release(l);
    }
    if (trace && wf_runtime_trace_write(rt, trace) < 0)
        fprintf(stderr, "train_bench: %s\n", wf_last_errmsg());
    double cpu_step = (cpu_s() - cpu0) / reps;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    char offs[96] = "";
    if (off)
        snprintf(offs, sizeof offs, ", \"passes_off\": \"%s\"", off);
    printf("{\"bench\": \"%s\", \"impl\": \"weft\"%s, \"threads\": %d, \"median_s\": %.6g, "
           "\"reps\": %d, \"peak_rss_mb\": %.1f, \"final_loss\": %.5g, \"cpu_s\": %.6g}\n",
           name, offs, wf_runtime_worker_count(rt), bench_median(t, reps), reps,
           (double)ru.ru_maxrss / 1024.0, last, cpu_step);
    wf_tensor_release(tx);
    wf_tensor_release(ty);
    free(t);
    free(xd);
    free(xi);
    free(yd);
    wf_session_destroy(s);
    wf_graph_destroy(g);
    wf_runtime_destroy(rt);
    return 0;
}

/* Runs 'cmd' and returns its first JSON line (a "{"-line) in 'buf', or "" . */
static void run_line(const char *cmd, char *buf, size_t size)
{
    buf[0] = '\0';
    FILE *p = popen(cmd, "r");
    if (!p)
        return;
    char line[2048];
    while (fgets(line, sizeof line, p))
        if (line[0] == '{' && !buf[0])
            snprintf(buf, size, "%s", line);
    pclose(p);
    size_t n = strlen(buf);
    if (n && buf[n - 1] == '\n')
        buf[n - 1] = '\0';
}

static double field(const char *json, const char *key)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    const char *at = strstr(json, pat);
    return at ? strtod(at + strlen(pat), NULL) : NAN;
}

/* The flags of 'name': one pass, or several joined by '+' ("memplan+priority"); 0 with a
 * message for an unknown one. */
static uint32_t pass_flag(const char *name)
{
    char buf[128];
    uint32_t flags = 0;
    snprintf(buf, sizeof buf, "%s", name);
    for (char *save = NULL, *tok = strtok_r(buf, "+", &save); tok;
         tok = strtok_r(NULL, "+", &save)) {
        int k = 0;
        while (k < N_PASS_NAMES && strcmp(pass_names[k].name, tok) != 0)
            k++;
        if (k == N_PASS_NAMES) {
            fprintf(stderr, "train_bench: --passes-off: unknown pass '%s' (", tok);
            for (int j = 0; j < N_PASS_NAMES; j++)
                fprintf(stderr, "%s%s", j ? ", " : "", pass_names[j].name);
            fprintf(stderr, ")\n");
            return 0;
        }
        flags |= pass_names[k].flag;
    }
    return flags;
}

/* Adds each entry of the comma-separated 'list' to 'abl' (at most MAX_ABLATIONS, no
 * duplicates). Returns 0, or -1 with a message for an unknown pass. */
static int add_ablations(const char *list, char (*abl)[64], int *n)
{
    char buf[512];
    snprintf(buf, sizeof buf, "%s", list);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        if (strlen(tok) >= 64 || !pass_flag(tok))
            return -1;
        bool dup = false;
        for (int j = 0; j < *n; j++)
            dup = dup || strcmp(abl[j], tok) == 0;
        if (!dup && *n < MAX_ABLATIONS)
            snprintf(abl[(*n)++], 64, "%s", tok);
    }
    return 0;
}

int main(int argc, char **argv)
{
    int reps = 20, warmup = 5, threads = 0, n_abl = 0;
    bool json = false;
    const char *only = NULL, *python = "/usr/bin/python3", *child_case = NULL, *child_off = NULL;
    char abl[MAX_ABLATIONS][64];
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0)
            json = true;
        else if (strcmp(argv[i], "--ablate") == 0) {
            for (int k = 0; k < N_PASS_NAMES; k++)
                if (add_ablations(pass_names[k].name, abl, &n_abl) < 0)
                    return 2;
        } else if (i + 1 < argc && strcmp(argv[i], "--passes-off") == 0) {
            if (add_ablations(argv[++i], abl, &n_abl) < 0)
                return 2;
        } else if (i + 1 < argc && strcmp(argv[i], "--child-passes-off") == 0)
            child_off = argv[++i];
        else if (strcmp(argv[i], "--quick") == 0)
            reps = 2, warmup = 1;
        else if (i + 1 < argc && strcmp(argv[i], "--reps") == 0)
            reps = atoi(argv[++i]);
        else if (i + 1 < argc && strcmp(argv[i], "--warmup") == 0)
            warmup = atoi(argv[++i]);
        else if (i + 1 < argc && strcmp(argv[i], "--threads") == 0)
            threads = atoi(argv[++i]);
        else if (i + 1 < argc && strcmp(argv[i], "--only") == 0)
            only = argv[++i];
        else if (i + 1 < argc && strcmp(argv[i], "--python") == 0)
            python = argv[++i];
        else if (i + 1 < argc && strcmp(argv[i], "--child") == 0)
            child_case = argv[++i];
        else {
            fprintf(stderr, "usage: train_bench [--json] [--reps N] [--warmup N] [--only a,b] "
                            "[--threads N] [--python PATH] [--quick] "
                            "[--passes-off NAME[,NAME...]]... [--ablate]\n");
            return 2;
        }
    }
    if (reps < 1 || warmup < 0) {
        fprintf(stderr, "train_bench: --reps must be >= 1 and --warmup >= 0\n");
        return 2;
    }
    if (child_case)
        return child(child_case, warmup, reps, threads, child_off ? pass_flag(child_off) : 0,
                     child_off);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int th = threads > 0 ? threads : (int)cores;
    int iw = n_abl ? 20 : 8; /* the impl column: "weft -optim_fuse" needs room */
    if (!json)
        printf("%-15s %-*s %10s %12s %10s\n", "case", iw, "impl", "step ms", "peak RSS MB",
               "ratio");
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        if (only && !strstr(only, cases[c]))
            continue;
        char cmd[4096], w[2048], p[2048];
        /* inside popen, /proc/self/exe is the shell: name this program by its own path */
        char self[1024];
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        self[n > 0 ? n : 0] = '\0';
        snprintf(cmd, sizeof cmd, "'%s' --child %s --reps %d --warmup %d --threads %d", self,
                 cases[c], reps, warmup, threads);
        run_line(cmd, w, sizeof w);
        snprintf(cmd, sizeof cmd, "'%s' '%s/%s' %s %d %d %d 2>/dev/null", python, TB_SCRIPT_DIR,
                 TB_TORCH_SCRIPT, cases[c], warmup, reps, th);
        run_line(cmd, p, sizeof p);
        char ab[MAX_ABLATIONS][2048];
        for (int a = 0; a < n_abl; a++) { /* weft with one pass (or all) off */
            snprintf(cmd, sizeof cmd,
                     "'%s' --child %s --reps %d --warmup %d --threads %d --child-passes-off %s",
                     self, cases[c], reps, warmup, threads, abl[a]);
            run_line(cmd, ab[a], sizeof ab[a]);
        }
        if (json) {
            if (w[0])
                printf("%s\n", w);
            for (int a = 0; a < n_abl; a++)
                if (ab[a][0])
                    printf("%s\n", ab[a]);
            if (p[0] && !strstr(p, "\"skip\""))
                printf("%s\n", p);
            else
                printf("{\"bench\": \"%s\", \"impl\": \"pytorch\", \"skipped\": \"python3-torch "
                       "not found\"}\n",
                       cases[c]);
            continue;
        }
        double wm = field(w, "median_s"), pm = field(p, "median_s");
        printf("%-15s %-*s %10.2f %12.1f\n", cases[c], iw, "weft", 1e3 * wm,
               field(w, "peak_rss_mb"));
        for (int a = 0; a < n_abl; a++) { /* the ratio here: to weft with every pass on */
            char label[64];
            snprintf(label, sizeof label, "weft -%s", abl[a]);
            printf("%-15s %-*s %10.2f %12.1f %9.2fx (vs weft)\n", cases[c], iw, label,
                   1e3 * field(ab[a], "median_s"), field(ab[a], "peak_rss_mb"),
                   field(ab[a], "median_s") / wm);
        }
        if (isnan(pm))
            printf("%-15s %-*s   skipped (python3-torch not found)\n", cases[c], iw, "pytorch");
        else
            printf("%-15s %-*s %10.2f %12.1f %9.2fx\n", cases[c], iw, "pytorch", 1e3 * pm,
                   field(p, "peak_rss_mb"), wm / pm);
    }
    return 0;
}
