/* tests/transport/test_pipeline_plan.c: (interim: the pipeline tests as the planner's branch had
 * them, with its planner tests; to be folded onto pipeline_util.h) pipeline training
 * (wf_strategy_pipeline(), weft/ distribute.h) on real processes: an MLP 64-32-32-10 with Adam
 * split in 2 stages on 2 ranks (and in 3 on 3), m = 4 micro-batches, GPipe and 1F1B, trains bit for
 * bit as one process with the MultiWorkerMirrored strategy and 4 shards (per-step losses and the
 * final weights' bytes, and the losses of forward-only runs between steps, which send no
 * gradients), and within 1e-6 relative of plain single-process training; every stage fetches the
 * loss (the global value); the schedule's order shows in a trace (1F1B: micro-batch 0's forward and
 * backward before micro-batch 1's forward; GPipe: every forward first); bad options (more stages
 * than ranks, m < 1, a hint naming a rank that does not exist, a variable read on two stages)
 * fail at creation naming what is wrong; a killed stage fails the other's run within 2 s with
 * WF_EPEER naming it. With placement auto (no hints) the planner's stages (2 stages 1F1B, 3
 * GPipe) train the bits of the same stages given as node hints and of one process with 4
 * shards, every rank reports the same stages, and the plan's text names each stage's device,
 * its nodes and the bubble; the planner's errors at creation (memory caps too small: naming
 * the device and bytes, or the node alone too big; a hint of a rank that does not exist) and
 * its options without it are refused naming them; a measured cost table (one matmul at 1 s)
 * moves the split to just before that matmul.
 * Ranks are processes on loopback (transport_util.h); each writes what it saw (its stage's
 * weights, and the losses every stage fetched, which are equal) to a file the test reads. The
 * reference runs (no communicator) run in the test's own process. */
#include "strategy_util.h"
#include "transport_util.h"

#include <weft/placement.h>

#include <fcntl.h>
#include <math.h>

TestSuite(transport_pipeline_plan, .timeout = WF_TEST_TIMEOUT(240), .fini = wf_test_fini);

#define IN      64
#define HID     32
#define OUT     10
#define NVARS   6
#define MAXSTEP 32
#define NW      (IN * HID + HID + HID * HID + HID + HID * OUT + OUT)
#define FWD     32 /* the forward's node ids are below this */

enum { M_TRAIN, M_KILL, M_SHARED_VAR };

typedef struct pp_arg {
    int mode;
    int stages, micro, schedule, steps, batch;
    int placement;  /* WF_PIPELINE_PLACE_AUTO: the planner's stages, no hints */
    bool node_set;  /* hints: node_st[id] (>= 0) for each forward op, after the scopes */
    double heavy_s; /* > 0: a cost table gives the last layer's matmul these seconds */
    signed char node_st[FWD];
    int ready_fd;   /* M_KILL: each rank writes a byte once its session is made */
    char path[160]; /* rank r writes "<path>.<r>" */
} pp_arg;

typedef struct pp_result {
    int steps;
    int owner[NVARS]; /* a pipeline's: each variable's stage (wf_session_pipeline_stage()) */
    signed char node_st[FWD]; /* and each forward op's (ids up to the loss's; else -1) */
    float loss[MAXSTEP];
    float eval[MAXSTEP]; /* after every 4th step: the loss of a forward-only run */
    float w[NW];
} pp_result;

/* The global batch of step 's': the same on every rank. */
static void batch_of(int s, int rows, float *x, int32_t *y)
{
    tu_batch_of(s, rows, IN, OUT, x, y);
}

typedef struct mlp {
    wf_graph *g;
    wf_node *x, *y, *loss, *train, *vars[NVARS];
    int owner[NVARS]; /* the stage of each variable */
} mlp;

static int var_size(int k)
{
    static const int sz[NVARS] = { IN * HID, HID, HID * HID, HID, HID * OUT, OUT };
    return sz[k];
}

/* Stage of layer 'l' (0, 1, 2) with 'stages' stages. */
static int layer_stage(int l, int stages)
{
    return stages == 3 ? l : stages == 2 ? (l == 0 ? 0 : 1) : 0;
}

static int scope(wf_place_hints *h, const wf_graph *g, int stage)
{
    char dev[32];
    snprintf(dev, sizeof dev, "rank:%d/cpu:0", stage);
    return h ? wf_place_scope_begin(h, g, dev) : 0;
}

static int scope_end(wf_place_hints *h, const wf_graph *g)
{
    return h ? wf_place_scope_end(h, g) : 0;
}

/* The MLP; with 'h', each layer in a scope of its stage. M_SHARED_VAR: layer 2 also reads
 * layer 0's weight w1 (a variable read on two stages). */
static int mlp_build(wf_runtime *rt, mlp *m, wf_place_hints *h, int stages, int mode)
{
    wf_graph *g = m->g = wf_graph_create(rt, WF_STATIC);
    m->x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(-1, IN));
    m->y = wf_placeholder(g, "y", WF_I32, WF_SHAPE(-1));
    static const int dims[4] = { IN, HID, HID, OUT };
    for (int l = 0; l < 3; l++) {
        char name[16];
        snprintf(name, sizeof name, "w%d", l + 1);
        m->vars[2 * l] = wf_variable(g, name, WF_F32, WF_SHAPE(dims[l], dims[l + 1]),
                                     wf_init_glorot_uniform((uint64_t)l + 1));
        snprintf(name, sizeof name, "b%d", l + 1);
        m->vars[2 * l + 1] = wf_variable(g, name, WF_F32, WF_SHAPE(dims[l + 1]), wf_init_zeros());
        m->owner[2 * l] = m->owner[2 * l + 1] = layer_stage(l, stages);
    }
    wf_node *a = m->x;
    for (int l = 0; l < 3; l++) {
        if (scope(h, g, layer_stage(l, stages)) < 0)
            return -1;
        a = wf_add(g, wf_matmul(g, a, m->vars[2 * l]), m->vars[2 * l + 1]);
        if (l == 2 && mode == M_SHARED_VAR)
            a = wf_add(g, a, wf_mul(g, wf_sum(g, m->vars[0]), wf_scalar(g, WF_F32, 1e-3)));
        if (l < 2)
            a = wf_relu(g, a);
        else if (wf_node_set_name(a, "logits") < 0)
            return -1;
        else
            m->loss = wf_mean(g, wf_softmax_cross_entropy(g, a, m->y));
        if (scope_end(h, g) < 0)
            return -1;
    }
    m->train = wf_minimize(g, wf_adam(1e-2), m->loss);
    return m->train ? 0 : -1;
}

/* Trains 'a->steps' steps with 'st' (NULL: a plain session); 'stage' is this process's
 * stage (-1: all of them: a reference run). Fills the losses (on the last stage) and the
 * weights of the stage's variables. */
static int train(wf_runtime *rt, const wf_strategy *st, const pp_arg *a, int stage,
                 wf_place_hints *h, pp_result *res)
{
    mlp m;
    TU_CHECK(mlp_build(rt, &m, h, a->stages, M_TRAIN) == 0, "build: %s", wf_graph_errmsg(m.g));
    int loss_id = 0; /* the forward's last node */
    while (wf_graph_node(m.g, loss_id) != m.loss)
        loss_id++;
    TU_CHECK(loss_id < FWD, "the loss is node %d", loss_id);
    for (int id = 0; a->node_set && id <= loss_id; id++) { /* node hints win over scopes */
        char dev[32];
        snprintf(dev, sizeof dev, "rank:%d/cpu:0", a->node_st[id]);
        if (a->node_st[id] >= 0)
            TU_OK(wf_place_hint(h, wf_graph_node(m.g, id), dev));
    }
    wf_session *s = NULL;
    TU_OK(wf_session_create(m.g, &(wf_session_opts){ .strategy = st }, &s));
    float *x = malloc(sizeof(float) * (size_t)a->batch * IN);
    int32_t *y = malloc(sizeof(int32_t) * (size_t)a->batch);
    TU_CHECK(x && y, "no memory");
    res->steps = a->steps;
    for (int step = 0; step < a->steps; step++) {
        int rc =
            tu_step(s, m.x, m.y, IN, OUT, a->batch, step, m.loss, m.train, x, y, &res->loss[step]);
        TU_CHECK(rc == 0, "stage %d, step %d: %s: %s", stage, step, wf_err_name(rc),
                 wf_session_errmsg(s));
        if (step % 4 == 3) { /* a forward-only run between steps: no backward, no update */
            rc = tu_step(s, m.x, m.y, IN, OUT, a->batch, 1000 + step, m.loss, NULL, x, y,
                         &res->eval[step / 4]);
            TU_CHECK(rc == 0, "stage %d, evaluation after step %d: %s: %s", stage, step,
                     wf_err_name(rc), wf_session_errmsg(s));
        }
    }
    if (stage >= 0) /* where each variable is: the planner's, or the hints' */
        for (int k = 0; k < NVARS; k++) {
            res->owner[k] = wf_session_pipeline_stage(s, m.vars[k]);
            TU_CHECK(res->owner[k] >= 0, "variable %d: stage %d: %s", k, res->owner[k],
                     wf_last_errmsg());
            TU_CHECK(a->placement == WF_PIPELINE_PLACE_AUTO || a->node_set ||
                         res->owner[k] == m.owner[k],
                     "variable %d is on stage %d, hinted to %d", k, res->owner[k], m.owner[k]);
        }
    for (int id = 0; stage >= 0 && id < FWD; id++) {
        const wf_node *v = id <= loss_id ? wf_graph_node(m.g, id) : NULL;
        bool op = v && wf_node_input_count(v) > 0; /* not a source */
        res->node_st[id] = (signed char)(op ? wf_session_pipeline_stage(s, v) : -1);
        TU_CHECK(!op || (res->node_st[id] >= 0 && res->node_st[id] < a->stages),
                 "node %d: stage %d", id, res->node_st[id]);
        TU_CHECK(!a->node_set || res->node_st[id] == a->node_st[id],
                 "node %d is on stage %d, hinted to %d", id, res->node_st[id], a->node_st[id]);
    }
    const char *plan = wf_session_pipeline_plan(s);
    TU_CHECK(!plan == (a->placement != WF_PIPELINE_PLACE_AUTO || stage < 0),
             "the plan's text is %s", plan ? "there without the planner" : "missing");
    if (plan && stage == 0) { /* for the test to print and check */
        char path[200];
        snprintf(path, sizeof path, "%s.plan", a->path);
        FILE *f = fopen(path, "w");
        TU_CHECK(f && fputs(plan, f) >= 0 && fclose(f) == 0, "write %s", path);
    }
    size_t off = 0;
    for (int k = 0; k < NVARS; k++) {
        size_t n = (size_t)var_size(k);
        if (stage < 0 || res->owner[k] == stage) {
            wf_tensor *v = NULL;
            TU_OK(wf_session_variable(s, m.vars[k], &v));
            TU_OK(wf_tensor_read(v, WF_F32, res->w + off, n * sizeof(float)));
            wf_tensor_release(v);
        }
        off += n;
    }
    free(x);
    free(y);
    wf_session_destroy(s);
    wf_graph_destroy(m.g);
    return 0;
}

static int rank_train(wf_comm *c, int rank, int size, void *argp)
{
    (void)size;
    const pp_arg *a = argp;
    wf_place_hints *h = NULL;
    bool planner = a->placement == WF_PIPELINE_PLACE_AUTO;
    if (!planner)
        TU_OK(wf_place_hints_create(&h));
    wf_cost_table *costs = NULL;
    if (a->heavy_s > 0) { /* the signature of the copy the planner sees: one micro-batch's rows */
        wf_graph *cg = wf_graph_create(tu_rt, WF_STATIC);
        int64_t rows = (a->batch + a->micro - 1) / a->micro;
        wf_node *mm = wf_matmul(cg, wf_placeholder(cg, "a", WF_F32, WF_SHAPE(rows, HID)),
                                wf_variable(cg, "w", WF_F32, WF_SHAPE(HID, OUT), wf_init_zeros()));
        TU_OK(wf_cost_table_create(&costs));
        TU_CHECK(mm, "the costed matmul: %s", wf_graph_errmsg(cg));
        TU_OK(wf_cost_table_put(costs, mm, WF_PLACE_CPU, a->heavy_s));
        wf_graph_destroy(cg);
    }
    wf_strategy *st = NULL;
    TU_OK(wf_strategy_pipeline(c,
                               &(wf_pipeline_opts){ .stages = a->stages,
                                                    .micro_batches = a->micro,
                                                    .schedule = a->schedule,
                                                    .batch_rows = a->batch,
                                                    .hints = h,
                                                    .placement = a->placement,
                                                    .costs = costs },
                               &st));
    pp_result *r = calloc(1, sizeof *r);
    TU_CHECK(r, "no memory");
    int rc = train(tu_rt, st, a, rank, h, r);
    if (rc == 0) {
        char path[200];
        snprintf(path, sizeof path, "%s.%d", a->path, rank);
        FILE *f = fopen(path, "wb");
        TU_CHECK(f, "open %s", path);
        TU_CHECK(fwrite(r, sizeof *r, 1, f) == 1, "write %s", path);
        fclose(f);
    }
    free(r);
    wf_strategy_destroy(st);
    wf_place_hints_destroy(h);
    wf_cost_table_destroy(costs);
    return rc;
}
TU_REGISTER(rank_train)

/* The stages' files into one result: the last stage's losses, each variable from its own
 * stage. */
static void gather(const pp_arg *a, pp_result *out)
{
    mlp m;
    wf_runtime *rt = NULL;
    cr_assert_eq(wf_runtime_create(&rt, &(wf_runtime_opts){ .n_workers = 1 }), 0);
    cr_assert_eq(mlp_build(rt, &m, NULL, a->stages, M_TRAIN), 0);
    static pp_result part, losses[3];
    for (int r = 0; r < a->stages; r++) {
        char path[200];
        snprintf(path, sizeof path, "%s.%d", a->path, r);
        FILE *f = fopen(path, "rb");
        cr_assert_not_null(f, "no result from rank %d", r);
        cr_assert_eq(fread(&part, sizeof part, 1, f), 1);
        fclose(f);
        unlink(path);
        if (r == a->stages - 1) {
            out->steps = part.steps;
            memcpy(out->loss, part.loss, sizeof out->loss);
            memcpy(out->eval, part.eval, sizeof out->eval);
        }
        losses[r] = part; /* every stage fetched the loss: the global value, the same bits */
        if (r == 0) {
            memcpy(out->owner, part.owner, sizeof out->owner);
            memcpy(out->node_st, part.node_st, sizeof out->node_st);
        }
        cr_assert(!memcmp(out->owner, part.owner, sizeof out->owner) &&
                      !memcmp(out->node_st, part.node_st, sizeof out->node_st),
                  "rank %d puts the nodes on other stages than rank 0", r);
        size_t off = 0;
        for (int k = 0; k < NVARS; off += (size_t)var_size(k), k++)
            if (part.owner[k] == r)
                memcpy(out->w + off, part.w + off, sizeof(float) * (size_t)var_size(k));
    }
    for (int r = 0; r < a->stages; r++)
        cr_assert(!memcmp(losses[r].loss, out->loss, sizeof out->loss) &&
                      !memcmp(losses[r].eval, out->eval, sizeof out->eval),
                  "stage %d fetched other losses than the last stage", r);
    wf_graph_destroy(m.g);
    wf_runtime_destroy(rt);
}

/* Runs 'a' (M_TRAIN) on a->stages ranks and gathers what they saw. */
static void run_arg(pp_arg *a, pp_result *r)
{
    int stages = a->stages, micro = a->micro, schedule = a->schedule, steps = a->steps;
    snprintf(a->path, sizeof a->path, "/tmp/weft-pipeline-%d-%d%d%d", (int)getpid(), stages,
             schedule, a->placement);
    tu_run t = { .size = stages,
                 .body = rank_train,
                 .arg = a,
                 .arg_size = sizeof *a,
                 .timeout_s = WF_TEST_TIMEOUT(60),
                 .with_rt = true };
    uint64_t t0 = wf_test_now_ns();
    tu_start(&t);
    cr_assert(tu_wait(&t), "%d stages did not finish in time", stages);
    for (int i = 0; i < stages; i++)
        cr_assert(WIFEXITED(t.status[i]) && WEXITSTATUS(t.status[i]) == 0,
                  "rank %d of %d failed (status %d; its stderr says why)", i, stages, t.status[i]);
    printf("pipeline %d stages, m = %d, %s%s: %d steps in %.2f s\n", stages, micro,
           schedule == WF_SCHEDULE_1F1B ? "1f1b" : "gpipe",
           a->placement == WF_PIPELINE_PLACE_AUTO ? ", planner" : "", steps,
           (double)(wf_test_now_ns() - t0) * 1e-9);
    gather(a, r);
}

static void run_pipeline(int stages, int micro, int schedule, int steps, int batch, pp_result *r)
{
    pp_arg a = { .mode = M_TRAIN,
                 .stages = stages,
                 .micro = micro,
                 .schedule = schedule,
                 .steps = steps,
                 .batch = batch };
    run_arg(&a, r);
}

/* The same in this process: 'shards' shards of MultiWorkerMirrored without a communicator,
 * or (0) a plain session. */
static void run_local(int shards, int steps, int batch, pp_result *r)
{
    wf_runtime *rt = NULL;
    cr_assert_eq(wf_runtime_create(&rt, &(wf_runtime_opts){ .n_workers = 2 }), 0);
    pp_arg a = { .stages = 1, .steps = steps, .batch = batch };
    wf_strategy *st = NULL;
    if (shards)
        cr_assert_eq(wf_strategy_multiworker(NULL, &(wf_strategy_opts){ .shards = shards }, &st), 0,
                     "%s", wf_last_errmsg());
    cr_assert_eq(train(rt, st, &a, -1, NULL, r), 0, "the local run failed");
    wf_strategy_destroy(st);
    wf_runtime_destroy(rt);
}

static void assert_close(const pp_result *a, const pp_result *b, const char *what)
{
    for (int s = 0; s < a->steps; s++) {
        double d = fabs((double)a->loss[s] - (double)b->loss[s]);
        cr_assert(d <= 1e-6 * fabs((double)b->loss[s]),
                  "%s: step %d: loss %.9g vs %.9g (%.3g relative)", what, s, a->loss[s], b->loss[s],
                  d / fabs((double)b->loss[s]));
    }
    double d2 = 0, n2 = 0, worst = 0;
    for (int i = 0; i < NW; i++) {
        double d = fabs((double)a->w[i] - (double)b->w[i]);
        double scale = fabs((double)b->w[i]) > 1e-3 ? fabs((double)b->w[i]) : 1e-3;
        worst = d / scale > worst ? d / scale : worst;
        d2 += d * d;
        n2 += (double)b->w[i] * b->w[i];
    }
    printf("%s: weights differ by %.3g (norm) relative, at most %.3g per element\n", what,
           sqrt(d2 / n2), worst);
    cr_assert(sqrt(d2 / n2) <= 1e-6, "%s: the weights differ by %.3g relative", what,
              sqrt(d2 / n2));
}

static void assert_bitwise(const pp_result *a, const pp_result *b, const char *what)
{
    for (int s = 0; s < a->steps; s++)
        cr_assert(!memcmp(&a->loss[s], &b->loss[s], sizeof(float)),
                  "%s: step %d: loss %.9g vs %.9g", what, s, a->loss[s], b->loss[s]);
    for (int k = 0; k < a->steps / 4; k++)
        cr_assert(!memcmp(&a->eval[k], &b->eval[k], sizeof(float)),
                  "%s: evaluation %d: loss %.9g vs %.9g", what, k, a->eval[k], b->eval[k]);
    for (int i = 0; i < NW; i++)
        cr_assert(!memcmp(&a->w[i], &b->w[i], sizeof(float)), "%s: weight %d: %.9g vs %.9g", what,
                  i, a->w[i], b->w[i]);
}

static void check_schedule(int stages, int schedule)
{
    static pp_result pipe, local, plain;
    int steps = 12, batch = 30; /* 30 rows: micro-batches of 8, 8, 7 and 7 */
    run_pipeline(stages, 4, schedule, steps, batch, &pipe);
    run_local(4, steps, batch, &local);
    run_local(0, steps, batch, &plain);
    assert_bitwise(&pipe, &local, "pipeline vs one process with 4 shards");
    assert_close(&pipe, &plain, "pipeline vs plain training");
}

/* The planner's stages (placement auto, no hints): the plan's text names every stage, the
 * bubble and the nodes; the run trains the bits of the same stages given as hints, and of one
 * process with 4 shards. */
static void check_planner(int stages, int schedule)
{
    static pp_result planned, hinted, local;
    int steps = 8, batch = 30;
    pp_arg a = { .mode = M_TRAIN,
                 .stages = stages,
                 .micro = 4,
                 .schedule = schedule,
                 .steps = steps,
                 .batch = batch,
                 .placement = WF_PIPELINE_PLACE_AUTO };
    run_arg(&a, &planned);
    char path[200], text[4096] = "";
    snprintf(path, sizeof path, "%s.plan", a.path);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "rank 0 wrote no plan");
    size_t len = fread(text, 1, sizeof text - 1, f);
    text[len] = 0;
    fclose(f);
    unlink(path);
    printf("%s", text);
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
    run_arg(&b, &hinted);
    run_local(4, steps, batch, &local);
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

Test(transport_pipeline_plan, two_stages_gpipe_train_the_bits_of_one_process_with_4_shards)
{
    check_schedule(2, WF_SCHEDULE_GPIPE);
}

Test(transport_pipeline_plan, two_stages_1f1b_train_the_bits_of_one_process_with_4_shards)
{
    check_schedule(2, WF_SCHEDULE_1F1B);
}

Test(transport_pipeline_plan, three_stages_1f1b_train_the_bits_of_one_process_with_4_shards)
{
    check_schedule(3, WF_SCHEDULE_1F1B);
}

Test(transport_pipeline_plan, three_stages_gpipe_train_the_bits_of_one_process_with_4_shards)
{
    check_schedule(3, WF_SCHEDULE_GPIPE);
}

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

Test(transport_pipeline_plan, one_f_one_b_runs_micro_batch_0_before_micro_batch_1_starts)
{
    check_order(WF_SCHEDULE_1F1B);
}

Test(transport_pipeline_plan, gpipe_runs_every_forward_before_the_first_backward)
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

Test(transport_pipeline_plan, a_killed_stage_fails_the_others_run_within_2s_with_epeer)
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

/* Both ranks fail session creation naming the variable read on two stages. */

Test(transport_pipeline_plan, bad_options_fail_naming_them)
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

/* A measured cost (the table's, not the prior) moves the split: with the last layer's matmul
 * at 1 s per micro-batch, the planner puts it and what follows on stage 1 and every op before
 * it on stage 0 (anything more on stage 1 would make the slowest stage slower); the run still
 * trains the bits of one process with 4 shards. */
Test(transport_pipeline_plan, planner_follows_a_measured_cost_table)
{
    static pp_result planned, local;
    pp_arg a = { .mode = M_TRAIN,
                 .stages = 2,
                 .micro = 4,
                 .schedule = WF_SCHEDULE_1F1B,
                 .steps = 4,
                 .batch = 30,
                 .placement = WF_PIPELINE_PLACE_AUTO,
                 .heavy_s = 1.0 };
    run_arg(&a, &planned);
    char path[200];
    snprintf(path, sizeof path, "%s.plan", a.path);
    unlink(path);
    wf_runtime *rt = NULL;
    cr_assert_eq(wf_runtime_create(&rt, &(wf_runtime_opts){ .n_workers = 1 }), 0);
    mlp m;
    cr_assert_eq(mlp_build(rt, &m, NULL, 2, M_TRAIN), 0);
    int heavy = -1, matmuls = 0;
    for (int id = 0; id < FWD && heavy < 0; id++)
        if (strcmp(wf_node_op(wf_graph_node(m.g, id)), "matmul") == 0 && ++matmuls == 3)
            heavy = id;
    cr_assert_geq(heavy, 0, "no third matmul");
    for (int id = 0; id < FWD; id++)
        if (planned.node_st[id] >= 0)
            cr_assert_eq(planned.node_st[id], id < heavy ? 0 : 1,
                         "node %d (%s) is on stage %d; the costed matmul is node %d", id,
                         wf_node_name(wf_graph_node(m.g, id)), planned.node_st[id], heavy);
    wf_graph_destroy(m.g);
    wf_runtime_destroy(rt);
    run_local(4, a.steps, a.batch, &local);
    assert_bitwise(&planned, &local, "planner's stages from measured costs vs 4 shards");
}
