/* tests/devices/test_internal_devflow.c: the device calls the executor's copy steps use
 * (devices/device.h: notify() and copy_peer()), on the CPU device and on the simulated device
 * (devices/sim.c) that the runtime's tests run placed graphs on: a copy to the host lands
 * only when the device completes it, notices come in the order given, copies between
 * devices check their ranges and their source's kind, and buffers outlive their device.
 * The CUDA device's versions are compiled here and run by tests/devices/test_cuda.c's
 * session tests on a machine with a GPU. */
#include "../../core/graph.h"
#include "../../core/op.h"
#include "../../devices/device.h"
#include "runtime_util.h"

#include <weft/weft.h>

#include <criterion/criterion.h>

#include <stdatomic.h>
#include <string.h>
#include <time.h>

TestSuite(devices_internal_devflow, .init = wf_test_rt_setup, .fini = wf_test_rt_teardown,
          .timeout = WF_TEST_TIMEOUT(60));

typedef struct seen {
    atomic_int n;    /* notices that took a place in the arrays */
    atomic_int done; /* notices whose entries are written (release) */
    int order[8];
    int status[8];
    const unsigned char *watch; /* a byte to read when the notice comes */
    unsigned char watched[8];
} seen;

typedef struct notice_arg {
    seen *s;
    int id;
} notice_arg;

static void on_notice(void *arg, int status)
{
    notice_arg *a = arg;
    int k = atomic_fetch_add(&a->s->n, 1);
    a->s->order[k] = a->id;
    a->s->status[k] = status;
    a->s->watched[k] = a->s->watch ? *a->s->watch : 0;
    atomic_fetch_add_explicit(&a->s->done, 1, memory_order_release);
}

static void wait_for(seen *s, int n)
{
    for (int k = 0; atomic_load_explicit(&s->done, memory_order_acquire) < n && k < 20000; k++)
        nanosleep(&(struct timespec){ 0, 100000 }, NULL);
    int got = atomic_load_explicit(&s->done, memory_order_acquire);
    cr_assert_eq(got, n, "%d of %d notices came", got, n);
}

Test(devices_internal_devflow, the_cpu_notifies_at_once_and_copies_between_its_buffers)
{
    wf_device *d;
    cr_assert_eq(wf_device_open(rt, 0, NULL, &d), 0, "%s", wf_last_errmsg());
    seen s = { 0 };
    notice_arg a = { &s, 7 };
    cr_assert_eq(d->ops->notify(d, on_notice, &a), 0);
    cr_assert_eq(atomic_load(&s.done), 1, "the CPU's work is complete when given");
    cr_assert_eq(s.order[0], 7);
    cr_assert_eq(s.status[0], 0);
    wf_buffer *x, *y;
    cr_assert_eq(d->ops->alloc(d, 64, &x), 0);
    cr_assert_eq(d->ops->alloc(d, 64, &y), 0);
    memset(x->data, 0x5a, 64);
    memset(y->data, 0, 64);
    cr_assert_eq(d->ops->copy_peer(d, y, 8, d, x, 0, 32), 0, "%s", wf_last_errmsg());
    cr_assert_eq(((unsigned char *)y->data)[8], 0x5a);
    cr_assert_eq(((unsigned char *)y->data)[40], 0);
    cr_assert_eq(d->ops->copy_peer(d, y, 40, d, x, 0, 32), WF_EINVAL, "past the end");
    cr_assert(strstr(wf_last_errmsg(), "outside"), "%s", wf_last_errmsg());
    cr_assert_eq(d->ops->notify(d, NULL, NULL), WF_EINVAL);
    d->ops->free(d, x);
    d->ops->free(d, y);
    wf_device_close(d);
}

Test(devices_internal_devflow, a_simulated_copy_to_the_host_lands_before_its_notice_not_before)
{
    wf_device *d;
    cr_assert_eq(wf__sim_open(rt, 1, 0, &(wf__sim_opts){ .delay_us = 20000 }, &d), 0, "%s",
                 wf_last_errmsg());
    cr_assert(wf__sim_is(d));
    cr_assert_str_eq(d->info.name, "sim:0");
    wf_buffer *b;
    cr_assert_eq(d->ops->alloc(d, 256, &b), 0);
    unsigned char src[256], dst[256];
    memset(src, 0x33, sizeof src);
    memset(dst, 0, sizeof dst);
    cr_assert_eq(d->ops->copy_from_host(d, b, 0, src, sizeof src, NULL), 0);
    seen s = { .watch = &dst[100] };
    notice_arg a1 = { &s, 1 }, a2 = { &s, 2 };
    cr_assert_eq(d->ops->notify(d, on_notice, &a1), 0);
    cr_assert_eq(d->ops->copy_to_host(d, b, 0, dst, sizeof dst, NULL), 0);
    cr_assert_eq(d->ops->notify(d, on_notice, &a2), 0);
    wait_for(&s, 2);
    cr_assert(s.order[0] == 1 && s.order[1] == 2, "notices in the order given");
    cr_assert_eq(s.watched[0], 0, "the first notice came before the copy");
    cr_assert_eq(s.watched[1], 0x33, "the second notice came after it");
    cr_assert_eq(memcmp(src, dst, sizeof dst), 0);
    /* An event recorded after more work completes in order, and sync waits for all. */
    wf_event *e;
    cr_assert_eq(d->ops->event_create(d, &e), 0);
    memset(dst, 0, sizeof dst);
    cr_assert_eq(d->ops->copy_to_host(d, b, 0, dst, sizeof dst, e), 0);
    cr_assert_eq(d->ops->event_query(d, e), 0);
    cr_assert_eq(d->ops->event_sync(d, e, 0), 0);
    cr_assert_eq(dst[255], 0x33);
    cr_assert_eq(d->ops->sync(d), 0);
    d->ops->event_destroy(d, e);
    /* The buffer outlives the device. */
    wf_device_close(d);
    wf__buffer_release(b);
}

Test(devices_internal_devflow, simulated_peer_copies_check_their_source_and_ranges)
{
    wf_device *a, *b, *cpu;
    cr_assert_eq(wf__sim_open(rt, 1, 0, NULL, &a), 0);
    cr_assert_eq(wf__sim_open(rt, 2, 1, NULL, &b), 0);
    cr_assert_eq(wf_device_open(rt, 0, NULL, &cpu), 0);
    wf_buffer *x, *y, *h;
    cr_assert_eq(a->ops->alloc(a, 128, &x), 0);
    cr_assert_eq(b->ops->alloc(b, 128, &y), 0);
    cr_assert_eq(cpu->ops->alloc(cpu, 128, &h), 0);
    float v[32];
    for (int i = 0; i < 32; i++)
        v[i] = (float)i + 0.5f;
    cr_assert_eq(a->ops->copy_from_host(a, x, 0, v, sizeof v, NULL), 0);
    cr_assert_eq(b->ops->copy_peer(b, y, 0, a, x, 0, 128), 0, "%s", wf_last_errmsg());
    float back[32] = { 0 };
    cr_assert_eq(b->ops->copy_to_host(b, y, 0, back, sizeof back, NULL), 0);
    cr_assert_eq(b->ops->sync(b), 0);
    cr_assert_eq(memcmp(back, v, sizeof v), 0);
    cr_assert_eq(b->ops->copy_peer(b, y, 64, a, x, 0, 128), WF_EINVAL, "past the end");
    cr_assert_eq(b->ops->copy_peer(b, y, 0, cpu, h, 0, 16), WF_EINVAL, "from the CPU");
    cr_assert(strstr(wf_last_errmsg(), "cpu:0"), "%s", wf_last_errmsg());
    cr_assert_eq(cpu->ops->copy_peer(cpu, h, 0, a, x, 0, 16), WF_EINVAL, "to the CPU");
    wf_pool_stats st;
    cr_assert_eq(wf_device_memory_stats(a, &st), 0);
    cr_assert_eq(st.bytes_live, 128);
    a->ops->free(a, x);
    cr_assert_eq(wf_device_memory_stats(a, &st), 0);
    cr_assert_eq(st.bytes_live, 0);
    b->ops->free(b, y);
    cpu->ops->free(cpu, h);
    wf_device_close(a);
    wf_device_close(b);
    wf_device_close(cpu);
}

/* A device tensor of 'n' f32 on 'd'. */
static wf_tensor *dev_f32(wf_device *d, int64_t n)
{
    wf_buffer *b;
    cr_assert_eq(d->ops->alloc(d, (size_t)n * sizeof(float), &b), 0, "%s", wf_last_errmsg());
    wf_tensor *t = wf__tensor_wrap(WF_F32, WF_SHAPE(n), b);
    cr_assert_not_null(t);
    return t;
}

typedef struct copy_done {
    atomic_int calls;
    int rc;
    float first; /* out[0] when the completion came */
    const float *out;
} copy_done;

static void on_copy_done(void *token, int rc)
{
    copy_done *c = token;
    c->rc = rc;
    c->first = c->out[0];
    atomic_fetch_add_explicit(&c->calls, 1, memory_order_release);
}

static int run_copy(wf__kernels *r, wf_graph *g, wf_node *x, int from, int to, wf_tensor *in,
                    wf_tensor *out, copy_done *done)
{
    wf_attrs a = { 0 };
    a.from_dev = from;
    a.to_dev = to;
    wf_node *n = wf__node_add(g, &wf_op_copy, &x, 1, &a);
    cr_assert_not_null(n, "%s", wf_last_errmsg());
    wf_kernel_fn k = wf__kernels_find(r, &wf_op_copy, WF_KERNEL_CPU);
    cr_assert_not_null(k, "devices/ registered the copy kernel of the CPU kind");
    wf_kernel_ctx ctx = { .rt = rt, .data = wf__kernels_data(r, &wf_op_copy, WF_KERNEL_CPU) };
    if (done) {
        ctx.complete = on_copy_done;
        ctx.token = done;
    }
    return k(&ctx, n, &in, &out);
}

Test(devices_internal_devflow, the_copy_kernels_move_values_host_to_device_between_devices_and_back)
{
    wf_device *devs[3] = { NULL };
    cr_assert_eq(wf__sim_open(rt, 1, 0, &(wf__sim_opts){ .delay_us = 20000 }, &devs[1]), 0);
    cr_assert_eq(wf__sim_open(rt, 2, 1, &(wf__sim_opts){ .delay_us = 20000 }, &devs[2]), 0);
    wf__device_table tab = { devs, 3 };
    wf__kernels *r;
    cr_assert_eq(wf__kernels_create(&r), 0);
    cr_assert_eq(wf__devices_register_kernels(r, &tab), 0, "%s", wf_last_errmsg());
    cr_assert_eq(wf__devices_register_kernels(NULL, &tab), WF_EINVAL);
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    cr_assert_not_null(g);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(6));
    /* A strided host value (every other element of 12) is gathered on its way in. */
    float src[12];
    for (int i = 0; i < 12; i++)
        src[i] = (float)i * 1.25f - 3.0f;
    wf_tensor *whole = wf_tensor_from(WF_F32, WF_SHAPE(12), src);
    cr_assert_not_null(whole);
    wf_tensor *h = wf__tensor_alias(whole, WF_SHAPE(6), (const int64_t[]){ 2 }, 0);
    cr_assert_not_null(h, "%s", wf_last_errmsg());
    cr_assert(!h->contiguous);
    wf_tensor *d1 = dev_f32(devs[1], 6), *d2 = dev_f32(devs[2], 6);
    cr_assert_eq(run_copy(r, g, x, 0, 1, h, d1, NULL), 0, "%s", wf_last_errmsg());
    cr_assert_eq(run_copy(r, g, x, 1, 2, d1, d2, NULL), 0, "%s", wf_last_errmsg());
    /* To the host: pends, and the bytes are there when the completion comes, not before. */
    wf_tensor *back = wf__tensor_alloc(WF_F32, WF_SHAPE(6));
    cr_assert_not_null(back);
    memset((void *)back->data, 0, 6 * sizeof(float));
    copy_done done = { .out = (const float *)back->data };
    cr_assert_eq(run_copy(r, g, x, 2, 0, d2, back, &done), WF_KERNEL_PENDING, "%s",
                 wf_last_errmsg());
    for (int k = 0; atomic_load_explicit(&done.calls, memory_order_acquire) < 1 && k < 20000; k++)
        nanosleep(&(struct timespec){ 0, 100000 }, NULL);
    cr_assert_eq(atomic_load(&done.calls), 1, "the completion came once");
    cr_assert_eq(done.rc, 0);
    cr_assert_eq(done.first, src[0]);
    for (int i = 0; i < 6; i++)
        cr_assert_eq(((const float *)back->data)[i], src[2 * i], "element %d", i);
    /* Without a completion the kernel waits for the device itself. */
    memset((void *)back->data, 0, 6 * sizeof(float));
    cr_assert_eq(run_copy(r, g, x, 1, 0, d1, back, NULL), 0, "%s", wf_last_errmsg());
    cr_assert_eq(((const float *)back->data)[5], src[10]);
    /* A device id that names no open device is refused, naming both ids. */
    cr_assert_eq(run_copy(r, g, x, 0, 5, h, d1, NULL), WF_EINVAL);
    cr_assert(strstr(wf_last_errmsg(), "device 5"), "%s", wf_last_errmsg());
    /* A copy between one device and itself is no copy: inference refuses it. */
    wf_attrs a = { 0 };
    a.from_dev = a.to_dev = 1;
    cr_assert_null(wf__node_add(g, &wf_op_copy, &x, 1, &a));
    wf_tensor_release(back);
    wf_tensor_release(d1);
    wf_tensor_release(d2);
    wf_tensor_release(h);
    wf_tensor_release(whole);
    wf_graph_destroy(g);
    wf__kernels_destroy(r);
    wf_device_close(devs[1]);
    wf_device_close(devs[2]);
}
