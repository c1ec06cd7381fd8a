/* tests/ops/eager_util.h: helpers shared by the eager op suites (public API
 * only): a runtime per test, constants of any dtype from f64 values, strided constants over
 * test memory (wf_tensor_view), and checks of a node's value and of a graph's error.
 * Not here: the references (each test computes its own with plain loops). */
#ifndef WF_TESTS_OPS_EAGER_UTIL_H
#define WF_TESTS_OPS_EAGER_UTIL_H

#include "wf_test.h"

#include <weft/weft.h>

#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static wf_runtime *rt;

static inline void setup(void)
{
    rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 2, .flags = WF_RT_NO_PIN });
}

static inline void teardown(void)
{
    wf_runtime_destroy(rt);
    rt = NULL;
    wf_test_fini();
}

static inline wf_graph *new_graph(int mode)
{
    wf_graph *g = wf_graph_create(rt, mode);
    cr_assert_not_null(g, "wf_graph_create: %s", wf_last_errmsg());
    return g;
}

/* A contiguous constant of dtype 'dt' holding 'vals' (converted from f64). */
static inline wf_node *cst(wf_graph *g, wf_dtype dt, wf_shape s, const double *vals)
{
    wf_tensor *f = NULL, *t = NULL;
    cr_assert_eq(wf_tensor_create(WF_F64, s, vals, &f), 0, "%s", wf_last_errmsg());
    int64_t n = wf_tensor_numel(f);
    size_t bytes = (size_t)(n ? n : 1) * wf_dtype_size(dt);
    void *buf = malloc(bytes);
    cr_assert_eq(wf_tensor_read(f, dt, buf, bytes), 0, "%s", wf_last_errmsg());
    cr_assert_eq(wf_tensor_create(dt, s, buf, &t), 0, "%s", wf_last_errmsg());
    wf_node *c = (wf_constant)(g, t);
    cr_assert_not_null(c, "constant: %s", wf_graph_errmsg(g));
    wf_tensor_release(t);
    wf_tensor_release(f);
    free(buf);
    return c;
}

/* A constant viewing 'data' (f64, kept alive by the caller) with 'strides' (elements). */
static inline wf_node *view(wf_graph *g, wf_shape s, const int64_t *strides, const double *data)
{
    wf_tensor *t = NULL;
    cr_assert_eq(wf_tensor_view(WF_F64, s, strides, data, &t), 0, "%s", wf_last_errmsg());
    cr_assert(!wf_tensor_is_contiguous(t) || !strides, "the view should be strided");
    wf_node *c = (wf_constant)(g, t);
    cr_assert_not_null(c, "constant: %s", wf_graph_errmsg(g));
    wf_tensor_release(t);
    return c;
}

/* Asserts that 'y' exists with dtype 'dt', shape 's' and exactly the values 'want'. */
static inline void check_value(const char *what, wf_graph *g, const wf_node *y, wf_dtype dt,
                               wf_shape s, const double *want)
{
    cr_assert_not_null(y, "%s: %s", what, wf_graph_errmsg(g));
    char a[160], b[160];
    cr_assert_eq(wf_node_dtype(y), dt, "%s: dtype %s", what, wf_dtype_name(wf_node_dtype(y)));
    cr_assert(wf_shape_equal(wf_node_shape(y), s), "%s: shape %s, want %s", what,
              wf_shape_str(wf_node_shape(y), a, sizeof a), wf_shape_str(s, b, sizeof b));
    const wf_tensor *v = wf_node_value(y);
    cr_assert_not_null(v, "%s: no value", what);
    cr_assert(wf_shape_equal(wf_tensor_shape(v), s), "%s: value shape", what);
    for (int64_t i = 0; i < wf_tensor_numel(v); i++) {
        double got = wf_tensor_get(v, i);
        cr_assert(got == want[i], "%s[%lld]: got %.17g, want %.17g", what, (long long)i, got,
                  want[i]);
    }
}

/* Asserts that the graph failed with 'code' and its message holds each of 'needles'. */
static inline void check_error(wf_graph *g, const wf_node *y, int code, const char *const *needles)
{
    cr_assert_null(y, "the call should fail");
    cr_assert_eq(wf_graph_status(g), code, "status %s, want %s: %s",
                 wf_err_name(wf_graph_status(g)), wf_err_name(code), wf_graph_errmsg(g));
    for (int i = 0; needles[i]; i++)
        cr_assert(strstr(wf_graph_errmsg(g), needles[i]), "message '%s' should contain '%s'",
                  wf_graph_errmsg(g), needles[i]);
}

/* 0, 1, 2, ... */
static inline void iota(double *v, int n)
{
    for (int i = 0; i < n; i++)
        v[i] = i;
}

#endif /* WF_TESTS_OPS_EAGER_UTIL_H */
