/* runtime/compile/pass_simplify.c: algebraic simplification: identities that remove work, applied
 * in one sweep in topological order (so neg(neg(neg(neg(x)))) and chains of reshapes collapse).
 * Owns: the rules, each exact bit for bit on every input (passes.h):
 *   - x * 1, 1 * x, x / 1 -> x, when the constant is all ones and the other operand already
 *     has the result's dtype and shape (a broadcast would change the shape: a -1 dimension
 *     of x must meet a 1 of the constant);
 *   - x + c, c + x -> x when c is all -0.0 (floats) or 0 (integers), and x - c -> x when c is
 *     all +0.0 or 0. Not x + (+0.0): -0.0 + +0.0 is +0.0, so that identity changes a zero's
 *     sign (and 1/x after it), which is not exact;
 *   - neg(neg(x)) -> x; transpose(transpose(x)) -> x when the permutations are inverse,
 *     else one transpose with the composed permutation;
 *   - a reshape, expand_dims or squeeze of one of those -> one reshape of the first input
 *     (or the input itself when the shapes are equal and static); a reshape to the input's
 *     own static shape -> the input; cast to the input's dtype -> the input;
 *   - sum(broadcast_to(x)) over exactly the broadcast axes, f32: the sum adds k equal f32
 *     values in double, which is exact (k < 2^24), then rounds once, as an f32 multiply by k
 *     rounds the exact product once; the sum starts from -0.0 (ops/reduce_cpu.c), so it
 *     gives -0.0 where x is -0.0, as the product does: the rewrite is reshape(x) * k, the
 *     same bits, and the k-fold broadcast is never made. (f64 sums of k copies round at each step,
 * so they keep their broadcast.) Never: a rewrite that makes a node read a variable it did not read
 * (passes.h: updates are ordered after the readers the graph had), or that touches a node that is
 * not replaceable (control edges, stateful, updates). Not here: the other passes (pass_*.c), the
 * framework (passes.c). */
#include "../../ops/table.h"
#include "passes.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { ONES, NEG_ZEROS, POS_ZEROS };

static bool arith_dtype(wf_dtype dt)
{
    return dt == WF_F32 || dt == WF_F64 || dt == WF_BF16 || dt == WF_F16 || dt == WF_I32 ||
           dt == WF_I64;
}

/* True when 'n' is a constant whose every element is 'what'. */
static bool const_all(const wf_node *n, int what)
{
    const wf_tensor *t = n->op == &wf_op_constant ? n->value : NULL;
    if (!t || !t->contiguous || t->numel > WF__FOLD_MAX_NUMEL || !arith_dtype(t->dtype))
        return false;
    bool is_float = wf_dtype_is_float(t->dtype);
    size_t es = wf_dtype_size(t->dtype);
    for (int64_t i = 0; i < t->numel; i++) {
        double v = wf__load_f64(t->dtype, t->data + i * (int64_t)es);
        bool ok = what == ONES        ? v == 1.0
                  : what == NEG_ZEROS ? v == 0.0 && (!is_float || signbit(v))
                                      : v == 0.0 && (!is_float || !signbit(v));
        if (!ok)
            return false;
    }
    return true;
}

/* True when 'n = op(x, c)' (either order) equals x everywhere for an identity constant 'c':
 * x has n's dtype and shape, and broadcasting 'c' against x changes nothing. */
static bool keeps_x(const wf_node *n, const wf_node *x, const wf_node *c)
{
    if (x->dtype != n->dtype || c->dtype != n->dtype || !wf_shape_equal(x->shape, n->shape) ||
        c->shape.rank > n->shape.rank)
        return false;
    int off = n->shape.rank - c->shape.rank;
    for (int d = 0; d < c->shape.rank; d++) {
        int64_t cd = c->shape.dims[d], xd = x->shape.dims[off + d];
        if (cd != 1 && !(xd >= 0 && cd == xd))
            return false;
    }
    return true;
}

/* A variable must not gain readers (file header). */
static bool may_read(const wf_node *x)
{
    return x->op != &wf_op_variable;
}

static bool reshape_family(const wf_node *n)
{
    return n->op == &wf_op_reshape || n->op == &wf_op_expand_dims || n->op == &wf_op_squeeze;
}

static int negative_dims(wf_shape s)
{
    int k = 0;
    for (int d = 0; d < s.rank; d++)
        k += s.dims[d] < 0;
    return k;
}

/* The permutation of transpose node 't' over rank 'r' (ops/shape.c: n_axes 0 reverses). */
static void perm_of(const wf_node *t, int r, int *perm)
{
    for (int d = 0; d < r; d++) {
        int p = t->attrs->n_axes == 0 ? r - 1 - d : t->attrs->axes[d];
        perm[d] = p < 0 ? p + r : p;
    }
}

static wf_attrs zero_attrs(void)
{
    wf_attrs a;
    memset(&a, 0, sizeof a); /* padding too (core/graph.h) */
    return a;
}

/* A scalar f32 constant node for the rewrite of 'for_id'. */
static wf_node *scalar_f32(wf__pass_ctx *c, int32_t for_id, float v)
{
    wf_tensor *t = wf__tensor_alloc(WF_F32, (wf_shape){ .rank = 0 });
    if (!t)
        return NULL;
    memcpy(t->data, &v, sizeof v);
    wf_node *k =
        wf__pass_make(c, for_id, &wf_op_constant, NULL, 0, NULL, t, true, WF__RW_SIMPLIFIED);
    wf_tensor_release(t);
    return k;
}

/* sum(broadcast_to(x)) -> reshape(x) * k (file header); NULL when it does not apply. */
static wf_node *sum_of_broadcast(wf__pass_ctx *c, int32_t id, const wf_node *n, const wf_node *b)
{
    if (b->op != &wf_op_broadcast_to || n->dtype != WF_F32)
        return NULL;
    const wf_node *x = wf__pass_input(c, b, 0);
    if (x->dtype != WF_F32 || !may_read(x) || !wf__pass_static(b->shape) ||
        !wf__pass_static(x->shape) || negative_dims(n->shape) > 0)
        return NULL;
    int r = b->shape.rank, off = r - x->shape.rank;
    bool red[WF_MAX_RANK];
    for (int d = 0; d < r; d++)
        red[d] = n->attrs->n_axes == 0;
    for (int i = 0; i < n->attrs->n_axes; i++) {
        int a = n->attrs->axes[i];
        if (a < 0 || a >= r)
            return NULL;
        red[a] = true;
    }
    int64_t k = 1;
    for (int d = 0; d < r; d++) {
        int64_t xd = d < off ? 1 : x->shape.dims[d - off];
        if (red[d] ? xd != 1 : xd != b->shape.dims[d])
            return NULL;
        /* The bound before the product: k stays exact in float (and never wraps). */
        if (red[d] && (!wf__dims_mul(k, b->shape.dims[d], &k) || k >= ((int64_t)1 << 24)))
            return NULL;
    }
    if (k < 1)
        return NULL;
    wf_node *v = (wf_node *)x;
    if (!wf_shape_equal(x->shape, n->shape)) {
        wf_attrs a = zero_attrs();
        a.shape = n->shape;
        if (!(v = wf__pass_make(c, id, &wf_op_reshape, &v, 1, &a, NULL, false, WF__RW_SIMPLIFIED)))
            return NULL;
    }
    if (k > 1) {
        wf_node *kn = scalar_f32(c, id, (float)k);
        wf_node *in[2] = { v, kn };
        if (!kn ||
            !(v = wf__pass_make(c, id, &wf_op_mul, in, 2, NULL, NULL, false, WF__RW_SIMPLIFIED)))
            return NULL;
    }
    return v;
}

/* What node 'id' simplifies to, or NULL. May make new nodes. */
static wf_node *simplify(wf__pass_ctx *c, int32_t id)
{
    const wf_node *n = c->node[id];
    const wf_op_def *op = n->op;
    if (!wf__pass_replaceable(n) || n->n_inputs < 1)
        return NULL;
    wf_node *a = wf__pass_input(c, n, 0), *b = n->n_inputs > 1 ? wf__pass_input(c, n, 1) : NULL;
    wf_node *to = NULL;
    if (op == &wf_op_mul) {
        if (const_all(b, ONES) && keeps_x(n, a, b))
            to = a;
        else if (const_all(a, ONES) && keeps_x(n, b, a))
            to = b;
    } else if (op == &wf_op_div) {
        if (const_all(b, ONES) && keeps_x(n, a, b))
            to = a;
    } else if (op == &wf_op_add) {
        if (const_all(b, NEG_ZEROS) && keeps_x(n, a, b))
            to = a;
        else if (const_all(a, NEG_ZEROS) && keeps_x(n, b, a))
            to = b;
    } else if (op == &wf_op_sub) {
        if (const_all(b, POS_ZEROS) && keeps_x(n, a, b))
            to = a;
    } else if (op == &wf_op_neg) {
        if (a->op == &wf_op_neg && wf__pass_replaceable(a))
            to = wf__pass_input(c, a, 0);
    } else if (op == &wf_op_cast) {
        if (a->dtype == n->dtype && wf_shape_equal(a->shape, n->shape))
            to = a;
    } else if (op == &wf_op_transpose && a->op == &wf_op_transpose && wf__pass_replaceable(a)) {
        wf_node *x = wf__pass_input(c, a, 0);
        int r = x->shape.rank, p1[WF_MAX_RANK], p2[WF_MAX_RANK];
        perm_of(a, r, p1);
        perm_of(n, r, p2);
        wf_attrs t = zero_attrs();
        bool identity = true;
        t.n_axes = r;
        for (int d = 0; d < r; d++) {
            t.axes[d] = p1[p2[d]];
            identity = identity && t.axes[d] == d;
        }
        if (identity)
            to = x;
        else if (may_read(x))
            to = wf__pass_make(c, id, &wf_op_transpose, &x, 1, &t, NULL, false, WF__RW_SIMPLIFIED);
    } else if (reshape_family(n)) {
        wf_node *x = a;
        if (reshape_family(a) && wf__pass_replaceable(a))
            x = wf__pass_input(c, a, 0);
        if (wf__pass_static(n->shape) && wf_shape_equal(x->shape, n->shape))
            to = x;
        else if (x != a && negative_dims(n->shape) <= 1 && may_read(x)) {
            wf_attrs t = zero_attrs();
            t.shape = n->shape;
            to = wf__pass_make(c, id, &wf_op_reshape, &x, 1, &t, NULL, false, WF__RW_SIMPLIFIED);
        }
    } else if (op == &wf_op_sum && wf__pass_replaceable(a)) {
        to = sum_of_broadcast(c, id, n, a);
    }
    if (to && (!may_read(to) || to->dtype != n->dtype || !wf_shape_equal(to->shape, n->shape)))
        return NULL;
    return to;
}

int wf__pass_simplify(wf__pass_ctx *c)
{
    int32_t *ids = malloc((size_t)(c->n ? c->n : 1) * sizeof *ids);
    if (!ids)
        return wf__err(WF_ENOMEM, "wf_session_run: no memory to simplify %d nodes", c->n);
    int m = wf__pass_order(c, ids);
    int rc = m < 0 ? m : 0;
    for (int i = 0; rc == 0 && i < m; i++) {
        int32_t id = ids[i];
        if (wf__pass_find(c, id) != id)
            continue;
        wf_node *to = simplify(c, id);
        if (to && to->id != id && (rc = wf__pass_replace(c, id, to->id, WF__RW_SIMPLIFIED)) == 0)
            c->n_simplified++;
    }
    free(ids);
    return rc;
}
