/*
 * flight.c - the shared, append-only response of one upstream call.
 */
#include "flight.h"

#include <assert.h>
#include <stdio.h>
#include <string.h>

#include "alloc.h"

struct flight *
flight_new(const unsigned char key[FLIGHT_KEY_LEN])
{
    struct flight *f = gw_calloc(1, sizeof(*f));

    if (f == NULL)
        return NULL;
    memcpy(f->key, key, FLIGHT_KEY_LEN);
    gw_mutex_init(&f->lock);
    gw_cond_init(&f->cv);
    f->content_length = -1;
    f->state = FLIGHT_RUNNING;
    f->refs = 1;
    return f;
}

void
flight_ref(struct flight *f)
{
    gw_mutex_lock(&f->lock);
    f->refs++;
    gw_mutex_unlock(&f->lock);
}

void
flight_unref(struct flight *f)
{
    unsigned left;

    if (f == NULL)
        return;
    gw_mutex_lock(&f->lock);
    assert(f->refs > 0);
    left = --f->refs;
    gw_mutex_unlock(&f->lock);
    if (left > 0)
        return;
    /* Nobody else can reach the flight any more: no lock needed. */
    for (size_t i = 0; i < f->nchunks; i++)
        gw_free(f->chunks[i]);
    gw_free(f->chunks);
    pthread_cond_destroy(&f->cv);
    gw_mutex_destroy(&f->lock);
    gw_free(f);
}

void
flight_set_head(struct flight *f, int status, const char *content_type,
                int64_t content_length)
{
    gw_mutex_lock(&f->lock);
    assert(!f->head_set);
    f->status = status;
    snprintf(f->content_type, sizeof(f->content_type), "%s",
             content_type != NULL ? content_type : "");
    f->content_length = content_length;
    f->head_set = 1;
    pthread_cond_broadcast(&f->cv);
    gw_mutex_unlock(&f->lock);
}

int
flight_append(struct flight *f, const char *p, size_t n, size_t max_bytes)
{
    struct flight_chunk *c, **v;
    size_t size;

    if (gw_add_overflows(sizeof(*c), n, &size))
        return GW_ENOMEM;
    c = gw_malloc(size);            /* allocated outside the lock */
    if (c == NULL)
        return GW_ENOMEM;
    c->len = n;
    memcpy(c->data, p, n);

    gw_mutex_lock(&f->lock);
    if (f->nchunks == f->cap) {
        size_t cap = f->cap > 0 ? f->cap * 2 : 16;

        /* Realloc under the lock: readers copy pointers under it too. */
        v = cap < SIZE_MAX / sizeof(*v)
            ? gw_realloc(f->chunks, cap * sizeof(*v)) : NULL;
        if (v == NULL) {
            gw_mutex_unlock(&f->lock);
            gw_free(c);
            return GW_ENOMEM;
        }
        f->chunks = v;
        f->cap = cap;
    }
    f->chunks[f->nchunks++] = c;
    f->bytes += n;
    if (f->bytes > max_bytes)
        f->joinable = 0;            /* too big to replay to newcomers */
    pthread_cond_broadcast(&f->cv);
    gw_mutex_unlock(&f->lock);
    return 0;
}

const struct flight_chunk *
flight_leader_chunk(const struct flight *f, size_t i)
{
    return f->chunks[i];
}

size_t
flight_leader_nchunks(const struct flight *f)
{
    return f->nchunks;
}

void
flight_finish_locked(struct flight *f, int rc, const char *reason)
{
    assert(gw_mutex_held(&f->lock));
    assert(f->state == FLIGHT_RUNNING);
    f->state = rc == 0 ? FLIGHT_DONE : FLIGHT_FAILED;
    f->err_rc = rc;
    snprintf(f->err_reason, sizeof(f->err_reason), "%s",
             reason != NULL ? reason : "");
    f->joinable = 0;
    pthread_cond_broadcast(&f->cv);
}

/* Is there anything for a reader at 'index'?  Caller holds the lock. */
static int
ready_locked(const struct flight *f, size_t index, int need_head)
{
    if (f->state != FLIGHT_RUNNING)
        return 1;
    if (need_head)
        return f->head_set;
    return f->nchunks > index;
}

int
flight_wait(struct flight *f, size_t index, int need_head, int64_t deadline,
            struct flight_view *v)
{
    int rc = 0;

    gw_mutex_lock(&f->lock);
    while (!ready_locked(f, index, need_head)) {
        rc = gw_cond_timedwait(&f->cv, &f->lock, deadline);
        if (rc != 0)
            break;
    }
    v->head_set = f->head_set;
    v->status = f->status;
    memcpy(v->content_type, f->content_type, sizeof(v->content_type));
    v->content_length = f->content_length;
    v->state = f->state;
    v->err_rc = f->err_rc;
    memcpy(v->err_reason, f->err_reason, sizeof(v->err_reason));
    v->nchunks = f->nchunks;
    v->count = 0;
    while (index + v->count < f->nchunks
           && v->count < GW_ARRAY_LEN(v->chunk)) {
        v->chunk[v->count] = f->chunks[index + v->count];
        v->count++;
    }
    gw_mutex_unlock(&f->lock);
    return rc;
}
