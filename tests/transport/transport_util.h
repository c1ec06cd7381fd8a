/* tests/transport/transport_util.h: running N ranks as processes on loopback.
 * Owns: picking a free port, starting the ranks, waiting for them with a deadline (then
 * killing them all), killing one rank mid-run (tu_kill_rank()), and the checks a body makes
 * without Criterion (a rank reports through
 * its exit status and stderr, never through cr_assert).
 * A rank is this test executable again (fork, then exec of /proc/self/exe): a plain fork
 * of Criterion's multi-threaded worker cannot start threads under ThreadSanitizer. The
 * rank's body is found by name (TU_REGISTER) and its argument and options travel in the
 * environment as bytes; a constructor runs the rank before Criterion's main and exits.
 * Not here: anything inside weft; these helpers use the public API only. */
#ifndef WF_TEST_TRANSPORT_UTIL_H
#define WF_TEST_TRANSPORT_UTIL_H

#include "wf_test.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define TU_MAX_RANKS 8

/* Before a process makes its first comm: under ThreadSanitizer, UCX's memory hooks (libucm
 * patches madvise, which glibc calls as a thread exits) crash in TSan's interceptors, so
 * they are turned off; the shared-memory and TCP transports do not need them. */
static inline void tu_ucx_env(void)
{
    if (WF_TEST_TSAN)
        setenv("UCX_MEM_EVENTS", "no", 1);
}

/* Whether loopback port 'port' can be bound now (bound, then freed: no connection, so no
 * TIME_WAIT is left behind). */
static inline bool tu_port_free(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert_geq(fd, 0);
    struct sockaddr_in a = { .sin_family = AF_INET,
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
                             .sin_port = htons((uint16_t)port) };
    bool ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
    close(fd);
    return ok;
}

/* A free loopback port below Linux's ephemeral range (32768-60999 by default): the kernel
 * hands those out to every connect() and bind(port 0) on the machine (UCX's TCP connections
 * of other tests among them), so one taken from there and freed could be given to another
 * process before rank 0 binds it ("address already in use"). Ports from 20000 to 32767 are
 * only ever taken by explicit binds; this process's choices among them are random (its pid,
 * the time and a counter), so concurrent test processes rarely try the same one. */
static inline int tu_free_port(void)
{
    static unsigned counter;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t x =
        (uint64_t)getpid() * 0x9e3779b97f4a7c15u ^ (uint64_t)ts.tv_nsec ^ (uint64_t)++counter << 40;
    for (int tries = 0; tries < 1000; tries++) {
        x ^= x << 13; /* xorshift64 */
        x ^= x >> 7;
        x ^= x << 17;
        int port = 20000 + (int)(x % 12768);
        if (tu_port_free(port))
            return port;
    }
    cr_assert_fail("no free loopback port from 20000 to 32767 in 1000 tries");
    return -1;
}

/* A rank's body: returns 0 when every check passed. */
typedef int (*tu_body)(wf_comm *c, int rank, int size, void *arg);

/* Bodies by name, filled by constructors (TU_REGISTER) before anything else runs. */
typedef struct tu_entry {
    const char *name;
    tu_body fn;
} tu_entry;

static tu_entry tu_bodies[32];
static int tu_n_bodies;

/* Registers a body so that a rank process can find it: one line after its definition. */
#define TU_REGISTER(fn)                                             \
    __attribute__((constructor(101))) static void tu_reg_##fn(void) \
    {                                                               \
        if (tu_n_bodies < 32)                                       \
            tu_bodies[tu_n_bodies++] = (tu_entry){ #fn, fn };       \
    }

/* In a child: prints and counts a failed check. */
#define TU_CHECK(cond, ...)                                                          \
    do {                                                                             \
        if (!(cond)) {                                                               \
            fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                            \
            fprintf(stderr, "\n");                                                   \
            return 1;                                                                \
        }                                                                            \
    } while (0)

/* A call that must return 0. */
#define TU_OK(call)                                                                          \
    do {                                                                                     \
        int rc_ = (call);                                                                    \
        TU_CHECK(rc_ == 0, "%s returned %s: %s", #call, wf_err_name(rc_), wf_last_errmsg()); \
    } while (0)

typedef struct tu_run {
    int size;
    wf_comm_opts opts; /* rank, size, addr and token are filled in; of its strings, only
                          'tls' and 'flight_dir' travel to the ranks */
    tu_body body;
    const void *arg; /* 'arg_size' bytes, copied to each rank (no pointers inside) */
    size_t arg_size;
    double timeout_s;
    int port;
    char addr[32];
    pid_t pids[TU_MAX_RANKS];
    int status[TU_MAX_RANKS]; /* waitpid status */
    bool with_rt;             /* each rank makes a runtime first (tu_rt) and its comm on it */
    int n_workers;            /* with 'with_rt': the workers of that runtime (0: 2) */
} tu_run;

/* In a rank of a tu_run with 'with_rt': its runtime ('n_workers' workers, the last 4096 trace
 * events of each kept), which its comm uses; else NULL. */
static wf_runtime *tu_rt;

static inline int tu_child(tu_run *t, int rank, void *arg)
{
    wf_comm_opts o = t->opts;
    o.rank = rank;
    o.size = t->size;
    o.addr = t->addr;
    if (!o.token)
        o.token = "test-token";
    wf_comm *c = NULL;
    tu_ucx_env();
    if (t->with_rt &&
        wf_runtime_create(&tu_rt, &(wf_runtime_opts){ .n_workers = t->n_workers ? t->n_workers : 2,
                                                      .trace_events = 4096 }) < 0) {
        fprintf(stderr, "rank %d: wf_runtime_create: %s\n", rank, wf_last_errmsg());
        return 10;
    }
    int rc = wf_comm_create(tu_rt, &o, &c);
    if (rc < 0) {
        fprintf(stderr, "rank %d: wf_comm_create: %s: %s\n", rank, wf_err_name(rc),
                wf_last_errmsg());
        return 10;
    }
    int r = t->body(c, rank, t->size, arg);
    wf_comm_destroy(c);
    wf_runtime_destroy(tu_rt);
    tu_rt = NULL;
#if WF_TEST_ASAN
    /* The child leaves with _exit() (Criterion's handlers belong to the parent), so
     * LeakSanitizer would not look: ask it here. */
    if (__lsan_do_recoverable_leak_check() != 0) {
        fprintf(stderr, "rank %d leaked memory (report above)\n", rank);
        return r ? r : 30;
    }
#endif
    return r;
}

static inline void tu_hex(char *out, const void *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        sprintf(out + 2 * i, "%02x", ((const uint8_t *)p)[i]);
    out[2 * n] = 0;
}

static inline bool tu_unhex(const char *s, void *p, size_t n)
{
    if (!s || strlen(s) != 2 * n)
        return false;
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        if (sscanf(s + 2 * i, "%2x", &v) != 1)
            return false;
        ((uint8_t *)p)[i] = (uint8_t)v;
    }
    return true;
}

/* The rank side: when this executable was started as a rank, run it and exit. */
__attribute__((constructor(200))) static void tu_rank_main(void)
{
    const char *name = getenv("WF_TU_BODY");
    if (!name)
        return;
    tu_run t = { 0 };
    for (int i = 0; i < tu_n_bodies; i++)
        if (!strcmp(tu_bodies[i].name, name))
            t.body = tu_bodies[i].fn;
    const char *rank_s = getenv("WF_TU_RANK"), *size_s = getenv("WF_TU_SIZE");
    const char *addr = getenv("WF_TU_ADDR"), *arg_hex = getenv("WF_TU_ARG");
    size_t arg_size = arg_hex ? strlen(arg_hex) / 2 : 0;
    void *arg = arg_size ? malloc(arg_size) : NULL;
    if (!t.body || !rank_s || !size_s || !addr ||
        !tu_unhex(getenv("WF_TU_OPTS"), &t.opts, sizeof t.opts) ||
        (arg_size && (!arg || !tu_unhex(arg_hex, arg, arg_size)))) {
        fprintf(stderr, "tu_rank_main: bad rank environment (body '%s')\n", name);
        _exit(40);
    }
    t.opts.tls = getenv("WF_TU_TLS");
    t.opts.flight_dir = getenv("WF_TU_FLIGHT_DIR");
    t.with_rt = getenv("WF_TU_RT") != NULL;
    t.size = atoi(size_s);
    snprintf(t.addr, sizeof t.addr, "%s", addr);
    int rc = tu_child(&t, atoi(rank_s), arg);
    free(arg);
    fflush(NULL);
    _exit(rc);
}

/* Starts rank 'r' of 't' (fork, then exec of this executable as that rank). The
 * environment is built before the fork: the child only calls execve(). */
static inline pid_t tu_spawn(tu_run *t, int r)
{
    extern char **environ;
    const char *name = NULL;
    for (int i = 0; i < tu_n_bodies; i++)
        if (tu_bodies[i].fn == t->body)
            name = tu_bodies[i].name;
    cr_assert_not_null(name, "the body is not registered (TU_REGISTER)");
    size_t n = 0;
    while (environ[n])
        n++;
    char **env = calloc(n + 11, sizeof *env);
    char *vars[10];
    wf_comm_opts plain = t->opts;
    const char *tls = plain.tls;
    const char *flight_dir = plain.flight_dir;
    plain.addr = plain.token = plain.net_devices = plain.tls = plain.flight_dir = NULL;
    char *opts_hex = malloc(2 * sizeof plain + 1), *arg_hex = malloc(2 * t->arg_size + 1);
    cr_assert(env && opts_hex && arg_hex);
    tu_hex(opts_hex, &plain, sizeof plain);
    tu_hex(arg_hex, t->arg, t->arg_size);
    int k = 0;
    cr_assert_geq(asprintf(&vars[k++], "WF_TU_BODY=%s", name), 0);
    cr_assert_geq(asprintf(&vars[k++], "WF_TU_RANK=%d", r), 0);
    cr_assert_geq(asprintf(&vars[k++], "WF_TU_SIZE=%d", t->size), 0);
    cr_assert_geq(asprintf(&vars[k++], "WF_TU_ADDR=%s", t->addr), 0);
    cr_assert_geq(asprintf(&vars[k++], "WF_TU_OPTS=%s", opts_hex), 0);
    cr_assert_geq(asprintf(&vars[k++], "WF_TU_ARG=%s", arg_hex), 0);
    if (tls)
        cr_assert_geq(asprintf(&vars[k++], "WF_TU_TLS=%s", tls), 0);
    if (flight_dir)
        cr_assert_geq(asprintf(&vars[k++], "WF_TU_FLIGHT_DIR=%s", flight_dir), 0);
    if (t->with_rt)
        cr_assert_geq(asprintf(&vars[k++], "WF_TU_RT=1"), 0);
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], "WF_TU_", 6))
            env[m++] = environ[i];
    for (int i = 0; i < k; i++)
        env[m++] = vars[i];
    env[m] = NULL;
    char *argv[] = { "transport-rank", NULL };
    fflush(NULL);
    pid_t p = fork();
    cr_assert_geq(p, 0);
    if (p == 0) {
        execve("/proc/self/exe", argv, env);
        _exit(41);
    }
    for (int i = 0; i < k; i++)
        free(vars[i]);
    free(env);
    free(opts_hex);
    free(arg_hex);
    return p;
}

/* Reads ready bytes from the non-blocking pipe end 'fd' until 'want' have come or 'seconds'
 * have passed; returns how many came (each rank writes one byte when it is ready). */
static inline int tu_wait_ready(int fd, int want, double seconds)
{
    uint64_t end = wf_test_now_ns() + (uint64_t)(seconds * 1e9);
    int got = 0;
    while (got < want && wf_test_now_ns() < end) {
        char b[4];
        ssize_t k = read(fd, b, sizeof b);
        if (k > 0)
            got += (int)k;
        else
            wf_test_sleep_us(1000);
    }
    return got;
}

/* Picks a port and starts every rank. */
static inline void tu_start(tu_run *t)
{
    cr_assert_leq(t->size, TU_MAX_RANKS);
    t->port = tu_free_port();
    snprintf(t->addr, sizeof t->addr, "127.0.0.1:%d", t->port);
    for (int r = 0; r < t->size; r++)
        t->pids[r] = tu_spawn(t, r);
}

/* Waits for every rank; returns false (after killing the rest) past the deadline. */
static inline bool tu_wait(tu_run *t)
{
    uint64_t end = wf_test_now_ns() + (uint64_t)(t->timeout_s * 1e9);
    int left = t->size;
    bool ok = true;
    while (left > 0) {
        for (int r = 0; r < t->size; r++) {
            if (!t->pids[r])
                continue;
            int st;
            pid_t p = waitpid(t->pids[r], &st, WNOHANG);
            if (p == t->pids[r]) {
                t->status[r] = st;
                t->pids[r] = 0;
                left--;
            }
        }
        if (left && wf_test_now_ns() > end) {
            ok = false;
            for (int r = 0; r < t->size; r++)
                if (t->pids[r]) {
                    kill(t->pids[r], SIGKILL);
                    waitpid(t->pids[r], &t->status[r], 0);
                    t->pids[r] = 0;
                    left--;
                }
        }
        if (left)
            wf_test_sleep_us(2000);
    }
    return ok;
}

/* The pipe a test's ranks report ready on: each writes one byte to fds[1] (passed in its
 * argument); fds[0], which the test reads, does not block. */
static inline void tu_ready_pipe(int fds[2])
{
    cr_assert_eq(pipe(fds), 0);
    cr_assert_eq(fcntl(fds[0], F_SETFL, O_NONBLOCK | fcntl(fds[0], F_GETFL)), 0);
}

/* Starts 't', whose ranks write a byte to fds[1] (tu_ready_pipe()) once inside their run,
 * waits for all of them, and 100 ms later (their transfers posted) kills rank 'victim' with
 * SIGKILL. Fails the test unless the victim died of it and every other rank exited with 0 (its
 * body saw the death as it should: WF_EPEER naming the victim) within 'limit_s' (scaled for
 * the sanitizers) of the kill. Closes the pipe; returns the seconds from the kill to the last
 * rank's exit. */
static inline double tu_kill_rank(tu_run *t, int fds[2], int victim, double limit_s)
{
    tu_start(t);
    int got = tu_wait_ready(fds[0], t->size, WF_TEST_TIMEOUT(30));
    cr_assert_eq(got, t->size, "only %d of %d ranks got ready", got, t->size);
    wf_test_sleep_us(100000);
    kill(t->pids[victim], SIGKILL);
    uint64_t t0 = wf_test_now_ns();
    t->timeout_s = WF_TEST_TIMEOUT(limit_s);
    bool in_time = tu_wait(t);
    double s = (double)(wf_test_now_ns() - t0) / 1e9;
    close(fds[0]);
    close(fds[1]);
    cr_assert(in_time, "the other ranks did not return within %.1f s of the kill of rank %d",
              t->timeout_s, victim);
    for (int r = 0; r < t->size; r++)
        if (r == victim)
            cr_assert(WIFSIGNALED(t->status[r]) && WTERMSIG(t->status[r]) == SIGKILL,
                      "rank %d not killed (did it finish or fail early?)", r);
        else
            cr_assert(WIFEXITED(t->status[r]) && WEXITSTATUS(t->status[r]) == 0,
                      "rank %d did not report the death of rank %d correctly (stderr)", r, victim);
    return s;
}

/* Runs 'body' on 'size' ranks and fails the test unless every rank exits with 0. */
static inline void tu_run_all(int size, const wf_comm_opts *opts, tu_body body, const void *arg,
                              size_t arg_size, double timeout_s)
{
    tu_run t = {
        .size = size, .body = body, .arg = arg, .arg_size = arg_size, .timeout_s = timeout_s
    };
    if (opts)
        t.opts = *opts;
    tu_start(&t);
    bool in_time = tu_wait(&t);
    cr_assert(in_time, "%d ranks did not finish within %.0f s (killed)", size, timeout_s);
    for (int r = 0; r < size; r++)
        cr_assert(WIFEXITED(t.status[r]) && WEXITSTATUS(t.status[r]) == 0,
                  "rank %d of %d: %s %d (see its stderr)", r, size,
                  WIFEXITED(t.status[r]) ? "exit status" : "killed by signal",
                  WIFEXITED(t.status[r]) ? WEXITSTATUS(t.status[r]) : WTERMSIG(t.status[r]));
}

#endif /* WF_TEST_TRANSPORT_UTIL_H */
