/* tests/grad/gradcheck.h: the gradient check every differentiable op goes through (public API
 * only): L = sum(f(x...) * R) for a fixed random R, built in an eager graph; wf_gradients()'s
 * dL/dx against central finite differences of L in f64.
 * Tolerance: |analytic - numeric| <= 1e-6 + 1e-5 |numeric|, with h = 1e-6 max(1, |x|): the
 *   central difference's truncation error is O(h^2 f''') ~ 1e-12 and its rounding error
 *   ~ 1e-16 |L| / h ~ 1e-10 for the sizes used, far inside it; a wrong gradient (a missing
 *   factor, a transposed product, a dropped broadcast) is off by O(1).
 * Not here: the ops' forward checks (tests/ops/). */
#ifndef WF_TESTS_GRAD_GRADCHECK_H
#define WF_TESTS_GRAD_GRADCHECK_H

#include "wf_test.h"

#include <weft/weft.h>

#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static wf_runtime *rt;

static inline void gc_setup(void)
{
    rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 2, .flags = WF_RT_NO_PIN });
}

static inline void gc_teardown(void)
{
    wf_runtime_destroy(rt);
    rt = NULL;
    wf_test_fini();
}

#define GC_MAX_IN 4

/* One input of the function under test. */
typedef struct gc_in {
    wf_shape shape;
    double lo, hi;       /* uniform values in [lo, hi) ... */
    bool distinct;       /* ... and pairwise at least 1e-3 apart (max, min, pools, sort-like) */
    wf_dtype dt;         /* 0 (f64, differentiated) or an integer dtype (labels, indices) */
    const double *fixed; /* or exactly these values (not differentiated if dt is an integer) */
} gc_in;

typedef wf_node *(*gc_fn)(wf_graph *g, wf_node *const *x, const void *ctx);

static inline wf_node *gc_const(wf_graph *g, wf_dtype dt, wf_shape s, const double *v)
{
    int64_t n = wf_shape_numel(s);
    wf_tensor *f = wf_tensor_from(WF_F64, s, v), *t = f;
    cr_assert_not_null(f, "%s", wf_last_errmsg());
    if (dt != WF_F64) {
        size_t bytes = (size_t)(n ? n : 1) * wf_dtype_size(dt);
        void *buf = malloc(bytes);
        cr_assert_eq(wf_tensor_read(f, dt, buf, bytes), 0, "%s", wf_last_errmsg());
        t = wf_tensor_from(dt, s, buf);
        free(buf);
        wf_tensor_release(f);
    }
    wf_node *c = (wf_constant)(g, t);
    wf_tensor_release(t);
    cr_assert_not_null(c, "%s", wf_graph_errmsg(g));
    return c;
}

/* L for inputs 'vals' (and, with 'grads' non-NULL, dL/dx of each f64 input into grads[i]).
 * '*r' is R (made on the first call, with y's shape). */
static inline double gc_eval(const char *what, gc_fn f, const void *ctx, int n_in, const gc_in *ins,
                             double *const *vals, double **r, int64_t *r_n, double *const *grads)
{
    wf_graph *g = wf_graph_create(rt, WF_EAGER);
    cr_assert_not_null(g, "%s", wf_last_errmsg());
    wf_node *x[GC_MAX_IN], *dif[GC_MAX_IN];
    int nd = 0, map[GC_MAX_IN];
    for (int i = 0; i < n_in; i++) {
        wf_dtype dt = ins[i].dt ? ins[i].dt : WF_F64;
        x[i] = gc_const(g, dt, ins[i].shape, vals[i]);
        if (dt == WF_F64) {
            map[nd] = i;
            dif[nd++] = x[i];
        }
    }
    wf_node *y = f(g, x, ctx);
    cr_assert_not_null(y, "%s: building: %s", what, wf_graph_errmsg(g));
    cr_assert_eq(wf_node_dtype(y), WF_F64, "%s: y is %s", what, wf_dtype_name(wf_node_dtype(y)));
    wf_shape ys = wf_node_shape(y);
    int64_t yn = wf_shape_numel(ys);
    if (!*r) {
        uint64_t st = 0x5eed + (uint64_t)yn;
        *r = malloc((size_t)(yn ? yn : 1) * sizeof **r);
        for (int64_t i = 0; i < yn; i++)
            (*r)[i] = (double)wf_test_rand_below(&st, 2000001) / 1e6 - 1.0;
        *r_n = yn;
    }
    cr_assert_eq(yn, *r_n, "%s: y changed size", what);
    wf_node *loss = wf_sum(g, wf_mul(g, y, gc_const(g, WF_F64, ys, *r)));
    cr_assert_not_null(loss, "%s: %s", what, wf_graph_errmsg(g));
    double l = wf_tensor_get(wf_node_value(loss), 0);
    if (grads) {
        wf_node *gr[GC_MAX_IN];
        int rc = wf_gradients(g, loss, dif, nd, gr);
        cr_assert_eq(rc, 0, "%s: wf_gradients: %s", what, wf_graph_errmsg(g));
        for (int k = 0; k < nd; k++) {
            int i = map[k];
            const wf_tensor *t = wf_node_value(gr[k]);
            cr_assert_not_null(t, "%s: gradient %d has no value", what, i);
            cr_assert(wf_shape_equal(wf_tensor_shape(t), ins[i].shape), "%s: gradient %d shape",
                      what, i);
            for (int64_t j = 0; j < wf_tensor_numel(t); j++)
                grads[i][j] = wf_tensor_get(t, j);
        }
    }
    wf_graph_destroy(g);
    return l;
}

/* Checks f's gradient with respect to every f64 input at random points drawn with 'seed'. */
static inline void gradcheck(const char *what, gc_fn f, const void *ctx, int n_in, const gc_in *ins,
                             uint64_t seed)
{
    double *vals[GC_MAX_IN], *grads[GC_MAX_IN], *r = NULL;
    int64_t r_n = 0, cnt[GC_MAX_IN];
    uint64_t st = seed;
    for (int i = 0; i < n_in; i++) {
        cnt[i] = wf_shape_numel(ins[i].shape);
        vals[i] = malloc((size_t)(cnt[i] ? cnt[i] : 1) * sizeof(double));
        grads[i] = calloc((size_t)(cnt[i] ? cnt[i] : 1), sizeof(double));
        for (int64_t j = 0; j < cnt[i]; j++) {
            if (ins[i].fixed) {
                vals[i][j] = ins[i].fixed[j];
            } else if (ins[i].distinct) { /* a shuffled grid: distinct by construction */
                double span = ins[i].hi - ins[i].lo;
                vals[i][j] = ins[i].lo + span * ((double)j + 0.5) / (double)cnt[i];
            } else {
                double u = (double)wf_test_rand_below(&st, 1000001) / 1e6;
                vals[i][j] = ins[i].lo + (ins[i].hi - ins[i].lo) * u;
            }
        }
        if (!ins[i].fixed && ins[i].distinct)
            for (int64_t j = cnt[i] - 1; j > 0; j--) {
                int64_t k = (int64_t)wf_test_rand_below(&st, (uint64_t)j + 1);
                double t = vals[i][j];
                vals[i][j] = vals[i][k];
                vals[i][k] = t;
            }
    }
    gc_eval(what, f, ctx, n_in, ins, vals, &r, &r_n, grads);
    int checked = 0;
    for (int i = 0; i < n_in; i++) {
        if (ins[i].dt && ins[i].dt != WF_F64)
            continue;
        int64_t step = cnt[i] > 40 ? cnt[i] / 40 + 1 : 1; /* about 40 elements per input */
        for (int64_t j = (int64_t)(seed % (uint64_t)step); j < cnt[i]; j += step) {
            double x0 = vals[i][j], h = 1e-6 * fmax(1.0, fabs(x0));
            vals[i][j] = x0 + h;
            double lp = gc_eval(what, f, ctx, n_in, ins, vals, &r, &r_n, NULL);
            vals[i][j] = x0 - h;
            double lm = gc_eval(what, f, ctx, n_in, ins, vals, &r, &r_n, NULL);
            vals[i][j] = x0;
            double num = (lp - lm) / (2 * h), an = grads[i][j];
            cr_assert(fabs(an - num) <= 1e-6 + 1e-5 * fabs(num),
                      "%s: dL/dx%d[%lld] (x = %.9g): wf_gradients %.12g, finite differences %.12g",
                      what, i, (long long)j, x0, an, num);
            checked++;
        }
    }
    cr_assert_gt(checked, 0, "%s: nothing was checked", what);
    for (int i = 0; i < n_in; i++) {
        free(vals[i]);
        free(grads[i]);
    }
    free(r);
}

#endif /* WF_TESTS_GRAD_GRADCHECK_H */
