/* ops/elementwise.c: the elementwise ops: unary math and activations, cast, binary arithmetic
 * and comparisons with broadcasting, where, and the activations' gradients (relu_grad ...
 * tanh_grad): their constructors, dtype and shape inference, costs and op-table entries.
 * Owns: the op defs wf_op_neg ... wf_op_where and wf_op_relu_grad ... wf_op_tanh_grad
 *   (ops/table.h), the public constructors of weft/ops.h's elementwise sections and
 *   wf_activation_grad() (weft/nn.h).
 * Invariants: each constructor makes exactly one call to wf__node_add(), so it consumes
 *   exactly one pending source location on every path (core/graph.h); every check of
 *   arguments happens in inference, so its message gets the node's prefix and file:line.
 *   Inference takes only the dtypes the CPU kernel supports, so an unsupported dtype fails
 *   when the node is built, in static graphs too, not when it first runs.
 * Not here: the loops (elementwise_cpu.c), gradients (grad/). */
#include "internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* ---- Shared helpers (declared in internal.h) ----------------------------------------------- */

double wf__ops_numel(wf_shape s)
{
    double n = 1;
    for (int i = 0; i < s.rank; i++)
        n *= s.dims[i] >= 0 ? (double)s.dims[i] : 1.0;
    return n;
}

double wf__ops_bytes(const wf_node *n)
{
    double b = wf__ops_numel(n->shape) * (double)wf_dtype_size(n->dtype);
    for (int i = 0; i < n->n_inputs; i++)
        b += wf__ops_numel(n->inputs[i]->shape) * (double)wf_dtype_size(n->inputs[i]->dtype);
    return b;
}

void wf__ops_cost_elementwise(const wf_node *n, double per_elem, double *flops, double *bytes)
{
    *flops = per_elem * wf__ops_numel(n->shape);
    *bytes = wf__ops_bytes(n);
}

bool wf__ops_dtype_ok(wf_dtype dt, bool ints)
{
    return wf_dtype_is_float(dt) || (ints && (dt == WF_I32 || dt == WF_I64));
}

int wf__ops_bad_dtype(const wf_node *n, int n_in, const char *what, bool ints, char *err,
                      size_t errlen)
{
    char shapes[400];
    size_t k = 0;
    shapes[0] = '\0';
    for (int i = 0; i < n_in && k < sizeof shapes; i++) {
        char s[160];
        int w = snprintf(shapes + k, sizeof shapes - k, "%s%s", i ? " and " : "",
                         wf_shape_str(n->inputs[i]->shape, s, sizeof s));
        k += w > 0 ? (size_t)w : 0;
    }
    snprintf(err, errlen, "%s %s %s %s; %s takes %s", what, n_in > 1 ? "are" : "is",
             wf_dtype_name(n->inputs[0]->dtype), shapes, n->op->name,
             ints ? "f32, f64, bf16, f16, i32 or i64" : "f32, f64, bf16 or f16");
    return WF_EDTYPE;
}

/* ---- Unary --------------------------------------------------------------------------------- */

static int infer_unary(wf_node *n, bool ints, char *err, size_t errlen)
{
    const wf_node *x = n->inputs[0];
    if (!wf__ops_dtype_ok(x->dtype, ints))
        return wf__ops_bad_dtype(n, 1, "x", ints, err, errlen);
    n->dtype = x->dtype;
    n->shape = x->shape;
    return 0;
}

/* X(name, WF_UNARY_ op, i32 and i64 too, flops per element, extra flags). The transcendental
 * ones count ~10 flops (a libm call), a measure for placement only. */
#define UNARY_OPS(X)                       \
    X(neg, NEG, true, 1, 0)                \
    X(abs, ABS, true, 1, 0)                \
    X(exp, EXP, false, 10, 0)              \
    X(log, LOG, false, 10, 0)              \
    X(sqrt, SQRT, false, 4, 0)             \
    X(rsqrt, RSQRT, false, 5, 0)           \
    X(square, SQUARE, true, 1, 0)          \
    X(tanh, TANH, false, 10, 0)            \
    X(sigmoid, SIGMOID, false, 12, 0)      \
    X(relu, RELU, true, 1, 0)              \
    X(leaky_relu, LEAKY_RELU, false, 2, 0) \
    X(gelu, GELU_ERF, false, 14, 0)        \
    X(gelu_tanh, GELU_TANH, false, 16, 0)  \
    X(silu, SILU, false, 13, 0)            \
    X(sign, SIGN, true, 1, WF_OP_NO_GRAD)

/* The cost function and the op def of elementwise op 'id' (unary, binary, activation
 * gradients), given its 'kernel_##id', its inference 'INFER' and 'N_IN' inputs. */
#define EW_OP_DEF(id, N_IN, INFER, FLOPS, FLAGS)                                             \
    static void cost_##id(const wf_node *n, double *flops, double *bytes)                    \
    {                                                                                        \
        wf__ops_cost_elementwise(n, FLOPS, flops, bytes);                                    \
    }                                                                                        \
    const wf_op_def wf_op_##id = {                                                           \
        .name = #id,                                                                         \
        .min_inputs = N_IN,                                                                  \
        .max_inputs = N_IN,                                                                  \
        .infer = INFER,                                                                      \
        .kernel = { [WF_KERNEL_CPU] = kernel_##id, [WF_KERNEL_CUDA] = WF__CUDA_KERNEL(id) }, \
        .cost = cost_##id,                                                                   \
        .flags = WF_OP_ELEMENTWISE | (FLAGS),                                                \
    };

#define DEF_UNARY(id, OP, INTS, FLOPS, FLAGS)                                                \
    static int infer_##id(wf_node *n, char *err, size_t errlen)                              \
    {                                                                                        \
        return infer_unary(n, INTS, err, errlen);                                            \
    }                                                                                        \
    static int kernel_##id(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in, \
                           wf_tensor **out)                                                  \
    {                                                                                        \
        wf_kctx k = wf__ops_kctx(ctx);                                                       \
        return wf__unary_cpu(&k, WF_UNARY_##OP, n->attrs->alpha, in[0], *out);               \
    }                                                                                        \
    EW_OP_DEF(id, 1, infer_##id, FLOPS, WF_OP_INPLACE | (FLAGS))
UNARY_OPS(DEF_UNARY)

static wf_node *unary(wf_graph *g, const wf_op_def *op, wf_node *x, double alpha)
{
    /* No alpha (+0.0, not -0.0: the bags differ in bits) is the all-zero bag, which NULL
     * stands for: it spares clearing, comparing and hashing a whole wf_attrs per node. */
    if (alpha == 0 && !signbit(alpha))
        return wf__node_add(g, op, &x, 1, NULL);
    wf_attrs a;
    memset(&a, 0, sizeof a); /* padding too: equal bags are shared (core/graph.h) */
    a.alpha = alpha;
    return wf__node_add(g, op, &x, 1, &a);
}

#define UNARY_CTOR(name)                            \
    wf_node *(wf_##name)(wf_graph * g, wf_node * x) \
    {                                               \
        return unary(g, &wf_op_##name, x, 0);       \
    }
UNARY_CTOR(neg)
UNARY_CTOR(abs)
UNARY_CTOR(exp)
UNARY_CTOR(log)
UNARY_CTOR(sqrt)
UNARY_CTOR(rsqrt)
UNARY_CTOR(square)
UNARY_CTOR(tanh)
UNARY_CTOR(sigmoid)
UNARY_CTOR(relu)
UNARY_CTOR(silu)
UNARY_CTOR(sign)

wf_node *(wf_leaky_relu)(wf_graph *g, wf_node *x, double alpha)
{
    return unary(g, &wf_op_leaky_relu, x, alpha);
}

wf_node *(wf_gelu)(wf_graph *g, wf_node *x, bool approximate_tanh)
{
    return unary(g, approximate_tanh ? &wf_op_gelu_tanh : &wf_op_gelu, x, 0);
}

/* ---- cast ---------------------------------------------------------------------------------- */

static int infer_cast(wf_node *n, char *err, size_t errlen)
{
    wf_dtype to = n->attrs->dtype;
    if (to == WF_DTYPE_INVALID || wf_dtype_size(to) == 0) {
        snprintf(err, errlen, "the target dtype %d is not a wf_dtype (x is %s)", (int)to,
                 wf_dtype_name(n->inputs[0]->dtype));
        return WF_EINVAL;
    }
    n->dtype = to;
    n->shape = n->inputs[0]->shape;
    return 0;
}

static int kernel_cast(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                       wf_tensor **out)
{
    wf_kctx k = wf__ops_kctx(ctx);
    return wf__cast_cpu(&k, in[0], *out);
}

static void cost_cast(const wf_node *n, double *flops, double *bytes)
{
    wf__ops_cost_elementwise(n, 1, flops, bytes);
}

const wf_op_def wf_op_cast = {
    .name = "cast",
    .min_inputs = 1,
    .max_inputs = 1,
    .infer = infer_cast,
    .kernel = { [WF_KERNEL_CPU] = kernel_cast, [WF_KERNEL_CUDA] = WF__CUDA_KERNEL(cast) },
    .cost = cost_cast,
    .flags = WF_OP_ELEMENTWISE,
};

wf_node *(wf_cast)(wf_graph *g, wf_node *x, wf_dtype dtype)
{
    wf_attrs a;
    memset(&a, 0, sizeof a);
    a.dtype = dtype;
    return wf__node_add(g, &wf_op_cast, &x, 1, &a);
}

/* ---- Binary -------------------------------------------------------------------------------- */

/* Broadcasts the shapes of n's inputs 'first'.. (named by 'names') into '*out'; the message
 * names every one of them. */
static int broadcast_inputs(const wf_node *n, int first, const char *const *names, wf_shape *out,
                            char *err, size_t errlen)
{
    wf_shape r = n->inputs[first]->shape;
    for (int i = first + 1; i < n->n_inputs; i++) {
        const wf_shape *b = &n->inputs[i]->shape;
        bool same = b->rank == r.rank;
        for (int d = 0; same && d < r.rank; d++)
            same = b->dims[d] == r.dims[d];
        if (same) /* the usual case, and what wf_shape_broadcast() would give */
            continue;
        wf_shape t;
        if (wf_shape_broadcast(r, *b, &t) < 0) {
            size_t k = 0;
            for (int j = first; j < n->n_inputs && k < errlen; j++) {
                char s[160];
                int w = snprintf(err + k, errlen - k, "%s%s is %s",
                                 j == first             ? ""
                                 : j + 1 == n->n_inputs ? " and "
                                                        : ", ",
                                 names[j - first], wf_shape_str(n->inputs[j]->shape, s, sizeof s));
                k += w > 0 ? (size_t)w : 0;
            }
            if (k < errlen)
                snprintf(err + k, errlen - k, ": they do not broadcast");
            return WF_ESHAPE;
        }
        r = t;
    }
    *out = r;
    return 0;
}

/* 'a' and 'b' are inputs 'first' and 'first' + 1 of 'n'. */
static int same_dtype(const wf_node *n, int first, char *err, size_t errlen)
{
    const wf_node *a = n->inputs[first], *b = n->inputs[first + 1];
    if (a->dtype == b->dtype)
        return 0;
    char s1[160], s2[160];
    snprintf(err, errlen,
             "a is %s %s but b is %s %s: the dtypes must be equal (no implicit promotion; "
             "convert one with wf_cast)",
             wf_dtype_name(a->dtype), wf_shape_str(a->shape, s1, sizeof s1),
             wf_dtype_name(b->dtype), wf_shape_str(b->shape, s2, sizeof s2));
    return WF_EDTYPE;
}

static const char *const ab_names[] = { "a", "b" };

/* 'kind': 0 floating only (pow), 1 floating and i32/i64, 2 any dtype with a bool result. */
static int infer_binary(wf_node *n, int kind, char *err, size_t errlen)
{
    int rc = same_dtype(n, 0, err, errlen);
    if (rc < 0)
        return rc;
    wf_dtype dt = n->inputs[0]->dtype;
    if (kind < 2 && !wf__ops_dtype_ok(dt, kind == 1))
        return wf__ops_bad_dtype(n, 2, "a and b", kind == 1, err, errlen);
    n->dtype = kind == 2 ? WF_BOOL : dt;
    return broadcast_inputs(n, 0, ab_names, &n->shape, err, errlen);
}

/* X(name, WF_BINARY_ op, kind (as infer_binary), flops per element, flags) */
#define BINARY_OPS(X)                        \
    X(add, ADD, 1, 1, WF_OP_INPLACE)         \
    X(sub, SUB, 1, 1, WF_OP_INPLACE)         \
    X(mul, MUL, 1, 1, WF_OP_INPLACE)         \
    X(div, DIV, 1, 1, WF_OP_INPLACE)         \
    X(pow, POW, 0, 20, WF_OP_INPLACE)        \
    X(maximum, MAXIMUM, 1, 1, WF_OP_INPLACE) \
    X(minimum, MINIMUM, 1, 1, WF_OP_INPLACE) \
    X(eq, EQ, 2, 1, WF_OP_NO_GRAD)           \
    X(ne, NE, 2, 1, WF_OP_NO_GRAD)           \
    X(lt, LT, 2, 1, WF_OP_NO_GRAD)           \
    X(le, LE, 2, 1, WF_OP_NO_GRAD)           \
    X(gt, GT, 2, 1, WF_OP_NO_GRAD)           \
    X(ge, GE, 2, 1, WF_OP_NO_GRAD)

#define DEF_BINARY(id, OP, KIND, FLOPS, FLAGS)                                               \
    static int infer_##id(wf_node *n, char *err, size_t errlen)                              \
    {                                                                                        \
        return infer_binary(n, KIND, err, errlen);                                           \
    }                                                                                        \
    static int kernel_##id(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in, \
                           wf_tensor **out)                                                  \
    {                                                                                        \
        wf_kctx k = wf__ops_kctx(ctx);                                                       \
        return wf__binary_cpu(&k, WF_BINARY_##OP, in[0], in[1], *out);                       \
    }                                                                                        \
    EW_OP_DEF(id, 2, infer_##id, FLOPS, FLAGS)                                               \
    wf_node *(wf_##id)(wf_graph * g, wf_node * a, wf_node * b)                               \
    {                                                                                        \
        wf_node *in[2] = { a, b };                                                           \
        return wf__node_add(g, &wf_op_##id, in, 2, NULL);                                    \
    }
BINARY_OPS(DEF_BINARY)

/* ---- where --------------------------------------------------------------------------------- */

static const char *const where_names[] = { "cond", "a", "b" };

static int infer_where(wf_node *n, char *err, size_t errlen)
{
    const wf_node *c = n->inputs[0];
    if (c->dtype != WF_BOOL) {
        char s[160];
        snprintf(err, errlen, "cond is %s %s but must be bool (make it with a comparison)",
                 wf_dtype_name(c->dtype), wf_shape_str(c->shape, s, sizeof s));
        return WF_EDTYPE;
    }
    int rc = same_dtype(n, 1, err, errlen);
    if (rc < 0)
        return rc;
    wf_shape s;
    rc = broadcast_inputs(n, 0, where_names, &s, err, errlen);
    if (rc < 0)
        return rc;
    n->dtype = n->inputs[1]->dtype;
    n->shape = s;
    return 0;
}

static int kernel_where(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                        wf_tensor **out)
{
    wf_kctx k = wf__ops_kctx(ctx);
    return wf__where_cpu(&k, in[0], in[1], in[2], *out);
}

static void cost_where(const wf_node *n, double *flops, double *bytes)
{
    wf__ops_cost_elementwise(n, 1, flops, bytes);
}

const wf_op_def wf_op_where = {
    .name = "where",
    .min_inputs = 3,
    .max_inputs = 3,
    .infer = infer_where,
    .kernel = { [WF_KERNEL_CPU] = kernel_where, [WF_KERNEL_CUDA] = WF__CUDA_KERNEL(where) },
    .cost = cost_where,
    .flags = WF_OP_ELEMENTWISE,
};

wf_node *(wf_where)(wf_graph *g, wf_node *cond, wf_node *a, wf_node *b)
{
    wf_node *in[3] = { cond, a, b };
    return wf__node_add(g, &wf_op_where, in, 3, NULL);
}

/* ---- Activation gradients (weft/nn.h) ---------------------------------------------------- */

/* x (or y) and dy: one floating dtype and one shape (a -1 fits the other side's size). */
static int infer_act_grad(wf_node *n, char *err, size_t errlen)
{
    const wf_node *x = n->inputs[0], *dy = n->inputs[1];
    char s1[160], s2[160];
    if (x->dtype != dy->dtype || !wf_dtype_is_float(x->dtype)) {
        snprintf(err, errlen, "x is %s %s and dy is %s %s; %s takes one of f32, f64, bf16, f16",
                 wf_dtype_name(x->dtype), wf_shape_str(x->shape, s1, sizeof s1),
                 wf_dtype_name(dy->dtype), wf_shape_str(dy->shape, s2, sizeof s2), n->op->name);
        return WF_EDTYPE;
    }
    wf_shape s = x->shape;
    bool fits = x->shape.rank == dy->shape.rank;
    for (int d = 0; fits && d < s.rank; d++) {
        fits = wf__ops_dims_fit(s.dims[d], dy->shape.dims[d]);
        if (s.dims[d] == -1)
            s.dims[d] = dy->shape.dims[d];
    }
    if (!fits) {
        snprintf(err, errlen, "x is %s but dy is %s: they must be equal (no broadcasting)",
                 wf_shape_str(x->shape, s1, sizeof s1), wf_shape_str(dy->shape, s2, sizeof s2));
        return WF_ESHAPE;
    }
    n->dtype = x->dtype;
    n->shape = s;
    return 0;
}

/* X(name, WF_ACT_GRAD_ op, flops per element) */
#define ACT_GRAD_OPS(X)               \
    X(relu_grad, RELU, 1)             \
    X(leaky_relu_grad, LEAKY_RELU, 2) \
    X(gelu_grad, GELU_ERF, 26)        \
    X(gelu_tanh_grad, GELU_TANH, 24)  \
    X(silu_grad, SILU, 16)            \
    X(sigmoid_grad, SIGMOID, 3)       \
    X(tanh_grad, TANH, 3)

#define DEF_ACT_GRAD(id, OP, FLOPS)                                                          \
    static int kernel_##id(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in, \
                           wf_tensor **out)                                                  \
    {                                                                                        \
        wf_kctx k = wf__ops_kctx(ctx);                                                       \
        wf_act_grad_op op = WF_ACT_GRAD_##OP;                                                \
        return wf__activation_grad_cpu(&k, op, n->attrs->alpha, in[0], in[1], *out);         \
    }                                                                                        \
    EW_OP_DEF(id, 2, infer_act_grad, FLOPS, WF_OP_INPLACE)
ACT_GRAD_OPS(DEF_ACT_GRAD)

/* Indexed by wf_activation. */
static const wf_op_def *const act_grad_defs[WF_ACT_COUNT] = {
    [WF_ACT_RELU] = &wf_op_relu_grad, [WF_ACT_LEAKY_RELU] = &wf_op_leaky_relu_grad,
    [WF_ACT_GELU] = &wf_op_gelu_grad, [WF_ACT_GELU_TANH] = &wf_op_gelu_tanh_grad,
    [WF_ACT_SILU] = &wf_op_silu_grad, [WF_ACT_SIGMOID] = &wf_op_sigmoid_grad,
    [WF_ACT_TANH] = &wf_op_tanh_grad,
};

wf_node *(wf_activation_grad)(wf_graph *g, wf_activation act, wf_node *x_or_y, wf_node *dy,
                              double alpha)
{
    if ((unsigned)act >= WF_ACT_COUNT) { /* no op to infer with: name the call site here */
        wf_srcloc loc = wf__srcloc_take();
        wf_set_source_location(loc.file, loc.line); /* for wf__graph_fail() to consume */
        const char *f = loc.file ? strrchr(loc.file, '/') : NULL;
        wf__graph_fail(g, WF_EINVAL, "activation_grad (%s:%d): %d is not a wf_activation",
                       f          ? f + 1
                       : loc.file ? loc.file
                                  : "?",
                       loc.line, (int)act);
        return NULL;
    }
    wf_attrs a;
    memset(&a, 0, sizeof a);
    a.alpha = act == WF_ACT_LEAKY_RELU ? alpha : 0; /* other ops share one bag */
    wf_node *in[2] = { x_or_y, dy };
    return wf__node_add(g, act_grad_defs[act], in, 2, &a);
}
