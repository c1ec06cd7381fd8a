/* devices/event.c: events, shared by every device.
 * Owns: the ticket counters behind record, query and wait (devices/device.h states the
 * meaning); a device decides when its tickets complete.
 * Invariant: 'completed' <= 'recorded', both only grow, both under 'mu'.
 * Not here: when a device completes its work (each device's file). */
#include "../core/error.h"
#include "device.h"

#include <errno.h>
#include <stdlib.h>
#include <time.h>

int wf__event_create(wf_device *d, wf_event **out)
{
    *out = NULL;
    wf_event *e = calloc(1, sizeof *e);
    if (!e)
        return wf__err(WF_ENOMEM, "%s: no memory for an event", d ? d->info.name : "device");
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&e->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&e->mu, NULL);
    e->dev = d;
    *out = e;
    return 0;
}

void wf__event_destroy(wf_event *e)
{
    if (!e)
        return;
    pthread_cond_destroy(&e->cv);
    pthread_mutex_destroy(&e->mu);
    free(e);
}

uint64_t wf__event_record(wf_event *e)
{
    pthread_mutex_lock(&e->mu);
    uint64_t t = ++e->recorded;
    pthread_mutex_unlock(&e->mu);
    return t;
}

void wf__event_complete(wf_event *e, uint64_t ticket)
{
    pthread_mutex_lock(&e->mu);
    if (ticket > e->completed) {
        e->completed = ticket;
        pthread_cond_broadcast(&e->cv);
    }
    pthread_mutex_unlock(&e->mu);
}

int wf__event_query(wf_event *e)
{
    pthread_mutex_lock(&e->mu);
    int done = e->completed >= e->recorded;
    pthread_mutex_unlock(&e->mu);
    return done;
}

int wf__event_sync(wf_event *e, uint64_t timeout_ns)
{
    if (!e)
        return wf__err(WF_EINVAL, "wf_event: event is NULL");
    struct timespec dl;
    clock_gettime(CLOCK_MONOTONIC, &dl);
    uint64_t ns = (uint64_t)dl.tv_nsec + timeout_ns;
    dl.tv_sec += (time_t)(ns / 1000000000u);
    dl.tv_nsec = (long)(ns % 1000000000u);
    int rc = 0;
    pthread_mutex_lock(&e->mu);
    uint64_t want = e->recorded;
    while (e->completed < want) {
        if (!timeout_ns) {
            pthread_cond_wait(&e->cv, &e->mu);
        } else if (pthread_cond_timedwait(&e->cv, &e->mu, &dl) == ETIMEDOUT &&
                   e->completed < want) {
            rc = wf__err(WF_ETIMEDOUT,
                         "%s: event not complete after %.3f s (record %llu, completed %llu)",
                         e->dev ? e->dev->info.name : "device", (double)timeout_ns / 1e9,
                         (unsigned long long)want, (unsigned long long)e->completed);
            break;
        }
    }
    pthread_mutex_unlock(&e->mu);
    return rc;
}
