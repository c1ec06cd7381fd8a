/* ops/matmul_cpu.c: CPU kernel of matmul: 2-D and batched (NumPy broadcasting of the batch
 * axes), with transpose flags, through BLAS: cblas_sgemm for f32, cblas_dgemm for f64; bf16
 * and f16 are converted to f32 and back. Also the same product with a GEMM epilogue (a bias
 * row and an activation, wf__matmul_epilogue_cpu), the kernel of the plan-only op
 * matmul_epilogue that runtime/compile/pass_epilogue.c makes.
 * Owns: mapping strided operands onto BLAS (a matrix with one unit stride is passed as is,
 * flipping the transpose flag when it is column-major; any other layout is packed first),
 * the tiling of the product, and the epilogue of each tile.
 * Invariant (determinism): the output of each batch matrix is cut into MM_TILE_M x MM_TILE_N
 * tiles fixed by the shapes alone, and each tile is one single-threaded BLAS call over the
 * whole K; ctx->rt only decides which worker runs which tile, so the bits never depend on it.
 * Invariant (epilogues): the bias add and the activation of a tile run, row by row of the
 *   tile, the elementwise kernels' own loops (ops/scalar.h: wf__ew_apply_*), in the order the
 *   separate nodes run them (add, then activation), each element alone: the bits are those of
 *   matmul, add and activation as three nodes. Why in the tile task: the tile (256 x 256 f32
 *   is 256 KiB) is still in L2 after its GEMM, so the epilogue costs no pass over memory and
 *   no extra task; as separate nodes, bias and ReLU were two more passes over the whole output.
 *
 * Which BLAS (ops/blas.c says which and why): every tile is one wf__gemm() call, single-
 *   threaded on the calling worker. Without weft's private OpenBLAS (wf__blas_private()
 *   false) each matrix is one call and weft does not tile, so BLAS threads and weft's
 *   workers never both split one product.
 * Not here: the op definitions and matmul's gradient; which nodes get an epilogue (runtime/). */
#include "../core/error.h"
#include "../core/tensor.h"
#include "kernels.h"
#include "layout.h"
#include "scalar.h"

#include <limits.h>
#include <string.h>

#define MM_TILE_M    256
#define MM_TILE_N    256
#define MM_PAR_FLOPS (1 << 22) /* products below this many flops run on the calling thread */

/* One operand as BLAS sees it: a row-major matrix at 'data' + batch offset, leading
 * dimension 'ld', transposed for BLAS when 'trans'. */
typedef struct mm_operand {
    const char *data;
    int64_t bst[WF_MAX_RANK]; /* strides in elements of out's batch axes (0: broadcast) */
    bool trans;
    int64_t ld;
} mm_operand;

typedef struct mm_plan {
    wf_dtype dt;
    int64_t es, M, N, K;
    int nb_rank;
    int64_t bdims[WF_MAX_RANK]; /* out's batch axes */
    int64_t tile_m, tile_n;     /* MM_TILE_M x MM_TILE_N, or whole matrices without serial BLAS */
    int64_t tiles_m, tiles_n, n_items;
    mm_operand a, b;
    char *c;
    const wf_epilogue *ep; /* NULL: a plain product */
    const char *bias;      /* the bias row's element 0, or NULL */
    int64_t bias_st;       /* its stride in elements along N (0: one value for every column) */
} mm_plan;

bool wf__ops_blas_layout(int64_t rows, int64_t cols, int64_t sr, int64_t sc, bool trans,
                         bool *trans_out, int64_t *ld)
{
    int64_t r1 = rows > 1 ? rows : 1, c1 = cols > 1 ? cols : 1;
    if ((cols <= 1 || sc == 1) && (rows <= 1 || sr >= c1)) { /* row-major */
        *trans_out = trans;
        *ld = rows <= 1 ? c1 : sr;
    } else if ((rows <= 1 || sr == 1) && (cols <= 1 || sc >= r1)) { /* column-major */
        *trans_out = !trans;
        *ld = cols <= 1 ? r1 : sc;
    } else {
        return false;
    }
    return *ld <= INT_MAX;
}

/* wf__ops_blas_layout() into 'op'. */
static bool blas_layout(int64_t rows, int64_t cols, int64_t sr, int64_t sc, bool trans,
                        mm_operand *op)
{
    return wf__ops_blas_layout(rows, cols, sr, sc, trans, &op->trans, &op->ld);
}

/* The epilogue of the mt x nt tile at 'c' (row stride N, first column n0): per row, the bias
 * add, then the activation, each the elementwise kernel's loop (file header). */
static int epilogue_tile(const mm_plan *pl, char *c, int64_t mt, int64_t nt, int64_t n0)
{
    const wf_epilogue *ep = pl->ep;
    const char *bias = pl->bias ? pl->bias + n0 * pl->bias_st * pl->es : NULL;
    int rc = 0;
    for (int64_t i = 0; i < mt && rc == 0; i++) {
        char *row = c + i * pl->N * pl->es;
        if (bias)
            rc = ep->bias_first ? wf__ew_apply_binary(WF_BINARY_ADD, pl->dt, row, bias, pl->bias_st,
                                                      row, 1, nt)
                                : wf__ew_apply_binary(WF_BINARY_ADD, pl->dt, row, row, 1, bias,
                                                      pl->bias_st, nt);
        if (rc == 0 && ep->act >= 0)
            rc = wf__ew_apply_unary((wf_unary_op)ep->act, ep->alpha, pl->dt, row, nt);
    }
    return rc;
}

/* One tile: item 'k' is (batch, tile row, tile column) in row-major order. */
static int tile(void *ctx, int64_t lo, int64_t hi)
{
    const mm_plan *pl = ctx;
    for (int64_t k = lo; k < hi; k++) {
        int64_t tn = k % pl->tiles_n, tm = (k / pl->tiles_n) % pl->tiles_m;
        int64_t batch = k / pl->tiles_n / pl->tiles_m, rem = batch, aoff = 0, boff = 0;
        for (int d = pl->nb_rank - 1; d >= 0; d--) {
            int64_t i = rem % pl->bdims[d];
            rem /= pl->bdims[d];
            aoff += i * pl->a.bst[d];
            boff += i * pl->b.bst[d];
        }
        int64_t m0 = tm * pl->tile_m, n0 = tn * pl->tile_n;
        int64_t mt = pl->M - m0 < pl->tile_m ? pl->M - m0 : pl->tile_m;
        int64_t nt = pl->N - n0 < pl->tile_n ? pl->N - n0 : pl->tile_n;
        /* Row m0 of op(a): row m0 of a stored as is, column m0 of a stored transposed. */
        aoff += pl->a.trans ? m0 : m0 * pl->a.ld;
        boff += pl->b.trans ? n0 * pl->b.ld : n0;
        char *c = pl->c + ((batch * pl->M + m0) * pl->N + n0) * pl->es;
        wf__gemm(pl->dt, pl->a.trans, pl->b.trans, mt, nt, pl->K, pl->a.data + aoff * pl->es,
                 pl->a.ld, pl->b.data + boff * pl->es, pl->b.ld, false, c, pl->N);
        if (pl->ep) {
            int rc = epilogue_tile(pl, c, mt, nt, n0);
            if (rc < 0)
                return rc;
        }
    }
    return 0;
}

/* bf16 and f16: the product of f32 copies, rounded into 'out' (wf__run_via_f32). */
static int matmul_f32(const wf_kctx *ctx, const void *arg, const wf_tensor *a, const wf_tensor *b,
                      wf_tensor *out)
{
    const bool *trans = arg;
    return wf__matmul_cpu(ctx, trans[0], trans[1], a, b, out);
}

static int matmul_half(const wf_kctx *ctx, bool trans_a, bool trans_b, const wf_tensor *a,
                       const wf_tensor *b, wf_tensor *out)
{
    const bool trans[2] = { trans_a, trans_b };
    return wf__run_via_f32(ctx, a, b, out, matmul_f32, trans);
}

/* The epilogue over the whole of 'out' by the elementwise kernels (bf16/f16, and K == 0,
 * where no tile runs a GEMM): the same loops, through the kernels' iterator. */
static int epilogue_whole(const wf_kctx *ctx, const wf_epilogue *ep, const wf_tensor *bias,
                          wf_tensor *out)
{
    int rc = 0;
    if (bias)
        rc = ep->bias_first ? wf__binary_cpu(ctx, WF_BINARY_ADD, bias, out, out)
                            : wf__binary_cpu(ctx, WF_BINARY_ADD, out, bias, out);
    if (rc == 0 && ep->act >= 0)
        rc = wf__unary_cpu(ctx, (wf_unary_op)ep->act, ep->alpha, out, out);
    return rc;
}

/* True for the activations an epilogue takes (kernels.h: wf_epilogue.act). */
static bool epilogue_act(int act)
{
    return act == -1 || act == WF_UNARY_RELU || act == WF_UNARY_LEAKY_RELU ||
           act == WF_UNARY_GELU_ERF || act == WF_UNARY_GELU_TANH || act == WF_UNARY_TANH ||
           act == WF_UNARY_SIGMOID || act == WF_UNARY_SILU;
}

/* Checks 'bias' against out's shape 'os' (kernels.h: wf__matmul_epilogue_cpu). */
int wf__ops_matmul_check_bias(const char *name, const wf_tensor *bias, wf_dtype dt, wf_shape os)
{
    char s1[160], s2[160];
    int r = bias->shape.rank;
    bool ok = r >= 1 && r <= os.rank;
    for (int d = 0; ok && d < r - 1; d++)
        ok = bias->shape.dims[d] == 1;
    ok = ok && (bias->shape.dims[r - 1] == os.dims[os.rank - 1] || bias->shape.dims[r - 1] == 1);
    if (bias->dtype != dt)
        return wf__err(WF_EDTYPE, "%s: the bias is %s but the product is %s", name,
                       wf_dtype_name(bias->dtype), wf_dtype_name(dt));
    if (!ok)
        return wf__err(WF_ESHAPE,
                       "%s: the bias is %s but the product is %s: a bias is one row ([N], or 1 "
                       "in every dimension but the last, which is N or 1)",
                       name, wf_shape_str(bias->shape, s1, sizeof s1),
                       wf_shape_str(os, s2, sizeof s2));
    return 0;
}

int wf__ops_matmul_shape(const char *name, bool trans_a, bool trans_b, const wf_tensor *a,
                         const wf_tensor *b, const wf_tensor *out, int64_t *M, int64_t *N,
                         int64_t *K, wf_shape *oshape)
{
    char sa[160], sb[160];
    if (!a || !b || !out)
        return wf__err(WF_EINVAL, "%s: %s is NULL", name, !a ? "a" : !b ? "b" : "out");
    if (a->dtype != b->dtype)
        return wf__err(WF_EDTYPE, "%s: a is %s but b is %s", name, wf_dtype_name(a->dtype),
                       wf_dtype_name(b->dtype));
    wf_dtype dt = a->dtype;
    if (dt != WF_F32 && dt != WF_F64 && dt != WF_BF16 && dt != WF_F16)
        return wf__err(WF_EDTYPE, "%s: a and b are %s; %s takes f32, f64, bf16, f16", name,
                       wf_dtype_name(dt), name);
    int ra = a->shape.rank, rb = b->shape.rank;
    if (ra < 2 || rb < 2)
        return wf__err(WF_ESHAPE, "%s: a is %s and b is %s; both need rank >= 2", name,
                       wf_shape_str(a->shape, sa, sizeof sa),
                       wf_shape_str(b->shape, sb, sizeof sb));
    int64_t m = a->shape.dims[ra - (trans_a ? 1 : 2)], k = a->shape.dims[ra - (trans_a ? 2 : 1)];
    int64_t Kb = b->shape.dims[rb - (trans_b ? 1 : 2)], n = b->shape.dims[rb - (trans_b ? 2 : 1)];
    if (k != Kb)
        return wf__err(WF_ESHAPE,
                       "%s: a is %s%s but b is %s%s: inner dimensions %lld and %lld differ", name,
                       wf_shape_str(a->shape, sa, sizeof sa), trans_a ? " (transposed)" : "",
                       wf_shape_str(b->shape, sb, sizeof sb), trans_b ? " (transposed)" : "",
                       (long long)k, (long long)Kb);
    /* Batch axes: NumPy broadcasting of a's and b's leading axes. */
    int na = ra - 2, nbb = rb - 2, nb = na > nbb ? na : nbb;
    wf_shape os = { .rank = nb + 2 };
    for (int d = 0; d < nb; d++) {
        int ia = d - (nb - na), ib = d - (nb - nbb);
        int64_t x = ia >= 0 ? a->shape.dims[ia] : 1, y = ib >= 0 ? b->shape.dims[ib] : 1;
        if (x != y && x != 1 && y != 1)
            return wf__err(WF_ESHAPE, "%s: a is %s and b is %s: batch axes do not broadcast", name,
                           wf_shape_str(a->shape, sa, sizeof sa),
                           wf_shape_str(b->shape, sb, sizeof sb));
        os.dims[d] = x == 1 ? y : x;
    }
    os.dims[nb] = *M = m;
    os.dims[nb + 1] = *N = n;
    *K = k;
    *oshape = os;
    return 0;
}

/* matmul, with the epilogue 'ep' (NULL: none) and 'bias' (NULL: none); 'name' for messages. */
static int product(const wf_kctx *ctx, const char *name, bool trans_a, bool trans_b,
                   const wf_epilogue *ep, const wf_tensor *a, const wf_tensor *b,
                   const wf_tensor *bias, wf_tensor *out)
{
    char sa[160], sb[160];
    int64_t M, N, K;
    wf_shape oshape;
    int rc = wf__ops_matmul_shape(name, trans_a, trans_b, a, b, out, &M, &N, &K, &oshape);
    if (rc < 0)
        return rc;
    wf_dtype dt = a->dtype;
    mm_plan pl = { .dt = dt, .M = M, .N = N, .K = K };
    int nb = oshape.rank - 2;
    for (int d = 0; d < nb; d++)
        pl.bdims[d] = oshape.dims[d];
    rc = wf__kernel_check_out(name, out, dt, oshape);
    if (rc == 0 && bias)
        rc = wf__ops_matmul_check_bias(name, bias, dt, oshape);
    if (rc < 0)
        return rc;
    if (M > INT_MAX || N > INT_MAX || K > INT_MAX)
        return wf__err(WF_EINVAL, "%s: a is %s and b is %s: a dimension exceeds BLAS's int", name,
                       wf_shape_str(a->shape, sa, sizeof sa),
                       wf_shape_str(b->shape, sb, sizeof sb));
    if (dt == WF_BF16 || dt == WF_F16) {
        rc = matmul_half(ctx, trans_a, trans_b, a, b, out);
        return rc == 0 && ep ? epilogue_whole(ctx, ep, bias, out) : rc;
    }
    if (out->numel == 0)
        return 0;
    pl.es = (int64_t)wf_dtype_size(dt);
    if (K == 0) {
        memset(out->data, 0, (size_t)out->numel * (size_t)pl.es);
        return ep ? epilogue_whole(ctx, ep, bias, out) : 0;
    }
    pl.ep = ep;
    if (bias) {
        int r = bias->shape.rank;
        pl.bias = bias->data;
        pl.bias_st = bias->shape.dims[r - 1] == 1 ? 0 : bias->strides[r - 1];
    }

    /* Operands without a unit stride in their matrix axes are packed (row-major copies). */
    wf_tensor *packed[2] = { NULL, NULL };
    const wf_tensor *ops[2] = { a, b };
    mm_operand *mo[2] = { &pl.a, &pl.b };
    bool tr[2] = { trans_a, trans_b };
    for (int i = 0; i < 2 && rc >= 0; i++) {
        const wf_tensor *t = ops[i];
        int r = t->shape.rank;
        if (!blas_layout(t->shape.dims[r - 2], t->shape.dims[r - 1], t->strides[r - 2],
                         t->strides[r - 1], tr[i], mo[i])) {
            rc = wf__nn_contiguous(ctx, t, dt, &packed[i]);
            if (rc < 0)
                break;
            t = packed[i];
            (void)blas_layout(t->shape.dims[r - 2], t->shape.dims[r - 1], t->strides[r - 2],
                              t->strides[r - 1], tr[i], mo[i]);
        }
        mo[i]->data = t->data;
        int n_own = r - 2;
        for (int d = 0; d < nb; d++) {
            int td = d - (nb - n_own);
            mo[i]->bst[d] = td < 0 || t->shape.dims[td] == 1 ? 0 : t->strides[td];
        }
    }
    if (rc >= 0) {
        pl.nb_rank = nb;
        pl.c = out->data;
        int64_t nbatch = 1;
        for (int d = 0; d < nb; d++)
            nbatch *= pl.bdims[d];
        /* Without a private serial BLAS, one call per matrix: BLAS threads split it. */
        pl.tile_m = wf__blas_private() ? MM_TILE_M : M;
        pl.tile_n = wf__blas_private() ? MM_TILE_N : N;
        pl.tiles_m = (M + pl.tile_m - 1) / pl.tile_m;
        pl.tiles_n = (N + pl.tile_n - 1) / pl.tile_n;
        pl.n_items = nbatch * pl.tiles_m * pl.tiles_n;
        double flops = 2.0 * (double)nbatch * (double)M * (double)N * (double)K;
        if (wf__blas_private() && ctx && ctx->rt && pl.n_items > 1 && flops >= MM_PAR_FLOPS)
            rc = wf_parallel_for(ctx->rt, 0, pl.n_items, 1, tile, &pl);
        else
            rc = tile(&pl, 0, pl.n_items);
    }
    wf_tensor_release(packed[0]);
    wf_tensor_release(packed[1]);
    return rc;
}

int wf__matmul_cpu(const wf_kctx *ctx, bool trans_a, bool trans_b, const wf_tensor *a,
                   const wf_tensor *b, wf_tensor *out)
{
    return product(ctx, "matmul", trans_a, trans_b, NULL, a, b, NULL, out);
}

int wf__matmul_epilogue_cpu(const wf_kctx *ctx, bool trans_a, bool trans_b, const wf_epilogue *ep,
                            const wf_tensor *a, const wf_tensor *b, const wf_tensor *bias,
                            wf_tensor *out)
{
    if (!ep)
        return wf__err(WF_EINVAL, "matmul_epilogue: the epilogue is NULL");
    if (!epilogue_act(ep->act))
        return wf__err(WF_EINVAL,
                       "matmul_epilogue: activation %d is not relu, leaky_relu, gelu, gelu_tanh, "
                       "tanh, sigmoid or silu",
                       ep->act);
    return product(ctx, "matmul_epilogue", trans_a, trans_b, ep, a, b, bias, out);
}
