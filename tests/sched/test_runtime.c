/* tests/sched/test_runtime.c: the runtime's life and identity. Worker counts (default,
 * explicit, more than cores), thread names, wf_runtime_current_worker() inside and outside
 * tasks and across two runtimes, WF_RT_NO_PIN, creating and destroying in a loop (with
 * workers busy, spinning or parked), and wf_runtime_opts_from_env(), which is the only place
 * the environment is read. */
#ifndef _GNU_SOURCE
#    define _GNU_SOURCE /* pthread_getname_np */
#endif
#include "wf_test.h"

#include <weft/weft.h>

#include <criterion/criterion.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

TestSuite(sched_runtime, .fini = wf_test_fini, .timeout = WF_TEST_TIMEOUT(60));

Test(sched_runtime, null_opts_give_between_one_and_one_per_cpu_workers)
{
    wf_runtime *rt = wf_test_runtime(NULL);
    int n = wf_runtime_worker_count(rt);
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    cr_assert(n >= 1 && n <= cpus, "%d workers on %ld CPUs", n, cpus);
    cr_assert_geq(wf_runtime_numa_count(rt), 1);
    wf_runtime_destroy(rt);
}

Test(sched_runtime, zero_workers_means_the_default_count)
{
    wf_runtime *rt = wf_test_runtime(NULL);
    int dflt = wf_runtime_worker_count(rt);
    wf_runtime_destroy(rt);
    rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 0 });
    cr_assert_eq(wf_runtime_worker_count(rt), dflt);
    wf_runtime_destroy(rt);
}

Test(sched_runtime, an_explicit_worker_count_is_honoured)
{
    for (int n = 1; n <= 5; n++) {
        wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = n });
        cr_assert_eq(wf_runtime_worker_count(rt), n);
        wf_worker_stats st[5];
        cr_assert_eq(wf_runtime_stats(rt, st, 5), n);
        wf_runtime_destroy(rt);
    }
}

/* ---- Which thread is which ------------------------------------------------------------- */

typedef struct whoami {
    wf_runtime *rt, *other;
    int n_workers;
    atomic_int out_of_range, seen_by_other, bad_name;
    atomic_int ran_on[64];
    char bad_name_text[32];
} whoami;

static int whoami_task(void *arg)
{
    whoami *w = arg;
    int me = wf_runtime_current_worker(w->rt);
    if (me < 0 || me >= w->n_workers) {
        atomic_store(&w->out_of_range, 1);
        return 0;
    }
    atomic_fetch_add(&w->ran_on[me], 1);
    if (w->other && wf_runtime_current_worker(w->other) != -1)
        atomic_store(&w->seen_by_other, 1);
    char name[32] = "", want[32];
    pthread_getname_np(pthread_self(), name, sizeof name);
    snprintf(want, sizeof want, "weft-w%d", me);
    if (strcmp(name, want) != 0 && atomic_exchange(&w->bad_name, 1) == 0)
        snprintf(w->bad_name_text, sizeof w->bad_name_text, "%s", name);
    wf_test_busy_ns(20000);
    return 0;
}

static void run_whoami(whoami *w, int tasks)
{
    wf_group g;
    cr_assert_eq(wf_group_init(&g, w->rt), 0);
    for (int i = 0; i < tasks; i++)
        cr_assert_eq(wf_spawn(&g, whoami_task, w), 0);
    cr_assert_eq(wf_group_wait(&g), 0);
    wf_group_deinit(&g);
}

Test(sched_runtime, current_worker_outside_the_workers_is_minus_one)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 2 });
    cr_assert_eq(wf_runtime_current_worker(rt), -1);
    wf_runtime_destroy(rt);
}

Test(sched_runtime, current_worker_inside_a_task_is_a_worker_index)
{
    whoami w = { .n_workers = 4 };
    w.rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 4 });
    run_whoami(&w, 400);
    cr_assert_eq(atomic_load(&w.out_of_range), 0, "a task saw a worker index outside [0, 4)");
    wf_runtime_destroy(w.rt);
}

Test(sched_runtime, worker_threads_are_named_weft_w_and_their_index)
{
    whoami w = { .n_workers = 3 };
    w.rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 3 });
    run_whoami(&w, 300);
    cr_assert_eq(atomic_load(&w.bad_name), 0, "a worker thread is named \"%s\"", w.bad_name_text);
    wf_runtime_destroy(w.rt);
}

Test(sched_runtime, a_worker_of_one_runtime_is_not_a_worker_of_another)
{
    whoami w = { .n_workers = 2 };
    w.rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 2 });
    w.other = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 2 });
    run_whoami(&w, 100);
    cr_assert_eq(atomic_load(&w.seen_by_other), 0,
                 "a worker of one runtime is a worker of the other too");
    cr_assert_eq(wf_runtime_current_worker(w.other), -1);
    wf_runtime_destroy(w.other);
    wf_runtime_destroy(w.rt);
}

Test(sched_runtime, more_workers_than_cores_all_run_tasks)
{
    whoami w = { .n_workers = 16 };
    w.rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 16 });
    cr_assert_eq(wf_runtime_worker_count(w.rt), 16);
    run_whoami(&w, 3000);
    cr_assert_eq(atomic_load(&w.out_of_range), 0);
    int used = 0;
    for (int i = 0; i < 16; i++)
        used += atomic_load(&w.ran_on[i]) > 0;
    cr_assert_geq(used, 2, "3000 tasks of 20 us ran on %d of 16 workers", used);
    wf_runtime_destroy(w.rt);
}

Test(sched_runtime, no_pin_leaves_every_worker_unpinned)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 2, .flags = WF_RT_NO_PIN });
    wf_worker_stats st[2];
    cr_assert_eq(wf_runtime_stats(rt, st, 2), 2);
    for (int i = 0; i < 2; i++)
        cr_assert_eq(st[i].cpu, -1, "worker %d reports cpu %d with WF_RT_NO_PIN", i, st[i].cpu);
    wf_runtime_destroy(rt);
}

Test(sched_runtime, two_runtimes_run_their_tasks_side_by_side)
{
    whoami a = { .n_workers = 2 }, b = { .n_workers = 2 };
    a.rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 2 });
    b.rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 2 });
    wf_group ga, gb;
    cr_assert_eq(wf_group_init(&ga, a.rt), 0);
    cr_assert_eq(wf_group_init(&gb, b.rt), 0);
    for (int i = 0; i < 200; i++) {
        cr_assert_eq(wf_spawn(&ga, whoami_task, &a), 0);
        cr_assert_eq(wf_spawn(&gb, whoami_task, &b), 0);
    }
    cr_assert_eq(wf_group_wait(&ga), 0);
    cr_assert_eq(wf_group_wait(&gb), 0);
    cr_assert_eq(atomic_load(&a.out_of_range) + atomic_load(&b.out_of_range), 0,
                 "a task ran on a thread that is not a worker of its own runtime");
    wf_group_deinit(&ga);
    wf_group_deinit(&gb);
    wf_runtime_destroy(a.rt);
    wf_runtime_destroy(b.rt);
}

typedef struct cross {
    wf_runtime *other;
    atomic_int ran;
} cross;

static int other_child(void *arg)
{
    atomic_fetch_add(&((cross *)arg)->ran, 1);
    return 0;
}

static int cross_parent(void *arg)
{
    cross *c = arg;
    wf_group g;
    int rc = wf_group_init(&g, c->other);
    for (int i = 0; rc == 0 && i < 100; i++)
        rc = wf_spawn(&g, other_child, c);
    int wrc = wf_group_wait(&g);
    wf_group_deinit(&g);
    return rc ? rc : wrc;
}

Test(sched_runtime, a_task_may_spawn_into_and_wait_for_a_group_of_another_runtime)
{
    wf_runtime *a = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 2 });
    cross c = { .other = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 2 }) };
    wf_group g;
    cr_assert_eq(wf_group_init(&g, a), 0);
    for (int i = 0; i < 4; i++)
        cr_assert_eq(wf_spawn(&g, cross_parent, &c), 0);
    int rc = wf_group_wait(&g);
    cr_assert_eq(rc, 0, "%s: %s", wf_err_name(rc), wf_group_errmsg(&g));
    cr_assert_eq(atomic_load(&c.ran), 400);
    wf_group_deinit(&g);
    wf_runtime_destroy(c.other);
    wf_runtime_destroy(a);
}

/* ---- Create and destroy ------------------------------------------------------------------- */

static int tiny(void *arg)
{
    atomic_fetch_add((atomic_int *)arg, 1);
    return 0;
}

/* Destroy right after create (workers may not have started), after a burst (workers
 * spinning), and after a pause (workers parked). */
Test(sched_runtime, create_and_destroy_in_a_loop_neither_hangs_nor_leaks)
{
    int rounds = (int)wf_test_scaled(150, 30);
    for (int r = 0; r < rounds; r++) {
        wf_runtime *rt =
            wf_test_runtime(&(wf_runtime_opts){ .n_workers = 1 + r % 4, .spin_us = r % 2 ? 1 : 0 });
        if (r % 3 != 0) {
            wf_group g;
            atomic_int n = 0;
            cr_assert_eq(wf_group_init(&g, rt), 0);
            for (int i = 0; i < 10; i++)
                cr_assert_eq(wf_spawn(&g, tiny, &n), 0);
            cr_assert_eq(wf_group_wait(&g), 0);
            cr_assert_eq(atomic_load(&n), 10);
            wf_group_deinit(&g);
            if (r % 3 == 2)
                wf_test_sleep_us(2000);
        }
        wf_runtime_destroy(rt);
    }
}

Test(sched_runtime, destroy_null_is_a_noop)
{
    wf_runtime_destroy(NULL);
}

/* ---- Options from the environment --------------------------------------------------------- */

static bool same_opts(const wf_runtime_opts *a, const wf_runtime_opts *b)
{
    return a->n_workers == b->n_workers && a->flags == b->flags && a->topology == b->topology &&
           a->trace_events == b->trace_events && a->spin_us == b->spin_us;
}

Test(sched_runtime, opts_from_env_reads_workers_topology_no_pin_and_trace)
{
    setenv("WEFT_WORKERS", "3", 1);
    setenv("WEFT_TOPOLOGY", "numa:2 core:2 pu:1", 1);
    setenv("WEFT_NO_PIN", "1", 1);
    setenv("WEFT_TRACE", "/tmp/weft-trace.json", 1);
    wf_runtime_opts o = { .spin_us = 7 };
    const char *path = NULL;
    int rc = wf_runtime_opts_from_env(&o, &path);
    cr_assert_eq(rc, 0, "%s: %s", wf_err_name(rc), wf_last_errmsg());
    cr_assert_eq(o.n_workers, 3);
    cr_assert_str_eq(o.topology, "numa:2 core:2 pu:1");
    cr_assert(o.flags & WF_RT_NO_PIN);
    cr_assert_eq(o.trace_events, (size_t)1 << 20);
    cr_assert_not_null(path);
    cr_assert_str_eq(path, "/tmp/weft-trace.json");
    cr_assert_eq(o.spin_us, 7, "a field the environment does not name changed");
}

Test(sched_runtime, opts_from_env_keeps_a_trace_size_already_set)
{
    setenv("WEFT_TRACE", "/tmp/weft-trace.json", 1);
    wf_runtime_opts o = { .trace_events = 100 };
    cr_assert_eq(wf_runtime_opts_from_env(&o, NULL), 0, "%s", wf_last_errmsg());
    cr_assert_eq(o.trace_events, 100);
}

Test(sched_runtime, opts_from_env_without_variables_changes_nothing)
{
    unsetenv("WEFT_WORKERS");
    unsetenv("WEFT_TOPOLOGY");
    unsetenv("WEFT_NO_PIN");
    unsetenv("WEFT_TRACE");
    wf_runtime_opts o = { .n_workers = 5, .spin_us = 9, .flags = 0 }, before = o;
    const char *path = "untouched";
    cr_assert_eq(wf_runtime_opts_from_env(&o, &path), 0);
    cr_assert(same_opts(&o, &before), "options changed without any WEFT_ variable");
}

Test(sched_runtime, opts_from_env_refuses_a_malformed_worker_count_and_changes_nothing)
{
    const char *bad[] = { "abc", "4x", "99999999999999999999" };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv("WEFT_WORKERS", bad[i], 1);
        setenv("WEFT_NO_PIN", "1", 1);
        wf_runtime_opts o = { .n_workers = 2 }, before = o;
        int rc = wf_runtime_opts_from_env(&o, NULL);
        cr_assert_eq(rc, WF_EINVAL, "WEFT_WORKERS=%s gave %s", bad[i], wf_err_name(rc));
        cr_assert(strstr(wf_last_errmsg(), bad[i]) != NULL, "message \"%s\" does not quote \"%s\"",
                  wf_last_errmsg(), bad[i]);
        cr_assert(same_opts(&o, &before), "WEFT_WORKERS=%s changed opts", bad[i]);
    }
}

Test(sched_runtime, runtime_create_reads_no_environment)
{
    wf_runtime *rt = wf_test_runtime(NULL);
    int workers = wf_runtime_worker_count(rt), nodes = wf_runtime_numa_count(rt);
    wf_runtime_destroy(rt);
    setenv("WEFT_WORKERS", "7", 1);
    setenv("WEFT_TOPOLOGY", "numa:3 core:3 pu:1", 1);
    rt = wf_test_runtime(NULL);
    cr_assert_eq(wf_runtime_worker_count(rt), workers, "WEFT_WORKERS reached wf_runtime_create");
    cr_assert_eq(wf_runtime_numa_count(rt), nodes, "WEFT_TOPOLOGY reached wf_runtime_create");
    wf_runtime_destroy(rt);
}
