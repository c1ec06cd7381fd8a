/* fuzz/fuzz_npy.c: libFuzzer target for weft-train's NumPy .npy loader (wt_load_npy),
 * examples/weft-train/data.c: the input holds two files, the features file and the labels file
 * (fuzz_util.h's split: a 4-byte little-endian length of the first, then both). */
#include "fuzz_dataset.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    return wf_fuzz_two_files(wt_load_npy, data, size);
}
