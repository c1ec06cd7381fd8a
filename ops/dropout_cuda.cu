/* ops/dropout_cuda.cu: CUDA twin of ops/dropout_cpu.c: out = x * mask / (1 - rate) with the
 * CPU twin's counter-based mask, so both draw the same mask for the same seed and step; and
 * the kernel slot of dropout.
 * Owns: the device copy of core/rng.h's splitmix64 (core/rng.h is host C): mask[i] =
 *   unit(bits(key, i)) >= rate, key = bits(seed, step), i the row-major index.
 * Invariants: each element is computed alone (no state between calls); x is read through its
 *   strides; f32 scales in f64 and rounds once, as the CPU, f64 in f64, bf16 and f16 through
 *   f64 with one rounding to nearest even.
 * Not here: the op definition (dropout.c), its gradient (the same mask: grad/). */
#include "cuda_common.h"

#include <type_traits>

extern "C" {
#include "../core/rng.h"
}

__device__ __forceinline__ uint64_t splitmix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

template <class S> __device__ __forceinline__ S from_f64(double v)
{
    if constexpr (std::is_same<S, __nv_bfloat16>::value)
        return __double2bfloat16(v);
    else if constexpr (std::is_same<S, __half>::value)
        return __double2half(v);
    else
        return (S)v;
}

template <class S>
static __global__ void dropout_k(wf_cu_map m, const S *x, S *out, uint64_t key, double rate,
                                 double scale, int64_t n)
{
    typedef typename wf_cu_compute<S>::type T;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t off[WF_CU_MAX_IN];
        wf_cu_offsets(m, i, off);
        uint64_t bits = splitmix64(key ^ splitmix64((uint64_t)i));
        bool keep = (double)(bits >> 11) * 0x1.0p-53 >= rate;
        double v = (double)wf_cu_ld<T>(x[off[0]]);
        out[i] = keep ? from_f64<S>(v * scale) : from_f64<S>(0.0);
    }
}

int wf__dropout_cuda(const wf_kernel_ctx *ctx, double rate, uint64_t seed, const wf_tensor *x,
                     wf_tensor *out)
{
    int rc = wf__ops_dropout_check(rate, x, out);
    const wf__cuda_queue *q;
    if (rc < 0 || (rc = wf__cuda_enter(ctx, "dropout", &q)) < 0 || out->numel == 0)
        return rc;
    wf_cu_map m;
    wf__cuda_map_init(&m, out->shape, &x, 1);
    uint64_t key = wf__rng_bits(seed, ctx->step);
    double scale = 1.0 / (1.0 - rate);
    int64_t n = out->numel;
    unsigned blocks = wf__cuda_blocks(n, WF_CU_THREADS);
    WF_CU_FLOAT_SWITCH(x->dtype,
                       (dropout_k<S><<<blocks, WF_CU_THREADS, 0, q->stream>>>(
                           m, (const S *)x->data, (S *)out->data, key, rate, scale, n)),
                       break)
    WF_CU_LAUNCHED("dropout");
    return 0;
}

/* ---- The op def's CUDA slot (dropout.c's kernel; attrs: rate, seed) ----------------------- */

int wf__cuda_kernel_dropout(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                            wf_tensor **out)
{
    return wf__dropout_cuda(ctx, n->attrs->rate, n->attrs->seed, in[0], *out);
}
