/* runtime/memplan.c: the plan's side of static memory planning: which outputs of a plan
 *   go in an arena, the problem memory/'s planner solves for them (memory/plan.h: nodes,
 *   inputs, control edges and orderings, bytes, in-place candidates), and each slot's arena.
 * Owns: wf__memplan (memory/'s plan plus the dtype and shape of each planned output), its
 *   checker over the plan (wf__memplan_check, for tests), the debug-build poisoning of dead
 *   outputs, and each slot's arena: one block of the session's pool (so the pool's
 *   statistics count it; advised to use transparent huge pages, memory/huge.h) and one
 *   tensor header per planned output over it, made at the slot's first run and kept across
 *   runs (made again only when a plan with -1 dimensions sees new feed shapes). So after its
 *   first run a slot takes from the pool only the outputs of fetched and targeted kernel
 *   nodes (a training step fetching its loss: one block per step; tests/runtime/
 *   test_internal_memplan.c).
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
 * Invariant: a slot's planned tensor has one reference (the slot's) between runs, and one
 *   more (its value slot) while its value lives; wf__memplan_out() hands it out only when
 *   nobody else holds it, else the output comes from the pool.
 * Not here: the planner itself (memory/plan.c), running (exec.c), the plan arrays
 *   (plan.c), the pool (memory/). */
#include "../memory/huge.h"
#include "../memory/plan.h"
#include "../memory/pool.h"
#include "internal.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

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
        if (p->key[k] < p->sess->n_nodes && p->index_of[p->key[k]] >= 0)
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

void wf__memplan_compile(wf__plan *p)
{
    if (p->sess->flags & WF_SESSION_NO_MEMPLAN)
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

/* ---- A slot's arena ----------------------------------------------------------------------- */

/* The free hook of planned tensors' buffers: the arena outlives them and is freed whole. */
static void arena_keep(void *ctx, void *data, size_t bytes)
{
    (void)ctx;
    (void)data;
    (void)bytes;
}

bool wf__memplan_aliases(const wf_tensor *t)
{
    return t && t->buf && t->buf->free_fn == arena_keep;
}

void wf__memplan_slot_release(wf__slot *sl)
{
    if (sl->planned)
        for (int i = 0; i < sl->plan->n; i++)
            wf_tensor_release(sl->planned[i]);
    free(sl->planned);
    sl->planned = NULL;
    if (sl->arena)
        wf_pool_free(sl->plan->sess->pool, sl->arena, sl->arena_bytes);
    sl->arena = NULL;
    sl->arena_bytes = 0;
    wf__memplan_free(sl->own_mp);
    sl->own_mp = NULL;
    sl->mp = NULL;
}

/* Makes the arena and the planned tensors of 'sl' for 'mp'. Returns 0 or WF_ENOMEM (the
 * slot is then left without an arena). */
static int slot_arena(wf__slot *sl, const wf__memplan *mp)
{
    int n = sl->plan->n;
    sl->arena_bytes = (size_t)(mp->m->arena_bytes ? mp->m->arena_bytes : 1);
    int rc = wf_pool_alloc(sl->plan->sess->pool, sl->arena_bytes, &sl->arena);
    if (rc < 0) {
        sl->arena = NULL;
        sl->arena_bytes = 0;
        return rc;
    }
    /* Transparent huge pages over the whole 2 MiB pages of the arena (memory/huge.h; when THP is in
     * "madvise" mode, Debian's default, nothing else gets them). A training step streams through
     * its arena several times: the GPT step's is 53 MB, 13000 pages of 4 KiB against about 2000
     * second-level TLB entries. Measured there (perf/train/train_bench, "cpu_s", 5 interleaved
     * pairs of processes): 126 -> 122 ms of CPU a step, peak RSS the same. With 2 MiB pages the
     * arena's cache-set mapping also stops depending on which physical pages a process happened to
     * get. Advice only: its failure changes nothing. */
    wf__advise_huge(sl->arena, sl->arena_bytes);
    if (!(sl->planned = calloc((size_t)(n ? n : 1), sizeof *sl->planned)))
        return WF_ENOMEM;
    for (int i = 0; i < n; i++) {
        if (mp->m->offset[i] < 0)
            continue;
        size_t b = 0;
        (void)wf__tensor_check("memplan", mp->dtype[i], mp->shape[i], &b);
        sl->planned[i] = wf__tensor_adopt(
            mp->dtype[i], mp->shape[i], (char *)sl->arena + mp->m->offset[i], b, arena_keep, NULL);
        if (!sl->planned[i])
            return WF_ENOMEM;
    }
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
            same = same_shape(sl->fed[k], sl->vals[p->placeholders[k]]->shape);
        if (same)
            return;
        wf__memplan_slot_release(sl);
    }
    slot_plan_dynamic(sl);
}

void wf__memplan_poison(const wf__slot *sl, int i, const wf_tensor *t)
{
#ifdef NDEBUG
    (void)sl;
    (void)i;
    (void)t;
#else
    /* Only when nobody else holds it: the slot's reference and the dying value's. */
    if (t && sl->planned && sl->planned[i] == t && !sl->mp->m->given[i] &&
        atomic_load_explicit(&t->refs, memory_order_acquire) == 2 &&
        atomic_load_explicit(&t->buf->refs, memory_order_acquire) == 1)
        memset(t->data, 0xff, t->buf->bytes);
#endif
}

wf_tensor *wf__memplan_out(wf__slot *sl, int i, wf_dtype dt, wf_shape shape)
{
    wf_tensor *t = sl->planned ? sl->planned[i] : NULL;
    if (!t || t->dtype != dt || !same_shape(t->shape, shape) ||
        atomic_load_explicit(&t->refs, memory_order_acquire) != 1 ||
        atomic_load_explicit(&t->buf->refs, memory_order_acquire) != 1)
        return NULL;
    return wf_tensor_retain(t);
}
