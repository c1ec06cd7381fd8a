/* tests/core/test_error.c: the status vocabulary of base.h: wf_strerror() and wf_err_name()
 * for every code of WF_STATUS_MAP, unknown codes, the thread-local message, and
 * wf_version(). */
#include "wf_test.h"

#include <weft/weft.h>

#include <criterion/criterion.h>

#include <pthread.h>
#include <string.h>

TestSuite(core_error, .fini = wf_test_fini, .timeout = 10);

typedef struct status_entry {
    int code;
    const char *name;
    const char *msg;
} status_entry;

static const status_entry entries[] = {
#define X(name, value, msg) { WF_##name, "WF_" #name, msg },
    WF_STATUS_MAP(X)
#undef X
};

#define N_ENTRIES ((int)(sizeof entries / sizeof entries[0]))

Test(core_error, every_status_code_is_negative_and_distinct)
{
    for (int i = 0; i < N_ENTRIES; i++) {
        cr_assert_lt(entries[i].code, 0, "%s is %d", entries[i].name, entries[i].code);
        for (int j = 0; j < i; j++)
            cr_assert_neq(entries[i].code, entries[j].code, "%s and %s share %d", entries[i].name,
                          entries[j].name, entries[i].code);
    }
}

Test(core_error, strerror_gives_the_listed_sentence_for_every_code)
{
    for (int i = 0; i < N_ENTRIES; i++) {
        const char *s = wf_strerror(entries[i].code);
        cr_assert_not_null(s, "%s", entries[i].name);
        cr_assert_str_eq(s, entries[i].msg, "%s", entries[i].name);
        cr_assert_gt(strlen(s), 0, "%s", entries[i].name);
    }
}

Test(core_error, strerror_sentences_are_distinct)
{
    for (int i = 0; i < N_ENTRIES; i++) {
        cr_assert_str_neq(wf_strerror(entries[i].code), wf_strerror(WF_OK), "%s", entries[i].name);
        for (int j = 0; j < i; j++)
            cr_assert_str_neq(wf_strerror(entries[i].code), wf_strerror(entries[j].code),
                              "%s and %s", entries[i].name, entries[j].name);
    }
}

Test(core_error, err_name_gives_the_enum_name_for_every_code)
{
    cr_assert_str_eq(wf_err_name(WF_OK), "WF_OK");
    for (int i = 0; i < N_ENTRIES; i++)
        cr_assert_str_eq(wf_err_name(entries[i].code), entries[i].name);
}

Test(core_error, err_names_are_distinct)
{
    for (int i = 0; i < N_ENTRIES; i++)
        for (int j = 0; j < i; j++)
            cr_assert_str_neq(wf_err_name(entries[i].code), wf_err_name(entries[j].code));
}

Test(core_error, unknown_codes_give_unknown_error_and_wf_unknown)
{
    const int unknown[] = { -9999, -(N_ENTRIES + 1), 1, 42, -2147483647 - 1, 2147483647 };
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        cr_assert_str_eq(wf_strerror(unknown[i]), "unknown error", "code %d", unknown[i]);
        cr_assert_str_eq(wf_err_name(unknown[i]), "WF_UNKNOWN", "code %d", unknown[i]);
    }
}

Test(core_error, version_matches_the_header)
{
    cr_assert_eq(wf_version(), WF_VERSION_HEX, "library 0x%06x, header 0x%06x", wf_version(),
                 WF_VERSION_HEX);
}

static void *read_errmsg(void *arg)
{
    const char *msg = wf_last_errmsg();
    *(int *)arg = msg != NULL && msg[0] == '\0';
    return NULL;
}

Test(core_error, last_errmsg_is_empty_on_a_fresh_thread)
{
    int empty = 0;
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, read_errmsg, &empty), 0);
    pthread_join(t, NULL);
    cr_assert(empty, "wf_last_errmsg() on a new thread is not \"\"");
}
