/* runtime/compile/pass_epilogue.c: GEMM epilogue fusion: matmul -> add(bias row) ->
 * activation, either tail optional, becomes one plan-owned matmul_epilogue node (ops/table.h),
 * whose kernel adds the bias and applies the activation to each output tile right after its
 * GEMM, while the tile is in cache (ops/matmul_cpu.c).
 * Owns: the pattern and its conditions:
 *   - the matmul is a matmul node of any float dtype (transpose flags and batch axes kept);
 *   - the add reads the matmul once and a bias row: the add's dtype and shape are the
 *     matmul's (the bias broadcasts nothing new), and the bias has rank <= the product's,
 *     1 in every dimension but the last, which is 1 or the product's (known) N. Which operand
 *     the bias was is kept (IEEE addition keeps the first operand's NaN payload);
 *   - the activation is relu, leaky_relu, gelu (erf), gelu_tanh, tanh, sigmoid or silu;
 *   - every interior node of the chain (the matmul; the add when an activation follows) is
 *     replaceable (passes.h), read as data by its successor in the chain only, not fetched
 *     or targeted, and whatever is ordered after it (control edges) has a later order key
 *     than the chain's last node (so the plan's order stays topological once those edges
 *     point at the fused node: passes.h, the epilogue exception);
 *   - the chain's last node is replaceable; it may be fetched (the fused node computes its
 *     value bit for bit);
 *   - the chain's nodes have one wf_node_set_device() hint (or none), which the fused node
 *     keeps.
 * Exactness: the kernel runs the elementwise kernels' own loops over each tile (ops/scalar.h),
 *   add before activation as the nodes ran them, so the pass changes no result bit.
 * Training graphs: the gradients of leaky_relu, gelu, gelu_tanh and silu read the activation's
 *   input (the add), so the add has two readers and only matmul + bias fuse; sigmoid's and
 *   tanh's gradients read the output, so their whole chain fuses. relu's gradient reads the
 *   input too, but 'x > 0' and 'relu(x) > 0' agree on every x (-0.0 and NaN included: relu
 *   keeps them, and neither is > 0), so the pass first makes each relu_grad(x, dy) whose x
 *   is the input of a live relu(x) read that relu's output instead: the same bits, the add
 *   is left with one reader, and matmul + bias + relu fuse whole (the pre-activation is
 *   then never stored). Not leaky_relu: alpha * x may round to -0.0 for a tiny negative x.
 * The sweep runs in reverse topological order, so the longest chain ending at a node is taken
 *   before a shorter one inside it (an activation's chain before its add's).
 * Not here: the framework (passes.c), the kernel (ops/matmul_cpu.c), elementwise fusion
 *   (which runs after this pass and so never takes these adds and activations). */
#include "../../ops/kernels.h"
#include "../../ops/table.h"
#include "passes.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct ep_state {
    wf__pass_ctx *c;
    int n;             /* working nodes when the pass began: the arrays below have 'n' entries */
    int32_t *readers;  /* per working id: input edges from live nodes (through find) */
    int32_t *ctrl_max; /* per working id: the latest order key of a live node ordered after it
                          (-1: none) */
    uint8_t *fetched;  /* per working id: a fetch or target resolves to it */
    uint8_t *used;     /* per working id: already part of a fused chain */
} ep_state;

/* The activations an epilogue takes: the op and its wf_unary_op. */
static const struct {
    const wf_op_def *op;
    int act;
} acts[] = {
    { &wf_op_relu, WF_UNARY_RELU },     { &wf_op_leaky_relu, WF_UNARY_LEAKY_RELU },
    { &wf_op_gelu, WF_UNARY_GELU_ERF }, { &wf_op_gelu_tanh, WF_UNARY_GELU_TANH },
    { &wf_op_tanh, WF_UNARY_TANH },     { &wf_op_sigmoid, WF_UNARY_SIGMOID },
    { &wf_op_silu, WF_UNARY_SILU },
};

/* The wf_unary_op of activation node 'n', or -1. */
static int act_of(const wf_node *n)
{
    for (size_t k = 0; k < sizeof acts / sizeof acts[0]; k++)
        if (n->op == acts[k].op)
            return acts[k].act;
    return -1;
}

const char *wf__pass_epilogue_desc(const wf_node *n, char *buf, size_t size)
{
    buf[0] = '\0';
    if (n->op != &wf_op_matmul_epilogue)
        return buf;
    wf_epilogue ep = wf__matmul_epilogue_of(n);
    const char *act = NULL;
    for (size_t k = 0; k < sizeof acts / sizeof acts[0]; k++)
        if (ep.act == acts[k].act)
            act = acts[k].op->name;
    bool bias = n->n_inputs > 2;
    snprintf(buf, size, "epilogue(%s%s%s)", bias ? "bias" : "", bias && act ? ", " : "",
             act ? act : "");
    return buf;
}

static bool float_dtype(wf_dtype dt)
{
    return dt == WF_F32 || dt == WF_F64 || dt == WF_BF16 || dt == WF_F16;
}

/* Makes a node of 'op' in the place of 'for_id' (wf__pass_make()), named for the dumps:
 * wf__pass_make() names it "<name>.simplified<k>"; "epilogue" is shorter, so the name is
 * rewritten in its own (plan-owned, writable) storage. It keeps the device the user placed
 * 'for_id' on (wf_node_set_device(); a chain's nodes share it: try_chain()). */
static wf_node *make(wf__pass_ctx *c, int32_t for_id, const wf_op_def *op, wf_node *const *in,
                     int n_in, const wf_attrs *at)
{
    const char *like = c->node[for_id]->name;
    wf_node *f = wf__pass_make(c, for_id, op, in, n_in, at, NULL, false, WF__RW_EPILOGUE);
    if (f) {
        char *name = (char *)f->name;
        snprintf(name, strlen(name) + 1, "%s.epilogue%d", like ? like : "?", f->id - c->n_orig);
        f->device = c->node[for_id]->device;
    }
    return f;
}

/* relu_grad(x, dy) -> relu_grad(relu(x), dy) where a live relu(x) comes earlier (file
 * header). Returns 0 or WF_ENOMEM. */
static int relu_grad_reads_output(wf__pass_ctx *c)
{
    int n = c->n;
    size_t cap = (size_t)(n ? n : 1);
    int32_t *ids = malloc(cap * sizeof *ids), *relu_of = malloc(cap * sizeof *relu_of);
    int rc = 0, m = 0;
    if (!ids || !relu_of)
        rc = wf__err(WF_ENOMEM, "wf_session_run: no memory to fuse the epilogues of %d nodes", n);
    if (rc == 0 && (m = wf__pass_order(c, ids)) < 0)
        rc = m;
    for (int i = 0; rc == 0 && i < n; i++)
        relu_of[i] = -1;
    for (int i = 0; rc == 0 && i < m; i++) { /* the first live relu of each input */
        const wf_node *r = c->node[ids[i]];
        if (r->op == &wf_op_relu && r->n_inputs == 1) {
            int32_t x = wf__pass_find(c, r->inputs[0]->id);
            if (relu_of[x] < 0)
                relu_of[x] = ids[i];
        }
    }
    for (int i = 0; rc == 0 && i < m; i++) {
        int32_t id = ids[i];
        const wf_node *g = c->node[id];
        if (g->op != &wf_op_relu_grad || g->n_inputs != 2 || !wf__pass_replaceable(g) ||
            wf__pass_find(c, id) != id)
            continue;
        wf_node *x = wf__pass_input(c, g, 0);
        int32_t r = x->id < n ? relu_of[x->id] : -1;
        /* Only where it may let a chain fuse: x an add or a matmul. */
        if (r < 0 || c->order[r] >= c->order[id] || (x->op != &wf_op_add && x->op != &wf_op_matmul))
            continue;
        wf_node *y = c->node[r];
        if (y->dtype != x->dtype || !wf_shape_equal(y->shape, x->shape))
            continue;
        wf_node *in[2] = { y, wf__pass_input(c, g, 1) };
        wf_node *ng = make(c, id, &wf_op_relu_grad, in, 2, g->attrs);
        if (ng)
            rc = wf__pass_replace(c, id, ng->id, WF__RW_EPILOGUE);
    }
    free(ids);
    free(relu_of);
    return rc;
}

/* True when interior node 'n' of a chain ending at 'tail' may vanish into it (file header). */
static bool interior_ok(const ep_state *st, const wf_node *n, const wf_node *tail)
{
    int32_t id = n->id;
    return id < st->n && !st->used[id] && wf__pass_replaceable(n) && st->readers[id] == 1 &&
           !st->fetched[id] && (st->ctrl_max[id] < 0 || st->ctrl_max[id] > st->c->order[tail->id]);
}

/* True when 'mm' is a matmul a chain may start with. */
static bool matmul_ok(const wf_node *mm)
{
    return mm->op == &wf_op_matmul && mm->n_inputs == 2 && float_dtype(mm->dtype);
}

/* True when 'bias' is a row that 'add' adds to product 'mm' without broadcasting it. */
static bool bias_ok(const wf_node *add, const wf_node *mm, const wf_node *bias)
{
    wf_shape ms = mm->shape, bs = bias->shape;
    if (bias->dtype != mm->dtype || add->dtype != mm->dtype || !wf_shape_equal(add->shape, ms) ||
        bs.rank < 1 || bs.rank > ms.rank)
        return false;
    for (int d = 0; d < bs.rank - 1; d++)
        if (bs.dims[d] != 1)
            return false;
    int64_t bn = bs.dims[bs.rank - 1], n = ms.dims[ms.rank - 1];
    return bn == 1 || (bn >= 0 && bn == n);
}

/* The chain ending at 'tail', fused; false when there is none (or it could not be made). */
static bool try_chain(ep_state *st, wf_node *tail, int *rc)
{
    wf__pass_ctx *c = st->c;
    if (tail->id >= st->n || st->used[tail->id] || !wf__pass_replaceable(tail))
        return false;
    wf_node *act = NULL, *add = NULL, *mm = NULL, *bias = NULL;
    bool bias_first = false;
    wf_node *x = tail;
    if (act_of(tail) >= 0 && tail->n_inputs == 1) {
        act = tail;
        x = wf__pass_input(c, act, 0);
        if (x->dtype != act->dtype || !wf_shape_equal(x->shape, act->shape) ||
            !interior_ok(st, x, tail))
            return false;
    }
    if (x->op == &wf_op_add && x->n_inputs == 2) {
        wf_node *l = wf__pass_input(c, x, 0), *r = wf__pass_input(c, x, 1);
        if (matmul_ok(l) && l != r && bias_ok(x, l, r)) {
            mm = l;
            bias = r;
        } else if (matmul_ok(r) && l != r && bias_ok(x, r, l)) {
            mm = r;
            bias = l;
            bias_first = true;
        } else {
            return false;
        }
        add = x;
        if (!wf__pass_replaceable(add) || !interior_ok(st, mm, tail))
            return false;
    } else if (act && matmul_ok(x)) {
        mm = x;
    } else {
        return false;
    }
    /* One placement hint for the chain: the fused node keeps it (make()). */
    if (mm->device != tail->device || (add && add->device != tail->device))
        return false;
    wf_attrs at;
    memset(&at, 0, sizeof at); /* padding too: equal bags compare equal (core/graph.h) */
    at.transpose_a = mm->attrs->transpose_a;
    at.transpose_b = mm->attrs->transpose_b;
    at.axis = act ? act_of(act) + 1 : 0;
    at.alpha = act ? act->attrs->alpha : 0;
    at.groups = bias_first ? 1 : 0;
    wf_node *in[3] = { wf__pass_input(c, mm, 0), wf__pass_input(c, mm, 1), bias };
    wf_node *f = make(c, tail->id, &wf_op_matmul_epilogue, in, bias ? 3 : 2, &at);
    if (!f)
        return false;
    wf_node *chain[3] = { mm, add, act };
    for (int k = 0; k < 3 && *rc == 0; k++)
        if (chain[k]) {
            st->used[chain[k]->id] = 1;
            *rc = wf__pass_replace(c, chain[k]->id, f->id, WF__RW_EPILOGUE);
        }
    return *rc == 0;
}

int wf__pass_epilogue(wf__pass_ctx *c)
{
    int rc = relu_grad_reads_output(c);
    if (rc < 0)
        return rc;
    /* The relu_grad nodes replaced above are no longer live; their inputs lost a reader. */
    wf__pass_prune(c);
    int n = c->n;
    size_t cap = (size_t)(n ? n : 1);
    ep_state st = { .c = c, .n = n };
    int32_t *ids = malloc(cap * sizeof *ids);
    st.readers = calloc(cap, sizeof *st.readers);
    st.ctrl_max = malloc(cap * sizeof *st.ctrl_max);
    st.fetched = calloc(cap, 1);
    st.used = calloc(cap, 1);
    int m = 0;
    if (!ids || !st.readers || !st.ctrl_max || !st.fetched || !st.used)
        rc = wf__err(WF_ENOMEM, "wf_session_run: no memory to fuse the epilogues of %d nodes", n);
    if (rc == 0 && (m = wf__pass_order(c, ids)) < 0)
        rc = m;
    for (int i = 0; rc == 0 && i < n; i++)
        st.ctrl_max[i] = -1;
    for (int i = 0; rc == 0 && i < m; i++) {
        const wf_node *v = c->node[ids[i]];
        for (int k = 0; k < v->n_inputs; k++)
            st.readers[wf__pass_find(c, v->inputs[k]->id)]++;
        for (int k = 0; k < v->n_control; k++) {
            int32_t r = wf__pass_find(c, v->control[k]->id);
            if (c->order[ids[i]] > st.ctrl_max[r])
                st.ctrl_max[r] = c->order[ids[i]];
        }
    }
    for (int k = 0; rc == 0 && k < c->n_key; k++)
        st.fetched[wf__pass_find(c, c->key[k])] = 1;
    /* Reverse topological order (file header). A node this pass made (an id >= n) is never
     * a member of a later chain: a fused chain's tail comes after every node visited later,
     * and its interior nodes had no other reader; interior_ok() checks the ids anyway. */
    for (int i = m - 1; rc == 0 && i >= 0; i--) {
        int32_t id = ids[i];
        if (wf__pass_find(c, id) != id)
            continue;
        if (try_chain(&st, c->node[id], &rc))
            c->n_epilogue++;
    }
    free(ids);
    free(st.readers);
    free(st.ctrl_max);
    free(st.fetched);
    free(st.used);
    return rc;
}
