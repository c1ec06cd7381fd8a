/* core/tensor.c: tensors and their refcounted buffers.
 * Owns: creating, viewing, retaining and releasing tensors, and reading their elements.
 * Invariant: core/tensor.h states the layout's; a buffer is freed by the last release of
 * the last tensor that shares it.
 * Not here: pools (memory/ provides buffers through the free hook), kernels (ops/). */
#include "tensor.h"

#include "error.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void wf__contiguous_strides(wf_shape shape, int64_t *strides)
{
    int64_t s = 1;
    for (int i = shape.rank - 1; i >= 0; i--) {
        strides[i] = s;
        s *= shape.dims[i] > 0 ? shape.dims[i] : 1;
    }
}

static bool is_contiguous(wf_shape shape, const int64_t *strides)
{
    int64_t s = 1;
    for (int i = shape.rank - 1; i >= 0; i--) {
        if (shape.dims[i] != 1 && strides[i] != s)
            return false;
        s *= shape.dims[i];
    }
    return true;
}

int wf__tensor_check(const char *fn, wf_dtype dt, wf_shape shape, size_t *bytes)
{
    if (!wf_dtype_size(dt))
        return wf__err(WF_EINVAL, "%s: dtype %d is not a wf_dtype", fn, (int)dt);
    if (shape.rank < 0 || shape.rank > WF_MAX_RANK)
        return wf__err(WF_EINVAL, "%s: rank %d is not in 0..%d", fn, shape.rank, WF_MAX_RANK);
    for (int i = 0; i < shape.rank; i++)
        if (shape.dims[i] < 0) {
            char s[160];
            return wf__err(WF_EINVAL, "%s: shape %s has a negative or unknown dimension", fn,
                           wf_shape_str(shape, s, sizeof s));
        }
    int64_t n = wf_shape_numel(shape);
    if (n < 0 || (uint64_t)n > SIZE_MAX / 2 / wf_dtype_size(dt)) {
        char s[160];
        return wf__err(WF_EINVAL, "%s: shape %s has too many elements", fn,
                       wf_shape_str(shape, s, sizeof s));
    }
    if (bytes)
        *bytes = (size_t)n * wf_dtype_size(dt);
    return 0;
}

static wf_tensor *header(wf_dtype dt, wf_shape shape)
{
    wf_tensor *t = malloc(sizeof *t);
    if (!t)
        return NULL;
    atomic_init(&t->refs, 1);
    t->dtype = dt;
    t->shape = shape;
    for (int i = shape.rank; i < WF_MAX_RANK; i++)
        t->shape.dims[i] = 0;
    t->numel = wf_shape_numel(shape);
    wf__contiguous_strides(shape, t->strides);
    t->contiguous = true;
    t->buf = NULL;
    t->data = NULL;
    return t;
}

wf_tensor *wf__tensor_alloc(wf_dtype dt, wf_shape shape)
{
    if (wf__tensor_check("wf_tensor", dt, shape, NULL) < 0)
        return NULL;
    wf_tensor *t = header(dt, shape);
    wf_buffer *b = malloc(sizeof *b);
    size_t bytes = (size_t)wf_shape_numel(shape) * wf_dtype_size(dt);
    size_t cap = bytes ? (bytes + 63) & ~(size_t)63 : 64; /* aligned_alloc wants a multiple */
    void *data = aligned_alloc(64, cap);
    if (!t || !b || !data) {
        free(t);
        free(b);
        free(data);
        wf__err(WF_ENOMEM, "wf_tensor: no memory for %zu bytes", bytes);
        return NULL;
    }
    atomic_init(&b->refs, 1);
    b->data = data;
    b->bytes = bytes;
    b->free_fn = NULL;
    b->free_ctx = NULL;
    t->buf = b;
    t->data = data;
    return t;
}

int wf_tensor_create(wf_dtype dt, wf_shape shape, const void *data, wf_tensor **out)
{
    if (!out)
        return wf__err(WF_EINVAL, "wf_tensor_create: out is NULL");
    *out = NULL;
    int rc = wf__tensor_check("wf_tensor_create", dt, shape, NULL);
    if (rc < 0)
        return rc;
    wf_tensor *t = wf__tensor_alloc(dt, shape);
    if (!t)
        return WF_ENOMEM;
    if (data)
        memcpy(t->data, data, t->buf->bytes);
    else
        memset(t->data, 0, t->buf->bytes);
    *out = t;
    return 0;
}

wf_tensor *wf_tensor_from(wf_dtype dt, wf_shape shape, const void *data)
{
    wf_tensor *t;
    return wf_tensor_create(dt, shape, data, &t) < 0 ? NULL : t;
}

int wf_tensor_view(wf_dtype dt, wf_shape shape, const int64_t *strides, const void *data,
                   wf_tensor **out)
{
    if (!out)
        return wf__err(WF_EINVAL, "wf_tensor_view: out is NULL");
    *out = NULL;
    int rc = wf__tensor_check("wf_tensor_view", dt, shape, NULL);
    if (rc < 0)
        return rc;
    if (!data && wf_shape_numel(shape) > 0)
        return wf__err(WF_EINVAL, "wf_tensor_view: data is NULL");
    wf_tensor *t = header(dt, shape);
    if (!t)
        return wf__err(WF_ENOMEM, "wf_tensor_view: no memory");
    if (strides) {
        memcpy(t->strides, strides, (size_t)shape.rank * sizeof *strides);
        t->contiguous = is_contiguous(shape, strides);
    }
    t->data = (char *)(uintptr_t)data;
    *out = t;
    return 0;
}

wf_tensor *wf__tensor_alias(const wf_tensor *base, wf_shape shape, const int64_t *strides,
                            int64_t offset)
{
    wf_tensor *t = header(base->dtype, shape);
    if (!t) {
        wf__err(WF_ENOMEM, "wf_tensor: no memory");
        return NULL;
    }
    if (strides) {
        memcpy(t->strides, strides, (size_t)shape.rank * sizeof *strides);
        t->contiguous = is_contiguous(shape, strides);
    }
    t->buf = base->buf;
    if (t->buf)
        atomic_fetch_add_explicit(&t->buf->refs, 1, memory_order_relaxed);
    t->data = base->data + offset * (int64_t)wf_dtype_size(base->dtype);
    return t;
}

wf_tensor *wf__tensor_wrap(wf_dtype dt, wf_shape shape, wf_buffer *buf)
{
    wf_tensor *t = header(dt, shape);
    if (!t) {
        wf__buffer_release(buf);
        wf__err(WF_ENOMEM, "wf_tensor: no memory for a tensor header");
        return NULL;
    }
    t->buf = buf;
    t->data = buf->data;
    return t;
}

void wf__buffer_release(wf_buffer *b)
{
    if (!b || atomic_fetch_sub_explicit(&b->refs, 1, memory_order_acq_rel) != 1)
        return;
    if (b->free_fn)
        b->free_fn(b->free_ctx, b->data, b->bytes);
    else
        free(b->data);
    free(b);
}

int wf__tensor_writable(wf_tensor *t, int64_t known_refs, wf_tensor **out)
{
    if (t->contiguous && t->buf && t->data == t->buf->data &&
        atomic_load_explicit(&t->refs, memory_order_acquire) == known_refs &&
        atomic_load_explicit(&t->buf->refs, memory_order_acquire) == 1) {
        *out = t;
        return 0;
    }
    wf_tensor *c = wf__tensor_alloc(t->dtype, t->shape);
    if (!c)
        return WF_ENOMEM;
    int rc = wf_tensor_read(t, t->dtype, c->data, (size_t)c->numel * wf_dtype_size(c->dtype));
    if (rc < 0) {
        wf_tensor_release(c);
        return rc;
    }
    *out = c;
    return 0;
}

wf_tensor *wf_tensor_retain(wf_tensor *t)
{
    if (t)
        atomic_fetch_add_explicit(&t->refs, 1, memory_order_relaxed);
    return t;
}

void wf_tensor_release(wf_tensor *t)
{
    if (!t || atomic_fetch_sub_explicit(&t->refs, 1, memory_order_acq_rel) != 1)
        return;
    wf__buffer_release(t->buf);
    free(t);
}

wf_dtype wf_tensor_dtype(const wf_tensor *t)
{
    return t ? t->dtype : WF_DTYPE_INVALID;
}

wf_shape wf_tensor_shape(const wf_tensor *t)
{
    return t ? t->shape : (wf_shape){ .rank = 0 };
}

int64_t wf_tensor_numel(const wf_tensor *t)
{
    return t ? t->numel : 0;
}

const int64_t *wf_tensor_strides(const wf_tensor *t)
{
    return t ? t->strides : NULL;
}

bool wf_tensor_is_contiguous(const wf_tensor *t)
{
    return t && t->contiguous;
}

const void *wf_tensor_data(const wf_tensor *t)
{
    return t ? t->data : NULL;
}

#define TYPED(name, ctype, dt)                                                       \
    const ctype *name(const wf_tensor *t)                                            \
    {                                                                                \
        return t && t->dtype == dt && t->contiguous ? (const ctype *)t->data : NULL; \
    }
TYPED(wf_tensor_data_f32, float, WF_F32)
TYPED(wf_tensor_data_f64, double, WF_F64)
TYPED(wf_tensor_data_i32, int32_t, WF_I32)
TYPED(wf_tensor_data_i64, int64_t, WF_I64)
#undef TYPED

/* Offset in elements of the element at row-major position 'i'. */
static int64_t offset_of(const wf_tensor *t, int64_t i)
{
    int64_t off = 0;
    for (int d = t->shape.rank - 1; d >= 0; d--) {
        int64_t n = t->shape.dims[d];
        off += (i % n) * t->strides[d];
        i /= n;
    }
    return off;
}

int wf_tensor_read(const wf_tensor *t, wf_dtype dt, void *dst, size_t bytes)
{
    if (!t || !dst || !wf_dtype_size(dt))
        return wf__err(WF_EINVAL, "wf_tensor_read: %s",
                       !t     ? "tensor is NULL"
                       : !dst ? "dst is NULL"
                              : "bad dtype");
    size_t es = wf_dtype_size(dt), need = (size_t)t->numel * es;
    if (bytes < need)
        return wf__err(WF_EINVAL, "wf_tensor_read: %zu bytes given, %zu needed", bytes, need);
    size_t ss = wf_dtype_size(t->dtype);
    if (dt == t->dtype && t->contiguous) {
        memcpy(dst, t->data, need);
        return 0;
    }
    for (int64_t i = 0; i < t->numel; i++) {
        const char *src = t->data + offset_of(t, i) * (int64_t)ss;
        char *out = (char *)dst + i * (int64_t)es;
        if (dt == t->dtype)
            memcpy(out, src, ss);
        else
            wf__store_f64(dt, out, wf__load_f64(t->dtype, src));
    }
    return 0;
}

double wf_tensor_get(const wf_tensor *t, int64_t index)
{
    if (!t || index < 0 || index >= t->numel)
        return NAN;
    return wf__load_f64(t->dtype, t->data + offset_of(t, index) * (int64_t)wf_dtype_size(t->dtype));
}
