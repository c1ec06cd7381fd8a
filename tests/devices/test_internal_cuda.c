/* tests/devices/test_internal_cuda.c: a CUDA device through the device interface that ops/
 * and runtime/ use (devices/device.h, hence "internal"): memory from its caching pool
 * (statistics, reuse, the limit, out of memory as WF_ENOMEM naming the device and size,
 * the fail_after hook), copies in and out (small, unaligned, and larger than a staging
 * buffer) that round-trip, bounds checks, events (a record completes; another open of the
 * same GPU, whose streams are other streams, waits on it through the GPU; the CPU waits on
 * it), and buffers that outlive the device.
 * Every test needs a GPU and skips with "no CUDA device" without one. */
#include "../../devices/device.h"
#include "runtime_util.h"

#include <weft/weft.h>

#include <criterion/criterion.h>

#include <stdlib.h>
#include <string.h>

static wf_device *dev;

static void teardown(void)
{
    wf_device_close(dev);
    dev = NULL;
    wf_test_rt_teardown();
}

TestSuite(devices_internal_cuda, .init = wf_test_rt_setup_pinned, .fini = teardown,
          .timeout = WF_TEST_TIMEOUT(60));

/* Opens GPU 0 as 'dev' with 'o', or skips. */
static void open_gpu(const wf_device_opts *o)
{
    int n = wf_device_count_kind(rt, WF_DEVICE_CUDA);
    cr_assert_geq(n, 0);
    if (n == 0)
        cr_skip_test("no CUDA device");
    cr_assert_eq(wf_device_open(rt, 1, o, &dev), 0, "wf_device_open: %s", wf_last_errmsg());
}

static wf_pool_stats mem(wf_device *d)
{
    wf_pool_stats s;
    cr_assert_eq(wf_device_memory_stats(d, &s), 0);
    return s;
}

static uint64_t pattern(size_t i, uint64_t seed)
{
    uint64_t x = (uint64_t)i * 0x9E3779B97F4A7C15ull + seed;
    x ^= x >> 29;
    return x;
}

/* Fills 'n' bytes with a pattern, copies them to a new buffer of 'd' and back through
 * 'back' (may be 'd'), and compares. */
static void round_trip(wf_device *d, wf_device *back, size_t n, size_t off, uint64_t seed)
{
    unsigned char *src = malloc(n + 1), *dst = malloc(n + 1);
    cr_assert(src && dst);
    for (size_t i = 0; i < n; i++)
        src[i] = (unsigned char)pattern(i, seed);
    memset(dst, 0xEE, n + 1);
    wf_buffer *b;
    cr_assert_eq(d->ops->alloc(d, n + off, &b), 0, "%s", wf_last_errmsg());
    wf_event *e;
    cr_assert_eq(d->ops->event_create(d, &e), 0);
    cr_assert_eq(d->ops->copy_from_host(d, b, off, src, n, e), 0, "%s", wf_last_errmsg());
    memset(src, 0, n); /* staged: the source may change once the call returns */
    if (back != d)
        cr_assert_eq(back->ops->wait_event(back, e), 0, "%s", wf_last_errmsg());
    wf_event *e2;
    cr_assert_eq(back->ops->event_create(back, &e2), 0);
    cr_assert_eq(back->ops->copy_to_host(back, b, off, dst, n, e2), 0, "%s", wf_last_errmsg());
    cr_assert_eq(back->ops->event_sync(back, e2, 30ull * 1000000000ull), 0, "%s", wf_last_errmsg());
    cr_assert_eq(back->ops->event_query(back, e2), 1);
    for (size_t i = 0; i < n; i++)
        if (dst[i] != (unsigned char)pattern(i, seed))
            cr_assert_fail("byte %zu of %zu: %u, not %u", i, n, dst[i],
                           (unsigned char)pattern(i, seed));
    cr_assert_eq(dst[n], 0xEE, "nothing past the end is written");
    back->ops->event_destroy(back, e2);
    d->ops->event_destroy(d, e);
    d->ops->free(d, b);
    free(src);
    free(dst);
}

Test(devices_internal_cuda, copies_round_trip_small_unaligned_and_larger_than_staging)
{
    open_gpu(NULL);
    round_trip(dev, dev, 1, 0, 1);
    round_trip(dev, dev, 4099, 3, 2);
    round_trip(dev, dev, (20u << 20) + 13, 5, 3); /* 3 staging buffers' worth */
    cr_assert_eq(dev->ops->sync(dev), 0, "%s", wf_last_errmsg());
}

Test(devices_internal_cuda, another_stream_waits_on_an_event_through_the_gpu)
{
    open_gpu(NULL);
    wf_device *other; /* a second open of the same GPU: its own streams */
    cr_assert_eq(wf_device_open(rt, 1, NULL, &other), 0, "%s", wf_last_errmsg());
    for (int k = 0; k < 4; k++)
        round_trip(dev, other, (9u << 20) + 7 * (size_t)k, 0, 10 + (uint64_t)k);
    wf_device_close(other);
}

Test(devices_internal_cuda, the_cpu_waits_for_a_gpu_event)
{
    open_gpu(NULL);
    wf_device *cpu;
    cr_assert_eq(wf_device_open(rt, 0, NULL, &cpu), 0);
    size_t n = 32u << 20;
    char *h = malloc(n);
    memset(h, 7, n);
    wf_buffer *b;
    cr_assert_eq(dev->ops->alloc(dev, n, &b), 0, "%s", wf_last_errmsg());
    wf_event *e;
    cr_assert_eq(dev->ops->event_create(dev, &e), 0);
    cr_assert_eq(dev->ops->copy_from_host(dev, b, 0, h, n, NULL), 0);
    cr_assert_eq(dev->ops->copy_to_host(dev, b, 0, h, n, e), 0);
    cr_assert_eq(cpu->ops->wait_event(cpu, e), 0, "%s", wf_last_errmsg());
    cr_assert_eq(dev->ops->event_query(dev, e), 1, "complete after the wait");
    cr_assert_eq(h[0], 7);
    cr_assert_eq(h[n - 1], 7);
    dev->ops->event_destroy(dev, e);
    dev->ops->free(dev, b);
    free(h);
    wf_device_close(cpu);
}

Test(devices_internal_cuda, freed_blocks_are_cached_and_reused_and_counted)
{
    open_gpu(NULL);
    wf_buffer *a, *b;
    cr_assert_eq(dev->ops->alloc(dev, 1000, &a), 0);
    wf_pool_stats s = mem(dev);
    cr_assert_eq(s.allocs, 1);
    cr_assert_eq(s.sys_allocs, 1);
    cr_assert_eq(s.bytes_live, 1024, "1000 B is the 1 KiB class");
    dev->ops->free(dev, a);
    s = mem(dev);
    cr_assert_eq(s.bytes_live, 0);
    cr_assert_eq(s.bytes_cached, 1024);
    cr_assert_eq(s.frees, 1);
    cr_assert_eq(dev->ops->alloc(dev, 1024, &b), 0);
    s = mem(dev);
    cr_assert_eq(s.cache_hits, 1, "the same class on the same stream reuses the block");
    cr_assert_eq(s.sys_allocs, 1);
    cr_assert_eq(s.bytes_reserved, 1024);
    dev->ops->free(dev, b);
}

Test(devices_internal_cuda, the_limit_gives_enomem_naming_the_device_and_the_size)
{
    open_gpu(&(wf_device_opts){ .limit_bytes = 8u << 20 });
    wf_buffer *a, *b;
    cr_assert_eq(dev->ops->alloc(dev, 6u << 20, &a), 0, "%s", wf_last_errmsg());
    int rc = dev->ops->alloc(dev, 6u << 20, &b);
    cr_assert_eq(rc, WF_ENOMEM, "got %s", wf_strerror(rc));
    cr_assert(strstr(wf_last_errmsg(), "cuda:0"), "names the device: %s", wf_last_errmsg());
    cr_assert(strstr(wf_last_errmsg(), "6291456"), "names the size: %s", wf_last_errmsg());
    cr_assert_eq(mem(dev).failed, 1);
    /* A cached block counts against the limit until the cache is given back, which the
     * pool does before failing. */
    dev->ops->free(dev, a);
    cr_assert_eq(dev->ops->alloc(dev, 7u << 20, &b), 0, "%s", wf_last_errmsg());
    dev->ops->free(dev, b);
}

Test(devices_internal_cuda, more_than_the_gpu_has_is_enomem_not_a_crash)
{
    open_gpu(NULL);
    wf_device_info info;
    cr_assert_eq(wf_device_get_info(rt, 1, &info), 0);
    wf_buffer *b;
    int rc = dev->ops->alloc(dev, (size_t)info.memory_bytes * 2, &b);
    cr_assert_eq(rc, WF_ENOMEM, "got %s: %s", wf_strerror(rc), wf_last_errmsg());
    cr_assert(strstr(wf_last_errmsg(), "out of device memory"), "%s", wf_last_errmsg());
    /* The device still works. */
    round_trip(dev, dev, 4096, 0, 5);
}

Test(devices_internal_cuda, fail_after_fails_that_allocation)
{
    open_gpu(&(wf_device_opts){ .fail_after = 3 });
    wf_buffer *a, *b, *c;
    cr_assert_eq(dev->ops->alloc(dev, 100, &a), 0);
    cr_assert_eq(dev->ops->alloc(dev, 100, &b), 0);
    cr_assert_eq(dev->ops->alloc(dev, 100, &c), WF_ENOMEM);
    dev->ops->free(dev, a);
    dev->ops->free(dev, b);
}

Test(devices_internal_cuda, copies_outside_the_buffer_are_einval)
{
    open_gpu(NULL);
    wf_buffer *b;
    char h[64];
    cr_assert_eq(dev->ops->alloc(dev, 64, &b), 0);
    cr_assert_eq(dev->ops->copy_from_host(dev, b, 60, h, 8, NULL), WF_EINVAL);
    cr_assert(strstr(wf_last_errmsg(), "outside"), "%s", wf_last_errmsg());
    cr_assert_eq(dev->ops->copy_to_host(dev, b, 0, NULL, 8, NULL), WF_EINVAL);
    dev->ops->free(dev, b);
}

Test(devices_internal_cuda, a_buffer_outlives_its_device)
{
    open_gpu(NULL);
    wf_buffer *b;
    cr_assert_eq(dev->ops->alloc(dev, 1 << 20, &b), 0);
    wf_device_close(dev);
    dev = NULL;
    /* The last release gives the memory back to the closed device's pool (what
     * wf__buffer_release() does, which the library does not export), which then goes. */
    b->free_fn(b->free_ctx, b->data, b->bytes);
    free(b);
}

#ifdef WF_HAVE_CUDA
#    include <cublas_v2.h>

#    include <dlfcn.h>
#    include <stdio.h>

/* devices/cuda_blas.c: cuBLAS(Lt) is not loaded with weft (libcublasLt alone costs ~150 MB
 * of RSS at load) but on the first cuBLAS call, which then reaches the real library. Runs
 * without a GPU: the status-string call needs no device. */
Test(devices_internal_cuda, cublas_is_loaded_on_first_use_not_with_weft)
{
    char lt[64];
    snprintf(lt, sizeof lt, "libcublasLt.so.%d", CUBLAS_VER_MAJOR);
    cr_assert_null(dlopen(lt, RTLD_NOW | RTLD_NOLOAD), "%s is loaded before any cuBLAS call", lt);
    const char *s = cublasGetStatusString(CUBLAS_STATUS_INVALID_VALUE);
    cr_assert_not_null(s);
    cr_assert_null(strstr(s, "could not be loaded"), "the real cuBLAS was not reached: %s", s);
    void *h = dlopen(lt, RTLD_NOW | RTLD_NOLOAD);
    cr_assert_not_null(h, "%s is still not loaded after a cuBLAS call", lt);
    dlclose(h);
}
#endif
