/* fuzz/fuzz_dataset.h: what the weft-train loader harnesses share: the check of what a
 * loader returned (examples/weft-train/data.h's invariants, or a message and a zeroed
 * dataset), and a load-check-free of one call of a one-file or two-file loader. */
#ifndef WF_FUZZ_DATASET_H
#define WF_FUZZ_DATASET_H

#include "data.h"
#include "fuzz_util.h"

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

/* A loader of one file (wt_load_csv) and of two (wt_load_idx, wt_load_npy). */
typedef int (*wf_fuzz_load1_fn)(const char *path, wt_dataset *out, char *err, size_t errlen);
typedef int (*wf_fuzz_load2_fn)(const char *a, const char *b, wt_dataset *out, char *err,
                                size_t errlen);

/* Runs 'load' on 'path', checks what it returned, frees it. */
static inline void wf_fuzz_load1(wf_fuzz_load1_fn load, const char *path)
{
    char err[512] = "";
    wt_dataset ds;
    int rc = load(path, &ds, err, sizeof err);
    wf_fuzz_check_dataset(rc, &ds, err);
    wt_dataset_free(&ds);
}

/* Runs 'load' on the files 'a' and 'b', checks what it returned, frees it. */
static inline void wf_fuzz_load2(wf_fuzz_load2_fn load, const char *a, const char *b)
{
    char err[512] = "";
    wt_dataset ds;
    int rc = load(a, b, &ds, err, sizeof err);
    wf_fuzz_check_dataset(rc, &ds, err);
    wt_dataset_free(&ds);
}

/* The body of a two-file loader's target: the input split into two files (wf_fuzz_split). */
static inline int wf_fuzz_two_files(wf_fuzz_load2_fn load, const uint8_t *data, size_t size)
{
    const uint8_t *a, *b;
    size_t na, nb;
    if (wf_fuzz_split(data, size, &a, &na, &b, &nb))
        return 0;
    char pa[64], pb[64];
    int fa = wf_fuzz_file(a, na, pa, sizeof pa);
    int fb = wf_fuzz_file(b, nb, pb, sizeof pb);
    wf_fuzz_load2(load, pa, pb);
    close(fa);
    close(fb);
    return 0;
}

#endif /* WF_FUZZ_DATASET_H */
