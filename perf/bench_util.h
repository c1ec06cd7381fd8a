/* perf/bench_util.h: the helpers every benchmark driver under perf/ shares: the clocks, a
 * sleep that survives signals, the median of a set of timings, and the parsing of integer
 * and comma-separated-list options; for the multi-process benchmarks a free loopback port,
 * the peak RSS, running one function in N forked processes with their results back, and a
 * peer's first line of JSON output (a command run through popen()).
 * Owns: nothing with state; all functions are static inline so each driver stays one file
 * plus this header.
 * Not here: options, the order of runs and the output format of a benchmark (its driver),
 * the workloads. Needs _GNU_SOURCE (sched_getaffinity(), CPU_COUNT()) before any include. */
#ifndef WEFT_PERF_BENCH_UTIL_H
#define WEFT_PERF_BENCH_UTIL_H

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Wall time, seconds, monotonic. */
static inline double bench_now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* CPU time of the whole process (all threads), seconds. */
static inline double bench_process_cpu_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline void bench_sleep_s(double s)
{
    struct timespec ts = { (time_t)s, (long)((s - (double)(time_t)s) * 1e9) };

    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static inline int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return (x > y) - (x < y);
}

/* Sorts 't' (n >= 1) and returns its median. */
static inline double bench_median(double *t, int n)
{
    qsort(t, (size_t)n, sizeof(double), bench_cmp_double);
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

/* Parses a decimal integer in [lo, hi] into '*out'. Returns 0, or -1 (NULL, junk, range). */
static inline int bench_parse_int(const char *s, int lo, int hi, int *out)
{
    char *end;
    long v;

    if (s == NULL)
        return -1;
    errno = 0;
    v = strtol(s, &end, 10);
    if (errno != 0 || *end != '\0' || end == s || v < lo || v > hi)
        return -1;
    *out = (int)v;
    return 0;
}

/* Parses "a,b,c" against 'names[0 .. n-1]' (n <= 32) and sets the bits of the names found
 * in '*out'. Returns 0, or -1 (an unknown name, reported on stderr after 'prog', or an empty
 * or too long list). */
static inline int bench_parse_list(const char *prog, const char *s, const char *const *names, int n,
                                   unsigned *out)
{
    char buf[256];

    if (s == NULL || strlen(s) >= sizeof(buf))
        return -1;
    strcpy(buf, s);
    *out = 0;
    for (char *save, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int i = 0;

        while (i < n && strcmp(tok, names[i]) != 0)
            i++;
        if (i == n) {
            fprintf(stderr, "%s: unknown name '%s'\n", prog, tok);
            return -1;
        }
        *out |= 1u << i;
    }
    return *out ? 0 : -1;
}

/* The number of CPUs this process may run on (at least 1). */
static inline int bench_default_threads(void)
{
    cpu_set_t set;

    if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0)
        return CPU_COUNT(&set);
    return 1;
}

/* A loopback TCP port that was free a moment ago (the kernel's pick), or 'fallback'. */
static inline int bench_free_port(int fallback)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t len = sizeof a;
    int port = fallback;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

/* This process's peak resident set so far, MB. */
static inline double bench_peak_rss_mb(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_maxrss / 1024.0;
}

/* Runs 'fn(rank, res, ctx)' in 'n' (1 .. 64) fresh processes (fork(); each exits with fn's
 * return value) and collects their results: rank r's 'size' bytes (zeroed before fn runs)
 * land at 'results + r * size', sent through a pipe in one write (size + 16 at most
 * PIPE_BUF, so records never interleave). Returns the number of ranks that failed (a nonzero
 * exit, a signal, no result: their slots are left as they were), or n when none could start. */
static inline int bench_fork_ranks(int n, int (*fn)(int rank, void *res, void *ctx), void *ctx,
                                   void *results, size_t size)
{
    enum { HDR = 16 }; /* the rank, then the result at an offset aligned for any field */

    _Alignas(16) char rec[PIPE_BUF];
    size_t len = HDR + size;
    int fds[2], got[64] = { 0 }, bad = 0;
    pid_t pids[64];
    if (n < 1 || n > 64 || len > sizeof rec || pipe(fds) != 0)
        return n;
    for (int r = 0; r < n; r++) {
        fflush(NULL);
        pids[r] = fork();
        if (pids[r] == 0) {
            close(fds[0]);
            memset(rec, 0, len);
            memcpy(rec, &r, sizeof r);
            int rc = fn(r, rec + HDR, ctx);
            if (write(fds[1], rec, len) != (ssize_t)len)
                rc = 1;
            _exit(rc);
        }
    }
    close(fds[1]);
    for (ssize_t k; (k = read(fds[0], rec, len)) == (ssize_t)len;) {
        int r;
        memcpy(&r, rec, sizeof r);
        if (r >= 0 && r < n && !got[r]) {
            got[r] = 1;
            memcpy((char *)results + (size_t)r * size, rec + HDR, size);
        }
    }
    close(fds[0]);
    for (int r = 0; r < n; r++) {
        int st = 0;
        if (pids[r] < 0 || waitpid(pids[r], &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0 ||
            !got[r])
            bad++;
    }
    return bad;
}

/* Runs 'cmd' (sh -c) and reads the first line it prints, and from it the numbers of 'n' JSON
 * keys ('keys[i]' written as "key": value) into 'vals'. Returns 0, or -1 (it could not start,
 * exited nonzero, or a key is missing: a peer that skipped prints {"skip": why}). */
static inline int bench_peer_line(const char *cmd, const char *const *keys, double *vals, int n)
{
    char line[1024] = "", pat[64];
    FILE *p = popen(cmd, "r");
    if (!p)
        return -1;
    if (!fgets(line, sizeof line, p))
        line[0] = 0;
    int bad = pclose(p) != 0;
    for (int i = 0; i < n && !bad; i++) {
        snprintf(pat, sizeof pat, "\"%s\": ", keys[i]);
        const char *at = strstr(line, pat);
        bad = !at;
        if (at)
            vals[i] = strtod(at + strlen(pat), NULL);
    }
    return bad ? -1 : 0;
}

#endif /* WEFT_PERF_BENCH_UTIL_H */
