/* tests/ops/nn2_util.h: helpers the suites of weft/nn.h's normalization, dropout and
 * backward ops share (public API only), on top of eager_util.h: seeded random values, a
 * node's or tensor's values as doubles, one static session run, and "file:line" of a call
 * for checking error messages.
 * Not here: the references (each test computes its own with plain loops). */
#ifndef WF_TESTS_OPS_NN2_UTIL_H
#define WF_TESTS_OPS_NN2_UTIL_H

#include "eager_util.h"

#include <weft/nn.h>

#include <stdint.h>
#include <string.h>

/* 'n' values uniform in [lo, hi) from 'state'. */
static inline void rand_fill(uint64_t *state, double *v, int64_t n, double lo, double hi)
{
    for (int64_t i = 0; i < n; i++)
        v[i] = lo + (hi - lo) * (double)(wf_test_rand(state) >> 11) * 0x1.0p-53;
}

/* The values of 't' in row-major order as doubles, into a fresh array (free()). */
static inline double *tensor_f64(const wf_tensor *t)
{
    cr_assert_not_null(t);
    int64_t n = wf_tensor_numel(t);
    double *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    cr_assert_not_null(v);
    cr_assert_eq(wf_tensor_read(t, WF_F64, v, (size_t)(n ? n : 1) * sizeof *v), 0, "%s",
                 wf_last_errmsg());
    return v;
}

/* The value of eager node 'y' as doubles (free()); fails the test if 'y' is NULL. */
static inline double *node_f64(wf_graph *g, const wf_node *y)
{
    cr_assert_not_null(y, "%s", wf_graph_errmsg(g));
    cr_assert_not_null(wf_node_value(y), "no value");
    return tensor_f64(wf_node_value(y));
}

/* Runs 'fetches' of static graph 'g' once in a new session (no feeds); 'outs' are owned. */
static inline void run_once(wf_graph *g, wf_node *const *fetches, int n, wf_tensor **outs)
{
    wf_session *s = NULL;
    cr_assert_eq(wf_session_create(g, NULL, &s), 0, "%s", wf_graph_errmsg(g));
    int rc = wf_session_run(s, NULL, 0, fetches, n, outs, NULL, 0);
    cr_assert_eq(rc, 0, "%s: %s", wf_err_name(rc), wf_session_errmsg(s));
    wf_session_destroy(s);
}

/* True if 'a' and 'b' hold the same dtype, shape and bytes. */
static inline bool same_bits(const wf_tensor *a, const wf_tensor *b)
{
    if (wf_tensor_dtype(a) != wf_tensor_dtype(b) ||
        !wf_shape_equal(wf_tensor_shape(a), wf_tensor_shape(b)) || !wf_tensor_is_contiguous(a) ||
        !wf_tensor_is_contiguous(b))
        return false;
    size_t bytes = (size_t)wf_tensor_numel(a) * wf_dtype_size(wf_tensor_dtype(a));
    return memcmp(wf_tensor_data(a), wf_tensor_data(b), bytes) == 0;
}

/* "name.c:line" for the basename of 'file' (what error messages print). */
static inline const char *where(const char *file, int line, char *buf, size_t size)
{
    const char *b = strrchr(file, '/');
    snprintf(buf, size, "%s:%d", b ? b + 1 : file, line);
    return buf;
}

/* The location of the statement on the next line: 'WHERE_NEXT(loc);' then the call. */
#define WHERE_NEXT(buf) where(__FILE__, __LINE__ + 1, buf, sizeof buf)

#endif /* WF_TESTS_OPS_NN2_UTIL_H */
