/* transport/frame.c: the control-plane frame codec.
 * Owns: parsing frame headers against per-type caps, the bounds-checked payload reader and
 * writer, and HELLO validation (token, size, rank).
 * Invariant: nothing read off the network is used before its length was checked against
 * the bytes present and against the cap of its field or frame type; a frame's declared
 * length is checked before any byte of its payload is buffered.
 * Not here: sockets (net.c). Pure functions: tests feed bytes to them directly. */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint16_t get_u16(const uint8_t *p)
{
    return (uint16_t)(p[0] | p[1] << 8);
}

uint32_t wf__frame_cap(uint16_t type)
{
    switch (type) {
    case WF__F_HELLO:
        return 16 + 2 + WF__TOKEN_MAX + 2 + WF__HOST_MAX + 4 + WF__UCX_ADDR_MAX;
    case WF__F_WELCOME:
        return 4 + WF_COMM_MAX_RANKS * (8 + 2 + WF__HOST_MAX + 4 + WF__UCX_ADDR_MAX);
    case WF__F_REJECT:
        return 2 + WF__REASON_MAX;
    case WF__F_BARRIER:
    case WF__F_RELEASE:
        return 4;
    case WF__F_HEARTBEAT:
        return 0;
    case WF__F_BYE:
        return 4;
    case WF__F_LEFT:
        return 8;
    case WF__F_FAIL:
        return 8 + 2 + WF__REASON_MAX;
    default:
        return 0;
    }
}

int wf__frame_parse(const uint8_t *buf, size_t len, wf__frame *f, size_t *used, char *err,
                    size_t errlen)
{
    *used = 0;
    f->type = 0;
    f->len = 0;
    f->payload = NULL;
    /* Check the magic as soon as its bytes arrive: a stranger speaking another protocol
     * is refused at once instead of after 12 bytes. */
    static const uint8_t magic[4] = { WF__FRAME_MAGIC & 0xff, (WF__FRAME_MAGIC >> 8) & 0xff,
                                      (WF__FRAME_MAGIC >> 16) & 0xff, WF__FRAME_MAGIC >> 24 };
    size_t m = len < 4 ? len : 4;
    if (memcmp(buf, magic, m) != 0) {
        snprintf(err, errlen, "frame: bad magic (not a weft control connection)");
        return WF_EFORMAT;
    }
    if (len < WF__FRAME_HDR)
        return 0;
    uint16_t version = get_u16(buf + 4);
    uint16_t type = get_u16(buf + 6);
    uint32_t n = get_u32(buf + 8);
    if (version != WF__FRAME_VERSION) {
        snprintf(err, errlen, "frame: version %u, this build speaks %u", version,
                 WF__FRAME_VERSION);
        return WF_EFORMAT;
    }
    if (type == 0 || type >= WF__F_TYPE_END) {
        snprintf(err, errlen, "frame: unknown type %u", type);
        return WF_EFORMAT;
    }
    uint32_t cap = wf__frame_cap(type);
    if (n > cap) {
        snprintf(err, errlen, "frame: type %u declares %u payload bytes, above its cap %u", type, n,
                 cap);
        return WF_EFORMAT;
    }
    f->type = type;
    f->len = n;
    if (len - WF__FRAME_HDR < n)
        return 0;
    f->payload = buf + WF__FRAME_HDR;
    *used = WF__FRAME_HDR + (size_t)n;
    return 1;
}

/* ---- Writer ------------------------------------------------------------------------------ */

static void wput(wf__wbuf *w, const void *p, size_t n)
{
    if (w->oom)
        return;
    if (w->len + n > w->cap) {
        size_t cap = w->cap ? w->cap : 256;
        while (cap < w->len + n)
            cap *= 2;
        uint8_t *q = realloc(w->p, cap);
        if (!q) {
            w->oom = true;
            return;
        }
        w->p = q;
        w->cap = cap;
    }
    if (n)
        memcpy(w->p + w->len, p, n);
    w->len += n;
}

static void put_u32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

void wf__wbuf_begin(wf__wbuf *w, uint16_t type)
{
    *w = (wf__wbuf){ 0 };
    uint8_t h[WF__FRAME_HDR];
    put_u32(h, WF__FRAME_MAGIC);
    h[4] = WF__FRAME_VERSION & 0xff;
    h[5] = WF__FRAME_VERSION >> 8;
    h[6] = (uint8_t)type;
    h[7] = (uint8_t)(type >> 8);
    put_u32(h + 8, 0);
    wput(w, h, sizeof h);
}

void wf__wbuf_u32(wf__wbuf *w, uint32_t v)
{
    uint8_t b[4];
    put_u32(b, v);
    wput(w, b, 4);
}

void wf__wbuf_str(wf__wbuf *w, const char *s, size_t n)
{
    if (n > 0xffff)
        n = 0xffff;
    uint8_t b[2] = { (uint8_t)n, (uint8_t)(n >> 8) };
    wput(w, b, 2);
    wput(w, s, n);
}

void wf__wbuf_blob(wf__wbuf *w, const void *p, size_t n)
{
    wf__wbuf_u32(w, (uint32_t)n);
    wput(w, p, n);
}

int wf__wbuf_end(wf__wbuf *w)
{
    if (w->oom || w->len < WF__FRAME_HDR) {
        free(w->p);
        *w = (wf__wbuf){ 0 };
        return WF_ENOMEM;
    }
    put_u32(w->p + 8, (uint32_t)(w->len - WF__FRAME_HDR));
    return 0;
}

/* ---- Reader ------------------------------------------------------------------------------ */

uint32_t wf__rbuf_u32(wf__rbuf *r)
{
    if (r->bad || r->len - r->off < 4) {
        r->bad = true;
        return 0;
    }
    uint32_t v = get_u32(r->p + r->off);
    r->off += 4;
    return v;
}

const uint8_t *wf__rbuf_str(wf__rbuf *r, size_t max, size_t *n)
{
    *n = 0;
    if (r->bad || r->len - r->off < 2) {
        r->bad = true;
        return NULL;
    }
    size_t k = get_u16(r->p + r->off);
    if (k > max || r->len - r->off - 2 < k) {
        r->bad = true;
        return NULL;
    }
    const uint8_t *s = r->p + r->off + 2;
    r->off += 2 + k;
    *n = k;
    return s;
}

const uint8_t *wf__rbuf_blob(wf__rbuf *r, size_t max, size_t *n)
{
    *n = 0;
    if (r->bad || r->len - r->off < 4) {
        r->bad = true;
        return NULL;
    }
    size_t k = get_u32(r->p + r->off);
    if (k > max || r->len - r->off - 4 < k) {
        r->bad = true;
        return NULL;
    }
    const uint8_t *s = r->p + r->off + 4;
    r->off += 4 + k;
    *n = k;
    return s;
}

/* Compares without an early exit, so the time taken does not tell how much of a guessed
 * token was right. */
static bool token_equal(const uint8_t *a, size_t na, const char *b)
{
    size_t nb = strlen(b);
    unsigned diff = (unsigned)(na ^ nb);
    for (size_t i = 0; i < na; i++)
        diff |= (unsigned)(a[i] ^ (uint8_t)(i < nb ? b[i] : 0));
    return diff == 0;
}

int wf__hello_decode(const uint8_t *p, size_t len, int size, const char *token, wf__hello *h,
                     char *err, size_t errlen)
{
    wf__rbuf r = { .p = p, .len = len };
    memset(h, 0, sizeof *h);
    h->rank = wf__rbuf_u32(&r);
    h->size = wf__rbuf_u32(&r);
    h->incarnation = wf__rbuf_u32(&r);
    h->pid = wf__rbuf_u32(&r);
    size_t ntok, nhost;
    const uint8_t *tok = wf__rbuf_str(&r, WF__TOKEN_MAX, &ntok);
    const uint8_t *host = wf__rbuf_str(&r, WF__HOST_MAX, &nhost);
    h->addr = wf__rbuf_blob(&r, WF__UCX_ADDR_MAX, &h->addr_len);
    if (r.bad) {
        snprintf(err, errlen, "HELLO: truncated or a field above its cap (%zu bytes)", len);
        return WF_EFORMAT;
    }
    if (r.off != len) {
        snprintf(err, errlen, "HELLO: %zu trailing bytes", len - r.off);
        return WF_EFORMAT;
    }
    if (h->addr_len == 0) {
        snprintf(err, errlen, "HELLO: empty UCX address");
        return WF_EFORMAT;
    }
    memcpy(h->token, tok, ntok);
    memcpy(h->host, host, nhost);
    for (size_t i = 0; i < nhost; i++) /* printed in messages: keep them printable */
        if (h->host[i] < 0x20 || h->host[i] > 0x7e)
            h->host[i] = '?';
    if (!token_equal(tok, ntok, token)) {
        snprintf(err, errlen, "HELLO from pid %u on '%s': wrong token", h->pid, h->host);
        return WF_EPEER;
    }
    if (h->size != (uint32_t)size) {
        snprintf(err, errlen, "HELLO from rank %u (host %s, pid %u): size %u, expected %d", h->rank,
                 h->host, h->pid, h->size, size);
        return WF_EPEER;
    }
    if (h->rank == 0 || h->rank >= (uint32_t)size) {
        snprintf(err, errlen, "HELLO from host %s, pid %u: rank %u out of range 1..%d", h->host,
                 h->pid, h->rank, size - 1);
        return WF_EPEER;
    }
    return 0;
}
