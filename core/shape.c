/* core/shape.c: shapes: element counts, the check of the bound on them (core/tensor.h:
 * WF__MAX_NUMEL), printing, NumPy broadcasting.
 * Owns: nothing with state. -1 ("any", placeholders only) is carried through broadcasting
 * so that shapes can be inferred before batch sizes are known.
 * Not here: strides (tensor.c). */
#include "error.h"
#include "tensor.h"

#include <stdio.h>

int64_t wf_shape_numel(wf_shape s)
{
    if (s.rank < 0 || s.rank > WF_MAX_RANK)
        return -1;
    int64_t n = 1;
    for (int i = 0; i < s.rank; i++) {
        if (s.dims[i] < 0)
            return -1;
        if (s.dims[i] && n > INT64_MAX / s.dims[i])
            return -1;
        n *= s.dims[i];
    }
    return n;
}

bool wf__shape_fits(wf_shape s, int64_t *numel)
{
    int64_t n = 1, span = 1;
    bool known = s.rank >= 0 && s.rank <= WF_MAX_RANK, fits = known;
    for (int i = 0; fits && i < s.rank; i++) {
        int64_t d = s.dims[i];
        if (d < 0) {
            known = false;
            continue;
        }
        fits = wf__dims_mul(span, d ? d : 1, &span);
        n = fits ? n * d : n; /* n <= span: no overflow */
    }
    if (numel)
        *numel = known && fits ? n : -1;
    return fits;
}

int wf__shape_check(wf_shape s, const char *what, char *err, size_t errlen)
{
    int64_t n;
    if (wf__shape_fits(s, &n))
        return 0;
    char b[160];
    bool zero = false;
    for (int i = 0; i < s.rank && i < WF_MAX_RANK; i++)
        zero = zero || s.dims[i] == 0;
    if (s.rank < 0 || s.rank > WF_MAX_RANK)
        snprintf(err, errlen, "%s has rank %d, not in 0..%d", what, s.rank, WF_MAX_RANK);
    else if (zero)
        snprintf(err, errlen,
                 "%s %s: its nonzero dimensions multiply to more than " WF__MAX_NUMEL_STR
                 " (the most elements a tensor may hold; its strides would overflow)",
                 what, wf_shape_str(s, b, sizeof b));
    else
        snprintf(err, errlen,
                 "%s %s has more than " WF__MAX_NUMEL_STR " elements (the most a tensor may hold)",
                 what, wf_shape_str(s, b, sizeof b));
    return WF_ESHAPE;
}

bool wf_shape_equal(wf_shape a, wf_shape b)
{
    if (a.rank != b.rank)
        return false;
    for (int i = 0; i < a.rank; i++)
        if (a.dims[i] != b.dims[i])
            return false;
    return true;
}

char *wf_shape_str(wf_shape s, char *buf, size_t size)
{
    if (!buf || !size)
        return buf;
    size_t k = (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < s.rank && i < WF_MAX_RANK && k < size; i++) {
        if (s.dims[i] < 0)
            k += (size_t)snprintf(buf + k, size - k, "%s?", i ? ", " : "");
        else
            k += (size_t)snprintf(buf + k, size - k, "%s%lld", i ? ", " : "", (long long)s.dims[i]);
    }
    if (k < size)
        snprintf(buf + k, size - k, "]");
    return buf;
}

int wf_shape_broadcast(wf_shape a, wf_shape b, wf_shape *out)
{
    if (!out)
        return wf__err(WF_EINVAL, "wf_shape_broadcast: out is NULL");
    if (a.rank < 0 || a.rank > WF_MAX_RANK || b.rank < 0 || b.rank > WF_MAX_RANK)
        return wf__err(WF_EINVAL, "wf_shape_broadcast: rank %d or %d is not in 0..%d", a.rank,
                       b.rank, WF_MAX_RANK);
    wf_shape r = { .rank = a.rank > b.rank ? a.rank : b.rank };
    for (int i = 0; i < r.rank; i++) {
        int ia = a.rank - r.rank + i, ib = b.rank - r.rank + i;
        int64_t x = ia >= 0 ? a.dims[ia] : 1, y = ib >= 0 ? b.dims[ib] : 1;
        if (x == y || y == 1)
            r.dims[i] = x;
        else if (x == 1)
            r.dims[i] = y;
        else if (x == -1 || y == -1)
            r.dims[i] = x == -1 ? y : x;
        else {
            char sa[160], sb[160];
            return wf__err(WF_ESHAPE,
                           "cannot broadcast %s with %s: dimension %d is %lld in one and %lld "
                           "in the other",
                           wf_shape_str(a, sa, sizeof sa), wf_shape_str(b, sb, sizeof sb), i,
                           (long long)x, (long long)y);
        }
    }
    *out = r;
    return 0;
}
