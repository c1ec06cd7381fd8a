/* tests/placement/test_cluster.c: the cluster description and the small pure parts around
 * it: device strings ("rank:1/cpu:0", "cuda:1", "rank:0/gpu:0") found or refused with the
 * part named, default and set links, a link's latency and bandwidth from two ping-pong
 * sizes (exact on a synthetic link, refused on nonsense), the cost table keyed by op and
 * shapes and device kind (layers of one signature share an entry; measured times override
 * the flops/bytes prior), and the (step, micro-batch, edge) transfer keys (distinct tuples
 * give distinct keys, out-of-range fields are refused). */
#include "wf_test.h"

#include <weft/weft.h>

#include <criterion/criterion.h>

#include <math.h>
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

TestSuite(placement_cluster, .init = setup, .fini = teardown, .timeout = WF_TEST_TIMEOUT(30));

static wf_cluster *two_ranks(void)
{
    wf_cluster *c;
    cr_assert_eq(wf_cluster_create(&c), 0);
    wf_cluster_device d[] = { { .rank = 0, .kind = WF_PLACE_CPU },
                              { .rank = 0, .kind = WF_PLACE_CUDA, .index = 0 },
                              { .rank = 1, .kind = WF_PLACE_CPU },
                              { .rank = 1, .kind = WF_PLACE_CUDA, .index = 1 } };
    for (int i = 0; i < 4; i++)
        cr_assert_eq(wf_cluster_add_device(c, &d[i]), i, "%s", wf_last_errmsg());
    return c;
}

Test(placement_cluster, device_strings_are_found_or_refused_naming_the_part)
{
    wf_cluster *c = two_ranks();
    cr_assert_eq(wf_cluster_find(c, "rank:1/cpu:0"), 2);
    cr_assert_eq(wf_cluster_find(c, "rank:1/cuda:1"), 3);
    cr_assert_eq(wf_cluster_find(c, "rank:0/gpu:0"), 1);
    cr_assert_eq(wf_cluster_find(c, "cuda:0"), 1);
    cr_assert_eq(wf_cluster_find(c, "cpu:0"), 0);
    cr_assert_eq(wf_cluster_find(c, "rank:2/cpu:0"), WF_ENOTFOUND);
    cr_assert(strstr(wf_last_errmsg(), "rank 2 does not exist (the cluster has ranks 0 .. 1)"),
              "%s", wf_last_errmsg());
    cr_assert_eq(wf_cluster_find(c, "rank:1/cuda:0"), WF_ENOTFOUND);
    cr_assert(strstr(wf_last_errmsg(), "rank 1 has no cuda:0"), "%s", wf_last_errmsg());
    const char *bad[] = { "",
                          "rank:1",
                          "rank:1/",
                          "rank:/cpu:0",
                          "cpu",
                          "cpu:x",
                          "cpu:0 ",
                          "rank:1/cpu:0/cpu:1",
                          "rank:-1/cpu:0" };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cr_assert_eq(wf_cluster_find(c, bad[i]), WF_EINVAL, "'%s' accepted", bad[i]);
        cr_assert(strstr(wf_last_errmsg(), "malformed"), "'%s': %s", bad[i], wf_last_errmsg());
    }
    cr_assert_eq(wf_cluster_find(c, "rank:0/npu:0"), WF_EINVAL);
    cr_assert(strstr(wf_last_errmsg(), "unknown device kind 'npu'"), "%s", wf_last_errmsg());
    char buf[32];
    cr_assert_str_eq(wf_cluster_device_name(c, 3, buf, sizeof buf), "rank:1/cuda:1");
    cr_assert_eq(wf_cluster_rank_count(c), 2);
    wf_cluster_destroy(c);
}

Test(placement_cluster, bad_devices_and_links_are_refused)
{
    wf_cluster *c = two_ranks();
    cr_assert_eq(wf_cluster_add_device(c, &(wf_cluster_device){ .rank = 1, .kind = WF_PLACE_CPU }),
                 WF_EINVAL);
    cr_assert(strstr(wf_last_errmsg(), "rank:1/cpu:0 is there already"), "%s", wf_last_errmsg());
    cr_assert_eq(wf_cluster_add_device(c, &(wf_cluster_device){ .rank = -1 }), WF_EINVAL);
    cr_assert_eq(wf_cluster_add_device(c, &(wf_cluster_device){ .kind = 5 }), WF_EINVAL);
    cr_assert_eq(wf_cluster_add_device(c, &(wf_cluster_device){ .rank = 3, .mem_bytes = -1 }),
                 WF_EINVAL);
    cr_assert_eq(wf_cluster_set_link(c, 0, 0, 1e-6, 1e9), WF_EINVAL);
    cr_assert_eq(wf_cluster_set_link(c, 0, 4, 1e-6, 1e9), WF_EINVAL);
    cr_assert_eq(wf_cluster_set_link(c, 0, 1, 1e-6, 0), WF_EINVAL);
    double lat, bw;
    /* defaults: same rank 2 us / 1e10 B/s, across ranks 20 us / 1e9 B/s */
    cr_assert_eq(wf_cluster_get_link(c, 0, 1, &lat, &bw), 0);
    cr_assert(lat == 2e-6 && bw == 1e10);
    cr_assert_eq(wf_cluster_get_link(c, 1, 2, &lat, &bw), 0);
    cr_assert(lat == 2e-5 && bw == 1e9);
    cr_assert_eq(wf_cluster_set_link(c, 2, 1, 5e-6, 3e9), 0);
    cr_assert_eq(wf_cluster_get_link(c, 1, 2, &lat, &bw), 0);
    cr_assert(lat == 5e-6 && bw == 3e9, "links are symmetric");
    wf_cluster_destroy(c);
}

Test(placement_cluster, ping_pong_of_two_sizes_gives_latency_and_bandwidth)
{
    /* a synthetic link: 7 us one way plus 2.5 GB/s */
    double L = 7e-6, B = 2.5e9;
    size_t s1 = 8, s2 = 1 << 20;
    double rtt1 = 2 * (L + s1 / B), rtt2 = 2 * (L + s2 / B);
    double lat, bw;
    cr_assert_eq(wf_cluster_link_from_pingpong(s1, rtt1, s2, rtt2, &lat, &bw), 0);
    cr_assert(fabs(lat - L) < 1e-12 && fabs(bw - B) < 1e-3 * B, "lat %g bw %g", lat, bw);
    cr_assert_eq(wf_cluster_link_from_pingpong(s2, rtt2, s1, rtt1, &lat, &bw), WF_EINVAL);
    cr_assert_eq(wf_cluster_link_from_pingpong(s1, rtt2, s2, rtt1, &lat, &bw), WF_EINVAL);
    cr_assert(strstr(wf_last_errmsg(), "slower"), "%s", wf_last_errmsg());
    cr_assert_eq(wf_cluster_link_from_pingpong(s1, 0, s2, rtt2, &lat, &bw), WF_EINVAL);
}

Test(placement_cluster, cost_table_is_keyed_by_op_shapes_and_kind_and_overrides_the_prior)
{
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(64, 128));
    wf_node *w1 = wf_variable(g, "w1", WF_F32, WF_SHAPE(128, 128), wf_init_zeros());
    wf_node *w2 = wf_variable(g, "w2", WF_F32, WF_SHAPE(128, 128), wf_init_zeros());
    wf_node *w3 = wf_variable(g, "w3", WF_F32, WF_SHAPE(128, 64), wf_init_zeros());
    wf_node *a = wf_matmul(g, x, w1), *b = wf_matmul(g, a, w2), *c3 = wf_matmul(g, b, w3);
    cr_assert_not_null(c3, "%s", wf_graph_errmsg(g));
    wf_cluster_device cpu = { .kind = WF_PLACE_CPU, .flops_per_s = 1e10, .bytes_per_s = 1e12 };
    /* the prior: 2 * 64 * 128 * 128 flops at 1e10 flop/s (compute bound here) */
    double prior = wf_cost_prior(a, &cpu);
    cr_assert(fabs(prior - 2.0 * 64 * 128 * 128 / 1e10) < 1e-15, "prior %g", prior);
    cr_assert_eq(wf_cost_prior(x, &cpu), 0.0);
    wf_cost_table *t;
    cr_assert_eq(wf_cost_table_create(&t), 0);
    cr_assert_eq(wf_cost_table_put(t, a, WF_PLACE_CPU, 3e-4), 0);
    double s = 0;
    cr_assert_eq(wf_cost_table_get(t, b, WF_PLACE_CPU, &s), 1, "same signature shares");
    cr_assert_eq(s, 3e-4);
    cr_assert_eq(wf_cost_table_get(t, c3, WF_PLACE_CPU, &s), 0, "other shapes do not");
    cr_assert_eq(wf_cost_table_get(t, a, WF_PLACE_CUDA, &s), 0, "other kinds do not");
    cr_assert_eq(wf_cost_seconds(t, b, &cpu), 3e-4);
    cr_assert_eq(wf_cost_seconds(t, c3, &cpu), wf_cost_prior(c3, &cpu));
    cr_assert_eq(wf_cost_table_put(t, a, WF_PLACE_CPU, 1e-4), 0);
    cr_assert_eq(wf_cost_table_count(t), 1);
    cr_assert_eq(wf_cost_seconds(t, a, &cpu), 1e-4, "a second put replaces");
    cr_assert_eq(wf_cost_table_put(t, a, WF_PLACE_CPU, -1), WF_EINVAL);
    cr_assert_eq(wf_cost_table_put(t, a, 7, 1), WF_EINVAL);
    cr_assert_eq(wf_cost_table_put(t, a, WF_PLACE_CPU, NAN), WF_EINVAL);
    /* many entries (the table grows) */
    wf_node *h = x;
    for (int i = 0; i < 200; i++) {
        wf_node *r = wf_reshape(g, h, WF_SHAPE(64 * 128 >> (i % 8), 1 << (i % 8)));
        cr_assert_eq(wf_cost_table_put(t, r, WF_PLACE_CPU, i * 1e-6), 0);
    }
    cr_assert_eq(wf_cost_table_count(t), 1 + 8);
    wf_cost_table_destroy(t);
    wf_graph_destroy(g);
}

Test(placement_cluster, transfer_keys_pack_step_micro_batch_and_edge_apart)
{
    uint64_t seen[4 * 8 * 16];
    int n = 0;
    for (uint32_t step = 0; step < 4; step++)
        for (uint32_t mb = 0; mb < 256; mb += 37)
            for (uint32_t e = 0; e < 32768; e += 2341) {
                wf_xfer_key k = { step * 9000u, mb, e }, back;
                uint64_t key;
                cr_assert_eq(wf_xfer_key_pack(&k, &key), 0);
                cr_assert(key < (1ull << 39) && (key & 1) == 0);
                back = wf_xfer_key_unpack(key);
                cr_assert_eq(back.step, (step * 9000u) & 0x7fff);
                cr_assert_eq(back.micro_batch, mb);
                cr_assert_eq(back.edge, e);
                for (int i = 0; i < n; i++)
                    cr_assert_neq(seen[i], key);
                if (n < (int)(sizeof seen / sizeof *seen))
                    seen[n++] = key;
            }
    uint64_t key;
    cr_assert_eq(wf_xfer_key_pack(&(wf_xfer_key){ 0, 256, 0 }, &key), WF_EINVAL);
    cr_assert(strstr(wf_last_errmsg(), "micro-batch 256"), "%s", wf_last_errmsg());
    cr_assert_eq(wf_xfer_key_pack(&(wf_xfer_key){ 0, 0, 32768 }, &key), WF_EINVAL);
    cr_assert(strstr(wf_last_errmsg(), "edge 32768"), "%s", wf_last_errmsg());
}
