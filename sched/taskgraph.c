/* sched/taskgraph.c: task graphs built once and run many times.
 * Owns: the nodes (one embedded task each, so a run allocates nothing), the edge list,
 * and the compiled form: successors as CSR arrays, the counters, the roots. Large arrays
 * come from the runtime's block cache (blocks.c), so a graph built after another one of its
 * size faults in no fresh pages.
 * Counters: 'cnt[i]' holds node i's pending count and its number of predecessors, 8 bytes
 * a node, apart from the nodes: releasing a successor touches this compact array only, not
 * the successor's 64-byte task line (in a DAG run those lines are in random order, and each
 * first touch was a miss to memory: 170 ns of each node's 250 ns of overhead on 1 worker).
 * Invariant: between runs, cnt[i].pending == cnt[i].npred: the counter is reset to its
 * initial value by the worker that sees it reach zero, which is after its last decrement of
 * this run and before the run ends. A node with one predecessor never uses its counter: it
 * is ready when that predecessor ends.
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
 *   called for it. Each adds one to the node's 'gn.later'; the one that sees 1 (the second)
 *   finishes the node with the completion's result ('later_rc[i]') and resets 'gn.later' to
 *   0, so the invariant on the counters holds for 'gn.later' too. The first one touches
 *   nothing of the node afterwards: the graph may be finished and waited for by then.
 * Not here: how tasks are scheduled (worker.c). */
#include "internal.h"
#include "probes.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Nodes live in chunks that never move, so adding nodes copies nothing: chunk k holds
 * CHUNK << k nodes. Large blocks come from the runtime's cache and ask for transparent huge
 * pages (blocks.c): on these VMs a 4 KiB page fault costs ~2.5 us. */
#define CHUNK_LOG 12
#define CHUNK     (1 << CHUNK_LOG)

struct wf_taskgraph {
    wf_runtime *rt;
    wf__blocks *mem;   /* the runtime's block cache (a reference of its own) */
    wf__task **chunks; /* one task per node; fn, arg and name live there */
    int n, nchunks, capchunks;
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
    bool compiled;     /* succ_off holds CSR offsets; otherwise it holds out-degrees */
    size_t succ_bytes, later_bytes, cnt_bytes;

    struct gcnt {
        _Atomic int32_t pending;
        int32_t npred;
    } * cnt; /* per node: see the file's header */

    _Atomic int32_t *later_rc; /* per node: the result given to wf_taskgraph_complete() */
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
    /* a run */
    _Atomic int running;
    _Atomic int64_t remaining;
    wf__group *grp;
    wf_group own;
    char errmsg[WF_ERRMSG_MAX];
};

static int gerr(wf_taskgraph *g, int code, const char *fmt, ...) WF_PRINTF(3, 4);

static inline wf__task *node(const wf_taskgraph *g, int i)
{
    unsigned q = ((unsigned)i >> CHUNK_LOG) + 1;
    int k = 31 - __builtin_clz(q);
    return &g->chunks[k][(unsigned)i - (((1u << k) - 1) << CHUNK_LOG)];
}

static int gerr(wf_taskgraph *g, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g->errmsg, sizeof g->errmsg, fmt, ap);
    va_end(ap);
    return wf__err(code, "%s", g->errmsg);
}

int wf_taskgraph_create(wf_runtime *rt, wf_taskgraph **out)
{
    if (!out)
        return wf__err(WF_EINVAL, "wf_taskgraph_create: out is NULL");
    *out = NULL;
    if (!rt)
        return wf__err(WF_EINVAL, "wf_taskgraph_create: rt is NULL");
    wf_taskgraph *g = calloc(1, sizeof *g);
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
    wf__blocks_put(g->mem, g->cnt, g->cnt_bytes);
    g->cnt = NULL;
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
}

static size_t chunk_bytes(int k)
{
    return ((size_t)CHUNK << k) * sizeof(wf__task);
}

void wf_taskgraph_destroy(wf_taskgraph *g)
{
    if (!g)
        return;
    free_compiled(g);
    for (int c = 0; c < g->nchunks; c++)
        wf__blocks_put(g->mem, g->chunks[c], chunk_bytes(c));
    free(g->chunks);
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

static inline int succ_end(const wf_taskgraph *g, int i)
{
    return node(g, i)->gn.end;
}

/* Turns CSR offsets back into out-degrees before the graph changes (ascending, so node
 * i + 1 still holds its offset when node i is converted). */
static void decompile(wf_taskgraph *g)
{
    if (!g->compiled)
        return;
    for (int i = 0; i < g->n; i++)
        node(g, i)->succ_off = succ_end(g, i) - node(g, i)->succ_off;
    g->compiled = false;
}

/* Makes room for 'more' nodes (chunks that never move, so earlier nodes stay put); 'what'
 * names the caller in the message. */
static int reserve_nodes(wf_taskgraph *g, int64_t more, const char *what)
{
    if ((int64_t)g->n + more > (1 << 30))
        return gerr(g, WF_ENOMEM, "%s: more than 2^30 nodes", what);
    while ((int64_t)g->n + more > ((int64_t)(1 << g->nchunks) - 1) << CHUNK_LOG) {
        if (g->nchunks == g->capchunks) {
            int cap = g->capchunks ? g->capchunks * 2 : 8;
            wf__task **c = realloc(g->chunks, (size_t)cap * sizeof *c);
            if (!c)
                return gerr(g, WF_ENOMEM, "%s: no memory", what);
            g->chunks = c;
            g->capchunks = cap;
        }
        wf__task *c = wf__blocks_get(g->mem, chunk_bytes(g->nchunks));
        if (!c)
            return gerr(g, WF_ENOMEM, "%s: no memory for node %d", what, g->n);
        g->chunks[g->nchunks++] = c;
    }
    return 0;
}

/* Writes node 'id' (room reserved) without predecessors or successors. */
static inline wf__task *init_node(wf_taskgraph *g, int id, wf_task_fn fn, void *arg,
                                  const char *name)
{
    wf__task *t = node(g, id);
    t->npred = 0;
    t->succ_off = 0;
    t->next = NULL;
    atomic_init(&t->gn.later, 0);
    t->gn.end = 0;
    t->kind = WF__TK_GRAPH;
    t->owner = g;
    t->node = (uint32_t)id;
    t->name = name;
    t->u.f.fn = fn;
    t->u.f.arg = arg;
    atomic_init(&t->cancel, 0);
    return t;
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
    decompile(g);
    init_node(g, g->n, fn, arg, name);
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
        const wf__task *t = node(g, i);
        int deg = g->compiled ? t->gn.end - t->succ_off : t->succ_off;
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

/* Adds the edge before -> after (valid ids, room reserved, the graph decompiled). */
static inline void add_edge(wf_taskgraph *g, int before, wf__task *a, int after)
{
    node(g, before)->succ_off++;
    if (a->npred++ == 0)
        g->nroots--;
    g->nback += before > after;
    if (g->nedges && before < g->esrc[g->nedges - 1])
        g->by_src = false;
    g->esrc[g->nedges] = before;
    g->edst[g->nedges] = after;
    g->nedges++;
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
                    before, node(g, before)->name ? node(g, before)->name : "(unnamed)");
    if (atomic_load_explicit(&g->running, memory_order_acquire))
        return gerr(g, WF_EBUSY, "wf_taskgraph_precede: the graph is running");
    int rc = reserve_edges(g, 1, "wf_taskgraph_precede");
    if (rc < 0)
        return rc;
    decompile(g);
    add_edge(g, before, node(g, after), after);
    g->dirty = true;
    return 0;
}

int wf_taskgraph_add_after(wf_taskgraph *g, wf_task_fn fn, void *arg, const char *name,
                           const int *preds, int npred)
{
    if (!g)
        return wf__err(WF_EINVAL, "wf_taskgraph_add_after: g is NULL");
    if (npred < 0 || (npred > 0 && !preds))
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
    wf__task *a = node(g, id);
    for (int k = 0; k < npred; k++)
        add_edge(g, preds[k], a, id);
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
 * outside what the caller described. Returns 0 or the error. */
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
    return 0;
}

static inline void *node_arg(void *args, size_t stride, int j)
{
    return stride ? (char *)args + (size_t)j * stride : args;
}

/* add_nodes on an empty, untraced graph: the compiled form written at once, as compile()
 * would leave it, in three passes (check and count out-degrees; nodes, offsets, counters
 * and roots; scatter the successors), with 'edst' as the successor array and 'esrc' left
 * to write_esrc(). The nodes are reserved; nothing is kept on an error. */
static int add_nodes_fresh(wf_taskgraph *g, wf_task_fn fn, void *args, size_t stride,
                           const char *name, int n, const int64_t *pred_off, const int *preds)
{
    int64_t m = pred_off ? pred_off[n] - pred_off[0] : 0;
    size_t nb = (size_t)(n ? n : 1);
    struct gcnt *cnt = wf__blocks_get(g->mem, nb * sizeof *cnt);
    _Atomic int32_t *later = wf__blocks_get(g->mem, nb * sizeof *later);
    int *cur = wf__blocks_get(g->mem, nb * sizeof *cur);
    int *succ = wf__blocks_get(g->mem, (size_t)(m ? m : 1) * sizeof *succ);
    int *roots = NULL, nroots = 0, rc = 0;
    if (!cnt || !later || !cur || !succ) {
        rc = gerr(g, WF_ENOMEM, "wf_taskgraph_add_nodes: no memory for %d nodes", n);
        goto out;
    }
    memset(cur, 0, (size_t)n * sizeof *cur);
    for (int j = 0; j < n; j++) {
        int64_t lo = pred_off ? pred_off[j] : 0, hi = pred_off ? pred_off[j + 1] : 0;
        if (pred_off && (rc = check_row(g, j, pred_off, j, n)) < 0)
            goto out;
        nroots += hi == lo;
        for (int64_t k = lo; k < hi; k++) {
            int p = preds[k];
            if (p < 0 || p >= j) {
                rc = bad_pred(g, j, k, p, name);
                goto out;
            }
            cur[p]++;
        }
    }
    roots = malloc((size_t)(nroots ? nroots : 1) * sizeof *roots);
    if (!roots) {
        rc = gerr(g, WF_ENOMEM, "wf_taskgraph_add_nodes: no memory for %d roots", nroots);
        goto out;
    }
    int sum = 0, r = 0;
    for (int j = 0; j < n; j++) {
        wf__task *t = init_node(g, j, fn, node_arg(args, stride, j), name);
        int np = pred_off ? (int)(pred_off[j + 1] - pred_off[j]) : 0;
        t->npred = np;
        t->succ_off = sum;
        sum += cur[j];
        cur[j] = t->succ_off;
        t->gn.end = sum;
        atomic_init(&cnt[j].pending, np);
        cnt[j].npred = np;
        if (!np)
            roots[r++] = j;
    }
    for (int j = 0; j < n && m; j++)
        for (int64_t k = pred_off[j]; k < pred_off[j + 1]; k++)
            succ[cur[preds[k]]++] = j;
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
    g->cnt = cnt;
    g->later_rc = later;
    g->succ = succ;
    g->roots = roots;
    g->cnt_bytes = nb * sizeof *cnt;
    g->later_bytes = nb * sizeof *later;
    g->succ_bytes = (size_t)(m ? m : 1) * sizeof *succ;
    g->compiled = true;
    g->dirty = false;
    cnt = NULL;
    later = NULL;
    succ = NULL;
    roots = NULL;
out:
    wf__blocks_put(g->mem, cnt, nb * sizeof *cnt);
    wf__blocks_put(g->mem, (void *)later, nb * sizeof *later);
    wf__blocks_put(g->mem, cur, nb * sizeof *cur);
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
    decompile(g);
    for (int j = 0; j < n; j++) {
        wf__task *t = init_node(g, first + j, fn, node_arg(args, arg_stride, j), name);
        g->nroots++;
        for (int64_t k = pred_off ? pred_off[j] : 0; pred_off && k < pred_off[j + 1]; k++)
            add_edge(g, preds[k], t, first + j);
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
    const char *name = node(g, v)->name;
    return gerr(g, WF_EINVAL, "wf_taskgraph: the graph has a cycle through node %d ('%s')", v,
                name ? name : "(unnamed)");
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
        for (int k = node(g, v)->succ_off; k < succ_end(g, v); k++)
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
        g->pred_off[i + 1] = g->pred_off[i] + node(g, i)->npred;
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

/* One pass over the nodes (offsets, roots) and, unless the edges came in order of their
 * source, one over the edges (a counting sort by source): the in- and out-degrees were
 * counted as edges were added. */
static int compile(wf_taskgraph *g)
{
    free_compiled(g);
    int n = g->n;
    size_t m = (size_t)g->nedges, cur_bytes = (size_t)(n ? n : 1) * sizeof(int);
    g->succ_bytes = (m ? m : 1) * sizeof *g->succ;
    g->later_bytes = (size_t)(n ? n : 1) * sizeof *g->later_rc;
    g->cnt_bytes = (size_t)(n ? n : 1) * sizeof *g->cnt;
    g->cnt = wf__blocks_get(g->mem, g->cnt_bytes);
    g->succ = g->by_src && m ? g->edst : wf__blocks_get(g->mem, g->succ_bytes);
    g->roots = malloc((size_t)(g->nroots ? g->nroots : 1) * sizeof *g->roots);
    g->later_rc = wf__blocks_get(g->mem, g->later_bytes); /* written before it is read */
    int *cur = g->succ == g->edst ? NULL : wf__blocks_get(g->mem, cur_bytes);
    if (!g->succ || !g->roots || !g->later_rc || !g->cnt || (g->succ != g->edst && !cur) ||
        (g->rt->trace_cap && compile_trace(g) < 0)) {
        wf__blocks_put(g->mem, cur, cur_bytes);
        free_compiled(g);
        return gerr(g, WF_ENOMEM, "wf_taskgraph: no memory to compile %d nodes", n);
    }
    int sum = 0, nroots = 0;
    for (int i = 0; i < n; i++) {
        wf__task *t = node(g, i);
        int outdeg = t->succ_off;
        t->succ_off = sum;
        if (cur)
            cur[i] = sum;
        sum += outdeg;
        t->gn.end = sum;
        atomic_init(&g->cnt[i].pending, t->npred);
        g->cnt[i].npred = t->npred;
        if (!t->npred)
            g->roots[nroots++] = i;
    }
    WF_ASSERT(nroots == g->nroots && (size_t)sum == m);
    if (cur)
        for (size_t e = 0; e < m; e++)
            g->succ[cur[g->esrc[e]]++] = g->edst[e];
    wf__blocks_put(g->mem, cur, cur_bytes);
    /* From here until the next change, succ_off holds offsets, not out-degrees. */
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
    g->grp = x;
    g->runs++; /* read by the nodes of this run: pushing them publishes it */
    atomic_store_explicit(&g->remaining, g->n, memory_order_relaxed);
    if (wf__group_add(x, (uint32_t)g->n) < 0) {
        atomic_store_explicit(&g->running, 0, memory_order_release);
        return gerr(g, WF_ENOMEM, "wf_taskgraph_submit: %s", wf_last_errmsg());
    }
    wf__worker *w = wf__worker_of(g->rt);
    for (int i = 0; i < g->nroots; i++) {
        wf__task *t = node(g, g->roots[i]);
        if (w)
            wf__push_local(w, t);
        else
            wf__submit_outside(g->rt, t);
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

/* Counts one predecessor of successor 's' of 't' done ('skip': canceled); returns its task
 * when that was the last, else NULL. */
static wf__task *release_one(wf_taskgraph *g, const wf__task *t, int s, bool skip)
{
    wf__task *st = node(g, s); /* its address only: the line is read when it runs */
    if (WF_UNLIKELY(skip))
        atomic_store_explicit(&st->cancel, 1, memory_order_relaxed);
    /* A single predecessor needs no counter: 't' ending makes 's' ready. */
    struct gcnt *cnt = g->cnt;
    int32_t np = cnt[s].npred;
    if (np != 1 && atomic_fetch_sub_explicit(&cnt[s].pending, 1, memory_order_acq_rel) != 1)
        return NULL;
    if (np != 1)
        atomic_store_explicit(&cnt[s].pending, np, memory_order_relaxed);
    __builtin_prefetch(st); /* it runs soon, here or on a thief */
    if (g->ready_by)        /* traced: 's' is ours now, and every predecessor's 'work' seen */
        trace_ready(g, s, (int32_t)t->node);
    return st;
}

/* Releases the successors of node 't' ('skip': it failed or was skipped, so they are
 * canceled): the first that becomes ready is returned for the caller to run, the others
 * are pushed on 'w' (or submitted from outside when 'w' is NULL, which returns none). */
static wf__task *release_successors(wf_taskgraph *g, wf__worker *w, const wf__task *t, bool skip)
{
    const int *succ = g->succ;
    wf__task *keep = NULL, *st;
    if (!w) { /* a completion from outside: every ready successor is submitted, in list order */
        for (int k = t->succ_off, end = t->gn.end; k < end; k++)
            if ((st = release_one(g, t, succ[k], skip)))
                wf__submit_outside(g->rt, st);
        return NULL;
    }
    /* From the last successor to the first: a ready one found before the kept one is pushed,
     * so the caller runs the list's first ready successor itself and its own LIFO pops take
     * the rest in the list's order (exec.c sorts successors by priority), while thieves take
     * the oldest push, the list's last. Pushed in list order, the owner ran them last first:
     * a bucket's last gradient (a tiny bias sum, boosted before its reduction) ran only after
     * the whole rest of backward, and dp_bench's first bucket started as backward ended. */
    for (int k = t->gn.end - 1; k >= t->succ_off; k--)
        if ((st = release_one(g, t, succ[k], skip))) {
            if (keep)
                wf__push_local(w, keep);
            keep = st;
        }
    return keep;
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
    wf__task *t = node(g, i);
    atomic_store_explicit(&g->later_rc[i], rc, memory_order_relaxed);
    if (atomic_fetch_add_explicit(&t->gn.later, 1, memory_order_acq_rel) == 0)
        return 0; /* the function has not returned yet: its worker finishes the node */
    atomic_store_explicit(&t->gn.later, 0, memory_order_relaxed);
    wf__group *grp = g->grp;
    wf__worker *w = wf__worker_of(g->rt);
    bool skip = rc < 0;
    if (skip) /* no worker's message: wf_task_fail() was not called by this thread's task */
        wf__group_fail(grp, NULL, t->name, rc);
    wf__task *keep = release_successors(g, w, t, skip);
    if (keep)
        wf__push_local(w, keep);
    if (atomic_fetch_sub_explicit(&g->remaining, 1, memory_order_acq_rel) == 1)
        atomic_store_explicit(&g->running, 0, memory_order_release);
    wf__group_done(grp, 1);
    return 0;
}

void wf__graph_run_node(wf__worker *w, wf__task *t)
{
    wf_taskgraph *g = t->owner;
    wf__group *grp = g->grp;
    wf_runtime *rt = w->rt;
    uint32_t ndone = 0;
    for (;;) {
        int i = (int)t->node;
        bool skip = atomic_load_explicit(&t->cancel, memory_order_relaxed) ||
                    atomic_load_explicit(&grp->err, memory_order_relaxed);
        if (WF_UNLIKELY(atomic_load_explicit(&t->cancel, memory_order_relaxed)))
            atomic_store_explicit(&t->cancel, 0, memory_order_relaxed);
        uint64_t t0 = w->ring ? wf__now_ns() : 0;
        int rc = 0;
        WF_PROBE2(task_begin, w->index, t->name);
        if (WF_LIKELY(!skip)) {
            w->fail_set = 0;
            w->current = t;
            rc = t->u.f.fn(t->u.f.arg);
            if (WF_UNLIKELY(rc < 0)) {
                wf__group_fail(grp, w, t->name, rc);
                skip = true;
            }
        }
        WF_PROBE3(task_end, w->index, t->name, rc);
        if (w->ring) {
            uint64_t t1 = wf__now_ns();
            if (g->work) /* published to the successors by release_successors() */
                g->work[i] = g->work_in[i] + (t1 - t0);
            wf__tctx c;
            wf__graph_trace_ctx(t, &c);
            wf__trace_event(w, WF__EV_TASK, t0 - rt->t_start, t1 - rt->t_start, t->name,
                            (uint32_t)rc, &c);
        }
        WF__INC(w, tasks_run, 1);
        if (WF_UNLIKELY(rc == WF_TASK_LATER)) {
            if (atomic_fetch_add_explicit(&t->gn.later, 1, memory_order_acq_rel) == 0)
                break; /* wf_taskgraph_complete() finishes it; 't' is not ours any more */
            atomic_store_explicit(&t->gn.later, 0, memory_order_relaxed);
            rc = atomic_load_explicit(&g->later_rc[i], memory_order_relaxed);
            if (rc < 0) {
                wf__group_fail(grp, NULL, t->name, rc);
                skip = true;
            }
        }
        wf__task *keep = release_successors(g, w, t, skip);
        ndone++;
        if (!keep)
            break;
        t = keep;
    }
    if (!ndone)
        return; /* only a node that finishes later: the graph may be gone already */
    if (atomic_fetch_sub_explicit(&g->remaining, ndone, memory_order_acq_rel) == ndone)
        atomic_store_explicit(&g->running, 0, memory_order_release);
    wf__group_done(grp, ndone);
}
