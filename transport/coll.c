/* transport/coll.c: collectives on host memory over UCX tags: all-reduce, reduce-scatter,
 * all-gather, broadcast, barrier.
 * Algorithms: all-reduce up to small_bytes uses recursive doubling (log2 N exchanges of the
 * whole buffer; ranks beyond a power of two fold into a partner first); larger ones a ring:
 * N-1 reduce-scatter steps then N-1 all-gather steps, each block cut into chunk_bytes
 * chunks, and each chunk forwarded as soon as it is reduced, so reduction overlaps the
 * transfer of the next chunks and one step flows into the next (LESSONS.md: a plain
 * chunked ring beat Open MPI 1.3-2.5x from 16 KiB up, but small messages need their own
 * path).
 * Determinism: every element is reduced in one fixed order that all ranks agree on. In the
 * ring one rank reduces each block and the others receive its bits; in recursive doubling
 * both partners compute 'lower rank's data op higher rank's data', so even max(-0, +0) and
 * NaN payloads come out the same everywhere.
 * Tags: WF__TAG_COLL | (collective sequence number mod 2^24) << 16 | step. Chunks of one
 * step share a tag: UCX matches messages of one sender and tag in order.
 * Device memory: in builds with NCCL, a collective whose buffers are on a CUDA device goes
 * to nccl.c instead.
 * Not here: the transport itself (ucx.c), NCCL (nccl.c). */
#include "../core/tensor.h"
#include "internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

/* ---- Reduction kernels -------------------------------------------------------------------- */

#define REDUCE_LOOP(T, EXPR)           \
    do {                               \
        T *d = dst;                    \
        const T *s = src;              \
        for (size_t i = 0; i < n; i++) \
            d[i] = (EXPR);             \
    } while (0)

/* Max of floats: NaN wins (from either side), so one NaN poisons the result as a sum would. */
#define FMAX(a, b) ((b) > (a) || (b) != (b) ? (b) : (a))

void wf__reduce(void *dst, const void *src, size_t n, wf_dtype dt, wf_reduce_op op)
{
    bool mx = op == WF_REDUCE_MAX;
    switch (dt) {
    case WF_F32:
        if (mx)
            REDUCE_LOOP(float, FMAX(d[i], s[i]));
        else
            REDUCE_LOOP(float, d[i] + s[i]);
        break;
    case WF_F64:
        if (mx)
            REDUCE_LOOP(double, FMAX(d[i], s[i]));
        else
            REDUCE_LOOP(double, d[i] + s[i]);
        break;
    case WF_I32: /* sums wrap around (two's complement), as in every MPI */
        if (mx)
            REDUCE_LOOP(int32_t, s[i] > d[i] ? s[i] : d[i]);
        else
            REDUCE_LOOP(int32_t, (int32_t)((uint32_t)d[i] + (uint32_t)s[i]));
        break;
    case WF_I64:
        if (mx)
            REDUCE_LOOP(int64_t, s[i] > d[i] ? s[i] : d[i]);
        else
            REDUCE_LOOP(int64_t, (int64_t)((uint64_t)d[i] + (uint64_t)s[i]));
        break;
    case WF_BF16: {
        uint16_t *d = dst;
        const uint16_t *s = src;
        for (size_t i = 0; i < n; i++) {
            float a = wf__bf16_to_f32(d[i]), b = wf__bf16_to_f32(s[i]);
            d[i] = wf__f32_to_bf16(mx ? FMAX(a, b) : a + b);
        }
        break;
    }
    default:
        break; /* refused by check_reduce() */
    }
}

static void scale_mean(void *buf, size_t n, wf_dtype dt, int size)
{
    switch (dt) {
    case WF_F32:
        for (size_t i = 0; i < n; i++)
            ((float *)buf)[i] /= (float)size;
        break;
    case WF_F64:
        for (size_t i = 0; i < n; i++)
            ((double *)buf)[i] /= (double)size;
        break;
    case WF_I32:
        for (size_t i = 0; i < n; i++)
            ((int32_t *)buf)[i] /= size;
        break;
    case WF_I64:
        for (size_t i = 0; i < n; i++)
            ((int64_t *)buf)[i] /= size;
        break;
    case WF_BF16:
        for (size_t i = 0; i < n; i++) {
            uint16_t *p = (uint16_t *)buf + i;
            *p = wf__f32_to_bf16(wf__bf16_to_f32(*p) / (float)size);
        }
        break;
    default:
        break;
    }
}

/* ---- Helpers --------------------------------------------------------------------------------- */

static uint64_t coll_tag(uint32_t seq, int step)
{
    return WF__TAG_COLL | ((uint64_t)(seq & 0xffffffu) << 16) | (uint64_t)(step & 0xffff);
}

static void *scratch(wf_comm *c, size_t bytes)
{
    if (bytes > c->scratch_cap) {
        void *p = realloc(c->scratch, bytes);
        if (!p)
            return NULL;
        c->scratch = p;
        c->scratch_cap = bytes;
    }
    return c->scratch;
}

static uint64_t deadline(const wf_comm *c)
{
    return wf__net_now_ns() + (uint64_t)c->op_timeout_ms * 1000000u;
}

static int check_comm(const char *fn, wf_comm *c)
{
    if (!c)
        return wf__err(WF_EINVAL, "%s: NULL comm", fn);
    return wf__comm_failed(c);
}

static int check_reduce(const char *fn, wf_comm *c, const void *send, void *recv, size_t count,
                        wf_dtype dt, wf_reduce_op op, size_t mult, size_t *bytes)
{
    int rc = check_comm(fn, c);
    if (rc < 0)
        return rc;
    if (dt != WF_F32 && dt != WF_F64 && dt != WF_I32 && dt != WF_I64 && dt != WF_BF16)
        return wf__err(WF_EINVAL, "%s: dtype %s cannot be reduced (f32, f64, i32, i64, bf16)", fn,
                       wf_dtype_name(dt));
    if (op != WF_REDUCE_SUM && op != WF_REDUCE_MEAN && op != WF_REDUCE_MAX)
        return wf__err(WF_EINVAL, "%s: unknown reduce op %d", fn, (int)op);
    size_t es = wf_dtype_size(dt);
    if (count > SIZE_MAX / es / mult)
        return wf__err(WF_EINVAL, "%s: %zu elements of %s overflow", fn, count, wf_dtype_name(dt));
    if (count && (!send || !recv))
        return wf__err(WF_EINVAL, "%s: NULL %s buffer for %zu elements", fn,
                       send ? "receive" : "send", count);
    *bytes = count * es;
    return 0;
}

/* ---- Recursive doubling ---------------------------------------------------------------------- */

/* Exchanges 'buf' with 'partner' at 'step' and reduces, lower rank's data first. */
static int rd_exchange(wf_comm *c, uint8_t *buf, uint8_t *tmp, size_t count, size_t bytes,
                       wf_dtype dt, wf_reduce_op op, int partner, uint32_t seq, int step,
                       uint64_t dl, const char *what)
{
    wf_comm_req *rq[2] = { NULL, NULL };
    int rc = wf__irecv(c, partner, coll_tag(seq, step), tmp, bytes, &rq[0]);
    if (rc == 0)
        rc = wf__isend(c, partner, coll_tag(seq, step), buf, bytes, &rq[1]);
    int rc2 = wf__wait_all(rq, 2, dl, what);
    if (rc < 0 || rc2 < 0)
        return rc < 0 ? rc : rc2;
    if (c->rank < partner) {
        wf__reduce(buf, tmp, count, dt, op);
    } else {
        wf__reduce(tmp, buf, count, dt, op);
        memcpy(buf, tmp, bytes);
    }
    return 0;
}

static int rd_allreduce(wf_comm *c, uint8_t *buf, size_t count, size_t bytes, wf_dtype dt,
                        wf_reduce_op op, uint32_t seq, const char *what)
{
    int n = c->size, rank = c->rank, p = 1, rc = 0;
    while (p * 2 <= n)
        p *= 2;
    int rem = n - p;
    uint8_t *tmp = scratch(c, bytes ? bytes : 1);
    if (!tmp)
        return wf__err(WF_ENOMEM, "%s: no memory for %zu bytes of scratch", what, bytes);
    uint64_t dl = deadline(c);
    int vrank;
    wf_comm_req *rq = NULL;
    /* Fold: of the first 2*rem ranks, the even ones hand their data to the next odd one. */
    if (rank < 2 * rem) {
        if (rank % 2 == 0) {
            if ((rc = wf__isend(c, rank + 1, coll_tag(seq, 0), buf, bytes, &rq)) < 0 ||
                (rc = wf__wait(rq, dl, what)) < 0)
                return rc;
            vrank = -1;
        } else {
            if ((rc = wf__irecv(c, rank - 1, coll_tag(seq, 0), tmp, bytes, &rq)) < 0 ||
                (rc = wf__wait(rq, dl, what)) < 0)
                return rc;
            wf__reduce(tmp, buf, count, dt, op); /* rank - 1 is the lower one */
            memcpy(buf, tmp, bytes);
            vrank = rank / 2;
        }
    } else {
        vrank = rank - rem;
    }
    if (vrank >= 0) {
        int step = 1;
        for (int mask = 1; mask < p; mask <<= 1, step++) {
            int vp = vrank ^ mask;
            int partner = vp < rem ? vp * 2 + 1 : vp + rem;
            rc = rd_exchange(c, buf, tmp, count, bytes, dt, op, partner, seq, step, dl, what);
            if (rc < 0)
                return rc;
        }
    }
    /* Unfold: the odd ranks give the result back. */
    if (rank < 2 * rem) {
        if (rank % 2 == 0)
            rc = wf__irecv(c, rank + 1, coll_tag(seq, 0xffff), buf, bytes, &rq);
        else
            rc = wf__isend(c, rank - 1, coll_tag(seq, 0xffff), buf, bytes, &rq);
        if (rc < 0 || (rc = wf__wait(rq, dl, what)) < 0)
            return rc;
    }
    return 0;
}

/* ---- Ring --------------------------------------------------------------------------------------
 */

/* A ring's failure 'rc' (message in wf_last_errmsg()): fails the comm first (if this error
 * did not already), so that what is still posted ('rest', 'recvs', 'sends') is canceled
 * instead of waited for, then waits for those, frees 'recvs' and 'sends' and returns 'rc'
 * with the message. */
static int abandon(wf_comm *c, int rc, wf_comm_req **rest, size_t nrest, wf_comm_req **recvs,
                   size_t nch, wf_comm_req **sends, size_t nsend, uint64_t dl, const char *what)
{
    char msg[WF_ERRMSG_MAX];
    snprintf(msg, sizeof msg, "%s", wf_last_errmsg());
    if (!atomic_load(&c->failed))
        wf__comm_fail(c, rc, c->rank, "rank %d: %s", c->rank, msg);
    if (nrest)
        (void)wf__wait_all(rest, nrest, dl, what);
    (void)wf__wait_all(recvs, nch, dl, what);
    (void)wf__wait_all(sends, nsend, dl, what);
    free(sends);
    free(recvs);
    return wf__err(rc, "%s", msg);
}

/* A ring over N blocks of 'buf' (block v: elements off[v] .. off[v] + len[v]). With 'rs',
 * N-1 reduce-scatter steps (steps 0 .. N-2) leave rank r with block r+1 reduced over every
 * rank; with 'ag', N-1 all-gather steps (N-1 .. 2N-3) give every rank every block, starting
 * from rank r holding block r+1. Callers map their blocks onto this numbering. */
static int ring_cma(wf_comm *c, uint8_t *buf, size_t es, const size_t *off, const size_t *len,
                    wf_dtype dt, wf_reduce_op op, bool rs, bool ag, uint32_t seq, const char *what);

static int ring(wf_comm *c, uint8_t *buf, size_t es, const size_t *off, const size_t *len,
                wf_dtype dt, wf_reduce_op op, bool rs, bool ag, uint32_t seq, const char *what)
{
    if (c->cma)
        return ring_cma(c, buf, es, off, len, dt, op, rs, ag, seq, what);
    int n = c->size, rank = c->rank, right = (rank + 1) % n, left = (rank + n - 1) % n;
    size_t ce = c->chunk_bytes / es ? c->chunk_bytes / es : 1;
    size_t maxlen = 0;
    for (int v = 0; v < n; v++)
        maxlen = len[v] > maxlen ? len[v] : maxlen;
    size_t maxch = (maxlen + ce - 1) / ce;
    int first = rs ? 0 : n - 1, last = ag ? 2 * n - 3 : n - 2;
    uint8_t *tmp = NULL;
    if (rs && !(tmp = scratch(c, maxlen ? maxlen * es : 1)))
        return wf__err(WF_ENOMEM, "%s: no memory for %zu bytes of scratch", what, maxlen * es);
    size_t nsend_cap = (size_t)(last - first + 2) * (maxch ? maxch : 1), nsend = 0;
    wf_comm_req **sends = calloc(nsend_cap, sizeof *sends);
    wf_comm_req **recvs = calloc(maxch ? maxch : 1, sizeof *recvs);
    if (!sends || !recvs) {
        free(sends);
        free(recvs);
        return wf__err(WF_ENOMEM, "%s: no memory for %zu requests", what, nsend_cap);
    }
    uint64_t dl = deadline(c);
    int rc = 0;
    int v0 = rs ? rank : (rank + 1) % n;
    for (size_t k = 0; rc == 0 && k * ce < len[v0]; k++) {
        size_t cl = len[v0] - k * ce < ce ? len[v0] - k * ce : ce;
        rc = wf__isend(c, right, coll_tag(seq, first), buf + (off[v0] + k * ce) * es, cl * es,
                       &sends[nsend++]);
    }
    for (int s = first; rc == 0 && s <= last; s++) {
        bool reducing = s <= n - 2;
        int rb = reducing ? (rank - s - 1 + 2 * n) % n : (rank - (s - (n - 1)) + 2 * n) % n;
        size_t nch = (len[rb] + ce - 1) / ce;
        for (size_t k = 0; rc == 0 && k < nch; k++) {
            size_t cl = len[rb] - k * ce < ce ? len[rb] - k * ce : ce;
            uint8_t *dst = reducing ? tmp + k * ce * es : buf + (off[rb] + k * ce) * es;
            rc = wf__irecv(c, left, coll_tag(seq, s), dst, cl * es, &recvs[k]);
        }
        for (size_t k = 0; rc == 0 && k < nch; k++) {
            size_t cl = len[rb] - k * ce < ce ? len[rb] - k * ce : ce;
            if ((rc = wf__wait(recvs[k], dl, what)) < 0) {
                recvs[k] = NULL;
                break;
            }
            recvs[k] = NULL;
            uint8_t *mine = buf + (off[rb] + k * ce) * es;
            if (reducing)
                wf__reduce(mine, tmp + k * ce * es, cl, dt, op);
            if (s < last)
                rc = wf__isend(c, right, coll_tag(seq, s + 1), mine, cl * es, &sends[nsend++]);
        }
        if (rc < 0)
            return abandon(c, rc, NULL, 0, recvs, nch, sends, nsend, dl, what);
    }
    int rc2 = wf__wait_all(sends, nsend, dl, what);
    free(sends);
    free(recvs);
    return rc < 0 ? rc : rc2;
}

/* ---- Ring, single copy ----------------------------------------------------------------------
 * Every rank on one host (wf__cma_setup): instead of sending chunks, a rank tells its right
 * neighbour where its buffer is (8 bytes, once) and then that each chunk is ready (0 bytes);
 * the neighbour copies the chunk out of its memory with process_vm_readv and reduces it in
 * pieces that stay in cache. The same schedule and reduction order as ring(), so results are
 * bitwise those of ring(). A buffer is read only while its owner leaves it alone: a chunk
 * is announced once final for that step, and its owner writes it again only with data that
 * causally follows the read; at the end each rank waits for its right neighbour's "done"
 * before giving the buffer back. A dead neighbour makes the read fail (ESRCH, EFAULT): the
 * comm fails naming it, never an abort. */

#define CMA_PIECE 65536 /* bytes read and reduced at a time */

static int cma_read(wf_comm *c, int peer, void *dst, uint64_t addr, size_t bytes, const char *what)
{
    uint8_t *d = dst;
    while (bytes) {
        struct iovec l = { .iov_base = d, .iov_len = bytes };
        struct iovec r = { .iov_base = (void *)(uintptr_t)addr, .iov_len = bytes };
        ssize_t got = process_vm_readv((pid_t)c->peers[peer].pid, &l, 1, &r, 1, 0);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0) {
            char why[96];
            snprintf(why, sizeof why, "process_vm_readv of %zu bytes: %s", bytes,
                     got < 0 ? strerror(errno) : "read nothing");
            return wf__peer_fail(c, peer, what, why);
        }
        d += got;
        addr += (uint64_t)got;
        bytes -= (size_t)got;
    }
    return 0;
}

static int ring_cma(wf_comm *c, uint8_t *buf, size_t es, const size_t *off, const size_t *len,
                    wf_dtype dt, wf_reduce_op op, bool rs, bool ag, uint32_t seq, const char *what)
{
    int n = c->size, rank = c->rank, right = (rank + 1) % n, left = (rank + n - 1) % n;
    size_t ce = c->chunk_bytes / es ? c->chunk_bytes / es : 1;
    size_t pe = CMA_PIECE / es ? CMA_PIECE / es : 1;
    size_t maxlen = 0;
    for (int v = 0; v < n; v++)
        maxlen = len[v] > maxlen ? len[v] : maxlen;
    size_t maxch = (maxlen + ce - 1) / ce;
    int first = rs ? 0 : n - 1, last = ag ? 2 * n - 3 : n - 2;
    uint8_t *tmp = NULL;
    if (rs && !(tmp = scratch(c, pe * es)))
        return wf__err(WF_ENOMEM, "%s: no memory for %zu bytes of scratch", what, pe * es);
    size_t nsend_cap = (size_t)(last - first + 1) * (maxch ? maxch : 1) + 2, nsend = 0;
    wf_comm_req **sends = calloc(nsend_cap, sizeof *sends);
    wf_comm_req **recvs = calloc(maxch ? maxch : 1, sizeof *recvs);
    if (!sends || !recvs) {
        free(sends);
        free(recvs);
        return wf__err(WF_ENOMEM, "%s: no memory for %zu requests", what, nsend_cap);
    }
    uint64_t dl = deadline(c);
    uint64_t mine = (uint64_t)(uintptr_t)buf, theirs = 0;
    wf_comm_req *done_rq = NULL, *addr_rq = NULL;
    size_t nch = 0;
    /* The neighbours' buffers, and the "done" of the right one, posted first. */
    int rc = wf__irecv(c, left, coll_tag(seq, 0xfffd), &theirs, sizeof theirs, &addr_rq);
    if (rc == 0)
        rc = wf__irecv(c, right, coll_tag(seq, 0xfffe), NULL, 0, &done_rq);
    if (rc == 0)
        rc = wf__isend(c, right, coll_tag(seq, 0xfffd), &mine, sizeof mine, &sends[nsend++]);
    if (rc == 0) {
        rc = wf__wait(addr_rq, dl, what);
        addr_rq = NULL;
    }
    for (int s = first; rc == 0 && s <= last; s++) {
        bool reducing = s <= n - 2;
        int rb = reducing ? (rank - s - 1 + 2 * n) % n : (rank - (s - (n - 1)) + 2 * n) % n;
        nch = (len[rb] + ce - 1) / ce;
        /* At the first step the left neighbour's block is its input, ready since it sent
         * its address; later chunks are announced one by one. */
        for (size_t k = 0; rc == 0 && s > first && k < nch; k++)
            rc = wf__irecv(c, left, coll_tag(seq, s), NULL, 0, &recvs[k]);
        for (size_t k = 0; rc == 0 && k < nch; k++) {
            size_t cl = len[rb] - k * ce < ce ? len[rb] - k * ce : ce;
            if (s > first) {
                rc = wf__wait(recvs[k], dl, what);
                recvs[k] = NULL;
                if (rc < 0)
                    break;
            }
            size_t at = (off[rb] + k * ce) * es;
            for (size_t p = 0; rc == 0 && p < cl; p += pe) {
                size_t pl = cl - p < pe ? cl - p : pe;
                uint8_t *dst = buf + at + p * es;
                if (reducing) {
                    rc = cma_read(c, left, tmp, theirs + at + p * es, pl * es, what);
                    if (rc == 0)
                        wf__reduce(dst, tmp, pl, dt, op);
                } else {
                    rc = cma_read(c, left, dst, theirs + at + p * es, pl * es, what);
                }
            }
            if (rc == 0 && s < last)
                rc = wf__isend(c, right, coll_tag(seq, s + 1), NULL, 0, &sends[nsend++]);
        }
    }
    /* Done reading the left neighbour; wait until the right one is done reading us. */
    if (rc == 0)
        rc = wf__isend(c, left, coll_tag(seq, 0xfffe), NULL, 0, &sends[nsend++]);
    if (rc == 0) {
        rc = wf__wait(done_rq, dl, what);
        done_rq = NULL;
    }
    if (rc < 0) {
        wf_comm_req *rest[2] = { addr_rq, done_rq };
        return abandon(c, rc, rest, 2, recvs, nch, sends, nsend, dl, what);
    }
    int rc2 = wf__wait_all(sends, nsend, dl, what);
    free(sends);
    free(recvs);
    return rc2;
}

/* Splits 'count' elements into n blocks whose sizes differ by at most one. */
static void split(size_t count, int n, size_t *off, size_t *len)
{
    size_t base = count / (size_t)n, extra = count % (size_t)n;
    for (int b = 0; b < n; b++) {
        len[b] = base + ((size_t)b < extra);
        off[b] = (size_t)b * base + ((size_t)b < extra ? (size_t)b : extra);
    }
}

/* Blocks of 'len' elements, one per rank, for a ring that leaves virtual block r+1 on rank r:
 * virtual block v is block v-1. */
static void shifted_blocks(int n, size_t len, size_t *off, size_t *lens)
{
    for (int v = 0; v < n; v++) {
        off[v] = (size_t)((v + n - 1) % n) * len;
        lens[v] = len;
    }
}

#if WF_HAVE_NCCL
/* Where collective 'fn' runs: sets '*dev' to the CUDA device that holds both 'send' and 'recv',
 * or to -1 when both are host memory or 'empty' is true.
 * Returns 0, or WF_EINVAL when one buffer is on a CUDA device and the other is not on it. */
static int nccl_route(wf_comm *c, const char *fn, const void *send, const void *recv, bool empty,
                      int *dev)
{
    int d = empty ? -1 : wf__nccl_device_of(c, recv);
    *dev = -1;
    if (d < 0 && (empty || wf__nccl_device_of(c, send) < 0))
        return 0;
    if (d < 0 || wf__nccl_device_of(c, send) != d)
        return wf__err(WF_EINVAL,
                       "%s: send and recv must both be on CUDA device %d, or both in host memory",
                       fn, d);
    *dev = d;
    return 0;
}
#endif

/* ---- Public collectives ---------------------------------------------------------------------- */

static int allreduce_impl(wf_comm *c, const void *send, void *recv, size_t count, wf_dtype dt,
                          wf_reduce_op op)
{
    size_t bytes = 0;
    int rc = check_reduce("wf_comm_allreduce", c, send, recv, count, dt, op, 1, &bytes);
    if (rc < 0)
        return rc;
#if WF_HAVE_NCCL
    int dev;
    if ((rc = nccl_route(c, "wf_comm_allreduce", send, recv, count == 0, &dev)) < 0)
        return rc;
    if (dev >= 0)
        return wf__nccl_allreduce(c, dev, send, recv, count, dt, op);
#endif
    uint32_t seq = ++c->coll_seq;
    if (count && send != recv)
        memmove(recv, send, bytes);
    bool small = bytes <= c->small_bytes || count < (size_t)c->size;
    char what[128];
    snprintf(what, sizeof what, "allreduce #%u (%s, %zu x %s)", seq,
             small ? "recursive doubling" : "ring", count, wf_dtype_name(dt));
    if (c->size > 1 && count) {
        if (small) {
            rc = rd_allreduce(c, recv, count, bytes, dt, op, seq, what);
        } else {
            size_t *ol = malloc(2 * (size_t)c->size * sizeof *ol);
            if (!ol)
                return wf__err(WF_ENOMEM, "%s: out of memory", what);
            split(count, c->size, ol, ol + c->size);
            rc = ring(c, recv, wf_dtype_size(dt), ol, ol + c->size, dt, op, true, true, seq, what);
            free(ol);
        }
    }
    if (rc == 0 && op == WF_REDUCE_MEAN)
        scale_mean(recv, count, dt, c->size);
    return rc;
}

static int reduce_scatter_impl(wf_comm *c, const void *send, void *recv, size_t count, wf_dtype dt,
                               wf_reduce_op op)
{
    size_t bytes = 0;
    int rc = check_reduce("wf_comm_reduce_scatter", c, send, recv, count, dt, op,
                          c ? (size_t)c->size : 1, &bytes);
    if (rc < 0)
        return rc;
#if WF_HAVE_NCCL
    int dev;
    if ((rc = nccl_route(c, "wf_comm_reduce_scatter", send, recv, count == 0, &dev)) < 0)
        return rc;
    if (dev >= 0)
        return wf__nccl_reduce_scatter(c, dev, send, recv, count, dt, op);
#endif
    uint32_t seq = ++c->coll_seq;
    int n = c->size;
    char what[128];
    snprintf(what, sizeof what, "reduce_scatter #%u (%zu x %s per rank)", seq, count,
             wf_dtype_name(dt));
    uint8_t *work = malloc(bytes ? bytes * (size_t)n : 1);
    size_t *ol = malloc(2 * (size_t)n * sizeof *ol);
    if (!work || !ol) {
        free(work);
        free(ol);
        return wf__err(WF_ENOMEM, "%s: out of memory", what);
    }
    if (count)
        memcpy(work, send, bytes * (size_t)n);
    shifted_blocks(n, count, ol, ol + n);
    if (n > 1 && count)
        rc = ring(c, work, wf_dtype_size(dt), ol, ol + n, dt, op, true, false, seq, what);
    if (rc == 0 && count) {
        memcpy(recv, work + (size_t)c->rank * bytes, bytes);
        if (op == WF_REDUCE_MEAN)
            scale_mean(recv, count, dt, n);
    }
    free(work);
    free(ol);
    return rc;
}

static int allgather_impl(wf_comm *c, const void *send, void *recv, size_t bytes)
{
    int rc = check_comm("wf_comm_allgather", c);
    if (rc < 0)
        return rc;
    int n = c->size;
    if (bytes > SIZE_MAX / (size_t)n)
        return wf__err(WF_EINVAL, "wf_comm_allgather: %zu bytes x %d ranks overflow", bytes, n);
    if (bytes && (!send || !recv))
        return wf__err(WF_EINVAL, "wf_comm_allgather: NULL buffer for %zu bytes", bytes);
#if WF_HAVE_NCCL
    int dev;
    if ((rc = nccl_route(c, "wf_comm_allgather", send, recv, bytes == 0, &dev)) < 0)
        return rc;
    if (dev >= 0)
        return wf__nccl_allgather(c, dev, send, recv, bytes);
#endif
    uint32_t seq = ++c->coll_seq;
    if (!bytes)
        return 0;
    memmove((uint8_t *)recv + (size_t)c->rank * bytes, send, bytes);
    char what[96];
    snprintf(what, sizeof what, "allgather #%u (%zu bytes per rank)", seq, bytes);
    size_t *ol = malloc(2 * (size_t)n * sizeof *ol);
    if (!ol)
        return wf__err(WF_ENOMEM, "%s: out of memory", what);
    shifted_blocks(n, bytes, ol, ol + n);
    if (n > 1)
        rc = ring(c, recv, 1, ol, ol + n, WF_U8, WF_REDUCE_SUM, false, true, seq, what);
    free(ol);
    return rc;
}

static int broadcast_impl(wf_comm *c, void *buf, size_t bytes, int root)
{
    int rc = check_comm("wf_comm_broadcast", c);
    if (rc < 0)
        return rc;
    int n = c->size;
    if (root < 0 || root >= n)
        return wf__err(WF_EINVAL, "wf_comm_broadcast: root %d out of range 0..%d", root, n - 1);
    if (bytes && !buf)
        return wf__err(WF_EINVAL, "wf_comm_broadcast: NULL buffer for %zu bytes", bytes);
#if WF_HAVE_NCCL
    int dev = bytes ? wf__nccl_device_of(c, buf) : -1;
    if (dev >= 0)
        return wf__nccl_broadcast(c, dev, buf, bytes, root);
#endif
    uint32_t seq = ++c->coll_seq;
    char what[96];
    snprintf(what, sizeof what, "broadcast #%u (%zu bytes from rank %d)", seq, bytes, root);
    uint64_t dl = deadline(c);
    int rel = (c->rank - root + n) % n, mask = 1;
    wf_comm_req *rq = NULL;
    /* Binomial tree: receive from the parent, then send to the children, farthest first. */
    while (mask < n) {
        if (rel & mask) {
            int parent = (rel - mask + root) % n;
            if ((rc = wf__irecv(c, parent, coll_tag(seq, 0), buf, bytes, &rq)) < 0 ||
                (rc = wf__wait(rq, dl, what)) < 0)
                return rc;
            break;
        }
        mask <<= 1;
    }
    wf_comm_req *sends[32] = { 0 };
    int ns = 0;
    for (mask >>= 1; mask > 0; mask >>= 1)
        if (rel + mask < n && rc == 0)
            rc = wf__isend(c, (rel + mask + root) % n, coll_tag(seq, 0), buf, bytes, &sends[ns++]);
    int rc2 = wf__wait_all(sends, (size_t)ns, dl, what);
    return rc < 0 ? rc : rc2;
}

static int barrier_impl(wf_comm *c)
{
    int rc = check_comm("wf_comm_barrier", c);
    if (rc < 0)
        return rc;
    int n = c->size;
    uint32_t seq = ++c->coll_seq;
    char what[64];
    snprintf(what, sizeof what, "barrier #%u", seq);
    uint64_t dl = deadline(c);
    /* Dissemination: in round k, tell rank+2^k and hear from rank-2^k. */
    int step = 0;
    for (int d = 1; d < n; d <<= 1, step++) {
        wf_comm_req *rq[2] = { NULL, NULL };
        rc = wf__irecv(c, (c->rank - d + n) % n, coll_tag(seq, step), NULL, 0, &rq[0]);
        if (rc == 0)
            rc = wf__isend(c, (c->rank + d) % n, coll_tag(seq, step), NULL, 0, &rq[1]);
        int rc2 = wf__wait_all(rq, 2, dl, what);
        if (rc < 0 || rc2 < 0)
            return rc < 0 ? rc : rc2;
    }
    return 0;
}

/* ---- Entry points: each collective runs in busy mode (internal.h) ----------------------- */

int wf_comm_allreduce(wf_comm *c, const void *send, void *recv, size_t count, wf_dtype dt,
                      wf_reduce_op op)
{
    if (c)
        wf__busy_begin(c);
    int rc = allreduce_impl(c, send, recv, count, dt, op);
    if (c)
        wf__busy_end(c);
    return rc;
}

int wf_comm_reduce_scatter(wf_comm *c, const void *send, void *recv, size_t count, wf_dtype dt,
                           wf_reduce_op op)
{
    if (c)
        wf__busy_begin(c);
    int rc = reduce_scatter_impl(c, send, recv, count, dt, op);
    if (c)
        wf__busy_end(c);
    return rc;
}

int wf_comm_allgather(wf_comm *c, const void *send, void *recv, size_t bytes)
{
    if (c)
        wf__busy_begin(c);
    int rc = allgather_impl(c, send, recv, bytes);
    if (c)
        wf__busy_end(c);
    return rc;
}

int wf_comm_broadcast(wf_comm *c, void *buf, size_t bytes, int root)
{
    if (c)
        wf__busy_begin(c);
    int rc = broadcast_impl(c, buf, bytes, root);
    if (c)
        wf__busy_end(c);
    return rc;
}

int wf_comm_barrier(wf_comm *c)
{
    if (c)
        wf__busy_begin(c);
    int rc = barrier_impl(c);
    if (c)
        wf__busy_end(c);
    return rc;
}

/* ---- Single copy: the agreement ---------------------------------------------------------- */

static bool tls_has_shm(const char *tls)
{
    if (!tls || tls[0] == '^') /* UCX's choice (weft's default "^cma" too) includes shm */
        return true;
    return strstr(tls, "sm") || strstr(tls, "shm") || strstr(tls, "cma") || strstr(tls, "posix") ||
           strstr(tls, "sysv") || strstr(tls, "all");
}

int wf__cma_setup(wf_comm *c, const char *tls)
{
    c->cma = false;
    int n = c->size;
    if (n < 2)
        return 0;
    /* Every rank takes part, whatever it wants, so that all stay in step; the verdict is
     * the maximum of everyone's "no". */
    int32_t no = !tls_has_shm(tls ? tls : getenv("UCX_TLS"));
    for (int r = 0; r < n; r++)
        no |= strcmp(c->peers[r].host, c->host) != 0;
    int left = (c->rank + n - 1) % n;
    c->cma_word = 0x574654434d410000ull ^ c->incarnation;
    uint64_t *addrs = malloc((size_t)n * sizeof *addrs), mine = (uint64_t)(uintptr_t)&c->cma_word;
    if (!addrs)
        return wf__err(WF_ENOMEM, "wf_comm_create: out of memory");
    int rc = allgather_impl(c, &mine, addrs, sizeof mine);
    if (rc == 0 && !no) {
        uint64_t got = 0;
        struct iovec l = { .iov_base = &got, .iov_len = sizeof got };
        struct iovec r = { .iov_base = (void *)(uintptr_t)addrs[left], .iov_len = sizeof got };
        /* A pid of another namespace, a ptrace policy (Yama) or seccomp all end here. */
        if (process_vm_readv((pid_t)c->peers[left].pid, &l, 1, &r, 1, 0) != (ssize_t)sizeof got ||
            got != (0x574654434d410000ull ^ c->peers[left].incarnation))
            no = 1;
    }
    free(addrs);
    if (rc == 0)
        rc = allreduce_impl(c, &no, &no, 1, WF_I32, WF_REDUCE_MAX);
    if (rc == 0)
        c->cma = no == 0;
    return rc;
}
