/* tools/flight_verdict.c: reading the ranks' flight records and merging them into one verdict
 * line, for weft-run when a job fails.
 * Owns: a reader of flat JSON objects, one per line (the only shape the records use: string,
 * integer, true/false/null values; anything else makes a line be skipped), the merge, and the
 * per-job flight directory (fv_job_begin/end).
 * The merge: the lowest collective number that some rank with a record did not complete;
 * the ranks whose records never reach it "never entered" it, the ranks with it pending
 * "waited" (from its start to its end or to their dump), and ranks without a record are
 * named as such (a stopped or killed rank writes none). Times are differences on one
 * rank's clock only, so ranks on other hosts compare fine.
 * Input is whatever lies in the directory: every read is bounds-checked, and
 * fuzz/fuzz_flight.c feeds fv_parse() arbitrary bytes.
 * Not here: writing the records (transport/flight.c). */
#include "flight_verdict.h"

#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- Flat JSON objects ------------------------------------------------------------------- */

typedef struct jval {
    enum { J_STR, J_NUM, J_NULL, J_BOOL } type;

    char str[512]; /* strings, truncated; non-ASCII \u escapes become '?' */
    int64_t num;
    bool neg_or_big; /* the number did not fit int64 or was negative */
} jval;

static const char *skip_ws(const char *p, const char *end)
{
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\r'))
        p++;
    return p;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Reads a string starting after its opening quote into 'out' (cap bytes, NUL-terminated,
 * truncated). Returns the position after the closing quote, or NULL. */
static const char *read_str(const char *p, const char *end, char *out, size_t cap)
{
    size_t n = 0;
    while (p < end && *p != '"') {
        char ch = *p++;
        if ((unsigned char)ch < 0x20)
            return NULL;
        if (ch == '\\') {
            if (p >= end)
                return NULL;
            char e = *p++;
            switch (e) {
            case '"':
            case '\\':
            case '/':
                ch = e;
                break;
            case 'b':
                ch = '\b';
                break;
            case 'f':
                ch = '\f';
                break;
            case 'n':
                ch = '\n';
                break;
            case 'r':
                ch = '\r';
                break;
            case 't':
                ch = '\t';
                break;
            case 'u': {
                if (end - p < 4)
                    return NULL;
                int v = 0;
                for (int k = 0; k < 4; k++) {
                    int h = hexval(p[k]);
                    if (h < 0)
                        return NULL;
                    v = v * 16 + h;
                }
                p += 4;
                ch = v < 0x80 ? (char)v : '?';
                break;
            }
            default:
                return NULL;
            }
        }
        if (n + 1 < cap)
            out[n++] = ch;
    }
    if (p >= end)
        return NULL;
    out[n] = 0;
    return p + 1;
}

static const char *read_val(const char *p, const char *end, jval *v)
{
    v->neg_or_big = false;
    v->num = 0;
    v->str[0] = 0;
    if (p >= end)
        return NULL;
    if (*p == '"') {
        v->type = J_STR;
        return read_str(p + 1, end, v->str, sizeof v->str);
    }
    static const char *const words[] = { "null", "true", "false" };
    for (int w = 0; w < 3; w++) {
        size_t len = strlen(words[w]);
        if ((size_t)(end - p) >= len && !memcmp(p, words[w], len)) {
            v->type = w ? J_BOOL : J_NULL;
            v->num = w == 1;
            return p + len;
        }
    }
    bool neg = *p == '-';
    if (neg)
        p++;
    if (p >= end || *p < '0' || *p > '9')
        return NULL;
    uint64_t u = 0;
    bool big = false;
    while (p < end && *p >= '0' && *p <= '9') {
        unsigned d = (unsigned)(*p++ - '0');
        if (u > (UINT64_MAX - d) / 10)
            big = true;
        else
            u = u * 10 + d;
    }
    if (p < end && (*p == '.' || *p == 'e' || *p == 'E'))
        return NULL; /* the records hold integers only */
    v->type = J_NUM;
    v->neg_or_big = neg || big || u > INT64_MAX;
    v->num = v->neg_or_big ? (neg && !big && u <= INT64_MAX ? -(int64_t)u : 0) : (int64_t)u;
    return p;
}

/* Calls 'fn' for every key of the flat object on [p, end). Returns 0, or -1 when the line is
 * not one flat object. */
typedef void (*kv_fn)(void *ctx, const char *key, const jval *v);

static int parse_obj(const char *p, const char *end, kv_fn fn, void *ctx)
{
    p = skip_ws(p, end);
    if (p >= end || *p++ != '{')
        return -1;
    p = skip_ws(p, end);
    if (p < end && *p == '}')
        return skip_ws(p + 1, end) == end ? 0 : -1;
    for (;;) {
        char key[32];
        jval v;
        p = skip_ws(p, end);
        if (p >= end || *p != '"' || !(p = read_str(p + 1, end, key, sizeof key)))
            return -1;
        p = skip_ws(p, end);
        if (p >= end || *p++ != ':')
            return -1;
        p = skip_ws(p, end);
        if (!(p = read_val(p, end, &v)))
            return -1;
        fn(ctx, key, &v);
        p = skip_ws(p, end);
        if (p < end && *p == ',') {
            p++;
            continue;
        }
        if (p < end && *p == '}')
            return skip_ws(p + 1, end) == end ? 0 : -1;
        return -1;
    }
}

/* ---- Records ----------------------------------------------------------------------------- */

static uint64_t u64_of(const jval *v)
{
    return v->type == J_NUM && !v->neg_or_big ? (uint64_t)v->num : 0;
}

static void copy_str(char *dst, size_t cap, const jval *v)
{
    snprintf(dst, cap, "%s", v->type == J_STR ? v->str : "");
}

typedef struct hdr_ctx {
    fv_rank *r;
    bool flight;
} hdr_ctx;

static void on_header(void *ctx, const char *k, const jval *v)
{
    hdr_ctx *h = ctx;
    if (!strcmp(k, "flight"))
        h->flight = v->type == J_NUM && v->num == 1;
    else if (!strcmp(k, "rank") && v->type == J_NUM && !v->neg_or_big && v->num < FV_MAX_RANKS)
        h->r->rank = (int)v->num;
    else if (!strcmp(k, "size") && v->type == J_NUM && !v->neg_or_big && v->num <= FV_MAX_RANKS)
        h->r->size = (int)v->num;
    else if (!strcmp(k, "failed"))
        copy_str(h->r->failed, sizeof h->r->failed, v);
    else if (!strcmp(k, "reason"))
        copy_str(h->r->reason, sizeof h->r->reason, v);
    else if (!strcmp(k, "now_ns"))
        h->r->now = u64_of(v);
}

typedef struct op_ctx {
    fv_op op;
    bool has_seq, has_op;
} op_ctx;

static void on_op(void *ctx, const char *k, const jval *v)
{
    op_ctx *o = ctx;
    if (!strcmp(k, "seq")) {
        o->op.seq = u64_of(v);
        o->has_seq = v->type == J_NUM;
    } else if (!strcmp(k, "op")) {
        copy_str(o->op.op, sizeof o->op.op, v);
        o->has_op = v->type == J_STR;
    } else if (!strcmp(k, "bytes")) {
        o->op.bytes = u64_of(v);
    } else if (!strcmp(k, "count")) {
        o->op.count = u64_of(v);
    } else if (!strcmp(k, "dtype")) {
        copy_str(o->op.dtype, sizeof o->op.dtype, v);
    } else if (!strcmp(k, "peer")) {
        o->op.peer = v->type == J_NUM && v->num >= -1 && v->num < FV_MAX_RANKS ? (int)v->num : -1;
    } else if (!strcmp(k, "state")) {
        copy_str(o->op.state, sizeof o->op.state, v);
    } else if (!strcmp(k, "t_start_ns")) {
        o->op.t0 = u64_of(v);
    } else if (!strcmp(k, "t_end_ns")) {
        o->op.t1 = u64_of(v);
    } else if (!strcmp(k, "tag")) {
        copy_str(o->op.tag, sizeof o->op.tag, v);
    }
}

static bool is_p2p(const char *op)
{
    return !strcmp(op, "send") || !strcmp(op, "recv");
}

void fv_rank_free(fv_rank *r)
{
    free(r->ops);
    r->ops = NULL;
    r->n_ops = 0;
}

int fv_parse(const char *p, size_t len, fv_rank *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    out->rank = -1;
    const char *end = p + len, *line = p;
    size_t cap = 0;
    bool header = false;
    while (line < end) {
        const char *nl = memchr(line, '\n', (size_t)(end - line));
        const char *le = nl ? nl : end;
        if (!header) {
            hdr_ctx h = { out, false };
            if (parse_obj(line, le, on_header, &h) < 0 || !h.flight || out->rank < 0) {
                snprintf(err, errlen, "the first line is not a flight-record header");
                fv_rank_free(out);
                return -1;
            }
            header = true;
        } else {
            op_ctx o = { .op = { .peer = -1 } };
            if (parse_obj(line, le, on_op, &o) == 0 && o.has_seq && o.has_op && !is_p2p(o.op.op)) {
                if (out->n_ops == cap) {
                    size_t nc = cap ? cap * 2 : 64;
                    fv_op *q =
                        nc <= (SIZE_MAX / sizeof *q) ? realloc(out->ops, nc * sizeof *q) : NULL;
                    if (!q) {
                        snprintf(err, errlen, "out of memory");
                        fv_rank_free(out);
                        return -1;
                    }
                    out->ops = q;
                    cap = nc;
                }
                out->ops[out->n_ops++] = o.op;
            }
        }
        line = nl ? nl + 1 : end;
    }
    if (!header) {
        snprintf(err, errlen, "empty record");
        return -1;
    }
    out->present = true;
    return 0;
}

/* ---- The merge --------------------------------------------------------------------------- */

static bool is_done(const fv_op *o)
{
    return !strcmp(o->state, "done");
}

/* The first collective rank 'r' did not complete: its number (one past its last when all
 * are done) and the entry, or NULL. */
static uint64_t first_open(const fv_rank *r, const fv_op **at)
{
    *at = NULL;
    uint64_t last = 0;
    for (size_t i = 0; i < r->n_ops; i++) {
        if (!is_done(&r->ops[i])) {
            *at = &r->ops[i];
            return r->ops[i].seq;
        }
        last = r->ops[i].seq > last ? r->ops[i].seq : last;
    }
    return last + 1;
}

static const fv_op *find_seq(const fv_rank *r, uint64_t seq)
{
    for (size_t i = 0; i < r->n_ops; i++)
        if (r->ops[i].seq == seq)
            return &r->ops[i];
    return NULL;
}

typedef struct obuf {
    char *p;
    size_t cap, len;
} obuf;

static void out_put(obuf *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void out_put(obuf *o, const char *fmt, ...)
{
    if (o->len + 1 >= o->cap)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(o->p + o->len, o->cap - o->len, fmt, ap);
    va_end(ap);
    if (n > 0)
        o->len = o->len + (size_t)n < o->cap ? o->len + (size_t)n : o->cap - 1;
}

/* "rank 1" or "ranks 0,2" for the ranks with 'set[r]'. */
static void put_ranks(obuf *o, const bool *set, int n)
{
    int count = 0;
    for (int r = 0; r < n; r++)
        count += set[r];
    out_put(o, "%s ", count == 1 ? "rank" : "ranks");
    bool first = true;
    for (int r = 0; r < n; r++)
        if (set[r]) {
            out_put(o, "%s%d", first ? "" : ",", r);
            first = false;
        }
}

static void put_op(obuf *o, const fv_op *op)
{
    out_put(o, "%s #%llu", op->op, (unsigned long long)op->seq);
    if (op->tag[0])
        out_put(o, " (%s)", op->tag);
}

size_t fv_verdict(const fv_rank *rs, int n, char *out, size_t outlen)
{
    obuf o = { out, outlen, 0 };
    if (!outlen)
        return 0;
    out[0] = 0;
    bool *never = calloc((size_t)(n > 0 ? n : 1), 3 * sizeof *never);
    if (!never) {
        out_put(&o, "out of memory");
        return o.len;
    }
    bool *waited = never + n, *missing = waited + n;
    int n_present = 0, n_missing = 0;
    uint64_t s = UINT64_MAX;
    const fv_op *named = NULL;
    for (int r = 0; r < n; r++) {
        if (!rs[r].present) {
            missing[r] = true;
            n_missing++;
            continue;
        }
        n_present++;
        const fv_op *at;
        uint64_t f = first_open(&rs[r], &at);
        if (f < s)
            s = f;
    }
    if (!n_present) {
        out_put(&o, "no rank wrote a flight record (stopped or killed before the failure?)");
        free(never);
        return o.len;
    }
    /* Is 's' open anywhere? All ranks done up to their last and equal: nothing pending. */
    double wait_s = 0;
    int n_never = 0, n_waited = 0;
    for (int r = 0; r < n; r++) {
        if (!rs[r].present)
            continue;
        const fv_op *e = find_seq(&rs[r], s);
        uint64_t lo = rs[r].n_ops ? rs[r].ops[0].seq : 1;
        if (!e) {
            if (s >= lo || !rs[r].n_ops) { /* before its oldest entry: done and forgotten */
                never[r] = true;
                n_never++;
            }
            continue;
        }
        if (!named || (named->tag[0] == 0 && e->tag[0]))
            named = e;
        if (!is_done(e)) {
            waited[r] = true;
            n_waited++;
            uint64_t until = e->t1 ? e->t1 : rs[r].now;
            double w = until > e->t0 ? (double)(until - e->t0) / 1e9 : 0;
            wait_s = w > wait_s ? w : wait_s;
        }
    }
    if (!named || (!n_waited && !n_never)) {
        out_put(&o, "no collective was pending");
    } else {
        if (n_never) {
            put_ranks(&o, never, n);
            out_put(&o, " never entered ");
            put_op(&o, named);
        } else if (n_missing) { /* stopped or killed: it never finished, whatever it did */
            put_ranks(&o, missing, n);
            out_put(&o, " left no flight record (stopped or killed?) and never finished ");
            put_op(&o, named);
            n_missing = 0;
        } else {
            out_put(&o, "every rank with a record entered ");
            put_op(&o, named);
        }
        if (n_waited) {
            out_put(&o, "; ");
            put_ranks(&o, waited, n);
            out_put(&o, " waited %.1f s", wait_s);
        }
    }
    if (n_missing) {
        out_put(&o, "; ");
        put_ranks(&o, missing, n);
        out_put(&o, " left no flight record (stopped or killed?)");
    }
    /* The first failure: the reason of the record dumped first (a rank dumps as its comm
     * fails; the others fail later, often only hearing of it). Clocks of other hosts differ,
     * so across hosts this picks a reason, not necessarily the first. */
    int first = -1;
    for (int r = 0; r < n; r++)
        if (rs[r].present && rs[r].failed[0] && rs[r].reason[0] &&
            (first < 0 || rs[r].now < rs[first].now))
            first = r;
    if (first >= 0) {
        char reason[sizeof rs[first].reason];
        snprintf(reason, sizeof reason, "%s", rs[first].reason);
        for (char *q = reason; *q; q++)
            if (*q == '\n' || *q == '\r')
                *q = ' ';
        out_put(&o, "; rank %d: %s: %s", first, rs[first].failed, reason);
    }
    free(never);
    return o.len;
}

/* ---- weft-run's job directory ------------------------------------------------------------ */

void fv_job_begin(fv_job *j)
{
    memset(j, 0, sizeof *j);
    const char *set = getenv("WEFT_FLIGHT_DIR");
    if (set && *set) {
        snprintf(j->dir, sizeof j->dir, "%s", set);
        return;
    }
    const char *tmp = getenv("TMPDIR");
    snprintf(j->dir, sizeof j->dir, "%s/weft-flight.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(j->dir)) {
        fprintf(stderr, "weft-run: no flight directory (%s): %s\n", j->dir, strerror(errno));
        j->dir[0] = 0;
        return;
    }
    j->made = true;
    setenv("WEFT_FLIGHT_DIR", j->dir, 1);
}

bool fv_job_has_record(const fv_job *j, int rank, const struct timespec *since)
{
    char path[512];
    struct stat st;
    if (!j->dir[0])
        return false;
    snprintf(path, sizeof path, "%s/flight.rank%d.jsonl", j->dir, rank);
    if (stat(path, &st) != 0)
        return false;
    /* Whole seconds (a file system may keep no finer times): a record of an earlier job in
     * a directory the caller named counts only when written in this start's first second. */
    return st.st_mtim.tv_sec >= since->tv_sec;
}

/* Reads at most 64 MiB of 'path' into a malloc'd buffer. */
static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 1 << 16, n = 0;
    char *p = malloc(cap);
    while (p) {
        size_t got = fread(p + n, 1, cap - n, f);
        n += got;
        if (got == 0 || n >= (64u << 20))
            break;
        if (n == cap) {
            char *q = realloc(p, cap * 2);
            if (!q) {
                free(p);
                p = NULL;
                break;
            }
            p = q;
            cap *= 2;
        }
    }
    fclose(f);
    *len = n;
    return p;
}

/* The verdict's first clause into 'blame' when it names ranks that never entered or never
 * finished an operation; else "". */
static void blame_of(const char *verdict, char *blame, size_t cap)
{
    size_t len = strcspn(verdict, ";");
    bool names = !strncmp(verdict, "rank ", 5) || !strncmp(verdict, "ranks ", 6);
    const char *never = strstr(verdict, " never ");
    if (names && never && (size_t)(never - verdict) < len)
        snprintf(blame, cap, "%.*s", (int)len, verdict);
}

void fv_job_report(fv_job *j, int n_ranks, char *blame, size_t cap)
{
    if (cap)
        blame[0] = 0;
    if (!j->dir[0] || n_ranks <= 0 || n_ranks > FV_MAX_RANKS)
        return;
    fv_rank *rs = calloc((size_t)n_ranks, sizeof *rs);
    for (int r = 0; rs && r < n_ranks; r++) {
        char path[512], err[128];
        snprintf(path, sizeof path, "%s/flight.rank%d.jsonl", j->dir, r);
        size_t len = 0;
        char *p = slurp(path, &len);
        if (p && fv_parse(p, len, &rs[r], err, sizeof err) == 0 && rs[r].rank != r)
            fv_rank_free(&rs[r]), rs[r].present = false; /* not this rank's */
        free(p);
        unlink(path); /* a restart's ranks write their own */
    }
    char line[2048];
    if (rs && fv_verdict(rs, n_ranks, line, sizeof line)) {
        fprintf(stderr, "weft-run: verdict: %s\n", line);
        if (cap)
            blame_of(line, blame, cap);
    }
    for (int r = 0; rs && r < n_ranks; r++)
        fv_rank_free(&rs[r]);
    free(rs);
}

void fv_job_end(fv_job *j, int n_ranks, bool failed)
{
    if (!j->dir[0])
        return;
    if (failed)
        fv_job_report(j, n_ranks, NULL, 0);
    if (j->made) {
        DIR *d = opendir(j->dir);
        struct dirent *e;
        while (d && (e = readdir(d)))
            if (strncmp(e->d_name, "flight.rank", 11) == 0) {
                char path[512];
                snprintf(path, sizeof path, "%s/%s", j->dir, e->d_name);
                unlink(path);
            }
        if (d)
            closedir(d);
        rmdir(j->dir);
    }
}
