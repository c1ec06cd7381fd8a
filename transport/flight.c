/* transport/flight.c: the flight recorder: each comm's ring of its last WF__FLIGHT_OPS
 * collectives, public point-to-point operations and graph transfers (a session's dp_reduce,
 * send and recv nodes: wf__flight_node), and its JSON Lines dump.
 * Owns: struct wf__flight (internal.h), the caller's tag and the dump format documented at
 * wf_comm_flight_dump() in <weft/transport.h>.
 * Invariant: an entry is written only under the recorder's 'mu', which is held for a few
 * stores (never across I/O or UCX), so a dump taken from any thread while operations run
 * sees whole entries; the file is built in memory and written after 'mu' is released.
 * Cost: two lock/unlock pairs and two coarse clock reads per operation (measured by
 * perf/transport/flight_bench.c, recorder on against off; see transport/README.md).
 * Not here: when operations start and end (coll.c, ucx.c, coll_ops.c, p2p_ops.c), merging the dumps
 * of a job (tools/flight_verdict.c). */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *const kind_names[WF__K_COUNT] = {
    "collective", "allreduce", "reduce_scatter", "allgather", "broadcast",
    "barrier",    "send",      "recv",           "dp_reduce",
};

static const char *const state_names[] = { "posted", "waiting", "done", "failed" };

/* The recorder's clock: CLOCK_MONOTONIC_COARSE (a few ms of resolution, enough to say who
 * waited how long), since a plain CLOCK_MONOTONIC read cost ~500 ns on this VM (twice per
 * operation: more than the rest of a one-rank collective), the coarse one ~5 ns idle and
 * ~120 ns at a load average of 23. */
static uint64_t flight_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

const char *wf__kind_name(unsigned kind)
{
    return kind_names[kind < WF__K_COUNT ? kind : WF__K_NONE];
}

int wf__flight_init(wf_comm *c, const wf_comm_opts *o)
{
    wf__flight *f = calloc(1, sizeof *f);
    if (!f)
        return wf__err(WF_ENOMEM, "wf_comm_create: no memory for the flight recorder");
    if (o->flight_dir && !(f->dir = strdup(o->flight_dir))) {
        free(f);
        return wf__err(WF_ENOMEM, "wf_comm_create: no memory for the flight recorder");
    }
    pthread_mutex_init(&f->mu, NULL);
    f->on = !o->flight_off;
    c->flight = f;
    return 0;
}

void wf__flight_fini(wf_comm *c)
{
    if (!c->flight)
        return;
    pthread_mutex_destroy(&c->flight->mu);
    free(c->flight->dir);
    free(c->flight);
    c->flight = NULL;
}

uint64_t wf__flight_begin(wf_comm *c, const wf__fent *e)
{
    wf__flight *f = c->flight;
    if (!f || !f->on)
        return 0;
    uint64_t now = flight_now();
    pthread_mutex_lock(&f->mu);
    uint64_t ticket = ++f->n;
    wf__fent *d = &f->ent[(ticket - 1) % WF__FLIGHT_OPS];
    *d = *e;
    if (e->kind == WF__K_SEND || e->kind == WF__K_RECV)
        d->seq = ++f->p2p_seq;
    d->t0 = now;
    d->t1 = 0;
    if (!e->tag[0])
        memcpy(d->tag, f->tag, sizeof d->tag);
    pthread_mutex_unlock(&f->mu);
    return ticket;
}

uint64_t wf__flight_node(wf_comm *c, unsigned kind, uint64_t key, uint64_t bytes, uint64_t count,
                         int peer, const char *node, int edge, uint64_t run)
{
    if (!c->flight || !c->flight->on)
        return 0;
    wf__fent e = { .seq = kind == WF__K_DP_REDUCE ? (run << 15 | ((uint64_t)edge & 0x7fff)) + 1 : 0,
                   .key = key,
                   .bytes = bytes,
                   .count = count,
                   .peer = peer,
                   .kind = (uint8_t)kind,
                   .state = WF__FS_WAITING,
                   .dtype = (uint8_t)WF_F32 };
    snprintf(e.tag, sizeof e.tag, "%s, run %llu", node ? node : "?", (unsigned long long)run);
    return wf__flight_begin(c, &e);
}

void wf__flight_set(wf_comm *c, uint64_t ticket, int state, int rc)
{
    wf__flight *f = c->flight;
    if (!ticket || !f)
        return;
    uint64_t now = state >= WF__FS_DONE ? flight_now() : 0;
    pthread_mutex_lock(&f->mu);
    if (f->n - ticket < WF__FLIGHT_OPS) { /* not overwritten since */
        wf__fent *d = &f->ent[(ticket - 1) % WF__FLIGHT_OPS];
        d->state = (uint8_t)state;
        d->rc = rc;
        if (now)
            d->t1 = now;
    }
    pthread_mutex_unlock(&f->mu);
}

int wf_comm_set_tag(wf_comm *c, const char *tag)
{
    if (!c)
        return wf__err(WF_EINVAL, "wf_comm_set_tag: NULL comm");
    wf__flight *f = c->flight;
    pthread_mutex_lock(&f->mu);
    memset(f->tag, 0, sizeof f->tag);
    if (tag)
        strncpy(f->tag, tag, sizeof f->tag - 1);
    pthread_mutex_unlock(&f->mu);
    return 0;
}

int wf_comm_set_graph_hash(wf_comm *c, uint64_t hash)
{
    if (!c)
        return wf__err(WF_EINVAL, "wf_comm_set_graph_hash: NULL comm");
    atomic_store(&c->graph_hash, hash);
    return 0;
}

/* ---- The dump ------------------------------------------------------------------------ */

typedef struct sbuf {
    char *p;
    size_t len, cap;
    bool oom;
} sbuf;

static void put(sbuf *b, const char *fmt, ...) WF_PRINTF(2, 3);

static void put(sbuf *b, const char *fmt, ...)
{
    for (int tries = 0; tries < 2 && !b->oom; tries++) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = true;
            return;
        }
        if ((size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap * 2 + (size_t)n + 1;
        char *q = realloc(b->p, cap);
        if (!q) {
            b->oom = true;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
}

/* A JSON string: quotes, backslashes and control bytes escaped; other bytes as they are. */
static void put_json_str(sbuf *b, const char *s)
{
    put(b, "\"");
    for (; *s && !b->oom; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            put(b, "\\%c", ch);
        else if (ch < 0x20)
            put(b, "\\u%04x", ch);
        else
            put(b, "%c", ch);
    }
    put(b, "\"");
}

static void put_entry(sbuf *b, const wf__fent *e)
{
    put(b,
        "{\"seq\":%llu,\"op\":\"%s\",\"key\":%llu,\"bytes\":%llu,\"count\":%llu,\"dtype\":\"%s\"",
        (unsigned long long)e->seq, wf__kind_name(e->kind), (unsigned long long)e->key,
        (unsigned long long)e->bytes, (unsigned long long)e->count,
        e->kind == WF__K_ALLREDUCE || e->kind == WF__K_REDUCE_SCATTER || e->kind == WF__K_DP_REDUCE
            ? wf_dtype_name((wf_dtype)e->dtype)
            : "u8");
    put(b, ",\"peer\":%d,\"state\":\"%s\",\"t_start_ns\":%llu,\"t_end_ns\":%llu,\"rc\":%d,\"tag\":",
        (int)e->peer, state_names[e->state & 3], (unsigned long long)e->t0,
        (unsigned long long)e->t1, (int)e->rc);
    char tag[WF__FLIGHT_TAG];
    memcpy(tag, e->tag, sizeof tag);
    tag[sizeof tag - 1] = 0;
    put_json_str(b, tag);
    put(b, "}\n");
}

/* Writes all of 'p' to 'path' through a temporary file renamed into place, so a reader never
 * sees half a record. */
static int write_file(const char *path, const char *p, size_t len)
{
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid()) >= (int)sizeof tmp)
        return wf__err(WF_EINVAL, "wf_comm_flight_dump: path '%s' is too long", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return wf__err(WF_EIO, "wf_comm_flight_dump: cannot create %s: %s", tmp, strerror(errno));
    size_t off = 0;
    while (off < len) {
        ssize_t n = write(fd, p + off, len - off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            int e = errno;
            close(fd);
            unlink(tmp);
            return wf__err(WF_EIO, "wf_comm_flight_dump: writing %s: %s", tmp, strerror(e));
        }
        off += (size_t)n;
    }
    if (close(fd) != 0 || rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return wf__err(WF_EIO, "wf_comm_flight_dump: cannot write %s: %s", path, strerror(e));
    }
    return 0;
}

int wf__flight_write(wf_comm *c, const char *path)
{
    wf__flight *f = c->flight;
    char def[4096];
    if (!path) {
        if (!f->dir)
            return wf__err(WF_EINVAL, "wf_comm_flight_dump: no path and no flight_dir");
        if (snprintf(def, sizeof def, "%s/flight.rank%d.jsonl", f->dir, c->rank) >= (int)sizeof def)
            return wf__err(WF_EINVAL, "wf_comm_flight_dump: flight_dir '%s' is too long", f->dir);
        path = def;
    }
    /* Copy the ring out under the lock; format without it. */
    wf__fent *copy = malloc(sizeof f->ent);
    if (!copy)
        return wf__err(WF_ENOMEM, "wf_comm_flight_dump: out of memory");
    pthread_mutex_lock(&f->mu);
    uint64_t n = f->n, first = n > WF__FLIGHT_OPS ? n - WF__FLIGHT_OPS : 0;
    for (uint64_t i = first; i < n; i++)
        copy[i - first] = f->ent[i % WF__FLIGHT_OPS];
    pthread_mutex_unlock(&f->mu);
    uint64_t now = flight_now();
    pthread_mutex_lock(&c->mu);
    int code = c->fail_code; /* leads 'failed': the failure dump runs between the two */
    pthread_mutex_unlock(&c->mu);
    sbuf b = { 0 };
    put(&b, "{\"flight\":1,\"rank\":%d,\"size\":%d,\"host\":", c->rank, c->size);
    put_json_str(&b, c->host);
    put(&b, ",\"pid\":%d,\"incarnation\":%u,\"failed\":", (int)getpid(), c->incarnation);
    if (code) {
        put_json_str(&b, wf_err_name(code));
        put(&b, ",\"reason\":");
        put_json_str(&b, c->failmsg); /* written once, before 'failed' (internal.h) */
    } else {
        put(&b, "null,\"reason\":\"\"");
    }
    put(&b, ",\"now_ns\":%llu,\"ops\":%llu}\n", (unsigned long long)now,
        (unsigned long long)(n - first));
    for (uint64_t i = 0; i < n - first; i++)
        put_entry(&b, &copy[i]);
    free(copy);
    int rc = b.oom ? wf__err(WF_ENOMEM, "wf_comm_flight_dump: out of memory")
                   : write_file(path, b.p, b.len);
    free(b.p);
    return rc;
}

int wf_comm_flight_dump(wf_comm *c, const char *path)
{
    if (!c)
        return wf__err(WF_EINVAL, "wf_comm_flight_dump: NULL comm");
    if (!c->flight->on)
        return wf__err(WF_EINVAL, "wf_comm_flight_dump: rank %d: the recorder is off (flight_off)",
                       c->rank);
    return wf__flight_write(c, path);
}

void wf__flight_on_fail(wf_comm *c)
{
    wf__flight *f = c->flight;
    if (!f || !f->on || !f->dir)
        return;
    pthread_mutex_lock(&f->mu);
    bool first = !f->dumped;
    f->dumped = true;
    pthread_mutex_unlock(&f->mu);
    if (!first)
        return;
    /* Failing is already under way and has its own message: keep it, whatever the dump says. */
    char keep[WF_ERRMSG_MAX];
    snprintf(keep, sizeof keep, "%s", wf_last_errmsg());
    pthread_mutex_lock(&c->mu);
    int code = c->fail_code;
    pthread_mutex_unlock(&c->mu);
    if (wf__flight_write(c, NULL) < 0)
        fprintf(stderr, "weft: rank %d: flight record not written: %s\n", c->rank,
                wf_last_errmsg());
    wf__err(code, "%s", keep);
}
