/* tests/support/wf_test.h: helpers shared by the Criterion suites of weft.
 * Owns: loop sizing (full, quick, ThreadSanitizer), the per-suite leak check under
 * AddressSanitizer, clocks, polling waits with deadlines, a seeded PRNG, and a runtime
 * constructor that fails the test with weft's message.
 * Not here: anything that looks inside weft; tests use public headers only. */
#ifndef WF_TEST_H
#define WF_TEST_H

#include <weft/weft.h>

#include <criterion/criterion.h>

#include <dirent.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#if defined(__SANITIZE_THREAD__)
#    define WF_TEST_TSAN 1
#elif defined(__has_feature)
#    if __has_feature(thread_sanitizer)
#        define WF_TEST_TSAN 1
#    endif
#endif
#ifndef WF_TEST_TSAN
#    define WF_TEST_TSAN 0
#endif

#if defined(__SANITIZE_ADDRESS__)
#    define WF_TEST_ASAN 1
#elif defined(__has_feature)
#    if __has_feature(address_sanitizer)
#        define WF_TEST_ASAN 1
#    endif
#endif
#ifndef WF_TEST_ASAN
#    define WF_TEST_ASAN 0
#endif

#if WF_TEST_ASAN
#    include <sanitizer/lsan_interface.h>
#    include <stdio.h>
#endif

/* Per-test timeouts, in seconds, for the suites' '.timeout': a deadlock fails the test
 * instead of hanging CI. ThreadSanitizer runs these tests 5-15x slower on the 2-core CI
 * machines, so its limits are wider; the loops are also smaller there (wf_test_scaled). */
#if WF_TEST_TSAN
#    define WF_TEST_TIMEOUT(seconds) ((seconds)*6.0)
#elif WF_TEST_ASAN
#    define WF_TEST_TIMEOUT(seconds) ((seconds)*3.0)
#else
#    define WF_TEST_TIMEOUT(seconds) ((seconds)*1.0)
#endif

/* True under ThreadSanitizer or when WF_TEST_QUICK is set to something other than "0". */
static inline bool wf_test_quick(void)
{
    const char *q = getenv("WF_TEST_QUICK");
    return WF_TEST_TSAN || (q && *q && strcmp(q, "0") != 0);
}

/* 'full' normally, 'quick' under ThreadSanitizer or WF_TEST_QUICK=1. */
static inline long wf_test_scaled(long full, long quick)
{
    return wf_test_quick() ? quick : full;
}

/* Suite '.fini': under AddressSanitizer, fails the run if the test leaked. Criterion ignores
 * LeakSanitizer's exit code (the report comes after the test reported success), and an
 * assertion in '.fini' does not fail the test; an abort there is reported as "crashed during
 * its setup or teardown" and makes the executable exit non-zero. */
static inline void wf_test_fini(void)
{
#if WF_TEST_ASAN
    if (__lsan_do_recoverable_leak_check() != 0) {
        fprintf(stderr, "wf_test_fini: the test leaked memory (LeakSanitizer report above)\n");
        abort();
    }
#endif
}

/* Removes directory 'd' and the plain files in it (a test's scratch directory). */
static inline void wf_test_rm_dir(const char *d)
{
    DIR *dp = opendir(d);
    if (!dp)
        return;
    struct dirent *de;
    char p[512];
    while ((de = readdir(dp)))
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) {
            snprintf(p, sizeof p, "%s/%s", d, de->d_name);
            unlink(p);
        }
    closedir(dp);
    rmdir(d);
}

static inline uint64_t wf_test_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline void wf_test_sleep_us(long us)
{
    struct timespec ts = { .tv_sec = us / 1000000, .tv_nsec = (us % 1000000) * 1000 };
    while (nanosleep(&ts, &ts) != 0) {
    }
}

/* Spins for about 'ns' nanoseconds: a task body that takes time without sleeping. */
static inline void wf_test_busy_ns(uint64_t ns)
{
    uint64_t end = wf_test_now_ns() + ns;
    while (wf_test_now_ns() < end) {
    }
}

/* Polls '*counter' until it reaches 'target' or 'seconds' pass; returns whether it did. */
static inline bool wf_test_wait_for(atomic_long *counter, long target, double seconds)
{
    uint64_t deadline = wf_test_now_ns() + (uint64_t)(seconds * 1e9);
    while (atomic_load(counter) < target) {
        if (wf_test_now_ns() > deadline)
            return false;
        wf_test_sleep_us(50);
    }
    return true;
}

/* splitmix64: a fixed seed gives the same sequence on every machine. */
static inline uint64_t wf_test_rand(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

/* A number in [0, n). */
static inline uint64_t wf_test_rand_below(uint64_t *state, uint64_t n)
{
    return n ? wf_test_rand(state) % n : 0;
}

/* Creates a runtime or fails the test with weft's message. */
static inline wf_runtime *wf_test_runtime(const wf_runtime_opts *opts)
{
    wf_runtime *rt = NULL;
    int rc = wf_runtime_create(&rt, opts);
    cr_assert_eq(rc, 0, "wf_runtime_create: %s: %s", wf_err_name(rc), wf_last_errmsg());
    cr_assert_not_null(rt);
    return rt;
}

/* Sums one counter over the first 'n' workers' stats. */
#define WF_TEST_SUM(stats, n, field)     \
    ({                                   \
        uint64_t sum_ = 0;               \
        for (int i_ = 0; i_ < (n); i_++) \
            sum_ += (stats)[i_].field;   \
        sum_;                            \
    })

#endif /* WF_TEST_H */
