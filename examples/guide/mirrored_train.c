/* mirrored_train.c: data-parallel training over the devices of one process with the Mirrored
 * strategy (docs/distributed.md): the graph is written once, for one replica; the strategy
 * runs one replica per device on its shard of the global batch, sums the gradients on the
 * host in a fixed order, and applies one update. It then trains the same model in one
 * process with the same number of shards and no devices, and compares the weights' bytes.
 * Run: ./mirrored_train [devices]   (2 by default: the first GPUs, or simulated devices
 *   where there are fewer GPUs, which compute what the CPU does, without a speed-up)
 * Build: cc mirrored_train.c $(pkg-config --cflags --libs weft) -lm -o mirrored_train */
#include <weft/weft.h>

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define B     60 /* the global batch: each of D devices takes B / D of its rows */
#define STEPS 100

static int fail(const char *what)
{
    fprintf(stderr, "%s: %s\n", what, wf_last_errmsg());
    return 1;
}

/* Trains the two-rings model under 'st'; writes w1's final values to 'w1_out' (2 x 32). */
static int train(wf_runtime *rt, const wf_strategy *st, const char *tag, float *w1_out)
{
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(-1, 2)); /* -1: the batch */
    wf_node *y = wf_placeholder(g, "y", WF_I32, WF_SHAPE(-1));
    wf_node *w1 = wf_variable(g, "w1", WF_F32, WF_SHAPE(2, 32), wf_init_glorot_uniform(1));
    wf_node *b1 = wf_variable(g, "b1", WF_F32, WF_SHAPE(32), wf_init_zeros());
    wf_node *w2 = wf_variable(g, "w2", WF_F32, WF_SHAPE(32, 2), wf_init_glorot_uniform(2));
    wf_node *h = wf_relu(g, wf_add(g, wf_matmul(g, x, w1), b1));
    wf_node *logits = wf_matmul(g, h, w2);
    wf_node *loss = wf_mean(g, wf_softmax_cross_entropy(g, logits, y));
    wf_node *train = wf_minimize(g, wf_adam(0.02), loss);
    wf_session *s = NULL;
    if (wf_session_create(g, &(wf_session_opts){ .strategy = st }, &s) < 0) {
        fprintf(stderr, "wf_session_create: %s\n", wf_graph_errmsg(g));
        wf_graph_destroy(g);
        return 1;
    }
    float xs[B * 2];
    int32_t ys[B];
    for (int step = 0; step < STEPS; step++) {
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
        int rc = wf_session_run(s, f, 2, &loss, 1, &out, &train, 1);
        wf_tensor_release(xt);
        wf_tensor_release(yt);
        if (rc < 0) {
            fprintf(stderr, "step %d: %s\n", step, wf_session_errmsg(s));
            return 1;
        }
        if (step % 50 == 0 || step == STEPS - 1) /* the global batch's mean loss */
            printf("%s: step %3d: loss %.9f\n", tag, step, wf_tensor_data_f32(out)[0]);
        wf_tensor_release(out);
    }
    wf_tensor *v = NULL;
    int rc = wf_session_variable(s, w1, &v);
    if (rc == 0)
        rc = wf_tensor_read(v, WF_F32, w1_out, 2 * 32 * sizeof(float));
    wf_tensor_release(v);
    wf_session_destroy(s);
    wf_graph_destroy(g);
    return rc < 0 ? fail("reading w1") : 0;
}

int main(int argc, char **argv)
{
    int d = argc > 1 ? atoi(argv[1]) : 2;
    wf_runtime *rt = NULL;
    if (wf_runtime_create(&rt, NULL) < 0)
        return fail("wf_runtime_create");
    int gpus = wf_device_count(rt) - 1; /* device 0 is the CPU */
    bool sim = gpus < d;
    wf_strategy *mirrored = NULL, *one = NULL;
    /* D devices: the first D GPUs, else D simulated ones; S = D shards (the default) */
    wf_strategy_opts mo = { .n_devices = d, .simulated_devices = sim ? d : 0 };
    if (wf_strategy_mirrored(rt, &mo, &mirrored) < 0)
        return fail("wf_strategy_mirrored");
    /* the same shards in one process, without devices: the reference */
    if (wf_strategy_multiworker(NULL, &(wf_strategy_opts){ .shards = d }, &one) < 0)
        return fail("wf_strategy_multiworker");
    printf("mirrored over %d %s\n", d, sim ? "simulated devices" : "GPUs");
    float wa[64], wb[64];
    if (train(rt, mirrored, "mirrored", wa) || train(rt, one, "one process", wb))
        return 1;
    bool same = memcmp(wa, wb, sizeof wa) == 0;
    printf("%d devices and one process with %d shards: %s\n", d, d,
           same ? "the same weight bytes" : "different weights");
    wf_strategy_destroy(mirrored);
    wf_strategy_destroy(one);
    wf_runtime_destroy(rt);
    return same ? 0 : 1;
}
