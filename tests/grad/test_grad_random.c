/* tests/grad/test_grad_random.c: the randomized gradient checker. Each seed draws a graph of
 * 2 to 8 ops from every differentiable op that has a public constructor (elementwise math and
 * activations, broadcasting binary ops, where, every reduction, matmul with transpose flags
 * and batches, softmax, log_softmax and the cross-entropy loss, the shape ops, gather,
 * scatter_add, slice_backward, conv2d, both pools, layer norm, dropout), over f64 inputs of
 * random shapes, some fed as strided views (stepped, or with reversed and transposed strides)
 * and some declared with -1 dimensions that are fed at run time (sizes 1 included). The
 * internal ops only gradients make (unreduce, reshape_like, sum_like, prod_grad) are reached
 * through those gradients. For each graph:
 *   - the gradient of L = sum(y * R) (R fixed, random) with respect to every f64 input, built
 *     with wf_gradients in an eager graph and in a static one (built in lockstep, so they are
 *     the same graph), the static one run with every compile pass and with none
 *     (WF_SESSION_NO_PASSES): the three must agree bit for bit, value and shape (each
 *     gradient has its input's run-time shape);
 *   - the gradient against central finite differences of L, for a few elements per input.
 *     Tolerance: |analytic - numeric| <= 1e-5 (|analytic| + |numeric|) + 1e-6 (1 + |L|), with
 *     h = 1e-5 max(1, |x|). The truncation error h^2 f'''/6 is ~1e-10 f''' and the rounding
 *     error ~1e-16 |L| / h ~ 1e-11 |L| for these sizes, far inside it; a wrong gradient (a
 *     missing factor, a dropped or extra broadcast sum, a wrong axis) is off by O(1). An
 *     element where the one-sided differences disagree beyond the tolerance sits on a kink
 *     (relu, abs, max, maximum, pools: a tie or a zero) and is skipped, counted; one that
 *     fails at h is tried again at h / 100 before it counts as a failure.
 * A failing graph prints its seed, the graph (one line per op: shapes, attributes, which
 * inputs are strided or -1) and what differed; WF_GRAD_FUZZ_SEED=<seed> WF_GRAD_FUZZ_COUNT=1
 * reruns exactly it. CI runs a fixed set of seeds (WF_GRAD_FUZZ_COUNT, default 300);
 * scripts/grad-fuzz.sh runs many more.
 * Not here: the per-op checks with hand-picked shapes (test_gradcheck.c). */
#include "grad_random_ops.h"
#include "gradcheck.h"

#include <inttypes.h>
#include <stdarg.h>

TestSuite(grad_random, .init = gc_setup, .fini = gc_teardown, .timeout = WF_TEST_TIMEOUT(600));

#define GR_MAX_VALS   40
#define GR_MAX_LEAVES 24
#define GR_DESC       8192

/* One value of the graph: its node in the static [0] and the eager [1] graph, and its
 * concrete shape (the shape it has when the static graph runs). */
typedef struct gr_val {
    wf_node *n[2];
    wf_shape s;
} gr_val;

/* An input: f64 (differentiated, a placeholder in the static graph) or an integer constant. */
typedef struct gr_leaf {
    wf_node *n[2];
    wf_shape s;
    wf_dtype dt;
    uint32_t dyn; /* f64: the dimensions declared -1 */
    int layout;   /* f64: 0 contiguous, 1 stepped by 2, 2 axes reversed in memory, one backwards */
    double *v;    /* the values, row-major */
    double *buf;  /* the memory the fed view reads */
    wf_tensor *t; /* the fed (or constant) tensor */
} gr_leaf;

typedef struct gr {
    uint64_t seed, st;
    wf_graph *g[2];
    gr_val v[GR_MAX_VALS];
    int nv;
    gr_leaf l[GR_MAX_LEAVES];
    int nl;
    bool has_dropout;
    char desc[GR_DESC];
    size_t dlen;
    const char *seen[96]; /* op names in the graph */
    int n_seen;
} gr;

static void say(gr *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(c->desc + c->dlen, sizeof c->desc - c->dlen, fmt, ap);
    va_end(ap);
    if (w > 0)
        c->dlen = c->dlen + (size_t)w < sizeof c->desc ? c->dlen + (size_t)w : sizeof c->desc - 1;
}

static uint64_t rnd(gr *c, uint64_t n)
{
    return wf_test_rand_below(&c->st, n);
}

static double unif(gr *c, double lo, double hi)
{
    return lo + (hi - lo) * (double)rnd(c, 1000001) / 1e6;
}

static const char *shp(wf_shape s, char *b, size_t n)
{
    return wf_shape_str(s, b, n);
}

/* The shape x broadcast against y (NumPy), assumed valid. */
static wf_shape bcast(wf_shape a, wf_shape b)
{
    wf_shape r = { .rank = a.rank > b.rank ? a.rank : b.rank };
    for (int d = 0; d < r.rank; d++) {
        int da = d - (r.rank - a.rank), db = d - (r.rank - b.rank);
        int64_t x = da >= 0 ? a.dims[da] : 1, y = db >= 0 ? b.dims[db] : 1;
        r.dims[d] = x == 1 ? y : x;
    }
    return r;
}

/* A new input of shape 's': f64 in [lo, hi) with some exact zeros (zeros: prod, relu's
 * kink), or (dt integer) values below 'below'. 'dyn_ok': its dimensions may be -1. */
static int leaf(gr *c, wf_shape s, wf_dtype dt, double lo, double hi, int64_t below, bool dyn_ok)
{
    cr_assert_lt(c->nl, GR_MAX_LEAVES);
    gr_leaf *L = &c->l[c->nl];
    memset(L, 0, sizeof *L);
    L->s = s;
    L->dt = dt;
    int64_t n = wf_shape_numel(s);
    L->v = calloc((size_t)(n ? n : 1), sizeof *L->v);
    for (int64_t i = 0; i < n; i++) {
        if (dt != WF_F64)
            L->v[i] = (double)rnd(c, (uint64_t)below);
        else
            L->v[i] = rnd(c, 6) == 0 ? 0.0 : unif(c, lo, hi);
    }
    char b[160];
    if (dt != WF_F64) {
        wf_tensor *f = wf_tensor_from(WF_F64, s, L->v);
        size_t bytes = (size_t)(n ? n : 1) * wf_dtype_size(dt);
        void *raw = malloc(bytes);
        cr_assert_eq(wf_tensor_read(f, dt, raw, bytes), 0);
        L->t = wf_tensor_from(dt, s, raw);
        free(raw);
        wf_tensor_release(f);
        for (int m = 0; m < 2; m++)
            L->n[m] = wf_constant(c->g[m], L->t);
        say(c, "  in%d = %s constant %s\n", c->nl, wf_dtype_name(dt), shp(s, b, sizeof b));
        return c->nl++;
    }
    if (dyn_ok)
        for (int d = 0; d < s.rank; d++)
            if (rnd(c, 100) < (s.dims[d] == 1 ? 50u : 25u))
                L->dyn |= 1u << d;
    L->layout = (int)rnd(c, 3);
    /* the fed view: row-major strides, doubled (stepped), or reversed axis order with the
     * first axis backwards */
    int64_t st[WF_MAX_RANK], span = 1;
    if (L->layout == 2) {
        for (int d = 0; d < s.rank; d++) {
            st[d] = span;
            span *= s.dims[d] ? s.dims[d] : 1;
        }
    } else {
        for (int d = s.rank - 1; d >= 0; d--) {
            st[d] = span * (L->layout == 1 ? 2 : 1);
            span *= s.dims[d] ? s.dims[d] : 1;
        }
        span *= L->layout == 1 ? 2 : 1;
    }
    L->buf = calloc((size_t)span + 2, sizeof *L->buf);
    int64_t base = 1;
    if (L->layout == 2 && s.rank > 0 && s.dims[0] > 1) {
        base += (s.dims[0] - 1) * st[0];
        st[0] = -st[0];
    }
    for (int64_t i = 0; i < n; i++) {
        int64_t rem = i, off = base;
        for (int d = s.rank - 1; d >= 0; d--) {
            off += (rem % s.dims[d]) * st[d];
            rem /= s.dims[d];
        }
        L->buf[off] = L->v[i];
    }
    cr_assert_eq(wf_tensor_view(WF_F64, s, st, L->buf + base, &L->t), 0, "%s", wf_last_errmsg());
    wf_shape decl = s;
    for (int d = 0; d < s.rank; d++)
        if (L->dyn & (1u << d))
            decl.dims[d] = -1;
    char name[16];
    snprintf(name, sizeof name, "in%d", c->nl);
    L->n[0] = wf_placeholder(c->g[0], name, WF_F64, decl);
    L->n[1] = wf_constant(c->g[1], L->t);
    static const char *const lay[] = { "contiguous", "stepped", "reversed strides" };
    char b2[160];
    say(c, "  in%d = f64 %s declared %s, %s\n", c->nl, shp(s, b, sizeof b),
        shp(decl, b2, sizeof b2), lay[L->layout]);
    return c->nl++;
}

static gr_val leaf_val(gr *c, int i)
{
    gr_val v = { { c->l[i].n[0], c->l[i].n[1] }, c->l[i].s };
    return v;
}

/* The static graph's shape of value 'v' (with its -1 dimensions). */
static wf_shape decl(const gr_val *v)
{
    return wf_node_shape(v->n[0]);
}

static void seen(gr *c, const char *op)
{
    for (int i = 0; i < c->n_seen; i++)
        if (!strcmp(c->seen[i], op))
            return;
    if (c->n_seen < 96)
        c->seen[c->n_seen++] = op;
}

/* Pushes the result made for both graphs ('n' of each) with concrete shape 's'. */
static int push(gr *c, wf_node *n0, wf_node *n1, wf_shape s, const char *what)
{
    char b[160];
    cr_assert_not_null(n0, "seed %" PRIu64 ": building %s (static): %s\n%s", c->seed, what,
                       wf_graph_errmsg(c->g[0]), c->desc);
    cr_assert_not_null(n1, "seed %" PRIu64 ": building %s (eager): %s\n%s", c->seed, what,
                       wf_graph_errmsg(c->g[1]), c->desc);
    cr_assert(wf_shape_equal(wf_node_shape(n1), s), "seed %" PRIu64 ": %s gave %s, expected %s",
              c->seed, what, shp(wf_node_shape(n1), b, sizeof b), shp(s, b + 80, 80));
    cr_assert_lt(c->nv, GR_MAX_VALS);
    c->v[c->nv] = (gr_val){ { n0, n1 }, s };
    say(c, "  v%d = %s -> %s\n", c->nv, what, shp(s, b, sizeof b));
    return c->nv++;
}

/* Both graphs: 'E' is an expression in G (the graph) and N(v) (a value's node there). */
#define BOTH(out0, out1, E)              \
    do {                                 \
        for (int m_ = 0; m_ < 2; m_++) { \
            wf_graph *G = c->g[m_];      \
            wf_node *r_ = (E);           \
            if (m_ == 0)                 \
                out0 = r_;               \
            else                         \
                out1 = r_;               \
        }                                \
    } while (0)
#define N(v) ((v).n[m_])

static int64_t numel(wf_shape s)
{
    return wf_shape_numel(s);
}

/* A new f64 input that broadcasts against 's': some dimensions 1, maybe fewer of them. */
static int partner(gr *c, wf_shape s, double lo, double hi)
{
    wf_shape t = s;
    int drop = s.rank > 0 && rnd(c, 4) == 0 ? (int)rnd(c, (uint64_t)s.rank + 1) : 0;
    t.rank = s.rank - drop;
    for (int d = 0; d < t.rank; d++) {
        t.dims[d] = s.dims[d + drop];
        if (rnd(c, 3) == 0)
            t.dims[d] = 1;
    }
    return leaf(c, t, WF_F64, lo, hi, 0, true);
}

/* x made positive and away from 0: square(x) + 0.5 (for log, sqrt, rsqrt, div, pow). */
static gr_val positive(gr *c, gr_val x)
{
    gr_val r = x;
    BOTH(r.n[0], r.n[1], wf_add(G, wf_square(G, N(x)), wf_scalar(G, WF_F64, 0.5)));
    return r;
}

enum {
    OP_UNARY,
    OP_BINARY,
    OP_WHERE,
    OP_REDUCE,
    OP_MATMUL,
    OP_SOFTMAX,
    OP_XENT,
    OP_RESHAPE,
    OP_TRANSPOSE,
    OP_SLICE,
    OP_SPLIT,
    OP_CONCAT,
    OP_PAD,
    OP_BROADCAST,
    OP_GATHER,
    OP_SCATTER,
    OP_SLICE_BWD,
    OP_CONV,
    OP_POOL,
    OP_LAYER_NORM,
    OP_DROPOUT,
    OP_KINDS
};

/* Draws one op on value 'a' (a random earlier value); returns the new value's index, or -1
 * when the op does not apply to it (the caller draws again). */
static int draw(gr *c, int ai, int kind)
{
    gr_val a = c->v[ai];
    wf_shape s = a.s, ds = decl(&a);
    int r = s.rank;
    wf_node *o0 = NULL, *o1 = NULL;
    char what[512], b[160];
    switch (kind) {
    case OP_UNARY: {
        int k = (int)rnd(c, 16);
        static const char *const names[] = { "neg",       "abs",   "exp",    "log",
                                             "sqrt",      "rsqrt", "square", "tanh",
                                             "sigmoid",   "relu",  "leaky",  "gelu",
                                             "gelu_tanh", "silu",  "cast",   "tanh" };
        gr_val x = (k >= 3 && k <= 5) ? positive(c, a) : a;
        BOTH(o0, o1,
             k == 0    ? wf_neg(G, N(x))
             : k == 1  ? wf_abs(G, N(x))
             : k == 2  ? wf_exp(G, N(x))
             : k == 3  ? wf_log(G, N(x))
             : k == 4  ? wf_sqrt(G, N(x))
             : k == 5  ? wf_rsqrt(G, N(x))
             : k == 6  ? wf_square(G, N(x))
             : k == 7  ? wf_tanh(G, N(x))
             : k == 8  ? wf_sigmoid(G, N(x))
             : k == 9  ? wf_relu(G, N(x))
             : k == 10 ? wf_leaky_relu(G, N(x), 0.1)
             : k == 11 ? wf_gelu(G, N(x), false)
             : k == 12 ? wf_gelu(G, N(x), true)
             : k == 13 ? wf_silu(G, N(x))
             : k == 14 ? wf_cast(G, N(x), WF_F64)
                       : wf_tanh(G, N(x)));
        snprintf(what, sizeof what, "%s(v%d%s)", names[k], ai,
                 (k >= 3 && k <= 5) ? "^2 + 0.5" : "");
        return push(c, o0, o1, s, what);
    }
    case OP_BINARY: {
        int k = (int)rnd(c, 7);
        static const char *const names[] = {
            "add", "sub", "mul", "div", "pow", "maximum", "minimum"
        };
        int li = partner(c, s, -1, 1);
        gr_val p = leaf_val(c, li);
        bool swap = rnd(c, 2) == 0;
        gr_val x = swap ? p : a, y = swap ? a : p;
        if (k == 3)
            y = positive(c, y);
        if (k == 4) {
            x = positive(c, x);
            gr_val t = y;
            BOTH(t.n[0], t.n[1], wf_tanh(G, N(y)));
            y = t;
        }
        BOTH(o0, o1,
             k == 0   ? wf_add(G, N(x), N(y))
             : k == 1 ? wf_sub(G, N(x), N(y))
             : k == 2 ? wf_mul(G, N(x), N(y))
             : k == 3 ? wf_div(G, N(x), N(y))
             : k == 4 ? wf_pow(G, N(x), N(y))
             : k == 5 ? wf_maximum(G, N(x), N(y))
                      : wf_minimum(G, N(x), N(y)));
        snprintf(what, sizeof what, "%s(%s%d%s, %s%d%s)", names[k], swap ? "in" : "v",
                 swap ? li : ai, k == 4 ? "^2 + 0.5" : "", swap ? "v" : "in", swap ? ai : li,
                 k == 3   ? "^2 + 0.5"
                 : k == 4 ? " tanh"
                          : "");
        return push(c, o0, o1, bcast(s, p.s), what);
    }
    case OP_WHERE: {
        int li = partner(c, s, -1, 1);
        gr_val p = leaf_val(c, li);
        bool swap = rnd(c, 2) == 0;
        BOTH(o0, o1,
             wf_where(G, wf_gt(G, N(a), wf_scalar(G, WF_F64, 0.1)), swap ? N(p) : N(a),
                      swap ? N(a) : N(p)));
        snprintf(what, sizeof what, "where(v%d > 0.1, %s)", ai, swap ? "in, v" : "v, in");
        return push(c, o0, o1, bcast(s, p.s), what);
    }
    case OP_REDUCE: {
        int k = (int)rnd(c, 6), axes[WF_MAX_RANK], n = 0;
        static const char *const names[] = { "sum", "mean", "max", "min", "prod", "logsumexp" };
        bool keep = rnd(c, 2) == 0, all = r == 0 || rnd(c, 4) == 0;
        wf_shape o = { .rank = 0 };
        bool red[WF_MAX_RANK] = { false };
        if (!all)
            for (int d = 0; d < r; d++)
                if (rnd(c, 2) == 0) {
                    red[d] = true;
                    axes[n++] = rnd(c, 2) ? d : d - r;
                }
        if (!all && n == 0)
            all = true;
        for (int d = 0; d < r; d++) {
            bool rd = all || red[d];
            if (!rd)
                o.dims[o.rank++] = s.dims[d];
            else if (keep)
                o.dims[o.rank++] = 1;
        }
        if ((k == 2 || k == 3) && numel(s) == 0)
            return -1;
        for (int i = 0; i < n / 2; i++) { /* any order */
            int t = axes[i];
            axes[i] = axes[n - 1 - i];
            axes[n - 1 - i] = t;
        }
        wf_node *(*fn)(wf_graph *, wf_node *, const int *, int, bool) = k == 0   ? (wf_reduce_sum)
                                                                        : k == 1 ? (wf_reduce_mean)
                                                                        : k == 2 ? (wf_reduce_max)
                                                                        : k == 3 ? (wf_reduce_min)
                                                                        : k == 4
                                                                            ? (wf_reduce_prod)
                                                                            : (wf_reduce_logsumexp);
        BOTH(o0, o1, fn(G, N(a), all ? NULL : axes, all ? 0 : n, keep));
        int w = snprintf(what, sizeof what, "reduce_%s(v%d, axes {", names[k], ai);
        for (int i = 0; !all && i < n; i++)
            w += snprintf(what + w, sizeof what - (size_t)w, "%s%d", i ? ", " : "", axes[i]);
        snprintf(what + w, sizeof what - (size_t)w, "}%s%s)", all ? " all" : "",
                 keep ? ", keepdims" : "");
        return push(c, o0, o1, o, what);
    }
    case OP_MATMUL: {
        if (r < 2 || r > 3)
            return -1;
        bool ta = rnd(c, 2), tb = rnd(c, 2);
        int64_t m = s.dims[r - 2], k = s.dims[r - 1], nn = 1 + (int64_t)rnd(c, 4);
        gr_val x = a;
        if (ta) { /* the value transposed, multiplied with transpose_a */
            int perm[3] = { 0, 1, 2 };
            perm[r - 2] = r - 1;
            perm[r - 1] = r - 2;
            BOTH(x.n[0], x.n[1], wf_transpose(G, N(a), perm, r));
        }
        (void)m; /* transpose_a on the transposed value: the product is a's again */
        wf_shape bs = { .rank = 2, .dims = { tb ? nn : k, tb ? k : nn } };
        if (rnd(c, 3) == 0) { /* a batched b, broadcast against a's batch */
            bs.rank = 3;
            bs.dims[2] = bs.dims[1];
            bs.dims[1] = bs.dims[0];
            bs.dims[0] = r == 3 && rnd(c, 2) ? s.dims[0] : (rnd(c, 2) ? 1 : 3);
            if (r == 3 && s.dims[0] != 1 && bs.dims[0] != s.dims[0])
                bs.dims[0] = 1;
        }
        int li = leaf(c, bs, WF_F64, -1, 1, 0, rnd(c, 2) == 0);
        gr_val p = leaf_val(c, li);
        BOTH(o0, o1, wf_matmul_ex(G, N(x), N(p), ta, tb));
        wf_shape o = { .rank = r > bs.rank ? r : bs.rank };
        wf_shape ab = { .rank = r - 2 }, bb = { .rank = bs.rank - 2 };
        for (int d = 0; d < ab.rank; d++)
            ab.dims[d] = x.s.dims[d];
        for (int d = 0; d < bb.rank; d++)
            bb.dims[d] = bs.dims[d];
        wf_shape batch = bcast(ab, bb);
        for (int d = 0; d < batch.rank; d++)
            o.dims[d] = batch.dims[d];
        o.dims[o.rank - 2] = s.dims[r - 2];
        o.dims[o.rank - 1] = nn;
        snprintf(what, sizeof what, "matmul_ex(v%d%s, in%d %s, ta %d, tb %d)", ai,
                 ta ? " transposed" : "", li, shp(bs, b, sizeof b), ta, tb);
        return push(c, o0, o1, o, what);
    }
    case OP_SOFTMAX: {
        if (r == 0)
            return -1;
        int ax = (int)rnd(c, (uint64_t)r) - (rnd(c, 2) ? r : 0), log = (int)rnd(c, 2);
        BOTH(o0, o1, log ? wf_log_softmax(G, N(a), ax) : wf_softmax(G, N(a), ax));
        snprintf(what, sizeof what, "%s(v%d, axis %d)", log ? "log_softmax" : "softmax", ai, ax);
        return push(c, o0, o1, s, what);
    }
    case OP_XENT: {
        /* the gradient needs the number of classes at build time */
        if (r == 0 || ds.dims[r - 1] < 0 || s.dims[r - 1] == 0)
            return -1;
        wf_shape ls = s;
        ls.rank = r - 1;
        int li = leaf(c, ls, rnd(c, 2) ? WF_I32 : WF_I64, 0, 0, s.dims[r - 1], false);
        gr_val p = leaf_val(c, li);
        BOTH(o0, o1, wf_softmax_cross_entropy(G, N(a), N(p)));
        snprintf(what, sizeof what, "softmax_cross_entropy(v%d, in%d)", ai, li);
        return push(c, o0, o1, ls, what);
    }
    case OP_RESHAPE: {
        int k = (int)rnd(c, 4);
        if (k == 3) { /* a copy that a pass drops: squeeze of nothing, reshape to itself */
            bool none = true;
            for (int d = 0; d < r; d++)
                none &= ds.dims[d] != 1 && ds.dims[d] >= 0;
            if (!none)
                return -1;
            bool sq = rnd(c, 2);
            BOTH(o0, o1, sq ? wf_squeeze(G, N(a), WF_SQUEEZE_ALL) : wf_reshape(G, N(a), s));
            snprintf(what, sizeof what, "%s(v%d) (a copy of nothing)",
                     sq ? "squeeze_all" : "reshape_to_itself", ai);
            return push(c, o0, o1, s, what);
        }
        if (k == 0) { /* a factorisation of numel, one dimension given as -1 */
            int64_t n = numel(s), f = n;
            wf_shape t = { .rank = 1 + (int)rnd(c, 3) };
            for (int d = 0; d < t.rank - 1; d++) {
                int64_t q = 1 + (int64_t)rnd(c, 3);
                t.dims[d] = f % q == 0 ? q : 1;
                f /= t.dims[d];
            }
            t.dims[t.rank - 1] = f;
            wf_shape tt = t;
            if (n > 0)
                tt.dims[rnd(c, (uint64_t)t.rank)] = -1;
            BOTH(o0, o1, wf_reshape(G, N(a), tt));
            snprintf(what, sizeof what, "reshape(v%d, %s)", ai, shp(tt, b, sizeof b));
            return push(c, o0, o1, t, what);
        }
        if (k == 1) {
            if (r >= 4)
                return -1;
            int ax = (int)rnd(c, (uint64_t)r + 1) - (rnd(c, 2) ? r + 1 : 0);
            BOTH(o0, o1, wf_expand_dims(G, N(a), ax));
            int p = ax < 0 ? ax + r + 1 : ax;
            wf_shape t = { .rank = r + 1 };
            for (int d = 0, j = 0; d <= r; d++)
                t.dims[d] = d == p ? 1 : s.dims[j++];
            snprintf(what, sizeof what, "expand_dims(v%d, %d)", ai, ax);
            return push(c, o0, o1, t, what);
        }
        int ones[WF_MAX_RANK], n1 = 0;
        bool unknown = false;
        for (int d = 0; d < r; d++) {
            if (ds.dims[d] == 1)
                ones[n1++] = d;
            unknown |= ds.dims[d] < 0;
        }
        if (n1 == 0)
            return -1;
        bool all = !unknown && rnd(c, 2); /* with a -1 dimension "all" is not the same set */
        int ax = ones[rnd(c, (uint64_t)n1)];
        BOTH(o0, o1, wf_squeeze(G, N(a), all ? WF_SQUEEZE_ALL : ax));
        wf_shape t = { .rank = 0 };
        for (int d = 0; d < r; d++)
            if (!(all ? s.dims[d] == 1 : d == ax))
                t.dims[t.rank++] = s.dims[d];
        snprintf(what, sizeof what, "squeeze(v%d, %s%d)", ai, all ? "all " : "", all ? 0 : ax);
        return push(c, o0, o1, t, what);
    }
    case OP_TRANSPOSE: {
        int perm[WF_MAX_RANK];
        for (int d = 0; d < r; d++)
            perm[d] = d;
        for (int d = r - 1; d > 0; d--) {
            int j = (int)rnd(c, (uint64_t)d + 1), t = perm[d];
            perm[d] = perm[j];
            perm[j] = t;
        }
        bool rev = rnd(c, 4) == 0;
        wf_shape t = { .rank = r };
        for (int d = 0; d < r; d++)
            t.dims[d] = s.dims[rev ? r - 1 - d : perm[d]];
        int given[WF_MAX_RANK];
        for (int d = 0; d < r; d++) /* entries may count from the end */
            given[d] = rnd(c, 2) ? perm[d] - r : perm[d];
        BOTH(o0, o1, wf_transpose(G, N(a), rev ? NULL : given, rev ? 0 : r));
        int w = snprintf(what, sizeof what, "transpose(v%d, {", ai);
        for (int d = 0; !rev && d < r; d++)
            w += snprintf(what + w, sizeof what - (size_t)w, "%s%d", d ? ", " : "", given[d]);
        snprintf(what + w, sizeof what - (size_t)w, "}%s)", rev ? " reversed" : "");
        return push(c, o0, o1, t, what);
    }
    case OP_SLICE:
    case OP_PAD: {
        if (r == 0)
            return -1;
        int64_t be[WF_MAX_RANK], en[WF_MAX_RANK], sp[WF_MAX_RANK];
        wf_shape t = s;
        int w = snprintf(what, sizeof what, "%s(v%d", kind == OP_SLICE ? "slice" : "pad", ai);
        for (int d = 0; d < r; d++) {
            int64_t n = s.dims[d];
            if (kind == OP_PAD) {
                be[d] = (int64_t)rnd(c, 3);
                en[d] = (int64_t)rnd(c, 3);
                t.dims[d] = n + be[d] + en[d];
            } else if (ds.dims[d] < 0 || n < 2 || rnd(c, 3) == 0) {
                be[d] = 0; /* an unknown axis is taken whole (its gradient needs that) */
                en[d] = INT64_MAX;
                sp[d] = 1;
            } else {
                int64_t step = rnd(c, 2) ? 1 : 2, b0 = (int64_t)rnd(c, (uint64_t)n);
                bool back = rnd(c, 3) == 0;
                sp[d] = back ? -step : step;
                if (back) { /* from b0 down to the start */
                    be[d] = b0 - (rnd(c, 2) ? n : 0);
                    en[d] = INT64_MIN;
                    t.dims[d] = b0 / step + 1;
                } else {
                    int64_t e0 = b0 + 1 + (int64_t)rnd(c, (uint64_t)(n - b0));
                    be[d] = b0 - (rnd(c, 2) ? n : 0);
                    en[d] = e0 == n ? INT64_MAX : e0 - (rnd(c, 2) ? n : 0);
                    t.dims[d] = (e0 - b0 + step - 1) / step;
                }
            }
            if (kind == OP_PAD)
                w += snprintf(what + w, sizeof what - (size_t)w, " %lld|%lld", (long long)be[d],
                              (long long)en[d]);
            else
                w += snprintf(what + w, sizeof what - (size_t)w, " %lld:%lld:%lld",
                              (long long)be[d], (long long)en[d], (long long)sp[d]);
        }
        snprintf(what + w, sizeof what - (size_t)w, ")");
        if (kind == OP_PAD)
            BOTH(o0, o1, wf_pad(G, N(a), be, en, 0.25));
        else
            BOTH(o0, o1, wf_slice(G, N(a), be, en, sp));
        return push(c, o0, o1, t, what);
    }
    case OP_SPLIT: {
        int cand[WF_MAX_RANK], nc = 0;
        for (int d = 0; d < r; d++)
            if (ds.dims[d] > 1 && (s.dims[d] % 2 == 0 || s.dims[d] % 3 == 0))
                cand[nc++] = d;
        if (nc == 0)
            return -1;
        int ax = cand[rnd(c, (uint64_t)nc)], parts = s.dims[ax] % 2 == 0 ? 2 : 3;
        int pick = (int)rnd(c, (uint64_t)parts), given = rnd(c, 2) ? ax - r : ax;
        wf_node *ps[2][3];
        for (int m = 0; m < 2; m++)
            cr_assert_eq(wf_split(c->g[m], a.n[m], given, parts, ps[m]), 0, "%s",
                         wf_graph_errmsg(c->g[m]));
        /* one part, times another part when there are two (both carry gradient) */
        wf_shape t = s;
        t.dims[ax] /= parts;
        int other = (pick + 1) % parts;
        for (int m = 0; m < 2; m++) {
            wf_node *y = wf_mul(c->g[m], ps[m][pick], wf_tanh(c->g[m], ps[m][other]));
            if (m == 0)
                o0 = y;
            else
                o1 = y;
        }
        snprintf(what, sizeof what, "split(v%d, axis %d, %d)[%d] * tanh([%d])", ai, given, parts,
                 pick, other);
        return push(c, o0, o1, t, what);
    }
    case OP_CONCAT: {
        if (r == 0)
            return -1;
        int ax = (int)rnd(c, (uint64_t)r);
        bool stack = rnd(c, 3) == 0;
        if (!stack && ds.dims[ax] < 0) /* the gradient needs the sizes along the axis */
            return -1;
        wf_shape ps = s;
        if (!stack)
            ps.dims[ax] = 1 + (int64_t)rnd(c, 3);
        int li = leaf(c, ps, WF_F64, -1, 1, 0, false);
        gr_val p = leaf_val(c, li);
        bool first = rnd(c, 2);
        int given = stack ? (rnd(c, 2) ? ax - (r + 1) : ax) : (rnd(c, 2) ? ax - r : ax);
        for (int m = 0; m < 2; m++) {
            wf_node *xs[2] = { first ? a.n[m] : p.n[m], first ? p.n[m] : a.n[m] };
            wf_node *y = stack ? wf_stack(c->g[m], xs, 2, given) : wf_concat(c->g[m], xs, 2, given);
            if (m == 0)
                o0 = y;
            else
                o1 = y;
        }
        wf_shape t = s;
        if (stack) {
            t.rank = r + 1;
            int p0 = given < 0 ? given + r + 1 : given;
            for (int d = 0, j = 0; d <= r; d++)
                t.dims[d] = d == p0 ? 2 : s.dims[j++];
        } else {
            t.dims[ax] += ps.dims[ax];
        }
        snprintf(what, sizeof what, "%s(%s, axis %d)", stack ? "stack" : "concat",
                 first ? "v, in" : "in, v", given);
        (void)li;
        return push(c, o0, o1, t, what);
    }
    case OP_BROADCAST: {
        if (r >= 4)
            return -1;
        wf_shape t = { .rank = r + (int)rnd(c, 2) };
        int lead = t.rank - r;
        for (int d = 0; d < lead; d++)
            t.dims[d] = 2 + (int64_t)rnd(c, 2);
        for (int d = 0; d < r; d++)
            t.dims[lead + d] = s.dims[d] == 1 ? 1 + (int64_t)rnd(c, 3) : s.dims[d];
        BOTH(o0, o1, wf_broadcast_to(G, N(a), t));
        snprintf(what, sizeof what, "broadcast_to(v%d, %s)", ai, shp(t, b, sizeof b));
        return push(c, o0, o1, t, what);
    }
    case OP_GATHER:
    case OP_SCATTER: {
        if (r == 0)
            return -1;
        int ax = (int)rnd(c, (uint64_t)r);
        if (ds.dims[ax] < 0 || s.dims[ax] == 0)
            return -1;
        if (kind == OP_GATHER) {
            wf_shape is = { .rank = 1 + (int)rnd(c, 2), .dims = { 1 + (int64_t)rnd(c, 3), 2 } };
            int li = leaf(c, is, rnd(c, 2) ? WF_I32 : WF_I64, 0, 0, s.dims[ax], false);
            gr_val p = leaf_val(c, li);
            int given = rnd(c, 2) ? ax - r : ax;
            BOTH(o0, o1, wf_gather(G, N(a), N(p), given));
            wf_shape t = { .rank = r - 1 + is.rank };
            for (int d = 0, j = 0; d < r; d++) {
                if (d == ax)
                    for (int q = 0; q < is.rank; q++)
                        t.dims[j++] = is.dims[q];
                else
                    t.dims[j++] = s.dims[d];
            }
            snprintf(what, sizeof what, "gather(v%d, in%d, axis %d)", ai, li, given);
            return push(c, o0, o1, t, what);
        }
        int64_t depth = s.dims[ax] + (int64_t)rnd(c, 3);
        wf_shape is = { .rank = 1, .dims = { s.dims[ax] } };
        int li = leaf(c, is, WF_I64, 0, 0, depth, false);
        gr_val p = leaf_val(c, li);
        BOTH(o0, o1, wf_scatter_add(G, N(a), N(p), ax, depth));
        wf_shape t = s;
        t.dims[ax] = depth;
        snprintf(what, sizeof what, "scatter_add(v%d, in%d, axis %d, dim %lld)", ai, li, ax,
                 (long long)depth);
        return push(c, o0, o1, t, what);
    }
    case OP_SLICE_BWD: {
        if (r == 0)
            return -1;
        int64_t be[WF_MAX_RANK], en[WF_MAX_RANK], sp[WF_MAX_RANK];
        wf_shape xs = s;
        for (int d = 0; d < r; d++) { /* dy (the value) is x[be : be + n*step : step] */
            int64_t extra = (int64_t)rnd(c, 3), step = 1 + (int64_t)rnd(c, 2);
            if (ds.dims[d] < 0) {
                extra = 0;
                step = 1;
            }
            be[d] = extra;
            sp[d] = step;
            xs.dims[d] = extra + (s.dims[d] ? (s.dims[d] - 1) * step + 1 : 0) + (int64_t)rnd(c, 2);
            en[d] = extra + s.dims[d] * step;
            if (ds.dims[d] < 0) {
                xs.dims[d] = s.dims[d];
                be[d] = 0;
                en[d] = INT64_MAX;
            }
        }
        wf_shape xd = xs;
        for (int d = 0; d < r; d++)
            if (ds.dims[d] < 0)
                xd.dims[d] = -1;
        BOTH(o0, o1, wf_slice_backward(G, N(a), m_ == 0 ? xd : xs, be, en, sp));
        snprintf(what, sizeof what, "slice_backward(v%d, x %s)", ai, shp(xs, b, sizeof b));
        return push(c, o0, o1, xs, what);
    }
    case OP_CONV:
    case OP_POOL: {
        /* viewed as NCHW: [1 or 2, 1 or 2, h, w] from a factorisation of the value */
        int64_t n = numel(s);
        if (n < 4)
            return -1;
        int64_t N0 = n % 2 == 0 && rnd(c, 2) ? 2 : 1, rest = n / N0;
        int64_t C0 = rest % 2 == 0 && rest >= 8 && rnd(c, 2) ? 2 : 1;
        rest /= C0;
        int64_t h = 1;
        for (int64_t q = 2; q * q <= rest; q++)
            if (rest % q == 0)
                h = q;
        int64_t wd = rest / h;
        if (h < 2)
            h = 1;
        wf_shape xs = { .rank = 4, .dims = { N0, C0, h, wd } };
        gr_val x = a;
        BOTH(x.n[0], x.n[1], wf_reshape(G, N(a), xs));
        x.s = xs;
        if (kind == OP_CONV) {
            int kh = h >= 2 ? 1 + (int)rnd(c, 2) : 1, kw = wd >= 2 ? 1 + (int)rnd(c, 2) : 1;
            int groups = C0 == 2 && rnd(c, 2) ? 2 : 1, O = groups * (1 + (int)rnd(c, 2));
            wf_conv2d_opts o = { { 1 + (int)rnd(c, 2), 1 + (int)rnd(c, 2) },
                                 { (int)rnd(c, 2), (int)rnd(c, 2), (int)rnd(c, 2), (int)rnd(c, 2) },
                                 { 1, 1 },
                                 groups };
            wf_shape ws = { .rank = 4, .dims = { O, C0 / groups, kh, kw } };
            int li = leaf(c, ws, WF_F64, -1, 1, 0, false);
            gr_val p = leaf_val(c, li);
            BOTH(o0, o1, wf_conv2d(G, N(x), N(p), &o));
            int64_t oh = (h + o.padding[0] + o.padding[1] - kh) / o.stride[0] + 1;
            int64_t ow = (wd + o.padding[2] + o.padding[3] - kw) / o.stride[1] + 1;
            wf_shape t = { .rank = 4, .dims = { N0, O, oh, ow } };
            snprintf(what, sizeof what,
                     "conv2d(reshape(v%d, %s), in%d %s, stride %d %d, pad %d %d %d %d, groups %d)",
                     ai, shp(xs, b, sizeof b), li, shp(ws, b + 80, 80), o.stride[0], o.stride[1],
                     o.padding[0], o.padding[1], o.padding[2], o.padding[3], groups);
            return push(c, o0, o1, t, what);
        }
        int kh = h >= 2 ? 2 : 1, kw = wd >= 2 ? 2 : 1;
        bool avg = rnd(c, 2), incl = avg && rnd(c, 2);
        wf_pool2d_opts o = { { kh, kw },
                             { (int)rnd(c, 2) + 1, (int)rnd(c, 2) + 1 },
                             { kh > 1 ? (int)rnd(c, 2) : 0, 0, kw > 1 ? (int)rnd(c, 2) : 0, 0 },
                             incl };
        BOTH(o0, o1, avg ? wf_avg_pool2d(G, N(x), &o) : wf_max_pool2d(G, N(x), &o));
        int64_t oh = (h + o.padding[0] + o.padding[1] - kh) / o.stride[0] + 1;
        int64_t ow = (wd + o.padding[2] + o.padding[3] - kw) / o.stride[1] + 1;
        wf_shape t = { .rank = 4, .dims = { N0, C0, oh, ow } };
        snprintf(what, sizeof what, "%s(reshape(v%d, %s), window %d %d, stride %d %d, pad %d %d%s)",
                 avg ? "avg_pool2d" : "max_pool2d", ai, shp(xs, b, sizeof b), kh, kw, o.stride[0],
                 o.stride[1], o.padding[0], o.padding[2], incl ? ", count pad" : "");
        return push(c, o0, o1, t, what);
    }
    case OP_LAYER_NORM: {
        if (r == 0 || numel(s) == 0)
            return -1;
        int begin = (int)rnd(c, (uint64_t)r);
        wf_shape ns = { .rank = r - begin };
        for (int d = begin; d < r; d++) {
            if (ds.dims[d] < 0)
                return -1;
            ns.dims[d - begin] = s.dims[d];
        }
        int mode = (int)rnd(c, 3);
        gr_val gm = a, bt = a;
        int lg = -1, lb = -1;
        if (mode >= 1) {
            lg = leaf(c, ns, WF_F64, 0.5, 1.5, 0, false);
            gm = leaf_val(c, lg);
        }
        if (mode == 2) {
            lb = leaf(c, ns, WF_F64, -1, 1, 0, false);
            bt = leaf_val(c, lb);
        }
        int given = rnd(c, 2) ? begin - r : begin;
        BOTH(o0, o1,
             wf_layer_norm(G, N(a), mode >= 1 ? N(gm) : NULL, mode == 2 ? N(bt) : NULL, given,
                           1e-3));
        snprintf(what, sizeof what, "layer_norm(v%d, gamma in%d, beta in%d, begin %d)", ai, lg, lb,
                 given);
        return push(c, o0, o1, s, what);
    }
    case OP_DROPOUT: {
        c->has_dropout = true;
        uint64_t seed = rnd(c, 1000);
        BOTH(o0, o1, wf_dropout(G, N(a), 0.3, seed));
        snprintf(what, sizeof what, "dropout(v%d, 0.3, seed %" PRIu64 ")", ai, seed);
        return push(c, o0, o1, s, what);
    }
    default:
        return -1;
    }
}

/* ---- Running and checking ----------------------------------------------------------------- */

typedef struct gr_check {
    int failures, graphs, fd_checked, fd_kinks;
} gr_check;

static void fail(gr *c, gr_check *k, const char *fmt, ...)
{
    char m[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    fprintf(stderr,
            "grad_random: FAIL seed %" PRIu64 " (rerun: WF_GRAD_FUZZ_SEED=%" PRIu64
            " WF_GRAD_FUZZ_COUNT=1): %s\n  graph:\n%s",
            c->seed, c->seed, m, c->desc);
    k->failures++;
}

/* Runs session 's' with the leaves fed (leaf 'pl' with element 'pj' set to 'pv' when pl >= 0,
 * from a contiguous copy) and fetches 'f[0..n)'. Returns the status. */
static int run(gr *c, wf_session *s, wf_node *const *f, int n, wf_tensor **out, int pl, int64_t pj,
               double pv)
{
    wf_feed feeds[GR_MAX_LEAVES];
    wf_tensor *tmp = NULL;
    int nf = 0;
    for (int i = 0; i < c->nl; i++) {
        if (c->l[i].dt != WF_F64)
            continue;
        wf_tensor *t = c->l[i].t;
        if (i == pl) {
            double old = c->l[i].v[pj];
            c->l[i].v[pj] = pv;
            tmp = wf_tensor_from(WF_F64, c->l[i].s, c->l[i].v);
            c->l[i].v[pj] = old;
            t = tmp;
        }
        feeds[nf++] = (wf_feed){ c->l[i].n[0], t };
    }
    int rc = wf_session_run(s, feeds, nf, f, n, out, NULL, 0);
    wf_tensor_release(tmp);
    return rc;
}

static bool same_bits(const wf_tensor *a, const wf_tensor *b)
{
    if (!a || !b || !wf_shape_equal(wf_tensor_shape(a), wf_tensor_shape(b)))
        return false;
    int64_t n = wf_tensor_numel(a);
    for (int64_t i = 0; i < n; i++) {
        double x = wf_tensor_get(a, i), y = wf_tensor_get(b, i);
        if (memcmp(&x, &y, sizeof x) != 0)
            return false;
    }
    return true;
}

/* The loss at leaf 'pl' element 'pj' = 'pv' (a fresh session when dropout draws its mask
 * from the run count). */
static double loss_at(gr *c, wf_session *s, wf_node *loss, int pl, int64_t pj, double pv)
{
    wf_session *fresh = NULL;
    if (c->has_dropout) {
        cr_assert_eq(wf_session_create(c->g[0], NULL, &fresh), 0);
        s = fresh;
    }
    wf_tensor *o = NULL;
    int rc = run(c, s, &loss, 1, &o, pl, pj, pv);
    double l = rc == 0 ? wf_tensor_get(o, 0) : NAN;
    wf_tensor_release(o);
    wf_session_destroy(fresh);
    return l;
}

static void check_graph(uint64_t seed, gr_check *k, const char **drawn, int *n_drawn)
{
    gr *c = calloc(1, sizeof *c);
    c->seed = seed;
    /* A hashed start: seed * (the generator's own increment) would make seed s + 1 replay
     * seed s's draws shifted by one. */
    uint64_t h = seed ^ 0x5eed5eed5eed5eedull;
    c->st = wf_test_rand(&h);
    c->g[0] = wf_graph_create(rt, WF_STATIC);
    c->g[1] = wf_graph_create(rt, WF_EAGER);
    /* 1 or 2 starting inputs of rank 0 to 3, dimensions 1 to 4 */
    int n0 = 1 + (int)rnd(c, 2);
    for (int i = 0; i < n0; i++) {
        wf_shape s = { .rank = (int)rnd(c, 4) };
        if (s.rank == 0 && rnd(c, 2))
            s.rank = 2;
        for (int d = 0; d < s.rank; d++)
            s.dims[d] = 1 + (int64_t)rnd(c, 4);
        int li = leaf(c, s, WF_F64, -1.5, 1.5, 0, true);
        c->v[c->nv++] = leaf_val(c, li);
    }
    int n_ops = 2 + (int)rnd(c, 7), made = 0;
    for (int tries = 0; made < n_ops && tries < 200; tries++) {
        int ai = rnd(c, 3) ? c->nv - 1 : (int)rnd(c, (uint64_t)c->nv); /* mostly a chain */
        if (numel(c->v[ai].s) > 256)
            ai = 0;
        int kind = (int)rnd(c, OP_KINDS + 4); /* unary and binary ops drawn 3 times as often */
        kind = kind < OP_KINDS ? kind : kind < OP_KINDS + 2 ? OP_UNARY : OP_BINARY;
        if (draw(c, ai, kind) >= 0)
            made++;
    }
    /* L = sum(v * R) over the last value and, each with probability 1/3, earlier ones (fan-out:
     * their gradients add up) */
    wf_node *loss[2] = { NULL, NULL };
    for (int i = n0; i < c->nv; i++) {
        if (i != c->nv - 1 && rnd(c, 3) != 0)
            continue;
        int64_t n = numel(c->v[i].s);
        double *rv = malloc((size_t)(n ? n : 1) * sizeof *rv);
        for (int64_t j = 0; j < n; j++)
            rv[j] = unif(c, -1, 1);
        for (int m = 0; m < 2; m++) {
            wf_node *t = wf_sum(
                c->g[m], wf_mul(c->g[m], c->v[i].n[m], gc_const(c->g[m], WF_F64, c->v[i].s, rv)));
            loss[m] = loss[m] ? wf_add(c->g[m], loss[m], t) : t;
        }
        free(rv);
        say(c, "  L += sum(v%d * R)\n", i);
    }
    for (int m = 0; m < 2; m++)
        cr_assert_not_null(loss[m], "seed %" PRIu64 ": %s\n%s", seed, wf_graph_errmsg(c->g[m]),
                           c->desc);
    for (int id = 0; id < wf_graph_node_count(c->g[1]); id++)
        seen(c, wf_node_op(wf_graph_node(c->g[1], id)));
    for (int i = 0; i < c->n_seen; i++) {
        bool have = false;
        for (int j = 0; j < *n_drawn && !have; j++)
            have = !strcmp(drawn[j], c->seen[i]);
        if (!have && *n_drawn < 96)
            drawn[(*n_drawn)++] = c->seen[i];
    }

    /* gradients with respect to every f64 input, in both graphs */
    wf_node *xs[2][GR_MAX_LEAVES], *gr_[2][GR_MAX_LEAVES];
    int nx = 0, map[GR_MAX_LEAVES];
    for (int i = 0; i < c->nl; i++)
        if (c->l[i].dt == WF_F64) {
            xs[0][nx] = c->l[i].n[0];
            xs[1][nx] = c->l[i].n[1];
            map[nx++] = i;
        }
    if (getenv("WF_GRAD_FUZZ_PRINT")) /* every graph, not only failing ones */
        fprintf(stderr, "grad_random: seed %" PRIu64 ":\n%s", seed, c->desc);
    int rc0 = wf_gradients(c->g[0], loss[0], xs[0], nx, gr_[0]);
    int rc1 = wf_gradients(c->g[1], loss[1], xs[1], nx, gr_[1]);
    k->graphs++;
    if (rc0 != 0 || rc1 != 0) {
        fail(c, k, "wf_gradients: static %s (%s), eager %s (%s)", wf_err_name(rc0),
             rc0 ? wf_graph_errmsg(c->g[0]) : "", wf_err_name(rc1),
             rc1 ? wf_graph_errmsg(c->g[1]) : "");
        goto out;
    }
    wf_node *fetch[GR_MAX_LEAVES + 1];
    fetch[0] = loss[0];
    for (int i = 0; i < nx; i++)
        fetch[1 + i] = gr_[0][i];
    wf_session *s[2] = { NULL, NULL };
    wf_tensor *out[2][GR_MAX_LEAVES + 1] = { { NULL } };
    static const uint32_t flags[2] = { 0, WF_SESSION_NO_PASSES };
    for (int q = 0; q < 2; q++) {
        int rc = wf_session_create(c->g[0], &(wf_session_opts){ .flags = flags[q] }, &s[q]);
        if (rc == 0)
            rc = run(c, s[q], fetch, nx + 1, out[q], -1, 0, 0);
        if (rc != 0) {
            fail(c, k, "static run (%s): %s", q ? "no passes" : "every pass",
                 s[q] ? wf_session_errmsg(s[q]) : wf_graph_errmsg(c->g[0]));
            goto done;
        }
    }
    /* bit for bit: eager, static, static without passes (eager left out where dropout draws
     * its mask, which differs there by design); each gradient in its input's shape */
    for (int i = 0; i <= nx; i++) {
        const wf_tensor *e = wf_node_value(i == 0 ? loss[1] : gr_[1][i - 1]);
        char b1[160], b2[160], b3[160];
        const char *what = i == 0 ? "L" : "dL/din";
        int li = i ? map[i - 1] : -1;
        if (i > 0 && !wf_shape_equal(wf_tensor_shape(out[0][i]), c->l[li].s)) {
            fail(c, k, "%s%d: the static run gives shape %s, the input is %s", what, li,
                 shp(wf_tensor_shape(out[0][i]), b1, sizeof b1), shp(c->l[li].s, b2, sizeof b2));
            goto done;
        }
        if (c->has_dropout) /* an eager dropout mixes the node count into its seed (weft/nn.h) */
            e = out[0][i];
        if (!same_bits(e, out[0][i]) || !same_bits(out[0][i], out[1][i])) {
            int64_t n = wf_tensor_numel(out[0][i]), j = 0;
            bool shapes = e && same_bits(out[0][i], out[0][i]) &&
                          wf_shape_equal(wf_tensor_shape(e), wf_tensor_shape(out[0][i])) &&
                          wf_shape_equal(wf_tensor_shape(e), wf_tensor_shape(out[1][i]));
            for (; shapes && j < n; j++) {
                double x = wf_tensor_get(e, j), y = wf_tensor_get(out[0][i], j),
                       z = wf_tensor_get(out[1][i], j);
                if (memcmp(&x, &y, 8) || memcmp(&y, &z, 8))
                    break;
            }
            if (shapes && j < n)
                fail(c, k,
                     "%s%s: eager, static and no-pass runs differ at element %lld: %.17g %.17g "
                     "%.17g",
                     what, i ? "" : "", (long long)j, wf_tensor_get(e, j),
                     wf_tensor_get(out[0][i], j), wf_tensor_get(out[1][i], j));
            else
                fail(c, k, "%s%d: shapes eager %s, static %s, no passes %s", what, li,
                     e ? shp(wf_tensor_shape(e), b1, sizeof b1) : "none",
                     shp(wf_tensor_shape(out[0][i]), b2, sizeof b2),
                     shp(wf_tensor_shape(out[1][i]), b3, sizeof b3));
            goto done;
        }
    }
    /* central finite differences, a few elements per input */
    double L0 = wf_tensor_get(out[0][0], 0);
    if (!isfinite(L0))
        goto done;                 /* an overflowing draw: nothing to compare against */
    for (int i = 0; i < nx; i++) { /* a finite L has no NaN derivative (the inputs keep the
                                      ops inside their domains) */
        for (int64_t j = 0; j < wf_tensor_numel(out[0][1 + i]); j++)
            if (isnan(wf_tensor_get(out[0][1 + i], j))) {
                fail(c, k, "dL/din%d[%lld] is NaN (L = %.9g, x = %.9g)", map[i], (long long)j, L0,
                     c->l[map[i]].v[j]);
                goto done;
            }
    }
    for (int i = 0; i < nx; i++) {
        gr_leaf *L = &c->l[map[i]];
        int64_t n = numel(L->s);
        for (int t = 0; t < 3 && n > 0; t++) {
            int64_t j = (int64_t)rnd(c, (uint64_t)n);
            double x0 = L->v[j], an = wf_tensor_get(out[0][1 + i], j), num = 0;
            bool ok = false, kink = false;
            for (int pass = 0; pass < 2 && !ok && !kink; pass++) {
                double h = (pass ? 1e-7 : 1e-5) * fmax(1.0, fabs(x0));
                double lp = loss_at(c, s[0], loss[0], map[i], j, x0 + h);
                double lm = loss_at(c, s[0], loss[0], map[i], j, x0 - h);
                num = (lp - lm) / (2 * h);
                double tol = 1e-5 * (fabs(an) + fabs(num)) + 1e-6 * (1 + fabs(L0));
                ok = fabs(an - num) <= tol;
                if (!ok && pass == 0) {
                    double fw = (lp - L0) / h, bw = (L0 - lm) / h;
                    kink = fabs(fw - bw) > tol; /* smooth: they differ by about h f'' */
                }
            }
            if (kink) {
                k->fd_kinks++;
                continue;
            }
            k->fd_checked++;
            if (!ok) {
                fail(c, k,
                     "dL/din%d[%lld] (x = %.9g): wf_gradients %.12g, finite differences %.12g",
                     map[i], (long long)j, x0, an, num);
                goto done;
            }
        }
    }
done:
    for (int q = 0; q < 2; q++) {
        for (int i = 0; i <= nx; i++)
            wf_tensor_release(out[q][i]);
        wf_session_destroy(s[q]);
    }
out:
    for (int m = 0; m < 2; m++)
        wf_graph_destroy(c->g[m]);
    for (int i = 0; i < c->nl; i++) {
        wf_tensor_release(c->l[i].t);
        free(c->l[i].v);
        free(c->l[i].buf);
    }
    free(c);
}

static uint64_t env_u64(const char *name, uint64_t dflt)
{
    const char *v = getenv(name);
    return v && *v ? strtoull(v, NULL, 0) : dflt;
}

Test(grad_random, random_graphs_match_finite_differences_and_agree_bit_for_bit)
{
    uint64_t first = env_u64("WF_GRAD_FUZZ_SEED", 1);
    uint64_t count = env_u64("WF_GRAD_FUZZ_COUNT", (uint64_t)wf_test_scaled(300, 60));
    bool fixed = !getenv("WF_GRAD_FUZZ_SEED") && !getenv("WF_GRAD_FUZZ_COUNT");
    gr_check k = { 0 };
    (void)gr_internal_ops; /* reached through the gradients (grad_random_ops.h) */
    const char *drawn[96];
    int n_drawn = 0;
    for (uint64_t i = 0; i < count; i++)
        check_graph(first + i, &k, drawn, &n_drawn);
    fprintf(stderr,
            "grad_random: %d graphs from seed %" PRIu64 ", %d failed; %d gradient elements "
            "checked against finite differences, %d skipped at kinks; %d ops drawn\n",
            k.graphs, first, k.failures, k.fd_checked, k.fd_kinks, n_drawn);
    cr_assert_eq(k.failures, 0, "%d of %d random graphs failed (stderr names each)", k.failures,
                 k.graphs);
    cr_assert_gt(k.fd_checked, k.graphs, "finite differences checked too little");
    if (fixed && !wf_test_quick())
        for (size_t i = 0; i < sizeof gr_ops / sizeof gr_ops[0]; i++) {
            bool have = false;
            for (int j = 0; j < n_drawn && !have; j++)
                have = !strcmp(drawn[j], gr_ops[i]);
            if (!have)
                fprintf(stderr, "grad_random: the CI seeds never drew '%s'\n", gr_ops[i]);
            cr_expect(have, "the CI seeds never drew '%s'", gr_ops[i]);
        }
}
