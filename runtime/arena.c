/* runtime/arena.c: each run slot's arena, the run side of static memory planning.
 * Owns: when a slot makes, keeps and drops its arena (memory/arena.h: one block of the
 *   session's pool with one tensor per planned output at the memory plan's offset;
 *   runtime/compile/memplan.c made the plan): made at the slot's first run and kept across
 *   runs, made again only when a plan with -1 dimensions sees new feed shapes (planned again
 *   for them here, with the run's shapes, and the plan's statistics updated); a planned
 *   output for a node's task; the poisoning of dead outputs in debug builds. So after its
 *   first run a slot takes from the pool only the outputs of fetched and targeted kernel
 *   nodes (a training step fetching its loss: one block per step; tests/runtime/
 *   test_internal_memplan.c).
 * Invariant: a slot's planned tensor has one reference (the arena's) between runs, and one
 *   more (its value slot) while its value lives; wf__memplan_out() hands it out only when
 *   nobody else holds it, else the output comes from the pool.
 * Not here: which outputs are planned and where (runtime/compile/memplan.c, memory/plan.c),
 *   the arena itself (memory/arena.c), running (exec.c), the pool (memory/). */
#include "../memory/arena.h"

#include "internal.h"

#include <stdlib.h>
#include <string.h>

static bool known_shape(wf_shape s)
{
    for (int d = 0; d < s.rank; d++)
        if (s.dims[d] < 0)
            return false;
    return true;
}

bool wf__memplan_aliases(const wf_tensor *t)
{
    return wf__arena_holds(t);
}

void wf__memplan_slot_release(wf__slot *sl)
{
    wf__arena_release(&sl->arena);
    wf__memplan_free(sl->own_mp);
    sl->own_mp = NULL;
    sl->mp = NULL;
}

/* Makes the arena and the planned tensors of 'sl' for 'mp'. Returns 0 or WF_ENOMEM (the
 * slot is then left without an arena). */
static int slot_arena(wf__slot *sl, const wf__memplan *mp)
{
    int rc = wf__arena_make(&sl->arena, sl->plan->sess->pool, mp->m, mp->dtype, mp->shape);
    if (rc < 0)
        return rc;
    sl->mp = mp;
    return 0;
}

/* The concrete dtypes and shapes of a run's nodes for the feeds in 'sl->vals' (a -1
 * dimension where they are known only when the kernel runs). Returns 0 or WF_ENOMEM. */
static int run_shapes(const wf__slot *sl, wf_dtype *dt, wf_shape *sh)
{
    const wf__plan *p = sl->plan;
    int max_in = 1;
    for (int i = 0; i < p->n; i++)
        if (p->nodes[i]->n_inputs > max_in)
            max_in = p->nodes[i]->n_inputs;
    wf_dtype *idt = malloc((size_t)max_in * sizeof *idt);
    wf_shape *ish = malloc((size_t)max_in * sizeof *ish);
    if (!idt || !ish) {
        free(idt);
        free(ish);
        return WF_ENOMEM;
    }
    const wf_shape unknown = { .rank = 1, .dims = { -1 } };
    for (int i = 0; i < p->n; i++) {
        const wf_node *node = p->nodes[i];
        dt[i] = node->dtype;
        sh[i] = node->shape;
        if (p->kind[i] == WF__PN_PLACEHOLDER && sl->vals[i]) {
            sh[i] = sl->vals[i]->shape;
        } else if ((p->kind[i] == WF__PN_KERNEL || p->kind[i] == WF__PN_COPY) && p->reinfer[i]) {
            bool ok = true;
            for (int k = 0; k < node->n_inputs; k++) {
                int32_t j = p->in_idx[p->in_off[i] + k];
                idt[k] = dt[j];
                ish[k] = sh[j];
                ok = ok && known_shape(sh[j]);
            }
            /* A failed inference is reported by the run itself (exec.c). */
            if (!ok || wf__op_infer(node, idt, ish, &dt[i], &sh[i]) < 0)
                sh[i] = unknown;
        }
    }
    free(idt);
    free(ish);
    return 0;
}

/* Plans 'sl' for its feeds (a plan with -1 dimensions); updates the plan's statistics. */
static void slot_plan_dynamic(wf__slot *sl)
{
    wf__plan *p = sl->plan;
    int n = p->n;
    wf_dtype *dt = malloc((size_t)(n ? n : 1) * sizeof *dt);
    wf_shape *sh = malloc((size_t)(n ? n : 1) * sizeof *sh);
    if (!sl->fed)
        sl->fed = calloc((size_t)(p->n_placeholders ? p->n_placeholders : 1), sizeof *sl->fed);
    wf__memplan *mp = NULL;
    if (dt && sh && sl->fed && run_shapes(sl, dt, sh) == 0 &&
        wf__memplan_make(p, dt, sh, false, &mp) == 0 && mp) {
        for (int k = 0; k < p->n_placeholders; k++)
            sl->fed[k] = sl->vals[p->placeholders[k]]->shape;
        sl->own_mp = mp;
        if (slot_arena(sl, mp) < 0)
            wf__memplan_slot_release(sl);
        else {
            wf_session *s = p->sess;
            pthread_mutex_lock(&s->plans_mu);
            p->stats.bytes_intermediates = mp->m->bytes_intermediates;
            p->stats.bytes_planned = mp->m->arena_bytes;
            if (s->plans == p) {
                s->last_stats.bytes_intermediates = mp->m->bytes_intermediates;
                s->last_stats.bytes_planned = mp->m->arena_bytes;
            }
            pthread_mutex_unlock(&s->plans_mu);
        }
    }
    free(dt);
    free(sh);
}

void wf__memplan_slot_ready(wf__slot *sl)
{
    wf__plan *p = sl->plan;
    if (p->sess->flags & WF_SESSION_NO_MEMPLAN)
        return;
    if (!p->mp_dynamic) {
        if (p->mp && !sl->mp && slot_arena(sl, p->mp) < 0)
            wf__memplan_slot_release(sl); /* the pool serves this run; the next one retries */
        return;
    }
    if (sl->mp) {
        bool same = true;
        for (int k = 0; same && k < p->n_placeholders; k++)
            same = wf_shape_equal(sl->fed[k], sl->vals[p->placeholders[k]]->shape);
        if (same)
            return;
        wf__memplan_slot_release(sl);
    }
    slot_plan_dynamic(sl);
}

void wf__memplan_poison(const wf__slot *sl, int i, const wf_tensor *t)
{
    if (sl->mp)
        wf__arena_poison(&sl->arena, i, t, sl->mp->m->given[i]);
}

wf_tensor *wf__memplan_out(wf__slot *sl, int i, wf_dtype dt, wf_shape shape)
{
    return wf__arena_take(&sl->arena, i, dt, shape);
}
