/* tests/transport/test_linkprobe.c: wf_comm_probe_links() on 3 rank processes on loopback:
 * every rank gets the same symmetric matrix of round trips (0 on the diagonal), the 1 MiB
 * round trip is slower than the 8-byte one on every pair, and the placement planner's fit
 * (wf_cluster_link_from_pingpong) turns each pair into a latency >= 0 and a bandwidth > 0;
 * bad arguments are refused. */
#include "transport_util.h"

#include <math.h>

TestSuite(transport_linkprobe, .timeout = WF_TEST_TIMEOUT(60), .fini = wf_test_fini);

static int probe_body(wf_comm *c, int rank, int size, void *arg)
{
    (void)arg;
    double s[9], l[9];
    TU_CHECK(wf_comm_probe_links(c, 2, 1, 5, s, l) == WF_EINVAL, "small >= large accepted");
    TU_OK(wf_comm_probe_links(c, 8, 1 << 20, 9, s, l));
    for (int a = 0; a < size; a++)
        for (int b = 0; b < size; b++) {
            double rs = s[a * size + b], rl = l[a * size + b];
            if (a == b) {
                TU_CHECK(rs == 0 && rl == 0, "diagonal %d: %g %g", a, rs, rl);
                continue;
            }
            TU_CHECK(rs == s[b * size + a] && rl == l[b * size + a], "not symmetric");
            TU_CHECK(rs > 0 && rl > rs, "pair %d-%d: %g s for 8 B, %g s for 1 MiB", a, b, rs, rl);
            double lat, bw;
            TU_OK(wf_cluster_link_from_pingpong(8, rs, 1 << 20, rl, &lat, &bw));
            TU_CHECK(lat >= 0 && bw > 0 && isfinite(bw), "lat %g bw %g", lat, bw);
            if (rank == 0 && a < b)
                printf("linkprobe: ranks %d-%d: rtt 8 B %.2f us, 1 MiB %.1f us -> latency %.2f "
                       "us, %.2f GB/s\n",
                       a, b, rs * 1e6, rl * 1e6, lat * 1e6, bw * 1e-9);
        }
    /* every rank has the same matrix: compare with rank 0's through a broadcast */
    double s0[9], l0[9];
    memcpy(s0, s, sizeof s0);
    memcpy(l0, l, sizeof l0);
    TU_OK(wf_comm_broadcast(c, s0, sizeof s0, 0));
    TU_OK(wf_comm_broadcast(c, l0, sizeof l0, 0));
    TU_CHECK(memcmp(s0, s, sizeof(double) * (size_t)(size * size)) == 0 &&
                 memcmp(l0, l, sizeof(double) * (size_t)(size * size)) == 0,
             "rank %d's matrix differs from rank 0's", rank);
    return 0;
}
TU_REGISTER(probe_body)

Test(transport_linkprobe, three_ranks_measure_every_pair_and_agree)
{
    tu_run t = { .size = 3, .body = probe_body, .timeout_s = WF_TEST_TIMEOUT(40) };
    tu_start(&t);
    cr_assert(tu_wait(&t), "the ranks did not finish within %.0f s (killed)", t.timeout_s);
    for (int r = 0; r < 3; r++)
        cr_assert(WIFEXITED(t.status[r]) && WEXITSTATUS(t.status[r]) == 0,
                  "rank %d: %s %d (see its stderr)", r,
                  WIFEXITED(t.status[r]) ? "exit status" : "killed by signal",
                  WIFEXITED(t.status[r]) ? WEXITSTATUS(t.status[r]) : WTERMSIG(t.status[r]));
}
