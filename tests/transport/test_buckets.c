/* tests/transport/test_buckets.c: gradient buckets (wf_comm_bucket) between 2 and 3 forked
 * ranks: many tensors of odd sizes, packed into small buckets (and some larger than a
 * bucket, all-reduced alone), give bitwise the result of one wf_comm_allreduce per tensor
 * and the serial reference, step after step with the same bucket; adding does not wait
 * for the network (a late rank holds the all-reduce, not the adds); bad input is refused.
 * A rank killed while the others wait on a bucket: test_failure.c.
 * Tolerance: none. Inputs are multiples of 1/4 below 16 in magnitude: sums over 3 ranks are
 * exact in f32, f64 and bf16 (8 significant bits), so every comparison is exact. */
#include "transport_util.h"

#include <math.h>

TestSuite(transport_buckets, .timeout = WF_TEST_TIMEOUT(90), .fini = wf_test_fini);

#define N_TENSORS 23

/* Odd sizes, some above a 1 KiB bucket (256 f32, 512 bf16), one empty. */
static const size_t counts[N_TENSORS] = { 1,  3,   7,  0,  31,  255, 256, 257, 1000, 2,  5, 77,
                                          13, 600, 64, 65, 129, 1,   9,   300, 3001, 11, 4 };

static double input(int r, size_t t, size_t i, int step)
{
    return (double)((long)((r * 7919u + t * 31u + i * 104729u + (size_t)step * 17u) % 101u) - 50) *
           0.25;
}

static void put(void *p, size_t i, wf_dtype dt, double v)
{
    if (dt == WF_F32) {
        ((float *)p)[i] = (float)v;
    } else if (dt == WF_F64) {
        ((double *)p)[i] = v;
    } else { /* bf16: exact, v has at most 8 significant bits */
        float f = (float)v;
        uint32_t u;
        memcpy(&u, &f, 4);
        ((uint16_t *)p)[i] = (uint16_t)(u >> 16);
    }
}

static double get(const void *p, size_t i, wf_dtype dt)
{
    if (dt == WF_F32)
        return ((const float *)p)[i];
    if (dt == WF_F64)
        return ((const double *)p)[i];
    uint32_t u = (uint32_t)((const uint16_t *)p)[i] << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

typedef struct bk_case {
    wf_dtype dt;
    wf_reduce_op op;
    size_t bucket_bytes;
    int steps;
} bk_case;

static int match_body(wf_comm *c, int rank, int size, void *arg)
{
    const bk_case *k = arg;
    size_t es = wf_dtype_size(k->dt);
    void *t[N_TENSORS], *ref[N_TENSORS];
    for (int i = 0; i < N_TENSORS; i++) {
        t[i] = malloc(counts[i] * es + 1);
        ref[i] = malloc(counts[i] * es + 1);
        TU_CHECK(t[i] && ref[i], "malloc");
    }
    wf_comm_bucket *b;
    TU_OK(wf_comm_bucket_create(
        c, &(wf_bucket_opts){ .dtype = k->dt, .op = k->op, .bucket_bytes = k->bucket_bytes }, &b));
    for (int step = 0; step < k->steps; step++) {
        for (int i = 0; i < N_TENSORS; i++)
            for (size_t e = 0; e < counts[i]; e++) {
                put(t[i], e, k->dt, input(rank, (size_t)i, e, step));
                put(ref[i], e, k->dt, input(rank, (size_t)i, e, step));
            }
        for (int i = 0; i < N_TENSORS; i++)
            TU_OK(wf_comm_bucket_add(b, t[i], counts[i]));
        TU_OK(wf_comm_bucket_wait(b));
        TU_CHECK(wf_comm_bucket_test(b) == 1, "nothing in flight after a wait");
        /* The per-tensor all-reduce, after the bucket's (one collective at a time). */
        for (int i = 0; i < N_TENSORS; i++)
            TU_OK(wf_comm_allreduce(c, ref[i], ref[i], counts[i], k->dt, k->op));
        for (int i = 0; i < N_TENSORS; i++) {
            TU_CHECK(memcmp(t[i], ref[i], counts[i] * es) == 0,
                     "step %d, tensor %d (%zu x %s): the bucket's result differs from the "
                     "per-tensor all-reduce",
                     step, i, counts[i], wf_dtype_name(k->dt));
            for (size_t e = 0; e < counts[i]; e++) {
                double want = 0;
                for (int r = 0; r < size; r++)
                    want += input(r, (size_t)i, e, step);
                if (k->op == WF_REDUCE_MEAN)
                    want /= size;
                double got = get(t[i], e, k->dt);
                /* A mean of quarters over 3 ranks is not exact: the dtype's rounding. */
                double tol = k->op == WF_REDUCE_MEAN ? (k->dt == WF_BF16 ? 1e-2 : 1e-6) : 0;
                TU_CHECK(fabs(got - want) <= tol * (1 + fabs(want)),
                         "step %d, tensor %d, element %zu: got %.9g, expected %.9g", step, i, e,
                         got, want);
            }
        }
    }
    wf_comm_bucket_destroy(b);
    for (int i = 0; i < N_TENSORS; i++) {
        free(t[i]);
        free(ref[i]);
    }
    return 0;
}
TU_REGISTER(match_body)

Test(transport_buckets, buckets_match_a_per_tensor_allreduce_on_two_and_three_ranks)
{
    bk_case f32 = { WF_F32, WF_REDUCE_SUM, 1024, 3 };
    bk_case bf16 = { WF_BF16, WF_REDUCE_SUM, 1024, 2 };
    bk_case f64 = { WF_F64, WF_REDUCE_MEAN, 4000, 2 };
    bk_case one = { WF_F32, WF_REDUCE_SUM, 0, 2 }; /* the 25 MiB default: one bucket */
    for (int size = 2; size <= 3; size++) {
        tu_run_all(size, NULL, match_body, &f32, sizeof f32, 60);
        tu_run_all(size, NULL, match_body, &bf16, sizeof bf16, 60);
        tu_run_all(size, NULL, match_body, &f64, sizeof f64, 60);
        tu_run_all(size, NULL, match_body, &one, sizeof one, 60);
    }
    /* Large buckets through the ring (small_bytes 256) over TCP, several chunks each. */
    bk_case ring = { WF_F32, WF_REDUCE_SUM, 8192, 2 };
    tu_run_all(3, &(wf_comm_opts){ .small_bytes = 256, .chunk_bytes = 512, .tls = "tcp,self" },
               match_body, &ring, sizeof ring, 60);
    tu_run_all(2, &(wf_comm_opts){ .small_bytes = 256, .chunk_bytes = 512 }, match_body, &ring,
               sizeof ring, 60);
}

/* Rank 1 starts adding 400 ms late: rank 0's adds (several full buckets) return at once,
 * its buckets are still in flight afterwards, and its wait ends only once rank 1 came. */
static int async_body(wf_comm *c, int rank, int size, void *arg)
{
    enum { N = 64, COUNT = 100 };

    float *x = malloc(N * COUNT * sizeof *x);
    TU_CHECK(x, "malloc");
    for (int i = 0; i < N * COUNT; i++)
        x[i] = (float)(rank + 1);
    wf_comm_bucket *b;
    TU_OK(wf_comm_bucket_create(c, &(wf_bucket_opts){ .dtype = WF_F32, .bucket_bytes = 2000 }, &b));
    uint64_t t0 = wf_test_now_ns();
    if (rank == 1)
        wf_test_sleep_us(400000);
    for (int i = 0; i < N; i++)
        TU_OK(wf_comm_bucket_add(b, x + i * COUNT, COUNT));
    double add_ms = (double)(wf_test_now_ns() - t0) / 1e6;
    if (rank == 0) {
        TU_CHECK(add_ms < 200, "64 adds took %.1f ms: they waited for the network", add_ms);
        TU_CHECK(wf_comm_bucket_test(b) == 0, "buckets done before rank 1 joined");
    }
    TU_OK(wf_comm_bucket_wait(b));
    double wait_ms = (double)(wf_test_now_ns() - t0) / 1e6;
    TU_CHECK(wait_ms >= 350, "rank %d: the wait ended after %.1f ms, before rank 1 came", rank,
             wait_ms);
    for (int i = 0; i < N * COUNT; i++)
        TU_CHECK(x[i] == 3.0f, "element %d: %g", i, x[i]);
    wf_comm_bucket_destroy(b);
    free(x);
    return 0;
}
TU_REGISTER(async_body)

Test(transport_buckets, adding_does_not_wait_for_a_late_rank)
{
    tu_run_all(2, NULL, async_body, NULL, 0, 60);
}

/* Bad input: refused with WF_EINVAL and a message; a bucket on one rank is the identity. */
static int bad_body(wf_comm *c, int rank, int size, void *arg)
{
    wf_comm_bucket *b = (wf_comm_bucket *)1;
    TU_CHECK(wf_comm_bucket_create(NULL, &(wf_bucket_opts){ .dtype = WF_F32 }, &b) == WF_EINVAL,
             "NULL comm");
    TU_CHECK(b == NULL, "out is cleared on failure");
    TU_CHECK(wf_comm_bucket_create(c, NULL, &b) == WF_EINVAL, "NULL opts");
    TU_CHECK(wf_comm_bucket_create(c, &(wf_bucket_opts){ .dtype = WF_U8 }, &b) == WF_EINVAL, "u8");
    TU_CHECK(strstr(wf_last_errmsg(), "u8"), "the message names the dtype: %s", wf_last_errmsg());
    TU_CHECK(wf_comm_bucket_create(c, &(wf_bucket_opts){ .dtype = WF_F32, .op = 77 }, &b) ==
                 WF_EINVAL,
             "op 77");
    TU_CHECK(wf_comm_bucket_add(NULL, &b, 1) == WF_EINVAL, "NULL bucket");
    TU_CHECK(wf_comm_bucket_wait(NULL) == WF_EINVAL, "NULL bucket");
    TU_CHECK(wf_comm_bucket_flush(NULL) == WF_EINVAL, "NULL bucket");
    TU_CHECK(wf_comm_bucket_test(NULL) == WF_EINVAL, "NULL bucket");
    wf_comm_bucket_destroy(NULL);
    TU_OK(wf_comm_bucket_create(c, &(wf_bucket_opts){ .dtype = WF_F32, .bucket_bytes = 8 }, &b));
    TU_CHECK(wf_comm_bucket_add(b, NULL, 3) == WF_EINVAL, "NULL data");
    TU_CHECK(strstr(wf_last_errmsg(), "3 elements"), "%s", wf_last_errmsg());
    TU_CHECK(wf_comm_bucket_add(b, NULL, SIZE_MAX) == WF_EINVAL, "overflow");
    float x[5] = { 1, 2, 3, 4, 5 }, y[1] = { 7 };
    TU_OK(wf_comm_bucket_add(b, NULL, 0));
    TU_OK(wf_comm_bucket_add(b, x, 5)); /* larger than the bucket: alone */
    TU_OK(wf_comm_bucket_add(b, y, 1));
    TU_OK(wf_comm_bucket_wait(b));
    TU_CHECK(x[0] == 1 && x[4] == 5 && y[0] == 7, "one rank: the identity");
    TU_OK(wf_comm_bucket_add(b, y, 1)); /* dropped by destroy, never sent */
    wf_comm_bucket_destroy(b);
    return 0;
}
TU_REGISTER(bad_body)

Test(transport_buckets, bad_input_is_refused)
{
    tu_run_all(1, NULL, bad_body, NULL, 0, 30);
}
