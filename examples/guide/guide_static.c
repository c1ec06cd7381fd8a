/* guide_static.c: a static graph, trained through a session (docs/guide.md, "A static
 * graph"): the spiral classifier of guide_model.h with Adam, full batch, then its accuracy.
 * WEFT_TRACE=FILE writes a trace of the run. Exits 1 unless it learned (accuracy >= 0.9).
 * Build: cc guide_static.c $(pkg-config --cflags --libs weft) -lm -o guide_static */
#include "guide_model.h"

#include <weft/weft.h>

#include <stdio.h>

int main(void)
{
    /* Options from the environment (WEFT_WORKERS, WEFT_TRACE, ...), as every tool does. */
    wf_runtime_opts ro = { 0 };
    const char *trace = NULL;
    wf_runtime *rt;
    if (wf_runtime_opts_from_env(&ro, &trace) < 0 || wf_runtime_create(&rt, &ro) < 0) {
        fprintf(stderr, "runtime: %s\n", wf_last_errmsg());
        return 1;
    }

    /* Build: placeholders for the data (-1: any batch), the model, the loss, the step. */
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(-1, 2));
    wf_node *y = wf_placeholder(g, "y", WF_I32, WF_SHAPE(-1));
    wf_node *logits = spiral_model(g, x);
    wf_node *loss = wf_mean(g, wf_softmax_cross_entropy(g, logits, y));
    wf_node *acc = accuracy(g, logits, y);
    wf_node *train = wf_minimize(g, wf_adam(0.02), loss); /* gradients + Adam's updates */
    wf_session *s = NULL;
    if (wf_graph_status(g) < 0 || wf_session_create(g, NULL, &s) < 0) {
        fprintf(stderr, "building the model: %s\n", wf_graph_errmsg(g)); /* names the line */
        return 1;
    }

    float xs[N * 2];
    int32_t ys[N];
    spiral_data(xs, ys);
    wf_tensor *xt = wf_tensor_from(WF_F32, WF_SHAPE(N, 2), xs); /* copies the data */
    wf_tensor *yt = wf_tensor_from(WF_I32, WF_SHAPE(N), ys);
    wf_feed feeds[] = { { x, xt }, { y, yt } };

    /* Run: each call is one step. Fetch the loss, run 'train' as a target. */
    int rc = 0;
    for (int step = 0; step < 400 && rc == 0; step++) {
        wf_tensor *l;
        rc = wf_session_run(s, feeds, 2, &loss, 1, &l, &train, 1);
        if (rc == 0 && step % 100 == 0)
            printf("step %3d: loss %.4f\n", step, wf_tensor_get(l, 0));
        wf_tensor_release(l);
    }
    /* Evaluate: fetch two values, no target, so nothing is updated. */
    wf_node *fetch[] = { loss, acc };
    wf_tensor *out[2] = { NULL, NULL };
    if (rc == 0)
        rc = wf_session_run(s, feeds, 2, fetch, 2, out, NULL, 0);
    if (rc < 0) {
        fprintf(stderr, "%s: %s\n", wf_strerror(rc), wf_session_errmsg(s));
        return 1;
    }
    double a = wf_tensor_get(out[1], 0);
    printf("after 400 steps: loss %.4f, accuracy %.3f\n", wf_tensor_get(out[0], 0), a);

    wf_plan_stats st; /* what the compile passes did to the training step's plan */
    if (wf_session_plan_stats(s, NULL, 0, &train, 1, &st) == 0)
        printf("training step: %d graph nodes, %d after pruning, %d in the plan\n", st.nodes_graph,
               st.nodes_after_prune, st.nodes_after_optim_fuse);
    if (trace) {
        int n = wf_runtime_trace_write(rt, trace);
        printf("trace: %d events in %s\n", n, n < 0 ? wf_last_errmsg() : trace);
    }
    wf_tensor_release(out[0]);
    wf_tensor_release(out[1]);
    wf_tensor_release(xt);
    wf_tensor_release(yt);
    wf_session_destroy(s);
    wf_graph_destroy(g);
    wf_runtime_destroy(rt);
    return a >= 0.9 ? 0 : 1;
}
