/* tests/runtime/test_internal_session.c: what the executor does that the public API cannot
 * see, checked with test ops made through core/op.h: an intermediate value is freed as soon
 * as its last consumer has finished (not at the end of the run), and control edges ("run
 * after", core/graph.h) order nodes and pull the nodes they name into the plan. */
#include "../../core/error.h"
#include "../../core/graph.h"
#include "../../core/op.h"
#include "../../core/tensor.h"
#include "runtime_util.h"

#include <weft/weft.h>

#include <criterion/criterion.h>

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static atomic_long freed; /* buffers of "tracked" outputs freed so far */
static atomic_long seq;   /* the next "stamp" */

static void setup(void)
{
    wf_test_rt_setup();
    atomic_store(&freed, 0);
    atomic_store(&seq, 0);
}

TestSuite(runtime_internal_session, .init = setup, .fini = wf_test_rt_teardown,
          .timeout = WF_TEST_TIMEOUT(60));

static int infer_scalar_f32(wf_node *n, char *err, size_t len)
{
    n->dtype = WF_F32;
    n->shape = WF_SCALAR;
    return 0;
}

static int infer_scalar_i64(wf_node *n, char *err, size_t len)
{
    n->dtype = WF_I64;
    n->shape = WF_SCALAR;
    return 0;
}

static void counting_free(void *ctx, void *data, size_t bytes)
{
    free(data);
    atomic_fetch_add(&freed, 1);
}

/* "tracked": a copy of the input in a buffer whose release is counted (the op allocates its
 * output itself, as WF_OP_DYNAMIC_SHAPE ops do, to install the hook). */
static int tracked_cpu(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                       wf_tensor **out)
{
    wf_tensor *t = wf__tensor_alloc(in[0]->dtype, in[0]->shape);
    if (!t)
        return WF_ENOMEM;
    memcpy(t->data, in[0]->data, (size_t)t->numel * wf_dtype_size(t->dtype));
    t->buf->free_fn = counting_free;
    *out = t;
    return 0;
}

/* "freed_count": how many tracked buffers were freed when it ran. */
static int freed_count_cpu(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                           wf_tensor **out)
{
    *(float *)(*out)->data = (float)atomic_load(&freed);
    return 0;
}

/* "stamp": the order in which stamps ran. */
static int stamp_cpu(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                     wf_tensor **out)
{
    wf_test_busy_ns(20000); /* long enough for the other worker to start an unordered twin */
    *(int64_t *)(*out)->data = atomic_fetch_add(&seq, 1);
    return 0;
}

static const wf_op_def op_tracked = {
    .name = "test_tracked",
    .min_inputs = 1,
    .max_inputs = 1,
    .infer = wf_test_infer_same,
    .kernel = { [WF_KERNEL_CPU] = tracked_cpu },
    .flags = WF_OP_DYNAMIC_SHAPE,
};

static const wf_op_def op_freed_count = {
    .name = "test_freed_count",
    .min_inputs = 1,
    .max_inputs = 1,
    .infer = infer_scalar_f32,
    .kernel = { [WF_KERNEL_CPU] = freed_count_cpu },
};

static const wf_op_def op_stamp = {
    .name = "test_stamp",
    .min_inputs = 1,
    .max_inputs = 1,
    .infer = infer_scalar_i64,
    .kernel = { [WF_KERNEL_CPU] = stamp_cpu },
    .flags = WF_OP_STATEFUL,
};

static wf_node *add1(wf_graph *g, const wf_op_def *op, wf_node *x)
{
    wf_node *n = wf__node_add(g, op, &x, 1, NULL);
    cr_assert_not_null(n, "%s", wf_graph_errmsg(g));
    return n;
}

Test(runtime_internal_session, an_intermediate_is_freed_when_its_last_consumer_finishes)
{
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(4));
    wf_node *t1 = add1(g, &op_tracked, x);
    wf_node *t2 = add1(g, &op_tracked, t1);
    wf_node *t3 = add1(g, &op_tracked, t2);
    wf_node *c = add1(g, &op_freed_count, t3);
    wf_session *s = NULL;
    cr_assert_eq(wf_session_create(g, NULL, &s), 0, "%s", wf_graph_errmsg(g));
    wf_tensor *xt = wf_tensor_from(WF_F32, WF_SHAPE(4), NULL);
    for (int round = 0; round < 3; round++) {
        atomic_store(&freed, 0);
        wf_tensor *out = NULL;
        int rc = wf_session_run(s, &(wf_feed){ x, xt }, 1, &c, 1, &out, NULL, 0);
        cr_assert_eq(rc, 0, "%s", wf_session_errmsg(s));
        /* When 'c' ran, t1 and t2 had no reader left; t3 was still being read. */
        cr_assert_eq(wf_tensor_data_f32(out)[0], 2.0f, "round %d: %g freed", round,
                     wf_tensor_data_f32(out)[0]);
        cr_assert_eq(atomic_load(&freed), 3, "after the run");
        wf_tensor_release(out);
    }
    wf_tensor_release(xt);
    wf_session_destroy(s);
    wf_graph_destroy(g);
}

Test(runtime_internal_session, control_edges_order_nodes_and_pull_them_into_the_plan)
{
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *x = wf_scalar(g, WF_F32, 1);
    wf_node *a = add1(g, &op_stamp, x);
    wf_node *b = add1(g, &op_stamp, x);
    cr_assert_eq(wf__node_add_control(b, a), 0, "%s", wf_graph_errmsg(g));
    wf_session *s = NULL;
    cr_assert_eq(wf_session_create(g, NULL, &s), 0, "%s", wf_graph_errmsg(g));

    /* Fetching 'b' alone still runs 'a', first. */
    atomic_store(&seq, 0);
    wf_tensor *out = NULL;
    int rc = wf_session_run(s, NULL, 0, &b, 1, &out, NULL, 0);
    cr_assert_eq(rc, 0, "%s", wf_session_errmsg(s));
    cr_assert_eq(wf_tensor_data_i64(out)[0], 1);
    cr_assert_eq(atomic_load(&seq), 2);
    wf_tensor_release(out);

    wf_node *both[] = { b, a };
    for (int round = 0; round < 20; round++) {
        wf_tensor *outs[2] = { 0 };
        rc = wf_session_run(s, NULL, 0, both, 2, outs, NULL, 0);
        cr_assert_eq(rc, 0, "%s", wf_session_errmsg(s));
        cr_assert_gt(wf_tensor_data_i64(outs[0])[0], wf_tensor_data_i64(outs[1])[0], "round %d",
                     round);
        wf_tensor_release(outs[0]);
        wf_tensor_release(outs[1]);
    }
    wf_session_destroy(s);
    wf_graph_destroy(g);
}
