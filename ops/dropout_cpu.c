/* ops/dropout_cpu.c: the CPU kernel of dropout.
 * Owns: the mask: element i (row-major index) is kept iff unit(bits(key, i)) >= rate with
 *   key = bits(seed, step) (core/rng.h), and a kept element becomes x * (1 / (1 - rate))
 *   computed in f64 and rounded once; a dropped one is exactly 0.
 * Invariants: each element is a function of (x[i], seed, step, i) only, so the bits never
 *   depend on the worker count or the split; a strided x is first copied into 'out' (a cast
 *   to its own dtype) and then scaled in place, so the loop always reads a contiguous source;
 *   'out' may be x itself (in place: element i is read before it is written).
 * Not here: the op def and the rate check at build time (dropout.c). */
#include "../core/error.h"
#include "../core/rng.h"
#include "../core/tensor.h"
#include "kernels.h"
#include "layout.h"

#include <stdio.h>

#define DO_PAR_MIN 32768 /* a runtime splits tensors with more elements than this */
#define DO_GRAIN   16384

typedef struct do_job {
    const char *src; /* contiguous, x's dtype */
    char *dst;
    wf_dtype dt;
    uint64_t key;
    double rate, scale;
} do_job;

static int do_range(void *arg, int64_t lo, int64_t hi)
{
    const do_job *j = arg;
    if (j->dt == WF_F32) {
        const float *s = (const float *)(const void *)j->src;
        float *d = (float *)(void *)j->dst;
        for (int64_t i = lo; i < hi; i++) {
            bool keep = wf__rng_unit(wf__rng_bits(j->key, (uint64_t)i)) >= j->rate;
            d[i] = keep ? (float)((double)s[i] * j->scale) : 0.0f;
        }
    } else if (j->dt == WF_F64) {
        const double *s = (const double *)(const void *)j->src;
        double *d = (double *)(void *)j->dst;
        for (int64_t i = lo; i < hi; i++) {
            bool keep = wf__rng_unit(wf__rng_bits(j->key, (uint64_t)i)) >= j->rate;
            d[i] = keep ? s[i] * j->scale : 0.0;
        }
    } else { /* bf16, f16: through f64, one rounding */
        size_t es = wf_dtype_size(j->dt);
        for (int64_t i = lo; i < hi; i++) {
            bool keep = wf__rng_unit(wf__rng_bits(j->key, (uint64_t)i)) >= j->rate;
            double v = wf__load_f64(j->dt, j->src + (size_t)i * es);
            wf__store_f64(j->dt, j->dst + (size_t)i * es, keep ? v * j->scale : 0.0);
        }
    }
    return 0;
}

int wf__ops_dropout_check(double rate, const wf_tensor *x, const wf_tensor *out)
{
    char s1[160];
    if (!x)
        return wf__err(WF_EINVAL, "dropout: x is NULL");
    if (!wf_dtype_is_float(x->dtype))
        return wf__err(WF_EDTYPE, "dropout: x is %s %s; dropout takes f32, f64, bf16 or f16",
                       wf_dtype_name(x->dtype), wf_shape_str(x->shape, s1, sizeof s1));
    if (!(rate >= 0 && rate < 1))
        return wf__err(WF_EINVAL, "dropout: x is %s; rate %g is outside [0, 1)",
                       wf_shape_str(x->shape, s1, sizeof s1), rate);
    return wf__kernel_check_out("dropout", out, x->dtype, x->shape);
}

int wf__dropout_cpu(const wf_kctx *ctx, double rate, uint64_t seed, const wf_tensor *x,
                    wf_tensor *out)
{
    int rc = wf__ops_dropout_check(rate, x, out);
    if (rc < 0 || out->numel == 0)
        return rc;
    if (!x->contiguous && (rc = wf__cast_cpu(ctx, x, out)) < 0)
        return rc;
    uint64_t step = ctx ? ctx->step : 0;
    do_job j = {
        .src = x->contiguous ? x->data : out->data,
        .dst = out->data,
        .dt = x->dtype,
        .key = wf__rng_bits(seed, step),
        .rate = rate,
        .scale = 1.0 / (1.0 - rate),
    };
    if (ctx && ctx->rt && out->numel > DO_PAR_MIN)
        return wf_parallel_for(ctx->rt, 0, out->numel, DO_GRAIN, do_range, &j);
    return do_range(&j, 0, out->numel);
}
