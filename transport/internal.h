/* transport/internal.h: what the files of transport/ share (never installed).
 * Owns: the control-plane frame format and its codec (frame.c), the communicator's layout
 * (struct wf_comm) shared by the control plane (net.c), the data plane (ucx.c), the
 * collectives (coll.c) and creation/destruction (comm.c).
 * Invariants:
 *  - 'mu' guards every field marked (mu); the UCX worker runs in UCS_THREAD_MODE_MULTI, and
 *    UCX is never called while 'mu' is held (UCX callbacks take 'mu' inside the worker's
 *    lock, so the lock order is: UCX worker, then 'mu').
 *  - libuv handles are touched only by the "weft-net" thread; callers ask it for work by
 *    setting a 'want_*' field under 'mu' and calling uv_async_send(&wake).
 *  - A request ('wf_comm_req') is freed by its waiter after its UCX request completed, or,
 *    if the waiter gave up on it (comm failure), it is an orphan on 'orphans' (mu) and the
 *    UCX completion callback, or wf_comm_destroy() after the worker is gone, frees it.
 *  - Once 'failed' is non-zero it never changes; 'failmsg' is written once, before it
 *    (and before 'fail_code', which leads 'failed' by the time the flight dump takes).
 *  - 'busy' counts callers polling the worker themselves (collectives, blocking receives);
 *    while it is above 0, "weft-net" does not watch the event fd ('poll_paused').
 *  - 'cma' is decided by all ranks together at creation and never changes; a single-copy
 *    ring reads a neighbour's buffer only between its "ready" and its own "done" message.
 * Not here: the public contract (include/weft/transport.h). */
#ifndef WF_TRANSPORT_INTERNAL_H
#define WF_TRANSPORT_INTERNAL_H

#include "../core/error.h"

#include <weft/sched.h>
#include <weft/transport.h>

#include <ucp/api/ucp.h>
#include <uv.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- Frames: [u32 magic][u16 version][u16 type][u32 length][payload], little endian. ---- */

#define WF__FRAME_MAGIC   0x57465446u /* "FTFW" on the wire, read as 'WFTF' */
#define WF__FRAME_VERSION 1
#define WF__FRAME_HDR     12
#define WF__TOKEN_MAX     256  /* bytes of a token */
#define WF__HOST_MAX      255  /* bytes of a host name */
#define WF__UCX_ADDR_MAX  8192 /* bytes of a UCX worker address */
#define WF__REASON_MAX    480  /* bytes of a reason in REJECT and FAIL */
#define WF__STRANGERS_MAX 64   /* rank 0: connections open at once without a valid HELLO */

enum wf__frame_type {
    WF__F_HELLO = 1,     /* rank -> 0: rank, size, incarnation, pid, token, host, UCX address */
    WF__F_WELCOME = 2,   /* 0 -> rank: every rank's incarnation, pid, host, UCX address */
    WF__F_REJECT = 3,    /* 0 -> stranger: reason; then the connection is closed */
    WF__F_BARRIER = 4,   /* rank -> 0: arrived at control barrier 'seq' */
    WF__F_RELEASE = 5,   /* 0 -> rank: everyone arrived at 'seq' */
    WF__F_HEARTBEAT = 6, /* both ways, every heartbeat_ms */
    WF__F_BYE = 7,       /* orderly shutdown: rank -> 0 when leaving (the number of collectives
                            it ran), 0 -> rank when all left (empty) */
    WF__F_FAIL = 8,      /* both ways: rank 'rank' failed with 'code' and a reason */
    WF__F_LEFT = 9,      /* 0 -> rank: rank 'rank' left (wf_comm_destroy) after 'n' collectives */
    WF__F_TYPE_END
};

/* A parsed frame: 'payload' points into the caller's buffer. */
typedef struct wf__frame {
    uint16_t type;
    uint32_t len;
    const uint8_t *payload;
} wf__frame;

/* Looks for one frame at the start of 'buf' (len bytes). Returns 1 and fills 'f' and
 * '*used' when a whole frame is there, 0 when more bytes are needed (then, once the header
 * is in and valid, 'f->type' and 'f->len' are already filled, 'f->payload' is NULL), or
 * WF_EFORMAT with 'err' (errlen bytes) saying why:
 * wrong magic, unsupported version, unknown type, or a length above that type's cap. The
 * header is checked as soon as its 12 bytes are in, so an oversized length is refused
 * before anything is buffered for it. */
int wf__frame_parse(const uint8_t *buf, size_t len, wf__frame *f, size_t *used, char *err,
                    size_t errlen);

/* The largest payload a frame of 'type' may carry (0 for an unknown type). */
uint32_t wf__frame_cap(uint16_t type);

/* A growable byte buffer for building a frame (header included). On allocation failure
 * 'oom' is set and later writes do nothing. */
typedef struct wf__wbuf {
    uint8_t *p;
    size_t len, cap;
    bool oom;
} wf__wbuf;

void wf__wbuf_begin(wf__wbuf *w, uint16_t type); /* writes a header to fill in at the end */
void wf__wbuf_u32(wf__wbuf *w, uint32_t v);
void wf__wbuf_str(wf__wbuf *w, const char *s, size_t n);  /* u16 length + bytes */
void wf__wbuf_blob(wf__wbuf *w, const void *p, size_t n); /* u32 length + bytes */
int wf__wbuf_end(wf__wbuf *w); /* fills in the length; WF_ENOMEM if anything failed */

/* A bounds-checked reader over a payload; a read past the end sets 'bad'. */
typedef struct wf__rbuf {
    const uint8_t *p;
    size_t len, off;
    bool bad;
} wf__rbuf;

uint32_t wf__rbuf_u32(wf__rbuf *r);
/* Returns a pointer to the bytes (not NUL-terminated) and their count in '*n', or NULL with
 * 'bad' set when the length runs past the end or above 'max'. */
const uint8_t *wf__rbuf_str(wf__rbuf *r, size_t max, size_t *n);
const uint8_t *wf__rbuf_blob(wf__rbuf *r, size_t max, size_t *n);

/* A decoded HELLO. Strings are copied, NUL-terminated; 'addr' points into the payload. */
typedef struct wf__hello {
    uint32_t rank, size, incarnation, pid;
    char token[WF__TOKEN_MAX + 1];
    char host[WF__HOST_MAX + 1];
    const uint8_t *addr;
    size_t addr_len;
} wf__hello;

/* Decodes and validates a HELLO payload against 'size' and 'token'. Returns 0, or
 * WF_EFORMAT (malformed: truncated, trailing bytes, empty address), WF_EPEER (well formed
 * but refused: wrong token, size mismatch, rank out of range), with 'err' saying why. */
int wf__hello_decode(const uint8_t *p, size_t len, int size, const char *token, wf__hello *h,
                     char *err, size_t errlen);

/* ---- The flight recorder (flight.c) ---------------------------------------------------- */

/* What a recorded operation is: the collectives, then point to point. */
enum wf__op_kind {
    WF__K_NONE,
    WF__K_ALLREDUCE,
    WF__K_REDUCE_SCATTER,
    WF__K_ALLGATHER,
    WF__K_BROADCAST,
    WF__K_BARRIER,
    WF__K_SEND,
    WF__K_RECV,
    WF__K_DP_REDUCE, /* a session's dp_reduce node (coll_ops.c): recorded, not a wf_comm call */
    WF__K_COUNT
};

/* "allreduce", ..., "send", "recv" ("collective" for an unknown kind). */
const char *wf__kind_name(unsigned kind);

enum wf__flight_state { WF__FS_POSTED, WF__FS_WAITING, WF__FS_DONE, WF__FS_FAILED };

#define WF__FLIGHT_OPS 1024 /* operations each comm remembers */
#define WF__FLIGHT_TAG 48   /* bytes of a caller's tag, NUL included */

/* One recorded operation. 'seq' is the collective's number (coll_seq) or, for point to
 * point, the comm's count of public sends and receives. */
typedef struct wf__fent {
    uint64_t seq, key, bytes, count;
    uint64_t t0, t1; /* CLOCK_MONOTONIC ns: posted, and done or failed (0: not yet) */
    int32_t peer;    /* point to point: the peer; broadcast: the root; else -1 */
    int32_t rc;      /* the status it ended with */
    uint8_t kind, state, dtype, op;
    char tag[WF__FLIGHT_TAG];
} wf__fent;

typedef struct wf__flight {
    pthread_mutex_t mu; /* guards everything below; never held across I/O or UCX */
    bool on;            /* false: wf_comm_opts.flight_off */
    uint64_t n;         /* operations recorded so far; entry i is at ent[i % WF__FLIGHT_OPS] */
    uint64_t p2p_seq;
    char tag[WF__FLIGHT_TAG]; /* the caller's tag (wf_comm_set_tag) */
    char *dir;                /* wf_comm_opts.flight_dir (malloc), or NULL */
    bool dumped;              /* the failure dump was written (or tried) */
    wf__fent ent[WF__FLIGHT_OPS];
} wf__flight;

/* Records the start of 'e' (its kind, seq, sizes, peer; the time, and the caller's tag
 * unless 'e' has one, are added) in the state 'e->state'. Returns its ticket (for
 * wf__flight_set), 0 when the recorder is off. */
uint64_t wf__flight_begin(wf_comm *c, const wf__fent *e);
/* Records a transfer a graph node starts (dp_reduce, send or recv: 'kind'), waiting, tagged
 * "<node name>, run <run>" ('run': wf_kernel_ctx.xfer_step, the same on every rank). A
 * dp_reduce's number is run << 15 | edge, plus one: equal on every rank, so the verdict of a
 * failed job names the reduction a rank never entered. Returns the ticket, as above. */
uint64_t wf__flight_node(wf_comm *c, unsigned kind, uint64_t key, uint64_t bytes, uint64_t count,
                         int peer, const char *node, int edge, uint64_t run);
/* Moves operation 'ticket' to 'state' (with 'rc' and the end time once DONE or FAILED);
 * a no-op for ticket 0 or an entry already overwritten. */
void wf__flight_set(wf_comm *c, uint64_t ticket, int state, int rc);
/* Writes the record to 'path' (NULL: <flight_dir>/flight.rank<R>.jsonl). Returns 0,
 * WF_EINVAL (no path and no flight_dir) or WF_EIO, with a message. */
int wf__flight_write(wf_comm *c, const char *path);
/* The comm has just failed: writes the record once, if a flight_dir was given. */
void wf__flight_on_fail(wf_comm *c);
/* Makes the recorder of a new comm (creation); WF_ENOMEM. Frees it (NULL-safe). */
int wf__flight_init(wf_comm *c, const wf_comm_opts *o);
void wf__flight_fini(wf_comm *c);

/* ---- The communicator --------------------------------------------------------------- */

typedef struct wf__conn wf__conn;

/* UCX is loaded with dlopen() by the first wf_comm_create() of a process, not linked: UCX's
 * libucm hooks mmap/madvise as soon as it is loaded, which every program using libweft
 * would otherwise get (and which crashes exiting threads under ThreadSanitizer). Once
 * loaded it stays: its hooks cannot be taken back. These are the calls weft makes. */
/* clang-format off */
#define WF__UCX_FUNCS(X) \
    X(ucp_config_read) \
    X(ucp_config_modify) \
    X(ucp_config_release) \
    X(ucp_init_version) \
    X(ucp_cleanup) \
    X(ucp_worker_create) \
    X(ucp_worker_query) \
    X(ucp_worker_get_efd) \
    X(ucp_worker_get_address) \
    X(ucp_worker_release_address) \
    X(ucp_worker_destroy) \
    X(ucp_worker_progress) \
    X(ucp_worker_arm) \
    X(ucp_ep_create) \
    X(ucp_ep_close_nbx) \
    X(ucp_request_check_status) \
    X(ucp_request_free) \
    X(ucp_request_cancel) \
    X(ucp_tag_send_nbx) \
    X(ucp_tag_recv_nbx) \
    X(ucs_status_string)

/* clang-format on */

typedef struct wf__ucx_api {
    void *lib; /* dlopen("libucp.so.0"); never closed */
#define WF__UCX_PTR(f) __typeof__(f) *f;
    WF__UCX_FUNCS(WF__UCX_PTR)
#undef WF__UCX_PTR
} wf__ucx_api;

typedef struct wf__peer {
    char host[WF__HOST_MAX + 1];
    uint32_t pid, incarnation;
    uint8_t *addr; /* UCX worker address (malloc) */
    size_t addr_len;
    ucp_ep_h ep;     /* created by the caller of wf_comm_create() after WELCOME */
    void *close_req; /* wf__ucx_fini: its endpoint's close, while waited for */
    wf__conn *conn;  /* rank 0: the rank's control connection (net thread only) */
    bool said_bye;   /* rank 0: the rank sent BYE (net thread only) */
    bool registered; /* rank 0: the rank's HELLO was accepted (net thread only) */
} wf__peer;

struct wf__conn {
    uv_tcp_t tcp;
    wf_comm *c;
    wf__conn *next;
    int rank; /* -1 until a HELLO is accepted (rank 0), or 0 on the other ranks */
    uint8_t *rbuf;
    size_t rlen, rcap;
    uint64_t last_seen_ns;
    uint64_t accepted_ns; /* rank 0: when it was accepted (its HELLO's deadline counts from it) */
    bool closing, bye_seen;
};

enum wf__phase {
    WF__PH_CONNECTING = 0, /* rendezvous in progress */
    WF__PH_READY = 1,      /* every address is known */
    WF__PH_LEFT = 2,       /* the goodbye round is over */
};

struct wf_comm_req {
    wf_comm *c;
    void *ureq; /* UCX request, or NULL when completed at once (posted requests: under mu) */
    int peer;
    bool is_recv;
    _Atomic bool done; /* set under mu, read without it (acquire) */
    bool orphan;       /* (mu) */
    int status;        /* (mu) wf_status once done */
    ucs_status_t ust;  /* (mu) UCX's status once done */
    uint64_t key;
    size_t bytes;
    ucp_tag_recv_info_t info;
    wf_comm_req *next_orphan; /* (mu) */
    /* Posted requests (post.c): completed through the comm's actor, never waited for. */
    wf_msg msg;                         /* to the actor, once UCX is done with the request */
    void (*on_done)(void *arg, int rc); /* NULL: a waited request (wf__wait) */
    void *done_arg;
    uint64_t t0, deadline_ns; /* posted at (trace clock), fails the comm after */
    void *buf;                /* the caller's buffer, until the actor hands it on */
    bool handed;              /* (actor) given to UCX */
    bool in_post;             /* (mu) not yet handed to UCX, or in the UCX call (post.c) */
    bool finish_held;         /* (mu) its completion came during that call: sent again */
    wf_comm_req *next_hand;   /* (mu) on 'to_hand' until "weft-net" hands it to UCX */
    wf_comm_req *next_posted; /* (mu) on 'posted' until the actor finishes it */
    uint64_t flight;          /* its flight-recorder ticket (flight.c), 0: not recorded */
    bool desc;                /* a collective's call descriptor (coll.c): checked on arrival */
};

struct wf_comm {
    wf_runtime *rt;
    int rank, size;
    uint32_t incarnation;
    char host[WF__HOST_MAX + 1];
    char *addr_str, *token;
    struct sockaddr_storage *sa; /* rank 0's address, resolved */
    uint32_t connect_timeout_ms, op_timeout_ms, hb_ms, hb_timeout_ms, spin_us, hello_timeout_ms;
    size_t small_bytes, chunk_bytes;
    char net_devices[64];

    /* UCX */
    wf__ucx_api api;
    ucp_context_h ctx;
    ucp_worker_h worker;
    int efd;
    ucp_address_t *my_addr;
    size_t my_addr_len;
    wf__peer *peers;

    /* libuv (net thread only, after start) */
    uv_loop_t loop;
    uv_async_t wake;
    uv_timer_t hb_timer, connect_timer, retry_timer;
    uv_poll_t efd_poll;
    uv_timer_t rearm_timer;  /* while the event fd's poll is paused for a busy caller */
    uv_timer_t hello_timer;  /* rank 0: closes connections past hello_timeout_ms without HELLO */
    int n_strangers;         /* rank 0: open connections without an accepted HELLO */
    int launcher_fd;         /* wf_comm_opts.launcher_fd, or -1 */
    uv_poll_t launcher_poll; /* watches it while 'launcher_open' */
    bool launcher_open;
    uv_tcp_t server;
    bool server_open, poll_open, poll_paused;
    wf__conn *conns;      /* every open control connection */
    wf__conn *to_root;    /* ranks > 0: the connection to rank 0 */
    int n_registered;     /* rank 0 */
    uint32_t arrived_seq; /* rank 0: the control barrier being counted */
    int n_arrived;
    uint32_t *rank_seq; /* rank 0: the last barrier seq each rank arrived at */
    int n_bye;          /* rank 0 */
    pthread_t thread;
    bool thread_started;

    /* Shared between the caller and the net thread. */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int phase;             /* (mu) wf__phase */
    uint32_t released_seq; /* (mu) the last control barrier released */
    uint32_t want_seq;     /* (mu) the control barrier the caller is at */
    bool want_bye;         /* (mu) the caller is leaving */
    bool want_stop;        /* (mu) the net thread should close everything and exit */
    bool abort_sent;       /* (mu) */
    bool fail_quiet;       /* (mu) the failure is wf__comm_fail_quiet()'s, and none came after it */
    int sleepers;          /* (mu) callers waiting on 'cv' for requests */
    _Atomic int sends_in_flight; /* sends posted and not completed (see wf__wait) */
    _Atomic int busy;            /* callers driving progress themselves (wf__busy_begin) */
    _Atomic int failed;          /* 0 or the wf_status that failed the comm */
    int fail_code;               /* (mu) the same, set first: between the two the failing
                                    thread writes the flight record (net.c, comm_vfail) */
    int failed_rank;             /* (mu) the rank that failed, or -1 */
    _Atomic uint64_t grace_end;  /* 0, or until when waiters giving up let transfers finish */
    char failmsg[WF_ERRMSG_MAX];
    wf_comm_req *orphans; /* (mu) */

    /* post.c: the transport's actor, which drives posted transfers (made at the first
     * post; NULL before). Its handler is the only code that frees a posted request. */
    _Atomic(struct wf_actor *) actor;
    int timer_fd;         /* the actor's deadlines and retries (-1: none yet) */
    uint64_t timer_at;    /* (actor) when 'timer_fd' fires next, 0: disarmed */
    wf_comm_req *posted;  /* (mu) posted requests UCX has not finished */
    int n_posted;         /* (mu) entries of 'posted' */
    bool posting_closed;  /* (mu) wf_comm_destroy() began: no new posts */
    wf_comm_req *to_hand; /* (mu) posted, for "weft-net" to hand to UCX (newest first) */

    /* Collectives: one at a time (the caller's contract). */
    uint32_t coll_seq;
    /* Who may wait for a rank that left (wf__coll_check_left): the collective entered last,
     * (seq << 8) | kind (coll.c), written by the caller; and the rank that left after the
     * fewest collectives, 0 or (collectives + 1) << 32 | rank, written by "weft-net". */
    _Atomic uint64_t coll_now;
    _Atomic uint64_t left;
    bool left_sent;    /* rank 0, net thread only: told the others that it leaves */
    bool cma;          /* the ring reads its left neighbour's buffer itself (wf__cma_setup) */
    int cuda_devices;  /* NCCL builds: -1 until counted, then cudaGetDeviceCount (0: none) */
    void *nccl;        /* NCCL builds: ncclComm_t, made by the first device collective */
    void *nccl_stream; /* its cudaStream_t */
    int nccl_device;
    uint64_t cma_word; /* what wf__cma_setup's neighbour reads */
    void *scratch;
    size_t scratch_cap;
    /* The call descriptor of the collective in progress (coll.c, call descriptors): this
     * rank's, and what every other rank sent ('size' entries by rank, written by UCX before
     * their receives complete). 'desc_rq' (2 * 'size'): the receives from each rank, then
     * the sends to each, while the collective runs (this rank's own stay NULL; caller
     * only). 'graph_hash' is wf_comm_set_graph_hash()'s. */
    uint64_t desc_mine[4];
    uint64_t (*desc_from)[4];
    wf_comm_req **desc_rq;
    _Atomic uint64_t graph_hash;
    wf__flight *flight; /* the flight recorder (flight.c) */
};

/* net.c: starts the "weft-net" thread (rendezvous, heartbeats, failure detection). */
int wf__net_start(wf_comm *c);
/* Asks the net thread to look at the 'want_*' fields. Threads: any. */
void wf__net_kick(wf_comm *c);
/* Stops the thread and closes every handle; safe when it never started. */
void wf__net_stop(wf_comm *c);

/* Fails the comm with 'code' (first failure wins) and wakes every waiter; 'rank' is the
 * rank to blame or -1. Returns the comm's failure code. Threads: any; takes 'mu'. */
int wf__comm_fail(wf_comm *c, int code, int rank, const char *fmt, ...) WF_PRINTF(4, 5);

/* As wf__comm_fail(), for a failure that every rank finds out by itself (a rank that left,
 * wf__coll_check_left): it is not relayed, so that ranks which can still finish what they
 * are doing do, and the control plane stays whole: wf_comm_destroy() still runs the
 * goodbye round, so the rank that left and the others all leave in order. A later failure
 * of any kind makes it a plain one. Threads: any; takes 'mu'. */
int wf__comm_fail_quiet(wf_comm *c, int code, int rank, const char *fmt, ...) WF_PRINTF(4, 5);

/* Sets this thread's message to the comm's failure and returns its code (0 if healthy). */
int wf__comm_failed(const wf_comm *c);

/* Returns CLOCK_MONOTONIC in nanoseconds. */
uint64_t wf__net_now_ns(void);

/* ucx.c: the data plane. */
int wf__ucx_init(wf_comm *c, const char *tls);
int wf__ucx_connect(wf_comm *c); /* endpoints to every rank, after WELCOME */
void wf__ucx_fini(wf_comm *c);
/* Drains the worker's progress and arms its event fd; how the net thread sleeps. Bounded:
 * returns false when the worker still had events after a few rounds (it may stay BUSY for
 * ever, e.g. with a send queued for a dead peer), and then the caller polls again later. */
bool wf__ucx_progress_arm(wf_comm *c);

/* Busy mode (a collective or a blocking receive in progress): the caller's waits poll the
 * worker themselves, without sleeping, for up to WF__BUSY_NS per wait, and "weft-net" stops
 * watching the event fd (it would only wake up for completions the caller already reaps)
 * until no caller is busy; it looks again every millisecond. Threads: any; nests. */
#define WF__BUSY_NS 200000000u
void wf__busy_begin(wf_comm *c);
void wf__busy_end(wf_comm *c);

/* Tag classes: bit 63 chooses user point-to-point keys or collective traffic. */
#define WF__TAG_COLL (1ull << 63)

/* post.c: the transport's actor. Kicks it (a look at the deadlines and the watches); a no-op
 * before the first post. Threads: any. */
void wf__post_kick(wf_comm *c);
/* wf_comm_destroy(), after "weft-net" stopped and before UCX goes: cancels what is posted,
 * lets the actor complete it (WF_ECANCELED, or the comm's failure) and frees the actor. */
void wf__post_fini(wf_comm *c);
/* net.c, on "weft-net" when kicked: hands every request posted since its last call to UCX
 * (one that UCX refuses completes through the actor, failed) and pokes the actor (the
 * deadlines' timer). Returns whether there was any, so that the caller drains progress and
 * arms the worker. */
bool wf__post_hand(wf_comm *c);

/* After a failure of the comm: cancels every posted request in UCX, each once (its completion
 * comes back to the actor, which finishes it with the comm's failure). Only on the thread that
 * drives the UCX worker's progress: "weft-net" (on_wake(), net.c), or wf__post_fini()'s. */
void wf__post_cancel(wf_comm *c);
/* ucx.c: UCX finished posted request 'r' (its fields are set): hands it to the actor. */
void wf__post_completed(wf_comm_req *r);

/* Posts a send or receive of a raw tag body (class bit plus 40-bit key). */
int wf__isend(wf_comm *c, int peer, uint64_t body, const void *buf, size_t bytes,
              wf_comm_req **out);
int wf__irecv(wf_comm *c, int peer, uint64_t body, void *buf, size_t bytes, wf_comm_req **out);
/* As wf__irecv(), for a collective's call descriptor: its completion calls
 * wf__coll_desc_arrived() before the request is done. */
int wf__irecv_desc(wf_comm *c, int peer, uint64_t body, void *buf, size_t bytes, wf_comm_req **out);
/* As wf__isend()/wf__irecv(), for the actor's posted requests: 'r' is made by the caller
 * (calloc'ed, 'on_done' and friends set, already on 'posted'); on failure the caller frees it. */
int wf__post_ucx(wf_comm *c, wf_comm_req *r, int peer, uint64_t body, void *buf, size_t bytes,
                 bool is_recv);
/* Frees request 'r' and its UCX request (once UCX is done with it). */
void wf__req_free(wf_comm_req *r);
/* "receive from rank 1 (host h, pid 9), key 0x10, 64 bytes": for messages. */
void wf__req_describe(const wf_comm_req *r, char *s, size_t n);
/* Waits for 'r' until 'deadline_ns'; 'what' names the operation in messages. Frees 'r'.
 * On timeout the comm fails (and tells every rank). */
int wf__wait(wf_comm_req *r, uint64_t deadline_ns, const char *what);
/* Waits for every request of 'rs' (NULL entries skipped), freeing all of them even after an
 * error; returns the first error. */
int wf__wait_all(wf_comm_req **rs, size_t n, uint64_t deadline_ns, const char *what);

/* A transfer to or from 'peer' failed ('what' names it, 'why' says how): waits up to 500 ms
 * for the control plane's verdict (a dead rank's socket closes), else fails the comm with
 * WF_EPEER blaming 'peer'. Returns the comm's failure code. Threads: any; takes 'mu'. */
int wf__peer_fail(wf_comm *c, int peer, const char *what, const char *why);

/* coll.c: single-copy transfers between ranks of one host (process_vm_readv): whether every
 * rank can read its ring neighbour's memory, decided by all ranks together at creation
 * (a collective call; sets c->cma). Skipped unless every rank is on this host and the UCX
 * transports chosen include shared memory; then it also warms UCX's shared-memory FIFOs
 * with a few all-reduces (coll.c, shm_warmup). */
int wf__cma_setup(wf_comm *c, const char *tls);
/* Copies 'bytes' between 'local' and address 'addr' of rank 'peer' (on this host, c->cma):
 * from the peer with process_vm_readv, or to it with process_vm_writev when 'to_peer'. A
 * failed copy (a dead peer: ESRCH, EFAULT) fails the comm naming the peer and 'what' and
 * returns its code; never an abort. Threads: any. */
int wf__cma_copy(wf_comm *c, int peer, void *local, uint64_t addr, size_t bytes, bool to_peer,
                 const char *what);

#if WF_HAVE_NCCL
/* nccl.c: collectives on CUDA device memory (built with CUDA and NCCL). Returns the CUDA
 * device holding 'p', or -1 for host memory (or no CUDA at all). */
int wf__nccl_device_of(wf_comm *c, const void *p);
int wf__nccl_allreduce(wf_comm *c, int device, const void *send, void *recv, size_t count,
                       wf_dtype dt, wf_reduce_op op);
int wf__nccl_reduce_scatter(wf_comm *c, int device, const void *send, void *recv, size_t count,
                            wf_dtype dt, wf_reduce_op op);
int wf__nccl_allgather(wf_comm *c, int device, const void *send, void *recv, size_t bytes);
int wf__nccl_broadcast(wf_comm *c, int device, void *buf, size_t bytes, int root);
void wf__nccl_fini(wf_comm *c); /* after the goodbye round */
#endif

/* coll.c: a rank left the comm in order (wf_comm_destroy) after 'n' collectives: records it
 * (the fewest count wins) and fails the comm at once, naming that rank and the collective,
 * if this rank is in, or later enters, a collective it never joined. Threads: "weft-net";
 * the collectives make the same check on entry. Returns the comm's failure code or 0. */
int wf__coll_left(wf_comm *c, int rank, uint32_t n);
int wf__coll_check_left(wf_comm *c);

/* coll.c: another rank's call descriptor for the collective in progress has arrived in
 * receive 'r' (UCX callback, any thread, before 'r' is done): fails the comm, naming both
 * ranks and both calls, when it differs from this rank's. */
void wf__coll_desc_arrived(wf_comm *c, const wf_comm_req *r);

/* coll.c: a collective's data message had the wrong size (WF_EFORMAT): lets the current
 * collective's descriptor receives complete first (up to 100 ms), so that when the cause
 * is a mismatched call, that is the comm's failure and message. Returns the comm's failure
 * code (0 if it has not failed). Threads: the caller of the collective. */
int wf__coll_settle(wf_comm *c);

/* coll.c: writes where this rank's collectives are ("allreduce #12", or "no collective
 * yet") for messages. Threads: any. */
void wf__coll_where(const wf_comm *c, char *buf, size_t size);

/* coll.c: the reduction kernel shared by the collectives (dst = dst op src). */
void wf__reduce(void *dst, const void *src, size_t count, wf_dtype dt, wf_reduce_op op);

#endif /* WF_TRANSPORT_INTERNAL_H */
