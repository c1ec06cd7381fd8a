/* fuzz/fuzz_safetensors.c: libFuzzer target for wf_safetensors_read (runtime/safetensors.c):
 * the input is the whole file; whatever it reads back must be freed without a leak, and a
 * refusal must come with a message. */
#include "fuzz_util.h"

#include <weft/weft.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[64];
    int fd = wf_fuzz_file(data, size, path, sizeof path);
    wf_named_tensor *ts = NULL;
    int n = 0;
    int rc = wf_safetensors_read(path, &ts, &n);
    if (rc == 0) {
        for (int i = 0; i < n; i++)
            if (!ts[i].name || !ts[i].tensor)
                abort();
        wf_safetensors_free(ts, n);
    } else if (ts || n || !wf_last_errmsg()[0]) {
        abort(); /* the contract: NULL and 0 on failure, and a message */
    }
    close(fd);
    return 0;
}
