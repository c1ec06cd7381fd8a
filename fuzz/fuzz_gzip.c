/* fuzz/fuzz_gzip.c: libFuzzer target for the gzip path of weft-train's loaders
 * (examples/weft-train/data.c reads any gzip file, whatever its name, through zlib): the input
 * is one file given to the CSV, the IDX (as images and as labels) and the NPY loaders, so a
 * truncated, concatenated or corrupt gzip stream reaches each. The seeds are gzip files. */
#include "fuzz_dataset.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[64], err[512] = "";
    int fd = wf_fuzz_file(data, size, path, sizeof path);
    wt_dataset ds;
    int rc = wt_load_csv(path, &ds, err, sizeof err);
    wf_fuzz_check_dataset(rc, &ds, err);
    wt_dataset_free(&ds);
    err[0] = '\0';
    rc = wt_load_idx(path, path, &ds, err, sizeof err);
    wf_fuzz_check_dataset(rc, &ds, err);
    wt_dataset_free(&ds);
    err[0] = '\0';
    rc = wt_load_npy(path, path, &ds, err, sizeof err);
    wf_fuzz_check_dataset(rc, &ds, err);
    wt_dataset_free(&ds);
    close(fd);
    return 0;
}
