/* tools/trace_svg.c: weft-trace --svg: the timeline of one step as an SVG file a browser
 * opens. A lane per worker (every thread of the trace, even one idle during the step), a box
 * per task or actor turn that overlaps the step, coloured by op kind (the ten kinds with the
 * most time in the step get their own colour, the rest are grey), nested boxes (tasks run
 * while their parent waits) drawn inside their parent, parks as a thin grey band, steals as
 * ticks, network transfers as a hatched band along the foot of the lane of the worker that
 * recorded them (not boxes: they are not task time), the critical path outlined in black, a legend
 * and a time axis in microseconds from the step's start. Every box has a tooltip (<title>) with its
 * name, kind and duration. Owns: the layout and XML escaping. Not here: which step, and its
 * critical path (trace_analyze.c). */
#include "trace_data.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define WIDTH    1200
#define LEFT     160 /* lane labels */
#define RIGHT    30
#define TOP      64
#define LANE_H   34
#define LANE_GAP 8
#define NCOLORS  10
#define LEGEND_W 250 /* px per legend item */

/* Tableau 10, without its grey, which marks the other kinds. */
static const char *const palette[NCOLORS] = {
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
    "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#a0cbe8"
};
#define OTHER_COLOR "#bab0ac"

void tr_xml_text(FILE *f, const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    while (*p) {
        unsigned c = *p;
        int n = c < 0x80             ? 1
                : (c & 0xE0) == 0xC0 ? 2
                : (c & 0xF0) == 0xE0 ? 3
                : (c & 0xF8) == 0xF0 ? 4
                                     : 0;
        bool ok = n > 0 && (n > 1 || c >= 0x20 || c == '\t' || c == '\n');
        for (int i = 1; ok && i < n; i++)
            ok = (p[i] & 0xC0) == 0x80;
        if (!ok) { /* not a character XML allows: a control byte or broken UTF-8 */
            fputc('?', f);
            p++;
            continue;
        }
        if (c == '&')
            fputs("&amp;", f);
        else if (c == '<')
            fputs("&lt;", f);
        else if (c == '>')
            fputs("&gt;", f);
        else if (c == '"')
            fputs("&quot;", f);
        else if (c == '\'')
            fputs("&apos;", f);
        else
            fwrite(p, 1, (size_t)n, f);
        p += n;
    }
}

/* Cuts 's' to at most 'max' bytes, before a character rather than inside one. */
static void cut_utf8(char *s, size_t max)
{
    size_t n = strlen(s);
    if (n <= max)
        return;
    n = max;
    while (n > 0 && ((unsigned char)s[n] & 0xC0) == 0x80)
        n--; /* s[n] continues a character: cut before that character starts */
    s[n] = '\0';
}

/* A tick step of 1, 2 or 5 times a power of ten giving about 'want' ticks over 'range'. */
static double tick_step(double range, int want)
{
    double raw = range / want, p = pow(10, floor(log10(raw))), m = raw / p;
    return p * (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10);
}

typedef struct drawn {
    size_t ev;
    int depth;
} drawn;

static int by_lane_start(const void *a, const void *b, void *ev)
{
    const tr_event *x = (const tr_event *)ev + ((const drawn *)a)->ev,
                   *y = (const tr_event *)ev + ((const drawn *)b)->ev;
    if (x->tid != y->tid)
        return x->tid < y->tid ? -1 : 1;
    if (x->ts != y->ts)
        return x->ts < y->ts ? -1 : 1;
    return x->dur > y->dur ? -1 : x->dur < y->dur;
}

static int kind_of(const tr_trace *t, const tr_event *e)
{
    return e->kind >= 0 ? e->kind : e->name;
}

int tr_svg_write(const char *path, const char *trace_path, const tr_trace *t, const tr_summary *s,
                 char *err, size_t errlen)
{
    const tr_run *r = &s->runs[s->step];
    double len = r->t1 - r->t0 > 0 ? r->t1 - r->t0 : 1;
    double w0 = r->t0 - 0.01 * len, w1 = r->t1 + 0.01 * len; /* the window drawn */
    double plot_w = WIDTH - LEFT - RIGHT;
#define X(ts) (LEFT + ((ts)-w0) / (w1 - w0) * plot_w)
    drawn *d = malloc((t->n ? t->n : 1) * sizeof *d);
    size_t *stack = malloc((t->n ? t->n : 1) * sizeof *stack);
    double *ktime = calloc((size_t)t->nstr, sizeof *ktime);
    int *color = malloc((size_t)t->nstr * sizeof *color);
    bool *onpath = calloc(t->n ? t->n : 1, sizeof *onpath);
    FILE *f = NULL;
    int rc = -1;
    if (!d || !stack || !ktime || !color || !onpath) {
        snprintf(err, errlen, "no memory for %zu events", t->n);
        goto out;
    }
    size_t nd = 0;
    for (size_t i = 0; i < t->n; i++) {
        const tr_event *e = &t->ev[i];
        if (e->ts + e->dur < w0 || e->ts > w1 || e->cat == TR_OTHER)
            continue;
        d[nd++] = (drawn){ i, 0 };
        if (e->cat == TR_TASK || e->cat == TR_ACTOR) {
            double a = e->ts > r->t0 ? e->ts : r->t0, b = e->ts + e->dur;
            ktime[kind_of(t, e)] += (b < r->t1 ? b : r->t1) - a;
        }
    }
    qsort_r(d, nd, sizeof *d, by_lane_start, t->ev);
    for (size_t k = 0, top = 0; k < nd; k++) { /* nesting depth within each lane */
        const tr_event *e = &t->ev[d[k].ev];
        if (k > 0 && t->ev[d[k - 1].ev].tid != e->tid)
            top = 0;
        if (e->cat != TR_TASK && e->cat != TR_ACTOR)
            continue;
        while (top > 0 && t->ev[stack[top - 1]].ts + t->ev[stack[top - 1]].dur <= e->ts)
            top--;
        d[k].depth = (int)top;
        stack[top++] = d[k].ev;
    }
    for (int i = 0; i < s->npath; i++)
        onpath[s->path[i].ev] = true;
    /* the kinds with the most time in the step get the colours */
    int order[NCOLORS], norder = 0;
    for (int k = 0; k < t->nstr; k++)
        color[k] = -1;
    for (; norder < NCOLORS; norder++) {
        int best = -1;
        for (int k = 0; k < t->nstr; k++)
            if (ktime[k] > 0 && color[k] < 0 && (best < 0 || ktime[k] > ktime[best]))
                best = k;
        if (best < 0)
            break;
        color[best] = norder;
        order[norder] = best;
    }
    bool others = false;
    for (int k = 0; k < t->nstr; k++)
        others |= ktime[k] > 0 && color[k] < 0;

    f = fopen(path, "w");
    if (!f) {
        snprintf(err, errlen, "cannot open it for writing: %s", strerror(errno));
        goto out;
    }
    int lanes_h = s->nworkers * (LANE_H + LANE_GAP);
    int axis_y = TOP + lanes_h + 4;
    int nlegend = norder + others + 3; /* + network transfer + parked + critical path */
    int per_row = (WIDTH - LEFT - RIGHT) / LEGEND_W;
    int legend_y = axis_y + 52;
    int height = legend_y + ((nlegend + per_row - 1) / per_row) * 22 + 16;
    fprintf(f,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
            "viewBox=\"0 0 %d %d\" font-family=\"DejaVu Sans, Arial, sans-serif\" "
            "font-size=\"12\">\n"
            "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
            "<defs><pattern id=\"xfer\" width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\" "
            "patternTransform=\"rotate(45)\"><rect width=\"6\" height=\"6\" fill=\"#fff3c4\"/>"
            "<line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" stroke=\"#8a6d00\" stroke-width=\"3\"/>"
            "</pattern></defs>\n",
            WIDTH, height, WIDTH, height);
    fprintf(f,
            "<text x=\"%d\" y=\"24\" font-size=\"16\" font-weight=\"bold\">Step: run %u of "
            "task graph %u, %.3f ms, %d nodes</text>\n",
            LEFT, r->run, r->graph, len / 1e3, r->nodes);
    fprintf(f, "<text x=\"%d\" y=\"44\" fill=\"#555\">", LEFT);
    tr_xml_text(f, trace_path);
    fprintf(f, ": a trace of %zu events; critical path (%d nodes) outlined in black</text>\n", t->n,
            s->npath);
    /* lanes */
    for (int li = 0; li < s->nworkers; li++) {
        const tr_worker_stat *w = &s->workers[li];
        int y = TOP + li * (LANE_H + LANE_GAP);
        fprintf(f, "<g class=\"lane\" data-tid=\"%d\">\n", w->tid);
        fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%.0f\" height=\"%d\" fill=\"#f6f6f6\"/>\n",
                LEFT, y, plot_w, LANE_H);
        fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">", LEFT - 8, y + LANE_H / 2 + 4);
        if (w->name >= 0)
            tr_xml_text(f, t->str[w->name]);
        else
            fprintf(f, "tid %d", w->tid);
        fprintf(f, "</text>\n");
        for (size_t k = 0; k < nd; k++) {
            const tr_event *e = &t->ev[d[k].ev];
            if (e->tid != w->tid)
                continue;
            double x0 = X(e->ts < w0 ? w0 : e->ts),
                   x1 = X(e->ts + e->dur > w1 ? w1 : e->ts + e->dur);
            if (e->cat == TR_STEAL) {
                fprintf(f,
                        "<line x1=\"%.2f\" y1=\"%d\" x2=\"%.2f\" y2=\"%d\" stroke=\"#333\" "
                        "stroke-width=\"1\"><title>steal of ",
                        x0, y - 3, x0, y + 3);
                tr_xml_text(f, t->str[e->name]);
                fprintf(f, "</title></line>\n");
                continue;
            }
            if (e->cat == TR_XFER)
                continue; /* drawn over the boxes, below */
            if (e->cat == TR_PARK) {
                fprintf(f,
                        "<rect x=\"%.2f\" y=\"%d\" width=\"%.2f\" height=\"4\" "
                        "fill=\"#c8c8c8\"><title>parked %.2f us</title></rect>\n",
                        x0, y + LANE_H / 2 - 2, x1 - x0, e->dur);
                continue;
            }
            int depth = d[k].depth > 3 ? 3 : d[k].depth, inset = depth * 5;
            int kind = kind_of(t, e);
            const char *fill = color[kind] >= 0 ? palette[color[kind]] : OTHER_COLOR;
            double wd = x1 - x0 < 0.5 ? 0.5 : x1 - x0;
            fprintf(f,
                    "<rect class=\"task\" x=\"%.2f\" y=\"%d\" width=\"%.2f\" height=\"%d\" "
                    "fill=\"%s\"%s><title>",
                    x0, y + inset, wd, LANE_H - 2 * inset, fill,
                    onpath[d[k].ev] ? " stroke=\"black\" stroke-width=\"2\"" : "");
            tr_xml_text(f, t->str[e->name]);
            fprintf(f, " (");
            tr_xml_text(f, t->str[kind]);
            fprintf(f, "): %.2f us%s</title></rect>\n", e->dur,
                    onpath[d[k].ev] ? ", on the critical path" : "");
        }
        /* network transfers over the boxes: they overlap the task or actor turn running */
        for (size_t k = 0; k < nd; k++) {
            const tr_event *e = &t->ev[d[k].ev];
            if (e->tid != w->tid || e->cat != TR_XFER)
                continue;
            double x0 = X(e->ts < w0 ? w0 : e->ts),
                   x1 = X(e->ts + e->dur > w1 ? w1 : e->ts + e->dur);
            fprintf(f,
                    "<rect class=\"transfer\" x=\"%.2f\" y=\"%d\" width=\"%.2f\" "
                    "height=\"7\" fill=\"url(#xfer)\" stroke=\"#8a6d00\" "
                    "stroke-width=\"0.5\"><title>network transfer ",
                    x0, y + LANE_H - 7, x1 - x0 < 1 ? 1 : x1 - x0);
            tr_xml_text(f, t->str[e->name]);
            fprintf(f, ": %.0f bytes, %.2f us</title></rect>\n", e->bytes, e->dur);
        }
        /* Labels after the boxes, so that none is drawn over; each in the part of its box
         * before the first box nested in it, at ~7 px a character. */
        for (size_t k = 0; k < nd; k++) {
            const tr_event *e = &t->ev[d[k].ev];
            if (e->tid != w->tid || d[k].depth != 0 || (e->cat != TR_TASK && e->cat != TR_ACTOR))
                continue;
            double end = e->ts + e->dur;
            if (k + 1 < nd && t->ev[d[k + 1].ev].tid == e->tid && t->ev[d[k + 1].ev].ts < end)
                end = t->ev[d[k + 1].ev].ts; /* the first nested box */
            double x0 = X(e->ts < w0 ? w0 : e->ts), x1 = X(end > w1 ? w1 : end);
            int chars = (int)((x1 - x0 - 8) / 7);
            if (chars < 4)
                continue;
            char lab[64];
            snprintf(lab, sizeof lab, "%s", t->str[e->name]);
            cut_utf8(lab, (size_t)chars);
            fprintf(f,
                    "<text x=\"%.2f\" y=\"%d\" font-size=\"11\" fill=\"#111\" "
                    "pointer-events=\"none\">",
                    x0 + 4, y + LANE_H - 8);
            tr_xml_text(f, lab);
            fprintf(f, "</text>\n");
        }
        fprintf(f, "</g>\n");
    }
    /* time axis: microseconds from the step's start */
    fprintf(f,
            "<g class=\"axis\">\n<line x1=\"%d\" y1=\"%d\" x2=\"%.0f\" y2=\"%d\" "
            "stroke=\"#333\"/>\n",
            LEFT, axis_y, LEFT + plot_w, axis_y);
    double step = tick_step(w1 - w0, 10);
    for (double v = ceil((w0 - r->t0) / step) * step; r->t0 + v <= w1; v += step) {
        double x = X(r->t0 + v);
        fprintf(f, "<line x1=\"%.2f\" y1=\"%d\" x2=\"%.2f\" y2=\"%d\" stroke=\"#333\"/>\n", x,
                axis_y, x, axis_y + 5);
        fprintf(f, "<text x=\"%.2f\" y=\"%d\" text-anchor=\"middle\">%g</text>\n", x, axis_y + 18,
                fabs(v) < step / 2 ? 0 : v);
    }
    fprintf(f,
            "<text x=\"%.0f\" y=\"%d\" text-anchor=\"middle\">time from the step's start "
            "(us)</text>\n</g>\n",
            LEFT + plot_w / 2, axis_y + 38);
    /* legend */
    fprintf(f, "<g class=\"legend\">\n");
    for (int i = 0; i < nlegend; i++) {
        int x = LEFT + (i % per_row) * LEGEND_W, y = legend_y + (i / per_row) * 22;
        const char *label, *fill = "white", *extra = "";
        char ms[48];
        if (i < norder) {
            label = t->str[order[i]];
            fill = palette[i];
        } else if (i == norder && others) {
            label = "other kinds";
            fill = OTHER_COLOR;
        } else if (i == nlegend - 3) {
            label = "network transfer";
            fill = "url(#xfer)";
        } else if (i == nlegend - 2) {
            label = "parked";
            fill = "#c8c8c8";
        } else {
            label = "critical path";
            extra = " stroke=\"black\" stroke-width=\"2\"";
        }
        fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"14\" height=\"14\" fill=\"%s\"%s/>\n", x, y,
                fill, extra);
        fprintf(f, "<text x=\"%d\" y=\"%d\">", x + 20, y + 12);
        char cut[64]; /* a legend item is LEGEND_W px wide: room for its time too */
        snprintf(cut, sizeof cut, "%s", label);
        cut_utf8(cut, i < norder ? 22 : 30);
        tr_xml_text(f, cut);
        if (i < norder) {
            snprintf(ms, sizeof ms, " %.0f us", ktime[order[i]]);
            tr_xml_text(f, ms);
        }
        fprintf(f, "</text>\n");
    }
    fprintf(f, "</g>\n</svg>\n");
    rc = 0;
out:
#undef X
    if (f && (ferror(f) | fclose(f)) && rc == 0) {
        snprintf(err, errlen, "writing it failed");
        rc = -1;
    }
    free(d);
    free(stack);
    free(ktime);
    free(color);
    free(onpath);
    return rc;
}
