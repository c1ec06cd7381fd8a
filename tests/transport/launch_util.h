/* tests/transport/launch_util.h: what the weft-run tests share: running a command and
 * reading its output, weft-run on the test executable itself, a scratch directory, the final hash
 * restart_train prints, byte comparison of two files, a pair of free loopback ports, and waiting
 * for processes to go. Not here: the ranks of those tests (restart_train.c, or the test executable
 * itself). */
#ifndef WF_TEST_LAUNCH_UTIL_H
#define WF_TEST_LAUNCH_UTIL_H

#include "transport_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* Runs 'cmd' (sh -c), stdout and stderr into 'out'; returns its exit status (-1: no exit).
 * The ranks it starts inherit tu_ucx_env()'s setting (ThreadSanitizer builds). */
static inline int lu_run(const char *cmd, char *out, size_t cap)
{
    tu_ucx_env();
    char full[8192];
    snprintf(full, sizeof full, "%s 2>&1", cmd);
    FILE *p = popen(full, "r");
    cr_assert_not_null(p);
    size_t len = 0, k;
    while (len + 1 < cap && (k = fread(out + len, 1, cap - 1 - len, p)) > 0)
        len += k;
    out[len] = 0;
    char sink[4096]; /* what did not fit: read on, so that the command is never blocked */
    while (fread(sink, 1, sizeof sink, p) > 0) {
    }
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Runs "weft-run -n 'n' 'opts' -- <this executable>" with 'env'='mode' in the environment
 * (the ranks' body is chosen by it) under a 'timeout_s' limit; returns weft-run's exit
 * status (it must exit) and its output in 'out'. */
#ifdef WF_WEFT_RUN
static inline int lu_launch_self(const char *env, const char *mode, int timeout_s, int n,
                                 const char *opts, char *out, size_t cap)
{
    char self[4096];
    ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
    cr_assert_gt(k, 0);
    self[k] = 0;
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "%s=%s timeout %d %s -n %d %s -- %s", env, mode, timeout_s,
             WF_WEFT_RUN, n, opts, self);
    int rc = lu_run(cmd, out, cap);
    cr_assert_geq(rc, 0, "weft-run did not exit: %s", out);
    return rc;
}
#endif

/* A new empty directory under /tmp, its path in 'dir' (cap >= 64). */
static inline void lu_tmpdir(char *dir, size_t cap)
{
    snprintf(dir, cap, "/tmp/wf-restart-XXXXXX");
    cr_assert_not_null(mkdtemp(dir), "mkdtemp");
}

static inline void lu_rmdir(const char *dir)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}

/* The hash of "[R] rank R final step S hash H" in 'out' for rank 'r'; 0 if missing. */
static inline unsigned long long lu_final_hash(const char *out, int r)
{
    char head[64];
    snprintf(head, sizeof head, "[%d] rank %d final step", r, r);
    const char *p = strstr(out, head);
    unsigned long long h = 0;
    long s;
    if (!p || sscanf(p + strlen(head), " %ld hash %llx", &s, &h) != 2)
        return 0;
    return h;
}

/* Whether the two files hold the same bytes (false if either is missing). */
static inline bool lu_same_file(const char *a, const char *b)
{
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    bool same = fa && fb;
    while (same) {
        int ca = fgetc(fa), cb = fgetc(fb);
        same = ca == cb;
        if (ca == EOF || cb == EOF)
            break;
    }
    if (fa)
        fclose(fa);
    if (fb)
        fclose(fb);
    return same;
}

/* Occurrences of 'needle' in 'hay'. */
static inline int lu_count(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle))
        n++;
    return n;
}

/* A loopback port p with p + 1 free too (the rendezvous and node 0's launcher link). */
static inline int lu_free_port_pair(void)
{
    for (int tries = 0; tries < 100; tries++) {
        int p = tu_free_port();
        if (tu_port_free(p + 1)) /* p <= 32767: p + 1 is a port */
            return p;
    }
    cr_assert_fail("no two free consecutive ports");
    return -1;
}

/* Whether process 'pid' is gone (no such process, or a zombie not yet reaped). */
static inline bool lu_gone(pid_t pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return true;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *close_paren = strrchr(buf, ')');
    return close_paren && close_paren[1] == ' ' && close_paren[2] == 'Z';
}

#endif /* WF_TEST_LAUNCH_UTIL_H */
