/*
 * flight.c - the shared, append-only response of one upstream call.
 */
#include "flight.h"

#include <assert.h>
#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "metrics.h"

struct flight *
flight_new(const unsigned char key[FLIGHT_KEY_LEN])
{
    struct flight *f = gw_calloc(1, sizeof(*f));

    if (f == NULL)
        return NULL;
    memcpy(f->key, key, FLIGHT_KEY_LEN);
    memcpy(f->id, "flight-", 7);
    gw_random_hex(f->id + 7, FLIGHT_ID_LEN - 7);
    gw_mutex_init(&f->lock);
    f->content_length = -1;
    f->state = FLIGHT_RUNNING;
    atomic_init(&f->refs, 1);
    return f;
}

void
flight_ref(struct flight *f)
{
    atomic_fetch_add_explicit(&f->refs, 1, memory_order_relaxed);
}

void
flight_unref(struct flight *f)
{
    unsigned before;

    if (f == NULL)
        return;
    /* Release our writes; the last one acquires everyone's. */
    before = atomic_fetch_sub_explicit(&f->refs, 1, memory_order_acq_rel);
    assert(before > 0);
    if (before > 1)
        return;
    /* Nobody else can reach the flight any more: no lock needed. */
    for (size_t i = 0; i < f->nchunks; i++)
        gw_free(f->chunks[i]);
    gw_free(f->chunks);
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
        atomic_store(&f->joinable, 0);  /* too big to replay to newcomers */
    gw_mutex_unlock(&f->lock);
    return 0;
}

void
flight_leader_span(const struct flight *f, struct flight_span *s)
{
    s->v = f->chunks;
    s->lo = 0;
    s->hi = f->nchunks;
    s->copy = NULL;
}

int
flight_copy_span(struct flight *f, size_t lo, struct flight_head *h,
                 struct flight_span *s)
{
    size_t n;

    memset(s, 0, sizeof(*s));
    gw_mutex_lock(&f->lock);
    h->status = f->status;
    h->content_length = f->content_length;
    memcpy(h->content_type, f->content_type, sizeof(h->content_type));
    s->lo = s->hi = lo;
    n = f->nchunks > lo ? f->nchunks - lo : 0;
    if (n > 0) {
        s->copy = gw_malloc(n * sizeof(*s->copy));
        if (s->copy == NULL) {
            gw_mutex_unlock(&f->lock);
            return GW_ENOMEM;
        }
        memcpy(s->copy, f->chunks + lo, n * sizeof(*s->copy));
        s->hi = lo + n;
    }
    s->v = s->copy;
    gw_mutex_unlock(&f->lock);
    return 0;
}

void
flight_span_release(struct flight_span *s)
{
    gw_free(s->copy);
    s->copy = NULL;
    s->v = NULL;
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
    atomic_store(&f->joinable, 0);
}

/* ---- readers ---- */

void
flight_reader_init(struct flight_reader *r)
{
    memset(r, 0, sizeof(*r));
    gw_cond_init(&r->cv);
    r->where = FLIGHT_READER_RUNNING;
}

void
flight_reader_destroy(struct flight_reader *r)
{
    assert(r->where == FLIGHT_READER_RUNNING && !r->helper);
    pthread_cond_destroy(&r->cv);
}

static void
park_locked(struct flight *f, struct flight_reader *r)
{
    r->where = FLIGHT_READER_PARKED;
    r->next = NULL;
    r->prev = f->parked_tail;
    if (f->parked_tail != NULL)
        f->parked_tail->next = r;
    else
        f->parked = r;
    f->parked_tail = r;
    f->nparked++;
}

/* Take 'r' out of the parked list; it keeps its 'where'.  Lock held. */
static void
unlink_locked(struct flight *f, struct flight_reader *r)
{
    assert(r->where == FLIGHT_READER_PARKED);
    if (r->prev != NULL)
        r->prev->next = r->next;
    else
        f->parked = r->next;
    if (r->next != NULL)
        r->next->prev = r->prev;
    else
        f->parked_tail = r->prev;
    r->next = r->prev = NULL;
    f->nparked--;
}

/* Its own thread takes 'r' out of the parked list.  Lock held. */
static void
unpark_locked(struct flight *f, struct flight_reader *r)
{
    unlink_locked(f, r);
    r->where = FLIGHT_READER_RUNNING;
    metrics_parked_add(-1);
}

/* Hand a parked or claimed reader back to its thread.  Lock held. */
static void
hand_back_locked(struct flight_reader *r)
{
    r->where = FLIGHT_READER_RUNNING;
    r->next = r->prev = NULL;
    metrics_parked_add(-1);
    pthread_cond_signal(&r->cv);
}

struct flight_reader *
flight_claim(struct flight *f, size_t *count)
{
    struct flight_reader *list, *r;

    gw_mutex_lock(&f->lock);
    list = f->parked;
    for (r = list; r != NULL; r = r->next)
        r->where = FLIGHT_READER_CLAIMED;   /* 'next' links the batch */
    *count = f->nparked;
    f->parked = f->parked_tail = NULL;
    f->nparked = 0;
    gw_mutex_unlock(&f->lock);
    return list;
}

/*
 * Readers parked before the last append are behind; those parked since
 * (on their own, or released caught up) are not, and a parked reader is
 * never further behind than one parked earlier.  So the behind ones are
 * the front of the FIFO.  Lock held.
 */
static int
behind_locked(const struct flight *f, const struct flight_reader *r)
{
    return r != NULL && r->index < f->nchunks;
}

struct flight_reader *
flight_take(struct flight *f, size_t max, size_t *left)
{
    struct flight_reader *list = NULL, **tail = &list, *r;

    gw_mutex_lock(&f->lock);
    for (size_t n = 0; n < max && behind_locked(f, f->parked); n++) {
        r = f->parked;
        unlink_locked(f, r);
        r->where = FLIGHT_READER_CLAIMED;   /* 'next' links the list */
        *tail = r;
        tail = &r->next;
    }
    *left = f->nparked;
    gw_mutex_unlock(&f->lock);
    return list;
}

size_t
flight_call_helpers(struct flight *f, size_t max, size_t per)
{
    struct flight_reader *r;
    size_t n;

    assert(per > 0);
    gw_mutex_lock(&f->lock);
    n = f->nparked / per;       /* all behind, right after an append */
    if (n > max)
        n = max;
    for (size_t i = 0; i < n; i++) {
        r = f->parked;
        if (!behind_locked(f, r)) {
            n = i;
            break;
        }
        unlink_locked(f, r);
        r->helper = 1;
        hand_back_locked(r);
    }
    gw_mutex_unlock(&f->lock);
    return n;
}

void
flight_release(struct flight *f, struct flight_reader *list)
{
    struct flight_reader *r, *next;

    if (list == NULL)
        return;
    gw_mutex_lock(&f->lock);
    for (r = list; r != NULL; r = next) {
        next = r->next;
        assert(r->where == FLIGHT_READER_CLAIMED);
        if (r->parkable && f->state == FLIGHT_RUNNING
            && r->index == f->nchunks) {
            park_locked(f, r);          /* caught up: sleeps on */
            if (r->waiting)
                pthread_cond_signal(&r->cv);    /* its wait timed out */
        } else {
            hand_back_locked(r);
        }
    }
    gw_mutex_unlock(&f->lock);
}

void
flight_wake_all(struct flight *f)
{
    struct flight_reader *r, *next;

    gw_mutex_lock(&f->lock);
    for (r = f->parked; r != NULL; r = next) {
        next = r->next;
        hand_back_locked(r);
    }
    f->parked = f->parked_tail = NULL;
    f->nparked = 0;
    gw_mutex_unlock(&f->lock);
}

/* Is there anything for a reader at 'index'?  Caller holds the lock. */
static int
ready_locked(const struct flight *f, size_t index)
{
    return f->state != FLIGHT_RUNNING || f->nchunks > index;
}

/*
 * Park 'r' until it is handed back or 'deadline' passes.  A wait that
 * times out while the leader (or a helper) holds the reader must not
 * run before the release: it asks to be signalled then, and if it was
 * parked again it leaves with GW_ETIMEDOUT all the same (the caller sees
 * from r->index whether the holder wrote anything meanwhile).  Lock held.
 */
static int
park_wait_locked(struct flight *f, struct flight_reader *r, int64_t deadline)
{
    int timed_out = 0;

    park_locked(f, r);
    metrics_parked_add(1);
    while (r->where != FLIGHT_READER_RUNNING) {     /* until handed back */
        if (timed_out && r->where == FLIGHT_READER_PARKED) {
            unpark_locked(f, r);
            break;
        }
        if (timed_out) {
            r->waiting = 1;         /* claimed: flight_release signals */
            gw_cond_wait(&r->cv, &f->lock);
        } else if (gw_cond_timedwait(&r->cv, &f->lock, deadline) != 0) {
            timed_out = 1;
        }
    }
    r->waiting = 0;
    return timed_out ? GW_ETIMEDOUT : 0;
}

int
flight_wait(struct flight *f, struct flight_reader *r, int64_t deadline,
            struct flight_view *v)
{
    size_t index;
    int rc = 0;

    gw_mutex_lock(&f->lock);
    assert(r->where == FLIGHT_READER_RUNNING && !r->helper);
    if (!ready_locked(f, r->index))
        rc = park_wait_locked(f, r, deadline);
    index = r->index;               /* the leader may have moved it */
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
