/* fuzz/fuzz_npy.c: libFuzzer target for weft-train's NumPy .npy loader (wt_load_npy),
 * examples/weft-train/data.c: the input holds two files, the features file and the labels file
 * (fuzz_util.h's split: a 4-byte little-endian length of the first, then both). */
#include "fuzz_dataset.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *a, *b;
    size_t na, nb;
    if (wf_fuzz_split(data, size, &a, &na, &b, &nb))
        return 0;
    char pa[64], pb[64], err[512] = "";
    int fa = wf_fuzz_file(a, na, pa, sizeof pa);
    int fb = wf_fuzz_file(b, nb, pb, sizeof pb);
    wt_dataset ds;
    int rc = wt_load_npy(pa, pb, &ds, err, sizeof err);
    wf_fuzz_check_dataset(rc, &ds, err);
    wt_dataset_free(&ds);
    close(fa);
    close(fb);
    return 0;
}
