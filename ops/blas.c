/* ops/blas.c: the one door to BLAS for the kernels of ops/ (matmul_cpu.c, conv_cpu.c): a
 * single-threaded, row-major GEMM on weft's private OpenBLAS.
 * Owns: the private OpenBLAS's one-time setup, the one mutable process-wide state of ops/
 *   (a pthread_once flag, docs/conventions.md, "State").
 * Which OpenBLAS, and why (measured, 2026-11-30): weft's workers split big products into
 *   tiles and call BLAS from several workers at once, each call single-threaded.
 *   - Debian's serial archive (libopenblas-serial-dev, 0.3.21, built without USE_LOCKING)
 *     is NOT safe for concurrent calls: its buffer pool is claimed without a lock, and two
 *     threads calling dgemm at once (M 8, N 256, K 16) got each other's packed panels: wrong
 *     values in a few calls of every 3000 (a two-thread test, and through weft's matmul).
 *   - The pthread archive (libopenblas-pthread-dev) locks its buffer pool. It is linked into
 *     libweft.so with its symbols hidden (ops/CMakeLists.txt), so it is weft's private copy:
 *     openblas_set_num_threads(1) on it changes no one else's BLAS, and each call then runs
 *     on the calling worker. Its constructor starts one server thread per core at load;
 *     blas_thread_shutdown_() stops them at load too (blas_load() below): with one thread
 *     OpenBLAS never needs them. Measured: 0 wrong results in 4 x 6000
 *     concurrent calls (the shapes above, 300^3, transposed with beta 1).
 *   Without the private archive (WF_BLAS_PRIVATE 0) weft calls the system's BLAS, one call
 *   per matrix, and matmul does not tile (matmul_cpu.c).
 * Not here: tiling (matmul_cpu.c), im2col (conv_cpu.c). */
#include "kernels.h"

#include <cblas.h>

#include <pthread.h>
#include <string.h>

#ifndef WF_BLAS_PRIVATE
#    define WF_BLAS_PRIVATE 0
#endif

#if WF_BLAS_PRIVATE
void gotoblas_init(void);
void openblas_set_num_threads(int n);
int blas_thread_shutdown_(void);

static pthread_once_t blas_once = PTHREAD_ONCE_INIT;

static void blas_setup(void)
{
    gotoblas_init(); /* idempotent: whichever of its constructor and ours runs first */
    openblas_set_num_threads(1);
    blas_thread_shutdown_();
}

/* At load, not at the first GEMM: OpenBLAS's own constructor starts its server threads,
 * which spin (sched_yield) for ~0.1 s before they sleep; in a process that does no GEMM for
 * a while that was 8-10% of a core over its first second (measured by the transport suite's
 * idle test). Stopped here, they never spin. */
__attribute__((constructor)) static void blas_load(void)
{
    pthread_once(&blas_once, blas_setup);
}
#endif

void wf__gemm(wf_dtype dt, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const void *A,
              int64_t lda, const void *B, int64_t ldb, bool acc, void *C, int64_t ldc)
{
    if (M == 0 || N == 0)
        return;
    if (K == 0) {
        size_t es = wf_dtype_size(dt);
        for (int64_t i = 0; i < M && !acc; i++)
            memset((char *)C + (size_t)(i * ldc) * es, 0, (size_t)N * es);
        return;
    }
#if WF_BLAS_PRIVATE
    pthread_once(&blas_once, blas_setup);
#endif
    CBLAS_TRANSPOSE a = ta ? CblasTrans : CblasNoTrans, b = tb ? CblasTrans : CblasNoTrans;
    if (dt == WF_F32)
        cblas_sgemm(CblasRowMajor, a, b, (int)M, (int)N, (int)K, 1.0f, A, (int)lda, B, (int)ldb,
                    acc ? 1.0f : 0.0f, C, (int)ldc);
    else
        cblas_dgemm(CblasRowMajor, a, b, (int)M, (int)N, (int)K, 1.0, A, (int)lda, B, (int)ldb,
                    acc ? 1.0 : 0.0, C, (int)ldc);
}

bool wf__blas_private(void)
{
    return WF_BLAS_PRIVATE;
}
