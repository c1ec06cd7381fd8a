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

/* ---- Normalization, dropout and backward helpers ------------------------------------------ */

#ifdef __cplusplus
}
#endif
#endif /* WEFT_NN_H */
