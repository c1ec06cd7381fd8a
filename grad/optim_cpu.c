/* grad/optim_cpu.c: the optimizers' update ops and their CPU kernels: one elementwise pass
 * over a variable, its gradient and its state that writes the variable and the state in
 * place (core/op.h: n_assign), and the step counter's increment.
 * Owns: wf__op_update_1 .. wf__op_update_4, wf__op_increment (grad/internal.h), the
 *   multi-tensor update defs that optimizer fusion uses (grad/update.h: the same loops over
 *   many variables in tiles; with CUDA, their slot that runs ops/optim_cuda.cu's fused
 *   multi-tensor kernel), the learning rate schedules (wf__optim_lr), and the update
 *   rules, which are PyTorch's (torch.optim.SGD, Adam, AdamW, RMSprop, Adagrad: weft/grad.h
 *   says which options).
 * Invariants: every element is updated from its own values only, in the variable's type
 *   (f32 variables in f32, as PyTorch), so the result does not depend on how the loop is
 *   split (which is why a multi-tensor update gives the same bits as one update per
 *   variable); the counter's value before the step ('t', 0 first) gives the learning rate
 *   and Adam's bias corrections use t + 1.
 * Not here: building the update nodes (optim.c), grouping them
 *   (runtime/compile/pass_optim_fuse.c). */
#include "../core/tensor.h"
#include "../ops/cuda_kernels.h"
#include "../ops/kernels.h"
#include "internal.h"
#include "update.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
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

/* The scalars of one update from the hyperparameters 'hp' (WF__HP_COUNT, host memory) and
 * the counter's value 't' ('k' assigned inputs: the variable and k - 1 state variables);
 * arrays are left NULL. Returns 0 or WF_EINVAL. */
static int scalars_of(const double *hp, int64_t t, int k, upd *u)
{
    if (state_count(hp) != k - 1)
        return wf__err(WF_EINVAL, "the hyperparameters do not fit this update (%d state variables)",
                       k - 1);
    *u = (upd){
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
    };
    u->bc1 = 1 - pow(u->b1, (double)(t + 1));
    u->bc2 = 1 - pow(u->b2, (double)(t + 1));
    return 0;
}

/* scalars_of() from the hyperparameter vector 'hpt' and the counter 'step' (host tensors). */
static int update_scalars(const wf_tensor *step, const wf_tensor *hpt, int k, upd *u)
{
    if (!hpt->contiguous || hpt->dtype != WF_F64 || hpt->numel != WF__HP_COUNT)
        return wf__err(WF_EINVAL, "the hyperparameters do not fit this update (%d state variables)",
                       k - 1);
    return scalars_of((const double *)hpt->data, (int64_t)wf_tensor_get(step, 0), k, u);
}

/* Points 'u' at variable 'in[0]', its state 'in[1 .. k-1]' and gradient 'gr'; a strided
 * gradient is copied into '*gc' (the loops want it contiguous), which the caller releases.
 * Returns 0 or a negative status. */
static int update_arrays(upd *u, wf_tensor *const *in, int k, const wf_tensor *gr, wf_tensor **gc)
{
    *gc = NULL;
    u->f64 = in[0]->dtype == WF_F64;
    u->w = in[0]->data;
    for (int i = 1; i < k; i++)
        u->state[i - 1] = in[i]->data;
    if (gr->numel != in[0]->numel)
        return wf__err(WF_ESHAPE, "the gradient has %lld elements, the variable %lld",
                       (long long)gr->numel, (long long)in[0]->numel);
    if (!gr->contiguous) {
        if (!(*gc = wf__tensor_alloc(gr->dtype, gr->shape)))
            return WF_ENOMEM;
        int rc = wf_tensor_read(gr, gr->dtype, (*gc)->data,
                                (size_t)(*gc)->numel * wf_dtype_size((*gc)->dtype));
        if (rc < 0)
            return rc;
        gr = *gc;
    }
    u->grad = gr->data;
    return 0;
}

static int kernel_update(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                         wf_tensor **out)
{
    (void)out; /* the node's value is the variable's (core/op.h: n_assign) */
    int k = n->op->n_assign;
    upd u;
    wf_tensor *gc = NULL;
    int rc = update_scalars(in[k + 1], in[k + 2], k, &u);
    if (rc == 0)
        rc = update_arrays(&u, in, k, in[k], &gc);
    int64_t len = in[0]->numel;
    wf_runtime *rt = ctx ? wf__kernel_par_rt(ctx->rt) : NULL;
    if (rc == 0 && rt && len >= (1 << 16))
        rc = wf_parallel_for(rt, 0, len, 1 << 14, update_range, &u);
    else if (rc == 0)
        update_range(&u, 0, len);
    wf_tensor_release(gc);
    return rc;
}

/* Checks one update's inputs: variable 'w', state 'st[0 .. k-2]', gradient 'gr' (-1
 * dimensions allowed), step and hyperparameters. Returns 0 or a status with 'err' written. */
static int check_update(const wf_node *w, const wf_node *const *st, int k, const wf_node *gr,
                        const wf_node *step, const wf_node *hp, char *err, size_t errlen)
{
    char a[160], b[160];
    if (w->dtype != WF_F32 && w->dtype != WF_F64) {
        snprintf(err, errlen, "variable '%s' is %s; optimizers update f32 and f64", w->name,
                 wf_dtype_name(w->dtype));
        return WF_EDTYPE;
    }
    for (int i = 1; i <= k; i++) {
        const wf_node *s = i < k ? st[i - 1] : gr;
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
    return 0;
}

/* Inputs: variable, state..., gradient, step, hyperparameters. */
static int infer_update(wf_node *n, char *err, size_t errlen)
{
    int k = n->op->n_assign;
    const wf_node *w = n->inputs[0];
    int rc = check_update(w, (const wf_node *const *)n->inputs + 1, k, n->inputs[k],
                          n->inputs[k + 1], n->inputs[k + 2], err, errlen);
    if (rc < 0)
        return rc;
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

/* The optimizer an update node runs on, from its hyperparameters (its last input) when
 * they are a constant, as wf_minimize() makes them; -1 when unknown. */
static int update_kind(const wf_node *n)
{
    const wf_node *hp = n->n_inputs > 0 ? n->inputs[n->n_inputs - 1] : NULL;
    const wf_tensor *t = hp && hp->op == &wf_op_constant ? hp->value : NULL;
    if (!t || t->dtype != WF_F64 || t->numel != WF__HP_COUNT || !t->contiguous)
        return -1;
    return (int)((const double *)t->data)[WF__HP_KIND];
}

/* The CUDA kernel (kernel_multi_cuda(), below) runs SGD, Adam and AdamW only: placement
 * keeps updates of other optimizers on the host (core/op.h: kernel_ok). */
static bool update_kernel_ok(const wf_node *n, int kind)
{
    int k = kind == WF_KERNEL_CUDA ? update_kind(n) : -1;
    return k == -1 || k == WF_OPT_SGD || k == WF_OPT_ADAM || k == WF_OPT_ADAMW;
}

#ifdef WF_HAVE_CUDA
static int kernel_multi_cuda(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                             wf_tensor **out);
#    define MULTI_CUDA kernel_multi_cuda
#else
#    define MULTI_CUDA NULL
#endif

/* One variable's update: on the GPU, the multi-tensor kernel with one member (its inputs are
 * laid out as a multi_update's of one variable). */
#define UPDATE_DEF(K)                                                                 \
    const wf_op_def wf__op_update_##K = {                                             \
        .name = "update_" #K,                                                         \
        .min_inputs = (K) + 3,                                                        \
        .max_inputs = (K) + 3,                                                        \
        .infer = infer_update,                                                        \
        .kernel = { [WF_KERNEL_CPU] = kernel_update, [WF_KERNEL_CUDA] = MULTI_CUDA }, \
        .cost = cost_update,                                                          \
        .flags = WF_OP_STATEFUL | WF_OP_NO_GRAD,                                      \
        .n_assign = (K),                                                              \
        .kernel_ok = update_kernel_ok,                                                \
    };
UPDATE_DEF(1)
UPDATE_DEF(2)
UPDATE_DEF(3)
UPDATE_DEF(4)

/* ---- Multi-tensor updates (grad/update.h) ------------------------------------------------ */

/* A multi-tensor node's M members of K assigned inputs each, from its arity (its infer reads
 * only the node). Returns M, or 0 when the arity does not fit. */
static int multi_members(const wf_node *n, int *k)
{
    int a = n->op->n_assign, m = n->n_inputs - a - 2;
    if (a < 1 || m < 1 || a % m != 0 || a / m > 4)
        return 0;
    *k = a / m;
    return m;
}

static int infer_multi(wf_node *n, char *err, size_t errlen)
{
    int k = 0, m = multi_members(n, &k);
    if (!m) {
        snprintf(err, errlen,
                 "%d inputs do not fit %d assigned ones (M*K, then M gradients, the "
                 "step and the hyperparameters)",
                 n->n_inputs, n->op->n_assign);
        return WF_EINVAL;
    }
    int a = n->op->n_assign;
    for (int j = 0; j < m; j++) {
        const wf_node *w = n->inputs[j * k];
        int rc = check_update(w, (const wf_node *const *)n->inputs + j * k + 1, k, n->inputs[a + j],
                              n->inputs[a + m], n->inputs[a + m + 1], err, errlen);
        if (rc < 0)
            return rc;
        if (w->dtype != n->inputs[0]->dtype) {
            snprintf(err, errlen, "variable '%s' is %s but variable '%s' is %s", w->name,
                     wf_dtype_name(w->dtype), n->inputs[0]->name,
                     wf_dtype_name(n->inputs[0]->dtype));
            return WF_EDTYPE;
        }
    }
    n->dtype = n->inputs[0]->dtype;
    n->shape = n->inputs[0]->shape;
    return 0;
}

/* The members' updates and where each starts in the concatenation of their elements. */
typedef struct multi {
    int m;
    upd *u;         /* 'm' entries */
    int64_t *start; /* 'm + 1' entries: start[j] is member j's first element, start[m] all */
} multi;

/* Tiles [lo, hi) of WF__UPDATE_TILE elements of the concatenation: each piece of a tile
 * that falls in member j runs member j's loop over its own index range. */
static int multi_range(void *ctx, int64_t lo, int64_t hi)
{
    const multi *x = ctx;
    int64_t a = lo * WF__UPDATE_TILE, b = hi * WF__UPDATE_TILE;
    if (b > x->start[x->m])
        b = x->start[x->m];
    int l = 0, r = x->m; /* the member holding element a: binary search */
    while (l < r) {
        int mid = (l + r) / 2;
        if (x->start[mid + 1] <= a)
            l = mid + 1;
        else
            r = mid;
    }
    for (int j = l; j < x->m && a < b; j++) {
        int64_t end = x->start[j + 1] < b ? x->start[j + 1] : b;
        if (end > a)
            update_range(&x->u[j], a - x->start[j], end - x->start[j]);
        a = end;
    }
    return 0;
}

static int kernel_multi(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                        wf_tensor **out)
{
    (void)out; /* the node's value is variable 0's (core/op.h: n_assign) */
    int k = 0, m = multi_members(n, &k), a = n->op->n_assign;
    if (!m)
        return wf__err(WF_EINVAL, "%d inputs do not fit %d assigned ones", n->n_inputs, a);
    upd u0;
    int rc = update_scalars(in[a + m], in[a + m + 1], k, &u0);
    if (rc < 0)
        return rc;
    multi x = { .m = m,
                .u = malloc((size_t)m * sizeof *x.u),
                .start = malloc((size_t)(m + 1) * sizeof *x.start) };
    wf_tensor **gc = calloc((size_t)m, sizeof *gc);
    if (!x.u || !x.start || !gc)
        rc = wf__err(WF_ENOMEM, "no memory for a multi-tensor update of %d variables", m);
    x.start[0] = 0;
    for (int j = 0; rc == 0 && j < m; j++) {
        x.u[j] = u0;
        rc = update_arrays(&x.u[j], in + j * k, k, in[a + j], &gc[j]);
        x.start[j + 1] = x.start[j] + in[j * k]->numel;
    }
    int64_t tiles = rc == 0 ? (x.start[m] + WF__UPDATE_TILE - 1) / WF__UPDATE_TILE : 0;
    wf_runtime *rt = ctx ? wf__kernel_par_rt(ctx->rt) : NULL;
    if (rc == 0 && rt && tiles > 1)
        rc = wf_parallel_for(rt, 0, tiles, 1, multi_range, &x);
    else if (rc == 0)
        multi_range(&x, 0, tiles);
    for (int j = 0; gc && j < m; j++)
        wf_tensor_release(gc[j]);
    free(gc);
    free(x.u);
    free(x.start);
    return rc;
}

#ifdef WF_HAVE_CUDA
/* The CUDA kernel of multi_update and of update_K (one member): SGD (with momentum and
 * Nesterov), Adam and AdamW through ops/optim_cuda.cu's fused multi-tensor kernel
 * (wf__update_multi_cuda(): the same arithmetic as the loops above, each operation rounded
 * alone in the variable's type), with the scalars computed here as for the CPU
 * (scalars_of(): the schedule, the bias corrections). The step counter and the
 * hyperparameters are read to the host first (wf__cuda_read_host(): one wait for the stream;
 * they may be device or host memory). RMSProp and Adagrad have no CUDA kernel (WF_ENODEV;
 * placement keeps them on the host: update_kernel_ok()). Every variable, state and gradient
 * must be contiguous device memory of one dtype, f32 or f64 (WF_EINVAL otherwise). */
static int kernel_multi_cuda(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                             wf_tensor **out)
{
    (void)out; /* the node's value is variable 0's (core/op.h: n_assign) */
    int k = 0, m = multi_members(n, &k), a = n->op->n_assign;
    if (!m)
        return wf__err(WF_EINVAL, "%d inputs do not fit %d assigned ones", n->n_inputs, a);
    const wf_tensor *step = in[a + m], *hpt = in[a + m + 1];
    if (!hpt->contiguous || hpt->dtype != WF_F64 || hpt->numel != WF__HP_COUNT ||
        step->dtype != WF_I64 || step->numel != 1)
        return wf__err(WF_EINVAL,
                       "%s: the step is %s of %lld elements and the hyperparameters %s "
                       "of %lld (i64 [1] and contiguous f64 [%d])",
                       n->op->name, wf_dtype_name(step->dtype), (long long)step->numel,
                       wf_dtype_name(hpt->dtype), (long long)hpt->numel, WF__HP_COUNT);
    double hp[WF__HP_COUNT];
    int64_t t = 0;
    upd u;
    /* Both in one wait for the stream (this runs once per update node and step). */
    const void *src[2] = { hpt->data, step->data };
    void *dst[2] = { hp, &t };
    const size_t bytes[2] = { sizeof hp, sizeof t };
    int rc = wf__cuda_read_host(ctx, n->op->name, 2, src, dst, bytes);
    if (rc == 0)
        rc = scalars_of(hp, t, k, &u);
    if (rc < 0)
        return rc;
    wf_cuda_update cu = { .lr = u.lr,
                          .momentum = u.mom,
                          .beta1 = u.b1,
                          .beta2 = u.b2,
                          .eps = u.eps,
                          .weight_decay = u.wd,
                          .bias_correction1 = u.bc1,
                          .bias_correction2 = u.bc2,
                          .nesterov = u.nesterov };
    switch (u.kind) {
    case WF_OPT_SGD:
        cu.kind = WF_CU_OPT_SGD;
        break;
    case WF_OPT_ADAM:
        cu.kind = WF_CU_OPT_ADAM;
        break;
    case WF_OPT_ADAMW:
        cu.kind = WF_CU_OPT_ADAMW;
        break;
    default:
        return wf__err(WF_ENODEV, "%s: %s has no CUDA kernel (SGD, Adam and AdamW do)", n->op->name,
                       u.kind == WF_OPT_RMSPROP   ? "RMSProp"
                       : u.kind == WF_OPT_ADAGRAD ? "Adagrad"
                                                  : "this optimizer");
    }
    wf_tensor **w = malloc((size_t)m * 3 * sizeof *w);
    const wf_tensor **g = malloc((size_t)m * sizeof *g);
    if (!w || !g) {
        free(w);
        free(g);
        return wf__err(WF_ENOMEM, "no memory for a multi-tensor update of %d variables", m);
    }
    wf_tensor **s0 = w + m, **s1 = w + 2 * m;
    for (int j = 0; j < m; j++) {
        w[j] = in[j * k];
        s0[j] = k > 1 ? in[j * k + 1] : NULL;
        s1[j] = k > 2 ? in[j * k + 2] : NULL;
        g[j] = in[a + j];
    }
    rc = wf__update_multi_cuda(ctx, &cu, m, w, g, s0, s1);
    free(w);
    free(g);
    return rc;
}
#endif

/* The sum of its members' update costs. */
static void cost_multi(const wf_node *n, double *flops, double *bytes)
{
    int k = 0, m = multi_members(n, &k);
    double e = 0;
    for (int j = 0; j < m; j++) {
        const wf_node *w = n->inputs[j * k];
        double ej = 1;
        for (int d = 0; d < w->shape.rank; d++)
            ej *= w->shape.dims[d] > 0 ? (double)w->shape.dims[d] : 1;
        e += ej;
    }
    *flops = 10 * e;
    *bytes = (2.0 * k + 1) * e * (double)wf_dtype_size(n->dtype);
}

/* One def per n_assign (grad/update.h says why); all are "multi_update". */
#define MULTI_DEF(A)                                                                 \
    {                                                                                \
        .name = "multi_update",                                                      \
        .min_inputs = (A) + 3,                                                       \
        .max_inputs = -1,                                                            \
        .infer = infer_multi,                                                        \
        .kernel = { [WF_KERNEL_CPU] = kernel_multi, [WF_KERNEL_CUDA] = MULTI_CUDA }, \
        .cost = cost_multi,                                                          \
        .flags = WF_OP_STATEFUL | WF_OP_NO_GRAD,                                     \
        .n_assign = (A),                                                             \
        .kernel_ok = update_kernel_ok,                                               \
    },
#define MULTI_DEF4(A)  MULTI_DEF(A) MULTI_DEF((A) + 1) MULTI_DEF((A) + 2) MULTI_DEF((A) + 3)
#define MULTI_DEF16(A) MULTI_DEF4(A) MULTI_DEF4((A) + 4) MULTI_DEF4((A) + 8) MULTI_DEF4((A) + 12)
#define MULTI_DEF64(A) \
    MULTI_DEF16(A) MULTI_DEF16((A) + 16) MULTI_DEF16((A) + 32) MULTI_DEF16((A) + 48)
static const wf_op_def multi_defs[WF__UPDATE_MULTI_MAX] = { MULTI_DEF64(1) MULTI_DEF64(65)
                                                                MULTI_DEF64(129) MULTI_DEF64(193) };
_Static_assert(WF__UPDATE_MULTI_MAX == 256, "multi_defs has 256 entries");

bool wf__update_is_member(const wf_op_def *op)
{
    return op == &wf__op_update_1 || op == &wf__op_update_2 || op == &wf__op_update_3 ||
           op == &wf__op_update_4;
}

const wf_op_def *wf__update_multi_def(int n_assign)
{
    return n_assign >= 1 && n_assign <= WF__UPDATE_MULTI_MAX ? &multi_defs[n_assign - 1] : NULL;
}

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

#ifdef WF_HAVE_CUDA
static int kernel_increment_cuda(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                                 wf_tensor **out)
{
    (void)out;
    return wf__increment_cuda(ctx, n->op->name, in[0]);
}

#    define INCREMENT_CUDA kernel_increment_cuda
#else
#    define INCREMENT_CUDA NULL
#endif

const wf_op_def wf__op_increment = {
    .name = "increment",
    .min_inputs = 1,
    .max_inputs = 1,
    .infer = infer_increment,
    .kernel = { [WF_KERNEL_CPU] = kernel_increment, [WF_KERNEL_CUDA] = INCREMENT_CUDA },
    .cost = NULL,
    .flags = WF_OP_STATEFUL | WF_OP_NO_GRAD,
    .n_assign = 1,
};
