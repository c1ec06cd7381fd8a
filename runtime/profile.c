/* runtime/profile.c: the profile run that measures what ops cost, for the placement planner.
 * Owns: wf_profile_graph() (weft/runtime.h).
 * How: for each distinct signature (op, dtype, input and output shapes) among the graph's
 *   ops that the table does not have yet for the device's kind, a one-node graph with a
 *   placeholder per input (random values for floating inputs, zeros otherwise) runs in a
 *   session on the device: one untimed run (compiles the plan, warms caches), then 'reps'
 *   timed runs; the fastest goes into the table (placement/cost.c keys it, so every layer of
 *   a stack of equal layers is measured once). Why the fastest: the other ranks profile at
 *   the same time on shared cores, and on 2 cores a median of 21 runs still came out 3x off
 *   in about one run of 12 (a time only grows with interference, so the minimum is the
 *   op's own cost).
 * What a time includes: the session's per-run cost (feeding, the executor's start and end:
 *   microseconds), which the planner pays per node too when nodes are small.
 * Skipped (they keep the planner's flops/bytes prior): sources, updates (they write
 *   variables), send and recv (the network), inputs with -1 dimensions, and nodes whose op
 *   cannot be rebuilt on placeholders (an op whose inference needs constant inputs).
 * Not here: the table and the prior (placement/cost.c), using the times (placement/stages.c). */
#include "../core/error.h"
#include "../core/graph.h"
#include "internal.h"

#include <weft/placement.h>
#include <weft/runtime.h>

#include <stdlib.h>
#include <string.h>

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* A tensor of 'dt' and 's': uniform in [-1, 1) for f32/f64 (a fixed LCG), zeros otherwise. */
static wf_tensor *input_value(wf_dtype dt, wf_shape s, uint64_t *seed)
{
    int64_t n = wf_shape_numel(s);
    size_t bytes = (size_t)n * wf_dtype_size(dt);
    void *buf = calloc(1, bytes ? bytes : 1);
    if (!buf)
        return NULL;
    for (int64_t i = 0; i < n && (dt == WF_F32 || dt == WF_F64); i++) {
        *seed = *seed * 6364136223846793005ull + 1442695040888963407ull;
        double v = (double)(*seed >> 11) / 4503599627370496.0 - 1.0;
        if (dt == WF_F32)
            ((float *)buf)[i] = (float)v;
        else
            ((double *)buf)[i] = v;
    }
    wf_tensor *t = wf_tensor_from(dt, s, buf);
    free(buf);
    return t;
}

static bool profilable(const wf_node *n)
{
    if ((n->op->flags & (WF_OP_SOURCE | WF_OP_ASYNC)) || n->op->n_assign > 0 || n->n_inputs > 16)
        return false;
    for (int i = 0; i < n->n_inputs; i++)
        for (int d = 0; d < n->inputs[i]->shape.rank; d++)
            if (n->inputs[i]->shape.dims[d] < 0)
                return false;
    return true;
}

/* Times node 'n' alone on 'device'; returns 1 and '*best' (the fastest run), 0 when it cannot be
 * rebuilt or run there, or WF_ENOMEM. */
static int time_node(wf_runtime *rt, const wf_node *n, int device, int reps, double *t,
                     double *best)
{
    wf_graph *h = wf_graph_create(rt, WF_STATIC);
    if (!h)
        return wf__err(WF_ENOMEM, "profile: no memory");
    wf_node *in[16];
    wf_feed feeds[16] = { { 0 } };
    uint64_t seed = 0x9e3779b97f4a7c15ull ^ (uint64_t)n->id;
    int rc = 1, k = 0;
    for (; k < n->n_inputs; k++) {
        char name[16];
        snprintf(name, sizeof name, "in%d", k);
        in[k] = (wf_placeholder)(h, name, n->inputs[k]->dtype, n->inputs[k]->shape);
        feeds[k].node = in[k];
        feeds[k].value =
            in[k] ? input_value(n->inputs[k]->dtype, n->inputs[k]->shape, &seed) : NULL;
        if (!feeds[k].value) {
            rc = 0;
            k++;
            goto out;
        }
    }
    wf_node *x = wf__node_add_ex(h, n->op, NULL, in, n->n_inputs, n->attrs, (wf_srcloc){ 0 });
    wf_session *s = NULL;
    if (!x || wf_node_set_device(x, device) < 0 || wf_session_create(h, NULL, &s) < 0) {
        rc = 0;
        goto out;
    }
    for (int r = -1; r < reps && rc == 1; r++) {
        wf_tensor *out = NULL;
        double t0 = wf__rt_now_s();
        if (wf_session_run(s, feeds, n->n_inputs, &x, 1, &out, NULL, 0) < 0)
            rc = 0;
        double dt = wf__rt_now_s() - t0;
        wf_tensor_release(out);
        if (r >= 0)
            t[r] = dt;
    }
    wf_session_destroy(s);
    if (rc == 1) {
        qsort(t, (size_t)reps, sizeof *t, cmp_double);
        *best = t[0];
    }
out:
    for (int i = 0; i < k; i++)
        wf_tensor_release(feeds[i].value);
    wf_graph_destroy(h);
    return rc;
}

int wf_profile_graph(wf_runtime *rt, const wf_graph *g, int device, int reps, wf_cost_table *t)
{
    if (!rt || !g || !t)
        return wf__err(WF_EINVAL, "wf_profile_graph: NULL argument");
    if (device < 0 || reps < 1 || reps > 10000)
        return wf__err(WF_EINVAL,
                       "wf_profile_graph: device %d, reps %d: need device >= 0 and 1 "
                       ".. 10000 reps",
                       device, reps);
    int kind = device == 0 ? WF_PLACE_CPU : WF_PLACE_CUDA, measured = 0;
    double *times = malloc(sizeof *times * (size_t)reps);
    if (!times)
        return wf__err(WF_ENOMEM, "wf_profile_graph: no memory");
    for (int i = 0; i < wf_graph_node_count(g); i++) {
        const wf_node *n = wf_graph_node(g, i);
        double m;
        if (!profilable(n) || wf_cost_table_get(t, n, kind, NULL) == 1)
            continue;
        int rc = time_node(rt, n, device, reps, times, &m);
        if (rc < 0) {
            free(times);
            return rc;
        }
        if (rc == 1) {
            if ((rc = wf_cost_table_put(t, n, kind, m)) < 0) {
                free(times);
                return rc;
            }
            measured++;
        }
    }
    free(times);
    return measured;
}
