/* guide_resume.c: checkpoints every K steps and resuming after a crash (docs/guide.md,
 * "Checkpoints every K steps"): the spiral model of guide_model.h trained for 600 steps with
 * Adam, a checkpoint every 100 steps written in the background (the newest 2 kept), each
 * holding the weights, the optimizer's state, the step and the data position. Started
 * again, it goes on from the newest complete checkpoint in DIR.
 * Usage: guide_resume DIR [CRASH_AT]   (CRASH_AT: stop dead after that step, as a kill would)
 * Build: cc guide_resume.c $(pkg-config --cflags --libs weft) -lm -o guide_resume */
#include "guide_model.h"

#include <weft/weft.h>

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

enum { BATCH = 50, STEPS = 600, EVERY = 100 };

int main(int argc, char **argv)
{
    if (argc != 2 && argc != 3) {
        fprintf(stderr, "usage: %s DIR [CRASH_AT]\n", argv[0]);
        return 2;
    }
    long crash_at = argc == 3 ? atol(argv[2]) : -1;
    wf_runtime *rt;
    if (wf_runtime_create(&rt, NULL) < 0) {
        fprintf(stderr, "%s\n", wf_last_errmsg());
        return 1;
    }
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(BATCH, 2));
    wf_node *y = wf_placeholder(g, "y", WF_I32, WF_SHAPE(BATCH));
    wf_node *loss = wf_mean(g, wf_softmax_cross_entropy(g, spiral_model(g, x), y));
    wf_node *train = wf_minimize(g, wf_adam(0.01), loss);
    wf_session *s = NULL;
    if (wf_graph_status(g) < 0 || wf_session_create(g, NULL, &s) < 0) {
        fprintf(stderr, "%s\n", wf_graph_errmsg(g));
        return 1;
    }

    /* Resume: the newest complete checkpoint of DIR, if there is one. Its extras are what the
     * program saved beside the variables: here the data position. */
    int64_t step = 0, cursor = 0;
    char path[4096];
    int rc = wf_checkpoint_latest(argv[1], path, sizeof path, &step);
    if (rc == 0) {
        wf_named_tensor *extra = NULL;
        int n_extra = 0;
        rc = wf_checkpoint_restore(s, path, &step, &extra, &n_extra);
        for (int i = 0; rc == 0 && i < n_extra; i++)
            if (wf_tensor_data_i64(extra[i].tensor)) /* "data.cursor", I64 [1] */
                cursor = wf_tensor_data_i64(extra[i].tensor)[0];
        wf_safetensors_free(extra, n_extra);
        if (rc == 0)
            printf("resumed at step %lld from %s\n", (long long)step, path);
    } else if (rc == WF_ENOTFOUND) {
        rc = 0; /* nothing saved yet: a fresh start */
    }
    wf_checkpointer *ck = NULL;
    if (rc == 0)
        rc = wf_checkpointer_create(&(wf_checkpointer_opts){ .dir = argv[1], .keep = 2 }, &ck);

    float xs[N * 2];
    int32_t ys[N];
    spiral_data(xs, ys);
    double last = 0;
    for (; step < STEPS && rc == 0; step++) {
        /* The batch at 'cursor' of a fixed shuffle: rows i * 7 mod N. */
        float xb[BATCH * 2];
        int32_t yb[BATCH];
        for (int i = 0; i < BATCH; i++) {
            int r = (int)(((cursor + i) * 7) % N);
            xb[2 * i] = xs[2 * r];
            xb[2 * i + 1] = xs[2 * r + 1];
            yb[i] = ys[r];
        }
        cursor = (cursor + BATCH) % N;
        wf_tensor *xt = wf_tensor_from(WF_F32, WF_SHAPE(BATCH, 2), xb);
        wf_tensor *yt = wf_tensor_from(WF_I32, WF_SHAPE(BATCH), yb);
        wf_feed feeds[] = { { x, xt }, { y, yt } };
        wf_tensor *l = NULL;
        rc = wf_session_run(s, feeds, 2, &loss, 1, &l, &train, 1);
        if (rc == 0)
            last = wf_tensor_get(l, 0);
        wf_tensor_release(l);
        wf_tensor_release(xt);
        wf_tensor_release(yt);
        if (rc == 0 && (step + 1) % EVERY == 0) {
            /* A snapshot into host buffers now; the file is written while training goes
             * on. A failure of an earlier write is returned here. */
            wf_tensor *c = wf_tensor_from(WF_I64, WF_SHAPE(1), &cursor);
            wf_named_tensor extra = { "data.cursor", c };
            rc = wf_checkpointer_save(ck, s, step + 1, &extra, 1);
            wf_tensor_release(c);
        }
        if (step + 1 == crash_at) {
            printf("crashing after step %ld\n", crash_at);
            fflush(stdout);
            _exit(3); /* no clean-up at all, as a kill */
        }
    }
    if (rc == 0)
        rc = wf_checkpointer_wait(ck); /* the last write, and its failure if any */
    if (rc == 0)
        printf("step %lld: last batch loss %.4f\n", (long long)step, last);
    else
        fprintf(stderr, "%s: %s\n", wf_strerror(rc), wf_last_errmsg());
    wf_checkpointer_destroy(ck);
    wf_session_destroy(s);
    wf_graph_destroy(g);
    wf_runtime_destroy(rt);
    return rc < 0 ? 1 : 0;
}
