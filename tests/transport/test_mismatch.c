/* tests/transport/test_mismatch.c: ranks that call different collectives at the same point
 * (another kind, dtype, count, op, root or graph hash) all fail with WF_EPEER within a round
 * trip, naming both ranks and both calls, instead of hanging until op_timeout_ms or returning
 * a wrong sum; matching calls with the same graph hash still work. On 2 to 8 ranks, with the
 * odd rank next to some ranks and far from others, for every collective and algorithm
 * (recursive doubling, the ring, the binomial tree, the dissemination barrier).
 * Ranks are real processes on loopback (transport_util.h); op_timeout_ms is 60 s, so a hang
 * shows as a wait far beyond the 2 s allowed. */
#include "transport_util.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

TestSuite(transport_mismatch, .timeout = WF_TEST_TIMEOUT(60), .fini = wf_test_fini);

/* What each rank calls: kind 0 all-reduce, 1 broadcast (from 'root'), 2 barrier, 3
 * allgather, 4 reduce-scatter. */
typedef struct call {
    int kind;
    wf_dtype dt;
    size_t count;
    wf_reduce_op op;
    uint64_t hash;
    int root;
    int delay_ms; /* waited before the call: a rank that comes late */
} call;

typedef struct plan {
    call calls[TU_MAX_RANKS]; /* by rank */
    char want[3][64];         /* substrings every rank's message must hold (no pointers: the plan
                                 is copied to other processes); empty: none */
    const char *tls; /* NULL: the default transports (a string literal: read in the parent) */
} plan;

static int do_call(wf_comm *c, const call *k, void *buf)
{
    if (k->hash && wf_comm_set_graph_hash(c, k->hash) < 0)
        return WF_EINVAL;
    switch (k->kind) {
    case 0:
        return wf_comm_allreduce(c, buf, buf, k->count, k->dt, k->op);
    case 1:
        return wf_comm_broadcast(c, buf, k->count, k->root);
    case 3:
        return wf_comm_allgather(c, buf, (char *)buf + 65536, k->count);
    case 4: /* 'count' per rank, of at most 5 ranks: the output after the input */
        return wf_comm_reduce_scatter(c, buf, (float *)buf + 5 * k->count, k->count, k->dt, k->op);
    default:
        return wf_comm_barrier(c);
    }
}

static int mismatch_body(wf_comm *c, int rank, int size, void *arg)
{
    const plan *p = arg;
    static float buf[1 << 20]; /* 4 MiB: the largest call, and room for allgather's output */
    for (int i = 0; i < (int)(sizeof buf / sizeof buf[0]); i++)
        buf[i] = 1.0f;
    /* One matching all-reduce first: the mismatch is at a later collective number. */
    float one = 1.0f;
    uint64_t t0 = wf_test_now_ns();
    int rc = wf_comm_allreduce(c, &one, &one, 1, WF_F32, WF_REDUCE_SUM);
    /* A rank still finishing it may already hear of the mismatch the others found in the
     * next call: the comm fails everywhere, whatever call each rank is in. */
    if (rc == 0) {
        TU_CHECK(one == (float)size, "warm-up sum %g", one);
        t0 = wf_test_now_ns();
        if (p->calls[rank].delay_ms)
            usleep((useconds_t)p->calls[rank].delay_ms * 1000u);
        rc = do_call(c, &p->calls[rank], buf);
    }
    double s = (double)(wf_test_now_ns() - t0) / 1e9;
    const char *msg = wf_last_errmsg();
    TU_CHECK(rc == WF_EPEER, "rank %d: got %s after %.2f s: %s", rank, wf_err_name(rc), s, msg);
    TU_CHECK(s < WF_TEST_TIMEOUT(2.0), "rank %d returned after %.2f s", rank, s);
    TU_CHECK(strstr(msg, "mismatched collectives"), "rank %d: %s", rank, msg);
    for (int i = 0; i < 3; i++)
        TU_CHECK(strstr(msg, p->want[i]), "rank %d: no '%s' in: %s", rank, p->want[i], msg);
    TU_CHECK(wf_comm_status(c) == WF_EPEER, "rank %d: the comm did not fail", rank);
    fprintf(stderr, "rank %d of %d: WF_EPEER after %.3f s: %s\n", rank, size, s, msg);
    return 0;
}
TU_REGISTER(mismatch_body)

static void run_plan(int size, const plan *p)
{
    tu_run_all(size, &(wf_comm_opts){ .op_timeout_ms = 60000, .tls = p->tls }, mismatch_body, p,
               sizeof *p, WF_TEST_TIMEOUT(20));
}

#define AR(dt_, n_, op_)                                   \
    {                                                      \
        .kind = 0, .dt = (dt_), .count = (n_), .op = (op_) \
    }

Test(transport_mismatch, allreduce_against_broadcast_fails_both_ranks_naming_both_calls)
{
    plan p = { .calls = { AR(WF_F32, 1000, WF_REDUCE_SUM), { .kind = 1, .count = 40 } },
               .want = { "rank 0 called allreduce #", " (f32 x 1000, sum), rank 1 called "
                                                      "broadcast #" } };
    run_plan(2, &p);
}

Test(transport_mismatch, a_dtype_mismatch_of_equal_size_fails_instead_of_a_wrong_sum)
{
    /* f32 and i32 of one count move the same bytes: without the check this is a wrong sum. */
    plan p = { .calls = { AR(WF_F32, 1000, WF_REDUCE_SUM), AR(WF_I32, 1000, WF_REDUCE_SUM) },
               .want = { "(f32 x 1000, sum)", "rank 1 called allreduce #" } };
    run_plan(2, &p);
}

Test(transport_mismatch, a_count_mismatch_fails_both_ranks)
{
    /* 1000 floats go by recursive doubling, 400000 by the ring: their messages never match. */
    plan p = { .calls = { AR(WF_F32, 1000, WF_REDUCE_SUM), AR(WF_F32, 400000, WF_REDUCE_SUM) },
               .want = { "(f32 x 1000, sum)", "(f32 x 400000, sum)" } };
    run_plan(2, &p);
}

Test(transport_mismatch, an_op_mismatch_of_three_ranks_fails_every_rank)
{
    plan p = { .calls = { AR(WF_F32, 1000, WF_REDUCE_SUM), AR(WF_F32, 1000, WF_REDUCE_MAX),
                          AR(WF_F32, 1000, WF_REDUCE_SUM) },
               .want = { "(f32 x 1000, max)", "(f32 x 1000, sum)" } };
    run_plan(3, &p);
}

Test(transport_mismatch, a_count_mismatch_of_three_ranks_fails_every_rank)
{
    plan p = { .calls = { AR(WF_F32, 1000, WF_REDUCE_SUM), AR(WF_F32, 1000, WF_REDUCE_SUM),
                          AR(WF_F32, 10, WF_REDUCE_SUM) },
               .want = { "(f32 x 10, sum)", "(f32 x 1000, sum)" } };
    run_plan(3, &p);
}

Test(transport_mismatch, a_dtype_mismatch_of_three_ranks_fails_every_rank)
{
    plan p = { .calls = { AR(WF_F32, 1000, WF_REDUCE_SUM), AR(WF_I32, 1000, WF_REDUCE_SUM),
                          AR(WF_F32, 1000, WF_REDUCE_SUM) },
               .want = { "(i32 x 1000, sum)", "rank 1 called" } };
    run_plan(3, &p);
}

Test(transport_mismatch, a_barrier_against_an_allgather_fails_every_rank)
{
    plan p = { .calls = { { .kind = 2 }, { .kind = 3, .count = 64 }, { .kind = 2 } },
               .want = { "barrier #", "allgather #" } };
    run_plan(3, &p);
}

Test(transport_mismatch, calls_of_different_graphs_fail_every_rank)
{
    call a = AR(WF_F32, 100, WF_REDUCE_SUM), b = a;
    a.hash = 0x1111;
    b.hash = 0x2222;
    plan p = { .calls = { a, b }, .want = { "of graph 0x1111", "of graph 0x2222" } };
    run_plan(2, &p);
}

/* ---- 4 and 5 ranks: the odd rank has two neighbours, and ranks far from it --------------
 * Every rank, next to the odd one or not, must fail this call: none may return a result. */

/* A plan of 'n' ranks where every rank calls 'all' but rank 'odd', which calls 'other'. */
static plan odd_one(int n, call all, int odd, call other, const char *w0, const char *w1,
                    const char *w2)
{
    plan p = { 0 };
    for (int r = 0; r < n; r++)
        p.calls[r] = r == odd ? other : all;
    snprintf(p.want[0], sizeof p.want[0], "%s", w0);
    snprintf(p.want[1], sizeof p.want[1], "%s", w1);
    snprintf(p.want[2], sizeof p.want[2], "%s", w2);
    return p;
}

Test(transport_mismatch, an_op_mismatch_of_four_ranks_fails_ranks_far_from_the_odd_one)
{
    /* Recursive doubling moves the same bytes either way: rank 0 is not next to rank 2. */
    plan p =
        odd_one(4, (call)AR(WF_F32, 1000, WF_REDUCE_SUM), 2, (call)AR(WF_F32, 1000, WF_REDUCE_MAX),
                "rank 2 called allreduce #", "(f32 x 1000, max)", "(f32 x 1000, sum)");
    run_plan(4, &p);
}

Test(transport_mismatch, an_op_mismatch_of_eight_ranks_fails_every_rank)
{
    /* Three exchanges of recursive doubling: ranks 0-3 are never next to rank 5. */
    plan p =
        odd_one(8, (call)AR(WF_F32, 1000, WF_REDUCE_SUM), 5, (call)AR(WF_F32, 1000, WF_REDUCE_MAX),
                "rank 5 called allreduce #", "(f32 x 1000, max)", "(f32 x 1000, sum)");
    run_plan(8, &p);
}

/* A broadcast of 4000 bytes from root 0 where rank 'odd', a leaf of the binomial tree, asks
 * for 4004 and comes 200 ms late: the ranks whose bytes never pass through it (and the root)
 * have their result long before anyone could tell them of the mismatch, so they must wait
 * for its description (without that, they returned WF_OK: 1 of 4 ranks, 2 of 5, 5 of 8). */
static void late_leaf(int n, int odd)
{
    char who[64];
    snprintf(who, sizeof who, "rank %d called broadcast #", odd);
    plan p = odd_one(n, (call){ .kind = 1, .count = 4000 }, odd,
                     (call){ .kind = 1, .count = 4004, .delay_ms = 200 }, who,
                     "(4004 bytes, root 0)", "(4000 bytes, root 0)");
    run_plan(n, &p);
}

Test(transport_mismatch, a_late_broadcast_size_mismatch_of_four_ranks_fails_every_rank)
{
    late_leaf(4, 3); /* 0 -> 1 and 0 -> 2 -> 3: rank 1 is not next to rank 3 */
}

Test(transport_mismatch, a_late_broadcast_size_mismatch_of_five_ranks_fails_every_rank)
{
    late_leaf(5, 3); /* 0 -> 4, 0 -> 1, 0 -> 2 -> 3: ranks 0 and 1 are not next to 3 */
}

Test(transport_mismatch, a_late_broadcast_size_mismatch_of_eight_ranks_fails_every_rank)
{
    late_leaf(8, 3); /* 0 -> 4 -> 6 and the rest never touch rank 3 (a leaf under 2) */
}

Test(transport_mismatch, a_dtype_mismatch_of_five_ranks_fails_every_rank)
{
    plan p =
        odd_one(5, (call)AR(WF_F32, 1000, WF_REDUCE_SUM), 2, (call)AR(WF_I32, 1000, WF_REDUCE_SUM),
                "rank 2 called allreduce #", "(i32 x 1000, sum)", "(f32 x 1000, sum)");
    run_plan(5, &p);
}

Test(transport_mismatch, a_count_mismatch_of_five_ranks_fails_every_rank)
{
    plan p =
        odd_one(5, (call)AR(WF_F32, 1000, WF_REDUCE_SUM), 4, (call)AR(WF_F32, 10, WF_REDUCE_SUM),
                "rank 4 called allreduce #", "(f32 x 10, sum)", "(f32 x 1000, sum)");
    run_plan(5, &p);
}

Test(transport_mismatch, an_op_mismatch_in_the_ring_of_four_ranks_fails_every_rank)
{
    /* 100000 floats go by the ring (one copy on shared memory): same bytes, other sum. */
    plan p = odd_one(4, (call)AR(WF_F32, 100000, WF_REDUCE_SUM), 1,
                     (call)AR(WF_F32, 100000, WF_REDUCE_MAX), "rank 1 called allreduce #",
                     "(f32 x 100000, max)", "(f32 x 100000, sum)");
    run_plan(4, &p);
}

Test(transport_mismatch, a_count_mismatch_in_the_ring_of_five_ranks_fails_every_rank)
{
    plan p = odd_one(5, (call)AR(WF_F32, 100000, WF_REDUCE_SUM), 0,
                     (call)AR(WF_F32, 200000, WF_REDUCE_SUM), "rank 0 called allreduce #",
                     "(f32 x 200000, sum)", "(f32 x 100000, sum)");
    run_plan(5, &p);
}

Test(transport_mismatch, an_op_mismatch_in_the_copying_ring_over_tcp_fails_every_rank)
{
    plan p = odd_one(4, (call)AR(WF_F32, 100000, WF_REDUCE_SUM), 3,
                     (call)AR(WF_F32, 100000, WF_REDUCE_MEAN), "rank 3 called allreduce #",
                     "(f32 x 100000, mean)", "(f32 x 100000, sum)");
    p.tls = "tcp,self";
    run_plan(4, &p);
}

Test(transport_mismatch, allreduce_against_broadcast_of_four_ranks_fails_every_rank)
{
    plan p = odd_one(4, (call)AR(WF_F32, 10, WF_REDUCE_SUM), 2, (call){ .kind = 1, .count = 40 },
                     "rank 2 called broadcast #", "(40 bytes, root 0)", "(f32 x 10, sum)");
    run_plan(4, &p);
}

Test(transport_mismatch, a_broadcast_from_another_root_fails_every_rank)
{
    /* The binomial trees of roots 0 and 1 differ: without the check, a hang or a wrong copy. */
    plan p = odd_one(5, (call){ .kind = 1, .count = 4000 }, 3,
                     (call){ .kind = 1, .count = 4000, .root = 1 }, "rank 3 called broadcast #",
                     "(4000 bytes, root 1)", "(4000 bytes, root 0)");
    run_plan(5, &p);
}

Test(transport_mismatch, a_barrier_against_an_allgather_of_four_ranks_fails_every_rank)
{
    plan p = odd_one(4, (call){ .kind = 2 }, 0, (call){ .kind = 3, .count = 64 },
                     "rank 0 called allgather #", "(64 bytes per rank)", "barrier #");
    run_plan(4, &p);
}

Test(transport_mismatch, an_allgather_count_mismatch_of_five_ranks_fails_every_rank)
{
    plan p = odd_one(5, (call){ .kind = 3, .count = 64 }, 2, (call){ .kind = 3, .count = 68 },
                     "rank 2 called allgather #", "(68 bytes per rank)", "(64 bytes per rank)");
    run_plan(5, &p);
}

Test(transport_mismatch, a_reduce_scatter_op_mismatch_of_four_ranks_fails_every_rank)
{
    call rs = { .kind = 4, .dt = WF_F32, .count = 1000, .op = WF_REDUCE_SUM }, mx = rs;
    mx.op = WF_REDUCE_MAX;
    plan p = odd_one(4, rs, 1, mx, "rank 1 called reduce_scatter #", "(f32 x 1000 per rank, max)",
                     "(f32 x 1000 per rank, sum)");
    run_plan(4, &p);
}

/* The same graph hash on every rank (and calls of every kind): no false alarm, right sums. */
static int matching_body(wf_comm *c, int rank, int size, void *arg)
{
    (void)arg;
    TU_OK(wf_comm_set_graph_hash(c, 0xabcdef));
    for (int i = 0; i < 50; i++) {
        int64_t x = rank + i;
        TU_OK(wf_comm_allreduce(c, &x, &x, 1, WF_I64, WF_REDUCE_SUM));
        TU_CHECK(x == (int64_t)size * i + size * (size - 1) / 2, "step %d: %lld", i, (long long)x);
        int64_t b = rank == 1 ? 77 + i : 0;
        TU_OK(wf_comm_broadcast(c, &b, sizeof b, 1));
        TU_CHECK(b == 77 + i, "step %d: broadcast gave %lld", i, (long long)b);
        TU_OK(wf_comm_barrier(c));
    }
    return 0;
}
TU_REGISTER(matching_body)

Test(transport_mismatch, matching_calls_with_one_graph_hash_succeed)
{
    tu_run_all(3, NULL, matching_body, NULL, 0, WF_TEST_TIMEOUT(20));
}

Test(transport_mismatch, matching_calls_of_five_ranks_succeed)
{
    tu_run_all(5, NULL, matching_body, NULL, 0, WF_TEST_TIMEOUT(30));
}
