/* runtime/compile/memplan.c: the plan's side of static memory planning: which outputs of a
 *   plan go in an arena and the problem memory/'s planner solves for them (memory/plan.h:
 *   nodes, inputs, control edges and orderings, bytes, in-place candidates).
 * Owns: wf__memplan (memory/'s plan plus the dtype and shape of each planned output), made
 *   once per static plan at compile time (wf__memplan_compile()) or per run slot for its feed
 *   shapes (wf__memplan_make(), called by runtime/arena.c), and its checker over the plan
 *   (wf__memplan_check, for tests).
 * The rules and the algorithm are memory/plan.c's; a plan that runs inline is a sequential
 *   problem there. Static plans may gain ordering edges ('edges', added to every slot's task
 *   graph); plans with -1 dimensions, planned per slot at run time, never do.
 * Not planned (their outputs come from the pool, as without a plan): placeholders,
 *   constants, variables, copies between devices; the fetched and targeted nodes (the plan's
 *   key: the caller keeps what it fetches, and a plan does not know which key nodes are
 *   fetched); update ops (their value is the variable's); ops with WF_OP_DYNAMIC_SHAPE and
 *   outputs whose shape is unknown (-1) at planning time; empty outputs. An output may take
 *   its input 0's bytes when its op has WF_OP_INPLACE and the two have one dtype and shape.
 *   Kernels write their output in place and return no views (core/op.h), so no value aliases
 *   an arena output beyond its readers; a fetched value that still did (a kernel that
 *   returned an input) is copied out (session.c, with wf__memplan_aliases()).
 * Not here: the planner itself (memory/plan.c), each slot's arena and the planned tensors
 *   over it (runtime/arena.c), running (exec.c), the plan arrays (plan.c), the pool
 *   (memory/). */
#include "../../memory/plan.h"
#include "plan.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void wf__memplan_free(wf__memplan *mp)
{
    if (!mp)
        return;
    wf__mem_plan_free(mp->m);
    free(mp->dtype);
    free(mp->shape);
    free(mp);
}

static bool known_shape(wf_shape s)
{
    for (int d = 0; d < s.rank; d++)
        if (s.dims[d] < 0)
            return false;
    return true;
}

static bool same_shape(wf_shape a, wf_shape b)
{
    if (a.rank != b.rank)
        return false;
    for (int d = 0; d < a.rank; d++)
        if (a.dims[d] != b.dims[d])
            return false;
    return true;
}

/* The bytes of an output of 'dt' and 'sh' that may be planned, or 0. */
static int64_t planned_bytes(wf_dtype dt, wf_shape sh)
{
    size_t b = 0;
    if (!known_shape(sh) || wf__tensor_check("memplan", dt, sh, &b) < 0 ||
        b > (size_t)INT64_MAX / 4)
        return 0;
    return (int64_t)b;
}

/* Whether plan node 'i' may have an output in the arena (see the header's list). */
static bool plannable(const wf__plan *p, const uint8_t *is_key, int i)
{
    const wf_op_def *op = p->nodes[i]->op;
    return p->kind[i] == WF__PN_KERNEL && !is_key[i] && op->n_assign == 0 &&
           !(op->flags & WF_OP_DYNAMIC_SHAPE);
}

/* memory/'s problem for plan 'p' (its arrays owned by 'g', freed by problem_free()). */
typedef struct problem {
    wf__mem_graph g;
    int32_t *dep_off, *dep_idx;
    int64_t *bytes;
    uint8_t *may_inplace;
} problem;

static void problem_free(problem *pr)
{
    free(pr->dep_off);
    free(pr->dep_idx);
    free(pr->bytes);
    free(pr->may_inplace);
}

/* The plan's nodes and edges as memory/'s problem, without bytes: inputs, and as other
 * predecessors the control edges and placement's orderings. Returns 0 or WF_ENOMEM. */
static int problem_make(const wf__plan *p, problem *pr)
{
    int n = p->n;
    memset(pr, 0, sizeof *pr);
    size_t nn = (size_t)(n ? n : 1);
    pr->dep_off = calloc(nn + 1, sizeof *pr->dep_off);
    pr->bytes = calloc(nn, sizeof *pr->bytes);
    pr->may_inplace = calloc(nn, 1);
    if (!pr->dep_off || !pr->bytes || !pr->may_inplace) {
        problem_free(pr);
        return wf__err(WF_ENOMEM, "wf_session_run: no memory to plan the memory of %d nodes", n);
    }
    for (int i = 0; i < n; i++)
        pr->dep_off[i + 1] = p->nodes[i]->n_control;
    for (int k = 0; k < p->n_order; k++)
        pr->dep_off[p->order[2 * k + 1] + 1]++;
    for (int i = 0; i < n; i++)
        pr->dep_off[i + 1] += pr->dep_off[i];
    int32_t *fill = calloc(nn, sizeof *fill);
    pr->dep_idx = malloc((size_t)(pr->dep_off[n] ? pr->dep_off[n] : 1) * sizeof *pr->dep_idx);
    if (!fill || !pr->dep_idx) {
        free(fill);
        problem_free(pr);
        return wf__err(WF_ENOMEM, "wf_session_run: no memory to plan the memory of %d nodes", n);
    }
    for (int i = 0; i < n; i++)
        for (int k = 0; k < p->nodes[i]->n_control; k++)
            pr->dep_idx[pr->dep_off[i] + fill[i]++] = p->index_of[p->nodes[i]->control[k]->id];
    for (int k = 0; k < p->n_order; k++) {
        int32_t a = p->order[2 * k + 1];
        pr->dep_idx[pr->dep_off[a] + fill[a]++] = p->order[2 * k];
    }
    free(fill);
    pr->g = (wf__mem_graph){
        .n = n,
        .in_off = p->in_off,
        .in_idx = p->in_idx,
        .dep_off = pr->dep_off,
        .dep_idx = pr->dep_idx,
        .bytes = pr->bytes,
        .may_inplace = pr->may_inplace,
        .seq = p->run_inline,
    };
    return 0;
}

int wf__memplan_make(const wf__plan *p, const wf_dtype *dt, const wf_shape *sh, bool may_add_edges,
                     wf__memplan **out)
{
    *out = NULL;
    int n = p->n;
    size_t nn = (size_t)(n ? n : 1);
    problem pr;
    int rc = problem_make(p, &pr);
    if (rc < 0)
        return rc;
    uint8_t *is_key = calloc(nn, 1);
    wf__memplan *mp = calloc(1, sizeof *mp);
    if (mp) {
        mp->dtype = calloc(nn, sizeof *mp->dtype);
        mp->shape = calloc(nn, sizeof *mp->shape);
    }
    if (!is_key || !mp || !mp->dtype || !mp->shape) {
        rc = wf__err(WF_ENOMEM, "wf_session_run: no memory to plan the memory of %d nodes", n);
        goto done;
    }
    for (int k = 0; k < p->n_key; k++)
        if (p->key[k] < p->n_graph && p->index_of[p->key[k]] >= 0)
            is_key[p->index_of[p->key[k]]] = 1;
    for (int i = 0; i < n; i++)
        if (plannable(p, is_key, i))
            pr.bytes[i] = planned_bytes(dt[i], sh[i]);
    for (int i = 0; i < n; i++) {
        const wf_node *node = p->nodes[i];
        if (pr.bytes[i] > 0 && (node->op->flags & WF_OP_INPLACE) && node->n_inputs > 0) {
            int32_t j = p->in_idx[p->in_off[i]];
            pr.may_inplace[i] = dt[j] == dt[i] && same_shape(sh[j], sh[i]);
        }
    }
    if ((rc = wf__mem_plan_make(&pr.g, may_add_edges, &mp->m)) < 0 || !mp->m)
        goto done;
    for (int i = 0; i < n; i++)
        if (mp->m->offset[i] >= 0) {
            mp->dtype[i] = dt[i];
            mp->shape[i] = sh[i];
        }
    *out = mp;
    mp = NULL;
done:
    wf__memplan_free(mp);
    free(is_key);
    problem_free(&pr);
    return rc;
}

void wf__memplan_compile(wf__plan *p, uint32_t flags)
{
    if (flags & WF_SESSION_NO_MEMPLAN)
        return;
    for (int k = 0; k < p->n_placeholders; k++)
        if (!known_shape(p->nodes[p->placeholders[k]]->shape))
            p->mp_dynamic = true;
    if (p->mp_dynamic)
        return;
    int n = p->n;
    wf_dtype *dt = malloc((size_t)(n ? n : 1) * sizeof *dt);
    wf_shape *sh = malloc((size_t)(n ? n : 1) * sizeof *sh);
    if (dt && sh) {
        for (int i = 0; i < n; i++) {
            dt[i] = p->nodes[i]->dtype;
            sh[i] = p->nodes[i]->shape;
        }
        if (wf__memplan_make(p, dt, sh, true, &p->mp) == 0 && p->mp) {
            p->stats.bytes_intermediates = p->mp->m->bytes_intermediates;
            p->stats.bytes_planned = p->mp->m->arena_bytes;
        }
    }
    free(dt);
    free(sh);
}

int wf__memplan_check(const wf__plan *p, const wf__memplan *mp)
{
    if (!mp)
        return 0;
    if (mp->m->n != p->n)
        return wf__err(WF_EINVAL, "memplan: made for %d nodes, the plan has %d", mp->m->n, p->n);
    /* The bytes of the planned outputs from their planned types, in place as each op allows:
     * the plan's own view, independently of how the planner chose. */
    problem pr;
    int rc = problem_make(p, &pr);
    if (rc < 0)
        return rc;
    for (int i = 0; i < p->n; i++) {
        if (mp->m->offset[i] < 0)
            continue;
        size_t b = 0;
        pr.bytes[i] =
            wf__tensor_check("memplan", mp->dtype[i], mp->shape[i], &b) < 0 ? 0 : (int64_t)b;
        pr.may_inplace[i] = (p->nodes[i]->op->flags & WF_OP_INPLACE) != 0;
    }
    int u, v;
    rc = wf__mem_plan_check(&pr.g, mp->m, &u, &v);
    problem_free(&pr);
    if (rc != WF_EINVAL || u < 0)
        return rc;
    char a[WF_ERRMSG_MAX], b[WF_ERRMSG_MAX];
    if (u == v)
        return wf__err(WF_EINVAL, "memplan: %s is outside the arena",
                       wf__rt_node_desc(p->nodes[v], a, sizeof a));
    return wf__err(WF_EINVAL, "memplan: %s at +%lld and %s at +%lld overlap but may run at once",
                   wf__rt_node_desc(p->nodes[u], a, sizeof a), (long long)mp->m->offset[u],
                   wf__rt_node_desc(p->nodes[v], b, sizeof b), (long long)mp->m->offset[v]);
}
