/* examples/weft-train/ranks.c: joining weft-run's ranks for --strategy
 * (ranks.h). Public API only. */
#include "ranks.h"

#include <stdio.h>

int wt_ranks_env_rank(void)
{
    wf_comm_opts co = { .rank = 0, .size = 1 };
    int rc = wf_dist_opts_from_env(&co);
    return rc < 0 ? rc : co.rank;
}

int wt_ranks_comm(wf_runtime *rt, wf_comm **comm, char *err, size_t errlen)
{
    wf_comm_opts co = { .rank = 0, .size = 1 };
    int rc = wf_dist_opts_from_env(&co);
    *comm = NULL;
    if (rc < 0) {
        snprintf(err, errlen, "--strategy: %s", wf_last_errmsg());
        return rc;
    }
    if ((rc = wf_comm_create(rt, &co, comm)) < 0) {
        snprintf(err, errlen, "--strategy: joining the ranks: %s", wf_last_errmsg());
        return rc;
    }
    return 0;
}
