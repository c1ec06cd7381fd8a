/* devices/cpu.c: the CPU device.
 * Owns: one host pool per NUMA node of the runtime (memory/), and the CPU's side of the
 * device interface: memory from the pool of the calling worker's node, copies (split over
 * the workers when large), kernels run on the calling thread, events.
 * Invariant: everything given to the CPU device completes inside the call that gave it, in
 * order, so an event is complete when it is recorded and a wait on the CPU's own events
 * never blocks; waiting for another device's event blocks the calling thread until it
 * completes.
 * Not here: the kernels themselves (ops/), which node a tensor should live on
 * (placement/). */
#include "../core/error.h"
#include "../memory/pool.h"
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Copies above this size are split over the workers in chunks of COPY_CHUNK: one core's
 * memcpy does not saturate a socket's memory bandwidth. */
#define COPY_PARALLEL ((size_t)8 << 20)
#define COPY_CHUNK    ((size_t)1 << 20)

typedef struct cpu_device {
    wf_device base;
    int npools;
    wf_pool *pools[]; /* one per NUMA node, bound to it */
} cpu_device;

void wf__cpu_info(wf_runtime *rt, wf_device_info *info)
{
    memset(info, 0, sizeof *info);
    info->kind = WF_DEVICE_CPU;
    info->index = 0;
    snprintf(info->name, sizeof info->name, "cpu:0");
    long pages = sysconf(_SC_PHYS_PAGES), pg = sysconf(_SC_PAGESIZE);
    info->memory_bytes = pages > 0 && pg > 0 ? (uint64_t)pages * (uint64_t)pg : 0;
    info->numa = wf_runtime_numa_count(rt) > 1 ? -1 : 0;
    info->compute_units = wf_runtime_worker_count(rt);
}

static wf_pool *local_pool(cpu_device *c)
{
    int w = wf_runtime_current_worker(c->base.rt);
    int node = w >= 0 ? wf_runtime_worker_numa(c->base.rt, w) : 0;
    return c->pools[node >= 0 && node < c->npools ? node : 0];
}

static int cpu_alloc(wf_device *d, size_t bytes, wf_buffer **out)
{
    if (!d || !out)
        return wf__err(WF_EINVAL, "cpu:0 alloc: %s is NULL", d ? "out" : "device");
    return wf__pool_buffer(local_pool((cpu_device *)d), bytes, out);
}

static void cpu_free(wf_device *d, wf_buffer *b)
{
    wf__buffer_release(b);
}

typedef struct copy_job {
    char *dst;
    const char *src;
    size_t n;
} copy_job;

static int copy_range(void *ctx, int64_t lo, int64_t hi)
{
    const copy_job *j = ctx;
    size_t a = (size_t)lo * COPY_CHUNK, b = (size_t)hi * COPY_CHUNK;
    if (b > j->n)
        b = j->n;
    memcpy(j->dst + a, j->src + a, b - a);
    return 0;
}

static int copy(cpu_device *c, void *dst, const void *src, size_t n)
{
    if (n < COPY_PARALLEL || wf_runtime_worker_count(c->base.rt) < 2) {
        memcpy(dst, src, n);
        return 0;
    }
    copy_job j = { dst, src, n };
    return wf_parallel_for(c->base.rt, 0, (int64_t)((n + COPY_CHUNK - 1) / COPY_CHUNK), 1,
                           copy_range, &j);
}

static int check_range(const char *what, const wf_buffer *b, size_t off, size_t n, const void *host)
{
    if (!b || (!host && n))
        return wf__err(WF_EINVAL, "cpu:0 %s: %s is NULL", what, b ? "host pointer" : "buffer");
    if (off > b->bytes || n > b->bytes - off)
        return wf__err(WF_EINVAL, "cpu:0 %s: bytes [%zu, %zu) are outside the %zu-byte buffer",
                       what, off, off + n, b->bytes);
    return 0;
}

static int cpu_record(wf_device *d, wf_event *e)
{
    if (!e || e->dev != d)
        return wf__err(WF_EINVAL, "cpu:0 record_event: %s",
                       e ? "the event belongs to another device" : "event is NULL");
    wf__event_complete(e, wf__event_record(e));
    return 0;
}

static int cpu_copy_to_host(wf_device *d, const wf_buffer *src, size_t off, void *dst, size_t n,
                            wf_event *done)
{
    int rc = check_range("copy_to_host", src, off, n, dst);
    if (rc < 0)
        return rc;
    if (n && (rc = copy((cpu_device *)d, dst, (const char *)src->data + off, n)) < 0)
        return rc;
    return done ? cpu_record(d, done) : 0;
}

static int cpu_copy_from_host(wf_device *d, wf_buffer *dst, size_t off, const void *src, size_t n,
                              wf_event *done)
{
    int rc = check_range("copy_from_host", dst, off, n, src);
    if (rc < 0)
        return rc;
    if (n && (rc = copy((cpu_device *)d, (char *)dst->data + off, src, n)) < 0)
        return rc;
    return done ? cpu_record(d, done) : 0;
}

static int cpu_run(wf_device *d, wf_task_fn fn, void *arg, const char *name, wf_event *done)
{
    if (!fn)
        return wf__err(WF_EINVAL, "cpu:0 run: kernel '%s' has no function", name ? name : "?");
    int rc = fn(arg);
    /* The event completes even when the kernel failed, as a CUDA event does: the error is
     * the caller's to report, and a waiter must not hang on it. */
    if (done) {
        int r2 = cpu_record(d, done);
        if (rc >= 0 && r2 < 0)
            return r2;
    }
    return rc;
}

static int cpu_event_create(wf_device *d, wf_event **out)
{
    if (!out)
        return wf__err(WF_EINVAL, "cpu:0 event_create: out is NULL");
    return wf__event_create(d, out);
}

static void cpu_event_destroy(wf_device *d, wf_event *e)
{
    wf__event_destroy(e);
}

static int cpu_event_query(wf_device *d, wf_event *e)
{
    if (!e)
        return wf__err(WF_EINVAL, "cpu:0 event_query: event is NULL");
    return wf__event_query(e);
}

static int cpu_event_sync(wf_device *d, wf_event *e, uint64_t timeout_ns)
{
    return wf__event_sync(e, timeout_ns);
}

static int cpu_wait_event(wf_device *d, wf_event *e)
{
    if (!e)
        return wf__err(WF_EINVAL, "cpu:0 wait_event: event is NULL");
    if (e->dev == d)
        return 0; /* its own work is complete already (the invariant above) */
    return wf__event_sync(e, 0);
}

/* Everything given to the CPU has completed when the call that gave it returned. */
static int cpu_notify(wf_device *d, void (*fn)(void *arg, int status), void *arg)
{
    if (!fn)
        return wf__err(WF_EINVAL, "cpu:0 notify: fn is NULL");
    fn(arg, 0);
    return 0;
}

static int cpu_copy_peer(wf_device *d, wf_buffer *dst, size_t dst_off, wf_device *from,
                         const wf_buffer *src, size_t src_off, size_t n)
{
    if (!from || from->ops != d->ops)
        return wf__err(WF_EINVAL,
                       "cpu:0 copy_peer: the source is %s; copy it with its "
                       "copy_to_host",
                       from ? from->info.name : "NULL");
    int rc = check_range("copy_peer", dst, dst_off, n, src);
    if (rc >= 0)
        rc = check_range("copy_peer", src, src_off, n, dst);
    if (rc >= 0 && n)
        rc = copy((cpu_device *)d, (char *)dst->data + dst_off, (const char *)src->data + src_off,
                  n);
    return rc;
}

static int cpu_sync(wf_device *d)
{
    return 0;
}

static int cpu_memory_stats(const wf_device *d, wf_pool_stats *out)
{
    if (!d || !out)
        return wf__err(WF_EINVAL, "cpu:0 memory_stats: %s is NULL", d ? "out" : "device");
    const cpu_device *c = (const cpu_device *)d;
    wf_pool_stats sum = { .numa = c->npools > 1 ? -1 : 0 };
    for (int i = 0; i < c->npools; i++) {
        wf_pool_stats s;
        if (wf_pool_get_stats(c->pools[i], &s) < 0)
            continue;
        sum.bytes_live += s.bytes_live;
        sum.bytes_peak += s.bytes_peak; /* an upper bound: nodes peak at different times */
        sum.bytes_cached += s.bytes_cached;
        sum.bytes_reserved += s.bytes_reserved;
        sum.allocs += s.allocs;
        sum.frees += s.frees;
        sum.cache_hits += s.cache_hits;
        sum.sys_allocs += s.sys_allocs;
        sum.sys_frees += s.sys_frees;
        sum.failed += s.failed;
        sum.bound |= s.bound;
    }
    *out = sum;
    return 0;
}

static void cpu_close(wf_device *d)
{
    cpu_device *c = (cpu_device *)d;
    /* Buffers still alive keep their pool (memory/pool.h), so this cannot strand them. */
    for (int i = 0; i < c->npools; i++)
        wf_pool_destroy(c->pools[i]);
    free(c);
}

static const wf_device_ops cpu_ops = {
    .alloc = cpu_alloc,
    .free = cpu_free,
    .copy_to_host = cpu_copy_to_host,
    .copy_from_host = cpu_copy_from_host,
    .run = cpu_run,
    .event_create = cpu_event_create,
    .event_destroy = cpu_event_destroy,
    .event_query = cpu_event_query,
    .event_sync = cpu_event_sync,
    .record_event = cpu_record,
    .wait_event = cpu_wait_event,
    .notify = cpu_notify,
    .copy_peer = cpu_copy_peer,
    .sync = cpu_sync,
    .memory_stats = cpu_memory_stats,
    .close = cpu_close,
};

int wf__cpu_open(wf_runtime *rt, const wf_device_opts *o, wf_device **out)
{
    int n = wf_runtime_numa_count(rt);
    if (n < 1)
        n = 1;
    cpu_device *c = calloc(1, sizeof *c + (size_t)n * sizeof c->pools[0]);
    if (!c)
        return wf__err(WF_ENOMEM, "wf_device_open: no memory for cpu:0");
    c->base.ops = &cpu_ops;
    c->base.rt = rt;
    c->base.id = 0;
    wf__cpu_info(rt, &c->base.info);
    for (int i = 0; i < n; i++) {
        wf_pool_opts po = {
            .limit_bytes = o ? o->limit_bytes : 0,
            .numa = i,
            .fail_after = o ? o->fail_after : 0,
        };
        int rc = wf_pool_create(rt, &po, &c->pools[i]);
        if (rc < 0) {
            c->npools = i;
            cpu_close(&c->base);
            return rc;
        }
    }
    c->npools = n;
    *out = &c->base;
    return 0;
}
