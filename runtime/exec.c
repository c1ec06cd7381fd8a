/* runtime/exec.c: the static executor: run slots and the task of one plan node.
 * Owns: the slots of each plan (a slot is one run's state: a pre-built wf_taskgraph with one
 *   node per plan node, the value slots, the remaining-use counters and the first error),
 *   the pool of idle slots, and what a node's task does: take its inputs' values, infer the
 *   concrete output shape when placeholders' -1 dimensions are involved, allocate the
 *   output (from the slot's arena where the memory plan put it, runtime/arena.c, else from
 *   the session's pool), run the node's kernel (the one the plan resolved from the
 *   session's registry) through wf__node_run() (core/op.h), and release each input value
 *   when its last reader has finished.
 * Nodes that finish later (WF_OP_ASYNC, a recv waiting for the network): their kernel
 *   pends, the task returns WF_TASK_LATER, and wf__slot_node_complete() (called by the kernel's
 *   completion, on the transport's actor) does the rest and finishes the task-graph node.
 * Why slots: a wf_taskgraph runs once at a time, and the pending counters of the plan live
 *   in it; a session run from several threads at once takes one slot per run, so runs
 *   share nothing but the plan (read-only) and the session's pool and variables. A slot
 *   is built on first use and replayed afterwards, allocating only outputs: the scheduler
 *   keeps one ready successor inline (sched/taskgraph.c), so a chain of nodes is run by
 *   one worker without deque traffic.
 * Inline runs: a plan whose values are all static and tiny ('run_inline', compile/plan.h) runs
 *   node by node on the calling thread, in plan order, with no task graph; its slot keeps a
 *   few dead values to reuse as outputs (spare_put), which only a single-threaded run can
 *   do safely.
 * Variables: a variable node's task retains the session's host value, or, for a variable
 *   resident on a device, its device value (var_device.c); a host update marks the host
 *   value as the latest write (a device value, if any, becomes stale).
 * Invariants: those of runtime/internal.h (uses, values between runs, slot ownership).
 * Not here: compiling plans (compile/plan.c), feeds and fetches (session.c), the static
 *   memory planner (compile/memplan.c) and the slots' arenas (arena.c). */
#include "../memory/pool.h"
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int wf__slot_fail(wf__slot *sl, const wf_node *n, int code, const char *why)
{
    if (!wf__status_known(code) || code >= 0)
        code = WF_ETASK;
    if (!atomic_exchange_explicit(&sl->failed, 1, memory_order_acq_rel)) {
        char desc[WF_ERRMSG_MAX];
        sl->err = code;
        snprintf(sl->errmsg, sizeof sl->errmsg, "%s: %s", wf__rt_node_desc(n, desc, sizeof desc),
                 why);
    }
    return code;
}

int wf__slot_fail_msg(wf__slot *sl, int code, const char *msg)
{
    if (!wf__status_known(code) || code >= 0)
        code = WF_ETASK;
    if (!atomic_exchange_explicit(&sl->failed, 1, memory_order_acq_rel)) {
        sl->err = code;
        snprintf(sl->errmsg, sizeof sl->errmsg, "%s", msg);
    }
    return code;
}

/* Keeps or releases dead value 't'. Inline runs are single-threaded, so a value whose
 * tensor and buffer are referenced only by us can be written again: it is kept (at most
 * WF__SPARE_MAX) for spare_take(). On a chain of scalar adds this removed the pool round trip
 * and three heap calls per node. */
static void spare_put(wf__slot *sl, wf_tensor *t)
{
    if (t && sl->plan->run_inline && sl->n_spare < WF__SPARE_MAX && t->contiguous && t->buf &&
        t->data == t->buf->data && atomic_load_explicit(&t->refs, memory_order_acquire) == 1 &&
        atomic_load_explicit(&t->buf->refs, memory_order_acquire) == 1) {
        sl->spare[sl->n_spare++] = t;
        return;
    }
    wf_tensor_release(t);
}

/* A kept value of exactly 'dt' and 'shape', taken out of 'sl->spare', or NULL. */
static wf_tensor *spare_take(wf__slot *sl, wf_dtype dt, wf_shape shape)
{
    for (int k = sl->n_spare - 1; k >= 0; k--) {
        wf_tensor *t = sl->spare[k];
        if (t->dtype != dt || t->shape.rank != shape.rank)
            continue;
        bool same = true;
        for (int d = 0; same && d < shape.rank; d++)
            same = t->shape.dims[d] == shape.dims[d];
        if (same) {
            sl->spare[k] = sl->spare[--sl->n_spare];
            return t;
        }
    }
    return NULL;
}

/* For an update node 'i' (core/op.h: n_assign): replaces in[0 .. n_assign-1] (the values its
 * variable inputs had when read) by tensors it may write, which become the variables' values:
 * a variable's current value itself when only the session and this run's value slot hold it,
 * else a copy (another run, a fetch or the caller still holds the old value, which stays as
 * it was). Each in[k] comes back with a reference of ours, so a concurrent
 * wf_session_assign() cannot free it under the kernel. Concurrent runs that update one
 * variable race on its values (as TensorFlow's use_locking=False): the memory stays valid,
 * the arithmetic is Hogwild. */
static int take_writable(wf__slot *sl, int i, wf_tensor **in)
{
    const wf__plan *p = sl->plan;
    const wf_node *n = p->nodes[i];
    wf_session *s = p->sess;
    const int32_t *idx = p->in_idx + p->in_off[i];
    int k = 0, rc = 0;
    for (; k < n->op->n_assign; k++) {
        int32_t j = idx[k], v = p->var[j];
        if (v < 0) {
            rc = wf__err(WF_EINVAL, "an assigned input is not a variable of the session");
            break;
        }
        pthread_rwlock_wrlock(&s->var_lock);
        wf_tensor *cur = s->var_vals[v], *w = NULL;
        rc = wf__tensor_writable(cur, 1 + (sl->vals[j] == cur), &w);
        if (rc == 0 && w != cur) {
            s->var_vals[v] = w; /* the copy's reference moves to the session */
            wf_tensor_release(cur);
        }
        if (rc == 0) {
            in[k] = wf_tensor_retain(w);
            wf__var_host_written(s, v); /* a device value, if any, is stale (var_device.c) */
        }
        pthread_rwlock_unlock(&s->var_lock);
        if (rc < 0)
            break;
    }
    if (rc < 0)
        while (k-- > 0)
            wf_tensor_release(in[k]);
    return rc;
}

/* Drops one use of value 'j'; the last one releases it. An inline run is the only thread
 * of its slot, so it needs no read-modify-write. */
static inline void drop_use(wf__slot *sl, int32_t j)
{
    int32_t left;
    if (sl->plan->run_inline) {
        left = atomic_load_explicit(&sl->uses[j], memory_order_relaxed) - 1;
        atomic_store_explicit(&sl->uses[j], left, memory_order_relaxed);
    } else {
        left = atomic_fetch_sub_explicit(&sl->uses[j], 1, memory_order_acq_rel) - 1;
    }
    if (left == 0) {
        wf__memplan_poison(sl, j, sl->vals[j]);
        spare_put(sl, sl->vals[j]);
        sl->vals[j] = NULL;
        if (sl->dev) /* or its value on a GPU (exec_device.c) */
            wf__exec_device_drop(sl, j);
    }
}

int wf__slot_reinfer(wf__slot *sl, const wf_node *n, wf_tensor *const *in, wf_dtype *dts,
                     wf_shape *shapes, wf_dtype *dt, wf_shape *shape)
{
    for (int k = 0; k < n->n_inputs; k++) {
        dts[k] = in[k]->dtype;
        shapes[k] = in[k]->shape;
    }
    int rc = wf__op_infer(n, dts, shapes, dt, shape);
    if (rc < 0) {
        /* wf__op_infer()'s message already names the node: keep it whole. */
        char why[WF_ERRMSG_MAX];
        snprintf(why, sizeof why, "%s", wf_last_errmsg());
        wf__slot_fail_msg(sl, rc, why);
    }
    return rc;
}

#define STACK_INPUTS 8

/* The CPU executor's side of wf__node_run() (core/op.h): outputs from the memory plan's
 * arena, an inline run's spare values or the session's pool; variables made writable under
 * the session's lock. */
typedef struct cpu_node {
    wf__slot *sl;
    int i;
} cpu_node;

static wf_tensor *cpu_alloc(void *arg, const wf_node *n, wf_dtype dt, const wf_shape *shape)
{
    const cpu_node *c = arg;
    wf__slot *sl = c->sl;
    wf_tensor *out = wf__memplan_out(sl, c->i, dt, *shape);
    if (!out && sl->n_spare)
        out = spare_take(sl, dt, *shape);
    if (!out)
        out = wf__pool_tensor_alloc(sl->plan->sess->pool, dt, *shape);
    /* A node that may finish later has its value in place before its kernel starts: the
     * completion (wf__slot_node_complete(), on another thread, possibly before the kernel returns)
     * reads it. */
    if (n->op->flags & WF_OP_ASYNC)
        sl->vals[c->i] = out;
    return out;
}

static int cpu_writable(void *arg, const wf_node *n, wf_tensor **in)
{
    (void)n;
    const cpu_node *c = arg;
    return take_writable(c->sl, c->i, in);
}

static const wf__node_env cpu_env = { .alloc = cpu_alloc, .writable = cpu_writable };

/* What a node does once its value exists: drops one use of each input, and lets a value
 * nobody reads go at once (a target run for its effects). */
static void node_after(wf__slot *sl, int i)
{
    const wf__plan *p = sl->plan;
    for (int32_t e = p->in_off[i]; e < p->in_off[i + 1]; e++)
        drop_use(sl, p->in_idx[e]);
    if (atomic_load_explicit(&sl->uses[i], memory_order_relaxed) == 0) {
        spare_put(sl, sl->vals[i]);
        sl->vals[i] = NULL;
        if (sl->dev)
            wf__exec_device_drop(sl, i);
    }
}

/* How a node whose kernel pended (WF_OP_ASYNC: a recv waiting for the network, a copy to
 * the host waiting for its device) finishes: called once by the kernel's completion (the
 * transport's or the device's actor), it does what the task would have done after the
 * kernel and finishes the node's task (WF_TASK_LATER): one mechanism for every node that
 * finishes elsewhere. */
void wf__slot_node_complete(void *token, int rc)
{
    const wf__task_arg *a = token;
    wf__slot *sl = a->slot;
    int i = a->index;
    if (rc < 0)
        rc = wf__slot_fail(sl, sl->plan->nodes[i], rc, wf_last_errmsg());
    else
        node_after(sl, i);
    int r2 = wf_taskgraph_complete(sl->tg, i, rc < 0 ? rc : 0);
    (void)r2; /* fails only for a graph that is not running, which waits for this node */
}

static int run_kernel(wf__slot *sl, int i)
{
    const wf__plan *p = sl->plan;
    const wf_node *n = p->nodes[i];
    const int32_t *idx = p->in_idx + p->in_off[i];
    int n_in = n->n_inputs;
    wf_tensor *in_stack[STACK_INPUTS], **in = in_stack;
    wf_dtype dt_stack[STACK_INPUTS], *dts = dt_stack;
    wf_shape sh_stack[STACK_INPUTS], *shapes = sh_stack;
    if (n_in > STACK_INPUTS) {
        in = malloc((size_t)n_in * sizeof *in);
        dts = malloc((size_t)n_in * sizeof *dts);
        shapes = malloc((size_t)n_in * sizeof *shapes);
    }
    int rc = 0;
    wf_tensor *out = NULL;
    if (!in || !dts || !shapes) {
        rc = wf__slot_fail(sl, n, WF_ENOMEM, "no memory for the inputs");
        goto done;
    }
    for (int k = 0; k < n_in; k++) {
        in[k] = sl->vals[idx[k]];
        if (!in[k]) { /* an internal error: a value released too early or never made */
            rc = wf__slot_fail(sl, n, WF_EINVAL, "an input has no value");
            goto done;
        }
    }
    wf_dtype dt = n->dtype;
    wf_shape shape = n->shape;
    if (p->reinfer[i] && (rc = wf__slot_reinfer(sl, n, in, dts, shapes, &dt, &shape)) < 0)
        goto done;
    wf_kernel_ctx ctx = {
        .rt = sl->plan->sess->rt, .step = sl->step, .xfer_step = sl->xfer_step, .data = p->kdata[i]
    };
    if (n->op->flags & WF_OP_ASYNC) { /* never in inline plans (plan.c) */
        ctx.complete = wf__slot_node_complete;
        ctx.token = &sl->args[i];
    }
    char msg[WF_ERRMSG_MAX];
    rc = wf__node_run(&cpu_env, &(cpu_node){ sl, i }, p->kernel[i], &ctx, n, in, dt, &shape, NULL,
                      &out, msg, sizeof msg);
    if (rc < 0) {
        if (n->op->flags & WF_OP_ASYNC)
            sl->vals[i] = NULL; /* cpu_alloc()'s alias of the output wf__node_run() released */
        rc = wf__slot_fail_msg(sl, rc, msg);
        goto done;
    }
    /* WF_KERNEL_PENDING: the value (in 'sl->vals[i]' since cpu_alloc()) is still being
     * written, and wf__slot_node_complete() may already have run; successors wait for it
     * (WF_TASK_LATER). */
    if (!(n->op->flags & WF_OP_ASYNC))
        sl->vals[i] = out;
    out = NULL;
done:
    wf_tensor_release(out);
    if (in != in_stack) {
        free(in);
        free(dts);
        free(shapes);
    }
    return rc;
}

/* Runs plan node 'i' in the run of 'sl'. */
static int run_node(wf__slot *sl, int i)
{
    const wf__plan *p = sl->plan;
    switch (p->kind[i]) {
    case WF__PN_PLACEHOLDER: /* session.c set the feed before the run */
        break;
    case WF__PN_CONSTANT:
        sl->vals[i] = wf_tensor_retain(p->nodes[i]->value);
        break;
    case WF__PN_VARIABLE: {
        wf_session *s = p->sess;
        if (sl->dev && p->dev->pl.where[i]) { /* resident on a device (var_device.c) */
            int rc = wf__var_device_read(sl, i);
            if (rc < 0)
                return rc;
            break;
        }
        pthread_rwlock_rdlock(&s->var_lock);
        sl->vals[i] = wf_tensor_retain(s->var_vals[p->var[i]]);
        pthread_rwlock_unlock(&s->var_lock);
        break;
    }
    default: {
        /* A copy between devices, or a node placed on a GPU, runs through its device
         * (exec_device.c). */
        int rc = p->kind[i] == WF__PN_COPY        ? wf__exec_copy_node(sl, i)
                 : sl->dev && p->dev->pl.where[i] ? wf__exec_device_node(sl, i)
                                                  : run_kernel(sl, i);
        if (rc < 0)
            return rc;
        if (rc == WF_KERNEL_PENDING)
            return WF_TASK_LATER; /* wf__slot_node_complete() does the rest */
        node_after(sl, i);
        return 0;
    }
    }
    /* A value nobody reads (a target run for its effects) goes at once. */
    if (atomic_load_explicit(&sl->uses[i], memory_order_relaxed) == 0) {
        spare_put(sl, sl->vals[i]);
        sl->vals[i] = NULL;
        if (sl->dev)
            wf__exec_device_drop(sl, i);
    }
    return 0;
}

/* The task of plan node 'arg->index' in the run of 'arg->slot'. */
static int node_task(void *arg)
{
    const wf__task_arg *a = arg;
    return run_node(a->slot, a->index);
}

static int slot_make(wf__plan *p, wf__slot **out)
{
    wf__slot *sl = calloc(1, sizeof *sl);
    if (!sl)
        return wf__err(WF_ENOMEM, "wf_session_run: no memory for a run slot");
    sl->plan = p;
    int n = p->n, rc = 0;
    sl->args = malloc((size_t)(n ? n : 1) * sizeof *sl->args);
    sl->vals = calloc((size_t)(n ? n : 1), sizeof *sl->vals);
    sl->uses = calloc((size_t)(n ? n : 1), sizeof *sl->uses);
    if (!sl->args || !sl->vals || !sl->uses) {
        rc = wf__err(WF_ENOMEM, "wf_session_run: no memory for a run slot of %d nodes", n);
        goto fail;
    }
    if ((rc = wf__slot_dev_init(sl)) < 0) /* device values, when nodes run on a GPU */
        goto fail;
    if (p->run_inline) { /* wf__slot_run() needs no task graph */
        *out = sl;
        return 0;
    }
    if ((rc = wf_group_init(&sl->grp, p->sess->rt)) < 0)
        goto fail;
    sl->grp_ok = true;
    if ((rc = wf_taskgraph_create(p->sess->rt, &sl->tg)) < 0)
        goto fail;
    for (int i = 0; i < n; i++) {
        sl->args[i] = (wf__task_arg){ sl, i };
        int id = wf_taskgraph_add(sl->tg, node_task, &sl->args[i], p->nodes[i]->name);
        if (id < 0 || (rc = wf_taskgraph_set_kind(sl->tg, id, p->nodes[i]->op->name)) < 0) {
            rc = id < 0 ? id : rc;
            goto fail;
        }
    }
    /* Edges in the order of the destinations' priority (priority.c), so that each node's
     * successor list is sorted by priority, highest first, and the worker that finishes a
     * node keeps its most critical ready successor (sched/taskgraph.c). */
    for (int r = 0; r < n; r++) {
        int i = p->prio_order ? p->prio_order[r] : r;
        const wf_node *node = p->nodes[i];
        for (int32_t e = p->in_off[i]; e < p->in_off[i + 1]; e++)
            if ((rc = wf_taskgraph_precede(sl->tg, p->in_idx[e], i)) < 0)
                goto fail;
        for (int k = 0; k < node->n_control; k++)
            if ((rc = wf_taskgraph_precede(sl->tg, p->index_of[node->control[k]->id], i)) < 0)
                goto fail;
    }
    /* Orderings of the placement (placement/place.c: a fetched resident variable's copy after
     * its updates). */
    for (int k = 0; k < p->n_order; k++)
        if ((rc = wf_taskgraph_precede(sl->tg, p->order[2 * k], p->order[2 * k + 1])) < 0)
            goto fail;
    /* The memory plan's ordering edges: outputs that share bytes (runtime/compile/memplan.c). */
    for (int k = 0; p->mp && !(p->sess->flags & WF_SESSION_NO_MEMPLAN) && k < p->mp->m->n_edges;
         k++)
        if ((rc = wf_taskgraph_precede(sl->tg, p->mp->m->edges[2 * k],
                                       p->mp->m->edges[2 * k + 1])) < 0)
            goto fail;
    *out = sl;
    return 0;
fail:
    wf__slot_destroy(sl);
    return rc;
}

void wf__slot_destroy(wf__slot *sl)
{
    if (!sl)
        return;
    wf__slot_dev_free(sl);
    wf_taskgraph_destroy(sl->tg);
    if (sl->grp_ok)
        wf_group_deinit(&sl->grp);
    if (sl->vals)
        for (int i = 0; i < sl->plan->n; i++)
            wf_tensor_release(sl->vals[i]);
    for (int k = 0; k < sl->n_spare; k++)
        wf_tensor_release(sl->spare[k]);
    wf__memplan_slot_release(sl); /* after the values, which may hold planned tensors */
    free(sl->fed);
    free(sl->args);
    free(sl->vals);
    free((void *)sl->uses);
    free(sl);
}

int wf__slot_take(wf__plan *p, wf__slot **out)
{
    pthread_mutex_lock(&p->mu);
    for (;;) {
        if (p->free_slots) {
            wf__slot *sl = p->free_slots;
            p->free_slots = sl->next_free;
            pthread_mutex_unlock(&p->mu);
            *out = sl;
            return 0;
        }
        if (p->n_slots < p->max_slots)
            break;
        pthread_cond_wait(&p->cv, &p->mu);
    }
    /* Reserve a place and build outside the lock (a big plan takes milliseconds). */
    p->n_slots++;
    pthread_mutex_unlock(&p->mu);
    wf__slot *sl = NULL;
    int rc = slot_make(p, &sl);
    pthread_mutex_lock(&p->mu);
    if (rc < 0) {
        p->n_slots--;
        pthread_cond_signal(&p->cv);
    } else {
        /* At most 'max_slots' are made, so a free entry exists. */
        int k = 0;
        while (p->all_slots[k])
            k++;
        p->all_slots[k] = sl;
    }
    pthread_mutex_unlock(&p->mu);
    *out = sl;
    return rc;
}

void wf__slot_give(wf__slot *sl)
{
    wf__plan *p = sl->plan;
    pthread_mutex_lock(&p->mu);
    sl->next_free = p->free_slots;
    p->free_slots = sl;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

int wf__slot_run(wf__slot *sl)
{
    atomic_store_explicit(&sl->failed, 0, memory_order_relaxed);
    sl->err = 0;
    sl->errmsg[0] = '\0';
    wf__memplan_slot_ready(sl);
    if (sl->plan->run_inline) {
        /* Ascending plan index is a topological order (internal.h), control edges included
         * (core/graph.h: a control input is created first). The first failure stops the
         * run, as the task graph skips the nodes that had not started. */
        for (int i = 0; i < sl->plan->n; i++) {
            int rc = run_node(sl, i);
            if (rc < 0)
                return atomic_load_explicit(&sl->failed, memory_order_relaxed) ? sl->err : rc;
        }
        return 0;
    }
    int rc = wf_taskgraph_submit(sl->tg, &sl->grp);
    if (rc < 0) {
        snprintf(sl->errmsg, sizeof sl->errmsg, "%s", wf_taskgraph_errmsg(sl->tg));
        return rc;
    }
    rc = wf_group_wait(&sl->grp);
    if (rc < 0) {
        if (atomic_load_explicit(&sl->failed, memory_order_acquire))
            rc = sl->err;
        else
            snprintf(sl->errmsg, sizeof sl->errmsg, "%s", wf_group_errmsg(&sl->grp));
    }
    if (sl->dev) /* wait for the GPUs' work; drop the run's device values */
        rc = wf__exec_device_finish(sl, rc);
    return rc;
}
