/* examples/weft-train/ranks.h: joining weft-run's ranks for a tool's --strategy multiworker
 * (weft-train, train_gpt): the rank from the environment before anything is opened, and the
 * communicator and strategy once the runtime exists.
 * Not here: what a tool does on ranks other than 0 (each goes quiet in its own way). */
#ifndef WT_RANKS_H
#define WT_RANKS_H

#include <weft/weft.h>

#include <stddef.h>

/* This process's rank from weft-run's environment (WEFT_RANK, ... or Slurm's, Open MPI's;
 * 0 when none is set), or a negative WF_ error with the reason in wf_last_errmsg(). */
int wt_ranks_env_rank(void);

/* Joins the ranks of the environment on 'rt' and makes the multiworker strategy over them
 * with 'shards' shards (0: one per rank). On failure returns a negative WF_ error, writes
 * the reason into 'err' (prefixed "--strategy: ") and leaves what was made in '*comm' and
 * '*st' (NULL or owned by the caller: wf_strategy_destroy(), then wf_comm_destroy()). */
int wt_ranks_join(wf_runtime *rt, int shards, wf_comm **comm, wf_strategy **st, char *err,
                  size_t errlen);

#endif /* WT_RANKS_H */
