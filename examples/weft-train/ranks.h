/* examples/weft-train/ranks.h: joining weft-run's ranks for a tool's --strategy (weft-train,
 * train_gpt): the rank from the environment before anything is opened, the communicator
 * once the runtime exists (each tool makes its own strategy over it), a pipeline's
 * weights gathered to rank 0, and --strategy mirrored's devices (one process).
 * Not here: what a tool does on ranks other than 0 (each goes quiet in its own way). */
#ifndef WT_RANKS_H
#define WT_RANKS_H

#include <weft/weft.h>

#include <stdbool.h>
#include <stddef.h>

/* This process's rank from weft-run's environment (WEFT_RANK, ... or Slurm's, Open MPI's;
 * 0 when none is set), or a negative WF_ error with the reason in wf_last_errmsg(). */
int wt_ranks_env_rank(void);

/* Joins the ranks of the environment on 'rt' into '*comm' (the caller's: wf_comm_destroy()).
 * On failure returns a negative WF_ error, '*comm' NULL, and the reason in 'err' (prefixed
 * "--strategy: "). */
int wt_ranks_comm(wf_runtime *rt, wf_comm **comm, char *err, size_t errlen);

/* The stage (rank) whose copy of the model parameter 'name' is current, for
 * wt_ranks_gather(); 'ctx' is the caller's. */
typedef int (*wt_stage_of_fn)(const char *name, void *ctx);

/* A pipeline, before rank 0 saves or samples: each variable of 'g' whose stage_of() (by its
 * name, or a parameter's name before '/' for its optimizer state) is another rank is current
 * only there; that rank broadcasts it over 'comm' and rank 0 assigns it in 's'. Every rank
 * calls this at the same point and walks the graph's variables in the same order.
 * Returns 0 or a negative WF_ error with the reason in 'err'. */
int wt_ranks_gather(wf_comm *comm, wf_session *s, const wf_graph *g, wt_stage_of_fn stage_of,
                    void *ctx, char *err, size_t errlen);

/* --strategy mirrored --devices N [--shards S] ('devices' 0: every GPU): the first N GPUs,
 * or N simulated devices where there are fewer, into '*out' (the caller's:
 * wf_strategy_destroy()). Unless 'quiet', prints "<prog>: mirrored over N <what>". Returns 0
 * or a negative WF_ error with the reason in 'err' (prefixed "--strategy mirrored: "). */
int wt_mirrored(wf_runtime *rt, int devices, int shards, const char *prog, bool quiet,
                wf_strategy **out, char *err, size_t errlen);

#endif /* WT_RANKS_H */
