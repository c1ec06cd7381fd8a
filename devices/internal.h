/* devices/internal.h: what the files of devices/ share, and nothing else includes.
 * Owns: the constructors of each kind of device, called by wf_device_open(), and CUDA
 *   discovery.
 * Not here: the device interface (devices/device.h). */
#ifndef WF_DEVICES_INTERNAL_H
#define WF_DEVICES_INTERNAL_H

#include "device.h"

/* Fills '*info' for the CPU device of 'rt' (device 0, "cpu:0"). */
void wf__cpu_info(wf_runtime *rt, wf_device_info *info);

/* Opens the CPU device: one pool per NUMA node of 'rt'. Returns 0, WF_ENOMEM or WF_EINVAL
 * with wf_last_errmsg() set. */
int wf__cpu_open(wf_runtime *rt, const wf_device_opts *o, wf_device **out);

/* devices/cuda.c (only with WF_HAVE_CUDA; without it there is no CUDA device). */

/* The number of CUDA GPUs the driver shows: 0 when there is no driver or no device (not an
 * error). The driver's answer is process-wide and cached by it. */
int wf__cuda_count(void);

/* Fills '*info' for GPU 'ordinal'. Returns 0 or WF_EDEVICE with wf_last_errmsg() set. */
int wf__cuda_info(wf_runtime *rt, int ordinal, wf_device_info *info);

/* Opens GPU 'ordinal' as device 'id' of 'rt' (streams, handles, pool, actor). Returns 0,
 * WF_ENOMEM or WF_EDEVICE with wf_last_errmsg() set. */
int wf__cuda_open(wf_runtime *rt, int ordinal, int id, const wf_device_opts *o, wf_device **out);

#endif /* WF_DEVICES_INTERNAL_H */
