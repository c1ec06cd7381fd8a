/* core/op_kernels.c: the kernel registry keyed by (op, device kind) (core/op.h).
 * Owns: a registry's entries: (op def, kind) -> (kernel, which nodes it computes, the data
 *   the kernel gets as wf_kernel_ctx.data).
 * Invariant: at most one entry per (op, kind); an entry with a NULL kernel means "no kernel
 *   there", which hides the op's own slot.
 * Why a flat array searched linearly: a session registers a handful of kernels (copies,
 *   send and receive, a test's), and lookups happen while compiling a plan, once per node
 *   and device kind; the plan keeps what it found, so runs never search.
 * Not here: who registers what (devices/, transport/, runtime/ wires them at session
 *   creation), placement (runtime/). */
#include "error.h"
#include "op.h"

#include <stdlib.h>

typedef struct entry {
    const wf_op_def *op;
    int kind;
    wf_kernel_fn fn;
    wf_kernel_ok_fn ok;
    void *data;
} entry;

struct wf__kernels {
    entry *e;
    int n, cap;
};

int wf__kernels_create(wf__kernels **out)
{
    if (!out)
        return wf__err(WF_EINVAL, "wf__kernels_create: out is NULL");
    *out = calloc(1, sizeof **out);
    return *out ? 0 : wf__err(WF_ENOMEM, "no memory for a kernel registry");
}

void wf__kernels_destroy(wf__kernels *r)
{
    if (!r)
        return;
    free(r->e);
    free(r);
}

static const entry *lookup(const wf__kernels *r, const wf_op_def *op, int kind)
{
    for (int i = 0; r && i < r->n; i++)
        if (r->e[i].op == op && r->e[i].kind == kind)
            return &r->e[i];
    return NULL;
}

int wf__kernels_register(wf__kernels *r, const wf_op_def *op, int kind, wf_kernel_fn fn,
                         wf_kernel_ok_fn ok, void *data)
{
    if (!r || !op)
        return wf__err(WF_EINVAL, "wf__kernels_register: registry or op is NULL");
    if (kind < 0 || kind >= WF_DEVICE_KINDS)
        return wf__err(WF_EINVAL, "wf__kernels_register: %s: device kind %d is not one of 0 .. %d",
                       op->name ? op->name : "?", kind, WF_DEVICE_KINDS - 1);
    entry *e = (entry *)lookup(r, op, kind);
    if (!e) {
        if (r->n == r->cap) {
            int cap = r->cap ? 2 * r->cap : 8;
            entry *ne = realloc(r->e, (size_t)cap * sizeof *ne);
            if (!ne)
                return wf__err(WF_ENOMEM, "no memory to register a kernel of '%s'",
                               op->name ? op->name : "?");
            r->e = ne;
            r->cap = cap;
        }
        e = &r->e[r->n++];
    }
    *e = (entry){ op, kind, fn, ok, data };
    return 0;
}

wf_kernel_fn wf__kernels_find(const wf__kernels *r, const wf_op_def *op, int kind)
{
    if (!op || kind < 0 || kind >= WF_DEVICE_KINDS)
        return NULL;
    const entry *e = lookup(r, op, kind);
    return e ? e->fn : op->kernel[kind];
}

void *wf__kernels_data(const wf__kernels *r, const wf_op_def *op, int kind)
{
    const entry *e = op ? lookup(r, op, kind) : NULL;
    return e ? e->data : NULL;
}

bool wf__kernels_ok(const wf__kernels *r, const wf_op_def *op, const struct wf_node *n, int kind)
{
    if (!op || kind < 0 || kind >= WF_DEVICE_KINDS)
        return false;
    const entry *e = lookup(r, op, kind);
    if (!e)
        return wf__op_kernel_ok(op, n, kind);
    return e->fn && (!e->ok || e->ok(n, kind));
}
