/* tests/runtime/test_internal_safetensors.c: the safetensors parser and writer from inside
 * runtime/ (runtime/safetensors.h): JSON whitespace, every escape (\uXXXX and surrogate
 * pairs included) decoded; the byte offset of a syntax error in its message; int64 bounds;
 * zero-size entries that overlap nothing; deep nesting refused without recursion; thousands
 * of entries found by name; the writer's layout (padding, alignment, order); and the atomic
 * write failing at each of its file-system steps through the 'fail_at' hook, which leaves
 * the old file (or, after the rename, the complete new one) and never a temporary file. */
#include "../../runtime/safetensors.h"
#include "wf_test.h"

#include <weft/weft.h>

#include <criterion/criterion.h>

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char dir[64];

static void setup(void)
{
    snprintf(dir, sizeof dir, "/tmp/wf-st-XXXXXX");
    cr_assert_not_null(mkdtemp(dir), "mkdtemp: %s", strerror(errno));
}

static void teardown(void)
{
    wf_test_rm_dir(dir);
    wf_test_fini();
}

TestSuite(runtime_internal_safetensors, .init = setup, .fini = teardown,
          .timeout = WF_TEST_TIMEOUT(60));

static int parse(const char *json, uint64_t data_size, wf__st_header *h)
{
    return wf__st_parse(json, strlen(json), data_size, "checkpoint 't'", h);
}

Test(runtime_internal_safetensors, parse_accepts_json_whitespace_escapes_and_unicode)
{
    const char *json = "{ \t\r\n\"__metadata__\" : { \"format\" : \"pt\" , \"k\\n\" : \"v\\u00e9\" "
                       "} ,\n  \"a\\\"b\\\\c\\/d\\b\\f\\n\\r\\t\\u00e9\\ud83d\\ude00\" :\n"
                       "{ \"shape\" : [ 2 , 3 ] , \"data_offsets\" : [ 0 , 24 ] , \"dtype\" : "
                       "\"F32\" } , \"s\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[24,"
                       "32]} }        ";
    wf__st_header h;
    int rc = parse(json, 32, &h);
    cr_assert_eq(rc, 0, "%s", wf_last_errmsg());
    cr_assert_eq(h.n, 2);
    cr_assert_str_eq(h.entries[0].name,
                     "a\"b\\c/d\b\f\n\r\t\xc3\xa9\xf0\x9f\x98\x80"); /* U+00E9, U+1F600 */
    cr_assert_eq(h.entries[0].dtype, WF_F32);
    cr_assert_eq(h.entries[0].shape.rank, 2);
    cr_assert_eq(h.entries[0].shape.dims[1], 3);
    cr_assert_eq(h.entries[0].end, 24);
    cr_assert_eq(h.entries[1].shape.rank, 0);
    cr_assert_eq(h.entries[1].dtype, WF_I64);
    cr_assert_eq(h.n_meta, 2);
    cr_assert_str_eq(h.meta[0], "format");
    cr_assert_str_eq(h.meta[1], "pt");
    cr_assert_str_eq(h.meta[2], "k\n");
    cr_assert_str_eq(h.meta[3], "v\xc3\xa9");
    cr_assert_eq(wf__st_find(&h, "s"), 1);
    cr_assert_eq(wf__st_find(&h, "a\"b\\c/d\b\f\n\r\t\xc3\xa9\xf0\x9f\x98\x80"), 0);
    cr_assert_eq(wf__st_find(&h, "__metadata__"), -1);
    cr_assert_eq(wf__st_find(&h, "t"), -1);
    wf__st_header_free(&h);
    wf__st_header_free(&h); /* emptied: a no-op */

    cr_assert_eq(parse("{}", 0, &h), 0, "%s", wf_last_errmsg());
    cr_assert_eq(h.n, 0);
    wf__st_header_free(&h);
    cr_assert_eq(parse("{\"__metadata__\":{}}", 5, &h), 0, "%s", wf_last_errmsg());
    cr_assert_eq(h.n_meta, 0);
    wf__st_header_free(&h);
}

Test(runtime_internal_safetensors, syntax_errors_name_their_byte_offset)
{
    wf__st_header h;
    cr_assert_eq(parse("{\"a\":{\"dtype\" \"F32\"}}", 0, &h), WF_EFORMAT);
    cr_assert(strstr(wf_last_errmsg(), "checkpoint 't': header is not valid JSON: byte 14: "
                                       "expected ':' after a key, found '\"'"),
              "%s", wf_last_errmsg());
    cr_assert_eq(h.n, 0);
    cr_assert_null(h.entries);
    cr_assert_eq(parse("{} \x01", 0, &h), WF_EFORMAT);
    cr_assert(strstr(wf_last_errmsg(), "byte 3: byte 0x01 after the header's closing '}'"), "%s",
              wf_last_errmsg());
    /* The error after a good entry frees it (no leak under ASan). */
    cr_assert_eq(parse("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},", 1, &h),
                 WF_EFORMAT);
    cr_assert(strstr(wf_last_errmsg(), "found the end of the header"), "%s", wf_last_errmsg());
}

Test(runtime_internal_safetensors, integers_span_int64_and_no_further)
{
    wf__st_header h;
    /* INT64_MAX parses (and then cannot be a size). */
    cr_assert_eq(parse("{\"a\":{\"dtype\":\"U8\",\"shape\":[9223372036854775807],"
                       "\"data_offsets\":[0,1]}}",
                       1, &h),
                 WF_EFORMAT);
    cr_assert(strstr(wf_last_errmsg(), "needs 9223372036854775807"), "%s", wf_last_errmsg());
    cr_assert_eq(parse("{\"a\":{\"dtype\":\"U8\",\"shape\":[9223372036854775808],"
                       "\"data_offsets\":[0,1]}}",
                       1, &h),
                 WF_EFORMAT);
    cr_assert(strstr(wf_last_errmsg(), "out of the range of int64"), "%s", wf_last_errmsg());
    cr_assert_eq(parse("{\"a\":{\"dtype\":\"U8\",\"shape\":[-9223372036854775808],"
                       "\"data_offsets\":[0,1]}}",
                       1, &h),
                 WF_EFORMAT);
    cr_assert(strstr(wf_last_errmsg(), "negative dimension"), "%s", wf_last_errmsg());
    cr_assert_eq(parse("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[-1,0]}}", 1, &h),
                 WF_EFORMAT);
    cr_assert(strstr(wf_last_errmsg(), "[-1, 0] is not a range"), "%s", wf_last_errmsg());
    cr_assert_eq(parse("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,-]}}", 1, &h),
                 WF_EFORMAT);
    cr_assert(strstr(wf_last_errmsg(), "expected an integer"), "%s", wf_last_errmsg());
    cr_assert_eq(parse("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,+1]}}", 1, &h),
                 WF_EFORMAT);
}

Test(runtime_internal_safetensors, zero_size_entries_overlap_nothing_and_gaps_are_allowed)
{
    wf__st_header h;
    /* 'e' is empty at an offset inside 'a'; 'b' starts after a gap; the data section is
     * longer than what the entries use. */
    const char *json = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                       "\"e\":{\"dtype\":\"F64\",\"shape\":[3,0],\"data_offsets\":[4,4]},"
                       "\"b\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[12,16]}}";
    cr_assert_eq(parse(json, 40, &h), 0, "%s", wf_last_errmsg());
    cr_assert_eq(h.n, 3);
    wf__st_header_free(&h);
    /* Overlap with an entry that is not the previous one by start: [0, 100) holds [50, 60). */
    json = "{\"a\":{\"dtype\":\"U8\",\"shape\":[100],\"data_offsets\":[0,100]},"
           "\"b\":{\"dtype\":\"U8\",\"shape\":[10],\"data_offsets\":[10,20]},"
           "\"c\":{\"dtype\":\"U8\",\"shape\":[10],\"data_offsets\":[50,60]}}";
    cr_assert_eq(parse(json, 100, &h), WF_EFORMAT);
    cr_assert(strstr(wf_last_errmsg(), "overlap those of tensor 'a' [0, 100]"), "%s",
              wf_last_errmsg());
}

Test(runtime_internal_safetensors, deep_nesting_is_refused_without_recursion)
{
    size_t n = 1 << 20;
    char *json = malloc(n + 16);
    strcpy(json, "{\"a\":");
    memset(json + 5, '{', n);
    json[5 + n] = '\0';
    wf__st_header h;
    cr_assert_eq(wf__st_parse(json, strlen(json), 0, "checkpoint 't'", &h), WF_EFORMAT);
    cr_assert(strstr(wf_last_errmsg(), "expected a string, found '{'"), "%s", wf_last_errmsg());
    strcpy(json, "{\"a\":{\"shape\":");
    memset(json + 14, '[', n);
    json[14 + n] = '\0';
    cr_assert_eq(wf__st_parse(json, strlen(json), 0, "checkpoint 't'", &h), WF_EFORMAT);
    cr_assert(strstr(wf_last_errmsg(), "expected an integer, found '['"), "%s", wf_last_errmsg());
    free(json);
}

Test(runtime_internal_safetensors, thousands_of_entries_are_found_by_name_and_duplicates_caught)
{
    int n = 5000;
    char *json = malloc((size_t)n * 96 + 16), *q = json;
    q += sprintf(q, "{");
    for (int i = 0; i < n; i++)
        q +=
            sprintf(q, "%s\"layer%d.w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[%d,%d]}",
                    i ? "," : "", (i * 7919) % n, 8 * i, 8 * i + 8);
    strcpy(q, "}");
    wf__st_header h;
    /* (i * 7919) % n repeats names when gcd(7919, n) > 1; 7919 is prime, so all differ. */
    cr_assert_eq(wf__st_parse(json, strlen(json), (uint64_t)n * 8, "checkpoint 't'", &h), 0, "%s",
                 wf_last_errmsg());
    char name[32];
    for (int k = 0; k < n; k++) {
        snprintf(name, sizeof name, "layer%d.w", k);
        int i = wf__st_find(&h, name);
        cr_assert_geq(i, 0, "%s", name);
        cr_assert_str_eq(h.entries[i].name, name);
    }
    wf__st_header_free(&h);
    /* Two entries of one name, far apart. */
    q = json + 1;
    for (int i = 0; i < n; i++)
        q +=
            sprintf(q, "%s\"layer%d.w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[%d,%d]}",
                    i ? "," : "", i == n - 1 ? 17 : i, 8 * i, 8 * i + 8);
    strcpy(q, "}");
    cr_assert_eq(wf__st_parse(json, strlen(json), (uint64_t)n * 8, "checkpoint 't'", &h),
                 WF_EFORMAT);
    cr_assert(strstr(wf_last_errmsg(), "tensor 'layer17.w': appears twice"), "%s",
              wf_last_errmsg());
    free(json);
}

/* ---- the writer ------------------------------------------------------------------------------ */

static unsigned char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = malloc((size_t)size + 1);
    cr_assert_eq(fread(buf, 1, (size_t)size, f), (size_t)size);
    fclose(f);
    *n = (size_t)size;
    return buf;
}

static int temp_count(void)
{
    DIR *dp = opendir(dir);
    int n = 0;
    struct dirent *de;
    while ((de = readdir(dp)))
        n += strstr(de->d_name, ".tmp.") != NULL;
    closedir(dp);
    return n;
}

Test(runtime_internal_safetensors, writer_pads_the_header_and_aligns_data_by_element_size)
{
    char p[256];
    snprintf(p, sizeof p, "%s/layout.safetensors", dir);
    wf_tensor *u8 = wf_tensor_from(WF_U8, WF_SHAPE(3), (uint8_t[]){ 1, 2, 3 });
    wf_tensor *h16 = wf_tensor_from(WF_F16, WF_SHAPE(1), (uint16_t[]){ 0x3c00 });
    wf_tensor *f64 = wf_tensor_from(WF_F64, WF_SHAPE(2), (double[]){ 1, 2 });
    wf_tensor *i32 = wf_tensor_from(WF_I32, WF_SHAPE(1), (int32_t[]){ 7 });
    wf_named_tensor ts[] = { { "u8", u8 }, { "h16", h16 }, { "f64", f64 }, { "i32", i32 } };
    const char *meta[] = { "k\"ey", "v\\al" };
    cr_assert_eq(wf__st_write(p, ts, 4, meta, 1, 0), 0, "%s", wf_last_errmsg());
    size_t n;
    unsigned char *buf = slurp(p, &n);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--)
        hl = hl << 8 | buf[i];
    cr_assert_eq(hl % 8, 0);
    cr_assert_eq(n, 8 + hl + 16 + 4 + 2 + 3);
    cr_assert_eq(buf[8 + hl - 1], ' ', "padding is spaces");
    wf__st_file f;
    cr_assert_eq(wf__st_open(p, &f), 0, "%s", wf_last_errmsg());
    const char *order[] = { "f64", "i32", "h16", "u8" }; /* by element size, then given order */
    for (int i = 0; i < 4; i++) {
        const wf__st_entry *e = &f.header.entries[i];
        cr_assert_str_eq(e->name, order[i]);
        cr_assert_eq(e->begin % wf_dtype_size(e->dtype), 0, "%s misaligned", e->name);
        wf_tensor *t;
        cr_assert_eq(wf__st_load(&f, i, &t), 0, "%s", wf_last_errmsg());
        wf_tensor *want = ts[i == 0 ? 2 : i == 1 ? 3 : i == 2 ? 1 : 0].tensor;
        cr_assert_arr_eq(wf_tensor_data(t), wf_tensor_data(want),
                         (size_t)wf_tensor_numel(want) * wf_dtype_size(wf_tensor_dtype(want)));
        wf_tensor_release(t);
    }
    cr_assert_eq(f.header.n_meta, 1);
    cr_assert_str_eq(f.header.meta[0], "k\"ey");
    cr_assert_str_eq(f.header.meta[1], "v\\al");
    wf__st_close(&f);
    free(buf);
    wf_tensor *list[] = { u8, h16, f64, i32 };
    for (int i = 0; i < 4; i++)
        wf_tensor_release(list[i]);
}

Test(runtime_internal_safetensors, a_write_failing_at_each_step_leaves_the_old_file_or_the_new)
{
    char p[256], ref[256];
    snprintf(p, sizeof p, "%s/ckpt.safetensors", dir);
    snprintf(ref, sizeof ref, "%s/ref.safetensors", dir);
    wf_tensor *a = wf_tensor_from(WF_F32, WF_SHAPE(2), (float[]){ 1, 2 });
    wf_tensor *b = wf_tensor_from(WF_I64, WF_SHAPE(3), (int64_t[]){ 3, 4, 5 });
    wf_tensor *e = wf_tensor_from(WF_F32, WF_SHAPE(0), NULL);
    wf_tensor *a2 = wf_tensor_from(WF_F32, WF_SHAPE(2), (float[]){ 9, 8 });
    wf_named_tensor old_ts[] = { { "a", a }, { "b", b } };
    wf_named_tensor new_ts[] = { { "a", a2 }, { "b", b }, { "e", e } };
    cr_assert_eq(wf__st_write(p, old_ts, 2, NULL, 0, 0), 0, "%s", wf_last_errmsg());
    cr_assert_eq(wf__st_write(ref, new_ts, 3, NULL, 0, 0), 0, "%s", wf_last_errmsg());
    size_t n_old, n_new;
    unsigned char *old = slurp(p, &n_old), *new_ = slurp(ref, &n_new);

    /* Steps: create, write length, write header, write a, write b (e is empty: no write),
     * fsync, close, rename, open directory, fsync directory. */
    int k, before_rename = 0, after_rename = 0;
    for (k = 1; k < 100; k++) {
        int rc = wf__st_write(p, new_ts, 3, NULL, 0, k);
        if (rc == 0)
            break;
        cr_assert_eq(rc, WF_EIO, "step %d: %s", k, wf_err_name(rc));
        cr_assert(strstr(wf_last_errmsg(), "(injected by the test hook)"), "step %d: %s", k,
                  wf_last_errmsg());
        size_t n;
        unsigned char *now = slurp(p, &n);
        cr_assert_not_null(now, "step %d: the file is gone", k);
        if (strstr(wf_last_errmsg(), "the new file is in place")) {
            after_rename++;
            cr_assert(n == n_new && memcmp(now, new_, n) == 0, "step %d: not the new file", k);
            /* Put the old file back for the next step. */
            FILE *f = fopen(p, "wb");
            fwrite(old, 1, n_old, f);
            fclose(f);
        } else {
            before_rename++;
            cr_assert(n == n_old && memcmp(now, old, n) == 0, "step %d: the old file changed: %s",
                      k, wf_last_errmsg());
        }
        free(now);
        cr_assert_eq(temp_count(), 0, "step %d left a temporary file", k);
    }
    cr_assert_eq(k, 11, "the write has %d steps, not 10", k - 1);
    cr_assert_eq(before_rename, 8);
    cr_assert_eq(after_rename, 2);
    size_t n;
    unsigned char *now = slurp(p, &n);
    cr_assert(n == n_new && memcmp(now, new_, n) == 0);
    free(now);
    free(old);
    free(new_);
    wf_tensor *list[] = { a, b, e, a2 };
    for (int i = 0; i < 4; i++)
        wf_tensor_release(list[i]);
}

Test(runtime_internal_safetensors, a_stale_temporary_of_the_same_name_is_replaced)
{
    char p[256], tmp[300];
    snprintf(p, sizeof p, "%s/stale.safetensors", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld.%ld", p, (long)getpid(), (long)gettid());
    FILE *f = fopen(tmp, "wb");
    fputs("left by a crash", f);
    fclose(f);
    wf_tensor *a = wf_tensor_from(WF_F32, WF_SHAPE(1), (float[]){ 1 });
    wf_named_tensor ts[] = { { "a", a } };
    cr_assert_eq(wf__st_write(p, ts, 1, NULL, 0, 0), 0, "%s", wf_last_errmsg());
    cr_assert_eq(temp_count(), 0);
    wf__st_file sf;
    cr_assert_eq(wf__st_open(p, &sf), 0, "%s", wf_last_errmsg());
    wf__st_close(&sf);
    wf_tensor_release(a);
}

/* Random damage to a valid header (bytes replaced, inserted, removed; seeded): the parser
 * either refuses it with WF_EFORMAT or accepts a header that keeps the invariant of
 * runtime/safetensors.h; under AddressSanitizer nothing is read out of bounds. */
Test(runtime_internal_safetensors, randomly_damaged_headers_are_refused_or_valid)
{
    const char *good = "{\"__metadata__\":{\"format\":\"pt\"},"
                       "\"fc1.weight\":{\"dtype\":\"F32\",\"shape\":[4,3],\"data_offsets\":[0,48]},"
                       "\"fc1.bias\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[48,56]},"
                       "\"caf\\u00e9\\ud83d\\ude00\":{\"dtype\":\"BOOL\",\"shape\":[],"
                       "\"data_offsets\":[56,57]}}   ";
    const char alphabet[] = "{}[]\":,\\u0123456789-.eE dtypeshapeF32I64BOOL\xff\xc3\x01";
    size_t len = strlen(good);
    char *buf = malloc(len + 64);
    uint64_t seed = 42;
    long iters = wf_test_scaled(20000, 2000), accepted = 0;
    for (long it = 0; it < iters; it++) {
        memcpy(buf, good, len);
        size_t n = len;
        int edits = 1 + (int)wf_test_rand_below(&seed, 3);
        for (int k = 0; k < edits; k++) {
            size_t at = wf_test_rand_below(&seed, n);
            char c = alphabet[wf_test_rand_below(&seed, sizeof alphabet - 1)];
            switch (wf_test_rand_below(&seed, 3)) {
            case 0:
                buf[at] = c;
                break;
            case 1:
                memmove(buf + at + 1, buf + at, n - at);
                buf[at] = c;
                n++;
                break;
            default:
                memmove(buf + at, buf + at + 1, n - at - 1);
                n--;
                break;
            }
        }
        wf__st_header h;
        int rc = wf__st_parse(buf, n, 57, "checkpoint 'fuzz'", &h);
        cr_assert(rc == 0 || rc == WF_EFORMAT, "iteration %ld: %s", it, wf_err_name(rc));
        if (rc < 0) {
            cr_assert(strncmp(wf_last_errmsg(), "checkpoint 'fuzz': ", 19) == 0, "%s",
                      wf_last_errmsg());
            continue;
        }
        accepted++;
        for (int i = 0; i < h.n; i++) {
            const wf__st_entry *e = &h.entries[i];
            cr_assert(e->begin <= e->end && e->end <= 57);
            cr_assert_eq(e->end - e->begin,
                         (uint64_t)wf_shape_numel(e->shape) * wf_dtype_size(e->dtype));
            cr_assert_eq(wf__st_find(&h, e->name), i);
        }
        wf__st_header_free(&h);
    }
    cr_assert_gt(accepted, 0, "no damaged header was still valid (whitespace edits are)");
    free(buf);
}
