/* devices/sim.c: a simulated accelerator, for testing what the executor does with devices
 *   (placement, copies between devices, completions from an actor) where there is no GPU.
 * Owns: one simulated device: its memory (host memory of its own, so that every crossing
 *   is a real copy), its queue of pending completions, and its actor, which works through
 *   that queue in order.
 * What it simulates, and why it is enough: kernels are the CPU kernels (info.kind is
 *   WF_DEVICE_CPU) and run in the call that gives them, as do copies into the device and
 *   between simulated devices, so the device's memory always holds what its in-order queue
 *   would hold. What a GPU finishes later, this device also finishes later: a copy to the
 *   host lands in its destination, events complete and notify() functions run only when
 *   the actor reaches them (after 'delay_us' each, in the order given). A reader released
 *   before the copy it needs has completed therefore reads stale bytes, and a missing
 *   completion hangs the run (the tests' timeouts catch it).
 * Failures on demand (wf__sim_opts): the n-th allocation, and a fault at the n-th
 *   completion after which, as after a CUDA kernel fault, every notice reports the error and
 *   nothing more lands; events still complete, so that nobody hangs.
 * Invariant: the queue ('head' .. 'tail') holds, in the order given, every record, notify and copy
 * to the host that has not completed; the actor pops them one at a time; 'idle' is signalled when
 * it is empty. Everything under 'mu'. Not here: real devices (cpu.c, cuda.c); which nodes run on it
 * (runtime/compile/pass_place.c). */
#include "../core/error.h"
#include "device.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct item {
    struct item *next;
    wf_event *ev; /* a record: complete 'ticket' of 'ev' */
    uint64_t ticket;
    void (*fn)(void *arg, int status); /* a notify */
    void *arg;
    void *dst; /* a copy to the host: 'n' bytes of 'staged' into 'dst' */
    void *staged;
    size_t n;
} item;

typedef struct sim_device {
    wf_device base;
    wf_actor *actor;
    wf__sim_opts o;
    _Atomic int64_t n_allocs; /* allocations tried */
    int64_t n_done;           /* completions made, by the actor */
    bool faulted;             /* a simulated fault happened: every later notice fails */
    pthread_mutex_t mu;
    pthread_cond_t idle;
    item *head, *tail;
    _Atomic uint64_t bytes_live, allocs, frees;
    _Atomic int64_t refs; /* the open device's, plus one per live buffer */
} sim_device;

static const wf_device_ops sim_ops;

bool wf__sim_is(const wf_device *d)
{
    return d && d->ops == &sim_ops;
}

/* Appends 'it' to the queue and pokes the actor. */
static int push(sim_device *s, item *it)
{
    pthread_mutex_lock(&s->mu);
    if (s->tail)
        s->tail->next = it;
    else
        s->head = it;
    s->tail = it;
    pthread_mutex_unlock(&s->mu);
    return wf_actor_poke(s->actor);
}

static int new_item(sim_device *s, item **out)
{
    *out = calloc(1, sizeof **out);
    return *out ? 0 : wf__err(WF_ENOMEM, "%s: no memory for a queue entry", s->base.info.name);
}

/* The actor: completes the queue in order, one entry per 'delay_us'. */
static int actor_fn(wf_actor *a, wf_msg *msg, void *ctx)
{
    sim_device *s = ctx;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        item *it = s->head;
        pthread_mutex_unlock(&s->mu);
        if (!it)
            return 0;
        if (s->o.delay_us)
            nanosleep(&(struct timespec){ 0, (long)s->o.delay_us * 1000 }, NULL);
        if (++s->n_done == s->o.fail_notice_after)
            s->faulted = true;
        if (it->dst && !s->faulted) /* a faulted device delivers nothing more */
            memcpy(it->dst, it->staged, it->n);
        if (it->ev) /* events complete anyway: a waiter must not hang (as cuda.c) */
            wf__event_complete(it->ev, it->ticket);
        if (it->fn) {
            int st = s->faulted ? wf__err(WF_EDEVICE,
                                          "%s: simulated device fault (completion "
                                          "%lld)",
                                          s->base.info.name, (long long)s->o.fail_notice_after)
                                : 0;
            it->fn(it->arg, st);
        }
        pthread_mutex_lock(&s->mu);
        s->head = it->next;
        if (!s->head) {
            s->tail = NULL;
            pthread_cond_broadcast(&s->idle);
        }
        pthread_mutex_unlock(&s->mu);
        free(it->staged);
        free(it);
    }
}

/* Drops a reference to 's'; the last one (the device closed, no buffer left) frees it. */
static void unref(sim_device *s)
{
    if (atomic_fetch_sub(&s->refs, 1) != 1)
        return;
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->idle);
    free(s);
}

static void buffer_free(void *ctx, void *data, size_t bytes)
{
    sim_device *s = ctx;
    atomic_fetch_sub(&s->bytes_live, bytes);
    atomic_fetch_add(&s->frees, 1);
    free(data);
    unref(s);
}

static int sim_alloc(wf_device *d, size_t bytes, wf_buffer **out)
{
    sim_device *s = (sim_device *)d;
    if (!d || !out)
        return wf__err(WF_EINVAL, "sim alloc: %s is NULL", d ? "out" : "device");
    *out = NULL;
    if (atomic_fetch_add(&s->n_allocs, 1) + 1 == s->o.fail_alloc_after)
        return wf__err(WF_ENOMEM, "%s: out of memory: %zu bytes requested (simulated failure)",
                       d->info.name, bytes);
    wf_buffer *b = malloc(sizeof *b);
    void *p = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    if (!b || !p) {
        free(b);
        free(p);
        return wf__err(WF_ENOMEM, "%s: out of memory: %zu bytes requested", d->info.name, bytes);
    }
    atomic_init(&b->refs, 1);
    b->data = p;
    b->bytes = bytes;
    b->free_fn = buffer_free;
    b->free_ctx = s;
    atomic_fetch_add(&s->refs, 1);
    atomic_fetch_add(&s->bytes_live, bytes);
    atomic_fetch_add(&s->allocs, 1);
    *out = b;
    return 0;
}

static void sim_free(wf_device *d, wf_buffer *b)
{
    wf__buffer_release(b);
}

static int check_range(const wf_device *d, const char *what, const wf_buffer *b, size_t off,
                       size_t n, const void *host)
{
    if (!b || (!host && n))
        return wf__err(WF_EINVAL, "%s %s: %s is NULL", d->info.name, what,
                       b ? "host pointer" : "buffer");
    if (off > b->bytes || n > b->bytes - off)
        return wf__err(WF_EINVAL, "%s %s: bytes [%zu, %zu) are outside the %zu-byte buffer",
                       d->info.name, what, off, off + n, b->bytes);
    return 0;
}

static int sim_record(wf_device *d, wf_event *e)
{
    if (!e || e->dev != d)
        return wf__err(WF_EINVAL, "%s record_event: %s", d->info.name,
                       e ? "the event belongs to another device" : "event is NULL");
    item *it;
    uint64_t ticket = wf__event_record(e);
    int rc = new_item((sim_device *)d, &it);
    if (rc < 0) {
        wf__event_complete(e, ticket); /* nobody may hang on a record that never happens */
        return rc;
    }
    it->ev = e;
    it->ticket = ticket;
    return push((sim_device *)d, it);
}

static int sim_copy_to_host(wf_device *d, const wf_buffer *src, size_t off, void *dst, size_t n,
                            wf_event *done)
{
    int rc = check_range(d, "copy_to_host", src, off, n, dst);
    if (rc < 0)
        return rc;
    if (n) { /* the bytes as of now (in-order), delivered when the actor gets to them */
        item *it;
        if ((rc = new_item((sim_device *)d, &it)) < 0)
            return rc;
        if (!(it->staged = malloc(n))) {
            free(it);
            return wf__err(WF_ENOMEM, "%s: no memory to stage %zu bytes", d->info.name, n);
        }
        memcpy(it->staged, (const char *)src->data + off, n);
        it->dst = dst;
        it->n = n;
        if ((rc = push((sim_device *)d, it)) < 0)
            return rc;
    }
    return done ? sim_record(d, done) : 0;
}

static int sim_copy_from_host(wf_device *d, wf_buffer *dst, size_t off, const void *src, size_t n,
                              wf_event *done)
{
    int rc = check_range(d, "copy_from_host", dst, off, n, src);
    if (rc < 0)
        return rc;
    if (n)
        memcpy((char *)dst->data + off, src, n);
    return done ? sim_record(d, done) : 0;
}

static int sim_copy_peer(wf_device *d, wf_buffer *dst, size_t dst_off, wf_device *from,
                         const wf_buffer *src, size_t src_off, size_t n)
{
    if (!wf__sim_is(from))
        return wf__err(WF_EINVAL, "%s copy_peer: the source is %s, not a simulated device",
                       d->info.name, from ? from->info.name : "NULL");
    int rc = check_range(d, "copy_peer (destination)", dst, dst_off, n, dst ? dst->data : NULL);
    if (rc >= 0)
        rc = check_range(from, "copy_peer (source)", src, src_off, n, src ? src->data : NULL);
    if (rc >= 0 && n)
        memmove((char *)dst->data + dst_off, (const char *)src->data + src_off, n);
    return rc;
}

static int sim_run(wf_device *d, wf_task_fn fn, void *arg, const char *name, wf_event *done)
{
    if (!fn)
        return wf__err(WF_EINVAL, "%s run: kernel '%s' has no function", d->info.name,
                       name ? name : "?");
    int rc = fn(arg);
    if (done) {
        int r2 = sim_record(d, done);
        if (rc >= 0 && r2 < 0)
            rc = r2;
    }
    return rc;
}

static int sim_notify(wf_device *d, void (*fn)(void *arg, int status), void *arg)
{
    if (!fn)
        return wf__err(WF_EINVAL, "%s notify: fn is NULL", d->info.name);
    item *it;
    int rc = new_item((sim_device *)d, &it);
    if (rc < 0)
        return rc;
    it->fn = fn;
    it->arg = arg;
    return push((sim_device *)d, it);
}

static int sim_event_create(wf_device *d, wf_event **out)
{
    if (!out)
        return wf__err(WF_EINVAL, "%s event_create: out is NULL", d->info.name);
    return wf__event_create(d, out);
}

static void sim_event_destroy(wf_device *d, wf_event *e)
{
    if (e)
        (void)wf__event_sync(e, 0); /* its record is still in the queue: wait for it */
    wf__event_destroy(e);
}

static int sim_event_query(wf_device *d, wf_event *e)
{
    if (!e)
        return wf__err(WF_EINVAL, "%s event_query: event is NULL", d->info.name);
    return wf__event_query(e);
}

static int sim_event_sync(wf_device *d, wf_event *e, uint64_t timeout_ns)
{
    return wf__event_sync(e, timeout_ns);
}

static int sim_wait_event(wf_device *d, wf_event *e)
{
    if (!e)
        return wf__err(WF_EINVAL, "%s wait_event: event is NULL", d->info.name);
    /* Work given here runs in the call that gives it, so it must wait now. */
    return wf__event_sync(e, 0);
}

static int sim_sync(wf_device *d)
{
    sim_device *s = (sim_device *)d;
    pthread_mutex_lock(&s->mu);
    while (s->head)
        pthread_cond_wait(&s->idle, &s->mu);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

static int sim_memory_stats(const wf_device *d, wf_pool_stats *out)
{
    if (!d || !out)
        return wf__err(WF_EINVAL, "sim memory_stats: %s is NULL", d ? "out" : "device");
    sim_device *s = (sim_device *)d;
    *out = (wf_pool_stats){
        .bytes_live = atomic_load(&s->bytes_live),
        .bytes_reserved = atomic_load(&s->bytes_live),
        .allocs = atomic_load(&s->allocs),
        .frees = atomic_load(&s->frees),
        .numa = 0,
    };
    return 0;
}

static void sim_close(wf_device *d)
{
    sim_device *s = (sim_device *)d;
    (void)sim_sync(d);
    wf_actor_destroy(s->actor);
    s->actor = NULL;
    unref(s); /* buffers still alive keep 's' (their free hook's context) */
}

static const wf_device_ops sim_ops = {
    .alloc = sim_alloc,
    .free = sim_free,
    .copy_to_host = sim_copy_to_host,
    .copy_from_host = sim_copy_from_host,
    .run = sim_run,
    .event_create = sim_event_create,
    .event_destroy = sim_event_destroy,
    .event_query = sim_event_query,
    .event_sync = sim_event_sync,
    .record_event = sim_record,
    .wait_event = sim_wait_event,
    .notify = sim_notify,
    .copy_peer = sim_copy_peer,
    .sync = sim_sync,
    .memory_stats = sim_memory_stats,
    .close = sim_close,
};

int wf__sim_open(wf_runtime *rt, int id, int index, const wf__sim_opts *o, wf_device **out)
{
    if (!rt || !out)
        return wf__err(WF_EINVAL, "wf__sim_open: %s is NULL", rt ? "out" : "rt");
    *out = NULL;
    sim_device *s = calloc(1, sizeof *s);
    if (!s)
        return wf__err(WF_ENOMEM, "wf__sim_open: no memory for sim:%d", index);
    s->base.ops = &sim_ops;
    s->base.rt = rt;
    s->base.id = id;
    s->base.info = (wf_device_info){ .kind = WF_DEVICE_CPU, .index = index, .numa = 0 };
    snprintf(s->base.info.name, sizeof s->base.info.name, "sim:%d", index);
    s->base.info.compute_units = 1;
    if (o)
        s->o = *o;
    atomic_init(&s->refs, 1);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->idle, NULL);
    char aname[32];
    snprintf(aname, sizeof aname, "weft-sim%d", index);
    wf_actor_opts ao = { .handler = actor_fn, .ctx = s, .name = aname };
    int rc = wf_actor_create(rt, &ao, &s->actor);
    if (rc < 0) {
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->idle);
        free(s);
        return rc;
    }
    *out = &s->base;
    return 0;
}
