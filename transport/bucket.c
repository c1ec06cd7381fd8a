/* transport/bucket.c: gradient buckets: many small tensors packed into one buffer, whose
 * all-reduce runs on a thread of the bucket ("weft-bucket") while the caller goes on.
 * A bucket is a queue of jobs. The caller fills the current job (copying each tensor into
 * its buffer) and hands it over when the next tensor would not fit; a tensor larger than a
 * buffer is a job of its own, all-reduced in place. The thread takes jobs in order,
 * all-reduces each (wf_comm_allreduce: a collective, so every rank's thread takes the same
 * jobs in the same order) and copies the result back into the tensors. Finished jobs keep
 * their buffers for the next step.
 * Failure: the first error (the comm failed: a rank died, a deadline passed) is kept with
 * its message; later jobs are not all-reduced, and every call returns that error.
 * Waits: a caller waiting for the thread (wf_comm_bucket_wait, _destroy) returns only once
 * the thread is done with every job handed over, since the thread writes into the caller's
 * tensors. That ends because each all-reduce has the comm's deadline and returns once the
 * comm fails; the caller's wait has a deadline of its own too (wait_idle): no job finished
 * within op_timeout_ms and a second fails the comm, which stops the all-reduce at once.
 * Invariants: 'mu' guards the queue, 'in_flight', the free list and the error; 'cur' is the
 * caller's alone. Lock order: 'mu' is never held while calling the comm.
 * Not here: the collectives themselves (coll.c). */
#include "../memory/huge.h"
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DEFAULT_BUCKET_BYTES (25u << 20)

typedef struct entry {
    void *data;
    size_t count;
} entry;

typedef struct job {
    struct job *next;
    uint8_t *buf;  /* the packed copy (cap_bytes; kept when the job is reused) */
    bool in_place; /* all-reduce ents[0] itself, not 'buf' (every rank must agree: never
                      inferred from 'buf', which depends on which spare job was taken) */
    size_t count;  /* elements in 'buf' */
    entry *ents;   /* the tensors, in order */
    size_t n_ents, cap_ents;
    uint32_t seq; /* which bucket of the object's life (messages) */
} job;

struct wf_comm_bucket {
    wf_comm *c;
    wf_dtype dt;
    wf_reduce_op op;
    size_t es, cap_bytes;
    uint32_t seq;
    job *cur; /* the caller's: being filled */

    pthread_mutex_t mu;
    pthread_cond_t cv;
    job *head, *tail; /* (mu) handed over, not taken yet */
    job *spare;       /* (mu) finished jobs, kept for reuse */
    int in_flight;    /* (mu) handed over and not finished */
    int err;          /* (mu) the first error, or 0 */
    uint32_t running; /* (mu) the seq of the job being all-reduced, or 0 */
    char errmsg[WF_ERRMSG_MAX];
    bool stop; /* (mu) */
    pthread_t thread;
};

static void job_free(job *j)
{
    if (!j)
        return;
    free(j->buf);
    free(j->ents);
    free(j);
}

/* Returns the first error, with its message as this thread's. */
static int sticky(wf_comm_bucket *b)
{
    pthread_mutex_lock(&b->mu);
    int err = b->err;
    char msg[WF_ERRMSG_MAX];
    if (err)
        snprintf(msg, sizeof msg, "%s", b->errmsg);
    pthread_mutex_unlock(&b->mu);
    return err ? wf__err(err, "%s", msg) : 0;
}

static void *bucket_main(void *arg)
{
    wf_comm_bucket *b = arg;
    pthread_setname_np(pthread_self(), "weft-bucket");
    pthread_mutex_lock(&b->mu);
    for (;;) {
        while (!b->head && !b->stop)
            pthread_cond_wait(&b->cv, &b->mu);
        if (!b->head)
            break;
        job *j = b->head;
        b->head = j->next;
        if (!b->head)
            b->tail = NULL;
        b->running = j->seq;
        int rc = b->err;
        pthread_mutex_unlock(&b->mu);

        char msg[WF_ERRMSG_MAX] = "";
        if (rc == 0) {
            void *p = j->in_place ? j->ents[0].data : (void *)j->buf;
            size_t n = j->in_place ? j->ents[0].count : j->count;
            rc = wf_comm_allreduce(b->c, p, p, n, b->dt, b->op);
            if (rc < 0)
                snprintf(msg, sizeof msg, "bucket %u (%zu tensors, %zu x %s): %s", j->seq,
                         j->n_ents, n, wf_dtype_name(b->dt), wf_last_errmsg());
        }
        if (rc == 0 && !j->in_place) {
            size_t off = 0;
            for (size_t i = 0; i < j->n_ents; i++) {
                memcpy(j->ents[i].data, j->buf + off * b->es, j->ents[i].count * b->es);
                off += j->ents[i].count;
            }
        }

        pthread_mutex_lock(&b->mu);
        if (rc < 0 && !b->err) {
            b->err = rc;
            snprintf(b->errmsg, sizeof b->errmsg, "%s", msg);
        }
        b->running = 0;
        j->n_ents = 0;
        j->count = 0;
        j->next = b->spare;
        b->spare = j;
        b->in_flight--;
        pthread_cond_broadcast(&b->cv);
    }
    pthread_mutex_unlock(&b->mu);
    return NULL;
}

int wf_comm_bucket_create(wf_comm *c, const wf_bucket_opts *o, wf_comm_bucket **out)
{
    if (out)
        *out = NULL;
    if (!c || !o || !out)
        return wf__err(WF_EINVAL, "wf_comm_bucket_create: NULL %s",
                       !c   ? "comm"
                       : !o ? "opts"
                            : "out");
    wf_dtype dt = o->dtype;
    if (dt != WF_F32 && dt != WF_F64 && dt != WF_I32 && dt != WF_I64 && dt != WF_BF16)
        return wf__err(WF_EINVAL,
                       "wf_comm_bucket_create: dtype %s cannot be reduced (f32, f64, i32, i64, "
                       "bf16)",
                       wf_dtype_name(dt));
    wf_reduce_op op = o->op ? o->op : WF_REDUCE_SUM;
    if (op != WF_REDUCE_SUM && op != WF_REDUCE_MEAN && op != WF_REDUCE_MAX)
        return wf__err(WF_EINVAL, "wf_comm_bucket_create: unknown reduce op %d", (int)op);
    wf_comm_bucket *b = calloc(1, sizeof *b);
    if (!b)
        return wf__err(WF_ENOMEM, "wf_comm_bucket_create: out of memory");
    b->c = c;
    b->dt = dt;
    b->op = op;
    b->es = wf_dtype_size(dt);
    b->cap_bytes = o->bucket_bytes ? o->bucket_bytes : DEFAULT_BUCKET_BYTES;
    if (b->cap_bytes < b->es)
        b->cap_bytes = b->es;
    pthread_mutex_init(&b->mu, NULL);
    pthread_condattr_t ca; /* wait_idle's slices are on CLOCK_MONOTONIC */
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&b->cv, &ca);
    pthread_condattr_destroy(&ca);
    int e = pthread_create(&b->thread, NULL, bucket_main, b);
    if (e != 0) {
        pthread_cond_destroy(&b->cv);
        pthread_mutex_destroy(&b->mu);
        free(b);
        return wf__err(WF_ESYS, "wf_comm_bucket_create: cannot start a thread: %s", strerror(e));
    }
    *out = b;
    return 0;
}

/* A job to fill: a spare one, or a new one (with a buffer when 'packed'). */
static job *take_job(wf_comm_bucket *b, bool packed)
{
    pthread_mutex_lock(&b->mu);
    job *j = b->spare, **pp = &b->spare;
    /* A packed job wants a buffer, an in-place one does not care. */
    while (j && packed && !j->buf) {
        pp = &j->next;
        j = j->next;
    }
    if (j)
        *pp = j->next;
    pthread_mutex_unlock(&b->mu);
    if (!j && !(j = calloc(1, sizeof *j)))
        return NULL;
    /* On huge pages: the single-copy all-reduce pins each page it copies (memory/huge.h). */
    if (packed && !j->buf && !(j->buf = wf__alloc_huge(b->cap_bytes))) {
        job_free(j);
        return NULL;
    }
    j->next = NULL;
    j->in_place = !packed;
    j->seq = ++b->seq;
    return j;
}

static int push_entry(job *j, void *data, size_t count)
{
    if (j->n_ents == j->cap_ents) {
        size_t cap = j->cap_ents ? j->cap_ents * 2 : 16;
        entry *e = realloc(j->ents, cap * sizeof *e);
        if (!e)
            return wf__err(WF_ENOMEM, "wf_comm_bucket_add: out of memory");
        j->ents = e;
        j->cap_ents = cap;
    }
    j->ents[j->n_ents++] = (entry){ data, count };
    return 0;
}

static void hand_over(wf_comm_bucket *b, job *j)
{
    pthread_mutex_lock(&b->mu);
    if (b->tail)
        b->tail->next = j;
    else
        b->head = j;
    b->tail = j;
    b->in_flight++;
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
}

int wf_comm_bucket_flush(wf_comm_bucket *b)
{
    if (!b)
        return wf__err(WF_EINVAL, "wf_comm_bucket_flush: NULL bucket");
    int rc = sticky(b);
    if (rc < 0)
        return rc;
    if (b->cur && b->cur->n_ents) {
        hand_over(b, b->cur);
        b->cur = NULL;
    }
    return 0;
}

int wf_comm_bucket_add(wf_comm_bucket *b, void *data, size_t count)
{
    if (!b)
        return wf__err(WF_EINVAL, "wf_comm_bucket_add: NULL bucket");
    if (!data && count)
        return wf__err(WF_EINVAL, "wf_comm_bucket_add: NULL data for %zu elements of %s", count,
                       wf_dtype_name(b->dt));
    if (count > SIZE_MAX / b->es)
        return wf__err(WF_EINVAL, "wf_comm_bucket_add: %zu elements of %s overflow", count,
                       wf_dtype_name(b->dt));
    int rc = sticky(b);
    if (rc < 0 || count == 0)
        return rc;
    size_t bytes = count * b->es;
    if (b->cur && (b->cur->count * b->es + bytes > b->cap_bytes))
        if ((rc = wf_comm_bucket_flush(b)) < 0)
            return rc;
    if (bytes > b->cap_bytes) { /* alone, in place */
        job *j = take_job(b, false);
        if (!j || push_entry(j, data, count) < 0) {
            if (j) {
                pthread_mutex_lock(&b->mu);
                j->next = b->spare;
                b->spare = j;
                pthread_mutex_unlock(&b->mu);
            }
            return wf__err(WF_ENOMEM, "wf_comm_bucket_add: out of memory");
        }
        hand_over(b, j);
        return 0;
    }
    if (!b->cur && !(b->cur = take_job(b, true)))
        return wf__err(WF_ENOMEM, "wf_comm_bucket_add: no memory for a %zu-byte bucket",
                       b->cap_bytes);
    if ((rc = push_entry(b->cur, data, count)) < 0)
        return rc;
    memcpy(b->cur->buf + b->cur->count * b->es, data, bytes);
    b->cur->count += count;
    return 0;
}

int wf_comm_bucket_test(wf_comm_bucket *b)
{
    if (!b)
        return wf__err(WF_EINVAL, "wf_comm_bucket_test: NULL bucket");
    pthread_mutex_lock(&b->mu);
    int idle = b->in_flight == 0;
    pthread_mutex_unlock(&b->mu);
    return idle;
}

/* Waits (holding 'mu') until the thread has finished every job handed over; see "Waits" at
 * the top. 'fn' names the caller in the message of a comm it fails. */
static void wait_idle(wf_comm_bucket *b, const char *fn)
{
    wf_comm *c = b->c;
    uint64_t limit = ((uint64_t)c->op_timeout_ms + 1000u) * 1000000u;
    uint64_t last = wf__net_now_ns();
    int left = b->in_flight;
    bool failed_it = false;
    while (b->in_flight > 0) {
        uint64_t until = wf__net_now_ns() + 100000000u; /* a slice: check the deadline */
        struct timespec ts = { .tv_sec = (time_t)(until / 1000000000u),
                               .tv_nsec = (long)(until % 1000000000u) };
        pthread_cond_timedwait(&b->cv, &b->mu, &ts);
        uint64_t now = wf__net_now_ns();
        if (b->in_flight < left) { /* a job finished: the thread is moving */
            left = b->in_flight;
            last = now;
        }
        if (!failed_it && b->in_flight > 0 && now - last > limit) {
            failed_it = true;
            uint32_t seq = b->running;
            int n = b->in_flight;
            pthread_mutex_unlock(&b->mu); /* never held while calling the comm */
            wf__comm_fail(c, WF_ETIMEDOUT, -1,
                          "%s: rank %d: no bucket all-reduce finished within %llu ms (bucket %u "
                          "running, %d in flight)",
                          fn, c->rank, (unsigned long long)((now - last) / 1000000u), seq, n);
            pthread_mutex_lock(&b->mu);
        }
    }
}

int wf_comm_bucket_wait(wf_comm_bucket *b)
{
    if (!b)
        return wf__err(WF_EINVAL, "wf_comm_bucket_wait: NULL bucket");
    int rc = wf_comm_bucket_flush(b);
    if (rc < 0)
        return rc;
    pthread_mutex_lock(&b->mu);
    wait_idle(b, "wf_comm_bucket_wait");
    pthread_mutex_unlock(&b->mu);
    return sticky(b);
}

void wf_comm_bucket_destroy(wf_comm_bucket *b)
{
    if (!b)
        return;
    if (b->cur && b->cur->n_ents == 0) { /* an empty current job is a spare */
        b->cur->next = NULL;
        job_free(b->cur);
        b->cur = NULL;
    }
    /* What was added but not handed over is dropped; what is in flight finishes. */
    job_free(b->cur);
    pthread_mutex_lock(&b->mu);
    wait_idle(b, "wf_comm_bucket_destroy");
    b->stop = true;
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
    pthread_join(b->thread, NULL);
    while (b->spare) {
        job *j = b->spare;
        b->spare = j->next;
        job_free(j);
    }
    pthread_cond_destroy(&b->cv);
    pthread_mutex_destroy(&b->mu);
    free(b);
}
