/* sched/poll.c: file descriptors watched for actors.
 * Owns: the runtime's epoll set, its thread ("weft-poll", started at the first watch and
 * asleep in epoll_wait otherwise), and one watch record per (actor, fd).
 * Invariant: a record's 'active' flag changes, and pokes are sent, only under 'mu'; so after
 * wf_actor_unwatch_fd() returns, no poke for that watch can follow, even for an event that
 * epoll had already returned. Records are freed with the runtime (an fd is usually watched
 * again and again, so its record is reused).
 * Not here: what the actor does when poked (actor.c). */
#include "internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

typedef struct wf__watch {
    struct wf__watch *next;
    wf_actor *actor;
    int fd;
    bool active;
} wf__watch;

struct wf__poller {
    pthread_mutex_t mu;
    int epfd, stopfd;
    pthread_t thread;
    bool started;
    wf__watch *watches;
};

static void *poll_main(void *arg)
{
    wf__poller *p = arg;
    struct epoll_event ev[32];
    for (;;) {
        int n = epoll_wait(p->epfd, ev, 32, -1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            break;
        bool stop = false;
        pthread_mutex_lock(&p->mu);
        for (int i = 0; i < n; i++) {
            wf__watch *w = ev[i].data.ptr;
            if (!w) {
                stop = true;
                continue;
            }
            if (w->active) {
                w->active = false;               /* EPOLLONESHOT disarmed it; a new watch re-arms */
                if (wf_actor_poke(w->actor) < 0) /* only for a NULL actor: not here */
                    WF_ASSERT(0);
            }
        }
        pthread_mutex_unlock(&p->mu);
        if (stop)
            break;
    }
    return NULL;
}

static int start(wf_runtime *rt)
{
    wf__poller *p = calloc(1, sizeof *p);
    if (!p)
        return wf__err(WF_ENOMEM, "wf_actor_watch_fd: no memory");
    pthread_mutex_init(&p->mu, NULL);
    p->epfd = epoll_create1(EPOLL_CLOEXEC);
    p->stopfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    struct epoll_event ev = { .events = EPOLLIN, .data.ptr = NULL };
    if (p->epfd < 0 || p->stopfd < 0 || epoll_ctl(p->epfd, EPOLL_CTL_ADD, p->stopfd, &ev) < 0) {
        int e = errno;
        if (p->epfd >= 0)
            close(p->epfd);
        if (p->stopfd >= 0)
            close(p->stopfd);
        free(p);
        return wf__err_errno(e, "wf_actor_watch_fd: epoll");
    }
    int e = pthread_create(&p->thread, NULL, poll_main, p);
    if (e) {
        close(p->epfd);
        close(p->stopfd);
        free(p);
        return wf__err_errno(e, "wf_actor_watch_fd: pthread_create");
    }
    pthread_setname_np(p->thread, "weft-poll");
    p->started = true;
    rt->poller = p;
    return 0;
}

int wf_actor_watch_fd(wf_actor *a, int fd, uint32_t events)
{
    if (!a || fd < 0 || !(events & (WF_FD_READ | WF_FD_WRITE)) ||
        (events & ~(uint32_t)(WF_FD_READ | WF_FD_WRITE)))
        return wf__err(WF_EINVAL, "wf_actor_watch_fd: %s",
                       !a       ? "actor is NULL"
                       : fd < 0 ? "fd is negative"
                                : "events must be WF_FD_READ and/or WF_FD_WRITE");
    wf_runtime *rt = wf__actor_runtime(a);
    pthread_mutex_lock(&rt->poll_mu);
    int rc = rt->poller ? 0 : start(rt);
    if (rc < 0) {
        pthread_mutex_unlock(&rt->poll_mu);
        return rc;
    }
    wf__poller *p = rt->poller;
    pthread_mutex_unlock(&rt->poll_mu);

    pthread_mutex_lock(&p->mu);
    wf__watch *w = p->watches, *spare = NULL;
    for (; w && !(w->actor == a && w->fd == fd); w = w->next)
        if (!w->actor)
            spare = w;
    if (!w && spare) {
        w = spare;
        w->actor = a;
        w->fd = fd;
    }
    bool fresh = !w;
    if (fresh) {
        w = calloc(1, sizeof *w);
        if (!w) {
            pthread_mutex_unlock(&p->mu);
            return wf__err(WF_ENOMEM, "wf_actor_watch_fd: no memory");
        }
        w->actor = a;
        w->fd = fd;
    }
    struct epoll_event ev = {
        .events = EPOLLONESHOT | ((events & WF_FD_READ) ? EPOLLIN | EPOLLRDHUP : 0) |
                  ((events & WF_FD_WRITE) ? EPOLLOUT : 0),
        .data.ptr = w,
    };
    /* A record may exist with its fd already removed from epoll (after an unwatch). */
    int r = epoll_ctl(p->epfd, EPOLL_CTL_MOD, fd, &ev);
    if (r < 0 && errno == ENOENT)
        r = epoll_ctl(p->epfd, EPOLL_CTL_ADD, fd, &ev);
    if (r < 0) {
        int e = errno;
        if (fresh)
            free(w);
        pthread_mutex_unlock(&p->mu);
        return wf__err(WF_ESYS, "wf_actor_watch_fd: fd %d: %s", fd, strerror(e));
    }
    w->active = true;
    if (fresh) {
        w->next = p->watches;
        p->watches = w;
    }
    pthread_mutex_unlock(&p->mu);
    return 0;
}

int wf_actor_unwatch_fd(wf_actor *a, int fd)
{
    if (!a || fd < 0)
        return wf__err(WF_EINVAL, "wf_actor_unwatch_fd: %s",
                       a ? "fd is negative" : "actor is NULL");
    wf_runtime *rt = wf__actor_runtime(a);
    pthread_mutex_lock(&rt->poll_mu);
    wf__poller *p = rt->poller;
    pthread_mutex_unlock(&rt->poll_mu);
    if (!p)
        return 0;
    pthread_mutex_lock(&p->mu);
    for (wf__watch *w = p->watches; w; w = w->next) {
        if (w->actor == a && w->fd == fd) {
            w->active = false;
            epoll_ctl(p->epfd, EPOLL_CTL_DEL, fd, NULL); /* ENOENT/EBADF: already gone */
            w->actor = NULL; /* the record may be reused by another (actor, fd) */
            w->fd = -1;
        }
    }
    pthread_mutex_unlock(&p->mu);
    return 0;
}

void wf__poll_stop(wf_runtime *rt)
{
    wf__poller *p = rt->poller;
    if (!p)
        return;
    uint64_t one = 1;
    if (write(p->stopfd, &one, sizeof one) < 0) {
        /* An eventfd write only fails if the counter would overflow: it is then readable. */
    }
    pthread_join(p->thread, NULL);
    close(p->epfd);
    close(p->stopfd);
    while (p->watches) {
        wf__watch *w = p->watches;
        p->watches = w->next;
        free(w);
    }
    pthread_mutex_destroy(&p->mu);
    free(p);
    rt->poller = NULL;
}
