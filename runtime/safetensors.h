/* runtime/safetensors.h: the safetensors file format, as runtime/ reads and writes it
 * (module-internal: not installed, used by checkpoint.c, safetensors.c and
 * tests/runtime/test_internal_safetensors.c).
 * Owns: the validated view of a file's header (wf__st_header: its tensor entries and its
 *   "__metadata__" strings), opening a file and validating it whole (wf__st_open), reading one
 *   entry into a new tensor (wf__st_load), and the atomic writer (wf__st_write).
 * The format (https://github.com/huggingface/safetensors): an 8-byte little-endian header
 *   length N, N bytes of UTF-8 JSON
 *     {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
 *      "__metadata__": {"key": "value", ...}}
 *   padded with spaces, then the data section: raw little-endian row-major elements; the
 *   offsets are relative to the data section.
 * Invariants: a wf__st_header that wf__st_parse() returned is fully validated: every entry has
 *   a known dtype, a shape of rank <= WF_MAX_RANK with dimensions >= 0, begin <= end <= the
 *   data section's size, end - begin == numel * dtype size (no overflow), no two entries
 *   overlap, names are distinct, valid UTF-8 and free of NUL bytes.
 * Hosts: little-endian only (x86-64, AArch64, RISC-V); on a big-endian host wf__st_open() and
 *   wf__st_write() return WF_ENOSYS instead of swapping bytes.
 * Not here: which tensors a session saves and how they are assigned (checkpoint.c); the public
 *   contract (weft/runtime.h, "Checkpoints"). */
#ifndef WF_RUNTIME_SAFETENSORS_H
#define WF_RUNTIME_SAFETENSORS_H

#include <weft/core.h>
#include <weft/runtime.h>

#include <stddef.h>
#include <stdint.h>

/* The largest header accepted (the JSON, in bytes): a cap against a hostile length field,
 * as in the Rust implementation (100 MB, 100,000,000 bytes). */
#define WF__ST_MAX_HEADER 100000000ull

/* One tensor of a header. */
typedef struct wf__st_entry {
    char *name; /* UTF-8, NUL-terminated, no NUL inside */
    wf_dtype dtype;
    wf_shape shape;
    uint64_t begin, end; /* data_offsets: bytes [begin, end) of the data section */
} wf__st_entry;

/* A parsed and validated header. */
typedef struct wf__st_header {
    int n;                 /* tensor entries, in header order */
    wf__st_entry *entries; /* 'n' */
    int32_t *by_name;      /* 'n' entry indices, sorted by name (strcmp) */
    int n_meta;            /* "__metadata__" pairs */
    char **meta;           /* 2 * 'n_meta' strings: key 0, value 0, key 1, ... */
} wf__st_header;

/* Parses and validates the JSON header 'json' ('len' bytes, not NUL-terminated) of a file
 * whose data section has 'data_size' bytes. 'what' names the file in messages
 * ("checkpoint 'x.safetensors'").
 * Returns 0, WF_EFORMAT (the message names the problem, the tensor where there is one, and
 * the header byte of a JSON syntax error) or WF_ENOMEM, with the message in wf_last_errmsg().
 * Ownership: on success '*out' owns its arrays (wf__st_header_free()); on failure it is
 *   empty. */
int wf__st_parse(const char *json, size_t len, uint64_t data_size, const char *what,
                 wf__st_header *out);

/* Frees what a header owns and empties it. An empty header is a no-op. */
void wf__st_header_free(wf__st_header *h);

/* Returns the index of the entry named 'name', or -1. */
int wf__st_find(const wf__st_header *h, const char *name);

/* An open, validated file. */
typedef struct wf__st_file {
    int fd;
    char *what;           /* "checkpoint '<path>'", for messages */
    uint64_t data_start;  /* file offset of the data section: 8 + N */
    uint64_t data_size;   /* bytes of the data section */
    wf__st_header header; /* validated against 'data_size' */
} wf__st_file;

/* Opens 'path' and validates all of it that can be checked without reading the data: the
 * size (at least 8 bytes), the header length (at most the rest of the file and at most
 * WF__ST_MAX_HEADER), and the header (wf__st_parse()).
 * Returns 0, WF_EINVAL (NULL or empty path), WF_ENOTFOUND (no such file), WF_EIO (another
 * error of the OS, or not a regular file), WF_EFORMAT, WF_ENOSYS (big-endian host) or
 * WF_ENOMEM, with a message that starts with "checkpoint '<path>'" in wf_last_errmsg().
 * Ownership: on success the caller closes '*f' with wf__st_close(); on failure nothing is
 *   left open. */
int wf__st_open(const char *path, wf__st_file *f);

/* Reads entry 'i' of 'f' into a new contiguous tensor. BOOL elements must be 0 or 1.
 * Returns 0, WF_EFORMAT (a BOOL element that is neither, or the file is shorter than when it
 * was opened), WF_EIO or WF_ENOMEM, with the message in wf_last_errmsg().
 * Ownership: on success '*out' is owned by the caller; on failure it is NULL. */
int wf__st_load(const wf__st_file *f, int i, wf_tensor **out);

/* Validates the data of every entry of 'f' (what wf__st_open() could not check without it:
 * BOOL bytes) and reads the entries with 'keep[i]' set ('keep' NULL: all) into 'out[i]'
 * ('f->header.n' entries; NULL for those not kept). A read and a load of a file go through
 * here, so both accept exactly the same files, also when a load keeps only some tensors.
 * Returns 0, or the first failure of wf__st_load() (WF_EFORMAT naming the tensor, WF_EIO,
 * WF_ENOMEM), with every 'out' entry NULL.
 * Ownership: on success the caller owns each non-NULL 'out[i]'. */
int wf__st_read_all(const wf__st_file *f, const uint8_t *keep, wf_tensor **out);

/* Closes a file opened by wf__st_open() and frees its header. */
void wf__st_close(wf__st_file *f);

/* Writes 'ts[0 .. n-1]' and the metadata pairs 'meta[0 .. 2*n_meta-1]' (key, value, ...) to
 * 'path' atomically: into "<path>.tmp.<pid>.<tid>", fsync, rename over 'path', fsync of the
 * directory. First the temporary files of 'path' that dead processes left (each kill during a
 * save may leave one) are removed; a live process's never is. Before anything is written,
 * names are checked (non-NULL, valid UTF-8, distinct, not "__metadata__") and tensors too
 * (non-NULL). The data are laid out by element size,
 * largest first (as the Python writer does), so with the 8-byte aligned data section every
 * tensor is aligned to its element size in the file.
 * 'fail_at' is a test hook: 0 normally; k > 0 makes the k-th file-system step (1: create the
 * temporary file, then each write, the fsync, the close, the rename, opening the directory
 * and its fsync) fail with EIO instead of running.
 * Returns 0, WF_EINVAL (bad argument), WF_EIO (with the OS's reason; before the rename the
 * temporary file is removed and 'path' is untouched; only a failed fsync of the directory
 * comes after the rename, when 'path' already holds the complete new file), WF_ENOSYS
 * (big-endian host) or WF_ENOMEM, with the message in wf_last_errmsg().
 * Ownership: nothing is kept. */
int wf__st_write(const char *path, const wf_named_tensor *ts, int n, const char *const *meta,
                 int n_meta, int fail_at);

#endif /* WF_RUNTIME_SAFETENSORS_H */
