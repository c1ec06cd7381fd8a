/* placement/hints.c: user hints: a node, or a scope of nodes, pinned to a device string.
 * Owns: wf_place_hints_*, wf_place_hint(), the scopes, and resolving a node's hint against a
 *   cluster (wf__place_hint_device()).
 * Why a scope is a range of node ids: a graph's nodes are numbered in creation order and
 *   never removed, so "every node made between begin and end" is exactly [first, last).
 * Not here: what the planner does with a pinned node (stages.c). */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

int wf_place_hints_create(wf_place_hints **out)
{
    if (!out)
        return wf__err(WF_EINVAL, "wf_place_hints_create: NULL out");
    *out = calloc(1, sizeof **out);
    return *out ? 0 : wf__err(WF_ENOMEM, "wf_place_hints_create: no memory");
}

void wf_place_hints_destroy(wf_place_hints *h)
{
    if (!h)
        return;
    free(h->ents);
    free(h);
}

static int push(wf_place_hints *h, int first, int last, bool scope, const char *device)
{
    wf_place_hint_ent e = { first, last, scope, { 0 }, { 0, 0, 0 } };
    if (strlen(device) >= sizeof e.device)
        return wf__err(WF_EINVAL, "hint: device string '%.40s...' is longer than %zu bytes", device,
                       sizeof e.device - 1);
    int rc = wf__place_parse(device, &e.spec);
    if (rc < 0)
        return rc;
    strcpy(e.device, device);
    if (h->n == h->cap) {
        int cap = h->cap ? 2 * h->cap : 16;
        wf_place_hint_ent *p = realloc(h->ents, sizeof *p * (size_t)cap);
        if (!p)
            return wf__err(WF_ENOMEM, "hint: no memory");
        h->ents = p;
        h->cap = cap;
    }
    h->ents[h->n++] = e;
    return 0;
}

int wf_place_hint(wf_place_hints *h, const wf_node *n, const char *device)
{
    if (!h || !n || !device)
        return wf__err(WF_EINVAL, "wf_place_hint: NULL argument");
    return push(h, n->id, n->id + 1, false, device);
}

int wf_place_scope_begin(wf_place_hints *h, const wf_graph *g, const char *device)
{
    if (!h || !g || !device)
        return wf__err(WF_EINVAL, "wf_place_scope_begin: NULL argument");
    if (h->scope_graph)
        return wf__err(WF_EINVAL,
                       "wf_place_scope_begin: a scope for '%s' is open (scopes do "
                       "not nest)",
                       h->scope_device);
    wf_place_spec sp;
    int rc = wf__place_parse(device, &sp);
    if (rc < 0)
        return rc;
    if (strlen(device) >= sizeof h->scope_device)
        return wf__err(WF_EINVAL, "wf_place_scope_begin: device string too long");
    strcpy(h->scope_device, device);
    h->scope_graph = g;
    h->scope_first = wf_graph_node_count(g);
    return 0;
}

int wf_place_scope_end(wf_place_hints *h, const wf_graph *g)
{
    if (!h || !g)
        return wf__err(WF_EINVAL, "wf_place_scope_end: NULL argument");
    if (h->scope_graph != g)
        return wf__err(WF_EINVAL, "wf_place_scope_end: %s",
                       h->scope_graph ? "the open scope is of another graph" : "no scope is open");
    int rc = push(h, h->scope_first, wf_graph_node_count(g), true, h->scope_device);
    if (rc == 0)
        h->scope_graph = NULL;
    return rc;
}

int wf__place_hint_device(const wf_place_hints *h, const wf_cluster *c, const wf_node *n)
{
    if (!h)
        return -1;
    const wf_place_hint_ent *best = NULL;
    for (int i = 0; i < h->n; i++) {
        const wf_place_hint_ent *e = &h->ents[i];
        if (n->id < e->first || n->id >= e->last)
            continue;
        if (!best || (best->scope && !e->scope) || best->scope == e->scope)
            best = e;
    }
    if (!best)
        return -1;
    int d = wf_cluster_find(c, best->device);
    if (d < 0) {
        char where[128], why[WF_ERRMSG_MAX];
        snprintf(why, sizeof why, "%s", wf_last_errmsg());
        return wf__err(d, "%s '%s' (%s): hint%s: %s", n->op->name, n->name,
                       wf__node_where(n, where, sizeof where), best->scope ? " of a scope" : "",
                       why);
    }
    return d;
}
