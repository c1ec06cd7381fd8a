/* hello_tasks.c: weft's scheduler in one page: a task graph built once and run twice, a
 * task that fails with a message, and a parallel loop. The README shows this file as it is.
 * Build: cc hello_tasks.c $(pkg-config --cflags --libs weft) -o hello_tasks */
#include <weft/weft.h>

#include <stdio.h>
#include <stdlib.h>

static int step(void *arg) /* a task body: >= 0 is success, a negative wf_status fails it */
{
    printf("  %s\n", (const char *)arg);
    return 0;
}

static int read_config(void *arg)
{
    return wf_task_fail(WF_EIO, "cannot open '%s'", (const char *)arg);
}

static int square(void *ctx, int64_t begin, int64_t end) /* a loop body over [begin, end) */
{
    double *v = ctx;
    for (int64_t i = begin; i < end; i++)
        v[i] = (double)i * (double)i;
    return 0;
}

int main(void)
{
    wf_runtime *rt;
    if (wf_runtime_create(&rt, NULL) < 0) { /* NULL options: one worker per core */
        fprintf(stderr, "wf_runtime_create: %s\n", wf_last_errmsg());
        return 1;
    }
    printf("%d workers on %d NUMA node(s)\n", wf_runtime_worker_count(rt),
           wf_runtime_numa_count(rt));

    /* load -> (parse, index) -> save: parse and index may run at the same time. */
    const char *const names[] = { "load", "parse", "index", "save" };
    const int edges[][2] = { { 0, 1 }, { 0, 2 }, { 1, 3 }, { 2, 3 } };
    wf_taskgraph *g;
    int rc = wf_taskgraph_create(rt, &g);
    for (int i = 0; i < 4 && rc >= 0; i++)
        rc = wf_taskgraph_add(g, step, (void *)names[i], names[i]); /* ids count up from 0 */
    for (int e = 0; e < 4 && rc >= 0; e++)
        rc = wf_taskgraph_precede(g, edges[e][0], edges[e][1]);
    for (int run = 0; run < 2 && rc >= 0; run++) {
        printf("graph run %d:\n", run + 1);
        rc = wf_taskgraph_run(g);
    }
    if (rc < 0)
        fprintf(stderr, "task graph: %s: %s\n", wf_strerror(rc), wf_taskgraph_errmsg(g));
    wf_taskgraph_destroy(g);

    /* A group of tasks; the first failure is what wf_group_wait() returns, with its message. */
    wf_group grp;
    if (rc >= 0)
        rc = wf_group_init(&grp, rt);
    if (rc >= 0) {
        if (wf_spawn_named(&grp, read_config, "weft.toml", "read-config") == 0) {
            int err = wf_group_wait(&grp);
            printf("group: %s (%s)\n", wf_err_name(err), wf_group_errmsg(&grp));
        }
        wf_group_deinit(&grp);
    }

    /* A parallel loop: split in halves while other workers are hungry, never below 4096. */
    enum { N = 1000000 };

    double *v = malloc(N * sizeof *v);
    if (rc >= 0 && !v)
        rc = WF_ENOMEM;
    if (rc >= 0 && (rc = wf_parallel_for(rt, 0, N, 4096, square, v)) < 0)
        fprintf(stderr, "wf_parallel_for: %s\n", wf_last_errmsg());
    if (rc >= 0)
        printf("v[%d] = %.0f\n", N - 1, v[N - 1]);
    free(v);
    wf_runtime_destroy(rt);
    return rc < 0 ? 1 : 0;
}
