/* perf/ops/ops_bench.c: the op-level benchmark: sgemm through a weft graph against one bare
 * call of the system's threaded OpenBLAS (n = 512, 1024, 2048), the eager 1-element and
 * 1000-element add, and a static graph of 10^5 tiny chained nodes.
 * Owns: options, the cases and their checks, the order of runs, and the output (a table, or
 * with --json one object per line as docs/conventions.md, "Benchmarks", asks).
 * What each case times (only that is inside the clock):
 * - sgemm_N, weft: one wf_session_run() of a static graph [N,N] @ [N,N] (two f32
 *   placeholders, wf_matmul), feeding tensors made once outside the clock and fetching the
 *   product; releasing the output tensor is inside the clock too (it is part of a run's
 *   cost for a caller). weft tiles the product over its workers, each tile one call of its
 *   private serial OpenBLAS (ops/matmul_cpu.c).
 *   sgemm_N, openblas: one cblas_sgemm() of the system's threaded OpenBLAS on all its
 *   threads, into a C buffer allocated once. Both see the same inputs; the products are
 *   compared once after the warm-up. A repetition is one product; each round runs
 *   'calls' products per implementation (each timed on its own), the implementations take
 *   turns (the order alternates each round) with a --gap-ms sleep when switching, so that
 *   OpenBLAS's spinning threads have gone to sleep before weft runs and vice versa.
 * - eager_add_1 / eager_add_1000 (weft only): in a fresh WF_EAGER graph per repetition,
 *   'ops' calls of wf_add(g, a, b) on two f32 constants of 1 / 1000 elements: each call
 *   records its source location, adds a node (name, shape and dtype inference), allocates
 *   its output tensor and computes it at once. Every node stays in the graph (memory grows
 *   with 'ops'), so destroying the graph is timed apart (cleanup_ns_per_op), outside the
 *   clock. ns_per_op = the repetition's time / ops.
 * - graph_node (weft only): a static graph of 'nodes' chained f32 scalar adds (x_i =
 *   x_{i-1} + 1, a strict chain: no parallelism, so this is the per-node cost of dispatch
 *   along a dependency, the worst case), one session; the warm-up run compiles the plan
 *   (shown as first_run_s) and each timed repetition is one wf_session_run() fetching the
 *   last node. ns_per_op = the run's time / nodes.
 * Invariants: a wrong result (a product differing from OpenBLAS's, a sum that is not the
 *   expected value) fails the run: exit status 1. A missed goal is reported, not failed.
 * Not here: the kernels (ops/), clocks, medians and option parsing (../bench_util.h). */
#ifndef _GNU_SOURCE
#    define _GNU_SOURCE /* sched_getaffinity(), CPU_COUNT() */
#endif
#include "../bench_util.h"

#include <weft/weft.h>

#ifdef OB_HAVE_OPENBLAS
#    include <cblas.h>
#endif

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { IMPL_WEFT, IMPL_OPENBLAS, N_IMPLS };

static const char *const impl_names[N_IMPLS] = { "weft", "openblas" };

enum { K_SGEMM, K_EAGER, K_GRAPH };

typedef struct case_def {
    const char *name;
    int kind;
    int64_t size;   /* sgemm: n; eager: elements per operand; graph: nodes */
    int work;       /* sgemm: products per impl per round; eager: adds per repetition */
    int quick_work; /* 'work' with --quick (graph: nodes) */
    double goal;    /* sgemm: min weft / openblas in GFLOP/s; else max ns per op */
} case_def;

static const case_def cases[] = {
    { "sgemm_512", K_SGEMM, 512, 8, 1, 0.95 },
    { "sgemm_1024", K_SGEMM, 1024, 3, 1, 0.95 },
    { "sgemm_2048", K_SGEMM, 2048, 1, 1, 0.95 },
    { "eager_add_1", K_EAGER, 1, 100000, 10000, 160 },
    /* 10^4, not 10^5: each node keeps its 4 KB value until the graph is destroyed. */
    { "eager_add_1000", K_EAGER, 1000, 10000, 1000, 0 },
    { "graph_node", K_GRAPH, 100000, 0, 10000, 70 },
};
#define N_CASES     ((int)(sizeof(cases) / sizeof(cases[0])))
#define MAX_SAMPLES 4096

typedef struct options {
    int reps;
    int gap_ms;
    int json;
    int quick;
    unsigned only;
    unsigned impls;
} options;

/* The timings of one implementation in one case. */
typedef struct samples {
    int n;
    double t[MAX_SAMPLES];
    double extra; /* eager: median cleanup seconds; graph: the first (compiling) run */
    double median, min, max;
} samples;

typedef struct bench {
    options o;
    wf_runtime *rt;
    int weft_threads;
    int blas_threads; /* 0: no OpenBLAS peer */
    int last_impl;    /* the implementation that ran last (-1: none) */
    int failed;
} bench;

static samples sm[N_IMPLS];

static FILE *notes(const bench *b)
{
    return b->o.json ? stderr : stdout;
}

static void fail(bench *b, const char *cs, const char *impl, const char *what, const char *why)
{
    fprintf(stderr, "FAIL: %s %s: %s%s%s\n", cs, impl, what, why && *why ? ": " : "",
            why ? why : "");
    b->failed = 1;
}

static void summarize(samples *s)
{
    double t[MAX_SAMPLES];

    memcpy(t, s->t, (size_t)s->n * sizeof(double));
    s->median = bench_median(t, s->n);
    s->min = t[0];
    s->max = t[s->n - 1];
}

/* Sleeps --gap-ms before a run of 'impl' unless 'impl' ran last. */
static void gap(bench *b, int impl)
{
    if (b->last_impl >= 0 && b->last_impl != impl && b->o.gap_ms > 0)
        bench_sleep_s(b->o.gap_ms * 1e-3);
    b->last_impl = impl;
}

/* The case's work for this run (sgemm: products per round; eager: adds; graph: nodes). */
static int case_work(const bench *b, const case_def *c)
{
    if (c->kind == K_GRAPH)
        return b->o.quick ? c->quick_work : (int)c->size;
    return b->o.quick ? c->quick_work : c->work;
}

/* ---- sgemm ----------------------------------------------------------------------------- */

typedef struct sgemm_ctx {
    int64_t n;
    float *a, *b, *c; /* inputs, and OpenBLAS's product */
    wf_tensor *ta, *tb;
    wf_graph *g;
    wf_node *pa, *pb, *prod;
    wf_session *s;
} sgemm_ctx;

static void sgemm_free(sgemm_ctx *x)
{
    wf_session_destroy(x->s);
    wf_graph_destroy(x->g);
    wf_tensor_release(x->ta);
    wf_tensor_release(x->tb);
    free(x->a);
    free(x->b);
    free(x->c);
}

static int sgemm_setup(bench *b, const case_def *c, sgemm_ctx *x)
{
    int64_t n = c->size, nn = n * n;
    uint64_t r = 0x9e3779b97f4a7c15ull;

    *x = (sgemm_ctx){ .n = n };
    x->a = malloc((size_t)nn * sizeof(float));
    x->b = malloc((size_t)nn * sizeof(float));
    x->c = calloc((size_t)nn, sizeof(float));
    if (!x->a || !x->b || !x->c)
        return fail(b, c->name, "setup", "out of memory", NULL), -1;
    for (int64_t i = 0; i < 2 * nn; i++) { /* xorshift64: values in [-1, 1) */
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        (i < nn ? x->a : x->b)[i % nn] = (float)((double)(r >> 11) * 0x1p-52 - 1.0);
    }
    if (!(b->o.impls & (1u << IMPL_WEFT)))
        return 0;
    if (wf_tensor_create(WF_F32, WF_SHAPE(n, n), x->a, &x->ta) != 0 ||
        wf_tensor_create(WF_F32, WF_SHAPE(n, n), x->b, &x->tb) != 0)
        return fail(b, c->name, "weft", "wf_tensor_create", wf_last_errmsg()), -1;
    x->g = wf_graph_create(b->rt, WF_STATIC);
    if (x->g == NULL)
        return fail(b, c->name, "weft", "wf_graph_create", wf_last_errmsg()), -1;
    x->pa = wf_placeholder(x->g, "a", WF_F32, WF_SHAPE(n, n));
    x->pb = wf_placeholder(x->g, "b", WF_F32, WF_SHAPE(n, n));
    x->prod = wf_matmul(x->g, x->pa, x->pb);
    if (x->prod == NULL)
        return fail(b, c->name, "weft", "building the graph", wf_graph_errmsg(x->g)), -1;
    if (wf_session_create(x->g, NULL, &x->s) != 0)
        return fail(b, c->name, "weft", "wf_session_create", wf_graph_errmsg(x->g)), -1;
    return 0;
}

/* One product; '*keep' (may be NULL) receives weft's output instead of its release. */
static int sgemm_once(sgemm_ctx *x, int impl, wf_tensor **keep)
{
    if (impl == IMPL_WEFT) {
        wf_feed feeds[2] = { { x->pa, x->ta }, { x->pb, x->tb } };
        wf_tensor *out = NULL;

        if (wf_session_run(x->s, feeds, 2, &x->prod, 1, &out, NULL, 0) != 0)
            return -1;
        if (keep)
            *keep = out;
        else
            wf_tensor_release(out);
        return 0;
    }
#ifdef OB_HAVE_OPENBLAS
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)x->n, (int)x->n, (int)x->n, 1.0f,
                x->a, (int)x->n, x->b, (int)x->n, 0.0f, x->c, (int)x->n);
    return 0;
#else
    return -1;
#endif
}

/* Compares weft's product with OpenBLAS's (both ran once). Summation orders differ, so
 * the tolerance grows with K: each |term| <= 1, eps(f32) ~ 6e-8. */
static int sgemm_check(bench *b, const case_def *c, sgemm_ctx *x, const wf_tensor *w)
{
    const float *p = wf_tensor_data_f32(w);
    double worst = 0, tol = 1e-5 * (double)x->n;

    if (p == NULL)
        return fail(b, c->name, "weft", "the product is not a contiguous f32 tensor", NULL), -1;
    for (int64_t i = 0; i < x->n * x->n; i++) {
        double d = fabs((double)p[i] - (double)x->c[i]);

        if (!(d <= worst)) /* NaN counts as the worst */
            worst = isnan(d) ? INFINITY : d;
    }
    if (worst > tol) {
        char why[128];

        snprintf(why, sizeof(why), "max |weft - openblas| = %g, above %g", worst, tol);
        return fail(b, c->name, "weft", "wrong product", why), -1;
    }
    return 0;
}

static void run_sgemm(bench *b, const case_def *c)
{
    int calls = case_work(b, c);
    int part[N_IMPLS], np = 0;
    sgemm_ctx x;
    wf_tensor *w = NULL;

    if (b->o.impls & (1u << IMPL_WEFT))
        part[np++] = IMPL_WEFT;
    if (b->o.impls & (1u << IMPL_OPENBLAS)) {
        if (b->blas_threads > 0)
            part[np++] = IMPL_OPENBLAS;
        else
            fprintf(notes(b),
                    "# %s openblas: skipped: no threaded OpenBLAS was found when this "
                    "was configured (libopenblas-pthread-dev)\n",
                    c->name);
    }
    if (np == 0 || sgemm_setup(b, c, &x) != 0)
        goto out;
    for (int k = 0; k < np; k++) { /* warm-up: one product each; then the check */
        gap(b, part[k]);
        if (sgemm_once(&x, part[k], part[k] == IMPL_WEFT ? &w : NULL) != 0) {
            fail(b, c->name, impl_names[part[k]], "the warm-up run failed",
                 x.s ? wf_session_errmsg(x.s) : "");
            goto out;
        }
    }
    if (w != NULL && np == 2 && sgemm_check(b, c, &x, w) != 0)
        goto out;
    for (int r = 0; r < b->o.reps; r++)
        for (int k = 0; k < np; k++) {
            int impl = part[(k + r) % np];

            gap(b, impl);
            for (int i = 0; i < calls && sm[impl].n < MAX_SAMPLES; i++) {
                double t0 = bench_now_s(), t1;

                if (sgemm_once(&x, impl, NULL) != 0) {
                    fail(b, c->name, impl_names[impl], "a run failed",
                         x.s ? wf_session_errmsg(x.s) : "");
                    goto out;
                }
                t1 = bench_now_s();
                sm[impl].t[sm[impl].n++] = t1 - t0;
            }
        }
out:
    wf_tensor_release(w);
    if (np > 0)
        sgemm_free(&x);
}

/* ---- eager add ------------------------------------------------------------------------- */

/* One repetition: a fresh eager graph, 'ops' adds timed, the graph destroyed after the
 * clock ('*cleanup_s'). Returns the time of the adds, or -1. */
static double eager_once(bench *b, const case_def *c, wf_tensor *ta, wf_tensor *tb, int ops,
                         double *cleanup_s)
{
    wf_graph *g = wf_graph_create(b->rt, WF_EAGER);
    wf_node *a, *bb, *y = NULL;
    double t0, t1, t2, want = 3.0;

    if (g == NULL)
        return fail(b, c->name, "weft", "wf_graph_create", wf_last_errmsg()), -1;
    a = wf_constant(g, ta);
    bb = wf_constant(g, tb);
    if (a == NULL || bb == NULL) {
        fail(b, c->name, "weft", "wf_constant", wf_graph_errmsg(g));
        wf_graph_destroy(g);
        return -1;
    }
    t0 = bench_now_s();
    for (int i = 0; i < ops; i++)
        if ((y = wf_add(g, a, bb)) == NULL)
            break;
    t1 = bench_now_s();
    if (y == NULL || wf_tensor_get(wf_node_value(y), c->size - 1) != want) {
        fail(b, c->name, "weft", y ? "1 + 2 is not 3" : "wf_add failed", wf_graph_errmsg(g));
        t1 = t0 - 1;
    }
    wf_graph_destroy(g);
    t2 = bench_now_s();
    *cleanup_s = t2 - t1;
    return t1 - t0;
}

static void run_eager(bench *b, const case_def *c)
{
    int ops = case_work(b, c);
    float *ones = malloc((size_t)c->size * sizeof(float));
    float *twos = malloc((size_t)c->size * sizeof(float));
    wf_tensor *ta = NULL, *tb = NULL;
    double cleanup[MAX_SAMPLES], tc;

    if (!(b->o.impls & (1u << IMPL_WEFT)))
        goto out;
    if (ones == NULL || twos == NULL)
        goto out;
    for (int64_t i = 0; i < c->size; i++)
        ones[i] = 1.0f, twos[i] = 2.0f;
    if (wf_tensor_create(WF_F32, WF_SHAPE(c->size), ones, &ta) != 0 ||
        wf_tensor_create(WF_F32, WF_SHAPE(c->size), twos, &tb) != 0) {
        fail(b, c->name, "weft", "wf_tensor_create", wf_last_errmsg());
        goto out;
    }
    gap(b, IMPL_WEFT);
    for (int r = -1; r < b->o.reps; r++) { /* -1: the warm-up */
        double t = eager_once(b, c, ta, tb, ops, &tc);

        if (t < 0)
            goto out;
        if (r >= 0) {
            cleanup[sm[IMPL_WEFT].n] = tc;
            sm[IMPL_WEFT].t[sm[IMPL_WEFT].n++] = t;
        }
    }
    sm[IMPL_WEFT].extra = bench_median(cleanup, sm[IMPL_WEFT].n);
out:
    wf_tensor_release(ta);
    wf_tensor_release(tb);
    free(ones);
    free(twos);
}

/* ---- graph of tiny nodes --------------------------------------------------------------- */

static void run_graph(bench *b, const case_def *c)
{
    int nodes = case_work(b, c);
    wf_graph *g = NULL;
    wf_session *s = NULL;
    wf_node *x, *one;
    double t0, t1;

    if (!(b->o.impls & (1u << IMPL_WEFT)))
        return;
    g = wf_graph_create(b->rt, WF_STATIC);
    if (g == NULL) {
        fail(b, c->name, "weft", "wf_graph_create", wf_last_errmsg());
        return;
    }
    /* The chain starts at a fed placeholder: from constants alone, constant folding would
     * compute it once at compile time and the runs would measure nothing. */
    wf_node *x0 = wf_placeholder(g, "x0", WF_F32, WF_SCALAR);
    float zero = 0.0f;
    wf_tensor *feed = wf_tensor_from(WF_F32, WF_SCALAR, &zero);
    x = x0;
    one = wf_scalar(g, WF_F32, 1.0);
    for (int i = 0; i < nodes; i++)
        x = wf_add(g, x, one);
    if (x == NULL || wf_session_create(g, NULL, &s) != 0) {
        fail(b, c->name, "weft", "building the graph or its session", wf_graph_errmsg(g));
        goto out;
    }
    gap(b, IMPL_WEFT);
    for (int r = -1; r < b->o.reps; r++) { /* -1: the warm-up, which compiles the plan */
        wf_tensor *out = NULL;

        t0 = bench_now_s();
        wf_feed f = { x0, feed };
        if (wf_session_run(s, &f, 1, &x, 1, &out, NULL, 0) != 0) {
            fail(b, c->name, "weft", "wf_session_run", wf_session_errmsg(s));
            goto out;
        }
        t1 = bench_now_s();
        if (wf_tensor_get(out, 0) != (double)nodes) {
            char why[96];

            snprintf(why, sizeof(why), "the chain gave %g, not %d", wf_tensor_get(out, 0), nodes);
            fail(b, c->name, "weft", "wrong result", why);
            wf_tensor_release(out);
            goto out;
        }
        wf_tensor_release(out);
        if (r < 0)
            sm[IMPL_WEFT].extra = t1 - t0;
        else
            sm[IMPL_WEFT].t[sm[IMPL_WEFT].n++] = t1 - t0;
    }
out:
    wf_tensor_release(feed);
    wf_session_destroy(s);
    wf_graph_destroy(g);
}

/* ---- output ---------------------------------------------------------------------------- */

static void report(bench *b, const case_def *c)
{
    int ops = case_work(b, c);
    double gf[N_IMPLS] = { 0 };

    for (int i = 0; i < N_IMPLS; i++) {
        samples *s = &sm[i];
        int threads = i == IMPL_WEFT ? b->weft_threads : b->blas_threads;

        if (s->n == 0)
            continue;
        summarize(s);
        if (c->kind == K_SGEMM) {
            gf[i] = 2.0 * (double)c->size * (double)c->size * (double)c->size / s->median * 1e-9;
            if (b->o.json)
                printf("{\"bench\":\"%s\",\"impl\":\"%s\",\"threads\":%d,\"median_s\":%.6g,"
                       "\"min_s\":%.6g,\"max_s\":%.6g,\"reps\":%d,\"n\":%lld,\"gflops\":%.2f}\n",
                       c->name, impl_names[i], threads, s->median, s->min, s->max, s->n,
                       (long long)c->size, gf[i]);
            else
                printf("%-15s %-9s %7d %10.6f %10.6f %10.6f %5d %10.2f GFLOP/s\n", c->name,
                       impl_names[i], threads, s->median, s->min, s->max, s->n, gf[i]);
            continue;
        }
        double ns = s->median * 1e9 / ops;
        const char *xk = c->kind == K_EAGER ? "cleanup_ns_per_op" : "first_run_s";
        double xv = c->kind == K_EAGER ? s->extra * 1e9 / ops : s->extra;

        if (b->o.json) {
            printf("{\"bench\":\"%s\",\"impl\":\"weft\",\"threads\":%d,\"median_s\":%.6g,"
                   "\"min_s\":%.6g,\"max_s\":%.6g,\"reps\":%d,\"%s\":%d,\"ns_per_op\":%.1f,"
                   "\"%s\":%.6g",
                   c->name, threads, s->median, s->min, s->max, s->n,
                   c->kind == K_EAGER ? "ops" : "nodes", ops, ns, xk, xv);
            if (c->goal > 0)
                printf(",\"goal_ns_per_op\":%.0f,\"goal_met\":%s", c->goal,
                       ns <= c->goal ? "true" : "false");
            printf("}\n");
        } else {
            printf("%-15s %-9s %7d %10.6f %10.6f %10.6f %5d %10.1f ns/op", c->name, "weft", threads,
                   s->median, s->min, s->max, s->n, ns);
            if (c->goal > 0)
                printf(" (goal <= %.0f: %s)", c->goal, ns <= c->goal ? "met" : "MISSED");
            printf("; %s %.4g\n", c->kind == K_EAGER ? "graph destroy ns/op" : "first run s", xv);
        }
    }
    if (c->kind != K_SGEMM || gf[IMPL_WEFT] == 0 || gf[IMPL_OPENBLAS] == 0)
        return;
    double ratio = gf[IMPL_WEFT] / gf[IMPL_OPENBLAS];

    if (b->o.json)
        printf("{\"bench\":\"%s\",\"impl\":\"ratio\",\"threads\":%d,\"weft_over_openblas\":%.3f,"
               "\"goal\":%.2f,\"goal_met\":%s}\n",
               c->name, b->weft_threads, ratio, c->goal, ratio >= c->goal ? "true" : "false");
    else
        printf("%-15s weft / openblas (GFLOP/s): %.3f (goal >= %.2f: %s)\n", "", ratio, c->goal,
               ratio >= c->goal ? "met" : "MISSED");
}

/* ---- options and main ------------------------------------------------------------------ */

static void usage(FILE *f)
{
    fprintf(f, "usage: ops_bench [--reps N] [--only LIST] [--impl LIST] [--json] [--gap-ms N]\n"
               "                 [--quick]\n"
               "  --reps N      timed rounds per case, after one warm-up (default 7); sgemm "
               "runs\n"
               "                several products per round (8, 3, 1 for n = 512, 1024, 2048)\n"
               "  --only LIST   cases, comma-separated: sgemm_512,sgemm_1024,sgemm_2048,\n"
               "                eager_add_1,eager_add_1000,graph_node (default: all)\n"
               "  --impl LIST   implementations: weft,openblas (default: both)\n"
               "  --json        one JSON object per line instead of the table\n"
               "  --gap-ms N    sleep when switching implementation, so OpenBLAS's spinning\n"
               "                threads have gone to sleep (default 200)\n"
               "  --quick       one product per round, 10^4 eager adds / 10^3 of the 1000-"
               "element\n"
               "                add, 10^4 graph nodes: a smoke test\n"
               "Environment: WEFT_WORKERS, WEFT_TOPOLOGY, WEFT_NO_PIN apply to weft\n"
               "(wf_runtime_opts_from_env()); OPENBLAS_NUM_THREADS to the OpenBLAS peer.\n");
}

static int parse_options(int argc, char **argv, options *o)
{
    const char *names[N_CASES];

    for (int i = 0; i < N_CASES; i++)
        names[i] = cases[i].name;
    *o = (options){ .reps = 7, .gap_ms = 200, .only = ~0u, .impls = ~0u };
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;

        if (strcmp(a, "--reps") == 0)
            bad = bench_parse_int(v, 1, 256, &o->reps), i++;
        else if (strcmp(a, "--gap-ms") == 0)
            bad = bench_parse_int(v, 0, 60000, &o->gap_ms), i++;
        else if (strcmp(a, "--only") == 0)
            bad = bench_parse_list("ops_bench", v, names, N_CASES, &o->only), i++;
        else if (strcmp(a, "--impl") == 0)
            bad = bench_parse_list("ops_bench", v, impl_names, N_IMPLS, &o->impls), i++;
        else if (strcmp(a, "--json") == 0)
            o->json = 1;
        else if (strcmp(a, "--quick") == 0)
            o->quick = 1;
        else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            exit(0);
        } else
            bad = 1;
        if (bad) {
            fprintf(stderr, "ops_bench: unknown option, or a bad or missing value: '%s'\n", a);
            usage(stderr);
            return -1;
        }
    }
    return 0;
}

/* Says which OpenBLAS the peer is, and whether it uses every core this process may use. */
static void describe_openblas(bench *b)
{
#ifdef OB_HAVE_OPENBLAS
    static const char *const par[] = { "serial", "pthreads", "OpenMP" };
    int p = openblas_get_parallel(), cores = bench_default_threads();

    b->blas_threads = openblas_get_num_threads();
    fprintf(notes(b), "# openblas: %s, %s build, %d threads (%d cores usable)%s\n",
            openblas_get_config(), p >= 0 && p <= 2 ? par[p] : "unknown", b->blas_threads, cores,
            p == 0 || b->blas_threads < cores ? ": NOT all cores" : "");
#else
    (void)b;
    fprintf(notes(b), "# openblas: skipped: no threaded OpenBLAS was found when this was "
                      "configured (libopenblas-pthread-dev)\n");
#endif
}

int main(int argc, char **argv)
{
    bench b = { .last_impl = -1 };
    wf_runtime_opts ro = { 0 };

    setvbuf(stdout, NULL, _IOLBF, 0);
    if (parse_options(argc, argv, &b.o) != 0)
        return 2;
    if (wf_runtime_opts_from_env(&ro, NULL) != 0 || wf_runtime_create(&b.rt, &ro) != 0) {
        fprintf(stderr, "ops_bench: weft's runtime: %s\n", wf_last_errmsg());
        return 2;
    }
    b.weft_threads = wf_runtime_worker_count(b.rt);
    if (!b.o.json)
        printf("ops_bench: median of %d timed rounds after 1 warm-up, implementations "
               "interleaved with a %d ms gap\n",
               b.o.reps, b.o.gap_ms);
    fprintf(notes(&b),
            "# weft: %d workers; sgemm through its private serial OpenBLAS, tiled "
            "over the workers\n",
            b.weft_threads);
    if (b.o.impls & (1u << IMPL_OPENBLAS))
        describe_openblas(&b);
    if (!b.o.json)
        printf("%-15s %-9s %7s %10s %10s %10s %5s %10s\n", "bench", "impl", "threads", "median_s",
               "min_s", "max_s", "reps", "result");
    for (int i = 0; i < N_CASES; i++) {
        const case_def *c = &cases[i];

        if (!(b.o.only & (1u << i)))
            continue;
        memset(sm, 0, sizeof(sm));
        if (c->kind == K_SGEMM)
            run_sgemm(&b, c);
        else if (c->kind == K_EAGER)
            run_eager(&b, c);
        else
            run_graph(&b, c);
        report(&b, c);
    }
    wf_runtime_destroy(b.rt);
    if (b.failed)
        fprintf(stderr, "ops_bench: FAILED (see the FAIL lines above)\n");
    return b.failed ? 1 : 0;
}
