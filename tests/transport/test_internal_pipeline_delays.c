/* tests/transport/test_internal_pipeline_delays.c: a pipeline cannot deadlock under random
 * timing. Each rank of a 2- and a 3-stage pipeline (the MLP and the CNN of pipeline_util.h,
 * GPipe and 1F1B, m = 4 and m = 2 < 3 stages) sleeps a random 0 .. 2 ms before every send,
 * every recv and every matmul it runs (its session's kernels of those ops are wrapped:
 * internal, hence the file's name), for 32 steps and 8 forward-only runs, within the suite's
 * timeout; every step's loss and the final weights still equal one process's with as many
 * shards, bit for bit: the delays change when things happen, never what is computed.
 * Not here: the equivalence without delays and the failures (test_pipeline.c). */
#include "../../core/op.h"
#include "../../ops/table.h"
#include "../../runtime/internal.h"
#include "pipeline_util.h"

#include <stdatomic.h>

TestSuite(transport_pipeline_delays, .timeout = WF_TEST_TIMEOUT(300), .fini = wf_test_fini);

#define MAX_DELAY_US 2000

/* The kernels wrapped (this rank's session's, before its first run), and a counter that the
 * delays are drawn from (splitmix64 of it and the process id: another sequence per rank). */
static wf_kernel_fn real_send, real_recv, real_matmul;
static _Atomic uint64_t draws;
static _Atomic uint64_t slept_us;

static void random_delay(void)
{
    uint64_t z = atomic_fetch_add(&draws, 1) + 0x9e3779b97f4a7c15ull * (uint64_t)getpid();
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    unsigned us = (unsigned)(z % (MAX_DELAY_US + 1));
    atomic_fetch_add(&slept_us, us);
    usleep(us);
}

static int delayed_send(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                        wf_tensor **out)
{
    random_delay();
    return real_send(ctx, n, in, out);
}

static int delayed_recv(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                        wf_tensor **out)
{
    random_delay();
    return real_recv(ctx, n, in, out);
}

static int delayed_matmul(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                          wf_tensor **out)
{
    random_delay();
    return real_matmul(ctx, n, in, out);
}

/* Replaces 'op''s CPU kernel in 'r' by 'fn' (which calls the old one, kept in '*real'), with
 * the old kernel's data (the communicator of send and recv). */
static void wrap(wf__kernels *r, const wf_op_def *op, wf_kernel_fn fn, wf_kernel_fn *real)
{
    *real = wf__kernels_find(r, op, WF_KERNEL_CPU);
    if (!*real) {
        fprintf(stderr, "no CPU kernel of %s to wrap\n", op->name);
        exit(1);
    }
    if (wf__kernels_register(r, op, WF_KERNEL_CPU, fn, NULL,
                             wf__kernels_data(r, op, WF_KERNEL_CPU)) < 0) {
        fprintf(stderr, "wrapping %s: %s\n", op->name, wf_last_errmsg());
        exit(1);
    }
}

/* Before a rank's first run: the wrappers; after its last: its count of delays, which must
 * not be 0 (else the wrappers never ran and the test would prove nothing). */
static void install_delays(wf_session *s, int stage)
{
    if (s) {
        wrap(s->kernels, &wf_op_send, delayed_send, &real_send);
        wrap(s->kernels, &wf_op_recv, delayed_recv, &real_recv);
        wrap(s->kernels, &wf_op_matmul, delayed_matmul, &real_matmul);
        return;
    }
    uint64_t n = atomic_load(&draws);
    printf("stage %d: %llu random delays, %.1f ms slept\n", stage, (unsigned long long)n,
           (double)atomic_load(&slept_us) * 1e-3);
    fflush(stdout);
    if (n == 0) {
        fprintf(stderr, "stage %d: no delay ran: the wrapped kernels were not called\n", stage);
        exit(1);
    }
}

/* Set in every process of this executable (the ranks are it again): before the ranks' main
 * (transport_util.h's constructor 200) runs. */
__attribute__((constructor(101))) static void set_hook(void)
{
    pp_session_hook = install_delays;
}

static void check_delayed(int model, int stages, int micro, int schedule)
{
    pp_arg a = { .model = model,
                 .stages = stages,
                 .micro = micro,
                 .schedule = schedule,
                 .steps = MAXSTEP,
                 .batch = 30 };
    check_run(&a, 0);
}

Test(transport_pipeline_delays, two_stages_gpipe_with_random_delays_train_the_same_bits)
{
    check_delayed(NET_MLP, 2, 4, WF_SCHEDULE_GPIPE);
}

Test(transport_pipeline_delays, two_stages_1f1b_with_random_delays_train_the_same_bits)
{
    check_delayed(NET_MLP, 2, 4, WF_SCHEDULE_1F1B);
}

Test(transport_pipeline_delays, three_stages_gpipe_with_random_delays_train_the_same_bits)
{
    check_delayed(NET_MLP, 3, 4, WF_SCHEDULE_GPIPE);
}

Test(transport_pipeline_delays, three_stages_1f1b_with_random_delays_train_the_same_bits)
{
    check_delayed(NET_MLP, 3, 4, WF_SCHEDULE_1F1B);
}

Test(transport_pipeline_delays, three_stages_1f1b_with_fewer_micro_batches_than_stages)
{
    check_delayed(NET_MLP, 3, 2, WF_SCHEDULE_1F1B);
}

Test(transport_pipeline_delays, a_cnn_in_three_stages_1f1b_with_random_delays)
{
    check_delayed(NET_CNN, 3, 4, WF_SCHEDULE_1F1B);
}
