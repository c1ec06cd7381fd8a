/* guide_model.h: the data and the model of docs/guide.md's programs: three interleaved
 * spirals of points in the plane (a classic that a linear model cannot separate) and a
 * two-layer perceptron that classifies them. The guide shows this file as it is. */
#ifndef GUIDE_MODEL_H
#define GUIDE_MODEL_H

#include <weft/weft.h>

#include <math.h>
#include <stdint.h>

enum { CLASSES = 3, PER_CLASS = 100, N = CLASSES * PER_CLASS, HIDDEN = 64 };

/* Point i of class c: radius r in [0, 1), angle 4c + 4r plus a little noise from a fixed
 * generator, so every run sees the same data. x is [N, 2], y is [N]. */
static inline void spiral_data(float *x, int32_t *y)
{
    uint64_t s = 42;
    for (int c = 0; c < CLASSES; c++) {
        for (int i = 0; i < PER_CLASS; i++) {
            s = s * 6364136223846793005u + 1442695040888963407u; /* a 64-bit LCG */
            double noise = ((double)(s >> 11) / 9007199254740992.0 - 0.5) * 0.4;
            double r = (double)i / PER_CLASS, t = 4.0 * c + 4.0 * r + noise;
            int k = c * PER_CLASS + i;
            x[2 * k] = (float)(r * sin(t));
            x[2 * k + 1] = (float)(r * cos(t));
            y[k] = c;
        }
    }
}

/* logits = relu(x W1 + b1) W2 + b2, with x [batch, 2]: the variables are named "l1.w",
 * "l1.b", "l2.w" and "l2.b", which is how a checkpoint names them. */
static inline wf_node *spiral_model(wf_graph *g, wf_node *x)
{
    wf_node *w1 = wf_variable(g, "l1.w", WF_F32, WF_SHAPE(2, HIDDEN), wf_init_he_uniform(1));
    wf_node *b1 = wf_variable(g, "l1.b", WF_F32, WF_SHAPE(HIDDEN), wf_init_zeros());
    wf_node *w2 =
        wf_variable(g, "l2.w", WF_F32, WF_SHAPE(HIDDEN, CLASSES), wf_init_glorot_uniform(2));
    wf_node *b2 = wf_variable(g, "l2.b", WF_F32, WF_SHAPE(CLASSES), wf_init_zeros());
    wf_node *h = wf_relu(g, wf_add(g, wf_matmul(g, x, w1), b1));
    return wf_add(g, wf_matmul(g, h, w2), b2);
}

/* The fraction of rows whose largest logit is their label (an f32 scalar node). */
static inline wf_node *accuracy(wf_graph *g, wf_node *logits, wf_node *labels)
{
    wf_node *hit = wf_eq(g, wf_argmax(g, logits, -1), wf_cast(g, labels, WF_I64));
    return wf_mean(g, wf_cast(g, hit, WF_F32));
}

#endif /* GUIDE_MODEL_H */
