/* placement/pipeline_plan.c: the planner's stages for a pipeline (placement/pipeline.h,
 *   wf__pipeline_plan()).
 * Owns: the forward part of a training graph copied into a graph of its own at one
 *   micro-batch's rows, the cluster a pipeline plans over (one CPU per rank, the default
 *   links, each stage's memory cap), the planner's call (wf_plan_create()) and its result
 *   mapped back to the user's nodes, and the plan's text.
 * Why a copy: the planner splits the ops of a graph in creation order, but a training graph
 *   also holds the backward nodes (made after the whole forward) and the optimizer's updates;
 *   those follow the stage of what they differentiate (placement/pipeline.c), so only the
 *   forward part is planned, with the backward modelled by the planner's backward factor. In
 *   the copy a batch placeholder has the rows of the largest micro-batch, so every op's shape
 *   (and so its prior cost, its activation and transfer bytes) is that of one micro-batch.
 * Why the same plan on every rank: it depends only on the graph, the options and the cost
 *   table, which the ranks agree on (runtime/strategy.c compares the graph and the options;
 *   a cost table must be the same on every rank, e.g. rank 0's broadcast), and the planner
 *   is deterministic.
 * Not here: the split itself (stages.c), the rewrite that follows (pipeline.c). */
#include "internal.h"
#include "pipeline.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* fwd[id]: a per-micro-batch node that no gradient made, or what such a node reads
 * (variables, constants and what reads only them: the weights of the forward). */
static void mark_forward(const wf_graph *g, const uint8_t *kind, const uint8_t *backward,
                         uint8_t *fwd)
{
    int n = wf_graph_node_count(g);
    for (int id = 0; id < n; id++)
        fwd[id] = kind[id] == WF__KIND_REPLICA && !backward[id];
    for (int id = n - 1; id >= 0; id--) {
        const wf_node *v = wf_graph_node(g, id);
        for (int j = 0; fwd[id] && j < v->n_inputs; j++)
            fwd[v->inputs[j]->id] = 1;
    }
}

/* The copy of the forward nodes into 'h' ('copy[id]' or NULL); hints translated into 'hh'. */
static int copy_forward(const wf_graph *g, const wf__pipeline_opts *o, const uint8_t *fwd,
                        const wf_cluster *c, wf_graph *h, wf_place_hints *hh, wf_node **copy)
{
    int n = wf_graph_node_count(g);
    int64_t rows = (o->batch_rows + o->micro_batches - 1) / o->micro_batches;
    for (int id = 0; id < n; id++) {
        const wf_node *v = wf_graph_node(g, id);
        if (!fwd[id])
            continue;
        wf_node *inl[8], **in = v->n_inputs <= 8 ? inl : malloc(sizeof *in * (size_t)v->n_inputs);
        if (!in)
            return wf__err(WF_ENOMEM, "pipeline plan: no memory");
        for (int j = 0; j < v->n_inputs; j++)
            in[j] = copy[v->inputs[j]->id];
        copy[id] = v->op->flags & WF_OP_SOURCE
                       ? wf__place_copy_source(h, v, rows, false)
                       : wf__node_add_ex(h, v->op, v->name, in, v->n_inputs, v->attrs,
                                         (wf_srcloc){ v->file, v->line });
        if (in != inl)
            free(in);
        if (!copy[id])
            return wf__err(wf_graph_status(h) < 0 ? wf_graph_status(h) : WF_ENOMEM,
                           "pipeline plan: copying %s '%s' at %lld rows per micro-batch: %s",
                           v->op->name, v->name, (long long)rows, wf_graph_errmsg(h));
        if (!hh)
            continue; /* the profile's copy: no hints */
        int d = wf__place_hint_device(o->hints, c, v);
        char dev[64];
        if (d < -1)
            return d;
        if (d >= 0 &&
            wf_place_hint(hh, copy[id], wf_cluster_device_name(c, d, dev, sizeof dev)) < 0)
            return WF_ENOMEM;
    }
    return 0;
}

/* Optimizer state per weight byte: the bytes of the variables the forward does not read
 * (an optimizer's slots, its step counter) over those it reads (Adam: 2, plain SGD: 0). */
static double optimizer_factor(const wf_graph *g, const uint8_t *fwd)
{
    double weights = 0, slots = 0;
    for (int id = 0; id < wf_graph_node_count(g); id++) {
        const wf_node *v = wf_graph_node(g, id);
        if (v->op == &wf_op_variable)
            *(fwd[id] ? &weights : &slots) += wf__place_value_bytes(v);
    }
    return weights > 0 ? slots / weights : 0;
}

/* The links between neighbouring stages: measured (o->link_*) or the cluster's defaults. */
static int set_links(wf_cluster *c, const wf__pipeline_opts *o)
{
    int rc = 0;
    for (int a = 0; a < o->stages && o->link_latency_s && rc >= 0; a++)
        for (int b = a + 1; b < o->stages && rc >= 0; b++) {
            double lat = o->link_latency_s[a * o->stages + b];
            double bw = o->link_bytes_per_s[a * o->stages + b];
            rc = wf_cluster_set_link(c, a, b, lat, bw);
            if (rc < 0)
                rc = wf__err(rc, "pipeline plan: the link of ranks %d and %d: latency %g s, %g B/s",
                             a, b, lat, bw);
        }
    return rc < 0 ? rc : 0;
}

/* The plan's text: the costs' and links' sources, wf_plan_print()'s lines, then each stage's
 * nodes of the user's graph. */
static int plan_text(const wf_graph *g, const wf_cluster *c, const wf_plan *p, const int *pin,
                     const wf__pipeline_opts *o, char **text)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return wf__err(WF_ENOMEM, "pipeline plan: no memory for its text");
    fprintf(f, "pipeline plan (%s costs, %s, %d micro-batches of %lld rows at most):\n",
            o->costs ? "measured" : "prior", o->schedule == WF_SCHEDULE_1F1B ? "1F1B" : "GPipe",
            o->micro_batches,
            (long long)((o->batch_rows + o->micro_batches - 1) / o->micro_batches));
    if (o->plan_note)
        fprintf(f, "  %s\n", o->plan_note);
    for (int k = 0; k + 1 < wf_plan_stage_count(p); k++) {
        double lat = 0, bw = 0;
        if (wf_cluster_get_link(c, wf_plan_stage_device(p, k), wf_plan_stage_device(p, k + 1), &lat,
                                &bw) == 0)
            fprintf(f, "  link stage %d - %d: %s, latency %.2f us, %.3g GB/s\n", k, k + 1,
                    o->link_latency_s ? "measured" : "default", lat * 1e6, bw * 1e-9);
    }
    int rc = wf_plan_print(p, f);
    for (int k = 0; k < wf_plan_stage_count(p) && rc == 0; k++) {
        fprintf(f, "  stage %d nodes:", k);
        for (int id = 0; id < wf_graph_node_count(g); id++)
            if (pin[id] == k)
                fprintf(f, " %s", wf_graph_node(g, id)->name);
        fputc('\n', f);
    }
    if (fclose(f) != 0 || rc < 0) {
        free(buf);
        return wf__err(WF_ENOMEM, "pipeline plan: writing its text failed");
    }
    *text = buf;
    return 0;
}

int wf__pipeline_plan(const wf_graph *g, const wf__pipeline_opts *o, const uint8_t *kind,
                      const uint8_t *backward, int *pin, char **text)
{
    int n = wf_graph_node_count(g), rc = 0;
    size_t nn = (size_t)(n ? n : 1);
    uint8_t *fwd = calloc(nn, 1);
    wf_node **copy = calloc(nn, sizeof *copy);
    wf_cluster *c = NULL;
    wf_place_hints *hh = NULL;
    wf_plan *p = NULL;
    wf_graph *h = wf_graph_create(wf_graph_runtime(g), WF_STATIC);
    if (!fwd || !copy || !h || wf_cluster_create(&c) < 0 || wf_place_hints_create(&hh) < 0) {
        rc = wf__err(WF_ENOMEM, "pipeline plan: no memory for %d nodes", n);
        goto out;
    }
    for (int r = 0; r < o->stages && rc >= 0; r++)
        rc = wf_cluster_add_device(
            c, &(wf_cluster_device){ .rank = r, .kind = WF_PLACE_CPU, .mem_bytes = o->mem_bytes });
    if (rc < 0 || (rc = set_links(c, o)) < 0)
        goto out;
    mark_forward(g, kind, backward, fwd);
    if ((rc = copy_forward(g, o, fwd, c, h, hh, copy)) < 0)
        goto out;
    wf_plan_opts po = { .n_stages = o->stages,
                        .micro_batches = o->micro_batches,
                        .schedule = o->schedule,
                        .optimizer_factor = optimizer_factor(g, fwd),
                        .costs = o->costs,
                        .hints = hh,
                        .method = WF_PLAN_AUTO };
    if ((rc = wf_plan_create(h, c, &po, &p)) < 0) {
        char why[WF_ERRMSG_MAX];
        snprintf(why, sizeof why, "%s", wf_last_errmsg());
        rc = wf__err(rc, "pipeline plan (placement auto, %d stages): %s", o->stages, why);
        goto out;
    }
    for (int id = 0; id < n; id++) /* the ops' stages; sources go where they are read */
        pin[id] = copy[id] && !(copy[id]->op->flags & WF_OP_SOURCE)
                      ? wf_plan_node_stage(p, copy[id])
                      : -1;
    if (text)
        rc = plan_text(g, c, p, pin, o, text);
out:
    wf_plan_destroy(p);
    wf_place_hints_destroy(hh);
    wf_cluster_destroy(c);
    wf_graph_destroy(h);
    free(fwd);
    free(copy);
    return rc;
}

int wf__pipeline_plan_forward(const wf_graph *g, const wf__pipeline_opts *o, const uint8_t *kind,
                              const uint8_t *backward, wf_graph **out)
{
    int n = wf_graph_node_count(g), rc = 0;
    size_t nn = (size_t)(n ? n : 1);
    uint8_t *fwd = calloc(nn, 1);
    wf_node **copy = calloc(nn, sizeof *copy);
    wf_graph *h = wf_graph_create(wf_graph_runtime(g), WF_STATIC);
    *out = NULL;
    if (!fwd || !copy || !h) {
        rc = wf__err(WF_ENOMEM, "pipeline plan: no memory for %d nodes", n);
        goto out;
    }
    mark_forward(g, kind, backward, fwd);
    if ((rc = copy_forward(g, o, fwd, NULL, h, NULL, copy)) < 0)
        goto out;
    *out = h;
    h = NULL;
out:
    wf_graph_destroy(h);
    free(fwd);
    free(copy);
    return rc;
}
