/* sched_demo.c: weft's scheduler on a real dataflow graph, checked, counted and traced.
 *
 * The work: the edit distance between two DNA sequences (Wagner-Fischer), cut into tiles of
 * T x T cells. Each tile is one node of a wf_taskgraph and needs the tile above it and the
 * tile to its left, so the graph is a wavefront: it starts with one ready node, widens to
 * 'tiles' ready nodes on the diagonal, and narrows again. That shape makes workers steal.
 * Defaults: 512 x 512 tiles of 32 x 32 cells = 262,144 nodes, 523,264 edges, 268 M cells.
 *
 * The check: a plain serial DP (one rolling row, no tiles, no weft) computes the distance and
 * a hash of every tile's bottom row; each weft run must give exactly the same two numbers.
 * It also gives the serial time that the runs are compared with.
 *
 * Prints: progress, the time of each run against serial, per-worker counters (tasks, steals,
 * parks, idle time), and where the Perfetto trace went.
 *
 * Usage: sched_demo [--tiles N] [--tile T] [--reps R]
 * Env (read through wf_runtime_opts_from_env()): WEFT_WORKERS=N, WEFT_TOPOLOGY="pack:2 numa:2
 * core:2 pu:1", WEFT_NO_PIN=1, WEFT_TRACE=FILE (default here: sched_demo.trace.json in the
 * current folder). */
#define _XOPEN_SOURCE 700 /* realpath(), nanosleep(), sysconf() */

#include <weft/weft.h>

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_TILE  256
#define MAX_TILES 4096
#define MAX_REPS  100

/* One progress counter per worker, each on its own cache line, so that counting costs the
 * tasks no shared writes. */
typedef struct counter {
    _Alignas(64) atomic_uint_fast64_t done;
} counter;

typedef struct demo {
    int tiles;        /* tiles per side: the graph has tiles * tiles nodes */
    int t;            /* cells per tile side */
    int len;          /* length of both sequences: tiles * t */
    uint8_t *a, *b;   /* the sequences, one base (0..3) per byte */
    uint32_t *bottom; /* tile (i, j)'s last row of cells: t values at ((i * tiles + j) * t) */
    uint32_t *right;  /* tile (i, j)'s last column of cells, laid out the same way */
    wf_runtime *rt;   /* to find the current worker's counter */
    counter *done;    /* [workers + 1]: the last one for a caller that is not a worker */
    int n_counters;
} demo;

typedef struct tile {
    demo *d;
    int i, j; /* row and column of the tile */
} tile;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static size_t tile_at(const demo *d, int i, int j)
{
    return ((size_t)i * (size_t)d->tiles + (size_t)j) * (size_t)d->t;
}

/* The per-node computation: T x T cells of the DP table H, where H[r][0] = r, H[0][c] = c and
 * H[r][c] = min(H[r-1][c] + 1, H[r][c-1] + 1, H[r-1][c-1] + (a[r-1] != b[c-1])).
 * Tile (i, j) holds rows i*t+1 .. i*t+t and columns j*t+1 .. j*t+t. Its inputs are the bottom
 * row of tile (i-1, j), the right column of tile (i, j-1) and one corner cell, the last of
 * tile (i-1, j-1)'s bottom row; both predecessors having finished implies that one has. */
static int run_tile(void *arg)
{
    const tile *tl = arg;
    demo *d = tl->d;
    const int t = d->t, i = tl->i, j = tl->j;
    const uint32_t *top = i > 0 ? d->bottom + tile_at(d, i - 1, j) : NULL;
    const uint32_t *left = j > 0 ? d->right + tile_at(d, i, j - 1) : NULL;
    uint32_t *right = d->right + tile_at(d, i, j);
    const uint8_t *a = d->a + (size_t)i * (size_t)t; /* a runs down the rows */
    const uint8_t *b = d->b + (size_t)j * (size_t)t; /* b runs along the columns */
    uint32_t row[MAX_TILE + 1];

    if (i == 0)
        row[0] = (uint32_t)(j * t);
    else if (j == 0)
        row[0] = (uint32_t)(i * t);
    else
        row[0] = d->bottom[tile_at(d, i - 1, j - 1) + (size_t)t - 1];
    for (int c = 0; c < t; c++)
        row[c + 1] = top ? top[c] : (uint32_t)(j * t + c + 1);

    for (int r = 0; r < t; r++) {
        uint32_t diag = row[0];
        row[0] = left ? left[r] : (uint32_t)(i * t + r + 1);
        for (int c = 0; c < t; c++) {
            uint32_t up = row[c + 1];
            uint32_t best = diag + (a[r] != b[c]);
            if (up + 1 < best)
                best = up + 1;
            if (row[c] + 1 < best)
                best = row[c] + 1;
            diag = up;
            row[c + 1] = best;
        }
        right[r] = row[t];
    }
    memcpy(d->bottom + tile_at(d, i, j), row + 1, (size_t)t * sizeof row[0]);

    int w = wf_runtime_current_worker(d->rt);
    if (w < 0 || w >= d->n_counters - 1)
        w = d->n_counters - 1;
    atomic_fetch_add_explicit(&d->done[w].done, 1, memory_order_relaxed);
    return 0;
}

static uint64_t fnv1a(uint64_t h, uint32_t v)
{
    for (int k = 0; k < 4; k++) {
        h ^= (v >> (8 * k)) & 0xff;
        h *= 0x100000001b3ull;
    }
    return h;
}

#define FNV_SEED 0xcbf29ce484222325ull

/* The reference: the same recurrence, row by row, in one thread. Hashes row r at every tile
 * boundary (r = (i+1)*t) tile by tile, the order in which hash_tiles() walks the tiles. */
static uint32_t serial_distance(const demo *d, uint64_t *hash)
{
    const int len = d->len, t = d->t;
    uint32_t *row = malloc(((size_t)len + 1) * sizeof *row);
    if (!row)
        return UINT32_MAX;
    uint64_t h = FNV_SEED;
    for (int c = 0; c <= len; c++)
        row[c] = (uint32_t)c;
    for (int r = 1; r <= len; r++) {
        uint32_t diag = row[0];
        row[0] = (uint32_t)r;
        const uint8_t ar = d->a[r - 1];
        for (int c = 1; c <= len; c++) {
            uint32_t up = row[c];
            uint32_t best = diag + (ar != d->b[c - 1]);
            if (up + 1 < best)
                best = up + 1;
            if (row[c - 1] + 1 < best)
                best = row[c - 1] + 1;
            diag = up;
            row[c] = best;
        }
        if (r % t == 0)
            for (int c = 1; c <= len; c++)
                h = fnv1a(h, row[c]);
    }
    uint32_t dist = row[len];
    free(row);
    *hash = h;
    return dist;
}

static uint64_t hash_tiles(const demo *d)
{
    uint64_t h = FNV_SEED;
    for (int i = 0; i < d->tiles; i++)
        for (int j = 0; j < d->tiles; j++)
            for (int k = 0; k < d->t; k++)
                h = fnv1a(h, d->bottom[tile_at(d, i, j) + (size_t)k]);
    return h;
}

/* Two related sequences: 'b' is 'a' with about 6% substitutions, 3% deletions and 3%
 * insertions, as two reads of one genome would be. */
static void make_sequences(uint8_t *a, uint8_t *b, int len)
{
    uint64_t x = 0x9e3779b97f4a7c15ull; /* xorshift64: the same sequences on every run */
#define NEXT() (x ^= x << 13, x ^= x >> 7, x ^= x << 17, x)
    for (int k = 0; k < len; k++)
        a[k] = (uint8_t)(NEXT() & 3);
    int ka = 0;
    for (int kb = 0; kb < len;) {
        uint64_t roll = NEXT() % 100;
        if (ka >= len)
            b[kb++] = (uint8_t)(NEXT() & 3);
        else if (roll < 6)
            b[kb++] = (uint8_t)((a[ka++] + 1 + NEXT() % 3) & 3);
        else if (roll < 9)
            ka++;
        else if (roll < 12)
            b[kb++] = (uint8_t)(NEXT() & 3);
        else
            b[kb++] = a[ka++];
    }
#undef NEXT
}

static uint64_t tiles_done(const demo *d)
{
    uint64_t n = 0;
    for (int k = 0; k < d->n_counters; k++)
        n += atomic_load_explicit(&d->done[k].done, memory_order_relaxed);
    return n;
}

typedef struct progress {
    const demo *d;
    atomic_int stop;
    int rep, reps;
} progress;

/* Redraws one line on a terminal five times a second while a run goes on. */
static void *progress_main(void *arg)
{
    progress *p = arg;
    const double total = (double)p->d->tiles * (double)p->d->tiles;
    const struct timespec tick = { 0, 200 * 1000 * 1000 };
    while (!atomic_load(&p->stop)) {
        nanosleep(&tick, NULL);
        printf("\r  run %d/%d: %5.1f%% of %.0f tiles ", p->rep, p->reps,
               100.0 * (double)tiles_done(p->d) / total, total);
        fflush(stdout);
    }
    return NULL;
}

/* Wakes every worker before a timed run. A parked worker's sleep is added to its idle_ns when
 * it wakes, so without this the pause before a run (the check of the previous one) would be
 * charged to the run. One task per worker, each spinning until all have started (or 50 ms
 * have passed), so that no worker can run two of them. */
typedef struct wake {
    atomic_int arrived;
    int n;
    double deadline;
} wake;

static int wake_task(void *arg)
{
    wake *k = arg;
    atomic_fetch_add(&k->arrived, 1);
    while (atomic_load(&k->arrived) < k->n && now_s() < k->deadline)
        ;
    return 0;
}

static void wake_all(wf_runtime *rt, int workers)
{
    wake k = { .n = workers, .deadline = now_s() + 0.05 };
    atomic_init(&k.arrived, 0);
    wf_group g;
    if (wf_group_init(&g, rt) < 0)
        return;
    int rc = 0;
    for (int w = 0; w < workers && rc == 0; w++)
        rc = wf_spawn_named(&g, wake_task, &k, "wake");
    if (wf_group_wait(&g) < 0 || rc < 0)
        fprintf(stderr, "sched_demo: waking the workers: %s\n", wf_group_errmsg(&g));
    wf_group_deinit(&g);
}

static int parse_int(const char *flag, const char *s, int lo, int hi, int *out)
{
    char *end;
    long v = s ? strtol(s, &end, 10) : 0;
    if (!s || *s == '\0' || *end != '\0' || v < lo || v > hi) {
        fprintf(stderr, "sched_demo: %s wants an integer in [%d, %d], got '%s'\n", flag, lo, hi,
                s ? s : "");
        return -1;
    }
    *out = (int)v;
    return 0;
}

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/* Adds 'after - before' of every counter to 'acc', for each of 'n' workers: the counters of one
 * run, without the parks of the pauses between runs. */
static void add_delta(wf_worker_stats *acc, const wf_worker_stats *before,
                      const wf_worker_stats *after, int n)
{
    for (int w = 0; w < n; w++) {
#define D(f) acc[w].f += after[w].f - before[w].f
        D(tasks_run);
        D(spawned);
        D(steals_tried);
        D(steals_won);
        D(steals_won_local);
        D(steals_won_remote);
        D(inbox_taken);
        D(parks);
        D(idle_ns);
        D(actor_msgs);
#undef D
        acc[w].numa = after[w].numa;
        acc[w].cpu = after[w].cpu;
    }
}

static void print_stats(const wf_worker_stats *st, int n)
{
    printf("\nper-worker counters over the timed runs:\n");
    printf("%-7s %4s %4s %10s %11s %10s %10s %8s %7s %9s\n", "worker", "numa", "cpu", "tasks",
           "steal tries", "won local", "won remote", "inbox", "parks", "idle ms");
    wf_worker_stats sum = { 0 };
    for (int w = 0; w < n; w++) {
        const wf_worker_stats *s = &st[w];
        char name[24];
        snprintf(name, sizeof name, "weft-w%d", w);
        printf("%-7s %4d %4d %10llu %11llu %10llu %10llu %8llu %7llu %9.1f\n", name, s->numa,
               s->cpu, (unsigned long long)s->tasks_run, (unsigned long long)s->steals_tried,
               (unsigned long long)s->steals_won_local, (unsigned long long)s->steals_won_remote,
               (unsigned long long)s->inbox_taken, (unsigned long long)s->parks,
               (double)s->idle_ns * 1e-6);
        sum.tasks_run += s->tasks_run;
        sum.steals_tried += s->steals_tried;
        sum.steals_won_local += s->steals_won_local;
        sum.steals_won_remote += s->steals_won_remote;
        sum.inbox_taken += s->inbox_taken;
        sum.parks += s->parks;
        sum.idle_ns += s->idle_ns;
    }
    printf("%-7s %4s %4s %10llu %11llu %10llu %10llu %8llu %7llu %9.1f\n", "all", "", "",
           (unsigned long long)sum.tasks_run, (unsigned long long)sum.steals_tried,
           (unsigned long long)sum.steals_won_local, (unsigned long long)sum.steals_won_remote,
           (unsigned long long)sum.inbox_taken, (unsigned long long)sum.parks,
           (double)sum.idle_ns * 1e-6);
}

/* Builds the wavefront: node id i * tiles + j, edges from the tile above and the one left. */
static int build_graph(wf_taskgraph *g, demo *d, tile *nodes)
{
    for (int i = 0; i < d->tiles; i++) {
        for (int j = 0; j < d->tiles; j++) {
            tile *tl = &nodes[(size_t)i * (size_t)d->tiles + (size_t)j];
            *tl = (tile){ .d = d, .i = i, .j = j };
            int id = wf_taskgraph_add(g, run_tile, tl, "tile");
            if (id < 0)
                return id;
            int rc = 0;
            if (i > 0 && rc >= 0)
                rc = wf_taskgraph_precede(g, id - d->tiles, id);
            if (j > 0 && rc >= 0)
                rc = wf_taskgraph_precede(g, id - 1, id);
            if (rc < 0)
                return rc;
        }
    }
    return 0;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: sched_demo [--tiles N (1..%d, default 512)] [--tile T (1..%d, default 32)]"
            " [--reps R (1..%d, default 3)]\n"
            "env: WEFT_WORKERS=N WEFT_TOPOLOGY=\"pack:2 numa:2 core:2 pu:1\" WEFT_NO_PIN=1 "
            "WEFT_TRACE=FILE\n",
            MAX_TILES, MAX_TILE, MAX_REPS);
}

int main(int argc, char **argv)
{
    int tiles = 512, t = 32, reps = 3;
    for (int k = 1; k < argc; k++) {
        const char *v = k + 1 < argc ? argv[k + 1] : NULL;
        int bad;
        if (!strcmp(argv[k], "--tiles"))
            bad = parse_int("--tiles", v, 1, MAX_TILES, &tiles), k++;
        else if (!strcmp(argv[k], "--tile"))
            bad = parse_int("--tile", v, 1, MAX_TILE, &t), k++;
        else if (!strcmp(argv[k], "--reps"))
            bad = parse_int("--reps", v, 1, MAX_REPS, &reps), k++;
        else if (!strcmp(argv[k], "-h") || !strcmp(argv[k], "--help"))
            return usage(stdout), 0;
        else
            bad = -1, fprintf(stderr, "sched_demo: unknown argument '%s'\n", argv[k]);
        if (bad)
            return usage(stderr), 2;
    }

    /* The serial DP is O(len^2) and the tiles' edges take 8 bytes per cell of a tile's side. */
    const double bytes = (double)tiles * tiles * (8.0 * t + sizeof(tile));
    if ((long)tiles * t > 65536 || bytes > 4e9) {
        fprintf(stderr,
                "sched_demo: %d tiles of %d cells make sequences of %ld bases and %.1f GB of "
                "tile edges; the limits are 65536 bases and 4 GB\n",
                tiles, t, (long)tiles * t, bytes * 1e-9);
        return 2;
    }

    /* The runtime: options from the environment; tracing on even when WEFT_TRACE is unset. */
    wf_runtime_opts opts = { 0 };
    const char *trace_path = NULL;
    if (wf_runtime_opts_from_env(&opts, &trace_path) < 0) {
        fprintf(stderr, "sched_demo: %s\n", wf_last_errmsg());
        return 2;
    }
    if (!trace_path) {
        /* About half a million events in all: the last run of the default graph, ~50 MB of
         * JSON. Each worker keeps its own ring, so the budget is split between them. */
        long cores = opts.n_workers > 0 ? opts.n_workers : sysconf(_SC_NPROCESSORS_ONLN);
        if (cores < 1)
            cores = 1;
        opts.trace_events = (size_t)((1L << 19) / cores);
        if (opts.trace_events < (1u << 14))
            opts.trace_events = 1u << 14;
        trace_path = "sched_demo.trace.json";
    }
    wf_runtime *rt;
    if (wf_runtime_create(&rt, &opts) < 0) {
        fprintf(stderr, "sched_demo: wf_runtime_create: %s\n", wf_last_errmsg());
        return 1;
    }
    const int workers = wf_runtime_worker_count(rt);

    int status = 1;
    const size_t n_nodes = (size_t)tiles * (size_t)tiles;
    const size_t cells = n_nodes * (size_t)t;
    demo d = { .tiles = tiles, .t = t, .len = tiles * t, .rt = rt, .n_counters = workers + 1 };
    d.a = malloc((size_t)d.len);
    d.b = malloc((size_t)d.len);
    d.bottom = malloc(cells * sizeof *d.bottom);
    d.right = malloc(cells * sizeof *d.right);
    d.done = aligned_alloc(_Alignof(counter), (size_t)d.n_counters * sizeof *d.done);
    tile *nodes = malloc(n_nodes * sizeof *nodes);
    double *times = malloc((size_t)reps * sizeof *times);
    wf_worker_stats *st = calloc(3 * (size_t)workers, sizeof *st); /* sum, before, after */
    wf_taskgraph *g = NULL;
    if (!d.a || !d.b || !d.bottom || !d.right || !d.done || !nodes || !times || !st) {
        fprintf(stderr, "sched_demo: out of memory for %zu tiles of %d x %d\n", n_nodes, t, t);
        goto out;
    }
    for (int k = 0; k < d.n_counters; k++)
        atomic_init(&d.done[k].done, 0);
    make_sequences(d.a, d.b, d.len);

    printf("weft sched_demo: edit distance of two %d-base sequences, as a wavefront task graph\n"
           "  %d workers on %d NUMA node(s); %zu nodes (%d x %d tiles of %d x %d cells), "
           "%zu edges\n",
           d.len, workers, wf_runtime_numa_count(rt), n_nodes, tiles, tiles, t, t,
           2 * n_nodes - 2 * (size_t)tiles);

    /* The serial reference. */
    uint64_t want_hash;
    double t0 = now_s();
    uint32_t want = serial_distance(&d, &want_hash);
    const double serial_s = now_s() - t0;
    if (want == UINT32_MAX) {
        fprintf(stderr, "sched_demo: out of memory for the serial row\n");
        goto out;
    }
    printf("  serial DP (one thread, no weft): distance %u in %.3f s\n", want, serial_s);

    /* Build once, run 'reps' times. */
    t0 = now_s();
    int rc = wf_taskgraph_create(rt, &g);
    if (rc >= 0)
        rc = build_graph(g, &d, nodes);
    if (rc < 0) {
        fprintf(stderr, "sched_demo: building the graph: %s: %s\n", wf_strerror(rc),
                g ? wf_taskgraph_errmsg(g) : wf_last_errmsg());
        goto out;
    }
    printf("  graph built in %.1f ms\n", (now_s() - t0) * 1e3);

    const int tty = isatty(STDOUT_FILENO);
    for (int rep = 0; rep < reps; rep++) {
        for (int k = 0; k < d.n_counters; k++)
            atomic_store_explicit(&d.done[k].done, 0, memory_order_relaxed);
        /* Poison the tiles, so that a skipped tile cannot pass; writing both arrays here also
         * keeps first-touch page faults out of the timed run. */
        memset(d.bottom, 0xff, cells * sizeof *d.bottom);
        memset(d.right, 0xff, cells * sizeof *d.right);
        wake_all(rt, workers);
        progress p = { .d = &d, .rep = rep + 1, .reps = reps };
        atomic_init(&p.stop, 0);
        pthread_t th;
        int drawing = tty && pthread_create(&th, NULL, progress_main, &p) == 0;
        wf_worker_stats *before = st + workers, *after = st + 2 * workers;
        int have_stats = wf_runtime_stats(rt, before, workers) == workers;
        t0 = now_s();
        rc = wf_taskgraph_run(g);
        times[rep] = now_s() - t0;
        if (have_stats && wf_runtime_stats(rt, after, workers) == workers)
            add_delta(st, before, after, workers);
        if (drawing) {
            atomic_store(&p.stop, 1);
            pthread_join(th, NULL);
            printf("\r%60s\r", "");
        }
        if (rc < 0) {
            fprintf(stderr, "sched_demo: run %d: %s: %s\n", rep + 1, wf_strerror(rc),
                    wf_taskgraph_errmsg(g));
            goto out;
        }
        uint32_t got = d.bottom[tile_at(&d, tiles - 1, tiles - 1) + (size_t)t - 1];
        uint64_t got_hash = hash_tiles(&d);
        uint64_t ran = tiles_done(&d);
        int ok = got == want && got_hash == want_hash && ran == n_nodes;
        printf("  run %d/%d: %.3f s (%.2fx serial, %.0f ns per node), distance %u, checksum "
               "%016llx: %s\n",
               rep + 1, reps, times[rep], serial_s / times[rep], times[rep] * 1e9 / (double)n_nodes,
               got, (unsigned long long)got_hash, ok ? "matches serial" : "MISMATCH");
        if (!ok) {
            fprintf(stderr,
                    "sched_demo: run %d differs from the serial DP: distance %u (want %u), "
                    "checksum %016llx (want %016llx), %llu of %zu nodes ran\n",
                    rep + 1, got, want, (unsigned long long)got_hash, (unsigned long long)want_hash,
                    (unsigned long long)ran, n_nodes);
            goto out;
        }
    }
    print_stats(st, workers);

    qsort(times, (size_t)reps, sizeof *times, cmp_double);
    printf("\nelapsed: serial %.3f s; weft on %d workers: best %.3f s, median %.3f s "
           "(speedup %.2fx best, %.2fx median)\n",
           serial_s, workers, times[0], times[reps / 2], serial_s / times[0],
           serial_s / times[reps / 2]);
    printf("  (the serial DP keeps one row and no tiles: part of any speedup beyond %dx is the\n"
           "   tiles' cache locality, not parallelism)\n",
           workers);

    t0 = now_s();
    int events = wf_runtime_trace_write(rt, trace_path);
    if (events < 0) {
        fprintf(stderr, "sched_demo: writing the trace: %s\n", wf_last_errmsg());
        goto out;
    }
    char abs[PATH_MAX];
    const char *shown = realpath(trace_path, abs) ? abs : trace_path;
    printf("trace: %d events (the last of each worker's ring) in %s (%.0f ms)\n"
           "  open it at https://ui.perfetto.dev (\"Open trace file\") or in chrome://tracing;\n"
           "  one track per worker (weft-w0, ...): tasks, steals and parks.\n",
           events, shown, (now_s() - t0) * 1e3);
    status = 0;

out:
    wf_taskgraph_destroy(g);
    wf_runtime_destroy(rt);
    free(st);
    free(times);
    free(nodes);
    free(d.done);
    free(d.right);
    free(d.bottom);
    free(d.b);
    free(d.a);
    return status;
}
