/* runtime/compile/pass_fold.c: constant folding: a node whose inputs are all constants (after the
 * replacements so far, so whole constant subgraphs fold in one sweep) is computed once at
 * compile time and replaced by a plan-owned constant.
 * Owns: which nodes fold and the compile-time kernel call.
 * Rules: only replaceable nodes (passes.h: no control edges, not stateful such as dropout,
 *   not an update, not a source), with a static shape of at most WF__FOLD_MAX_NUMEL
 *   elements, a CPU kernel and a shape not decided by the data (WF_OP_DYNAMIC_SHAPE). The
 *   kernel is the one the plan would run, on the same constant tensors, so the folded
 *   value is the run's value bit for bit. A kernel that fails leaves the node as it was: the
 *   run then reports the failure with the node's name, as without folding.
 * Shapes known statically: unreduce and reshape_like read only the shape of their input 1
 *   (ops/reduce.c, ops/like.c), so they fold when input 0 is a constant and input 1 has a
 *   static shape, whatever computes it (a gradient seed spread over a variable's shape).
 *   The kernel gets a stand-in of that shape: one zero element with every stride 0.
 * Not here: the other passes (pass_*.c), the framework (passes.c). */
#include "../../ops/table.h"
#include "passes.h"

#include <stdlib.h>
#include <string.h>

/* True when input 'k' of 'op' is read only for its shape. */
static bool shape_only(const wf_op_def *op, int k)
{
    return k == 1 && (op == &wf_op_unreduce || op == &wf_op_reshape_like);
}

/* A tensor of 'dt' and 'shape' whose elements all alias one zero: for shape-only inputs. */
static wf_tensor *stand_in(wf_dtype dt, wf_shape shape)
{
    wf_tensor *one = wf__tensor_alloc(dt, (wf_shape){ .rank = 0 });
    if (!one)
        return NULL;
    memset(one->data, 0, wf_dtype_size(dt));
    int64_t strides[WF_MAX_RANK] = { 0 };
    wf_tensor *t = wf__tensor_alias(one, shape, strides, 0);
    wf_tensor_release(one);
    return t;
}

/* The most inputs of a node that folds (concat and add_n of more constants stay nodes). */
#define MAX_FOLD_INPUTS 16

/* Folded values: fresh tensors (the plan's constants own them). */
static wf_tensor *fold_alloc(void *arg, const wf_node *n, wf_dtype dt, const wf_shape *shape)
{
    (void)arg;
    (void)n;
    return wf__tensor_alloc(dt, *shape);
}

static const wf__node_env fold_env = { .alloc = fold_alloc }; /* nothing that folds assigns */

/* Computes node 'n' from its constant inputs; returns the value or NULL (not folded). */
static wf_tensor *compute(wf__pass_ctx *c, const wf_node *n)
{
    wf_tensor *in[MAX_FOLD_INPUTS] = { NULL }, *owned[MAX_FOLD_INPUTS] = { NULL };
    wf_tensor *out = NULL;
    if (n->n_inputs > MAX_FOLD_INPUTS)
        return NULL;
    bool ok = true;
    for (int k = 0; ok && k < n->n_inputs; k++) {
        const wf_node *m = wf__pass_input(c, n, k);
        if (m->op == &wf_op_constant && m->value) {
            in[k] = m->value;
        } else if (shape_only(n->op, k) && wf__pass_static(m->shape)) {
            ok = (in[k] = owned[k] = stand_in(m->dtype, m->shape)) != NULL;
        } else {
            ok = false;
        }
    }
    if (ok) {
        /* The session's runtime and kernel, as the plan's task would have them; step 0
         * (nothing that folds is random: stateful ops never fold). A failure only means
         * "not folded": the node then fails, or not, when it runs. */
        wf_kernel_ctx kctx = { .rt = c->in->rt };
        ok = wf__node_run(&fold_env, NULL, wf__kernels_find(c->in->kernels, n->op, WF_KERNEL_CPU),
                          &kctx, n, in, n->dtype, &n->shape, NULL, &out, NULL, 0) >= 0;
    }
    for (int k = 0; k < n->n_inputs; k++)
        wf_tensor_release(owned[k]);
    return ok ? out : NULL;
}

static bool foldable(const wf__pass_ctx *c, const wf_node *n)
{
    const wf_op_def *op = n->op;
    if (!wf__pass_replaceable(n) || n->n_inputs == 0 ||
        !wf__kernels_find(c->in->kernels, op, WF_KERNEL_CPU) || (op->flags & WF_OP_DYNAMIC_SHAPE) ||
        !wf__pass_static(n->shape))
        return false;
    return wf_shape_numel(n->shape) <= WF__FOLD_MAX_NUMEL;
}

int wf__pass_fold(wf__pass_ctx *c)
{
    int32_t *ids = malloc((size_t)(c->n ? c->n : 1) * sizeof *ids);
    if (!ids)
        return wf__err(WF_ENOMEM, "wf_session_run: no memory to fold %d nodes", c->n);
    int m = wf__pass_order(c, ids);
    int rc = m < 0 ? m : 0;
    for (int i = 0; rc == 0 && i < m; i++) {
        int32_t id = ids[i];
        const wf_node *n = c->node[id];
        if (wf__pass_find(c, id) != id || !foldable(c, n))
            continue;
        bool all_const = true;
        for (int k = 0; all_const && k < n->n_inputs; k++) {
            const wf_node *in = wf__pass_input(c, n, k);
            all_const = (in->op == &wf_op_constant && in->value) ||
                        (shape_only(n->op, k) && wf__pass_static(in->shape));
        }
        if (!all_const)
            continue;
        wf_tensor *v = compute(c, n);
        if (!v)
            continue;
        wf_node *k = wf__pass_make(c, id, &wf_op_constant, NULL, 0, NULL, v, false, WF__RW_FOLDED);
        wf_tensor_release(v);
        if (!k)
            continue;
        if ((rc = wf__pass_replace(c, id, k->id, WF__RW_FOLDED)) == 0)
            c->n_folded++;
    }
    free(ids);
    return rc;
}
