/* ops/shape.c: the shape ops: reshape, transpose, slice, split, concat, stack, pad,
 * broadcast_to, expand_dims and squeeze: their constructors, dtype and shape inference, costs
 * and op-table entries.
 * Owns: the op defs wf_op_reshape ... wf_op_squeeze (ops/table.h) and the public constructors
 *   of weft/ops.h's "Shape ops" section.
 * Invariants: every check of arguments happens in inference, so its message gets the node's
 *   prefix ("<op> '<name>' (<file>:<line>): ") and names every shape; each constructor
 *   consumes exactly one pending source location (wf_split(), which adds several nodes,
 *   takes it once with wf__srcloc_take()). Every output is a fresh contiguous copy, never a
 *   view of the input: the kernel convention (core/op.h) hands kernels a caller-allocated
 *   contiguous 'out', and a copy keeps the memory planner's lifetimes simple.
 * Attributes (core/graph.h's wf_attrs): reshape, broadcast_to: shape; transpose: n_axes and
 *   axes (n_axes 0: reverse every axis); slice: begin, end, step (step 0 is refused, unlike
 *   the bag's generic "0 means 1": NumPy raises on it); split: axis, groups (the number of
 *   parts) and depth (this node's part); concat, stack, expand_dims, squeeze: axis (squeeze:
 *   WF_SQUEEZE_ALL for every size-1 axis); pad: begin (before), end (after), alpha (value).
 * Not here: the copies (shape_cpu.c), gather and one_hot (index.c), gradients (grad/). */
#include "../core/error.h"
#include "../core/tensor.h"
#include "internal.h"
#include "layout.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define SH(s, buf) wf_shape_str((s), (buf), sizeof(buf))

static void cost_copy(const wf_node *n, double *flops, double *bytes)
{
    *flops = 0;
    *bytes = wf__ops_bytes(n);
}

static wf_attrs zero_attrs(void)
{
    wf_attrs a;
    memset(&a, 0, sizeof a); /* padding too: equal bags are shared (core/graph.h) */
    return a;
}

#define DEF_OP(id, MIN, MAX, FLAGS)                                                          \
    const wf_op_def wf_op_##id = {                                                           \
        .name = #id,                                                                         \
        .min_inputs = MIN,                                                                   \
        .max_inputs = MAX,                                                                   \
        .infer = infer_##id,                                                                 \
        .kernel = { [WF_KERNEL_CPU] = kernel_##id, [WF_KERNEL_CUDA] = WF__CUDA_KERNEL(id) }, \
        .cost = cost_copy,                                                                   \
        .flags = FLAGS,                                                                      \
    };

/* ---- reshape ------------------------------------------------------------------------------- */

static int infer_reshape(wf_node *n, char *err, size_t errlen)
{
    const wf_node *x = n->inputs[0];
    wf_shape t = n->attrs->shape;
    char s1[160], s2[160];
    if (t.rank < 0 || t.rank > WF_MAX_RANK) {
        snprintf(err, errlen, "x is %s; the target rank %d is outside [0, %d]", SH(x->shape, s1),
                 (int)t.rank, WF_MAX_RANK);
        return WF_EINVAL;
    }
    int infer_at = -1;
    int64_t prod = 1;
    for (int d = 0; d < t.rank; d++) {
        if (t.dims[d] == -1 && infer_at < 0) {
            infer_at = d;
        } else if (t.dims[d] < 0) {
            snprintf(err, errlen,
                     "x is %s; the target shape %s has %s (one -1 allowed, others >= 0)",
                     SH(x->shape, s1), SH(t, s2),
                     t.dims[d] == -1 ? "two -1 dimensions" : "a negative dimension");
            return WF_EINVAL;
        } else if (!wf__dims_mul(prod, t.dims[d], &prod)) {
            snprintf(err, errlen,
                     "x is %s; the target shape %s has more than " WF__MAX_NUMEL_STR
                     " elements (the most a tensor may hold)",
                     SH(x->shape, s1), SH(t, s2));
            return WF_ESHAPE;
        }
    }
    int64_t xn = wf_shape_numel(x->shape);
    if (infer_at >= 0) {
        if (xn >= 0) {
            if (prod == 0 || xn % prod != 0) {
                snprintf(err, errlen,
                         "x is %s (%lld elements), which the target shape %s cannot hold",
                         SH(x->shape, s1), (long long)xn, SH(t, s2));
                return WF_ESHAPE;
            }
            t.dims[infer_at] = xn / prod;
        }
    } else if (xn >= 0 && xn != prod) {
        snprintf(err, errlen, "x is %s (%lld elements) but the target shape %s has %lld",
                 SH(x->shape, s1), (long long)xn, SH(t, s2), (long long)prod);
        return WF_ESHAPE;
    }
    n->dtype = x->dtype;
    n->shape = t;
    return 0;
}

static int kernel_reshape(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                          wf_tensor **out)
{
    wf_kctx k = wf__ops_kctx(ctx);
    (void)n;
    return wf__reshape_cpu(&k, in[0], *out);
}

DEF_OP(reshape, 1, 1, 0)

wf_node *(wf_reshape)(wf_graph *g, wf_node *x, wf_shape shape)
{
    wf_attrs a = zero_attrs();
    a.shape = shape;
    return wf__node_add(g, &wf_op_reshape, &x, 1, &a);
}

/* ---- expand_dims and squeeze (the reshape kernel) ------------------------------------------ */

static int infer_expand_dims(wf_node *n, char *err, size_t errlen)
{
    const wf_node *x = n->inputs[0];
    int r = x->shape.rank, ax = n->attrs->axis;
    char s1[160];
    if (ax < -(r + 1) || ax > r || r >= WF_MAX_RANK) {
        snprintf(err, errlen, "x is %s; axis %d is outside [%d, %d] (or the rank would pass %d)",
                 SH(x->shape, s1), ax, -(r + 1), r, WF_MAX_RANK);
        return WF_EINVAL;
    }
    if (ax < 0)
        ax += r + 1;
    wf_shape s = { .rank = r + 1 };
    for (int d = 0, k = 0; d <= r; d++)
        s.dims[d] = d == ax ? 1 : x->shape.dims[k++];
    n->dtype = x->dtype;
    n->shape = s;
    return 0;
}

#define kernel_expand_dims kernel_reshape
DEF_OP(expand_dims, 1, 1, 0)

wf_node *(wf_expand_dims)(wf_graph *g, wf_node *x, int axis)
{
    wf_attrs a = zero_attrs();
    a.axis = axis;
    return wf__node_add(g, &wf_op_expand_dims, &x, 1, &a);
}

static int infer_squeeze(wf_node *n, char *err, size_t errlen)
{
    const wf_node *x = n->inputs[0];
    int r = x->shape.rank, ax = n->attrs->axis;
    char s1[160];
    wf_shape s = { .rank = 0 };
    if (ax == WF_SQUEEZE_ALL) {
        for (int d = 0; d < r; d++)
            if (x->shape.dims[d] != 1)
                s.dims[s.rank++] = x->shape.dims[d];
    } else {
        if (ax < -r || ax >= r) {
            snprintf(err, errlen, "x is %s; axis %d is outside [%d, %d)", SH(x->shape, s1), ax, -r,
                     r);
            return WF_EINVAL;
        }
        if (ax < 0)
            ax += r;
        if (!wf__ops_dims_fit(x->shape.dims[ax], 1)) {
            snprintf(err, errlen, "x is %s; axis %d has size %lld, not 1", SH(x->shape, s1), ax,
                     (long long)x->shape.dims[ax]);
            return WF_ESHAPE;
        }
        for (int d = 0; d < r; d++)
            if (d != ax)
                s.dims[s.rank++] = x->shape.dims[d];
    }
    n->dtype = x->dtype;
    n->shape = s;
    return 0;
}

#define kernel_squeeze kernel_reshape
DEF_OP(squeeze, 1, 1, 0)

wf_node *(wf_squeeze)(wf_graph *g, wf_node *x, int axis)
{
    wf_attrs a = zero_attrs();
    a.axis = axis;
    return wf__node_add(g, &wf_op_squeeze, &x, 1, &a);
}

/* ---- transpose ----------------------------------------------------------------------------- */

bool wf__transpose_perm(const wf_attrs *a, int r, int *perm)
{
    int k = a->n_axes;
    if (k == 0) {
        for (int d = 0; d < r; d++)
            perm[d] = r - 1 - d;
        return true;
    }
    if (k != r)
        return false;
    bool seen[WF_MAX_RANK] = { false };
    for (int d = 0; d < r; d++) {
        int p = a->axes[d];
        if (p < 0)
            p += r;
        if (p < 0 || p >= r || seen[p])
            return false;
        seen[p] = true;
        perm[d] = p;
    }
    return true;
}

static int infer_transpose(wf_node *n, char *err, size_t errlen)
{
    const wf_node *x = n->inputs[0];
    int r = x->shape.rank, perm[WF_MAX_RANK];
    if (!wf__transpose_perm(n->attrs, r, perm)) {
        char s1[160], p[200];
        size_t k = 0;
        p[0] = '\0';
        int m = n->attrs->n_axes;
        for (int d = 0; d < m && d < WF_MAX_RANK && k < sizeof p; d++) {
            int w = snprintf(p + k, sizeof p - k, "%s%d", d ? ", " : "", (int)n->attrs->axes[d]);
            k += w > 0 ? (size_t)w : 0;
        }
        snprintf(err, errlen,
                 "x is %s; perm (%d entries: [%s]) is not a permutation of its %d axes",
                 SH(x->shape, s1), m, p, r);
        return WF_EINVAL;
    }
    wf_shape s = { .rank = r };
    for (int d = 0; d < r; d++)
        s.dims[d] = x->shape.dims[perm[d]];
    n->dtype = x->dtype;
    n->shape = s;
    return 0;
}

static int kernel_transpose(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                            wf_tensor **out)
{
    wf_kctx k = wf__ops_kctx(ctx);
    int perm[WF_MAX_RANK], r = in[0]->shape.rank;
    if (!wf__transpose_perm(n->attrs, r, perm))
        return wf__err(WF_EINVAL, "transpose: bad permutation for rank %d", r);
    return wf__transpose_cpu(&k, perm, r, in[0], *out);
}

DEF_OP(transpose, 1, 1, 0)

wf_node *(wf_transpose)(wf_graph *g, wf_node *x, const int *perm, int n)
{
    wf_attrs a = zero_attrs();
    if (perm && n != 0) {
        /* An n outside [1, WF_MAX_RANK] is kept so inference refuses it with the shape. */
        a.n_axes = n;
        for (int d = 0; d < n && d < WF_MAX_RANK; d++)
            a.axes[d] = perm[d];
        if (n < 0 || n > WF_MAX_RANK)
            a.n_axes = -1;
    }
    return wf__node_add(g, &wf_op_transpose, &x, 1, &a);
}

/* ---- slice --------------------------------------------------------------------------------- */

static int infer_slice(wf_node *n, char *err, size_t errlen)
{
    const wf_node *x = n->inputs[0];
    const wf_attrs *a = n->attrs;
    wf_shape s = x->shape;
    for (int d = 0; d < s.rank; d++) {
        int64_t start, len;
        if (a->step[d] == 0) {
            char s1[160];
            snprintf(err, errlen, "x is %s; step 0 on axis %d", SH(x->shape, s1), d);
            return WF_EINVAL;
        }
        if (s.dims[d] < 0)
            continue; /* unknown until fed */
        (void)wf__slice_dim(s.dims[d], a->begin[d], a->end[d], a->step[d], &start, &len);
        s.dims[d] = len;
    }
    n->dtype = x->dtype;
    n->shape = s;
    return 0;
}

static int kernel_slice(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                        wf_tensor **out)
{
    wf_kctx k = wf__ops_kctx(ctx);
    return wf__slice_cpu(&k, n->attrs->begin, n->attrs->end, n->attrs->step, in[0], *out);
}

DEF_OP(slice, 1, 1, 0)

/* Also the attributes of slice_backward (ops/backward.c): one place for the defaults. */
void wf__slice_attrs(int rank, const int64_t *begin, const int64_t *end, const int64_t *step,
                     int64_t *b, int64_t *e, int64_t *s)
{
    for (int d = 0; d < rank && d < WF_MAX_RANK; d++) {
        int64_t st = step ? step[d] : 1;
        s[d] = st;
        b[d] = begin ? begin[d] : st > 0 ? 0 : INT64_MAX;
        e[d] = end ? end[d] : st > 0 ? INT64_MAX : INT64_MIN;
    }
}

wf_node *(wf_slice)(wf_graph *g, wf_node *x, const int64_t *begin, const int64_t *end,
                    const int64_t *step)
{
    wf_attrs a = zero_attrs();
    wf__slice_attrs(x ? x->shape.rank : 0, begin, end, step, a.begin, a.end, a.step);
    return wf__node_add(g, &wf_op_slice, &x, 1, &a);
}

/* ---- split: n nodes of op "split", each one part ------------------------------------------- */

static int infer_split(wf_node *n, char *err, size_t errlen)
{
    const wf_node *x = n->inputs[0];
    int r = x->shape.rank, ax = n->attrs->axis, parts = n->attrs->groups;
    char s1[160];
    if (ax < -r || ax >= r) {
        snprintf(err, errlen, "x is %s; axis %d is outside [%d, %d)", SH(x->shape, s1), ax, -r, r);
        return WF_EINVAL;
    }
    if (ax < 0)
        ax += r;
    if (parts < 1) {
        snprintf(err, errlen, "x is %s; %d parts (at least 1)", SH(x->shape, s1), parts);
        return WF_EINVAL;
    }
    int64_t dim = x->shape.dims[ax];
    wf_shape s = x->shape;
    if (dim >= 0) {
        if (dim % parts != 0) {
            snprintf(err, errlen,
                     "x is %s; axis %d of size %lld does not split into %d equal parts",
                     SH(x->shape, s1), ax, (long long)dim, parts);
            return WF_ESHAPE;
        }
        s.dims[ax] = dim / parts;
    }
    n->dtype = x->dtype;
    n->shape = s;
    return 0;
}

int wf__ops_split_box(const wf_node *n, const wf_tensor *x, int64_t *begin, int64_t *end,
                      int64_t *step)
{
    int r = x->shape.rank, ax = n->attrs->axis, parts = n->attrs->groups;
    if (ax < 0)
        ax += r;
    if (ax < 0 || ax >= r || parts < 1)
        return wf__err(WF_EINVAL, "split: axis %d or %d parts do not fit rank %d", n->attrs->axis,
                       parts, r);
    for (int d = 0; d < r; d++) {
        begin[d] = 0;
        end[d] = x->shape.dims[d];
        step[d] = 1;
    }
    int64_t w = x->shape.dims[ax] / parts;
    begin[ax] = w * n->attrs->depth;
    end[ax] = begin[ax] + w;
    return 0;
}

static int kernel_split(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                        wf_tensor **out)
{
    wf_kctx k = wf__ops_kctx(ctx);
    const wf_tensor *x = in[0];
    int64_t begin[WF_MAX_RANK], end[WF_MAX_RANK], step[WF_MAX_RANK];
    int rc = wf__ops_split_box(n, x, begin, end, step);
    if (rc < 0)
        return rc;
    return wf__slice_cpu(&k, begin, end, step, x, *out);
}

DEF_OP(split, 1, 1, 0)

int(wf_split)(wf_graph *g, wf_node *x, int axis, int n_parts, wf_node **outs)
{
    /* Without 'outs' the parts could never be reached: refused before any is added. */
    if (!outs)
        return wf__graph_fail(g, WF_EINVAL, "wf_split: outs is NULL (room for %d nodes needed)",
                              n_parts);
    wf_srcloc loc = wf__srcloc_take();
    wf_attrs a = zero_attrs();
    a.axis = axis;
    a.groups = n_parts;
    int parts = n_parts > 0 ? n_parts : 1; /* n_parts < 1: one node, which inference refuses */
    for (int i = 0; i < parts; i++) {
        a.depth = i;
        wf_node *p = wf__node_add_ex(g, &wf_op_split, NULL, &x, 1, &a, loc);
        if (!p) {
            for (int j = 0; j < n_parts; j++)
                outs[j] = NULL;
            int rc = wf_graph_status(g);
            return rc < 0 ? rc : WF_EINVAL;
        }
        outs[i] = p;
    }
    return 0;
}

/* ---- concat and stack ---------------------------------------------------------------------- */

/* "[2, 3], [2, 4] and [3, 3]": the shapes of every input of 'n'. */
static const char *input_shapes(const wf_node *n, char *buf, size_t size)
{
    size_t k = 0;
    buf[0] = '\0';
    for (int i = 0; i < n->n_inputs && k < size; i++) {
        char s[160];
        int w = snprintf(buf + k, size - k, "%s%s %s",
                         i == 0                 ? ""
                         : i + 1 == n->n_inputs ? " and "
                                                : ", ",
                         wf_dtype_name(n->inputs[i]->dtype), SH(n->inputs[i]->shape, s));
        k += w > 0 ? (size_t)w : 0;
    }
    return buf;
}

/* Shared by concat ('stack' false) and stack: checks dtypes, ranks and dimensions. */
static int infer_join(wf_node *n, bool stack, char *err, size_t errlen)
{
    const wf_node *x0 = n->inputs[0];
    int r = x0->shape.rank, ax = n->attrs->axis, out_r = stack ? r + 1 : r;
    char all[600];
    for (int i = 1; i < n->n_inputs; i++)
        if (n->inputs[i]->dtype != x0->dtype) {
            snprintf(err, errlen, "the inputs are %s: the dtypes must be equal",
                     input_shapes(n, all, sizeof all));
            return WF_EDTYPE;
        }
    if (ax < -out_r || ax >= out_r || out_r > WF_MAX_RANK) {
        snprintf(err, errlen, "the inputs are %s; axis %d is outside [%d, %d)",
                 input_shapes(n, all, sizeof all), ax, -out_r, out_r);
        return WF_EINVAL;
    }
    if (ax < 0)
        ax += out_r;
    wf_shape s = x0->shape;
    for (int i = 1; i < n->n_inputs; i++) {
        wf_shape si = n->inputs[i]->shape;
        bool ok = si.rank == r;
        for (int d = 0; ok && d < r; d++) {
            if (!stack && d == ax) {
                if (s.dims[d] < 0 || si.dims[d] < 0)
                    s.dims[d] = -1;
                else if (!wf__dims_add(s.dims[d], si.dims[d], &s.dims[d])) {
                    snprintf(err, errlen,
                             "the lengths along axis %d of the inputs add up to more "
                             "than " WF__MAX_NUMEL_STR
                             " (the most a tensor may hold); the inputs are %s",
                             ax, input_shapes(n, all, sizeof all));
                    return WF_ESHAPE;
                }
                continue;
            }
            ok = wf__ops_dims_fit(s.dims[d], si.dims[d]);
            if (ok && s.dims[d] < 0)
                s.dims[d] = si.dims[d];
        }
        if (!ok) {
            snprintf(err, errlen,
                     stack ? "the inputs are %s: stack needs equal shapes"
                           : "the inputs are %s: concat along axis %d needs equal ranks and "
                             "equal dimensions off that axis",
                     input_shapes(n, all, sizeof all), ax);
            return WF_ESHAPE;
        }
    }
    if (stack) {
        wf_shape t = { .rank = out_r };
        for (int d = 0, k = 0; d < out_r; d++)
            t.dims[d] = d == ax ? n->n_inputs : s.dims[k++];
        s = t;
    } else if (r == 0) {
        snprintf(err, errlen, "the inputs are %s: concat needs rank >= 1",
                 input_shapes(n, all, sizeof all));
        return WF_ESHAPE;
    }
    n->dtype = x0->dtype;
    n->shape = s;
    return 0;
}

static int infer_concat(wf_node *n, char *err, size_t errlen)
{
    return infer_join(n, false, err, errlen);
}

static int infer_stack(wf_node *n, char *err, size_t errlen)
{
    return infer_join(n, true, err, errlen);
}

static int kernel_concat(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                         wf_tensor **out)
{
    wf_kctx k = wf__ops_kctx(ctx);
    int ax = n->attrs->axis;
    if (ax < 0)
        ax += (*out)->shape.rank;
    return wf__concat_cpu(&k, ax, (const wf_tensor *const *)in, n->n_inputs, *out);
}

static int kernel_stack(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                        wf_tensor **out)
{
    wf_kctx k = wf__ops_kctx(ctx);
    int ax = n->attrs->axis;
    if (ax < 0)
        ax += (*out)->shape.rank;
    return wf__stack_cpu(&k, ax, (const wf_tensor *const *)in, n->n_inputs, *out);
}

DEF_OP(concat, 1, -1, 0)
DEF_OP(stack, 1, -1, 0)

static wf_node *join_ctor(wf_graph *g, const wf_op_def *op, wf_node *const *xs, int n, int axis)
{
    wf_attrs a = zero_attrs();
    a.axis = axis;
    /* n < 1 or NULL 'xs': no inputs; wf__node_add() refuses the arity with op and count. */
    return wf__node_add(g, op, xs && n > 0 ? xs : NULL, xs && n > 0 ? n : 0, &a);
}

wf_node *(wf_concat)(wf_graph *g, wf_node *const *xs, int n, int axis)
{
    return join_ctor(g, &wf_op_concat, xs, n, axis);
}

wf_node *(wf_stack)(wf_graph *g, wf_node *const *xs, int n, int axis)
{
    return join_ctor(g, &wf_op_stack, xs, n, axis);
}

/* ---- pad ----------------------------------------------------------------------------------- */

static int infer_pad(wf_node *n, char *err, size_t errlen)
{
    const wf_node *x = n->inputs[0];
    const wf_attrs *a = n->attrs;
    wf_shape s = x->shape;
    for (int d = 0; d < s.rank; d++) {
        if (a->begin[d] < 0 || a->end[d] < 0) {
            char s1[160];
            snprintf(err, errlen, "x is %s; padding %lld before and %lld after axis %d (>= 0)",
                     SH(x->shape, s1), (long long)a->begin[d], (long long)a->end[d], d);
            return WF_EINVAL;
        }
        if (s.dims[d] >= 0 && (!wf__dims_add(s.dims[d], a->begin[d], &s.dims[d]) ||
                               !wf__dims_add(s.dims[d], a->end[d], &s.dims[d]))) {
            char s1[160];
            snprintf(err, errlen,
                     "x is %s; padding %lld before and %lld after axis %d makes it longer "
                     "than " WF__MAX_NUMEL_STR " (the most elements a tensor may hold)",
                     SH(x->shape, s1), (long long)a->begin[d], (long long)a->end[d], d);
            return WF_ESHAPE;
        }
    }
    n->dtype = x->dtype;
    n->shape = s;
    return 0;
}

static int kernel_pad(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                      wf_tensor **out)
{
    wf_kctx k = wf__ops_kctx(ctx);
    return wf__pad_cpu(&k, n->attrs->begin, n->attrs->end, n->attrs->alpha, in[0], *out);
}

DEF_OP(pad, 1, 1, 0)

wf_node *(wf_pad)(wf_graph *g, wf_node *x, const int64_t *before, const int64_t *after,
                  double value)
{
    wf_attrs a = zero_attrs();
    int r = x ? x->shape.rank : 0;
    for (int d = 0; d < r && d < WF_MAX_RANK; d++) {
        a.begin[d] = before ? before[d] : 0;
        a.end[d] = after ? after[d] : 0;
    }
    a.alpha = value;
    return wf__node_add(g, &wf_op_pad, &x, 1, &a);
}

/* ---- broadcast_to -------------------------------------------------------------------------- */

static int infer_broadcast_to(wf_node *n, char *err, size_t errlen)
{
    const wf_node *x = n->inputs[0];
    wf_shape t = n->attrs->shape;
    char s1[160], s2[160];
    bool ok = t.rank >= x->shape.rank && t.rank <= WF_MAX_RANK;
    for (int d = 0; ok && d < t.rank; d++)
        ok = t.dims[d] >= 0;
    if (!ok) {
        snprintf(err, errlen,
                 "x is %s; the target %s must have x's rank or more and no negative dimension",
                 SH(x->shape, s1), SH(t, s2));
        return WF_EINVAL;
    }
    int k = t.rank - x->shape.rank;
    for (int d = 0; d < x->shape.rank; d++) {
        int64_t xd = x->shape.dims[d];
        if (xd != 1 && !wf__ops_dims_fit(xd, t.dims[d + k])) {
            snprintf(err, errlen, "x is %s and does not broadcast to %s (axis %d: %lld vs %lld)",
                     SH(x->shape, s1), SH(t, s2), d, (long long)xd, (long long)t.dims[d + k]);
            return WF_ESHAPE;
        }
    }
    n->dtype = x->dtype;
    n->shape = t;
    return 0;
}

static int kernel_broadcast_to(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                               wf_tensor **out)
{
    wf_kctx k = wf__ops_kctx(ctx);
    (void)n;
    return wf__broadcast_to_cpu(&k, in[0], *out);
}

DEF_OP(broadcast_to, 1, 1, 0)

wf_node *(wf_broadcast_to)(wf_graph *g, wf_node *x, wf_shape shape)
{
    wf_attrs a = zero_attrs();
    a.shape = shape;
    return wf__node_add(g, &wf_op_broadcast_to, &x, 1, &a);
}
