/* runtime/dump.c: graph and plan dumps (text and Graphviz DOT) and compile statistics
 * (weft/runtime.h, "Graph dumps and compile statistics").
 * Owns: the two formats, written by one writer for a graph (every node, ids as references)
 *   and for a plan (the nodes that run after the passes, plan indices as references, each
 *   pass's work marked), and the statistics calls.
 * Why here and not core's wf__graph_dump(): a plan holds nodes the passes made, which the
 *   graph does not know, and the dump names devices and marks, which are runtime/'s.
 * Not here: the passes (compile/pass_*.c), compiling (compile/plan.c). */
#include "../ops/fused.h"
#include "compile/passes.h"
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What one writer call dumps: a graph's nodes, or a plan's. */
typedef struct dump_src {
    wf_node *const *nodes; /* in order */
    int n;
    const wf__plan *plan;                             /* NULL for a graph */
    const int *mark_folded, *mark_made, *mark_merged; /* per plan index (plans only) */
} dump_src;

/* The reference of node 'm' as an input or control of a node being dumped. */
static int ref_of(const dump_src *d, const wf_node *m)
{
    return d->plan ? d->plan->index_of[m->id] : m->id;
}

/* The node input 'k' of 'n' reads: in a plan, through the replacements. */
static const wf_node *input_of(const dump_src *d, int i, const wf_node *n, int k)
{
    if (!d->plan)
        return n->inputs[k];
    const wf__plan *p = d->plan;
    return p->nodes[p->in_idx[p->in_off[i] + k]];
}

static void dot_escaped(FILE *f, const char *s)
{
    for (; s && *s; s++) {
        if (*s == '"' || *s == '\\')
            fputc('\\', f);
        fputc(*s, f);
    }
}

static const char *device_str(const wf_node *n, char *buf, size_t size)
{
    if (n->device < 0) /* not placed: every kernel runs on the CPU */
        return "cpu";
    snprintf(buf, size, "device %d", n->device);
    return buf;
}

static void marks_str(const dump_src *d, int i, char *buf, size_t size)
{
    buf[0] = '\0';
    if (!d->plan)
        return;
    size_t k = 0;
    if (d->mark_folded[i] && k < size)
        k += (size_t)snprintf(buf + k, size - k, " folded");
    else if (d->mark_made[i] && d->nodes[i]->rt_flags == WF__RW_EPILOGUE && k < size) {
        char ep[48]; /* "epilogue(bias, relu)" (pass_epilogue.c), or "" for a relu_grad */
        wf__pass_epilogue_desc(d->nodes[i], ep, sizeof ep);
        k += (size_t)snprintf(buf + k, size - k, " %s", ep[0] ? ep : "epilogue");
    } else if (d->mark_made[i] && k < size)
        k += (size_t)snprintf(buf + k, size - k, " new");
    if (d->mark_merged[i] && k < size)
        snprintf(buf + k, size - k, " cse +%d", d->mark_merged[i]);
}

/* " @arena+4096": where the plan's memory plan (runtime/compile/memplan.c) puts node i's output;
 * "" when it is not planned (or the plan's shapes are known only at run time). */
static const char *arena_str(const dump_src *d, int i, char *buf, size_t size)
{
    buf[0] = '\0';
    if (d->plan && d->plan->mp && d->plan->mp->m->offset[i] >= 0)
        snprintf(buf, size, " @arena+%lld%s", (long long)d->plan->mp->m->offset[i],
                 d->plan->mp->m->inplace[i] ? " (in place)" : "");
    return buf;
}

static void write_nodes(FILE *f, const dump_src *d, int format)
{
    char arena[48];
    char shape[160], where[256], dev[32], marks[64];
    for (int i = 0; i < d->n; i++) {
        const wf_node *n = d->nodes[i];
        int self = d->plan ? i : n->id;
        wf_shape_str(n->shape, shape, sizeof shape);
        wf__node_where(n, where, sizeof where);
        marks_str(d, i, marks, sizeof marks);
        char members[512]; /* "fused(add, mul, relu)" for a fused node (ops/fused.h), else "" */
        if (wf__fused_describe(n, members, sizeof members) < 0)
            members[0] = '\0';
        if (format == WF_DUMP_DOT) {
            fprintf(f, "  n%d [label=\"", self);
            dot_escaped(f, n->name);
            fprintf(f, "\\n%s %s %s\\n%s ", n->op->name, wf_dtype_name(n->dtype), shape,
                    device_str(n, dev, sizeof dev));
            dot_escaped(f, where);
            fprintf(f, "%s%s", members[0] ? "\\n" : "", members);
            fprintf(f, "%s%s", marks[0] ? "\\n" : "", marks[0] ? marks + 1 : "");
            fprintf(f, "%s%s\"", arena_str(d, i, arena, sizeof arena)[0] ? "\\n" : "",
                    arena[0] ? arena + 1 : "");
            if (d->plan && (d->mark_folded[i] || d->mark_made[i]))
                fprintf(f, ", style=filled, fillcolor=\"%s\"",
                        d->mark_folded[i] ? "lightblue" : "lightyellow");
            else if (d->plan && d->mark_merged[i])
                fprintf(f, ", style=filled, fillcolor=\"palegreen\"");
            fprintf(f, "];\n");
            for (int k = 0; k < n->n_inputs; k++)
                fprintf(f, "  n%d -> n%d;\n",
                        d->plan ? d->plan->in_idx[d->plan->in_off[i] + k] : n->inputs[k]->id, self);
            for (int k = 0; k < n->n_control; k++)
                fprintf(f, "  n%d -> n%d [style=dashed];\n", ref_of(d, n->control[k]), self);
            continue;
        }
        fprintf(f, "%%%d %s: %s %s = %s(", self, n->name, wf_dtype_name(n->dtype), shape,
                n->op->name);
        for (int k = 0; k < n->n_inputs; k++) {
            const wf_node *m = input_of(d, i, n, k);
            int r = d->plan ? d->plan->in_idx[d->plan->in_off[i] + k] : m->id;
            fprintf(f, "%s%%%d %s", k ? ", " : "", r, m->name);
        }
        fprintf(f, ")%s%s", members[0] ? " " : "", members);
        for (int k = 0; k < n->n_control; k++) {
            int r = ref_of(d, n->control[k]);
            const wf_node *m = d->plan ? d->plan->nodes[r] : n->control[k];
            fprintf(f, "%s%%%d %s", k ? ", " : " after(", r, m->name);
        }
        fprintf(f, "%s on %s @ %s%s%s%s%s\n", n->n_control ? ")" : "",
                device_str(n, dev, sizeof dev), where, marks[0] ? "  [" : "",
                marks[0] ? marks + 1 : "", marks[0] ? "]" : "",
                arena_str(d, i, arena, sizeof arena));
    }
}

int wf_graph_dump(const wf_graph *g, FILE *f, int format)
{
    if (!g || !f)
        return wf__err(WF_EINVAL, "wf_graph_dump: %s is NULL", g ? "f" : "g");
    if (format != WF_DUMP_TEXT && format != WF_DUMP_DOT)
        return wf__err(WF_EINVAL, "wf_graph_dump: unknown format %d", format);
    int n = wf_graph_node_count(g);
    wf_node **nodes = malloc((size_t)(n ? n : 1) * sizeof *nodes);
    if (!nodes)
        return wf__err(WF_ENOMEM, "wf_graph_dump: no memory for %d nodes", n);
    for (int i = 0; i < n; i++)
        nodes[i] = wf_graph_node((wf_graph *)g, i);
    dump_src d = { .nodes = nodes, .n = n };
    if (format == WF_DUMP_DOT)
        fprintf(f, "digraph weft {\n  node [shape=box, fontname=monospace];\n");
    else
        fprintf(f, "# graph: %d nodes\n", n);
    write_nodes(f, &d, format);
    if (format == WF_DUMP_DOT)
        fprintf(f, "}\n");
    free(nodes);
    return ferror(f) ? wf__err(WF_EIO, "wf_graph_dump: a write failed") : 0;
}

static const char *kind_name(int kind)
{
    if (kind == WF__RW_FUSED)
        return "fused";
    if (kind == WF__RW_EPILOGUE)
        return "epilogue";
    if (kind == WF__RW_OPTIM_FUSED)
        return "optim_fused";
    if (kind == WF__RW_MIXED)
        return "mixed";
    return kind == WF__RW_FOLDED ? "folded" : kind == WF__RW_CSE ? "cse" : "simplified";
}

int wf_session_dump(wf_session *s, wf_node *const *fetches, int n_fetches, wf_node *const *targets,
                    int n_targets, FILE *f, int format)
{
    if (!s)
        return wf__err(WF_EINVAL, "wf_session_dump: session is NULL");
    if (!f || (format != WF_DUMP_TEXT && format != WF_DUMP_DOT))
        return wf__session_fail(s, WF_EINVAL, "wf_session_dump: %s",
                                f ? "unknown format" : "f is NULL");
    if (n_fetches < 0 || n_targets < 0 || (n_fetches && !fetches) || (n_targets && !targets))
        return wf__session_fail(s, WF_EINVAL, "wf_session_dump: bad fetches or targets");
    wf__plan *p = NULL;
    int rc = wf__session_plan(s, "wf_session_dump", fetches, n_fetches, targets, n_targets, &p);
    if (rc < 0)
        return rc;
    int n = p ? p->n : 0;
    int *marks = calloc((size_t)(3 * n + 1), sizeof *marks);
    if (!marks)
        return wf__session_fail(s, WF_ENOMEM, "wf_session_dump: no memory for %d nodes", n);
    dump_src d = { .nodes = p ? p->nodes : NULL,
                   .n = n,
                   .plan = p,
                   .mark_folded = marks,
                   .mark_made = marks + n,
                   .mark_merged = marks + 2 * n };
    for (int i = 0; i < n; i++) {
        const wf_node *m = p->nodes[i];
        if (m->id >= s->n_nodes) { /* a node a pass made */
            marks[n + i] = 1;
            marks[i] = m->rt_flags == WF__RW_FOLDED; /* wf__pass_make() */
        }
    }
    for (int k = 0; p && k < p->n_log; k++) {
        const wf__rewrite *r = &p->log[k];
        if (r->kind != WF__RW_CSE)
            continue;
        int32_t to = r->to->id < s->n_nodes ? p->index_of[r->to->id] : -1;
        for (int i = 0; to < 0 && i < n; i++)
            if (p->nodes[i] == r->to)
                to = i;
        if (to >= 0)
            marks[2 * n + to]++;
    }
    if (format == WF_DUMP_DOT) {
        fprintf(f, "digraph weft_plan {\n  node [shape=box, fontname=monospace];\n");
    } else if (p) {
        const wf_plan_stats *st = &p->stats;
        fprintf(f,
                "# plan: graph %d nodes, pruned %d, folded %d (%d replaced), cse %d (%d merged), "
                "simplified %d (%d replaced)\n",
                st->nodes_graph, st->nodes_after_prune, st->nodes_after_fold, st->n_folded,
                st->nodes_after_cse, st->n_merged, st->nodes_after_simplify, st->n_simplified);
        fprintf(f, "# epilogue: %d nodes after, %d matmuls with an epilogue\n",
                st->nodes_after_epilogue, st->n_epilogue);
        fprintf(f, "# fuse: %d nodes after, %d fused nodes of %d members\n", st->nodes_after_fuse,
                st->n_fused, st->n_fused_members);
    }
    write_nodes(f, &d, format);
    if (format == WF_DUMP_DOT)
        fprintf(f, "}\n");
    for (int k = 0; format == WF_DUMP_TEXT && p && k < p->n_log; k++) {
        const wf__rewrite *r = &p->log[k];
        fprintf(f, "# %s: %s (%s) -> %s (%s)\n", kind_name(r->kind), r->from->name,
                r->from->op->name, r->to->name, r->to->op->name);
    }
    free(marks);
    if (ferror(f))
        return wf__session_fail(s, WF_EIO, "wf_session_dump: a write failed");
    return 0;
}

int wf_session_stats(wf_session *s, wf_plan_stats *out)
{
    if (!s)
        return wf__err(WF_EINVAL, "wf_session_stats: session is NULL");
    if (!out)
        return wf__session_fail(s, WF_EINVAL, "wf_session_stats: out is NULL");
    pthread_mutex_lock(&s->plans_mu);
    *out = s->last_stats;
    out->nodes_graph = s->n_nodes;
    out->n_plans = s->n_plans;
    pthread_mutex_unlock(&s->plans_mu);
    wf__session_var_stats(s, out);
    return 0;
}

int wf_session_plan_stats(wf_session *s, wf_node *const *fetches, int n_fetches,
                          wf_node *const *targets, int n_targets, wf_plan_stats *out)
{
    if (!s)
        return wf__err(WF_EINVAL, "wf_session_plan_stats: session is NULL");
    if (!out)
        return wf__session_fail(s, WF_EINVAL, "wf_session_plan_stats: out is NULL");
    memset(out, 0, sizeof *out);
    if (n_fetches < 0 || n_targets < 0 || (n_fetches && !fetches) || (n_targets && !targets))
        return wf__session_fail(s, WF_EINVAL, "wf_session_plan_stats: bad fetches or targets");
    wf__plan *p = NULL;
    int rc =
        wf__session_plan(s, "wf_session_plan_stats", fetches, n_fetches, targets, n_targets, &p);
    if (rc < 0)
        return rc;
    if (p)
        *out = p->stats;
    out->nodes_graph = s->n_nodes;
    pthread_mutex_lock(&s->plans_mu);
    out->n_plans = s->n_plans;
    pthread_mutex_unlock(&s->plans_mu);
    wf__session_var_stats(s, out);
    return 0;
}
