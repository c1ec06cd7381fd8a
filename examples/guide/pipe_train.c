/* pipe_train.c: pipeline training (docs/distributed.md): one model, its first layer on stage
 * 0 and its second on the last stage, one stage per rank; each step's global batch goes
 * through the stages in 4 micro-batches in the 1F1B order, and each gradient is the fixed
 * sum over the micro-batches, so any number of stages prints the same losses.
 * Run: weft-run -n 2 ./pipe_train   (alone it is one stage: the same lines)
 * Build: cc pipe_train.c $(pkg-config --cflags --libs weft) -lm -o pipe_train */
#include <weft/weft.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#define B 64 /* the global batch: every rank is fed all of it */

static int fail(const char *what)
{
    fprintf(stderr, "%s: %s\n", what, wf_last_errmsg());
    return 1;
}

int main(void)
{
    wf_comm_opts co = { .rank = 0, .size = 1 }; /* weft-run's WEFT_RANK, WEFT_SIZE, ... */
    wf_runtime *rt = NULL;
    wf_comm *c = NULL;
    wf_place_hints *h = NULL;
    wf_strategy *st = NULL;
    if (wf_dist_opts_from_env(&co) < 0 || wf_runtime_create(&rt, NULL) < 0 ||
        wf_place_hints_create(&h) < 0)
        return fail("setup");
    if (wf_comm_create(rt, &co, &c) < 0)
        return fail("wf_comm_create");
    wf_pipeline_opts po = {
        .micro_batches = 4, .schedule = WF_SCHEDULE_1F1B, .batch_rows = B, .hints = h
    };
    if (wf_strategy_pipeline(c, &po, &st) < 0)
        return fail("wf_strategy_pipeline");

    /* The model, each layer in the scope of its stage; the backward nodes follow. */
    char last[32];
    snprintf(last, sizeof last, "rank:%d/cpu:0", wf_comm_size(c) - 1);
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(-1, 2));
    wf_node *y = wf_placeholder(g, "y", WF_I32, WF_SHAPE(-1));
    wf_node *w1 = wf_variable(g, "w1", WF_F32, WF_SHAPE(2, 32), wf_init_glorot_uniform(1));
    wf_node *b1 = wf_variable(g, "b1", WF_F32, WF_SHAPE(32), wf_init_zeros());
    wf_node *w2 = wf_variable(g, "w2", WF_F32, WF_SHAPE(32, 2), wf_init_glorot_uniform(2));
    if (wf_place_scope_begin(h, g, "rank:0/cpu:0") < 0)
        return fail("scope");
    wf_node *a = wf_relu(g, wf_add(g, wf_matmul(g, x, w1), b1));
    if (wf_place_scope_end(h, g) < 0 || wf_place_scope_begin(h, g, last) < 0)
        return fail("scope");
    wf_node *logits = wf_matmul(g, a, w2);
    wf_node *loss = wf_mean(g, wf_softmax_cross_entropy(g, logits, y));
    if (wf_place_scope_end(h, g) < 0)
        return fail("scope");
    wf_node *train = wf_minimize(g, wf_adam(0.02), loss);
    wf_session *s = NULL;
    /* Collective: every rank creates its session and keeps its stage of the graph. */
    if (wf_session_create(g, &(wf_session_opts){ .strategy = st }, &s) < 0)
        return fail("wf_session_create");

    float xs[B * 2];
    int32_t ys[B];
    for (int step = 0; step < 200; step++) {
        for (int i = 0; i < B; i++) { /* two rings: inside (0) and outside (1) */
            double t = 0.7 * (step * B + i), r = (i % 2) ? 2.0 : 1.0;
            xs[2 * i] = (float)(r * cos(t));
            xs[2 * i + 1] = (float)(r * sin(t));
            ys[i] = i % 2;
        }
        wf_tensor *xt = wf_tensor_from(WF_F32, WF_SHAPE(B, 2), xs);
        wf_tensor *yt = wf_tensor_from(WF_I32, WF_SHAPE(B), ys);
        wf_feed f[] = { { x, xt }, { y, yt } };
        wf_tensor *out = NULL;
        int rc = wf_session_run(s, f, 2, &loss, 1, &out, &train, 1);
        wf_tensor_release(xt);
        wf_tensor_release(yt);
        if (rc < 0) {
            fprintf(stderr, "step %d: %s\n", step, wf_session_errmsg(s));
            return 1;
        }
        /* The loss is the global value on every stage (sent from the last one). */
        if (co.rank == 0 && step % 50 == 0)
            printf("step %3d: loss %.9f\n", step, wf_tensor_data_f32(out)[0]);
        wf_tensor_release(out);
    }
    if (co.rank == 0)
        printf("stage 0 of %d: done\n", wf_comm_size(c));
    wf_session_destroy(s);
    wf_graph_destroy(g);
    wf_strategy_destroy(st);
    wf_place_hints_destroy(h);
    wf_comm_destroy(c);
    wf_runtime_destroy(rt);
    return 0;
}
