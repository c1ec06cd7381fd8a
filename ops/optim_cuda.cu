/* ops/optim_cuda.cu: the optimizers' updates on the GPU as fused multi-tensor kernels: one
 * launch updates up to OPT_MAX_TENSORS variables with their gradients and states (SGD with
 * momentum and Nesterov, Adam, AdamW), with grad/optim_cpu.c's arithmetic.
 * Owns: the chunk table of a launch (each block updates one chunk of OPT_CHUNK elements of
 *   one tensor; blocks find their tensor in the launch's prefix of chunk counts), and the
 *   rounding: every operation is a separately rounded IEEE operation in the variable's type
 *   (__fmul_rn, __fadd_rn, __fdiv_rn, __fsqrt_rn and their f64 twins), never contracted into
 *   an FMA, so an f32 variable gets the bits grad/optim_cpu.c's loop gives it on the host.
 * Invariants: each element is updated from its own values only; the variable, its gradient
 *   and its states are contiguous tensors of one dtype (f32 or f64) and one shape.
 * Also: wf__cuda_read_host(), the copy of a few scalars to the host that multi_update's CUDA
 *   slot reads its step counter and hyperparameters with; wf__increment_cuda(), the step
 *   counter's increment on the device.
 * Not here: building the update nodes and their scalars (grad/: learning-rate schedules, bias
 *   corrections); the CUDA slots of multi_update, update_K and increment (grad/optim_cpu.c),
 *   which map a node onto these functions where runtime/compile/pass_place.c put it on a GPU (with
 *   its variables resident there). */
#include "cuda_common.h"

#define OPT_MAX_TENSORS 32
#define OPT_CHUNK       65536

struct opt_launch {
    int n;
    void *w[OPT_MAX_TENSORS], *s0[OPT_MAX_TENSORS], *s1[OPT_MAX_TENSORS];
    const void *g[OPT_MAX_TENSORS];
    int64_t numel[OPT_MAX_TENSORS];
    int64_t first_chunk[OPT_MAX_TENSORS + 1]; /* prefix of chunk counts */
};

/* The scalars, rounded once to T as the CPU's loop rounds them. */
template <class T> struct opt_scalars {
    int kind;
    bool nesterov, momentum;
    T lr, wd, mom, b1, b2, c1, c2, step, rbc2, eps, l2, decay;
};

__device__ __forceinline__ float rmul(float a, float b)
{
    return __fmul_rn(a, b);
}

__device__ __forceinline__ float radd(float a, float b)
{
    return __fadd_rn(a, b);
}

__device__ __forceinline__ float rsub(float a, float b)
{
    return __fsub_rn(a, b);
}

__device__ __forceinline__ float rdiv(float a, float b)
{
    return __fdiv_rn(a, b);
}

__device__ __forceinline__ float rsqrt_(float a)
{
    return __fsqrt_rn(a);
}

__device__ __forceinline__ double rmul(double a, double b)
{
    return __dmul_rn(a, b);
}

__device__ __forceinline__ double radd(double a, double b)
{
    return __dadd_rn(a, b);
}

__device__ __forceinline__ double rsub(double a, double b)
{
    return __dsub_rn(a, b);
}

__device__ __forceinline__ double rdiv(double a, double b)
{
    return __ddiv_rn(a, b);
}

__device__ __forceinline__ double rsqrt_(double a)
{
    return __dsqrt_rn(a);
}

template <class T>
static __global__ void update_k(opt_launch L, opt_scalars<T> u, int64_t total_chunks)
{
    for (int64_t c = blockIdx.x; c < total_chunks; c += gridDim.x) {
        int t = 0;
        while (t + 1 < L.n && L.first_chunk[t + 1] <= c)
            t++;
        int64_t lo = (c - L.first_chunk[t]) * OPT_CHUNK, hi = lo + OPT_CHUNK;
        if (hi > L.numel[t])
            hi = L.numel[t];
        T *w = (T *)L.w[t], *s0 = (T *)L.s0[t], *s1 = (T *)L.s1[t];
        const T *g = (const T *)L.g[t];
        for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
            T wi = w[i], gi = g[i];
            if (u.kind == WF_CU_OPT_SGD) {
                T gw = radd(gi, rmul(u.wd, wi));
                if (!u.momentum) {
                    w[i] = rsub(wi, rmul(u.lr, gw));
                } else if (u.nesterov) {
                    T vi = radd(rmul(u.mom, s0[i]), gw);
                    s0[i] = vi;
                    w[i] = rsub(wi, rmul(u.lr, radd(gw, rmul(u.mom, vi))));
                } else {
                    T vi = radd(rmul(u.mom, s0[i]), gw);
                    s0[i] = vi;
                    w[i] = rsub(wi, rmul(u.lr, vi));
                }
                continue;
            }
            /* Adam and AdamW (decay 1 and l2 0 where they do not apply) */
            T p = rmul(wi, u.decay), ga = radd(gi, rmul(u.l2, wi));
            T mi = radd(rmul(u.b1, s0[i]), rmul(u.c1, ga));
            T vi = radd(rmul(u.b2, s1[i]), rmul(rmul(u.c2, ga), ga));
            s0[i] = mi;
            s1[i] = vi;
            w[i] = rsub(p, rdiv(rmul(u.step, mi), radd(rmul(rsqrt_(vi), u.rbc2), u.eps)));
        }
    }
}

template <class T> static opt_scalars<T> scalars(const wf_cuda_update *u)
{
    opt_scalars<T> s;
    s.kind = u->kind;
    s.nesterov = u->nesterov;
    s.momentum = u->momentum > 0;
    s.lr = (T)u->lr;
    s.wd = (T)u->weight_decay;
    s.mom = (T)u->momentum;
    s.b1 = (T)u->beta1;
    s.b2 = (T)u->beta2;
    s.c1 = (T)(1 - u->beta1);
    s.c2 = (T)(1 - u->beta2);
    s.step = (T)(u->lr / u->bias_correction1);
    s.rbc2 = (T)(1 / sqrt(u->bias_correction2));
    s.eps = (T)u->eps;
    s.l2 = u->kind == WF_CU_OPT_ADAM ? (T)u->weight_decay : (T)0;
    s.decay = u->kind == WF_CU_OPT_ADAMW ? (T)(1 - u->lr * u->weight_decay) : (T)1;
    return s;
}

static int check(const char *op, const wf_cuda_update *u, int n, wf_tensor *const *w,
                 const wf_tensor *const *g, wf_tensor *const *s0, wf_tensor *const *s1)
{
    char sa[160], sb[160];
    if (!u || n < 0 || (n > 0 && (!w || !g)))
        return wf__err(WF_EINVAL, "%s: NULL update, variables or gradients", op);
    if (u->kind != WF_CU_OPT_SGD && u->kind != WF_CU_OPT_ADAM && u->kind != WF_CU_OPT_ADAMW)
        return wf__err(WF_EINVAL, "%s: kind %d is not SGD, Adam or AdamW", op, u->kind);
    bool sgd = u->kind == WF_CU_OPT_SGD;
    int states = sgd ? (u->momentum > 0) : 2;
    if (!sgd && !(u->bias_correction1 > 0 && u->bias_correction2 > 0))
        return wf__err(WF_EINVAL, "%s: bias corrections %g and %g must be positive", op,
                       u->bias_correction1, u->bias_correction2);
    for (int i = 0; i < n; i++) {
        const wf_tensor *t[4] = { w[i], g[i], states > 0 && s0 ? s0[i] : NULL,
                                  states > 1 && s1 ? s1[i] : NULL };
        for (int k = 0; k < 2 + states; k++) {
            if (!t[k])
                return wf__err(WF_EINVAL, "%s: tensor %d lacks its %s", op, i,
                               k == 0   ? "variable"
                               : k == 1 ? "gradient"
                                        : "state");
            if ((t[k]->dtype != WF_F32 && t[k]->dtype != WF_F64) || t[k]->dtype != t[0]->dtype ||
                !t[k]->contiguous || !wf_shape_equal(t[k]->shape, t[0]->shape))
                return wf__err(
                    WF_EINVAL,
                    "%s: tensor %d: the variable is %s %s but operand %d is %s %s "
                    "(contiguous f32 or f64 of one dtype and shape)",
                    op, i, wf_dtype_name(t[0]->dtype), wf_shape_str(t[0]->shape, sa, sizeof sa), k,
                    wf_dtype_name(t[k]->dtype), wf_shape_str(t[k]->shape, sb, sizeof sb));
        }
        if (w[i]->dtype != w[0]->dtype)
            return wf__err(WF_EDTYPE,
                           "%s: variable %d is %s but variable 0 is %s (one dtype per call)", op, i,
                           wf_dtype_name(w[i]->dtype), wf_dtype_name(w[0]->dtype));
    }
    return 0;
}

int wf__update_multi_cuda(const wf_kernel_ctx *ctx, const wf_cuda_update *u, int n,
                          wf_tensor *const *w, const wf_tensor *const *g, wf_tensor *const *s0,
                          wf_tensor *const *s1)
{
    const char *op = "update_multi";
    int rc = check(op, u, n, w, g, s0, s1);
    const wf__cuda_queue *q;
    if (rc < 0 || n == 0 || (rc = wf__cuda_enter(ctx, op, &q)) < 0)
        return rc;
    bool f64 = w[0]->dtype == WF_F64;
    bool sgd = u->kind == WF_CU_OPT_SGD;
    int states = sgd ? (u->momentum > 0) : 2;
    for (int base = 0; base < n; base += OPT_MAX_TENSORS) {
        opt_launch L;
        memset(&L, 0, sizeof L);
        L.n = n - base < OPT_MAX_TENSORS ? n - base : OPT_MAX_TENSORS;
        for (int i = 0; i < L.n; i++) {
            L.w[i] = w[base + i]->data;
            L.g[i] = g[base + i]->data;
            L.s0[i] = states > 0 ? s0[base + i]->data : NULL;
            L.s1[i] = states > 1 ? s1[base + i]->data : NULL;
            L.numel[i] = w[base + i]->numel;
            L.first_chunk[i + 1] = L.first_chunk[i] + (L.numel[i] + OPT_CHUNK - 1) / OPT_CHUNK;
        }
        int64_t chunks = L.first_chunk[L.n];
        if (chunks == 0)
            continue;
        unsigned blocks = (unsigned)(chunks < 65535 ? chunks : 65535);
        if (f64)
            update_k<double>
                <<<blocks, WF_CU_THREADS, 0, q->stream>>>(L, scalars<double>(u), chunks);
        else
            update_k<float><<<blocks, WF_CU_THREADS, 0, q->stream>>>(L, scalars<float>(u), chunks);
        WF_CU_LAUNCHED(op);
    }
    return 0;
}

__global__ void increment_k(void *p, bool i64)
{
    if (i64)
        ++*(long long *)p;
    else
        ++*(int *)p;
}

int wf__increment_cuda(const wf_kernel_ctx *ctx, const char *op, wf_tensor *t)
{
    if (!t || (t->dtype != WF_I64 && t->dtype != WF_I32) || t->numel != 1)
        return wf__err(WF_EINVAL, "%s: the counter must be one i64 or i32 element", op);
    const wf__cuda_queue *q;
    int rc = wf__cuda_enter(ctx, op, &q);
    if (rc < 0)
        return rc;
    increment_k<<<1, 1, 0, q->stream>>>(t->data, t->dtype == WF_I64);
    WF_CU_LAUNCHED(op);
    return 0;
}

int wf__cuda_read_host(const wf_kernel_ctx *ctx, const char *op, int n, const void *const *src,
                       void *const *dst, const size_t *bytes)
{
    for (int i = 0; i < n; i++)
        if (bytes[i] > 0 && (!src[i] || !dst[i]))
            return wf__err(WF_EINVAL, "%s: NULL %s for copy %d to the host", op,
                           !src[i] ? "source" : "dst", i);
    const wf__cuda_queue *q;
    int rc = wf__cuda_enter(ctx, op, &q);
    if (rc < 0 || n <= 0)
        return rc;
    for (int i = 0; i < n; i++)
        if (bytes[i] > 0)
            WF_CU_TRY(cudaMemcpyAsync(dst[i], src[i], bytes[i], cudaMemcpyDefault, q->stream), op,
                      "cudaMemcpyAsync to the host");
    WF_CU_TRY(cudaStreamSynchronize(q->stream), op, "cudaStreamSynchronize");
    return 0;
}
