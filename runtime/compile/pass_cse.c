/* runtime/compile/pass_cse.c: common subexpression elimination: of two nodes with the same op, the
 * same inputs (after the replacements so far, so merges cascade down a sweep in
 * topological order), equal attribute bags, dtype and shape, the later is replaced by the
 * earlier; constants with equal dtype, shape and bytes merge too (folding makes many).
 * Owns: the hash table of one sweep.
 * Rules: only replaceable nodes (passes.h: no control edges, so no ordering is lost; not
 *   stateful, so two dropouts stay two masks; not an update; not a placeholder or
 *   variable). Attribute bags compare with memcmp (core shares equal bags, so usually the
 *   pointers are equal; a bag with garbage in its padding only misses a merge). The kept
 *   node runs the same kernel on the same inputs: the result is the same bits.
 * Not here: the other passes (pass_*.c), the framework (passes.c). */
#include "passes.h"

#include <stdlib.h>
#include <string.h>

/* FNV-1a over 8-byte words (then the tail bytes): a byte at a time made CSE the slowest
 * pass (an attribute bag is ~450 bytes, hashed once per node). */
static uint64_t mix(uint64_t h, const void *p, size_t len)
{
    const unsigned char *b = p;
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t w;
        memcpy(&w, b + i, 8);
        h = (h ^ w) * 0x100000001b3ull;
        h ^= h >> 29;
    }
    for (; i < len; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* A contiguous constant small enough to compare by its bytes, or NULL. */
static const wf_tensor *const_value(const wf_node *n)
{
    const wf_tensor *t = n->op == &wf_op_constant ? n->value : NULL;
    if (!t || !t->contiguous || t->numel > WF__FOLD_MAX_NUMEL)
        return NULL;
    return t;
}

static uint64_t hash_node(wf__pass_ctx *c, const wf_node *n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    h = mix(h, &n->op, sizeof n->op);
    h = mix(h, &n->dtype, sizeof n->dtype);
    h = mix(h, &n->shape.rank, sizeof n->shape.rank);
    h = mix(h, n->shape.dims, (size_t)n->shape.rank * sizeof n->shape.dims[0]);
    const wf_tensor *v = const_value(n);
    if (v)
        return mix(h, v->data, (size_t)v->numel * wf_dtype_size(v->dtype));
    for (int k = 0; k < n->n_inputs; k++) {
        int32_t in = wf__pass_input(c, n, k)->id;
        h = mix(h, &in, sizeof in);
    }
    /* The bag's first bytes only (matmul's flags, axes, axis, dtype, the start of 'shape'):
     * equal bags still hash equal, 'same()' compares the whole bag, and hashing all ~450
     * bytes of every node cost more than the rest of the pass. */
    return mix(h, n->attrs, sizeof *n->attrs < 128 ? sizeof *n->attrs : 128);
}

static bool same(wf__pass_ctx *c, const wf_node *a, const wf_node *b)
{
    if (a->op != b->op || a->dtype != b->dtype || !wf_shape_equal(a->shape, b->shape) ||
        a->n_inputs != b->n_inputs)
        return false;
    const wf_tensor *va = const_value(a), *vb = const_value(b);
    if (va || vb)
        return va && vb && va->dtype == vb->dtype &&
               memcmp(va->data, vb->data, (size_t)va->numel * wf_dtype_size(va->dtype)) == 0;
    for (int k = 0; k < a->n_inputs; k++)
        if (wf__pass_input(c, a, k) != wf__pass_input(c, b, k))
            return false;
    return a->attrs == b->attrs || memcmp(a->attrs, b->attrs, sizeof *a->attrs) == 0;
}

static bool candidate(const wf_node *n)
{
    if (n->op == &wf_op_constant)
        return n->n_control == 0 && const_value(n) != NULL;
    return wf__pass_replaceable(n);
}

int wf__pass_cse(wf__pass_ctx *c)
{
    int32_t *ids = malloc((size_t)(c->n ? c->n : 1) * sizeof *ids);
    if (!ids)
        return wf__err(WF_ENOMEM, "wf_session_run: no memory for CSE over %d nodes", c->n);
    int m = wf__pass_order(c, ids);
    if (m < 0) {
        free(ids);
        return m;
    }
    size_t cap = 16;
    while (cap < 2 * (size_t)m)
        cap *= 2;
    int32_t *table = malloc(cap * sizeof *table); /* working ids, -1: empty */
    if (!table) {
        free(ids);
        return wf__err(WF_ENOMEM, "wf_session_run: no memory for CSE over %d nodes", m);
    }
    for (size_t i = 0; i < cap; i++)
        table[i] = -1;
    int rc = 0;
    for (int i = 0; rc == 0 && i < m; i++) {
        int32_t id = ids[i];
        const wf_node *n = c->node[id];
        if (wf__pass_find(c, id) != id || !candidate(n))
            continue;
        uint64_t h = hash_node(c, n);
        h ^= h >> 33; /* a finalizer (MurmurHash3's): FNV's low bits, which pick the slot, */
        h *= 0xff51afd7ed558ccdull; /* depend only on the inputs' low bits: chains of */
        h ^= h >> 33;               /* consecutive ids clustered into long probe runs */
        size_t slot = (size_t)h & (cap - 1);
        for (; table[slot] >= 0; slot = (slot + 1) & (cap - 1))
            if (same(c, c->node[table[slot]], n))
                break;
        if (table[slot] < 0) {
            table[slot] = id;
            continue;
        }
        if ((rc = wf__pass_replace(c, id, table[slot], WF__RW_CSE)) == 0)
            c->n_merged++;
    }
    free(table);
    free(ids);
    return rc;
}
