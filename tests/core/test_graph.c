/* tests/core/test_graph.c: graphs and nodes through the public API: creation, names (given,
 * automatic, clashes, renames), source locations recorded by the macros, the first-error
 * state, bad arguments (NULL graph, NULL or empty names, rank above 8, invalid dtypes,
 * negative dimensions), placeholders, constants, scalars, variables, eager values (a
 * variable's made from its initializer at its first read, or set before it), a
 * 100,000-node graph, and per-thread pending locations. Ops with inputs are tested in
 * test_internal_graph.c. */
#include "wf_test.h"

#include <weft/weft.h>

#include <criterion/criterion.h>

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

static wf_runtime *rt;

static void setup(void)
{
    rt = wf_test_runtime(&(wf_runtime_opts){ .n_workers = 1, .flags = WF_RT_NO_PIN });
}

static void teardown(void)
{
    wf_runtime_destroy(rt);
    rt = NULL;
    wf_test_fini();
}

TestSuite(core_graph, .init = setup, .fini = teardown, .timeout = WF_TEST_TIMEOUT(30));

static wf_graph *new_graph(int mode)
{
    wf_graph *g = wf_graph_create(rt, mode);
    cr_assert_not_null(g, "wf_graph_create: %s", wf_last_errmsg());
    return g;
}

static const char *base(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

/* ---- Creation ------------------------------------------------------------------------- */

Test(core_graph, create_keeps_runtime_and_mode_and_starts_empty)
{
    wf_graph *g = new_graph(WF_STATIC);
    cr_assert_eq(wf_graph_runtime(g), rt);
    cr_assert_eq(wf_graph_mode(g), WF_STATIC);
    cr_assert_eq(wf_graph_node_count(g), 0);
    cr_assert_eq(wf_graph_status(g), 0);
    cr_assert_str_eq(wf_graph_errmsg(g), "");
    cr_assert_null(wf_graph_node(g, 0));
    wf_graph_destroy(g);
    g = new_graph(WF_EAGER);
    cr_assert_eq(wf_graph_mode(g), WF_EAGER);
    wf_graph_destroy(g);
}

Test(core_graph, create_with_null_runtime_fails_with_a_message)
{
    cr_assert_null(wf_graph_create(NULL, WF_STATIC));
    cr_assert(strstr(wf_last_errmsg(), "rt is NULL"), "message: %s", wf_last_errmsg());
}

Test(core_graph, create_with_unknown_mode_fails)
{
    cr_assert_null(wf_graph_create(rt, 7));
    cr_assert(strstr(wf_last_errmsg(), "mode 7"), "message: %s", wf_last_errmsg());
}

Test(core_graph, destroy_and_queries_accept_null)
{
    wf_graph_destroy(NULL);
    wf_graph_clear_error(NULL);
    cr_assert_eq(wf_graph_status(NULL), WF_EINVAL);
    cr_assert_not_null(wf_graph_errmsg(NULL));
    cr_assert_eq(wf_graph_node_count(NULL), 0);
    cr_assert_null(wf_graph_runtime(NULL));
    cr_assert_null(wf_graph_find(NULL, "x"));
    cr_assert_null(wf_graph_node(NULL, 0));
    cr_assert_null(wf_node_name(NULL));
    cr_assert_null(wf_node_op(NULL));
    cr_assert_eq(wf_node_dtype(NULL), WF_DTYPE_INVALID);
    cr_assert_eq(wf_node_shape(NULL).rank, 0);
    cr_assert_null(wf_node_graph(NULL));
    cr_assert_eq(wf_node_input_count(NULL), 0);
    cr_assert_null(wf_node_input(NULL, 0));
    cr_assert_str_eq(wf_node_file(NULL), "?");
    cr_assert_eq(wf_node_line(NULL), 0);
    cr_assert_null(wf_node_value(NULL));
    cr_assert_eq(wf_node_set_name(NULL, "x"), WF_EINVAL);
}

/* ---- Placeholders and their checks ----------------------------------------------------- */

Test(core_graph, placeholder_records_name_dtype_shape_and_op)
{
    wf_graph *g = new_graph(WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(-1, 784));
    cr_assert_not_null(x, "%s", wf_graph_errmsg(g));
    cr_assert_str_eq(wf_node_name(x), "x");
    cr_assert_str_eq(wf_node_op(x), "placeholder");
    cr_assert_eq(wf_node_dtype(x), WF_F32);
    cr_assert(wf_shape_equal(wf_node_shape(x), WF_SHAPE(-1, 784)));
    cr_assert_eq(wf_node_graph(x), g);
    cr_assert_eq(wf_node_input_count(x), 0);
    cr_assert_null(wf_node_input(x, 0));
    cr_assert_null(wf_node_value(x), "a placeholder of a static graph has no value");
    cr_assert_eq(wf_graph_node(g, 0), x);
    cr_assert_eq(wf_graph_find(g, "x"), x);
    cr_assert_eq(wf_graph_node_count(g), 1);
    wf_graph_destroy(g);
}

Test(core_graph, placeholder_with_null_graph_returns_null_with_a_message)
{
    cr_assert_null(wf_placeholder(NULL, "x", WF_F32, WF_SHAPE(2)));
    cr_assert(strstr(wf_last_errmsg(), "graph is NULL"), "message: %s", wf_last_errmsg());
}

Test(core_graph, placeholder_rank_above_eight_is_an_error)
{
    wf_graph *g = new_graph(WF_STATIC);
    wf_shape s = { .rank = 9 };
    cr_assert_null(wf_placeholder(g, "x", WF_F32, s));
    cr_assert_eq(wf_graph_status(g), WF_EINVAL);
    cr_assert(strstr(wf_graph_errmsg(g), "rank 9"), "message: %s", wf_graph_errmsg(g));
    cr_assert_eq(wf_graph_node_count(g), 0, "a failed constructor adds nothing");
    cr_assert_null(wf_graph_find(g, "x"), "a failed constructor leaves no name behind");
    wf_graph_clear_error(g);
    s.rank = -1;
    cr_assert_null(wf_placeholder(g, "x", WF_F32, s));
    cr_assert_eq(wf_graph_status(g), WF_EINVAL);
    wf_graph_destroy(g);
}

Test(core_graph, placeholder_invalid_dtype_is_an_error)
{
    wf_graph *g = new_graph(WF_STATIC);
    cr_assert_null(wf_placeholder(g, "x", WF_DTYPE_INVALID, WF_SHAPE(2)));
    cr_assert_eq(wf_graph_status(g), WF_EINVAL);
    cr_assert(strstr(wf_graph_errmsg(g), "dtype 0"), "message: %s", wf_graph_errmsg(g));
    wf_graph_clear_error(g);
    cr_assert_null(wf_placeholder(g, "x", (wf_dtype)99, WF_SHAPE(2)));
    cr_assert(strstr(wf_graph_errmsg(g), "dtype 99"), "message: %s", wf_graph_errmsg(g));
    wf_graph_destroy(g);
}

Test(core_graph, placeholder_dimension_below_minus_one_is_an_error)
{
    wf_graph *g = new_graph(WF_STATIC);
    cr_assert_null(wf_placeholder(g, "x", WF_F32, WF_SHAPE(3, -2)));
    cr_assert_eq(wf_graph_status(g), WF_EINVAL);
    cr_assert(strstr(wf_graph_errmsg(g), "dimension 1 is -2"), "message: %s", wf_graph_errmsg(g));
    wf_graph_destroy(g);
}

Test(core_graph, placeholder_in_an_eager_graph_is_an_error)
{
    wf_graph *g = new_graph(WF_EAGER);
    cr_assert_null(wf_placeholder(g, "x", WF_F32, WF_SHAPE(2)));
    cr_assert_eq(wf_graph_status(g), WF_EINVAL);
    cr_assert(strstr(wf_graph_errmsg(g), "eager graphs take constants, not placeholders"),
              "message: %s", wf_graph_errmsg(g));
    cr_assert_eq(wf_graph_node_count(g), 0);
    wf_graph_destroy(g);
}

/* ---- Names ---------------------------------------------------------------------------- */

Test(core_graph, unnamed_nodes_get_unique_names_from_their_op)
{
    wf_graph *g = new_graph(WF_STATIC);

    enum { N = 50 };

    wf_node *nodes[N];
    for (int i = 0; i < N; i++) {
        nodes[i] = wf_placeholder(g, NULL, WF_F32, WF_SHAPE(1));
        cr_assert_not_null(nodes[i], "%s", wf_graph_errmsg(g));
        cr_assert(strncmp(wf_node_name(nodes[i]), "placeholder_", 12) == 0, "name %s",
                  wf_node_name(nodes[i]));
        cr_assert_eq(wf_graph_find(g, wf_node_name(nodes[i])), nodes[i]);
        for (int j = 0; j < i; j++)
            cr_assert_str_neq(wf_node_name(nodes[i]), wf_node_name(nodes[j]));
    }
    cr_assert_str_eq(wf_node_name(nodes[3]), "placeholder_3");
    wf_graph_destroy(g);
}

Test(core_graph, automatic_names_avoid_names_users_took)
{
    wf_graph *g = new_graph(WF_STATIC);
    wf_node *a = wf_placeholder(g, "placeholder_1", WF_F32, WF_SHAPE(1)); /* node 0 */
    wf_node *b = wf_placeholder(g, NULL, WF_F32, WF_SHAPE(1));            /* node 1 */
    cr_assert_not_null(a);
    cr_assert_not_null(b, "%s", wf_graph_errmsg(g));
    cr_assert_str_neq(wf_node_name(b), "placeholder_1");
    cr_assert_eq(wf_graph_find(g, "placeholder_1"), a);
    cr_assert_eq(wf_graph_find(g, wf_node_name(b)), b);
    wf_graph_destroy(g);
}

Test(core_graph, duplicate_name_is_an_error_naming_both)
{
    wf_graph *g = new_graph(WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(2));
    cr_assert_not_null(x);
    cr_assert_null(wf_placeholder(g, "x", WF_F64, WF_SHAPE(3)));
    cr_assert_eq(wf_graph_status(g), WF_EINVAL);
    const char *msg = wf_graph_errmsg(g);
    cr_assert(strstr(msg, "'x'") && strstr(msg, "taken"), "message: %s", msg);
    cr_assert(strstr(msg, base(__FILE__)), "message names where the first was made: %s", msg);
    cr_assert_eq(wf_graph_node_count(g), 1);
    cr_assert_eq(wf_graph_find(g, "x"), x);
    cr_assert_eq(wf_node_dtype(wf_graph_find(g, "x")), WF_F32);
    wf_graph_destroy(g);
}

Test(core_graph, empty_name_is_an_error)
{
    wf_graph *g = new_graph(WF_STATIC);
    cr_assert_null(wf_placeholder(g, "", WF_F32, WF_SHAPE(2)));
    cr_assert_eq(wf_graph_status(g), WF_EINVAL);
    cr_assert(strstr(wf_graph_errmsg(g), "empty"), "message: %s", wf_graph_errmsg(g));
    wf_graph_destroy(g);
}

Test(core_graph, find_of_unknown_or_null_name_is_null)
{
    wf_graph *g = new_graph(WF_STATIC);
    cr_assert_not_null(wf_placeholder(g, "x", WF_F32, WF_SHAPE(2)));
    cr_assert_null(wf_graph_find(g, "y"));
    cr_assert_null(wf_graph_find(g, "x "));
    cr_assert_null(wf_graph_find(g, NULL));
    cr_assert_null(wf_graph_node(g, -1));
    cr_assert_null(wf_graph_node(g, 1));
    wf_graph_destroy(g);
}

Test(core_graph, set_name_renames_and_refuses_clashes)
{
    wf_graph *g = new_graph(WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(2));
    wf_node *y = wf_placeholder(g, "y", WF_F32, WF_SHAPE(2));
    cr_assert_eq(wf_node_set_name(x, "input"), 0, "%s", wf_last_errmsg());
    cr_assert_str_eq(wf_node_name(x), "input");
    cr_assert_eq(wf_graph_find(g, "input"), x);
    cr_assert_null(wf_graph_find(g, "x"), "the old name is free again");
    cr_assert_eq(wf_node_set_name(y, "input"), WF_EINVAL);
    cr_assert(strstr(wf_last_errmsg(), "'input'"), "message: %s", wf_last_errmsg());
    cr_assert_str_eq(wf_node_name(y), "y");
    cr_assert_eq(wf_node_set_name(y, NULL), WF_EINVAL);
    cr_assert_eq(wf_node_set_name(y, ""), WF_EINVAL);
    cr_assert_eq(wf_node_set_name(x, "input"), 0, "renaming to its own name is fine");
    cr_assert_eq(wf_node_set_name(y, "x"), 0, "a freed name can be reused");
    cr_assert_eq(wf_graph_find(g, "x"), y);
    cr_assert_not_null(wf_placeholder(g, "y", WF_F32, WF_SHAPE(2)));
    cr_assert_eq(wf_graph_status(g), 0, "renames do not set the graph's error");
    wf_graph_destroy(g);
}

/* Automatic names are found through the id they contain, not the name table (core/graph.c):
 * lookups, clashes with user names and renames must behave as for any other name. */
Test(core_graph, automatic_names_are_found_taken_and_renamed_like_user_names)
{
    wf_graph *g = new_graph(WF_STATIC);
    wf_node *a = wf_placeholder(g, NULL, WF_F32, WF_SHAPE(1));            /* placeholder_0 */
    wf_node *u = wf_placeholder(g, "placeholder_2", WF_F32, WF_SHAPE(1)); /* node 1 */
    wf_node *b = wf_placeholder(g, NULL, WF_F32, WF_SHAPE(1));            /* node 2 */
    cr_assert(a && u && b, "%s", wf_graph_errmsg(g));
    cr_assert_str_eq(wf_node_name(b), "placeholder_2_1");
    cr_assert_eq(wf_graph_find(g, "placeholder_0"), a);
    cr_assert_eq(wf_graph_find(g, "placeholder_2_1"), b);
    cr_assert_eq(wf_graph_find(g, "placeholder_2"), u);
    cr_assert_null(wf_graph_find(g, "placeholder_00"));
    cr_assert_null(wf_graph_find(g, "placeholder_3"), "no node 3 yet");
    cr_assert_null(wf_graph_find(g, "placeholder_1"), "node 1 has a user name");
    cr_assert_null(wf_graph_find(g, "_0"));
    cr_assert_null(wf_graph_find(g, "0"));
    cr_assert_null(wf_graph_find(g, ""));
    cr_assert_null(wf_placeholder(g, "placeholder_0", WF_F32, WF_SHAPE(1)),
                   "an automatic name is taken");
    wf_graph_clear_error(g);
    cr_assert_eq(wf_node_set_name(u, "placeholder_0"), WF_EINVAL);
    cr_assert_eq(wf_node_set_name(a, "placeholder_0"), 0, "renaming to its own name is fine");
    cr_assert_eq(wf_node_set_name(a, "first"), 0, "%s", wf_last_errmsg());
    cr_assert_eq(wf_graph_find(g, "first"), a);
    cr_assert_null(wf_graph_find(g, "placeholder_0"), "the old name is free again");
    cr_assert_eq(wf_node_set_name(u, "placeholder_0"), 0, "%s", wf_last_errmsg());
    cr_assert_eq(wf_graph_find(g, "placeholder_0"), u);
    cr_assert_null(wf_graph_find(g, "placeholder_2"));

    enum { N = 3000 }; /* past several growths of the name table */

    for (int i = 0; i < N; i++) {
        wf_node *n = i % 3 ? wf_placeholder(g, NULL, WF_F32, WF_SHAPE(1))
                           : wf_placeholder(g, "placeholder_9999", WF_F32, WF_SHAPE(1));
        if (i % 3 == 0) { /* the user name clashes once; later ones are errors */
            wf_graph_clear_error(g);
            continue;
        }
        cr_assert_not_null(n, "%s", wf_graph_errmsg(g));
        cr_assert_eq(wf_graph_find(g, wf_node_name(n)), n, "%s", wf_node_name(n));
    }
    cr_assert_eq(wf_graph_status(g), 0, "%s", wf_graph_errmsg(g));
    wf_graph_destroy(g);
}

/* ---- Source locations -------------------------------------------------------------------- */

Test(core_graph, macros_record_file_and_line)
{
    wf_graph *g = new_graph(WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(2));
    const int line_x = __LINE__ - 1;
    wf_tensor *t = wf_tensor_from(WF_F32, WF_SHAPE(2), NULL);
    wf_node *c = wf_constant(g, t);
    const int line_c = __LINE__ - 1;
    wf_node *s = wf_scalar(g, WF_F32, 1.5);
    const int line_s = __LINE__ - 1;
    wf_node *v = wf_variable(g, "v", WF_F32, WF_SHAPE(2), wf_init_zeros());
    const int line_v = __LINE__ - 1;
    wf_tensor_release(t);
    cr_assert_str_eq(wf_node_file(x), __FILE__);
    cr_assert_eq(wf_node_line(x), line_x);
    cr_assert_str_eq(wf_node_file(c), __FILE__);
    cr_assert_eq(wf_node_line(c), line_c);
    cr_assert_eq(wf_node_line(s), line_s);
    cr_assert_eq(wf_node_line(v), line_v);
    wf_graph_destroy(g);
}

Test(core_graph, function_call_without_macro_records_no_location)
{
    wf_graph *g = new_graph(WF_STATIC);
    wf_node *x = (wf_placeholder)(g, "x", WF_F32, WF_SHAPE(2));
    cr_assert_str_eq(wf_node_file(x), "?");
    cr_assert_eq(wf_node_line(x), 0);
    wf_graph_destroy(g);
}

Test(core_graph, pending_location_is_consumed_by_one_node)
{
    wf_graph *g = new_graph(WF_STATIC);
    wf_set_source_location("model.c", 42);
    wf_node *a = (wf_placeholder)(g, "a", WF_F32, WF_SHAPE(2));
    wf_node *b = (wf_placeholder)(g, "b", WF_F32, WF_SHAPE(2));
    cr_assert_str_eq(wf_node_file(a), "model.c");
    cr_assert_eq(wf_node_line(a), 42);
    cr_assert_str_eq(wf_node_file(b), "?", "the second node must not reuse the location");
    wf_graph_destroy(g);
}

Test(core_graph, location_string_is_copied)
{
    wf_graph *g = new_graph(WF_STATIC);
    char file[32];
    snprintf(file, sizeof file, "gen.c");
    wf_set_source_location(file, 7);
    wf_node *a = (wf_placeholder)(g, "a", WF_F32, WF_SHAPE(2));
    snprintf(file, sizeof file, "overwritten.c");
    cr_assert_str_eq(wf_node_file(a), "gen.c");
    wf_graph_destroy(g);
}

Test(core_graph, error_message_names_op_node_and_location)
{
    wf_graph *g = new_graph(WF_STATIC);
    cr_assert_null(wf_variable(g, "w", WF_F32, WF_SHAPE(-1, 10), wf_init_zeros()));
    const int line = __LINE__ - 1;
    char want[256];
    snprintf(want, sizeof want, "variable 'w' (%s:%d): ", base(__FILE__), line);
    cr_assert(strncmp(wf_graph_errmsg(g), want, strlen(want)) == 0, "message: %s, want %s...",
              wf_graph_errmsg(g), want);
    cr_assert(strstr(wf_graph_errmsg(g), "[?, 10]"), "the shape is in the message: %s",
              wf_graph_errmsg(g));
    wf_graph_destroy(g);
}

/* ---- The first error ------------------------------------------------------------------- */

Test(core_graph, first_error_is_kept_until_cleared)
{
    wf_graph *g = new_graph(WF_STATIC);
    cr_assert_null(wf_placeholder(g, "x", WF_DTYPE_INVALID, WF_SHAPE(2)));
    char first[512];
    snprintf(first, sizeof first, "%s", wf_graph_errmsg(g));
    cr_assert_eq(wf_graph_status(g), WF_EINVAL);
    /* A second, different error. */
    cr_assert_null(wf_variable(g, NULL, WF_F32, WF_SHAPE(2), wf_init_zeros()));
    cr_assert_str_eq(wf_graph_errmsg(g), first, "the first error is kept");
    /* Successful constructors do not clear it either. */
    cr_assert_not_null(wf_placeholder(g, "ok", WF_F32, WF_SHAPE(2)));
    cr_assert_eq(wf_graph_status(g), WF_EINVAL);
    cr_assert_str_eq(wf_graph_errmsg(g), first);
    wf_graph_clear_error(g);
    cr_assert_eq(wf_graph_status(g), 0);
    cr_assert_str_eq(wf_graph_errmsg(g), "");
    cr_assert_null(wf_variable(g, NULL, WF_F32, WF_SHAPE(2), wf_init_zeros()));
    cr_assert(strstr(wf_graph_errmsg(g), "needs a name"), "message: %s", wf_graph_errmsg(g));
    wf_graph_destroy(g);
}

Test(core_graph, constant_of_null_tensor_keeps_the_first_error)
{
    wf_graph *g = new_graph(WF_STATIC);
    cr_assert_null(wf_constant(g, NULL));
    cr_assert_eq(wf_graph_status(g), WF_EINVAL, "a NULL tensor with no earlier error is one");
    wf_graph_clear_error(g);
    cr_assert_null(wf_placeholder(g, "x", WF_F32, WF_SHAPE(3, -5)));
    char first[512];
    snprintf(first, sizeof first, "%s", wf_graph_errmsg(g));
    /* wf_tensor_from fails (negative dim) and its NULL flows into wf_constant. */
    cr_assert_null(wf_constant(g, wf_tensor_from(WF_F32, WF_SHAPE(-3), NULL)));
    cr_assert_str_eq(wf_graph_errmsg(g), first);
    wf_graph_destroy(g);
}

/* ---- Constants and scalars ------------------------------------------------------------- */

Test(core_graph, constant_retains_its_tensor_and_is_its_value)
{
    wf_graph *g = new_graph(WF_STATIC);
    float data[6] = { 1, 2, 3, 4, 5, 6 };
    wf_tensor *t = wf_tensor_from(WF_F32, WF_SHAPE(2, 3), data);
    cr_assert_not_null(t);
    wf_node *c = wf_constant(g, t);
    cr_assert_not_null(c, "%s", wf_graph_errmsg(g));
    wf_tensor_release(t); /* the graph keeps its own reference */
    cr_assert_str_eq(wf_node_op(c), "constant");
    cr_assert_eq(wf_node_dtype(c), WF_F32);
    cr_assert(wf_shape_equal(wf_node_shape(c), WF_SHAPE(2, 3)));
    cr_assert_eq(wf_node_value(c), t);
    cr_assert_eq(wf_tensor_data_f32(wf_node_value(c))[5], 6.0f);
    wf_graph_destroy(g);
}

Test(core_graph, constant_with_null_graph_fails)
{
    wf_tensor *t = wf_tensor_from(WF_F32, WF_SHAPE(2), NULL);
    cr_assert_null(wf_constant(NULL, t));
    cr_assert(strstr(wf_last_errmsg(), "graph is NULL"), "message: %s", wf_last_errmsg());
    wf_tensor_release(t); /* the failed call did not keep a reference (ASan checks) */
}

Test(core_graph, scalar_makes_a_rank_zero_constant_of_each_dtype)
{
    wf_graph *g = new_graph(WF_STATIC);
    const wf_dtype dts[] = { WF_F32, WF_F64, WF_I32, WF_I64, WF_BOOL, WF_BF16, WF_F16, WF_U8 };
    for (size_t i = 0; i < sizeof dts / sizeof dts[0]; i++) {
        wf_node *s = wf_scalar(g, dts[i], 3.0);
        cr_assert_not_null(s, "%s: %s", wf_dtype_name(dts[i]), wf_graph_errmsg(g));
        cr_assert_eq(wf_node_dtype(s), dts[i]);
        cr_assert_eq(wf_node_shape(s).rank, 0);
        double want = dts[i] == WF_BOOL ? 1.0 : 3.0;
        cr_assert_eq(wf_tensor_get(wf_node_value(s), 0), want, "%s", wf_dtype_name(dts[i]));
    }
    wf_node *h = wf_scalar(g, WF_F64, -0.25);
    cr_assert_eq(wf_tensor_get(wf_node_value(h), 0), -0.25);
    cr_assert_null(wf_scalar(g, WF_DTYPE_INVALID, 1.0));
    cr_assert_eq(wf_graph_status(g), WF_EINVAL);
    cr_assert_null(wf_scalar(NULL, WF_F32, 1.0));
    wf_graph_destroy(g);
}

/* ---- Variables ------------------------------------------------------------------------- */

Test(core_graph, variable_in_a_static_graph_has_no_value)
{
    wf_graph *g = new_graph(WF_STATIC);
    wf_node *w = wf_variable(g, "w", WF_F32, WF_SHAPE(784, 10), wf_init_glorot_uniform(42));
    cr_assert_not_null(w, "%s", wf_graph_errmsg(g));
    cr_assert_str_eq(wf_node_op(w), "variable");
    cr_assert_str_eq(wf_node_name(w), "w");
    cr_assert(wf_shape_equal(wf_node_shape(w), WF_SHAPE(784, 10)));
    cr_assert_null(wf_node_value(w), "sessions own variables of static graphs");
    wf_graph_destroy(g);
}

Test(core_graph, variable_needs_a_name)
{
    wf_graph *g = new_graph(WF_STATIC);
    cr_assert_null(wf_variable(g, NULL, WF_F32, WF_SHAPE(2), wf_init_zeros()));
    cr_assert_eq(wf_graph_status(g), WF_EINVAL);
    cr_assert(strstr(wf_graph_errmsg(g), "needs a name"), "message: %s", wf_graph_errmsg(g));
    wf_graph_clear_error(g);
    cr_assert_null(wf_variable(g, "", WF_F32, WF_SHAPE(2), wf_init_zeros()));
    cr_assert_eq(wf_graph_status(g), WF_EINVAL);
    cr_assert_null(wf_variable(NULL, "w", WF_F32, WF_SHAPE(2), wf_init_zeros()));
    cr_assert(strstr(wf_last_errmsg(), "graph is NULL"), "message: %s", wf_last_errmsg());
    wf_graph_destroy(g);
}

Test(core_graph, variable_with_unknown_or_negative_dimension_is_an_error)
{
    wf_graph *g = new_graph(WF_STATIC);
    cr_assert_null(wf_variable(g, "w", WF_F32, WF_SHAPE(-1, 10), wf_init_zeros()));
    cr_assert_eq(wf_graph_status(g), WF_EINVAL);
    wf_graph_clear_error(g);
    cr_assert_null(wf_variable(g, "w", WF_F32, WF_SHAPE(4, -7), wf_init_zeros()));
    cr_assert_eq(wf_graph_status(g), WF_EINVAL);
    cr_assert(strstr(wf_graph_errmsg(g), "-7"), "message: %s", wf_graph_errmsg(g));
    cr_assert_null(wf_graph_find(g, "w"));
    wf_graph_destroy(g);
}

Test(core_graph, variable_with_bad_dtype_rank_or_init_is_an_error)
{
    wf_graph *g = new_graph(WF_STATIC);
    cr_assert_null(wf_variable(g, "a", (wf_dtype)42, WF_SHAPE(2), wf_init_zeros()));
    cr_assert_eq(wf_graph_status(g), WF_EINVAL);
    wf_graph_clear_error(g);
    wf_shape big = { .rank = 9 };
    cr_assert_null(wf_variable(g, "b", WF_F32, big, wf_init_zeros()));
    cr_assert_eq(wf_graph_status(g), WF_EINVAL);
    wf_graph_clear_error(g);
    cr_assert_null(wf_variable(g, "c", WF_F32, WF_SHAPE(2), (wf_init){ .kind = 99 }));
    cr_assert(strstr(wf_graph_errmsg(g), "kind 99"), "message: %s", wf_graph_errmsg(g));
    wf_graph_clear_error(g);
    cr_assert_null(wf_variable(g, "d", WF_F32, WF_SHAPE(2), wf_init_uniform(1, 2.0, 1.0)));
    cr_assert_eq(wf_graph_status(g), WF_EINVAL);
    wf_graph_clear_error(g);
    cr_assert_null(wf_variable(g, "e", WF_F32, WF_SHAPE(2), wf_init_normal(1, 0.0, -1.0)));
    cr_assert_eq(wf_graph_status(g), WF_EINVAL);
    cr_assert_eq(wf_graph_node_count(g), 0);
    wf_graph_destroy(g);
}

Test(core_graph, variable_name_clash_is_an_error)
{
    wf_graph *g = new_graph(WF_STATIC);
    cr_assert_not_null(wf_variable(g, "w", WF_F32, WF_SHAPE(2), wf_init_zeros()));
    cr_assert_null(wf_variable(g, "w", WF_F32, WF_SHAPE(2), wf_init_zeros()));
    cr_assert_eq(wf_graph_status(g), WF_EINVAL);
    cr_assert(strstr(wf_graph_errmsg(g), "taken"), "message: %s", wf_graph_errmsg(g));
    wf_graph_destroy(g);
}

Test(core_graph, eager_variable_has_its_initial_value_at_once)
{
    wf_graph *g = new_graph(WF_EAGER);
    wf_node *w = wf_variable(g, "w", WF_F32, WF_SHAPE(784, 10), wf_init_glorot_uniform(42));
    wf_node *b = wf_variable(g, "b", WF_F32, WF_SHAPE(10), wf_init_constant(0.5));
    cr_assert_not_null(w, "%s", wf_graph_errmsg(g));
    cr_assert_not_null(b, "%s", wf_graph_errmsg(g));
    wf_tensor *wv = wf_node_value(w);
    cr_assert_not_null(wv);
    cr_assert_eq(wf_tensor_dtype(wv), WF_F32);
    cr_assert(wf_shape_equal(wf_tensor_shape(wv), WF_SHAPE(784, 10)));
    /* The same values wf_init_tensor gives. */
    wf_tensor *ref;
    cr_assert_eq(wf_init_tensor(wf_init_glorot_uniform(42), WF_F32, WF_SHAPE(784, 10), &ref), 0);
    cr_assert_eq(memcmp(wf_tensor_data(wv), wf_tensor_data(ref), 7840 * sizeof(float)), 0);
    wf_tensor_release(ref);
    for (int i = 0; i < 10; i++)
        cr_assert_eq(wf_tensor_data_f32(wf_node_value(b))[i], 0.5f);
    wf_graph_destroy(g);
}

Test(core_graph, eager_constant_is_its_value)
{
    wf_graph *g = new_graph(WF_EAGER);
    wf_node *s = wf_scalar(g, WF_F32, 2.0);
    cr_assert_not_null(s, "%s", wf_graph_errmsg(g));
    cr_assert_eq(wf_tensor_get(wf_node_value(s), 0), 2.0);
    wf_graph_destroy(g);
}

/* ---- Size ------------------------------------------------------------------------------ */

Test(core_graph, hundred_thousand_nodes_build_quickly_and_stay_findable)
{
    wf_graph *g = new_graph(WF_STATIC);
    const int n = 100000;
    wf_tensor *t = wf_tensor_from(WF_F32, WF_SHAPE(4), NULL);
    uint64_t t0 = wf_test_now_ns();
    for (int i = 0; i < n; i++) {
        wf_node *x = i % 2 ? wf_constant(g, t) : wf_placeholder(g, NULL, WF_F32, WF_SHAPE(-1, 4));
        cr_assert_not_null(x, "node %d: %s", i, wf_graph_errmsg(g));
    }
    double secs = (double)(wf_test_now_ns() - t0) * 1e-9;
    wf_tensor_release(t);
    cr_assert_eq(wf_graph_node_count(g), n);
    cr_assert_lt(secs, WF_TEST_TIMEOUT(2.0), "building took %.3f s", secs);
    for (int i = 0; i < n; i += 997) {
        wf_node *x = wf_graph_node(g, i);
        cr_assert_not_null(x);
        char want[64];
        snprintf(want, sizeof want, "%s_%d", i % 2 ? "constant" : "placeholder", i);
        cr_assert_str_eq(wf_node_name(x), want);
        cr_assert_eq(wf_graph_find(g, want), x);
    }
    cr_assert_eq(wf_graph_find(g, "placeholder_99998"), wf_graph_node(g, 99998));
    cr_assert_null(wf_graph_find(g, "placeholder_100000"));
    /* The same tensor is shared by 50,000 constants and released once each on destroy. */
    cr_assert_eq(wf_node_value(wf_graph_node(g, 1)), wf_node_value(wf_graph_node(g, 99999)));
    wf_graph_destroy(g);
}

Test(core_graph, many_renames_keep_every_name_findable)
{
    wf_graph *g = new_graph(WF_STATIC);

    enum { N = 3000 };

    for (int i = 0; i < N; i++)
        cr_assert_not_null(wf_placeholder(g, NULL, WF_F32, WF_SHAPE(1)));
    uint64_t rng = 12345;
    char name[64];
    /* Rename a random half, some twice, then check every node by its current name. */
    for (int k = 0; k < N; k++) {
        int i = (int)wf_test_rand_below(&rng, N);
        snprintf(name, sizeof name, "renamed_%d_%d", i, k);
        cr_assert_eq(wf_node_set_name(wf_graph_node(g, i), name), 0, "%s", wf_last_errmsg());
    }
    for (int i = 0; i < N; i++) {
        wf_node *n = wf_graph_node(g, i);
        cr_assert_eq(wf_graph_find(g, wf_node_name(n)), n, "node %d '%s'", i, wf_node_name(n));
        snprintf(name, sizeof name, "placeholder_%d", i);
        if (strcmp(wf_node_name(n), name) != 0)
            cr_assert_null(wf_graph_find(g, name), "old name %s still found", name);
    }
    wf_graph_destroy(g);
}

Test(core_graph, failed_constructors_leave_no_location_pending)
{
    wf_graph *g = new_graph(WF_STATIC);
    cr_assert_null(wf_constant(g, NULL));
    cr_assert_null(wf_scalar(g, WF_DTYPE_INVALID, 1));
    cr_assert_null(wf_variable(g, NULL, WF_F32, WF_SHAPE(2), wf_init_zeros()));
    cr_assert_null(wf_variable(g, "v", WF_F32, WF_SHAPE(-1), wf_init_zeros()));
    cr_assert_null(wf_placeholder(g, "", WF_F32, WF_SHAPE(2)));
    cr_assert_null(wf_placeholder(NULL, "x", WF_F32, WF_SHAPE(2)));
    cr_assert_null(wf_constant(NULL, NULL));
    cr_assert_null(wf_scalar(NULL, WF_F32, 1));
    wf_node *x = (wf_placeholder)(g, "x", WF_F32, WF_SHAPE(2));
    cr_assert_not_null(x);
    cr_assert_str_eq(wf_node_file(x), "?", "a stale location from a failed call was used");
    wf_graph_destroy(g);
}

static void *make_on_other_thread(void *arg)
{
    wf_graph *g = arg;
    return (wf_placeholder)(g, "other", WF_F32, WF_SHAPE(1));
}

Test(core_graph, pending_location_belongs_to_its_thread)
{
    wf_graph *g = new_graph(WF_STATIC);
    wf_set_source_location("main.c", 3);
    pthread_t t;
    void *other = NULL;
    cr_assert_eq(pthread_create(&t, NULL, make_on_other_thread, g), 0);
    pthread_join(t, &other);
    cr_assert_not_null(other);
    cr_assert_str_eq(wf_node_file(other), "?", "another thread's location is not used");
    wf_node *mine = (wf_placeholder)(g, "mine", WF_F32, WF_SHAPE(1));
    cr_assert_str_eq(wf_node_file(mine), "main.c");
    cr_assert_eq(wf_node_line(mine), 3);
    wf_graph_destroy(g);
}

Test(core_graph, eager_variable_value_is_its_initializers_and_set_replaces_it_unread)
{
    wf_graph *g = wf_graph_create(rt, WF_EAGER);
    cr_assert_not_null(g);
    wf_init init = wf_init_glorot_uniform(7);
    wf_node *a = wf_variable(g, "a", WF_F32, WF_SHAPE(3, 4), init);
    wf_node *b = wf_variable(g, "b", WF_F32, WF_SHAPE(3, 4), init);
    cr_assert(a && b, "%s", wf_graph_errmsg(g));
    /* read after other nodes were added: the same bits as the initializer gives at once */
    wf_tensor *want;
    cr_assert_eq(wf_init_tensor(init, WF_F32, WF_SHAPE(3, 4), &want), 0);
    wf_tensor *got = wf_node_value(a);
    cr_assert_not_null(got);
    cr_assert_eq(wf_node_value(a), got, "a second read gives the same value");
    for (int i = 0; i < 12; i++)
        cr_assert_eq(wf_tensor_get(got, i), wf_tensor_get(want, i), "element %d", i);
    /* set before any read: the value set, retained, not a copy */
    float ones[12];
    for (int i = 0; i < 12; i++)
        ones[i] = 1.0f + (float)i;
    wf_tensor *v = wf_tensor_from(WF_F32, WF_SHAPE(3, 4), ones);
    cr_assert_eq(wf_variable_set(b, v), 0, "%s", wf_last_errmsg());
    cr_assert_eq(wf_node_value(b), v);
    cr_assert_eq(wf_tensor_get(wf_node_value(b), 11), 12.0);
    /* a mismatched value is refused and the variable keeps its own */
    wf_tensor *wrong = wf_tensor_from(WF_F32, WF_SHAPE(4, 3), ones);
    cr_assert_eq(wf_variable_set(b, wrong), WF_ESHAPE);
    cr_assert(strstr(wf_last_errmsg(), "'b'"), "%s", wf_last_errmsg());
    cr_assert_eq(wf_node_value(b), v);
    wf_tensor_release(wrong);
    wf_tensor_release(v);
    wf_tensor_release(want);
    wf_graph_destroy(g);
    /* a static graph's variable has no value, and cannot be set */
    g = wf_graph_create(rt, WF_STATIC);
    a = wf_variable(g, "a", WF_F32, WF_SHAPE(2), init);
    cr_assert_null(wf_node_value(a));
    wf_tensor *two = wf_tensor_from(WF_F32, WF_SHAPE(2), ones);
    cr_assert_eq(wf_variable_set(a, two), WF_EINVAL);
    wf_tensor_release(two);
    wf_graph_destroy(g);
}
