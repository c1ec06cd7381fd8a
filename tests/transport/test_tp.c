/* tests/transport/test_tp.c: tensor (intra-op) parallelism, Megatron's pair (wf_tp_enter,
 * wf_tp_reduce, wf_tp_split_create) on ranks that are real processes on loopback
 * (transport_util.h), each with its own runtime, in sessions given a communicator:
 * - tp_reduce on 2 and 3 ranks gives every rank the rank-ordered sum ((x_0 + x_1) + x_2) bit for
 *   bit, in f32 and f64, over many runs (whatever order the messages arrive in), on values of
 *   mixed magnitudes whose other orders give other bits (checked: the test would see a swap);
 * - a split block's gradients (W1 and b1 by columns, W2 by rows, b2, and the block's input x)
 *   against central finite differences of the unsplit model in f64 on each rank (tolerance
 *   1e-6 + 1e-5 |numeric|, that of tests/grad/test_gradcheck.c), and its loss against the
 *   unsplit one (1e-12 relative);
 * - an MLP trained 6 SGD steps on fixed data on 2 ranks against one process (the tolerance is
 *   derived at TRAIN_RTOL);
 * - a tp_reduce whose group is not the communicator's size, and ranks whose values differ in
 *   size, fail the run naming the node, the sizes and the peer;
 * - wf_tp_split_create's bad input (indivisible widths, ranks out of range, wrong biases, a
 *   block of another structure, a graph with gradients) is refused naming the node and shape.
 */
#include "transport_util.h"

#include <math.h>
#include <string.h>

TestSuite(transport_tp, .timeout = WF_TEST_TIMEOUT(90), .fini = wf_test_fini);

#define EDGE 40

/* ---- tp_reduce: the rank-ordered sum ----------------------------------------------------- */

#define RED_N    256
#define RED_RUNS 40

/* Rank q's element i in run k: magnitudes from 1e-4 to 1e4 and both signs, so that the sum's
 * rounding depends on the order of the additions. */
static double red_value(int q, int i, int k)
{
    double mag = pow(10.0, (double)((i * 7 + q * 3 + k) % 9) - 4.0);
    double frac = 1.0 + 0.1234567 * (double)((i * 13 + q * 5 + k * 3) % 17);
    return ((i + q + k) % 3 == 0 ? -1.0 : 1.0) * mag * frac;
}

typedef struct red_arg {
    int dtype;
    int mode; /* 0: check the sums; 1: this rank's value has another size; 2: group != size */
} red_arg;

static int reduce_body(wf_comm *c, int rank, int size, void *arg)
{
    const red_arg *a = arg;
    wf_dtype dt = (wf_dtype)a->dtype;
    int n = a->mode == 1 && rank == size - 1 ? RED_N + 1 : RED_N;
    wf_graph *g = wf_graph_create(tu_rt, WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", dt, WF_SHAPE(n));
    wf_node *y = wf_tp_reduce(g, x, a->mode == 2 ? size + 1 : size, EDGE);
    TU_CHECK(y, "%s", wf_graph_errmsg(g));
    TU_OK(wf_node_set_name(y, "the_sum"));
    wf_session *s = NULL;
    TU_OK(wf_session_create(g, &(wf_session_opts){ .comm = c }, &s));
    int order_matters = 0;
    for (int k = 0; k < (a->mode ? 1 : RED_RUNS); k++) {
        double xs[RED_N + 1];
        float xf[RED_N + 1];
        for (int i = 0; i < n; i++) {
            xs[i] = red_value(rank, i, k);
            xf[i] = (float)xs[i];
        }
        wf_tensor *xt = dt == WF_F64 ? wf_tensor_from(WF_F64, WF_SHAPE(n), xs)
                                     : wf_tensor_from(dt, WF_SHAPE(n), xf);
        wf_feed f = { x, xt };
        wf_tensor *out = NULL;
        if (k % 3 == rank) /* vary who posts first */
            wf_test_sleep_us(2000);
        int rc = wf_session_run(s, &f, 1, &y, 1, &out, NULL, 0);
        wf_tensor_release(xt);
        if (a->mode == 1) {
            TU_CHECK(rc < 0, "rank %d: values of %d and %d elements were summed", rank, RED_N,
                     RED_N + 1);
            const char *m = wf_session_errmsg(s);
            TU_CHECK(strstr(m, "the_sum") || rc == WF_EPEER, "rank %d: %s: %s", rank,
                     wf_err_name(rc), m);
            break;
        }
        if (a->mode == 2) {
            TU_CHECK(rc == WF_EINVAL, "rank %d: got %s", rank, wf_err_name(rc));
            const char *m = wf_session_errmsg(s);
            TU_CHECK(strstr(m, "the_sum") && strstr(m, "group of") && strstr(m, "communicator has"),
                     "rank %d: %s", rank, m);
            break;
        }
        TU_CHECK(rc == 0, "rank %d, run %d: %s: %s", rank, k, wf_err_name(rc),
                 wf_session_errmsg(s));
        for (int i = 0; i < n; i++) {
            /* the rank-ordered sum, and the reverse order, in the dtype's arithmetic */
            if (dt == WF_F64) {
                double want = red_value(0, i, k), rev = red_value(size - 1, i, k);
                for (int q = 1; q < size; q++)
                    want += red_value(q, i, k);
                for (int q = size - 2; q >= 0; q--)
                    rev += red_value(q, i, k);
                double got = wf_tensor_data_f64(out)[i];
                TU_CHECK(memcmp(&got, &want, sizeof got) == 0,
                         "rank %d run %d element %d: %.17g, the rank-ordered sum is %.17g", rank, k,
                         i, got, want);
                order_matters += rev != want;
            } else {
                float want = (float)red_value(0, i, k), rev = (float)red_value(size - 1, i, k);
                for (int q = 1; q < size; q++)
                    want += (float)red_value(q, i, k);
                for (int q = size - 2; q >= 0; q--)
                    rev += (float)red_value(q, i, k);
                float got = wf_tensor_data_f32(out)[i];
                TU_CHECK(memcmp(&got, &want, sizeof got) == 0,
                         "rank %d run %d element %d: %.9g, the rank-ordered sum is %.9g", rank, k,
                         i, got, want);
                order_matters += rev != want;
            }
        }
        wf_tensor_release(out);
    }
    /* on 3 ranks the values are such that the reverse order gives other bits somewhere, so a
     * kernel that summed in another order would fail above */
    if (a->mode == 0 && size >= 3)
        TU_CHECK(order_matters > 0, "no element whose sum depends on the order");
    wf_session_destroy(s);
    wf_graph_destroy(g);
    return 0;
}
TU_REGISTER(reduce_body)

static void run_ranks(int size, tu_body body, const void *arg, size_t arg_size)
{
    tu_run t = { .size = size,
                 .body = body,
                 .arg = arg,
                 .arg_size = arg_size,
                 .timeout_s = WF_TEST_TIMEOUT(60),
                 .with_rt = true };
    tu_start(&t);
    cr_assert(tu_wait(&t), "the ranks did not finish within %.0f s (killed)", t.timeout_s);
    for (int r = 0; r < size; r++)
        cr_assert(WIFEXITED(t.status[r]) && WEXITSTATUS(t.status[r]) == 0,
                  "rank %d of %d: %s %d (see its stderr)", r, size,
                  WIFEXITED(t.status[r]) ? "exit status" : "killed by signal",
                  WIFEXITED(t.status[r]) ? WEXITSTATUS(t.status[r]) : WTERMSIG(t.status[r]));
}

Test(transport_tp, tp_reduce_on_2_ranks_is_the_rank_ordered_sum_bitwise_in_f32_and_f64)
{
    run_ranks(2, reduce_body, &(red_arg){ WF_F32, 0 }, sizeof(red_arg));
    run_ranks(2, reduce_body, &(red_arg){ WF_F64, 0 }, sizeof(red_arg));
}

Test(transport_tp, tp_reduce_on_3_ranks_is_the_rank_ordered_sum_bitwise_in_f32_and_f64)
{
    run_ranks(3, reduce_body, &(red_arg){ WF_F32, 0 }, sizeof(red_arg));
    run_ranks(3, reduce_body, &(red_arg){ WF_F64, 0 }, sizeof(red_arg));
}

Test(transport_tp, ranks_whose_values_differ_in_size_fail_the_run_naming_the_node)
{
    run_ranks(2, reduce_body, &(red_arg){ WF_F32, 1 }, sizeof(red_arg));
}

Test(transport_tp, a_group_other_than_the_communicators_size_fails_naming_both_sizes)
{
    run_ranks(2, reduce_body, &(red_arg){ WF_F32, 2 }, sizeof(red_arg));
}

/* ---- A split block: the model ------------------------------------------------------------ */

/* The block's widths: in -> H -> out, a batch of B rows. */
typedef struct dims {
    int B, in, H, out;
} dims;

typedef struct model {
    wf_node *x, *t, *w1, *b1, *w2, *b2, *loss;
} model;

/* The single-process model: y = act(x W1 + b1) W2 + b2, loss = mean((y - t)^2). 'x_var': x is
 * a variable (its gradient is checked), else a placeholder (fed data). */
static model build(wf_graph *g, wf_dtype dt, dims d, bool x_var, bool relu)
{
    model m = { 0 };
    m.x = x_var ? wf_variable(g, "x", dt, WF_SHAPE(d.B, d.in), wf_init_uniform(5, -1, 1))
                : wf_placeholder(g, "x", dt, WF_SHAPE(d.B, d.in));
    m.t = wf_placeholder(g, "t", dt, WF_SHAPE(d.B, d.out));
    m.w1 = wf_variable(g, "w1", dt, WF_SHAPE(d.in, d.H), wf_init_glorot_uniform(11));
    m.b1 = wf_variable(g, "b1", dt, WF_SHAPE(d.H), wf_init_uniform(12, -0.5, 0.5));
    m.w2 = wf_variable(g, "w2", dt, WF_SHAPE(d.H, d.out), wf_init_glorot_normal(13));
    m.b2 = wf_variable(g, "b2", dt, WF_SHAPE(d.out), wf_init_uniform(14, -0.5, 0.5));
    wf_node *h = wf_add(g, wf_matmul(g, m.x, m.w1), m.b1);
    h = relu ? wf_relu(g, h) : wf_tanh(g, h);
    wf_node *y = wf_add(g, wf_matmul(g, h, m.w2), m.b2);
    m.loss = wf_mean(g, wf_square(g, wf_sub(g, y, m.t)));
    if (m.loss && wf_node_set_name(m.loss, "loss") < 0)
        m.loss = NULL;
    return m;
}

/* The same nodes, found by name in a rank's split graph. */
static model find(wf_graph *h)
{
    return (model){ wf_graph_find(h, "x"),   wf_graph_find(h, "t"),  wf_graph_find(h, "w1"),
                    wf_graph_find(h, "b1"),  wf_graph_find(h, "w2"), wf_graph_find(h, "b2"),
                    wf_graph_find(h, "loss") };
}

/* Fixed data: element i of a [rows, cols] tensor (seeded per tensor). */
static wf_tensor *data(wf_dtype dt, int rows, int cols, int seed)
{
    double v[4096] = { 0 };
    for (int i = 0; i < rows * cols; i++)
        v[i] = sin(0.37 * (double)(i + 1) * (double)seed) * (1.0 + 0.25 * (double)(i % 3));
    wf_tensor *t = wf_tensor_from(WF_F64, WF_SHAPE(rows, cols), v);
    if (dt == WF_F64)
        return t;
    float f[4096] = { 0 };
    for (int i = 0; i < rows * cols; i++)
        f[i] = (float)v[i];
    wf_tensor_release(t);
    return wf_tensor_from(WF_F32, WF_SHAPE(rows, cols), f);
}

static double run_loss(wf_session *s, wf_feed *f, int nf, wf_node *loss)
{
    wf_tensor *out = NULL;
    if (wf_session_run(s, f, nf, &loss, 1, &out, NULL, 0) < 0)
        return NAN;
    double v = wf_tensor_get(out, 0);
    wf_tensor_release(out);
    return v;
}

/* ---- Gradients against finite differences ------------------------------------------------ */

#define FD_EPS  1e-6
#define FD_ATOL 1e-6
#define FD_RTOL 1e-5

/* The full model's central difference of 'loss' in element 'at' of variable 'v' (restored
 * after). */
static double numeric(wf_session *s, wf_node *v, int64_t at, wf_node *loss, wf_feed *f, int nf)
{
    wf_tensor *cur = NULL;
    if (wf_session_variable(s, v, &cur) < 0)
        return NAN;
    int64_t n = wf_tensor_numel(cur);
    double buf[4096];
    memcpy(buf, wf_tensor_data_f64(cur), (size_t)n * sizeof(double));
    wf_shape sh = wf_tensor_shape(cur);
    double x0 = buf[at], l[2];
    for (int k = 0; k < 2; k++) {
        buf[at] = x0 + (k ? -FD_EPS : FD_EPS);
        wf_tensor *p = wf_tensor_from(WF_F64, sh, buf);
        int rc = wf_session_assign(s, v, p);
        wf_tensor_release(p);
        l[k] = rc < 0 ? NAN : run_loss(s, f, nf, loss);
    }
    int rc = wf_session_assign(s, v, cur);
    wf_tensor_release(cur);
    return rc < 0 ? NAN : (l[0] - l[1]) / (2 * FD_EPS);
}

/* Compares the split gradient 'got' (this rank's shard of variable 'v': 'axis' split into
 * 'size' parts, rank 'rank''s; axis -1: whole) with the full model's central differences. */
static int check_grad(wf_session *full, wf_node *v, const wf_tensor *got, int axis, int rank,
                      int size, wf_node *loss, wf_feed *f, int nf)
{
    wf_shape fs = wf_node_shape(v);
    wf_shape gs = wf_tensor_shape(got);
    const double *g = wf_tensor_data_f64(got);
    int64_t inner = 1, d = axis < 0 ? 1 : gs.dims[axis];
    for (int k = axis + 1; axis >= 0 && k < gs.rank; k++)
        inner *= gs.dims[k];
    for (int64_t i = 0; i < wf_tensor_numel(got); i++) {
        int64_t at = i;
        if (axis >= 0) {
            int64_t o = i / (d * inner), j = (i / inner) % d, k = i % inner;
            at = (o * fs.dims[axis] + j + (int64_t)rank * d) * inner + k;
        }
        double num = numeric(full, v, at, loss, f, nf);
        TU_CHECK(fabs(g[i] - num) <= FD_ATOL + FD_RTOL * fabs(num),
                 "rank %d of %d: d loss / d %s[%lld] (shard element %lld) is %.12g, the finite "
                 "difference %.12g",
                 rank, size, wf_node_name(v), (long long)at, (long long)i, g[i], num);
    }
    return 0;
}

static int gradcheck_body(wf_comm *c, int rank, int size, void *arg)
{
    (void)arg;
    dims d = { .B = 5, .in = 4, .H = 6, .out = 3 };
    wf_graph *g = wf_graph_create(tu_rt, WF_STATIC);
    model full = build(g, WF_F64, d, true, false);
    TU_CHECK(full.loss, "%s", wf_graph_errmsg(g));
    wf_graph *h = NULL;
    wf_tp_block blk = { full.w1, full.b1, full.w2, full.b2 };
    TU_OK(wf_tp_split_create(g, &blk, 1, rank, size, EDGE, &h));
    model sp = find(h);
    TU_CHECK(sp.loss && sp.w1 && sp.x, "the split graph lacks the model's nodes");
    TU_CHECK(wf_node_shape(sp.w1).dims[1] == d.H / size &&
                 wf_node_shape(sp.w2).dims[0] == d.H / size,
             "rank %d's shards are not H / %d wide", rank, size);
    wf_node *xs[5] = { sp.x, sp.w1, sp.b1, sp.w2, sp.b2 }, *grads[5];
    TU_OK(wf_gradients(h, sp.loss, xs, 5, grads));
    wf_session *ss = NULL, *fs = NULL;
    TU_OK(wf_session_create(h, &(wf_session_opts){ .comm = c }, &ss));
    TU_OK(wf_session_create(g, NULL, &fs));
    wf_tensor *tt = data(WF_F64, d.B, d.out, 3);
    wf_feed sf = { sp.t, tt }, ff = { full.t, tt };
    wf_node *fetch[6] = { sp.loss, grads[0], grads[1], grads[2], grads[3], grads[4] };
    wf_tensor *out[6] = { 0 };
    int rc = wf_session_run(ss, &sf, 1, fetch, 6, out, NULL, 0);
    TU_CHECK(rc == 0, "rank %d: %s: %s", rank, wf_err_name(rc), wf_session_errmsg(ss));
    double lf = run_loss(fs, &ff, 1, full.loss), ls = wf_tensor_get(out[0], 0);
    TU_CHECK(fabs(ls - lf) <= 1e-12 * fabs(lf), "rank %d: split loss %.17g, unsplit %.17g", rank,
             ls, lf);
    wf_node *fv[5] = { full.x, full.w1, full.b1, full.w2, full.b2 };
    const int axis[5] = { -1, 1, 0, 0, -1 };
    for (int k = 0; k < 5; k++)
        if (check_grad(fs, fv[k], out[1 + k], axis[k], rank, size, full.loss, &ff, 1))
            return 1;
    for (int k = 0; k < 6; k++)
        wf_tensor_release(out[k]);
    wf_tensor_release(tt);
    wf_session_destroy(ss);
    wf_session_destroy(fs);
    wf_graph_destroy(h);
    wf_graph_destroy(g);
    return 0;
}
TU_REGISTER(gradcheck_body)

Test(transport_tp, a_split_blocks_gradients_match_finite_differences_on_2_ranks)
{
    run_ranks(2, gradcheck_body, NULL, 0);
}

Test(transport_tp, a_split_blocks_gradients_match_finite_differences_on_3_ranks)
{
    run_ranks(3, gradcheck_body, NULL, 0);
}

/* ---- Training on 2 ranks against one process --------------------------------------------- */

#define TRAIN_STEPS 6
#define TRAIN_LR    0.1
/* The split computes the same products; only the second matmul's sum over the hidden width H
 * is reordered (each rank's H / 2 terms, then the two partial sums). Per output element the
 * two orders differ by at most gamma_H * sum_k |a_k b_k|, gamma_H = H u / (1 - H u), u = 2^-24:
 * 1.9e-6 for H = 32, relative to the sum of the terms' magnitudes (which, for these tanh-free
 * ReLU activations and Glorot weights, is within a few times |y|). The loss is a mean of squared
 * differences, whose relative change is at most about twice its inputs', and SGD with a small
 * step passes a relative difference in the gradients on to the weights about linearly, so after
 * 6 steps the losses may differ by about 6 * 2 * 1.9e-6 * (a few) relative: TRAIN_RTOL 1e-4
 * leaves a margin of ~3. Seen: equal losses (logged under WF_TEST_VERBOSE). */
#define TRAIN_RTOL 1e-4

static int train_losses(wf_graph *g, model m, wf_comm *c, dims d, double *loss)
{
    wf_node *train = wf_minimize(g, wf_sgd(TRAIN_LR), m.loss);
    TU_CHECK(train, "%s", wf_graph_errmsg(g));
    wf_session *s = NULL;
    TU_OK(wf_session_create(g, &(wf_session_opts){ .comm = c }, &s));
    wf_tensor *xt = data(WF_F32, d.B, d.in, 1), *tt = data(WF_F32, d.B, d.out, 2);
    wf_feed f[] = { { m.x, xt }, { m.t, tt } };
    for (int k = 0; k < TRAIN_STEPS; k++) {
        wf_tensor *out = NULL;
        int rc = wf_session_run(s, f, 2, &m.loss, 1, &out, &train, 1);
        TU_CHECK(rc == 0, "step %d: %s: %s", k, wf_err_name(rc), wf_session_errmsg(s));
        loss[k] = wf_tensor_get(out, 0);
        wf_tensor_release(out);
    }
    wf_tensor_release(xt);
    wf_tensor_release(tt);
    wf_session_destroy(s);
    return 0;
}

static int train_body(wf_comm *c, int rank, int size, void *arg)
{
    (void)arg;
    dims d = { .B = 24, .in = 16, .H = 32, .out = 4 };
    wf_graph *g = wf_graph_create(tu_rt, WF_STATIC), *h = NULL;
    model full = build(g, WF_F32, d, false, true);
    TU_CHECK(full.loss, "%s", wf_graph_errmsg(g));
    wf_tp_block blk = { full.w1, full.b1, full.w2, full.b2 };
    TU_OK(wf_tp_split_create(g, &blk, 1, rank, size, EDGE, &h));
    double split[TRAIN_STEPS], one[TRAIN_STEPS];
    if (train_losses(h, find(h), c, d, split) || train_losses(g, full, NULL, d, one))
        return 1;
    for (int k = 0; k < TRAIN_STEPS; k++) {
        if (getenv("WF_TEST_VERBOSE"))
            fprintf(stderr, "rank %d step %d: split %.9g one process %.9g (rel %.3g)\n", rank, k,
                    split[k], one[k], fabs(split[k] - one[k]) / fabs(one[k]));
        TU_CHECK(fabs(split[k] - one[k]) <= TRAIN_RTOL * fabs(one[k]),
                 "rank %d step %d: the split model's loss %.9g, one process's %.9g", rank, k,
                 split[k], one[k]);
    }
    TU_CHECK(one[TRAIN_STEPS - 1] < 0.9 * one[0], "no training: loss %.6g -> %.6g", one[0],
             one[TRAIN_STEPS - 1]);
    wf_graph_destroy(h);
    wf_graph_destroy(g);
    return 0;
}
TU_REGISTER(train_body)

Test(transport_tp, an_mlp_trained_on_2_ranks_follows_one_process_within_the_derived_tolerance)
{
    run_ranks(2, train_body, NULL, 0);
}

/* ---- wf_tp_split_create's bad input ------------------------------------------------------ */

static wf_runtime *bad_rt;

static wf_graph *bad_graph(dims d, model *m)
{
    if (!bad_rt)
        cr_assert_eq(wf_runtime_create(&bad_rt, &(wf_runtime_opts){ .n_workers = 1 }), 0);
    wf_graph *g = wf_graph_create(bad_rt, WF_STATIC);
    *m = build(g, WF_F32, d, false, true);
    cr_assert_not_null(m->loss, "%s", wf_graph_errmsg(g));
    return g;
}

static void expect_refused(const wf_graph *g, wf_tp_block b, int rank, int size, const char *a,
                           const char *bb)
{
    wf_graph *h = (wf_graph *)1;
    int rc = wf_tp_split_create(g, &b, 1, rank, size, EDGE, &h);
    cr_assert_eq(rc, WF_EINVAL, "got %s: %s", wf_err_name(rc), wf_last_errmsg());
    cr_assert_null(h);
    cr_assert(strstr(wf_last_errmsg(), a) && (!bb || strstr(wf_last_errmsg(), bb)),
              "message without '%s' / '%s': %s", a, bb ? bb : "", wf_last_errmsg());
}

Test(transport_tp, a_hidden_width_that_does_not_divide_is_refused_naming_w1_and_its_shape)
{
    model m;
    wf_graph *g = bad_graph((dims){ 4, 3, 10, 2 }, &m);
    expect_refused(g, (wf_tp_block){ m.w1, m.b1, m.w2, m.b2 }, 0, 3, "'w1' [3, 10]",
                   "do not divide into 3 ranks");
    wf_graph_destroy(g);
    wf_runtime_destroy(bad_rt);
    bad_rt = NULL;
}

Test(transport_tp, a_rank_out_of_range_is_refused_naming_rank_and_size)
{
    model m;
    wf_graph *g = bad_graph((dims){ 4, 3, 8, 2 }, &m);
    wf_tp_block b = { m.w1, m.b1, m.w2, m.b2 };
    expect_refused(g, b, 2, 2, "rank 2 of a tensor-parallel group of 2", NULL);
    expect_refused(g, b, -1, 2, "rank -1", NULL);
    expect_refused(g, b, 0, 0, "group of 0", NULL);
    wf_graph_destroy(g);
    wf_runtime_destroy(bad_rt);
    bad_rt = NULL;
}

Test(transport_tp, a_block_of_another_structure_or_shape_is_refused_naming_the_node)
{
    model m;
    wf_graph *g = bad_graph((dims){ 4, 3, 8, 2 }, &m);
    /* w1 and w2 swapped: w2 [8, 2] has 2 columns, w1 [3, 8] 3 rows */
    expect_refused(g, (wf_tp_block){ m.w2, NULL, m.w1, NULL }, 0, 2, "'w2' [8, 2]", NULL);
    /* b2 given as b1: it is not [8] */
    expect_refused(g, (wf_tp_block){ m.w1, m.b2, m.w2, NULL }, 0, 2, "'b2' [2]", "is not [8]");
    /* b1 not given: the first matmul's value is read by the add, not an activation */
    expect_refused(g, (wf_tp_block){ m.w1, NULL, m.w2, m.b2 }, 0, 2, "elementwise activation",
                   NULL);
    /* not variables */
    expect_refused(g, (wf_tp_block){ m.x, NULL, m.w2, NULL }, 0, 2, "must be variables", NULL);
    /* a graph with gradients */
    wf_node *gr[1];
    cr_assert_eq(wf_gradients(g, m.loss, &m.w1, 1, gr), 0);
    expect_refused(g, (wf_tp_block){ m.w1, m.b1, m.w2, m.b2 }, 0, 2, "split the forward graph",
                   NULL);
    wf_graph_destroy(g);
    wf_runtime_destroy(bad_rt);
    bad_rt = NULL;
}
