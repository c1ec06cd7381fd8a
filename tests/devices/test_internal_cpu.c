/* tests/devices/test_internal_cpu.c: the CPU device through the device interface that ops/
 * and runtime/ use (devices/device.h, hence "internal"): memory from its pools, copies in
 * and out (small and split over the workers), bounds checks, kernels, events, the
 * fail_after hook passed to its pools, and buffers that outlive the device.
 * Only calls through the device's vtable: the library exports no internal symbols. */
#include "../../devices/device.h"
#include "runtime_util.h"

#include <weft/weft.h>

#include <criterion/criterion.h>

#include <string.h>

static wf_device *dev;

static void setup(void)
{
    wf_test_rt_setup_pinned();
    int rc = wf_device_open(rt, 0, NULL, &dev);
    cr_assert_eq(rc, 0, "wf_device_open: %s", wf_last_errmsg());
}

static void teardown(void)
{
    wf_device_close(dev);
    dev = NULL;
    wf_test_rt_teardown();
}

TestSuite(devices_internal_cpu, .init = setup, .fini = teardown, .timeout = WF_TEST_TIMEOUT(60));

static wf_pool_stats mem(void)
{
    wf_pool_stats s;
    cr_assert_eq(wf_device_memory_stats(dev, &s), 0);
    return s;
}

static void round_trip(size_t n)
{
    unsigned char *src = malloc(n), *back = malloc(n);
    for (size_t i = 0; i < n; i++)
        src[i] = (unsigned char)(i * 131 + 7);
    wf_buffer *b = NULL;
    cr_assert_eq(dev->ops->alloc(dev, n, &b), 0, "%s", wf_last_errmsg());
    cr_assert_eq(b->bytes, n);
    cr_assert_eq((uintptr_t)b->data % 64, 0);
    cr_assert_eq(dev->ops->copy_from_host(dev, b, 0, src, n, NULL), 0, "%s", wf_last_errmsg());
    memset(back, 0, n);
    cr_assert_eq(dev->ops->copy_to_host(dev, b, 0, back, n, NULL), 0, "%s", wf_last_errmsg());
    cr_assert_eq(memcmp(src, back, n), 0, "%zu bytes came back different", n);
    dev->ops->free(dev, b);
    free(src);
    free(back);
}

Test(devices_internal_cpu, small_copies_round_trip)
{
    round_trip(1);
    round_trip(1000);
    round_trip(64 << 10);
    cr_assert_eq(mem().bytes_live, 0);
}

Test(devices_internal_cpu, large_copies_split_over_workers_round_trip)
{
    round_trip((size_t)(20 << 20) + 123);
    cr_assert_eq(mem().bytes_live, 0);
}

Test(devices_internal_cpu, copies_at_an_offset_touch_only_their_range)
{
    wf_buffer *b;
    cr_assert_eq(dev->ops->alloc(dev, 16, &b), 0);
    memset(b->data, 0, 16);
    cr_assert_eq(dev->ops->copy_from_host(dev, b, 4, "abcd", 4, NULL), 0);
    char out[16];
    cr_assert_eq(dev->ops->copy_to_host(dev, b, 0, out, 16, NULL), 0);
    cr_assert_eq(memcmp(out, "\0\0\0\0abcd\0\0\0\0\0\0\0\0", 16), 0);
    dev->ops->free(dev, b);
}

Test(devices_internal_cpu, copies_outside_the_buffer_are_einval)
{
    wf_buffer *b;
    cr_assert_eq(dev->ops->alloc(dev, 100, &b), 0);
    char host[200];
    cr_assert_eq(dev->ops->copy_to_host(dev, b, 50, host, 51, NULL), WF_EINVAL);
    cr_assert(strstr(wf_last_errmsg(), "[50, 101)"), "message: %s", wf_last_errmsg());
    cr_assert_eq(dev->ops->copy_from_host(dev, b, 101, host, 0, NULL), WF_EINVAL);
    cr_assert_eq(dev->ops->copy_from_host(dev, b, 0, NULL, 10, NULL), WF_EINVAL);
    cr_assert_eq(dev->ops->copy_to_host(dev, NULL, 0, host, 10, NULL), WF_EINVAL);
    cr_assert_eq(dev->ops->copy_from_host(dev, b, (size_t)-1, host, 2, NULL), WF_EINVAL);
    cr_assert_eq(dev->ops->copy_to_host(dev, b, 100, host, 0, NULL), 0, "an empty copy");
    dev->ops->free(dev, b);
}

Test(devices_internal_cpu, device_memory_comes_from_and_returns_to_its_pools)
{
    wf_buffer *b;
    cr_assert_eq(dev->ops->alloc(dev, 1000, &b), 0);
    wf_pool_stats s = mem();
    cr_assert_eq(s.bytes_live, 1024);
    cr_assert_eq(s.allocs, 1);
    dev->ops->free(dev, b);
    s = mem();
    cr_assert_eq(s.bytes_live, 0);
    cr_assert_eq(s.bytes_cached, 1024);
    cr_assert_eq(dev->ops->alloc(dev, 1000, &b), 0);
    cr_assert_eq(mem().cache_hits, 1);
    dev->ops->free(dev, b);
    dev->ops->free(dev, NULL);
}

Test(devices_internal_cpu, a_buffer_may_outlive_its_device)
{
    wf_buffer *b;
    cr_assert_eq(dev->ops->alloc(dev, 4096, &b), 0);
    memset(b->data, 1, 4096);
    wf_device *d = dev;
    dev = NULL;
    wf_device_close(d);
    /* The device is gone; the buffer's free hook still finds its pool. */
    wf_device *d2;
    cr_assert_eq(wf_device_open(rt, 0, NULL, &d2), 0);
    d2->ops->free(d2, b);
    dev = d2;
}

static int fill_kernel(void *arg)
{
    wf_buffer *b = arg;
    memset(b->data, 0x5a, b->bytes);
    return 0;
}

static int failing_kernel(void *arg)
{
    return wf_task_fail(WF_ESHAPE, "kernel says no");
}

Test(devices_internal_cpu, kernels_run_in_order_and_events_complete_after_them)
{
    wf_buffer *b;
    cr_assert_eq(dev->ops->alloc(dev, 256, &b), 0);
    wf_event *e;
    cr_assert_eq(dev->ops->event_create(dev, &e), 0);
    cr_assert_eq(dev->ops->event_query(dev, e), 1, "an event never recorded is complete");
    cr_assert_eq(dev->ops->run(dev, fill_kernel, b, "fill", e), 0);
    cr_assert_eq(dev->ops->event_query(dev, e), 1);
    cr_assert_eq(dev->ops->event_sync(dev, e, 1000000000u), 0);
    unsigned char out[256];
    cr_assert_eq(dev->ops->copy_to_host(dev, b, 0, out, 256, NULL), 0);
    for (int i = 0; i < 256; i++)
        cr_assert_eq(out[i], 0x5a);
    cr_assert_eq(dev->ops->run(dev, failing_kernel, NULL, "no", e), WF_ESHAPE);
    cr_assert_eq(dev->ops->event_query(dev, e), 1, "a failed kernel still completes its event");
    cr_assert_eq(dev->ops->run(dev, NULL, NULL, "nothing", NULL), WF_EINVAL);
    cr_assert(strstr(wf_last_errmsg(), "nothing"), "message: %s", wf_last_errmsg());
    dev->ops->event_destroy(dev, e);
    dev->ops->free(dev, b);
}

Test(devices_internal_cpu, events_recorded_on_copies_and_waited_for)
{
    wf_event *e;
    cr_assert_eq(dev->ops->event_create(dev, &e), 0);
    wf_buffer *b;
    cr_assert_eq(dev->ops->alloc(dev, 64, &b), 0);
    char in[64] = "hello", out[64];
    cr_assert_eq(dev->ops->copy_from_host(dev, b, 0, in, 64, e), 0);
    cr_assert_eq(dev->ops->wait_event(dev, e), 0);
    cr_assert_eq(dev->ops->record_event(dev, e), 0);
    cr_assert_eq(dev->ops->copy_to_host(dev, b, 0, out, 64, e), 0);
    cr_assert_eq(dev->ops->event_sync(dev, e, 0), 0);
    cr_assert_str_eq(out, "hello");
    cr_assert_eq(dev->ops->sync(dev), 0);
    cr_assert_eq(dev->ops->record_event(dev, NULL), WF_EINVAL);
    cr_assert_eq(dev->ops->wait_event(dev, NULL), WF_EINVAL);
    cr_assert_eq(dev->ops->event_query(dev, NULL), WF_EINVAL);
    cr_assert_eq(dev->ops->event_sync(dev, NULL, 0), WF_EINVAL);
    dev->ops->event_destroy(dev, e);
    dev->ops->event_destroy(dev, NULL);
    dev->ops->free(dev, b);
}

Test(devices_internal_cpu, an_event_of_another_device_is_not_recorded_here)
{
    wf_device *other;
    cr_assert_eq(wf_device_open(rt, 0, NULL, &other), 0);
    wf_event *e;
    cr_assert_eq(other->ops->event_create(other, &e), 0);
    cr_assert_eq(dev->ops->record_event(dev, e), WF_EINVAL);
    cr_assert(strstr(wf_last_errmsg(), "another device"), "message: %s", wf_last_errmsg());
    cr_assert_eq(other->ops->record_event(other, e), 0);
    cr_assert_eq(dev->ops->wait_event(dev, e), 0, "a completed event of another device");
    other->ops->event_destroy(other, e);
    wf_device_close(other);
}

Test(devices_internal_cpu, fail_after_reaches_the_device_pools_cleanly)
{
    wf_device *d;
    cr_assert_eq(wf_device_open(rt, 0, &(wf_device_opts){ .fail_after = 2 }, &d), 0);
    wf_buffer *a = NULL, *b = (wf_buffer *)1, *c = NULL;
    cr_assert_eq(d->ops->alloc(d, 10, &a), 0);
    cr_assert_eq(d->ops->alloc(d, 10, &b), WF_ENOMEM);
    cr_assert_null(b);
    cr_assert_eq(d->ops->alloc(d, 10, &c), 0);
    d->ops->free(d, a);
    d->ops->free(d, c);
    wf_pool_stats s;
    cr_assert_eq(wf_device_memory_stats(d, &s), 0);
    cr_assert_eq(s.bytes_live, 0);
    cr_assert_eq(s.failed, 1);
    wf_device_close(d);
}

Test(devices_internal_cpu, the_limit_reaches_the_device_pools)
{
    wf_device *d;
    cr_assert_eq(wf_device_open(rt, 0, &(wf_device_opts){ .limit_bytes = 8192 }, &d), 0);
    wf_buffer *a, *b = NULL;
    cr_assert_eq(d->ops->alloc(d, 8192, &a), 0);
    cr_assert_eq(d->ops->alloc(d, 1, &b), WF_ENOMEM);
    cr_assert_null(b);
    d->ops->free(d, a);
    wf_device_close(d);
}
