/* examples/weft-train/ranks.h: joining weft-run's ranks for a tool's --strategy (weft-train,
 * train_gpt): the rank from the environment before anything is opened, and the communicator
 * once the runtime exists (each tool makes its own strategy over it).
 * Not here: what a tool does on ranks other than 0 (each goes quiet in its own way). */
#ifndef WT_RANKS_H
#define WT_RANKS_H

#include <weft/weft.h>

#include <stddef.h>

/* This process's rank from weft-run's environment (WEFT_RANK, ... or Slurm's, Open MPI's;
 * 0 when none is set), or a negative WF_ error with the reason in wf_last_errmsg(). */
int wt_ranks_env_rank(void);

/* Joins the ranks of the environment on 'rt' into '*comm' (the caller's: wf_comm_destroy()).
 * On failure returns a negative WF_ error, '*comm' NULL, and the reason in 'err' (prefixed
 * "--strategy: "). */
int wt_ranks_comm(wf_runtime *rt, wf_comm **comm, char *err, size_t errlen);

#endif /* WT_RANKS_H */
