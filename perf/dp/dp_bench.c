/* perf/dp/dp_bench.c: data-parallel training of the MLP 784-1024-1024-10 (ReLU, Adam 1e-3,
 * global batch 256) with MultiWorkerMirrored (weft/distribute.h) against PyTorch DDP (gloo,
 * perf/dp/dp_bench_ddp.py) in the same run.
 * Cases, each in fresh processes (so each peak RSS is its own): weft 1 rank x 1 worker and
 *   x 2 workers (plain sessions), weft 2 ranks x 1 worker (the strategy, 2 shards), and
 *   PyTorch DDP with 2 processes x 1 thread (and 1 x 1 for reference).
 * Reported: the median step time (of rank 0; the ranks run in lockstep), the peak RSS (the
 *   largest rank's), the scaling efficiency T(1 rank, 1 worker) / (ranks * workers * T) and,
 *   for 2 ranks, the exposed communication per step: from the trace of rank 0, the time in
 *   the step's window (first task start to last task end) during which its worker ran no
 *   task, i.e. waited on the network (median over the timed steps).
 * Usage: dp_bench [--json] [--steps N] [--warmup W] [--python PATH] [--no-torch]
 *                 [--trace PREFIX] [--threads] [--same-cores] [--bucket-kib K]
 *   --trace keeps each rank's trace of the 2-rank case as PREFIX-rank<r>.json (Chrome trace),
 *   and the 1-rank cases' as PREFIX-1x<workers>.json;
 *   --threads prints, for every rank of every weft case, each thread's name, CPU time during
 *   the timed steps and the CPUs it may run on (/proc/self/task), on stderr;
 *   --same-cores does not tell the runtimes their local rank (wf_runtime_opts.local_rank and
 *   local_size), so every rank pins its workers from core 0, as before they existed;
 *   --bucket-kib K gives the 2-rank case's strategy buckets of K KiB (wf_strategy_opts.
 *   bucket_bytes; the default is the strategy's, 25 MiB after a 1 MiB first one), and
 *   PyTorch DDP's peer the same bucket_cap_mb, so both sides get the same buckets;
 *   --flight-compare R runs only the 2-rank case, 2R times, alternating the comm's flight
 *   recorder on and off (wf_comm_opts.flight_off; each order in turn), and prints the median
 *   of each mode's step medians and the recorder's share of the step ("flight_overhead_pct",
 *   on over off, minus 1): what the recorder costs a real data-parallel step.
 * Not here: the strategy (runtime/strategy.c, placement/replicate.c, transport/coll_ops.c). */
#ifndef _GNU_SOURCE
#    define _GNU_SOURCE
#endif
#include "../bench_util.h"

#include <weft/weft.h>

#include <dirent.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BATCH    256
#define IN       784
#define HID      1024
#define OUT      10
#define MAXSTEPS 256

typedef struct result {
    double median_s, rss_mb, exposed_s;
    int ok, rank;
} result;

static const char *trace_prefix; /* --trace */
static bool show_threads;        /* --threads */
static bool pin_local = true;    /* --same-cores clears it */
static size_t bucket_bytes;      /* --bucket-kib (0: the strategy's default) */

#define MAXT 64

typedef struct thr {
    int tid;
    double cpu_s;
} thr;

/* Each thread of this process: its id and CPU time (utime + stime, /proc/self/task/T/stat). */
static int threads_now(thr *t)
{
    DIR *d = opendir("/proc/self/task");
    int n = 0;
    long hz = sysconf(_SC_CLK_TCK);
    for (struct dirent *e; d && n < MAXT && (e = readdir(d));) {
        if (e->d_name[0] == '.')
            continue;
        char path[64], buf[512];
        snprintf(path, sizeof path, "/proc/self/task/%s/stat", e->d_name);
        FILE *fp = fopen(path, "r");
        if (!fp)
            continue;
        size_t len = fread(buf, 1, sizeof buf - 1, fp);
        fclose(fp);
        buf[len] = 0;
        const char *p = strrchr(buf, ')'); /* fields after the name: state is field 3 */
        unsigned long ut = 0, st = 0;
        if (!p ||
            sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
            continue;
        t[n].tid = atoi(e->d_name);
        t[n].cpu_s = (double)(ut + st) / (double)hz;
        n++;
    }
    if (d)
        closedir(d);
    return n;
}

/* Prints each thread's name, CPU time since 'before' and allowed CPUs, on stderr. */
static void print_threads(const char *cs, int rank, const thr *before, int nb, int steps)
{
    thr now[MAXT];
    int n = threads_now(now);
    for (int i = 0; i < n; i++) {
        double base = 0;
        for (int j = 0; j < nb; j++)
            if (before[j].tid == now[i].tid)
                base = before[j].cpu_s;
        char path[64], name[32] = "?", cpus[64] = "?", line[256];
        snprintf(path, sizeof path, "/proc/self/task/%d/comm", now[i].tid);
        FILE *fp = fopen(path, "r");
        if (fp && fgets(name, sizeof name, fp))
            name[strcspn(name, "\n")] = 0;
        if (fp)
            fclose(fp);
        snprintf(path, sizeof path, "/proc/self/task/%d/status", now[i].tid);
        if ((fp = fopen(path, "r"))) {
            while (fgets(line, sizeof line, fp))
                if (!strncmp(line, "Cpus_allowed_list:", 18))
                    snprintf(cpus, sizeof cpus, "%s", line + 18 + strspn(line + 18, " \t"));
            fclose(fp);
        }
        cpus[strcspn(cpus, "\n")] = 0;
        fprintf(stderr, "dp_bench: %s rank %d thread %-16s cpu %7.2f ms/step  cpus %s\n", cs, rank,
                name, 1e3 * (now[i].cpu_s - base) / steps, cpus);
    }
}

/* The idle time inside the window of run 'run' of a trace: its worker-task spans' window
 * minus their union (one worker). */
static double exposed_of(const char *buf, long run)
{
    enum { MAXS = 4096 };

    static double ts[MAXS], te[MAXS];
    int n = 0;
    for (const char *p = strstr(buf, "{\"name\":\""); p && n < MAXS;
         p = strstr(p + 1, "{\"name\":\"")) {
        const char *e = strstr(p, "}}");
        const char *cat = strstr(p, "\"cat\":\"task\""), *t = strstr(p, "\"ts\":");
        const char *d = strstr(p, "\"dur\":"), *r = strstr(p, "\"run\":");
        if (!e || !cat || !t || !d || !r || cat > e || t > e || d > e || r > e ||
            strtol(r + 6, NULL, 10) != run)
            continue;
        ts[n] = strtod(t + 5, NULL);
        te[n] = ts[n] + strtod(d + 6, NULL);
        n++;
    }
    if (n == 0)
        return NAN;
    /* sort by start (insertion: a step has ~100 tasks) and take the union */
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && ts[j] < ts[j - 1]; j--) {
            double a = ts[j], b = te[j];
            ts[j] = ts[j - 1];
            te[j] = te[j - 1];
            ts[j - 1] = a;
            te[j - 1] = b;
        }
    double lo = ts[0], hi = te[0], busy = 0, cs = ts[0], ce = te[0];
    for (int i = 1; i < n; i++) {
        if (te[i] > hi)
            hi = te[i];
        if (ts[i] > ce) {
            busy += ce - cs;
            cs = ts[i];
            ce = te[i];
        } else if (te[i] > ce) {
            ce = te[i];
        }
    }
    busy += ce - cs;
    return (hi - lo - busy) * 1e-6; /* the trace is in microseconds */
}

/* One rank of a case: trains 'warmup + steps' steps and fills 'r' (rank 0's times). */
static bool flight_off; /* --flight-compare: this case's comms without the recorder */

static int run_case(int rank, int size, int workers, int port, int steps, int warmup, result *r)
{
    wf_runtime *rt = NULL;
    wf_comm *c = NULL;
    wf_strategy *st = NULL;
    int rc = wf_runtime_create(
        &rt, &(wf_runtime_opts){ .n_workers = workers,
                                 .trace_events = size > 1 || trace_prefix ? 1u << 16 : 0,
                                 .local_rank = pin_local ? rank : 0,
                                 .local_size = pin_local ? size : 0 });
    char addr[32];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    if (rc == 0 && size > 1)
        rc = wf_comm_create(
            rt,
            &(wf_comm_opts){
                .rank = rank, .size = size, .addr = addr, .token = "dp", .flight_off = flight_off },
            &c);
    if (rc == 0 && size > 1)
        rc = wf_strategy_multiworker(c, &(wf_strategy_opts){ .bucket_bytes = bucket_bytes }, &st);
    if (rc < 0) {
        fprintf(stderr, "dp_bench: rank %d: %s\n", rank, wf_last_errmsg());
        return 1;
    }
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(-1, IN));
    wf_node *y = wf_placeholder(g, "y", WF_I32, WF_SHAPE(-1));
    wf_node *w1 = wf_variable(g, "w1", WF_F32, WF_SHAPE(IN, HID), wf_init_glorot_uniform(1));
    wf_node *b1 = wf_variable(g, "b1", WF_F32, WF_SHAPE(HID), wf_init_zeros());
    wf_node *w2 = wf_variable(g, "w2", WF_F32, WF_SHAPE(HID, HID), wf_init_glorot_uniform(2));
    wf_node *b2 = wf_variable(g, "b2", WF_F32, WF_SHAPE(HID), wf_init_zeros());
    wf_node *w3 = wf_variable(g, "w3", WF_F32, WF_SHAPE(HID, OUT), wf_init_glorot_uniform(3));
    wf_node *b3 = wf_variable(g, "b3", WF_F32, WF_SHAPE(OUT), wf_init_zeros());
    wf_node *h = wf_relu(g, wf_add(g, wf_matmul(g, x, w1), b1));
    h = wf_relu(g, wf_add(g, wf_matmul(g, h, w2), b2));
    wf_node *loss = wf_mean(g, wf_softmax_cross_entropy(g, wf_add(g, wf_matmul(g, h, w3), b3), y));
    wf_node *train = wf_minimize(g, wf_adam(1e-3), loss);
    wf_session *s = NULL;
    if (!train || wf_session_create(g, &(wf_session_opts){ .strategy = st }, &s) < 0) {
        fprintf(stderr, "dp_bench: rank %d: %s\n", rank, wf_graph_errmsg(g));
        return 1;
    }
    float *xs = malloc(sizeof(float) * BATCH * IN);
    int32_t *ys = malloc(sizeof(int32_t) * BATCH);
    uint64_t seed = 7;
    for (int i = 0; i < BATCH * IN; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        xs[i] = (float)((double)(seed >> 11) / 9007199254740992.0 * 2.0 - 1.0);
    }
    for (int i = 0; i < BATCH; i++)
        ys[i] = (i * 7) % OUT;
    wf_tensor *xt = wf_tensor_from(WF_F32, WF_SHAPE(BATCH, IN), xs);
    wf_tensor *yt = wf_tensor_from(WF_I32, WF_SHAPE(BATCH), ys);
    wf_feed f[] = { { x, xt }, { y, yt } };
    double t[MAXSTEPS];
    thr before[MAXT];
    int nb = 0;
    for (int i = 0; i < warmup + steps && rc == 0; i++) {
        wf_tensor *out = NULL;
        if (i == warmup)
            nb = threads_now(before);
        double t0 = bench_now_s();
        rc = wf_session_run(s, f, 2, &loss, 1, &out, &train, 1);
        if (i >= warmup)
            t[i - warmup] = bench_now_s() - t0;
        wf_tensor_release(out);
    }
    if (rc < 0) {
        fprintf(stderr, "dp_bench: rank %d: %s\n", rank, wf_session_errmsg(s));
        return 1;
    }
    if (show_threads) {
        char cs[32];
        snprintf(cs, sizeof cs, "%dx%d", size, workers);
        print_threads(cs, rank, before, nb, steps);
    }
    r->rss_mb = bench_peak_rss_mb();
    r->median_s = bench_median(t, steps);
    r->exposed_s = 0;
    char path[512];
    if (trace_prefix)
        snprintf(path, sizeof path, "%s-rank%d.json", trace_prefix, rank);
    else
        snprintf(path, sizeof path, "/tmp/dp_bench-%d.json", (int)getpid());
    if (size == 1 && trace_prefix)
        snprintf(path, sizeof path, "%s-1x%d.json", trace_prefix, workers);
    if ((size == 1 || rank > 0) && trace_prefix && wf_runtime_trace_write(rt, path) < 0)
        fprintf(stderr, "dp_bench: rank %d: %s\n", rank, wf_last_errmsg());
    if (size > 1 && rank == 0) {
        FILE *fp = NULL;
        char *buf = malloc(64 << 20);
        if (buf && wf_runtime_trace_write(rt, path) > 0 && (fp = fopen(path, "r"))) {
            size_t len = fread(buf, 1, (64 << 20) - 1, fp);
            buf[len] = 0;
            fclose(fp);
            double e[MAXSTEPS];
            int ne = 0;
            for (int i = 0; i < steps; i++) {
                double v = exposed_of(buf, warmup + i);
                if (!isnan(v))
                    e[ne++] = v;
            }
            r->exposed_s = ne ? bench_median(e, ne) : NAN;
        } else {
            r->exposed_s = NAN;
        }
        if (!trace_prefix)
            unlink(path);
        free(buf);
    }
    r->ok = 1;
    wf_tensor_release(xt);
    wf_tensor_release(yt);
    free(xs);
    free(ys);
    wf_session_destroy(s);
    wf_graph_destroy(g);
    wf_strategy_destroy(st);
    wf_comm_destroy(c);
    wf_runtime_destroy(rt);
    return 0;
}

typedef struct case_args {
    int size, workers, port, steps, warmup;
} case_args;

static int case_main(int rank, void *res, void *ctx)
{
    const case_args *a = ctx;
    result *r = res;
    r->rank = rank;
    return run_case(rank, a->size, a->workers, a->port, a->steps, a->warmup, r);
}

/* Runs a case on 'size' fresh processes; rank 0's times, the largest RSS. */
static result spawn_case(int size, int workers, int steps, int warmup)
{
    case_args a = { size, workers, bench_free_port(29517), steps, warmup };
    result rs[8] = { 0 };
    int bad = size > 8 ? size : bench_fork_ranks(size, case_main, &a, rs, sizeof rs[0]);
    result out = rs[0];
    double rss = 0;
    for (int r = 0; r < size && r < 8; r++)
        if (rs[r].ok && rs[r].rss_mb > rss)
            rss = rs[r].rss_mb;
    out.rss_mb = rss;
    out.ok = !bad && out.ok;
    return out;
}

/* PyTorch DDP with 'ranks' processes; ok 0 when it could not run. */
static result torch_case(const char *python, int ranks, int steps, int warmup)
{
    result r = { 0 };
    char cmd[1024];
    /* The script picks its port, retries a failed rendezvous and has its own deadlines;
     * timeout(1) is the last guard so that a stuck interpreter cannot hang the bench. */
    snprintf(cmd, sizeof cmd,
             "timeout -k 10 600 %s %s/dp_bench_ddp.py --ranks %d --steps %d --warmup %d "
             "--bucket-cap-mb %.6f",
             python, DB_SCRIPT_DIR, ranks, steps, warmup, (double)bucket_bytes / (1 << 20));
    double v[2];
    if (bench_peer_line(cmd, (const char *const[]){ "median_s", "peak_rss_mb" }, v, 2) < 0)
        return r;
    r.median_s = v[0];
    r.rss_mb = v[1];
    r.ok = 1;
    return r;
}

static void print(bool json, const char *impl, int ranks, int workers, const result *r, double t11,
                  bool weft)
{
    double eff = t11 / ((double)ranks * workers * r->median_s);
    if (json && weft)
        printf("{\"bench\": \"mlp_dp\", \"impl\": \"%s\", \"ranks\": %d, \"workers\": %d, "
               "\"median_s\": %.6f, \"peak_rss_mb\": %.1f, \"scaling_efficiency\": %.3f, "
               "\"exposed_comm_s\": %.6f}\n",
               impl, ranks, workers, r->median_s, r->rss_mb, eff, r->exposed_s);
    else if (json)
        printf("{\"bench\": \"mlp_dp\", \"impl\": \"%s\", \"ranks\": %d, \"workers\": %d, "
               "\"median_s\": %.6f, \"peak_rss_mb\": %.1f}\n",
               impl, ranks, workers, r->median_s, r->rss_mb);
    else
        printf("%-12s %d x %d   %8.2f ms   %6.1f MB   efficiency %.2f   exposed %.2f ms\n", impl,
               ranks, workers, 1e3 * r->median_s, r->rss_mb, weft ? eff : NAN, 1e3 * r->exposed_s);
    fflush(stdout);
}

/* --flight-compare: the 2-rank case with the recorder on and off, alternating. */
static int flight_compare(bool json, int rounds, int steps, int warmup)
{
    double t[2][64];
    for (int r = 0; r < rounds; r++)
        for (int k = 0; k < 2; k++) {
            int off = (r + k) % 2; /* on-off, then off-on: both see the same drift */
            flight_off = off;
            result w = spawn_case(2, 1, steps, warmup);
            if (!w.ok) {
                fprintf(stderr, "dp_bench: the 2-rank case failed (recorder %s)\n",
                        off ? "off" : "on");
                return 1;
            }
            t[off][r] = w.median_s;
        }
    double on = bench_median(t[0], rounds), off = bench_median(t[1], rounds);
    double pct = 100.0 * (on / off - 1.0);
    for (int k = 0; k < 2; k++) {
        double m = k ? off : on;
        if (json)
            printf("{\"bench\": \"mlp_dp_flight\", \"impl\": \"weft\", \"ranks\": 2, "
                   "\"workers\": 1, \"flight\": %s, \"median_s\": %.6f, \"rounds\": %d%s",
                   k ? "false" : "true", m, rounds, k ? "}\n" : "");
        else
            printf("weft 2 x 1, flight recorder %-3s %8.2f ms (median of %d runs)\n",
                   k ? "off" : "on", 1e3 * m, rounds);
        if (json && !k)
            printf(", \"flight_overhead_pct\": %.3f}\n", pct);
    }
    if (!json)
        printf("flight recorder: %+.2f%% of the step\n", pct);
    return 0;
}

int main(int argc, char **argv)
{
    bool json = false, torch = true;
    int steps = 20, warmup = 3;
    const char *python = "/usr/bin/python3";
    int flight_rounds = 0, kib = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json"))
            json = true;
        else if (!strcmp(argv[i], "--no-torch"))
            torch = false;
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc &&
                 bench_parse_int(argv[i + 1], 1, MAXSTEPS, &steps) == 0)
            i++;
        else if (!strcmp(argv[i], "--warmup") && i + 1 < argc &&
                 bench_parse_int(argv[i + 1], 0, 100, &warmup) == 0)
            i++;
        else if (!strcmp(argv[i], "--python") && i + 1 < argc)
            python = argv[++i];
        else if (!strcmp(argv[i], "--trace") && i + 1 < argc)
            trace_prefix = argv[++i];
        else if (!strcmp(argv[i], "--threads"))
            show_threads = true;
        else if (!strcmp(argv[i], "--same-cores"))
            pin_local = false;
        else if (!strcmp(argv[i], "--bucket-kib") && i + 1 < argc &&
                 bench_parse_int(argv[i + 1], 1, 1 << 20, &kib) == 0 && ++i)
            bucket_bytes = (size_t)kib << 10;
        else if (!strcmp(argv[i], "--flight-compare") && i + 1 < argc &&
                 bench_parse_int(argv[i + 1], 1, 64, &flight_rounds) == 0)
            i++;
        else {
            fprintf(stderr, "usage: dp_bench [--json] [--steps N] [--warmup W] [--python PATH] "
                            "[--no-torch] [--trace PREFIX] [--threads] [--same-cores] "
                            "[--flight-compare R] [--bucket-kib K]\n");
            return 2;
        }
    }
    if (flight_rounds)
        return flight_compare(json, flight_rounds, steps, warmup);
    result w11 = spawn_case(1, 1, steps, warmup);
    result w12 = spawn_case(1, 2, steps, warmup);
    result w21 = spawn_case(2, 1, steps, warmup);
    if (!w11.ok || !w12.ok || !w21.ok) {
        fprintf(stderr, "dp_bench: a weft case failed\n");
        return 1;
    }
    print(json, "weft", 1, 1, &w11, w11.median_s, true);
    print(json, "weft", 1, 2, &w12, w11.median_s, true);
    print(json, "weft", 2, 1, &w21, w11.median_s, true);
    if (!torch)
        return 0;
    result t2 = torch_case(python, 2, steps, warmup), t1 = torch_case(python, 1, steps, warmup);
    if (!t2.ok || !t1.ok) {
        if (json)
            printf("{\"bench\": \"mlp_dp\", \"impl\": \"pytorch_ddp\", \"skipped\": \"%s or "
                   "torch failed\"}\n",
                   python);
        else
            printf("pytorch_ddp  skipped (%s or torch failed)\n", python);
        return 0;
    }
    print(json, "pytorch_ddp", 2, 1, &t2, w11.median_s, false);
    print(json, "pytorch_ddp", 1, 1, &t1, w11.median_s, false);
    if (!json)
        printf("weft 2 x 1 step / PyTorch DDP 2 x 1 step: %.2f\n", w21.median_s / t2.median_s);
    return 0;
}
