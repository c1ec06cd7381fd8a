/* runtime/checkpoint.c: saving and loading a session's variables as a safetensors file
 * (weft/runtime.h, "Checkpoints").
 * Owns: which tensors a checkpoint holds (every variable of the session, by node name, plus
 *   the metadata {"format": "pt", "weft": "<version>"}), matching a file's tensors to the
 *   variables (names, dtypes, shapes, the WF_CHECKPOINT_* flags), and replacing the
 *   variables all at once.
 * Why the variables are swapped here and not through wf_session_assign(): a load must leave
 *   every variable as it was when anything fails, and a save on another thread (or a run
 *   started after the load) must never see half a checkpoint. So every value is read into a
 *   new tensor first, and then all the session's 'var_vals' are swapped under one write lock
 *   of 'var_lock', which cannot fail. Runs take variable values under that lock too, and an
 *   update node takes a value to write in place only while nobody else holds it (exec.c), so
 *   once a save has retained its values under one read lock no later update writes them; an
 *   update already under way may still be (weft/runtime.h: save between steps).
 * Variables resident on a device (runtime/var_device.c): a save copies each one whose latest
 *   write is on its device back first (the host value then current again); a load writes
 *   the host values, so a device value becomes stale and the next run on the device copies
 *   the loaded value in once.
 * wf_checkpoint_restore() is the same load for a checkpointer's file: its "weft.step"
 *   metadata is checked and returned, and the tensors that are not variables come back to
 *   the caller instead of being refused.
 * Not here: the file format, its validation and the atomic write (safetensors.c); the
 *   background writer and the folder of numbered checkpoints (checkpointer.c). */
#include "internal.h"
#include "safetensors.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int wf__checkpoint_take(wf_session *s, const char *fn, wf_named_tensor *ts)
{
    /* The host values, each copied back first when a device holds its latest write
     * (runtime/var_device.c), then all taken under one read lock. */
    for (int k = 0; k < s->n_vars; k++) {
        int rc = wf__var_host_current(s, k, fn, NULL);
        if (rc < 0)
            return wf__session_fail(s, rc, "%s", wf_last_errmsg());
    }
    pthread_rwlock_rdlock(&s->var_lock);
    for (int id = 0; id < s->n_nodes; id++) {
        int k = s->var_of[id];
        if (k >= 0)
            ts[k] = (wf_named_tensor){ wf_graph_node(s->g, id)->name,
                                       wf_tensor_retain(s->var_vals[k]) };
    }
    pthread_rwlock_unlock(&s->var_lock);
    return 0;
}

int wf_checkpoint_save(wf_session *s, const char *path)
{
    if (!s)
        return wf__err(WF_EINVAL, "wf_checkpoint_save: session is NULL");
    if (!path || !*path)
        return wf__session_fail(s, WF_EINVAL, "wf_checkpoint_save: the path is %s",
                                path ? "empty" : "NULL");
    wf_named_tensor *ts = calloc((size_t)(s->n_vars ? s->n_vars : 1), sizeof *ts);
    if (!ts)
        return wf__session_fail(s, WF_ENOMEM, "wf_checkpoint_save: no memory for %d variables",
                                s->n_vars);
    int rc = wf__checkpoint_take(s, "wf_checkpoint_save", ts);
    if (rc < 0) {
        free(ts);
        return rc;
    }
    static const char *const meta[] = { "format", "pt", "weft", WF__VERSION_STRING };
    rc = wf__st_write(path, ts, s->n_vars, meta, 2, 0);
    for (int k = 0; k < s->n_vars; k++)
        wf_tensor_release(ts[k].tensor);
    free(ts);
    if (rc < 0)
        return wf__session_fail(s, rc, "wf_checkpoint_save: %s", wf_last_errmsg());
    return 0;
}

int wf__checkpoint_step(const wf__st_header *h, const char *what, int64_t *step)
{
    const char *v = NULL;
    for (int i = 0; i < h->n_meta; i++)
        if (strcmp(h->meta[2 * i], "weft.step") == 0)
            v = h->meta[2 * i + 1];
    if (!v)
        return wf__err(WF_EFORMAT,
                       "%s: no \"weft.step\" in \"__metadata__\" (not a file "
                       "of wf_checkpointer_save())",
                       what);
    int64_t x = 0;
    int nd = 0;
    for (const char *p = v; *p; p++, nd++) {
        if (*p < '0' || *p > '9' || nd == 18 || (nd > 0 && x == 0))
            return wf__err(WF_EFORMAT,
                           "%s: \"weft.step\" is '%.40s', not a step number (1 to 18 "
                           "decimal digits, no leading zero)",
                           what, v);
        x = x * 10 + (*p - '0');
    }
    if (nd == 0)
        return wf__err(WF_EFORMAT, "%s: \"weft.step\" is empty, not a step number", what);
    *step = x;
    return 0;
}

/* Matches the file's entries to the session's variables: 'entry_of[k]' gets the entry of
 * variable k (-1: absent, allowed by the flags), 'used[i]' whether entry i was matched. */
static int match(wf_session *s, const char *fn, const wf__st_file *f, uint32_t flags,
                 int32_t *entry_of, uint8_t *used)
{
    char desc[WF_ERRMSG_MAX], a[160], b[160];
    for (int id = 0; id < s->n_nodes; id++) {
        int k = s->var_of[id];
        if (k < 0)
            continue;
        const wf_node *n = wf_graph_node(s->g, id);
        int i = wf__st_find(&f->header, n->name);
        entry_of[k] = i;
        if (i < 0) {
            if (flags & WF_CHECKPOINT_ALLOW_MISSING)
                continue;
            return wf__session_fail(s, WF_ENOTFOUND,
                                    "%s: %s: no tensor for %s, %s %s (pass "
                                    "WF_CHECKPOINT_ALLOW_MISSING to keep its value)",
                                    fn, f->what, wf__rt_node_desc(n, desc, sizeof desc),
                                    wf_dtype_name(n->dtype), wf_shape_str(n->shape, a, sizeof a));
        }
        const wf__st_entry *e = &f->header.entries[i];
        if (e->dtype != n->dtype)
            return wf__session_fail(s, WF_EDTYPE, "%s: %s: tensor '%s' is %s but %s is %s", fn,
                                    f->what, e->name, wf_dtype_name(e->dtype),
                                    wf__rt_node_desc(n, desc, sizeof desc),
                                    wf_dtype_name(n->dtype));
        if (!wf_shape_equal(e->shape, n->shape))
            return wf__session_fail(s, WF_ESHAPE, "%s: %s: tensor '%s' has shape %s but %s has %s",
                                    fn, f->what, e->name, wf_shape_str(e->shape, a, sizeof a),
                                    wf__rt_node_desc(n, desc, sizeof desc),
                                    wf_shape_str(n->shape, b, sizeof b));
        used[i] = 1;
    }
    if (!(flags & WF_CHECKPOINT_ALLOW_UNEXPECTED))
        for (int i = 0; i < f->header.n; i++)
            if (!used[i])
                return wf__session_fail(
                    s, WF_EINVAL,
                    "%s: %s: tensor '%s' is not a variable of the "
                    "session (pass WF_CHECKPOINT_ALLOW_UNEXPECTED to ignore it)",
                    fn, f->what, f->header.entries[i].name);
    return 0;
}

/* What a restore returns besides the variables (wf_checkpoint_restore()). */
typedef struct restored {
    int64_t step;
    wf_named_tensor *extra;
    int n_extra;
} restored;

/* wf_checkpoint_load() and, with 'r', wf_checkpoint_restore() ('fn' names it). */
static int load(wf_session *s, const char *fn, const char *path, uint32_t flags, restored *r)
{
    if (!s)
        return wf__err(WF_EINVAL, "%s: session is NULL", fn);
    if (!path || !*path)
        return wf__session_fail(s, WF_EINVAL, "%s: the path is %s", fn, path ? "empty" : "NULL");
    const uint32_t known = WF_CHECKPOINT_ALLOW_MISSING | WF_CHECKPOINT_ALLOW_UNEXPECTED;
    if (flags & ~known)
        return wf__session_fail(s, WF_EINVAL, "%s: unknown flags 0x%x", fn, flags & ~known);
    wf__st_file f;
    int rc = wf__st_open(path, &f);
    if (rc < 0)
        return wf__session_fail(s, rc, "%s: %s", fn, wf_last_errmsg());
    int nv = s->n_vars ? s->n_vars : 1, ne = f.header.n ? f.header.n : 1;
    int32_t *entry_of = malloc((size_t)nv * sizeof *entry_of);
    wf_tensor **vals = calloc((size_t)nv, sizeof *vals);
    wf_tensor **by_entry = calloc((size_t)ne, sizeof *by_entry);
    uint8_t *used = calloc((size_t)ne, 1);
    wf_named_tensor *extra = r ? calloc((size_t)ne, sizeof *extra) : NULL;
    if (!entry_of || !vals || !by_entry || !used || (r && !extra)) {
        rc = wf__session_fail(s, WF_ENOMEM, "%s: no memory for %d variables", fn, s->n_vars);
        goto out;
    }
    if (r && (rc = wf__checkpoint_step(&f.header, f.what, &r->step)) < 0) {
        rc = wf__session_fail(s, rc, "%s: %s", fn, wf_last_errmsg());
        goto out;
    }
    if ((rc = match(s, fn, &f, flags, entry_of, used)) < 0)
        goto out;
    /* The whole file is validated as a read validates it, also the tensors it skips; a
     * restore keeps them all (the extras). */
    if ((rc = wf__st_read_all(&f, r ? NULL : used, by_entry)) < 0) {
        rc = wf__session_fail(s, rc, "%s: %s", fn, wf_last_errmsg());
        goto out;
    }
    for (int k = 0; k < s->n_vars; k++)
        if (entry_of[k] >= 0) {
            vals[k] = by_entry[entry_of[k]];
            by_entry[entry_of[k]] = NULL;
        }
    /* The extras: what is left, names taken over from the header (as wf_safetensors_read()
     * does), so nothing below can fail. */
    int n_extra = 0;
    for (int i = 0; r && i < f.header.n; i++)
        if (by_entry[i]) {
            extra[n_extra++] = (wf_named_tensor){ f.header.entries[i].name, by_entry[i] };
            f.header.entries[i].name = NULL;
            by_entry[i] = NULL;
        }
    /* Everything is read and checked: replace the variables together. 'vals' gets the old
     * values, released below outside the lock. */
    pthread_rwlock_wrlock(&s->var_lock);
    for (int k = 0; k < s->n_vars; k++)
        if (vals[k]) {
            wf_tensor *old = s->var_vals[k];
            s->var_vals[k] = vals[k];
            vals[k] = old;
            wf__var_host_written(s, k); /* a device value is stale (var_device.c) */
        }
    pthread_rwlock_unlock(&s->var_lock);
    if (r) {
        r->extra = extra;
        r->n_extra = n_extra;
        extra = NULL;
    }
out:
    for (int k = 0; vals && k < s->n_vars; k++)
        wf_tensor_release(vals[k]);
    for (int i = 0; by_entry && i < f.header.n; i++)
        wf_tensor_release(by_entry[i]);
    free(extra);
    free(vals);
    free(by_entry);
    free(entry_of);
    free(used);
    wf__st_close(&f);
    return rc;
}

int wf_checkpoint_load(wf_session *s, const char *path, uint32_t flags)
{
    return load(s, "wf_checkpoint_load", path, flags, NULL);
}

int wf_checkpoint_restore(wf_session *s, const char *path, int64_t *step, wf_named_tensor **extra,
                          int *n_extra)
{
    if (extra)
        *extra = NULL;
    if (n_extra)
        *n_extra = 0;
    if (!step || !extra || !n_extra) {
        const char *what = !step ? "step" : !extra ? "extra" : "n_extra";
        if (!s)
            return wf__err(WF_EINVAL, "wf_checkpoint_restore: %s is NULL", what);
        return wf__session_fail(s, WF_EINVAL, "wf_checkpoint_restore: %s is NULL", what);
    }
    restored r = { 0 };
    int rc = load(s, "wf_checkpoint_restore", path, WF_CHECKPOINT_ALLOW_UNEXPECTED, &r);
    if (rc < 0)
        return rc;
    *step = r.step;
    *extra = r.extra;
    *n_extra = r.n_extra;
    return 0;
}
