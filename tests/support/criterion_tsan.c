/* tests/support/criterion_tsan.c: lets Criterion start under ThreadSanitizer.
 * Linked into the test executables only when WF_SANITIZE=thread.
 * Why: Criterion's runner (BoxFort) maps its shared arena with MAP_FIXED at
 * 0x200000000000 + (rand_r() & 0x3fffff) * 16 MiB and gives up after 10 addresses that are
 * already mapped. ThreadSanitizer reserves nearly all of that window (shadow, meta and
 * protected gaps), so the runner aborts with "Could not initialize inheritable arena:
 * Resource temporarily unavailable" (Snaipe/Criterion#274).
 * What: this rand_r(), when called from libcriterion, returns offsets that land in a hole of
 * /proc/self/maps inside that window (ThreadSanitizer protects every range that is not
 * application memory, so a hole there is application memory). Every other caller, weft
 * included, gets the C library's rand_r().
 * Not here: anything about weft. */
#ifndef _GNU_SOURCE
#    define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define BXF_BASE 0x200000000000ull /* BoxFort's 'mmap_base' on 64-bit */
#define BXF_STEP (1ull << 24)      /* its 'mmap_off' */
#define BXF_MASK 0x3fffffull       /* its 'mmap_off_mask' */
#define MIN_HOLE (4ull << 30)

/* Successive calls spread over the hole so that a retry does not land on the same pages. */
static unsigned n_calls;

static int called_from_criterion(void *ret)
{
    Dl_info info;
    return dladdr(ret, &info) && info.dli_fname && strstr(info.dli_fname, "libcriterion");
}

/* Finds a free address for an arena, 16 MiB aligned, in BoxFort's window. */
static int free_slot(uint64_t *out)
{
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f)
        return 0;
    uint64_t lo = BXF_BASE, hi = BXF_BASE + BXF_MASK * BXF_STEP;
    uint64_t prev_end = 0, start, end;
    char line[512];
    int found = 0;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "%lx-%lx", &start, &end) != 2)
            continue;
        uint64_t a = prev_end > lo ? prev_end : lo;
        uint64_t b = start < hi ? start : hi;
        if (b > a && b - a >= MIN_HOLE) {
            uint64_t slot = (uint64_t)(n_calls++ % 32) * (64ull << 20);
            *out = ((a + (1ull << 30)) & ~(BXF_STEP - 1)) + slot;
            found = 1;
            break;
        }
        if (end > prev_end)
            prev_end = end;
    }
    fclose(f);
    return found;
}

__attribute__((visibility("default"))) int rand_r(unsigned *seed)
{
    uint64_t addr;
    if (called_from_criterion(__builtin_return_address(0)) && free_slot(&addr))
        return (int)((addr - BXF_BASE) / BXF_STEP);
    int (*libc_rand_r)(unsigned *) = (int (*)(unsigned *))dlsym(RTLD_NEXT, "rand_r");
    return libc_rand_r(seed);
}
