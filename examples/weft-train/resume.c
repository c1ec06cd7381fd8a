/* examples/weft-train/resume.c: the run identity of weft-train (resume.h): the options text,
 * checking a checkpoint's text against this run's, the data hash and a checkpoint's hash.
 * The text is "KEY VALUE" lines so that a mismatch names the option the user typed; a
 * checkpoint's text comes from a file, so it is read with bounds and may hold anything. */
#include "resume.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int wt_runid_add(char *buf, size_t cap, size_t *len, const char *key, const char *fmt, ...)
{
    char val[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(val, sizeof val, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof val || strchr(val, '\n'))
        return -1;
    int m = snprintf(buf + *len, cap - *len, "%s %s\n", key, val);
    if (m < 0 || (size_t)m >= cap - *len) {
        buf[*len] = '\0';
        return -1;
    }
    *len += (size_t)m;
    return 0;
}

/* The line of 'text' ('n' bytes) whose key is 'key' ('klen' bytes): its value and length
 * through 'val'/'vlen'. Returns 1 when found, 0 when not. */
static int find(const char *text, size_t n, const char *key, size_t klen, const char **val,
                size_t *vlen)
{
    for (size_t at = 0; at < n;) {
        const char *line = text + at, *nl = memchr(line, '\n', n - at);
        size_t ll = nl ? (size_t)(nl - line) : n - at;
        if (ll > klen && memcmp(line, key, klen) == 0 && line[klen] == ' ') {
            *val = line + klen + 1;
            *vlen = ll - klen - 1;
            return 1;
        }
        at += ll + 1;
    }
    return 0;
}

/* Checks that every line of 'a' has its key in 'b' with the same value; 'a_is_saved' says
 * which side 'a' is, for the message. */
static int one_way(const char *a, size_t an, const char *b, size_t bn, int a_is_saved, char *err,
                   size_t errlen)
{
    for (size_t at = 0; at < an;) {
        const char *line = a + at, *nl = memchr(line, '\n', an - at);
        size_t ll = nl ? (size_t)(nl - line) : an - at;
        const char *sp = memchr(line, ' ', ll);
        if (!sp || sp == line || memchr(line, '\0', ll)) {
            snprintf(err, errlen, "the checkpoint's options are malformed (line '%.*s')",
                     (int)(ll > 60 ? 60 : ll), line);
            return -1;
        }
        size_t klen = (size_t)(sp - line), vlen;
        const char *val = sp + 1, *other;
        if (!find(b, bn, line, klen, &other, &vlen)) {
            snprintf(err, errlen, "%.*s: %s %.*s, %s", (int)klen, line,
                     a_is_saved ? "the checkpoint was trained with" : "this run has",
                     (int)(ll - klen - 1), val,
                     a_is_saved ? "this run does not set it" : "the checkpoint does not say");
            return -1;
        }
        if (a_is_saved && (vlen != ll - klen - 1 || memcmp(val, other, vlen) != 0)) {
            snprintf(err, errlen,
                     "%.*s: the checkpoint was trained with '%.*s', this run has '%.*s' (give the "
                     "same options to resume, or another --checkpoint-dir)",
                     (int)klen, line, (int)(ll - klen - 1), val, (int)vlen, other);
            return -1;
        }
        at += ll + 1;
    }
    return 0;
}

int wt_runid_check(const char *saved, size_t saved_len, const char *now, char *err, size_t errlen)
{
    size_t nn = strlen(now);
    if (one_way(saved, saved_len, now, nn, 1, err, errlen) < 0)
        return -1;
    return one_way(now, nn, saved, saved_len, 0, err, errlen);
}

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

uint64_t wt_dataset_hash(const wt_dataset *ds)
{
    uint64_t h = 14695981039346656037ull;
    h = fnv(h, &ds->n, sizeof ds->n);
    h = fnv(h, ds->dims, (size_t)ds->rank * sizeof ds->dims[0]);
    h = fnv(h, ds->x, (size_t)(ds->n * ds->n_features) * sizeof *ds->x);
    return fnv(h, ds->y, (size_t)ds->n * sizeof *ds->y);
}

uint64_t wt_tensors_hash(const wf_named_tensor *ts, int n)
{
    uint64_t h = 14695981039346656037ull;
    for (int i = 0; i < n; i++) {
        const wf_tensor *t = ts[i].tensor;
        wf_dtype dt = wf_tensor_dtype(t);
        wf_shape sh = wf_tensor_shape(t);
        h = fnv(h, ts[i].name, strlen(ts[i].name) + 1);
        h = fnv(h, &dt, sizeof dt);
        h = fnv(h, &sh.rank, sizeof sh.rank);
        h = fnv(h, sh.dims, (size_t)sh.rank * sizeof sh.dims[0]);
        h = fnv(h, wf_tensor_data(t), (size_t)wf_tensor_numel(t) * wf_dtype_size(dt));
    }
    return h;
}
