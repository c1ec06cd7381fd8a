/* tests/runtime/test_internal_epilogue.c: GEMM epilogue fusion and control edges ("run
 * after", core/graph.h), which the public API makes only through optimizers: a node ordered
 * after an interior node of a chain (the matmul) is ordered after the fused node instead
 * when it comes later than the chain's last node, and it stops the fusion when it comes
 * earlier (the plan's order would stop being topological). Results bitwise equal to the
 * graph compiled with no pass. */
#include "../../core/graph.h"
#include "runtime_util.h"

#include <weft/weft.h>

#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

TestSuite(runtime_internal_epilogue, .init = wf_test_rt_setup, .fini = wf_test_rt_teardown,
          .timeout = WF_TEST_TIMEOUT(60));

#define ONLY_EPILOGUE (WF_SESSION_NO_PASSES & ~(uint32_t)WF_SESSION_NO_EPILOGUE)

static wf_node *const_f32(wf_graph *g, wf_shape shape, float base)
{
    int64_t n = wf_shape_numel(shape);
    float *v = malloc((size_t)n * sizeof *v);
    for (int64_t i = 0; i < n; i++)
        v[i] = base + 0.37f * (float)((i * 7) % 11) - 1.5f;
    wf_tensor *t = wf_tensor_from(WF_F32, shape, v);
    free(v);
    wf_node *c = wf_constant(g, t);
    wf_tensor_release(t);
    cr_assert_not_null(c, "%s", wf_graph_errmsg(g));
    return c;
}

/* x [4, 6] @ w [6, 5] + b [5] -> relu, with a node 'z' = exp(k) ordered after the matmul,
 * made after the matmul ('where' 0), after the add (1) or after the relu (2). Returns the
 * stats of the pass and checks the bits of y and z against no pass. */
static wf_plan_stats run_case(int where, char **dump)
{
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *x = const_f32(g, WF_SHAPE(4, 6), 0.25f), *w = const_f32(g, WF_SHAPE(6, 5), -0.5f);
    wf_node *b = const_f32(g, WF_SHAPE(5), 0.125f), *k = const_f32(g, WF_SHAPE(3), 0.0f);
    wf_node *mm = wf_matmul(g, x, w), *z = NULL, *add = NULL, *y = NULL;
    if (where == 0)
        z = wf_exp(g, k);
    add = wf_add(g, mm, b);
    if (where == 1)
        z = wf_exp(g, k);
    y = wf_relu(g, add);
    if (where == 2)
        z = wf_exp(g, k);
    cr_assert_not_null(z, "%s", wf_graph_errmsg(g));
    cr_assert_eq(wf__node_add_control(z, mm), 0, "%s", wf_graph_errmsg(g));
    wf_session *on = wf_test_session(g, ONLY_EPILOGUE),
               *none = wf_test_session(g, WF_SESSION_NO_PASSES);
    wf_node *f[2] = { y, z };
    wf_plan_stats st;
    cr_assert_eq(wf_session_plan_stats(on, f, 2, NULL, 0, &st), 0, "%s", wf_session_errmsg(on));
    wf_tensor *r_on[2], *r_none[2];
    cr_assert_eq(wf_session_run(on, NULL, 0, f, 2, r_on, NULL, 0), 0, "%s", wf_session_errmsg(on));
    cr_assert_eq(wf_session_run(none, NULL, 0, f, 2, r_none, NULL, 0), 0, "%s",
                 wf_session_errmsg(none));
    for (int i = 0; i < 2; i++) {
        size_t bytes = (size_t)wf_tensor_numel(r_on[i]) * sizeof(float);
        cr_assert(memcmp(wf_tensor_data(r_on[i]), wf_tensor_data(r_none[i]), bytes) == 0,
                  "fetch %d differs", i);
        wf_tensor_release(r_on[i]);
        wf_tensor_release(r_none[i]);
    }
    size_t len = 0;
    FILE *fp = open_memstream(dump, &len);
    cr_assert_eq(wf_session_dump(on, f, 2, NULL, 0, fp, WF_DUMP_TEXT), 0);
    fclose(fp);
    wf_session_destroy(on);
    wf_session_destroy(none);
    wf_graph_destroy(g);
    return st;
}

Test(runtime_internal_epilogue, a_later_node_ordered_after_the_matmul_runs_after_the_fused_node)
{
    char *dump = NULL;
    wf_plan_stats st = run_case(2, &dump);
    cr_assert_eq(st.n_epilogue, 1);
    cr_assert_eq(st.nodes_after_epilogue, st.nodes_after_simplify - 2, "%s", dump);
    /* z's control edge names the fused node, which comes first in the plan's order. */
    cr_assert_not_null(strstr(dump, "= matmul_epilogue("), "%s", dump);
    const char *after = strstr(dump, " after(%");
    cr_assert_not_null(after, "%s", dump);
    char edge[128];
    snprintf(edge, sizeof edge, "%.*s", (int)strcspn(after, ")"), after);
    cr_assert_not_null(strstr(edge, ".epilogue"), "'%s' in %s", edge, dump);
    cr_assert_lt(strstr(dump, "= matmul_epilogue("), after, "%s", dump);
    free(dump);
}

Test(runtime_internal_epilogue, a_node_ordered_after_the_matmul_but_before_the_relu_stops_the_relu)
{
    char *dump = NULL;
    wf_plan_stats st = run_case(1, &dump);
    cr_assert_eq(st.n_epilogue, 1, "matmul + bias only: %s", dump);
    cr_assert_eq(st.nodes_after_epilogue, st.nodes_after_simplify - 1, "%s", dump);
    cr_assert_not_null(strstr(dump, "= relu("), "%s", dump);
    free(dump);
}

Test(runtime_internal_epilogue, a_node_ordered_after_the_matmul_before_the_add_stops_the_fusion)
{
    char *dump = NULL;
    wf_plan_stats st = run_case(0, &dump);
    cr_assert_eq(st.n_epilogue, 0, "%s", dump);
    cr_assert_not_null(strstr(dump, "= matmul("), "%s", dump);
    free(dump);
}
