/* core/graph.c: graphs and nodes: storage, names, source locations, first errors, and the
 * inputs core defines (placeholders, constants, scalars, variables).
 * Owns: the node chunks, the arena, the name table and the interned file names of each graph
 *   (layout and invariants in core/internal.h), the thread-local stack of pending source
 *   locations behind wf_set_source_location(), and the per-thread cache of freed node
 *   chunks, arena blocks and value blocks (why and its invariants: core/internal.h).
 * Why the thread-local: the op macros of the public headers record __FILE__/__LINE__ in the
 *   calling thread just before the constructor runs; a graph argument is not available to
 *   the macro in a form it could write to without evaluating it twice. Each entry is
 *   consumed by the node its constructor makes, so nothing carries over between graphs or
 *   runtimes (the one exception to docs/conventions.md, "State", besides the error slot).
 * Sizes: a node is sizeof(wf_node) (232 bytes) in a 1024-node chunk, its name in the arena
 *   and two 16-byte name-table slots: ~280 bytes. Nothing else is allocated per node except
 *   inputs beyond WF_NODE_INLINE_INPUTS; equal attribute bags are shared. Measured (2 vCPUs,
 *   1,000,000 placeholders and constants): 0.8 us per node built, page faults included, 0.3 us
 *   per wf_graph_find, 281 MB peak. A destroyed graph's chunks and full arena blocks go to the
 *   thread's cache for the next graph (core/internal.h).
 * Not here: op defs and inference of the built-in ops (op.c), initializers (init.c),
 *   kernels (ops/), sessions (runtime/). */
#include "internal.h"
#include "tensor.h"

#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const wf_attrs no_attrs; /* shared by nodes without attributes (all zero) */

/* Pending locations form a stack, because constructor macros nest:
 * 'wf_add(g, wf_matmul(g, x, w), b)' records add's line, then (evaluating the arguments)
 * matmul's, and matmul's node is made first. Each node takes the innermost one, so both get
 * theirs. 'depth' may exceed PENDING_MAX (absurd nesting): the deepest calls then get none. */
#define PENDING_MAX 16

static _Thread_local struct {
    int depth;
    wf_srcloc at[PENDING_MAX];
} pending __attribute__((tls_model("initial-exec")));

void wf_set_source_location(const char *file, int line)
{
    if (pending.depth < PENDING_MAX)
        pending.at[pending.depth] = (wf_srcloc){ file, file ? line : 0 };
    if (pending.depth < INT_MAX)
        pending.depth++;
}

wf_srcloc wf__srcloc_take(void)
{
    wf_srcloc l = { NULL, 0 };
    if (pending.depth > 0 && --pending.depth < PENDING_MAX)
        l = pending.at[pending.depth];
    return l;
}

/* ---- The per-thread cache of freed graph memory (core/internal.h) ------------------------ */

#if defined(__SANITIZE_ADDRESS__)
#    define CACHE_ON 0
#elif defined(__has_feature)
#    if __has_feature(address_sanitizer)
#        define CACHE_ON 0
#    endif
#endif
#ifndef CACHE_ON
#    define CACHE_ON 1
#endif

enum { CACHE_FRESH, CACHE_LIVE, CACHE_GONE }; /* no exit hook yet; hooked; the thread exits */

typedef struct thread_cache {
    wf__cache_item *head[WF__CACHE_LISTS];
    int count[WF__CACHE_LISTS];
    int low[WF__CACHE_LISTS];     /* the least 'count' since the last wf__cache_tick() */
    size_t size[WF__CACHE_LISTS]; /* of an item (0 while the list has had none) */
    size_t bytes;
    int state;
} thread_cache;

/* initial-exec: a general-dynamic access calls __tls_get_addr (~1% of an eager add). */
static _Thread_local thread_cache tcache __attribute__((tls_model("initial-exec")));

/* Process-wide (docs/conventions.md, "State", allows such items with a reason): the
 * pthread key whose destructor empties a thread's cache when the thread exits. Made once,
 * never deleted: a library cannot know when the last thread that may hold a cache is gone. */
static pthread_key_t cache_key;
static pthread_once_t cache_once = PTHREAD_ONCE_INIT;
static bool cache_key_made;

/* Frees the first 'n' items of list 'l'. */
static void cache_free(thread_cache *c, int l, int n)
{
    for (; n > 0; n--) {
        wf__cache_item *it = c->head[l];
        c->head[l] = it->next;
        c->count[l]--;
        c->bytes -= c->size[l];
        free(it);
    }
    if (c->low[l] > c->count[l])
        c->low[l] = c->count[l];
}

static void cache_empty(thread_cache *c)
{
    for (int l = 0; l < WF__CACHE_LISTS; l++)
        cache_free(c, l, c->count[l]);
}

/* The key's destructor: empties the exiting thread's cache and keeps it off, so that what
 * later destructors (of other libraries) release is freed, not cached and leaked. */
static void cache_exit(void *arg)
{
    thread_cache *c = arg;
    cache_empty(c);
    c->state = CACHE_GONE;
}

static void cache_make_key(void)
{
    cache_key_made = pthread_key_create(&cache_key, cache_exit) == 0;
}

/* When the library is unloaded (dlclose(), or the end of the process), the key goes, so that
 * no thread exiting later calls 'cache_exit' at an unmapped address; what other threads still
 * cache then stays allocated (at the end of a process, nothing is lost). */
__attribute__((destructor)) static void cache_unload(void)
{
    if (cache_key_made)
        pthread_key_delete(cache_key);
}

/* Hooks this thread's cache to the thread's exit; false: it stays off. */
static bool cache_hook(thread_cache *c)
{
    if (c->state == CACHE_GONE || pthread_once(&cache_once, cache_make_key) != 0 ||
        !cache_key_made || pthread_setspecific(cache_key, c) != 0) {
        c->state = CACHE_GONE;
        return false;
    }
    c->state = CACHE_LIVE;
    return true;
}

bool wf__cache_enabled(void)
{
    return CACHE_ON;
}

void *wf__cache_take(int list, size_t bytes)
{
    thread_cache *c = &tcache;
    wf__cache_item *it = c->head[list];
    if (!it)
        return NULL;
    c->head[list] = it->next;
    if (--c->count[list] < c->low[list])
        c->low[list] = c->count[list];
    c->bytes -= bytes;
    return it;
}

void wf__cache_put(int list, void *p, size_t bytes)
{
    thread_cache *c = &tcache;
    if (!CACHE_ON || !p || c->bytes + bytes > WF__CACHE_MAX ||
        (c->state != CACHE_LIVE && !cache_hook(c))) {
        free(p);
        return;
    }
    wf__cache_item *it = p;
    it->next = c->head[list];
    c->head[list] = it;
    c->count[list]++;
    c->size[list] = bytes;
    c->bytes += bytes;
}

void wf__cache_tick(void)
{
    thread_cache *c = &tcache;
    for (int l = 0; l < WF__CACHE_LISTS; l++)
        cache_free(c, l, c->low[l]);
}

void wf__cache_mark(void)
{
    thread_cache *c = &tcache;
    for (int l = 0; l < WF__CACHE_LISTS; l++)
        c->low[l] = c->count[l];
}

wf__cache_stats wf__cache_get_stats(void)
{
    wf__cache_stats s = { .bytes = tcache.bytes };
    for (int l = 0; l < WF__CACHE_LISTS; l++)
        s.count[l] = tcache.count[l];
    return s;
}

void wf__cache_trim(void)
{
    cache_empty(&tcache);
}

/* ---- The arena --------------------------------------------------------------------------- */

#define ARENA_BLOCK (64 * 1024)

/* 'bytes' of uninitialised arena memory (16-byte aligned), or NULL. */
static void *arena_take(wf_graph *g, size_t bytes)
{
    size_t need = (bytes + 15) & ~(size_t)15;
    if (need < bytes)
        return NULL;
    wf__arena_block *b = g->arena;
    if (!b || b->cap - b->used < need) {
        size_t cap = need > ARENA_BLOCK / 4 ? need : ARENA_BLOCK;
        if (cap > SIZE_MAX - sizeof *b)
            return NULL;
        wf__arena_block *nb = NULL;
        if (cap == ARENA_BLOCK)
            nb = wf__cache_take(WF__CACHE_ARENA, sizeof *nb + ARENA_BLOCK);
        if (!nb && !(nb = malloc(sizeof *nb + cap)))
            return NULL;
        nb->used = 0;
        nb->cap = cap;
        if (b && cap != ARENA_BLOCK) {
            /* A big one-off allocation: keep the current block as the bump target. */
            nb->next = b->next;
            b->next = nb;
        } else {
            nb->next = b;
            g->arena = nb;
        }
        b = nb;
    }
    void *p = b->data + b->used;
    b->used += need;
    return p;
}

void *wf__graph_alloc(wf_graph *g, size_t bytes)
{
    void *p = g ? arena_take(g, bytes) : NULL;
    if (p)
        memset(p, 0, bytes);
    return p;
}

static char *arena_strdup(wf_graph *g, const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = arena_take(g, n);
    if (p)
        memcpy(p, s, n);
    return p;
}

/* ---- Errors ------------------------------------------------------------------------------ */

static const char *base_name(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

const char *wf__node_where(const wf_node *n, char *buf, size_t size)
{
    if (!buf || !size)
        return buf;
    if (!n || !n->file)
        snprintf(buf, size, "?");
    else
        snprintf(buf, size, "%s:%d", base_name(n->file), n->line);
    return buf;
}

int wf__node_prefix(const wf_node *n, char *buf, size_t size)
{
    char where[256];
    if (n && n->file)
        return snprintf(buf, size, "%s '%s' (%s): ", n->op ? n->op->name : "?",
                        n->name ? n->name : "?", wf__node_where(n, where, sizeof where));
    return snprintf(buf, size, "%s '%s': ", n && n->op ? n->op->name : "?",
                    n && n->name ? n->name : "?");
}

/* Records 'msg' as g's error if it has none, and as this thread's message. */
static int set_error(wf_graph *g, int code, const char *msg)
{
    wf__err(code, "%s", msg);
    if (g && g->status == 0) {
        g->status = code;
        snprintf(g->errmsg, sizeof g->errmsg, "%s", msg);
    }
    return code;
}

/* wf__graph_fail() without consuming a pending location: core's own constructors take
 * theirs first, and calls that are not constructors must not take anyone's. */
static int graph_fail(wf_graph *g, int code, const char *fmt, ...) WF_PRINTF(3, 4);

static int graph_fail(wf_graph *g, int code, const char *fmt, ...)
{
    char msg[WF_ERRMSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return set_error(g, code, msg);
}

int wf__graph_fail(wf_graph *g, int code, const char *fmt, ...)
{
    char msg[WF_ERRMSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    wf__srcloc_take();
    return set_error(g, code, msg);
}

static int vnode_fail(wf_node *n, int code, const char *fmt, va_list ap)
{
    char msg[WF_ERRMSG_MAX];
    int k = n ? wf__node_prefix(n, msg, sizeof msg) : 0;
    if (k < 0)
        k = 0;
    if ((size_t)k < sizeof msg)
        vsnprintf(msg + k, sizeof msg - (size_t)k, fmt, ap);
    return set_error(n ? n->graph : NULL, code, msg);
}

int wf__node_fail(wf_node *n, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vnode_fail(n, code, fmt, ap);
    va_end(ap);
    wf__srcloc_take();
    return code;
}

static int node_fail(wf_node *n, int code, const char *fmt, ...) WF_PRINTF(3, 4);

static int node_fail(wf_node *n, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vnode_fail(n, code, fmt, ap);
    va_end(ap);
    return code;
}

/* ---- Graphs ------------------------------------------------------------------------------ */

wf_graph *wf_graph_create(wf_runtime *rt, int mode)
{
    if (!rt) {
        wf__err(WF_EINVAL, "wf_graph_create: rt is NULL");
        return NULL;
    }
    if (mode != WF_STATIC && mode != WF_EAGER) {
        wf__err(WF_EINVAL, "wf_graph_create: mode %d is neither WF_STATIC (0) nor WF_EAGER (1)",
                mode);
        return NULL;
    }
    wf_graph *g = calloc(1, sizeof *g);
    if (!g) {
        wf__err(WF_ENOMEM, "wf_graph_create: no memory");
        return NULL;
    }
    g->rt = rt;
    g->mode = mode;
    return g;
}

#define CHUNK_BYTES (WF__CHUNK_NODES * sizeof(wf_node))

static wf_node *node_at(const wf_graph *g, int i)
{
    return &g->chunks[i >> WF__CHUNK_SHIFT][i & WF__CHUNK_MASK];
}

void wf_graph_destroy(wf_graph *g)
{
    if (!g)
        return;
    wf__cache_tick(); /* what the graphs since the last destroy did not need goes back */
    for (int i = 0; i < g->n_nodes; i++)
        wf_tensor_release(node_at(g, i)->value);
    for (int i = 0; i < g->n_chunks; i++)
        wf__cache_put(WF__CACHE_CHUNK, g->chunks[i], CHUNK_BYTES);
    free(g->chunks);
    free(g->slots);
    for (wf__arena_block *b = g->arena, *next; b; b = next) {
        next = b->next;
        if (b->cap == ARENA_BLOCK)
            wf__cache_put(WF__CACHE_ARENA, b, sizeof *b + ARENA_BLOCK);
        else
            free(b);
    }
    free(g);
    wf__cache_mark();
}

int wf_graph_status(const wf_graph *g)
{
    return g ? g->status : WF_EINVAL;
}

const char *wf_graph_errmsg(const wf_graph *g)
{
    return g ? g->errmsg : "wf_graph_errmsg: graph is NULL";
}

void wf_graph_clear_error(wf_graph *g)
{
    if (g) {
        g->status = 0;
        g->errmsg[0] = '\0';
    }
}

int wf_graph_mode(const wf_graph *g)
{
    return g ? g->mode : WF_EINVAL;
}

int wf_graph_node_count(const wf_graph *g)
{
    return g ? g->n_nodes : 0;
}

wf_runtime *wf_graph_runtime(const wf_graph *g)
{
    return g ? g->rt : NULL;
}

wf_node *wf_graph_node(const wf_graph *g, int i)
{
    return g && i >= 0 && i < g->n_nodes ? node_at(g, i) : NULL;
}

void wf__graph_set_eager(wf_graph *g, wf_eager_fn fn, void *ctx)
{
    if (g) {
        g->eager_fn = fn;
        g->eager_ctx = ctx;
    }
}

/* ---- The name table ---------------------------------------------------------------------- */

/* Open addressing with linear probing; each slot keeps the name's hash beside the node, so a
 * probe that does not match never touches the node (at 100,000 nodes, a lookup costs about
 * one cache miss for the slot and one for the node). At most half the slots are used.
 * Only names given by the user are in the table (see core/internal.h): an automatic name
 * "<op>_<id>[_<k>]" is found through the id it contains (find_auto), so building a node
 * with an automatic name checks a table that is usually empty or small instead of taking a
 * cache miss in a big one (it was the largest cost of an eager 1-element add). */

static uint64_t hash_name(const char *s)
{
    uint64_t h = 0xcbf29ce484222325u; /* FNV-1a, then a multiply to spread the low bits */
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 0x100000001b3u;
    h ^= h >> 32;
    h *= 0x9e3779b97f4a7c15u;
    h ^= h >> 29;
    return h ? h : 1; /* 0 marks an automatic name (wf_node.name_hash) */
}

/* The node named 'name' (hash 'h') in the table, or NULL. */
static wf_node *find_named(const wf_graph *g, const char *name, uint64_t h)
{
    if (!g->n_named)
        return NULL;
    size_t mask = g->n_slots - 1;
    for (size_t i = h & mask; g->slots[i].node; i = (i + 1) & mask)
        if (g->slots[i].hash == h && strcmp(g->slots[i].node->name, name) == 0)
            return g->slots[i].node;
    return NULL;
}

/* Parses the decimal number that ends 'name[0, *len)' after a '_', as put_uint() writes it
 * (no sign, no leading zero); on success sets '*v' and moves '*len' to the '_'. */
static bool tail_number(const char *name, size_t *len, unsigned long *v)
{
    size_t e = *len, b = e;
    while (b > 0 && name[b - 1] >= '0' && name[b - 1] <= '9' && e - b < 10)
        b--;
    if (b == e || b < 1 || name[b - 1] != '_' || (name[b] == '0' && e - b > 1))
        return false;
    unsigned long x = 0;
    for (size_t i = b; i < e; i++)
        x = x * 10 + (unsigned long)(name[i] - '0');
    *v = x;
    *len = b - 1;
    return true;
}

/* The node with the automatic name 'name', or NULL: its id is the last number of the name
 * ("<op>_<id>") or the one before it ("<op>_<id>_<k>"). */
static wf_node *find_auto(const wf_graph *g, const char *name)
{
    size_t len = strlen(name);
    unsigned long id;
    for (int pass = 0; pass < 2 && tail_number(name, &len, &id); pass++) {
        if (id < (unsigned long)g->n_nodes) {
            wf_node *n = node_at(g, (int)id);
            if (n->name_hash == 0 && strcmp(n->name, name) == 0)
                return n;
        }
    }
    return NULL;
}

/* The node named 'name' (hash 'h', or 0 when the table is empty), or NULL. */
static wf_node *find(const wf_graph *g, const char *name, uint64_t h)
{
    wf_node *n = find_named(g, name, h);
    return n ? n : find_auto(g, name);
}

static void put(wf__name_slot *slots, size_t mask, uint64_t h, wf_node *n)
{
    size_t i = h & mask;
    while (slots[i].node)
        i = (i + 1) & mask;
    slots[i].hash = h;
    slots[i].node = n;
}

/* Makes room for one more name. Returns 0 or WF_ENOMEM. */
static int reserve_name(wf_graph *g)
{
    if ((g->n_named + 1) * 2 <= g->n_slots)
        return 0;
    size_t ns = g->n_slots ? g->n_slots * 2 : 512;
    wf__name_slot *slots = calloc(ns, sizeof *slots);
    if (!slots)
        return WF_ENOMEM;
    for (size_t i = 0; i < g->n_slots; i++)
        if (g->slots[i].node)
            put(slots, ns - 1, g->slots[i].hash, g->slots[i].node);
    free(g->slots);
    g->slots = slots;
    g->n_slots = ns;
    return 0;
}

static void insert_name(wf_graph *g, wf_node *n)
{
    put(g->slots, g->n_slots - 1, n->name_hash, n);
    g->n_named++;
}

/* Removes 'n' by backward-shift deletion, so that no tombstones are needed. */
static void remove_name(wf_graph *g, wf_node *n)
{
    size_t mask = g->n_slots - 1, i = n->name_hash & mask;
    while (g->slots[i].node != n)
        i = (i + 1) & mask;
    for (size_t j = (i + 1) & mask; g->slots[j].node; j = (j + 1) & mask) {
        size_t home = g->slots[j].hash & mask;
        /* Move slot j back to the hole at i unless its home lies cyclically in (i, j]. */
        bool stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
        if (!stays) {
            g->slots[i] = g->slots[j];
            i = j;
        }
    }
    g->slots[i].node = NULL;
    g->slots[i].hash = 0;
    g->n_named--;
}

wf_node *wf_graph_find(const wf_graph *g, const char *name)
{
    if (!g || !name)
        return NULL;
    return find(g, name, hash_name(name));
}

/* ---- Nodes ------------------------------------------------------------------------------- */

/* The slot for the next node, allocating a chunk if needed; NULL on no memory. */
static wf_node *next_slot(wf_graph *g)
{
    int i = g->n_nodes;
    int c = i >> WF__CHUNK_SHIFT;
    if (c >= g->n_chunks) {
        if (g->n_chunks == g->cap_chunks) {
            int cap = g->cap_chunks ? g->cap_chunks * 2 : 16;
            wf_node **p = realloc(g->chunks, (size_t)cap * sizeof *p);
            if (!p)
                return NULL;
            g->chunks = p;
            g->cap_chunks = cap;
        }
        wf_node *chunk = wf__cache_take(WF__CACHE_CHUNK, CHUNK_BYTES);
        if (!chunk && !(chunk = malloc(CHUNK_BYTES)))
            return NULL;
        g->chunks[g->n_chunks++] = chunk;
    }
    return node_at(g, i);
}

/* The arena's copy of 'file' (one per distinct file name per graph). */
static const char *intern_file(wf_graph *g, const char *file)
{
    if (!file)
        return NULL;
    for (wf__file_name *f = g->files; f; f = f->next)
        if (f->copy == file || strcmp(f->copy, file) == 0)
            return f->copy;
    wf__file_name *f = wf__graph_alloc(g, sizeof *f);
    char *copy = f ? arena_strdup(g, file) : NULL;
    if (!copy)
        return NULL;
    f->copy = copy;
    f->next = g->files;
    g->files = f;
    return copy;
}

/* Appends the decimal digits of 'v' (>= 0) at 'p'; returns the end. Hand-written: snprintf()
 * of "%s_%d" was the largest single cost of an eager 1-element add (its positional-argument
 * machinery alone took ~15% of the time). */
static char *put_uint(char *p, unsigned v)
{
    char tmp[16];
    int k = 0;
    do
        tmp[k++] = (char)('0' + v % 10);
    while ((v /= 10) != 0);
    while (k)
        *p++ = tmp[--k];
    return p;
}

/* A fresh automatic name "<op>_<id>", or "<op>_<id>_<k>" if a user took that one. While no
 * user has named a node ('n_named' 0: it never decreases), no check is needed: every name is
 * then automatic and ends in "_<its id>" (the digits after the last '_'), so two nodes'
 * names differ. */
static const char *auto_name(wf_graph *g, const char *op, int id)
{
    char buf[160];
    size_t len = strlen(op);
    if (len >= 100) {
        op = "node";
        len = 4;
    }
    memcpy(buf, op, len);
    buf[len] = '_';
    char *end = put_uint(buf + len + 1, (unsigned)id), *fin = end;
    *end = '\0';
    for (unsigned k = 1; g->n_named && find(g, buf, hash_name(buf)); k++) {
        fin = put_uint(end + 1, k);
        *end = '_';
        *fin = '\0';
    }
    size_t n = (size_t)(fin - buf) + 1;
    char *copy = arena_take(g, n);
    if (copy)
        memcpy(copy, buf, n);
    return copy;
}

/* The graph's copy of 'a': nodes with equal attributes share one copy (a direct-mapped cache
 * of recent copies, by a hash of the bytes), so 100,000 placeholders of a few shapes cost a
 * few copies instead of 44 MB. Returns NULL on no memory. */
static const wf_attrs *share_attrs(wf_graph *g, const wf_attrs *a)
{
    uint64_t h = 0;
    const unsigned char *p = (const unsigned char *)a;
    for (size_t i = 0; i + 8 <= sizeof *a; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        h = (h ^ w) * 0x9e3779b97f4a7c15u;
        h ^= h >> 31;
    }
    const wf_attrs **slot = &g->attrs_cache[h % WF__ATTRS_CACHE];
    if (*slot && memcmp(*slot, a, sizeof *a) == 0)
        return *slot;
    wf_attrs *copy = wf__graph_alloc(g, sizeof *copy);
    if (copy) {
        memcpy(copy, a, sizeof *copy);
        *slot = copy;
    }
    return copy;
}

static bool valid_dtype(wf_dtype dt)
{
    return dt != WF_DTYPE_INVALID && wf_dtype_size(dt) != 0;
}

/* The value of node 'n' of an eager graph. A variable's is made from its initializer when
 * first needed (an op reads it, wf_node_value()), not when the node is added: an eager
 * training loop adds its variables again every step and gives them the last step's values
 * (wf_variable_set), so an initializer run at the add was thrown away at once; it was a
 * quarter of the time of an eager MLP step (64-1024-1024-10, batch 256, Adam: glorot
 * weights and Adam's zeroed slots). The initializer is counter-based, so a late value equals
 * an early one. NULL: no value (WF_ENOMEM set when the initializer failed). Two threads
 * reading one graph's variable at once agree on one value (the loser releases its own). */
static wf_tensor *eager_value(wf_node *n)
{
    wf_tensor *v = __atomic_load_n(&n->value, __ATOMIC_ACQUIRE);
    if (v || n->op != &wf_op_variable || n->graph->mode != WF_EAGER)
        return v;
    wf_tensor *t;
    if (wf_init_tensor(n->attrs->init, n->dtype, n->shape, &t) < 0)
        return NULL;
    if (!__atomic_compare_exchange_n(&n->value, &v, t, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        wf_tensor_release(t);
        return v;
    }
    return t;
}

/* Eager outputs: fresh tensors. */
static wf_tensor *eager_alloc(void *arg, const wf_node *n, wf_dtype dt, const wf_shape *shape)
{
    (void)arg;
    (void)n;
    wf_tensor *t = wf__tensor_alloc_value(dt, *shape);
    if (!t)
        wf__err(WF_ENOMEM, "no memory for the output");
    return t;
}

/* A variable the op writes: its value, made exclusive first (a copy when someone else holds
 * it: a value already read stays as it was). */
static int eager_writable(void *arg, const wf_node *n, wf_tensor **in)
{
    (void)arg;
    int i = 0, rc = 0;
    for (; i < n->op->n_assign; i++) {
        wf_node *var = n->inputs[i];
        wf_tensor *w = NULL;
        if ((rc = wf__tensor_writable(var->value, 1, &w)) < 0)
            break;
        if (w != var->value) {
            wf_tensor_release(var->value);
            var->value = w;
        }
        in[i] = wf_tensor_retain(w);
    }
    if (rc < 0)
        while (i-- > 0)
            wf_tensor_release(in[i]);
    return rc;
}

static const wf__node_env eager_env = { .alloc = eager_alloc, .writable = eager_writable };

/* The default eager execution: the op's CPU kernel, here and now, into a fresh tensor of
 * the inferred dtype and shape (eager graphs have no -1 dimensions, except in the output of
 * WF_OP_DYNAMIC_SHAPE ops, whose kernels allocate; the node then takes the actual shape).
 * A failure's message is whole in 'msg' (wf__node_run()). */
static int eager_cpu(wf_graph *g, wf_node *n, char *msg, size_t msglen)
{
    wf_kernel_fn k = wf__kernels_find(NULL, n->op, WF_KERNEL_CPU);
    if (!k) {
        char desc[WF_ERRMSG_MAX];
        snprintf(msg, msglen, "%s: op '%s' has no CPU kernel to run it eagerly",
                 wf__node_desc(n, desc, sizeof desc), n->op->name);
        return WF_ENOSYS;
    }
    wf_tensor *stack[8]; /* in[i] is set before it is read */
    wf_tensor **in = stack;
    if (n->n_inputs > 8 && !(in = malloc((size_t)n->n_inputs * sizeof *in))) {
        char desc[WF_ERRMSG_MAX];
        snprintf(msg, msglen, "%s: no memory for %d inputs", wf__node_desc(n, desc, sizeof desc),
                 n->n_inputs);
        return WF_ENOMEM;
    }
    int rc = 0;
    for (int i = 0; i < n->n_inputs && rc == 0; i++)
        if (!(in[i] = eager_value(n->inputs[i]))) {
            char desc[WF_ERRMSG_MAX];
            bool var = n->inputs[i]->op == &wf_op_variable;
            snprintf(msg, msglen, "%s: input %d ('%s') has no value%s",
                     wf__node_desc(n, desc, sizeof desc), i, n->inputs[i]->name,
                     var ? ": no memory for its initial value" : "");
            rc = var ? WF_ENOMEM : WF_EINVAL;
        }
    wf_tensor *out = NULL;
    if (rc == 0) {
        wf_kernel_ctx ctx = { .rt = g->rt };
        rc = wf__node_run(&eager_env, NULL, k, &ctx, n, in, n->dtype, &n->shape, NULL, &out, msg,
                          msglen);
    }
    if (in != stack)
        free(in);
    if (rc < 0)
        return rc;
    n->shape = out->shape;
    n->value = out;
    return 0;
}

/* A source node of an eager graph: constants have their value, a variable gets its own when
 * first needed (eager_value). */
static int eager_source(wf_node *n)
{
    if (n->op == &wf_op_placeholder)
        return wf__err(WF_EINVAL, "eager graphs take constants, not placeholders");
    return 0;
}

/* Makes the values of the inputs of 'n' (the variables' that no op read yet) for an eager
 * hook, which reads them from the nodes. */
static int eager_inputs(wf_node *n)
{
    for (int i = 0; i < n->n_inputs; i++)
        if (!eager_value(n->inputs[i]) && n->inputs[i]->op == &wf_op_variable)
            return wf__err(WF_ENOMEM, "no memory for the initial value of input %d ('%s')", i,
                           n->inputs[i]->name);
    return 0;
}

/* The one place nodes are made. 'value' (may be NULL) is stolen, also on failure. */
static wf_node *add_node(wf_graph *g, const wf_op_def *op, const char *name, wf_node *const *inputs,
                         int n_inputs, const wf_attrs *attrs, wf_srcloc loc, wf_tensor *value)
{
    if (!g) {
        wf__err(WF_EINVAL, "%s: graph is NULL", op && op->name ? op->name : "wf__node_add");
        wf_tensor_release(value);
        return NULL;
    }
    if (!op || !op->name || !op->infer) {
        graph_fail(g, WF_EINVAL, "wf__node_add: op is NULL or has no name or no infer");
        wf_tensor_release(value);
        return NULL;
    }
    /* A NULL input is usually the result of an earlier failed constructor: keep its error. */
    if (n_inputs > 0 && inputs && g->status < 0)
        for (int i = 0; i < n_inputs; i++)
            if (!inputs[i]) {
                wf_tensor_release(value);
                return NULL;
            }
    if (g->n_nodes == INT_MAX) {
        graph_fail(g, WF_ENOMEM, "%s: the graph already has %d nodes", op->name, INT_MAX);
        wf_tensor_release(value);
        return NULL;
    }
    wf_node *n = next_slot(g);
    if (!n || (name && reserve_name(g) < 0)) {
        graph_fail(g, WF_ENOMEM, "%s: no memory for node %d", op->name, g->n_nodes);
        wf_tensor_release(value);
        return NULL;
    }
    memset(n, 0, sizeof *n);
    n->op = op;
    n->graph = g;
    n->id = g->n_nodes;
    n->file = intern_file(g, loc.file);
    n->line = n->file ? loc.line : 0;
    n->attrs = &no_attrs;
    n->device = -1;
    n->rt_index = -1;
    n->grad_of = -1;
    n->value = value;
    n->inputs = n->inline_inputs;
    n->name = name;
    int rc = 0;
    if (name && !*name) {
        n->name = "";
        rc = node_fail(n, WF_EINVAL, "a name must not be empty");
        goto fail;
    }
    uint64_t h = 0;
    if (name) {
        h = hash_name(name);
        wf_node *other = find(g, name, h);
        if (other) {
            char where[256];
            rc = node_fail(n, WF_EINVAL, "the name '%s' is taken by %s node %d (%s)", name,
                           other->op->name, other->id, wf__node_where(other, where, sizeof where));
            goto fail;
        }
        n->name = arena_strdup(g, name);
    } else {
        n->name = auto_name(g, op->name, n->id);
    }
    if (!n->name)
        goto nomem;
    if (n_inputs < 0 || (n_inputs > 0 && !inputs)) {
        rc = node_fail(n, WF_EINVAL,
                       n_inputs < 0 ? "the input count is %d" : "%d inputs but no array", n_inputs);
        goto fail;
    }
    if (n_inputs < op->min_inputs || (op->max_inputs >= 0 && n_inputs > op->max_inputs)) {
        if (op->max_inputs < 0)
            rc = node_fail(n, WF_EINVAL, "takes at least %d inputs, not %d", op->min_inputs,
                           n_inputs);
        else if (op->min_inputs == op->max_inputs)
            rc = node_fail(n, WF_EINVAL, "takes %d inputs, not %d", op->min_inputs, n_inputs);
        else
            rc = node_fail(n, WF_EINVAL, "takes %d to %d inputs, not %d", op->min_inputs,
                           op->max_inputs, n_inputs);
        goto fail;
    }
    for (int i = 0; i < n_inputs; i++) {
        if (!inputs[i]) {
            rc = node_fail(n, WF_EINVAL, "input %d is NULL", i);
            goto fail;
        }
        if (inputs[i]->graph != g) {
            rc = node_fail(n, WF_EINVAL, "input %d ('%s') belongs to another graph", i,
                           inputs[i]->name);
            goto fail;
        }
        if (i < op->n_assign && inputs[i]->op != &wf_op_variable) {
            rc = node_fail(n, WF_EINVAL, "input %d ('%s', a %s) must be a variable: %s writes it",
                           i, inputs[i]->name, inputs[i]->op->name, op->name);
            goto fail;
        }
    }
    if (n_inputs > WF_NODE_INLINE_INPUTS &&
        !(n->inputs = wf__graph_alloc(g, (size_t)n_inputs * sizeof *n->inputs)))
        goto nomem;
    if (n_inputs > 0)
        memcpy(n->inputs, inputs, (size_t)n_inputs * sizeof *inputs);
    n->n_inputs = n_inputs;
    if (attrs && memcmp(attrs, &no_attrs, sizeof *attrs) != 0 &&
        !(n->attrs = share_attrs(g, attrs)))
        goto nomem;
    char detail[WF_ERRMSG_MAX];
    detail[0] = '\0';
    rc = op->infer(n, detail, sizeof detail);
    if (rc < 0) {
        rc = node_fail(n, rc, "%s", detail[0] ? detail : "inference failed");
        goto fail;
    }
    if (!valid_dtype(n->dtype) || n->shape.rank < 0 || n->shape.rank > WF_MAX_RANK) {
        rc = node_fail(n, WF_EINVAL, "inference gave dtype %d and rank %d", (int)n->dtype,
                       n->shape.rank);
        goto fail;
    }
    for (int i = n->shape.rank; i < WF_MAX_RANK; i++)
        n->shape.dims[i] = 0;
    /* Every shape is bounded (core/tensor.h, WF__MAX_NUMEL), so that no later product of
     * its dimensions (element counts, strides, byte sizes, a pass's rewrite) overflows. */
    rc = wf__shape_check(n->shape, "the output shape", detail, sizeof detail);
    if (rc < 0) {
        rc = node_fail(n, rc, "%s", detail);
        goto fail;
    }
    if (g->mode == WF_EAGER) {
        char msg[WF_ERRMSG_MAX];
        if (!(op->flags & WF_OP_SOURCE) && !g->eager_fn) {
            /* The message of wf__node_run() names the node already: kept whole. */
            if ((rc = eager_cpu(g, n, msg, sizeof msg)) < 0) {
                set_error(g, rc, msg);
                goto fail;
            }
        } else if (op->flags & WF_OP_SOURCE)
            rc = eager_source(n);
        else if ((rc = eager_inputs(n)) == 0)
            rc = g->eager_fn(g->eager_ctx, n);
        if (rc < 0) {
            char why[WF_ERRMSG_MAX];
            snprintf(why, sizeof why, "%s", wf_last_errmsg());
            node_fail(n, rc, "%s", why);
            goto fail;
        }
    }
    n->name_hash = h; /* 0 for an automatic name: not in the table */
    if (h)
        insert_name(g, n);
    g->n_nodes++;
    return n;
nomem:
    rc = node_fail(n, WF_ENOMEM, "no memory");
fail:
    wf_tensor_release(n->value);
    n->value = NULL;
    (void)rc;
    return NULL;
}

wf_node *wf__node_add_ex(wf_graph *g, const wf_op_def *op, const char *name, wf_node *const *inputs,
                         int n_inputs, const wf_attrs *attrs, wf_srcloc loc)
{
    return add_node(g, op, name, inputs, n_inputs, attrs, loc, NULL);
}

wf_node *wf__node_add(wf_graph *g, const wf_op_def *op, wf_node *const *inputs, int n_inputs,
                      const wf_attrs *attrs)
{
    return add_node(g, op, NULL, inputs, n_inputs, attrs, wf__srcloc_take(), NULL);
}

int wf__node_add_control(wf_node *n, wf_node *before)
{
    if (!n || !before)
        return graph_fail(n        ? n->graph
                          : before ? before->graph
                                   : NULL,
                          WF_EINVAL, "wf__node_add_control: %s is NULL", n ? "before" : "n");
    if (before->graph != n->graph)
        return node_fail(n, WF_EINVAL, "control input '%s' belongs to another graph", before->name);
    if (before->id >= n->id)
        return node_fail(n, WF_EINVAL,
                         "control input '%s' (node %d) was not created before this node (%d)",
                         before->name, before->id, n->id);
    for (int i = 0; i < n->n_control; i++)
        if (n->control[i] == before)
            return 0;
    /* Capacity is 2, 4, 8, ...: full when the count is a power of two >= 2. The old array
     * stays in the arena (control edges are few). */
    int k = n->n_control;
    if (k == 0 || (k >= 2 && (k & (k - 1)) == 0)) {
        if (k > INT_MAX / 4)
            return node_fail(n, WF_ENOMEM, "too many control inputs");
        wf_node **c = wf__graph_alloc(n->graph, (size_t)(k ? k * 2 : 2) * sizeof *c);
        if (!c)
            return node_fail(n, WF_ENOMEM, "no memory for a control input");
        if (k)
            memcpy(c, n->control, (size_t)k * sizeof *c);
        n->control = c;
    }
    n->control[n->n_control++] = before;
    return 0;
}

/* ---- Node queries ------------------------------------------------------------------------ */

const char *wf_node_name(const wf_node *n)
{
    return n ? n->name : NULL;
}

const char *wf_node_op(const wf_node *n)
{
    return n ? n->op->name : NULL;
}

wf_dtype wf_node_dtype(const wf_node *n)
{
    return n ? n->dtype : WF_DTYPE_INVALID;
}

wf_shape wf_node_shape(const wf_node *n)
{
    return n ? n->shape : (wf_shape){ .rank = 0 };
}

wf_graph *wf_node_graph(const wf_node *n)
{
    return n ? n->graph : NULL;
}

int wf_node_input_count(const wf_node *n)
{
    return n ? n->n_inputs : 0;
}

wf_node *wf_node_input(const wf_node *n, int i)
{
    return n && i >= 0 && i < n->n_inputs ? n->inputs[i] : NULL;
}

const char *wf_node_file(const wf_node *n)
{
    return n && n->file ? n->file : "?";
}

int wf_node_line(const wf_node *n)
{
    return n ? n->line : 0;
}

wf_tensor *wf_node_value(const wf_node *n)
{
    /* A variable's first read makes its value (eager_value): the node is the graph's
     * (writable) memory; the const is the query's promise to the caller. */
    return n ? eager_value((wf_node *)(uintptr_t)n) : NULL;
}

int wf_node_set_name(wf_node *n, const char *name)
{
    if (!n)
        return wf__err(WF_EINVAL, "wf_node_set_name: node is NULL");
    if (!name || !*name)
        return wf__err(WF_EINVAL, "wf_node_set_name: %s name for node '%s'",
                       name ? "empty" : "NULL", n->name);
    wf_graph *g = n->graph;
    uint64_t h = hash_name(name);
    wf_node *other = find(g, name, h);
    if (other == n)
        return 0;
    if (other) {
        char where[256];
        return wf__err(WF_EINVAL, "wf_node_set_name: the name '%s' is taken by %s node %d (%s)",
                       name, other->op->name, other->id,
                       wf__node_where(other, where, sizeof where));
    }
    char *copy = arena_strdup(g, name);
    if (!copy || (n->name_hash == 0 && reserve_name(g) < 0))
        return wf__err(WF_ENOMEM, "wf_node_set_name: no memory");
    if (n->name_hash)
        remove_name(g, n);
    n->name = copy;
    n->name_hash = h;
    insert_name(g, n);
    return 0;
}

/* ---- Placeholders, constants, variables ------------------------------------------------- */

static wf_attrs source_attrs(wf_dtype dt, wf_shape shape)
{
    wf_attrs a;
    memset(&a, 0, sizeof a);
    a.dtype = dt;
    a.shape = shape;
    return a;
}

wf_node *(wf_placeholder)(wf_graph *g, const char *name, wf_dtype dt, wf_shape shape)
{
    wf_attrs a = source_attrs(dt, shape);
    return add_node(g, &wf_op_placeholder, name, NULL, 0, &a, wf__srcloc_take(), NULL);
}

wf_node *(wf_constant)(wf_graph *g, wf_tensor *t)
{
    wf_srcloc loc = wf__srcloc_take();
    if (!t) {
        if (!g)
            wf__err(WF_EINVAL, "wf_constant: graph is NULL");
        else if (g->status == 0)
            graph_fail(g, WF_EINVAL, "constant (%s:%d): the tensor is NULL",
                       loc.file ? base_name(loc.file) : "?", loc.line);
        return NULL;
    }
    wf_attrs a = source_attrs(t->dtype, t->shape);
    return add_node(g, &wf_op_constant, NULL, NULL, 0, &a, loc, wf_tensor_retain(t));
}

wf_node *(wf_scalar)(wf_graph *g, wf_dtype dt, double value)
{
    wf_srcloc loc = wf__srcloc_take();
    if (!g) {
        wf__err(WF_EINVAL, "wf_scalar: graph is NULL");
        return NULL;
    }
    if (!valid_dtype(dt)) {
        graph_fail(g, WF_EINVAL, "scalar (%s:%d): dtype %d is not a wf_dtype",
                   loc.file ? base_name(loc.file) : "?", loc.line, (int)dt);
        return NULL;
    }
    wf_tensor *t = wf__tensor_alloc_value(dt, WF_SCALAR);
    if (!t) {
        graph_fail(g, WF_ENOMEM, "scalar: no memory");
        return NULL;
    }
    wf__store_f64(dt, t->data, value);
    wf_attrs a = source_attrs(dt, WF_SCALAR);
    return add_node(g, &wf_op_constant, NULL, NULL, 0, &a, loc, t);
}

wf_node *(wf_variable)(wf_graph *g, const char *name, wf_dtype dt, wf_shape shape, wf_init init)
{
    wf_srcloc loc = wf__srcloc_take();
    if (g && (!name || !*name)) {
        graph_fail(g, WF_EINVAL, "variable (%s:%d): a variable needs a name, not %s",
                   loc.file ? base_name(loc.file) : "?", loc.line, name ? "\"\"" : "NULL");
        return NULL;
    }
    wf_attrs a = source_attrs(dt, shape);
    a.init = init;
    return add_node(g, &wf_op_variable, name, NULL, 0, &a, loc, NULL);
}

/* ---- Dumps ------------------------------------------------------------------------------- */

/* Writes 's' inside a DOT string: quotes and backslashes escaped, newlines as \n. */
static void dot_escaped(FILE *f, const char *s)
{
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            fputc('\\', f);
        if (*s == '\n')
            fputs("\\n", f);
        else
            fputc(*s, f);
    }
}

int wf__graph_dump(const wf_graph *g, FILE *f, bool dot)
{
    if (!g || !f)
        return wf__err(WF_EINVAL, "wf__graph_dump: %s is NULL", g ? "f" : "g");
    char shape[160], where[256];
    if (dot)
        fprintf(f, "digraph weft {\n  node [shape=box, fontname=monospace];\n");
    for (int i = 0; i < g->n_nodes; i++) {
        const wf_node *n = node_at(g, i);
        wf_shape_str(n->shape, shape, sizeof shape);
        wf__node_where(n, where, sizeof where);
        if (dot) {
            fprintf(f, "  n%d [label=\"", n->id);
            dot_escaped(f, n->name);
            fprintf(f, "\\n%s %s %s\\n", n->op->name, wf_dtype_name(n->dtype), shape);
            dot_escaped(f, where);
            fprintf(f, "\"];\n");
            for (int k = 0; k < n->n_inputs; k++)
                fprintf(f, "  n%d -> n%d;\n", n->inputs[k]->id, n->id);
            for (int k = 0; k < n->n_control; k++)
                fprintf(f, "  n%d -> n%d [style=dashed];\n", n->control[k]->id, n->id);
            continue;
        }
        fprintf(f, "%%%d %s: %s %s = %s(", n->id, n->name, wf_dtype_name(n->dtype), shape,
                n->op->name);
        for (int k = 0; k < n->n_inputs; k++)
            fprintf(f, "%s%%%d %s", k ? ", " : "", n->inputs[k]->id, n->inputs[k]->name);
        fprintf(f, ")");
        for (int k = 0; k < n->n_control; k++)
            fprintf(f, "%s%%%d %s", k ? ", " : " after(", n->control[k]->id, n->control[k]->name);
        fprintf(f, "%s @ %s\n", n->n_control ? ")" : "", where);
    }
    if (dot)
        fprintf(f, "}\n");
    return ferror(f) ? wf__err(WF_EIO, "wf__graph_dump: a write failed") : 0;
}

int wf_variable_set(wf_node *var, wf_tensor *value)
{
    char a[160], b[160];
    if (!var || !value)
        return wf__err(WF_EINVAL, "wf_variable_set: %s is NULL", var ? "value" : "var");
    if (var->op != &wf_op_variable || var->graph->mode != WF_EAGER)
        return wf__err(WF_EINVAL, "wf_variable_set: '%s' is %s", var->name,
                       var->op != &wf_op_variable ? "not a variable" : "not in an eager graph");
    if (value->dtype != var->dtype)
        return wf__err(WF_EDTYPE, "wf_variable_set: '%s' is %s, the value %s", var->name,
                       wf_dtype_name(var->dtype), wf_dtype_name(value->dtype));
    if (!wf_shape_equal(value->shape, var->shape))
        return wf__err(WF_ESHAPE, "wf_variable_set: '%s' is %s, the value %s", var->name,
                       wf_shape_str(var->shape, a, sizeof a),
                       wf_shape_str(value->shape, b, sizeof b));
    wf_tensor_retain(value);
    wf_tensor_release(var->value);
    var->value = value;
    return 0;
}
