/* examples/weft-train/progress.h: weft-train's progress bar, one per epoch, as Keras and
 * tqdm draw it:
 *   epoch 3/10 [=========>          ] 1234/1797  loss 0.4123  acc 91.2%  12,345 samples/s  ETA 0:03
 * On a terminal the line is redrawn in place ('\r') at most 10 times a second and fits the
 * terminal's width; elsewhere (a pipe, a CI log) only the final line of each epoch is
 * printed, so logs stay one line per epoch.
 * Owns: the formatting, the redraw rate and the clock readings; the caller owns the numbers
 * (what 'loss' and 'acc' mean, e.g. running means over the epoch).
 * Not here: the training loop (weft-train.c). */
#ifndef WT_PROGRESS_H
#define WT_PROGRESS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/* How the bar is drawn: 'AUTO' redraws in place when the output is a terminal (isatty). */
enum { WT_PROGRESS_AUTO = 0, WT_PROGRESS_TTY = 1, WT_PROGRESS_LINES = 2 };

#define WT_PROGRESS_REDRAW_NS 100000000u /* at most 10 redraws a second */
#define WT_PROGRESS_BAR_MAX   30         /* characters of bar, as Keras */

typedef struct wt_progress_opts {
    FILE *out;                       /* NULL: stdout */
    bool quiet;                      /* print nothing */
    int mode;                        /* WT_PROGRESS_*; 0: AUTO */
    int width;                       /* columns; 0: the terminal's (TIOCGWINSZ), else 80 */
    uint64_t (*clock_ns)(void *arg); /* NULL: clock_gettime(CLOCK_MONOTONIC); tests fake it */
    void *clock_arg;
} wt_progress_opts;

/* One epoch's bar. Fields are private to progress.c; the struct is public so that it can
 * live on the caller's stack. */
typedef struct wt_progress {
    wt_progress_opts o; /* with 'out' and 'mode' resolved */
    int width;
    int epoch, n_epochs;
    int64_t total, done;
    double loss, acc;
    bool have_stats; /* an update gave 'loss' and 'acc' */
    uint64_t t0, last_draw;
    bool drawn;    /* a line was drawn in place and not finished yet */
    int drawn_len; /* its length, to blank what a shorter redraw leaves */
} wt_progress;

/* Starts the bar of epoch 'epoch' (1-based) of 'n_epochs' ('n_epochs' <= 0: no "epoch"
 * prefix, e.g. when training for a number of steps) over 'total' samples (<= 0: unknown, no
 * bar). 'opts' may be NULL (stdout, AUTO) and is copied. Starts the clock. */
void wt_progress_begin(wt_progress *p, const wt_progress_opts *opts, int epoch, int n_epochs,
                       int64_t total);

/* Records that 'done' samples of the epoch are processed, with the loss and the accuracy (a
 * fraction in [0, 1]; negative: not shown) to show. Redraws on a terminal when the last
 * redraw is WT_PROGRESS_REDRAW_NS old (the first update always draws). */
void wt_progress_update(wt_progress *p, int64_t done, double loss, double acc);

/* Prints the epoch's final line and a newline, the ETA replaced by the elapsed time. */
void wt_progress_end(wt_progress *p);

/* As wt_progress_end(), with 'note' (e.g. "test acc 97.2%"; NULL: none) after the numbers. */
void wt_progress_end_note(wt_progress *p, const char *note);

/* Formats the current line (without '\r' or '\n') into 'buf' and returns its length; 'final'
 * shows the elapsed time instead of the ETA. Exposed for tests and for callers that log. */
int wt_progress_format(const wt_progress *p, bool final, char *buf, size_t size);

#endif /* WT_PROGRESS_H */
