/* runtime/compile/passes.h: the compile passes of a plan and what they share (module-internal).
 * Owns: the pass context (wf__pass_ctx): the working node set of one compile, the rewrite
 *   map, the nodes the passes make, and the calls between plan.c and the pass files
 *   (passes.c: the framework and pruning; pass_fold.c: constant folding; pass_cse.c: common
 *   subexpression elimination; pass_simplify.c: algebraic simplification;
 *   pass_epilogue.c: GEMM epilogue fusion; pass_fuse.c:
 *   elementwise fusion;
 *   pass_optim_fuse.c: optimizer fusion; pass_mixed.c: the precision options).
 * Design: the graph is never written. A pass rewrites by replacement: 'repl[id] = other'
 *   says that whoever reads node 'id' reads node 'other' instead; new nodes (a folded
 *   constant, a merged reshape) are plan-owned wf_node structs with ids from 'n_orig' up
 *   that live as long as the plan, so a compile never adds nodes to the user's graph (two
 *   sessions of one graph compile at the same time without a lock, names and node counts
 *   stay the user's, and a failed pass cannot set the graph's error). plan.c builds the
 *   plan from the fetches and targets through the map.
 * Invariants (stated here once):
 *   - working ids: 0 .. n_orig-1 are the graph's nodes ('node[id]' is wf_graph_node()),
 *     n_orig .. n-1 the passes' own nodes; 'node[id]->id == id' for both;
 *   - 'find(id)' (the end of the chain id -> repl[id] -> ...) has the dtype and the shape
 *     of 'id' (-1 dimensions included), computes the same values bit for bit, and has an
 *     order key no later than id's, so sorting the needed nodes by (order key, id) is a
 *     topological order (a new node takes the key of the node it replaces and is made
 *     after its inputs);
 *   - a replaced node has no control edges, is not WF_OP_STATEFUL nor an update (n_assign),
 *     nor a source; a variable never gains a reader: update ops are ordered after the
 *     readers the graph had (grad/optim.c: after_readers()), and a new reader would not be
 *     ordered before them;
 *   - the one exception to the two rules above, optimizer fusion (pass_optim_fuse.c): update
 *     nodes (members) are replaced by a plan-owned multi-tensor update node that writes
 *     every variable and state variable they wrote, in place, and whose value is member
 *     0's. So a member may be replaced only when no live node reads it as data and it is
 *     not fetched or targeted (then its value is never seen and 'find(member)' need not
 *     have its shape), no two members write one variable, and no member is ordered after
 *     another; the fused node carries every member's control edges (after all readers of
 *     every variable it writes), and whoever was ordered after a member is ordered after
 *     it. Its order key is the latest member's (not the earliest), and the pass fuses only
 *     when every predecessor of the fused node has a key no later than that and every
 *     reader of a member a later one, so sorting by (key, id) stays topological;
 *   - the same exception for GEMM epilogues (pass_epilogue.c): the interior nodes of a fused
 *     chain (the matmul, and the add when an activation follows) are replaced by the fused
 *     node, so that whoever was ordered after them (control edges: an update after the
 *     readers of its variable) is ordered after the fused node, which reads what they read.
 *     Only when no live node reads an interior node as data and it is not fetched or
 *     targeted (its value is never seen), and every node ordered after it has a later
 *     order key than the fused node (which takes the chain's last node's);
 *   - passes never reorder floating-point work: a folded node runs the kernel it would run
 *     in the plan on the same inputs; CSE runs one of two identical computations; the
 *     algebraic rules keep only identities that are exact bit for bit (pass_simplify.c);
 *   - the exception to "the same values bit for bit": the precision options, which a session
 *     asks for (pass_mixed.c: WF_SESSION_MIXED_BF16 replaces an f32 product by a cast back
 *     from its bf16 twin, same dtype and shape, values rounded through bf16).
 * Not here: the plan arrays (plan.c), running (exec.c), the public flags (weft/runtime.h). */
#ifndef WF_RUNTIME_PASSES_H
#define WF_RUNTIME_PASSES_H

#include "plan.h"

#include <stdbool.h>
#include <stdint.h>

/* The most elements a folded constant may have: folding a broadcast of a scalar to a big
 * shape must not turn a cheap node into a plan that holds megabytes. */
#define WF__FOLD_MAX_NUMEL ((int64_t)1 << 20)

/* How a node left the plan or came into it (wf__rewrite.kind, dump marks). */
enum {
    WF__RW_NONE = 0,
    WF__RW_FOLDED,     /* replaced by a constant computed at compile time */
    WF__RW_CSE,        /* replaced by an earlier identical node */
    WF__RW_SIMPLIFIED, /* replaced by an algebraic identity */
    WF__RW_FUSED,      /* the root of an elementwise group, replaced by its fused node */
    WF__RW_EPILOGUE,   /* fused into a matmul's epilogue (pass_epilogue.c) */
    /* an update merged into a multi-tensor update node (pass_optim_fuse.c) */
    WF__RW_OPTIM_FUSED,
    /* a product computed in bf16 or marked for TF32 (pass_mixed.c: the precision options) */
    WF__RW_MIXED,
};

/* One replacement, for the dump. */
typedef struct wf__rewrite {
    const wf_node *from, *to;
    uint8_t kind; /* WF__RW_* */
} wf__rewrite;

typedef struct wf__pass_ctx {
    const wf__compile_in *in; /* what the compile reads (plan.h) */
    int n_orig;               /* the session's nodes */
    int n, cap;               /* working nodes; room in the arrays below */
    wf_node **node;           /* 'n' entries, see the invariants */
    int32_t *repl;            /* per working id: itself, or what replaces it */
    int32_t *order;           /* per working id: its order key */
    uint8_t *live;            /* per working id: needed by the key (after the latest prune) */
    uint8_t *made;            /* per working id: WF__RW_* of a node a pass made (0: a graph node) */
    int n_live;
    const int32_t *key; /* the fetched and targeted ids (originals) */
    int n_key;
    int32_t *stack; /* 'cap' entries of scratch */
    wf__rewrite *log;
    int n_log, cap_log;
    int n_folded, n_merged, n_simplified; /* replacements made by each pass */
    int n_fused, n_fused_members; /* fused_elementwise nodes made, ops they took (pass_fuse.c) */
    int n_epilogue; /* matmuls given a bias or activation epilogue (pass_epilogue.c) */
    /* multi-tensor update nodes made (pass_optim_fuse.c) */
    int n_optim_fused;
    /* products computed in bf16 and marked for TF32 (pass_mixed.c) */
    int n_mixed, n_tf32;
} wf__pass_ctx;

/* passes.c */

/* Sets up 'c' for a compile of 'key' with 'in' (borrowed while 'c' lives). Returns 0 or
 * WF_ENOMEM (wf_last_errmsg()). */
int wf__pass_init(wf__pass_ctx *c, const wf__compile_in *in, const int32_t *key, int n_key);

/* Frees what 'c' holds; the passes' nodes too unless wf__pass_take_nodes() took them. */
void wf__pass_deinit(wf__pass_ctx *c);

/* Moves the passes' nodes (and their constants) out of 'c' into '*nodes' ('*n' entries) for
 * the plan to keep; free them with wf__pass_free_nodes(). */
void wf__pass_take_nodes(wf__pass_ctx *c, wf_node ***nodes, int *n);
void wf__pass_free_nodes(wf_node **nodes, int n);

/* The end of 'id''s replacement chain (path-compressing). */
int32_t wf__pass_find(wf__pass_ctx *c, int32_t id);

/* The node input 'k' of working node 'n' reads after replacement. */
wf_node *wf__pass_input(wf__pass_ctx *c, const wf_node *n, int k);

/* Pass 1, pruning: marks in 'live' what the key needs over (replaced) inputs and control
 * edges; sets and returns 'n_live'. */
int wf__pass_prune(wf__pass_ctx *c);

/* The live nodes in topological order (order key, then id) into 'out' (room for 'n'
 * entries); returns how many, or WF_ENOMEM. */
int wf__pass_order(wf__pass_ctx *c, int32_t *out);

/* Says that 'id' is replaced by 'by' (already resolved) for the reason 'kind'. Returns 0 or
 * WF_ENOMEM. */
int wf__pass_replace(wf__pass_ctx *c, int32_t id, int32_t by, int kind);

/* Makes a plan-owned node of 'op' over 'inputs' (nodes of the context) with a copy of
 * 'attrs' (NULL: zeros), in the place of 'for_id' (its order key, name, source location),
 * and runs the op's inference; 'value' (constants only) is retained. The node must come
 * out with 'for_id''s dtype and shape unless 'any_type'. Returns the node, or NULL when it
 * cannot be made (no memory, an inference failure or another type: the rewrite is then
 * skipped, nothing is recorded). */
wf_node *wf__pass_make(wf__pass_ctx *c, int32_t for_id, const wf_op_def *op, wf_node *const *inputs,
                       int n_inputs, const wf_attrs *attrs, wf_tensor *value, bool any_type,
                       int kind);

/* True when 'n' may be replaced at all: no control edges, not stateful, not an update, not
 * a source. */
bool wf__pass_replaceable(const wf_node *n);

/* True when every dimension of 's' is known. */
bool wf__pass_static(wf_shape s);

/* pass_fold.c: constant folding. Returns 0 or WF_ENOMEM. */
int wf__pass_fold(wf__pass_ctx *c);

/* pass_cse.c: common subexpression elimination. Returns 0 or WF_ENOMEM. */
int wf__pass_cse(wf__pass_ctx *c);

/* pass_simplify.c: algebraic simplification. Returns 0 or WF_ENOMEM. */
int wf__pass_simplify(wf__pass_ctx *c);

/* pass_fuse.c: elementwise fusion: groups of elementwise nodes whose interior values nobody
 * else needs become one fused_elementwise node (ops/fused.h). Returns 0 or WF_ENOMEM. */
int wf__pass_fuse(wf__pass_ctx *c);

/* pass_epilogue.c: GEMM epilogue fusion: matmul -> add(bias row) -> activation (either tail
 * optional) becomes one matmul_epilogue node (ops/table.h). Returns 0 or WF_ENOMEM. */
int wf__pass_epilogue(wf__pass_ctx *c);

/* "epilogue(bias, relu)" for a matmul_epilogue node into 'buf' (the dumps), else "". */
const char *wf__pass_epilogue_desc(const wf_node *n, char *buf, size_t size);

/* pass_optim_fuse.c: optimizer fusion: the update nodes of one optimizer (same update op,
 * step counter, hyperparameters and dtype) become multi-tensor update nodes (grad/update.h).
 * Returns 0 or WF_ENOMEM. */
int wf__pass_optim_fuse(wf__pass_ctx *c);

/* pass_mixed.c: the precision options (WF_SESSION_MIXED_BF16, WF_SESSION_TF32; nothing
 * without them): the GEMM family computed in bf16 between casts, f32 products marked for
 * TF32. Returns 0 or WF_ENOMEM. */
int wf__pass_mixed(wf__pass_ctx *c);

#endif /* WF_RUNTIME_PASSES_H */
