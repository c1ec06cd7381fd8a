/* tests/sched/test_deque.c: work distribution, through the public API. Owners push and pop
 * their deques while thieves steal and outside threads feed the inboxes, over millions of
 * tasks: every task runs exactly once (a per-task counter slot ends at 1), and with more
 * than one worker thieves win steals. Four workers even on 2 cores, so that owners are
 * preempted mid-push and mid-pop. */
#include "wf_test.h"

#include <weft/weft.h>

#include <criterion/criterion.h>

#include <pthread.h>
#include <stdlib.h>

TestSuite(sched_deque, .fini = wf_test_fini, .timeout = WF_TEST_TIMEOUT(120));

/* The workload of one test: one counter slot per task. Tasks find it through this file's
 * pointer 'cur' because their argument is the slot (or the index) itself. */
typedef struct workload {
    wf_group g;
    atomic_uint *runs;
    int64_t *end; /* recursive tree: the end of the range a task covers */
    long n;
    atomic_long spawn_failures;
} workload;

static workload *cur;

static workload *workload_new(wf_runtime *rt, long n)
{
    workload *w = calloc(1, sizeof *w);
    cr_assert_not_null(w);
    w->runs = calloc((size_t)n, sizeof *w->runs);
    cr_assert_not_null(w->runs);
    w->n = n;
    int rc = wf_group_init(&w->g, rt);
    cr_assert_eq(rc, 0, "wf_group_init: %s", wf_err_name(rc));
    cur = w;
    return w;
}

static void workload_free(workload *w)
{
    wf_group_deinit(&w->g);
    free(w->runs);
    free(w->end);
    free(w);
    cur = NULL;
}

static void spawn_or_count(wf_task_fn fn, void *arg)
{
    if (wf_spawn(&cur->g, fn, arg) != 0)
        atomic_fetch_add(&cur->spawn_failures, 1);
}

/* Every slot is 1: names the first slot that is not, and how many are not. */
static void assert_each_ran_once(const workload *w)
{
    cr_assert_eq(atomic_load(&w->spawn_failures), 0, "%ld spawns failed",
                 atomic_load(&w->spawn_failures));
    long bad = 0, first = -1;
    unsigned first_val = 0;
    for (long i = 0; i < w->n; i++) {
        unsigned v = atomic_load_explicit(&w->runs[i], memory_order_relaxed);
        if (v != 1) {
            if (first < 0) {
                first = i;
                first_val = v;
            }
            bad++;
        }
    }
    cr_assert_eq(bad, 0, "%ld of %ld tasks did not run exactly once; first: task %ld ran %u times",
                 bad, w->n, first, first_val);
}

static void wait_group(workload *w)
{
    int rc = wf_group_wait(&w->g);
    cr_assert_eq(rc, 0, "wf_group_wait: %s: %s", wf_err_name(rc), wf_group_errmsg(&w->g));
}

/* ---- Flat fan-out: one task on a worker spawns every other task ---------------------- */

static int leaf(void *arg)
{
    atomic_fetch_add_explicit((atomic_uint *)arg, 1, memory_order_relaxed);
    return 0;
}

static int fanout_root(void *arg)
{
    workload *w = arg;
    for (long i = 0; i < w->n; i++)
        spawn_or_count(leaf, &w->runs[i]);
    return 0;
}

static void run_fanout(wf_runtime *rt, workload *w)
{
    int rc = wf_spawn(&w->g, fanout_root, w);
    cr_assert_eq(rc, 0, "wf_spawn: %s", wf_err_name(rc));
    wait_group(w);
}

Test(sched_deque, every_task_of_a_fanout_from_one_worker_runs_exactly_once)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 4 });
    workload *w = workload_new(rt, wf_test_scaled(2000000, 200000));
    run_fanout(rt, w);
    assert_each_ran_once(w);
    workload_free(w);
    wf_runtime_destroy(rt);
}

Test(sched_deque, thieves_win_steals_when_one_worker_spawns_many_tasks)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 4 });
    workload *w = workload_new(rt, wf_test_scaled(2000000, 200000));
    run_fanout(rt, w);
    wf_worker_stats st[4];
    int n = wf_runtime_stats(rt, st, 4);
    cr_assert_eq(n, 4);
    uint64_t won = WF_TEST_SUM(st, n, steals_won);
    cr_assert_gt(won, 0, "no steal won over %ld tasks spawned by one worker (tried %llu)", w->n,
                 (unsigned long long)WF_TEST_SUM(st, n, steals_tried));
    workload_free(w);
    wf_runtime_destroy(rt);
}

Test(sched_deque, every_task_runs_exactly_once_with_a_single_worker)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 1 });
    workload *w = workload_new(rt, wf_test_scaled(500000, 50000));
    run_fanout(rt, w);
    assert_each_ran_once(w);
    workload_free(w);
    wf_runtime_destroy(rt);
}

/* ---- Recursive spawns: every task spawns two, so every owner pushes and pops --------- */

/* Task 'lo' covers [lo, end[lo]): it counts itself and splits the rest in two halves. */
static int tree_task(void *arg)
{
    int64_t lo = (int64_t)(intptr_t)arg, hi = cur->end[lo];
    atomic_fetch_add_explicit(&cur->runs[lo], 1, memory_order_relaxed);
    int64_t first = lo + 1, mid = first + (hi - first) / 2;
    if (mid > first) {
        cur->end[first] = mid;
        spawn_or_count(tree_task, (void *)(intptr_t)first);
    }
    if (hi > mid) {
        cur->end[mid] = hi;
        spawn_or_count(tree_task, (void *)(intptr_t)mid);
    }
    return 0;
}

Test(sched_deque, every_task_of_a_recursive_spawn_tree_runs_exactly_once)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 4 });
    workload *w = workload_new(rt, wf_test_scaled(1L << 21, 1L << 17));
    w->end = calloc((size_t)w->n, sizeof *w->end);
    cr_assert_not_null(w->end);
    w->end[0] = w->n;
    int rc = wf_spawn(&w->g, tree_task, (void *)(intptr_t)0);
    cr_assert_eq(rc, 0);
    wait_group(w);
    assert_each_ran_once(w);
    workload_free(w);
    wf_runtime_destroy(rt);
}

/* ---- Tasks that spawn while their siblings are being stolen -------------------------- */

/* The first half of the slots are parents; parent i also spawns child n/2 + i. */
static int parent_task(void *arg)
{
    atomic_uint *slot = arg;
    atomic_fetch_add_explicit(slot, 1, memory_order_relaxed);
    spawn_or_count(leaf, slot + cur->n / 2);
    return 0;
}

static int parents_root(void *arg)
{
    workload *w = arg;
    for (long i = 0; i < w->n / 2; i++)
        spawn_or_count(parent_task, &w->runs[i]);
    return 0;
}

Test(sched_deque, tasks_that_spawn_while_siblings_are_stolen_each_run_exactly_once)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 4 });
    workload *w = workload_new(rt, wf_test_scaled(2000000, 200000));
    int rc = wf_spawn(&w->g, parents_root, w);
    cr_assert_eq(rc, 0);
    wait_group(w);
    assert_each_ran_once(w);
    workload_free(w);
    wf_runtime_destroy(rt);
}

/* ---- Outside threads feed the inboxes while workers spawn into their deques ---------- */

enum { OUTSIDE_THREADS = 3, CHILDREN = 3 };

typedef struct feeder {
    workload *w;
    long first, count; /* roots first .. first+count-1, each owning 1 + CHILDREN slots */
} feeder;

static int outside_root(void *arg)
{
    atomic_uint *slot = arg;
    atomic_fetch_add_explicit(slot, 1, memory_order_relaxed);
    for (int c = 1; c <= CHILDREN; c++)
        spawn_or_count(leaf, slot + c);
    return 0;
}

static void *feed(void *arg)
{
    feeder *f = arg;
    for (long r = f->first; r < f->first + f->count; r++)
        spawn_or_count(outside_root, &f->w->runs[r * (1 + CHILDREN)]);
    return NULL;
}

Test(sched_deque, tasks_spawned_from_outside_threads_and_from_workers_each_run_exactly_once)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 4 });
    long roots = wf_test_scaled(100000, 10000);
    workload *w = workload_new(rt, roots * OUTSIDE_THREADS * (1 + CHILDREN));
    pthread_t t[OUTSIDE_THREADS];
    feeder f[OUTSIDE_THREADS];
    for (int i = 0; i < OUTSIDE_THREADS; i++) {
        f[i] = (feeder){ .w = w, .first = i * roots, .count = roots };
        cr_assert_eq(pthread_create(&t[i], NULL, feed, &f[i]), 0);
    }
    /* wf_group_wait() may only start once no outside thread spawns any more. */
    for (int i = 0; i < OUTSIDE_THREADS; i++)
        pthread_join(t[i], NULL);
    wait_group(w);
    assert_each_ran_once(w);
    workload_free(w);
    wf_runtime_destroy(rt);
}

Test(sched_deque, a_group_reused_for_many_rounds_runs_each_task_exactly_once)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 4 });
    long per_round = 1000, rounds = wf_test_scaled(500, 50);
    workload *w = workload_new(rt, per_round * rounds);
    for (long r = 0; r < rounds; r++) {
        for (long i = 0; i < per_round; i++)
            spawn_or_count(leaf, &w->runs[r * per_round + i]);
        wait_group(w);
        /* After the wait, every task of this round has run: none is left for later. */
        for (long i = 0; i < per_round; i++)
            cr_assert_eq(atomic_load(&w->runs[r * per_round + i]), 1,
                         "round %ld: task %ld had not run when wf_group_wait returned", r, i);
    }
    assert_each_ran_once(w);
    workload_free(w);
    wf_runtime_destroy(rt);
}
