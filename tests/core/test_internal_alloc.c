/* tests/core/test_internal_alloc.c: how core allocates tensors (core/tensor.c): the tensor
 * and buffer headers of a new tensor are one block, small eager values have their data in it
 * too, and pools adopt their memory; values outlive their graph, views keep a dead header's
 * block (AddressSanitizer builds catch any early free), and wf__tensor_writable() still sees
 * exclusive tensors. Also the small-op shortcut of the
 * elementwise kernels (ops/elementwise_cpu.c) against a plain loop, and the cases it must
 * refuse so that the full checks report them.
 * Internal: links the static library, where the wf__ symbols are visible. */
#include "../../core/internal.h"
#include "../../core/tensor.h"
#include "../../ops/kernels.h"
#include "wf_test.h"

#include <weft/weft.h>

#include <criterion/criterion.h>

#include <stdint.h>
#include <stdlib.h>
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

TestSuite(core_internal_alloc, .init = setup, .fini = teardown, .timeout = WF_TEST_TIMEOUT(30));

static const wf_kctx serial = { .rt = NULL };

Test(core_internal_alloc, new_tensor_data_is_64_byte_aligned_for_every_size)
{
    for (int64_t n = 0; n < 1100; n += 7) /* values above 4 KiB take the other path */
        for (int value = 0; value < 2; value++) {
            wf_tensor *t = value ? wf__tensor_alloc_value(WF_F32, WF_SHAPE(n))
                                 : wf__tensor_alloc(WF_F32, WF_SHAPE(n));
            cr_assert_not_null(t, "%s", wf_last_errmsg());
            cr_assert_eq((uintptr_t)t->data % 64, 0, "n %lld", (long long)n);
            cr_assert(t->in_block);
            cr_assert_eq(t->numel, n);
            memset(t->data, 0xab, (size_t)n * sizeof(float)); /* ASan: the span is ours */
            wf_tensor_release(t);
        }
}

Test(core_internal_alloc, value_alloc_refuses_bad_shapes_like_alloc)
{
    cr_assert_null(wf__tensor_alloc_value(WF_F32, WF_SHAPE(2, -1)));
    cr_assert_not_null(strstr(wf_last_errmsg(), "negative or unknown"), "%s", wf_last_errmsg());
    cr_assert_null(wf__tensor_alloc_value(WF_F32, WF_SHAPE(INT64_MAX, 4)));
    cr_assert_not_null(strstr(wf_last_errmsg(), "too many elements"), "%s", wf_last_errmsg());
    cr_assert_null(wf__tensor_alloc_value((wf_dtype)99, WF_SHAPE(2)));
}

Test(core_internal_alloc, view_keeps_the_block_of_a_released_tensor)
{
    float v[6] = { 1, 2, 3, 4, 5, 6 };
    wf_tensor *t = wf_tensor_from(WF_F32, WF_SHAPE(2, 3), v);
    cr_assert_not_null(t);
    int64_t st[2] = { 1, 3 };
    wf_tensor *tr = wf__tensor_alias(t, WF_SHAPE(3, 2), st, 0);
    cr_assert_not_null(tr);
    wf_tensor_release(t); /* the header stays in the block, which the view still holds */
    cr_assert_eq(wf_tensor_get(tr, 1), 4.0);
    cr_assert_eq(wf_tensor_get(tr, 5), 6.0);
    wf_tensor_release(tr);
}

Test(core_internal_alloc, writable_sees_an_exclusive_new_tensor_and_copies_a_shared_one)
{
    wf_tensor *t = wf_tensor_from(WF_F32, WF_SHAPE(4), NULL), *w = NULL;
    cr_assert_not_null(t);
    cr_assert_eq(wf__tensor_writable(t, 1, &w), 0);
    cr_assert_eq(w, t);
    wf_tensor_retain(t);
    cr_assert_eq(wf__tensor_writable(t, 1, &w), 0);
    cr_assert_neq(w, t, "two references: a copy");
    wf_tensor_release(w);
    wf_tensor_release(t);
    wf_tensor_release(t);
}

static void drop_data(void *ctx, void *data, size_t bytes)
{
    (void)bytes;
    ++*(int *)ctx;
    free(data);
}

Test(core_internal_alloc, adopted_memory_is_freed_by_its_hook_after_the_last_view)
{
    int calls = 0;
    float *d = malloc(8 * sizeof *d);
    cr_assert_not_null(d);
    for (int i = 0; i < 8; i++)
        d[i] = (float)i;
    wf_tensor *t = wf__tensor_adopt(WF_F32, WF_SHAPE(8), d, 8 * sizeof *d, drop_data, &calls);
    cr_assert_not_null(t);
    wf_tensor *v = wf__tensor_alias(t, WF_SHAPE(4), NULL, 4);
    wf_tensor_release(t);
    cr_assert_eq(calls, 0);
    cr_assert_eq(wf_tensor_get(v, 3), 7.0);
    wf_tensor_release(v);
    cr_assert_eq(calls, 1);
}

Test(core_internal_alloc, eager_values_outlive_their_graph)
{
    enum { N = 1000 };

    wf_graph *g = wf_graph_create(rt, WF_EAGER);
    float one = 1;
    wf_tensor *t1 = wf_tensor_from(WF_F32, WF_SHAPE(1), &one);
    wf_node *x = wf_constant(g, t1), *c = wf_constant(g, t1);
    wf_tensor *kept[4] = { 0 };
    for (int i = 0; i < N; i++) {
        x = wf_add(g, x, c);
        cr_assert_not_null(x, "%s", wf_graph_errmsg(g));
        if (i % 250 == 0)
            kept[i / 250] = wf_tensor_retain(wf_node_value(x));
    }
    cr_assert_eq(wf_tensor_get(wf_node_value(x), 0), N + 1.0);
    /* A big output (over 4 KiB) has its data apart; mixing it in must not matter. */
    wf_tensor *big = wf_tensor_from(WF_F64, WF_SHAPE(600), NULL);
    wf_node *b = wf_constant(g, big);
    wf_node *b2 = wf_add(g, b, b);
    cr_assert_not_null(b2, "%s", wf_graph_errmsg(g));
    wf_tensor *kept_big = wf_tensor_retain(wf_node_value(b2));
    wf_graph_destroy(g);
    for (int k = 0; k < 4; k++)
        cr_assert_eq(wf_tensor_get(kept[k], 0), 250.0 * k + 2.0, "kept %d", k);
    cr_assert_eq(wf_tensor_get(kept_big, 599), 0.0);
    for (int k = 0; k < 4; k++)
        wf_tensor_release(kept[k]);
    wf_tensor_release(kept_big);
    wf_tensor_release(big);
    wf_tensor_release(t1);
}

Test(core_internal_alloc, failed_eager_node_releases_its_output)
{
    wf_graph *g = wf_graph_create(rt, WF_EAGER);
    int32_t a[2] = { 7, 8 }, z[2] = { 1, 0 };
    wf_tensor *ta = wf_tensor_from(WF_I32, WF_SHAPE(2), a);
    wf_tensor *tz = wf_tensor_from(WF_I32, WF_SHAPE(2), z);
    wf_node *na = wf_constant(g, ta), *nz = wf_constant(g, tz);
    cr_assert_null(wf_div(g, na, nz), "integer division by zero fails");
    cr_assert_eq(wf_graph_status(g), WF_EINVAL, "%s", wf_graph_errmsg(g));
    cr_assert_not_null(strstr(wf_graph_errmsg(g), "division by zero at element 1"), "%s",
                       wf_graph_errmsg(g));
    wf_graph_clear_error(g);
    wf_node *s = wf_add(g, na, na);
    cr_assert_not_null(s, "%s", wf_graph_errmsg(g));
    cr_assert_eq(wf_tensor_get(wf_node_value(s), 1), 16.0);
    wf_graph_destroy(g);
    wf_tensor_release(ta);
    wf_tensor_release(tz);
}

Test(core_internal_alloc, user_name_like_an_automatic_one_still_gets_a_suffix)
{
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *p = wf_placeholder(g, "add_2", WF_F32, WF_SHAPE(2)); /* node 0 */
    wf_node *q = wf_placeholder(g, "q", WF_F32, WF_SHAPE(2));     /* node 1 */
    wf_node *s = wf_add(g, p, q);                                 /* node 2: "add_2" is taken */
    cr_assert_not_null(s, "%s", wf_graph_errmsg(g));
    cr_assert_str_eq(wf_node_name(s), "add_2_1");
    wf_graph_destroy(g);
}

/* ---- The elementwise shortcut ------------------------------------------------------------ */

static wf_tensor *f32(wf_shape shape, float base)
{
    wf_tensor *t = wf__tensor_alloc(WF_F32, shape);
    cr_assert_not_null(t);
    for (int64_t i = 0; i < t->numel; i++)
        ((float *)t->data)[i] = base + (float)i;
    return t;
}

Test(core_internal_alloc, shortcut_adds_same_shapes_and_single_elements_like_a_loop)
{
    /* Each case: a's shape, b's shape, the output's (their broadcast). */
    const wf_shape cases[][3] = {
        { WF_SHAPE(5), WF_SHAPE(5), WF_SHAPE(5) },
        { WF_SHAPE(2, 3), WF_SCALAR, WF_SHAPE(2, 3) },
        { WF_SHAPE(1), WF_SHAPE(4, 3), WF_SHAPE(4, 3) },
        { WF_SCALAR, WF_SCALAR, WF_SCALAR },
        { WF_SHAPE(1, 1), WF_SHAPE(1, 1), WF_SHAPE(1, 1) },
        { WF_SHAPE(0, 3), WF_SHAPE(1), WF_SHAPE(0, 3) },
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        wf_tensor *a = f32(cases[k][0], 1), *b = f32(cases[k][1], 100);
        wf_tensor *out = wf__tensor_alloc(WF_F32, cases[k][2]);
        cr_assert_eq(wf__binary_cpu(&serial, WF_BINARY_SUB, a, b, out), 0, "case %zu: %s", k,
                     wf_last_errmsg());
        for (int64_t i = 0; i < out->numel; i++) {
            float av = ((float *)a->data)[a->numel == 1 ? 0 : i];
            float bv = ((float *)b->data)[b->numel == 1 ? 0 : i];
            cr_assert_eq(((float *)out->data)[i], av - bv, "case %zu element %lld", k,
                         (long long)i);
        }
        wf_tensor_release(a);
        wf_tensor_release(b);
        wf_tensor_release(out);
    }
}

Test(core_internal_alloc, shortcut_leaves_wrong_outputs_to_the_checks)
{
    /* [1] + [1] is [1]: a [1, 1] output is wrong although every operand has one element. */
    wf_tensor *a = f32(WF_SHAPE(1), 1), *b = f32(WF_SHAPE(1), 2);
    wf_tensor *o11 = wf__tensor_alloc(WF_F32, WF_SHAPE(1, 1));
    cr_assert_eq(wf__binary_cpu(&serial, WF_BINARY_ADD, a, b, o11), WF_ESHAPE);
    cr_assert_not_null(strstr(wf_last_errmsg(), "[1, 1]"), "%s", wf_last_errmsg());
    /* [3] + [1, 1] is [1, 3], not [3]. */
    wf_tensor *x = f32(WF_SHAPE(3), 1), *y = f32(WF_SHAPE(1, 1), 2);
    wf_tensor *o3 = wf__tensor_alloc(WF_F32, WF_SHAPE(3));
    cr_assert_eq(wf__binary_cpu(&serial, WF_BINARY_ADD, x, y, o3), WF_ESHAPE);
    /* A comparison writes bool: an f32 output is refused. */
    wf_tensor *of = wf__tensor_alloc(WF_F32, WF_SHAPE(3));
    cr_assert_eq(wf__binary_cpu(&serial, WF_BINARY_LT, x, x, of), WF_EDTYPE);
    /* Unary into a shape of the same size but another rank. */
    wf_tensor *o13 = wf__tensor_alloc(WF_F32, WF_SHAPE(1, 3));
    cr_assert_eq(wf__unary_cpu(&serial, WF_UNARY_NEG, 0, x, o13), WF_ESHAPE);
    cr_assert_eq(wf__unary_cpu(&serial, WF_UNARY_NEG, 0, x, o3), 0, "%s", wf_last_errmsg());
    cr_assert_eq(((float *)o3->data)[2], -3.0f);
    wf_tensor *all[] = { a, b, o11, x, y, o3, of, o13 };
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++)
        wf_tensor_release(all[k]);
}

Test(core_internal_alloc, shortcut_runs_in_place)
{
    wf_tensor *a = f32(WF_SHAPE(9), 1), *b = f32(WF_SCALAR, 10);
    cr_assert_eq(wf__binary_cpu(&serial, WF_BINARY_MUL, a, b, a), 0, "%s", wf_last_errmsg());
    for (int i = 0; i < 9; i++)
        cr_assert_eq(((float *)a->data)[i], 10.0f * (1 + i));
    wf_tensor_release(a);
    wf_tensor_release(b);
}
