/* tests/transport/strategy_util.h: what the strategy tests (test_multiworker.c,
 * test_pipeline.c) share: the global batch of a step of their classifiers, and one training
 * step of a session on it.
 * A batch is a function of the step alone, so every rank and the reference runs in the test's
 * own process feed the same rows. */
#ifndef WF_TEST_STRATEGY_UTIL_H
#define WF_TEST_STRATEGY_UTIL_H

#include <weft/weft.h>

#include <math.h>
#include <stdint.h>

/* The global batch of step 's': 'rows' rows of 'in' features and their labels below
 * 'classes'. */
static inline void tu_batch_of(int s, int rows, int in, int classes, float *x, int32_t *y)
{
    for (int i = 0; i < rows; i++) {
        for (int j = 0; j < in; j++)
            x[i * in + j] = sinf(0.37f * (float)(i * in + j) + 1.3f * (float)s);
        y[i] = (i * 7 + s * 3) % classes;
    }
}

/* One run of 's' fed step 'step''s batch ('rows' rows into placeholders 'x', 'y'; 'bx', 'by'
 * the caller's buffers of that size): fetches 'loss' into '*loss_out' and targets 'train'
 * (NULL: a forward-only run). Returns wf_session_run()'s status. */
static inline int tu_step(wf_session *s, wf_node *x, wf_node *y, int in, int classes, int rows,
                          int step, wf_node *loss, wf_node *train, float *bx, int32_t *by,
                          float *loss_out)
{
    tu_batch_of(step, rows, in, classes, bx, by);
    wf_tensor *xt = wf_tensor_from(WF_F32, WF_SHAPE(rows, in), bx);
    wf_tensor *yt = wf_tensor_from(WF_I32, WF_SHAPE(rows), by);
    wf_feed f[] = { { x, xt }, { y, yt } };
    wf_tensor *out = NULL;
    int rc = wf_session_run(s, f, 2, &loss, 1, &out, &train, train ? 1 : 0);
    wf_tensor_release(xt);
    wf_tensor_release(yt);
    if (rc == 0)
        *loss_out = wf_tensor_data_f32(out)[0];
    wf_tensor_release(out);
    return rc;
}

#endif /* WF_TEST_STRATEGY_UTIL_H */
