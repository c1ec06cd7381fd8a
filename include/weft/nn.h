/* weft/nn.h: the neural-network op constructors: convolution and pooling (NCHW), layer
 * normalization, dropout, and the backward ops their gradients use.
 * Owns: the public contract of those ops: what each constructor adds to a graph, the dtypes
 *   and attributes it takes, the dtype and shape of its node, and how it fails.
 * Shared by every constructor below: the rules of weft/ops.h's header (one node per call,
 *   inference at once with messages naming the op, the node, the file:line and every shape;
 *   NULL with the graph's first error on failure; eager graphs compute at once; each
 *   constructor is also a macro recording the caller's file and line).
 * Not here: the elementwise, reduction, matmul, softmax, shape and indexing ops (weft/ops.h),
 *   gradients and optimizers (weft/grad.h). */
#ifndef WEFT_NN_H
#define WEFT_NN_H

#include <weft/base.h>
#include <weft/core.h>

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Convolution and pooling --------------------------------------------------------------- */

/* Every op of this section works on NCHW tensors of rank 4 ([batch, channels, height, width]),
 * in f32, f64, bf16 or f16 (bf16 and f16 are computed in f32), with all inputs of one dtype
 * (else WF_EDTYPE naming both). A -1 batch (or any other -1 dimension of a placeholder) flows
 * through inference: [-1, 3, 32, 32] convolved with [16, 3, 3, 3] is [-1, 16, 30, 30].
 * Attribute values that are never valid (a negative stride, padding or dilation) give
 * WF_EINVAL; shapes that do not fit the attributes (channels, groups, a kernel or window
 * larger than the padded input) give WF_ESHAPE; both name every shape and the attributes.
 * The options structs may be NULL for the convolutions (every default) and are copied. */

/* Options of the 2-D convolution and of its backward ops. Zero means the default in every
 * field, so '(wf_conv2d_opts){ .padding = { 1, 1, 1, 1 } }' is a "same" 3x3 convolution. */
typedef struct wf_conv2d_opts {
    int stride[2];   /* [h, w]: step between output positions; 0: 1 */
    int padding[4];  /* [top, bottom, left, right]: rows and columns of zeros added around x;
                        0: none */
    int dilation[2]; /* [h, w]: spacing between kernel taps (2: every other pixel); 0: 1 */
    int groups;      /* 0: 1. C and O are split into 'groups' equal parts and output channel
                        block k sees input channel block k only; groups == C == O is a
                        depthwise convolution */
} wf_conv2d_opts;

/* y = conv2d(x, w): x [N, C, H, W], w [O, C / groups, KH, KW] (the same dtype), y
 * [N, O, OH, OW] with OH = (H + top + bottom - dilation_h (KH - 1) - 1) / stride_h + 1
 * (rounded down; OW alike), and
 *   y[n, o, i, j] = sum over c < C / groups, kh < KH, kw < KW of
 *     w[o, c, kh, kw] * x[n, (o / (O / groups)) (C / groups) + c,
 *                         i stride_h - top + kh dilation_h, j stride_w - left + kw dilation_w]
 * where x is 0 outside its H x W (a cross-correlation, as in PyTorch and TensorFlow; no
 * bias: add one with wf_add and a [O, 1, 1] tensor).
 * Errors: WF_ESHAPE for ranks other than 4, C != (C / groups) x groups as w says ("x is
 *   [2, 3, 8, 8] but w is [4, 2, 3, 3]: x has 3 channels, w expects 2 x groups 1"), groups
 *   not dividing C or O, a dilated kernel larger than the padded input (no output row or
 *   column); WF_EINVAL for negative options; WF_EDTYPE for integer or unequal dtypes. */
WF_API wf_node *wf_conv2d(wf_graph *g, wf_node *x, wf_node *w, const wf_conv2d_opts *opts);

/* The gradient of conv2d with respect to x: given dy = dL/dy [N, O, OH, OW] and w, returns
 * dL/dx with shape 'x_shape' (the shape of conv2d's x; a transposed convolution). 'opts' are
 * conv2d's. A -1 batch or channel count in 'x_shape' is taken from dy and w; a -1 height or
 * width is taken from dy with stride 1 in that axis and is WF_EINVAL otherwise (several sizes
 * give the same output). Errors: as wf_conv2d for x_shape and w, and WF_ESHAPE when dy is not
 * the shape conv2d gives for them. */
WF_API wf_node *wf_conv2d_backward_input(wf_graph *g, wf_node *dy, wf_node *w, wf_shape x_shape,
                                         const wf_conv2d_opts *opts);

/* The gradient of conv2d with respect to w: given x and dy = dL/dy, returns dL/dw with shape
 * 'w_shape' (conv2d's w: known, no -1, else WF_EINVAL), summed over the batch in a fixed
 * order. Errors: as wf_conv2d for x and w_shape, and WF_ESHAPE when dy is not the shape
 * conv2d gives for them. */
WF_API wf_node *wf_conv2d_backward_filter(wf_graph *g, wf_node *x, wf_node *dy, wf_shape w_shape,
                                          const wf_conv2d_opts *opts);

/* Options of the 2-D pools. 'window' is required (NULL opts or a zero window: WF_EINVAL). */
typedef struct wf_pool2d_opts {
    int window[2];  /* [h, w]: the pooled window; > 0 */
    int stride[2];  /* [h, w]; 0: the window's size (non-overlapping windows) */
    int padding[4]; /* [top, bottom, left, right], each smaller than the window along its axis
                       (so every window holds a real element); 0: none. Padded positions are
                       ignored by max pooling (as -inf) and are zeros for average pooling */
    bool count_include_pad; /* avg pooling only: divide by the whole window (KH x KW) instead
                               of the real elements under it. false (the zero default) is
                               TensorFlow's behaviour; PyTorch's AvgPool2d default is true */
} wf_pool2d_opts;

/* y[n, c, i, j] = the maximum of x[n, c, ...] over window (i, j) (rows i stride_h - top to
 * i stride_h - top + KH - 1, columns alike), ignoring padded positions; y is [N, C, OH, OW] with
 * OH = (H + top + bottom - KH) / stride_h + 1 (rounded down). A NaN in the window gives NaN.
 * Errors: WF_ESHAPE (rank, a window larger than the padded input), WF_EINVAL (NULL opts,
 * window <= 0, negative stride or padding, padding not smaller than the window), WF_EDTYPE. */
WF_API wf_node *wf_max_pool2d(wf_graph *g, wf_node *x, const wf_pool2d_opts *opts);

/* y[n, c, i, j] = the mean of x[n, c, ...] over window (i, j): the sum of the real elements
 * divided by their count, or by KH x KW with 'count_include_pad'. Shapes and errors as
 * wf_max_pool2d. */
WF_API wf_node *wf_avg_pool2d(wf_graph *g, wf_node *x, const wf_pool2d_opts *opts);

/* The gradient of max_pool2d with respect to x: dx has x's shape; each dy[n, c, i, j] is added
 * to the position of its window's maximum in x: the first one in row-major order on ties, the
 * first NaN if the window holds one. 'opts' are max_pool2d's; dy must have the shape
 * max_pool2d gives for x (else WF_ESHAPE). */
WF_API wf_node *wf_max_pool2d_backward(wf_graph *g, wf_node *x, wf_node *dy,
                                       const wf_pool2d_opts *opts);

/* The gradient of avg_pool2d with respect to x: dx has shape 'x_shape' (avg_pool2d's x); each
 * dy[n, c, i, j] is spread evenly (divided by avg_pool2d's divisor) over the real elements of
 * its window. A -1 batch or channel count in 'x_shape' is taken from dy; a -1 height or width
 * only with stride 1 in that axis (else WF_EINVAL). Errors as wf_max_pool2d_backward. */
WF_API wf_node *wf_avg_pool2d_backward(wf_graph *g, wf_node *dy, wf_shape x_shape,
                                       const wf_pool2d_opts *opts);

/* The options are the macros' last, variadic argument, so that a compound literal with commas
 * passes whole: 'wf_conv2d(g, x, w, &(wf_conv2d_opts){ .stride = { 2, 2 } })'. */
#define wf_conv2d(g, x, w, ...) (WF__HERE(), (wf_conv2d)(g, x, w, __VA_ARGS__))
#define wf_conv2d_backward_input(g, dy, w, x_shape, ...) \
    (WF__HERE(), (wf_conv2d_backward_input)(g, dy, w, x_shape, __VA_ARGS__))
#define wf_conv2d_backward_filter(g, x, dy, w_shape, ...) \
    (WF__HERE(), (wf_conv2d_backward_filter)(g, x, dy, w_shape, __VA_ARGS__))
#define wf_max_pool2d(g, x, ...) (WF__HERE(), (wf_max_pool2d)(g, x, __VA_ARGS__))
#define wf_avg_pool2d(g, x, ...) (WF__HERE(), (wf_avg_pool2d)(g, x, __VA_ARGS__))
#define wf_max_pool2d_backward(g, x, dy, ...) \
    (WF__HERE(), (wf_max_pool2d_backward)(g, x, dy, __VA_ARGS__))
#define wf_avg_pool2d_backward(g, dy, x_shape, ...) \
    (WF__HERE(), (wf_avg_pool2d_backward)(g, dy, x_shape, __VA_ARGS__))

/* ---- Normalization, dropout and backward helpers ------------------------------------------ */

/* y = (x - mean) / sqrt(var + eps) * gamma + beta, mean and biased variance taken over the
 * axes [begin_axis, rank) of each row (negative begin_axis counts from the end; PyTorch's
 * normalized_shape is x.shape[begin_axis:]). 'gamma' and 'beta' have shape
 * x.shape[begin_axis:] and x's dtype, or are NULL (no scale, no shift; each independently).
 * Floating dtypes; y has x's dtype and shape. Statistics and the result are computed in f64
 * per row and rounded once on store. Op "layer_norm" with inputs x, then gamma if given, then
 * beta if given (the attribute 'groups' says which: bit 0 gamma, bit 1 beta).
 * Errors: WF_EDTYPE (not floating, dtypes differ), WF_ESHAPE (rank 0 x, gamma or beta not
 * x.shape[begin_axis:]), WF_EINVAL (begin_axis outside [-rank, rank), eps negative or not
 * finite). */
WF_API wf_node *wf_layer_norm(wf_graph *g, wf_node *x, wf_node *gamma, wf_node *beta,
                              int begin_axis, double eps);

/* dx of wf_layer_norm(x, gamma, beta, begin_axis, eps) given dy (x's dtype and shape):
 * rstd * (g - mean(g) - xhat * mean(g * xhat)) per row, g = dy * gamma (gamma NULL: dy),
 * xhat = (x - mean) * rstd; in f64 per row. beta does not enter. Op
 * "layer_norm_backward_input" with inputs x, dy and gamma if given. dgamma and dbeta are
 * sums the caller composes: sum(dy * wf_layer_norm(x, NULL, NULL, ...)) and sum(dy) over the
 * rows. Errors: as wf_layer_norm, and WF_ESHAPE when dy is not x's shape. */
WF_API wf_node *wf_layer_norm_backward_input(wf_graph *g, wf_node *x, wf_node *gamma, wf_node *dy,
                                             int begin_axis, double eps);

/* y = x * mask / (1 - rate), mask[i] = (u(seed, step, i) >= rate), u uniform in [0, 1) from
 * core's counter-based generator keyed by (seed, step): step is the session's run count
 * (0 in eager graphs), so each run of a session draws a new mask, while nodes with equal
 * attributes in one run (a dropout and the dropout of its gradient, made with the same
 * attributes) draw the same mask. The mask depends on the element's row-major index only:
 * never on workers or how the kernel is split. Dropped elements are exactly 0 (also where x
 * is inf or NaN); kept ones are x * (1 / (1 - rate)) computed in f64 and rounded once.
 * rate 0 is the identity (still a node). In a WF_EAGER graph the stored seed is 'seed'
 * mixed with the graph's node count, so two calls with one seed draw different masks.
 * Floating dtypes. Op "dropout": flagged WF_OP_STATEFUL although it is a pure function of
 * (x, seed, step), because its value changes from run to run: it must never be
 * constant-folded across runs. Errors: WF_EDTYPE, WF_EINVAL (rate < 0, >= 1 or NaN). */
WF_API wf_node *wf_dropout(wf_graph *g, wf_node *x, double rate, uint64_t seed);

/* The activations whose gradients wf_activation_grad() makes. */
typedef enum wf_activation {
    WF_ACT_RELU,       /* relu_grad(x, dy) = x > 0 ? dy : 0 */
    WF_ACT_LEAKY_RELU, /* leaky_relu_grad(x, dy) = x < 0 ? alpha * dy : dy */
    WF_ACT_GELU,       /* gelu_grad(x, dy): erf form, dy (Phi(x) + x phi(x)) */
    WF_ACT_GELU_TANH,  /* gelu_tanh_grad(x, dy): the derivative of wf_gelu(x, true) */
    WF_ACT_SILU,       /* silu_grad(x, dy) = dy s (1 + x (1 - s)), s = sigmoid(x) */
    WF_ACT_SIGMOID,    /* sigmoid_grad(y, dy) = dy y (1 - y), y the forward OUTPUT */
    WF_ACT_TANH,       /* tanh_grad(y, dy) = dy (1 - y^2), y the forward OUTPUT */
    WF_ACT_COUNT
} wf_activation;

/* dx of the activation 'act' given dy: x_or_y is the forward input (relu, leaky_relu, gelu,
 * gelu_tanh, silu) or the forward output (sigmoid, tanh); 'alpha' is leaky_relu's slope
 * (ignored otherwise). One elementwise op per activation ("relu_grad", "leaky_relu_grad",
 * "gelu_grad", "gelu_tanh_grad", "silu_grad", "sigmoid_grad", "tanh_grad"). Floating dtypes;
 * x_or_y and dy must have one dtype and the same shape (no broadcasting: a gradient has its
 * input's shape); the result has that dtype and shape. Errors: WF_EDTYPE, WF_ESHAPE,
 * WF_EINVAL (act not a wf_activation). */
WF_API wf_node *wf_activation_grad(wf_graph *g, wf_activation act, wf_node *x_or_y, wf_node *dy,
                                   double alpha);

/* The gradient of wf_gather(params, indices, axis): out has updates' shape with the indices'
 * dimensions (at 'axis') replaced by one dimension 'dim'; it is zeros, then each slice of
 * updates is added at its index: out[o, indices[j], k] += updates[o, j, k] (repeated indices
 * accumulate, in index order). 'axis' is an axis of out, in [-r, r) with r = rank(updates) -
 * rank(indices) + 1. Deterministic: the same bits for any number of workers. dtypes: f32,
 * f64, bf16 and f16 (accumulated in f32), i32 and i64 (wrapping); indices i32 or i64. An
 * index outside [0, dim) fails when the node runs, with WF_EINVAL naming its position and
 * value. Op "scatter_add" (attributes: axis, depth = dim). Errors: WF_EDTYPE, WF_ESHAPE
 * (updates' dimensions at axis are not the indices' shape), WF_EINVAL (axis, dim < 0). */
WF_API wf_node *wf_scatter_add(wf_graph *g, wf_node *updates, wf_node *indices, int axis,
                               int64_t dim);

/* The gradient of wf_slice(x, begin, end, step): zeros of x_shape and dy's dtype, with dy
 * written at the positions wf_slice read (same arrays and NULL defaults as wf_slice, so the
 * lead passes what the slice got). dy must have the slice's shape. A -1 dimension of
 * x_shape is accepted only on an axis the slice takes whole (begin and end default, step 1):
 * there the result takes dy's dimension. Any dtype. Op "slice_backward" (attributes: shape,
 * begin, end, step). Errors: WF_ESHAPE (dy is not the slice's shape, an unknown dimension on
 * a sliced axis), WF_EINVAL (step 0, bad x_shape). */
WF_API wf_node *wf_slice_backward(wf_graph *g, wf_node *dy, wf_shape x_shape, const int64_t *begin,
                                  const int64_t *end, const int64_t *step);

#define wf_layer_norm(g, x, gamma, beta, begin_axis, eps) \
    (WF__HERE(), (wf_layer_norm)(g, x, gamma, beta, begin_axis, eps))
#define wf_layer_norm_backward_input(g, x, gamma, dy, begin_axis, eps) \
    (WF__HERE(), (wf_layer_norm_backward_input)(g, x, gamma, dy, begin_axis, eps))
#define wf_dropout(g, x, rate, seed) (WF__HERE(), (wf_dropout)(g, x, rate, seed))
#define wf_activation_grad(g, act, x_or_y, dy, alpha) \
    (WF__HERE(), (wf_activation_grad)(g, act, x_or_y, dy, alpha))
#define wf_scatter_add(g, updates, indices, axis, dim) \
    (WF__HERE(), (wf_scatter_add)(g, updates, indices, axis, dim))
#define wf_slice_backward(g, dy, x_shape, begin, end, step) \
    (WF__HERE(), (wf_slice_backward)(g, dy, x_shape, begin, end, step))

#ifdef __cplusplus
}
#endif
#endif /* WEFT_NN_H */
