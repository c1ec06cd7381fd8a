/* tests/ops/nn_util.h: helpers shared by the convolution and pooling suites (public API only),
 * on top of eager_util.h: seeded random values, reading a node's value as f64, comparing
 * against a reference with a tolerance relative to a per-element scale, bitwise comparison of
 * two values, and a source-location needle for error messages.
 * Not here: the references (each suite computes its own with plain loops). */
#ifndef WF_TESTS_OPS_NN_UTIL_H
#define WF_TESTS_OPS_NN_UTIL_H

#include "eager_util.h"

/* Runs of the worker-count checks: one on a 1-worker runtime, the rest on the suite's
 * 2-worker one (a data race shows as different bits in some of them). */
#define NN_RUNS 9

/* 'n' values uniform in [-1, 1) from 'seed'. */
static inline void nn_random(double *v, int64_t n, uint64_t seed)
{
    uint64_t s = seed;
    for (int64_t i = 0; i < n; i++)
        v[i] = (double)(wf_test_rand(&s) >> 11) * (2.0 / 9007199254740992.0) - 1.0;
}

/* numel of a concrete shape. */
static inline int64_t nn_numel(wf_shape s)
{
    int64_t n = 1;
    for (int d = 0; d < s.rank; d++)
        n *= s.dims[d];
    return n;
}

/* The value of eager node 'y' (which must exist, with shape 's') as f64, in a new array. */
static inline double *nn_read(wf_graph *g, const wf_node *y, wf_shape s, const char *what)
{
    char a[160], b[160];
    cr_assert_not_null(y, "%s: %s", what, wf_graph_errmsg(g));
    cr_assert(wf_shape_equal(wf_node_shape(y), s), "%s: shape %s, want %s", what,
              wf_shape_str(wf_node_shape(y), a, sizeof a), wf_shape_str(s, b, sizeof b));
    const wf_tensor *v = wf_node_value(y);
    cr_assert_not_null(v, "%s: no value", what);
    int64_t n = wf_tensor_numel(v);
    double *out = malloc((size_t)(n ? n : 1) * sizeof *out);
    cr_assert_eq(wf_tensor_read(v, WF_F64, out, (size_t)(n ? n : 1) * sizeof *out), 0);
    return out;
}

/* Asserts |got[i] - want[i]| <= tol * scale[i] (scale NULL: max(1, |want[i]|)) for every i;
 * NaN must meet NaN. */
static inline void nn_close(const char *what, const double *got, const double *want,
                            const double *scale, int64_t n, double tol)
{
    for (int64_t i = 0; i < n; i++) {
        if (isnan(want[i])) {
            cr_assert(isnan(got[i]), "%s[%lld]: got %.17g, want NaN", what, (long long)i, got[i]);
            continue;
        }
        double s = scale ? scale[i] : fmax(1.0, fabs(want[i]));
        cr_assert(fabs(got[i] - want[i]) <= tol * (s > 0 ? s : 1e-300),
                  "%s[%lld]: got %.17g, want %.17g (tolerance %g x %g)", what, (long long)i, got[i],
                  want[i], tol, s);
    }
}

/* Asserts that two values have the same dtype, shape and bytes. */
static inline void nn_same_bits(const char *what, const wf_tensor *a, const wf_tensor *b)
{
    cr_assert_not_null(a, "%s", what);
    cr_assert_not_null(b, "%s", what);
    cr_assert_eq(wf_tensor_dtype(a), wf_tensor_dtype(b), "%s", what);
    cr_assert(wf_shape_equal(wf_tensor_shape(a), wf_tensor_shape(b)), "%s", what);
    cr_assert(wf_tensor_is_contiguous(a) && wf_tensor_is_contiguous(b), "%s", what);
    size_t bytes = (size_t)wf_tensor_numel(a) * wf_dtype_size(wf_tensor_dtype(a));
    cr_assert(memcmp(wf_tensor_data(a), wf_tensor_data(b), bytes) == 0, "%s: the bits differ",
              what);
}

/* "<file>:<line>" for the needles of check_error(). */
static inline const char *nn_at(const char *file, int line, char *buf, size_t size)
{
    snprintf(buf, size, "%s:%d", file, line);
    return buf;
}

#endif /* WF_TESTS_OPS_NN_UTIL_H */
