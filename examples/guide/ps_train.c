/* ps_train.c: data-parallel training with parameter servers (docs/distributed.md): rank 0
 * holds the variables and the optimizer state, the other ranks are workers that compute their
 * rows of the global batch, push the gradients and pull the new variables each step.
 * Run: weft-run -n 3 ./ps_train   (1 server, 2 workers; any N >= 2; the losses are those of
 *   ./dp_train 2 under weft-run -n 2, MultiWorkerMirrored with as many shards as workers)
 * Build: cc ps_train.c $(pkg-config --cflags --libs weft) -lm -o ps_train */
#include <weft/weft.h>

#include <math.h>
#include <stdio.h>

#define B 64 /* the global batch */

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
    wf_strategy *st = NULL;
    if (wf_dist_opts_from_env(&co) < 0 || wf_runtime_create(&rt, NULL) < 0)
        return fail("setup");
    if (wf_comm_create(rt, &co, &c) < 0)
        return fail("wf_comm_create");
    /* Rank 0 is the server; 'staleness' 0 is synchronous: one step of every worker, then one
     * update. */
    if (wf_strategy_ps(c, &(wf_ps_opts){ .servers = 1, .staleness = 0 }, &st) < 0)
        return fail("wf_strategy_ps");
    int server = wf_strategy_is_server(st);

    /* The same graph on every rank, written for one replica. */
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(-1, 2));
    wf_node *y = wf_placeholder(g, "y", WF_I32, WF_SHAPE(-1));
    wf_node *w1 = wf_variable(g, "w1", WF_F32, WF_SHAPE(2, 32), wf_init_glorot_uniform(1));
    wf_node *b1 = wf_variable(g, "b1", WF_F32, WF_SHAPE(32), wf_init_zeros());
    wf_node *w2 = wf_variable(g, "w2", WF_F32, WF_SHAPE(32, 2), wf_init_glorot_uniform(2));
    wf_node *h = wf_relu(g, wf_add(g, wf_matmul(g, x, w1), b1));
    wf_node *loss = wf_mean(g, wf_softmax_cross_entropy(g, wf_matmul(g, h, w2), y));
    wf_node *train = wf_minimize(g, wf_adam(0.02), loss);
    wf_session *s = NULL;
    if (wf_session_create(g, &(wf_session_opts){ .strategy = st }, &s) < 0)
        return fail("wf_session_create");

    float xs[B * 2];
    int32_t ys[B];
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
        wf_tensor *out = NULL;
        /* A server's run serves one step: it needs no batch, and fetches the global loss. */
        int rc = wf_session_run(s, server ? NULL : f, server ? 0 : 2, &loss, 1, &out, &train, 1);
        wf_tensor_release(xt);
        wf_tensor_release(yt);
        if (rc < 0) {
            fprintf(stderr, "step %d: %s\n", step, wf_session_errmsg(s));
            return 1;
        }
        if (co.rank == 0 && step % 50 == 0)
            printf("step %3d: loss %.9f\n", step, wf_tensor_data_f32(out)[0]);
        wf_tensor_release(out);
    }
    printf("rank %d of %d: %s\n", co.rank, wf_comm_size(c), server ? "server" : "worker");
    wf_session_destroy(s);
    wf_graph_destroy(g);
    wf_strategy_destroy(st);
    wf_comm_destroy(c);
    wf_runtime_destroy(rt);
    return 0;
}
