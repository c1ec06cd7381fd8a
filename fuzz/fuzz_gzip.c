/* fuzz/fuzz_gzip.c: libFuzzer target for the gzip path of weft-train's loaders
 * (examples/weft-train/data.c reads any gzip file, whatever its name, through zlib): the input
 * is one file given to the CSV, the IDX (as images and as labels) and the NPY loaders, so a
 * truncated, concatenated or corrupt gzip stream reaches each. The seeds are gzip files. */
#include "fuzz_dataset.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[64];
    int fd = wf_fuzz_file(data, size, path, sizeof path);
    wf_fuzz_load1(wt_load_csv, path);
    wf_fuzz_load2(wt_load_idx, path, path);
    wf_fuzz_load2(wt_load_npy, path, path);
    close(fd);
    return 0;
}
