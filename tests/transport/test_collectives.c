/* tests/transport/test_collectives.c: all-reduce, reduce-scatter, all-gather, broadcast and
 * barrier between 2, 3 and 4 forked ranks, against a serial reference computed by every
 * rank from the same formula, for every op and dtype, sizes not divisible by the rank
 * count, both algorithms (recursive doubling and the chunked ring), repeated. Results must
 * also be bitwise equal on every rank (checked by all-gathering a hash), down to the bits
 * of max(-0, +0) and of NaN payloads. The small path reads 'send' in place: it must come out
 * untouched at any alignment; and creation's shared-memory warm-up is checked by the page
 * faults of the first rounds after it.
 * Tolerances: the inputs are multiples of 1/4 below 16 in magnitude, so sums and maxima
 * are exact in every dtype (bf16 keeps 8 significant bits: 4 ranks x 12.5 = 200 quarters)
 * and are compared exactly; means divide by the rank count and are compared to the f64
 * reference within 1e-6 relative (f32), 1e-12 (f64), 1e-2 (bf16), or exactly (integers,
 * truncated as C does). */
#include "transport_util.h"

#include <math.h>
#include <sys/resource.h>

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
                    /* Both algorithms (and the CMA ring) read 'send' without a copy first:
                     * it must come out as it went in. */
                    for (size_t i = 0; !in_place && i < n; i++) {
                        uint8_t want[8]; /* the widest dtype here */
                        store(want, 0, dt, input(rank, i, salt));
                        TU_CHECK(memcmp(want, send + i * esize(dt), esize(dt)) == 0,
                                 "%s: send element %zu of %zu changed", wf_dtype_name(dt), i, n);
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

/* Recursive doubling reduces 'send' straight into 'recv' (no copy first): 'send' must come
 * out untouched, at any alignment of the two (f32 and f64 sums, offsets of whole elements
 * from 0 to 15), and a 'recv' that overlaps 'send' without being it still gets the sum. */
static int alignment_body(wf_comm *c, int rank, int size, void *arg)
{
    (void)arg;

    enum { N = 1500, PAD = 16 };

    double *base = malloc((2 * N + 4 * PAD) * sizeof *base);
    TU_CHECK(base, "malloc");
    for (int dti = 0; dti < 2; dti++) {
        wf_dtype dt = dti ? WF_F64 : WF_F32;
        size_t es = esize(dt);
        uint8_t *mem = (uint8_t *)base;
        for (size_t so = 0; so < PAD; so += 3)
            for (size_t ro = 0; ro < PAD; ro += 5) {
                uint32_t salt = (uint32_t)(so * PAD + ro);
                uint8_t *send = mem + so * es, *recv = mem + (N + PAD + ro) * es;
                for (size_t i = 0; i < N; i++)
                    store(send, i, dt, input(rank, i, salt));
                TU_OK(wf_comm_allreduce(c, send, recv, N, dt, WF_REDUCE_SUM));
                for (size_t i = 0; i < N; i++) {
                    TU_CHECK(to_f64(send, i, dt) == input(rank, i, salt),
                             "%s, offsets %zu/%zu: send element %zu changed to %g",
                             wf_dtype_name(dt), so, ro, i, to_f64(send, i, dt));
                    double want = reference(size, i, dt, WF_REDUCE_SUM, salt);
                    TU_CHECK(to_f64(recv, i, dt) == want,
                             "%s, offsets %zu/%zu: element %zu: got %g, expected %g",
                             wf_dtype_name(dt), so, ro, i, to_f64(recv, i, dt), want);
                }
            }
        /* recv starts 7 elements into send: the two overlap. */
        uint8_t *send = mem, *recv = mem + 7 * es;
        for (size_t i = 0; i < N; i++)
            store(send, i, dt, input(rank, i, 99));
        TU_OK(wf_comm_allreduce(c, send, recv, N, dt, WF_REDUCE_SUM));
        for (size_t i = 0; i < N; i++)
            TU_CHECK(to_f64(recv, i, dt) == reference(size, i, dt, WF_REDUCE_SUM, 99),
                     "%s, overlapping: element %zu: got %g", wf_dtype_name(dt), i,
                     to_f64(recv, i, dt));
        if (same_everywhere(c, recv, N * es, size, "overlapping allreduce"))
            return 1;
    }
    free(base);
    return 0;
}
TU_REGISTER(alignment_body)

Test(transport_collectives, allreduce_leaves_send_alone_at_any_alignment)
{
    for (int size = 2; size <= 3; size++)
        tu_run_all(size, NULL, alignment_body, NULL, 0, 60);
}

/* Max of ties that differ in their bits (-0 and +0) and of NaNs with different payloads:
 * every rank must come out with the same bits (the lower rank's data goes first in every
 * reduction), in place and not, on 2 to 4 ranks (3: a rank folds into its partner). */
static int max_bits_body(wf_comm *c, int rank, int size, void *arg)
{
    (void)arg;

    enum { N = 37 };

    for (int in_place = 0; in_place < 2; in_place++) {
        float x[N], y[N];
        double dx[N], dy[N];
        for (int i = 0; i < N; i++) {
            uint32_t u = (i % 3 == 0)       ? 0x7fc00000u | (uint32_t)(rank * 64 + i) /* NaN */
                         : ((rank + i) % 2) ? 0x80000000u                             /* -0 */
                                            : 0u;                                     /* +0 */
            memcpy(&x[i], &u, sizeof u);
            uint64_t v = (i % 3 == 0)       ? 0x7ff8000000000000ull | (uint64_t)(rank * 64 + i)
                         : ((rank + i) % 2) ? 0x8000000000000000ull
                                            : 0ull;
            memcpy(&dx[i], &v, sizeof v);
        }
        float *fo = in_place ? x : y;
        double *dout = in_place ? dx : dy;
        TU_OK(wf_comm_allreduce(c, x, fo, N, WF_F32, WF_REDUCE_MAX));
        TU_OK(wf_comm_allreduce(c, dx, dout, N, WF_F64, WF_REDUCE_MAX));
        for (int i = 0; i < N; i++) {
            TU_CHECK(i % 3 == 0 ? isnan(fo[i]) && isnan(dout[i]) : fo[i] == 0 && dout[i] == 0,
                     "element %d: %g, %g", i, fo[i], dout[i]);
        }
        if (same_everywhere(c, fo, sizeof x, size, "f32 max") ||
            same_everywhere(c, dout, sizeof dx, size, "f64 max"))
            return 1;
    }
    return 0;
}
TU_REGISTER(max_bits_body)

Test(transport_collectives, max_of_signed_zeros_and_nans_has_the_same_bits_everywhere)
{
    for (int size = 2; size <= 4; size++)
        tu_run_all(size, NULL, max_bits_body, NULL, 0, 60);
}

/* Creation makes the first pass over UCX's shared-memory FIFOs itself (coll.c, shm_warmup),
 * so that the first small all-reduces of a program do not page-fault: without it, each of
 * the first 32 rounds here took ~3 minor faults in the calling thread (10-12 us instead of
 * 1.8 on 2 ranks). Faults are counted, not time, so that a loaded machine cannot fail the
 * test; and the first rounds are compared with the next ones, which carry the faults that
 * the sanitizers' own memory (ASan's quarantine, TSan's shadow) adds to every round. */
static long round_faults(wf_comm *c, const float *x, float *y, int n, int rounds)
{
    struct rusage r0, r1;
    if (getrusage(RUSAGE_THREAD, &r0) != 0)
        return -1;
    for (int k = 0; k < rounds; k++)
        if (wf_comm_barrier(c) != 0 ||
            wf_comm_allreduce(c, x, y, (size_t)n, WF_F32, WF_REDUCE_SUM) != 0)
            return -2;
    if (getrusage(RUSAGE_THREAD, &r1) != 0)
        return -1;
    return r1.ru_minflt - r0.ru_minflt;
}

static int first_rounds_body(wf_comm *c, int rank, int size, void *arg)
{
    (void)arg;

    enum { N = 1024, ROUNDS = 64 };

    float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y);
    TU_CHECK(x && y, "malloc");
    for (int i = 0; i < N; i++)
        x[i] = y[i] = (float)(rank + 1);
    long first = round_faults(c, x, y, N, ROUNDS), next = round_faults(c, x, y, N, ROUNDS);
    float y0 = y[0], ylast = y[N - 1];
    free(x);
    free(y);
    TU_CHECK(first >= 0 && next >= 0, "rounds failed (%ld): %s", first < 0 ? first : next,
             wf_last_errmsg());
    TU_CHECK(y0 == (float)(size * (size + 1) / 2) && ylast == y0, "sum %g", y0);
    /* Measured: 0-6 then 0; without the warm-up, 99 then 0. The sanitizers' own memory adds
     * faults to every round, unevenly: ASan saw 12-35 then 14-30, and once 298 then 195 on a
     * loaded machine; under TSan the folded rank of 3 saw 123-140 then 7-8 even with the
     * warm-up (TSan's shadow of UCX's descriptors, which its memcpy interceptor reads). So
     * the bound holds in the plain build only; the sanitizer builds check the sums. */
    TU_CHECK(WF_TEST_TSAN || WF_TEST_ASAN || first <= next + ROUNDS / 4,
             "rank %d: %ld minor page faults in the first %d rounds, %ld in the next %d", rank,
             first, ROUNDS, next, ROUNDS);
    return 0;
}
TU_REGISTER(first_rounds_body)

Test(transport_collectives, the_first_small_allreduces_take_no_page_faults)
{
    tu_run_all(2, NULL, first_rounds_body, NULL, 0, 60);
    tu_run_all(3, NULL, first_rounds_body, NULL, 0, 60);
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

/* A large all-reduce with the default options: 8 MiB + 3 floats through the ring (on 2 ranks
 * of one host, pair_cma's reads and writes of many pieces), in place and then into another
 * buffer, whose input must come out unchanged. */
static int big_allreduce(wf_comm *c, int rank, int size, void *arg)
{
    size_t n = (2u << 20) + 3;
    float *x = malloc(n * sizeof *x), *in = malloc(n * sizeof *in);
    TU_CHECK(x && in, "malloc");
    int reps = (int)wf_test_scaled(3, 2);
    for (int rep = 0; rep < reps; rep++) {
        for (size_t i = 0; i < n; i++)
            in[i] = x[i] = (float)input(rank, i, (uint32_t)rep);
        TU_OK(wf_comm_allreduce(c, rep % 2 ? in : x, x, n, WF_F32, WF_REDUCE_SUM));
        for (size_t i = 0; rep % 2 && i < n; i++)
            TU_CHECK(in[i] == (float)input(rank, i, (uint32_t)rep), "send element %zu changed", i);
        for (size_t i = 0; i < n; i += 997)
            TU_CHECK(x[i] == (float)reference(size, i, WF_F32, WF_REDUCE_SUM, (uint32_t)rep),
                     "element %zu: %g", i, x[i]);
        TU_CHECK(x[n - 1] == (float)reference(size, n - 1, WF_F32, WF_REDUCE_SUM, (uint32_t)rep),
                 "last element");
        if (same_everywhere(c, x, n * sizeof *x, size, "big allreduce"))
            return 1;
    }
    free(x);
    free(in);
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
