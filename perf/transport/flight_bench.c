/* perf/transport/flight_bench.c: what the flight recorder costs per operation: two
 * one-rank comms in one process, one with the recorder (the default) and one without
 * (wf_comm_opts.flight_off), run the same calls in alternating rounds; a one-rank
 * collective does everything a collective does but move data (checks, numbering, the
 * recorder), so the difference is the recorder's own cost.
 *   flight_bench [--calls N] [--rounds R] [--step-us US] [--per-step K] [--json]
 * Defaults: 60 rounds of 20,000 calls, and the fastest round counts: on a shared, loaded
 * machine (load average 30 on 2 cores) longer rounds were all preempted (1-3 us per call,
 * on and off alike), while short ones catch quiet moments (70-130 ns, steady).
 * For each comm: the fastest round's time per all-reduce of one f32 and per barrier. Then
 * the recorder's share of a training step that issues K collectives and takes US
 * microseconds (defaults: K = 8, US = 15000, a data-parallel MLP step with its gradient
 * buckets; pass your own). The peer is weft itself with the recorder off, in the same run.
 * Not here: the collectives' speed between ranks (allreduce_bench --flight-compare). */
#include "../bench_util.h"

#include <weft/weft.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    close(fd);
    return ntohs(a.sin_port);
}

static wf_comm *make(int off, char *addr, size_t cap)
{
    int port = free_port();
    snprintf(addr, cap, "127.0.0.1:%d", port);
    wf_comm *c = NULL;
    if (port < 0 ||
        wf_comm_create(NULL, &(wf_comm_opts){ .size = 1, .addr = addr, .flight_off = off }, &c) <
            0) {
        fprintf(stderr, "flight_bench: wf_comm_create: %s\n", wf_last_errmsg());
        return NULL;
    }
    return c;
}

/* Seconds per call of 'calls' all-reduces (what 0) or barriers (1) on 'c'. */
static double round_s(wf_comm *c, int what, int calls)
{
    float x = 1.0f;
    double t0 = bench_now_s();
    for (int i = 0; i < calls; i++) {
        int rc = what ? wf_comm_barrier(c) : wf_comm_allreduce(c, &x, &x, 1, WF_F32, WF_REDUCE_SUM);
        if (rc < 0) {
            fprintf(stderr, "flight_bench: %s\n", wf_last_errmsg());
            exit(1);
        }
    }
    return (bench_now_s() - t0) / calls;
}

int main(int argc, char **argv)
{
    int calls = 20000, rounds = 60, per_step = 8, step_us = 15000;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--calls") && i + 1 < argc) {
            if (bench_parse_int(argv[++i], 1, 100000000, &calls) < 0)
                return 2;
        } else if (!strcmp(argv[i], "--rounds") && i + 1 < argc) {
            if (bench_parse_int(argv[++i], 1, 1000, &rounds) < 0)
                return 2;
        } else if (!strcmp(argv[i], "--step-us") && i + 1 < argc) {
            if (bench_parse_int(argv[++i], 1, 1000000000, &step_us) < 0)
                return 2;
        } else if (!strcmp(argv[i], "--per-step") && i + 1 < argc) {
            if (bench_parse_int(argv[++i], 1, 1000000, &per_step) < 0)
                return 2;
        } else if (!strcmp(argv[i], "--json")) {
            json = true;
        } else {
            fprintf(stderr, "usage: flight_bench [--calls N] [--rounds R] [--step-us US] "
                            "[--per-step K] [--json]\n");
            return 2;
        }
    }
    char a0[32], a1[32];
    wf_comm *on = make(0, a0, sizeof a0), *off = make(1, a1, sizeof a1);
    if (!on || !off)
        return 1;
    static const char *const names[2] = { "allreduce_1xf32", "barrier" };
    for (int what = 0; what < 2; what++) {
        double best[2] = { 1e9, 1e9 };
        for (int r = 0; r < rounds; r++)
            for (int k = 0; k < 2; k++) { /* alternate, so that load hits both alike */
                double s = round_s(k ? off : on, what, calls);
                best[k] = s < best[k] ? s : best[k];
            }
        double cost = best[0] - best[1];
        double share = cost * per_step / (step_us * 1e-6) * 100;
        if (json)
            printf("{\"bench\":\"flight_%s\",\"on_ns\":%.1f,\"off_ns\":%.1f,\"cost_ns\":%.1f,"
                   "\"per_step\":%d,\"step_us\":%d,\"share_pct\":%.5f}\n",
                   names[what], best[0] * 1e9, best[1] * 1e9, cost * 1e9, per_step, step_us, share);
        else
            printf("flight %-16s on %7.1f ns  off %7.1f ns  recorder %6.1f ns/op  "
                   "%d ops per %d us step: %.4f%%\n",
                   names[what], best[0] * 1e9, best[1] * 1e9, cost * 1e9, per_step, step_us, share);
    }
    wf_comm_destroy(on);
    wf_comm_destroy(off);
    return 0;
}
