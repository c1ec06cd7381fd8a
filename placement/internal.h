/* placement/internal.h: what the files of placement/ share (module-internal).
 * Owns: the layouts of wf_cluster and wf_place_hints, and the parsing of device strings.
 * Invariants: a cluster's 'links' is n_devices x n_devices, row-major, symmetric, with a
 *   zero diagonal; a link a user never set holds the default for its pair (same rank or
 *   not); (rank, kind, index) is unique among a cluster's devices.
 * Not here: the public contract (weft/placement.h). */
#ifndef WF_PLACEMENT_INTERNAL_H
#define WF_PLACEMENT_INTERNAL_H

#include "../core/error.h"
#include "../core/graph.h"

#include <weft/placement.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define WF_PLACE_MAX_DEVICES 256

typedef struct wf_place_link {
    double latency_s;
    double bytes_per_s;
    bool set; /* by wf_cluster_set_link(); else the default for the pair */
} wf_place_link;

struct wf_cluster {
    int n_devices;
    wf_cluster_device devices[WF_PLACE_MAX_DEVICES];
    wf_place_link *links; /* n_devices * n_devices */
};

/* A parsed device string: rank (0 when not given), kind, index. */
typedef struct wf_place_spec {
    int rank, kind, index;
} wf_place_spec;

/* Parses "rank:R/cpu:I" (see wf_cluster_find()). Returns 0 or WF_EINVAL with the message. */
int wf__place_parse(const char *s, wf_place_spec *out);

/* One hint: a node id, or a scope [first, last) of ids, and its device string. */
typedef struct wf_place_hint_ent {
    int first, last; /* ids first .. last-1; a node hint has last = first + 1 */
    bool scope;      /* node hints win over scopes */
    char device[64];
    wf_place_spec spec;
} wf_place_hint_ent;

struct wf_place_hints {
    wf_place_hint_ent *ents;
    int n, cap;
    const wf_graph *scope_graph; /* an open scope's graph, or NULL */
    int scope_first;
    char scope_device[64];
};

/* The cluster device index of node id 'id' by the hints (node hints first, later ones win),
 * or -1 when none; WF_ENOTFOUND / WF_EINVAL when the hint's device is not in 'c' (the message
 * names the node and the device). */
int wf__place_hint_device(const wf_place_hints *h, const wf_cluster *c, const wf_node *n);

/* The transfer time of 'bytes' over the link a -> b: 0 for no bytes or a == b, else
 * latency + bytes / bandwidth. */
double wf__place_xfer_seconds(const wf_cluster *c, int a, int b, double bytes);

/* Copies source 'n' (a placeholder, variable or constant) into 'h' with its name and source
 * location: a placeholder's first dimension -1 becomes 'rows' when rows > 0; a variable gets
 * 'n's value when 'value' (else only its initializer). Returns the copy, or NULL with the
 * error in 'h'. */
wf_node *wf__place_copy_source(wf_graph *h, const wf_node *n, int64_t rows, bool value);

/* The bytes of a node's value (-1 dimensions count as 1). */
double wf__place_value_bytes(const wf_node *n);

#endif /* WF_PLACEMENT_INTERNAL_H */
