/* examples/weft-train/resume.h: what makes a run of weft-train the same run after a restart:
 * the text of the options that decide its bits, a hash of the training data, and checking a
 * checkpoint's against this run's (weft-train --resume); a hash of a checkpoint's tensors, by
 * which the ranks of a data-parallel run check that they resumed from the same values.
 * Not here: writing and finding the checkpoints (weft's wf_checkpointer_*,
 * wf_checkpoint_latest) and the training loop (weft-train.c). */
#ifndef WT_RESUME_H
#define WT_RESUME_H

#include "data.h"

#include <stddef.h>
#include <stdint.h>

/* Appends the line "KEY VALUE\n" (VALUE from 'fmt') to the text 'buf' ('cap' bytes, '*len'
 * used). Returns 0, or -1 when it does not fit (the text is then left as it was). */
int wt_runid_add(char *buf, size_t cap, size_t *len, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* Compares the text 'saved' ('saved_len' bytes, from a checkpoint: not trusted, not
 * NUL-terminated) with this run's 'now', line by line by key. Returns 0 when every key has the
 * same value in both; else -1 with a message in 'err' naming the first option that differs
 * ("--batch: the checkpoint was trained with 32, this run has 64"), one that only one side
 * has, or a malformed text. */
int wt_runid_check(const char *saved, size_t saved_len, const char *now, char *err, size_t errlen);

/* A 64-bit FNV-1a hash of the dataset's shape, features and labels: the same data give the
 * same hash, so a resumed run can tell that its data changed. */
uint64_t wt_dataset_hash(const wt_dataset *ds);

/* A 64-bit FNV-1a hash of 'ts[0 .. n-1]' (contiguous host tensors, as wf_safetensors_read()
 * returns them): each one's name, dtype, shape and bytes, in order. The same file read on two
 * ranks gives the same hash. */
uint64_t wt_tensors_hash(const wf_named_tensor *ts, int n);

#endif /* WT_RESUME_H */
