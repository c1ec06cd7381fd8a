/* perf/comm_bench.c: f32 all-reduce over 2 local ranks, weft against Open MPI, in one run.
 *   comm_bench [--json] [--reps N] [--max-bytes B] [--transport shm|tcp|both]
 * Sizes 4 KiB .. 64 MiB (x4 steps). For each transport, weft runs first (two forked ranks,
 * loopback rendezvous; shm: UCX's default transports; tcp: UCX_TLS tcp,self), then Open MPI
 * (this program again under 'mpirun -n 2 ... --mpi-peer': shm is btl vader, tcp is btl tcp,
 * both kept on loopback). Each size: 3 warm-up calls, then N timed calls, each after a
 * barrier; rank 0 reports the median. busbw_gbs = 2 (n-1)/n * bytes / median_s / 1e9 (the
 * NCCL convention). With --json, one JSON object per case and implementation:
 *   {"bench":"allreduce_4096","impl":"weft","transport":"shm","threads":2,"ranks":2,
 *    "bytes":4096,"median_s":...,"reps":N,"busbw_gbs":...}
 * The Open MPI peer is loaded with dlopen("libmpi.so.40") at run time, so the build needs no
 * MPI headers; without mpirun (or that library) it is skipped with a line saying so. */
#include "bench_util.h"

#include <weft/weft.h>

#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct cb_opts {
    bool json;
    int reps;
    long max_bytes;
    bool shm, tcp;
    uint32_t spin_us;    /* wf_comm_opts.spin_us (0: default) */
    const char *shm_tls; /* UCX transports of the "shm" runs (NULL: weft's default) */
    bool no_mpi;
} cb_opts;

static void report(const cb_opts *o, const char *impl, const char *transport, size_t bytes,
                   double median_s)
{
    double busbw = 2.0 * (2 - 1) / 2 * (double)bytes / median_s / 1e9;
    if (o->json)
        printf("{\"bench\":\"allreduce_%zu\",\"impl\":\"%s\",\"transport\":\"%s\",\"threads\":2,"
               "\"ranks\":2,\"bytes\":%zu,\"median_s\":%.9f,\"reps\":%d,\"busbw_gbs\":%.4f}\n",
               bytes, impl, transport, bytes, median_s, o->reps, busbw);
    else
        printf("%-8s %-4s %10zu B  %10.2f us  %8.3f GB/s\n", impl, transport, bytes, median_s * 1e6,
               busbw);
    fflush(stdout);
}

/* ---- weft: two forked ranks -------------------------------------------------------------- */

static int weft_rank(const cb_opts *o, int rank, const char *addr, const char *tls)
{
    wf_comm_opts co = { .rank = rank,
                        .size = 2,
                        .addr = addr,
                        .token = "comm_bench",
                        .tls = tls ? tls : o->shm_tls,
                        .spin_us = o->spin_us };
    wf_comm *c;
    int rc = wf_comm_create(NULL, &co, &c);
    if (rc < 0) {
        fprintf(stderr, "comm_bench: rank %d: %s\n", rank, wf_last_errmsg());
        return 1;
    }
    size_t maxn = (size_t)o->max_bytes / sizeof(float);
    float *x = calloc(maxn, sizeof *x);
    double *t = malloc((size_t)o->reps * sizeof *t);
    if (!x || !t)
        return 1;
    for (size_t bytes = 4096; bytes <= (size_t)o->max_bytes && rc == 0; bytes *= 4) {
        size_t n = bytes / sizeof(float);
        for (int i = 0; i < 3 && rc == 0; i++)
            rc = wf_comm_allreduce(c, x, x, n, WF_F32, WF_REDUCE_SUM);
        for (int r = 0; r < o->reps && rc == 0; r++) {
            rc = wf_comm_barrier(c);
            double t0 = bench_now_s();
            if (rc == 0)
                rc = wf_comm_allreduce(c, x, x, n, WF_F32, WF_REDUCE_SUM);
            t[r] = bench_now_s() - t0;
        }
        if (rc == 0 && rank == 0)
            report(o, "weft", tls ? "tcp" : "shm", bytes, bench_median(t, o->reps));
    }
    if (rc < 0)
        fprintf(stderr, "comm_bench: rank %d: %s\n", rank, wf_last_errmsg());
    free(x);
    free(t);
    wf_comm_destroy(c);
    return rc < 0;
}

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t len = sizeof a;
    int port = 29400;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

static int run_weft(const cb_opts *o, const char *tls)
{
    char addr[32];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", free_port());
    fflush(NULL);
    pid_t pids[2];
    for (int r = 0; r < 2; r++) {
        pids[r] = fork();
        if (pids[r] == 0)
            _exit(weft_rank(o, r, addr, tls));
    }
    int bad = 0;
    for (int r = 0; r < 2; r++) {
        int st;
        waitpid(pids[r], &st, 0);
        bad |= !WIFEXITED(st) || WEXITSTATUS(st) != 0;
    }
    return bad;
}

/* ---- Open MPI, loaded at run time -------------------------------------------------------- */

typedef int (*mpi_init_fn)(int *, char ***);
typedef int (*mpi_int_fn)(void *, int *);
typedef int (*mpi_comm_fn)(void *);
typedef int (*mpi_allreduce_fn)(const void *, void *, int, void *, void *, void *);
typedef int (*mpi_finalize_fn)(void);

static int mpi_peer(const cb_opts *o, const char *transport, int argc, char **argv)
{
    void *lib = dlopen("libmpi.so.40", RTLD_NOW | RTLD_GLOBAL);
    if (!lib) {
        fprintf(stderr, "comm_bench: --mpi-peer: %s\n", dlerror());
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
        fprintf(stderr, "comm_bench: --mpi-peer: libmpi.so.40 is not Open MPI\n");
        return 1;
    }
    init(&argc, &argv);
    int rank = 0;
    rank_of(world, &rank);
    size_t maxn = (size_t)o->max_bytes / sizeof(float);
    float *x = calloc(maxn, sizeof *x), *y = calloc(maxn, sizeof *y);
    double *t = malloc((size_t)o->reps * sizeof *t);
    for (size_t bytes = 4096; x && y && t && bytes <= (size_t)o->max_bytes; bytes *= 4) {
        int n = (int)(bytes / sizeof(float));
        for (int i = 0; i < 3; i++)
            allreduce(x, y, n, flt, sum, world);
        for (int r = 0; r < o->reps; r++) {
            barrier(world);
            double t0 = bench_now_s();
            allreduce(x, y, n, flt, sum, world);
            t[r] = bench_now_s() - t0;
        }
        if (rank == 0)
            report(o, "openmpi", transport, bytes, bench_median(t, o->reps));
    }
    free(x);
    free(y);
    free(t);
    finalize();
    return 0;
}

static void run_mpi(const cb_opts *o, const char *self, const char *transport)
{
    if (system("command -v mpirun >/dev/null 2>&1") != 0) {
        printf("openmpi: skipped (mpirun not found; Debian: openmpi-bin libopenmpi-dev)\n");
        return;
    }
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "mpirun --allow-run-as-root --oversubscribe -n 2 --mca btl %s "
             "--mca oob_tcp_if_include lo --mca btl_tcp_if_include lo %s --mpi-peer %s "
             "--reps %d --max-bytes %ld %s",
             strcmp(transport, "tcp") ? "self,vader" : "self,tcp", self, transport, o->reps,
             o->max_bytes, o->json ? "--json" : "");
    fflush(NULL);
    if (system(cmd) != 0)
        printf("openmpi: %s run failed (command: %s)\n", transport, cmd);
}

int main(int argc, char **argv)
{
    cb_opts o = { .reps = 20, .max_bytes = 64l << 20, .shm = true, .tcp = true };
    const char *peer = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) {
            o.json = true;
        } else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            if (bench_parse_int(argv[++i], 1, 100000, &o.reps) < 0)
                goto usage;
        } else if (!strcmp(argv[i], "--max-bytes") && i + 1 < argc) {
            o.max_bytes = strtol(argv[++i], NULL, 10);
            if (o.max_bytes < 4096 || o.max_bytes > (1l << 30))
                goto usage;
        } else if (!strcmp(argv[i], "--transport") && i + 1 < argc) {
            const char *t = argv[++i];
            o.shm = !strcmp(t, "shm") || !strcmp(t, "both");
            o.tcp = !strcmp(t, "tcp") || !strcmp(t, "both");
            if (!o.shm && !o.tcp)
                goto usage;
        } else if (!strcmp(argv[i], "--spin-us") && i + 1 < argc) {
            o.spin_us = (uint32_t)strtoul(argv[++i], NULL, 10);
        } else if (!strcmp(argv[i], "--shm-tls") && i + 1 < argc) {
            o.shm_tls = argv[++i];
        } else if (!strcmp(argv[i], "--no-mpi")) {
            o.no_mpi = true;
        } else if (!strcmp(argv[i], "--mpi-peer") && i + 1 < argc) {
            peer = argv[++i];
        } else {
            goto usage;
        }
    }
    if (peer)
        return mpi_peer(&o, peer, argc, argv);
    char self[4096];
    ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
    if (k <= 0)
        return 1;
    self[k] = 0;
    if (!o.json)
        printf("all-reduce f32 sum, 2 ranks, median of %d\n", o.reps);
    int bad = 0;
    for (int tr = 0; tr < 2; tr++) {
        if (!(tr ? o.tcp : o.shm))
            continue;
        bad |= run_weft(&o, tr ? "tcp,self" : NULL);
        if (!o.no_mpi)
            run_mpi(&o, self, tr ? "tcp" : "shm");
    }
    return bad;
usage:
    fprintf(stderr, "usage: comm_bench [--json] [--reps N] [--max-bytes B] "
                    "[--transport shm|tcp|both]\n");
    return 2;
}
