/* placement/cluster.c: the cluster description (devices, links) and device strings.
 * Owns: wf_cluster_* (weft/placement.h), the parser of "rank:R/cpu:I", and turning ping-pong
 *   round trips into a link's latency and bandwidth.
 * Why the parser is here and not in core/: wf_node_set_device() takes a device of one
 *   process's runtime (an int); a rank is something only the planner and the launcher know,
 *   and the planner resolves a string against the cluster it plans for.
 * Not here: measuring the round trips (the transport owns the network), hints (hints.c). */
#include "internal.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEF_FLOPS     1e11
#define DEF_BYTES     2e10
#define DEF_LOCAL_LAT 2e-6
#define DEF_LOCAL_BW  1e10
#define DEF_NET_LAT   2e-5
#define DEF_NET_BW    1e9

static const char *kind_name(int kind)
{
    return kind == WF_PLACE_CUDA ? "cuda" : "cpu";
}

int wf_cluster_create(wf_cluster **out)
{
    if (!out)
        return wf__err(WF_EINVAL, "wf_cluster_create: NULL out");
    *out = calloc(1, sizeof **out);
    return *out ? 0 : wf__err(WF_ENOMEM, "wf_cluster_create: no memory");
}

void wf_cluster_destroy(wf_cluster *c)
{
    if (!c)
        return;
    free(c->links);
    free(c);
}

static wf_place_link default_link(const wf_cluster *c, int a, int b)
{
    wf_place_link l = { 0, INFINITY, false };
    if (a == b)
        return l;
    bool local = c->devices[a].rank == c->devices[b].rank;
    l.latency_s = local ? DEF_LOCAL_LAT : DEF_NET_LAT;
    l.bytes_per_s = local ? DEF_LOCAL_BW : DEF_NET_BW;
    return l;
}

int wf_cluster_add_device(wf_cluster *c, const wf_cluster_device *d)
{
    if (!c || !d)
        return wf__err(WF_EINVAL, "wf_cluster_add_device: NULL argument");
    if (d->rank < 0 || d->index < 0)
        return wf__err(WF_EINVAL, "wf_cluster_add_device: rank %d, index %d: must be >= 0", d->rank,
                       d->index);
    if (d->kind != WF_PLACE_CPU && d->kind != WF_PLACE_CUDA)
        return wf__err(WF_EINVAL,
                       "wf_cluster_add_device: unknown kind %d (WF_PLACE_CPU or "
                       "WF_PLACE_CUDA)",
                       d->kind);
    if (!(d->flops_per_s >= 0) || !(d->bytes_per_s >= 0) || !(d->mem_bytes >= 0) ||
        !isfinite(d->flops_per_s) || !isfinite(d->bytes_per_s) || !isfinite(d->mem_bytes))
        return wf__err(WF_EINVAL,
                       "wf_cluster_add_device: rank:%d/%s:%d: speeds and memory "
                       "must be finite and >= 0",
                       d->rank, kind_name(d->kind), d->index);
    if (c->n_devices >= WF_PLACE_MAX_DEVICES)
        return wf__err(WF_EINVAL, "wf_cluster_add_device: more than %d devices",
                       WF_PLACE_MAX_DEVICES);
    for (int i = 0; i < c->n_devices; i++) {
        const wf_cluster_device *e = &c->devices[i];
        if (e->rank == d->rank && e->kind == d->kind && e->index == d->index)
            return wf__err(WF_EINVAL,
                           "wf_cluster_add_device: rank:%d/%s:%d is there already "
                           "(device %d)",
                           d->rank, kind_name(d->kind), d->index, i);
    }
    int n = c->n_devices + 1;
    wf_place_link *links = malloc(sizeof *links * (size_t)n * (size_t)n);
    if (!links)
        return wf__err(WF_ENOMEM, "wf_cluster_add_device: no memory");
    c->devices[n - 1] = *d;
    if (c->devices[n - 1].flops_per_s == 0)
        c->devices[n - 1].flops_per_s = DEF_FLOPS;
    if (c->devices[n - 1].bytes_per_s == 0)
        c->devices[n - 1].bytes_per_s = DEF_BYTES;
    for (int a = 0; a < n; a++)
        for (int b = 0; b < n; b++)
            links[a * n + b] =
                a < n - 1 && b < n - 1 ? c->links[a * (n - 1) + b] : default_link(c, a, b);
    free(c->links);
    c->links = links;
    c->n_devices = n;
    return n - 1;
}

int wf_cluster_set_link(wf_cluster *c, int a, int b, double latency_s, double bytes_per_s)
{
    if (!c || a < 0 || b < 0 || a >= c->n_devices || b >= c->n_devices || a == b)
        return wf__err(WF_EINVAL,
                       "wf_cluster_set_link: devices %d and %d: need two distinct "
                       "devices of the cluster's %d",
                       a, b, c ? c->n_devices : 0);
    if (!(latency_s >= 0) || !isfinite(latency_s) || !(bytes_per_s > 0))
        return wf__err(WF_EINVAL,
                       "wf_cluster_set_link: latency %g s and bandwidth %g B/s: "
                       "need latency >= 0 and bandwidth > 0",
                       latency_s, bytes_per_s);
    wf_place_link l = { latency_s, bytes_per_s, true };
    c->links[a * c->n_devices + b] = l;
    c->links[b * c->n_devices + a] = l;
    return 0;
}

int wf_cluster_get_link(const wf_cluster *c, int a, int b, double *latency_s, double *bytes_per_s)
{
    if (!c || a < 0 || b < 0 || a >= c->n_devices || b >= c->n_devices)
        return wf__err(WF_EINVAL, "wf_cluster_get_link: devices %d and %d out of range", a, b);
    const wf_place_link *l = &c->links[a * c->n_devices + b];
    if (latency_s)
        *latency_s = l->latency_s;
    if (bytes_per_s)
        *bytes_per_s = l->bytes_per_s;
    return 0;
}

double wf__place_xfer_seconds(const wf_cluster *c, int a, int b, double bytes)
{
    if (bytes <= 0 || a == b)
        return 0;
    const wf_place_link *l = &c->links[a * c->n_devices + b];
    return l->latency_s + bytes / l->bytes_per_s;
}

int wf_cluster_device_count(const wf_cluster *c)
{
    return c ? c->n_devices : 0;
}

const wf_cluster_device *wf_cluster_get_device(const wf_cluster *c, int i)
{
    return c && i >= 0 && i < c->n_devices ? &c->devices[i] : NULL;
}

int wf_cluster_rank_count(const wf_cluster *c)
{
    int r = 0;
    for (int i = 0; c && i < c->n_devices; i++)
        if (c->devices[i].rank + 1 > r)
            r = c->devices[i].rank + 1;
    return r;
}

const char *wf_cluster_device_name(const wf_cluster *c, int i, char *buf, size_t size)
{
    const wf_cluster_device *d = wf_cluster_get_device(c, i);
    if (!buf || !size)
        return buf;
    if (!d)
        snprintf(buf, size, "?");
    else
        snprintf(buf, size, "rank:%d/%s:%d", d->rank, kind_name(d->kind), d->index);
    return buf;
}

/* Reads "<word>:<int>" at '*p' into 'word' and 'val'; advances '*p'. Returns 0 or -1. */
static int field(const char **p, char *word, size_t wsize, int *val)
{
    size_t n = 0;
    while (isalpha((unsigned char)**p) && n + 1 < wsize)
        word[n++] = (char)tolower((unsigned char)*(*p)++);
    word[n] = 0;
    if (n == 0 || **p != ':' || !isdigit((unsigned char)(*p)[1]))
        return -1;
    (*p)++;
    errno = 0;
    char *end;
    long v = strtol(*p, &end, 10);
    if (errno || v > 1 << 20)
        return -1;
    *val = (int)v;
    *p = end;
    return 0;
}

int wf__place_parse(const char *s, wf_place_spec *out)
{
    if (!s || !out)
        return wf__err(WF_EINVAL, "device string: NULL");
    const char *p = s;
    char word[16];
    int v;
    wf_place_spec r = { 0, 0, 0 };
    if (field(&p, word, sizeof word, &v) < 0)
        goto bad;
    if (strcmp(word, "rank") == 0) {
        r.rank = v;
        if (*p != '/' || (p++, field(&p, word, sizeof word, &v) < 0))
            goto bad;
    }
    if (strcmp(word, "cpu") == 0)
        r.kind = WF_PLACE_CPU;
    else if (strcmp(word, "cuda") == 0 || strcmp(word, "gpu") == 0)
        r.kind = WF_PLACE_CUDA;
    else
        return wf__err(WF_EINVAL, "device string '%s': unknown device kind '%s' (cpu, cuda)", s,
                       word);
    r.index = v;
    if (*p)
        goto bad;
    *out = r;
    return 0;
bad:
    return wf__err(WF_EINVAL,
                   "device string '%s' is malformed at offset %d: expected "
                   "'rank:R/cpu:I', 'rank:R/cuda:I', 'cpu:I' or 'cuda:I'",
                   s, (int)(p - s));
}

static int find_spec(const wf_cluster *c, const char *s, const wf_place_spec *sp)
{
    int ranks = wf_cluster_rank_count(c);
    for (int i = 0; i < c->n_devices; i++) {
        const wf_cluster_device *d = &c->devices[i];
        if (d->rank == sp->rank && d->kind == sp->kind && d->index == sp->index)
            return i;
    }
    if (sp->rank >= ranks)
        return wf__err(WF_ENOTFOUND,
                       "device '%s': rank %d does not exist (the cluster has "
                       "ranks 0 .. %d)",
                       s, sp->rank, ranks - 1);
    return wf__err(WF_ENOTFOUND, "device '%s': rank %d has no %s:%d", s, sp->rank,
                   kind_name(sp->kind), sp->index);
}

int wf_cluster_find(const wf_cluster *c, const char *device)
{
    if (!c)
        return wf__err(WF_EINVAL, "wf_cluster_find: NULL cluster");
    wf_place_spec sp;
    int rc = wf__place_parse(device, &sp);
    return rc < 0 ? rc : find_spec(c, device, &sp);
}

int wf_cluster_link_from_pingpong(size_t small, double rtt_small, size_t large, double rtt_large,
                                  double *latency_s, double *bytes_per_s)
{
    if (!latency_s || !bytes_per_s || small >= large || !(rtt_small > 0) || !(rtt_large > 0) ||
        !(rtt_large > rtt_small) || !isfinite(rtt_large))
        return wf__err(WF_EINVAL,
                       "ping-pong: %zu B in %g s and %zu B in %g s: need small < "
                       "large and a slower large round trip, both times > 0",
                       small, rtt_small, large, rtt_large);
    /* One way is half a round trip: t(s) = lat + s / bw through both points. */
    double t1 = rtt_small / 2, t2 = rtt_large / 2;
    double bw = (double)(large - small) / (t2 - t1);
    double lat = t1 - (double)small / bw;
    *bytes_per_s = bw;
    *latency_s = lat > 0 ? lat : 0;
    return 0;
}
