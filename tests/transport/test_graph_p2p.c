/* tests/transport/test_graph_p2p.c: values that cross ranks through graph nodes (wf_send,
 * wf_recv) in sessions given a communicator (wf_session_opts.comm): rank 0's graph computes
 * x * 2 and sends it, rank 1's graph receives it, adds 1 and fetches, for many runs in a loop
 * (keys carry the run count, so runs never mix); a receive whose node expects another shape
 * fails with WF_ESHAPE naming both ranks and both types, never a wrong value; a killed sender
 * fails the receiving run within 2 s with WF_EPEER naming it; send and recv without a
 * communicator fail placement with WF_ENODEV; the receives are spans on the trace, which
 * weft-trace counts, with their bytes, apart from the busy time; a 1 MiB value (a UCX
 * rendezvous, which needs the sender's progress after its post) reaches the receiver while
 * the sender's only worker runs a long chain of matmuls that waits for nothing.
 * Ranks are real processes on loopback (transport_util.h), each with its own runtime, on
 * which its comm's actor runs (the network is an actor of the scheduler: no worker waits in
 * a receive, so these runs work with 2 workers and a receive pending). */
#include "transport_util.h"

#include <fcntl.h>
#include <math.h>

TestSuite(transport_graph_p2p, .timeout = WF_TEST_TIMEOUT(60), .fini = wf_test_fini);

enum { M_LOOP, M_MISMATCH, M_KILL, M_BUSY };

/* M_BUSY: the value sent (1 MiB of f32), and the chain rank 0 runs after posting it. */
#define BUSY_N     262144
#define BUSY_DIM   2048
#define BUSY_ROWS  8
#define BUSY_CHAIN 128
#define BUSY_KEY   99

typedef struct p2p_arg {
    int mode;
    int runs;
    int ready_fd; /* M_KILL: each rank writes a byte once its session is made */
} p2p_arg;

/* Rank 0's input of run 'step': exact in f32, so x * 2 + 1 is exact too. */
static float x_of(int step, int i)
{
    return (float)step + 0.5f * (float)i;
}

/* Rank 0 of M_BUSY: sends x * 2 (1 MiB), then (after the send node, through its token) runs
 * BUSY_CHAIN matmuls of BUSY_DIM x BUSY_DIM on its one worker, and tells rank 1 how long
 * its run took. Rank 1 needs the sender's progress to finish the rendezvous: made by a
 * worker between tasks, it would wait for the whole chain. */
static int busy_sender(wf_comm *c)
{
    wf_graph *g = wf_graph_create(tu_rt, WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(BUSY_N));
    wf_node *snd = wf_send(g, wf_mul(g, x, wf_scalar(g, WF_F32, 2.0)), 1, 7);
    wf_node *w = wf_placeholder(g, "w", WF_F32, WF_SHAPE(BUSY_DIM, BUSY_DIM));
    wf_node *v = wf_placeholder(g, "v", WF_F32, WF_SHAPE(BUSY_ROWS, BUSY_DIM));
    wf_node *m = wf_add(g, v, snd); /* the token is 0: the chain starts once the send ran */
    for (int i = 0; i < BUSY_CHAIN; i++)
        m = wf_matmul(g, m, w);
    TU_CHECK(m, "%s", wf_graph_errmsg(g));
    wf_session *s = NULL;
    TU_OK(wf_session_create(g, &(wf_session_opts){ .comm = c }, &s));
    float *xs = malloc(BUSY_N * sizeof *xs), *ws = malloc(BUSY_DIM * BUSY_DIM * sizeof *ws);
    float *vs = calloc(BUSY_ROWS * BUSY_DIM, sizeof *vs);
    TU_CHECK(xs && ws && vs, "no memory");
    for (int i = 0; i < BUSY_N; i++)
        xs[i] = (float)(i % 1000);
    for (int i = 0; i < BUSY_DIM * BUSY_DIM; i++)
        ws[i] = 1.0f / BUSY_DIM; /* rows of the products stay bounded */
    wf_tensor *xt = wf_tensor_from(WF_F32, WF_SHAPE(BUSY_N), xs);
    wf_tensor *wt = wf_tensor_from(WF_F32, WF_SHAPE(BUSY_DIM, BUSY_DIM), ws);
    wf_tensor *vt = wf_tensor_from(WF_F32, WF_SHAPE(BUSY_ROWS, BUSY_DIM), vs);
    free(xs);
    free(ws);
    free(vs);
    wf_feed f[] = { { x, xt }, { w, wt }, { v, vt } };
    double secs = 0;
    for (int run = 0; run < 3; run++) { /* the first one compiles; the last one is timed */
        wf_tensor *out = NULL;
        TU_OK(wf_comm_barrier(c));
        uint64_t t0 = wf_test_now_ns();
        int rc = wf_session_run(s, f, 3, &m, 1, &out, &snd, 1);
        secs = (double)(wf_test_now_ns() - t0) / 1e9;
        TU_CHECK(rc == 0, "rank 0, run %d: %s: %s", run, wf_err_name(rc), wf_session_errmsg(s));
        wf_tensor_release(out);
    }
    TU_OK(wf_comm_send(c, 1, BUSY_KEY, &secs, sizeof secs));
    wf_tensor_release(xt);
    wf_tensor_release(wt);
    wf_tensor_release(vt);
    wf_session_destroy(s);
    wf_graph_destroy(g);
    return 0;
}

/* Rank 1 of M_BUSY: its receive of the last run must end well before rank 0's run (the
 * chain) does. */
static int busy_receiver(wf_comm *c)
{
    wf_graph *g = wf_graph_create(tu_rt, WF_STATIC);
    wf_node *r = wf_recv(g, WF_F32, WF_SHAPE(BUSY_N), 0, 7);
    wf_node *z = wf_add(g, r, wf_scalar(g, WF_F32, 1.0));
    TU_CHECK(z, "%s", wf_graph_errmsg(g));
    wf_session *s = NULL;
    TU_OK(wf_session_create(g, &(wf_session_opts){ .comm = c }, &s));
    double secs = 0;
    for (int run = 0; run < 3; run++) {
        wf_tensor *out = NULL;
        TU_OK(wf_comm_barrier(c));
        uint64_t t0 = wf_test_now_ns();
        int rc = wf_session_run(s, NULL, 0, &z, 1, &out, NULL, 0);
        secs = (double)(wf_test_now_ns() - t0) / 1e9;
        TU_CHECK(rc == 0, "rank 1, run %d: %s: %s", run, wf_err_name(rc), wf_session_errmsg(s));
        const float *v = wf_tensor_data_f32(out);
        for (int i = 0; i < BUSY_N; i += 4099)
            TU_CHECK(v[i] == (float)(i % 1000) * 2.0f + 1.0f, "run %d, element %d: %g", run, i,
                     v[i]);
        wf_tensor_release(out);
    }
    double sender_secs = 0;
    TU_OK(wf_comm_recv(c, 0, BUSY_KEY, &sender_secs, sizeof sender_secs));
    /* The chain must be long enough to tell the two apart (BUSY_CHAIN matmuls of 8 x 2048 by
     * 2048, 67 MFLOP each: 0.25-1 s on one core). */
    TU_CHECK(sender_secs >= 0.05, "rank 0's run took only %.3f s: no long chain to wait for",
             sender_secs);
    TU_CHECK(secs < 0.5 * sender_secs,
             "the 1 MiB receive took %.3f s while rank 0's busy run took %.3f s: the "
             "rendezvous waited for the sender's worker",
             secs, sender_secs);
    if (getenv("WF_TEST_VERBOSE"))
        fprintf(stderr, "receive %.4f s, sender's run %.4f s\n", secs, sender_secs);
    wf_session_destroy(s);
    wf_graph_destroy(g);
    return 0;
}

static int sender(wf_comm *c, const p2p_arg *a)
{
    int n = a->mode == M_MISMATCH ? 5 : 4;
    wf_graph *g = wf_graph_create(tu_rt, WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(n));
    wf_node *y = wf_mul(g, x, wf_scalar(g, WF_F32, 2.0));
    wf_node *snd = wf_send(g, y, 1, 7);
    TU_CHECK(snd, "wf_send: %s", wf_graph_errmsg(g));
    wf_session *s = NULL;
    TU_OK(wf_session_create(g, &(wf_session_opts){ .comm = c }, &s));
    if (a->mode == M_KILL) {
        TU_CHECK(write(a->ready_fd, "r", 1) == 1, "ready");
        for (;;) /* until the test kills this rank, never sending */
            wf_test_sleep_us(10000);
    }
    for (int step = 0; step < a->runs; step++) {
        float xs[5];
        for (int i = 0; i < n; i++)
            xs[i] = x_of(step, i);
        wf_tensor *xt = wf_tensor_from(WF_F32, WF_SHAPE(n), xs);
        wf_feed f = { x, xt };
        int rc = wf_session_run(s, &f, 1, NULL, 0, NULL, &snd, 1);
        wf_tensor_release(xt);
        TU_CHECK(rc == 0, "rank 0, run %d: %s: %s", step, wf_err_name(rc), wf_session_errmsg(s));
    }
    wf_session_destroy(s);
    wf_graph_destroy(g);
    return 0;
}

/* weft-trace reads the receiver's trace 'path' (its text in 'buf'): its network_transfers
 * has the recv transfers the file has, with their bytes; each run received one f32 [4]
 * value, 16 bytes (besides a header message), so 'runs' of the transfers carry 16 bytes; the
 * op kinds' self times still add up to the busy time; --svg draws the transfers. */
static int check_weft_trace(const char *path, const char *buf, int runs)
{
    long count = 0, bytes = 0, data = 0;
    const char *tag = "\"name\":\"recv\",\"cat\":\"transfer\"";
    for (const char *p = strstr(buf, tag); p; p = strstr(p + 1, tag)) {
        const char *b = strstr(p, "\"bytes\":");
        TU_CHECK(b, "a recv transfer without bytes");
        long n = strtol(b + 8, NULL, 10);
        count++;
        bytes += n;
        data += n == 4 * (long)sizeof(float);
    }
    TU_CHECK(data == runs, "%ld recv transfers of 16 bytes in the trace, not %d", data, runs);
    char cmd[256], out[1 << 16];
    snprintf(cmd, sizeof cmd, "%s --json %s", WF_WEFT_TRACE, path);
    FILE *p = popen(cmd, "r");
    TU_CHECK(p, "popen %s", cmd);
    size_t len = fread(out, 1, sizeof out - 1, p);
    out[len] = 0;
    int st = pclose(p);
    TU_CHECK(st == 0, "%s exited with %d: %s", cmd, st, out);
    const char *nt = strstr(out, "\"network_transfers\":[");
    TU_CHECK(nt, "no network_transfers in weft-trace's output: %s", out);
    const char *r = strstr(nt, "{\"name\":\"recv\",");
    TU_CHECK(r, "no recv in weft-trace's network_transfers: %s", nt);
    long got_count = -1, got_bytes = -1;
    TU_CHECK(sscanf(r, "{\"name\":\"recv\",\"count\":%ld,\"bytes\":%ld", &got_count, &got_bytes) ==
                 2,
             "unreadable: %.200s", r);
    TU_CHECK(got_count == count && got_bytes == bytes,
             "weft-trace: %ld recv transfers of %ld bytes; the trace has %ld of %ld", got_count,
             got_bytes, count, bytes);
    /* the transfers are not busy time: the op kinds' self times still add up to it (each
     * printed to 0.001 us: at most 0.0005 us of rounding per kind) */
    double busy = -1, sum = 0;
    int kinds = 0;
    const char *bu = strstr(out, "\"busy_us\":");
    TU_CHECK(bu && sscanf(bu, "\"busy_us\":%lf", &busy) == 1, "no busy_us: %s", out);
    const char *ops = strstr(out, "\"ops\":["), *ops_end = strstr(out, "],\"workers\"");
    TU_CHECK(ops && ops_end, "no ops: %s", out);
    for (const char *q = strstr(ops, "\"total_us\":"); q && q < ops_end;
         q = strstr(q + 1, "\"total_us\":"), kinds++)
        sum += strtod(q + 11, NULL);
    TU_CHECK(fabs(sum - busy) <= 0.0005 * (kinds + 1) + 1e-9 * busy,
             "the ops' self times add up to %.3f us, busy is %.3f us", sum, busy);
    /* --svg draws them: each run's data arrives before its add node starts, so inside the
     * step drawn */
    char svg[96];
    snprintf(svg, sizeof svg, "%s.svg", path);
    snprintf(cmd, sizeof cmd, "%s --svg %s %s > /dev/null", WF_WEFT_TRACE, svg, path);
    TU_CHECK(system(cmd) == 0, "%s failed", cmd);
    FILE *sf = fopen(svg, "r");
    TU_CHECK(sf, "open %s", svg);
    len = fread(out, 1, sizeof out - 1, sf);
    out[len] = 0;
    fclose(sf);
    unlink(svg);
    TU_CHECK(strstr(out, "<rect class=\"transfer\"") && strstr(out, "network transfer recv: "),
             "no recv transfer drawn in the step's timeline");
    printf("weft-trace: %ld recv transfers, %ld bytes (%d of 16 bytes)\n", got_count, got_bytes,
           runs);
    return 0;
}

static int receiver(wf_comm *c, const p2p_arg *a)
{
    wf_graph *g = wf_graph_create(tu_rt, WF_STATIC);
    wf_node *r = wf_recv(g, WF_F32, WF_SHAPE(4), 0, 7);
    wf_node *z = wf_add(g, r, wf_scalar(g, WF_F32, 1.0));
    TU_CHECK(z, "%s", wf_graph_errmsg(g));
    wf_session *s = NULL;
    TU_OK(wf_session_create(g, &(wf_session_opts){ .comm = c }, &s));
    if (a->mode == M_KILL)
        TU_CHECK(write(a->ready_fd, "r", 1) == 1, "ready");
    int runs = a->mode == M_LOOP ? a->runs : 1;
    for (int step = 0; step < runs; step++) {
        wf_tensor *out = NULL;
        uint64_t t0 = wf_test_now_ns();
        int rc = wf_session_run(s, NULL, 0, &z, 1, &out, NULL, 0);
        double secs = (double)(wf_test_now_ns() - t0) / 1e9;
        const char *msg = wf_session_errmsg(s);
        if (a->mode == M_MISMATCH) {
            TU_CHECK(rc == WF_ESHAPE, "got %s: %s", wf_err_name(rc), msg);
            TU_CHECK(strstr(msg, "recv '") && strstr(msg, "rank 1 expected f32 [4] from rank 0, "
                                                          "which sent f32 [5]"),
                     "%s", msg);
            TU_CHECK(!out, "no value on failure");
            break;
        }
        if (a->mode == M_KILL) {
            TU_CHECK(rc == WF_EPEER, "got %s after %.2f s: %s", wf_err_name(rc), secs, msg);
            TU_CHECK(strstr(msg, "rank 0 ") && strstr(msg, "died"), "%s", msg);
            break;
        }
        TU_CHECK(rc == 0, "rank 1, run %d: %s: %s", step, wf_err_name(rc), msg);
        const float *v = wf_tensor_data_f32(out);
        for (int i = 0; i < 4; i++)
            TU_CHECK(v[i] == x_of(step, i) * 2.0f + 1.0f, "run %d, element %d: %g, not %g", step, i,
                     v[i], x_of(step, i) * 2.0f + 1.0f);
        wf_tensor_release(out);
    }
    if (a->mode == M_LOOP) { /* the transfers are on the trace, beside the tasks */
        char path[64];
        snprintf(path, sizeof path, "/tmp/weft-graph-p2p-%d.json", (int)getpid());
        int n = wf_runtime_trace_write(tu_rt, path);
        TU_CHECK(n > 0, "wf_runtime_trace_write: %s", wf_last_errmsg());
        FILE *f = fopen(path, "r");
        TU_CHECK(f, "open %s", path);
        static char buf[1 << 20];
        size_t len = fread(buf, 1, sizeof buf - 1, f);
        buf[len] = 0;
        fclose(f);
        TU_CHECK(strstr(buf, "\"name\":\"recv\",\"cat\":\"transfer\""), "no recv transfer in the "
                                                                        "trace");
        TU_CHECK(strstr(buf, "\"cat\":\"actor\""), "no actor turn in the trace");
        int bad = check_weft_trace(path, buf, a->runs);
        unlink(path);
        if (bad)
            return bad;
    }
    wf_session_destroy(s);
    wf_graph_destroy(g);
    return 0;
}

static int graph_p2p(wf_comm *c, int rank, int size, void *arg)
{
    (void)size;
    const p2p_arg *a = arg;
    if (a->mode == M_BUSY)
        return rank == 0 ? busy_sender(c) : busy_receiver(c);
    return rank == 0 ? sender(c, arg) : receiver(c, arg);
}
TU_REGISTER(graph_p2p)

static void run_two(p2p_arg a)
{
    tu_run t = { .size = 2,
                 .body = graph_p2p,
                 .arg = &a,
                 .arg_size = sizeof a,
                 .timeout_s = WF_TEST_TIMEOUT(40),
                 .with_rt = true,
                 .n_workers = a.mode == M_BUSY ? 1 : 0 };
    tu_start(&t);
    cr_assert(tu_wait(&t), "the ranks did not finish within %.0f s (killed)", t.timeout_s);
    for (int r = 0; r < 2; r++)
        cr_assert(WIFEXITED(t.status[r]) && WEXITSTATUS(t.status[r]) == 0,
                  "rank %d: %s %d (see its stderr)", r,
                  WIFEXITED(t.status[r]) ? "exit status" : "killed by signal",
                  WIFEXITED(t.status[r]) ? WEXITSTATUS(t.status[r]) : WTERMSIG(t.status[r]));
}

Test(transport_graph_p2p, rank_1_receives_rank_0s_doubled_value_every_run_of_a_loop)
{
    run_two((p2p_arg){ .mode = M_LOOP, .runs = wf_test_quick() ? 20 : 200 });
}

Test(transport_graph_p2p, a_received_shape_other_than_the_nodes_fails_naming_both_ranks_and_shapes)
{
    run_two((p2p_arg){ .mode = M_MISMATCH, .runs = 1 });
}

Test(transport_graph_p2p, a_killed_sender_fails_the_pending_receive_within_2_s_naming_it)
{
    int fds[2];
    tu_ready_pipe(fds);
    p2p_arg a = { .mode = M_KILL, .ready_fd = fds[1] };
    tu_run t = { .size = 2,
                 .body = graph_p2p,
                 .arg = &a,
                 .arg_size = sizeof a,
                 .timeout_s = 60,
                 .with_rt = true };
    double s = tu_kill_rank(&t, fds, 0, 2);
    cr_log_info("rank 1 returned %.3f s after the kill", s);
}

Test(transport_graph_p2p, send_and_recv_without_a_communicator_fail_placement_with_enodev)
{
    wf_runtime *rt = NULL;
    cr_assert_eq(wf_runtime_create(&rt, &(wf_runtime_opts){ .n_workers = 1 }), 0);
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *r = wf_recv(g, WF_F32, WF_SHAPE(4), 0, 3);
    cr_assert_not_null(r, "%s", wf_graph_errmsg(g));
    wf_session *s = NULL;
    cr_assert_eq(wf_session_create(g, NULL, &s), 0);
    wf_tensor *out = NULL;
    int rc = wf_session_run(s, NULL, 0, &r, 1, &out, NULL, 0);
    cr_assert_eq(rc, WF_ENODEV, "got %s: %s", wf_err_name(rc), wf_session_errmsg(s));
    cr_assert(strstr(wf_session_errmsg(s), "recv '") && strstr(wf_session_errmsg(s), "cpu:0"), "%s",
              wf_session_errmsg(s));
    wf_session_destroy(s);
    wf_graph_destroy(g);
    g = wf_graph_create(rt, WF_STATIC);
    cr_assert_null(wf_recv(g, WF_F32, WF_SHAPE(4), -1, 3), "a negative peer is refused");
    cr_assert(strstr(wf_graph_errmsg(g), "peer rank -1"), "%s", wf_graph_errmsg(g));
    cr_assert_null(wf_send(g, wf_scalar(g, WF_F32, 1.0), 0, 1 << 15), "an edge too large");
    wf_graph_destroy(g);
    wf_runtime_destroy(rt);
}

Test(transport_graph_p2p, a_rendezvous_completes_while_the_senders_only_worker_runs_a_long_chain)
{
    run_two((p2p_arg){ .mode = M_BUSY });
}
