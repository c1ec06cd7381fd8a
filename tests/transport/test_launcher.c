/* tests/transport/test_launcher.c: weft-run starts N ranks that find each other through
 * wf_dist_opts_from_env(), prefixes their output with the rank, and when one rank dies
 * stops the others and exits non-zero naming it.
 * The rank program is this test executable itself: started with WF_LAUNCHER_MODE set, a
 * constructor runs the rank's part and exits before Criterion's main. */
#include "transport_util.h"

#include <sys/wait.h>

#ifndef WF_WEFT_RUN
#    error "WF_WEFT_RUN (the path of weft-run) must be defined by the build"
#endif

/* The rank program: join the comm, all-reduce the ranks, print the sum. Modes: "ok",
 * "exit3" (rank 1 exits with 3 after joining), "kill" (rank 1 kills itself with SIGKILL). */
__attribute__((constructor)) static void rank_main(void)
{
    const char *mode = getenv("WF_LAUNCHER_MODE");
    if (!mode)
        return;
    wf_comm_opts o = { 0 };
    int rc = wf_dist_opts_from_env(&o);
    if (rc != 1) {
        fprintf(stderr, "no rank in the environment: %s\n", wf_last_errmsg());
        _exit(20);
    }
    wf_comm *c;
    tu_ucx_env();
    if ((rc = wf_comm_create(NULL, &o, &c)) < 0) {
        fprintf(stderr, "wf_comm_create: %s\n", wf_last_errmsg());
        _exit(21);
    }
    if (o.rank == 1 && !strcmp(mode, "exit3"))
        _exit(3);
    if (o.rank == 1 && !strcmp(mode, "kill"))
        raise(SIGKILL);
    int64_t x = o.rank;
    rc = wf_comm_allreduce(c, &x, &x, 1, WF_I64, WF_REDUCE_SUM);
    if (rc < 0) {
        fprintf(stderr, "allreduce: %s\n", wf_last_errmsg());
        _exit(22);
    }
    printf("rank %d of %d: sum %lld\n", o.rank, o.size, (long long)x);
    fflush(stdout);
    wf_comm_destroy(c);
    _exit(0);
}

TestSuite(transport_launcher, .timeout = WF_TEST_TIMEOUT(60), .fini = wf_test_fini);

/* Runs weft-run -n 'n' on this executable in 'mode'; returns its exit status and output. */
static int launch(int n, const char *mode, char *out, size_t cap)
{
    char self[4096];
    ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
    cr_assert_gt(k, 0);
    self[k] = 0;
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "WF_LAUNCHER_MODE=%s timeout 30 %s -n %d -- %s 2>&1", mode,
             WF_WEFT_RUN, n, self);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    size_t len = fread(out, 1, cap - 1, p);
    out[len] = 0;
    int st = pclose(p);
    cr_assert(WIFEXITED(st), "weft-run did not exit");
    return WEXITSTATUS(st);
}

Test(transport_launcher, ranks_find_each_other_and_output_is_prefixed)
{
    char out[16384];
    for (int n = 1; n <= 4; n++) {
        int code = launch(n, "ok", out, sizeof out);
        cr_assert_eq(code, 0, "weft-run -n %d exited %d:\n%s", n, code, out);
        for (int r = 0; r < n; r++) {
            char line[64];
            snprintf(line, sizeof line, "[%d] rank %d of %d: sum %d\n", r, r, n, n * (n - 1) / 2);
            cr_assert(strstr(out, line), "missing '%s' in:\n%s", line, out);
        }
    }
}

Test(transport_launcher, a_rank_that_exits_with_an_error_stops_the_others)
{
    char out[16384];
    /* The others fail too (they see rank 1 die): every failure is named, and the exit
     * code is that of the first exit weft-run saw (3, or 22 from a rank that noticed). */
    int code = launch(3, "exit3", out, sizeof out);
    cr_assert(code == 3 || code == 22, "exit %d:\n%s", code, out);
    cr_assert(strstr(out, "rank 1 (pid") && strstr(out, "exited with status 3"), "%s", out);
}

Test(transport_launcher, a_killed_rank_makes_weft_run_exit_non_zero_naming_it)
{
    char out[16384];
    int code = launch(3, "kill", out, sizeof out);
    cr_assert(code == 128 + SIGKILL || code == 22, "exit %d:\n%s", code, out);
    cr_assert(strstr(out, "rank 1 (pid") && strstr(out, "signal 9"), "%s", out);
}
