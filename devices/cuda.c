/* devices/cuda.c: the CUDA device.
 * Owns: discovery (cudaGetDeviceCount: a failure or 0 means "no CUDA device", not an error),
 *   the description of each GPU, and one open device: its three streams (compute,
 *   host-to-device, device-to-host), the cuBLAS, cuBLASLt and cuDNN handles bound to the
 *   compute stream with their workspace (the wf__cuda_queue kernels see, devices/cuda.h),
 *   its caching pool (cuda_pool.c), its pinned staging buffers, a pool of CUDA events, and
 *   its actor ("weft-cudaN", bound to the GPU's NUMA node), through which completions
 *   reach the scheduler.
 * How work flows: a call of the device interface (run, copy, record, wait) enqueues on one
 *   of the streams under the device's run lock and returns once queued; it never waits for
 *   the GPU. The interface promises that work given to one device completes in order
 *   (devices/device.h), so moving from one stream to another makes the new stream wait for
 *   an event recorded on the previous one. A record enqueues a CUDA event record and a host
 *   function (cudaLaunchHostFunc) that completes the wf_event's ticket, which wakes its
 *   waiters, and pokes the actor; the actor then moves pool blocks whose cross-stream
 *   events completed back to the cache. The host function neither calls CUDA nor takes a
 *   lock a worker could hold while waiting for the GPU, so a worker never waits on the
 *   actor: waiting for a CUDA event from the CPU (wf__event_sync) only needs the driver's
 *   callback thread.
 * Why the run lock and not a message per kernel: enqueueing a kernel costs microseconds,
 *   less than a mailbox hop to another worker would; the lock also makes the handles, which
 *   are not thread-safe, used by one thread at a time (devices/cuda.h). Events, the pool's
 *   bookkeeping and completions are the actor's.
 * Copies: host memory goes through pinned staging buffers (cudaMemcpyAsync from pageable
 *   memory is synchronous), 8 MiB at a time; a copy to the host lands in staging and a host
 *   function copies it to the destination, so copy_from_host may free its source on
 *   return, and copy_to_host's destination holds the data once 'done' completes.
 * Completions as messages (notify()): a request is a stream callback
 *   (cudaStreamAddCallback, which the driver calls exactly once, also after a device error,
 *   with its status, where cudaLaunchHostFunc would skip it and leave a waiter hanging) that
 *   sends a message to the actor; the actor runs the requester's function on a worker, so
 *   what it does (finishing a task-graph node) never runs on the driver's thread.
 * Copies between GPUs (copy_peer): the destination's stream waits for an event recorded on
 *   the source after its work so far, copies with cudaMemcpyPeerAsync (direct when peer
 *   access can be enabled, NVLink or PCIe P2P; the driver stages it through host memory
 *   otherwise), and the source's stream then waits for an event after the copy, so the
 *   source buffer's stream-ordered free cannot hand it out while the copy reads it. The two
 *   run locks are taken one after the other, never together.
 * Invariants: every CUDA call's status is checked: a failure is WF_EDEVICE (WF_ENOMEM for
 *   memory) with a message naming the device and the call; the current CUDA device of the
 *   calling thread is set on entry to each call.
 * Not here: the kernels (ops/<op>_cuda.cu), the pool's policy (cuda_pool.c), placement and the
 *   executor's use of the device (runtime/compile/pass_place.c, runtime/exec_device.c). */
#ifdef WF_HAVE_CUDA

#    include "../core/error.h"
#    include "cuda_internal.h"
#    include "internal.h"

#    include <errno.h>
#    include <stdio.h>
#    include <stdlib.h>
#    include <string.h>
#    include <time.h>

enum { S_COMPUTE, S_H2D, S_D2H, N_STREAMS };

#    define STAGE_BYTES ((size_t)8 << 20)
#    define N_STAGE     4

typedef struct stage {
    void *host; /* pinned, STAGE_BYTES; NULL until first used */
    cudaEvent_t ev;
    bool ev_ok, used;
} stage;

struct wf__cuda_device {
    wf_device base;
    int ordinal;
    pthread_mutex_t run_mu; /* enqueueing: streams, handles, staging, 'last' */
    cudaStream_t streams[N_STREAMS];
    cudaEvent_t switch_ev[N_STREAMS]; /* ordering a stream switch */
    int last;                         /* the stream of the latest work */
    wf__cuda_queue q;
    wf__cuda_pool *pool;
    wf_actor *actor;
    stage stages[N_STAGE];
    int next_stage;
    pthread_mutex_t ev_mu; /* the event pool */
    cudaEvent_t *ev_free;
    int n_ev_free, cap_ev_free;
    _Atomic int64_t callbacks; /* host functions and stream callbacks not yet run */
    uint64_t peer_tried;       /* ordinals (< 64) whose peer access was tried, under run_mu */
};

typedef struct wf__cuda_device cuda_dev;

/* A CUDA device's event: the shared ticket counter plus the CUDA event of the latest record.
 * 'base' comes first: wf__event_destroy() frees the block through it. */
typedef struct cuda_event {
    wf_event base;
    cudaEvent_t ev;
} cuda_event;

/* A host function's argument: complete 'ev''s ticket, or copy staging to the host. */
typedef struct callback {
    cuda_dev *d;
    wf_event *ev;
    uint64_t ticket;
    void *dst;
    const void *src;
    size_t n;
} callback;

/* A notify() request, sent by the driver's stream callback to the actor. Allocated when
 * enqueued, so that the callback neither allocates nor calls CUDA. 'msg' comes first. */
typedef struct notice {
    wf_msg msg;
    cuda_dev *d;
    void (*fn)(void *arg, int status);
    void *arg;
    cudaError_t status;
} notice;

static const wf_device_ops cuda_ops;

static int wait_record(wf_event *e, uint64_t timeout_ns);

/* ---- errors ---------------------------------------------------------------------------- */

int wf__cuda_check(cudaError_t e, const char *what, const char *node)
{
    if (e == cudaSuccess)
        return 0;
    (void)cudaGetLastError(); /* clear a non-sticky error so that the next call is clean */
    return wf__err(e == cudaErrorMemoryAllocation ? WF_ENOMEM : WF_EDEVICE, "%s: %s: %s: %s",
                   node ? node : "cuda", what, cudaGetErrorName(e), cudaGetErrorString(e));
}

int wf__cublas_check(cublasStatus_t s, const char *what, const char *node)
{
    if (s == CUBLAS_STATUS_SUCCESS)
        return 0;
    return wf__err(s == CUBLAS_STATUS_ALLOC_FAILED ? WF_ENOMEM : WF_EDEVICE, "%s: %s: %s: %s",
                   node ? node : "cuda", what, cublasGetStatusName(s), cublasGetStatusString(s));
}

int wf__cudnn_check(cudnnStatus_t s, const char *what, const char *node)
{
    if (s == CUDNN_STATUS_SUCCESS)
        return 0;
    return wf__err(s == CUDNN_STATUS_ALLOC_FAILED ? WF_ENOMEM : WF_EDEVICE, "%s: %s: %s",
                   node ? node : "cuda", what, cudnnGetErrorString(s));
}

/* ---- discovery ------------------------------------------------------------------------- */

int wf__cuda_count(void)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        /* No driver, no device, or a driver older than the runtime: none to use. */
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

/* The NUMA node the GPU hangs off (the kernel's view of its PCI slot), as an index of the
 * runtime's nodes, or -1 when unknown. hwloc is sched/'s and memory/'s
 * (docs/architecture.md, "Layers"); sysfs gives the same answer for the one fact needed here. */
static int gpu_numa(wf_runtime *rt, int ordinal)
{
    int nodes = wf_runtime_numa_count(rt);
    if (nodes <= 1)
        return 0;
    char bus[32], path[128];
    if (cudaDeviceGetPCIBusId(bus, sizeof bus, ordinal) != cudaSuccess) {
        (void)cudaGetLastError();
        return -1;
    }
    for (char *c = bus; *c; c++)
        if (*c >= 'A' && *c <= 'F')
            *c = (char)(*c - 'A' + 'a');
    snprintf(path, sizeof path, "/sys/bus/pci/devices/%s/numa_node", bus);
    FILE *f = fopen(path, "r");
    int node = -1;
    if (f) {
        if (fscanf(f, "%d", &node) != 1)
            node = -1;
        fclose(f);
    }
    return node >= 0 && node < nodes ? node : -1;
}

int wf__cuda_info(wf_runtime *rt, int ordinal, wf_device_info *info)
{
    memset(info, 0, sizeof *info);
    struct cudaDeviceProp prop;
    int rc =
        wf__cuda_check(cudaGetDeviceProperties(&prop, ordinal), "cudaGetDeviceProperties", NULL);
    if (rc < 0)
        return rc;
    info->kind = WF_DEVICE_CUDA;
    info->index = ordinal;
    /* "cuda:N" first: messages name the device by it (two GPUs of a product read alike). */
    snprintf(info->name, sizeof info->name, "cuda:%d (%.40s)", ordinal, prop.name);
    info->memory_bytes = prop.totalGlobalMem;
    info->numa = gpu_numa(rt, ordinal);
    info->compute_units = prop.multiProcessorCount;
    return 0;
}

/* ---- enqueueing ------------------------------------------------------------------------ */

/* Makes stream 'which' the current one: it waits for everything enqueued on the previous
 * one (the in-order promise). Under 'run_mu'. */
static int use_stream(cuda_dev *d, int which, const char *what)
{
    if (which == d->last)
        return 0;
    cudaError_t e = cudaEventRecord(d->switch_ev[d->last], d->streams[d->last]);
    if (e == cudaSuccess)
        e = cudaStreamWaitEvent(d->streams[which], d->switch_ev[d->last], 0);
    if (e != cudaSuccess)
        return wf__cuda_check(e, what, d->base.info.name);
    d->last = which;
    return 0;
}

static void CUDART_CB host_done(void *arg)
{
    callback *c = arg;
    cuda_dev *d = c->d;
    if (c->dst && c->n)
        memcpy(c->dst, c->src, c->n);
    if (c->ev)
        wf__event_complete(c->ev, c->ticket);
    free(c);
    /* The actor does the rest (the pool's pending frees); a failed poke only delays that.
     * Poke before the count drops: close() destroys the actor once it reaches 0. */
    int poked = wf_actor_poke(d->actor);
    (void)poked;
    atomic_fetch_sub_explicit(&d->callbacks, 1, memory_order_acq_rel);
}

/* Enqueues 'c' as a host function on the current stream; frees it on failure. */
static int enqueue_callback(cuda_dev *d, callback *c, const char *what)
{
    atomic_fetch_add_explicit(&d->callbacks, 1, memory_order_acq_rel);
    cudaError_t e = cudaLaunchHostFunc(d->streams[d->last], host_done, c);
    if (e != cudaSuccess) {
        atomic_fetch_sub_explicit(&d->callbacks, 1, memory_order_acq_rel);
        free(c);
        return wf__cuda_check(e, what, d->base.info.name);
    }
    return 0;
}

/* Records 'e' on the current stream. Under 'run_mu'. */
static int record_locked(cuda_dev *d, wf_event *e)
{
    cuda_event *ce = (cuda_event *)e;
    uint64_t ticket = wf__event_record(e);
    callback *c = calloc(1, sizeof *c);
    int rc;
    if (!c) {
        rc = wf__err(WF_ENOMEM, "%s: no memory for an event record", d->base.info.name);
    } else {
        *c = (callback){ .d = d, .ev = e, .ticket = ticket };
        rc = wf__cuda_check(cudaEventRecord(ce->ev, d->streams[d->last]), "cudaEventRecord",
                            d->base.info.name);
        if (rc < 0)
            free(c);
        else
            rc = enqueue_callback(d, c, "cudaLaunchHostFunc (event completion)");
    }
    if (rc < 0)
        wf__event_complete(e, ticket); /* nobody may hang on a record that never happens */
    return rc;
}

static int set_device(cuda_dev *d)
{
    return wf__cuda_check(cudaSetDevice(d->ordinal), "cudaSetDevice", d->base.info.name);
}

static int cuda_alloc_raw(cuda_dev *d, size_t bytes, void **out)
{
    int rc = set_device(d);
    return rc < 0 ? rc : wf__cuda_pool_alloc(d->pool, bytes, d->streams[S_COMPUTE], out);
}

static void buffer_free(void *ctx, void *data, size_t bytes)
{
    wf__cuda_pool_free(ctx, data);
}

static int cuda_alloc(wf_device *dv, size_t bytes, wf_buffer **out)
{
    if (!dv || !out)
        return wf__err(WF_EINVAL, "cuda alloc: %s is NULL", dv ? "out" : "device");
    *out = NULL;
    cuda_dev *d = (cuda_dev *)dv;
    wf_buffer *b = malloc(sizeof *b);
    if (!b)
        return wf__err(WF_ENOMEM, "%s: no memory for a buffer header", d->base.info.name);
    void *p;
    int rc = cuda_alloc_raw(d, bytes, &p);
    if (rc < 0) {
        free(b);
        return rc;
    }
    atomic_init(&b->refs, 1);
    b->data = p;
    b->bytes = bytes;
    b->free_fn = buffer_free;
    b->free_ctx = d->pool;
    *out = b;
    return 0;
}

static void cuda_free(wf_device *d, wf_buffer *b)
{
    wf__buffer_release(b);
}

/* Checks a staged copy's arguments: the buffer range, the host pointer and 'done' (which must
 * belong to this device). */
static int check_range(cuda_dev *d, const char *what, const wf_buffer *b, size_t off, size_t n,
                       const void *host, const wf_event *done)
{
    if (!b || (!host && n))
        return wf__err(WF_EINVAL, "%s %s: %s is NULL", d->base.info.name, what,
                       b ? "host pointer" : "buffer");
    if (off > b->bytes || n > b->bytes - off)
        return wf__err(WF_EINVAL, "%s %s: bytes [%zu, %zu) are outside the %zu-byte buffer",
                       d->base.info.name, what, off, off + n, b->bytes);
    if (done && done->dev != &d->base)
        return wf__err(WF_EINVAL, "%s %s: 'done' belongs to another device", d->base.info.name,
                       what);
    return 0;
}

/* The next staging buffer, once the GPU is done with its previous use. Under 'run_mu'. */
static int take_stage(cuda_dev *d, stage **out)
{
    stage *s = &d->stages[d->next_stage];
    d->next_stage = (d->next_stage + 1) % N_STAGE;
    int rc = 0;
    if (!s->host) {
        cudaError_t e = cudaHostAlloc(&s->host, STAGE_BYTES, cudaHostAllocPortable);
        if (e != cudaSuccess) {
            s->host = NULL;
            return wf__cuda_check(e, "cudaHostAlloc (pinned staging buffer)", d->base.info.name);
        }
    }
    if (!s->ev_ok) {
        rc = wf__cuda_check(cudaEventCreateWithFlags(&s->ev, cudaEventDisableTiming),
                            "cudaEventCreate", d->base.info.name);
        if (rc < 0)
            return rc;
        s->ev_ok = true;
    } else if (s->used) {
        /* All N_STAGE buffers are in flight: this thread waits for the oldest (it holds the
         * run lock, so the device's other enqueuers wait too; copies are bandwidth-bound). */
        rc = wf__cuda_check(cudaEventSynchronize(s->ev), "waiting for a staging buffer",
                            d->base.info.name);
        if (rc < 0)
            return rc;
    }
    *out = s;
    return 0;
}

/* Takes the run lock and makes stream 'which' of 'd' current for 'what'.
 * Returns 0 with 'run_mu' held, or a status with it released. */
static int lock_stream(cuda_dev *d, int which, const char *what)
{
    pthread_mutex_lock(&d->run_mu);
    int rc = set_device(d);
    if (rc >= 0)
        rc = use_stream(d, which, what);
    if (rc < 0)
        pthread_mutex_unlock(&d->run_mu);
    return rc;
}

static int cuda_copy_from_host(wf_device *dv, wf_buffer *dst, size_t off, const void *src, size_t n,
                               wf_event *done)
{
    cuda_dev *d = (cuda_dev *)dv;
    int rc = check_range(d, "copy_from_host", dst, off, n, src, done);
    if (rc < 0 || (rc = lock_stream(d, S_H2D, "copy_from_host")) < 0)
        return rc;
    for (size_t pos = 0; pos < n;) {
        size_t len = n - pos < STAGE_BYTES ? n - pos : STAGE_BYTES;
        stage *s = NULL;
        if ((rc = take_stage(d, &s)) < 0)
            goto out;
        memcpy(s->host, (const char *)src + pos, len);
        cudaError_t e = cudaMemcpyAsync((char *)dst->data + off + pos, s->host, len,
                                        cudaMemcpyHostToDevice, d->streams[S_H2D]);
        if (e == cudaSuccess)
            e = cudaEventRecord(s->ev, d->streams[S_H2D]);
        if (e != cudaSuccess) {
            rc = wf__cuda_check(e, "cudaMemcpyAsync (host to device)", d->base.info.name);
            goto out;
        }
        s->used = true;
        pos += len;
    }
    if (done)
        rc = record_locked(d, done);
out:
    pthread_mutex_unlock(&d->run_mu);
    return rc;
}

static int cuda_copy_to_host(wf_device *dv, const wf_buffer *src, size_t off, void *dst, size_t n,
                             wf_event *done)
{
    cuda_dev *d = (cuda_dev *)dv;
    int rc = check_range(d, "copy_to_host", src, off, n, dst, done);
    if (rc < 0 || (rc = lock_stream(d, S_D2H, "copy_to_host")) < 0)
        return rc;
    for (size_t pos = 0; pos < n;) {
        size_t len = n - pos < STAGE_BYTES ? n - pos : STAGE_BYTES;
        stage *s = NULL;
        if ((rc = take_stage(d, &s)) < 0)
            goto out;
        callback *c = calloc(1, sizeof *c);
        if (!c) {
            rc = wf__err(WF_ENOMEM, "%s: no memory for a copy record", d->base.info.name);
            goto out;
        }
        *c = (callback){ .d = d, .dst = (char *)dst + pos, .src = s->host, .n = len };
        cudaError_t e = cudaMemcpyAsync(s->host, (const char *)src->data + off + pos, len,
                                        cudaMemcpyDeviceToHost, d->streams[S_D2H]);
        if (e != cudaSuccess) {
            free(c);
            rc = wf__cuda_check(e, "cudaMemcpyAsync (device to host)", d->base.info.name);
            goto out;
        }
        if ((rc = enqueue_callback(d, c, "cudaLaunchHostFunc (staging copy)")) < 0)
            goto out;
        /* The staging buffer is free again once the host function has copied it out. */
        if ((rc = wf__cuda_check(cudaEventRecord(s->ev, d->streams[S_D2H]), "cudaEventRecord",
                                 d->base.info.name)) < 0)
            goto out;
        s->used = true;
        pos += len;
    }
    if (done)
        rc = record_locked(d, done);
out:
    pthread_mutex_unlock(&d->run_mu);
    return rc;
}

static int cuda_run(wf_device *dv, wf_task_fn fn, void *arg, const char *name, wf_event *done)
{
    cuda_dev *d = (cuda_dev *)dv;
    if (!fn)
        return wf__err(WF_EINVAL, "%s run: kernel '%s' has no function", d->base.info.name,
                       name ? name : "?");
    if (done && done->dev != dv)
        return wf__err(WF_EINVAL, "%s run: 'done' belongs to another device", d->base.info.name);
    pthread_mutex_lock(&d->run_mu);
    int rc = set_device(d);
    if (rc >= 0)
        rc = use_stream(d, S_COMPUTE, name ? name : "run");
    if (rc >= 0) {
        rc = fn(arg);
        /* A kernel that failed to enqueue still gets its record, as on the CPU: the error is
         * the caller's, and a waiter must not hang. */
        if (done) {
            int r2 = record_locked(d, done);
            if (rc >= 0 && r2 < 0)
                rc = r2;
        }
    }
    pthread_mutex_unlock(&d->run_mu);
    return rc;
}

/* ---- events ---------------------------------------------------------------------------- */

/* A CUDA event of 'd' from its pool (or a new one). */
static int raw_event_take(cuda_dev *d, cudaEvent_t *out)
{
    pthread_mutex_lock(&d->ev_mu);
    bool pooled = d->n_ev_free > 0;
    if (pooled)
        *out = d->ev_free[--d->n_ev_free];
    pthread_mutex_unlock(&d->ev_mu);
    if (pooled)
        return 0;
    int rc = set_device(d);
    if (rc >= 0)
        rc = wf__cuda_check(cudaEventCreateWithFlags(out, cudaEventDisableTiming),
                            "cudaEventCreate", d->base.info.name);
    return rc;
}

/* Gives a CUDA event back to the pool of 'd'. A stream that waits on it is not affected:
 * cudaStreamWaitEvent waits for the record made before the wait was enqueued. */
static void raw_event_give(cuda_dev *d, cudaEvent_t ev)
{
    pthread_mutex_lock(&d->ev_mu);
    if (d->n_ev_free == d->cap_ev_free) {
        int cap = d->cap_ev_free ? 2 * d->cap_ev_free : 16;
        cudaEvent_t *a = realloc(d->ev_free, (size_t)cap * sizeof *a);
        if (a) {
            d->ev_free = a;
            d->cap_ev_free = cap;
        }
    }
    if (d->n_ev_free < d->cap_ev_free) {
        d->ev_free[d->n_ev_free++] = ev;
    } else {
        (void)cudaEventDestroy(ev);
    }
    pthread_mutex_unlock(&d->ev_mu);
}

static int cuda_event_create(wf_device *dv, wf_event **out)
{
    if (!dv || !out)
        return wf__err(WF_EINVAL, "cuda event_create: %s is NULL", dv ? "out" : "device");
    *out = NULL;
    cuda_dev *d = (cuda_dev *)dv;
    cuda_event *ce = calloc(1, sizeof *ce);
    if (!ce)
        return wf__err(WF_ENOMEM, "%s: no memory for an event", d->base.info.name);
    int rc = raw_event_take(d, &ce->ev);
    if (rc < 0) {
        free(ce);
        return rc;
    }
    /* As wf__event_create() (event.c), in a block that also holds the CUDA event. */
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&ce->base.cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&ce->base.mu, NULL);
    ce->base.dev = dv;
    *out = &ce->base;
    return 0;
}

static void cuda_event_destroy(wf_device *dv, wf_event *e)
{
    if (!e)
        return;
    cuda_dev *d = (cuda_dev *)dv;
    cuda_event *ce = (cuda_event *)e;
    /* A record's host function still holds 'e' until it has run. After a device error it
     * may never run: then the event is leaked rather than freed under it. */
    if (wait_record(e, 0) < 0 && !wf__event_query(e))
        return;
    raw_event_give(d, ce->ev);
    wf__event_destroy(e); /* frees 'ce': 'base' is its first member */
}

static int cuda_event_query(wf_device *d, wf_event *e)
{
    if (!e)
        return wf__err(WF_EINVAL, "cuda event_query: event is NULL");
    return wf__event_query(e);
}

/* Waits for the latest record of CUDA event 'e' (0: no deadline). Its ticket completes in a
 * host function; after a sticky device error (a faulting kernel) host functions may never
 * run, so the wait looks at the CUDA event every 50 ms and returns the device's error
 * instead of hanging. */
static int wait_record(wf_event *e, uint64_t timeout_ns)
{
    const uint64_t slice = 50000000u;
    uint64_t waited = 0;
    for (;;) {
        uint64_t t = timeout_ns && timeout_ns - waited < slice ? timeout_ns - waited : slice;
        int rc = wf__event_sync(e, t);
        if (rc != WF_ETIMEDOUT)
            return rc;
        waited += t;
        cudaError_t ce = cudaEventQuery(((cuda_event *)e)->ev);
        if (ce != cudaSuccess && ce != cudaErrorNotReady)
            return wf__cuda_check(ce, "waiting for an event", e->dev->info.name);
        if (timeout_ns && waited >= timeout_ns)
            return wf__err(WF_ETIMEDOUT, "%s: event not complete after %.3f s", e->dev->info.name,
                           (double)timeout_ns / 1e9);
    }
}

/* Waits until no host function of 'd' is pending; when the device has failed, for 1 s at
 * most. Returns true when none is pending. */
static bool drain_callbacks(cuda_dev *d, bool failed)
{
    for (int k = 0; atomic_load_explicit(&d->callbacks, memory_order_acquire) > 0; k++) {
        if (failed && k > 50000) /* 1 s: a failed context may never run them */
            return false;
        nanosleep(&(struct timespec){ 0, 20000 }, NULL);
    }
    return true;
}

static int cuda_event_sync(wf_device *d, wf_event *e, uint64_t timeout_ns)
{
    if (!e)
        return wf__err(WF_EINVAL, "cuda event_sync: event is NULL");
    return wait_record(e, timeout_ns);
}

static int cuda_record(wf_device *dv, wf_event *e)
{
    cuda_dev *d = (cuda_dev *)dv;
    if (!e || e->dev != dv)
        return wf__err(WF_EINVAL, "%s record_event: %s", d->base.info.name,
                       e ? "the event belongs to another device" : "event is NULL");
    pthread_mutex_lock(&d->run_mu);
    int rc = set_device(d);
    if (rc >= 0)
        rc = record_locked(d, e);
    pthread_mutex_unlock(&d->run_mu);
    return rc;
}

static int cuda_wait_event(wf_device *dv, wf_event *e)
{
    cuda_dev *d = (cuda_dev *)dv;
    if (!e)
        return wf__err(WF_EINVAL, "%s wait_event: event is NULL", d->base.info.name);
    if (wf__event_query(e) == 1)
        return 0; /* complete (or never recorded): nothing to order */
    if (e->dev && e->dev->ops == &cuda_ops) {
        /* Any CUDA device's event: the GPU orders it, no thread waits. The CUDA event holds
         * the latest record, which is the one the interface means. */
        pthread_mutex_lock(&d->run_mu);
        int rc = set_device(d);
        if (rc >= 0)
            rc = wf__cuda_check(cudaStreamWaitEvent(d->streams[d->last], ((cuda_event *)e)->ev, 0),
                                "cudaStreamWaitEvent", d->base.info.name);
        pthread_mutex_unlock(&d->run_mu);
        return rc;
    }
    /* Another kind of device (the CPU's events are complete when recorded): wait here. */
    return wf__event_sync(e, 0);
}

static void CUDART_CB notice_cb(cudaStream_t stream, cudaError_t status, void *arg)
{
    notice *m = arg;
    cuda_dev *d = m->d;
    m->status = status;
    /* Send before the count drops: close() destroys the actor once it reaches 0, and
     * wf_actor_destroy() lets the actor handle what its mailbox holds first. */
    int sent = wf_actor_send(d->actor, &m->msg); /* fails only for NULL arguments */
    (void)sent;
    atomic_fetch_sub_explicit(&d->callbacks, 1, memory_order_acq_rel);
}

static int cuda_notify(wf_device *dv, void (*fn)(void *arg, int status), void *arg)
{
    cuda_dev *d = (cuda_dev *)dv;
    if (!fn)
        return wf__err(WF_EINVAL, "%s notify: fn is NULL", d->base.info.name);
    notice *m = calloc(1, sizeof *m);
    if (!m)
        return wf__err(WF_ENOMEM, "%s: no memory for a completion notice", d->base.info.name);
    *m = (notice){ .d = d, .fn = fn, .arg = arg };
    pthread_mutex_lock(&d->run_mu);
    int rc = set_device(d);
    if (rc >= 0) {
        /* The current stream: every earlier stream's work is ordered before it (use_stream). */
        atomic_fetch_add_explicit(&d->callbacks, 1, memory_order_acq_rel);
        rc = wf__cuda_check(cudaStreamAddCallback(d->streams[d->last], notice_cb, m, 0),
                            "cudaStreamAddCallback", d->base.info.name);
        if (rc < 0)
            atomic_fetch_sub_explicit(&d->callbacks, 1, memory_order_acq_rel);
    }
    pthread_mutex_unlock(&d->run_mu);
    if (rc < 0)
        free(m);
    return rc;
}

/* Lets 'd' (current, under its run lock) read the memory of 'f' directly when the hardware
 * allows it; tried once per pair. Copies work either way (see the file's header). */
static void enable_peer(cuda_dev *d, const cuda_dev *f)
{
    if (f->ordinal >= 64 || ((d->peer_tried >> f->ordinal) & 1))
        return;
    d->peer_tried |= (uint64_t)1 << f->ordinal;
    int can = 0;
    if (cudaDeviceCanAccessPeer(&can, d->ordinal, f->ordinal) == cudaSuccess && can) {
        /* cudaErrorPeerAccessAlreadyEnabled: another open device of this GPU enabled it. */
        cudaError_t e = cudaDeviceEnablePeerAccess(f->ordinal, 0);
        (void)e;
    }
    (void)cudaGetLastError(); /* neither failure is sticky, and neither stops the copy */
}

static int cuda_copy_peer(wf_device *dv, wf_buffer *dst, size_t dst_off, wf_device *fromv,
                          const wf_buffer *src, size_t src_off, size_t n)
{
    cuda_dev *d = (cuda_dev *)dv;
    if (!fromv || fromv->ops != &cuda_ops)
        return wf__err(WF_EINVAL, "%s copy_peer: the source is %s, not a CUDA device",
                       d->base.info.name, fromv ? fromv->info.name : "NULL");
    cuda_dev *f = (cuda_dev *)fromv;
    if (!dst || !src)
        return wf__err(WF_EINVAL, "%s copy_peer: %s buffer is NULL", d->base.info.name,
                       dst ? "the source" : "the destination");
    int rc = check_range(d, "copy_peer (destination)", dst, dst_off, n, dst->data, NULL);
    if (rc >= 0)
        rc = check_range(f, "copy_peer (source)", src, src_off, n, src->data, NULL);
    if (rc < 0 || n == 0)
        return rc;
    void *to = (char *)dst->data + dst_off;
    const void *from = (const char *)src->data + src_off;
    if (f == d) { /* one device: an ordinary copy in its order */
        pthread_mutex_lock(&d->run_mu);
        rc = set_device(d);
        if (rc >= 0)
            rc = wf__cuda_check(
                cudaMemcpyAsync(to, from, n, cudaMemcpyDeviceToDevice, d->streams[d->last]),
                "cudaMemcpyAsync (device to device)", d->base.info.name);
        pthread_mutex_unlock(&d->run_mu);
        return rc;
    }
    cudaEvent_t produced, copied;
    if ((rc = raw_event_take(f, &produced)) < 0)
        return rc;
    if ((rc = raw_event_take(d, &copied)) < 0) {
        raw_event_give(f, produced);
        return rc;
    }
    /* 1. On the source: an event after the work given to it so far (the value's producer). */
    pthread_mutex_lock(&f->run_mu);
    rc = set_device(f);
    if (rc >= 0)
        rc = wf__cuda_check(cudaEventRecord(produced, f->streams[f->last]),
                            "cudaEventRecord (peer copy source)", f->base.info.name);
    pthread_mutex_unlock(&f->run_mu);
    /* 2. On the destination, in its order: wait for it, copy, record 'copied'. */
    if (rc >= 0) {
        pthread_mutex_lock(&d->run_mu);
        rc = set_device(d);
        if (rc >= 0) {
            enable_peer(d, f);
            cudaStream_t st = d->streams[d->last];
            cudaError_t e = cudaStreamWaitEvent(st, produced, 0);
            if (e == cudaSuccess)
                e = cudaMemcpyPeerAsync(to, d->ordinal, from, f->ordinal, n, st);
            if (e == cudaSuccess)
                e = cudaEventRecord(copied, st);
            rc = wf__cuda_check(e, "cudaMemcpyPeerAsync", d->base.info.name);
        }
        pthread_mutex_unlock(&d->run_mu);
    }
    /* 3. On the source: later work (a reuse of 'src''s block) waits for the copy. */
    if (rc >= 0) {
        pthread_mutex_lock(&f->run_mu);
        rc = set_device(f);
        if (rc >= 0)
            rc = wf__cuda_check(cudaStreamWaitEvent(f->streams[f->last], copied, 0),
                                "cudaStreamWaitEvent (peer copy source)", f->base.info.name);
        pthread_mutex_unlock(&f->run_mu);
    }
    raw_event_give(f, produced);
    raw_event_give(d, copied);
    return rc;
}

static int cuda_sync(wf_device *dv)
{
    cuda_dev *d = (cuda_dev *)dv;
    pthread_mutex_lock(&d->run_mu);
    int rc = set_device(d);
    for (int i = 0; rc >= 0 && i < N_STREAMS; i++)
        rc = wf__cuda_check(cudaStreamSynchronize(d->streams[i]), "cudaStreamSynchronize",
                            d->base.info.name);
    pthread_mutex_unlock(&d->run_mu);
    /* The host functions of the work just finished may still be running. */
    (void)drain_callbacks(d, rc < 0);
    if (rc >= 0)
        wf__cuda_pool_process(d->pool);
    return rc;
}

static int cuda_memory_stats(const wf_device *dv, wf_pool_stats *out)
{
    if (!dv || !out)
        return wf__err(WF_EINVAL, "cuda memory_stats: %s is NULL", dv ? "out" : "device");
    const cuda_dev *d = (const cuda_dev *)dv;
    wf__cuda_pool_stats(d->pool, out);
    out->numa = d->base.info.numa;
    return 0;
}

/* The actor: notices from stream callbacks, and pokes from host functions that ask it to
 * look at the pool's pending frees. */
static int actor_fn(wf_actor *a, wf_msg *msg, void *ctx)
{
    cuda_dev *d = ctx;
    if (msg) { /* a notify() request whose work has completed (or failed) */
        notice *m = (notice *)msg;
        int st = 0;
        if (m->status != cudaSuccess)
            st =
                wf__cuda_check(m->status, "the work before a completion notice", d->base.info.name);
        m->fn(m->arg, st);
        free(m);
    }
    if (d->pool)
        wf__cuda_pool_process(d->pool);
    return 0;
}

static void cuda_close(wf_device *dv)
{
    cuda_dev *d = (cuda_dev *)dv;
    (void)cudaSetDevice(d->ordinal);
    bool failed = false;
    for (int i = 0; i < N_STREAMS; i++)
        if (d->streams[i])
            failed |= cudaStreamSynchronize(d->streams[i]) != cudaSuccess;
    if (!drain_callbacks(d, failed)) {
        /* A failed context that will never run its host functions: they point at 'd', so
         * it is leaked (with its handles) rather than freed under them. */
        (void)cudaGetLastError();
        return;
    }
    (void)cudaGetLastError();
    if (d->actor)
        wf_actor_destroy(d->actor); /* after the last host function: none pokes it now */
    if (d->q.cudnn)
        (void)cudnnDestroy(d->q.cudnn);
    if (d->q.cublaslt)
        (void)cublasLtDestroy(d->q.cublaslt);
    if (d->q.cublas)
        (void)cublasDestroy(d->q.cublas);
    if (d->q.workspace)
        (void)cudaFree(d->q.workspace);
    for (int i = 0; i < N_STAGE; i++) {
        if (d->stages[i].host)
            (void)cudaFreeHost(d->stages[i].host);
        if (d->stages[i].ev_ok)
            (void)cudaEventDestroy(d->stages[i].ev);
    }
    for (int i = 0; i < d->n_ev_free; i++)
        (void)cudaEventDestroy(d->ev_free[i]);
    free(d->ev_free);
    for (int i = 0; i < N_STREAMS; i++) {
        if (d->switch_ev[i])
            (void)cudaEventDestroy(d->switch_ev[i]);
        if (d->streams[i])
            (void)cudaStreamDestroy(d->streams[i]);
    }
    if (d->pool)
        wf__cuda_pool_close(d->pool); /* live blocks keep it until released */
    (void)cudaGetLastError();
    pthread_mutex_destroy(&d->run_mu);
    pthread_mutex_destroy(&d->ev_mu);
    free(d);
}

static const wf_device_ops cuda_ops = {
    .alloc = cuda_alloc,
    .free = cuda_free,
    .copy_to_host = cuda_copy_to_host,
    .copy_from_host = cuda_copy_from_host,
    .run = cuda_run,
    .event_create = cuda_event_create,
    .event_destroy = cuda_event_destroy,
    .event_query = cuda_event_query,
    .event_sync = cuda_event_sync,
    .record_event = cuda_record,
    .wait_event = cuda_wait_event,
    .notify = cuda_notify,
    .copy_peer = cuda_copy_peer,
    .sync = cuda_sync,
    .memory_stats = cuda_memory_stats,
    .close = cuda_close,
};

int wf__cuda_open(wf_runtime *rt, int ordinal, int id, const wf_device_opts *o, wf_device **out)
{
    *out = NULL;
    cuda_dev *d = calloc(1, sizeof *d);
    if (!d)
        return wf__err(WF_ENOMEM, "wf_device_open: no memory for cuda:%d", ordinal);
    pthread_mutex_init(&d->run_mu, NULL);
    pthread_mutex_init(&d->ev_mu, NULL);
    d->base.ops = &cuda_ops;
    d->base.rt = rt;
    d->base.id = id;
    d->ordinal = ordinal;
    d->q.dev = d;
    d->q.ordinal = ordinal;
    char nm[32];
    snprintf(nm, sizeof nm, "cuda:%d", ordinal);
    int rc = wf__cuda_info(rt, ordinal, &d->base.info);
    if (rc < 0) {
        snprintf(d->base.info.name, sizeof d->base.info.name, "%s", nm);
        goto fail;
    }
    if ((rc = wf__cuda_check(cudaSetDevice(ordinal), "cudaSetDevice", nm)) < 0)
        goto fail;
    struct cudaDeviceProp prop;
    if ((rc = wf__cuda_check(cudaGetDeviceProperties(&prop, ordinal), "cudaGetDeviceProperties",
                             nm)) < 0)
        goto fail;
    d->q.sm_major = prop.major;
    d->q.sm_minor = prop.minor;
    d->q.multiprocessors = prop.multiProcessorCount;
    for (int i = 0; i < N_STREAMS; i++) {
        if ((rc = wf__cuda_check(cudaStreamCreateWithFlags(&d->streams[i], cudaStreamNonBlocking),
                                 "cudaStreamCreate", nm)) < 0)
            goto fail;
        if ((rc = wf__cuda_check(cudaEventCreateWithFlags(&d->switch_ev[i], cudaEventDisableTiming),
                                 "cudaEventCreate", nm)) < 0)
            goto fail;
    }
    d->last = S_COMPUTE;
    d->q.stream = d->streams[S_COMPUTE];
    if ((rc = wf__cuda_pool_create(nm, ordinal, o ? o->limit_bytes : 0, o ? o->fail_after : 0,
                                   &d->pool)) < 0)
        goto fail;
    if ((rc = wf__cuda_check(cudaMalloc(&d->q.workspace, WF__CUDA_WORKSPACE),
                             "cudaMalloc (cuBLAS workspace)", nm)) < 0) {
        d->q.workspace = NULL;
        goto fail;
    }
    d->q.workspace_bytes = WF__CUDA_WORKSPACE;
    if ((rc = wf__cublas_check(cublasCreate(&d->q.cublas), "cublasCreate", nm)) < 0 ||
        (rc = wf__cublas_check(cublasSetStream(d->q.cublas, d->q.stream), "cublasSetStream", nm)) <
            0 ||
        (rc =
             wf__cublas_check(cublasSetWorkspace(d->q.cublas, d->q.workspace, d->q.workspace_bytes),
                              "cublasSetWorkspace", nm)) < 0 ||
        (rc = wf__cublas_check(cublasLtCreate(&d->q.cublaslt), "cublasLtCreate", nm)) < 0 ||
        (rc = wf__cudnn_check(cudnnCreate(&d->q.cudnn), "cudnnCreate", nm)) < 0 ||
        (rc = wf__cudnn_check(cudnnSetStream(d->q.cudnn, d->q.stream), "cudnnSetStream", nm)) < 0)
        goto fail;
    char aname[32];
    snprintf(aname, sizeof aname, "weft-cuda%d", ordinal);
    int numa = d->base.info.numa;
    wf_actor_opts ao = {
        .handler = actor_fn,
        .ctx = d,
        .name = aname,
        .bind = numa >= 0 && wf_runtime_numa_count(rt) > 1 ? WF_BIND_NUMA : WF_BIND_ANY,
        .bind_index = numa >= 0 ? numa : 0,
    };
    if ((rc = wf_actor_create(rt, &ao, &d->actor)) < 0)
        goto fail;
    *out = &d->base;
    return 0;
fail:
    cuda_close(&d->base);
    return rc;
}

/* ---- what kernels call (devices/cuda.h) ------------------------------------------------ */

int wf__cuda_scratch(const wf_kernel_ctx *ctx, size_t bytes, void **out)
{
    const wf__cuda_queue *q = wf__cuda_queue_of(ctx);
    if (!out)
        return wf__err(WF_EINVAL, "wf__cuda_scratch: out is NULL");
    *out = NULL;
    if (!q || !q->dev)
        return wf__err(WF_EINVAL, "wf__cuda_scratch: the kernel ctx is not a CUDA device's");
    return wf__cuda_pool_alloc(q->dev->pool, bytes, q->stream, out);
}

void wf__cuda_scratch_free(const wf_kernel_ctx *ctx, void *p)
{
    const wf__cuda_queue *q = wf__cuda_queue_of(ctx);
    if (p && q && q->dev)
        wf__cuda_pool_free(q->dev->pool, p);
}

int wf__cuda_tensor_alloc(const wf_kernel_ctx *ctx, wf_dtype dt, wf_shape shape, wf_tensor **out)
{
    const wf__cuda_queue *q = wf__cuda_queue_of(ctx);
    if (!out)
        return wf__err(WF_EINVAL, "wf__cuda_tensor_alloc: out is NULL");
    *out = NULL;
    if (!q || !q->dev)
        return wf__err(WF_EINVAL, "wf__cuda_tensor_alloc: the kernel ctx is not a CUDA device's");
    size_t bytes;
    int rc = wf__tensor_check("wf__cuda_tensor_alloc", dt, shape, &bytes);
    if (rc < 0)
        return rc;
    void *p;
    if ((rc = wf__cuda_pool_alloc(q->dev->pool, bytes, q->stream, &p)) < 0)
        return rc;
    wf_tensor *t = wf__tensor_adopt(dt, shape, p, bytes, buffer_free, q->dev->pool);
    if (!t) {
        wf__cuda_pool_free(q->dev->pool, p);
        return WF_ENOMEM;
    }
    *out = t;
    return 0;
}

void *wf__cuda_device_queue(wf_device *d)
{
    return d && d->ops == &cuda_ops ? &((cuda_dev *)d)->q : NULL;
}

#endif /* WF_HAVE_CUDA */
