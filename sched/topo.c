/* sched/topo.c: where workers live, from hwloc.
 * Owns: reading the topology (the machine's, or a synthetic one for tests), placing worker
 * i on core i mod cores (cores in hwloc's logical order, so NUMA nodes are contiguous) or,
 * for one of several local ranks, on the cores of that rank's own run (so that two ranks of
 * a job on one machine never pin their workers to the same core while others are free),
 * the NUMA distances, and each worker's victim order: same-node workers first, then nodes
 * by increasing distance, one tier per distance.
 * Distances come from hwloc's latency matrix when the machine provides one, else from the
 * tree (two NUMA nodes under the same package are nearer than under different packages).
 * Not here: the stealing itself (worker.c). */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

static int numa_of(hwloc_topology_t topo, hwloc_obj_t core, int nnuma)
{
    for (int k = 0; k < nnuma; k++) {
        hwloc_obj_t nd = hwloc_get_obj_by_type(topo, HWLOC_OBJ_NUMANODE, (unsigned)k);
        if (nd && hwloc_bitmap_intersects(nd->cpuset, core->cpuset))
            return k;
    }
    return 0;
}

static int tree_distance(hwloc_topology_t topo, int a, int b)
{
    if (a == b)
        return 0;
    hwloc_obj_t x = hwloc_get_obj_by_type(topo, HWLOC_OBJ_NUMANODE, (unsigned)a);
    hwloc_obj_t y = hwloc_get_obj_by_type(topo, HWLOC_OBJ_NUMANODE, (unsigned)b);
    hwloc_obj_t c = hwloc_get_common_ancestor_obj(topo, x, y);
    /* The shallower the common ancestor, the farther apart: 1 + levels below the root. */
    int maxd = hwloc_topology_get_depth(topo);
    return 1 + (maxd - (c ? c->depth : 0));
}

static int fill_distances(wf_runtime *rt)
{
    int n = rt->nnuma;
    rt->numa_dist = malloc((size_t)n * n * sizeof *rt->numa_dist);
    if (!rt->numa_dist)
        return WF_ENOMEM;
    for (int a = 0; a < n; a++)
        for (int b = 0; b < n; b++)
            rt->numa_dist[a * n + b] = tree_distance(rt->topo, a, b);
    unsigned nr = 1;
    struct hwloc_distances_s *d = NULL;
    if (n > 1 &&
        hwloc_distances_get_by_type(rt->topo, HWLOC_OBJ_NUMANODE, &nr, &d,
                                    HWLOC_DISTANCES_KIND_MEANS_LATENCY, 0) == 0 &&
        nr >= 1 && d && (int)d->nbobjs == n) {
        for (int a = 0; a < n; a++)
            for (int b = 0; b < n; b++)
                rt->numa_dist[(int)d->objs[a]->logical_index * n + (int)d->objs[b]->logical_index] =
                    (int)d->values[a * n + b];
    }
    if (d)
        hwloc_distances_release(rt->topo, d);
    return 0;
}

typedef struct vkey {
    int dist, rot, idx;
} vkey;

static int vcmp(const void *x, const void *y)
{
    const vkey *a = x, *b = y;
    if (a->dist != b->dist)
        return a->dist < b->dist ? -1 : 1;
    return a->rot - b->rot;
}

static int victims(wf_runtime *rt, wf__worker *w)
{
    int n = rt->nw - 1;
    w->victims = malloc((size_t)(n > 0 ? n : 1) * sizeof *w->victims);
    w->tier_end = malloc((size_t)(n > 0 ? n : 1) * sizeof *w->tier_end);
    vkey *k = malloc((size_t)(n > 0 ? n : 1) * sizeof *k);
    if (!w->victims || !w->tier_end || !k) {
        free(k);
        return WF_ENOMEM;
    }
    int m = 0;
    for (int i = 0; i < rt->nw; i++) {
        if (i == w->index)
            continue;
        k[m].dist = rt->numa_dist[w->numa * rt->nnuma + rt->w[i]->numa];
        k[m].rot = (i - w->index + rt->nw) % rt->nw;
        k[m].idx = i;
        m++;
    }
    qsort(k, (size_t)m, sizeof *k, vcmp);
    w->ntiers = 0;
    for (int i = 0; i < m; i++) {
        w->victims[i] = k[i].idx;
        if (i + 1 == m || k[i + 1].dist != k[i].dist)
            w->tier_end[w->ntiers++] = i + 1;
    }
    free(k);
    return 0;
}

/* The local rank's run of cores (wf_runtime_opts.local_rank/local_size): with L ranks on C
 * cores, rank l gets [l*C/L, (l+1)*C/L) when L <= C, else core l alone. */
static void local_run(wf_runtime *rt, const wf_runtime_opts *o, int ncores)
{
    int L = o->local_size > 1 ? o->local_size : 1, l = o->local_rank;
    if (L <= ncores) {
        rt->core_lo = (int)((int64_t)l * ncores / L);
        rt->core_n = (int)((int64_t)(l + 1) * ncores / L) - rt->core_lo;
    } else {
        rt->core_lo = l % ncores;
        rt->core_n = ncores; /* a worker more goes to the next core, as for one rank */
    }
}

/* Worker i's core, a logical index of 'unit'. */
static unsigned core_of(const wf_runtime *rt, int i, int ncores)
{
    return (unsigned)((rt->core_lo + i % rt->core_n) % ncores);
}

int wf__topo_build(wf_runtime *rt, const wf_runtime_opts *o, int *n_workers)
{
    if (hwloc_topology_init(&rt->topo) < 0)
        return wf__err(WF_ETOPO, "wf_runtime_create: hwloc_topology_init failed");
    if (o->topology && hwloc_topology_set_synthetic(rt->topo, o->topology) < 0)
        return wf__err(WF_ETOPO,
                       "wf_runtime_create: topology \"%s\" is not a valid hwloc synthetic "
                       "description (e.g. \"pack:2 numa:2 core:2 pu:1\")",
                       o->topology);
    if (hwloc_topology_load(rt->topo) < 0)
        return wf__err(WF_ETOPO, "wf_runtime_create: hwloc could not load the topology%s%s",
                       o->topology ? " " : "", o->topology ? o->topology : "");
    int ncores = hwloc_get_nbobjs_by_type(rt->topo, HWLOC_OBJ_CORE);
    hwloc_obj_type_t unit = HWLOC_OBJ_CORE;
    if (ncores <= 0) {
        unit = HWLOC_OBJ_PU;
        ncores = hwloc_get_nbobjs_by_type(rt->topo, HWLOC_OBJ_PU);
    }
    if (ncores <= 0)
        return wf__err(WF_ETOPO, "wf_runtime_create: the topology has no cores");
    rt->nnuma = hwloc_get_nbobjs_by_type(rt->topo, HWLOC_OBJ_NUMANODE);
    if (rt->nnuma <= 0)
        rt->nnuma = 1;
    local_run(rt, o, ncores);
    if (*n_workers == 0)
        *n_workers = o->local_size > ncores ? 1 : rt->core_n;
    int rc = fill_distances(rt);
    if (rc < 0)
        return wf__err(rc, "wf_runtime_create: no memory");
    rt->nw = *n_workers;
    rt->w = calloc((size_t)rt->nw, sizeof *rt->w);
    if (!rt->w)
        return wf__err(WF_ENOMEM, "wf_runtime_create: no memory for %d workers", rt->nw);
    for (int i = 0; i < rt->nw; i++) {
        wf__worker *w = aligned_alloc(WF_CACHELINE,
                                      (sizeof *w + WF_CACHELINE - 1) & ~(size_t)(WF_CACHELINE - 1));
        if (!w)
            return wf__err(WF_ENOMEM, "wf_runtime_create: no memory for worker %d", i);
        memset(w, 0, sizeof *w);
        rt->w[i] = w;
        hwloc_obj_t core = hwloc_get_obj_by_type(rt->topo, unit, core_of(rt, i, ncores));
        w->rt = rt;
        w->index = i;
        w->numa = numa_of(rt->topo, core, rt->nnuma);
        w->cpu = -1;
    }
    for (int i = 0; i < rt->nw; i++)
        if (victims(rt, rt->w[i]) < 0)
            return wf__err(WF_ENOMEM, "wf_runtime_create: no memory");
    return 0;
}

/* Called by the worker itself. Pinning that fails (a restricted cpuset, a synthetic
 * topology) leaves the worker unpinned: that is not an error. */
void wf__topo_pin(wf_runtime *rt, wf__worker *w)
{
    if (!rt->pin || !hwloc_topology_is_thissystem(rt->topo))
        return;
    int ncores = hwloc_get_nbobjs_by_type(rt->topo, HWLOC_OBJ_CORE);
    hwloc_obj_type_t unit = ncores > 0 ? HWLOC_OBJ_CORE : HWLOC_OBJ_PU;
    if (ncores <= 0)
        ncores = hwloc_get_nbobjs_by_type(rt->topo, HWLOC_OBJ_PU);
    hwloc_obj_t core = hwloc_get_obj_by_type(rt->topo, unit, core_of(rt, w->index, ncores));
    if (!core || !core->cpuset)
        return;
    hwloc_cpuset_t set = hwloc_bitmap_dup(core->cpuset);
    if (!set)
        return;
    hwloc_bitmap_singlify(set);
    if (hwloc_set_cpubind(rt->topo, set, HWLOC_CPUBIND_THREAD) == 0)
        w->cpu = hwloc_bitmap_first(set);
    hwloc_bitmap_free(set);
}
