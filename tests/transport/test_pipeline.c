/* tests/transport/test_pipeline.c: pipeline training (wf_strategy_pipeline(), weft/
 * distribute.h) on real processes: an MLP 64-32-32-10 with Adam, a CNN (two convolutions and
 * a linear layer) and the GPT of examples/train_gpt (2 blocks, AdamW, gradients clipped by
 * their global norm across the stages), each split in 2 stages on 2 ranks (and in 3 on 3),
 * m = 4 micro-batches, GPipe and 1F1B, trains bit for bit as one process
 * with the MultiWorkerMirrored strategy and 4 shards (per-step losses and the final weights'
 * bytes, and the losses of forward-only runs between steps, which send no gradients), and
 * within 1e-6 relative of plain single-process training; every stage fetches the loss (the
 * global value); the schedule's order shows in a trace (1F1B: micro-batch 0's forward and
 * backward before micro-batch 1's forward; GPipe: every forward first); a variable read on two
 * stages (the MLP's w1 read again by its last layer, the GPT's tied head) is updated on both
 * to the same bits; bad options (more stages than ranks, m < 1, a hint naming a rank that does
 * not exist) fail at creation naming what is wrong; a stage holds only its partition's
 * variables and their optimizer state (wf_session_stats()); a killed stage fails the other's run
 * within 2 s with WF_EPEER naming it. Ranks are processes on loopback (transport_util.h); each
 * writes what it saw (its stage's weights, and the losses every stage fetched, which are equal) to
 * a file the test reads. The reference runs (no communicator) run in the test's own process. */
#include "pipeline_util.h"

TestSuite(transport_pipeline, .timeout = WF_TEST_TIMEOUT(240), .fini = wf_test_fini);

static void check_schedule(int stages, int schedule)
{
    check_model(NET_MLP, stages, schedule);
}

Test(transport_pipeline, two_stages_gpipe_train_the_bits_of_one_process_with_4_shards)
{
    check_schedule(2, WF_SCHEDULE_GPIPE);
}

Test(transport_pipeline, two_stages_1f1b_train_the_bits_of_one_process_with_4_shards)
{
    check_schedule(2, WF_SCHEDULE_1F1B);
}

Test(transport_pipeline, three_stages_1f1b_train_the_bits_of_one_process_with_4_shards)
{
    check_schedule(3, WF_SCHEDULE_1F1B);
}

Test(transport_pipeline, three_stages_gpipe_train_the_bits_of_one_process_with_4_shards)
{
    check_schedule(3, WF_SCHEDULE_GPIPE);
}

Test(transport_pipeline, a_cnn_in_two_stages_gpipe_trains_the_bits_of_4_shards)
{
    check_model(NET_CNN, 2, WF_SCHEDULE_GPIPE);
}

Test(transport_pipeline, a_cnn_in_two_stages_1f1b_trains_the_bits_of_4_shards)
{
    check_model(NET_CNN, 2, WF_SCHEDULE_1F1B);
}

Test(transport_pipeline, a_cnn_in_three_stages_1f1b_trains_the_bits_of_4_shards)
{
    check_model(NET_CNN, 3, WF_SCHEDULE_1F1B);
}

#ifdef WF_TEST_HAVE_GPT
Test(transport_pipeline, the_gpt_in_two_stages_gpipe_trains_the_bits_of_4_shards)
{
    check_model(NET_GPT, 2, WF_SCHEDULE_GPIPE);
}

Test(transport_pipeline, the_gpt_in_two_stages_1f1b_trains_the_bits_of_4_shards)
{
    check_model(NET_GPT, 2, WF_SCHEDULE_1F1B);
}

Test(transport_pipeline, the_gpt_in_three_stages_1f1b_trains_the_bits_of_4_shards)
{
    check_model(NET_GPT, 3, WF_SCHEDULE_1F1B);
}
#endif

/* The task spans of a Chrome trace whose node names have "/mb<k>": (k, start, end, is the
 * logits: the last of the forward). */
typedef struct mb_span {
    int mb;
    bool logits;
    double ts, end;
} mb_span;

static int mb_spans(const char *buf, mb_span *out, int cap)
{
    int n = 0;
    for (const char *p = strstr(buf, "{\"name\":\""); p && n < cap;
         p = strstr(p + 1, "{\"name\":\"")) {
        const char *e = strstr(p, "}}"), *cat = strstr(p, "\"cat\":\"task\"");
        const char *ts = strstr(p, "\"ts\":"), *dur = strstr(p, "\"dur\":");
        if (!e || !cat || !ts || !dur || cat > e || ts > e || dur > e)
            continue;
        char name[64];
        if (sscanf(p + 9, "%63[^\"]", name) != 1)
            continue;
        const char *mb = strstr(name, "/mb");
        if (!mb)
            continue;
        mb_span *sp = &out[n++];
        sp->mb = atoi(mb + 3);
        sp->logits = !strncmp(name, "logits/", 7);
        sp->ts = strtod(ts + 5, NULL);
        sp->end = sp->ts + strtod(dur + 6, NULL);
    }
    return n;
}

/* One stage (this process), m = 4, one step traced: under 1F1B every task of micro-batch 0
 * (forward and backward) ends before any of micro-batch 1 starts; under GPipe a task of
 * micro-batch 0 (its backward) starts after micro-batch 3's logits (its forward) end. */
static void check_order(int schedule)
{
    wf_runtime *rt = NULL;
    cr_assert_eq(
        wf_runtime_create(&rt, &(wf_runtime_opts){ .n_workers = 2, .trace_events = 1 << 14 }), 0);
    wf_strategy *st = NULL;
    cr_assert_eq(
        wf_strategy_pipeline(
            NULL, &(wf_pipeline_opts){ .micro_batches = 4, .schedule = schedule, .batch_rows = 64 },
            &st),
        0, "%s", wf_last_errmsg());
    mlp m;
    cr_assert_eq(mlp_build(rt, &m, NULL, 1, M_TRAIN), 0);
    wf_session *s = NULL;
    cr_assert_eq(wf_session_create(m.g, &(wf_session_opts){ .strategy = st }, &s), 0, "%s",
                 wf_last_errmsg());
    static float x[64 * IN];
    int32_t y[64];
    batch_of(0, 64, x, y);
    wf_tensor *xt = wf_tensor_from(WF_F32, WF_SHAPE(64, IN), x);
    wf_tensor *yt = wf_tensor_from(WF_I32, WF_SHAPE(64), y);
    wf_feed f[] = { { m.x, xt }, { m.y, yt } };
    int rc = wf_session_run(s, f, 2, NULL, 0, NULL, &m.train, 1);
    cr_assert_eq(rc, 0, "%s: %s", wf_err_name(rc), wf_session_errmsg(s));
    char path[64];
    snprintf(path, sizeof path, "/tmp/weft-pipeline-order-%d.json", (int)getpid());
    cr_assert_gt(wf_runtime_trace_write(rt, path), 0, "%s", wf_last_errmsg());
    FILE *fp = fopen(path, "r");
    cr_assert_not_null(fp);
    static char buf[1 << 23];
    size_t len = fread(buf, 1, sizeof buf - 1, fp);
    buf[len] = 0;
    fclose(fp);
    unlink(path);
    static mb_span sp[1 << 14];
    int n = mb_spans(buf, sp, 1 << 14);
    double end0 = 0, start1 = 1e300, logits3_end = 0, last0_start = 0;
    int n0 = 0, n1 = 0;
    for (int i = 0; i < n; i++) {
        if (sp[i].mb == 0) {
            n0++;
            end0 = sp[i].end > end0 ? sp[i].end : end0;
            last0_start = sp[i].ts > last0_start ? sp[i].ts : last0_start;
        }
        if (sp[i].mb == 1) {
            n1++;
            start1 = sp[i].ts < start1 ? sp[i].ts : start1;
        }
        if (sp[i].mb == 3 && sp[i].logits)
            logits3_end = sp[i].end;
    }
    printf("%s: %d tasks of micro-batch 0 (last ends at %.1f us, last starts at %.1f us), %d of "
           "micro-batch 1 (first starts at %.1f us); micro-batch 3's logits end at %.1f us\n",
           schedule == WF_SCHEDULE_1F1B ? "1f1b" : "gpipe", n0, end0, last0_start, n1, start1,
           logits3_end);
    cr_assert(n0 > 4 && n1 > 4, "too few micro-batch tasks in the trace (%d, %d)", n0, n1);
    if (schedule == WF_SCHEDULE_1F1B)
        cr_assert(end0 <= start1, "1F1B: micro-batch 1 started (%.1f us) before 0 ended (%.1f us)",
                  start1, end0);
    else
        cr_assert(logits3_end > 0 && last0_start >= logits3_end,
                  "GPipe: micro-batch 0's last task starts at %.1f us, before micro-batch 3's "
                  "logits end (%.1f us)",
                  last0_start, logits3_end);
    wf_tensor_release(xt);
    wf_tensor_release(yt);
    wf_session_destroy(s);
    wf_graph_destroy(m.g);
    wf_strategy_destroy(st);
    wf_runtime_destroy(rt);
}

Test(transport_pipeline, one_f_one_b_runs_micro_batch_0_before_micro_batch_1_starts)
{
    check_order(WF_SCHEDULE_1F1B);
}

Test(transport_pipeline, gpipe_runs_every_forward_before_the_first_backward)
{
    check_order(WF_SCHEDULE_GPIPE);
}

/* A 2-stage pipeline of 4 micro-batches of 16 rows over 'c' ('*h', '*st') and its MLP
 * ('*m', 'mode'); returns wf_session_create()'s status (the session in '*s'). */
typedef struct pp_setup {
    wf_place_hints *h;
    wf_strategy *st;
    mlp m;
    wf_session *s;
} pp_setup;

static int setup_two(wf_comm *c, int mode, pp_setup *p)
{
    *p = (pp_setup){ 0 };
    TU_OK(wf_place_hints_create(&p->h));
    TU_OK(wf_strategy_pipeline(
        c, &(wf_pipeline_opts){ .stages = 2, .micro_batches = 4, .batch_rows = 16, .hints = p->h },
        &p->st));
    TU_CHECK(mlp_build(tu_rt, &p->m, p->h, 2, mode) == 0, "build: %s", wf_graph_errmsg(p->m.g));
    return wf_session_create(p->m.g, &(wf_session_opts){ .strategy = p->st }, &p->s);
}

static void setup_free(pp_setup *p)
{
    wf_session_destroy(p->s);
    wf_graph_destroy(p->m.g);
    wf_strategy_destroy(p->st);
    wf_place_hints_destroy(p->h);
}

/* Rank 1 makes its session and then waits to be killed; rank 0's run, whose backward waits
 * for rank 1's gradients, fails within 2 s naming it. */
static int rank_kill(wf_comm *c, int rank, int size, void *argp)
{
    (void)size;
    const pp_arg *a = argp;
    pp_setup p;
    TU_OK(setup_two(c, M_TRAIN, &p));
    TU_CHECK(write(a->ready_fd, "r", 1) == 1, "ready");
    if (rank == 1)
        for (;;) /* until the test kills this rank, never running */
            wf_test_sleep_us(10000);
    static float x[16 * IN];
    int32_t y[16];
    float loss;
    uint64_t t0 = wf_test_now_ns();
    int rc = tu_step(p.s, p.m.x, p.m.y, IN, OUT, 16, 0, p.m.loss, p.m.train, x, y, &loss);
    double dt = (double)(wf_test_now_ns() - t0) * 1e-9;
    const char *msg = wf_session_errmsg(p.s);
    printf("stage 0: %s after %.3f s: %s\n", wf_err_name(rc), dt, msg);
    TU_CHECK(rc == WF_EPEER, "the run gave %s: %s", wf_err_name(rc), msg);
    TU_CHECK(strstr(msg, "rank 1"), "message: %s", msg);
    TU_CHECK(dt < 2.0, "the failure took %.2f s", dt);
    setup_free(&p);
    return 0;
}
TU_REGISTER(rank_kill)

Test(transport_pipeline, a_killed_stage_fails_the_others_run_within_2s_with_epeer)
{
    int fds[2];
    tu_ready_pipe(fds);
    pp_arg a = { .mode = M_KILL, .ready_fd = fds[1] };
    tu_run t = { .size = 2,
                 .body = rank_kill,
                 .arg = &a,
                 .arg_size = sizeof a,
                 .timeout_s = 60,
                 .with_rt = true };
    tu_kill_rank(&t, fds, 1, 3);
}

/* The bytes of the variables of 'm' that stage 'stage' of 2 keeps: its layers' weights, their
 * optimizer state (named "<weight>/..."), and what is no weight's state (the step counter,
 * which every stage updates). */
static int64_t partition_bytes(const mlp *m, int stage, int64_t *all)
{
    int64_t mine = 0;
    *all = 0;
    for (int id = 0; id < wf_graph_node_count(m->g); id++) {
        const wf_node *v = wf_graph_node(m->g, id);
        if (strcmp(wf_node_op(v), "variable") != 0)
            continue;
        int64_t bytes = wf_shape_numel(wf_node_shape(v)) * (int64_t)wf_dtype_size(wf_node_dtype(v));
        int owner = -1; /* every stage's */
        for (int k = 0; k < NVARS; k++) {
            const char *w = wf_node_name(m->vars[k]), *n = wf_node_name(v);
            size_t len = strlen(w);
            if (!strncmp(n, w, len) && (n[len] == 0 || n[len] == '/'))
                owner = m->owner[k];
        }
        *all += bytes;
        mine += owner < 0 || owner == stage ? bytes : 0;
    }
    return mine;
}

/* Each rank: before its first run it holds no variable, after a training step exactly its
 * partition's; rank 0 then reads a variable of stage 1 (a checkpoint does), which gets its
 * initial value here. */
static int rank_vars(wf_comm *c, int rank, int size, void *argp)
{
    (void)size;
    (void)argp;
    pp_setup p;
    TU_OK(setup_two(c, M_TRAIN, &p));
    wf_plan_stats st;
    TU_OK(wf_session_stats(p.s, &st));
    TU_CHECK(st.n_variables >= 3 * NVARS && st.n_variables_held == 0 && st.bytes_variables == 0,
             "rank %d before a run: %d variables, %d held (%lld bytes)", rank, st.n_variables,
             st.n_variables_held, (long long)st.bytes_variables);
    static float x[16 * IN];
    int32_t y[16];
    float loss;
    TU_OK(tu_step(p.s, p.m.x, p.m.y, IN, OUT, 16, 0, p.m.loss, p.m.train, x, y, &loss));
    TU_OK(wf_session_stats(p.s, &st));
    int64_t all = 0, want = partition_bytes(&p.m, rank, &all);
    printf("stage %d: %d of %d variables, %lld bytes (its partition: %lld; the graph: %lld)\n",
           rank, st.n_variables_held, st.n_variables, (long long)st.bytes_variables,
           (long long)want, (long long)all);
    TU_CHECK(st.bytes_variables == want && want < all,
             "stage %d holds %lld bytes of variables, its partition %lld, the graph %lld", rank,
             (long long)st.bytes_variables, (long long)want, (long long)all);
    if (rank == 0) {
        wf_tensor *w3 = NULL;
        TU_OK(wf_session_variable(p.s, p.m.vars[4], &w3));
        TU_CHECK(wf_shape_numel(wf_tensor_shape(w3)) == HID * OUT, "w3's value");
        wf_tensor_release(w3);
        TU_OK(wf_session_stats(p.s, &st));
        TU_CHECK(st.bytes_variables == want + HID * OUT * 4, "after reading w3: %lld bytes",
                 (long long)st.bytes_variables);
    }
    setup_free(&p);
    return 0;
}
TU_REGISTER(rank_vars)

Test(transport_pipeline, a_stage_holds_only_the_variables_of_its_partition)
{
    tu_run t = { .size = 2, .body = rank_vars, .timeout_s = WF_TEST_TIMEOUT(60), .with_rt = true };
    tu_start(&t);
    cr_assert(tu_wait(&t), "the stages did not finish in time");
    for (int i = 0; i < 2; i++)
        cr_assert(WIFEXITED(t.status[i]) && WEXITSTATUS(t.status[i]) == 0,
                  "rank %d failed (status %d; its stderr says why)", i, t.status[i]);
}

/* A variable read on two stages (w1, by layer 1 on stage 0 and by layer 3 on the last) is
 * updated on both from the same gradient: the bits of one process with 4 shards. */
Test(transport_pipeline, a_variable_read_on_two_stages_is_updated_on_both_to_the_same_bits)
{
    check_model(NET_MLP_SHARED, 2, WF_SCHEDULE_1F1B);
    check_model(NET_MLP_SHARED, 3, WF_SCHEDULE_GPIPE);
}

#ifdef WF_TEST_HAVE_GPT
/* The GPT's tied head: the token table is read by the lookup on stage 0 and by the head on
 * the last stage; both keep it current. Against plain training the losses only: one process
 * with 4 shards, which the pipeline equals bit for bit, ends 1.76e-6 (norm) from plain
 * training's weights after 12 steps (1.22e-6 after 8): another summation order's drift,
 * not the pipeline's. */
static void check_tied(int stages, int schedule)
{
    pp_arg a = { .model = NET_GPT_TIED,
                 .stages = stages,
                 .micro = 4,
                 .schedule = schedule,
                 .steps = 12,
                 .batch = 30 };
    check_run(&a, 1);
}

Test(transport_pipeline, the_gpt_with_a_tied_head_trains_the_bits_of_4_shards)
{
    check_tied(2, WF_SCHEDULE_1F1B);
    check_tied(3, WF_SCHEDULE_GPIPE);
}
#endif

Test(transport_pipeline, bad_options_fail_naming_them)
{
    wf_strategy *st = NULL;
    int rc = wf_strategy_pipeline(NULL, &(wf_pipeline_opts){ .stages = 2, .batch_rows = 8 }, &st);
    cr_assert_eq(rc, WF_EINVAL, "more stages than ranks gave %s", wf_err_name(rc));
    cr_assert(strstr(wf_last_errmsg(), "stages is 2, but the communicator has 1 rank"), "%s",
              wf_last_errmsg());
    cr_assert_null(st);
    rc = wf_strategy_pipeline(NULL, &(wf_pipeline_opts){ .micro_batches = -1, .batch_rows = 8 },
                              &st);
    cr_assert_eq(rc, WF_EINVAL, "m = -1 gave %s", wf_err_name(rc));
    cr_assert(strstr(wf_last_errmsg(), "micro_batches is -1"), "%s", wf_last_errmsg());
    rc =
        wf_strategy_pipeline(NULL, &(wf_pipeline_opts){ .micro_batches = 4, .batch_rows = 3 }, &st);
    cr_assert_eq(rc, WF_EINVAL, "3 rows for 4 micro-batches gave %s", wf_err_name(rc));
    cr_assert(strstr(wf_last_errmsg(), "batch_rows is 3"), "%s", wf_last_errmsg());
    rc = wf_strategy_pipeline(NULL, &(wf_pipeline_opts){ .schedule = 5, .batch_rows = 8 }, &st);
    cr_assert_eq(rc, WF_EINVAL, "schedule 5 gave %s", wf_err_name(rc));
    cr_assert(strstr(wf_last_errmsg(), "schedule is 5"), "%s", wf_last_errmsg());
    cr_assert_eq(wf_strategy_pipeline(NULL, NULL, NULL), WF_EINVAL);

    /* A hint naming rank 1 in a one-rank pipeline: session creation names node and device. */
    wf_runtime *rt = NULL;
    cr_assert_eq(wf_runtime_create(&rt, &(wf_runtime_opts){ .n_workers = 1 }), 0);
    wf_place_hints *h = NULL;
    cr_assert_eq(wf_place_hints_create(&h), 0);
    cr_assert_eq(
        wf_strategy_pipeline(
            NULL, &(wf_pipeline_opts){ .micro_batches = 2, .batch_rows = 8, .hints = h }, &st),
        0, "%s", wf_last_errmsg());
    mlp m;
    cr_assert_eq(mlp_build(rt, &m, h, 2, M_TRAIN), 0); /* hints for 2 stages: rank 1 */
    wf_session *s = NULL;
    rc = wf_session_create(m.g, &(wf_session_opts){ .strategy = st }, &s);
    cr_assert_eq(rc, WF_ENOTFOUND, "a hint of rank 1 gave %s: %s", wf_err_name(rc),
                 wf_graph_errmsg(m.g));
    cr_assert(strstr(wf_graph_errmsg(m.g), "rank:1/cpu:0") &&
                  strstr(wf_graph_errmsg(m.g), "matmul"),
              "%s", wf_graph_errmsg(m.g));
    printf("a hint of rank 1 on one rank: %s\n", wf_graph_errmsg(m.g));
    wf_graph_destroy(m.g);
    wf_strategy_destroy(st);
    wf_place_hints_destroy(h);
    wf_runtime_destroy(rt);
}
