/* tests/transport/test_collectives.c: all-reduce, reduce-scatter, all-gather, broadcast and
 * barrier between 2, 3 and 4 forked ranks, against a serial reference computed by every
 * rank from the same formula, for every op and dtype, sizes not divisible by the rank
 * count, both algorithms (recursive doubling and the chunked ring), repeated. Results must
 * also be bitwise equal on every rank (checked by all-gathering a hash).
 * Tolerances: the inputs are multiples of 1/4 below 16 in magnitude, so sums and maxima
 * are exact in every dtype (bf16 keeps 8 significant bits: 4 ranks x 12.5 = 200 quarters)
 * and are compared exactly; means divide by the rank count and are compared to the f64
 * reference within 1e-6 relative (f32), 1e-12 (f64), 1e-2 (bf16), or exactly (integers,
 * truncated as C does). */
#include "transport_util.h"

#include <math.h>

TestSuite(transport_collectives, .timeout = WF_TEST_TIMEOUT(90), .fini = wf_test_fini);

/* The input of rank r at element i: an integer number of quarters in [-12.5, 12.5]. */
static double input(int r, size_t i, uint32_t salt)
{
    return (double)((long)((r * 7919u + i * 104729u + salt * 31u) % 101u) - 50) * 0.25;
}

static double to_f64(const void *p, size_t i, wf_dtype dt)
{
    switch (dt) {
    case WF_F32:
        return ((const float *)p)[i];
    case WF_F64:
        return ((const double *)p)[i];
    case WF_I32:
        return ((const int32_t *)p)[i];
    case WF_I64:
        return (double)((const int64_t *)p)[i];
    case WF_BF16: {
        uint32_t u = (uint32_t)((const uint16_t *)p)[i] << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    default:
        return NAN;
    }
}

/* Integers get 4x the value (whole quarters) so that they are not all small. */
static void store(void *p, size_t i, wf_dtype dt, double v)
{
    switch (dt) {
    case WF_F32:
        ((float *)p)[i] = (float)v;
        break;
    case WF_F64:
        ((double *)p)[i] = v;
        break;
    case WF_I32:
        ((int32_t *)p)[i] = (int32_t)(v * 4);
        break;
    case WF_I64:
        ((int64_t *)p)[i] = (int64_t)(v * 4) * 1000000007ll;
        break;
    case WF_BF16: {
        float f = (float)v;
        uint32_t u;
        memcpy(&u, &f, 4);
        ((uint16_t *)p)[i] = (uint16_t)(u >> 16); /* exact: v has <= 8 significant bits */
        break;
    }
    default:
        break;
    }
}

static size_t esize(wf_dtype dt)
{
    return wf_dtype_size(dt);
}

static bool is_int(wf_dtype dt)
{
    return dt == WF_I32 || dt == WF_I64;
}

/* The reference of element i over 'size' ranks, in the dtype's own units. */
static double reference(int size, size_t i, wf_dtype dt, wf_reduce_op op, uint32_t salt)
{
    double acc = op == WF_REDUCE_MAX ? -INFINITY : 0;
    for (int r = 0; r < size; r++) {
        uint8_t tmp[8];
        store(tmp, 0, dt, input(r, i, salt));
        double v = to_f64(tmp, 0, dt);
        acc = op == WF_REDUCE_MAX ? fmax(acc, v) : acc + v;
    }
    if (op == WF_REDUCE_MEAN)
        acc = is_int(dt) ? trunc(acc / size) : acc / size;
    return acc;
}

static double tolerance(wf_dtype dt, wf_reduce_op op)
{
    if (op != WF_REDUCE_MEAN || is_int(dt))
        return 0;
    return dt == WF_F32 ? 1e-6 : dt == WF_F64 ? 1e-12 : 1e-2;
}

static uint64_t hash(const void *p, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ ((const uint8_t *)p)[i]) * 1099511628211ull;
    return h;
}

/* Every rank holds the same bits: all-gather the hashes and compare. */
static int same_everywhere(wf_comm *c, const void *p, size_t n, int size, const char *what)
{
    uint64_t h = hash(p, n), all[TU_MAX_RANKS];
    TU_OK(wf_comm_allgather(c, &h, all, sizeof h));
    for (int r = 0; r < size; r++)
        TU_CHECK(all[r] == h, "%s: rank %d holds other bits", what, r);
    return 0;
}

static const wf_dtype dtypes[] = { WF_F32, WF_F64, WF_I32, WF_I64, WF_BF16 };
static const wf_reduce_op ops[] = { WF_REDUCE_SUM, WF_REDUCE_MEAN, WF_REDUCE_MAX };

typedef struct ar_case { /* copied to each rank: no pointers */
    size_t counts[8];
    int n_counts;
    int reps;
} ar_case;

static int allreduce_body(wf_comm *c, int rank, int size, void *arg)
{
    const ar_case *k = arg;
    uint32_t salt = 0;
    for (int rep = 0; rep < k->reps; rep++)
        for (int ci = 0; ci < k->n_counts; ci++)
            for (size_t di = 0; di < sizeof dtypes / sizeof dtypes[0]; di++)
                for (size_t oi = 0; oi < sizeof ops / sizeof ops[0]; oi++) {
                    size_t n = k->counts[ci];
                    wf_dtype dt = dtypes[di];
                    wf_reduce_op op = ops[oi];
                    salt++;
                    uint8_t *send = malloc(n * esize(dt) + 1), *recv = malloc(n * esize(dt) + 1);
                    TU_CHECK(send && recv, "malloc");
                    for (size_t i = 0; i < n; i++)
                        store(send, i, dt, input(rank, i, salt));
                    bool in_place = (salt % 2) == 0;
                    TU_OK(wf_comm_allreduce(c, send, in_place ? send : recv, n, dt, op));
                    const uint8_t *res = in_place ? send : recv;
                    double tol = tolerance(dt, op);
                    for (size_t i = 0; i < n; i++) {
                        double want = reference(size, i, dt, op, salt), got = to_f64(res, i, dt);
                        TU_CHECK(fabs(got - want) <= tol * (1 + fabs(want)),
                                 "%s %s of %zu, element %zu: got %.9g, expected %.9g",
                                 wf_dtype_name(dt),
                                 op == WF_REDUCE_SUM    ? "sum"
                                 : op == WF_REDUCE_MEAN ? "mean"
                                                        : "max",
                                 n, i, got, want);
                    }
                    if (same_everywhere(c, res, n * esize(dt), size, "allreduce"))
                        return 1;
                    free(send);
                    free(recv);
                }
    return 0;
}
TU_REGISTER(allreduce_body)

/* Small counts take recursive doubling (up to small_bytes); with small_bytes 64 and
 * chunk_bytes 96 the larger ones take the ring with several chunks per block. */
#define SMALL_COUNTS { 0, 1, 2, 3, 5, 7, 31, 1000 }, 8
#define RING_COUNTS  { 37, 1001, 4099 }, 3
static const wf_comm_opts ring_opts = { .small_bytes = 64, .chunk_bytes = 96 };

Test(transport_collectives, allreduce_matches_the_reference_on_two_ranks)
{
    ar_case k = { SMALL_COUNTS, 2 };
    tu_run_all(2, NULL, allreduce_body, &k, sizeof k, 60);
    ar_case r = { RING_COUNTS, 1 };
    tu_run_all(2, &ring_opts, allreduce_body, &r, sizeof r, 60);
}

Test(transport_collectives, allreduce_matches_the_reference_on_three_ranks)
{
    ar_case k = { SMALL_COUNTS, 1 };
    tu_run_all(3, NULL, allreduce_body, &k, sizeof k, 60);
    ar_case r = { RING_COUNTS, 1 };
    tu_run_all(3, &ring_opts, allreduce_body, &r, sizeof r, 60);
}

Test(transport_collectives, allreduce_matches_the_reference_on_four_ranks)
{
    ar_case k = { SMALL_COUNTS, 1 };
    tu_run_all(4, NULL, allreduce_body, &k, sizeof k, 60);
    ar_case r = { RING_COUNTS, 1 };
    tu_run_all(4, &ring_opts, allreduce_body, &r, sizeof r, 60);
}

static int others_body(wf_comm *c, int rank, int size, void *arg);

/* On one host the ring reads its neighbour's memory (process_vm_readv); over TCP (as between
 * hosts) it sends the chunks: both paths must give the reference, on 2 and 3 ranks. */
Test(transport_collectives, the_copying_ring_over_tcp_matches_the_reference_too)
{
    wf_comm_opts o = ring_opts;
    o.tls = "tcp,self";
    ar_case r = { { 37, 4099 }, 2, 1 };
    tu_run_all(2, &o, allreduce_body, &r, sizeof r, 60);
    tu_run_all(3, &o, allreduce_body, &r, sizeof r, 60);
    tu_run_all(3, &(wf_comm_opts){ .chunk_bytes = 64, .tls = "tcp,self" }, others_body, NULL, 0,
               60);
}

/* A large all-reduce with the default options: 8 MiB + 3 floats through the ring. */
static int big_allreduce(wf_comm *c, int rank, int size, void *arg)
{
    size_t n = (2u << 20) + 3;
    float *x = malloc(n * sizeof *x);
    TU_CHECK(x, "malloc");
    int reps = (int)wf_test_scaled(3, 1);
    for (int rep = 0; rep < reps; rep++) {
        for (size_t i = 0; i < n; i++)
            x[i] = (float)input(rank, i, (uint32_t)rep);
        TU_OK(wf_comm_allreduce(c, x, x, n, WF_F32, WF_REDUCE_SUM));
        for (size_t i = 0; i < n; i += 997)
            TU_CHECK(x[i] == (float)reference(size, i, WF_F32, WF_REDUCE_SUM, (uint32_t)rep),
                     "element %zu: %g", i, x[i]);
        TU_CHECK(x[n - 1] == (float)reference(size, n - 1, WF_F32, WF_REDUCE_SUM, (uint32_t)rep),
                 "last element");
        if (same_everywhere(c, x, n * sizeof *x, size, "big allreduce"))
            return 1;
    }
    free(x);
    return 0;
}
TU_REGISTER(big_allreduce)

Test(transport_collectives, a_large_allreduce_takes_the_ring_and_is_exact)
{
    tu_run_all(2, NULL, big_allreduce, NULL, 0, 60);
    tu_run_all(3, NULL, big_allreduce, NULL, 0, 60);
}

/* reduce-scatter, all-gather, broadcast from every root, and barriers, many times. */
static int others_body(wf_comm *c, int rank, int size, void *arg)
{
    static const size_t counts[] = { 0, 1, 3, 10, 77, 5000 };
    int reps = (int)wf_test_scaled(5, 2);
    for (int rep = 0; rep < reps; rep++)
        for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++) {
            size_t n = counts[ci];
            uint32_t salt = (uint32_t)(rep * 100 + (int)ci);
            /* reduce-scatter (i64 sum and f32 max): block 'rank' of the reduction. */
            int64_t *in = malloc((n * (size_t)size + 1) * sizeof *in);
            int64_t *out = malloc((n + 1) * sizeof *out);
            TU_CHECK(in && out, "malloc");
            for (size_t i = 0; i < n * (size_t)size; i++)
                store(in, i, WF_I64, input(rank, i, salt));
            TU_OK(wf_comm_reduce_scatter(c, in, out, n, WF_I64, WF_REDUCE_SUM));
            for (size_t i = 0; i < n; i++) {
                double want = reference(size, (size_t)rank * n + i, WF_I64, WF_REDUCE_SUM, salt);
                TU_CHECK((double)out[i] == want, "reduce_scatter %zu: element %zu: %lld vs %.0f", n,
                         i, (long long)out[i], want);
            }
            float *fin = (float *)in, *fout = (float *)out;
            for (size_t i = 0; i < n * (size_t)size; i++)
                fin[i] = (float)input(rank, i, salt);
            TU_OK(wf_comm_reduce_scatter(c, fin, fout, n, WF_F32, WF_REDUCE_MAX));
            for (size_t i = 0; i < n; i++)
                TU_CHECK(fout[i] == (float)reference(size, (size_t)rank * n + i, WF_F32,
                                                     WF_REDUCE_MAX, salt),
                         "reduce_scatter max %zu: element %zu", n, i);
            free(in);
            free(out);

            /* all-gather of n bytes per rank. */
            uint8_t *mine = malloc(n + 1), *all = malloc(n * (size_t)size + 1);
            TU_CHECK(mine && all, "malloc");
            for (size_t i = 0; i < n; i++)
                mine[i] = (uint8_t)(rank * 37 + i + salt);
            TU_OK(wf_comm_allgather(c, mine, all, n));
            for (int r = 0; r < size; r++)
                for (size_t i = 0; i < n; i++)
                    TU_CHECK(all[(size_t)r * n + i] == (uint8_t)(r * 37 + i + salt),
                             "allgather %zu: rank %d byte %zu", n, r, i);
            /* broadcast from every root. */
            for (int root = 0; root < size; root++) {
                for (size_t i = 0; i < n; i++)
                    mine[i] = rank == root ? (uint8_t)(root * 11 + i * 3 + salt) : 0;
                TU_OK(wf_comm_broadcast(c, mine, n, root));
                for (size_t i = 0; i < n; i++)
                    TU_CHECK(mine[i] == (uint8_t)(root * 11 + i * 3 + salt),
                             "broadcast %zu from %d: byte %zu", n, root, i);
            }
            free(mine);
            free(all);
            TU_OK(wf_comm_barrier(c));
        }
    return 0;
}
TU_REGISTER(others_body)

Test(transport_collectives, reduce_scatter_allgather_broadcast_and_barrier_agree)
{
    for (int size = 2; size <= 4; size++)
        tu_run_all(size, &(wf_comm_opts){ .chunk_bytes = 64 }, others_body, NULL, 0, 60);
}

/* A barrier holds everyone until the last rank arrives: rank 'size-1' arrives 300 ms late;
 * nobody leaves before that. */
static int barrier_waits(wf_comm *c, int rank, int size, void *arg)
{
    int rounds = (int)wf_test_scaled(3, 2);
    for (int i = 0; i < rounds; i++) {
        uint64_t t0 = wf_test_now_ns();
        if (rank == size - 1)
            wf_test_sleep_us(300000);
        TU_OK(wf_comm_barrier(c));
        uint64_t ms = (wf_test_now_ns() - t0) / 1000000u;
        TU_CHECK(ms >= 250, "rank %d left the barrier after %llu ms", rank, (unsigned long long)ms);
    }
    return 0;
}
TU_REGISTER(barrier_waits)

Test(transport_collectives, a_barrier_waits_for_the_last_rank)
{
    tu_run_all(3, NULL, barrier_waits, NULL, 0, 30);
}
