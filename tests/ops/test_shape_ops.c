/* tests/ops/test_shape_ops.c: the shape ops of weft/ops.h (reshape, transpose, slice, split,
 * concat, stack, pad, broadcast_to, expand_dims, squeeze) through the public API: eager
 * graphs against loop references, contiguous and strided inputs (wf_tensor_view with
 * transposed, stepped and negative strides), dtypes moved bit-exactly, -1 dimensions in
 * static graphs, and every error with its code and a message naming the op, the shapes and
 * the file:line of the call. */
#include "eager_util.h"

TestSuite(ops_shape, .init = setup, .fini = teardown, .timeout = WF_TEST_TIMEOUT(60));

/* The row-major values of the view (s, st) over 'data'. */
static void rowmajor(wf_shape s, const int64_t *st, const double *data, double *out)
{
    int64_t n = wf_shape_numel(s), idx[WF_MAX_RANK] = { 0 };
    for (int64_t i = 0; i < n; i++) {
        int64_t off = 0;
        for (int d = 0; d < s.rank; d++)
            off += idx[d] * st[d];
        out[i] = data[off];
        for (int d = s.rank - 1; d >= 0; d--) {
            if (++idx[d] < s.dims[d])
                break;
            idx[d] = 0;
        }
    }
}

static const char *at(int line, char *buf, size_t size)
{
    snprintf(buf, size, "test_shape_ops.c:%d", line);
    return buf;
}

/* ---- reshape, expand_dims, squeeze ---------------------------------------------------------- */

Test(ops_shape, reshape_infers_minus_one_and_copies_in_row_major_order)
{
    wf_graph *g = new_graph(WF_EAGER);
    double v[24];
    iota(v, 24);
    wf_node *x = cst(g, WF_F32, WF_SHAPE(2, 3, 4), v);
    wf_node *y = wf_reshape(g, x, WF_SHAPE(4, -1));
    check_value("reshape", g, y, WF_F32, WF_SHAPE(4, 6), v);
    cr_assert_str_eq(wf_node_op(y), "reshape");
    wf_graph_destroy(g);
}

Test(ops_shape, reshape_of_a_transposed_view_reads_it_in_logical_order)
{
    wf_graph *g = new_graph(WF_EAGER);
    double d[6] = { 0, 1, 2, 3, 4, 5 }, want[6];
    const int64_t st[2] = { 1, 2 }; /* a [2, 3] stored column-major */
    wf_node *x = view(g, WF_SHAPE(2, 3), st, d);
    rowmajor(WF_SHAPE(2, 3), st, d, want);
    check_value("reshape", g, wf_reshape(g, x, WF_SHAPE(6)), WF_F64, WF_SHAPE(6), want);
    check_value("expand", g, wf_expand_dims(g, x, -1), WF_F64, WF_SHAPE(2, 3, 1), want);
    wf_graph_destroy(g);
}

Test(ops_shape, reshape_keeps_integer_and_half_bits)
{
    wf_graph *g = new_graph(WF_EAGER);
    double v[6] = { -3, 1, 2, 1e9, 5, 7 };
    static const wf_dtype dts[] = { WF_I32, WF_I64, WF_BF16, WF_U8 };
    for (int k = 0; k < 4; k++) {
        if (dts[k] == WF_U8)
            v[0] = 3, v[3] = 200;
        wf_node *x = cst(g, dts[k], WF_SHAPE(2, 3), v);
        wf_node *y = wf_reshape(g, x, WF_SHAPE(3, 2));
        double want[6];
        for (int i = 0; i < 6; i++)
            want[i] = wf_tensor_get(wf_node_value(x), i);
        check_value(wf_dtype_name(dts[k]), g, y, dts[k], WF_SHAPE(3, 2), want);
    }
    wf_graph_destroy(g);
}

Test(ops_shape, reshape_with_a_different_count_fails_with_eshape_naming_both_shapes)
{
    char w[64];
    wf_graph *g = new_graph(WF_EAGER);
    wf_node *x = cst(g, WF_F32, WF_SHAPE(2, 3), (double[6]){ 0 });
    wf_node *y = wf_reshape(g, x, WF_SHAPE(4, 2));
    int line = __LINE__ - 1;
    check_error(
        g, y, WF_ESHAPE,
        (const char *[]){ "reshape 'reshape_", "[2, 3]", "[4, 2]", at(line, w, sizeof w), NULL });
    wf_graph_destroy(g);
}

Test(ops_shape, reshape_with_two_minus_ones_or_an_unfit_minus_one_fails)
{
    wf_graph *g = new_graph(WF_EAGER);
    wf_node *x = cst(g, WF_F32, WF_SHAPE(2, 3), (double[6]){ 0 });
    check_error(g, wf_reshape(g, x, WF_SHAPE(-1, -1)), WF_EINVAL,
                (const char *[]){ "reshape", "[2, 3]", "two -1", NULL });
    wf_graph_clear_error(g);
    check_error(g, wf_reshape(g, x, WF_SHAPE(4, -1)), WF_ESHAPE,
                (const char *[]){ "reshape", "[2, 3]", "[4, ?]", NULL });
    wf_graph_destroy(g);
}

Test(ops_shape, reshape_keeps_minus_one_dimensions_in_static_graphs)
{
    wf_graph *g = new_graph(WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(-1, 784));
    wf_node *y = wf_reshape(g, x, WF_SHAPE(-1, 28, 28));
    cr_assert_not_null(y, "%s", wf_graph_errmsg(g));
    cr_assert(wf_shape_equal(wf_node_shape(y), WF_SHAPE(-1, 28, 28)));
    wf_node *z = wf_transpose(g, y, NULL, 0);
    cr_assert(wf_shape_equal(wf_node_shape(z), WF_SHAPE(28, 28, -1)));
    wf_graph_destroy(g);
}

Test(ops_shape, squeeze_drops_one_axis_or_every_size_one_axis)
{
    wf_graph *g = new_graph(WF_EAGER);
    double v[6];
    iota(v, 6);
    wf_node *x = cst(g, WF_F64, WF_SHAPE(1, 2, 1, 3), v);
    check_value("one", g, wf_squeeze(g, x, -2), WF_F64, WF_SHAPE(1, 2, 3), v);
    check_value("all", g, wf_squeeze(g, x, WF_SQUEEZE_ALL), WF_F64, WF_SHAPE(2, 3), v);
    check_value("expand", g, wf_expand_dims(g, x, 0), WF_F64, WF_SHAPE(1, 1, 2, 1, 3), v);
    wf_graph_destroy(g);
}

Test(ops_shape, squeeze_of_a_size_two_axis_and_bad_axes_fail)
{
    char w[64];
    wf_graph *g = new_graph(WF_EAGER);
    wf_node *x = cst(g, WF_F64, WF_SHAPE(1, 2), (double[2]){ 0 });
    wf_node *y = wf_squeeze(g, x, 1);
    int line = __LINE__ - 1;
    check_error(g, y, WF_ESHAPE,
                (const char *[]){ "squeeze", "[1, 2]", "size 2", at(line, w, sizeof w), NULL });
    wf_graph_clear_error(g);
    check_error(g, wf_squeeze(g, x, 2), WF_EINVAL, (const char *[]){ "squeeze", "[1, 2]", NULL });
    wf_graph_clear_error(g);
    check_error(g, wf_expand_dims(g, x, 4), WF_EINVAL,
                (const char *[]){ "expand_dims", "[1, 2]", "axis 4", NULL });
    wf_graph_destroy(g);
}

/* ---- transpose ----------------------------------------------------------------------------- */

Test(ops_shape, transpose_without_perm_swaps_a_matrix)
{
    wf_graph *g = new_graph(WF_EAGER);
    double v[6] = { 0, 1, 2, 3, 4, 5 }, want[6] = { 0, 3, 1, 4, 2, 5 };
    wf_node *x = cst(g, WF_F32, WF_SHAPE(2, 3), v);
    check_value("transpose", g, wf_transpose(g, x, NULL, 0), WF_F32, WF_SHAPE(3, 2), want);
    wf_graph_destroy(g);
}

Test(ops_shape, transpose_of_a_strided_3d_view_matches_a_loop)
{
    wf_graph *g = new_graph(WF_EAGER);
    double d[64], want[24];
    iota(d, 64);
    /* [2, 3, 4] with every axis stepped, the middle one backwards. */
    const int64_t st[3] = { 30, -8, 2 };
    wf_node *x = view(g, WF_SHAPE(2, 3, 4), st, d + 16);
    const int perm[3] = { 2, 0, 1 };
    int64_t pst[3] = { st[2], st[0], st[1] };
    rowmajor(WF_SHAPE(4, 2, 3), pst, d + 16, want);
    check_value("transpose", g, wf_transpose(g, x, perm, 3), WF_F64, WF_SHAPE(4, 2, 3), want);
    wf_graph_destroy(g);
}

Test(ops_shape, transpose_with_a_bad_perm_fails_with_einval_naming_the_shape)
{
    char w[64];
    wf_graph *g = new_graph(WF_EAGER);
    wf_node *x = cst(g, WF_F32, WF_SHAPE(2, 3), (double[6]){ 0 });
    const int perm[2] = { 0, 0 };
    wf_node *y = wf_transpose(g, x, perm, 2);
    int line = __LINE__ - 1;
    check_error(g, y, WF_EINVAL,
                (const char *[]){ "transpose", "[2, 3]", "[0, 0]", at(line, w, sizeof w), NULL });
    wf_graph_clear_error(g);
    const int three[3] = { 0, 1, 2 };
    check_error(g, wf_transpose(g, x, three, 3), WF_EINVAL,
                (const char *[]){ "transpose", "[2, 3]", NULL });
    wf_graph_destroy(g);
}

/* ---- slice and split ----------------------------------------------------------------------- */

/* x[b:e:s] of 0..9 with NumPy semantics, given by hand. */
Test(ops_shape, slice_follows_numpy_steps_and_clamping)
{
    wf_graph *g = new_graph(WF_EAGER);
    double v[10];
    iota(v, 10);
    wf_node *x = cst(g, WF_I64, WF_SHAPE(10), v);

    static const struct {
        int64_t b, e, s;
        int n;
        double want[10];
    } cases[] = {
        { 2, 8, 2, 3, { 2, 4, 6 } },
        { 8, 2, -2, 3, { 8, 6, 4 } },
        { -1, INT64_MIN, -3, 4, { 9, 6, 3, 0 } },
        { -100, 100, 1, 10, { 0, 1, 2, 3, 4, 5, 6, 7, 8, 9 } },
        { 5, 2, 1, 0, { 0 } },
        { -3, -1, 1, 2, { 7, 8 } },
        { 100, -100, -4, 3, { 9, 5, 1 } },
    };

    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        wf_node *y = wf_slice(g, x, &cases[c].b, &cases[c].e, &cases[c].s);
        char what[32];
        snprintf(what, sizeof what, "case %zu", c);
        check_value(what, g, y, WF_I64, WF_SHAPE(cases[c].n), cases[c].want);
    }
    const int64_t back = -1;
    double rev[10];
    for (int i = 0; i < 10; i++)
        rev[i] = 9 - i;
    check_value("reverse", g, wf_slice(g, x, NULL, NULL, &back), WF_I64, WF_SHAPE(10), rev);
    wf_graph_destroy(g);
}

Test(ops_shape, slice_of_a_strided_view_matches_a_loop)
{
    wf_graph *g = new_graph(WF_EAGER);
    double d[40], want[6];
    iota(d, 40);
    const int64_t st[2] = { 1, 5 }; /* [5, 8] column-major */
    wf_node *x = view(g, WF_SHAPE(5, 8), st, d);
    const int64_t b[2] = { 4, 1 }, e[2] = { 0, 7 }, s[2] = { -2, 3 };
    /* rows 4, 2; columns 1, 4 */
    int k = 0;
    for (int i = 4; i > 0; i -= 2)
        for (int j = 1; j < 7; j += 3)
            want[k++] = d[i * 1 + j * 5];
    check_value("slice", g, wf_slice(g, x, b, e, s), WF_F64, WF_SHAPE(2, 2), want);
    wf_graph_destroy(g);
}

Test(ops_shape, slice_with_step_zero_fails_with_einval)
{
    char w[64];
    wf_graph *g = new_graph(WF_EAGER);
    wf_node *x = cst(g, WF_F32, WF_SHAPE(4, 3), (double[12]){ 0 });
    const int64_t s[2] = { 1, 0 };
    wf_node *y = wf_slice(g, x, NULL, NULL, s);
    int line = __LINE__ - 1;
    check_error(
        g, y, WF_EINVAL,
        (const char *[]){ "slice", "[4, 3]", "step 0 on axis 1", at(line, w, sizeof w), NULL });
    wf_graph_destroy(g);
}

Test(ops_shape, split_gives_equal_parts_as_split_nodes)
{
    wf_graph *g = new_graph(WF_EAGER);
    double d[12];
    iota(d, 12);
    const int64_t st[2] = { 1, 2 }; /* [2, 6] column-major */
    wf_node *x = view(g, WF_SHAPE(2, 6), st, d);
    wf_node *parts[3];
    cr_assert_eq(wf_split(g, x, -1, 3, parts), 0, "%s", wf_graph_errmsg(g));
    for (int p = 0; p < 3; p++) {
        double want[4];
        int k = 0;
        for (int i = 0; i < 2; i++)
            for (int j = 2 * p; j < 2 * p + 2; j++)
                want[k++] = d[i + 2 * j];
        check_value("part", g, parts[p], WF_F64, WF_SHAPE(2, 2), want);
        cr_assert_str_eq(wf_node_op(parts[p]), "split");
    }
    wf_graph_destroy(g);
}

Test(ops_shape, split_into_unequal_parts_fails_with_eshape_and_null_outputs)
{
    char w[64];
    wf_graph *g = new_graph(WF_EAGER);
    wf_node *x = cst(g, WF_F32, WF_SHAPE(2, 5), (double[10]){ 0 });
    wf_node *parts[2] = { x, x };
    int rc = wf_split(g, x, 1, 2, parts);
    int line = __LINE__ - 1;
    cr_assert_eq(rc, WF_ESHAPE, "got %s", wf_err_name(rc));
    cr_assert_null(parts[0]);
    cr_assert_null(parts[1]);
    check_error(g, NULL, WF_ESHAPE,
                (const char *[]){ "split", "[2, 5]", "size 5", "2 equal parts",
                                  at(line, w, sizeof w), NULL });
    /* The next node gets its own line, not split's. */
    wf_graph_clear_error(g);
    wf_node *y = wf_neg(g, x);
    cr_assert_eq(wf_node_line(y), __LINE__ - 1);
    wf_graph_destroy(g);
}

/* ---- concat and stack ---------------------------------------------------------------------- */

Test(ops_shape, concat_joins_contiguous_and_strided_inputs)
{
    wf_graph *g = new_graph(WF_EAGER);
    double a[4] = { 0, 1, 2, 3 }, d[6] = { 10, 11, 12, 13, 14, 15 };
    const int64_t st[2] = { 1, 2 }; /* [2, 3] column-major: rows {10, 12, 14}, {11, 13, 15} */
    wf_node *xs[2] = { cst(g, WF_F64, WF_SHAPE(2, 2), a), view(g, WF_SHAPE(2, 3), st, d) };
    double want1[10] = { 0, 1, 10, 12, 14, 2, 3, 11, 13, 15 };
    check_value("axis 1", g, wf_concat(g, xs, 2, -1), WF_F64, WF_SHAPE(2, 5), want1);
    wf_node *ys[3] = { xs[1], xs[1], xs[1] };
    double want0[18];
    for (int r = 0; r < 3; r++)
        rowmajor(WF_SHAPE(2, 3), st, d, want0 + 6 * r);
    check_value("axis 0", g, wf_concat(g, ys, 3, 0), WF_F64, WF_SHAPE(6, 3), want0);
    wf_graph_destroy(g);
}

Test(ops_shape, concat_of_unfit_shapes_or_dtypes_fails_naming_every_shape)
{
    char w[64];
    wf_graph *g = new_graph(WF_EAGER);
    wf_node *xs[2] = { cst(g, WF_F32, WF_SHAPE(2, 3), (double[6]){ 0 }),
                       cst(g, WF_F32, WF_SHAPE(3, 3), (double[9]){ 0 }) };
    wf_node *y = wf_concat(g, xs, 2, 1);
    int line = __LINE__ - 1;
    check_error(g, y, WF_ESHAPE,
                (const char *[]){ "concat", "[2, 3]", "[3, 3]", at(line, w, sizeof w), NULL });
    wf_graph_clear_error(g);
    wf_node *zs[2] = { xs[0], cst(g, WF_F64, WF_SHAPE(2, 3), (double[6]){ 0 }) };
    check_error(g, wf_concat(g, zs, 2, 0), WF_EDTYPE,
                (const char *[]){ "concat", "f32 [2, 3]", "f64 [2, 3]", NULL });
    wf_graph_clear_error(g);
    check_error(g, wf_concat(g, xs, 2, 2), WF_EINVAL,
                (const char *[]){ "concat", "[2, 3]", "[3, 3]", "axis 2", NULL });
    wf_graph_clear_error(g);
    check_error(g, wf_concat(g, xs, 0, 0), WF_EINVAL, (const char *[]){ "concat", NULL });
    wf_graph_destroy(g);
}

Test(ops_shape, stack_adds_a_new_axis_at_either_end)
{
    wf_graph *g = new_graph(WF_EAGER);
    double a[3] = { 0, 1, 2 }, b[3] = { 5, 6, 7 }, d[6] = { 9, 0, 8, 0, 7, 0 };
    const int64_t st[1] = { 2 };
    wf_node *xs[3] = { cst(g, WF_F32, WF_SHAPE(3), a), cst(g, WF_F32, WF_SHAPE(3), b),
                       wf_cast(g, view(g, WF_SHAPE(3), st, d), WF_F32) };
    double w0[9] = { 0, 1, 2, 5, 6, 7, 9, 8, 7 }, w1[9] = { 0, 5, 9, 1, 6, 8, 2, 7, 7 };
    check_value("axis 0", g, wf_stack(g, xs, 3, 0), WF_F32, WF_SHAPE(3, 3), w0);
    check_value("axis -1", g, wf_stack(g, xs, 3, -1), WF_F32, WF_SHAPE(3, 3), w1);
    wf_node *vs[2] = { view(g, WF_SHAPE(3), st, d), view(g, WF_SHAPE(3), st, d) };
    double w2[6] = { 9, 9, 8, 8, 7, 7 };
    check_value("strided", g, wf_stack(g, vs, 2, 1), WF_F64, WF_SHAPE(3, 2), w2);
    wf_graph_destroy(g);
}

Test(ops_shape, stack_of_different_shapes_fails_with_eshape_naming_both)
{
    char w[64];
    wf_graph *g = new_graph(WF_EAGER);
    wf_node *xs[2] = { cst(g, WF_F32, WF_SHAPE(3), (double[3]){ 0 }),
                       cst(g, WF_F32, WF_SHAPE(4), (double[4]){ 0 }) };
    wf_node *y = wf_stack(g, xs, 2, 0);
    int line = __LINE__ - 1;
    check_error(g, y, WF_ESHAPE,
                (const char *[]){ "stack", "[3]", "[4]", at(line, w, sizeof w), NULL });
    wf_graph_clear_error(g);
    check_error(g, wf_stack(g, xs, 1, 2), WF_EINVAL,
                (const char *[]){ "stack", "[3]", "axis 2", NULL });
    wf_graph_destroy(g);
}

/* ---- pad and broadcast_to ------------------------------------------------------------------ */

Test(ops_shape, pad_surrounds_a_strided_input_with_the_value)
{
    wf_graph *g = new_graph(WF_EAGER);
    double d[4] = { 1, 2, 3, 4 };
    const int64_t st[2] = { 1, 2 }; /* [[1, 3], [2, 4]] */
    wf_node *x = view(g, WF_SHAPE(2, 2), st, d);
    const int64_t before[2] = { 1, 0 }, after[2] = { 0, 2 };
    double want[12] = { -1, -1, -1, -1, 1, 3, -1, -1, 2, 4, -1, -1 };
    check_value("pad", g, wf_pad(g, x, before, after, -1), WF_F64, WF_SHAPE(3, 4), want);
    wf_node *xi = cst(g, WF_I32, WF_SHAPE(2), (double[2]){ 5, 6 });
    const int64_t one = 1;
    check_value("i32", g, wf_pad(g, xi, &one, NULL, 7), WF_I32, WF_SHAPE(3),
                (double[3]){ 7, 5, 6 });
    wf_graph_destroy(g);
}

Test(ops_shape, pad_by_a_negative_amount_fails_with_einval)
{
    char w[64];
    wf_graph *g = new_graph(WF_EAGER);
    wf_node *x = cst(g, WF_F32, WF_SHAPE(2, 2), (double[4]){ 0 });
    const int64_t before[2] = { 0, -1 };
    wf_node *y = wf_pad(g, x, before, NULL, 0);
    int line = __LINE__ - 1;
    check_error(g, y, WF_EINVAL,
                (const char *[]){ "pad", "[2, 2]", "axis 1", at(line, w, sizeof w), NULL });
    wf_graph_destroy(g);
}

Test(ops_shape, broadcast_to_repeats_size_one_and_missing_axes)
{
    wf_graph *g = new_graph(WF_EAGER);
    double d[6] = { 1, 0, 2, 0, 3, 0 };
    const int64_t st[2] = { 2, 0 }; /* [3, 1] stepping over gaps */
    wf_node *x = view(g, WF_SHAPE(3, 1), st, d);
    double want[24];
    for (int i = 0; i < 2; i++)
        for (int r = 0; r < 3; r++)
            for (int c = 0; c < 4; c++)
                want[i * 12 + r * 4 + c] = d[2 * r];
    check_value("bcast", g, wf_broadcast_to(g, x, WF_SHAPE(2, 3, 4)), WF_F64, WF_SHAPE(2, 3, 4),
                want);
    wf_graph_destroy(g);
}

Test(ops_shape, broadcast_to_an_unfit_shape_fails_with_eshape_naming_both)
{
    char w[64];
    wf_graph *g = new_graph(WF_EAGER);
    wf_node *x = cst(g, WF_F32, WF_SHAPE(3, 2), (double[6]){ 0 });
    wf_node *y = wf_broadcast_to(g, x, WF_SHAPE(3, 4));
    int line = __LINE__ - 1;
    check_error(
        g, y, WF_ESHAPE,
        (const char *[]){ "broadcast_to", "[3, 2]", "[3, 4]", at(line, w, sizeof w), NULL });
    wf_graph_clear_error(g);
    check_error(g, wf_broadcast_to(g, x, WF_SHAPE(2)), WF_EINVAL,
                (const char *[]){ "broadcast_to", "[3, 2]", "[2]", NULL });
    wf_graph_destroy(g);
}

/* Bug: wf_split(g, x, 0, 2, NULL) returned 0 and added two nodes nobody could reach. */
Test(ops_shape, split_without_outs_fails_with_einval_and_adds_no_node)
{
    wf_graph *g = new_graph(WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(4, 3));
    int before = wf_graph_node_count(g);
    int rc = wf_split(g, x, 0, 2, NULL);
    cr_assert_eq(rc, WF_EINVAL, "got %s", wf_err_name(rc));
    cr_assert_eq(wf_graph_node_count(g), before, "%d nodes added", wf_graph_node_count(g) - before);
    cr_assert(strstr(wf_graph_errmsg(g), "wf_split") && strstr(wf_graph_errmsg(g), "outs"), "%s",
              wf_graph_errmsg(g));
    wf_graph_destroy(g);
}

Test(ops_shape, a_null_input_keeps_the_first_error)
{
    wf_graph *g = new_graph(WF_EAGER);
    wf_node *x = cst(g, WF_F32, WF_SHAPE(2, 3), (double[6]){ 0 });
    wf_node *bad = wf_reshape(g, x, WF_SHAPE(5));
    cr_assert_null(bad);
    char first[512];
    snprintf(first, sizeof first, "%s", wf_graph_errmsg(g));
    cr_assert_null(wf_transpose(g, bad, NULL, 0));
    cr_assert_null(wf_slice(g, bad, NULL, NULL, NULL));
    cr_assert_null(wf_pad(g, bad, NULL, NULL, 0));
    wf_node *parts[2];
    cr_assert_lt(wf_split(g, bad, 0, 2, parts), 0);
    cr_assert_str_eq(wf_graph_errmsg(g), first);
    wf_graph_destroy(g);
}

Test(ops_shape, a_session_runs_shape_ops_on_each_fed_batch_size)
{
    wf_graph *g = new_graph(WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F64, WF_SHAPE(-1, 4));
    wf_node *r = wf_reshape(g, x, WF_SHAPE(-1, 2, 2));
    const int perm[3] = { 0, 2, 1 };
    wf_node *t = wf_transpose(g, r, perm, 3);
    const int64_t b[3] = { 0, 0, 1 }, e[3] = { INT64_MAX, INT64_MAX, 2 };
    wf_node *s = wf_slice(g, t, b, e, NULL); /* [-1, 2, 1]: column 1 of each block */
    wf_node *pair[2] = { s, s };
    wf_node *y = wf_concat(g, pair, 2, 0);
    cr_assert_not_null(y, "%s", wf_graph_errmsg(g));
    cr_assert(wf_shape_equal(wf_node_shape(y), WF_SHAPE(-1, 2, 1)));
    wf_session *sess = NULL;
    cr_assert_eq(wf_session_create(g, NULL, &sess), 0, "%s", wf_graph_errmsg(g));
    for (int batch = 1; batch <= 3; batch++) {
        double xs[12];
        iota(xs, batch * 4);
        wf_tensor *xt = wf_tensor_from(WF_F64, WF_SHAPE(batch, 4), xs), *out = NULL;
        int rc = wf_session_run(sess, &(wf_feed){ x, xt }, 1, &y, 1, &out, NULL, 0);
        cr_assert_eq(rc, 0, "%s: %s", wf_err_name(rc), wf_session_errmsg(sess));
        cr_assert(wf_shape_equal(wf_tensor_shape(out), WF_SHAPE(2 * batch, 2, 1)));
        /* t[i, j, k] = x[i, 2k + j]; s[i, j] = t[i, j, 1] = x[i, 2 + j]. */
        for (int c = 0; c < 2; c++)
            for (int i = 0; i < batch; i++)
                for (int j = 0; j < 2; j++)
                    cr_assert_eq(wf_tensor_get(out, (c * batch + i) * 2 + j), xs[i * 4 + 2 + j]);
        wf_tensor_release(out);
        wf_tensor_release(xt);
    }
    wf_session_destroy(sess);
    wf_graph_destroy(g);
}
