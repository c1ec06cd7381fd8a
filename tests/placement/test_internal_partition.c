/* tests/placement/test_internal_partition.c: the partitioned graphs (wf_partition_create):
 * one send/recv pair per (value, destination rank) however many readers it has there, a
 * control edge across ranks as a token pair that the successor is ordered after, names and
 * devices kept, the same edge numbers on both sides; bad input (a device out of range, an
 * update whose variable is on another rank) refused naming the node; and end to end, an MLP
 * with a skip connection split by the planner into 2 stages runs as 2 rank processes over the
 * transport (rank 0 feeds, rank 1 fetches) and gives bit for bit the single-process output.
 * Internal: control edges have no public constructor (core/graph.h's wf__node_add_control). */
#include "../../core/graph.h"
#include "../transport/transport_util.h"

#include <weft/weft.h>

#include <criterion/criterion.h>

#include <string.h>

TestSuite(placement_partition, .timeout = WF_TEST_TIMEOUT(60), .fini = wf_test_fini);

static wf_cluster *two_ranks(void)
{
    wf_cluster *c;
    cr_assert_eq(wf_cluster_create(&c), 0);
    for (int r = 0; r < 2; r++)
        cr_assert_eq(wf_cluster_add_device(c, &(wf_cluster_device){ .rank = r }), r);
    return c;
}

static int count_op(const wf_graph *g, const char *op)
{
    int n = 0;
    for (int i = 0; i < wf_graph_node_count(g); i++)
        n += strcmp(wf_node_op(wf_graph_node(g, i)), op) == 0;
    return n;
}

Test(placement_partition, one_pair_per_value_and_rank_shared_by_every_reader_and_tokens_for_control)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 1, .flags = WF_RT_NO_PIN });
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(4, 8));
    wf_node *a = wf_tanh(g, x);
    wf_node *a2 = wf_relu(g, x);
    wf_node *b = wf_relu(g, a);
    wf_node *c1 = wf_add(g, a, b);
    wf_node *d = wf_mul(g, a, a2);
    wf_node *e = wf_tanh(g, d);
    cr_assert_not_null(e, "%s", wf_graph_errmsg(g));
    cr_assert_eq(wf__node_add_control(e, a2), 0);
    int dev[7];
    for (int i = 0; i < 7; i++)
        dev[i] = 1;
    dev[x->id] = dev[a->id] = dev[a2->id] = 0;
    wf_cluster *cl = two_ranks();
    wf_partition *p;
    cr_assert_eq(wf_partition_create(g, cl, dev, &p), 0, "%s", wf_last_errmsg());
    cr_assert_eq(wf_partition_rank_count(p), 2);
    wf_graph *g0 = wf_partition_graph(p, 0), *g1 = wf_partition_graph(p, 1);
    /* 'a' (read by b, c1, d) and 'a2' (read by d) cross once each; the control edge e after
     * a2 is a third pair */
    cr_assert_eq(wf_partition_edge_count(p), 3);
    cr_assert_eq(count_op(g0, "send"), 3);
    cr_assert_eq(count_op(g1, "recv"), 3);
    cr_assert_eq(count_op(g1, "send") + count_op(g0, "recv"), 0);
    cr_assert_eq(wf_partition_send_count(p, 0), 3);
    cr_assert_eq(wf_partition_send_count(p, 1), 0);
    /* names kept; readers of 'a' on rank 1 read one recv */
    wf_node *b1 = wf_partition_node(p, b), *c11 = wf_partition_node(p, c1);
    wf_node *d1 = wf_partition_node(p, d), *e1 = wf_partition_node(p, e);
    cr_assert_str_eq(wf_node_name(b1), wf_node_name(b));
    cr_assert_eq(wf_node_graph(b1), g1);
    wf_node *ra = wf_node_input(b1, 0);
    cr_assert_str_eq(wf_node_op(ra), "recv");
    cr_assert_eq(wf_node_input(c11, 0), ra);
    cr_assert_eq(wf_node_input(c11, 1), b1);
    cr_assert_eq(wf_node_input(d1, 0), ra);
    wf_node *ra2 = wf_node_input(d1, 1);
    cr_assert_str_eq(wf_node_op(ra2), "recv");
    cr_assert_neq(ra, ra2);
    cr_assert_eq(wf_node_shape(ra).dims[1], 8);
    /* the control edge: e waits for a token receive; the token on rank 0 is after a2 */
    cr_assert_eq(e1->n_control, 1);
    wf_node *tok = e1->control[0];
    cr_assert_str_eq(wf_node_op(tok), "recv");
    cr_assert(strstr(wf_node_name(tok), "token"), "%s", wf_node_name(tok));
    /* edges: the same number on both sides of each pair */
    int matched = 0;
    for (int i = 0; i < wf_partition_send_count(p, 0); i++) {
        wf_node *s = wf_partition_send(p, 0, i);
        cr_assert_eq(s->attrs->peer, 1);
        for (int j = 0; j < wf_graph_node_count(g1); j++) {
            wf_node *r = wf_graph_node(g1, j);
            if (!strcmp(wf_node_op(r), "recv") && r->attrs->edge == s->attrs->edge) {
                cr_assert_eq(r->attrs->peer, 0);
                matched++;
                if (r == tok) {
                    wf_node *t0 = wf_node_input(s, 0);
                    cr_assert_eq(t0->n_control, 1);
                    cr_assert_eq(t0->control[0], wf_partition_node(p, a2));
                }
            }
        }
    }
    cr_assert_eq(matched, 3);
    wf_partition_destroy(p);
    /* an update whose variable is on another rank is refused naming both */
    wf_node *v = wf_variable(g, "v", WF_F32, WF_SHAPE(4, 8), wf_init_zeros());
    wf_node *train = wf_minimize(g, wf_sgd(0.1), wf_sum(g, wf_mul(g, v, e)));
    cr_assert_not_null(train, "%s", wf_graph_errmsg(g));
    int n = wf_graph_node_count(g);
    int *dev2 = malloc(sizeof *dev2 * (size_t)n);
    for (int i = 0; i < n; i++)
        dev2[i] = i < 7 ? dev[i] : 1;
    dev2[v->id] = 0;
    cr_assert_eq(wf_partition_create(g, cl, dev2, &p), WF_EINVAL);
    cr_assert(strstr(wf_last_errmsg(), "updates variable 'v' on rank 0"), "%s", wf_last_errmsg());
    dev2[v->id] = 7;
    cr_assert_eq(wf_partition_create(g, cl, dev2, &p), WF_EINVAL);
    cr_assert(strstr(wf_last_errmsg(), "device 7 is not in 0 .. 1"), "%s", wf_last_errmsg());
    free(dev2);
    wf_cluster_destroy(cl);
    wf_graph_destroy(g);
    wf_runtime_destroy(rt);
}

/* ---- End to end: 2 stages on 2 rank processes -------------------------------------------- */

/* x [4, 16] -> h1 = tanh(x W1) -> h2 = tanh(h1 W2) -> h3 = tanh(h2 W3) -> y = h3 W4 + h1 */
static wf_graph *mlp(wf_runtime *rt, wf_node **x, wf_node **y)
{
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(4, 16));
    wf_node *h = *x, *h1 = NULL;
    for (int i = 0; i < 4; i++) {
        char name[8];
        snprintf(name, sizeof name, "W%d", i + 1);
        wf_node *W = wf_variable(g, name, WF_F32, WF_SHAPE(16, 16),
                                 wf_init_uniform(100 + (uint64_t)i, -0.5, 0.5));
        h = wf_matmul(g, h, W);
        if (i < 3)
            h = wf_tanh(g, h);
        if (i == 0)
            h1 = h;
    }
    *y = wf_add(g, h, h1);
    return g;
}

static float x_value(int i)
{
    return 0.1f * (float)(i % 7) - 0.3f;
}

static int run_reference(wf_runtime *rt, float *out)
{
    wf_node *x, *y;
    wf_graph *g = mlp(rt, &x, &y);
    float xs[64];
    for (int i = 0; i < 64; i++)
        xs[i] = x_value(i);
    wf_session *s = NULL;
    TU_OK(wf_session_create(g, NULL, &s));
    wf_tensor *xt = wf_tensor_from(WF_F32, WF_SHAPE(4, 16), xs), *yt = NULL;
    wf_feed f = { x, xt };
    TU_OK(wf_session_run(s, &f, 1, &y, 1, &yt, NULL, 0));
    TU_OK(wf_tensor_read(yt, WF_F32, out, 64 * sizeof(float)));
    wf_tensor_release(xt);
    wf_tensor_release(yt);
    wf_session_destroy(s);
    wf_graph_destroy(g);
    return 0;
}

static int stage_body(wf_comm *c, int rank, int size, void *arg)
{
    (void)size;
    (void)arg;
    float want[64];
    if (run_reference(tu_rt, want))
        return 1;
    wf_node *x, *y;
    wf_graph *g = mlp(tu_rt, &x, &y);
    wf_cluster *cl = NULL;
    TU_OK(wf_cluster_create(&cl));
    for (int r = 0; r < 2; r++)
        TU_CHECK(wf_cluster_add_device(cl, &(wf_cluster_device){ .rank = r }) == r, "device");
    wf_plan *plan = NULL;
    TU_OK(wf_plan_create(g, cl, &(wf_plan_opts){ .micro_batches = 1 }, &plan));
    int n = wf_graph_node_count(g), dev[64];
    for (int i = 0; i < n; i++)
        dev[i] = wf_plan_stage_device(plan, wf_plan_node_stage(plan, wf_graph_node(g, i)));
    TU_CHECK(dev[x->id] == 0 && dev[y->id] == 1, "x on %d, y on %d", dev[x->id], dev[y->id]);
    wf_partition *p = NULL;
    TU_OK(wf_partition_create(g, cl, dev, &p));
    TU_CHECK(wf_partition_edge_count(p) >= 1, "no pair");
    wf_graph *mine = wf_partition_graph(p, rank);
    wf_session *s = NULL;
    TU_OK(wf_session_create(mine, &(wf_session_opts){ .comm = c }, &s));
    for (int run = 0; run < 3; run++) {
        if (rank == 0) {
            float xs[64];
            for (int i = 0; i < 64; i++)
                xs[i] = x_value(i);
            wf_tensor *xt = wf_tensor_from(WF_F32, WF_SHAPE(4, 16), xs);
            wf_feed f = { wf_partition_node(p, x), xt };
            wf_node *sends[8];
            int ns = wf_partition_send_count(p, 0);
            for (int i = 0; i < ns && i < 8; i++)
                sends[i] = wf_partition_send(p, 0, i);
            int rc = wf_session_run(s, &f, 1, NULL, 0, NULL, sends, ns);
            wf_tensor_release(xt);
            TU_CHECK(rc == 0, "rank 0 run %d: %s", run, wf_session_errmsg(s));
        } else {
            wf_node *yy = wf_partition_node(p, y);
            wf_tensor *yt = NULL;
            int rc = wf_session_run(s, NULL, 0, &yy, 1, &yt, NULL, 0);
            TU_CHECK(rc == 0, "rank 1 run %d: %s", run, wf_session_errmsg(s));
            float got[64];
            TU_OK(wf_tensor_read(yt, WF_F32, got, sizeof got));
            wf_tensor_release(yt);
            TU_CHECK(memcmp(got, want, sizeof got) == 0,
                     "run %d: y differs from one process: "
                     "%.9g vs %.9g",
                     run, got[0], want[0]);
        }
    }
    wf_session_destroy(s);
    wf_partition_destroy(p);
    wf_plan_destroy(plan);
    wf_cluster_destroy(cl);
    wf_graph_destroy(g);
    return 0;
}
TU_REGISTER(stage_body)

Test(placement_partition, a_planned_two_stage_mlp_on_two_ranks_equals_one_process_bit_for_bit)
{
    tu_run t = { .size = 2, .body = stage_body, .timeout_s = WF_TEST_TIMEOUT(40), .with_rt = true };
    tu_start(&t);
    cr_assert(tu_wait(&t), "the ranks did not finish within %.0f s (killed)", t.timeout_s);
    for (int r = 0; r < 2; r++)
        cr_assert(WIFEXITED(t.status[r]) && WEXITSTATUS(t.status[r]) == 0,
                  "rank %d: %s %d (see its stderr)", r,
                  WIFEXITED(t.status[r]) ? "exit status" : "killed by signal",
                  WIFEXITED(t.status[r]) ? WEXITSTATUS(t.status[r]) : WTERMSIG(t.status[r]));
}
