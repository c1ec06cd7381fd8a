/* placement/tensor_split.c: tensor (intra-op) parallelism's rewrite, Megatron's pair:
 *   wf_tp_split_create() (weft/placement.h).
 * Owns: finding a two-matmul block (x·W1 (+ b1) -> an elementwise activation -> ·W2 (+ b2))
 *   from its variables, the checks that it can be split (shapes that divide, every inner value
 *   read only inside the block), and the copy of the graph for one rank of the group.
 * The split: W1 by columns and b1 with them (rank r holds columns [r H / N, (r + 1) H / N) of
 *   the hidden width H), W2 by rows (the same range), so rank r computes act(x W1_r + b1_r) W2_r,
 *   its part of the product, without any exchange; a tp_enter before the first matmul (its
 *   gradient all-reduces x's gradient, to which every rank's columns contribute) and a tp_reduce
 *   after the second (the sum over the ranks, in rank order: transport/tp_ops.c), then b2,
 *   added once, after the sum. The shards' initializers are the full ones' slices
 *   (wf_init.part_*), so the split model starts from the single-process model's values.
 * Keys: block k's pair uses edges edge + 2k (tp_enter's gradient) and edge + 2k + 1.
 * Not here: the ops (core/op_tp.c), their kernels (transport/tp_ops.c) and gradients
 *   (grad/grad_dist.c). */
#include "../core/op.h"
#include "../ops/table.h"
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { R_NONE, R_W1, R_B1, R_W2, R_M1, R_M2 };

/* A block found in the graph: its nodes. */
typedef struct tp_found {
    const wf_node *x, *w1, *b1, *m1, *h, *act, *m2, *w2, *b2, *out;
    int64_t hidden;
} tp_found;

typedef struct tp_split {
    const wf_graph *g;
    int n;
    int *uses;  /* per node id: how many inputs and control edges name it */
    int *first; /* per node id: the id of its first reader, or -1 */
    int *role;  /* R_* */
    int *block; /* the block of a role's node */
    wf_node **copy;
} tp_split;

static const char *shape_of(const wf_node *n, char *buf, size_t size)
{
    return wf_shape_str(n->shape, buf, size);
}

/* The one reader of 'n' (NULL: none, or more than one). */
static const wf_node *only_reader(const tp_split *s, const wf_node *n)
{
    return s->uses[n->id] == 1 ? wf_graph_node(s->g, s->first[n->id]) : NULL;
}

static int fail(const char *what, const wf_node *n, const char *detail)
{
    char sh[160];
    return wf__err(WF_EINVAL, "wf_tp_split_create: %s %s '%s' %s %s", what, n->op->name, n->name,
                   shape_of(n, sh, sizeof sh), detail);
}

static bool is_var(const wf_node *n)
{
    return n && n->op == &wf_op_variable;
}

/* The add of 'v' and bias 'b' (either order) that is v's one reader, or NULL. */
static const wf_node *bias_add(const tp_split *s, const wf_node *v, const wf_node *b)
{
    const wf_node *a = only_reader(s, v);
    if (!a || a->op != &wf_op_add || a->n_inputs != 2)
        return NULL;
    return (a->inputs[0] == v && a->inputs[1] == b) || (a->inputs[1] == v && a->inputs[0] == b)
               ? a
               : NULL;
}

static int find_block(const tp_split *s, const wf_tp_block *b, int k, int size, tp_found *f)
{
    char sh[160], sh2[160], why[400];
    memset(f, 0, sizeof *f);
    if (!is_var(b->w1) || !is_var(b->w2) || (b->b1 && !is_var(b->b1)) || (b->b2 && !is_var(b->b2)))
        return wf__err(WF_EINVAL,
                       "wf_tp_split_create: block %d: w1, w2 (and b1, b2 when given) must be "
                       "variables of the graph",
                       k);
    const wf_node *w1 = b->w1, *w2 = b->w2;
    if (w1->graph != s->g || w2->graph != s->g || (b->b1 && b->b1->graph != s->g) ||
        (b->b2 && b->b2->graph != s->g))
        return wf__err(WF_EINVAL, "wf_tp_split_create: block %d: a variable of another graph", k);
    if (w1->shape.rank != 2 || w2->shape.rank != 2)
        return fail("block weight", w1->shape.rank != 2 ? w1 : w2, "is not a matrix");
    int64_t hid = w1->shape.dims[1];
    if (hid % size) {
        snprintf(why, sizeof why, "has %lld columns, which do not divide into %d ranks",
                 (long long)hid, size);
        return fail("W1", w1, why);
    }
    if (w2->shape.dims[0] != hid) {
        snprintf(why, sizeof why, "has %lld rows, but W1 '%s' %s has %lld columns",
                 (long long)w2->shape.dims[0], w1->name, shape_of(w1, sh2, sizeof sh2),
                 (long long)hid);
        return fail("W2", w2, why);
    }
    const wf_node *m1 = only_reader(s, w1);
    if (!m1 || m1->op != &wf_op_matmul || m1->inputs[1] != w1 || m1->attrs->transpose_a ||
        m1->attrs->transpose_b)
        return fail("W1", w1, "is not read by exactly one matmul x·W1 (no transposes)");
    f->x = m1->inputs[0];
    f->m1 = f->h = m1;
    if (b->b1) {
        if (b->b1->shape.rank != 1 || b->b1->shape.dims[0] != hid) {
            snprintf(why, sizeof why, "is not [%lld], W1's columns", (long long)hid);
            return fail("b1", b->b1, why);
        }
        if (!(f->h = bias_add(s, m1, b->b1)) || s->uses[b->b1->id] != 1)
            return fail("b1", b->b1, "is not added (alone) to the first matmul's value");
    }
    const wf_node *act = only_reader(s, f->h);
    if (!act || act->n_inputs != 1 || !(act->op->flags & WF_OP_ELEMENTWISE))
        return fail("the first matmul's value", f->h,
                    "is not read by exactly one elementwise activation (relu, tanh, ...)");
    const wf_node *m2 = only_reader(s, act);
    if (!m2 || m2->op != &wf_op_matmul || m2->inputs[0] != act || m2->inputs[1] != w2 ||
        m2->attrs->transpose_a || m2->attrs->transpose_b || s->uses[w2->id] != 1)
        return fail("the activation", act,
                    "is not read by exactly one matmul act·W2 "
                    "(no transposes), W2 read by it alone");
    f->w1 = w1;
    f->w2 = w2;
    f->b1 = b->b1;
    f->act = act;
    f->m2 = f->out = m2;
    f->hidden = hid;
    if (b->b2) {
        if (b->b2->shape.rank != 1 || b->b2->shape.dims[0] != w2->shape.dims[1]) {
            snprintf(why, sizeof why, "is not [%lld], W2 '%s' %s's columns",
                     (long long)w2->shape.dims[1], w2->name, shape_of(w2, sh, sizeof sh));
            return fail("b2", b->b2, why);
        }
        if (!(f->out = bias_add(s, m2, b->b2)))
            return fail("b2", b->b2, "is not added (alone) to the second matmul's value");
        f->b2 = b->b2;
    }
    return 0;
}

static void split_free(tp_split *s)
{
    free(s->uses);
    free(s->first);
    free(s->role);
    free(s->block);
    free(s->copy);
}

static int copy_fail(wf_graph *h, const wf_node *n)
{
    int code = wf_graph_status(h);
    return wf__err(code < 0 ? code : WF_ENOMEM, "wf_tp_split_create: copying %s '%s': %s",
                   n->op->name, n->name, wf_graph_errmsg(h));
}

/* Rank 'rank's shard of variable 'v': 'axis' split into 'size' parts. */
static wf_node *shard_var(wf_graph *h, const wf_node *v, int axis, int rank, int size)
{
    wf_shape sh = v->attrs->shape;
    int64_t full = sh.dims[axis], part = full / size;
    sh.dims[axis] = part;
    wf_init init = wf_init_part(v->attrs->init, axis, (int64_t)rank * part, full);
    wf_set_source_location(v->file, v->line);
    return (wf_variable)(h, v->name, v->attrs->dtype, sh, init);
}

static wf_node *add_named(wf_graph *h, const wf_op_def *op, const wf_node *like, const char *suffix,
                          wf_node *in, int size, int edge)
{
    char name[512];
    snprintf(name, sizeof name, "%s/%s", like->name, suffix);
    wf_attrs a = { 0 };
    a.peer = size;
    a.edge = edge;
    return wf__node_add_ex(h, op, wf_graph_find(h, name) ? NULL : name, &in, 1, &a,
                           (wf_srcloc){ like->file, like->line });
}

static int copy_graph(tp_split *s, int rank, int size, int edge, wf_graph *h)
{
    wf_node *inl[8];
    for (int id = 0; id < s->n; id++) {
        const wf_node *n = wf_graph_node(s->g, id);
        int role = s->role[id];
        wf_node *x = NULL;
        if (role == R_W1)
            x = shard_var(h, n, 1, rank, size);
        else if (role == R_B1)
            x = shard_var(h, n, 0, rank, size);
        else if (role == R_W2)
            x = shard_var(h, n, 0, rank, size);
        else if (n->op->flags & WF_OP_SOURCE)
            x = wf__place_copy_source(h, n, 0, true);
        else {
            wf_node **in = n->n_inputs <= 8 ? inl : malloc((size_t)n->n_inputs * sizeof *in);
            if (!in)
                return wf__err(WF_ENOMEM, "wf_tp_split_create: no memory");
            for (int i = 0; i < n->n_inputs; i++)
                in[i] = s->copy[n->inputs[i]->id];
            if (role == R_M1) /* f: identity forward, all-reduced gradient */
                in[0] = add_named(h, &wf_op_tp_enter, n, "tp_enter", in[0], size,
                                  edge + 2 * s->block[id]);
            if (in[0])
                x = wf__node_add_ex(h, n->op, n->name, in, n->n_inputs, n->attrs,
                                    (wf_srcloc){ n->file, n->line });
            if (x && role == R_M2) /* g: the sum over the ranks, before b2 */
                x = add_named(h, &wf_op_tp_reduce, n, "tp_reduce", x, size,
                              edge + 2 * s->block[id] + 1);
            if (in != inl)
                free(in);
        }
        if (!x)
            return copy_fail(h, n);
        for (int i = 0; i < n->n_control; i++)
            if (wf__node_add_control(x, s->copy[n->control[i]->id]) < 0)
                return copy_fail(h, n);
        s->copy[id] = x;
    }
    return 0;
}

int wf_tp_split_create(const wf_graph *g, const wf_tp_block *blocks, int n_blocks, int rank,
                       int size, int edge, wf_graph **out)
{
    if (!out)
        return wf__err(WF_EINVAL, "wf_tp_split_create: NULL out");
    *out = NULL;
    if (!g || !blocks || n_blocks < 1)
        return wf__err(WF_EINVAL, "wf_tp_split_create: NULL graph or no block (%d)", n_blocks);
    if (size < 1 || rank < 0 || rank >= size)
        return wf__err(WF_EINVAL,
                       "wf_tp_split_create: rank %d of a tensor-parallel group of %d ranks "
                       "(ranks 0 .. size - 1)",
                       rank, size);
    if (edge < 0 || edge + 2 * n_blocks > (1 << 15))
        return wf__err(WF_EINVAL,
                       "wf_tp_split_create: edges %d .. %d (2 per block) are not in 0 .. %d", edge,
                       edge + 2 * n_blocks - 1, (1 << 15) - 1);
    if (wf_graph_mode(g) != WF_STATIC)
        return wf__err(WF_EINVAL, "wf_tp_split_create: the graph is eager");
    tp_split s = { .g = g, .n = wf_graph_node_count(g) };
    size_t n = (size_t)(s.n ? s.n : 1);
    s.uses = calloc(n, sizeof *s.uses);
    s.first = malloc(n * sizeof *s.first);
    s.role = calloc(n, sizeof *s.role);
    s.block = calloc(n, sizeof *s.block);
    s.copy = calloc(n, sizeof *s.copy);
    tp_found *f = calloc((size_t)n_blocks, sizeof *f);
    int rc = 0;
    if (!s.uses || !s.first || !s.role || !s.block || !s.copy || !f)
        rc = wf__err(WF_ENOMEM, "wf_tp_split_create: no memory for %d nodes", s.n);
    for (int id = 0; rc == 0 && id < s.n; id++)
        s.first[id] = -1;
    for (int id = 0; rc == 0 && id < s.n; id++) {
        const wf_node *v = wf_graph_node(g, id);
        if (v->op->n_assign > 0 || v->grad_of >= 0)
            rc = wf__err(WF_EINVAL,
                         "wf_tp_split_create: %s '%s' is an update or a gradient: split the "
                         "forward graph, then add the gradients and the optimizer to the "
                         "rank's graph",
                         v->op->name, v->name);
        for (int i = 0; i < v->n_inputs + v->n_control; i++) {
            const wf_node *u = i < v->n_inputs ? v->inputs[i] : v->control[i - v->n_inputs];
            if (s.uses[u->id]++ == 0)
                s.first[u->id] = id;
        }
    }
    for (int k = 0; rc == 0 && k < n_blocks; k++) {
        if ((rc = find_block(&s, &blocks[k], k, size, &f[k])) < 0)
            break;
        const wf_node *mine[] = { f[k].w1, f[k].b1, f[k].w2, f[k].m1, f[k].m2 };
        const int roles[] = { R_W1, R_B1, R_W2, R_M1, R_M2 };
        for (int j = 0; j < 5; j++) {
            if (!mine[j])
                continue;
            if (s.role[mine[j]->id]) {
                rc = wf__err(WF_EINVAL, "wf_tp_split_create: %s '%s' is in two blocks",
                             mine[j]->op->name, mine[j]->name);
                break;
            }
            s.role[mine[j]->id] = roles[j];
            s.block[mine[j]->id] = k;
        }
    }
    wf_graph *h = NULL;
    if (rc == 0 && !(h = wf_graph_create(wf_graph_runtime(g), WF_STATIC)))
        rc = wf__err(WF_ENOMEM, "wf_tp_split_create: no memory for the rank's graph");
    if (rc == 0)
        rc = copy_graph(&s, rank, size, edge, h);
    if (rc < 0)
        wf_graph_destroy(h);
    else
        *out = h;
    free(f);
    split_free(&s);
    return rc;
}
