/* tests/examples/test_train_data.c: weft-train's support library (examples/weft-train/):
 * the bundled digits file, the CSV, MNIST IDX and .npy loaders on files written here (good
 * ones, gzip-compressed ones, and truncated or corrupt variants, each with the message it
 * must give), the split, normalisation and batches, and the progress bar's lines (on memory
 * streams, with a fake clock), and --placement FILE's reader (stages.h: entries, comments,
 * and each bad line named by file and line number; node entries as hints the planner keeps).
 * Not here: weft-train itself (examples/CMakeLists.txt runs it). */
#include "wf_test.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <weft-train/data.h>
#include <weft-train/progress.h>
#include <weft-train/stages.h>
#include <zlib.h>

static char tmpdir[] = "/tmp/wt-data-XXXXXX";
static char err[512];

static void setup(void)
{
    cr_assert_not_null(mkdtemp(tmpdir), "mkdtemp failed");
}

static void teardown(void)
{
    char cmd[64];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    cr_assert_eq(system(cmd), 0);
    wf_test_fini();
}

TestSuite(examples_train_data, .init = setup, .fini = teardown, .timeout = WF_TEST_TIMEOUT(60));

static const char *path_of(const char *name)
{
    static char buf[64][256]; /* a test names fewer files than this */
    static int next;
    cr_assert_lt(next, 64, "path_of: more than 64 paths in one test");
    char *p = buf[next++];
    snprintf(p, 256, "%s/%s", tmpdir, name);
    return p;
}

static const char *write_file(const char *name, const void *data, size_t len)
{
    const char *p = path_of(name);
    FILE *f = fopen(p, "wb");
    cr_assert_not_null(f, "cannot write %s", p);
    cr_assert_eq(fwrite(data, 1, len, f), len);
    cr_assert_eq(fclose(f), 0);
    return p;
}

static const char *write_text(const char *name, const char *text)
{
    return write_file(name, text, strlen(text));
}

static const char *write_gz(const char *name, const void *data, size_t len)
{
    const char *p = path_of(name);
    gzFile f = gzopen(p, "wb");
    cr_assert_not_null(f);
    cr_assert_eq(gzwrite(f, data, (unsigned)len), (int)len);
    cr_assert_eq(gzclose(f), Z_OK);
    return p;
}

/* Loads 'path' as CSV expecting failure 'code' with 'want' in the message. */
static void csv_fails(const char *path, int code, const char *want)
{
    wt_dataset ds;
    int rc = wt_load_csv(path, &ds, err, sizeof err);
    cr_assert_eq(rc, code, "got %s (%s)", wf_err_name(rc), err);
    cr_assert(strstr(err, want), "message '%s' lacks '%s'", err, want);
    cr_assert(strstr(err, path), "message '%s' does not name the file", err);
    cr_assert_null(ds.x);
    cr_assert_eq(ds.n, 0);
}

/* ---- the bundled digits ------------------------------------------------------------------ */

Test(examples_train_data, bundled_digits_load_as_1797_samples_of_64_features_and_10_classes)
{
    wt_dataset ds;
    int rc = wt_load_csv(WT_DIGITS_PATH, &ds, err, sizeof err);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert_eq(ds.n, 1797);
    cr_assert_eq(ds.n_features, 64);
    cr_assert_eq(ds.rank, 1);
    cr_assert_eq(ds.dims[0], 64);
    cr_assert_eq(ds.n_classes, 10);
    /* The first row of the file (data/README.md). */
    static const float first[64] = { 0, 0, 5,  13, 9,  1,  0, 0, 0, 0, 13, 15, 10, 15, 5, 0,
                                     0, 3, 15, 2,  0,  11, 8, 0, 0, 4, 12, 0,  0,  8,  8, 0,
                                     0, 5, 8,  0,  0,  9,  8, 0, 0, 4, 11, 0,  1,  12, 7, 0,
                                     0, 2, 14, 5,  10, 12, 0, 0, 0, 0, 6,  13, 10, 0,  0, 0 };
    cr_assert_arr_eq(ds.x, first, sizeof first);
    cr_assert_eq(ds.y[0], 0);
    cr_assert_eq(ds.y[1], 1);
    cr_assert_eq(ds.y[2], 2);
    int count[10] = { 0 };
    for (int64_t i = 0; i < ds.n; i++) {
        cr_assert(ds.y[i] >= 0 && ds.y[i] < 10, "label %d of row %lld", ds.y[i], (long long)i);
        count[ds.y[i]]++;
    }
    for (int c = 0; c < 10; c++)
        cr_assert(count[c] >= 170 && count[c] <= 190, "class %d has %d samples", c, count[c]);
    for (int64_t i = 0; i < ds.n * ds.n_features; i++)
        cr_assert(ds.x[i] >= 0 && ds.x[i] <= 16 && ds.x[i] == floorf(ds.x[i]));
    int64_t dims[3] = { 1, 8, 8 };
    cr_assert_eq(wt_dataset_reshape(&ds, 3, dims, err, sizeof err), 0, "%s", err);
    cr_assert_eq(ds.rank, 3);
    cr_assert_eq(ds.dims[2], 8);
    wt_dataset_free(&ds);
    cr_assert_null(ds.x);
}

/* ---- CSV ---------------------------------------------------------------------------------- */

Test(examples_train_data, csv_with_header_crlf_and_blank_lines_loads)
{
    const char *p = write_text("h.csv", "a, b ,label\r\n1.5,-2e1,3\r\n\r\n 4 ,5,0\r\n\n");
    wt_dataset ds;
    cr_assert_eq(wt_load_csv(p, &ds, err, sizeof err), 0, "%s", err);
    cr_assert_eq(ds.n, 2);
    cr_assert_eq(ds.n_features, 2);
    cr_assert_eq(ds.n_classes, 4);
    float want[4] = { 1.5f, -20.0f, 4.0f, 5.0f };
    cr_assert_arr_eq(ds.x, want, sizeof want);
    cr_assert_eq(ds.y[0], 3);
    cr_assert_eq(ds.y[1], 0);
    wt_dataset_free(&ds);
}

Test(examples_train_data, gzip_csv_loads_like_the_plain_file_and_last_line_needs_no_newline)
{
    const char *text = "1,2,1\n3,4,0\n5,6,2";
    wt_dataset a, b;
    cr_assert_eq(wt_load_csv(write_text("p.csv", text), &a, err, sizeof err), 0, "%s", err);
    cr_assert_eq(wt_load_csv(write_gz("p.csv.gz", text, strlen(text)), &b, err, sizeof err), 0,
                 "%s", err);
    cr_assert_eq(a.n, 3);
    cr_assert_eq(b.n, 3);
    cr_assert_arr_eq(a.x, b.x, 6 * sizeof(float));
    cr_assert_arr_eq(a.y, b.y, 3 * sizeof(int32_t));
    cr_assert_eq(a.y[2], 2);
    wt_dataset_free(&a);
    wt_dataset_free(&b);
}

Test(examples_train_data, csv_ragged_row_names_its_line_and_the_first_line)
{
    csv_fails(write_text("r.csv", "1,2,0\n3,4,1\n5,1\n"), WF_EFORMAT,
              "line 3: 2 columns, but line 1 has 3");
}

Test(examples_train_data, csv_bad_number_names_line_column_and_text)
{
    csv_fails(write_text("b.csv", "1,2,0\n3,4x,1\n"), WF_EFORMAT,
              "line 2, column 2: '4x' is not a number");
}

Test(examples_train_data, csv_empty_field_is_an_error)
{
    csv_fails(write_text("e.csv", "1,2,0\n3,,1\n"), WF_EFORMAT, "line 2, column 2: empty field");
}

Test(examples_train_data, csv_non_finite_feature_is_an_error)
{
    csv_fails(write_text("n.csv", "1,2,0\n3,nan,1\n"), WF_EFORMAT,
              "line 2, column 2: 'nan' is not a finite number");
    csv_fails(write_text("o.csv", "1e39,2,0\n"), WF_EFORMAT, "outside the float32 range");
}

Test(examples_train_data, csv_negative_or_fractional_label_is_an_error)
{
    csv_fails(write_text("l.csv", "1,2,0\n3,4,-1\n"), WF_EFORMAT,
              "line 2, column 3: label '-1' is not an integer");
    csv_fails(write_text("f.csv", "1,2,2.5\n"), WF_EFORMAT,
              "line 1, column 3: label '2.5' is not an integer");
    csv_fails(write_text("x.csv", "1,2,cat\n"), WF_EFORMAT, "(the last column is the label)");
}

Test(examples_train_data, csv_empty_file_header_only_and_one_column_are_errors)
{
    csv_fails(write_text("empty.csv", ""), WF_EFORMAT, "no data rows (the file is empty)");
    csv_fails(write_text("hdr.csv", "a,b,label\n"), WF_EFORMAT, "no data rows (only a header)");
    csv_fails(write_text("one.csv", "1\n2\n"), WF_EFORMAT, "line 1: 1 column");
    csv_fails(write_text("hw.csv", "a,b\n1,2,3\n"), WF_EFORMAT,
              "line 2: 3 columns, but the header (line 1) has 2");
}

Test(examples_train_data, csv_missing_file_is_eio_naming_it)
{
    csv_fails(path_of("no-such.csv"), WF_EIO, "cannot open: No such file");
}

Test(examples_train_data, truncated_gzip_csv_is_eio)
{
    char text[4096];
    size_t n = 0;
    for (int i = 0; i < 300; i++)
        n += (size_t)snprintf(text + n, sizeof text - n, "%d,%d,%d\n", i, i * 7 % 13, i % 3);
    const char *p = write_gz("t.csv.gz", text, n);
    FILE *f = fopen(p, "rb");
    unsigned char buf[4096];
    size_t len = fread(buf, 1, sizeof buf, f);
    fclose(f);
    cr_assert_gt(len, 40);
    csv_fails(write_file("t2.csv.gz", buf, len / 2), WF_EIO, "truncated");
}

/* ---- MNIST IDX ---------------------------------------------------------------------------- */

static void put_be32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

/* 3 images of 2x4 and their labels 7, 0, 3. */
static size_t idx_images(unsigned char *buf)
{
    put_be32(buf, 0x803);
    put_be32(buf + 4, 3);
    put_be32(buf + 8, 2);
    put_be32(buf + 12, 4);
    for (int i = 0; i < 24; i++)
        buf[16 + i] = (unsigned char)(i * 11);
    return 40;
}

static size_t idx_labels(unsigned char *buf)
{
    put_be32(buf, 0x801);
    put_be32(buf + 4, 3);
    buf[8] = 7;
    buf[9] = 0;
    buf[10] = 3;
    return 11;
}

static void idx_fails(const char *img, const char *lab, const char *want)
{
    wt_dataset ds;
    int rc = wt_load_idx(img, lab, &ds, err, sizeof err);
    cr_assert_eq(rc, WF_EFORMAT, "got %s (%s)", wf_err_name(rc), err);
    cr_assert(strstr(err, want), "message '%s' lacks '%s'", err, want);
    cr_assert_null(ds.x);
}

Test(examples_train_data, idx_raw_and_gzip_load_with_pixels_scaled_to_0_1)
{
    unsigned char im[64], lb[16];
    size_t ni = idx_images(im), nl = idx_labels(lb);
    const char *paths[2][2] = {
        { write_file("i.idx", im, ni), write_file("l.idx", lb, nl) },
        { write_gz("i.idx.gz", im, ni), write_gz("l.idx.gz", lb, nl) },
    };
    for (int k = 0; k < 2; k++) {
        wt_dataset ds;
        cr_assert_eq(wt_load_idx(paths[k][0], paths[k][1], &ds, err, sizeof err), 0, "%s", err);
        cr_assert_eq(ds.n, 3);
        cr_assert_eq(ds.rank, 3);
        cr_assert_eq(ds.dims[0], 1);
        cr_assert_eq(ds.dims[1], 2);
        cr_assert_eq(ds.dims[2], 4);
        cr_assert_eq(ds.n_features, 8);
        cr_assert_eq(ds.n_classes, 8);
        for (int i = 0; i < 24; i++)
            cr_assert_float_eq(ds.x[i], (float)(i * 11) / 255.0f, 1e-6, "pixel %d", i);
        cr_assert_eq(ds.y[0], 7);
        cr_assert_eq(ds.y[2], 3);
        wt_dataset_free(&ds);
    }
}

Test(examples_train_data, idx_wrong_magic_short_file_and_count_mismatch_fail_clearly)
{
    unsigned char im[64], lb[16];
    size_t ni = idx_images(im), nl = idx_labels(lb);
    const char *img = write_file("i.idx", im, ni), *lab = write_file("l.idx", lb, nl);
    /* Images and labels swapped: each magic is the other's. */
    idx_fails(lab, img, "byte 0: magic 0x00000801, expected 0x00000803");
    idx_fails(write_file("short.idx", im, ni - 1), lab,
              "3 images of 2x4 (24 bytes after the 16-byte header) but the file has 23: "
              "truncated");
    idx_fails(write_file("hdr.idx", im, 10), lab, "the header of 3 dimensions needs 16");
    idx_fails(write_file("tiny.idx", im, 2), lab, "too short for an IDX header");
    unsigned char longer[64];
    memcpy(longer, im, ni);
    longer[ni] = 1;
    idx_fails(write_file("long.idx", longer, ni + 1), lab, "trailing bytes");
    put_be32(lb + 4, 2);
    idx_fails(img, write_file("l2.idx", lb, nl - 1), "has 3 images but");
    /* A gzip file cut short is a read error, not a short IDX file. */
    unsigned char big[16 + 4096];
    put_be32(big, 0x803);
    put_be32(big + 4, 16);
    put_be32(big + 8, 16);
    put_be32(big + 12, 16);
    uint64_t s = 1;
    for (size_t i = 16; i < sizeof big; i++)
        big[i] = (unsigned char)wf_test_rand(&s); /* incompressible */
    const char *gz = write_gz("big.idx.gz", big, sizeof big);
    FILE *f = fopen(gz, "rb");
    unsigned char packed[8192];
    size_t np = fread(packed, 1, sizeof packed, f);
    fclose(f);
    wt_dataset ds;
    int rc = wt_load_idx(write_file("cut.idx.gz", packed, np - 100), lab, &ds, err, sizeof err);
    cr_assert_eq(rc, WF_EIO, "got %s (%s)", wf_err_name(rc), err);
    cr_assert(strstr(err, "cut.idx.gz: read failed after"), "%s", err);
    cr_assert(strstr(err, "the gzip stream is truncated"), "%s", err);
    rc = wt_load_idx(img, path_of("none.idx"), &ds, err, sizeof err);
    cr_assert_eq(rc, WF_EIO, "%s", err);
    cr_assert(strstr(err, "none.idx: cannot open"), "%s", err);
}

/* ---- NumPy .npy --------------------------------------------------------------------------- */

/* Writes an .npy file of format 'version' with header dictionary 'dict' (padded as numpy
 * pads it) and 'len' bytes of data. */
static const char *write_npy(const char *name, int version, const char *dict, const void *data,
                             size_t len)
{
    unsigned char buf[4096];
    size_t pre = version == 1 ? 10 : 12, dl = strlen(dict);
    size_t total = (pre + dl + 1 + 63) / 64 * 64;
    size_t hlen = total - pre;
    cr_assert_lt(total + len, sizeof buf);
    memcpy(buf, "\x93NUMPY", 6);
    buf[6] = (unsigned char)version;
    buf[7] = 0;
    buf[8] = (unsigned char)hlen;
    buf[9] = (unsigned char)(hlen >> 8);
    if (version > 1)
        buf[10] = buf[11] = 0;
    memcpy(buf + pre, dict, dl);
    memset(buf + pre + dl, ' ', hlen - dl - 1);
    buf[total - 1] = '\n';
    memcpy(buf + total, data, len);
    return write_file(name, buf, total + len);
}

static const float npy_x[12] = { 0.5f, -1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11.25f };
static const int64_t npy_y8[3] = { 2, 0, 1 };
static const int32_t npy_y4[3] = { 2, 0, 1 };

#define X_DICT "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2, 2), }"
#define Y_DICT "{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }"

static void npy_fails(const char *x, const char *y, const char *want)
{
    wt_dataset ds;
    int rc = wt_load_npy(x, y, &ds, err, sizeof err);
    cr_assert_eq(rc, WF_EFORMAT, "got %s (%s)", wf_err_name(rc), err);
    cr_assert(strstr(err, want), "message '%s' lacks '%s'", err, want);
    cr_assert_null(ds.x);
}

Test(examples_train_data, npy_versions_1_2_3_with_int64_and_int32_labels_load)
{
    for (int v = 1; v <= 3; v++) {
        char xn[16], yn[16];
        snprintf(xn, sizeof xn, "x%d.npy", v);
        snprintf(yn, sizeof yn, "y%d.npy", v);
        const char *x = write_npy(xn, v, X_DICT, npy_x, sizeof npy_x);
        const char *y = v == 2 ? write_npy(yn, v,
                                           "{\"shape\": (3,), \"fortran_order\": False, "
                                           "\"descr\": \"<i4\"}",
                                           npy_y4, sizeof npy_y4)
                               : write_npy(yn, v, Y_DICT, npy_y8, sizeof npy_y8);
        wt_dataset ds;
        cr_assert_eq(wt_load_npy(x, y, &ds, err, sizeof err), 0, "v%d: %s", v, err);
        cr_assert_eq(ds.n, 3);
        cr_assert_eq(ds.rank, 2);
        cr_assert_eq(ds.dims[0], 2);
        cr_assert_eq(ds.dims[1], 2);
        cr_assert_eq(ds.n_features, 4);
        cr_assert_arr_eq(ds.x, npy_x, sizeof npy_x);
        cr_assert_arr_eq(ds.y, npy_y4, sizeof npy_y4);
        cr_assert_eq(ds.n_classes, 3);
        wt_dataset_free(&ds);
    }
    /* [N] features: one each; and a gzip-compressed pair. */
    const char *x1 = write_npy("x1d.npy", 1,
                               "{'descr': '<f4', 'fortran_order': False, "
                               "'shape': (3,), }",
                               npy_x, 12);
    const char *y = write_npy("y.npy", 1, Y_DICT, npy_y8, sizeof npy_y8);
    wt_dataset ds;
    cr_assert_eq(wt_load_npy(x1, y, &ds, err, sizeof err), 0, "%s", err);
    cr_assert_eq(ds.rank, 1);
    cr_assert_eq(ds.dims[0], 1);
    cr_assert_eq(ds.n_features, 1);
    wt_dataset_free(&ds);
    FILE *f = fopen(x1, "rb");
    unsigned char buf[256];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    cr_assert_eq(wt_load_npy(write_gz("x.npy.gz", buf, n), y, &ds, err, sizeof err), 0, "%s", err);
    cr_assert_eq(ds.x[2], 2.0f);
    wt_dataset_free(&ds);
}

Test(examples_train_data, npy_bad_descr_fortran_order_and_shapes_fail_clearly)
{
    const char *x = write_npy("x.npy", 1, X_DICT, npy_x, sizeof npy_x);
    const char *y = write_npy("y.npy", 1, Y_DICT, npy_y8, sizeof npy_y8);
    npy_fails(write_npy("f8.npy", 1,
                        "{'descr': '<f8', 'fortran_order': False, 'shape': (3, 2),"
                        " }",
                        npy_x, sizeof npy_x),
              y, "descr '<f8': features must be little-endian float32 ('<f4')");
    npy_fails(x,
              write_npy("yf.npy", 1,
                        "{'descr': '<f4', 'fortran_order': False, 'shape': (3,)"
                        ", }",
                        npy_y4, sizeof npy_y4),
              "labels must be little-endian int32 or int64");
    npy_fails(write_npy("fo.npy", 1,
                        "{'descr': '<f4', 'fortran_order': True, 'shape': (3, 4), "
                        "}",
                        npy_x, sizeof npy_x),
              y, "fortran_order is True");
    npy_fails(x,
              write_npy("y2.npy", 1,
                        "{'descr': '<i8', 'fortran_order': False, 'shape': (3, 1)"
                        ", }",
                        npy_y8, sizeof npy_y8),
              "shape (3, 1): labels must be [N]");
    npy_fails(x,
              write_npy("y4.npy", 1,
                        "{'descr': '<i4', 'fortran_order': False, 'shape': (2,)"
                        ", }",
                        npy_y4, 8),
              "has 3 samples but");
}

Test(examples_train_data, npy_truncated_or_long_data_fails_with_the_sizes)
{
    const char *y = write_npy("y.npy", 1, Y_DICT, npy_y8, sizeof npy_y8);
    npy_fails(write_npy("xs.npy", 1, X_DICT, npy_x, sizeof npy_x - 1), y,
              "shape (3, 2, 2) of '<f4' needs 48 bytes after the header (byte 128), but the file "
              "has 47: truncated");
    unsigned char more[52] = { 0 };
    memcpy(more, npy_x, sizeof npy_x);
    npy_fails(write_npy("xl.npy", 1, X_DICT, more, sizeof more), y, "has 52: trailing bytes");
    unsigned char hdr[20];
    memcpy(hdr, "\x93NUMPY\x01\x00\x76\x00", 10);
    memcpy(hdr + 10, "{'descr'", 8);
    npy_fails(write_file("xh.npy", hdr, 18), y, "header length 118");
    npy_fails(write_file("xm.npy", "PK\x03\x04 not numpy", 15), y, "not a NumPy .npy file");
    npy_fails(write_npy("xv.npy", 4, X_DICT, npy_x, sizeof npy_x), y, "format version 4.0");
}

Test(examples_train_data, npy_header_dictionary_is_parsed_strictly)
{
    const char *y = write_npy("y.npy", 1, Y_DICT, npy_y8, sizeof npy_y8);

    static const struct {
        const char *dict, *want;
    } bad[] = {
        { "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), 'x': 1}",
          "byte 68, in the header: unknown key 'x'" },
        { "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (3, 4)}",
          "duplicate key" },
        { "{'descr': '<f4', 'shape': (3, 4)}", "the key 'fortran_order' is missing" },
        { "{'descr': '<f4', 'fortran_order': False, 'shape': (12)}", "needs a trailing comma" },
        { "{'descr': '<f4', 'fortran_order': 0, 'shape': (3, 4)}", "must be True or False" },
        { "{'descr': '<f4', 'fortran_order': False, 'shape': (3, -4)}",
          "expected a non-negative integer" },
        { "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4)} x", "text after" },
        { "['descr', '<f4']", "the header is not a dictionary" },
        { "{'descr': '<f4' 'fortran_order': False, 'shape': (3, 4)}", "expected ',' or '}'" },
    };

    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        npy_fails(write_npy("xb.npy", 1, bad[i].dict, npy_x, sizeof npy_x), y, bad[i].want);
}

Test(examples_train_data, npy_non_finite_features_and_negative_labels_fail_naming_the_byte)
{
    const char *x = write_npy("x.npy", 1, X_DICT, npy_x, sizeof npy_x);
    const char *y = write_npy("y.npy", 1, Y_DICT, npy_y8, sizeof npy_y8);
    float xs[12];
    memcpy(xs, npy_x, sizeof xs);
    xs[5] = INFINITY;
    npy_fails(write_npy("xi.npy", 1, X_DICT, xs, sizeof xs), y,
              "byte 148: feature 1 of sample 1 is inf");
    int64_t ys[3] = { 1, -3, 0 };
    npy_fails(x, write_npy("yn.npy", 1, Y_DICT, ys, sizeof ys),
              "byte 136: label -3 of sample 1 is not in");
}

/* ---- split, normalisation, batches -------------------------------------------------------- */

/* 'n' samples of 3 features: feature 0 is the row index, so rows can be traced. */
static wt_dataset counting(int64_t n)
{
    wt_dataset ds = { .n = n, .rank = 1, .dims = { 3 }, .n_features = 3, .n_classes = 5 };
    ds.x = malloc((size_t)n * 3 * sizeof(float));
    ds.y = malloc((size_t)n * sizeof(int32_t));
    cr_assert(ds.x && ds.y);
    uint64_t s = 42;
    for (int64_t i = 0; i < n; i++) {
        ds.x[i * 3] = (float)i;
        ds.x[i * 3 + 1] = (float)(wf_test_rand(&s) % 1000) * 0.01f + 100;
        ds.x[i * 3 + 2] = 7; /* constant */
        ds.y[i] = (int32_t)(i % 5);
    }
    return ds;
}

Test(examples_train_data, split_is_deterministic_disjoint_and_covers_every_row)
{
    wt_dataset ds = counting(101), tr, te, tr2, te2;
    cr_assert_eq(wt_split(&ds, 0.2, 7, &tr, &te, err, sizeof err), 0, "%s", err);
    cr_assert_eq(te.n, 20);
    cr_assert_eq(tr.n, 81);
    cr_assert_eq(tr.n_classes, 5);
    int seen[101] = { 0 };
    bool moved = false;
    for (int64_t i = 0; i < tr.n; i++) {
        int r = (int)tr.x[i * 3];
        seen[r]++;
        moved = moved || r != i;
        cr_assert_eq(tr.y[i], r % 5, "row %d kept its label", r);
        cr_assert_eq(tr.x[i * 3 + 1], ds.x[r * 3 + 1]);
    }
    for (int64_t i = 0; i < te.n; i++)
        seen[(int)te.x[i * 3]]++;
    for (int r = 0; r < 101; r++)
        cr_assert_eq(seen[r], 1, "row %d is in %d sets", r, seen[r]);
    cr_assert(moved, "seed 7 did not shuffle");
    cr_assert_eq(wt_split(&ds, 0.2, 7, &tr2, &te2, err, sizeof err), 0);
    cr_assert_arr_eq(tr.x, tr2.x, (size_t)tr.n * 3 * sizeof(float));
    cr_assert_arr_eq(te.x, te2.x, (size_t)te.n * 3 * sizeof(float));
    wt_dataset_free(&tr2);
    wt_dataset_free(&te2);
    cr_assert_eq(wt_split(&ds, 0.2, 8, &tr2, &te2, err, sizeof err), 0);
    cr_assert(memcmp(tr.x, tr2.x, (size_t)tr.n * 3 * sizeof(float)) != 0, "seed 8 == seed 7");
    wt_dataset_free(&tr2);
    wt_dataset_free(&te2);
    wt_dataset_free(&tr);
    wt_dataset_free(&te);
    wt_dataset_free(&ds);
}

Test(examples_train_data, split_in_order_puts_the_last_rows_in_the_test_set)
{
    wt_dataset ds = counting(10), tr, te;
    cr_assert_eq(wt_split(&ds, 0.25, WT_SPLIT_IN_ORDER, &tr, &te, err, sizeof err), 0);
    cr_assert_eq(tr.n, 7); /* round(2.5) = 3 test rows */
    cr_assert_eq(te.n, 3);
    for (int64_t i = 0; i < 7; i++)
        cr_assert_eq(tr.x[i * 3], (float)i);
    for (int64_t i = 0; i < 3; i++)
        cr_assert_eq(te.x[i * 3], (float)(7 + i));
    wt_dataset_free(&tr);
    wt_dataset_free(&te);
    cr_assert_eq(wt_split(&ds, 0, 3, &tr, &te, err, sizeof err), 0);
    cr_assert_eq(te.n, 0);
    cr_assert_eq(tr.n, 10);
    wt_dataset_free(&tr);
    wt_dataset_free(&te);
    cr_assert_eq(wt_split(&ds, 1.0, 3, &tr, &te, err, sizeof err), WF_EINVAL);
    cr_assert(strstr(err, "test fraction 1 is not in [0, 1)"), "%s", err);
    cr_assert_eq(wt_split(&ds, 0.99, 3, &tr, &te, err, sizeof err), WF_EINVAL);
    cr_assert(strstr(err, "leaves no training sample"), "%s", err);
    cr_assert_null(tr.x);
    wt_dataset_free(&ds);
}

Test(examples_train_data, normalize_gives_train_mean_0_std_1_and_applies_train_stats_to_test)
{
    wt_dataset ds = counting(200), tr, te;
    cr_assert_eq(wt_split(&ds, 0.3, 5, &tr, &te, err, sizeof err), 0);
    /* The reference: train's mean and std in f64, before normalising. */
    double mean[3] = { 0 }, sd[3] = { 0 };
    for (int f = 0; f < 3; f++) {
        for (int64_t i = 0; i < tr.n; i++)
            mean[f] += tr.x[i * 3 + f];
        mean[f] /= (double)tr.n;
        for (int64_t i = 0; i < tr.n; i++)
            sd[f] += (tr.x[i * 3 + f] - mean[f]) * (tr.x[i * 3 + f] - mean[f]);
        sd[f] = sqrt(sd[f] / (double)tr.n);
    }
    float te0 = te.x[0], te1 = te.x[1];
    cr_assert_eq(wt_normalize(&tr, &te, err, sizeof err), 0, "%s", err);
    for (int f = 0; f < 2; f++) {
        double m = 0, v = 0;
        for (int64_t i = 0; i < tr.n; i++)
            m += tr.x[i * 3 + f];
        m /= (double)tr.n;
        for (int64_t i = 0; i < tr.n; i++)
            v += (tr.x[i * 3 + f] - m) * (tr.x[i * 3 + f] - m);
        v /= (double)tr.n;
        cr_assert(fabs(m) < 1e-5, "feature %d: mean %g", f, m);
        cr_assert(fabs(sqrt(v) - 1) < 1e-5, "feature %d: std %g", f, sqrt(v));
    }
    for (int64_t i = 0; i < tr.n; i++)
        cr_assert_eq(tr.x[i * 3 + 2], 0.0f, "a constant feature is only centred");
    cr_assert_float_eq(te.x[0], (te0 - mean[0]) / sd[0], 1e-5);
    cr_assert_float_eq(te.x[1], (te1 - mean[1]) / sd[1], 1e-5);
    wt_dataset_free(&tr);
    wt_dataset_free(&te);
    wt_dataset_free(&ds);
}

Test(examples_train_data, batch_copies_rows_through_the_permutation_and_checks_ranges)
{
    wt_dataset ds = counting(10);
    int64_t perm[10];
    wt_permutation(10, 99, perm);
    int64_t id[10];
    wt_permutation(10, WT_SPLIT_IN_ORDER, id);
    for (int i = 0; i < 10; i++)
        cr_assert_eq(id[i], i);
    float x[4 * 3];
    int32_t y[4];
    cr_assert_eq(wt_batch(&ds, perm, 6, 4, x, y), 0);
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(x[i * 3], (float)perm[6 + i]);
        cr_assert_eq(y[i], (int32_t)(perm[6 + i] % 5));
    }
    cr_assert_eq(wt_batch(&ds, NULL, 2, 3, x, NULL), 0);
    cr_assert_eq(x[0], 2.0f);
    cr_assert_eq(x[6], 4.0f);
    cr_assert_eq(wt_batch(&ds, perm, 7, 4, x, y), WF_EINVAL);
    cr_assert_eq(wt_batch(&ds, NULL, -1, 1, x, y), WF_EINVAL);
    perm[0] = 10;
    cr_assert_eq(wt_batch(&ds, perm, 0, 1, x, y), WF_EINVAL);
    int64_t dims[2] = { 2, 2 };
    cr_assert_eq(wt_dataset_reshape(&ds, 2, dims, err, sizeof err), WF_ESHAPE);
    cr_assert(strstr(err, "3 features per sample cannot be viewed as 4"), "%s", err);
    wt_dataset_free(&ds);
}

/* ---- progress bar ------------------------------------------------------------------------- */

static uint64_t fake_now(void *arg)
{
    return *(uint64_t *)arg;
}

/* Reads what was written to 'f' since the start. */
static char *contents(FILE *f, char **buf)
{
    fflush(f);
    return *buf;
}

Test(examples_train_data, progress_without_a_tty_prints_one_full_line_per_epoch)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    uint64_t t = 5000000000u;
    wt_progress p;
    wt_progress_begin(&p, &(wt_progress_opts){ .out = f, .clock_ns = fake_now, .clock_arg = &t }, 3,
                      10, 1797);
    t += 250000000u;
    wt_progress_update(&p, 500, 0.9, 0.5);
    cr_assert_str_eq(contents(f, &buf), "", "a pipe gets no in-place redraws");
    char line[256];
    wt_progress_format(&p, false, line, sizeof line);
    cr_assert_str_eq(line, "epoch 3/10 [========>                     ] 500/1797  loss 0.9000  "
                           "acc 50.0%  2,000 samples/s  ETA 0:01");
    t += 1000000000u;
    wt_progress_update(&p, 1797, 0.41234, 0.912);
    wt_progress_end(&p);
    cr_assert_str_eq(contents(f, &buf),
                     "epoch 3/10 [==============================] 1797/1797  loss 0.4123  "
                     "acc 91.2%  1,438 samples/s  time 0:01\n");
    fclose(f);
    free(buf);
}

Test(examples_train_data, progress_on_a_tty_redraws_in_place_at_most_10_times_a_second)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    uint64_t t = 0;
    wt_progress p;
    wt_progress_begin(&p,
                      &(wt_progress_opts){ .out = f,
                                           .mode = WT_PROGRESS_TTY,
                                           .width = 100,
                                           .clock_ns = fake_now,
                                           .clock_arg = &t },
                      1, 2, 100);
    for (int i = 1; i <= 100; i++) {
        t += 10000000u; /* 10 ms a step: 1 s in all, so 10 redraws */
        wt_progress_update(&p, i, 1.0 / i, -1);
    }
    int redraws = 0;
    for (const char *c = contents(f, &buf); *c; c++)
        redraws += *c == '\r';
    cr_assert_eq(redraws, 10, "%d redraws:\n%s", redraws, buf);
    cr_assert_null(strchr(buf, '\n'), "no newline before the end");
    cr_assert(strstr(buf, "\repoch 1/2 [>"), "%s", buf);
    cr_assert_null(strstr(buf, "acc"), "a negative accuracy is not shown");
    wt_progress_end_note(&p, "test acc 97.2%");
    const char *last = strrchr(contents(f, &buf), '\r');
    cr_assert_not_null(last);
    cr_assert(strstr(last, "] 100/100  loss 0.0100  100 samples/s  time 0:01  test acc 97.2%"),
              "%s", last);
    cr_assert_eq(buf[strlen(buf) - 1], '\n');
    cr_assert_leq(strlen(last) - 2, 100, "the line fits the width");
    fclose(f);
    free(buf);
}

Test(examples_train_data, progress_drops_the_bar_when_narrow_and_prints_nothing_when_quiet)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    uint64_t t = 0;
    wt_progress p;
    wt_progress_begin(
        &p, &(wt_progress_opts){ .out = f, .width = 40, .clock_ns = fake_now, .clock_arg = &t }, 0,
        0, 50);
    t = 3700000000000u; /* 1:01:40 */
    wt_progress_update(&p, 50, 2, 0.25);
    wt_progress_end(&p);
    cr_assert_str_eq(contents(f, &buf), "50/50  loss 2.0000  acc 25.0%  0.01 samples/s  time "
                                        "1:01:40\n");
    size_t before = strlen(contents(f, &buf));
    wt_progress_begin(
        &p,
        &(wt_progress_opts){
            .out = f, .mode = WT_PROGRESS_TTY, .width = 30, .clock_ns = fake_now, .clock_arg = &t },
        12, 100, 60000);
    t += 1000000000u;
    wt_progress_update(&p, 1234, 0.5, 0.5);
    const char *drawn = contents(f, &buf) + before;
    /* A 30-column terminal gets at most 29 columns, cut after the last whole field. */
    cr_assert_str_eq(drawn, "\repoch 12/100 1234/60000");
    fclose(f);
    free(buf);
    buf = NULL;
    f = open_memstream(&buf, &len);
    wt_progress_begin(&p, &(wt_progress_opts){ .out = f, .quiet = true, .mode = WT_PROGRESS_TTY },
                      1, 1, 10);
    wt_progress_update(&p, 10, 1, 1);
    wt_progress_end(&p);
    cr_assert_str_eq(contents(f, &buf), "", "quiet prints nothing");
    fclose(f);
    free(buf);
}

/* wt_place_file_read() on 'text' for 'ranks' ranks: 'code', and 'want' in the message. */
static void place_fails(const char *text, int ranks, int code, const char *want)
{
    static wt_place_file f;
    const char *p = write_text("p.placement", text);
    int rc = wt_place_file_read(p, ranks, &f, err, sizeof err);
    cr_assert_eq(rc, code, "%s: gave %d: %s", text, rc, err);
    cr_assert(strstr(err, "p.placement") && strstr(err, want), "'%s' lacks '%s'", err, want);
    printf("%s\n", err);
}

Test(examples_train_data, placement_file_reads_entries_and_names_each_bad_line)
{
    static wt_place_file f;
    const char *p =
        write_text("ok.placement", "# the layers\n\nfc1 rank:0/cpu:0\n  fc2\trank:1/cpu:0\n"
                                   "matmul_7 rank:1/cpu:0  # no: a third field\n");
    cr_assert_eq(wt_place_file_read(p, 2, &f, err, sizeof err), WF_EINVAL);
    cr_assert(strstr(err, "ok.placement:5: expected \"NAME DEVICE\""), "%s", err);
    p = write_text("ok2.placement", "# the layers\n\nfc1 rank:0/cpu:0\n  fc2\trank:1/cpu:0\n");
    cr_assert_eq(wt_place_file_read(p, 2, &f, err, sizeof err), 0, "%s", err);
    cr_assert_eq(f.n, 2);
    cr_assert_str_eq(f.ent[1].name, "fc2");
    cr_assert_str_eq(f.ent[1].device, "rank:1/cpu:0");
    cr_assert_eq(f.ent[1].line, 4);
    cr_assert_str_eq(wt_place_file_layer(&f, "fc2"), "rank:1/cpu:0");
    cr_assert(f.ent[1].used && !f.ent[0].used);
    cr_assert_null(wt_place_file_layer(&f, "fc3"));
    place_fails("fc1 rank:0/cpu:0\nfc2\n", 2, WF_EINVAL, "p.placement:2: expected \"NAME DEVICE\"");
    place_fails("fc1 rank:0/cpu:0\nfc2 rank:2/cpu:0\n", 2, WF_ENOTFOUND, "p.placement:2: fc2: ");
    place_fails("fc1 rank:0/cpu:0\nfc2 rank:one\n", 2, WF_EINVAL, "p.placement:2: fc2: ");
    place_fails("fc1 rank:0/cpu:0\nfc1 rank:1/cpu:0\n", 2, WF_EINVAL,
                "p.placement:2: fc1 is placed already on line 1");
    cr_assert_eq(wt_place_file_read(path_of("none.placement"), 2, &f, err, sizeof err), WF_EIO);
    cr_assert(strstr(err, "cannot open it"), "%s", err);
}

/* Node entries become hints the planner keeps: "r1" and "mm2" on rank 1 of a chain
 * mm1 -> r1 -> mm2 (mm1 then on rank 0: stages are not empty); a layer entry a layer took is
 * not looked up as a node; a name no node has fails naming the line. */
Test(examples_train_data, placement_file_node_entries_are_hints)
{
    static wt_place_file f;
    const char *p =
        write_text("n.placement", "fc1 rank:0/cpu:0\nr1 rank:1/cpu:0\nmm2 rank:1/cpu:0\n");
    cr_assert_eq(wt_place_file_read(p, 2, &f, err, sizeof err), 0, "%s", err);
    cr_assert_not_null(wt_place_file_layer(&f, "fc1")); /* a layer's: no node is named fc1 */
    wf_runtime *rt = NULL;
    cr_assert_eq(wf_runtime_create(&rt, &(wf_runtime_opts){ .n_workers = 1 }), 0);
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *w = wf_variable(g, "w", WF_F32, WF_SHAPE(8, 8), wf_init_zeros());
    wf_node *mm1 = wf_matmul(g, wf_placeholder(g, "x", WF_F32, WF_SHAPE(4, 8)), w);
    wf_node *r1 = wf_relu(g, mm1), *mm2 = wf_matmul(g, r1, w);
    cr_assert(mm2 && wf_node_set_name(r1, "r1") == 0 && wf_node_set_name(mm2, "mm2") == 0);
    wf_place_hints *h = NULL;
    cr_assert_eq(wf_place_hints_create(&h), 0);
    cr_assert_eq(wt_place_file_hint_nodes(&f, g, h, "fc1", err, sizeof err), 0, "%s", err);
    wf_cluster *c = NULL;
    cr_assert_eq(wf_cluster_create(&c), 0);
    for (int r = 0; r < 2; r++)
        cr_assert_geq(
            wf_cluster_add_device(c, &(wf_cluster_device){ .rank = r, .kind = WF_PLACE_CPU }), 0);
    wf_plan *plan = NULL;
    cr_assert_eq(wf_plan_create(g, c, &(wf_plan_opts){ .hints = h, .backward_factor = -1 }, &plan),
                 0, "%s", wf_last_errmsg());
    cr_assert_eq(wf_plan_node_stage(plan, mm1), 0);
    cr_assert_eq(wf_plan_node_stage(plan, r1), 1);
    cr_assert_eq(wf_plan_node_stage(plan, mm2), 1);
    wf_plan_destroy(plan);
    p = write_text("m.placement", "fc1 rank:0/cpu:0\nfc2 rank:1/cpu:0\n\nr9 rank:1/cpu:0\n");
    cr_assert_eq(wt_place_file_read(p, 2, &f, err, sizeof err), 0, "%s", err);
    cr_assert_not_null(wt_place_file_layer(&f, "fc1"));
    cr_assert_not_null(wt_place_file_layer(&f, "fc2"));
    cr_assert_eq(wt_place_file_hint_nodes(&f, g, h, "fc1, fc2", err, sizeof err), WF_ENOTFOUND);
    cr_assert(strstr(err, "m.placement:4: no layer or node is named 'r9' (the layers: fc1, fc2"),
              "%s", err);
    wf_cluster_destroy(c);
    wf_place_hints_destroy(h);
    wf_graph_destroy(g);
    wf_runtime_destroy(rt);
}
