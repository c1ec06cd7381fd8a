/* placement/pipeline.c: the pipeline rewrite (placement/pipeline.h).
 * Owns: the stage of every node (the forward's from the hints, or from the planner:
 *   pipeline_plan.c; an update of a variable that several stages read on each of them),
 *   this rank's compute order from the schedule, the orderings that make each
 *   micro-batch part (its forward or its backward nodes on this stage) wait for the part
 *   before it, and which sends a run needs (wf__pipeline_sends()).
 * Why the data-parallel rewrite does the copying: micro-batches are shards, and the step's
 *   gradient is the same fixed tree sum (dp_reduce) over them, so a pipeline trains bit for
 *   bit as one process with m shards; that rewrite only learns to skip other stages' nodes
 *   and to put send/recv where a micro-batch's value crosses.
 * Why orderings: the executor runs what is ready; they make it follow the schedule (1F1B's
 *   backward of micro-batch i before the forward of i + p), which bounds the activations
 *   alive. A part's entry nodes (no input in the part) wait for the previous part's sinks (no
 *   reader in it), so the whole part runs after the whole previous one.
 * Why not control edges: a control edge pulls its predecessor into every run of its
 *   successor, so a forward-only run (an evaluation) would run backward too, and wait for
 *   gradients that no stage sends in it. The orderings are pairs that a plan keeps only when
 *   both ends are in it (runtime/strategy.c adds them to the plan's orderings).
 * Not here: copying shards and buckets (replicate.c), the action lists (schedule.c). */
#include "pipeline.h"

#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Stages of every node (see pipeline.h); kinds from wf__replicate_kinds(). A batch
 * placeholder is on the stage of its first reader (each rank is fed the whole batch, so
 * only the micro-batches another stage reads cross). A global node that is no update (what
 * reads the reduced gradients: clipping by the global norm) is on the stage of its largest
 * input (the later one of equal sizes): a gradient's square and its clipped value stay with
 * the gradient, the sum of the squares and the scale go to the last stage, and only those
 * scalars cross, once per step. */
enum { PENDING = -3 };

static int assign(const wf_graph *g, const wf__pipeline_opts *o, const uint8_t *kind,
                  const int *pin, int *stage)
{
    wf_cluster *c = NULL;
    int rc = wf_cluster_create(&c);
    for (int r = 0; r < o->stages && rc >= 0; r++)
        rc = wf_cluster_add_device(c, &(wf_cluster_device){ .rank = r, .kind = WF_PLACE_CPU });
    int n = wf_graph_node_count(g);
    for (int id = 0; id < n && rc >= 0; id++) {
        const wf_node *v = wf_graph_node(g, id);
        int s = -1;
        if (kind[id] == WF__KIND_SHARED) {
            stage[id] = WF__STAGE_SHARED;
            continue;
        }
        if (v->op->flags & WF_OP_SOURCE) { /* a batch: with its first reader, below */
            stage[id] = PENDING;
            continue;
        }
        int h = kind[id] != WF__KIND_REPLICA ? -1
                : pin                        ? pin[id] /* the planner's: device k is rank k */
                                             : wf__place_hint_device(o->hints, c, v);
        if (h < -1) {
            rc = h;
            break;
        }
        if (h >= 0) {
            s = wf_cluster_get_device(c, h)->rank;
        } else if (v->grad_of >= 0 && v->grad_of < id && stage[v->grad_of] >= 0) {
            s = stage[v->grad_of];
        } else {
            bool all_shared = true, by_size = kind[id] == WF__KIND_GLOBAL && !v->op->n_assign;
            int64_t most = -1;
            for (int j = 0; j < v->n_inputs; j++) {
                int sx = stage[v->inputs[j]->id];
                int64_t nx = wf_shape_numel(v->inputs[j]->shape);
                all_shared &= kind[v->inputs[j]->id] == WF__KIND_SHARED;
                if (by_size && sx >= 0 && (nx > most || (nx == most && sx > s))) {
                    most = nx; /* a step's value: with its largest input (see below) */
                    s = sx;
                } else if (!by_size) {
                    s = sx > s ? sx : s;
                }
            }
            if (kind[id] == WF__KIND_GLOBAL && all_shared)
                s = WF__STAGE_ALL;
            else if (s < 0)
                s = 0;
        }
        stage[id] = s;
    }
    for (int id = 0; id < n && rc >= 0; id++) {
        const wf_node *v = wf_graph_node(g, id);
        for (int j = 0; j < v->n_inputs && stage[id] >= 0; j++)
            if (stage[v->inputs[j]->id] == PENDING)
                stage[v->inputs[j]->id] = stage[id];
    }
    for (int id = 0; id < n; id++)
        if (stage[id] == PENDING) /* a batch no per-micro-batch node reads */
            stage[id] = 0;
    wf_cluster_destroy(c);
    return rc < 0 ? rc : 0;
}

/* A variable read on several stages (a tied embedding: the token table read by the first
 * stage's lookup and the last stage's head) is updated on every stage: each keeps a copy and
 * applies the same update to it from the same gradient, which crosses once per step from the
 * stage that reduces it (placement/replicate.c), so every copy keeps the same bits. An update
 * whose variable only its own stage reads stays there. */
static int spread_updates(const wf_graph *g, const wf__pipeline_opts *o, const uint8_t *kind,
                          int *stage)
{
    int n = wf_graph_node_count(g);
    uint64_t *runs = calloc((size_t)(n ? n : 1), sizeof *runs);
    if (!runs)
        return wf__err(WF_ENOMEM, "pipeline rewrite: no memory");
    uint64_t every = o->stages >= 64 ? ~0ull : (1ull << o->stages) - 1;
    for (int id = n - 1; id >= 0; id--) {
        const wf_node *v = wf_graph_node(g, id);
        if (kind[id] != WF__KIND_SHARED && !v->op->n_assign)
            runs[id] = stage[id] == WF__STAGE_ALL ? every : 1ull << stage[id];
        for (int j = 0; j < v->n_inputs + v->n_control; j++) {
            const wf_node *x = j < v->n_inputs ? v->inputs[j] : v->control[j - v->n_inputs];
            if (kind[x->id] == WF__KIND_SHARED)
                runs[x->id] |= runs[id];
        }
    }
    for (int id = 0; id < n; id++) {
        const wf_node *u = wf_graph_node(g, id);
        for (int j = 0; j < u->op->n_assign && stage[id] >= 0; j++)
            if (runs[u->inputs[j]->id] & ~(1ull << stage[id]))
                stage[id] = WF__STAGE_ALL;
    }
    free(runs);
    return 0;
}

/* backward[id]: a per-micro-batch node a gradient function made, or that reads one. */
static void mark_backward(const wf_graph *g, const uint8_t *kind, uint8_t *backward)
{
    int n = wf_graph_node_count(g);
    for (int id = 0; id < n; id++) {
        const wf_node *v = wf_graph_node(g, id);
        bool b = v->grad_of >= 0;
        for (int j = 0; j < v->n_inputs && !b; j++)
            b = kind[v->inputs[j]->id] == WF__KIND_REPLICA && backward[v->inputs[j]->id];
        backward[id] = kind[id] == WF__KIND_REPLICA && b;
    }
}

/* Stage o->stage's compute actions: order[k] = mb (forward) or -1 - mb (backward). */
static int compute_order(const wf__pipeline_opts *o, int *order)
{
    wf_pipe_schedule *sch = NULL;
    int rc = wf_pipe_schedule_create(o->schedule, o->stages, o->micro_batches, &sch);
    if (rc < 0)
        return rc;
    int na = 0, k = 0;
    const wf_pipe_action *a = wf_pipe_schedule_actions(sch, o->stage, &na);
    for (int i = 0; i < na; i++)
        if (a[i].op == WF_PIPE_FWD || a[i].op == WF_PIPE_BWD)
            order[k++] = a[i].op == WF_PIPE_FWD ? a[i].micro_batch : -1 - a[i].micro_batch;
    wf_pipe_schedule_destroy(sch);
    return k == 2 * o->micro_batches
               ? 0
               : wf__err(WF_EINVAL, "pipeline: stage %d has %d compute actions, not %d", o->stage,
                         k, 2 * o->micro_batches);
}

/* Appends the ordering 'before' -> 'after' to m->order. */
static int add_order(wf__replica_map *m, const wf_node *before, const wf_node *after)
{
    if (m->n_order == m->cap_order) {
        int cap = m->cap_order ? 2 * m->cap_order : 64;
        int *a = realloc(m->order, sizeof *a * 2 * (size_t)cap);
        if (!a)
            return wf__err(WF_ENOMEM, "pipeline rewrite: no memory");
        m->order = a;
        m->cap_order = cap;
    }
    m->order[2 * m->n_order] = before->id;
    m->order[2 * m->n_order++ + 1] = after->id;
    return 0;
}

/* Each part after the first waits for the one before it (see the file's header). */
static int order_parts(wf_graph *g, const wf__pipeline_opts *o, const uint8_t *kind,
                       const int *stage, const uint8_t *backward, const int *order,
                       wf__replica_map *m)
{
    int n = m->n, rc = 0;
    uint8_t *entry = calloc((size_t)(n ? n : 1), 1), *sink = calloc((size_t)(n ? n : 1), 1);
    if (!entry || !sink) {
        free(entry);
        free(sink);
        return wf__err(WF_ENOMEM, "pipeline rewrite: no memory");
    }
    for (int id = 0; id < n; id++)
        if (kind[id] == WF__KIND_REPLICA && stage[id] == o->stage)
            entry[id] = sink[id] = 1;
    for (int id = 0; id < n; id++) {
        const wf_node *v = wf_graph_node(g, id);
        if (!entry[id] && !sink[id])
            continue;
        for (int j = 0; j < v->n_inputs; j++) {
            int x = v->inputs[j]->id;
            if (kind[x] == WF__KIND_REPLICA && stage[x] == o->stage &&
                backward[x] == backward[id]) {
                entry[id] = 0; /* reads a node of its own part */
                sink[x] = 0;   /* read by one */
            }
        }
    }
    for (int p = 1; p < 2 * o->micro_batches && rc == 0; p++) {
        int i = order[p] >= 0 ? order[p] : -1 - order[p], bi = order[p] < 0;
        int q = order[p - 1] >= 0 ? order[p - 1] : -1 - order[p - 1], bq = order[p - 1] < 0;
        for (int e = 0; e < n && rc == 0; e++) {
            wf_node *c = entry[e] && backward[e] == bi ? m->shard[(size_t)i * n + e] : NULL;
            for (int s = 0; c && s < n && rc == 0; s++) {
                wf_node *before = sink[s] && backward[s] == bq ? m->shard[(size_t)q * n + s] : NULL;
                if (before)
                    rc = add_order(m, before, c);
            }
        }
    }
    free(entry);
    free(sink);
    return rc;
}

int wf__pipeline(wf_graph *g, const wf__pipeline_opts *o, wf__replica_map *m)
{
    memset(m, 0, sizeof *m);
    if (!g || !o)
        return wf__err(WF_EINVAL, "pipeline rewrite: NULL argument");
    if (o->stages < 1 || o->stages > 64 || o->stage < 0 || o->stage >= o->stages)
        return wf__err(WF_EINVAL, "pipeline: stage %d of %d stages (1 .. 64 stages)", o->stage,
                       o->stages);
    if (o->micro_batches < 1 || o->micro_batches > 64)
        return wf__err(WF_EINVAL, "pipeline: micro_batches is %d, not in 1 .. 64",
                       o->micro_batches);
    if (o->batch_rows < o->micro_batches)
        return wf__err(WF_EINVAL,
                       "pipeline: batch_rows is %lld, fewer than the %d micro-batches (set it to "
                       "the rows of the batch every run is fed)",
                       (long long)o->batch_rows, o->micro_batches);
    if (wf_graph_mode(g) != WF_STATIC)
        return wf__err(WF_EINVAL, "pipeline rewrite: the graph is eager");
    int n = wf_graph_node_count(g), rc;
    size_t nn = (size_t)(n ? n : 1);
    uint8_t *kind = calloc(nn, 1), *backward = calloc(nn, 1), *is_grad = calloc(nn, 1);
    int *stage = calloc(nn, sizeof *stage);
    int *order = calloc((size_t)2 * (size_t)o->micro_batches, sizeof *order);
    int *pin = o->planner ? calloc(nn, sizeof *pin) : NULL;
    wf_node *ref = NULL;
    if (!kind || !backward || !is_grad || !stage || !order || (o->planner && !pin)) {
        rc = wf__err(WF_ENOMEM, "pipeline rewrite: no memory for %d nodes", n);
        goto out;
    }
    if ((rc = wf__replicate_kinds(g, kind, is_grad, &ref)) < 0)
        goto out;
    mark_backward(g, kind, backward);
    if ((pin && (rc = wf__pipeline_plan(g, o, kind, backward, pin, o->plan_text)) < 0) ||
        (rc = assign(g, o, kind, pin, stage)) < 0 || (rc = spread_updates(g, o, kind, stage)) < 0 ||
        (rc = compute_order(o, order)) < 0)
        goto out;
    wf__replicate_opts ro = { .rank = 0,
                              .size = 1,
                              .shards = o->micro_batches,
                              .aggregation = o->aggregation,
                              .bucket_bytes = o->bucket_bytes,
                              .first_bucket_bytes = o->first_bucket_bytes,
                              .edge_base = o->edge_base,
                              .stage_of = stage,
                              .stage = o->stage,
                              .stages = o->stages,
                              .batch_rows = o->batch_rows,
                              .p2p_edge_base = 0,
                              .order = order,
                              .backward = backward };
    if ((rc = wf__replicate(g, &ro, m)) < 0)
        goto out;
    if ((rc = order_parts(g, o, kind, stage, backward, order, m)) < 0)
        wf__replica_map_free(m);
out:
    free(kind);
    free(backward);
    free(is_grad);
    free(stage);
    free(order);
    free(pin);
    return rc;
}

int wf__pipeline_forward_graph(const wf_graph *g, const wf__pipeline_opts *o, wf_graph **out)
{
    *out = NULL;
    int n = wf_graph_node_count(g), rc;
    size_t nn = (size_t)(n ? n : 1);
    uint8_t *kind = calloc(nn, 1), *backward = calloc(nn, 1), *is_grad = calloc(nn, 1);
    wf_node *ref = NULL;
    if (!kind || !backward || !is_grad)
        rc = wf__err(WF_ENOMEM, "pipeline plan: no memory for %d nodes", n);
    else if ((rc = wf__replicate_kinds(g, kind, is_grad, &ref)) == 0) {
        mark_backward(g, kind, backward);
        rc = wf__pipeline_plan_forward(g, o, kind, backward, out);
    }
    free(kind);
    free(backward);
    free(is_grad);
    return rc < 0 ? rc : 0;
}

int wf__pipeline_sends(const wf_graph *g, const wf__replica_map *m, wf_node *const *req, int n_req,
                       wf_node **out)
{
    int n = m->n, top = 0, k = 0;
    size_t nn = (size_t)(n ? n : 1);
    uint8_t *mark = calloc(nn, 1), *direct = calloc(nn, 1);
    uint64_t *need = calloc(nn, sizeof *need);
    int *stack = malloc(nn * sizeof *stack);
    if (!mark || !direct || !need || !stack) {
        free(mark);
        free(direct);
        free(need);
        free(stack);
        return wf__err(WF_ENOMEM, "pipeline: no memory for %d nodes", n);
    }
    for (int i = 0; i < n_req; i++) {
        const wf_node *r = req[i];
        if (!r || r->graph != g || r->id >= n || mark[r->id])
            continue;
        direct[r->id] = mark[r->id] = 1;
        stack[top++] = r->id;
    }
    while (top > 0) {
        const wf_node *v = wf_graph_node(g, stack[--top]);
        for (int j = 0; j < v->n_inputs + v->n_control; j++) {
            const wf_node *x = j < v->n_inputs ? v->inputs[j] : v->control[j - v->n_inputs];
            if (!mark[x->id]) {
                mark[x->id] = 1;
                stack[top++] = x->id;
            }
        }
    }
    for (int id = 0; id < n; id++) {
        const wf_node *v = wf_graph_node(g, id);
        int sv = m->stage[id];
        for (int j = 0; mark[id] && (sv >= 0 || sv == WF__STAGE_ALL) && j < v->n_inputs; j++) {
            int x = v->inputs[j]->id, sx = m->stage[x];
            if (sx >= 0 && sx != sv) /* an update of every stage: each other stage reads it */
                need[x] |= sv == WF__STAGE_ALL ? ~(1ull << sx) : 1ull << sv;
        }
    }
    for (int i = 0; i < m->n_sends; i++) {
        int src = m->send_src[i], dst = m->send_dst[i];
        if (dst < 0 ? direct[src] : (need[src] >> dst & 1))
            out[k++] = m->sends[i];
    }
    free(mark);
    free(direct);
    free(need);
    free(stack);
    return k;
}
