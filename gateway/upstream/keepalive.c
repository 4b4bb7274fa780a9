/* SPDX-License-Identifier: MIT */
/*
 * keepalive.c - idle upstream sessions, their checks and the reaper
 * (keepalive.h).
 *
 * Design: one stack of entries per upstream, newest on top, so taking
 * hands out the connection used last, the most likely still open, and
 * the oldest sit at the bottom, where the reaper and a full stack drop
 * them.  A stack is at most max_idle entries (32 by default), so moving
 * them down one place when the bottom one goes costs nothing worth a
 * ring buffer.
 *
 * The reaper copies the idle descriptors out under the lock, polls them
 * without it, and removes the readable ones only if they are still idle
 * (same session, same connection, same idle stamp): a session taken and
 * put back meanwhile was checked by its taker.
 *
 * Locking: 'lock' guards 'stack', 'n' and 'stop'.  The scratch
 * arrays belong to the reaper thread.  Drops run without the lock.
 */
#include "upstream/keepalive.h"

#include <assert.h>
#include <poll.h>
#include <pthread.h>
#include <string.h>

#include "alloc.h"
#include "log.h"
#include "base/metrics.h"
#include "util.h"

struct ka_entry {
    void *session;              /* owned while here */
    int fd;                     /* its connection, to poll */
    int64_t since_ms;           /* idle since */
    size_t idx;                 /* its upstream (in the reaper's copy) */
};

struct keepalive {
    size_t num_upstreams;       /* immutable */
    uint64_t max_idle;          /* immutable */
    int64_t idle_timeout_ms;    /* immutable */
    keepalive_drop_fn *drop;    /* immutable */

    struct gw_mutex lock;
    pthread_cond_t cv;          /* wakes the reaper to stop */
    struct ka_entry *stack;     /* [num_upstreams][max_idle]; guarded */
    size_t *n;                  /* [num_upstreams] entries in each */
    int stop;

    int reaping;                /* the thread was started */
    pthread_t reaper;
    struct ka_entry *copy;      /* reaper's: [num_upstreams * max_idle] */
    struct pollfd *pfd;         /* reaper's: the same size */
};

/* Upstream idx's stack: its bottom entry. */
static struct ka_entry *
stack_of(struct keepalive *k, size_t idx)
{
    return &k->stack[idx * k->max_idle];
}

/* Remove entry 'i' of upstream idx's stack (under the lock). */
static void
remove_locked(struct keepalive *k, size_t idx, size_t i)
{
    struct ka_entry *s = stack_of(k, idx);

    assert(gw_mutex_held(&k->lock));
    memmove(&s[i], &s[i + 1], (k->n[idx] - i - 1) * sizeof(*s));
    k->n[idx]--;
    metrics_keepalive_idle_add(-1);
}

/* Is the connection quiet: nothing to read, no hang-up, no error? */
static int
quiet(int fd)
{
    struct pollfd p = { fd, POLLIN, 0 };

    return poll(&p, 1, 0) == 0;
}

static void
drop(struct keepalive *k, void *session, enum metrics_keepalive_close why)
{
    metrics_keepalive_closed(why);
    k->drop(session);
}

/*
 * One look at every idle session: the ones idle too long, then the ones
 * whose connection turned readable.
 */
static void
reap(struct keepalive *k)
{
    int64_t now = gw_now_ms();
    size_t nold = 0, ncopy = 0, i, idx, j;
    struct ka_entry *s, *old = k->copy;
    struct ka_entry *live;
    int ready, found;

    /* Expired ones go first: they are the bottom of each stack. */
    gw_mutex_lock(&k->lock);
    for (idx = 0; idx < k->num_upstreams; idx++) {
        s = stack_of(k, idx);
        while (k->n[idx] > 0 && now - s[0].since_ms >= k->idle_timeout_ms) {
            old[nold++] = s[0];
            remove_locked(k, idx, 0);
        }
    }
    live = &k->copy[nold];
    for (idx = 0; idx < k->num_upstreams; idx++) {
        s = stack_of(k, idx);
        for (i = 0; i < k->n[idx]; i++) {
            live[ncopy] = s[i];
            live[ncopy].idx = idx;
            k->pfd[ncopy].fd = s[i].fd;
            k->pfd[ncopy].events = POLLIN;
            k->pfd[ncopy].revents = 0;
            ncopy++;
        }
    }
    gw_mutex_unlock(&k->lock);
    for (i = 0; i < nold; i++)
        drop(k, old[i].session, METRICS_KEEPALIVE_TIMEOUT);
    if (ncopy == 0)
        return;

    ready = poll(k->pfd, (nfds_t)ncopy, 0);
    if (ready <= 0)
        return;                         /* none, or EINTR: next time */
    for (i = 0; i < ncopy; i++) {
        if (k->pfd[i].revents == 0)
            continue;
        found = 0;
        idx = live[i].idx;
        gw_mutex_lock(&k->lock);
        s = stack_of(k, idx);
        for (j = 0; j < k->n[idx] && !found; j++) {
            if (s[j].session == live[i].session && s[j].fd == live[i].fd
                && s[j].since_ms == live[i].since_ms) {
                remove_locked(k, idx, j);
                found = 1;
            }
        }
        gw_mutex_unlock(&k->lock);
        if (found)
            drop(k, live[i].session, METRICS_KEEPALIVE_STALE);
    }
}

/* The reaper's thread: reap() every KEEPALIVE_CHECK_MS until 'stop'. */
static void *
reaper_thread(void *arg)
{
    struct keepalive *k = arg;
    int64_t next;

    gw_mutex_lock(&k->lock);
    while (!k->stop) {
        next = gw_now_ms() + KEEPALIVE_CHECK_MS;
        while (!k->stop && gw_cond_timedwait(&k->cv, &k->lock, next) == 0)
            ;
        if (k->stop)
            break;
        gw_mutex_unlock(&k->lock);
        reap(k);
        gw_mutex_lock(&k->lock);
    }
    gw_mutex_unlock(&k->lock);
    return NULL;
}

struct keepalive *
keepalive_new(size_t num_upstreams, uint64_t max_idle,
              int64_t idle_timeout_ms, keepalive_drop_fn *drop_fn)
{
    struct keepalive *k = NULL;
    struct keepalive *ret = NULL;
    size_t slots;
    int err;

    k = gw_calloc(1, sizeof(*k));
    if (k == NULL)
        goto out;
    gw_mutex_init(&k->lock);
    gw_cond_init(&k->cv);
    k->num_upstreams = num_upstreams;
    k->max_idle = max_idle;
    k->idle_timeout_ms = idle_timeout_ms;
    k->drop = drop_fn;
    /* Both factors are bounded by config.c (64 upstreams, keepalive). */
    slots = num_upstreams * (size_t)max_idle;
    k->n = gw_calloc(num_upstreams > 0 ? num_upstreams : 1, sizeof(*k->n));
    if (k->n == NULL)
        goto out;
    if (slots > 0) {
        k->stack = gw_calloc(slots, sizeof(*k->stack));
        k->copy = gw_calloc(slots, sizeof(*k->copy));
        k->pfd = gw_calloc(slots, sizeof(*k->pfd));
        if (k->stack == NULL || k->copy == NULL || k->pfd == NULL)
            goto out;
        err = pthread_create(&k->reaper, NULL, reaper_thread, k);
        if (err != 0) {
            log_errno(GW_LOG_ERROR, err, "keepalive: pthread_create");
            goto out;
        }
        k->reaping = 1;
    }
    ret = k;
    k = NULL;

out:
    keepalive_free(k);
    return ret;
}

void
keepalive_free(struct keepalive *k)
{
    size_t idx;
    struct ka_entry *s;

    if (k == NULL)
        return;
    if (k->reaping) {
        gw_mutex_lock(&k->lock);
        k->stop = 1;
        pthread_cond_signal(&k->cv);
        gw_mutex_unlock(&k->lock);
        pthread_join(k->reaper, NULL);
    }
    /* No other thread is left, but remove_locked() wants the lock, and
     * a drop goes without it, as everywhere. */
    for (idx = 0; idx < k->num_upstreams && k->stack != NULL; idx++) {
        for (;;) {
            void *session = NULL;

            gw_mutex_lock(&k->lock);
            if (k->n[idx] > 0) {
                s = stack_of(k, idx);
                session = s[k->n[idx] - 1].session;
                remove_locked(k, idx, k->n[idx] - 1);
            }
            gw_mutex_unlock(&k->lock);
            if (session == NULL)
                break;
            k->drop(session);
        }
    }
    gw_free(k->stack);
    gw_free(k->copy);
    gw_free(k->pfd);
    gw_free(k->n);
    pthread_cond_destroy(&k->cv);
    gw_mutex_destroy(&k->lock);
    gw_free(k);
}

void *
keepalive_take(struct keepalive *k, size_t idx)
{
    struct ka_entry e;
    int64_t now = gw_now_ms();

    assert(idx < k->num_upstreams);
    for (;;) {
        gw_mutex_lock(&k->lock);
        if (k->n[idx] == 0) {
            gw_mutex_unlock(&k->lock);
            return NULL;
        }
        e = stack_of(k, idx)[k->n[idx] - 1];
        remove_locked(k, idx, k->n[idx] - 1);
        gw_mutex_unlock(&k->lock);
        if (now - e.since_ms >= k->idle_timeout_ms)
            drop(k, e.session, METRICS_KEEPALIVE_TIMEOUT);
        else if (!quiet(e.fd))
            drop(k, e.session, METRICS_KEEPALIVE_STALE);
        else
            return e.session;
    }
}

void
keepalive_put(struct keepalive *k, size_t idx, void *session, int fd)
{
    struct ka_entry *s, victim = { NULL, -1, 0, 0 };

    assert(idx < k->num_upstreams && session != NULL);
    if (k->max_idle == 0) {
        drop(k, session, METRICS_KEEPALIVE_FULL);
        return;
    }
    gw_mutex_lock(&k->lock);
    s = stack_of(k, idx);
    if (k->n[idx] == k->max_idle) {
        victim = s[0];
        remove_locked(k, idx, 0);
    }
    s[k->n[idx]].session = session;
    s[k->n[idx]].fd = fd;
    s[k->n[idx]].since_ms = gw_now_ms();
    s[k->n[idx]].idx = idx;
    k->n[idx]++;
    metrics_keepalive_idle_add(1);
    gw_mutex_unlock(&k->lock);
    if (victim.session != NULL)
        drop(k, victim.session, METRICS_KEEPALIVE_FULL);
}
