/* tests/runtime/test_internal_memplan.c: static memory planning (runtime/compile/memplan.c): every
 * plan checked by the independent overlap checker (wf__memplan_check: two outputs that share
 * bytes are ordered by the plan's edges, or the later one is in place over the earlier), and
 * the checker itself shown to catch an overlap; random graphs and their gradients (values
 * big enough for the task-graph executor, and tiny ones that run inline) give the same bits
 * with and without the plan, on 1 and 2 workers and from 2 threads at once; plans with -1
 * dimensions are made again when the batch changes; a steady-state training step (an MLP
 * with Adam, a small CNN with momentum) takes exactly one block from the session's pool per
 * step, for the fetched loss, and none for intermediates; fetched values stay as they were
 * after later runs; the MLP of perf/train fits within 1.25x of the liveness minimum; the
 * dumps show the offsets. An internal test: it reads the session's pool and plans. */
#include "../../core/graph.h"
#include "../../core/op.h"
#include "../../core/tensor.h"
#include "../../runtime/internal.h"
#include "runtime_util.h"

#include <weft/weft.h>

#include <criterion/criterion.h>

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

TestSuite(runtime_memplan, .init = wf_test_rt_setup, .fini = wf_test_rt_teardown,
          .timeout = WF_TEST_TIMEOUT(240));

static wf_tensor *copy_of(const wf_tensor *t)
{
    wf_tensor *c = wf_tensor_from(wf_tensor_dtype(t), wf_tensor_shape(t), wf_tensor_data(t));
    cr_assert_not_null(c, "%s", wf_last_errmsg());
    return c;
}

static uint64_t pool_allocs(wf_session *s)
{
    wf_pool_stats ps;
    cr_assert_eq(wf_pool_get_stats(s->pool, &ps), 0);
    return ps.allocs;
}

/* Checks every plan of 's' and every slot's own plan with the independent checker; returns
 * how many memory plans there were. */
static int check_plans(wf_session *s)
{
    int n = 0;
    for (wf__plan *p = s->plans; p; p = p->next) {
        if (p->mp) {
            cr_assert_eq(wf__memplan_check(p, p->mp), 0, "%s", wf_last_errmsg());
            n++;
        }
        for (int k = 0; k < p->max_slots; k++) {
            wf__slot *sl = p->all_slots[k];
            if (sl && sl->own_mp) {
                cr_assert_eq(wf__memplan_check(p, sl->own_mp), 0, "%s", wf_last_errmsg());
                n++;
            }
        }
    }
    return n;
}

/* ---- Random graphs -------------------------------------------------------------------- */

enum { RG_OPS = 28, RG_FETCH = 5 };

typedef wf_test_rgraph rgraph;

/* A random graph of [d, d] values (d 6: every value is tiny and the plan runs inline; d 24:
 * the task-graph executor) with wide fan-out, so that many values are live at once and
 * readers run in parallel, elementwise ops that may run in place, and the gradients of a
 * loss with respect to both variables. */
static void random_graph(rgraph *r, uint64_t seed, int d)
{
    uint64_t st = seed * 0x9e3779b97f4a7c15ull + 7;
    wf_graph *g = r->g = wf_graph_create(rt, WF_STATIC);
    wf_node *pool[RG_OPS + 8];
    int n = 0;
    wf_tensor *c = wf_test_rand_f32(&st, WF_SHAPE(d, d));
    pool[n++] = wf_constant(g, c);
    wf_tensor_release(c);
    wf_test_rg_inputs(r, pool, &n, seed, d, &st);
    int perm[2] = { 1, 0 };
    for (int i = 0; i < RG_OPS; i++) {
        /* Mostly recent values (chains that can reuse memory), sometimes old ones (long
         * lifetimes, fan-out). */
        uint64_t back = wf_test_rand_below(&st, 4) ? 4 : (uint64_t)n;
        wf_node *a =
            pool[n - 1 - (int)wf_test_rand_below(&st, back < (uint64_t)n ? back : (uint64_t)n)];
        wf_node *b = pool[wf_test_rand_below(&st, (uint64_t)n)];
        int axis = (int)wf_test_rand_below(&st, 2);
        wf_node *o = NULL;
        switch (wf_test_rand_below(&st, 12)) {
        case 0:
            o = wf_add(g, a, b);
            break;
        case 1:
            o = wf_sub(g, wf_mul(g, a, b), a);
            break;
        case 2:
            o = wf_div(g, a, wf_exp(g, wf_neg(g, wf_abs(g, b))));
            break;
        case 3:
            o = wf_tanh(g, wf_matmul(g, a, b));
            break;
        case 4:
            o = wf_relu(g, wf_add(g, wf_mul(g, a, a), wf_sigmoid(g, b)));
            break;
        case 5:
            o = wf_transpose(g, wf_add(g, a, b), perm, 2);
            break;
        case 6:
            o = wf_reshape(g, wf_reshape(g, wf_tanh(g, a), WF_SHAPE(d * d)), WF_SHAPE(d, d));
            break;
        case 7:
            o = wf_add(g, a, wf_reduce_sum(g, wf_sigmoid(g, b), &axis, 1, true));
            break;
        case 8:
            o = wf_softmax(g, wf_sub(g, a, b), axis);
            break;
        case 9:
            o = wf_maximum(g, a, wf_mul(g, wf_scalar(g, WF_F32, 0.5), b));
            break;
        case 10: /* three readers of one value */
            o = wf_add(g, wf_mul(g, wf_tanh(g, a), wf_sigmoid(g, a)), wf_exp(g, wf_neg(g, a)));
            break;
        default:
            o = wf_mul(g, a, wf_reduce_mean(g, wf_tanh(g, b), &axis, 1, true));
            break;
        }
        cr_assert_not_null(o, "seed %llu: %s", (unsigned long long)seed, wf_graph_errmsg(g));
        pool[n++] = o;
    }
    wf_node *grads[2];
    wf_node *loss = wf_test_rg_loss(r, pool, n, seed, grads);
    r->fetch[0] = pool[n - 1];
    r->fetch[1] = wf_sum(g, pool[n - 5]);
    r->fetch[2] = loss;
    r->fetch[3] = grads[0];
    r->fetch[4] = grads[1];
}

/* Runs 'r' without a memory plan, then with one (three runs, so slots are replayed), and
 * checks the bits and the plan. Returns the plan's statistics. */
static wf_plan_stats check_random(uint64_t seed, int d)
{
    rgraph r;
    random_graph(&r, seed, d);
    wf_feed feeds[2] = { { r.ph[0], r.feed[0] }, { r.ph[1], r.feed[1] } };
    wf_tensor *want[RG_FETCH];
    wf_session *base = wf_test_session(r.g, WF_SESSION_NO_MEMPLAN);
    wf_test_run(base, feeds, 2, r.fetch, RG_FETCH, want, NULL, 0);
    wf_plan_stats st;
    cr_assert_eq(wf_session_stats(base, &st), 0);
    cr_assert_eq(st.bytes_planned, 0, "no plan with WF_SESSION_NO_MEMPLAN");
    wf_session *s = wf_test_session(r.g, 0);
    for (int rep = 0; rep < 3; rep++) {
        wf_tensor *got[RG_FETCH];
        wf_test_run(s, feeds, 2, r.fetch, RG_FETCH, got, NULL, 0);
        for (int k = 0; k < RG_FETCH; k++) {
            cr_assert(wf_test_same_bits(got[k], want[k]),
                      "seed %llu, d %d, run %d: output %d differs", (unsigned long long)seed, d,
                      rep, k);
            wf_tensor_release(got[k]);
        }
    }
    cr_assert_eq(check_plans(s), 1, "seed %llu: one memory plan", (unsigned long long)seed);
    cr_assert_eq(wf_session_stats(s, &st), 0);
    cr_assert_gt(st.bytes_planned, 0);
    cr_assert_leq(st.bytes_planned, st.bytes_intermediates + 64 * s->plans->mp->m->n_planned);
    for (int k = 0; k < RG_FETCH; k++)
        wf_tensor_release(want[k]);
    wf_session_destroy(s);
    wf_session_destroy(base);
    wf_test_rg_free(&r);
    return st;
}

static void random_graphs(int d)
{
    long n = wf_test_scaled(40, 8);
    int64_t planned = 0, total = 0;
    for (long seed = 1; seed <= n; seed++) {
        wf_plan_stats st = check_random((uint64_t)seed, d);
        planned += st.bytes_planned;
        total += st.bytes_intermediates;
    }
    /* The plan must reuse memory, not only place outputs side by side. */
    cr_assert_lt(planned * 4, total * 3, "d %d: planned %lld of %lld bytes", d, (long long)planned,
                 (long long)total);
}

Test(runtime_memplan, random_graphs_give_the_same_bits_with_and_without_the_plan)
{
    random_graphs(24);
}

Test(runtime_memplan, random_inline_graphs_give_the_same_bits_with_and_without_the_plan)
{
    random_graphs(6);
}

Test(runtime_memplan, random_graphs_on_one_worker_give_the_same_bits)
{
    wf_runtime_destroy(rt);
    rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 1, .flags = WF_RT_NO_PIN });
    for (uint64_t seed = 100; seed < 100 + (uint64_t)wf_test_scaled(15, 4); seed++)
        check_random(seed, 24);
}

Test(runtime_memplan, the_checker_finds_outputs_that_overlap_while_both_may_be_live)
{
    rgraph r;
    random_graph(&r, 3, 24);
    wf_session *s = wf_test_session(r.g, 0);
    wf_plan_stats st;
    cr_assert_eq(wf_session_plan_stats(s, r.fetch, RG_FETCH, NULL, 0, &st), 0);
    wf__plan *p = s->plans;
    cr_assert_not_null(p->mp);
    cr_assert_eq(wf__memplan_check(p, p->mp), 0, "%s", wf_last_errmsg());
    /* Two planned outputs where one is read by a later node that the other's producer
     * does not precede: put them on the same bytes. */
    int u = -1, v = -1;
    for (int i = 0; i < p->n && v < 0; i++) {
        if (p->mp->m->offset[i] < 0)
            continue;
        for (int32_t k = p->in_off[i]; k < p->in_off[i + 1] && v < 0; k++) {
            int32_t j = p->in_idx[k];
            if (j != i && p->mp->m->offset[j] >= 0 && !p->mp->m->inplace[i]) {
                u = j; /* i reads j, and i's output is written while j is being read */
                v = i;
            }
        }
    }
    cr_assert(u >= 0 && v >= 0);
    int64_t keep = p->mp->m->offset[v];
    p->mp->m->offset[v] = p->mp->m->offset[u];
    cr_assert_eq(wf__memplan_check(p, p->mp), WF_EINVAL, "an overlap the checker missed");
    cr_assert(strstr(wf_last_errmsg(), "overlap"), "%s", wf_last_errmsg());
    p->mp->m->offset[v] = keep;
    cr_assert_eq(wf__memplan_check(p, p->mp), 0);
    wf_session_destroy(s);
    wf_test_rg_free(&r);
}

/* ---- Threads ---------------------------------------------------------------------------- */

typedef struct conc {
    wf_session *s;
    rgraph *r;
    wf_tensor **want;
    int reps;
    atomic_int bad;
} conc;

static void *conc_thread(void *arg)
{
    conc *c = arg;
    wf_feed feeds[2] = { { c->r->ph[0], c->r->feed[0] }, { c->r->ph[1], c->r->feed[1] } };
    for (int rep = 0; rep < c->reps; rep++) {
        wf_tensor *got[RG_FETCH];
        if (wf_session_run(c->s, feeds, 2, c->r->fetch, RG_FETCH, got, NULL, 0) < 0) {
            atomic_fetch_add(&c->bad, 1);
            continue;
        }
        for (int k = 0; k < RG_FETCH; k++) {
            if (!wf_test_same_bits(got[k], c->want[k]))
                atomic_fetch_add(&c->bad, 1);
            wf_tensor_release(got[k]);
        }
    }
    return NULL;
}

Test(runtime_memplan, two_threads_run_one_session_at_once_each_slot_with_its_arena)
{
    for (uint64_t seed = 20; seed < 20 + (uint64_t)wf_test_scaled(6, 2); seed++) {
        rgraph r;
        random_graph(&r, seed, 24);
        wf_feed feeds[2] = { { r.ph[0], r.feed[0] }, { r.ph[1], r.feed[1] } };
        wf_tensor *want[RG_FETCH];
        wf_session *base = wf_test_session(r.g, WF_SESSION_NO_MEMPLAN);
        wf_test_run(base, feeds, 2, r.fetch, RG_FETCH, want, NULL, 0);
        conc c = {
            .s = wf_test_session(r.g, 0), .r = &r, .want = want, .reps = (int)wf_test_scaled(30, 5)
        };
        pthread_t th[2];
        for (int t = 0; t < 2; t++)
            cr_assert_eq(pthread_create(&th[t], NULL, conc_thread, &c), 0);
        for (int t = 0; t < 2; t++)
            pthread_join(th[t], NULL);
        cr_assert_eq(atomic_load(&c.bad), 0, "seed %llu: %d wrong results",
                     (unsigned long long)seed, atomic_load(&c.bad));
        /* Each slot that ran has an arena of its own. */
        wf__plan *p = c.s->plans;
        int arenas = 0;
        for (int k = 0; k < p->max_slots; k++)
            if (p->all_slots[k] && p->all_slots[k]->arena.block) {
                for (int m = 0; m < k; m++)
                    if (p->all_slots[m])
                        cr_assert_neq(p->all_slots[m]->arena.block, p->all_slots[k]->arena.block);
                arenas++;
            }
        cr_assert_geq(arenas, 1);
        check_plans(c.s);
        for (int k = 0; k < RG_FETCH; k++)
            wf_tensor_release(want[k]);
        wf_session_destroy(c.s);
        wf_session_destroy(base);
        wf_test_rg_free(&r);
    }
}

/* ---- Training steps ------------------------------------------------------------------------ */

typedef struct model {
    wf_graph *g;
    wf_node *x, *y, *loss, *step, *hidden;
    wf_shape xs;
    int classes;
} model;

static wf_node *linear(wf_graph *g, wf_node *h, const char *name, int in, int out, uint64_t seed)
{
    char wn[32], bn[32];
    snprintf(wn, sizeof wn, "%s.weight", name);
    snprintf(bn, sizeof bn, "%s.bias", name);
    wf_node *w = wf_variable(g, wn, WF_F32, WF_SHAPE(out, in), wf_init_glorot_uniform(seed));
    wf_node *b = wf_variable(g, bn, WF_F32, WF_SHAPE(out), wf_init_zeros());
    return wf_add(g, wf_matmul_ex(g, h, w, false, true), b);
}

/* An MLP in-hidden-hidden-10 with Adam; 'batch' -1 makes the batch a -1 dimension. */
static model mlp(int64_t batch, int in, int hidden)
{
    model m = { .g = wf_graph_create(rt, WF_STATIC), .classes = 10 };
    wf_graph *g = m.g;
    m.xs = WF_SHAPE(batch, in);
    m.x = wf_placeholder(g, "x", WF_F32, m.xs);
    m.y = wf_placeholder(g, "y", WF_I32, WF_SHAPE(batch));
    wf_node *h = wf_relu(g, linear(g, m.x, "fc1", in, hidden, 1));
    m.hidden = h = wf_relu(g, linear(g, h, "fc2", hidden, hidden, 3));
    h = linear(g, h, "fc3", hidden, 10, 5);
    m.loss = wf_mean(g, wf_softmax_cross_entropy(g, h, m.y));
    m.step = wf_minimize(g, wf_adam(1e-3), m.loss);
    cr_assert_not_null(m.step, "%s", wf_graph_errmsg(g));
    return m;
}

/* conv 3x3 8 + ReLU + maxpool 2, linear 8*7*7-10, SGD with momentum, on 1x16x16 images. */
static model cnn(int64_t batch)
{
    model m = { .g = wf_graph_create(rt, WF_STATIC), .classes = 10 };
    wf_graph *g = m.g;
    m.xs = WF_SHAPE(batch, 1, 16, 16);
    m.x = wf_placeholder(g, "x", WF_F32, m.xs);
    m.y = wf_placeholder(g, "y", WF_I32, WF_SHAPE(batch));
    wf_node *w =
        wf_variable(g, "conv.weight", WF_F32, WF_SHAPE(8, 1, 3, 3), wf_init_uniform(1, -0.3, 0.3));
    wf_node *b = wf_variable(g, "conv.bias", WF_F32, WF_SHAPE(8, 1, 1), wf_init_zeros());
    const wf_pool2d_opts pool = { .window = { 2, 2 } };
    wf_node *h = wf_max_pool2d(g, wf_relu(g, wf_add(g, wf_conv2d(g, m.x, w, NULL), b)), &pool);
    m.hidden = h;
    h = wf_reshape(g, h, WF_SHAPE(batch, 8 * 7 * 7));
    h = linear(g, h, "fc", 8 * 7 * 7, 10, 7);
    m.loss = wf_mean(g, wf_softmax_cross_entropy(g, h, m.y));
    m.step = wf_minimize(g, wf_momentum(0.01, 0.9, false), m.loss);
    cr_assert_not_null(m.step, "%s", wf_graph_errmsg(g));
    return m;
}

/* One batch of 'm' with 'batch' rows from 'st': feeds[0], feeds[1] (the caller releases). */
static void batch_of(const model *m, int64_t batch, uint64_t *st, wf_feed feeds[2])
{
    wf_shape xs = m->xs;
    xs.dims[0] = batch;
    int32_t *yd = malloc((size_t)batch * sizeof *yd);
    for (int64_t k = 0; k < batch; k++)
        yd[k] = (int32_t)wf_test_rand_below(st, (uint64_t)m->classes);
    feeds[0] = (wf_feed){ m->x, wf_test_rand_f32(st, xs) };
    feeds[1] = (wf_feed){ m->y, wf_tensor_from(WF_I32, WF_SHAPE(batch), yd) };
    free(yd);
}

/* Trains 'm' for 'steps' steps in a session with 'flags'; the losses' bits go to 'losses'.
 * With 'allocs', the pool allocations of each step after the second go there. */
static void train(const model *m, uint32_t flags, int steps, float *losses, uint64_t *allocs)
{
    wf_session *s = wf_test_session(m->g, flags);
    uint64_t st = 5;
    for (int it = 0; it < steps; it++) {
        wf_feed feeds[2];
        batch_of(m, m->xs.dims[0] < 0 ? 16 : m->xs.dims[0], &st, feeds);
        uint64_t before = pool_allocs(s);
        wf_tensor *l;
        wf_test_run(s, feeds, 2, &m->loss, 1, &l, &m->step, 1);
        if (allocs)
            allocs[it] = pool_allocs(s) - before;
        losses[it] = wf_tensor_data_f32(l)[0];
        wf_tensor_release(l);
        wf_tensor_release(feeds[0].value);
        wf_tensor_release(feeds[1].value);
    }
    if (!(flags & WF_SESSION_NO_MEMPLAN))
        cr_assert_eq(check_plans(s), 1);
    wf_session_destroy(s);
}

static void check_zero_alloc_steps(model m)
{
    enum { STEPS = 8 };

    float want[STEPS], got[STEPS];
    uint64_t base_allocs[STEPS], allocs[STEPS];
    train(&m, WF_SESSION_NO_MEMPLAN, STEPS, want, base_allocs);
    train(&m, 0, STEPS, got, allocs);
    for (int it = 0; it < STEPS; it++)
        cr_assert_eq(memcmp(&got[it], &want[it], sizeof got[it]), 0, "step %d: loss %g, not %g", it,
                     got[it], want[it]);
    /* Step 0 compiles and makes the arena; from then on the only block each step takes from
     * the pool is the fetched loss's (fetched values are not planned: the caller keeps them).
     * Without the plan every intermediate comes from the pool. */
    cr_assert_geq(allocs[0], 2, "step 0 allocates the arena and the loss");
    for (int it = 1; it < STEPS; it++) {
        cr_assert_eq(allocs[it], 1, "step %d took %llu blocks from the pool", it,
                     (unsigned long long)allocs[it]);
        cr_assert_gt(base_allocs[it], 10, "without the plan: %llu",
                     (unsigned long long)base_allocs[it]);
    }
    wf_graph_destroy(m.g);
}

Test(runtime_memplan, an_mlp_training_step_with_adam_takes_only_the_fetched_loss_from_the_pool)
{
    check_zero_alloc_steps(mlp(32, 64, 48));
}

Test(runtime_memplan, a_cnn_training_step_takes_only_the_fetched_loss_from_the_pool)
{
    check_zero_alloc_steps(cnn(8));
}

Test(runtime_memplan, a_batch_of_another_size_plans_again_and_keeps_the_results)
{
    model m = mlp(-1, 12, 40);
    wf_session *base = wf_test_session(m.g, WF_SESSION_NO_MEMPLAN | WF_SESSION_NO_FOLD);
    wf_session *s = wf_test_session(m.g, WF_SESSION_NO_FOLD);
    const int64_t batches[] = { 16, 16, 7, 7, 33, 16 };
    uint64_t st1 = 11, st2 = 11;
    int64_t arena_16 = -1;
    for (int k = 0; k < 6; k++) {
        wf_feed f1[2], f2[2];
        batch_of(&m, batches[k], &st1, f1);
        batch_of(&m, batches[k], &st2, f2);
        wf_node *fetch[2] = { m.loss, m.hidden };
        wf_tensor *want[2], *got[2];
        wf_test_run(base, f1, 2, fetch, 2, want, &m.step, 1);
        uint64_t before = pool_allocs(s);
        wf_test_run(s, f2, 2, fetch, 2, got, &m.step, 1);
        uint64_t took = pool_allocs(s) - before;
        for (int j = 0; j < 2; j++) {
            cr_assert(wf_test_same_bits(got[j], want[j]), "batch %lld: output %d differs",
                      (long long)batches[k], j);
            wf_tensor_release(got[j]);
            wf_tensor_release(want[j]);
        }
        wf__plan *p = s->plans;
        cr_assert(p->mp_dynamic);
        wf__slot *sl = p->free_slots;
        cr_assert_not_null(sl->own_mp, "batch %lld: the slot has a plan", (long long)batches[k]);
        cr_assert_eq(wf__memplan_check(p, sl->own_mp), 0, "%s", wf_last_errmsg());
        /* The planned hidden layer has this batch's rows. */
        int32_t h = p->index_of[m.hidden->id];
        (void)h;
        if (batches[k] == 16 && arena_16 < 0)
            arena_16 = sl->own_mp->m->arena_bytes;
        else if (batches[k] == 16)
            cr_assert_eq(sl->own_mp->m->arena_bytes, arena_16);
        if (k > 0 && batches[k] == batches[k - 1])
            cr_assert_eq(took, 2, "batch %lld again: only the two fetched values, took %llu",
                         (long long)batches[k], (unsigned long long)took);
        for (int j = 0; j < 2; j++) {
            wf_tensor_release(f1[j].value);
            wf_tensor_release(f2[j].value);
        }
    }
    wf_plan_stats ps;
    cr_assert_eq(wf_session_stats(s, &ps), 0);
    cr_assert_gt(ps.bytes_planned, 0);
    wf_session_destroy(s);
    wf_session_destroy(base);
    wf_graph_destroy(m.g);
}

Test(runtime_memplan, fetched_values_keep_their_values_after_later_runs)
{
    model m = mlp(16, 12, 40);
    wf_session *s = wf_test_session(m.g, 0);
    uint64_t st = 3;
    wf_node *fetch[2] = { m.loss, m.hidden };
    wf_tensor *first[2], *copy[2];
    for (int it = 0; it < 6; it++) {
        wf_feed f[2];
        batch_of(&m, 16, &st, f);
        wf_tensor *got[2];
        wf_test_run(s, f, 2, fetch, 2, got, &m.step, 1);
        for (int j = 0; j < 2; j++) {
            cr_assert(!wf__memplan_aliases(got[j]), "a fetched value in the arena");
            if (it == 0) {
                first[j] = got[j];
                copy[j] = copy_of(got[j]);
            } else {
                wf_tensor_release(got[j]);
            }
        }
        wf_tensor_release(f[0].value);
        wf_tensor_release(f[1].value);
    }
    for (int j = 0; j < 2; j++) {
        cr_assert(wf_test_same_bits(first[j], copy[j]), "fetched value %d changed under the caller",
                  j);
        wf_tensor_release(first[j]);
        wf_tensor_release(copy[j]);
    }
    wf_session_destroy(s);
    wf_graph_destroy(m.g);
}

/* ---- Size, statistics, dumps ---------------------------------------------------------------- */

Test(runtime_memplan, the_mlp_of_train_bench_fits_within_1_25x_of_the_liveness_minimum)
{
    model m = mlp(256, 784, 1024); /* perf/train's mlp_adam_b256: 784-1024-1024-10 */
    wf_session *s = wf_test_session(m.g, 0);
    wf_plan_stats st;
    uint64_t t0 = wf_test_now_ns();
    cr_assert_eq(wf_session_plan_stats(s, &m.loss, 1, &m.step, 1, &st), 0);
    double compile_ms = (double)(wf_test_now_ns() - t0) / 1e6;
    const wf__memplan *mp = s->plans->mp;
    cr_assert_not_null(mp);
    cr_assert_eq(wf__memplan_check(s->plans, mp), 0, "%s", wf_last_errmsg());
    cr_assert_eq(st.bytes_planned, mp->m->arena_bytes);
    cr_assert_eq(st.bytes_intermediates, mp->m->bytes_intermediates);
    double ratio = (double)mp->m->arena_bytes / (double)mp->m->bytes_live_min;
    fprintf(stderr,
            "memplan: mlp 784-1024-1024-10 b256 Adam: %d outputs planned (%d in place), "
            "intermediates %.2f MiB, arena %.2f MiB, liveness minimum %.2f MiB: %.3fx; "
            "%d ordering edges; compile with every pass %.2f ms\n",
            mp->m->n_planned, mp->m->n_inplace, (double)mp->m->bytes_intermediates / 1048576.0,
            (double)mp->m->arena_bytes / 1048576.0, (double)mp->m->bytes_live_min / 1048576.0,
            ratio, mp->m->n_edges, compile_ms);
    if (getenv("WF_MEMPLAN_DUMP")) /* the plan with its offsets, to look at */
        cr_assert_eq(wf_session_dump(s, &m.loss, 1, &m.step, 1, stderr, WF_DUMP_TEXT), 0);
    cr_assert_leq(ratio, 1.25, "arena %lld, liveness minimum %lld", (long long)mp->m->arena_bytes,
                  (long long)mp->m->bytes_live_min);
    cr_assert_lt(mp->m->arena_bytes, mp->m->bytes_intermediates);
    cr_assert_gt(mp->m->n_edges, 0, "rule (a) alone is 1.37x here: the plan orders nodes");
    wf_session_destroy(s);
    /* The plan with its ordering edges runs and gives the bits of the pool's. */
    float with[2], without[2];
    train(&m, 0, 2, with, NULL);
    train(&m, WF_SESSION_NO_MEMPLAN, 2, without, NULL);
    cr_assert_eq(memcmp(with, without, sizeof with), 0, "losses %g %g, not %g %g", with[0], with[1],
                 without[0], without[1]);
    wf_graph_destroy(m.g);
}

Test(runtime_memplan, dumps_show_arena_offsets_and_no_memplan_switches_it_off)
{
    model m = mlp(16, 12, 40);
    for (int off = 0; off < 2; off++) {
        wf_session *s = wf_test_session(m.g, off ? WF_SESSION_NO_MEMPLAN : 0);
        for (int format = WF_DUMP_TEXT; format <= WF_DUMP_DOT; format++) {
            char *buf = NULL;
            size_t len = 0;
            FILE *f = open_memstream(&buf, &len);
            cr_assert_eq(wf_session_dump(s, &m.loss, 1, &m.step, 1, f, format), 0);
            fclose(f);
            bool has = strstr(buf, "@arena+") != NULL;
            cr_assert_eq(has, !off, "format %d, memplan %s:\n%s", format, off ? "off" : "on", buf);
            if (!off && format == WF_DUMP_TEXT)
                cr_assert(strstr(buf, "@arena+0"), "%s", buf);
            free(buf);
        }
        wf_plan_stats st;
        cr_assert_eq(wf_session_plan_stats(s, &m.loss, 1, &m.step, 1, &st), 0);
        if (off) {
            cr_assert_eq(st.bytes_planned, 0);
            cr_assert_null(s->plans->mp);
        } else {
            cr_assert_gt(st.bytes_planned, 0);
            cr_assert_gt(st.bytes_intermediates, st.bytes_planned);
        }
        wf_session_destroy(s);
    }
    wf_graph_destroy(m.g);
}

/* ---- A kernel that breaks the rules --------------------------------------------------------- */

/* "passthrough": returns its input itself instead of filling its output (core/op.h says a
 * kernel writes '*out'; this one hands back an arena value of the run). */
static int passthrough_cpu(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                           wf_tensor **out)
{
    (void)ctx;
    (void)n;
    wf_tensor_release(*out);
    *out = wf_tensor_retain(in[0]);
    return 0;
}

static const wf_op_def op_passthrough = {
    .name = "test_passthrough",
    .min_inputs = 1,
    .max_inputs = 1,
    .infer = wf_test_infer_same,
    .kernel = { [WF_KERNEL_CPU] = passthrough_cpu },
};

Test(runtime_memplan, a_fetched_value_that_is_an_arena_value_is_copied_out)
{
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(32, 32));
    wf_node *h = wf_tanh(g, wf_mul(g, x, x)); /* planned: not fetched */
    wf_node *in[1] = { h };
    wf_node *o = wf__node_add(g, &op_passthrough, in, 1, NULL);
    cr_assert_not_null(o, "%s", wf_graph_errmsg(g));
    wf_session *s = wf_test_session(g, 0);
    uint64_t st = 8;
    wf_tensor *first = NULL, *copy = NULL;
    for (int it = 0; it < 4; it++) {
        wf_tensor *xt = wf_test_rand_f32(&st, WF_SHAPE(32, 32)), *got;
        wf_feed f = { x, xt };
        wf_test_run(s, &f, 1, &o, 1, &got, NULL, 0);
        cr_assert(!wf__memplan_aliases(got), "the caller got arena memory");
        const float *xd = wf_tensor_data_f32(xt), *gd = wf_tensor_data_f32(got);
        for (int k = 0; k < 32 * 32; k++)
            cr_assert_eq(gd[k], tanhf(xd[k] * xd[k]), "run %d, element %d", it, k);
        if (it == 0) {
            first = got;
            copy = copy_of(got);
        } else {
            wf_tensor_release(got);
        }
        wf_tensor_release(xt);
    }
    cr_assert(wf_test_same_bits(first, copy), "a fetched value changed under the caller");
    wf_tensor_release(first);
    wf_tensor_release(copy);
    wf_session_destroy(s);
    wf_graph_destroy(g);
}
