/* examples/weft-train/data.c: weft-train's loaders (CSV, MNIST IDX, NumPy .npy), split,
 * normalisation and batching (the API and its contracts are in data.h).
 * Owns: reading files through zlib (gzopen reads plain files as they are, so every format
 * may also be gzip-compressed), and all validation of what they hold.
 * Invariant: a loader either returns 0 with a complete dataset, or a negative wf_status with
 * '*out' zeroed, nothing leaked and a message in 'err' naming the file and where (line and
 * column for CSV, byte offset for the binary formats).
 * Not here: the model and the training loop (weft-train.c). */
#include "data.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

/* A CSV line longer than this is refused rather than grown into (a binary file given as a
 * CSV would otherwise be read whole as one line). */
#define MAX_LINE_BYTES (64u << 20)

/* Binary files are read in chunks of this size; the buffer doubles as it fills. */
#define READ_CHUNK (1u << 20)

static int fail(char *err, size_t errlen, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int fail(char *err, size_t errlen, int code, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return code;
}

/* Copies the start of 'text' into 'buf' for a message, marking a cut with "..." and showing
 * bytes that are not printable ASCII as '?' (a binary file given as text, say). */
static const char *excerpt(const char *text, size_t len, char *buf, size_t size)
{
    size_t max = size > 4 ? size - 4 : 0, n = len <= max ? len : max;
    for (size_t i = 0; i < n; i++)
        buf[i] = text[i] >= 0x20 && text[i] < 0x7f ? text[i] : '?';
    if (len <= max)
        buf[n] = '\0';
    else
        memcpy(buf + n, "...", 4);
    return buf;
}

static bool alloc_dataset(wt_dataset *ds, int64_t n, int64_t n_features)
{
    /* One byte at least, so that an empty test set is still a valid allocation. */
    ds->x = malloc((size_t)(n * n_features > 0 ? n * n_features : 1) * sizeof(float));
    ds->y = malloc((size_t)(n > 0 ? n : 1) * sizeof(int32_t));
    if (!ds->x || !ds->y) {
        wt_dataset_free(ds);
        return false;
    }
    ds->n = n;
    ds->n_features = n_features;
    return true;
}

void wt_dataset_free(wt_dataset *ds)
{
    if (!ds)
        return;
    free(ds->x);
    free(ds->y);
    memset(ds, 0, sizeof *ds);
}

/* Sets 'n_classes' from the labels (all checked non-negative by the loaders). */
static void count_classes(wt_dataset *ds)
{
    int32_t max = -1;
    for (int64_t i = 0; i < ds->n; i++)
        if (ds->y[i] > max)
            max = ds->y[i];
    ds->n_classes = (int)max + 1;
}

/* The reason of a zlib stream error, for messages: a truncated stream is the usual one. */
static const char *gz_reason(gzFile f, int *code)
{
    const char *msg = gzerror(f, code);
    if (*code == Z_BUF_ERROR)
        return "the gzip stream is truncated (unexpected end of file)";
    if (*code == Z_ERRNO)
        return strerror(errno);
    return msg;
}

/* ---- reading whole files (IDX, npy) ------------------------------------------------------- */

/* Reads all of 'path' (decompressed if it is gzip) into '*buf' (owned, free()) of '*len'
 * bytes. A truncated or corrupt gzip stream is an error, not a short file. */
static int read_all(const char *path, unsigned char **buf, size_t *len, char *err, size_t errlen)
{
    *buf = NULL;
    *len = 0;
    errno = 0; /* gzopen() fails with errno set, or with 0 when out of memory */
    gzFile f = gzopen(path, "rb");
    if (!f)
        return fail(err, errlen, WF_EIO, "%s: cannot open: %s", path,
                    errno ? strerror(errno) : "out of memory");
    size_t cap = 0, n = 0;
    unsigned char *data = NULL;
    for (;;) {
        if (cap - n < READ_CHUNK) {
            size_t ncap = cap ? cap * 2 : 4 * READ_CHUNK;
            unsigned char *p = realloc(data, ncap);
            if (!p) {
                free(data);
                gzclose(f);
                return fail(err, errlen, WF_ENOMEM, "%s: out of memory after %zu bytes", path, n);
            }
            data = p;
            cap = ncap;
        }
        int got = gzread(f, data + n, READ_CHUNK);
        int zerr;
        const char *msg = gz_reason(f, &zerr);
        if (got < 0 || (zerr != Z_OK && zerr != Z_STREAM_END)) {
            int rc = fail(err, errlen, WF_EIO, "%s: read failed after %zu bytes: %s", path,
                          n + (got > 0 ? (size_t)got : 0), msg);
            free(data);
            gzclose(f);
            return rc;
        }
        n += (size_t)got;
        if (got == 0)
            break;
    }
    int zrc = gzclose(f);
    if (zrc != Z_OK) {
        free(data);
        return fail(err, errlen, WF_EIO, "%s: %s after %zu bytes", path,
                    zrc == Z_BUF_ERROR ? "the gzip stream is truncated" : "closing failed", n);
    }
    *buf = data;
    *len = n;
    return 0;
}

static uint32_t be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static uint32_t le32(const unsigned char *p)
{
    return (uint32_t)p[3] << 24 | (uint32_t)p[2] << 16 | (uint32_t)p[1] << 8 | p[0];
}

static uint64_t le64(const unsigned char *p)
{
    return (uint64_t)le32(p + 4) << 32 | le32(p);
}

/* ---- CSV ---------------------------------------------------------------------------------- */

/* Reads one line (without its '\n' and '\r') into '*buf'. Returns 1, 0 at the end of the
 * file, or a negative status with 'err' set. */
static int csv_line(gzFile f, const char *path, long long lineno, char **buf, size_t *cap,
                    size_t *len, char *err, size_t errlen)
{
    size_t n = 0;
    for (;;) {
        if (*cap - n < 2) {
            if (*cap >= MAX_LINE_BYTES)
                return fail(err, errlen, WF_EFORMAT,
                            "%s: line %lld: longer than %u MiB: not a CSV file?", path, lineno,
                            MAX_LINE_BYTES >> 20);
            size_t ncap = *cap ? *cap * 2 : 4096;
            char *p = realloc(*buf, ncap);
            if (!p)
                return fail(err, errlen, WF_ENOMEM, "%s: line %lld: out of memory", path, lineno);
            *buf = p;
            *cap = ncap;
        }
        char *got = gzgets(f, *buf + n, (int)(*cap - n));
        /* Checked after every read: gzgets() hands out the part of a line that a truncated
         * stream ends in, and only the error state tells it from a last line. */
        int zerr;
        const char *msg = gz_reason(f, &zerr);
        if (zerr != Z_OK && zerr != Z_STREAM_END)
            return fail(err, errlen, WF_EIO, "%s: line %lld: read failed: %s", path, lineno, msg);
        if (!got) {
            if (n == 0)
                return 0;
            break; /* the last line, without a '\n' */
        }
        n += strlen(*buf + n);
        if (n > 0 && (*buf)[n - 1] == '\n')
            break;
        if (n < *cap - 1)
            break; /* a NUL byte inside, or the end of the file */
    }
    while (n > 0 && ((*buf)[n - 1] == '\n' || (*buf)[n - 1] == '\r'))
        n--;
    (*buf)[n] = '\0';
    *len = n;
    return 1;
}

static bool is_blank(char c)
{
    return c == ' ' || c == '\t';
}

/* Parses the field [s, e) as a whole number (blanks around it allowed); false if it is not. */
static bool parse_number(const char *s, const char *e, double *v)
{
    while (s < e && is_blank(*s))
        s++;
    while (e > s && is_blank(e[-1]))
        e--;
    if (s == e)
        return false;
    char tmp[64];
    const char *str = s;
    char *heap = NULL;
    size_t len = (size_t)(e - s);
    /* strtod needs a terminated string: copy the field (the line itself goes on). */
    if (len < sizeof tmp) {
        memcpy(tmp, s, len);
        tmp[len] = '\0';
        str = tmp;
    } else {
        heap = malloc(len + 1);
        if (!heap)
            return false;
        memcpy(heap, s, len);
        heap[len] = '\0';
        str = heap;
    }
    char *end;
    errno = 0;
    *v = strtod(str, &end);
    bool ok = end == str + len;
    free(heap);
    return ok;
}

/* Counts the comma-separated fields of 'line'. */
static int64_t csv_columns(const char *line)
{
    int64_t n = 1;
    for (const char *p = line; *p; p++)
        n += *p == ',';
    return n;
}

static bool csv_is_header(const char *line)
{
    const char *s = line;
    for (;;) {
        const char *e = strchr(s, ',');
        if (!e)
            e = s + strlen(s);
        double v;
        if (parse_number(s, e, &v))
            return false;
        if (!*e)
            return true;
        s = e + 1;
    }
}

static bool line_is_blank(const char *line)
{
    for (; *line; line++)
        if (!is_blank(*line))
            return false;
    return true;
}

typedef struct csv_state {
    const char *path;
    int64_t cols;         /* columns of every data line; 0 before the first */
    long long first_line; /* the line that set 'cols' */
    int64_t n, cap;       /* rows stored, rows allocated */
    float *x;
    int32_t *y;
} csv_state;

/* Parses one data line into row 'st->n'. */
static int csv_row(csv_state *st, const char *line, long long lineno, char *err, size_t errlen)
{
    int64_t cols = csv_columns(line);
    if (st->cols == 0) {
        if (cols < 2)
            return fail(err, errlen, WF_EFORMAT,
                        "%s: line %lld: 1 column: need the features, then the label", st->path,
                        lineno);
        st->cols = cols;
        st->first_line = lineno;
    } else if (cols != st->cols) {
        return fail(err, errlen, WF_EFORMAT,
                    "%s: line %lld: %lld columns, but line %lld has %lld (features, then the "
                    "label)",
                    st->path, lineno, (long long)cols, st->first_line, (long long)st->cols);
    }
    if (st->n == st->cap) {
        int64_t ncap = st->cap ? st->cap * 2 : 1024;
        float *x = realloc(st->x, (size_t)(ncap * (st->cols - 1)) * sizeof(float));
        if (x)
            st->x = x;
        int32_t *y = x ? realloc(st->y, (size_t)ncap * sizeof(int32_t)) : NULL;
        if (!x || !y)
            return fail(err, errlen, WF_ENOMEM, "%s: line %lld: out of memory for %lld rows",
                        st->path, lineno, (long long)ncap);
        st->y = y;
        st->cap = ncap;
    }
    float *row = st->x + st->n * (st->cols - 1);
    const char *s = line;
    for (int64_t c = 0; c < st->cols; c++) {
        const char *e = strchr(s, ',');
        if (!e)
            e = s + strlen(s);
        double v;
        char q[32];
        bool label = c == st->cols - 1;
        if (!parse_number(s, e, &v)) {
            bool empty = true;
            for (const char *p = s; p < e; p++)
                empty = empty && is_blank(*p);
            if (empty)
                return fail(err, errlen, WF_EFORMAT, "%s: line %lld, column %lld: empty field",
                            st->path, lineno, (long long)c + 1);
            return fail(err, errlen, WF_EFORMAT,
                        "%s: line %lld, column %lld: '%s' is not a number%s", st->path, lineno,
                        (long long)c + 1, excerpt(s, (size_t)(e - s), q, sizeof q),
                        label ? " (the last column is the label)" : "");
        }
        if (!isfinite(v))
            return fail(err, errlen, WF_EFORMAT,
                        "%s: line %lld, column %lld: '%s' is not a finite number", st->path, lineno,
                        (long long)c + 1, excerpt(s, (size_t)(e - s), q, sizeof q));
        if (label) {
            if (v < 0 || v != floor(v) || v >= WT_MAX_CLASSES)
                return fail(err, errlen, WF_EFORMAT,
                            "%s: line %lld, column %lld: label '%s' is not an integer in "
                            "[0, %d)",
                            st->path, lineno, (long long)c + 1,
                            excerpt(s, (size_t)(e - s), q, sizeof q), WT_MAX_CLASSES);
            st->y[st->n] = (int32_t)v;
        } else {
            if (fabs(v) > FLT_MAX)
                return fail(err, errlen, WF_EFORMAT,
                            "%s: line %lld, column %lld: '%s' is outside the float32 range",
                            st->path, lineno, (long long)c + 1,
                            excerpt(s, (size_t)(e - s), q, sizeof q));
            row[c] = (float)v;
        }
        s = e + 1;
    }
    st->n++;
    return 0;
}

int wt_load_csv(const char *path, wt_dataset *out, char *err, size_t errlen)
{
    if (!out)
        return fail(err, errlen, WF_EINVAL, "wt_load_csv: 'out' is NULL");
    memset(out, 0, sizeof *out);
    if (!path)
        return fail(err, errlen, WF_EINVAL, "wt_load_csv: 'path' is NULL");
    errno = 0; /* gzopen() fails with errno set, or with 0 when out of memory */
    gzFile f = gzopen(path, "rb");
    if (!f)
        return fail(err, errlen, WF_EIO, "%s: cannot open: %s", path,
                    errno ? strerror(errno) : "out of memory");
    csv_state st = { .path = path };
    char *line = NULL;
    size_t cap = 0, len;
    long long lineno = 0, header_line = 0;
    int64_t header_cols = 0;
    bool seen_line = false;
    int rc;
    for (;;) {
        lineno++;
        rc = csv_line(f, path, lineno, &line, &cap, &len, err, errlen);
        if (rc <= 0)
            break;
        if (line_is_blank(line))
            continue;
        if (!seen_line) {
            seen_line = true;
            if (csv_is_header(line)) {
                header_line = lineno;
                header_cols = csv_columns(line);
                continue;
            }
        }
        if ((rc = csv_row(&st, line, lineno, err, errlen)) < 0)
            break;
        if (header_cols && header_cols != st.cols) {
            rc = fail(err, errlen, WF_EFORMAT,
                      "%s: line %lld: %lld columns, but the header (line %lld) has %lld", path,
                      lineno, (long long)st.cols, header_line, (long long)header_cols);
            break;
        }
        header_cols = 0; /* checked once: every later line must match 'st.cols' */
    }
    free(line);
    int zrc = gzclose(f);
    if (rc == 0 && zrc != Z_OK)
        rc = fail(err, errlen, WF_EIO, "%s: line %lld: %s", path, lineno,
                  zrc == Z_BUF_ERROR ? "the gzip stream is truncated" : "closing failed");
    if (rc == 0 && st.n == 0)
        rc = fail(err, errlen, WF_EFORMAT, "%s: no data rows (%s)", path,
                  header_line ? "only a header" : "the file is empty");
    if (rc < 0) {
        free(st.x);
        free(st.y);
        return rc;
    }
    out->n = st.n;
    out->rank = 1;
    out->dims[0] = st.cols - 1;
    out->n_features = st.cols - 1;
    /* Give back the doubling's slack: the digits need 460 KB, not 1 MB. */
    float *x = realloc(st.x, (size_t)(st.n * out->n_features) * sizeof(float));
    int32_t *y = realloc(st.y, (size_t)st.n * sizeof(int32_t));
    out->x = x ? x : st.x;
    out->y = y ? y : st.y;
    count_classes(out);
    return 0;
}

/* ---- MNIST IDX ---------------------------------------------------------------------------- */

/* Checks the IDX header of 'buf' (magic 0x0000080<ndims>, unsigned bytes) and that the file
 * is exactly as long as its dimensions say; fills 'dims'. */
static int idx_header(const char *path, const unsigned char *buf, size_t len, int ndims,
                      const char *what, uint32_t *dims, size_t *data_off, char *err, size_t errlen)
{
    uint32_t want = 0x00000800u | (uint32_t)ndims;
    if (len < 4)
        return fail(err, errlen, WF_EFORMAT,
                    "%s: %zu bytes: too short for an IDX header (magic 0x%08x, %s)", path, len,
                    want, what);
    uint32_t magic = be32(buf);
    if (magic != want)
        return fail(err, errlen, WF_EFORMAT,
                    "%s: byte 0: magic 0x%08x, expected 0x%08x (IDX unsigned bytes, %s)%s", path,
                    magic, want, what,
                    buf[0] == 0x1f && buf[1] == 0x8b ? " (a damaged gzip file?)" : "");
    size_t off = 4 + 4 * (size_t)ndims;
    if (len < off)
        return fail(err, errlen, WF_EFORMAT,
                    "%s: %zu bytes: the header of %d dimensions needs %zu (truncated)", path, len,
                    ndims, off);
    uint64_t need = 1;
    for (int d = 0; d < ndims; d++) {
        dims[d] = be32(buf + 4 + 4 * d);
        if (__builtin_mul_overflow(need, (uint64_t)dims[d], &need))
            return fail(err, errlen, WF_EFORMAT, "%s: byte %d: dimensions overflow", path,
                        4 + 4 * d);
    }
    if (dims[0] == 0)
        return fail(err, errlen, WF_EFORMAT, "%s: byte 4: the count is 0", path);
    for (int d = 1; d < ndims; d++)
        if (dims[d] == 0)
            return fail(err, errlen, WF_EFORMAT, "%s: byte %d: dimension %d is 0", path, 4 + 4 * d,
                        d);
    if (need != len - off) {
        char shape[64];
        if (ndims == 3)
            snprintf(shape, sizeof shape, "%u images of %ux%u", dims[0], dims[1], dims[2]);
        else
            snprintf(shape, sizeof shape, "%u labels", dims[0]);
        return fail(err, errlen, WF_EFORMAT,
                    "%s: the header says %s (%llu bytes after the %zu-byte header) but the "
                    "file has %zu: %s",
                    path, shape, (unsigned long long)need, off, len - off,
                    need > len - off ? "truncated" : "trailing bytes");
    }
    *data_off = off;
    return 0;
}

int wt_load_idx(const char *images_path, const char *labels_path, wt_dataset *out, char *err,
                size_t errlen)
{
    if (!out)
        return fail(err, errlen, WF_EINVAL, "wt_load_idx: 'out' is NULL");
    memset(out, 0, sizeof *out);
    if (!images_path || !labels_path)
        return fail(err, errlen, WF_EINVAL, "wt_load_idx: a path is NULL");
    unsigned char *img = NULL, *lab = NULL;
    size_t img_len, lab_len, img_off, lab_off;
    uint32_t idims[3] = { 0 }, ldims[1] = { 0 }; /* idx_header() fills them when it succeeds */
    int rc = read_all(images_path, &img, &img_len, err, errlen);
    if (rc == 0)
        rc = idx_header(images_path, img, img_len, 3, "images [n, rows, cols]", idims, &img_off,
                        err, errlen);
    if (rc == 0)
        rc = read_all(labels_path, &lab, &lab_len, err, errlen);
    if (rc == 0)
        rc = idx_header(labels_path, lab, lab_len, 1, "labels [n]", ldims, &lab_off, err, errlen);
    if (rc == 0 && idims[0] != ldims[0])
        rc = fail(err, errlen, WF_EFORMAT, "%s has %u images but %s has %u labels", images_path,
                  idims[0], labels_path, ldims[0]);
    if (rc == 0 && !alloc_dataset(out, idims[0], (int64_t)idims[1] * idims[2]))
        rc = fail(err, errlen, WF_ENOMEM, "%s: out of memory for %u images of %ux%u", images_path,
                  idims[0], idims[1], idims[2]);
    if (rc == 0) {
        out->rank = 3;
        out->dims[0] = 1;
        out->dims[1] = idims[1];
        out->dims[2] = idims[2];
        int64_t total = out->n * out->n_features;
        for (int64_t i = 0; i < total; i++)
            out->x[i] = (float)img[img_off + (size_t)i] * (1.0f / 255.0f);
        for (int64_t i = 0; i < out->n; i++)
            out->y[i] = lab[lab_off + (size_t)i];
        count_classes(out);
    }
    free(img);
    free(lab);
    return rc;
}

/* ---- NumPy .npy --------------------------------------------------------------------------- */

typedef struct npy_header {
    char descr[16];
    int fortran;       /* -1 until seen */
    int rank;          /* -1 until seen */
    uint64_t shape[8]; /* numpy allows 32 dimensions; more than 8 is refused here */
    size_t data_off;
} npy_header;

typedef struct npy_parser {
    const char *path;
    const unsigned char *buf; /* the whole file: offsets in messages are file offsets */
    size_t pos, end;          /* the dictionary text is [pos, end) */
    char *err;
    size_t errlen;
} npy_parser;

static int npy_fail(npy_parser *ps, const char *what)
{
    char q[24];
    size_t left = ps->end - ps->pos;
    const char *at = (const char *)ps->buf + ps->pos;
    size_t n = 0;
    while (n < left && at[n] != '\n' && n < 16)
        n++;
    return fail(ps->err, ps->errlen, WF_EFORMAT, "%s: byte %zu, in the header: %s, at '%s'",
                ps->path, ps->pos, what, excerpt(at, n, q, sizeof q));
}

static void npy_ws(npy_parser *ps)
{
    while (ps->pos < ps->end && (ps->buf[ps->pos] == ' ' || ps->buf[ps->pos] == '\t'))
        ps->pos++;
}

static bool npy_eat(npy_parser *ps, char c)
{
    npy_ws(ps);
    if (ps->pos < ps->end && ps->buf[ps->pos] == c) {
        ps->pos++;
        return true;
    }
    return false;
}

/* A Python string literal in single or double quotes, without escapes. */
static int npy_string(npy_parser *ps, char *out, size_t size)
{
    npy_ws(ps);
    if (ps->pos >= ps->end || (ps->buf[ps->pos] != '\'' && ps->buf[ps->pos] != '"'))
        return npy_fail(ps, "expected a quoted string");
    char quote = (char)ps->buf[ps->pos];
    size_t start = ps->pos + 1, i = start;
    while (i < ps->end && ps->buf[i] != quote) {
        if (ps->buf[i] == '\\' || ps->buf[i] < 0x20 || ps->buf[i] > 0x7e)
            return npy_fail(ps, "unsupported character in a string");
        i++;
    }
    if (i >= ps->end)
        return npy_fail(ps, "unterminated string");
    if (i - start >= size)
        return npy_fail(ps, "string too long");
    memcpy(out, ps->buf + start, i - start);
    out[i - start] = '\0';
    ps->pos = i + 1;
    return 0;
}

static bool npy_word(npy_parser *ps, const char *word)
{
    size_t n = strlen(word);
    npy_ws(ps);
    if (ps->end - ps->pos >= n && memcmp(ps->buf + ps->pos, word, n) == 0) {
        ps->pos += n;
        return true;
    }
    return false;
}

/* A shape tuple: '()', '(N,)', '(N, M)', '(N, M,)'. A single element needs its comma, as in
 * Python, where '(N)' is a number, not a tuple. */
static int npy_shape(npy_parser *ps, npy_header *h)
{
    if (!npy_eat(ps, '('))
        return npy_fail(ps, "'shape' must be a tuple");
    h->rank = 0;
    bool comma = false;
    for (;;) {
        npy_ws(ps);
        if (npy_eat(ps, ')'))
            break;
        if (h->rank > 0 && !comma)
            return npy_fail(ps, "expected ',' or ')' in 'shape'");
        if (ps->pos >= ps->end || ps->buf[ps->pos] < '0' || ps->buf[ps->pos] > '9')
            return npy_fail(ps, "expected a non-negative integer in 'shape'");
        uint64_t v = 0;
        while (ps->pos < ps->end && ps->buf[ps->pos] >= '0' && ps->buf[ps->pos] <= '9') {
            if (__builtin_mul_overflow(v, 10, &v) ||
                __builtin_add_overflow(v, (uint64_t)(ps->buf[ps->pos] - '0'), &v))
                return npy_fail(ps, "dimension too large in 'shape'");
            ps->pos++;
        }
        if (h->rank == (int)(sizeof h->shape / sizeof h->shape[0]))
            return npy_fail(ps, "more than 8 dimensions in 'shape'");
        h->shape[h->rank++] = v;
        comma = npy_eat(ps, ',');
    }
    if (h->rank == 1 && !comma)
        return npy_fail(ps, "a 1-element 'shape' needs a trailing comma, as in '(N,)'");
    return 0;
}

static int npy_dict(npy_parser *ps, npy_header *h)
{
    h->descr[0] = '\0';
    h->fortran = -1;
    h->rank = -1;
    if (!npy_eat(ps, '{'))
        return npy_fail(ps, "the header is not a dictionary");
    bool first = true;
    for (;;) {
        if (npy_eat(ps, '}'))
            break;
        if (!first && !npy_eat(ps, ','))
            return npy_fail(ps, "expected ',' or '}'");
        first = false;
        if (npy_eat(ps, '}'))
            break; /* a trailing comma, as numpy writes */
        char key[32];
        npy_ws(ps);
        size_t key_pos = ps->pos;
        int rc = npy_string(ps, key, sizeof key);
        if (rc < 0)
            return rc;
        if (!npy_eat(ps, ':'))
            return npy_fail(ps, "expected ':' after a key");
        bool dup = false;
        if (strcmp(key, "descr") == 0) {
            dup = h->descr[0] != '\0';
            rc = npy_string(ps, h->descr, sizeof h->descr);
            if (rc == 0 && !h->descr[0])
                return npy_fail(ps, "empty 'descr'");
        } else if (strcmp(key, "fortran_order") == 0) {
            dup = h->fortran >= 0;
            if (npy_word(ps, "False"))
                h->fortran = 0;
            else if (npy_word(ps, "True"))
                h->fortran = 1;
            else
                rc = npy_fail(ps, "'fortran_order' must be True or False");
        } else if (strcmp(key, "shape") == 0) {
            dup = h->rank >= 0;
            rc = npy_shape(ps, h);
        } else {
            char what[96];
            snprintf(what, sizeof what,
                     "unknown key '%s' (expected 'descr', 'fortran_order', 'shape')", key);
            ps->pos = key_pos;
            return npy_fail(ps, what);
        }
        if (dup) {
            ps->pos = key_pos;
            return npy_fail(ps, "duplicate key");
        }
        if (rc < 0)
            return rc;
    }
    npy_ws(ps);
    if (ps->pos != ps->end)
        return npy_fail(ps, "text after the dictionary");
    const char *missing = !h->descr[0]     ? "descr"
                          : h->fortran < 0 ? "fortran_order"
                          : h->rank < 0    ? "shape"
                                           : NULL;
    if (missing) {
        char what[64];
        snprintf(what, sizeof what, "the key '%s' is missing", missing);
        return npy_fail(ps, what);
    }
    return 0;
}

/* Checks the magic, version and header of an .npy file in 'buf' and that the data is exactly
 * as long as the shape says for 'itemsize'-byte items. */
static int npy_parse(const char *path, const unsigned char *buf, size_t len, npy_header *h,
                     char *err, size_t errlen)
{
    static const unsigned char magic[6] = { 0x93, 'N', 'U', 'M', 'P', 'Y' };
    if (len < 10 || memcmp(buf, magic, 6) != 0)
        return fail(err, errlen, WF_EFORMAT,
                    "%s: byte 0: not a NumPy .npy file (no \\x93NUMPY magic%s)", path,
                    len < 10 ? "; the file is too short" : "");
    unsigned major = buf[6], minor = buf[7];
    if (major < 1 || major > 3 || minor != 0)
        return fail(err, errlen, WF_EFORMAT,
                    "%s: byte 6: .npy format version %u.%u (known: "
                    "1.0, 2.0, 3.0)",
                    path, major, minor);
    size_t hlen, start;
    if (major == 1) {
        hlen = (size_t)buf[8] | (size_t)buf[9] << 8;
        start = 10;
    } else {
        if (len < 12)
            return fail(err, errlen, WF_EFORMAT, "%s: %zu bytes: truncated header", path, len);
        hlen = le32(buf + 8);
        start = 12;
    }
    if (hlen > len - start)
        return fail(err, errlen, WF_EFORMAT,
                    "%s: byte 8: header length %zu, but the file has %zu bytes after byte %zu "
                    "(truncated)",
                    path, hlen, len - start, start);
    if (hlen == 0 || buf[start + hlen - 1] != '\n')
        return fail(err, errlen, WF_EFORMAT, "%s: byte %zu: the header does not end in '\\n'", path,
                    start + hlen - (hlen > 0));
    npy_parser ps = { .path = path,
                      .buf = buf,
                      .pos = start,
                      .end = start + hlen - 1,
                      .err = err,
                      .errlen = errlen };
    int rc = npy_dict(&ps, h);
    if (rc < 0)
        return rc;
    h->data_off = start + hlen;
    return 0;
}

/* The bytes the data of 'h' needs, or false on overflow. */
static bool npy_bytes(const npy_header *h, size_t itemsize, uint64_t *bytes)
{
    uint64_t n = itemsize;
    for (int d = 0; d < h->rank; d++)
        if (__builtin_mul_overflow(n, h->shape[d], &n))
            return false;
    *bytes = n;
    return true;
}

static void shape_str(const npy_header *h, char *buf, size_t size)
{
    int n = snprintf(buf, size, "(");
    for (int d = 0; d < h->rank && n > 0 && (size_t)n < size; d++)
        n += snprintf(buf + n, size - (size_t)n, "%s%llu", d ? ", " : "",
                      (unsigned long long)h->shape[d]);
    if (n > 0 && (size_t)n < size)
        snprintf(buf + n, size - (size_t)n, "%s)", h->rank == 1 ? "," : "");
}

static int npy_check_size(const char *path, const npy_header *h, size_t itemsize, size_t len,
                          char *err, size_t errlen)
{
    uint64_t need;
    char s[96];
    shape_str(h, s, sizeof s);
    if (!npy_bytes(h, itemsize, &need))
        return fail(err, errlen, WF_EFORMAT, "%s: shape %s overflows", path, s);
    if (need != len - h->data_off)
        return fail(err, errlen, WF_EFORMAT,
                    "%s: shape %s of '%s' needs %llu bytes after the header (byte %zu), but "
                    "the file has %zu: %s",
                    path, s, h->descr, (unsigned long long)need, h->data_off, len - h->data_off,
                    need > len - h->data_off ? "truncated" : "trailing bytes");
    return 0;
}

int wt_load_npy(const char *x_path, const char *y_path, wt_dataset *out, char *err, size_t errlen)
{
    if (!out)
        return fail(err, errlen, WF_EINVAL, "wt_load_npy: 'out' is NULL");
    memset(out, 0, sizeof *out);
    if (!x_path || !y_path)
        return fail(err, errlen, WF_EINVAL, "wt_load_npy: a path is NULL");
    unsigned char *xb = NULL, *yb = NULL;
    size_t xlen, ylen;
    npy_header xh, yh;
    char s[96];
    size_t ysize = 0;
    int rc = read_all(x_path, &xb, &xlen, err, errlen);
    if (rc == 0)
        rc = npy_parse(x_path, xb, xlen, &xh, err, errlen);
    if (rc == 0 && strcmp(xh.descr, "<f4") != 0)
        rc = fail(err, errlen, WF_EFORMAT,
                  "%s: descr '%s': features must be little-endian float32 ('<f4')", x_path,
                  xh.descr);
    if (rc == 0 && xh.fortran)
        rc = fail(err, errlen, WF_EFORMAT,
                  "%s: fortran_order is True: save the features in C order "
                  "(numpy.ascontiguousarray)",
                  x_path);
    if (rc == 0 && (xh.rank < 1 || xh.rank > 1 + WT_MAX_SAMPLE_RANK)) {
        shape_str(&xh, s, sizeof s);
        rc = fail(err, errlen, WF_EFORMAT,
                  "%s: shape %s: features must be [N, ...] with 1 to %d "
                  "dimensions after N",
                  x_path, s, WT_MAX_SAMPLE_RANK);
    }
    if (rc == 0)
        rc = npy_check_size(x_path, &xh, 4, xlen, err, errlen);
    if (rc == 0)
        rc = read_all(y_path, &yb, &ylen, err, errlen);
    if (rc == 0)
        rc = npy_parse(y_path, yb, ylen, &yh, err, errlen);
    if (rc == 0) {
        ysize = strcmp(yh.descr, "<i4") == 0 ? 4 : strcmp(yh.descr, "<i8") == 0 ? 8 : 0;
        if (!ysize)
            rc = fail(err, errlen, WF_EFORMAT,
                      "%s: descr '%s': labels must be little-endian int32 or int64 ('<i4', "
                      "'<i8')",
                      y_path, yh.descr);
    }
    if (rc == 0 && yh.fortran)
        rc = fail(err, errlen, WF_EFORMAT,
                  "%s: fortran_order is True: save the labels in C "
                  "order",
                  y_path);
    if (rc == 0 && yh.rank != 1) {
        shape_str(&yh, s, sizeof s);
        rc = fail(err, errlen, WF_EFORMAT, "%s: shape %s: labels must be [N]", y_path, s);
    }
    if (rc == 0)
        rc = npy_check_size(y_path, &yh, ysize, ylen, err, errlen);
    if (rc == 0 && xh.shape[0] != yh.shape[0])
        rc = fail(err, errlen, WF_EFORMAT, "%s has %llu samples but %s has %llu labels", x_path,
                  (unsigned long long)xh.shape[0], y_path, (unsigned long long)yh.shape[0]);
    int64_t nf = 1;
    for (int d = 1; rc == 0 && d < xh.rank; d++)
        nf *= (int64_t)xh.shape[d]; /* no overflow: npy_check_size() bounded the product */
    if (rc == 0 && (xh.shape[0] == 0 || nf == 0)) {
        shape_str(&xh, s, sizeof s);
        rc = fail(err, errlen, WF_EFORMAT, "%s: shape %s: no %s", x_path, s,
                  xh.shape[0] == 0 ? "samples" : "features");
    }
    if (rc == 0 && !alloc_dataset(out, (int64_t)xh.shape[0], nf))
        rc = fail(err, errlen, WF_ENOMEM, "%s: out of memory", x_path);
    if (rc == 0) {
        out->rank = xh.rank == 1 ? 1 : xh.rank - 1;
        out->dims[0] = 1;
        for (int d = 1; d < xh.rank; d++)
            out->dims[d - 1] = (int64_t)xh.shape[d];
        const unsigned char *p = xb + xh.data_off;
        int64_t total = out->n * nf;
        for (int64_t i = 0; i < total && rc == 0; i++) {
            uint32_t u = le32(p + 4 * i);
            float v;
            memcpy(&v, &u, sizeof v);
            if (!isfinite(v))
                rc = fail(err, errlen, WF_EFORMAT,
                          "%s: byte %zu: feature %lld of sample %lld is %s (not finite)", x_path,
                          xh.data_off + 4 * (size_t)i, (long long)(i % nf), (long long)(i / nf),
                          isnan(v) ? "nan" : "inf");
            out->x[i] = v;
        }
        p = yb + yh.data_off;
        for (int64_t i = 0; i < out->n && rc == 0; i++) {
            int64_t v = ysize == 4 ? (int64_t)(int32_t)le32(p + 4 * i) : (int64_t)le64(p + 8 * i);
            if (v < 0 || v >= WT_MAX_CLASSES)
                rc = fail(err, errlen, WF_EFORMAT,
                          "%s: byte %zu: label %lld of sample %lld is not in [0, %d)", y_path,
                          yh.data_off + ysize * (size_t)i, (long long)v, (long long)i,
                          WT_MAX_CLASSES);
            out->y[i] = (int32_t)v;
        }
        if (rc == 0)
            count_classes(out);
        else
            wt_dataset_free(out);
    }
    free(xb);
    free(yb);
    return rc;
}

/* ---- shape, split, normalisation, batches ------------------------------------------------- */

int wt_dataset_reshape(wt_dataset *ds, int rank, const int64_t *dims, char *err, size_t errlen)
{
    if (!ds || !dims || rank < 1 || rank > WT_MAX_SAMPLE_RANK)
        return fail(err, errlen, WF_ESHAPE, "reshape: rank %d is not in [1, %d]", rank,
                    WT_MAX_SAMPLE_RANK);
    int64_t n = 1;
    for (int d = 0; d < rank; d++) {
        if (dims[d] <= 0 || __builtin_mul_overflow(n, dims[d], &n))
            return fail(err, errlen, WF_ESHAPE, "reshape: dimension %d is %lld", d,
                        (long long)dims[d]);
    }
    if (n != ds->n_features)
        return fail(err, errlen, WF_ESHAPE,
                    "reshape: %lld features per sample cannot be viewed as %lld",
                    (long long)ds->n_features, (long long)n);
    ds->rank = rank;
    memset(ds->dims, 0, sizeof ds->dims);
    memcpy(ds->dims, dims, (size_t)rank * sizeof *dims);
    return 0;
}

static uint64_t splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

void wt_permutation(int64_t n, uint64_t seed, int64_t *perm)
{
    for (int64_t i = 0; i < n; i++)
        perm[i] = i;
    if (seed == WT_SPLIT_IN_ORDER)
        return;
    /* Fisher-Yates; the modulo's bias is below n / 2^64, and it keeps the order easy to
     * reproduce elsewhere (a Python loop of the same three lines). */
    uint64_t state = seed;
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)(splitmix64(&state) % (uint64_t)(i + 1));
        int64_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}

static void copy_rows(const wt_dataset *ds, const int64_t *rows, int64_t n, wt_dataset *out)
{
    for (int64_t i = 0; i < n; i++) {
        memcpy(out->x + i * ds->n_features, ds->x + rows[i] * ds->n_features,
               (size_t)ds->n_features * sizeof(float));
        out->y[i] = ds->y[rows[i]];
    }
    out->rank = ds->rank;
    memcpy(out->dims, ds->dims, sizeof out->dims);
    out->n_classes = ds->n_classes;
}

int wt_split(const wt_dataset *ds, double test_fraction, uint64_t seed, wt_dataset *train,
             wt_dataset *test, char *err, size_t errlen)
{
    if (!train || !test || !ds)
        return fail(err, errlen, WF_EINVAL, "split: NULL dataset");
    memset(train, 0, sizeof *train);
    memset(test, 0, sizeof *test);
    if (!(test_fraction >= 0 && test_fraction < 1))
        return fail(err, errlen, WF_EINVAL, "split: test fraction %g is not in [0, 1)",
                    test_fraction);
    int64_t n_test = (int64_t)llround((double)ds->n * test_fraction);
    int64_t n_train = ds->n - n_test;
    if (n_train < 1)
        return fail(err, errlen, WF_EINVAL,
                    "split: a test fraction of %g leaves no training sample of %lld", test_fraction,
                    (long long)ds->n);
    int64_t *perm = malloc((size_t)ds->n * sizeof *perm);
    if (!perm || !alloc_dataset(train, n_train, ds->n_features) ||
        !alloc_dataset(test, n_test, ds->n_features)) {
        free(perm);
        wt_dataset_free(train);
        return fail(err, errlen, WF_ENOMEM, "split: out of memory for %lld samples",
                    (long long)ds->n);
    }
    wt_permutation(ds->n, seed, perm);
    copy_rows(ds, perm, n_train, train);
    copy_rows(ds, perm + n_train, n_test, test);
    free(perm);
    return 0;
}

int wt_normalize(wt_dataset *train, wt_dataset *test, char *err, size_t errlen)
{
    if (!train || train->n < 1)
        return fail(err, errlen, WF_EINVAL, "normalize: the training set is empty");
    if (test && test->n > 0 && test->n_features != train->n_features)
        return fail(err, errlen, WF_EINVAL,
                    "normalize: the training set has %lld features, the test set %lld",
                    (long long)train->n_features, (long long)test->n_features);
    int64_t nf = train->n_features;
    double *mean = calloc((size_t)nf * 2, sizeof *mean);
    if (!mean)
        return fail(err, errlen, WF_ENOMEM, "normalize: out of memory for %lld features",
                    (long long)nf);
    double *scale = mean + nf;
    for (int64_t i = 0; i < train->n; i++)
        for (int64_t f = 0; f < nf; f++)
            mean[f] += train->x[i * nf + f];
    for (int64_t f = 0; f < nf; f++)
        mean[f] /= (double)train->n;
    /* Two passes: the one-pass sum of squares loses the variance of large, tight features. */
    for (int64_t i = 0; i < train->n; i++)
        for (int64_t f = 0; f < nf; f++) {
            double d = train->x[i * nf + f] - mean[f];
            scale[f] += d * d;
        }
    for (int64_t f = 0; f < nf; f++) {
        double sd = sqrt(scale[f] / (double)train->n);
        scale[f] = sd > 1e-12 * (fabs(mean[f]) + 1) ? 1 / sd : 1;
    }
    wt_dataset *sets[2] = { train, test };
    for (int s = 0; s < 2; s++) {
        wt_dataset *ds = sets[s];
        for (int64_t i = 0; ds && i < ds->n; i++)
            for (int64_t f = 0; f < nf; f++)
                ds->x[i * nf + f] = (float)((ds->x[i * nf + f] - mean[f]) * scale[f]);
    }
    free(mean);
    return 0;
}

int wt_batch(const wt_dataset *ds, const int64_t *perm, int64_t start, int64_t count, float *x,
             int32_t *y)
{
    if (!ds || !x || start < 0 || count < 0 || start > ds->n - count)
        return WF_EINVAL;
    for (int64_t i = 0; i < count; i++) {
        int64_t r = perm ? perm[start + i] : start + i;
        if (r < 0 || r >= ds->n)
            return WF_EINVAL;
        memcpy(x + i * ds->n_features, ds->x + r * ds->n_features,
               (size_t)ds->n_features * sizeof(float));
        if (y)
            y[i] = ds->y[r];
    }
    return 0;
}
