/* tests/transport/test_ps.c: synchronous parameter servers (wf_strategy_ps(), weft/distribute.h)
 * on real processes: 1 server + 2 workers, 2 servers + 2 workers and 1 server + 3 workers (an
 * uneven batch) train an MLP to the bits of MultiWorkerMirrored over as many ranks as workers
 * (per-step losses and the bytes of the final weights),
 * and follow the single-process run (losses within 1e-6 relative); a server's run needs no
 * batch and fetches the same global loss; a killed server, and a killed worker, fail every
 * other rank's run within 2 s with WF_EPEER naming it; bad options are refused.
 * Asynchronous servers (staleness s = 1, 2; 1 server + 2 workers): with one worker slowed,
 * the SSP bound holds on every step of both workers while the fast one waits for the slow
 * one; on the bundled digits the server's final weights reach the synchronous run's test
 * accuracy within 1 point; a killed server or worker fails the others within 2 s.
 * Ranks are processes on loopback (transport_util.h); the first worker writes its losses and
 * weights to a file, server 0 its losses to another. The single-process reference runs in the
 * test's own process. */
#include "transport_util.h"

#include <fcntl.h>
#include <math.h>

TestSuite(transport_ps, .timeout = WF_TEST_TIMEOUT(240), .fini = wf_test_fini);

#define IN    64
#define HID   32
#define OUT   10
#define STEPS 20
#define BATCH 32
#define NW    (IN * HID + HID + HID * OUT + OUT)

enum { S_PS, S_MW, S_PLAIN };

typedef struct ps_arg {
    int kind;       /* S_PS or S_MW */
    int servers;    /* S_PS: K */
    int feed_srv;   /* S_PS: servers feed the batch too (it is ignored) */
    int ready_fd;   /* kill tests: each rank writes a byte once its session is made */
    int victim;     /* kill tests: the rank the test kills */
    int staleness;  /* kill tests: s (0: synchronous) */
    char path[160]; /* the first worker writes its result here, server 0 to path + ".srv" */
} ps_arg;

typedef struct ps_result {
    float loss[STEPS];
    float w[NW];
} ps_result;

static void batch_of(int s, int rows, float *x, int32_t *y)
{
    for (int i = 0; i < rows; i++) {
        for (int j = 0; j < IN; j++)
            x[i * IN + j] = cosf(0.29f * (float)(i * IN + j) - 0.7f * (float)s);
        y[i] = (i * 5 + s * 3) % OUT;
    }
}

typedef struct net {
    wf_graph *g;
    wf_node *x, *y, *loss, *train, *vars[4];
} net;

static int net_build(wf_runtime *rt, net *m)
{
    m->g = wf_graph_create(rt, WF_STATIC);
    m->x = wf_placeholder(m->g, "x", WF_F32, WF_SHAPE(-1, IN));
    m->y = wf_placeholder(m->g, "y", WF_I32, WF_SHAPE(-1));
    m->vars[0] = wf_variable(m->g, "w1", WF_F32, WF_SHAPE(IN, HID), wf_init_glorot_uniform(3));
    m->vars[1] = wf_variable(m->g, "b1", WF_F32, WF_SHAPE(HID), wf_init_zeros());
    m->vars[2] = wf_variable(m->g, "w2", WF_F32, WF_SHAPE(HID, OUT), wf_init_glorot_uniform(4));
    m->vars[3] = wf_variable(m->g, "b2", WF_F32, WF_SHAPE(OUT), wf_init_zeros());
    wf_node *h = wf_relu(m->g, wf_add(m->g, wf_matmul(m->g, m->x, m->vars[0]), m->vars[1]));
    wf_node *logits = wf_add(m->g, wf_matmul(m->g, h, m->vars[2]), m->vars[3]);
    m->loss = wf_mean(m->g, wf_softmax_cross_entropy(m->g, logits, m->y));
    m->train = wf_minimize(m->g, wf_adam(1e-2), m->loss);
    return m->train ? 0 : -1;
}

/* One step: the batch of step 'step' (fed unless 'feed' is false), the loss into '*loss'. */
static int step_once(wf_session *s, const net *m, int step, bool feed, float *loss, double *dt)
{
    static float x[BATCH * IN];
    int32_t y[BATCH];
    batch_of(step, BATCH, x, y);
    wf_tensor *xt = wf_tensor_from(WF_F32, WF_SHAPE(BATCH, IN), x);
    wf_tensor *yt = wf_tensor_from(WF_I32, WF_SHAPE(BATCH), y);
    wf_feed f[] = { { m->x, xt }, { m->y, yt } };
    wf_tensor *out = NULL;
    uint64_t t0 = wf_test_now_ns();
    int rc = wf_session_run(s, feed ? f : NULL, feed ? 2 : 0, &m->loss, 1, &out, &m->train, 1);
    if (dt)
        *dt = (double)(wf_test_now_ns() - t0) * 1e-9;
    if (rc == 0 && loss)
        *loss = wf_tensor_data_f32(out)[0];
    wf_tensor_release(out);
    wf_tensor_release(xt);
    wf_tensor_release(yt);
    return rc;
}

/* Trains STEPS steps under 'st' (NULL: a plain session); 'feed': whether to feed the batch. */
static int train(wf_runtime *rt, const wf_strategy *st, bool feed, ps_result *res)
{
    net m;
    TU_CHECK(net_build(rt, &m) == 0, "build: %s", wf_graph_errmsg(m.g));
    wf_session *s = NULL;
    TU_OK(wf_session_create(m.g, &(wf_session_opts){ .strategy = st }, &s));
    for (int step = 0; step < STEPS; step++) {
        int rc = step_once(s, &m, step, feed, &res->loss[step], NULL);
        TU_CHECK(rc == 0, "step %d: %s: %s", step, wf_err_name(rc), wf_session_errmsg(s));
    }
    size_t off = 0;
    for (int k = 0; k < 4; k++) {
        wf_tensor *v = NULL;
        TU_OK(wf_session_variable(s, m.vars[k], &v));
        size_t n = (size_t)wf_shape_numel(wf_tensor_shape(v));
        TU_OK(wf_tensor_read(v, WF_F32, res->w + off, n * sizeof(float)));
        off += n;
        wf_tensor_release(v);
    }
    wf_session_destroy(s);
    wf_graph_destroy(m.g);
    return 0;
}

static int write_file(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    TU_CHECK(f, "open %s", path);
    TU_CHECK(fwrite(p, n, 1, f) == 1, "write %s", path);
    fclose(f);
    return 0;
}

static int make_strategy(wf_comm *c, const ps_arg *a, wf_strategy **st)
{
    if (a->kind == S_MW)
        TU_OK(wf_strategy_multiworker(c, NULL, st));
    else
        TU_OK(wf_strategy_ps(c, &(wf_ps_opts){ .servers = a->servers }, st));
    return 0;
}

static int rank_train(wf_comm *c, int rank, int size, void *argp)
{
    (void)size;
    const ps_arg *a = argp;
    wf_strategy *st = NULL;
    TU_OK(make_strategy(c, a, &st));
    int server = wf_strategy_is_server(st);
    TU_CHECK(server == (a->kind == S_PS && rank < a->servers), "rank %d: is_server %d", rank,
             server);
    ps_result *r = calloc(1, sizeof *r);
    TU_CHECK(r, "no memory");
    int rc = train(tu_rt, st, !server || a->feed_srv, r);
    int first_worker = a->kind == S_PS ? a->servers : 0;
    if (rc == 0 && rank == first_worker)
        rc = write_file(a->path, r, sizeof *r);
    if (rc == 0 && a->kind == S_PS && rank == 0) {
        char p[200];
        snprintf(p, sizeof p, "%s.srv", a->path);
        rc = write_file(p, r->loss, sizeof r->loss);
    }
    free(r);
    wf_strategy_destroy(st);
    return rc;
}
TU_REGISTER(rank_train)

static void read_file(const char *path, void *p, size_t n)
{
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "no result file %s", path);
    cr_assert_eq(fread(p, n, 1, f), 1);
    fclose(f);
    unlink(path);
}

static void run_ranks(int size, ps_arg *a)
{
    tu_run t = { .size = size,
                 .body = rank_train,
                 .arg = a,
                 .arg_size = sizeof *a,
                 .timeout_s = WF_TEST_TIMEOUT(60),
                 .with_rt = true };
    tu_start(&t);
    cr_assert(tu_wait(&t), "%d ranks did not finish in time", size);
    for (int i = 0; i < size; i++)
        cr_assert(WIFEXITED(t.status[i]) && WEXITSTATUS(t.status[i]) == 0,
                  "rank %d of %d failed (status %d; stderr says why)", i, size, t.status[i]);
}

/* Multiworker over 'ranks' ranks, and the parameter servers: K servers + W workers. */
static void run_mw(int ranks, ps_result *r)
{
    ps_arg a = { .kind = S_MW };
    snprintf(a.path, sizeof a.path, "/tmp/weft-ps-%d-mw.bin", (int)getpid());
    run_ranks(ranks, &a);
    read_file(a.path, r, sizeof *r);
}

static void run_ps(int servers, int workers, bool feed_srv, ps_result *r, float *srv_loss)
{
    ps_arg a = { .kind = S_PS, .servers = servers, .feed_srv = feed_srv };
    snprintf(a.path, sizeof a.path, "/tmp/weft-ps-%d-ps%d.bin", (int)getpid(), servers);
    run_ranks(servers + workers, &a);
    read_file(a.path, r, sizeof *r);
    char p[200];
    snprintf(p, sizeof p, "%s.srv", a.path);
    read_file(p, srv_loss, sizeof(float) * STEPS);
}

static void run_plain(ps_result *r)
{
    wf_runtime *rt = NULL;
    cr_assert_eq(wf_runtime_create(&rt, &(wf_runtime_opts){ .n_workers = 2 }), 0);
    cr_assert_eq(train(rt, NULL, true, r), 0, "the local run failed");
    wf_runtime_destroy(rt);
}

static void check_against(const ps_result *ps, const float *srv, const ps_result *mw,
                          const ps_result *plain, const char *what)
{
    for (int s = 0; s < STEPS; s++) {
        cr_assert(!memcmp(&ps->loss[s], &mw->loss[s], sizeof(float)),
                  "%s: step %d: loss %.9g, multiworker %.9g", what, s, ps->loss[s], mw->loss[s]);
        cr_assert(!memcmp(&srv[s], &ps->loss[s], sizeof(float)),
                  "%s: step %d: server 0 fetched %.9g, the worker %.9g", what, s, srv[s],
                  ps->loss[s]);
        double d = fabs((double)ps->loss[s] - (double)plain->loss[s]);
        cr_assert(d <= 1e-6 * fabs((double)plain->loss[s]),
                  "%s: step %d: loss %.9g vs one process %.9g (%.3g relative)", what, s,
                  ps->loss[s], plain->loss[s], d / fabs((double)plain->loss[s]));
    }
    cr_assert(!memcmp(ps->w, mw->w, sizeof ps->w),
              "%s: the final weights differ from "
              "multiworker's",
              what);
    cr_assert(ps->loss[STEPS - 1] < ps->loss[0], "%s: the loss did not fall (%.6g -> %.6g)", what,
              ps->loss[0], ps->loss[STEPS - 1]);
}

Test(transport_ps, one_server_two_workers_equal_multiworker_bitwise_without_a_batch_on_the_server)
{
    static ps_result ps, mw, plain;
    static float srv[STEPS];
    run_ps(1, 2, false, &ps, srv);
    run_mw(2, &mw);
    run_plain(&plain);
    check_against(&ps, srv, &mw, &plain, "1 server + 2 workers");
}

Test(transport_ps, two_servers_two_workers_equal_multiworker_bitwise)
{
    static ps_result ps, mw, plain;
    static float srv[STEPS];
    run_ps(2, 2, true, &ps, srv);
    run_mw(2, &mw);
    run_plain(&plain);
    check_against(&ps, srv, &mw, &plain, "2 servers + 2 workers");
}

/* 3 workers: the batch of 32 rows splits into shards of 11, 11 and 10 (weighted by rows). */
Test(transport_ps, one_server_three_workers_with_an_uneven_batch_equal_multiworker_bitwise)
{
    static ps_result ps, mw, plain;
    static float srv[STEPS];
    run_ps(1, 3, false, &ps, srv);
    run_mw(3, &mw);
    run_plain(&plain);
    check_against(&ps, srv, &mw, &plain, "1 server + 3 workers");
}

/* 1 server with staleness s: the strategy, the MLP and its session. */
static int ps_session(wf_comm *c, int staleness, wf_strategy **st, net *m, wf_session **s)
{
    TU_OK(wf_strategy_ps(c, &(wf_ps_opts){ .servers = 1, .staleness = staleness }, st));
    TU_CHECK(net_build(tu_rt, m) == 0, "build: %s", wf_graph_errmsg(m->g));
    TU_OK(wf_session_create(m->g, &(wf_session_opts){ .strategy = *st }, s));
    return 0;
}

/* 1 server + 2 workers; every rank makes its session, then the test kills 'victim': every
 * other rank's run fails within 2 s with WF_EPEER naming it. */
static int rank_kill(wf_comm *c, int rank, int size, void *argp)
{
    (void)size;
    const ps_arg *a = argp;
    wf_strategy *st = NULL;
    wf_session *s = NULL;
    net m;
    TU_OK(ps_session(c, a->staleness, &st, &m, &s));
    float loss;
    TU_OK(step_once(s, &m, 0, true, &loss, NULL)); /* one good step first */
    /* Asynchronous: a fast worker could otherwise push its step 1 before the other's step 0
     * and fill the server's first run, leaving the other's step 0 to a run the victim never
     * makes (never ready). After one run everywhere every push is applied. */
    if (a->staleness > 0)
        TU_OK(wf_session_ps_sync(s));
    TU_CHECK(write(a->ready_fd, "r", 1) == 1, "ready");
    if (rank == a->victim)
        for (;;) /* until the test kills this rank, never running */
            wf_test_sleep_us(10000);
    double dt;
    /* Asynchronous: a survivor may make up to s steps more before the bound (or the missing
     * server) holds it; the run that waits fails. */
    int rc = 0;
    for (int step = 1; step < 40 && rc == 0; step++)
        rc = step_once(s, &m, step, true, NULL, &dt);
    char want[16];
    snprintf(want, sizeof want, "rank %d", a->victim);
    const char *msg = wf_session_errmsg(s);
    printf("rank %d: %s after %.3f s: %s\n", rank, wf_err_name(rc), dt, msg);
    TU_CHECK(rc == WF_EPEER, "rank %d: the run gave %s: %s", rank, wf_err_name(rc), msg);
    TU_CHECK(strstr(msg, want), "rank %d: the message names no %s: %s", rank, want, msg);
    TU_CHECK(dt < 2.0, "rank %d: the failure took %.2f s", rank, dt);
    wf_session_destroy(s);
    wf_graph_destroy(m.g);
    wf_strategy_destroy(st);
    return 0;
}
TU_REGISTER(rank_kill)

static void run_kill(int victim, int staleness)
{
    int fds[2];
    tu_ready_pipe(fds);
    ps_arg a = { .ready_fd = fds[1], .victim = victim, .staleness = staleness };
    tu_run t = { .size = 3,
                 .body = rank_kill,
                 .arg = &a,
                 .arg_size = sizeof a,
                 .timeout_s = 60,
                 .with_rt = true };
    tu_kill_rank(&t, fds, victim, 3);
}

Test(transport_ps, a_killed_server_fails_every_worker_within_2s_with_epeer_naming_it)
{
    run_kill(0, 0);
}

Test(transport_ps, a_killed_worker_fails_the_server_and_the_other_worker_within_2s)
{
    run_kill(2, 0);
}

Test(transport_ps, asynchronous_a_killed_server_fails_every_worker_within_2s_with_epeer)
{
    run_kill(0, 1);
}

Test(transport_ps, asynchronous_a_killed_worker_fails_the_server_and_the_other_worker_within_2s)
{
    run_kill(2, 1);
}

/* Bad options, on 2 ranks: K >= N, K < 1, negative staleness; the statistics and the gather
 * of a session without parameter servers. */
static int rank_bad_opts(wf_comm *c, int rank, int size, void *argp)
{
    (void)rank;
    (void)argp;
    wf_strategy *st = (wf_strategy *)1;

    static const struct {
        wf_ps_opts o;
        int rc;
        const char *msg;
    } cases[] = {
        { { .servers = 2 }, WF_EINVAL, "2 servers in a world of 2 ranks" },
        { { .servers = 3 }, WF_EINVAL, "3 servers in a world of 2 ranks" },
        { { .servers = 0 }, WF_EINVAL, "0 servers" },
        { { .servers = -1 }, WF_EINVAL, "-1 servers" },
        { { .servers = 1, .staleness = -1 }, WF_EINVAL, "staleness -1 is negative" },
        { { .servers = 1, .staleness = 2 }, 0, "" },
        { { .servers = 1, .shards = 3, .aggregation = 0 }, 0, "" },
        { { .servers = 1, .aggregation = 7 }, WF_EINVAL, "unknown aggregation 7" },
        { { .servers = 1, .shards = 65 }, WF_EINVAL, "65 shards per worker (at most 64)" },
        { { .servers = 1, .shards = -2 }, WF_EINVAL, "shards is -2 (0: the 1 workers)" },
    };

    TU_CHECK(size == 2, "size %d", size);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int rc = wf_strategy_ps(c, &cases[i].o, &st);
        TU_CHECK(rc == cases[i].rc, "case %zu: %s, want %s: %s", i, wf_err_name(rc),
                 wf_err_name(cases[i].rc), wf_last_errmsg());
        TU_CHECK(rc == 0 ? st != NULL : st == NULL, "case %zu: out", i);
        TU_CHECK(rc == 0 || strstr(wf_last_errmsg(), cases[i].msg), "case %zu: message: %s", i,
                 wf_last_errmsg());
        wf_strategy_destroy(st);
        st = NULL;
    }
    return 0;
}
TU_REGISTER(rank_bad_opts)

Test(transport_ps, bad_options_give_einval_naming_the_values)
{
    tu_run_all(2, NULL, rank_bad_opts, NULL, 0, WF_TEST_TIMEOUT(30));
    wf_strategy *st = NULL;
    cr_assert_eq(wf_strategy_ps(NULL, &(wf_ps_opts){ .servers = 1 }, &st), WF_EINVAL);
    cr_assert(strstr(wf_last_errmsg(), "comm is NULL"), "%s", wf_last_errmsg());
    cr_assert_null(st);
    cr_assert_eq(wf_strategy_is_server(NULL), WF_EINVAL);
    wf_ps_stats ps_st;
    cr_assert_eq(wf_session_ps_stats(NULL, &ps_st), WF_EINVAL);
    cr_assert_eq(wf_session_ps_sync(NULL), WF_EINVAL);
    /* a session without parameter servers: no statistics, nothing to gather */
    wf_runtime *rt = NULL;
    cr_assert_eq(wf_runtime_create(&rt, &(wf_runtime_opts){ .n_workers = 1 }), 0);
    net m;
    cr_assert_eq(net_build(rt, &m), 0);
    wf_session *s = NULL;
    cr_assert_eq(wf_session_create(m.g, NULL, &s), 0);
    cr_assert_eq(wf_session_ps_stats(s, &ps_st), WF_EINVAL);
    cr_assert(strstr(wf_session_errmsg(s), "no asynchronous parameter-server"), "%s",
              wf_session_errmsg(s));
    cr_assert_eq(wf_session_ps_sync(s), WF_EINVAL);
    cr_assert(strstr(wf_session_errmsg(s), "no parameter-server strategy"), "%s",
              wf_session_errmsg(s));
    wf_session_destroy(s);
    wf_graph_destroy(m.g);
    wf_runtime_destroy(rt);
}

/* ---- Asynchronous servers (staleness s > 0) -------------------------------------------
 * 1 server + 2 workers. Each worker checks after every run that the copy its next step
 * computes on keeps the bound (clock - min clock <= s: wf_session_ps_stats()) and writes its
 * statistics; server 0 writes the final weights and its own. */
#define ASTEPS 300
#define ABATCH 64

typedef struct async_arg {
    int staleness; /* 0: the synchronous reference */
    int slow_rank; /* a worker that sleeps 'slow_us' before each step (-1: none) */
    int slow_us;
    int steps;
    bool digits; /* the bundled digits (else the synthetic batches above) */
    char path[160];
} async_arg;

typedef struct async_result {
    wf_ps_stats st;
    long long bad_step; /* the first step whose copy broke the bound, -1 */
    double elapsed_s;
    float w[NW]; /* server 0: the final weights */
} async_result;

#ifdef WT_DIGITS_PATH
#    include <weft-train/data.h>

/* The digits, split and normalised the same way in every process. */
static int digits(wt_dataset *train, wt_dataset *test)
{
    wt_dataset all;
    char err[256];
    TU_CHECK(wt_load_csv(WT_DIGITS_PATH, &all, err, sizeof err) == 0, "digits: %s", err);
    int rc = wt_split(&all, 0.2, 7, train, test, err, sizeof err);
    wt_dataset_free(&all);
    TU_CHECK(rc == 0, "split: %s", err);
    TU_CHECK(wt_normalize(train, test, err, sizeof err) == 0, "normalize: %s", err);
    TU_CHECK(train->n_features == IN && train->n_classes == OUT, "digits: %lld features",
             (long long)train->n_features);
    return 0;
}
#endif

static int rank_async(wf_comm *c, int rank, int size, void *argp)
{
    (void)size;
    const async_arg *a = argp;
    wf_strategy *st = NULL;
    wf_session *s = NULL;
    net m;
    TU_OK(ps_session(c, a->staleness, &st, &m, &s));
    async_result *r = calloc(1, sizeof *r);
    float *x = malloc(sizeof(float) * ABATCH * IN);
    int32_t *y = malloc(sizeof(int32_t) * ABATCH);
    TU_CHECK(r && x && y, "no memory");
    r->bad_step = -1;
#ifdef WT_DIGITS_PATH
    wt_dataset train, test;
    int64_t *perm = NULL;
    if (a->digits) {
        TU_OK(digits(&train, &test));
        TU_CHECK(perm = malloc(sizeof *perm * (size_t)train.n), "no memory");
    }
#endif
    uint64_t t0 = wf_test_now_ns();
    for (int step = 0; step < a->steps; step++) {
        if (rank == a->slow_rank)
            wf_test_sleep_us(a->slow_us);
#ifdef WT_DIGITS_PATH
        if (a->digits) {
            int64_t per = train.n / ABATCH, k = step % per;
            if (k == 0)
                wt_permutation(train.n, 11 + (uint64_t)(step / per), perm);
            TU_OK(wt_batch(&train, perm, k * ABATCH, ABATCH, x, y));
        } else
#endif
            batch_of(step, ABATCH, x, y);
        wf_tensor *xt = wf_tensor_from(WF_F32, WF_SHAPE(ABATCH, IN), x);
        wf_tensor *yt = wf_tensor_from(WF_I32, WF_SHAPE(ABATCH), y);
        wf_feed f[] = { { m.x, xt }, { m.y, yt } };
        wf_tensor *out = NULL;
        int rc = wf_session_run(s, f, 2, &m.loss, 1, &out, &m.train, 1);
        TU_CHECK(rc == 0, "rank %d step %d: %s: %s", rank, step, wf_err_name(rc),
                 wf_session_errmsg(s));
        TU_CHECK(isfinite(wf_tensor_data_f32(out)[0]), "rank %d step %d: loss not finite", rank,
                 step);
        wf_tensor_release(out);
        wf_tensor_release(xt);
        wf_tensor_release(yt);
        if (a->staleness > 0) {
            TU_OK(wf_session_ps_stats(s, &r->st));
            if (rank > 0) {
                TU_CHECK(r->st.clock == step + 1, "rank %d step %d: clock %lld", rank, step,
                         r->st.clock);
                if (r->st.clock - r->st.min_clock > a->staleness && r->bad_step < 0)
                    r->bad_step = step + 1;
            }
        }
    }
    r->elapsed_s = (double)(wf_test_now_ns() - t0) * 1e-9;
    char p[200];
    snprintf(p, sizeof p, "%s.%d", a->path, rank);
    int rc = 0;
    if (rank == 0) {
        size_t off = 0;
        for (int k = 0; k < 4 && rc == 0; k++) {
            wf_tensor *v = NULL;
            TU_OK(wf_session_variable(s, m.vars[k], &v));
            size_t n = (size_t)wf_shape_numel(wf_tensor_shape(v));
            rc = wf_tensor_read(v, WF_F32, r->w + off, n * sizeof(float));
            off += n;
            wf_tensor_release(v);
        }
    }
    if (rc == 0)
        rc = write_file(p, r, sizeof *r);
#ifdef WT_DIGITS_PATH
    if (a->digits) {
        free(perm);
        wt_dataset_free(&train);
        wt_dataset_free(&test);
    }
#endif
    free(x);
    free(y);
    free(r);
    wf_session_destroy(s);
    wf_graph_destroy(m.g);
    wf_strategy_destroy(st);
    return rc;
}
TU_REGISTER(rank_async)

/* Runs 1 server + 2 workers with 'a'; the three ranks' results into r[0..2]. */
static void run_async(async_arg *a, async_result *r)
{
    snprintf(a->path, sizeof a->path, "/tmp/weft-ps-%d-async%d", (int)getpid(), a->staleness);
    tu_run t = { .size = 3,
                 .body = rank_async,
                 .arg = a,
                 .arg_size = sizeof *a,
                 .timeout_s = WF_TEST_TIMEOUT(120),
                 .with_rt = true };
    tu_start(&t);
    cr_assert(tu_wait(&t), "staleness %d: the ranks did not finish in time", a->staleness);
    for (int i = 0; i < 3; i++)
        cr_assert(WIFEXITED(t.status[i]) && WEXITSTATUS(t.status[i]) == 0,
                  "staleness %d: rank %d failed (status %d; stderr says why)", a->staleness, i,
                  t.status[i]);
    for (int i = 0; i < 3; i++) {
        char p[200];
        snprintf(p, sizeof p, "%s.%d", a->path, i);
        read_file(p, &r[i], sizeof r[i]);
    }
}

/* The bound held on every step of both workers: no copy more than s min clocks behind. */
static void check_bound(const async_arg *a, const async_result *r)
{
    for (int i = 1; i < 3; i++) {
        cr_assert_eq(r[i].bad_step, -1,
                     "s = %d: worker rank %d computed step %lld on a copy "
                     "more than s clocks behind",
                     a->staleness, i, r[i].bad_step);
        cr_assert(r[i].st.max_lag <= a->staleness, "s = %d: rank %d: lag %lld", a->staleness, i,
                  r[i].st.max_lag);
    }
    cr_assert(r[0].st.max_lag <= a->staleness,
              "s = %d: the server sent a copy %lld clocks "
              "ahead of the slowest",
              a->staleness, r[0].st.max_lag);
    cr_assert_eq(r[0].st.version, 2LL * a->steps,
                 "s = %d: the server applied %lld updates, "
                 "not one per push (%d)",
                 a->staleness, r[0].st.version, 2 * a->steps);
}

/* One worker sleeps 20 ms before each step: the fast one runs ahead by s steps at most, so
 * it must wait for the slow one (its server held its replies): without the bound it would
 * finish 30 steps in a fraction of the slow one's 0.6 s and compute on copies far behind. */
Test(transport_ps, asynchronous_bound_holds_and_the_fast_worker_waits_for_a_slowed_one)
{
    for (int s = 1; s <= 2; s++) {
        async_arg a = { .staleness = s, .slow_rank = 2, .slow_us = 20000, .steps = 30 };
        static async_result r[3];
        run_async(&a, r);
        check_bound(&a, r);
        printf("s = %d: fast worker %.3f s, slow worker %.3f s, max lag %lld / %lld, server "
               "held %lld replies, most staleness %lld updates\n",
               s, r[1].elapsed_s, r[2].elapsed_s, r[1].st.max_lag, r[2].st.max_lag, r[0].st.held,
               r[0].st.max_staleness);
        cr_assert(r[0].st.held > 0, "s = %d: the server never held a reply", s);
        cr_assert_eq(r[1].st.max_lag, s,
                     "s = %d: the fast worker never ran ahead (lag %lld): "
                     "not asynchronous",
                     s, r[1].st.max_lag);
        cr_assert(r[1].elapsed_s >= 0.5 * 30 * 0.02,
                  "s = %d: the fast worker finished in "
                  "%.3f s: it did not wait for the slow one",
                  s, r[1].elapsed_s);
    }
}

#ifdef WT_DIGITS_PATH
/* Test accuracy of the MLP with weights 'w' (f64). */
static double accuracy(const float *w, const wt_dataset *test)
{
    const float *w1 = w, *b1 = w1 + IN * HID, *w2 = b1 + HID, *b2 = w2 + HID * OUT;
    int64_t right = 0;
    for (int64_t i = 0; i < test->n; i++) {
        double h[HID], best = -INFINITY;
        int arg = 0;
        for (int j = 0; j < HID; j++) {
            double z = b1[j];
            for (int k = 0; k < IN; k++)
                z += (double)test->x[i * IN + k] * w1[k * HID + j];
            h[j] = z > 0 ? z : 0;
        }
        for (int o = 0; o < OUT; o++) {
            double z = b2[o];
            for (int j = 0; j < HID; j++)
                z += h[j] * w2[j * OUT + o];
            if (z > best) {
                best = z;
                arg = o;
            }
        }
        right += arg == test->y[i];
    }
    return (double)right / (double)test->n;
}

/* The digits, 300 steps of 64 rows (about 13 epochs), Adam: asynchronous servers with s = 1
 * and 2 reach the synchronous run's test accuracy within 1 point, with the bound held. */
Test(transport_ps, asynchronous_digits_mlp_converges_within_1_point_of_synchronous)
{
    wt_dataset train, test;
    cr_assert_eq(digits(&train, &test), 0);
    static async_result r[3];
    double acc[3];
    for (int s = 0; s <= 2; s++) {
        async_arg a = { .staleness = s, .slow_rank = -1, .steps = ASTEPS, .digits = true };
        run_async(&a, r);
        if (s > 0)
            check_bound(&a, r);
        acc[s] = accuracy(r[0].w, &test);
        printf("digits, 1 server + 2 workers, %d steps of %d rows: staleness %d: test accuracy "
               "%.2f%% (max lag %lld, most staleness %lld updates, %lld replies held)\n",
               ASTEPS, ABATCH, s, 100 * acc[s], r[1].st.max_lag, r[0].st.max_staleness,
               r[0].st.held);
    }
    cr_assert(acc[0] > 0.9, "synchronous accuracy %.4f", acc[0]);
    for (int s = 1; s <= 2; s++)
        cr_assert(acc[s] >= acc[0] - 0.01, "staleness %d: accuracy %.2f%% vs synchronous %.2f%%", s,
                  100 * acc[s], 100 * acc[0]);
    wt_dataset_free(&train);
    wt_dataset_free(&test);
}
#endif
