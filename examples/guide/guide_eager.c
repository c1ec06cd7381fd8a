/* guide_eager.c: eager execution (docs/guide.md, "Eager execution and gradients"): every
 * node runs as it is added, gradients have values at once, a mistake is reported at its
 * line, and a training loop takes one optimizer step per wf_minimize() call.
 * Build: cc guide_eager.c $(pkg-config --cflags --libs weft) -o guide_eager */
#include <weft/weft.h>

#include <math.h>
#include <stdio.h>

int main(void)
{
    wf_runtime *rt;
    if (wf_runtime_create(&rt, NULL) < 0) {
        fprintf(stderr, "%s\n", wf_last_errmsg());
        return 1;
    }
    wf_graph *g = wf_graph_create(rt, WF_EAGER);

    /* Values at once, as in PyTorch: a constant, a variable, and an expression of both. */
    const float a[] = { 1, 2, 3 };
    wf_tensor *at = wf_tensor_from(WF_F32, WF_SHAPE(3), a);
    wf_node *x = wf_constant(g, at); /* the graph retains the tensor */
    wf_node *w = wf_variable(g, "w", WF_F32, WF_SHAPE(3), wf_init_constant(0.5));
    wf_node *y = wf_sum(g, wf_mul(g, wf_square(g, x), w)); /* sum(x^2 w) = 7 */
    printf("y = %g\n", wf_tensor_get(wf_node_value(y), 0));

    /* Gradients: dy/dw = x^2 and dy/dx = 2 x w, computed now (the graph is the tape). */
    wf_node *xs[] = { w, x }, *grads[2];
    if (wf_gradients(g, y, xs, 2, grads) < 0) {
        fprintf(stderr, "%s\n", wf_graph_errmsg(g));
        return 1;
    }
    for (int i = 0; i < 3; i++)
        printf("dy/dw[%d] = %g, dy/dx[%d] = %g\n", i, wf_tensor_get(wf_node_value(grads[0]), i), i,
               wf_tensor_get(wf_node_value(grads[1]), i));

    /* A mistake: [3] and [2] do not broadcast. The node is NULL, the graph keeps the error
     * (with this file and line), and building goes on once it is cleared. */
    const float b[] = { 1, 2 };
    wf_tensor *bt = wf_tensor_from(WF_F32, WF_SHAPE(2), b);
    wf_node *bad = wf_add(g, x, wf_constant(g, bt));
    if (!bad)
        printf("error: %s\n", wf_graph_errmsg(g));
    wf_graph_clear_error(g);

    /* Training: fit v to minimise sum((v - 3)^2) with SGD; each wf_minimize() call adds the
     * step's nodes and runs them. (A long loop builds a graph per step instead and carries
     * the variables over with wf_variable_set(), as weft-train --eager does.) */
    wf_node *v = wf_variable(g, "v", WF_F64, WF_SCALAR, wf_init_zeros());
    for (int step = 0; step < 50; step++) {
        wf_node *loss = wf_square(g, wf_sub(g, v, wf_scalar(g, WF_F64, 3.0)));
        if (!wf_minimize(g, wf_sgd(0.1), loss)) {
            fprintf(stderr, "%s\n", wf_graph_errmsg(g));
            return 1;
        }
    }
    double vv = wf_tensor_get(wf_node_value(v), 0);
    printf("v after 50 SGD steps: %.6f (the minimum is 3)\n", vv);

    wf_tensor_release(at);
    wf_tensor_release(bt);
    wf_graph_destroy(g);
    wf_runtime_destroy(rt);
    return fabs(vv - 3.0) < 1e-3 ? 0 : 1;
}
