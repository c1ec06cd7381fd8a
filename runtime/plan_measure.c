/* runtime/plan_measure.c: what a pipeline's planner (placement auto) is given measured, at
 *   session creation.
 * Owns: wf__plan_measure (a pipeline strategy's cache of what it measured: its profiled op
 *   times and its links) and wf__plan_measure_run(), which fills the planner's options of
 *   one session from it.
 * Links: once per strategy every rank calls wf_comm_probe_links() (a ping-pong of two sizes
 *   per pair of ranks, transport/linkprobe.c) 12 times with one timed round trip each, and
 *   keeps each pair's fastest round trip per size; every rank gets the same matrices from it,
 *   so the same minima. Why the fastest and not the median of one probe: on a loaded machine
 *   a round trip waits for both processes to be scheduled, and the median of 9 round trips
 *   measured 0.4 to 470 us of latency and 0.06 to 12 GB/s on the same pair from run to run;
 *   the delays only add, so the fastest is the link's own cost. placement's fit
 *   (wf_cluster_link_from_pingpong()) turns each pair into a one-way latency and a
 *   bandwidth. A pair the fit refuses (the large message measured no slower than the small
 *   one: noise) keeps half the small round trip as latency and the default bandwidth.
 * Costs: when the user gave no table, each rank profiles the planner's own copy of the
 *   forward part (wf__pipeline_forward_graph(): one micro-batch's shapes, the same graph on
 *   every rank) with wf_profile_graph() into the strategy's cache (a signature measured for
 *   an earlier session is not measured again), then an all-gather gives every rank every
 *   rank's times per node of the copy, and the table the planner gets holds the fastest
 *   rank's (the same bits on every rank). Every rank profiles at once, as every stage
 *   computes at once in the pipeline. Why the fastest and not the mean: a rank that finishes
 *   first waits in the all-gather, and on 2 shared cores its waiting slowed the other rank's
 *   last ops: the mean once gave the first matmul 344 us against about 2 us for the other
 *   ops, and a 2:11 split (one run of 20); a delay only adds, so the fastest is the op's cost.
 * Why the same plan on every rank: the planner is a deterministic function of the graph, the
 *   options, the table and the links, and all four are equal on every rank.
 * Threads: a strategy's cache is guarded by its mutex (sessions made from several threads).
 * Not here: timing one op (profile.c), the ping-pong (transport/linkprobe.c), the split
 *   (placement/stages.c), the plan's text (placement/pipeline_plan.c). */
#include "../placement/pipeline.h"
#include "internal.h"

#include <weft/placement.h>
#include <weft/runtime.h>
#include <weft/transport.h>

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROBE_SMALL  64           /* bytes of the ping-pong's small message */
#define PROBE_LARGE  (256u << 10) /* and of its large one */
#define PROBE_ROUNDS 12           /* probes of one timed round trip each: the fastest is kept */
#define PROFILE_REPS 21           /* timed runs per signature: the fastest counts */
#define DEFAULT_BW   1e9          /* the cluster's default between ranks (weft/placement.h) */

struct wf__plan_measure {
    pthread_mutex_t mu;
    wf_cost_table *cache; /* this rank's profiled times, kept for later sessions */
    int size;             /* ranks of the links below; 0: not probed yet */
    double *lat, *bw;     /* size x size */
};

int wf__plan_measure_create(wf__plan_measure **out)
{
    wf__plan_measure *pm = calloc(1, sizeof *pm);
    if (!pm || wf_cost_table_create(&pm->cache) < 0) {
        free(pm);
        return wf__err(WF_ENOMEM, "wf_strategy_pipeline: no memory for the planner's cache");
    }
    pthread_mutex_init(&pm->mu, NULL);
    *out = pm;
    return 0;
}

void wf__plan_measure_free(wf__plan_measure *pm)
{
    if (!pm)
        return;
    pthread_mutex_destroy(&pm->mu);
    wf_cost_table_destroy(pm->cache);
    free(pm->lat);
    free(pm->bw);
    free(pm);
}

/* Probes the links once per strategy (see the header). */
static int probe_links(wf__plan_measure *pm, wf_comm *comm)
{
    int n = wf_comm_size(comm), rc;
    if (pm->size == n)
        return 0;
    size_t nn = (size_t)n * (size_t)n;
    double *rs = calloc(nn, sizeof *rs), *rl = calloc(nn, sizeof *rl);
    double *lat = calloc(nn, sizeof *lat), *bw = calloc(nn, sizeof *bw);
    if (!rs || !rl || !lat || !bw) {
        rc = wf__err(WF_ENOMEM, "no memory to probe the links of %d ranks", n);
        goto out;
    }
    for (int k = 0; k < PROBE_ROUNDS; k++) { /* the fastest round trip of each pair and size */
        if ((rc = wf_comm_probe_links(comm, PROBE_SMALL, PROBE_LARGE, 1, lat, bw)) < 0) {
            char why[WF_ERRMSG_MAX];
            snprintf(why, sizeof why, "%s", wf_last_errmsg());
            rc = wf__err(rc, "measuring the links for the pipeline's planner: %s", why);
            goto out;
        }
        for (size_t i = 0; i < nn; i++) {
            rs[i] = k == 0 || lat[i] < rs[i] ? lat[i] : rs[i];
            rl[i] = k == 0 || bw[i] < rl[i] ? bw[i] : rl[i];
        }
    }
    for (int a = 0; a < n; a++)
        for (int b = 0; b < n; b++) {
            size_t i = (size_t)a * (size_t)n + (size_t)b;
            if (a == b)
                continue;
            if (wf_cluster_link_from_pingpong(PROBE_SMALL, rs[i], PROBE_LARGE, rl[i], &lat[i],
                                              &bw[i]) < 0) {
                lat[i] = 0.5 * rs[i]; /* the fit refused the numbers: see the header */
                bw[i] = DEFAULT_BW;
            }
        }
    free(pm->lat);
    free(pm->bw);
    pm->lat = lat, pm->bw = bw, pm->size = n;
    lat = bw = NULL;
out:
    free(rs);
    free(rl);
    free(lat);
    free(bw);
    return rc;
}

/* Profiles the planner's copy of 'g' and fills '*table' with the fastest rank's time per node. */
static int profile(wf__plan_measure *pm, wf_comm *comm, const wf_graph *g,
                   const wf__pipeline_opts *po, wf_cost_table **table, int *measured)
{
    wf_graph *h = NULL;
    int rc = wf__pipeline_forward_graph(g, po, &h);
    if (rc < 0)
        return rc;
    int n = wf_graph_node_count(h), size = comm ? wf_comm_size(comm) : 1;
    double *mine = malloc(sizeof *mine * (size_t)(n ? n : 1));
    double *all = malloc(sizeof *all * (size_t)(n ? n : 1) * (size_t)size);
    if (!mine || !all) {
        rc = wf__err(WF_ENOMEM, "no memory to profile %d nodes", n);
        goto out;
    }
    if ((rc = wf_profile_graph(wf_graph_runtime(g), h, 0, PROFILE_REPS, pm->cache)) < 0)
        goto out;
    for (int id = 0; id < n; id++) /* NaN: not measured (a source, a skipped op) */
        if (wf_cost_table_get(pm->cache, wf_graph_node(h, id), WF_PLACE_CPU, &mine[id]) != 1)
            mine[id] = NAN;
    if (comm && size > 1 &&
        (rc = wf_comm_allgather(comm, mine, all, sizeof *mine * (size_t)n)) < 0) {
        char why[WF_ERRMSG_MAX];
        snprintf(why, sizeof why, "%s", wf_last_errmsg());
        rc = wf__err(rc, "exchanging the profiled op times: %s", why);
        goto out;
    }
    if (size == 1)
        memcpy(all, mine, sizeof *mine * (size_t)n);
    if ((rc = wf_cost_table_create(table)) < 0)
        goto out;
    *measured = 0;
    for (int id = 0; id < n && rc == 0; id++) {
        double best = INFINITY;
        bool ok = true;
        for (int r = 0; r < size; r++) {
            double t = all[(size_t)r * (size_t)n + (size_t)id];
            ok &= isfinite(t);
            best = t < best ? t : best;
        }
        if (ok && (rc = wf_cost_table_put(*table, wf_graph_node(h, id), WF_PLACE_CPU, best)) == 0)
            ++*measured;
    }
out:
    free(mine);
    free(all);
    wf_graph_destroy(h);
    return rc;
}

int wf__plan_measure_run(wf__plan_measure *pm, wf_comm *comm, const wf_graph *g,
                         wf__pipeline_opts *po, wf_cost_table **table, char *note, size_t size)
{
    *table = NULL;
    int rc = 0, measured = 0, ranks = comm ? wf_comm_size(comm) : 1;
    pthread_mutex_lock(&pm->mu);
    if (ranks > 1 && (rc = probe_links(pm, comm)) == 0) {
        po->link_latency_s = pm->lat;
        po->link_bytes_per_s = pm->bw;
    }
    if (rc == 0 && !po->costs && (rc = profile(pm, comm, g, po, table, &measured)) == 0)
        po->costs = *table;
    if (rc == 0) { /* the same text on every rank: no rank's own numbers (how long it took) */
        int len = snprintf(note, size, "costs: %s", *table ? "" : "the user's table");
        if (*table)
            len += snprintf(note + len, size - (size_t)len,
                            "%d of the forward's nodes profiled on every rank (the "
                            "fastest rank's; the rest the flops/bytes prior)",
                            measured);
        if (len < (int)size)
            snprintf(note + len, size - (size_t)len,
                     ranks > 1 ? "; links: the fastest of %d ping-pongs of %d and %u bytes per pair"
                               : "; links: none (one rank)",
                     PROBE_ROUNDS, PROBE_SMALL, PROBE_LARGE);
    }
    pthread_mutex_unlock(&pm->mu);
    if (rc < 0) {
        wf_cost_table_destroy(*table);
        *table = NULL;
        po->costs = NULL;
    }
    return rc;
}
