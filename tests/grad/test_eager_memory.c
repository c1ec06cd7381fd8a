/* tests/grad/test_eager_memory.c: the memory of eager training steps. An eager MLP step
 * (64-1024-1024-10, ReLU, softmax cross-entropy, Adam, batch 256: weft-train --eager
 * --hidden 1024,1024 --batch 256 on the digits' shape), a fresh WF_EAGER graph per step whose
 * variables carry over from the last, trains (the loss falls), and once warm it takes fewer
 * than 10 page faults per step (getrusage's minor faults over 20 steps): its megabyte values
 * come from the thread's cache of freed values, not from memory the system maps and faults in
 * again. Not a timing test. Under AddressSanitizer that cache is off (so leaks and use after
 * free stay visible) and the fault count is not asserted; the training still runs.
 * Public API only. */
#include "wf_test.h"

#include <weft/weft.h>

#include <criterion/criterion.h>

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>

#if defined(__SANITIZE_ADDRESS__)
#    define CACHE_OFF 1
#elif defined(__has_feature)
#    if __has_feature(address_sanitizer)
#        define CACHE_OFF 1
#    endif
#endif

enum { BATCH = 256, IN = 64, HID = 1024, OUT = 10, MAX_STATE = 32, WARMUP = 5, STEPS = 20 };

static wf_runtime *rt;

static void setup(void)
{
    rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 2, .flags = WF_RT_NO_PIN });
}

static void teardown(void)
{
    wf_runtime_destroy(rt);
    rt = NULL;
    wf_test_fini();
}

TestSuite(eager_memory, .init = setup, .fini = teardown, .timeout = WF_TEST_TIMEOUT(120));

/* The variables' values between steps (the model's, then Adam's state), by name. */
typedef struct state {
    int n;
    char names[MAX_STATE][64];
    wf_tensor *val[MAX_STATE];
} state;

static void state_free(state *s)
{
    for (int i = 0; i < s->n; i++)
        wf_tensor_release(s->val[i]);
    s->n = 0;
}

/* One eager step on x, y: a graph with the state's variables, forward, loss, Adam; the
 * variables' new values go back to 's'. Returns the loss before the update. */
static double step(state *s, wf_tensor *x, wf_tensor *y)
{
    static const struct {
        const char *name;
        int64_t rows, cols; /* cols 0: a bias of 'rows' */
    } params[] = { { "w1", HID, IN }, { "b1", HID, 0 },   { "w2", HID, HID },
                   { "b2", HID, 0 },  { "w3", OUT, HID }, { "b3", OUT, 0 } };

    wf_graph *g = wf_graph_create(rt, WF_EAGER);
    cr_assert_not_null(g, "%s", wf_last_errmsg());
    wf_node *v[6];
    for (int i = 0; i < 6; i++) {
        wf_shape sh =
            params[i].cols ? WF_SHAPE(params[i].rows, params[i].cols) : WF_SHAPE(params[i].rows);
        v[i] =
            wf_variable(g, params[i].name, WF_F32, sh,
                        params[i].cols ? wf_init_glorot_uniform(1 + (uint64_t)i) : wf_init_zeros());
    }
    for (int i = 0; i < s->n; i++) {
        wf_node *n = wf_graph_find(g, s->names[i]);
        if (!n)
            n = wf_variable(g, s->names[i], wf_tensor_dtype(s->val[i]), wf_tensor_shape(s->val[i]),
                            wf_init_zeros());
        cr_assert(n && wf_variable_set(n, s->val[i]) == 0, "%s", wf_graph_errmsg(g));
    }
    state_free(s); /* the graph holds them: Adam writes them in place */
    wf_node *h = wf_constant(g, x);
    for (int l = 0; l < 3; l++) {
        h = wf_add(g, wf_matmul_ex(g, h, v[2 * l], false, true), v[2 * l + 1]);
        if (l < 2)
            h = wf_relu(g, h);
    }
    wf_node *loss = wf_mean(g, wf_softmax_cross_entropy(g, h, wf_constant(g, y)));
    wf_node *train = wf_minimize(g, wf_adam(1e-3), loss);
    cr_assert(train && wf_graph_status(g) == 0, "eager step: %s", wf_graph_errmsg(g));
    double l = wf_tensor_get(wf_node_value(loss), 0);
    for (int i = 0; i < wf_graph_node_count(g); i++) {
        wf_node *n = wf_graph_node(g, i);
        if (strcmp(wf_node_op(n), "variable") != 0)
            continue;
        cr_assert_lt(s->n, MAX_STATE);
        snprintf(s->names[s->n], sizeof s->names[0], "%s", wf_node_name(n));
        s->val[s->n++] = wf_tensor_retain(wf_node_value(n));
    }
    wf_graph_destroy(g);
    return l;
}

static long minor_faults(void)
{
    struct rusage ru;
    cr_assert_eq(getrusage(RUSAGE_SELF, &ru), 0);
    return ru.ru_minflt;
}

Test(eager_memory, mlp_adam_steps_fault_less_than_10_pages_each)
{
    static float xb[BATCH * IN];
    static int32_t yb[BATCH];
    uint64_t r = 12345;
    for (int i = 0; i < BATCH * IN; i++) {
        r = r * 6364136223846793005u + 1442695040888963407u;
        xb[i] = (float)((r >> 40) & 0xffff) / 65536.0f - 0.5f;
    }
    for (int i = 0; i < BATCH; i++) /* a learnable label: the sign pattern of two features */
        yb[i] = (xb[i * IN] > 0) * 5 + (xb[i * IN + 1] > 0) * 2 + i % 2;
    wf_tensor *x = wf_tensor_from(WF_F32, WF_SHAPE(BATCH, IN), xb);
    wf_tensor *y = wf_tensor_from(WF_I32, WF_SHAPE(BATCH), yb);
    cr_assert(x && y, "%s", wf_last_errmsg());
    state s = { 0 };
    double first = step(&s, x, y), last = first;
    for (int i = 1; i < WARMUP; i++)
        last = step(&s, x, y);
    long before = minor_faults();
    for (int i = 0; i < STEPS; i++)
        last = step(&s, x, y);
    long faults = minor_faults() - before;
    cr_log_info("eager MLP step: %.2f minor page faults per step (%ld over %d steps)",
                (double)faults / STEPS, faults, STEPS);
    /* Adam at 1e-3 on one fixed batch: 25 steps take the loss well below its start (ln 10). */
    cr_assert_lt(last, 0.9 * first, "loss %g after %d steps, %g at the first", last, WARMUP + STEPS,
                 first);
#ifndef CACHE_OFF
    cr_assert_lt(faults, 10L * STEPS, "%ld minor page faults in %d warm eager steps", faults,
                 STEPS);
#endif
    state_free(&s);
    wf_tensor_release(x);
    wf_tensor_release(y);
}
