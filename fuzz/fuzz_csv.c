/* fuzz/fuzz_csv.c: libFuzzer target for weft-train's CSV loader (wt_load_csv,
 * examples/weft-train/data.c): the input is the file. A loaded dataset must keep the
 * invariants of data.h (labels in [0, n_classes), finite features); a refusal must have a
 * message. */
#include "fuzz_dataset.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[64];
    int fd = wf_fuzz_file(data, size, path, sizeof path);
    wf_fuzz_load1(wt_load_csv, path);
    close(fd);
    return 0;
}
