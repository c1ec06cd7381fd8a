/* devices/cuda_blas.c: cuBLAS and cuBLASLt loaded on first use, not when libweft loads.
 * Owns: one definition of each cuBLAS/cuBLASLt function weft calls (same name and
 *   prototype as the toolkit's headers), forwarding to the real one, which is looked up with
 *   dlopen()/dlsym() the first time any of them is called.
 * Why: libcublasLt's relocations cost about 150 MB of resident memory in every process that
 *   loads it (measured here: a process that only dlopen()s it grows by 151 MB; libcublas
 *   needs it). Linked into libweft, every program using weft paid that on machines without a
 *   GPU, where nothing calls cuBLAS. Now only a process that opens a CUDA device and runs a
 *   product does.
 * Invariants: libweft's symbols are hidden unless WF_API, so these definitions never
 *   replace the real cuBLAS for the rest of a program (PyTorch in the same process keeps its
 *   own); a function that cannot be found returns CUBLAS_STATUS_NOT_INITIALIZED, which the
 *   callers' wf__cublas_check() turns into an error naming the call; the status-string
 *   functions return a fixed text instead.
 * Threads: any; the lookup is idempotent (dlopen and dlsym are thread-safe, and a pointer is
 *   published with an atomic store). */
#include <cublasLt.h>
#include <cublas_v2.h>

#include <dlfcn.h>
#include <stddef.h>

static void *lib(const char *name, void **handle)
{
    void *h = __atomic_load_n(handle, __ATOMIC_ACQUIRE);
    if (!h) {
        /* RTLD_LOCAL: the real symbols stay out of the global namespace. */
        h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
        if (h)
            __atomic_store_n(handle, h, __ATOMIC_RELEASE);
    }
    return h;
}

static void *blas_sym(const char *name)
{
    static void *handle;
    void *h = lib("libcublas.so." WF_CUBLAS_SOVERSION, &handle);
    return h ? dlsym(h, name) : NULL;
}

static void *lt_sym(const char *name)
{
    static void *handle;
    void *h = lib("libcublasLt.so." WF_CUBLAS_SOVERSION, &handle);
    return h ? dlsym(h, name) : NULL;
}

/* FORWARD(lookup, ret, name, (params), (args), fail): defines 'name' to call the real one. */
#define FORWARD(lookup, ret, name, params, args, fail)                          \
    ret CUBLASWINAPI name params                                                \
    {                                                                           \
        static ret(CUBLASWINAPI *real) params;                                  \
        ret(CUBLASWINAPI *f) params = __atomic_load_n(&real, __ATOMIC_ACQUIRE); \
        if (!f) {                                                               \
            *(void **)&f = lookup(#name);                                       \
            if (!f)                                                             \
                return fail;                                                    \
            __atomic_store_n(&real, f, __ATOMIC_RELEASE);                       \
        }                                                                       \
        return f args;                                                          \
    }

#define NOT_LOADED CUBLAS_STATUS_NOT_INITIALIZED

FORWARD(blas_sym, cublasStatus_t, cublasCreate_v2, (cublasHandle_t * h), (h), NOT_LOADED)
FORWARD(blas_sym, cublasStatus_t, cublasDestroy_v2, (cublasHandle_t h), (h), NOT_LOADED)
FORWARD(blas_sym, cublasStatus_t, cublasSetStream_v2, (cublasHandle_t h, cudaStream_t s), (h, s),
        NOT_LOADED)
FORWARD(blas_sym, cublasStatus_t, cublasSetWorkspace_v2, (cublasHandle_t h, void *ws, size_t bytes),
        (h, ws, bytes), NOT_LOADED)
FORWARD(blas_sym, const char *, cublasGetStatusName, (cublasStatus_t st), (st),
        "CUBLAS_STATUS_(libcublas not loaded)")
FORWARD(blas_sym, const char *, cublasGetStatusString, (cublasStatus_t st), (st),
        "libcublas could not be loaded")
FORWARD(blas_sym, cublasStatus_t, cublasGemmEx,
        (cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
         const void *alpha, const void *A, cudaDataType at, int lda, const void *B, cudaDataType bt,
         int ldb, const void *beta, void *C, cudaDataType ct, int ldc, cublasComputeType_t compute,
         cublasGemmAlgo_t algo),
        (h, ta, tb, m, n, k, alpha, A, at, lda, B, bt, ldb, beta, C, ct, ldc, compute, algo),
        NOT_LOADED)
FORWARD(blas_sym, cublasStatus_t, cublasGemmStridedBatchedEx,
        (cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
         const void *alpha, const void *A, cudaDataType at, int lda, long long int sa,
         const void *B, cudaDataType bt, int ldb, long long int sb, const void *beta, void *C,
         cudaDataType ct, int ldc, long long int sc, int batch, cublasComputeType_t compute,
         cublasGemmAlgo_t algo),
        (h, ta, tb, m, n, k, alpha, A, at, lda, sa, B, bt, ldb, sb, beta, C, ct, ldc, sc, batch,
         compute, algo),
        NOT_LOADED)

FORWARD(lt_sym, cublasStatus_t, cublasLtCreate, (cublasLtHandle_t * h), (h), NOT_LOADED)
FORWARD(lt_sym, cublasStatus_t, cublasLtDestroy, (cublasLtHandle_t h), (h), NOT_LOADED)
FORWARD(lt_sym, cublasStatus_t, cublasLtMatmul,
        (cublasLtHandle_t h, cublasLtMatmulDesc_t desc, const void *alpha, const void *A,
         cublasLtMatrixLayout_t ad, const void *B, cublasLtMatrixLayout_t bd, const void *beta,
         const void *C, cublasLtMatrixLayout_t cd, void *D, cublasLtMatrixLayout_t dd,
         const cublasLtMatmulAlgo_t *algo, void *ws, size_t ws_bytes, cudaStream_t s),
        (h, desc, alpha, A, ad, B, bd, beta, C, cd, D, dd, algo, ws, ws_bytes, s), NOT_LOADED)
FORWARD(lt_sym, cublasStatus_t, cublasLtMatmulAlgoGetHeuristic,
        (cublasLtHandle_t h, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t ad,
         cublasLtMatrixLayout_t bd, cublasLtMatrixLayout_t cd, cublasLtMatrixLayout_t dd,
         cublasLtMatmulPreference_t pref, int want, cublasLtMatmulHeuristicResult_t res[],
         int *got),
        (h, desc, ad, bd, cd, dd, pref, want, res, got), NOT_LOADED)
FORWARD(lt_sym, cublasStatus_t, cublasLtMatmulDescCreate,
        (cublasLtMatmulDesc_t * d, cublasComputeType_t compute, cudaDataType_t scale),
        (d, compute, scale), NOT_LOADED)
FORWARD(lt_sym, cublasStatus_t, cublasLtMatmulDescDestroy, (cublasLtMatmulDesc_t d), (d),
        NOT_LOADED)
FORWARD(lt_sym, cublasStatus_t, cublasLtMatmulDescSetAttribute,
        (cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, const void *buf, size_t n),
        (d, a, buf, n), NOT_LOADED)
FORWARD(lt_sym, cublasStatus_t, cublasLtMatmulPreferenceCreate, (cublasLtMatmulPreference_t * p),
        (p), NOT_LOADED)
FORWARD(lt_sym, cublasStatus_t, cublasLtMatmulPreferenceDestroy, (cublasLtMatmulPreference_t p),
        (p), NOT_LOADED)
FORWARD(lt_sym, cublasStatus_t, cublasLtMatmulPreferenceSetAttribute,
        (cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t a, const void *buf,
         size_t n),
        (p, a, buf, n), NOT_LOADED)
FORWARD(lt_sym, cublasStatus_t, cublasLtMatrixLayoutCreate,
        (cublasLtMatrixLayout_t * l, cudaDataType type, uint64_t rows, uint64_t cols, int64_t ld),
        (l, type, rows, cols, ld), NOT_LOADED)
FORWARD(lt_sym, cublasStatus_t, cublasLtMatrixLayoutDestroy, (cublasLtMatrixLayout_t l), (l),
        NOT_LOADED)
