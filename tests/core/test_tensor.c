/* tests/core/test_tensor.c: tensors and dtypes through the public API: creation (copies,
 * zeros, bad arguments), refcounts, views with strides (transposed, negative, broadcast
 * zero strides), contiguity, the typed accessors, wf_tensor_read conversions (float to
 * integer truncation and saturation, bool, u8) and bf16/f16: exhaustive round trips,
 * round-to-nearest-even ties, overflow, subnormals, NaN, and rounding straight from f64
 * (one rounding, not two). */
#include "wf_test.h"

#include <weft/weft.h>

#include <criterion/criterion.h>

#include <math.h>
#include <stdint.h>
#include <string.h>

TestSuite(core_tensor, .fini = wf_test_fini, .timeout = 10);

/* ---- dtypes ------------------------------------------------------------------------------ */

Test(core_tensor, dtype_sizes_names_and_float_flags)
{
    cr_assert_eq(wf_dtype_size(WF_F32), 4);
    cr_assert_eq(wf_dtype_size(WF_F64), 8);
    cr_assert_eq(wf_dtype_size(WF_I32), 4);
    cr_assert_eq(wf_dtype_size(WF_I64), 8);
    cr_assert_eq(wf_dtype_size(WF_U8), 1);
    cr_assert_eq(wf_dtype_size(WF_BOOL), 1);
    cr_assert_eq(wf_dtype_size(WF_BF16), 2);
    cr_assert_eq(wf_dtype_size(WF_F16), 2);
    cr_assert_eq(wf_dtype_size(WF_DTYPE_INVALID), 0);
    cr_assert_eq(wf_dtype_size((wf_dtype)WF_DTYPE_COUNT), 0);
    cr_assert_eq(wf_dtype_size((wf_dtype)-1), 0);
    cr_assert_str_eq(wf_dtype_name(WF_BF16), "bf16");
    cr_assert_str_eq(wf_dtype_name(WF_BOOL), "bool");
    cr_assert_str_eq(wf_dtype_name((wf_dtype)77), "invalid");
    cr_assert(wf_dtype_is_float(WF_F16));
    cr_assert(wf_dtype_is_float(WF_F64));
    cr_assert_not(wf_dtype_is_float(WF_I32));
    cr_assert_not(wf_dtype_is_float(WF_BOOL));
}

/* ---- Creation and refcounts -------------------------------------------------------------- */

Test(core_tensor, create_copies_the_data)
{
    float data[6] = { 1, 2, 3, 4, 5, 6 };
    wf_tensor *t;
    cr_assert_eq(wf_tensor_create(WF_F32, WF_SHAPE(2, 3), data, &t), 0, "%s", wf_last_errmsg());
    data[0] = 100;
    const float *p = wf_tensor_data_f32(t);
    cr_assert_not_null(p);
    cr_assert_eq(p[0], 1.0f, "the tensor has its own copy");
    cr_assert_eq(p[5], 6.0f);
    cr_assert_eq(wf_tensor_numel(t), 6);
    cr_assert(wf_tensor_is_contiguous(t));
    cr_assert_eq(wf_tensor_strides(t)[0], 3);
    cr_assert_eq(wf_tensor_strides(t)[1], 1);
    cr_assert_eq((uintptr_t)wf_tensor_data(t) % 64, 0, "data is 64-byte aligned");
    cr_assert_null(wf_tensor_data_f64(t), "typed accessors check the dtype");
    cr_assert_null(wf_tensor_data_i32(t));
    wf_tensor_release(t);
}

Test(core_tensor, create_without_data_gives_zeros)
{
    wf_tensor *t = wf_tensor_from(WF_I64, WF_SHAPE(5), NULL);
    cr_assert_not_null(t);
    for (int i = 0; i < 5; i++)
        cr_assert_eq(wf_tensor_data_i64(t)[i], 0);
    wf_tensor_release(t);
    wf_tensor *s = wf_tensor_from(WF_F64, WF_SCALAR, NULL);
    cr_assert_eq(wf_tensor_numel(s), 1);
    cr_assert_eq(wf_tensor_get(s, 0), 0.0);
    wf_tensor_release(s);
    wf_tensor *e = wf_tensor_from(WF_F32, WF_SHAPE(0, 3), NULL);
    cr_assert_not_null(e, "empty tensors are fine: %s", wf_last_errmsg());
    cr_assert_eq(wf_tensor_numel(e), 0);
    wf_tensor_release(e);
}

Test(core_tensor, create_refuses_bad_arguments)
{
    wf_tensor *t = (wf_tensor *)1;
    cr_assert_eq(wf_tensor_create(WF_F32, WF_SHAPE(2), NULL, NULL), WF_EINVAL);
    cr_assert_eq(wf_tensor_create(WF_DTYPE_INVALID, WF_SHAPE(2), NULL, &t), WF_EINVAL);
    cr_assert_null(t);
    cr_assert_eq(wf_tensor_create((wf_dtype)50, WF_SHAPE(2), NULL, &t), WF_EINVAL);
    cr_assert_eq(wf_tensor_create(WF_F32, WF_SHAPE(-1, 2), NULL, &t), WF_EINVAL);
    cr_assert(strstr(wf_last_errmsg(), "[?, 2]"), "message: %s", wf_last_errmsg());
    cr_assert_eq(wf_tensor_create(WF_F32, (wf_shape){ .rank = 9 }, NULL, &t), WF_EINVAL);
    cr_assert_eq(wf_tensor_create(WF_F32, WF_SHAPE(1 << 30, 1 << 30, 1 << 30), NULL, &t), WF_EINVAL,
                 "a size that overflows is refused, not allocated");
    cr_assert_null(wf_tensor_from(WF_F32, WF_SHAPE(-3), NULL));
}

Test(core_tensor, retain_and_release_count_references)
{
    wf_tensor *t = wf_tensor_from(WF_F32, WF_SHAPE(3), NULL);
    cr_assert_eq(wf_tensor_retain(t), t);
    wf_tensor_release(t);
    cr_assert_eq(wf_tensor_numel(t), 3, "still alive after one of two releases");
    wf_tensor_release(t); /* ASan: freed exactly once, no leak */
    cr_assert_null(wf_tensor_retain(NULL));
    wf_tensor_release(NULL);
}

Test(core_tensor, queries_accept_null)
{
    cr_assert_eq(wf_tensor_dtype(NULL), WF_DTYPE_INVALID);
    cr_assert_eq(wf_tensor_shape(NULL).rank, 0);
    cr_assert_eq(wf_tensor_numel(NULL), 0);
    cr_assert_null(wf_tensor_strides(NULL));
    cr_assert_not(wf_tensor_is_contiguous(NULL));
    cr_assert_null(wf_tensor_data(NULL));
    cr_assert_null(wf_tensor_data_f32(NULL));
    cr_assert(isnan(wf_tensor_get(NULL, 0)));
}

/* ---- Views ------------------------------------------------------------------------------- */

Test(core_tensor, view_reads_caller_memory_in_place)
{
    float data[4] = { 1, 2, 3, 4 };
    wf_tensor *v;
    cr_assert_eq(wf_tensor_view(WF_F32, WF_SHAPE(2, 2), NULL, data, &v), 0);
    cr_assert(wf_tensor_is_contiguous(v));
    cr_assert_eq(wf_tensor_data(v), data);
    cr_assert_eq(wf_tensor_get(v, 3), 4.0);
    wf_tensor_release(v);
}

Test(core_tensor, transposed_view_reads_in_row_major_order)
{
    /* data is 2x3 row-major; the view is its 3x2 transpose. */
    int32_t data[6] = { 0, 1, 2, 10, 11, 12 };
    int64_t strides[2] = { 1, 3 };
    wf_tensor *v;
    cr_assert_eq(wf_tensor_view(WF_I32, WF_SHAPE(3, 2), strides, data, &v), 0);
    cr_assert_not(wf_tensor_is_contiguous(v));
    cr_assert_null(wf_tensor_data_i32(v), "no flat pointer to a strided view");
    cr_assert_eq(wf_tensor_strides(v)[0], 1);
    int32_t out[6];
    cr_assert_eq(wf_tensor_read(v, WF_I32, out, sizeof out), 0);
    const int32_t want[6] = { 0, 10, 1, 11, 2, 12 };
    cr_assert_arr_eq(out, want, sizeof want);
    cr_assert_eq(wf_tensor_get(v, 1), 10.0);
    /* Converting while reading a strided view. */
    double d[6];
    cr_assert_eq(wf_tensor_read(v, WF_F64, d, sizeof d), 0);
    for (int i = 0; i < 6; i++)
        cr_assert_eq(d[i], (double)want[i]);
    wf_tensor_release(v);
}

Test(core_tensor, negative_and_zero_strides_work)
{
    float data[4] = { 1, 2, 3, 4 };
    int64_t rev[1] = { -1 };
    wf_tensor *r;
    cr_assert_eq(wf_tensor_view(WF_F32, WF_SHAPE(4), rev, data + 3, &r), 0);
    float out[4];
    cr_assert_eq(wf_tensor_read(r, WF_F32, out, sizeof out), 0);
    cr_assert(out[0] == 4 && out[1] == 3 && out[2] == 2 && out[3] == 1);
    wf_tensor_release(r);
    /* A broadcast view: a row repeated three times with stride 0. */
    int64_t bc[2] = { 0, 1 };
    wf_tensor *b;
    cr_assert_eq(wf_tensor_view(WF_F32, WF_SHAPE(3, 4), bc, data, &b), 0);
    cr_assert_not(wf_tensor_is_contiguous(b));
    float rows[12];
    cr_assert_eq(wf_tensor_read(b, WF_F32, rows, sizeof rows), 0);
    for (int i = 0; i < 12; i++)
        cr_assert_eq(rows[i], data[i % 4]);
    wf_tensor_release(b);
}

Test(core_tensor, unit_dimensions_do_not_break_contiguity)
{
    float data[3] = { 1, 2, 3 };
    int64_t strides[3] = { 999, 1, 77 }; /* dims of size 1 may have any stride */
    wf_tensor *v;
    cr_assert_eq(wf_tensor_view(WF_F32, WF_SHAPE(1, 3, 1), strides, data, &v), 0);
    cr_assert(wf_tensor_is_contiguous(v));
    wf_tensor_release(v);
}

Test(core_tensor, view_refuses_bad_arguments)
{
    float data[2] = { 0, 0 };
    wf_tensor *v = (wf_tensor *)1;
    cr_assert_eq(wf_tensor_view(WF_F32, WF_SHAPE(2), NULL, data, NULL), WF_EINVAL);
    cr_assert_eq(wf_tensor_view(WF_F32, WF_SHAPE(2), NULL, NULL, &v), WF_EINVAL);
    cr_assert_null(v);
    cr_assert_eq(wf_tensor_view(WF_DTYPE_INVALID, WF_SHAPE(2), NULL, data, &v), WF_EINVAL);
    cr_assert_eq(wf_tensor_view(WF_F32, WF_SHAPE(-1), NULL, data, &v), WF_EINVAL);
    cr_assert_eq(wf_tensor_view(WF_F32, WF_SHAPE(0), NULL, NULL, &v), 0, "empty: no data needed");
    wf_tensor_release(v);
}

/* ---- wf_tensor_read conversions -------------------------------------------------------- */

Test(core_tensor, read_checks_its_arguments)
{
    wf_tensor *t = wf_tensor_from(WF_F32, WF_SHAPE(4), NULL);
    float out[4];
    cr_assert_eq(wf_tensor_read(t, WF_F32, out, sizeof out - 1), WF_EINVAL);
    cr_assert(strstr(wf_last_errmsg(), "15 bytes"), "message: %s", wf_last_errmsg());
    cr_assert_eq(wf_tensor_read(NULL, WF_F32, out, sizeof out), WF_EINVAL);
    cr_assert_eq(wf_tensor_read(t, WF_F32, NULL, sizeof out), WF_EINVAL);
    cr_assert_eq(wf_tensor_read(t, WF_DTYPE_INVALID, out, sizeof out), WF_EINVAL);
    cr_assert_eq(wf_tensor_read(t, WF_F64, out, sizeof out), WF_EINVAL, "f64 needs 32 bytes");
    cr_assert(isnan(wf_tensor_get(t, 4)));
    cr_assert(isnan(wf_tensor_get(t, -1)));
    wf_tensor_release(t);
}

Test(core_tensor, float_to_integer_truncates_toward_zero_and_saturates)
{
    float data[8] = { 2.7f, -2.7f, 0.5f, -0.5f, 3e9f, -3e9f, NAN, INFINITY };
    wf_tensor *t = wf_tensor_from(WF_F32, WF_SHAPE(8), data);
    int32_t i32[8];
    cr_assert_eq(wf_tensor_read(t, WF_I32, i32, sizeof i32), 0);
    const int32_t want[8] = { 2, -2, 0, 0, INT32_MAX, INT32_MIN, 0, INT32_MAX };
    cr_assert_arr_eq(i32, want, sizeof want);
    int64_t i64[8];
    cr_assert_eq(wf_tensor_read(t, WF_I64, i64, sizeof i64), 0);
    cr_assert_eq(i64[4], 3000000000);
    cr_assert_eq(i64[5], -3000000000);
    cr_assert_eq(i64[6], 0);
    uint8_t u8[8];
    cr_assert_eq(wf_tensor_read(t, WF_U8, u8, sizeof u8), 0);
    const uint8_t want_u8[8] = { 2, 0, 0, 0, 255, 0, 0, 255 };
    cr_assert_arr_eq(u8, want_u8, sizeof want_u8);
    uint8_t b[8];
    cr_assert_eq(wf_tensor_read(t, WF_BOOL, b, sizeof b), 0);
    const uint8_t want_b[8] = { 1, 1, 1, 1, 1, 1, 1, 1 }; /* x != 0, and NaN != 0 */
    cr_assert_arr_eq(b, want_b, sizeof want_b);
    wf_tensor_release(t);
}

Test(core_tensor, integers_read_as_floats_exactly)
{
    int64_t data[3] = { -7, 1 << 24, (int64_t)1 << 53 };
    wf_tensor *t = wf_tensor_from(WF_I64, WF_SHAPE(3), data);
    double d[3];
    cr_assert_eq(wf_tensor_read(t, WF_F64, d, sizeof d), 0);
    cr_assert(d[0] == -7 && d[1] == 16777216.0 && d[2] == 9007199254740992.0);
    uint8_t bools[3];
    cr_assert_eq(wf_tensor_read(t, WF_BOOL, bools, sizeof bools), 0);
    cr_assert(bools[0] == 1 && bools[1] == 1 && bools[2] == 1);
    wf_tensor_release(t);
}

/* ---- bf16 and f16 ---------------------------------------------------------------------- */

static uint16_t f32_to(wf_dtype dt, float f)
{
    wf_tensor *t = wf_tensor_from(WF_F32, WF_SCALAR, &f);
    uint16_t h = 0;
    cr_assert_eq(wf_tensor_read(t, dt, &h, sizeof h), 0);
    wf_tensor_release(t);
    return h;
}

static uint16_t f64_to(wf_dtype dt, double v)
{
    wf_tensor *t = wf_tensor_from(WF_F64, WF_SCALAR, &v);
    uint16_t h = 0;
    cr_assert_eq(wf_tensor_read(t, dt, &h, sizeof h), 0);
    wf_tensor_release(t);
    return h;
}

static float to_f32(wf_dtype dt, uint16_t h)
{
    wf_tensor *t = wf_tensor_from(dt, WF_SCALAR, &h);
    float f = 0;
    cr_assert_eq(wf_tensor_read(t, WF_F32, &f, sizeof f), 0);
    wf_tensor_release(t);
    return f;
}

/* Every one of the 65536 bit patterns survives half -> f32 -> half (NaNs stay NaN). */
static void exhaustive_round_trip(wf_dtype dt)
{
    static uint16_t all[65536], back[65536];
    static float f[65536];
    for (int i = 0; i < 65536; i++)
        all[i] = (uint16_t)i;
    wf_tensor *h = wf_tensor_from(dt, WF_SHAPE(65536), all);
    cr_assert_eq(wf_tensor_read(h, WF_F32, f, sizeof f), 0);
    wf_tensor *g = wf_tensor_from(WF_F32, WF_SHAPE(65536), f);
    cr_assert_eq(wf_tensor_read(g, dt, back, sizeof back), 0);
    for (int i = 0; i < 65536; i++) {
        if (isnan(f[i]))
            cr_assert(isnan(to_f32(dt, back[i])), "%s 0x%04x: NaN lost", wf_dtype_name(dt), i);
        else
            cr_assert_eq(back[i], all[i], "%s 0x%04x -> %a -> 0x%04x", wf_dtype_name(dt), i,
                         (double)f[i], back[i]);
    }
    wf_tensor_release(h);
    wf_tensor_release(g);
}

Test(core_tensor, bf16_round_trips_every_value)
{
    exhaustive_round_trip(WF_BF16);
}

Test(core_tensor, f16_round_trips_every_value)
{
    exhaustive_round_trip(WF_F16);
}

Test(core_tensor, bf16_rounds_to_nearest_even)
{
    cr_assert_eq(f32_to(WF_BF16, 1.0f), 0x3f80);
    cr_assert_eq(f32_to(WF_BF16, 1.0f + 0x1p-8f), 0x3f80, "tie goes to even (down)");
    cr_assert_eq(f32_to(WF_BF16, 1.0f + 3 * 0x1p-8f), 0x3f82, "tie goes to even (up)");
    cr_assert_eq(f32_to(WF_BF16, 1.0f + 0x1p-8f + 0x1p-20f), 0x3f81, "above the tie: up");
    cr_assert_eq(f32_to(WF_BF16, -1.0f - 0x1p-8f - 0x1p-20f), 0xbf81);
    cr_assert_eq(f32_to(WF_BF16, 3.4e38f), 0x7f80, "overflow rounds to infinity");
    cr_assert_eq(f32_to(WF_BF16, -INFINITY), 0xff80);
    cr_assert_eq(f32_to(WF_BF16, -0.0f), 0x8000);
    cr_assert(isnan(to_f32(WF_BF16, f32_to(WF_BF16, NAN))));
    cr_assert_eq(to_f32(WF_BF16, 0x4049), 3.140625f);
}

Test(core_tensor, f16_rounds_to_nearest_even)
{
    cr_assert_eq(f32_to(WF_F16, 1.0f), 0x3c00);
    cr_assert_eq(f32_to(WF_F16, 1.0f + 0x1p-11f), 0x3c00, "tie goes to even (down)");
    cr_assert_eq(f32_to(WF_F16, 1.0f + 3 * 0x1p-11f), 0x3c02, "tie goes to even (up)");
    cr_assert_eq(f32_to(WF_F16, 65504.0f), 0x7bff, "the largest half");
    cr_assert_eq(f32_to(WF_F16, 65519.0f), 0x7bff, "below the overflow threshold");
    cr_assert_eq(f32_to(WF_F16, 65520.0f), 0x7c00, "65520 rounds to infinity");
    cr_assert_eq(f32_to(WF_F16, -1e10f), 0xfc00);
    cr_assert_eq(f32_to(WF_F16, 0x1p-24f), 0x0001, "the smallest subnormal");
    cr_assert_eq(f32_to(WF_F16, 0x1p-25f), 0x0000, "half of it ties to even: zero");
    cr_assert_eq(f32_to(WF_F16, 0x1.8p-25f), 0x0001, "above half: up");
    cr_assert_eq(f32_to(WF_F16, 3 * 0x1p-25f), 0x0002, "1.5 ulps ties to even: 2");
    cr_assert_eq(f32_to(WF_F16, 1023.75f * 0x1p-24f), 0x0400, "a subnormal rounding up to normal");
    cr_assert_eq(f32_to(WF_F16, 1e-10f), 0x0000);
    cr_assert_eq(f32_to(WF_F16, -0.0f), 0x8000);
    cr_assert(isnan(to_f32(WF_F16, f32_to(WF_F16, NAN))));
    cr_assert_eq(to_f32(WF_F16, 0x0001), 0x1p-24f);
    cr_assert_eq(to_f32(WF_F16, 0x03ff), 0x3ffp-24f, "the largest subnormal");
    cr_assert_eq(to_f32(WF_F16, 0x7c00), INFINITY);
}

/* Storing an f64 rounds once, to the half type: rounding to f32 first would turn a value
 * just above a tie into an exact tie and then round it the wrong way. */
Test(core_tensor, f64_to_half_types_rounds_once)
{
    cr_assert_eq(f64_to(WF_BF16, 1.0 + 0x1p-8 + 0x1p-30), 0x3f81, "bf16: just above the tie");
    cr_assert_eq(f64_to(WF_BF16, 1.0 + 0x1p-8 - 0x1p-30), 0x3f80, "bf16: just below the tie");
    cr_assert_eq(f64_to(WF_BF16, 1.0 + 0x1p-8), 0x3f80, "bf16: an exact tie stays even");
    cr_assert_eq(f64_to(WF_F16, 1.0 + 0x1p-11 + 0x1p-40), 0x3c01, "f16: just above the tie");
    cr_assert_eq(f64_to(WF_F16, 1.0 + 0x1p-11), 0x3c00);
    cr_assert_eq(f64_to(WF_F16, 0x1p-25 + 0x1p-50), 0x0001, "f16 subnormal: above the tie");
    cr_assert_eq(f64_to(WF_F16, 1e300), 0x7c00);
    cr_assert_eq(f64_to(WF_BF16, 1e300), 0x7f80, "beyond f32's range: infinity");
    cr_assert_eq(f64_to(WF_BF16, -1e300), 0xff80);
    cr_assert(isnan(to_f32(WF_BF16, f64_to(WF_BF16, NAN))));
    cr_assert(isnan(to_f32(WF_F16, f64_to(WF_F16, NAN))));
    cr_assert_eq(f64_to(WF_F16, INFINITY), 0x7c00);
}

Test(core_tensor, half_tensors_convert_to_every_dtype)
{
    uint16_t h[3] = { 0x3c00, 0xc100, 0x0000 }; /* f16 1, -2.5, 0 */
    wf_tensor *t = wf_tensor_from(WF_F16, WF_SHAPE(3), h);
    double d[3];
    cr_assert_eq(wf_tensor_read(t, WF_F64, d, sizeof d), 0);
    cr_assert(d[0] == 1.0 && d[1] == -2.5 && d[2] == 0.0);
    int32_t i[3];
    cr_assert_eq(wf_tensor_read(t, WF_I32, i, sizeof i), 0);
    cr_assert(i[0] == 1 && i[1] == -2 && i[2] == 0);
    uint16_t b[3];
    cr_assert_eq(wf_tensor_read(t, WF_BF16, b, sizeof b), 0);
    cr_assert(b[0] == 0x3f80 && b[1] == 0xc020 && b[2] == 0);
    wf_tensor_release(t);
}
