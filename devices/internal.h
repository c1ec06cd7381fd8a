/* devices/internal.h: what the files of devices/ share, and nothing else includes.
 * Owns: the constructors of each kind of device, called by wf_device_open().
 * Not here: the device interface (devices/device.h). */
#ifndef WF_DEVICES_INTERNAL_H
#define WF_DEVICES_INTERNAL_H

#include "device.h"

/* Fills '*info' for the CPU device of 'rt' (device 0, "cpu:0"). */
void wf__cpu_info(wf_runtime *rt, wf_device_info *info);

/* Opens the CPU device: one pool per NUMA node of 'rt'. Returns 0, WF_ENOMEM or WF_EINVAL
 * with wf_last_errmsg() set. */
int wf__cpu_open(wf_runtime *rt, const wf_device_opts *o, wf_device **out);

#endif /* WF_DEVICES_INTERNAL_H */
