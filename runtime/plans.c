/* runtime/plans.c: the session's cache of compiled plans, the run side's end of a compile.
 * Owns: the compile input made from a session (wf__compile_in, runtime/compile/plan.h: its
 *   graph, options, registry and devices' counts, and the hooks through which a compile
 *   asks the session for a lazy variable's value, a device and a pipeline's orderings), the
 *   run-side fields of a kept plan (its slots' list and lock, its session), the cache keyed
 *   by the set of fetched and targeted node ids, and destroying a plan with its slots.
 * Why a cache keyed by the set: TensorFlow's DirectSession does the same (one executor per
 *   feed/fetch/target signature): the first run of a set compiles, every later run replays
 *   the plan and its pre-built task graphs (a replayed task graph allocates and builds
 *   nothing: sched/taskgraph.c). Feeds are not part of the key because only placeholders
 *   can be fed, and they prune nothing.
 * Not here: compiling (runtime/compile/plan.c), the slots (exec.c), the session API
 *   (session.c). */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

static int var_need(void *ctx, int k)
{
    return wf__session_var_need(ctx, k);
}

static int open_device(void *ctx, int id, int n_dev, struct wf_device **out)
{
    return wf__session_device(ctx, id, n_dev, out);
}

static int add_order(void *ctx, wf__plan *p)
{
    return wf__dp_plan_order(ctx, p);
}

void wf__plan_destroy(wf__plan *p)
{
    if (!p)
        return;
    for (int i = 0; p->all_slots && i < p->max_slots; i++)
        wf__slot_destroy(p->all_slots[i]);
    free(p->all_slots);
    wf__plan_place_free(p); /* after the slots: their device values use the devices */
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    wf__plan_free(p);
}

/* Compiles 'key' for 's' and gives the plan its run-side fields. */
static int compile(wf_session *s, const int32_t *key, int n_key, wf__plan **out)
{
    const wf__compile_in in = {
        .g = s->g,
        .n_nodes = s->n_nodes,
        .var_of = s->var_of,
        .flags = s->flags,
        .device = s->device,
        .n_sim = s->n_sim,
        .rt = s->rt,
        .kernels = s->kernels,
        .local_reduce = wf__dp_is_pipeline(s->dp),
        .ctx = s,
        .var_need = var_need,
        .open_device = open_device,
        .add_order = s->dp ? add_order : NULL,
    };
    wf__plan *p;
    int rc = wf__plan_compile(&in, key, n_key, &p);
    if (rc < 0)
        return rc;
    if (!(p->all_slots = calloc((size_t)s->max_slots, sizeof *p->all_slots))) {
        int n = p->n;
        wf__plan_free(p);
        return wf__err(WF_ENOMEM, "wf_session_run: no memory for a plan of %d nodes", n);
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->sess = s;
    p->max_slots = s->max_slots;
    *out = p;
    return 0;
}

int wf__plan_get(wf_session *s, const int32_t *key, int n_key, wf__plan **out)
{
    pthread_mutex_lock(&s->plans_mu);
    for (wf__plan *p = s->plans; p; p = p->next)
        if (p->n_key == n_key && memcmp(p->key, key, (size_t)n_key * sizeof *key) == 0) {
            pthread_mutex_unlock(&s->plans_mu);
            *out = p;
            return 0;
        }
    /* Without folding, a compile is O(needed nodes) and runs under the lock, so a set is
     * never compiled twice; other runs wait for it only at their first step (this lookup).
     * Folding runs kernels, which may split themselves with wf_parallel_for(): a worker
     * waiting for those pieces may run other tasks meanwhile, and such a task may be a run
     * of this session (runs from inside tasks are allowed) that needs 'plans_mu'. So a
     * compile that may fold drops the lock, and a set compiled twice by racing runs keeps
     * the plan inserted first. */
    if (!(s->flags & WF_SESSION_NO_FOLD)) {
        pthread_mutex_unlock(&s->plans_mu);
        wf__plan *mine = NULL;
        int rc = compile(s, key, n_key, &mine);
        if (rc < 0)
            return rc;
        pthread_mutex_lock(&s->plans_mu);
        for (wf__plan *p = s->plans; p; p = p->next)
            if (p->n_key == n_key && memcmp(p->key, key, (size_t)n_key * sizeof *key) == 0) {
                pthread_mutex_unlock(&s->plans_mu);
                wf__plan_destroy(mine);
                *out = p;
                return 0;
            }
        *out = mine;
    } else {
        int rc = compile(s, key, n_key, out);
        if (rc < 0) {
            pthread_mutex_unlock(&s->plans_mu);
            return rc;
        }
    }
    (*out)->next = s->plans;
    s->plans = *out;
    s->n_plans++;
    s->last_stats = (*out)->stats;
    s->last_stats.n_plans = s->n_plans;
    pthread_mutex_unlock(&s->plans_mu);
    return 0;
}
