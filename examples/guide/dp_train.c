/* dp_train.c: data-parallel training with MultiWorkerMirrored (docs/distributed.md): the
 * graph is written once, for one replica; the strategy shards the global batch over the
 * ranks, reduces the gradients in a fixed order, and every rank applies the same update.
 * Run: weft-run -n 2 ./dp_train [shards]   (alone it is rank 0 of 1; any number of ranks
 *   that divides the shards, 4 by default, prints the same losses to the last digit)
 * Build: cc dp_train.c $(pkg-config --cflags --libs weft) -lm -o dp_train */
#include <weft/weft.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#define B 64 /* the global batch: every rank feeds all of it, each computes its shards */

static int fail(const char *what)
{
    fprintf(stderr, "%s: %s\n", what, wf_last_errmsg());
    return 1;
}

int main(int argc, char **argv)
{
    int shards = argc > 1 ? atoi(argv[1]) : 4;
    wf_comm_opts co = { .rank = 0, .size = 1 }; /* weft-run's WEFT_RANK, WEFT_SIZE, ... */
    wf_runtime *rt = NULL;
    wf_comm *c = NULL;
    wf_strategy *st = NULL;
    if (wf_dist_opts_from_env(&co) < 0 || wf_runtime_create(&rt, NULL) < 0)
        return fail("setup");
    if (wf_comm_create(rt, &co, &c) < 0)
        return fail("wf_comm_create");
    if (wf_strategy_multiworker(c, &(wf_strategy_opts){ .shards = shards }, &st) < 0)
        return fail("wf_strategy_multiworker");

    /* One replica's model: -1 is the batch dimension the strategy shards. */
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(-1, 2));
    wf_node *y = wf_placeholder(g, "y", WF_I32, WF_SHAPE(-1));
    wf_node *w1 = wf_variable(g, "w1", WF_F32, WF_SHAPE(2, 32), wf_init_glorot_uniform(1));
    wf_node *b1 = wf_variable(g, "b1", WF_F32, WF_SHAPE(32), wf_init_zeros());
    wf_node *w2 = wf_variable(g, "w2", WF_F32, WF_SHAPE(32, 2), wf_init_glorot_uniform(2));
    wf_node *h = wf_relu(g, wf_add(g, wf_matmul(g, x, w1), b1));
    wf_node *logits = wf_matmul(g, h, w2);
    wf_node *loss = wf_mean(g, wf_softmax_cross_entropy(g, logits, y));
    wf_node *right =
        wf_sum(g, wf_cast(g, wf_eq(g, wf_argmax(g, logits, 1), wf_cast(g, y, WF_I64)), WF_F32));
    wf_node *train = wf_minimize(g, wf_adam(0.02), loss);
    wf_session *s = NULL;
    /* Collective: every rank creates its session; rank 0's initial weights reach all. */
    if (wf_session_create(g, &(wf_session_opts){ .strategy = st }, &s) < 0)
        return fail("wf_session_create");

    float xs[B * 2];
    int32_t ys[B];
    double acc = 0;
    for (int step = 0; step < 200; step++) {
        for (int i = 0; i < B; i++) { /* two rings: inside (0) and outside (1) */
            double a = 0.7 * (step * B + i), r = (i % 2) ? 2.0 : 1.0;
            xs[2 * i] = (float)(r * cos(a));
            xs[2 * i + 1] = (float)(r * sin(a));
            ys[i] = i % 2;
        }
        wf_tensor *xt = wf_tensor_from(WF_F32, WF_SHAPE(B, 2), xs);
        wf_tensor *yt = wf_tensor_from(WF_I32, WF_SHAPE(B), ys);
        wf_feed f[] = { { x, xt }, { y, yt } };
        wf_node *fetch[] = { loss, right };
        wf_tensor *out[2];
        int rc = wf_session_run(s, f, 2, fetch, 2, out, &train, 1);
        wf_tensor_release(xt);
        wf_tensor_release(yt);
        if (rc < 0) {
            fprintf(stderr, "step %d: %s\n", step, wf_session_errmsg(s));
            return 1;
        }
        /* Global values: the mean loss and the count of right answers of all B rows. */
        acc = wf_tensor_data_f32(out[1])[0] / B;
        if (co.rank == 0 && step % 50 == 0)
            printf("step %3d: loss %.9f, accuracy %.3f\n", step, wf_tensor_data_f32(out[0])[0],
                   acc);
        wf_tensor_release(out[0]);
        wf_tensor_release(out[1]);
    }
    if (co.rank == 0)
        printf("rank 0 of %d, %d shards: accuracy %.3f\n", wf_comm_size(c), shards, acc);
    wf_session_destroy(s);
    wf_graph_destroy(g);
    wf_strategy_destroy(st);
    wf_comm_destroy(c);
    wf_runtime_destroy(rt);
    return 0;
}
