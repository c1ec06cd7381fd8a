/* runtime/session.c: sessions: the public API of runtime/ (weft/runtime.h).
 * Owns: the session object, its variable values (made from each variable's wf_init at
 *   creation, or for a pipeline stage when a plan first reads one; replaced by assign), its pool of
 * intermediate values, its message, and one run from the caller's side: checking fetches, targets
 * and feeds, finding the plan, taking a run slot, setting the uses and feeds, collecting the
 * fetched values and clearing what the run left. Variables on devices (runtime/var_device.c):
 * wf_session_variable() copies a value whose latest write is on a device back first, a run copies
 * back those its plan reads on the host, and wf_session_assign() makes the host value the current
 * one (the next run on the device copies it in once); wf_session_destroy() closes the session's
 * devices. Invariants: those of runtime/internal.h. A session runs only the first 'n_nodes' nodes
 * of its graph (those that existed at creation), so every variable it may read has a value. Not
 * here: compiling plans (plan.c), running them (exec.c). */
#include "../transport/coll_ops.h"
#include "../transport/post.h"
#include "internal.h"

#include <weft/devices.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_SLOTS 4
#define MAX_SLOTS     1024

int wf__session_fail(wf_session *s, int code, const char *fmt, ...)
{
    char msg[WF_ERRMSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&s->plans_mu);
    snprintf(s->errmsg, sizeof s->errmsg, "%s", msg);
    pthread_mutex_unlock(&s->plans_mu);
    return wf__err(code, "%s", msg);
}

const char *wf_session_errmsg(const wf_session *s)
{
    return s ? s->errmsg : "wf_session_errmsg: session is NULL";
}

void wf_session_destroy(wf_session *s)
{
    if (!s)
        return;
    for (wf__plan *p = s->plans, *next; p; p = next) {
        next = p->next;
        wf__plan_destroy(p);
    }
    wf__session_devices_close(s); /* after the plans, whose slots hold device values */
    for (int i = 0; s->var_vals && i < s->n_vars; i++)
        wf_tensor_release(s->var_vals[i]);
    free(s->var_vals);
    free(s->var_dev);
    free(s->var_node);
    pthread_mutex_destroy(&s->dev_mu);
    free(s->var_of);
    wf_pool_destroy(s->pool);
    wf__kernels_destroy(s->kernels);
    wf__dp_free(s->dp);
    pthread_rwlock_destroy(&s->var_lock);
    pthread_mutex_destroy(&s->plans_mu);
    free(s);
}

int wf__session_var_need(wf_session *s, int k)
{
    pthread_rwlock_rdlock(&s->var_lock);
    bool have = s->var_vals[k] != NULL;
    pthread_rwlock_unlock(&s->var_lock);
    if (have)
        return 0;
    /* Made outside the lock (an initialiser fills the whole tensor); a value another thread
     * installed meanwhile wins, and both are the same bits. */
    const wf_node *n = wf_graph_node(s->g, s->var_node[k]);
    wf_tensor *t = NULL;
    int rc = wf_init_tensor(n->attrs->init, n->dtype, n->shape, &t);
    if (rc < 0) {
        char why[WF_ERRMSG_MAX], desc[WF_ERRMSG_MAX];
        snprintf(why, sizeof why, "%s", wf_last_errmsg());
        return wf__err(rc, "%s: initial value: %s", wf__rt_node_desc(n, desc, sizeof desc), why);
    }
    pthread_rwlock_wrlock(&s->var_lock);
    if (!s->var_vals[k]) {
        s->var_vals[k] = t;
        t = NULL;
    }
    pthread_rwlock_unlock(&s->var_lock);
    wf_tensor_release(t);
    return 0;
}

void wf__session_var_stats(wf_session *s, wf_plan_stats *out)
{
    out->n_variables = s->n_vars;
    out->n_variables_held = 0;
    out->bytes_variables = 0;
    pthread_rwlock_rdlock(&s->var_lock);
    for (int k = 0; k < s->n_vars; k++)
        if (s->var_vals[k]) {
            out->n_variables_held++;
            out->bytes_variables +=
                (int64_t)s->var_vals[k]->numel * (int64_t)wf_dtype_size(s->var_vals[k]->dtype);
        }
    pthread_rwlock_unlock(&s->var_lock);
}

int wf_session_create(wf_graph *g, const wf_session_opts *opts, wf_session **out)
{
    if (!out)
        return wf__graph_fail(g, WF_EINVAL, "wf_session_create: out is NULL");
    *out = NULL;
    if (!g)
        return wf__err(WF_EINVAL, "wf_session_create: graph is NULL");
    wf_session_opts o = opts ? *opts : (wf_session_opts){ 0 };
    if (o.n_run_slots < 0 || o.n_run_slots > MAX_SLOTS)
        return wf__graph_fail(g, WF_EINVAL, "wf_session_create: n_run_slots is %d, not in [0, %d]",
                              o.n_run_slots, MAX_SLOTS);
    const uint32_t known = WF_SESSION_NO_PASSES | WF_SESSION_MIXED_BF16 | WF_SESSION_TF32;
    if (o.flags & ~known)
        return wf__graph_fail(g, WF_EINVAL, "wf_session_create: unknown flags 0x%x",
                              (unsigned)(o.flags & ~known));
    if (o.device < -1 || (o.device > 0 && o.device >= wf_device_count(wf_graph_runtime(g))))
        return wf__graph_fail(g, WF_EINVAL,
                              "wf_session_create: device %d: the runtime has devices 0 .. %d "
                              "(-1: the CPU only, 0: the placement rule)",
                              o.device, wf_device_count(wf_graph_runtime(g)) - 1);
    if (wf_graph_status(g) < 0) {
        /* The graph keeps its first error; say it here too. */
        int code = wf_graph_status(g);
        wf__err(code, "wf_session_create: the graph has an error: %s", wf_graph_errmsg(g));
        return code;
    }
    /* A strategy: every rank agrees, then the graph is rewritten for this rank's replicas
     * (runtime/strategy.c), before the session counts the nodes it runs. */
    struct wf__dp *dp = NULL;
    if (o.strategy) {
        int prc = wf__dp_prepare(g, o.strategy, &o.comm, &o.device, &dp);
        if (prc < 0)
            return prc;
    }
    wf_session *s = calloc(1, sizeof *s);
    if (!s) {
        wf__dp_free(dp);
        return wf__graph_fail(g, WF_ENOMEM, "wf_session_create: no memory");
    }
    s->dp = dp;
    s->g = g;
    s->rt = wf_graph_runtime(g);
    s->n_nodes = wf_graph_node_count(g);
    s->max_slots = o.n_run_slots ? o.n_run_slots : DEFAULT_SLOTS;
    s->flags = o.flags;
    s->device = o.device;
    s->n_sim = wf__dp_sim_devices(dp); /* a Mirrored strategy's simulated devices */
    pthread_rwlock_init(&s->var_lock, NULL);
    pthread_mutex_init(&s->plans_mu, NULL);
    pthread_mutex_init(&s->dev_mu, NULL);
    int rc = wf_pool_create(s->rt, NULL, &s->pool);
    if (rc >= 0)
        rc = wf__kernels_create(&s->kernels);
    /* The kernels of the layers below, registered for this session: the copies between its
     * devices (devices/device.h), and the network's send and recv for its communicator
     * (transport/post.h). */
    if (rc >= 0)
        rc = wf__devices_register_kernels(s->kernels, &s->devtab);
    if (rc >= 0 && o.comm)
        rc = wf__transport_register_kernels(s->kernels, o.comm);
    /* A strategy's: the reduction of its buckets (transport/coll_ops.h), and then the
     * variables broadcast from rank 0 (runtime/strategy.c, once they have values). */
    if (rc < 0) {
        char why[WF_ERRMSG_MAX];
        snprintf(why, sizeof why, "%s", wf_last_errmsg());
        wf_session_destroy(s);
        return wf__graph_fail(g, rc, "wf_session_create: %s", why);
    }
    s->var_of = malloc((size_t)(s->n_nodes ? s->n_nodes : 1) * sizeof *s->var_of);
    if (!s->var_of) {
        wf_session_destroy(s);
        return wf__graph_fail(g, WF_ENOMEM, "wf_session_create: no memory for %d nodes",
                              s->n_nodes);
    }
    for (int id = 0; id < s->n_nodes; id++) {
        const wf_node *n = wf_graph_node(g, id);
        s->var_of[id] = n->op == &wf_op_variable ? s->n_vars++ : -1;
    }
    s->var_vals = calloc((size_t)(s->n_vars ? s->n_vars : 1), sizeof *s->var_vals);
    s->var_dev = calloc((size_t)(s->n_vars ? s->n_vars : 1), sizeof *s->var_dev);
    s->var_node = malloc((size_t)(s->n_vars ? s->n_vars : 1) * sizeof *s->var_node);
    if (!s->var_vals || !s->var_dev || !s->var_node) {
        wf_session_destroy(s);
        return wf__graph_fail(g, WF_ENOMEM, "wf_session_create: no memory for %d variables",
                              s->n_vars);
    }
    for (int id = 0; id < s->n_nodes; id++)
        if (s->var_of[id] >= 0)
            s->var_node[s->var_of[id]] = id;
    /* A pipeline stage makes only the values its plans read (wf__session_var_need()): the
     * other stages' weights and optimizer state never exist here (with 2 stages, half the
     * model's bytes). Every other session makes them all now, and reports a bad
     * initialiser at creation. */
    s->lazy_vars = wf__dp_is_pipeline(s->dp);
    for (int k = 0; k < s->n_vars && !s->lazy_vars; k++) {
        if ((rc = wf__session_var_need(s, k)) < 0) {
            char why[WF_ERRMSG_MAX];
            snprintf(why, sizeof why, "%s", wf_last_errmsg());
            wf_session_destroy(s);
            return wf__graph_fail(g, rc, "wf_session_create: %s", why);
        }
    }
    /* A strategy's reduction kernel, and the variables of rank 0 on every rank. */
    if (s->dp && (rc = wf__dp_start(s)) < 0) {
        char why[WF_ERRMSG_MAX];
        snprintf(why, sizeof why, "%s", wf_last_errmsg());
        wf_session_destroy(s);
        return wf__graph_fail(g, rc, "wf_session_create: %s", why);
    }
    *out = s;
    return 0;
}

/* Checks that 'n' is a node this session can run; 'what' and 'i' name it in the message,
 * 'fn' the caller. */
static int check_node(wf_session *s, const char *fn, const wf_node *n, const char *what, int i)
{
    char desc[WF_ERRMSG_MAX];
    if (!n)
        return wf__session_fail(s, WF_EINVAL, "%s: %s %d is NULL", fn, what, i);
    if (n->graph != s->g)
        return wf__session_fail(s, WF_EINVAL, "%s: %s %d, %s, belongs to another graph", fn, what,
                                i, wf__rt_node_desc(n, desc, sizeof desc));
    if (n->id >= s->n_nodes)
        return wf__session_fail(s, WF_EINVAL,
                                "%s: %s %d, %s, was created after the session (node %d of %d)", fn,
                                what, i, wf__rt_node_desc(n, desc, sizeof desc), n->id, s->n_nodes);
    return 0;
}

/* Checks feed 'i' against its placeholder. */
static int check_feed(wf_session *s, const wf_feed *feeds, int i)
{
    char desc[WF_ERRMSG_MAX], a[160], b[160];
    const wf_feed *f = &feeds[i];
    int rc = check_node(s, "wf_session_run", f->node, "feed", i);
    if (rc < 0)
        return rc;
    wf__rt_node_desc(f->node, desc, sizeof desc);
    if (f->node->op != &wf_op_placeholder)
        return wf__session_fail(s, WF_EINVAL, "wf_session_run: feed %d: %s is not a placeholder", i,
                                desc);
    for (int j = 0; j < i; j++)
        if (feeds[j].node == f->node)
            return wf__session_fail(s, WF_EINVAL, "wf_session_run: feeds %d and %d both feed %s", j,
                                    i, desc);
    if (!f->value)
        return wf__session_fail(s, WF_EINVAL, "wf_session_run: feed %d for %s has a NULL value", i,
                                desc);
    wf_dtype dt = wf_tensor_dtype(f->value);
    wf_shape want = f->node->shape, got = wf_tensor_shape(f->value);
    if (dt != f->node->dtype)
        return wf__session_fail(s, WF_EDTYPE, "wf_session_run: feed %d for %s is %s, not %s", i,
                                desc, wf_dtype_name(dt), wf_dtype_name(f->node->dtype));
    bool fits = want.rank == got.rank;
    for (int d = 0; fits && d < want.rank; d++)
        fits = want.dims[d] < 0 || want.dims[d] == got.dims[d];
    if (!fits)
        return wf__session_fail(s, WF_ESHAPE, "wf_session_run: feed %d for %s has shape %s, not %s",
                                i, desc, wf_shape_str(got, a, sizeof a),
                                wf_shape_str(want, b, sizeof b));
    return 0;
}

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Releases every value a run left in the slot (fetched values, leftovers of a failed run). */
static void clear_values(wf__slot *sl)
{
    for (int i = 0; i < sl->plan->n; i++)
        if (sl->vals[i]) {
            wf_tensor_release(sl->vals[i]);
            sl->vals[i] = NULL;
        }
}

/* A fetched value for the caller: 't' itself, or a copy from the pool when it shares the
 * run slot's arena (runtime/arena.c), which the next run of the slot overwrites. Fetched
 * nodes are never planned, so only a kernel that returned an input would need the copy. */
static int fetch_value(wf_session *s, wf_tensor *t, wf_tensor **out)
{
    if (!wf__memplan_aliases(t)) {
        *out = wf_tensor_retain(t);
        return 0;
    }
    int rc = wf_pool_tensor(s->pool, t->dtype, t->shape, NULL, out);
    if (rc == 0)
        rc = wf_tensor_read(t, t->dtype, (*out)->data,
                            (size_t)(*out)->numel * wf_dtype_size(t->dtype));
    if (rc < 0) {
        wf_tensor_release(*out);
        *out = NULL;
        return wf__session_fail(s, rc, "wf_session_run: copying a fetched value: %s",
                                wf_last_errmsg());
    }
    return 0;
}

#define STACK_KEY 32

int wf__session_plan(wf_session *s, const char *fn, wf_node *const *fetches, int n_fetches,
                     wf_node *const *targets, int n_targets, wf__plan **out)
{
    *out = NULL;
    if (n_fetches > INT32_MAX - n_targets - 1)
        return wf__session_fail(s, WF_EINVAL, "%s: too many fetches and targets", fn);
    int rc = 0;
    wf_node **mapped = NULL;
    if (s->dp && n_fetches + n_targets > 0) {
        /* A strategy's session (dumps, statistics): the rewritten graph's nodes. The map is
         * idempotent, so wf_session_run()'s mapped nodes pass through unchanged. */
        if (!(mapped = malloc((size_t)(n_fetches + n_targets) * sizeof *mapped)))
            return wf__session_fail(s, WF_ENOMEM, "%s: no memory", fn);
        rc = wf__dp_map(s, fetches, n_fetches, mapped, "fetch");
        if (rc == 0)
            rc = wf__dp_map(s, targets, n_targets, mapped + n_fetches, "target");
        if (rc < 0) {
            free(mapped);
            return rc;
        }
        fetches = mapped;
        targets = mapped + n_fetches;
    }
    for (int i = 0; i < n_fetches && rc == 0; i++)
        rc = check_node(s, fn, fetches[i], "fetch", i);
    for (int i = 0; i < n_targets && rc == 0; i++)
        rc = check_node(s, fn, targets[i], "target", i);
    if (rc < 0 || n_fetches + n_targets == 0) {
        free(mapped);
        return rc;
    }

    /* The plan's key: the sorted, distinct ids of fetches and targets. */
    int32_t key_stack[STACK_KEY], *key = key_stack;
    int n_key = n_fetches + n_targets;
    if (n_key > STACK_KEY && !(key = malloc((size_t)n_key * sizeof *key))) {
        free(mapped);
        return wf__session_fail(s, WF_ENOMEM, "%s: no memory for %d fetches and targets", fn,
                                n_key);
    }
    for (int i = 0; i < n_fetches; i++)
        key[i] = fetches[i]->id;
    for (int i = 0; i < n_targets; i++)
        key[n_fetches + i] = targets[i]->id;
    free(mapped);
    qsort(key, (size_t)n_key, sizeof *key, cmp_i32);
    int m = 0;
    for (int i = 0; i < n_key; i++)
        if (m == 0 || key[m - 1] != key[i])
            key[m++] = key[i];
    rc = wf__plan_get(s, key, m, out);
    if (key != key_stack)
        free(key);
    if (rc < 0)
        return wf__session_fail(s, rc, "%s", wf_last_errmsg());
    return 0;
}

static int run(wf_session *s, const wf_feed *feeds, int n_feeds, wf_node *const *fetches,
               int n_fetches, wf_tensor **outs, wf_node *const *targets, int n_targets);

int wf_session_run(wf_session *s, const wf_feed *feeds, int n_feeds, wf_node *const *fetches,
                   int n_fetches, wf_tensor **outs, wf_node *const *targets, int n_targets)
{
    if (!s || !s->dp || n_fetches < 0 || n_targets < 0 || (n_fetches && (!fetches || !outs)) ||
        (n_targets && !targets) || n_fetches > INT32_MAX - n_targets - 1)
        return run(s, feeds, n_feeds, fetches, n_fetches, outs, targets, n_targets);
    /* A strategy: the nodes that stand for the user's in the rewritten graph, and the ones
     * every run targets (a pipeline rank's sends). */
    int max_extra = wf__dp_max_extra(s->dp);
    if (max_extra > INT32_MAX - n_fetches - n_targets - 1)
        return wf__session_fail(s, WF_EINVAL, "wf_session_run: too many fetches and targets");
    /* m: the mapped fetches and targets, then the extra targets; the user's nodes after them */
    size_t n_all = (size_t)n_fetches + (size_t)n_targets;
    wf_node **m = malloc((2 * n_all + (size_t)max_extra + 1) * sizeof *m);
    if (!m)
        return wf__session_fail(s, WF_ENOMEM, "wf_session_run: no memory");
    for (int i = 0; i < n_fetches; i++)
        outs[i] = NULL;
    wf_node **req = m + n_all + max_extra;
    if (n_fetches)
        memcpy(req, fetches, (size_t)n_fetches * sizeof *req);
    if (n_targets)
        memcpy(req + n_fetches, targets, (size_t)n_targets * sizeof *req);
    int rc = wf__dp_map(s, fetches, n_fetches, m, "fetch");
    if (rc == 0)
        rc = wf__dp_map(s, targets, n_targets, m + n_fetches, "target");
    int n_extra = 0;
    if (rc == 0 && (n_extra = wf__dp_extra_targets(s, req, (int)n_all, m + n_all)) < 0)
        rc = n_extra;
    if (rc == 0 && wf__ps_serves(wf__dp_ps(s->dp)))
        rc = wf__ps_serve(s, wf__dp_ps(s->dp), m, n_fetches, outs, m + n_fetches, n_targets);
    else if (rc == 0)
        rc = run(s, feeds, n_feeds, m, n_fetches, outs, m + n_fetches, n_targets + n_extra);
    free(m);
    /* This rank will not join this step's reductions: the others would wait for them until
     * their deadline (300 s) unless the communicator fails now, with this rank's error. */
    if (rc < 0)
        wf__dp_fail_comm(wf__dp_comm(s->dp), rc, wf_session_errmsg(s));
    return rc;
}

int wf__session_run_plain(wf_session *s, const wf_feed *feeds, int n_feeds, wf_node *const *fetches,
                          int n_fetches, wf_tensor **outs, wf_node *const *targets, int n_targets)
{
    return run(s, feeds, n_feeds, fetches, n_fetches, outs, targets, n_targets);
}

static int run(wf_session *s, const wf_feed *feeds, int n_feeds, wf_node *const *fetches,
               int n_fetches, wf_tensor **outs, wf_node *const *targets, int n_targets)
{
    if (!s)
        return wf__err(WF_EINVAL, "wf_session_run: session is NULL");
    if (n_feeds < 0 || n_fetches < 0 || n_targets < 0)
        return wf__session_fail(s, WF_EINVAL,
                                "wf_session_run: negative count (%d feeds, %d fetches, %d targets)",
                                n_feeds, n_fetches, n_targets);
    if ((n_feeds && !feeds) || (n_fetches && (!fetches || !outs)) || (n_targets && !targets))
        return wf__session_fail(s, WF_EINVAL, "wf_session_run: %s is NULL but its count is not 0",
                                n_feeds && !feeds       ? "feeds"
                                : n_fetches && !fetches ? "fetches"
                                : n_fetches && !outs    ? "outs"
                                                        : "targets");
    for (int i = 0; i < n_fetches; i++)
        outs[i] = NULL;
    if (n_fetches > INT32_MAX - n_targets)
        return wf__session_fail(s, WF_EINVAL, "wf_session_run: too many fetches and targets");
    wf__plan *p = NULL;
    int rc = wf__session_plan(s, "wf_session_run", fetches, n_fetches, targets, n_targets, &p);
    for (int i = 0; i < n_feeds && rc == 0; i++)
        rc = check_feed(s, feeds, i);
    if (rc < 0 || !p)
        return rc;

    wf__slot *sl = NULL;
    if ((rc = wf__slot_take(p, &sl)) < 0)
        return wf__session_fail(s, rc, "%s", wf_last_errmsg());
    for (int i = 0; i < n_feeds; i++) {
        int32_t pi = p->index_of[feeds[i].node->id];
        if (pi >= 0)
            sl->vals[pi] = wf_tensor_retain(feeds[i].value);
    }
    for (int k = 0; k < p->n_placeholders; k++) {
        const wf_node *ph = p->nodes[p->placeholders[k]];
        if (!sl->vals[p->placeholders[k]]) {
            char desc[WF_ERRMSG_MAX];
            clear_values(sl);
            wf__slot_give(sl);
            return wf__session_fail(s, WF_EINVAL, "wf_session_run: %s is needed but not fed",
                                    wf__rt_node_desc(ph, desc, sizeof desc));
        }
    }
    /* Variables this plan reads on the host whose latest write is on a device (another
     * plan's, runtime/var_device.c): copied back first, on this thread. */
    if ((rc = wf__plan_vars_ready(p)) < 0) {
        clear_values(sl);
        wf__slot_give(sl);
        return wf__session_fail(s, rc, "%s", wf_last_errmsg());
    }
    for (int i = 0; i < p->n; i++)
        atomic_store_explicit(&sl->uses[i], p->uses0[i], memory_order_relaxed);
    for (int i = 0; i < n_fetches; i++)
        atomic_fetch_add_explicit(&sl->uses[p->index_of[fetches[i]->id]], 1, memory_order_relaxed);

    sl->step = atomic_fetch_add_explicit(&s->n_runs, 1, memory_order_relaxed);
    sl->xfer_step =
        p->transfers ? atomic_fetch_add_explicit(&s->n_xfer_runs, 1, memory_order_relaxed) : 0;
    rc = wf__slot_run(sl);
    if (rc < 0)
        wf__session_fail(s, rc, "%s", sl->errmsg);
    for (int i = 0; i < n_fetches && rc == 0; i++)
        rc = fetch_value(s, sl->vals[p->index_of[fetches[i]->id]], &outs[i]);
    for (int i = 0; i < n_fetches && rc < 0; i++) {
        wf_tensor_release(outs[i]);
        outs[i] = NULL;
    }
    clear_values(sl);
    wf__slot_give(sl);
    return rc;
}

/* Checks that 'var' is a variable of the session; returns its index or a negative status. */
static int var_index(wf_session *s, const wf_node *var, const char *fn)
{
    char desc[WF_ERRMSG_MAX];
    if (!var)
        return wf__session_fail(s, WF_EINVAL, "%s: var is NULL", fn);
    if (var->graph != s->g || var->id >= s->n_nodes)
        return wf__session_fail(s, WF_EINVAL, "%s: %s is not a node of the session's graph", fn,
                                wf__rt_node_desc(var, desc, sizeof desc));
    if (s->var_of[var->id] < 0)
        return wf__session_fail(s, WF_EINVAL, "%s: %s is not a variable", fn,
                                wf__rt_node_desc(var, desc, sizeof desc));
    return s->var_of[var->id];
}

int wf_session_variable(wf_session *s, wf_node *var, wf_tensor **out)
{
    if (!s)
        return wf__err(WF_EINVAL, "wf_session_variable: session is NULL");
    if (!out)
        return wf__session_fail(s, WF_EINVAL, "wf_session_variable: out is NULL");
    *out = NULL;
    int k = var_index(s, var, "wf_session_variable");
    if (k < 0)
        return k;
    /* The host value, copied back first when the device holds the latest write. */
    int rc = wf__var_host_current(s, k, "wf_session_variable", out);
    if (rc < 0)
        return wf__session_fail(s, rc, "%s", wf_last_errmsg());
    return 0;
}

int wf_session_assign(wf_session *s, wf_node *var, wf_tensor *value)
{
    if (!s)
        return wf__err(WF_EINVAL, "wf_session_assign: session is NULL");
    int k = var_index(s, var, "wf_session_assign");
    if (k < 0)
        return k;
    char desc[WF_ERRMSG_MAX], a[160], b[160];
    if (!value)
        return wf__session_fail(s, WF_EINVAL, "wf_session_assign: the value for %s is NULL",
                                wf__rt_node_desc(var, desc, sizeof desc));
    if (wf_tensor_dtype(value) != var->dtype)
        return wf__session_fail(s, WF_EDTYPE, "wf_session_assign: %s is %s, the value %s",
                                wf__rt_node_desc(var, desc, sizeof desc), wf_dtype_name(var->dtype),
                                wf_dtype_name(wf_tensor_dtype(value)));
    if (!wf_shape_equal(wf_tensor_shape(value), var->shape))
        return wf__session_fail(s, WF_ESHAPE, "wf_session_assign: %s has shape %s, the value %s",
                                wf__rt_node_desc(var, desc, sizeof desc),
                                wf_shape_str(var->shape, a, sizeof a),
                                wf_shape_str(wf_tensor_shape(value), b, sizeof b));
    wf_tensor *copy = wf__tensor_alloc(var->dtype, var->shape);
    if (!copy)
        return wf__session_fail(s, WF_ENOMEM, "wf_session_assign: %s", wf_last_errmsg());
    size_t bytes = (size_t)copy->numel * wf_dtype_size(copy->dtype);
    int rc = wf_tensor_read(value, copy->dtype, copy->data, bytes);
    if (rc < 0) {
        wf_tensor_release(copy);
        return wf__session_fail(s, rc, "wf_session_assign: %s", wf_last_errmsg());
    }
    pthread_rwlock_wrlock(&s->var_lock);
    wf_tensor *old = s->var_vals[k];
    s->var_vals[k] = copy;
    wf__var_host_written(s, k); /* a device value is stale: the next device run copies it */
    pthread_rwlock_unlock(&s->var_lock);
    wf_tensor_release(old);
    return 0;
}
