/* devices/device.c: enumerating and opening devices.
 * Owns: the numbering of a runtime's devices (the CPU is device 0; the CUDA GPUs follow, in
 * the driver's order: device 1 + k is "cuda:k") and the public calls of weft/devices.h,
 * which go through each device's ops.
 * Discovery asks the driver each time (cudaGetDeviceCount, which the CUDA runtime answers
 * from its process-wide state after the first call): a build without CUDA, a machine
 * without a driver or without a GPU has 0 CUDA devices, which is not an error.
 * Not here: what each device does (cpu.c, cuda.c), events (event.c). */
#include "../core/error.h"
#include "internal.h"

static int cuda_count(void)
{
#ifdef WF_HAVE_CUDA
    return wf__cuda_count();
#else
    return 0;
#endif
}

/* Says what the runtime has, for WF_ENODEV messages. */
static const char *no_cuda_why(void)
{
#ifdef WF_HAVE_CUDA
    return cuda_count() ? "" : "; no CUDA device found (no GPU or no driver)";
#else
    return "; weft is built without CUDA";
#endif
}

int wf_device_count_kind(wf_runtime *rt, wf_device_kind kind)
{
    if (!rt)
        return wf__err(WF_EINVAL, "wf_device_count_kind: rt is NULL");
    switch (kind) {
    case WF_DEVICE_CPU:
        return 1;
    case WF_DEVICE_CUDA:
        return cuda_count();
    }
    return wf__err(WF_EINVAL, "wf_device_count_kind: %d is not a wf_device_kind", (int)kind);
}

int wf_device_count(wf_runtime *rt)
{
    if (!rt)
        return wf__err(WF_EINVAL, "wf_device_count: rt is NULL");
    return 1 + cuda_count();
}

int wf_device_get_info(wf_runtime *rt, int id, wf_device_info *out)
{
    if (!rt || !out)
        return wf__err(WF_EINVAL, "wf_device_get_info: %s is NULL", rt ? "out" : "rt");
    int n = wf_device_count(rt);
    if (id < 0 || id >= n)
        return wf__err(WF_ENODEV, "wf_device_get_info: no device %d (this runtime has %d: cpu:0%s)",
                       id, n, no_cuda_why());
    if (id == 0) {
        wf__cpu_info(rt, out);
        return 0;
    }
#ifdef WF_HAVE_CUDA
    return wf__cuda_info(rt, id - 1, out);
#else
    return wf__err(WF_ENODEV, "wf_device_get_info: no device %d", id); /* unreachable: n is 1 */
#endif
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
    int n = wf_device_count(rt);
    if (id < 0 || id >= n)
        return wf__err(WF_ENODEV, "wf_device_open: no device %d (this runtime has %d: cpu:0%s)", id,
                       n, no_cuda_why());
    if (id == 0)
        return wf__cpu_open(rt, o, out);
#ifdef WF_HAVE_CUDA
    return wf__cuda_open(rt, id - 1, id, o, out);
#else
    return wf__err(WF_ENODEV, "wf_device_open: no device %d", id);     /* unreachable: n is 1 */
#endif
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
