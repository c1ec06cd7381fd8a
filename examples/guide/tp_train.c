/* tp_train.c: tensor (intra-op) parallelism (docs/distributed.md): one two-layer block,
 * x·W1 + b1 -> relu -> ·W2 + b2, split Megatron's way over the ranks (W1 and b1 by columns,
 * W2 by rows: each rank holds 1/N of both weights), with one all-reduce of the block's output
 * per step forward (and one of x's gradient backward). The shards start from the slices of the
 * full weights, and the all-reduce sums in rank order, so every rank prints the same losses as
 * one process does, up to the rounding of the reordered sum over the hidden width.
 * Run: weft-run -n 2 ./tp_train   (alone it is a group of one: the same lines)
 * Build: cc tp_train.c $(pkg-config --cflags --libs weft) -lm -o tp_train */
#include <weft/weft.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#define B 64 /* the batch: every rank is fed all of it */
#define H 32 /* the hidden width, split over the ranks */

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
    if (wf_dist_opts_from_env(&co) < 0 || wf_runtime_create(&rt, NULL) < 0)
        return fail("setup");
    if (wf_comm_create(rt, &co, &c) < 0)
        return fail("wf_comm_create");

    /* The model as one process would build it (forward only). */
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(B, 2));
    wf_node *y = wf_placeholder(g, "y", WF_I32, WF_SHAPE(B));
    wf_node *w1 = wf_variable(g, "w1", WF_F32, WF_SHAPE(2, H), wf_init_glorot_uniform(1));
    wf_node *b1 = wf_variable(g, "b1", WF_F32, WF_SHAPE(H), wf_init_zeros());
    wf_node *w2 = wf_variable(g, "w2", WF_F32, WF_SHAPE(H, 2), wf_init_glorot_uniform(2));
    wf_node *b2 = wf_variable(g, "b2", WF_F32, WF_SHAPE(2), wf_init_zeros());
    wf_node *a = wf_relu(g, wf_add(g, wf_matmul(g, x, w1), b1));
    wf_node *logits = wf_add(g, wf_matmul(g, a, w2), b2);
    wf_node *loss = wf_mean(g, wf_softmax_cross_entropy(g, logits, y));
    if (!loss || wf_node_set_name(loss, "loss") < 0)
        return fail("model");

    /* This rank's graph: the block split over the communicator's ranks (key edges 0 and 1),
     * then the gradients and the optimizer, added to it. */
    wf_graph *tg = NULL;
    wf_tp_block blk = { w1, b1, w2, b2 };
    if (wf_tp_split_create(g, &blk, 1, co.rank, wf_comm_size(c), 0, &tg) < 0)
        return fail("wf_tp_split_create");
    wf_node *tx = wf_graph_find(tg, "x"), *ty = wf_graph_find(tg, "y");
    wf_node *tloss = wf_graph_find(tg, "loss");
    wf_node *train = wf_minimize(tg, wf_adam(0.02), tloss);
    wf_session *s = NULL;
    if (!train || wf_session_create(tg, &(wf_session_opts){ .comm = c }, &s) < 0)
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
        wf_feed f[] = { { tx, xt }, { ty, yt } };
        wf_tensor *out = NULL;
        int rc = wf_session_run(s, f, 2, &tloss, 1, &out, &train, 1);
        wf_tensor_release(xt);
        wf_tensor_release(yt);
        if (rc < 0) {
            fprintf(stderr, "step %d: %s\n", step, wf_session_errmsg(s));
            return 1;
        }
        if (step % 50 == 0 || step == 199)
            printf("step %3d: loss %.6f\n", step, wf_tensor_data_f32(out)[0]);
        wf_tensor_release(out);
    }
    wf_shape ws = wf_node_shape(wf_graph_find(tg, "w1"));
    printf("rank %d of %d: w1 shard [%lld, %lld] of [2, %d]\n", co.rank, wf_comm_size(c),
           (long long)ws.dims[0], (long long)ws.dims[1], H);
    wf_session_destroy(s);
    wf_graph_destroy(tg);
    wf_graph_destroy(g);
    wf_comm_destroy(c);
    wf_runtime_destroy(rt);
    return 0;
}
