/* examples/weft-train/plot.c: the SVG of weft-train --plot (plot.h says what it shows).
 * Layout: 960 x 680 px; a title line, a legend line, then the loss panel over the accuracy
 * panel, both over the same step axis. Axis ranges are widened to round numbers (1, 2 or 5
 * times a power of ten) and ticks placed on them. Non-finite values are left out of the
 * lines (a diverged step still has its log line). The train lines carry class="train-loss"
 * and "train-accuracy" with one point per recorded step, and every evaluation is a
 * <circle class="test-loss"> and "test-accuracy", so a test can count them.
 * Owns: the layout and the XML escaping. Not here: the numbers (weft-train.c). */
#include "plot.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define W       960
#define H       680
#define PLEFT   84 /* the panels' left edge: room for the y tick labels and the axis name */
#define PRIGHT  24
#define PANEL_H 230
#define PTOP1   86  /* the loss panel's top */
#define PTOP2   370 /* the accuracy panel's top */

#define TRAIN_COLOR "#1f77b4"
#define TEST_COLOR  "#d62728"

int wt_plot_open(wt_plot *p, const char *path, char *err, size_t errlen)
{
    memset(p, 0, sizeof *p);
    snprintf(p->path, sizeof p->path, "%s", path);
    if (!(p->f = fopen(path, "w"))) {
        snprintf(err, errlen, "--plot %s: cannot open it for writing: %s", path, strerror(errno));
        return -1;
    }
    return 0;
}

static int push(wt_series *s, double x, double y)
{
    if (s->n == s->cap) {
        long cap = s->cap ? 2 * s->cap : 1024;
        double *nx = realloc(s->x, (size_t)cap * sizeof *nx);
        if (!nx)
            return -1;
        s->x = nx;
        double *ny = realloc(s->y, (size_t)cap * sizeof *ny);
        if (!ny)
            return -1;
        s->y = ny;
        s->cap = cap;
    }
    s->x[s->n] = x;
    s->y[s->n++] = y;
    return 0;
}

int wt_plot_step(wt_plot *p, long step, double loss, double acc)
{
    return push(&p->train_loss, (double)step, loss) < 0 ||
                   push(&p->train_acc, (double)step, 100 * acc) < 0
               ? -1
               : 0;
}

int wt_plot_eval(wt_plot *p, long step, double loss, double acc)
{
    return push(&p->test_loss, (double)step, loss) < 0 ||
                   push(&p->test_acc, (double)step, 100 * acc) < 0
               ? -1
               : 0;
}

void wt_xml_escape(FILE *f, const char *s)
{
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        int len = *p < 0x80                 ? 1
                  : *p >= 0xC2 && *p < 0xE0 ? 2
                  : *p >= 0xE0 && *p < 0xF0 ? 3
                  : *p >= 0xF0 && *p < 0xF5 ? 4
                                            : 0;
        for (int i = 1; i < len; i++)
            if ((p[i] & 0xC0) != 0x80)
                len = 0; /* a sequence cut short */
        if (len == 0 || (len == 1 && *p < 0x20 && *p != '\t' && *p != '\n')) {
            fputc('?', f);
            p++;
        } else if (len > 1) {
            fwrite(p, 1, (size_t)len, f);
            p += len;
        } else {
            switch (*p) {
            case '<':
                fputs("&lt;", f);
                break;
            case '>':
                fputs("&gt;", f);
                break;
            case '&':
                fputs("&amp;", f);
                break;
            case '"':
                fputs("&quot;", f);
                break;
            case '\'':
                fputs("&#39;", f);
                break;
            default:
                fputc(*p, f);
            }
            p++;
        }
    }
}

/* An axis: [lo, hi] widened to multiples of a round 'tick'. */
typedef struct axis {
    double lo, hi, tick;
} axis;

static axis round_axis(double lo, double hi, int ticks)
{
    if (!(hi > lo)) { /* one value, or none: a unit around it */
        lo = isfinite(lo) ? lo - 0.5 : 0;
        hi = lo + 1;
    }
    double raw = (hi - lo) / ticks, mag = pow(10, floor(log10(raw))), r = raw / mag;
    double tick = mag * (r <= 1 ? 1 : r <= 2 ? 2 : r <= 5 ? 5 : 10);
    return (axis){ floor(lo / tick) * tick, ceil(hi / tick) * tick, tick };
}

static void range(const wt_series *s, double *lo, double *hi)
{
    for (long i = 0; i < s->n; i++)
        if (isfinite(s->y[i])) {
            *lo = fmin(*lo, s->y[i]);
            *hi = fmax(*hi, s->y[i]);
        }
}

typedef struct panel {
    int top;
    axis x, y;
} panel;

static double px(const panel *p, double x)
{
    return PLEFT + (x - p->x.lo) / (p->x.hi - p->x.lo) * (W - PLEFT - PRIGHT);
}

static double py(const panel *p, double y)
{
    return p->top + PANEL_H - (y - p->y.lo) / (p->y.hi - p->y.lo) * PANEL_H;
}

/* The frame, grid, ticks and labels of a panel. */
static void frame(FILE *f, const panel *p, const char *ylabel, bool xlabel)
{
    int right = W - PRIGHT, bottom = p->top + PANEL_H;
    fprintf(f,
            "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"#fafafa\" "
            "stroke=\"#999\"/>\n",
            PLEFT, p->top, right - PLEFT, PANEL_H);
    for (double v = p->y.lo; v <= p->y.hi + p->y.tick / 2; v += p->y.tick) {
        double y = py(p, v);
        fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#e4e4e4\"/>\n",
                PLEFT, y, right, y);
        fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#333\"/>\n",
                PLEFT - 5, y, PLEFT, y);
        fprintf(f, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%g</text>\n", PLEFT - 8, y + 4,
                fabs(v) < p->y.tick / 1e6 ? 0 : v);
    }
    for (double v = p->x.lo; v <= p->x.hi + p->x.tick / 2; v += p->x.tick) {
        double x = px(p, v);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#e4e4e4\"/>\n", x,
                p->top, x, bottom);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#333\"/>\n", x,
                bottom, x, bottom + 5);
        fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%g</text>\n", x, bottom + 18,
                v);
    }
    fprintf(f, "<text transform=\"translate(%d %d) rotate(-90)\" text-anchor=\"middle\">", 22,
            p->top + PANEL_H / 2);
    wt_xml_escape(f, ylabel);
    fprintf(f, "</text>\n");
    if (xlabel)
        fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">step</text>\n",
                (PLEFT + right) / 2, bottom + 40);
}

static void polyline(FILE *f, const panel *p, const wt_series *s, const char *cls,
                     const char *style)
{
    fprintf(f, "<polyline class=\"%s\" fill=\"none\" %s points=\"", cls, style);
    for (long i = 0; i < s->n; i++)
        if (isfinite(s->y[i]))
            fprintf(f, "%s%.2f,%.2f", i ? " " : "", px(p, s->x[i]), py(p, s->y[i]));
    fprintf(f, "\"/>\n");
}

/* The mean of 's' over a window of 'span' points centred on each point (cut at the ends), into
 * 'out' (same x). Centred, so the average does not lag behind the values as a running one
 * does. */
static int smooth(const wt_series *s, long span, wt_series *out)
{
    double *sum = malloc((size_t)(s->n + 1) * sizeof *sum);
    long *cnt = malloc((size_t)(s->n + 1) * sizeof *cnt);
    int rc = sum && cnt ? 0 : -1;
    if (rc == 0) {
        sum[0] = 0;
        cnt[0] = 0;
    }
    for (long i = 0; rc == 0 && i < s->n; i++) { /* prefix sums of the finite values */
        bool ok = isfinite(s->y[i]);
        sum[i + 1] = sum[i] + (ok ? s->y[i] : 0);
        cnt[i + 1] = cnt[i] + ok;
    }
    for (long i = 0; rc == 0 && i < s->n; i++) {
        long lo = i - span / 2 < 0 ? 0 : i - span / 2;
        long hi = i + span / 2 + 1 > s->n ? s->n : i + span / 2 + 1;
        long c = cnt[hi] - cnt[lo];
        rc = push(out, s->x[i], c ? (sum[hi] - sum[lo]) / (double)c : NAN);
    }
    free(sum);
    free(cnt);
    return rc;
}

static void dots(FILE *f, const panel *p, const wt_series *s, const char *cls)
{
    if (s->n > 1)
        polyline(f, p, s, cls[5] == 'l' ? "test-loss-line" : "test-accuracy-line",
                 "stroke=\"" TEST_COLOR "\" stroke-width=\"1.5\"");
    for (long i = 0; i < s->n; i++)
        if (isfinite(s->y[i]))
            fprintf(f,
                    "<circle class=\"%s\" cx=\"%.2f\" cy=\"%.2f\" r=\"4\" fill=\"" TEST_COLOR
                    "\"><title>step %.0f: %.4g</title></circle>\n",
                    cls, px(p, s->x[i]), py(p, s->y[i]), s->x[i], s->y[i]);
}

static int write_svg(wt_plot *p, FILE *f, const char *title)
{
    double xlo = 0, xhi = 1, llo = 0, lhi = -INFINITY;
    for (long i = 0; i < p->train_loss.n; i++)
        xhi = fmax(xhi, p->train_loss.x[i]);
    for (long i = 0; i < p->test_loss.n; i++)
        xhi = fmax(xhi, p->test_loss.x[i]);
    range(&p->train_loss, &llo, &lhi);
    range(&p->test_loss, &llo, &lhi);
    panel loss = { PTOP1, round_axis(xlo, xhi, 10), round_axis(0, isfinite(lhi) ? lhi : 1, 5) };
    panel acc = { PTOP2, loss.x, { 0, 100, 20 } };
    /* A moving average when the steps are many (the per-step values are noisy): over about
     * a fiftieth of the run. */
    long span = p->train_loss.n / 50;
    wt_series sl = { 0 }, sa = { 0 };
    if (span >= 3 &&
        (smooth(&p->train_loss, span, &sl) < 0 || smooth(&p->train_acc, span, &sa) < 0)) {
        free(sl.x), free(sl.y), free(sa.x), free(sa.y);
        return -1;
    }
    fprintf(f,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 "
            "%d %d\" font-family=\"DejaVu Sans, Arial, sans-serif\" font-size=\"13\">\n"
            "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
            "<text x=\"%d\" y=\"28\" font-size=\"17\" font-weight=\"bold\">",
            W, H, W, H, PLEFT);
    wt_xml_escape(f, title);
    fprintf(f, "</text>\n");
    /* the legend: one line under the title */
    int lx = PLEFT, ly = 56;
    fprintf(f,
            "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"" TRAIN_COLOR
            "\" stroke-opacity=\"%s\" stroke-width=\"%s\"/>"
            "<text x=\"%d\" y=\"%d\">train, per step (%ld steps)</text>\n",
            lx, ly - 4, lx + 26, ly - 4, sl.n ? "0.35" : "1", sl.n ? "1" : "1.5", lx + 32, ly,
            p->train_loss.n);
    lx += 250;
    if (sl.n) {
        fprintf(f,
                "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"" TRAIN_COLOR
                "\" stroke-width=\"2.5\"/><text x=\"%d\" y=\"%d\">train, moving average "
                "(%ld steps)</text>\n",
                lx, ly - 4, lx + 26, ly - 4, lx + 32, ly, span);
        lx += 300;
    }
    fprintf(f,
            "<circle cx=\"%d\" cy=\"%d\" r=\"4\" fill=\"" TEST_COLOR "\"/><text x=\"%d\" "
            "y=\"%d\">test, per evaluation (%ld)</text>\n",
            lx + 13, ly - 4, lx + 32, ly, p->test_loss.n);

    frame(f, &loss, "loss (cross-entropy)", false);
    frame(f, &acc, "accuracy (%)", true);
    const char *raw = sl.n ? "stroke=\"" TRAIN_COLOR "\" stroke-opacity=\"0.35\" stroke-width=\"1\""
                           : "stroke=\"" TRAIN_COLOR "\" stroke-width=\"1.5\"";
    polyline(f, &loss, &p->train_loss, "train-loss", raw);
    polyline(f, &acc, &p->train_acc, "train-accuracy", raw);
    if (sl.n) {
        polyline(f, &loss, &sl, "train-loss-smooth",
                 "stroke=\"" TRAIN_COLOR "\" stroke-width=\"2.5\"");
        polyline(f, &acc, &sa, "train-accuracy-smooth",
                 "stroke=\"" TRAIN_COLOR "\" stroke-width=\"2.5\"");
    }
    dots(f, &loss, &p->test_loss, "test-loss");
    dots(f, &acc, &p->test_acc, "test-accuracy");
    fprintf(f, "</svg>\n");
    free(sl.x), free(sl.y), free(sa.x), free(sa.y);
    return 0;
}

int wt_plot_finish(wt_plot *p, const char *title, char *err, size_t errlen)
{
    FILE *f = p->f;
    p->f = NULL;
    if (!f) {
        snprintf(err, errlen, "--plot %s: not open", p->path);
        return -1;
    }
    int rc = write_svg(p, f, title);
    bool bad = ferror(f);
    if (fclose(f) != 0 || bad || rc < 0) {
        snprintf(err, errlen, "--plot %s: %s", p->path,
                 rc < 0 ? "no memory for the moving average" : "writing it failed");
        return -1;
    }
    return 0;
}

void wt_plot_free(wt_plot *p)
{
    if (p->f)
        fclose(p->f);
    p->f = NULL;
    wt_series *s[] = { &p->train_loss, &p->train_acc, &p->test_loss, &p->test_acc };
    for (int i = 0; i < 4; i++) {
        free(s[i]->x);
        free(s[i]->y);
        *s[i] = (wt_series){ 0 };
    }
}
