/* devices/device.c: enumerating and opening devices.
 * Owns: the numbering of a runtime's devices (the CPU is device 0; CUDA GPUs would follow)
 * and the public calls of weft/devices.h, which go through each device's ops.
 * This build has no CUDA device: CUDA support is a later issue (no CUDA code here yet), so
 * the CUDA count is 0 and every id past the CPU is WF_ENODEV.
 * Not here: what each device does (cpu.c), events (event.c). */
#include "../core/error.h"
#include "internal.h"

int wf_device_count_kind(wf_runtime *rt, wf_device_kind kind)
{
    if (!rt)
        return wf__err(WF_EINVAL, "wf_device_count_kind: rt is NULL");
    switch (kind) {
    case WF_DEVICE_CPU:
        return 1;
    case WF_DEVICE_CUDA:
        return 0; /* no CUDA device in this build: it comes with a later issue */
    }
    return wf__err(WF_EINVAL, "wf_device_count_kind: %d is not a wf_device_kind", (int)kind);
}

int wf_device_count(wf_runtime *rt)
{
    if (!rt)
        return wf__err(WF_EINVAL, "wf_device_count: rt is NULL");
    return wf_device_count_kind(rt, WF_DEVICE_CPU) + wf_device_count_kind(rt, WF_DEVICE_CUDA);
}

int wf_device_get_info(wf_runtime *rt, int id, wf_device_info *out)
{
    if (!rt || !out)
        return wf__err(WF_EINVAL, "wf_device_get_info: %s is NULL", rt ? "out" : "rt");
    if (id != 0)
        return wf__err(WF_ENODEV,
                       "wf_device_get_info: no device %d (this runtime has %d: cpu:0; weft is "
                       "built without CUDA)",
                       id, wf_device_count(rt));
    wf__cpu_info(rt, out);
    return 0;
}

int wf_device_open(wf_runtime *rt, int id, const wf_device_opts *o, wf_device **out)
{
    if (!out)
        return wf__err(WF_EINVAL, "wf_device_open: out is NULL");
    *out = NULL;
    if (!rt)
        return wf__err(WF_EINVAL, "wf_device_open: rt is NULL");
    if (o && o->fail_after < 0)
        return wf__err(WF_EINVAL, "wf_device_open: fail_after is %lld, not >= 0",
                       (long long)o->fail_after);
    if (id != 0)
        return wf__err(WF_ENODEV,
                       "wf_device_open: no device %d (this runtime has %d: cpu:0; weft is "
                       "built without CUDA)",
                       id, wf_device_count(rt));
    return wf__cpu_open(rt, o, out);
}

void wf_device_close(wf_device *d)
{
    if (!d)
        return;
    (void)d->ops->sync(d);
    d->ops->close(d);
}

int wf_device_memory_stats(const wf_device *d, wf_pool_stats *out)
{
    if (!d || !out)
        return wf__err(WF_EINVAL, "wf_device_memory_stats: %s is NULL", d ? "out" : "device");
    return d->ops->memory_stats(d, out);
}
