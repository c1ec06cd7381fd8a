/* sched/trace.c: per-worker trace rings and their export as Chrome trace JSON.
 * Owns: the event format and the writer. Each worker writes only its own ring, under the
 * ring's mutex (uncontended but for the writer: tracing costs ~30 ns an event anyway, and a
 * worker may record a park even while the runtime counts as idle); a full ring overwrites its
 * oldest events. Names and op kinds are copied into the event (at most 23 bytes, cut at a
 * UTF-8 character boundary), so the trace stays valid after the tasks' own strings are gone.
 * The format (what weft-trace reads): a task event ("cat":"task", "ph":"X") of a graph node
 * has args {"rc", "kind", "graph", "run", "node", "after", "crit"}: "after" is the
 * predecessor whose end made the node ready, "crit" the predecessor with the longest chain of
 * measured work (node durations) before it (-1 for a root; sched/taskgraph.c finds it as the
 * node becomes ready), so following "crit" back from the node with the most work gives the
 * run's critical path, its longest chain of dependent work. A parallel_for chunk run for a
 * node has {"kind", "graph", "run", "node", "chunk":1} instead. Steals are instants ("cat":"steal",
 * args "victim", "task"), parks and actor turns ("cat":"park" / "actor", args "messages") are
 * spans. Transfers (trace.h) are recorded by the modules above, on the worker that saw them
 * complete (the transport's actor), as spans from their post to their completion.
 * Not here: deciding what to record (worker.c, taskgraph.c, actor.c, pfor.c, callers of
 *   wf__trace_transfer()). */
#include "trace.h"

#include "internal.h"
#include "probes.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

/* Copies 's' (NULL: "") into 'dst' of 'cap' bytes, cut at a UTF-8 character boundary. */
static void copy_name(char *dst, size_t cap, const char *s)
{
    if (!s)
        s = "";
    size_t n = strlen(s);
    if (n >= cap) {
        n = cap - 1;
        while (n > 0 && ((unsigned char)s[n] & 0xC0) == 0x80)
            n--; /* s[n] continues a character: cut before that character starts */
    }
    memcpy(dst, s, n);
    dst[n] = '\0';
}

void wf__trace_event(wf__worker *w, uint32_t type, uint64_t t0, uint64_t t1, const char *name,
                     uint32_t arg, const wf__tctx *ctx)
{
    pthread_mutex_lock(&w->ring_mu);
    wf__tev *e = &w->ring[w->ring_head % w->rt->trace_cap];
    w->ring_head++;
    e->t0 = t0;
    e->t1 = t1;
    e->type = type;
    e->arg = arg;
    copy_name(e->name, sizeof e->name, name ? name : "task");
    if (ctx) {
        copy_name(e->kind, sizeof e->kind, ctx->kind);
        e->graph = ctx->graph;
        e->run = ctx->run;
        e->node = ctx->node;
        e->after = ctx->after;
        e->crit = ctx->crit;
        e->chunk = ctx->chunk;
    } else {
        e->kind[0] = '\0';
        e->graph = 0;
    }
    pthread_mutex_unlock(&w->ring_mu);
}

uint64_t wf__trace_clock(void)
{
    return wf__now_ns();
}

void wf__trace_transfer(wf_runtime *rt, const char *name, uint64_t t0, int peer, size_t bytes,
                        int is_recv)
{
    WF_PROBE3(transfer, peer, bytes, is_recv);
    wf__worker *w = rt ? wf__worker_of(rt) : NULL;
    if (!w || !w->ring)
        return;
    uint64_t t1 = wf__now_ns();
    if (t0 < rt->t_start || t0 > t1)
        t0 = t1;
    wf__trace_event(w, WF__EV_XFER, t0 - rt->t_start, t1 - rt->t_start, name,
                    bytes > UINT32_MAX ? UINT32_MAX : (uint32_t)bytes, NULL);
}

static void json_str(FILE *f, const char *s)
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

int wf_runtime_trace_write(wf_runtime *rt, const char *path)
{
    if (!rt || !path)
        return wf__err(WF_EINVAL, "wf_runtime_trace_write: %s is NULL", rt ? "path" : "rt");
    if (!rt->trace_cap)
        return wf__err(WF_EINVAL, "wf_runtime_trace_write: tracing is off "
                                  "(set wf_runtime_opts.trace_events, or WEFT_TRACE)");
    FILE *f = fopen(path, "w");
    if (!f)
        return wf__err(WF_EIO, "wf_runtime_trace_write: cannot open %s: %s", path, strerror(errno));
    int count = 0;
    fprintf(f, "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n");
    fprintf(f, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"args\":{\"name\":\"weft\"}}");
    for (int i = 0; i < rt->nw; i++) {
        wf__worker *w = rt->w[i];
        pthread_mutex_lock(&w->ring_mu);
        fprintf(f,
                ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":%d,"
                "\"args\":{\"name\":\"weft-w%d (numa %d)\"}}",
                i, i, w->numa);
        uint64_t n = w->ring_head < rt->trace_cap ? w->ring_head : rt->trace_cap;
        for (uint64_t k = w->ring_head - n; k < w->ring_head; k++) {
            const wf__tev *e = &w->ring[k % rt->trace_cap];
            fprintf(f, ",\n{\"name\":");
            json_str(f, e->type == WF__EV_STEAL ? "steal" : e->name);
            double ts = (double)e->t0 / 1e3, dur = (double)(e->t1 - e->t0) / 1e3;
            switch (e->type) {
            case WF__EV_STEAL:
                fprintf(f,
                        ",\"cat\":\"steal\",\"ph\":\"i\",\"s\":\"t\",\"pid\":1,\"tid\":%d,"
                        "\"ts\":%.3f,\"args\":{\"victim\":%u,\"task\":",
                        i, ts, e->arg);
                json_str(f, e->name);
                fputs("}}", f);
                break;
            case WF__EV_PARK:
                fprintf(f,
                        ",\"cat\":\"park\",\"ph\":\"X\",\"pid\":1,\"tid\":%d,\"ts\":%.3f,"
                        "\"dur\":%.3f}",
                        i, ts, dur);
                break;
            case WF__EV_ACTOR:
                fprintf(f,
                        ",\"cat\":\"actor\",\"ph\":\"X\",\"pid\":1,\"tid\":%d,\"ts\":%.3f,"
                        "\"dur\":%.3f,\"args\":{\"messages\":%u}}",
                        i, ts, dur, e->arg);
                break;
            case WF__EV_XFER:
                fprintf(f,
                        ",\"cat\":\"transfer\",\"ph\":\"X\",\"pid\":1,\"tid\":%d,\"ts\":%.3f,"
                        "\"dur\":%.3f,\"args\":{\"bytes\":%u}}",
                        i, ts, dur, e->arg);
                break;
            default:
                fprintf(f,
                        ",\"cat\":\"task\",\"ph\":\"X\",\"pid\":1,\"tid\":%d,\"ts\":%.3f,"
                        "\"dur\":%.3f,\"args\":{\"rc\":%d",
                        i, ts, dur, (int)e->arg);
                if (e->graph) {
                    fputs(",\"kind\":", f);
                    json_str(f, e->kind);
                    fprintf(f, ",\"graph\":%u,\"run\":%u,\"node\":%d", e->graph, e->run, e->node);
                    if (e->chunk)
                        fputs(",\"chunk\":1", f);
                    else
                        fprintf(f, ",\"after\":%d,\"crit\":%d", e->after, e->crit);
                }
                fputs("}}", f);
            }
            count++;
        }
        w->ring_head = 0;
        pthread_mutex_unlock(&w->ring_mu);
    }
    fprintf(f, "\n]}\n");
    int bad = ferror(f);
    if (fclose(f) != 0 || bad)
        return wf__err(WF_EIO, "wf_runtime_trace_write: writing %s failed", path);
    return count;
}
