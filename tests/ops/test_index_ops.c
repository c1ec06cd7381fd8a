/* tests/ops/test_index_ops.c: the indexing ops of weft/ops.h (gather, one_hot) through the
 * public API: eager graphs against loop references, i32 and i64 indices, contiguous and
 * strided params and indices (wf_tensor_view), and every error with its code and a message
 * naming the op, the shapes and the file:line (an out-of-range gather index names the
 * index). */
#include "eager_util.h"

TestSuite(ops_index, .init = setup, .fini = teardown, .timeout = WF_TEST_TIMEOUT(60));

static const char *at(int line, char *buf, size_t size)
{
    snprintf(buf, size, "test_index_ops.c:%d", line);
    return buf;
}

Test(ops_index, gather_along_each_axis_matches_a_loop)
{
    wf_graph *g = new_graph(WF_EAGER);
    double p[24];
    iota(p, 24); /* params [2, 3, 4] */
    static const wf_dtype idts[] = { WF_I32, WF_I64 };
    double iv[4] = { 1, 0, 1, 1 }; /* indices [2, 2], valid on every axis */
    for (int k = 0; k < 2; k++) {
        wf_node *params = cst(g, WF_F32, WF_SHAPE(2, 3, 4), p);
        wf_node *idx = cst(g, idts[k], WF_SHAPE(2, 2), iv);
        for (int axis = 0; axis < 3; axis++) {
            wf_node *y = wf_gather(g, params, idx, axis - (k ? 3 : 0));
            int64_t dims[3] = { 2, 3, 4 };
            wf_shape s = { .rank = 4 };
            for (int d = 0, o = 0; d < 3; d++) {
                if (d == axis) {
                    s.dims[o++] = 2;
                    s.dims[o++] = 2;
                } else {
                    s.dims[o++] = dims[d];
                }
            }
            double want[64];
            int n = 0;
            int64_t outer = 1, inner = 1;
            for (int d = 0; d < axis; d++)
                outer *= dims[d];
            for (int d = axis + 1; d < 3; d++)
                inner *= dims[d];
            for (int64_t o = 0; o < outer; o++)
                for (int j = 0; j < 4; j++)
                    for (int64_t i = 0; i < inner; i++)
                        want[n++] = p[(o * dims[axis] + (int64_t)iv[j]) * inner + i];
            char what[32];
            snprintf(what, sizeof what, "%s axis %d", wf_dtype_name(idts[k]), axis);
            check_value(what, g, y, WF_F32, s, want);
        }
    }
    wf_graph_destroy(g);
}

Test(ops_index, gather_reads_strided_params_and_indices)
{
    wf_graph *g = new_graph(WF_EAGER);
    double p[12];
    iota(p, 12);
    const int64_t pst[2] = { 1, 3 }; /* params [3, 4] column-major: (i, j) = 3j + i */
    wf_node *params = view(g, WF_SHAPE(3, 4), pst, p);
    wf_tensor *t = NULL;
    int64_t iv[6] = { 3, -9, 0, -9, 2, -9 }; /* indices [3] = {3, 0, 2}, stride 2 */
    const int64_t ist[1] = { 2 };
    cr_assert_eq(wf_tensor_view(WF_I64, WF_SHAPE(3), ist, iv, &t), 0);
    wf_node *idx = wf_constant(g, t);
    wf_tensor_release(t);
    double want[9];
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++)
            want[i * 3 + j] = p[3 * iv[2 * j] + i];
    check_value("gather", g, wf_gather(g, params, idx, 1), WF_F64, WF_SHAPE(3, 3), want);
    /* Along axis 0 the gathered rows are strided too (out[j, k] = params[idx[j], k]). */
    const int64_t rows[2] = { 2, 0 };
    wf_node *ridx = wf_constant(g, t = wf_tensor_from(WF_I64, WF_SHAPE(2), rows));
    wf_tensor_release(t);
    double want0[8];
    for (int j = 0; j < 2; j++)
        for (int k = 0; k < 4; k++)
            want0[j * 4 + k] = p[3 * k + rows[j]];
    check_value("rows", g, wf_gather(g, params, ridx, 0), WF_F64, WF_SHAPE(2, 4), want0);
    wf_graph_destroy(g);
}

Test(ops_index, gather_with_an_out_of_range_index_fails_naming_it)
{
    char w[64];
    wf_graph *g = new_graph(WF_EAGER);
    wf_node *params = cst(g, WF_F32, WF_SHAPE(3, 2), (double[6]){ 0 });
    wf_node *idx = cst(g, WF_I32, WF_SHAPE(2), (double[2]){ 1, 5 });
    wf_node *y = wf_gather(g, params, idx, 0);
    int line = __LINE__ - 1;
    check_error(g, y, WF_EINVAL,
                (const char *[]){ "gather", "index 5", "position 1", "[3, 2]",
                                  at(line, w, sizeof w), NULL });
    wf_graph_clear_error(g);
    wf_node *neg = cst(g, WF_I64, WF_SHAPE(1), (double[1]){ -1 });
    check_error(g, wf_gather(g, params, neg, 0), WF_EINVAL,
                (const char *[]){ "gather", "index -1", NULL });
    wf_graph_destroy(g);
}

Test(ops_index, gather_with_float_indices_or_a_bad_axis_fails)
{
    char w[64];
    wf_graph *g = new_graph(WF_EAGER);
    wf_node *params = cst(g, WF_F32, WF_SHAPE(3, 2), (double[6]){ 0 });
    wf_node *fidx = cst(g, WF_F32, WF_SHAPE(2), (double[2]){ 0 });
    wf_node *y = wf_gather(g, params, fidx, 0);
    int line = __LINE__ - 1;
    check_error(g, y, WF_EDTYPE,
                (const char *[]){ "gather", "[3, 2]", "f32 [2]", at(line, w, sizeof w), NULL });
    wf_graph_clear_error(g);
    wf_node *idx = cst(g, WF_I32, WF_SHAPE(2), (double[2]){ 0 });
    check_error(g, wf_gather(g, params, idx, 2), WF_EINVAL,
                (const char *[]){ "gather", "[3, 2]", "[2]", "axis 2", NULL });
    wf_graph_destroy(g);
}

Test(ops_index, gather_keeps_minus_one_dimensions_in_static_graphs)
{
    wf_graph *g = new_graph(WF_STATIC);
    wf_node *emb = wf_placeholder(g, "emb", WF_F32, WF_SHAPE(1000, 64));
    wf_node *ids = wf_placeholder(g, "ids", WF_I32, WF_SHAPE(-1, 12));
    wf_node *y = wf_gather(g, emb, ids, 0);
    cr_assert_not_null(y, "%s", wf_graph_errmsg(g));
    cr_assert(wf_shape_equal(wf_node_shape(y), WF_SHAPE(-1, 12, 64)));
    wf_node *oh = wf_one_hot(g, ids, 10, WF_F32);
    cr_assert(wf_shape_equal(wf_node_shape(oh), WF_SHAPE(-1, 12, 10)));
    wf_graph_destroy(g);
}

Test(ops_index, one_hot_sets_one_per_row_and_zeros_out_of_range_rows)
{
    wf_graph *g = new_graph(WF_EAGER);
    static const wf_dtype dts[] = { WF_F32, WF_F64, WF_I32, WF_BOOL };
    double iv[4] = { 2, 0, 3, -1 };
    double want[12] = { 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0 };
    for (int k = 0; k < 4; k++) {
        wf_node *idx = cst(g, k % 2 ? WF_I64 : WF_I32, WF_SHAPE(2, 2), iv);
        check_value(wf_dtype_name(dts[k]), g, wf_one_hot(g, idx, 3, dts[k]), dts[k],
                    WF_SHAPE(2, 2, 3), want);
    }
    /* Strided indices. */
    int32_t sv[4] = { 1, 7, 0, 7 };
    const int64_t st[1] = { 2 };
    wf_tensor *t = NULL;
    cr_assert_eq(wf_tensor_view(WF_I32, WF_SHAPE(2), st, sv, &t), 0);
    wf_node *idx = wf_constant(g, t);
    wf_tensor_release(t);
    check_value("strided", g, wf_one_hot(g, idx, 2, WF_F32), WF_F32, WF_SHAPE(2, 2),
                (double[4]){ 0, 1, 1, 0 });
    wf_graph_destroy(g);
}

Test(ops_index, one_hot_with_float_indices_or_negative_depth_fails)
{
    char w[64];
    wf_graph *g = new_graph(WF_EAGER);
    wf_node *f = cst(g, WF_F32, WF_SHAPE(4), (double[4]){ 0 });
    wf_node *y = wf_one_hot(g, f, 3, WF_F32);
    int line = __LINE__ - 1;
    check_error(g, y, WF_EDTYPE,
                (const char *[]){ "one_hot", "f32 [4]", at(line, w, sizeof w), NULL });
    wf_graph_clear_error(g);
    wf_node *i = cst(g, WF_I32, WF_SHAPE(4), (double[4]){ 0 });
    check_error(g, wf_one_hot(g, i, -2, WF_F32), WF_EINVAL,
                (const char *[]){ "one_hot", "[4]", "depth -2", NULL });
    wf_graph_clear_error(g);
    check_error(g, wf_one_hot(g, i, 2, (wf_dtype)99), WF_EINVAL,
                (const char *[]){ "one_hot", "[4]", "99", NULL });
    wf_graph_destroy(g);
}
