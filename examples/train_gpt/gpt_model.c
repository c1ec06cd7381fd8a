/* examples/train_gpt/gpt_model.c: the GPT of gpt_model.h, written with weft's public ops only
 * (no op of its own): embeddings are wf_gather of the token table plus the position table
 * (a wf_slice of its first t rows), attention is two batched wf_matmul_ex over
 * [B, heads, T, dh] with a constant causal mask added before wf_softmax, and the block's
 * linear layers are 2-D matmuls over the [B T, d] residual stream. Scale factors go on
 * weights ([d, d]) rather than activations ([B, H, T, dh] or larger) wherever the algebra
 * allows: the backward then touches the small tensor too.
 * Invariant: the residual stream is [batch * t, d_model] between blocks: one GEMM per linear
 *   layer, reshaped to [B, T, ...] only around the attention.
 * Not here: data, sampling and the command line (train_gpt.c). */
#include "gpt_model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int gpt_config_check(const gpt_config *c, char *err, size_t errlen)
{
    const char *why = NULL;
    if (c->vocab < 2)
        why = "the vocabulary needs at least 2 tokens";
    else if (c->context < 1 || c->context > 1 << 16)
        why = "the context must be 1 .. 65536";
    else if (c->heads < 1 || c->d_model < 1 || c->d_model % c->heads != 0)
        why = "d_model must be a positive multiple of heads";
    else if (c->layers < 1 || c->layers > GPT_MAX_LAYERS)
        why = "layers must be 1 .. 32";
    else if (!(c->dropout >= 0 && c->dropout < 1))
        why = "dropout must be in [0, 1)";
    if (!why)
        return 0;
    snprintf(err, errlen, "gpt: %s (vocab %d, context %d, d_model %d, heads %d, layers %d)", why,
             c->vocab, c->context, c->d_model, c->heads, c->layers);
    return WF_EINVAL;
}

static wf_node *param(wf_graph *g, gpt_model *m, const char *name, wf_shape shape, wf_init init,
                      bool decay)
{
    wf_node *v = wf_variable(g, name, WF_F32, shape, init);
    m->decay[m->n_params] = decay;
    m->p[m->n_params++] = v;
    return v;
}

int gpt_build(wf_graph *g, const gpt_config *c, gpt_model *m, char *err, size_t errlen)
{
    memset(m, 0, sizeof *m);
    int rc = gpt_config_check(c, err, errlen);
    if (rc < 0)
        return rc;
    m->c = *c;
    int64_t d = c->d_model;
    /* nanoGPT: N(0, 0.02), and 0.02 / sqrt(2 n_layer) for the residual projections so that
     * the stream's variance does not grow with depth */
    double sd = 0.02, sd_proj = 0.02 / sqrt(2.0 * c->layers);
    uint64_t s = c->seed * 1000003u + 17;
    param(g, m, "transformer.wte.weight", WF_SHAPE(c->vocab, d), wf_init_normal(s++, 0, sd), true);
    param(g, m, "transformer.wpe.weight", WF_SHAPE(c->context, d), wf_init_normal(s++, 0, sd),
          true);
    for (int l = 0; l < c->layers; l++) {
        char n[96];
#define NAME(suffix) (snprintf(n, sizeof n, "transformer.h.%d.%s", l, suffix), n)
        param(g, m, NAME("ln_1.weight"), WF_SHAPE(d), wf_init_ones(), false);
        param(g, m, NAME("ln_1.bias"), WF_SHAPE(d), wf_init_zeros(), false);
        param(g, m, NAME("attn.c_attn.weight"), WF_SHAPE(3 * d, d), wf_init_normal(s++, 0, sd),
              true);
        param(g, m, NAME("attn.c_attn.bias"), WF_SHAPE(3 * d), wf_init_zeros(), false);
        param(g, m, NAME("attn.c_proj.weight"), WF_SHAPE(d, d), wf_init_normal(s++, 0, sd_proj),
              true);
        param(g, m, NAME("attn.c_proj.bias"), WF_SHAPE(d), wf_init_zeros(), false);
        param(g, m, NAME("ln_2.weight"), WF_SHAPE(d), wf_init_ones(), false);
        param(g, m, NAME("ln_2.bias"), WF_SHAPE(d), wf_init_zeros(), false);
        param(g, m, NAME("mlp.c_fc.weight"), WF_SHAPE(4 * d, d), wf_init_normal(s++, 0, sd), true);
        param(g, m, NAME("mlp.c_fc.bias"), WF_SHAPE(4 * d), wf_init_zeros(), false);
        param(g, m, NAME("mlp.c_proj.weight"), WF_SHAPE(d, 4 * d), wf_init_normal(s++, 0, sd_proj),
              true);
        param(g, m, NAME("mlp.c_proj.bias"), WF_SHAPE(d), wf_init_zeros(), false);
#undef NAME
    }
    param(g, m, "transformer.ln_f.weight", WF_SHAPE(d), wf_init_ones(), false);
    param(g, m, "transformer.ln_f.bias", WF_SHAPE(d), wf_init_zeros(), false);
    if (!c->tie_head)
        param(g, m, "lm_head.weight", WF_SHAPE(c->vocab, d), wf_init_normal(s++, 0, sd), true);
    rc = wf_graph_status(g);
    if (rc < 0)
        snprintf(err, errlen, "gpt: %s", wf_graph_errmsg(g));
    return rc;
}

/* y = x w^T + b for x [rows, in], w [out, in] (PyTorch's nn.Linear). */
static wf_node *linear(wf_graph *g, wf_node *x, wf_node *w, wf_node *b)
{
    return wf_add(g, wf_matmul_ex(g, x, w, false, true), b);
}

/* x (when training with dropout) through a dropout of a seed of its own per site. */
static wf_node *drop(wf_graph *g, const gpt_model *m, wf_node *x, bool training, uint64_t site)
{
    if (!training || m->c.dropout <= 0)
        return x;
    return wf_dropout(g, x, m->c.dropout, m->c.seed * 7919u + site);
}

/* The causal mask [t, t]: 0 where key j <= query i, -inf above the diagonal, so that
 * softmax gives exactly 0 weight to the future. Every row keeps its diagonal, so no row is
 * all -inf. */
static wf_node *causal_mask(wf_graph *g, int64_t t)
{
    float *v = malloc((size_t)(t * t) * sizeof *v);
    if (!v)
        return wf_constant(g, NULL); /* records WF_EINVAL in the graph: no memory for it */
    for (int64_t i = 0; i < t; i++)
        for (int64_t j = 0; j < t; j++)
            v[i * t + j] = j <= i ? 0.0f : -INFINITY;
    wf_tensor *mask = wf_tensor_from(WF_F32, WF_SHAPE(t, t), v);
    free(v);
    wf_node *n = wf_constant(g, mask);
    wf_tensor_release(mask);
    return n;
}

/* Causal multi-head self-attention of h [B T, d] with the block's parameters at 'p'
 * (c_attn weight, bias, c_proj weight, bias): [B T, d]. */
static wf_node *attention(wf_graph *g, const gpt_model *m, wf_node *h, wf_node *const *p,
                          wf_node *mask, int64_t batch, int64_t t)
{
    int64_t d = m->c.d_model, heads = m->c.heads, dh = d / heads;
    /* q, k, v [B, H, T, dh]: three products with the row blocks of c_attn ([3 d, d] and [3 d],
     * as nanoGPT stores them). Slicing the weights rather than splitting the [B T, 3 d]
     * product keeps the backward small: a slice's gradient is zeros of its input's shape with
     * the part written in, which costs [3 d, d] here but [B T, 3 d] three times there. */
    wf_node *qkv[3];
    const int perm[] = { 0, 2, 1, 3 };
    for (int i = 0; i < 3; i++) {
        const int64_t wb[] = { i * d, 0 }, we[] = { (i + 1) * d, d };
        const int64_t bb[] = { i * d }, be[] = { (i + 1) * d };
        wf_node *w = wf_slice(g, p[0], wb, we, NULL), *b = wf_slice(g, p[1], bb, be, NULL);
        if (i == 0) { /* scores = q k^T / sqrt(dh): the scale goes on q's [d, d] weights */
            wf_node *scale = wf_scalar(g, WF_F32, 1.0 / sqrt((double)dh));
            w = wf_mul(g, w, scale);
            b = wf_mul(g, b, scale);
        }
        wf_node *x = wf_reshape(g, linear(g, h, w, b), WF_SHAPE(batch, t, heads, dh));
        qkv[i] = wf_transpose(g, x, perm, 4);
    }
    wf_node *att = wf_matmul_ex(g, qkv[0], qkv[1], false, true);
    att = wf_softmax(g, wf_add(g, att, mask), -1);
    wf_node *y = wf_matmul(g, att, qkv[2]); /* [B, H, T, dh] */
    y = wf_reshape(g, wf_transpose(g, y, perm, 4), WF_SHAPE(batch < 0 ? -1 : batch * t, d));
    return linear(g, y, p[2], p[3]);
}

int gpt_block_stage(int l, int layers, int stages)
{
    return (int)((int64_t)l * stages / layers);
}

int gpt_param_stage(const gpt_model *m, int i)
{
    int last = m->stages > 1 ? m->stages - 1 : 0;
    if (i < 2 || m->stages < 2)
        return 0;
    if (i >= 2 + GPT_PARAMS_PER_LAYER * m->c.layers)
        return last;
    return gpt_block_stage((i - 2) / GPT_PARAMS_PER_LAYER, m->c.layers, m->stages);
}

int gpt_stage_scope(wf_graph *g, const gpt_model *m, int stage)
{
    if (!m->hints)
        return 0;
    if (stage < 0)
        return wf_place_scope_end(m->hints, g);
    char dev[32];
    snprintf(dev, sizeof dev, "rank:%d/cpu:0", stage);
    return wf_place_scope_begin(m->hints, g, dev);
}

/* The forward of gpt_logits() (its scopes opened and closed around it there). */
static wf_node *logits_of(wf_graph *g, const gpt_model *m, wf_node *idx, bool training);

wf_node *gpt_logits(wf_graph *g, const gpt_model *m, wf_node *idx, bool training)
{
    wf_node *out = logits_of(g, m, idx, training);
    if (m->hints) { /* the scope still open (none when it failed before the first) */
        int rc = wf_place_scope_end(m->hints, g);
        if (rc < 0 && out)
            return NULL;
    }
    return out;
}

/* Closes the open scope and opens the one of 'stage': -1 on failure. */
static int next_scope(wf_graph *g, const gpt_model *m, int stage, bool first)
{
    if (!m->hints)
        return 0;
    if (!first && gpt_stage_scope(g, m, -1) < 0)
        return -1;
    return gpt_stage_scope(g, m, stage) < 0 ? -1 : 0;
}

static wf_node *logits_of(wf_graph *g, const gpt_model *m, wf_node *idx, bool training)
{
    const gpt_config *c = &m->c;
    if (!idx || next_scope(g, m, 0, true) < 0)
        return NULL;
    /* [batch, t] with t <= context, the batch -1 where it is known only when fed (a
     * data-parallel strategy's shards); anything else fails below in the op that cannot take
     * it (a t above the context in the add of the position table, a -1 t in the reshape),
     * with that op's message naming the shapes */
    wf_shape is = wf_node_shape(idx);
    int64_t batch = is.rank == 2 ? is.dims[0] : -1, t = is.rank == 2 ? is.dims[1] : -1;
    int64_t d = c->d_model;
    wf_node *wpe = m->p[1];
    if (t >= 0 && t < c->context) {
        const int64_t begin[] = { 0, 0 }, end[] = { t, d };
        wpe = wf_slice(g, wpe, begin, end, NULL);
    }
    /* tok [B, T, d] + pos [T, d] -> the stream [B T, d] */
    wf_node *x = wf_add(g, wf_gather(g, m->p[0], idx, 0), wpe);
    x = drop(g, m, wf_reshape(g, x, WF_SHAPE(batch < 0 ? -1 : batch * t, d)), training, 1);
    wf_node *mask = causal_mask(g, t);
    for (int l = 0; l < c->layers; l++) {
        wf_node *const *p = &m->p[2 + GPT_PARAMS_PER_LAYER * l];
        if (next_scope(g, m, gpt_param_stage(m, 2 + GPT_PARAMS_PER_LAYER * l), false) < 0)
            return NULL;
        wf_node *h = wf_layer_norm(g, x, p[0], p[1], -1, 1e-5);
        h = attention(g, m, h, &p[2], mask, batch, t);
        x = wf_add(g, x, drop(g, m, h, training, 2 + 2 * (uint64_t)l));
        h = wf_layer_norm(g, x, p[6], p[7], -1, 1e-5);
        h = linear(g, wf_gelu(g, linear(g, h, p[8], p[9]), false), p[10], p[11]);
        x = wf_add(g, x, drop(g, m, h, training, 3 + 2 * (uint64_t)l));
    }
    int f = 2 + GPT_PARAMS_PER_LAYER * c->layers;
    if (next_scope(g, m, gpt_param_stage(m, f), false) < 0)
        return NULL;
    x = wf_layer_norm(g, x, m->p[f], m->p[f + 1], -1, 1e-5);
    wf_node *head = c->tie_head ? m->p[0] : m->p[f + 2];
    return wf_matmul_ex(g, x, head, false, true);
}

wf_node *gpt_loss(wf_graph *g, wf_node *logits, wf_node *targets)
{
    wf_node *flat = wf_reshape(g, targets, WF_SHAPE(-1));
    return wf_mean(g, wf_softmax_cross_entropy(g, logits, flat));
}

int gpt_train_step(wf_graph *g, const gpt_model *m, wf_node *loss, const gpt_train_opts *o,
                   wf_node *targets[2])
{
    wf_node *grads[GPT_MAX_PARAMS], *clipped[GPT_MAX_PARAMS];
    targets[0] = targets[1] = NULL;
    int n = m->n_params;
    int rc = wf_gradients(g, loss, m->p, n, grads);
    if (rc < 0)
        return rc;
    if (o->clip_norm > 0) {
        rc = wf_clip_by_global_norm(g, grads, n, o->clip_norm, clipped, NULL);
        if (rc < 0)
            return rc;
    } else {
        memcpy(clipped, grads, (size_t)n * sizeof *grads);
    }
    /* Two groups as nanoGPT's configure_optimizers: AdamW with weight decay for the matrices,
     * and without it for the vectors, which is exactly Adam without weight decay: that group
     * is a WF_OPT_ADAM so that it keeps a step counter of its own ("adam/step" beside
     * "adamw/step"). Two AdamW groups would share one "adamw/step" (wf_apply_gradients
     * reuses a state variable of the same name), counted twice per step. Both counters
     * advance once per step, so the schedules and bias corrections agree. */
    for (int group = 0; group < 2; group++) {
        wf_node *v[GPT_MAX_PARAMS], *dv[GPT_MAX_PARAMS];
        int k = 0;
        for (int i = 0; i < n; i++)
            if (m->decay[i] == (group == 0)) {
                v[k] = m->p[i];
                dv[k++] = clipped[i];
            }
        wf_optimizer opt = group == 0 ? wf_adamw(o->lr, o->weight_decay) : wf_adam(o->lr);
        opt.schedule = o->schedule;
        targets[group] = wf_apply_gradients(g, opt, v, dv, k);
    }
    rc = wf_graph_status(g);
    if (rc < 0)
        targets[0] = targets[1] = NULL;
    return rc;
}

int64_t gpt_weight_count(const gpt_model *m)
{
    int64_t n = 0;
    for (int i = 0; i < m->n_params; i++)
        n += wf_shape_numel(wf_node_shape(m->p[i]));
    return n;
}
