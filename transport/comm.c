/* transport/comm.c: creating and destroying a communicator, its options, and the one
 * helper that reads the launcher's or the cluster's environment.
 * Owns: option validation and defaults, the choice of UCX network devices, the order of
 * creation (UCX worker, control plane, rendezvous, endpoints, barrier) and of destruction
 * (goodbye round, control plane, UCX).
 * Not here: the control plane (net.c), UCX requests (ucx.c), collectives (coll.c). */
#include "internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <limits.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define DEFAULT_ADDR "127.0.0.1:29400"

/* Splits "host:port" and resolves it to an IPv4 address. */
static int resolve(wf_comm *c, const char *addr)
{
    const char *colon = strrchr(addr, ':');
    char host[WF__HOST_MAX + 1];
    if (!colon || colon == addr || (size_t)(colon - addr) > WF__HOST_MAX)
        return wf__err(WF_EINVAL, "wf_comm_create: addr '%s' is not host:port", addr);
    memcpy(host, addr, (size_t)(colon - addr));
    host[colon - addr] = 0;
    char *end;
    errno = 0;
    long port = strtol(colon + 1, &end, 10);
    if (errno || *end || end == colon + 1 || port < 1 || port > 65535)
        return wf__err(WF_EINVAL, "wf_comm_create: addr '%s': port must be 1..65535", addr);
    struct addrinfo hints = { .ai_family = AF_INET, .ai_socktype = SOCK_STREAM }, *res = NULL;
    int rc = getaddrinfo(host, colon + 1, &hints, &res);
    if (rc != 0 || !res)
        return wf__err(WF_EIO, "wf_comm_create: cannot resolve '%s': %s", host, gai_strerror(rc));
    c->sa = calloc(1, sizeof *c->sa);
    if (!c->sa) {
        freeaddrinfo(res);
        return wf__err(WF_ENOMEM, "wf_comm_create: out of memory");
    }
    memcpy(c->sa, res->ai_addr, res->ai_addrlen);
    freeaddrinfo(res);
    return 0;
}

/* The interface that carries traffic to rank 0's address: "lo" on loopback, else the
 * interface owning the local address the kernel picks to reach it (a connected UDP socket
 * sends nothing). UCX_NET_DEVICES is always set (UCX otherwise advertises every interface);
 * "all" only if this fails. */
static void pick_net_devices(wf_comm *c)
{
    const struct sockaddr_in *sin = (const struct sockaddr_in *)c->sa;
    snprintf(c->net_devices, sizeof c->net_devices, "all");
    if ((ntohl(sin->sin_addr.s_addr) >> 24) == 127) {
        snprintf(c->net_devices, sizeof c->net_devices, "lo");
        return;
    }
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return;
    struct sockaddr_in local;
    socklen_t len = sizeof local;
    bool ok = connect(fd, (const struct sockaddr *)sin, sizeof *sin) == 0 &&
              getsockname(fd, (struct sockaddr *)&local, &len) == 0;
    close(fd);
    struct ifaddrs *ifs;
    if (!ok || getifaddrs(&ifs) != 0)
        return;
    for (struct ifaddrs *i = ifs; i; i = i->ifa_next)
        if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET &&
            ((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr == local.sin_addr.s_addr) {
            snprintf(c->net_devices, sizeof c->net_devices, "%s", i->ifa_name);
            break;
        }
    freeifaddrs(ifs);
}

static void comm_free(wf_comm *c)
{
#if WF_HAVE_NCCL
    wf__nccl_fini(c);
#endif
    wf__net_stop(c);
    wf__post_fini(c); /* after "weft-net" (no more progress there), before UCX goes */
    wf__ucx_fini(c);
    for (int r = 0; c->peers && r < c->size; r++)
        free(c->peers[r].addr);
    free(c->peers);
    free(c->rank_seq);
    free(c->sa);
    free(c->addr_str);
    free(c->token);
    free(c->scratch);
    free(c->desc_from);
    free(c->desc_rq);
    wf__flight_fini(c);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

/* Waits under 'mu' until 'pred' holds, the comm fails, or 'deadline_ns'. */
#define WAIT_UNTIL(c, pred, deadline_ns)                                                    \
    do {                                                                                    \
        pthread_mutex_lock(&(c)->mu);                                                       \
        while (!(pred) && !atomic_load(&(c)->failed) && wf__net_now_ns() < (deadline_ns)) { \
            uint64_t until_ = wf__net_now_ns() + 100000000u;                                \
            struct timespec ts_ = { .tv_sec = (time_t)(until_ / 1000000000u),               \
                                    .tv_nsec = (long)(until_ % 1000000000u) };              \
            pthread_cond_timedwait(&(c)->cv, &(c)->mu, &ts_);                               \
        }                                                                                   \
        pthread_mutex_unlock(&(c)->mu);                                                     \
    } while (0)

/* A barrier through rank 0's control connections (creation only: collectives use UCX). */
static int ctl_barrier(wf_comm *c, uint32_t seq, uint64_t deadline_ns)
{
    pthread_mutex_lock(&c->mu);
    c->want_seq = seq;
    pthread_mutex_unlock(&c->mu);
    wf__net_kick(c);
    WAIT_UNTIL(c, c->released_seq >= seq, deadline_ns);
    int rc = wf__comm_failed(c);
    if (rc < 0)
        return rc;
    pthread_mutex_lock(&c->mu);
    bool ok = c->released_seq >= seq;
    pthread_mutex_unlock(&c->mu);
    if (!ok)
        return wf__comm_fail(c, WF_ETIMEDOUT, -1,
                             "wf_comm_create: rank %d: the first barrier "
                             "did not complete in time",
                             c->rank);
    return 0;
}

int wf_comm_create(wf_runtime *rt, const wf_comm_opts *o, wf_comm **out)
{
    if (!out)
        return wf__err(WF_EINVAL, "wf_comm_create: NULL out");
    *out = NULL;
    if (!o)
        return wf__err(WF_EINVAL, "wf_comm_create: NULL opts (rank and size are required)");
    if (o->size < 1 || o->size > WF_COMM_MAX_RANKS)
        return wf__err(WF_EINVAL, "wf_comm_create: size %d out of range 1..%d", o->size,
                       WF_COMM_MAX_RANKS);
    if (o->rank < 0 || o->rank >= o->size)
        return wf__err(WF_EINVAL, "wf_comm_create: rank %d out of range 0..%d", o->rank,
                       o->size - 1);
    const char *token = o->token ? o->token : "";
    if (strlen(token) > WF__TOKEN_MAX)
        return wf__err(WF_EINVAL, "wf_comm_create: token of %zu bytes, above %d", strlen(token),
                       WF__TOKEN_MAX);
    if (o->net_devices && strlen(o->net_devices) >= 64)
        return wf__err(WF_EINVAL, "wf_comm_create: net_devices '%s' is too long", o->net_devices);
    if (o->heartbeat_ms && o->heartbeat_timeout_ms && o->heartbeat_timeout_ms <= o->heartbeat_ms)
        return wf__err(WF_EINVAL,
                       "wf_comm_create: heartbeat_timeout_ms %u must exceed "
                       "heartbeat_ms %u",
                       o->heartbeat_timeout_ms, o->heartbeat_ms);
    wf_comm *c = calloc(1, sizeof *c);
    if (!c)
        return wf__err(WF_ENOMEM, "wf_comm_create: out of memory");
    pthread_mutex_init(&c->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&c->cv, &ca);
    pthread_condattr_destroy(&ca);
    c->rt = rt;
    c->rank = o->rank;
    c->size = o->size;
    c->failed_rank = -1;
    c->efd = -1;
    c->timer_fd = -1;
    c->cuda_devices = -1;
    c->connect_timeout_ms = o->connect_timeout_ms ? o->connect_timeout_ms : 30000;
    c->op_timeout_ms = o->op_timeout_ms ? o->op_timeout_ms : 300000;
    c->hb_ms = o->heartbeat_ms ? o->heartbeat_ms : 1000;
    c->hb_timeout_ms = o->heartbeat_timeout_ms ? o->heartbeat_timeout_ms : 10000;
    if (c->hb_timeout_ms <= c->hb_ms)
        c->hb_timeout_ms = c->hb_ms * 3;
    c->spin_us = o->spin_us ? o->spin_us : 50;
    c->hello_timeout_ms = o->hello_timeout_ms ? o->hello_timeout_ms : 5000;
    c->launcher_fd = o->launcher_fd > 0 ? o->launcher_fd : -1;
    c->small_bytes = o->small_bytes ? o->small_bytes : 65536;
    c->chunk_bytes = o->chunk_bytes ? o->chunk_bytes : 262144;
    c->incarnation = o->incarnation;
    if (wf__flight_init(c, o) < 0) {
        pthread_cond_destroy(&c->cv);
        pthread_mutex_destroy(&c->mu);
        free(c);
        return WF_ENOMEM;
    }
    if (!c->incarnation) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        c->incarnation = ((uint32_t)getpid() * 2654435761u) ^ (uint32_t)ts.tv_nsec;
        c->incarnation |= 1;
    }
    if (gethostname(c->host, sizeof c->host - 1) != 0)
        snprintf(c->host, sizeof c->host, "?");
    int rc = 0;
    c->addr_str = strdup(o->addr ? o->addr : DEFAULT_ADDR);
    c->token = strdup(token);
    c->peers = calloc((size_t)c->size, sizeof *c->peers);
    c->rank_seq = calloc((size_t)c->size, sizeof *c->rank_seq);
    c->desc_from = calloc((size_t)c->size, sizeof *c->desc_from);
    c->desc_rq = calloc(2 * (size_t)c->size, sizeof *c->desc_rq);
    if (!c->addr_str || !c->token || !c->peers || !c->rank_seq || !c->desc_from || !c->desc_rq) {
        rc = wf__err(WF_ENOMEM, "wf_comm_create: out of memory");
        goto fail;
    }
    if ((rc = resolve(c, c->addr_str)) < 0)
        goto fail;
    if (o->net_devices)
        snprintf(c->net_devices, sizeof c->net_devices, "%s", o->net_devices);
    else
        pick_net_devices(c);
    if ((rc = wf__ucx_init(c, o->tls)) < 0)
        goto fail;
    wf__peer *me = &c->peers[c->rank];
    snprintf(me->host, sizeof me->host, "%s", c->host);
    me->pid = (uint32_t)getpid();
    me->incarnation = c->incarnation;
    if (!(me->addr = malloc(c->my_addr_len))) {
        rc = wf__err(WF_ENOMEM, "wf_comm_create: out of memory");
        goto fail;
    }
    memcpy(me->addr, c->my_addr, c->my_addr_len);
    me->addr_len = c->my_addr_len;
    if ((rc = wf__net_start(c)) < 0)
        goto fail;
    uint64_t dl = wf__net_now_ns() + ((uint64_t)c->connect_timeout_ms + 2000u) * 1000000u;
    WAIT_UNTIL(c, c->phase >= WF__PH_READY, dl);
    if ((rc = wf__comm_failed(c)) < 0)
        goto fail;
    if ((rc = wf__ucx_connect(c)) < 0)
        goto fail;
    if ((rc = ctl_barrier(c, 1, dl)) < 0)
        goto fail;
    if ((rc = wf__cma_setup(c, o->tls)) < 0)
        goto fail;
    /* The copying ring (between hosts, or over TCP) wants larger chunks than the single-copy
     * one: each chunk is a UCX rendezvous of its own (chunks of 1-4 MiB suit TCP). 16 MiB
     * all-reduces of 2 ranks over TCP loopback, chunks of 4 MiB against 1 MiB in the same
     * session: 1.74-1.91 vs 1.50-1.74 GB/s on a quiet machine, 1.12-1.22 vs 1.03 loaded. */
    if (!o->chunk_bytes && !c->cma)
        c->chunk_bytes = 4u << 20;
    *out = c;
    return 0;
fail : {
    char msg[WF_ERRMSG_MAX];
    snprintf(msg, sizeof msg, "%s", wf_last_errmsg());
    comm_free(c);
    return wf__err(rc, "%s", msg);
}
}

/* The goodbye round's wait: until every rank has left, 'deadline_ns', or a failure that is
 * not quiet (after a quiet one, wf__comm_fail_quiet, the round still runs). */
static void wait_goodbye(wf_comm *c, uint64_t deadline_ns)
{
    pthread_mutex_lock(&c->mu);
    while (c->phase != WF__PH_LEFT && !(atomic_load(&c->failed) && !c->fail_quiet) &&
           wf__net_now_ns() < deadline_ns) {
        uint64_t until = wf__net_now_ns() + 100000000u;
        struct timespec ts = { .tv_sec = (time_t)(until / 1000000000u),
                               .tv_nsec = (long)(until % 1000000000u) };
        pthread_cond_timedwait(&c->cv, &c->mu, &ts);
    }
    pthread_mutex_unlock(&c->mu);
}

void wf_comm_destroy(wf_comm *c)
{
    if (!c)
        return;
    pthread_mutex_lock(&c->mu);
    bool in_order = !atomic_load(&c->failed) || c->fail_quiet;
    pthread_mutex_unlock(&c->mu);
    if (c->size > 1 && in_order) {
        /* The goodbye round: nobody closes its endpoints while another rank may still be
         * sending to it, and nobody reads a closed control connection as a death. Also
         * after a quiet failure (a collective a rank that left never joined). */
        pthread_mutex_lock(&c->mu);
        c->want_bye = true;
        pthread_mutex_unlock(&c->mu);
        wf__net_kick(c);
        uint64_t dl = wf__net_now_ns() + (uint64_t)c->op_timeout_ms * 1000000u;
        wait_goodbye(c, dl);
    }
    comm_free(c);
}

int wf_comm_rank(const wf_comm *c)
{
    return c ? c->rank : wf__err(WF_EINVAL, "wf_comm_rank: NULL comm");
}

int wf_comm_size(const wf_comm *c)
{
    return c ? c->size : wf__err(WF_EINVAL, "wf_comm_size: NULL comm");
}

int wf_comm_status(const wf_comm *c)
{
    return c ? wf__comm_failed(c) : wf__err(WF_EINVAL, "wf_comm_status: NULL comm");
}

/* ---- The environment ------------------------------------------------------------------------ */

static int env_int(const char *name, long lo, long hi, long *out)
{
    const char *s = getenv(name);
    if (!s)
        return 0;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return wf__err(WF_EINVAL, "wf_dist_opts_from_env: %s='%s' is not an integer in %ld..%ld",
                       name, s, lo, hi);
    *out = v;
    return 1;
}

int wf_dist_opts_from_env(wf_comm_opts *opts)
{
    if (!opts)
        return wf__err(WF_EINVAL, "wf_dist_opts_from_env: NULL opts");
    static const char *const pairs[][2] = {
        { "WEFT_RANK", "WEFT_SIZE" },
        { "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE" },
        { "SLURM_PROCID", "SLURM_NTASKS" },
        { "PMI_RANK", "PMI_SIZE" },
    };
    wf_comm_opts o = *opts;
    int found = 0;
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0] && !found; i++) {
        long rank = 0, size = 0; /* read only where env_int() returned 1 and set them */
        int a = env_int(pairs[i][0], 0, WF_COMM_MAX_RANKS - 1, &rank);
        int b = env_int(pairs[i][1], 1, WF_COMM_MAX_RANKS, &size);
        if (a < 0 || b < 0)
            return a < 0 ? a : b;
        if (a == 0 && b == 0)
            continue;
        if (a != b)
            return wf__err(WF_EINVAL, "wf_dist_opts_from_env: %s is set but %s is not",
                           a ? pairs[i][0] : pairs[i][1], a ? pairs[i][1] : pairs[i][0]);
        if (rank >= size)
            return wf__err(WF_EINVAL, "wf_dist_opts_from_env: %s=%ld is not below %s=%ld",
                           pairs[i][0], rank, pairs[i][1], size);
        o.rank = (int)rank;
        o.size = (int)size;
        found = 1;
    }
    long inc;
    int rc = env_int("WEFT_INCARNATION", 0, UINT32_MAX, &inc);
    if (rc < 0)
        return rc;
    if (rc)
        o.incarnation = (uint32_t)inc;
    const char *s;
    if ((s = getenv("WEFT_ADDR")) && *s)
        o.addr = s;
    if ((s = getenv("WEFT_TOKEN")))
        o.token = s;
    if ((s = getenv("WEFT_NET_DEVICES")) && *s)
        o.net_devices = s;
    if ((s = getenv("WEFT_TLS")) && *s)
        o.tls = s;
    if ((s = getenv("WEFT_FLIGHT_DIR")) && *s)
        o.flight_dir = s;
    long lfd;
    if ((rc = env_int("WEFT_LAUNCHER_FD", 1, INT_MAX, &lfd)) < 0)
        return rc;
    if (rc)
        o.launcher_fd = (int)lfd;
    *opts = o;
    return found;
}
