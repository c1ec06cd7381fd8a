/* tools/trace_parse.c: reads a Chrome/Perfetto trace JSON file into weft-trace's events.
 * Owns: a strict JSON reader (RFC 8259: every byte is checked, whatever key it belongs to)
 * that fills tr_event records straight from the text, without building a tree, so a 100 MB
 * trace is read in one pass; the string table. A malformed or truncated file is an error that
 * names the byte offset, line and column, never a crash: nesting is bounded (MAX_DEPTH), and
 * every read checks the end of the text first.
 * Not here: what the events mean (trace_analyze.c). */
#include "trace_data.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 64

typedef struct parser {
    const char *s, *p, *end;
    const char *file;
    char *err;
    size_t errlen;
    bool failed;
    tr_trace *t;
    char *scratch; /* unescaped strings */
    size_t scap;
} parser;

static bool fail(parser *ps, const char *at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static bool fail(parser *ps, const char *at, const char *fmt, ...)
{
    if (ps->failed)
        return false;
    ps->failed = true;
    long line = 1;
    const char *bol = ps->s;
    for (const char *q = ps->s; q < at; q++)
        if (*q == '\n') {
            line++;
            bol = q + 1;
        }
    char why[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    snprintf(ps->err, ps->errlen, "%s: offset %zu (line %ld, column %zu): %s", ps->file,
             (size_t)(at - ps->s), line, (size_t)(at - bol) + 1, why);
    return false;
}

/* What is at 'p', for messages. */
static const char *what(const parser *ps, char *buf, size_t len)
{
    if (ps->p >= ps->end)
        return "the end of the file (is it cut short?)";
    unsigned char c = (unsigned char)*ps->p;
    if (c >= 0x20 && c < 0x7f)
        snprintf(buf, len, "'%c'", c);
    else
        snprintf(buf, len, "byte 0x%02x", c);
    return buf;
}

static bool expected(parser *ps, const char *thing)
{
    char b[16];
    return fail(ps, ps->p, "expected %s, found %s", thing, what(ps, b, sizeof b));
}

static void ws(parser *ps)
{
    const char *p = ps->p, *end = ps->end;
    while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t'))
        p++;
    ps->p = p;
}

static bool eat(parser *ps, char c)
{
    ws(ps);
    if (ps->p < ps->end && *ps->p == c) {
        ps->p++;
        return true;
    }
    return false;
}

static bool put_scratch(parser *ps, size_t at, const char *b, size_t n)
{
    if (at + n + 1 > ps->scap) {
        size_t cap = ps->scap ? ps->scap : 256;
        while (cap < at + n + 1)
            cap *= 2;
        char *s = realloc(ps->scratch, cap);
        if (!s)
            return fail(ps, ps->p, "no memory for a string of %zu bytes", at + n);
        ps->scratch = s;
        ps->scap = cap;
    }
    memcpy(ps->scratch + at, b, n);
    return true;
}

static int hexval(char c)
{
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

static bool hex4(parser *ps, const char *q, unsigned *out)
{
    if (ps->end - q < 4)
        return fail(ps, q, "a \\u escape cut short");
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        int h = hexval(q[i]);
        if (h < 0)
            return fail(ps, q + i, "a \\u escape needs 4 hex digits");
        v = v << 4 | (unsigned)h;
    }
    *out = v;
    return true;
}

/* Writes character 'u' as UTF-8 into 'b' (4 bytes); returns the length. A lone surrogate
 * is no character: it becomes the replacement character U+FFFD. */
static size_t utf8(unsigned u, char *b)
{
    if (u >= 0xD800 && u < 0xE000)
        u = 0xFFFD;
    if (u < 0x80) {
        b[0] = (char)u;
        return 1;
    }
    if (u < 0x800) {
        b[0] = (char)(0xC0 | u >> 6);
        b[1] = (char)(0x80 | (u & 0x3F));
        return 2;
    }
    if (u < 0x10000) {
        b[0] = (char)(0xE0 | u >> 12);
        b[1] = (char)(0x80 | (u >> 6 & 0x3F));
        b[2] = (char)(0x80 | (u & 0x3F));
        return 3;
    }
    b[0] = (char)(0xF0 | u >> 18);
    b[1] = (char)(0x80 | (u >> 12 & 0x3F));
    b[2] = (char)(0x80 | (u >> 6 & 0x3F));
    b[3] = (char)(0x80 | (u & 0x3F));
    return 4;
}

/* A string at 'p' (its opening quote): '*out' points into the text when it has no escapes,
 * else into the scratch buffer (valid until the next string); not NUL-terminated. */
static bool string(parser *ps, const char **out, size_t *len)
{
    ws(ps);
    if (ps->p >= ps->end || *ps->p != '"')
        return expected(ps, "a string");
    const char *start = ++ps->p, *p = start, *end = ps->end;
    while (p < end && *p != '"' && *p != '\\' && (unsigned char)*p >= 0x20)
        p++;
    if (p < end && *p == '"') { /* the usual case: no escapes */
        *out = start;
        *len = (size_t)(p - start);
        ps->p = p + 1;
        return true;
    }
    size_t n = 0;
    if (!put_scratch(ps, 0, start, (size_t)(p - start)))
        return false;
    n = (size_t)(p - start);
    for (;;) {
        if (p >= end)
            return fail(ps, p, "a string is not closed: the file ends inside it");
        unsigned char c = (unsigned char)*p;
        if (c == '"')
            break;
        if (c < 0x20)
            return fail(ps, p, "a control character (0x%02x) inside a string", c);
        if (c != '\\') {
            const char *run = p;
            while (p < end && *p != '"' && *p != '\\' && (unsigned char)*p >= 0x20)
                p++;
            if (!put_scratch(ps, n, run, (size_t)(p - run)))
                return false;
            n += (size_t)(p - run);
            continue;
        }
        if (p + 1 >= end)
            return fail(ps, p, "a string is not closed: the file ends inside it");
        /* the one-letter escapes, and what each stands for */
        static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
        char e = p[1], b[4];
        const char *hit = e ? strchr(from, e) : NULL;
        size_t bn = 1;
        if (hit) {
            b[0] = to[hit - from];
        } else if (e == 'u') {
            unsigned u;
            if (!hex4(ps, p + 2, &u))
                return false;
            p += 4;
            if (u >= 0xD800 && u < 0xDC00 && end - p >= 8 && p[2] == '\\' && p[3] == 'u') {
                unsigned lo;
                if (!hex4(ps, p + 4, &lo))
                    return false;
                if (lo >= 0xDC00 && lo < 0xE000) {
                    u = 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00);
                    p += 6;
                }
            }
            bn = utf8(u, b);
        } else {
            return fail(ps, p, "an unknown escape '\\%c' in a string", e);
        }
        if (!put_scratch(ps, n, b, bn))
            return false;
        n += bn;
        p += 2;
    }
    *out = ps->scratch;
    *len = n;
    ps->p = p + 1;
    return true;
}

static const double pow10_tab[] = { 1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,
                                    1e8,  1e9,  1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
                                    1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22 };

/* A number (RFC 8259 grammar). Plain decimals of at most 15 digits (what weft writes) are
 * exact in a double, so one division by an exact power of ten rounds them correctly; the
 * rest go through strtod. */
static bool number(parser *ps, double *out)
{
    ws(ps);
    const char *p = ps->p, *end = ps->end, *start = p;
    bool neg = p < end && *p == '-';
    if (neg)
        p++;
    if (p >= end || *p < '0' || *p > '9')
        return expected(ps, "a number");
    uint64_t m = 0;
    int digits = 0, frac = 0;
    if (*p == '0') {
        p++;
    } else {
        while (p < end && *p >= '0' && *p <= '9') {
            m = m * 10 + (uint64_t)(*p++ - '0');
            digits++;
        }
    }
    if (p < end && *p == '.') {
        p++;
        if (p >= end || *p < '0' || *p > '9')
            return fail(ps, p, "a number needs digits after its '.'");
        while (p < end && *p >= '0' && *p <= '9') {
            m = m * 10 + (uint64_t)(*p++ - '0');
            digits++;
            frac++;
        }
    }
    bool expo = p < end && (*p == 'e' || *p == 'E');
    if (expo) {
        p++;
        if (p < end && (*p == '+' || *p == '-'))
            p++;
        if (p >= end || *p < '0' || *p > '9')
            return fail(ps, p, "a number needs digits in its exponent");
        while (p < end && *p >= '0' && *p <= '9')
            p++;
    }
    if (!expo && digits <= 15) {
        double v = (double)m / pow10_tab[frac];
        *out = neg ? -v : v;
    } else {
        char buf[64];
        size_t n = (size_t)(p - start);
        if (n >= sizeof buf)
            return fail(ps, start, "a number of %zu characters", n);
        memcpy(buf, start, n);
        buf[n] = '\0';
        *out = strtod(buf, NULL);
        if (!isfinite(*out))
            return fail(ps, start, "the number %s is out of range", buf);
    }
    ps->p = p;
    return true;
}

static bool literal(parser *ps, const char *word)
{
    size_t n = strlen(word);
    if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, word, n) != 0)
        return expected(ps, "a value");
    ps->p += n;
    return true;
}

static bool skip_value(parser *ps, int depth);

/* Reads one member's value; 'k' (not NUL-terminated) is its key. */
typedef bool (*member_fn)(parser *ps, const char *k, size_t kl, void *ctx);

/* An object: '{', then each member's key, ':' and the value (read by 'fn'), up to '}'.
 * 'what' names it in messages. Every object of the file is read by this loop. */
static bool object(parser *ps, const char *what, member_fn fn, void *ctx)
{
    if (!eat(ps, '{')) {
        char b[64];
        snprintf(b, sizeof b, "'{' to open %s", what);
        return expected(ps, b);
    }
    if (eat(ps, '}'))
        return true;
    for (;;) {
        const char *k;
        size_t kl;
        if (!string(ps, &k, &kl))
            return false;
        if (!eat(ps, ':'))
            return expected(ps, "':' after a key");
        if (!fn(ps, k, kl, ctx))
            return false;
        if (eat(ps, '}'))
            return true;
        if (!eat(ps, ',')) {
            char b[64];
            snprintf(b, sizeof b, "',' or '}' in %s", what);
            return expected(ps, b);
        }
    }
}

static bool skip_member(parser *ps, const char *k, size_t kl, void *depth)
{
    (void)k;
    (void)kl;
    return skip_value(ps, *(int *)depth);
}

/* An object or array nested 'depth' deep, its values checked and dropped. */
static bool skip_container(parser *ps, int depth)
{
    if (depth > MAX_DEPTH)
        return fail(ps, ps->p, "values nested more than %d deep", MAX_DEPTH);
    int inner = depth + 1;
    if (*ps->p == '{')
        return object(ps, "an object", skip_member, &inner);
    ps->p++; /* '[' */
    if (eat(ps, ']'))
        return true;
    for (;;) {
        if (!skip_value(ps, inner))
            return false;
        if (eat(ps, ']'))
            return true;
        if (!eat(ps, ','))
            return expected(ps, "',' or ']' in an array");
    }
}

static bool skip_value(parser *ps, int depth)
{
    ws(ps);
    if (ps->p >= ps->end)
        return expected(ps, "a value");
    const char *k;
    size_t kl;
    double d;
    switch (*ps->p) {
    case '{':
    case '[':
        return skip_container(ps, depth);
    case '"':
        return string(ps, &k, &kl);
    case 't':
        return literal(ps, "true");
    case 'f':
        return literal(ps, "false");
    case 'n':
        return literal(ps, "null");
    default:
        return number(ps, &d);
    }
}

static bool key_is(const char *k, size_t kl, const char *want)
{
    return strlen(want) == kl && memcmp(k, want, kl) == 0;
}

/* An integer field: a number with no fraction, within [lo, hi]. */
static bool integer(parser *ps, const char *field, double lo, double hi, double *out)
{
    const char *at = (ws(ps), ps->p);
    if (!number(ps, out))
        return false;
    if (*out != floor(*out) || *out < lo || *out > hi)
        return fail(ps, at, "\"%s\" is %g: expected an integer in [%.0f, %.0f]", field, *out, lo,
                    hi);
    return true;
}

static bool intern_to(parser *ps, const char *s, size_t n, int *id)
{
    *id = tr_intern(ps->t, s, n);
    return *id >= 0 || fail(ps, ps->p, "no memory for the string table");
}

typedef struct raw_event {
    int name, cat, ph, kind, thread_name; /* string ids or -1 */
    bool has_ts, has_dur, has_tid, chunk;
    double ts, dur, tid, graph, run, node, after, crit, bytes;
} raw_event;

static bool arg_member(parser *ps, const char *k, size_t kl, void *ctx)
{
    raw_event *e = ctx;
    const char *v;
    size_t vl;
    double d;
    if (key_is(k, kl, "kind"))
        return string(ps, &v, &vl) && intern_to(ps, v, vl, &e->kind);
    if (key_is(k, kl, "name"))
        return string(ps, &v, &vl) && intern_to(ps, v, vl, &e->thread_name);
    if (key_is(k, kl, "graph"))
        return integer(ps, "graph", 0, 4294967295.0, &e->graph);
    if (key_is(k, kl, "run"))
        return integer(ps, "run", 0, 4294967295.0, &e->run);
    if (key_is(k, kl, "node"))
        return integer(ps, "node", 0, 2147483647.0, &e->node);
    if (key_is(k, kl, "after"))
        return integer(ps, "after", -1, 2147483647.0, &e->after);
    if (key_is(k, kl, "crit"))
        return integer(ps, "crit", -1, 2147483647.0, &e->crit);
    if (key_is(k, kl, "bytes"))
        return integer(ps, "bytes", 0, 9007199254740992.0, &e->bytes);
    if (key_is(k, kl, "chunk"))
        return number(ps, &d) && ((e->chunk = d != 0), true);
    int depth = 2;
    return skip_member(ps, k, kl, &depth);
}

static bool event_member(parser *ps, const char *k, size_t kl, void *ctx)
{
    raw_event *e = ctx;
    const char *v;
    size_t vl;
    if (key_is(k, kl, "name"))
        return string(ps, &v, &vl) && intern_to(ps, v, vl, &e->name);
    if (key_is(k, kl, "cat"))
        return string(ps, &v, &vl) && intern_to(ps, v, vl, &e->cat);
    if (key_is(k, kl, "ph"))
        return string(ps, &v, &vl) && intern_to(ps, v, vl, &e->ph);
    if (key_is(k, kl, "ts"))
        return (e->has_ts = true) && number(ps, &e->ts);
    if (key_is(k, kl, "dur"))
        return (e->has_dur = true) && number(ps, &e->dur);
    if (key_is(k, kl, "tid"))
        return (e->has_tid = true) && integer(ps, "tid", -2147483648.0, 2147483647.0, &e->tid);
    if (key_is(k, kl, "args"))
        return object(ps, "\"args\"", arg_member, e);
    int depth = 1;
    return skip_member(ps, k, kl, &depth);
}

static bool add_thread(tr_trace *t, int tid, int name)
{
    for (int i = 0; i < t->nthreads; i++)
        if (t->threads[i].tid == tid) {
            if (name >= 0)
                t->threads[i].name = name;
            return true;
        }
    if (t->nthreads == t->capthreads) {
        int cap = t->capthreads ? 2 * t->capthreads : 16;
        tr_thread *n = realloc(t->threads, (size_t)cap * sizeof *n);
        if (!n)
            return false;
        t->threads = n;
        t->capthreads = cap;
    }
    t->threads[t->nthreads++] = (tr_thread){ tid, name };
    return true;
}

static bool str_is(const tr_trace *t, int id, const char *s)
{
    return id >= 0 && strcmp(t->str[id], s) == 0;
}

static bool event(parser *ps, size_t index)
{
    const char *start = (ws(ps), ps->p);
    raw_event e = { .name = -1,
                    .cat = -1,
                    .ph = -1,
                    .kind = -1,
                    .thread_name = -1,
                    .graph = -1,
                    .after = -1,
                    .crit = -2 };
    if (!object(ps, "an event", event_member, &e))
        return false;
    bool has_graph = e.graph >= 0;
    tr_trace *t = ps->t;
    if (str_is(t, e.ph, "M")) { /* metadata: thread names are the lanes' names */
        if (str_is(t, e.name, "thread_name") && e.has_tid &&
            !add_thread(t, (int)e.tid, e.thread_name))
            return fail(ps, start, "no memory for the thread table");
        return true;
    }
    bool span = str_is(t, e.ph, "X"), instant = str_is(t, e.ph, "i") || str_is(t, e.ph, "I");
    if (!span && !instant)
        return true; /* begin/end pairs, counters, flows: not written by weft; not summarised */
    if (!e.has_ts || (span && !e.has_dur))
        return fail(ps, start, "event %zu is a%s event without \"%s\"", index,
                    span ? " complete (\"ph\":\"X\")" : "n instant", !e.has_ts ? "ts" : "dur");
    if (span && e.dur < 0)
        return fail(ps, start, "event %zu lasts %g us: a negative \"dur\"", index, e.dur);
    if (t->n == t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 4096;
        tr_event *n = realloc(t->ev, cap * sizeof *n);
        if (!n)
            return fail(ps, start, "no memory for %zu events", cap);
        t->ev = n;
        t->cap = cap;
    }
    tr_event *o = &t->ev[t->n++];
    *o = (tr_event){ .ts = e.ts,
                     .dur = span ? e.dur : 0,
                     .tid = (int)e.tid,
                     .name = e.name >= 0 ? e.name : tr_intern(t, "?", 1),
                     .kind = e.kind,
                     .chunk = e.chunk,
                     .graph = has_graph ? (uint32_t)e.graph : 0,
                     .run = (uint32_t)e.run,
                     .node = (int32_t)e.node,
                     .after = (int32_t)e.after,
                     .crit = (int32_t)e.crit,
                     .bytes = e.bytes };
    if (o->name < 0)
        return fail(ps, start, "no memory for the string table");
    o->cat = str_is(t, e.cat, "task")       ? TR_TASK
             : str_is(t, e.cat, "actor")    ? TR_ACTOR
             : str_is(t, e.cat, "park")     ? TR_PARK
             : str_is(t, e.cat, "steal")    ? TR_STEAL
             : str_is(t, e.cat, "transfer") ? TR_XFER
                                            : (span ? TR_TASK : TR_OTHER);
    if (!add_thread(t, o->tid, -1))
        return fail(ps, start, "no memory for the thread table");
    return true;
}

static bool events(parser *ps)
{
    if (!eat(ps, '['))
        return expected(ps, "'[' to open the events");
    if (eat(ps, ']'))
        return true;
    for (size_t i = 0;; i++) {
        if (!event(ps, i))
            return false;
        if (eat(ps, ']'))
            return true;
        if (!eat(ps, ','))
            return expected(ps, "',' or ']' after an event");
    }
}

static bool events(parser *ps);

static bool doc_member(parser *ps, const char *k, size_t kl, void *seen)
{
    if (!key_is(k, kl, "traceEvents")) {
        int depth = 1;
        return skip_member(ps, k, kl, &depth);
    }
    *(bool *)seen = true;
    return events(ps);
}

static bool document(parser *ps)
{
    ws(ps);
    if (ps->p < ps->end && *ps->p == '[') {
        if (!events(ps))
            return false;
    } else {
        bool seen = false;
        if (!object(ps, "the trace object", doc_member, &seen))
            return false;
        if (!seen)
            return fail(ps, ps->s, "no \"traceEvents\" array: not a Chrome/Perfetto trace");
    }
    ws(ps);
    if (ps->p != ps->end)
        return fail(ps, ps->p, "text after the end of the trace");
    return true;
}

int tr_parse(const char *text, size_t len, const char *name, tr_trace *t, char *err, size_t errlen)
{
    memset(t, 0, sizeof *t);
    parser ps = {
        .s = text, .p = text, .end = text + len, .file = name, .err = err, .errlen = errlen, .t = t
    };
    bool ok = document(&ps);
    free(ps.scratch);
    if (!ok) {
        tr_free(t);
        return -1;
    }
    return 0;
}

int tr_read(const char *path, tr_trace *t, char *err, size_t errlen)
{
    memset(t, 0, sizeof *t);
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "%s: cannot open it: %s", path, strerror(errno));
        return -1;
    }
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) { /* not ftell: a pipe or /dev/stdin has no size */
        if (cap - n < 65536) {
            size_t nc = cap ? 2 * cap : 1 << 20;
            char *b = realloc(buf, nc + 1);
            if (!b) {
                free(buf);
                fclose(f);
                snprintf(err, errlen, "%s: no memory to read it (%zu bytes so far)", path, n);
                return -1;
            }
            buf = b;
            cap = nc;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0)
            break;
    }
    bool bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        snprintf(err, errlen, "%s: reading it failed", path);
        return -1;
    }
    buf[n] = '\0';
    int rc = tr_parse(buf, n, path, t, err, errlen);
    free(buf);
    return rc;
}

static uint64_t fnv(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

int tr_intern(tr_trace *t, const char *s, size_t len)
{
    if ((size_t)t->nstr * 2 >= t->hashcap) { /* keep the table at most half full */
        size_t cap = t->hashcap ? 2 * t->hashcap : 1024;
        int *h = malloc(cap * sizeof *h);
        if (!h)
            return -1;
        for (size_t i = 0; i < cap; i++)
            h[i] = -1;
        for (int i = 0; i < t->nstr; i++) {
            size_t k = fnv(t->str[i], strlen(t->str[i])) & (cap - 1);
            while (h[k] >= 0)
                k = (k + 1) & (cap - 1);
            h[k] = i;
        }
        free(t->hash);
        t->hash = h;
        t->hashcap = cap;
    }
    size_t k = fnv(s, len) & (t->hashcap - 1);
    for (; t->hash[k] >= 0; k = (k + 1) & (t->hashcap - 1)) {
        const char *o = t->str[t->hash[k]];
        if (strnlen(o, len + 1) == len && memcmp(o, s, len) == 0)
            return t->hash[k];
    }
    if (t->nstr == t->capstr) {
        int cap = t->capstr ? 2 * t->capstr : 256;
        char **n = realloc(t->str, (size_t)cap * sizeof *n);
        if (!n)
            return -1;
        t->str = n;
        t->capstr = cap;
    }
    char *c = malloc(len + 1);
    if (!c)
        return -1;
    memcpy(c, s, len);
    c[len] = '\0';
    t->str[t->nstr] = c;
    t->hash[k] = t->nstr;
    return t->nstr++;
}

void tr_free(tr_trace *t)
{
    for (int i = 0; i < t->nstr; i++)
        free(t->str[i]);
    free(t->str);
    free(t->hash);
    free(t->ev);
    free(t->threads);
    memset(t, 0, sizeof *t);
}
