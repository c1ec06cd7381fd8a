/* runtime/safetensors.c: the safetensors file format: a strict parser and validator of the
 * header, reading tensors out of a file, the atomic writer, and the public
 * wf_safetensors_read/write/free.
 * Owns: the JSON subset a safetensors header is (an object of tensor entries, each an object
 *   of "dtype" string, "shape" integer array and "data_offsets" integer pair, plus an
 *   optional "__metadata__" object of strings), its escaping on write, and every check of
 *   runtime/safetensors.h's invariant.
 * Why hand-written and shaped by the structure: the header is untrusted input of a fixed
 *   shape, at most 3 levels deep, so the parser follows that shape with loops (no recursion,
 *   no depth to exhaust) and refuses everything else: unknown keys, non-integer numbers,
 *   invalid UTF-8, lone surrogates, NUL in names, trailing garbage. Whitespace is JSON's.
 * Why pread and not mmap: a file truncated while mapped turns reads into SIGBUS; pread turns
 *   it into a short read and an error, and the data are copied into tensors anyway.
 * Not here: which tensors a session saves or loads (checkpoint.c). */
#include "safetensors.h"

#include "../core/error.h"
#include "../core/tensor.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#    define BIG_ENDIAN_HOST 1
#else
#    define BIG_ENDIAN_HOST 0
#endif

/* The dtype names of the format, indexed by wf_dtype. */
static const char *const st_dtype_names[WF_DTYPE_COUNT] = {
    [WF_F32] = "F32", [WF_F64] = "F64",   [WF_I32] = "I32",   [WF_I64] = "I64",
    [WF_U8] = "U8",   [WF_BOOL] = "BOOL", [WF_BF16] = "BF16", [WF_F16] = "F16",
};

static wf_dtype dtype_of(const char *s)
{
    for (int d = 1; d < WF_DTYPE_COUNT; d++)
        if (st_dtype_names[d] && strcmp(st_dtype_names[d], s) == 0)
            return (wf_dtype)d;
    return WF_DTYPE_INVALID;
}

/* A name as messages show it: control bytes as '?', at most 80 bytes then "...". */
static const char *shown(const char *name, char *buf, size_t size)
{
    size_t j = 0, max = size - 4 < 80 ? size - 4 : 80;
    for (size_t i = 0; name[i] && j < max; i++)
        buf[j++] = (unsigned char)name[i] < 0x20 || name[i] == 0x7f ? '?' : name[i];
    buf[j] = '\0';
    if (strlen(name) > max)
        strcpy(buf + j, "...");
    return buf;
}

/* ---- UTF-8 -------------------------------------------------------------------------------- */

/* Returns the length of the valid UTF-8 sequence at 'p' (at most 'n' bytes available), or 0
 * if it is invalid (overlong, a surrogate, above U+10FFFF, truncated). */
static size_t utf8_len(const unsigned char *p, size_t n)
{
    unsigned c = p[0];
    if (c < 0x80)
        return 1;
    size_t len;
    uint32_t cp, min;
    if (c >= 0xc2 && c <= 0xdf)
        len = 2, cp = c & 0x1f, min = 0x80;
    else if (c >= 0xe0 && c <= 0xef)
        len = 3, cp = c & 0x0f, min = 0x800;
    else if (c >= 0xf0 && c <= 0xf4)
        len = 4, cp = c & 0x07, min = 0x10000;
    else
        return 0;
    if (n < len)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((p[i] & 0xc0) != 0x80)
            return 0;
        cp = cp << 6 | (p[i] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return len;
}

static bool utf8_valid(const char *s)
{
    size_t n = strlen(s);
    for (size_t i = 0; i < n;) {
        size_t l = utf8_len((const unsigned char *)s + i, n - i);
        if (!l)
            return false;
        i += l;
    }
    return true;
}

static size_t utf8_put(char *out, uint32_t cp)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xc0 | cp >> 6);
        out[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xe0 | cp >> 12);
        out[1] = (char)(0x80 | (cp >> 6 & 0x3f));
        out[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    out[0] = (char)(0xf0 | cp >> 18);
    out[1] = (char)(0x80 | (cp >> 12 & 0x3f));
    out[2] = (char)(0x80 | (cp >> 6 & 0x3f));
    out[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* ---- The parser ---------------------------------------------------------------------------- */

typedef struct parser {
    const unsigned char *s, *p, *end; /* the header, the cursor, its end */
    const char *what;                 /* "checkpoint '<path>'" */
} parser;

/* A syntax error at the cursor. */
static int syntax(parser *ps, const char *fmt, ...) WF_PRINTF(2, 3);

static int syntax(parser *ps, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return wf__err(WF_EFORMAT, "%s: header is not valid JSON: byte %zu: %s", ps->what,
                   (size_t)(ps->p - ps->s), msg);
}

/* An error about tensor 'name' (not NULL) or about the header as a whole. */
static int bad(parser *ps, const char *name, const char *fmt, ...) WF_PRINTF(3, 4);

static int bad(parser *ps, const char *name, const char *fmt, ...)
{
    char msg[320], nm[96];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (name)
        return wf__err(WF_EFORMAT, "%s: tensor '%s': %s", ps->what, shown(name, nm, sizeof nm),
                       msg);
    return wf__err(WF_EFORMAT, "%s: %s", ps->what, msg);
}

static void ws(parser *ps)
{
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r'))
        ps->p++;
}

/* Describes the byte at the cursor for a message. */
static const char *at(parser *ps, char *buf, size_t size)
{
    if (ps->p >= ps->end)
        return "the end of the header";
    unsigned c = *ps->p;
    if (c >= 0x20 && c < 0x7f)
        snprintf(buf, size, "'%c'", (char)c);
    else
        snprintf(buf, size, "byte 0x%02x", c);
    return buf;
}

/* Skips whitespace and consumes 'c', or fails saying what was expected. */
static int expect(parser *ps, char c, const char *why)
{
    char b[32];
    ws(ps);
    if (ps->p < ps->end && *ps->p == (unsigned char)c) {
        ps->p++;
        return 0;
    }
    return syntax(ps, "expected '%c' %s, found %s", c, why, at(ps, b, sizeof b));
}

static int hex4(parser *ps, uint32_t *out)
{
    uint32_t v = 0;
    *out = 0; /* defined on the error paths too */
    for (int i = 0; i < 4; i++) {
        if (ps->p >= ps->end)
            return syntax(ps, "\\u escape cut short by the end of the header");
        unsigned c = *ps->p;
        int d = c >= '0' && c <= '9'   ? (int)(c - '0')
                : c >= 'a' && c <= 'f' ? (int)(c - 'a' + 10)
                : c >= 'A' && c <= 'F' ? (int)(c - 'A' + 10)
                                       : -1;
        if (d < 0)
            return syntax(ps, "\\u escape needs 4 hex digits");
        v = v << 4 | (uint32_t)d;
        ps->p++;
    }
    *out = v;
    return 0;
}

/* Parses a string at the cursor (after whitespace) into a new NUL-terminated buffer. A NUL
 * character (\u0000) is refused: names and metadata are C strings here. */
static int string(parser *ps, char **out)
{
    char b[32];
    *out = NULL;
    ws(ps);
    if (ps->p >= ps->end || *ps->p != '"')
        return syntax(ps, "expected a string, found %s", at(ps, b, sizeof b));
    ps->p++;
    /* The decoded string is never longer than its source: escapes shrink or keep size. */
    const unsigned char *q = ps->p;
    while (q < ps->end && *q != '"')
        q += *q == '\\' && q + 1 < ps->end ? 2 : 1;
    if (q >= ps->end)
        return syntax(ps, "unterminated string");
    char *buf = malloc((size_t)(q - ps->p) + 1);
    if (!buf)
        return wf__err(WF_ENOMEM, "%s: no memory for a %zu-byte string of the header", ps->what,
                       (size_t)(q - ps->p));
    size_t n = 0;
    int rc = 0;
    while (rc == 0) {
        unsigned c = *ps->p;
        if (c == '"') {
            ps->p++;
            break;
        }
        if (c < 0x20) {
            rc = syntax(ps, "control byte 0x%02x inside a string (must be escaped)", c);
            break;
        }
        if (c != '\\') {
            size_t l = utf8_len(ps->p, (size_t)(ps->end - ps->p));
            if (!l) {
                rc = syntax(ps, "invalid UTF-8 inside a string");
                break;
            }
            memcpy(buf + n, ps->p, l);
            n += l;
            ps->p += l;
            continue;
        }
        ps->p++; /* the backslash; the escape's letter exists (the scan above) */
        c = *ps->p++;
        uint32_t cp;
        switch (c) {
        case '"':
        case '\\':
        case '/':
            buf[n++] = (char)c;
            continue;
        case 'b':
            buf[n++] = '\b';
            continue;
        case 'f':
            buf[n++] = '\f';
            continue;
        case 'n':
            buf[n++] = '\n';
            continue;
        case 'r':
            buf[n++] = '\r';
            continue;
        case 't':
            buf[n++] = '\t';
            continue;
        case 'u':
            if ((rc = hex4(ps, &cp)) < 0)
                break;
            if (cp >= 0xdc00 && cp <= 0xdfff) {
                rc = syntax(ps, "\\u%04x is a lone low surrogate", cp);
                break;
            }
            if (cp >= 0xd800 && cp <= 0xdbff) {
                uint32_t lo;
                if (ps->end - ps->p < 2 || ps->p[0] != '\\' || ps->p[1] != 'u') {
                    rc = syntax(ps, "\\u%04x is a high surrogate without its low half", cp);
                    break;
                }
                ps->p += 2;
                if ((rc = hex4(ps, &lo)) < 0)
                    break;
                if (lo < 0xdc00 || lo > 0xdfff) {
                    rc = syntax(ps, "\\u%04x is a high surrogate followed by \\u%04x", cp, lo);
                    break;
                }
                cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
            }
            if (cp == 0) {
                rc = syntax(ps, "\\u0000 (a NUL character) inside a string");
                break;
            }
            n += utf8_put(buf + n, cp);
            continue;
        default:
            ps->p--;
            rc = syntax(ps, "unknown escape '\\%c'", c >= 0x20 && c < 0x7f ? (char)c : '?');
            break;
        }
    }
    if (rc < 0) {
        free(buf);
        return rc;
    }
    buf[n] = '\0';
    *out = buf;
    return 0;
}

/* Parses an integer at the cursor: JSON's syntax (optional '-', no leading zeros) without
 * fraction or exponent, within int64. */
static int integer(parser *ps, int64_t *out)
{
    char b[32];
    ws(ps);
    const unsigned char *start = ps->p;
    bool neg = ps->p < ps->end && *ps->p == '-';
    if (neg)
        ps->p++;
    if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9')
        return syntax(ps, "expected an integer, found %s", at(ps, b, sizeof b));
    if (*ps->p == '0' && ps->p + 1 < ps->end && ps->p[1] >= '0' && ps->p[1] <= '9')
        return syntax(ps, "integer with a leading zero");
    uint64_t v = 0;
    while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') {
        unsigned d = *ps->p - '0';
        if (v > (UINT64_C(1) << 63) / 10 ||
            v * 10 + d > (neg ? UINT64_C(1) << 63 : (uint64_t)INT64_MAX)) {
            ps->p = start;
            return syntax(ps, "integer out of the range of int64");
        }
        v = v * 10 + d;
        ps->p++;
    }
    if (ps->p < ps->end && (*ps->p == '.' || *ps->p == 'e' || *ps->p == 'E'))
        return syntax(ps, "expected an integer, found a fraction or an exponent");
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    return 0;
}

/* Parses the members of "__metadata__": an object of strings. */
static int metadata(parser *ps, wf__st_header *h)
{
    char b[32];
    int rc = expect(ps, '{', "to open \"__metadata__\"");
    if (rc < 0)
        return rc;
    ws(ps);
    if (ps->p < ps->end && *ps->p == '}') {
        ps->p++;
        return 0;
    }
    for (int cap = h->n_meta;;) {
        char *key, *val;
        if ((rc = string(ps, &key)) < 0)
            return rc;
        for (int i = 0; i < h->n_meta; i++)
            if (strcmp(h->meta[2 * i], key) == 0) {
                char nm[96];
                rc = bad(ps, NULL, "\"__metadata__\" has the key '%s' twice",
                         shown(key, nm, sizeof nm));
                free(key);
                return rc;
            }
        if ((rc = expect(ps, ':', "after a key")) < 0) {
            free(key);
            return rc;
        }
        ws(ps);
        if (ps->p >= ps->end || *ps->p != '"') {
            char nm[96];
            rc = bad(ps, NULL, "\"__metadata__\" value of '%s' is not a string (found %s)",
                     shown(key, nm, sizeof nm), at(ps, b, sizeof b));
            free(key);
            return rc;
        }
        if ((rc = string(ps, &val)) < 0) {
            free(key);
            return rc;
        }
        if (h->n_meta == cap) {
            cap = cap ? 2 * cap : 4;
            char **m = realloc(h->meta, (size_t)cap * 2 * sizeof *m);
            if (!m) {
                free(key);
                free(val);
                return wf__err(WF_ENOMEM, "%s: no memory for the metadata", ps->what);
            }
            h->meta = m;
        }
        h->meta[2 * h->n_meta] = key;
        h->meta[2 * h->n_meta + 1] = val;
        h->n_meta++;
        ws(ps);
        if (ps->p < ps->end && *ps->p == ',') {
            ps->p++;
            continue;
        }
        return expect(ps, '}', "or ',' in \"__metadata__\"");
    }
}

/* Parses an integer array at the cursor into 'v' (at most 'max' elements, more is an error
 * naming 'what'); '*n' gets the count. */
static int int_array(parser *ps, const char *name, const char *key, int64_t *v, int max, int *n)
{
    int rc = expect(ps, '[', "to open an array");
    if (rc < 0)
        return rc;
    *n = 0;
    ws(ps);
    if (ps->p < ps->end && *ps->p == ']') {
        ps->p++;
        return 0;
    }
    for (;;) {
        int64_t x = 0;
        if ((rc = integer(ps, &x)) < 0)
            return rc;
        if (*n == max)
            return strcmp(key, "shape") == 0
                       ? bad(ps, name, "shape has more than %d dimensions (WF_MAX_RANK)", max)
                       : bad(ps, name, "%s has more than %d elements", key, max);
        v[(*n)++] = x;
        ws(ps);
        if (ps->p < ps->end && *ps->p == ',') {
            ps->p++;
            continue;
        }
        return expect(ps, ']', "or ',' in an array");
    }
}

/* Formats an int64 list as "[a, b, c]". */
static const char *list_str(const int64_t *v, int n, char *buf, size_t size)
{
    size_t k = (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < n && k < size; i++)
        k += (size_t)snprintf(buf + k, size - k, "%s%lld", i ? ", " : "", (long long)v[i]);
    if (k < size)
        snprintf(buf + k, size - k, "]");
    return buf;
}

/* Parses one tensor entry (the object after its name) and checks it against the data
 * section. */
static int entry(parser *ps, const char *name, uint64_t data_size, wf__st_entry *e)
{
    enum { HAS_DTYPE = 1, HAS_SHAPE = 2, HAS_OFFSETS = 4 };

    char b[32], nm[96], sb[200];
    unsigned has = 0;
    int64_t dims[WF_MAX_RANK], offs[2];
    int rank = 0, n_offs = 0;
    char *dtype = NULL;
    int rc = 0;
    ws(ps);
    if (ps->p >= ps->end || *ps->p != '{')
        return bad(ps, name, "expected an object with dtype, shape and data_offsets, found %s",
                   at(ps, b, sizeof b));
    ps->p++;
    ws(ps);
    if (ps->p < ps->end && *ps->p == '}')
        ps->p++;
    else
        for (;;) {
            char *key;
            if ((rc = string(ps, &key)) < 0)
                break;
            unsigned bit = strcmp(key, "dtype") == 0          ? HAS_DTYPE
                           : strcmp(key, "shape") == 0        ? HAS_SHAPE
                           : strcmp(key, "data_offsets") == 0 ? HAS_OFFSETS
                                                              : 0;
            if (!bit || (has & bit)) {
                rc = bad(ps, name, bit ? "has '%s' twice" : "unknown key '%s'",
                         shown(key, nm, sizeof nm));
                free(key);
                break;
            }
            has |= bit;
            if ((rc = expect(ps, ':', "after a key")) < 0) {
                free(key);
                break;
            }
            if (bit == HAS_DTYPE) {
                ws(ps);
                if (ps->p >= ps->end || *ps->p != '"')
                    rc = bad(ps, name, "dtype is not a string (found %s)", at(ps, b, sizeof b));
                else
                    rc = string(ps, &dtype);
            } else if (bit == HAS_SHAPE) {
                rc = int_array(ps, name, key, dims, WF_MAX_RANK, &rank);
            } else {
                rc = int_array(ps, name, key, offs, 2, &n_offs);
            }
            free(key);
            if (rc < 0)
                break;
            ws(ps);
            if (ps->p < ps->end && *ps->p == ',') {
                ps->p++;
                continue;
            }
            rc = expect(ps, '}', "or ',' in a tensor entry");
            break;
        }
    if (rc == 0 && has != (HAS_DTYPE | HAS_SHAPE | HAS_OFFSETS))
        rc = bad(ps, name, "has no '%s'",
                 !(has & HAS_DTYPE)   ? "dtype"
                 : !(has & HAS_SHAPE) ? "shape"
                                      : "data_offsets");
    if (rc == 0 && (e->dtype = dtype_of(dtype)) == WF_DTYPE_INVALID)
        rc =
            bad(ps, name, "unknown dtype '%s' (weft reads F32, F64, I32, I64, U8, BOOL, BF16, F16)",
                shown(dtype, nm, sizeof nm));
    free(dtype);
    if (rc < 0)
        return rc;
    for (int d = 0; d < rank; d++)
        if (dims[d] < 0)
            return bad(ps, name, "shape %s has a negative dimension",
                       list_str(dims, rank, sb, sizeof sb));
    if (n_offs != 2)
        return bad(ps, name, "data_offsets %s is not a pair [begin, end]",
                   list_str(offs, n_offs, sb, sizeof sb));
    if (offs[0] < 0 || offs[1] < offs[0])
        return bad(ps, name, "data_offsets %s is not a range (0 <= begin <= end)",
                   list_str(offs, 2, sb, sizeof sb));
    e->shape.rank = rank;
    uint64_t numel = 1;
    bool overflow = false;
    for (int d = 0; d < rank; d++) {
        e->shape.dims[d] = dims[d];
        if (dims[d] && numel > (uint64_t)INT64_MAX / (uint64_t)dims[d])
            overflow = true;
        else
            numel *= (uint64_t)dims[d];
    }
    size_t es = wf_dtype_size(e->dtype);
    if (overflow || numel > (uint64_t)INT64_MAX / es)
        return bad(ps, name, "%s %s has too many elements", st_dtype_names[e->dtype],
                   list_str(dims, rank, sb, sizeof sb));
    uint64_t need = numel * es, held = (uint64_t)offs[1] - (uint64_t)offs[0];
    if (held != need) {
        char ob[64];
        return bad(ps, name, "data_offsets %s hold %llu bytes but %s %s needs %llu",
                   list_str(offs, 2, ob, sizeof ob), (unsigned long long)held,
                   st_dtype_names[e->dtype], list_str(dims, rank, sb, sizeof sb),
                   (unsigned long long)need);
    }
    if ((uint64_t)offs[1] > data_size)
        return bad(ps, name, "data_offsets %s end past the data section (%llu bytes)",
                   list_str(offs, 2, sb, sizeof sb), (unsigned long long)data_size);
    e->begin = (uint64_t)offs[0];
    e->end = (uint64_t)offs[1];
    return 0;
}

void wf__st_header_free(wf__st_header *h)
{
    if (!h)
        return;
    for (int i = 0; i < h->n; i++)
        free(h->entries[i].name);
    for (int i = 0; i < 2 * h->n_meta; i++)
        free(h->meta[i]);
    free(h->entries);
    free(h->by_name);
    free(h->meta);
    memset(h, 0, sizeof *h);
}

/* qsort contexts: glibc's qsort_r passes one. */
static int cmp_name(const void *a, const void *b, void *ctx)
{
    const wf__st_entry *e = ctx;
    return strcmp(e[*(const int32_t *)a].name, e[*(const int32_t *)b].name);
}

static int cmp_begin(const void *a, const void *b, void *ctx)
{
    const wf__st_entry *e = ctx, *x = &e[*(const int32_t *)a], *y = &e[*(const int32_t *)b];
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    return (x->end > y->end) - (x->end < y->end);
}

/* The checks between entries: distinct names (and the by-name index), no overlaps. */
static int cross_checks(parser *ps, wf__st_header *h)
{
    char n1[96], o1[64], o2[64];
    if (!h->n)
        return 0;
    int32_t *idx = malloc((size_t)h->n * sizeof *idx);
    h->by_name = malloc((size_t)h->n * sizeof *h->by_name);
    if (!idx || !h->by_name) {
        free(idx);
        return wf__err(WF_ENOMEM, "%s: no memory for %d entries", ps->what, h->n);
    }
    for (int i = 0; i < h->n; i++)
        h->by_name[i] = idx[i] = i;
    qsort_r(h->by_name, (size_t)h->n, sizeof *idx, cmp_name, h->entries);
    for (int i = 1; i < h->n; i++)
        if (strcmp(h->entries[h->by_name[i - 1]].name, h->entries[h->by_name[i]].name) == 0) {
            free(idx);
            return bad(ps, h->entries[h->by_name[i]].name, "appears twice in the header");
        }
    /* Sorted by begin, an entry overlaps another iff it overlaps the non-empty entry before
     * it that ends last. Empty entries hold no bytes and overlap nothing. */
    qsort_r(idx, (size_t)h->n, sizeof *idx, cmp_begin, h->entries);
    int last = -1;
    for (int i = 0; i < h->n; i++) {
        const wf__st_entry *e = &h->entries[idx[i]];
        if (e->begin == e->end)
            continue;
        if (last >= 0 && h->entries[last].end > e->begin) {
            const wf__st_entry *f = &h->entries[last];
            int64_t a[2] = { (int64_t)f->begin, (int64_t)f->end };
            int64_t b[2] = { (int64_t)e->begin, (int64_t)e->end };
            int rc = bad(ps, e->name, "data_offsets %s overlap those of tensor '%s' %s",
                         list_str(b, 2, o2, sizeof o2), shown(f->name, n1, sizeof n1),
                         list_str(a, 2, o1, sizeof o1));
            free(idx);
            return rc;
        }
        if (last < 0 || e->end > h->entries[last].end)
            last = idx[i];
    }
    free(idx);
    return 0;
}

int wf__st_parse(const char *json, size_t len, uint64_t data_size, const char *what,
                 wf__st_header *out)
{
    memset(out, 0, sizeof *out);
    parser ps = { (const unsigned char *)json, (const unsigned char *)json,
                  (const unsigned char *)json + len, what };
    char b[32];
    wf__st_header h = { 0 };
    int cap = 0, rc = 0;
    bool seen_meta = false;
    /* The format says the header starts with '{' (no leading whitespace). */
    if (!len || json[0] != '{')
        return syntax(&ps, "the header must start with '{', found %s", at(&ps, b, sizeof b));
    ps.p++;
    ws(&ps);
    if (ps.p < ps.end && *ps.p == '}')
        ps.p++;
    else
        for (;;) {
            char *key;
            if ((rc = string(&ps, &key)) < 0)
                break;
            if ((rc = expect(&ps, ':', "after a key")) < 0) {
                free(key);
                break;
            }
            if (strcmp(key, "__metadata__") == 0) {
                free(key);
                if (seen_meta) {
                    rc = bad(&ps, NULL, "\"__metadata__\" appears twice");
                    break;
                }
                seen_meta = true;
                if ((rc = metadata(&ps, &h)) < 0)
                    break;
            } else {
                if (h.n == cap) {
                    int ncap = cap ? 2 * cap : 16;
                    wf__st_entry *ne = realloc(h.entries, (size_t)ncap * sizeof *ne);
                    if (!ne) {
                        free(key);
                        rc = wf__err(WF_ENOMEM, "%s: no memory for %d entries", what, ncap);
                        break;
                    }
                    h.entries = ne;
                    cap = ncap;
                }
                wf__st_entry *e = &h.entries[h.n];
                memset(e, 0, sizeof *e);
                if ((rc = entry(&ps, key, data_size, e)) < 0) {
                    free(key);
                    break;
                }
                e->name = key;
                h.n++;
            }
            ws(&ps);
            if (ps.p < ps.end && *ps.p == ',') {
                ps.p++;
                continue;
            }
            rc = expect(&ps, '}', "or ',' after a tensor entry");
            break;
        }
    if (rc == 0) {
        ws(&ps); /* the padding */
        if (ps.p != ps.end)
            rc = syntax(&ps, "%s after the header's closing '}'", at(&ps, b, sizeof b));
    }
    if (rc == 0)
        rc = cross_checks(&ps, &h);
    if (rc < 0) {
        wf__st_header_free(&h);
        return rc;
    }
    *out = h;
    return 0;
}

int wf__st_find(const wf__st_header *h, const char *name)
{
    int lo = 0, hi = h->n;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(h->entries[h->by_name[mid]].name, name);
        if (c == 0)
            return h->by_name[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return -1;
}

/* ---- Reading files ------------------------------------------------------------------------- */

/* A failed OS call on 'f->what'. */
static int os_err(const char *what, const char *doing, int errnum)
{
    char tmp[128];
    const char *s = strerror_r(errnum, tmp, sizeof tmp);
    return wf__err(errnum == ENOENT ? WF_ENOTFOUND : WF_EIO, "%s: %s: %s", what, doing, s);
}

/* Reads exactly 'n' bytes at 'off'; a short read (the file shrank) is WF_EFORMAT. */
static int read_at(int fd, const char *what, void *buf, uint64_t n, uint64_t off)
{
    char *p = buf;
    while (n) {
        size_t chunk = n > (1u << 30) ? (1u << 30) : (size_t)n;
        ssize_t r = pread(fd, p, chunk, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return os_err(what, "read", errno);
        if (r == 0)
            return wf__err(WF_EFORMAT,
                           "%s: the file ends at byte %llu, before its data (was it "
                           "truncated while being read?)",
                           what, (unsigned long long)off);
        p += r;
        n -= (uint64_t)r;
        off += (uint64_t)r;
    }
    return 0;
}

void wf__st_close(wf__st_file *f)
{
    if (!f)
        return;
    if (f->fd >= 0)
        close(f->fd);
    free(f->what);
    wf__st_header_free(&f->header);
    memset(f, 0, sizeof *f);
    f->fd = -1;
}

int wf__st_open(const char *path, wf__st_file *f)
{
    memset(f, 0, sizeof *f);
    f->fd = -1;
    if (!path || !*path)
        return wf__err(WF_EINVAL, "checkpoint: the path is %s", path ? "empty" : "NULL");
    size_t wlen = strlen(path) + 16;
    if (!(f->what = malloc(wlen)))
        return wf__err(WF_ENOMEM, "checkpoint: no memory");
    snprintf(f->what, wlen, "checkpoint '%s'", path);
    int rc = 0;
    if (BIG_ENDIAN_HOST) {
        rc = wf__err(WF_ENOSYS, "%s: checkpoints need a little-endian host", f->what);
        goto fail;
    }
    if ((f->fd = open(path, O_RDONLY | O_CLOEXEC)) < 0) {
        rc = os_err(f->what, "cannot open", errno);
        goto fail;
    }
    struct stat st;
    if (fstat(f->fd, &st) < 0) {
        rc = os_err(f->what, "cannot stat", errno);
        goto fail;
    }
    if (!S_ISREG(st.st_mode)) {
        rc = wf__err(WF_EIO, "%s: not a regular file", f->what);
        goto fail;
    }
    uint64_t size = (uint64_t)st.st_size;
    if (size < 8) {
        rc = wf__err(WF_EFORMAT,
                     "%s: the file has %llu bytes, fewer than the 8 of the header length", f->what,
                     (unsigned long long)size);
        goto fail;
    }
    unsigned char lenb[8];
    if ((rc = read_at(f->fd, f->what, lenb, 8, 0)) < 0)
        goto fail;
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = n << 8 | lenb[i];
    if (n > size - 8) {
        rc = wf__err(WF_EFORMAT,
                     "%s: the header length is %llu bytes but only %llu bytes follow it "
                     "(truncated file?)",
                     f->what, (unsigned long long)n, (unsigned long long)(size - 8));
        goto fail;
    }
    if (n > WF__ST_MAX_HEADER) {
        rc = wf__err(WF_EFORMAT, "%s: the header length is %llu bytes, above the limit of %llu",
                     f->what, (unsigned long long)n, WF__ST_MAX_HEADER);
        goto fail;
    }
    char *json = malloc(n ? (size_t)n : 1);
    if (!json) {
        rc = wf__err(WF_ENOMEM, "%s: no memory for a %llu-byte header", f->what,
                     (unsigned long long)n);
        goto fail;
    }
    if ((rc = read_at(f->fd, f->what, json, n, 8)) == 0)
        rc = wf__st_parse(json, (size_t)n, size - 8 - n, f->what, &f->header);
    free(json);
    if (rc < 0)
        goto fail;
    f->data_start = 8 + n;
    f->data_size = size - 8 - n;
    return 0;
fail:
    wf__st_close(f);
    return rc;
}

/* The data of entry 'e' that decoding can refuse: a BOOL byte other than 0 or 1. 'p' holds
 * 'n' of its bytes, the first being element 'first'. */
static int check_data(const wf__st_file *f, const wf__st_entry *e, const unsigned char *p,
                      uint64_t n, uint64_t first)
{
    if (e->dtype != WF_BOOL)
        return 0;
    char nm[96];
    for (uint64_t k = 0; k < n; k++)
        if (p[k] > 1)
            return wf__err(WF_EFORMAT, "%s: tensor '%s': BOOL element %llu is %u, not 0 or 1",
                           f->what, shown(e->name, nm, sizeof nm), (unsigned long long)(first + k),
                           p[k]);
    return 0;
}

/* Validates entry 'i''s data without keeping it (read in pieces of VERIFY_BYTES). */
#define VERIFY_BYTES 65536

static int verify(const wf__st_file *f, int i)
{
    const wf__st_entry *e = &f->header.entries[i];
    if (e->dtype != WF_BOOL)
        return 0; /* every bit pattern of the other dtypes is a value */
    uint64_t bytes = e->end - e->begin;
    unsigned char *buf = malloc(VERIFY_BYTES);
    if (!buf)
        return wf__err(WF_ENOMEM, "%s: no memory to check the data", f->what);
    int rc = 0;
    for (uint64_t off = 0; off < bytes && rc == 0; off += VERIFY_BYTES) {
        uint64_t n = bytes - off < VERIFY_BYTES ? bytes - off : VERIFY_BYTES;
        rc = read_at(f->fd, f->what, buf, n, f->data_start + e->begin + off);
        if (rc == 0)
            rc = check_data(f, e, buf, n, off);
    }
    free(buf);
    return rc;
}

int wf__st_read_all(const wf__st_file *f, const uint8_t *keep, wf_tensor **out)
{
    int rc = 0;
    for (int i = 0; i < f->header.n; i++)
        out[i] = NULL;
    for (int i = 0; i < f->header.n && rc == 0; i++)
        rc = !keep || keep[i] ? wf__st_load(f, i, &out[i]) : verify(f, i);
    if (rc < 0)
        for (int i = 0; i < f->header.n; i++) {
            wf_tensor_release(out[i]);
            out[i] = NULL;
        }
    return rc;
}

int wf__st_load(const wf__st_file *f, int i, wf_tensor **out)
{
    *out = NULL;
    const wf__st_entry *e = &f->header.entries[i];
    char nm[96];
    wf_tensor *t = wf__tensor_alloc(e->dtype, e->shape);
    if (!t)
        return wf__err(WF_ENOMEM, "%s: tensor '%s': %s", f->what, shown(e->name, nm, sizeof nm),
                       wf_last_errmsg());
    uint64_t bytes = e->end - e->begin;
    int rc = read_at(f->fd, f->what, t->data, bytes, f->data_start + e->begin);
    if (rc == 0)
        rc = check_data(f, e, (const unsigned char *)t->data, bytes, 0);
    if (rc < 0) {
        wf_tensor_release(t);
        return rc;
    }
    *out = t;
    return 0;
}

/* ---- Writing ------------------------------------------------------------------------------- */

/* A growable text buffer; 'failed' sticks after an allocation failure. */
typedef struct sbuf {
    char *p;
    size_t n, cap;
    bool failed;
} sbuf;

static void put(sbuf *b, const char *s, size_t n)
{
    if (b->failed)
        return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->failed = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

static void puts_(sbuf *b, const char *s)
{
    put(b, s, strlen(s));
}

/* A JSON string: quotes, backslashes and control bytes escaped; UTF-8 kept (validated by
 * the caller). */
static void put_json_string(sbuf *b, const char *s)
{
    put(b, "\"", 1);
    for (const char *q = s; *q; q++) {
        unsigned char c = (unsigned char)*q;
        char esc[8];
        if (c == '"' || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)c;
            put(b, esc, 2);
        } else if (c < 0x20) {
            const char *short_esc = c == '\b'   ? "\\b"
                                    : c == '\f' ? "\\f"
                                    : c == '\n' ? "\\n"
                                    : c == '\r' ? "\\r"
                                    : c == '\t' ? "\\t"
                                                : NULL;
            if (short_esc) {
                puts_(b, short_esc);
            } else {
                snprintf(esc, sizeof esc, "\\u%04x", c);
                put(b, esc, 6);
            }
        } else {
            put(b, q, 1);
        }
    }
    put(b, "\"", 1);
}

/* The steps of a write, for the 'fail_at' hook. */
typedef struct writer {
    const char *what, *tmp;
    int step, fail_at;
} writer;

/* Counts a step; true if the hook makes it fail (errno set to EIO). */
static bool injected(writer *w)
{
    if (++w->step == w->fail_at) {
        errno = EIO;
        return true;
    }
    return false;
}

static int write_all(writer *w, int fd, const void *buf, uint64_t n)
{
    if (injected(w))
        return -1;
    const char *p = buf;
    while (n) {
        size_t chunk = n > (1u << 30) ? (1u << 30) : (size_t)n;
        ssize_t r = write(fd, p, chunk);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -1;
        p += r;
        n -= (uint64_t)r;
    }
    return 0;
}

static int wr_err(writer *w, const char *doing, const char *file)
{
    char tmp[128];
    int errnum = errno;
    const char *s = strerror_r(errnum, tmp, sizeof tmp);
    return wf__err(WF_EIO, "%s: %s '%s': %s%s", w->what, doing, file, s,
                   w->step == w->fail_at ? " (injected by the test hook)" : "");
}

/* Sort key of the data layout: larger elements first, then the caller's order. */
typedef struct order_item {
    int32_t index;
    int32_t elem;
} order_item;

static int cmp_order(const void *a, const void *b)
{
    const order_item *x = a, *y = b;
    if (x->elem != y->elem)
        return x->elem > y->elem ? -1 : 1;
    return (x->index > y->index) - (x->index < y->index);
}

static int cmp_str_ptr(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Checks the arguments of a write: 'what' names the file. */
static int check_write_args(const char *what, const wf_named_tensor *ts, int n,
                            const char *const *meta, int n_meta)
{
    char nm[96];
    if (n < 0 || n_meta < 0)
        return wf__err(WF_EINVAL, "%s: negative count (%d tensors, %d metadata pairs)", what, n,
                       n_meta);
    if ((n && !ts) || (n_meta && !meta))
        return wf__err(WF_EINVAL, "%s: %s is NULL but its count is not 0", what,
                       n && !ts ? "the tensor array" : "the metadata array");
    for (int i = 0; i < 2 * n_meta; i++)
        if (!meta[i] || !utf8_valid(meta[i]))
            return wf__err(WF_EINVAL, "%s: metadata string %d is %s", what, i,
                           meta[i] ? "not valid UTF-8" : "NULL");
    for (int i = 0; i < n; i++) {
        const wf_named_tensor *t = &ts[i];
        if (!t->name)
            return wf__err(WF_EINVAL, "%s: tensor %d has a NULL name", what, i);
        if (!utf8_valid(t->name))
            return wf__err(WF_EINVAL, "%s: the name of tensor %d ('%s') is not valid UTF-8", what,
                           i, shown(t->name, nm, sizeof nm));
        if (strcmp(t->name, "__metadata__") == 0)
            return wf__err(WF_EINVAL,
                           "%s: tensor %d is named \"__metadata__\", which the format reserves",
                           what, i);
        if (!t->tensor)
            return wf__err(WF_EINVAL, "%s: tensor %d ('%s') is NULL", what, i,
                           shown(t->name, nm, sizeof nm));
        if (!st_dtype_names[wf_tensor_dtype(t->tensor)])
            return wf__err(WF_EINVAL, "%s: tensor '%s' has dtype %s, which the format lacks", what,
                           shown(t->name, nm, sizeof nm),
                           wf_dtype_name(wf_tensor_dtype(t->tensor)));
    }
    if (n > 1) {
        const char **names = malloc((size_t)n * sizeof *names);
        if (!names)
            return wf__err(WF_ENOMEM, "%s: no memory", what);
        for (int i = 0; i < n; i++)
            names[i] = ts[i].name;
        qsort(names, (size_t)n, sizeof *names, cmp_str_ptr);
        for (int i = 1; i < n; i++)
            if (strcmp(names[i - 1], names[i]) == 0) {
                int rc = wf__err(WF_EINVAL, "%s: two tensors are named '%s'", what,
                                 shown(names[i], nm, sizeof nm));
                free(names);
                return rc;
            }
        free(names);
    }
    return 0;
}

/* The header text, padded with spaces to a multiple of 8 bytes, for the data laid out in
 * 'order'. */
static int build_header(const char *what, const wf_named_tensor *ts, const order_item *order, int n,
                        const char *const *meta, int n_meta, sbuf *hb)
{
    char num[64];
    uint64_t off = 0;
    puts_(hb, "{");
    if (n_meta) {
        puts_(hb, "\"__metadata__\":{");
        for (int i = 0; i < n_meta; i++) {
            if (i)
                puts_(hb, ",");
            put_json_string(hb, meta[2 * i]);
            puts_(hb, ":");
            put_json_string(hb, meta[2 * i + 1]);
        }
        puts_(hb, "}");
    }
    for (int k = 0; k < n; k++) {
        const wf_tensor *t = ts[order[k].index].tensor;
        wf_shape sh = wf_tensor_shape(t);
        uint64_t bytes = (uint64_t)wf_tensor_numel(t) * wf_dtype_size(wf_tensor_dtype(t));
        if (off > UINT64_MAX / 2 - bytes)
            return wf__err(WF_EINVAL, "%s: the tensors hold more bytes than a file can", what);
        if (k || n_meta)
            puts_(hb, ",");
        put_json_string(hb, ts[order[k].index].name);
        puts_(hb, ":{\"dtype\":\"");
        puts_(hb, st_dtype_names[wf_tensor_dtype(t)]);
        puts_(hb, "\",\"shape\":[");
        for (int d = 0; d < sh.rank; d++) {
            snprintf(num, sizeof num, "%s%lld", d ? "," : "", (long long)sh.dims[d]);
            puts_(hb, num);
        }
        snprintf(num, sizeof num, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
                 (unsigned long long)(off + bytes));
        puts_(hb, num);
        off += bytes;
    }
    puts_(hb, "}");
    while (!hb->failed && hb->n % 8)
        puts_(hb, " ");
    if (hb->failed)
        return wf__err(WF_ENOMEM, "%s: no memory for the header", what);
    if (hb->n > WF__ST_MAX_HEADER)
        return wf__err(WF_EINVAL, "%s: the header would be %zu bytes, above the limit of %llu",
                       what, hb->n, WF__ST_MAX_HEADER);
    return 0;
}

/* Writes header and data to the open temporary file 'fd'. */
static int write_body(writer *w, int fd, const sbuf *hb, const wf_named_tensor *ts,
                      const order_item *order, int n)
{
    unsigned char lenb[8];
    uint64_t hn = hb->n;
    for (int i = 0; i < 8; i++)
        lenb[i] = (unsigned char)(hn >> (8 * i));
    if (write_all(w, fd, lenb, 8) < 0 || write_all(w, fd, hb->p, hb->n) < 0)
        return wr_err(w, "cannot write", w->tmp);
    for (int k = 0; k < n; k++) {
        const wf_tensor *t = ts[order[k].index].tensor;
        size_t bytes = (size_t)wf_tensor_numel(t) * wf_dtype_size(wf_tensor_dtype(t));
        if (!bytes)
            continue;
        const void *data = wf_tensor_data(t);
        void *copy = NULL;
        if (!wf_tensor_is_contiguous(t)) {
            if (!(copy = malloc(bytes)))
                return wf__err(WF_ENOMEM, "%s: no memory to lay out a strided tensor", w->what);
            if (wf_tensor_read(t, wf_tensor_dtype(t), copy, bytes) < 0) {
                free(copy);
                return wf__err(WF_EINVAL, "%s: %s", w->what, wf_last_errmsg());
            }
            data = copy;
        }
        int r = write_all(w, fd, data, bytes);
        free(copy);
        if (r < 0)
            return wr_err(w, "cannot write", w->tmp);
    }
    return 0;
}

/* The directory that holds 'path' (malloc'd), or NULL without memory. */
static char *dir_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    size_t dn = slash ? (size_t)(slash - path) : 1;
    char *dir = malloc(dn + 2);
    if (!dir)
        return NULL;
    if (!slash)
        memcpy(dir, ".", 1);
    else if (dn == 0)
        memcpy(dir, "/", ++dn);
    else
        memcpy(dir, path, dn);
    dir[dn] = '\0';
    return dir;
}

/* Removes the temporary files "<path>.tmp.<pid>.<tid>" that processes killed during a save
 * of 'path' left behind: those of a pid that no longer exists (kill(pid, 0) says ESRCH). A
 * live process's file is never touched: this process's (its other threads may be saving),
 * one of a pid that exists, one whose pid cannot be probed (EPERM: another user's). Only
 * processes of this pid namespace are seen: two hosts or containers saving one path of a
 * shared file system at once are not supported. Best effort: nothing here fails a save. */
static void remove_stale(const char *path)
{
    char *dir = dir_of(path);
    DIR *d = dir ? opendir(dir) : NULL;
    const char *slash = strrchr(path, '/'), *base = slash ? slash + 1 : path;
    size_t bn = strlen(base);
    pid_t self = getpid();
    for (struct dirent *de; d && (de = readdir(d));) {
        const char *nm = de->d_name;
        if (strncmp(nm, base, bn) != 0 || strncmp(nm + bn, ".tmp.", 5) != 0)
            continue;
        char *end;
        errno = 0;
        long pid = strtol(nm + bn + 5, &end, 10);
        if (errno || pid <= 0 || pid == (long)self || *end != '.' || !end[1])
            continue;
        const char *tid = end + 1;
        strtol(tid, &end, 10);
        if (errno || *end)
            continue;
        if (kill((pid_t)pid, 0) < 0 && errno == ESRCH)
            unlinkat(dirfd(d), nm, 0);
    }
    if (d)
        closedir(d);
    free(dir);
}

/* Syncs the directory that holds 'path', so the rename itself survives a crash. File
 * systems that cannot sync a directory say EINVAL; that is not an error. */
static int sync_dir(writer *w, const char *path)
{
    char *dir = dir_of(path);
    if (!dir)
        return wf__err(WF_ENOMEM, "%s: no memory", w->what);
    int rc = 0;
    int dfd = injected(w) ? -1 : open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) {
        rc = wr_err(w, "the new file is in place but cannot open its directory", dir);
    } else {
        if ((injected(w) || fsync(dfd) < 0) && errno != EINVAL)
            rc = wr_err(w, "the new file is in place but cannot fsync its directory", dir);
        close(dfd);
    }
    free(dir);
    return rc;
}

int wf__st_write(const char *path, const wf_named_tensor *ts, int n, const char *const *meta,
                 int n_meta, int fail_at)
{
    if (!path || !*path)
        return wf__err(WF_EINVAL, "checkpoint: the path is %s", path ? "empty" : "NULL");
    size_t wlen = strlen(path) + 16, tlen = strlen(path) + 48;
    char *what = malloc(wlen), *tmp = malloc(tlen);
    order_item *order = malloc((size_t)(n > 0 ? n : 1) * sizeof *order);
    sbuf hb = { 0 };
    int fd = -1, rc = 0;
    if (!what || !tmp || !order) {
        rc = wf__err(WF_ENOMEM, "checkpoint '%s': no memory", path);
        goto out;
    }
    snprintf(what, wlen, "checkpoint '%s'", path);
    /* pid and thread id: two processes, or two threads of one, saving to the same path at
     * once each write their own temporary file, and the last rename wins whole. */
    snprintf(tmp, tlen, "%s.tmp.%ld.%ld", path, (long)getpid(), (long)syscall(SYS_gettid));
    if (BIG_ENDIAN_HOST) {
        rc = wf__err(WF_ENOSYS, "%s: checkpoints need a little-endian host", what);
        goto out;
    }
    if ((rc = check_write_args(what, ts, n, meta, n_meta)) < 0)
        goto out;
    for (int i = 0; i < n; i++)
        order[i] = (order_item){ i, (int32_t)wf_dtype_size(wf_tensor_dtype(ts[i].tensor)) };
    qsort(order, (size_t)n, sizeof *order, cmp_order);
    if ((rc = build_header(what, ts, order, n, meta, n_meta, &hb)) < 0)
        goto out;

    writer w = { what, tmp, 0, fail_at };
    /* A leftover of a dead process that had our pid and tid is ours to replace, and those
     * of other dead processes go too (each kill during a save leaves one). */
    unlink(tmp);
    remove_stale(path);
    fd = injected(&w) ? -1 : open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0) {
        rc = wr_err(&w, "cannot create", tmp);
        goto out;
    }
    if ((rc = write_body(&w, fd, &hb, ts, order, n)) < 0)
        goto fail_tmp;
    if (injected(&w) || fsync(fd) < 0) {
        rc = wr_err(&w, "cannot fsync", tmp);
        goto fail_tmp;
    }
    int cr = -1;
    if (!injected(&w)) {
        cr = close(fd);
        fd = -1; /* closed even when close() reports an error */
    }
    if (cr < 0) {
        rc = wr_err(&w, "cannot close", tmp);
        goto fail_tmp;
    }
    if (injected(&w) || rename(tmp, path) < 0) {
        rc = wr_err(&w, "cannot rename the new file over", path);
        goto fail_tmp;
    }
    rc = sync_dir(&w, path);
    goto out;
fail_tmp:
    if (fd >= 0)
        close(fd);
    fd = -1;
    unlink(tmp);
out:
    free(hb.p);
    free(order);
    free(tmp);
    free(what);
    return rc;
}

/* ---- The public calls ---------------------------------------------------------------------- */

int wf_safetensors_write(const char *path, const wf_named_tensor *ts, int n)
{
    return wf__st_write(path, ts, n, NULL, 0, 0);
}

void wf_safetensors_free(wf_named_tensor *ts, int n)
{
    if (!ts)
        return;
    for (int i = 0; i < n; i++) {
        free((char *)ts[i].name);
        wf_tensor_release(ts[i].tensor);
    }
    free(ts);
}

int wf_safetensors_read(const char *path, wf_named_tensor **out, int *n)
{
    if (out)
        *out = NULL;
    if (n)
        *n = 0;
    if (!out || !n)
        return wf__err(WF_EINVAL, "wf_safetensors_read: %s is NULL", out ? "n" : "out");
    wf__st_file f;
    int rc = wf__st_open(path, &f);
    if (rc < 0)
        return rc;
    int cnt = f.header.n;
    wf_named_tensor *ts = calloc((size_t)(cnt ? cnt : 1), sizeof *ts);
    wf_tensor **vals = calloc((size_t)(cnt ? cnt : 1), sizeof *vals);
    if (!ts || !vals) {
        rc = wf__err(WF_ENOMEM, "%s: no memory for %d tensors", f.what, cnt);
        free(ts);
        free(vals);
        wf__st_close(&f);
        return rc;
    }
    if ((rc = wf__st_read_all(&f, NULL, vals)) < 0) {
        free(ts);
        free(vals);
        wf__st_close(&f);
        return rc;
    }
    for (int i = 0; i < cnt; i++) {
        ts[i].tensor = vals[i];
        ts[i].name = f.header.entries[i].name; /* taken over from the header */
        f.header.entries[i].name = NULL;
    }
    free(vals);
    wf__st_close(&f);
    *out = ts;
    *n = cnt;
    return 0;
}
