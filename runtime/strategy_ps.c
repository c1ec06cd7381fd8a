/* runtime/strategy_ps.c: the parameter-server strategy (wf_strategy_ps(), weft/distribute.h).
 * Owns: its options' checks, the role of a rank (wf_strategy_is_server()), and the call of the
 *   rewrite (placement/ps.h) for the session (runtime/strategy.c calls wf__ps_prepare()).
 * How a step runs: every rank's wf_session_run() is one step. A worker's run computes its
 *   shards' gradients, pushes them and pulls the updated variables before it returns; a
 *   server's run receives one step of every worker's gradients, applies its updates and sends
 *   the variables back, so a server needs no batch (feeds it gets are ignored) but makes the
 *   same runs, with the same fetches and targets, as the workers. The rest (the agreement of
 *   the ranks, the broadcast of the variables, failing the communicator when a run fails by
 *   itself) is MultiWorkerMirrored's (runtime/strategy.c).
 * Not here: the rewrite (placement/ps.c), the transfers (transport/). */
#include "../placement/ps.h"
#include "internal.h"

#include <weft/distribute.h>

#include <stdio.h>

int wf_strategy_ps(wf_comm *comm, const wf_ps_opts *opts, wf_strategy **out)
{
    if (!out)
        return wf__err(WF_EINVAL, "wf_strategy_ps: out is NULL");
    *out = NULL;
    if (!opts)
        return wf__err(WF_EINVAL, "wf_strategy_ps: opts is NULL (servers is required)");
    if (!comm)
        return wf__err(WF_EINVAL, "wf_strategy_ps: comm is NULL: parameter servers need at "
                                  "least one server and one worker rank");
    int size = wf_comm_size(comm), rank = wf_comm_rank(comm);
    if (size < 1 || rank < 0)
        return wf__err(WF_EINVAL, "wf_strategy_ps: the communicator is not valid");
    wf_ps_opts p = *opts;
    if (p.servers < 1 || p.servers >= size)
        return wf__err(WF_EINVAL,
                       "wf_strategy_ps: %d servers in a world of %d ranks: the servers are "
                       "ranks 0 .. K-1 and at least one rank must be a worker (1 <= K <= %d)",
                       p.servers, size, size - 1);
    if (p.staleness < 0)
        return wf__err(WF_EINVAL, "wf_strategy_ps: staleness %d is negative (0: synchronous)",
                       p.staleness);
    if (p.staleness > 0)
        return wf__err(WF_ENOSYS,
                       "wf_strategy_ps: staleness %d: only synchronous parameter servers "
                       "(staleness 0) are implemented",
                       p.staleness);
    int workers = size - p.servers, rc;
    char deflt[48];
    snprintf(deflt, sizeof deflt, "the %d workers", workers);
    if ((rc = wf__strategy_check("wf_strategy_ps",
                                 &(wf__strategy_replicas){ deflt, "workers", "worker" }, workers,
                                 &p.shards, p.aggregation)) < 0)
        return rc;
    wf_strategy_opts o = { .shards = p.shards, .aggregation = p.aggregation };
    return wf__strategy_new(comm, &o, p.servers, p.staleness, out);
}

int wf_strategy_is_server(const wf_strategy *st)
{
    if (!st)
        return wf__err(WF_EINVAL, "wf_strategy_is_server: strategy is NULL");
    return wf_strategy_rank(st) < wf__strategy_servers(st) ? 1 : 0;
}

int wf__ps_prepare(wf_graph *g, int rank, int size, const wf_strategy_opts *o, int servers,
                   int edge_base, wf__replica_map *map)
{
    wf__ps_opts po = { .rank = rank,
                       .size = size,
                       .servers = servers,
                       .shards = o->shards,
                       .aggregation = o->aggregation,
                       .edge_base = edge_base };
    return wf__ps_rewrite(g, &po, map);
}
