/* core/op.c: the op registry: core's own op defs (placeholder, constant, variable), lookup
 * by name over an explicit table, table checks, and re-running inference on stand-in
 * inputs.
 * Owns: nothing mutable: the defs and the built-in table are 'static const' or 'const'
 *   (core/op.h explains why registration is by pointer and lookup takes a table).
 * Not here: every other op (ops/), kernels, gradients. */
#include "internal.h"
#include "tensor.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Checks the dtype and shape a source op got in its attributes; 'min_dim' is -1 where "any
 * size" is allowed (placeholders), else 0. */
int wf__op_check_type(const wf_attrs *a, int64_t min_dim, char *err, size_t errlen)
{
    if (a->dtype == WF_DTYPE_INVALID || !wf_dtype_size(a->dtype)) {
        snprintf(err, errlen, "dtype %d is not a wf_dtype", (int)a->dtype);
        return WF_EINVAL;
    }
    if (a->shape.rank < 0 || a->shape.rank > WF_MAX_RANK) {
        snprintf(err, errlen, "rank %d is not in 0..%d", (int)a->shape.rank, WF_MAX_RANK);
        return WF_EINVAL;
    }
    for (int i = 0; i < a->shape.rank; i++)
        if (a->shape.dims[i] < min_dim) {
            char s[160];
            snprintf(err, errlen, "shape %s: dimension %d is %lld; %s",
                     wf_shape_str(a->shape, s, sizeof s), i, (long long)a->shape.dims[i],
                     min_dim < 0 ? "dimensions are >= 0, or -1 for any size"
                                 : "dimensions must be known (>= 0) here");
            return WF_EINVAL;
        }
    return 0;
}

static void set_type(wf_node *n)
{
    n->dtype = n->attrs->dtype;
    n->shape = n->attrs->shape;
}

static int infer_placeholder(wf_node *n, char *err, size_t errlen)
{
    int rc = wf__op_check_type(n->attrs, -1, err, errlen);
    if (rc == 0)
        set_type(n);
    return rc;
}

static int infer_constant(wf_node *n, char *err, size_t errlen)
{
    int rc = wf__op_check_type(n->attrs, 0, err, errlen);
    if (rc == 0)
        set_type(n);
    return rc;
}

static int infer_variable(wf_node *n, char *err, size_t errlen)
{
    int rc = wf__op_check_type(n->attrs, 0, err, errlen);
    if (rc == 0)
        rc = wf__init_check(n->attrs->init, n->attrs->dtype, n->attrs->shape, err, errlen);
    if (rc == 0)
        set_type(n);
    return rc;
}

/* Sources move no data when they run; the bytes are those of the value. */
static void cost_source(const wf_node *n, double *flops, double *bytes)
{
    int64_t numel = 1;
    for (int i = 0; i < n->shape.rank; i++)
        numel *= n->shape.dims[i] >= 0 ? n->shape.dims[i] : 1; // -1 counts as 1
    *flops = 0;
    *bytes = (double)numel * (double)wf_dtype_size(n->dtype);
}

const wf_op_def wf_op_placeholder = {
    .name = "placeholder",
    .min_inputs = 0,
    .max_inputs = 0,
    .infer = infer_placeholder,
    .cost = cost_source,
    .flags = WF_OP_SOURCE | WF_OP_NO_GRAD,
};

const wf_op_def wf_op_constant = {
    .name = "constant",
    .min_inputs = 0,
    .max_inputs = 0,
    .infer = infer_constant,
    .cost = cost_source,
    .flags = WF_OP_SOURCE | WF_OP_NO_GRAD,
};

const wf_op_def wf_op_variable = {
    .name = "variable",
    .min_inputs = 0,
    .max_inputs = 0,
    .infer = infer_variable,
    .cost = cost_source,
    .flags = WF_OP_SOURCE | WF_OP_STATEFUL,
};

static const wf_op_def *const builtins[] = { &wf_op_placeholder, &wf_op_constant,  &wf_op_variable,
                                             &wf_op_send,        &wf_op_recv,      &wf_op_copy,
                                             &wf_op_shard_rows,  &wf_op_dp_reduce, &wf_op_ps_assign,
                                             &wf_op_ps_join,     &wf_op_dp_grad,   &wf_op_ps_note };

#define N_BUILTINS (sizeof builtins / sizeof builtins[0])

const wf_op_def *wf__op_find(const wf_op_def *const *table, size_t count, const char *name)
{
    if (!name)
        return NULL;
    for (size_t i = 0; i < N_BUILTINS; i++)
        if (strcmp(builtins[i]->name, name) == 0)
            return builtins[i];
    for (size_t i = 0; table && i < count; i++)
        if (table[i] && table[i]->name && strcmp(table[i]->name, name) == 0)
            return table[i];
    return NULL;
}

int wf__op_check_table(const wf_op_def *const *table, size_t count)
{
    if (count && !table)
        return wf__err(WF_EINVAL, "op table: NULL with %zu entries", count);
    for (size_t i = 0; i < count; i++) {
        const wf_op_def *op = table[i];
        if (!op || !op->name || !*op->name)
            return wf__err(WF_EINVAL, "op table: entry %zu is NULL or has no name", i);
        if (!op->infer)
            return wf__err(WF_EINVAL, "op table: '%s' has no infer function", op->name);
        if (op->min_inputs < 0 || (op->max_inputs >= 0 && op->max_inputs < op->min_inputs))
            return wf__err(WF_EINVAL, "op table: '%s' takes %d to %d inputs", op->name,
                           op->min_inputs, op->max_inputs);
        for (size_t j = 0; j < N_BUILTINS; j++)
            if (strcmp(builtins[j]->name, op->name) == 0)
                return wf__err(WF_EINVAL, "op table: '%s' is the name of a core op", op->name);
        for (size_t j = 0; j < i; j++)
            if (table[j] == op || strcmp(table[j]->name, op->name) == 0)
                return wf__err(WF_EINVAL, "op table: entries %zu and %zu are both '%s'", j, i,
                               op->name);
    }
    return 0;
}

int wf__op_infer(const wf_node *n, const wf_dtype *in_dtypes, const wf_shape *in_shapes,
                 wf_dtype *dtype, wf_shape *shape)
{
    if (!n || !dtype || !shape || (n->n_inputs > 0 && (!in_dtypes || !in_shapes)))
        return wf__err(WF_EINVAL, "wf__op_infer: NULL argument");
    /* Stand-ins: copies of the inputs with the given types (infer reads only those, see
     * wf_infer_fn), and a copy of 'n' that points at them. */
    wf_node stack[WF_NODE_INLINE_INPUTS], *stand = stack;
    wf_node *ptr_stack[WF_NODE_INLINE_INPUTS], **ptrs = ptr_stack;
    if (n->n_inputs > WF_NODE_INLINE_INPUTS) {
        stand = malloc((size_t)n->n_inputs * sizeof *stand);
        ptrs = malloc((size_t)n->n_inputs * sizeof *ptrs);
        if (!stand || !ptrs) {
            free(stand);
            free(ptrs);
            return wf__err(WF_ENOMEM, "wf__op_infer: no memory for %d inputs", n->n_inputs);
        }
    }
    for (int i = 0; i < n->n_inputs; i++) {
        stand[i] = *n->inputs[i];
        stand[i].dtype = in_dtypes[i];
        stand[i].shape = in_shapes[i];
        ptrs[i] = &stand[i];
    }
    wf_node copy = *n;
    copy.inputs = ptrs;
    char detail[WF_ERRMSG_MAX];
    detail[0] = '\0';
    int rc = n->op->infer(&copy, detail, sizeof detail);
    if (stand != stack) {
        free(stand);
        free(ptrs);
    }
    if (rc < 0) {
        char prefix[WF_ERRMSG_MAX];
        wf__node_prefix(n, prefix, sizeof prefix);
        return wf__err(rc, "%s%s", prefix, detail[0] ? detail : "inference failed");
    }
    *dtype = copy.dtype;
    *shape = copy.shape;
    return 0;
}
