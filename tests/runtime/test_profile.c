/* tests/runtime/test_profile.c: the profile run for the placement planner
 * (wf_profile_graph): each distinct (op, shapes) of a graph is measured once on the CPU and
 * lands in the cost table, a product of 256-wide matrices measures slower than one of
 * 32-wide ones (64x the flops), a second profile of the same graph measures nothing new,
 * updates and sources are skipped, and bad arguments are refused. */
#include "wf_test.h"

#include <weft/weft.h>

#include <criterion/criterion.h>

static wf_runtime *rt;

static void setup(void)
{
    rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 1, .flags = WF_RT_NO_PIN });
}

static void teardown(void)
{
    wf_runtime_destroy(rt);
    rt = NULL;
    wf_test_fini();
}

TestSuite(runtime_profile, .init = setup, .fini = teardown, .timeout = WF_TEST_TIMEOUT(60));

Test(runtime_profile, each_signature_is_measured_once_and_bigger_products_take_longer)
{
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *xs = wf_placeholder(g, "xs", WF_F32, WF_SHAPE(32, 32));
    wf_node *xb = wf_placeholder(g, "xb", WF_F32, WF_SHAPE(256, 256));
    wf_node *ws = wf_variable(g, "ws", WF_F32, WF_SHAPE(32, 32), wf_init_zeros());
    wf_node *wb = wf_variable(g, "wb", WF_F32, WF_SHAPE(256, 256), wf_init_zeros());
    wf_node *s1 = wf_matmul(g, xs, ws), *s2 = wf_matmul(g, wf_tanh(g, s1), ws);
    wf_node *b1 = wf_matmul(g, xb, wb);
    wf_node *loss = wf_add(g, wf_sum(g, s2), wf_sum(g, b1));
    wf_node *train = wf_minimize(g, wf_sgd(0.1), loss);
    cr_assert_not_null(train, "%s", wf_graph_errmsg(g));
    wf_cost_table *t;
    cr_assert_eq(wf_cost_table_create(&t), 0);
    int n = wf_profile_graph(rt, g, 0, 5, t);
    cr_assert_geq(n, 5, "%d measured: %s", n, wf_last_errmsg());
    cr_assert_eq(wf_cost_table_count(t), n);
    double ts = 0, tb = 0, t2 = 0;
    cr_assert_eq(wf_cost_table_get(t, s1, WF_PLACE_CPU, &ts), 1);
    cr_assert_eq(wf_cost_table_get(t, s2, WF_PLACE_CPU, &t2), 1);
    cr_assert_eq(ts, t2, "one signature, one entry");
    cr_assert_eq(wf_cost_table_get(t, b1, WF_PLACE_CPU, &tb), 1);
    cr_assert_eq(wf_cost_table_get(t, train, WF_PLACE_CPU, NULL), 0, "an update is skipped");
    cr_assert_eq(wf_cost_table_get(t, xs, WF_PLACE_CPU, NULL), 0, "a source is skipped");
    printf("runtime_profile: %d signatures; matmul 32x32 %.2f us, 256x256 %.2f us\n", n, ts * 1e6,
           tb * 1e6);
    cr_assert(tb > ts, "256-wide %g s, 32-wide %g s", tb, ts);
    cr_assert_eq(wf_profile_graph(rt, g, 0, 3, t), 0, "nothing new the second time");
    cr_assert_eq(wf_profile_graph(rt, g, -1, 3, t), WF_EINVAL);
    cr_assert_eq(wf_profile_graph(rt, g, 0, 0, t), WF_EINVAL);
    cr_assert_eq(wf_profile_graph(rt, NULL, 0, 3, t), WF_EINVAL);
    wf_cost_table_destroy(t);
    wf_graph_destroy(g);
}
