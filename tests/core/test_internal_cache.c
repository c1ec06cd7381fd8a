/* tests/core/test_internal_cache.c: the per-thread cache of freed graph memory (core/internal.h):
 * a graph built from a destroyed graph's node chunks, arena blocks and value blocks has the
 * right values, names and counts and nothing of the old graph; values that outlive their
 * graph keep their bytes; the cache stays within its bound and empties on wf__cache_trim();
 * large values (past 4 KiB) come back by classes of a quarter of a power of two, and stay
 * within the bound too; many graphs made and destroyed on 2 threads at once, with values released
 * on the other thread, stay right. Under AddressSanitizer the cache is off: the behaviour tests
 * still run, the ones about what the cache holds skip. Internal: links the static library, where
 * the wf__ symbols are visible. */
#include "../../core/internal.h"
#include "../../core/tensor.h"
#include "wf_test.h"

#include <weft/weft.h>

#include <criterion/criterion.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

static wf_runtime *rt;

static void setup(void)
{
    rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 1, .flags = WF_RT_NO_PIN });
}

static void teardown(void)
{
    wf__cache_trim();
    wf_runtime_destroy(rt);
    rt = NULL;
    wf_test_fini();
}

TestSuite(core_internal_cache, .init = setup, .fini = teardown, .timeout = WF_TEST_TIMEOUT(60));

/* An eager graph of 'n' nodes: x_0 = base, x_i = x_{i-1} + 1 (f32 scalars), so x_i = base +
 * i exactly (below 2^24); with 'named', node 1 is called "first". Returns the graph. */
static wf_graph *chain(float base, int n, bool named)
{
    wf_graph *g = wf_graph_create(rt, WF_EAGER);
    cr_assert_not_null(g, "%s", wf_last_errmsg());
    wf_node *one = wf_scalar(g, WF_F32, 1.0);
    wf_node *x = wf_scalar(g, WF_F32, base);
    for (int i = 1; i < n && x; i++) {
        x = wf_add(g, x, one);
        if (i == 1 && named)
            cr_assert_eq(wf_node_set_name(x, "first"), 0, "%s", wf_last_errmsg());
    }
    cr_assert_not_null(x, "%s", wf_graph_errmsg(g));
    return g;
}

/* Checks every node of chain(base, n, named): count, ids, names, inputs, values. */
static void check_chain(wf_graph *g, float base, int n, bool named)
{
    cr_assert_eq(wf_graph_node_count(g), n + 1); /* the '1' scalar, then x_0 .. x_{n-1} */
    cr_assert_eq(wf_graph_status(g), 0, "%s", wf_graph_errmsg(g));
    for (int i = 0; i <= n; i++) {
        wf_node *nd = wf_graph_node(g, i);
        char want[32];
        if (i == 2 && named)
            snprintf(want, sizeof want, "first");
        else
            snprintf(want, sizeof want, "%s_%d", i < 2 ? "constant" : "add", i);
        cr_assert_str_eq(wf_node_name(nd), want, "node %d", i);
        cr_assert_eq(wf_graph_find(g, want), nd, "node %d ('%s')", i, want);
        cr_assert_eq(nd->id, i);
        cr_assert_eq(nd->graph, g);
        cr_assert_eq(nd->n_control, 0);
        cr_assert_eq(nd->device, -1);
        cr_assert_eq(nd->rt_data, NULL);
        cr_assert_eq(wf_node_input_count(nd), i < 2 ? 0 : 2, "node %d", i);
        double v = wf_tensor_get(wf_node_value(nd), 0);
        double expect = i == 0 ? 1.0 : (double)base + (i - 1);
        cr_assert_eq(v, expect, "node %d: %g, not %g", i, v, expect);
    }
}

Test(core_internal_cache, graph_after_a_destroyed_one_has_right_values_names_and_counts)
{
    int n = 3 * WF__CHUNK_NODES + 17; /* 4 chunks: the second graph reuses all of them */
    wf_graph *g = chain(10.0f, n, true);
    check_chain(g, 10.0f, n, true);
    wf_graph_destroy(g);
    wf__cache_stats s = wf__cache_get_stats();
    if (wf__cache_enabled()) {
        cr_assert_geq(s.count[WF__CACHE_CHUNK], 4);
        cr_assert_geq(s.count[WF__CACHE_VALUE + 0], n + 1);
        cr_assert_leq(s.bytes, WF__CACHE_MAX);
    }
    g = chain(1000.0f, n, false); /* no user name this time: "first" must be gone */
    check_chain(g, 1000.0f, n, false);
    cr_assert_null(wf_graph_find(g, "first"));
    if (wf__cache_enabled()) {
        wf__cache_stats t = wf__cache_get_stats();
        cr_assert_eq(t.count[WF__CACHE_CHUNK], s.count[WF__CACHE_CHUNK] - 4);
        cr_assert_eq(t.count[WF__CACHE_VALUE + 0], s.count[WF__CACHE_VALUE + 0] - (n + 1));
        cr_assert_lt(t.bytes, s.bytes);
    }
    wf_graph_destroy(g);
}

Test(core_internal_cache, value_outliving_its_graph_keeps_its_bytes_while_blocks_are_reused)
{
    wf_graph *g = chain(5.0f, 100, false);
    wf_tensor *kept = wf_tensor_retain(wf_node_value(wf_graph_node(g, 50)));
    wf_graph_destroy(g);
    cr_assert_eq(wf_tensor_get(kept, 0), 5.0 + 49);
    g = chain(-7.0f, 200, false); /* takes every cached block: none is 'kept' */
    for (int i = 0; i <= 200; i++)
        cr_assert_neq(wf_node_value(wf_graph_node(g, i)), kept, "node %d", i);
    check_chain(g, -7.0f, 200, false);
    cr_assert_eq(wf_tensor_get(kept, 0), 5.0 + 49);
    cr_assert_eq(kept->refs, 1);
    wf_tensor_release(kept);
    wf_graph_destroy(g);
}

Test(core_internal_cache, values_of_every_size_class_come_back_with_their_own_size)
{
    /* 1 to 1024 f32 elements: 4 bytes to 4 KiB, every class and both ends of most; each
     * value filled to its end, released, and the next one of the same class reuses its
     * block. */
    static const int64_t sizes[] = { 1,  4,  5,   8,   9,   16,  17,  32,  33,
                                     64, 65, 128, 129, 256, 257, 512, 513, 1024 };
    const wf_tensor *first[sizeof sizes / sizeof sizes[0]];
    for (int round = 0; round < 2; round++)
        for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
            int64_t n = sizes[k];
            wf_tensor *t = wf__tensor_alloc_value(WF_F32, WF_SHAPE(n));
            cr_assert_not_null(t, "%s", wf_last_errmsg());
            cr_assert_eq((uintptr_t)t->data % 64, 0);
            cr_assert_eq(t->numel, n);
            cr_assert_eq(t->refs, 1);
            cr_assert_eq(t->buf->refs, 1);
            cr_assert_eq(t->buf->bytes, (size_t)n * 4);
            for (int64_t i = 0; i < n; i++)
                ((float *)t->data)[i] = (float)(i + round);
            cr_assert_eq(wf_tensor_get(t, n - 1), (double)(n - 1 + round));
            if (round == 0)
                first[k] = t;
            else if (wf__cache_enabled()) /* each class's list holds one block: this one */
                cr_assert_eq(t, first[k], "%lld elements", (long long)n);
            wf_tensor_release(t);
        }
    if (!wf__cache_enabled())
        cr_skip_test("the cache is off under AddressSanitizer");
    wf__cache_stats s = wf__cache_get_stats();
    for (int c = 0; c < WF__VALUE_CLASSES; c++)
        cr_assert_geq(s.count[WF__CACHE_VALUE + c], 1, "class %d", c);
}

/* A value of 'n' f32 elements, filled with 'v', its block 64-aligned. */
static wf_tensor *value_of(int64_t n, float v)
{
    wf_tensor *t = wf__tensor_alloc_value(WF_F32, WF_SHAPE(n));
    cr_assert_not_null(t, "%s", wf_last_errmsg());
    cr_assert_eq((uintptr_t)t->data % 64, 0);
    cr_assert_eq(t->buf->bytes, (size_t)n * 4);
    for (int64_t i = 0; i < n; i++)
        ((float *)t->data)[i] = v;
    return t;
}

Test(core_internal_cache, large_values_come_back_by_class_of_a_quarter_octave)
{
    /* Past 4 KiB a class holds (5..8)/4 of a power of two: 1025 elements (4100 bytes) and
     * 1280 (5120) share a class, 1281 is the next; 1 MiB and 1 MiB + 4 bytes differ; 32 MiB
     * (WF__LARGE_MAX) is the last class. Each pair: the first's block, released, is the
     * second's when they share a class, and never when they do not. */
    static const struct {
        int64_t a, b;
        bool same;
    } pairs[] = {
        { 1025, 1280, true },     { 1280, 1281, false },     { 1281, 1536, true },
        { 1536, 1537, false },    { 1793, 2048, true },      { 2048, 2049, false },
        { 262144, 229377, true }, { 262144, 262145, false }, { 8388608, 7340033, true },
    };

    for (size_t k = 0; k < sizeof pairs / sizeof pairs[0]; k++) {
        wf__cache_trim();
        wf_tensor *t = value_of(pairs[k].a, 1.5f);
        const wf_tensor *was = t;
        wf_tensor_release(t);
        t = value_of(pairs[k].b, -2.0f); /* filled to its end: the block holds it */
        cr_assert_eq(wf_tensor_get(t, pairs[k].b - 1), -2.0);
        if (wf__cache_enabled())
            cr_assert_eq(t == was, pairs[k].same, "%lld then %lld elements", (long long)pairs[k].a,
                         (long long)pairs[k].b);
        wf_tensor_release(t);
    }
    /* Past WF__LARGE_MAX: an allocation of its own, freed (not cached) at its release. */
    wf__cache_trim();
    wf_tensor *big = value_of((int64_t)(WF__LARGE_MAX / 4) + 1, 3.0f);
    cr_assert_null(big->buf->free_fn);
    wf_tensor_release(big);
    cr_assert_eq(wf__cache_get_stats().bytes, 0);
}

Test(core_internal_cache, large_values_stay_within_the_bound)
{
    if (!wf__cache_enabled())
        cr_skip_test("the cache is off under AddressSanitizer");
    wf__cache_trim();
    /* Three values of 32 MiB: each block is a little more (its header), so the 64 MiB
     * cache keeps one and frees the others. */
    wf_tensor *t[3];
    for (int i = 0; i < 3; i++)
        t[i] = value_of((int64_t)(WF__LARGE_MAX / 4), (float)i);
    for (int i = 0; i < 3; i++)
        wf_tensor_release(t[i]);
    wf__cache_stats s = wf__cache_get_stats();
    cr_assert_leq(s.bytes, WF__CACHE_MAX);
    cr_assert_eq(s.count[WF__CACHE_LARGE + WF__LARGE_CLASSES - 1], 1);
    wf__cache_trim();
    cr_assert_eq(wf__cache_get_stats().bytes, 0);
}

Test(core_internal_cache, cache_stays_within_its_bound_and_trim_empties_it)
{
    if (!wf__cache_enabled())
        cr_skip_test("the cache is off under AddressSanitizer");
    /* 64 MiB / (232-byte node + 288-byte value) ~ 129k nodes: 160k do not all fit. */
    int n = 160000;
    wf_graph *g = chain(0.0f, n, false);
    wf_graph_destroy(g);
    wf__cache_stats s = wf__cache_get_stats();
    cr_assert_leq(s.bytes, WF__CACHE_MAX);
    cr_assert_gt(s.bytes, WF__CACHE_MAX / 2);
    size_t chunks = (size_t)s.count[WF__CACHE_CHUNK] * WF__CHUNK_NODES * sizeof(wf_node);
    cr_assert_gt(chunks, 0);
    cr_assert_leq(chunks, s.bytes);
    cr_assert_lt(s.count[WF__CACHE_CHUNK], (n + WF__CHUNK_NODES) / WF__CHUNK_NODES,
                 "the chunks that did not fit were freed");
    wf__cache_trim();
    s = wf__cache_get_stats();
    cr_assert_eq(s.bytes, 0);
    for (int l = 0; l < WF__CACHE_LISTS; l++)
        cr_assert_eq(s.count[l], 0, "list %d", l);
    g = chain(3.0f, 50, true); /* works from an empty cache */
    check_chain(g, 3.0f, 50, true);
    wf_graph_destroy(g);
}

/* ---- Two threads ------------------------------------------------------------------------ */

typedef struct worker_arg {
    int id;
    int graphs;
    _Atomic(wf_tensor *) *mailbox; /* shared: a value handed to whichever thread comes next */
    atomic_int *errors;
    char why[160];
    int cached_after; /* chunks in this thread's cache after its last destroy */
} worker_arg;

static void *worker(void *p)
{
    worker_arg *a = p;
    for (int k = 0; k < a->graphs; k++) {
        int n = 50 + (k * 37 + a->id * 11) % 1500; /* one or two chunks */
        float base = (float)(a->id * 100000 + k);
        wf_graph *g = wf_graph_create(rt, WF_EAGER);
        wf_node *one = wf_scalar(g, WF_F32, 1.0), *x = wf_scalar(g, WF_F32, base);
        for (int i = 1; i < n && x; i++)
            x = wf_add(g, x, one);
        bool ok = x && wf_graph_node_count(g) == n + 1;
        for (int i = 0; ok && i <= n; i++) {
            wf_node *nd = wf_graph_node(g, i);
            double expect = i == 0 ? 1.0 : (double)base + (i - 1);
            char name[32];
            snprintf(name, sizeof name, "%s_%d", i < 2 ? "constant" : "add", i);
            ok = wf_tensor_get(wf_node_value(nd), 0) == expect &&
                 strcmp(wf_node_name(nd), name) == 0 && wf_graph_find(g, name) == nd;
            if (!ok)
                snprintf(a->why, sizeof a->why, "thread %d graph %d node %d: %g '%s'", a->id, k, i,
                         wf_tensor_get(wf_node_value(nd), 0), wf_node_name(nd));
        }
        if (!ok) {
            if (!a->why[0])
                snprintf(a->why, sizeof a->why, "thread %d graph %d: %s", a->id, k,
                         wf_graph_errmsg(g));
            atomic_fetch_add(a->errors, 1);
            wf_graph_destroy(g);
            return NULL;
        }
        /* Hand the last value over and release what the other thread left: blocks move
         * between the threads' caches. */
        wf_tensor *mine = wf_tensor_retain(wf_node_value(x));
        wf_tensor *theirs = atomic_exchange(a->mailbox, mine);
        wf_graph_destroy(g);
        if (theirs) {
            double v = wf_tensor_get(theirs, 0);
            if (v != (double)(float)v || v < 0) {
                snprintf(a->why, sizeof a->why, "thread %d: a handed value is %g", a->id, v);
                atomic_fetch_add(a->errors, 1);
            }
            wf_tensor_release(theirs);
        }
    }
    a->cached_after = wf__cache_get_stats().count[WF__CACHE_CHUNK];
    return NULL;
}

Test(core_internal_cache, graphs_made_and_destroyed_on_two_threads_at_once_stay_right)
{
    _Atomic(wf_tensor *) mailbox = NULL;
    atomic_int errors = 0;
    int graphs = (int)wf_test_scaled(300, 40);
    worker_arg args[2];
    pthread_t th[2];
    for (int r = 0; r < 3; r++) { /* repeated: fresh threads, fresh caches, exit hooks */
        for (int i = 0; i < 2; i++) {
            args[i] =
                (worker_arg){ .id = i, .graphs = graphs, .mailbox = &mailbox, .errors = &errors };
            cr_assert_eq(pthread_create(&th[i], NULL, worker, &args[i]), 0);
        }
        for (int i = 0; i < 2; i++)
            pthread_join(th[i], NULL);
        cr_assert_eq(atomic_load(&errors), 0, "%s%s", args[0].why, args[1].why);
        if (wf__cache_enabled())
            for (int i = 0; i < 2; i++)
                cr_assert_geq(args[i].cached_after, 1, "thread %d", i);
    }
    wf_tensor_release(atomic_exchange(&mailbox, NULL));
}

Test(core_internal_cache, memory_no_graph_took_since_the_last_destroy_is_freed_at_the_next)
{
    if (!wf__cache_enabled())
        cr_skip_test("the cache is off under AddressSanitizer");
    wf_graph *g = chain(1.0f, 3 * WF__CHUNK_NODES, false); /* 3 chunks and then some */
    wf_graph_destroy(g);
    wf__cache_stats s = wf__cache_get_stats();
    cr_assert_eq(s.count[WF__CACHE_CHUNK], 4);
    cr_assert_eq(s.count[WF__CACHE_VALUE], 3 * WF__CHUNK_NODES + 1);
    g = chain(2.0f, 99, false); /* a small graph: one chunk, 100 values */
    check_chain(g, 2.0f, 99, false);
    wf_graph_destroy(g); /* frees the 3 chunks and the values it left, keeps its own */
    s = wf__cache_get_stats();
    cr_assert_eq(s.count[WF__CACHE_CHUNK], 1);
    cr_assert_eq(s.count[WF__CACHE_VALUE], 100);
    g = chain(3.0f, 99, false); /* the same again: all of it reused, nothing freed */
    check_chain(g, 3.0f, 99, false);
    s = wf__cache_get_stats();
    cr_assert_eq(s.count[WF__CACHE_CHUNK], 0);
    cr_assert_eq(s.count[WF__CACHE_VALUE], 0);
    wf_graph_destroy(g);
    s = wf__cache_get_stats();
    cr_assert_eq(s.count[WF__CACHE_CHUNK], 1);
    cr_assert_eq(s.count[WF__CACHE_VALUE], 100);
}
