/* sched/taskgraph.c: task graphs built once and run many times.
 * Owns: the nodes' descriptions (segments, below), the per-node arrays (successor offsets and
 * counters), the edge list, and the compiled form: successors as CSR arrays, the roots.
 * Large arrays come from the runtime's block cache (blocks.c), so a graph built after another
 * one of its size faults in no fresh pages.
 * Compact nodes: a node is no task. What a run reads of node i is 'off[i]' and 'off[i + 1]'
 * (its successors in 'succ'), 'cnt[i]' (8 bytes: pending count and number of predecessors)
 * and its function and argument, found in its segment: the nodes of one
 * wf_taskgraph_add_nodes() call form one segment (one function, one name, arguments at a
 * stride), and nodes added one by one form list segments (an entry each). A run keeps the
 * segment of the node it runs and looks one up (binary search) only when the next node is in
 * another. Along a chain nothing else is touched; building a graph writes 12 bytes a node
 * and its edges, where a 64-byte task line a node cost a miss to memory to write and another
 * to read (1M-node chain: 60% of the time was building, most of it those lines).
 * Tasks only for the deque: a node that becomes ready while its releaser has another one to
 * run gets a task from the worker's free list (task.c), which says (graph, node, canceled)
 * and is freed as soon as a worker takes it; those few lines stay in cache. Should no task
 * be had (out of memory), the group fails with WF_ENOMEM and the node and everything after it
 * are finished as skipped by the releaser (skip_from()), so the run still ends.
 * Counters: 'cnt[i].pending' counts node i's predecessors not yet finished; bit CANCELED is
 * set in it by a predecessor that failed or was skipped, before its decrement, so the last
 * decrement sees it. A node with one predecessor never uses its counter: it is ready when
 * that predecessor ends, canceled if that one was.
 * Invariant: between runs, cnt[i].pending == cnt[i].npred: the counter is reset to its
 * initial value by the worker that sees it reach zero, which is after its last decrement of
 * this run and before the run ends.
 * Edges added in order of their source (a chain, or any graph built successor by successor)
 * are the CSR successor array already: compiling then only computes offsets.
 * wf_taskgraph_add_nodes() on an empty graph writes the compiled form itself, from
 * predecessor rows (counting sort by source, as compile() does, without the edge list):
 * the successor array then serves as the edge list's destinations, and its sources are
 * written only when a later change needs them (write_esrc()).
 * A graph whose edges all go from a lower to a higher id (nodes added in a topological
 * order, the usual case) is acyclic by construction; only other graphs pay for a check.
 * Running: a worker that finishes a node decrements its successors; of those that become
 * ready it keeps the first for itself (no deque round trip along a chain) and pushes the
 * rest from the last, so that its own pops take them in list order.
 * Finished nodes are counted locally and given to the group in one subtraction when
 * the worker's run of inline successors ends.
 * Later completion: a node whose function returns WF_TASK_LATER finishes when two things
 *   have happened, in either order: its function returned, and wf_taskgraph_complete() was
 *   called for it. Each adds one to the node's 'arrive[i]'; the one that sees 1 (the second)
 *   finishes the node with the completion's result ('later_rc[i]') and resets 'arrive[i]' to
 *   0, so the invariant on the counters holds for it too. The first one touches nothing of
 *   the node afterwards: the graph may be finished and waited for by then.
 * Not here: how tasks are scheduled (worker.c). */
#include "internal.h"
#include "probes.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* In 'cnt[i].pending': a predecessor failed or was skipped. Predecessors are counted below. */
#define CANCELED (1 << 30)
#define MAX_PRED (CANCELED - 1)

/* A node of a list segment. */
struct gent {
    wf_task_fn fn;
    void *arg;
    const char *name;
};

/* Nodes [first, first + n): with 'ent', one entry each (nodes added one by one, 'cap'
 * entries room); without, all run 'fn' on 'args + (i - first) * stride' (or 'args' itself
 * when 'stride' is 0) and are named 'name'. */
typedef struct gseg {
    int first, n, cap;
    struct gent *ent;
    wf_task_fn fn;
    char *args;
    size_t stride;
    const char *name;
} gseg;

struct gcnt {
    _Atomic int32_t pending;
    int32_t npred;
};

struct wf_taskgraph {
    wf_runtime *rt;
    wf__blocks *mem; /* the runtime's block cache (a reference of its own) */
    gseg *segs;      /* in order of their first node; they cover [0, n) */
    int nsegs, capsegs;
    int n, capn;      /* nodes, and room in 'off' (capn + 2) and 'cnt' (capn) */
    int32_t *off;     /* compiled: CSR offsets into 'succ', off[n] == nedges; otherwise
                         off[i] is node i's out-degree */
    struct gcnt *cnt; /* per node: see the file's header */
    int *esrc, *edst; /* edge e: esrc[e] -> edst[e], in the order added */
    int64_t nedges, capedges;
    bool by_src;    /* esrc is non-decreasing: edst is the CSR successor array as it is */
    bool esrc_lazy; /* built by wf_taskgraph_add_nodes() on an empty graph: edst is 'succ', in
                       source order, and 'esrc' is NULL until a change needs it (write_esrc()) */
    /* compiled */
    bool dirty;
    int64_t nback;     /* edges from a higher id to a lower one */
    int *succ, *roots; /* 'succ' is 'edst' itself when 'by_src' (then not freed apart) */
    int nroots;        /* nodes without predecessors, counted as edges are added */
    bool compiled;     /* 'off' holds CSR offsets; otherwise out-degrees */
    size_t succ_bytes, later_bytes, arrive_bytes;
    _Atomic int32_t *later_rc; /* per node: the result given to wf_taskgraph_complete() */
    _Atomic uint8_t *arrive;   /* per node: arrivals of a later completion (zeroed) */
    /* tracing: the graph's id, its runs so far, the op kind of each node (wf_taskgraph_set_kind,
     * 'nkinds' entries) and, when the runtime traces (compile_trace()), per node in this run:
     * the predecessor that made it ready ('ready_by'), the one with the longest chain of work
     * before it ('crit', work_in' ns of it) and that chain with the node's own run ('work');
     * -1 and 0 for roots. The predecessors as CSR arrays ('pred_off', 'pred') to find 'crit'. */
    uint32_t id, runs;
    const char **kinds;
    int nkinds;
    int32_t *ready_by, *crit, *pred;
    int64_t *pred_off;
    uint64_t *work, *work_in;
    wf__group *grp; /* the group of the run */
    /* Written by the workers during a run, each on a line of its own so that the reads of
     * the fields above stay hits: nodes finished (in batches, wf__graph_done_later()), and
     * the group of wf_taskgraph_run(), whose counter and 'err' are touched too. */
    _Alignas(WF_CACHELINE) _Atomic int running;
    _Atomic int64_t remaining;
    _Alignas(WF_CACHELINE) wf_group own;
    _Alignas(WF_CACHELINE) char errmsg[WF_ERRMSG_MAX];
};

static int gerr(wf_taskgraph *g, int code, const char *fmt, ...) WF_PRINTF(3, 4);

static int gerr(wf_taskgraph *g, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g->errmsg, sizeof g->errmsg, fmt, ap);
    va_end(ap);
    return wf__err(code, "%s", g->errmsg);
}

/* ---- segments ------------------------------------------------------------------------ */

/* The segment of node 'i' (a valid id). */
static const gseg *seg_of(const wf_taskgraph *g, int i)
{
    int lo = 0, hi = g->nsegs - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (g->segs[mid].first <= i)
            lo = mid;
        else
            hi = mid - 1;
    }
    return &g->segs[lo];
}

static inline const char *seg_name(const gseg *s, int i)
{
    return s->ent ? s->ent[i - s->first].name : s->name;
}

/* Node 'i''s name for messages. */
static const char *node_name(const wf_taskgraph *g, int i)
{
    const char *name = seg_name(seg_of(g, i), i);
    return name ? name : "(unnamed)";
}

/* A new, empty segment after the last one, or NULL (out of memory). */
static gseg *seg_new(wf_taskgraph *g)
{
    if (g->nsegs == g->capsegs) {
        int cap = g->capsegs ? g->capsegs * 2 : 4;
        gseg *s = realloc(g->segs, (size_t)cap * sizeof *s);
        if (!s)
            return NULL;
        g->segs = s;
        g->capsegs = cap;
    }
    gseg *s = &g->segs[g->nsegs++];
    memset(s, 0, sizeof *s);
    s->first = g->n;
    return s;
}

/* Describes node g->n (room reserved) as one entry of a list segment. */
static int seg_append(wf_taskgraph *g, wf_task_fn fn, void *arg, const char *name)
{
    gseg *s = g->nsegs ? &g->segs[g->nsegs - 1] : NULL;
    if (!s || !s->ent || s->first + s->n != g->n) {
        if (!(s = seg_new(g)))
            return WF_ENOMEM;
        s->ent = malloc(64 * sizeof *s->ent);
        if (!s->ent) {
            g->nsegs--;
            return WF_ENOMEM;
        }
        s->cap = 64;
    }
    if (s->n == s->cap) {
        struct gent *e = realloc(s->ent, (size_t)s->cap * 2 * sizeof *e);
        if (!e)
            return WF_ENOMEM;
        s->ent = e;
        s->cap *= 2;
    }
    s->ent[s->n++] = (struct gent){ fn, arg, name };
    return 0;
}

/* Describes nodes [g->n, g->n + n) as one strided segment. */
static int seg_strided(wf_taskgraph *g, int n, wf_task_fn fn, void *args, size_t stride,
                       const char *name)
{
    gseg *s = seg_new(g);
    if (!s)
        return WF_ENOMEM;
    s->n = n;
    s->fn = fn;
    s->args = args;
    s->stride = stride;
    s->name = name;
    return 0;
}

/* ---- the graph ----------------------------------------------------------------------- */

int wf_taskgraph_create(wf_runtime *rt, wf_taskgraph **out)
{
    if (!out)
        return wf__err(WF_EINVAL, "wf_taskgraph_create: out is NULL");
    *out = NULL;
    if (!rt)
        return wf__err(WF_EINVAL, "wf_taskgraph_create: rt is NULL");
    wf_taskgraph *g = aligned_alloc(WF_CACHELINE, sizeof *g); /* a multiple of the line */
    if (g)
        memset(g, 0, sizeof *g);
    if (!g)
        return wf__err(WF_ENOMEM, "wf_taskgraph_create: no memory");
    g->rt = rt;
    g->mem = wf__blocks_retain(rt->blocks);
    g->dirty = true;
    g->by_src = true;
    g->id = atomic_fetch_add_explicit(&rt->graph_ids, 1, memory_order_relaxed) + 1;
    if (wf_group_init(&g->own, rt) < 0) {
        wf__blocks_release(g->mem);
        free(g);
        return WF_EINVAL;
    }
    *out = g;
    return 0;
}

static void free_compiled(wf_taskgraph *g)
{
    if (g->succ != g->edst)
        wf__blocks_put(g->mem, g->succ, g->succ_bytes);
    free(g->roots);
    wf__blocks_put(g->mem, (void *)g->later_rc, g->later_bytes);
    wf__blocks_put(g->mem, (void *)g->arrive, g->arrive_bytes);
    free(g->ready_by);
    free(g->crit);
    free(g->pred_off);
    free(g->pred);
    free(g->work);
    free(g->work_in);
    g->ready_by = g->crit = g->pred = NULL;
    g->pred_off = NULL;
    g->work = g->work_in = NULL;
    g->succ = g->roots = NULL;
    g->later_rc = NULL;
    g->arrive = NULL;
}

static size_t off_bytes(int cap) /* two more than nodes: add_nodes_fresh() counts there */
{
    return ((size_t)cap + 2) * sizeof(int32_t);
}

static size_t cnt_bytes(int cap)
{
    return ((size_t)cap ? (size_t)cap : 1) * sizeof(struct gcnt);
}

void wf_taskgraph_destroy(wf_taskgraph *g)
{
    if (!g)
        return;
    free_compiled(g);
    for (int s = 0; s < g->nsegs; s++)
        free(g->segs[s].ent);
    free(g->segs);
    wf__blocks_put(g->mem, g->off, off_bytes(g->capn));
    wf__blocks_put(g->mem, g->cnt, cnt_bytes(g->capn));
    wf__blocks_put(g->mem, g->esrc, (size_t)g->capedges * sizeof *g->esrc);
    wf__blocks_put(g->mem, g->edst, (size_t)g->capedges * sizeof *g->edst);
    free(g->kinds);
    wf_group_deinit(&g->own);
    wf__blocks_release(g->mem);
    free(g);
}

int wf_taskgraph_set_kind(wf_taskgraph *g, int id, const char *kind)
{
    if (!g)
        return wf__err(WF_EINVAL, "wf_taskgraph_set_kind: g is NULL");
    if (id < 0 || id >= g->n)
        return gerr(g, WF_EINVAL, "wf_taskgraph_set_kind: node %d of a graph of %d nodes", id,
                    g->n);
    if (atomic_load_explicit(&g->running, memory_order_acquire))
        return gerr(g, WF_EBUSY, "wf_taskgraph_set_kind: the graph is running");
    if (id >= g->nkinds) {
        int cap = g->nkinds ? g->nkinds : 64;
        while (cap <= id)
            cap *= 2;
        const char **k = realloc(g->kinds, (size_t)cap * sizeof *k);
        if (!k)
            return gerr(g, WF_ENOMEM, "wf_taskgraph_set_kind: no memory");
        memset(k + g->nkinds, 0, (size_t)(cap - g->nkinds) * sizeof *k);
        g->kinds = k;
        g->nkinds = cap;
    }
    g->kinds[id] = kind;
    return 0;
}

void wf__graph_trace_ctx(const wf__task *t, wf__tctx *out)
{
    const wf_taskgraph *g = t->owner;
    int i = (int)t->node;
    out->kind = i < g->nkinds ? g->kinds[i] : NULL;
    out->graph = g->id;
    out->run = g->runs - 1;
    out->node = i;
    out->after = g->ready_by ? g->ready_by[i] : -1;
    out->crit = g->crit ? g->crit[i] : -1;
    out->chunk = false;
}

int wf_taskgraph_node_count(const wf_taskgraph *g)
{
    return g ? g->n : WF_EINVAL;
}

const char *wf_taskgraph_errmsg(const wf_taskgraph *g)
{
    return g ? g->errmsg : "";
}

/* Turns CSR offsets back into out-degrees before the graph changes (ascending, so node
 * i + 1 still holds its offset when node i is converted). */
static void decompile(wf_taskgraph *g)
{
    if (!g->compiled)
        return;
    for (int i = 0; i < g->n; i++)
        g->off[i] = g->off[i + 1] - g->off[i];
    g->compiled = false;
}

/* Makes room for 'more' nodes in the per-node arrays; 'what' names the caller in the
 * message. */
static int reserve_nodes(wf_taskgraph *g, int64_t more, const char *what)
{
    if ((int64_t)g->n + more > (1 << 30))
        return gerr(g, WF_ENOMEM, "%s: more than 2^30 nodes", what);
    if ((int64_t)g->n + more <= g->capn)
        return 0;
    int64_t cap = g->capn ? g->capn : 256;
    while (cap < (int64_t)g->n + more)
        cap *= 2;
    int32_t *off = wf__blocks_get(g->mem, off_bytes((int)cap));
    struct gcnt *cnt = wf__blocks_get(g->mem, cnt_bytes((int)cap));
    if (!off || !cnt) {
        wf__blocks_put(g->mem, off, off_bytes((int)cap));
        wf__blocks_put(g->mem, cnt, cnt_bytes((int)cap));
        return gerr(g, WF_ENOMEM, "%s: no memory for node %d", what, g->n);
    }
    if (g->n) {
        memcpy(off, g->off, ((size_t)g->n + 1) * sizeof *off);
        memcpy(cnt, g->cnt, (size_t)g->n * sizeof *cnt);
    }
    wf__blocks_put(g->mem, g->off, off_bytes(g->capn));
    wf__blocks_put(g->mem, g->cnt, cnt_bytes(g->capn));
    g->off = off;
    g->cnt = cnt;
    g->capn = (int)cap;
    return 0;
}

/* The per-node arrays of node 'id' (room reserved): no predecessors, no successors. */
static inline void init_node(wf_taskgraph *g, int id)
{
    g->off[id] = 0;
    atomic_init(&g->cnt[id].pending, 0);
    g->cnt[id].npred = 0;
}

int wf_taskgraph_add(wf_taskgraph *g, wf_task_fn fn, void *arg, const char *name)
{
    if (!g)
        return wf__err(WF_EINVAL, "wf_taskgraph_add: g is NULL");
    if (!fn)
        return gerr(g, WF_EINVAL, "wf_taskgraph_add: node '%s' has a NULL function",
                    name ? name : "(unnamed)");
    if (atomic_load_explicit(&g->running, memory_order_acquire))
        return gerr(g, WF_EBUSY, "wf_taskgraph_add: the graph is running");
    int rc = reserve_nodes(g, 1, "wf_taskgraph_add");
    if (rc < 0)
        return rc;
    if (seg_append(g, fn, arg, name) < 0)
        return gerr(g, WF_ENOMEM, "wf_taskgraph_add: no memory for node %d", g->n);
    decompile(g);
    init_node(g, g->n);
    g->nroots++;
    g->dirty = true;
    return g->n++;
}

/* Writes the edge list's sources of a graph built by add_nodes_fresh(), from the out-degrees
 * (or, compiled, the successor ranges) of its nodes: the edges are in source order. */
static int write_esrc(wf_taskgraph *g, const char *what)
{
    if (!g->esrc_lazy)
        return 0;
    int *s = wf__blocks_get(g->mem, (size_t)g->capedges * sizeof *s);
    if (!s)
        return gerr(g, WF_ENOMEM, "%s: no memory for %lld edges", what, (long long)g->capedges);
    int64_t e = 0;
    for (int i = 0; i < g->n; i++) {
        int deg = g->compiled ? g->off[i + 1] - g->off[i] : g->off[i];
        for (int k = 0; k < deg; k++)
            s[e++] = i;
    }
    WF_ASSERT(e == g->nedges);
    g->esrc = s;
    g->esrc_lazy = false;
    return 0;
}

/* Makes room for 'more' edges; 'what' names the caller in the message. */
static int reserve_edges(wf_taskgraph *g, int64_t more, const char *what)
{
    int rc = write_esrc(g, what);
    if (rc < 0)
        return rc;
    if (g->nedges + more <= g->capedges)
        return 0;
    int64_t cap = g->capedges ? g->capedges * 2 : 256;
    while (cap < g->nedges + more)
        cap *= 2;
    size_t used = (size_t)g->nedges * sizeof(int), old = (size_t)g->capedges * sizeof(int),
           want = (size_t)cap * sizeof(int);
    int *s = wf__blocks_get(g->mem, want), *d = wf__blocks_get(g->mem, want);
    if (!s || !d) {
        wf__blocks_put(g->mem, s, want);
        wf__blocks_put(g->mem, d, want);
        return gerr(g, WF_ENOMEM, "%s: no memory for %lld edges", what, (long long)cap);
    }
    if (g->succ == g->edst) /* compiled on these: the successors move with them */
        g->succ = d;
    if (used) {
        memcpy(s, g->esrc, used);
        memcpy(d, g->edst, used);
    }
    wf__blocks_put(g->mem, g->esrc, old);
    wf__blocks_put(g->mem, g->edst, old);
    g->esrc = s;
    g->edst = d;
    g->capedges = cap;
    return 0;
}

/* Adds the edge before -> after (valid ids, room reserved, the graph decompiled, 'after'
 * below MAX_PRED predecessors). */
static inline void add_edge(wf_taskgraph *g, int before, int after)
{
    g->off[before]++;
    if (g->cnt[after].npred++ == 0)
        g->nroots--;
    g->nback += before > after;
    if (g->nedges && before < g->esrc[g->nedges - 1])
        g->by_src = false;
    g->esrc[g->nedges] = before;
    g->edst[g->nedges] = after;
    g->nedges++;
}

static int too_many_preds(wf_taskgraph *g, const char *what, int id)
{
    return gerr(g, WF_EINVAL, "%s: node %d ('%s') would have more than %d predecessors", what, id,
                node_name(g, id), MAX_PRED);
}

int wf_taskgraph_precede(wf_taskgraph *g, int before, int after)
{
    if (!g)
        return wf__err(WF_EINVAL, "wf_taskgraph_precede: g is NULL");
    if (before < 0 || before >= g->n || after < 0 || after >= g->n)
        return gerr(g, WF_EINVAL, "wf_taskgraph_precede: node %d -> %d: ids must be in [0, %d)",
                    before, after, g->n);
    if (before == after)
        return gerr(g, WF_EINVAL, "wf_taskgraph_precede: node %d ('%s') cannot precede itself",
                    before, node_name(g, before));
    if (atomic_load_explicit(&g->running, memory_order_acquire))
        return gerr(g, WF_EBUSY, "wf_taskgraph_precede: the graph is running");
    if (g->cnt[after].npred >= MAX_PRED)
        return too_many_preds(g, "wf_taskgraph_precede", after);
    int rc = reserve_edges(g, 1, "wf_taskgraph_precede");
    if (rc < 0)
        return rc;
    decompile(g);
    add_edge(g, before, after);
    g->dirty = true;
    return 0;
}

int wf_taskgraph_add_after(wf_taskgraph *g, wf_task_fn fn, void *arg, const char *name,
                           const int *preds, int npred)
{
    if (!g)
        return wf__err(WF_EINVAL, "wf_taskgraph_add_after: g is NULL");
    if (npred < 0 || npred > MAX_PRED || (npred > 0 && !preds))
        return gerr(g, WF_EINVAL, "wf_taskgraph_add_after: node '%s': %d predecessors at %p",
                    name ? name : "(unnamed)", npred, (const void *)preds);
    for (int k = 0; k < npred; k++)
        if (preds[k] < 0 || preds[k] >= g->n)
            return gerr(g, WF_EINVAL,
                        "wf_taskgraph_add_after: node '%s': predecessor %d is node %d; ids "
                        "must be in [0, %d)",
                        name ? name : "(unnamed)", k, preds[k], g->n);
    if (!atomic_load_explicit(&g->running, memory_order_acquire)) {
        int rc = reserve_edges(g, npred, "wf_taskgraph_add_after");
        if (rc < 0)
            return rc;
    }
    int id = wf_taskgraph_add(g, fn, arg, name); /* checks fn and running; decompiles */
    if (id < 0)
        return id;
    for (int k = 0; k < npred; k++)
        add_edge(g, preds[k], id);
    return id;
}

/* The message for entry 'k' of 'preds', predecessor 'p' of node 'id', which is not an
 * earlier node. */
static int bad_pred(wf_taskgraph *g, int id, int64_t k, int p, const char *name)
{
    return gerr(g, WF_EINVAL,
                "wf_taskgraph_add_nodes: node %d ('%s'): preds[%lld] is node %d; a predecessor "
                "must be an earlier node, in [0, %d)",
                id, name ? name : "(unnamed)", (long long)k, p, id);
}

/* Row 'j' of 'pred_off' (node 'id') lies within the rows' range: the previous row's end
 * (checked before it, from pred_off[0] on) up to pred_off[n], so no check reads 'preds'
 * outside what the caller described, and it is shorter than MAX_PRED. Returns 0 or the
 * error. */
static int check_row(wf_taskgraph *g, int id, const int64_t *pred_off, int j, int n)
{
    if (pred_off[j + 1] < pred_off[j])
        return gerr(g, WF_EINVAL,
                    "wf_taskgraph_add_nodes: node %d: pred_off[%d] %lld > pred_off[%d] %lld", id, j,
                    (long long)pred_off[j], j + 1, (long long)pred_off[j + 1]);
    if (pred_off[j + 1] > pred_off[n])
        return gerr(g, WF_EINVAL,
                    "wf_taskgraph_add_nodes: node %d: pred_off[%d] %lld is past pred_off[%d] %lld",
                    id, j + 1, (long long)pred_off[j + 1], n, (long long)pred_off[n]);
    if (pred_off[j + 1] - pred_off[j] > MAX_PRED)
        return gerr(g, WF_EINVAL, "wf_taskgraph_add_nodes: node %d: more than %d predecessors", id,
                    MAX_PRED);
    return 0;
}

/* add_nodes on an empty, untraced graph: the compiled form written at once, as compile()
 * would leave it, in three passes (check rows, write the counters and roots and count
 * out-degrees; offsets; scatter the successors, with the offsets as their cursors), with
 * 'edst' as the successor array and 'esrc' left to write_esrc(). The per-node arrays are
 * reserved; nothing is kept on an error. */
static int add_nodes_fresh(wf_taskgraph *g, wf_task_fn fn, void *args, size_t stride,
                           const char *name, int n, const int64_t *pred_off, const int *preds)
{
    int64_t m = pred_off ? pred_off[n] - pred_off[0] : 0;
    size_t nb = (size_t)(n ? n : 1);
    _Atomic int32_t *later = wf__blocks_get(g->mem, nb * sizeof *later);
    _Atomic uint8_t *arrive = wf__blocks_get(g->mem, nb);
    int *succ = wf__blocks_get(g->mem, (size_t)(m ? m : 1) * sizeof *succ);
    int *roots = NULL, nroots = 0, rc = 0;
    int32_t *off = g->off;
    struct gcnt *cnt = g->cnt;
    if (!later || !arrive || !succ) {
        rc = gerr(g, WF_ENOMEM, "wf_taskgraph_add_nodes: no memory for %d nodes", n);
        goto out;
    }
    /* Out-degrees counted two places up, so that the prefix sum leaves node p's start in
     * off[p + 1], the scatter's cursor, which it then moves to p's end: node p + 1's start.
     * No cursor array and no shift afterwards. */
    memset(off, 0, ((size_t)n + 2) * sizeof *off);
    roots = malloc(nb * sizeof *roots); /* at most n; pages past the roots are not touched */
    if (!roots || seg_strided(g, n, fn, args, stride, name) < 0) {
        rc = gerr(g, WF_ENOMEM, "wf_taskgraph_add_nodes: no memory for %d nodes", n);
        goto out;
    }
    if (!pred_off) { /* no edges: every node a root, every offset 0 (the memset) */
        for (int j = 0; j < n; j++) {
            atomic_init(&cnt[j].pending, 0);
            cnt[j].npred = 0;
            roots[j] = j;
        }
        nroots = n;
    } else {
        int64_t lo = pred_off[0], end = pred_off[n];
        for (int j = 0; j < n; j++) {
            int64_t hi = pred_off[j + 1];
            /* a decreasing row makes hi - lo huge too */
            if (WF_UNLIKELY((uint64_t)(hi - lo) > MAX_PRED || hi > end)) {
                rc = check_row(g, j, pred_off, j, n); /* says which */
                WF_ASSERT(rc < 0);
                goto out;
            }
            int32_t np = (int32_t)(hi - lo);
            atomic_init(&cnt[j].pending, np);
            cnt[j].npred = np;
            if (!np)
                roots[nroots++] = j;
            for (int64_t k = lo; k < hi; k++) {
                int p = preds[k];
                if (WF_UNLIKELY((unsigned)p >= (unsigned)j)) {
                    rc = bad_pred(g, j, k, p, name);
                    goto out;
                }
                off[p + 2]++;
            }
            lo = hi;
        }
    }
    int32_t sum = 0;
    for (int p = 0; p < n; p++) {
        int32_t deg = off[p + 2]; /* read before iteration p + 1 writes it */
        off[p + 1] = sum;
        sum += deg;
    }
    if (m) {
        int64_t lo = pred_off[0];
        for (int j = 0; j < n; j++) {
            int64_t hi = pred_off[j + 1];
            for (int64_t k = lo; k < hi; k++)
                succ[off[preds[k] + 1]++] = j;
            lo = hi;
        }
    }
    off[n] = sum; /* already so when there are edges; 0 when there are none */
    memset((void *)arrive, 0, nb);
    free_compiled(g);
    wf__blocks_put(g->mem, g->esrc, (size_t)g->capedges * sizeof *g->esrc);
    wf__blocks_put(g->mem, g->edst, (size_t)g->capedges * sizeof *g->edst);
    g->esrc = g->edst = NULL;
    g->capedges = 0;
    if (m) { /* the successors in source order are the edge list's destinations */
        g->edst = succ;
        g->capedges = m;
        g->esrc_lazy = true;
    }
    g->n = n;
    g->nedges = m;
    g->by_src = true;
    g->nback = 0;
    g->nroots = nroots;
    g->later_rc = later;
    g->arrive = arrive;
    g->succ = succ;
    g->roots = roots;
    g->later_bytes = nb * sizeof *later;
    g->arrive_bytes = nb;
    g->succ_bytes = (size_t)(m ? m : 1) * sizeof *succ;
    g->compiled = true;
    g->dirty = false;
    later = NULL;
    arrive = NULL;
    succ = NULL;
    roots = NULL;
out:
    if (rc < 0)
        g->nsegs = 0; /* the graph was empty: its one segment goes too */
    wf__blocks_put(g->mem, (void *)later, nb * sizeof *later);
    wf__blocks_put(g->mem, (void *)arrive, nb);
    wf__blocks_put(g->mem, succ, (size_t)(m ? m : 1) * sizeof *succ);
    free(roots);
    return rc;
}

int wf_taskgraph_add_nodes(wf_taskgraph *g, wf_task_fn fn, void *args, size_t arg_stride,
                           const char *name, int n, const int64_t *pred_off, const int *preds)
{
    if (!g)
        return wf__err(WF_EINVAL, "wf_taskgraph_add_nodes: g is NULL");
    if (!fn || n < 0 || (pred_off && !preds && pred_off[n] != pred_off[0]))
        return gerr(g, WF_EINVAL, "wf_taskgraph_add_nodes: %d nodes '%s': %s", n,
                    name ? name : "(unnamed)",
                    !fn     ? "NULL function"
                    : n < 0 ? "a negative count"
                            : "NULL preds");
    if (atomic_load_explicit(&g->running, memory_order_acquire))
        return gerr(g, WF_EBUSY, "wf_taskgraph_add_nodes: the graph is running");
    int first = g->n;
    int64_t m = pred_off ? pred_off[n] - pred_off[0] : 0;
    if (m < 0)
        return gerr(g, WF_EINVAL, "wf_taskgraph_add_nodes: pred_off[%d] %lld < pred_off[0] %lld", n,
                    (long long)pred_off[n], (long long)pred_off[0]);
    if (m > (int64_t)INT32_MAX - g->nedges)
        return gerr(g, WF_ENOMEM, "wf_taskgraph_add_nodes: more than 2^31 edges");
    if (n == 0)
        return first;
    int rc = reserve_nodes(g, n, "wf_taskgraph_add_nodes");
    if (rc < 0)
        return rc;
    if (first == 0 && g->nedges == 0 && !g->rt->trace_cap) {
        rc = add_nodes_fresh(g, fn, args, arg_stride, name, n, pred_off, preds);
        return rc < 0 ? rc : 0;
    }
    /* Any other graph: check everything first, then add nodes and edges as add_after does. */
    for (int j = 0; j < n && pred_off; j++) {
        if ((rc = check_row(g, first + j, pred_off, j, n)) < 0)
            return rc;
        for (int64_t k = pred_off[j]; k < pred_off[j + 1]; k++)
            if (preds[k] < 0 || preds[k] >= first + j)
                return bad_pred(g, first + j, k, preds[k], name);
    }
    rc = reserve_edges(g, m, "wf_taskgraph_add_nodes");
    if (rc < 0)
        return rc;
    if (seg_strided(g, n, fn, args, arg_stride, name) < 0)
        return gerr(g, WF_ENOMEM, "wf_taskgraph_add_nodes: no memory for %d nodes", n);
    decompile(g);
    for (int j = 0; j < n; j++) {
        init_node(g, first + j);
        g->nroots++;
        for (int64_t k = pred_off ? pred_off[j] : 0; pred_off && k < pred_off[j + 1]; k++)
            add_edge(g, preds[k], first + j);
    }
    g->n = first + n;
    g->dirty = true;
    return first;
}

/* Names a node on a cycle: after Kahn's algorithm, every node left has a predecessor left,
 * so walking predecessors n steps from any of them ends on a cycle. */
static int report_cycle(wf_taskgraph *g, const int *left)
{
    int *pred = malloc((size_t)g->n * sizeof *pred);
    if (!pred)
        return gerr(g, WF_EINVAL, "wf_taskgraph: the graph has a cycle");
    int start = -1;
    for (int i = 0; i < g->n; i++) {
        pred[i] = -1;
        if (left[i] && start < 0)
            start = i;
    }
    for (int64_t e = 0; e < g->nedges; e++)
        if (left[g->esrc[e]] && left[g->edst[e]])
            pred[g->edst[e]] = g->esrc[e];
    int v = start;
    for (int i = 0; i < g->n && pred[v] >= 0; i++)
        v = pred[v];
    free(pred);
    return gerr(g, WF_EINVAL, "wf_taskgraph: the graph has a cycle through node %d ('%s')", v,
                node_name(g, v));
}

/* Kahn's algorithm, with the counters' 'pending' as the in-degrees left. Returns 0 or the
 * cycle's error. */
static int check_acyclic(wf_taskgraph *g)
{
    int n = g->n, head = 0, tail = g->nroots;
    int *queue = malloc((size_t)n * sizeof *queue);
    int *left = calloc((size_t)n, sizeof *left);
    if (!queue || !left) {
        free(queue);
        free(left);
        return gerr(g, WF_ENOMEM, "wf_taskgraph: no memory to check %d nodes", n);
    }
    memcpy(queue, g->roots, (size_t)g->nroots * sizeof *queue);
    while (head < tail) {
        int v = queue[head++];
        for (int k = g->off[v]; k < g->off[v + 1]; k++)
            if (atomic_fetch_sub_explicit(&g->cnt[g->succ[k]].pending, 1, memory_order_relaxed) ==
                1)
                queue[tail++] = g->succ[k];
    }
    int rc = 0;
    if (tail < n) {
        for (int i = 0; i < n; i++)
            left[i] = atomic_load_explicit(&g->cnt[i].pending, memory_order_relaxed) > 0;
        rc = report_cycle(g, left);
    }
    for (int i = 0; i < n; i++)
        atomic_store_explicit(&g->cnt[i].pending, g->cnt[i].npred, memory_order_relaxed);
    free(queue);
    free(left);
    return rc;
}

/* The arrays a traced run fills (see struct wf_taskgraph), with every node a root until it
 * is released, and the predecessor lists: a counting sort of the edges by destination. */
static int compile_trace(wf_taskgraph *g)
{
    size_t n = (size_t)(g->n ? g->n : 1), m = (size_t)(g->nedges ? g->nedges : 1);
    if (write_esrc(g, "wf_taskgraph") < 0)
        return WF_ENOMEM;
    g->ready_by = malloc(n * sizeof *g->ready_by);
    g->crit = malloc(n * sizeof *g->crit);
    g->work = calloc(n, sizeof *g->work);
    g->work_in = calloc(n, sizeof *g->work_in);
    g->pred_off = malloc((n + 1) * sizeof *g->pred_off);
    g->pred = malloc(m * sizeof *g->pred);
    if (!g->ready_by || !g->crit || !g->work || !g->work_in || !g->pred_off || !g->pred)
        return WF_ENOMEM; /* the caller frees what was allocated */
    g->pred_off[0] = 0;
    for (int i = 0; i < g->n; i++) {
        g->ready_by[i] = g->crit[i] = -1;
        g->pred_off[i + 1] = g->pred_off[i] + g->cnt[i].npred;
    }
    int64_t *cur = malloc(n * sizeof *cur);
    if (!cur)
        return WF_ENOMEM;
    memcpy(cur, g->pred_off, (size_t)g->n * sizeof *cur);
    for (int64_t e = 0; e < g->nedges; e++)
        g->pred[cur[g->edst[e]]++] = g->esrc[e];
    free(cur);
    return 0;
}

/* One pass over the nodes (offsets, counters, roots) and, unless the edges came in order of
 * their source, one over the edges (a counting sort by source): the in- and out-degrees were
 * counted as edges were added. */
static int compile(wf_taskgraph *g)
{
    free_compiled(g);
    int n = g->n;
    size_t m = (size_t)g->nedges, cur_bytes = (size_t)(n ? n : 1) * sizeof(int);
    g->succ_bytes = (m ? m : 1) * sizeof *g->succ;
    g->later_bytes = (size_t)(n ? n : 1) * sizeof *g->later_rc;
    g->arrive_bytes = (size_t)(n ? n : 1);
    g->succ = g->by_src && m ? g->edst : wf__blocks_get(g->mem, g->succ_bytes);
    g->roots = malloc((size_t)(g->nroots ? g->nroots : 1) * sizeof *g->roots);
    g->later_rc = wf__blocks_get(g->mem, g->later_bytes); /* written before it is read */
    g->arrive = wf__blocks_get(g->mem, g->arrive_bytes);
    int *cur = g->succ == g->edst ? NULL : wf__blocks_get(g->mem, cur_bytes);
    if (!g->succ || !g->roots || !g->later_rc || !g->arrive || (g->succ != g->edst && !cur) ||
        (g->rt->trace_cap && compile_trace(g) < 0)) {
        wf__blocks_put(g->mem, cur, cur_bytes);
        free_compiled(g);
        return gerr(g, WF_ENOMEM, "wf_taskgraph: no memory to compile %d nodes", n);
    }
    memset((void *)g->arrive, 0, g->arrive_bytes);
    int32_t sum = 0;
    int nroots = 0;
    for (int i = 0; i < n; i++) {
        int32_t outdeg = g->off[i];
        g->off[i] = sum;
        if (cur)
            cur[i] = sum;
        sum += outdeg;
        atomic_init(&g->cnt[i].pending, g->cnt[i].npred);
        if (!g->cnt[i].npred)
            g->roots[nroots++] = i;
    }
    if (n) /* an empty graph may have no arrays */
        g->off[n] = sum;
    WF_ASSERT(nroots == g->nroots && (size_t)sum == m);
    if (cur)
        for (size_t e = 0; e < m; e++)
            g->succ[cur[g->esrc[e]]++] = g->edst[e];
    wf__blocks_put(g->mem, cur, cur_bytes);
    /* From here until the next change, 'off' holds offsets, not out-degrees. */
    g->compiled = true;
    if (g->nback) {
        int rc = check_acyclic(g);
        if (rc < 0) {
            decompile(g);
            free_compiled(g);
            return rc;
        }
    }
    g->dirty = false;
    return 0;
}

/* The task that carries ready node 'i' ('canceled': a predecessor failed) through a deque or
 * an inbox, from 'w''s free list (or the shared pool when 'w' is NULL); NULL when out of
 * memory. */
static wf__task *node_task(wf_taskgraph *g, wf__worker *w, int i, bool canceled)
{
    wf__task *t = wf__task_alloc(g->rt, w);
    if (WF_UNLIKELY(!t))
        return NULL;
    t->kind = WF__TK_GRAPH;
    t->owner = g;
    t->node = (uint32_t)i;
    /* read only by a steal's trace event: no segment lookup per push otherwise */
    t->name = g->rt->trace_cap ? seg_name(seg_of(g, i), i) : NULL;
    atomic_store_explicit(&t->cancel, canceled, memory_order_relaxed);
    return t;
}

int wf_taskgraph_submit(wf_taskgraph *g, wf_group *grp)
{
    if (!g || !grp)
        return wf__err(WF_EINVAL, "wf_taskgraph_submit: %s is NULL", g ? "grp" : "g");
    wf__group *x = (wf__group *)grp;
    if (x->magic != WF__GROUP_MAGIC)
        return gerr(g, WF_EINVAL, "wf_taskgraph_submit: the group is not initialised");
    if (atomic_exchange_explicit(&g->running, 1, memory_order_acq_rel))
        return gerr(g, WF_EBUSY, "wf_taskgraph_submit: the graph is already running");
    if (g->dirty) {
        int rc = compile(g);
        if (rc < 0) {
            atomic_store_explicit(&g->running, 0, memory_order_release);
            return rc;
        }
    }
    if (g->n == 0) {
        atomic_store_explicit(&g->running, 0, memory_order_release);
        return 0;
    }
    /* The roots' tasks first, so that nothing has started when one cannot be had. */
    wf__worker *w = wf__worker_of(g->rt);
    wf__task *list = NULL;
    for (int r = g->nroots; r-- > 0;) {
        wf__task *t = node_task(g, w, g->roots[r], false);
        if (!t) {
            while (list) {
                wf__task *next = list->next;
                wf__task_release(g->rt, w, list);
                list = next;
            }
            atomic_store_explicit(&g->running, 0, memory_order_release);
            return gerr(g, WF_ENOMEM, "wf_taskgraph_submit: no memory for %d root tasks",
                        g->nroots);
        }
        t->next = list;
        list = t;
    }
    g->grp = x;
    g->runs++; /* read by the nodes of this run: pushing them publishes it */
    atomic_store_explicit(&g->remaining, g->n, memory_order_relaxed);
    if (wf__group_add(x, (uint32_t)g->n) < 0) {
        while (list) {
            wf__task *next = list->next;
            wf__task_release(g->rt, w, list);
            list = next;
        }
        atomic_store_explicit(&g->running, 0, memory_order_release);
        return gerr(g, WF_ENOMEM, "wf_taskgraph_submit: %s", wf_last_errmsg());
    }
    while (list) {
        wf__task *t = list, *next = t->next; /* an inbox links through 'next' */
        if (w)
            wf__push_local(w, t);
        else
            wf__submit_outside(g->rt, t);
        list = next;
    }
    return 0;
}

int wf_taskgraph_run(wf_taskgraph *g)
{
    if (!g)
        return wf__err(WF_EINVAL, "wf_taskgraph_run: g is NULL");
    int rc = wf_taskgraph_submit(g, &g->own);
    if (rc < 0)
        return rc;
    g->errmsg[0] = '\0';
    rc = wf_group_wait(&g->own);
    if (rc < 0)
        gerr(g, rc, "%s", wf_group_errmsg(&g->own));
    return rc;
}

/* Node 's' became ready when predecessor 'by' ended: its critical predecessor is the one
 * with the most work before it. The last decrement of its counter (acq_rel; or, for one
 * predecessor, that predecessor's own thread) orders every
 * predecessor's write of its 'work' before these reads. */
static void trace_ready(wf_taskgraph *g, int s, int32_t by)
{
    int32_t best = -1;
    uint64_t most = 0;
    for (int64_t k = g->pred_off[s]; k < g->pred_off[s + 1]; k++) {
        int32_t p = g->pred[k];
        if (best < 0 || g->work[p] > most) {
            best = p;
            most = g->work[p];
        }
    }
    g->ready_by[s] = by;
    g->crit[s] = best;
    g->work_in[s] = most;
}

/* Counts predecessor 'by' of node 's' done ('skip': it failed or was skipped); returns true
 * when that was the last, with '*canceled' set when any predecessor failed. */
static inline bool release_one(wf_taskgraph *g, int by, int s, bool skip, bool *canceled)
{
    struct gcnt *c = &g->cnt[s];
    int32_t np = c->npred;
    bool cancel = skip;
    if (np != 1) { /* a single predecessor needs no counter: 'by' ending makes 's' ready */
        if (WF_UNLIKELY(skip))
            atomic_fetch_or_explicit(&c->pending, CANCELED, memory_order_relaxed);
        int32_t old = atomic_fetch_sub_explicit(&c->pending, 1, memory_order_acq_rel);
        if ((old & ~CANCELED) != 1)
            return false;
        cancel = (old & CANCELED) != 0;
        atomic_store_explicit(&c->pending, np, memory_order_relaxed);
    }
    *canceled = cancel;
    if (g->ready_by) /* traced: 's' is ours now, and every predecessor's 'work' seen */
        trace_ready(g, s, by);
    return true;
}

/* Finishes ready node 'i' and every node after it as skipped, on this thread, without
 * running them: what becomes of a ready node when no task can be had for it (see the
 * header). No recursion and no allocation (memory is short, and a skipped chain may be
 * millions of nodes long): the nodes still to finish form a stack threaded through their own
 * counters. A ready node's counter is its releaser's until it runs (every predecessor has
 * arrived, and it was reset for the next run), so it can hold the id below it on the stack
 * until the node is taken; it is then reset again. Returns the nodes finished. */
static uint32_t skip_from(wf_taskgraph *g, int i)
{
    uint32_t n = 0;
    int top = i;
    bool c;
    atomic_store_explicit(&g->cnt[i].pending, -1, memory_order_relaxed); /* the bottom */
    while (top >= 0) {
        int x = top;
        top = atomic_load_explicit(&g->cnt[x].pending, memory_order_relaxed);
        atomic_store_explicit(&g->cnt[x].pending, g->cnt[x].npred, memory_order_relaxed);
        n++;
        for (int k = g->off[x]; k < g->off[x + 1]; k++) {
            int s = g->succ[k];
            if (release_one(g, x, s, true, &c)) {
                atomic_store_explicit(&g->cnt[s].pending, top, memory_order_relaxed);
                top = s;
            }
        }
    }
    return n;
}

/* Hands ready node 's' to the workers: pushed on 'w', or submitted from outside when 'w' is
 * NULL. Returns the nodes this call finished itself (skip_from(), out of memory), else 0. */
static uint32_t hand_off(wf_taskgraph *g, wf__worker *w, int s, bool canceled)
{
    wf__task *t = node_task(g, w, s, canceled);
    if (WF_LIKELY(t)) {
        if (w)
            wf__push_local(w, t);
        else
            wf__submit_outside(g->rt, t);
        return 0;
    }
    wf__err(WF_ENOMEM,
            "wf_taskgraph: no memory for the task of ready node %d ('%s'); it and "
            "the nodes after it are skipped",
            s, node_name(g, s));
    wf__group_fail(g->grp, NULL, node_name(g, s), WF_ENOMEM);
    return skip_from(g, s);
}

/* Releases the successors of node 'i' ('skip': it failed or was skipped, so they are
 * canceled): the first that becomes ready is returned for the caller to run, with
 * '*canceled' its state, and the others are handed off (hand_off(), which adds what it
 * finished itself to '*ndone'); -1 when none. With 'w' NULL (a completion from outside)
 * every ready successor is handed off and none returned. */
static int release_successors(wf_taskgraph *g, wf__worker *w, int i, bool skip, bool *canceled,
                              uint32_t *ndone)
{
    const int *succ = g->succ;
    int keep = -1, lo = g->off[i];
    bool kc = false, c;
    /* From the last successor to the first: a ready one found before the kept one is pushed,
     * so the caller runs the list's first ready successor itself and its own LIFO pops take
     * the rest in the list's order (exec.c sorts successors by priority), while thieves take
     * the oldest push, the list's last. Pushed in list order, the owner ran them last first:
     * a bucket's last gradient (a tiny bias sum, boosted before its reduction) ran only after
     * the whole rest of backward, and dp_bench's first bucket started as backward ended. */
    for (int k = g->off[i + 1] - 1; k >= lo; k--) {
        int s = succ[k];
        if (!release_one(g, i, s, skip, &c))
            continue;
        if (keep >= 0)
            *ndone += hand_off(g, w, keep, kc);
        keep = s;
        kc = c;
    }
    if (keep >= 0 && !w) {
        *ndone += hand_off(g, NULL, keep, kc);
        keep = -1;
    }
    *canceled = kc;
    return keep;
}

/* 'ndone' nodes of the run finished: the last of them ends the run. 'g' may be gone after. */
static void finish_nodes(wf_taskgraph *g, uint32_t ndone)
{
    wf__group *grp = g->grp;
    if (atomic_fetch_sub_explicit(&g->remaining, ndone, memory_order_acq_rel) == ndone)
        atomic_store_explicit(&g->running, 0, memory_order_release);
    wf__group_done(grp, ndone);
}

void wf__graph_flush(wf__worker *w)
{
    wf_taskgraph *g = w->gdone_graph;
    uint32_t n = w->gdone_n;
    w->gdone_graph = NULL;
    w->gdone_grp = NULL;
    w->gdone_n = 0;
    finish_nodes(g, n);
}

/* Counts 'n' finished nodes of 'g' on 'w', to be given to the graph and its group in one
 * subtraction: nodes that end a worker's run of inline successors (most of a wide DAG's)
 * would otherwise make 'remaining' and the group's counter bounce between the cores at
 * each. wf__flush_done() gives them before the worker searches, parks, waits or runs a task
 * of anything else (internal.h), and a batch never exceeds 1024 nodes. */
static void done_later(wf__worker *w, wf_taskgraph *g, uint32_t n)
{
    if (w->gdone_graph != g) {
        if (w->gdone_n)
            wf__graph_flush(w);
        w->gdone_graph = g;
        w->gdone_grp = g->grp;
    }
    w->gdone_n += n;
    if (w->gdone_n >= 1024)
        wf__graph_flush(w);
}

int wf_taskgraph_complete(wf_taskgraph *g, int i, int rc)
{
    if (!g)
        return wf__err(WF_EINVAL, "wf_taskgraph_complete: g is NULL");
    if (i < 0 || i >= g->n || !atomic_load_explicit(&g->running, memory_order_acquire) ||
        !g->later_rc)
        return wf__err(
            WF_EINVAL, "wf_taskgraph_complete: node %d of a graph of %d nodes%s", i, g->n,
            atomic_load_explicit(&g->running, memory_order_acquire) ? "" : " that is not running");
    atomic_store_explicit(&g->later_rc[i], rc, memory_order_relaxed);
    if (atomic_fetch_add_explicit(&g->arrive[i], 1, memory_order_acq_rel) == 0)
        return 0; /* the function has not returned yet: its worker finishes the node */
    atomic_store_explicit(&g->arrive[i], 0, memory_order_relaxed);
    wf__worker *w = wf__worker_of(g->rt);
    bool skip = rc < 0, c;
    if (skip) /* no worker's message: wf_task_fail() was not called by this thread's task */
        wf__group_fail(g->grp, NULL, node_name(g, i), rc);
    uint32_t ndone = 1;
    int keep = release_successors(g, w, i, skip, &c, &ndone);
    if (keep >= 0)
        ndone += hand_off(g, w, keep, c);
    finish_nodes(g, ndone);
    return 0;
}

/* Runs node 'i' ('canceled': a predecessor failed) on 'w' and then, in the same loop, the
 * ready successor each node keeps; returns the nodes finished. The common step of a chain
 * (one successor, which has only this predecessor, untraced) is taken without a call. */
static uint32_t run_from(wf__worker *w, wf_taskgraph *g, int i, bool canceled)
{
    wf__group *grp = g->grp;
    wf_runtime *rt = w->rt;
    const int32_t *off = g->off;
    const int *succ = g->succ;
    const struct gcnt *cnt = g->cnt;
    const bool ring = w->ring != NULL, traced = g->ready_by != NULL;
    /* The segment of the nodes being run, in locals: nodes [first, first + n). */
    const gseg *sg = seg_of(g, i);
    int first = sg->first;
    unsigned n = (unsigned)sg->n;
    const struct gent *ent = sg->ent;
    wf_task_fn sfn = sg->fn;
    char *args = sg->args;
    size_t stride = sg->stride; /* 0: 'args' for every node */
    const char *sname = sg->name;
    /* What w->current shows of the node running (wf_task_fail(), a parallel_for's trace). */
    wf__task cur = { .kind = WF__TK_GRAPH, .owner = g };
    uint32_t ndone = 0, ran = 0;
    /* The group's first error, read again every 32 nodes: a descendant of a failed node
     * learns it from its counter ('canceled'), so only other nodes may start after a failure
     * elsewhere, as they could have before it was seen. The line is the group counter's,
     * which every worker's batch of finished nodes writes. */
    int32_t err = atomic_load_explicit(&grp->err, memory_order_relaxed);
    w->current = &cur;
    for (;;) {
        if (WF_UNLIKELY((unsigned)(i - first) >= n)) {
            sg = seg_of(g, i);
            first = sg->first;
            n = (unsigned)sg->n;
            ent = sg->ent;
            sfn = sg->fn;
            args = sg->args;
            stride = sg->stride;
            sname = sg->name;
        }
        wf_task_fn fn = sfn;
        void *arg = args + (size_t)(i - first) * stride;
        const char *name = sname;
        if (ent) {
            const struct gent *e = &ent[i - first];
            fn = e->fn;
            arg = e->arg;
            name = e->name;
        }
        if (WF_UNLIKELY((ran & 31) == 31))
            err = atomic_load_explicit(&grp->err, memory_order_relaxed);
        bool skip = canceled || err;
        uint64_t t0 = ring ? wf__now_ns() : 0;
        int rc = 0;
        WF_PROBE2(task_begin, w->index, name);
        if (WF_LIKELY(!skip)) {
            /* The counters this node will decrement, asked for with intent to write while it
             * runs: in a wide DAG each is on a line the other core wrote last, and the locked
             * decrements afterwards take one such miss after another (up to 8 lines). */
            for (int k = off[i], e = off[i + 1] < k + 8 ? off[i + 1] : k + 8; k < e; k++)
                __builtin_prefetch(&cnt[succ[k]], 1, 3);
            w->fail_set = 0;
            cur.node = (uint32_t)i;
            rc = fn(arg);
            if (WF_UNLIKELY(rc < 0)) {
                wf__group_fail(grp, w, name, rc);
                skip = true;
                err = rc;
            }
        }
        WF_PROBE3(task_end, w->index, name, rc);
        if (WF_UNLIKELY(ring)) {
            uint64_t t1 = wf__now_ns();
            if (g->work) /* published to the successors by release_successors() */
                g->work[i] = g->work_in[i] + (t1 - t0);
            wf__tctx c;
            cur.node = (uint32_t)i;
            wf__graph_trace_ctx(&cur, &c);
            wf__trace_event(w, WF__EV_TASK, t0 - rt->t_start, t1 - rt->t_start, name, (uint32_t)rc,
                            &c);
        }
        ran++;
        if (WF_UNLIKELY(rc == WF_TASK_LATER)) {
            if (atomic_fetch_add_explicit(&g->arrive[i], 1, memory_order_acq_rel) == 0)
                break; /* wf_taskgraph_complete() finishes it; 'i' is not ours any more */
            atomic_store_explicit(&g->arrive[i], 0, memory_order_relaxed);
            rc = atomic_load_explicit(&g->later_rc[i], memory_order_relaxed);
            if (rc < 0) {
                wf__group_fail(grp, NULL, name, rc);
                skip = true;
            }
        }
        ndone++;
        int lo = off[i], next;
        if (off[i + 1] - lo == 1 && cnt[next = succ[lo]].npred == 1 && !traced) {
            /* a chain: 'i' ending makes 'next' ready, canceled if 'i' was */
            canceled = skip;
        } else {
            next = release_successors(g, w, i, skip, &canceled, &ndone);
            if (next < 0)
                break;
        }
        i = next;
    }
    WF__INC(w, tasks_run, ran);
    return ndone;
}

void wf__graph_run_node(wf__worker *w, wf__task *t)
{
    wf_taskgraph *g = t->owner;
    int i = (int)t->node;
    bool canceled = atomic_load_explicit(&t->cancel, memory_order_relaxed);
    wf__task_free(w, t); /* the node is ours: its task has done its job */
    uint32_t ndone = run_from(w, g, i, canceled);
    if (ndone) /* else only a node that finishes later: the graph may be gone already */
        done_later(w, g, ndone);
}
