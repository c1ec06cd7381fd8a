/* ops/layout.h: the host-side work a CPU kernel and its CUDA twin share: argument checks,
 * output shapes and the layouts (sizes, strides, offsets) of the operands they read, so that
 * both check the same things with the same messages and walk the same axes. A module
 * interface of ops/ (not installed, not internal.h); C, and included by the .cu files inside
 * cuda_common.h's extern "C" block.
 * Owns: the declarations; each function is defined in the CPU kernel file (or, for what reads
 *   a node's attributes, the op file) named above it.
 * Invariant: every function here is host-only arithmetic on tensor metadata: it reads no
 *   element, so the CUDA entries call it on device tensors.
 * Not here: the per-element loops (scalar.h, and the .cu kernels). */
#ifndef WF_OPS_LAYOUT_H
#define WF_OPS_LAYOUT_H

#include "kernels.h"

#include <weft/core.h>

#include <stdbool.h>
#include <stdint.h>

/* elementwise_cpu.c: the broadcast shape of 'in[0..n)' (named 'names' in messages) in
 * 'res', or WF_ESHAPE naming the two shapes that do not broadcast. */
int wf__ops_broadcast_shapes(const char *op, const wf_tensor *const *in, const char *const *names,
                             int n, wf_shape *res);

/* elementwise_cpu.c: where(cond, a, b)'s checks (cond bool, a and b of one dtype, the three
 * broadcast, 'out' of a's dtype and the broadcast shape, which goes to 'shape'). */
int wf__ops_where_check(const wf_tensor *cond, const wf_tensor *a, const wf_tensor *b,
                        const wf_tensor *out, wf_shape *shape);

/* The geometry of a 2-D pooling op over an NCHW input, which pool_cpu.c's and
 * pool_cuda.cu's plans both carry. */
typedef struct wf__pool_geom {
    int64_t N, C, H, W, OH, OW, KH, KW, sh, sw, pt, pl; /* sizes, window, stride, pads */
    bool incl;                                          /* count_include_pad */
} wf__pool_geom;

/* pool_cpu.c: the checks of pooling op 'op' ('bwd': a backward op, which reads 'dy';
 * 'avg_bwd': average pooling's backward, where 'out' gives x's shape and 'x' is not read),
 * with the same messages on every device; fills in 'g' and the dtype 'dt'. */
int wf__ops_pool_check(const char *op, bool bwd, bool avg_bwd, const wf_pool_params *prm,
                       const wf_tensor *x, const wf_tensor *dy, const wf_tensor *out,
                       wf__pool_geom *g, wf_dtype *dt);

/* Writes to 'st[0..r)' the strides of 't' broadcast to a rank-'r' shape ('t' broadcasts to
 * it: checked by the caller), in units of 'unit' per element (1: elements; the dtype's size:
 * bytes); 0 along the axes that 't' lacks or has size 1 on. */
void wf__ops_bcast_strides(const wf_tensor *t, int r, int64_t unit, int64_t *st);

/* Drops the size-1 axes of 'shape' and merges an axis into the one before it when, for every
 * one of the 'n_ops' operands, the outer stride is the inner stride times the inner size.
 * 'full[k]' holds operand k's strides along the axes of 'shape' (wf__ops_bcast_strides()).
 * Writes the merged sizes to 'dims' and the merged strides to 'st[k]'; returns the merged
 * rank, at least 1 (a scalar, or all sizes 1, is one axis of size 1 with stride 0). */
int wf__ops_merge_axes(wf_shape shape, int n_ops, int64_t (*full)[WF_MAX_RANK], int64_t *dims,
                       int64_t (*st)[WF_MAX_RANK]);

/* shape_cpu.c: the shape ops' checks and the layout of what they read ('ss': x's strides in
 * out's axis order; 'off': the element offset of the first element read). Each returns 0 or
 * a negative status with the message set ("<op>: ..."). */

/* 'x' and 'out' are non-NULL, of one dtype, and 'out' is contiguous. */
int wf__ops_shape_check(const char *op, const wf_tensor *x, const wf_tensor *out);

/* reshape: 'x' and 'out' have as many elements. */
int wf__ops_reshape_check(const wf_tensor *x, const wf_tensor *out);

/* transpose by 'perm[0..n)': '*sh' the permuted shape (checked against 'out'). */
int wf__ops_transpose_layout(const int *perm, int n, const wf_tensor *x, const wf_tensor *out,
                             wf_shape *sh, int64_t *ss);

/* slice (wf__slice_dim() per axis): '*sh' the slice's shape (checked against 'out'). */
int wf__ops_slice_layout(const int64_t *begin, const int64_t *end, const int64_t *step,
                         const wf_tensor *x, const wf_tensor *out, wf_shape *sh, int64_t *ss,
                         int64_t *off);

/* broadcast_to: 'ss' has out's rank (0 along broadcast axes). */
int wf__ops_broadcast_layout(const wf_tensor *x, const wf_tensor *out, int64_t *ss);

/* concat and stack: input 'i' ('x') goes to the box of 'out' that starts at 'pos' along
 * 'axis'; 'stack' inserts 'axis' into its shape as a size-1 axis first. Writes the box's
 * sizes 'dims[0..*rank)' and x's strides 'ss'. */
int wf__ops_join_layout(const char *op, bool stack, int axis, int i, const wf_tensor *x,
                        const wf_tensor *out, int64_t pos, int64_t *dims, int64_t *ss, int *rank);

/* concat and stack: before the inputs, there is at least one and 'out' is not NULL; after
 * them, the boxes filled 'out' along 'axis' ('pos': where the last one ended). */
int wf__ops_join_check(const char *op, const wf_tensor *const *xs, int n, const wf_tensor *out);
int wf__ops_join_filled(const char *op, int axis, int64_t pos, const wf_tensor *out);

/* pad: out's shape is x's plus 'before' and 'after' (checked); '*off' is where x starts in
 * 'out' (out's strides). */
int wf__ops_pad_layout(const int64_t *before, const int64_t *after, const wf_tensor *x,
                       const wf_tensor *out, int64_t *off);

/* backward_cpu.c: slice_backward writes dy ('out' is x's shape) at what slice reads: 'ds'
 * the strides of out along dy's axes, '*off' the first position. Checks that dy has the
 * slice's shape. */
int wf__ops_slice_backward_layout(const int64_t *begin, const int64_t *end, const int64_t *step,
                                  const wf_tensor *dy, const wf_tensor *out, int64_t *ds,
                                  int64_t *off);

/* index_cpu.c: the index ops' checks (dtypes, and out's shape for gather: params with axis
 * 'axis' replaced by indices' shape; for scatter_add: updates are out[:axis] + indices +
 * out[axis+1:]; for one_hot: indices' shape plus the depth axis, contiguous). */
int wf__ops_gather_check(int axis, const wf_tensor *params, const wf_tensor *indices,
                         const wf_tensor *out);
int wf__ops_scatter_add_check(int axis, const wf_tensor *u, const wf_tensor *indices,
                              const wf_tensor *out);
int wf__ops_one_hot_check(const wf_tensor *indices, const wf_tensor *out);

/* norm_cpu.c: layer_norm's checks: x floating with rank > begin_axis, gamma/beta of the
 * normalized shape and dy of x's, all of x's dtype, and out. */
int wf__ops_layer_norm_check(const char *op, int begin_axis, double eps, const wf_tensor *x,
                             const wf_tensor *gamma, const wf_tensor *beta, const wf_tensor *dy,
                             const wf_tensor *out);

/* reduce_cpu.c: a reduction's checks (op, x's dtype, 'axes' valid and distinct, out's shape
 * and dtype); sets 'mask[d]' for the reduced axes of x. And the op's name ("reduce" for an
 * unknown one). */
int wf__ops_reduce_check(wf__reduce_kind op, const int *axes, int n_axes, bool keepdims,
                         const wf_tensor *x, const wf_tensor *out, bool *mask);
const char *wf__ops_reduce_name(wf__reduce_kind op);

/* The geometry of a reduction of 'x' over the axes 'mask' marks, which reduce_cpu.c's and
 * reduce_cuda.cu's plans both carry: output element o is kept position o, and its reduced
 * positions are 0 .. m-1, both row-major over the axes left after dropping size-1 axes (and,
 * for the reduced ones, merging an axis into the one before it where contiguous; order is
 * kept). 'rr' is at least 1: with nothing left to reduce, one axis of size 1 and stride 0.
 * Strides in elements. */
typedef struct wf__reduce_geom {
    int kr, rr;                                   /* kept and reduced ranks */
    int64_t nout, m;                              /* outputs, reduced positions per output */
    int64_t kdims[WF_MAX_RANK], kst[WF_MAX_RANK]; /* kept axes */
    int64_t rdims[WF_MAX_RANK], rst[WF_MAX_RANK]; /* reduced axes */
} wf__reduce_geom;

/* reduce_cpu.c: fills 'g' for 'x' and 'mask' (wf__ops_reduce_check()'s). */
void wf__ops_reduce_geom(const wf_tensor *x, const bool *mask, wf__reduce_geom *g);

/* softmax_cpu.c: the softmax ops' checks on x (floating, rank >= 1, 'axis' in range: '*axis_out'
 * is it made non-negative) and, when 'labels' is not NULL, on the labels (i32 or i64 of
 * 'lshape', x's shape without the axis). */
int wf__ops_softmax_check(const char *name, int axis, const wf_tensor *x, const wf_tensor *labels,
                          int *axis_out, wf_shape *lshape);

/* The geometry of a softmax op's rows, which softmax_cpu.c's and softmax_cuda.cu's plans
 * both carry: row r is position r, row-major, over x's axes other than the softmax axis
 * ('orank' of them, sizes 'odims'), with the strides of x, out, labels and dloss along them
 * (0 for an operand not given) and of x and out along the axis. Strides in elements; 'out'
 * contiguous. */
typedef struct wf__softmax_geom {
    int orank;
    int64_t C, rows;                              /* the axis's size, the rows */
    int64_t odims[WF_MAX_RANK], xst[WF_MAX_RANK]; /* the other axes, x's strides along them */
    int64_t ost[WF_MAX_RANK], lst[WF_MAX_RANK];   /* out's and labels' */
    int64_t dst[WF_MAX_RANK];                     /* dloss's */
    int64_t x_axis_st, out_axis_st;               /* along the axis (out's 0 when 'per_row') */
} wf__softmax_geom;

/* softmax_cpu.c: fills 'g' for 'x' along 'axis' (non-negative, checked); 'per_row': out has
 * one element per row (softmax_cross_entropy's losses), else x's shape. 'labels' and 'dloss'
 * may be NULL. */
void wf__ops_softmax_geom(int axis, bool per_row, const wf_tensor *x, const wf_tensor *labels,
                          const wf_tensor *dloss, const wf_tensor *out, wf__softmax_geom *g);

/* matmul_cpu.c: places a (rows x cols) matrix with strides (sr, sc) for a row-major BLAS call
 * with the user's 'trans' ('*trans_out' and leading dimension '*ld'; cuBLAS is called as
 * cblas). Returns false when it has no unit stride (it must be packed) or 'ld' exceeds
 * INT_MAX. */
bool wf__ops_blas_layout(int64_t rows, int64_t cols, int64_t sr, int64_t sc, bool trans,
                         bool *trans_out, int64_t *ld);

/* matmul_cpu.c: checks an epilogue's 'bias' (dtype 'dt', one row of out's shape 'os'). */
int wf__ops_matmul_check_bias(const char *name, const wf_tensor *bias, wf_dtype dt, wf_shape os);

/* matmul_cpu.c: checks a (batched) product of 'a' and 'b' (none of 'a', 'b', 'out' NULL;
 * floating, one dtype, rank >= 2, inner dimensions equal, batch axes broadcast) and gives M,
 * N, K and out's shape (not checked against 'out'). */
int wf__ops_matmul_shape(const char *name, bool trans_a, bool trans_b, const wf_tensor *a,
                         const wf_tensor *b, const wf_tensor *out, int64_t *M, int64_t *N,
                         int64_t *K, wf_shape *oshape);

/* shape.c: the slice of split node 'n' (its part attrs->depth of attrs->groups equal parts
 * along attrs->axis) of 'x', as slice arguments. Returns 0 or WF_EINVAL. */
int wf__ops_split_box(const wf_node *n, const wf_tensor *x, int64_t *begin, int64_t *end,
                      int64_t *step);

/* dropout_cpu.c: dropout's checks (x non-NULL and floating, 'rate' in [0, 1), 'out' of x's
 * dtype and shape). */
int wf__ops_dropout_check(double rate, const wf_tensor *x, const wf_tensor *out);

/* elementwise_cpu.c: the checks that open the unary, binary and activation-gradient kernels
 * on every device: 'op' is in range, the operands are not NULL and of a dtype the op takes
 * (those elementwise_cpu.c has a loop for; binary: a and b of one dtype; activation
 * gradients: x and dy of one floating dtype and shape, and 'out' of it). '*name' is the op's
 * name for the caller's later messages (set once 'op' is in range). */
int wf__ops_unary_check(wf_unary_op op, const wf_tensor *x, const char **name);
int wf__ops_binary_check(wf_binary_op op, const wf_tensor *a, const wf_tensor *b,
                         const char **name);
int wf__ops_act_grad_check(wf_act_grad_op op, const wf_tensor *x, const wf_tensor *dy,
                           const wf_tensor *out, const char **name);

/* reduce.c: node 'n''s reduction axes (attrs) as ints in 'axes'; returns how many (0: all). */
int wf__ops_reduce_axes(const wf_node *n, int *axes);

/* reduce.c: the view of 'dy' over out's axes that unreduce node 'n' broadcasts: the axes
 * its attrs reduce have size 1, at stride 0 where keepdims dropped them. Writes the view's
 * shape to '*ks' and its strides to 'st' (in elements). */
void wf__ops_unreduce_view(const wf_node *n, const wf_tensor *dy, const wf_tensor *out,
                           wf_shape *ks, int64_t *st);

/* conv.c and pool.c: the parameters of conv2d node 'n' and of pooling node 'n' (from its
 * attrs; a pool's count_include_pad is attrs->keepdims), as the kernels take them. */
wf_conv_params wf__ops_conv_params(const wf_node *n);
wf_pool_params wf__ops_pool_params(const wf_node *n);

#endif
