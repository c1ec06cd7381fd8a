/* tests/transport/test_launcher.c: weft-run starts N ranks that find each other through
 * wf_dist_opts_from_env(), prefixes their output with the rank, and when one rank dies
 * stops the others and exits non-zero naming it.
 * The rank program is this test executable itself: started with WF_LAUNCHER_MODE set, a
 * constructor runs the rank's part and exits before Criterion's main. */
#include "launch_util.h"

#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

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
    if (!strcmp(mode, "affinity")) { /* print the CPUs this rank may run on, and leave */
        cpu_set_t set;
        if (sched_getaffinity(0, sizeof set, &set) != 0)
            _exit(23);
        printf("rank %s cpus", getenv("WEFT_RANK"));
        for (int cpu = 0; cpu < CPU_SETSIZE; cpu++)
            if (CPU_ISSET(cpu, &set))
                printf(" %d", cpu);
        printf(" end\n");
        fflush(stdout);
        _exit(0);
    }
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
    if (!strcmp(mode, "loop")) { /* say who we are, then all-reduce until an error */
        printf("pid %d\n", (int)getpid());
        fflush(stdout);
        for (;;) {
            int64_t y = 1;
            if (wf_comm_allreduce(c, &y, &y, 1, WF_I64, WF_REDUCE_SUM) < 0 || y != o.size)
                _exit(22);
            wf_test_sleep_us(1000);
        }
    }
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

/* Runs weft-run -n 'n' 'opts' on this executable in 'mode'; returns its exit status and
 * output. */
static int launch_with(int n, const char *opts, const char *mode, char *out, size_t cap)
{
    return lu_launch_self("WF_LAUNCHER_MODE", mode, 30, n, opts, out, cap);
}

static int launch(int n, const char *mode, char *out, size_t cap)
{
    return launch_with(n, "", mode, out, cap);
}

/* Rank r's CPUs from an "affinity" run's output, as a set; false if its line is missing. */
static bool rank_cpus(const char *out, int r, cpu_set_t *set)
{
    char head[48];
    snprintf(head, sizeof head, "[%d] rank %d cpus", r, r);
    const char *p = strstr(out, head);
    if (!p)
        return false;
    p += strlen(head);
    CPU_ZERO(set);
    int cpu, used;
    while (sscanf(p, " %d%n", &cpu, &used) == 1) {
        if (cpu >= 0 && cpu < CPU_SETSIZE)
            CPU_SET(cpu, set);
        p += used;
    }
    return strncmp(p, " end", 4) == 0;
}

/* --bind-to core: every rank on one CPU of those weft-run may use, the first ranks on
 * different ones (when there are two cores); none (the default): ranks inherit weft-run's
 * whole set; anything else is refused with exit code 2 and a message. */
Test(transport_launcher, bind_to_core_puts_each_rank_on_a_cpu_of_its_own)
{
    cpu_set_t mine, s0, s1, s2;
    cr_assert_eq(sched_getaffinity(0, sizeof mine, &mine), 0);
    char out[16384];
    int code = launch_with(3, "--bind-to core", "affinity", out, sizeof out);
    cr_assert_eq(code, 0, "exit %d:\n%s", code, out);
    cr_assert(rank_cpus(out, 0, &s0) && rank_cpus(out, 1, &s1) && rank_cpus(out, 2, &s2), "%s",
              out);
    const cpu_set_t *sets[3] = { &s0, &s1, &s2 };
    for (int r = 0; r < 3; r++) {
        cr_assert_eq(CPU_COUNT(sets[r]), 1, "rank %d is not bound to one cpu:\n%s", r, out);
        cpu_set_t both;
        CPU_AND(&both, sets[r], &mine);
        cr_assert_eq(CPU_COUNT(&both), 1, "rank %d is bound outside our cpus:\n%s", r, out);
    }
    /* With two cores or more among our CPUs, ranks 0 and 1 are on different ones. */
    int cores = 0;
    for (int cpu = 0; cpu < CPU_SETSIZE; cpu++) {
        if (!CPU_ISSET(cpu, &mine))
            continue;
        char path[96];
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/topology/thread_siblings_list",
                 cpu);
        FILE *f = fopen(path, "r");
        int first = cpu;
        if (f) {
            if (fscanf(f, "%d", &first) != 1)
                first = cpu;
            fclose(f);
        }
        cores += first == cpu;
    }
    if (cores >= 2)
        cr_assert(!CPU_EQUAL(&s0, &s1), "ranks 0 and 1 share a cpu:\n%s", out);

    code = launch_with(2, "", "affinity", out, sizeof out);
    cr_assert_eq(code, 0, "exit %d:\n%s", code, out);
    cr_assert(rank_cpus(out, 0, &s0) && rank_cpus(out, 1, &s1), "%s", out);
    cr_assert(CPU_EQUAL(&s0, &mine) && CPU_EQUAL(&s1, &mine), "unbound ranks differ:\n%s", out);

    code = launch_with(2, "--bind-to socket", "affinity", out, sizeof out);
    cr_assert_eq(code, 2, "exit %d:\n%s", code, out);
    cr_assert(strstr(out, "--bind-to socket: expected 'core' or 'none'"), "%s", out);
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

/* Bug: SIGKILL of weft-run while 3 ranks all-reduce left all 3 running (for ever). Each
 * rank now dies with its launcher: gone within 1 s. 'in_shell': each rank's program is a
 * child of a shell, not of weft-run (PR_SET_PDEATHSIG kills the shell only), and ends
 * because its comm fails when weft-run's liveness pipe closes. */
static void kill_weft_run(bool in_shell)
{
    char self[4096];
    ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
    cr_assert_gt(k, 0);
    self[k] = 0;
    int out[2];
    cr_assert_eq(pipe(out), 0);
    fflush(NULL);
    pid_t run = fork();
    cr_assert_geq(run, 0);
    if (run == 0) {
        setenv("WF_LAUNCHER_MODE", "loop", 1);
        dup2(out[1], 1);
        close(out[0]);
        close(out[1]);
        if (in_shell) /* "; exit $?": the shell forks the program instead of exec'ing it */
            execl(WF_WEFT_RUN, WF_WEFT_RUN, "-n", "3", "--", "/bin/sh", "-c", "\"$0\"; exit $?",
                  self, (char *)NULL);
        else
            execl(WF_WEFT_RUN, WF_WEFT_RUN, "-n", "3", "--", self, (char *)NULL);
        _exit(127);
    }
    close(out[1]);
    FILE *f = fdopen(out[0], "r");
    cr_assert_not_null(f);
    pid_t pids[3] = { 0, 0, 0 };
    int got = 0;
    char line[256];
    while (got < 3 && fgets(line, sizeof line, f)) {
        int r, pid;
        if (sscanf(line, "[%d] pid %d", &r, &pid) == 2 && r >= 0 && r < 3 && !pids[r]) {
            pids[r] = pid;
            got++;
        }
    }
    cr_assert_eq(got, 3, "only %d ranks said their pid", got);
    wf_test_sleep_us(200000); /* all of them inside their loop of all-reduces */
    cr_assert_eq(kill(run, SIGKILL), 0);
    cr_assert_eq(waitpid(run, NULL, 0), run);
    uint64_t t0 = wf_test_now_ns();
    bool all_gone = false;
    /* 1 s, scaled under the sanitizers as every deadline of these tests: a program that
     * exits under ThreadSanitizer first sleeps its atexit_sleep_ms (1 s by default), and the
     * ranks behind a shell exit themselves (measured there: 1.01-1.02 s). */
    const double limit_s = WF_TEST_TIMEOUT(1.0);
    while (!all_gone && wf_test_now_ns() - t0 < (uint64_t)(limit_s * 1e9)) {
        all_gone = lu_gone(pids[0]) && lu_gone(pids[1]) && lu_gone(pids[2]);
        if (!all_gone)
            wf_test_sleep_us(5000);
    }
    double s = (double)(wf_test_now_ns() - t0) / 1e9;
    bool alive[3];
    for (int r = 0; r < 3; r++) {
        alive[r] = !lu_gone(pids[r]);
        if (alive[r])
            kill(-pids[r], SIGKILL), kill(pids[r], SIGKILL); /* leave nothing behind */
    }
    fclose(f);
    cr_assert(all_gone, "%.0f s after weft-run was killed, ranks still run: 0 %s, 1 %s, 2 %s",
              limit_s, alive[0] ? "alive" : "gone", alive[1] ? "alive" : "gone",
              alive[2] ? "alive" : "gone");
    cr_log_info("every rank was gone %.3f s after weft-run's SIGKILL", s);
}

Test(transport_launcher, ranks_die_within_a_second_when_weft_run_is_killed)
{
    kill_weft_run(false);
}

Test(transport_launcher, ranks_behind_a_shell_end_within_a_second_when_weft_run_is_killed)
{
    kill_weft_run(true);
}
