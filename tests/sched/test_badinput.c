/* tests/sched/test_badinput.c: bad input to every call of sched.h is an error code with a
 * message, never a crash: NULL arguments, worker counts out of range, bad topology strings,
 * unknown or self edges, actors without handler or with a bad binding, reversed loop ranges,
 * and destroy(NULL). On failure '*out' is NULL and callbacks never run. */
#include "wf_test.h"

#include <weft/weft.h>

#include <criterion/criterion.h>

#include <limits.h>
#include <stdint.h>
#include <stdio.h>

TestSuite(sched_badinput, .fini = wf_test_fini, .timeout = WF_TEST_TIMEOUT(30));

/* A non-NULL value for out-params, to see that a failing call sets them to NULL. */
static char junk;
#define JUNK ((void *)&junk)

static void assert_msg_mentions(const char *what)
{
    const char *msg = wf_last_errmsg();
    cr_assert(msg[0] != '\0', "no message in wf_last_errmsg()");
    if (what)
        cr_assert(strstr(msg, what) != NULL, "message \"%s\" does not mention \"%s\"", msg, what);
}

static int never_task(void *arg)
{
    atomic_fetch_add((atomic_int *)arg, 1);
    return 0;
}

/* ---- wf_runtime_create ---------------------------------------------------------------------- */

Test(sched_badinput, runtime_create_with_null_out_fails_with_einval)
{
    int rc = wf_runtime_create(NULL, NULL);
    cr_assert_eq(rc, WF_EINVAL, "got %s", wf_err_name(rc));
    assert_msg_mentions(NULL);
}

static void assert_bad_worker_count(int n, const char *text)
{
    wf_runtime *rt = JUNK;
    int rc = wf_runtime_create(&rt, &(wf_runtime_opts){ .n_workers = n });
    cr_assert_eq(rc, WF_EINVAL, "n_workers %d gave %s", n, wf_err_name(rc));
    cr_assert_null(rt, "*out is not NULL after a failed create");
    assert_msg_mentions(text);
}

Test(sched_badinput, a_negative_worker_count_fails_with_einval_naming_it)
{
    assert_bad_worker_count(-1, "-1");
    assert_bad_worker_count(INT_MIN, "-2147483648");
}

Test(sched_badinput, a_worker_count_above_the_limit_fails_with_einval_naming_it)
{
    assert_bad_worker_count(100000, "100000");
    assert_bad_worker_count(WF_MAX_WORKERS + 1, "1025");
    assert_bad_worker_count(INT_MAX, "2147483647");
}

static void assert_bad_topology(const char *topo)
{
    wf_runtime *rt = JUNK;
    int rc = wf_runtime_create(&rt, &(wf_runtime_opts){ .topology = topo });
    cr_assert_eq(rc, WF_ETOPO, "topology \"%s\" gave %s", topo, wf_err_name(rc));
    cr_assert_null(rt);
    assert_msg_mentions(topo);
}

Test(sched_badinput, an_invalid_topology_string_fails_with_etopo_quoting_it)
{
    assert_bad_topology("bogus:3");
    assert_bad_topology("numa:0 pu:1");
    assert_bad_topology("pack:2 numa:2 core:");
}

Test(sched_badinput, an_impossible_trace_size_fails_cleanly)
{
    wf_runtime *rt = JUNK;
    int rc =
        wf_runtime_create(&rt, &(wf_runtime_opts){ .n_workers = 1, .trace_events = SIZE_MAX / 2 });
    cr_assert(rc == WF_ENOMEM || rc == WF_EINVAL, "got %s", wf_err_name(rc));
    cr_assert_null(rt);
    assert_msg_mentions(NULL);
}

Test(sched_badinput, opts_from_env_with_null_opts_fails_with_einval)
{
    cr_assert_eq(wf_runtime_opts_from_env(NULL, NULL), WF_EINVAL);
}

/* ---- Groups and spawns ------------------------------------------------------------------------
 */

Test(sched_badinput, group_init_with_null_arguments_fails_with_einval)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 1 });
    cr_assert_eq(wf_group_init(NULL, rt), WF_EINVAL);
    wf_group g;
    cr_assert_eq(wf_group_init(&g, NULL), WF_EINVAL);
    wf_runtime_destroy(rt);
}

Test(sched_badinput, spawn_with_null_arguments_fails_with_einval_and_runs_nothing)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 1 });
    atomic_int ran = 0;
    wf_group g;
    cr_assert_eq(wf_group_init(&g, rt), 0);
    cr_assert_eq(wf_spawn(NULL, never_task, &ran), WF_EINVAL);
    cr_assert_eq(wf_spawn_named(NULL, never_task, &ran, "x"), WF_EINVAL);
    cr_assert_eq(wf_spawn(&g, NULL, &ran), WF_EINVAL);
    cr_assert_eq(wf_spawn_named(&g, NULL, &ran, "x"), WF_EINVAL);
    cr_assert_eq(wf_group_wait(&g), 0, "refused spawns left work in the group");
    cr_assert_eq(atomic_load(&ran), 0);
    wf_group_deinit(&g);
    wf_runtime_destroy(rt);
}

Test(sched_badinput, group_wait_on_null_fails_with_einval)
{
    cr_assert_eq(wf_group_wait(NULL), WF_EINVAL);
}

Test(sched_badinput, waiting_for_an_empty_group_returns_zero_at_once)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 1 });
    wf_group g;
    cr_assert_eq(wf_group_init(&g, rt), 0);
    cr_assert_eq(wf_group_wait(&g), 0);
    cr_assert_eq(wf_group_wait(&g), 0);
    cr_assert_str_eq(wf_group_errmsg(&g), "");
    wf_group_deinit(&g);
    wf_runtime_destroy(rt);
}

Test(sched_badinput, group_deinit_null_is_a_noop)
{
    wf_group_deinit(NULL);
}

/* ---- Task graphs ----------------------------------------------------------------------------- */

static int nop(void *arg)
{
    return 0;
}

Test(sched_badinput, taskgraph_create_with_null_arguments_fails_with_einval)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 1 });
    wf_taskgraph *g = JUNK;
    cr_assert_eq(wf_taskgraph_create(NULL, &g), WF_EINVAL);
    cr_assert_null(g);
    cr_assert_eq(wf_taskgraph_create(rt, NULL), WF_EINVAL);
    wf_runtime_destroy(rt);
}

Test(sched_badinput, taskgraph_add_without_a_function_fails_with_einval)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 1 });
    wf_taskgraph *g;
    cr_assert_eq(wf_taskgraph_create(rt, &g), 0);
    cr_assert_eq(wf_taskgraph_add(NULL, nop, NULL, "x"), WF_EINVAL);
    cr_assert_eq(wf_taskgraph_add(g, NULL, NULL, "x"), WF_EINVAL);
    cr_assert_neq(wf_taskgraph_errmsg(g)[0], '\0', "no message after a refused add");
    cr_assert_eq(wf_taskgraph_node_count(g), 0);
    cr_assert_eq(wf_taskgraph_add(g, nop, NULL, "x"), 0, "a refused add used up an id");
    wf_taskgraph_destroy(g);
    wf_runtime_destroy(rt);
}

static void assert_bad_edge(wf_taskgraph *g, int before, int after, const char *mention)
{
    int rc = wf_taskgraph_precede(g, before, after);
    cr_assert_eq(rc, WF_EINVAL, "precede(%d, %d) gave %s", before, after, wf_err_name(rc));
    const char *msg = wf_taskgraph_errmsg(g);
    cr_assert(strstr(msg, mention) != NULL, "precede(%d, %d): message \"%s\" does not mention %s",
              before, after, msg, mention);
}

Test(sched_badinput, precede_with_an_unknown_id_fails_with_einval_naming_it)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 1 });
    wf_taskgraph *g;
    cr_assert_eq(wf_taskgraph_create(rt, &g), 0);
    cr_assert_eq(wf_taskgraph_add(g, nop, NULL, "a"), 0);
    cr_assert_eq(wf_taskgraph_add(g, nop, NULL, "b"), 1);
    assert_bad_edge(g, 0, 2, "2");
    assert_bad_edge(g, 2, 0, "2");
    assert_bad_edge(g, -1, 1, "-1");
    assert_bad_edge(g, 1, -7, "-7");
    assert_bad_edge(g, 0, 1000000, "1000000");
    assert_bad_edge(g, INT_MIN, INT_MAX, "-2147483648");
    cr_assert_eq(wf_taskgraph_run(g), 0, "refused edges broke the graph: %s",
                 wf_taskgraph_errmsg(g));
    wf_taskgraph_destroy(g);
    wf_runtime_destroy(rt);
}

Test(sched_badinput, precede_from_a_node_to_itself_fails_with_einval)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 1 });
    wf_taskgraph *g;
    cr_assert_eq(wf_taskgraph_create(rt, &g), 0);
    for (int i = 0; i < 4; i++)
        cr_assert_eq(wf_taskgraph_add(g, nop, NULL, "n"), i);
    assert_bad_edge(g, 3, 3, "3");
    cr_assert_eq(wf_taskgraph_run(g), 0, "a refused self edge made a cycle: %s",
                 wf_taskgraph_errmsg(g));
    wf_taskgraph_destroy(g);
    wf_runtime_destroy(rt);
}

Test(sched_badinput, taskgraph_calls_on_null_fail_with_einval)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 1 });
    wf_taskgraph *g;
    cr_assert_eq(wf_taskgraph_create(rt, &g), 0);
    wf_group grp;
    cr_assert_eq(wf_group_init(&grp, rt), 0);
    cr_assert_eq(wf_taskgraph_precede(NULL, 0, 1), WF_EINVAL);
    cr_assert_eq(wf_taskgraph_submit(NULL, &grp), WF_EINVAL);
    cr_assert_eq(wf_taskgraph_submit(g, NULL), WF_EINVAL);
    cr_assert_eq(wf_taskgraph_run(NULL), WF_EINVAL);
    wf_group_deinit(&grp);
    wf_taskgraph_destroy(g);
    wf_taskgraph_destroy(NULL);
    wf_runtime_destroy(rt);
}

/* ---- Actors ------------------------------------------------------------------------------------
 */

static int handler(wf_actor *a, wf_msg *msg, void *ctx)
{
    return 0;
}

static void assert_bad_actor(wf_runtime *rt, const wf_actor_opts *opts, const char *what)
{
    wf_actor *a = JUNK;
    int rc = wf_actor_create(rt, opts, &a);
    cr_assert_eq(rc, WF_EINVAL, "%s gave %s", what, wf_err_name(rc));
    cr_assert_null(a, "%s: *out is not NULL", what);
    cr_assert_neq(wf_last_errmsg()[0], '\0', "%s: no message", what);
}

Test(sched_badinput, actor_create_without_handler_or_opts_fails_with_einval)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 2 });
    assert_bad_actor(rt, NULL, "NULL opts");
    assert_bad_actor(rt, &(wf_actor_opts){ .name = "no_handler" }, "no handler");
    assert_bad_actor(NULL, &(wf_actor_opts){ .handler = handler }, "NULL runtime");
    cr_assert_eq(wf_actor_create(rt, &(wf_actor_opts){ .handler = handler }, NULL), WF_EINVAL);
    wf_runtime_destroy(rt);
}

Test(sched_badinput, actor_create_with_a_bad_worker_index_fails_with_einval_naming_it)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 2 });
    int bad[] = { 2, -1, 1000 };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char what[64], num[16];
        snprintf(what, sizeof what, "WF_BIND_WORKER %d of 2 workers", bad[i]);
        snprintf(num, sizeof num, "%d", bad[i]);
        assert_bad_actor(
            rt,
            &(wf_actor_opts){ .handler = handler, .bind = WF_BIND_WORKER, .bind_index = bad[i] },
            what);
        assert_msg_mentions(num);
    }
    wf_runtime_destroy(rt);
}

Test(sched_badinput, actor_create_with_a_bad_numa_index_fails_with_einval)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .topology = "numa:2 core:1 pu:1" });
    cr_assert_eq(wf_runtime_numa_count(rt), 2);
    assert_bad_actor(rt,
                     &(wf_actor_opts){ .handler = handler, .bind = WF_BIND_NUMA, .bind_index = 2 },
                     "WF_BIND_NUMA 2 of 2 nodes");
    assert_bad_actor(rt,
                     &(wf_actor_opts){ .handler = handler, .bind = WF_BIND_NUMA, .bind_index = -1 },
                     "WF_BIND_NUMA -1");
    wf_runtime_destroy(rt);
}

Test(sched_badinput, actor_create_with_an_unknown_bind_mode_fails_with_einval)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 2 });
    assert_bad_actor(rt, &(wf_actor_opts){ .handler = handler, .bind = 7 }, "bind 7");
    assert_bad_actor(rt, &(wf_actor_opts){ .handler = handler, .bind = -1 }, "bind -1");
    wf_runtime_destroy(rt);
}

Test(sched_badinput, actor_calls_on_null_fail_with_einval)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 1 });
    wf_actor *a;
    cr_assert_eq(wf_actor_create(rt, &(wf_actor_opts){ .handler = handler }, &a), 0);
    wf_msg m;
    cr_assert_eq(wf_actor_send(NULL, &m), WF_EINVAL);
    cr_assert_eq(wf_actor_send(a, NULL), WF_EINVAL);
    cr_assert_eq(wf_actor_poke(NULL), WF_EINVAL);
    wf_actor_destroy(a);
    wf_actor_destroy(NULL);
    wf_runtime_destroy(rt);
}

/* ---- parallel_for ------------------------------------------------------------------------------
 */

static int count_range(void *ctx, int64_t b, int64_t e)
{
    atomic_fetch_add((atomic_int *)ctx, 1);
    return 0;
}

Test(sched_badinput, parallel_for_with_end_before_begin_fails_with_einval_and_calls_nothing)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 2 });
    atomic_int calls = 0;
    int rc = wf_parallel_for(rt, 10, 5, 1, count_range, &calls);
    cr_assert_eq(rc, WF_EINVAL, "got %s", wf_err_name(rc));
    assert_msg_mentions("10");
    rc = wf_parallel_for(rt, INT64_MAX, INT64_MIN, 0, count_range, &calls);
    cr_assert_eq(rc, WF_EINVAL, "got %s", wf_err_name(rc));
    cr_assert_eq(atomic_load(&calls), 0);
    wf_runtime_destroy(rt);
}

Test(sched_badinput, parallel_for_with_a_negative_grain_fails_with_einval)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 2 });
    atomic_int calls = 0;
    cr_assert_eq(wf_parallel_for(rt, 0, 100, -1, count_range, &calls), WF_EINVAL);
    assert_msg_mentions("-1");
    cr_assert_eq(wf_parallel_for(rt, 0, 100, INT64_MIN, count_range, &calls), WF_EINVAL);
    cr_assert_eq(atomic_load(&calls), 0);
    wf_runtime_destroy(rt);
}

Test(sched_badinput, parallel_for_with_null_runtime_or_function_fails_with_einval)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 2 });
    atomic_int calls = 0;
    cr_assert_eq(wf_parallel_for(NULL, 0, 100, 1, count_range, &calls), WF_EINVAL);
    cr_assert_eq(wf_parallel_for(rt, 0, 100, 1, NULL, &calls), WF_EINVAL);
    cr_assert_eq(atomic_load(&calls), 0);
    wf_runtime_destroy(rt);
}

/* ---- Stats and traces --------------------------------------------------------------------------
 */

Test(sched_badinput, stats_with_null_arguments_fail_with_einval)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 2 });
    wf_worker_stats st[2];
    cr_assert_eq(wf_runtime_stats(NULL, st, 2), WF_EINVAL);
    cr_assert_eq(wf_runtime_stats(rt, NULL, 2), WF_EINVAL);
    wf_runtime_destroy(rt);
}

Test(sched_badinput, trace_write_with_null_arguments_fails_with_einval)
{
    wf_runtime *rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 1, .trace_events = 64 });
    cr_assert_eq(wf_runtime_trace_write(rt, NULL), WF_EINVAL);
    cr_assert_eq(wf_runtime_trace_write(NULL, "/tmp/weft-never-written.json"), WF_EINVAL);
    wf_runtime_destroy(rt);
}
