/* fuzz/fuzz_util.h: what the libFuzzer harnesses share: the fuzz input as a file that a
 * decoder can open by path (an anonymous memory file, /proc/self/fd/N: no disk, no clean-up),
 * and splitting one input into two files for the loaders that read a pair. */
#ifndef WF_FUZZ_UTIL_H
#define WF_FUZZ_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

/* A memory file holding 'data[0 .. n)', its path in 'path'. Returns its fd (close it), or
 * aborts: failing here is the harness's fault, not the decoder's. */
static inline int wf_fuzz_file(const uint8_t *data, size_t n, char *path, size_t pathlen)
{
    int fd = memfd_create("wf-fuzz", 0);
    if (fd < 0)
        abort();
    size_t off = 0;
    while (off < n) {
        ssize_t w = write(fd, data + off, n - off);
        if (w <= 0)
            abort();
        off += (size_t)w;
    }
    snprintf(path, pathlen, "/proc/self/fd/%d", fd);
    return fd;
}

/* Splits an input into two parts: its first 4 bytes (little-endian) give the first part's
 * length (clamped to what is left), the second part is the rest. Returns 0, or -1 when the
 * input is shorter than 4 bytes. */
static inline int wf_fuzz_split(const uint8_t *data, size_t n, const uint8_t **a, size_t *na,
                                const uint8_t **b, size_t *nb)
{
    if (n < 4)
        return -1;
    size_t len =
        (size_t)data[0] | (size_t)data[1] << 8 | (size_t)data[2] << 16 | (size_t)data[3] << 24;
    data += 4;
    n -= 4;
    if (len > n)
        len = n;
    *a = data;
    *na = len;
    *b = data + len;
    *nb = n - len;
    return 0;
}

#endif /* WF_FUZZ_UTIL_H */
