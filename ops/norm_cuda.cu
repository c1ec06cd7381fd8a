/* ops/norm_cuda.cu: CUDA twin of ops/norm_cpu.c: layer normalization forward and its fused
 * gradient with respect to x; and the kernel slots of those ops.
 * Owns: the row kernel: x viewed as [rows, n] (n the product of the normalized axes), a block
 *   per row (grid-stride over rows); the mean and the biased variance in two passes in f64
 *   (no E[x^2] - E[x]^2 cancellation), the result computed in f64 and rounded once on store,
 *   as the CPU twin. Strided inputs are packed into contiguous temporaries first.
 * Invariants: each row's sums go through the fixed block tree (ops/cuda_common.h), so the
 *   bits depend only on the shapes; 'out' never overlaps an input.
 * Not here: inference and op defs (norm.c), dgamma and dbeta (composed from sums, grad/). */
#include "cuda_common.h"

#include <math.h>

#define LN_THREADS 256

template <class S>
static __global__ void layer_norm_k(const S *x, const S *gamma, const S *beta, const S *dy, S *out,
                                    int64_t rows, int64_t n, double eps)
{
    __shared__ double sh[LN_THREADS];
    typedef typename wf_cu_compute<S>::type T;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const S *xr = x + r * n;
        double s = 0;
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
            s += (double)wf_cu_ld<T>(xr[i]);
        double mean = wf_cu_block_sum(s, sh) / (double)n, q = 0;
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
            double c = (double)wf_cu_ld<T>(xr[i]) - mean;
            q += c * c;
        }
        double rstd = 1.0 / sqrt(wf_cu_block_sum(q, sh) / (double)n + eps);
        S *o = out + r * n;
        if (!dy) {
            for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
                double y = ((double)wf_cu_ld<T>(xr[i]) - mean) * rstd;
                if (gamma)
                    y *= (double)wf_cu_ld<T>(gamma[i]);
                if (beta)
                    y += (double)wf_cu_ld<T>(beta[i]);
                o[i] = wf_cu_st<S>((T)y);
            }
            continue;
        }
        /* dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dy gamma */
        const S *dr = dy + r * n;
        double m1 = 0, m2 = 0;
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
            double xh = ((double)wf_cu_ld<T>(xr[i]) - mean) * rstd;
            double g = (double)wf_cu_ld<T>(dr[i]);
            if (gamma)
                g *= (double)wf_cu_ld<T>(gamma[i]);
            m1 += g;
            m2 += g * xh;
        }
        m1 = wf_cu_block_sum(m1, sh) / (double)n;
        m2 = wf_cu_block_sum(m2, sh) / (double)n;
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
            double xh = ((double)wf_cu_ld<T>(xr[i]) - mean) * rstd;
            double g = (double)wf_cu_ld<T>(dr[i]);
            if (gamma)
                g *= (double)wf_cu_ld<T>(gamma[i]);
            o[i] = wf_cu_st<S>((T)(rstd * (g - m1 - xh * m2)));
        }
    }
}

/* t's data when contiguous, else a packed temporary in '*tmp' (NULL t: NULL). */
static int contiguous(cudaStream_t s, const char *op, const wf_tensor *t, const void **data,
                      void **tmp)
{
    *tmp = NULL;
    *data = t ? t->data : NULL;
    if (!t || t->contiguous)
        return 0;
    int rc = wf__cuda_tmp(s, (size_t)t->numel * wf_dtype_size(t->dtype), op, tmp);
    if (rc == 0)
        rc = wf__cuda_pack(s, t, *tmp, op);
    *data = *tmp;
    return rc;
}

static int layer_norm_run(const wf_kernel_ctx *ctx, const char *op, int begin_axis, double eps,
                          const wf_tensor *x, const wf_tensor *gamma, const wf_tensor *beta,
                          const wf_tensor *dy, wf_tensor *out)
{
    int rc = wf__ops_layer_norm_check(op, begin_axis, eps, x, gamma, beta, dy, out);
    const wf__cuda_queue *q;
    if (rc < 0 || (rc = wf__cuda_enter(ctx, op, &q)) < 0)
        return rc;
    if (out->numel == 0)
        return 0;
    cudaStream_t s = q->stream;
    int64_t n = 1;
    for (int d = begin_axis; d < x->shape.rank; d++)
        n *= x->shape.dims[d];
    int64_t rows = out->numel / n;
    const wf_tensor *ts[4] = { x, gamma, beta, dy };
    const void *data[4] = { NULL, NULL, NULL, NULL };
    void *tmp[4] = { NULL, NULL, NULL, NULL };
    for (int k = 0; k < 4 && rc == 0; k++)
        rc = contiguous(s, op, ts[k], &data[k], &tmp[k]);
    if (rc == 0) {
        unsigned blocks = (unsigned)(rows < 65535 ? rows : 65535);
        WF_CU_FLOAT_SWITCH(x->dtype,
                           (layer_norm_k<S><<<blocks, LN_THREADS, 0, s>>>(
                               (const S *)data[0], (const S *)data[1], (const S *)data[2],
                               (const S *)data[3], (S *)out->data, rows, n, eps)),
                           break)
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess)
            rc = wf__cuda_fail(e, op, "kernel launch");
    }
    for (int k = 0; k < 4; k++)
        wf__cuda_tmp_free(s, tmp[k]);
    return rc;
}

int wf__layer_norm_cuda(const wf_kernel_ctx *ctx, int begin_axis, double eps, const wf_tensor *x,
                        const wf_tensor *gamma, const wf_tensor *beta, wf_tensor *out)
{
    return layer_norm_run(ctx, "layer_norm", begin_axis, eps, x, gamma, beta, NULL, out);
}

int wf__layer_norm_backward_input_cuda(const wf_kernel_ctx *ctx, int begin_axis, double eps,
                                       const wf_tensor *x, const wf_tensor *gamma,
                                       const wf_tensor *dy, wf_tensor *out)
{
    if (!dy)
        return wf__err(WF_EINVAL, "layer_norm_backward_input: dy is NULL");
    return layer_norm_run(ctx, "layer_norm_backward_input", begin_axis, eps, x, gamma, NULL, dy,
                          out);
}

/* ---- The op defs' CUDA slots (norm.c's kernels; attrs: axis the begin axis, epsilon, groups
 * bit 0 gamma and bit 1 beta are inputs) ---------------------------------------------------------
 */

static int begin_axis(const wf_node *n, const wf_tensor *x)
{
    int b = n->attrs->axis;
    return b < 0 ? b + x->shape.rank : b;
}

int wf__cuda_kernel_layer_norm(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                               wf_tensor **out)
{
    int mask = n->attrs->groups, i = 1;
    const wf_tensor *gamma = mask & 1 ? in[i++] : NULL;
    const wf_tensor *beta = mask & 2 ? in[i] : NULL;
    return wf__layer_norm_cuda(ctx, begin_axis(n, in[0]), n->attrs->epsilon, in[0], gamma, beta,
                               *out);
}

int wf__cuda_kernel_layer_norm_backward_input(const wf_kernel_ctx *ctx, const wf_node *n,
                                              wf_tensor *const *in, wf_tensor **out)
{
    return wf__layer_norm_backward_input_cuda(ctx, begin_axis(n, in[0]), n->attrs->epsilon, in[0],
                                              n->n_inputs == 3 ? in[2] : NULL, in[1], *out);
}
