/* tools/weft-run.c: the launcher: starts N local ranks of a program.
 *   weft-run -n N [--host ADDR] [--token T] [--bind-to core|none] [--] program [args...]
 * Each rank gets WEFT_RANK, WEFT_SIZE, WEFT_ADDR (rank 0's rendezvous "host:port": a free
 * loopback port unless --host names an address) and WEFT_TOKEN (random unless --token), which
 * wf_dist_opts_from_env() turns into wf_comm_opts. Every line a rank writes to stdout or
 * stderr is copied to ours with a "[rank] " prefix. SIGINT, SIGTERM, SIGHUP and SIGQUIT are
 * forwarded to every rank. When a rank dies (exits non-zero or by a signal) the others are
 * sent SIGTERM, then SIGKILL 2 s later, and weft-run exits with that rank's status (128 +
 * signal for a signal), naming it. All ranks exiting 0 makes weft-run exit 0.
 * --bind-to core (as mpirun's default for small jobs) binds rank r to the (r mod C)-th of the
 * C cores weft-run may use (the first hardware thread of each), so two ranks share a core
 * only when there are more ranks than cores; the rank inherits it from weft-run, which holds
 * that binding only while it forks the rank. --bind-to none (the default) leaves them free.
 * A rank never outlives weft-run: each is started through weft-run itself ("--exec-rank",
 * below), which asks the kernel for SIGKILL when its parent dies (PR_SET_PDEATHSIG, which
 * survives the exec of the program) and then checks that weft-run has not died already
 * (getppid(): it may have gone between the fork and the prctl). libuv's uv_spawn runs no
 * code of ours between fork and exec, hence the second exec. A SIGKILLed weft-run takes
 * its ranks along within milliseconds; a rank's own children (a shell's) are not its
 * direct children and are not covered by this, but by the control plane: every rank gets
 * WEFT_LAUNCHER_FD, the read end of a pipe whose write end only weft-run holds, and a comm
 * made with it (wf_dist_opts_from_env) fails on every rank once that pipe closes.
 * Owns: the child processes, their output pipes, the line buffers.
 * Built on libuv (processes, pipes, signals), like the control plane of transport/. */
#include "flight_verdict.h"

#include <uv.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAX_RANKS 4096

typedef struct out_pipe {
    uv_pipe_t pipe;
    struct rank *rk;
    FILE *to;
    char *line;
    size_t len, cap;
    bool open;
} out_pipe;

typedef struct rank {
    int index;
    uv_process_t proc;
    out_pipe out, err;
    bool running;
    uint64_t sent; /* bit s: weft-run sent it signal s */
} rank;

typedef struct launcher {
    uv_loop_t *loop;
    int n, alive;
    rank *ranks;
    uv_signal_t sigs[4];
    uv_timer_t kill_timer;
    int exit_code; /* the first failure's, or 0 */
    bool stopping;
    char rbuf[65536]; /* one loop thread: one read buffer serves every pipe */
} launcher;

/* Whether 'cpu' is the first hardware thread of its core (or its topology is unknown). */
static bool first_thread(int cpu)
{
    char path[96];
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/topology/thread_siblings_list", cpu);
    FILE *f = fopen(path, "r");
    int first = cpu;
    if (f) {
        if (fscanf(f, "%d", &first) != 1)
            first = cpu;
        fclose(f);
    }
    return first == cpu;
}

/* The cores weft-run may use, as the first hardware thread of each; returns their count
 * (0: the affinity could not be read). */
static int usable_cores(cpu_set_t *allowed, int *cores)
{
    if (sched_getaffinity(0, sizeof *allowed, allowed) != 0)
        return 0;
    int n = 0;
    for (int cpu = 0; cpu < CPU_SETSIZE; cpu++)
        if (CPU_ISSET(cpu, allowed) && first_thread(cpu))
            cores[n++] = cpu;
    return n;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: weft-run -n N [--host ADDR] [--token T] [--bind-to core|none] [--] program "
            "[args...]\n"
            "  starts N ranks of 'program' on this machine with WEFT_RANK, WEFT_SIZE,\n"
            "  WEFT_ADDR and WEFT_TOKEN set; output lines are prefixed with the rank.\n"
            "  --bind-to core binds rank r to the (r mod C)-th of the C usable cores\n"
            "  (as mpirun does); none (the default) leaves the ranks unbound.\n");
}

static void flush_line(out_pipe *o)
{
    fprintf(o->to, "[%d] %.*s\n", o->rk->index, (int)o->len, o->line);
    fflush(o->to);
    o->len = 0;
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    launcher *L = h->loop->data;
    *buf = uv_buf_init(L->rbuf, sizeof L->rbuf);
}

static void on_pipe_closed(uv_handle_t *h)
{
    out_pipe *o = h->data;
    free(o->line);
    o->line = NULL;
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
    out_pipe *o = s->data;
    if (n < 0) {
        if (o->len)
            flush_line(o);
        if (o->open) {
            o->open = false;
            uv_close((uv_handle_t *)s, on_pipe_closed);
        }
        return;
    }
    for (ssize_t i = 0; i < n; i++) {
        char ch = buf->base[i];
        if (ch == '\n') {
            flush_line(o);
            continue;
        }
        if (o->len == o->cap) {
            size_t cap = o->cap ? o->cap * 2 : 256;
            char *p = realloc(o->line, cap);
            if (!p) { /* out of memory: print what we have */
                flush_line(o);
                continue;
            }
            o->line = p;
            o->cap = cap;
        }
        o->line[o->len++] = ch;
    }
}

static void signal_all(launcher *L, int sig)
{
    /* Each rank leads its own process group (UV_PROCESS_DETACHED): signal the group, so
     * that what a rank started (a shell's children) goes too. */
    for (int i = 0; i < L->n; i++) {
        if (!L->ranks[i].running)
            continue;
        L->ranks[i].sent |= 1ull << (sig & 63);
        if (kill(-L->ranks[i].proc.pid, sig) != 0)
            uv_process_kill(&L->ranks[i].proc, sig);
    }
}

static void on_kill_timer(uv_timer_t *t)
{
    signal_all(t->loop->data, SIGKILL);
}

static void stop_others(launcher *L)
{
    if (L->stopping)
        return;
    L->stopping = true;
    signal_all(L, SIGTERM);
    uv_timer_start(&L->kill_timer, on_kill_timer, 2000, 0);
}

static void close_loop_handles(launcher *L)
{
    for (int i = 0; i < 4; i++)
        uv_close((uv_handle_t *)&L->sigs[i], NULL);
    /* A pipe a rank's own children still hold open must not keep us waiting. */
    for (int i = 0; i < L->n; i++) {
        out_pipe *ps[2] = { &L->ranks[i].out, &L->ranks[i].err };
        for (int p = 0; p < 2; p++)
            if (ps[p]->open) {
                if (ps[p]->len)
                    flush_line(ps[p]);
                ps[p]->open = false;
                uv_close((uv_handle_t *)&ps[p]->pipe, on_pipe_closed);
            }
    }
    uv_close((uv_handle_t *)&L->kill_timer, NULL);
}

static void on_exit_cb(uv_process_t *p, int64_t status, int sig)
{
    launcher *L = p->loop->data;
    rank *rk = p->data;
    rk->running = false;
    uv_close((uv_handle_t *)p, NULL);
    /* Every rank that fails is named, not only the first seen: when ranks die together
     * (a rank exits, the others see it die and fail too) the order in which their exits
     * reach us says little. The exit code is the first one's. */
    bool ours = sig != 0 && (rk->sent >> (sig & 63) & 1); /* a signal we sent */
    if ((status != 0 || sig != 0) && !ours) {
        if (sig)
            fprintf(stderr, "weft-run: rank %d (pid %d) was killed by signal %d (%s)%s\n",
                    rk->index, p->pid, sig, strsignal(sig),
                    L->stopping ? "" : "; stopping the others");
        else
            fprintf(stderr, "weft-run: rank %d (pid %d) exited with status %lld%s\n", rk->index,
                    p->pid, (long long)status, L->stopping ? "" : "; stopping the others");
        if (!L->exit_code)
            L->exit_code = sig ? 128 + sig : (int)(status & 0xff ? status & 0xff : 1);
        stop_others(L);
    }
    if (--L->alive == 0)
        close_loop_handles(L);
}

static void on_signal(uv_signal_t *s, int sig)
{
    launcher *L = s->loop->data;
    signal_all(L, sig);
    if (!L->exit_code)
        L->exit_code = 128 + sig;
}

/* A loopback port that the kernel just handed out (and we let go again). */
static int free_port(const char *host)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in a = { .sin_family = AF_INET };
    if (inet_pton(AF_INET, host, &a.sin_addr) != 1)
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    int port = -1;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

static void random_token(char *out, size_t n)
{
    unsigned char b[16] = { 0 };
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0 || read(fd, b, sizeof b) != (ssize_t)sizeof b) {
        unsigned long x = (unsigned long)getpid() * 2654435761ul ^ (unsigned long)uv_hrtime();
        memcpy(b, &x, sizeof x);
    }
    if (fd >= 0)
        close(fd);
    for (size_t i = 0; i < sizeof b && 2 * i + 2 < n; i++)
        snprintf(out + 2 * i, 3, "%02x", b[i]);
}

/* "weft-run --exec-rank PPID program args...": the rank side of the start (see the top):
 * dies with weft-run (pid PPID), then becomes the program. */
static int exec_rank(int argc, char **argv)
{
    if (argc < 4)
        return 2;
    long ppid = strtol(argv[2], NULL, 10);
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) {
        fprintf(stderr, "weft-run: prctl(PR_SET_PDEATHSIG): %s\n", strerror(errno));
        return 127;
    }
    if ((long)getppid() != ppid)
        return 128 + SIGKILL; /* weft-run died before the prctl: go as if killed with it */
    execvp(argv[3], argv + 3);
    fprintf(stderr, "weft-run: cannot start '%s': %s\n", argv[3], strerror(errno));
    return 127;
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "--exec-rank"))
        return exec_rank(argc, argv);
    int n = 0, i = 1;
    const char *host = NULL, *token = NULL;
    bool bind = false;
    for (; i < argc; i++) {
        if (!strcmp(argv[i], "--")) {
            i++;
            break;
        } else if (!strcmp(argv[i], "-n") && i + 1 < argc) {
            char *end;
            long v = strtol(argv[++i], &end, 10);
            if (*end || v < 1 || v > MAX_RANKS) {
                fprintf(stderr, "weft-run: -n %s: expected 1..%d ranks\n", argv[i], MAX_RANKS);
                return 2;
            }
            n = (int)v;
        } else if (!strcmp(argv[i], "--host") && i + 1 < argc) {
            host = argv[++i];
        } else if (!strcmp(argv[i], "--token") && i + 1 < argc) {
            token = argv[++i];
        } else if (!strcmp(argv[i], "--bind-to") && i + 1 < argc) {
            const char *b = argv[++i];
            if (strcmp(b, "core") && strcmp(b, "none")) {
                fprintf(stderr, "weft-run: --bind-to %s: expected 'core' or 'none'\n", b);
                return 2;
            }
            bind = !strcmp(b, "core");
        } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage();
            return 0;
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "weft-run: unknown option '%s'\n", argv[i]);
            usage();
            return 2;
        } else {
            break;
        }
    }
    if (n < 1 || i >= argc) {
        usage();
        return 2;
    }
    char addr[300], tok[40] = "";
    if (host && strchr(host, ':')) {
        snprintf(addr, sizeof addr, "%s", host);
    } else {
        const char *h = host ? host : "127.0.0.1";
        int port = free_port(h);
        if (port < 0) {
            fprintf(stderr, "weft-run: no free port on %s: %s\n", h, strerror(errno));
            return 1;
        }
        snprintf(addr, sizeof addr, "%s:%d", h, port);
    }
    if (!token)
        random_token(tok, sizeof tok);

    launcher *L = calloc(1, sizeof *L); /* after the arguments: no leak on a bad one */
    if (!L) {
        fprintf(stderr, "weft-run: out of memory\n");
        return 1;
    }
    L->loop = uv_default_loop();
    L->loop->data = L;
    L->n = n;
    L->ranks = calloc((size_t)n, sizeof *L->ranks);
    if (!L->ranks) {
        fprintf(stderr, "weft-run: out of memory\n");
        return 1;
    }
    uv_timer_init(L->loop, &L->kill_timer);
    static const int fwd[4] = { SIGINT, SIGTERM, SIGHUP, SIGQUIT };
    for (int s = 0; s < 4; s++) {
        uv_signal_init(L->loop, &L->sigs[s]);
        uv_signal_start(&L->sigs[s], on_signal, fwd[s]);
    }

    /* The flight records of this job go to a directory of its own (WEFT_FLIGHT_DIR). */
    fv_job flight;
    fv_job_begin(&flight);
    /* The environment of every rank: ours plus the four WEFT_ variables. */
    extern char **environ;
    size_t nenv = 0;
    while (environ[nenv])
        nenv++;
    char **env = calloc(nenv + 6, sizeof *env);
    char e_rank[32], e_size[32], e_addr[320], e_tok[300], e_lfd[48];
    if (!env) {
        fprintf(stderr, "weft-run: out of memory\n");
        return 1;
    }
    size_t k = 0;
    for (size_t j = 0; j < nenv; j++)
        if (strncmp(environ[j], "WEFT_RANK=", 10) && strncmp(environ[j], "WEFT_SIZE=", 10) &&
            strncmp(environ[j], "WEFT_ADDR=", 10) && strncmp(environ[j], "WEFT_TOKEN=", 11) &&
            strncmp(environ[j], "WEFT_LAUNCHER_FD=", 17))
            env[k++] = environ[j];
    /* The liveness pipe (see the top): the ranks inherit the read end, the write end is
     * close-on-exec and stays ours until we die. */
    int lp[2];
    if (pipe(lp) != 0 || fcntl(lp[1], F_SETFD, FD_CLOEXEC) != 0) {
        fprintf(stderr, "weft-run: pipe: %s\n", strerror(errno));
        return 1;
    }
    snprintf(e_lfd, sizeof e_lfd, "WEFT_LAUNCHER_FD=%d", lp[0]);
    env[k++] = e_lfd;
    env[k++] = e_rank;
    env[k++] = e_size;
    env[k++] = e_addr;
    env[k++] = e_tok;
    env[k] = NULL;
    snprintf(e_size, sizeof e_size, "WEFT_SIZE=%d", n);
    snprintf(e_addr, sizeof e_addr, "WEFT_ADDR=%s", addr);
    snprintf(e_tok, sizeof e_tok, "WEFT_TOKEN=%s", token ? token : tok);

    /* --bind-to core: each fork inherits the binding weft-run holds while it forks. */
    cpu_set_t allowed;
    int *cores = bind ? malloc(CPU_SETSIZE * sizeof *cores) : NULL, n_cores = 0;
    if (bind && (!cores || (n_cores = usable_cores(&allowed, cores)) == 0)) {
        fprintf(stderr, "weft-run: --bind-to core: %s\n",
                cores ? "cannot read this process's CPU affinity" : "out of memory");
        free(cores);
        return 1;
    }

    /* Every rank starts as "weft-run --exec-rank <our pid> program args..." (see the top). */
    char self[4096], me[32];
    ssize_t sn = readlink("/proc/self/exe", self, sizeof self - 1);
    char **rargv = calloc((size_t)(argc - i + 4), sizeof *rargv);
    if (sn <= 0 || !rargv) {
        fprintf(stderr, "weft-run: %s\n", rargv ? "cannot read /proc/self/exe" : "out of memory");
        return 1;
    }
    self[sn] = 0;
    snprintf(me, sizeof me, "%ld", (long)getpid());
    rargv[0] = self;
    rargv[1] = "--exec-rank";
    rargv[2] = me;
    for (int a = i; a < argc; a++)
        rargv[3 + a - i] = argv[a];

    for (int r = 0; r < n; r++) {
        rank *rk = &L->ranks[r];
        rk->index = r;
        snprintf(e_rank, sizeof e_rank, "WEFT_RANK=%d", r);
        out_pipe *pipes[2] = { &rk->out, &rk->err };
        uv_stdio_container_t stdio[3];
        stdio[0].flags = UV_INHERIT_FD;
        stdio[0].data.fd = 0;
        for (int p = 0; p < 2; p++) {
            pipes[p]->rk = rk;
            pipes[p]->to = p ? stderr : stdout;
            uv_pipe_init(L->loop, &pipes[p]->pipe, 0);
            pipes[p]->pipe.data = pipes[p];
            pipes[p]->open = true;
            stdio[p + 1].flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
            stdio[p + 1].data.stream = (uv_stream_t *)&pipes[p]->pipe;
        }
        uv_process_options_t po = {
            .exit_cb = on_exit_cb,
            .file = self,
            .args = rargv,
            .env = env,
            .stdio_count = 3,
            .stdio = stdio,
            .flags = UV_PROCESS_DETACHED,
        };
        rk->proc.data = rk;
        if (n_cores) {
            cpu_set_t one;
            CPU_ZERO(&one);
            CPU_SET(cores[r % n_cores], &one);
            if (sched_setaffinity(0, sizeof one, &one) != 0)
                fprintf(stderr, "weft-run: rank %d: binding to cpu %d: %s\n", r, cores[r % n_cores],
                        strerror(errno));
        }
        int rc = uv_spawn(L->loop, &rk->proc, &po);
        if (n_cores)
            sched_setaffinity(0, sizeof allowed, &allowed);
        if (rc != 0) {
            fprintf(stderr, "weft-run: cannot start rank %d ('%s'): %s\n", r, argv[i],
                    uv_strerror(rc));
            for (int p = 0; p < 2; p++) {
                pipes[p]->open = false;
                uv_close((uv_handle_t *)&pipes[p]->pipe, on_pipe_closed);
            }
            uv_close((uv_handle_t *)&rk->proc, NULL);
            L->exit_code = 127;
            stop_others(L);
            break;
        }
        rk->running = true;
        L->alive++;
        for (int p = 0; p < 2; p++)
            uv_read_start((uv_stream_t *)&pipes[p]->pipe, on_alloc, on_read);
    }
    free(cores);
    free(rargv);
    close(lp[0]); /* the ranks hold it now */
    if (L->alive == 0)
        close_loop_handles(L);
    uv_run(L->loop, UV_RUN_DEFAULT);
    uv_loop_close(L->loop);
    free(env);
    free(L->ranks);
    int code = L->exit_code;
    fv_job_end(&flight, n, code != 0);
    free(L);
    return code;
}
