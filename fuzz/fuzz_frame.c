/* fuzz/fuzz_frame.c: libFuzzer target for the transport's control-plane decoders
 * (transport/frame.c): the input is a byte stream as a peer would send it, cut into frames by
 * wf__frame_parse() the way the net thread does (also in two pieces, to exercise the
 * "need more bytes" path); every HELLO payload goes through wf__hello_decode() against a job
 * of 4 ranks with the token "secret". What a parse reports must lie inside the input. */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

static void check_hello(const wf__frame *f)
{
    wf__hello h;
    char err[160];
    err[0] = '\0';
    int rc = wf__hello_decode(f->payload, f->len, 4, "secret", &h, err, sizeof err);
    if (rc == 0) {
        if (h.rank >= 4 || h.size != 4 || strcmp(h.token, "secret") || !h.addr_len ||
            h.addr < f->payload || h.addr + h.addr_len > f->payload + f->len)
            abort();
    } else if ((rc != WF_EFORMAT && rc != WF_EPEER) || !err[0]) {
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    size_t off = 0;
    char err[160];
    while (off < size) {
        wf__frame f;
        size_t used = 0;
        err[0] = '\0';
        /* First with half of what is left (a short read), then with all of it. */
        size_t half = (size - off) / 2;
        int rc = wf__frame_parse(data + off, half, &f, &used, err, sizeof err);
        if (rc == 1 && (used > half || used < WF__FRAME_HDR))
            abort();
        rc = wf__frame_parse(data + off, size - off, &f, &used, err, sizeof err);
        if (rc < 0) {
            if (!err[0])
                abort();
            return 0;
        }
        if (rc == 0)
            return 0; /* more bytes needed */
        if (used > size - off || f.len > wf__frame_cap(f.type) ||
            f.payload + f.len > data + off + used)
            abort();
        if (f.type == WF__F_HELLO)
            check_hello(&f);
        off += used;
    }
    return 0;
}
