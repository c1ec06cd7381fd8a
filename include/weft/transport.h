/* weft/transport.h: processes that work together: a communicator over a libuv rendezvous
 * and UCX, point-to-point messages by key, collectives on host memory, and failure
 * detection.
 * Owns: the public contract of transport/. A communicator ('wf_comm') is a group of 'size'
 * processes (ranks) that found each other through rank 0's rendezvous server; its control
 * connections stay open as the health channel, so a dead or silent rank becomes an error
 * (WF_EPEER, naming the rank and its host) on every other rank instead of a hang.
 * Gradient buckets (wf_comm_bucket) pack small tensors into one all-reduce that runs in the
 * background.
 * Not here: send/recv nodes of graphs and distribution strategies (runtime/), the
 * launcher's own code (tools/weft-run.c). */
#ifndef WEFT_TRANSPORT_H
#define WEFT_TRANSPORT_H

#include <weft/base.h>
#include <weft/core.h>
#include <weft/sched.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct wf_comm wf_comm;         /* opaque: one rank's view of a communicator */
typedef struct wf_comm_req wf_comm_req; /* opaque: a nonblocking send or receive */

#define WF_COMM_MAX_RANKS 4096 /* more is refused with WF_EINVAL */
#define WF_COMM_KEY_BITS  40   /* a message key is below 2^40 */

/* A point-to-point key from a step and an edge (or tensor id): the step is kept modulo 2^24,
 * the edge must be below 2^16. Source, destination and the sender's incarnation are added
 * by the transport, so the same key may be used by every pair of ranks. */
#define WF_COMM_KEY(step, edge) ((((uint64_t)(step)&0xffffffu) << 16) | ((uint64_t)(edge)&0xffffu))

typedef struct wf_comm_opts {
    int rank;                      /* this process's rank, 0 .. size - 1 */
    int size;                      /* number of ranks, 1 .. WF_COMM_MAX_RANKS */
    const char *addr;              /* "host:port" of rank 0's rendezvous server (IPv4 or a
                                      name); NULL: "127.0.0.1:29400". Rank 0 binds exactly
                                      this address: loopback unless the caller names another. */
    const char *token;             /* shared secret every rank must present; NULL: "" */
    uint32_t incarnation;          /* this process's restart count, put in every message key
                                      so that messages of an earlier life never match; 0: one
                                      made from the pid and the clock */
    const char *net_devices;       /* UCX network devices (UCX_NET_DEVICES); NULL: the
                                      interface that carries 'addr' ("lo" on loopback) */
    const char *tls;               /* UCX transports (UCX_TLS, e.g. "tcp" or "sm,self");
                                      NULL: UCX's choice */
    uint32_t connect_timeout_ms;   /* 0: 30000. How long creation waits for every rank. */
    uint32_t op_timeout_ms;        /* 0: 300000. Deadline of every wait (send, receive,
                                      collective, barrier); past it the comm fails with
                                      WF_ETIMEDOUT on every rank. */
    uint32_t heartbeat_ms;         /* 0: 1000. Interval of heartbeats on the control plane. */
    uint32_t heartbeat_timeout_ms; /* 0: 10000. Silence after which a rank is declared dead. */
    uint32_t spin_us;              /* 0: 50. How long a wait polls the network before it
                                      sleeps; UINT32_MAX: busy-poll (lowest latency, one core). */
    size_t small_bytes;            /* 0: 65536. All-reduces up to this size use recursive
                                      doubling (latency); larger ones a pipelined ring. */
    size_t chunk_bytes;            /* 0: 262144 when every rank is on one host (the ring
                                      copies from its neighbour's memory), else 4 MiB.
                                      Pipeline chunk of the ring algorithms. */
    uint32_t hello_timeout_ms;     /* 0: 5000. Rank 0: how long a connection to the
                                      rendezvous has to present a valid HELLO before it is
                                      closed; at most 64 such connections are open at once
                                      (more are closed as soon as they are accepted), so
                                      strangers cannot pin rank 0's files. */
    int launcher_fd;               /* > 0: the read end of a pipe (or a socket) whose other
                                      end only the launcher holds (weft-run passes it as
                                      WEFT_LAUNCHER_FD): its end of file, the launcher's
                                      death, fails the comm with WF_EPEER on every rank,
                                      also in a rank that is not the launcher's child; 0:
                                      none */
    const char *flight_dir;        /* a directory where, when the comm fails (WF_EPEER,
                                      WF_ETIMEDOUT, a rank's abort), this rank writes its
                                      flight record, flight.rank<R>.jsonl (see
                                      wf_comm_flight_dump); NULL: only on demand */
    int flight_off;                /* non-zero: no flight recorder (to measure its cost) */
} wf_comm_opts;

/* Fills 'opts' (rank, size, addr, token, incarnation) from the environment, for tools,
 * examples and tests; the library itself reads no environment. Looked at, first match
 * wins: WEFT_RANK/WEFT_SIZE (set by weft-run), OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE
 * (Open MPI), SLURM_PROCID/SLURM_NTASKS (Slurm), PMI_RANK/PMI_SIZE. Independently:
 * WEFT_ADDR (addr), WEFT_TOKEN (token), WEFT_INCARNATION, WEFT_NET_DEVICES, WEFT_TLS,
 * WEFT_LAUNCHER_FD (launcher_fd), WEFT_FLIGHT_DIR (flight_dir).
 * Returns 1 when a rank and size were found, 0 when none were (opts keeps its rank and
 * size), or WF_EINVAL with a message for a malformed value (opts is then unchanged).
 * Ownership: the strings put in 'opts' are borrowed from the environment.
 * Threads: any (as getenv). */
WF_API WF_NODISCARD int wf_dist_opts_from_env(wf_comm_opts *opts);

/* Joins the communicator: rank 0 listens on 'addr', every other rank connects to it (and
 * retries until connect_timeout_ms), presents the token, registers its UCX worker address
 * and gets everyone's; then all ranks pass a barrier. A collective call: every rank of
 * the communicator makes it. A stranger with a wrong token or a malformed frame is refused
 * and does not disturb the others.
 * Returns 0, WF_EINVAL (bad option; the message names it), WF_ETIMEDOUT (some rank did not
 * arrive: the message lists the missing ranks), WF_EPEER (a rank refused us or died during
 * the rendezvous), WF_EIO (the address could not be bound or resolved), WF_EDEVICE (UCX
 * failed) or WF_ENOMEM; the reason is in wf_last_errmsg().
 * Ownership: on success the caller owns '*out' (wf_comm_destroy()); on failure '*out' is
 * NULL. 'rt' (may be NULL) is borrowed and must outlive the comm; 'opts' is not kept.
 * Threads: any; it starts one thread, "weft-net", that runs the control plane and sleeps
 * in epoll while nothing happens (the network is polled only while someone waits). */
WF_API WF_NODISCARD int wf_comm_create(wf_runtime *rt, const wf_comm_opts *opts, wf_comm **out);

/* Leaves the communicator: an orderly shutdown (every rank says goodbye through rank 0,
 * waiting at most op_timeout_ms, or 1 s once the comm has failed), then frees it. Every
 * nonblocking request must have been waited for. NULL is a no-op.
 * Threads: one call, when no other call on 'c' runs. */
WF_API void wf_comm_destroy(wf_comm *c);

/* Returns this process's rank, or WF_EINVAL for NULL. */
WF_API int wf_comm_rank(const wf_comm *c);

/* Returns the number of ranks, or WF_EINVAL for NULL. */
WF_API int wf_comm_size(const wf_comm *c);

/* Returns 0 while the communicator is healthy, or the error that failed it (WF_EPEER: a
 * rank died, was silent past heartbeat_timeout_ms or aborted; WF_ETIMEDOUT: a wait passed
 * its deadline) with the message in wf_last_errmsg() ("rank 2 (host n1, pid 812) died:
 * control connection closed"). Once failed, every pending and later operation fails with
 * the same code and message. Threads: any. */
WF_API int wf_comm_status(const wf_comm *c);

/* ---- Flight recorder ------------------------------------------------------------------
 * Every comm remembers its last 1,024 collectives and public point-to-point operations
 * (wf_comm_isend/irecv and their blocking forms): sequence number, op, key, bytes, dtype
 * and count, peer (or root), state (posted, waiting, done, failed), start and end times and
 * the caller's tag. When the comm fails, each rank that sees it writes the record to
 * opts.flight_dir (weft-run sets one per job and merges the files into one verdict line). */

/* Sets the tag recorded with every operation this comm starts from now on (copied; at most
 * 47 bytes are kept), e.g. "bucket 3, step 17"; NULL or "" clears it.
 * Returns 0, or WF_EINVAL for a NULL comm. Threads: any (the tag is the comm's, not the
 * thread's: set it where one thread issues the collectives). */
WF_API WF_NODISCARD int wf_comm_set_tag(wf_comm *c, const char *tag);

/* Sets the hash of the graph (or program) that issues the following collectives; it travels
 * with each collective, and two ranks whose non-zero hashes differ fail as a mismatched
 * call (WF_EPEER). 0: none (not compared). Returns 0 or WF_EINVAL. Threads: any. */
WF_API WF_NODISCARD int wf_comm_set_graph_hash(wf_comm *c, uint64_t hash);

/* Writes the flight record now, to 'path' (NULL: <flight_dir>/flight.rank<R>.jsonl): one
 * JSON object per line, first a header {"flight":1, "rank", "size", "host", "pid",
 * "incarnation", "failed" (the error's name, or null), "reason", "now_ns", "ops"}, then
 * one line per operation, oldest first: {"seq", "op", "key", "bytes", "count", "dtype",
 * "peer", "state", "t_start_ns", "t_end_ns", "rc", "tag"} (times in ns on
 * CLOCK_MONOTONIC_COARSE: a few ms of resolution). "op" is a wf_comm call ("allreduce",
 * "reduce_scatter", "allgather", "broadcast", "barrier", "send", "recv") or a transfer of a
 * session's graph on this comm: "dp_reduce" (a data-parallel strategy's reduction; "seq"
 * run << 15 | edge, plus one, equal on every rank; "tag" "<node>, run <run>"), or "send" and
 * "recv" of wf_send/wf_recv nodes (tagged the same way).
 * Returns 0, WF_EINVAL (NULL comm, no path and no flight_dir, the recorder is off) or
 * WF_EIO (the file could not be written: the message says why).
 * Threads: any, also while operations run. */
WF_API WF_NODISCARD int wf_comm_flight_dump(wf_comm *c, const char *path);

/* ---- Point to point ------------------------------------------------------------------- */

/* Starts sending 'bytes' bytes at 'buf' to rank 'peer' under 'key' (below 2^40; see
 * WF_COMM_KEY). Messages between one pair of ranks with the same key arrive in order.
 * Small messages are sent eagerly; large ones by rendezvous (zero copy).
 * Returns 0, WF_EINVAL (peer out of range, key too large, NULL buf with bytes > 0),
 * WF_EPEER/WF_ETIMEDOUT (the comm has failed), WF_EDEVICE or WF_ENOMEM.
 * Ownership: '*out' is owned: pass it to wf_comm_wait() exactly once. 'buf' is borrowed
 * until then and must not change. Threads: any; requests may be waited from any thread. */
WF_API WF_NODISCARD int wf_comm_isend(wf_comm *c, int peer, uint64_t key, const void *buf,
                                      size_t bytes, wf_comm_req **out);

/* Starts receiving a message of exactly 'bytes' bytes from rank 'peer' under 'key' into
 * 'buf'. Receives may be posted before the matching send (pre-posted).
 * Returns as wf_comm_isend(). A message of another size fails the wait with WF_EFORMAT.
 * Ownership: as wf_comm_isend(); 'buf' is written until the wait returns (after a failure,
 * until wf_comm_destroy() returns). */
WF_API WF_NODISCARD int wf_comm_irecv(wf_comm *c, int peer, uint64_t key, void *buf, size_t bytes,
                                      wf_comm_req **out);

/* Waits for a request and frees it. A wait polls the network for spin_us, then sleeps
 * until the completion, a failure of the comm, or op_timeout_ms.
 * Returns 0, WF_EPEER (a rank failed: the message names it), WF_ETIMEDOUT (the deadline
 * passed: the message names the peer, key and size; the comm then fails on every rank),
 * WF_EFORMAT (a received message had another size) or WF_EDEVICE. NULL: WF_EINVAL.
 * Ownership: steals 'r'. Threads: any, one waiter per request. */
WF_API WF_NODISCARD int wf_comm_wait(wf_comm_req *r);

/* Returns 1 when the request has completed (wf_comm_wait() then returns at once), 0 while
 * it is pending, or WF_EINVAL. Polls the network once. Ownership: 'r' stays the caller's. */
WF_API WF_NODISCARD int wf_comm_test(wf_comm_req *r);

/* Blocking forms: isend/irecv followed by wait. */
WF_API WF_NODISCARD int wf_comm_send(wf_comm *c, int peer, uint64_t key, const void *buf,
                                     size_t bytes);
WF_API WF_NODISCARD int wf_comm_recv(wf_comm *c, int peer, uint64_t key, void *buf, size_t bytes);

/* Measures the round trip of every pair of ranks with a ping-pong of 'small' and of
 * 'large' bytes ('reps' timed round trips each after one warm-up; the median kept), for the
 * planner's links (weft/placement.h: wf_cluster_link_from_pingpong()). Every rank calls it
 * at the same point (best right after wf_comm_create(), while nothing else is sent: it uses
 * the keys WF_COMM_KEY(2^24 - 1, 0xff00) and 0xff01), and every rank gets the whole matrix:
 * 'rtt_small[a * size + b]' and 'rtt_large[...]' in seconds (symmetric; 0 on the diagonal).
 * Returns 0, WF_EINVAL (NULL, small >= large, large > 1 GiB, reps not in 1 .. 10000),
 * WF_ENOMEM, or the errors of wf_comm_send()/wf_comm_recv()/wf_comm_allgather().
 * Ownership: the arrays are the caller's, size * size doubles each. Threads: one call at a
 * time per comm, with no other traffic under those keys. */
WF_API WF_NODISCARD int wf_comm_probe_links(wf_comm *c, size_t small, size_t large, int reps,
                                            double *rtt_small, double *rtt_large);

/* ---- Collectives ------------------------------------------------------------------------
 * Every rank calls the same collectives in the same order, with the same sizes, dtype, op
 * and root; one collective at a time per comm (from any thread). Results are bitwise equal
 * on every rank. Each call carries its number, kind, dtype, count, op or root (and the
 * graph hash, wf_comm_set_graph_hash) to every other rank: a rank that calls another
 * collective fails the comm on every rank with WF_EPEER, naming both ranks and both calls
 * ("rank 0 called allreduce #12 (f32 x 1000, sum), rank 1 called broadcast #12 (40 bytes,
 * root 0)"), instead of a hang or a wrong result; no rank, of any number, returns a result
 * of a mismatched call (host memory; NCCL's calls carry no description). Each returns 0, WF_EINVAL
 * (NULL buffer, bad dtype/op/root, a count that overflows), WF_EPEER or WF_ETIMEDOUT (the message
 * names the rank that failed or was late, and the collective), WF_ENOMEM or WF_EDEVICE. The calling
 * thread polls the network itself while a collective runs (no sleep for up to 200 ms per wait,
 * yielding its core now and then), so a collective costs a core for its duration, and little
 * latency. Device memory: in builds with CUDA and NCCL, all-reduce, reduce-scatter, all-gather and
 * broadcast of buffers on a CUDA device (all of a call's buffers on the same device, ready when
 * called) go through NCCL on that device; the first such call makes the NCCL communicator (rank 0's
 * id travels by a host broadcast). A dead rank or a passed deadline aborts it, so the call returns
 * the comm's error instead of hanging. Integer means and host/device mixes are refused (WF_EINVAL).
 * Without NCCL, pass host memory only.
 */

typedef enum wf_reduce_op {
    WF_REDUCE_SUM = 1,
    WF_REDUCE_MEAN = 2, /* sum divided by size (integers: truncated toward zero) */
    WF_REDUCE_MAX = 3,
} wf_reduce_op;

/* Sums (or averages, or takes the maximum of) 'count' elements of 'dtype' (f32, f64, i32,
 * i64, bf16) over all ranks: 'recv' gets the result on every rank. 'send' may equal 'recv'
 * (in place). Small messages (up to small_bytes) use recursive doubling, larger ones a ring
 * (reduce-scatter then all-gather) whose chunks are reduced while the next ones travel.
 * bf16 is reduced in f32 and rounded once per step. */
WF_API WF_NODISCARD int wf_comm_allreduce(wf_comm *c, const void *send, void *recv, size_t count,
                                          wf_dtype dtype, wf_reduce_op op);

/* 'recv' (count elements) gets block 'rank' of the reduction of every rank's 'send'
 * (size * count elements): rank r's result is elements [r*count, (r+1)*count). */
WF_API WF_NODISCARD int wf_comm_reduce_scatter(wf_comm *c, const void *send, void *recv,
                                               size_t count, wf_dtype dtype, wf_reduce_op op);

/* 'recv' (size * bytes) gets every rank's 'send' (bytes each), in rank order. */
WF_API WF_NODISCARD int wf_comm_allgather(wf_comm *c, const void *send, void *recv, size_t bytes);

/* Copies 'bytes' at 'buf' of rank 'root' to 'buf' of every rank (binomial tree). */
WF_API WF_NODISCARD int wf_comm_broadcast(wf_comm *c, void *buf, size_t bytes, int root);

/* Returns once every rank has called it (a dissemination barrier over UCX). */
WF_API WF_NODISCARD int wf_comm_barrier(wf_comm *c);

/* ---- Gradient buckets ---------------------------------------------------------------------
 * A bucket packs many small tensors (host memory, one dtype) into one buffer and all-reduces
 * each full buffer in the background, so that a data-parallel step can all-reduce the
 * gradients backward has finished while it computes the others: add each gradient as it is
 * ready, then wait once. Every rank adds the same tensors (counts) in the same order.
 * Buckets run in the order they fill, one all-reduce at a time, on a thread of the bucket
 * object ("weft-bucket"); while any is in flight, the caller makes no other collective on
 * the comm (one collective at a time per comm). */

typedef struct wf_comm_bucket wf_comm_bucket; /* opaque */

typedef struct wf_bucket_opts {
    wf_dtype dtype;      /* f32, f64, bf16, i32 or i64 */
    wf_reduce_op op;     /* 0: WF_REDUCE_SUM */
    size_t bucket_bytes; /* 0: 25 MiB (PyTorch DDP's default). A buffer is all-reduced as soon
                            as the next tensor would not fit; a tensor larger than this is
                            all-reduced alone, in place, without a copy. */
} wf_bucket_opts;

/* Makes a bucket over 'c' (borrowed: it must outlive the bucket). Returns 0, WF_EINVAL (NULL
 * comm or out, a dtype that cannot be reduced, an unknown op), WF_ENOMEM or WF_ESYS (no
 * thread). Ownership: '*out' is owned (wf_comm_bucket_destroy()). Threads: any. */
WF_API WF_NODISCARD int wf_comm_bucket_create(wf_comm *c, const wf_bucket_opts *opts,
                                              wf_comm_bucket **out);

/* Adds 'count' elements at 'data' to the current buffer (copied at once); when they would
 * not fit, the buffer is first handed to the background all-reduce. The result is written
 * back to 'data' before wf_comm_bucket_wait() returns. Does not block on the network.
 * Returns 0, WF_EINVAL (NULL bucket, NULL data with count > 0, a count that overflows), or
 * the error that failed an earlier bucket (WF_EPEER, WF_ETIMEDOUT: the message names the
 * rank and the all-reduce; nothing more is sent), or WF_ENOMEM.
 * Ownership: 'data' is borrowed until wf_comm_bucket_wait() returns: do not touch it. */
WF_API WF_NODISCARD int wf_comm_bucket_add(wf_comm_bucket *b, void *data, size_t count);

/* Hands the current buffer, however full, to the background all-reduce (no-op when empty).
 * Returns as wf_comm_bucket_add(). */
WF_API WF_NODISCARD int wf_comm_bucket_flush(wf_comm_bucket *b);

/* Flushes, then waits until every buffer handed over is all-reduced and written back to its
 * tensors; the bucket is then empty and may be used for the next step. Returns 0, or the
 * first error of any bucket (WF_EPEER naming the dead rank, WF_ETIMEDOUT, ...; the comm has
 * then failed and the tensors of the failed buckets are left as they were) or WF_EINVAL. */
WF_API WF_NODISCARD int wf_comm_bucket_wait(wf_comm_bucket *b);

/* Returns 1 when nothing handed over is still in flight, 0 otherwise, WF_EINVAL for NULL. */
WF_API WF_NODISCARD int wf_comm_bucket_test(wf_comm_bucket *b);

/* Waits for what was handed over (ignoring errors; tensors added since the last flush or
 * wait are dropped, not all-reduced), stops the thread and frees the bucket. NULL is a no-op.
 * Threads: one call, when no other call on 'b' runs. */
WF_API void wf_comm_bucket_destroy(wf_comm_bucket *b);

#ifdef __cplusplus
}
#endif
#endif /* WEFT_TRANSPORT_H */
