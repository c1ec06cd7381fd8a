/* transport/coll.c: collectives on host memory over UCX tags: all-reduce, reduce-scatter,
 * all-gather, broadcast, barrier.
 * Algorithms: all-reduce up to small_bytes uses recursive doubling (log2 N exchanges of the
 * whole buffer; ranks beyond a power of two fold into a partner first); larger ones a ring:
 * N-1 reduce-scatter steps then N-1 all-gather steps, each block cut into chunk_bytes
 * chunks, and each chunk forwarded as soon as it is reduced, so reduction overlaps the
 * transfer of the next chunks and one step flows into the next (a plain chunked ring over
 * UCX tags, timed beside Open MPI's all-reduce on 2 ranks of one host, was 1.3-2.5x faster
 * from 16 KiB up but 12x slower at 4 KiB: small messages need their own path). The small
 * path copies nothing itself: recursive doubling sends the caller's 'send', receives into
 * 'recv' (or the comm's scratch) and reduces into 'recv', with a reduction that vectorizes;
 * and on shared memory, creation warms UCX's FIFOs (shm_warmup), whose first pass otherwise
 * page-faults through a program's first 32 small all-reduces.
 * On one host (wf__cma_setup) the ring moves data with process_vm_readv instead (ring_cma),
 * and an all-reduce of two ranks with reads and writes of the peer's memory (pair_cma).
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

/* dst = lo op hi, element by element, where 'lo' holds the lower rank's data (the order
 * that makes max(-0, +0) and NaN payloads come out the same on every rank). 'dst' may be
 * 'lo' or 'hi' itself, but never overlaps either otherwise. Blocks of 8 are loaded before
 * any is stored, which is what lets the compiler vectorize at -O2 without alias checks (a
 * plain loop stayed scalar, addss: 1024 f32 in 1.1 us instead of 0.4, loaded machine). */
#define REDUCE3(T, F)                     \
    do {                                  \
        T *d = dst;                       \
        const T *a = lo, *b = hi;         \
        size_t i = 0, n8 = n - n % 8;     \
        for (; i < n8; i += 8) {          \
            T x[8], y[8];                 \
            for (int k = 0; k < 8; k++) { \
                x[k] = a[i + k];          \
                y[k] = b[i + k];          \
            }                             \
            for (int k = 0; k < 8; k++)   \
                d[i + k] = F(x[k], y[k]); \
        }                                 \
        for (; i < n; i++)                \
            d[i] = F(a[i], b[i]);         \
    } while (0)

#define ADD(a, b)  ((a) + (b))
#define IMAX(a, b) ((b) > (a) ? (b) : (a))
/* Max of floats: NaN wins (from either side), so one NaN poisons the result as a sum would. */
#define FMAX(a, b) ((b) > (a) || (b) != (b) ? (b) : (a))
/* Integer sums wrap around (two's complement), as in every MPI. */
#define ADD32(a, b) ((int32_t)((uint32_t)(a) + (uint32_t)(b)))
#define ADD64(a, b) ((int64_t)((uint64_t)(a) + (uint64_t)(b)))

static void reduce3(void *dst, const void *lo, const void *hi, size_t n, wf_dtype dt,
                    wf_reduce_op op)
{
    bool mx = op == WF_REDUCE_MAX;
    switch (dt) {
    case WF_F32:
        if (mx)
            REDUCE3(float, FMAX);
        else
            REDUCE3(float, ADD);
        break;
    case WF_F64:
        if (mx)
            REDUCE3(double, FMAX);
        else
            REDUCE3(double, ADD);
        break;
    case WF_I32:
        if (mx)
            REDUCE3(int32_t, IMAX);
        else
            REDUCE3(int32_t, ADD32);
        break;
    case WF_I64:
        if (mx)
            REDUCE3(int64_t, IMAX);
        else
            REDUCE3(int64_t, ADD64);
        break;
    case WF_BF16: {
        uint16_t *d = dst;
        const uint16_t *a = lo, *b = hi;
        for (size_t i = 0; i < n; i++) {
            float x = wf__bf16_to_f32(a[i]), y = wf__bf16_to_f32(b[i]);
            d[i] = wf__f32_to_bf16(mx ? FMAX(x, y) : x + y);
        }
        break;
    }
    default:
        break; /* refused by check_reduce() */
    }
}

void wf__reduce(void *dst, const void *src, size_t n, wf_dtype dt, wf_reduce_op op)
{
    reduce3(dst, dst, src, n, dt, op);
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

/* Appends 't' to the string 's' (capacity 'cap', 'at' bytes used); returns the new length. */
static size_t put_str(char *s, size_t cap, size_t at, const char *t)
{
    while (*t && at + 1 < cap)
        s[at++] = *t++;
    s[at] = 0;
    return at;
}

static size_t put_u64(char *s, size_t cap, size_t at, uint64_t v)
{
    char d[21], *p = d + sizeof d - 1;
    *p = 0;
    do
        *--p = (char)('0' + v % 10);
    while (v /= 10);
    return put_str(s, cap, at, p);
}

/* Writes "<name><seq> (<algo>, <count> x <dtype>)", the operation named in messages, without
 * snprintf: 430 ns a call here, a quarter of a 2-rank 4 KiB all-reduce on shared memory. */
static void name_op(char *s, size_t cap, const char *name, uint32_t seq, const char *algo,
                    size_t count, const char *dtype)
{
    size_t at = put_str(s, cap, 0, name);
    at = put_u64(s, cap, at, seq);
    at = put_str(s, cap, at, " (");
    at = put_str(s, cap, at, algo);
    at = put_str(s, cap, at, ", ");
    at = put_u64(s, cap, at, count);
    at = put_str(s, cap, at, " x ");
    at = put_str(s, cap, at, dtype);
    put_str(s, cap, at, ")");
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

/* Recursive doubling reads the caller's 'send' and writes only 'recv': no copy of the input
 * first. A copy is not free here: glibc 2.36's memcpy copies large blocks with 'rep movsb',
 * which on this AMD EPYC crawls when the destination lies a few bytes after the source
 * modulo 4096 (measured at 8, 16 and 24 bytes: 16 KiB in 5.4-6.3 us instead of 0.18), and
 * two malloc'd buffers land there often. 'mine' is what this rank holds so far (the
 * caller's 'send', or 'out' after a first reduction); the partner's data goes straight to
 * 'out' when 'mine' is not 'out', else to 'tmp'. */
static uint8_t *rd_inbox(const uint8_t *mine, uint8_t *out, uint8_t *tmp)
{
    return mine == out ? tmp : out;
}

/* Exchanges 'mine' with 'partner' at 'step' and writes 'lower rank's data op higher rank's'
 * to 'out'. */
static int rd_exchange(wf_comm *c, const uint8_t *mine, uint8_t *out, uint8_t *tmp, size_t count,
                       size_t bytes, wf_dtype dt, wf_reduce_op op, int partner, uint32_t seq,
                       int step, uint64_t dl, const char *what)
{
    uint8_t *in = rd_inbox(mine, out, tmp);
    wf_comm_req *rq[2] = { NULL, NULL };
    int rc = wf__irecv(c, partner, coll_tag(seq, step), in, bytes, &rq[0]);
    if (rc == 0)
        rc = wf__isend(c, partner, coll_tag(seq, step), mine, bytes, &rq[1]);
    int rc2 = wf__wait_all(rq, 2, dl, what); /* the send too: 'out' may be what it sends */
    if (rc < 0 || rc2 < 0)
        return rc < 0 ? rc : rc2;
    if (c->rank < partner)
        reduce3(out, mine, in, count, dt, op);
    else
        reduce3(out, in, mine, count, dt, op);
    return 0;
}

/* All-reduces 'send' into 'recv' ('send' may be 'recv'; they do not overlap otherwise). */
static int rd_allreduce(wf_comm *c, const uint8_t *send, uint8_t *recv, size_t count, size_t bytes,
                        wf_dtype dt, wf_reduce_op op, uint32_t seq, const char *what)
{
    int n = c->size, rank = c->rank, p = 1, rc = 0;
    while (p * 2 <= n)
        p *= 2;
    int rem = n - p;
    uint8_t *tmp = scratch(c, bytes ? bytes : 1); /* kept by the comm: no allocation per call */
    if (!tmp)
        return wf__err(WF_ENOMEM, "%s: no memory for %zu bytes of scratch", what, bytes);
    uint64_t dl = deadline(c);
    const uint8_t *mine = send;
    int vrank;
    wf_comm_req *rq = NULL;
    /* Fold: of the first 2*rem ranks, the even ones hand their data to the next odd one. */
    if (rank < 2 * rem) {
        if (rank % 2 == 0) {
            if ((rc = wf__isend(c, rank + 1, coll_tag(seq, 0), mine, bytes, &rq)) < 0 ||
                (rc = wf__wait(rq, dl, what)) < 0)
                return rc;
            vrank = -1;
        } else {
            uint8_t *in = rd_inbox(mine, recv, tmp);
            if ((rc = wf__irecv(c, rank - 1, coll_tag(seq, 0), in, bytes, &rq)) < 0 ||
                (rc = wf__wait(rq, dl, what)) < 0)
                return rc;
            reduce3(recv, in, mine, count, dt, op); /* rank - 1 is the lower one */
            mine = recv;
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
            rc =
                rd_exchange(c, mine, recv, tmp, count, bytes, dt, op, partner, seq, step, dl, what);
            if (rc < 0)
                return rc;
            mine = recv;
        }
    }
    /* Unfold: the odd ranks give the result back. */
    if (rank < 2 * rem) {
        if (rank % 2 == 0)
            rc = wf__irecv(c, rank + 1, coll_tag(seq, 0xffff), recv, bytes, &rq);
        else
            rc = wf__isend(c, rank - 1, coll_tag(seq, 0xffff), recv, bytes, &rq);
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
static int ring_cma(wf_comm *c, uint8_t *buf, const uint8_t *src, size_t es, const size_t *off,
                    const size_t *len, wf_dtype dt, wf_reduce_op op, bool rs, bool ag, uint32_t seq,
                    const char *what);

static int pair_cma(wf_comm *c, uint8_t *buf, const uint8_t *src, size_t es, const size_t *off,
                    const size_t *len, wf_dtype dt, wf_reduce_op op, uint32_t seq,
                    const char *what);

#define RING_SLOTS 4 /* chunks of scratch a copying ring's reducing step receives into */

/* The length of chunk k of a block of 'len' elements cut in chunks of 'ce'. */
static size_t chunk_len(size_t len, size_t k, size_t ce)
{
    return len - k * ce < ce ? len - k * ce : ce;
}

/* 'src': the input when it is not in 'buf' already (NULL: it is), read by the first sends and
 * by each reduction (each block is reduced once per rank), which saves copying the input
 * into 'buf' first; results go to 'buf'. */
static int ring(wf_comm *c, uint8_t *buf, const uint8_t *src, size_t es, const size_t *off,
                const size_t *len, wf_dtype dt, wf_reduce_op op, bool rs, bool ag, uint32_t seq,
                const char *what)
{
    if (c->cma && c->size == 2 && rs && ag)
        return pair_cma(c, buf, src, es, off, len, dt, op, seq, what);
    if (c->cma)
        return ring_cma(c, buf, src, es, off, len, dt, op, rs, ag, seq, what);
    int n = c->size, rank = c->rank, right = (rank + 1) % n, left = (rank + n - 1) % n;
    size_t ce = c->chunk_bytes / es ? c->chunk_bytes / es : 1;
    size_t maxlen = 0;
    for (int v = 0; v < n; v++)
        maxlen = len[v] > maxlen ? len[v] : maxlen;
    size_t maxch = (maxlen + ce - 1) / ce;
    int first = rs ? 0 : n - 1, last = ag ? 2 * n - 3 : n - 2;
    /* Reducing, chunks arrive in RING_SLOTS slots of scratch that stay in cache, instead of
     * a whole block of it that went to memory and back. */
    size_t slots = maxch < RING_SLOTS ? maxch : RING_SLOTS;
    uint8_t *tmp = NULL;
    if (rs && !(tmp = scratch(c, slots ? slots * ce * es : 1)))
        return wf__err(WF_ENOMEM, "%s: no memory for %zu bytes of scratch", what, slots * ce * es);
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
    const uint8_t *in = src ? src : buf;
    for (size_t k = 0; rc == 0 && k * ce < len[v0]; k++) {
        rc = wf__isend(c, right, coll_tag(seq, first), in + (off[v0] + k * ce) * es,
                       chunk_len(len[v0], k, ce) * es, &sends[nsend++]);
    }
    for (int s = first; rc == 0 && s <= last; s++) {
        bool reducing = s <= n - 2;
        int rb = reducing ? (rank - s - 1 + 2 * n) % n : (rank - (s - (n - 1)) + 2 * n) % n;
        size_t nch = (len[rb] + ce - 1) / ce, posted = 0;
        uint64_t tag = coll_tag(seq, s);
        /* Reducing, chunk k lands in slot k % slots, posted once chunk k - slots is reduced. */
        for (; rc == 0 && posted < nch && (!reducing || posted < slots); posted++)
            rc = wf__irecv(c, left, tag,
                           reducing ? tmp + posted * ce * es : buf + (off[rb] + posted * ce) * es,
                           chunk_len(len[rb], posted, ce) * es, &recvs[posted]);
        for (size_t k = 0; rc == 0 && k < nch; k++) {
            size_t cl = chunk_len(len[rb], k, ce);
            if ((rc = wf__wait(recvs[k], dl, what)) < 0) {
                recvs[k] = NULL;
                break;
            }
            recvs[k] = NULL;
            uint8_t *mine = buf + (off[rb] + k * ce) * es;
            if (reducing)
                reduce3(mine, in + (off[rb] + k * ce) * es, tmp + (k % slots) * ce * es, cl, dt,
                        op);
            if (rc == 0 && reducing && posted < nch) { /* chunk k's slot is free again */
                rc = wf__irecv(c, left, tag, tmp + (posted % slots) * ce * es,
                               chunk_len(len[rb], posted, ce) * es, &recvs[posted]);
                posted++;
            }
            if (rc == 0 && s < last)
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
 * neighbour where its buffer and its input are (16 bytes, once) and then that each chunk is
 * ready (0 bytes); the first step reads the neighbour's input and reduces it with the rank's
 * own input straight into its buffer, so an all-reduce copies nothing before it starts;
 * the neighbour copies the chunk out of its memory with process_vm_readv and reduces it in
 * pieces that stay in cache. The same schedule and reduction order as ring(), so results are
 * bitwise those of ring(). A buffer is read only while its owner leaves it alone: a chunk
 * is announced once final for that step, and its owner writes it again only with data that
 * causally follows the read; at the end each rank waits for its right neighbour's "done"
 * before giving the buffer back. A dead neighbour makes the read fail (ESRCH, EFAULT): the
 * comm fails naming it, never an abort. */

#define CMA_PIECE 65536 /* bytes read and reduced at a time */
#define CMA_PAGE  4096u
/* pair_cma's piece: 16 MiB all-reduces ran at 4.1-4.3 GB/s bus bandwidth with it, 3.8-4.1
 * with 64 KiB, 3.2-3.3 with 32 KiB, 3.8-4.2 with 256 KiB. */
#define PAIR_PIECE 131072

int wf__cma_copy(wf_comm *c, int peer, void *local, uint64_t addr, size_t bytes, bool to_peer,
                 const char *what)
{
    uint8_t *d = local;
    while (bytes) {
        struct iovec l = { .iov_base = d, .iov_len = bytes };
        struct iovec r = { .iov_base = (void *)(uintptr_t)addr, .iov_len = bytes };
        pid_t pid = (pid_t)c->peers[peer].pid;
        ssize_t got = to_peer ? process_vm_writev(pid, &l, 1, &r, 1, 0)
                              : process_vm_readv(pid, &l, 1, &r, 1, 0);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0) {
            char why[96];
            snprintf(why, sizeof why, "process_vm_%s of %zu bytes: %s",
                     to_peer ? "writev" : "readv", bytes,
                     got < 0 ? strerror(errno) : "moved nothing");
            return wf__peer_fail(c, peer, what, why);
        }
        d += got;
        addr += (uint64_t)got;
        bytes -= (size_t)got;
    }
    return 0;
}

static int ring_cma(wf_comm *c, uint8_t *buf, const uint8_t *src, size_t es, const size_t *off,
                    const size_t *len, wf_dtype dt, wf_reduce_op op, bool rs, bool ag, uint32_t seq,
                    const char *what)
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
    /* Two pages more than a piece: each read lands at its source's offset within a page (the
     * kernel's copy, like glibc's memcpy, runs several times slower on this CPU when the
     * destination sits a few bytes past the source modulo 4096). */
    if (rs && !(tmp = scratch(c, pe * es + 2 * CMA_PAGE)))
        return wf__err(WF_ENOMEM, "%s: no memory for %zu bytes of scratch", what, pe * es);
    uint8_t *tmp_page = (uint8_t *)(((uintptr_t)tmp + CMA_PAGE - 1) & ~(uintptr_t)(CMA_PAGE - 1));
    size_t nsend_cap = (size_t)(last - first + 1) * (maxch ? maxch : 1) + 2, nsend = 0;
    wf_comm_req **sends = calloc(nsend_cap, sizeof *sends);
    wf_comm_req **recvs = calloc(maxch ? maxch : 1, sizeof *recvs);
    if (!sends || !recvs) {
        free(sends);
        free(recvs);
        return wf__err(WF_ENOMEM, "%s: no memory for %zu requests", what, nsend_cap);
    }
    uint64_t dl = deadline(c);
    /* Where each rank's blocks are: [0] its working buffer, [1] its input ('src', or the
     * buffer). The input is read at the first step only, the buffer afterwards. */
    uint64_t mine[2] = { (uint64_t)(uintptr_t)buf, (uint64_t)(uintptr_t)(src ? src : buf) };
    uint64_t theirs[2] = { 0, 0 };
    wf_comm_req *done_rq = NULL, *addr_rq = NULL;
    size_t nch = 0;
    /* The neighbours' buffers, and the "done" of the right one, posted first. */
    int rc = wf__irecv(c, left, coll_tag(seq, 0xfffd), theirs, sizeof theirs, &addr_rq);
    if (rc == 0)
        rc = wf__irecv(c, right, coll_tag(seq, 0xfffe), NULL, 0, &done_rq);
    if (rc == 0)
        rc = wf__isend(c, right, coll_tag(seq, 0xfffd), mine, sizeof mine, &sends[nsend++]);
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
            size_t cl = chunk_len(len[rb], k, ce);
            if (s > first) {
                rc = wf__wait(recvs[k], dl, what);
                recvs[k] = NULL;
                if (rc < 0)
                    break;
            }
            size_t at = (off[rb] + k * ce) * es;
            uint64_t from = theirs[s == first ? 1 : 0] + at;
            /* Reducing, this rank's own part of block rb is its input, untouched so far
             * (each block is reduced once per rank): the result goes to 'buf'. */
            const uint8_t *own = (src ? src : buf) + at;
            for (size_t p = 0; rc == 0 && p < cl; p += pe) {
                size_t pl = cl - p < pe ? cl - p : pe;
                uint8_t *dst = buf + at + p * es;
                if (reducing) {
                    uint8_t *t = tmp_page + ((from + p * es) & (CMA_PAGE - 1));
                    rc = wf__cma_copy(c, left, t, from + p * es, pl * es, false, what);
                    if (rc == 0)
                        reduce3(dst, own + p * es, t, pl, dt, op);
                } else {
                    rc = wf__cma_copy(c, left, dst, from + p * es, pl * es, false, what);
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

/* Two ranks, all-reduce: each rank reduces its block piece by piece as ring_cma() does, then
 * writes each reduced piece into the peer's buffer with process_vm_writev while the piece is
 * still in cache, instead of the peer reading it back from memory in an all-gather step
 * (which also needed an announcement per chunk). The same block per rank and the same
 * reduction as ring(), so the same bits. What this rank writes is the peer's block that the
 * peer itself never touches during the call (with send == recv, input this rank has already
 * read); each rank returns only after the peer's "done", so no write lands in a buffer that
 * was given back. */
static int pair_cma(wf_comm *c, uint8_t *buf, const uint8_t *src, size_t es, const size_t *off,
                    const size_t *len, wf_dtype dt, wf_reduce_op op, uint32_t seq, const char *what)
{
    int peer = 1 - c->rank, rb = peer; /* as in ring(): rank r reduces block r+1 */
    size_t pe = PAIR_PIECE / es ? PAIR_PIECE / es : 1;
    uint8_t *tmp = scratch(c, pe * es + 2 * CMA_PAGE);
    if (!tmp)
        return wf__err(WF_ENOMEM, "%s: no memory for %zu bytes of scratch", what, pe * es);
    uint8_t *tmp_page = (uint8_t *)(((uintptr_t)tmp + CMA_PAGE - 1) & ~(uintptr_t)(CMA_PAGE - 1));
    const uint8_t *in = src ? src : buf;
    uint64_t mine[2] = { (uint64_t)(uintptr_t)buf, (uint64_t)(uintptr_t)in };
    uint64_t theirs[2] = { 0, 0 };
    /* addr_rq, done_rq, then the two sends. */
    wf_comm_req *rq[4] = { NULL, NULL, NULL, NULL };
    uint64_t dl = deadline(c);
    int rc = wf__irecv(c, peer, coll_tag(seq, 0xfffd), theirs, sizeof theirs, &rq[0]);
    if (rc == 0)
        rc = wf__irecv(c, peer, coll_tag(seq, 0xfffe), NULL, 0, &rq[1]);
    if (rc == 0)
        rc = wf__isend(c, peer, coll_tag(seq, 0xfffd), mine, sizeof mine, &rq[2]);
    if (rc == 0) {
        rc = wf__wait(rq[0], dl, what);
        rq[0] = NULL;
    }
    for (size_t p = 0; rc == 0 && p < len[rb]; p += pe) {
        size_t pl = len[rb] - p < pe ? len[rb] - p : pe, at = (off[rb] + p) * es;
        uint8_t *t = tmp_page + ((theirs[1] + at) & (CMA_PAGE - 1));
        rc = wf__cma_copy(c, peer, t, theirs[1] + at, pl * es, false, what);
        if (rc == 0) {
            reduce3(buf + at, in + at, t, pl, dt, op);
            rc = wf__cma_copy(c, peer, buf + at, theirs[0] + at, pl * es, true, what);
        }
    }
    if (rc == 0)
        rc = wf__isend(c, peer, coll_tag(seq, 0xfffe), NULL, 0, &rq[3]);
    if (rc == 0) {
        rc = wf__wait(rq[1], dl, what);
        rq[1] = NULL;
    }
    if (rc < 0)
        return abandon(c, rc, rq, 4, NULL, 0, NULL, 0, dl, what);
    return wf__wait_all(rq + 2, 2, dl, what);
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

/* ---- Ranks that left ------------------------------------------------------------------------ */

/* The collectives by the kind a rank publishes in 'coll_now' (internal.h): enum wf__op_kind,
 * named by wf__kind_name(). */

void wf__coll_where(const wf_comm *c, char *buf, size_t size)
{
    uint64_t now = atomic_load(&c->coll_now);
    unsigned kind = (unsigned)(now & 0xff);
    if (now >> 8 == 0)
        snprintf(buf, size, "no collective yet");
    else
        snprintf(buf, size, "%s #%llu", wf__kind_name(kind), (unsigned long long)(now >> 8));
}

int wf__coll_check_left(wf_comm *c)
{
    uint64_t left = atomic_load(&c->left), now = atomic_load(&c->coll_now);
    if (!left)
        return 0;
    uint32_t n = (uint32_t)(left >> 32) - 1;
    int rank = (int)(left & 0xffffffffu);
    if (now >> 8 <= n)
        return 0; /* it took part in every collective this rank entered */
    char where[64];
    wf__coll_where(c, where, sizeof where);
    wf__comm_fail_quiet(c, WF_EPEER, rank,
                        "rank %d (host %s, pid %u) left the comm (wf_comm_destroy) after %u "
                        "collectives, but rank %d is at %s, which it never joined",
                        rank, c->peers[rank].host[0] ? c->peers[rank].host : "?",
                        c->peers[rank].pid, n, c->rank, where);
    return wf__comm_failed(c); /* the caller's message too */
}

int wf__coll_left(wf_comm *c, int rank, uint32_t n)
{
    /* The leaver with the fewest collectives is the one every later collective misses. */
    uint64_t mine = ((uint64_t)n + 1) << 32 | (uint32_t)rank;
    uint64_t cur = atomic_load(&c->left);
    while ((cur == 0 || mine < cur) && !atomic_compare_exchange_weak(&c->left, &cur, mine))
        ;
    return wf__coll_check_left(c);
}

/* ---- Call descriptors --------------------------------------------------------------------
 * Each collective tells every other rank what it is: desc[0] = seq | kind << 32 | dtype << 40
 * | op << 48, desc[1] = count (elements; bytes for allgather and broadcast), desc[2] = root +
 * 1 (broadcast) or 0, desc[3] = the graph hash (0: none). 32 bytes sent eagerly to each rank
 * at entry (tag step DESC_STEP) while the data moves, so a matching call costs one small
 * message to and from each other rank; a different call is seen when its descriptor arrives
 * (wf__coll_desc_arrived, in UCX's callback) and fails the comm, also when the data would
 * never match (another kind or size takes other tags and lengths). On exit a collective
 * returns its result only once every rank's descriptor came and matched, so no rank, next to
 * the odd one or not, completes a mismatched call, whatever the algorithm (recursive
 * doubling, either ring, the tree, the barrier). Sending only to the ring neighbours was one
 * message fewer each way from 4 ranks up, but let a rank that is not next to the odd one
 * return a wrong sum (an op mismatch in recursive doubling of 4 ranks did). The cost is
 * 2 (N - 1) small messages a call: for 2 and 3 ranks what the neighbours alone cost. */
#define DESC_STEP 0xfffe

static const char *const reduce_names[] = { "?", "sum", "mean", "max" };

/* "allreduce #12 (f32 x 1000, sum)" and the like, from a descriptor. */
static void desc_describe(const uint64_t *d, char *s, size_t n)
{
    unsigned kind = (unsigned)(d[0] >> 32) & 0xff, dt = (unsigned)(d[0] >> 40) & 0xff;
    unsigned op = (unsigned)(d[0] >> 48) & 0xff;
    unsigned long long count = (unsigned long long)d[1];
    const char *opn = reduce_names[op < 4 ? op : 0];
    int at = snprintf(s, n, "%s #%u", wf__kind_name(kind), (unsigned)d[0]);
    if (at < 0 || (size_t)at >= n)
        return;
    switch (kind) {
    case WF__K_ALLREDUCE:
        at += snprintf(s + at, n - (size_t)at, " (%s x %llu, %s)", wf_dtype_name((wf_dtype)dt),
                       count, opn);
        break;
    case WF__K_REDUCE_SCATTER:
        at += snprintf(s + at, n - (size_t)at, " (%s x %llu per rank, %s)",
                       wf_dtype_name((wf_dtype)dt), count, opn);
        break;
    case WF__K_ALLGATHER:
        at += snprintf(s + at, n - (size_t)at, " (%llu bytes per rank)", count);
        break;
    case WF__K_BROADCAST:
        at += snprintf(s + at, n - (size_t)at, " (%llu bytes, root %lld)", count,
                       (long long)d[2] - 1);
        break;
    default:
        break;
    }
    if (d[3] && at > 0 && (size_t)at < n)
        snprintf(s + at, n - (size_t)at, " of graph %#llx", (unsigned long long)d[3]);
}

static bool desc_match(const uint64_t *a, const uint64_t *b)
{
    return a[0] == b[0] && a[1] == b[1] && a[2] == b[2] && (!a[3] || !b[3] || a[3] == b[3]);
}

/* Fails the comm when 'theirs' (rank 'peer') is not this rank's call. Returns the comm's
 * failure code, or 0 when they match. */
static int desc_check(wf_comm *c, int peer, const uint64_t *theirs)
{
    if (desc_match(c->desc_mine, theirs))
        return 0;
    char me[128], them[128];
    desc_describe(c->desc_mine, me, sizeof me);
    desc_describe(theirs, them, sizeof them);
    int lo = c->rank < peer ? c->rank : peer;
    const char *dlo = lo == c->rank ? me : them, *dhi = lo == c->rank ? them : me;
    wf__comm_fail(c, WF_EPEER, peer, "mismatched collectives: rank %d called %s, rank %d called %s",
                  lo, dlo, lo == c->rank ? peer : c->rank, dhi);
    return wf__comm_failed(c);
}

void wf__coll_desc_arrived(wf_comm *c, const wf_comm_req *r)
{
    /* 'desc_mine' is this collective's until its exit, which waits for this receive. */
    (void)desc_check(c, r->peer, r->buf);
}

/* The i-th other rank (1 <= i < size) a descriptor goes to: right, left, then two away... */
static int desc_order(const wf_comm *c, int i)
{
    int n = c->size, d = (i + 1) / 2;
    return i % 2 ? (c->rank + d) % n : (c->rank - d + n) % n;
}

/* A collective in progress: its number and flight-recorder ticket (its descriptor messages
 * are the comm's 'desc_rq'). */
typedef struct coll_call {
    uint32_t seq;
    uint64_t ticket;
} coll_call;

/* Counts and publishes a new collective of 'kind' (its number in 'call->seq'), records it,
 * sends its descriptor to every other rank and posts their receives; refuses it at once when
 * a rank that left took part in fewer collectives: it will never join this one. The
 * caller stores 'coll_now' before it loads 'left' and "weft-net" stores 'left' before it
 * loads 'coll_now' (both sequentially consistent), so one of the two always sees the
 * other, and a waiter is never missed. Every call that entered ends with coll_exit(). */
static int coll_enter(wf_comm *c, int kind, coll_call *call, wf_dtype dt, size_t count,
                      wf_reduce_op op, int root)
{
    memset(call, 0, sizeof *call);
    call->seq = ++c->coll_seq;
    atomic_store(&c->coll_now, (uint64_t)call->seq << 8 | (unsigned)kind);
    size_t es = kind == WF__K_ALLREDUCE || kind == WF__K_REDUCE_SCATTER ? wf_dtype_size(dt) : 1;
    call->ticket = wf__flight_begin(c, &(wf__fent){ .kind = (uint8_t)kind,
                                                    .seq = call->seq,
                                                    .count = count,
                                                    .bytes = count * es,
                                                    .dtype = (uint8_t)dt,
                                                    .op = (uint8_t)op,
                                                    .peer = kind == WF__K_BROADCAST ? root : -1,
                                                    .state = WF__FS_WAITING });
    int rc = wf__coll_check_left(c);
    if (rc < 0 || c->size == 1)
        return rc;
    c->desc_mine[0] = call->seq | (uint64_t)kind << 32 | (uint64_t)(dt & 0xff) << 40 |
                      (uint64_t)(op & 0xff) << 48;
    c->desc_mine[1] = count;
    c->desc_mine[2] = kind == WF__K_BROADCAST ? (uint64_t)root + 1 : 0;
    c->desc_mine[3] = atomic_load_explicit(&c->graph_hash, memory_order_relaxed);
    int n = c->size;
    uint64_t tag = coll_tag(call->seq, DESC_STEP);
    /* The nearest ranks first: the left and right neighbours are those the ring and the
     * first exchanges of the other algorithms wait on. */
    for (int i = 1; i < n && rc == 0; i++) {
        int p = desc_order(c, i);
        rc = wf__irecv_desc(c, p, tag, c->desc_from[p], sizeof c->desc_from[p], &c->desc_rq[p]);
    }
    for (int i = 1; i < n && rc == 0; i++) {
        int p = desc_order(c, i);
        rc = wf__isend(c, p, tag, c->desc_mine, sizeof c->desc_mine, &c->desc_rq[n + p]);
    }
    return rc;
}

/* Waits for the descriptor messages 'rq' ('n', NULL entries skipped) and frees them. Those
 * already done, the usual case (sent at entry, ahead of the data), are freed without
 * wf__wait(), whose clock reads cost ~0.5 us each on this VM (measured: CLOCK_MONOTONIC at
 * 480-500 ns a read), and their 'what' is only written when one must be waited for. */
static int desc_reap(wf_comm *c, wf_comm_req **rq, size_t n, uint32_t seq)
{
    bool pending = false;
    for (size_t i = 0; i < n; i++) {
        if (!rq[i])
            continue;
        if (atomic_load_explicit(&rq[i]->done, memory_order_acquire) && rq[i]->status == 0) {
            wf__req_free(rq[i]); /* 'status' was written under mu before 'done' */
            rq[i] = NULL;
        } else {
            pending = true;
        }
    }
    if (!pending)
        return 0;
    char what[64]; /* named only when needed: snprintf costs ~0.4 us here */
    snprintf(what, sizeof what, "call descriptor of collective #%u", seq);
    return wf__wait_all(rq, n, deadline(c), what);
}

int wf__coll_settle(wf_comm *c)
{
    uint64_t end = wf__net_now_ns() + 100000000u;
    for (;;) {
        bool pending = false;
        for (int i = 0; i < c->size; i++)
            pending |=
                c->desc_rq[i] && !atomic_load_explicit(&c->desc_rq[i]->done, memory_order_acquire);
        if (!pending || atomic_load(&c->failed) || wf__net_now_ns() >= end)
            break;
        c->api.ucp_worker_progress(c->worker);
    }
    return atomic_load(&c->failed) ? wf__comm_failed(c) : 0;
}

/* Ends a collective that entered with 'rc' (its result so far): a result is returned only
 * once every other rank's descriptor came and matches; an error that did not fail the comm
 * yet does now (the others must not wait for this rank). Returns the collective's status. */
static int coll_exit(wf_comm *c, coll_call *call, int rc)
{
    size_t nrq = 2 * (size_t)c->size; /* c->desc_rq: waited for, freed and cleared below */
    if (c->size > 1) {
        if (rc < 0 && !atomic_load(&c->failed)) {
            char msg[WF_ERRMSG_MAX];
            snprintf(msg, sizeof msg, "%s", wf_last_errmsg());
            wf__comm_fail(c, rc, c->rank, "rank %d: %s", c->rank, msg);
            wf__err(rc, "%s", msg);
        }
        if (rc < 0) {
            char msg[WF_ERRMSG_MAX], what[64];
            snprintf(msg, sizeof msg, "%s", wf_last_errmsg());
            snprintf(what, sizeof what, "call descriptor of collective #%u", call->seq);
            (void)wf__wait_all(c->desc_rq, nrq, deadline(c), what);
            wf__err(rc, "%s", msg);
            /* Every rank reports the comm's failure, the first one anywhere (a mismatch seen
             * by the callback while this rank's own wait failed on a wrong-sized message). */
            if (atomic_load(&c->failed))
                rc = wf__comm_failed(c);
        } else {
            rc = desc_reap(c, c->desc_rq, nrq, call->seq);
            for (int p = 0; p < c->size && rc == 0; p++)
                if (p != c->rank)
                    rc = desc_check(c, p, c->desc_from[p]);
        }
    }
    wf__flight_set(c, call->ticket, rc < 0 ? WF__FS_FAILED : WF__FS_DONE, rc);
    return rc;
}

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
    coll_call call;
    if ((rc = coll_enter(c, WF__K_ALLREDUCE, &call, dt, count, op, -1)) < 0)
        return coll_exit(c, &call, rc);
    uint32_t seq = call.seq;
    bool small = bytes <= c->small_bytes || count < (size_t)c->size;
    uintptr_t s = (uintptr_t)send, r = (uintptr_t)recv;
    /* Both algorithms read 'send' themselves; only a single rank, or a 'send' that overlaps
     * 'recv' without being it, starts from a copy in 'recv'. */
    if (count && send != recv && (c->size == 1 || (s < r + bytes && r < s + bytes))) {
        memmove(recv, send, bytes);
        send = recv;
    }
    char what[128];
    name_op(what, sizeof what, "allreduce #", seq, small ? "recursive doubling" : "ring", count,
            wf_dtype_name(dt));
    if (c->size > 1 && count) {
        if (small) {
            rc = rd_allreduce(c, send, recv, count, bytes, dt, op, seq, what);
        } else {
            size_t *ol = malloc(2 * (size_t)c->size * sizeof *ol);
            if (!ol)
                return coll_exit(c, &call, wf__err(WF_ENOMEM, "%s: out of memory", what));
            split(count, c->size, ol, ol + c->size);
            rc = ring(c, recv, send == recv ? NULL : send, wf_dtype_size(dt), ol, ol + c->size, dt,
                      op, true, true, seq, what);
            free(ol);
        }
    }
    rc = coll_exit(c, &call, rc);
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
    coll_call call;
    if ((rc = coll_enter(c, WF__K_REDUCE_SCATTER, &call, dt, count, op, -1)) < 0)
        return coll_exit(c, &call, rc);
    uint32_t seq = call.seq;
    int n = c->size;
    char what[128];
    snprintf(what, sizeof what, "reduce_scatter #%u (%zu x %s per rank)", seq, count,
             wf_dtype_name(dt));
    uint8_t *work = malloc(bytes ? bytes * (size_t)n : 1);
    size_t *ol = malloc(2 * (size_t)n * sizeof *ol);
    if (!work || !ol) {
        free(work);
        free(ol);
        return coll_exit(c, &call, wf__err(WF_ENOMEM, "%s: out of memory", what));
    }
    if (count)
        memcpy(work, send, bytes * (size_t)n);
    shifted_blocks(n, count, ol, ol + n);
    if (n > 1 && count)
        rc = ring(c, work, NULL, wf_dtype_size(dt), ol, ol + n, dt, op, true, false, seq, what);
    rc = coll_exit(c, &call, rc);
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
    coll_call call;
    if ((rc = coll_enter(c, WF__K_ALLGATHER, &call, WF_U8, bytes, 0, -1)) < 0 || !bytes)
        return coll_exit(c, &call, rc);
    uint32_t seq = call.seq;
    memmove((uint8_t *)recv + (size_t)c->rank * bytes, send, bytes);
    char what[96];
    snprintf(what, sizeof what, "allgather #%u (%zu bytes per rank)", seq, bytes);
    size_t *ol = malloc(2 * (size_t)n * sizeof *ol);
    if (!ol)
        return coll_exit(c, &call, wf__err(WF_ENOMEM, "%s: out of memory", what));
    shifted_blocks(n, bytes, ol, ol + n);
    if (n > 1)
        rc = ring(c, recv, NULL, 1, ol, ol + n, WF_U8, WF_REDUCE_SUM, false, true, seq, what);
    free(ol);
    return coll_exit(c, &call, rc);
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
    coll_call call;
    if ((rc = coll_enter(c, WF__K_BROADCAST, &call, WF_U8, bytes, 0, root)) < 0)
        return coll_exit(c, &call, rc);
    uint32_t seq = call.seq;
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
                return coll_exit(c, &call, rc);
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
    return coll_exit(c, &call, rc < 0 ? rc : rc2);
}

static int barrier_impl(wf_comm *c)
{
    int rc = check_comm("wf_comm_barrier", c);
    if (rc < 0)
        return rc;
    int n = c->size;
    coll_call call;
    if ((rc = coll_enter(c, WF__K_BARRIER, &call, WF_U8, 0, 0, -1)) < 0)
        return coll_exit(c, &call, rc);
    uint32_t seq = call.seq;
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
            return coll_exit(c, &call, rc < 0 ? rc : rc2);
    }
    return coll_exit(c, &call, 0);
}

/* ---- Entry points: each collective runs in busy mode (internal.h) ----------------------- */

/* Returns CALL, run in busy mode on comm 'c' (NULL: CALL refuses it, so no mode to set). */
#define IN_BUSY_MODE(c, CALL)  \
    do {                       \
        if (c)                 \
            wf__busy_begin(c); \
        int busy_rc_ = (CALL); \
        if (c)                 \
            wf__busy_end(c);   \
        return busy_rc_;       \
    } while (0)

int wf_comm_allreduce(wf_comm *c, const void *send, void *recv, size_t count, wf_dtype dt,
                      wf_reduce_op op)
{
    IN_BUSY_MODE(c, allreduce_impl(c, send, recv, count, dt, op));
}

int wf_comm_reduce_scatter(wf_comm *c, const void *send, void *recv, size_t count, wf_dtype dt,
                           wf_reduce_op op)
{
    IN_BUSY_MODE(c, reduce_scatter_impl(c, send, recv, count, dt, op));
}

int wf_comm_allgather(wf_comm *c, const void *send, void *recv, size_t bytes)
{
    IN_BUSY_MODE(c, allgather_impl(c, send, recv, bytes));
}

int wf_comm_broadcast(wf_comm *c, void *buf, size_t bytes, int root)
{
    IN_BUSY_MODE(c, broadcast_impl(c, buf, bytes, root));
}

int wf_comm_barrier(wf_comm *c)
{
    IN_BUSY_MODE(c, barrier_impl(c));
}

/* ---- Single copy: the agreement ---------------------------------------------------------- */

static bool tls_has_shm(const char *tls)
{
    if (!tls || tls[0] == '^') /* UCX's choice (weft's default "^cma" too) includes shm */
        return true;
    return strstr(tls, "sm") || strstr(tls, "shm") || strstr(tls, "cma") || strstr(tls, "posix") ||
           strstr(tls, "sysv") || strstr(tls, "all");
}

/* UCX's shared-memory transports (sysv, posix) pass every message through the receiver's FIFO
 * of UCX_MM_FIFO_SIZE (64) elements, each with a descriptor of UCX_MM_SEG_SIZE (8256 bytes),
 * and the first pass over them page-faults (shared pages are mapped on first touch: ~3
 * minor faults per 4 KiB round here). Measured on 2 ranks: the first 32 rounds of barrier
 * plus 4 KiB all-reduce after creation took 10-12 us each, every later one 1.8 us (with
 * UCX_MM_FIFO_SIZE=16, the first 8 rounds). So creation makes that first pass itself:
 * WARM_ROUNDS recursive-doubling all-reduces of WARM_BYTES, about 128 descriptors' worth
 * of fragments per rank, twice the FIFO (1-20 ms, by the machine's load). */
#define WARM_ROUNDS 16
#define WARM_BYTES  65536

static int shm_warmup(wf_comm *c)
{
    int32_t *buf = calloc(WARM_BYTES / sizeof *buf, sizeof *buf);
    if (!buf)
        return wf__err(WF_ENOMEM, "wf_comm_create: out of memory");
    int rc = 0;
    wf__busy_begin(c);
    for (int i = 0; i < WARM_ROUNDS && rc == 0; i++) {
        uint32_t seq = ++c->coll_seq;
        char what[128];
        name_op(what, sizeof what, "wf_comm_create: shared-memory warm-up all-reduce #", seq,
                "recursive doubling", WARM_BYTES / sizeof *buf, "i32");
        rc = rd_allreduce(c, (uint8_t *)buf, (uint8_t *)buf, WARM_BYTES / sizeof *buf, WARM_BYTES,
                          WF_I32, WF_REDUCE_SUM, seq, what);
    }
    wf__busy_end(c);
    free(buf);
    return rc;
}

/* What each rank tells the others at creation: the address of its 'cma_word', and whether
 * it cannot use shared memory (another host, or transports without it). */
typedef struct setup_card {
    uint64_t addr, no_shm;
} setup_card;

int wf__cma_setup(wf_comm *c, const char *tls)
{
    c->cma = false;
    int n = c->size;
    if (n < 2)
        return 0;
    /* Every rank takes part, whatever it wants, so that all stay in step. Shared memory is
     * agreed on with the all-gather of the addresses (anyone's "no" is everyone's), single
     * copy by a max-reduce of the "no"s at the end: the last step of creation stays a tiny
     * all-reduce, after the warm-up. A rank that returns from wf_comm_create() and dies at
     * once can still catch a slower rank inside that last step (test_launcher.c's killed
     * rank saw it then in 2 runs of 16, when the warm-up came last; 0 of 25 since). */
    setup_card mine = { (uint64_t)(uintptr_t)&c->cma_word,
                        !tls_has_shm(tls ? tls : getenv("UCX_TLS")) };
    setup_card *all = malloc((size_t)n * sizeof *all);
    if (!all)
        return wf__err(WF_ENOMEM, "wf_comm_create: out of memory");
    for (int r = 0; r < n; r++)
        mine.no_shm |= strcmp(c->peers[r].host, c->host) != 0;
    int left = (c->rank + n - 1) % n;
    c->cma_word = 0x574654434d410000ull ^ c->incarnation;
    int rc = allgather_impl(c, &mine, all, sizeof mine);
    int32_t no = 0;
    for (int r = 0; rc == 0 && r < n; r++)
        no |= all[r].no_shm != 0;
    if (rc == 0 && !no)
        rc = shm_warmup(c);
    if (rc == 0 && !no) {
        uint64_t got = 0;
        struct iovec l = { .iov_base = &got, .iov_len = sizeof got };
        struct iovec r = { .iov_base = (void *)(uintptr_t)all[left].addr, .iov_len = sizeof got };
        /* A pid of another namespace, a ptrace policy (Yama) or seccomp all end here. */
        if (process_vm_readv((pid_t)c->peers[left].pid, &l, 1, &r, 1, 0) != (ssize_t)sizeof got ||
            got != (0x574654434d410000ull ^ c->peers[left].incarnation))
            no = 1;
    }
    free(all);
    if (rc == 0)
        rc = allreduce_impl(c, &no, &no, 1, WF_I32, WF_REDUCE_MAX);
    if (rc == 0)
        c->cma = no == 0;
    return rc;
}
