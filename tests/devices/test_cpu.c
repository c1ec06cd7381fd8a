/* tests/devices/test_cpu.c: enumerating devices through the public API: the CPU is device
 * 0 and the only CPU device (CUDA GPUs, if any, follow it: tests/devices/test_cuda.c), its
 * description, WF_ENODEV for ids past the last device, opening and closing it, and its
 * memory statistics. */
#include "runtime_util.h"

#include <weft/weft.h>

#include <criterion/criterion.h>

#include <stdio.h>
#include <string.h>

TestSuite(devices_cpu, .init = wf_test_rt_setup_pinned, .fini = wf_test_rt_teardown,
          .timeout = WF_TEST_TIMEOUT(30));

Test(devices_cpu, the_cpu_is_device_0_and_the_gpus_follow_it)
{
    int n_cuda = wf_device_count_kind(rt, WF_DEVICE_CUDA);
    cr_assert_geq(n_cuda, 0);
    cr_assert_eq(wf_device_count(rt), 1 + n_cuda);
    cr_assert_eq(wf_device_count_kind(rt, WF_DEVICE_CPU), 1);
}

Test(devices_cpu, counting_rejects_null_runtimes_and_unknown_kinds)
{
    cr_assert_eq(wf_device_count(NULL), WF_EINVAL);
    cr_assert_eq(wf_device_count_kind(NULL, WF_DEVICE_CPU), WF_EINVAL);
    cr_assert_eq(wf_device_count_kind(rt, (wf_device_kind)7), WF_EINVAL);
    cr_assert(strstr(wf_last_errmsg(), "7"), "message: %s", wf_last_errmsg());
}

Test(devices_cpu, the_cpu_info_names_it_and_gives_memory_numa_and_workers)
{
    wf_device_info info;
    cr_assert_eq(wf_device_get_info(rt, 0, &info), 0);
    cr_assert_eq(info.kind, WF_DEVICE_CPU);
    cr_assert_eq(info.index, 0);
    cr_assert_str_eq(info.name, "cpu:0");
    cr_assert_gt(info.memory_bytes, (uint64_t)1 << 26);
    cr_assert_eq(info.numa, 0, "one NUMA node");
    cr_assert_eq(info.compute_units, 2);
}

Test(devices_cpu, a_cpu_spanning_two_numa_nodes_reports_numa_minus_1)
{
    wf_runtime *r2 = wf_test_runtime(&(wf_runtime_opts){ .topology = "pack:2 numa:1 core:2 pu:1" });
    wf_device_info info;
    cr_assert_eq(wf_device_get_info(r2, 0, &info), 0);
    cr_assert_eq(info.numa, -1);
    cr_assert_eq(info.compute_units, 4);
    wf_device *d;
    cr_assert_eq(wf_device_open(r2, 0, NULL, &d), 0, "%s", wf_last_errmsg());
    wf_pool_stats s;
    cr_assert_eq(wf_device_memory_stats(d, &s), 0);
    cr_assert_eq(s.numa, -1, "one pool per node");
    cr_assert_eq(s.bound, 1);
    wf_device_close(d);
    wf_runtime_destroy(r2);
}

Test(devices_cpu, other_ids_are_enodev_with_a_message)
{
    wf_device_info info;
    int past = wf_device_count(rt); /* 1 without a GPU */
    char want[32];
    snprintf(want, sizeof want, "no device %d", past);
    cr_assert_eq(wf_device_get_info(rt, past, &info), WF_ENODEV);
    cr_assert(strstr(wf_last_errmsg(), want), "message: %s", wf_last_errmsg());
    cr_assert_eq(wf_device_get_info(rt, -1, &info), WF_ENODEV);
    cr_assert_eq(wf_device_get_info(rt, 0, NULL), WF_EINVAL);
    cr_assert_eq(wf_device_get_info(NULL, 0, &info), WF_EINVAL);
    wf_device *d = (wf_device *)1;
    cr_assert_eq(wf_device_open(rt, past, NULL, &d), WF_ENODEV);
    cr_assert_null(d);
}

Test(devices_cpu, open_rejects_bad_arguments)
{
    wf_device *d = (wf_device *)1;
    cr_assert_eq(wf_device_open(NULL, 0, NULL, &d), WF_EINVAL);
    cr_assert_null(d);
    cr_assert_eq(wf_device_open(rt, 0, NULL, NULL), WF_EINVAL);
    cr_assert_eq(wf_device_open(rt, 0, &(wf_device_opts){ .fail_after = -3 }, &d), WF_EINVAL);
    wf_device_close(NULL);
    cr_assert_eq(wf_device_memory_stats(NULL, &(wf_pool_stats){ 0 }), WF_EINVAL);
}

Test(devices_cpu, an_open_cpu_device_starts_with_empty_pools)
{
    wf_device *d;
    cr_assert_eq(wf_device_open(rt, 0, NULL, &d), 0, "%s", wf_last_errmsg());
    wf_pool_stats s;
    cr_assert_eq(wf_device_memory_stats(d, &s), 0);
    cr_assert_eq(s.bytes_live + s.bytes_reserved + s.allocs, 0);
    cr_assert_eq(s.numa, 0);
    cr_assert_eq(wf_device_memory_stats(d, NULL), WF_EINVAL);
    wf_device_close(d);
}
