/* tests/sched/test_local_rank.c: where the workers of one of several ranks on a machine are
 * pinned (wf_runtime_opts.local_rank/local_size): the local ranks' workers are on disjoint
 * cores while there are cores enough, n_workers 0 means one per core of the rank's run, more
 * ranks than cores wrap around, bad values are refused with a message, and
 * wf_runtime_opts_from_env() reads WEFT_LOCAL_RANK and WEFT_LOCAL_SIZE. */
#ifndef _GNU_SOURCE
#    define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#endif
#include "wf_test.h"

#include <weft/weft.h>

#include <criterion/criterion.h>

#include <sched.h>
#include <stdlib.h>
#include <string.h>

TestSuite(sched_local_rank, .fini = wf_test_fini, .timeout = WF_TEST_TIMEOUT(60));

/* The cores this process may use, as hwloc counts them (one per core, or per PU without
 * cores): the worker count of a default runtime. */
static int cores(void)
{
    wf_runtime *rt = wf_test_runtime(NULL);
    int n = wf_runtime_worker_count(rt);
    wf_runtime_destroy(rt);
    return n;
}

/* The CPU each worker of 'rt' is pinned to (-1: unpinned), into 'cpu' (n entries). */
static int worker_cpus(wf_runtime *rt, int *cpu, int n)
{
    wf_worker_stats st[64];
    int nw = wf_runtime_stats(rt, st, 64);
    cr_assert_geq(nw, 1);
    for (int i = 0; i < nw && i < n; i++)
        cpu[i] = st[i].cpu;
    return nw;
}

Test(sched_local_rank, two_local_ranks_pin_their_workers_to_disjoint_cores)
{
    int c = cores();
    wf_runtime *a = wf_test_runtime(&(wf_runtime_opts){ .local_rank = 0, .local_size = 2 });
    wf_runtime *b = wf_test_runtime(&(wf_runtime_opts){ .local_rank = 1, .local_size = 2 });
    int ca[64], cb[64];
    int na = worker_cpus(a, ca, 64), nb = worker_cpus(b, cb, 64);
    if (c >= 2) {
        cr_assert_eq(na, c / 2, "rank 0 of 2 on %d cores has %d workers", c, na);
        cr_assert_eq(nb, c - c / 2, "rank 1 of 2 on %d cores has %d workers", c, nb);
    } else {
        cr_assert_eq(na, 1);
        cr_assert_eq(nb, 1);
    }
    for (int i = 0; i < na; i++)
        for (int j = 0; j < nb; j++) {
            if (ca[i] < 0 || cb[j] < 0)
                continue; /* pinning refused here (a restricted cpuset): nothing to compare */
            if (c >= 2)
                cr_assert_neq(ca[i], cb[j],
                              "rank 0's worker %d and rank 1's worker %d share cpu %d", i, j,
                              ca[i]);
        }
    wf_runtime_destroy(a);
    wf_runtime_destroy(b);
}

Test(sched_local_rank, one_local_rank_pins_as_a_plain_runtime)
{
    wf_runtime *a = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 2 });
    wf_runtime *b = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 2, .local_size = 1 });
    int ca[2], cb[2];
    cr_assert_eq(worker_cpus(a, ca, 2), 2);
    cr_assert_eq(worker_cpus(b, cb, 2), 2);
    cr_assert_eq(ca[0], cb[0]);
    cr_assert_eq(ca[1], cb[1]);
    wf_runtime_destroy(a);
    wf_runtime_destroy(b);
}

Test(sched_local_rank, more_local_ranks_than_cores_wrap_around_with_one_worker_each)
{
    int c = cores(), L = c + 1;
    int first = -2;
    for (int l = 0; l < L; l++) {
        wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .local_rank = l, .local_size = L });
        int cpu[64];
        cr_assert_eq(worker_cpus(rt, cpu, 64), 1, "rank %d of %d on %d cores", l, L, c);
        if (l == 0)
            first = cpu[0];
        else if (l == c)
            cr_assert_eq(cpu[0], first, "rank %d of %d on %d cores is not on rank 0's core", l, L,
                         c);
        wf_runtime_destroy(rt);
    }
}

Test(sched_local_rank, bad_local_ranks_are_refused_with_a_message)
{
    const wf_runtime_opts bad[] = { { .local_rank = 2, .local_size = 2 },
                                    { .local_rank = -1, .local_size = 2 },
                                    { .local_rank = 1, .local_size = 0 },
                                    { .local_rank = 0, .local_size = -3 },
                                    { .local_rank = 0, .local_size = 5000 } };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        wf_runtime *rt = (wf_runtime *)1;
        int rc = wf_runtime_create(&rt, &bad[i]);
        cr_assert_eq(rc, WF_EINVAL, "case %zu gave %s", i, wf_err_name(rc));
        cr_assert_null(rt);
        cr_assert(strstr(wf_last_errmsg(), "local_rank") != NULL, "message: %s", wf_last_errmsg());
    }
}

Test(sched_local_rank, opts_from_env_reads_the_local_rank_and_size)
{
    setenv("WEFT_LOCAL_RANK", "1", 1);
    setenv("WEFT_LOCAL_SIZE", "3", 1);
    wf_runtime_opts o = { .spin_us = 5 };
    cr_assert_eq(wf_runtime_opts_from_env(&o, NULL), 0, "%s", wf_last_errmsg());
    cr_assert_eq(o.local_rank, 1);
    cr_assert_eq(o.local_size, 3);
    cr_assert_eq(o.spin_us, 5);
    setenv("WEFT_LOCAL_RANK", "3", 1); /* not below the size */
    wf_runtime_opts p = { 0 };
    cr_assert_eq(wf_runtime_opts_from_env(&p, NULL), WF_EINVAL);
    cr_assert(strstr(wf_last_errmsg(), "WEFT_LOCAL_RANK=3") != NULL, "%s", wf_last_errmsg());
    cr_assert_eq(p.local_rank, 0, "a refused environment changed opts");
    setenv("WEFT_LOCAL_SIZE", "two", 1);
    cr_assert_eq(wf_runtime_opts_from_env(&p, NULL), WF_EINVAL);
    cr_assert(strstr(wf_last_errmsg(), "two") != NULL, "%s", wf_last_errmsg());
    unsetenv("WEFT_LOCAL_RANK");
    unsetenv("WEFT_LOCAL_SIZE");
}
