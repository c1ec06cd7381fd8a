/* tests/memory/test_internal_arena.c: arenas (memory/arena.c) on a hand-made memory plan,
 *   with no graph: each planned output's tensor lies at its offset in one pool block of the
 *   plan's size and unplanned nodes have none; a tensor is handed out only with its own dtype
 *   and shape and only while nobody else holds it; wf__arena_holds() tells arena tensors
 *   from the pool's; release gives the block back (the pool's live bytes fall to 0); a
 *   failed block allocation leaves no arena. (Poisoning, for builds without NDEBUG only, is
 *   not tested here.)
 * Internal: calls memory/arena.h. */
#include "../../memory/arena.h"

#include <weft/weft.h>

#include <criterion/criterion.h>

#include <stdint.h>

static wf_runtime *rt;

static void setup(void)
{
    cr_assert_eq(wf_runtime_create(&rt, NULL), 0, "%s", wf_last_errmsg());
}

static void teardown(void)
{
    wf_runtime_destroy(rt);
}

TestSuite(memory_internal_arena, .init = setup, .fini = teardown, .timeout = 30);

static const wf_shape S64 = { .rank = 1, .dims = { 64 } }; /* 256 bytes of f32 */
static const wf_shape S8 = { .rank = 1, .dims = { 8 } };

/* Three nodes: 0 at +0, 1 not planned, 2 at +256, in a 512-byte arena. */
static int64_t offset[3] = { 0, -1, 256 };
static uint8_t given[3] = { 0, 0, 0 };
static const wf__mem_plan plan = { .n = 3, .offset = offset, .given = given, .arena_bytes = 512 };
static const wf_dtype dts[3] = { WF_F32, WF_F32, WF_F32 };
static const wf_shape shs[3] = { { .rank = 1, .dims = { 64 } },
                                 { .rank = 1, .dims = { 8 } },
                                 { .rank = 1, .dims = { 64 } } };

static wf_pool *make_pool(int64_t fail_after)
{
    wf_pool_opts o = { .fail_after = fail_after };
    wf_pool *p = NULL;
    cr_assert_eq(wf_pool_create(rt, &o, &p), 0, "%s", wf_last_errmsg());
    return p;
}

static uint64_t live(const wf_pool *p)
{
    wf_pool_stats s;
    cr_assert_eq(wf_pool_get_stats(p, &s), 0);
    return s.bytes_live;
}

Test(memory_internal_arena, tensors_lie_at_their_offsets_in_one_block)
{
    wf_pool *pool = make_pool(0);
    wf__arena a;
    cr_assert_eq(wf__arena_make(&a, pool, &plan, dts, shs), 0, "%s", wf_last_errmsg());
    cr_assert_not_null(a.block);
    cr_assert_eq(a.bytes, 512);
    cr_assert_eq(live(pool), 512, "one block of the plan's size");
    cr_assert_eq(a.n, 3);
    cr_assert_eq((void *)a.t[0]->data, a.block);
    cr_assert_null(a.t[1], "an unplanned node has no tensor");
    cr_assert_eq((void *)a.t[2]->data, (void *)((char *)a.block + 256));
    cr_assert(wf_shape_equal(a.t[2]->shape, S64));
    cr_assert_eq(a.t[2]->dtype, WF_F32);
    cr_assert(wf__arena_holds(a.t[0]));
    wf_tensor *other = NULL;
    cr_assert_eq(wf_pool_tensor(pool, WF_F32, S64, NULL, &other), 0);
    cr_assert_not(wf__arena_holds(other), "a pool tensor is no arena's");
    cr_assert_not(wf__arena_holds(NULL));
    wf_tensor_release(other);
    wf__arena_release(&a);
    cr_assert_null(a.block);
    cr_assert_null(a.t);
    cr_assert_eq(live(pool), 0, "the block went back to the pool");
    wf__arena_release(&a); /* an empty arena: nothing */
    wf_pool_destroy(pool);
}

Test(memory_internal_arena, a_tensor_is_handed_out_only_as_planned_and_unheld)
{
    wf_pool *pool = make_pool(0);
    wf__arena a;
    cr_assert_eq(wf__arena_make(&a, pool, &plan, dts, shs), 0);
    cr_assert_null(wf__arena_take(&a, 0, WF_F64, S64), "another dtype");
    cr_assert_null(wf__arena_take(&a, 0, WF_F32, S8), "another shape");
    cr_assert_null(wf__arena_take(&a, 1, WF_F32, S8), "not planned");
    wf_tensor *t = wf__arena_take(&a, 0, WF_F32, S64);
    cr_assert_eq(t, a.t[0]);
    cr_assert_null(wf__arena_take(&a, 0, WF_F32, S64), "held by someone: not again");
    wf_tensor_release(t);
    t = wf__arena_take(&a, 0, WF_F32, S64);
    cr_assert_eq(t, a.t[0], "free again once released");
    wf_tensor_release(t);
    wf__arena_release(&a);
    wf_pool_destroy(pool);
}

Test(memory_internal_arena, a_failed_block_leaves_no_arena)
{
    wf_pool *pool = make_pool(1);
    wf__arena a;
    cr_assert_eq(wf__arena_make(&a, pool, &plan, dts, shs), WF_ENOMEM);
    cr_assert_null(a.block);
    cr_assert_null(a.t);
    cr_assert_eq(live(pool), 0);
    wf__arena_release(&a);
    wf_pool_destroy(pool);
}
