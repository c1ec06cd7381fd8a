/* transport/ucx.c: the data plane: one UCX context and worker per comm, an endpoint per
 * rank, tagged sends and receives, and waits with deadlines.
 * Tags (64 bits): bit 63 the class (user key or collective), bits 62..50 the sender's rank,
 * bits 49..40 the low 10 bits of the sender's incarnation (a restarted rank never matches a
 * receive posted for its earlier life), bits 39..0 the key. The destination is the worker
 * the message goes to. Receives match the whole tag.
 * Progress: a waiter polls the worker for spin_us (a wake-up costs 25-40 us with UCX 1.13),
 * then arms the worker's event fd and sleeps on the comm's condition variable; "weft-net"
 * sleeps in epoll on that fd and drains progress when it fires (wf__ucx_progress_arm), so
 * no thread spins while the network is idle; while the worker cannot be armed (its events
 * keep coming, or a send to a dead peer keeps it BUSY) it polls every millisecond instead.
 * Collectives and blocking receives are in busy mode (wf__busy_begin): their waits poll
 * without sleeping for up to WF__BUSY_NS, and "weft-net" leaves the event fd alone
 * meanwhile (net.c, on_efd). The worker is UCS_THREAD_MODE_MULTI because both threads make
 * progress. UCX keepalive is off: with it, ucp_worker_arm() kept returning BUSY on shared
 * memory, a hidden spin (UCX 1.13). Failure: endpoints use UCP_ERR_HANDLING_MODE_NONE,
 * since PEER mode silently drops shared memory in UCX 1.13; a dead peer is seen by the
 * control plane (net.c), and a waiter that finds the comm failed cancels its own request
 * (ucp_request_cancel), or lets it finish first while UCX may still use its buffer
 * (give_up). Owns: the UCX handles, wf_comm_req, the orphan list. Not here: collectives
 * (coll.c), the control plane (net.c). */
#include "internal.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TAG_SRC_SHIFT 50
#define TAG_INC_SHIFT 40
#define TAG_KEY_MASK  ((1ull << WF_COMM_KEY_BITS) - 1)

/* wf__ucx_progress_arm: arm attempts, and progress calls per drain, before it gives up and
 * lets "weft-net" poll again a millisecond later. A healthy worker drains in a few calls. */
#define ARM_ROUNDS 4
#define ARM_DRAIN  256

/* give_up: how long, per failure of a comm, waiters let transfers with live peers finish
 * before leaving them as orphans (then UCX may still touch the caller's buffer). */
#define GRACE_NS 250000000u

static uint64_t make_tag(uint64_t body, int src, uint32_t incarnation)
{
    return body | ((uint64_t)src << TAG_SRC_SHIFT) |
           ((uint64_t)(incarnation & 0x3ff) << TAG_INC_SHIFT);
}

static int ucx_err(wf_comm *c, ucs_status_t st, const char *what)
{
    return wf__err(WF_EDEVICE, "%s: UCX: %s", what, c->api.ucs_status_string(st));
}

static int load(wf_comm *c)
{
    /* RTLD_LOCAL: UCX's symbols stay out of the program's namespace. dlerror() is not
     * thread-safe, so the message is only what we can say without it when racing. */
    c->api.lib = dlopen("libucp.so.0", RTLD_NOW | RTLD_LOCAL);
    if (!c->api.lib)
        return wf__err(WF_ENOSYS,
                       "wf_comm_create: cannot load UCX (libucp.so.0; Debian: "
                       "libucx0): %s",
                       dlerror());
#define WF__UCX_SYM(f)                                        \
    if (!(c->api.f = (__typeof__(f) *)dlsym(c->api.lib, #f))) \
        return wf__err(WF_ENOSYS, "wf_comm_create: UCX (libucp.so.0) has no %s", #f);
    WF__UCX_FUNCS(WF__UCX_SYM)
#undef WF__UCX_SYM
    return 0;
}

int wf__ucx_init(wf_comm *c, const char *tls)
{
    int rc = load(c);
    if (rc < 0)
        return rc;
    ucp_config_t *cfg;
    ucs_status_t st = c->api.ucp_config_read(NULL, NULL, &cfg);
    if (st != UCS_OK)
        return ucx_err(c, st, "wf_comm_create: ucp_config_read");
    /* Always name the devices: UCX otherwise advertises every interface. */
    st = c->api.ucp_config_modify(cfg, "NET_DEVICES", c->net_devices);
    /* No CMA by default: with UCP_ERR_HANDLING_MODE_NONE, a peer that dies during a CMA
     * rendezvous makes UCX abort the survivor (cma_ep.c: process_vm_readv failed, fatal;
     * measured in test_failure.c). Shared memory (mm) stays. On a loopback rendezvous every
     * rank is on this host: then no TCP either, since UCX would otherwise put its
     * rendezvous protocol on TCP loopback (shared memory without CMA has no zero-copy
     * lane): "tag(sysv/memory tcp/lo)", and 64 KiB messages took 115 us instead of 20-30.
     * Large collectives copy through process_vm_readv themselves (coll.c, ring_cma). An
     * explicit 'tls', or UCX_TLS set by the user for UCX, wins. */
    const struct sockaddr_in *sin = (const struct sockaddr_in *)c->sa;
    bool local = sin && (ntohl(sin->sin_addr.s_addr) >> 24) == 127;
    const char *user_tls = getenv("UCX_TLS");
    const char *tls_used = tls ? tls : user_tls ? user_tls : local ? "sysv,posix,self" : "^cma";
    if (st == UCS_OK && (tls || !user_tls))
        st = c->api.ucp_config_modify(cfg, "TLS", tls_used);
    if (st == UCS_OK)
        st = c->api.ucp_config_modify(cfg, "KEEPALIVE_INTERVAL", "inf");
    /* No PUT zcopy over TCP: when a peer dies while one is waiting for its ack, UCX 1.13
     * asserts in the survivor (tcp_ep.c:939, UCT_TCP_EP_FLAG_PUT_TX_WAITING_ACK) and aborts
     * it: seen in 1 of 3 runs of test_failure.c's TCP kill under load. Rendezvous then uses
     * the other protocols. Only where TCP may be used: UCX warns "invalid configuration:
     * TCP_PUT_ENABLE=n" on every comm whose transports leave TCP out. */
    bool tcp_possible = strstr(tls_used, "tcp") || tls_used[0] == '^' || strstr(tls_used, "all");
    if (st == UCS_OK && tcp_possible)
        st = c->api.ucp_config_modify(cfg, "TCP_PUT_ENABLE", "n");
    if (st != UCS_OK) {
        c->api.ucp_config_release(cfg);
        return wf__err(WF_EINVAL, "wf_comm_create: UCX refused net_devices '%s' or tls '%s': %s",
                       c->net_devices, tls ? tls : "(default)", c->api.ucs_status_string(st));
    }
    ucp_params_t p = {
        .field_mask = UCP_PARAM_FIELD_FEATURES,
        .features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP,
    };
    st = c->api.ucp_init_version(UCP_API_MAJOR, UCP_API_MINOR, &p, cfg, &c->ctx); /* ucp_init() */
    c->api.ucp_config_release(cfg);
    if (st != UCS_OK)
        return ucx_err(c, st, "wf_comm_create: ucp_init");
    ucp_worker_params_t wp = {
        .field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
        .thread_mode = UCS_THREAD_MODE_MULTI,
    };
    if ((st = c->api.ucp_worker_create(c->ctx, &wp, &c->worker)) != UCS_OK)
        return ucx_err(c, st, "wf_comm_create: ucp_worker_create");
    ucp_worker_attr_t wa = { .field_mask = UCP_WORKER_ATTR_FIELD_THREAD_MODE };
    if ((st = c->api.ucp_worker_query(c->worker, &wa)) != UCS_OK)
        return ucx_err(c, st, "wf_comm_create: ucp_worker_query");
    if (wa.thread_mode != UCS_THREAD_MODE_MULTI)
        return wf__err(WF_EDEVICE, "wf_comm_create: this UCX has no multi-threaded workers");
    if ((st = c->api.ucp_worker_get_efd(c->worker, &c->efd)) != UCS_OK)
        return ucx_err(c, st, "wf_comm_create: ucp_worker_get_efd");
    if ((st = c->api.ucp_worker_get_address(c->worker, &c->my_addr, &c->my_addr_len)) != UCS_OK)
        return ucx_err(c, st, "wf_comm_create: ucp_worker_get_address");
    if (c->my_addr_len > WF__UCX_ADDR_MAX)
        return wf__err(WF_EDEVICE, "wf_comm_create: UCX worker address of %zu bytes, above %d",
                       c->my_addr_len, WF__UCX_ADDR_MAX);
    (void)wf__ucx_progress_arm(c); /* no endpoint yet: nothing can keep it BUSY */
    return 0;
}

int wf__ucx_connect(wf_comm *c)
{
    for (int r = 0; r < c->size; r++) {
        ucp_ep_params_t ep = {
            .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
            .address = (const ucp_address_t *)c->peers[r].addr,
            .err_mode = UCP_ERR_HANDLING_MODE_NONE,
        };
        ucs_status_t st = c->api.ucp_ep_create(c->worker, &ep, &c->peers[r].ep);
        if (st != UCS_OK)
            return wf__err(WF_EDEVICE, "wf_comm_create: UCX endpoint to rank %d (host %s): %s", r,
                           c->peers[r].host, c->api.ucs_status_string(st));
    }
    return 0;
}

bool wf__ucx_progress_arm(wf_comm *c)
{
    /* Bounded: the caller is "weft-net", which must get back to its loop (failure detection,
     * stop requests). A send queued for a dead shared-memory peer, whose FIFO nobody drains
     * any more, keeps the worker's arm BUSY for ever; draining to 0 and arming again in a
     * loop until it is not BUSY held "weft-net" there, and wf_comm_destroy() hung joining it
     * (test_failure.c, the bucket kill under TSan). */
    for (int round = 0; round < ARM_ROUNDS; round++) {
        for (int i = 0; i < ARM_DRAIN && c->api.ucp_worker_progress(c->worker) != 0; i++) {
        }
        ucs_status_t st = c->api.ucp_worker_arm(c->worker);
        if (st != UCS_ERR_BUSY)
            return st == UCS_OK;
    }
    return false;
}

void wf__ucx_fini(wf_comm *c)
{
    if (!c->worker)
        goto ctx;
    /* FORCE: peers may be gone (and the goodbye round already ordered everything); it
     * completes every outstanding request of the endpoint with UCS_ERR_CANCELED, which frees
     * the orphans waiting on them. Every endpoint is closed first and then all are waited
     * for, 1 s in all (not 1 s each: destroying a failed comm must stay quick). */
    uint64_t end = wf__net_now_ns() + 1000000000u;
    for (int r = 0; c->peers && r < c->size; r++) {
        c->peers[r].close_req = NULL;
        if (!c->peers[r].ep)
            continue;
        ucp_request_param_t prm = { .op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                                    .flags = UCP_EP_CLOSE_FLAG_FORCE };
        ucs_status_ptr_t req = c->api.ucp_ep_close_nbx(c->peers[r].ep, &prm);
        if (UCS_PTR_IS_PTR(req))
            c->peers[r].close_req = req;
        c->peers[r].ep = NULL;
    }
    for (int r = 0; c->peers && r < c->size; r++) {
        void *req = c->peers[r].close_req;
        if (!req)
            continue;
        while (c->api.ucp_request_check_status(req) == UCS_INPROGRESS && wf__net_now_ns() < end)
            c->api.ucp_worker_progress(c->worker);
        c->api.ucp_request_free(req);
        c->peers[r].close_req = NULL;
    }
    /* Orphaned receives belong to the worker: cancel them. */
    pthread_mutex_lock(&c->mu);
    wf_comm_req *o = c->orphans;
    pthread_mutex_unlock(&c->mu);
    for (; o; o = o->next_orphan)
        if (o->ureq && !atomic_load(&o->done))
            c->api.ucp_request_cancel(c->worker, o->ureq);
    /* Drain what the cancels completed; bounded, since a dead peer's events may not end. */
    for (int i = 0; i < 4096 && c->api.ucp_worker_progress(c->worker) != 0; i++) {
    }
    if (c->my_addr)
        c->api.ucp_worker_release_address(c->worker, c->my_addr);
    c->api.ucp_worker_destroy(c->worker);
    c->worker = NULL;
    c->my_addr = NULL;
    /* Whatever is still orphaned now can never complete: its UCX request went with the
     * worker. */
    while (c->orphans) {
        wf_comm_req *r = c->orphans;
        c->orphans = r->next_orphan;
        free(r);
    }
ctx:
    if (c->ctx)
        c->api.ucp_cleanup(c->ctx);
    c->ctx = NULL;
}

/* ---- Requests ----------------------------------------------------------------------------- */

static void complete(wf_comm_req *r, void *ureq, ucs_status_t st, size_t length)
{
    wf_comm *c = r->c;
    /* Another rank's call descriptor: compared before the waiter can see it done (and move
     * on to the next collective), so that a mismatched collective fails every rank at once
     * instead of waiting for messages that never come (coll.c). */
    if (r->desc && r->is_recv && st == UCS_OK && length == r->bytes)
        wf__coll_desc_arrived(c, r);
    int status = 0;
    if (st == UCS_OK && r->is_recv && length != r->bytes)
        status = WF_EFORMAT;
    else if (st == UCS_ERR_MESSAGE_TRUNCATED)
        status = WF_EFORMAT;
    else if (st == UCS_ERR_CANCELED)
        status = WF_ECANCELED;
    else if (st != UCS_OK)
        status = WF_EDEVICE;
    bool free_now = false;
    if (!r->is_recv && ureq)
        atomic_fetch_sub(&c->sends_in_flight, 1);
    if (r->on_done) { /* posted (post.c): the actor finishes it, nobody waits */
        /* UCX's request goes here, on the thread that made the progress ("weft-net"), not
         * in the actor's finish on a worker: its free takes the UCX worker's spin lock,
         * which "weft-net" may hold, preempted, on that worker's core. Done under 'mu', the
         * request is never canceled (post.c, wf__post_cancel) nor stored (post_ucx) again;
         * one being canceled ('orphan': "cancel asked") stays for its finish, since
         * wf__post_cancel() calls UCX with it after letting go of 'mu'. */
        pthread_mutex_lock(&c->mu);
        bool keep = r->orphan;
        if (!keep)
            r->ureq = NULL;
        r->status = status;
        r->ust = st;
        r->info.length = length;
        atomic_store_explicit(&r->done, true, memory_order_release);
        pthread_mutex_unlock(&c->mu);
        if (ureq && !keep)
            c->api.ucp_request_free(ureq);
        wf__post_completed(r);
        return;
    }
    pthread_mutex_lock(&c->mu);
    r->status = status;
    r->ust = st;
    r->info.length = length;
    atomic_store_explicit(&r->done, true, memory_order_release);
    if (r->orphan) {
        for (wf_comm_req **pp = &c->orphans; *pp; pp = &(*pp)->next_orphan)
            if (*pp == r) {
                *pp = r->next_orphan;
                break;
            }
        free_now = true;
    }
    if (c->sleepers)
        pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    if (free_now) {
        if (ureq)
            c->api.ucp_request_free(ureq);
        free(r);
    }
}

static void on_send(void *ureq, ucs_status_t st, void *user)
{
    complete(user, ureq, st, 0);
}

static void on_recv(void *ureq, ucs_status_t st, const ucp_tag_recv_info_t *info, void *user)
{
    complete(user, ureq, st, info ? info->length : 0);
}

/* UCX reported an error on the way to 'peer' (UCX 1.13 says "Endpoint timeout" when a
 * shared-memory peer died). */
static int peer_error(wf_comm *c, int peer, const char *what, ucs_status_t st)
{
    char why[96];
    snprintf(why, sizeof why, "UCX: %s", c->api.ucs_status_string(st));
    return wf__peer_fail(c, peer, what, why);
}

int wf__peer_fail(wf_comm *c, int peer, const char *what, const char *why)
{
    /* The control plane usually knows why within milliseconds (the dead process's socket
     * closes): wait up to 500 ms for its verdict, which names the rank and says "died";
     * else blame the peer with the transport's words. */
    uint64_t end = wf__net_now_ns() + 500000000u;
    pthread_mutex_lock(&c->mu);
    while (!atomic_load(&c->failed) && wf__net_now_ns() < end) {
        uint64_t until = wf__net_now_ns() + 10000000u;
        struct timespec ts = { .tv_sec = (time_t)(until / 1000000000u),
                               .tv_nsec = (long)(until % 1000000000u) };
        pthread_cond_timedwait(&c->cv, &c->mu, &ts);
    }
    pthread_mutex_unlock(&c->mu);
    if (!atomic_load(&c->failed))
        wf__comm_fail(c, WF_EPEER, peer, "rank %d (host %s, pid %u) unreachable: rank %d: %s: %s",
                      peer, c->peers[peer].host, c->peers[peer].pid, c->rank, what, why);
    return wf__comm_failed(c);
}

/* Hands request 'r' (filled by the caller) to UCX. */
static int post_ucx(wf_comm *c, wf_comm_req *r, int peer, uint64_t body, void *buf, size_t bytes,
                    bool is_recv)
{
    r->c = c;
    r->peer = peer;
    r->is_recv = is_recv;
    r->key = body;
    r->bytes = bytes;
    static const uint8_t empty[1]; /* a valid address for 0-byte messages */
    if (!buf)
        buf = (void *)empty;
    ucp_request_param_t prm = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
        .user_data = r,
    };
    ucs_status_ptr_t p;
    if (is_recv) {
        /* No immediate completion: UCX 1.13 leaves 'recv_info' unfilled when a receive
         * matches an unexpected message at once (measured: length 0), and the size check
         * needs the length, which the callback does give. */
        prm.op_attr_mask |= UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
        prm.cb.recv = on_recv;
        uint64_t tag = make_tag(body, peer, c->peers[peer].incarnation);
        p = c->api.ucp_tag_recv_nbx(c->worker, buf, bytes, tag, UINT64_MAX, &prm);
    } else {
        prm.cb.send = on_send;
        uint64_t tag = make_tag(body, c->rank, c->incarnation);
        p = c->api.ucp_tag_send_nbx(c->peers[peer].ep, buf, bytes, tag, &prm);
    }
    if (UCS_PTR_IS_ERR(p)) {
        /* The transport broke: fail the comm, so no rank waits for this message. */
        char what[96];
        snprintf(what, sizeof what, "%s rank %d (%zu bytes)", is_recv ? "receive from" : "send to",
                 peer, bytes);
        return peer_error(c, peer, what, UCS_PTR_STATUS(p));
    }
    if (p == NULL) {                  /* completed at once; the callback is not called */
        complete(r, NULL, UCS_OK, 0); /* sends only: receives never complete at once */
    } else {
        if (!is_recv) /* before its callback can run: that needs a later progress call */
            atomic_fetch_add(&c->sends_in_flight, 1);
        if (r->on_done) { /* its completion may have run on another thread already */
            pthread_mutex_lock(&c->mu);
            if (!atomic_load_explicit(&r->done, memory_order_relaxed))
                r->ureq = p; /* else complete() freed it */
            pthread_mutex_unlock(&c->mu);
        } else {
            r->ureq = p;
        }
    }
    return 0;
}

int wf__post_ucx(wf_comm *c, wf_comm_req *r, int peer, uint64_t body, void *buf, size_t bytes,
                 bool is_recv)
{
    return post_ucx(c, r, peer, body, buf, bytes, is_recv);
}

static int post_as(wf_comm *c, int peer, uint64_t body, void *buf, size_t bytes, bool is_recv,
                   bool desc, wf_comm_req **out)
{
    *out = NULL;
    wf_comm_req *r = calloc(1, sizeof *r);
    if (!r)
        return wf__err(WF_ENOMEM, "wf_comm: no memory for a request");
    r->desc = desc; /* before UCX can complete it */
    r->buf = buf;
    int rc = post_ucx(c, r, peer, body, buf, bytes, is_recv);
    if (rc < 0) {
        free(r);
        return rc;
    }
    *out = r;
    return 0;
}

static int post(wf_comm *c, int peer, uint64_t body, void *buf, size_t bytes, bool is_recv,
                wf_comm_req **out)
{
    return post_as(c, peer, body, buf, bytes, is_recv, false, out);
}

int wf__irecv_desc(wf_comm *c, int peer, uint64_t body, void *buf, size_t bytes, wf_comm_req **out)
{
    return post_as(c, peer, body, buf, bytes, true, true, out);
}

int wf__isend(wf_comm *c, int peer, uint64_t body, const void *buf, size_t bytes, wf_comm_req **out)
{
    return post(c, peer, body, (void *)buf, bytes, false, out);
}

int wf__irecv(wf_comm *c, int peer, uint64_t body, void *buf, size_t bytes, wf_comm_req **out)
{
    return post(c, peer, body, buf, bytes, true, out);
}

void wf__req_describe(const wf_comm_req *r, char *s, size_t n)
{
    const wf__peer *p = &r->c->peers[r->peer];
    snprintf(s, n, "%s rank %d (host %s, pid %u), %s %#llx, %zu bytes",
             r->is_recv ? "receive from" : "send to", r->peer, p->host, p->pid,
             (r->key & WF__TAG_COLL) ? "collective tag" : "key",
             (unsigned long long)(r->key & ~WF__TAG_COLL), r->bytes);
}

void wf__req_free(wf_comm_req *r)
{
    if (r->ureq)
        r->c->api.ucp_request_free(r->ureq);
    free(r);
}

static void free_req(wf_comm_req *r)
{
    wf__req_free(r);
}

/* The comm failed or the wait timed out: cancel 'r' and free it, or leave it as an orphan
 * that its completion (or wf_comm_destroy()) frees. */
static void give_up(wf_comm_req *r)
{
    wf_comm *c = r->c;
    if (!atomic_load_explicit(&r->done, memory_order_acquire) && r->ureq) {
        /* An unmatched receive is canceled at once. A matched one (a rendezvous under way)
         * cannot be, and UCX writes into its buffer until the message is complete; a send
         * under way still reads its buffer. Both buffers are the caller's, free to go once
         * we return: seen under TSan, a bucket's buffer written by "weft-net" (rendezvous
         * data of a live rank) after wf_comm_bucket_destroy() freed it. So while the peer
         * is alive (not the rank that failed) let the transfer finish, within GRACE_NS per
         * failure of the comm (shared: a ring has many chunks). From the failed rank only
         * what it sent before it died can come: drain it for 2 ms. A send to the failed
         * rank is not waited for: it never completes (FORCE-closing its endpoint in
         * wf_comm_destroy() does it). */
        c->api.ucp_request_cancel(c->worker, r->ureq);
        uint64_t now = wf__net_now_ns(), end = now + 2000000u; /* 2 ms */
        pthread_mutex_lock(&c->mu);
        bool alive = c->failed_rank != r->peer;
        pthread_mutex_unlock(&c->mu);
        if (!alive && !r->is_recv)
            end = now;
        if (alive) {
            uint64_t grace = 0, mine = now + GRACE_NS;
            /* The first waiter to give up starts the grace; the others share it. */
            if (atomic_compare_exchange_strong(&c->grace_end, &grace, mine))
                grace = mine;
            if (grace > end)
                end = grace;
        }
        while (!atomic_load_explicit(&r->done, memory_order_acquire) && wf__net_now_ns() < end)
            c->api.ucp_worker_progress(c->worker);
    }
    pthread_mutex_lock(&c->mu);
    bool done = atomic_load_explicit(&r->done, memory_order_acquire);
    if (!done) {
        r->orphan = true;
        r->next_orphan = c->orphans;
        c->orphans = r;
    }
    pthread_mutex_unlock(&c->mu);
    if (done)
        free_req(r);
}

void wf__busy_begin(wf_comm *c)
{
    atomic_fetch_add(&c->busy, 1);
}

void wf__busy_end(wf_comm *c)
{
    atomic_fetch_sub(&c->busy, 1);
}

int wf__wait(wf_comm_req *r, uint64_t deadline_ns, const char *what)
{
    wf_comm *c = r->c;
    uint64_t start = wf__net_now_ns();
    uint64_t spin_ns = c->spin_us == UINT32_MAX ? UINT64_MAX : (uint64_t)c->spin_us * 1000u;
    /* Busy mode: poll without sleeping for up to WF__BUSY_NS (a wake-up through the event
     * fd, "weft-net" and the condition variable costs tens of microseconds, more than a
     * small all-reduce). Past it, leave busy mode for the rest of this wait, so that
     * "weft-net" watches the event fd again and this thread may sleep. */
    bool busy = atomic_load_explicit(&c->busy, memory_order_relaxed) > 0;
    if (busy && spin_ns < WF__BUSY_NS)
        spin_ns = WF__BUSY_NS;
    bool left_busy = false;
    unsigned idle = 0, progressed = 0;
    while (!atomic_load_explicit(&r->done, memory_order_acquire)) {
        if (busy) {
            /* The hot path: one progress call per check, and a yield every few idle ones
             * so that a peer sharing this core (an oversubscribed host) gets to send: else
             * each exchange waits for the end of a time slice (measured: 30-60 us instead
             * of 2 us per 4 KiB all-reduce on a loaded 2-core machine). Progress can also
             * go on without end (events of a dead peer's endpoint): every 64 progressing
             * calls fall through to the failure and deadline checks below, else a killed
             * rank could leave this loop spinning past every deadline. */
            if (c->api.ucp_worker_progress(c->worker) != 0) {
                idle = 0;
                if (++progressed % 64 != 0 && !atomic_load(&c->failed))
                    continue;
            } else {
                if (++idle % 16 != 0 && !atomic_load(&c->failed))
                    continue;
                sched_yield();
            }
        }
        if (atomic_load(&c->failed))
            break;
        uint64_t now = wf__net_now_ns();
        if (now >= deadline_ns) {
            char d[200];
            wf__req_describe(r, d, sizeof d);
            wf__comm_fail(c, WF_ETIMEDOUT, r->peer, "%s%srank %d: no progress within %llu ms: %s",
                          what ? what : "", what ? ": " : "", c->rank,
                          (unsigned long long)((now - start) / 1000000u), d);
            break;
        }
        /* Sends in flight: a shared-memory sender whose fragments wait for room in the
         * peer's FIFO gets no event when room appears, so it polls 2 ms longer and then
         * sleeps in 1 ms slices instead of 100 ms ones (bounded stall, bounded CPU: a send
         * whose receiver is busy elsewhere must not burn a core). Receives raise events. */
        bool sending = atomic_load(&c->sends_in_flight) > 0;
        if (now - start < spin_ns || (sending && now - start < spin_ns + 2000000u)) {
            if (!busy)
                c->api.ucp_worker_progress(c->worker);
            continue;
        }
        if (busy) {
            busy = false;
            left_busy = true;
            wf__busy_end(c);
        }
        /* Arm before sleeping: BUSY means events are pending, so progress again. Once armed,
         * "weft-net" (asleep in epoll on the event fd) drains whatever arrives. */
        if (c->api.ucp_worker_arm(c->worker) == UCS_ERR_BUSY) {
            c->api.ucp_worker_progress(c->worker);
            continue;
        }
        uint64_t until = deadline_ns, slice = sending ? 1000000u : 100000000u;
        if (until - now > slice) /* a slice: also a safety net for a lost wake-up */
            until = now + slice;
        struct timespec ts = { .tv_sec = (time_t)(until / 1000000000u),
                               .tv_nsec = (long)(until % 1000000000u) };
        pthread_mutex_lock(&c->mu);
        if (!atomic_load_explicit(&r->done, memory_order_acquire) && !atomic_load(&c->failed)) {
            c->sleepers++;
            pthread_cond_timedwait(&c->cv, &c->mu, &ts);
            c->sleepers--;
        }
        pthread_mutex_unlock(&c->mu);
        c->api.ucp_worker_progress(c->worker);
    }
    if (left_busy)
        wf__busy_begin(c); /* left busy mode above: back in it for the caller's next wait */
    if (!atomic_load_explicit(&r->done, memory_order_acquire)) {
        int rc = wf__comm_failed(c);
        give_up(r);
        return rc;
    }
    int status = r->status; /* written under mu before 'done' (release) */
    size_t got = r->info.length;
    if (status == WF_ECANCELED && atomic_load(&c->failed)) {
        free_req(r);
        return wf__comm_failed(c);
    }
    if (status == WF_EDEVICE) {
        char d[200];
        wf__req_describe(r, d, sizeof d);
        int peer = r->peer;
        ucs_status_t ust = r->ust;
        free_req(r);
        return peer_error(c, peer, d, ust);
    }
    if (status == WF_EFORMAT && (r->key & WF__TAG_COLL) && wf__coll_settle(c) < 0) {
        free_req(r); /* a mismatched call: its message says more than the size */
        return wf__comm_failed(c);
    }
    if (status < 0) {
        char d[200];
        wf__req_describe(r, d, sizeof d);
        if (status == WF_EFORMAT)
            wf__err(status, "%s%s%s: the message %s the buffer (got %zu bytes)", what ? what : "",
                    what ? ": " : "", d, got > r->bytes ? "is larger than" : "does not fill", got);
        else
            wf__err(status, "%s%s%s: %s", what ? what : "", what ? ": " : "", d,
                    status == WF_ECANCELED ? "canceled" : "UCX reported an error");
    }
    free_req(r);
    return status;
}

int wf__wait_all(wf_comm_req **rs, size_t n, uint64_t deadline_ns, const char *what)
{
    int first = 0;
    char msg[WF_ERRMSG_MAX] = "";
    for (size_t i = 0; i < n; i++) {
        if (!rs[i])
            continue;
        wf_comm *c = rs[i]->c;
        int rc = wf__wait(rs[i], deadline_ns, what);
        rs[i] = NULL;
        if (rc < 0 && first == 0) {
            first = rc;
            snprintf(msg, sizeof msg, "%s", wf_last_errmsg());
            /* A collective that went wrong on one rank must not hang the others. */
            if (!atomic_load(&c->failed))
                wf__comm_fail(c, rc, c->rank, "rank %d: %s", c->rank, msg);
        }
    }
    if (first)
        wf__err(first, "%s", msg);
    return first;
}

/* ---- Public point-to-point ------------------------------------------------------------------ */

static int check_p2p(const char *fn, wf_comm *c, int peer, uint64_t key, const void *buf,
                     size_t bytes, wf_comm_req **out)
{
    if (out)
        *out = NULL;
    if (!c || !out)
        return wf__err(WF_EINVAL, "%s: NULL %s", fn, c ? "out" : "comm");
    if (peer < 0 || peer >= c->size)
        return wf__err(WF_EINVAL, "%s: peer %d out of range 0..%d", fn, peer, c->size - 1);
    if (key & ~TAG_KEY_MASK)
        return wf__err(WF_EINVAL, "%s: key %#llx is not below 2^%d", fn, (unsigned long long)key,
                       WF_COMM_KEY_BITS);
    if (!buf && bytes)
        return wf__err(WF_EINVAL, "%s: NULL buffer for %zu bytes", fn, bytes);
    return wf__comm_failed(c);
}

/* A public send or receive, recorded by the flight recorder from its post to its wait. */
static int p2p_post(const char *fn, wf_comm *c, int peer, uint64_t key, void *buf, size_t bytes,
                    bool is_recv, wf_comm_req **out)
{
    int rc = check_p2p(fn, c, peer, key, buf, bytes, out);
    if (rc < 0)
        return rc;
    uint64_t ticket = wf__flight_begin(c, &(wf__fent){ .kind = is_recv ? WF__K_RECV : WF__K_SEND,
                                                       .key = key,
                                                       .bytes = bytes,
                                                       .count = bytes,
                                                       .peer = peer,
                                                       .state = WF__FS_POSTED });
    rc = post(c, peer, key, buf, bytes, is_recv, out);
    if (rc < 0)
        wf__flight_set(c, ticket, WF__FS_FAILED, rc);
    else
        (*out)->flight = ticket;
    return rc;
}

int wf_comm_isend(wf_comm *c, int peer, uint64_t key, const void *buf, size_t bytes,
                  wf_comm_req **out)
{
    return p2p_post("wf_comm_isend", c, peer, key, (void *)buf, bytes, false, out);
}

int wf_comm_irecv(wf_comm *c, int peer, uint64_t key, void *buf, size_t bytes, wf_comm_req **out)
{
    return p2p_post("wf_comm_irecv", c, peer, key, buf, bytes, true, out);
}

int wf_comm_wait(wf_comm_req *r)
{
    if (!r)
        return wf__err(WF_EINVAL, "wf_comm_wait: NULL request");
    wf_comm *c = r->c;
    uint64_t ticket = r->flight; /* 'r' is freed by the wait */
    wf__flight_set(c, ticket, WF__FS_WAITING, 0);
    int rc = wf__wait(r, wf__net_now_ns() + (uint64_t)c->op_timeout_ms * 1000000u, "wf_comm_wait");
    wf__flight_set(c, ticket, rc < 0 ? WF__FS_FAILED : WF__FS_DONE, rc);
    return rc;
}

int wf_comm_test(wf_comm_req *r)
{
    if (!r)
        return wf__err(WF_EINVAL, "wf_comm_test: NULL request");
    if (!atomic_load_explicit(&r->done, memory_order_acquire))
        r->c->api.ucp_worker_progress(r->c->worker);
    return atomic_load_explicit(&r->done, memory_order_acquire) || atomic_load(&r->c->failed);
}

int wf_comm_send(wf_comm *c, int peer, uint64_t key, const void *buf, size_t bytes)
{
    wf_comm_req *r;
    int rc = wf_comm_isend(c, peer, key, buf, bytes, &r);
    return rc < 0 ? rc : wf_comm_wait(r);
}

int wf_comm_recv(wf_comm *c, int peer, uint64_t key, void *buf, size_t bytes)
{
    wf_comm_req *r;
    int rc = wf_comm_irecv(c, peer, key, buf, bytes, &r);
    if (rc < 0)
        return rc;
    wf__busy_begin(c); /* a blocking receive polls for itself (internal.h, busy mode) */
    rc = wf_comm_wait(r);
    wf__busy_end(c);
    return rc;
}
