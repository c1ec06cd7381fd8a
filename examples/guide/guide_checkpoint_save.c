/* guide_checkpoint_save.c: training with a tuned optimizer, then a checkpoint (docs/guide.md,
 * "Optimizers" and "Checkpoints"): the spiral model of guide_model.h, SGD with Nesterov
 * momentum, a cosine schedule with warm-up and clipping by global norm, on mini-batches;
 * the weights and the optimizer's state go to a safetensors file.
 * Usage: guide_checkpoint_save FILE.safetensors
 * Build: cc guide_checkpoint_save.c $(pkg-config --cflags --libs weft) -lm \
 *            -o guide_checkpoint_save */
#include "guide_model.h"

#include <weft/weft.h>

#include <stdio.h>

enum { BATCH = 50, STEPS = 600 };

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s FILE.safetensors\n", argv[0]);
        return 2;
    }
    wf_runtime *rt;
    if (wf_runtime_create(&rt, NULL) < 0) {
        fprintf(stderr, "%s\n", wf_last_errmsg());
        return 1;
    }
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(-1, 2));
    wf_node *y = wf_placeholder(g, "y", WF_I32, WF_SHAPE(-1));
    wf_node *loss = wf_mean(g, wf_softmax_cross_entropy(g, spiral_model(g, x), y));

    /* An optimizer is a plain struct: start from a constructor and change fields. */
    wf_optimizer opt = wf_momentum(0.2, 0.9, true); /* lr 0.2, momentum 0.9, Nesterov */
    opt.schedule = wf_lr_cosine(50, STEPS, 0.01);   /* warm up 50 steps, decay to 0.01 */
    opt.clip_norm = 5.0;                            /* clip gradients by global norm */
    wf_node *train = wf_minimize(g, opt, loss);
    wf_session *s = NULL;
    if (wf_graph_status(g) < 0 || wf_session_create(g, NULL, &s) < 0) {
        fprintf(stderr, "%s\n", wf_graph_errmsg(g));
        return 1;
    }

    float xs[N * 2];
    int32_t ys[N];
    spiral_data(xs, ys);
    int rc = 0;
    double last = 0;
    for (int step = 0; step < STEPS && rc == 0; step++) {
        /* Batch k of a fixed shuffle: rows i * 7 mod N (7 and N = 300 are coprime). */
        float xb[BATCH * 2];
        int32_t yb[BATCH];
        for (int i = 0; i < BATCH; i++) {
            int r = ((step * BATCH + i) * 7) % N;
            xb[2 * i] = xs[2 * r];
            xb[2 * i + 1] = xs[2 * r + 1];
            yb[i] = ys[r];
        }
        wf_tensor *xt = wf_tensor_from(WF_F32, WF_SHAPE(BATCH, 2), xb);
        wf_tensor *yt = wf_tensor_from(WF_I32, WF_SHAPE(BATCH), yb);
        wf_feed feeds[] = { { x, xt }, { y, yt } };
        wf_tensor *l = NULL;
        rc = wf_session_run(s, feeds, 2, &loss, 1, &l, &train, 1);
        if (rc == 0 && (last = wf_tensor_get(l, 0), step % 200 == 0))
            printf("step %3d: lr %.4f, loss %.4f\n", step, wf_optimizer_lr(&opt, step), last);
        wf_tensor_release(l);
        wf_tensor_release(xt);
        wf_tensor_release(yt);
    }
    /* Every variable: weights, momentum buffers ("l1.w/momentum") and the step counter. */
    if (rc == 0 && (rc = wf_checkpoint_save(s, argv[1])) == 0)
        printf("last batch loss %.4f; saved %s\n", last, argv[1]);
    if (rc < 0)
        fprintf(stderr, "%s: %s\n", wf_strerror(rc), wf_session_errmsg(s));
    wf_session_destroy(s);
    wf_graph_destroy(g);
    wf_runtime_destroy(rt);
    return rc < 0 ? 1 : 0;
}
