/* ops/softmax_cuda.cu: CUDA twin of ops/softmax_cpu.c: softmax and log_softmax along any axis,
 * softmax_cross_entropy (logits [..., C] against integer labels [...]) and its backward in one
 * pass; and the kernel slots of those ops.
 * Owns: the row walk on the device: a block per row (grid-stride over rows), its threads over
 *   the row's C elements; the row's maximum (NaN if any element is NaN) and the sum of
 *   exp(x - max) in f64 through a fixed shared-memory tree, then each element stored rounded
 *   to out's dtype, as the CPU twin computes them.
 * Invariants: the bits depend only on the shapes (fixed tree, no atomics on values); labels
 *   are validated on the device: the first bad example is recorded and the entry fails with
 *   the CPU twin's message after waiting for the stream.
 * Not here: the gradients' graph (grad/), the op definitions (softmax.c). */
#include "cuda_common.h"

#include <math.h>

enum { SM_SOFTMAX, SM_LOG_SOFTMAX, SM_XENT, SM_XENT_BACKWARD };

/* A row is the 'axis' line through one position of the other axes. */
struct sm_plan {
    int kind;
    wf__softmax_geom g; /* the rows and the axis (as the CPU twin's) */
};

template <class S, class L>
static __global__ void softmax_k(sm_plan p, const S *x, S *out, const L *labels, const S *dloss,
                                 unsigned long long *bad)
{
    extern __shared__ double sh[];
    typedef typename wf_cu_compute<S>::type T;
    for (int64_t r = blockIdx.x; r < p.g.rows; r += gridDim.x) {
        int64_t rem = r, xo = 0, oo = 0, lo = 0, dlo = 0;
        for (int d = p.g.orank - 1; d >= 0; d--) {
            int64_t k = rem % p.g.odims[d];
            rem /= p.g.odims[d];
            xo += k * p.g.xst[d];
            oo += k * p.g.ost[d];
            lo += k * p.g.lst[d];
            dlo += k * p.g.dst[d];
        }
        const S *row = x + xo;
        double m = -INFINITY;
        for (int64_t j = threadIdx.x; j < p.g.C; j += blockDim.x) {
            double v = (double)wf_cu_ld<T>(row[j * p.g.x_axis_st]);
            m = m != m ? m : v != v ? v : v > m ? v : m;
        }
        m = wf_cu_block_max(m, sh);
        double s = 0;
        if (isfinite(m))
            for (int64_t j = threadIdx.x; j < p.g.C; j += blockDim.x)
                s += exp((double)wf_cu_ld<T>(row[j * p.g.x_axis_st]) - m);
        s = wf_cu_block_sum(s, sh);
        if (p.kind == SM_XENT || p.kind == SM_XENT_BACKWARD) {
            int64_t label = (int64_t)labels[lo];
            bool ok = label >= 0 && label < p.g.C;
            if (p.kind == SM_XENT) {
                if (threadIdx.x == 0) {
                    if (!ok)
                        atomicMin(bad, (unsigned long long)r);
                    double xl = ok ? (double)wf_cu_ld<T>(row[label * p.g.x_axis_st]) : (double)NAN;
                    double loss = isfinite(m) ? m + log(s) - xl : m - xl;
                    out[oo] = wf_cu_st<S>((T)loss);
                }
                continue;
            }
            /* dlogits = (softmax - onehot(label)) * dloss */
            double g = (double)wf_cu_ld<T>(dloss[dlo]);
            for (int64_t j = threadIdx.x; j < p.g.C; j += blockDim.x) {
                double y = isfinite(m) ? exp((double)wf_cu_ld<T>(row[j * p.g.x_axis_st]) - m) / s
                                       : (double)NAN;
                out[oo + j * p.g.out_axis_st] =
                    wf_cu_st<S>((T)((y - (j == label ? 1.0 : 0.0)) * g));
            }
            continue;
        }
        double ls = log(s);
        for (int64_t j = threadIdx.x; j < p.g.C; j += blockDim.x) {
            double v = (double)wf_cu_ld<T>(row[j * p.g.x_axis_st]), y;
            if (!isfinite(m))
                y = NAN;
            else if (p.kind == SM_SOFTMAX)
                y = exp(v - m) / s;
            else
                y = v - m - ls;
            out[oo + j * p.g.out_axis_st] = wf_cu_st<S>((T)y);
        }
    }
}

static const char *const sm_names[] = { "softmax", "log_softmax", "softmax_cross_entropy",
                                        "softmax_cross_entropy_backward" };

template <class S, class L>
static int launch_sm(const char *name, cudaStream_t s, const sm_plan &p, const void *x, void *out,
                     const void *labels, const void *dloss, unsigned long long *bad)
{
    int threads = 32;
    while (threads < 256 && threads < p.g.C)
        threads *= 2;
    unsigned blocks = (unsigned)(p.g.rows < 65535 ? p.g.rows : 65535);
    softmax_k<S, L><<<blocks, threads, threads * sizeof(double), s>>>(
        p, (const S *)x, (S *)out, (const L *)labels, (const S *)dloss, bad);
    WF_CU_LAUNCHED(name);
    return 0;
}

static int run(const wf_kernel_ctx *ctx, int kind, int axis, const wf_tensor *x,
               const wf_tensor *labels, const wf_tensor *dloss, wf_tensor *out)
{
    const char *name = sm_names[kind];
    bool xent = kind == SM_XENT || kind == SM_XENT_BACKWARD;
    char s1[160], s2[160], s3[160];
    if (!x || !out || (xent && !labels) || (kind == SM_XENT_BACKWARD && !dloss))
        return wf__err(WF_EINVAL, "%s: %s is NULL", name,
                       !x        ? "x"
                       : !out    ? "out"
                       : !labels ? "labels"
                                 : "dloss");
    int a;
    wf_shape lshape;
    int rc = wf__ops_softmax_check(name, axis, x, xent ? labels : NULL, &a, &lshape);
    if (rc < 0)
        return rc;
    sm_plan p;
    p.kind = kind;
    wf_shape oshape = kind == SM_XENT ? lshape : x->shape;
    if (kind == SM_XENT_BACKWARD) {
        if (dloss->dtype != x->dtype)
            return wf__err(WF_EDTYPE, "%s: dloss is %s but the logits are %s", name,
                           wf_dtype_name(dloss->dtype), wf_dtype_name(x->dtype));
        if (!wf_shape_equal(dloss->shape, lshape))
            return wf__err(WF_ESHAPE, "%s: logits are %s, so dloss must be %s, not %s", name,
                           wf_shape_str(x->shape, s1, sizeof s1),
                           wf_shape_str(lshape, s2, sizeof s2),
                           wf_shape_str(dloss->shape, s3, sizeof s3));
    }
    rc = wf__kernel_check_out(name, out, x->dtype, oshape);
    if (rc < 0)
        return rc;
    wf__ops_softmax_geom(a, kind == SM_XENT, x, xent ? labels : NULL,
                         kind == SM_XENT_BACKWARD ? dloss : NULL, out, &p.g);
    const wf__cuda_queue *q;
    if ((rc = wf__cuda_enter(ctx, name, &q)) < 0)
        return rc;
    cudaStream_t s = q->stream;
    if (p.g.rows == 0 || (p.g.C == 0 && kind != SM_XENT))
        return 0;
    void *flag = NULL;
    if (kind == SM_XENT && (rc = wf__cuda_flag(s, name, &flag)) < 0)
        return rc;
    bool l64 = xent && labels->dtype == WF_I64;
    const void *lp = xent ? labels->data : NULL, *dp = dloss ? dloss->data : NULL;
    unsigned long long *bad = (unsigned long long *)flag;
    rc = WF_EDTYPE;
    WF_CU_FLOAT_SWITCH(
        x->dtype,
        rc = l64 ? (launch_sm<S, int64_t>(name, s, p, x->data, out->data, lp, dp, bad))
                 : (launch_sm<S, int32_t>(name, s, p, x->data, out->data, lp, dp, bad)),
        break)
    if (kind != SM_XENT)
        return rc;
    int64_t bad_row = -1;
    if (rc == 0)
        rc = wf__cuda_read_flag(s, (const int64_t *)flag, name, &bad_row);
    wf__cuda_tmp_free(s, flag);
    if (rc < 0 || bad_row == -1)
        return rc;
    /* The bad example's label, for the message. */
    int64_t rem = bad_row, lo = 0;
    for (int d = p.g.orank - 1; d >= 0; d--) {
        lo += (rem % p.g.odims[d]) * p.g.lst[d];
        rem /= p.g.odims[d];
    }
    int64_t label = 0;
    size_t les = wf_dtype_size(labels->dtype);
    WF_CU_TRY(
        cudaMemcpyAsync(&label, labels->data + lo * (int64_t)les, les, cudaMemcpyDeviceToHost, s),
        name, "reading a bad label");
    WF_CU_TRY(cudaStreamSynchronize(s), name, "reading a bad label");
    if (les == 4)
        label = (int64_t)(int32_t)label;
    return wf__err(WF_EINVAL,
                   "softmax_cross_entropy: label %lld of example %lld is outside [0, %lld)",
                   (long long)label, (long long)bad_row, (long long)p.g.C);
}

int wf__softmax_cuda(const wf_kernel_ctx *ctx, int axis, const wf_tensor *x, wf_tensor *out)
{
    return run(ctx, SM_SOFTMAX, axis, x, NULL, NULL, out);
}

int wf__log_softmax_cuda(const wf_kernel_ctx *ctx, int axis, const wf_tensor *x, wf_tensor *out)
{
    return run(ctx, SM_LOG_SOFTMAX, axis, x, NULL, NULL, out);
}

int wf__softmax_cross_entropy_cuda(const wf_kernel_ctx *ctx, const wf_tensor *logits,
                                   const wf_tensor *labels, wf_tensor *out)
{
    return run(ctx, SM_XENT, logits ? logits->shape.rank - 1 : 0, logits, labels, NULL, out);
}

int wf__softmax_cross_entropy_backward_cuda(const wf_kernel_ctx *ctx, const wf_tensor *logits,
                                            const wf_tensor *labels, const wf_tensor *dloss,
                                            wf_tensor *out)
{
    return run(ctx, SM_XENT_BACKWARD, logits ? logits->shape.rank - 1 : 0, logits, labels, dloss,
               out);
}

/* ---- The op defs' CUDA slots (softmax.c's kernels) ------------------------------------------- */

int wf__cuda_kernel_softmax(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                            wf_tensor **out)
{
    return wf__softmax_cuda(ctx, n->attrs->axis, in[0], *out);
}

int wf__cuda_kernel_log_softmax(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                                wf_tensor **out)
{
    return wf__log_softmax_cuda(ctx, n->attrs->axis, in[0], *out);
}

int wf__cuda_kernel_softmax_cross_entropy(const wf_kernel_ctx *ctx, const wf_node *n,
                                          wf_tensor *const *in, wf_tensor **out)
{
    (void)n;
    return wf__softmax_cross_entropy_cuda(ctx, in[0], in[1], *out);
}
