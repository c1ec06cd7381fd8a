/* runtime/compile/pass_fuse.c: elementwise fusion: a chain or tree of elementwise nodes becomes one
 * fused_elementwise node (ops/fused.h) that computes it in one pass over memory, in tiles
 * across the workers, with the members' own loops (the same bits, passes.h).
 * Owns: the choice of groups. One sweep in reverse topological order: a node that can be an
 *   instruction (unary ops, binary ops with broadcasting, comparisons, where, cast, the
 *   activation gradients; not dropout, which is stateful) joins the group of its readers when
 *   it is INTERIOR, else it starts a group of its own as its root. Interior means: every live
 *   reader reads it as data and is in that one group (so its value is needed nowhere else:
 *   no value is recomputed, nothing is computed twice), it is not fetched or targeted, no
 *   node is ordered after it (a control edge's target stays a node of its own: an update
 *   ordered after the readers of its variable must still find them), it has the root's
 *   shape, and joining keeps the group within WF__FUSED_MAX_OPS instructions,
 *   WF__FUSED_MAX_INPUTS distinct external inputs and one leaky_relu slope.
 * Why the root's shape: the fused kernel computes every member once per output element, so
 *   a smaller member (exp of a bias row under a [B, N] root) would be recomputed B times; it
 *   roots a group of its own instead, and is broadcast where the unfused graph did it.
 * Members: replaceable (passes.h: no control edges of their own, not stateful, not an
 *   update); not bf16 or f16 (the kernels stage those through f32 per op, ops/scalar.h); not
 *   integer division, the one op that can fail at run time (a zero divisor), whose error must
 *   name its own node, which a fused node could not.
 * The rewrite: a group of two or more nodes has its root replaced by a plan-owned fused node
 *   over the group's external inputs. Only the root is replaced: its readers (and control
 *   edges to it: plan.c's index_of resolves through the map) move to the fused node, which
 *   has its dtype and shape; the interior nodes keep their ids, have no reader left, and the
 *   next prune drops them.
 * Placement hints: the members of a group share their wf_node_set_device() hint (none, or the
 *   CPU), which the fused node keeps.
 * GPUs: a node the user placed on a GPU (wf_node_set_device()) is never a member, and the
 *   pass does nothing in a session whose rule may put nodes on a GPU (a runtime with a CUDA
 *   device and wf_session_opts.device not -1, pass_place.c): there the members' own CUDA
 *   kernels run. fused_elementwise has a CUDA twin (ops/fused_cuda.cu), compile-checked and
 *   tested against the CPU only where a GPU is (none was lent so far); TODO(#6): fuse in GPU
 *   sessions once it has run on one, with a kernel_ok (core/op.h) for the programs it takes.
 * Not here: the program's format and kernel (ops/fused*.c), the framework (passes.c). */
#include "../../ops/fused.h"
#include "../../ops/table.h"
#include "passes.h"

#include <weft/devices.h>

#include <stdlib.h>
#include <string.h>

/* One group while the sweep builds it. */
typedef struct group {
    int32_t root;
    int n_ops;
    int n_ext;
    int32_t ext[WF__FUSED_MAX_INPUTS + 3]; /* external inputs (ids), distinct */
    bool has_alpha;
    double alpha;
} group;

static bool half(wf_dtype dt)
{
    return dt == WF_BF16 || dt == WF_F16;
}

/* True when node 'n' may be an instruction at all. */
static bool fusable(wf__pass_ctx *c, const wf_node *n)
{
    wf__fused_instr ins;
    if (!wf__fused_classify(n->op, &ins) || !wf__pass_replaceable(n) || half(n->dtype) ||
        n->device >= 1 || (n->op == &wf_op_div && !wf_dtype_is_float(n->dtype)))
        return false;
    for (int k = 0; k < n->n_inputs; k++)
        if (half(wf__pass_input(c, n, k)->dtype))
            return false;
    return true;
}

static bool uses_alpha(const wf_node *n)
{
    return n->op == &wf_op_leaky_relu || n->op == &wf_op_leaky_relu_grad;
}

/* The external inputs of 'g' if node 'n' (one of them, or the root) joins it: 'n' leaves the
 * list and its inputs come in. Returns the count (may exceed the limit), written to 'out'. */
static int ext_with(wf__pass_ctx *c, const group *g, const wf_node *n, int32_t *out)
{
    int k = 0;
    for (int i = 0; i < g->n_ext; i++)
        if (g->ext[i] != n->id)
            out[k++] = g->ext[i];
    for (int j = 0; j < n->n_inputs; j++) {
        int32_t r = wf__pass_input(c, n, j)->id;
        bool seen = false;
        for (int i = 0; i < k && !seen; i++)
            seen = out[i] == r;
        if (!seen)
            out[k++] = r;
    }
    return k;
}

static bool same_bits(double a, double b)
{
    return memcmp(&a, &b, sizeof a) == 0;
}

/* The register operand 'x' of a member of group 'gi' reads: a member's (in 'reg'), or its
 * place among the external inputs 'in[0 .. n_in-1]'; -1 when it is neither. */
static int reg_of(const wf_node *x, int gi, const int32_t *gid, const int32_t *reg, int n0,
                  wf_node *const *in, int n_in)
{
    if (x->id < n0 && gid[x->id] == gi)
        return reg[x->id];
    for (int j = 0; j < n_in; j++)
        if (in[j] == x)
            return j;
    return -1;
}

/* Makes the fused node of group 'g' (index 'gi'; its members 'mem[0 .. n_mem-1]' in
 * topological order) and replaces its root. Returns 0, or WF_ENOMEM; a group whose node
 * cannot be made (inference refuses it) is left alone. */
static int emit(wf__pass_ctx *c, const group *g, int gi, const int32_t *gid, const int32_t *mem,
                int n_mem, int n0, int32_t *reg)
{
    wf__fused_instr ins[WF__FUSED_MAX_OPS];
    wf_node *in[WF__FUSED_MAX_INPUTS];
    int n_in = 0;
    /* Registers: the external inputs first (in the order members read them), then one per
     * member; 'reg' holds the members' (ids below 'n0': nothing this pass made). */
    for (int i = 0; i < n_mem; i++) {
        const wf_node *n = c->node[mem[i]];
        for (int k = 0; k < n->n_inputs; k++) {
            wf_node *x = wf__pass_input(c, n, k);
            if ((x->id < n0 && gid[x->id] == gi) || reg_of(x, gi, gid, reg, n0, in, n_in) >= 0)
                continue;
            if (n_in == WF__FUSED_MAX_INPUTS)
                return 0; /* the sweep keeps groups within the limit: not expected */
            in[n_in++] = x;
        }
    }
    for (int i = 0; i < n_mem; i++) {
        const wf_node *n = c->node[mem[i]];
        wf__fused_instr *x = &ins[i];
        memset(x, 0, sizeof *x);
        wf__fused_classify(n->op, x);
        uint8_t *opnd[3] = { &x->a, &x->b, &x->c };
        for (int k = 0; k < n->n_inputs && k < 3; k++) {
            int r = reg_of(wf__pass_input(c, n, k), gi, gid, reg, n0, in, n_in);
            if (r < 0)
                return 0; /* not expected: every operand is a member or an input */
            *opnd[k] = (uint8_t)r;
        }
        x->dtype = (uint8_t)n->dtype;
        reg[n->id] = n_in + i;
    }
    wf_attrs a;
    if (wf__fused_encode(&a, ins, n_mem, g->alpha) < 0)
        return 0;
    wf_node *f = wf__pass_make(c, g->root, &wf_op_fused_elementwise, in, n_in, &a, NULL, false,
                               WF__RW_FUSED);
    if (!f)
        return 0; /* no memory for the node, or inference refused it: keep the group unfused */
    f->device = c->node[g->root]->device; /* the members' common hint (-1 or the CPU) */
    /* wf__pass_make() names made nodes "<root>.simplified<k>"; "fused" is shorter, so it
     * fits the same storage (the node's own allocation, passes.c). */
    char *name = (char *)f->name, *dot = strrchr(name, '.');
    if (dot && strncmp(dot, ".simplified", 11) == 0) {
        memmove(dot + 6, dot + 11, strlen(dot + 11) + 1);
        memcpy(dot, ".fused", 6);
    }
    int rc = wf__pass_replace(c, g->root, f->id, WF__RW_FUSED);
    if (rc == 0) {
        c->n_fused++;
        c->n_fused_members += n_mem;
    }
    return rc;
}

int wf__pass_fuse(wf__pass_ctx *c)
{
    int n0 = c->n;
    int32_t *ids = malloc((size_t)(n0 ? n0 : 1) * sizeof *ids);
    int32_t *gid = malloc((size_t)(n0 ? n0 : 1) * sizeof *gid);
    int32_t *rg = malloc((size_t)(n0 ? n0 : 1) * sizeof *rg);
    int32_t *reg = malloc((size_t)(n0 ? n0 : 1) * sizeof *reg);
    uint8_t *pinned = calloc((size_t)(n0 ? n0 : 1), 1);
    group *gs = malloc((size_t)(n0 ? n0 : 1) * sizeof *gs);
    int32_t *first = NULL, *fill = NULL, *mem = NULL;
    int rc = 0, m = 0, n_groups = 0;
    if (!ids || !gid || !rg || !reg || !pinned || !gs) {
        rc = wf__err(WF_ENOMEM, "wf_session_run: no memory to fuse %d nodes", n0);
        goto done;
    }
    if (c->in->device != -1 && wf_device_count(c->in->rt) > 1)
        goto done; /* GPUs may take these nodes (file header) */
    if ((m = wf__pass_order(c, ids)) < 0) {
        rc = m;
        goto done;
    }
    /* Pinned: fetched or targeted, or some node is ordered after it (file header). */
    for (int k = 0; k < c->n_key; k++)
        pinned[wf__pass_find(c, c->key[k])] = 1;
    for (int i = 0; i < m; i++) {
        const wf_node *n = c->node[ids[i]];
        for (int k = 0; k < n->n_control; k++)
            pinned[wf__pass_find(c, n->control[k]->id)] = 1;
    }
    for (int id = 0; id < n0; id++) {
        gid[id] = -1;
        rg[id] = -1; /* -1: no reader seen; -2: readers outside one group; else that group */
    }
    for (int i = m - 1; i >= 0; i--) {
        int32_t id = ids[i];
        const wf_node *n = c->node[id];
        if (fusable(c, n)) {
            int g = rg[id];
            int32_t ext[WF__FUSED_MAX_INPUTS + 3];
            if (g >= 0 && !pinned[id] && gs[g].n_ops < WF__FUSED_MAX_OPS &&
                wf_shape_equal(n->shape, c->node[gs[g].root]->shape) &&
                n->device == c->node[gs[g].root]->device &&
                (!uses_alpha(n) || !gs[g].has_alpha || same_bits(gs[g].alpha, n->attrs->alpha))) {
                int k = ext_with(c, &gs[g], n, ext);
                if (k <= WF__FUSED_MAX_INPUTS) { /* joins 'g' */
                    memcpy(gs[g].ext, ext, (size_t)k * sizeof *ext);
                    gs[g].n_ext = k;
                    gs[g].n_ops++;
                    if (uses_alpha(n)) {
                        gs[g].has_alpha = true;
                        gs[g].alpha = n->attrs->alpha;
                    }
                    gid[id] = g;
                }
            }
            if (gid[id] < 0) { /* a root of its own group */
                group *ng = &gs[n_groups];
                memset(ng, 0, sizeof *ng);
                ng->root = id;
                ng->n_ops = 1;
                ng->n_ext = ext_with(c, ng, n, ext);
                if (ng->n_ext <= WF__FUSED_MAX_INPUTS) {
                    memcpy(ng->ext, ext, (size_t)ng->n_ext * sizeof *ext);
                    ng->has_alpha = uses_alpha(n);
                    ng->alpha = ng->has_alpha ? n->attrs->alpha : 0;
                    gid[id] = n_groups++;
                }
            }
        }
        for (int k = 0; k < n->n_inputs; k++) {
            int32_t r = wf__pass_input(c, n, k)->id;
            if (r >= n0)
                continue; /* not expected: a node this pass made is not in 'ids' */
            int g = gid[id];
            rg[r] = g < 0 || (rg[r] != -1 && rg[r] != g) ? -2 : g;
        }
    }
    /* The members of each group in topological order: bucketed by group ('first[g]' is
     * where group g's run starts in 'mem'), so the emits cost O(m) together. */
    first = calloc((size_t)n_groups + 1, sizeof *first);
    fill = calloc((size_t)n_groups + 1, sizeof *fill);
    mem = malloc((size_t)(m ? m : 1) * sizeof *mem);
    if (!first || !fill || !mem) {
        rc = wf__err(WF_ENOMEM, "wf_session_run: no memory to fuse %d nodes", n0);
        goto done;
    }
    for (int i = 0; i < m; i++)
        if (gid[ids[i]] >= 0)
            first[gid[ids[i]] + 1]++;
    for (int g = 0; g < n_groups; g++)
        first[g + 1] += first[g];
    for (int i = 0; i < m; i++)
        if (gid[ids[i]] >= 0)
            mem[first[gid[ids[i]]] + fill[gid[ids[i]]]++] = ids[i];
    for (int g = 0; g < n_groups && rc == 0; g++)
        if (gs[g].n_ops >= 2)
            rc = emit(c, &gs[g], g, gid, mem + first[g], first[g + 1] - first[g], n0, reg);
done:
    free(ids);
    free(gid);
    free(rg);
    free(reg);
    free(pinned);
    free(gs);
    free(first);
    free(fill);
    free(mem);
    return rc;
}
