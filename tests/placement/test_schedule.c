/* tests/placement/test_schedule.c: the pipeline schedules and their static check: GPipe and
 * 1F1B over every p <= 8 stages and m <= 32 micro-batches (m < p included) pass the check,
 * keep the micro-batches alive that each schedule promises, and simulate to the textbook
 * bubble; broken schedules built on purpose (a dropped receive, a duplicated send, a wrong
 * peer, a compute before its receive, a wait cycle between two stages) are refused with a
 * message naming the stage and the action; bad options are refused by name. */
#include "wf_test.h"

#include <weft/weft.h>

#include <criterion/criterion.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

TestSuite(placement_schedule, .timeout = WF_TEST_TIMEOUT(120));

/* Copies a schedule's lists so a test can break them. */
typedef struct lists {
    int P, m;
    wf_pipe_action *a[8];
    int len[8];
} lists;

static void copy_lists(const wf_pipe_schedule *s, lists *l)
{
    l->P = wf_pipe_schedule_stages(s);
    l->m = wf_pipe_schedule_micro_batches(s);
    for (int k = 0; k < l->P; k++) {
        int n;
        const wf_pipe_action *a = wf_pipe_schedule_actions(s, k, &n);
        l->a[k] = malloc(sizeof *a * (size_t)(n + 1));
        memcpy(l->a[k], a, sizeof *a * (size_t)n);
        l->len[k] = n;
    }
}

static void free_lists(lists *l)
{
    for (int k = 0; k < l->P; k++)
        free(l->a[k]);
}

static int check(const lists *l, int *in_flight)
{
    return wf_pipe_check(l->P, l->m, (const wf_pipe_action *const *)l->a, l->len, in_flight);
}

Test(placement_schedule, every_gpipe_and_1f1b_schedule_up_to_8_stages_and_32_micro_batches_passes)
{
    int checked = 0;
    for (int kind = WF_SCHEDULE_GPIPE; kind <= WF_SCHEDULE_1F1B; kind++)
        for (int P = 1; P <= 8; P++)
            for (int m = 1; m <= 32; m++) {
                wf_pipe_schedule *s;
                int rc = wf_pipe_schedule_create(kind, P, m, &s);
                cr_assert_eq(rc, 0, "create %d %d %d: %s", kind, P, m, wf_last_errmsg());
                lists l;
                copy_lists(s, &l);
                int in_flight = -1;
                rc = check(&l, &in_flight);
                cr_assert_eq(rc, 0, "%s p=%d m=%d: %s", kind ? "1F1B" : "GPipe", P, m,
                             wf_last_errmsg());
                /* GPipe keeps all m alive on every stage; 1F1B at most p on stage 0. */
                int want = kind == WF_SCHEDULE_GPIPE ? m : (m < P ? m : P);
                cr_assert_eq(in_flight, want, "%s p=%d m=%d: %d alive, want %d",
                             kind ? "1F1B" : "GPipe", P, m, in_flight, want);
                /* Every stage: 2m computes, plus one receive and one send per neighbour and
                 * micro-batch. */
                for (int k = 0; k < P; k++) {
                    int neigh = (k > 0) + (k < P - 1);
                    cr_assert_eq(l.len[k], 2 * m + 2 * neigh * m, "stage %d length %d", k,
                                 l.len[k]);
                }
                free_lists(&l);
                wf_pipe_schedule_destroy(s);
                checked++;
            }
    cr_assert_eq(checked, 2 * 8 * 32);
}

Test(placement_schedule, one_f_one_b_stage_k_keeps_at_most_p_minus_k_micro_batches)
{
    for (int P = 2; P <= 8; P++) {
        wf_pipe_schedule *s;
        cr_assert_eq(wf_pipe_schedule_create(WF_SCHEDULE_1F1B, P, 32, &s), 0);
        for (int k = 0; k < P; k++) {
            /* one stage alone: its own alive count, checked by a one-stage view is not
             * possible (it has peers), so count directly */
            int n, alive = 0, worst = 0;
            const wf_pipe_action *a = wf_pipe_schedule_actions(s, k, &n);
            for (int i = 0; i < n; i++) {
                if (a[i].op == WF_PIPE_FWD && ++alive > worst)
                    worst = alive;
                if (a[i].op == WF_PIPE_BWD)
                    alive--;
            }
            cr_assert_eq(worst, P - k, "p=%d stage %d keeps %d", P, k, worst);
        }
        wf_pipe_schedule_destroy(s);
    }
}

Test(placement_schedule, simulation_of_equal_stages_gives_the_textbook_bubble)
{
    double f[8], b[8];
    for (int k = 0; k < 8; k++) {
        f[k] = 1.0;
        b[k] = 2.0;
    }
    for (int kind = WF_SCHEDULE_GPIPE; kind <= WF_SCHEDULE_1F1B; kind++)
        for (int P = 1; P <= 8; P++)
            for (int m = 1; m <= 32; m *= 2) {
                wf_pipe_schedule *s;
                cr_assert_eq(wf_pipe_schedule_create(kind, P, m, &s), 0);
                double step, bubble;
                cr_assert_eq(wf_pipe_simulate(s, f, b, NULL, &step, &bubble), 0);
                /* (m + p - 1) (f + b) for both: the bubble is (p - 1) / (m + p - 1). */
                double want = (m + P - 1) * 3.0;
                cr_assert(fabs(step - want) < 1e-9, "%s p=%d m=%d: step %g, want %g",
                          kind ? "1F1B" : "GPipe", P, m, step, want);
                cr_assert(fabs(bubble - (P - 1.0) / (m + P - 1.0)) < 1e-9);
                wf_pipe_schedule_destroy(s);
            }
}

static void expect_refused(lists *l, const char *needle)
{
    int rc = check(l, NULL);
    cr_assert_eq(rc, WF_EINVAL, "broken schedule passed (want '%s')", needle);
    cr_assert(strstr(wf_last_errmsg(), needle), "message: %s (want '%s')", wf_last_errmsg(),
              needle);
}

static lists make(int kind, int P, int m)
{
    wf_pipe_schedule *s;
    cr_assert_eq(wf_pipe_schedule_create(kind, P, m, &s), 0);
    lists l;
    copy_lists(s, &l);
    wf_pipe_schedule_destroy(s);
    return l;
}

static int find(const lists *l, int k, int op, int mb)
{
    for (int i = 0; i < l->len[k]; i++)
        if (l->a[k][i].op == op && l->a[k][i].micro_batch == mb)
            return i;
    cr_assert_fail("stage %d has no op %d of micro-batch %d", k, op, mb);
    return -1;
}

static void remove_at(lists *l, int k, int i)
{
    memmove(&l->a[k][i], &l->a[k][i + 1], sizeof l->a[k][0] * (size_t)(l->len[k] - i - 1));
    l->len[k]--;
}

Test(placement_schedule, check_refuses_a_send_without_its_receive)
{
    lists l = make(WF_SCHEDULE_1F1B, 4, 6);
    remove_at(&l, 2, find(&l, 2, WF_PIPE_RECV_GRAD, 3));
    /* stage 2's backward of 3 now runs before a received gradient */
    expect_refused(&l, "stage 2");
    free_lists(&l);
    l = make(WF_SCHEDULE_1F1B, 4, 6);
    /* drop a receive and its compute's need: move the receive away entirely by also
     * dropping the forward's dependency is impossible, so drop a send instead */
    remove_at(&l, 1, find(&l, 1, WF_PIPE_SEND_ACT, 2));
    expect_refused(&l, "no stage sends it");
    free_lists(&l);
}

Test(placement_schedule, check_refuses_a_duplicated_send_and_a_wrong_peer)
{
    lists l = make(WF_SCHEDULE_GPIPE, 3, 4);
    int i = find(&l, 0, WF_PIPE_SEND_ACT, 1);
    l.a[0][l.len[0]++] = l.a[0][i];
    expect_refused(&l, "a second send");
    free_lists(&l);
    l = make(WF_SCHEDULE_GPIPE, 3, 4);
    l.a[1][find(&l, 1, WF_PIPE_SEND_ACT, 0)].peer = 0;
    expect_refused(&l, "the peer is not the neighbour");
    free_lists(&l);
    l = make(WF_SCHEDULE_GPIPE, 3, 4);
    l.a[2][find(&l, 2, WF_PIPE_FWD, 0)].op = WF_PIPE_SEND_ACT;
    l.a[2][find(&l, 2, WF_PIPE_SEND_ACT, 0)].peer = 3;
    expect_refused(&l, "no such neighbour");
    free_lists(&l);
}

Test(placement_schedule, check_refuses_a_compute_before_its_receive)
{
    lists l = make(WF_SCHEDULE_1F1B, 2, 2);
    int r = find(&l, 1, WF_PIPE_RECV_ACT, 0), f = find(&l, 1, WF_PIPE_FWD, 0);
    wf_pipe_action t = l.a[1][r];
    l.a[1][r] = l.a[1][f];
    l.a[1][f] = t;
    expect_refused(&l, "before its activations are received");
    free_lists(&l);
}

Test(placement_schedule, check_finds_a_wait_cycle_between_two_stages)
{
    /* Stage 1 waits for the gradient of micro-batch 0 before it sends micro-batch 0's
     * activations... built directly: stage 0 receives the gradient of 0 before it sends the
     * activations of 0; stage 1 needs those activations first. */
    wf_pipe_action s0[] = { { WF_PIPE_FWD, 0, -1 },
                            { WF_PIPE_RECV_GRAD, 0, 1 },
                            { WF_PIPE_SEND_ACT, 0, 1 },
                            { WF_PIPE_BWD, 0, -1 } };
    wf_pipe_action s1[] = { { WF_PIPE_RECV_ACT, 0, 0 },
                            { WF_PIPE_FWD, 0, -1 },
                            { WF_PIPE_BWD, 0, -1 },
                            { WF_PIPE_SEND_GRAD, 0, 0 } };
    const wf_pipe_action *ls[] = { s0, s1 };
    int lens[] = { 4, 4 };
    int rc = wf_pipe_check(2, 1, ls, lens, NULL);
    cr_assert_eq(rc, WF_EINVAL);
    cr_assert(strstr(wf_last_errmsg(), "wait cycle"), "%s", wf_last_errmsg());
    cr_assert(strstr(wf_last_errmsg(), "stage 0 action 1"), "%s", wf_last_errmsg());
    /* the same lists with stage 0's receive after its send run */
    wf_pipe_action t = s0[1];
    s0[1] = s0[2];
    s0[2] = t;
    cr_assert_eq(wf_pipe_check(2, 1, ls, lens, NULL), 0, "%s", wf_last_errmsg());
}

Test(placement_schedule, check_refuses_a_missing_backward_and_a_second_forward)
{
    lists l = make(WF_SCHEDULE_GPIPE, 1, 3);
    remove_at(&l, 0, find(&l, 0, WF_PIPE_BWD, 2));
    expect_refused(&l, "never runs the backward of micro-batch 2");
    free_lists(&l);
    l = make(WF_SCHEDULE_GPIPE, 1, 3);
    l.a[0][find(&l, 0, WF_PIPE_FWD, 1)].micro_batch = 0;
    expect_refused(&l, "a second forward");
    free_lists(&l);
}

Test(placement_schedule, bad_options_are_refused_by_name)
{
    wf_pipe_schedule *s = (wf_pipe_schedule *)1;
    cr_assert_eq(wf_pipe_schedule_create(WF_SCHEDULE_1F1B, 4, 0, &s), WF_EINVAL);
    cr_assert_null(s);
    cr_assert(strstr(wf_last_errmsg(), "micro_batches 0"), "%s", wf_last_errmsg());
    cr_assert_eq(wf_pipe_schedule_create(WF_SCHEDULE_1F1B, 0, 4, &s), WF_EINVAL);
    cr_assert(strstr(wf_last_errmsg(), "stages 0"), "%s", wf_last_errmsg());
    cr_assert_eq(wf_pipe_schedule_create(7, 2, 4, &s), WF_EINVAL);
    cr_assert(strstr(wf_last_errmsg(), "schedule 7"), "%s", wf_last_errmsg());
}
