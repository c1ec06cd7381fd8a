/* runtime/var_device.c: the session's devices, and variables resident on them (issue 6).
 * Owns: opening each device once per session (wf__session_device(): at the first plan that
 *   places a node there; every plan of the session shares it; wf_session_destroy() closes
 *   it), and each variable's device value (wf__var_dev, internal.h): the device tensor,
 *   which copy is current, copying in at a run's read, copying back on demand, and the
 *   versions that say which is current.
 * Why one open per session: an open device is one in-order queue (devices/device.h: work
 *   given to one device completes in the order given), and a device value is written by one
 *   plan's update and read by another plan's kernels. Two opens of one GPU (two plans, each
 *   with its own streams, as before) would not order those against each other.
 * Ordering: a run's own reads of a variable precede its update in its task graph (the
 *   optimizer's control edges), so their kernels are given to the device first and complete
 *   first. Runs of a session may be concurrent (several threads, one slot each, plans
 *   shared): between two runs nothing is ordered but what 'var_lock' orders, exactly as for
 *   host values (runtime/exec.c: take_writable()): a device value someone still holds (a
 *   run that read it, a copy back under way) is never written; an update then writes a copy
 *   that becomes the variable's value, and concurrent updates of one variable race as
 *   TensorFlow's use_locking=False does (the memory stays valid, the arithmetic is
 *   Hogwild).
 * Versions (internal.h, wf__var_dev): every write bumps 'ver'; a host write (assign,
 *   checkpoint load, a host update) sets 'host_ver', a device update 'dev_ver', a copy sets
 *   the destination's. A device update bumps 'ver' after its kernel was given to the device,
 *   and a copy back notes 'ver' before it gives its copy: so a copy back that may have read
 *   the update's result is never taken for the version before it, and one that raced an
 *   update installs a host value the bump then marks stale (a copy wasted, nothing wrong).
 * Copying in (wf__var_device_read(), a variable node's task on the device): under the write
 *   lock, from the host value (staged: copy_from_host() does not wait for the device) or,
 *   when the latest write is on another device, from there (copy_peer()); into the existing
 *   device value when nobody else holds it, else into a new one. No worker waits.
 * Copying back (wf__var_host_current(): wf_session_variable(), checkpoint saves, a run that
 *   reads the variable on the host): into a new host tensor (the old one may be held), the
 *   caller waiting for the device's notice, outside the lock (a task waiting for the lock
 *   may be what the device's actor needs a worker for); installed if no write came since.
 *   It is given to the device after any update that was granted the value ('writing') has
 *   given its kernel: on a GPU the device's order then puts the copy after the kernel;
 *   on a simulated device, whose kernels run in the calling thread, it also keeps the
 *   copy from reading bytes a kernel is writing (tests run it under TSan).
 * Not here: which variables are resident in a plan (placement/place.c), the update kernels run on
 *   the device (exec_device.c), the devices (devices/). */
#include "../devices/device.h"
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* "cpu:0", "cuda:K" or "sim:K" of the session's device 'id'. */
static const char *dev_label(const wf_session *s, int id)
{
    return id > 0 && id < s->devtab.n && s->devtab.devs[id] ? s->devtab.devs[id]->info.name
                                                            : "the host";
}

/* "<op> '<name>' (<file>:<line>)" of variable 'k'. */
static const char *var_desc(const wf_session *s, int k, char *buf, size_t size)
{
    for (int id = 0; id < s->n_nodes; id++)
        if (s->var_of[id] == k)
            return wf__rt_node_desc(wf_graph_node(s->g, id), buf, size);
    snprintf(buf, size, "variable %d", k);
    return buf;
}

int wf__session_device(wf_session *s, int id, int n_dev, wf_device **out)
{
    *out = NULL;
    int rc = 0;
    pthread_mutex_lock(&s->dev_mu);
    if (!s->devtab.devs) {
        if ((s->devtab.devs = calloc((size_t)n_dev, sizeof *s->devtab.devs)))
            s->devtab.n = n_dev;
        else
            rc = wf__err(WF_ENOMEM, "no memory for %d devices", n_dev);
    }
    if (rc == 0 && (id < 1 || id >= s->devtab.n))
        rc = wf__err(WF_EINVAL, "device %d is not one of the session's %d", id, s->devtab.n);
    if (rc == 0 && !s->devtab.devs[id]) {
        int n_real = wf_device_count(s->rt);
        if (n_real < 1)
            n_real = 1;
        wf__sim_opts so = { s->sim_delay_us, s->sim_fail_alloc, s->sim_fail_notice };
        rc = id < n_real ? wf_device_open(s->rt, id, NULL, &s->devtab.devs[id])
                         : wf__sim_open(s->rt, id, id - n_real, &so, &s->devtab.devs[id]);
    }
    if (rc == 0)
        *out = s->devtab.devs[id];
    pthread_mutex_unlock(&s->dev_mu);
    return rc;
}

void wf__session_devices_close(wf_session *s)
{
    for (int k = 0; s->var_dev && k < s->n_vars; k++) {
        wf_tensor_release(s->var_dev[k].dval); /* freed in its device's order */
        s->var_dev[k].dval = NULL;
    }
    for (int id = 0; s->devtab.devs && id < s->devtab.n; id++)
        wf_device_close(s->devtab.devs[id]); /* waits for the device's work */
    free(s->devtab.devs);
    s->devtab.devs = NULL;
    s->devtab.n = 0;
}

/* ---- Copying back ---------------------------------------------------------------------- */

/* A device's notice, waited for by a thread (the copy back). */
typedef struct waiter {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    int status;
    char why[WF_ERRMSG_MAX];
} waiter;

static void notice(void *arg, int status)
{
    waiter *w = arg;
    pthread_mutex_lock(&w->mu);
    w->status = status;
    if (status < 0)
        snprintf(w->why, sizeof w->why, "%s", wf_last_errmsg());
    w->done = true;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

/* Copies device value 't' of 'd' into host tensor 'h' (same dtype and shape) and waits until
 * it has landed. Returns 0 or the device's failure with wf_last_errmsg() set. */
static int copy_back(wf_device *d, const wf_tensor *t, wf_tensor *h)
{
    size_t bytes = (size_t)t->numel * wf_dtype_size(t->dtype);
    int rc = bytes ? d->ops->copy_to_host(d, t->buf, (size_t)(t->data - (char *)t->buf->data),
                                          h->data, bytes, NULL)
                   : 0;
    if (rc < 0)
        return rc;
    waiter w = { .done = false };
    pthread_mutex_init(&w.mu, NULL);
    pthread_cond_init(&w.cv, NULL);
    rc = d->ops->notify(d, notice, &w);
    if (rc == 0) {
        pthread_mutex_lock(&w.mu);
        while (!w.done)
            pthread_cond_wait(&w.cv, &w.mu);
        pthread_mutex_unlock(&w.mu);
        if (w.status < 0)
            rc = wf__err(w.status, "%s", w.why);
    } else {
        (void)d->ops->sync(d); /* the copy may still be writing into 'h' */
    }
    pthread_mutex_destroy(&w.mu);
    pthread_cond_destroy(&w.cv);
    return rc;
}

/* The tries of wf__var_host_current() before it settles for a copy it could not install
 * (a device update came during each copy: concurrent training). */
#define COPY_BACK_TRIES 4

int wf__var_host_current(wf_session *s, int k, const char *fn, wf_tensor **out)
{
    if (out)
        *out = NULL;
    int rc0 = wf__session_var_need(s, k); /* a pipeline stage's value never read yet */
    if (rc0 < 0) {
        char why[WF_ERRMSG_MAX];
        snprintf(why, sizeof why, "%s", wf_last_errmsg());
        return wf__err(rc0, "%s: %s", fn, why);
    }
    for (int tries = 1;; tries++) {
        pthread_rwlock_rdlock(&s->var_lock);
        wf__var_dev *vd = &s->var_dev[k];
        if (!vd->dval || vd->host_ver == vd->ver) {
            if (out)
                *out = wf_tensor_retain(s->var_vals[k]);
            pthread_rwlock_unlock(&s->var_lock);
            return 0;
        }
        if (vd->writing) { /* an update is handing its kernel to the device: after it */
            pthread_rwlock_unlock(&s->var_lock);
            nanosleep(&(struct timespec){ 0, 20000 }, NULL);
            tries--;
            continue;
        }
        uint64_t v0 = vd->ver;
        wf_tensor *dv = wf_tensor_retain(vd->dval);
        int id = vd->dev;
        wf_device *d = s->devtab.devs[id]; /* set before the value was made (under the lock) */
        pthread_rwlock_unlock(&s->var_lock);

        char desc[WF_ERRMSG_MAX];
        wf_tensor *h = wf__tensor_alloc(dv->dtype, dv->shape);
        int rc = h ? copy_back(d, dv, h) : WF_ENOMEM;
        wf_tensor_release(dv); /* freed in the device's order, after the copy */
        if (rc < 0) {
            char why[WF_ERRMSG_MAX];
            snprintf(why, sizeof why, "%s", wf_last_errmsg());
            wf_tensor_release(h);
            return wf__err(rc, "%s: %s: copying its value from %s to the host: %s", fn,
                           var_desc(s, k, desc, sizeof desc), d->info.name, why);
        }
        atomic_fetch_add_explicit(&s->var_copies_out, 1, memory_order_relaxed);
        wf_tensor *old = NULL;
        bool current;
        pthread_rwlock_wrlock(&s->var_lock);
        if (vd->ver == v0 && vd->host_ver != v0) { /* no write since: install it */
            old = s->var_vals[k];
            s->var_vals[k] = wf_tensor_retain(h);
            vd->host_ver = v0;
        }
        current = vd->host_ver == vd->ver;
        if (out && (current || tries == COPY_BACK_TRIES))
            *out = wf_tensor_retain(current ? s->var_vals[k] : h);
        pthread_rwlock_unlock(&s->var_lock);
        wf_tensor_release(old);
        wf_tensor_release(h);
        if (current || tries == COPY_BACK_TRIES)
            return 0;
    }
}

int wf__plan_vars_ready(wf__plan *p)
{
    wf_session *s = p->sess;
    if (atomic_load_explicit(&s->n_var_dev, memory_order_acquire) == 0)
        return 0; /* no variable has a device value: every host value is current */
    for (int h = 0; h < p->n_host_vars; h++) {
        int rc = wf__var_host_current(s, p->var[p->host_vars[h]], "wf_session_run", NULL);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* ---- Copying in, and updates on the device --------------------------------------------- */

/* Whether 'vd' holds the latest write on device 'id' (under var_lock, either mode). */
static bool current_on(const wf__var_dev *vd, int id)
{
    return vd->dval && vd->dev == id && vd->dev_ver == vd->ver;
}

int wf__var_device_read(wf__slot *sl, int i)
{
    const wf__plan *p = sl->plan;
    wf_session *s = p->sess;
    const wf_node *n = p->nodes[i];
    int k = p->var[i], id = p->dev->pl.where[i];
    wf_device *d = p->dev->devs[id];
    char why[WF_ERRMSG_MAX];
    wf__var_dev *vd = &s->var_dev[k];
    /* The usual step: the device value is current; a read lock is enough to take it, so the
     * readers of concurrent runs do not queue behind one another. */
    pthread_rwlock_rdlock(&s->var_lock);
    bool current = current_on(vd, id);
    if (current)
        sl->dev->dvals[i] = wf_tensor_retain(vd->dval);
    pthread_rwlock_unlock(&s->var_lock);
    if (current)
        return 0;
    pthread_rwlock_wrlock(&s->var_lock);
    if (current_on(vd, id)) { /* made current meanwhile */
        sl->dev->dvals[i] = wf_tensor_retain(vd->dval);
        pthread_rwlock_unlock(&s->var_lock);
        return 0;
    }
    /* Stale or never made: copy in, into the old device value when nobody holds it (its
     * earlier readers were given to the device before this copy, which follows them). */
    wf_tensor *dst = NULL, *old = NULL;
    const wf_tensor *h = s->var_vals[k];
    if (vd->dval && vd->dev == id &&
        atomic_load_explicit(&vd->dval->refs, memory_order_acquire) == 1 &&
        atomic_load_explicit(&vd->dval->buf->refs, memory_order_acquire) == 1)
        dst = vd->dval;
    else if (!(dst = wf__device_tensor(d, h->dtype, h->shape))) {
        int rc = WF_ENOMEM;
        snprintf(why, sizeof why,
                 "making its value resident on %s: %s (its host value is unchanged)", d->info.name,
                 wf_last_errmsg());
        pthread_rwlock_unlock(&s->var_lock);
        return wf__slot_fail(sl, n, rc, why);
    }
    size_t bytes = (size_t)h->numel * wf_dtype_size(h->dtype);
    int rc = 0;
    void *tmp = NULL;
    if (vd->host_ver == vd->ver) { /* from the host (a strided value is gathered first) */
        const void *src = h->data;
        if (!h->contiguous && bytes) {
            if (!(tmp = malloc(bytes)))
                rc = wf__err(WF_ENOMEM, "no memory to gather a strided value");
            else
                rc = wf_tensor_read(h, h->dtype, tmp, bytes);
            src = tmp;
        }
        if (rc == 0 && bytes)
            rc = d->ops->copy_from_host(d, dst->buf, 0, src, bytes, NULL);
    } else if (vd->dval && vd->dev_ver == vd->ver && vd->dev != id) { /* from another device */
        rc = bytes ? d->ops->copy_peer(d, dst->buf, 0, s->devtab.devs[vd->dev], vd->dval->buf, 0,
                                       bytes)
                   : 0;
    } else {
        rc = wf__err(WF_EINVAL, "no copy of the variable is current (an internal error)");
    }
    free(tmp);
    if (rc < 0) {
        snprintf(why, sizeof why, "copying its value from %s to %s: %s",
                 vd->host_ver == vd->ver ? "the host" : dev_label(s, vd->dev), d->info.name,
                 wf_last_errmsg());
        pthread_rwlock_unlock(&s->var_lock);
        if (dst != vd->dval)
            wf_tensor_release(dst);
        return wf__slot_fail(sl, n, rc, why);
    }
    if (dst != vd->dval) {
        old = vd->dval;
        if (!old)
            atomic_fetch_add_explicit(&s->n_var_dev, 1, memory_order_release);
        vd->dval = dst;
        vd->dev = id;
    }
    vd->dev_ver = vd->ver;
    atomic_fetch_add_explicit(&s->var_copies_in, 1, memory_order_relaxed);
    sl->dev->dvals[i] = wf_tensor_retain(dst);
    pthread_rwlock_unlock(&s->var_lock);
    wf_tensor_release(old); /* in its device's order, after the reads given before */
    return 0;
}

int wf__var_device_writable(wf__slot *sl, int i, wf_tensor **in)
{
    const wf__plan *p = sl->plan;
    wf_session *s = p->sess;
    const wf_node *n = p->nodes[i];
    const int32_t *idx = p->in_idx + p->in_off[i];
    int id = p->dev->pl.where[i], k = 0, rc = 0;
    wf_device *d = p->dev->devs[id];
    char why[WF_ERRMSG_MAX];
    for (; k < n->op->n_assign; k++) {
        int32_t j = idx[k], v = p->var[j];
        if (v < 0 || p->dev->pl.where[j] != id) { /* placement makes neither */
            snprintf(why, sizeof why,
                     "assigned input %d is not a variable resident on %s (an internal error)", k,
                     d->info.name);
            rc = wf__err(WF_EINVAL, "%s", why);
            break;
        }
        pthread_rwlock_wrlock(&s->var_lock);
        wf__var_dev *vd = &s->var_dev[v];
        wf_tensor *cur = vd->dval, *w = cur;
        if (!cur || vd->dev != id) {
            snprintf(why, sizeof why, "variable %d has no value on %s (an internal error)", v,
                     d->info.name);
            rc = WF_EINVAL;
        } else if (atomic_load_explicit(&cur->refs, memory_order_acquire) !=
                       1 + (sl->dev->dvals[j] == cur) ||
                   atomic_load_explicit(&cur->buf->refs, memory_order_acquire) != 1) {
            /* Someone else holds it (another run, a copy back): write a copy. */
            size_t bytes = (size_t)cur->numel * wf_dtype_size(cur->dtype);
            if (!(w = wf__device_tensor(d, cur->dtype, cur->shape))) {
                snprintf(why, sizeof why, "a copy of variable '%s' to update on %s: %s",
                         p->nodes[j]->name, d->info.name, wf_last_errmsg());
                rc = WF_ENOMEM;
            } else if (bytes && (rc = d->ops->copy_peer(d, w->buf, 0, d, cur->buf, 0, bytes)) < 0) {
                snprintf(why, sizeof why, "copying variable '%s' on %s: %s", p->nodes[j]->name,
                         d->info.name, wf_last_errmsg());
                wf_tensor_release(w);
            } else {
                vd->dval = w; /* the new tensor's reference moves to the session */
            }
        }
        if (rc == 0) {
            in[k] = wf_tensor_retain(w);
            vd->writing++; /* until wf__var_device_written() */
        }
        pthread_rwlock_unlock(&s->var_lock);
        if (rc < 0) {
            wf__err(rc, "%s", why);
            break;
        }
        if (w != cur)
            wf_tensor_release(cur); /* the session's old reference; held by someone else */
    }
    if (rc < 0) {
        pthread_rwlock_wrlock(&s->var_lock);
        while (k-- > 0) {
            s->var_dev[p->var[idx[k]]].writing--;
            wf_tensor_release(in[k]);
        }
        pthread_rwlock_unlock(&s->var_lock);
    }
    return rc;
}

void wf__var_device_written(wf__slot *sl, int i, bool ok)
{
    const wf__plan *p = sl->plan;
    wf_session *s = p->sess;
    const int32_t *idx = p->in_idx + p->in_off[i];
    pthread_rwlock_wrlock(&s->var_lock);
    for (int k = 0; k < p->nodes[i]->op->n_assign; k++) {
        wf__var_dev *vd = &s->var_dev[p->var[idx[k]]];
        vd->writing--;
        if (ok)
            vd->dev_ver = ++vd->ver;
    }
    pthread_rwlock_unlock(&s->var_lock);
}
