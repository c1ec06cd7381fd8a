/* tests/core/test_shape.c: shapes: element counts (scalars, zero and unknown dimensions,
 * overflow), equality, printing, and NumPy broadcasting including -1 ("any") dimensions and
 * the error message for shapes that do not broadcast. */
#include "wf_test.h"

#include <weft/weft.h>

#include <criterion/criterion.h>

#include <string.h>

TestSuite(core_shape, .fini = wf_test_fini, .timeout = 10);

Test(core_shape, macro_sets_rank_and_dims)
{
    wf_shape s = WF_SHAPE(2, 3, 4);
    cr_assert_eq(s.rank, 3);
    cr_assert_eq(s.dims[0], 2);
    cr_assert_eq(s.dims[2], 4);
    cr_assert_eq(WF_SCALAR.rank, 0);
    wf_shape e = WF_SHAPE(1, 2, 3, 4, 5, 6, 7, 8);
    cr_assert_eq(e.rank, 8);
    cr_assert_eq(e.dims[7], 8);
}

Test(core_shape, numel_multiplies_dims)
{
    cr_assert_eq(wf_shape_numel(WF_SCALAR), 1);
    cr_assert_eq(wf_shape_numel(WF_SHAPE(256, 784)), 256 * 784);
    cr_assert_eq(wf_shape_numel(WF_SHAPE(3, 0, 5)), 0);
    cr_assert_eq(wf_shape_numel(WF_SHAPE(-1, 5)), -1, "unknown dims have no count");
    cr_assert_eq(wf_shape_numel(WF_SHAPE(1 << 30, 1 << 30, 1 << 30)), -1, "overflow is -1");
    cr_assert_eq(wf_shape_numel((wf_shape){ .rank = 9 }), -1);
    cr_assert_eq(wf_shape_numel((wf_shape){ .rank = -1 }), -1);
}

Test(core_shape, equal_compares_rank_and_dims_only)
{
    wf_shape a = WF_SHAPE(2, 3), b = WF_SHAPE(2, 3);
    b.dims[5] = 99; /* beyond the rank: ignored */
    cr_assert(wf_shape_equal(a, b));
    cr_assert_not(wf_shape_equal(a, WF_SHAPE(3, 2)));
    cr_assert_not(wf_shape_equal(a, WF_SHAPE(2, 3, 1)));
    cr_assert(wf_shape_equal(WF_SCALAR, WF_SCALAR));
}

Test(core_shape, str_prints_dims_and_unknowns)
{
    char buf[64];
    cr_assert_str_eq(wf_shape_str(WF_SHAPE(256, 784), buf, sizeof buf), "[256, 784]");
    cr_assert_str_eq(wf_shape_str(WF_SCALAR, buf, sizeof buf), "[]");
    cr_assert_str_eq(wf_shape_str(WF_SHAPE(-1, 10), buf, sizeof buf), "[?, 10]");
    cr_assert_str_eq(wf_shape_str(WF_SHAPE(7), buf, sizeof buf), "[7]");
}

Test(core_shape, str_truncates_safely_into_small_buffers)
{
    char buf[6];
    memset(buf, 'x', sizeof buf);
    wf_shape_str(WF_SHAPE(12345, 67890), buf, sizeof buf);
    cr_assert_eq(strlen(buf), 5);
    cr_assert_eq(strncmp(buf, "[1234", 5), 0, "got %s", buf);
    cr_assert_null(wf_shape_str(WF_SHAPE(1), NULL, 10));
    char one[1] = { 'x' };
    wf_shape_str(WF_SHAPE(1), one, 0); /* size 0: nothing written */
    cr_assert_eq(one[0], 'x');
}

static wf_shape bcast(wf_shape a, wf_shape b)
{
    wf_shape out;
    int rc = wf_shape_broadcast(a, b, &out);
    cr_assert_eq(rc, 0, "%s", wf_last_errmsg());
    return out;
}

Test(core_shape, broadcast_follows_numpy)
{
    cr_assert(wf_shape_equal(bcast(WF_SHAPE(2, 3), WF_SHAPE(2, 3)), WF_SHAPE(2, 3)));
    cr_assert(wf_shape_equal(bcast(WF_SHAPE(256, 10), WF_SHAPE(10)), WF_SHAPE(256, 10)));
    cr_assert(wf_shape_equal(bcast(WF_SHAPE(10), WF_SHAPE(256, 10)), WF_SHAPE(256, 10)));
    cr_assert(wf_shape_equal(bcast(WF_SHAPE(4, 1, 3), WF_SHAPE(5, 1)), WF_SHAPE(4, 5, 3)));
    cr_assert(wf_shape_equal(bcast(WF_SCALAR, WF_SHAPE(2, 2)), WF_SHAPE(2, 2)));
    cr_assert(wf_shape_equal(bcast(WF_SCALAR, WF_SCALAR), WF_SCALAR));
    cr_assert(wf_shape_equal(bcast(WF_SHAPE(1), WF_SHAPE(0)), WF_SHAPE(0)));
    cr_assert(wf_shape_equal(bcast(WF_SHAPE(3, 0), WF_SHAPE(1, 1)), WF_SHAPE(3, 0)));
}

Test(core_shape, broadcast_carries_unknown_dimensions)
{
    cr_assert(wf_shape_equal(bcast(WF_SHAPE(-1, 10), WF_SHAPE(10)), WF_SHAPE(-1, 10)));
    cr_assert(wf_shape_equal(bcast(WF_SHAPE(-1, 10), WF_SHAPE(1, 10)), WF_SHAPE(-1, 10)));
    cr_assert(wf_shape_equal(bcast(WF_SHAPE(1, 10), WF_SHAPE(-1, 1)), WF_SHAPE(-1, 10)));
    cr_assert(wf_shape_equal(bcast(WF_SHAPE(-1), WF_SHAPE(-1)), WF_SHAPE(-1)));
    /* -1 against a size > 1: the size wins (the fed size must be 1 or equal). */
    cr_assert(wf_shape_equal(bcast(WF_SHAPE(-1, 3), WF_SHAPE(5, 3)), WF_SHAPE(5, 3)));
    cr_assert(wf_shape_equal(bcast(WF_SHAPE(5, 3), WF_SHAPE(-1, 3)), WF_SHAPE(5, 3)));
}

Test(core_shape, broadcast_mismatch_names_both_shapes)
{
    wf_shape out = WF_SHAPE(9);
    int rc = wf_shape_broadcast(WF_SHAPE(3, 4), WF_SHAPE(5, 4), &out);
    cr_assert_eq(rc, WF_ESHAPE);
    const char *m = wf_last_errmsg();
    cr_assert(strstr(m, "[3, 4]") && strstr(m, "[5, 4]"), "message: %s", m);
    cr_assert(wf_shape_equal(out, WF_SHAPE(9)), "out is untouched on error");
    cr_assert_eq(wf_shape_broadcast(WF_SHAPE(2), WF_SHAPE(3), &out), WF_ESHAPE);
    cr_assert_eq(wf_shape_broadcast(WF_SHAPE(2, 0), WF_SHAPE(3), &out), WF_ESHAPE);
}

Test(core_shape, broadcast_bad_arguments_are_einval)
{
    wf_shape out;
    cr_assert_eq(wf_shape_broadcast(WF_SHAPE(2), WF_SHAPE(2), NULL), WF_EINVAL);
    cr_assert_eq(wf_shape_broadcast((wf_shape){ .rank = 9 }, WF_SHAPE(2), &out), WF_EINVAL);
    cr_assert_eq(wf_shape_broadcast(WF_SHAPE(2), (wf_shape){ .rank = -3 }, &out), WF_EINVAL);
}
