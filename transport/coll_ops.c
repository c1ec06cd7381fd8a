/* transport/coll_ops.c: the CPU kernel of core's dp_reduce op (transport/coll_ops.h), the
 *   deterministic reduction of one gradient bucket over every shard of every rank.
 * Owns: the local part (each local shard's values scaled by its weight and summed in the
 *   fixed tree, packed into the node's flat output, or in place: over the first local shard's
 *   tensors, attrs.keepdims, core/op.h; or one node of that tree, attrs.step[1]: the sum of
 *   its two halves, which exchanges only at the node over every local shard), the exchange
 *   between ranks, its wire form and keys.
 * Weights: with one shard per rank, a rank does not scale its values before the exchange; the
 *   owner weights each rank's leaf inside its sum (tree_sum_w()), over its chunk only: one pass
 *   over the bucket fewer per rank, the same products and sums, so the same bits.
 * Values: a flat index space cut into segments (the flat output: one; in place: one per
 *   reduced tensor). On one host each header carries the sender's segment addresses and every
 *   read goes segment by segment, so in place nothing is copied but what crosses between the
 *   ranks; through UCX an in-place reduction stages the segments in one array and copies the
 *   result back at the end. Chunks, the tree and so the bits do not depend on the segments.
 * Exchange (N ranks, the output cut into N chunks, chunk q owned by rank q): every rank sends
 *   its partial sum of chunk q to rank q; the owner sums the N partials in the fixed tree
 *   (wf__dp_tree_sum(): the tree over the shards, each rank's block a leaf), then sends the result
 *   to every rank. Each rank sends and receives (N-1)/N of the bucket twice, as a ring
 *   all-reduce does, and the order of every addition is fixed, so every rank gets the same
 *   bits, and so does any other split of the same shards into ranks.
 * On one host (c->cma, every rank's memory readable with process_vm_readv) no partial or
 *   result travels through UCX: the header carries the addresses of the sender's values, the
 *   owner, once every header is in, reads the peers' partials of its chunk out of their
 *   memory 64 KiB at a time, sums each piece while it is in cache and writes the sum into
 *   every peer's values at once (process_vm_writev, from cache: no rank reads a reduced chunk
 *   back out of the owner's memory), then tells every rank "written" (edge e + 1, part 0, 8
 *   bytes). A rank's node completes once every owner has said so: no peer reads or writes its
 *   values after that, so they may be reused. Over UCX's shared memory (no CMA there: ucx.c)
 *   a 7 MiB bucket moved in fragments, each batch waiting for the receiver's actor to wake:
 *   ~25 ms per bucket in dp_bench's 2-rank step. The order of every addition is the same in
 *   both forms.
 * Wire form: before its partial, each rank sends the owner a header (the bucket's edge, the
 *   batch's rows, the size, segments, shards and aggregation, and the segments' addresses); an
 * owner that gets another header fails the node with WF_ESHAPE naming both ranks and both values
 * (ranks fed different batches) and fails the communicator with it: the other reductions of the
 * step (some never started on a rank whose run was canceled) would otherwise wait for their
 * deadline, so every rank's run fails now (WF_ESHAPE here, WF_EPEER with the same message on the
 * others). Keys: as graph transfers (transport/post.h: step << 16 | edge << 1 | part, the step
 * being wf_kernel_ctx.xfer_step): edge e, part 0 the header, part 1 the partial; edge e + 1, part 0
 * the result. The kernel pends (WF_KERNEL_PENDING): it posts every transfer and returns; the
 * transport's actor runs the callbacks, the owner's sum included, and the last one completes the
 * node, so no worker waits on the network. A failed comm (a dead rank) fails every transfer and so
 *   the node, with WF_EPEER naming the rank.
 * A rank whose step fails by itself (wf__dp_fail_comm, called by runtime/session.c) fails the
 *   communicator, naming itself and the error, so the other ranks' reductions fail at once.
 * Not here: the op's def (core/op_dist.c), the rewrite (placement/replicate.c). */
#include "coll_ops.h"

#include "../core/error.h"
#include "../core/graph.h"
#include "../core/tensor.h"
#include "internal.h"
#include "post.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HDR_MAGIC 0x57464450u /* "PDFW" */
/* Values of a peer's partial read and summed at a time on one host (64 KiB): they stay in
 * cache between the read and the sum. */
#define DP_PIECE 16384

/* The header; on one host (c->cma) followed by 'nseg' addresses: where each segment of the
 * sender's values is, in its memory. */
typedef struct dp_hdr {
    uint32_t magic;
    int32_t edge;
    int64_t batch;
    int64_t count;
    int32_t shards, agg;
    int32_t nseg, pad;
    uint64_t addr[];
} dp_hdr;

static int pow2_below(int n)
{
    return wf__dp_tree_split(0, n);
}

void wf__dp_tree_sum(float **p, int lo, int hi, int unit, size_t len)
{
    if (hi - lo <= unit)
        return;
    int m = lo + pow2_below(hi - lo);
    wf__dp_tree_sum(p, lo, m, unit, len);
    wf__dp_tree_sum(p, m, hi, unit, len);
    float *restrict a = p[lo / unit];
    const float *restrict b = p[m / unit];
    for (size_t e = 0; e < len; e++)
        a[e] += b[e];
}

/* wf__dp_tree_sum() over one-value leaves p[lo .. hi - 1], each leaf weighted by w[leaf] where
 * its parent first reads it: leaf k's value is rounded to w[k] * p[k] once, then the same
 * additions in the same order (this file is built with -ffp-contract=off: no fused
 * multiply-add), so the bits are those of scaling every leaf first, in one pass fewer. */
static void tree_sum_w(float **p, int lo, int hi, size_t len, const float *w)
{
    if (hi - lo <= 1)
        return;
    int m = lo + pow2_below(hi - lo);
    tree_sum_w(p, lo, m, len, w);
    tree_sum_w(p, m, hi, len, w);
    float *restrict a = p[lo];
    const float *restrict b = p[m];
    float wa = m - lo == 1 ? w[lo] : 1.0f, wb = hi - m == 1 ? w[m] : 1.0f;
    if (wa == 1.0f && wb == 1.0f)
        for (size_t e = 0; e < len; e++)
            a[e] += b[e];
    else if (wa == 1.0f)
        for (size_t e = 0; e < len; e++)
            a[e] += b[e] * wb;
    else
        for (size_t e = 0; e < len; e++)
            a[e] = a[e] * wa + b[e] * wb;
}

static bool blocks_ok(int lo, int hi, int unit)
{
    if (lo % unit == 0 && hi - lo == unit)
        return true;
    if (lo / unit == (hi - 1) / unit)
        return false; /* a split inside a block */
    int m = lo + pow2_below(hi - lo);
    return blocks_ok(lo, m, unit) && blocks_ok(m, hi, unit);
}

bool wf__dp_blocks_ok(int shards, int unit)
{
    return shards >= 1 && unit >= 1 && shards % unit == 0 && blocks_ok(0, shards, unit);
}

/* T_PART_*: the partials (through UCX only). T_RES_*: the results, or on one host the
 * "written" notes (the owner has written its reduced chunk into the peer's values). */
enum { T_HDR_RECV, T_PART_RECV, T_HDR_SEND, T_PART_SEND, T_RES_RECV, T_RES_SEND, T_KINDS };

typedef struct dpx dpx;

typedef struct slot {
    dpx *x;
    int kind, peer;
} slot;

/* The values of a reduction, flat index space [0, count): 'nseg' segments, segment s the
 * floats [off[s], off[s + 1]) at seg[s]. A flat output is one segment; in place (attrs.
 * keepdims), each reduced tensor's first local shard is one. Every rank has the same segment
 * bounds (the same graph), so a range of one rank's space is the same range of another's. */
typedef struct segs {
    int n;
    float **seg;
    size_t *off;
} segs;

struct dpx {
    wf_comm *c;
    const wf_node *n;
    void (*complete)(void *token, int rc);
    void *token;
    uint64_t step;
    segs sg;     /* where the values are (the result goes there too) */
    float *out;  /* through UCX: the values as one array (sg's one segment, or 'staged') */
    bool staged; /* 'out' is a copy of sg's segments, copied back at the end */
    segs fs;     /* when staged: 'out' as one segment (fs_seg, fs_off) */
    float *fs_seg;
    size_t fs_off[2];
    size_t count;
    int rank, size;
    size_t *lo;        /* size + 1 chunk bounds */
    float *tmp;        /* the peers' partials of my chunk, (size - 1) * plen */
    size_t plen;       /* through UCX: my chunk's length; on one host: at most DP_PIECE */
    bool defer;        /* one shard per rank, not yet scaled: owner_sum() weights the leaves */
    size_t hsz;        /* a header's bytes */
    dp_hdr *mine;      /* what every header should say (with my addresses on one host) */
    char *got;         /* size headers of 'hsz' bytes: what each peer said */
    uint64_t *notes;   /* on one host: size 8-byte "written" receive buffers */
    uint64_t note;     /* what a note sends */
    bool cma;          /* the one-host form (c->cma) */
    slot *slots;       /* T_KINDS * size */
    _Atomic int left;  /* transfers (and the poster's hold) not yet done */
    _Atomic int rleft; /* transfers before the owner's sum */
    _Atomic int failed;
    int rc;
    uint64_t ticket; /* the flight recorder's entry of this reduction */
    char why[WF_ERRMSG_MAX];
};

static dp_hdr *hdr_of(const dpx *x, int q)
{
    return (dp_hdr *)(x->got + (size_t)q * x->hsz);
}

static uint64_t key_of(const dpx *x, int edge_off, int part)
{
    return WF__POST_KEY_GRAPH | ((x->step & 0x7fffffu) << 16) |
           ((uint64_t)((x->n->attrs->edge + edge_off) & 0x7fff) << 1) | (uint64_t)part;
}

static void set_error(dpx *x, int rc, const char *why)
{
    int zero = 0;
    if (atomic_compare_exchange_strong(&x->failed, &zero, 1)) {
        x->rc = rc;
        snprintf(x->why, sizeof x->why, "%s", why);
    }
}

/* The first segment that holds flat index 'at' (binary search; at < count). */
static int seg_at(const segs *sg, size_t at)
{
    int l = 0, r = sg->n - 1;
    while (l < r) {
        int m = (l + r + 1) / 2;
        if (sg->off[m] <= at)
            l = m;
        else
            r = m - 1;
    }
    return l;
}

/* The pieces of flat range [from, end), one per segment it touches: start with *s = -1; each
 * call moves to the next segment *s and its part [*a, *b) of the range, false after the last. */
static bool next_piece(const segs *sg, size_t from, size_t end, int *s, size_t *a, size_t *b)
{
    for (*s = *s < 0 ? (end > from ? seg_at(sg, from) : sg->n) : *s + 1;
         *s < sg->n && sg->off[*s] < end; (*s)++) {
        *a = sg->off[*s] > from ? sg->off[*s] : from;
        *b = sg->off[*s + 1] < end ? sg->off[*s + 1] : end;
        if (*b > *a)
            return true;
    }
    return false;
}

/* Copies flat range [from, from + len) between the segments and 'flat' (to_segs: into the
 * segments). */
static void seg_copy(const segs *sg, size_t from, size_t len, float *flat, bool to_segs)
{
    size_t a, b;
    for (int s = -1; next_piece(sg, from, from + len, &s, &a, &b);) {
        float *v = sg->seg[s] + (a - sg->off[s]);
        if (to_segs)
            memcpy(v, flat + (a - from), (b - a) * sizeof(float));
        else
            memcpy(flat + (a - from), v, (b - a) * sizeof(float));
    }
}

/* Peer q's partial of my chunk in 'tmp' (through UCX: all of it; on one host: the piece being
 * summed, owner_sum()). */
static float *partial_of(dpx *x, int q)
{
    return x->tmp + (size_t)(q < x->rank ? q : q - 1) * x->plen;
}

static void dpx_free(dpx *x)
{
    if (x->staged)
        free(x->out);
    free(x->sg.seg);
    free(x->sg.off);
    free(x->lo);
    free(x->tmp);
    free(x->mine);
    free(x->got);
    free(x->notes);
    free(x->slots);
    free(x);
}

static void done_one(dpx *x)
{
    if (atomic_fetch_sub_explicit(&x->left, 1, memory_order_acq_rel) != 1)
        return;
    int rc = atomic_load(&x->failed) ? x->rc : 0;
    if (rc == 0 && x->staged) /* through UCX, in place: the result back where the values are */
        seg_copy(&x->sg, 0, x->count, x->out, true);
    wf__flight_set(x->c, x->ticket, rc < 0 ? WF__FS_FAILED : WF__FS_DONE, rc);
    if (rc < 0)
        wf__err(rc, "%s", x->why);
    void (*complete)(void *, int) = x->complete;
    void *token = x->token;
    dpx_free(x);
    complete(token, rc);
}

static void on_done(void *arg, int rc);
static void cma_move(dpx *x, int q, size_t from, size_t len, float *dst, bool to_peer,
                     const char *what);

static void post(dpx *x, int kind, int peer, void *buf, size_t bytes, int edge_off, int part)
{
    slot *s = &x->slots[kind * x->size + peer];
    *s = (slot){ x, kind, peer };
    bool recv = kind == T_HDR_RECV || kind == T_PART_RECV || kind == T_RES_RECV;
    uint64_t key = key_of(x, edge_off, part);
    int rc = recv ? wf__comm_post_recv(x->c, peer, key, buf, bytes, on_done, s)
                  : wf__comm_post_send(x->c, peer, key, buf, bytes, on_done, s);
    if (rc < 0)
        on_done(s, rc);
}

/* Global shard k's weight in a batch of 'rows' rows (MEAN: its rows over the batch's; SUM: 1;
 * SHARD_MEAN: 1 / S). */
static float shard_weight(const wf_node *n, int64_t rows, int64_t k)
{
    const wf_attrs *a = n->attrs;
    int64_t lo, hi;
    wf__shard_rows_range(rows, k, a->end[0], &lo, &hi);
    return a->axis == WF__AGG_SUM          ? 1.0f
           : a->axis == WF__AGG_SHARD_MEAN ? 1.0f / (float)a->end[0]
                                           : (float)(hi - lo) / (float)rows;
}

/* The local shards' weights. */
static void shard_weights(const wf_node *n, int64_t rows, float *w)
{
    for (int i = 0; i < (int)n->attrs->step[0]; i++)
        w[i] = shard_weight(n, rows, n->attrs->begin[0] + i);
}

static void scale(float *d, size_t len, float w)
{
    if (w != 1.0f)
        for (size_t e = 0; e < len; e++)
            d[e] *= w;
}

/* The owner's turn: every partial of its chunk is here (through UCX) or readable (on one host).
 * Its own partial is in its values (sg, a piece per segment); the tree's sum lands in the leaf
 * of rank 0, which is copied into the values when that is not this rank's. On one host the
 * peers' partials are read DP_PIECE values at a time into 'tmp' and summed there, while they
 * are in cache. A deferred weight (x->defer: one shard per rank, its value not yet scaled) is
 * applied to each leaf inside the sum (tree_sum_w()): the same product per value, so the same
 * bits. */
static void owner_sum(dpx *x)
{
    int me = x->rank, nr = x->size;
    size_t from = x->lo[me], end = x->lo[me + 1];
    float **p = malloc((size_t)nr * sizeof *p);
    float *w = malloc((size_t)nr * sizeof *w);
    if (!p || !w)
        set_error(x, WF_ENOMEM, "no memory for the owner's sum");
    for (int q = 0; p && w && q < nr; q++)
        w[q] = shard_weight(x->n, x->mine->batch, q); /* read only when x->defer */
    const segs *sg = x->staged ? &x->fs : &x->sg;
    for (size_t at = from; p && w && at < end && !atomic_load(&x->failed); at += x->plen) {
        size_t len = end - at < x->plen ? end - at : x->plen;
        /* a failed comm ends the peers' runs, which then free their values: write no more */
        int crc = x->cma ? wf__comm_failed(x->c) : 0;
        if (crc < 0) {
            set_error(x, crc, wf_last_errmsg());
            break;
        }
        for (int q = 0; x->cma && q < nr; q++)
            if (q != me)
                cma_move(x, q, at, len, partial_of(x, q), false, "reading the partial of");
        size_t a, b;
        for (int s = -1; !atomic_load(&x->failed) && next_piece(sg, at, at + len, &s, &a, &b);) {
            float *mine = sg->seg[s] + (a - sg->off[s]);
            for (int q = 0; q < nr; q++)
                p[q] = q == me ? mine : partial_of(x, q) + (a - at);
            if (x->defer) /* one shard per rank: the leaves are the ranks */
                tree_sum_w(p, 0, nr, b - a, w);
            else
                wf__dp_tree_sum(p, 0, (int)x->n->attrs->end[0], (int)x->n->attrs->step[0], b - a);
            if (p[0] != mine)
                memcpy(mine, p[0], (b - a) * sizeof(float));
        }
        for (int q = 0; x->cma && q < nr; q++) /* the piece's result, while it is in cache */
            if (q != me)
                cma_move(x, q, at, len, NULL, true, "writing the result into");
    }
    free(p);
    free(w);
    for (int q = 0; q < nr; q++)
        if (q != me && x->cma)
            post(x, T_RES_SEND, q, &x->note, sizeof x->note, 1, 0);
        else if (q != me)
            post(x, T_RES_SEND, q, x->out + x->lo[me], (end - from) * sizeof(float), 1, 0);
}

/* One host: copies flat range [from, from + len) of rank q's values (its partial of my chunk)
 * segment by segment into 'dst', or (to_peer) my own values at that range into q's. */
static void cma_move(dpx *x, int q, size_t from, size_t len, float *dst, bool to_peer,
                     const char *what)
{
    if (atomic_load(&x->failed))
        return; /* a failed header: its addresses may be anything */
    char w[160];
    snprintf(w, sizeof w, "reduction '%s': %s rank %d", x->n->name, what, q);
    const segs *sg = &x->sg;
    const dp_hdr *h = hdr_of(x, q);
    size_t a, b;
    for (int s = -1; next_piece(sg, from, from + len, &s, &a, &b);) {
        float *d = to_peer ? sg->seg[s] + (a - sg->off[s]) : dst + (a - from);
        int rc = wf__cma_copy(x->c, q, d, h->addr[s] + (a - sg->off[s]) * sizeof(float),
                              (b - a) * sizeof(float), to_peer, w);
        if (rc < 0) {
            set_error(x, rc, wf_last_errmsg());
            return;
        }
    }
}

static void check_hdr(dpx *x, int peer)
{
    const dp_hdr *h = hdr_of(x, peer), *m = x->mine;
    char why[WF_ERRMSG_MAX];
    if (h->magic != HDR_MAGIC || h->edge != m->edge || h->count != m->count ||
        h->shards != m->shards || h->agg != m->agg || h->nseg != m->nseg) {
        snprintf(why, sizeof why,
                 "rank %d and rank %d disagree on reduction '%s' (edge %d/%d, %lld/%lld "
                 "values in %d/%d tensors, %d/%d shards, aggregation %d/%d): their graphs differ",
                 x->rank, peer, x->n->name, (int)m->edge, (int)h->edge, (long long)m->count,
                 (long long)h->count, (int)m->nseg, (int)h->nseg, (int)m->shards, (int)h->shards,
                 (int)m->agg, (int)h->agg);
        set_error(x, WF_EINVAL, why);
        wf__comm_fail(x->c, WF_EINVAL, peer, "%s", why);
    } else if (h->batch != m->batch) {
        snprintf(why, sizeof why,
                 "rank %d was fed a batch of %lld rows and rank %d one of %lld (reduction "
                 "'%s'): every rank feeds the same global batch",
                 x->rank, (long long)m->batch, peer, (long long)h->batch, x->n->name);
        set_error(x, WF_ESHAPE, why);
        wf__comm_fail(x->c, WF_ESHAPE, peer, "%s", why);
    }
}

static void on_done(void *arg, int rc)
{
    slot *s = arg;
    dpx *x = s->x;
    int q = s->peer;
    if (rc < 0)
        set_error(x, rc, wf_last_errmsg());
    else if (s->kind == T_HDR_RECV)
        check_hdr(x, q);
    bool counts = s->kind == T_HDR_RECV || (!x->cma && s->kind == T_PART_RECV);
    if (counts && atomic_fetch_sub_explicit(&x->rleft, 1, memory_order_acq_rel) == 1)
        owner_sum(x);
    done_one(x);
}

/* x = x wx + y wy, each product rounded before the sum (this file has no FMA contraction):
 * the bits of scaling a leaf in place and then adding, in one pass over the two halves of a
 * tree node instead of up to three. A pipeline stage runs m - 1 such nodes per gradient per
 * step; on 8 MB (2M floats, one thread, best of 30) a node over two leaves took 2.6 ms with
 * the two scaling passes first and takes 1.0, a partial sum and a leaf 1.5 and 0.9. */
static void add_scaled(float *restrict x, float wx, const float *restrict y, float wy, size_t len)
{
    if (wx == 1.0f && wy == 1.0f)
        for (size_t e = 0; e < len; e++)
            x[e] += y[e];
    else if (wx == 1.0f)
        for (size_t e = 0; e < len; e++)
            x[e] += y[e] * wy;
    else if (wy == 1.0f)
        for (size_t e = 0; e < len; e++)
            x[e] = x[e] * wx + y[e];
    else
        for (size_t e = 0; e < len; e++)
            x[e] = x[e] * wx + y[e] * wy;
}

/* Scales each local shard's value by its weight and sums them in the tree, into 'dst'. */
static int local_sum(const wf_node *n, wf_tensor *const *in, float *dst)
{
    int b = (int)n->attrs->step[0];
    float w[64];
    float *stack_p[64];
    if (b > 64)
        return wf__err(WF_EINVAL, "%d local shards (at most 64)", b);
    shard_weights(n, in[0]->shape.dims[0], w);
    int m = (n->n_inputs - 1) / b;
    size_t off = 0;
    for (int j = 0; j < m; j++) {
        size_t len = (size_t)in[1 + j * b]->numel;
        float *scratch = NULL;
        if (b > 1 && !(scratch = malloc((size_t)(b - 1) * len * sizeof(float) + 1)))
            return wf__err(WF_ENOMEM, "no memory for %d shards of %zu values", b, len);
        for (int i = 0; i < b; i++) {
            const wf_tensor *t = in[1 + j * b + i];
            float *d = i == 0 ? dst + off : scratch + (size_t)(i - 1) * len;
            stack_p[i] = d;
            int rc = 0;
            if (t->contiguous)
                memcpy(d, t->data, len * sizeof(float));
            else
                rc = wf_tensor_read(t, WF_F32, d, len * sizeof(float));
            if (rc < 0) {
                free(scratch);
                return rc;
            }
            scale(d, len, w[i]);
        }
        wf__dp_tree_sum(stack_p, 0, b, 1, len);
        free(scratch);
        off += len;
    }
    return 0;
}

/* In place (attrs.keepdims): the same sums, each over the shards' own tensors, ending in the
 * first shard's (the others are scratch: only this node reads them, placement/replicate.c).
 * 'defer': one shard, left unscaled (its weight is applied in owner_sum()). */
static int local_sum_inplace(const wf_node *n, wf_tensor *const *in, bool defer)
{
    int b = (int)n->attrs->step[0];
    float w[64];
    float *p[64];
    if (b > 64)
        return wf__err(WF_EINVAL, "%d local shards (at most 64)", b);
    shard_weights(n, in[0]->shape.dims[0], w);
    for (int v = 1; v < n->n_inputs; v++)
        if (!in[v]->contiguous)
            return wf__err(WF_EINVAL, "value '%s' is not contiguous: it cannot be reduced in place",
                           n->inputs[v]->name);
    int m = wf__dp_reduce_values(n);
    if (n->attrs->step[1] == 1) { /* one node of the tree: its two halves' sums */
        int lo = (int)n->attrs->begin[1], hi = (int)n->attrs->end[1];
        int mid = wf__dp_tree_split(lo, hi);
        for (int j = 0; j < m; j++) {
            size_t len = (size_t)in[1 + 2 * j]->numel;
            add_scaled((float *)in[1 + 2 * j]->data, mid - lo == 1 ? w[lo] : 1.0f,
                       (const float *)in[2 + 2 * j]->data, hi - mid == 1 ? w[mid] : 1.0f, len);
        }
        return 0;
    }
    for (int j = 0; j < m; j++) {
        size_t len = (size_t)in[1 + j * b]->numel;
        for (int i = 0; i < b; i++) {
            p[i] = (float *)in[1 + j * b + i]->data;
            if (!defer)
                scale(p[i], len, w[i]);
        }
        wf__dp_tree_sum(p, 0, b, 1, len);
    }
    return 0;
}

static int dp_reduce_kernel(const wf_kernel_ctx *ctx, const wf_node *n, wf_tensor *const *in,
                            wf_tensor **out)
{
    bool inplace = n->attrs->keepdims, tree = n->attrs->step[1] == 1;
    int b = (int)n->attrs->step[0], m = wf__dp_reduce_values(n);
    int stride = tree ? 2 : b; /* value j's first local shard: input 1 + j * stride */
    wf_comm *c = ctx->data;
    /* one shard per rank, in place, exchanged: its weight is applied in the owner's sum, to the
     * half of the values it owns while they are in cache, not to all of them here first */
    bool defer = inplace && !tree && b == 1 && c && wf_comm_size(c) > 1;
    int rc = inplace ? local_sum_inplace(n, in, defer) : local_sum(n, in, (float *)(*out)->data);
    if (inplace && rc == 0)
        *(float *)(*out)->data = 0.0f; /* the token */
    /* a tree node below the top one sums a part of this rank's shards: no exchange */
    if (rc < 0 || !c || wf_comm_size(c) == 1 || (tree && n->attrs->end[1] - n->attrs->begin[1] < b))
        return rc;
    if (!ctx->complete)
        return wf__err(WF_ENOSYS, "dp_reduce runs only in a session's run (it finishes later)");
    if ((rc = wf_comm_status(c)) < 0)
        return rc; /* a failed comm (a dead rank): its message, and nothing posted */
    int nr = wf_comm_size(c), me = wf_comm_rank(c);
    int nseg = inplace ? m : 1;
    size_t hsz = sizeof(dp_hdr) + (size_t)nseg * sizeof(uint64_t);
    dpx *x = calloc(1, sizeof *x);
    if (x) {
        x->lo = malloc((size_t)(nr + 1) * sizeof *x->lo);
        x->got = calloc((size_t)nr, hsz);
        x->mine = calloc(1, hsz);
        x->notes = calloc((size_t)nr, sizeof *x->notes);
        x->slots = calloc((size_t)T_KINDS * (size_t)nr, sizeof *x->slots);
        x->sg.seg = malloc((size_t)nseg * sizeof *x->sg.seg);
        x->sg.off = malloc((size_t)(nseg + 1) * sizeof *x->sg.off);
    }
    size_t count = 0;
    if (x && x->sg.seg && x->sg.off) {
        x->sg.n = nseg;
        x->sg.off[0] = 0;
        for (int s = 0; s < nseg; s++) {
            const wf_tensor *t = inplace ? in[1 + s * stride] : *out;
            x->sg.seg[s] = (float *)t->data;
            x->sg.off[s + 1] = x->sg.off[s] + (size_t)t->numel;
        }
        count = x->sg.off[nseg];
    }
    if (x && x->lo && x->got && x->sg.seg && x->sg.off) {
        for (int q = 0; q <= nr; q++)
            x->lo[q] = count / (size_t)nr * (size_t)q +
                       ((size_t)q < count % (size_t)nr ? (size_t)q : count % (size_t)nr);
        size_t len = x->lo[me + 1] - x->lo[me];
        x->cma = c->cma; /* decided by every rank together at creation: the same on all */
        x->plen = x->cma && len > DP_PIECE ? DP_PIECE : len;
        x->tmp = malloc((size_t)(nr - 1) * x->plen * sizeof(float) + 1);
        /* through UCX the values travel as one array: in place, a copy of the segments */
        x->staged = !x->cma && inplace;
        x->out = x->staged ? malloc(count * sizeof(float) + 1) : x->sg.seg[0];
    }
    if (!x || !x->lo || !x->got || !x->mine || !x->notes || !x->slots || !x->tmp || !x->sg.seg ||
        !x->sg.off || !x->out) {
        if (x)
            dpx_free(x);
        return wf__err(WF_ENOMEM, "no memory for the exchange of %zu values", count);
    }
    if (x->staged) {
        seg_copy(&x->sg, 0, count, x->out, false);
        x->fs_seg = x->out;
        x->fs_off[1] = count;
        x->fs = (segs){ .n = 1, .seg = &x->fs_seg, .off = x->fs_off };
    }
    x->c = c;
    x->n = n;
    x->complete = ctx->complete;
    x->token = ctx->token;
    x->step = ctx->xfer_step;
    x->count = count;
    x->rank = me;
    x->size = nr;
    x->hsz = hsz;
    x->defer = defer;
    *x->mine = (dp_hdr){ .magic = HDR_MAGIC,
                         .edge = n->attrs->edge,
                         .batch = in[0]->shape.dims[0],
                         .count = (int64_t)count,
                         .shards = (int32_t)n->attrs->end[0],
                         .agg = n->attrs->axis,
                         .nseg = nseg };
    for (int s = 0; s < nseg; s++)
        x->mine->addr[s] = (uint64_t)(uintptr_t)x->sg.seg[s];
    x->note = HDR_MAGIC;
    /* 2 recvs (header, partial) + 2 sends + 1 result recv + 1 result send per peer, and the
     * poster's own hold, so that nothing completes the node while it posts. On one host four:
     * the header and the "written" note each way. */
    atomic_init(&x->left, (x->cma ? 4 : 6) * (nr - 1) + 1);
    atomic_init(&x->rleft, (x->cma ? 1 : 2) * (nr - 1));
    x->ticket = wf__flight_node(c, WF__K_DP_REDUCE, key_of(x, 0, 0), count * sizeof(float), count,
                                -1, n->name, (int)n->attrs->edge, x->step);
    size_t mylen = x->lo[me + 1] - x->lo[me];
    for (int q = 0; q < nr; q++) {
        if (q == me)
            continue;
        size_t qlen = x->lo[q + 1] - x->lo[q];
        if (x->cma) {
            post(x, T_RES_RECV, q, &x->notes[q], sizeof x->note, 1, 0);
            post(x, T_HDR_RECV, q, hdr_of(x, q), hsz, 0, 0);
            post(x, T_HDR_SEND, q, x->mine, hsz, 0, 0);
            continue; /* T_RES_SEND ("written") follows the owner's sum */
        }
        post(x, T_RES_RECV, q, x->out + x->lo[q], qlen * sizeof(float), 1, 0);
        post(x, T_HDR_RECV, q, hdr_of(x, q), hsz, 0, 0);
        post(x, T_PART_RECV, q, partial_of(x, q), mylen * sizeof(float), 0, 1);
        post(x, T_HDR_SEND, q, x->mine, hsz, 0, 0);
        post(x, T_PART_SEND, q, x->out + x->lo[q], qlen * sizeof(float), 0, 1);
    }
    done_one(x);
    return WF_KERNEL_PENDING;
}

void wf__dp_fail_comm(wf_comm *c, int code, const char *why)
{
    if (!c || c->size < 2 || atomic_load(&c->failed))
        return;
    char msg[WF_ERRMSG_MAX];
    snprintf(msg, sizeof msg, "%s", why ? why : "");
    wf__comm_fail(c, code, c->rank, "rank %d: its step failed (%s): %s", c->rank, wf_err_name(code),
                  msg);
    wf__err(code, "%s", msg); /* the caller's message, not the comm's */
}

int wf__transport_register_coll_kernels(wf__kernels *r, wf_comm *c)
{
    if (!r)
        return wf__err(WF_EINVAL, "wf__transport_register_coll_kernels: NULL registry");
    return wf__kernels_register(r, &wf_op_dp_reduce, WF_KERNEL_CPU, dp_reduce_kernel, NULL, c);
}
