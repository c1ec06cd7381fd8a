/* tests/transport/restart_train.c: a data-parallel training program that survives restarts,
 * for the restart and multi-node tests and the soak (perf/soak.sh).
 *   restart_train --dir DIR --steps S [--every K] [--step-ms M] [--kill INC:RANK:STEP:HOW,...]
 * Every rank trains one linear model (w f32 [16, 1], b f32 [1]) with Adam on its own
 * batches (a fixed function of rank and step), averaging the gradients over the ranks with
 * one wf_comm_allreduce per step, so every rank holds the same bits. Rank 0 saves the
 * whole state (weights, Adam's moments and step counter, and "run/step", the next step)
 * with wf_checkpoint_save() to DIR/ckpt.safetensors every K steps (1 by default); at start
 * every rank loads that file when it exists and goes on from its step. The final state goes
 * to DIR/final.safetensors, and each rank prints "rank R final step S hash H" (FNV-1a of
 * w and b): a run with restarts must print the hash of one without. With K > 1 rank 0
 * also prints "rank 0 saved step N" after each save.
 * --kill: in incarnation INC (WEFT_INCARNATION) rank RANK, on reaching step STEP, dies:
 *   HOW "kill" raises SIGKILL, "exit" exits with status 7 (before that step's all-reduce,
 *   so the newest checkpoint is at most one step behind any rank). --step-ms sleeps M ms a
 *   step (the soak's stand-in for work). At start each rank prints "rank R pid P start S".
 * Exit status: 0, 1 (a failed call, said on stderr), 2 (usage). */
#include <weft/weft.h>

#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { DIM = 16, BATCH = 32 };

typedef struct args {
    const char *dir, *kill;
    long steps, every, step_ms;
} args;

/* A failed call. A survivor of a peer's failure (WF_EPEER) waits 100 ms before its exit, so
 * that weft-run, which names the first exit it reaps as the cause and returns its status,
 * sees the dying rank's exit first even when both exits reach it in one loop iteration
 * (weft-run's SIGTERM usually ends the wait). */
static int fail(const char *what, int rc, const char *msg)
{
    fprintf(stderr, "%s: %s: %s\n", what, wf_strerror(rc), msg);
    if (rc == WF_EPEER)
        nanosleep(&(struct timespec){ .tv_nsec = 100 * 1000 * 1000 }, NULL);
    return 1;
}

static int parse(int argc, char **argv, args *a)
{
    *a = (args){ .every = 1 };
    for (int i = 1; i + 1 < argc; i += 2) {
        char *end;
        long v = strtol(argv[i + 1], &end, 10);
        bool num = *end == 0 && end != argv[i + 1] && v >= 0;
        if (!strcmp(argv[i], "--dir"))
            a->dir = argv[i + 1];
        else if (!strcmp(argv[i], "--kill"))
            a->kill = argv[i + 1];
        else if (!strcmp(argv[i], "--steps") && num)
            a->steps = v;
        else if (!strcmp(argv[i], "--every") && num && v > 0)
            a->every = v;
        else if (!strcmp(argv[i], "--step-ms") && num)
            a->step_ms = v;
        else
            return -1;
    }
    return argc % 2 == 1 && a->dir && a->steps > 0 ? 0 : -1;
}

/* Dies as --kill says for (incarnation, rank, step), or returns. */
static void maybe_die(const char *spec, long inc, int rank, long step)
{
    for (const char *p = spec; p && *p;) {
        long i, r, s;
        char how[8] = "";
        if (sscanf(p, "%ld:%ld:%ld:%7[a-z]", &i, &r, &s, how) == 4 && i == inc && r == rank &&
            s == step) {
            fflush(NULL);
            if (!strcmp(how, "exit"))
                _exit(7);
            raise(SIGKILL);
        }
        p = strchr(p, ',');
        p = p ? p + 1 : NULL;
    }
}

/* Batch 'step' of rank 'rank': x uniform in [-1, 1) by a 64-bit LCG, y = x . (1..DIM) / DIM
 * + 0.5 plus small noise. */
static void batch(int rank, long step, float *x, float *y)
{
    uint64_t st = (uint64_t)rank * 0x9e3779b97f4a7c15ull ^ (uint64_t)step * 0xbf58476d1ce4e5b9ull;
    for (int i = 0; i < BATCH; i++) {
        double t = 0.5;
        for (int j = 0; j < DIM; j++) {
            st = st * 6364136223846793005ull + 1442695040888963407ull;
            x[i * DIM + j] = (float)((double)(st >> 11) / 4503599627370496.0 - 1.0);
            t += x[i * DIM + j] * (j + 1) / (double)DIM;
        }
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        y[i] = (float)(t + ((double)(st >> 11) / 9007199254740992.0 - 0.5) * 0.01);
    }
}

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        h = (h ^ ((const unsigned char *)p)[i]) * 0x100000001b3ull;
    return h;
}

int main(int argc, char **argv)
{
    args a;
    if (parse(argc, argv, &a) != 0) {
        fprintf(stderr,
                "usage: %s --dir DIR --steps S [--every K] [--step-ms M] "
                "[--kill INC:RANK:STEP:kill|exit,...]\n",
                argv[0]);
        return 2;
    }
    wf_comm_opts o = { .rank = 0, .size = 1 };
    int rc = wf_dist_opts_from_env(&o);
    if (rc < 0)
        return fail("wf_dist_opts_from_env", rc, wf_last_errmsg());
    const char *inc_s = getenv("WEFT_INCARNATION");
    long inc = inc_s ? strtol(inc_s, NULL, 10) : 0;
    wf_comm *c = NULL;
    if ((rc = wf_comm_create(NULL, &o, &c)) < 0)
        return fail("wf_comm_create", rc, wf_last_errmsg());
    int rank = wf_comm_rank(c);

    wf_runtime *rt;
    if ((rc = wf_runtime_create(&rt, &(wf_runtime_opts){ .n_workers = 1 })) < 0)
        return fail("wf_runtime_create", rc, wf_last_errmsg());
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(BATCH, DIM));
    wf_node *y = wf_placeholder(g, "y", WF_F32, WF_SHAPE(BATCH, 1));
    wf_node *w = wf_variable(g, "w", WF_F32, WF_SHAPE(DIM, 1), wf_init_uniform(7, -0.1, 0.1));
    wf_node *b = wf_variable(g, "b", WF_F32, WF_SHAPE(1), wf_init_zeros());
    wf_node *stepv = wf_variable(g, "run/step", WF_I64, WF_SHAPE(1), wf_init_zeros());
    wf_node *loss = wf_mean(g, wf_square(g, wf_sub(g, wf_add(g, wf_matmul(g, x, w), b), y)));
    wf_node *vars[2] = { w, b }, *grads[2];
    wf_node *gw = wf_placeholder(g, "gw", WF_F32, WF_SHAPE(DIM, 1));
    wf_node *gb = wf_placeholder(g, "gb", WF_F32, WF_SHAPE(1));
    wf_node *fed[2] = { gw, gb };
    rc = wf_gradients(g, loss, vars, 2, grads);
    wf_node *train = rc < 0 ? NULL : wf_apply_gradients(g, wf_adam(0.01), vars, fed, 2);
    wf_session *s = NULL;
    if (!train || wf_graph_status(g) < 0 || (rc = wf_session_create(g, NULL, &s)) < 0)
        return fail("graph", WF_EINVAL, wf_graph_errmsg(g));

    char ckpt[4096], final[4096];
    snprintf(ckpt, sizeof ckpt, "%s/ckpt.safetensors", a.dir);
    snprintf(final, sizeof final, "%s/final.safetensors", a.dir);
    long start = 0;
    if (access(ckpt, F_OK) == 0) {
        wf_tensor *t = NULL;
        if ((rc = wf_checkpoint_load(s, ckpt, 0)) < 0 ||
            (rc = wf_session_variable(s, stepv, &t)) < 0)
            return fail("resume", rc, wf_session_errmsg(s));
        start = (long)wf_tensor_get(t, 0);
        wf_tensor_release(t);
    }
    printf("rank %d pid %d start %ld\n", rank, (int)getpid(), start);
    fflush(stdout);

    float xb[BATCH * DIM], yb[BATCH], gsum[DIM + 1];
    for (long step = start; step < a.steps; step++) {
        maybe_die(a.kill, inc, rank, step);
        batch(rank, step, xb, yb);
        wf_tensor *xt = wf_tensor_from(WF_F32, WF_SHAPE(BATCH, DIM), xb);
        wf_tensor *yt = wf_tensor_from(WF_F32, WF_SHAPE(BATCH, 1), yb);
        wf_feed feeds[2] = { { x, xt }, { y, yt } };
        wf_tensor *outs[2] = { NULL, NULL };
        rc = wf_session_run(s, feeds, 2, grads, 2, outs, NULL, 0);
        if (rc < 0)
            return fail("gradients", rc, wf_session_errmsg(s));
        memcpy(gsum, wf_tensor_data_f32(outs[0]), DIM * sizeof(float));
        gsum[DIM] = wf_tensor_data_f32(outs[1])[0];
        wf_tensor_release(outs[0]);
        wf_tensor_release(outs[1]);
        if ((rc = wf_comm_allreduce(c, gsum, gsum, DIM + 1, WF_F32, WF_REDUCE_MEAN)) < 0)
            return fail("wf_comm_allreduce", rc, wf_last_errmsg());
        wf_tensor *gwt = wf_tensor_from(WF_F32, WF_SHAPE(DIM, 1), gsum);
        wf_tensor *gbt = wf_tensor_from(WF_F32, WF_SHAPE(1), gsum + DIM);
        int64_t next = step + 1;
        wf_tensor *st = wf_tensor_from(WF_I64, WF_SHAPE(1), &next);
        /* The update is ordered after every reader of w and b (the forward pass): it needs
         * the batch again. */
        wf_feed gf[4] = { { x, xt }, { y, yt }, { gw, gwt }, { gb, gbt } };
        rc = wf_session_run(s, gf, 4, NULL, 0, NULL, &train, 1);
        wf_tensor_release(xt);
        wf_tensor_release(yt);
        if (rc == 0)
            rc = wf_session_assign(s, stepv, st);
        wf_tensor_release(gwt);
        wf_tensor_release(gbt);
        wf_tensor_release(st);
        if (rc < 0)
            return fail("update", rc, wf_session_errmsg(s));
        if (rank == 0 && next % a.every == 0) {
            if ((rc = wf_checkpoint_save(s, ckpt)) < 0)
                return fail("wf_checkpoint_save", rc, wf_session_errmsg(s));
            if (a.every > 1) { /* the soak times steps by these lines */
                printf("rank 0 saved step %ld\n", (long)next);
                fflush(stdout);
            }
        }
        if (a.step_ms)
            nanosleep(&(struct timespec){ a.step_ms / 1000, a.step_ms % 1000 * 1000000 }, NULL);
    }
    wf_tensor *wt = NULL, *bt = NULL;
    if ((rc = wf_session_variable(s, w, &wt)) < 0 || (rc = wf_session_variable(s, b, &bt)) < 0)
        return fail("wf_session_variable", rc, wf_session_errmsg(s));
    uint64_t h = fnv(0xcbf29ce484222325ull, wf_tensor_data_f32(wt), DIM * sizeof(float));
    h = fnv(h, wf_tensor_data_f32(bt), sizeof(float));
    wf_tensor_release(wt);
    wf_tensor_release(bt);
    if (rank == 0 && (rc = wf_checkpoint_save(s, final)) < 0)
        return fail("wf_checkpoint_save", rc, wf_session_errmsg(s));
    /* Every rank's all-reduces are done before any leaves: a rank that left early would
     * fail a slower one's last all-reduce. */
    if ((rc = wf_comm_barrier(c)) < 0)
        return fail("wf_comm_barrier", rc, wf_last_errmsg());
    printf("rank %d final step %ld hash %016llx\n", rank, a.steps, (unsigned long long)h);
    fflush(stdout);
    wf_session_destroy(s);
    wf_graph_destroy(g);
    wf_runtime_destroy(rt);
    wf_comm_destroy(c);
    return 0;
}
