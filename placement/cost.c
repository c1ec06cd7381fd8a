/* placement/cost.c: what a node costs on a device: the prior and the measured table.
 * Owns: wf_cost_table_* (measured seconds keyed by op, dtype, input and output shapes and
 *   device kind), wf_cost_prior() (the op's flops/bytes as a roofline) and wf_cost_seconds().
 * Invariant: the table is open addressing with linear probing, at most half full; a key is
 *   the string "<op>|<dtype>|<shape of each input>|<output shape>|<kind>".
 * Why keyed by signature and not by node: a profile run measures each distinct (op, shapes,
 *   device kind) once, and every layer of a stack of equal layers shares the measurement.
 * Not here: running the profile (the runtime times nodes and calls wf_cost_table_put()). */
#include "internal.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct entry {
    char *key; /* NULL: empty slot */
    uint64_t hash;
    double seconds;
} entry;

struct wf_cost_table {
    entry *slots;
    size_t cap; /* a power of two */
    size_t n;
};

int wf_cost_table_create(wf_cost_table **out)
{
    if (!out)
        return wf__err(WF_EINVAL, "wf_cost_table_create: NULL out");
    wf_cost_table *t = calloc(1, sizeof *t);
    if (t)
        t->slots = calloc(64, sizeof *t->slots);
    if (!t || !t->slots) {
        free(t);
        *out = NULL;
        return wf__err(WF_ENOMEM, "wf_cost_table_create: no memory");
    }
    t->cap = 64;
    *out = t;
    return 0;
}

void wf_cost_table_destroy(wf_cost_table *t)
{
    if (!t)
        return;
    for (size_t i = 0; i < t->cap; i++)
        free(t->slots[i].key);
    free(t->slots);
    free(t);
}

/* Appends "[d0,d1,...]" of 's' at 'p' (within 'end'); returns the new end. */
static char *put_shape(char *p, char *end, wf_shape s)
{
    p += snprintf(p, (size_t)(end - p), "[");
    for (int i = 0; i < s.rank && p < end; i++)
        p += snprintf(p, (size_t)(end - p), i ? ",%lld" : "%lld", (long long)s.dims[i]);
    if (p < end)
        p += snprintf(p, (size_t)(end - p), "]");
    return p < end ? p : end;
}

/* The node's key into 'buf'; returns its length, or -1 when it does not fit. */
static int make_key(const wf_node *n, int kind, char *buf, size_t size)
{
    char *p = buf, *end = buf + size;
    p += snprintf(p, size, "%s|%s|", n->op->name, wf_dtype_name(n->dtype));
    for (int i = 0; i < n->n_inputs && p < end; i++)
        p = put_shape(p, end, n->inputs[i]->shape);
    if (p < end)
        p += snprintf(p, (size_t)(end - p), "|");
    if (p < end)
        p = put_shape(p, end, n->shape);
    if (p < end)
        p += snprintf(p, (size_t)(end - p), "|%d", kind);
    return p < end - 1 ? (int)(p - buf) : -1;
}

static uint64_t fnv(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static entry *probe(entry *slots, size_t cap, const char *key, uint64_t h)
{
    for (size_t i = h & (cap - 1);; i = (i + 1) & (cap - 1))
        if (!slots[i].key || (slots[i].hash == h && strcmp(slots[i].key, key) == 0))
            return &slots[i];
}

static int grow(wf_cost_table *t)
{
    size_t cap = t->cap * 2;
    entry *s = calloc(cap, sizeof *s);
    if (!s)
        return wf__err(WF_ENOMEM, "cost table: no memory");
    for (size_t i = 0; i < t->cap; i++)
        if (t->slots[i].key)
            *probe(s, cap, t->slots[i].key, t->slots[i].hash) = t->slots[i];
    free(t->slots);
    t->slots = s;
    t->cap = cap;
    return 0;
}

static int check(const void *t, const wf_node *n, int kind, const char *what)
{
    if (!t || !n)
        return wf__err(WF_EINVAL, "%s: NULL argument", what);
    if (kind != WF_PLACE_CPU && kind != WF_PLACE_CUDA)
        return wf__err(WF_EINVAL, "%s: node '%s': unknown device kind %d", what, n->name, kind);
    return 0;
}

int wf_cost_table_put(wf_cost_table *t, const wf_node *n, int kind, double seconds)
{
    int rc = check(t, n, kind, "wf_cost_table_put");
    if (rc < 0)
        return rc;
    if (!(seconds >= 0) || !isfinite(seconds))
        return wf__err(WF_EINVAL, "wf_cost_table_put: node '%s': %g seconds", n->name, seconds);
    char key[1024];
    if (make_key(n, kind, key, sizeof key) < 0)
        return wf__err(WF_EINVAL,
                       "wf_cost_table_put: node '%s': its signature is longer than "
                       "%zu bytes",
                       n->name, sizeof key);
    if (2 * (t->n + 1) > t->cap && (rc = grow(t)) < 0)
        return rc;
    uint64_t h = fnv(key);
    entry *e = probe(t->slots, t->cap, key, h);
    if (!e->key) {
        if (!(e->key = strdup(key)))
            return wf__err(WF_ENOMEM, "wf_cost_table_put: no memory");
        e->hash = h;
        t->n++;
    }
    e->seconds = seconds;
    return 0;
}

int wf_cost_table_get(const wf_cost_table *t, const wf_node *n, int kind, double *seconds)
{
    int rc = check(t, n, kind, "wf_cost_table_get");
    if (rc < 0)
        return rc;
    char key[1024];
    if (make_key(n, kind, key, sizeof key) < 0)
        return 0;
    entry *e = probe(t->slots, t->cap, key, fnv(key));
    if (!e->key)
        return 0;
    if (seconds)
        *seconds = e->seconds;
    return 1;
}

int wf_cost_table_count(const wf_cost_table *t)
{
    return t ? (int)t->n : 0;
}

double wf__place_value_bytes(const wf_node *n)
{
    double e = 1;
    for (int i = 0; i < n->shape.rank; i++)
        e *= n->shape.dims[i] > 0 ? (double)n->shape.dims[i] : 1.0;
    return e * (double)wf_dtype_size(n->dtype);
}

double wf_cost_prior(const wf_node *n, const wf_cluster_device *d)
{
    if (!n || !d || (n->op->flags & WF_OP_SOURCE))
        return 0;
    double flops = 0, bytes = 0;
    if (n->op->cost) {
        n->op->cost(n, &flops, &bytes);
    } else {
        bytes = wf__place_value_bytes(n);
        for (int i = 0; i < n->n_inputs; i++)
            bytes += wf__place_value_bytes(n->inputs[i]);
    }
    double f = d->flops_per_s > 0 ? flops / d->flops_per_s : 0;
    double b = d->bytes_per_s > 0 ? bytes / d->bytes_per_s : 0;
    return f > b ? f : b;
}

double wf_cost_seconds(const wf_cost_table *t, const wf_node *n, const wf_cluster_device *d)
{
    double s;
    if (t && n && d && wf_cost_table_get(t, n, d->kind, &s) == 1)
        return s;
    return wf_cost_prior(n, d);
}
