/* tests/transport/test_pipeline_plan.c: the pipeline's stages from the planner (placement
 * auto, weft/distribute.h) on real processes, over pipeline_util.h: with no hints, the planner's
 * stages of the MLP (2 stages 1F1B, 3 GPipe) train the bits of the same stages given as node
 * hints and of one process with 4 shards, every rank reports the same stages and writes the
 * same plan's text byte for byte (its measured op costs and links included), which names each
 * stage's device, its nodes, the bubble and that costs and links are measured (the op times
 * profiled on every rank, a ping-pong per pair); the planner's errors at creation
 * (memory caps too small: naming the device and bytes, or the node alone too big; a hint of a
 * rank that does not exist) and its options without it are refused naming them; a measured
 * cost table (two matmuls at 1 s) moves the split between them; the stage of a node that
 * reads only a weight and is read by another such node (a bug: -1); a last stage of only the
 * loss's mean (a bug: the memory planner crashed on an ordering against the plan's order). */
#include "pipeline_util.h"

TestSuite(transport_pipeline_plan, .timeout = WF_TEST_TIMEOUT(240), .fini = wf_test_fini);

/* The plan's text of rank 0 into 'text' (NUL-terminated); fails unless every rank wrote the
 * same bytes (the same measured links and costs, the same plan). The files are removed. */
static void read_plans(const pp_arg *a, char *text, size_t size)
{
    static char other[8192];
    for (int r = 0; r < a->stages; r++) {
        char path[200];
        snprintf(path, sizeof path, "%s.plan.%d", a->path, r);
        FILE *f = fopen(path, "r");
        cr_assert_not_null(f, "rank %d wrote no plan", r);
        char *buf = r ? other : text;
        size_t cap = r ? sizeof other : size, len = fread(buf, 1, cap - 1, f);
        buf[len] = 0;
        fclose(f);
        unlink(path);
        cr_assert(len < cap - 1, "rank %d's plan is longer than %zu bytes", r, cap - 1);
        cr_assert(r == 0 || strcmp(other, text) == 0,
                  "rank %d's plan differs from rank 0's:\n%s\nrank 0's:\n%s", r, other, text);
    }
}

/* The planner's stages (placement auto, no hints): the plan's text names every stage, the
 * bubble and the nodes; the run trains the bits of the same stages given as hints, and of one
 * process with 4 shards. */
static void check_planner(int stages, int schedule)
{
    static pp_result planned, hinted, local;
    int steps = 8, batch = 30;
    pp_arg a = { .model = NET_MLP,
                 .stages = stages,
                 .micro = 4,
                 .schedule = schedule,
                 .steps = steps,
                 .batch = batch,
                 .placement = WF_PIPELINE_PLACE_AUTO };
    run_pipeline(&a, &planned);
    static char text[8192];
    read_plans(&a, text, sizeof text); /* every rank's the same bytes */
    printf("%s", text);
    cr_assert(strstr(text, "measured costs") && strstr(text, "profiled on every rank") &&
                  strstr(text, "link stage 0 - 1: measured"),
              "the plan does not say its costs and links are measured:\n%s", text);
    for (int k = 0; k < stages; k++) {
        char want[48];
        snprintf(want, sizeof want, "stage %d on rank:%d/cpu:0", k, k);
        cr_assert(strstr(text, want), "the plan does not say '%s':\n%s", want, text);
        snprintf(want, sizeof want, "stage %d nodes: ", k);
        cr_assert(strstr(text, want), "the plan does not list stage %d's nodes:\n%s", k, text);
    }
    cr_assert(strstr(text, "bubble") && strstr(text, "logits"), "%s", text);
    /* The same stages as hints of every forward op (over the scopes of mlp_build()). */
    pp_arg b = a;
    b.placement = WF_PIPELINE_PLACE_HINTS;
    b.node_set = true;
    memcpy(b.node_st, planned.node_st, sizeof b.node_st);
    bool used[3] = { false, false, false };
    printf("planner: the forward ops' stages:");
    for (int id = 0; id < FWD; id++) {
        if (planned.node_st[id] >= 0)
            used[planned.node_st[id]] = true;
        if (planned.node_st[id] >= 0)
            printf(" %d", planned.node_st[id]);
    }
    printf("\n");
    for (int k = 0; k < stages; k++)
        cr_assert(used[k], "the planner left stage %d without an op", k);
    run_pipeline(&b, &hinted);
    run_local(&a, 4, &local);
    assert_bitwise(&planned, &hinted, "planner's stages vs the same stages as hints");
    assert_bitwise(&planned, &local, "planner's stages vs one process with 4 shards");
}

Test(transport_pipeline_plan, planner_stages_2_1f1b_train_the_bits_of_the_same_hints_and_4_shards)
{
    check_planner(2, WF_SCHEDULE_1F1B);
}

Test(transport_pipeline_plan, planner_stages_3_gpipe_train_the_bits_of_the_same_hints_and_4_shards)
{
    check_planner(3, WF_SCHEDULE_GPIPE);
}

/* Creates a one-rank planner session of the MLP ('h': its layers' hints for 'stages' stages,
 * or NULL) with memory cap 'cap'; returns wf_session_create()'s code, the message in 'msg'. */
static int planner_session(wf_place_hints *h, int stages, double cap, char *msg, size_t size)
{
    wf_runtime *rt = NULL;
    cr_assert_eq(wf_runtime_create(&rt, &(wf_runtime_opts){ .n_workers = 1 }), 0);
    wf_strategy *st = NULL;
    cr_assert_eq(wf_strategy_pipeline(NULL,
                                      &(wf_pipeline_opts){ .micro_batches = 2,
                                                           .batch_rows = 8,
                                                           .hints = h,
                                                           .placement = WF_PIPELINE_PLACE_AUTO,
                                                           .mem_bytes = cap },
                                      &st),
                 0, "%s", wf_last_errmsg());
    mlp m;
    cr_assert_eq(mlp_build(rt, &m, h, stages, M_TRAIN), 0);
    wf_session *s = NULL;
    int rc = wf_session_create(m.g, &(wf_session_opts){ .strategy = st }, &s);
    snprintf(msg, size, "%s", rc < 0 ? wf_graph_errmsg(m.g) : "");
    if (rc == 0) {
        const char *plan = wf_session_pipeline_plan(s);
        cr_assert(plan && strstr(plan, "stage 0 on rank:0/cpu:0"), "plan: %s", plan);
        snprintf(msg, size, "%s", plan);
        wf_session_destroy(s);
    }
    wf_graph_destroy(m.g);
    wf_strategy_destroy(st);
    wf_runtime_destroy(rt);
    return rc;
}

Test(transport_pipeline_plan, planner_errors_at_session_creation_name_the_device_and_bytes)
{
    char msg[4096];
    /* The whole MLP with Adam's state needs about 55 kB on one stage: a cap of 30000 bytes
     * holds each node but not all of them; one of 1000 not even the first weight. */
    int rc = planner_session(NULL, 1, 30000, msg, sizeof msg);
    cr_assert_eq(rc, WF_EINVAL, "a 30000-byte cap gave %s: %s", wf_err_name(rc), msg);
    cr_assert(strstr(msg, "rank:0/cpu:0 with 30000 bytes") && strstr(msg, "memory cap"), "%s", msg);
    printf("a 30000-byte cap: %s\n", msg);
    rc = planner_session(NULL, 1, 1000, msg, sizeof msg);
    cr_assert_eq(rc, WF_EINVAL, "a 1000-byte cap gave %s: %s", wf_err_name(rc), msg);
    cr_assert(strstr(msg, "w1") && strstr(msg, "alone needs") && strstr(msg, "1000"), "%s", msg);
    printf("a 1000-byte cap: %s\n", msg);
    rc = planner_session(NULL, 1, 1e6, msg, sizeof msg); /* fits: the plan's text */
    cr_assert_eq(rc, 0, "a 1 MB cap gave %s: %s", wf_err_name(rc), msg);
    /* A hint naming rank 1 of a one-rank pipeline: the planner names node and device. */
    wf_place_hints *h = NULL;
    cr_assert_eq(wf_place_hints_create(&h), 0);
    rc = planner_session(h, 2, 0, msg, sizeof msg);
    cr_assert_eq(rc, WF_ENOTFOUND, "a hint of rank 1 gave %s: %s", wf_err_name(rc), msg);
    cr_assert(strstr(msg, "rank:1/cpu:0") && strstr(msg, "matmul") &&
                  strstr(msg, "rank 1 does not exist"),
              "%s", msg);
    printf("a hint of rank 1, placement auto: %s\n", msg);
    wf_place_hints_destroy(h);
    /* The planner's options without the planner, and an unknown placement. */
    wf_strategy *st = NULL;
    rc = wf_strategy_pipeline(NULL, &(wf_pipeline_opts){ .batch_rows = 8, .mem_bytes = 1e6 }, &st);
    cr_assert_eq(rc, WF_EINVAL, "a cap with the hints' placement gave %s", wf_err_name(rc));
    cr_assert(strstr(wf_last_errmsg(), "mem_bytes 1e+06"), "%s", wf_last_errmsg());
    rc = wf_strategy_pipeline(NULL, &(wf_pipeline_opts){ .batch_rows = 8, .placement = 7 }, &st);
    cr_assert_eq(rc, WF_EINVAL, "placement 7 gave %s", wf_err_name(rc));
    cr_assert(strstr(wf_last_errmsg(), "placement is 7"), "%s", wf_last_errmsg());
    rc = wf_strategy_pipeline(
        NULL, &(wf_pipeline_opts){ .batch_rows = 8, .placement = 1, .mem_bytes = -1 }, &st);
    cr_assert_eq(rc, WF_EINVAL, "a negative cap gave %s", wf_err_name(rc));
    cr_assert_null(st);
}

/* A measured cost (the table's, not the prior) moves the split: with the first and the last
 * layer's matmuls at 1 s per micro-batch each, the one split whose slowest stage is not 2 s
 * (backward included: 6 s) puts the first on stage 0 and the last on stage 1, whatever the
 * measured links cost (microseconds), with every op after its inputs' stages; the run still
 * trains the bits of one process with 4 shards. */
Test(transport_pipeline_plan, planner_follows_a_measured_cost_table)
{
    static pp_result planned, local;
    pp_arg a = { .model = NET_MLP,
                 .stages = 2,
                 .micro = 4,
                 .schedule = WF_SCHEDULE_1F1B,
                 .steps = 4,
                 .batch = 30,
                 .placement = WF_PIPELINE_PLACE_AUTO,
                 .heavy_s = 1.0 };
    run_pipeline(&a, &planned);
    static char text[8192];
    read_plans(&a, text, sizeof text);
    cr_assert(strstr(text, "costs: the user's table"), "%s", text);
    wf_runtime *rt = NULL;
    cr_assert_eq(wf_runtime_create(&rt, &(wf_runtime_opts){ .n_workers = 1 }), 0);
    mlp m;
    cr_assert_eq(mlp_build(rt, &m, NULL, 2, M_TRAIN), 0);
    int first = -1, last = -1, matmuls = 0, prev = 0;
    for (int id = 0; id < FWD; id++) /* the forward's matmuls: the ops with a stage */
        if (planned.node_st[id] >= 0 && strcmp(wf_node_op(wf_graph_node(m.g, id)), "matmul") == 0 &&
            ++matmuls != 2)
            *(matmuls == 1 ? &first : &last) = id;
    cr_assert(first >= 0 && last > first, "matmuls %d and %d", first, last);
    cr_assert_eq(planned.node_st[first], 0, "the first costed matmul is on stage %d",
                 planned.node_st[first]);
    cr_assert_eq(planned.node_st[last], 1, "the last costed matmul is on stage %d",
                 planned.node_st[last]);
    for (int id = 0; id < FWD; id++)
        if (planned.node_st[id] >= 0) {
            cr_assert_geq(planned.node_st[id], prev, "node %d (%s) on stage %d after stage %d", id,
                          wf_node_name(wf_graph_node(m.g, id)), planned.node_st[id], prev);
            prev = planned.node_st[id];
        }
    wf_graph_destroy(m.g);
    wf_runtime_destroy(rt);
    run_local(&a, 4, &local);
    assert_bitwise(&planned, &local, "planner's stages from measured costs vs 4 shards");
}

/* The bug: wf_session_pipeline_stage() gave -1 for a node that reads only a variable and
 * whose one reader does too (the shared MLP's sum of w1, scaled by a constant, then added on
 * the last stage): it looked only at readers with a stage of their own. Now such a node has
 * the lowest stage of its readers, through readers like it: here every forward op of a
 * one-stage pipeline is on stage 0, and the weight w1 too. */
Test(transport_pipeline_plan, stage_of_a_weight_only_node_read_by_another_is_its_readers_stage)
{
    wf_runtime *rt = NULL;
    cr_assert_eq(wf_runtime_create(&rt, &(wf_runtime_opts){ .n_workers = 1 }), 0);
    wf_strategy *st = NULL;
    cr_assert_eq(
        wf_strategy_pipeline(NULL, &(wf_pipeline_opts){ .micro_batches = 2, .batch_rows = 8 }, &st),
        0, "%s", wf_last_errmsg());
    mlp m;
    cr_assert_eq(mlp_build(rt, &m, NULL, 1, M_SHARED_VAR), 0, "%s", wf_graph_errmsg(m.g));
    wf_session *s = NULL;
    cr_assert_eq(wf_session_create(m.g, &(wf_session_opts){ .strategy = st }, &s), 0, "%s",
                 wf_graph_errmsg(m.g));
    int sums = 0;
    for (int id = 0; wf_graph_node(m.g, id) != m.loss; id++) {
        const wf_node *v = wf_graph_node(m.g, id);
        if (wf_node_input_count(v) == 0)
            continue;
        sums += strcmp(wf_node_op(v), "sum") == 0;
        cr_assert_eq(wf_session_pipeline_stage(s, v), 0, "node %d (%s %s): stage %d", id,
                     wf_node_op(v), wf_node_name(v), wf_session_pipeline_stage(s, v));
    }
    cr_assert_eq(sums, 1, "the shared MLP has no sum of w1");
    cr_assert_eq(wf_session_pipeline_stage(s, m.vars[0]), 0);
    wf_session_destroy(s);
    wf_graph_destroy(m.g);
    wf_strategy_destroy(st);
    wf_runtime_destroy(rt);
}

/* The bug: a last stage that holds only the loss's mean (a split the planner makes when the
 * measured link is slow enough that sending the 4 bytes of the per-row losses beats
 * sending the logits) crashed that rank's first run in the memory planner: the gradient of
 * each micro-batch's mean folds to one constant, CSE keeps the first micro-batch's, and the
 * schedule's ordering "mean of mb 1 before its backward" then pointed back in the plan's
 * order. Such orderings are dropped now; the split trains the bits of one process with 4
 * shards. */
Test(transport_pipeline_plan, a_last_stage_of_only_the_mean_trains_the_bits_of_4_shards)
{
    static pp_result split, local;
    pp_arg a = { .model = NET_MLP,
                 .stages = 2,
                 .micro = 4,
                 .schedule = WF_SCHEDULE_1F1B,
                 .steps = 4,
                 .batch = 30,
                 .node_set = true };
    wf_runtime *rt = NULL;
    cr_assert_eq(wf_runtime_create(&rt, &(wf_runtime_opts){ .n_workers = 1 }), 0);
    mlp m;
    cr_assert_eq(mlp_build(rt, &m, NULL, 2, M_TRAIN), 0);
    int loss_id = 0;
    while (wf_graph_node(m.g, loss_id) != m.loss)
        loss_id++;
    for (int id = 0; id < FWD; id++) /* the ops up to the loss: all on stage 0 but the mean */
        a.node_st[id] = (signed char)(id > loss_id || !wf_node_input_count(wf_graph_node(m.g, id))
                                          ? -1
                                          : id == loss_id);
    cr_assert_str_eq(wf_node_op(m.loss), "mean");
    wf_graph_destroy(m.g);
    wf_runtime_destroy(rt);
    run_pipeline(&a, &split);
    run_local(&a, 4, &local);
    assert_bitwise(&split, &local, "a last stage of only the mean vs 4 shards");
}
