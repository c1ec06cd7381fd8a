/* transport/linkprobe.c: measuring every link between ranks by ping-pong of two sizes.
 * Owns: wf_comm_probe_links() (weft/transport.h).
 * How: pairs (a, b), a < b, in one lexicographic order that every rank follows (each rank
 *   takes part in its own pairs in that order, so no two ranks wait for each other in
 *   opposite orders); rank a sends, b echoes, 'reps' timed round trips per size after one
 *   untimed warm-up, and the median is kept (robust to a stray scheduling delay). Each rank
 *   then holds the row of the pairs it started; an all-gather gives every rank the matrix.
 * Why here: the planner (placement/) is pure and takes the numbers as data
 *   (wf_cluster_link_from_pingpong()); only the transport touches the network.
 * Keys: WF_COMM_KEY(2^24 - 1, 0xff00 + 0/1), a step no graph reaches while a comm starts.
 * Not here: turning round trips into latency and bandwidth (placement/cluster.c). */
#include "internal.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PING WF_COMM_KEY(0xffffffu, 0xff00u)
#define PONG WF_COMM_KEY(0xffffffu, 0xff01u)

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* One side of a pair for one size: 'first' sends and times. Writes the median. */
static int pingpong(wf_comm *c, int peer, bool first, void *buf, size_t bytes, int reps, double *t,
                    double *median)
{
    for (int i = -1; i < reps; i++) {
        double t0 = now_s();
        int rc;
        if (first) {
            if ((rc = wf_comm_send(c, peer, PING, buf, bytes)) < 0 ||
                (rc = wf_comm_recv(c, peer, PONG, buf, bytes)) < 0)
                return rc;
        } else {
            if ((rc = wf_comm_recv(c, peer, PING, buf, bytes)) < 0 ||
                (rc = wf_comm_send(c, peer, PONG, buf, bytes)) < 0)
                return rc;
        }
        if (i >= 0)
            t[i] = now_s() - t0;
    }
    qsort(t, (size_t)reps, sizeof *t, cmp_double);
    *median = reps % 2 ? t[reps / 2] : 0.5 * (t[reps / 2 - 1] + t[reps / 2]);
    return 0;
}

int wf_comm_probe_links(wf_comm *c, size_t small, size_t large, int reps, double *rtt_small,
                        double *rtt_large)
{
    if (!c || !rtt_small || !rtt_large)
        return wf__err(WF_EINVAL, "wf_comm_probe_links: NULL argument");
    if (small >= large || large > (size_t)1 << 30 || reps < 1 || reps > 10000)
        return wf__err(WF_EINVAL,
                       "wf_comm_probe_links: sizes %zu and %zu, reps %d: need small "
                       "< large <= 1 GiB and 1 .. 10000 reps",
                       small, large, reps);
    int me = wf_comm_rank(c), n = wf_comm_size(c), rc = 0;
    size_t nn = (size_t)n * (size_t)n;
    void *buf = calloc(1, large);
    double *t = malloc(sizeof *t * (size_t)reps);
    double *row = calloc(2 * (size_t)n, sizeof *row), *all = calloc(2 * nn, sizeof *all);
    if (!buf || !t || !row || !all) {
        rc = wf__err(WF_ENOMEM, "wf_comm_probe_links: no memory");
        goto out;
    }
    for (int a = 0; a < n && rc == 0; a++)
        for (int b = a + 1; b < n && rc == 0; b++) {
            if (me != a && me != b)
                continue;
            int peer = me == a ? b : a;
            double ms, ml;
            if ((rc = pingpong(c, peer, me == a, buf, small, reps, t, &ms)) < 0 ||
                (rc = pingpong(c, peer, me == a, buf, large, reps, t, &ml)) < 0)
                break;
            if (me == a) {
                row[b] = ms;
                row[n + b] = ml;
            }
        }
    if (rc == 0)
        rc = wf_comm_allgather(c, row, all, 2 * (size_t)n * sizeof *row);
    if (rc == 0)
        for (int a = 0; a < n; a++)
            for (int b = 0; b < n; b++) {
                int lo = a < b ? a : b, hi = a < b ? b : a;
                rtt_small[a * n + b] = a == b ? 0 : all[(size_t)lo * 2 * n + hi];
                rtt_large[a * n + b] = a == b ? 0 : all[(size_t)lo * 2 * n + n + hi];
            }
out:
    free(buf);
    free(t);
    free(row);
    free(all);
    return rc;
}
