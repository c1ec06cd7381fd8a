/* design_example.c: weft's core calls in one training program (docs/guide.md starts from
 * the same model): a linear softmax classifier on synthetic 784-feature data, trained
 * with Adam for a few steps through a session. Its loss must fall; the test suite runs it.
 * Build: cc design_example.c $(pkg-config --cflags --libs weft) -o design_example */
#include <weft/weft.h>

#include <stdio.h>
#include <stdlib.h>

int main(void)
{
    wf_runtime *rt;
    if (wf_runtime_create(&rt, NULL) < 0) { /* NULL options: a worker per core */
        fprintf(stderr, "%s\n", wf_last_errmsg());
        return 1;
    }
    wf_graph *g = wf_graph_create(rt, WF_STATIC); /* or WF_EAGER */

    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(-1, 784)); /* -1: any batch */
    wf_node *y = wf_placeholder(g, "y", WF_I32, WF_SHAPE(-1));
    wf_node *w = wf_variable(g, "w", WF_F32, WF_SHAPE(784, 10), wf_init_glorot_uniform(42));
    wf_node *b = wf_variable(g, "b", WF_F32, WF_SHAPE(10), wf_init_zeros());
    wf_node *logits = wf_add(g, wf_matmul(g, x, w), b);
    wf_node *loss = wf_mean(g, wf_softmax_cross_entropy(g, logits, y));
    wf_node *train = wf_minimize(g, wf_adam(1e-3), loss); /* backward + update nodes */

    wf_session *s;
    if (wf_session_create(g, NULL, &s) < 0) {
        fprintf(stderr, "%s\n", wf_graph_errmsg(g));
        return 1;
    }
    /* Synthetic data: class c lights up features [78c, 78c + 78). */
    float *xdata = calloc(256 * 784, sizeof *xdata);
    int32_t *ydata = malloc(256 * sizeof *ydata);
    if (!xdata || !ydata)
        return 1;
    for (int i = 0; i < 256; i++) {
        ydata[i] = i % 10;
        for (int j = 0; j < 78; j++)
            xdata[i * 784 + 78 * ydata[i] + j] = 1.0f;
    }
    wf_tensor *xs = wf_tensor_from(WF_F32, WF_SHAPE(256, 784), xdata); /* copies */
    wf_tensor *ys = wf_tensor_from(WF_I32, WF_SHAPE(256), ydata);
    wf_feed feeds[] = { { x, xs }, { y, ys } };
    double first = 0, last = 0;
    for (int step = 0; step < 20; step++) {
        wf_tensor *out;
        int err = wf_session_run(s, feeds, 2, &loss, 1, &out, &train, 1);
        if (err < 0) {
            fprintf(stderr, "%s: %s\n", wf_strerror(err), wf_session_errmsg(s));
            return 1;
        }
        last = wf_tensor_data_f32(out)[0];
        if (step == 0)
            first = last;
        wf_tensor_release(out);
    }
    printf("loss %g -> %g after 20 Adam steps: %s\n", first, last,
           last < first ? "learning" : "NOT learning");
    wf_tensor_release(xs);
    wf_tensor_release(ys);
    free(xdata);
    free(ydata);
    wf_session_destroy(s);
    wf_graph_destroy(g);
    wf_runtime_destroy(rt);
    return last < first ? 0 : 1;
}
