/* SPDX-License-Identifier: MIT */
/*
 * beat.c - a thread per upstream, on an interval (beat.h).
 *
 * Locking: 'lock' guards 'stop'; each thread waits on 'cv' between runs.
 * Everything else is immutable once the threads run.
 */
#include "fleet/beat.h"

#include <pthread.h>

#include "alloc.h"
#include "base/config.h"
#include "log.h"
#include "util.h"

struct beat_worker {
    struct beat *b;
    size_t idx;
    pthread_t thread;
};

struct beat {
    const char *name;
    int64_t every_ms;
    beat_fn fn;
    void *arg;
    size_t n;                   /* threads started */
    struct beat_worker t[CONFIG_MAX_UPSTREAMS];
    struct gw_mutex lock;
    pthread_cond_t cv;
    int stop;                   /* guarded by lock */
    _Atomic int stopping;       /* the same, for a run under way */
};

/* A worker's thread: fn for its upstream, every every_ms, until stop. */
static void *
beat_thread(void *arg)
{
    struct beat_worker *t = arg;
    struct beat *b = t->b;
    int64_t next;

    gw_mutex_lock(&b->lock);
    while (!b->stop) {
        next = gw_now_ms() + b->every_ms;
        gw_mutex_unlock(&b->lock);
        b->fn(b->arg, t->idx, &b->stopping);
        gw_mutex_lock(&b->lock);
        while (!b->stop && gw_cond_timedwait(&b->cv, &b->lock, next) == 0)
            ;
    }
    gw_mutex_unlock(&b->lock);
    return NULL;
}

struct beat *
beat_start(const char *name, size_t n, int64_t every_ms, beat_fn fn,
           void *arg)
{
    struct beat *b;
    int err;

    if (n > CONFIG_MAX_UPSTREAMS)
        return NULL;
    b = gw_calloc(1, sizeof(*b));
    if (b == NULL)
        return NULL;
    b->name = name;
    b->every_ms = every_ms;
    b->fn = fn;
    b->arg = arg;
    gw_mutex_init(&b->lock);
    gw_cond_init(&b->cv);
    for (size_t i = 0; i < n; i++) {
        b->t[i].b = b;
        b->t[i].idx = i;
        err = pthread_create(&b->t[i].thread, NULL, beat_thread, &b->t[i]);
        if (err != 0) {
            log_errno(GW_LOG_ERROR, err, "%s: pthread_create", name);
            beat_free(b);
            return NULL;
        }
        b->n++;
    }
    return b;
}

void
beat_free(struct beat *b)
{
    if (b == NULL)
        return;
    atomic_store(&b->stopping, 1);
    gw_mutex_lock(&b->lock);
    b->stop = 1;
    pthread_cond_broadcast(&b->cv);
    gw_mutex_unlock(&b->lock);
    for (size_t i = 0; i < b->n; i++)
        pthread_join(b->t[i].thread, NULL);
    pthread_cond_destroy(&b->cv);
    gw_mutex_destroy(&b->lock);
    gw_free(b);
}
