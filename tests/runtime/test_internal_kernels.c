/* tests/runtime/test_internal_kernels.c: the kernel registry keyed by (op, device kind)
 * (core/op.h) as a session uses it: a registered kernel overrides an op's own kernel or gives
 * an op without one a kernel, on the CPU and on a (simulated) device; an op with no kernel
 * for the device a node runs on fails placement with WF_ENODEV naming the node and the
 * device; registries are per session (another session, and eager graphs, keep the op's own
 * kernels); the registry's own refusals.
 * Internal: registers into the session's registry before its first run (runtime/internal.h),
 * as the layers below do when a session is created. */
#include "../../runtime/internal.h"
#include "runtime_util.h"

#include <weft/weft.h>

#include <criterion/criterion.h>

#include <string.h>

TestSuite(runtime_internal_kernels, .init = wf_test_rt_setup, .fini = wf_test_rt_teardown,
          .timeout = WF_TEST_TIMEOUT(60));

/* out = a - b: a kernel for add that cannot be mistaken for add's own. */
static int minus_kernel(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                        wf_tensor **out)
{
    (void)ctx;
    (void)n;
    const float *a = wf_tensor_data_f32(in[0]), *b = wf_tensor_data_f32(in[1]);
    float *o = (float *)wf_tensor_data_f32(*out);
    for (int64_t i = 0; i < wf_tensor_numel(*out); i++)
        o[i] = a[i] - b[i];
    return 0;
}

/* out = 3 * x + 1, for 'triple', an op defined here without any kernel. */
static int triple_kernel(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                         wf_tensor **out)
{
    (void)ctx;
    (void)n;
    const float *x = wf_tensor_data_f32(in[0]);
    float *o = (float *)wf_tensor_data_f32(*out);
    for (int64_t i = 0; i < wf_tensor_numel(*out); i++)
        o[i] = 3.0f * x[i] + 1.0f;
    return 0;
}

static int same_infer(wf_node *n, char *err, size_t errlen)
{
    (void)err;
    (void)errlen;
    n->dtype = n->inputs[0]->dtype;
    n->shape = n->inputs[0]->shape;
    return 0;
}

static const wf_op_def op_triple = {
    .name = "triple", .min_inputs = 1, .max_inputs = 1, .infer = same_infer, .flags = WF_OP_NO_GRAD
};

static const float XS[4] = { 1, 2, 3, 4 }, YS[4] = { 10, 20, 30, 40 };

/* Runs 'fetch' of 's' with x and y fed; returns the run's status, the value in 'got'. */
static int run_xy(wf_session *s, wf_node *x, wf_node *y, wf_node *fetch, float got[4])
{
    wf_tensor *xt = wf_test_f32(WF_SHAPE(4), XS), *yt = wf_test_f32(WF_SHAPE(4), YS), *out = NULL;
    wf_feed feeds[] = { { x, xt }, { y, yt } };
    int rc = wf_session_run(s, feeds, y ? 2 : 1, &fetch, 1, &out, NULL, 0);
    if (rc >= 0)
        memcpy(got, wf_tensor_data_f32(out), 4 * sizeof(float));
    wf_tensor_release(out);
    wf_tensor_release(xt);
    wf_tensor_release(yt);
    return rc;
}

Test(runtime_internal_kernels, registered_kernel_overrides_the_ops_own_in_that_session_only)
{
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(4));
    wf_node *y = wf_placeholder(g, "y", WF_F32, WF_SHAPE(4));
    wf_node *sum = wf_add(g, x, y);
    wf_session *s = wf_test_session(g, 0), *plain = wf_test_session(g, 0);
    cr_assert_eq(wf__kernels_register(s->kernels, sum->op, WF_KERNEL_CPU, minus_kernel, NULL, NULL),
                 0);
    float got[4];
    cr_assert_eq(run_xy(s, x, y, sum, got), 0, "%s", wf_session_errmsg(s));
    for (int i = 0; i < 4; i++)
        cr_assert_eq(got[i], XS[i] - YS[i], "element %d: %g", i, got[i]);
    cr_assert_eq(run_xy(plain, x, y, sum, got), 0, "%s", wf_session_errmsg(plain));
    for (int i = 0; i < 4; i++)
        cr_assert_eq(got[i], XS[i] + YS[i], "another session keeps add's kernel: %g", got[i]);
    wf_session_destroy(plain);
    wf_session_destroy(s);
    wf_graph_destroy(g);
}

Test(runtime_internal_kernels, op_without_kernel_fails_placement_with_enodev_naming_node_and_device)
{
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(4));
    wf_node *t = wf__node_add_ex(g, &op_triple, "tripled", &x, 1, NULL, (wf_srcloc){ 0 });
    cr_assert_not_null(t, "%s", wf_graph_errmsg(g));
    wf_session *s = wf_test_session(g, 0);
    float got[4];
    int rc = run_xy(s, x, NULL, t, got);
    cr_assert_eq(rc, WF_ENODEV, "got %s: %s", wf_strerror(rc), wf_session_errmsg(s));
    const char *msg = wf_session_errmsg(s);
    cr_assert(strstr(msg, "'tripled'") && strstr(msg, "cpu:0") && strstr(msg, "no CPU kernel"),
              "%s", msg);
    wf_session_destroy(s);
    wf_graph_destroy(g);
}

Test(runtime_internal_kernels, registered_kernel_extends_an_op_on_the_cpu)
{
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(4));
    wf_node *t = wf__node_add_ex(g, &op_triple, "tripled", &x, 1, NULL, (wf_srcloc){ 0 });
    wf_node *r = wf_relu(g, t); /* a successor of the extended node: plain plan wiring */
    wf_session *s = wf_test_session(g, 0);
    cr_assert_eq(
        wf__kernels_register(s->kernels, &op_triple, WF_KERNEL_CPU, triple_kernel, NULL, NULL), 0);
    float got[4];
    cr_assert_eq(run_xy(s, x, NULL, r, got), 0, "%s", wf_session_errmsg(s));
    for (int i = 0; i < 4; i++)
        cr_assert_eq(got[i], 3.0f * XS[i] + 1.0f, "element %d: %g", i, got[i]);
    wf_session_destroy(s);
    wf_graph_destroy(g);
}

/* A simulated device runs the kernels of the CPU kind (devices/sim.c): a node placed there
 * runs the kernel registered for that kind, through the device executor. */
Test(runtime_internal_kernels, registered_kernel_runs_on_a_simulated_device)
{
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(4));
    wf_node *t = wf__node_add_ex(g, &op_triple, "tripled", &x, 1, NULL, (wf_srcloc){ 0 });
    wf_session *s = wf_test_session(g, WF_SESSION_NO_PASSES);
    int sim = wf_device_count(rt); /* the first simulated device: after the runtime's own */
    s->n_sim = 1;
    cr_assert_eq(wf_node_set_device(t, sim), 0);
    float got[4];
    int rc = run_xy(s, x, NULL, t, got);
    cr_assert_eq(rc, WF_ENODEV, "unregistered: got %s", wf_strerror(rc));
    cr_assert(strstr(wf_session_errmsg(s), "'tripled'") && strstr(wf_session_errmsg(s), "sim:0"),
              "%s", wf_session_errmsg(s));
    wf_session_destroy(s);

    s = wf_test_session(g, WF_SESSION_NO_PASSES);
    s->n_sim = 1;
    cr_assert_eq(
        wf__kernels_register(s->kernels, &op_triple, WF_KERNEL_CPU, triple_kernel, NULL, NULL), 0);
    cr_assert_eq(run_xy(s, x, NULL, t, got), 0, "%s", wf_session_errmsg(s));
    for (int i = 0; i < 4; i++)
        cr_assert_eq(got[i], 3.0f * XS[i] + 1.0f, "element %d: %g", i, got[i]);
    wf_session_destroy(s);
    wf_graph_destroy(g);
}

Test(runtime_internal_kernels, registering_nothing_hides_the_ops_own_kernel)
{
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(4));
    wf_node *y = wf_placeholder(g, "y", WF_F32, WF_SHAPE(4));
    wf_node *sum = wf_add(g, x, y);
    wf_session *s = wf_test_session(g, 0);
    cr_assert_eq(wf__kernels_register(s->kernels, sum->op, WF_KERNEL_CPU, NULL, NULL, NULL), 0);
    float got[4];
    int rc = run_xy(s, x, y, sum, got);
    cr_assert_eq(rc, WF_ENODEV, "got %s: %s", wf_strerror(rc), wf_session_errmsg(s));
    wf_session_destroy(s);
    wf_graph_destroy(g);
}

Test(runtime_internal_kernels, registry_refuses_null_arguments_and_unknown_kinds)
{
    wf__kernels *r = NULL;
    cr_assert_eq(wf__kernels_create(&r), 0);
    cr_assert_eq(wf__kernels_register(NULL, &op_triple, WF_KERNEL_CPU, triple_kernel, NULL, NULL),
                 WF_EINVAL);
    cr_assert_eq(wf__kernels_register(r, NULL, WF_KERNEL_CPU, triple_kernel, NULL, NULL),
                 WF_EINVAL);
    cr_assert_eq(wf__kernels_register(r, &op_triple, WF_DEVICE_KINDS, triple_kernel, NULL, NULL),
                 WF_EINVAL);
    cr_assert(strstr(wf_last_errmsg(), "triple"), "%s", wf_last_errmsg());
    cr_assert_null(wf__kernels_find(r, &op_triple, WF_KERNEL_CPU));
    cr_assert_eq(wf__kernels_register(r, &op_triple, WF_KERNEL_CPU, triple_kernel, NULL, NULL), 0);
    cr_assert_eq(wf__kernels_find(r, &op_triple, WF_KERNEL_CPU), triple_kernel);
    cr_assert_null(wf__kernels_find(r, &op_triple, WF_KERNEL_CUDA));
    cr_assert_null(wf__kernels_find(NULL, &op_triple, WF_KERNEL_CPU), "NULL: the op's own (none)");
    wf__kernels_destroy(r);
    wf__kernels_destroy(NULL);
}
