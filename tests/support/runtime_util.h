/* tests/support/runtime_util.h: helpers shared by the runtime and devices suites, on top of
 * wf_test.h: the suite fixture (the runtimes 'rt' and 'rt1', created in '.init' and destroyed
 * in '.fini' with the leak check), a session with given flags, a run and the plan statistics
 * that fail the test with the session's message, a bitwise comparison of two tensors, f32
 * tensors and constants from data, and (for test_internal_*.c files that include core/op.h
 * first) the shape inference "output like input 0" of the suites' test ops; and the parts
 * the suites' random graphs share (inputs, feeds, loss and gradients).
 * Not here: the random ops themselves (each suite mixes the ops its pass needs) and
 * references. */
#ifndef WF_TESTS_SUPPORT_RUNTIME_UTIL_H
#define WF_TESTS_SUPPORT_RUNTIME_UTIL_H

#include "wf_test.h"

#include <weft/weft.h>

#include <criterion/criterion.h>

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The suite's runtimes: 'rt' has 2 workers; 'rt1', 1 worker, exists only after
 * wf_test_rt_setup_both(). Both are NULL outside a test. */
static wf_runtime *rt, *rt1;

/* Suite '.init': 'rt' with 2 workers, not pinned to cores (WF_RT_NO_PIN). */
static inline void wf_test_rt_setup(void)
{
    rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 2, .flags = WF_RT_NO_PIN });
}

/* Suite '.init': 'rt' (2 workers) and 'rt1' (1 worker), both unpinned. */
static inline void wf_test_rt_setup_both(void)
{
    wf_test_rt_setup();
    rt1 = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 1, .flags = WF_RT_NO_PIN });
}

/* Suite '.init': 'rt' with 2 workers and the default pinning (the devices suites). */
static inline void wf_test_rt_setup_pinned(void)
{
    rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 2 });
}

/* Suite '.fini': destroys the runtimes that exist, then the leak check (wf_test_fini()). */
static inline void wf_test_rt_teardown(void)
{
    wf_runtime_destroy(rt);
    wf_runtime_destroy(rt1);
    rt = rt1 = NULL;
    wf_test_fini();
}

/* A session of 'g' with 'flags' (WF_SESSION_*), or fails the test with the graph's message. */
static inline wf_session *wf_test_session(wf_graph *g, uint32_t flags)
{
    wf_session *s = NULL;
    int rc = wf_session_create(g, &(wf_session_opts){ .flags = flags }, &s);
    cr_assert_eq(rc, 0, "wf_session_create: %s: %s", wf_err_name(rc), wf_graph_errmsg(g));
    return s;
}

/* wf_session_run(), or fails the test with the session's message. */
static inline void wf_test_run(wf_session *s, const wf_feed *feeds, int n_feeds,
                               wf_node *const *fetches, int n, wf_tensor **outs,
                               wf_node *const *targets, int n_targets)
{
    int rc = wf_session_run(s, feeds, n_feeds, fetches, n, outs, targets, n_targets);
    cr_assert_eq(rc, 0, "%s: %s", wf_err_name(rc), wf_session_errmsg(s));
}

/* The statistics of the plan of 's' for 'fetches' and 'targets' (planning it if needed), or
 * fails the test with the session's message. */
static inline wf_plan_stats wf_test_plan_stats_targets(wf_session *s, wf_node *const *fetches,
                                                       int n, wf_node *const *targets,
                                                       int n_targets)
{
    wf_plan_stats st;
    int rc = wf_session_plan_stats(s, fetches, n, targets, n_targets, &st);
    cr_assert_eq(rc, 0, "%s: %s", wf_err_name(rc), wf_session_errmsg(s));
    return st;
}

/* The same, without targets. */
static inline wf_plan_stats wf_test_plan_stats(wf_session *s, wf_node *const *fetches, int n)
{
    return wf_test_plan_stats_targets(s, fetches, n, NULL, 0);
}

/* Whether 'a' and 'b' (contiguous) have the same dtype, shape and bytes: the passes do not
 * reorder floating-point work, so bitwise equality is the check (runtime/compile/passes.h). */
static inline bool wf_test_same_bits(const wf_tensor *a, const wf_tensor *b)
{
    if (wf_tensor_dtype(a) != wf_tensor_dtype(b) ||
        !wf_shape_equal(wf_tensor_shape(a), wf_tensor_shape(b)))
        return false;
    size_t bytes = (size_t)wf_tensor_numel(a) * wf_dtype_size(wf_tensor_dtype(a));
    return memcmp(wf_tensor_data(a), wf_tensor_data(b), bytes) == 0;
}

/* A new f32 tensor of 'shape' holding a copy of 'data' (owned), or fails the test. */
static inline wf_tensor *wf_test_f32(wf_shape shape, const float *data)
{
    wf_tensor *t = wf_tensor_from(WF_F32, shape, data);
    cr_assert_not_null(t, "%s", wf_last_errmsg());
    return t;
}

/* A constant node of 'g' holding an f32 copy of 'data', or fails the test. */
static inline wf_node *wf_test_const_f32(wf_graph *g, wf_shape shape, const float *data)
{
    wf_tensor *t = wf_test_f32(shape, data);
    wf_node *n = wf_constant(g, t);
    wf_tensor_release(t);
    cr_assert_not_null(n, "%s", wf_graph_errmsg(g));
    return n;
}

/* ---- Random graphs ---------------------------------------------------------------------- */

/* A random graph of a suite: its placeholders with their feeds (owned), the variables, and
 * the nodes it fetches. Each suite draws the ops its pass needs; these helpers build the
 * parts they share. */
#define WF_TEST_RG_MAX_FETCH 8

typedef struct wf_test_rgraph {
    wf_graph *g;
    int n_ph; /* placeholders and feeds */
    wf_node *ph[3], *var[2];
    wf_tensor *feed[3];
    wf_node *fetch[WF_TEST_RG_MAX_FETCH];
} wf_test_rgraph;

/* A new f32 tensor of 'shape' (owned) with values k / 1000 - 1, k uniform in [0, 2000), drawn
 * from '*st' in order. */
static inline wf_tensor *wf_test_rand_f32(uint64_t *st, wf_shape shape)
{
    int64_t n = wf_shape_numel(shape);
    float *data = malloc((size_t)(n ? n : 1) * sizeof *data);
    cr_assert_not_null(data);
    for (int64_t k = 0; k < n; k++)
        data[k] = (float)((double)wf_test_rand_below(st, 2000) / 1000.0 - 1.0);
    wf_tensor *t = wf_tensor_from(WF_F32, shape, data);
    free(data);
    cr_assert_not_null(t, "%s", wf_last_errmsg());
    return t;
}

/* Adds to 'r->g', in this order, placeholder "p0", variable "v0" (uniform in [-1, 1) from
 * 'seed'), "p1" and "v1" ('seed' + 1), all f32 [d, d], appending each to 'pool' at '*n', and
 * the placeholders' feeds (wf_test_rand_f32() from '*st', after each variable). */
static inline void wf_test_rg_inputs(wf_test_rgraph *r, wf_node **pool, int *n, uint64_t seed,
                                     int d, uint64_t *st)
{
    r->n_ph = 2;
    for (int i = 0; i < 2; i++) {
        char name[16];
        snprintf(name, sizeof name, "p%d", i);
        pool[(*n)++] = r->ph[i] = wf_placeholder(r->g, name, WF_F32, WF_SHAPE(d, d));
        snprintf(name, sizeof name, "v%d", i);
        pool[(*n)++] = r->var[i] = wf_variable(r->g, name, WF_F32, WF_SHAPE(d, d),
                                               wf_init_uniform(seed + (uint64_t)i, -1, 1));
        r->feed[i] = wf_test_rand_f32(st, WF_SHAPE(d, d));
    }
}

/* Adds the loss sum(tanh(pool[n - 1])) + mean(pool[n - 2]) and its gradients with respect to
 * both variables ('grads'); returns the loss. Fails the test naming 'seed'. */
static inline wf_node *wf_test_rg_loss(wf_test_rgraph *r, wf_node *const *pool, int n,
                                       uint64_t seed, wf_node *grads[2])
{
    wf_graph *g = r->g;
    wf_node *loss = wf_add(g, wf_sum(g, wf_tanh(g, pool[n - 1])), wf_mean(g, pool[n - 2]));
    grads[0] = grads[1] = NULL;
    int rc = wf_gradients(g, loss, r->var, 2, grads);
    cr_assert_eq(rc, 0, "seed %llu: %s", (unsigned long long)seed, wf_graph_errmsg(g));
    return loss;
}

/* Releases the feeds of 'r' and destroys its graph. */
static inline void wf_test_rg_free(wf_test_rgraph *r)
{
    for (int i = 0; i < r->n_ph; i++)
        wf_tensor_release(r->feed[i]);
    wf_graph_destroy(r->g);
}

#ifdef WF_CORE_OP_H
/* The shape inference of the internal suites' test ops: the output has input 0's dtype and
 * shape. */
static inline int wf_test_infer_same(wf_node *n, char *err, size_t len)
{
    (void)err;
    (void)len;
    n->dtype = n->inputs[0]->dtype;
    n->shape = n->inputs[0]->shape;
    return 0;
}
#endif

#endif /* WF_TESTS_SUPPORT_RUNTIME_UTIL_H */
