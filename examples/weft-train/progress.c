/* examples/weft-train/progress.c: the progress bar of progress.h.
 * Owns: the line's layout (fields first, then the bar takes what the width leaves), the
 * redraw throttle and the terminal probing (isatty, TIOCGWINSZ).
 * Invariant: in TTY mode 'drawn' is true exactly while the cursor sits at the end of an
 * unfinished in-place line, so that the end line replaces it instead of following it.
 * Not here: what the numbers mean (weft-train.c). */
#include "progress.h"

#include <math.h>
#include <stdarg.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#define LINE_MAX_BYTES 1024

static uint64_t monotonic_ns(void *arg)
{
    (void)arg;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t now(const wt_progress *p)
{
    return p->o.clock_ns(p->o.clock_arg);
}

void wt_progress_begin(wt_progress *p, const wt_progress_opts *opts, int epoch, int n_epochs,
                       int64_t total)
{
    memset(p, 0, sizeof *p);
    if (opts)
        p->o = *opts;
    if (!p->o.out)
        p->o.out = stdout;
    if (!p->o.clock_ns)
        p->o.clock_ns = monotonic_ns;
    int fd = fileno(p->o.out); /* -1 for memory streams: never a terminal */
    if (p->o.mode != WT_PROGRESS_TTY && p->o.mode != WT_PROGRESS_LINES)
        p->o.mode = fd >= 0 && isatty(fd) ? WT_PROGRESS_TTY : WT_PROGRESS_LINES;
    p->width = p->o.width;
    if (p->width <= 0 && p->o.mode == WT_PROGRESS_LINES) {
        p->width = LINE_MAX_BYTES - 1; /* a log does not wrap: the bar keeps its full size */
    } else if (p->width <= 0) {
        struct winsize ws;
        p->width = 80;
        if (fd >= 0 && isatty(fd) && ioctl(fd, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0)
            p->width = ws.ws_col;
    }
    if (p->width < 20)
        p->width = 20;
    if (p->width > LINE_MAX_BYTES - 1)
        p->width = LINE_MAX_BYTES - 1;
    p->epoch = epoch;
    p->n_epochs = n_epochs;
    p->total = total;
    p->loss = NAN;
    p->acc = -1;
    p->t0 = now(p);
}

/* 12345 -> "12,345". */
static void thousands(int64_t v, char *buf, size_t size)
{
    char digits[32];
    int n = snprintf(digits, sizeof digits, "%lld", (long long)(v < 0 ? -v : v));
    size_t o = 0;
    if (v < 0 && o + 1 < size)
        buf[o++] = '-';
    for (int i = 0; i < n && o + 1 < size; i++) {
        buf[o++] = digits[i];
        if ((n - 1 - i) % 3 == 0 && i != n - 1 && o + 1 < size)
            buf[o++] = ',';
    }
    buf[o] = '\0';
}

/* Seconds as "m:ss", or "h:mm:ss" from an hour up. */
static void clock_str(double s, char *buf, size_t size)
{
    long long t = s < 0 ? 0 : s > 359999999 ? 359999999 : (long long)llround(s);
    if (t >= 3600)
        snprintf(buf, size, "%lld:%02lld:%02lld", t / 3600, t / 60 % 60, t % 60);
    else
        snprintf(buf, size, "%lld:%02lld", t / 60, t % 60);
}

/* snprintf that appends at '*len' and never moves it past the end of 'buf'. */
static void append(char *buf, size_t size, int *len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void append(char *buf, size_t size, int *len, const char *fmt, ...)
{
    size_t at = (size_t)*len;
    if (at + 1 >= size)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + at, size - at, fmt, ap);
    va_end(ap);
    if (n > 0)
        *len += (size_t)n < size - at ? n : (int)(size - at - 1);
}

int wt_progress_format(const wt_progress *p, bool final, char *buf, size_t size)
{
    if (!buf || size == 0)
        return 0;
    char prefix[64] = "", count[64], stats[LINE_MAX_BYTES];
    int plen = 0, slen = 0;
    if (p->n_epochs > 0)
        append(prefix, sizeof prefix, &plen, "epoch %d/%d ", p->epoch, p->n_epochs);
    int64_t done = p->done < 0 ? 0 : p->done;
    if (p->total > 0)
        snprintf(count, sizeof count, "%lld/%lld", (long long)done, (long long)p->total);
    else
        snprintf(count, sizeof count, "%lld", (long long)done);
    stats[0] = '\0';
    if (p->have_stats) {
        append(stats, sizeof stats, &slen, "  loss %.4f", p->loss);
        if (p->acc >= 0)
            append(stats, sizeof stats, &slen, "  acc %.1f%%", 100 * p->acc);
    }
    uint64_t t_now = now(p);
    double elapsed = t_now > p->t0 ? (double)(t_now - p->t0) * 1e-9 : 0;
    double rate = elapsed > 0 ? (double)done / elapsed : 0;
    if (rate > 0) {
        char r[32];
        if (rate < 10) /* a slow model: "0.25 samples/s" says more than "0" */
            snprintf(r, sizeof r, "%.2f", rate);
        else
            thousands((int64_t)llround(rate), r, sizeof r);
        append(stats, sizeof stats, &slen, "  %s samples/s", r);
    }
    char t[32];
    if (final) {
        clock_str(elapsed, t, sizeof t);
        append(stats, sizeof stats, &slen, "  time %s", t);
    } else if (rate > 0 && p->total > 0 && done < p->total) {
        clock_str((double)(p->total - done) / rate, t, sizeof t);
        append(stats, sizeof stats, &slen, "  ETA %s", t);
    }

    /* The bar gets what the fields leave of the width, less one column (a line that fills
     * the last column wraps on many terminals), up to WT_PROGRESS_BAR_MAX; under 10 it goes.
     * Fields not shown yet (the rate and ETA before the first update) keep their room, so
     * that the bar keeps one length over the epoch. */
    int reserve = (int)strlen("  loss 0.0000  acc 00.0%  00,000 samples/s  ETA 0:00");
    int fixed = plen + (int)strlen(count) + (slen > reserve ? slen : reserve);
    int bar = p->width - 1 - fixed - 3; /* "[", "] " */
    if (bar > WT_PROGRESS_BAR_MAX)
        bar = WT_PROGRESS_BAR_MAX;
    if (p->total <= 0 || bar < 10)
        bar = 0;
    int len = 0;
    append(buf, size, &len, "%s", prefix);
    if (bar > 0) {
        int64_t d = done > p->total ? p->total : done;
        int fill = (int)(d * bar / p->total);
        append(buf, size, &len, "[");
        for (int i = 0; i < bar; i++)
            append(buf, size, &len, "%c", i < fill ? '=' : i == fill ? '>' : ' ');
        append(buf, size, &len, "] ");
    }
    append(buf, size, &len, "%s%s", count, stats);
    return len;
}

/* Draws the line in place: '\r', the line, and blanks over what a longer last line left. */
static void draw(wt_progress *p, bool final)
{
    char line[LINE_MAX_BYTES];
    int len = wt_progress_format(p, final, line, sizeof line);
    if (p->o.mode == WT_PROGRESS_TTY) {
        /* An in-place line must not wrap: '\r' goes back to the start of the last row only,
         * so a wrapped line would leave a copy of its first rows at every redraw. */
        if (!final && len > p->width - 1) {
            /* Cut at the last field that fits whole ("  " separates fields). */
            int cut = p->width - 1;
            while (cut > 0 && !(line[cut] == ' ' && line[cut - 1] == ' '))
                cut--;
            while (cut > 0 && line[cut - 1] == ' ')
                cut--;
            len = cut > 0 ? cut : p->width - 1;
            line[len] = '\0';
        }
        int pad = p->drawn && p->drawn_len > len ? p->drawn_len - len : 0;
        fprintf(p->o.out, "\r%s%*s", line, pad, "");
        if (pad && !final)
            fprintf(p->o.out, "\r%s", line); /* the cursor back to the line's end */
        p->drawn = !final;
        p->drawn_len = len;
    } else {
        fputs(line, p->o.out);
    }
    if (final)
        fputc('\n', p->o.out);
    fflush(p->o.out);
}

void wt_progress_update(wt_progress *p, int64_t done, double loss, double acc)
{
    p->done = done;
    p->loss = loss;
    p->acc = acc;
    p->have_stats = true;
    if (p->o.quiet || p->o.mode != WT_PROGRESS_TTY)
        return;
    uint64_t t = now(p);
    if (p->drawn && t >= p->last_draw && t - p->last_draw < WT_PROGRESS_REDRAW_NS)
        return;
    p->last_draw = t;
    draw(p, false);
}

void wt_progress_end_note(wt_progress *p, const char *note)
{
    if (p->o.quiet)
        return;
    if (!note || !*note) {
        draw(p, true);
        return;
    }
    /* The note goes after the numbers; format through a copy with a narrower width so that
     * the bar shrinks to make room for it. */
    wt_progress q = *p;
    q.width -= (int)strlen(note) + 2;
    if (q.width < 1)
        q.width = 1;
    char line[LINE_MAX_BYTES];
    int len = wt_progress_format(&q, true, line, sizeof line);
    int pad =
        p->o.mode == WT_PROGRESS_TTY && p->drawn && p->drawn_len > len ? p->drawn_len - len : 0;
    pad -= (int)strlen(note) + 2;
    if (pad < 0)
        pad = 0;
    fprintf(p->o.out, "%s%s  %s%*s\n", p->o.mode == WT_PROGRESS_TTY ? "\r" : "", line, note, pad,
            "");
    fflush(p->o.out);
    p->drawn = false;
}

void wt_progress_end(wt_progress *p)
{
    wt_progress_end_note(p, NULL);
}
