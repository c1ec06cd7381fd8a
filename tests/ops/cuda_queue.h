/* tests/ops/cuda_queue.h: the hand-made CUDA device queue that the CUDA kernel tests call
 * kernels on (one stream, a cuBLAS/cuBLASLt/cuDNN handle set and a workspace, as
 * devices/cuda.c makes them), and moving tensors between it and the host: to_dev (any
 * strides), dev_out (filled so unwritten elements show), to_host, and expect_close (device
 * against host result, element by element; NaN matches NaN). Include it once, inside the
 * test file's WF_HAVE_CUDA part, after ops_test.h and the CUDA headers. */
#ifndef WF_TESTS_OPS_CUDA_QUEUE_H
#define WF_TESTS_OPS_CUDA_QUEUE_H

static struct {
    bool ready, have;
    wf__cuda_queue q;
    wf_kernel_ctx ctx;
} dev;

static void dev_free(void *ctx, void *data, size_t bytes)
{
    (void)ctx;
    (void)bytes;
    cudaFree(data);
}

#define CU(call) cr_assert_eq((call), cudaSuccess, "%s: %s", #call, cudaGetErrorString(call))

static void open_device(void)
{
    if (dev.ready)
        return;
    dev.ready = true;
    dev.have = wf__cuda_have_device();
    if (!dev.have)
        return;
    CU(cudaSetDevice(0));
    cudaStream_t s;
    CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    dev.q.stream = s;
    dev.q.ordinal = 0;
    dev.q.workspace_bytes = WF__CUDA_WORKSPACE;
    CU(cudaMalloc(&dev.q.workspace, dev.q.workspace_bytes));
    cr_assert_eq(cublasCreate(&dev.q.cublas), CUBLAS_STATUS_SUCCESS);
    cr_assert_eq(cublasSetStream(dev.q.cublas, s), CUBLAS_STATUS_SUCCESS);
    cr_assert_eq(cublasSetWorkspace(dev.q.cublas, dev.q.workspace, dev.q.workspace_bytes),
                 CUBLAS_STATUS_SUCCESS);
    cr_assert_eq(cublasLtCreate(&dev.q.cublaslt), CUBLAS_STATUS_SUCCESS);
    cr_assert_eq(cudnnCreate(&dev.q.cudnn), CUDNN_STATUS_SUCCESS);
    cr_assert_eq(cudnnSetStream(dev.q.cudnn, s), CUDNN_STATUS_SUCCESS);
    dev.ctx.stream = &dev.q;
    dev.ctx.device = 0;
}

#define NEED_DEVICE()                       \
    do {                                    \
        open_device();                      \
        if (!dev.have)                      \
            cr_skip_test("no CUDA device"); \
    } while (0)

/* A device copy of host tensor 'h' with h's shape and strides (the memory its view spans). */
static wf_tensor *to_dev(const wf_tensor *h)
{
    size_t es = wf_dtype_size(h->dtype);
    int64_t lo = 0, hi = 0;
    for (int d = 0; d < h->shape.rank && h->numel > 0; d++) {
        int64_t span = h->strides[d] * (h->shape.dims[d] - 1);
        if (span < 0)
            lo += span;
        else
            hi += span;
    }
    int64_t n = h->numel > 0 ? hi - lo + 1 : 1;
    size_t bytes = (size_t)n * es;
    void *d = NULL;
    CU(cudaMalloc(&d, bytes));
    if (h->numel > 0)
        CU(cudaMemcpy(d, h->data + lo * (int64_t)es, bytes, cudaMemcpyHostToDevice));
    wf_tensor *base = wf__tensor_adopt(h->dtype, WF_SHAPE(n), d, bytes, dev_free, NULL);
    cr_assert_not_null(base, "%s", wf_last_errmsg());
    wf_tensor *v = wf__tensor_alias(base, h->shape, h->strides, -lo);
    cr_assert_not_null(v, "%s", wf_last_errmsg());
    wf_tensor_release(base);
    return v;
}

/* A contiguous device output, filled with bytes that show where nothing was written. */
static wf_tensor *dev_out(wf_dtype dt, wf_shape shape)
{
    size_t bytes;
    cr_assert_eq(wf__tensor_check("dev_out", dt, shape, &bytes), 0);
    void *d = NULL;
    CU(cudaMalloc(&d, bytes ? bytes : 1));
    CU(cudaMemset(d, 0x7f, bytes ? bytes : 1));
    wf_tensor *t = wf__tensor_adopt(dt, shape, d, bytes ? bytes : 1, dev_free, NULL);
    cr_assert_not_null(t, "%s", wf_last_errmsg());
    return t;
}

/* A host copy of device tensor 'd' (contiguous), after the queue's work is done. */
static wf_tensor *to_host(const wf_tensor *d)
{
    CU(cudaStreamSynchronize(dev.q.stream));
    wf_tensor *h = ot_out(d->dtype, d->shape);
    size_t bytes = (size_t)d->numel * wf_dtype_size(d->dtype);
    if (bytes)
        CU(cudaMemcpy(h->data, d->data, bytes, cudaMemcpyDeviceToHost));
    return h;
}

/* Asserts that device result 'got' matches host result 'want' element by element. */
static void expect_close(const char *what, const wf_tensor *want, const wf_tensor *got, ot_tol tol)
{
    wf_tensor *h = to_host(got);
    cr_assert(wf_shape_equal(want->shape, h->shape), "%s: shapes differ", what);
    for (int64_t i = 0; i < want->numel; i++) {
        double w = wf_tensor_get(want, i), g = wf_tensor_get(h, i);
        bool same = (w != w && g != g) || ot_close(g, w, tol);
        cr_assert(same, "%s: element %lld is %.9g, the CPU's is %.9g", what, (long long)i, g, w);
    }
    wf_tensor_release(h);
}

#endif
