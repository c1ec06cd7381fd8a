/* tests/core/test_internal_graph.c: the module interface core gives ops/ and runtime/
 * (core/graph.h, core/op.h), with small test ops defined here: wf__node_add (inference,
 * automatic names, arity, NULL and foreign inputs, the message format with shapes and
 * file:line), attribute copies, many inputs, control edges, eager execution through the CPU
 * kernel and through a hook, re-inference with concrete shapes, lookup by name, and dumps.
 * Internal: links the static library, where the wf__ symbols are visible. */
#include "../../core/error.h"
#include "../../core/graph.h"
#include "../../core/op.h"
#include "../../core/tensor.h"
#include "wf_test.h"

#include <weft/weft.h>

#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static wf_runtime *rt;

static void setup(void)
{
    rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 1, .flags = WF_RT_NO_PIN });
}

static void teardown(void)
{
    wf_runtime_destroy(rt);
    rt = NULL;
    wf_test_fini();
}

TestSuite(core_internal_graph, .init = setup, .fini = teardown, .timeout = WF_TEST_TIMEOUT(30));

/* ---- Test ops --------------------------------------------------------------------------- */

static int infer_tadd(wf_node *n, char *err, size_t errlen)
{
    wf_node *a = n->inputs[0], *b = n->inputs[1];
    if (a->dtype != b->dtype) {
        snprintf(err, errlen, "a is %s but b is %s", wf_dtype_name(a->dtype),
                 wf_dtype_name(b->dtype));
        return WF_EDTYPE;
    }
    if (wf_shape_broadcast(a->shape, b->shape, &n->shape) < 0) {
        snprintf(err, errlen, "%s", wf_last_errmsg());
        return WF_ESHAPE;
    }
    n->dtype = a->dtype;
    return 0;
}

/* f32, same shapes or b a scalar; 'out' comes allocated. */
static int kernel_tadd(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                       wf_tensor **out)
{
    cr_assert_not_null(ctx->rt, "the eager kernel gets the graph's runtime");
    wf_tensor *o = *out;
    cr_assert_not_null(o, "the caller allocates the output");
    cr_assert_eq(o->dtype, n->dtype);
    cr_assert(wf_shape_equal(o->shape, n->shape));
    float *d = (float *)o->data;
    for (int64_t i = 0; i < o->numel; i++)
        d[i] = (float)(wf_tensor_get(in[0], i) + wf_tensor_get(in[1], in[1]->numel == 1 ? 0 : i));
    return 0;
}

static const wf_op_def op_tadd = {
    .name = "tadd",
    .min_inputs = 2,
    .max_inputs = 2,
    .infer = infer_tadd,
    .kernel = { [WF_KERNEL_CPU] = kernel_tadd },
    .flags = WF_OP_ELEMENTWISE,
};

static const wf_op_def op_tadd_nokernel = {
    .name = "tadd_nokernel",
    .min_inputs = 2,
    .max_inputs = 2,
    .infer = infer_tadd,
};

/* A "dynamic shape" op: nonzero-like, output [k] where k is known only from the data. */
static int infer_dyn(wf_node *n, char *err, size_t errlen)
{
    n->dtype = WF_F32;
    n->shape = WF_SHAPE(-1);
    return 0;
}

static int kernel_dyn(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                      wf_tensor **out)
{
    cr_assert_null(*out, "dynamic-shape kernels allocate their output");
    int64_t k = 0;
    for (int64_t i = 0; i < in[0]->numel; i++)
        k += wf_tensor_get(in[0], i) != 0;
    *out = wf__tensor_alloc(WF_F32, WF_SHAPE(k));
    return *out ? 0 : WF_ENOMEM;
}

static const wf_op_def op_dyn = {
    .name = "tnonzero",
    .min_inputs = 1,
    .max_inputs = 1,
    .infer = infer_dyn,
    .kernel = { [WF_KERNEL_CPU] = kernel_dyn },
    .flags = WF_OP_DYNAMIC_SHAPE,
};

static int kernel_wrong_shape(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                              wf_tensor **out)
{
    *out = wf__tensor_alloc(WF_F32, WF_SHAPE(1, 1, 1));
    return *out ? 0 : WF_ENOMEM;
}

static const wf_op_def op_tadd_wrong = {
    .name = "tadd_wrong",
    .min_inputs = 2,
    .max_inputs = 2,
    .infer = infer_tadd,
    .kernel = { [WF_KERNEL_CPU] = kernel_wrong_shape },
    .flags = WF_OP_DYNAMIC_SHAPE, /* allocates its own output, and gets it wrong */
};

static int kernel_fails(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                        wf_tensor **out)
{
    return wf__err(WF_EDTYPE, "tfail: i32 is not supported");
}

static const wf_op_def op_fail = {
    .name = "tfail",
    .min_inputs = 2,
    .max_inputs = 2,
    .infer = infer_tadd,
    .kernel = { [WF_KERNEL_CPU] = kernel_fails },
};

static int infer_tmatmul(wf_node *n, char *err, size_t errlen)
{
    wf_shape a = n->inputs[0]->shape, b = n->inputs[1]->shape;
    if (a.rank != 2 || b.rank != 2) {
        snprintf(err, errlen, "a has rank %d and b rank %d; both must be 2", a.rank, b.rank);
        return WF_ESHAPE;
    }
    int64_t k1 = n->attrs->transpose_a ? a.dims[0] : a.dims[1];
    int64_t k2 = n->attrs->transpose_b ? b.dims[1] : b.dims[0];
    if (k1 != k2 && k1 != -1 && k2 != -1) {
        char sa[64], sb[64];
        snprintf(err, errlen, "a is %s but b is %s", wf_shape_str(a, sa, sizeof sa),
                 wf_shape_str(b, sb, sizeof sb));
        return WF_ESHAPE;
    }
    n->dtype = n->inputs[0]->dtype;
    n->shape = WF_SHAPE(n->attrs->transpose_a ? a.dims[1] : a.dims[0],
                        n->attrs->transpose_b ? b.dims[0] : b.dims[1]);
    return 0;
}

static const wf_op_def op_tmatmul = {
    .name = "tmatmul",
    .min_inputs = 2,
    .max_inputs = 2,
    .infer = infer_tmatmul,
};

static int infer_first(wf_node *n, char *err, size_t errlen)
{
    n->dtype = n->inputs[0]->dtype;
    n->shape = n->inputs[0]->shape;
    return 0;
}

static const wf_op_def op_tsum_n = {
    .name = "tsum_n",
    .min_inputs = 1,
    .max_inputs = -1,
    .infer = infer_first,
};

static wf_graph *new_graph(int mode)
{
    wf_graph *g = wf_graph_create(rt, mode);
    cr_assert_not_null(g, "%s", wf_last_errmsg());
    return g;
}

static wf_node *add2(wf_graph *g, const wf_op_def *op, wf_node *a, wf_node *b)
{
    wf_node *in[2] = { a, b };
    return wf__node_add(g, op, in, 2, NULL);
}

/* ---- wf__node_add ------------------------------------------------------------------------ */

Test(core_internal_graph, node_add_infers_and_names_and_initialises_slots)
{
    wf_graph *g = new_graph(WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(-1, 4));
    wf_node *b = wf_variable(g, "b", WF_F32, WF_SHAPE(4), wf_init_zeros());
    wf_node *y = add2(g, &op_tadd, x, b);
    cr_assert_not_null(y, "%s", wf_graph_errmsg(g));
    cr_assert_str_eq(wf_node_name(y), "tadd_2");
    cr_assert_eq(y->op, &op_tadd);
    cr_assert_eq(y->dtype, WF_F32);
    cr_assert(wf_shape_equal(y->shape, WF_SHAPE(-1, 4)), "-1 flows through inference");
    cr_assert_eq(wf_node_input_count(y), 2);
    cr_assert_eq(wf_node_input(y, 0), x);
    cr_assert_eq(wf_node_input(y, 1), b);
    cr_assert_null(wf_node_input(y, 2));
    cr_assert_eq(y->id, 2);
    cr_assert_eq(y->device, -1);
    cr_assert_eq(y->rt_index, -1);
    cr_assert_null(y->rt_data);
    cr_assert_null(y->value);
    cr_assert_not_null(y->attrs, "attrs is never NULL");
    cr_assert_eq(y->attrs->transpose_a, false);
    cr_assert_eq(y->n_control, 0);
    cr_assert_str_eq(wf_node_op(b), "variable");
    cr_assert_eq(b->op, &wf_op_variable);
    cr_assert_eq(b->attrs->init.kind, WF_INIT_ZEROS);
    wf_graph_destroy(g);
}

Test(core_internal_graph, shape_error_names_op_node_location_and_both_shapes)
{
    wf_graph *g = new_graph(WF_STATIC);
    wf_node *a = wf_placeholder(g, "a", WF_F32, WF_SHAPE(3, 4));
    wf_node *b = wf_placeholder(g, "b", WF_F32, WF_SHAPE(5, 2));
    wf_set_source_location("/src/model.c", 42);
    wf_node *in[2] = { a, b };
    wf_node *y = wf__node_add_ex(g, &op_tmatmul, "logits", in, 2, NULL, wf__srcloc_take());
    cr_assert_null(y);
    cr_assert_eq(wf_graph_status(g), WF_ESHAPE);
    cr_assert_str_eq(wf_graph_errmsg(g),
                     "tmatmul 'logits' (model.c:42): a is [3, 4] but b is [5, 2]");
    cr_assert_str_eq(wf_last_errmsg(), wf_graph_errmsg(g), "the thread's message too");
    cr_assert_null(wf_graph_find(g, "logits"), "nothing is left of the failed node");
    cr_assert_eq(wf_graph_node_count(g), 2);
    /* The same op with transpose_b accepts [3, 4] x [2, 4]^T... and attrs are read. */
    wf_graph_clear_error(g);
    wf_node *c = wf_placeholder(g, "c", WF_F32, WF_SHAPE(2, 4));
    wf_attrs at = { .transpose_b = true };
    wf_node *in2[2] = { a, c };
    wf_node *z = wf__node_add(g, &op_tmatmul, in2, 2, &at);
    cr_assert_not_null(z, "%s", wf_graph_errmsg(g));
    cr_assert(wf_shape_equal(z->shape, WF_SHAPE(3, 2)));
    wf_graph_destroy(g);
}

Test(core_internal_graph, error_without_location_omits_it)
{
    wf_graph *g = new_graph(WF_STATIC);
    wf_node *a = (wf_placeholder)(g, "a", WF_F32, WF_SHAPE(3));
    wf_node *b = (wf_placeholder)(g, "b", WF_I32, WF_SHAPE(3));
    cr_assert_null(add2(g, &op_tadd, a, b));
    cr_assert_eq(wf_graph_status(g), WF_EDTYPE);
    cr_assert_str_eq(wf_graph_errmsg(g), "tadd 'tadd_2': a is f32 but b is i32");
    wf_graph_destroy(g);
}

Test(core_internal_graph, macro_location_reaches_nodes_added_by_constructors)
{
    wf_graph *g = new_graph(WF_STATIC);
    wf_node *a = wf_placeholder(g, "a", WF_F32, WF_SHAPE(3));
    WF__HERE();
    wf_node *y = add2(g, &op_tadd, a, a);
    const int line = __LINE__ - 2;
    cr_assert_eq(wf_node_line(y), line);
    cr_assert_str_eq(wf_node_file(y), __FILE__);
    wf_node *z = add2(g, &op_tadd, a, a);
    cr_assert_eq(wf_node_line(z), 0, "consumed by the first node");
    wf_graph_destroy(g);
}

/* A constructor macro as ops/ will write them. */
#define tadd(g, a, b) (WF__HERE(), add2(g, &op_tadd, a, b))

Test(core_internal_graph, nested_constructor_macros_each_get_their_location)
{
    wf_graph *g = new_graph(WF_STATIC);
    wf_node *a = (wf_placeholder)(g, "a", WF_F32, WF_SHAPE(3));
    wf_node *y = tadd(g, tadd(g, a, tadd(g, a, a)), a);
    const int line = __LINE__ - 1;
    wf_node *z = tadd(g, a, tadd(g, a, a));
    const int line_z = __LINE__ - 1;
    cr_assert_not_null(y);
    cr_assert_eq(wf_graph_node_count(g), 6);
    for (int i = 1; i <= 3; i++)
        cr_assert_eq(wf_node_line(wf_graph_node(g, i)), line, "node %d", i);
    cr_assert_eq(wf_node_line(wf_graph_node(g, 4)), line_z, "the inner node is made first");
    cr_assert_eq(wf_node_line(z), line_z);
    cr_assert_eq(wf_node_input(z, 1), wf_graph_node(g, 4));
    wf_node *w = add2(g, &op_tadd, a, a);
    cr_assert_eq(wf_node_line(w), 0, "nothing is left pending");
    wf_graph_destroy(g);
}

Test(core_internal_graph, absurd_nesting_loses_only_the_deepest_locations)
{
    wf_graph *g = new_graph(WF_STATIC);
    for (int i = 0; i < 20; i++)
        wf_set_source_location("deep.c", i + 1);
    for (int i = 0; i < 4; i++) /* the 4 deepest are beyond the 16 kept */
        cr_assert_null(wf__srcloc_take().file);
    for (int i = 16; i >= 1; i--) {
        wf_srcloc l = wf__srcloc_take();
        cr_assert_eq(l.line, i);
    }
    cr_assert_null(wf__srcloc_take().file, "empty again");
    wf_graph_destroy(g);
}

Test(core_internal_graph, null_input_keeps_the_first_error)
{
    wf_graph *g = new_graph(WF_STATIC);
    wf_node *a = wf_placeholder(g, "a", WF_F32, WF_SHAPE(3));
    wf_node *bad = wf_placeholder(g, "bad", WF_F32, WF_SHAPE(-4));
    cr_assert_null(bad);
    char first[512];
    snprintf(first, sizeof first, "%s", wf_graph_errmsg(g));
    cr_assert_null(add2(g, &op_tadd, a, bad));
    cr_assert_null(add2(g, &op_tadd, bad, a));
    cr_assert_str_eq(wf_graph_errmsg(g), first, "not overwritten");
    cr_assert_eq(wf_graph_node_count(g), 1);
    /* With no earlier error, a NULL input is an error of its own. */
    wf_graph_clear_error(g);
    cr_assert_null(add2(g, &op_tadd, a, NULL));
    cr_assert_eq(wf_graph_status(g), WF_EINVAL);
    cr_assert(strstr(wf_graph_errmsg(g), "input 1 is NULL"), "%s", wf_graph_errmsg(g));
    wf_graph_destroy(g);
}

Test(core_internal_graph, input_from_another_graph_is_an_error)
{
    wf_graph *g = new_graph(WF_STATIC), *h = new_graph(WF_STATIC);
    wf_node *a = wf_placeholder(g, "a", WF_F32, WF_SHAPE(3));
    wf_node *b = wf_placeholder(h, "b", WF_F32, WF_SHAPE(3));
    cr_assert_null(add2(g, &op_tadd, a, b));
    cr_assert_eq(wf_graph_status(g), WF_EINVAL);
    cr_assert(strstr(wf_graph_errmsg(g), "input 1 ('b') belongs to another graph"), "%s",
              wf_graph_errmsg(g));
    cr_assert_eq(wf_graph_status(h), 0, "the other graph is not touched");
    cr_assert_eq(wf__node_add_control(a, b), WF_EINVAL);
    wf_graph_destroy(g);
    wf_graph_destroy(h);
}

Test(core_internal_graph, wrong_arity_and_bad_op_are_errors)
{
    wf_graph *g = new_graph(WF_STATIC);
    wf_node *a = wf_placeholder(g, "a", WF_F32, WF_SHAPE(3));
    wf_node *in[3] = { a, a, a };
    cr_assert_null(wf__node_add(g, &op_tadd, in, 3, NULL));
    cr_assert(strstr(wf_graph_errmsg(g), "takes 2 inputs, not 3"), "%s", wf_graph_errmsg(g));
    wf_graph_clear_error(g);
    cr_assert_null(wf__node_add(g, &op_tsum_n, in, 0, NULL));
    cr_assert(strstr(wf_graph_errmsg(g), "at least 1"), "%s", wf_graph_errmsg(g));
    wf_graph_clear_error(g);
    cr_assert_null(wf__node_add(g, &op_tadd, NULL, 2, NULL));
    cr_assert_eq(wf_graph_status(g), WF_EINVAL);
    wf_graph_clear_error(g);
    cr_assert_null(wf__node_add(g, NULL, in, 2, NULL));
    cr_assert_eq(wf_graph_status(g), WF_EINVAL);
    wf_graph_clear_error(g);
    cr_assert_null(wf__node_add(NULL, &op_tadd, in, 2, NULL));
    cr_assert(strstr(wf_last_errmsg(), "graph is NULL"), "%s", wf_last_errmsg());
    cr_assert_null(wf__node_add_ex(g, &op_tadd, "", in, 2, NULL, (wf_srcloc){ 0 }));
    cr_assert(strstr(wf_graph_errmsg(g), "empty"), "%s", wf_graph_errmsg(g));
    cr_assert_eq(wf_graph_node_count(g), 1);
    wf_graph_destroy(g);
}

Test(core_internal_graph, many_inputs_are_kept_beyond_the_inline_ones)
{
    wf_graph *g = new_graph(WF_STATIC);
    wf_node *in[20];
    for (int i = 0; i < 20; i++)
        in[i] = wf_placeholder(g, NULL, WF_F32, WF_SHAPE(2));
    wf_node *s = wf__node_add(g, &op_tsum_n, in, 20, NULL);
    cr_assert_not_null(s, "%s", wf_graph_errmsg(g));
    in[5] = NULL; /* the caller's array is not kept */
    cr_assert_eq(wf_node_input_count(s), 20);
    for (int i = 0; i < 20; i++)
        cr_assert_eq(wf_node_input(s, i), wf_graph_node(g, i));
    wf_graph_destroy(g);
}

Test(core_internal_graph, attrs_are_copied)
{
    wf_graph *g = new_graph(WF_STATIC);
    wf_node *a = wf_placeholder(g, "a", WF_F32, WF_SHAPE(3));
    wf_attrs at = { .n_axes = 2, .axes = { 0, 1 }, .alpha = 0.2, .seed = 7 };
    wf_node *in[1] = { a };
    wf_node *s = wf__node_add(g, &op_tsum_n, in, 1, &at);
    at.alpha = 9;
    at.axes[0] = 5;
    cr_assert_neq(s->attrs, &at);
    cr_assert_eq(s->attrs->alpha, 0.2);
    cr_assert_eq(s->attrs->axes[0], 0);
    cr_assert_eq(s->attrs->n_axes, 2);
    cr_assert_eq(s->attrs->seed, 7);
    wf_graph_destroy(g);
}

Test(core_internal_graph, control_edges_are_ordered_and_deduplicated)
{
    wf_graph *g = new_graph(WF_STATIC);
    wf_node *n[12];
    for (int i = 0; i < 12; i++)
        n[i] = wf_placeholder(g, NULL, WF_F32, WF_SHAPE(2));
    for (int i = 0; i < 11; i++)
        cr_assert_eq(wf__node_add_control(n[11], n[i]), 0, "%s", wf_graph_errmsg(g));
    cr_assert_eq(wf__node_add_control(n[11], n[3]), 0);
    cr_assert_eq(n[11]->n_control, 11, "a repeated edge is added once");
    for (int i = 0; i < 11; i++)
        cr_assert_eq(n[11]->control[i], n[i]);
    cr_assert_eq(wf__node_add_control(n[2], n[5]), WF_EINVAL, "edges point backwards only");
    cr_assert(strstr(wf_graph_errmsg(g), "not created before"), "%s", wf_graph_errmsg(g));
    cr_assert_eq(wf__node_add_control(n[2], n[2]), WF_EINVAL);
    cr_assert_eq(wf__node_add_control(NULL, n[2]), WF_EINVAL);
    cr_assert_eq(wf__node_add_control(n[2], NULL), WF_EINVAL);
    wf_graph_destroy(g);
}

Test(core_internal_graph, graph_and_node_fail_keep_the_first_error)
{
    wf_graph *g = new_graph(WF_STATIC);
    wf_node *a = wf_placeholder(g, "a", WF_F32, WF_SHAPE(3));
    const int line = __LINE__ - 1;
    cr_assert_eq(wf__node_fail(a, WF_ESHAPE, "axis %d is out of range", 5), WF_ESHAPE);
    char want[128];
    snprintf(want, sizeof want,
             "placeholder 'a' (test_internal_graph.c:%d): axis 5 is out of range", line);
    cr_assert_str_eq(wf_graph_errmsg(g), want);
    cr_assert_eq(wf__graph_fail(g, WF_EINVAL, "later"), WF_EINVAL);
    cr_assert_eq(wf_graph_status(g), WF_ESHAPE);
    cr_assert_str_eq(wf_last_errmsg(), "later");
    WF__HERE();
    cr_assert_eq(wf__graph_fail(g, WF_EINVAL, "forgets the pending location"), WF_EINVAL);
    wf_node *b = (wf_placeholder)(g, "b", WF_F32, WF_SHAPE(3));
    cr_assert_eq(wf_node_line(b), 0);
    wf_graph_destroy(g);
}

/* ---- Eager execution ------------------------------------------------------------------- */

Test(core_internal_graph, eager_node_runs_its_cpu_kernel_at_once)
{
    wf_graph *g = new_graph(WF_EAGER);
    float xs[3] = { 1, 2, 3 };
    wf_tensor *t = wf_tensor_from(WF_F32, WF_SHAPE(3), xs);
    wf_node *x = wf_constant(g, t);
    wf_tensor_release(t);
    wf_node *y = add2(g, &op_tadd, x, wf_scalar(g, WF_F32, 10));
    cr_assert_not_null(y, "%s", wf_graph_errmsg(g));
    wf_tensor *v = wf_node_value(y);
    cr_assert_not_null(v);
    cr_assert_eq(wf_tensor_data_f32(v)[0], 11.0f);
    cr_assert_eq(wf_tensor_data_f32(v)[2], 13.0f);
    wf_node *z = add2(g, &op_tadd, y, y);
    cr_assert_eq(wf_tensor_data_f32(wf_node_value(z))[1], 24.0f);
    wf_graph_destroy(g);
}

Test(core_internal_graph, eager_node_without_kernel_is_an_error_and_not_added)
{
    wf_graph *g = new_graph(WF_EAGER);
    wf_node *s = wf_scalar(g, WF_F32, 1);
    cr_assert_null(add2(g, &op_tadd_nokernel, s, s));
    cr_assert_eq(wf_graph_status(g), WF_ENOSYS);
    cr_assert(strstr(wf_graph_errmsg(g), "no CPU kernel"), "%s", wf_graph_errmsg(g));
    cr_assert_eq(wf_graph_node_count(g), 1);
    wf_graph_clear_error(g);
    cr_assert_null(add2(g, &op_tadd_wrong, s, s));
    cr_assert(strstr(wf_graph_errmsg(g), "inference said"), "%s", wf_graph_errmsg(g));
    cr_assert_eq(wf_graph_node_count(g), 1);
    wf_graph_destroy(g);
}

Test(core_internal_graph, eager_kernel_error_names_the_node_and_leaks_nothing)
{
    wf_graph *g = new_graph(WF_EAGER);
    wf_node *s = wf_scalar(g, WF_F32, 1);
    wf_set_source_location("/x/train.c", 9);
    cr_assert_null(add2(g, &op_fail, s, s));
    cr_assert_eq(wf_graph_status(g), WF_EDTYPE);
    cr_assert_str_eq(wf_graph_errmsg(g),
                     "tfail 'tfail_1' (train.c:9): tfail: i32 is not supported");
    cr_assert_eq(wf_graph_node_count(g), 1);
    wf_graph_destroy(g); /* ASan: the preallocated output was released */
}

Test(core_internal_graph, eager_dynamic_shape_node_takes_the_kernels_shape)
{
    wf_graph *g = new_graph(WF_EAGER);
    float xs[5] = { 0, 3, 0, 1, 2 };
    wf_tensor *t = wf_tensor_from(WF_F32, WF_SHAPE(5), xs);
    wf_node *x = wf_constant(g, t);
    wf_tensor_release(t);
    wf_node *in[1] = { x };
    wf_node *y = wf__node_add(g, &op_dyn, in, 1, NULL);
    cr_assert_not_null(y, "%s", wf_graph_errmsg(g));
    cr_assert(wf_shape_equal(wf_node_shape(y), WF_SHAPE(3)));
    cr_assert(wf_shape_equal(wf_tensor_shape(wf_node_value(y)), WF_SHAPE(3)));
    wf_graph_destroy(g);
}

static int hook_calls;

static int hook(void *ctx, wf_node *n)
{
    hook_calls++;
    cr_assert_eq(ctx, &hook_calls);
    n->value = wf__tensor_alloc(n->dtype, n->shape);
    memset(n->value->data, 0, (size_t)n->value->numel * wf_dtype_size(n->dtype));
    return 0;
}

Test(core_internal_graph, eager_hook_replaces_the_default)
{
    wf_graph *g = new_graph(WF_EAGER);
    hook_calls = 0;
    wf__graph_set_eager(g, hook, &hook_calls);
    wf_node *s = wf_scalar(g, WF_F32, 1);
    wf_node *y = add2(g, &op_tadd_nokernel, s, s);
    cr_assert_not_null(y, "%s", wf_graph_errmsg(g));
    cr_assert_eq(hook_calls, 1, "sources do not go through the hook");
    cr_assert_eq(wf_tensor_get(wf_node_value(y), 0), 0.0);
    wf_graph_destroy(g);
}

/* ---- The registry ---------------------------------------------------------------------- */

Test(core_internal_graph, op_find_searches_builtins_then_the_table)
{
    static const wf_op_def *const table[] = { &op_tadd, NULL, &op_tmatmul };
    cr_assert_eq(wf__op_find(NULL, 0, "placeholder"), &wf_op_placeholder);
    cr_assert_eq(wf__op_find(NULL, 0, "constant"), &wf_op_constant);
    cr_assert_eq(wf__op_find(table, 3, "variable"), &wf_op_variable);
    cr_assert_eq(wf__op_find(table, 3, "tmatmul"), &op_tmatmul);
    cr_assert_eq(wf__op_find(table, 3, "tadd"), &op_tadd);
    cr_assert_null(wf__op_find(table, 3, "nope"));
    cr_assert_null(wf__op_find(table, 3, NULL));
    cr_assert_null(wf__op_find(table, 1, "tmatmul"), "only 'count' entries are searched");
}

Test(core_internal_graph, op_check_table_finds_duplicates_and_bad_entries)
{
    const wf_op_def *ok[] = { &op_tadd, &op_tmatmul, &op_tsum_n };
    cr_assert_eq(wf__op_check_table(ok, 3), 0, "%s", wf_last_errmsg());
    const wf_op_def *dup[] = { &op_tadd, &op_tmatmul, &op_tadd };
    cr_assert_eq(wf__op_check_table(dup, 3), WF_EINVAL);
    static const wf_op_def shadow = { .name = "constant", .infer = infer_first };
    const wf_op_def *sh[] = { &shadow };
    cr_assert_eq(wf__op_check_table(sh, 1), WF_EINVAL);
    cr_assert(strstr(wf_last_errmsg(), "core op"), "%s", wf_last_errmsg());
    static const wf_op_def noinfer = { .name = "x" };
    const wf_op_def *ni[] = { &noinfer };
    cr_assert_eq(wf__op_check_table(ni, 1), WF_EINVAL);
    const wf_op_def *nul[] = { NULL };
    cr_assert_eq(wf__op_check_table(nul, 1), WF_EINVAL);
    cr_assert_eq(wf__op_check_table(NULL, 2), WF_EINVAL);
}

Test(core_internal_graph, reinfer_uses_concrete_input_shapes)
{
    wf_graph *g = new_graph(WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(-1, 4));
    wf_node *w = wf_variable(g, "w", WF_F32, WF_SHAPE(4, 3), wf_init_zeros());
    wf_node *in[2] = { x, w };
    wf_node *y = wf__node_add(g, &op_tmatmul, in, 2, NULL);
    cr_assert(wf_shape_equal(y->shape, WF_SHAPE(-1, 3)));
    wf_dtype dts[2] = { WF_F32, WF_F32 }, dt;
    wf_shape shapes[2] = { WF_SHAPE(256, 4), WF_SHAPE(4, 3) }, s;
    cr_assert_eq(wf__op_infer(y, dts, shapes, &dt, &s), 0, "%s", wf_last_errmsg());
    cr_assert(wf_shape_equal(s, WF_SHAPE(256, 3)));
    cr_assert_eq(dt, WF_F32);
    cr_assert(wf_shape_equal(y->shape, WF_SHAPE(-1, 3)), "the node is not changed");
    shapes[0] = WF_SHAPE(256, 5);
    cr_assert_eq(wf__op_infer(y, dts, shapes, &dt, &s), WF_ESHAPE);
    cr_assert(strstr(wf_last_errmsg(), "[256, 5]") && strstr(wf_last_errmsg(), "'tmatmul_2'"), "%s",
              wf_last_errmsg());
    cr_assert_eq(wf__op_infer(y, NULL, shapes, &dt, &s), WF_EINVAL);
    wf_graph_destroy(g);
}

Test(core_internal_graph, reinfer_handles_many_inputs)
{
    wf_graph *g = new_graph(WF_STATIC);
    wf_node *in[9];
    wf_dtype dts[9];
    wf_shape shapes[9];
    for (int i = 0; i < 9; i++) {
        in[i] = wf_placeholder(g, NULL, WF_F64, WF_SHAPE(-1));
        dts[i] = WF_F64;
        shapes[i] = WF_SHAPE(17);
    }
    wf_node *s = wf__node_add(g, &op_tsum_n, in, 9, NULL);
    wf_dtype dt;
    wf_shape out;
    cr_assert_eq(wf__op_infer(s, dts, shapes, &dt, &out), 0, "%s", wf_last_errmsg());
    cr_assert(wf_shape_equal(out, WF_SHAPE(17)));
    wf_graph_destroy(g);
}

Test(core_internal_graph, builtin_ops_have_source_flags)
{
    cr_assert(wf_op_placeholder.flags & WF_OP_SOURCE);
    cr_assert(wf_op_constant.flags & WF_OP_SOURCE);
    cr_assert(wf_op_variable.flags & WF_OP_STATEFUL);
    cr_assert_eq(wf__op_check_table(NULL, 0), 0);
}

Test(core_internal_graph, dump_lists_nodes_inputs_and_control_edges)
{
    wf_graph *g = new_graph(WF_STATIC);
    wf_node *x = (wf_placeholder)(g, "x", WF_F32, WF_SHAPE(-1, 4));
    wf_node *b = (wf_variable)(g, "b", WF_F32, WF_SHAPE(4), wf_init_zeros());
    wf_set_source_location("/m/model.c", 42);
    wf_node *y = add2(g, &op_tadd, x, b);
    cr_assert_eq(wf__node_add_control(y, b), 0);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    cr_assert_eq(wf__graph_dump(g, f, false), 0);
    fclose(f);
    cr_assert(strstr(text, "%0 x: f32 [?, 4] = placeholder() @ ?\n"), "%s", text);
    cr_assert(strstr(text, "%2 tadd_2: f32 [?, 4] = tadd(%0 x, %1 b) after(%1 b) @ model.c:42\n"),
              "%s", text);
    free(text);
    f = open_memstream(&text, &len);
    cr_assert_eq(wf__graph_dump(g, f, true), 0);
    fclose(f);
    cr_assert(strstr(text, "n0 [label=\"x\\nplaceholder f32 [?, 4]\\n?\"];"), "%s", text);
    cr_assert(strstr(text, "digraph") && strstr(text, "n0 -> n2;") &&
                  strstr(text, "n1 -> n2 [style=dashed];"),
              "%s", text);
    free(text);
    cr_assert_eq(wf_node_set_name(x, "say \"hi\"\\"), 0);
    f = open_memstream(&text, &len);
    cr_assert_eq(wf__graph_dump(g, f, true), 0);
    fclose(f);
    cr_assert(strstr(text, "label=\"say \\\"hi\\\"\\\\\\n"), "names are escaped: %s", text);
    free(text);
    cr_assert_eq(wf__graph_dump(NULL, stdout, false), WF_EINVAL);
    wf_graph_destroy(g);
}
