/* tools/weft-trace.c: summarises a weft trace (the Chrome/Perfetto JSON file that
 * wf_runtime_trace_write() writes: WEFT_TRACE=FILE or weft-train --trace FILE):
 *   weft-trace trace.json                   time per op kind, workers' busy, idle and steals,
 *                                           steps and the critical path of one, transfers
 *   weft-trace --json trace.json            the same as one JSON object
 *   weft-trace --svg step.svg [--step N] [--graph G] trace.json   a timeline of one step
 * A file that is not valid JSON (cut short, say) is refused with the byte offset, line and
 * column of the first fault; the exit status is 1 then, 2 for bad options.
 * --json's keys (times in microseconds, as in the trace): file, events, t0_us, t1_us,
 *   busy_us; ops [{kind, count, total_us, mean_us}] (self times, by total); workers [{tid,
 *   name, busy_us, idle_us, park_us, parks, tasks, steals}]; transfers (as ops, the copy, send
 *   and recv kinds); network_transfers [{name, count, bytes, total_us, mean_us}] (the
 *   "cat":"transfer" spans, by name: "send", "recv"; not in busy_us nor ops); steps (null
 *   without graph runs, else {graph, runs, mean_us, median_us, min_us, max_us,
 *   critical_path_share, critical_path_kinds}); critical_path {graph, run, t0_us, t1_us, cut,
 *   by ("crit", or "after" for traces without crit links), nodes [{name, kind, node, tid,
 *   ts_us, dur_us, wait_us}]}.
 * trace_analyze.c defines each number.
 * Owns: the command line. The reading, the numbers and the outputs are trace_*.c. */
#include "trace_data.h"

#include <stdlib.h>
#include <string.h>

static void usage(FILE *f)
{
    fprintf(f,
            "usage: weft-trace [options] TRACE.json\n"
            "Summarises a weft trace (WEFT_TRACE=FILE, or weft-train --trace FILE): time per op\n"
            "kind, each worker's busy and idle time and steals, the steps (runs of a task graph)\n"
            "and the critical path of one, transfers.\n"
            "  --json          print the summary as one JSON object instead of tables\n"
            "  --svg OUT.svg   also draw a timeline of one step: a lane per worker, a box per\n"
            "                  task coloured by op kind, the critical path outlined, network\n"
            "                  transfers as hatched bands at the lane's foot\n"
            "  --step N        the step shown (run N of the graph; default: the median step)\n"
            "  --graph G       the task graph whose runs are the steps (default: the one that\n"
            "                  ran most often, e.g. a training step)\n"
            "  --help          this text\n");
}

static int parse_long(const char *opt, const char *v, long *out)
{
    char *end;
    long x = strtol(v, &end, 10);
    if (end == v || *end || x < 0) {
        fprintf(stderr, "weft-trace: %s %s: expected a number >= 0\n", opt, v);
        return -1;
    }
    *out = x;
    return 0;
}

int main(int argc, char **argv)
{
    const char *in = NULL, *svg = NULL;
    bool json = false;
    tr_opts o = { .graph = -1, .step = -1 };
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(a, "--json") == 0) {
            json = true;
        } else if (strcmp(a, "--svg") == 0 || strcmp(a, "--step") == 0 ||
                   strcmp(a, "--graph") == 0) {
            if (i + 1 >= argc) {
                fprintf(stderr, "weft-trace: %s needs a value\n", a);
                return 2;
            }
            const char *v = argv[++i];
            if (a[2] == 's' && a[3] == 'v')
                svg = v;
            else if (parse_long(a, v, a[2] == 's' ? &o.step : &o.graph) < 0)
                return 2;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "weft-trace: unknown option '%s' (--help lists them)\n", a);
            return 2;
        } else if (in) {
            fprintf(stderr, "weft-trace: one trace at a time ('%s' and '%s')\n", in, a);
            return 2;
        } else {
            in = a;
        }
    }
    if (!in) {
        usage(stderr);
        return 2;
    }
    char err[512];
    tr_trace t;
    if (tr_read(in, &t, err, sizeof err) < 0) {
        fprintf(stderr, "weft-trace: %s\n", err);
        return 1;
    }
    tr_summary s;
    if (tr_analyze(&t, &o, &s, err, sizeof err) < 0) {
        fprintf(stderr, "weft-trace: %s: %s\n", in, err);
        tr_free(&t);
        return 1;
    }
    int rc = 0;
    if (json)
        tr_report_json(stdout, &t, &s, in);
    else
        tr_report_text(stdout, &t, &s, in);
    if (svg) {
        if (s.steps == 0) {
            fprintf(stderr, "weft-trace: --svg %s: %s has no steps (task graph runs) to draw\n",
                    svg, in);
            rc = 1;
        } else if (tr_svg_write(svg, in, &t, &s, err, sizeof err) < 0) {
            fprintf(stderr, "weft-trace: --svg %s: %s\n", svg, err);
            rc = 1;
        } else if (!json) {
            printf("\ntimeline of run %u of graph %u in %s\n", s.runs[s.step].run, s.graph, svg);
        }
    }
    if (fflush(stdout) != 0 && rc == 0) {
        fprintf(stderr, "weft-trace: writing the summary failed\n");
        rc = 1;
    }
    tr_summary_free(&s);
    tr_free(&t);
    return rc;
}
