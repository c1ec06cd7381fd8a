/* tests/memory/test_internal_plan.c: the static memory planner as a pure function
 *   (memory/plan.c, wf__mem_plan_make()) on hand-made problems, with no graph or plan: a
 *   chain reuses the bytes of outputs whose readers have all run, two independent branches
 *   never share, an in-place candidate takes its input's bytes, and the checker refuses a
 *   plan that lets two outputs that may be live at once overlap.
 * Internal: calls memory/plan.h. */
#include "../../memory/plan.h"

#include <weft/weft.h>

#include <criterion/criterion.h>

#include <stdint.h>

TestSuite(memory_internal_plan, .timeout = 10);

#define KB 4096

/* a -> b -> c -> d, each output 4 KiB: d may reuse a's bytes (a's reader b ran before c). */
Test(memory_internal_plan, a_chain_reuses_bytes_whose_readers_have_run)
{
    int32_t off[] = { 0, 0, 1, 2, 3 }, idx[] = { 0, 1, 2 };
    int64_t bytes[] = { KB, KB, KB, KB };
    uint8_t inpl[4] = { 0 };
    wf__mem_graph g = { .n = 4, .in_off = off, .in_idx = idx, .bytes = bytes, .may_inplace = inpl };
    wf__mem_plan *mp;
    cr_assert_eq(wf__mem_plan_make(&g, false, &mp), 0);
    cr_assert_not_null(mp);
    cr_assert_eq(mp->n_planned, 4);
    cr_assert_eq(mp->bytes_live_min, 2 * KB);
    cr_assert_eq(mp->arena_bytes, 2 * KB, "got %lld", (long long)mp->arena_bytes);
    cr_assert_neq(mp->offset[0], mp->offset[1]);
    cr_assert_neq(mp->offset[1], mp->offset[2]);
    int u, v;
    cr_assert_eq(wf__mem_plan_check(&g, mp, &u, &v), 0, "%s", wf_last_errmsg());
    /* Overlap two outputs that are live at once: the checker names them. */
    mp->offset[2] = mp->offset[1];
    cr_assert_eq(wf__mem_plan_check(&g, mp, &u, &v), WF_EINVAL);
    cr_assert(u == 1 && v == 2, "got %d and %d", u, v);
    wf__mem_plan_free(mp);
}

/* a and b both read only by c: a and b may run at once, so they never share. */
Test(memory_internal_plan, independent_outputs_never_share)
{
    int32_t off[] = { 0, 0, 0, 2 }, idx[] = { 0, 1 };
    int64_t bytes[] = { KB, KB, KB };
    uint8_t inpl[3] = { 0 };
    wf__mem_graph g = { .n = 3, .in_off = off, .in_idx = idx, .bytes = bytes, .may_inplace = inpl };
    wf__mem_plan *mp;
    cr_assert_eq(wf__mem_plan_make(&g, false, &mp), 0);
    cr_assert_neq(mp->offset[0], mp->offset[1]);
    cr_assert_neq(mp->offset[2], mp->offset[0]);
    cr_assert_neq(mp->offset[2], mp->offset[1]);
    int u, v;
    cr_assert_eq(wf__mem_plan_check(&g, mp, &u, &v), 0, "%s", wf_last_errmsg());
    wf__mem_plan_free(mp);
}

/* a -> b in place: b takes a's bytes. */
Test(memory_internal_plan, an_inplace_candidate_takes_its_inputs_bytes)
{
    int32_t off[] = { 0, 0, 1 }, idx[] = { 0 };
    int64_t bytes[] = { KB, KB };
    uint8_t inpl[2] = { 0, 1 };
    wf__mem_graph g = { .n = 2, .in_off = off, .in_idx = idx, .bytes = bytes, .may_inplace = inpl };
    wf__mem_plan *mp;
    cr_assert_eq(wf__mem_plan_make(&g, false, &mp), 0);
    cr_assert_eq(mp->inplace[1], 1);
    cr_assert_eq(mp->given[0], 1);
    cr_assert_eq(mp->offset[1], mp->offset[0]);
    cr_assert_eq(mp->arena_bytes, KB);
    int u, v;
    cr_assert_eq(wf__mem_plan_check(&g, mp, &u, &v), 0, "%s", wf_last_errmsg());
    wf__mem_plan_free(mp);
}

Test(memory_internal_plan, nothing_to_plan_gives_no_plan)
{
    int32_t off[] = { 0, 0 };
    int64_t bytes[] = { 0 };
    uint8_t inpl[1] = { 0 };
    wf__mem_graph g = { .n = 1, .in_off = off, .bytes = bytes, .may_inplace = inpl };
    wf__mem_plan *mp = (wf__mem_plan *)1;
    cr_assert_eq(wf__mem_plan_make(&g, true, &mp), 0);
    cr_assert_null(mp);
}
