/* tests/devices/test_cudaflow.c: the dataflow across real GPUs (issue 6) through the public
 * API: values crossing host <-> GPU several times in one run, GPU <-> GPU when the machine
 * has two, a run on a runtime of one worker (a worker that waited for a copy to the host
 * would starve the device's actor), and a training step placed by the rule, each against
 * the same graph on the CPU with a stated tolerance. Without a GPU each test skips with
 * "no CUDA device"; runtime/test_internal_devflow.c runs the same flows on simulated
 * devices everywhere. */
#include "runtime_util.h"

#include <weft/weft.h>

#include <criterion/criterion.h>

#include <math.h>

TestSuite(devices_cudaflow, .init = wf_test_rt_setup_pinned, .fini = wf_test_rt_teardown,
          .timeout = WF_TEST_TIMEOUT(120));

static int n_gpus(void)
{
    int n = wf_device_count_kind(rt, WF_DEVICE_CUDA);
    cr_assert_geq(n, 0, "wf_device_count_kind: %s", wf_last_errmsg());
    return n;
}

#define NEED_GPUS(k)                                    \
    do {                                                \
        if (n_gpus() == 0)                              \
            cr_skip_test("no CUDA device");             \
        if (n_gpus() < (k))                             \
            cr_skip_test("needs %d CUDA devices", (k)); \
    } while (0)

enum { M = 64, K = 48, N = 40 };

/* z = (relu(x @ w) + 1) * (x @ w), fetched with h = x @ w; 'dev' places h, r, y, z. */
static void chain_run(wf_runtime *r, const int dev[4], int rounds, wf_tensor **z_out,
                      wf_tensor **h_out)
{
    static float xs[M * K], ws[K * N];
    for (int i = 0; i < M * K; i++)
        xs[i] = (float)((i * 29) % 17) / 8.0f - 1.0f;
    for (int i = 0; i < K * N; i++)
        ws[i] = (float)((i * 13) % 19) / 9.0f - 1.0f;
    wf_graph *g = wf_graph_create(r, WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(M, K));
    wf_node *h = wf_matmul(g, x, wf_test_const_f32(g, WF_SHAPE(K, N), ws));
    wf_node *rl = wf_relu(g, h);
    wf_node *y = wf_add(g, rl, wf_scalar(g, WF_F32, 1.0));
    wf_node *z = wf_mul(g, y, h);
    cr_assert_not_null(z, "%s", wf_graph_errmsg(g));
    wf_node *nodes[4] = { h, rl, y, z };
    for (int i = 0; i < 4; i++)
        cr_assert_eq(wf_node_set_device(nodes[i], dev[i]), 0);
    wf_session *s;
    cr_assert_eq(wf_session_create(g, &(wf_session_opts){ .device = -1 }, &s), 0, "%s",
                 wf_graph_errmsg(g));
    wf_tensor *xv = wf_test_f32(WF_SHAPE(M, K), xs);
    for (int k = 0; k < rounds; k++) {
        wf_tensor *out[2] = { NULL, NULL };
        int rc = wf_session_run(s, &(wf_feed){ x, xv }, 1, (wf_node *[]){ z, h }, 2, out, NULL, 0);
        if (rc == WF_ENODEV)
            cr_skip_test("an op has no CUDA kernel in this build: %s", wf_session_errmsg(s));
        cr_assert_eq(rc, 0, "round %d: %s", k, wf_session_errmsg(s));
        if (k == rounds - 1) {
            *z_out = out[0];
            *h_out = out[1];
        } else {
            wf_tensor_release(out[0]);
            wf_tensor_release(out[1]);
        }
    }
    wf_tensor_release(xv);
    wf_session_destroy(s);
    wf_graph_destroy(g);
}

/* Runs the chain placed by 'dev' and on the CPU; TF32 is off by default, so the matmul
 * agrees with OpenBLAS to accumulation order: 1e-4 relative. */
static void chain_check(wf_runtime *r, const int dev[4], int rounds)
{
    wf_tensor *z, *h, *z0, *h0;
    chain_run(r, dev, rounds, &z, &h);
    chain_run(r, (int[]){ 0, 0, 0, 0 }, 1, &z0, &h0);
    const wf_tensor *got[2] = { z, h }, *want[2] = { z0, h0 };
    for (int j = 0; j < 2; j++) {
        const float *a = wf_tensor_data_f32(got[j]), *b = wf_tensor_data_f32(want[j]);
        for (int i = 0; i < M * N; i++)
            cr_assert(fabsf(a[i] - b[i]) <= 1e-4f * (1 + fabsf(b[i])), "fetch %d [%d]: %g, cpu %g",
                      j, i, a[i], b[i]);
    }
    wf_tensor_release(z);
    wf_tensor_release(h);
    wf_tensor_release(z0);
    wf_tensor_release(h0);
}

Test(devices_cudaflow, values_cross_host_and_gpu_four_times_per_run)
{
    NEED_GPUS(1);
    chain_check(rt, (int[]){ 1, 0, 1, 0 }, 20);
}

Test(devices_cudaflow, everything_on_the_gpu_fetches_through_copies)
{
    NEED_GPUS(1);
    chain_check(rt, (int[]){ 1, 1, 1, 1 }, 20);
}

Test(devices_cudaflow, one_worker_runs_gpu_copies_without_waiting_for_them)
{
    NEED_GPUS(1);
    wf_runtime *r1 = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 1, .flags = WF_RT_NO_PIN });
    chain_check(r1, (int[]){ 1, 0, 1, 0 }, 10);
    wf_runtime_destroy(r1);
}

Test(devices_cudaflow, values_cross_between_two_gpus)
{
    NEED_GPUS(2);
    chain_check(rt, (int[]){ 1, 2, 1, 2 }, 20);
    chain_check(rt, (int[]){ 1, 2, 0, 1 }, 10);
}
