/* tests/runtime/test_shape_bounds.c: shapes whose element count, or a product or sum of
 * dimensions formed while inferring them, passes 2^59 (the most elements a tensor may hold)
 * are refused when the node is built, with WF_ESHAPE and a message naming the op and the
 * shape: broadcast_to (whose sum the simplify pass used to rewrite with a wrapped count, and
 * which failed at run time without the passes), reshape (the target's product, with and
 * without a -1 to infer), pad (INT64_MAX - 1 of padding), concat (lengths adding up past
 * INT64_MAX), and placeholders at and past the bound. Each of these used to be accepted with
 * a product or sum that overflowed int64_t. */
#include "runtime_util.h"

#include <weft/weft.h>

#include <criterion/criterion.h>

#include <stdint.h>
#include <stdio.h>
#include <string.h>

TestSuite(runtime_shape_bounds, .init = wf_test_rt_setup, .fini = wf_test_rt_teardown,
          .timeout = WF_TEST_TIMEOUT(60));

#define HUGE3 ((int64_t)0x5555555555555555) /* 3 * HUGE3 is 2^64 - 1: wraps to -1 */

/* 'n' is NULL and the graph's first error is WF_ESHAPE with every piece of 'want' (NULL
 * ended) in its message. */
static void refused(wf_graph *g, const wf_node *n, const char *const *want)
{
    const char *msg = wf_graph_errmsg(g);
    cr_assert_null(n, "accepted as %s", wf_node_op(n));
    cr_assert_eq(wf_graph_status(g), WF_ESHAPE, "%s: %s", wf_err_name(wf_graph_status(g)), msg);
    for (int i = 0; want[i]; i++)
        cr_assert(strstr(msg, want[i]), "'%s' not in: %s", want[i], msg);
}

/* sum(broadcast_to(x, [3, HUGE3, 3, HUGE3])) with x = 1: refused when built. Were it accepted
 * (before the bound), the test runs it with 'flags' and fails with what the run gave (the
 * simplify pass wrapped the count to 1 and returned 1.0; without passes, WF_ENOMEM). */
static void sum_of_huge_broadcast(uint32_t flags)
{
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(1));
    wf_node *b = wf_broadcast_to(g, x, WF_SHAPE(3, HUGE3, 3, HUGE3));
    if (b) {
        wf_node *s = wf_reduce_sum(g, b, NULL, 0, false);
        wf_session *sess = wf_test_session(g, flags);
        const float one = 1.0f;
        wf_tensor *xt = wf_test_f32(WF_SHAPE(1), &one), *out = NULL;
        wf_feed feed = { x, xt };
        int rc = wf_session_run(sess, &feed, 1, &s, 1, &out, NULL, 0);
        double v = rc == 0 ? (double)*(const float *)wf_tensor_data(out) : 0.0;
        char why[512];
        snprintf(why, sizeof why, "%s", rc ? wf_session_errmsg(sess) : "");
        wf_tensor_release(out);
        wf_tensor_release(xt);
        wf_session_destroy(sess);
        wf_graph_destroy(g);
        cr_assert_fail("broadcast_to accepted; the sum ran: %s %g %s", wf_err_name(rc), v, why);
    }
    refused(g, b,
            (const char *[]){ "broadcast_to", "test_shape_bounds.c:",
                              "[3, 6148914691236517205, 3, 6148914691236517205]",
                              "more than 2^59 elements", NULL });
    wf_graph_destroy(g);
}

Test(runtime_shape_bounds, a_sum_of_a_huge_broadcast_is_refused_with_the_default_passes)
{
    sum_of_huge_broadcast(0);
}

Test(runtime_shape_bounds, a_sum_of_a_huge_broadcast_is_refused_without_passes)
{
    sum_of_huge_broadcast(WF_SESSION_NO_PASSES);
}

Test(runtime_shape_bounds, a_reshape_whose_target_product_overflows_is_refused)
{
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(4));
    /* (2^62 + 1) * 4 wraps to 4, x's element count. */
    wf_node *y = wf_reshape(g, x, WF_SHAPE(((int64_t)1 << 62) + 1, 4));
    refused(g, y,
            (const char *[]){ "reshape", "x is [4]", "[4611686018427387905, 4]",
                              "more than 2^59 elements", NULL });
    wf_graph_destroy(g);
}

Test(runtime_shape_bounds, a_reshape_that_infers_minus_one_from_an_overflowing_product_is_refused)
{
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(4));
    wf_node *y = wf_reshape(g, x, WF_SHAPE(-1, ((int64_t)1 << 62) + 1, 4));
    refused(g, y,
            (const char *[]){ "reshape", "[?, 4611686018427387905, 4]", "more than 2^59", NULL });
    /* x's count unknown: the product of the known dimensions is checked all the same. */
    wf_graph_clear_error(g);
    wf_node *u = wf_placeholder(g, "u", WF_F32, WF_SHAPE(-1));
    y = wf_reshape(g, u, WF_SHAPE(-1, (int64_t)1 << 40, (int64_t)1 << 40));
    refused(g, y, (const char *[]){ "reshape", "x is [?]", "more than 2^59", NULL });
    wf_graph_destroy(g);
}

Test(runtime_shape_bounds, padding_of_int64_max_minus_one_is_refused)
{
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(3, 2));
    const int64_t before[2] = { 0, INT64_MAX - 1 }, after[2] = { 1, 0 };
    wf_node *y = wf_pad(g, x, before, after, 0.0);
    refused(g, y,
            (const char *[]){ "pad", "x is [3, 2]", "9223372036854775806 before", "axis 1",
                              "longer than 2^59", NULL });
    wf_graph_clear_error(g);
    const int64_t b2[2] = { INT64_MAX - 1, 0 }, a2[2] = { INT64_MAX - 1, 0 };
    refused(g, wf_pad(g, x, b2, a2, 0.0), (const char *[]){ "pad", "axis 0", NULL });
    wf_graph_destroy(g);
}

Test(runtime_shape_bounds, a_concat_whose_lengths_add_up_past_int64_max_is_refused)
{
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    /* 16 inputs of 2^59 (the most a shape may hold, so each is accepted): 2^63 in all. */
    wf_node *xs[16];
    for (int i = 0; i < 16; i++) {
        char name[16];
        snprintf(name, sizeof name, "x%d", i);
        xs[i] = wf_placeholder(g, name, WF_F32, WF_SHAPE((int64_t)1 << 59));
        cr_assert_not_null(xs[i], "%s", wf_graph_errmsg(g));
    }
    wf_node *y = wf_concat(g, xs, 16, 0);
    refused(g, y,
            (const char *[]){ "concat", "[576460752303423488]",
                              "along axis 0 of the inputs add up to more than 2^59", NULL });
    /* Lengths that fit, but too many elements: refused by the same bound on the output. */
    wf_graph_clear_error(g);
    wf_node *ws[2] = { wf_placeholder(g, "w0", WF_F32, WF_SHAPE(2, (int64_t)1 << 58)),
                       wf_placeholder(g, "w1", WF_F32, WF_SHAPE(2, (int64_t)1 << 58)) };
    refused(
        g, wf_concat(g, ws, 2, 0),
        (const char *[]){ "concat", "[4, 288230376151711744]", "more than 2^59 elements", NULL });
    wf_graph_destroy(g);
}

Test(runtime_shape_bounds, the_bound_is_2_to_the_59_elements_and_counts_nonzero_dimensions)
{
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    cr_assert_not_null(
        wf_placeholder(g, "at", WF_F64, WF_SHAPE((int64_t)1 << 30, (int64_t)1 << 29)), "%s",
        wf_graph_errmsg(g));
    cr_assert_not_null(wf_placeholder(g, "unknown", WF_F64, WF_SHAPE(-1, (int64_t)1 << 59)), "%s",
                       wf_graph_errmsg(g));
    refused(g,
            wf_placeholder(g, "past", WF_F64, WF_SHAPE((int64_t)1 << 30, ((int64_t)1 << 29) + 1)),
            (const char *[]){ "placeholder 'past'", "[1073741824, 536870913]",
                              "more than 2^59 elements", NULL });
    /* No elements, but its strides would overflow. */
    wf_graph_clear_error(g);
    refused(g, wf_placeholder(g, "empty", WF_F32, WF_SHAPE((int64_t)1 << 40, 0, (int64_t)1 << 40)),
            (const char *[]){ "placeholder 'empty'", "[1099511627776, 0, 1099511627776]",
                              "nonzero dimensions multiply to more than 2^59", NULL });
    wf_graph_destroy(g);
}

Test(runtime_shape_bounds, conv2d_dilation_times_kernel_and_channels_times_groups_are_checked)
{
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(1, 1, 4, 4));
    wf_node *w = wf_placeholder(g, "w", WF_F32, WF_SHAPE(1, 1, (int64_t)1 << 40, 1));
    /* 2^30 * (2^40 - 1) + 1 passes 2^63: the kernel is larger than any input. */
    wf_conv2d_opts o = { .dilation = { 1 << 30, 1 } };
    refused(g, wf_conv2d(g, x, w, &o),
            (const char *[]){ "conv2d", "kernel height (more than 2^59 with dilation 1073741824)",
                              "larger than the padded input height 4", NULL });
    /* x_shape's -1 channels from w's 2^40 x 2^30 groups (w has no output channels, so it
     * fits: with any, w would hold at least as many elements as x has channels). */
    wf_graph_clear_error(g);
    wf_node *dy = wf_placeholder(g, "dy", WF_F32, WF_SHAPE(1, 0, 4, 4));
    wf_node *wg = wf_placeholder(g, "wg", WF_F32, WF_SHAPE(0, (int64_t)1 << 40, 1, 1));
    wf_conv2d_opts og = { .groups = 1 << 30 };
    refused(g, wf_conv2d_backward_input(g, dy, wg, WF_SHAPE(1, -1, 4, 4), &og),
            (const char *[]){ "x_shape is [1, ?, 4, 4]", "1099511627776 x groups 1073741824",
                              "more than 2^59", NULL });
    wf_graph_destroy(g);
}
