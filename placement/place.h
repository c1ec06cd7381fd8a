/* placement/place.h: device assignment, the module interface of placement/ that runtime/
 *   wires (wf__ names; not installed).
 * Owns: the contract of wf__place(), a pure function from the nodes of a compiled plan (in
 *   a topological order, inputs as CSR arrays), the devices of a runtime, the kernel
 *   registry and the session's rule to an assignment (a device per node, the variables
 *   resident on a device) and the partitioned node list: one node of core's copy op per
 *   value and destination device, inserted right after its value.
 * Invariants: wf__place() reads its input only, and its result owns what it points to
 *   (the copy nodes included); it opens no device, runs nothing and touches no session.
 * Not here: opening the devices, resolving the kernels, the plan's own arrays (runtime/
 *   pass_place.c wires the result in), the copy kernels (devices/copy.c). */
#ifndef WF_PLACEMENT_PLACE_H
#define WF_PLACEMENT_PLACE_H

#include "../core/graph.h"
#include "../core/op.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- device assignment (wf__place) ---------------------------------------------------- */

/* What placement reads: the nodes of a plan and where they may go. */
typedef struct wf__place_in {
    int n;                      /* nodes */
    wf_node *const *nodes;      /* in a topological order */
    const int32_t *in_off;      /* CSR of input indices: node i reads in_idx[in_off[i] ..
                                   in_off[i + 1]) (n + 1 entries) */
    const int32_t *in_idx;      /* one per input edge */
    int n_key;                  /* fetched and targeted nodes */
    const int32_t *key;         /* their indices among 'nodes' (-1: none) */
    const wf__kernels *kernels; /* the session's registry (core/op.h) */
    int n_real;                 /* the runtime's devices: 0 the CPU, 1 + k CUDA GPU k */
    int n_sim;                  /* simulated devices numbered after them (tests), which run
                                   the CPU kernels */
    int device;                 /* the rule (wf_session_opts.device): -1 the CPU, 0 where the
                                   inputs are preferring a GPU, D device D */
    bool small;                 /* a plan small enough to run inline: the rule keeps it on
                                   the CPU (a copy to a GPU costs more than such a plan) */
} wf__place_in;

/* A copy: node 'at' of the result (a node of core's copy op) reads the value of node
 * 'value' (result indices), made on device 'from', and makes it on device 'to' (0: the
 * host). */
typedef struct wf__copy {
    int32_t value, at;
    int16_t from, to;
} wf__copy;

/* What placement gives back. With 'where' NULL every node runs on the CPU and the nodes stay
 * as they were (the other fields are 0 or NULL). Otherwise the partitioned list replaces the
 * input's: 'n' nodes, the input's in their order with each value's copies right after it. */
typedef struct wf__placement {
    int n;                /* nodes after insertion (input nodes + copies) */
    wf_node **nodes;      /* borrowed input nodes and the owned copy nodes */
    int32_t *in_off;      /* CSR of inputs over the new indices (n + 1 entries); a reader
                             on another device than its input reads the input's copy */
    int32_t *in_idx;      /* one per input edge */
    int32_t *new_index;   /* per input node: its index after insertion */
    int32_t *key_at;      /* per key entry: the node that hands out its value (a key node
                             on a GPU: its copy to the host), or -1 */
    int16_t *where;       /* per node: its device id (a copy's: its destination) */
    int n_gpu;            /* input nodes placed on a GPU (updates included) */
    int n_resident;       /* variables resident on a GPU: every reader of one runs there */
    int n_copies;         /* entries of 'copies' */
    wf__copy *copies;     /* sorted by value, then by destination */
    wf_node **copy_nodes; /* per copy: its node (owned; in no graph, id -1) */
    int32_t *order;       /* 'n_order' (before, after) pairs: a fetched resident variable's
                             copy to the host after the updates that write it in place */
    int n_order;
} wf__placement;

/* Assigns a device to every node of 'in' and inserts the copies (the rule: placement/
 * place.c's header). Explicit placements (wf_node_set_device()) are checked as
 * wf__place_check() does; the rule places the others; updates follow their variables'
 * readers and variables read on one device only become resident there. Returns 0 with
 * '*out' filled (out->where NULL: all on the CPU), or a negative status naming the node and
 * the device in wf_last_errmsg(): WF_EINVAL (no such device, a bad rule), WF_ENODEV (no
 * kernel there), WF_ENOSYS (an update placed on a device whose variable is read elsewhere),
 * WF_ENOMEM. Ownership: '*out' is owned (wf__placement_free()); its nodes borrow the
 * input's. Threads: any; reads only 'in'. */
int wf__place(const wf__place_in *in, wf__placement *out);

/* Frees what 'pl' owns and zeroes it; NULL or a zeroed one is a no-op. */
void wf__placement_free(wf__placement *pl);

/* Checks the device 'node' was placed on with wf_node_set_device() (nothing when it was
 * not) against 'in''s devices and registry: WF_EINVAL for a device the runtime lacks,
 * WF_ENODEV for an op without a kernel for it, naming the node and the device
 * (wf_last_errmsg()). Only 'kernels', 'n_real' and 'n_sim' of 'in' are read. */
int wf__place_check(const wf__place_in *in, const wf_node *node);

/* "cpu:0", "cuda:K" or "sim:K" for device 'id' of a runtime with 'n_real' devices, into
 * 'buf'. */
const char *wf__place_dev_name(int id, int n_real, char *buf, size_t size);

/* The kernel slot (WF_KERNEL_*) that runs on device 'id' of a runtime with 'n_real'
 * devices (simulated ones run the CPU kernels). */
int wf__place_kernel_kind(int id, int n_real);

#endif /* WF_PLACEMENT_PLACE_H */
