/* core/tensor.c: tensors and their refcounted buffers.
 * Owns: creating, viewing, retaining and releasing tensors, and reading their elements.
 * Invariant: core/tensor.h states the layout's; a buffer is freed by the last release of
 *   the last tensor that shares it. The headers of a new tensor (wf__tensor_alloc,
 *   wf__tensor_adopt, wf__tensor_alloc_value) are one block, a tensor_block: its buffer first
 *   (so that the buffer's free() frees the block), then its header ('in_block'); the header
 *   holds a reference to the buffer, so the block outlives it. wf__tensor_alloc_value()
 *   puts the data (up to WF__LARGE_MAX) in the block too, and such a block's last release
 *   gives it to the releasing thread's cache (core/internal.h), from which the next value of
 *   its size class is made.
 * Not here: pools (memory/ provides buffers through the free hook), kernels (ops/). */
#include "tensor.h"

#include "error.h"
#include "internal.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>
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
    size_t es = wf_dtype_size(dt);
    if (!es)
        return wf__err(WF_EINVAL, "%s: dtype %d is not a wf_dtype", fn, (int)dt);
    if (shape.rank < 0 || shape.rank > WF_MAX_RANK)
        return wf__err(WF_EINVAL, "%s: rank %d is not in 0..%d", fn, shape.rank, WF_MAX_RANK);
    /* No division (it was a visible part of an eager 1-element add): the element count,
     * within the bound every inferred shape keeps (core/tensor.h, WF__MAX_NUMEL). */
    for (int i = 0; i < shape.rank; i++)
        if (shape.dims[i] < 0) {
            char s[160];
            return wf__err(WF_EINVAL, "%s: shape %s has a negative or unknown dimension", fn,
                           wf_shape_str(shape, s, sizeof s));
        }
    int64_t n;
    size_t total;
    if (!wf__shape_fits(shape, &n) || __builtin_mul_overflow((size_t)n, es, &total) ||
        total > SIZE_MAX / 2) {
        char s[160];
        return wf__err(WF_EINVAL,
                       "%s: shape %s has too many elements (more than " WF__MAX_NUMEL_STR ")", fn,
                       wf_shape_str(shape, s, sizeof s));
    }
    if (bytes)
        *bytes = total;
    return 0;
}

/* Fills a header for a contiguous 'shape' (concrete: no negative dimension) with one
 * reference and no buffer. */
static void init_header(wf_tensor *t, wf_dtype dt, wf_shape shape)
{
    atomic_init(&t->refs, 1);
    t->dtype = dt;
    t->contiguous = true;
    t->in_block = false;
    t->shape = (wf_shape){ .rank = shape.rank }; /* dims past the rank are 0 */
    int64_t s = 1, n = 1;
    for (int i = shape.rank - 1; i >= 0; i--) {
        int64_t d = shape.dims[i];
        t->shape.dims[i] = d;
        t->strides[i] = s;
        s *= d > 0 ? d : 1;
        n *= d;
    }
    t->numel = n;
    t->buf = NULL;
    t->data = NULL;
}

static wf_tensor *header(wf_dtype dt, wf_shape shape)
{
    wf_tensor *t = malloc(sizeof *t);
    if (t)
        init_header(t, dt, shape);
    return t;
}

/* See the file comment. Putting the tensor header into its buffer's allocation saves one
 * malloc() and free() per tensor. wf__tensor_alloc()'s data stays an allocation of its own
 * (freed with free(), so that a test or a device may give its buffer another hook); an eager
 * graph's values have theirs in the block (wf__tensor_alloc_value). */
typedef struct tensor_block {
    wf_buffer buf;
    wf_tensor t;
} tensor_block;

static wf_tensor *init_block(tensor_block *k, wf_dtype dt, wf_shape shape, void *data, size_t bytes,
                             void (*free_fn)(void *, void *, size_t), void *free_ctx)
{
    atomic_init(&k->buf.refs, 1);
    k->buf.data = data;
    k->buf.bytes = bytes;
    k->buf.free_fn = free_fn;
    k->buf.free_ctx = free_ctx;
    init_header(&k->t, dt, shape);
    k->t.in_block = true;
    k->t.buf = &k->buf;
    k->t.data = data;
    return &k->t;
}

wf_tensor *wf__tensor_alloc(wf_dtype dt, wf_shape shape)
{
    size_t bytes;
    if (wf__tensor_check("wf_tensor", dt, shape, &bytes) < 0)
        return NULL;
    size_t cap = bytes ? (bytes + 63) & ~(size_t)63 : 64; /* aligned_alloc wants a multiple */
    tensor_block *k = malloc(sizeof *k);
    void *data = aligned_alloc(64, cap);
    if (!k || !data) {
        free(k);
        free(data);
        wf__err(WF_ENOMEM, "wf_tensor: no memory for %zu bytes", bytes);
        return NULL;
    }
    return init_block(k, dt, shape, data, bytes, NULL, NULL);
}

/* The hook of a buffer whose data is in its own block (wf__tensor_alloc_value): the data goes
 * with the block, which wf__buffer_release() frees. */
static void data_in_block(void *ctx, void *data, size_t bytes)
{
    (void)ctx;
    (void)data;
    (void)bytes;
}

#define VALUE_INLINE_MAX 4096 /* the largest small class's data */
#define MAX_ALIGN        _Alignof(max_align_t)
/* malloc() aligns to max_align_t: past the block rounded up to that, 64 - MAX_ALIGN more
 * bytes reach the next 64-byte boundary. */
#define VALUE_HEAD ((sizeof(tensor_block) + MAX_ALIGN - 1) & ~(MAX_ALIGN - 1))

/* A value block's class (its list in the thread's cache, core/internal.h) by data bytes. The
 * small classes' capacities are the powers of two from 16 to 4096 (VALUE_INLINE_MAX) bytes,
 * so that a block of a class holds any value of it and wastes less than half; the smallest
 * keeps a 1-element value a 288-byte malloc() chunk, as it was before the cache. The large
 * ones (past 4 KiB, up to WF__LARGE_MAX) split each power of two into four, so a block wastes
 * less than a quarter: class WF__VALUE_CLASSES + 4 (o - 12) + q holds (4 + q + 1) << (o - 2)
 * bytes, where 2^o <= bytes - 1 < 2^(o+1). */
static int value_class(size_t bytes)
{
    if (bytes <= VALUE_INLINE_MAX)
        return bytes <= 16 ? 0 : 64 - __builtin_clzll((unsigned long long)bytes - 1) - 4;
    int o = 63 - __builtin_clzll((unsigned long long)bytes - 1);
    int q = (int)(((bytes - 1) >> (o - 2)) & 3);
    return WF__VALUE_CLASSES + 4 * (o - 12) + q;
}

static size_t class_capacity(int cls)
{
    if (cls < WF__VALUE_CLASSES)
        return (size_t)16 << cls;
    int o = 12 + (cls - WF__VALUE_CLASSES) / 4, q = (cls - WF__VALUE_CLASSES) % 4;
    return (size_t)(4 + q + 1) << (o - 2);
}

_Static_assert(((size_t)16 << (WF__VALUE_CLASSES - 1)) == VALUE_INLINE_MAX,
               "the largest value class holds VALUE_INLINE_MAX bytes");
_Static_assert(((size_t)8 << (12 + (WF__LARGE_CLASSES - 1) / 4 - 2)) == WF__LARGE_MAX,
               "the largest large class holds WF__LARGE_MAX bytes");

static size_t value_block_bytes(int cls)
{
    return VALUE_HEAD + (64 - MAX_ALIGN) + class_capacity(cls);
}

wf_tensor *wf__tensor_alloc_value(wf_dtype dt, wf_shape shape)
{
    size_t bytes;
    if (wf__tensor_check("wf_tensor", dt, shape, &bytes) < 0)
        return NULL;
    if (bytes > WF__LARGE_MAX)
        return wf__tensor_alloc(dt, shape);
    int cls = value_class(bytes);
    size_t total = value_block_bytes(cls);
    if (!wf__cache_enabled()) /* AddressSanitizer: the exact size, so overflows are caught */
        total = VALUE_HEAD + (64 - MAX_ALIGN) + bytes;
    tensor_block *k = wf__cache_take(WF__CACHE_VALUE + cls, total);
    if (!k && !(k = malloc(total))) {
        wf__err(WF_ENOMEM, "wf_tensor: no memory for %zu bytes", bytes);
        return NULL;
    }
    void *data = (void *)(((uintptr_t)k + VALUE_HEAD + 63) & ~(uintptr_t)63);
    return init_block(k, dt, shape, data, bytes, data_in_block, NULL);
}

wf_tensor *wf__tensor_adopt(wf_dtype dt, wf_shape shape, void *data, size_t bytes,
                            void (*free_fn)(void *ctx, void *data, size_t bytes), void *free_ctx)
{
    tensor_block *k = malloc(sizeof *k);
    if (!k) {
        wf__err(WF_ENOMEM, "wf_tensor: no memory for a tensor header");
        return NULL;
    }
    return init_block(k, dt, shape, data, bytes, free_fn, free_ctx);
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

/* Whether the caller's reference to a refcount is the last one. A count of 1 read by
 * its holder cannot rise (nobody else has a reference to retain from), so the locked
 * decrement is skipped then: most tensors and buffers die with one reference. */
static inline bool last_ref(_Atomic int64_t *refs)
{
    return atomic_load_explicit(refs, memory_order_acquire) == 1 ||
           atomic_fetch_sub_explicit(refs, 1, memory_order_acq_rel) == 1;
}

void wf__buffer_release(wf_buffer *b)
{
    if (!b || !last_ref(&b->refs))
        return;
    if (b->free_fn == data_in_block) { /* a value block: 'b' starts it (tensor_block) */
        int cls = value_class(b->bytes);
        wf__cache_put(WF__CACHE_VALUE + cls, b, value_block_bytes(cls));
        return;
    }
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
    if (!t || !last_ref(&t->refs))
        return;
    wf_buffer *b = t->buf;
    if (!t->in_block)
        free(t);
    wf__buffer_release(b); /* frees 't' too when it is in the block */
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
