/* examples/weft-train/plot.h: weft-train --plot: the loss and accuracy of a run as an SVG
 * file a browser opens, written without any plotting library. Two panels over the step
 * axis: loss above, accuracy below; in each, the train value of every step (a thin line, and
 * a moving average over it when there are many steps) and the test value at every
 * evaluation (dots joined by a line); axes with ticks and labels, and a legend.
 * Owns: the series (kept in memory until the end) and the SVG layout.
 * Not here: what is measured, and when (weft-train.c). */
#ifndef WT_PLOT_H
#define WT_PLOT_H

#include <stddef.h>
#include <stdio.h>

typedef struct wt_series {
    double *x, *y;
    long n, cap;
} wt_series;

typedef struct wt_plot {
    FILE *f; /* opened by wt_plot_open(), so a bad path fails before training */
    char path[512];
    wt_series train_loss, train_acc, test_loss, test_acc;
} wt_plot;

/* Opens 'path' for writing (the plot is written there by wt_plot_finish()).
 * Returns 0, or -1 with the reason in 'err'. */
int wt_plot_open(wt_plot *p, const char *path, char *err, size_t errlen);

/* Records one training step's loss and accuracy (a fraction in [0, 1]). Returns 0 or -1
 * (no memory). */
int wt_plot_step(wt_plot *p, long step, double loss, double acc);

/* Records one evaluation on the test set after 'step' steps. Returns 0 or -1. */
int wt_plot_eval(wt_plot *p, long step, double loss, double acc);

/* Writes the plot, titled 'title', and closes the file. Returns 0, or -1 with the reason in
 * 'err'. */
int wt_plot_finish(wt_plot *p, const char *title, char *err, size_t errlen);

/* Frees the series and closes the file if wt_plot_finish() did not. NULL-safe fields. */
void wt_plot_free(wt_plot *p);

/* Writes 's' escaped for XML text and attribute values (bytes that are not UTF-8 characters
 * XML allows become '?'). */
void wt_xml_escape(FILE *f, const char *s);

#endif /* WT_PLOT_H */
