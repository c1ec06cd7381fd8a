/* ops/kernels.h: the CPU kernels of the op set, as plain functions over tensors (a module
 * interface of ops/: the op table, shape inference and the executor call these; not
 * installed).
 * Owns: wf_kctx and the entry signature every CPU kernel has (docs/conventions.md, "CUDA twins"):
 *   int wf__<op>_cpu(const wf_kctx *ctx, <attributes>, const wf_tensor *x..., wf_tensor *out)
 * Contract shared by every entry below:
 * - Inputs may be any strided view (transposed, negative or zero strides). 'out' is a
 *   contiguous tensor the caller allocated (wf__tensor_alloc) with the result's dtype and
 *   shape; the kernel checks both and returns WF_ESHAPE, WF_EDTYPE or WF_EINVAL with a
 *   message naming the shapes (wf_last_errmsg()) instead of writing anything. 'out' must not
 *   overlap an input, except that an elementwise kernel (unary, binary, where, cast) may
 *   write in place: 'out' may be an input itself (same data, dtype and shape, contiguous),
 *   for the memory planner's in-place reuse.
 * - Returns 0 or a negative wf_status. Never aborts on bad arguments.
 * - Deterministic: the bits of 'out' depend only on the inputs, never on 'ctx->rt' or its
 *   number of workers (elementwise kernels treat each element alone; reductions use fixed
 *   blocks of the reduced range combined in a fixed order; GEMM tiles depend on shapes only).
 * - dtypes: f32 and f64 compute natively; bf16 and f16 are loaded as f32, computed in f32 and
 *   stored rounded to nearest even. Integer support is listed per kernel.
 * Not here: op definitions, shape inference on nodes, gradients, CUDA twins. */
#ifndef WF_OPS_KERNELS_H
#define WF_OPS_KERNELS_H

#include <weft/core.h>
#include <weft/sched.h>

#include <stdbool.h>
#include <stdint.h>

/* What every kernel is given besides its tensors. */
typedef struct wf_kctx {
    wf_runtime *rt; /* NULL: run serially on the calling thread */
    uint64_t step;  /* the run's step counter (wf_kernel_ctx.step): random ops mix it in */
} wf_kctx;

/* The runtime a kernel called with 'rt' splits its work on: 'rt' when it has two workers or
 * more, else NULL (run serially on the calling thread). Why: with one worker a split gains
 * nothing, and an eager op (run on the thread building the graph, not on a worker) handed
 * every piece to the worker and waited, spinning then sleeping, for each op: a wake-up and a
 * hand-off per op, and a second thread busy in a '1 thread' run (measured: the caller's wait
 * was 2.6% of the samples of the eager MLP step, the worker's loop and futex 3%). The bits do
 * not change (kernels' contract: they never depend on the runtime or its workers). */
static inline wf_runtime *wf__kernel_par_rt(wf_runtime *rt)
{
    return rt && wf_runtime_worker_count(rt) > 1 ? rt : NULL;
}

/* ---- Elementwise: unary ------------------------------------------------------------------ */

/* out = op(x), same shape. Floating dtypes for all; i32 and i64 also for neg, abs, sign,
 * square and relu (integer neg and abs wrap: abs(INT_MIN) is INT_MIN). */
typedef enum wf_unary_op {
    WF_UNARY_NEG,
    WF_UNARY_ABS,
    WF_UNARY_EXP,
    WF_UNARY_LOG,
    WF_UNARY_SQRT,
    WF_UNARY_RSQRT,
    WF_UNARY_SQUARE,
    WF_UNARY_TANH,
    WF_UNARY_SIGMOID,
    WF_UNARY_RELU,       /* NaN stays NaN */
    WF_UNARY_LEAKY_RELU, /* x < 0 ? alpha * x : x */
    WF_UNARY_GELU_TANH,  /* 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
    WF_UNARY_GELU_ERF,   /* 0.5 x (1 + erf(x / sqrt(2))) */
    WF_UNARY_SILU,       /* x sigmoid(x) */
    WF_UNARY_SIGN,       /* -1, 0, 1 (NaN stays NaN) */
    WF_UNARY_COUNT
} wf_unary_op;

/* The generic entry; 'alpha' is used by WF_UNARY_LEAKY_RELU only. */
int wf__unary_cpu(const wf_kctx *ctx, wf_unary_op op, double alpha, const wf_tensor *x,
                  wf_tensor *out);

int wf__neg_cpu(const wf_kctx *ctx, const wf_tensor *x, wf_tensor *out);
int wf__abs_cpu(const wf_kctx *ctx, const wf_tensor *x, wf_tensor *out);
int wf__exp_cpu(const wf_kctx *ctx, const wf_tensor *x, wf_tensor *out);
int wf__log_cpu(const wf_kctx *ctx, const wf_tensor *x, wf_tensor *out);
int wf__sqrt_cpu(const wf_kctx *ctx, const wf_tensor *x, wf_tensor *out);
int wf__rsqrt_cpu(const wf_kctx *ctx, const wf_tensor *x, wf_tensor *out);
int wf__square_cpu(const wf_kctx *ctx, const wf_tensor *x, wf_tensor *out);
int wf__tanh_cpu(const wf_kctx *ctx, const wf_tensor *x, wf_tensor *out);
int wf__sigmoid_cpu(const wf_kctx *ctx, const wf_tensor *x, wf_tensor *out);
int wf__relu_cpu(const wf_kctx *ctx, const wf_tensor *x, wf_tensor *out);
int wf__leaky_relu_cpu(const wf_kctx *ctx, double alpha, const wf_tensor *x, wf_tensor *out);
int wf__gelu_tanh_cpu(const wf_kctx *ctx, const wf_tensor *x, wf_tensor *out);
int wf__gelu_erf_cpu(const wf_kctx *ctx, const wf_tensor *x, wf_tensor *out);
int wf__silu_cpu(const wf_kctx *ctx, const wf_tensor *x, wf_tensor *out);
int wf__sign_cpu(const wf_kctx *ctx, const wf_tensor *x, wf_tensor *out);

/* ---- Elementwise: binary, with NumPy broadcasting ---------------------------------------- */

/* out = a op b; 'a' and 'b' have the same dtype and shapes that broadcast to out's shape.
 * Arithmetic ops: out has the inputs' dtype; floating dtypes for all, i32 and i64 for add,
 * sub, mul, div, maximum and minimum (add, sub and mul wrap modulo 2^n; div truncates toward
 * zero, INT_MIN / -1 wraps to INT_MIN, and a zero divisor fails the call with WF_EINVAL
 * naming the element: no silent garbage in an index computation). maximum and minimum
 * propagate NaN. pow is floating only.
 * Comparisons: out is bool; every dtype (NaN compares unequal to everything). */
typedef enum wf_binary_op {
    WF_BINARY_ADD,
    WF_BINARY_SUB,
    WF_BINARY_MUL,
    WF_BINARY_DIV,
    WF_BINARY_POW,
    WF_BINARY_MAXIMUM,
    WF_BINARY_MINIMUM,
    WF_BINARY_EQ,
    WF_BINARY_NE,
    WF_BINARY_LT,
    WF_BINARY_LE,
    WF_BINARY_GT,
    WF_BINARY_GE,
    WF_BINARY_COUNT
} wf_binary_op;

int wf__binary_cpu(const wf_kctx *ctx, wf_binary_op op, const wf_tensor *a, const wf_tensor *b,
                   wf_tensor *out);

int wf__add_cpu(const wf_kctx *ctx, const wf_tensor *a, const wf_tensor *b, wf_tensor *out);
int wf__sub_cpu(const wf_kctx *ctx, const wf_tensor *a, const wf_tensor *b, wf_tensor *out);
int wf__mul_cpu(const wf_kctx *ctx, const wf_tensor *a, const wf_tensor *b, wf_tensor *out);
int wf__div_cpu(const wf_kctx *ctx, const wf_tensor *a, const wf_tensor *b, wf_tensor *out);
int wf__pow_cpu(const wf_kctx *ctx, const wf_tensor *a, const wf_tensor *b, wf_tensor *out);
int wf__maximum_cpu(const wf_kctx *ctx, const wf_tensor *a, const wf_tensor *b, wf_tensor *out);
int wf__minimum_cpu(const wf_kctx *ctx, const wf_tensor *a, const wf_tensor *b, wf_tensor *out);
int wf__eq_cpu(const wf_kctx *ctx, const wf_tensor *a, const wf_tensor *b, wf_tensor *out);
int wf__ne_cpu(const wf_kctx *ctx, const wf_tensor *a, const wf_tensor *b, wf_tensor *out);
int wf__lt_cpu(const wf_kctx *ctx, const wf_tensor *a, const wf_tensor *b, wf_tensor *out);
int wf__le_cpu(const wf_kctx *ctx, const wf_tensor *a, const wf_tensor *b, wf_tensor *out);
int wf__gt_cpu(const wf_kctx *ctx, const wf_tensor *a, const wf_tensor *b, wf_tensor *out);
int wf__ge_cpu(const wf_kctx *ctx, const wf_tensor *a, const wf_tensor *b, wf_tensor *out);

/* out = cond ? a : b, elementwise; 'cond' is bool, 'a', 'b' and 'out' share any dtype, and
 * the three shapes broadcast to out's. */
int wf__where_cpu(const wf_kctx *ctx, const wf_tensor *cond, const wf_tensor *a, const wf_tensor *b,
                  wf_tensor *out);

/* out = x converted to out's dtype (any pair; same shape). Floating to integer truncates
 * toward zero and saturates, NaN gives 0 (as wf_tensor_read); integer to narrower integer
 * wraps modulo 2^n (as C and NumPy); anything to bool is x != 0; to bf16/f16 rounds to
 * nearest even (through f32). Same dtype: a strided copy into contiguous 'out'. */
int wf__cast_cpu(const wf_kctx *ctx, const wf_tensor *x, wf_tensor *out);

/* ---- Reductions ---------------------------------------------------------------------------- */

/* Reduces 'x' over the axes 'axes[0..n_axes)' (negative counts from the end, as in NumPy;
 * each axis at most once). 'axes' NULL: every axis. n_axes 0 with non-NULL 'axes': none
 * (a copy). keepdims: the reduced axes stay as size 1, else they are dropped.
 * dtypes: sum, prod, max and min: floating, i32 and i64 (out has x's dtype; integer sums and
 * products wrap); mean and logsumexp: floating (out has x's dtype); argmax: floating, i32
 * and i64, out is i64: the row-major position of the first maximum inside the reduced
 * sub-block (for one axis, the index along it). Floating sums accumulate in f64.
 * max, min and argmax propagate NaN (the first NaN wins). An empty reduced range gives 0
 * for sum, 1 for prod, NaN for mean, -inf for logsumexp, and WF_EINVAL for max, min and
 * argmax (no identity). */
typedef enum wf__reduce_kind {
    WF__REDUCE_SUM,
    WF__REDUCE_MEAN,
    WF__REDUCE_MAX,
    WF__REDUCE_MIN,
    WF__REDUCE_PROD,
    WF__REDUCE_ARGMAX,
    WF__REDUCE_LOGSUMEXP,
    WF__REDUCE_COUNT
} wf__reduce_kind;

int wf__reduce_cpu(const wf_kctx *ctx, wf__reduce_kind op, const int *axes, int n_axes,
                   bool keepdims, const wf_tensor *x, wf_tensor *out);

/* The shape wf__reduce_cpu() gives for 'x_shape' (for callers that allocate 'out').
 * Returns 0 or WF_EINVAL (an axis out of range or repeated) with a message. */
int wf__reduce_shape(wf_shape x_shape, const int *axes, int n_axes, bool keepdims, wf_shape *out);

/* prod's gradient: out (x's shape) = dy times the product of the other elements of each
 * element's reduced range (the reduction of x over 'axes' with 'keepdims' has dy's shape);
 * from prefix and suffix products in f64, so zeros in x give exact values, not NaN. x and
 * dy floating of one dtype. */
int wf__prod_grad_cpu(const wf_kctx *ctx, const int *axes, int n_axes, bool keepdims,
                      const wf_tensor *x, const wf_tensor *dy, wf_tensor *out);

int wf__sum_cpu(const wf_kctx *ctx, const int *axes, int n_axes, bool keepdims, const wf_tensor *x,
                wf_tensor *out);
int wf__mean_cpu(const wf_kctx *ctx, const int *axes, int n_axes, bool keepdims, const wf_tensor *x,
                 wf_tensor *out);
int wf__max_cpu(const wf_kctx *ctx, const int *axes, int n_axes, bool keepdims, const wf_tensor *x,
                wf_tensor *out);
int wf__min_cpu(const wf_kctx *ctx, const int *axes, int n_axes, bool keepdims, const wf_tensor *x,
                wf_tensor *out);
int wf__prod_cpu(const wf_kctx *ctx, const int *axes, int n_axes, bool keepdims, const wf_tensor *x,
                 wf_tensor *out);
int wf__argmax_cpu(const wf_kctx *ctx, const int *axes, int n_axes, bool keepdims,
                   const wf_tensor *x, wf_tensor *out);
int wf__logsumexp_cpu(const wf_kctx *ctx, const int *axes, int n_axes, bool keepdims,
                      const wf_tensor *x, wf_tensor *out);

/* ---- Matrix products ------------------------------------------------------------------------ */

/* out = op(a) @ op(b), op(t) = t^T (of the last two axes) when the flag is set. a is
 * [..., M, K] ([..., K, M] transposed), b is [..., K, N] ([..., N, K]); both have rank >= 2
 * and their batch axes broadcast (NumPy matmul) to out's [..., M, N].
 * dtypes: f32 (cblas_sgemm), f64 (cblas_dgemm), bf16 and f16 (converted to f32, out
 * rounded); a, b and out share the dtype. Strided inputs with one unit stride in the last two
 * axes go to BLAS as they are; others are packed first.
 * Work is split into tiles of out fixed by the shapes; with ctx->rt they run through
 * wf_parallel_for, each a single-threaded BLAS call (matmul_cpu.c says which BLAS). */
int wf__matmul_cpu(const wf_kctx *ctx, bool trans_a, bool trans_b, const wf_tensor *a,
                   const wf_tensor *b, wf_tensor *out);

/* A GEMM epilogue: what runs over each output tile right after its GEMM (matmul_cpu.c). */
typedef struct wf_epilogue {
    int act;         /* -1: none; else the wf_unary_op of the activation: relu, leaky_relu,
                        gelu_erf, gelu_tanh, tanh, sigmoid or silu */
    double alpha;    /* the activation node's alpha (leaky_relu's slope) */
    bool bias_first; /* the add was bias + product (IEEE addition keeps the first operand's
                        NaN payload, so the order is part of the bits) */
} wf_epilogue;

/* The epilogue of a matmul_epilogue node, from its attributes (ops/matmul.c, which owns their
 * encoding: ops/table.h), for the op's kernels on every device. */
wf_epilogue wf__matmul_epilogue_of(const wf_node *n);

/* out = act(op(a) @ op(b) + bias): wf__matmul_cpu() with, in each output tile while it is in
 * cache, the bias added and the activation applied by the elementwise kernels' own loops
 * (ops/scalar.h), so the bits equal matmul, add and activation run as three kernels. 'bias'
 * (NULL: none) has the output's dtype and rank <= out's, every dimension 1 but the last, which
 * is N or 1 (a row broadcast down the rows and over the batch). bf16 and f16: the product is
 * rounded to out, then the add and the activation run as their kernels over the whole output
 * (each rounds, as separate nodes do). */
int wf__matmul_epilogue_cpu(const wf_kctx *ctx, bool trans_a, bool trans_b, const wf_epilogue *ep,
                            const wf_tensor *a, const wf_tensor *b, const wf_tensor *bias,
                            wf_tensor *out);

/* ---- Softmax ------------------------------------------------------------------------------ */

/* out = softmax(x) along 'axis' (negative counts from the end): exp(x - max) / sum, with the
 * row's maximum subtracted first (stable for any input), computed in f64 and stored rounded.
 * Floating dtypes; out has x's dtype and shape. A row holding NaN or +inf gives NaN. */
int wf__softmax_cpu(const wf_kctx *ctx, int axis, const wf_tensor *x, wf_tensor *out);

/* out = log_softmax(x) along 'axis': x - max - log(sum(exp(x - max))). As softmax. */
int wf__log_softmax_cpu(const wf_kctx *ctx, int axis, const wf_tensor *x, wf_tensor *out);

/* out[i] = -log(softmax(logits[i, :])[labels[i]]) = logsumexp(logits[i, :]) - logits[i, label]
 * for logits [..., C] (floating) and labels [...] (i32 or i64, values in [0, C)); out is [...]
 * with the logits' dtype (per-example losses: the caller takes the mean). A label outside
 * [0, C) fails the call with WF_EINVAL naming the example and the label. */
int wf__softmax_cross_entropy_cpu(const wf_kctx *ctx, const wf_tensor *logits,
                                  const wf_tensor *labels, wf_tensor *out);

/* ---- Shared helpers for the kernel files (ops/ only) ------------------------------------- */

/* Checks that 'out' is a contiguous tensor of dtype 'dt' and shape 'shape'; else sets a
 * message "<op>: out is <dtype> <shape> but <dtype> <shape> was expected" and returns
 * WF_EDTYPE, WF_ESHAPE or WF_EINVAL. */
int wf__kernel_check_out(const char *op, const wf_tensor *out, wf_dtype dt, wf_shape shape);

/* ---- Shape ops (shape_cpu.c) --------------------------------------------------------------- */

/* Every shape kernel copies elements as bytes (any dtype, bit-exact) from a strided view of
 * its input(s) into contiguous 'out' of the input's dtype. */

/* out = x in row-major order with out's shape (numel must match): reshape, expand_dims,
 * squeeze. */
int wf__reshape_cpu(const wf_kctx *ctx, const wf_tensor *x, wf_tensor *out);

/* out[i0, .., ik] = x[i_perm...]: out.dims[d] = x.dims[perm[d]]; 'perm' is a permutation of
 * [0, n), n = x's rank. */
int wf__transpose_cpu(const wf_kctx *ctx, const int *perm, int n, const wf_tensor *x,
                      wf_tensor *out);

/* NumPy's clamping of one axis of size 'dim' for x[begin:end:step]: the first index '*start'
 * and the count '*len'. Negative begin/end count from the end; out-of-range ones clamp, so
 * INT64_MIN and INT64_MAX mean "from/to the edge" for either sign of step. Returns 0, or
 * WF_EINVAL for step 0 (no message set). */
int wf__slice_dim(int64_t dim, int64_t begin, int64_t end, int64_t step, int64_t *start,
                  int64_t *len);

/* out = x[begin[d]:end[d]:step[d], ...] per axis (wf__slice_dim()). */
int wf__slice_cpu(const wf_kctx *ctx, const int64_t *begin, const int64_t *end, const int64_t *step,
                  const wf_tensor *x, wf_tensor *out);

/* out = x broadcast (NumPy rules, x's rank <= out's) to out's shape. */
int wf__broadcast_to_cpu(const wf_kctx *ctx, const wf_tensor *x, wf_tensor *out);

/* out = the inputs 'xs[0..n)' joined along 'axis' (non-negative); all share out's dtype, rank
 * and the other dimensions. */
int wf__concat_cpu(const wf_kctx *ctx, int axis, const wf_tensor *const *xs, int n, wf_tensor *out);

/* out = the inputs (all one shape) stacked along a new axis 'axis' (in [0, rank]). */
int wf__stack_cpu(const wf_kctx *ctx, int axis, const wf_tensor *const *xs, int n, wf_tensor *out);

/* out = x with before[d] and after[d] (>= 0) elements of 'value' (converted to x's dtype)
 * added on each side of axis d. */
int wf__pad_cpu(const wf_kctx *ctx, const int64_t *before, const int64_t *after, double value,
                const wf_tensor *x, wf_tensor *out);

/* ---- Indexing (index_cpu.c) ---------------------------------------------------------------- */

/* out = params taken at 'indices' (i32 or i64, any shape) along 'axis' (non-negative):
 * out's shape is params[:axis] + indices + params[axis+1:]. An index outside [0, dim) fails
 * the call with WF_EINVAL naming its position and value (no negative indices). */
int wf__gather_cpu(const wf_kctx *ctx, int axis, const wf_tensor *params, const wf_tensor *indices,
                   wf_tensor *out);

/* out[..., k] = indices[...] == k ? 1 : 0 in out's dtype; depth is out's last dimension; an
 * index outside [0, depth) gives an all-zero row (TensorFlow's rule). */
int wf__one_hot_cpu(const wf_kctx *ctx, const wf_tensor *indices, wf_tensor *out);

/* ---- Convolution and pooling (conv_cpu.c, pool_cpu.c) ------------------------------------- */

/* NCHW, rank 4. The attributes as weft/nn.h's options say, except that a stride, dilation or
 * groups of 0 means 1 here too and a pool stride of 0 means the window. x, w and dy may be
 * any strided view (x and dy are read through their strides; w, and dy where a GEMM reads
 * it, are copied to contiguous first when they are not). dtypes: f32 and f64 natively, bf16
 * and f16 through f32 copies (rounded once on store); every input and out share the dtype.
 * Shapes are checked against each other and against out (WF_ESHAPE, WF_EINVAL or WF_EDTYPE
 * with the shapes named). Deterministic: the work is cut into items fixed by the shapes; the
 * batch sum of the filter gradient is reduced in a fixed order. */
typedef struct wf_conv_params {
    int32_t stride[2], padding[4], dilation[2], groups;
} wf_conv_params;

typedef struct wf_pool_params {
    int32_t window[2], stride[2], padding[4];
    bool count_include_pad; /* avg: divide by KH x KW instead of the real elements */
} wf_pool_params;

/* out [N, O, OH, OW] = conv2d(x [N, C, H, W], w [O, C / groups, KH, KW]): im2col + GEMM per
 * (image, group, tile of output pixels), one serial BLAS call each. */
int wf__conv2d_cpu(const wf_kctx *ctx, const wf_conv_params *p, const wf_tensor *x,
                   const wf_tensor *w, wf_tensor *out);

/* out = dL/dx (x's shape [N, C, H, W], given by out) from dy [N, O, OH, OW] and w: GEMM
 * (w^T dy) then col2im, per (image, group, block of input channels). */
int wf__conv2d_backward_input_cpu(const wf_kctx *ctx, const wf_conv_params *p, const wf_tensor *dy,
                                  const wf_tensor *w, wf_tensor *out);

/* out = dL/dw (w's shape [O, C / groups, KH, KW], given by out) from x and dy: per chunk of
 * (image, pixel tile) slabs a partial sum of dy col(x)^T, chunks fixed by the shapes and
 * added in order. */
int wf__conv2d_backward_filter_cpu(const wf_kctx *ctx, const wf_conv_params *p, const wf_tensor *x,
                                   const wf_tensor *dy, wf_tensor *out);

/* Pools over each (image, channel) plane; padded positions never win a max and count as
 * zeros in an average (divided by the real elements, or by KH x KW with count_include_pad).
 * max: the first NaN of a window, else its first maximum in row-major order, is the
 * window's value and receives its gradient. */
int wf__max_pool2d_cpu(const wf_kctx *ctx, const wf_pool_params *p, const wf_tensor *x,
                       wf_tensor *out);
int wf__avg_pool2d_cpu(const wf_kctx *ctx, const wf_pool_params *p, const wf_tensor *x,
                       wf_tensor *out);
/* out = dL/dx (x's shape) from x and dy (the pool's output shape). */
int wf__max_pool2d_backward_cpu(const wf_kctx *ctx, const wf_pool_params *p, const wf_tensor *x,
                                const wf_tensor *dy, wf_tensor *out);
/* out = dL/dx (x's shape, given by out) from dy. */
int wf__avg_pool2d_backward_cpu(const wf_kctx *ctx, const wf_pool_params *p, const wf_tensor *dy,
                                wf_tensor *out);

/* C (M x N, row stride ldc) = op(A) op(B) (+ C when 'acc'), op(A) M x K, op(B) K x N,
 * row-major, f32 or f64 (dt), single-threaded on the calling thread; safe to call from
 * several workers at once. K == 0 gives zeros (or leaves C) without calling BLAS. The one
 * door to BLAS (ops/blas.c says which BLAS and why). */
void wf__gemm(wf_dtype dt, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const void *A,
              int64_t lda, const void *B, int64_t ldb, bool acc, void *C, int64_t ldc);

/* True when wf__gemm() runs on weft's private single-threaded OpenBLAS (products may then be
 * tiled over the workers); false on the system's BLAS, which may start threads of its own. */
bool wf__blas_private(void);

/* A tensor with t's values and shape that is contiguous and of dtype 'dt': 't' itself
 * (retained) when it already is, else a converted copy (wf__cast_cpu). Returns 0 or
 * WF_ENOMEM; the caller releases '*out'. For the kernels that hand matrices to BLAS or read
 * planes directly (matmul_cpu.c, conv_cpu.c, pool_cpu.c; defined in conv_cpu.c). */
int wf__nn_contiguous(const wf_kctx *ctx, const wf_tensor *t, wf_dtype dt, wf_tensor **out);

/* A two-input kernel on f32 tensors: ctx, its own 'arg', the inputs and out. */
typedef int (*wf_f32_fn)(const wf_kctx *ctx, const void *arg, const wf_tensor *a,
                         const wf_tensor *b, wf_tensor *out);

/* How bf16 and f16 inputs are computed: contiguous f32 copies of a and b, fn into an f32
 * result, rounded once into 'out' (wf__cast_cpu). Returns fn's status or WF_ENOMEM. For
 * matmul and the convolutions (defined in conv_cpu.c). */
int wf__run_via_f32(const wf_kctx *ctx, const wf_tensor *a, const wf_tensor *b, wf_tensor *out,
                    wf_f32_fn fn, const void *arg);

/* ---- Normalization, dropout and backward helpers (norm_cpu.c, dropout_cpu.c, backward_cpu.c) */

/* out = layer_norm(x) over the axes [begin_axis, rank) (non-negative begin_axis < rank):
 * (x - mean) / sqrt(var + eps) * gamma + beta per row, biased variance, two passes in f64,
 * stored rounded once. 'gamma' and 'beta' (each may be NULL) have shape x.shape[begin_axis:]
 * and x's dtype. Floating dtypes. Rows are split over the workers, one row per task piece:
 * the bits do not depend on the worker count. */
int wf__layer_norm_cpu(const wf_kctx *ctx, int begin_axis, double eps, const wf_tensor *x,
                       const wf_tensor *gamma, const wf_tensor *beta, wf_tensor *out);

/* out = dx of layer_norm given dy (x's dtype and shape); 'gamma' may be NULL. In f64 per row:
 * rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * gamma. */
int wf__layer_norm_backward_input_cpu(const wf_kctx *ctx, int begin_axis, double eps,
                                      const wf_tensor *x, const wf_tensor *gamma,
                                      const wf_tensor *dy, wf_tensor *out);

/* out = x * mask / (1 - rate) with mask[i] = unit(bits(bits(seed, ctx->step), i)) >= rate
 * (core/rng.h), i the row-major index; dropped elements are 0. rate in [0, 1) (else
 * WF_EINVAL); floating dtypes. ctx NULL counts as step 0. */
int wf__dropout_cpu(const wf_kctx *ctx, double rate, uint64_t seed, const wf_tensor *x,
                    wf_tensor *out);

/* Activation gradients: out = f'(x) * dy from the forward input x, or from the forward output
 * y for sigmoid and tanh (weft/nn.h's wf_activation lists the formulas). Binary elementwise
 * through elementwise_cpu.c's iterator: x, dy and out share one floating dtype and one shape
 * (no broadcasting); out may be x or dy (in place). 'alpha': leaky_relu's slope. */
typedef enum wf_act_grad_op {
    WF_ACT_GRAD_RELU,
    WF_ACT_GRAD_LEAKY_RELU,
    WF_ACT_GRAD_GELU_ERF,
    WF_ACT_GRAD_GELU_TANH,
    WF_ACT_GRAD_SILU,
    WF_ACT_GRAD_SIGMOID,
    WF_ACT_GRAD_TANH,
    WF_ACT_GRAD_COUNT
} wf_act_grad_op;

int wf__activation_grad_cpu(const wf_kctx *ctx, wf_act_grad_op op, double alpha, const wf_tensor *x,
                            const wf_tensor *dy, wf_tensor *out);

/* out = zeros, then out[o, indices[j], k] += updates[o, j, k] along 'axis' (non-negative, an
 * axis of out; the dimension there is out's): updates' shape is out[:axis] + indices +
 * out[axis+1:]. Each element of out sums its updates in index order, whatever the split
 * (pieces are slices of the non-indexed positions). dtypes: f32, f64, i32, i64 (wrapping),
 * bf16 and f16 (accumulated in an f32 buffer, rounded once). An index outside [0, dim)
 * fails with WF_EINVAL naming its position and value before anything is added. */
int wf__scatter_add_cpu(const wf_kctx *ctx, int axis, const wf_tensor *updates,
                        const wf_tensor *indices, wf_tensor *out);

/* out = zeros of out's shape (the sliced tensor's), with dy written where
 * x[begin:end:step] reads (wf__slice_dim() per axis); dy must have the slice's shape. Any
 * dtype (bytes). */
int wf__slice_backward_cpu(const wf_kctx *ctx, const int64_t *begin, const int64_t *end,
                           const int64_t *step, const wf_tensor *dy, wf_tensor *out);

/* The slice attributes wf_slice() stores for rank 'rank' (shape.c): 'begin', 'end', 'step'
 * (each may be NULL: the per-axis default, weft/ops.h) written to 'b', 'e', 's'. */
void wf__slice_attrs(int rank, const int64_t *begin, const int64_t *end, const int64_t *step,
                     int64_t *b, int64_t *e, int64_t *s);

/* A contiguous tensor with the values of 't': 't' retained when it is contiguous already, else
 * a copy (wf__cast_cpu to its own dtype). Returns NULL with the message set (no memory). The
 * caller releases it. */
wf_tensor *wf__contiguous_cpu(const wf_kctx *ctx, const wf_tensor *t);

/* The CUDA twins of these kernels and the op defs' CUDA slots (WF__CUDA_KERNEL). */
#include "cuda_kernels.h"

#endif /* WF_OPS_KERNELS_H */
