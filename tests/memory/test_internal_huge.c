/* tests/memory/test_internal_huge.c: memory/huge.c: wf__alloc_huge() gives 2 MiB-aligned,
 * writable memory from 2 MiB on (plain malloc below), and where the kernel's transparent huge
 * pages are in "madvise" or "always" mode its mapping is eligible for them (/proc/self/smaps,
 * "THPeligible: 1": the advice took, whether or not the kernel found free huge pages at that
 * moment); with "never", or a kernel without that field, the check skips. */
#include "../../memory/huge.h"
#include "wf_test.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

TestSuite(memory_huge, .fini = wf_test_fini, .timeout = WF_TEST_TIMEOUT(60));

/* The THPeligible of the mapping of /proc/self/smaps that holds 'p', or -1. */
static long thp_eligible_at(const void *p)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f)
        return -1;
    char line[512];
    bool inside = false;
    long kb = -1;
    uintptr_t a = (uintptr_t)p;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            inside = a >= lo && a < hi;
            continue;
        }
        if (inside && sscanf(line, "THPeligible: %ld", &kb) == 1)
            break;
    }
    fclose(f);
    return kb;
}

static bool thp_possible(void)
{
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    char s[128] = "";
    if (f) {
        if (!fgets(s, sizeof s, f))
            s[0] = 0;
        fclose(f);
    }
    return strstr(s, "[madvise]") || strstr(s, "[always]");
}

Test(memory_huge, large_allocations_are_aligned_to_2_mib_and_writable)
{
    const size_t sizes[] = { 1, 4096, (2u << 20) - 1, 2u << 20, (2u << 20) + 1, 25u << 20 };
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        uint8_t *p = wf__alloc_huge(sizes[i]);
        cr_assert_not_null(p, "%zu bytes", sizes[i]);
        if (sizes[i] >= (2u << 20))
            cr_assert_eq((uintptr_t)p % (2u << 20), 0, "%zu bytes at %p", sizes[i], (void *)p);
        memset(p, 0xab, sizes[i]);
        cr_assert_eq(p[sizes[i] - 1], 0xab);
        free(p);
    }
    /* Advice over a NULL or tiny range is harmless. */
    wf__advise_huge(NULL, 0);
    char small[64];
    wf__advise_huge(small, sizeof small);
}

Test(memory_huge, advised_memory_is_eligible_for_huge_pages_when_the_kernel_allows)
{
    if (!thp_possible())
        cr_skip_test("transparent huge pages are off on this kernel");
    size_t bytes = 8u << 20;
    uint8_t *p = wf__alloc_huge(bytes);
    cr_assert_not_null(p);
    memset(p, 1, bytes);
    long eligible = thp_eligible_at(p + (4u << 20));
    free(p);
    if (eligible < 0)
        cr_skip_test("this kernel's smaps has no THPeligible");
    cr_assert_eq(eligible, 1, "THPeligible of the advised mapping: %ld", eligible);
}
