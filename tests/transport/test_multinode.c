/* tests/transport/test_multinode.c: weft-run's multi-node mode on one machine: two
 * launchers (--nnodes 2 --node-rank 0/1 --master 127.0.0.1:PORT, 2 ranks each) run
 * restart_train as one job of 4 ranks, with the bits of a 4-rank run of one launcher, also
 * through restarts that node 0 orders for both nodes; and when either launcher is SIGKILLed,
 * every rank of both nodes is gone within 1 s and the other launcher exits non-zero naming
 * the lost node. */
#include "launch_util.h"

#include <fcntl.h>
#include <signal.h>

#ifndef WF_WEFT_RUN
#    error "WF_WEFT_RUN and WF_RESTART_TRAIN must be defined by the build"
#endif

TestSuite(transport_multinode, .timeout = WF_TEST_TIMEOUT(180), .fini = wf_test_fini);

/* Starts node 'node' of 2 (2 ranks) of 'prog' (a shell word list) with output to 'log'. */
static pid_t start_prog(int node, int port, const char *wr, const char *prog, const char *log)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "exec %s --nnodes 2 --node-rank %d --master 127.0.0.1:%d --token multi -n 2 %s -- "
             "%s",
             WF_WEFT_RUN, node, port, wr, prog);
    tu_ucx_env(); /* inherited by the ranks */
    fflush(NULL);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0)
            _exit(126);
        dup2(fd, 1);
        dup2(fd, 2);
        close(fd);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    return pid;
}

/* start_prog() of restart_train 'targs'. */
static pid_t start_node(int node, int port, const char *wr, const char *targs, const char *log)
{
    char prog[2048];
    snprintf(prog, sizeof prog, "%s %s", WF_RESTART_TRAIN, targs);
    return start_prog(node, port, wr, prog, log);
}

/* Waits for 'pid' at most 's' seconds; returns its exit status, or -1 (then it is killed). */
static int wait_for(pid_t pid, double s)
{
    uint64_t t0 = wf_test_now_ns();
    int st;
    while (wf_test_now_ns() - t0 < (uint64_t)(s * 1e9)) {
        pid_t got = waitpid(pid, &st, WNOHANG);
        if (got == pid)
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        wf_test_sleep_us(10000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    return -1;
}

static void slurp(const char *path, char *out, size_t cap)
{
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(out, 1, cap - 1, f) : 0;
    out[n] = 0;
    if (f)
        fclose(f);
}

/* Runs the job on two nodes; fills both logs and returns node 0's and node 1's statuses. */
static void two_nodes(const char *wr, const char *targs, const char *dir, int codes[2], char *o0,
                      char *o1, size_t cap)
{
    int port = lu_free_port_pair();
    char l0[128], l1[128];
    snprintf(l0, sizeof l0, "%s/node0.log", dir);
    snprintf(l1, sizeof l1, "%s/node1.log", dir);
    pid_t n1 = start_node(1, port, wr, targs, l1); /* node 1 first: it waits for node 0 */
    pid_t n0 = start_node(0, port, wr, targs, l0);
    codes[0] = wait_for(n0, WF_TEST_TIMEOUT(90));
    codes[1] = wait_for(n1, WF_TEST_TIMEOUT(10));
    slurp(l0, o0, cap);
    slurp(l1, o1, cap);
}

static void same_bits_as_one_launcher(const char *wr, const char *kill)
{
    char ref[64], dir[64], targs[512], refc[128], dirc[128];
    static char out[1 << 18], o0[1 << 18], o1[1 << 18];
    lu_tmpdir(ref, sizeof ref);
    lu_tmpdir(dir, sizeof dir);
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "timeout %d %s -n 4 -- %s --dir %s --steps 30",
             (int)WF_TEST_TIMEOUT(60), WF_WEFT_RUN, WF_RESTART_TRAIN, ref);
    int code = lu_run(cmd, out, sizeof out);
    cr_assert_eq(code, 0, "one launcher, 4 ranks: exit %d:\n%s", code, out);
    snprintf(targs, sizeof targs, "--dir %s --steps 30%s%s", dir, kill ? " --kill " : "",
             kill ? kill : "");
    int codes[2];
    two_nodes(wr, targs, dir, codes, o0, o1, sizeof o0);
    cr_assert(codes[0] == 0 && codes[1] == 0, "exits %d %d\nnode 0:\n%s\nnode 1:\n%s", codes[0],
              codes[1], o0, o1);
    for (int r = 0; r < 4; r++) {
        unsigned long long want = lu_final_hash(out, r), got = lu_final_hash(r < 2 ? o0 : o1, r);
        cr_assert(want != 0 && got == want,
                  "rank %d: %016llx, want %016llx\nnode 0:\n%s\nnode 1:\n%s", r, got, want, o0, o1);
    }
    snprintf(refc, sizeof refc, "%s/final.safetensors", ref);
    snprintf(dirc, sizeof dirc, "%s/final.safetensors", dir);
    cr_assert(lu_same_file(refc, dirc), "final checkpoints differ");
    if (kill) { /* both launchers say so, with the same numbers */
        for (int k = 1; k <= 2; k++) {
            char line[64];
            snprintf(line, sizeof line, "weft-run: restart %d of 2 (incarnation %d): rank ", k,
                     k + 1);
            cr_assert(strstr(o0, line) && strstr(o1, line), "no '%s'\nnode 0:\n%s\nnode 1:\n%s",
                      line, o0, o1);
        }
    }
    lu_rmdir(ref);
    lu_rmdir(dir);
}

Test(transport_multinode, two_launchers_of_two_ranks_give_the_bits_of_one_of_four)
{
    same_bits_as_one_launcher("", NULL);
}

/* Rank 3 (node 1) is killed, then rank 0 (node 0) exits 7: node 0 restarts both nodes. */
Test(transport_multinode, restarts_span_both_nodes_and_keep_the_bits)
{
    same_bits_as_one_launcher("--restarts 2", "1:3:8:kill,2:0:17:exit");
}

/* Reads "[R] rank R pid P start S" lines of both logs until all 4 ranks said their pid. */
static bool rank_pids(const char *dir, pid_t pids[4])
{
    static char buf[1 << 16];
    uint64_t t0 = wf_test_now_ns();
    while (wf_test_now_ns() - t0 < (uint64_t)(WF_TEST_TIMEOUT(30) * 1e9)) {
        int got = 0;
        for (int node = 0; node < 2; node++) {
            char log[128];
            snprintf(log, sizeof log, "%s/node%d.log", dir, node);
            slurp(log, buf, sizeof buf);
            for (const char *p = strstr(buf, "] rank "); p; p = strstr(p + 1, "] rank ")) {
                int r, pid;
                if (sscanf(p, "] rank %d pid %d", &r, &pid) == 2 && r >= 0 && r < 4) {
                    pids[r] = pid;
                    got |= 1 << r;
                }
            }
        }
        if (got == 15)
            return true;
        wf_test_sleep_us(20000);
    }
    return false;
}

/* SIGKILL of node 'victim's launcher: every rank of both nodes goes within 1 s (the
 * victim's by their parent-death signal, the others when the launcher link breaks or their
 * comm sees the peers die), and the other launcher exits non-zero naming the lost node. */
static void kill_node_launcher(int victim)
{
    char dir[64], targs[256], l[128];
    static char o[1 << 16];
    lu_tmpdir(dir, sizeof dir);
    snprintf(targs, sizeof targs, "--dir %s --steps 100000000 --step-ms 2", dir);
    int port = lu_free_port_pair();
    pid_t nodes[2];
    for (int k = 1; k >= 0; k--) {
        snprintf(l, sizeof l, "%s/node%d.log", dir, k);
        nodes[k] = start_node(k, port, "", targs, l);
    }
    pid_t pids[4] = { 0, 0, 0, 0 };
    bool all = rank_pids(dir, pids);
    if (!all) {
        kill(nodes[0], SIGKILL);
        kill(nodes[1], SIGKILL);
    }
    cr_assert(all, "not every rank started");
    wf_test_sleep_us(200000); /* inside their loop of all-reduces */
    cr_assert_eq(kill(nodes[victim], SIGKILL), 0);
    cr_assert_eq(waitpid(nodes[victim], NULL, 0), nodes[victim]);
    uint64_t t0 = wf_test_now_ns();
    const double limit_s = WF_TEST_TIMEOUT(1.0);
    bool gone = false;
    while (!gone && wf_test_now_ns() - t0 < (uint64_t)(limit_s * 1e9)) {
        gone = lu_gone(pids[0]) && lu_gone(pids[1]) && lu_gone(pids[2]) && lu_gone(pids[3]);
        if (!gone)
            wf_test_sleep_us(5000);
    }
    double s = (double)(wf_test_now_ns() - t0) / 1e9;
    bool alive[4];
    for (int r = 0; r < 4; r++)
        if ((alive[r] = !lu_gone(pids[r])))
            kill(pids[r], SIGKILL); /* leave nothing behind */
    int other = 1 - victim;
    int code = wait_for(nodes[other], WF_TEST_TIMEOUT(10));
    snprintf(l, sizeof l, "%s/node%d.log", dir, other);
    slurp(l, o, sizeof o);
    cr_assert(gone, "%.1f s after node %d's launcher was killed, ranks still run: %s %s %s %s",
              limit_s, victim, alive[0] ? "alive" : "gone", alive[1] ? "alive" : "gone",
              alive[2] ? "alive" : "gone", alive[3] ? "alive" : "gone");
    cr_log_info("node %d's launcher killed: every rank gone after %.3f s", victim, s);
    cr_assert(code > 0, "node %d's launcher exited %d:\n%s", other, code, o);
    char want[64];
    snprintf(want, sizeof want, "node %d's launcher is gone", victim);
    cr_assert(strstr(o, want), "no '%s' from node %d:\n%s", want, other, o);
    lu_rmdir(dir);
}

Test(transport_multinode, killing_node_1s_launcher_ends_every_rank_within_a_second)
{
    kill_node_launcher(1);
}

Test(transport_multinode, killing_node_0s_launcher_ends_every_rank_within_a_second)
{
    kill_node_launcher(0);
}

/* Ranks that use no comm (a shell that sleeps): only the launcher link can end node 0's
 * when rank 3 (node 1) exits with 5; both launchers exit with 5, at once. */
Test(transport_multinode, a_rank_that_dies_on_one_node_ends_the_ranks_of_the_other)
{
    char dir[64], l0[128], l1[128];
    static char o0[1 << 16], o1[1 << 16];
    lu_tmpdir(dir, sizeof dir);
    snprintf(l0, sizeof l0, "%s/node0.log", dir);
    snprintf(l1, sizeof l1, "%s/node1.log", dir);
    const char *prog =
        "/bin/sh -c 'if [ $WEFT_RANK = 3 ]; then sleep 0.3; exit 5; fi; exec sleep 60'";
    int port = lu_free_port_pair();
    pid_t n1 = start_prog(1, port, "", prog, l1);
    pid_t n0 = start_prog(0, port, "", prog, l0);
    uint64_t t0 = wf_test_now_ns();
    int c0 = wait_for(n0, WF_TEST_TIMEOUT(10)), c1 = wait_for(n1, WF_TEST_TIMEOUT(5));
    double s = (double)(wf_test_now_ns() - t0) / 1e9;
    slurp(l0, o0, sizeof o0);
    slurp(l1, o1, sizeof o1);
    cr_assert(c0 == 5 && c1 == 5, "exits %d %d\nnode 0:\n%s\nnode 1:\n%s", c0, c1, o0, o1);
    cr_assert(strstr(o1, "rank 3 (pid") && strstr(o1, "exited with status 5"), "%s", o1);
    cr_assert_lt(s, WF_TEST_TIMEOUT(5.0), "the job took %.1f s to end", s);
    cr_log_info("rank 3 exited: both launchers gone %.3f s after their start", s);
    lu_rmdir(dir);
}

/* Sleeping ranks again: SIGKILL of node 1's launcher ends node 0's ranks through the link. */
Test(transport_multinode, a_lost_launcher_link_ends_ranks_that_use_no_comm)
{
    char dir[64], l0[128], l1[128];
    static char o0[1 << 16];
    lu_tmpdir(dir, sizeof dir);
    snprintf(l0, sizeof l0, "%s/node0.log", dir);
    snprintf(l1, sizeof l1, "%s/node1.log", dir);
    const char *prog = "/bin/sh -c 'echo started; exec sleep 60'";
    int port = lu_free_port_pair();
    pid_t n1 = start_prog(1, port, "", prog, l1);
    pid_t n0 = start_prog(0, port, "", prog, l0);
    uint64_t t0 = wf_test_now_ns();
    do { /* both nodes' ranks run */
        wf_test_sleep_us(20000);
        slurp(l0, o0, sizeof o0);
    } while (lu_count(o0, "started") < 2 && wf_test_now_ns() - t0 < 20000000000ull);
    cr_assert_eq(lu_count(o0, "started"), 2, "%s", o0);
    cr_assert_eq(kill(n1, SIGKILL), 0);
    waitpid(n1, NULL, 0);
    t0 = wf_test_now_ns();
    int c0 = wait_for(n0, WF_TEST_TIMEOUT(5));
    double s = (double)(wf_test_now_ns() - t0) / 1e9;
    slurp(l0, o0, sizeof o0);
    cr_assert_eq(c0, 1, "node 0 exited %d:\n%s", c0, o0);
    cr_assert(strstr(o0, "node 1's launcher is gone"), "%s", o0);
    cr_assert_lt(s, WF_TEST_TIMEOUT(3.0), "node 0 took %.1f s", s);
    cr_log_info("node 0's launcher ended its ranks %.3f s after node 1's was killed", s);
    lu_rmdir(dir);
}
