/* examples/weft-train/data.h: weft-train's datasets: samples in memory, the loaders that
 * fill them from CSV, MNIST IDX and NumPy .npy files, the train/test split, normalisation
 * and batching.
 * Owns: 'wt_dataset' and the parsing and validation of those three file formats; every
 * loader checks what it reads (counts, sizes against the file's length, numbers, labels)
 * and names the file, the line or byte offset and the problem in 'err'.
 * Not here: the model and the training loop (weft-train.c), the progress bar (progress.h).
 * Program code, not library code: the names carry 'wt_', and statuses are weft's. */
#ifndef WT_DATA_H
#define WT_DATA_H

#include <weft/weft.h>

#include <stddef.h>
#include <stdint.h>

#define WT_MAX_SAMPLE_RANK 4      /* per-sample feature dimensions */
#define WT_MAX_CLASSES     100000 /* a label must be below this */

/* Samples in memory: 'n' rows of 'n_features' float32 features and one int32 label each.
 * Invariant: n_features == dims[0] * ... * dims[rank - 1]; every label is in
 * [0, n_classes); n_classes is the largest label plus one (at least 1 when n > 0). */
typedef struct wt_dataset {
    int64_t n;
    int rank;                         /* of one sample's features: 1..WT_MAX_SAMPLE_RANK */
    int64_t dims[WT_MAX_SAMPLE_RANK]; /* one sample's feature shape, e.g. {64} or {1,28,28} */
    int64_t n_features;               /* product of 'dims' */
    float *x;                         /* n * n_features, row-major, owned */
    int32_t *y;                       /* n, owned */
    int n_classes;
} wt_dataset;

/* Reads a CSV file: on each line the features, then the label, separated by commas; '.gz'
 * files (any gzip file, whatever its name) are decompressed on the fly. A first line none of
 * whose fields is a number is a header and is skipped; blank lines are skipped. Every line
 * must have the same number of columns (at least 2), every feature must parse fully as a
 * finite number and every label must be an integer in [0, WT_MAX_CLASSES). The dataset has
 * rank 1: dims = { columns - 1 }.
 * Returns 0; WF_EIO when the file cannot be opened or read; WF_EFORMAT for malformed
 * content ('err' names the file, the 1-based line and column, and the problem); WF_ENOMEM;
 * WF_EINVAL for NULL arguments.
 * Ownership: on success '*out' owns its arrays (free with wt_dataset_free()); on failure
 * '*out' is zeroed. 'err' (may be NULL when 'errlen' is 0) receives the message. */
int wt_load_csv(const char *path, wt_dataset *out, char *err, size_t errlen);

/* Reads MNIST IDX files, gzip-compressed or not: 'images_path' with magic 0x00000803
 * (unsigned bytes [n, rows, cols]) and 'labels_path' with magic 0x00000801 (unsigned bytes
 * [n]), big-endian headers. The counts must be equal and each file exactly as long as its
 * header says. Pixels are scaled to [0, 1] (divided by 255); dims = { 1, rows, cols }.
 * Returns, Ownership: as wt_load_csv(); 'err' names the file and the byte offset. */
int wt_load_idx(const char *images_path, const char *labels_path, wt_dataset *out, char *err,
                size_t errlen);

/* Reads NumPy .npy files (format versions 1, 2 and 3, gzip-compressed or not): 'x_path'
 * holds '<f4' features of shape [N, ...] (at most WT_MAX_SAMPLE_RANK dimensions after N;
 * [N] means one feature each), 'y_path' holds '<i4' or '<i8' labels of shape [N]. Both need
 * 'fortran_order': False. The header dictionary is parsed strictly: exactly the keys
 * 'descr', 'fortran_order' and 'shape', once each. The data must be exactly as long as the
 * shape says; features must be finite and labels in [0, WT_MAX_CLASSES).
 * Returns, Ownership: as wt_load_csv(); 'err' names the file and the byte offset. */
int wt_load_npy(const char *x_path, const char *y_path, wt_dataset *out, char *err, size_t errlen);

/* Gives 'ds' another per-sample shape with the same number of features (e.g. the digits'
 * {64} as {1, 8, 8} for a convolutional model).
 * Returns 0, or WF_ESHAPE (with 'err') when the product differs or 'rank' is out of range. */
int wt_dataset_reshape(wt_dataset *ds, int rank, const int64_t *dims, char *err, size_t errlen);

/* Passed as 'seed' to wt_split(): no shuffle; the test set is the last rows of 'ds'. */
#define WT_SPLIT_IN_ORDER 0

/* Splits 'ds' into a training set and a test set of round(n * test_fraction) samples. With
 * seed WT_SPLIT_IN_ORDER the test set is the last rows and both keep the file's order;
 * with any other seed the rows are first shuffled by a Fisher-Yates shuffle driven by
 * splitmix64(seed), so the same seed gives the same split on every machine. Every row of
 * 'ds' lands in exactly one of the two. Both keep the shape and 'n_classes' of 'ds'.
 * Returns 0; WF_EINVAL when 'test_fraction' is outside [0, 1) or the training set would be
 * empty; WF_ENOMEM.
 * Ownership: 'ds' is borrowed and unchanged; '*train' and '*test' are owned (free each with
 * wt_dataset_free()); on failure both are zeroed. */
int wt_split(const wt_dataset *ds, double test_fraction, uint64_t seed, wt_dataset *train,
             wt_dataset *test, char *err, size_t errlen);

/* Fills 'perm[0..n)' with a permutation of 0..n-1: the identity for seed WT_SPLIT_IN_ORDER,
 * otherwise the same Fisher-Yates shuffle as wt_split() (a new order per epoch: pass
 * seed + epoch). */
void wt_permutation(int64_t n, uint64_t seed, int64_t *perm);

/* Standardises each feature with the mean and standard deviation (population, f64) of
 * 'train', applied to 'train' and to 'test' (which may be NULL). A feature constant over
 * 'train' is only centred, so it stays finite.
 * Returns 0; WF_EINVAL when 'train' is empty or the two disagree on 'n_features'; WF_ENOMEM. */
int wt_normalize(wt_dataset *train, wt_dataset *test, char *err, size_t errlen);

/* Copies 'count' samples into 'x' (count * n_features floats) and 'y' (count labels, may be
 * NULL): the rows perm[start], ..., perm[start + count - 1], or the rows start, ...,
 * start + count - 1 when 'perm' is NULL.
 * Returns 0, or WF_EINVAL when a row is outside [0, ds->n) or the range outside 'perm'
 * ('perm' must have ds->n entries). */
int wt_batch(const wt_dataset *ds, const int64_t *perm, int64_t start, int64_t count, float *x,
             int32_t *y);

/* Frees the arrays of 'ds' and zeroes it; NULL and a zeroed dataset are no-ops. */
void wt_dataset_free(wt_dataset *ds);

#endif /* WT_DATA_H */
