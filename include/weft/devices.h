/* weft/devices.h: the devices a runtime can run kernels on.
 * Owns: the public contract of devices/: enumerating devices (the CPU, then the CUDA GPUs
 * when weft is built with CUDA and the machine has a driver and a GPU), their descriptions,
 * and opening one to get its memory pools.
 * No GPU is a normal case: the CUDA count is then 0 (not an error), whether weft was built
 * without CUDA or the machine has no driver or no device.
 * Not here: the device interface that kernels and the executor use (devices/device.h,
 * internal to weft), host pools (weft/memory.h). */
#ifndef WEFT_DEVICES_H
#define WEFT_DEVICES_H

#include <weft/base.h>
#include <weft/memory.h>
#include <weft/sched.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum wf_device_kind {
    WF_DEVICE_CPU = 0,  /* the host: kernels run on the runtime's workers */
    WF_DEVICE_CUDA = 1, /* an NVIDIA GPU */
} wf_device_kind;

typedef struct wf_device_info {
    wf_device_kind kind;
    int index;             /* among the devices of its kind: "cpu:0", "cuda:1" */
    char name[64];         /* "cpu:0", or "cuda:N (<the GPU's product name>)" */
    uint64_t memory_bytes; /* the host's physical memory, or the GPU's global memory */
    int numa;              /* the NUMA node the device is nearest to; -1 for a CPU device
                              that spans several nodes (its pools are per node) */
    int compute_units;     /* CPU: the runtime's workers; CUDA: multiprocessors */
} wf_device_info;

/* Returns the number of devices of 'rt' (at least 1: the CPU is device 0), or WF_EINVAL
 * for a NULL runtime. Devices are numbered 0 .. count-1, the CPU first.
 * Threads: any. */
WF_API int wf_device_count(wf_runtime *rt);

/* Returns the number of devices of one kind: 1 for WF_DEVICE_CPU; for WF_DEVICE_CUDA the
 * GPUs the CUDA driver shows (device ids 1 .. n, in the driver's order: id 1 + k is
 * "cuda:k"), 0 when weft is built without CUDA or there is no driver or GPU. WF_EINVAL for a
 * NULL runtime or an unknown kind. Threads: any. */
WF_API int wf_device_count_kind(wf_runtime *rt, wf_device_kind kind);

/* Describes device 'id' (0 .. wf_device_count()-1).
 * Returns 0, or WF_EINVAL (NULL argument) or WF_ENODEV (no such device) with the reason in
 * wf_last_errmsg(). Threads: any. */
WF_API WF_NODISCARD int wf_device_get_info(wf_runtime *rt, int id, wf_device_info *out);

typedef struct wf_device wf_device; /* opaque: an open device */

typedef struct wf_device_opts {
    size_t limit_bytes; /* 0: no limit. Else the limit of each of the device's pools (for
                           the CPU: one pool per NUMA node; see wf_pool_opts.limit_bytes; for
                           a GPU: its caching pool, cached blocks included) */
    int64_t fail_after; /* 0: never. Passed to the device's pools (tests) */
} wf_device_opts;

/* Opens device 'id' of 'rt': its memory pools (the CPU's are bound one per NUMA node), its
 * events and its kernel queue, for the executor and for kernels. A GPU gets its streams
 * (compute, host-to-device, device-to-host), cuBLAS/cuBLASLt/cuDNN handles, a caching
 * stream-ordered pool and an actor bound to its NUMA node.
 * Returns 0, WF_EINVAL (NULL argument), WF_ENODEV (no such device), WF_ENOMEM or WF_EDEVICE
 * (a CUDA call failed), with the reason in wf_last_errmsg().
 * Ownership: on success the caller owns '*out' (wf_device_close()); 'o' may be NULL and
 *   is not kept; 'rt' must outlive the device.
 * Threads: any. */
WF_API WF_NODISCARD int wf_device_open(wf_runtime *rt, int id, const wf_device_opts *o,
                                       wf_device **out);

/* Waits for the device's queued work and closes it. Memory still allocated from it stays
 * valid until released (the pools outlive the device while it is in use). NULL is a no-op.
 * Threads: no other call on 'd' at the same time. */
WF_API void wf_device_close(wf_device *d);

/* Sums the statistics of the device's memory pools into '*out' ('numa' is -1 when the
 * device has pools on several nodes). Returns 0 or WF_EINVAL. Threads: any. */
WF_API WF_NODISCARD int wf_device_memory_stats(const wf_device *d, wf_pool_stats *out);

#ifdef __cplusplus
}
#endif
#endif /* WEFT_DEVICES_H */
