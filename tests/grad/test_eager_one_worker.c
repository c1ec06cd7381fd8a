/* tests/grad/test_eager_one_worker.c: eager ops on a runtime of one worker run on the thread
 * that builds the graph. A kernel big enough to split itself (a 512 x 512 x 512 matmul, a
 * ReLU and a sum over its 256 Ki elements, their gradients, Adam on a 256 Ki-element
 * variable) runs no task on the worker (its tasks_run counter stays 0), and the values are
 * bit for bit those of the same step on two workers, where the pieces do go to the workers
 * (tasks_run > 0: the test would see a change that stopped splitting on two workers too).
 * Public API only. */
#include "wf_test.h"

#include <weft/weft.h>

#include <criterion/criterion.h>

#include <stdint.h>
#include <string.h>

enum { N = 512 };

TestSuite(eager_one_worker, .timeout = WF_TEST_TIMEOUT(60));

/* The loss, the gradient of 'x' and the updated 'w' of one eager step on 'rt'. */
typedef struct result {
    float loss;
    float *grad, *w;
} result;

static uint64_t tasks_run(wf_runtime *rt)
{
    wf_worker_stats st[8];
    int n = wf_runtime_stats(rt, st, 8);
    cr_assert_gt(n, 0, "wf_runtime_stats: %s", wf_strerror(n));
    uint64_t sum = 0;
    for (int i = 0; i < n && i < 8; i++)
        sum += st[i].tasks_run;
    return sum;
}

/* One step with 'workers' workers; the tasks the workers ran in '*tasks'. */
static result step(int workers, uint64_t *tasks)
{
    wf_runtime *rt =
        wf_test_runtime(&(wf_runtime_opts){ .n_workers = workers, .flags = WF_RT_NO_PIN });
    cr_assert_eq(wf_runtime_worker_count(rt), workers);
    wf_runtime_stats_reset(rt);
    wf_graph *g = wf_graph_create(rt, WF_EAGER);
    cr_assert_not_null(g, "%s", wf_last_errmsg());
    wf_node *w = wf_variable(g, "w", WF_F32, WF_SHAPE(N, N), wf_init_glorot_uniform(7));
    wf_node *x = wf_variable(g, "x", WF_F32, WF_SHAPE(N, N), wf_init_glorot_uniform(8));
    wf_node *loss = wf_sum(g, wf_relu(g, wf_matmul(g, x, w)));
    wf_node *gx;
    cr_assert_eq(wf_gradients(g, loss, &x, 1, &gx), 0, "%s", wf_graph_errmsg(g));
    wf_node *train = wf_minimize(g, wf_adam(1e-3), loss);
    cr_assert_not_null(train, "%s", wf_graph_errmsg(g));
    cr_assert_eq(wf_graph_status(g), 0, "%s", wf_graph_errmsg(g));
    result r = { .loss = wf_tensor_data_f32(wf_node_value(loss))[0],
                 .grad = malloc(sizeof(float) * N * N),
                 .w = malloc(sizeof(float) * N * N) };
    cr_assert(r.grad && r.w);
    memcpy(r.grad, wf_tensor_data_f32(wf_node_value(gx)), sizeof(float) * N * N);
    memcpy(r.w, wf_tensor_data_f32(wf_node_value(w)), sizeof(float) * N * N);
    *tasks = tasks_run(rt);
    wf_graph_destroy(g);
    wf_runtime_destroy(rt);
    return r;
}

Test(eager_one_worker, kernels_run_on_the_calling_thread_with_the_bits_of_two_workers)
{
    uint64_t one_tasks, two_tasks;
    result one = step(1, &one_tasks), two = step(2, &two_tasks);
    cr_expect_eq(one_tasks, 0, "the one worker ran %llu tasks of an eager step",
                 (unsigned long long)one_tasks);
    cr_expect_gt(two_tasks, 0, "two workers ran no task: the kernels no longer split");
    cr_expect_eq(memcmp(&one.loss, &two.loss, sizeof one.loss), 0, "loss %.9g vs %.9g", one.loss,
                 two.loss);
    cr_expect_eq(memcmp(one.grad, two.grad, sizeof(float) * N * N), 0,
                 "the gradient differs between one and two workers");
    cr_expect_eq(memcmp(one.w, two.w, sizeof(float) * N * N), 0,
                 "the updated variable differs between one and two workers");
    free(one.grad);
    free(one.w);
    free(two.grad);
    free(two.w);
    wf_test_fini();
}
