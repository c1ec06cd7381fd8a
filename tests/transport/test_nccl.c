/* tests/transport/test_nccl.c: the collectives on CUDA device memory (NCCL behind
 * wf_comm_allreduce and the others), between forked ranks, one CUDA device each (2 ranks
 * when the machine has 2 devices or more, else 1: NCCL refuses two ranks on one device).
 * Built only with CUDA and NCCL (tests/CMakeLists.txt); skips without a CUDA device.
 * Results against the serial reference: inputs are multiples of 1/4 below 16 in magnitude,
 * so f32 and bf16 sums and maxima over 2 ranks are exact and compared exactly. A mix of
 * host and device buffers is refused. */
#include "transport_util.h"

#include <cuda_runtime_api.h>

#include <math.h>

TestSuite(transport_nccl, .timeout = WF_TEST_TIMEOUT(120), .fini = wf_test_fini);

static int devices(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess)
        return 0;
    return n;
}

static float input(int r, size_t i)
{
    return (float)((long)((r * 7919u + i * 104729u) % 101u) - 50) * 0.25f;
}

static int nccl_body(wf_comm *c, int rank, int size, void *arg)
{
    int ndev = devices();
    TU_CHECK(ndev > 0, "the rank sees no CUDA device");
    TU_CHECK(cudaSetDevice(rank % ndev) == cudaSuccess, "cudaSetDevice");
    size_t n = 1000003; /* odd, not divisible by the rank count */
    float *h = malloc(n * size * sizeof *h), *d = NULL, *d2 = NULL;
    TU_CHECK(h, "malloc");
    TU_CHECK(cudaMalloc((void **)&d, n * size * sizeof *d) == cudaSuccess, "cudaMalloc");
    TU_CHECK(cudaMalloc((void **)&d2, n * size * sizeof *d2) == cudaSuccess, "cudaMalloc");

    /* all-reduce, sum and max, in place. */
    for (int op = 0; op < 2; op++) {
        for (size_t i = 0; i < n; i++)
            h[i] = input(rank, i);
        TU_CHECK(cudaMemcpy(d, h, n * sizeof *h, cudaMemcpyHostToDevice) == cudaSuccess, "copy");
        TU_OK(wf_comm_allreduce(c, d, d, n, WF_F32, op ? WF_REDUCE_MAX : WF_REDUCE_SUM));
        TU_CHECK(cudaMemcpy(h, d, n * sizeof *h, cudaMemcpyDeviceToHost) == cudaSuccess, "copy");
        for (size_t i = 0; i < n; i++) {
            float want = op ? -INFINITY : 0;
            for (int r = 0; r < size; r++)
                want = op ? (input(r, i) > want ? input(r, i) : want) : want + input(r, i);
            TU_CHECK(h[i] == want, "%s element %zu: %g, expected %g", op ? "max" : "sum", i, h[i],
                     want);
        }
    }
    /* broadcast from the last rank; all-gather; reduce-scatter. */
    for (size_t i = 0; i < n; i++)
        h[i] = rank == size - 1 ? input(7, i) : 0;
    TU_CHECK(cudaMemcpy(d, h, n * sizeof *h, cudaMemcpyHostToDevice) == cudaSuccess, "copy");
    TU_OK(wf_comm_broadcast(c, d, n * sizeof *h, size - 1));
    TU_CHECK(cudaMemcpy(h, d, n * sizeof *h, cudaMemcpyDeviceToHost) == cudaSuccess, "copy");
    for (size_t i = 0; i < n; i++)
        TU_CHECK(h[i] == input(7, i), "broadcast element %zu", i);
    for (size_t i = 0; i < n; i++)
        h[i] = input(rank, i);
    TU_CHECK(cudaMemcpy(d, h, n * sizeof *h, cudaMemcpyHostToDevice) == cudaSuccess, "copy");
    TU_OK(wf_comm_allgather(c, d, d2, n * sizeof *h));
    TU_CHECK(cudaMemcpy(h, d2, n * size * sizeof *h, cudaMemcpyDeviceToHost) == cudaSuccess,
             "copy");
    for (int r = 0; r < size; r++)
        for (size_t i = 0; i < n; i++)
            TU_CHECK(h[(size_t)r * n + i] == input(r, i), "allgather rank %d element %zu", r, i);
    for (size_t i = 0; i < n * size; i++)
        h[i] = input(rank, i);
    TU_CHECK(cudaMemcpy(d2, h, n * size * sizeof *h, cudaMemcpyHostToDevice) == cudaSuccess,
             "copy");
    TU_OK(wf_comm_reduce_scatter(c, d2, d, n, WF_F32, WF_REDUCE_SUM));
    TU_CHECK(cudaMemcpy(h, d, n * sizeof *h, cudaMemcpyDeviceToHost) == cudaSuccess, "copy");
    for (size_t i = 0; i < n; i++) {
        float want = 0;
        for (int r = 0; r < size; r++)
            want += input(r, (size_t)rank * n + i);
        TU_CHECK(h[i] == want, "reduce_scatter element %zu: %g, expected %g", i, h[i], want);
    }
    /* Host and device mixed: refused, nothing sent (the comm stays healthy). */
    TU_CHECK(wf_comm_allreduce(c, h, d, n, WF_F32, WF_REDUCE_SUM) == WF_EINVAL, "mixed buffers");
    TU_CHECK(strstr(wf_last_errmsg(), "CUDA device"), "%s", wf_last_errmsg());
    TU_CHECK(wf_comm_allreduce(c, d, d, n, WF_I32, WF_REDUCE_MEAN) == WF_EINVAL, "i32 mean");
    TU_OK(wf_comm_status(c));
    /* The host path still works beside it. */
    float x = (float)(rank + 1);
    TU_OK(wf_comm_allreduce(c, &x, &x, 1, WF_F32, WF_REDUCE_SUM));
    TU_CHECK(x == (float)(size * (size + 1) / 2), "host all-reduce after NCCL: %g", x);
    cudaFree(d);
    cudaFree(d2);
    free(h);
    return 0;
}
TU_REGISTER(nccl_body)

Test(transport_nccl, device_collectives_match_the_reference)
{
    int n = devices();
    if (n <= 0)
        cr_skip_test("no CUDA device");
    tu_run_all(n >= 2 ? 2 : 1, NULL, nccl_body, NULL, 0, 100);
}
