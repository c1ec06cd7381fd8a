/* tests/transport/test_flight.c: the flight recorder: what a dump holds (header, operations
 * with their tags and states, the last 1,024 only), the dump every surviving rank writes when
 * the comm fails, and weft-run's verdict line merged from them: a rank that skips a
 * collective, a SIGSTOPped rank (also as the cause a restart line names, and in a session of
 * the multiworker strategy, whose dp_reduce nodes are recorded too), and survivors
 * that hear of a death late, with real processes and short timeouts.
 * Ranks are real processes (transport_util.h, or this executable under weft-run with
 * WF_FLIGHT_MODE set: a constructor runs the rank's part and exits before Criterion's main). */
#include "launch_util.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef WF_WEFT_RUN
#    error "WF_WEFT_RUN (the path of weft-run) must be defined by the build"
#endif

#define STEPS 8 /* all-reduces of a weft-run rank */

/* Mode "dp_stop": STEPS steps of a data-parallel session (a softmax regression under the
 * multiworker strategy, one dp_reduce per step besides the fetched loss's); rank 1 stops
 * itself before step 5. The survivors' records hold the session's reductions (the graph's
 * transfers are recorded as wf_comm calls are), so the verdict names the one of run 5. */
static void dp_rank(wf_runtime *rt, wf_comm *c, int rank)
{
    wf_strategy *st = NULL;
    wf_session *s = NULL;
    if (wf_strategy_multiworker(c, &(wf_strategy_opts){ .shards = 3 }, &st) < 0) {
        fprintf(stderr, "dp setup: %s\n", wf_last_errmsg());
        _exit(26);
    }
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(-1, 8));
    wf_node *y = wf_placeholder(g, "y", WF_I32, WF_SHAPE(-1));
    wf_node *w = wf_variable(g, "w", WF_F32, WF_SHAPE(8, 4), wf_init_glorot_uniform(3));
    wf_node *loss = wf_mean(g, wf_softmax_cross_entropy(g, wf_matmul(g, x, w), y));
    wf_node *train = wf_minimize(g, wf_sgd(0.1), loss);
    if (!train || wf_session_create(g, &(wf_session_opts){ .strategy = st }, &s) < 0) {
        fprintf(stderr, "dp session: %s\n", wf_last_errmsg());
        _exit(27);
    }
    float xs[12 * 8];
    int32_t ys[12];
    for (int i = 0; i < 12 * 8; i++)
        xs[i] = (float)((i * 37) % 11) / 11.0f - 0.5f;
    for (int i = 0; i < 12; i++)
        ys[i] = i % 4;
    wf_tensor *xt = wf_tensor_from(WF_F32, WF_SHAPE(12, 8), xs);
    wf_tensor *yt = wf_tensor_from(WF_I32, WF_SHAPE(12), ys);
    for (int i = 0; i < STEPS; i++) {
        if (rank == 1 && i == 5)
            raise(SIGSTOP);
        wf_feed f[2] = { { x, xt }, { y, yt } };
        wf_tensor *out = NULL;
        if (wf_session_run(s, f, 2, &loss, 1, &out, &train, 1) < 0) {
            fprintf(stderr, "step %d: %s\n", i, wf_session_errmsg(s));
            _exit(22); /* the record is written before the failure is reported */
        }
        wf_tensor_release(out);
    }
    _exit(0);
}

/* Under weft-run: STEPS all-reduces tagged "step <i>"; mode "skip": rank 1 skips step 5 and
 * waits (checking its comm) until the others' timeout fails it; "stop": rank 1 stops itself
 * (SIGSTOP) before step 5, and the others declare it dead after missed heartbeats; "exit":
 * rank 1 _exit()s before step 5 while a child of its own holds its sockets open (the others
 * hear nothing until the heartbeats stop: they learn of it ~0.3 s after weft-run does), and
 * the others _exit() at once on their failure, without wf_comm_destroy. */
__attribute__((constructor)) static void flight_rank_main(void)
{
    const char *mode = getenv("WF_FLIGHT_MODE");
    if (!mode)
        return;
    bool exit_mode = !strcmp(mode, "exit");
    wf_comm_opts o = { .op_timeout_ms = 1500,
                       .heartbeat_ms = exit_mode ? 50 : 100,
                       .heartbeat_timeout_ms = exit_mode ? 300 : 800 };
    if (wf_dist_opts_from_env(&o) != 1) {
        fprintf(stderr, "no rank in the environment: %s\n", wf_last_errmsg());
        _exit(20);
    }
    if (!o.flight_dir) {
        fprintf(stderr, "weft-run set no WEFT_FLIGHT_DIR\n");
        _exit(24);
    }
    wf_comm *c;
    wf_runtime *rt = NULL; /* "dp_stop": the session's, whose transfers need the comm to have it */
    tu_ucx_env();
    if (!strcmp(mode, "dp_stop") &&
        wf_runtime_create(&rt, &(wf_runtime_opts){ .n_workers = 1 }) < 0)
        _exit(26);
    if (wf_comm_create(rt, &o, &c) < 0) {
        fprintf(stderr, "wf_comm_create: %s\n", wf_last_errmsg());
        _exit(21);
    }
    if (!strcmp(mode, "dp_stop"))
        dp_rank(rt, c, o.rank);
    for (int i = 0; i < STEPS; i++) {
        char tag[32];
        snprintf(tag, sizeof tag, "step %d", i);
        if (wf_comm_set_tag(c, tag) < 0)
            _exit(25);
        if (o.rank == 1 && i == 5) {
            if (!strcmp(mode, "stop"))
                raise(SIGSTOP);
            if (exit_mode) {
                if (fork() == 0) { /* keeps the sockets open: no peer sees them close */
                    sleep(3);
                    _exit(0);
                }
                _exit(23);
            }
            while (wf_comm_status(c) == 0) /* skip: the others time out, which fails us too */
                wf_test_sleep_us(10000);
            wf_comm_destroy(c);
            _exit(22);
        }
        float x = 1.0f;
        if (wf_comm_allreduce(c, &x, &x, 1, WF_F32, WF_REDUCE_SUM) < 0) {
            fprintf(stderr, "allreduce: %s\n", wf_last_errmsg());
            if (exit_mode)
                _exit(22); /* the record is written before the failure is reported */
            /* As a program would: leaving in order (the goodbye round) also gives the ranks
             * that only hear of the failure the moment to write their records before
             * weft-run, seeing this rank exit, stops them. */
            wf_comm_destroy(c);
            _exit(22);
        }
    }
    wf_comm_destroy(c);
    _exit(0);
}

TestSuite(transport_flight, .timeout = WF_TEST_TIMEOUT(60), .fini = wf_test_fini);

/* Reads a whole file into 'buf' (NUL-terminated); returns its length or -1. */
static long read_all(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, cap - 1, f);
    fclose(f);
    buf[n] = 0;
    return (long)n;
}

static int count_lines(const char *s)
{
    int n = 0;
    for (; *s; s++)
        n += *s == '\n';
    return n;
}

/* The last line of 's' that contains 'needle', copied to 'out'; false if none. */
static bool last_line_with(const char *s, const char *needle, char *out, size_t cap)
{
    bool found = false;
    for (const char *line = s; *line;) {
        const char *nl = strchr(line, '\n');
        size_t len = nl ? (size_t)(nl - line) : strlen(line);
        char tmp[1024];
        snprintf(tmp, sizeof tmp, "%.*s", (int)(len < sizeof tmp ? len : sizeof tmp - 1), line);
        if (strstr(tmp, needle)) {
            snprintf(out, cap, "%s", tmp);
            found = true;
        }
        line = nl ? nl + 1 : line + len;
    }
    return found;
}

/* Three tagged all-reduces, a send and a receive, then a dump on demand. */
static int dump_body(wf_comm *c, int rank, int size, void *arg)
{
    (void)size;
    const char *dir = arg;
    TU_OK(wf_comm_set_tag(c, "bucket 3, step 17"));
    for (int i = 0; i < 3; i++) {
        double x = rank;
        TU_OK(wf_comm_allreduce(c, &x, &x, 1, WF_F64, WF_REDUCE_SUM));
    }
    TU_OK(wf_comm_set_tag(c, "p2p \"quoted\""));
    int v = 7;
    if (rank == 0)
        TU_OK(wf_comm_send(c, 1, WF_COMM_KEY(1, 2), &v, sizeof v));
    else
        TU_OK(wf_comm_recv(c, 0, WF_COMM_KEY(1, 2), &v, sizeof v));
    char path[512];
    snprintf(path, sizeof path, "%s/on-demand.rank%d.jsonl", dir, rank);
    TU_OK(wf_comm_flight_dump(c, path));
    static char buf[1 << 20];
    TU_CHECK(read_all(path, buf, sizeof buf) > 0, "%s not written", path);
    char head[128], line[1024];
    snprintf(head, sizeof head, "{\"flight\":1,\"rank\":%d,\"size\":2,\"host\":", rank);
    TU_CHECK(!strncmp(buf, head, strlen(head)), "header: %.200s", buf);
    TU_CHECK(strstr(buf, "\"failed\":null"), "healthy comm: %.300s", buf);
    TU_CHECK(last_line_with(buf, "\"op\":\"allreduce\"", line, sizeof line), "%s", buf);
    TU_CHECK(strstr(line, "\"bytes\":8,\"count\":1,\"dtype\":\"f64\"") &&
                 strstr(line, "\"state\":\"done\"") &&
                 strstr(line, "\"tag\":\"bucket 3, step 17\""),
             "last all-reduce: %s", line);
    TU_CHECK(
        last_line_with(buf, rank == 0 ? "\"op\":\"send\"" : "\"op\":\"recv\"", line, sizeof line),
        "no point-to-point entry: %s", buf);
    char key[64];
    snprintf(key, sizeof key, "\"key\":%llu,\"bytes\":4", (unsigned long long)WF_COMM_KEY(1, 2));
    TU_CHECK(strstr(line, key) && strstr(line, "\"peer\":") && strstr(line, "\"state\":\"done\"") &&
                 strstr(line, "\"tag\":\"p2p \\\"quoted\\\"\""),
             "p2p entry: %s", line);
    unlink(path);
    return 0;
}
TU_REGISTER(dump_body)

Test(transport_flight, a_dump_on_demand_holds_the_tagged_collectives_and_point_to_point)
{
    char dir[128];
    lu_tmpdir(dir, sizeof dir);
    tu_run_all(2, NULL, dump_body, dir, strlen(dir) + 1, WF_TEST_TIMEOUT(20));
    lu_rmdir(dir);
}

/* 1,100 barriers: the dump holds the last 1,024 operations, oldest first. */
static int wrap_body(wf_comm *c, int rank, int size, void *arg)
{
    (void)size;
    const char *dir = arg;
    int n = 1100;
    for (int i = 0; i < n; i++)
        TU_OK(wf_comm_barrier(c));
    char path[512];
    snprintf(path, sizeof path, "%s/wrap.rank%d.jsonl", dir, rank);
    TU_OK(wf_comm_flight_dump(c, path));
    static char buf[4 << 20];
    TU_CHECK(read_all(path, buf, sizeof buf) > 0, "%s not written", path);
    TU_CHECK(count_lines(buf) == 1 + 1024, "%d lines", count_lines(buf));
    TU_CHECK(strstr(buf, "\"ops\":1024}"), "header: %.300s", buf);
    /* Seq numbers are consecutive: the first kept is 1023 before the last. */
    unsigned long long first = 0, last = 0;
    const char *p = strstr(buf, "\n{\"seq\":");
    TU_CHECK(p && sscanf(p, "\n{\"seq\":%llu", &first) == 1, "no first entry");
    char line[1024];
    TU_CHECK(last_line_with(buf, "\"op\":\"barrier\"", line, sizeof line) &&
                 sscanf(line, "{\"seq\":%llu", &last) == 1,
             "no last entry");
    TU_CHECK(last - first == 1023, "first %llu, last %llu", first, last);
    unlink(path);
    return 0;
}
TU_REGISTER(wrap_body)

Test(transport_flight, the_record_keeps_the_last_1024_operations)
{
    char dir[128];
    lu_tmpdir(dir, sizeof dir);
    tu_run_all(2, NULL, wrap_body, dir, strlen(dir) + 1, WF_TEST_TIMEOUT(30));
    lu_rmdir(dir);
}

static int off_body(wf_comm *c, int rank, int size, void *arg)
{
    (void)rank, (void)size, (void)arg;
    TU_OK(wf_comm_barrier(c));
    int rc = wf_comm_flight_dump(c, "/tmp/never-written.jsonl");
    TU_CHECK(rc == WF_EINVAL && strstr(wf_last_errmsg(), "flight_off"), "%s: %s", wf_err_name(rc),
             wf_last_errmsg());
    return 0;
}
TU_REGISTER(off_body)

Test(transport_flight, a_comm_without_recorder_refuses_a_dump)
{
    tu_run_all(2, &(wf_comm_opts){ .flight_off = 1 }, off_body, NULL, 0, WF_TEST_TIMEOUT(20));
}

/* Rank 2 is killed after 3 all-reduces; ranks 0 and 1 (tagged "survivor") all-reduce until
 * one fails (the 3rd or the 4th: a rank may still be in the 3rd when rank 2 dies), and write
 * their records. */
static int killed_body(wf_comm *c, int rank, int size, void *arg)
{
    (void)size, (void)arg;
    if (rank != 2)
        TU_OK(wf_comm_set_tag(c, "survivor"));
    int rc = 0;
    for (int i = 0; i < 4 && rc == 0; i++) {
        if (rank == 2 && i == 3)
            raise(SIGKILL);
        float x = 1.0f;
        rc = wf_comm_allreduce(c, &x, &x, 1, WF_F32, WF_REDUCE_SUM);
    }
    TU_CHECK(rc == WF_EPEER, "rank %d: %s: %s", rank, wf_err_name(rc), wf_last_errmsg());
    return 0;
}
TU_REGISTER(killed_body)

Test(transport_flight, every_surviving_rank_writes_its_record_when_the_comm_fails)
{
    char dir[128];
    lu_tmpdir(dir, sizeof dir);
    tu_run t = { .size = 3, .body = killed_body, .timeout_s = WF_TEST_TIMEOUT(20) };
    t.opts.flight_dir = dir;
    tu_start(&t);
    cr_assert(tu_wait(&t), "ranks did not finish in time");
    for (int r = 0; r < 2; r++)
        cr_assert(WIFEXITED(t.status[r]) && WEXITSTATUS(t.status[r]) == 0, "rank %d failed", r);
    static char buf[1 << 20];
    for (int r = 0; r < 2; r++) {
        char path[256], line[1024];
        snprintf(path, sizeof path, "%s/flight.rank%d.jsonl", dir, r);
        cr_assert_gt(read_all(path, buf, sizeof buf), 0, "rank %d wrote no %s", r, path);
        cr_assert(strstr(buf, "\"failed\":\"WF_EPEER\",\"reason\":\"rank 2 "), "rank %d: %.400s", r,
                  buf);
        cr_assert(last_line_with(buf, "\"tag\":\"survivor\"", line, sizeof line),
                  "rank %d: the pending all-reduce is missing: %s", r, buf);
        cr_assert(strstr(line, "\"state\":\"waiting\"") || strstr(line, "\"state\":\"failed\""),
                  "rank %d: %s", r, line);
    }
    char path[256];
    snprintf(path, sizeof path, "%s/flight.rank2.jsonl", dir);
    cr_assert(access(path, F_OK) != 0, "the killed rank wrote a record");
    lu_rmdir(dir);
}

/* ---- weft-run's verdict ---------------------------------------------------------------- */

static int launch_with(int n, const char *opts, const char *mode, char *out, size_t cap)
{
    return lu_launch_self("WF_FLIGHT_MODE", mode, 40, n, opts, out, cap);
}

static int launch(int n, const char *mode, char *out, size_t cap)
{
    return launch_with(n, "", mode, out, cap);
}

/* The seconds in "waited N.N s" of 'line'; -1 if absent. */
static double waited_s(const char *line)
{
    const char *w = strstr(line, " waited ");
    double s = -1;
    if (!w || sscanf(w, " waited %lf s", &s) != 1)
        return -1;
    return s;
}

Test(transport_flight, weft_run_names_the_rank_that_skipped_a_collective)
{
    char out[65536], line[1024];
    int code = launch(3, "skip", out, sizeof out);
    cr_assert_neq(code, 0, "%s", out);
    cr_assert(last_line_with(out, "weft-run: verdict: ", line, sizeof line), "%s", out);
    cr_assert(strstr(line, "verdict: rank 1 never entered allreduce #") &&
                  strstr(line, " (step 5); ranks 0,2 waited "),
              "%s", line);
    double s = waited_s(line);
    cr_assert(s >= 1.4 && s < WF_TEST_TIMEOUT(5.0), "waited %.1f s (op_timeout_ms 1500): %s", s,
              line);
    cr_assert(strstr(line, "WF_ETIMEDOUT"), "%s", line);
}

/* Without weft-run's grace before its SIGTERM, ranks 0 and 2 are ended the moment rank 1 exits,
 * before they hear of it, and leave no record ("no rank wrote a flight record": measured with
 * the launcher of before, 3 runs of 3). "ranks 0,2 waited" says both records were read. */
Test(transport_flight, survivors_that_hear_of_a_death_late_still_write_their_records)
{
    char out[65536], line[1024];
    int code = launch(3, "exit", out, sizeof out);
    cr_assert_eq(code, 23, "%s", out);
    cr_assert(strstr(out, "weft-run: rank 1 (pid "), "%s", out);
    cr_assert(last_line_with(out, "weft-run: verdict: ", line, sizeof line), "%s", out);
    cr_assert(strstr(line, "verdict: rank 1 left no flight record (stopped or killed?) and never "
                           "finished allreduce #") &&
                  strstr(line, " (step 5); ranks 0,2 waited "),
              "%s", line);
    cr_assert(strstr(line, "WF_EPEER: rank 1 "), "%s", line);
}

Test(transport_flight, weft_run_names_a_stopped_rank)
{
    char out[65536], line[1024];
    int code = launch(3, "stop", out, sizeof out);
    cr_assert_neq(code, 0, "%s", out);
    cr_assert(last_line_with(out, "weft-run: verdict: ", line, sizeof line), "%s", out);
    cr_assert(strstr(line, "verdict: rank 1 left no flight record (stopped or killed?) and never "
                           "finished allreduce #") &&
                  strstr(line, " (step 5); ranks 0,2 waited "),
              "%s", line);
    double s = waited_s(line);
    cr_assert(s >= 0.7 && s < WF_TEST_TIMEOUT(5.0), "waited %.1f s (heartbeat timeout 0.8 s): %s",
              s, line);
    cr_assert(strstr(line, "WF_EPEER: rank 1 "), "%s", line);
}

Test(transport_flight, weft_run_names_the_reduction_a_stopped_rank_of_a_strategy_never_finished)
{
    char out[65536], line[1024];
    int code = launch(3, "dp_stop", out, sizeof out);
    cr_assert_neq(code, 0, "%s", out);
    cr_assert(last_line_with(out, "weft-run: verdict: ", line, sizeof line), "%s", out);
    cr_assert(strstr(line, "verdict: rank 1 left no flight record (stopped or killed?) and never "
                           "finished dp_reduce #") &&
                  strstr(line, ", run 5); ranks 0,2 waited "),
              "%s", line);
    cr_assert(strstr(line, "WF_EPEER: rank 1 "), "%s", line);
}

/* A stopped rank never exits by itself: the first exit weft-run sees is a survivor's (status
 * 22). The restart line names the rank the flight records blame, then that exit. */
Test(transport_flight, a_restart_after_a_stopped_rank_names_that_rank)
{
    char out[65536], line[1024];
    int code = launch_with(3, "--restarts 1", "stop", out, sizeof out);
    cr_assert_neq(code, 0, "%s", out);
    cr_assert(last_line_with(out, "weft-run: restart 1 of 1 (incarnation 2): ", line, sizeof line),
              "%s", out);
    cr_assert(strstr(line, "(incarnation 2): rank 1 left no flight record (stopped or killed?) "
                           "and never finished allreduce #") &&
                  strstr(line, " (step 5), by the flight records (first seen: rank ") &&
                  strstr(line, " exited with status 22 at "),
              "%s", line);
}
