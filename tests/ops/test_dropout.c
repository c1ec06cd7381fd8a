/* tests/ops/test_dropout.c: dropout of weft/nn.h through the public API: rate 0 is the
 * identity; the fraction dropped on 10^5 elements is within 4 sigma of the rate and kept
 * values are scaled by exactly 1 / (1 - rate); the mask is the same for 1 and 2 workers,
 * changes with the seed, with each run of a session and with each eager call, and is shared
 * by two nodes of equal attributes in one run; strided inputs; every error with its code and
 * a message naming the rate, the shape and the file:line. */
#include "nn2_util.h"

TestSuite(ops_dropout, .init = setup, .fini = teardown, .timeout = WF_TEST_TIMEOUT(60));

enum { N = 100000 };

/* x[i] = 1 + i % 7 (never 0, so a 0 in the output is a dropped element). */
static double *ramp(int64_t n)
{
    double *x = malloc((size_t)n * sizeof *x);
    cr_assert_not_null(x);
    for (int64_t i = 0; i < n; i++)
        x[i] = 1 + (double)(i % 7);
    return x;
}

Test(ops_dropout, rate_zero_is_the_identity_but_still_a_node)
{
    wf_graph *g = new_graph(WF_EAGER);
    double x[6] = { -1.5, 0, 2.25, 3, -7, 1e-3 };
    wf_node *xn = cst(g, WF_F32, WF_SHAPE(2, 3), x);
    wf_node *y = wf_dropout(g, xn, 0.0, 42);
    cr_assert_not_null(y, "%s", wf_graph_errmsg(g));
    cr_assert_neq(y, xn);
    cr_assert_str_eq(wf_node_op(y), "dropout");
    cr_assert(same_bits(wf_node_value(y), wf_node_value(xn)));
    wf_graph_destroy(g);
}

Test(ops_dropout, drops_about_rate_and_scales_kept_values_exactly)
{
    static const double rates[] = { 0.1, 0.3, 0.5, 0.9 };
    static const wf_dtype dts[] = { WF_F32, WF_F64 };
    double *x = ramp(N);
    wf_graph *g = new_graph(WF_EAGER);
    for (int di = 0; di < 2; di++) {
        wf_node *xn = cst(g, dts[di], WF_SHAPE(N), x);
        for (int ri = 0; ri < 4; ri++) {
            double rate = rates[ri], scale = 1.0 / (1.0 - rate);
            double *y = node_f64(g, wf_dropout(g, xn, rate, 1234 + (uint64_t)ri));
            int64_t dropped = 0;
            for (int64_t i = 0; i < N; i++) {
                double want = dts[di] == WF_F32 ? (double)(float)(x[i] * scale) : x[i] * scale;
                if (y[i] == 0) {
                    dropped++;
                    continue;
                }
                cr_assert(y[i] == want, "%s rate %g [%lld]: %.17g, want %.17g",
                          wf_dtype_name(dts[di]), rate, (long long)i, y[i], want);
            }
            double sigma = sqrt(rate * (1 - rate) / N), frac = (double)dropped / N;
            cr_assert(fabs(frac - rate) <= 4 * sigma, "%s rate %g: dropped %.5f (sigma %.5f)",
                      wf_dtype_name(dts[di]), rate, frac, sigma);
            free(y);
        }
    }
    free(x);
    wf_graph_destroy(g);
}

Test(ops_dropout, halves_keep_x_times_the_scale_rounded_once)
{
    static const wf_dtype halves[] = { WF_BF16, WF_F16 };
    double *x = ramp(4096), *w = malloc(4096 * sizeof *w);
    for (int i = 0; i < 4096; i++)
        w[i] = x[i] / (1 - 0.25);
    wf_graph *g = new_graph(WF_EAGER);
    for (int h = 0; h < 2; h++) {
        double *y = node_f64(g, wf_dropout(g, cst(g, halves[h], WF_SHAPE(4096), x), 0.25, 9));
        double *want = node_f64(g, cst(g, halves[h], WF_SHAPE(4096), w)); /* rounded once */
        int64_t dropped = 0;
        for (int i = 0; i < 4096; i++) {
            dropped += y[i] == 0;
            cr_assert(y[i] == 0 || y[i] == want[i], "%s [%d]: %g want %g", wf_dtype_name(halves[h]),
                      i, y[i], want[i]);
        }
        cr_assert(dropped > 700 && dropped < 1350, "%s: %lld dropped of 4096 at rate 0.25",
                  wf_dtype_name(halves[h]), (long long)dropped);
        free(y);
        free(want);
    }
    free(x);
    free(w);
    wf_graph_destroy(g);
}

/* dropout of ramp(n) with (rate, seed) in a static session on 'workers' workers, run once. */
static wf_tensor *run_on(int workers, int64_t n, double rate, uint64_t seed)
{
    wf_runtime *r2 =
        wf_test_runtime(&(wf_runtime_opts){ .n_workers = workers, .flags = WF_RT_NO_PIN });
    wf_graph *g = wf_graph_create(r2, WF_STATIC);
    double *x = ramp(n);
    wf_node *y = wf_dropout(g, cst(g, WF_F32, WF_SHAPE(n), x), rate, seed);
    wf_tensor *out = NULL;
    run_once(g, &y, 1, &out);
    free(x);
    wf_graph_destroy(g);
    wf_runtime_destroy(r2);
    return out;
}

Test(ops_dropout, the_mask_is_the_same_for_one_and_two_workers_and_changes_with_the_seed)
{
    enum { BIG = 300000 }; /* split over the workers */

    for (int rep = 0; rep < 3; rep++) {
        wf_tensor *a = run_on(1, BIG, 0.4, 7 + (uint64_t)rep);
        wf_tensor *b = run_on(2, BIG, 0.4, 7 + (uint64_t)rep);
        cr_assert(same_bits(a, b), "rep %d", rep);
        wf_tensor *c = run_on(2, BIG, 0.4, 8 + (uint64_t)rep);
        cr_assert(!same_bits(a, c), "another seed, the same mask");
        wf_tensor_release(a);
        wf_tensor_release(b);
        wf_tensor_release(c);
    }
}

/* Positions of zeros in 't' as a byte mask (free()). */
static unsigned char *zeros_of(const wf_tensor *t)
{
    double *v = tensor_f64(t);
    int64_t n = wf_tensor_numel(t);
    unsigned char *m = malloc((size_t)n);
    for (int64_t i = 0; i < n; i++)
        m[i] = v[i] == 0;
    free(v);
    return m;
}

Test(ops_dropout, each_run_of_a_session_draws_a_new_mask_shared_by_equal_nodes)
{
    enum { M = 4096 };

    wf_graph *g = new_graph(WF_STATIC);
    double *x = ramp(M), *d = ramp(M);
    for (int i = 0; i < M; i++)
        d[i] *= -0.5;
    /* y and z: equal attributes on different inputs, as a dropout and its gradient's. */
    wf_node *y = wf_dropout(g, cst(g, WF_F64, WF_SHAPE(M), x), 0.5, 99);
    wf_node *z = wf_dropout(g, cst(g, WF_F64, WF_SHAPE(M), d), 0.5, 99);
    wf_session *s = NULL;
    cr_assert_eq(wf_session_create(g, NULL, &s), 0, "%s", wf_graph_errmsg(g));
    unsigned char *prev = NULL;
    for (int run = 0; run < 3; run++) {
        wf_node *f[2] = { y, z };
        wf_tensor *out[2] = { NULL, NULL };
        int rc = wf_session_run(s, NULL, 0, f, 2, out, NULL, 0);
        cr_assert_eq(rc, 0, "%s", wf_session_errmsg(s));
        unsigned char *my = zeros_of(out[0]), *mz = zeros_of(out[1]);
        cr_assert(memcmp(my, mz, M) == 0, "run %d: equal nodes drew different masks", run);
        if (prev)
            cr_assert(memcmp(prev, my, M) != 0, "run %d drew the mask of the run before", run);
        free(prev);
        free(mz);
        prev = my;
        wf_tensor_release(out[0]);
        wf_tensor_release(out[1]);
    }
    free(prev);
    free(x);
    free(d);
    wf_session_destroy(s);
    wf_graph_destroy(g);
}

Test(ops_dropout, two_eager_calls_with_one_seed_draw_different_masks)
{
    wf_graph *g = new_graph(WF_EAGER);
    double *x = ramp(1000);
    wf_node *xn = cst(g, WF_F32, WF_SHAPE(1000), x);
    wf_node *a = wf_dropout(g, xn, 0.5, 5), *b = wf_dropout(g, xn, 0.5, 5);
    cr_assert_not_null(a);
    cr_assert_not_null(b);
    cr_assert(!same_bits(wf_node_value(a), wf_node_value(b)));
    free(x);
    wf_graph_destroy(g);
}

Test(ops_dropout, a_strided_input_draws_the_mask_of_its_row_major_positions)
{
    wf_graph *g = new_graph(WF_STATIC);
    double x[12], xt[12];
    for (int i = 0; i < 12; i++)
        x[i] = i + 1;
    for (int i = 0; i < 3; i++) /* xt: x [3, 4] stored column-major */
        for (int j = 0; j < 4; j++)
            xt[j * 3 + i] = x[i * 4 + j];
    const int64_t strides[2] = { 1, 3 };
    wf_node *f[2] = { wf_dropout(g, view(g, WF_SHAPE(3, 4), strides, xt), 0.5, 3),
                      wf_dropout(g, cst(g, WF_F64, WF_SHAPE(3, 4), x), 0.5, 3) };
    wf_tensor *out[2] = { NULL, NULL };
    run_once(g, f, 2, out);
    cr_assert(same_bits(out[0], out[1]));
    wf_tensor_release(out[0]);
    wf_tensor_release(out[1]);
    wf_graph_destroy(g);
}

Test(ops_dropout, bad_rates_and_dtypes_fail_with_codes_naming_the_call_site)
{
    double v[6] = { 0 };
    char loc[64];
    wf_graph *g = new_graph(WF_EAGER);
    wf_node *x = cst(g, WF_F32, WF_SHAPE(2, 3), v);
    static const double bad[] = { 1.0, 1.5, -0.1, NAN, INFINITY };
    for (int i = 0; i < 5; i++) {
        WHERE_NEXT(loc);
        wf_node *y = wf_dropout(g, x, bad[i], 1);
        check_error(g, y, WF_EINVAL, (const char *[]){ "dropout", "rate", "[2, 3]", loc, NULL });
        wf_graph_clear_error(g);
    }
    wf_node *xi = cst(g, WF_I64, WF_SHAPE(2, 3), v); /* before: it would take the location */
    WHERE_NEXT(loc);
    wf_node *y = wf_dropout(g, xi, 0.5, 1);
    check_error(g, y, WF_EDTYPE, (const char *[]){ "dropout", "i64 [2, 3]", loc, NULL });
    wf_graph_destroy(g);
}
