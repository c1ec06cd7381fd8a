/* tests/runtime/test_session.c: sessions through the public API: running pruned plans with
 * feeds, fetches and targets; shapes re-inferred per batch size; every refused feed, fetch
 * and option with its message; a failing kernel that names its node and leaves the session
 * usable; variables (initial values, read, assign, their count and bytes); one session run from 4
 * threads at once; a 100,000-node chain; and the same bits from static and eager graphs and from 1
 * and 2 workers on random graphs of elementwise ops, matmuls and reductions. */
#include "runtime_util.h"

#include <weft/weft.h>

#include <criterion/criterion.h>

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

TestSuite(runtime_session, .init = wf_test_rt_setup, .fini = wf_test_rt_teardown,
          .timeout = WF_TEST_TIMEOUT(120));

static wf_session *session(wf_graph *g)
{
    wf_session *s = NULL;
    int rc = wf_session_create(g, NULL, &s);
    cr_assert_eq(rc, 0, "wf_session_create: %s: %s", wf_err_name(rc), wf_graph_errmsg(g));
    return s;
}

Test(runtime_session, create_and_destroy_with_default_options)
{
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_session *s = session(g);
    cr_assert_str_eq(wf_session_errmsg(s), "");
    wf_session_destroy(s);
    wf_session_destroy(NULL);
    wf_graph_destroy(g);
}

Test(runtime_session, create_refuses_a_graph_with_an_error_and_keeps_its_message)
{
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *a = wf_constant(g, wf_test_f32(WF_SHAPE(2), (float[]){ 1, 2 }));
    wf_tensor_release(wf_node_value(a)); /* the graph retains it; drop the test's reference */
    wf_node *b = wf_constant(g, wf_test_f32(WF_SHAPE(3), (float[]){ 1, 2, 3 }));
    wf_tensor_release(wf_node_value(b));
    cr_assert_null(wf_add(g, a, b));
    wf_session *s = (wf_session *)1;
    int rc = wf_session_create(g, NULL, &s);
    cr_assert_eq(rc, WF_ESHAPE, "got %s", wf_err_name(rc));
    cr_assert_null(s);
    cr_assert(strstr(wf_graph_errmsg(g), "add"), "%s", wf_graph_errmsg(g));
    cr_assert(strstr(wf_last_errmsg(), "add"), "%s", wf_last_errmsg());
    wf_graph_destroy(g);
}

Test(runtime_session, create_rejects_bad_options_with_einval)
{
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_session *s;
    cr_assert_eq(wf_session_create(g, &(wf_session_opts){ .n_run_slots = -1 }, &s), WF_EINVAL);
    cr_assert_null(s);
    wf_graph_clear_error(g);
    cr_assert_eq(wf_session_create(g, &(wf_session_opts){ .n_run_slots = 5000 }, &s), WF_EINVAL);
    wf_graph_clear_error(g);
    cr_assert_eq(wf_session_create(g, &(wf_session_opts){ .flags = 0x100 }, &s), WF_EINVAL);
    cr_assert(strstr(wf_last_errmsg(), "unknown flags 0x100"), "%s", wf_last_errmsg());
    wf_graph_clear_error(g);
    /* Devices: -1 (CPU only) and 0 (the rule) always exist; one past the last does not. */
    int n_dev = wf_device_count(rt);
    cr_assert_eq(wf_session_create(g, &(wf_session_opts){ .device = n_dev }, &s), WF_EINVAL);
    cr_assert(strstr(wf_last_errmsg(), "device"), "%s", wf_last_errmsg());
    wf_graph_clear_error(g);
    cr_assert_eq(wf_session_create(g, &(wf_session_opts){ .device = -2 }, &s), WF_EINVAL);
    wf_graph_clear_error(g);
    for (int d = -1; d <= 0; d++) {
        cr_assert_eq(wf_session_create(g, &(wf_session_opts){ .device = d }, &s), 0,
                     "device %d: %s", d, wf_last_errmsg());
        wf_session_destroy(s);
    }
    cr_assert_eq(wf_session_create(NULL, NULL, &s), WF_EINVAL);
    cr_assert_eq(wf_session_create(g, NULL, NULL), WF_EINVAL);
    wf_graph_clear_error(g);
    wf_graph_destroy(g);
}

Test(runtime_session, run_adds_a_fed_placeholder_and_a_constant)
{
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(-1, 3));
    wf_tensor *ct = wf_test_f32(WF_SHAPE(3), (float[]){ 10, 20, 30 });
    wf_node *y = wf_add(g, x, wf_constant(g, ct));
    wf_tensor_release(ct);
    cr_assert_not_null(y, "%s", wf_graph_errmsg(g));
    wf_session *s = session(g);
    for (int batch = 1; batch <= 4; batch++) {
        float xs[12];
        for (int i = 0; i < batch * 3; i++)
            xs[i] = (float)i;
        wf_tensor *xt = wf_test_f32(WF_SHAPE(batch, 3), xs), *out = NULL;
        wf_feed feeds[] = { { x, xt } };
        int rc = wf_session_run(s, feeds, 1, &y, 1, &out, NULL, 0);
        cr_assert_eq(rc, 0, "%s: %s", wf_err_name(rc), wf_session_errmsg(s));
        cr_assert(wf_shape_equal(wf_tensor_shape(out), WF_SHAPE(batch, 3)));
        const float *o = wf_tensor_data_f32(out);
        for (int i = 0; i < batch * 3; i++)
            cr_assert_eq(o[i], (float)i + 10 * (float)(i % 3 + 1), "element %d is %g", i, o[i]);
        wf_tensor_release(out);
        wf_tensor_release(xt);
    }
    wf_session_destroy(s);
    wf_graph_destroy(g);
}

/* A session without a pipeline makes every variable's value at creation (a bad initialiser
 * fails there), and wf_session_stats() counts them and their bytes. */
Test(runtime_session, stats_count_every_variable_made_at_creation)
{
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *w = wf_variable(g, "w", WF_F32, WF_SHAPE(4, 3), wf_init_uniform(7, -1, 1));
    wf_node *b = wf_variable(g, "b", WF_F64, WF_SHAPE(3), wf_init_zeros());
    cr_assert(w && b, "%s", wf_graph_errmsg(g));
    wf_session *s = session(g);
    wf_plan_stats st;
    cr_assert_eq(wf_session_stats(s, &st), 0);
    cr_assert_eq(st.n_variables, 2);
    cr_assert_eq(st.n_variables_held, 2);
    cr_assert_eq(st.bytes_variables, 12 * 4 + 3 * 8, "%lld bytes", (long long)st.bytes_variables);
    wf_session_destroy(s);
    wf_graph_destroy(g);
}

Test(runtime_session, matmul_with_a_variable_follows_each_batch_size)
{
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(-1, 4));
    wf_node *w = wf_variable(g, "w", WF_F32, WF_SHAPE(4, 3), wf_init_uniform(7, -1, 1));
    wf_node *y = wf_relu(g, wf_matmul(g, x, w));
    cr_assert_not_null(y, "%s", wf_graph_errmsg(g));
    wf_session *s = session(g);
    wf_tensor *wt = NULL;
    cr_assert_eq(wf_session_variable(s, w, &wt), 0);
    const float *wv = wf_tensor_data_f32(wt);
    uint64_t seed = 3;
    for (int batch = 1; batch <= 9; batch += 4) {
        float xs[9 * 4];
        for (int i = 0; i < batch * 4; i++)
            xs[i] = (float)wf_test_rand_below(&seed, 9) - 4;
        wf_tensor *xt = wf_test_f32(WF_SHAPE(batch, 4), xs), *out = NULL;
        int rc = wf_session_run(s, &(wf_feed){ x, xt }, 1, &y, 1, &out, NULL, 0);
        cr_assert_eq(rc, 0, "%s: %s", wf_err_name(rc), wf_session_errmsg(s));
        cr_assert(wf_shape_equal(wf_tensor_shape(out), WF_SHAPE(batch, 3)));
        for (int i = 0; i < batch; i++)
            for (int j = 0; j < 3; j++) {
                double want = 0;
                for (int k = 0; k < 4; k++)
                    want += (double)xs[i * 4 + k] * wv[k * 3 + j];
                want = want > 0 ? want : 0;
                double got = wf_tensor_data_f32(out)[i * 3 + j];
                cr_assert(fabs(got - want) < 1e-5, "[%d, %d]: %g, not %g", i, j, got, want);
            }
        wf_tensor_release(out);
        wf_tensor_release(xt);
    }
    wf_tensor_release(wt);
    wf_session_destroy(s);
    wf_graph_destroy(g);
}

Test(runtime_session, a_missing_feed_is_an_error_naming_the_placeholder_and_its_line)
{
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *x = wf_placeholder(g, "input_x", WF_F32, WF_SHAPE(2));
    wf_node *y = wf_neg(g, x);
    wf_session *s = session(g);
    wf_tensor *out = (wf_tensor *)1;
    int rc = wf_session_run(s, NULL, 0, &y, 1, &out, NULL, 0);
    cr_assert_eq(rc, WF_EINVAL, "got %s", wf_err_name(rc));
    cr_assert_null(out);
    cr_assert(strstr(wf_session_errmsg(s), "'input_x'"), "%s", wf_session_errmsg(s));
    cr_assert(strstr(wf_session_errmsg(s), "test_session.c:"), "%s", wf_session_errmsg(s));
    cr_assert(strstr(wf_session_errmsg(s), "not fed"), "%s", wf_session_errmsg(s));
    cr_assert_str_eq(wf_last_errmsg(), wf_session_errmsg(s));
    wf_session_destroy(s);
    wf_graph_destroy(g);
}

Test(runtime_session, feeds_that_do_not_match_their_placeholder_are_refused)
{
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(-1, 2));
    wf_node *y = wf_neg(g, x);
    wf_session *s = session(g);
    wf_tensor *ok = wf_test_f32(WF_SHAPE(5, 2), NULL),
              *bad_shape = wf_test_f32(WF_SHAPE(5, 3), NULL),
              *bad_rank = wf_test_f32(WF_SHAPE(10), NULL);
    wf_tensor *bad_dtype = wf_tensor_from(WF_F64, WF_SHAPE(5, 2), NULL);
    wf_tensor *out = NULL;
    int rc = wf_session_run(s, &(wf_feed){ x, bad_shape }, 1, &y, 1, &out, NULL, 0);
    cr_assert_eq(rc, WF_ESHAPE, "got %s", wf_err_name(rc));
    cr_assert(strstr(wf_session_errmsg(s), "[5, 3]"), "%s", wf_session_errmsg(s));
    cr_assert(strstr(wf_session_errmsg(s), "[?, 2]"), "%s", wf_session_errmsg(s));
    rc = wf_session_run(s, &(wf_feed){ x, bad_rank }, 1, &y, 1, &out, NULL, 0);
    cr_assert_eq(rc, WF_ESHAPE, "got %s", wf_err_name(rc));
    rc = wf_session_run(s, &(wf_feed){ x, bad_dtype }, 1, &y, 1, &out, NULL, 0);
    cr_assert_eq(rc, WF_EDTYPE, "got %s", wf_err_name(rc));
    cr_assert(strstr(wf_session_errmsg(s), "f64"), "%s", wf_session_errmsg(s));
    rc = wf_session_run(s, &(wf_feed){ x, NULL }, 1, &y, 1, &out, NULL, 0);
    cr_assert_eq(rc, WF_EINVAL, "got %s", wf_err_name(rc));
    wf_feed twice[] = { { x, ok }, { x, ok } };
    rc = wf_session_run(s, twice, 2, &y, 1, &out, NULL, 0);
    cr_assert_eq(rc, WF_EINVAL, "got %s", wf_err_name(rc));
    cr_assert(strstr(wf_session_errmsg(s), "both feed"), "%s", wf_session_errmsg(s));
    rc = wf_session_run(s, &(wf_feed){ y, ok }, 1, &y, 1, &out, NULL, 0);
    cr_assert_eq(rc, WF_EINVAL, "got %s", wf_err_name(rc));
    cr_assert(strstr(wf_session_errmsg(s), "not a placeholder"), "%s", wf_session_errmsg(s));
    cr_assert_null(out);
    rc = wf_session_run(s, &(wf_feed){ x, ok }, 1, &y, 1, &out, NULL, 0);
    cr_assert_eq(rc, 0, "%s", wf_session_errmsg(s));
    wf_tensor_release(out);
    wf_tensor_release(ok);
    wf_tensor_release(bad_shape);
    wf_tensor_release(bad_rank);
    wf_tensor_release(bad_dtype);
    wf_session_destroy(s);
    wf_graph_destroy(g);
}

Test(runtime_session, nodes_of_another_graph_or_made_after_the_session_are_refused)
{
    wf_graph *g = wf_graph_create(rt, WF_STATIC), *h = wf_graph_create(rt, WF_STATIC);
    wf_node *a = wf_scalar(g, WF_F32, 1);
    wf_node *other = wf_scalar(h, WF_F32, 2);
    wf_node *px = wf_placeholder(h, "px", WF_F32, WF_SCALAR);
    wf_session *s = session(g);
    wf_node *late = wf_neg(g, a);
    wf_tensor *out = NULL, *v = wf_test_f32(WF_SCALAR, (float[]){ 1 });
    int rc = wf_session_run(s, NULL, 0, &other, 1, &out, NULL, 0);
    cr_assert_eq(rc, WF_EINVAL, "got %s", wf_err_name(rc));
    cr_assert(strstr(wf_session_errmsg(s), "another graph"), "%s", wf_session_errmsg(s));
    cr_assert(strstr(wf_session_errmsg(s), "test_session.c:"), "%s", wf_session_errmsg(s));
    rc = wf_session_run(s, NULL, 0, NULL, 0, NULL, &other, 1);
    cr_assert_eq(rc, WF_EINVAL, "got %s", wf_err_name(rc));
    rc = wf_session_run(s, &(wf_feed){ px, v }, 1, &a, 1, &out, NULL, 0);
    cr_assert_eq(rc, WF_EINVAL, "got %s", wf_err_name(rc));
    rc = wf_session_run(s, NULL, 0, &late, 1, &out, NULL, 0);
    cr_assert_eq(rc, WF_EINVAL, "got %s", wf_err_name(rc));
    cr_assert(strstr(wf_session_errmsg(s), "after the session"), "%s", wf_session_errmsg(s));
    rc = wf_session_run(s, NULL, 0, &a, 1, NULL, NULL, 0);
    cr_assert_eq(rc, WF_EINVAL, "got %s", wf_err_name(rc));
    cr_assert_null(out);
    rc = wf_session_run(s, NULL, 0, &a, 1, &out, NULL, 0);
    cr_assert_eq(rc, 0, "%s", wf_session_errmsg(s));
    cr_assert_eq(wf_tensor_data_f32(out)[0], 1.0f);
    wf_tensor_release(out);
    wf_tensor_release(v);
    wf_session_destroy(s);
    wf_graph_destroy(g);
    wf_graph_destroy(h);
}

Test(runtime_session, a_failing_kernel_names_its_node_and_the_session_stays_usable)
{
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *a = wf_placeholder(g, "a", WF_I32, WF_SHAPE(3));
    wf_node *b = wf_placeholder(g, "b", WF_I32, WF_SHAPE(3));
    wf_node *q = wf_div(g, a, b);
    cr_assert_eq(wf_node_set_name(q, "quotient"), 0);
    wf_node *y = wf_add(g, wf_abs(g, q), a);
    cr_assert_not_null(y, "%s", wf_graph_errmsg(g));
    wf_session *s = session(g);
    wf_tensor *at = wf_tensor_from(WF_I32, WF_SHAPE(3), (int32_t[]){ 6, 8, 10 });
    wf_tensor *zero = wf_tensor_from(WF_I32, WF_SHAPE(3), (int32_t[]){ 1, 0, 2 });
    wf_tensor *two = wf_tensor_from(WF_I32, WF_SHAPE(3), (int32_t[]){ 2, 2, 2 });
    wf_tensor *out = NULL;
    for (int round = 0; round < 3; round++) {
        wf_feed bad[] = { { a, at }, { b, zero } };
        int rc = wf_session_run(s, bad, 2, &y, 1, &out, NULL, 0);
        cr_assert_eq(rc, WF_EINVAL, "got %s: %s", wf_err_name(rc), wf_session_errmsg(s));
        cr_assert_null(out);
        const char *msg = wf_session_errmsg(s);
        cr_assert(strstr(msg, "div 'quotient'"), "%s", msg);
        cr_assert(strstr(msg, "test_session.c:"), "%s", msg);
        cr_assert(strstr(msg, "zero"), "%s", msg);
        wf_feed good[] = { { a, at }, { b, two } };
        rc = wf_session_run(s, good, 2, &y, 1, &out, NULL, 0);
        cr_assert_eq(rc, 0, "%s: %s", wf_err_name(rc), wf_session_errmsg(s));
        const int32_t *o = wf_tensor_data_i32(out);
        cr_assert(o[0] == 9 && o[1] == 12 && o[2] == 15, "%d %d %d", o[0], o[1], o[2]);
        wf_tensor_release(out);
        out = NULL;
    }
    wf_tensor_release(at);
    wf_tensor_release(zero);
    wf_tensor_release(two);
    wf_session_destroy(s);
    wf_graph_destroy(g);
}

Test(runtime_session, shapes_that_only_clash_once_fed_fail_with_eshape)
{
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(-1, 3));
    wf_node *z = wf_placeholder(g, "z", WF_F32, WF_SHAPE(-1, 3));
    wf_node *y = wf_sum(g, wf_add(g, x, z));
    wf_session *s = session(g);
    wf_tensor *x2 = wf_test_f32(WF_SHAPE(2, 3), NULL), *z4 = wf_test_f32(WF_SHAPE(4, 3), NULL),
              *out = NULL;
    wf_feed feeds[] = { { x, x2 }, { z, z4 } };
    int rc = wf_session_run(s, feeds, 2, &y, 1, &out, NULL, 0);
    cr_assert_eq(rc, WF_ESHAPE, "got %s: %s", wf_err_name(rc), wf_session_errmsg(s));
    cr_assert(strstr(wf_session_errmsg(s), "add"), "%s", wf_session_errmsg(s));
    cr_assert(strstr(wf_session_errmsg(s), "[2, 3]"), "%s", wf_session_errmsg(s));
    cr_assert_null(out);
    wf_tensor_release(x2);
    wf_tensor_release(z4);
    wf_session_destroy(s);
    wf_graph_destroy(g);
}

Test(runtime_session, only_what_the_fetches_need_runs)
{
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *a = wf_scalar(g, WF_I32, 7);
    wf_node *unfed = wf_placeholder(g, "unfed", WF_I32, WF_SCALAR);
    wf_node *bad = wf_div(g, a, wf_scalar(g, WF_I32, 0)); /* would fail if it ran */
    wf_node *bad2 = wf_add(g, bad, unfed);
    wf_node *y = wf_mul(g, a, a);
    cr_assert_not_null(bad2);
    wf_session *s = session(g);
    wf_tensor *out = NULL;
    int rc = wf_session_run(s, NULL, 0, &y, 1, &out, NULL, 0);
    cr_assert_eq(rc, 0, "%s: %s", wf_err_name(rc), wf_session_errmsg(s));
    cr_assert_eq(wf_tensor_data_i32(out)[0], 49);
    wf_tensor_release(out);
    rc = wf_session_run(s, NULL, 0, NULL, 0, NULL, &bad, 1);
    cr_assert_eq(rc, WF_EINVAL, "got %s", wf_err_name(rc));
    wf_session_destroy(s);
    wf_graph_destroy(g);
}

Test(runtime_session, targets_run_and_a_node_fetched_twice_gives_two_references)
{
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(2));
    wf_node *y = wf_square(g, x);
    wf_node *t = wf_exp(g, y);
    wf_session *s = session(g);
    wf_tensor *xt = wf_test_f32(WF_SHAPE(2), (float[]){ 3, -2 });
    wf_tensor *outs[3] = { 0 };
    wf_node *fetches[] = { y, x, y };
    int rc = wf_session_run(s, &(wf_feed){ x, xt }, 1, fetches, 3, outs, &t, 1);
    cr_assert_eq(rc, 0, "%s: %s", wf_err_name(rc), wf_session_errmsg(s));
    cr_assert_eq(outs[0], outs[2]);
    cr_assert_eq(outs[1], xt, "a fetched placeholder is its feed");
    cr_assert_eq(wf_tensor_data_f32(outs[0])[1], 4.0f);
    for (int i = 0; i < 3; i++)
        wf_tensor_release(outs[i]);
    rc = wf_session_run(s, &(wf_feed){ x, xt }, 1, NULL, 0, NULL, &t, 1);
    cr_assert_eq(rc, 0, "%s: %s", wf_err_name(rc), wf_session_errmsg(s));
    rc = wf_session_run(s, NULL, 0, NULL, 0, NULL, NULL, 0);
    cr_assert_eq(rc, 0);
    wf_tensor_release(xt);
    wf_session_destroy(s);
    wf_graph_destroy(g);
}

Test(runtime_session, variables_start_from_their_init_and_take_assigned_values)
{
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *w = wf_variable(g, "w", WF_F32, WF_SHAPE(2, 3), wf_init_normal(11, 0, 1));
    wf_node *b = wf_variable(g, "b", WF_F32, WF_SHAPE(3), wf_init_constant(0.5));
    wf_node *y = wf_add(g, w, b);
    wf_session *s = session(g);
    wf_tensor *want = NULL, *got = NULL, *out = NULL;
    cr_assert_eq(wf_init_tensor(wf_init_normal(11, 0, 1), WF_F32, WF_SHAPE(2, 3), &want), 0);
    cr_assert_eq(wf_session_variable(s, w, &got), 0, "%s", wf_session_errmsg(s));
    cr_assert_eq(memcmp(wf_tensor_data(got), wf_tensor_data(want), 6 * sizeof(float)), 0);
    int rc = wf_session_run(s, NULL, 0, &y, 1, &out, NULL, 0);
    cr_assert_eq(rc, 0, "%s", wf_session_errmsg(s));
    for (int i = 0; i < 6; i++)
        cr_assert_eq(wf_tensor_data_f32(out)[i], wf_tensor_data_f32(want)[i] + 0.5f);
    wf_tensor_release(out);

    wf_tensor *nb = wf_test_f32(WF_SHAPE(3), (float[]){ 1, 2, 3 });
    cr_assert_eq(wf_session_assign(s, b, nb), 0, "%s", wf_session_errmsg(s));
    rc = wf_session_run(s, NULL, 0, &y, 1, &out, NULL, 0);
    cr_assert_eq(rc, 0, "%s", wf_session_errmsg(s));
    for (int i = 0; i < 6; i++)
        cr_assert_eq(wf_tensor_data_f32(out)[i], wf_tensor_data_f32(want)[i] + (float)(i % 3 + 1));
    wf_tensor_release(out);

    /* A second session has its own values. */
    wf_session *s2 = session(g);
    wf_tensor *b2 = NULL;
    cr_assert_eq(wf_session_variable(s2, b, &b2), 0);
    cr_assert_eq(wf_tensor_data_f32(b2)[2], 0.5f);
    wf_tensor_release(b2);
    wf_session_destroy(s2);

    wf_tensor *wrong_shape = wf_test_f32(WF_SHAPE(4), NULL);
    wf_tensor *wrong_dtype = wf_tensor_from(WF_F64, WF_SHAPE(3), NULL);
    cr_assert_eq(wf_session_assign(s, b, wrong_shape), WF_ESHAPE);
    cr_assert(strstr(wf_session_errmsg(s), "'b'"), "%s", wf_session_errmsg(s));
    cr_assert_eq(wf_session_assign(s, b, wrong_dtype), WF_EDTYPE);
    cr_assert_eq(wf_session_assign(s, y, nb), WF_EINVAL);
    cr_assert(strstr(wf_session_errmsg(s), "not a variable"), "%s", wf_session_errmsg(s));
    cr_assert_eq(wf_session_assign(s, b, NULL), WF_EINVAL);
    cr_assert_eq(wf_session_variable(s, y, &b2), WF_EINVAL);
    cr_assert_null(b2);
    wf_tensor_release(wrong_shape);
    wf_tensor_release(wrong_dtype);
    wf_tensor_release(nb);
    wf_tensor_release(got);
    wf_tensor_release(want);
    wf_session_destroy(s);
    wf_graph_destroy(g);
}

/* ---- One session, several threads ------------------------------------------------------- */

typedef struct conc_arg {
    wf_session *s;
    wf_node *x, *y;
    int thread, runs;
    int bad; /* runs whose result was wrong (or failed) */
    char msg[256];
} conc_arg;

/* y = sum(relu(x * 2 - 3)) over x of shape [n, 4] with x[i] = thread * 1000 + run + i. */
static double conc_want(const float *xs, int n)
{
    double sum = 0;
    for (int i = 0; i < n; i++) {
        float v = xs[i] * 2.0f - 3.0f;
        sum += v > 0 ? v : 0;
    }
    return sum;
}

static void *conc_thread(void *p)
{
    conc_arg *a = p;
    for (int r = 0; r < a->runs; r++) {
        int batch = 1 + (a->thread + r) % 5;
        float xs[5 * 4];
        for (int i = 0; i < batch * 4; i++)
            xs[i] = (float)(a->thread * 1000 + r + i % 7);
        wf_tensor *xt = wf_tensor_from(WF_F32, WF_SHAPE(batch, 4), xs), *out = NULL;
        int rc = wf_session_run(a->s, &(wf_feed){ a->x, xt }, 1, &a->y, 1, &out, NULL, 0);
        if (rc != 0 || wf_tensor_data_f32(out)[0] != (float)conc_want(xs, batch * 4)) {
            if (!a->bad++)
                snprintf(a->msg, sizeof a->msg, "thread %d run %d: rc %d, %g vs %g", a->thread, r,
                         rc, rc ? 0.0 : wf_tensor_data_f32(out)[0], conc_want(xs, batch * 4));
        }
        wf_tensor_release(out);
        wf_tensor_release(xt);
    }
    return NULL;
}

/* Four threads, 'slots' run slots (0: the default), 'runs' runs each. */
static void run_four_threads(int slots, long runs)
{
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(-1, 4));
    wf_node *y = wf_sum(
        g, wf_relu(g, wf_sub(g, wf_mul(g, x, wf_scalar(g, WF_F32, 2)), wf_scalar(g, WF_F32, 3))));
    cr_assert_not_null(y, "%s", wf_graph_errmsg(g));
    wf_session *s = NULL;
    int rc = wf_session_create(g, &(wf_session_opts){ .n_run_slots = slots }, &s);
    cr_assert_eq(rc, 0, "%s", wf_graph_errmsg(g));

    enum { T = 4 };

    conc_arg args[T];
    pthread_t th[T];
    for (int t = 0; t < T; t++) {
        args[t] = (conc_arg){ .s = s, .x = x, .y = y, .thread = t, .runs = (int)runs };
        cr_assert_eq(pthread_create(&th[t], NULL, conc_thread, &args[t]), 0);
    }
    for (int t = 0; t < T; t++)
        pthread_join(th[t], NULL);
    for (int t = 0; t < T; t++)
        cr_assert_eq(args[t].bad, 0, "%d bad runs; first: %s", args[t].bad, args[t].msg);
    wf_session_destroy(s);
    wf_graph_destroy(g);
}

Test(runtime_session, four_threads_run_one_session_with_their_own_feeds)
{
    run_four_threads(0, wf_test_scaled(200, 50));
}

Test(runtime_session, four_threads_share_one_run_slot_by_waiting_for_it)
{
    run_four_threads(1, wf_test_scaled(100, 25));
}

static int task_runs(void *p)
{
    conc_arg *a = p;
    conc_thread(a);
    return a->bad ? WF_EINVAL : 0;
}

Test(runtime_session, tasks_of_the_runtime_can_run_a_session)
{
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(-1, 4));
    wf_node *y = wf_sum(
        g, wf_relu(g, wf_sub(g, wf_mul(g, x, wf_scalar(g, WF_F32, 2)), wf_scalar(g, WF_F32, 3))));
    wf_session *s = session(g);
    conc_arg args[3];
    wf_group grp;
    cr_assert_eq(wf_group_init(&grp, rt), 0);
    for (int t = 0; t < 3; t++) {
        args[t] = (conc_arg){ .s = s, .x = x, .y = y, .thread = t, .runs = 30 };
        cr_assert_eq(wf_spawn(&grp, task_runs, &args[t]), 0);
    }
    int rc = wf_group_wait(&grp);
    cr_assert_eq(rc, 0, "%s", wf_group_errmsg(&grp));
    for (int t = 0; t < 3; t++)
        cr_assert_eq(args[t].bad, 0, "%d bad runs; first: %s", args[t].bad, args[t].msg);
    wf_group_deinit(&grp);
    wf_session_destroy(s);
    wf_graph_destroy(g);
}

Test(runtime_session, a_chain_of_100000_nodes_builds_and_runs)
{
    int n = (int)wf_test_scaled(100000, 20000);
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(4));
    wf_node *one = wf_scalar(g, WF_F32, 1);
    wf_node *v = x;
    for (int i = 0; i < n; i++)
        v = wf_add(g, v, one);
    cr_assert_not_null(v, "%s", wf_graph_errmsg(g));
    wf_session *s = session(g);
    wf_tensor *xt = wf_test_f32(WF_SHAPE(4), (float[]){ 0, 1, 2, 3 });
    for (int round = 0; round < 2; round++) {
        wf_tensor *out = NULL;
        int rc = wf_session_run(s, &(wf_feed){ x, xt }, 1, &v, 1, &out, NULL, 0);
        cr_assert_eq(rc, 0, "%s: %s", wf_err_name(rc), wf_session_errmsg(s));
        for (int i = 0; i < 4; i++)
            cr_assert_eq(wf_tensor_data_f32(out)[i], (float)(n + i));
        wf_tensor_release(out);
    }
    wf_tensor_release(xt);
    wf_session_destroy(s);
    wf_graph_destroy(g);
}

/* ---- Same bits: static and eager, 1 and 2 workers ---------------------------------------- */

enum { RG_N = 24, RG_DIM = 40, RG_OPS = 40 };

/* Builds a random graph of elementwise ops, matmuls and reductions over RG_N x RG_N inputs
 * made from 'seed' (constants, so that eager graphs can take them) and returns the nodes to
 * compare in 'outs' (3 of them). */
static void random_graph(wf_graph *g, uint64_t seed, wf_node **outs)
{
    uint64_t st = seed;
    wf_node *pool[RG_OPS + 4];
    int n = 0;
    for (int i = 0; i < 4; i++) {
        float data[RG_DIM * RG_DIM];
        for (int k = 0; k < RG_DIM * RG_DIM; k++)
            data[k] = (float)((double)wf_test_rand_below(&st, 2000) / 1000.0 - 1.0);
        wf_tensor *t = wf_tensor_from(WF_F32, WF_SHAPE(RG_DIM, RG_DIM), data);
        pool[n++] = wf_constant(g, t);
        wf_tensor_release(t);
    }
    for (int i = 0; i < RG_OPS; i++) {
        wf_node *a = pool[wf_test_rand_below(&st, (uint64_t)n)];
        wf_node *b = pool[wf_test_rand_below(&st, (uint64_t)n)];
        wf_node *r = NULL;
        int axis = (int)wf_test_rand_below(&st, 2);
        switch (wf_test_rand_below(&st, 9)) {
        case 0:
            r = wf_add(g, a, b);
            break;
        case 1:
            r = wf_sub(g, a, b);
            break;
        case 2:
            r = wf_mul(g, a, b);
            break;
        case 3:
            r = wf_tanh(g, a);
            break;
        case 4:
            r = wf_relu(g, a);
            break;
        case 5:
            r = wf_sigmoid(g, wf_maximum(g, a, b));
            break;
        case 6:
            r = wf_tanh(g, wf_matmul(g, a, b));
            break;
        case 7:
            r = wf_add(g, a, wf_reduce_mean(g, b, &axis, 1, true));
            break;
        default:
            r = wf_mul(g, a, wf_reduce_sum(g, wf_tanh(g, b), &axis, 1, true));
            break;
        }
        cr_assert_not_null(r, "%s", wf_graph_errmsg(g));
        pool[n++] = r;
    }
    outs[0] = pool[n - 1];
    outs[1] = wf_sum(g, pool[n - 2]);
    outs[2] = wf_softmax(g, pool[n - 3], 1);
    cr_assert_not_null(outs[2], "%s", wf_graph_errmsg(g));
}

static void run_static(wf_runtime *r, uint64_t seed, wf_tensor **outs)
{
    wf_graph *g = wf_graph_create(r, WF_STATIC);
    wf_node *fetch[3];
    random_graph(g, seed, fetch);
    wf_session *s = session(g);
    int rc = wf_session_run(s, NULL, 0, fetch, 3, outs, NULL, 0);
    cr_assert_eq(rc, 0, "%s: %s", wf_err_name(rc), wf_session_errmsg(s));
    wf_session_destroy(s);
    wf_graph_destroy(g);
}

static void assert_same_bits(wf_tensor *a, wf_tensor *b, uint64_t seed, int k, const char *what)
{
    cr_assert(wf_shape_equal(wf_tensor_shape(a), wf_tensor_shape(b)));
    size_t bytes = (size_t)wf_tensor_numel(a) * wf_dtype_size(wf_tensor_dtype(a));
    cr_assert_eq(memcmp(wf_tensor_data(a), wf_tensor_data(b), bytes), 0,
                 "seed %llu, output %d: %s differ", (unsigned long long)seed, k, what);
}

Test(runtime_session, static_and_eager_graphs_give_identical_bits)
{
    for (uint64_t seed = 1; seed <= 6; seed++) {
        wf_tensor *st[3];
        run_static(rt, seed, st);
        wf_graph *e = wf_graph_create(rt, WF_EAGER);
        wf_node *fetch[3];
        random_graph(e, seed, fetch);
        for (int k = 0; k < 3; k++) {
            assert_same_bits(st[k], wf_node_value(fetch[k]), seed, k, "static and eager");
            wf_tensor_release(st[k]);
        }
        wf_graph_destroy(e);
    }
}

Test(runtime_session, one_and_two_workers_give_identical_bits)
{
    wf_runtime *one = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 1, .flags = WF_RT_NO_PIN });
    for (uint64_t seed = 10; seed <= 14; seed++) {
        wf_tensor *a[3], *b[3];
        run_static(one, seed, a);
        run_static(rt, seed, b);
        for (int k = 0; k < 3; k++) {
            assert_same_bits(a[k], b[k], seed, k, "1 and 2 workers");
            wf_tensor_release(a[k]);
            wf_tensor_release(b[k]);
        }
    }
    wf_runtime_destroy(one);
}

/* Every refusal of a NULL argument by a session call says what is wrong in
 * wf_session_errmsg(s), not only in its return code (bug: wf_session_variable(s, v, NULL)
 * returned WF_EINVAL and left the message empty). */
#define EXPECT_SESSION_MSG(s, call, fn, part)                                             \
    do {                                                                                  \
        int rc_ = (call);                                                                 \
        cr_assert_eq(rc_, WF_EINVAL, "%s: got %s", #call, wf_err_name(rc_));              \
        cr_assert(strstr(wf_session_errmsg(s), fn) && strstr(wf_session_errmsg(s), part), \
                  "%s: wf_session_errmsg is '%s', expected '%s' and '%s'", #call,         \
                  wf_session_errmsg(s), fn, part);                                        \
        cr_assert(strstr(wf_last_errmsg(), part), "%s: wf_last_errmsg is '%s'", #call,    \
                  wf_last_errmsg());                                                      \
    } while (0)

Test(runtime_session, null_arguments_are_refused_with_a_message_in_the_session)
{
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *w = wf_variable(g, "w", WF_F32, WF_SHAPE(2), wf_init_constant(1));
    wf_node *y = wf_neg(g, w);
    wf_session *s = session(g);
    wf_tensor *t = NULL;
    wf_plan_stats st;
    EXPECT_SESSION_MSG(s, wf_session_variable(s, w, NULL), "wf_session_variable", "out is NULL");
    EXPECT_SESSION_MSG(s, wf_session_variable(s, NULL, &t), "wf_session_variable", "var is NULL");
    EXPECT_SESSION_MSG(s, wf_session_assign(s, NULL, t), "wf_session_assign", "NULL");
    EXPECT_SESSION_MSG(s, wf_session_assign(s, w, NULL), "wf_session_assign", "NULL");
    EXPECT_SESSION_MSG(s, wf_session_stats(s, NULL), "wf_session_stats", "out is NULL");
    EXPECT_SESSION_MSG(s, wf_session_plan_stats(s, &y, 1, NULL, 0, NULL), "wf_session_plan_stats",
                       "out is NULL");
    EXPECT_SESSION_MSG(s, wf_session_plan_stats(s, NULL, 1, NULL, 0, &st), "wf_session_plan_stats",
                       "fetches");
    EXPECT_SESSION_MSG(s, wf_session_dump(s, &y, 1, NULL, 0, NULL, WF_DUMP_TEXT), "wf_session_dump",
                       "NULL");
    EXPECT_SESSION_MSG(s, wf_session_run(s, NULL, 1, &y, 1, &t, NULL, 0), "wf_session_run", "NULL");
    EXPECT_SESSION_MSG(s, wf_session_run(s, NULL, 0, &y, 1, NULL, NULL, 0), "wf_session_run",
                       "NULL");
    EXPECT_SESSION_MSG(s, wf_checkpoint_save(s, NULL), "wf_checkpoint_save", "NULL");
    EXPECT_SESSION_MSG(s, wf_checkpoint_load(s, NULL, 0), "wf_checkpoint_load", "NULL");
    cr_assert_null(t);
    wf_session_destroy(s);
    wf_graph_destroy(g);
}

/* wf_node_set_device() promises a check of the device when a session compiles a plan that
 * needs the node; a node that constant folding replaces must get it too (bug: the folded
 * node left the plan before placement looked, and a device the runtime lacks passed). */
Test(runtime_session, a_folded_node_placed_on_a_missing_device_is_refused_naming_it)
{
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *a = wf_scalar(g, WF_F32, 2);
    wf_node *sum = wf_add(g, a, wf_scalar(g, WF_F32, 3));
    cr_assert_eq(wf_node_set_name(sum, "folded_sum"), 0);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(2));
    wf_node *y = wf_mul(g, x, sum);
    cr_assert_eq(wf_node_set_device(sum, 99), 0, "checked when a session compiles");
    wf_session *s = session(g);
    wf_plan_stats st;
    int rc = wf_session_plan_stats(s, &y, 1, NULL, 0, &st);
    cr_assert_eq(rc, WF_EINVAL, "got %s: %s", wf_err_name(rc), wf_session_errmsg(s));
    cr_assert(strstr(wf_session_errmsg(s), "folded_sum") &&
                  strstr(wf_session_errmsg(s), "device 99"),
              "%s", wf_session_errmsg(s));
    /* Without the bad placement the same node is folded: the case above is the folded one. */
    cr_assert_eq(wf_node_set_device(sum, -1), 0);
    wf_session_destroy(s);
    s = session(g);
    cr_assert_eq(wf_session_plan_stats(s, &y, 1, NULL, 0, &st), 0, "%s", wf_session_errmsg(s));
    cr_assert_geq(st.n_folded, 1, "the sum was not folded");
    wf_session_destroy(s);
    wf_graph_destroy(g);
}
