/* runtime/checkpointer.c: checkpoints every K steps, written in the background, and finding
 * the newest complete one (weft/runtime.h, "Checkpoints every K steps").
 * Owns: the checkpointer (its folder, its thread, the one snapshot handed to that thread, the
 *   failure of the last background write), the names of its files
 *   ("ckpt-<step>.safetensors", at least 12 digits so that names sort as steps do), pruning
 *   a folder to its newest 'keep' checkpoints, and wf_checkpoint_latest().
 * The split (CheckFreq, FAST 2021): the training thread only copies the values into new host
 *   buffers at a step boundary; this file's thread then writes them with the same atomic
 *   writer wf_checkpoint_save() uses (safetensors.c: temporary file, fsync, rename, fsync of
 *   the folder), while the next steps run.
 * Why a thread of its own and not a scheduler task: the write blocks in write() and fsync()
 *   for as long as the disk takes (tens of milliseconds for a few MB here); on a scheduler
 *   worker that would take a core away from the training step's own tasks for that long,
 *   and on a one-worker runtime stall it outright. The thread only sleeps or waits on the
 *   disk, so it competes for no core while the step computes.
 * Buffers: the snapshot written last is kept ('spare') and the next one copies into its
 *   buffers when it has the same tensors (names, dtypes, shapes: every step of a training
 *   run), so a snapshot takes no new memory and no page faults: a 22 MB one allocated fresh
 *   took about 46 ms on this 2-core machine under load. Those tensors are the
 *   checkpointer's alone (the writer keeps no reference), so writing them is safe.
 * Invariants: at most one snapshot is pending or being written ('job' set from hand-over to
 *   the end of its write, under 'mu'); a checkpoint file is removed only after a newer one is
 *   complete, and never one of the newest 'keep'; so a failed or killed write loses nothing
 *   already saved.
 * Not here: the file format and the atomic write (safetensors.c), taking a session's
 *   variables and loading a file back (checkpoint.c). */
#include "internal.h"
#include "safetensors.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The largest step: 18 decimal digits, as wf__checkpoint_step() reads them back. */
#define WF__STEP_MAX 999999999999999999ll

#define NAME_SUFFIX ".safetensors" /* the suffix; the prefix is "ckpt-" */

/* One snapshot: owned copies of the names and of the values. */
typedef struct job {
    int64_t step;
    int n;
    wf_named_tensor *ts; /* 'n': names malloc'd, tensors owned */
} job;

struct wf_checkpointer {
    char *dir;
    int keep;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* signalled when 'job' is set or cleared, or 'quit' */
    job *job;          /* the snapshot pending or being written; NULL: idle */
    job *spare;        /* the last snapshot written, kept for its buffers (or NULL) */
    bool quit;
    int err;                    /* the last background write's failure; 0: none */
    char errmsg[WF_ERRMSG_MAX]; /* its message */
};

static void job_free(job *j)
{
    if (!j)
        return;
    for (int i = 0; i < j->n; i++) {
        free((char *)j->ts[i].name);
        wf_tensor_release(j->ts[i].tensor);
    }
    free(j->ts);
    free(j);
}

/* The step of a file name "ckpt-<digits>.safetensors", or -1 for any other name (temporary
 * files "....safetensors.tmp.<pid>.<tid>" included). */
static int64_t name_step(const char *name)
{
    if (strncmp(name, "ckpt-", 5) != 0)
        return -1;
    const char *p = name + 5;
    int64_t x = 0;
    int nd = 0;
    for (; *p >= '0' && *p <= '9'; p++, nd++) {
        if (nd == 18)
            return -1;
        x = x * 10 + (*p - '0');
    }
    return nd >= 12 && strcmp(p, NAME_SUFFIX) == 0 ? x : -1;
}

static int path_of(char *buf, size_t cap, const char *dir, int64_t step)
{
    int len = snprintf(buf, cap, "%s/ckpt-%012" PRId64 NAME_SUFFIX, dir, step);
    return len >= 0 && (size_t)len < cap ? 0 : -1;
}

static int cmp_desc(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* The steps of the checkpoint files of 'dir', newest first, into '*out' ('*n'; malloc'd).
 * Returns 0, WF_ENOTFOUND (no such folder), WF_EIO or WF_ENOMEM with the message set. */
static int list_steps(const char *dir, int64_t **out, int *n)
{
    *out = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d)
        return wf__err(errno == ENOENT ? WF_ENOTFOUND : WF_EIO, "checkpoint folder '%s': %s", dir,
                       strerror(errno));
    int64_t *steps = NULL;
    int cnt = 0, cap = 0, rc = 0;
    for (struct dirent *e; (e = readdir(d));) {
        int64_t st = name_step(e->d_name);
        if (st < 0)
            continue;
        if (cnt == cap) {
            int64_t *m = realloc(steps, (size_t)(cap = cap ? 2 * cap : 16) * sizeof *m);
            if (!m) {
                rc = wf__err(WF_ENOMEM, "checkpoint folder '%s': no memory for %d names", dir, cap);
                break;
            }
            steps = m;
        }
        steps[cnt++] = st;
    }
    closedir(d);
    if (rc < 0) {
        free(steps);
        return rc;
    }
    if (cnt)
        qsort(steps, (size_t)cnt, sizeof *steps, cmp_desc);
    *out = steps;
    *n = cnt;
    return 0;
}

/* Removes every checkpoint of 'c->dir' but the newest 'c->keep'. Called only after a write
 * completed, so the newest is the one just written (or a newer one of an earlier run). A file
 * that cannot be removed stays: the next prune tries again. */
static void prune(wf_checkpointer *c)
{
    int64_t *steps;
    int n;
    if (list_steps(c->dir, &steps, &n) < 0)
        return;
    char path[4096];
    for (int i = c->keep; i < n; i++)
        if (path_of(path, sizeof path, c->dir, steps[i]) == 0)
            (void)unlink(path);
    free(steps);
}

static void *writer(void *arg)
{
    wf_checkpointer *c = arg;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (!c->job && !c->quit)
            pthread_cond_wait(&c->cv, &c->mu);
        if (!c->job)
            break; /* quit, nothing pending */
        job *j = c->job;
        pthread_mutex_unlock(&c->mu);
        char path[4096], step[24];
        int rc = 0;
        if (path_of(path, sizeof path, c->dir, j->step) < 0)
            rc = wf__err(WF_EINVAL, "checkpoint folder '%.200s...': the path is too long", c->dir);
        snprintf(step, sizeof step, "%" PRId64, j->step);
        const char *meta[] = { "format", "pt", "weft", WF__VERSION_STRING, "weft.step", step };
        if (rc == 0)
            rc = wf__st_write(path, j->ts, j->n, meta, 3, 0);
        if (rc == 0)
            prune(c);
        pthread_mutex_lock(&c->mu);
        if (rc < 0) {
            c->err = rc;
            snprintf(c->errmsg, sizeof c->errmsg, "checkpoint of step %" PRId64 ": %s", j->step,
                     wf_last_errmsg());
        }
        job *old = c->spare;
        c->spare = j;
        c->job = NULL;
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->mu);
        job_free(old);
        pthread_mutex_lock(&c->mu);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

int wf_checkpointer_create(const wf_checkpointer_opts *opts, wf_checkpointer **out)
{
    if (out)
        *out = NULL;
    if (!opts || !out)
        return wf__err(WF_EINVAL, "wf_checkpointer_create: %s is NULL", opts ? "out" : "opts");
    if (!opts->dir || !*opts->dir)
        return wf__err(WF_EINVAL, "wf_checkpointer_create: the folder is %s",
                       opts->dir ? "empty" : "NULL");
    if (opts->keep < 0)
        return wf__err(WF_EINVAL, "wf_checkpointer_create: keep is %d (0: 3, or at least 1)",
                       opts->keep);
    struct stat st;
    if (stat(opts->dir, &st) != 0)
        return wf__err(errno == ENOENT ? WF_ENOTFOUND : WF_EIO,
                       "wf_checkpointer_create: checkpoint folder '%s': %s", opts->dir,
                       strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return wf__err(WF_EIO, "wf_checkpointer_create: checkpoint folder '%s' is not a folder",
                       opts->dir);
    wf_checkpointer *c = calloc(1, sizeof *c);
    if (!c || !(c->dir = strdup(opts->dir))) {
        free(c);
        return wf__err(WF_ENOMEM, "wf_checkpointer_create: no memory");
    }
    c->keep = opts->keep ? opts->keep : 3;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    /* The thread takes no signals (it inherits a full mask): a program's SIGINT handler runs
     * on its own threads, and no write of the thread is interrupted. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int e = pthread_create(&c->thread, NULL, writer, c);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (e != 0) {
        pthread_cond_destroy(&c->cv);
        pthread_mutex_destroy(&c->mu);
        free(c->dir);
        free(c);
        return wf__err(e == ENOMEM || e == EAGAIN ? WF_ENOMEM : WF_EIO,
                       "wf_checkpointer_create: cannot start its thread: %s", strerror(e));
    }
    *out = c;
    return 0;
}

/* Waits (under 'c->mu') until no snapshot is pending; returns the stored failure, cleared,
 * with its message set. */
static int drain(wf_checkpointer *c)
{
    while (c->job)
        pthread_cond_wait(&c->cv, &c->mu);
    int rc = c->err;
    if (rc < 0) {
        c->err = 0;
        wf__err(rc, "%s", c->errmsg);
    }
    return rc;
}

/* A new host copy of 't' (contiguous, whatever its layout), or NULL with the message set. */
static wf_tensor *host_copy(const wf_tensor *t)
{
    wf_tensor *copy = wf__tensor_alloc(wf_tensor_dtype(t), wf_tensor_shape(t));
    size_t bytes = (size_t)wf_tensor_numel(t) * wf_dtype_size(wf_tensor_dtype(t));
    if (copy && wf_tensor_read(t, wf_tensor_dtype(t), (void *)wf_tensor_data(copy), bytes) < 0) {
        wf_tensor_release(copy);
        return NULL;
    }
    return copy;
}

/* The spare snapshot's tensor 'old' with the value of 'src' copied in, when it has the same
 * name, dtype and shape (moved out of 'old'); else NULL. */
static wf_tensor *reuse(wf_named_tensor *old, const wf_named_tensor *src)
{
    wf_tensor *t = old->tensor;
    if (!t || strcmp(old->name, src->name) != 0 ||
        wf_tensor_dtype(t) != wf_tensor_dtype(src->tensor) ||
        !wf_shape_equal(wf_tensor_shape(t), wf_tensor_shape(src->tensor)))
        return NULL;
    size_t bytes = (size_t)wf_tensor_numel(t) * wf_dtype_size(wf_tensor_dtype(t));
    if (wf_tensor_read(src->tensor, wf_tensor_dtype(t), (void *)wf_tensor_data(t), bytes) < 0)
        return NULL;
    old->tensor = NULL;
    return t;
}

/* Checks the extras' names against the variables' ('ts[0 .. nv-1]') and each other. */
static int check_extra(const wf_named_tensor *ts, int nv, const wf_named_tensor *extra, int n)
{
    for (int i = 0; i < n; i++) {
        if (!extra[i].name || !extra[i].tensor)
            return wf__err(WF_EINVAL, "wf_checkpointer_save: extra %d has a NULL %s", i,
                           extra[i].name ? "tensor" : "name");
        for (int k = 0; k < nv; k++)
            if (strcmp(ts[k].name, extra[i].name) == 0)
                return wf__err(WF_EINVAL,
                               "wf_checkpointer_save: extra '%s' has the name of a variable",
                               extra[i].name);
        for (int k = 0; k < i; k++)
            if (strcmp(extra[k].name, extra[i].name) == 0)
                return wf__err(WF_EINVAL, "wf_checkpointer_save: two extras are named '%s'",
                               extra[i].name);
    }
    return 0;
}

int wf_checkpointer_save(wf_checkpointer *c, wf_session *s, int64_t step,
                         const wf_named_tensor *extra, int n_extra)
{
    if (!c)
        return wf__err(WF_EINVAL, "wf_checkpointer_save: checkpointer is NULL");
    if (step < 0 || step > WF__STEP_MAX || n_extra < 0 || (n_extra > 0 && !extra))
        return wf__err(WF_EINVAL, "wf_checkpointer_save: step %" PRId64 ", %d extras at %p", step,
                       n_extra, (const void *)extra);
    pthread_mutex_lock(&c->mu);
    int rc = drain(c);
    job *sp = c->spare; /* idle now: the thread does not touch it */
    c->spare = NULL;
    pthread_mutex_unlock(&c->mu);
    if (rc < 0) {
        job_free(sp);
        return rc;
    }
    int nv = s ? s->n_vars : 0, n = nv + n_extra;
    job *j = calloc(1, sizeof *j);
    wf_named_tensor *vars = calloc((size_t)(nv ? nv : 1), sizeof *vars);
    if (!j || !vars || !(j->ts = calloc((size_t)(n ? n : 1), sizeof *j->ts))) {
        free(j);
        free(vars);
        job_free(sp);
        return wf__err(WF_ENOMEM, "wf_checkpointer_save: no memory for %d tensors", n);
    }
    j->step = step;
    if (s && (rc = wf__checkpoint_take(s, "wf_checkpointer_save", vars)) < 0) {
        free(vars);
        job_free(j);
        job_free(sp);
        return rc;
    }
    rc = check_extra(vars, nv, extra, n_extra);
    /* The copies: after them the values may change (the next step's updates write them in
     * place), the snapshot stays. */
    for (int i = 0; i < n && rc == 0; i++, j->n++) {
        const wf_named_tensor *src = i < nv ? &vars[i] : &extra[i - nv];
        j->ts[i].name = strdup(src->name);
        j->ts[i].tensor = sp && sp->n == n ? reuse(&sp->ts[i], src) : NULL;
        if (!j->ts[i].tensor)
            j->ts[i].tensor = host_copy(src->tensor);
        if (!j->ts[i].name || !j->ts[i].tensor)
            rc = wf__err(WF_ENOMEM, "wf_checkpointer_save: no memory to copy '%s'", src->name);
    }
    for (int k = 0; k < nv; k++)
        wf_tensor_release(vars[k].tensor);
    free(vars);
    job_free(sp); /* what was not reused */
    if (rc < 0) {
        job_free(j);
        return rc;
    }
    pthread_mutex_lock(&c->mu);
    c->job = j;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    return 0;
}

int wf_checkpointer_wait(wf_checkpointer *c)
{
    if (!c)
        return wf__err(WF_EINVAL, "wf_checkpointer_wait: checkpointer is NULL");
    pthread_mutex_lock(&c->mu);
    int rc = drain(c);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

void wf_checkpointer_destroy(wf_checkpointer *c)
{
    if (!c)
        return;
    pthread_mutex_lock(&c->mu);
    c->quit = true; /* the thread writes what is pending first */
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    pthread_join(c->thread, NULL);
    job_free(c->spare);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    free(c->dir);
    free(c);
}

int wf_checkpoint_latest(const char *dir, char *path, size_t cap, int64_t *step)
{
    if (!dir || !path || !step)
        return wf__err(WF_EINVAL, "wf_checkpoint_latest: %s is NULL",
                       !dir    ? "dir"
                       : !path ? "path"
                               : "step");
    int64_t *steps;
    int n;
    int rc = list_steps(dir, &steps, &n);
    if (rc < 0)
        return rc;
    char buf[4096];
    rc = WF_ENOTFOUND;
    for (int i = 0; i < n; i++) {
        if (path_of(buf, sizeof buf, dir, steps[i]) < 0) {
            rc = wf__err(WF_EINVAL, "wf_checkpoint_latest: the folder's path is too long");
            break;
        }
        /* Validated as a load validates a header; and the step inside must be the name's
         * (a file renamed by hand is not trusted). */
        wf__st_file f;
        if (wf__st_open(buf, &f) < 0)
            continue;
        int64_t inside = -1;
        int ok = wf__checkpoint_step(&f.header, f.what, &inside) == 0 && inside == steps[i];
        wf__st_close(&f);
        if (!ok)
            continue;
        if (strlen(buf) >= cap) {
            rc = wf__err(WF_EINVAL, "wf_checkpoint_latest: %zu bytes cannot hold '%s'", cap, buf);
            break;
        }
        memcpy(path, buf, strlen(buf) + 1);
        *step = steps[i];
        rc = 0;
        break;
    }
    free(steps);
    if (rc == WF_ENOTFOUND) /* the message of the last file skipped is not the answer */
        wf__err(rc,
                "checkpoint folder '%s': no complete checkpoint (of %d named "
                "ckpt-<step>.safetensors)",
                dir, n);
    return rc;
}
