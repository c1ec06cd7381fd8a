/* examples/weft-train/bundled.h: finds a data file installed with the examples (the digits of
 * weft-train, the text of train_gpt) wherever the install prefix has been moved: beside the
 * running program as <program's dir>/../<datadir>/weft/<name>, so that a prefix copied or
 * moved elsewhere still works, then at the file's path in the source tree (a build-tree run).
 * Owns: the list of paths tried and their order. Not here: reading the file (data.c). */
#ifndef WT_BUNDLED_H
#define WT_BUNDLED_H

#include <stddef.h>

/* Looks for the bundled file 'name': 'override' first when it is not NULL (an environment
 * variable's value), then <dir of /proc/self/exe>/../<datadir>/weft/<name> ('datadir' is the
 * install's data folder relative to its prefix, e.g. "share"; an absolute one is used as it
 * is), then 'source'. On success returns 0 with the path found in out. Otherwise returns -1
 * with out set to 'source' and 'tried' (when not NULL) listing the paths tried, ", "
 * between them, for the caller's message. */
int wt_bundled_find(const char *override, const char *datadir, const char *name, const char *source,
                    char *out, size_t outlen, char *tried, size_t triedlen);

#endif
