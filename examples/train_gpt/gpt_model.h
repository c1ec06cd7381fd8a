/* examples/train_gpt/gpt_model.h: a small GPT (decoder-only transformer) built from weft's
 * public ops: token and position embeddings, 'layers' blocks of (layer norm, causal
 * multi-head self-attention, residual; layer norm, GELU MLP 4x, residual), a final layer
 * norm and an output head (separate, or tied to the token embedding), trained with
 * softmax cross-entropy on the next token and AdamW.
 * Parameter names and layouts are nanoGPT's ("transformer.wte.weight" [vocab, d],
 * "transformer.h.0.attn.c_attn.weight" [3 d, d] as PyTorch's nn.Linear [out, in], ...), so a
 * checkpoint's tensors map one to one onto that model's state_dict.
 * Owns: the model's parameters (as graph variables) and the nodes of its forward pass, loss
 *   and training step.
 * Used by: train_gpt.c (the program), perf/train/train_bench.c (the gpt_adamw_b32 case) and
 *   tests/examples/test_train_gpt.c. Public API only, as every example.
 * Not here: the text, batches and sampling (train_gpt.c). */
#ifndef GPT_MODEL_H
#define GPT_MODEL_H

#include <weft/weft.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GPT_MAX_LAYERS       32
#define GPT_PARAMS_PER_LAYER 12
#define GPT_MAX_PARAMS       (GPT_PARAMS_PER_LAYER * GPT_MAX_LAYERS + 5)

/* The model's shape. 'context' is the longest sequence (the position table's size). */
typedef struct gpt_config {
    int vocab;      /* tokens, >= 2 */
    int context;    /* >= 1 */
    int d_model;    /* a multiple of 'heads' */
    int heads;      /* >= 1 */
    int layers;     /* 1 .. GPT_MAX_LAYERS */
    bool tie_head;  /* logits = h wte^T instead of a separate "lm_head.weight" */
    double dropout; /* on the embeddings and each residual branch while training; [0, 1) */
    uint64_t seed;  /* initial weights (and dropout masks) */
} gpt_config;

/* The parameters: variables of one graph, in a fixed order (wte, wpe, each block's twelve,
 * ln_f's weight and bias, lm_head unless tied). */
typedef struct gpt_model {
    gpt_config c;
    int n_params;
    wf_node *p[GPT_MAX_PARAMS];
    bool decay[GPT_MAX_PARAMS]; /* a matrix (embeddings, linear weights): AdamW decays it */
    /* A pipeline (set after gpt_build(); NULL: none): gpt_logits() puts its nodes in scopes
     * of 'hints', the embeddings on stage 0, block l on stage gpt_block_stage(), the final
     * layer norm and the head on the last stage. */
    wf_place_hints *hints;
    int stages;
} gpt_model;

/* How the step is trained (train_gpt's defaults: lr 3e-4, weight decay 0.1 on matrices,
 * clip 1.0, cosine schedule with warm-up). */
typedef struct gpt_train_opts {
    double lr;
    double weight_decay; /* decoupled, on the 'decay' parameters only (nanoGPT's groups) */
    double clip_norm;    /* > 0: clip all gradients together by their global norm */
    wf_lr_schedule schedule;
} gpt_train_opts;

/* Checks 'c'. Returns 0 or WF_EINVAL with the reason in 'err'. */
int gpt_config_check(const gpt_config *c, char *err, size_t errlen);

/* Adds the parameters of 'c' to 'g' as variables, initialised as nanoGPT does: N(0, 0.02)
 * for embeddings and linear weights (N(0, 0.02 / sqrt(2 layers)) for the projections that
 * feed the residual stream), zero biases, layer norms of ones and zeros.
 * Returns 0, or the graph's error (the message in wf_graph_errmsg(g)) or WF_EINVAL for a bad
 * config (the message in 'err'). */
int gpt_build(wf_graph *g, const gpt_config *c, gpt_model *m, char *err, size_t errlen);

/* The logits [batch * t, vocab] of the token ids 'idx' (i32 or i64 of the known shape
 * [batch, t], t <= context): row b * t + i predicts the token after idx[b, i] from
 * idx[b, 0 .. i] only (the causal mask). 'training' applies the config's dropout. Returns the
 * node, or NULL with the graph's error (a shape that does not fit names the op that failed
 * and the shapes). */
wf_node *gpt_logits(wf_graph *g, const gpt_model *m, wf_node *idx, bool training);

/* The pipeline stage of block 'l' of 'layers' over 'stages' stages: contiguous runs of
 * blocks, as even as the counts allow (the embeddings go with block 0, the head with the
 * last block's stage, the last one). */
int gpt_block_stage(int l, int layers, int stages);

/* The stage of parameter 'i' of 'm' (gpt_block_stage() of its block; the embeddings 0, the
 * final layer norm and the head the last stage). */
int gpt_param_stage(const gpt_model *m, int i);

/* Opens (stage >= 0) or closes (stage < 0) the scope of 'stage' in m->hints; 0 without
 * hints. Returns 0 or the hints' error (the message in wf_last_errmsg()). */
int gpt_stage_scope(wf_graph *g, const gpt_model *m, int stage);

/* The mean next-token cross-entropy of 'logits' (gpt_logits()) against 'targets' ([batch, t],
 * i32). Returns the scalar node, or NULL with the graph's error. */
wf_node *gpt_loss(wf_graph *g, wf_node *logits, wf_node *targets);

/* Adds the gradients of 'loss' with respect to every parameter, their clipping by global
 * norm and the updates of two groups: AdamW with 'weight_decay' for the matrices, Adam (AdamW
 * without decay) for the vectors, with step counters "adamw/step" and "adam/step". Writes the
 * nodes to run as targets for one step to 'targets' (two entries). Returns 0 or the graph's
 * error. */
int gpt_train_step(wf_graph *g, const gpt_model *m, wf_node *loss, const gpt_train_opts *o,
                   wf_node *targets[2]);

/* The number of weights of the model (tied heads counted once). */
int64_t gpt_weight_count(const gpt_model *m);

#endif /* GPT_MODEL_H */
