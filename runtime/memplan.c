/* runtime/memplan.c: static memory planning: one arena per run slot, each intermediate output
 *   of a plan at a fixed byte offset in it, so that a replayed plan allocates nothing but
 *   the values that leave the run.
 * Owns: the planner (wf__memplan_make: liveness over the plan's dependency graph, in-place
 *   reuse, best-fit placement, ordering edges), its independent checker (wf__memplan_check,
 *   for tests), the debug-build poisoning of dead outputs, and each slot's arena: one block
 *   of the session's pool (so the pool's statistics count it; advised to use transparent
 *   huge pages, memory/huge.h) and one tensor header per planned output over it, made at
 *   the slot's first run and kept across runs (made again only when a plan with -1
 *   dimensions sees new feed shapes). So after its first run a
 *   slot takes from the pool only the outputs of fetched and targeted kernel nodes (a
 *   training step fetching its loss: one block per step; tests/runtime/
 *   test_internal_memplan.c).
 * The sharing rule. Runs are parallel and work-stealing: the plan's list order is not the
 *   order nodes run in. So two planned outputs u (made by node P(u), read by nodes R(u)) and
 *   v (made later in the plan's order) may share bytes only if
 *     (a) P(u) and every node of R(u) are strict ancestors of P(v) in the plan's graph (data
 *         and control edges): every read of u happens before v is written, whichever worker
 *         runs what; or
 *     (b) in place: P(v) reads u as its input 0, its op has WF_OP_INPLACE, v has u's dtype
 *         and shape, and every other node of R(u) is a strict ancestor of P(v); v then takes
 *         exactly u's bytes (core/op.h: the kernel may write its output over input 0).
 *   A plan that runs inline (internal.h: 'run_inline', node by node in the plan's order on
 *   one thread) uses the same rules with "ancestor" meaning "earlier in the plan's order".
 * Placement. Inline plans: the outputs in the plan's order, each at the best fit (the
 *   smallest gap that holds it, else the top) among the outputs still live there. Other
 *   plans: a walk in the plan's (topological) order decides (b) and records which pairs
 *   (a) leaves in conflict (a P x P bit matrix); then the in-place chains are placed largest
 *   first, each at the best fit among the placed outputs it conflicts with (the greedy by
 *   size of TFLite's arena planner). Ancestor sets are bit sets, each freed once all of its
 *   node's successors are walked (a chain holds two); more than WF__MEMPLAN_MAX_BITS bytes
 *   of them at once, or more than MAX_MATRIX outputs, and the plan is left to the pool.
 * Ordering edges. Rule (a) alone cannot reach the sequential liveness minimum where the
 *   graph leaves independent work side by side: in an MLP step with one fused optimizer
 *   update, every weight gradient is read by the update at the end, and none is ordered
 *   against the others' inputs, so dW1 may not reuse what dW2's inputs held (1.37x the
 *   minimum for perf/train's MLP). So static plans are also placed a second time where a
 *   group that would grow the arena may take bytes of outputs it conflicts with if the
 *   plan's order puts one wholly before the other (its latest reader before the other's
 *   node): the plan then gains edges from that output's node and readers to the other's
 *   node ('edges', added to every slot's task graph; always forward in the plan's order, so
 *   no cycle). Those edges cost parallelism, so they are tried only when the plan without
 *   them is more than 1.25x the minimum, and kept only when the arena is at least
 *   1/EDGES_GAIN smaller (perf/train's MLP: 1.37x without, 1.00x with 23 edges; the GPT
 *   step: 1.35x without, 1.00x with 822; the CNN: 0.98x, none). Plans with -1 dimensions,
 *   planned per slot at run time, never add edges.
 * Not planned (their outputs come from the pool, as without a plan): placeholders,
 *   constants, variables; the fetched and targeted nodes (the plan's key: the caller keeps
 *   what it fetches, and a plan does not know which key nodes are fetched); update ops (their
 *   value is the variable's); ops with WF_OP_DYNAMIC_SHAPE and outputs whose shape is unknown
 *   (-1) at planning time; empty outputs. Kernels write their output in place and return no
 *   views (core/op.h), so no value aliases an arena output beyond its readers; a fetched
 *   value that still did (a kernel that returned an input) is copied out (session.c, with
 *   wf__memplan_aliases()).
 * Cost: O(n * n / 64 + P * (P + edges)) per plan, once per compile (per feed shape change
 *   for plans with -1 dimensions); the MLP of perf/train plans in well under a millisecond.
 * Invariant: a slot's planned tensor has one reference (the slot's) between runs, and one
 *   more (its value slot) while its value lives; wf__memplan_out() hands it out only when
 *   nobody else holds it, else the output comes from the pool.
 * Not here: running (exec.c), the plan arrays (plan.c), the pool (memory/). */
#include "../memory/huge.h"
#include "../memory/pool.h"
#include "internal.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* The most bytes of ancestor bit sets live at once (see the header). */
#define WF__MEMPLAN_MAX_BITS ((size_t)64 << 20)

/* Planned outputs start at multiples of this (the pool's and the kernels' alignment). */
#define ALIGN ((int64_t)WF_POOL_ALIGN)

void wf__memplan_free(wf__memplan *mp)
{
    if (!mp)
        return;
    free(mp->offset);
    free(mp->dtype);
    free(mp->shape);
    free(mp->inplace);
    free(mp->given);
    free(mp->edges);
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

/* The plan index of control input 'k' of plan node 'i'. */
static int32_t control_of(const wf__plan *p, int i, int k)
{
    return p->index_of[p->nodes[i]->control[k]->id];
}

/* The graph around the plan's nodes: readers per value, successor counts. */
typedef struct mp_graph {
    int32_t *rd_off, *rd_idx; /* CSR of readers: value u is read by rd_idx[rd_off[u] ..
                                 rd_off[u + 1]) (one entry per input edge) */
    int32_t *n_succ;          /* data and control successors per node */
    int32_t *last;            /* the latest reader in the plan's order, or u itself */
} mp_graph;

static void graph_free(mp_graph *g)
{
    free(g->rd_off);
    free(g->rd_idx);
    free(g->n_succ);
    free(g->last);
}

static int graph_make(const wf__plan *p, mp_graph *g)
{
    int n = p->n;
    int32_t e = p->in_off[n];
    memset(g, 0, sizeof *g);
    g->rd_off = calloc((size_t)n + 1, sizeof *g->rd_off);
    g->rd_idx = malloc((size_t)(e ? e : 1) * sizeof *g->rd_idx);
    g->n_succ = calloc((size_t)(n ? n : 1), sizeof *g->n_succ);
    g->last = malloc((size_t)(n ? n : 1) * sizeof *g->last);
    int32_t *fill = calloc((size_t)(n ? n : 1), sizeof *fill);
    if (!g->rd_off || !g->rd_idx || !g->n_succ || !g->last || !fill) {
        free(fill);
        graph_free(g);
        return wf__err(WF_ENOMEM, "wf_session_run: no memory to plan the memory of %d nodes", n);
    }
    for (int32_t k = 0; k < e; k++)
        g->rd_off[p->in_idx[k] + 1]++;
    for (int u = 0; u < n; u++)
        g->rd_off[u + 1] += g->rd_off[u];
    for (int i = 0; i < n; i++) {
        g->last[i] = i;
        for (int32_t k = p->in_off[i]; k < p->in_off[i + 1]; k++) {
            int32_t u = p->in_idx[k];
            g->rd_idx[g->rd_off[u] + fill[u]++] = i;
            g->n_succ[u]++;
        }
        for (int k = 0; k < p->nodes[i]->n_control; k++)
            g->n_succ[control_of(p, i, k)]++;
    }
    for (int u = 0; u < n; u++)
        for (int32_t k = g->rd_off[u]; k < g->rd_off[u + 1]; k++)
            if (g->rd_idx[k] > g->last[u])
                g->last[u] = g->rd_idx[k];
    free(fill);
    return 0;
}

static inline bool bit(const uint64_t *b, int32_t i)
{
    return (b[i >> 6] >> (i & 63)) & 1;
}

/* Whether every read of 'u' (and its making) happens before node 'v' runs: rule (a), or
 * rule (b)'s reader condition when 'except' is 'v' (its own read is then allowed).
 * 'anc' is v's ancestor set, NULL for an inline plan (ancestor = earlier in the order). */
static bool done_before(const mp_graph *g, const uint64_t *anc, int32_t u, int32_t v,
                        int32_t except)
{
    if (!anc) {
        if (except < 0)
            return g->last[u] < v;
        for (int32_t k = g->rd_off[u]; k < g->rd_off[u + 1]; k++)
            if (g->rd_idx[k] != except && g->rd_idx[k] >= v)
                return false;
        return u < v;
    }
    if (!bit(anc, u))
        return false;
    for (int32_t k = g->rd_off[u]; k < g->rd_off[u + 1]; k++) {
        int32_t r = g->rd_idx[k];
        if (r != except && !bit(anc, r))
            return false;
    }
    return true;
}

typedef struct span {
    int64_t lo, hi;
} span;

static int cmp_span(const void *a, const void *b)
{
    const span *x = a, *y = b;
    return (x->lo > y->lo) - (x->lo < y->lo);
}

static int64_t rounded(int64_t bytes)
{
    return (bytes + ALIGN - 1) / ALIGN * ALIGN;
}

/* The start of the smallest gap between 'spans[0 .. ns-1]' (taken bytes) that holds
 * 'need' bytes, or the end of the highest span. Sorts 'spans'. */
static int64_t best_fit(span *spans, int ns, int64_t need)
{
    qsort(spans, (size_t)ns, sizeof *spans, cmp_span);
    int64_t at = 0, best = -1, best_gap = INT64_MAX;
    for (int k = 0; k < ns; k++) {
        if (spans[k].lo > at && spans[k].lo - at >= need && spans[k].lo - at < best_gap) {
            best = at;
            best_gap = spans[k].lo - at;
        }
        if (spans[k].hi > at)
            at = spans[k].hi;
    }
    return best >= 0 ? best : at;
}

/* Whether plan node 'i' may have an output in the arena (see the header's list). */
static bool plannable(const wf__plan *p, const uint8_t *is_key, int i, wf_dtype dt, wf_shape sh,
                      int64_t *bytes)
{
    const wf_op_def *op = p->nodes[i]->op;
    if (p->kind[i] != WF__PN_KERNEL || is_key[i] || op->n_assign > 0 ||
        (op->flags & WF_OP_DYNAMIC_SHAPE) || !known_shape(sh))
        return false;
    size_t b = 0;
    if (wf__tensor_check("memplan", dt, sh, &b) < 0 || b == 0 || b > (size_t)INT64_MAX / 4)
        return false;
    *bytes = (int64_t)b;
    return true;
}

/* The most planned outputs of a plan that does not run inline (the conflict matrix is
 * P * P bits: 8 MiB here); beyond it the plan is left to the pool. */
#define MAX_MATRIX 8192

/* Ordering edges are tried only for an arena above (1 + 1/EDGES_ABOVE) times the liveness
 * minimum (the goal is 1.25x), and kept only when they shrink it by at least
 * 1/EDGES_GAIN. */
#define EDGES_ABOVE 4
#define EDGES_GAIN  16

/* How a plan is made (wf__memplan_make()): in the plan's order as outputs come (inline
 * plans); largest first over the conflicts of the plan's edges; the same, adding ordering
 * edges where they keep the arena from growing. */
enum { MODE_IN_ORDER, MODE_BY_SIZE, MODE_EDGES };

typedef struct planner {
    const wf__plan *p;
    wf__memplan *mp;
    const mp_graph *g;
    int n, P;               /* plan nodes, planned outputs */
    bool seq;               /* an inline plan: ancestor = earlier in the order */
    int mode;               /* MODE_*: see wf__memplan_make() */
    const int64_t *bytes;   /* per plan node: the output's bytes (planned nodes) */
    const int32_t *slot_of; /* per plan node: its index among the planned outputs, or -1 */
    const int32_t *ids;     /* per planned output: its plan node */
    int32_t *group;         /* per planned output: the first output of its in-place chain */
    uint8_t *taken;         /* per plan node: an output already took its bytes in place */
    uint64_t *conf; /* MODE_BY_SIZE: P rows of 'pw' words: bit (a, b): may be live at once */
    size_t pw;
    uint64_t **anc;  /* per plan node: its ancestor set (while needed) */
    size_t words;    /* of an ancestor set */
    int32_t *placed; /* in-order modes: outputs placed, plan order */
    int n_placed;
    int64_t top;        /* in-order modes: the arena so far */
    span *spans, *hard; /* scratch, P entries each */
    int32_t *edges;     /* MODE_EDGES: (before, after) pairs added */
    int n_edges, cap_edges;
} planner;

static void conflict(planner *pl, int32_t a, int32_t b)
{
    pl->conf[(size_t)a * pl->pw + (size_t)(b >> 6)] |= (uint64_t)1 << (b & 63);
    pl->conf[(size_t)b * pl->pw + (size_t)(a >> 6)] |= (uint64_t)1 << (a & 63);
}

/* MODE_EDGES: makes plan node 'after' run after plan node 'before'. */
static int add_edge(planner *pl, int32_t before, int32_t after)
{
    if (pl->n_edges == pl->cap_edges) {
        int cap = pl->cap_edges ? 2 * pl->cap_edges : 16;
        int32_t *e = realloc(pl->edges, (size_t)cap * 2 * sizeof *e);
        if (!e)
            return wf__err(WF_ENOMEM, "wf_session_run: no memory for %d ordering edges", cap);
        pl->edges = e;
        pl->cap_edges = cap;
    }
    pl->edges[2 * pl->n_edges] = before;
    pl->edges[2 * pl->n_edges + 1] = after;
    pl->n_edges++;
    return 0;
}

/* MODE_EDGES: orders output 'x' wholly before output 'y' (its node and every reader of x
 * before y's node), which the plan's order allows when x's latest reader comes before y. */
static int order_before(planner *pl, int32_t x, int32_t y)
{
    int rc = add_edge(pl, x, y);
    for (int32_t r = pl->g->rd_off[x]; r < pl->g->rd_off[x + 1] && rc == 0; r++)
        rc = add_edge(pl, pl->g->rd_idx[r], y);
    return rc;
}

static int cmp_edge(const void *a, const void *b)
{
    const int32_t *x = a, *y = b;
    return x[0] != y[0] ? (x[0] > y[0]) - (x[0] < y[0]) : (x[1] > y[1]) - (x[1] < y[1]);
}

/* In-order modes: the offset of 'v', which is not in place: the best fit among the outputs
 * placed before it that rule (a) does not release. */
static void place_in_order(planner *pl, int32_t v, const uint64_t *av)
{
    wf__memplan *mp = pl->mp;
    int ns = 0, keep = 0;
    for (int k = 0; k < pl->n_placed; k++) {
        int32_t w = pl->placed[k];
        if (done_before(pl->g, av, w, v, -1)) {
            if (!pl->seq) /* released for v only: later nodes may run beside w */
                pl->placed[keep++] = w;
            continue;
        }
        pl->placed[keep++] = w;
        pl->spans[ns++] = (span){ mp->offset[w], mp->offset[w] + rounded(pl->bytes[w]) };
    }
    pl->n_placed = keep; /* inline plans: a released output stays released */
    mp->offset[v] = best_fit(pl->spans, ns, rounded(pl->bytes[v]));
}

/* Plans output 'v' (its ancestor set 'av', NULL for inline plans) as the walk in the
 * plan's order reaches it: in place over input 0 (rule (b)), then its conflicts with the
 * outputs before it (MODE_BY_SIZE) or its offset at once (in-order modes). */
static int visit(planner *pl, int32_t v, const uint64_t *av)
{
    const wf__plan *p = pl->p;
    wf__memplan *mp = pl->mp;
    const wf_node *node = p->nodes[v];
    int32_t sv = pl->slot_of[v], u = -1;
    pl->group[sv] = sv;
    /* Rule (b) first: input 0's bytes, if it dies here. Two outputs never take one input's
     * bytes: each would need the other among its ancestors. */
    if ((node->op->flags & WF_OP_INPLACE) && node->n_inputs > 0) {
        int32_t j = p->in_idx[p->in_off[v]];
        if (pl->slot_of[j] >= 0 && !pl->taken[j] && mp->dtype[j] == mp->dtype[v] &&
            same_shape(mp->shape[j], mp->shape[v]) && done_before(pl->g, av, j, v, v)) {
            u = j;
            pl->taken[u] = 1;
            mp->given[u] = 1;
            mp->inplace[v] = 1;
            mp->n_inplace++;
            pl->group[sv] = pl->group[pl->slot_of[u]];
        }
    }
    if (pl->mode != MODE_IN_ORDER) {
        for (int32_t k = 0; k < sv; k++) {
            int32_t w = pl->ids[k];
            if (w != u && !done_before(pl->g, av, w, v, -1))
                conflict(pl, k, sv);
        }
        return 0;
    }
    if (u >= 0)
        mp->offset[v] = mp->offset[u];
    else
        place_in_order(pl, v, av);
    pl->placed[pl->n_placed++] = v;
    return 0;
}

/* MODE_BY_SIZE: places the in-place groups largest first, each at the best fit among the
 * groups already placed that conflict with one of its members (the classic greedy by
 * size). */
static int place_by_size(planner *pl)
{
    int P = pl->P;
    wf__memplan *mp = pl->mp;
    int32_t *order = malloc((size_t)P * sizeof *order);
    int32_t *m_off = calloc((size_t)P + 1, sizeof *m_off),
            *m_idx = malloc((size_t)P * sizeof *m_idx);
    int32_t *stamp = calloc((size_t)P, sizeof *stamp);
    uint8_t *done = calloc((size_t)P, 1);
    int rc = 0;
    if (!order || !m_off || !m_idx || !stamp || !done) {
        rc = wf__err(WF_ENOMEM, "wf_session_run: no memory to plan %d outputs", P);
        goto out;
    }
    int n_groups = 0;
    for (int32_t k = 0; k < P; k++) {
        m_off[pl->group[k] + 1]++;
        if (pl->group[k] == k)
            order[n_groups++] = k;
    }
    for (int32_t k = 0; k < P; k++)
        m_off[k + 1] += m_off[k];
    int32_t *fill = stamp; /* reused below, reset after */
    for (int32_t k = 0; k < P; k++)
        m_idx[m_off[pl->group[k]] + fill[pl->group[k]]++] = k;
    memset(stamp, 0, (size_t)P * sizeof *stamp);
    /* Largest first; equal sizes in the plan's order. An insertion sort keeps this free of
     * a comparison context (qsort_r is not C11); groups are few next to the matrix. */
    for (int a = 1; a < n_groups; a++) {
        int32_t x = order[a];
        int b = a;
        while (b > 0 &&
               (pl->bytes[pl->ids[order[b - 1]]] < pl->bytes[pl->ids[x]] ||
                (pl->bytes[pl->ids[order[b - 1]]] == pl->bytes[pl->ids[x]] && order[b - 1] > x))) {
            order[b] = order[b - 1];
            b--;
        }
        order[b] = x;
    }
    int64_t top = 0;
    for (int a = 0; a < n_groups && rc == 0; a++) {
        int32_t gr = order[a];
        int ns = 0, nh = 0;
        int64_t need = 0;
        for (int32_t m = m_off[gr]; m < m_off[gr + 1]; m++) {
            int32_t k = m_idx[m];
            if (rounded(pl->bytes[pl->ids[k]]) > need)
                need = rounded(pl->bytes[pl->ids[k]]);
        }
        /* The placed outputs that may be live beside a member: 'spans[0 .. ns-1]'; those
         * that no ordering edge can separate from it (MODE_EDGES): 'hard[0 .. nh-1]'. */
        for (int32_t m = m_off[gr]; m < m_off[gr + 1]; m++) {
            int32_t k = m_idx[m], mv = pl->ids[k];
            const uint64_t *row = pl->conf + (size_t)k * pl->pw;
            for (size_t w = 0; w < pl->pw; w++) {
                for (int b = 0; row[w] && b < 64; b++) {
                    int32_t o = (int32_t)(w * 64 + (size_t)b);
                    if (!((row[w] >> b) & 1) || !done[o])
                        continue;
                    int32_t node = pl->ids[o];
                    span sp = { mp->offset[node], mp->offset[node] + rounded(pl->bytes[node]) };
                    if (stamp[o] != a + 1 && stamp[o] != -(a + 1))
                        pl->spans[ns++] = sp;
                    if (pl->mode == MODE_EDGES && stamp[o] != -(a + 1) && pl->g->last[node] >= mv &&
                        pl->g->last[mv] >= node) {
                        pl->hard[nh++] = sp;
                        stamp[o] = -(a + 1); /* hard for one member: hard for the group */
                    } else if (stamp[o] != -(a + 1)) {
                        stamp[o] = a + 1;
                    }
                }
            }
        }
        int64_t at = best_fit(pl->spans, ns, need);
        if (pl->mode == MODE_EDGES && at + need > top) {
            /* The arena would grow: take the best gap among the hard ones if that grows it
             * less, and order the rest before or after the group's members. */
            int64_t at2 = best_fit(pl->hard, nh, need);
            if (at2 < at) {
                at = at2;
                for (int32_t m = m_off[gr]; m < m_off[gr + 1] && rc == 0; m++) {
                    int32_t k = m_idx[m], mv = pl->ids[k];
                    const uint64_t *row = pl->conf + (size_t)k * pl->pw;
                    for (size_t w = 0; w < pl->pw && rc == 0; w++) {
                        for (int b = 0; row[w] && b < 64 && rc == 0; b++) {
                            int32_t o = (int32_t)(w * 64 + (size_t)b);
                            if (!((row[w] >> b) & 1) || !done[o])
                                continue;
                            int32_t node = pl->ids[o];
                            if (mp->offset[node] >= at + need ||
                                mp->offset[node] + rounded(pl->bytes[node]) <= at)
                                continue;
                            rc = pl->g->last[node] < mv ? order_before(pl, node, mv)
                                                        : order_before(pl, mv, node);
                        }
                    }
                }
            }
        }
        for (int32_t m = m_off[gr]; m < m_off[gr + 1]; m++) {
            mp->offset[pl->ids[m_idx[m]]] = at;
            done[m_idx[m]] = 1;
        }
        if (at + need > top)
            top = at + need;
    }
    if (rc == 0 && pl->n_edges > 1) { /* one edge per pair */
        qsort(pl->edges, (size_t)pl->n_edges, 2 * sizeof *pl->edges, cmp_edge);
        int k = 1;
        for (int e = 1; e < pl->n_edges; e++)
            if (cmp_edge(pl->edges + 2 * e, pl->edges + 2 * (k - 1)) != 0) {
                pl->edges[2 * k] = pl->edges[2 * e];
                pl->edges[2 * k + 1] = pl->edges[2 * e + 1];
                k++;
            }
        pl->n_edges = k;
    }
out:
    free(order);
    free(m_off);
    free(m_idx);
    free(stamp);
    free(done);
    return rc;
}

/* One walk of the plan in its order with 'pl->mode', then the placement; fills 'pl->mp''s
 * offsets, in-place marks and edges. Returns 0 (with 'pl->mp' NULL when the ancestor sets
 * would be too big) or WF_ENOMEM. */
static int walk(planner *pl)
{
    const wf__plan *p = pl->p;
    int n = pl->n, rc = 0;
    size_t nn = (size_t)(n ? n : 1);
    int32_t *succ_left = NULL;
    pl->words = ((size_t)n + 63) / 64;
    pl->group = malloc((size_t)pl->P * sizeof *pl->group);
    pl->taken = calloc(nn, 1);
    pl->placed = malloc(nn * sizeof *pl->placed);
    pl->spans = malloc((size_t)pl->P * sizeof *pl->spans);
    pl->hard = malloc((size_t)pl->P * sizeof *pl->hard);
    if (!pl->seq) {
        pl->anc = calloc(nn, sizeof *pl->anc);
        succ_left = malloc(nn * sizeof *succ_left);
    }
    pl->pw = ((size_t)pl->P + 63) / 64;
    if (pl->mode != MODE_IN_ORDER)
        pl->conf = calloc((size_t)pl->P * pl->pw, sizeof *pl->conf);
    if (!pl->group || !pl->taken || !pl->placed || !pl->spans || !pl->hard ||
        (!pl->seq && (!pl->anc || !succ_left)) || (pl->mode != MODE_IN_ORDER && !pl->conf)) {
        rc = wf__err(WF_ENOMEM, "wf_session_run: no memory to plan the memory of %d nodes", n);
        goto out;
    }
    if (!pl->seq)
        memcpy(succ_left, pl->g->n_succ, (size_t)n * sizeof *succ_left);
    size_t live_bits = 0;
    for (int v = 0; v < n && rc == 0; v++) {
        uint64_t *av = NULL;
        if (!pl->seq) { /* v's ancestors: its inputs' and control inputs', and those */
            if ((live_bits += pl->words * 8) > WF__MEMPLAN_MAX_BITS) {
                wf__memplan_free(pl->mp); /* no plan: see the header */
                pl->mp = NULL;
                goto out;
            }
            if (!(av = pl->anc[v] = calloc(pl->words ? pl->words : 1, sizeof *av))) {
                rc = wf__err(WF_ENOMEM, "wf_session_run: no memory to plan %d nodes", n);
                goto out;
            }
            int nc = p->nodes[v]->n_control, ni = p->in_off[v + 1] - p->in_off[v];
            for (int k = 0; k < ni + nc; k++) {
                int32_t q = k < ni ? p->in_idx[p->in_off[v] + k] : control_of(p, v, k - ni);
                if (bit(av, q))
                    continue;
                for (size_t w = 0; w < pl->words; w++)
                    av[w] |= pl->anc[q][w];
                av[q >> 6] |= (uint64_t)1 << (q & 63);
            }
        }
        if (pl->slot_of[v] >= 0)
            rc = visit(pl, v, av);
        if (!pl->seq) { /* an ancestor set is needed until its last successor is planned */
            int nc = p->nodes[v]->n_control, ni = p->in_off[v + 1] - p->in_off[v];
            for (int k = 0; k < ni + nc; k++) {
                int32_t q = k < ni ? p->in_idx[p->in_off[v] + k] : control_of(p, v, k - ni);
                if (--succ_left[q] == 0) {
                    free(pl->anc[q]);
                    pl->anc[q] = NULL;
                    live_bits -= pl->words * 8;
                }
            }
            if (succ_left[v] == 0) {
                free(pl->anc[v]);
                pl->anc[v] = NULL;
                live_bits -= pl->words * 8;
            }
        }
    }
    if (rc == 0 && pl->mode != MODE_IN_ORDER)
        rc = place_by_size(pl);
    if (rc == 0 && pl->n_edges) {
        pl->mp->edges = pl->edges;
        pl->mp->n_edges = pl->n_edges;
        pl->edges = NULL;
    }
out:
    if (pl->anc)
        for (int i = 0; i < n; i++)
            free(pl->anc[i]);
    free(pl->anc);
    free(succ_left);
    free(pl->conf);
    free(pl->spans);
    free(pl->hard);
    free(pl->placed);
    free(pl->taken);
    free(pl->group);
    free(pl->edges);
    return rc;
}

/* A memory plan of 'p' for 'dt', 'sh' made in 'mode'; '*out' NULL when there is none. */
static int make_mode(const wf__plan *p, const mp_graph *g, const wf_dtype *dt, const wf_shape *sh,
                     int mode, wf__memplan **out)
{
    *out = NULL;
    int n = p->n;
    size_t nn = (size_t)(n ? n : 1);
    planner pl = { .p = p, .g = g, .n = n, .seq = p->run_inline, .mode = mode };
    wf__memplan *mp = pl.mp = calloc(1, sizeof *mp);
    uint8_t *is_key = calloc(nn, 1);
    int64_t *bytes = calloc(nn, sizeof *bytes);
    int32_t *slot_of = malloc(nn * sizeof *slot_of), *ids = malloc(nn * sizeof *ids);
    int rc = 0;
    if (mp) {
        mp->n = n;
        mp->offset = malloc(nn * sizeof *mp->offset);
        mp->dtype = calloc(nn, sizeof *mp->dtype);
        mp->shape = calloc(nn, sizeof *mp->shape);
        mp->inplace = calloc(nn, 1);
        mp->given = calloc(nn, 1);
    }
    if (!mp || !mp->offset || !mp->dtype || !mp->shape || !mp->inplace || !mp->given || !is_key ||
        !bytes || !slot_of || !ids) {
        rc = wf__err(WF_ENOMEM, "wf_session_run: no memory to plan the memory of %d nodes", n);
        goto done;
    }
    for (int k = 0; k < p->n_key; k++)
        if (p->key[k] < p->sess->n_nodes && p->index_of[p->key[k]] >= 0)
            is_key[p->index_of[p->key[k]]] = 1;
    for (int i = 0; i < n; i++) {
        mp->offset[i] = -1;
        slot_of[i] = -1;
        if (plannable(p, is_key, i, dt[i], sh[i], &bytes[i])) {
            mp->dtype[i] = dt[i];
            mp->shape[i] = sh[i];
            ids[pl.P] = i;
            slot_of[i] = pl.P++;
        }
    }
    if (pl.P == 0 || (mode != MODE_IN_ORDER && pl.P > MAX_MATRIX))
        goto done; /* rc 0, no plan */
    pl.bytes = bytes;
    pl.slot_of = slot_of;
    pl.ids = ids;
    if ((rc = walk(&pl)) < 0 || !pl.mp)
        goto done;
    mp = pl.mp;
    /* The arena's size, and the liveness minimum: the most planned bytes live at one point
     * of the plan's order, each output live from its node to its latest reader. */
    int64_t *delta = calloc((size_t)n + 1, sizeof *delta);
    if (!delta) {
        rc = wf__err(WF_ENOMEM, "wf_session_run: no memory to plan %d nodes", n);
        goto done;
    }
    for (int32_t k = 0; k < pl.P; k++) {
        int32_t v = ids[k];
        mp->n_planned++;
        mp->bytes_intermediates += bytes[v];
        if (mp->offset[v] + rounded(bytes[v]) > mp->arena_bytes)
            mp->arena_bytes = mp->offset[v] + rounded(bytes[v]);
        delta[v] += bytes[v];
        delta[g->last[v] + 1] -= bytes[v];
    }
    int64_t live = 0;
    for (int v = 0; v < n; v++)
        if ((live += delta[v]) > mp->bytes_live_min)
            mp->bytes_live_min = live;
    free(delta);
    *out = mp;
    pl.mp = NULL;
done:
    free(is_key);
    free(bytes);
    free(slot_of);
    free(ids);
    wf__memplan_free(pl.mp);
    return rc;
}

int wf__memplan_make(const wf__plan *p, const wf_dtype *dt, const wf_shape *sh, bool may_add_edges,
                     wf__memplan **out)
{
    *out = NULL;
    mp_graph g;
    int rc = graph_make(p, &g);
    if (rc < 0)
        return rc;
    /* Inline plans run in the plan's order: in order is exact. Others: greedy by size over
     * the conflicts of the plan's edges; where that is more than 1 + 1/EDGES_ABOVE times the
     * liveness minimum and the plan may gain ordering edges, the same with edges where they
     * keep the arena from growing, which wins when it saves at least 1/EDGES_GAIN of the
     * arena (an edge costs parallelism). */
    wf__memplan *a = NULL, *b = NULL;
    if (p->run_inline) {
        rc = make_mode(p, &g, dt, sh, MODE_IN_ORDER, &a);
    } else {
        rc = make_mode(p, &g, dt, sh, MODE_BY_SIZE, &a);
        if (rc == 0 && a && may_add_edges &&
            a->arena_bytes > a->bytes_live_min + a->bytes_live_min / EDGES_ABOVE)
            rc = make_mode(p, &g, dt, sh, MODE_EDGES, &b);
        if (b &&
            (b->n_edges == 0 ? b->arena_bytes <= a->arena_bytes
                             : b->arena_bytes <= a->arena_bytes - a->arena_bytes / EDGES_GAIN)) {
            wf__memplan *t = a;
            a = b;
            b = t;
        }
    }
    wf__memplan_free(b);
    graph_free(&g);
    if (rc < 0) {
        wf__memplan_free(a);
        return rc;
    }
    *out = a;
    return 0;
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
            p->stats.bytes_intermediates = p->mp->bytes_intermediates;
            p->stats.bytes_planned = p->mp->arena_bytes;
        }
    }
    free(dt);
    free(sh);
}

/* ---- The checker ------------------------------------------------------------------------- */

/* Marks the strict ancestors of 'v' in 'seen' (a depth-first search over inputs, control
 * inputs and 'mp''s edges; 'stack' holds 'p->n' entries). Inline plans: every earlier
 * node. */
static void ancestors(const wf__plan *p, const wf__memplan *mp, int v, uint8_t *seen,
                      int32_t *stack)
{
    memset(seen, 0, (size_t)p->n);
    if (p->run_inline) {
        memset(seen, 1, (size_t)v);
        return;
    }
    int top = 0;
    stack[top++] = v;
    while (top > 0) {
        int i = stack[--top];
        int nc = p->nodes[i]->n_control, ni = p->in_off[i + 1] - p->in_off[i];
        for (int k = 0; k < ni + nc; k++) {
            int32_t q = k < ni ? p->in_idx[p->in_off[i] + k] : control_of(p, i, k - ni);
            if (!seen[q]) {
                seen[q] = 1;
                stack[top++] = q;
            }
        }
        for (int k = 0; k < mp->n_edges; k++) { /* the plan's own ordering edges */
            int32_t q = mp->edges[2 * k];
            if (mp->edges[2 * k + 1] == i && !seen[q]) {
                seen[q] = 1;
                stack[top++] = q;
            }
        }
    }
}

int wf__memplan_check(const wf__plan *p, const wf__memplan *mp)
{
    int n = p->n;
    if (!mp)
        return 0;
    if (mp->n != n)
        return wf__err(WF_EINVAL, "memplan: made for %d nodes, the plan has %d", mp->n, n);
    uint8_t *seen = malloc((size_t)(n ? n : 1));
    int32_t *stack = malloc((size_t)(n ? n : 1) * sizeof *stack);
    if (!seen || !stack) {
        free(seen);
        free(stack);
        return wf__err(WF_ENOMEM, "memplan: no memory to check %d nodes", n);
    }
    int rc = 0;
    char a[WF_ERRMSG_MAX], b[WF_ERRMSG_MAX];
    for (int v = 0; v < n && rc == 0; v++) {
        if (mp->offset[v] < 0)
            continue;
        size_t vb = 0;
        if (wf__tensor_check("memplan", mp->dtype[v], mp->shape[v], &vb) < 0 ||
            mp->offset[v] % ALIGN || mp->offset[v] + (int64_t)vb > mp->arena_bytes) {
            rc = wf__err(WF_EINVAL, "memplan: %s is outside the arena",
                         wf__rt_node_desc(p->nodes[v], a, sizeof a));
            break;
        }
        ancestors(p, mp, v, seen, stack);
        for (int u = 0; u < v && rc == 0; u++) {
            if (mp->offset[u] < 0)
                continue;
            size_t ub = 0;
            (void)wf__tensor_check("memplan", mp->dtype[u], mp->shape[u], &ub);
            if (mp->offset[u] >= mp->offset[v] + (int64_t)vb ||
                mp->offset[v] >= mp->offset[u] + (int64_t)ub)
                continue; /* disjoint */
            bool made_before = seen[u], read_before = true, only_v_else = true;
            for (int r = u + 1; r < n; r++)
                for (int32_t k = p->in_off[r]; k < p->in_off[r + 1]; k++)
                    if (p->in_idx[k] == u && !seen[r]) {
                        read_before = false;
                        only_v_else = only_v_else && r == v;
                    }
            bool in_place = mp->inplace[v] && p->in_idx[p->in_off[v]] == u &&
                            mp->offset[u] == mp->offset[v] && ub == vb && only_v_else &&
                            (p->nodes[v]->op->flags & WF_OP_INPLACE);
            if (!(made_before && read_before) && !in_place)
                rc = wf__err(WF_EINVAL,
                             "memplan: %s at +%lld and %s at +%lld overlap but may run at once",
                             wf__rt_node_desc(p->nodes[u], a, sizeof a), (long long)mp->offset[u],
                             wf__rt_node_desc(p->nodes[v], b, sizeof b), (long long)mp->offset[v]);
        }
    }
    free(seen);
    free(stack);
    return rc;
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
    sl->arena_bytes = (size_t)(mp->arena_bytes ? mp->arena_bytes : 1);
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
        if (mp->offset[i] < 0)
            continue;
        size_t b = 0;
        (void)wf__tensor_check("memplan", mp->dtype[i], mp->shape[i], &b);
        sl->planned[i] = wf__tensor_adopt(mp->dtype[i], mp->shape[i],
                                          (char *)sl->arena + mp->offset[i], b, arena_keep, NULL);
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
            p->stats.bytes_intermediates = mp->bytes_intermediates;
            p->stats.bytes_planned = mp->arena_bytes;
            if (s->plans == p) {
                s->last_stats.bytes_intermediates = mp->bytes_intermediates;
                s->last_stats.bytes_planned = mp->arena_bytes;
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
    if (t && sl->planned && sl->planned[i] == t && !sl->mp->given[i] &&
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
