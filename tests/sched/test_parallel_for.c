/* tests/sched/test_parallel_for.c: wf_parallel_for covers [begin, end) exactly once with
 * disjoint in-range pieces, for many (begin, length, grain) combinations including empty
 * ranges, grain > range and ranges near the int64 limits; pieces are never below 'grain';
 * called from outside, its pieces run on workers; it works from inside tasks and nested in
 * itself; the first error of 'fn' is returned with its message. */
#include "wf_test.h"

#include <weft/weft.h>

#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>

TestSuite(sched_parallel_for, .fini = wf_test_fini, .timeout = WF_TEST_TIMEOUT(120));

/* One loop's bookkeeping. */
typedef struct cover {
    wf_runtime *rt;
    int64_t begin, end, grain;
    atomic_uchar *hits; /* hits[i - begin] */
    atomic_long calls, out_of_range, below_grain, off_worker, indices;
    atomic_llong small_b, small_e; /* one piece below grain, for the message */
} cover;

static int cover_fn(void *ctx, int64_t b, int64_t e)
{
    cover *c = ctx;
    atomic_fetch_add(&c->calls, 1);
    if (b < c->begin || e > c->end || b > e) {
        atomic_fetch_add(&c->out_of_range, 1);
        return 0;
    }
    int64_t total = c->end - c->begin;
    int64_t min_piece = c->grain < total ? c->grain : total;
    if (c->grain > 0 && e - b < min_piece && atomic_fetch_add(&c->below_grain, 1) == 0) {
        atomic_store(&c->small_b, b);
        atomic_store(&c->small_e, e);
    }
    if (wf_runtime_current_worker(c->rt) < 0)
        atomic_fetch_add(&c->off_worker, 1);
    for (int64_t i = b; i < e; i++)
        atomic_fetch_add_explicit(&c->hits[i - c->begin], 1, memory_order_relaxed);
    atomic_fetch_add(&c->indices, e - b);
    return 0;
}

static void cover_init(cover *c, wf_runtime *rt, int64_t begin, int64_t len, int64_t grain)
{
    *c = (cover){ .rt = rt, .begin = begin, .end = begin + len, .grain = grain };
    c->hits = calloc((size_t)(len ? len : 1), sizeof *c->hits);
    cr_assert_not_null(c->hits);
}

/* The first loop that had a piece below grain, for the message. */
static char below_example[160];

/* Runs one loop and checks coverage; returns the count of pieces below grain. */
static long cover_run(wf_runtime *rt, int64_t begin, int64_t len, int64_t grain, bool on_worker)
{
    cover c;
    cover_init(&c, rt, begin, len, grain);
    int rc = wf_parallel_for(rt, begin, begin + len, grain, cover_fn, &c);
    cr_assert_eq(rc, 0, "[%lld, +%lld) grain %lld: %s: %s", (long long)begin, (long long)len,
                 (long long)grain, wf_err_name(rc), wf_last_errmsg());
    cr_assert_eq(atomic_load(&c.out_of_range), 0, "[%lld, +%lld) grain %lld: a piece out of range",
                 (long long)begin, (long long)len, (long long)grain);
    for (int64_t i = 0; i < len; i++)
        if (atomic_load(&c.hits[i]) != 1)
            cr_assert_fail("[%lld, +%lld) grain %lld: index %lld covered %d times",
                           (long long)begin, (long long)len, (long long)grain,
                           (long long)(begin + i), atomic_load(&c.hits[i]));
    if (on_worker)
        cr_assert_eq(atomic_load(&c.off_worker), 0, "a piece ran off the workers");
    if (atomic_load(&c.below_grain) && !below_example[0])
        snprintf(below_example, sizeof below_example,
                 "[%lld, %lld) grain %lld had a piece [%lld, %lld)", (long long)c.begin,
                 (long long)c.end, (long long)grain, atomic_load(&c.small_b),
                 atomic_load(&c.small_e));
    free(c.hits);
    return atomic_load(&c.below_grain);
}

static const int64_t begins[] = { 0, -7, 1000003 };
static const int64_t lengths[] = { 0, 1, 2, 3, 5, 17, 100, 1000, 4097, 100000 };
static const int64_t grains[] = { 0, 1, 2, 3, 7, 64, 1000, 1 << 20 };

#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* Every combination; returns the total count of pieces below grain. */
static long all_combos(wf_runtime *rt, bool on_worker)
{
    long below = 0;
    for (int b = 0; b < COUNT(begins); b++)
        for (int l = 0; l < COUNT(lengths); l++)
            for (int g = 0; g < COUNT(grains); g++)
                below += cover_run(rt, begins[b], lengths[l], grains[g], on_worker);
    return below;
}

Test(sched_parallel_for, covers_every_index_once_for_many_ranges_and_grains_from_outside)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 4 });
    all_combos(rt, true);
    wf_runtime_destroy(rt);
}

Test(sched_parallel_for, covers_every_index_once_on_a_single_worker)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 1 });
    all_combos(rt, true);
    wf_runtime_destroy(rt);
}

Test(sched_parallel_for, pieces_are_never_smaller_than_the_grain)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 4 });
    long below = all_combos(rt, false);
    cr_assert_eq(below, 0, "%ld pieces were smaller than min(grain, range); e.g. %s", below,
                 below_example);
    wf_runtime_destroy(rt);
}

typedef struct in_task {
    wf_runtime *rt;
    atomic_int failures;
    atomic_int off_worker;
} in_task;

static int combos_in_task(void *arg)
{
    in_task *t = arg;
    for (int l = 0; l < COUNT(lengths); l++)
        for (int g = 0; g < COUNT(grains); g++) {
            cover c;
            cover_init(&c, t->rt, -7, lengths[l], grains[g]);
            int rc = wf_parallel_for(t->rt, c.begin, c.end, c.grain, cover_fn, &c);
            int bad = rc != 0 || atomic_load(&c.out_of_range) != 0;
            for (int64_t i = 0; i < lengths[l]; i++)
                bad |= atomic_load(&c.hits[i]) != 1;
            if (bad)
                atomic_fetch_add(&t->failures, 1);
            if (atomic_load(&c.off_worker))
                atomic_store(&t->off_worker, 1);
            free(c.hits);
        }
    return 0;
}

Test(sched_parallel_for, covers_every_index_once_when_called_from_tasks)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 4 });
    in_task t = { .rt = rt };
    wf_group g;
    cr_assert_eq(wf_group_init(&g, rt), 0);
    for (int i = 0; i < 3; i++) /* three loops at once, from three tasks */
        cr_assert_eq(wf_spawn(&g, combos_in_task, &t), 0);
    cr_assert_eq(wf_group_wait(&g), 0);
    cr_assert_eq(atomic_load(&t.failures), 0, "%d loops run from tasks failed or missed indices",
                 atomic_load(&t.failures));
    cr_assert_eq(atomic_load(&t.off_worker), 0);
    wf_group_deinit(&g);
    wf_runtime_destroy(rt);
}

/* ---- Nesting ----------------------------------------------------------------------------------
 */

typedef struct nest {
    wf_runtime *rt;
    int64_t inner_len;
    atomic_uchar *hits;
    atomic_int inner_failures;
} nest;

static int inner_fn(void *ctx, int64_t b, int64_t e)
{
    nest *n = ctx;
    for (int64_t i = b; i < e; i++)
        atomic_fetch_add(&n->hits[i], 1);
    return 0;
}

static int outer_fn(void *ctx, int64_t b, int64_t e)
{
    nest *n = ctx;
    for (int64_t i = b; i < e; i++)
        if (wf_parallel_for(n->rt, i * n->inner_len, (i + 1) * n->inner_len, 10, inner_fn, n) != 0)
            atomic_fetch_add(&n->inner_failures, 1);
    return 0;
}

Test(sched_parallel_for, nested_loops_cover_every_index_once)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 4 });

    enum { OUTER = 64, INNER = 1000 };

    nest n = { .rt = rt, .inner_len = INNER };
    n.hits = calloc(OUTER * INNER, sizeof *n.hits);
    cr_assert_not_null(n.hits);
    int rc = wf_parallel_for(rt, 0, OUTER, 1, outer_fn, &n);
    cr_assert_eq(rc, 0, "%s", wf_last_errmsg());
    cr_assert_eq(atomic_load(&n.inner_failures), 0);
    for (int i = 0; i < OUTER * INNER; i++)
        if (atomic_load(&n.hits[i]) != 1)
            cr_assert_fail("index %d covered %d times", i, atomic_load(&n.hits[i]));
    free(n.hits);
    wf_runtime_destroy(rt);
}

/* ---- Where pieces run -------------------------------------------------------------------------
 */

typedef struct spread {
    wf_runtime *rt;
    atomic_long per_worker[8];
    atomic_long off_worker;
} spread;

static int spread_fn(void *ctx, int64_t b, int64_t e)
{
    spread *s = ctx;
    int w = wf_runtime_current_worker(s->rt);
    if (w < 0 || w >= 8)
        atomic_fetch_add(&s->off_worker, 1);
    else
        atomic_fetch_add(&s->per_worker[w], e - b);
    wf_test_busy_ns((uint64_t)(e - b) * 5000);
    return 0;
}

Test(sched_parallel_for, a_long_loop_runs_on_more_than_one_worker)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 4 });
    spread s = { .rt = rt };
    int64_t n = wf_test_scaled(20000, 4000); /* 5 us each: 100 ms of work */
    cr_assert_eq(wf_parallel_for(rt, 0, n, 1, spread_fn, &s), 0);
    cr_assert_eq(atomic_load(&s.off_worker), 0,
                 "pieces of a loop called from outside ran on the caller");
    int used = 0;
    for (int w = 0; w < 4; w++)
        used += atomic_load(&s.per_worker[w]) > 0;
    cr_assert_geq(used, 2, "a %lld-iteration loop ran on %d worker(s)", (long long)n, used);
    wf_runtime_destroy(rt);
}

/* ---- int64 limits -----------------------------------------------------------------------------
 */

/* Records pieces, to check that they tile [begin, end) without touching each index. */
typedef struct tiling {
    int64_t begin, end;

    struct piece {
        int64_t b, e;
    } * pieces;

    atomic_int n;
    int cap;
    atomic_int overflow;
} tiling;

static int tile_fn(void *ctx, int64_t b, int64_t e)
{
    tiling *t = ctx;
    int i = atomic_fetch_add(&t->n, 1);
    if (i >= t->cap) {
        atomic_store(&t->overflow, 1);
        return 0;
    }
    t->pieces[i].b = b;
    t->pieces[i].e = e;
    return 0;
}

static int by_begin(const void *x, const void *y)
{
    const struct piece *a = x, *b = y;
    return a->b < b->b ? -1 : a->b > b->b;
}

static void assert_tiles(wf_runtime *rt, int64_t begin, int64_t end, int64_t grain)
{
    tiling t = { .begin = begin, .end = end, .cap = 1 << 16 };
    t.pieces = calloc((size_t)t.cap, sizeof *t.pieces);
    cr_assert_not_null(t.pieces);
    int rc = wf_parallel_for(rt, begin, end, grain, tile_fn, &t);
    cr_assert_eq(rc, 0, "[%lld, %lld) grain %lld: %s: %s", (long long)begin, (long long)end,
                 (long long)grain, wf_err_name(rc), wf_last_errmsg());
    cr_assert_eq(atomic_load(&t.overflow), 0, "[%lld, %lld) grain %lld: over %d pieces",
                 (long long)begin, (long long)end, (long long)grain, t.cap);
    int n = atomic_load(&t.n);
    cr_assert_gt(n, 0);
    qsort(t.pieces, (size_t)n, sizeof *t.pieces, by_begin);
    cr_assert_eq(t.pieces[0].b, begin, "the first piece starts at %lld, not %lld",
                 (long long)t.pieces[0].b, (long long)begin);
    for (int i = 0; i < n; i++) {
        cr_assert_lt(t.pieces[i].b, t.pieces[i].e, "piece [%lld, %lld) is empty or reversed",
                     (long long)t.pieces[i].b, (long long)t.pieces[i].e);
        if (i + 1 < n)
            cr_assert_eq(t.pieces[i].e, t.pieces[i + 1].b,
                         "pieces [%lld, %lld) and [%lld, %lld) leave a gap or overlap",
                         (long long)t.pieces[i].b, (long long)t.pieces[i].e,
                         (long long)t.pieces[i + 1].b, (long long)t.pieces[i + 1].e);
    }
    cr_assert_eq(t.pieces[n - 1].e, end, "the last piece ends at %lld, not %lld",
                 (long long)t.pieces[n - 1].e, (long long)end);
    free(t.pieces);
}

Test(sched_parallel_for, ranges_near_the_int64_limits_are_tiled_without_overflow)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 4 });
    assert_tiles(rt, INT64_MAX - 1000, INT64_MAX, 1);
    assert_tiles(rt, INT64_MIN, INT64_MIN + 1000, 1);
    /* begin + end overflows: a midpoint computed as (begin + end) / 2 goes wrong. */
    assert_tiles(rt, (int64_t)1 << 62, ((int64_t)1 << 62) + ((int64_t)1 << 61), (int64_t)1 << 56);
    assert_tiles(rt, -((int64_t)1 << 62), -((int64_t)1 << 62) + 5000, 3);
    wf_runtime_destroy(rt);
}

Test(sched_parallel_for, a_huge_range_with_a_large_grain_is_tiled)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 4 });
    assert_tiles(rt, 0, (int64_t)1 << 40, (int64_t)1 << 30);
    assert_tiles(rt, -((int64_t)1 << 61), (int64_t)1 << 61, (int64_t)1 << 55);
    wf_runtime_destroy(rt);
}

/* [INT64_MIN, INT64_MAX) holds 2^64 - 1 iterations: 'end - begin' does not fit in int64. */
Test(sched_parallel_for, a_range_longer_than_int64_max_is_tiled_without_overflow, .timeout = 20)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 4 });
    assert_tiles(rt, INT64_MIN, INT64_MAX, (int64_t)1 << 58);
    assert_tiles(rt, -((int64_t)1 << 62) * 2 + 1, ((int64_t)1 << 62) + 1, (int64_t)1 << 59);
    wf_runtime_destroy(rt);
}

/* ---- Errors -------------------------------------------------------------------------------------
 */

typedef struct failer {
    int64_t bad;
    int use_task_fail;
} failer;

static int fail_at(void *ctx, int64_t b, int64_t e)
{
    failer *f = ctx;
    if (f->bad < b || f->bad >= e)
        return 0;
    if (f->use_task_fail)
        return wf_task_fail(WF_EFORMAT, "bad row %lld", (long long)f->bad);
    return WF_EIO;
}

Test(sched_parallel_for, an_error_of_fn_is_returned)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 4 });
    failer f = { .bad = 777 };
    for (int64_t grain = 0; grain <= 64; grain += 16) {
        int rc = wf_parallel_for(rt, 0, 10000, grain, fail_at, &f);
        cr_assert_eq(rc, WF_EIO, "grain %lld: got %s", (long long)grain, wf_err_name(rc));
    }
    wf_runtime_destroy(rt);
}

Test(sched_parallel_for, the_message_of_a_failing_piece_is_in_last_errmsg)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 4 });
    failer f = { .bad = 777, .use_task_fail = 1 };
    int rc = wf_parallel_for(rt, 0, 10000, 8, fail_at, &f);
    cr_assert_eq(rc, WF_EFORMAT, "got %s", wf_err_name(rc));
    cr_assert(strstr(wf_last_errmsg(), "bad row 777") != NULL, "wf_last_errmsg() is \"%s\"",
              wf_last_errmsg());
    wf_runtime_destroy(rt);
}

typedef struct nested_fail {
    wf_runtime *rt;
    failer inner;
} nested_fail;

static int outer_failing(void *ctx, int64_t b, int64_t e)
{
    nested_fail *n = ctx;
    for (int64_t i = b; i < e; i++) {
        int rc = wf_parallel_for(n->rt, i * 100, (i + 1) * 100, 4, fail_at, &n->inner);
        if (rc < 0)
            return rc;
    }
    return 0;
}

Test(sched_parallel_for, an_error_in_a_nested_loop_reaches_the_outer_caller)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 4 });
    nested_fail n = { .rt = rt, .inner = { .bad = 1234 } };
    int rc = wf_parallel_for(rt, 0, 50, 1, outer_failing, &n);
    cr_assert_eq(rc, WF_EIO, "got %s", wf_err_name(rc));
    wf_runtime_destroy(rt);
}
