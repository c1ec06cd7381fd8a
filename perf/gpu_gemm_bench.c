/* perf/gpu_gemm_bench.c: square GEMMs on the GPU through a weft graph against cuBLAS called
 * directly, f32 (sgemm, no TF32 on either side) and bf16 (f32 accumulation), n = 1024 ..
 * 8192; one JSON line per case and implementation:
 *   {"bench":"gpu_gemm","case":"gpu_sgemm_4096","impl":"weft","n":4096,"tflops":...,"ms":...}
 * How weft is timed: a static graph of placeholders a and b (fed host tensors every run, so
 *   each run copies them to the GPU once) and a chain c1 = a b, c(k+1) = ck b of R products
 *   on the GPU (wf_node_set_device), whose sum is fetched (a scalar). The time of one
 *   product is the slope between a chain of 1 and a chain of 1 + R (medians of the runs), so
 *   the copies and the fetch, paid once per run, cancel, while each node's scheduling,
 *   allocation and launch stay in. cuBLAS: the same product R times back to back between
 *   two events on one stream, in the same types (cublasGemmEx).
 * Without a CUDA device (or built without CUDA) it prints a line saying so and exits 0 with
 * --quick (the smoke test), 1 otherwise.
 * Usage: gpu_gemm_bench [--json] [--quick] [--sizes 1024,2048] [--dtypes f32,bf16] [--reps N]
 * Needs _GNU_SOURCE (bench_util.h), which the build defines for every source. */
#include "bench_util.h"

#include <weft/weft.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#define MAX_SIZES 16

typedef struct opts {
    bool json, quick;
    int n_sizes, reps;
    long sizes[MAX_SIZES];
    bool f32, bf16;
} opts;

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof v[0], cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static uint16_t f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40); /* NaN stays NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* An n x n host tensor of uniform values in [-s, s) (s = sqrt(3 / n): products keep unit
 * scale along the chain). */
static wf_tensor *random_matrix(wf_dtype dt, long n, uint64_t seed)
{
    size_t count = (size_t)n * (size_t)n;
    float s = (float)sqrt(3.0 / (double)n);
    void *buf = malloc(count * (dt == WF_BF16 ? 2 : 4));
    if (!buf)
        return NULL;
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
    for (size_t i = 0; i < count; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        float v = s * (2.0f * (float)(x >> 40) / (float)(1ull << 24) - 1.0f);
        if (dt == WF_BF16)
            ((uint16_t *)buf)[i] = f32_to_bf16(v);
        else
            ((float *)buf)[i] = v;
    }
    wf_tensor *t = wf_tensor_from(dt, WF_SHAPE(n, n), buf);
    free(buf);
    return t;
}

/* Median seconds of one run of a chain of 'chain' products through weft. */
static int weft_run(wf_runtime *rt, int gpu, wf_dtype dt, long n, int chain, int reps, double *sec)
{
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    if (!g)
        return -1;
    wf_node *a = wf_placeholder(g, "a", dt, WF_SHAPE(n, n));
    wf_node *b = wf_placeholder(g, "b", dt, WF_SHAPE(n, n));
    wf_node *c = a;
    int rc = 0;
    for (int k = 0; k < chain && rc == 0; k++) {
        c = wf_matmul(g, c, b);
        rc = c ? wf_node_set_device(c, gpu) : -1;
    }
    wf_node *sum = rc == 0 ? wf_reduce_sum(g, c, NULL, 0, false) : NULL;
    if (!sum || wf_node_set_device(sum, gpu) < 0) {
        fprintf(stderr, "gpu_gemm_bench: building the graph: %s\n", wf_graph_errmsg(g));
        wf_graph_destroy(g);
        return -1;
    }
    wf_session *s = NULL;
    wf_tensor *av = random_matrix(dt, n, 1), *bv = random_matrix(dt, n, 2);
    double *t = calloc((size_t)reps, sizeof *t);
    if (!av || !bv || !t || wf_session_create(g, NULL, &s) < 0) {
        fprintf(stderr, "gpu_gemm_bench: %s\n", av && bv && t ? wf_graph_errmsg(g) : "no memory");
        rc = -1;
    }
    wf_feed f[2] = { { a, av }, { b, bv } };
    for (int r = -1; r < reps && rc == 0; r++) { /* r = -1: warm-up */
        wf_tensor *out = NULL;
        double t0 = bench_now_s();
        rc = wf_session_run(s, f, 2, &sum, 1, &out, NULL, 0);
        if (rc < 0)
            fprintf(stderr, "gpu_gemm_bench: run: %s\n", wf_session_errmsg(s));
        else if (r >= 0)
            t[r] = bench_now_s() - t0;
        if (rc == 0 && !isfinite(wf_tensor_get(out, 0)))
            fprintf(stderr, "gpu_gemm_bench: warning: the chain's sum is %g\n",
                    wf_tensor_get(out, 0));
        wf_tensor_release(out);
    }
    if (rc == 0)
        *sec = median(t, reps);
    free(t);
    wf_tensor_release(av);
    wf_tensor_release(bv);
    wf_session_destroy(s);
    wf_graph_destroy(g);
    return rc;
}

#define CU(call, what)                                                                 \
    do {                                                                               \
        cudaError_t e_ = (call);                                                       \
        if (e_ != cudaSuccess) {                                                       \
            fprintf(stderr, "gpu_gemm_bench: %s: %s\n", what, cudaGetErrorString(e_)); \
            rc = -1;                                                                   \
            goto done;                                                                 \
        }                                                                              \
    } while (0)

/* Median seconds of one product through cuBLAS (R back to back, per product). */
static int cublas_run(wf_dtype dt, long n, int per, int reps, double *sec)
{
    int rc = 0;
    size_t es = dt == WF_BF16 ? 2 : 4, bytes = (size_t)n * (size_t)n * es;
    void *a = NULL, *b = NULL, *c = NULL;
    cudaStream_t st = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    cublasHandle_t h = NULL;
    double *t = calloc((size_t)reps, sizeof *t);
    wf_tensor *av = random_matrix(dt, n, 1), *bv = random_matrix(dt, n, 2);
    if (!t || !av || !bv) {
        fprintf(stderr, "gpu_gemm_bench: no memory\n");
        rc = -1;
        goto done;
    }
    CU(cudaMalloc(&a, bytes), "cudaMalloc");
    CU(cudaMalloc(&b, bytes), "cudaMalloc");
    CU(cudaMalloc(&c, bytes), "cudaMalloc");
    CU(cudaMemcpy(a, wf_tensor_data(av), bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
    CU(cudaMemcpy(b, wf_tensor_data(bv), bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
    CU(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "cudaStreamCreate");
    CU(cudaEventCreate(&e0), "cudaEventCreate");
    CU(cudaEventCreate(&e1), "cudaEventCreate");
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS ||
        cublasSetStream(h, st) != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "gpu_gemm_bench: cublasCreate failed\n");
        rc = -1;
        goto done;
    }
    cudaDataType_t type = dt == WF_BF16 ? CUDA_R_16BF : CUDA_R_32F;
    const float one = 1, zero = 0;
    for (int r = -1; r < reps; r++) {
        CU(cudaEventRecord(e0, st), "cudaEventRecord");
        for (int k = 0; k < per; k++) {
            cublasStatus_t s = cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, (int)n, (int)n, (int)n,
                                            &one, b, type, (int)n, a, type, (int)n, &zero, c, type,
                                            (int)n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
            if (s != CUBLAS_STATUS_SUCCESS) {
                fprintf(stderr, "gpu_gemm_bench: cublasGemmEx: %s\n", cublasGetStatusString(s));
                rc = -1;
                goto done;
            }
        }
        CU(cudaEventRecord(e1, st), "cudaEventRecord");
        CU(cudaEventSynchronize(e1), "cudaEventSynchronize");
        float ms = 0;
        CU(cudaEventElapsedTime(&ms, e0, e1), "cudaEventElapsedTime");
        if (r >= 0)
            t[r] = ms * 1e-3 / per;
    }
    *sec = median(t, reps);
done:
    if (h)
        cublasDestroy(h);
    if (e0)
        cudaEventDestroy(e0);
    if (e1)
        cudaEventDestroy(e1);
    if (st)
        cudaStreamDestroy(st);
    cudaFree(a);
    cudaFree(b);
    cudaFree(c);
    wf_tensor_release(av);
    wf_tensor_release(bv);
    free(t);
    return rc;
}

static void report(const opts *o, const char *kind, long n, const char *impl, double sec)
{
    double tflops = 2.0 * (double)n * (double)n * (double)n / sec * 1e-12;
    if (o->json)
        printf("{\"bench\":\"gpu_gemm\",\"case\":\"gpu_%s_%ld\",\"impl\":\"%s\",\"n\":%ld,"
               "\"tflops\":%.4g,\"ms\":%.4g}\n",
               kind, n, impl, n, tflops, sec * 1e3);
    else
        printf("gpu_%-10s n %5ld  %-6s  %8.3f ms  %8.2f TFLOP/s\n", kind, n, impl, sec * 1e3,
               tflops);
    fflush(stdout);
}

static int parse(int argc, char **argv, opts *o)
{
    const long def[] = { 1024, 2048, 4096, 8192 };
    o->n_sizes = 4;
    memcpy(o->sizes, def, sizeof def);
    o->reps = 5;
    o->f32 = o->bf16 = true;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--json")) {
            o->json = true;
        } else if (!strcmp(a, "--quick")) {
            o->quick = true;
            o->n_sizes = 1;
            o->sizes[0] = 256;
            o->reps = 1;
        } else if (!strcmp(a, "--reps") && v) {
            o->reps = atoi(v);
            i++;
            if (o->reps < 1 || o->reps > 1000)
                return fprintf(stderr, "gpu_gemm_bench: --reps %s: 1 .. 1000\n", v), -1;
        } else if (!strcmp(a, "--sizes") && v) {
            o->n_sizes = 0;
            for (char *p = argv[++i]; *p && o->n_sizes < MAX_SIZES;) {
                char *end;
                long n = strtol(p, &end, 10);
                if (end == p || n < 1 || n > 32768)
                    return fprintf(stderr, "gpu_gemm_bench: bad --sizes '%s'\n", v), -1;
                o->sizes[o->n_sizes++] = n;
                p = *end == ',' ? end + 1 : end;
            }
        } else if (!strcmp(a, "--dtypes") && v) {
            o->f32 = strstr(v, "f32") != NULL;
            o->bf16 = strstr(v, "bf16") != NULL;
            i++;
        } else {
            fprintf(stderr, "usage: gpu_gemm_bench [--json] [--quick] [--sizes 1024,2048] "
                            "[--dtypes f32,bf16] [--reps N]\n");
            return -1;
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    opts o;
    memset(&o, 0, sizeof o);
    if (parse(argc, argv, &o) < 0)
        return 2;
    wf_runtime *rt = NULL;
    if (wf_runtime_create(&rt, NULL) < 0) {
        fprintf(stderr, "gpu_gemm_bench: %s\n", wf_last_errmsg());
        return 1;
    }
    int gpus = wf_device_count_kind(rt, WF_DEVICE_CUDA);
    if (gpus < 1) {
        fprintf(stderr, "gpu_gemm_bench: skipped: no CUDA device\n");
        wf_runtime_destroy(rt);
        return o.quick ? 0 : 1;
    }
    int gpu = wf_device_count(rt) - gpus; /* the first GPU's id: after the CPU */
    int rc = 0;
    for (int d = 0; d < 2 && rc == 0; d++) {
        if (d == 0 ? !o.f32 : !o.bf16)
            continue;
        wf_dtype dt = d == 0 ? WF_F32 : WF_BF16;
        const char *kind = d == 0 ? "sgemm" : "bf16gemm";
        for (int i = 0; i < o.n_sizes && rc == 0; i++) {
            long n = o.sizes[i];
            /* products per timed chain: about 2 TFLOP of work for f32, more for bf16 */
            int per = (int)(2e12 / (2.0 * n * n * n) * (d ? 8 : 1));
            per = per < 2 ? 2 : per > 50 ? 50 : per;
            if (o.quick)
                per = 2;
            double t1, t2, tc;
            rc = weft_run(rt, gpu, dt, n, 1, o.reps, &t1);
            if (rc == 0)
                rc = weft_run(rt, gpu, dt, n, 1 + per, o.reps, &t2);
            if (rc == 0)
                report(&o, kind, n, "weft", (t2 - t1) / per > 0 ? (t2 - t1) / per : 1e-9);
            if (rc == 0)
                rc = cublas_run(dt, n, per, o.reps, &tc);
            if (rc == 0)
                report(&o, kind, n, "cublas", tc);
        }
    }
    wf_runtime_destroy(rt);
    return rc == 0 ? 0 : 1;
}
