/* core/dtype.c: element types: sizes, names, and conversions between them.
 * Owns: the dtype tables and the bf16/f16 <-> f32 conversions (round to nearest even, NaN
 * kept quiet), and the load/store of one element as double that generic code uses (f64 to
 * bf16/f16 rounds once, through a round-to-odd f32).
 * Not here: vectorised casts (ops/ owns kernels). */
#include "tensor.h"

#include <math.h>
#include <string.h>

static const struct {
    const char *name;
    size_t size;
} dtypes[WF_DTYPE_COUNT] = {
    [WF_DTYPE_INVALID] = { "invalid", 0 },
    [WF_F32] = { "f32", 4 },
    [WF_F64] = { "f64", 8 },
    [WF_I32] = { "i32", 4 },
    [WF_I64] = { "i64", 8 },
    [WF_U8] = { "u8", 1 },
    [WF_BOOL] = { "bool", 1 },
    [WF_BF16] = { "bf16", 2 },
    [WF_F16] = { "f16", 2 },
};

size_t wf_dtype_size(wf_dtype dt)
{
    return (unsigned)dt < WF_DTYPE_COUNT ? dtypes[dt].size : 0;
}

const char *wf_dtype_name(wf_dtype dt)
{
    return (unsigned)dt < WF_DTYPE_COUNT ? dtypes[dt].name : "invalid";
}

bool wf_dtype_is_float(wf_dtype dt)
{
    return dt == WF_F32 || dt == WF_F64 || dt == WF_BF16 || dt == WF_F16;
}

float wf__bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t wf__f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it a (quiet) NaN */
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1); /* round to nearest even */
    return (uint16_t)(u >> 16);
}

float wf__f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    uint32_t u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do {
                man <<= 1;
                e++;
            } while (!(man & 0x400));
            u = sign | (uint32_t)(112 - e) << 23 | (man & 0x3ff) << 13;
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | man << 13;
    } else {
        u = sign | (exp + 112) << 23 | man << 13;
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t wf__f32_to_f16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000;
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00); /* NaN */
    if (a >= 0x477ff000u)                 /* rounds to >= 65520: infinity */
        return (uint16_t)(sign | 0x7c00);
    if (a < 0x38800000u) { /* below the smallest normal half: subnormal or zero */
        if (a < 0x33000000u)
            return (uint16_t)sign; /* below half the smallest subnormal */
        uint32_t e = a >> 23, m = (a & 0x7fffff) | 0x800000;
        uint32_t shift = 126 - e; /* 14..24 */
        uint32_t r = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1)))
            r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = a - 0x38000000u; /* rebias exponent 127 -> 15 */
    r += 0xfffu + ((r >> 13) & 1);
    return (uint16_t)(sign | (r >> 13));
}

/* 'v' rounded to f32 by round-to-odd: truncated toward zero, with the last bit set if
 * anything was cut. Rounding that to bf16 or f16 (8 and 11 bits, at least 2 fewer than
 * f32's 24) then gives the correctly rounded result; rounding to nearest f32 first would
 * round twice (1 + 2^-8 + 2^-30 would become the tie 1 + 2^-8, then 1 instead of
 * 1 + 2^-7). */
static float f32_round_odd(double v)
{
    float f = (float)v;
    if (isnan(v) || (double)f == v)
        return f;
    uint32_t u;
    memcpy(&u, &f, 4);
    if (fabs((double)f) > fabs(v))
        u -= 1; /* one step toward zero; inf becomes FLT_MAX */
    u |= 1;
    memcpy(&f, &u, 4);
    return f;
}

double wf__load_f64(wf_dtype dt, const void *p)
{
    switch (dt) {
    case WF_F32:
        return *(const float *)p;
    case WF_F64:
        return *(const double *)p;
    case WF_I32:
        return *(const int32_t *)p;
    case WF_I64:
        return (double)*(const int64_t *)p;
    case WF_U8:
    case WF_BOOL:
        return *(const uint8_t *)p;
    case WF_BF16:
        return wf__bf16_to_f32(*(const uint16_t *)p);
    case WF_F16:
        return wf__f16_to_f32(*(const uint16_t *)p);
    default:
        return NAN;
    }
}

void wf__store_f64(wf_dtype dt, void *p, double v)
{
    switch (dt) {
    case WF_F32:
        *(float *)p = (float)v;
        break;
    case WF_F64:
        *(double *)p = v;
        break;
    case WF_I32:
        *(int32_t *)p = isnan(v)             ? 0
                        : v >= 2147483647.0  ? INT32_MAX
                        : v <= -2147483648.0 ? INT32_MIN
                                             : (int32_t)v;
        break;
    case WF_I64:
        *(int64_t *)p = isnan(v)                      ? 0
                        : v >= 9.2233720368547758e18  ? INT64_MAX
                        : v <= -9.2233720368547758e18 ? INT64_MIN
                                                      : (int64_t)v;
        break;
    case WF_U8:
        *(uint8_t *)p = isnan(v) || v <= 0 ? 0 : v >= 255 ? 255 : (uint8_t)v;
        break;
    case WF_BOOL:
        *(uint8_t *)p = v != 0;
        break;
    case WF_BF16:
        *(uint16_t *)p = wf__f32_to_bf16(f32_round_odd(v));
        break;
    case WF_F16:
        *(uint16_t *)p = wf__f32_to_f16(f32_round_odd(v));
        break;
    default:
        break;
    }
}
