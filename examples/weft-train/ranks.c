/* examples/weft-train/ranks.c: joining weft-run's ranks for --strategy multiworker
 * (ranks.h). Public API only. */
#include "ranks.h"

#include <stdio.h>

int wt_ranks_env_rank(void)
{
    wf_comm_opts co = { .rank = 0, .size = 1 };
    int rc = wf_dist_opts_from_env(&co);
    return rc < 0 ? rc : co.rank;
}

int wt_ranks_join(wf_runtime *rt, int shards, wf_comm **comm, wf_strategy **st, char *err,
                  size_t errlen)
{
    wf_comm_opts co = { .rank = 0, .size = 1 };
    int rc = wf_dist_opts_from_env(&co);
    *comm = NULL;
    *st = NULL;
    if (rc < 0) {
        snprintf(err, errlen, "--strategy: %s", wf_last_errmsg());
        return rc;
    }
    if ((rc = wf_comm_create(rt, &co, comm)) < 0) {
        snprintf(err, errlen, "--strategy: joining the ranks: %s", wf_last_errmsg());
        return rc;
    }
    if ((rc = wf_strategy_multiworker(*comm, &(wf_strategy_opts){ .shards = shards }, st)) < 0) {
        snprintf(err, errlen, "--strategy: %s", wf_last_errmsg());
        return rc;
    }
    return 0;
}
