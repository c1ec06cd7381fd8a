/* tests/core/test_init.c: variable initializers (wf_init_tensor): constant kinds, uniform and
 * normal statistics over 10^5 samples, Glorot and He limits from the fans core.h documents,
 * determinism (same seed, same bits; element i depends only on (seed, i)), different seeds,
 * every float dtype, and bad arguments. */
#include "wf_test.h"

#include <weft/weft.h>

#include <criterion/criterion.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

TestSuite(core_init, .fini = wf_test_fini, .timeout = WF_TEST_TIMEOUT(30));

static wf_tensor *make(wf_init init, wf_dtype dt, wf_shape shape)
{
    wf_tensor *t = NULL;
    int rc = wf_init_tensor(init, dt, shape, &t);
    cr_assert_eq(rc, 0, "wf_init_tensor: %s: %s", wf_err_name(rc), wf_last_errmsg());
    cr_assert_not_null(t);
    cr_assert_eq(wf_tensor_dtype(t), dt);
    cr_assert(wf_shape_equal(wf_tensor_shape(t), shape));
    return t;
}

static void moments(const wf_tensor *t, double *mean, double *var, double *lo, double *hi)
{
    int64_t n = wf_tensor_numel(t);
    double s = 0, s2 = 0;
    *lo = INFINITY;
    *hi = -INFINITY;
    for (int64_t i = 0; i < n; i++) {
        double v = wf_tensor_get(t, i);
        s += v;
        *lo = fmin(*lo, v);
        *hi = fmax(*hi, v);
    }
    *mean = s / (double)n;
    for (int64_t i = 0; i < n; i++) {
        double d = wf_tensor_get(t, i) - *mean;
        s2 += d * d;
    }
    *var = s2 / (double)(n - 1);
}

Test(core_init, zeros_ones_and_constant_fill_every_element)
{
    const wf_dtype dts[] = { WF_F32, WF_F64, WF_BF16, WF_F16, WF_I32, WF_I64 };
    for (size_t k = 0; k < sizeof dts / sizeof dts[0]; k++) {
        wf_tensor *z = make(wf_init_zeros(), dts[k], WF_SHAPE(3, 5));
        wf_tensor *o = make(wf_init_ones(), dts[k], WF_SHAPE(3, 5));
        wf_tensor *c = make(wf_init_constant(-2.5), dts[k], WF_SHAPE(3, 5));
        double cv = wf_dtype_is_float(dts[k]) ? -2.5 : -2.0; /* integers truncate */
        for (int i = 0; i < 15; i++) {
            cr_assert_eq(wf_tensor_get(z, i), 0.0, "%s", wf_dtype_name(dts[k]));
            cr_assert_eq(wf_tensor_get(o, i), 1.0, "%s", wf_dtype_name(dts[k]));
            cr_assert_eq(wf_tensor_get(c, i), cv, "%s", wf_dtype_name(dts[k]));
        }
        wf_tensor_release(z);
        wf_tensor_release(o);
        wf_tensor_release(c);
    }
}

/* 10^5 samples of U(a, b): mean (a+b)/2 with stddev (b-a)/sqrt(12 n) ~ 0.0009 (b-a); we
 * allow 0.005 (b-a), over 5 sigma. The variance (b-a)^2/12 within 2%. */
Test(core_init, uniform_statistics_match_the_range)
{
    const double a = -1.0, b = 3.0;
    wf_tensor *t = make(wf_init_uniform(7, a, b), WF_F64, WF_SHAPE(100000));
    double mean, var, lo, hi;
    moments(t, &mean, &var, &lo, &hi);
    cr_assert_lt(fabs(mean - (a + b) / 2), 0.005 * (b - a), "mean %g", mean);
    cr_assert_lt(fabs(var / ((b - a) * (b - a) / 12) - 1), 0.02, "var %g", var);
    cr_assert_geq(lo, a);
    cr_assert_lt(hi, b);
    cr_assert_lt(lo, a + 0.001 * (b - a), "the whole range is covered: min %g", lo);
    cr_assert_gt(hi, b - 0.001 * (b - a), "max %g", hi);
    /* No bucket of ten is far from 10%: the draws are spread, not clumped. */
    int buckets[10] = { 0 };
    for (int64_t i = 0; i < 100000; i++)
        buckets[(int)((wf_tensor_get(t, i) - a) / (b - a) * 10)]++;
    for (int k = 0; k < 10; k++)
        cr_assert(abs(buckets[k] - 10000) < 500, "bucket %d has %d", k, buckets[k]);
    wf_tensor_release(t);
}

/* 10^5 samples of N(m, s): mean within 0.02 s (stddev of the mean is 0.0032 s), stddev
 * within 2%, and about 68.3% within one s. */
Test(core_init, normal_statistics_match_mean_and_stddev)
{
    const double m = 0.5, s = 2.0;
    wf_tensor *t = make(wf_init_normal(11, m, s), WF_F64, WF_SHAPE(1000, 100));
    double mean, var, lo, hi;
    moments(t, &mean, &var, &lo, &hi);
    cr_assert_lt(fabs(mean - m), 0.02 * s, "mean %g", mean);
    cr_assert_lt(fabs(sqrt(var) / s - 1), 0.02, "stddev %g", sqrt(var));
    int within = 0;
    for (int64_t i = 0; i < 100000; i++)
        within += fabs(wf_tensor_get(t, i) - m) < s;
    cr_assert_lt(fabs(within / 1e5 - 0.6827), 0.01, "fraction within 1 sd: %g", within / 1e5);
    cr_assert_lt(lo, m - 3.5 * s, "tails are reached: min %g", lo);
    cr_assert_gt(hi, m + 3.5 * s, "max %g", hi);
    wf_tensor_release(t);
}

Test(core_init, glorot_uniform_stays_within_its_limit_and_fills_it)
{
    /* Rank 2 [in, out]: l = sqrt(6 / (784 + 10)). */
    wf_tensor *t = make(wf_init_glorot_uniform(42), WF_F32, WF_SHAPE(784, 10));
    double l = sqrt(6.0 / (784 + 10));
    double mean, var, lo, hi;
    moments(t, &mean, &var, &lo, &hi);
    cr_assert_geq(lo, -l - 1e-7);
    cr_assert_leq(hi, l + 1e-7);
    cr_assert_lt(lo, -0.99 * l, "min %g of limit %g", lo, l);
    cr_assert_gt(hi, 0.99 * l, "max %g of limit %g", hi, l);
    cr_assert_lt(fabs(var / (l * l / 3) - 1), 0.05, "var %g", var);
    wf_tensor_release(t);
}

Test(core_init, glorot_and_he_use_documented_fans_for_conv_weights)
{
    /* Rank 4 [out, in, kh, kw] = [16, 8, 3, 3]: fan_in = 8*9 = 72, fan_out = 16*9 = 144. */
    wf_tensor *g = make(wf_init_glorot_uniform(1), WF_F64, WF_SHAPE(16, 8, 3, 3));
    wf_tensor *h = make(wf_init_he_uniform(1), WF_F64, WF_SHAPE(16, 8, 3, 3));
    double lg = sqrt(6.0 / (72 + 144)), lh = sqrt(6.0 / 72);
    double mean, var, lo, hi;
    moments(g, &mean, &var, &lo, &hi);
    cr_assert(lo >= -lg && hi < lg && hi > 0.98 * lg, "glorot [%g, %g] vs %g", lo, hi, lg);
    moments(h, &mean, &var, &lo, &hi);
    cr_assert(lo >= -lh && hi < lh && hi > 0.98 * lh, "he [%g, %g] vs %g", lo, hi, lh);
    /* Same seed and shape: He is Glorot scaled by lh / lg, element by element. */
    for (int64_t i = 0; i < wf_tensor_numel(g); i += 37)
        cr_assert_float_eq(wf_tensor_get(h, i), wf_tensor_get(g, i) * lh / lg, 1e-12);
    wf_tensor_release(g);
    wf_tensor_release(h);
}

Test(core_init, glorot_and_he_normal_have_documented_stddev)
{
    wf_tensor *g = make(wf_init_glorot_normal(3), WF_F64, WF_SHAPE(400, 250));
    wf_tensor *h = make(wf_init_he_normal(3), WF_F64, WF_SHAPE(400, 250));
    double mean, var, lo, hi;
    moments(g, &mean, &var, &lo, &hi);
    cr_assert_lt(fabs(sqrt(var) / sqrt(2.0 / 650) - 1), 0.02, "glorot sd %g", sqrt(var));
    cr_assert_lt(fabs(mean), 0.02 * sqrt(2.0 / 650));
    moments(h, &mean, &var, &lo, &hi);
    cr_assert_lt(fabs(sqrt(var) / sqrt(2.0 / 400) - 1), 0.02, "he sd %g", sqrt(var));
    wf_tensor_release(g);
    wf_tensor_release(h);
}

Test(core_init, same_seed_gives_identical_bits)
{
    const wf_init inits[] = { wf_init_uniform(5, -1, 1), wf_init_normal(5, 0, 1),
                              wf_init_glorot_uniform(5), wf_init_he_normal(5) };
    for (size_t k = 0; k < sizeof inits / sizeof inits[0]; k++) {
        wf_tensor *a = make(inits[k], WF_F32, WF_SHAPE(300, 70));
        wf_tensor *b = make(inits[k], WF_F32, WF_SHAPE(300, 70));
        cr_assert_eq(memcmp(wf_tensor_data(a), wf_tensor_data(b), 300 * 70 * sizeof(float)), 0,
                     "init %zu", k);
        wf_tensor_release(a);
        wf_tensor_release(b);
    }
}

Test(core_init, element_i_depends_only_on_seed_and_i)
{
    /* Uniform and normal draws do not depend on the shape: a longer tensor starts with the
     * same elements as a shorter one. */
    wf_tensor *a = make(wf_init_normal(9, 0, 1), WF_F64, WF_SHAPE(1000));
    wf_tensor *b = make(wf_init_normal(9, 0, 1), WF_F64, WF_SHAPE(50, 40));
    for (int i = 0; i < 1000; i++)
        cr_assert_eq(wf_tensor_get(a, i), wf_tensor_get(b, i), "element %d", i);
    wf_tensor_release(a);
    wf_tensor_release(b);
}

Test(core_init, f32_values_are_the_f64_values_rounded_once)
{
    wf_tensor *a = make(wf_init_uniform(13, -3, 3), WF_F64, WF_SHAPE(4096));
    wf_tensor *b = make(wf_init_uniform(13, -3, 3), WF_F32, WF_SHAPE(4096));
    wf_tensor *h = make(wf_init_uniform(13, -3, 3), WF_BF16, WF_SHAPE(4096));
    wf_tensor *f = make(wf_init_uniform(13, -3, 3), WF_F16, WF_SHAPE(4096));
    for (int i = 0; i < 4096; i++) {
        double v = wf_tensor_get(a, i);
        cr_assert_eq(wf_tensor_get(b, i), (double)(float)v, "element %d", i);
        cr_assert_lt(fabs(wf_tensor_get(h, i) - v), fabs(v) / 256 + 1e-30, "bf16 %d", i);
        cr_assert_lt(fabs(wf_tensor_get(f, i) - v), fabs(v) / 2048 + 1e-7, "f16 %d", i);
    }
    wf_tensor_release(a);
    wf_tensor_release(b);
    wf_tensor_release(h);
    wf_tensor_release(f);
}

Test(core_init, different_seeds_give_different_values)
{
    wf_tensor *a = make(wf_init_uniform(1, 0, 1), WF_F32, WF_SHAPE(1000));
    wf_tensor *b = make(wf_init_uniform(2, 0, 1), WF_F32, WF_SHAPE(1000));
    int same = 0;
    for (int i = 0; i < 1000; i++)
        same += wf_tensor_get(a, i) == wf_tensor_get(b, i);
    cr_assert_lt(same, 5, "%d of 1000 elements equal", same);
    /* Neighbouring elements of one tensor are not correlated. */
    double c = 0;
    for (int i = 0; i + 1 < 1000; i++)
        c += (wf_tensor_get(a, i) - 0.5) * (wf_tensor_get(a, i + 1) - 0.5);
    cr_assert_lt(fabs(c / 999 / (1.0 / 12)), 0.15, "lag-1 correlation %g", c / 999 * 12);
    wf_tensor_release(a);
    wf_tensor_release(b);
}

Test(core_init, empty_and_scalar_shapes_work)
{
    wf_tensor *e = make(wf_init_glorot_uniform(1), WF_F32, WF_SHAPE(0, 5));
    cr_assert_eq(wf_tensor_numel(e), 0);
    wf_tensor *s = make(wf_init_he_normal(1), WF_F32, WF_SCALAR);
    cr_assert(isfinite(wf_tensor_get(s, 0)));
    wf_tensor_release(e);
    wf_tensor_release(s);
}

Test(core_init, bad_arguments_are_refused)
{
    wf_tensor *t = (wf_tensor *)1;
    cr_assert_eq(wf_init_tensor(wf_init_zeros(), WF_F32, WF_SHAPE(2), NULL), WF_EINVAL);
    cr_assert_eq(wf_init_tensor(wf_init_zeros(), WF_DTYPE_INVALID, WF_SHAPE(2), &t), WF_EINVAL);
    cr_assert_null(t, "out is NULL after a failure");
    cr_assert_eq(wf_init_tensor(wf_init_zeros(), WF_F32, WF_SHAPE(-1, 2), &t), WF_EINVAL);
    cr_assert_eq(wf_init_tensor(wf_init_zeros(), WF_F32, (wf_shape){ .rank = 9 }, &t), WF_EINVAL);
    cr_assert_eq(wf_init_tensor((wf_init){ .kind = -1 }, WF_F32, WF_SHAPE(2), &t), WF_EINVAL);
    cr_assert_eq(wf_init_tensor(wf_init_uniform(1, 1, 0), WF_F32, WF_SHAPE(2), &t), WF_EINVAL);
    cr_assert_eq(wf_init_tensor(wf_init_uniform(1, 0, INFINITY), WF_F32, WF_SHAPE(2), &t),
                 WF_EINVAL);
    cr_assert_eq(wf_init_tensor(wf_init_normal(1, 0, NAN), WF_F32, WF_SHAPE(2), &t), WF_EINVAL);
    cr_assert_eq(wf_init_tensor(wf_init_glorot_uniform(1), WF_I32, WF_SHAPE(2, 2), &t), WF_EINVAL);
    cr_assert(strstr(wf_last_errmsg(), "float"), "message: %s", wf_last_errmsg());
    cr_assert_null(t);
}

/* A shard (wf_init_part) holds the bits of its slice of the full tensor: columns [begin,
 * begin + c) of an [r, full] weight (axis 1), rows of a [full, c] one (axis 0), for every kind
 * whose values depend on the element or the fans (Glorot and He take the full shape's). */
static void check_shard(wf_init init, wf_shape full, int axis, int64_t begin, int64_t len)
{
    wf_tensor *f = make(init, WF_F32, full);
    wf_shape ss = full;
    ss.dims[axis] = len;
    wf_tensor *s = make(wf_init_part(init, axis, begin, full.dims[axis]), WF_F32, ss);
    const float *fv = wf_tensor_data_f32(f), *sv = wf_tensor_data_f32(s);
    int64_t inner = 1;
    for (int k = axis + 1; k < full.rank; k++)
        inner *= full.dims[k];
    for (int64_t i = 0; i < wf_tensor_numel(s); i++) {
        int64_t o = i / (len * inner), j = (i / inner) % len, k = i % inner;
        int64_t at = (o * full.dims[axis] + j + begin) * inner + k;
        cr_assert(memcmp(&sv[i], &fv[at], sizeof(float)) == 0,
                  "kind %d axis %d begin %lld: shard element %lld is %.9g, the full tensor's "
                  "%lld is %.9g",
                  init.kind, axis, (long long)begin, (long long)i, sv[i], (long long)at, fv[at]);
    }
    wf_tensor_release(f);
    wf_tensor_release(s);
}

Test(core_init, a_shard_holds_the_bits_of_its_slice_of_the_full_tensor)
{
    wf_init kinds[] = { wf_init_glorot_uniform(7), wf_init_glorot_normal(8), wf_init_he_uniform(9),
                        wf_init_normal(10, 0.5, 2.0), wf_init_uniform(11, -1, 3) };
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        check_shard(kinds[k], WF_SHAPE(6, 8), 1, 4, 4); /* the second half of the columns */
        check_shard(kinds[k], WF_SHAPE(6, 8), 1, 2, 3);
        check_shard(kinds[k], WF_SHAPE(9, 5), 0, 3, 3); /* the middle third of the rows */
        check_shard(kinds[k], WF_SHAPE(9), 0, 6, 3);    /* a bias */
        check_shard(kinds[k], WF_SHAPE(2, 6, 3), 1, 2, 2);
    }
}

Test(core_init, a_shard_outside_its_full_tensor_is_refused_naming_the_range)
{
    wf_tensor *t = NULL;
    int rc = wf_init_tensor(wf_init_part(wf_init_glorot_uniform(1), 1, 6, 8), WF_F32,
                            WF_SHAPE(4, 4), &t);
    cr_assert_eq(rc, WF_EINVAL, "got %s", wf_err_name(rc));
    cr_assert_null(t);
    cr_assert(strstr(wf_last_errmsg(), "at 6 along axis 1") &&
                  strstr(wf_last_errmsg(), "full dimension of 8"),
              "message: %s", wf_last_errmsg());
    rc = wf_init_tensor(wf_init_part(wf_init_ones(), 2, 0, 8), WF_F32, WF_SHAPE(4, 4), &t);
    cr_assert_eq(rc, WF_EINVAL, "axis 2 of a rank-2 shard: got %s", wf_err_name(rc));
}
