/* examples/weft-train/stages.c: --placement FILE and the --dump-graph drawing of a
 * pipeline's stages (stages.h). Public API only. */
#include "stages.h"

#include <stdlib.h>
#include <string.h>

int wt_place_file_read(const char *path, int ranks, wt_place_file *f, char *err, size_t errlen)
{
    memset(f, 0, sizeof *f);
    snprintf(f->path, sizeof f->path, "%s", path);
    FILE *in = fopen(path, "r");
    if (!in) {
        snprintf(err, errlen, "--placement %s: cannot open it", path);
        return WF_EIO;
    }
    wf_cluster *c = NULL; /* one CPU per rank: what a device string must name */
    int rc = wf_cluster_create(&c);
    for (int r = 0; r < ranks && rc >= 0; r++)
        rc = wf_cluster_add_device(c, &(wf_cluster_device){ .rank = r, .kind = WF_PLACE_CPU });
    if (rc < 0)
        snprintf(err, errlen, "--placement: %s", wf_last_errmsg());
    char line[512];
    for (int ln = 1; rc >= 0 && fgets(line, sizeof line, in); ln++) {
        char name[128], dev[128], extra[8];
        if (!strchr(line, '\n') && !feof(in)) {
            snprintf(err, errlen, "%s:%d: the line is longer than %d characters", path, ln,
                     (int)sizeof line - 2);
            rc = WF_EINVAL;
            break;
        }
        int got = sscanf(line, " %127s %127s %7s", name, dev, extra);
        if (got <= 0 || name[0] == '#')
            continue;
        if (got != 2 || strlen(name) >= sizeof f->ent[0].name ||
            strlen(dev) >= sizeof f->ent[0].device) {
            snprintf(err, errlen,
                     "%s:%d: expected \"NAME DEVICE\" (a layer or node name, then "
                     "rank:K/cpu:0), got: %.*s",
                     path, ln, (int)strcspn(line, "\n"), line);
            rc = WF_EINVAL;
            break;
        }
        if ((rc = wf_cluster_find(c, dev)) < 0) {
            snprintf(err, errlen, "%s:%d: %s: %s", path, ln, name, wf_last_errmsg());
            break;
        }
        for (int i = 0; i < f->n && rc >= 0; i++)
            if (strcmp(f->ent[i].name, name) == 0) {
                snprintf(err, errlen, "%s:%d: %s is placed already on line %d", path, ln, name,
                         f->ent[i].line);
                rc = WF_EINVAL;
            }
        if (rc >= 0 && f->n == WT_PLACE_MAX) {
            snprintf(err, errlen, "%s:%d: more than %d entries", path, ln, WT_PLACE_MAX);
            rc = WF_EINVAL;
        }
        if (rc < 0)
            break;
        wt_place_ent *e = &f->ent[f->n++];
        snprintf(e->name, sizeof e->name, "%s", name);
        snprintf(e->device, sizeof e->device, "%s", dev);
        e->line = ln;
    }
    wf_cluster_destroy(c);
    fclose(in);
    return rc < 0 ? rc : 0;
}

const char *wt_place_file_layer(wt_place_file *f, const char *name)
{
    for (int i = 0; f && i < f->n; i++)
        if (strcmp(f->ent[i].name, name) == 0) {
            f->ent[i].used = true;
            return f->ent[i].device;
        }
    return NULL;
}

int wt_place_file_hint_nodes(const wt_place_file *f, const wf_graph *g, wf_place_hints *h,
                             const char *layers, char *err, size_t errlen)
{
    for (int i = 0; i < f->n; i++) {
        const wt_place_ent *e = &f->ent[i];
        if (e->used)
            continue;
        wf_node *n = wf_graph_find(g, e->name);
        if (!n) {
            snprintf(err, errlen,
                     "%s:%d: no layer or node is named '%s' (the layers: %s; node names as "
                     "--placement auto's plan prints them)",
                     f->path, e->line, e->name, layers);
            return WF_ENOTFOUND;
        }
        int rc = wf_place_hint(h, n, e->device);
        if (rc < 0) {
            snprintf(err, errlen, "%s:%d: %s", f->path, e->line, wf_last_errmsg());
            return rc;
        }
    }
    return 0;
}

/* Inputs that never cross: every rank is fed the batch and holds the variables and constants
 * (computed where they are read). */
static bool crosses(const wf_node *u)
{
    const char *op = wf_node_op(u);
    return strcmp(op, "placeholder") != 0 && strcmp(op, "variable") != 0 &&
           strcmp(op, "constant") != 0;
}

typedef struct node_id {
    const wf_node *n;
    int id;
} node_id;

static int by_node(const void *a, const void *b)
{
    const wf_node *x = ((const node_id *)a)->n, *y = ((const node_id *)b)->n;
    return x < y ? -1 : x > y;
}

/* The id of 'u' among the sorted 'ids' (inputs are always user nodes here). */
static int id_of(const node_id *ids, int n, const wf_node *u)
{
    node_id key = { u, -1 };
    const node_id *e = bsearch(&key, ids, (size_t)n, sizeof *ids, by_node);
    return e ? e->id : -1;
}

int wt_stages_dot(const wf_session *s, const wf_graph *g, int n_user, int stages, FILE *f)
{
    if (n_user < 1 || wf_session_pipeline_stage(s, wf_graph_node(g, 0)) == WF_EINVAL)
        return WF_EINVAL;
    int *st = malloc(sizeof *st * (size_t)n_user);
    node_id *ids = malloc(sizeof *ids * (size_t)n_user);
    unsigned long long *to = calloc((size_t)n_user, sizeof *to); /* stages a value is sent to */
    if (!st || !ids || !to) {
        free(st);
        free(ids);
        free(to);
        return WF_ENOMEM;
    }
    for (int id = 0; id < n_user; id++) {
        ids[id] = (node_id){ wf_graph_node(g, id), id };
        st[id] = wf_session_pipeline_stage(s, ids[id].n);
    }
    qsort(ids, (size_t)n_user, sizeof *ids, by_node);
    int pairs = 0; /* one per (value, reading stage) */
    for (int id = 0; id < n_user; id++) {
        const wf_node *v = wf_graph_node(g, id);
        for (int k = 0; k < wf_node_input_count(v); k++) {
            int u = id_of(ids, n_user, wf_node_input(v, k));
            if (u >= 0 && st[u] >= 0 && st[id] >= 0 && st[u] != st[id] &&
                crosses(wf_node_input(v, k)) && !(to[u] >> st[id] & 1)) {
                to[u] |= 1ull << st[id];
                pairs++;
            }
        }
    }
    fprintf(f,
            "digraph pipeline {\n  label=\"pipeline: %d stages, %d send/recv pairs (each once "
            "per micro-batch)\";\n  node [shape=box, fontsize=10];\n",
            stages, pairs);
    for (int k = -2; k < stages; k++) { /* -1: read on no stage, outside the clusters */
        if (k >= 0)
            fprintf(f, "  subgraph cluster_s%d {\n    label=\"stage %d: rank:%d/cpu:0\";\n", k, k,
                    k);
        else if (k == -2)
            fprintf(f, "  subgraph cluster_all {\n    label=\"every stage\";\n");
        for (int id = 0; id < n_user; id++) {
            const wf_node *v = wf_graph_node(g, id);
            if (st[id] == k)
                fprintf(f, "    n%d [label=\"%s\\n%s\"];\n", id, wf_node_name(v), wf_node_op(v));
        }
        if (k != -1)
            fprintf(f, "  }\n");
    }
    for (int id = 0; id < n_user; id++) {
        const wf_node *v = wf_graph_node(g, id);
        for (int k = 0; k < wf_node_input_count(v); k++) {
            int u = id_of(ids, n_user, wf_node_input(v, k));
            bool cross = u >= 0 && st[u] >= 0 && st[id] >= 0 && st[u] != st[id] &&
                         crosses(wf_node_input(v, k));
            fprintf(f, "  n%d -> n%d%s;\n", u, id,
                    cross ? " [color=red, style=dashed, label=\"send/recv\"]" : "");
        }
    }
    free(st);
    free(ids);
    free(to);
    return fprintf(f, "}\n") < 0 ? WF_EIO : 0;
}
