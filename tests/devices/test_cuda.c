/* tests/devices/test_cuda.c: CUDA devices through the public API: discovery (0 GPUs is a
 * count of 0, not an error; this part runs everywhere), the description and statistics of
 * an open GPU, placement of nodes (wf_node_set_device(): its checks and its errors run
 * everywhere), and a graph whose values go CPU -> GPU -> CPU giving the CPU's result.
 * The parts that need a GPU skip with "no CUDA device" on machines without one. */
#include "runtime_util.h"

#include <weft/weft.h>

#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

TestSuite(devices_cuda, .init = wf_test_rt_setup_pinned, .fini = wf_test_rt_teardown,
          .timeout = WF_TEST_TIMEOUT(60));

static int n_gpus(void)
{
    int n = wf_device_count_kind(rt, WF_DEVICE_CUDA);
    cr_assert_geq(n, 0, "wf_device_count_kind: %s", wf_last_errmsg());
    return n;
}

#define NEED_GPU()                          \
    do {                                    \
        if (n_gpus() == 0)                  \
            cr_skip_test("no CUDA device"); \
    } while (0)

/* ---- discovery: everywhere ------------------------------------------------------------ */

Test(devices_cuda, counting_gpus_never_fails_and_the_ids_follow_the_cpu)
{
    int n = n_gpus();
    cr_assert_eq(wf_device_count(rt), 1 + n);
    for (int k = 0; k < n; k++) {
        wf_device_info info;
        cr_assert_eq(wf_device_get_info(rt, 1 + k, &info), 0, "%s", wf_last_errmsg());
        cr_assert_eq(info.kind, WF_DEVICE_CUDA);
        cr_assert_eq(info.index, k);
        cr_assert_gt(info.memory_bytes, 0);
        cr_assert_gt(info.compute_units, 0);
    }
}

Test(devices_cuda, a_missing_gpu_is_enodev_with_a_message_saying_why)
{
    int past = wf_device_count(rt);
    wf_device_info info;
    wf_device *d = (wf_device *)1;
    cr_assert_eq(wf_device_get_info(rt, past, &info), WF_ENODEV);
    char want[32];
    snprintf(want, sizeof want, "no device %d", past);
    cr_assert(strstr(wf_last_errmsg(), want), "message: %s", wf_last_errmsg());
    if (n_gpus() == 0)
        cr_assert(strstr(wf_last_errmsg(), "CUDA"), "says why: %s", wf_last_errmsg());
    cr_assert_eq(wf_device_open(rt, past, NULL, &d), WF_ENODEV);
    cr_assert_null(d);
}

/* ---- placement: everywhere ------------------------------------------------------------ */

Test(devices_cuda, set_device_rejects_null_and_ids_below_minus_1)
{
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(2));
    cr_assert_eq(wf_node_set_device(NULL, 0), WF_EINVAL);
    cr_assert_eq(wf_node_set_device(x, -2), WF_EINVAL);
    cr_assert(strstr(wf_last_errmsg(), "-2"), "message: %s", wf_last_errmsg());
    cr_assert_eq(wf_node_device(x), -1, "unplaced by default");
    cr_assert_eq(wf_node_set_device(x, 3), 0, "checked when a session compiles");
    cr_assert_eq(wf_node_device(x), 3);
    cr_assert_eq(wf_node_device(NULL), -1);
    wf_graph_destroy(g);
}

Test(devices_cuda, a_node_on_a_device_the_runtime_lacks_is_einval_naming_node_and_device)
{
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(4));
    wf_node *y = wf_relu(g, x);
    cr_assert_eq(wf_node_set_name(y, "act"), 0);
    int missing = wf_device_count(rt) + 2;
    cr_assert_eq(wf_node_set_device(y, missing), 0);
    wf_session *s;
    cr_assert_eq(wf_session_create(g, NULL, &s), 0, "%s", wf_graph_errmsg(g));
    wf_tensor *xv = wf_tensor_from(WF_F32, WF_SHAPE(4), (float[]){ -1, 2, -3, 4 });
    wf_feed f = { x, xv };
    wf_tensor *out = NULL;
    int rc = wf_session_run(s, &f, 1, &y, 1, &out, NULL, 0);
    cr_assert_eq(rc, WF_EINVAL, "got %s: %s", wf_strerror(rc), wf_session_errmsg(s));
    char want[32];
    snprintf(want, sizeof want, "device %d", missing);
    cr_assert(strstr(wf_session_errmsg(s), "act"), "names the node: %s", wf_session_errmsg(s));
    cr_assert(strstr(wf_session_errmsg(s), want), "names the device: %s", wf_session_errmsg(s));
    cr_assert_null(out);
    /* The session stays usable: placed back on the CPU, the same fetch runs. */
    cr_assert_eq(wf_node_set_device(y, 0), 0);
    wf_session_destroy(s);
    cr_assert_eq(wf_session_create(g, NULL, &s), 0, "%s", wf_graph_errmsg(g));
    cr_assert_eq(wf_session_run(s, &f, 1, &y, 1, &out, NULL, 0), 0, "%s", wf_session_errmsg(s));
    const float *o = wf_tensor_data_f32(out);
    cr_assert(o[0] == 0 && o[1] == 2 && o[2] == 0 && o[3] == 4);
    wf_tensor_release(out);
    wf_tensor_release(xv);
    wf_session_destroy(s);
    wf_graph_destroy(g);
}

Test(devices_cuda, without_a_gpu_a_graph_runs_on_the_cpu_as_before)
{
    if (n_gpus() > 0)
        cr_skip_test("this machine has a GPU: the CPU-only case does not apply");
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(64, 64));
    wf_node *y = wf_relu(g, wf_matmul(g, x, x));
    wf_session *s;
    cr_assert_eq(wf_session_create(g, NULL, &s), 0, "%s", wf_graph_errmsg(g));
    float xs[64 * 64];
    for (int i = 0; i < 64 * 64; i++)
        xs[i] = (float)((i * 37) % 11) - 5.0f;
    wf_tensor *xv = wf_tensor_from(WF_F32, WF_SHAPE(64, 64), xs);
    wf_feed f = { x, xv };
    wf_tensor *out = NULL;
    cr_assert_eq(wf_session_run(s, &f, 1, &y, 1, &out, NULL, 0), 0, "%s", wf_session_errmsg(s));
    const float *o = wf_tensor_data_f32(out);
    for (int i = 0; i < 64; i += 9)
        for (int j = 0; j < 64; j += 7) {
            double acc = 0;
            for (int k = 0; k < 64; k++)
                acc += (double)xs[i * 64 + k] * xs[k * 64 + j];
            double want = acc > 0 ? acc : 0;
            cr_assert(fabs(o[i * 64 + j] - want) <= 1e-4 * (1 + fabs(want)), "[%d,%d] %g vs %g", i,
                      j, o[i * 64 + j], want);
        }
    wf_tensor_release(out);
    wf_tensor_release(xv);
    wf_session_destroy(s);
    wf_graph_destroy(g);
}

/* ---- with a GPU ----------------------------------------------------------------------- */

Test(devices_cuda, an_open_gpu_describes_itself_and_counts_its_pool)
{
    NEED_GPU();
    wf_device *d;
    cr_assert_eq(wf_device_open(rt, 1, &(wf_device_opts){ .limit_bytes = 64 << 20 }, &d), 0, "%s",
                 wf_last_errmsg());
    wf_pool_stats st;
    cr_assert_eq(wf_device_memory_stats(d, &st), 0);
    cr_assert_eq(st.bytes_live, 0);
    cr_assert_eq(st.allocs, 0);
    wf_device_close(d);
}

/* relu(x @ w) + 1 with the matmul on the GPU and the rest on the CPU: the values go
 * CPU -> GPU -> CPU. Compared with the same graph all on the CPU. */
Test(devices_cuda, a_graph_through_the_gpu_gives_the_cpu_result)
{
    NEED_GPU();

    enum { M = 96, K = 80, N = 72 };

    static float xs[M * K], ws[K * N];
    for (int i = 0; i < M * K; i++)
        xs[i] = (float)((i * 29) % 17) / 8.0f - 1.0f;
    for (int i = 0; i < K * N; i++)
        ws[i] = (float)((i * 13) % 19) / 9.0f - 1.0f;
    wf_tensor *out[2] = { NULL, NULL };
    for (int pass = 0; pass < 2; pass++) {
        wf_graph *g = wf_graph_create(rt, WF_STATIC);
        wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(M, K));
        wf_tensor *wv = wf_tensor_from(WF_F32, WF_SHAPE(K, N), ws);
        wf_node *w = wf_constant(g, wv); /* retains 'wv' */
        wf_tensor_release(wv);
        wf_node *h = wf_matmul(g, x, w);
        wf_node *r = wf_relu(g, h);
        wf_node *y = wf_add(g, r, wf_scalar(g, WF_F32, 1.0));
        cr_assert_not_null(y, "%s", wf_graph_errmsg(g));
        /* Placed explicitly, whatever the session's rule would do. */
        cr_assert_eq(wf_node_set_device(h, pass == 0 ? 1 : 0), 0);
        cr_assert_eq(wf_node_set_device(r, 0), 0);
        cr_assert_eq(wf_node_set_device(y, 0), 0);
        wf_session *s;
        cr_assert_eq(wf_session_create(g, NULL, &s), 0, "%s", wf_graph_errmsg(g));
        wf_tensor *xv = wf_tensor_from(WF_F32, WF_SHAPE(M, K), xs);
        wf_feed f = { x, xv };
        int rc = wf_session_run(s, &f, 1, &y, 1, &out[pass], NULL, 0);
        if (rc == WF_ENODEV)
            cr_skip_test("matmul has no CUDA kernel in this build: %s", wf_session_errmsg(s));
        cr_assert_eq(rc, 0, "%s", wf_session_errmsg(s));
        wf_tensor_release(xv);
        wf_session_destroy(s);
        wf_graph_destroy(g);
    }
    const float *a = wf_tensor_data_f32(out[0]), *b = wf_tensor_data_f32(out[1]);
    /* TF32 is off by default: sgemm agrees with OpenBLAS to accumulation order. */
    for (int i = 0; i < M * N; i++)
        cr_assert(fabsf(a[i] - b[i]) <= 1e-4f * (1 + fabsf(b[i])), "[%d] gpu %g cpu %g", i, a[i],
                  b[i]);
    wf_tensor_release(out[0]);
    wf_tensor_release(out[1]);
}
