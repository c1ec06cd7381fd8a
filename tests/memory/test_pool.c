/* tests/memory/test_pool.c: host pools: size classes and exact statistics, reuse through
 * the caches, the byte limit (WF_ENOMEM with a message, cached blocks released first, no
 * leak), the fail_after hook, trimming, pool-backed tensors, NUMA binding on a synthetic
 * two-node topology, and many threads (workers and outside threads) allocating and freeing
 * at once without two live blocks overlapping. */
#include "wf_test.h"

#include <weft/weft.h>

#include <criterion/criterion.h>

#include <pthread.h>
#include <stdio.h>
#include <string.h>

static wf_runtime *rt;

static void setup(void)
{
    rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 2 });
}

static void teardown(void)
{
    wf_runtime_destroy(rt);
    rt = NULL;
    wf_test_fini();
}

TestSuite(memory_pool, .init = setup, .fini = teardown, .timeout = WF_TEST_TIMEOUT(60));

static wf_pool *make_pool(const wf_pool_opts *o)
{
    wf_pool *p = NULL;
    int rc = wf_pool_create(rt, o, &p);
    cr_assert_eq(rc, 0, "wf_pool_create: %s: %s", wf_err_name(rc), wf_last_errmsg());
    return p;
}

static wf_pool_stats stats(const wf_pool *p)
{
    wf_pool_stats s;
    cr_assert_eq(wf_pool_get_stats(p, &s), 0);
    return s;
}

static void *must_alloc(wf_pool *p, size_t bytes)
{
    void *b = NULL;
    int rc = wf_pool_alloc(p, bytes, &b);
    cr_assert_eq(rc, 0, "wf_pool_alloc(%zu): %s: %s", bytes, wf_err_name(rc), wf_last_errmsg());
    cr_assert_not_null(b);
    return b;
}

Test(memory_pool, a_new_pool_has_zero_stats_and_node_0)
{
    wf_pool *p = make_pool(NULL);
    wf_pool_stats s = stats(p);
    cr_assert_eq(s.bytes_live + s.bytes_peak + s.bytes_cached + s.bytes_reserved, 0);
    cr_assert_eq(s.allocs + s.frees + s.cache_hits + s.sys_allocs + s.sys_frees + s.failed, 0);
    cr_assert_eq(s.numa, 0);
    cr_assert_eq(s.bound, 0, "one NUMA node: nothing to bind");
    wf_pool_destroy(p);
}

Test(memory_pool, create_rejects_bad_options_with_einval_and_a_message)
{
    wf_pool *p = (wf_pool *)1;
    cr_assert_eq(wf_pool_create(NULL, NULL, &p), WF_EINVAL);
    cr_assert_null(p);
    cr_assert_eq(wf_pool_create(rt, NULL, NULL), WF_EINVAL);
    cr_assert_eq(wf_pool_create(rt, &(wf_pool_opts){ .numa = 5 }, &p), WF_EINVAL);
    cr_assert(strstr(wf_last_errmsg(), "numa is 5"), "message: %s", wf_last_errmsg());
    cr_assert_eq(wf_pool_create(rt, &(wf_pool_opts){ .numa = -2 }, &p), WF_EINVAL);
    cr_assert_eq(wf_pool_create(rt, &(wf_pool_opts){ .flags = 0x80 }, &p), WF_EINVAL);
    cr_assert_eq(wf_pool_create(rt, &(wf_pool_opts){ .fail_after = -1 }, &p), WF_EINVAL);
    cr_assert_null(p);
}

Test(memory_pool, null_arguments_are_einval_or_no_ops)
{
    void *b = (void *)1;
    cr_assert_eq(wf_pool_alloc(NULL, 8, &b), WF_EINVAL);
    cr_assert_null(b);
    wf_pool *p = make_pool(NULL);
    cr_assert_eq(wf_pool_alloc(p, 8, NULL), WF_EINVAL);
    cr_assert_eq(wf_pool_get_stats(p, NULL), WF_EINVAL);
    cr_assert_eq(wf_pool_get_stats(NULL, &(wf_pool_stats){ 0 }), WF_EINVAL);
    cr_assert_eq(wf_pool_trim(NULL), WF_EINVAL);
    wf_pool_free(NULL, b, 8);
    wf_pool_free(p, NULL, 8);
    wf_pool_destroy(NULL);
    cr_assert_eq(stats(p).frees, 0);
    wf_pool_destroy(p);
}

Test(memory_pool, requests_round_up_to_their_size_class)
{
    static const struct {
        size_t ask, got;
    } cases[] = {
        { 0, 64 },
        { 1, 64 },
        { 64, 64 },
        { 65, 128 },
        { 128, 128 },
        { 129, 192 },
        { 192, 192 },
        { 193, 256 },
        { 300, 384 },
        { 385, 512 },
        { 1000, 1024 },
        { 1025, 1536 },
        { 1537, 2048 },
        { 4096, 4096 },
        { 5000, 6144 },
        { 100000, 131072 },
        { 3 << 20, 3 << 20 },
        { (3 << 20) + 1, 4 << 20 },
        { 64 << 20, 64 << 20 },
    };

    wf_pool *p = make_pool(NULL);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        void *b = must_alloc(p, cases[i].ask);
        cr_assert_eq((uintptr_t)b % WF_POOL_ALIGN, 0, "%zu bytes: %p is not 64-byte aligned",
                     cases[i].ask, b);
        memset(b, 0xab, cases[i].ask);
        cr_assert_eq(stats(p).bytes_live, cases[i].got, "%zu bytes: live %llu, expected %zu",
                     cases[i].ask, (unsigned long long)stats(p).bytes_live, cases[i].got);
        wf_pool_free(p, b, cases[i].ask);
        cr_assert_eq(stats(p).bytes_live, 0);
    }
    wf_pool_destroy(p);
}

Test(memory_pool, stats_count_allocations_frees_hits_and_peak_exactly)
{
    wf_pool *p = make_pool(NULL);
    void *a = must_alloc(p, 100);  /* 128 */
    void *b = must_alloc(p, 1000); /* 1024 */
    void *c = must_alloc(p, 100);  /* 128 */
    wf_pool_stats s = stats(p);
    cr_assert_eq(s.bytes_live, 1280);
    cr_assert_eq(s.bytes_peak, 1280);
    cr_assert_eq(s.bytes_reserved, 1280);
    cr_assert_eq(s.allocs, 3);
    cr_assert_eq(s.sys_allocs, 3);
    cr_assert_eq(s.cache_hits, 0);
    cr_assert(a != c);
    wf_pool_free(p, a, 100);
    wf_pool_free(p, b, 1000);
    s = stats(p);
    cr_assert_eq(s.bytes_live, 128);
    cr_assert_eq(s.bytes_cached, 1152);
    cr_assert_eq(s.bytes_peak, 1280);
    cr_assert_eq(s.frees, 2);
    void *d = must_alloc(p, 90); /* reuses a's block */
    cr_assert_eq(d, a, "the freed 128-byte block is reused");
    s = stats(p);
    cr_assert_eq(s.cache_hits, 1);
    cr_assert_eq(s.sys_allocs, 3);
    cr_assert_eq(s.allocs, 4);
    cr_assert_eq(s.bytes_live, 256);
    wf_pool_free(p, c, 100);
    wf_pool_free(p, d, 90);
    s = stats(p);
    cr_assert_eq(s.bytes_live, 0);
    cr_assert_eq(s.frees, 4);
    cr_assert_eq(s.sys_frees, 0, "freed blocks stay cached");
    wf_pool_destroy(p);
}

Test(memory_pool, blocks_above_the_largest_class_go_back_to_the_system_at_once)
{
    wf_pool *p = make_pool(NULL);
    size_t big = WF_POOL_MAX_CLASS + 1;
    char *b = must_alloc(p, big);
    b[0] = 1;
    b[big - 1] = 2;
    wf_pool_stats s = stats(p);
    cr_assert_geq(s.bytes_live, big);
    wf_pool_free(p, b, big);
    s = stats(p);
    cr_assert_eq(s.bytes_live, 0);
    cr_assert_eq(s.bytes_reserved, 0);
    cr_assert_eq(s.sys_frees, 1);
    wf_pool_destroy(p);
}

Test(memory_pool, trim_returns_every_cached_block_to_the_system)
{
    wf_pool *p = make_pool(NULL);
    void *b[10];
    for (int i = 0; i < 10; i++)
        b[i] = must_alloc(p, (size_t)1 << (6 + i));
    for (int i = 0; i < 10; i++)
        wf_pool_free(p, b[i], (size_t)1 << (6 + i));
    wf_pool_stats s = stats(p);
    cr_assert_eq(s.bytes_cached, (1u << 16) - 64);
    cr_assert_eq(wf_pool_trim(p), 0);
    s = stats(p);
    cr_assert_eq(s.bytes_cached, 0);
    cr_assert_eq(s.bytes_reserved, 0);
    cr_assert_eq(s.sys_frees, 10);
    wf_pool_destroy(p);
}

static int trim_in_task(void *arg)
{
    wf_pool *p = arg;
    void *b[8];
    for (int i = 0; i < 8; i++)
        if (wf_pool_alloc(p, 256, &b[i]) < 0)
            return WF_ENOMEM;
    for (int i = 0; i < 8; i++)
        wf_pool_free(p, b[i], 256);
    return 0;
}

Test(memory_pool, trim_also_empties_the_worker_caches)
{
    wf_pool *p = make_pool(NULL);
    wf_group g;
    cr_assert_eq(wf_group_init(&g, rt), 0);
    cr_assert_eq(wf_spawn(&g, trim_in_task, p), 0);
    cr_assert_eq(wf_group_wait(&g), 0);
    wf_group_deinit(&g);
    cr_assert_eq(stats(p).bytes_cached, 8 * 256);
    cr_assert_eq(wf_pool_trim(p), 0);
    cr_assert_eq(stats(p).bytes_reserved, 0);
    wf_pool_destroy(p);
}

Test(memory_pool, the_limit_gives_enomem_with_a_message_and_leaks_nothing)
{
    wf_pool *p = make_pool(&(wf_pool_opts){ .limit_bytes = 1 << 20 });
    void *b[4];
    for (int i = 0; i < 4; i++)
        b[i] = must_alloc(p, 256 << 10);
    void *x = (void *)1;
    int rc = wf_pool_alloc(p, 1, &x);
    cr_assert_eq(rc, WF_ENOMEM, "got %s", wf_err_name(rc));
    cr_assert_null(x);
    cr_assert(strstr(wf_last_errmsg(), "limit of 1048576"), "message: %s", wf_last_errmsg());
    wf_pool_stats s = stats(p);
    cr_assert_eq(s.failed, 1);
    cr_assert_eq(s.bytes_live, 1 << 20);
    for (int i = 0; i < 4; i++)
        wf_pool_free(p, b[i], 256 << 10);
    s = stats(p);
    cr_assert_eq(s.bytes_live, 0);
    cr_assert_eq(s.bytes_cached, 1 << 20);
    wf_pool_destroy(p);
}

Test(memory_pool, the_limit_releases_cached_blocks_before_failing)
{
    wf_pool *p = make_pool(&(wf_pool_opts){ .limit_bytes = 1 << 20 });
    void *b[4];
    for (int i = 0; i < 4; i++)
        b[i] = must_alloc(p, 256 << 10);
    for (int i = 0; i < 4; i++)
        wf_pool_free(p, b[i], 256 << 10);
    /* 1 MiB is cached in 256 KiB blocks: a 512 KiB block fits only once they are released. */
    void *big = must_alloc(p, 512 << 10);
    wf_pool_stats s = stats(p);
    cr_assert_eq(s.sys_frees, 4);
    cr_assert_eq(s.bytes_reserved, 512 << 10);
    cr_assert_eq(s.failed, 0);
    wf_pool_free(p, big, 512 << 10);
    wf_pool_destroy(p);
}

Test(memory_pool, a_request_larger_than_the_limit_fails_cleanly)
{
    wf_pool *p = make_pool(&(wf_pool_opts){ .limit_bytes = 4096 });
    void *x;
    cr_assert_eq(wf_pool_alloc(p, 8192, &x), WF_ENOMEM);
    cr_assert_eq(stats(p).bytes_reserved, 0);
    x = must_alloc(p, 4096);
    wf_pool_free(p, x, 4096);
    wf_pool_destroy(p);
}

Test(memory_pool, fail_after_makes_exactly_the_nth_allocation_fail)
{
    wf_pool *p = make_pool(&(wf_pool_opts){ .fail_after = 3 });
    void *a = must_alloc(p, 10);
    void *b = must_alloc(p, 10);
    void *c = (void *)1;
    int rc = wf_pool_alloc(p, 10, &c);
    cr_assert_eq(rc, WF_ENOMEM);
    cr_assert_null(c);
    cr_assert(strstr(wf_last_errmsg(), "fail_after"), "message: %s", wf_last_errmsg());
    void *d = must_alloc(p, 10);
    wf_pool_stats s = stats(p);
    cr_assert_eq(s.allocs, 3);
    cr_assert_eq(s.failed, 1);
    wf_pool_free(p, a, 10);
    wf_pool_free(p, b, 10);
    wf_pool_free(p, d, 10);
    cr_assert_eq(stats(p).bytes_live, 0);
    wf_pool_destroy(p);
}

Test(memory_pool, fail_after_covers_pool_tensors_without_leaking)
{
    for (int n = 1; n <= 3; n++) {
        wf_pool *p = make_pool(&(wf_pool_opts){ .fail_after = n });
        wf_tensor *t[3] = { NULL, NULL, NULL };
        int failed = 0;
        for (int i = 0; i < 3; i++) {
            int rc = wf_pool_tensor(p, WF_F32, WF_SHAPE(4, 4), NULL, &t[i]);
            if (rc < 0) {
                cr_assert_eq(rc, WF_ENOMEM);
                cr_assert_null(t[i]);
                failed++;
            }
        }
        cr_assert_eq(failed, 1, "fail_after %d", n);
        cr_assert_null(t[n - 1]);
        for (int i = 0; i < 3; i++)
            wf_tensor_release(t[i]);
        cr_assert_eq(stats(p).bytes_live, 0);
        wf_pool_destroy(p);
    }
}

Test(memory_pool, pool_tensors_hold_their_data_and_return_to_the_pool_on_release)
{
    wf_pool *p = make_pool(NULL);
    float data[20];
    for (int i = 0; i < 20; i++)
        data[i] = (float)i * 0.5f;
    wf_tensor *t = NULL;
    cr_assert_eq(wf_pool_tensor(p, WF_F32, WF_SHAPE(4, 5), data, &t), 0, "%s", wf_last_errmsg());
    cr_assert_eq(wf_tensor_numel(t), 20);
    cr_assert(wf_tensor_is_contiguous(t));
    const float *f = wf_tensor_data_f32(t);
    cr_assert_not_null(f);
    cr_assert_eq((uintptr_t)f % 64, 0);
    cr_assert_eq(memcmp(f, data, sizeof data), 0);
    cr_assert_eq(stats(p).bytes_live, 128, "80 bytes take a 128-byte block");
    wf_tensor *u = wf_tensor_retain(t);
    wf_tensor_release(t);
    cr_assert_eq(stats(p).bytes_live, 128, "one reference left");
    wf_tensor_release(u);
    wf_pool_stats s = stats(p);
    cr_assert_eq(s.bytes_live, 0);
    cr_assert_eq(s.frees, 1);
    cr_assert_eq(s.bytes_cached, 128);
    wf_pool_destroy(p);
}

Test(memory_pool, pool_tensors_without_data_are_zeros_and_scalars_work)
{
    wf_pool *p = make_pool(NULL);
    wf_tensor *t = NULL;
    cr_assert_eq(wf_pool_tensor(p, WF_F64, WF_SHAPE(3, 3), NULL, &t), 0);
    for (int i = 0; i < 9; i++)
        cr_assert_eq(wf_tensor_get(t, i), 0.0);
    wf_tensor_release(t);
    cr_assert_eq(wf_pool_tensor(p, WF_I32, WF_SCALAR, &(int32_t){ 7 }, &t), 0);
    cr_assert_eq(wf_tensor_get(t, 0), 7.0);
    wf_tensor_release(t);
    cr_assert_eq(wf_pool_tensor(p, WF_F32, WF_SHAPE(0, 3), NULL, &t), 0, "empty tensors too");
    wf_tensor_release(t);
    cr_assert_eq(stats(p).bytes_live, 0);
    wf_pool_destroy(p);
}

Test(memory_pool, pool_tensor_rejects_bad_dtypes_and_shapes)
{
    wf_pool *p = make_pool(NULL);
    wf_tensor *t = (wf_tensor *)1;
    cr_assert_eq(wf_pool_tensor(p, (wf_dtype)99, WF_SHAPE(2), NULL, &t), WF_EINVAL);
    cr_assert_null(t);
    cr_assert_eq(wf_pool_tensor(p, WF_F32, WF_SHAPE(2, -1), NULL, &t), WF_EINVAL);
    cr_assert(strstr(wf_last_errmsg(), "[2, ?]"), "message: %s", wf_last_errmsg());
    cr_assert_eq(wf_pool_tensor(p, WF_F32, (wf_shape){ .rank = 9 }, NULL, &t), WF_EINVAL);
    cr_assert_eq(wf_pool_tensor(NULL, WF_F32, WF_SHAPE(2), NULL, &t), WF_EINVAL);
    cr_assert_eq(wf_pool_tensor(p, WF_F32, WF_SHAPE(2), NULL, NULL), WF_EINVAL);
    cr_assert_eq(stats(p).allocs, 0);
    wf_pool_destroy(p);
}

Test(memory_pool, a_tensor_may_outlive_its_pool)
{
    wf_pool *p = make_pool(NULL);
    wf_tensor *t = NULL;
    cr_assert_eq(wf_pool_tensor(p, WF_F32, WF_SHAPE(1000), NULL, &t), 0);
    wf_pool_destroy(p);
    cr_assert_eq(wf_tensor_get(t, 999), 0.0);
    wf_tensor_release(t); /* LeakSanitizer (ASan build) checks that the pool went too */
}

/* ---- NUMA ---- */

#define TWO_NODES "pack:2 numa:1 core:2 pu:1"

typedef struct numa_probe {
    wf_runtime *rt;
    int worker_node, pool_node;
} numa_probe;

static int pool_on_caller_node(void *arg)
{
    numa_probe *np = arg;
    np->worker_node = wf_runtime_worker_numa(np->rt, wf_runtime_current_worker(np->rt));
    wf_pool *p;
    int rc = wf_pool_create(np->rt, &(wf_pool_opts){ .numa = WF_POOL_NUMA_CALLER }, &p);
    if (rc < 0)
        return rc;
    wf_pool_stats s;
    rc = wf_pool_get_stats(p, &s);
    np->pool_node = s.numa;
    wf_pool_destroy(p);
    return rc;
}

Test(memory_pool, on_two_numa_nodes_blocks_are_bound_to_the_pool_node)
{
    wf_runtime *r2 = wf_test_runtime(&(wf_runtime_opts){ .topology = TWO_NODES });
    cr_assert_eq(wf_runtime_numa_count(r2), 2);
    wf_pool *p;
    cr_assert_eq(wf_pool_create(r2, &(wf_pool_opts){ .numa = 1 }, &p), 0, "%s", wf_last_errmsg());
    wf_pool_stats s;
    cr_assert_eq(wf_pool_get_stats(p, &s), 0);
    cr_assert_eq(s.numa, 1);
    cr_assert_eq(s.bound, 1);
    /* A synthetic topology is not this machine: hwloc's binding calls succeed there without
     * doing anything (its "dummy hooks"), so the binding path runs on any machine. */
    size_t sizes[] = { 64, 4096, 1 << 20, WF_POOL_MAX_CLASS + 4096 };
    for (int i = 0; i < 4; i++) {
        void *b;
        cr_assert_eq(wf_pool_alloc(p, sizes[i], &b), 0, "%zu: %s", sizes[i], wf_last_errmsg());
        cr_assert_eq((uintptr_t)b % 64, 0);
        memset(b, i, sizes[i]);
        wf_pool_free(p, b, sizes[i]);
    }
    cr_assert_eq(wf_pool_trim(p), 0);
    cr_assert_eq(wf_pool_get_stats(p, &s), 0);
    cr_assert_eq(s.bytes_reserved, 0);
    cr_assert_eq(s.bind_failed, 0, "hwloc binds on a synthetic topology as a no-op");
    wf_pool_destroy(p);
    cr_assert_eq(wf_pool_create(r2, &(wf_pool_opts){ .numa = 2 }, &p), WF_EINVAL);
    wf_runtime_destroy(r2);
}

Test(memory_pool, numa_caller_picks_the_calling_worker_node_or_node_0_outside)
{
    wf_runtime *r2 = wf_test_runtime(&(wf_runtime_opts){ .topology = TWO_NODES });
    wf_pool *p;
    cr_assert_eq(wf_pool_create(r2, &(wf_pool_opts){ .numa = WF_POOL_NUMA_CALLER }, &p), 0);
    wf_pool_stats s;
    cr_assert_eq(wf_pool_get_stats(p, &s), 0);
    cr_assert_eq(s.numa, 0, "an outside thread gets node 0");
    wf_pool_destroy(p);
    wf_group g;
    cr_assert_eq(wf_group_init(&g, r2), 0);
    numa_probe np[16];
    for (int i = 0; i < 16; i++) {
        np[i] = (numa_probe){ r2, -1, -2 };
        cr_assert_eq(wf_spawn(&g, pool_on_caller_node, &np[i]), 0);
    }
    cr_assert_eq(wf_group_wait(&g), 0, "%s", wf_group_errmsg(&g));
    wf_group_deinit(&g);
    for (int i = 0; i < 16; i++)
        cr_assert_eq(np[i].pool_node, np[i].worker_node, "task %d: pool on %d, worker on %d", i,
                     np[i].pool_node, np[i].worker_node);
    wf_runtime_destroy(r2);
}

/* ---- Many threads at once ---- */

#define SLOTS 64

typedef struct stress {
    wf_pool *p;
    uint64_t seed;
    long rounds;
    _Atomic int bad;
} stress;

/* Each live block is filled with its owner's tag; a block handed out twice would be
 * overwritten by the other owner and fail the check before it is freed. */
static void churn(stress *s, uint64_t seed)
{
    void *blk[SLOTS] = { 0 };
    size_t len[SLOTS];
    uint64_t tag[SLOTS];
    uint64_t rng = seed;
    for (long r = 0; r < s->rounds; r++) {
        int i = (int)wf_test_rand_below(&rng, SLOTS);
        if (blk[i]) {
            const uint64_t *w = blk[i];
            for (size_t k = 0; k < len[i] / 8; k++)
                if (w[k] != tag[i]) {
                    atomic_store(&s->bad, 1);
                    break;
                }
            wf_pool_free(s->p, blk[i], len[i]);
            blk[i] = NULL;
            continue;
        }
        /* Mostly small blocks, sometimes up to 256 KiB. */
        size_t n = wf_test_rand_below(&rng, 8) == 0 ? 8 + wf_test_rand_below(&rng, 256 << 10)
                                                    : 8 + wf_test_rand_below(&rng, 2048);
        n &= ~(size_t)7;
        if (wf_pool_alloc(s->p, n, &blk[i]) < 0) {
            atomic_store(&s->bad, 2);
            return;
        }
        len[i] = n;
        tag[i] = wf_test_rand(&rng);
        uint64_t *w = blk[i];
        for (size_t k = 0; k < n / 8; k++)
            w[k] = tag[i];
    }
    for (int i = 0; i < SLOTS; i++)
        if (blk[i])
            wf_pool_free(s->p, blk[i], len[i]);
}

typedef struct churn_arg {
    stress *s;
    uint64_t seed;
} churn_arg;

static int churn_task(void *arg)
{
    churn_arg *a = arg;
    churn(a->s, a->seed);
    return 0;
}

static void *churn_thread(void *arg)
{
    churn_arg *a = arg;
    churn(a->s, a->seed);
    return NULL;
}

Test(memory_pool, workers_and_outside_threads_allocate_at_once_without_overlap)
{
    stress s = { .rounds = wf_test_scaled(20000, 2000) };
    s.p = make_pool(NULL);

    enum { TASKS = 8, THREADS = 3 };

    churn_arg ta[TASKS], tha[THREADS];
    wf_group g;
    cr_assert_eq(wf_group_init(&g, rt), 0);
    for (int i = 0; i < TASKS; i++) {
        ta[i] = (churn_arg){ &s, 1000 + (uint64_t)i };
        cr_assert_eq(wf_spawn(&g, churn_task, &ta[i]), 0);
    }
    pthread_t th[THREADS];
    for (int i = 0; i < THREADS; i++) {
        tha[i] = (churn_arg){ &s, 2000 + (uint64_t)i };
        cr_assert_eq(pthread_create(&th[i], NULL, churn_thread, &tha[i]), 0);
    }
    cr_assert_eq(wf_group_wait(&g), 0);
    wf_group_deinit(&g);
    for (int i = 0; i < THREADS; i++)
        pthread_join(th[i], NULL);
    cr_assert_eq(atomic_load(&s.bad), 0, "a block was shared (1) or an allocation failed (2)");
    wf_pool_stats st = stats(s.p);
    cr_assert_eq(st.bytes_live, 0);
    cr_assert_eq(st.allocs, st.frees);
    cr_assert_eq(st.bytes_reserved, st.bytes_cached);
    cr_assert_gt(st.cache_hits, 0);
    cr_assert_eq(st.sys_allocs, st.allocs - st.cache_hits);
    wf_pool_destroy(s.p);
}

/* Blocks allocated by workers are freed by outside threads, and the other way round. */

#define HANDOFF 512

typedef struct handoff {
    wf_pool *p;
    void *blk[HANDOFF];
    size_t len[HANDOFF];
    _Atomic int bad;
} handoff;

typedef struct range_arg {
    handoff *h;
    int lo, hi;
} range_arg;

static int fill(void *ctx, int64_t lo, int64_t hi)
{
    handoff *h = ctx;
    for (int64_t i = lo; i < hi; i++) {
        h->len[i] = 64 + 64 * (size_t)(i % 40);
        if (wf_pool_alloc(h->p, h->len[i], &h->blk[i]) < 0)
            return WF_ENOMEM;
        memset(h->blk[i], (int)(i & 0xff), h->len[i]);
    }
    return 0;
}

static void check_and_free(handoff *h, int lo, int hi)
{
    for (int i = lo; i < hi; i++) {
        const unsigned char *c = h->blk[i];
        for (size_t k = 0; k < h->len[i]; k++)
            if (c[k] != (unsigned char)(i & 0xff)) {
                atomic_store(&h->bad, 1);
                break;
            }
        wf_pool_free(h->p, h->blk[i], h->len[i]);
    }
}

static void *free_thread(void *arg)
{
    range_arg *a = arg;
    check_and_free(a->h, a->lo, a->hi);
    return NULL;
}

static int free_range(void *ctx, int64_t lo, int64_t hi)
{
    check_and_free(ctx, (int)lo, (int)hi);
    return 0;
}

Test(memory_pool, blocks_freed_by_another_thread_are_reused_correctly)
{
    handoff *h = calloc(1, sizeof *h);
    h->p = make_pool(NULL);
    for (int round = 0; round < (int)wf_test_scaled(20, 4); round++) {
        /* Workers allocate, outside threads free. */
        cr_assert_eq(wf_parallel_for(rt, 0, HANDOFF, 16, fill, h), 0);
        pthread_t th[2];
        range_arg ra[2] = { { h, 0, HANDOFF / 2 }, { h, HANDOFF / 2, HANDOFF } };
        for (int i = 0; i < 2; i++)
            cr_assert_eq(pthread_create(&th[i], NULL, free_thread, &ra[i]), 0);
        for (int i = 0; i < 2; i++)
            pthread_join(th[i], NULL);
        /* This (outside) thread allocates, workers free. */
        cr_assert_eq(fill(h, 0, HANDOFF), 0);
        cr_assert_eq(wf_parallel_for(rt, 0, HANDOFF, 16, free_range, h), 0);
    }
    cr_assert_eq(atomic_load(&h->bad), 0);
    wf_pool_stats st = stats(h->p);
    cr_assert_eq(st.bytes_live, 0);
    cr_assert_eq(st.allocs, st.frees);
    wf_pool_destroy(h->p);
    free(h);
}

typedef struct tensor_churn {
    wf_pool *p;
    wf_tensor *t[HANDOFF];
} tensor_churn;

static int make_tensors(void *ctx, int64_t lo, int64_t hi)
{
    tensor_churn *tc = ctx;
    for (int64_t i = lo; i < hi; i++) {
        float v[16];
        for (int k = 0; k < 16; k++)
            v[k] = (float)(i * 16 + k);
        int rc = wf_pool_tensor(tc->p, WF_F32, WF_SHAPE(16), v, &tc->t[i]);
        if (rc < 0)
            return rc;
    }
    return 0;
}

Test(memory_pool, pool_tensors_released_on_other_threads_go_back_to_the_pool)
{
    tensor_churn *tc = calloc(1, sizeof *tc);
    tc->p = make_pool(NULL);
    cr_assert_eq(wf_parallel_for(rt, 0, HANDOFF, 8, make_tensors, tc), 0);
    cr_assert_eq(stats(tc->p).bytes_live, (uint64_t)HANDOFF * 64);
    for (int i = 0; i < HANDOFF; i++) {
        cr_assert_eq(wf_tensor_get(tc->t[i], 15), (double)(i * 16 + 15));
        wf_tensor_release(tc->t[i]);
    }
    wf_pool_stats st = stats(tc->p);
    cr_assert_eq(st.bytes_live, 0);
    cr_assert_eq(st.frees, HANDOFF);
    wf_pool_destroy(tc->p);
    free(tc);
}

typedef struct limit_race {
    wf_pool *p;
    _Atomic long ok, refused, bad;
} limit_race;

static int grab_under_limit(void *ctx, int64_t lo, int64_t hi)
{
    limit_race *lr = ctx;
    for (int64_t i = lo; i < hi; i++) {
        void *b[5];
        int n = 0;
        for (; n < 5; n++) {
            int rc = wf_pool_alloc(lr->p, 16 << 10, &b[n]);
            if (rc == WF_ENOMEM) {
                atomic_fetch_add(&lr->refused, 1);
                break;
            }
            if (rc < 0)
                atomic_fetch_add(&lr->bad, 1);
            atomic_fetch_add(&lr->ok, 1);
        }
        wf_pool_stats s;
        if (wf_pool_get_stats(lr->p, &s) == 0 && s.bytes_reserved > (128 << 10))
            atomic_fetch_add(&lr->bad, 1);
        while (n-- > 0)
            wf_pool_free(lr->p, b[n], 16 << 10);
    }
    return 0;
}

Test(memory_pool, concurrent_allocations_never_pass_the_limit_and_leak_nothing)
{
    /* 8 blocks of 16 KiB fit; each iteration wants 5 at once, on 2 workers, so some are
     * refused when both run, and the blocks one worker caches must be released for the
     * other. */
    limit_race lr = { .p = make_pool(&(wf_pool_opts){ .limit_bytes = 128 << 10 }) };
    cr_assert_eq(wf_parallel_for(rt, 0, wf_test_scaled(4000, 400), 1, grab_under_limit, &lr), 0);
    cr_assert_eq(atomic_load(&lr.bad), 0, "the limit was passed or an error was not ENOMEM");
    cr_assert_gt(atomic_load(&lr.ok), 0);
    wf_pool_stats s = stats(lr.p);
    cr_assert_eq(s.bytes_live, 0);
    cr_assert_eq(s.failed, (uint64_t)atomic_load(&lr.refused));
    cr_assert_leq(s.bytes_reserved, 128 << 10);
    wf_pool_destroy(lr.p);
}
