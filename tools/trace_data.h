/* tools/trace_data.h: weft-trace's model of a trace: the events of a Chrome/Perfetto trace
 * JSON file as weft writes it (sched/trace.c describes the format), read by trace_parse.c and
 * summarised by trace_analyze.c, then printed (trace_report.c) or drawn (trace_svg.c).
 * Owns: the event record, the string table (every name interned once) and the summary types.
 * Times are microseconds, as in the file. */
#ifndef WEFT_TOOLS_TRACE_DATA_H
#define WEFT_TOOLS_TRACE_DATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* TR_XFER: a network transfer ("cat":"transfer"), recorded by the worker that finished it;
 * not busy time (the worker may have run tasks meanwhile), reported apart from the ops. */
enum { TR_TASK, TR_ACTOR, TR_PARK, TR_STEAL, TR_XFER, TR_OTHER };

typedef struct tr_event {
    double ts, dur; /* start and length (0 for instants) */
    int tid;
    int name; /* string id */
    int kind; /* string id of args.kind, or -1 */
    uint8_t cat;
    bool chunk;     /* a parallel_for chunk run for node 'node' */
    uint32_t graph; /* 0: not a graph node */
    uint32_t run;
    int32_t node, after;
    int32_t crit; /* -2: the trace does not say (older traces: 'after' stands in) */
    double bytes; /* TR_XFER: args.bytes (0 when absent) */
} tr_event;

typedef struct tr_thread {
    int tid;
    int name; /* string id, or -1 when the trace names no such thread */
} tr_thread;

typedef struct tr_trace {
    tr_event *ev;
    size_t n, cap;
    tr_thread *threads;
    int nthreads, capthreads;
    /* interned strings: 'str[i]' is NUL-terminated; a hash table of ids finds them */
    char **str;
    int nstr, capstr;
    int *hash;
    size_t hashcap;
} tr_trace;

/* Reads 'path' into 't' (zeroed first). Returns 0, or -1 with a message naming the file and,
 * for bad JSON, the byte offset, line and column in 'err'. */
int tr_read(const char *path, tr_trace *t, char *err, size_t errlen);

/* Parses the 'len' bytes at 'text' (NUL after them) as read from 'name'. As tr_read(). */
int tr_parse(const char *text, size_t len, const char *name, tr_trace *t, char *err, size_t errlen);

void tr_free(tr_trace *t);

/* The id of the 'len' bytes at 's' in the string table (added if new), or -1 (no memory). */
int tr_intern(tr_trace *t, const char *s, size_t len);

/* ---- The summary --------------------------------------------------------------------------- */

typedef struct tr_kind_stat {
    int kind;     /* string id */
    long count;   /* events (chunks included) */
    double total; /* self time: nested events' time is theirs, not their parent's */
} tr_kind_stat;

/* The network transfers of one name (weft names them by direction: "send", "recv"). */
typedef struct tr_xfer_stat {
    int name;     /* string id */
    long count;   /* transfer events */
    double bytes; /* their args.bytes, summed */
    double total; /* their time, summed (they may overlap one another and tasks) */
} tr_xfer_stat;

typedef struct tr_worker_stat {
    int tid, name;
    double busy; /* union of task and actor spans */
    double park; /* time parked */
    long tasks, steals, parks;
} tr_worker_stat;

typedef struct tr_run {
    uint32_t graph, run;
    double t0, t1; /* first start, last end of its events */
    size_t first;  /* index of its first event in the analysis's by-run order */
    size_t count;
    int nodes; /* node events (chunks not counted) */
} tr_run;

typedef struct tr_path_node {
    size_t ev;   /* index into the trace's events */
    double wait; /* from its predecessor's end (or the run's start) to its start */
} tr_path_node;

/* A step's critical path is its longest chain of dependent work: from the node whose chain of
 * measured durations (its own and its critical predecessors', "crit" in the trace) is the
 * longest, back through "crit" to a root. Its work (the durations' sum) is the step's span:
 * no schedule of the same node times on any number of workers finishes sooner. */

typedef struct tr_summary {
    double t0, t1; /* the trace's extent */
    double busy;   /* all workers' busy time */
    tr_kind_stat *kinds;
    int nkinds;
    tr_xfer_stat *xfers; /* network transfers by name, by total time */
    int nxfers;
    tr_worker_stat *workers;
    int nworkers;
    tr_run *runs; /* every (graph, run) in the trace, by graph then run */
    size_t nruns;
    size_t *by_run; /* event indices grouped by run (see tr_run.first) */
    uint32_t graph; /* the graph whose runs are the steps (--graph, or the most runs) */
    long steps;     /* runs of 'graph' */
    double step_mean, step_median, step_min, step_max;
    size_t step;         /* the run shown: index into 'runs' */
    tr_path_node *path;  /* its critical path, from the first node to the last */
    int npath;           /* 0 when the trace has no graph nodes */
    bool path_cut;       /* a predecessor's event was not in the trace (overwritten) */
    tr_kind_stat *pkind; /* time on the critical paths of all steps, by kind */
    int npkind;
    double path_busy_all, step_total_all; /* over all steps: path work, step time */
    bool by_after; /* the trace has no "crit": the path follows "after" (what released each
                    * node) from the run's last node instead */
} tr_summary;

typedef struct tr_opts {
    long graph; /* -1: the graph with the most runs */
    long step;  /* -1: the run of median length */
} tr_opts;

/* Summarises 't'. Returns 0, or -1 with the reason in 'err' (no memory; --graph or --step
 * names a graph or run that is not in the trace). */
int tr_analyze(const tr_trace *t, const tr_opts *o, tr_summary *s, char *err, size_t errlen);

void tr_summary_free(tr_summary *s);

/* Writes the summary as tables for a person, or as one JSON object. */
void tr_report_text(FILE *f, const tr_trace *t, const tr_summary *s, const char *path);
void tr_report_json(FILE *f, const tr_trace *t, const tr_summary *s, const char *path);

/* Writes the timeline of the summary's step as SVG: a lane per worker, a box per event
 * coloured by kind, the critical path outlined, a legend and a time axis. Returns 0 or -1
 * (the file could not be written; 'err' says why). */
int tr_svg_write(const char *path, const char *trace_path, const tr_trace *t, const tr_summary *s,
                 char *err, size_t errlen);

/* Writes 's' escaped for XML text and attribute values. */
void tr_xml_text(FILE *f, const char *s);

/* Writes 's' as a JSON string. */
void tr_json_str(FILE *f, const char *s);

#endif /* WEFT_TOOLS_TRACE_DATA_H */
