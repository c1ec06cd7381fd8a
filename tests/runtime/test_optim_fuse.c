/* tests/runtime/test_optim_fuse.c: optimizer fusion (runtime/compile/pass_optim_fuse.c) through the
 * public API: the update nodes of one optimizer become multi-tensor update nodes (counted in
 * wf_session_plan_stats()), and a training step gives the same bits as with
 * WF_SESSION_NO_OPTIM_FUSE: an MLP (whose weights span more than one 64K-element tile, so a
 * tile crosses from one variable into the next) and a CNN trained with Adam, AdamW, SGD with
 * momentum and Nesterov, RMSProp and Adagrad for several steps, on 1 and on 2 workers, every
 * variable and every optimizer state compared bit for bit. The multi-tensor kernel runs the
 * per-variable loops (grad/optim_cpu.c) on each element, so bitwise equality is the check.
 * Also: one variable updated by two optimizers (two fused nodes, ordered), two optimizers
 * over different variables (a fused node each), a checkpoint
 * saved after fused steps loads into an unfused session with the same bits, a variable
 * listed twice in one optimizer (its second update stays apart, ordered after the fused
 * node), and the plan dump. */
#include "runtime_util.h"

#include <weft/weft.h>

#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

TestSuite(runtime_optim_fuse, .init = wf_test_rt_setup_both, .fini = wf_test_rt_teardown,
          .timeout = WF_TEST_TIMEOUT(240));

typedef struct model {
    wf_graph *g;
    wf_node *x, *y, *loss;
    wf_node *targets[2];
    int n_targets;
    wf_shape xs, ys;
} model;

static wf_node *linear(wf_graph *g, wf_node *h, const char *name, int in, int out, uint64_t seed)
{
    char wn[64], bn[64];
    snprintf(wn, sizeof wn, "%s.weight", name);
    snprintf(bn, sizeof bn, "%s.bias", name);
    double b = 1 / (double)in;
    wf_node *w = wf_variable(g, wn, WF_F32, WF_SHAPE(out, in), wf_init_uniform(seed, -b, b));
    wf_node *bias = wf_variable(g, bn, WF_F32, WF_SHAPE(out), wf_init_uniform(seed + 1, -b, b));
    return wf_add(g, wf_matmul_ex(g, h, w, false, true), bias);
}

/* MLP 200-320-10 (64000 + 320 + 3200 + 10 parameters: two tiles), batch 16. */
static void mlp(wf_runtime *rt, model *m)
{
    m->g = wf_graph_create(rt, WF_STATIC);
    m->xs = WF_SHAPE(16, 200);
    m->ys = WF_SHAPE(16);
    m->x = wf_placeholder(m->g, "x", WF_F32, m->xs);
    m->y = wf_placeholder(m->g, "y", WF_I32, m->ys);
    wf_node *h = wf_relu(m->g, linear(m->g, m->x, "fc1", 200, 320, 1));
    h = linear(m->g, h, "fc2", 320, 10, 3);
    m->loss = wf_mean(m->g, wf_softmax_cross_entropy(m->g, h, m->y));
}

/* conv 3x3 1->8 + bias + ReLU + max pool 2, linear 128->10; batch 4 of 1x10x10. */
static void cnn(wf_runtime *rt, model *m)
{
    wf_graph *g = m->g = wf_graph_create(rt, WF_STATIC);
    m->xs = WF_SHAPE(4, 1, 10, 10);
    m->ys = WF_SHAPE(4);
    m->x = wf_placeholder(g, "x", WF_F32, m->xs);
    m->y = wf_placeholder(g, "y", WF_I32, m->ys);
    wf_node *w =
        wf_variable(g, "conv.weight", WF_F32, WF_SHAPE(8, 1, 3, 3), wf_init_uniform(5, -0.3, 0.3));
    wf_node *b =
        wf_variable(g, "conv.bias", WF_F32, WF_SHAPE(8, 1, 1), wf_init_uniform(6, -0.3, 0.3));
    const wf_pool2d_opts pool = { .window = { 2, 2 } };
    wf_node *h = wf_max_pool2d(g, wf_relu(g, wf_add(g, wf_conv2d(g, m->x, w, NULL), b)), &pool);
    h = linear(g, wf_reshape(g, h, WF_SHAPE(4, 128)), "fc", 128, 10, 7);
    m->loss = wf_mean(g, wf_softmax_cross_entropy(g, h, m->y));
}

static void minimize(model *m, wf_optimizer opt)
{
    m->targets[0] = wf_minimize(m->g, opt, m->loss);
    m->n_targets = 1;
    cr_assert_not_null(m->targets[0], "%s", wf_graph_errmsg(m->g));
}

static wf_session *session(const model *m, uint32_t flags)
{
    return wf_test_session(m->g, flags);
}

/* Runs 'steps' training steps with batch 'k' of a fixed pseudo-random sequence. */
static void train(const model *m, wf_session *s, int steps)
{
    int64_t nx = wf_shape_numel(m->xs), ny = wf_shape_numel(m->ys);
    float *xd = malloc((size_t)nx * sizeof *xd);
    int32_t *yd = malloc((size_t)ny * sizeof *yd);
    cr_assert(xd && yd);
    uint64_t st = 7;
    for (int k = 0; k < steps; k++) {
        for (int64_t i = 0; i < nx; i++)
            xd[i] = (float)wf_test_rand_below(&st, 2001) / 1000.0f - 1.0f;
        for (int64_t i = 0; i < ny; i++)
            yd[i] = (int32_t)wf_test_rand_below(&st, 10);
        wf_tensor *tx = wf_tensor_from(WF_F32, m->xs, xd), *ty = wf_tensor_from(WF_I32, m->ys, yd);
        wf_feed f[2] = { { m->x, tx }, { m->y, ty } };
        wf_tensor *l = NULL;
        int rc = wf_session_run(s, f, 2, &m->loss, 1, &l, m->targets, m->n_targets);
        cr_assert_eq(rc, 0, "step %d: %s: %s", k, wf_err_name(rc), wf_session_errmsg(s));
        cr_assert(isfinite(wf_tensor_get(l, 0)), "step %d: loss %g", k, wf_tensor_get(l, 0));
        wf_tensor_release(l);
        wf_tensor_release(tx);
        wf_tensor_release(ty);
    }
    free(xd);
    free(yd);
}

/* Every variable of the graph (parameters, optimizer state, counters) has the same bytes in
 * 'a' and 'b'. Returns how many were compared. */
static int same_variables(const model *ma, wf_session *a, const model *mb, wf_session *b,
                          const char *what)
{
    int n = 0;
    for (int i = 0; i < wf_graph_node_count(ma->g); i++) {
        wf_node *v = wf_graph_node(ma->g, i);
        if (strcmp(wf_node_op(v), "variable") != 0)
            continue;
        wf_node *w = wf_graph_find(mb->g, wf_node_name(v));
        cr_assert_not_null(w, "%s: no variable '%s'", what, wf_node_name(v));
        wf_tensor *ta = NULL, *tb = NULL;
        cr_assert_eq(wf_session_variable(a, v, &ta), 0, "%s", wf_session_errmsg(a));
        cr_assert_eq(wf_session_variable(b, w, &tb), 0, "%s", wf_session_errmsg(b));
        size_t bytes = (size_t)wf_tensor_numel(ta) * wf_dtype_size(wf_tensor_dtype(ta));
        cr_assert_eq(wf_tensor_numel(ta), wf_tensor_numel(tb));
        cr_assert(memcmp(wf_tensor_data(ta), wf_tensor_data(tb), bytes) == 0,
                  "%s: variable '%s' differs", what, wf_node_name(v));
        wf_tensor_release(ta);
        wf_tensor_release(tb);
        n++;
    }
    return n;
}

static wf_plan_stats stats(const model *m, wf_session *s)
{
    return wf_test_plan_stats_targets(s, &m->loss, 1, m->targets, m->n_targets);
}

typedef void (*build_fn)(wf_runtime *rt, model *m);

/* Trains 'build' with 'opt' fused on 1 and 2 workers and unfused on 2; all equal. */
static void check_bitwise(build_fn build, wf_optimizer opt, const char *what, int n_vars)
{
    model mf1, mf2, mu;
    build(rt1, &mf1);
    build(rt, &mf2);
    build(rt, &mu);
    minimize(&mf1, opt);
    minimize(&mf2, opt);
    minimize(&mu, opt);
    wf_session *f1 = session(&mf1, 0), *f2 = session(&mf2, 0),
               *u = session(&mu, WF_SESSION_NO_OPTIM_FUSE);
    wf_plan_stats sf = stats(&mf2, f2), su = stats(&mu, u);
    cr_assert_eq(sf.n_optim_fused, 1, "%s: %d fused updates", what, sf.n_optim_fused);
    cr_assert_eq(su.n_optim_fused, 0, "%s", what);
    /* n_vars updates became one node */
    cr_assert_eq(sf.nodes_after_optim_fuse, su.nodes_after_optim_fuse - n_vars + 1,
                 "%s: %d nodes fused, %d unfused", what, sf.nodes_after_optim_fuse,
                 su.nodes_after_optim_fuse);
    for (int round = 0; round < 2; round++) { /* 2 steps, compare, 2 more, compare */
        train(&mf1, f1, 2);
        train(&mf2, f2, 2);
        train(&mu, u, 2);
        int n = same_variables(&mf2, f2, &mu, u, what);
        cr_assert_geq(n, n_vars + 1, "%s: %d variables compared", what, n);
        same_variables(&mf1, f1, &mu, u, what);
    }
    wf_session_destroy(f1);
    wf_session_destroy(f2);
    wf_session_destroy(u);
    wf_graph_destroy(mf1.g);
    wf_graph_destroy(mf2.g);
    wf_graph_destroy(mu.g);
}

Test(runtime_optim_fuse, mlp_steps_are_bitwise_equal_with_and_without_fusion)
{
    wf_optimizer rms = wf_rmsprop(1e-3);
    rms.momentum = 0.5;
    rms.centered = true;
    wf_optimizer adam_l2 = wf_adam(1e-3);
    adam_l2.weight_decay = 0.01;
    wf_optimizer clipped = wf_adamw(1e-3, 0.1);
    clipped.clip_norm = 0.5;
    check_bitwise(mlp, wf_adam(1e-3), "mlp adam", 4);
    check_bitwise(mlp, adam_l2, "mlp adam l2", 4);
    check_bitwise(mlp, wf_adamw(1e-3, 0.1), "mlp adamw", 4);
    check_bitwise(mlp, clipped, "mlp adamw clipped", 4);
    check_bitwise(mlp, wf_sgd(0.05), "mlp sgd", 4);
    check_bitwise(mlp, wf_momentum(0.05, 0.9, false), "mlp momentum", 4);
    check_bitwise(mlp, wf_momentum(0.05, 0.9, true), "mlp nesterov", 4);
    check_bitwise(mlp, rms, "mlp rmsprop centered momentum", 4);
    check_bitwise(mlp, wf_adagrad(0.05), "mlp adagrad", 4);
}

Test(runtime_optim_fuse, cnn_steps_are_bitwise_equal_with_and_without_fusion)
{
    check_bitwise(cnn, wf_adam(1e-3), "cnn adam", 4);
    check_bitwise(cnn, wf_adamw(1e-3, 0.1), "cnn adamw", 4);
    check_bitwise(cnn, wf_momentum(0.05, 0.9, false), "cnn momentum", 4);
    check_bitwise(cnn, wf_momentum(0.05, 0.9, true), "cnn nesterov", 4);
}

/* The gradients once, then two optimizers over the same variables: the second's updates
 * are ordered after the first's (they read the variables), so the two fused nodes must be
 * too; the result equals the unfused one. */
static void two_optimizers(model *m)
{
    wf_node *vars[4] = { wf_graph_find(m->g, "fc1.weight"), wf_graph_find(m->g, "fc1.bias"),
                         wf_graph_find(m->g, "fc2.weight"), wf_graph_find(m->g, "fc2.bias") };
    wf_node *grads[4];
    cr_assert_eq(wf_gradients(m->g, m->loss, vars, 4, grads), 0, "%s", wf_graph_errmsg(m->g));
    m->targets[0] = wf_apply_gradients(m->g, wf_adam(1e-3), vars, grads, 4);
    m->targets[1] = wf_apply_gradients(m->g, wf_momentum(0.01, 0.9, false), vars, grads, 4);
    m->n_targets = 2;
    cr_assert(m->targets[0] && m->targets[1], "%s", wf_graph_errmsg(m->g));
}

Test(runtime_optim_fuse, a_variable_updated_by_two_optimizers)
{
    model mf, mu;
    mlp(rt, &mf);
    mlp(rt, &mu);
    two_optimizers(&mf);
    two_optimizers(&mu);
    wf_session *f = session(&mf, 0), *u = session(&mu, WF_SESSION_NO_OPTIM_FUSE);
    cr_assert_eq(stats(&mf, f).n_optim_fused, 2);
    train(&mf, f, 3);
    train(&mu, u, 3);
    same_variables(&mf, f, &mu, u, "two optimizers");
    wf_session_destroy(f);
    wf_session_destroy(u);
    wf_graph_destroy(mf.g);
    wf_graph_destroy(mu.g);
}

/* Adam for fc1's variables, momentum for fc2's: two groups, each fused into a node of its own
 * (each group's members get their own part of the pass's member array). */
static void split_optimizers(model *m)
{
    wf_node *vars[4] = { wf_graph_find(m->g, "fc1.weight"), wf_graph_find(m->g, "fc1.bias"),
                         wf_graph_find(m->g, "fc2.weight"), wf_graph_find(m->g, "fc2.bias") };
    wf_node *grads[4];
    cr_assert_eq(wf_gradients(m->g, m->loss, vars, 4, grads), 0, "%s", wf_graph_errmsg(m->g));
    m->targets[0] = wf_apply_gradients(m->g, wf_adam(1e-3), vars, grads, 2);
    m->targets[1] = wf_apply_gradients(m->g, wf_momentum(0.01, 0.9, false), vars + 2, grads + 2, 2);
    m->n_targets = 2;
    cr_assert(m->targets[0] && m->targets[1], "%s", wf_graph_errmsg(m->g));
}

Test(runtime_optim_fuse, two_optimizers_over_different_variables_fuse_each)
{
    model mf, mu;
    mlp(rt, &mf);
    mlp(rt, &mu);
    split_optimizers(&mf);
    split_optimizers(&mu);
    wf_session *f = session(&mf, 0), *u = session(&mu, WF_SESSION_NO_OPTIM_FUSE);
    wf_plan_stats sf = stats(&mf, f), su = stats(&mu, u);
    cr_assert_eq(sf.n_optim_fused, 2, "%d fused updates", sf.n_optim_fused);
    cr_assert_eq(sf.nodes_after_optim_fuse, su.nodes_after_optim_fuse - 2, "%d nodes vs %d",
                 sf.nodes_after_optim_fuse, su.nodes_after_optim_fuse);
    train(&mf, f, 3);
    train(&mu, u, 3);
    same_variables(&mf, f, &mu, u, "two optimizers, different variables");
    wf_session_destroy(f);
    wf_session_destroy(u);
    wf_graph_destroy(mf.g);
    wf_graph_destroy(mu.g);
}

/* [w1, w2, w1]: the second update of fc1.weight writes a variable the first writes, so it
 * cannot join; it runs after the fused node of the other two. */
static void listed_twice(model *m)
{
    wf_node *vars[3] = { wf_graph_find(m->g, "fc1.weight"), wf_graph_find(m->g, "fc2.weight"),
                         wf_graph_find(m->g, "fc1.weight") };
    wf_node *grads[3];
    cr_assert_eq(wf_gradients(m->g, m->loss, vars, 2, grads), 0, "%s", wf_graph_errmsg(m->g));
    grads[2] = grads[0];
    m->targets[0] = wf_apply_gradients(m->g, wf_momentum(0.01, 0.9, true), vars, grads, 3);
    m->n_targets = 1;
    cr_assert_not_null(m->targets[0], "%s", wf_graph_errmsg(m->g));
}

Test(runtime_optim_fuse, a_variable_listed_twice_in_one_optimizer)
{
    model mf, mu;
    mlp(rt, &mf);
    mlp(rt, &mu);
    listed_twice(&mf);
    listed_twice(&mu);
    wf_session *f = session(&mf, 0), *u = session(&mu, WF_SESSION_NO_OPTIM_FUSE);
    wf_plan_stats sf = stats(&mf, f), su = stats(&mu, u);
    cr_assert_eq(sf.n_optim_fused, 1);
    cr_assert_eq(sf.nodes_after_optim_fuse, su.nodes_after_optim_fuse - 1);
    train(&mf, f, 3);
    train(&mu, u, 3);
    same_variables(&mf, f, &mu, u, "listed twice");
    wf_session_destroy(f);
    wf_session_destroy(u);
    wf_graph_destroy(mf.g);
    wf_graph_destroy(mu.g);
}

Test(runtime_optim_fuse, a_checkpoint_after_fused_steps_loads_into_an_unfused_session)
{
    char dir[] = "/tmp/wf_optim_fuse_XXXXXX", path[256];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/step.safetensors", dir);
    model mf, mu, mr;
    mlp(rt, &mf);
    mlp(rt, &mu);
    mlp(rt, &mr);
    minimize(&mf, wf_adam(1e-3));
    minimize(&mu, wf_adam(1e-3));
    minimize(&mr, wf_adam(1e-3));
    wf_session *f = session(&mf, 0), *u = session(&mu, WF_SESSION_NO_OPTIM_FUSE),
               *r = session(&mr, WF_SESSION_NO_OPTIM_FUSE);
    train(&mf, f, 3);
    train(&mu, u, 3);
    int rc = wf_checkpoint_save(f, path);
    cr_assert_eq(rc, 0, "%s", wf_session_errmsg(f));
    rc = wf_checkpoint_load(r, path, 0);
    cr_assert_eq(rc, 0, "%s", wf_session_errmsg(r));
    same_variables(&mf, f, &mr, r, "checkpoint after fused steps");
    same_variables(&mu, u, &mr, r, "checkpoint vs unfused steps");
    train(&mr, r, 2); /* the restored state goes on as the fused session does */
    train(&mf, f, 2);
    same_variables(&mf, f, &mr, r, "steps after the checkpoint");
    wf_session_destroy(f);
    wf_session_destroy(u);
    wf_session_destroy(r);
    wf_graph_destroy(mf.g);
    wf_graph_destroy(mu.g);
    wf_graph_destroy(mr.g);
    wf_test_rm_dir(dir);
}

Test(runtime_optim_fuse, the_dump_shows_the_fused_update)
{
    model m;
    mlp(rt, &m);
    minimize(&m, wf_adam(1e-3));
    wf_session *s = session(&m, 0);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    cr_assert_not_null(f);
    int rc = wf_session_dump(s, &m.loss, 1, m.targets, m.n_targets, f, WF_DUMP_TEXT);
    fclose(f);
    cr_assert_eq(rc, 0, "%s", wf_session_errmsg(s));
    cr_assert_not_null(strstr(buf, "multi_update"), "%s", buf);
    free(buf);
    wf_session_destroy(s);
    wf_graph_destroy(m.g);
}
