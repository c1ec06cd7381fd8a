/* runtime/strategy.c: distribution strategies (weft/distribute.h) and what a session given
 * one does beyond a plain one.
 * Owns: the strategy objects (MultiWorkerMirrored over a communicator; Mirrored over devices
 *   of one process: the same rewrite with one rank, each shard's copies placed on its
 *   device, and the session's simulated devices when it asks for them; pipeline stages over
 *   a communicator); at session creation the agreement of every rank (a hash of the graph
 *   and the options, exchanged with an all-gather, so ranks that differ fail naming each
 *   other instead of hanging or summing wrong values), the rewrite (placement/replicate.h,
 *   or placement/pipeline.h), the registration of dp_reduce's kernel (transport/coll_ops.h),
 *   the broadcast of every variable from rank 0 and the check of their hash; at each run the
 *   mapping of the user's fetches and targets to the rewritten graph's nodes; the rows of a
 *   global batch this rank's shards read (wf_strategy_local_rows(), for loaders).
 * Not here: the rewrite itself (placement/), the reduction's kernel (transport/). */
#include "../placement/pipeline.h"
#include "../placement/replicate.h"
#include "../transport/coll_ops.h"
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_BUCKET       (25u << 20)
#define DEFAULT_FIRST_BUCKET (1u << 20)
#define EDGE_BASE            16384 /* dp_reduce's key edges: 16384 .. 32767 */

#define MAX_LOCAL_SHARDS 64 /* dp_reduce's local sum (transport/coll_ops.c) */

struct wf_strategy {
    wf_comm *comm;
    int rank, size;
    wf_strategy_opts o;     /* o.devices NULL: the list is 'dev' */
    int servers, staleness; /* parameter servers (runtime/strategy_ps.c); 0: none */
    bool pipeline;          /* wf_strategy_pipeline(): 'p' (o.shards: m, o.aggregation: p's) */
    wf_pipeline_opts p;
    wf__plan_measure *measure; /* a pipeline with placement auto: what its planner measured */
    /* Mirrored: */
    wf_runtime *rt;
    int n_dev;                 /* D (0: MultiWorkerMirrored) */
    int n_sim;                 /* simulated devices the session opens (0: GPUs) */
    int dev[MAX_LOCAL_SHARDS]; /* D placement ids (runtime/compile/pass_place.c: the CPU 0, the GPUs
                                  1 .., then the simulated ones) */
};

struct wf__dp {
    const wf_strategy *st;
    wf__replica_map map;
    char *plan_text;       /* a pipeline's plan with placement auto, or NULL */
    struct wf__ps_run *ps; /* asynchronous parameter servers (runtime/strategy_ps.c) */
};

int wf__strategy_check(const char *fn, const wf__strategy_replicas *r, int n, int *shards,
                       int aggregation)
{
    if (*shards < 0 || *shards > (1 << 20))
        return wf__err(WF_EINVAL, "%s: shards is %d (0: %s)", fn, *shards, r->deflt);
    if (!*shards)
        *shards = n;
    if (*shards % n || !wf__dp_blocks_ok(*shards, *shards / n))
        return wf__err(WF_EINVAL,
                       "%s: %d shards over %d %s: the shards must be a multiple of the %s, each "
                       "%s's shards a subtree of the fixed sum tree (a power of two per %s, or "
                       "one %s, always is)",
                       fn, *shards, n, r->many, r->many, r->one, r->one, r->one);
    if (*shards / n > 64)
        return wf__err(WF_EINVAL, "%s: %d shards per %s (at most 64)", fn, *shards / n, r->one);
    if (aggregation < WF_AGG_MEAN || aggregation > WF_AGG_SHARD_MEAN)
        return wf__err(WF_EINVAL, "%s: unknown aggregation %d", fn, aggregation);
    return 0;
}

int wf_strategy_multiworker(wf_comm *comm, const wf_strategy_opts *opts, wf_strategy **out)
{
    if (!out)
        return wf__err(WF_EINVAL, "wf_strategy_multiworker: out is NULL");
    *out = NULL;
    wf_strategy_opts o = opts ? *opts : (wf_strategy_opts){ 0 };
    int size = comm ? wf_comm_size(comm) : 1, rank = comm ? wf_comm_rank(comm) : 0, rc;
    if (size < 1 || rank < 0)
        return wf__err(WF_EINVAL, "wf_strategy_multiworker: the communicator is not valid");
    if ((rc = wf__strategy_check("wf_strategy_multiworker",
                                 &(wf__strategy_replicas){ "the world size", "ranks", "rank" },
                                 size, &o.shards, o.aggregation)) < 0)
        return rc;
    if (o.n_devices || o.devices || o.simulated_devices)
        return wf__err(WF_EINVAL,
                       "wf_strategy_multiworker: n_devices %d, devices %s, simulated_devices %d: "
                       "the device options are Mirrored's (wf_strategy_mirrored()); "
                       "MultiWorkerMirrored runs one replica per rank",
                       o.n_devices, o.devices ? "set" : "NULL", o.simulated_devices);
    if (!o.bucket_bytes)
        o.bucket_bytes = DEFAULT_BUCKET;
    if (!o.first_bucket_bytes)
        o.first_bucket_bytes = DEFAULT_FIRST_BUCKET;
    wf_strategy *st = calloc(1, sizeof *st);
    if (!st)
        return wf__err(WF_ENOMEM, "wf_strategy_multiworker: no memory");
    *st = (wf_strategy){ .comm = comm, .rank = rank, .size = size, .o = o };
    *out = st;
    return 0;
}

int wf_strategy_pipeline(wf_comm *comm, const wf_pipeline_opts *opts, wf_strategy **out)
{
    if (!out)
        return wf__err(WF_EINVAL, "wf_strategy_pipeline: out is NULL");
    *out = NULL;
    wf_pipeline_opts p = opts ? *opts : (wf_pipeline_opts){ 0 };
    int size = comm ? wf_comm_size(comm) : 1, rank = comm ? wf_comm_rank(comm) : 0;
    if (size < 1 || rank < 0)
        return wf__err(WF_EINVAL, "wf_strategy_pipeline: the communicator is not valid");
    if (!p.stages)
        p.stages = size;
    if (p.stages != size)
        return wf__err(WF_EINVAL,
                       "wf_strategy_pipeline: stages is %d, but the communicator has %d rank%s "
                       "(one stage per rank)",
                       p.stages, size, size == 1 ? "" : "s");
    if (!p.micro_batches)
        p.micro_batches = 1;
    if (p.micro_batches < 1 || p.micro_batches > 64)
        return wf__err(WF_EINVAL, "wf_strategy_pipeline: micro_batches is %d, not in 1 .. 64",
                       p.micro_batches);
    if (p.schedule != WF_SCHEDULE_GPIPE && p.schedule != WF_SCHEDULE_1F1B)
        return wf__err(WF_EINVAL,
                       "wf_strategy_pipeline: schedule is %d (WF_SCHEDULE_GPIPE or "
                       "WF_SCHEDULE_1F1B)",
                       p.schedule);
    if (p.batch_rows < p.micro_batches)
        return wf__err(WF_EINVAL,
                       "wf_strategy_pipeline: batch_rows is %lld, fewer than the %d "
                       "micro-batches (the rows every run is fed)",
                       p.batch_rows, p.micro_batches);
    if (p.aggregation < WF_AGG_MEAN || p.aggregation > WF_AGG_SHARD_MEAN)
        return wf__err(WF_EINVAL, "wf_strategy_pipeline: unknown aggregation %d", p.aggregation);
    if (p.placement != WF_PIPELINE_PLACE_HINTS && p.placement != WF_PIPELINE_PLACE_AUTO)
        return wf__err(WF_EINVAL,
                       "wf_strategy_pipeline: placement is %d (WF_PIPELINE_PLACE_HINTS or "
                       "WF_PIPELINE_PLACE_AUTO)",
                       p.placement);
    if (!(p.mem_bytes >= 0) || p.mem_bytes > 1e18 ||
        (p.placement != WF_PIPELINE_PLACE_AUTO && (p.mem_bytes || p.costs)))
        return wf__err(WF_EINVAL,
                       "wf_strategy_pipeline: mem_bytes %g, costs %s: a memory cap (>= 0) and "
                       "costs are the planner's (placement WF_PIPELINE_PLACE_AUTO)",
                       p.mem_bytes, p.costs ? "set" : "NULL");
    wf_strategy *st = calloc(1, sizeof *st);
    if (!st)
        return wf__err(WF_ENOMEM, "wf_strategy_pipeline: no memory");
    *st = (wf_strategy){ .comm = comm,
                         .rank = rank,
                         .size = size,
                         .o = { .shards = p.micro_batches,
                                .aggregation = p.aggregation,
                                .bucket_bytes = DEFAULT_BUCKET,
                                .first_bucket_bytes = DEFAULT_FIRST_BUCKET },
                         .pipeline = true,
                         .p = p };
    if (p.placement == WF_PIPELINE_PLACE_AUTO && wf__plan_measure_create(&st->measure) < 0) {
        free(st);
        return WF_ENOMEM;
    }
    *out = st;
    return 0;
}

int wf_strategy_mirrored(wf_runtime *rt, const wf_strategy_opts *opts, wf_strategy **out)
{
    if (!out)
        return wf__err(WF_EINVAL, "wf_strategy_mirrored: out is NULL");
    *out = NULL;
    if (!rt)
        return wf__err(WF_EINVAL, "wf_strategy_mirrored: rt is NULL");
    wf_strategy_opts o = opts ? *opts : (wf_strategy_opts){ 0 };
    int n_real = wf_device_count(rt) < 1 ? 1 : wf_device_count(rt);
    int n_gpu = n_real - 1;
    if (o.simulated_devices < 0 || o.simulated_devices > MAX_LOCAL_SHARDS)
        return wf__err(WF_EINVAL, "wf_strategy_mirrored: simulated_devices is %d (0 .. %d)",
                       o.simulated_devices, MAX_LOCAL_SHARDS);
    int avail = o.simulated_devices ? o.simulated_devices : n_gpu;
    const char *what = o.simulated_devices ? "simulated device" : "GPU";
    if (o.n_devices < 0 || (o.devices && o.n_devices < 1))
        return wf__err(WF_EINVAL, "wf_strategy_mirrored: n_devices is %d%s", o.n_devices,
                       o.devices ? " with a device list (at least 1)" : " (0: every device)");
    int d = o.n_devices ? o.n_devices : avail;
    if (d < 1) /* only without simulated devices: 'avail' is their count otherwise */
        return wf__err(WF_EINVAL,
                       "wf_strategy_mirrored: zero devices: this runtime has no CUDA GPU (none "
                       "found, or weft is built without CUDA) and no simulated device is asked "
                       "for; set simulated_devices to run the replicas on simulated ones");
    if (d > MAX_LOCAL_SHARDS)
        return wf__err(WF_EINVAL, "wf_strategy_mirrored: %d devices (at most %d)", d,
                       MAX_LOCAL_SHARDS);
    wf_strategy *st = calloc(1, sizeof *st);
    if (!st)
        return wf__err(WF_ENOMEM, "wf_strategy_mirrored: no memory");
    for (int i = 0; i < d; i++) {
        int id = o.devices ? o.devices[i] : (o.simulated_devices ? i : i + 1);
        int lo = o.simulated_devices ? 0 : 1, hi = o.simulated_devices ? avail - 1 : n_gpu;
        if (id < lo || id > hi) {
            free(st);
            if (o.simulated_devices)
                return wf__err(WF_EINVAL,
                               "wf_strategy_mirrored: device %d (entry %d) does not exist: the "
                               "%d simulated devices are 0 .. %d",
                               id, i, avail, avail - 1);
            if (!n_gpu)
                return wf__err(WF_EINVAL,
                               "wf_strategy_mirrored: device %d (entry %d) does not exist: this "
                               "runtime has no GPU (no CUDA device found, or weft is built "
                               "without CUDA); set simulated_devices to run the replicas on "
                               "simulated ones",
                               id, i);
            return wf__err(WF_EINVAL,
                           "wf_strategy_mirrored: device %d (entry %d) does not exist: this "
                           "runtime's GPUs are devices 1 .. %d (device 0 is the CPU, which a "
                           "replica does not take)",
                           id, i, n_gpu);
        }
        st->dev[i] = o.simulated_devices ? n_real + id : id;
        for (int j = 0; j < i; j++)
            if (st->dev[j] == st->dev[i]) {
                free(st);
                return wf__err(WF_EINVAL,
                               "wf_strategy_mirrored: %s %d is given twice (entries %d and %d)",
                               what, id, j, i);
            }
    }
    if (o.shards < 0 || (o.shards && (o.shards < d || o.shards > MAX_LOCAL_SHARDS))) {
        free(st);
        return wf__err(WF_EINVAL,
                       "wf_strategy_mirrored: shards is %d: %d .. %d over %d devices (0: one "
                       "per device)",
                       o.shards, d, MAX_LOCAL_SHARDS, d);
    }
    if (o.aggregation < WF_AGG_MEAN || o.aggregation > WF_AGG_SHARD_MEAN) {
        free(st);
        return wf__err(WF_EINVAL, "wf_strategy_mirrored: unknown aggregation %d", o.aggregation);
    }
    if (!o.shards)
        o.shards = d;
    if (!o.bucket_bytes)
        o.bucket_bytes = DEFAULT_BUCKET;
    if (!o.first_bucket_bytes)
        o.first_bucket_bytes = DEFAULT_FIRST_BUCKET;
    o.n_devices = d;
    o.devices = NULL;
    st->rank = 0;
    st->size = 1;
    st->o = o;
    st->rt = rt;
    st->n_dev = d;
    st->n_sim = o.simulated_devices;
    *out = st;
    return 0;
}

int wf__strategy_new(wf_comm *comm, const wf_strategy_opts *o, int servers, int staleness,
                     wf_strategy **out)
{
    wf_strategy *st = calloc(1, sizeof *st);
    if (!st)
        return wf__err(WF_ENOMEM, "no memory for a strategy");
    *st = (wf_strategy){ .comm = comm,
                         .rank = wf_comm_rank(comm),
                         .size = wf_comm_size(comm),
                         .o = *o,
                         .servers = servers,
                         .staleness = staleness };
    *out = st;
    return 0;
}

int wf_strategy_device_count(const wf_strategy *st)
{
    return st ? st->n_dev : wf__err(WF_EINVAL, "wf_strategy_device_count: strategy is NULL");
}

int wf_strategy_local_rows(const wf_strategy *st, long long rows, long long *lo, long long *hi)
{
    if (!st || !lo || !hi || rows < 0)
        return wf__err(WF_EINVAL, "wf_strategy_local_rows: %s", rows < 0 ? "rows < 0" : "NULL");
    *lo = 0;
    *hi = rows;
    if (st->n_dev || st->pipeline)
        return 0;
    int n = st->size, r = st->rank;
    if (st->servers) {
        if (r < st->servers) {
            *hi = 0;
            return 0;
        }
        n -= st->servers;
        r -= st->servers;
    }
    int64_t per = st->o.shards / n, a, b, c, d;
    wf__shard_rows_range(rows, (int64_t)r * per, st->o.shards, &a, &b);
    wf__shard_rows_range(rows, (int64_t)(r + 1) * per - 1, st->o.shards, &c, &d);
    *lo = a;
    *hi = d;
    return 0;
}

int wf__strategy_servers(const wf_strategy *st)
{
    return st->servers;
}

int wf_strategy_rank(const wf_strategy *st)
{
    return st ? st->rank : wf__err(WF_EINVAL, "wf_strategy_rank: strategy is NULL");
}

int wf_strategy_size(const wf_strategy *st)
{
    return st ? st->size : wf__err(WF_EINVAL, "wf_strategy_size: strategy is NULL");
}

void wf_strategy_destroy(wf_strategy *st)
{
    if (st)
        wf__plan_measure_free(st->measure);
    free(st);
}

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* What the ranks compare: the graph (ops, names, types, edges) and the options. */
typedef struct agreement {
    uint64_t graph;
    int64_t nodes;
    int64_t shards, aggregation, bucket_bytes, first_bucket_bytes;
    int64_t servers, staleness;
    int64_t pipeline, schedule, batch_rows; /* a pipeline's */
    int64_t placement;
    double mem_bytes;
} agreement;

static uint64_t graph_hash(const wf_graph *g)
{
    uint64_t h = 0xcbf29ce484222325ull;
    int n = wf_graph_node_count(g);
    for (int id = 0; id < n; id++) {
        const wf_node *v = wf_graph_node(g, id);
        h = fnv(h, v->op->name, strlen(v->op->name) + 1);
        h = fnv(h, v->name, strlen(v->name) + 1);
        int32_t t[3] = { (int32_t)v->dtype, v->n_inputs, v->n_control };
        h = fnv(h, t, sizeof t);
        h = fnv(h, &v->shape.rank, sizeof v->shape.rank);
        h = fnv(h, v->shape.dims, sizeof v->shape.dims[0] * (size_t)v->shape.rank);
        for (int k = 0; k < v->n_inputs; k++)
            h = fnv(h, &v->inputs[k]->id, sizeof(int));
        for (int k = 0; k < v->n_control; k++)
            h = fnv(h, &v->control[k]->id, sizeof(int));
    }
    return h;
}

static int agree(wf_graph *g, const wf_strategy *st)
{
    agreement me = { .graph = graph_hash(g),
                     .nodes = wf_graph_node_count(g),
                     .shards = st->o.shards,
                     .aggregation = st->o.aggregation,
                     .bucket_bytes = (int64_t)st->o.bucket_bytes,
                     .first_bucket_bytes = (int64_t)st->o.first_bucket_bytes,
                     .servers = st->servers,
                     .staleness = st->staleness,
                     .pipeline = st->pipeline,
                     .schedule = st->p.schedule,
                     .batch_rows = st->p.batch_rows,
                     .placement = st->p.placement,
                     .mem_bytes = st->p.mem_bytes };
    agreement *all = calloc((size_t)st->size, sizeof *all);
    if (!all)
        return wf__graph_fail(g, WF_ENOMEM, "wf_session_create: no memory");
    int rc = wf_comm_allgather(st->comm, &me, all, sizeof me);
    if (rc < 0) {
        char why[WF_ERRMSG_MAX];
        snprintf(why, sizeof why, "%s", wf_last_errmsg());
        free(all);
        return wf__graph_fail(g, rc, "wf_session_create: exchanging the graph's hash: %s", why);
    }
    char msg[WF_ERRMSG_MAX] = "";
    size_t len = 0;
    const agreement *a = &all[0];
    for (int r = 1; r < st->size && len < sizeof msg - 200; r++) {
        const agreement *b = &all[r];
        if (b->graph != a->graph || b->nodes != a->nodes)
            len += (size_t)snprintf(msg + len, sizeof msg - len,
                                    "%srank %d's graph differs from rank 0's (%lld nodes, hash "
                                    "%016llx; rank 0: %lld nodes, hash %016llx)",
                                    len ? "; " : "", r, (long long)b->nodes,
                                    (unsigned long long)b->graph, (long long)a->nodes,
                                    (unsigned long long)a->graph);
        else if (memcmp(a, b, sizeof *a))
            len += (size_t)snprintf(
                msg + len, sizeof msg - len,
                "%srank %d's strategy options differ from rank 0's (shards %lld, "
                "aggregation %lld, buckets %lld/%lld bytes, servers %lld, staleness %lld, "
                "pipeline %lld, schedule %lld, batch rows %lld, placement %lld, memory cap %g; "
                "rank 0: %lld, %lld, %lld/%lld, %lld, %lld, %lld, %lld, %lld, %lld, %g)",
                len ? "; " : "", r, (long long)b->shards, (long long)b->aggregation,
                (long long)b->first_bucket_bytes, (long long)b->bucket_bytes, (long long)b->servers,
                (long long)b->staleness, (long long)b->pipeline, (long long)b->schedule,
                (long long)b->batch_rows, (long long)b->placement, b->mem_bytes,
                (long long)a->shards, (long long)a->aggregation, (long long)a->first_bucket_bytes,
                (long long)a->bucket_bytes, (long long)a->servers, (long long)a->staleness,
                (long long)a->pipeline, (long long)a->schedule, (long long)a->batch_rows,
                (long long)a->placement, a->mem_bytes);
    }
    free(all);
    if (len)
        return wf__graph_fail(g, WF_EINVAL, "wf_session_create: the ranks disagree: %s", msg);
    return 0;
}

int wf__dp_prepare(wf_graph *g, const wf_strategy *st, wf_comm **comm, int *device,
                   struct wf__dp **out)
{
    *out = NULL;
    int rc;
    int shard_dev[MAX_LOCAL_SHARDS];
    if (st->n_dev) { /* Mirrored */
        if (st->rt != wf_graph_runtime(g))
            return wf__graph_fail(g, WF_EINVAL,
                                  "wf_session_create: the Mirrored strategy was made for "
                                  "another runtime than the graph's");
        if (*comm)
            return wf__graph_fail(g, WF_EINVAL,
                                  "wf_session_create: opts.comm is set, but a Mirrored "
                                  "strategy runs in this process alone");
        if (*device == 0)
            *device = -1; /* what no replica takes: the host */
        for (int k = 0; k < st->o.shards; k++)
            shard_dev[k] = st->dev[(int)((int64_t)k * st->n_dev / st->o.shards)];
    }
    if (*comm && *comm != st->comm)
        return wf__graph_fail(g, WF_EINVAL,
                              "wf_session_create: opts.comm is not the "
                              "strategy's communicator");
    if (st->comm)
        *comm = st->comm;
    if (st->comm && st->size > 1 && (rc = agree(g, st)) < 0)
        return rc;
    struct wf__dp *dp = calloc(1, sizeof *dp);
    if (!dp)
        return wf__graph_fail(g, WF_ENOMEM, "wf_session_create: no memory");
    dp->st = st;
    wf__replicate_opts ro = { .rank = st->rank,
                              .size = st->size,
                              .shards = st->o.shards,
                              .aggregation = st->o.aggregation,
                              .bucket_bytes = st->o.bucket_bytes,
                              .first_bucket_bytes = st->o.first_bucket_bytes,
                              .edge_base = EDGE_BASE,
                              .shard_device = st->n_dev ? shard_dev : NULL,
                              .n_real = wf_device_count(st->rt) < 1 ? 1 : wf_device_count(st->rt) };
    wf__pipeline_opts po = { .stage = st->rank,
                             .stages = st->p.stages,
                             .micro_batches = st->p.micro_batches,
                             .schedule = st->p.schedule,
                             .batch_rows = st->p.batch_rows,
                             .hints = st->p.hints,
                             .aggregation = st->o.aggregation,
                             .bucket_bytes = st->o.bucket_bytes,
                             .first_bucket_bytes = st->o.first_bucket_bytes,
                             .edge_base = EDGE_BASE,
                             .planner = st->p.placement == WF_PIPELINE_PLACE_AUTO,
                             .mem_bytes = st->p.mem_bytes,
                             .costs = st->p.costs,
                             .plan_text = &dp->plan_text };
    wf_cost_table *profiled = NULL; /* the measured costs of placement auto (plan_measure.c) */
    char note[512];
    if (st->measure) {
        if ((rc = wf__plan_measure_run(st->measure, st->size > 1 ? st->comm : NULL, g, &po,
                                       &profiled, note, sizeof note)) < 0) {
            char why[WF_ERRMSG_MAX];
            snprintf(why, sizeof why, "%s", wf_last_errmsg());
            free(dp);
            return wf__graph_fail(g, rc, "wf_session_create: %s", why);
        }
        po.plan_note = note;
    }
    if (st->servers)
        rc = wf__ps_prepare(g, st->comm, &st->o, st->servers, st->staleness, EDGE_BASE, &dp->map,
                            &dp->ps);
    else if (st->pipeline)
        rc = wf__pipeline(g, &po, &dp->map);
    else
        rc = wf__replicate(g, &ro, &dp->map);
    wf_cost_table_destroy(profiled);
    if (rc < 0) {
        char why[WF_ERRMSG_MAX];
        snprintf(why, sizeof why, "%s", wf_last_errmsg());
        free(dp->plan_text);
        free(dp);
        return wf__graph_fail(g, rc, "wf_session_create: %s", why);
    }
    *out = dp;
    return 0;
}

int wf__dp_sim_devices(const struct wf__dp *dp)
{
    return dp ? dp->st->n_sim : 0;
}

bool wf__dp_is_pipeline(const struct wf__dp *dp)
{
    return dp && dp->st->pipeline;
}

wf_comm *wf__dp_comm(const struct wf__dp *dp)
{
    return dp && dp->st->size > 1 ? dp->st->comm : NULL;
}

int wf__dp_start(wf_session *s)
{
    /* A pipeline's reductions are over its own micro-batches (no peer), and each stage
     * initialises its own variables. Parameter servers: dp_reduce sums a worker's own shards
     * only (runtime/strategy_ps.c). */
    wf_comm *c = s->dp->st->pipeline ? NULL : wf__dp_comm(s->dp);
    int rc = wf__transport_register_coll_kernels(s->kernels, s->dp->st->servers ? NULL : c);
    if (rc == 0)
        rc = wf__ps_start(s, s->dp->ps);
    if (rc < 0 || !c)
        return rc;
    /* One broadcast of every variable packed together: a collective per variable would
     * cost a round trip each (and each one polls a core while it waits). */
    size_t total = 0;
    for (int k = 0; k < s->n_vars; k++)
        total += (size_t)s->var_vals[k]->numel * wf_dtype_size(s->var_vals[k]->dtype);
    char *buf = malloc(total ? total : 1);
    if (!buf)
        return wf__err(WF_ENOMEM, "no memory to broadcast %zu bytes of variables", total);
    size_t off = 0;
    for (int k = 0; k < s->n_vars; k++) {
        wf_tensor *v = s->var_vals[k];
        size_t bytes = (size_t)v->numel * wf_dtype_size(v->dtype);
        memcpy(buf + off, v->data, bytes);
        off += bytes;
    }
    if ((rc = wf_comm_broadcast(c, buf, total, 0)) < 0) {
        free(buf);
        return wf__err(rc, "broadcasting the variables from rank 0: %s", wf_last_errmsg());
    }
    off = 0;
    for (int k = 0; k < s->n_vars; k++) {
        wf_tensor *v = s->var_vals[k];
        size_t bytes = (size_t)v->numel * wf_dtype_size(v->dtype);
        memcpy(v->data, buf + off, bytes);
        off += bytes;
    }
    uint64_t h = fnv(0xcbf29ce484222325ull, buf, total);
    free(buf);
    int size = wf_comm_size(c);
    uint64_t *all = calloc((size_t)size, sizeof *all);
    if (!all)
        return wf__err(WF_ENOMEM, "no memory");
    if ((rc = wf_comm_allgather(c, &h, all, sizeof h)) < 0) {
        free(all);
        return wf__err(rc, "exchanging the variables' hash: %s", wf_last_errmsg());
    }
    for (int r = 1; r < size && rc == 0; r++)
        if (all[r] != all[0])
            rc = wf__err(WF_EINVAL,
                         "rank %d's variables differ from rank 0's after the broadcast (hash "
                         "%016llx, rank 0: %016llx)",
                         r, (unsigned long long)all[r], (unsigned long long)all[0]);
    free(all);
    return rc;
}

int wf__dp_map(wf_session *s, wf_node *const *in, int n, wf_node **out, const char *what)
{
    const wf__replica_map *m = &s->dp->map;
    for (int i = 0; i < n; i++) {
        wf_node *v = in[i];
        out[i] = v;
        if (!v || v->graph != s->g || v->id >= m->n)
            continue; /* checked (and refused, if need be) as in any session */
        if (!(out[i] = m->remap[v->id])) {
            char desc[WF_ERRMSG_MAX];
            if (s->dp->st->pipeline)
                return wf__session_fail(
                    s, WF_EINVAL,
                    "wf_session_run: %s %d, %s, is not computed on this rank's stage %d (a "
                    "pipeline rank fetches values of its own stage, scalars computed from the "
                    "batch as global values)",
                    what, i, wf__rt_node_desc(v, desc, sizeof desc), s->dp->st->rank);
            return wf__session_fail(
                s, WF_EINVAL,
                "wf_session_run: %s %d, %s, is a per-replica value: under a strategy a run "
                "fetches scalars computed from the batch (global values), gradients, "
                "variables and updates",
                what, i, wf__rt_node_desc(v, desc, sizeof desc));
        }
    }
    return 0;
}

/* Appends the ordering a -> b (plan indices) to 'p', when a comes before b in the plan's
 * order. One that goes back is dropped: the parts' nodes are made in the schedule's order,
 * so such an ordering only arises when a compile pass merged nodes of two parts (the
 * gradient of a mean folds to one constant for every micro-batch, and CSE keeps the first
 * micro-batch's), and its target then already runs in an earlier part. The orderings only
 * shape the schedule (what is computed does not depend on them), and the memory planner
 * walks the plan's order as a topological order of every edge (a backward ordering crashed
 * it: a pipeline whose last stage holds only the loss's mean). */
static int push_order(wf__plan *p, int *cap, int32_t a, int32_t b)
{
    if (a >= b)
        return 0;
    if (p->n_order == *cap) {
        int c = *cap ? 2 * *cap : 64;
        int32_t *o = realloc(p->order, sizeof *o * 2 * (size_t)c);
        if (!o)
            return wf__err(WF_ENOMEM, "wf_session_run: no memory for %d orderings", c);
        p->order = o;
        *cap = c;
    }
    p->order[2 * p->n_order] = a;
    p->order[2 * p->n_order++ + 1] = b;
    return 0;
}

int wf__dp_plan_order(wf_session *s, wf__plan *p)
{
    const wf__replica_map *m = &s->dp->map;
    wf__ps_plan_local(s->dp->ps, p); /* an asynchronous worker's local run: no shift of keys */
    if (!m->n_order)
        return 0;
    /* A part's sink that this plan does not run (a loss nobody fetches) stands for its
     * nearest ancestors that it does run: the part still waits for all of its work. */
    int32_t *stamp = calloc((size_t)s->n_nodes + 1, sizeof *stamp);
    int32_t *stack = malloc(((size_t)s->n_nodes + 1) * sizeof *stack);
    int cap = p->n_order, rc = 0;
    if (!stamp || !stack) {
        free(stamp);
        free(stack);
        return wf__err(WF_ENOMEM, "wf_session_run: no memory for the pipeline's orderings");
    }
    for (int k = 0; k < m->n_order && rc == 0; k++) {
        int32_t b = p->index_of[m->order[2 * k + 1]];
        const wf_node *before = wf_graph_node(s->g, m->order[2 * k]);
        if (b < 0)
            continue;
        int top = 0;
        stack[top++] = before->id;
        stamp[before->id] = k + 1;
        while (top > 0 && rc == 0) {
            const wf_node *v = wf_graph_node(s->g, stack[--top]);
            int32_t a = v->id < s->n_nodes ? p->index_of[v->id] : -1;
            if (a >= 0) {
                rc = push_order(p, &cap, a, b);
                continue;
            }
            for (int j = 0; j < v->n_inputs; j++) {
                const wf_node *x = v->inputs[j];
                if (stamp[x->id] != k + 1) {
                    stamp[x->id] = k + 1;
                    stack[top++] = x->id;
                }
            }
        }
    }
    free(stamp);
    free(stack);
    return rc;
}

int wf__dp_max_extra(const struct wf__dp *dp)
{
    return dp->map.n_sends;
}

int wf__dp_extra_targets(wf_session *s, wf_node *const *req, int n_req, wf_node **out)
{
    if (!s->dp->map.n_sends)
        return 0;
    int rc = wf__pipeline_sends(s->g, &s->dp->map, req, n_req, out);
    return rc < 0 ? wf__session_fail(s, rc, "wf_session_run: %s", wf_last_errmsg()) : rc;
}

void wf__dp_free(struct wf__dp *dp)
{
    if (!dp)
        return;
    wf__replica_map_free(&dp->map);
    wf__ps_free(dp->ps);
    free(dp->plan_text);
    free(dp);
}

const char *wf_session_pipeline_plan(const wf_session *s)
{
    return s && s->dp ? s->dp->plan_text : NULL;
}

int wf_session_pipeline_stage(const wf_session *s, const wf_node *n)
{
    if (!s || !n || !s->dp || !s->dp->st->pipeline || n->graph != s->g || n->id >= s->dp->map.n)
        return wf__err(WF_EINVAL, "wf_session_pipeline_stage: NULL, a node of another graph, or "
                                  "a session without a pipeline strategy");
    const wf__replica_map *m = &s->dp->map;
    if (m->stage[n->id] != WF__STAGE_SHARED)
        return m->stage[n->id] == WF__STAGE_ALL ? -2 : m->stage[n->id];
    /* Computed where it is read: the lowest stage of a reader, where a reader that is itself
     * computed where it is read (the sum of a weight that a later layer scales and adds)
     * counts with its own lowest reader's stage. Readers come after their inputs, so one
     * pass from the last node back to 'n' settles every such node before its inputs. */
    int base = n->id, count = m->n - n->id;
    int *low = malloc(sizeof *low * (size_t)count);
    if (!low)
        return wf__err(WF_ENOMEM, "wf_session_pipeline_stage: no memory for %d nodes", count);
    for (int k = 0; k < count; k++)
        low[k] = -1;
    for (int id = m->n - 1; id > base; id--) {
        const wf_node *v = wf_graph_node(s->g, id);
        int sv = m->stage[id] == WF__STAGE_SHARED ? low[id - base] : m->stage[id];
        for (int j = 0; j < v->n_inputs && sv >= 0; j++) {
            int x = v->inputs[j]->id;
            if (x >= base && m->stage[x] == WF__STAGE_SHARED &&
                (low[x - base] < 0 || sv < low[x - base]))
                low[x - base] = sv;
        }
    }
    int lowest = low[0];
    free(low);
    return lowest;
}

struct wf__ps_run *wf__dp_ps(const struct wf__dp *dp)
{
    return dp ? dp->ps : NULL;
}
