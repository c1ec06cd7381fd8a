/* tools/trace_report.c: weft-trace's output: tables for a person, or one JSON object with
 * the same numbers (its keys are listed in weft-trace.c). Times in the JSON are
 * microseconds, as in the trace; tables use ms and us.
 * Owns: the layout, and which kinds count as transfers (copy, send and recv nodes, whose
 * spans carry their times; the network transfers, "cat":"transfer", carry their bytes too).
 * Not here: the numbers (trace_analyze.c). */
#include "trace_data.h"

#include <string.h>

static bool is_transfer(const char *kind)
{
    return strcmp(kind, "copy") == 0 || strcmp(kind, "send") == 0 || strcmp(kind, "recv") == 0;
}

static double pct(double part, double whole)
{
    return whole > 0 ? 100 * part / whole : 0;
}

static const char *thread_name(const tr_trace *t, const tr_worker_stat *w, char *buf, size_t len)
{
    if (w->name >= 0)
        return t->str[w->name];
    snprintf(buf, len, "tid %d", w->tid);
    return buf;
}

void tr_json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

void tr_report_text(FILE *f, const tr_trace *t, const tr_summary *s, const char *path)
{
    double span = s->t1 - s->t0;
    fprintf(f,
            "%s: %zu events, %d workers, %.3f ms traced; busy %.3f ms (%.1f%% of %d x %.3f ms)\n",
            path, t->n, s->nworkers, span / 1e3, s->busy / 1e3,
            pct(s->busy, span * (s->nworkers ? s->nworkers : 1)), s->nworkers, span / 1e3);

    fprintf(f, "\ntime per op kind (self time: a task's time excludes what ran nested in it)\n");
    fprintf(f, "  %-28s %9s %12s %11s %7s\n", "kind", "count", "total ms", "mean us", "% busy");
    double sum = 0;
    for (int i = 0; i < s->nkinds; i++) {
        const tr_kind_stat *k = &s->kinds[i];
        sum += k->total;
        fprintf(f, "  %-28.28s %9ld %12.3f %11.2f %7.1f\n", t->str[k->kind], k->count,
                k->total / 1e3, k->count ? k->total / (double)k->count : 0, pct(k->total, s->busy));
    }
    fprintf(f, "  %-28s %9s %12.3f %11s %7.1f\n", "(all kinds)", "", sum / 1e3, "",
            pct(sum, s->busy));

    fprintf(f, "\nworkers (idle: the traced %.3f ms less busy; stolen: steals per task run)\n",
            span / 1e3);
    fprintf(f, "  %-22s %9s %7s %7s %10s %7s %9s %8s %8s\n", "worker", "busy ms", "busy %",
            "idle %", "parked ms", "parks", "tasks", "steals", "stolen %");
    for (int i = 0; i < s->nworkers; i++) {
        const tr_worker_stat *w = &s->workers[i];
        char b[32];
        fprintf(f, "  %-22.22s %9.3f %7.1f %7.1f %10.3f %7ld %9ld %8ld %8.1f\n",
                thread_name(t, w, b, sizeof b), w->busy / 1e3, pct(w->busy, span),
                pct(span - w->busy, span), w->park / 1e3, w->parks, w->tasks, w->steals,
                pct((double)w->steals, (double)w->tasks));
    }

    if (s->steps == 0) {
        fprintf(f, "\nsteps: none (no task graph nodes with \"graph\" and \"run\" args; traces "
                   "from weft before these were added have none)\n");
    } else {
        const tr_run *r = &s->runs[s->step];
        fprintf(f,
                "\nsteps: graph %u ran %ld times in the trace: mean %.3f ms, median %.3f, min "
                "%.3f, max %.3f\n",
                s->graph, s->steps, s->step_mean / 1e3, s->step_median / 1e3, s->step_min / 1e3,
                s->step_max / 1e3);
        double busy = 0, wait = 0;
        for (int i = 0; i < s->npath; i++) {
            busy += t->ev[s->path[i].ev].dur;
            wait += s->path[i].wait;
        }
        fprintf(f,
                "critical path of run %u, a step of %.3f ms: %s: %d nodes, %.3f ms of work, "
                "%.3f ms of waits before them%s\n",
                r->run, (r->t1 - r->t0) / 1e3,
                s->by_after ? "the chain of the predecessors that released each node, from the "
                              "run's last (the trace has no \"crit\" links)"
                            : "its longest chain of dependent work (the span)",
                s->npath, busy / 1e3, wait / 1e3,
                s->path_cut ? " (cut: an earlier node's event was overwritten in the ring)" : "");
        fprintf(f, "  %10s %10s %9s %6s  %-22s %s\n", "start us", "dur us", "wait us", "worker",
                "kind", "node");
        const int show = 40;
        for (int i = 0; i < s->npath; i++) {
            if (s->npath > show && i == show / 2) {
                fprintf(f, "  ... %d more ...\n", s->npath - show);
                i = s->npath - show / 2;
            }
            const tr_event *e = &t->ev[s->path[i].ev];
            fprintf(f, "  %10.2f %10.2f %9.2f %6d  %-22.22s %s\n", e->ts - r->t0, e->dur,
                    s->path[i].wait, e->tid, e->kind >= 0 ? t->str[e->kind] : "", t->str[e->name]);
        }
        fprintf(f,
                "the critical paths' work in all %ld steps: %.1f%% of the steps' time; by "
                "kind:",
                s->steps, pct(s->path_busy_all, s->step_total_all));
        for (int i = 0; i < s->npkind && i < 8; i++)
            fprintf(f, "%s %s %.1f%%", i ? "," : "", t->str[s->pkind[i].kind],
                    pct(s->pkind[i].total, s->path_busy_all));
        fprintf(f, "\n");
    }

    int nt = 0;
    for (int i = 0; i < s->nkinds; i++)
        nt += is_transfer(t->str[s->kinds[i].kind]);
    if (!nt && !s->nxfers) {
        fprintf(f, "\ntransfers: none in the trace (copy, send and recv nodes, network "
                   "transfers)\n");
    }
    if (s->nxfers) {
        fprintf(f, "\nnetwork transfers (by direction; not busy time: a worker runs tasks while "
                   "they last)\n");
        fprintf(f, "  %-28s %9s %14s %12s %11s\n", "name", "count", "bytes", "total ms", "mean us");
        for (int i = 0; i < s->nxfers; i++) {
            const tr_xfer_stat *x = &s->xfers[i];
            fprintf(f, "  %-28.28s %9ld %14.0f %12.3f %11.2f\n", t->str[x->name], x->count,
                    x->bytes, x->total / 1e3, x->total / (double)x->count);
        }
    }
    if (nt) {
        fprintf(f, "\ntransfers (copy, send and recv nodes; the trace has their time, not "
                   "their bytes)\n");
        for (int i = 0; i < s->nkinds; i++)
            if (is_transfer(t->str[s->kinds[i].kind]))
                fprintf(f, "  %-28s %9ld %12.3f ms %11.2f us mean\n", t->str[s->kinds[i].kind],
                        s->kinds[i].count, s->kinds[i].total / 1e3,
                        s->kinds[i].total / (double)s->kinds[i].count);
    }
}

static void json_kinds(FILE *f, const tr_trace *t, const tr_kind_stat *k, int n, bool transfers)
{
    fputc('[', f);
    bool first = true;
    for (int i = 0; i < n; i++) {
        if (transfers && !is_transfer(t->str[k[i].kind]))
            continue;
        fprintf(f, "%s{\"kind\":", first ? "" : ",");
        tr_json_str(f, t->str[k[i].kind]);
        fprintf(f, ",\"count\":%ld,\"total_us\":%.3f,\"mean_us\":%.3f}", k[i].count, k[i].total,
                k[i].count ? k[i].total / (double)k[i].count : 0);
        first = false;
    }
    fputc(']', f);
}

void tr_report_json(FILE *f, const tr_trace *t, const tr_summary *s, const char *path)
{
    fprintf(f, "{\"file\":");
    tr_json_str(f, path);
    fprintf(f, ",\"events\":%zu,\"t0_us\":%.3f,\"t1_us\":%.3f,\"busy_us\":%.3f,\"ops\":", t->n,
            s->t0, s->t1, s->busy);
    json_kinds(f, t, s->kinds, s->nkinds, false);
    fprintf(f, ",\"workers\":[");
    for (int i = 0; i < s->nworkers; i++) {
        const tr_worker_stat *w = &s->workers[i];
        char b[32];
        fprintf(f, "%s{\"tid\":%d,\"name\":", i ? "," : "", w->tid);
        tr_json_str(f, thread_name(t, w, b, sizeof b));
        fprintf(f,
                ",\"busy_us\":%.3f,\"idle_us\":%.3f,\"park_us\":%.3f,\"parks\":%ld,\"tasks\":%ld,"
                "\"steals\":%ld}",
                w->busy, (s->t1 - s->t0) - w->busy, w->park, w->parks, w->tasks, w->steals);
    }
    fprintf(f, "],\"transfers\":");
    json_kinds(f, t, s->kinds, s->nkinds, true);
    fprintf(f, ",\"network_transfers\":[");
    for (int i = 0; i < s->nxfers; i++) {
        const tr_xfer_stat *x = &s->xfers[i];
        fprintf(f, "%s{\"name\":", i ? "," : "");
        tr_json_str(f, t->str[x->name]);
        fprintf(f, ",\"count\":%ld,\"bytes\":%.0f,\"total_us\":%.3f,\"mean_us\":%.3f}", x->count,
                x->bytes, x->total, x->total / (double)x->count);
    }
    fputc(']', f);
    if (s->steps == 0) {
        fprintf(f, ",\"steps\":null}\n");
        return;
    }
    const tr_run *r = &s->runs[s->step];
    fprintf(f,
            ",\"steps\":{\"graph\":%u,\"runs\":%ld,\"mean_us\":%.3f,\"median_us\":%.3f,"
            "\"min_us\":%.3f,\"max_us\":%.3f,\"critical_path_share\":%.4f,"
            "\"critical_path_kinds\":",
            s->graph, s->steps, s->step_mean, s->step_median, s->step_min, s->step_max,
            s->step_total_all > 0 ? s->path_busy_all / s->step_total_all : 0);
    json_kinds(f, t, s->pkind, s->npkind, false);
    fprintf(f,
            "},\"critical_path\":{\"graph\":%u,\"run\":%u,\"t0_us\":%.3f,\"t1_us\":%.3f,"
            "\"cut\":%s,\"by\":\"%s\",\"nodes\":[",
            r->graph, r->run, r->t0, r->t1, s->path_cut ? "true" : "false",
            s->by_after ? "after" : "crit");
    for (int i = 0; i < s->npath; i++) {
        const tr_event *e = &t->ev[s->path[i].ev];
        fprintf(f, "%s{\"name\":", i ? "," : "");
        tr_json_str(f, t->str[e->name]);
        fprintf(f, ",\"kind\":");
        tr_json_str(f, e->kind >= 0 ? t->str[e->kind] : "");
        fprintf(f, ",\"node\":%d,\"tid\":%d,\"ts_us\":%.3f,\"dur_us\":%.3f,\"wait_us\":%.3f}",
                e->node, e->tid, e->ts, e->dur, s->path[i].wait);
    }
    fprintf(f, "]}}\n");
}
