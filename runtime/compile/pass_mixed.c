/* runtime/compile/pass_mixed.c: the precision options of a session (weft/runtime.h):
 * WF_SESSION_MIXED_BF16, bf16 compute with f32 master weights, and WF_SESSION_TF32, TF32
 * tensor cores for f32 products on GPUs. Both are off by default; they are the only passes
 * that change result bits on purpose.
 * Owns: which ops compute in bf16 under the mixed option (the GEMM family: matmul,
 *   matmul_epilogue, conv2d and the convolution's two backward ops, forward and backward
 *   alike, since wf_gradients() builds the backward of a product from the same ops), and the
 *   rewrite: each live f32 node of those ops becomes
 *       cast(op'(cast(x0, bf16), cast(x1, bf16), ...), f32)
 *   where op' is the same op and attributes over bf16 inputs (so it computes in bf16: on the
 *   CPU in f32 and rounded to bf16, on a GPU with bf16 tensor cores and f32 accumulation),
 *   and the cast back replaces the node. Everything else (elementwise ops, reductions,
 *   softmax and the loss, the optimizer's updates) still computes in f32 from those f32
 *   values: PyTorch's autocast does the same, because sums, exponentials and updates lose
 *   too much in bf16. So the variables stay f32 (their reads are cast to bf16 where a product
 *   reads them), every gradient that reaches an update is f32 (the cast back after the
 *   backward product), and the updates write f32 master weights.
 *   A bf16 input is never cast twice: a product reading another product's cast back reads
 *   its bf16 value directly (bf16 -> f32 -> bf16 is the identity), and one cast of a value
 *   serves every product that reads it.
 * The TF32 option marks each live f32 matmul and matmul_epilogue (after the mixed rewrite:
 *   the products it left in f32) with attrs.dtype = WF__MATMUL_TF32 (ops/cuda_kernels.h),
 *   which the CUDA kernels read; on the CPU the mark changes nothing.
 * Invariants kept (runtime/compile/passes.h): a replacement has its node's dtype and shape
 *   (the cast back to f32); new nodes take the order key of the node they serve and are made after
 *   their inputs; only replaceable nodes are replaced. The exception this pass is for: the
 *   replacement computes the same values rounded through bf16, not the same bits. A new
 *   cast of a variable is a new reader of it, but it feeds only the replacement of a node
 *   that read the variable, which every update of that variable is ordered after (control
 *   edges resolve through the replacement), so the cast also runs before the update.
 * Not here: the cast and product kernels (ops/), the framework (passes.c). */
#include "../../ops/cuda_kernels.h"
#include "../../ops/table.h"
#include "passes.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The ops the mixed option computes in bf16. */
static bool bf16_op(const wf_op_def *op)
{
    return op == &wf_op_matmul || op == &wf_op_matmul_epilogue || op == &wf_op_conv2d ||
           op == &wf_op_conv2d_backward_input || op == &wf_op_conv2d_backward_filter;
}

typedef struct mx_state {
    wf__pass_ctx *c;
    int n;        /* working nodes when the pass began */
    int32_t *b16; /* per working id < n: the id of its bf16 value (a cast or a product'), or -1 */
} mx_state;

/* Makes a node in the place of 'for_id' (wf__pass_make()) named "<name>.<tag><k>" for the
 * dumps (wf__pass_make() would say "simplified"), on the device the user placed that node on
 * (wf_node_set_device(): a hint the rewrite keeps; -1 when none). */
static wf_node *make(wf__pass_ctx *c, int32_t for_id, const wf_op_def *op, wf_node *const *in,
                     int n_in, const wf_attrs *at, bool any_type, const char *tag)
{
    const char *like = c->node[for_id]->name;
    wf_node *f = wf__pass_make(c, for_id, op, in, n_in, at, NULL, any_type, WF__RW_MIXED);
    if (f) { /* plan-owned, writable storage of at least the old name's length */
        char *name = (char *)f->name;
        size_t room = strlen(name) + 1;
        snprintf(name, room, "%s.%s%d", like ? like : "?", tag, f->id - c->n_orig);
        f->device = c->node[for_id]->device;
    }
    return f;
}

/* The bf16 value of f32 node 'x' for a product in the place of 'for_id': the bf16 node that
 * a cast back made here reads, the cast already made for 'x', or a new cast. NULL when it
 * cannot be made. */
static wf_node *as_bf16(mx_state *st, wf_node *x, int32_t for_id)
{
    wf__pass_ctx *c = st->c;
    if (x->id >= st->n && c->made[x->id] == WF__RW_MIXED && x->op == &wf_op_cast &&
        x->n_inputs == 1 && x->inputs[0]->dtype == WF_BF16)
        return x->inputs[0];
    if (x->id < st->n && st->b16[x->id] >= 0)
        return c->node[st->b16[x->id]];
    wf_attrs at;
    memset(&at, 0, sizeof at); /* padding too: equal bags compare equal (core/graph.h) */
    at.dtype = WF_BF16;
    wf_node *b = make(c, for_id, &wf_op_cast, &x, 1, &at, true, "bf16_");
    if (b && x->id < st->n)
        st->b16[x->id] = b->id;
    return b;
}

/* Rewrites product 'nd' (live, f32, replaceable) to compute in bf16 (file header). Returns 0,
 * or WF_ENOMEM; a product whose rewrite cannot be made (its op refuses the inputs) stays. */
static int to_bf16(mx_state *st, wf_node *nd)
{
    wf__pass_ctx *c = st->c;
    wf_node *in[WF_NODE_INLINE_INPUTS];
    if (nd->n_inputs > WF_NODE_INLINE_INPUTS)
        return 0;
    for (int k = 0; k < nd->n_inputs; k++) {
        wf_node *x = wf__pass_input(c, nd, k);
        in[k] = x->dtype == WF_F32 ? as_bf16(st, x, nd->id) : x;
        if (!in[k])
            return 0;
    }
    wf_node *p = make(c, nd->id, nd->op, in, nd->n_inputs, nd->attrs, true, "bf16_");
    if (!p || p->dtype != WF_BF16 || !wf_shape_equal(p->shape, nd->shape))
        return 0; /* an unused made node is never live: pruning drops it */
    wf_attrs at;
    memset(&at, 0, sizeof at);
    at.dtype = WF_F32;
    wf_node *back = make(c, nd->id, &wf_op_cast, &p, 1, &at, false, "f32_");
    if (!back)
        return 0;
    int rc = wf__pass_replace(c, nd->id, back->id, WF__RW_MIXED);
    if (rc == 0) {
        st->b16[nd->id] = p->id;
        c->n_mixed++;
    }
    return rc;
}

/* Marks f32 product 'nd' for TF32 (file header). Returns 0 or WF_ENOMEM. */
static int mark_tf32(wf__pass_ctx *c, wf_node *nd)
{
    if (nd->attrs->dtype == WF__MATMUL_TF32 || nd->n_inputs > WF_NODE_INLINE_INPUTS)
        return 0;
    wf_node *in[WF_NODE_INLINE_INPUTS];
    for (int k = 0; k < nd->n_inputs; k++)
        in[k] = wf__pass_input(c, nd, k);
    wf_attrs at = *nd->attrs;
    at.dtype = WF__MATMUL_TF32;
    wf_node *m = make(c, nd->id, nd->op, in, nd->n_inputs, &at, false, "tf32_");
    if (!m)
        return 0;
    int rc = wf__pass_replace(c, nd->id, m->id, WF__RW_MIXED);
    if (rc == 0)
        c->n_tf32++;
    return rc;
}

int wf__pass_mixed(wf__pass_ctx *c)
{
    bool bf16 = (c->in->flags & WF_SESSION_MIXED_BF16) != 0;
    bool tf32 = (c->in->flags & WF_SESSION_TF32) != 0;
    if (!bf16 && !tf32)
        return 0;
    int n = c->n, rc = 0, m = 0;
    size_t cap = (size_t)(n ? n : 1);
    mx_state st = { .c = c, .n = n, .b16 = malloc(cap * sizeof(int32_t)) };
    int32_t *ids = malloc(cap * sizeof *ids);
    if (!st.b16 || !ids)
        rc = wf__err(WF_ENOMEM, "wf_session_run: no memory for the precision pass of %d nodes", n);
    if (rc == 0 && (m = wf__pass_order(c, ids)) < 0)
        rc = m;
    for (int i = 0; rc == 0 && i < n; i++)
        st.b16[i] = -1;
    /* Topological order: a product's inputs are rewritten before it reads them. */
    for (int i = 0; bf16 && rc == 0 && i < m; i++) {
        wf_node *nd = c->node[ids[i]];
        if (wf__pass_find(c, nd->id) == nd->id && bf16_op(nd->op) && nd->dtype == WF_F32 &&
            wf__pass_replaceable(nd))
            rc = to_bf16(&st, nd);
    }
    for (int i = 0; tf32 && rc == 0 && i < m; i++) {
        wf_node *nd = c->node[ids[i]];
        if (wf__pass_find(c, nd->id) == nd->id && nd->dtype == WF_F32 &&
            (nd->op == &wf_op_matmul || nd->op == &wf_op_matmul_epilogue) &&
            wf__pass_replaceable(nd))
            rc = mark_tf32(c, nd);
    }
    free(ids);
    free(st.b16);
    return rc;
}
