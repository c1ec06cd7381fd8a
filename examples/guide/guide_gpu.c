/* guide_gpu.c: placing a model on a GPU (docs/gpu.md): lists the runtime's devices, then
 * trains guide_model.h's spiral model with the session's nodes on the first GPU when there
 * is one (on the CPU otherwise), with bf16 mixed precision and TF32 allowed, and reads a
 * trained weight back to the host. Exits 1 unless it learned (accuracy >= 0.9).
 * Build: cc guide_gpu.c $(pkg-config --cflags --libs weft) -lm -o guide_gpu */
#include "guide_model.h"

#include <weft/weft.h>

#include <stdio.h>

int main(void)
{
    wf_runtime *rt;
    if (wf_runtime_create(&rt, NULL) < 0) {
        fprintf(stderr, "%s\n", wf_last_errmsg());
        return 1;
    }
    /* Device 0 is the CPU; GPU k is device 1 + k. No GPU (or no CUDA in this build): 0. */
    int gpus = wf_device_count_kind(rt, WF_DEVICE_CUDA);
    for (int id = 0; id < wf_device_count(rt); id++) {
        wf_device_info info;
        if (wf_device_get_info(rt, id, &info) == 0)
            printf("device %d: %s, %.1f GiB\n", id, info.name, info.memory_bytes / 1073741824.0);
    }

    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(-1, 2));
    wf_node *y = wf_placeholder(g, "y", WF_I32, WF_SHAPE(-1));
    wf_node *logits = spiral_model(g, x);
    wf_node *loss = wf_mean(g, wf_softmax_cross_entropy(g, logits, y));
    wf_node *acc = accuracy(g, logits, y);
    wf_node *train = wf_minimize(g, wf_adam(0.02), loss);
    /* One node by hand (the accuracy's mean on device 0, the CPU); the session places the rest:
     * .device = 1 puts every node whose op has a CUDA kernel on GPU 0, -1 keeps all on the
     * CPU, 0 (the default) lets the rule choose. */
    if (wf_node_set_device(acc, 0) < 0) {
        fprintf(stderr, "%s\n", wf_last_errmsg());
        return 1;
    }
    wf_session_opts so = {
        .device = gpus > 0 ? 1 : -1,
        .flags = WF_SESSION_MIXED_BF16 | WF_SESSION_TF32, /* bf16 products, f32 weights */
    };
    wf_session *s = NULL;
    if (wf_graph_status(g) < 0 || wf_session_create(g, &so, &s) < 0) {
        fprintf(stderr, "%s\n", wf_graph_errmsg(g));
        return 1;
    }
    printf("training on %s\n", gpus > 0 ? "device 1 (the first GPU)" : "the CPU (no GPU)");

    float xs[N * 2];
    int32_t ys[N];
    spiral_data(xs, ys);
    wf_tensor *xt = wf_tensor_from(WF_F32, WF_SHAPE(N, 2), xs);
    wf_tensor *yt = wf_tensor_from(WF_I32, WF_SHAPE(N), ys);
    wf_feed feeds[] = { { x, xt }, { y, yt } };
    int rc = 0;
    for (int step = 0; step < 200 && rc == 0; step++)
        rc = wf_session_run(s, feeds, 2, NULL, 0, NULL, &train, 1);
    wf_tensor *a = NULL, *w = NULL;
    if (rc == 0)
        rc = wf_session_run(s, feeds, 2, &acc, 1, &a, NULL, 0);
    /* Variables trained on a GPU stay there between steps; reading one copies it back. */
    if (rc == 0)
        rc = wf_session_variable(s, wf_graph_find(g, "l2.b"), &w);
    if (rc < 0) {
        fprintf(stderr, "%s: %s\n", wf_strerror(rc), wf_session_errmsg(s));
        return 1;
    }
    wf_plan_stats st;
    if (wf_session_plan_stats(s, NULL, 0, &train, 1, &st) == 0) /* the training step's plan */
        printf("products in bf16: %d, matmuls allowed TF32: %d\n", st.n_mixed, st.n_tf32);
    double av = wf_tensor_get(a, 0);
    printf("accuracy %.3f; l2.b = [%.3f, %.3f, %.3f]\n", av, wf_tensor_get(w, 0),
           wf_tensor_get(w, 1), wf_tensor_get(w, 2));
    wf_tensor_release(a);
    wf_tensor_release(w);
    wf_tensor_release(xt);
    wf_tensor_release(yt);
    wf_session_destroy(s);
    wf_graph_destroy(g);
    wf_runtime_destroy(rt);
    return av >= 0.9 ? 0 : 1;
}
