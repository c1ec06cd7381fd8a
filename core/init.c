/* core/init.c: variable initializers (zeros, ones, constant, uniform, normal, Glorot, He).
 * Owns: the counter-based generator: element i of a tensor is a function of (seed, i) only,
 *   bits(seed, c) = splitmix64(seed ^ splitmix64(c)), so values never depend on thread
 *   count, scheduling or the order elements are filled in, and any slice can be filled
 *   independently (a shard of a split weight, wf_init.part_*, draws its elements' indices in the
 *   full tensor and takes the full shape's fans, so it holds the full tensor's slice). Uniform
 *   draws use bits(seed, i); normal draws use Box-Muller on
 *   bits(seed, 2i) and bits(seed, 2i + 1) (the cosine branch only: one draw per element
 *   keeps the element-i-only property).
 * Invariant: a value is computed in double and stored once (f32: one rounding; bf16/f16:
 *   wf__store_f64, round to nearest even), so the same (init, dtype, shape) gives the same
 *   bits on every machine with IEEE doubles and a correctly rounded sqrt (log and cos come
 *   from libm: the same libm gives the same bits).
 * Not here: dropout masks and other random ops (ops/). */
#include "internal.h"
#include "tensor.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static uint64_t splitmix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15u;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

static uint64_t bits(uint64_t seed, uint64_t counter)
{
    return splitmix64(seed ^ splitmix64(counter));
}

/* [0, 1) with 53 random bits. */
static double unit(uint64_t x)
{
    return (double)(x >> 11) * 0x1.0p-53;
}

/* (0, 1]: safe for log(). */
static double unit_open0(uint64_t x)
{
    return (double)((x >> 11) + 1) * 0x1.0p-53;
}

static double normal01(uint64_t seed, uint64_t i)
{
    double u1 = unit_open0(bits(seed, 2 * i)), u2 = unit(bits(seed, 2 * i + 1));
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586476925 * u2);
}

/* Fans as core.h documents them (rank 0: 1 and 1; rank 1: dims[0] for both). */
static void fans(wf_shape s, double *fan_in, double *fan_out)
{
    if (s.rank == 0) {
        *fan_in = *fan_out = 1;
    } else if (s.rank == 1) {
        *fan_in = *fan_out = (double)s.dims[0];
    } else if (s.rank == 2) {
        *fan_in = (double)s.dims[0];
        *fan_out = (double)s.dims[1];
    } else {
        double rf = 1;
        for (int i = 2; i < s.rank; i++)
            rf *= (double)s.dims[i];
        *fan_in = (double)s.dims[1] * rf;
        *fan_out = (double)s.dims[0] * rf;
    }
}

static const char *const kind_names[] = {
    "zeros",          "ones",          "constant",   "uniform",   "normal",
    "glorot_uniform", "glorot_normal", "he_uniform", "he_normal",
};

int wf__init_check(wf_init init, wf_dtype dt, wf_shape shape, char *err, size_t errlen)
{
    if (init.kind < WF_INIT_ZEROS || init.kind > WF_INIT_HE_NORMAL) {
        snprintf(err, errlen, "initializer kind %d is not a WF_INIT_* value", init.kind);
        return WF_EINVAL;
    }
    if (init.kind == WF_INIT_UNIFORM &&
        !(isfinite(init.a) && isfinite(init.b) && init.a <= init.b)) {
        snprintf(err, errlen, "uniform initializer: [%g, %g) is not a finite range", init.a,
                 init.b);
        return WF_EINVAL;
    }
    if (init.kind == WF_INIT_NORMAL && !(isfinite(init.a) && isfinite(init.b) && init.b >= 0)) {
        snprintf(err, errlen, "normal initializer: mean %g and stddev %g (stddev must be >= 0)",
                 init.a, init.b);
        return WF_EINVAL;
    }
    if (init.kind >= WF_INIT_GLOROT_UNIFORM && !wf_dtype_is_float(dt)) {
        snprintf(err, errlen, "%s initializer needs a float dtype, not %s", kind_names[init.kind],
                 wf_dtype_name(dt));
        return WF_EINVAL;
    }
    if (init.part_full == 0 && init.part_begin == 0 && init.part_axis == 0)
        return 0;
    if (init.part_axis < 0 || init.part_axis >= shape.rank || init.part_full < 1 ||
        init.part_begin < 0 || shape.dims[init.part_axis] < 0 ||
        init.part_begin + shape.dims[init.part_axis] > init.part_full) {
        char sh[160];
        snprintf(err, errlen,
                 "a shard %s at %lld along axis %d does not fit in a full dimension of %lld",
                 wf_shape_str(shape, sh, sizeof sh), (long long)init.part_begin, init.part_axis,
                 (long long)init.part_full);
        return WF_EINVAL;
    }
    return 0;
}

/* The full tensor's flat index of a shard's element i (wf_init.part_*), or i itself. */
static uint64_t full_index(wf_init init, wf_shape shape, int64_t i)
{
    if (init.part_full == 0)
        return (uint64_t)i;
    int64_t inner = 1, d = shape.dims[init.part_axis];
    for (int k = init.part_axis + 1; k < shape.rank; k++)
        inner *= shape.dims[k];
    int64_t o = i / (d * inner), j = (i / inner) % d, k = i % inner;
    return (uint64_t)((o * init.part_full + j + init.part_begin) * inner + k);
}

int wf_init_tensor(wf_init init, wf_dtype dt, wf_shape shape, wf_tensor **out)
{
    if (!out)
        return wf__err(WF_EINVAL, "wf_init_tensor: out is NULL");
    *out = NULL;
    char err[WF_ERRMSG_MAX];
    if (wf__init_check(init, dt, shape, err, sizeof err) < 0)
        return wf__err(WF_EINVAL, "wf_init_tensor: %s", err);
    wf_tensor *t = wf__tensor_alloc(dt, shape); /* checks dtype, rank and dims */
    if (!t) {
        /* wf__tensor_alloc set the message; keep its code distinct from no memory. */
        return strstr(wf_last_errmsg(), "no memory") ? WF_ENOMEM : WF_EINVAL;
    }
    double lo = 0, hi = 0, mean = 0, sd = 0, fi, fo;
    bool normal = false;
    wf_shape full = shape;
    if (init.part_full > 0)
        full.dims[init.part_axis] = init.part_full;
    fans(full, &fi, &fo);
    switch (init.kind) {
    case WF_INIT_ZEROS:
        break;
    case WF_INIT_ONES:
        lo = hi = 1;
        break;
    case WF_INIT_CONSTANT:
        lo = hi = init.a;
        break;
    case WF_INIT_UNIFORM:
        lo = init.a;
        hi = init.b;
        break;
    case WF_INIT_NORMAL:
        normal = true;
        mean = init.a;
        sd = init.b;
        break;
    case WF_INIT_GLOROT_UNIFORM:
        hi = fi + fo > 0 ? sqrt(6.0 / (fi + fo)) : 0;
        lo = -hi;
        break;
    case WF_INIT_GLOROT_NORMAL:
        normal = true;
        sd = fi + fo > 0 ? sqrt(2.0 / (fi + fo)) : 0;
        break;
    case WF_INIT_HE_UNIFORM:
        hi = fi > 0 ? sqrt(6.0 / fi) : 0;
        lo = -hi;
        break;
    case WF_INIT_HE_NORMAL:
        normal = true;
        sd = fi > 0 ? sqrt(2.0 / fi) : 0;
        break;
    }
    size_t es = wf_dtype_size(dt);
    bool random = init.kind >= WF_INIT_UNIFORM;
    for (int64_t i = 0; i < t->numel; i++) {
        double v;
        uint64_t at = random ? full_index(init, shape, i) : 0;
        if (!random)
            v = lo;
        else if (normal)
            v = mean + sd * normal01(init.seed, at);
        else
            v = lo + (hi - lo) * unit(bits(init.seed, at));
        char *p = t->data + (size_t)i * es;
        if (dt == WF_F32)
            *(float *)p = (float)v;
        else if (dt == WF_F64)
            *(double *)p = v;
        else
            wf__store_f64(dt, p, v);
    }
    *out = t;
    return 0;
}
