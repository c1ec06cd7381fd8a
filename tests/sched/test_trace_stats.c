/* tests/sched/test_trace_stats.c: traces and counters. wf_runtime_trace_write() writes
 * Chrome trace JSON that parses (checked by a strict little parser below, also with task
 * names that need escaping), names the tasks, keeps at most 'trace_events' per worker,
 * empties the rings, and fails with WF_EINVAL when tracing is off and WF_EIO on a bad path.
 * The counters: tasks run, spawned, inbox, actor messages, steals (none with one worker;
 * local + remote = won <= tried), and reset, which zeroes counters but keeps numa and cpu;
 * idle workers park and count their time asleep (a sleep still going on included, from the
 * last reset on), and a wide graph from one worker reaches
 * the other by stealing. */
#include "wf_test.h"

#include <weft/weft.h>

#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

TestSuite(sched_trace, .fini = wf_test_fini, .timeout = WF_TEST_TIMEOUT(60));
TestSuite(sched_stats, .fini = wf_test_fini, .timeout = WF_TEST_TIMEOUT(60));

/* ---- A strict JSON parser (RFC 8259 grammar; no semantics) ---------------------------- */

typedef struct json {
    const char *p, *end;
    const char *error;
    int depth;
} json;

static void ws(json *j)
{
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r'))
        j->p++;
}

static bool fail(json *j, const char *why)
{
    if (!j->error)
        j->error = why;
    return false;
}

static bool lit(json *j, const char *word)
{
    size_t n = strlen(word);
    if ((size_t)(j->end - j->p) < n || memcmp(j->p, word, n) != 0)
        return fail(j, "bad literal");
    j->p += n;
    return true;
}

static bool string(json *j)
{
    j->p++; /* '"' */
    while (j->p < j->end && *j->p != '"') {
        unsigned char c = (unsigned char)*j->p;
        if (c < 0x20)
            return fail(j, "control character in a string");
        if (c >= 0x80) { /* RFC 8259 section 8.1: UTF-8, well formed */
            int more = c >= 0xf0 && c <= 0xf4 ? 3 : c >= 0xe0 ? 2 : c >= 0xc2 && c <= 0xdf ? 1 : -1;
            if (more < 0 || c > 0xf4)
                return fail(j, "a byte that cannot start a UTF-8 sequence");
            for (int k = 1; k <= more; k++)
                if (j->p + k >= j->end || ((unsigned char)j->p[k] & 0xc0) != 0x80)
                    return fail(j, "a UTF-8 sequence cut short");
            j->p += more + 1;
            continue;
        }
        if (c == '\\') {
            j->p++;
            if (j->p >= j->end)
                return fail(j, "unterminated escape");
            char e = *j->p;
            if (e == 'u') {
                for (int k = 1; k <= 4; k++)
                    if (j->p + k >= j->end || !strchr("0123456789abcdefABCDEF", j->p[k]))
                        return fail(j, "bad \\u escape");
                j->p += 4;
            } else if (!strchr("\"\\/bfnrt", e)) {
                return fail(j, "bad escape");
            }
        }
        j->p++;
    }
    if (j->p >= j->end)
        return fail(j, "unterminated string");
    j->p++;
    return true;
}

static bool number(json *j)
{
    const char *s = j->p;
    if (*j->p == '-')
        j->p++;
    if (j->p >= j->end || *j->p < '0' || *j->p > '9')
        return fail(j, "bad number");
    if (*j->p == '0')
        j->p++;
    else
        while (j->p < j->end && *j->p >= '0' && *j->p <= '9')
            j->p++;
    if (j->p < j->end && *j->p == '.') {
        j->p++;
        if (j->p >= j->end || *j->p < '0' || *j->p > '9')
            return fail(j, "bad fraction");
        while (j->p < j->end && *j->p >= '0' && *j->p <= '9')
            j->p++;
    }
    if (j->p < j->end && (*j->p == 'e' || *j->p == 'E')) {
        j->p++;
        if (j->p < j->end && (*j->p == '+' || *j->p == '-'))
            j->p++;
        if (j->p >= j->end || *j->p < '0' || *j->p > '9')
            return fail(j, "bad exponent");
        while (j->p < j->end && *j->p >= '0' && *j->p <= '9')
            j->p++;
    }
    return j->p > s;
}

static bool value(json *j);

static bool members(json *j, char close, bool keyed)
{
    j->p++; /* '{' or '[' */
    if (++j->depth > 64)
        return fail(j, "nested too deep");
    ws(j);
    if (j->p < j->end && *j->p == close) {
        j->p++;
        j->depth--;
        return true;
    }
    for (;;) {
        ws(j);
        if (keyed) {
            if (j->p >= j->end || *j->p != '"')
                return fail(j, "expected a key");
            if (!string(j))
                return false;
            ws(j);
            if (j->p >= j->end || *j->p != ':')
                return fail(j, "expected ':'");
            j->p++;
        }
        if (!value(j))
            return false;
        ws(j);
        if (j->p < j->end && *j->p == ',') {
            j->p++;
            continue;
        }
        if (j->p < j->end && *j->p == close) {
            j->p++;
            j->depth--;
            return true;
        }
        return fail(j, keyed ? "expected ',' or '}'" : "expected ',' or ']'");
    }
}

static bool value(json *j)
{
    ws(j);
    if (j->p >= j->end)
        return fail(j, "unexpected end");
    switch (*j->p) {
    case '{':
        return members(j, '}', true);
    case '[':
        return members(j, ']', false);
    case '"':
        return string(j);
    case 't':
        return lit(j, "true");
    case 'f':
        return lit(j, "false");
    case 'n':
        return lit(j, "null");
    default:
        return number(j);
    }
}

/* Returns NULL when 'text' is one valid JSON value, else what is wrong and where. */
static const char *json_error(const char *text, size_t len, size_t *at)
{
    json j = { text, text + len, NULL, 0 };
    if (value(&j)) {
        ws(&j);
        if (j.p != j.end)
            fail(&j, "trailing characters");
    }
    *at = (size_t)(j.p - text);
    return j.error;
}

/* ---- Helpers ------------------------------------------------------------------------------ */

typedef struct tmpfile_path {
    char path[64];
} tmpfile_path;

static tmpfile_path temp_path(void)
{
    tmpfile_path t;
    snprintf(t.path, sizeof t.path, "/tmp/weft-test-trace-XXXXXX");
    int fd = mkstemp(t.path);
    cr_assert_geq(fd, 0, "mkstemp");
    close(fd);
    return t;
}

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    cr_assert_not_null(buf);
    cr_assert_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
    buf[n] = '\0';
    fclose(f);
    *len = (size_t)n;
    return buf;
}

static int count_task(void *arg)
{
    atomic_fetch_add((atomic_long *)arg, 1);
    return 0;
}

/* Spawns 'n' tasks named 'name' from outside and waits. */
static void run_named(wf_runtime *rt, const char *name, int n)
{
    wf_group g;
    atomic_long count = 0;
    cr_assert_eq(wf_group_init(&g, rt), 0);
    for (int i = 0; i < n; i++)
        cr_assert_eq(wf_spawn_named(&g, count_task, &count, name), 0);
    cr_assert_eq(wf_group_wait(&g), 0);
    cr_assert_eq(atomic_load(&count), n);
    wf_group_deinit(&g);
}

/* ---- Traces ---------------------------------------------------------------------------------- */

Test(sched_trace, trace_write_returns_the_events_written_and_names_the_tasks)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 2, .trace_events = 4096 });
    run_named(rt, "trace_probe", 100);
    tmpfile_path t = temp_path();
    int rc = wf_runtime_trace_write(rt, t.path);
    cr_assert_gt(rc, 0, "wf_runtime_trace_write: %s: %s", wf_err_name(rc), wf_last_errmsg());
    size_t len;
    char *text = slurp(t.path, &len);
    const char *p = text;
    while (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r')
        p++;
    cr_assert(*p == '{' || *p == '[', "the trace starts with '%c'", *p);
    cr_assert(strstr(text, "traceEvents") != NULL, "no \"traceEvents\" in the trace");
    cr_assert(strstr(text, "trace_probe") != NULL, "the task name is not in the trace");
    free(text);
    unlink(t.path);
    wf_runtime_destroy(rt);
}

typedef struct mixed {
    wf_runtime *rt;
    wf_group *g;
    atomic_long count;
} mixed;

static int mixed_child(void *arg)
{
    atomic_fetch_add(&((mixed *)arg)->count, 1);
    wf_test_busy_ns(2000);
    return 0;
}

static int mixed_root(void *arg)
{
    mixed *m = arg;
    for (int i = 0; i < 2000; i++)
        if (wf_spawn_named(m->g, mixed_child, m, "child \"quoted\" \\ name") != 0)
            return WF_ENOMEM;
    return 0;
}

static int quiet_handler(wf_actor *a, wf_msg *msg, void *ctx)
{
    atomic_fetch_add((atomic_long *)ctx, 1);
    return 0;
}

static int graph_node(void *arg)
{
    return 0;
}

Test(sched_trace, the_trace_of_tasks_steals_actors_and_graphs_is_valid_json)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 4, .trace_events = 1 << 14 });
    wf_group g;
    cr_assert_eq(wf_group_init(&g, rt), 0);
    mixed m = { .rt = rt, .g = &g };
    cr_assert_eq(wf_spawn_named(&g, mixed_root, &m, "root"), 0);
    cr_assert_eq(wf_group_wait(&g), 0);
    /* An actor, with a name that needs escaping too. */
    atomic_long handled = 0;
    wf_actor *a;
    cr_assert_eq(wf_actor_create(rt,
                                 &(wf_actor_opts){ .handler = quiet_handler,
                                                   .ctx = &handled,
                                                   .name = "actor\twith\ttabs" },
                                 &a),
                 0);
    wf_msg msgs[50];
    for (int i = 0; i < 50; i++)
        cr_assert_eq(wf_actor_send(a, &msgs[i]), 0);
    cr_assert(wf_test_wait_for(&handled, 50, 10.0));
    wf_actor_destroy(a);
    /* A graph. */
    wf_taskgraph *tg;
    cr_assert_eq(wf_taskgraph_create(rt, &tg), 0);
    for (int i = 0; i < 20; i++) {
        cr_assert_eq(wf_taskgraph_add(tg, graph_node, NULL, "graph_node"), i);
        if (i > 0)
            cr_assert_eq(wf_taskgraph_precede(tg, i - 1, i), 0);
    }
    cr_assert_eq(wf_taskgraph_run(tg), 0);
    wf_taskgraph_destroy(tg);
    wf_test_sleep_us(20000); /* idle: workers park, which is traced too */

    tmpfile_path t = temp_path();
    int rc = wf_runtime_trace_write(rt, t.path);
    cr_assert_gt(rc, 0, "%s: %s", wf_err_name(rc), wf_last_errmsg());
    size_t len, at;
    char *text = slurp(t.path, &len);
    const char *err = json_error(text, len, &at);
    cr_assert_null(err, "the trace is not valid JSON: %s at byte %zu of %zu: \"%.60s\"", err, at,
                   len, text + (at > 20 ? at - 20 : 0));
    cr_assert(strstr(text, "graph_node") != NULL, "graph nodes are not in the trace");
    free(text);
    unlink(t.path);
    wf_group_deinit(&g);
    wf_runtime_destroy(rt);
}

static int busy_node(void *arg)
{
    wf_test_busy_ns(*(const uint64_t *)arg);
    return 0;
}

/* The fields of the trace event of node 'name' in run 'run' (a line of the file). */
typedef struct node_event {
    double ts, dur;
    int after, crit;
    bool kind_ok;
} node_event;

static node_event find_node_event(const char *text, const char *name, int run)
{
    char key[64], runkey[32];
    snprintf(key, sizeof key, "{\"name\":\"%s\",\"cat\":\"task\"", name);
    snprintf(runkey, sizeof runkey, "\"run\":%d,", run);
    for (const char *p = strstr(text, key); p; p = strstr(p + 1, key)) {
        const char *eol = strchr(p, '\n');
        size_t len = eol ? (size_t)(eol - p) : strlen(p);
        char line[512];
        cr_assert_lt(len, sizeof line, "an event line of %zu bytes", len);
        memcpy(line, p, len);
        line[len] = '\0';
        if (!strstr(line, runkey))
            continue;
        node_event e = { 0 };
        const char *ts = strstr(line, "\"ts\":"), *dur = strstr(line, "\"dur\":"),
                   *after = strstr(line, "\"after\":"), *crit = strstr(line, "\"crit\":");
        cr_assert(ts && dur && after && crit, "event without ts, dur, after or crit: %s", line);
        e.crit = (int)strtol(crit + 7, NULL, 10);
        e.ts = strtod(ts + 5, NULL);
        e.dur = strtod(dur + 6, NULL);
        e.after = (int)strtol(after + 8, NULL, 10);
        e.kind_ok = strstr(line, "\"kind\":\"k_") != NULL;
        return e;
    }
    cr_assert_fail("no event of node %s in run %d", name, run);
    return (node_event){ 0 };
}

/* A diamond a -> (b, c) -> d, run twice, b 3 ms long and c 1 us: every node event names its
 * kind, graph, run and node; d's "after" is whichever of b and c ended last, and its "crit"
 * (what weft-trace follows back as the critical path) is b, the one with more work before
 * d, whichever ended last; the root a has neither (-1). */
Test(sched_trace, graph_node_events_name_their_kind_run_and_critical_predecessor)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 2, .trace_events = 4096 });
    wf_taskgraph *tg;
    cr_assert_eq(wf_taskgraph_create(rt, &tg), 0);
    static const uint64_t ns[4] = { 1000, 3000000, 1000, 1000 };
    const char *names[4] = { "tg_a", "tg_b", "tg_c", "tg_d" };
    const char *kinds[4] = { "k_load", "k_slow", "k_fast", "k_join" };
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(wf_taskgraph_add(tg, busy_node, (void *)&ns[i], names[i]), i);
        cr_assert_eq(wf_taskgraph_set_kind(tg, i, kinds[i]), 0);
    }
    cr_assert_eq(wf_taskgraph_set_kind(tg, 4, "k_none"), WF_EINVAL);
    cr_assert_eq(wf_taskgraph_precede(tg, 0, 1), 0);
    cr_assert_eq(wf_taskgraph_precede(tg, 0, 2), 0);
    cr_assert_eq(wf_taskgraph_precede(tg, 1, 3), 0);
    cr_assert_eq(wf_taskgraph_precede(tg, 2, 3), 0);
    cr_assert_eq(wf_taskgraph_run(tg), 0);
    cr_assert_eq(wf_taskgraph_run(tg), 0);
    wf_taskgraph_destroy(tg);
    tmpfile_path t = temp_path();
    cr_assert_gt(wf_runtime_trace_write(rt, t.path), 0, "%s", wf_last_errmsg());
    size_t len, at;
    char *text = slurp(t.path, &len);
    cr_assert_null(json_error(text, len, &at), "the trace is not valid JSON at byte %zu", at);
    for (int run = 0; run < 2; run++) {
        node_event a = find_node_event(text, "tg_a", run), b = find_node_event(text, "tg_b", run),
                   c = find_node_event(text, "tg_c", run), d = find_node_event(text, "tg_d", run);
        cr_assert(a.kind_ok && b.kind_ok && c.kind_ok && d.kind_ok, "a kind is missing");
        cr_assert_eq(a.after, -1, "run %d: the root's after is %d", run, a.after);
        cr_assert_eq(a.crit, -1, "run %d: the root's crit is %d", run, a.crit);
        cr_assert_eq(c.crit, 0, "run %d: c's crit is %d", run, c.crit);
        cr_assert_eq(d.crit, 1, "run %d: d's crit is %d, not the slow b", run, d.crit);
        cr_assert_eq(b.after, 0, "run %d: b's after is %d", run, b.after);
        int last = b.ts + b.dur >= c.ts + c.dur ? 1 : 2;
        cr_assert_eq(d.after, last, "run %d: d's after is %d, but node %d ended last", run, d.after,
                     last);
    }
    free(text);
    unlink(t.path);
    wf_runtime_destroy(rt);
}

/* Names are cut to fit an event; a cut in the middle of a UTF-8 sequence would make the
 * file invalid JSON (RFC 8259 requires UTF-8), and strict readers refuse it. */
Test(sched_trace, long_utf8_task_names_stay_valid_utf8_in_the_trace)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 1, .trace_events = 256 });
    /* 2-byte characters, so that any cut at an odd length splits one. */
#define AOU  "\u00e4\u00f6\u00fc"       /* 6 bytes */
#define EURO "\u20ac\u20ac\u20ac\u20ac" /* 12 bytes */
    run_named(rt, AOU AOU AOU AOU AOU AOU, 10);
    run_named(rt, "x" AOU AOU AOU AOU AOU AOU, 10);
    run_named(rt, EURO EURO EURO, 10);
#undef AOU
#undef EURO
    tmpfile_path t = temp_path();
    int rc = wf_runtime_trace_write(rt, t.path);
    cr_assert_gt(rc, 0, "%s: %s", wf_err_name(rc), wf_last_errmsg());
    size_t len, at;
    char *text = slurp(t.path, &len);
    const char *err = json_error(text, len, &at);
    cr_assert_null(err, "the trace is not valid JSON: %s at byte %zu", err, at);
    free(text);
    unlink(t.path);
    wf_runtime_destroy(rt);
}

Test(sched_trace, trace_write_empties_the_rings)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 2, .trace_events = 4096 });
    run_named(rt, "before_first_write", 100);
    tmpfile_path t1 = temp_path(), t2 = temp_path();
    cr_assert_gt(wf_runtime_trace_write(rt, t1.path), 0, "%s", wf_last_errmsg());
    int rc = wf_runtime_trace_write(rt, t2.path);
    cr_assert_geq(rc, 0, "second write: %s: %s", wf_err_name(rc), wf_last_errmsg());
    size_t len;
    char *text = slurp(t2.path, &len);
    cr_assert(strstr(text, "before_first_write") == NULL,
              "the second write repeats events the first one wrote");
    free(text);
    unlink(t1.path);
    unlink(t2.path);
    wf_runtime_destroy(rt);
}

Test(sched_trace, the_trace_keeps_at_most_trace_events_per_worker_and_the_latest)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 1, .trace_events = 16 });
    run_named(rt, "early", 1000);
    run_named(rt, "late", 4);
    tmpfile_path t = temp_path();
    int rc = wf_runtime_trace_write(rt, t.path);
    /* 16 events, plus a few metadata records (thread names) if the writer counts them. */
    cr_assert(rc > 0 && rc <= 16 + 8, "one worker with 16 trace events wrote %d", rc);
    size_t len;
    char *text = slurp(t.path, &len);
    cr_assert(strstr(text, "late") != NULL, "the latest tasks are not in the trace");
    free(text);
    unlink(t.path);
    wf_runtime_destroy(rt);
}

Test(sched_trace, trace_write_with_tracing_off_fails_with_einval)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 1 });
    run_named(rt, "untraced", 10);
    cr_assert_eq(wf_runtime_trace_write(rt, "/tmp/weft-test-never-written.json"), WF_EINVAL);
    cr_assert_eq(access("/tmp/weft-test-never-written.json", F_OK), -1,
                 "a refused trace_write created the file");
    wf_runtime_destroy(rt);
}

Test(sched_trace, trace_write_to_a_bad_path_fails_with_eio_naming_it)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 1, .trace_events = 64 });
    run_named(rt, "probe", 10);
    const char *path = "/nonexistent-weft-dir/trace.json";
    int rc = wf_runtime_trace_write(rt, path);
    cr_assert_eq(rc, WF_EIO, "got %s", wf_err_name(rc));
    cr_assert(strstr(wf_last_errmsg(), path) != NULL, "message \"%s\" does not name the path",
              wf_last_errmsg());
    wf_runtime_destroy(rt);
}

/* ---- Counters -------------------------------------------------------------------------------- */

typedef struct fan {
    wf_group *g;
    long children;
    atomic_long count;
} fan;

static int fan_child(void *arg)
{
    atomic_fetch_add(&((fan *)arg)->count, 1);
    return 0;
}

static int fan_root(void *arg)
{
    fan *f = arg;
    for (long i = 0; i < f->children; i++)
        if (wf_spawn(f->g, fan_child, f) != 0)
            return WF_ENOMEM;
    return 0;
}

/* 'roots' tasks from outside, each spawning 'children' from its worker. Waits for the
 * counters to settle: a worker may count a task just after the waiter saw it finish. */
static void run_fan(wf_runtime *rt, int roots, long children)
{
    wf_group g;
    cr_assert_eq(wf_group_init(&g, rt), 0);
    fan f = { .g = &g, .children = children };
    for (int i = 0; i < roots; i++)
        cr_assert_eq(wf_spawn(&g, fan_root, &f), 0);
    cr_assert_eq(wf_group_wait(&g), 0);
    cr_assert_eq(atomic_load(&f.count), roots * children);
    wf_group_deinit(&g);
    wf_test_sleep_us(50000);
}

Test(sched_stats, tasks_run_counts_at_least_every_task)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 4 });
    run_fan(rt, 10, 1000);
    wf_worker_stats st[4];
    cr_assert_eq(wf_runtime_stats(rt, st, 4), 4);
    cr_assert_geq(WF_TEST_SUM(st, 4, tasks_run), 10 + 10 * 1000);
    wf_runtime_destroy(rt);
}

/* One root from outside pushes 100 children: few enough that no spawn runs inline (a worker
 * with a deep deque may run a spawn at once, and 'spawned' counts pushes only). */
Test(sched_stats, spawned_counts_the_tasks_pushed_by_workers)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 4 });
    run_fan(rt, 1, 100);
    wf_worker_stats st[4];
    cr_assert_eq(wf_runtime_stats(rt, st, 4), 4);
    cr_assert_eq(WF_TEST_SUM(st, 4, spawned), 100, "spawned sums to %llu",
                 (unsigned long long)WF_TEST_SUM(st, 4, spawned));
    wf_runtime_destroy(rt);
}

Test(sched_stats, spawned_never_exceeds_the_spawns_made_by_workers)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 4 });
    run_fan(rt, 10, 1000);
    wf_worker_stats st[4];
    cr_assert_eq(wf_runtime_stats(rt, st, 4), 4);
    uint64_t spawned = WF_TEST_SUM(st, 4, spawned);
    cr_assert(spawned > 0 && spawned <= 10 * 1000, "spawned sums to %llu",
              (unsigned long long)spawned);
    wf_runtime_destroy(rt);
}

Test(sched_stats, inbox_taken_counts_the_tasks_submitted_from_outside)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 4 });
    run_fan(rt, 37, 10);
    wf_worker_stats st[4];
    cr_assert_eq(wf_runtime_stats(rt, st, 4), 4);
    cr_assert_eq(WF_TEST_SUM(st, 4, inbox_taken), 37, "inbox_taken sums to %llu",
                 (unsigned long long)WF_TEST_SUM(st, 4, inbox_taken));
    wf_runtime_destroy(rt);
}

Test(sched_stats, tasks_run_counts_graph_nodes)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 2 });
    wf_taskgraph *tg;
    cr_assert_eq(wf_taskgraph_create(rt, &tg), 0);
    for (int i = 0; i < 100; i++)
        cr_assert_eq(wf_taskgraph_add(tg, graph_node, NULL, "n"), i);
    for (int i = 1; i < 100; i += 2)
        cr_assert_eq(wf_taskgraph_precede(tg, i - 1, i), 0);
    wf_runtime_stats_reset(rt);
    for (int r = 0; r < 3; r++)
        cr_assert_eq(wf_taskgraph_run(tg), 0);
    wf_test_sleep_us(50000);
    wf_worker_stats st[2];
    cr_assert_eq(wf_runtime_stats(rt, st, 2), 2);
    cr_assert_geq(WF_TEST_SUM(st, 2, tasks_run), 300);
    wf_taskgraph_destroy(tg);
    wf_runtime_destroy(rt);
}

Test(sched_stats, actor_msgs_counts_the_messages_handled)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 2 });
    atomic_long handled = 0;
    wf_actor *a;
    cr_assert_eq(
        wf_actor_create(rt, &(wf_actor_opts){ .handler = quiet_handler, .ctx = &handled }, &a), 0);

    enum { N = 1000 };

    wf_msg *msgs = calloc(N, sizeof *msgs);
    cr_assert_not_null(msgs);
    for (int i = 0; i < N; i++)
        cr_assert_eq(wf_actor_send(a, &msgs[i]), 0);
    wf_actor_destroy(a);
    wf_test_sleep_us(50000);
    wf_worker_stats st[2];
    cr_assert_eq(wf_runtime_stats(rt, st, 2), 2);
    cr_assert_eq(WF_TEST_SUM(st, 2, actor_msgs), N, "actor_msgs sums to %llu",
                 (unsigned long long)WF_TEST_SUM(st, 2, actor_msgs));
    cr_assert_geq(WF_TEST_SUM(st, 2, tasks_run), 1, "actor turns are not counted as tasks run");
    free(msgs);
    wf_runtime_destroy(rt);
}

Test(sched_stats, a_single_worker_never_steals)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 1 });
    run_fan(rt, 5, 20000);
    wf_worker_stats st[1];
    cr_assert_eq(wf_runtime_stats(rt, st, 1), 1);
    cr_assert_eq(st[0].steals_won, 0);
    cr_assert_eq(st[0].steals_won_local + st[0].steals_won_remote, 0);
    cr_assert_eq(st[0].steals_tried, 0, "a lone worker tried %llu steals",
                 (unsigned long long)st[0].steals_tried);
    wf_runtime_destroy(rt);
}

Test(sched_stats, steals_won_are_local_plus_remote_and_at_most_steals_tried)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 4 });
    run_fan(rt, 4, 50000);
    wf_worker_stats st[4];
    cr_assert_eq(wf_runtime_stats(rt, st, 4), 4);
    for (int w = 0; w < 4; w++) {
        cr_assert_eq(st[w].steals_won_local + st[w].steals_won_remote, st[w].steals_won,
                     "worker %d: %llu local + %llu remote != %llu won", w,
                     (unsigned long long)st[w].steals_won_local,
                     (unsigned long long)st[w].steals_won_remote,
                     (unsigned long long)st[w].steals_won);
        cr_assert_leq(st[w].steals_won, st[w].steals_tried, "worker %d won more than it tried", w);
    }
    wf_runtime_destroy(rt);
}

Test(sched_stats, stats_reset_zeroes_the_counters)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 4 });
    run_fan(rt, 10, 10000);
    atomic_long handled = 0;
    wf_actor *a;
    cr_assert_eq(
        wf_actor_create(rt, &(wf_actor_opts){ .handler = quiet_handler, .ctx = &handled }, &a), 0);
    wf_msg m;
    cr_assert_eq(wf_actor_send(a, &m), 0);
    wf_actor_destroy(a);
    wf_test_sleep_us(50000);
    wf_runtime_stats_reset(rt);
    wf_worker_stats st[4];
    cr_assert_eq(wf_runtime_stats(rt, st, 4), 4);
    for (int w = 0; w < 4; w++) {
        cr_assert_eq(st[w].tasks_run, 0, "worker %d", w);
        cr_assert_eq(st[w].spawned, 0, "worker %d", w);
        cr_assert_eq(st[w].steals_tried, 0, "worker %d", w);
        cr_assert_eq(st[w].steals_won, 0, "worker %d", w);
        cr_assert_eq(st[w].steals_won_local, 0, "worker %d", w);
        cr_assert_eq(st[w].steals_won_remote, 0, "worker %d", w);
        cr_assert_eq(st[w].inbox_taken, 0, "worker %d", w);
        cr_assert_eq(st[w].actor_msgs, 0, "worker %d", w);
    }
    wf_runtime_destroy(rt);
}

Test(sched_stats, stats_reset_keeps_each_worker_numa_node_and_cpu)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .topology = "pack:2 numa:1 core:2 pu:1" });
    wf_worker_stats before[4], after[4];
    cr_assert_eq(wf_runtime_stats(rt, before, 4), 4);
    run_fan(rt, 4, 100);
    wf_runtime_stats_reset(rt);
    cr_assert_eq(wf_runtime_stats(rt, after, 4), 4);
    for (int w = 0; w < 4; w++) {
        cr_assert_eq(after[w].numa, before[w].numa, "worker %d moved from node %d to %d", w,
                     before[w].numa, after[w].numa);
        cr_assert_eq(after[w].cpu, before[w].cpu, "worker %d", w);
    }
    wf_runtime_destroy(rt);
}

Test(sched_stats, stats_returns_the_worker_count_and_copies_at_most_n)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 4 });
    wf_worker_stats st[4];
    memset(st, 0xab, sizeof st);
    cr_assert_eq(wf_runtime_stats(rt, st, 2), 4);
    wf_worker_stats untouched;
    memset(&untouched, 0xab, sizeof untouched);
    cr_assert_eq(memcmp(&st[2], &untouched, sizeof untouched), 0, "stats wrote past n");
    cr_assert_eq(wf_runtime_stats(rt, st, 0), 4);
    wf_runtime_destroy(rt);
}

/* ---- idle time, parks and steals: what shows where a DAG node's time goes ------------- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int busy_1ms(void *arg)
{
    (void)arg;
    double until = now_s() + 1e-3;
    while (now_s() < until)
        ;
    return 0;
}

/* Two idle workers park (after their 50 us spin) and, once work wakes them, count the time
 * asleep: at least most of the idle period, never more than the wall time since the reset. */
Test(sched_stats, idle_workers_park_and_count_their_idle_time)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 2 });
    wf_test_sleep_us(20000);
    wf_runtime_stats_reset(rt);
    double t0 = now_s();
    wf_test_sleep_us(300000);
    wf_group g;
    cr_assert_eq(wf_group_init(&g, rt), 0);
    for (int i = 0; i < 64; i++)
        cr_assert_eq(wf_spawn(&g, busy_1ms, NULL), 0);
    cr_assert_eq(wf_group_wait(&g), 0);
    wf_group_deinit(&g);
    wf_test_sleep_us(20000);
    wf_worker_stats st[2];
    cr_assert_eq(wf_runtime_stats(rt, st, 2), 2);
    double wall = now_s() - t0, idle = (double)WF_TEST_SUM(st, 2, idle_ns) * 1e-9;
    cr_assert_geq(WF_TEST_SUM(st, 2, parks), 1);
    cr_assert_geq(idle, 0.15, "the workers slept %.3f s of 2 x %.3f s idle", idle, 0.3);
    cr_assert_leq(idle, 2 * wall, "idle %.3f s is more than 2 workers x %.3f s of wall time", idle,
                  wall);
    wf_runtime_destroy(rt);
}

/* Workers still asleep count their sleep so far: read twice 100 ms apart with no work at
 * all (nobody wakes them), the idle time grows by about 2 x 100 ms; a reset while they
 * sleep counts only what follows it. Before, a sleep was counted only when it ended, so a
 * snapshot taken before a burst and one after it saw the whole sleep that preceded it. */
Test(sched_stats, idle_time_includes_a_sleep_still_going_on_and_reset_cuts_it)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 2 });
    wf_test_sleep_us(50000); /* both park */
    wf_worker_stats a[2], b[2];
    cr_assert_eq(wf_runtime_stats(rt, a, 2), 2);
    double t0 = now_s();
    wf_test_sleep_us(100000);
    cr_assert_eq(wf_runtime_stats(rt, b, 2), 2);
    double wall = now_s() - t0;
    for (int i = 0; i < 2; i++) {
        double grew = (double)(b[i].idle_ns - a[i].idle_ns) * 1e-9;
        cr_assert_geq(grew, 0.5 * wall, "worker %d: idle grew %.3f s in %.3f s asleep", i, grew,
                      wall);
        cr_assert_leq(grew, wall + 0.01, "worker %d: idle grew %.3f s in %.3f s", i, grew, wall);
    }
    wf_runtime_stats_reset(rt);
    t0 = now_s();
    wf_test_sleep_us(20000);
    cr_assert_eq(wf_runtime_stats(rt, b, 2), 2);
    wall = now_s() - t0;
    for (int i = 0; i < 2; i++)
        cr_assert_leq((double)b[i].idle_ns * 1e-9, wall + 0.01,
                      "worker %d: %.3f s idle since a reset %.3f s ago", i,
                      (double)b[i].idle_ns * 1e-9, wall);
    wf_runtime_destroy(rt);
}

/* A graph submitted from a worker puts its roots on that worker's deque: a second worker
 * gets any of them only by stealing, and the counters say so (steals_won and tasks_run). */
static int submit_wide_graph(void *arg)
{
    wf_taskgraph *tg = arg;
    return wf_taskgraph_run(tg);
}

Test(sched_stats, a_wide_graph_from_a_worker_is_shared_by_stealing)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 2 });
    wf_taskgraph *tg;
    cr_assert_eq(wf_taskgraph_create(rt, &tg), 0);
    for (int i = 0; i < 200; i++)
        cr_assert_geq(wf_taskgraph_add(tg, busy_1ms, NULL, "busy"), 0);
    wf_runtime_stats_reset(rt);
    wf_group g;
    cr_assert_eq(wf_group_init(&g, rt), 0);
    cr_assert_eq(wf_spawn(&g, submit_wide_graph, tg), 0);
    cr_assert_eq(wf_group_wait(&g), 0);
    wf_group_deinit(&g);
    wf_test_sleep_us(20000);
    wf_worker_stats st[2];
    cr_assert_eq(wf_runtime_stats(rt, st, 2), 2);
    cr_assert_geq(WF_TEST_SUM(st, 2, tasks_run), 201);
    cr_assert_geq(WF_TEST_SUM(st, 2, steals_won), 1, "200 nodes of 1 ms, and no steal");
    for (int w = 0; w < 2; w++)
        cr_assert_geq(st[w].tasks_run, 1, "worker %d ran nothing", w);
    wf_taskgraph_destroy(tg);
    wf_runtime_destroy(rt);
}
