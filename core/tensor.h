/* core/tensor.h: the layout of tensors and buffers, for the modules above core (ops/,
 * runtime/, devices/) that read and fill them (a module interface: not installed, not
 * internal.h).
 * Owns: struct wf_tensor and struct wf_buffer, and the constructors those modules use for
 * outputs (wf__tensor_alloc: a fresh contiguous tensor whose data they may write until
 * they publish it; wf__tensor_adopt: a tensor over memory of their own), and the bound on
 * shapes (WF__MAX_NUMEL) with the checked shape arithmetic that keeps it.
 * Invariants: 'data' points at element 0 inside the buffer (or caller memory for a view);
 * 'strides' are in elements; 'contiguous' is true iff the strides are row-major for
 * 'shape'; a tensor is written only by the code that allocated it, before anyone else
 * sees it.
 * Not here: where buffers come from (memory/ pools plug in through wf_buffer's free hook). */
#ifndef WF_CORE_TENSOR_H
#define WF_CORE_TENSOR_H

#include <weft/core.h>

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct wf_buffer {
    _Atomic int64_t refs;
    void *data;
    size_t bytes;
    void (*free_fn)(void *ctx, void *data, size_t bytes); /* NULL: free() */
    void *free_ctx;
} wf_buffer;

struct wf_tensor {
    _Atomic int64_t refs;
    wf_dtype dtype;
    bool contiguous;
    /* The header lives in the same allocation as its buffer 'buf' (core/tensor.c: one
     * malloc() per new tensor): its last release only drops the buffer's reference, and the
     * buffer's last release frees both. */
    bool in_block;
    wf_shape shape;
    int64_t strides[WF_MAX_RANK];
    int64_t numel;
    wf_buffer *buf; /* NULL for a view of caller memory */
    char *data;     /* element 0 */
};

/* A new contiguous tensor with uninitialised data (64-byte aligned, an allocation of its
 * own that the buffer frees with free()), for kernels to fill. The tensor and buffer
 * headers are one allocation.
 * Returns NULL with wf_last_errmsg() set (WF_ENOMEM or WF_EINVAL). */
wf_tensor *wf__tensor_alloc(wf_dtype dt, wf_shape shape);

/* A new contiguous tensor over 'data' ('bytes' long, which must hold the elements of a
 * checked 'dt' and 'shape'), in a new buffer that frees it with 'free_fn(free_ctx, data,
 * bytes)' (NULL: free()) on its last release; the tensor and buffer headers are one
 * allocation. How pools and devices make tensors of their own memory.
 * Returns NULL (WF_ENOMEM, message set) without calling 'free_fn': the caller still owns
 * 'data' then. */
wf_tensor *wf__tensor_adopt(wf_dtype dt, wf_shape shape, void *data, size_t bytes,
                            void (*free_fn)(void *ctx, void *data, size_t bytes), void *free_ctx);

/* A new tensor header sharing 'base''s buffer (retained) with other shape/strides/offset:
 * how reshape, transpose and slice make views without copying. 'offset' is in elements
 * from base->data. */
wf_tensor *wf__tensor_alias(const wf_tensor *base, wf_shape shape, const int64_t *strides,
                            int64_t offset);

/* The most elements a shape may have, and the most its nonzero dimensions may multiply to:
 * 2^59, so that every byte size (dtypes of up to 16 bytes) and every stride fits int64_t.
 * Shape inference forms every product and sum of dimensions with wf__dims_mul() and
 * wf__dims_add(), and core refuses a node whose inferred shape passes it (WF_ESHAPE). */
#define WF__MAX_NUMEL     ((int64_t)1 << 59)
#define WF__MAX_NUMEL_STR "2^59"

/* *out = a * b, or a + b, of dimensions or element counts (>= 0). Returns false (with *out
 * unspecified) when the result would pass WF__MAX_NUMEL, an int64_t overflow included. */
static inline bool wf__dims_mul(int64_t a, int64_t b, int64_t *out)
{
    return !__builtin_mul_overflow(a, b, out) && *out <= WF__MAX_NUMEL;
}

static inline bool wf__dims_add(int64_t a, int64_t b, int64_t *out)
{
    return !__builtin_add_overflow(a, b, out) && *out <= WF__MAX_NUMEL;
}

/* Whether 's' is within WF__MAX_NUMEL: its known (>= 0) dimensions, zeros counted as 1,
 * multiply to at most that. '*numel' (may be NULL) gets the element count, -1 when a
 * dimension is unknown (negative) or the shape does not fit. */
bool wf__shape_fits(wf_shape s, int64_t *numel);

/* 0 when 's' fits (wf__shape_fits), else WF_ESHAPE with "<what> <shape> has more than 2^59
 * elements" (or, with a zero dimension, that its nonzero dimensions multiply past it) in
 * 'err'. For inference functions and core's check of every inferred shape. */
int wf__shape_check(wf_shape s, const char *what, char *err, size_t errlen);

/* Checks a dtype and a concrete shape for a new tensor ('fn' names the caller in the
 * message) and gives its size in bytes. Returns 0 or WF_EINVAL. */
int wf__tensor_check(const char *fn, wf_dtype dt, wf_shape shape, size_t *bytes);

/* A contiguous tensor over 'buf' (which must hold the elements), taking over the caller's
 * reference to 'buf': how pools and devices make tensors of their own memory. On failure
 * returns NULL (WF_ENOMEM) and releases 'buf'. */
wf_tensor *wf__tensor_wrap(wf_dtype dt, wf_shape shape, wf_buffer *buf);

/* A tensor with t's dtype, shape and values that the caller may write: 't' itself when it is
 * contiguous, owns its whole buffer, and has exactly 'known_refs' references and its buffer
 * one (all of them known to the caller, so nobody else can see a write), else a new
 * contiguous copy. Returns 0 with the tensor in '*out' (a new reference only when it is a
 * copy: compare with 't') or WF_ENOMEM. For update ops (core/op.h: n_assign). */
int wf__tensor_writable(wf_tensor *t, int64_t known_refs, wf_tensor **out);

/* Drops a reference to 'buf'; the last one frees it through its hook. NULL is a no-op. */
void wf__buffer_release(wf_buffer *buf);

/* Row-major strides for 'shape'. */
void wf__contiguous_strides(wf_shape shape, int64_t *strides);

/* Element conversion used by wf_tensor_read and cast kernels: load one element of 'dt' at
 * 'p' as double, store a double as 'dt' at 'p' (bf16/f16 round to nearest even). */
double wf__load_f64(wf_dtype dt, const void *p);
void wf__store_f64(wf_dtype dt, void *p, double v);
float wf__bf16_to_f32(uint16_t h);
uint16_t wf__f32_to_bf16(float f);
float wf__f16_to_f32(uint16_t h);
uint16_t wf__f32_to_f16(float f);

#endif /* WF_CORE_TENSOR_H */
