/* devices/device.h: the device interface, for the modules above devices/ (ops/ kernels,
 * runtime/'s executor, transport/) (a module interface: not installed, not internal.h).
 * Owns: the layout of an open device (a vtable plus its description) and of events, and
 * the calls every device implements (docs/architecture.md, "Devices"): allocate, free, copy in and
 * out of host memory and from another device, run a kernel node, record or wait for an
 * event, and call back (on a worker) once the work given so far has completed; and the
 * simulated device (sim.c) that tests placed graphs without a GPU.
 * Invariants:
 * - Work given to one device (copies, kernels) completes in the order given; an event
 *   recorded on a device completes when everything given to that device before the record
 *   has completed (CUDA stream semantics; the CPU device completes everything inside the
 *   call, so its events are complete as soon as they are recorded).
 * - Device memory is a refcounted wf_buffer (core/tensor.h) whose free hook returns it to
 *   the device's pool, so a tensor can own device memory and release it from any thread.
 * Not here: the CPU implementation (devices/cpu.c), the public enumeration API
 * (weft/devices.h), which kernel runs where (placement/). */
#ifndef WF_DEVICES_DEVICE_H
#define WF_DEVICES_DEVICE_H

#include "../core/tensor.h"

#include <weft/devices.h>
#include <weft/memory.h>
#include <weft/sched.h>

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct wf_event wf_event;

typedef struct wf_device_ops {
    /* Allocates 'bytes' of device memory as a new buffer with one reference. The CPU device
     * takes it from the pool of the calling worker's NUMA node.
     * Returns 0, or WF_ENOMEM (limit, system, or fail_after hook) with wf_last_errmsg(). */
    int (*alloc)(wf_device *d, size_t bytes, wf_buffer **out);
    /* Drops the caller's reference to 'b' (from this device's alloc); the last reference
     * returns the memory to its pool. NULL is a no-op. */
    void (*free)(wf_device *d, wf_buffer *b);
    /* Copies 'n' bytes from 'src' at byte 'src_off' to host memory 'dst'. Queued in order
     * with the device's other work; 'done' (may be NULL) is recorded after it.
     * Returns 0, or WF_EINVAL (NULL argument, a range outside the buffer). */
    int (*copy_to_host)(wf_device *d, const wf_buffer *src, size_t src_off, void *dst, size_t n,
                        wf_event *done);
    /* Copies 'n' bytes from host memory 'src' to 'dst' at byte 'dst_off'; as above. */
    int (*copy_from_host)(wf_device *d, wf_buffer *dst, size_t dst_off, const void *src, size_t n,
                          wf_event *done);
    /* Runs a kernel node: 'fn(arg)' in order with the device's other work ('name' names it
     * in errors and traces); 'done' (may be NULL) is recorded after it. The CPU device runs
     * it on the calling thread (big kernels split themselves with wf_parallel_for()) and
     * returns its result; a device with its own queue returns once it is queued.
     * Returns fn's result (CPU), 0 (queued), or a negative wf_status. */
    int (*run)(wf_device *d, wf_task_fn fn, void *arg, const char *name, wf_event *done);
    /* Creates an event of this device, complete until first recorded.
     * Returns 0 or WF_ENOMEM. Ownership: the caller owns '*out' (wf__event_destroy()). */
    int (*event_create)(wf_device *d, wf_event **out);
    /* Frees an event of this device; nothing may wait on it. NULL is a no-op. */
    void (*event_destroy)(wf_device *d, wf_event *e);
    /* Returns 1 if the latest record of 'e' has completed (or there was none), 0 if not,
     * or WF_EINVAL. */
    int (*event_query)(wf_device *d, wf_event *e);
    /* Blocks the calling thread until the latest record of 'e' has completed or
     * 'timeout_ns' pass (0: no deadline). Returns 0, WF_EINVAL or WF_ETIMEDOUT. */
    int (*event_sync)(wf_device *d, wf_event *e, uint64_t timeout_ns);
    /* Makes 'e' stand for everything given to 'd' so far: it completes when that has.
     * 'e' must belong to 'd'. Returns 0 or WF_EINVAL. */
    int (*record_event)(wf_device *d, wf_event *e);
    /* Makes work given to 'd' after this call wait until 'e' (of any device) completes.
     * Returns 0, WF_EINVAL, or WF_ETIMEDOUT. */
    int (*wait_event)(wf_device *d, wf_event *e);
    /* Calls 'fn(arg, status)' once everything given to 'd' before this call has completed:
     * 'status' is 0, or the device's failure (a faulting kernel) as a negative wf_status with
     * wf_last_errmsg() set on the calling thread. 'fn' runs exactly once, on a worker: from
     * the device's actor (never on a driver thread), or inside this call when the device
     * completes its work within the calls that give it (the CPU); it must not block.
     * How a node that waits for a device finishes without a worker waiting (runtime/
     * exec_device.c). Returns 0 ('fn' will run) or a negative status ('fn' will not run). */
    int (*notify)(wf_device *d, void (*fn)(void *arg, int status), void *arg);
    /* Copies 'n' bytes of 'src' (a buffer of device 'from', at byte 'src_off') to 'dst' (a
     * buffer of 'd') at byte 'dst_off': after the work given to 'from' so far, and in order
     * with the work of 'd'. Work given to 'from' after this call waits for the copy, so
     * 'src' may be released (in 'from''s order) once the call returns. Neither device's
     * thread waits. Returns 0, WF_EINVAL (a range outside a buffer, 'from' of another kind)
     * or a device error. */
    int (*copy_peer)(wf_device *d, wf_buffer *dst, size_t dst_off, wf_device *from,
                     const wf_buffer *src, size_t src_off, size_t n);
    /* Waits until all work given to 'd' has completed. Returns 0 or a negative status. */
    int (*sync)(wf_device *d);
    /* Sums the statistics of the device's pools. Returns 0 or WF_EINVAL. */
    int (*memory_stats)(const wf_device *d, wf_pool_stats *out);
    /* Waits for the device's work and frees it (wf_device_close()). */
    void (*close)(wf_device *d);
} wf_device_ops;

struct wf_device {
    const wf_device_ops *ops;
    wf_runtime *rt;
    int id; /* among all devices of 'rt' (weft/devices.h) */
    wf_device_info info;
};

/* An event: a ticket counter. Each record takes a new ticket; the device completes tickets
 * in order; waiting means waiting for the ticket of the latest record. */
struct wf_event {
    wf_device *dev;
    pthread_mutex_t mu;
    pthread_cond_t cv;  /* signalled when 'completed' grows */
    uint64_t recorded;  /* tickets handed out */
    uint64_t completed; /* every ticket up to this one has completed */
};

/* devices/event.c: what every device's events share. */

/* Creates an event of 'd' (complete: no record yet). Returns 0 or WF_ENOMEM. */
int wf__event_create(wf_device *d, wf_event **out);

/* Frees an event; nothing may wait on it. NULL is a no-op. */
void wf__event_destroy(wf_event *e);

/* Takes the next ticket of 'e' (a record): returns it, for the device to complete later. */
uint64_t wf__event_record(wf_event *e);

/* Marks every ticket up to 'ticket' complete and wakes the waiters. Threads: any (a device
 * callback, an actor). */
void wf__event_complete(wf_event *e, uint64_t ticket);

/* Returns 1 if the latest record of 'e' has completed (or there was none), else 0. */
int wf__event_query(wf_event *e);

/* Blocks the calling thread until the latest record of 'e' (at the time of the call) has
 * completed, or 'timeout_ns' pass (0: no deadline).
 * Returns 0, WF_EINVAL (NULL) or WF_ETIMEDOUT with a message naming the device. */
int wf__event_sync(wf_event *e, uint64_t timeout_ns);

/* devices/sim.c: a simulated accelerator, for testing the executor's placement, copies and
 * completions on machines without a GPU (runtime/'s internal tests). */

/* How a simulated device behaves (all zero: no delay, no failure). */
typedef struct wf__sim_opts {
    uint32_t delay_us;         /* each completion waits this long in the device's actor */
    int64_t fail_alloc_after;  /* > 0: that allocation (counted from 1) is WF_ENOMEM */
    int64_t fail_notice_after; /* > 0: that completion (record, notice or copy to the host,
                                  counted from 1) fails as a device fault (WF_EDEVICE) */
} wf__sim_opts;

/* Opens simulated device "sim:<index>" as device 'id': its memory is host memory of its
 * own (so every crossing is a real copy), its kernels are the CPU kernels (wf_device_info
 * kind WF_DEVICE_CPU), run in the calling thread when given; but what a GPU finishes
 * later finishes later here too: a copy to the host lands in its destination, events
 * complete and notify() calls run only when the device's actor gets to them, in order,
 * each after 'delay_us' microseconds, so a reader released before a copy completed sees
 * stale bytes. A simulated fault, as a CUDA fault, fails that completion's notice and
 * every later one. 'o' may be NULL. Returns 0, WF_ENOMEM or WF_EINVAL with
 * wf_last_errmsg() set. Ownership: the caller owns '*out' (wf_device_close()). */
int wf__sim_open(wf_runtime *rt, int id, int index, const wf__sim_opts *o, wf_device **out);

/* Whether 'd' is a simulated device. */
bool wf__sim_is(const wf_device *d);

/* devices/copy.c: the kernels of core's copy op (core/op.h). */

typedef struct wf__kernels wf__kernels; /* core/op.h's kernel registry */

/* The devices copies move values between, by placement's ids (0: the host, NULL): a
 * session's (runtime/var_device.c opens them). Entries are set before any copy that names
 * them runs, and stay until every copy has. */
typedef struct wf__device_table {
    wf_device **devs; /* 'n' entries, or NULL before the first device is opened */
    int n;
} wf__device_table;

/* Registers the copy op's kernels in 'r' for the device kinds weft is built with (the CPU
 * kind: the CPU and simulated devices; CUDA), copying between the devices of 't', which
 * must outlive 'r''s use: host to device and device to device complete in the devices'
 * order, device to host pends until the device says the bytes have landed. Returns 0,
 * WF_EINVAL (NULL argument) or WF_ENOMEM. */
int wf__devices_register_kernels(wf__kernels *r, const wf__device_table *t);

#endif /* WF_DEVICES_DEVICE_H */
