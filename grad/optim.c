/* grad/optim.c: optimizers as graph nodes: wf_optimizer_check, wf_optimizer_lr,
 * wf_clip_by_global_norm, wf_apply_gradients and wf_minimize (weft/grad.h).
 * Owns: the naming of optimizer state ("<var>/<slot>", "<kind>/step"), the hyperparameter
 *   vector of update nodes (grad/internal.h), and the ordering of a step: each update after
 *   every node that reads its variable, the counter's increment after every update.
 * Not here: the update kernels (optim_cpu.c), gradients (gradients.c). */
#include "internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *kind_name(wf_optimizer_kind k)
{
    switch (k) {
    case WF_OPT_SGD:
        return "sgd";
    case WF_OPT_ADAM:
        return "adam";
    case WF_OPT_ADAMW:
        return "adamw";
    case WF_OPT_RMSPROP:
        return "rmsprop";
    case WF_OPT_ADAGRAD:
        return "adagrad";
    }
    return NULL;
}

static bool finite_nonneg(double v)
{
    return isfinite(v) && v >= 0;
}

int wf_optimizer_check(const wf_optimizer *o)
{
    if (!o)
        return wf__err(WF_EINVAL, "optimizer: NULL");
    const char *k = kind_name(o->kind);
    if (!k)
        return wf__err(WF_EINVAL, "optimizer: unknown kind %d", (int)o->kind);
    if (!(isfinite(o->lr) && o->lr > 0))
        return wf__err(WF_EINVAL, "%s: lr is %g; it must be > 0", k, o->lr);
    if (!finite_nonneg(o->momentum) || o->momentum >= 1 + 1e-12)
        return wf__err(WF_EINVAL, "%s: momentum is %g; it must be in [0, 1]", k, o->momentum);
    if (o->nesterov && o->momentum <= 0)
        return wf__err(WF_EINVAL, "%s: Nesterov needs momentum > 0", k);
    if (!finite_nonneg(o->weight_decay))
        return wf__err(WF_EINVAL, "%s: weight_decay is %g; it must be >= 0", k, o->weight_decay);
    if (!finite_nonneg(o->eps))
        return wf__err(WF_EINVAL, "%s: eps is %g; it must be >= 0", k, o->eps);
    if (o->kind == WF_OPT_ADAM || o->kind == WF_OPT_ADAMW) {
        if (!finite_nonneg(o->beta1) || o->beta1 >= 1 || !finite_nonneg(o->beta2) || o->beta2 >= 1)
            return wf__err(WF_EINVAL, "%s: betas are (%g, %g); each must be in [0, 1)", k, o->beta1,
                           o->beta2);
    }
    if (o->kind == WF_OPT_RMSPROP && (!finite_nonneg(o->rho) || o->rho >= 1))
        return wf__err(WF_EINVAL, "%s: rho (alpha) is %g; it must be in [0, 1)", k, o->rho);
    if (!finite_nonneg(o->initial_accumulator))
        return wf__err(WF_EINVAL, "%s: initial_accumulator is %g", k, o->initial_accumulator);
    if (!finite_nonneg(o->clip_norm))
        return wf__err(WF_EINVAL, "%s: clip_norm is %g; it must be >= 0 (0: no clipping)", k,
                       o->clip_norm);
    const wf_lr_schedule *s = &o->schedule;
    if (s->warmup_steps < 0)
        return wf__err(WF_EINVAL, "%s: warmup_steps is %lld", k, (long long)s->warmup_steps);
    switch (s->kind) {
    case WF_LR_CONSTANT:
        break;
    case WF_LR_STEP:
        if (s->step_size <= 0 || !finite_nonneg(s->gamma))
            return wf__err(WF_EINVAL,
                           "%s: step schedule needs step_size > 0 (%lld) and gamma >= 0 (%g)", k,
                           (long long)s->step_size, s->gamma);
        break;
    case WF_LR_COSINE:
        if (s->total_steps <= s->warmup_steps || !finite_nonneg(s->min_lr) || s->min_lr > o->lr)
            return wf__err(WF_EINVAL,
                           "%s: cosine schedule needs total_steps (%lld) > warmup_steps (%lld) and "
                           "0 <= min_lr (%g) <= lr (%g)",
                           k, (long long)s->total_steps, (long long)s->warmup_steps, s->min_lr,
                           o->lr);
        break;
    default:
        return wf__err(WF_EINVAL, "%s: unknown schedule kind %d", k, (int)s->kind);
    }
    return 0;
}

static void hyper(const wf_optimizer *o, double *hp)
{
    memset(hp, 0, WF__HP_COUNT * sizeof *hp);
    hp[WF__HP_KIND] = o->kind;
    hp[WF__HP_LR] = o->lr;
    hp[WF__HP_MOMENTUM] = o->momentum;
    hp[WF__HP_NESTEROV] = o->nesterov;
    hp[WF__HP_CENTERED] = o->kind == WF_OPT_RMSPROP && o->centered;
    hp[WF__HP_BETA1] = o->beta1;
    hp[WF__HP_BETA2] = o->beta2;
    hp[WF__HP_RHO] = o->rho;
    hp[WF__HP_EPS] = o->eps;
    hp[WF__HP_WD] = o->weight_decay;
    hp[WF__HP_SCHED] = o->schedule.kind;
    hp[WF__HP_WARMUP] = (double)o->schedule.warmup_steps;
    hp[WF__HP_STEP_SIZE] = (double)o->schedule.step_size;
    hp[WF__HP_GAMMA] = o->schedule.gamma;
    hp[WF__HP_TOTAL] = (double)o->schedule.total_steps;
    hp[WF__HP_MIN_LR] = o->schedule.min_lr;
}

double wf_optimizer_lr(const wf_optimizer *opt, int64_t step)
{
    double hp[WF__HP_COUNT];
    if (!opt)
        return NAN;
    hyper(opt, hp);
    return wf__optim_lr(hp, step < 0 ? 0 : step);
}

/* ---- Clipping ------------------------------------------------------------------------- */

int wf_clip_by_global_norm(wf_graph *g, wf_node *const *grads, int n, double clip_norm,
                           wf_node **out, wf_node **norm)
{
    wf_srcloc loc = wf__srcloc_take();
    if (!g)
        return wf__err(WF_EINVAL, "wf_clip_by_global_norm: graph is NULL");
    if (n < 1 || !grads || !out || !(isfinite(clip_norm) && clip_norm > 0))
        return wf__graph_fail(g, WF_EINVAL,
                              "wf_clip_by_global_norm: %d gradients, clip_norm %g (need n >= 1, "
                              "clip_norm > 0, grads and out)",
                              n, clip_norm);
    for (int i = 0; i < n; i++) {
        if (!grads[i])
            return wf_graph_status(g) < 0
                       ? wf_graph_status(g)
                       : wf__graph_fail(g, WF_EINVAL, "wf_clip_by_global_norm: grads[%d] is NULL",
                                        i);
        if (grads[i]->dtype != grads[0]->dtype)
            return wf__graph_fail(g, WF_EINVAL,
                                  "wf_clip_by_global_norm: grads[%d] is %s but grads[0] is %s", i,
                                  wf_dtype_name(grads[i]->dtype), wf_dtype_name(grads[0]->dtype));
    }
    int first = wf_graph_node_count(g);
    wf_node *stack[64], **sq = n <= 64 ? stack : malloc((size_t)n * sizeof *sq);
    if (!sq)
        return wf__graph_fail(g, WF_ENOMEM, "wf_clip_by_global_norm: no memory");
    for (int i = 0; i < n; i++)
        sq[i] = (wf_sum)(g, (wf_square)(g, grads[i]));
    wf_node *total = (wf_add_n)(g, sq, n);
    if (sq != stack)
        free(sq);
    wf_node *nrm = total ? (wf_sqrt)(g, total) : NULL;
    wf_node *c = nrm ? wf__grad_scalar(g, nrm, clip_norm) : NULL;
    wf_node *scale = c ? (wf_div)(g, c, (wf_maximum)(g, nrm, c)) : NULL;
    for (int i = 0; i < n; i++)
        out[i] = scale ? (wf_mul)(g, grads[i], scale) : NULL;
    for (int id = first; id < wf_graph_node_count(g); id++) {
        wf_node *v = wf_graph_node(g, id);
        v->file = loc.file ? grads[0]->file : v->file;
        v->line = loc.file ? grads[0]->line : v->line;
    }
    if (norm)
        *norm = nrm;
    if (wf_graph_status(g) < 0) {
        for (int i = 0; i < n; i++)
            out[i] = NULL;
        return wf_graph_status(g);
    }
    return 0;
}

/* ---- Updates -------------------------------------------------------------------------- */

/* 'base' if no node of 'g' has that name, else "<base>_<k>" for the first free k. */
static const char *unique(const wf_graph *g, const char *base, char *buf, size_t size)
{
    snprintf(buf, size, "%s", base);
    for (int k = 1; wf_graph_find(g, buf); k++)
        snprintf(buf, size, "%s_%d", base, k);
    return buf;
}

/* True if an update node of 'g' already writes 'v'. */
static bool written(const wf_graph *g, const wf_node *v)
{
    for (int id = v->id + 1; id < wf_graph_node_count(g); id++) {
        const wf_node *n = wf_graph_node(g, id);
        for (int k = 0; k < n->op->n_assign; k++)
            if (n->inputs[k] == v)
                return true;
    }
    return false;
}

/* The variable named 'base' if it exists with this dtype and shape and no update writes it
 * yet (an eager step that rebuilt its variables, or state restored by name, continues the
 * same state), else a new one initialised with 'init' under 'base' or, when that name is
 * taken, "<base>_<k>": two optimizers in one graph (parameter groups) never share a step
 * counter or a slot. */
static wf_node *state_var(wf_graph *g, const char *base, wf_dtype dt, wf_shape shape, wf_init init,
                          wf_srcloc loc)
{
    char name[512];
    wf_node *v = wf_graph_find(g, base);
    if (v && v->op == &wf_op_variable && v->dtype == dt && wf_shape_equal(v->shape, shape) &&
        !written(g, v))
        return v;
    wf_set_source_location(loc.file, loc.line);
    return (wf_variable)(g, unique(g, base, name, sizeof name), dt, shape, init);
}

/* Slot names per kind, in the update op's order. */
static int slots(const wf_optimizer *o, const char **names)
{
    int k = 0;
    switch (o->kind) {
    case WF_OPT_SGD:
        if (o->momentum > 0)
            names[k++] = "momentum";
        break;
    case WF_OPT_ADAM:
    case WF_OPT_ADAMW:
        names[k++] = o->kind == WF_OPT_ADAM ? "adam_m" : "adamw_m";
        names[k++] = o->kind == WF_OPT_ADAM ? "adam_v" : "adamw_v";
        break;
    case WF_OPT_RMSPROP:
        names[k++] = "rms_square_avg";
        if (o->centered)
            names[k++] = "rms_grad_avg";
        if (o->momentum > 0)
            names[k++] = "rms_momentum";
        break;
    case WF_OPT_ADAGRAD:
        names[k++] = "adagrad_sum";
        break;
    }
    return k;
}

/* Makes 'upd' run after every node that reads 'var' (made before 'upd'), other than 'upd'. */
static int after_readers(wf_graph *g, wf_node *upd, const wf_node *var)
{
    for (int id = var->id + 1; id < upd->id; id++) {
        wf_node *r = wf_graph_node(g, id);
        for (int k = 0; k < r->n_inputs; k++)
            if (r->inputs[k] == var) {
                int rc = wf__node_add_control(upd, r);
                if (rc < 0)
                    return rc;
                break;
            }
    }
    return 0;
}

static wf_node *apply(wf_graph *g, const wf_optimizer *opt, wf_node *const *vars,
                      wf_node *const *grads, int n, wf_srcloc loc)
{
    char where[256];
    int rc = wf_optimizer_check(opt);
    if (rc < 0) {
        wf__graph_fail(g, rc, "%s", wf_last_errmsg());
        return NULL;
    }
    if (n < 1 || !vars || !grads) {
        wf__graph_fail(g, WF_EINVAL, "wf_apply_gradients: %d variables (need at least 1)", n);
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        if (!vars[i] || !grads[i]) {
            if (wf_graph_status(g) == 0)
                wf__graph_fail(g, WF_EINVAL, "wf_apply_gradients: %s[%d] is NULL",
                               vars[i] ? "grads" : "vars", i);
            return NULL;
        }
        if (vars[i]->op != &wf_op_variable || vars[i]->graph != g) {
            wf__graph_fail(g, WF_EINVAL,
                           "wf_apply_gradients: vars[%d] ('%s', a %s, %s) is not a "
                           "variable of this graph",
                           i, vars[i]->name, vars[i]->op->name,
                           wf__node_where(vars[i], where, sizeof where));
            return NULL;
        }
    }
    wf_node *const *gs = grads;
    wf_node **clipped = NULL;
    if (opt->clip_norm > 0) {
        if (!(clipped = malloc((size_t)n * sizeof *clipped))) {
            wf__graph_fail(g, WF_ENOMEM, "wf_apply_gradients: no memory");
            return NULL;
        }
        wf_set_source_location(loc.file, loc.line);
        if ((rc = wf_clip_by_global_norm(g, grads, n, opt->clip_norm, clipped, NULL)) < 0) {
            free(clipped);
            return NULL;
        }
        gs = clipped;
    }
    /* Hyperparameters and the step counter. */
    double hp[WF__HP_COUNT];
    hyper(opt, hp);
    wf_tensor *ht = wf_tensor_from(WF_F64, WF_SHAPE(WF__HP_COUNT), hp);
    char base[64];
    snprintf(base, sizeof base, "%s/step", kind_name(opt->kind));
    wf_node *hpn = NULL, *step = NULL, *inc = NULL;
    wf_node **upds = malloc((size_t)n * sizeof *upds);
    if (!ht || !upds) {
        wf__graph_fail(g, WF_ENOMEM, "wf_apply_gradients: no memory");
        goto done;
    }
    wf_set_source_location(loc.file, loc.line);
    hpn = (wf_constant)(g, ht);
    step = state_var(g, base, WF_I64, WF_SCALAR, wf_init_zeros(), loc);
    if (!hpn || !step)
        goto done;
    static const wf_op_def *const defs[] = { &wf__op_update_1, &wf__op_update_2, &wf__op_update_3,
                                             &wf__op_update_4 };
    const char *sn[3];
    int k = slots(opt, sn);
    for (int i = 0; i < n; i++) {
        wf_node *in[7];
        in[0] = vars[i];
        for (int j = 0; j < k; j++) {
            char sname[512];
            snprintf(sname, sizeof sname, "%s/%s", vars[i]->name, sn[j]);
            wf_init init = opt->kind == WF_OPT_ADAGRAD ? wf_init_constant(opt->initial_accumulator)
                                                       : wf_init_zeros();
            in[1 + j] = state_var(g, sname, vars[i]->dtype, vars[i]->shape, init, loc);
            if (!in[1 + j])
                goto done;
        }
        in[k + 1] = gs[i];
        in[k + 2] = step;
        in[k + 3] = hpn;
        upds[i] = wf__node_add_ex(g, defs[k], NULL, in, k + 4, NULL, loc);
        if (!upds[i] || after_readers(g, upds[i], vars[i]) < 0)
            goto done;
    }
    inc = wf__node_add_ex(g, &wf__op_increment, NULL, &step, 1, NULL, loc);
    for (int i = 0; inc && i < n; i++)
        if (wf__node_add_control(inc, upds[i]) < 0)
            inc = NULL;
done:
    wf_tensor_release(ht);
    free(upds);
    free(clipped);
    return wf_graph_status(g) < 0 ? NULL : inc;
}

wf_node *(wf_apply_gradients)(wf_graph *g, wf_optimizer opt, wf_node *const *vars,
                              wf_node *const *grads, int n)
{
    wf_srcloc loc = wf__srcloc_take();
    if (!g) {
        wf__err(WF_EINVAL, "wf_apply_gradients: graph is NULL");
        return NULL;
    }
    if (wf_graph_status(g) < 0)
        return NULL;
    return apply(g, &opt, vars, grads, n, loc);
}

wf_node *(wf_minimize)(wf_graph *g, wf_optimizer opt, wf_node *loss)
{
    wf_srcloc loc = wf__srcloc_take();
    if (!g) {
        wf__err(WF_EINVAL, "wf_minimize: graph is NULL");
        return NULL;
    }
    if (wf_graph_status(g) < 0)
        return NULL;
    if (!loss || loss->graph != g) {
        wf__graph_fail(g, WF_EINVAL, "wf_minimize: the loss is %s",
                       loss ? "of another graph" : "NULL");
        return NULL;
    }
    /* The floating variables the loss depends on, in creation order. */
    int n_nodes = loss->id + 1, n = 0;
    uint8_t *anc = calloc((size_t)n_nodes, 1);
    wf_node **vars = malloc((size_t)n_nodes * sizeof *vars), **grads = NULL;
    wf_node *r = NULL;
    if (!anc || !vars) {
        wf__graph_fail(g, WF_ENOMEM, "wf_minimize: no memory");
        goto done;
    }
    anc[loss->id] = 1;
    for (int id = loss->id; id >= 0; id--) {
        if (!anc[id])
            continue;
        const wf_node *v = wf_graph_node(g, id);
        for (int k = 0; k < v->n_inputs; k++)
            anc[v->inputs[k]->id] = 1;
    }
    for (int id = 0; id < n_nodes; id++) {
        wf_node *v = wf_graph_node(g, id);
        if (anc[id] && v->op == &wf_op_variable && wf_dtype_is_float(v->dtype))
            vars[n++] = v;
    }
    if (n == 0) {
        char where[256];
        wf__graph_fail(g, WF_EINVAL,
                       "wf_minimize: the loss '%s' (%s) depends on no floating variable",
                       loss->name, wf__node_where(loss, where, sizeof where));
        goto done;
    }
    if (!(grads = malloc((size_t)n * sizeof *grads))) {
        wf__graph_fail(g, WF_ENOMEM, "wf_minimize: no memory");
        goto done;
    }
    if (wf_gradients_ex(g, &loss, NULL, 1, vars, n, grads) < 0)
        goto done;
    r = apply(g, &opt, vars, grads, n, loc);
done:
    free(anc);
    free(vars);
    free(grads);
    return r;
}
