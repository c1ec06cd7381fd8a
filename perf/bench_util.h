/* perf/bench_util.h: the helpers every benchmark driver under perf/ shares: the clocks, a
 * sleep that survives signals, the median of a set of timings, and the parsing of integer
 * and comma-separated-list options.
 * Owns: nothing with state; all functions are static inline so each driver stays one file
 * plus this header.
 * Not here: options, the order of runs and the output format of a benchmark (its driver),
 * the workloads. Needs _GNU_SOURCE (sched_getaffinity(), CPU_COUNT()) before any include. */
#ifndef WEFT_PERF_BENCH_UTIL_H
#define WEFT_PERF_BENCH_UTIL_H

#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

#endif /* WEFT_PERF_BENCH_UTIL_H */
