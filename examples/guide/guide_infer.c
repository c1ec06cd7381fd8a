/* guide_infer.c: inference from a saved checkpoint (docs/guide.md, "Inference from a
 * checkpoint"): lists what the file holds, builds the spiral model of guide_model.h without
 * an optimizer, loads the weights into a session and classifies every point.
 * Exits 1 unless the accuracy is at least 0.9.
 * Usage: guide_infer FILE.safetensors   (written by guide_checkpoint_save)
 * Build: cc guide_infer.c $(pkg-config --cflags --libs weft) -lm -o guide_infer */
#include "guide_model.h"

#include <weft/weft.h>

#include <stdio.h>

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s FILE.safetensors\n", argv[0]);
        return 2;
    }
    /* A checkpoint is a safetensors file: any tool can read it, and so can weft. */
    wf_named_tensor *ts;
    int n;
    if (wf_safetensors_read(argv[1], &ts, &n) < 0) {
        fprintf(stderr, "%s\n", wf_last_errmsg());
        return 1;
    }
    for (int i = 0; i < n; i++) {
        char shape[64];
        printf("  %-16s %s %s\n", ts[i].name, wf_dtype_name(wf_tensor_dtype(ts[i].tensor)),
               wf_shape_str(wf_tensor_shape(ts[i].tensor), shape, sizeof shape));
    }
    wf_safetensors_free(ts, n);

    wf_runtime *rt;
    if (wf_runtime_create(&rt, NULL) < 0) {
        fprintf(stderr, "%s\n", wf_last_errmsg());
        return 1;
    }
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(-1, 2));
    wf_node *y = wf_placeholder(g, "y", WF_I32, WF_SHAPE(-1));
    wf_node *logits = spiral_model(g, x);
    wf_node *pred = wf_argmax(g, logits, -1);
    wf_node *acc = accuracy(g, logits, y);
    wf_session *s = NULL;
    if (wf_graph_status(g) < 0 || wf_session_create(g, NULL, &s) < 0) {
        fprintf(stderr, "%s\n", wf_graph_errmsg(g));
        return 1;
    }
    /* The file also holds the optimizer's state, which this graph has no variables for:
     * allow those extra tensors. A missing weight or a wrong shape is still an error. */
    int rc = wf_checkpoint_load(s, argv[1], WF_CHECKPOINT_ALLOW_UNEXPECTED);
    float xs[N * 2];
    int32_t ys[N];
    spiral_data(xs, ys);
    wf_tensor *xt = wf_tensor_from(WF_F32, WF_SHAPE(N, 2), xs);
    wf_tensor *yt = wf_tensor_from(WF_I32, WF_SHAPE(N), ys);
    wf_feed feeds[] = { { x, xt }, { y, yt } };
    wf_node *fetch[] = { pred, acc };
    wf_tensor *out[2] = { NULL, NULL };
    if (rc == 0)
        rc = wf_session_run(s, feeds, 2, fetch, 2, out, NULL, 0);
    double a = 0;
    if (rc == 0) {
        a = wf_tensor_get(out[1], 0);
        int k = PER_CLASS + PER_CLASS / 2; /* a point halfway along the second spiral */
        printf("point %d (%.3f, %.3f): class %d, predicted %g\n", k, xs[2 * k], xs[2 * k + 1],
               ys[k], wf_tensor_get(out[0], k));
        printf("accuracy on the %d points: %.3f\n", N, a);
    } else {
        fprintf(stderr, "%s: %s\n", wf_strerror(rc), wf_session_errmsg(s));
    }
    wf_tensor_release(out[0]);
    wf_tensor_release(out[1]);
    wf_tensor_release(xt);
    wf_tensor_release(yt);
    wf_session_destroy(s);
    wf_graph_destroy(g);
    wf_runtime_destroy(rt);
    return rc == 0 && a >= 0.9 ? 0 : 1;
}
