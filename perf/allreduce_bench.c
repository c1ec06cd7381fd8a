/* perf/allreduce_bench.c: f32 all-reduce over 2 local ranks, weft under weft-run against Open
 * MPI's MPI_Allreduce under mpirun, in one run, over shared memory and over TCP loopback.
 *   allreduce_bench [--json] [--quick] [--reps N] [--min-bytes B] [--max-bytes B]
 *                   [--transport shm|tcp|both] [--spin-us US] [--chunk-bytes B]
 *                   [--shm-tls TLS] [--no-mpi] [--no-bind] [--huge-pages] [--flight-compare]
 * Sizes 4 KiB .. 256 MiB (x4 steps; --quick: 4 KiB .. 1 MiB, 3 repetitions, a smoke test).
 * For each transport, weft runs first: this program again under 'weft-run -n 2' (the
 * launcher's rendezvous on loopback; shm: weft's default transports, which on one host are
 * UCX shared memory plus single-copy reads for the ring; tcp: UCX_TLS tcp,self, as between
 * hosts); rank 0 writes its lines to a file that this process then prints, so that they
 * carry no rank prefix. Then Open MPI: this program under 'mpirun -n 2 ... --mpi-peer' (shm:
 * btl self,vader; tcp: btl self,tcp; both kept on loopback). Each size: warm-up calls, then
 * N timed calls, each after a barrier; rank 0 reports the median and checks the result
 * (every element is 1 + 2 = 3). busbw_gbs = 2 (n-1)/n * bytes / median_s / 1e9 (NCCL's
 * convention). With --json, one JSON object per case and implementation:
 *   {"bench":"allreduce_4096","impl":"weft","transport":"shm","threads":2,"ranks":2,"pages":"4k",
 *    "bytes":4096,"median_s":...,"reps":N,"busbw_gbs":...}
 * The Open MPI peer is loaded with dlopen("libmpi.so.40") at run time, so the build needs no
 * MPI headers; without mpirun (or that library) it is skipped with a line saying so.
 * Default repetitions: 20 up to 1 MiB, 10 up to 16 MiB, 5 above (--reps sets all).
 * Binding: mpirun binds each of 2 ranks to a core of its own by default (--report-bindings:
 * rank 0 on core 0, rank 1 on core 1), so the weft ranks run under 'weft-run --bind-to
 * core', which binds them the same way (rank r to the r-th core it may use). Unbound on the loaded
 * 2-core machine, the two ranks of either library often shared a core, and a polling wait then kept
 * the partner off it for a time slice: 4 KiB medians of 33-233 us instead of 1.2 us (weft), and one
 * of 23 ms (Open MPI with --bind-to none). --no-bind leaves both unbound (mpirun --bind-to none).
 * --huge-pages: both libraries' buffers are 2 MiB-aligned and advised for transparent huge
 * pages (as weft's own arenas and gradient buckets are: memory/huge.h), the JSON's "pages"
 * says "2m" instead of "4k". Single-copy transfers pin every page they copy, so this changes
 * the large sizes on shared memory most.
 * --flight-compare: weft runs twice per transport, with its flight recorder ("weft", the
 * default) and without it ("weft-nofl", wf_comm_opts.flight_off), to measure the recorder's
 * cost; --no-flight runs only the latter.
 */
#include "bench_util.h"

#include <weft/weft.h>

#include <dlfcn.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#if defined(__SANITIZE_THREAD__)
#    define AB_TSAN 1
#elif defined(__has_feature)
#    if __has_feature(thread_sanitizer)
#        define AB_TSAN 1
#    endif
#endif
#ifndef AB_TSAN
#    define AB_TSAN 0
#endif

#ifndef WF_WEFT_RUN
#    define WF_WEFT_RUN "weft-run"
#endif

typedef struct ab_opts {
    bool json, quick, no_mpi, shm, tcp, no_bind, huge, no_flight, flight_compare;
    int reps; /* 0: by size */
    long min_bytes, max_bytes;
    uint32_t spin_us;    /* wf_comm_opts.spin_us (0: default) */
    long chunk_bytes;    /* wf_comm_opts.chunk_bytes (0: default) */
    const char *shm_tls; /* UCX transports of the "shm" runs (NULL: weft's default) */
} ab_opts;

static int reps_for(const ab_opts *o, size_t bytes)
{
    if (o->reps)
        return o->reps;
    if (o->quick)
        return 3;
    return bytes <= (1u << 20) ? 20 : bytes <= (16u << 20) ? 10 : 5;
}

static int warmup_for(size_t bytes)
{
    return bytes >= (16u << 20) ? 1 : 3;
}

/* The benchmark's buffers: with --huge-pages, 2 MiB-aligned and advised for huge pages. */
static void *ab_alloc(const ab_opts *o, size_t bytes)
{
    const size_t huge = (size_t)2 << 20;
    if (!o->huge)
        return malloc(bytes ? bytes : 1);
    size_t whole = (bytes + huge - 1) / huge * huge;
    void *p = aligned_alloc(huge, whole ? whole : huge);
    if (p && whole)
        (void)madvise(p, whole, MADV_HUGEPAGE);
    return p;
}

static void report(FILE *f, const ab_opts *o, const char *impl, const char *transport, size_t bytes,
                   double median_s, int reps)
{
    double busbw = 2.0 * (2 - 1) / 2 * (double)bytes / median_s / 1e9;
    if (o->json)
        fprintf(f,
                "{\"bench\":\"allreduce_%zu\",\"impl\":\"%s\",\"transport\":\"%s\",\"threads\":2,"
                "\"ranks\":2,\"pages\":\"%s\",\"bytes\":%zu,\"median_s\":%.9f,\"reps\":%d,"
                "\"busbw_gbs\":%.4f}\n",
                bytes, impl, transport, o->huge ? "2m" : "4k", bytes, median_s, reps, busbw);
    else
        fprintf(f, "%-8s %-4s %10zu B  %10.2f us  %8.3f GB/s\n", impl, transport, bytes,
                median_s * 1e6, busbw);
    fflush(f);
}

/* ---- weft: one rank under weft-run ---------------------------------------------------- */

static int weft_rank(const ab_opts *o, const char *transport, const char *out_path)
{
    wf_comm_opts co = { 0 };
    int rc = wf_dist_opts_from_env(&co);
    if (rc <= 0 || co.size != 2) {
        fprintf(stderr, "allreduce_bench: --rank needs weft-run -n 2 (%s)\n",
                rc < 0 ? wf_last_errmsg() : "no WEFT_RANK/WEFT_SIZE, or not 2 ranks");
        return 1;
    }
#if AB_TSAN
    /* As the transport tests do (tests/transport/transport_util.h): UCX's memory hooks crash
     * exiting threads under ThreadSanitizer (both ranks: signal 11 at exit, every run). */
    setenv("UCX_MEM_EVENTS", "no", 1);
#endif
    co.tls = strcmp(transport, "tcp") ? o->shm_tls : "tcp,self";
    co.spin_us = o->spin_us;
    co.flight_off = o->no_flight;
    co.chunk_bytes = (size_t)o->chunk_bytes;
    wf_comm *c;
    if ((rc = wf_comm_create(NULL, &co, &c)) < 0) {
        fprintf(stderr, "allreduce_bench: rank %d: %s\n", co.rank, wf_last_errmsg());
        return 1;
    }
    FILE *out = stdout;
    if (co.rank == 0 && out_path && !(out = fopen(out_path, "w"))) {
        perror(out_path);
        out = stdout;
    }
    size_t maxn = (size_t)o->max_bytes / sizeof(float);
    float *x = ab_alloc(o, maxn * sizeof *x), *y = ab_alloc(o, maxn * sizeof *y);
    double *t = malloc(100000 * sizeof *t);
    if (!x || !y || !t) {
        fprintf(stderr, "allreduce_bench: rank %d: out of memory\n", co.rank);
        return 1;
    }
    for (size_t i = 0; i < maxn; i++)
        x[i] = (float)(co.rank + 1);
    bool bad = false;
    for (size_t bytes = (size_t)o->min_bytes; bytes <= (size_t)o->max_bytes && rc == 0 && !bad;
         bytes *= 4) {
        size_t n = bytes / sizeof(float);
        int reps = reps_for(o, bytes);
        for (int i = 0; i < warmup_for(bytes) && rc == 0; i++)
            rc = wf_comm_allreduce(c, x, y, n, WF_F32, WF_REDUCE_SUM);
        for (int r = 0; r < reps && rc == 0; r++) {
            y[0] = y[n - 1] = 0;
            rc = wf_comm_barrier(c);
            double t0 = bench_now_s();
            if (rc == 0)
                rc = wf_comm_allreduce(c, x, y, n, WF_F32, WF_REDUCE_SUM);
            t[r] = bench_now_s() - t0;
            if (rc == 0 && (y[0] != 3.0f || y[n - 1] != 3.0f)) {
                fprintf(stderr, "allreduce_bench: rank %d: wrong sum at %zu bytes: %g, %g\n",
                        co.rank, bytes, y[0], y[n - 1]);
                bad = true;
                break;
            }
        }
        if (rc == 0 && !bad && co.rank == 0)
            report(out, o, o->no_flight ? "weft-nofl" : "weft", transport, bytes,
                   bench_median(t, reps), reps);
    }
    if (rc < 0)
        fprintf(stderr, "allreduce_bench: rank %d: %s\n", co.rank, wf_last_errmsg());
    if (out != stdout)
        fclose(out);
    free(x);
    free(y);
    free(t);
    wf_comm_destroy(c);
    return rc < 0 || bad;
}

static void common_args(const ab_opts *o, char *s, size_t n)
{
    snprintf(
        s, n,
        "%s%s%s%s%s--min-bytes %ld --max-bytes %ld --reps %d --spin-us %u --chunk-bytes %ld%s%s",
        o->json ? "--json " : "", o->quick ? "--quick " : "", o->no_bind ? "--no-bind " : "",
        o->no_flight ? "--no-flight " : "", o->huge ? "--huge-pages " : "", o->min_bytes,
        o->max_bytes, o->reps, o->spin_us, o->chunk_bytes, o->shm_tls ? " --shm-tls " : "",
        o->shm_tls ? o->shm_tls : "");
}

/* Runs the weft side of 'transport' under weft-run and prints rank 0's lines. */
static int run_weft(const ab_opts *o, const char *self, const char *transport)
{
    char out[] = "/tmp/allreduce_bench.XXXXXX";
    int fd = mkstemp(out);
    if (fd < 0) {
        perror("allreduce_bench: mkstemp");
        return 1;
    }
    close(fd);
    char args[512], cmd[8192];
    common_args(o, args, sizeof args);
    snprintf(cmd, sizeof cmd, "'%s' -n 2 --bind-to %s -- '%s' --rank %s --out %s %s", WF_WEFT_RUN,
             o->no_bind ? "none" : "core", self, transport, out, args);
    fflush(NULL);
    int st = system(cmd);
    FILE *f = fopen(out, "r");
    char line[1024];
    while (f && fgets(line, sizeof line, f))
        fputs(line, stdout);
    if (f)
        fclose(f);
    unlink(out);
    if (st != 0)
        printf("weft: %s run failed (command: %s)\n", transport, cmd);
    fflush(stdout);
    return st != 0;
}

/* ---- Open MPI, loaded at run time ----------------------------------------------------- */

typedef int (*mpi_init_fn)(int *, char ***);
typedef int (*mpi_int_fn)(void *, int *);
typedef int (*mpi_comm_fn)(void *);
typedef int (*mpi_allreduce_fn)(const void *, void *, int, void *, void *, void *);
typedef int (*mpi_finalize_fn)(void);

static int mpi_peer(const ab_opts *o, const char *transport, int argc, char **argv)
{
    void *lib = dlopen("libmpi.so.40", RTLD_NOW | RTLD_GLOBAL);
    if (!lib) {
        fprintf(stderr, "allreduce_bench: --mpi-peer: %s\n", dlerror());
        return 1;
    }
    mpi_init_fn init = (mpi_init_fn)dlsym(lib, "MPI_Init");
    mpi_int_fn rank_of = (mpi_int_fn)dlsym(lib, "MPI_Comm_rank");
    mpi_comm_fn barrier = (mpi_comm_fn)dlsym(lib, "MPI_Barrier");
    mpi_allreduce_fn allreduce = (mpi_allreduce_fn)dlsym(lib, "MPI_Allreduce");
    mpi_finalize_fn finalize = (mpi_finalize_fn)dlsym(lib, "MPI_Finalize");
    /* Open MPI's MPI_COMM_WORLD, MPI_FLOAT and MPI_SUM are the addresses of these objects. */
    void *world = dlsym(lib, "ompi_mpi_comm_world");
    void *flt = dlsym(lib, "ompi_mpi_float");
    void *sum = dlsym(lib, "ompi_mpi_op_sum");
    if (!init || !rank_of || !barrier || !allreduce || !finalize || !world || !flt || !sum) {
        fprintf(stderr, "allreduce_bench: --mpi-peer: libmpi.so.40 is not Open MPI\n");
        return 1;
    }
    init(&argc, &argv);
    int rank = 0;
    rank_of(world, &rank);
    size_t maxn = (size_t)o->max_bytes / sizeof(float);
    float *x = ab_alloc(o, maxn * sizeof *x), *y = ab_alloc(o, maxn * sizeof *y);
    if (y)
        memset(y, 0, maxn * sizeof *y);
    double *t = malloc(100000 * sizeof *t);
    for (size_t i = 0; x && i < maxn; i++)
        x[i] = (float)(rank + 1);
    for (size_t bytes = (size_t)o->min_bytes; x && y && t && bytes <= (size_t)o->max_bytes;
         bytes *= 4) {
        int n = (int)(bytes / sizeof(float)), reps = reps_for(o, bytes);
        for (int i = 0; i < warmup_for(bytes); i++)
            allreduce(x, y, n, flt, sum, world);
        for (int r = 0; r < reps; r++) {
            barrier(world);
            double t0 = bench_now_s();
            allreduce(x, y, n, flt, sum, world);
            t[r] = bench_now_s() - t0;
        }
        if (rank == 0)
            report(stdout, o, "openmpi", transport, bytes, bench_median(t, reps), reps);
    }
    free(x);
    free(y);
    free(t);
    finalize();
    return 0;
}

static void run_mpi(const ab_opts *o, const char *self, const char *transport)
{
    if (system("command -v mpirun >/dev/null 2>&1") != 0) {
        printf("openmpi: skipped (mpirun not found; Debian: openmpi-bin libopenmpi-dev)\n");
        return;
    }
    char args[512], cmd[8192];
    common_args(o, args, sizeof args);
    snprintf(cmd, sizeof cmd,
             "mpirun --allow-run-as-root --oversubscribe -n 2 %s--mca btl %s "
             "--mca oob_tcp_if_include lo --mca btl_tcp_if_include lo '%s' --mpi-peer %s %s",
             o->no_bind ? "--bind-to none " : "",
             strcmp(transport, "tcp") ? "self,vader" : "self,tcp", self, transport, args);
    fflush(NULL);
    if (system(cmd) != 0)
        printf("openmpi: %s run failed (command: %s)\n", transport, cmd);
}

static int parse_bytes(const char *s, long *out)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (*end || v < 4096 || v > (1l << 30) || (v & (v - 1)))
        return -1; /* a power of two from 4 KiB to 1 GiB */
    *out = v;
    return 0;
}

int main(int argc, char **argv)
{
    ab_opts o = { .min_bytes = 4096, .max_bytes = 256l << 20, .shm = true, .tcp = true };
    const char *peer = NULL, *rank_tr = NULL, *out = NULL;
    bool max_given = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) {
            o.json = true;
        } else if (!strcmp(argv[i], "--quick")) {
            o.quick = true;
        } else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            if (bench_parse_int(argv[++i], 0, 100000, &o.reps) < 0)
                goto usage;
        } else if (!strcmp(argv[i], "--min-bytes") && i + 1 < argc) {
            if (parse_bytes(argv[++i], &o.min_bytes) < 0)
                goto usage;
        } else if (!strcmp(argv[i], "--max-bytes") && i + 1 < argc) {
            if (parse_bytes(argv[++i], &o.max_bytes) < 0)
                goto usage;
            max_given = true;
        } else if (!strcmp(argv[i], "--transport") && i + 1 < argc) {
            const char *t = argv[++i];
            o.shm = !strcmp(t, "shm") || !strcmp(t, "both");
            o.tcp = !strcmp(t, "tcp") || !strcmp(t, "both");
            if (!o.shm && !o.tcp)
                goto usage;
        } else if (!strcmp(argv[i], "--spin-us") && i + 1 < argc) {
            o.spin_us = (uint32_t)strtoul(argv[++i], NULL, 10);
        } else if (!strcmp(argv[i], "--chunk-bytes") && i + 1 < argc) {
            o.chunk_bytes = strtol(argv[++i], NULL, 10);
            if (o.chunk_bytes < 0)
                goto usage;
        } else if (!strcmp(argv[i], "--shm-tls") && i + 1 < argc) {
            o.shm_tls = argv[++i];
        } else if (!strcmp(argv[i], "--no-mpi")) {
            o.no_mpi = true;
        } else if (!strcmp(argv[i], "--no-bind")) {
            o.no_bind = true;
        } else if (!strcmp(argv[i], "--no-flight")) {
            o.no_flight = true;
        } else if (!strcmp(argv[i], "--flight-compare")) {
            o.flight_compare = true;
        } else if (!strcmp(argv[i], "--huge-pages")) {
            o.huge = true;
        } else if (!strcmp(argv[i], "--mpi-peer") && i + 1 < argc) {
            peer = argv[++i];
        } else if (!strcmp(argv[i], "--rank") && i + 1 < argc) {
            rank_tr = argv[++i];
        } else if (!strcmp(argv[i], "--out") && i + 1 < argc) {
            out = argv[++i];
        } else {
            goto usage;
        }
    }
    if (o.quick && !max_given)
        o.max_bytes = 1l << 20;
    if (o.min_bytes > o.max_bytes)
        goto usage;
    if (peer)
        return mpi_peer(&o, peer, argc, argv);
    if (rank_tr)
        return weft_rank(&o, rank_tr, out);
    char self[4096];
    ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
    if (k <= 0)
        return 1;
    self[k] = 0;
    if (!o.json)
        printf("all-reduce f32 sum, 2 ranks, median per size\n");
    int bad = 0;
    for (int tr = 0; tr < 2; tr++) {
        if (!(tr ? o.tcp : o.shm))
            continue;
        bad |= run_weft(&o, self, tr ? "tcp" : "shm");
        if (o.flight_compare && !o.no_flight) {
            o.no_flight = true;
            bad |= run_weft(&o, self, tr ? "tcp" : "shm");
            o.no_flight = false;
        }
        if (!o.no_mpi)
            run_mpi(&o, self, tr ? "tcp" : "shm");
    }
    return bad;
usage:
    fprintf(stderr, "usage: allreduce_bench [--json] [--quick] [--reps N] [--min-bytes B] "
                    "[--max-bytes B] [--transport shm|tcp|both] [--spin-us US] [--chunk-bytes B] "
                    "[--shm-tls TLS] [--no-mpi] [--no-bind] [--huge-pages] [--no-flight] "
                    "[--flight-compare]\n"
                    "  (sizes: powers of two from 4096 to 2^30)\n");
    return 2;
}
