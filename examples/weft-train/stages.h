/* examples/weft-train/stages.h: a pipeline's placement for a tool's --placement FILE, and
 * the drawing of its stages for --dump-graph (weft-train; train_gpt may share it).
 * The file: one entry a line, "NAME DEVICE": NAME a layer (the tool says which names it has,
 *   e.g. weft-train's "fc1", "conv2") or a node of the graph (its name, as the plan's text
 *   and --dump-graph show them), DEVICE "rank:K/cpu:0" (K below the ranks); blank lines and
 *   lines starting with '#' are skipped. A layer's entry hints every node of the layer, a
 *   node's entry that node (node entries win); nodes no entry names follow their inputs.
 *   Every error names the file and the line.
 * Not here: the strategy (weft/distribute.h), the planner (placement auto). */
#ifndef WT_STAGES_H
#define WT_STAGES_H

#include <weft/weft.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#define WT_PLACE_MAX 256 /* entries of one file */

typedef struct wt_place_ent {
    char name[96];
    char device[64];
    int line;  /* in the file, from 1 */
    bool used; /* taken by a layer (wt_place_file_layer()) */
} wt_place_ent;

typedef struct wt_place_file {
    char path[256];
    int n;
    wt_place_ent ent[WT_PLACE_MAX];
} wt_place_file;

/* Reads 'path' for a pipeline of 'ranks' ranks into '*f'. Returns 0, or WF_EIO (cannot read
 * it), WF_EINVAL (a line that is not "NAME DEVICE", a name given twice, too many entries, a
 * device that is malformed) or WF_ENOTFOUND (a rank that does not exist), with
 * "PATH:LINE: ..." in 'err'. */
int wt_place_file_read(const char *path, int ranks, wt_place_file *f, char *err, size_t errlen);

/* The device of layer 'name' in 'f' (NULL: none), marking its entry used. */
const char *wt_place_file_layer(wt_place_file *f, const char *name);

/* Hints each entry no layer took to the node of 'g' of that name. Returns 0 or WF_ENOTFOUND
 * (no such node: "PATH:LINE: ...", saying which layer names there are: 'layers') or
 * WF_ENOMEM, with the reason in 'err'. */
int wt_place_file_hint_nodes(const wt_place_file *f, const wf_graph *g, wf_place_hints *h,
                             const char *layers, char *err, size_t errlen);

/* Writes a pipeline session's stages as Graphviz DOT: the user's nodes (ids below 'n_user',
 * the graph before the session rewrote it) in one cluster per stage ("stage K: rank:K/cpu:0"),
 * the nodes every stage runs in a cluster of their own, and each value that crosses to
 * another stage as a red dashed edge (a send/recv pair per micro-batch); the title counts
 * the pairs. Returns 0, WF_EINVAL (not a pipeline session) or WF_EIO. */
int wt_stages_dot(const wf_session *s, const wf_graph *g, int n_user, int stages, FILE *f);

#endif /* WT_STAGES_H */
