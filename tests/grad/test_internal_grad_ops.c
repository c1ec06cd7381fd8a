/* tests/grad/test_internal_grad_ops.c: the randomized gradient checker draws every
 * differentiable op of the registry: each op of wf__ops_table with a gradient function is in
 * its list (tests/grad/grad_random_ops.h) or among the internal ones only gradients make, and
 * every name of the list is such an op. Links libweft.a (the table and grad/'s lookup are
 * hidden in libweft.so). Also: the mark wf_gradients() puts on a variable's gradient. */
#include "../../grad/internal.h"
#include "../../ops/table.h"
#include "grad_random_ops.h"
#include "wf_test.h"

#include <weft/weft.h>

#include <criterion/criterion.h>

#include <string.h>

#define LEN(a) (sizeof(a) / sizeof((a)[0]))

static bool listed(const char *const *list, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(list[i], name))
            return true;
    return false;
}

Test(grad_internal_ops, the_random_checker_draws_every_differentiable_op_of_the_registry)
{
    int differentiable = 0;
    for (size_t i = 0; i < wf__ops_table_len; i++) {
        const wf_op_def *op = wf__ops_table[i];
        if (!wf__grad_find(op))
            continue;
        differentiable++;
        cr_assert(listed(gr_ops, LEN(gr_ops), op->name) ||
                      listed(gr_internal_ops, LEN(gr_internal_ops), op->name),
                  "op '%s' has a gradient but the random checker does not draw it", op->name);
    }
    cr_assert_eq((size_t)differentiable, LEN(gr_ops) + LEN(gr_internal_ops));
    for (size_t i = 0; i < LEN(gr_ops); i++) {
        const wf_op_def *op = wf__ops_find(gr_ops[i]);
        cr_assert(op && wf__grad_find(op), "'%s' is not a differentiable op", gr_ops[i]);
    }
}

/* y = sum(w + 2 v): the add passes one dy to w and to the mul, whose backward reads it.
 * The gradient wf_gradients() returns for each variable is marked (node.is_gradient, where
 * the data-parallel rewrite reduces) and is a node nothing else reads, so the mark never
 * covers the rest of the backward; its values are unchanged (dy times one). */
Test(grad_internal_ops, a_variables_gradient_is_marked_and_read_by_nothing_of_the_backward)
{
    wf_runtime *rt = NULL;
    cr_assert_eq(wf_runtime_create(&rt, &(wf_runtime_opts){ .n_workers = 1 }), 0);
    wf_graph *g = wf_graph_create(rt, WF_EAGER);
    wf_node *w = wf_variable(g, "w", WF_F32, WF_SHAPE(3), wf_init_ones());
    wf_node *v = wf_variable(g, "v", WF_F32, WF_SHAPE(3), wf_init_ones());
    wf_node *y = wf_sum(g, wf_add(g, w, wf_mul(g, v, wf_scalar(g, WF_F32, 2.0))));
    wf_node *xs[2] = { w, v }, *gr[2];
    cr_assert_eq(wf_gradients(g, y, xs, 2, gr), 0, "%s", wf_graph_errmsg(g));
    for (int k = 0; k < 2; k++) {
        cr_assert(gr[k]->is_gradient, "the gradient of %s is not marked", k ? "v" : "w");
        for (int id = 0; id < wf_graph_node_count(g); id++) {
            const wf_node *n = wf_graph_node(g, id);
            for (int j = 0; j < n->n_inputs; j++)
                cr_assert_neq(n->inputs[j], gr[k], "node %d (%s) reads the gradient of %s", id,
                              n->op->name, k ? "v" : "w");
        }
        for (int i = 0; i < 3; i++)
            cr_assert_eq(wf_tensor_get(wf_node_value(gr[k]), i), k ? 2.0 : 1.0);
    }
    int marked = 0;
    for (int id = 0; id < wf_graph_node_count(g); id++)
        marked += wf_graph_node(g, id)->is_gradient;
    cr_assert_eq(marked, 2, "%d nodes marked, not the 2 gradients", marked);
    wf_graph_destroy(g);
    wf_runtime_destroy(rt);
}
