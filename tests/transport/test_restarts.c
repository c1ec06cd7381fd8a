/* tests/transport/test_restarts.c: weft-run --restarts with real processes: restart_train
 * (a data-parallel training program that checkpoints every step and resumes from its
 * newest checkpoint) dies 5 times in one run, at random steps of random ranks, by SIGKILL
 * or a non-zero exit; weft-run ends the other ranks, starts all of them again with the next
 * incarnation, and the final weights are bitwise those of an uninterrupted run. Also: the
 * count is bounded (the last start's status is returned) and a signal from outside is never
 * followed by a restart. The seed is logged; WF_TEST_SEED=N repeats a run. */
#include "launch_util.h"

#include <signal.h>
#include <time.h>

#ifndef WF_WEFT_RUN
#    error "WF_WEFT_RUN and WF_RESTART_TRAIN must be defined by the build"
#endif

TestSuite(transport_restarts, .timeout = WF_TEST_TIMEOUT(240), .fini = wf_test_fini);

enum { STEPS = 40 };

static unsigned test_seed(void)
{
    const char *s = getenv("WF_TEST_SEED");
    unsigned seed = s ? (unsigned)strtoul(s, NULL, 10) : (unsigned)time(NULL) ^ (unsigned)getpid();
    cr_log_info("seed %u (WF_TEST_SEED=%u repeats it)", seed, seed);
    return seed;
}

/* weft-run -n 'n' 'wr' restart_train --dir 'dir' --steps 'steps' [--kill 'kill']. */
static int train(int n, const char *wr, const char *dir, long steps, const char *kill, char *out,
                 size_t cap)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "timeout %d %s -n %d %s -- %s --dir %s --steps %ld%s%s",
             (int)WF_TEST_TIMEOUT(100), WF_WEFT_RUN, n, wr, WF_RESTART_TRAIN, dir, steps,
             kill ? " --kill " : "", kill ? kill : "");
    return lu_run(cmd, out, cap);
}

/* 'k' deaths, one in each incarnation 1..k, at increasing steps in 3 .. steps-1 of random
 * ranks, by SIGKILL or exit 7 at random: "1:R:S:kill,2:R:S:exit,...". A death at step >= 3
 * comes after some checkpoint, so every later start resumes instead of starting over. */
static void plan(char *spec, size_t cap, int k, int n, long steps, unsigned *seed)
{
    long s = 2;
    size_t len = 0;
    spec[0] = 0;
    for (int i = 1; i <= k; i++) {
        long room = (steps - 1 - s) - (k - i); /* leave a step for each later death */
        s += 1 + (room > 1 ? (long)(rand_r(seed) % (unsigned)room) : 0);
        len += (size_t)snprintf(spec + len, cap - len, "%s%d:%d:%ld:%s", i > 1 ? "," : "", i,
                                (int)(rand_r(seed) % (unsigned)n), s,
                                rand_r(seed) % 2 ? "kill" : "exit");
    }
}

static void restarted_run_equals_uninterrupted_one(int n)
{
    unsigned seed = test_seed();
    char ref[64], dir[64], refc[128], dirc[128], spec[256];
    static char out[1 << 18];
    lu_tmpdir(ref, sizeof ref);
    lu_tmpdir(dir, sizeof dir);
    int code = train(n, "", ref, STEPS, NULL, out, sizeof out);
    cr_assert_eq(code, 0, "uninterrupted run exited %d:\n%s", code, out);
    unsigned long long want[8];
    for (int r = 0; r < n; r++)
        cr_assert_neq(want[r] = lu_final_hash(out, r), 0, "rank %d's hash missing:\n%s", r, out);

    plan(spec, sizeof spec, 5, n, STEPS, &seed);
    cr_log_info("deaths: %s", spec);
    code = train(n, "--restarts 5", dir, STEPS, spec, out, sizeof out);
    cr_assert_eq(code, 0, "run with restarts exited %d (deaths %s):\n%s", code, spec, out);
    for (int k = 1; k <= 5; k++) {
        char line[64];
        snprintf(line, sizeof line, "weft-run: restart %d of 5 (incarnation %d): rank ", k, k + 1);
        cr_assert(strstr(out, line), "no '%s' (deaths %s):\n%s", line, spec, out);
    }
    cr_assert_eq(lu_count(out, "weft-run: restart "), 5, "%s", out);
    cr_assert(strstr(out, "killed by signal 9") || strstr(out, "exited with status 7"), "%s", out);
    /* Only the first start began at step 0: every later one resumed. */
    cr_assert_eq(lu_count(out, " start 0\n"), n, "a restart did not resume (deaths %s):\n%s", spec,
                 out);
    for (int r = 0; r < n; r++)
        cr_assert_eq(lu_final_hash(out, r), want[r], "rank %d: hash %016llx, want %016llx:\n%s", r,
                     lu_final_hash(out, r), want[r], out);
    snprintf(refc, sizeof refc, "%s/final.safetensors", ref);
    snprintf(dirc, sizeof dirc, "%s/final.safetensors", dir);
    cr_assert(lu_same_file(refc, dirc), "final checkpoints differ (deaths %s)", spec);
    lu_rmdir(ref);
    lu_rmdir(dir);
}

Test(transport_restarts, one_process_killed_5_times_ends_with_the_uninterrupted_bits)
{
    restarted_run_equals_uninterrupted_one(1);
}

Test(transport_restarts, three_ranks_killed_5_times_end_with_the_uninterrupted_bits)
{
    restarted_run_equals_uninterrupted_one(3);
}

Test(transport_restarts, restarts_are_bounded_and_the_last_status_is_returned)
{
    char dir[64];
    static char out[1 << 16];
    lu_tmpdir(dir, sizeof dir);
    int code =
        train(2, "--restarts 2", dir, STEPS, "1:1:5:exit,2:0:10:exit,3:1:15:exit", out, sizeof out);
    cr_assert_eq(code, 7, "exit %d:\n%s", code, out);
    cr_assert_eq(lu_count(out, "weft-run: restart "), 2, "%s", out);
    cr_assert(strstr(out, "weft-run: no restart left after 2 restarts; exiting with status 7"),
              "%s", out);
    lu_rmdir(dir);
}

Test(transport_restarts, a_signal_from_outside_is_not_followed_by_a_restart)
{
    char dir[64];
    lu_tmpdir(dir, sizeof dir);
    int out[2];
    cr_assert_eq(pipe(out), 0);
    tu_ucx_env();
    fflush(NULL);
    pid_t run = fork();
    cr_assert_geq(run, 0);
    if (run == 0) {
        dup2(out[1], 1);
        dup2(out[1], 2);
        close(out[0]);
        close(out[1]);
        execl(WF_WEFT_RUN, WF_WEFT_RUN, "-n", "2", "--restarts", "3", "--", WF_RESTART_TRAIN,
              "--dir", dir, "--steps", "100000", "--step-ms", "5", (char *)NULL);
        _exit(127);
    }
    close(out[1]);
    FILE *f = fdopen(out[0], "r");
    cr_assert_not_null(f);
    char line[512];
    int started = 0;
    while (started < 2 && fgets(line, sizeof line, f))
        started += strstr(line, " pid ") != NULL;
    cr_assert_eq(started, 2, "the ranks did not start");
    cr_assert_eq(kill(run, SIGTERM), 0);
    static char rest[1 << 16];
    size_t len = fread(rest, 1, sizeof rest - 1, f);
    rest[len] = 0;
    fclose(f);
    int st;
    cr_assert_eq(waitpid(run, &st, 0), run);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 128 + SIGTERM, "status %d:\n%s", st, rest);
    cr_assert_null(strstr(rest, "weft-run: restart "), "%s", rest);
    cr_assert(strstr(rest, "weft-run: no restart (a signal from outside"), "%s", rest);
    lu_rmdir(dir);
}
