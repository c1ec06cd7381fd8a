/* grad/optim_cpu.c: the optimizers' update ops and their CPU kernels: one elementwise pass
 * over a variable, its gradient and its state that writes the variable and the state in
 * place (core/op.h: n_assign), and the step counter's increment.
 * Owns: wf__op_update_1 .. wf__op_update_4, wf__op_increment (grad/internal.h), the learning
 *   rate schedules (wf__optim_lr), and the update rules, which are PyTorch's
 *   (torch.optim.SGD, Adam, AdamW, RMSprop, Adagrad: weft/grad.h says which options).
 * Invariants: every element is updated from its own values only, in the variable's type
 *   (f32 variables in f32, as PyTorch), so the result does not depend on how the loop is
 *   split; the
 *   counter's value before the step ('t', 0 first) gives the learning rate and Adam's bias
 *   corrections use t + 1.
 * Not here: building the update nodes (optim.c). */
#include "../core/tensor.h"
#include "internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

double wf__optim_lr(const double *hp, int64_t step)
{
    double lr = hp[WF__HP_LR];
    double warm = hp[WF__HP_WARMUP];
    if (warm > 0 && (double)step < warm)
        return lr * ((double)step + 1) / warm;
    switch ((int)hp[WF__HP_SCHED]) {
    case WF_LR_STEP:
        return lr * pow(hp[WF__HP_GAMMA], floor((double)step / hp[WF__HP_STEP_SIZE]));
    case WF_LR_COSINE: {
        double t = (double)step - warm, T = hp[WF__HP_TOTAL] - warm, lo = hp[WF__HP_MIN_LR];
        if (t >= T)
            return lo;
        return lo + (lr - lo) * 0.5 * (1 + cos(M_PI * t / T));
    }
    default:
        return lr;
    }
}

/* One update's scalars and arrays. */
typedef struct upd {
    int kind;
    double lr, mom, b1, b2, eps, wd, rho, bc1, bc2;
    bool nesterov, centered;
    int n_state;
    bool f64;
    void *w, *state[3];
    const void *grad;
} upd;

/* One loop per kind and element type, with the kind's choices hoisted out of the loop so
 * gcc vectorises it: the arithmetic is in the variable's own type, as PyTorch's (an f32
 * variable is updated in f32), with the scalars (learning rate, bias corrections) computed
 * once in f64 and rounded once. */
#define UPDATE_LOOPS(T)                                                                    \
    static void sgd_##T(const upd *u, int64_t lo, int64_t hi)                              \
    {                                                                                      \
        T *restrict w = u->w, *restrict v = u->state[0];                                   \
        const T *restrict g = u->grad;                                                     \
        const T lr = (T)u->lr, wd = (T)u->wd, mom = (T)u->mom;                             \
        if (!u->n_state) {                                                                 \
            for (int64_t i = lo; i < hi; i++)                                              \
                w[i] -= lr * (g[i] + wd * w[i]);                                           \
        } else if (u->nesterov) {                                                          \
            for (int64_t i = lo; i < hi; i++) {                                            \
                T gi = g[i] + wd * w[i], vi = mom * v[i] + gi;                             \
                v[i] = vi;                                                                 \
                w[i] -= lr * (gi + mom * vi);                                              \
            }                                                                              \
        } else {                                                                           \
            for (int64_t i = lo; i < hi; i++) {                                            \
                T vi = mom * v[i] + (g[i] + wd * w[i]);                                    \
                v[i] = vi;                                                                 \
                w[i] -= lr * vi;                                                           \
            }                                                                              \
        }                                                                                  \
    }                                                                                      \
    static void adam_##T(const upd *u, int64_t lo, int64_t hi)                             \
    {                                                                                      \
        T *restrict w = u->w, *restrict m = u->state[0], *restrict v = u->state[1];        \
        const T *restrict g = u->grad;                                                     \
        const T b1 = (T)u->b1, b2 = (T)u->b2, c1 = (T)(1 - u->b1), c2 = (T)(1 - u->b2);    \
        const T step = (T)(u->lr / u->bc1), rbc2 = (T)(1 / sqrt(u->bc2)), eps = (T)u->eps; \
        const T l2 = u->kind == WF_OPT_ADAM ? (T)u->wd : 0;                                \
        const T decay = u->kind == WF_OPT_ADAMW ? (T)(1 - u->lr * u->wd) : 1;              \
        for (int64_t i = lo; i < hi; i++) {                                                \
            T p = w[i] * decay, gi = g[i] + l2 * w[i];                                     \
            T mi = b1 * m[i] + c1 * gi, vi = b2 * v[i] + c2 * gi * gi;                     \
            m[i] = mi;                                                                     \
            v[i] = vi;                                                                     \
            w[i] = p - step * mi / (sqrt##T(vi) * rbc2 + eps);                             \
        }                                                                                  \
    }                                                                                      \
    static void rmsprop_##T(const upd *u, int64_t lo, int64_t hi)                          \
    {                                                                                      \
        T *restrict w = u->w, *restrict sq = u->state[0];                                  \
        T *restrict ga = u->centered ? u->state[1] : NULL;                                 \
        T *restrict buf = u->mom > 0 ? u->state[u->centered ? 2 : 1] : NULL;               \
        const T *restrict g = u->grad;                                                     \
        const T rho = (T)u->rho, c = (T)(1 - u->rho), lr = (T)u->lr, wd = (T)u->wd;        \
        const T eps = (T)u->eps, mom = (T)u->mom;                                          \
        for (int64_t i = lo; i < hi; i++) {                                                \
            T gi = g[i] + wd * w[i], si = rho * sq[i] + c * gi * gi, avg;                  \
            sq[i] = si;                                                                    \
            if (ga) {                                                                      \
                T ai = rho * ga[i] + c * gi;                                               \
                ga[i] = ai;                                                                \
                avg = sqrt##T(si - ai * ai) + eps;                                         \
            } else {                                                                       \
                avg = sqrt##T(si) + eps;                                                   \
            }                                                                              \
            if (buf) {                                                                     \
                T bi = mom * buf[i] + gi / avg;                                            \
                buf[i] = bi;                                                               \
                w[i] -= lr * bi;                                                           \
            } else {                                                                       \
                w[i] -= lr * gi / avg;                                                     \
            }                                                                              \
        }                                                                                  \
    }                                                                                      \
    static void adagrad_##T(const upd *u, int64_t lo, int64_t hi)                          \
    {                                                                                      \
        T *restrict w = u->w, *restrict sum = u->state[0];                                 \
        const T *restrict g = u->grad;                                                     \
        const T lr = (T)u->lr, wd = (T)u->wd, eps = (T)u->eps;                             \
        for (int64_t i = lo; i < hi; i++) {                                                \
            T gi = g[i] + wd * w[i], si = sum[i] + gi * gi;                                \
            sum[i] = si;                                                                   \
            w[i] -= lr * gi / (sqrt##T(si) + eps);                                         \
        }                                                                                  \
    }                                                                                      \
    static void update_##T(const upd *u, int64_t lo, int64_t hi)                           \
    {                                                                                      \
        switch (u->kind) {                                                                 \
        case WF_OPT_SGD:                                                                   \
            sgd_##T(u, lo, hi);                                                            \
            break;                                                                         \
        case WF_OPT_ADAM:                                                                  \
        case WF_OPT_ADAMW:                                                                 \
            adam_##T(u, lo, hi);                                                           \
            break;                                                                         \
        case WF_OPT_RMSPROP:                                                               \
            rmsprop_##T(u, lo, hi);                                                        \
            break;                                                                         \
        case WF_OPT_ADAGRAD:                                                               \
            adagrad_##T(u, lo, hi);                                                        \
            break;                                                                         \
        }                                                                                  \
    }
#define sqrtdouble sqrt
#define sqrtfloat  sqrtf
UPDATE_LOOPS(float)
UPDATE_LOOPS(double)

static int update_range(void *ctx, int64_t lo, int64_t hi)
{
    const upd *u = ctx;
    if (u->f64)
        update_double(u, lo, hi);
    else
        update_float(u, lo, hi);
    return 0;
}

/* How many state variables kind 'kind' with hyperparameters 'hp' uses. */
static int state_count(const double *hp)
{
    switch ((int)hp[WF__HP_KIND]) {
    case WF_OPT_SGD:
        return hp[WF__HP_MOMENTUM] > 0;
    case WF_OPT_ADAM:
    case WF_OPT_ADAMW:
        return 2;
    case WF_OPT_RMSPROP:
        return 1 + (hp[WF__HP_CENTERED] != 0) + (hp[WF__HP_MOMENTUM] > 0);
    case WF_OPT_ADAGRAD:
        return 1;
    default:
        return -1;
    }
}

static int kernel_update(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                         wf_tensor **out)
{
    (void)out; /* the node's value is the variable's (core/op.h: n_assign) */
    int k = n->op->n_assign;
    const wf_tensor *step = in[k + 1], *hpt = in[k + 2];
    const double *hp = (const double *)hpt->data;
    if (!hpt->contiguous || hpt->dtype != WF_F64 || hpt->numel != WF__HP_COUNT ||
        state_count(hp) != k - 1)
        return wf__err(WF_EINVAL, "the hyperparameters do not fit this update (%d state variables)",
                       k - 1);
    int64_t t = (int64_t)wf_tensor_get(step, 0);
    upd u = {
        .kind = (int)hp[WF__HP_KIND],
        .lr = wf__optim_lr(hp, t),
        .mom = hp[WF__HP_MOMENTUM],
        .b1 = hp[WF__HP_BETA1],
        .b2 = hp[WF__HP_BETA2],
        .eps = hp[WF__HP_EPS],
        .wd = hp[WF__HP_WD],
        .rho = hp[WF__HP_RHO],
        .nesterov = hp[WF__HP_NESTEROV] != 0,
        .centered = hp[WF__HP_CENTERED] != 0,
        .n_state = k - 1,
        .f64 = in[0]->dtype == WF_F64,
        .w = in[0]->data,
    };
    u.bc1 = 1 - pow(u.b1, (double)(t + 1));
    u.bc2 = 1 - pow(u.b2, (double)(t + 1));
    for (int i = 1; i < k; i++)
        u.state[i - 1] = in[i]->data;
    /* The gradient may be a strided view: the loop wants it contiguous. */
    wf_tensor *gc = NULL;
    const wf_tensor *gr = in[k];
    if (gr->numel != in[0]->numel)
        return wf__err(WF_ESHAPE, "the gradient has %lld elements, the variable %lld",
                       (long long)gr->numel, (long long)in[0]->numel);
    if (!gr->contiguous) {
        if (!(gc = wf__tensor_alloc(gr->dtype, gr->shape)))
            return WF_ENOMEM;
        int rc =
            wf_tensor_read(gr, gr->dtype, gc->data, (size_t)gc->numel * wf_dtype_size(gc->dtype));
        if (rc < 0) {
            wf_tensor_release(gc);
            return rc;
        }
        gr = gc;
    }
    u.grad = gr->data;
    int64_t len = in[0]->numel;
    int rc = 0;
    if (ctx && ctx->rt && len >= (1 << 16))
        rc = wf_parallel_for(ctx->rt, 0, len, 1 << 14, update_range, &u);
    else
        update_range(&u, 0, len);
    wf_tensor_release(gc);
    return rc;
}

/* Inputs: variable, state..., gradient, step, hyperparameters. */
static int infer_update(wf_node *n, char *err, size_t errlen)
{
    int k = n->op->n_assign;
    const wf_node *w = n->inputs[0], *gr = n->inputs[k], *step = n->inputs[k + 1],
                  *hp = n->inputs[k + 2];
    char a[160], b[160];
    if (w->dtype != WF_F32 && w->dtype != WF_F64) {
        snprintf(err, errlen, "variable '%s' is %s; optimizers update f32 and f64", w->name,
                 wf_dtype_name(w->dtype));
        return WF_EDTYPE;
    }
    for (int i = 1; i <= k; i++) {
        const wf_node *s = n->inputs[i];
        if (s->dtype != w->dtype || s->shape.rank != w->shape.rank) {
            snprintf(err, errlen, "'%s' is %s %s but variable '%s' is %s %s", s->name,
                     wf_dtype_name(s->dtype), wf_shape_str(s->shape, a, sizeof a), w->name,
                     wf_dtype_name(w->dtype), wf_shape_str(w->shape, b, sizeof b));
            return s->dtype != w->dtype ? WF_EDTYPE : WF_ESHAPE;
        }
        for (int d = 0; d < w->shape.rank; d++)
            if (!(s->shape.dims[d] == w->shape.dims[d] || (i == k && s->shape.dims[d] == -1))) {
                snprintf(err, errlen, "'%s' is %s but variable '%s' is %s", s->name,
                         wf_shape_str(s->shape, a, sizeof a), w->name,
                         wf_shape_str(w->shape, b, sizeof b));
                return WF_ESHAPE;
            }
    }
    (void)gr;
    if (step->dtype != WF_I64 || step->shape.rank != 0) {
        snprintf(err, errlen, "the step counter '%s' is %s %s, not i64 []", step->name,
                 wf_dtype_name(step->dtype), wf_shape_str(step->shape, a, sizeof a));
        return WF_EDTYPE;
    }
    if (hp->dtype != WF_F64 || hp->shape.rank != 1 || hp->shape.dims[0] != WF__HP_COUNT) {
        snprintf(err, errlen, "the hyperparameters '%s' are %s %s, not f64 [%d]", hp->name,
                 wf_dtype_name(hp->dtype), wf_shape_str(hp->shape, a, sizeof a), WF__HP_COUNT);
        return WF_EDTYPE;
    }
    n->dtype = w->dtype;
    n->shape = w->shape;
    return 0;
}

/* Per element: about 10 flops (Adam); reads the gradient and state, writes variable and state. */
static void cost_update(const wf_node *n, double *flops, double *bytes)
{
    int k = n->op->n_assign;
    double e = 1;
    for (int d = 0; d < n->shape.rank; d++)
        e *= n->shape.dims[d] > 0 ? (double)n->shape.dims[d] : 1;
    *flops = 10 * e;
    *bytes = (2.0 * k + 1) * e * (double)wf_dtype_size(n->dtype);
}

#define UPDATE_DEF(K)                                  \
    const wf_op_def wf__op_update_##K = {              \
        .name = "update_" #K,                          \
        .min_inputs = (K) + 3,                         \
        .max_inputs = (K) + 3,                         \
        .infer = infer_update,                         \
        .kernel = { [WF_KERNEL_CPU] = kernel_update }, \
        .cost = cost_update,                           \
        .flags = WF_OP_STATEFUL | WF_OP_NO_GRAD,       \
        .n_assign = (K),                               \
    };
UPDATE_DEF(1)
UPDATE_DEF(2)
UPDATE_DEF(3)
UPDATE_DEF(4)

static int infer_increment(wf_node *n, char *err, size_t errlen)
{
    const wf_node *v = n->inputs[0];
    if ((v->dtype != WF_I64 && v->dtype != WF_I32) || v->shape.rank != 0) {
        char s[160];
        snprintf(err, errlen, "'%s' is %s %s; increment takes an i64 or i32 scalar", v->name,
                 wf_dtype_name(v->dtype), wf_shape_str(v->shape, s, sizeof s));
        return WF_EDTYPE;
    }
    n->dtype = v->dtype;
    n->shape = v->shape;
    return 0;
}

static int kernel_increment(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                            wf_tensor **out)
{
    (void)ctx;
    (void)n;
    (void)out;
    if (in[0]->dtype == WF_I64)
        ((int64_t *)in[0]->data)[0]++;
    else
        ((int32_t *)in[0]->data)[0]++;
    return 0;
}

const wf_op_def wf__op_increment = {
    .name = "increment",
    .min_inputs = 1,
    .max_inputs = 1,
    .infer = infer_increment,
    .kernel = { [WF_KERNEL_CPU] = kernel_increment },
    .cost = NULL,
    .flags = WF_OP_STATEFUL | WF_OP_NO_GRAD,
    .n_assign = 1,
};
