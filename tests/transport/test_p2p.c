/* tests/transport/test_p2p.c: rendezvous and point-to-point messages between forked ranks
 * on loopback: sizes from 0 bytes to 8 MiB, every pair of ranks, out-of-order keys, many
 * messages in flight, size mismatches, and the argument checks of a one-rank comm. */
#include "transport_util.h"

TestSuite(transport_p2p, .timeout = WF_TEST_TIMEOUT(60), .fini = wf_test_fini);

static uint8_t pattern(int src, int dst, size_t i, uint64_t key)
{
    return (uint8_t)(src * 31 + dst * 7 + i * 13 + key * 101 + (i >> 8));
}

static int check_buf(const uint8_t *b, size_t n, int src, int dst, uint64_t key)
{
    for (size_t i = 0; i < n; i++)
        if (b[i] != pattern(src, dst, i, key)) {
            fprintf(stderr, "byte %zu of %zu from rank %d to %d key %llu: %u, expected %u\n", i, n,
                    src, dst, (unsigned long long)key, b[i], pattern(src, dst, i, key));
            return 1;
        }
    return 0;
}

/* Every rank sends one message of each size to every rank (itself included) and receives
 * one from each. Receives are pre-posted before any send. */
static int all_pairs(wf_comm *c, int rank, int size, void *arg)
{
    static const size_t sizes[] = { 0, 1, 4096, 8u << 20 };
    TU_CHECK(wf_comm_rank(c) == rank && wf_comm_size(c) == size, "rank/size");
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        size_t n = sizes[si];
        uint8_t *out[TU_MAX_RANKS], *in[TU_MAX_RANKS];
        wf_comm_req *rs[TU_MAX_RANKS], *ss[TU_MAX_RANKS];
        uint64_t key = WF_COMM_KEY(si, 3);
        for (int p = 0; p < size; p++) {
            out[p] = malloc(n + 1);
            in[p] = malloc(n + 1);
            TU_CHECK(out[p] && in[p], "malloc");
            for (size_t i = 0; i < n; i++)
                out[p][i] = pattern(rank, p, i, key);
            memset(in[p], 0xee, n + 1);
            TU_OK(wf_comm_irecv(c, p, key, in[p], n, &rs[p]));
        }
        for (int p = 0; p < size; p++)
            TU_OK(wf_comm_isend(c, p, key, out[p], n, &ss[p]));
        for (int p = 0; p < size; p++) {
            TU_OK(wf_comm_wait(rs[p]));
            TU_OK(wf_comm_wait(ss[p]));
        }
        for (int p = 0; p < size; p++) {
            TU_CHECK(check_buf(in[p], n, p, rank, key) == 0, "payload from %d (%zu bytes)", p, n);
            TU_CHECK(in[p][n] == 0xee, "wrote past %zu bytes", n);
            free(out[p]);
            free(in[p]);
        }
    }
    return 0;
}
TU_REGISTER(all_pairs)

Test(transport_p2p, two_ranks_exchange_every_size_with_every_rank)
{
    tu_run_all(2, NULL, all_pairs, NULL, 0, 40);
}

Test(transport_p2p, three_ranks_exchange_every_size_with_every_rank)
{
    tu_run_all(3, NULL, all_pairs, NULL, 0, 40);
}

Test(transport_p2p, four_ranks_exchange_every_size_with_every_rank)
{
    tu_run_all(4, NULL, all_pairs, NULL, 0, 50);
}

Test(transport_p2p, messages_over_tcp_only_arrive_intact)
{
    wf_comm_opts o = { .tls = "tcp,self" };
    tu_run_all(2, &o, all_pairs, NULL, 0, 40);
}

/* Rank 0 sends keys 0..n-1 in order; rank 1 posts its receives in reverse order. Each
 * message lands in the buffer of its own key. Many are in flight at once. */
static int out_of_order(wf_comm *c, int rank, int size, void *arg)
{
    enum { N = 200, LEN = 1000 };

    int rounds = (int)wf_test_scaled(10, 3);
    static uint8_t bufs[N][LEN];
    for (int round = 0; round < rounds; round++) {
        wf_comm_req *rq[N];
        if (rank == 0) {
            for (int k = 0; k < N; k++) {
                for (int i = 0; i < LEN; i++)
                    bufs[k][i] = pattern(0, 1, (size_t)i, (uint64_t)k + (uint64_t)round);
                TU_OK(wf_comm_isend(c, 1, WF_COMM_KEY(round, k), bufs[k], LEN, &rq[k]));
            }
        } else {
            for (int k = N - 1; k >= 0; k--)
                TU_OK(wf_comm_irecv(c, 0, WF_COMM_KEY(round, k), bufs[k], LEN, &rq[k]));
        }
        for (int k = 0; k < N; k++)
            TU_OK(wf_comm_wait(rq[k]));
        if (rank == 1)
            for (int k = 0; k < N; k++)
                TU_CHECK(check_buf(bufs[k], LEN, 0, 1, (uint64_t)k + (uint64_t)round) == 0,
                         "key %d round %d", k, round);
        TU_OK(wf_comm_barrier(c));
    }
    return 0;
}
TU_REGISTER(out_of_order)

Test(transport_p2p, receives_posted_in_reverse_order_match_their_keys)
{
    tu_run_all(2, NULL, out_of_order, NULL, 0, 40);
}

/* Same key, many messages: they arrive in the order sent. */
static int same_key_in_order(wf_comm *c, int rank, int size, void *arg)
{
    enum { N = 500 };

    uint32_t v[N];
    wf_comm_req *rq[N];
    for (int i = 0; i < N; i++) {
        v[i] = rank == 0 ? (uint32_t)i * 2654435761u : 0;
        if (rank == 0)
            TU_OK(wf_comm_isend(c, 1, 77, &v[i], sizeof v[i], &rq[i]));
        else
            TU_OK(wf_comm_irecv(c, 0, 77, &v[i], sizeof v[i], &rq[i]));
    }
    for (int i = 0; i < N; i++)
        TU_OK(wf_comm_wait(rq[i]));
    for (int i = 0; rank == 1 && i < N; i++)
        TU_CHECK(v[i] == (uint32_t)i * 2654435761u, "message %d out of order", i);
    return 0;
}
TU_REGISTER(same_key_in_order)

Test(transport_p2p, messages_with_one_key_arrive_in_the_order_sent)
{
    tu_run_all(2, NULL, same_key_in_order, NULL, 0, 30);
}

/* A message of another size than the receive fails that receive with WF_EFORMAT, and the
 * comm stays usable. */
static int size_mismatch(wf_comm *c, int rank, int size, void *arg)
{
    uint8_t buf[64] = { 0 };
    if (rank == 0) {
        TU_OK(wf_comm_send(c, 1, 5, buf, 64));
        TU_OK(wf_comm_send(c, 1, 6, buf, 8));
    } else {
        int rc = wf_comm_recv(c, 0, 5, buf, 32); /* larger message than the buffer */
        TU_CHECK(rc == WF_EFORMAT, "got %s", wf_err_name(rc));
        TU_CHECK(strstr(wf_last_errmsg(), "rank 0"), "message: %s", wf_last_errmsg());
        rc = wf_comm_recv(c, 0, 6, buf, 16); /* smaller message than the buffer */
        TU_CHECK(rc == WF_EFORMAT, "got %s", wf_err_name(rc));
    }
    TU_OK(wf_comm_barrier(c));
    TU_OK(wf_comm_status(c));
    return 0;
}
TU_REGISTER(size_mismatch)

Test(transport_p2p, a_message_of_the_wrong_size_fails_the_receive_with_eformat)
{
    tu_run_all(2, NULL, size_mismatch, NULL, 0, 30);
}

/* Rendezvous many times in a row (fresh ports): every creation and goodbye completes. */
static int nothing(wf_comm *c, int rank, int size, void *arg)
{
    return wf_comm_status(c) == 0 ? 0 : 1;
}
TU_REGISTER(nothing)

Test(transport_p2p, repeated_rendezvous_and_goodbye_complete)
{
    int n = (int)wf_test_scaled(8, 3);
    for (int i = 0; i < n; i++)
        tu_run_all(2 + i % 3, NULL, nothing, NULL, 0, 20);
}

Test(transport_p2p, bad_arguments_are_refused_with_einval)
{
    wf_comm *c = NULL;
    cr_assert_eq(wf_comm_create(NULL, NULL, &c), WF_EINVAL);
    cr_assert_null(c);
    cr_assert_eq(wf_comm_create(NULL, &(wf_comm_opts){ .size = 0 }, &c), WF_EINVAL);
    cr_assert_eq(wf_comm_create(NULL, &(wf_comm_opts){ .rank = 2, .size = 2 }, &c), WF_EINVAL);
    cr_assert(strstr(wf_last_errmsg(), "rank 2"), "%s", wf_last_errmsg());
    cr_assert_eq(wf_comm_create(NULL, &(wf_comm_opts){ .size = 1, .addr = "nonsense" }, &c),
                 WF_EINVAL);
    cr_assert_eq(wf_comm_create(NULL, &(wf_comm_opts){ .size = 1, .addr = "127.0.0.1:0" }, &c),
                 WF_EINVAL);

    /* A one-rank comm: sends to itself work, bad arguments are refused. */
    tu_ucx_env();
    int rc = wf_comm_create(NULL, &(wf_comm_opts){ .size = 1 }, &c);
    cr_assert_eq(rc, 0, "%s: %s", wf_err_name(rc), wf_last_errmsg());
    uint32_t x = 42, y = 0;
    wf_comm_req *r;
    cr_assert_eq(wf_comm_isend(c, 1, 0, &x, 4, &r), WF_EINVAL);
    cr_assert_null(r);
    cr_assert_eq(wf_comm_isend(c, -1, 0, &x, 4, &r), WF_EINVAL);
    cr_assert_eq(wf_comm_isend(c, 0, 1ull << 40, &x, 4, &r), WF_EINVAL);
    cr_assert_eq(wf_comm_isend(c, 0, 0, NULL, 4, &r), WF_EINVAL);
    cr_assert_eq(wf_comm_isend(c, 0, 0, &x, 4, NULL), WF_EINVAL);
    cr_assert_eq(wf_comm_wait(NULL), WF_EINVAL);
    cr_assert_eq(wf_comm_irecv(c, 0, 9, &y, 4, &r), 0);
    cr_assert_eq(wf_comm_send(c, 0, 9, &x, 4), 0);
    cr_assert_eq(wf_comm_wait(r), 0);
    cr_assert_eq(y, 42);
    float f[3] = { 1, 2, 3 };
    cr_assert_eq(wf_comm_allreduce(c, f, f, 3, WF_U8, WF_REDUCE_SUM), WF_EINVAL);
    cr_assert_eq(wf_comm_allreduce(c, f, f, 3, WF_F32, (wf_reduce_op)9), WF_EINVAL);
    cr_assert_eq(wf_comm_allreduce(c, NULL, f, 3, WF_F32, WF_REDUCE_SUM), WF_EINVAL);
    cr_assert_eq(wf_comm_broadcast(c, f, 4, 1), WF_EINVAL);
    cr_assert_eq(wf_comm_allreduce(c, f, f, 3, WF_F32, WF_REDUCE_MEAN), 0);
    cr_assert_eq(f[2], 3.0f);
    cr_assert_eq(wf_comm_barrier(c), 0);
    cr_assert_eq(wf_comm_rank(NULL), WF_EINVAL);
    cr_assert_eq(wf_comm_barrier(NULL), WF_EINVAL);
    wf_comm_destroy(c);
    wf_comm_destroy(NULL);
}

Test(transport_p2p, dist_opts_come_from_weft_then_mpi_then_slurm)
{
    wf_comm_opts o = { 0 };
    unsetenv("WEFT_RANK");
    unsetenv("WEFT_SIZE");
    unsetenv("OMPI_COMM_WORLD_RANK");
    unsetenv("OMPI_COMM_WORLD_SIZE");
    unsetenv("PMI_RANK");
    unsetenv("PMI_SIZE");
    setenv("SLURM_PROCID", "3", 1);
    setenv("SLURM_NTASKS", "4", 1);
    cr_assert_eq(wf_dist_opts_from_env(&o), 1);
    cr_assert_eq(o.rank, 3);
    cr_assert_eq(o.size, 4);
    setenv("OMPI_COMM_WORLD_RANK", "1", 1);
    setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
    setenv("WEFT_ADDR", "10.0.0.1:5000", 1);
    cr_assert_eq(wf_dist_opts_from_env(&o), 1);
    cr_assert_eq(o.rank, 1);
    cr_assert_str_eq(o.addr, "10.0.0.1:5000");
    setenv("WEFT_RANK", "5", 1);
    setenv("WEFT_SIZE", "5", 1); /* rank not below size */
    cr_assert_eq(wf_dist_opts_from_env(&o), WF_EINVAL);
    cr_assert_eq(o.rank, 1, "opts unchanged on error");
    setenv("WEFT_SIZE", "x", 1);
    cr_assert_eq(wf_dist_opts_from_env(&o), WF_EINVAL);
    setenv("WEFT_SIZE", "6", 1);
    cr_assert_eq(wf_dist_opts_from_env(&o), 1);
    cr_assert_eq(o.rank, 5);
    cr_assert_eq(o.size, 6);
}

/* A blocking receive polls for itself (busy mode), but only for a while: waiting 1.2 s for a
 * late sender, it gets the message intact and uses well under the whole wait of CPU (it
 * polls 200 ms, then sleeps until the event fd says the message came). */
static double thread_cpu_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static int late_sender(wf_comm *c, int rank, int size, void *arg)
{
    uint8_t buf[4096];
    uint64_t key = WF_COMM_KEY(9, 9);
    if (rank == 1) {
        wf_test_sleep_us(1200000);
        for (size_t i = 0; i < sizeof buf; i++)
            buf[i] = pattern(1, 0, i, key);
        TU_OK(wf_comm_send(c, 0, key, buf, sizeof buf));
    } else {
        double cpu0 = thread_cpu_s();
        uint64_t t0 = wf_test_now_ns();
        TU_OK(wf_comm_recv(c, 1, key, buf, sizeof buf));
        double wall = (double)(wf_test_now_ns() - t0) / 1e9, cpu = thread_cpu_s() - cpu0;
        TU_CHECK(check_buf(buf, sizeof buf, 1, 0, key) == 0, "payload");
        TU_CHECK(wall > 1.0, "the receive returned after %.3f s, before the send", wall);
        TU_CHECK(cpu < 0.6 * wall, "the receive burned %.3f s of CPU in %.3f s", cpu, wall);
    }
    TU_OK(wf_comm_barrier(c));
    return 0;
}
TU_REGISTER(late_sender)

Test(transport_p2p, a_blocking_receive_polls_briefly_then_sleeps_until_the_message)
{
    tu_run_all(2, NULL, late_sender, NULL, 0, 30);
}
