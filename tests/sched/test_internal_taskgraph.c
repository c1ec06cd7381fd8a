/* tests/sched/test_internal_taskgraph.c: a task graph run when no task can be had for a ready
 * node (sched/taskgraph.c, hand_off() and skip_from()). The group fails with WF_ENOMEM naming
 * the node; that node and every node after it finish without running, also when a chain of a
 * million nodes hangs below it (the skip neither recurses nor allocates); the run ends; and
 * the next run, with tasks to be had again, runs every node exactly once (each counter was put
 * back for it). The shared pool's fault injection (wf_runtime.fail_pool, sched/internal.h)
 * stands in for the lack of memory. */
#include "../../sched/internal.h"
#include "wf_test.h"

#include <weft/weft.h>

#include <criterion/criterion.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

TestSuite(sched_internal_taskgraph, .fini = wf_test_fini, .timeout = WF_TEST_TIMEOUT(120));

#define FAN 3 /* successors of the root; each heads a chain */

static wf_runtime *rt_;
static bool inject;      /* the root's function takes the tasks away */
static wf__task *stash;  /* the root's worker's free list, while taken */
static uint32_t n_stash; /* its length */

static int count_fn(void *arg)
{
    (*(unsigned char *)arg)++;
    return 0;
}

/* The root: counts itself; with 'inject', empties its worker's free list and makes the shared
 * pool fail, so that the ready successors it does not run itself get no task. */
static int root_fn(void *arg)
{
    count_fn(arg);
    if (!inject)
        return 0;
    wf__worker *w = wf__self;
    stash = w->free;
    n_stash = w->nfree;
    w->free = NULL;
    w->nfree = 0;
    pthread_mutex_lock(&rt_->pool_mu);
    rt_->fail_pool = 1;
    pthread_mutex_unlock(&rt_->pool_mu);
    return 0;
}

/* Gives the taken tasks to the shared pool and lets it work again. */
static void restore(void)
{
    pthread_mutex_lock(&rt_->pool_mu);
    rt_->fail_pool = 0;
    if (stash) {
        wf__task *t = stash;
        while (t->next)
            t = t->next;
        t->next = rt_->pool;
        rt_->pool = stash;
        rt_->npool += n_stash;
    }
    stash = NULL;
    n_stash = 0;
    pthread_mutex_unlock(&rt_->pool_mu);
}

Test(sched_internal_taskgraph, a_ready_node_without_a_task_fails_the_run_and_skips_what_follows)
{
    /* one worker: every release happens on it, so the first ready successor of the root
     * runs inline and the others need tasks */
    rt_ = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 1 });
    const int len = (int)wf_test_scaled(1000000, 100000); /* nodes of each chain */
    const int n = 1 + FAN * (1 + len);
    unsigned char *ran = calloc((size_t)n, 1);
    int64_t *off = malloc(((size_t)len + 1) * sizeof *off);
    int *preds = malloc((size_t)len * sizeof *preds);
    cr_assert(ran && off && preds);
    static const char *fan_names[FAN] = { "fan0", "fan1", "fan2" };
    int head[FAN];

    wf_taskgraph *g = NULL;
    cr_assert_eq(wf_taskgraph_create(rt_, &g), 0);
    cr_assert_eq(wf_taskgraph_add(g, root_fn, &ran[0], "root"), 0);
    for (int f = 0; f < FAN; f++) {
        int root = 0;
        head[f] = 1 + f * (1 + len); /* ids count up from 0 */
        cr_assert_eq(wf_taskgraph_add_after(g, count_fn, &ran[head[f]], fan_names[f], &root, 1),
                     head[f], "%s", wf_taskgraph_errmsg(g));
        int first = head[f] + 1;
        for (int j = 0; j < len; j++) {
            off[j] = j;
            preds[j] = j ? first + j - 1 : head[f];
        }
        off[len] = len;
        cr_assert_eq(wf_taskgraph_add_nodes(g, count_fn, &ran[first], 1, "chain", len, off, preds),
                     first, "%s", wf_taskgraph_errmsg(g));
    }
    cr_assert_eq(wf_taskgraph_node_count(g), n);

    /* Run 1: the root takes the tasks away. */
    inject = true;
    int rc = wf_taskgraph_run(g);
    restore();
    cr_assert_eq(rc, WF_ENOMEM, "the run returned %s: %s", wf_err_name(rc), wf_taskgraph_errmsg(g));
    cr_assert_eq(ran[0], 1, "the root ran %d times", ran[0]);
    int failed = -1;
    for (int f = 0; f < FAN; f++)
        if (strstr(wf_taskgraph_errmsg(g), fan_names[f]))
            failed = f;
    cr_assert_geq(failed, 0, "the message names no fan node: %s", wf_taskgraph_errmsg(g));
    int skipped = 0;
    for (int f = 0; f < FAN; f++) {
        int ran_here = 0;
        for (int i = head[f]; i <= head[f] + len; i++)
            ran_here += ran[i];
        if (ran_here == 0)
            skipped++;
        else /* the one the root ran itself: no node of its chain ran twice */
            for (int i = head[f]; i <= head[f] + len; i++)
                cr_assert_leq(ran[i], 1, "node %d ran %d times", i, ran[i]);
    }
    /* every fan node but the one the root keeps needed a task: none of them, nor anything
     * after them, ran */
    cr_assert_eq(skipped, FAN - 1, "%d of %d chains were skipped whole", skipped, FAN);
    cr_assert_eq(ran[head[failed]], 0, "the failed node %s ran", fan_names[failed]);

    /* Run 2: tasks again; every node runs exactly once. */
    inject = false;
    memset(ran, 0, (size_t)n);
    rc = wf_taskgraph_run(g);
    cr_assert_eq(rc, 0, "the second run returned %s: %s", wf_err_name(rc), wf_taskgraph_errmsg(g));
    for (int i = 0; i < n; i++)
        cr_assert_eq(ran[i], 1, "run 2: node %d ran %d times", i, ran[i]);

    wf_taskgraph_destroy(g);
    wf_runtime_destroy(rt_);
    free(ran);
    free(off);
    free(preds);
}
