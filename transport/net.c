/* transport/net.c: the control plane: rendezvous, control barriers, heartbeats, orderly
 * shutdown and failure detection, on a libuv loop run by the thread "weft-net".
 * Why a thread of its own and not a weft actor watching the loop's fd: the control plane
 * is the health channel. It must answer heartbeats and notice a dead peer while every
 * worker of the runtime is busy in a long kernel (or when the program has no runtime at
 * all); an actor would only run when a worker is free, so a compute-bound rank would look
 * dead to the others. The thread sleeps in epoll (libuv's backend) and wakes only for a
 * frame, a heartbeat tick (heartbeat_ms), a caller's request (uv_async: also a posted
 * transfer to hand to UCX, post.c) or the UCX worker's event fd (polling the worker every
 * millisecond instead while a caller is busy or the worker cannot be armed: see on_rearm).
 * The same reason makes it the one driver of posted transfers' progress: their rendezvous
 * must move while every worker runs a long kernel. No handler
 * loops until UCX is quiet: this thread must always get back to its loop, which is where
 * dead peers are seen.
 * Topology: a star. Rank 0 accepts one connection per rank; a failure seen by anyone is
 * sent to rank 0 as a FAIL frame and relayed by it to every rank, so every rank learns of
 * it within milliseconds (a killed process's socket is closed by its kernel).
 * Owns: the sockets, their read buffers and pending writes, the timers.
 * Invariants: see internal.h (libuv handles are touched only here, on this thread, once
 * it has started; callers talk to it through 'want_*' fields under 'mu' and 'wake').
 * Not here: the frame codec (frame.c), UCX (ucx.c). */
#include "internal.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct wreq {
    uv_write_t req;
    uint8_t *p;
} wreq;

static void on_written(uv_write_t *req, int status)
{
    wreq *w = (wreq *)req;
    free(w->p);
    free(w);
}

/* Sends a built frame on 'k' (takes w->p). A write to a closing connection is dropped. */
static void send_frame(wf__conn *k, wf__wbuf *w)
{
    if (wf__wbuf_end(w) < 0)
        return; /* out of memory: the heartbeat timeout will tell */
    wreq *r = malloc(sizeof *r);
    if (!r || !k || k->closing) {
        free(r);
        free(w->p);
        return;
    }
    r->p = w->p;
    uv_buf_t b = uv_buf_init((char *)w->p, (unsigned)w->len);
    if (uv_write(&r->req, (uv_stream_t *)&k->tcp, &b, 1, on_written) != 0) {
        free(r->p);
        free(r);
    }
}

static void send_simple(wf__conn *k, uint16_t type)
{
    wf__wbuf w;
    wf__wbuf_begin(&w, type);
    send_frame(k, &w);
}

static void send_u32(wf__conn *k, uint16_t type, uint32_t v)
{
    wf__wbuf w;
    wf__wbuf_begin(&w, type);
    wf__wbuf_u32(&w, v);
    send_frame(k, &w);
}

static void send_reason(wf__conn *k, uint16_t type, int rank, int code, const char *reason)
{
    wf__wbuf w;
    wf__wbuf_begin(&w, type);
    if (type == WF__F_FAIL) {
        wf__wbuf_u32(&w, (uint32_t)rank);
        wf__wbuf_u32(&w, (uint32_t)code);
    }
    size_t n = strlen(reason);
    wf__wbuf_str(&w, reason, n > WF__REASON_MAX ? WF__REASON_MAX : n);
    send_frame(k, &w);
}

static void on_conn_closed(uv_handle_t *h)
{
    wf__conn *k = h->data;
    free(k->rbuf);
    free(k);
}

static void conn_close(wf__conn *k)
{
    if (k->closing)
        return;
    k->closing = true;
    wf_comm *c = k->c;
    for (wf__conn **pp = &c->conns; *pp; pp = &(*pp)->next)
        if (*pp == k) {
            *pp = k->next;
            break;
        }
    if (c->rank == 0 && k->rank > 0 && c->peers[k->rank].conn == k)
        c->peers[k->rank].conn = NULL;
    if (c->rank == 0 && k->rank < 0 && k->accepted_ns)
        c->n_strangers--;
    if (c->to_root == k)
        c->to_root = NULL;
    uv_close((uv_handle_t *)&k->tcp, on_conn_closed);
}

static wf__conn *conn_new(wf_comm *c)
{
    wf__conn *k = calloc(1, sizeof *k);
    if (!k)
        return NULL;
    k->c = c;
    k->rank = -1;
    k->last_seen_ns = wf__net_now_ns();
    if (uv_tcp_init(&c->loop, &k->tcp) != 0) {
        free(k);
        return NULL;
    }
    k->tcp.data = k;
    uv_tcp_nodelay(&k->tcp, 1);
    k->next = c->conns;
    c->conns = k;
    return k;
}

/* ---- Failure ---------------------------------------------------------------------------- */

uint64_t wf__net_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int comm_vfail(wf_comm *c, int code, int rank, bool quiet, const char *fmt, va_list ap)
{
    pthread_mutex_lock(&c->mu);
    bool first = c->fail_code == 0;
    bool up = c->phase >= WF__PH_READY;
    if (first) {
        vsnprintf(c->failmsg, sizeof c->failmsg, fmt, ap);
        c->failed_rank = rank;
        c->fail_quiet = quiet;
        c->fail_code = code;
    } else if (!quiet) {
        c->fail_quiet = false; /* a real failure after a quiet one: now everyone hears */
    }
    /* A later failure waits until the first is published, so that 'failed' is set once any
     * wf__comm_fail() returns (callers read it, through wf__comm_failed(), right after).
     * The first one's thread only writes a file meanwhile and calls neither UCX nor this. */
    while (!first && atomic_load(&c->failed) == 0)
        pthread_cond_wait(&c->cv, &c->mu);
    int rc = c->fail_code;
    pthread_mutex_unlock(&c->mu);
    /* The flight record first, before anyone hears of the failure: neither this rank's
     * caller (which may return, leave and exit at once, and a launcher that sees it exit
     * stops the others) nor the other ranks; and only once the comm was up (a failed
     * rendezvous has nothing to record). Meanwhile 'failed' still reads 0. */
    if (first && up)
        wf__flight_on_fail(c);
    pthread_mutex_lock(&c->mu);
    if (first)
        atomic_store(&c->failed, code);
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    /* Let the net thread tell the others (a no-op once it has stopped), and the actor fail
     * every posted request. */
    wf__net_kick(c);
    wf__post_kick(c);
    return rc;
}

int wf__comm_fail(wf_comm *c, int code, int rank, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = comm_vfail(c, code, rank, false, fmt, ap);
    va_end(ap);
    return rc;
}

int wf__comm_fail_quiet(wf_comm *c, int code, int rank, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = comm_vfail(c, code, rank, true, fmt, ap);
    va_end(ap);
    return rc;
}

int wf__comm_failed(const wf_comm *c)
{
    int rc = atomic_load(&c->failed);
    if (rc)
        wf__err(rc, "%s", c->failmsg); /* written once, before 'failed' (internal.h) */
    return rc;
}

static const char *peer_host(const wf_comm *c, int r)
{
    return c->peers[r].host[0] ? c->peers[r].host : "?";
}

/* ---- Rank 0: rendezvous, barriers, goodbyes ------------------------------------------- */

static void send_welcome(wf_comm *c)
{
    wf__wbuf w;
    wf__wbuf_begin(&w, WF__F_WELCOME);
    wf__wbuf_u32(&w, (uint32_t)c->size);
    for (int r = 0; r < c->size; r++) {
        wf__peer *p = &c->peers[r];
        wf__wbuf_u32(&w, p->incarnation);
        wf__wbuf_u32(&w, p->pid);
        wf__wbuf_str(&w, p->host, strlen(p->host));
        wf__wbuf_blob(&w, p->addr, p->addr_len);
    }
    if (wf__wbuf_end(&w) < 0) {
        wf__comm_fail(c, WF_ENOMEM, 0, "wf_comm_create: no memory for the address table");
        return;
    }
    size_t len = w.len;
    for (int r = 1; r < c->size; r++) {
        wf__wbuf copy = { .p = malloc(len), .len = len, .cap = len };
        if (!copy.p)
            continue;
        memcpy(copy.p, w.p, len);
        /* send_frame() refills the length it already has. */
        send_frame(c->peers[r].conn, &copy);
    }
    free(w.p);
}

static void start_heartbeats(wf_comm *c);

static void root_check_barrier(wf_comm *c)
{
    pthread_mutex_lock(&c->mu);
    uint32_t seq = c->want_seq;
    bool go = seq > c->released_seq && c->phase >= WF__PH_READY;
    for (int r = 1; go && r < c->size; r++)
        go = c->rank_seq[r] >= seq;
    if (go) {
        c->released_seq = seq;
        pthread_cond_broadcast(&c->cv);
    }
    pthread_mutex_unlock(&c->mu);
    if (go)
        for (int r = 1; r < c->size; r++)
            send_u32(c->peers[r].conn, WF__F_RELEASE, seq);
}

static void root_check_bye(wf_comm *c)
{
    pthread_mutex_lock(&c->mu);
    bool go = c->want_bye && c->n_bye == c->size - 1 && c->phase == WF__PH_READY;
    if (go) {
        c->phase = WF__PH_LEFT;
        pthread_cond_broadcast(&c->cv);
    }
    pthread_mutex_unlock(&c->mu);
    if (go)
        for (int r = 1; r < c->size; r++)
            send_simple(c->peers[r].conn, WF__F_BYE);
}

/* Rank 'rank' left in order after 'n' collectives: tells every other rank (a LEFT frame),
 * then fails this rank's comm if it waits in a collective the leaver never joined. */
static void root_left(wf_comm *c, int rank, uint32_t n)
{
    for (int r = 1; r < c->size; r++)
        if (r != rank && c->peers[r].conn) {
            wf__wbuf w;
            wf__wbuf_begin(&w, WF__F_LEFT);
            wf__wbuf_u32(&w, (uint32_t)rank);
            wf__wbuf_u32(&w, n);
            send_frame(c->peers[r].conn, &w);
        }
    if (rank != 0)
        wf__coll_left(c, rank, n);
}

static void root_hello(wf__conn *k, const wf__frame *f)
{
    wf_comm *c = k->c;
    char err[WF__REASON_MAX];
    wf__hello h;
    int rc = wf__hello_decode(f->payload, f->len, c->size, c->token, &h, err, sizeof err);
    if (rc == 0 && c->peers[h.rank].registered) {
        wf__peer *p = &c->peers[h.rank];
        snprintf(err, sizeof err, "rank %u already joined (host %s, pid %u)", h.rank, p->host,
                 p->pid);
        rc = WF_EPEER;
    }
    if (rc == 0 && c->phase != WF__PH_CONNECTING) {
        snprintf(err, sizeof err, "rank %u: the rendezvous is over", h.rank);
        rc = WF_EPEER;
    }
    uint8_t *addr = NULL;
    if (rc == 0 && !(addr = malloc(h.addr_len))) {
        snprintf(err, sizeof err, "rank %u: out of memory", h.rank);
        rc = WF_ENOMEM;
    }
    if (rc < 0) {
        /* A stranger, or a rank of another job: refused, the others are not disturbed. */
        send_reason(k, WF__F_REJECT, 0, rc, err);
        conn_close(k);
        return;
    }
    wf__peer *p = &c->peers[h.rank];
    memcpy(addr, h.addr, h.addr_len);
    p->addr = addr;
    p->addr_len = h.addr_len;
    p->pid = h.pid;
    p->incarnation = h.incarnation;
    snprintf(p->host, sizeof p->host, "%s", h.host);
    p->registered = true;
    p->conn = k;
    k->rank = (int)h.rank;
    c->n_strangers--; /* a rank now, no longer a stranger (conn_close) */
    if (++c->n_registered == c->size - 1) {
        send_welcome(c);
        pthread_mutex_lock(&c->mu);
        c->phase = WF__PH_READY;
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->mu);
        uv_timer_stop(&c->connect_timer);
        start_heartbeats(c);
    }
}

/* ---- Ranks > 0 ------------------------------------------------------------------------- */

static int client_welcome(wf_comm *c, const wf__frame *f, char *err, size_t errlen)
{
    wf__rbuf r = { .p = f->payload, .len = f->len };
    uint32_t n = wf__rbuf_u32(&r);
    if (r.bad || n != (uint32_t)c->size) {
        snprintf(err, errlen, "WELCOME: %u ranks, expected %d", n, c->size);
        return WF_EFORMAT;
    }
    for (int i = 0; i < c->size; i++) {
        wf__peer *p = &c->peers[i];
        p->incarnation = wf__rbuf_u32(&r);
        p->pid = wf__rbuf_u32(&r);
        size_t nh, na;
        const uint8_t *h = wf__rbuf_str(&r, WF__HOST_MAX, &nh);
        const uint8_t *a = wf__rbuf_blob(&r, WF__UCX_ADDR_MAX, &na);
        if (r.bad || na == 0) {
            snprintf(err, errlen, "WELCOME: entry of rank %d truncated or empty", i);
            return WF_EFORMAT;
        }
        memcpy(p->host, h, nh);
        p->host[nh] = 0;
        for (size_t j = 0; j < nh; j++)
            if (p->host[j] < 0x20 || p->host[j] > 0x7e)
                p->host[j] = '?';
        if (i == c->rank)
            continue; /* our own address stays the one we have */
        free(p->addr);
        if (!(p->addr = malloc(na))) {
            snprintf(err, errlen, "WELCOME: out of memory");
            return WF_ENOMEM;
        }
        memcpy(p->addr, a, na);
        p->addr_len = na;
    }
    if (r.off != r.len) {
        snprintf(err, errlen, "WELCOME: %zu trailing bytes", r.len - r.off);
        return WF_EFORMAT;
    }
    return 0;
}

/* ---- Frames ----------------------------------------------------------------------------- */

/* Which frame types each side accepts, checked on the header, before the payload is
 * buffered: a client cannot make rank 0 buffer a WELCOME-sized frame. */
static bool allowed(const wf__conn *k, uint16_t type)
{
    if (k->c->rank == 0) {
        if (k->rank < 0)
            return type == WF__F_HELLO;
        return type == WF__F_BARRIER || type == WF__F_HEARTBEAT || type == WF__F_BYE ||
               type == WF__F_FAIL;
    }
    return type == WF__F_WELCOME || type == WF__F_REJECT || type == WF__F_RELEASE ||
           type == WF__F_HEARTBEAT || type == WF__F_BYE || type == WF__F_FAIL || type == WF__F_LEFT;
}

static void protocol_error(wf__conn *k, const char *err)
{
    wf_comm *c = k->c;
    if (c->rank == 0 && k->rank < 0) {
        conn_close(k); /* a stranger: refused quietly */
        return;
    }
    int r = c->rank == 0 ? k->rank : 0;
    wf__comm_fail(c, WF_EPEER, r, "rank %d (host %s, pid %u) broke the control protocol: %s", r,
                  peer_host(c, r), c->peers[r].pid, err);
    conn_close(k);
}

static void handle_frame(wf__conn *k, const wf__frame *f)
{
    wf_comm *c = k->c;
    char err[WF__REASON_MAX + 64];
    k->last_seen_ns = wf__net_now_ns();
    switch (f->type) {
    case WF__F_HELLO:
        root_hello(k, f);
        return;
    case WF__F_WELCOME: {
        pthread_mutex_lock(&c->mu);
        int phase = c->phase;
        pthread_mutex_unlock(&c->mu);
        if (phase != WF__PH_CONNECTING) {
            protocol_error(k, "a second WELCOME");
            return;
        }
        int rc = client_welcome(c, f, err, sizeof err);
        if (rc < 0) {
            protocol_error(k, err);
            return;
        }
        pthread_mutex_lock(&c->mu);
        c->phase = WF__PH_READY;
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->mu);
        uv_timer_stop(&c->connect_timer);
        start_heartbeats(c);
        return;
    }
    case WF__F_REJECT: {
        wf__rbuf r = { .p = f->payload, .len = f->len };
        size_t n;
        const uint8_t *s = wf__rbuf_str(&r, WF__REASON_MAX, &n);
        wf__comm_fail(c, WF_EPEER, 0, "rank 0 at %s refused us: %.*s", c->addr_str, s ? (int)n : 0,
                      s ? (const char *)s : "");
        conn_close(k);
        return;
    }
    case WF__F_BARRIER:
    case WF__F_RELEASE: {
        wf__rbuf r = { .p = f->payload, .len = f->len };
        uint32_t seq = wf__rbuf_u32(&r);
        if (r.bad) {
            protocol_error(k, "short barrier frame");
            return;
        }
        if (f->type == WF__F_BARRIER) {
            c->rank_seq[k->rank] = seq;
            root_check_barrier(c);
        } else {
            pthread_mutex_lock(&c->mu);
            if (seq > c->released_seq)
                c->released_seq = seq;
            pthread_cond_broadcast(&c->cv);
            pthread_mutex_unlock(&c->mu);
        }
        return;
    }
    case WF__F_HEARTBEAT:
        return;
    case WF__F_BYE:
        if (c->rank == 0) {
            wf__rbuf r = { .p = f->payload, .len = f->len };
            uint32_t n = wf__rbuf_u32(&r);
            if (r.bad || r.off != r.len) {
                protocol_error(k, "malformed BYE frame");
                return;
            }
            k->bye_seen = true;
            if (!c->peers[k->rank].said_bye) {
                c->peers[k->rank].said_bye = true;
                pthread_mutex_lock(&c->mu);
                c->n_bye++;
                pthread_mutex_unlock(&c->mu);
                root_left(c, k->rank, n);
            }
            root_check_bye(c);
        } else {
            k->bye_seen = true;
            pthread_mutex_lock(&c->mu);
            c->phase = WF__PH_LEFT;
            pthread_cond_broadcast(&c->cv);
            pthread_mutex_unlock(&c->mu);
        }
        return;
    case WF__F_LEFT: {
        wf__rbuf r = { .p = f->payload, .len = f->len };
        uint32_t rank = wf__rbuf_u32(&r), n = wf__rbuf_u32(&r);
        if (r.bad || r.off != r.len || rank >= (uint32_t)c->size) {
            protocol_error(k, "malformed LEFT frame");
            return;
        }
        wf__coll_left(c, (int)rank, n);
        return;
    }
    case WF__F_FAIL: {
        wf__rbuf r = { .p = f->payload, .len = f->len };
        uint32_t rank = wf__rbuf_u32(&r);
        int code = (int)wf__rbuf_u32(&r);
        size_t n;
        const uint8_t *s = wf__rbuf_str(&r, WF__REASON_MAX, &n);
        if (r.bad || r.off != r.len || rank >= (uint32_t)c->size) {
            protocol_error(k, "malformed FAIL frame");
            return;
        }
        if (code != WF_ETIMEDOUT)
            code = WF_EPEER;
        wf__comm_fail(c, code, (int)rank, "%.*s", (int)n, (const char *)s);
        return;
    }
    default:
        protocol_error(k, "unexpected frame type");
    }
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    wf__conn *k = h->data;
    if (k->rcap - k->rlen < 65536) {
        size_t cap = k->rlen + 65536;
        uint8_t *p = realloc(k->rbuf, cap);
        if (!p) {
            *buf = uv_buf_init(NULL, 0); /* libuv reports UV_ENOBUFS to on_read */
            return;
        }
        k->rbuf = p;
        k->rcap = cap;
    }
    *buf = uv_buf_init((char *)k->rbuf + k->rlen, (unsigned)(k->rcap - k->rlen));
}

static void on_retry(uv_timer_t *t);

/* Ranks > 0: whether the rendezvous is still on (no WELCOME, no failure, no stop). */
static bool rendezvous_retry(wf_comm *c)
{
    pthread_mutex_lock(&c->mu);
    bool again = c->phase == WF__PH_CONNECTING && !atomic_load(&c->failed) && !c->want_stop;
    pthread_mutex_unlock(&c->mu);
    return again;
}

static void on_eof(wf__conn *k, const char *why)
{
    wf_comm *c = k->c;
    char where[64];
    wf__coll_where(c, where, sizeof where);
    if (c->rank == 0) {
        int r = k->rank;
        if (r > 0 && !c->peers[r].said_bye)
            wf__comm_fail(c, WF_EPEER, r,
                          "rank %d (host %s, pid %u) died: control connection %s (rank 0 is at "
                          "%s)",
                          r, peer_host(c, r), c->peers[r].pid, why, where);
    } else if (k == c->to_root && rendezvous_retry(c)) {
        /* Closed before WELCOME without a REJECT: rank 0 had too many connections without
         * a HELLO (on_accept). Try again, until the connect timer fires. */
        conn_close(k);
        uv_timer_start(&c->retry_timer, on_retry, 100, 0);
        return;
    } else if (!k->bye_seen) {
        wf__comm_fail(c, WF_EPEER, 0,
                      "rank 0 (host %s, pid %u, %s) died: control connection %s (rank %d is at "
                      "%s)",
                      peer_host(c, 0), c->peers[0].pid, c->addr_str, why, c->rank, where);
    }
    conn_close(k);
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    wf__conn *k = s->data;
    if (k->closing)
        return;
    if (nread < 0) {
        on_eof(k, nread == UV_EOF ? "closed" : uv_strerror((int)nread));
        return;
    }
    k->rlen += (size_t)nread;
    size_t off = 0;
    while (!k->closing) {
        wf__frame f;
        size_t used;
        char err[160];
        int rc = wf__frame_parse(k->rbuf + off, k->rlen - off, &f, &used, err, sizeof err);
        if (rc < 0 || (f.type && !allowed(k, f.type))) {
            if (rc >= 0)
                snprintf(err, sizeof err, "frame type %u not expected here", f.type);
            protocol_error(k, err);
            return;
        }
        if (rc == 0)
            break;
        handle_frame(k, &f);
        off += used;
    }
    if (k->closing)
        return;
    memmove(k->rbuf, k->rbuf + off, k->rlen - off);
    k->rlen -= off;
}

/* ---- Connections --------------------------------------------------------------------------- */

/* Closes the connections that have not presented a valid HELLO within hello_timeout_ms
 * of being accepted, and runs again at the next such deadline (stopped while there is
 * none). A stranger that sends nothing, only the magic, a HELLO one byte a second or a
 * partial payload is closed the same way, and the ranks never notice. */
static void on_hello_timer(uv_timer_t *t)
{
    wf_comm *c = t->data;
    uint64_t now = wf__net_now_ns(), limit = (uint64_t)c->hello_timeout_ms * 1000000u;
    uint64_t next = UINT64_MAX;
    for (wf__conn *k = c->conns, *after; k; k = after) {
        after = k->next; /* conn_close() unlinks 'k' */
        if (k->rank >= 0 || !k->accepted_ns || k->closing)
            continue;
        if (now - k->accepted_ns >= limit)
            conn_close(k);
        else if (k->accepted_ns + limit < next)
            next = k->accepted_ns + limit;
    }
    if (next != UINT64_MAX)
        uv_timer_start(t, on_hello_timer, (next - now) / 1000000u + 1, 0);
}

static void on_accept(uv_stream_t *server, int status)
{
    wf_comm *c = server->data;
    if (status < 0)
        return;
    wf__conn *k = conn_new(c);
    if (!k)
        return;
    if (uv_accept(server, (uv_stream_t *)&k->tcp) != 0) {
        conn_close(k);
        return;
    }
    /* Beyond WF__STRANGERS_MAX connections without a HELLO, the newest is closed at once:
     * accepted (else it would fill the backlog) and dropped. A rank refused so retries. */
    if (c->n_strangers >= WF__STRANGERS_MAX) {
        conn_close(k);
        return;
    }
    c->n_strangers++;
    k->accepted_ns = wf__net_now_ns();
    if (!uv_is_active((uv_handle_t *)&c->hello_timer))
        uv_timer_start(&c->hello_timer, on_hello_timer, c->hello_timeout_ms, 0);
    if (uv_read_start((uv_stream_t *)&k->tcp, on_alloc, on_read) != 0)
        conn_close(k);
}

static void try_connect(wf_comm *c);

static void on_retry(uv_timer_t *t)
{
    try_connect(t->data);
}

static void send_hello(wf_comm *c, wf__conn *k)
{
    wf__wbuf w;
    wf__wbuf_begin(&w, WF__F_HELLO);
    wf__wbuf_u32(&w, (uint32_t)c->rank);
    wf__wbuf_u32(&w, (uint32_t)c->size);
    wf__wbuf_u32(&w, c->incarnation);
    wf__wbuf_u32(&w, c->peers[c->rank].pid);
    wf__wbuf_str(&w, c->token, strlen(c->token));
    wf__wbuf_str(&w, c->host, strlen(c->host));
    wf__wbuf_blob(&w, c->my_addr, c->my_addr_len);
    send_frame(k, &w);
}

static void on_connect(uv_connect_t *req, int status)
{
    wf__conn *k = req->data;
    wf_comm *c = k->c;
    free(req);
    if (k->closing)
        return;
    if (status < 0) {
        /* Rank 0 may not listen yet: try again soon, until the connect timer fires. */
        conn_close(k);
        if (rendezvous_retry(c))
            uv_timer_start(&c->retry_timer, on_retry, 20, 0);
        return;
    }
    c->to_root = k;
    k->rank = 0;
    if (uv_read_start((uv_stream_t *)&k->tcp, on_alloc, on_read) != 0) {
        conn_close(k);
        return;
    }
    send_hello(c, k);
}

static void try_connect(wf_comm *c)
{
    wf__conn *k = conn_new(c);
    uv_connect_t *req = malloc(sizeof *req);
    if (!k || !req) {
        free(req);
        if (k)
            conn_close(k);
        uv_timer_start(&c->retry_timer, on_retry, 100, 0);
        return;
    }
    req->data = k;
    if (uv_tcp_connect(req, &k->tcp, (const struct sockaddr *)c->sa, on_connect) != 0) {
        free(req);
        conn_close(k);
        uv_timer_start(&c->retry_timer, on_retry, 100, 0);
    }
}

/* ---- Timers ----------------------------------------------------------------------------- */

static void on_connect_timeout(uv_timer_t *t)
{
    wf_comm *c = t->data;
    pthread_mutex_lock(&c->mu);
    bool late = c->phase == WF__PH_CONNECTING;
    pthread_mutex_unlock(&c->mu);
    if (!late)
        return;
    if (c->rank == 0) {
        char missing[256] = "";
        size_t n = 0;
        for (int r = 1; r < c->size && n + 16 < sizeof missing; r++)
            if (!c->peers[r].registered)
                n += (size_t)snprintf(missing + n, sizeof missing - n, "%s%d", n ? ", " : "", r);
        wf__comm_fail(c, WF_ETIMEDOUT, -1,
                      "wf_comm_create: after %u ms, %d of %d ranks had not joined %s (missing: "
                      "%s)",
                      c->connect_timeout_ms, c->size - 1 - c->n_registered, c->size, c->addr_str,
                      missing);
    } else {
        wf__comm_fail(c, WF_ETIMEDOUT, 0,
                      "wf_comm_create: rank %d could not join rank 0 at %s within %u ms "
                      "(%s)",
                      c->rank, c->addr_str, c->connect_timeout_ms,
                      c->to_root ? "connected, but no WELCOME: some rank is missing"
                                 : "no server answered");
    }
}

static void on_heartbeat(uv_timer_t *t)
{
    wf_comm *c = t->data;
    uint64_t now = wf__net_now_ns(), limit = (uint64_t)c->hb_timeout_ms * 1000000u;
    if (c->rank == 0) {
        for (int r = 1; r < c->size; r++) {
            wf__conn *k = c->peers[r].conn;
            if (!k || c->peers[r].said_bye)
                continue;
            send_simple(k, WF__F_HEARTBEAT);
            if (now - k->last_seen_ns > limit) {
                wf__comm_fail(c, WF_EPEER, r,
                              "rank %d (host %s, pid %u) silent for %llu ms: missed heartbeats "
                              "(heartbeat_timeout_ms %u)",
                              r, peer_host(c, r), c->peers[r].pid,
                              (unsigned long long)((now - k->last_seen_ns) / 1000000u),
                              c->hb_timeout_ms);
                conn_close(k);
            }
        }
    } else if (c->to_root) {
        wf__conn *k = c->to_root;
        send_simple(k, WF__F_HEARTBEAT);
        if (!k->bye_seen && now - k->last_seen_ns > limit) {
            wf__comm_fail(c, WF_EPEER, 0,
                          "rank 0 (host %s, pid %u) silent for %llu ms: missed heartbeats "
                          "(heartbeat_timeout_ms %u)",
                          peer_host(c, 0), c->peers[0].pid,
                          (unsigned long long)((now - k->last_seen_ns) / 1000000u),
                          c->hb_timeout_ms);
            conn_close(k);
        }
    }
}

static void start_heartbeats(wf_comm *c)
{
    uint64_t now = wf__net_now_ns();
    for (wf__conn *k = c->conns; k; k = k->next)
        k->last_seen_ns = now;
    uv_timer_start(&c->hb_timer, on_heartbeat, c->hb_ms, c->hb_ms);
}

static void on_efd(uv_poll_t *p, int status, int events);
static void on_rearm(uv_timer_t *t);

/* Stops watching the event fd and looks at the worker every millisecond instead (on_rearm). */
static void pause_poll(wf_comm *c)
{
    if (c->poll_paused)
        return;
    uv_poll_stop(&c->efd_poll);
    c->poll_paused = true;
    uv_timer_start(&c->rearm_timer, on_rearm, 1, 1);
}

/* The poll is paused while a caller is busy (wf__busy_begin), or while the worker cannot be armed
 * (wf__ucx_progress_arm gave up: events keep coming, or a send to a dead peer keeps it
 * BUSY): look every millisecond whether that is over, then drain, arm and watch the event fd
 * again once arming works. Never loop here until it does: this thread must get back to its
 * loop, which sees dead peers and stop requests. */
static void on_rearm(uv_timer_t *t)
{
    wf_comm *c = t->data;
    if (atomic_load(&c->busy) > 0 || !c->poll_paused)
        return;
    if (!wf__ucx_progress_arm(c))
        return; /* the timer looks again in a millisecond */
    c->poll_paused = false;
    uv_timer_stop(&c->rearm_timer);
    uv_poll_start(&c->efd_poll, UV_READABLE, on_efd);
}

static void on_efd(uv_poll_t *p, int status, int events)
{
    wf_comm *c = p->data;
    /* A caller busy polling the worker itself: waking up here for its completions would only
     * cost it a core and the worker's lock. The fd stays readable (level triggered), so stop
     * watching it until the caller is done. */
    if (atomic_load(&c->busy) > 0 || !wf__ucx_progress_arm(c))
        pause_poll(c);
}

/* The launcher's pipe (wf_comm_opts.launcher_fd) is readable: its end of file (or an
 * error) means the launcher died, and the comm fails, which every rank then hears of. This
 * does not depend on being the launcher's child (PR_SET_PDEATHSIG does): a rank started by
 * a shell, or by an agent on another host that holds such a pipe, sees it too. */
static void on_launcher(uv_poll_t *p, int status, int events)
{
    wf_comm *c = p->data;
    char b[64];
    ssize_t k = status < 0 ? -1 : read(c->launcher_fd, b, sizeof b);
    if (k > 0 || (k < 0 && status >= 0 && (errno == EAGAIN || errno == EINTR)))
        return; /* bytes (none are sent) or a spurious wake-up */
    uv_poll_stop(p);
    wf__comm_fail(c, WF_EPEER, c->rank,
                  "rank %d: its launcher died (launcher_fd %d: %s); the job is over", c->rank,
                  c->launcher_fd, k == 0 ? "end of file" : "error");
}

/* ---- Requests from callers ------------------------------------------------------------------ */

static void close_handle(uv_handle_t *h)
{
    if (!uv_is_closing(h))
        uv_close(h, NULL);
}

static void on_wake(uv_async_t *a)
{
    wf_comm *c = a->data;
    pthread_mutex_lock(&c->mu);
    bool stop = c->want_stop;
    bool bye = c->want_bye;
    /* The collectives this rank ran: read only once it leaves, when no collective runs. */
    uint32_t colls = bye ? c->coll_seq : 0;
    uint32_t seq = c->want_seq;
    int failed = atomic_load(&c->failed);
    /* Even when stopping: a rank that fails and leaves at once must still tell the others
     * why (the frame is written before the socket is closed). */
    bool tell = failed && !c->fail_quiet && !c->abort_sent;
    if (tell)
        c->abort_sent = true;
    int frank = c->failed_rank;
    pthread_mutex_unlock(&c->mu);

    if (tell) {
        /* Everyone hears of a failure: rank 0 relays it, the others report to rank 0 (which
         * ignores it when it already knows). Not of a quiet one (a collective that a rank
         * which left never joined): every rank hears of the leaver itself, and one still
         * finishing an earlier collective, which the leaver did join, must finish it. */
        if (c->rank == 0) {
            for (int r = 1; r < c->size; r++)
                if (c->peers[r].conn)
                    send_reason(c->peers[r].conn, WF__F_FAIL, frank < 0 ? 0 : frank, failed,
                                c->failmsg);
        } else if (c->to_root) {
            send_reason(c->to_root, WF__F_FAIL, frank < 0 ? c->rank : frank, failed, c->failmsg);
        }
    }
    /* Posted transfers (post.c) go to UCX here, and their progress is made here too (the
     * event fd), never by a worker of the runtime: see wf__post_hand(). */
    bool handed = !stop && wf__post_hand(c);
    if (!stop && failed) /* a failure wakes this thread (comm_vfail): what is posted goes */
        wf__post_cancel(c);
    if (handed && atomic_load(&c->busy) == 0 && !c->poll_paused && !wf__ucx_progress_arm(c))
        pause_poll(c);
    if (stop) {
        while (c->conns)
            conn_close(c->conns);
        if (c->server_open)
            close_handle((uv_handle_t *)&c->server);
        if (c->poll_open)
            close_handle((uv_handle_t *)&c->efd_poll);
        if (c->launcher_open)
            close_handle((uv_handle_t *)&c->launcher_poll);
        close_handle((uv_handle_t *)&c->rearm_timer);
        close_handle((uv_handle_t *)&c->hello_timer);
        close_handle((uv_handle_t *)&c->hb_timer);
        close_handle((uv_handle_t *)&c->connect_timer);
        close_handle((uv_handle_t *)&c->retry_timer);
        close_handle((uv_handle_t *)&c->wake);
        return;
    }
    if (c->rank == 0) {
        if (seq)
            root_check_barrier(c);
        if (bye && !c->left_sent) {
            c->left_sent = true;
            root_left(c, 0, colls);
        }
        if (bye)
            root_check_bye(c);
    } else if (c->to_root) {
        if (seq && c->to_root->rank == 0) {
            /* Send each barrier once: the seq we last sent is remembered in rank_seq[0]. */
            if (c->rank_seq[0] < seq) {
                c->rank_seq[0] = seq;
                send_u32(c->to_root, WF__F_BARRIER, seq);
            }
        }
        if (bye && !c->peers[c->rank].said_bye) {
            c->peers[c->rank].said_bye = true;
            send_u32(c->to_root, WF__F_BYE, colls);
        }
    }
}

void wf__net_kick(wf_comm *c)
{
    /* 'thread_started' is written before the thread exists and cleared after it is joined,
     * both by the thread that owns the comm; other threads only kick while it runs. */
    if (c->thread_started)
        uv_async_send(&c->wake);
}

static void *net_main(void *arg)
{
    wf_comm *c = arg;
    pthread_setname_np(pthread_self(), "weft-net");
    uv_run(&c->loop, UV_RUN_DEFAULT);
    return NULL;
}

int wf__net_start(wf_comm *c)
{
    int rc, code = WF_ESYS;
    if ((rc = uv_loop_init(&c->loop)) != 0)
        return wf__err(WF_ESYS, "wf_comm_create: uv_loop_init: %s", uv_strerror(rc));
    uv_async_init(&c->loop, &c->wake, on_wake);
    c->wake.data = c;
    uv_timer_init(&c->loop, &c->hb_timer);
    uv_timer_init(&c->loop, &c->connect_timer);
    uv_timer_init(&c->loop, &c->retry_timer);
    uv_timer_init(&c->loop, &c->rearm_timer);
    uv_timer_init(&c->loop, &c->hello_timer);
    c->hb_timer.data = c->connect_timer.data = c->retry_timer.data = c->rearm_timer.data = c;
    c->hello_timer.data = c;
    if ((rc = uv_poll_init(&c->loop, &c->efd_poll, c->efd)) == 0) {
        c->poll_open = true;
        c->efd_poll.data = c;
        rc = uv_poll_start(&c->efd_poll, UV_READABLE, on_efd);
    }
    if (rc != 0) {
        wf__err(code, "wf_comm_create: cannot watch the UCX event fd: %s", uv_strerror(rc));
        goto fail;
    }
    if (c->launcher_fd >= 0) {
        if ((rc = uv_poll_init(&c->loop, &c->launcher_poll, c->launcher_fd)) == 0) {
            c->launcher_open = true;
            c->launcher_poll.data = c;
            rc = uv_poll_start(&c->launcher_poll, UV_READABLE | UV_DISCONNECT, on_launcher);
        }
        if (rc != 0) {
            code = WF_EINVAL;
            wf__err(code, "wf_comm_create: cannot watch launcher_fd %d: %s", c->launcher_fd,
                    uv_strerror(rc));
            goto fail;
        }
    }
    if (c->size == 1) {
        c->phase = WF__PH_READY; /* alone: nobody to meet, no port taken */
    } else if (c->rank == 0) {
        uv_tcp_init(&c->loop, &c->server);
        c->server.data = c;
        c->server_open = true;
        if ((rc = uv_tcp_bind(&c->server, (const struct sockaddr *)c->sa, 0)) != 0 ||
            (rc = uv_listen((uv_stream_t *)&c->server, 256, on_accept)) != 0) {
            code = WF_EIO;
            wf__err(code, "wf_comm_create: rank 0 cannot listen on %s: %s", c->addr_str,
                    uv_strerror(rc));
            goto fail;
        }
    } else {
        try_connect(c);
    }
    if (c->size > 1)
        uv_timer_start(&c->connect_timer, on_connect_timeout, c->connect_timeout_ms, 0);
    c->thread_started = true;
    if ((rc = pthread_create(&c->thread, NULL, net_main, c)) != 0) {
        c->thread_started = false;
        wf__err(code, "wf_comm_create: cannot start the weft-net thread: %s", strerror(rc));
        goto fail;
    }
    return 0;
fail : {
    /* Close what was opened and run the loop until the closes are done; keep the message. */
    char msg[WF_ERRMSG_MAX];
    snprintf(msg, sizeof msg, "%s", wf_last_errmsg());
    c->want_stop = true;
    on_wake(&c->wake);
    uv_run(&c->loop, UV_RUN_DEFAULT);
    uv_loop_close(&c->loop);
    return wf__err(code, "%s", msg);
}
}

void wf__net_stop(wf_comm *c)
{
    if (!c->thread_started)
        return;
    pthread_mutex_lock(&c->mu);
    c->want_stop = true;
    pthread_mutex_unlock(&c->mu);
    uv_async_send(&c->wake);
    pthread_join(c->thread, NULL);
    c->thread_started = false;
    uv_loop_close(&c->loop);
}
