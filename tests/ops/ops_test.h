/* tests/ops/ops_test.h: helpers shared by the kernel suites of ops/: random tensors in any
 * layout (contiguous, permuted axes, flipped axes with negative strides, broadcast axes with
 * zero strides), reading elements as double, the runtimes of the determinism checks, and
 * tolerant comparison against f64 references.
 * Owns: nothing with state beyond what each helper returns (released by the caller).
 * Not here: the kernels' declarations (the test_internal_* files include ops/kernels.h). */
#ifndef WF_OPS_TEST_H
#define WF_OPS_TEST_H

#include "wf_test.h"

#include <weft/weft.h>

#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

/* How a test tensor lies in memory. perm: physical axis order (NULL: identity); flip: bit d
 * set makes logical axis d run backwards (negative stride); bcast: bit d set gives logical
 * axis d stride 0 (every index reads the same element). */
typedef struct ot_layout {
    const int *perm;
    unsigned flip, bcast;
} ot_layout;

#define OT_CONTIG ((ot_layout){ NULL, 0, 0 })

/* A tensor and the buffer it views (NULL for a contiguous tensor). */
typedef struct ot_tensor {
    wf_tensor *t, *backing;
} ot_tensor;

static inline void ot_release(ot_tensor *x)
{
    wf_tensor_release(x->t);
    wf_tensor_release(x->backing);
    x->t = x->backing = NULL;
}

/* A value for the generator: uniform in [lo, hi), integers rounded toward zero. */
static inline double ot_uniform(uint64_t *rng, double lo, double hi)
{
    return lo + (hi - lo) * (double)(wf_test_rand(rng) >> 11) * (1.0 / 9007199254740992.0);
}

/* A tensor of 'shape' and 'dt' in 'layout', filled with uniform values in [lo, hi). */
static inline ot_tensor ot_random(wf_dtype dt, wf_shape shape, ot_layout layout, uint64_t seed,
                                  double lo, double hi)
{
    ot_tensor r = { NULL, NULL };
    int rank = shape.rank;
    wf_shape phys = { .rank = rank };
    int perm[WF_MAX_RANK];
    for (int d = 0; d < rank; d++) {
        perm[d] = layout.perm ? layout.perm[d] : d;
    }
    for (int d = 0; d < rank; d++) {
        int l = perm[d]; /* physical axis d holds logical axis l */
        phys.dims[d] = (layout.bcast >> l) & 1 ? 1 : shape.dims[l];
    }
    int rc = wf_tensor_create(dt, phys, NULL, &r.backing);
    cr_assert_eq(rc, 0, "wf_tensor_create: %s", wf_last_errmsg());
    /* Fill the backing buffer through a temporary f64 array and a cast by wf_tensor_read. */
    int64_t n = wf_tensor_numel(r.backing);
    double *vals = malloc((size_t)(n ? n : 1) * sizeof *vals);
    uint64_t rng = seed;
    for (int64_t i = 0; i < n; i++) {
        double v = ot_uniform(&rng, lo, hi);
        vals[i] = dt == WF_F32 || dt == WF_F64 || dt == WF_BF16 || dt == WF_F16 ? v : trunc(v);
    }
    wf_tensor *tmp = NULL;
    rc = wf_tensor_create(WF_F64, phys, vals, &tmp);
    cr_assert_eq(rc, 0);
    size_t es = wf_dtype_size(dt);
    rc = wf_tensor_read(tmp, dt, (void *)wf_tensor_data(r.backing), (size_t)n * es);
    cr_assert_eq(rc, 0);
    wf_tensor_release(tmp);
    free(vals);
    /* Logical strides from physical ones. */
    int64_t pst[WF_MAX_RANK], st[WF_MAX_RANK], s = 1;
    for (int d = rank - 1; d >= 0; d--) {
        pst[d] = s;
        s *= phys.dims[d] > 0 ? phys.dims[d] : 1;
    }
    const char *base = wf_tensor_data(r.backing);
    int64_t off = 0;
    for (int d = 0; d < rank; d++) {
        int l = perm[d];
        if ((layout.bcast >> l) & 1) {
            st[l] = 0;
        } else if ((layout.flip >> l) & 1) {
            st[l] = -pst[d];
            off += (shape.dims[l] > 0 ? shape.dims[l] - 1 : 0) * pst[d];
        } else {
            st[l] = pst[d];
        }
    }
    if (!layout.perm && !layout.flip && !layout.bcast) {
        r.t = r.backing;
        r.backing = NULL;
        return r;
    }
    rc = wf_tensor_view(dt, shape, st, base + off * (int64_t)es, &r.t);
    cr_assert_eq(rc, 0, "wf_tensor_view: %s", wf_last_errmsg());
    return r;
}

/* A zeroed contiguous output. */
static inline wf_tensor *ot_out(wf_dtype dt, wf_shape shape)
{
    wf_tensor *t = NULL;
    int rc = wf_tensor_create(dt, shape, NULL, &t);
    cr_assert_eq(rc, 0, "wf_tensor_create: %s", wf_last_errmsg());
    return t;
}

/* Row-major position in 'from' (broadcast into 'to') of row-major position 'i' of 'to'. */
static inline int64_t ot_bcast_index(wf_shape to, wf_shape from, int64_t i)
{
    int64_t pos = 0, mul = 1;
    for (int d = to.rank - 1; d >= 0; d--) {
        int64_t k = i % to.dims[d];
        i /= to.dims[d];
        int fd = d - (to.rank - from.rank);
        if (fd >= 0) {
            if (from.dims[fd] != 1)
                pos += k * mul;
            mul *= from.dims[fd];
        }
    }
    return pos;
}

/* Tolerances per dtype: |got - want| <= abs + rel * |want|. */
typedef struct ot_tol {
    double abs, rel;
} ot_tol;

static inline ot_tol ot_tol_elementwise(wf_dtype dt)
{
    switch (dt) {
    case WF_F32:
        return (ot_tol){ 1e-6, 1e-5 };
    case WF_F64:
        return (ot_tol){ 1e-13, 1e-12 };
    case WF_BF16:
        return (ot_tol){ 1e-2, 8e-3 };
    case WF_F16:
        return (ot_tol){ 1e-3, 1e-3 };
    default:
        return (ot_tol){ 0, 0 };
    }
}

/* True if both are NaN, or equal infinities, or within 'tol'. */
static inline bool ot_close(double got, double want, ot_tol tol)
{
    if (isnan(want) || isnan(got))
        return isnan(want) && isnan(got);
    if (isinf(want) || isinf(got))
        return got == want;
    return fabs(got - want) <= tol.abs + tol.rel * fabs(want);
}

/* The three contexts whose results must be bitwise equal: serial, 1 worker, 2 workers. */
typedef struct ot_rts {
    wf_runtime *one, *two;
} ot_rts;

static inline ot_rts ot_rts_create(void)
{
    ot_rts r;
    r.one = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 1, .flags = WF_RT_NO_PIN });
    r.two = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 2, .flags = WF_RT_NO_PIN });
    return r;
}

static inline void ot_rts_destroy(ot_rts *r)
{
    wf_runtime_destroy(r->one);
    wf_runtime_destroy(r->two);
}

/* Asserts that two outputs hold the same bytes. */
static inline void ot_assert_same_bits(const wf_tensor *x, const wf_tensor *y, const char *what)
{
    size_t bytes = (size_t)wf_tensor_numel(x) * wf_dtype_size(wf_tensor_dtype(x));
    cr_assert_eq(wf_tensor_numel(x), wf_tensor_numel(y), "%s: sizes differ", what);
    cr_assert(memcmp(wf_tensor_data(x), wf_tensor_data(y), bytes) == 0,
              "%s: results differ between runs with different worker counts", what);
}

/* Asserts that 'msg' names both shapes. */
static inline void ot_assert_names(const char *msg, wf_shape a, wf_shape b)
{
    char sa[160], sb[160];
    wf_shape_str(a, sa, sizeof sa);
    wf_shape_str(b, sb, sizeof sb);
    cr_assert(strstr(msg, sa) && strstr(msg, sb), "message '%s' should name %s and %s", msg, sa,
              sb);
}

#endif /* WF_OPS_TEST_H */
