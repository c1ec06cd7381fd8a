/* tools/weft-run.c: the launcher: starts the ranks of a program, on one machine or several.
 *   weft-run -n N [--host ADDR] [--token T] [--bind-to core|none] [--restarts R]
 *            [--nnodes M --node-rank K --master ADDR:PORT] [--] program [args...]
 * Each rank gets WEFT_RANK, WEFT_SIZE, WEFT_LOCAL_RANK and WEFT_LOCAL_SIZE (its index among
 * this machine's N ranks, and N: wf_runtime_opts_from_env() turns them into the runtime's
 * local_rank/local_size, so that the ranks pin their workers to disjoint cores), WEFT_ADDR
 * (rank 0's rendezvous "host:port": a free
 * loopback port unless --host names an address), WEFT_TOKEN (random unless --token) and
 * WEFT_INCARNATION (1, then one more per restart), which wf_dist_opts_from_env() turns into
 * wf_comm_opts. Every line a rank writes to stdout or stderr is copied to ours with a
 * "[rank] " prefix. SIGINT, SIGTERM, SIGHUP and SIGQUIT are forwarded to every rank. When a
 * rank dies (exits non-zero or by a signal) the others are sent SIGTERM, then SIGKILL 2 s
 * later, and weft-run exits with that rank's status (128 + signal for a signal), naming it.
 * Before that SIGTERM it waits until every other rank still running has written its flight
 * record (WEFT_FLIGHT_DIR, which a rank writes when its comm fails), for 1 s at most: a rank
 * only learns of a peer's death a moment after weft-run does, and one ended before it writes
 * leaves the verdict without its side. Not after a signal from outside (passed on at once).
 * All ranks exiting 0 makes weft-run exit 0.
 * --restarts R: when a rank dies, once every rank has ended, all of them are started again
 * with the next WEFT_INCARNATION (the transport puts it in every message key, so a message
 * of an earlier start never matches), up to R times; each restart is one line on stderr
 * ("weft-run: restart 2 of 5 (incarnation 3): rank 1 (pid 812) was killed by signal 9
 * (Killed) at 4.210 s"); when that is an exit with a status and the flight records blame
 * other ranks (a stopped rank never exits by itself, a survivor does), the line names the
 * blamed ones first (on one machine: node 0 has only its own ranks' records): "...: rank 1 left no
 * flight record (stopped or killed?) and never finished allreduce #24 (step 5), by the flight
 * records (first seen: rank 0 (pid 811) exited with status 22 at 1.077 s)"). Resuming is the
 * program's part (from its newest checkpoint). A signal from outside (forwarded to the ranks) is
 * never followed by a restart. The exit status is the last start's. Several machines (as
 * torchrun's): 'weft-run --nnodes M --node-rank K --master ADDR:PORT -n P prog' on each of M
 * machines runs ranks K*P .. K*P+P-1 of M*P; rank 0 (on node 0) hosts the rendezvous at ADDR:PORT,
 * and node 0's launcher listens on ADDR:PORT+1 for the others (tools/run_link.c). Node 0 decides
 * for the job: it starts every node's ranks once all nodes have joined (within 60 s), stops them
 * all when a rank of any node dies, restarts them all or tells every node to exit with the job's
 * status. A node whose link to node 0 breaks ends its ranks (and node 0 those of every node, with
 * no restart: a lost machine cannot be started again from here). Pass the same --token to every
 * node: without one the token is empty and anyone who reaches the ports may join.
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
 * made with it (wf_dist_opts_from_env) fails on every rank once that pipe closes. With
 * several nodes, a killed launcher's ranks go so, the other nodes' ranks see their peers
 * die, and the other launchers see the launcher link break.
 * Owns: the child processes, their output pipes, the line buffers, the restart count, node
 * 0's view of the job's nodes.
 * Built on libuv (processes, pipes, signals), like the control plane of transport/. */
#include "flight_verdict.h"
#include "run_link.h"

#include <uv.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_RANKS       4096
#define MAX_RESTARTS    1000000
#define JOIN_TIMEOUT_MS 60000

typedef struct out_pipe {
    uv_pipe_t pipe;
    struct rank *rk;
    FILE *to;
    char *line;
    size_t len, cap;
    bool open;
} out_pipe;

typedef struct rank {
    int index; /* the global rank */
    uv_process_t proc;
    out_pipe out, err;
    bool running;
    uint64_t sent; /* bit s: weft-run sent it signal s */
} rank;

/* The local ranks of one start. A start's output pipes may outlive it (a rank's last lines
 * are read after its exit), so every start keeps its own array until weft-run ends. */
typedef struct start {
    rank *ranks;
    struct start *prev;
} start;

typedef struct launcher {
    uv_loop_t *loop;
    int n, alive;          /* local ranks, and those of this start still running */
    int first, size;       /* the global rank of local rank 0; the job's ranks */
    int nnodes, node_rank; /* 1 and 0 on one machine */
    start *cur;            /* this start (its 'ranks'), and through 'prev' the earlier ones */
    uv_signal_t sigs[4];
    uv_timer_t kill_timer, join_timer, drain_timer, grace_timer;
    uint64_t grace_t0_ns;       /* when the grace before the SIGTERM began */
    struct timespec start_wall; /* when this start began: a record older is not its own */
    int exit_code;              /* this start's first local failure's, or 0 */
    bool stopping;              /* this start's local ranks are being ended */
    bool interrupted;           /* a signal from outside or a lost node: no restart */
    bool finished;              /* the handles are closing; 'final_code' is the exit status */
    int final_code;
    int restarts, restart; /* --restarts, and how many were made */
    uint32_t incarnation;
    uint64_t t0_ns;
    char failure[400]; /* this start's first local failure, in words */
    /* How a rank starts (see main): */
    char **env, **rargv;
    char e_rank[32], e_lrank[40], e_inc[48];
    int *cores, n_cores;
    cpu_set_t allowed;
    /* Several nodes: */
    run_link *link;
    int job_code;       /* node 0: the job's first failure's status this start, or 0 */
    char job_fail[400]; /* node 0: that failure, in words */
    bool *down;         /* node 0: [node] its ranks of this start have all ended */
    fv_job flight;      /* the job's flight records (WEFT_FLIGHT_DIR) */
    bool link_lost;     /* other nodes: node 0 is gone; end when our ranks have */
    char rbuf[65536];   /* one loop thread: one read buffer serves every pipe */
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
            "usage: weft-run -n N [--host ADDR] [--token T] [--bind-to core|none] [--restarts R]\n"
            "                [--nnodes M --node-rank K --master ADDR:PORT] [--] program "
            "[args...]\n"
            "  starts N ranks of 'program' on this machine with WEFT_RANK, WEFT_SIZE,\n"
            "  WEFT_ADDR, WEFT_TOKEN and WEFT_INCARNATION set; output lines are prefixed\n"
            "  with the rank.\n"
            "  --bind-to core binds rank r to the (r mod C)-th of the C usable cores\n"
            "  (as mpirun does); none (the default) leaves the ranks unbound.\n"
            "  --restarts R: when a rank dies, end the others and start all ranks again\n"
            "  (next incarnation), up to R times.\n"
            "  --nnodes M --node-rank K --master ADDR:PORT: this machine is node K of M and\n"
            "  runs ranks K*N .. K*N+N-1; rank 0 (node 0) listens on ADDR:PORT, node 0's\n"
            "  launcher on ADDR:PORT+1. Give every node the same --token.\n");
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

static void drained(launcher *L);

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
        launcher *L = s->loop->data;
        if (L->finished)
            drained(L);
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
        rank *rk = &L->cur->ranks[i];
        if (!rk->running)
            continue;
        rk->sent |= 1ull << (sig & 63);
        if (kill(-rk->proc.pid, sig) != 0)
            uv_process_kill(&rk->proc, sig);
    }
}

static void on_kill_timer(uv_timer_t *t)
{
    signal_all(t->loop->data, SIGKILL);
}

#define GRACE_MS      1000 /* the most a rank's flight record is waited for */
#define GRACE_POLL_MS 10

static void term_others(launcher *L)
{
    uv_timer_stop(&L->grace_timer);
    signal_all(L, SIGTERM);
    /* A stopped rank (SIGSTOP, a debugger) acts on SIGTERM only once continued: without
     * this it would hold the restart back until the SIGKILL. SIGCONT changes nothing for
     * the others. */
    signal_all(L, SIGCONT);
    uv_timer_start(&L->kill_timer, on_kill_timer, 2000, 0);
}

/* Whether every local rank still running has written its flight record of this start. */
static bool records_written(const launcher *L)
{
    for (int i = 0; i < L->n; i++) {
        const rank *rk = &L->cur->ranks[i];
        if (rk->running && !fv_job_has_record(&L->flight, rk->index, &L->start_wall))
            return false;
    }
    return true;
}

static void on_grace_timer(uv_timer_t *t)
{
    launcher *L = t->loop->data;
    if (records_written(L) || uv_hrtime() - L->grace_t0_ns >= GRACE_MS * 1000000ull)
        term_others(L);
}

/* Ends this start's other local ranks: SIGTERM (after the grace for their flight records,
 * see the top), SIGKILL 2 s later. */
static void stop_others(launcher *L)
{
    if (L->stopping || L->alive == 0)
        return;
    L->stopping = true;
    if (!L->flight.dir[0] || L->interrupted || records_written(L)) {
        term_others(L);
        return;
    }
    L->grace_t0_ns = uv_hrtime();
    uv_timer_start(&L->grace_timer, on_grace_timer, GRACE_POLL_MS, GRACE_POLL_MS);
}

static double now_s(const launcher *L)
{
    return (double)(uv_hrtime() - L->t0_ns) / 1e9;
}

/* Closes every output pipe still open: 'all' (the drain deadline passed), or else only
 * when none is open any more, which closes the drain timer. */
static void close_pipes(launcher *L, bool all)
{
    for (start *st = L->cur; st; st = st->prev)
        for (int i = 0; i < L->n; i++) {
            out_pipe *ps[2] = { &st->ranks[i].out, &st->ranks[i].err };
            for (int p = 0; p < 2; p++)
                if (ps[p]->open) {
                    if (!all)
                        return;
                    if (ps[p]->len)
                        flush_line(ps[p]);
                    ps[p]->open = false;
                    uv_close((uv_handle_t *)&ps[p]->pipe, on_pipe_closed);
                }
        }
    if (!uv_is_closing((uv_handle_t *)&L->drain_timer))
        uv_close((uv_handle_t *)&L->drain_timer, NULL);
}

static void drained(launcher *L)
{
    close_pipes(L, false);
}

static void on_drain_timer(uv_timer_t *t)
{
    close_pipes(t->loop->data, true);
}

/* Ends weft-run with status 'code': closes every handle, so that uv_run() returns. */
static void finish(launcher *L, int code)
{
    if (L->finished)
        return;
    L->finished = true;
    L->final_code = code;
    for (int i = 0; i < 4; i++)
        uv_close((uv_handle_t *)&L->sigs[i], NULL);
    /* A rank's last lines may still be in its pipes (its exit can reach us first): read
     * them to their end, but a pipe a rank's own children still hold open must not keep us
     * waiting long. */
    uv_timer_start(&L->drain_timer, on_drain_timer, 500, 0);
    drained(L);
    uv_close((uv_handle_t *)&L->kill_timer, NULL);
    uv_close((uv_handle_t *)&L->join_timer, NULL);
    uv_close((uv_handle_t *)&L->grace_timer, NULL);
    run_link_close(L->link);
    L->link = NULL;
}

static void on_exit_cb(uv_process_t *p, int64_t status, int sig);

/* Starts this node's ranks once more, with L->incarnation; returns 0, or -1 when a rank
 * could not be started (the others are being stopped: the start ends as a failure). */
static int start_ranks(launcher *L)
{
    start *st = calloc(1, sizeof *st);
    rank *ranks = st ? calloc((size_t)L->n, sizeof *ranks) : NULL;
    if (!ranks) {
        free(st);
        fprintf(stderr, "weft-run: out of memory\n");
        return -1;
    }
    st->ranks = ranks;
    st->prev = L->cur;
    L->cur = st;
    L->alive = 0;
    L->stopping = false;
    L->exit_code = 0;
    L->failure[0] = 0;
    uv_timer_stop(&L->kill_timer);
    uv_timer_stop(&L->grace_timer);
    clock_gettime(CLOCK_REALTIME, &L->start_wall);
    snprintf(L->e_inc, sizeof L->e_inc, "WEFT_INCARNATION=%u", L->incarnation);
    for (int r = 0; r < L->n; r++) {
        rank *rk = &ranks[r];
        rk->index = L->first + r;
        snprintf(L->e_rank, sizeof L->e_rank, "WEFT_RANK=%d", rk->index);
        snprintf(L->e_lrank, sizeof L->e_lrank, "WEFT_LOCAL_RANK=%d", r);
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
            .file = L->rargv[0],
            .args = L->rargv,
            .env = L->env,
            .stdio_count = 3,
            .stdio = stdio,
            .flags = UV_PROCESS_DETACHED,
        };
        rk->proc.data = rk;
        /* --bind-to core: each fork inherits the binding weft-run holds while it forks. */
        if (L->n_cores) {
            cpu_set_t one;
            CPU_ZERO(&one);
            CPU_SET(L->cores[r % L->n_cores], &one);
            if (sched_setaffinity(0, sizeof one, &one) != 0)
                fprintf(stderr, "weft-run: rank %d: binding to cpu %d: %s\n", rk->index,
                        L->cores[r % L->n_cores], strerror(errno));
        }
        int rc = uv_spawn(L->loop, &rk->proc, &po);
        if (L->n_cores)
            sched_setaffinity(0, sizeof L->allowed, &L->allowed);
        if (rc != 0) {
            fprintf(stderr, "weft-run: cannot start rank %d ('%s'): %s\n", rk->index, L->rargv[3],
                    uv_strerror(rc));
            for (int p = 0; p < 2; p++) {
                pipes[p]->open = false;
                uv_close((uv_handle_t *)&pipes[p]->pipe, on_pipe_closed);
            }
            uv_close((uv_handle_t *)&rk->proc, NULL);
            L->exit_code = 127;
            L->interrupted = true; /* what cannot start once will not start again */
            snprintf(L->failure, sizeof L->failure, "rank %d could not be started", rk->index);
            stop_others(L);
            return -1;
        }
        rk->running = true;
        L->alive++;
        for (int p = 0; p < 2; p++)
            uv_read_start((uv_stream_t *)&pipes[p]->pipe, on_alloc, on_read);
    }
    return 0;
}

/* ---- The job's decisions: one machine, or node 0 for all nodes ---------------------------- */

static void broadcast(launcher *L, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void broadcast(launcher *L, const char *fmt, ...)
{
    if (!L->link)
        return;
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    run_link_send(L->link, -1, line);
}

/* Whether failure 'a' says more about why a start ended than 'b': when one rank is killed,
 * the others fail on their next collective, and their exits (status 1) often reach us first;
 * the death by a signal is the cause worth naming in the restart line. The exit status
 * stays the first failure's. */
static bool more_telling(const char *a, const char *b)
{
    return strstr(a, "killed by signal") && !strstr(b, "killed by signal");
}

/* Whether the flight verdict's clause 'blame' ("rank 1 never ..." or "ranks 0,2 left ...")
 * should lead the restart line instead of 'failure', the first failure seen: only for a
 * rank's exit with a status (a death by a signal is the cause worth naming), when the clause
 * does not name that rank, and on one machine (node 0 reads only its own ranks' records, so
 * another node's ranks would read as "left no flight record"). */
static bool blame_leads(const launcher *L, const char *blame, const char *failure)
{
    int f;
    if (!blame[0] || L->nnodes > 1 || strstr(failure, "killed by signal") ||
        sscanf(failure, "rank %d ", &f) != 1)
        return false;
    const char *p = blame + (strncmp(blame, "ranks ", 6) ? 5 : 6);
    for (;;) {
        char *end;
        long r = strtol(p, &end, 10);
        if (end == p)
            return true;
        if (r == f)
            return false;
        if (*end != ',')
            return true;
        p = end + 1;
    }
}

/* Every rank of the job has ended this start, the first failure being 'failure' with status
 * 'code' (0: none): start all of them again, or end the job. */
static void job_over(launcher *L, int code, const char *failure)
{
    char blame[512] = "", cause[1024];
    if (code != 0)
        fv_job_report(&L->flight, L->size, blame, sizeof blame);
    /* The first exit seen is often a survivor's (a stopped rank never exits by itself): when
     * the flight records blame another rank, the restart line names that one first. */
    if (blame_leads(L, blame, failure)) {
        snprintf(cause, sizeof cause, "%s, by the flight records (first seen: %s)", blame, failure);
        failure = cause;
    }
    if (code != 0 && !L->interrupted && L->restart < L->restarts) {
        L->restart++;
        L->incarnation++;
        fprintf(stderr, "weft-run: restart %d of %d (incarnation %u): %s\n", L->restart,
                L->restarts, L->incarnation, failure);
        broadcast(L, "start %u %d %d %s", L->incarnation, L->restart, L->restarts, failure);
        if (L->nnodes > 1)
            memset(L->down, 0, (size_t)L->nnodes * sizeof *L->down);
        L->job_code = 0;
        L->job_fail[0] = 0;
        if (start_ranks(L) < 0 && L->alive == 0)
            job_over(L, 127, L->failure); /* no rank of ours runs: nothing else calls it */
        return;
    }
    if (code != 0 && L->restarts > 0 && L->interrupted)
        fprintf(stderr,
                "weft-run: no restart (a signal from outside, a lost node or a rank that "
                "cannot start); exiting with status %d\n",
                code);
    else if (code != 0 && L->restarts > 0)
        fprintf(stderr, "weft-run: no restart left after %d restart%s; exiting with status %d\n",
                L->restart, L->restart == 1 ? "" : "s", code);
    broadcast(L, "exit %d", code);
    finish(L, code);
}

/* Node 0: whether every node's ranks have ended; if so, the job's start is over. */
static void check_all_down(launcher *L)
{
    for (int k = 0; k < L->nnodes; k++)
        if (!L->down[k])
            return;
    job_over(L, L->job_code, L->job_fail);
}

/* Node 0: a rank of node 'node' failed (or the node is lost): end the start everywhere. */
static void job_failed(launcher *L, int code, const char *what)
{
    if (!L->job_code) {
        L->job_code = code ? code : 1;
        snprintf(L->job_fail, sizeof L->job_fail, "%s", what);
        broadcast(L, "stop");
    } else if (more_telling(what, L->job_fail)) {
        snprintf(L->job_fail, sizeof L->job_fail, "%s", what);
    }
    stop_others(L);
}

/* Every local rank of this start has ended. */
static void local_over(launcher *L)
{
    if (L->nnodes == 1) {
        job_over(L, L->exit_code, L->failure);
    } else if (L->node_rank == 0) {
        L->down[0] = true;
        check_all_down(L);
    } else if (L->link_lost) {
        finish(L, L->exit_code ? L->exit_code : 1);
    } else {
        char line[64];
        snprintf(line, sizeof line, "down %d", L->exit_code);
        run_link_send(L->link, 0, line);
    }
}

/* A local rank failed ('code', 'what'): stop this node's others and tell node 0. */
static void local_failed(launcher *L, int code, const char *what)
{
    if (!L->exit_code)
        L->exit_code = code;
    if (!L->failure[0] || more_telling(what, L->failure))
        snprintf(L->failure, sizeof L->failure, "%s", what);
    if (L->nnodes > 1 && L->node_rank == 0) {
        job_failed(L, code, what);
        return;
    }
    if (L->nnodes > 1) {
        char line[512];
        snprintf(line, sizeof line, "fail %d %s", code, what);
        run_link_send(L->link, 0, line);
    }
    stop_others(L);
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
        char what[400];
        if (sig)
            snprintf(what, sizeof what, "rank %d (pid %d) was killed by signal %d (%s) at %.3f s",
                     rk->index, p->pid, sig, strsignal(sig), now_s(L));
        else
            snprintf(what, sizeof what, "rank %d (pid %d) exited with status %lld at %.3f s",
                     rk->index, p->pid, (long long)status, now_s(L));
        fprintf(stderr, "weft-run: %s%s\n", what, L->stopping ? "" : "; stopping the others");
        local_failed(L, sig ? 128 + sig : (int)(status & 0xff ? status & 0xff : 1), what);
    }
    if (--L->alive == 0)
        local_over(L);
}

static void on_signal(uv_signal_t *s, int sig)
{
    launcher *L = s->loop->data;
    if (!L->cur) { /* node 0 waits for the nodes, or a node for node 0: no rank runs yet */
        broadcast(L, "exit %d", 128 + sig);
        finish(L, 128 + sig);
        return;
    }
    signal_all(L, sig);
    L->interrupted = true;
    if (!L->exit_code)
        L->exit_code = 128 + sig;
    char what[160];
    snprintf(what, sizeof what, "node %d's launcher got signal %d (%s)", L->node_rank, sig,
             strsignal(sig));
    if (L->nnodes > 1 && L->node_rank == 0) {
        broadcast(L, "halt");
        job_failed(L, 128 + sig, what);
    } else if (L->nnodes > 1) {
        char line[256];
        snprintf(line, sizeof line, "halt %d %s", 128 + sig, what);
        run_link_send(L->link, 0, line);
    }
    if (L->alive == 0 && L->nnodes == 1)
        local_over(L);
}

/* ---- The launcher link (several nodes) ----------------------------------------------------- */

/* "fail CODE WHAT" / "halt CODE WHAT" parsed; returns CODE (1 if missing), WHAT in '*what'. */
static int code_and_text(const char *args, const char **what)
{
    char *end;
    long code = strtol(args, &end, 10);
    if (end == args || code <= 0 || code > 255)
        code = 1;
    while (*end == ' ')
        end++;
    *what = *end ? end : "a rank failed";
    return (int)code;
}

static void on_link_line(void *arg, int node, const char *line)
{
    launcher *L = arg;
    if (L->finished)
        return;
    if (L->node_rank == 0) {
        const char *what;
        if (!strncmp(line, "fail ", 5)) {
            int code = code_and_text(line + 5, &what);
            job_failed(L, code, what);
        } else if (!strncmp(line, "halt ", 5)) {
            int code = code_and_text(line + 5, &what);
            L->interrupted = true;
            broadcast(L, "halt");
            job_failed(L, code, what);
        } else if (!strncmp(line, "down ", 5)) {
            int code = atoi(line + 5);
            if (code && !L->job_code) /* a node ended badly without a failure line */
                job_failed(L, code, "a rank failed");
            L->down[node] = true;
            check_all_down(L);
        }
        return;
    }
    unsigned inc;
    int k, of, used = 0;
    if (sscanf(line, "start %u %d %d %n", &inc, &k, &of, &used) >= 3 && used > 0) {
        if (k > 0)
            fprintf(stderr, "weft-run: restart %d of %d (incarnation %u): %s\n", k, of, inc,
                    line + used);
        L->incarnation = inc;
        L->restart = k;
        if (start_ranks(L) < 0 && L->alive == 0)
            local_over(L);
    } else if (!strcmp(line, "stop")) {
        stop_others(L);
    } else if (!strcmp(line, "halt")) {
        L->interrupted = true;
        stop_others(L);
    } else if (!strncmp(line, "exit ", 5)) {
        finish(L, atoi(line + 5));
    }
}

static void on_link_lost(void *arg, int node, const char *why)
{
    launcher *L = arg;
    if (L->finished)
        return;
    L->interrupted = true;
    char what[300];
    snprintf(what, sizeof what, "node %d's launcher is gone (%s)", node, why);
    fprintf(stderr, "weft-run: %s; stopping%s\n", what,
            L->node_rank == 0 ? " every node's ranks" : " this node's ranks");
    if (L->node_rank == 0) {
        broadcast(L, "halt");
        job_failed(L, 1, what);
        L->down[node] = true;
        check_all_down(L);
        return;
    }
    L->link_lost = true;
    if (!L->exit_code)
        L->exit_code = 1;
    if (L->alive == 0)
        finish(L, L->exit_code);
    else
        stop_others(L);
}

/* Node 0: every node has joined: start the job. */
static void on_link_ready(void *arg)
{
    launcher *L = arg;
    uv_timer_stop(&L->join_timer);
    broadcast(L, "start %u 0 %d -", L->incarnation, L->restarts);
    if (start_ranks(L) < 0 && L->alive == 0)
        local_over(L);
}

static void on_join_timeout(uv_timer_t *t)
{
    launcher *L = t->loop->data;
    fprintf(stderr, "weft-run: not every node joined within %d s; exiting\n",
            JOIN_TIMEOUT_MS / 1000);
    broadcast(L, "exit 1");
    finish(L, 1);
}

/* Whether 'port' on 'a''s address can be bound now (bound, then let go: no connection, so
 * nothing is left in TIME_WAIT). */
static bool port_free(struct sockaddr_in a, int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return false;
    a.sin_port = htons((uint16_t)port);
    bool ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
    close(fd);
    return ok;
}

/* A port of 'host' (loopback unless it is an IPv4 address) that is free now, for rank 0's
 * rendezvous, which binds it a moment later. Chosen at random below Linux's ephemeral range
 * (32768-60999 by default), from 20000 to 32767: a port the kernel hands out to a connect()
 * or a bind(port 0), freed again, can go to another process's connection (another job's UCX
 * endpoints) before rank 0 binds it, and rank 0 then fails with "address already in use";
 * ports below that range only ever go to explicit binds. Falls back to one the kernel picks;
 * -1 with errno when none can be had. */
static int free_port(const char *host)
{
    struct sockaddr_in a = { .sin_family = AF_INET };
    if (inet_pton(AF_INET, host, &a.sin_addr) != 1)
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t x = (uint64_t)getpid() * 0x9e3779b97f4a7c15u ^ (uint64_t)ts.tv_nsec;
    for (int tries = 0; tries < 200; tries++) {
        x ^= x << 13; /* xorshift64 */
        x ^= x >> 7;
        x ^= x << 17;
        int port = 20000 + (int)(x % 12768);
        if (port_free(a, port))
            return port;
    }
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
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

/* Parses a decimal in lo..hi from 'arg' for option 'opt'; returns it, or -1 (said why). */
static long int_arg(const char *opt, const char *arg, long lo, long hi)
{
    char *end;
    errno = 0;
    long v = strtol(arg, &end, 10);
    if (errno || end == arg || *end || v < lo || v > hi) {
        fprintf(stderr, "weft-run: %s %s: expected an integer in %ld..%ld\n", opt, arg, lo, hi);
        return -1;
    }
    return v;
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "--exec-rank"))
        return exec_rank(argc, argv);
    int n = 0, i = 1, restarts = 0, nnodes = 1, node_rank = -1;
    const char *host = NULL, *token = NULL, *master = NULL;
    bool bind = false;
    for (; i < argc; i++) {
        long v;
        if (!strcmp(argv[i], "--")) {
            i++;
            break;
        } else if (!strcmp(argv[i], "-n") && i + 1 < argc) {
            if ((v = int_arg("-n", argv[++i], 1, MAX_RANKS)) < 0)
                return 2;
            n = (int)v;
        } else if (!strcmp(argv[i], "--restarts") && i + 1 < argc) {
            if ((v = int_arg("--restarts", argv[++i], 0, MAX_RESTARTS)) < 0)
                return 2;
            restarts = (int)v;
        } else if (!strcmp(argv[i], "--nnodes") && i + 1 < argc) {
            if ((v = int_arg("--nnodes", argv[++i], 1, MAX_RANKS)) < 0)
                return 2;
            nnodes = (int)v;
        } else if (!strcmp(argv[i], "--node-rank") && i + 1 < argc) {
            if ((v = int_arg("--node-rank", argv[++i], 0, MAX_RANKS - 1)) < 0)
                return 2;
            node_rank = (int)v;
        } else if (!strcmp(argv[i], "--master") && i + 1 < argc) {
            master = argv[++i];
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
    /* Several nodes: --master ADDR:PORT and --node-rank below --nnodes, and no --host. */
    char mhost[256] = "";
    int mport = 0;
    if (nnodes > 1 || master || node_rank >= 0) {
        const char *colon = master ? strrchr(master, ':') : NULL;
        long p = colon ? int_arg("--master's port", colon + 1, 1, 65534) : -1;
        if (!master || !colon || colon == master || (size_t)(colon - master) >= sizeof mhost ||
            p < 0) {
            fprintf(stderr, "weft-run: --master ADDR:PORT (PORT 1..65534) is needed with "
                            "--nnodes and --node-rank\n");
            return 2;
        }
        if (node_rank < 0 || node_rank >= nnodes) {
            fprintf(stderr, "weft-run: --node-rank must be in 0..%d (--nnodes %d)\n", nnodes - 1,
                    nnodes);
            return 2;
        }
        if (host) {
            fprintf(stderr, "weft-run: --host and --master exclude each other\n");
            return 2;
        }
        if ((long)nnodes * n > MAX_RANKS) {
            fprintf(stderr, "weft-run: --nnodes %d x -n %d is more than %d ranks\n", nnodes, n,
                    MAX_RANKS);
            return 2;
        }
        memcpy(mhost, master, (size_t)(colon - master));
        mport = (int)p;
    }
    if (node_rank < 0)
        node_rank = 0;
    char addr[300], tok[40] = "";
    if (master) {
        snprintf(addr, sizeof addr, "%s", master);
    } else if (host && strchr(host, ':')) {
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
    if (!token && !master)
        random_token(tok, sizeof tok);

    launcher *L = calloc(1, sizeof *L); /* after the arguments: no leak on a bad one */
    if (!L) {
        fprintf(stderr, "weft-run: out of memory\n");
        return 1;
    }
    L->loop = uv_default_loop();
    L->loop->data = L;
    L->n = n;
    L->nnodes = nnodes;
    L->node_rank = node_rank;
    L->first = node_rank * n;
    L->size = nnodes * n;
    L->restarts = restarts;
    L->incarnation = 1;
    L->t0_ns = uv_hrtime();
    if (nnodes > 1 && !(L->down = calloc((size_t)nnodes, sizeof *L->down))) {
        fprintf(stderr, "weft-run: out of memory\n");
        return 1;
    }
    uv_timer_init(L->loop, &L->kill_timer);
    uv_timer_init(L->loop, &L->join_timer);
    uv_timer_init(L->loop, &L->drain_timer);
    uv_timer_init(L->loop, &L->grace_timer);
    static const int fwd[4] = { SIGINT, SIGTERM, SIGHUP, SIGQUIT };
    for (int s = 0; s < 4; s++) {
        uv_signal_init(L->loop, &L->sigs[s]);
        uv_signal_start(&L->sigs[s], on_signal, fwd[s]);
    }

    /* The flight records of this job go to a directory of its own (WEFT_FLIGHT_DIR). */
    fv_job_begin(&L->flight);
    /* The environment of every rank: ours plus the WEFT_ variables. */
    extern char **environ;
    size_t nenv = 0;
    while (environ[nenv])
        nenv++;
    char **env = calloc(nenv + 9, sizeof *env);
    char e_size[32], e_lsize[40], e_addr[320], e_tok[300], e_lfd[48];
    if (!env) {
        fprintf(stderr, "weft-run: out of memory\n");
        return 1;
    }
    static const char *const ours[] = {
        "WEFT_RANK=",        "WEFT_SIZE=",        "WEFT_ADDR=",       "WEFT_TOKEN=",
        "WEFT_LAUNCHER_FD=", "WEFT_INCARNATION=", "WEFT_LOCAL_RANK=", "WEFT_LOCAL_SIZE="
    };
    size_t k = 0;
    for (size_t j = 0; j < nenv; j++) {
        bool skip = false;
        for (size_t o = 0; o < sizeof ours / sizeof ours[0]; o++)
            skip = skip || !strncmp(environ[j], ours[o], strlen(ours[o]));
        if (!skip)
            env[k++] = environ[j];
    }
    /* The liveness pipe (see the top): the ranks inherit the read end, the write end is
     * close-on-exec and stays ours until we die. We keep the read end too, for the ranks
     * of later starts. */
    int lp[2];
    if (pipe(lp) != 0 || fcntl(lp[1], F_SETFD, FD_CLOEXEC) != 0) {
        fprintf(stderr, "weft-run: pipe: %s\n", strerror(errno));
        return 1;
    }
    snprintf(e_lfd, sizeof e_lfd, "WEFT_LAUNCHER_FD=%d", lp[0]);
    env[k++] = e_lfd;
    env[k++] = L->e_rank;
    env[k++] = e_size;
    env[k++] = e_addr;
    env[k++] = e_tok;
    env[k++] = L->e_inc;
    env[k++] = L->e_lrank;
    env[k++] = e_lsize;
    env[k] = NULL;
    snprintf(e_size, sizeof e_size, "WEFT_SIZE=%d", L->size);
    snprintf(e_lsize, sizeof e_lsize, "WEFT_LOCAL_SIZE=%d", L->n);
    snprintf(e_addr, sizeof e_addr, "WEFT_ADDR=%s", addr);
    snprintf(e_tok, sizeof e_tok, "WEFT_TOKEN=%s", token ? token : tok);
    L->env = env;

    if (bind && (!(L->cores = malloc(CPU_SETSIZE * sizeof *L->cores)) ||
                 (L->n_cores = usable_cores(&L->allowed, L->cores)) == 0)) {
        fprintf(stderr, "weft-run: --bind-to core: %s\n",
                L->cores ? "cannot read this process's CPU affinity" : "out of memory");
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
    L->rargv = rargv;

    if (nnodes > 1) {
        run_link_cbs cbs = {
            .arg = L, .ready = on_link_ready, .line = on_link_line, .lost = on_link_lost
        };
        if (run_link_start(L->loop, mhost, mport + 1, nnodes, node_rank, token ? token : "",
                           JOIN_TIMEOUT_MS, &cbs, &L->link) != 0)
            finish(L, 1);
        else if (node_rank == 0)
            uv_timer_start(&L->join_timer, on_join_timeout, JOIN_TIMEOUT_MS, 0);
    } else if (start_ranks(L) < 0 && L->alive == 0) {
        local_over(L);
    }
    uv_run(L->loop, UV_RUN_DEFAULT);
    uv_loop_close(L->loop);
    close(lp[0]);
    int code = L->final_code;
    for (start *st = L->cur, *prev; st; st = prev) {
        prev = st->prev;
        free(st->ranks);
        free(st);
    }
    free(L->cores);
    free(rargv);
    free(env);
    free(L->down);
    fv_job_end(&L->flight, L->size, false); /* job_over() gave the verdicts */
    free(L);
    return code;
}
