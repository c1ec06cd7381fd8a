/* tests/runtime/test_internal_devflow.c: the dataflow across devices (issue 6), run for real
 * without a GPU: task-graph nodes that finish later (WF_TASK_LATER, completed from an actor),
 * and sessions whose nodes run on simulated devices (devices/sim.c: the CPU kernels on
 * memory of their own; copies to the host land, and completions arrive, only later, from
 * the device's actor, in order). Checked: the copy nodes the placement inserts (one per value
 * and destination, host <-> device and device <-> device), results bitwise equal to the
 * same graph on the CPU (a reader released before its copy landed would read stale bytes),
 * a run on one worker (a worker that waited for a copy would deadlock it), concurrent runs,
 * a training step placed by the rule, and the placement errors that name node and device.
 * Variables resident on a device (runtime/var_device.c): training with SGD, momentum, Adam
 * and AdamW, fused and unfused, gives every variable the CPU's bits with no variable or
 * gradient copied between host and device after the first step; read backs, assigns,
 * checkpoints, evaluation plans on the CPU and on the device, a failed allocation of a
 * device value, a fetched resident variable, and concurrent read backs during training.
 * Internal: sets the session's simulated devices (runtime/internal.h). */
#include "../../runtime/internal.h"
#include "runtime_util.h"

#include <weft/weft.h>

#include <criterion/criterion.h>

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

TestSuite(runtime_internal_devflow, .init = wf_test_rt_setup_both, .fini = wf_test_rt_teardown,
          .timeout = WF_TEST_TIMEOUT(120));

/* ---- Task-graph nodes that finish later ------------------------------------------------- */

typedef struct later_msg {
    wf_msg msg; /* first */
    wf_taskgraph *g;
    int node, rc;
} later_msg;

typedef struct later_state {
    wf_actor *actor;
    later_msg m;
    atomic_int landed; /* set by the actor just before it completes the node */
    atomic_int early;  /* successors that ran before 'landed' */
    atomic_int ran;    /* successors that ran */
    bool inline_complete;
} later_state;

static later_state *LS;

static int later_actor(wf_actor *a, wf_msg *msg, void *ctx)
{
    later_msg *m = (later_msg *)msg;
    nanosleep(&(struct timespec){ 0, 300000 }, NULL); /* the "device" takes its time */
    atomic_store(&LS->landed, 1);
    return wf_taskgraph_complete(m->g, m->node, m->rc);
}

static int later_start(void *arg)
{
    (void)arg;
    if (LS->inline_complete) { /* completion before the function returns */
        atomic_store(&LS->landed, 1);
        cr_assert_eq(wf_taskgraph_complete(LS->m.g, LS->m.node, LS->m.rc), 0);
    } else {
        cr_assert_eq(wf_actor_send(LS->actor, &LS->m.msg), 0);
    }
    return WF_TASK_LATER;
}

static int later_successor(void *arg)
{
    (void)arg;
    if (!atomic_load(&LS->landed))
        atomic_fetch_add(&LS->early, 1);
    atomic_fetch_add(&LS->ran, 1);
    return 0;
}

static int plain(void *arg)
{
    (void)arg;
    return 0;
}

/* later -> a -> b, and an independent node c; 'rc' is the completion's result. */
static void later_graph_runs(wf_runtime *r, bool inline_complete, int rc, int rounds)
{
    later_state st = { .inline_complete = inline_complete };
    LS = &st;
    wf_actor_opts ao = { .handler = later_actor, .name = "later" };
    cr_assert_eq(wf_actor_create(r, &ao, &st.actor), 0);
    wf_taskgraph *g;
    cr_assert_eq(wf_taskgraph_create(r, &g), 0);
    int n0 = wf_taskgraph_add(g, later_start, NULL, "later");
    int n1 = wf_taskgraph_add(g, later_successor, NULL, "a");
    int n2 = wf_taskgraph_add(g, later_successor, NULL, "b");
    int n3 = wf_taskgraph_add(g, plain, NULL, "c");
    cr_assert(n0 >= 0 && n1 >= 0 && n2 >= 0 && n3 >= 0);
    cr_assert_eq(wf_taskgraph_precede(g, n0, n1), 0);
    cr_assert_eq(wf_taskgraph_precede(g, n1, n2), 0);
    st.m = (later_msg){ .g = g, .node = n0, .rc = rc };
    for (int k = 0; k < rounds; k++) {
        atomic_store(&st.landed, 0);
        atomic_store(&st.ran, 0);
        int got = wf_taskgraph_run(g);
        cr_assert_eq(got, rc < 0 ? rc : 0, "round %d: %s: %s", k, wf_err_name(got),
                     wf_taskgraph_errmsg(g));
        cr_assert_eq(atomic_load(&st.ran), rc < 0 ? 0 : 2, "round %d", k);
    }
    cr_assert_eq(atomic_load(&st.early), 0, "a successor ran before the completion");
    wf_taskgraph_destroy(g);
    wf_actor_destroy(st.actor);
    LS = NULL;
}

Test(runtime_internal_devflow, a_later_node_releases_its_successors_only_when_completed)
{
    later_graph_runs(rt, false, 0, 50);
    later_graph_runs(rt1, false, 0, 20); /* one worker: the actor needs it, nobody waits */
}

Test(runtime_internal_devflow, a_completion_before_the_function_returns_finishes_the_node)
{
    later_graph_runs(rt, true, 0, 50);
    later_graph_runs(rt1, true, 0, 20);
}

Test(runtime_internal_devflow, a_failed_completion_cancels_the_successors_with_its_error)
{
    later_graph_runs(rt, false, WF_EIO, 10);
    later_graph_runs(rt, true, WF_EIO, 10);
}

Test(runtime_internal_devflow, completing_a_graph_that_is_not_running_is_einval)
{
    wf_taskgraph *g;
    cr_assert_eq(wf_taskgraph_create(rt, &g), 0);
    cr_assert_geq(wf_taskgraph_add(g, plain, NULL, "x"), 0);
    cr_assert_eq(wf_taskgraph_complete(g, 0, 0), WF_EINVAL);
    cr_assert_eq(wf_taskgraph_complete(g, 5, 0), WF_EINVAL);
    cr_assert_eq(wf_taskgraph_complete(NULL, 0, 0), WF_EINVAL);
    wf_taskgraph_destroy(g);
}

/* ---- Sessions on simulated devices ----------------------------------------------------- */

enum { M = 24, K = 20, N = 18 };

static float XS[M * K], WS[K * N];

static void fill(void)
{
    for (int i = 0; i < M * K; i++)
        XS[i] = (float)((i * 29) % 17) / 8.0f - 1.0f;
    for (int i = 0; i < K * N; i++)
        WS[i] = (float)((i * 13) % 19) / 9.0f - 1.0f;
}

/* A session of 'g' whose runtime has 'n_sim' simulated devices after its own, which fail
 * their 'fail_alloc'-th allocation and fault at their 'fail_notice'-th completion (0:
 * never; devices/device.h: wf__sim_opts). */
static wf_session *sim_session_failing(wf_graph *g, uint32_t flags, int device, int n_sim,
                                       uint32_t delay_us, int64_t fail_alloc, int64_t fail_notice)
{
    wf_session *s = NULL;
    int rc = wf_session_create(g, &(wf_session_opts){ .flags = flags, .device = device }, &s);
    cr_assert_eq(rc, 0, "%s", wf_graph_errmsg(g));
    s->n_sim = n_sim;
    s->sim_delay_us = delay_us;
    s->sim_fail_alloc = fail_alloc;
    s->sim_fail_notice = fail_notice;
    return s;
}

/* A session of 'g' whose runtime has 'n_sim' simulated devices after its own. */
static wf_session *sim_session(wf_graph *g, uint32_t flags, int device, int n_sim,
                               uint32_t delay_us)
{
    return sim_session_failing(g, flags, device, n_sim, delay_us, 0, 0);
}

/* The id of simulated device 'k'. */
static int sim_id(int k)
{
    return wf_device_count(rt) + k;
}

typedef struct chain {
    wf_graph *g;
    wf_node *x, *h, *r, *y, *z;
} chain;

/* h = x @ w, r = relu(h), y = r + 1, z = y * h: 'dev' gives each one's device (-1: the
 * session's rule). */
static chain chain_make(wf_runtime *r, const int dev[4])
{
    chain c;
    c.g = wf_graph_create(r, WF_STATIC);
    c.x = wf_placeholder(c.g, "x", WF_F32, WF_SHAPE(M, K));
    wf_node *w = wf_test_const_f32(c.g, WF_SHAPE(K, N), WS);
    c.h = wf_matmul(c.g, c.x, w);
    c.r = wf_relu(c.g, c.h);
    c.y = wf_add(c.g, c.r, wf_scalar(c.g, WF_F32, 1.0));
    c.z = wf_mul(c.g, c.y, c.h);
    cr_assert_not_null(c.z, "%s", wf_graph_errmsg(c.g));
    wf_node *nodes[4] = { c.h, c.r, c.y, c.z };
    for (int i = 0; i < 4; i++)
        cr_assert_eq(wf_node_set_device(nodes[i], dev[i]), 0);
    return c;
}

/* Runs the chain placed by 'dev' 'rounds' times and checks z and h against the CPU's bits. */
static void chain_check(wf_runtime *r, const int dev[4], int n_sim, uint32_t delay_us, int rounds)
{
    fill();
    static const int cpu[4] = { 0, 0, 0, 0 };
    chain ref = chain_make(r, cpu);
    chain c = chain_make(r, dev);
    wf_session *s0 = sim_session(ref.g, WF_SESSION_NO_PASSES, -1, 0, 0);
    wf_session *s = sim_session(c.g, WF_SESSION_NO_PASSES, -1, n_sim, delay_us);
    wf_tensor *xv = wf_test_f32(WF_SHAPE(M, K), XS);
    wf_tensor *want[2];
    wf_test_run(s0, &(wf_feed){ ref.x, xv }, 1, (wf_node *[]){ ref.z, ref.h }, 2, want, NULL, 0);
    for (int k = 0; k < rounds; k++) {
        wf_tensor *got[2];
        wf_test_run(s, &(wf_feed){ c.x, xv }, 1, (wf_node *[]){ c.z, c.h }, 2, got, NULL, 0);
        for (int j = 0; j < 2; j++) {
            cr_assert(wf_test_same_bits(got[j], want[j]), "round %d: fetch %d differs", k, j);
            wf_tensor_release(got[j]);
        }
    }
    wf_tensor_release(want[0]);
    wf_tensor_release(want[1]);
    wf_tensor_release(xv);
    wf_session_destroy(s);
    wf_session_destroy(s0);
    wf_graph_destroy(c.g);
    wf_graph_destroy(ref.g);
}

/* The plan of the only set of fetches 's' has run. */
static wf__plan *only_plan(wf_session *s)
{
    cr_assert_not_null(s->plans);
    cr_assert_null(s->plans->next);
    return s->plans;
}

Test(runtime_internal_devflow, host_and_device_crossings_become_one_copy_node_each)
{
    fill();
    int a = sim_id(0);
    /* h on the device, r on the host, y on the device, z on the host. */
    chain c = chain_make(rt, (int[]){ a, 0, a, 0 });
    wf_session *s = sim_session(c.g, WF_SESSION_NO_PASSES, -1, 1, 0);
    wf_tensor *xv = wf_test_f32(WF_SHAPE(M, K), XS), *out = NULL;
    wf_test_run(s, &(wf_feed){ c.x, xv }, 1, &c.z, 1, &out, NULL, 0);
    wf__plan *p = only_plan(s);
    const wf__plan_dev *pd = p->dev;
    cr_assert_not_null(pd);
    /* To the device: x and w (read by h), r and the scalar 1 (read by y); to the host: h
     * (read by r and z: one copy for both) and y (read by z). z is on the host already. */
    cr_assert_eq(pd->pl.n_copies, 6, "got %d copies", pd->pl.n_copies);
    int32_t ih = p->index_of[c.h->id], iy = p->index_of[c.y->id], ix = p->index_of[c.x->id];
    int seen_h = 0, seen_y = 0, seen_x = 0;
    for (int k = 0; k < pd->pl.n_copies; k++) {
        const wf__copy *cp = &pd->pl.copies[k];
        cr_assert_neq(cp->from, cp->to);
        cr_assert_eq(cp->from, pd->pl.where[cp->value]);
        /* A node of the plan, right after its value, on its destination. */
        cr_assert_eq(p->kind[cp->at], WF__PN_COPY);
        cr_assert_eq(p->nodes[cp->at]->op, &wf_op_copy);
        cr_assert_gt(cp->at, cp->value);
        cr_assert_eq(pd->pl.where[cp->at], cp->to);
        cr_assert_eq(p->in_idx[p->in_off[cp->at]], cp->value);
        seen_h += cp->value == ih && cp->to == 0;
        seen_y += cp->value == iy && cp->to == 0;
        seen_x += cp->value == ix && cp->to == a;
    }
    cr_assert(seen_h == 1 && seen_y == 1 && seen_x == 1);
    /* Each reader reads the copy (a plan node), not the value's node; the task graph has
     * the plan's nodes and no others. */
    int32_t iz = p->index_of[c.z->id];
    for (int32_t e = p->in_off[iz]; e < p->in_off[iz + 1]; e++)
        cr_assert_eq(p->kind[p->in_idx[e]], WF__PN_COPY, "z reads a copy");
    cr_assert_not_null(p->all_slots[0]);
    cr_assert_eq(wf_taskgraph_node_count(p->all_slots[0]->tg), p->n);
    wf_tensor_release(out);
    wf_tensor_release(xv);
    wf_session_destroy(s);
    wf_graph_destroy(c.g);
}

Test(runtime_internal_devflow, host_device_ping_pong_gives_the_cpu_bits)
{
    int a = sim_id(0);
    chain_check(rt, (int[]){ a, 0, a, 0 }, 1, 200, 20);
}

Test(runtime_internal_devflow, everything_on_the_device_fetches_through_copies)
{
    int a = sim_id(0);
    chain_check(rt, (int[]){ a, a, a, a }, 1, 200, 20);
}

Test(runtime_internal_devflow, device_to_device_copies_give_the_cpu_bits)
{
    int a = sim_id(0), b = sim_id(1);
    chain_check(rt, (int[]){ a, b, a, b }, 2, 100, 20);
}

Test(runtime_internal_devflow, a_value_read_on_two_devices_is_copied_to_each)
{
    int a = sim_id(0), b = sim_id(1);
    /* h (on a) is read by r on b and by z on the host; x goes to a only. */
    chain_check(rt, (int[]){ a, b, 0, 0 }, 2, 100, 10);
    chain_check(rt, (int[]){ 0, a, b, a }, 2, 100, 10);
}

Test(runtime_internal_devflow, one_worker_runs_device_copies_without_waiting_for_them)
{
    /* With one worker, a task that waited for a copy to the host would hold the only worker
     * the device's actor could complete it on. */
    int a = sim_id(0);
    chain_check(rt1, (int[]){ a, 0, a, 0 }, 1, 500, 10);
}

typedef struct runner {
    wf_session *s;
    chain *c;
    wf_tensor *xv, *want;
    int bad;
} runner;

static void *run_many(void *arg)
{
    runner *r = arg;
    for (int k = 0; k < 15; k++) {
        wf_tensor *got = NULL;
        int rc = wf_session_run(r->s, &(wf_feed){ r->c->x, r->xv }, 1, &r->c->z, 1, &got, NULL, 0);
        if (rc < 0 || !wf_test_same_bits(got, r->want))
            r->bad++;
        wf_tensor_release(got);
    }
    return NULL;
}

Test(runtime_internal_devflow, concurrent_runs_keep_their_copies_apart)
{
    fill();
    int a = sim_id(0), b = sim_id(1);
    chain ref = chain_make(rt, (int[]){ 0, 0, 0, 0 });
    chain c = chain_make(rt, (int[]){ a, 0, b, a });
    wf_session *s0 = sim_session(ref.g, 0, -1, 0, 0);
    wf_session *s = sim_session(c.g, 0, -1, 2, 50);
    wf_tensor *xv = wf_test_f32(WF_SHAPE(M, K), XS), *want;
    wf_test_run(s0, &(wf_feed){ ref.x, xv }, 1, &ref.z, 1, &want, NULL, 0);
    runner rs[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        rs[i] = (runner){ s, &c, xv, want, 0 };
        cr_assert_eq(pthread_create(&th[i], NULL, run_many, &rs[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        cr_assert_eq(rs[i].bad, 0, "thread %d: %d bad runs (%s)", i, rs[i].bad,
                     wf_session_errmsg(s));
    }
    wf_tensor_release(want);
    wf_tensor_release(xv);
    wf_session_destroy(s);
    wf_session_destroy(s0);
    wf_graph_destroy(c.g);
    wf_graph_destroy(ref.g);
}

Test(runtime_internal_devflow, a_target_on_a_device_that_nobody_reads_runs_and_copies_nothing)
{
    fill();
    int a = sim_id(0);
    chain c = chain_make(rt, (int[]){ a, a, a, a });
    wf_session *s = sim_session(c.g, WF_SESSION_NO_PASSES, -1, 1, 100);
    wf_tensor *xv = wf_test_f32(WF_SHAPE(M, K), XS), *out = NULL;
    for (int k = 0; k < 5; k++) {
        wf_test_run(s, &(wf_feed){ c.x, xv }, 1, NULL, 0, NULL, &c.z, 1);
        wf_test_run(s, &(wf_feed){ c.x, xv }, 1, &c.y, 1, &out, &c.z, 1);
        cr_assert_eq(wf_tensor_data_f32(out)[0], fmaxf(wf_tensor_data_f32(out)[0] - 1, 0) + 1);
        wf_tensor_release(out);
    }
    wf_tensor_release(xv);
    wf_session_destroy(s);
    wf_graph_destroy(c.g);
}

/* A small MLP training step with SGD: the rule places forward, backward and the updates on
 * the device, where the variables stay (resident: runtime/var_device.c). Losses and weights
 * match the CPU's bit for bit. */
static void train(wf_runtime *r, int n_sim, int steps, float *losses, wf_tensor **w_out)
{
    enum { B = 32, D = 24, H = 20, C = 10 };

    wf_graph *g = wf_graph_create(r, WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(B, D));
    wf_node *w1 = wf_variable(g, "w1", WF_F32, WF_SHAPE(D, H), wf_init_uniform(7, -0.5, 0.5));
    wf_node *w2 = wf_variable(g, "w2", WF_F32, WF_SHAPE(H, C), wf_init_uniform(8, -0.5, 0.5));
    wf_node *hid = wf_relu(g, wf_matmul(g, x, w1));
    wf_node *out = wf_matmul(g, hid, w2);
    wf_node *loss = wf_mean(g, wf_mul(g, out, out));
    wf_node *step = wf_minimize(g, wf_sgd(0.05), loss);
    cr_assert_not_null(step, "%s", wf_graph_errmsg(g));
    /* The rule's default (0) prefers device 1: a simulated one only without a real GPU. */
    int rule = n_sim && wf_device_count(r) > 1 ? sim_id(0) : 0;
    wf_session *s = sim_session(g, 0, rule, n_sim, 20);
    static float xs[B * D];
    for (int i = 0; i < B * D; i++)
        xs[i] = (float)((i * 37) % 23) / 11.0f - 1.0f;
    wf_tensor *xv = wf_test_f32(WF_SHAPE(B, D), xs);
    for (int k = 0; k < steps; k++) {
        wf_tensor *lv = NULL;
        wf_test_run(s, &(wf_feed){ x, xv }, 1, &loss, 1, &lv, &step, 1);
        losses[k] = wf_tensor_data_f32(lv)[0];
        wf_tensor_release(lv);
    }
    if (n_sim) { /* the rule put kernels, updates and variables on the device */
        wf__plan *p = s->plans;
        cr_assert_not_null(p->dev);
        cr_assert_gt(p->dev->pl.n_gpu, 0);
        for (int i = 0; i < p->n; i++)
            if (p->kind[i] == WF__PN_VARIABLE ||
                (p->kind[i] == WF__PN_KERNEL && p->nodes[i]->op->n_assign > 0))
                cr_assert_eq(p->dev->pl.where[i], sim_id(0), "'%s'", p->nodes[i]->name);
    }
    cr_assert_eq(wf_session_variable(s, w1, w_out), 0);
    wf_tensor_release(xv);
    wf_session_destroy(s);
    wf_graph_destroy(g);
}

Test(runtime_internal_devflow, a_training_step_placed_by_the_rule_matches_the_cpu)
{
    enum { STEPS = 4 };

    float want[STEPS], got[STEPS];
    wf_tensor *w_cpu, *w_dev;
    train(rt, 0, STEPS, want, &w_cpu);
    train(rt, 1, STEPS, got, &w_dev);
    for (int k = 0; k < STEPS; k++)
        cr_assert_eq(got[k], want[k], "step %d: loss %.9g on the device, %.9g on the cpu", k,
                     got[k], want[k]);
    cr_assert_lt(want[STEPS - 1], want[0], "the loss goes down");
    cr_assert(wf_test_same_bits(w_dev, w_cpu));
    wf_tensor_release(w_cpu);
    wf_tensor_release(w_dev);
}

Test(runtime_internal_devflow, placement_errors_name_the_node_and_the_simulated_device)
{
    fill();
    int a = sim_id(0);
    chain c = chain_make(rt, (int[]){ a + 1, 0, 0, 0 }); /* one device too far */
    wf_session *s = sim_session(c.g, WF_SESSION_NO_PASSES, -1, 1, 0);
    wf_tensor *xv = wf_test_f32(WF_SHAPE(M, K), XS), *out = NULL;
    int rc = wf_session_run(s, &(wf_feed){ c.x, xv }, 1, &c.z, 1, &out, NULL, 0);
    cr_assert_eq(rc, WF_EINVAL, "%s", wf_err_name(rc));
    cr_assert(strstr(wf_session_errmsg(s), "matmul") && strstr(wf_session_errmsg(s), "device"),
              "%s", wf_session_errmsg(s));
    wf_session_destroy(s);
    wf_graph_destroy(c.g);

    /* An update placed on a device, of a variable also read on the host: refused (a variable
     * updated on a device lives there). */
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *v = wf_variable(g, "v", WF_F32, WF_SHAPE(M, K), wf_init_zeros());
    wf_node *ph = wf_placeholder(g, "g", WF_F32, WF_SHAPE(M, K));
    wf_node *up = wf_minimize(g, wf_sgd(0.1), wf_mean(g, wf_mul(g, v, ph)));
    cr_assert_not_null(up, "%s", wf_graph_errmsg(g));
    wf_node *upd = NULL;
    for (int i = 0; i < wf_graph_node_count(g); i++) {
        wf_node *n = wf_graph_node(g, i);
        if (n->op && n->op->n_assign > 0 && !upd)
            upd = n; /* the update of v (the step counter's increment comes after it) */
    }
    cr_assert_not_null(upd);
    cr_assert_eq(wf_node_set_device(upd, a), 0);
    s = sim_session(g, WF_SESSION_NO_PASSES, -1, 1, 0);
    rc = wf_session_run(s, &(wf_feed){ ph, xv }, 1, NULL, 0, NULL, &up, 1);
    cr_assert_eq(rc, WF_ENOSYS, "%s: %s", wf_err_name(rc), wf_session_errmsg(s));
    cr_assert(strstr(wf_session_errmsg(s), "sim:0") &&
                  strstr(wf_session_errmsg(s), "variable 'v', which is also read on cpu:0"),
              "%s", wf_session_errmsg(s));
    wf_tensor_release(xv);
    wf_session_destroy(s);
    wf_graph_destroy(g);
}

Test(runtime_internal_devflow, a_failed_device_allocation_names_node_and_device_then_runs_again)
{
    fill();
    int a = sim_id(0);
    static const int cpu[4] = { 0, 0, 0, 0 };
    chain ref = chain_make(rt, cpu);
    wf_session *s0 = sim_session(ref.g, WF_SESSION_NO_PASSES, -1, 0, 0);
    wf_tensor *xv = wf_test_f32(WF_SHAPE(M, K), XS), *want = NULL;
    wf_test_run(s0, &(wf_feed){ ref.x, xv }, 1, &ref.z, 1, &want, NULL, 0);
    /* All on the device, a run allocates there: copies of x, w and 1, then h, r, y, z. */
    for (int64_t k = 1; k <= 7; k++) {
        chain c = chain_make(rt, (int[]){ a, a, a, a });
        wf_session *s = sim_session_failing(c.g, WF_SESSION_NO_PASSES, -1, 1, 20, k, 0);
        wf_tensor *out = NULL;
        int rc = wf_session_run(s, &(wf_feed){ c.x, xv }, 1, &c.z, 1, &out, NULL, 0);
        cr_assert_eq(rc, WF_ENOMEM, "allocation %lld: %s: %s", (long long)k, wf_err_name(rc),
                     wf_session_errmsg(s));
        cr_assert_null(out);
        const char *msg = wf_session_errmsg(s);
        cr_assert(strstr(msg, "sim:0") && strstr(msg, "' ("), /* "<op> '<name>' (file:line)" */
                  "allocation %lld: the message names no node or device: %s", (long long)k, msg);
        /* Only that allocation fails: the session runs on, with the CPU's bits. */
        wf_test_run(s, &(wf_feed){ c.x, xv }, 1, &c.z, 1, &out, NULL, 0);
        cr_assert(wf_test_same_bits(out, want), "allocation %lld", (long long)k);
        wf_tensor_release(out);
        wf_session_destroy(s);
        wf_graph_destroy(c.g);
    }
    wf_tensor_release(want);
    wf_tensor_release(xv);
    wf_session_destroy(s0);
    wf_graph_destroy(ref.g);
}

Test(runtime_internal_devflow, a_device_fault_fails_the_copy_to_the_host_and_never_hangs)
{
    fill();
    int a = sim_id(0);
    for (int64_t k = 1; k <= 3; k++) {
        chain c = chain_make(rt, (int[]){ a, 0, a, 0 });
        wf_session *s = sim_session_failing(c.g, WF_SESSION_NO_PASSES, -1, 1, 50, 0, k);
        wf_tensor *xv = wf_test_f32(WF_SHAPE(M, K), XS), *out = NULL;
        /* A fault is sticky, as a CUDA fault: this run and the next one fail. */
        for (int round = 0; round < 2; round++) {
            int rc = wf_session_run(s, &(wf_feed){ c.x, xv }, 1, &c.z, 1, &out, NULL, 0);
            cr_assert_eq(rc, WF_EDEVICE, "fault %lld, round %d: %s: %s", (long long)k, round,
                         wf_err_name(rc), wf_session_errmsg(s));
            cr_assert_null(out);
            const char *msg = wf_session_errmsg(s);
            cr_assert(strstr(msg, "copying its value from sim:0 to the host") &&
                          strstr(msg, "simulated device fault"),
                      "%s", msg);
        }
        wf_tensor_release(xv);
        wf_session_destroy(s);
        wf_graph_destroy(c.g);
    }
}

/* ---- Variables resident on a device (runtime/var_device.c) ------------------------------ */

/* An MLP: out = relu(x @ w1 + b1) @ w2, loss = mean(out * out), trained by 'opt'; 'ev' is
 * the same forward pass again, every node of it placed on the CPU (an evaluation plan that
 * reads the variables on the host). */
typedef struct mlp {
    wf_graph *g;
    wf_node *x, *w1, *b1, *w2, *out, *loss, *step, *ev;
} mlp;

enum { MB = 32, MD = 24, MH = 20, MC = 10 };

static float MX[MB * MD];

static mlp mlp_make(wf_runtime *r, wf_optimizer opt)
{
    for (int i = 0; i < MB * MD; i++)
        MX[i] = (float)((i * 37) % 23) / 11.0f - 1.0f;
    mlp m;
    m.g = wf_graph_create(r, WF_STATIC);
    m.x = wf_placeholder(m.g, "x", WF_F32, WF_SHAPE(MB, MD));
    m.w1 = wf_variable(m.g, "w1", WF_F32, WF_SHAPE(MD, MH), wf_init_uniform(7, -0.5, 0.5));
    m.b1 = wf_variable(m.g, "b1", WF_F32, WF_SHAPE(MH), wf_init_uniform(9, -0.1, 0.1));
    m.w2 = wf_variable(m.g, "w2", WF_F32, WF_SHAPE(MH, MC), wf_init_uniform(8, -0.5, 0.5));
    wf_node *hid = wf_relu(m.g, wf_add(m.g, wf_matmul(m.g, m.x, m.w1), m.b1));
    m.out = wf_matmul(m.g, hid, m.w2);
    m.loss = wf_mean(m.g, wf_mul(m.g, m.out, m.out));
    m.step = wf_minimize(m.g, opt, m.loss);
    cr_assert_not_null(m.step, "%s", wf_graph_errmsg(m.g));
    wf_node *mm = wf_matmul(m.g, m.x, m.w1), *ad = wf_add(m.g, mm, m.b1), *re = wf_relu(m.g, ad);
    m.ev = wf_matmul(m.g, re, m.w2);
    cr_assert_not_null(m.ev, "%s", wf_graph_errmsg(m.g));
    wf_node *cpu[] = { mm, ad, re, m.ev };
    for (int i = 0; i < 4; i++)
        cr_assert_eq(wf_node_set_device(cpu[i], 0), 0);
    return m;
}

/* A session of 'm' on the CPU ('n_sim' 0) or with the rule placing it on sim:0. */
static wf_session *mlp_session(const mlp *m, uint32_t flags, int n_sim, int64_t fail_alloc)
{
    int rule = n_sim && wf_device_count(rt) > 1 ? sim_id(0) : (n_sim ? 0 : -1);
    return sim_session_failing(m->g, flags, rule, n_sim, 10, fail_alloc, 0);
}

/* 'steps' training steps of 's'; the losses into 'losses' when not NULL. */
static void mlp_train(wf_session *s, const mlp *m, int steps, float *losses)
{
    wf_tensor *xv = wf_test_f32(WF_SHAPE(MB, MD), MX);
    for (int k = 0; k < steps; k++) {
        wf_tensor *lv = NULL;
        wf_test_run(s, &(wf_feed){ m->x, xv }, 1, &m->loss, 1, &lv, &m->step, 1);
        if (losses)
            losses[k] = wf_tensor_data_f32(lv)[0];
        wf_tensor_release(lv);
    }
    wf_tensor_release(xv);
}

/* Fetches 'node' (with x fed) from 's'. */
static wf_tensor *mlp_fetch(wf_session *s, const mlp *m, wf_node *node)
{
    wf_tensor *xv = wf_test_f32(WF_SHAPE(MB, MD), MX), *out = NULL;
    wf_test_run(s, &(wf_feed){ m->x, xv }, 1, &node, 1, &out, NULL, 0);
    wf_tensor_release(xv);
    return out;
}

/* Checks that every variable of the graph (weights, optimizer state, step counters) has the
 * same bits in 'a' and 'b' (wf_session_variable(), which copies device values back). */
static void same_variables(wf_session *a, wf_session *b, const mlp *m, const char *what)
{
    int n = 0;
    for (int id = 0; id < wf_graph_node_count(m->g); id++) {
        wf_node *v = wf_graph_node(m->g, id);
        if (v->op != &wf_op_variable)
            continue;
        wf_tensor *x = NULL, *y = NULL;
        cr_assert_eq(wf_session_variable(a, v, &x), 0, "%s", wf_session_errmsg(a));
        cr_assert_eq(wf_session_variable(b, v, &y), 0, "%s", wf_session_errmsg(b));
        cr_assert(wf_test_same_bits(x, y), "%s: variable '%s' differs", what, v->name);
        wf_tensor_release(x);
        wf_tensor_release(y);
        n++;
    }
    cr_assert_geq(n, 4, "%s: only %d variables", what, n);
}

/* The training plan of 's' (the one whose key holds 'm->step'). */
static wf__plan *plan_of(wf_session *s, const wf_node *target)
{
    for (wf__plan *p = s->plans; p; p = p->next)
        for (int k = 0; k < p->n_key; k++)
            if (p->key[k] == target->id)
                return p;
    cr_assert_fail("no plan has node %d", target->id);
    return NULL;
}

/* Whether plan node 'i' is an update (an optimizer's, or the step counter's increment). */
static bool is_update(const wf__plan *p, int i)
{
    return p->kind[i] == WF__PN_KERNEL && p->nodes[i]->op->n_assign > 0;
}

/* Checks the placement of training plan 'p': every variable resident on 'dev', every update
 * there, no copy step of a variable, and no copy to the host of a value an update reads (a
 * gradient). Returns the number of resident variables. */
static int check_resident_plan(const wf__plan *p, int dev)
{
    const wf__plan_dev *pd = p->dev;
    cr_assert_not_null(pd);
    int n_vars = 0, n_upd = 0;
    for (int i = 0; i < p->n; i++) {
        if (p->kind[i] == WF__PN_VARIABLE) {
            cr_assert_eq(pd->pl.where[i], dev, "variable '%s' is on device %d", p->nodes[i]->name,
                         pd->pl.where[i]);
            n_vars++;
        }
        if (is_update(p, i)) {
            cr_assert_eq(pd->pl.where[i], dev, "update '%s' (%s) is on device %d",
                         p->nodes[i]->name, p->nodes[i]->op->name, pd->pl.where[i]);
            n_upd++;
        }
    }
    cr_assert_eq(pd->pl.n_resident, n_vars);
    cr_assert_gt(n_upd, 0);
    for (int c = 0; c < pd->pl.n_copies; c++) {
        const wf__copy *cp = &pd->pl.copies[c];
        bool fetched = false; /* a fetch of it is copied to the host, after the step */
        for (int k = 0; k < p->n_key; k++)
            fetched |= p->key[k] == p->nodes[cp->value]->id && cp->to == 0;
        cr_assert(p->kind[cp->value] != WF__PN_VARIABLE || fetched, "variable '%s' is copied",
                  p->nodes[cp->value]->name);
        if (cp->to != 0 || fetched)
            continue;
        for (int i = 0; i < p->n; i++)
            for (int32_t e = p->in_off[i]; is_update(p, i) && e < p->in_off[i + 1]; e++)
                cr_assert_neq(p->in_idx[e], cp->value,
                              "'%s', read by update '%s', goes to the host",
                              p->nodes[cp->value]->name, p->nodes[i]->name);
    }
    return n_vars;
}

/* Trains 'steps' steps with 'opt' and 'flags' on the CPU and on sim:0: losses and every
 * variable bitwise equal, the device plan resident, and no variable copied after step 1. */
static void train_resident_matches_cpu(wf_optimizer opt, uint32_t flags, int steps)
{
    mlp m = mlp_make(rt, opt);
    wf_session *cpu = mlp_session(&m, flags, 0, 0), *dev = mlp_session(&m, flags, 1, 0);
    float want[16], got[16];
    cr_assert_leq(steps, 16);
    mlp_train(cpu, &m, steps, want);
    mlp_train(dev, &m, 1, got);
    int n_res = check_resident_plan(plan_of(dev, m.step), sim_id(0));
    /* Step 1 copied each variable in once; later steps copy none, either way. */
    cr_assert_eq(atomic_load(&dev->var_copies_in), (uint64_t)n_res);
    mlp_train(dev, &m, steps - 1, got + 1);
    cr_assert_eq(atomic_load(&dev->var_copies_in), (uint64_t)n_res);
    cr_assert_eq(atomic_load(&dev->var_copies_out), 0);
    for (int k = 0; k < steps; k++)
        cr_assert_eq(got[k], want[k], "step %d: loss %.9g on the device, %.9g on the cpu", k,
                     got[k], want[k]);
    cr_assert_lt(want[steps - 1], want[0], "the loss goes down");
    same_variables(cpu, dev, &m, "after training");
    cr_assert_eq(atomic_load(&dev->var_copies_out), (uint64_t)n_res, "one copy back each");
    wf_session_destroy(dev);
    wf_session_destroy(cpu);
    wf_graph_destroy(m.g);
}

Test(runtime_internal_devflow, sgd_training_on_a_device_keeps_variables_there_with_the_cpu_bits)
{
    train_resident_matches_cpu(wf_sgd(0.05), 0, 6);                        /* fused */
    train_resident_matches_cpu(wf_sgd(0.05), WF_SESSION_NO_OPTIM_FUSE, 6); /* one per variable */
    train_resident_matches_cpu(wf_momentum(0.05, 0.9, true), 0, 6);
}

Test(runtime_internal_devflow, adam_training_on_a_device_keeps_variables_there_with_the_cpu_bits)
{
    train_resident_matches_cpu(wf_adam(1e-2), 0, 6);
    train_resident_matches_cpu(wf_adam(1e-2), WF_SESSION_NO_OPTIM_FUSE, 6);
    train_resident_matches_cpu(wf_adamw(1e-2, 0.1), 0, 6);
    train_resident_matches_cpu(wf_adamw(1e-2, 0.1), WF_SESSION_NO_OPTIM_FUSE | WF_SESSION_NO_FUSE,
                               6);
}

Test(runtime_internal_devflow, a_variable_read_back_stays_current_on_the_device_too)
{
    mlp m = mlp_make(rt, wf_adam(1e-2));
    wf_session *dev = mlp_session(&m, 0, 1, 0);
    mlp_train(dev, &m, 3, NULL);
    uint64_t in0 = atomic_load(&dev->var_copies_in);
    wf_tensor *a = NULL, *b = NULL;
    cr_assert_eq(wf_session_variable(dev, m.w1, &a), 0, "%s", wf_session_errmsg(dev));
    cr_assert_eq(atomic_load(&dev->var_copies_out), 1);
    cr_assert_eq(wf_session_variable(dev, m.w1, &b), 0); /* both current: no copy */
    cr_assert_eq(atomic_load(&dev->var_copies_out), 1);
    cr_assert_eq(a, b, "the same host value");
    wf_tensor_release(b);
    mlp_train(dev, &m, 1, NULL); /* reading it back left the device value current */
    cr_assert_eq(atomic_load(&dev->var_copies_in), in0);
    cr_assert_eq(wf_session_variable(dev, m.w1, &b), 0);
    cr_assert_eq(atomic_load(&dev->var_copies_out), 2, "trained again: copied back again");
    cr_assert(!wf_test_same_bits(a, b), "the value read before the step never changes");
    wf_tensor_release(a);
    wf_tensor_release(b);
    wf_session_destroy(dev);
    wf_graph_destroy(m.g);
}

Test(runtime_internal_devflow, an_assign_between_device_runs_is_copied_in_once)
{
    mlp m = mlp_make(rt, wf_adam(1e-2));
    wf_session *cpu = mlp_session(&m, 0, 0, 0), *dev = mlp_session(&m, 0, 1, 0);
    mlp_train(cpu, &m, 2, NULL);
    mlp_train(dev, &m, 2, NULL);
    float w[MD * MH];
    for (int i = 0; i < MD * MH; i++)
        w[i] = (float)((i * 11) % 13) / 26.0f - 0.25f;
    wf_tensor *wv = wf_test_f32(WF_SHAPE(MD, MH), w);
    cr_assert_eq(wf_session_assign(cpu, m.w1, wv), 0);
    cr_assert_eq(wf_session_assign(dev, m.w1, wv), 0);
    uint64_t in0 = atomic_load(&dev->var_copies_in), out0 = atomic_load(&dev->var_copies_out);
    wf_tensor *got = NULL; /* the host value is the assigned one, with no copy back */
    cr_assert_eq(wf_session_variable(dev, m.w1, &got), 0);
    cr_assert(wf_test_same_bits(got, wv));
    cr_assert_eq(atomic_load(&dev->var_copies_out), out0);
    wf_tensor_release(got);
    float lc[3], ld[3];
    mlp_train(cpu, &m, 3, lc);
    mlp_train(dev, &m, 3, ld);
    cr_assert_eq(atomic_load(&dev->var_copies_in), in0 + 1, "w1 copied in once");
    for (int k = 0; k < 3; k++)
        cr_assert_eq(ld[k], lc[k], "step %d after the assign", k);
    same_variables(cpu, dev, &m, "after the assign");
    wf_tensor_release(wv);
    wf_session_destroy(dev);
    wf_session_destroy(cpu);
    wf_graph_destroy(m.g);
}

Test(runtime_internal_devflow, a_checkpoint_of_device_training_holds_the_trained_values)
{
    char dir[] = "/tmp/wf-devckpt-XXXXXX", path[64];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/a.safetensors", dir);
    mlp m = mlp_make(rt, wf_adamw(1e-2, 0.05));
    wf_session *cpu = mlp_session(&m, 0, 0, 0), *dev = mlp_session(&m, 0, 1, 0);
    mlp_train(cpu, &m, 3, NULL);
    mlp_train(dev, &m, 3, NULL);
    cr_assert_eq(wf_checkpoint_save(dev, path), 0, "%s", wf_session_errmsg(dev));
    /* The file holds the trained values: a fresh CPU session loads the CPU's bits. */
    wf_session *fresh = mlp_session(&m, 0, 0, 0);
    cr_assert_eq(wf_checkpoint_load(fresh, path, 0), 0, "%s", wf_session_errmsg(fresh));
    same_variables(cpu, fresh, &m, "checkpoint of device training");
    /* Train on, then load it back into the device session: the device values are stale and
     * the next step starts from the checkpoint, as on the CPU. */
    mlp_train(dev, &m, 2, NULL);
    uint64_t in0 = atomic_load(&dev->var_copies_in);
    cr_assert_eq(wf_checkpoint_load(dev, path, 0), 0, "%s", wf_session_errmsg(dev));
    same_variables(fresh, dev, &m, "loaded back");
    float lf[2], ld[2];
    mlp_train(fresh, &m, 2, lf);
    mlp_train(dev, &m, 2, ld);
    cr_assert_eq(ld[0], lf[0]);
    cr_assert_eq(ld[1], lf[1]);
    int n_res = check_resident_plan(plan_of(dev, m.step), sim_id(0));
    cr_assert_eq(atomic_load(&dev->var_copies_in), in0 + (uint64_t)n_res, "each copied in once");
    same_variables(fresh, dev, &m, "trained from the checkpoint");
    remove(path);
    rmdir(dir);
    wf_session_destroy(fresh);
    wf_session_destroy(dev);
    wf_session_destroy(cpu);
    wf_graph_destroy(m.g);
}

Test(runtime_internal_devflow, evaluation_plans_on_the_cpu_and_the_device_see_the_current_values)
{
    /* With every pass: epilogue and fused nodes keep the evaluation's placement on the CPU. */
    mlp m = mlp_make(rt, wf_sgd(0.05));
    uint32_t fl = 0;
    wf_session *cpu = mlp_session(&m, fl, 0, 0), *dev = mlp_session(&m, fl, 1, 0);
    for (int round = 0; round < 3; round++) {
        mlp_train(cpu, &m, 2, NULL);
        mlp_train(dev, &m, 2, NULL);
        wf_tensor *want = mlp_fetch(cpu, &m, m.ev);
        /* On the CPU (every node placed there): the variables are copied back first. */
        uint64_t out0 = atomic_load(&dev->var_copies_out);
        wf_tensor *got = mlp_fetch(dev, &m, m.ev);
        cr_assert(wf_test_same_bits(got, want), "round %d: the CPU plan", round);
        cr_assert_eq(atomic_load(&dev->var_copies_out), out0 + 3, "w1, b1, w2 copied back");
        wf_tensor_release(got);
        /* On the device: the forward pass reads the resident values with no copy. */
        uint64_t in0 = atomic_load(&dev->var_copies_in);
        got = mlp_fetch(dev, &m, m.out);
        wf_tensor *want2 = mlp_fetch(cpu, &m, m.out);
        cr_assert(wf_test_same_bits(got, want2), "round %d: the device plan", round);
        cr_assert_eq(atomic_load(&dev->var_copies_in), in0, "round %d", round);
        wf_tensor_release(got);
        wf_tensor_release(want);
        wf_tensor_release(want2);
    }
    /* Every plan uses the session's one open device. */
    int a = sim_id(0);
    int n_plans = 0;
    for (wf__plan *p = dev->plans; p; p = p->next)
        if (p->dev && p->dev->devs[a]) {
            cr_assert_eq(p->dev->devs[a], dev->devtab.devs[a]);
            n_plans++;
        }
    cr_assert_eq(n_plans, 2, "the training and the device evaluation plans");
    same_variables(cpu, dev, &m, "after evaluations");
    wf_session_destroy(dev);
    wf_session_destroy(cpu);
    wf_graph_destroy(m.g);
}

Test(runtime_internal_devflow, a_failed_device_allocation_for_a_variable_names_it_and_keeps_it)
{
    mlp m = mlp_make(rt, wf_adam(1e-2));
    wf_session *cpu = mlp_session(&m, 0, 0, 0);
    wf_session *init = mlp_session(&m, 0, 0, 0); /* the initial values */
    float want[3];
    mlp_train(cpu, &m, 3, want);
    int named = 0;
    for (int64_t k = 1; k <= 12; k++) {
        wf_session *dev = mlp_session(&m, 0, 1, k);
        wf_tensor *xv = wf_test_f32(WF_SHAPE(MB, MD), MX), *lv = NULL;
        int rc = wf_session_run(dev, &(wf_feed){ m.x, xv }, 1, &m.loss, 1, &lv, &m.step, 1);
        wf_tensor_release(xv);
        if (rc == 0) { /* no allocation failed before the run ended */
            wf_tensor_release(lv);
            wf_session_destroy(dev);
            continue;
        }
        const char *msg = wf_session_errmsg(dev);
        cr_assert_eq(rc, WF_ENOMEM, "allocation %lld: %s: %s", (long long)k, wf_err_name(rc), msg);
        cr_assert(strstr(msg, "sim:0"), "allocation %lld: %s", (long long)k, msg);
        if (strstr(msg, "variable '")) {
            named++;
            cr_assert(strstr(msg, "making its value resident on sim:0") &&
                          strstr(msg, "its host value is unchanged"),
                      "allocation %lld: %s", (long long)k, msg);
            /* Nothing updated, nothing lost: every host value is the initial one. */
            same_variables(init, dev, &m, "after the failed allocation");
            /* And the session trains on, from there, with the CPU's bits. */
            float got[3];
            mlp_train(dev, &m, 3, got);
            for (int j = 0; j < 3; j++)
                cr_assert_eq(got[j], want[j], "allocation %lld, step %d", (long long)k, j);
            same_variables(cpu, dev, &m, "trained after the failed allocation");
        }
        wf_session_destroy(dev);
    }
    cr_assert_gt(named, 0, "no failed allocation was a variable's");
    wf_session_destroy(init);
    wf_session_destroy(cpu);
    wf_graph_destroy(m.g);
}

typedef struct trainer {
    wf_session *s;
    const mlp *m;
    int what; /* 0: train, 1: read variables, 2: evaluate on the CPU */
    int bad;
    char msg[WF_ERRMSG_MAX];
} trainer;

static void *trainer_fn(void *arg)
{
    trainer *t = arg;
    wf_tensor *xv = wf_test_f32(WF_SHAPE(MB, MD), MX);
    for (int k = 0; k < 12; k++) {
        wf_tensor *v = NULL;
        int rc;
        if (t->what == 0)
            rc = wf_session_run(t->s, &(wf_feed){ t->m->x, xv }, 1, &t->m->loss, 1, &v, &t->m->step,
                                1);
        else if (t->what == 1)
            rc = wf_session_variable(t->s, k % 2 ? t->m->w1 : t->m->w2, &v);
        else
            rc = wf_session_run(t->s, &(wf_feed){ t->m->x, xv }, 1, &t->m->ev, 1, &v, NULL, 0);
        if (rc == 0 && !isfinite(wf_tensor_data_f32(v)[0]))
            rc = WF_EINVAL;
        if (rc < 0 && !t->bad++)
            snprintf(t->msg, sizeof t->msg, "%s: %s", wf_err_name(rc), wf_session_errmsg(t->s));
        wf_tensor_release(v);
    }
    wf_tensor_release(xv);
    return NULL;
}

Test(runtime_internal_devflow, concurrent_device_training_and_host_reads_stay_valid)
{
    /* One thread trains on the device while one reads variables back and one evaluates on
     * the CPU (whose run copies them back first): every run succeeds, every value read is
     * finite, and TSan sees no copy back read bytes an update writes. (Two threads training
     * at once, or evaluating on the device during training, race by design, on the host as
     * on a device: runtime/exec.c, take_writable().) */
    mlp m = mlp_make(rt, wf_adam(1e-3));
    wf_session *dev = mlp_session(&m, 0, 1, 0);
    trainer ts[3];
    pthread_t th[3];
    for (int i = 0; i < 3; i++) {
        ts[i] = (trainer){ .s = dev, .m = &m, .what = i };
        cr_assert_eq(pthread_create(&th[i], NULL, trainer_fn, &ts[i]), 0);
    }
    for (int i = 0; i < 3; i++) {
        pthread_join(th[i], NULL);
        cr_assert_eq(ts[i].bad, 0, "thread %d: %d failures (%s)", i, ts[i].bad, ts[i].msg);
    }
    wf_session_destroy(dev);
    wf_graph_destroy(m.g);
}

Test(runtime_internal_devflow, a_resident_variable_fetched_in_its_training_step_has_the_cpu_bits)
{
    /* Fetched with the step that updates it: the value after the update, on the host as on
     * the device (the copy to the host follows the update). */
    mlp m = mlp_make(rt, wf_momentum(0.05, 0.9, false));
    wf_session *cpu = mlp_session(&m, 0, 0, 0), *dev = mlp_session(&m, 0, 1, 0);
    wf_tensor *xv = wf_test_f32(WF_SHAPE(MB, MD), MX);
    wf_node *fetch[2] = { m.loss, m.w2 };
    for (int k = 0; k < 4; k++) {
        wf_tensor *a[2], *b[2];
        wf_test_run(cpu, &(wf_feed){ m.x, xv }, 1, fetch, 2, a, &m.step, 1);
        wf_test_run(dev, &(wf_feed){ m.x, xv }, 1, fetch, 2, b, &m.step, 1);
        for (int j = 0; j < 2; j++) {
            cr_assert(wf_test_same_bits(a[j], b[j]), "step %d, fetch %d", k, j);
            wf_tensor_release(a[j]);
            wf_tensor_release(b[j]);
        }
    }
    check_resident_plan(plan_of(dev, m.step), sim_id(0));
    same_variables(cpu, dev, &m, "after fetching w2");
    wf_tensor_release(xv);
    wf_session_destroy(dev);
    wf_session_destroy(cpu);
    wf_graph_destroy(m.g);
}

Test(runtime_internal_devflow, a_variable_resident_on_two_devices_in_turn_moves_between_them)
{
    /* Training on sim:0, an evaluation placed on sim:1: the latest value goes from device to
     * device (no host copy in between) each time, with the CPU's bits. */
    mlp m = mlp_make(rt, wf_sgd(0.05));
    int a = sim_id(0), b = sim_id(1);
    wf_node *mm = m.ev->inputs[0]->inputs[0]->inputs[0]; /* ev = relu(mm + b1) @ w2 */
    wf_node *ev_nodes[] = { mm, m.ev->inputs[0]->inputs[0], m.ev->inputs[0], m.ev };
    for (int i = 0; i < 4; i++)
        cr_assert_eq(wf_node_set_device(ev_nodes[i], b), 0);
    uint32_t fl = 0; /* epilogue nodes keep sim:1 (pass_epilogue.c); fusion leaves them alone */
    /* The reference trains on the CPU (its evaluation, on sim:1 too, copies in each time). */
    wf_session *cpu = sim_session_failing(m.g, fl, -1, 2, 10, 0, 0);
    wf_session *dev = sim_session_failing(m.g, fl, wf_device_count(rt) > 1 ? a : 0, 2, 10, 0, 0);
    for (int round = 0; round < 3; round++) {
        mlp_train(cpu, &m, 2, NULL);
        mlp_train(dev, &m, 2, NULL);
        uint64_t out0 = atomic_load(&dev->var_copies_out);
        wf_tensor *want = mlp_fetch(cpu, &m, m.ev), *got = mlp_fetch(dev, &m, m.ev);
        cr_assert(wf_test_same_bits(got, want), "round %d", round);
        cr_assert_eq(atomic_load(&dev->var_copies_out), out0, "round %d: no copy to the host",
                     round);
        wf_tensor_release(got);
        wf_tensor_release(want);
    }
    wf__plan *ev = plan_of(dev, m.ev);
    for (int i = 0; i < ev->n; i++)
        if (ev->kind[i] == WF__PN_VARIABLE)
            cr_assert_eq(ev->dev->pl.where[i], b, "'%s'", ev->nodes[i]->name);
    check_resident_plan(plan_of(dev, m.step), a);
    same_variables(cpu, dev, &m, "after moving between devices");
    wf_session_destroy(dev);
    wf_session_destroy(cpu);
    wf_graph_destroy(m.g);
}
