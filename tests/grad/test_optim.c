/* tests/grad/test_optim.c: the optimizers (weft/grad.h) through sessions and eager graphs:
 * each kind and option against a plain-C reference of PyTorch's update rule over several
 * steps (f64, relative tolerance 1e-12: both sides do the same f64 arithmetic up to
 * reassociation), the learning-rate schedules, the state variables and the step counter,
 * the ordering of a step (reads see the old values; a value held from before stays as it
 * was), convergence of a small regression, and bad arguments. */
#include "gradcheck.h"

TestSuite(optim, .init = gc_setup, .fini = gc_teardown, .timeout = WF_TEST_TIMEOUT(60));

enum { N = 5, STEPS = 7 };

/* PyTorch's rules, written out for one element at a time; grad = w - t (the gradient of
 * 0.5 sum((w - t)^2)). */
typedef struct ref {
    double w[N], s0[N], s1[N], s2[N];
} ref;

static void ref_step(const wf_optimizer *o, ref *r, const double *t, int64_t step)
{
    double lr = wf_optimizer_lr(o, step);
    for (int i = 0; i < N; i++) {
        double p = r->w[i], g = p - t[i];
        switch (o->kind) {
        case WF_OPT_SGD:
            g += o->weight_decay * p;
            if (o->momentum > 0) {
                r->s0[i] = step == 0 ? g : o->momentum * r->s0[i] + g;
                g = o->nesterov ? g + o->momentum * r->s0[i] : r->s0[i];
            }
            p -= lr * g;
            break;
        case WF_OPT_ADAM:
        case WF_OPT_ADAMW: {
            if (o->kind == WF_OPT_ADAMW)
                p *= 1 - lr * o->weight_decay;
            else
                g += o->weight_decay * p;
            r->s0[i] = o->beta1 * r->s0[i] + (1 - o->beta1) * g;
            r->s1[i] = o->beta2 * r->s1[i] + (1 - o->beta2) * g * g;
            double bc1 = 1 - pow(o->beta1, (double)(step + 1));
            double bc2 = 1 - pow(o->beta2, (double)(step + 1));
            double denom = sqrt(r->s1[i]) / sqrt(bc2) + o->eps;
            p -= lr / bc1 * r->s0[i] / denom;
            break;
        }
        case WF_OPT_RMSPROP: {
            g += o->weight_decay * p;
            r->s0[i] = o->rho * r->s0[i] + (1 - o->rho) * g * g;
            double avg;
            double *buf = r->s1;
            if (o->centered) {
                r->s1[i] = o->rho * r->s1[i] + (1 - o->rho) * g;
                avg = sqrt(r->s0[i] - r->s1[i] * r->s1[i]) + o->eps;
                buf = r->s2;
            } else {
                avg = sqrt(r->s0[i]) + o->eps;
            }
            if (o->momentum > 0) {
                buf[i] = o->momentum * buf[i] + g / avg;
                p -= lr * buf[i];
            } else {
                p -= lr * g / avg;
            }
            break;
        }
        case WF_OPT_ADAGRAD:
            g += o->weight_decay * p;
            r->s0[i] += g * g;
            p -= lr * g / (sqrt(r->s0[i]) + o->eps);
            break;
        }
        r->w[i] = p;
    }
}

static void check_close(const char *what, int step, int i, double got, double want)
{
    cr_assert(fabs(got - want) <= 1e-12 * fmax(1.0, fabs(want)),
              "%s, step %d, w[%d]: weft %.17g, reference %.17g", what, step, i, got, want);
}

/* Trains w toward t for STEPS steps in a static session, checking w after each against the
 * reference, and the state and step counter at the end. */
static void run_case(const char *what, wf_optimizer o)
{
    static const double w0[N] = { 0.5, -1.25, 2.0, 0.0, -0.75 };
    static const double t[N] = { 1.0, 1.0, -1.0, 0.25, 3.0 };
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *w = wf_variable(g, "w", WF_F64, WF_SHAPE(N), wf_init_zeros());
    wf_node *d = wf_sub(g, w, gc_const(g, WF_F64, WF_SHAPE(N), t));
    wf_node *loss = wf_mul(g, wf_sum(g, wf_square(g, d)), wf_scalar(g, WF_F64, 0.5));
    wf_node *train = wf_minimize(g, o, loss);
    cr_assert_not_null(train, "%s: %s", what, wf_graph_errmsg(g));
    wf_session *s;
    cr_assert_eq(wf_session_create(g, NULL, &s), 0, "%s", wf_graph_errmsg(g));
    wf_tensor *init = wf_tensor_from(WF_F64, WF_SHAPE(N), w0);
    cr_assert_eq(wf_session_assign(s, w, init), 0, "%s", wf_session_errmsg(s));
    wf_tensor_release(init);
    ref r;
    memset(&r, 0, sizeof r);
    memcpy(r.w, w0, sizeof w0);
    if (o.kind == WF_OPT_ADAGRAD)
        for (int i = 0; i < N; i++)
            r.s0[i] = o.initial_accumulator;
    for (int step = 0; step < STEPS; step++) {
        wf_tensor *l = NULL;
        cr_assert_eq(wf_session_run(s, NULL, 0, &loss, 1, &l, &train, 1), 0, "%s: %s", what,
                     wf_session_errmsg(s));
        /* The loss of this run was computed from the values before the update. */
        double want_loss = 0;
        for (int i = 0; i < N; i++)
            want_loss += 0.5 * (r.w[i] - t[i]) * (r.w[i] - t[i]);
        cr_assert_float_eq(wf_tensor_get(l, 0), want_loss, 1e-12 * fmax(1, want_loss), "%s", what);
        wf_tensor_release(l);
        ref_step(&o, &r, t, step);
        wf_tensor *v = NULL;
        cr_assert_eq(wf_session_variable(s, w, &v), 0);
        for (int i = 0; i < N; i++)
            check_close(what, step, i, wf_tensor_get(v, i), r.w[i]);
        wf_tensor_release(v);
    }
    /* The counter and the first state variable are variables of the graph. */
    char name[64];
    const char *kinds[] = { NULL, "sgd", "adam", "adamw", "rmsprop", "adagrad" };
    snprintf(name, sizeof name, "%s/step", kinds[o.kind]);
    wf_node *step = wf_graph_find(g, name);
    cr_assert_not_null(step, "%s: no '%s'", what, name);
    wf_tensor *sv = NULL;
    cr_assert_eq(wf_session_variable(s, step, &sv), 0);
    cr_assert_eq(wf_tensor_get(sv, 0), STEPS);
    wf_tensor_release(sv);
    const char *slot = o.kind == WF_OPT_ADAM      ? "w/adam_v"
                       : o.kind == WF_OPT_ADAMW   ? "w/adamw_v"
                       : o.kind == WF_OPT_RMSPROP ? "w/rms_square_avg"
                       : o.kind == WF_OPT_ADAGRAD ? "w/adagrad_sum"
                       : o.momentum > 0           ? "w/momentum"
                                                  : NULL;
    if (slot) {
        wf_node *sn = wf_graph_find(g, slot);
        cr_assert_not_null(sn, "%s: no '%s'", what, slot);
        const double *want = o.kind == WF_OPT_ADAM || o.kind == WF_OPT_ADAMW ? r.s1 : r.s0;
        cr_assert_eq(wf_session_variable(s, sn, &sv), 0);
        for (int i = 0; i < N; i++)
            check_close(slot, STEPS, i, wf_tensor_get(sv, i), want[i]);
        wf_tensor_release(sv);
    }
    wf_session_destroy(s);
    wf_graph_destroy(g);
}

Test(optim, sgd_variants_match_pytorch_rules)
{
    run_case("sgd", wf_sgd(0.1));
    wf_optimizer o = wf_sgd(0.1);
    o.weight_decay = 0.05;
    run_case("sgd + weight decay", o);
    run_case("momentum", wf_momentum(0.05, 0.9, false));
    run_case("nesterov", wf_momentum(0.05, 0.9, true));
}

Test(optim, adam_adamw_match_pytorch_rules)
{
    run_case("adam", wf_adam(0.1));
    wf_optimizer o = wf_adam(0.1);
    o.weight_decay = 0.1;
    run_case("adam + L2", o);
    run_case("adamw", wf_adamw(0.1, 0.1));
}

Test(optim, rmsprop_adagrad_match_pytorch_rules)
{
    run_case("rmsprop", wf_rmsprop(0.01));
    wf_optimizer o = wf_rmsprop(0.01);
    o.centered = true;
    run_case("rmsprop centered", o);
    o.momentum = 0.8;
    run_case("rmsprop centered + momentum", o);
    o.centered = false;
    run_case("rmsprop + momentum", o);
    run_case("adagrad", wf_adagrad(0.5));
    o = wf_adagrad(0.5);
    o.initial_accumulator = 0.1;
    o.weight_decay = 0.01;
    run_case("adagrad + accumulator + L2", o);
}

Test(optim, schedules)
{
    wf_optimizer o = wf_sgd(1.0);
    o.schedule = wf_lr_step(3, 0.5, 0);
    cr_assert_eq(wf_optimizer_lr(&o, 0), 1.0);
    cr_assert_eq(wf_optimizer_lr(&o, 2), 1.0);
    cr_assert_eq(wf_optimizer_lr(&o, 3), 0.5);
    cr_assert_eq(wf_optimizer_lr(&o, 7), 0.25);
    o.schedule = wf_lr_cosine(4, 14, 0.1);
    cr_assert_eq(wf_optimizer_lr(&o, 0), 0.25, "warm-up: lr (step + 1) / warmup");
    cr_assert_eq(wf_optimizer_lr(&o, 3), 1.0);
    cr_assert_float_eq(wf_optimizer_lr(&o, 4), 1.0, 1e-15);
    cr_assert_float_eq(wf_optimizer_lr(&o, 9), 0.1 + 0.9 * 0.5 * (1 + cos(M_PI * 0.5)), 1e-15);
    cr_assert_eq(wf_optimizer_lr(&o, 14), 0.1);
    cr_assert_eq(wf_optimizer_lr(&o, 100), 0.1);
    cr_assert_eq(wf_optimizer_check(&o), 0);
    /* The update nodes use the schedule: a step schedule through a session. */
    wf_optimizer s = wf_sgd(0.2);
    s.schedule = wf_lr_step(2, 0.5, 1);
    run_case("sgd with warm-up and step decay", s);
    wf_optimizer c = wf_adam(0.1);
    c.schedule = wf_lr_cosine(2, 6, 0.01);
    run_case("adam with cosine", c);
}

Test(optim, a_value_held_from_before_the_step_does_not_change)
{
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *w = wf_variable(g, "w", WF_F32, WF_SHAPE(3), wf_init_ones());
    wf_node *train = wf_minimize(g, wf_sgd(0.5), wf_sum(g, wf_square(g, w)));
    wf_session *s;
    cr_assert_eq(wf_session_create(g, NULL, &s), 0, "%s", wf_graph_errmsg(g));
    wf_tensor *before = NULL, *after = NULL;
    cr_assert_eq(wf_session_variable(s, w, &before), 0);
    cr_assert_eq(wf_session_run(s, NULL, 0, NULL, 0, NULL, &train, 1), 0, "%s",
                 wf_session_errmsg(s));
    cr_assert_eq(wf_session_variable(s, w, &after), 0);
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(wf_tensor_get(before, i), 1.0, "the held value was written");
        cr_assert_eq(wf_tensor_get(after, i), 0.0, "w - 0.5 * 2w");
    }
    wf_tensor_release(before);
    /* Not held any more: the next step writes in place. */
    cr_assert_eq(wf_session_run(s, NULL, 0, NULL, 0, NULL, &train, 1), 0);
    wf_tensor_release(after);
    wf_session_destroy(s);
    wf_graph_destroy(g);
}

Test(optim, eager_minimize_takes_one_step_per_call)
{
    wf_graph *g = wf_graph_create(rt, WF_EAGER);
    wf_node *w = wf_variable(g, "w", WF_F64, WF_SHAPE(2), wf_init_constant(2.0));
    for (int k = 0; k < 3; k++) {
        wf_node *loss = wf_sum(g, wf_square(g, w));
        cr_assert_not_null(wf_minimize(g, wf_sgd(0.25), loss), "%s", wf_graph_errmsg(g));
    }
    /* each step halves w: 2 -> 1 -> 0.5 -> 0.25 */
    cr_assert_eq(wf_tensor_get(wf_node_value(w), 0), 0.25);
    wf_graph_destroy(g);
}

Test(optim, linear_regression_converges)
{
    enum { B = 64, D = 4 };

    float xs[B * D], ys[B];
    static const float wt[D] = { 1.5f, -2.0f, 0.5f, 3.0f };
    uint64_t st = 5;
    for (int i = 0; i < B; i++) {
        ys[i] = 0.25f;
        for (int j = 0; j < D; j++) {
            xs[i * D + j] = (float)wf_test_rand_below(&st, 2001) / 1000.0f - 1.0f;
            ys[i] += wt[j] * xs[i * D + j];
        }
    }
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(-1, D));
    wf_node *y = wf_placeholder(g, "y", WF_F32, WF_SHAPE(-1, 1));
    wf_node *w = wf_variable(g, "w", WF_F32, WF_SHAPE(D, 1), wf_init_zeros());
    wf_node *b = wf_variable(g, "b", WF_F32, WF_SHAPE(1), wf_init_zeros());
    wf_node *loss = wf_mean(g, wf_square(g, wf_sub(g, wf_add(g, wf_matmul(g, x, w), b), y)));
    wf_node *train = wf_minimize(g, wf_adam(0.05), loss);
    cr_assert_not_null(train, "%s", wf_graph_errmsg(g));
    wf_session *s;
    cr_assert_eq(wf_session_create(g, NULL, &s), 0, "%s", wf_graph_errmsg(g));
    wf_tensor *tx = wf_tensor_from(WF_F32, WF_SHAPE(B, D), xs);
    wf_tensor *ty = wf_tensor_from(WF_F32, WF_SHAPE(B, 1), ys);
    wf_feed f[2] = { { x, tx }, { y, ty } };
    double first = 0, last = 0;
    for (int step = 0; step < 400; step++) {
        wf_tensor *l;
        cr_assert_eq(wf_session_run(s, f, 2, &loss, 1, &l, &train, 1), 0, "%s",
                     wf_session_errmsg(s));
        last = wf_tensor_get(l, 0);
        if (step == 0)
            first = last;
        wf_tensor_release(l);
    }
    cr_assert_lt(last, first * 1e-3, "loss %g -> %g", first, last);
    wf_tensor *wv;
    cr_assert_eq(wf_session_variable(s, w, &wv), 0);
    for (int j = 0; j < D; j++)
        cr_assert_float_eq(wf_tensor_get(wv, j), wt[j], 0.05);
    wf_tensor_release(wv);
    wf_tensor_release(tx);
    wf_tensor_release(ty);
    wf_session_destroy(s);
    wf_graph_destroy(g);
}

Test(optim, bad_arguments)
{
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *w = wf_variable(g, "w", WF_F32, WF_SHAPE(2), wf_init_ones());
    wf_node *c = wf_scalar(g, WF_F32, 1.0);
    wf_node *loss = wf_sum(g, w);
    cr_assert_null(wf_minimize(g, wf_sgd(-1), loss));
    cr_assert(strstr(wf_graph_errmsg(g), "lr is -1"), "%s", wf_graph_errmsg(g));
    wf_graph_clear_error(g);
    wf_optimizer o = wf_adam(0.1);
    o.beta1 = 1.0;
    cr_assert_null(wf_minimize(g, o, loss));
    cr_assert(strstr(wf_graph_errmsg(g), "betas"), "%s", wf_graph_errmsg(g));
    wf_graph_clear_error(g);
    cr_assert_null(wf_minimize(g, wf_sgd(0.1), wf_mul(g, c, c)));
    cr_assert(strstr(wf_graph_errmsg(g), "depends on no floating variable"), "%s",
              wf_graph_errmsg(g));
    wf_graph_clear_error(g);
    wf_node *grad = c;
    cr_assert_null(wf_apply_gradients(g, wf_sgd(0.1), &c, &grad, 1));
    cr_assert(strstr(wf_graph_errmsg(g), "is not a variable"), "%s", wf_graph_errmsg(g));
    wf_graph_clear_error(g);
    wf_node *bad = wf_scalar(g, WF_F32, 2.0); /* shape [] for a [2] variable */
    cr_assert_null(wf_apply_gradients(g, wf_sgd(0.1), &w, &bad, 1));
    cr_assert_eq(wf_graph_status(g), WF_ESHAPE, "%s", wf_graph_errmsg(g));
    wf_graph_destroy(g);
}

Test(optim, two_optimizers_of_one_graph_keep_their_own_counters)
{
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *a = wf_variable(g, "a", WF_F64, WF_SHAPE(2), wf_init_ones());
    wf_node *b = wf_variable(g, "b", WF_F64, WF_SHAPE(2), wf_init_ones());
    wf_node *loss = wf_sum(g, wf_mul(g, wf_square(g, a), b));
    wf_node *vars[2] = { a, b }, *grads[2];
    cr_assert_eq(wf_gradients(g, loss, vars, 2, grads), 0, "%s", wf_graph_errmsg(g));
    wf_node *s1 = wf_apply_gradients(g, wf_adam(0.1), &vars[0], &grads[0], 1);
    wf_node *s2 = wf_apply_gradients(g, wf_adam(0.01), &vars[1], &grads[1], 1);
    cr_assert(s1 && s2, "%s", wf_graph_errmsg(g));
    wf_node *c1 = wf_graph_find(g, "adam/step"), *c2 = wf_graph_find(g, "adam/step_1");
    cr_assert(c1 && c2, "two counters");
    wf_session *s;
    cr_assert_eq(wf_session_create(g, NULL, &s), 0, "%s", wf_graph_errmsg(g));
    wf_node *targets[2] = { s1, s2 };
    for (int i = 0; i < 3; i++)
        cr_assert_eq(wf_session_run(s, NULL, 0, NULL, 0, NULL, targets, 2), 0, "%s",
                     wf_session_errmsg(s));
    wf_tensor *v1, *v2;
    cr_assert_eq(wf_session_variable(s, c1, &v1), 0);
    cr_assert_eq(wf_session_variable(s, c2, &v2), 0);
    cr_assert_eq(wf_tensor_get(v1, 0), 3.0);
    cr_assert_eq(wf_tensor_get(v2, 0), 3.0);
    wf_tensor_release(v1);
    wf_tensor_release(v2);
    wf_session_destroy(s);
    wf_graph_destroy(g);
}
