/* ops/matmul_cuda.cu: CUDA twin of ops/matmul_cpu.c: matmul (2-D and batched with NumPy
 * broadcasting of the batch axes, transpose flags) through cuBLAS, and matmul_epilogue (bias
 * row and activation) through cuBLASLt's fused epilogues where they apply.
 * Owns: mapping strided operands onto cuBLAS (as the CPU twin: a matrix with one unit stride
 *   goes as it is, flipping the transpose flag when it is column-major; any other layout is
 *   packed into a stream-ordered temporary), the row-major-to-column-major swap (row-major
 *   C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: cuBLAS gets B first), the choice
 *   between one strided-batched call and one call per batch matrix, and TF32.
 * Precision: f32 in f32 (TF32 tensor cores only for nodes a WF_SESSION_TF32 session marked,
 *   ops/cuda_kernels.h: WF__MATMUL_TF32, or after wf__matmul_cuda_set_tf32(true)), f64 in
 *   f64, bf16 and f16 with f32 accumulation and one rounding of the result (the CPU rounds the
 *   f32 product once too). cuBLAS's summation order differs from OpenBLAS's: results agree
 *   to a few ulp of the sum of |products|, not bitwise.
 * Epilogues: cuBLASLt fuses a bias vector and relu or gelu_tanh into the GEMM for f32, bf16
 *   and f16 when b is 2-D and a's batch rows are one strided matrix (the MLP and transformer
 *   cases); every other case runs the product, then the add and the activation as the
 *   elementwise CUDA kernels in place (the order the CPU twin's separate nodes use).
 * Not here: the op definitions (matmul.c), the gradient (grad/). */
#include "cuda_common.h"

#include <atomic>
#include <limits.h>

static std::atomic<bool> use_tf32(false);

void wf__matmul_cuda_set_tf32(bool on)
{
    use_tf32.store(on, std::memory_order_relaxed);
}

/* One operand as cuBLAS sees it (see the file header): row-major 'trans' and 'ld' as the CPU
 * twin's cblas calls, batch strides in elements (0: broadcast). */
typedef struct mm_operand {
    const char *data;
    int64_t bst[WF_MAX_RANK];
    bool trans;
    int64_t ld;
    void *packed; /* a temporary to free, or NULL */
} mm_operand;

/* wf__ops_blas_layout() (matmul_cpu.c) into 'op'. */
static bool blas_layout(int64_t rows, int64_t cols, int64_t sr, int64_t sc, bool trans,
                        mm_operand *op)
{
    return wf__ops_blas_layout(rows, cols, sr, sc, trans, &op->trans, &op->ld);
}

/* Fills 'op' for tensor 't' (its last two axes a rows x cols matrix as stored) against out's
 * 'nb' batch axes 'bdims', packing it first when it has no unit stride. */
static int operand(cudaStream_t s, const char *name, const wf_tensor *t, bool trans, int nb,
                   mm_operand *op)
{
    int r = t->shape.rank;
    int64_t rows = t->shape.dims[r - 2], cols = t->shape.dims[r - 1];
    int64_t strides[WF_MAX_RANK];
    op->packed = NULL;
    op->data = t->data;
    for (int d = 0; d < r; d++)
        strides[d] = t->strides[d];
    if (!blas_layout(rows, cols, strides[r - 2], strides[r - 1], trans, op)) {
        size_t bytes = (size_t)t->numel * wf_dtype_size(t->dtype);
        int rc = wf__cuda_tmp(s, bytes, name, &op->packed);
        if (rc == 0)
            rc = wf__cuda_pack(s, t, op->packed, name);
        if (rc < 0) {
            wf__cuda_tmp_free(s, op->packed);
            op->packed = NULL;
            return rc;
        }
        op->data = (const char *)op->packed;
        wf__contiguous_strides(t->shape, strides);
        if (!blas_layout(rows, cols, strides[r - 2], strides[r - 1], trans, op))
            return wf__err(WF_EINVAL, "%s: a %lld x %lld matrix is too large for cuBLAS", name,
                           (long long)rows, (long long)cols);
    }
    for (int d = 0; d < nb; d++) {
        int td = d - (nb - (r - 2));
        op->bst[d] = td < 0 || t->shape.dims[td] == 1 ? 0 : strides[td];
    }
    return 0;
}

/* The cuBLAS types of a dtype (wf__cuda_types_of()): storage, compute (f32 on TF32 tensor
 * cores when 'tf32'), and whether alpha/beta are doubles. */
static void blas_types(wf_dtype dt, bool tf32, cudaDataType_t *type, cublasComputeType_t *compute,
                       bool *f64)
{
    wf__cuda_types t = wf__cuda_types_of(dt);
    *type = t.blas;
    *compute = tf32 && t.blas == CUDA_R_32F ? CUBLAS_COMPUTE_32F_FAST_TF32 : t.blas_compute;
    *f64 = t.f64;
}

/* The checks of the CPU twin; gives M, N, K and out's batch rank. */
static int check_product(const char *name, bool trans_a, bool trans_b, const wf_tensor *a,
                         const wf_tensor *b, const wf_tensor *out, int64_t *M, int64_t *N,
                         int64_t *K, int *nb)
{
    wf_shape os;
    int rc = wf__ops_matmul_shape(name, trans_a, trans_b, a, b, out, M, N, K, &os);
    if (rc < 0)
        return rc;
    wf_dtype dt = a->dtype;
    *nb = os.rank - 2;
    if (*M > INT_MAX || *N > INT_MAX || *K > INT_MAX)
        return wf__err(WF_EINVAL, "%s: M %lld, N %lld, K %lld: cuBLAS takes at most %d", name,
                       (long long)*M, (long long)*N, (long long)*K, INT_MAX);
    return wf__kernel_check_out(name, out, dt, os);
}

/* out = op(a) op(b) (checked by check_product) on queue 'q'. */
static int gemm(const wf__cuda_queue *q, const char *name, bool tf32, bool trans_a, bool trans_b,
                const wf_tensor *a, const wf_tensor *b, wf_tensor *out, int64_t M, int64_t N,
                int64_t K, int nb)
{
    cudaStream_t s = q->stream;
    size_t es = wf_dtype_size(out->dtype);
    if (out->numel == 0)
        return 0;
    if (K == 0) {
        WF_CU_TRY(cudaMemsetAsync(out->data, 0, (size_t)out->numel * es, s), name,
                  "zeroing an empty product");
        return 0;
    }
    mm_operand oa, ob;
    int rc = operand(s, name, a, trans_a, nb, &oa);
    if (rc < 0)
        return rc;
    rc = operand(s, name, b, trans_b, nb, &ob);
    if (rc < 0) {
        wf__cuda_tmp_free(s, oa.packed);
        return rc;
    }
    /* Merge out's batch axes where a, b and out all step uniformly across them. */
    int64_t bdims[WF_MAX_RANK], sa[WF_MAX_RANK], sb[WF_MAX_RANK], sc[WF_MAX_RANK];
    int n = 0;
    int64_t cstride = M * N;
    int64_t cst[WF_MAX_RANK];
    for (int d = nb - 1; d >= 0; d--) {
        cst[d] = cstride;
        cstride *= out->shape.dims[d];
    }
    for (int d = 0; d < nb; d++) {
        int64_t dim = out->shape.dims[d];
        if (dim == 1)
            continue;
        if (n > 0 && sa[n - 1] == oa.bst[d] * dim && sb[n - 1] == ob.bst[d] * dim &&
            sc[n - 1] == cst[d] * dim) {
            bdims[n - 1] *= dim;
            sa[n - 1] = oa.bst[d];
            sb[n - 1] = ob.bst[d];
            sc[n - 1] = cst[d];
        } else {
            bdims[n] = dim;
            sa[n] = oa.bst[d];
            sb[n] = ob.bst[d];
            sc[n] = cst[d];
            n++;
        }
    }
    cudaDataType_t type;
    cublasComputeType_t compute;
    bool f64;
    blas_types(out->dtype, tf32, &type, &compute, &f64);
    const double one64 = 1, zero64 = 0;
    const float one32 = 1, zero32 = 0;
    const void *alpha = f64 ? (const void *)&one64 : (const void *)&one32;
    const void *beta = f64 ? (const void *)&zero64 : (const void *)&zero32;
    cublasOperation_t opa = oa.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t opb = ob.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasHandle_t h = q->cublas;
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    if (n <= 1 && (n == 0 || bdims[0] <= INT_MAX)) {
        int batch = n ? (int)bdims[0] : 1;
        st = cublasGemmStridedBatchedEx(h, opb, opa, (int)N, (int)M, (int)K, alpha, ob.data, type,
                                        (int)ob.ld, n ? sb[0] : 0, oa.data, type, (int)oa.ld,
                                        n ? sa[0] : 0, beta, out->data, type, (int)N,
                                        n ? sc[0] : M * N, batch, compute, CUBLAS_GEMM_DEFAULT);
    } else {
        /* Batch axes that no single stride walks: one call per batch matrix. */
        int64_t total = 1;
        for (int d = 0; d < n; d++)
            total *= bdims[d];
        for (int64_t i = 0; i < total && st == CUBLAS_STATUS_SUCCESS; i++) {
            int64_t rem = i, ao = 0, bo = 0, co = 0;
            for (int d = n - 1; d >= 0; d--) {
                int64_t c = rem % bdims[d];
                rem /= bdims[d];
                ao += c * sa[d];
                bo += c * sb[d];
                co += c * sc[d];
            }
            st = cublasGemmEx(h, opb, opa, (int)N, (int)M, (int)K, alpha, ob.data + bo * es, type,
                              (int)ob.ld, oa.data + ao * es, type, (int)oa.ld, beta,
                              (char *)out->data + co * es, type, (int)N, compute,
                              CUBLAS_GEMM_DEFAULT);
        }
    }
    wf__cuda_tmp_free(s, oa.packed);
    wf__cuda_tmp_free(s, ob.packed);
    if (st != CUBLAS_STATUS_SUCCESS) {
        char what[160];
        snprintf(what, sizeof what, "cublasGemm (%s, M %lld, N %lld, K %lld)",
                 wf_dtype_name(out->dtype), (long long)M, (long long)N, (long long)K);
        return wf__cublas_fail(st, name, what);
    }
    return 0;
}

/* wf__matmul_cuda() with TF32 for f32 when 'tf32'. */
static int matmul_tf32(const wf_kernel_ctx *ctx, bool tf32, bool trans_a, bool trans_b,
                       const wf_tensor *a, const wf_tensor *b, wf_tensor *out)
{
    int64_t M, N, K;
    int nb;
    int rc = check_product("matmul", trans_a, trans_b, a, b, out, &M, &N, &K, &nb);
    const wf__cuda_queue *q;
    if (rc < 0 || (rc = wf__cuda_enter(ctx, "matmul", &q)) < 0)
        return rc;
    return gemm(q, "matmul", tf32, trans_a, trans_b, a, b, out, M, N, K, nb);
}

int wf__matmul_cuda(const wf_kernel_ctx *ctx, bool trans_a, bool trans_b, const wf_tensor *a,
                    const wf_tensor *b, wf_tensor *out)
{
    return matmul_tf32(ctx, use_tf32.load(std::memory_order_relaxed), trans_a, trans_b, a, b, out);
}

/* ---- Epilogues ------------------------------------------------------------------------------- */

static bool epilogue_act(int act)
{
    return act == -1 || act == WF_UNARY_RELU || act == WF_UNARY_LEAKY_RELU ||
           act == WF_UNARY_GELU_ERF || act == WF_UNARY_GELU_TANH || act == WF_UNARY_TANH ||
           act == WF_UNARY_SIGMOID || act == WF_UNARY_SILU;
}

/* cuBLASLt descriptors of one fused call, destroyed together. */
struct lt_call {
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
    cublasLtMatmulPreference_t pref = NULL;

    ~lt_call()
    {
        if (pref)
            cublasLtMatmulPreferenceDestroy(pref);
        if (lc)
            cublasLtMatrixLayoutDestroy(lc);
        if (lb)
            cublasLtMatrixLayoutDestroy(lb);
        if (la)
            cublasLtMatrixLayoutDestroy(la);
        if (op)
            cublasLtMatmulDescDestroy(op);
    }
};

/* Tries the fused cuBLASLt call: *done false (and 0) when the case is not one it takes or no
 * algorithm fits; then the caller runs the unfused path. */
static int lt_epilogue(const wf__cuda_queue *q, const char *name, bool tf32, bool trans_a,
                       bool trans_b, const wf_epilogue *ep, const wf_tensor *a, const wf_tensor *b,
                       const wf_tensor *bias, wf_tensor *out, int64_t M, int64_t N, int64_t K,
                       bool *done)
{
    *done = false;
    wf_dtype dt = out->dtype;
    if ((dt != WF_F32 && dt != WF_BF16 && dt != WF_F16) || !q->cublaslt || K == 0 ||
        out->numel == 0)
        return 0;
    if (ep->act != -1 && ep->act != WF_UNARY_RELU && ep->act != WF_UNARY_GELU_TANH)
        return 0;
    if (b->shape.rank != 2)
        return 0;
    /* a's batch rows as one (rows x K) row-major matrix: a not transposed, unit stride along
     * K, and every batch axis stepping by the row stride times the rows below it. */
    int ra = a->shape.rank;
    int64_t rows = 1, lda = a->strides[ra - 2];
    if (trans_a || (K > 1 && a->strides[ra - 1] != 1))
        return 0;
    int64_t expect = lda;
    for (int d = ra - 2; d >= 0; d--) {
        if (a->shape.dims[d] != 1 && a->strides[d] != expect)
            return 0;
        expect *= a->shape.dims[d];
        rows *= a->shape.dims[d];
    }
    if (rows <= 1)
        lda = K > 1 ? K : 1;
    if (rows > INT_MAX || lda < (K > 1 ? K : 1))
        return 0;
    mm_operand ob;
    if (!blas_layout(b->shape.dims[0], b->shape.dims[1], b->strides[0], b->strides[1], trans_b,
                     &ob))
        return 0;
    ob.data = b->data;
    if (bias && (bias->shape.dims[bias->shape.rank - 1] != N ||
                 (N > 1 && bias->strides[bias->shape.rank - 1] != 1) || ep->bias_first))
        return 0; /* a broadcast scalar bias, a strided one, or bias + product: unfused */

    cudaDataType_t type;
    cublasComputeType_t compute;
    bool f64;
    blas_types(dt, tf32, &type, &compute, &f64);
    lt_call c;
    WF_CUBLAS_TRY(cublasLtMatmulDescCreate(&c.op, compute, CUDA_R_32F), name,
                  "cublasLtMatmulDescCreate");
    /* Column-major: D^T (N x rows) = op(B)^T (N x K) op(A)^T (K x rows). */
    cublasOperation_t opb = ob.trans ? CUBLAS_OP_T : CUBLAS_OP_N, opa = CUBLAS_OP_N;
    WF_CUBLAS_TRY(
        cublasLtMatmulDescSetAttribute(c.op, CUBLASLT_MATMUL_DESC_TRANSA, &opb, sizeof opb), name,
        "CUBLASLT_MATMUL_DESC_TRANSA");
    WF_CUBLAS_TRY(
        cublasLtMatmulDescSetAttribute(c.op, CUBLASLT_MATMUL_DESC_TRANSB, &opa, sizeof opa), name,
        "CUBLASLT_MATMUL_DESC_TRANSB");
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
    if (ep->act == WF_UNARY_RELU)
        epi = bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU;
    else if (ep->act == WF_UNARY_GELU_TANH)
        epi = bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
    else if (bias)
        epi = CUBLASLT_EPILOGUE_BIAS;
    WF_CUBLAS_TRY(
        cublasLtMatmulDescSetAttribute(c.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi), name,
        "CUBLASLT_MATMUL_DESC_EPILOGUE");
    if (bias) {
        const void *bp = bias->data;
        WF_CUBLAS_TRY(
            cublasLtMatmulDescSetAttribute(c.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof bp),
            name, "CUBLASLT_MATMUL_DESC_BIAS_POINTER");
        cudaDataType_t bt = type;
        WF_CUBLAS_TRY(cublasLtMatmulDescSetAttribute(c.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt,
                                                     sizeof bt),
                      name, "CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE");
    }
    uint64_t brows = ob.trans ? K : N, bcols = ob.trans ? N : K;
    WF_CUBLAS_TRY(cublasLtMatrixLayoutCreate(&c.lb, type, brows, bcols, ob.ld), name,
                  "cublasLtMatrixLayoutCreate (b)");
    WF_CUBLAS_TRY(cublasLtMatrixLayoutCreate(&c.la, type, K, rows, lda), name,
                  "cublasLtMatrixLayoutCreate (a)");
    WF_CUBLAS_TRY(cublasLtMatrixLayoutCreate(&c.lc, type, N, rows, N), name,
                  "cublasLtMatrixLayoutCreate (out)");
    WF_CUBLAS_TRY(cublasLtMatmulPreferenceCreate(&c.pref), name, "cublasLtMatmulPreferenceCreate");
    size_t ws = q->workspace ? q->workspace_bytes : 0;
    WF_CUBLAS_TRY(cublasLtMatmulPreferenceSetAttribute(
                      c.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
                  name, "CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES");
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(q->cublaslt, c.op, c.lb, c.la, c.lc, c.lc,
                                                       c.pref, 1, &res, &found);
    if (st != CUBLAS_STATUS_SUCCESS || found == 0)
        return 0; /* no fused kernel for this case: the caller runs it unfused */
    const float one = 1, zero = 0;
    WF_CUBLAS_TRY(cublasLtMatmul(q->cublaslt, c.op, &one, ob.data, c.lb, a->data, c.la, &zero,
                                 out->data, c.lc, out->data, c.lc, &res.algo, q->workspace, ws,
                                 q->stream),
                  name, "cublasLtMatmul");
    (void)M;
    *done = true;
    return 0;
}

/* wf__matmul_epilogue_cuda() with TF32 for f32 when 'tf32'. */
static int epilogue_tf32(const wf_kernel_ctx *ctx, bool tf32, bool trans_a, bool trans_b,
                         const wf_epilogue *ep, const wf_tensor *a, const wf_tensor *b,
                         const wf_tensor *bias, wf_tensor *out)
{
    const char *name = "matmul_epilogue";
    if (!ep || !epilogue_act(ep->act))
        return wf__err(WF_EINVAL,
                       "%s: activation %d is not relu, leaky_relu, gelu, gelu_tanh, "
                       "tanh, sigmoid or silu",
                       name, ep ? ep->act : -2);
    int64_t M, N, K;
    int nb;
    int rc = check_product(name, trans_a, trans_b, a, b, out, &M, &N, &K, &nb);
    if (rc == 0 && bias)
        rc = wf__ops_matmul_check_bias(name, bias, out->dtype, out->shape);
    const wf__cuda_queue *q;
    if (rc < 0 || (rc = wf__cuda_enter(ctx, name, &q)) < 0)
        return rc;
    bool done = false;
    rc = lt_epilogue(q, name, tf32, trans_a, trans_b, ep, a, b, bias, out, M, N, K, &done);
    if (rc < 0 || done)
        return rc;
    rc = gemm(q, name, tf32, trans_a, trans_b, a, b, out, M, N, K, nb);
    if (rc == 0 && bias)
        rc = ep->bias_first ? wf__binary_cuda(ctx, WF_BINARY_ADD, bias, out, out)
                            : wf__binary_cuda(ctx, WF_BINARY_ADD, out, bias, out);
    if (rc == 0 && ep->act >= 0)
        rc = wf__unary_cuda(ctx, (wf_unary_op)ep->act, ep->alpha, out, out);
    return rc;
}

int wf__matmul_epilogue_cuda(const wf_kernel_ctx *ctx, bool trans_a, bool trans_b,
                             const wf_epilogue *ep, const wf_tensor *a, const wf_tensor *b,
                             const wf_tensor *bias, wf_tensor *out)
{
    return epilogue_tf32(ctx, use_tf32.load(std::memory_order_relaxed), trans_a, trans_b, ep, a, b,
                         bias, out);
}

/* ---- The op defs' CUDA slots (matmul.c's kernels) -------------------------------------------- */

/* TF32 for node 'n': its session asked for it (attrs->dtype: WF__MATMUL_TF32, set by
 * runtime/compile/pass_mixed.c), or the process-wide test switch is on. */
static bool node_tf32(const wf_node *n)
{
    return n->attrs->dtype == WF__MATMUL_TF32 || use_tf32.load(std::memory_order_relaxed);
}

int wf__cuda_kernel_matmul(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                           wf_tensor **out)
{
    return matmul_tf32(ctx, node_tf32(n), n->attrs->transpose_a, n->attrs->transpose_b, in[0],
                       in[1], *out);
}

/* matmul_epilogue's attributes (matmul.c): 'axis' = the activation's wf_unary_op + 1 (0:
 * none), 'alpha', 'groups' 1 when the add was bias + product. */
int wf__cuda_kernel_matmul_epilogue(const wf_kernel_ctx *ctx, const wf_node *n,
                                    wf_tensor *const *in, wf_tensor **out)
{
    wf_epilogue ep;
    ep.act = n->attrs->axis - 1;
    ep.alpha = n->attrs->alpha;
    ep.bias_first = n->attrs->groups == 1;
    return epilogue_tf32(ctx, node_tf32(n), n->attrs->transpose_a, n->attrs->transpose_b, &ep,
                         in[0], in[1], n->n_inputs > 2 ? in[2] : NULL, *out);
}
