/* fuzz/fuzz_csv.c: libFuzzer target for weft-train's CSV loader (wt_load_csv,
 * examples/weft-train/data.c): the input is the file. A loaded dataset must keep the
 * invariants of data.h (labels in [0, n_classes), finite features); a refusal must have a
 * message. */
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
    close(fd);
    return 0;
}
