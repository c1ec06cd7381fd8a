/* memory/plan.c: the static memory planner (memory/plan.h): one arena, each planned output
 *   at a fixed byte offset in it, so that a replayed plan allocates nothing but the values
 *   that leave the run. Pure: integers in (nodes in a topological order, their inputs and
 *   other predecessors, the bytes of each output, which may go in place), offsets out.
 * The sharing rule. Runs are parallel and work-stealing: the order is not the order nodes
 *   run in. So two planned outputs u (made by node P(u), read by nodes R(u)) and v (made
 *   later in the order) may share bytes only if
 *     (a) P(u) and every node of R(u) are strict ancestors of P(v) (over inputs and the
 *         other predecessors): every read of u happens before v is written, whichever
 *         worker runs what; or
 *     (b) in place: P(v) reads u as its input 0, 'may_inplace[v]' (the caller's: its op
 *         writes over input 0, same dtype and shape), and every other node of R(u) is a
 *         strict ancestor of P(v); v then takes exactly u's bytes.
 *   A sequential graph ('seq': node by node in the order on one thread) uses the same
 *   rules with "ancestor" meaning "earlier in the order".
 * Placement. Sequential graphs: the outputs in order, each at the best fit (the smallest
 *   gap that holds it, else the top) among the outputs still live there. Others: a walk in
 *   the (topological) order decides (b) and records which pairs (a) leaves in conflict (a
 *   P x P bit matrix); then the in-place chains are placed largest first, each at the best
 *   fit among the placed outputs it conflicts with (the greedy by size of TFLite's arena
 *   planner). Ancestor sets are bit sets, each freed once all of its node's successors are
 *   walked (a chain holds two); more than WF__MEMPLAN_MAX_BITS bytes of them at once, or
 *   more than MAX_MATRIX outputs, and there is no plan (the caller's pool serves).
 * Ordering edges. Rule (a) alone cannot reach the sequential liveness minimum where the
 *   graph leaves independent work side by side: in an MLP step with one fused optimizer
 *   update, every weight gradient is read by the update at the end, and none is ordered
 *   against the others' inputs, so dW1 may not reuse what dW2's inputs held (1.37x the
 *   minimum for perf/train's MLP). So, where the caller allows it, outputs are placed a
 *   second time where a group that would grow the arena may take bytes of outputs it
 *   conflicts with if the order puts one wholly before the other (its latest reader before
 *   the other's node): the plan then gains edges from that output's node and readers to the
 *   other's node ('edges', which the caller adds; always forward in the order, so no
 *   cycle). Those edges cost parallelism, so they are tried only when the plan without them
 *   is more than 1.25x the minimum, and kept only when the arena is at least 1/EDGES_GAIN
 *   smaller (perf/train's MLP: 1.37x without, 1.00x with 23 edges; the GPT step: 1.35x
 *   without, 1.00x with 822; the CNN: 0.98x, none).
 * Cost: O(n * n / 64 + P * (P + edges)) per plan; the MLP of perf/train plans in well under a
 *   millisecond.
 * Not here: which outputs are planned (runtime/compile/memplan.c), the arena's tensors
 *   (arena.c), the pools (memory/pool.c). */
#include "plan.h"

#include "../core/error.h"
#include "pool.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define WF__MEMPLAN_MAX_BITS ((size_t)64 << 20)

/* Planned outputs start at multiples of this (the pool's and the kernels' alignment). */
#define ALIGN ((int64_t)WF_POOL_ALIGN)

void wf__mem_plan_free(wf__mem_plan *mp)
{
    if (!mp)
        return;
    free(mp->offset);
    free(mp->inplace);
    free(mp->given);
    free(mp->edges);
    free(mp);
}

/* The other predecessors of node 'i' (control edges), and its predecessor 'k' of all:
 * inputs first ('ni' of them), then the others. */
static inline int n_deps(const wf__mem_graph *p, int i)
{
    return p->dep_off ? p->dep_off[i + 1] - p->dep_off[i] : 0;
}

static inline int32_t pred(const wf__mem_graph *p, int i, int ni, int k)
{
    return k < ni ? p->in_idx[p->in_off[i] + k] : p->dep_idx[p->dep_off[i] + k - ni];
}

/* The graph around the nodes: readers per value, successor counts. */
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

static int graph_make(const wf__mem_graph *p, mp_graph *g)
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
        return wf__err(WF_ENOMEM, "memory plan: no memory to plan the memory of %d nodes", n);
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
        for (int32_t k = p->dep_off ? p->dep_off[i] : 0; p->dep_off && k < p->dep_off[i + 1]; k++)
            g->n_succ[p->dep_idx[k]]++;
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
/* The most planned outputs of a plan that does not run inline (the conflict matrix is
 * P * P bits: 8 MiB here); beyond it the plan is left to the pool. */
#define MAX_MATRIX 8192

/* Ordering edges are tried only for an arena above (1 + 1/EDGES_ABOVE) times the liveness
 * minimum (the goal is 1.25x), and kept only when they shrink it by at least
 * 1/EDGES_GAIN. */
#define EDGES_ABOVE 4
#define EDGES_GAIN  16

/* How a plan is made (wf__mem_plan_make()): in the order as outputs come (sequential
 * plans); largest first over the conflicts of the plan's edges; the same, adding ordering
 * edges where they keep the arena from growing. */
enum { MODE_IN_ORDER, MODE_BY_SIZE, MODE_EDGES };

typedef struct planner {
    const wf__mem_graph *p;
    wf__mem_plan *mp;
    const mp_graph *g;
    int n, P;               /* plan nodes, planned outputs */
    bool seq;               /* an inline plan: ancestor = earlier in the order */
    int mode;               /* MODE_*: see wf__mem_plan_make() */
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
            return wf__err(WF_ENOMEM, "memory plan: no memory for %d ordering edges", cap);
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
    wf__mem_plan *mp = pl->mp;
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
    const wf__mem_graph *p = pl->p;
    wf__mem_plan *mp = pl->mp;
    int32_t sv = pl->slot_of[v], u = -1;
    pl->group[sv] = sv;
    /* Rule (b) first: input 0's bytes, if it dies here. Two outputs never take one input's
     * bytes: each would need the other among its ancestors. */
    if (p->may_inplace[v] && p->in_off[v + 1] > p->in_off[v]) {
        int32_t j = p->in_idx[p->in_off[v]];
        if (pl->slot_of[j] >= 0 && !pl->taken[j] && done_before(pl->g, av, j, v, v)) {
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
    wf__mem_plan *mp = pl->mp;
    int32_t *order = malloc((size_t)P * sizeof *order);
    int32_t *m_off = calloc((size_t)P + 1, sizeof *m_off),
            *m_idx = malloc((size_t)P * sizeof *m_idx);
    int32_t *stamp = calloc((size_t)P, sizeof *stamp);
    uint8_t *done = calloc((size_t)P, 1);
    int rc = 0;
    if (!order || !m_off || !m_idx || !stamp || !done) {
        rc = wf__err(WF_ENOMEM, "memory plan: no memory to plan %d outputs", P);
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
    const wf__mem_graph *p = pl->p;
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
        rc = wf__err(WF_ENOMEM, "memory plan: no memory to plan the memory of %d nodes", n);
        goto out;
    }
    if (!pl->seq)
        memcpy(succ_left, pl->g->n_succ, (size_t)n * sizeof *succ_left);
    size_t live_bits = 0;
    for (int v = 0; v < n && rc == 0; v++) {
        uint64_t *av = NULL;
        if (!pl->seq) { /* v's ancestors: its inputs' and control inputs', and those */
            if ((live_bits += pl->words * 8) > WF__MEMPLAN_MAX_BITS) {
                wf__mem_plan_free(pl->mp); /* no plan: see the header */
                pl->mp = NULL;
                goto out;
            }
            if (!(av = pl->anc[v] = calloc(pl->words ? pl->words : 1, sizeof *av))) {
                rc = wf__err(WF_ENOMEM, "memory plan: no memory to plan %d nodes", n);
                goto out;
            }
            int nc = n_deps(p, v), ni = p->in_off[v + 1] - p->in_off[v];
            for (int k = 0; k < ni + nc; k++) {
                int32_t q = pred(p, v, ni, k);
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
            int nc = n_deps(p, v), ni = p->in_off[v + 1] - p->in_off[v];
            for (int k = 0; k < ni + nc; k++) {
                int32_t q = pred(p, v, ni, k);
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
static int make_mode(const wf__mem_graph *p, const mp_graph *g, int mode, wf__mem_plan **out)
{
    *out = NULL;
    int n = p->n;
    size_t nn = (size_t)(n ? n : 1);
    planner pl = { .p = p, .g = g, .n = n, .seq = p->seq, .mode = mode };
    wf__mem_plan *mp = pl.mp = calloc(1, sizeof *mp);
    int32_t *slot_of = malloc(nn * sizeof *slot_of), *ids = malloc(nn * sizeof *ids);
    int rc = 0;
    if (mp) {
        mp->n = n;
        mp->offset = malloc(nn * sizeof *mp->offset);
        mp->inplace = calloc(nn, 1);
        mp->given = calloc(nn, 1);
    }
    if (!mp || !mp->offset || !mp->inplace || !mp->given || !slot_of || !ids) {
        rc = wf__err(WF_ENOMEM, "memory plan: no memory to plan the memory of %d nodes", n);
        goto done;
    }
    for (int i = 0; i < n; i++) {
        mp->offset[i] = -1;
        slot_of[i] = -1;
        if (p->bytes[i] > 0) {
            ids[pl.P] = i;
            slot_of[i] = pl.P++;
        }
    }
    if (pl.P == 0 || (mode != MODE_IN_ORDER && pl.P > MAX_MATRIX))
        goto done; /* rc 0, no plan */
    pl.bytes = p->bytes;
    pl.slot_of = slot_of;
    pl.ids = ids;
    if ((rc = walk(&pl)) < 0 || !pl.mp)
        goto done;
    mp = pl.mp;
    /* The arena's size, and the liveness minimum: the most planned bytes live at one point
     * of the order, each output live from its node to its latest reader. */
    int64_t *delta = calloc((size_t)n + 1, sizeof *delta);
    if (!delta) {
        rc = wf__err(WF_ENOMEM, "memory plan: no memory to plan %d nodes", n);
        goto done;
    }
    for (int32_t k = 0; k < pl.P; k++) {
        int32_t v = ids[k];
        int64_t b = p->bytes[v];
        mp->n_planned++;
        mp->bytes_intermediates += b;
        if (mp->offset[v] + rounded(b) > mp->arena_bytes)
            mp->arena_bytes = mp->offset[v] + rounded(b);
        delta[v] += b;
        delta[g->last[v] + 1] -= b;
    }
    int64_t live = 0;
    for (int v = 0; v < n; v++)
        if ((live += delta[v]) > mp->bytes_live_min)
            mp->bytes_live_min = live;
    free(delta);
    *out = mp;
    pl.mp = NULL;
done:
    free(slot_of);
    free(ids);
    wf__mem_plan_free(pl.mp);
    return rc;
}

int wf__mem_plan_make(const wf__mem_graph *p, bool may_add_edges, wf__mem_plan **out)
{
    *out = NULL;
    mp_graph g;
    int rc = graph_make(p, &g);
    if (rc < 0)
        return rc;
    /* Sequential graphs run in the order: in order is exact. Others: greedy by size over
     * the conflicts of the graph's edges; where that is more than 1 + 1/EDGES_ABOVE times the
     * liveness minimum and the caller allows ordering edges, the same with edges where they
     * keep the arena from growing, which wins when it saves at least 1/EDGES_GAIN of the
     * arena (an edge costs parallelism). */
    wf__mem_plan *a = NULL, *b = NULL;
    if (p->seq) {
        rc = make_mode(p, &g, MODE_IN_ORDER, &a);
    } else {
        rc = make_mode(p, &g, MODE_BY_SIZE, &a);
        if (rc == 0 && a && may_add_edges &&
            a->arena_bytes > a->bytes_live_min + a->bytes_live_min / EDGES_ABOVE)
            rc = make_mode(p, &g, MODE_EDGES, &b);
        if (b &&
            (b->n_edges == 0 ? b->arena_bytes <= a->arena_bytes
                             : b->arena_bytes <= a->arena_bytes - a->arena_bytes / EDGES_GAIN)) {
            wf__mem_plan *t = a;
            a = b;
            b = t;
        }
    }
    wf__mem_plan_free(b);
    graph_free(&g);
    if (rc < 0) {
        wf__mem_plan_free(a);
        return rc;
    }
    *out = a;
    return 0;
}

/* ---- The checker ------------------------------------------------------------------------- */

/* Marks the strict ancestors of 'v' in 'seen' (a depth-first search over inputs, control
 * inputs and 'mp''s edges; 'stack' holds 'p->n' entries). Inline plans: every earlier
 * node. */
static void ancestors(const wf__mem_graph *p, const wf__mem_plan *mp, int v, uint8_t *seen,
                      int32_t *stack)
{
    memset(seen, 0, (size_t)p->n);
    if (p->seq) {
        memset(seen, 1, (size_t)v);
        return;
    }
    int top = 0;
    stack[top++] = v;
    while (top > 0) {
        int i = stack[--top];
        int nc = n_deps(p, i), ni = p->in_off[i + 1] - p->in_off[i];
        for (int k = 0; k < ni + nc; k++) {
            int32_t q = pred(p, i, ni, k);
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

int wf__mem_plan_check(const wf__mem_graph *p, const wf__mem_plan *mp, int *bad_u, int *bad_v)
{
    int n = p->n;
    *bad_u = *bad_v = -1;
    if (!mp)
        return 0;
    if (mp->n != n)
        return wf__err(WF_EINVAL, "memory plan: made for %d nodes, the graph has %d", mp->n, n);
    uint8_t *seen = malloc((size_t)(n ? n : 1));
    int32_t *stack = malloc((size_t)(n ? n : 1) * sizeof *stack);
    if (!seen || !stack) {
        free(seen);
        free(stack);
        return wf__err(WF_ENOMEM, "memory plan: no memory to check %d nodes", n);
    }
    int rc = 0;
    for (int v = 0; v < n && rc == 0; v++) {
        if (mp->offset[v] < 0)
            continue;
        int64_t vb = p->bytes[v];
        if (vb <= 0 || mp->offset[v] % ALIGN || mp->offset[v] + vb > mp->arena_bytes) {
            *bad_u = *bad_v = v;
            rc = wf__err(WF_EINVAL, "memory plan: node %d is outside the arena", v);
            break;
        }
        ancestors(p, mp, v, seen, stack);
        for (int u = 0; u < v && rc == 0; u++) {
            if (mp->offset[u] < 0)
                continue;
            int64_t ub = p->bytes[u];
            if (mp->offset[u] >= mp->offset[v] + vb || mp->offset[v] >= mp->offset[u] + ub)
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
                            p->may_inplace[v];
            if (!(made_before && read_before) && !in_place) {
                *bad_u = u;
                *bad_v = v;
                rc = wf__err(WF_EINVAL,
                             "memory plan: node %d at +%lld and node %d at +%lld overlap but may "
                             "run at once",
                             u, (long long)mp->offset[u], v, (long long)mp->offset[v]);
            }
        }
    }
    free(seen);
    free(stack);
    return rc;
}
