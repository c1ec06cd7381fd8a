/* fuzz/fuzz_dataset.h: what the weft-train loader harnesses share: the check of what a
 * loader returned (examples/weft-train/data.h's invariants, or a message and a zeroed
 * dataset). */
#ifndef WF_FUZZ_DATASET_H
#define WF_FUZZ_DATASET_H

#include "data.h"

#include <math.h>
#include <stdlib.h>

/* Checks what any loader returned: the dataset's invariants, or a message. */
static inline void wf_fuzz_check_dataset(int rc, const wt_dataset *ds, const char *err)
{
    if (rc != 0) {
        if (!err[0] || ds->x || ds->y || ds->n)
            abort();
        return;
    }
    int64_t nf = 1;
    for (int i = 0; i < ds->rank; i++)
        nf *= ds->dims[i];
    if (ds->rank < 1 || ds->rank > WT_MAX_SAMPLE_RANK || nf != ds->n_features)
        abort();
    for (int64_t i = 0; i < ds->n; i++)
        if (ds->y[i] < 0 || ds->y[i] >= ds->n_classes)
            abort();
    for (int64_t i = 0; i < ds->n * ds->n_features; i++)
        if (!isfinite(ds->x[i]))
            abort();
}

#endif /* WF_FUZZ_DATASET_H */
