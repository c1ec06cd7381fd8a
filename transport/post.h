/* transport/post.h: posted point-to-point transfers, completed through the transport's actor
 * (a module interface for runtime/: not installed, not internal.h).
 * Owns: wf__comm_post_send() / wf__comm_post_recv(), and the registration of the kernels of
 *   core's send and recv ops (wf__transport_register_kernels(), transport/p2p_ops.c; with them
 *   tp_reduce's, transport/tp_ops.c), and the
 *   post of one value in their wire form from a loop of the library (wf__p2p_post()).
 * How a posted transfer goes (docs/architecture.md, "Transport"): the post is queued for the
 *   comm's thread "weft-net", which hands it to UCX at once and drives the UCX worker's
 *   progress from its event fd; each finished transfer comes to the comm's actor
 *   ("weft-ucx", a scheduler actor) as a message, and its handler calls the transfer's
 *   callback. No worker waits on the network or drives it, and every transfer is a span on
 *   the trace (sched/trace.h, category
 *   "transfer") and a 'transfer' USDT probe.
 * Failure: once the comm fails (a peer died or was silent: WF_EPEER naming it; a transfer
 *   passed op_timeout_ms: WF_ETIMEDOUT naming the peer, key and size, and the comm fails on
 *   every rank), "weft-net" cancels every posted transfer and each callback gets that code,
 *   with the comm's message in wf_last_errmsg(). A callback runs only once UCX no longer
 *   touches the buffer (a rendezvous under way with a live peer first finishes).
 * Not here: the blocking and waited forms (ucx.c), the graph side (runtime/). */
#ifndef WF_TRANSPORT_POST_H
#define WF_TRANSPORT_POST_H

#include "../core/op.h"

#include <weft/transport.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Called once per posted transfer, on a worker (the comm's actor), with 0 or a negative
 * wf_status (message in wf_last_errmsg()). It must not block. */
typedef void (*wf__post_fn)(void *arg, int rc);

/* Keys of graph transfers: bit 39 set keeps them apart from user keys (wf_comm_isend) of
 * the same pair of ranks. */
#define WF__POST_KEY_GRAPH (1ull << 39)

/* Posts a send of 'bytes' at 'buf' to rank 'peer' under 'key' (below 2^40), or a receive of
 * exactly 'bytes' into 'buf'. 'done(arg, rc)' runs exactly once when 0 is returned, never
 * otherwise. A receive of a message of another size completes with WF_EFORMAT naming both
 * sizes and the peer.
 * Returns 0, WF_EINVAL (NULL comm, a comm made without a runtime, peer out of range, key too
 * large, NULL buf with bytes > 0), the comm's failure, or WF_ENOMEM.
 * Ownership: 'buf' is borrowed until 'done' runs. Threads: any. */
int wf__comm_post_send(wf_comm *c, int peer, uint64_t key, const void *buf, size_t bytes,
                       wf__post_fn done, void *arg);
int wf__comm_post_recv(wf_comm *c, int peer, uint64_t key, void *buf, size_t bytes,
                       wf__post_fn done, void *arg);

/* Posts one value in the wire form of core's send and recv nodes (transport/p2p_ops.c), as a
 * node with edge 'edge' (below 2^15) does in the run whose wf_kernel_ctx.xfer_step is 'step':
 * a send of 't' (contiguous; retained until done) or a receive into 't' (contiguous, of the
 * dtype and shape expected: another fails 'done' with WF_ESHAPE naming both ranks and
 * types). For a loop of the library that speaks to a peer's graph (runtime/strategy_ps.c's
 * asynchronous server). 'name' (borrowed until done) names it in the flight record.
 * Returns 0 ('done(arg, rc)' then runs exactly once, on the comm's actor), WF_EINVAL, the
 * comm's failure or WF_ENOMEM (then 'done' never runs). Threads: any. */
int wf__p2p_post(wf_comm *c, bool is_recv, int peer, int edge, uint64_t step, wf_tensor *t,
                 const char *name, wf__post_fn done, void *arg);

/* Registers into 'r' the CPU kernels of core's send and recv ops (core/op.h) for
 * communicator 'c', which the kernels use (it must outlive every plan of the registry's
 * session). Returns 0 or a negative wf_status. Ownership: 'c' is borrowed. */
int wf__transport_register_kernels(wf__kernels *r, wf_comm *c);

/* Registers into 'r' the CPU kernel of core's tp_reduce op (transport/tp_ops.c) for 'c';
 * wf__transport_register_kernels() calls it with send's and recv's. Returns 0 or a negative
 * wf_status. */
int wf__tp_register_kernels(wf__kernels *r, wf_comm *c);

#endif /* WF_TRANSPORT_POST_H */
