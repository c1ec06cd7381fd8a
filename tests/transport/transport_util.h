/* tests/transport/transport_util.h: running N ranks as forked processes on loopback.
 * Owns: picking a free port, forking the ranks (each creates its comm, runs a body and
 * destroys the comm), waiting for them with a deadline (then killing them all), and the
 * checks a body makes without Criterion (a forked child reports through its exit status
 * and stderr, never through cr_assert).
 * Not here: anything inside weft; these helpers use the public API only. */
#ifndef WF_TEST_TRANSPORT_UTIL_H
#define WF_TEST_TRANSPORT_UTIL_H

#include "wf_test.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define TU_MAX_RANKS 8

/* A port the kernel just gave out (then freed): good enough on a test machine. */
static inline int tu_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert_geq(fd, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t len = sizeof a;
    cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    return ntohs(a.sin_port);
}

/* A rank's body: returns 0 when every check passed. */
typedef int (*tu_body)(wf_comm *c, int rank, int size, void *arg);

/* In a child: prints and counts a failed check. */
#define TU_CHECK(cond, ...)                                               \
    do {                                                                  \
        if (!(cond)) {                                                    \
            fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                 \
            fprintf(stderr, "\n");                                        \
            return 1;                                                     \
        }                                                                 \
    } while (0)

/* A call that must return 0. */
#define TU_OK(call)                                                                  \
    do {                                                                             \
        int rc_ = (call);                                                            \
        TU_CHECK(rc_ == 0, "%s returned %s: %s", #call, wf_err_name(rc_), wf_last_errmsg()); \
    } while (0)

typedef struct tu_run {
    int size;
    wf_comm_opts opts; /* rank, size, addr and token are filled in */
    tu_body body;
    void *arg;
    double timeout_s;
    int port;
    char addr[32];
    pid_t pids[TU_MAX_RANKS];
    int status[TU_MAX_RANKS]; /* waitpid status */
} tu_run;

static inline int tu_child(tu_run *t, int rank)
{
    wf_comm_opts o = t->opts;
    o.rank = rank;
    o.size = t->size;
    o.addr = t->addr;
    if (!o.token)
        o.token = "test-token";
    wf_comm *c = NULL;
    int rc = wf_comm_create(NULL, &o, &c);
    if (rc < 0) {
        fprintf(stderr, "rank %d: wf_comm_create: %s: %s\n", rank, wf_err_name(rc),
                wf_last_errmsg());
        return 10;
    }
    int r = t->body(c, rank, t->size, t->arg);
    wf_comm_destroy(c);
    return r;
}

/* Forks the ranks; returns with every child reaped (killed past the deadline). */
static inline void tu_start(tu_run *t)
{
    cr_assert_leq(t->size, TU_MAX_RANKS);
    t->port = tu_free_port();
    snprintf(t->addr, sizeof t->addr, "127.0.0.1:%d", t->port);
    fflush(NULL);
    for (int r = 0; r < t->size; r++) {
        pid_t p = fork();
        cr_assert_geq(p, 0);
        if (p == 0)
            _exit(tu_child(t, r));
        t->pids[r] = p;
    }
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

/* Runs 'body' on 'size' ranks and fails the test unless every rank exits with 0. */
static inline void tu_run_all(int size, const wf_comm_opts *opts, tu_body body, void *arg,
                              double timeout_s)
{
    tu_run t = { .size = size, .body = body, .arg = arg, .timeout_s = timeout_s };
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
