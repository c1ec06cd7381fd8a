/* transport/coll_ops.h: the kernel of core's dp_reduce op (core/op.h), for runtime/ (a module
 * interface: not installed, not internal.h).
 * Owns: wf__transport_register_coll_kernels(), the fixed tree every data-parallel sum
 *   follows (wf__dp_tree_sum()), and the abort of a rank whose step failed (wf__dp_fail_comm).
 * Not here: the op's def (core/op_dist.c), the rewrite that inserts it (placement/). */
#ifndef WF_TRANSPORT_COLL_OPS_H
#define WF_TRANSPORT_COLL_OPS_H

#include "../core/op.h"

#include <weft/transport.h>

#include <stdbool.h>
#include <stddef.h>

/* Registers into 'r' the CPU kernel of dp_reduce for communicator 'c' (NULL: one process,
 * rank 0 of 1: no transfer). Returns 0 or a negative wf_status. 'c' is borrowed and must
 * outlive every plan of the registry's session. */
int wf__transport_register_coll_kernels(wf__kernels *r, wf_comm *c);

/* The fixed tree over S shards: [lo, hi) splits at lo + the largest power of two below
 * hi - lo, left subtree first, down to ranges of 'unit' shards, which are leaves: p[lo /
 * unit] (each 'len' floats) holds a leaf's value, and the sum ends in p[lo / unit]; the
 * other arrays are clobbered. A rank sums its own b shards with unit 1 (a subtree: its block
 * is one, wf__dp_blocks_ok()), the owner of a chunk sums the ranks' partials with unit b, so
 * the bits are those of the sum over every shard at once, whatever the number of ranks. */
void wf__dp_tree_sum(float **p, int lo, int hi, int unit, size_t len);

/* Whether every block of 'unit' shards (the shards of one rank) is a subtree of the tree over
 * 'shards' shards: true when unit is a power of two, or there is one block, or the tree's
 * splits all fall between blocks (6 shards over 3 ranks: yes; over 2 ranks: no). */
bool wf__dp_blocks_ok(int shards, int unit);

/* Fails communicator 'c' because this rank's step failed by itself (not through the comm:
 * out of memory, a bad feed, a kernel's error): 'code' and 'why' (which names the node and
 * the error) go to every rank, whose runs then fail at once with WF_EPEER instead of waiting
 * for their operation deadline for the reductions this rank will never join. Nothing when
 * 'c' is NULL, of one rank, or already failed (then this rank's error came from that). */
void wf__dp_fail_comm(wf_comm *c, int code, const char *why);

#endif /* WF_TRANSPORT_COLL_OPS_H */
