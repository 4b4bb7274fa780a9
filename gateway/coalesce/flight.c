/* SPDX-License-Identifier: MIT */
/*
 * flight.c - the shared, append-only response of one upstream call, and
 * the readers attached to it.  Design: see flight.h.
 *
 * Trimming.  Once the flight takes no joiners, an append that finds
 * 'kept' at or past 'trim_at' walks the readers for the lowest position
 * and frees every chunk before it.  Then 'trim_at' moves to what is kept
 * plus max_flight_bytes, so the walk (one pass over the readers) happens
 * at most once per max_flight_bytes appended, even while a stuck reader
 * keeps everything alive.  The vector is compacted when its freed front
 * outgrows its live part, so each slot is moved at most once on average.
 *
 * The same walk cuts the readers further behind than max_reader_lag: a
 * chunk records the flight's bytes before it ('at'), so a reader's lag
 * is one subtraction.  After a walk every reader still counted is at
 * most max_reader_lag behind, and the next walk comes at most
 * max_flight_bytes later: that is the bound (flight.h).  A cut reader
 * that is being read holds its chunks a moment longer (a non-blocking
 * write); then the walk is due again at the next append.
 *
 * Parking.  The parked FIFO is a doubly linked list through the readers'
 * qprev/qnext, so a reader leaves it from anywhere in O(1) (a stop, a
 * helper); a claimed batch reuses qnext.  Each reader sleeps on its own
 * condition variable, so a hand-back wakes exactly the thread it means.
 */
#include "coalesce/flight.h"

#include <assert.h>
#include <string.h>

#include "alloc.h"

struct flight *
flight_new(void)
{
    struct flight *f = gw_calloc(1, sizeof(*f));

    if (f == NULL)
        return NULL;
    memcpy(f->id, "flight-", 7);
    gw_random_hex(f->id + 7, FLIGHT_ID_LEN - 7);
    gw_mutex_init(&f->lock);
    f->head.content_length = -1;
    f->state = FLIGHT_RUNNING;
    f->joinable = 1;
    atomic_init(&f->refs, 1);
    atomic_init(&f->nreaders, 0);
    atomic_init(&f->phase, FLIGHT_PHASE_QUEUED);
    atomic_init(&f->upstream, NULL);
    atomic_init(&f->body_bytes, 0);
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
    assert(f->readers == NULL && f->parked == NULL);
    for (size_t i = f->first; i < f->nchunks; i++)
        gw_free(f->chunks[i - f->base]);
    gw_free(f->chunks);
    gw_mutex_destroy(&f->lock);
    gw_free(f);
}

int
flight_attach(struct flight *f, struct flight_reader *r)
{
    int rc = GW_ETOOBIG;

    gw_mutex_lock(&f->lock);
    /* Checked under the lock that appends close it: no chunk 0 is freed
     * under a reader that was let in. */
    if (f->joinable) {
        atomic_store_explicit(&r->pos, 0, memory_order_relaxed);
        atomic_store_explicit(&r->reading, 0, memory_order_relaxed);
        r->cut = 0;
        r->cut_lag = 0;
        r->state = FLIGHT_READER_RUNNING;
        r->helper = 0;
        r->qprev = r->qnext = NULL;
        r->prev = NULL;
        r->next = f->readers;
        if (f->readers != NULL)
            f->readers->prev = r;
        f->readers = r;
        atomic_fetch_add(&f->nreaders, 1);
        rc = 0;
    }
    gw_mutex_unlock(&f->lock);
    return rc;
}

unsigned
flight_detach(struct flight *f, struct flight_reader *r)
{
    unsigned left;

    gw_mutex_lock(&f->lock);
    if (r->prev != NULL)
        r->prev->next = r->next;
    else
        f->readers = r->next;
    if (r->next != NULL)
        r->next->prev = r->prev;
    r->prev = r->next = NULL;
    left = atomic_fetch_sub(&f->nreaders, 1) - 1;
    gw_mutex_unlock(&f->lock);
    return left;
}

const char *
flight_id(const struct flight *f)
{
    return f->id;
}

unsigned
flight_readers(struct flight *f)
{
    return atomic_load(&f->nreaders);
}

void
flight_set_upstream(struct flight *f, const char *name)
{
    atomic_store_explicit(&f->upstream, name, memory_order_relaxed);
    /* Past the pool's queue now; a later call (the hedge that won) only
     * renames it. */
    if (atomic_load_explicit(&f->phase, memory_order_relaxed)
        == FLIGHT_PHASE_QUEUED)
        atomic_store_explicit(&f->phase, FLIGHT_PHASE_WAITING,
                              memory_order_relaxed);
}

void
flight_set_head(struct flight *f, const struct http_head *h)
{
    gw_mutex_lock(&f->lock);
    assert(!f->head_set);
    f->head = *h;
    f->head_set = 1;
    gw_mutex_unlock(&f->lock);
    atomic_store_explicit(&f->phase, FLIGHT_PHASE_STREAMING,
                          memory_order_relaxed);
}

/*
 * The lag of a reader at 'pos' (a kept chunk, or the end): the bytes,
 * with the overhead, of the chunks from there to the newest one, that
 * one left out.  Lock held, at least one chunk.
 */
static size_t
lag_locked(const struct flight *f, size_t pos)
{
    const struct flight_chunk *newest = f->chunks[f->nchunks - 1 - f->base];

    return pos < f->nchunks ? newest->at - f->chunks[pos - f->base]->at : 0;
}

/*
 * Cut the readers further behind than 'max_lag', then free the chunks no
 * attached reader needs any more.  Lock held, at least one chunk.
 */
static void
trim_locked(struct flight *f, size_t max_bytes, size_t max_lag)
{
    size_t low = f->nchunks, pos, live, lag;
    int held = 0;

    assert(gw_mutex_held(&f->lock));
    for (struct flight_reader *r = f->readers; r != NULL; r = r->next) {
        /* Acquire: the holder's reads of the chunks before 'pos' (it
         * moved 'pos' with release) happen before they are freed. */
        pos = atomic_load_explicit(&r->pos, memory_order_acquire);
        if (!r->cut && (lag = lag_locked(f, pos)) > max_lag) {
            r->cut = 1;
            r->cut_lag = lag;
        }
        if (r->cut) {
            /* Acquire, likewise: its holder is done with the chunks (it
             * cleared 'reading' with release), and takes no more. */
            if (!atomic_load_explicit(&r->reading, memory_order_acquire))
                continue;
            held = 1;
        }
        if (pos < low)
            low = pos;
    }
    for (; f->first < low; f->first++) {
        struct flight_chunk **slot = &f->chunks[f->first - f->base];

        f->kept -= (*slot)->len + FLIGHT_CHUNK_OVERHEAD;
        gw_free(*slot);
        *slot = NULL;
    }
    live = f->nchunks - f->first;
    if (f->first - f->base >= live && f->first > f->base) {
        memmove(f->chunks, f->chunks + (f->first - f->base),
                live * sizeof(*f->chunks));
        f->base = f->first;
    }
    /* A cut reader still being read lets go in a moment: look again. */
    f->trim_at = held ? 0 : f->kept + max_bytes;
}

/* Room for one more slot in the vector.  0 or GW_ENOMEM.  Lock held. */
static int
make_room_locked(struct flight *f)
{
    size_t used = f->nchunks - f->base, cap;
    struct flight_chunk **v;

    if (used < f->cap)
        return 0;
    cap = f->cap > 0 ? f->cap * 2 : 16;
    /* Realloc under the lock: readers copy pointers under it too. */
    v = cap < SIZE_MAX / sizeof(*v) ? gw_realloc(f->chunks, cap * sizeof(*v))
                                    : NULL;
    if (v == NULL)
        return GW_ENOMEM;
    f->chunks = v;
    f->cap = cap;
    return 0;
}

/* flight_append(), with the chunk flagged 'usage' or not. */
static int
append(struct flight *f, const char *p, size_t n, int usage,
       size_t max_bytes, size_t max_lag)
{
    struct flight_chunk *c;
    size_t size, cost;

    if (gw_add_overflows(sizeof(*c), n, &size)
        || gw_add_overflows(n, FLIGHT_CHUNK_OVERHEAD, &cost))
        return GW_ENOMEM;
    c = gw_malloc(size);            /* allocated outside the lock */
    if (c == NULL)
        return GW_ENOMEM;
    c->len = n;
    c->usage = usage;
    memcpy(c->data, p, n);

    gw_mutex_lock(&f->lock);
    assert(f->state == FLIGHT_RUNNING);
    if (make_room_locked(f) != 0) {
        gw_mutex_unlock(&f->lock);
        gw_free(c);
        return GW_ENOMEM;
    }
    c->at = f->total;
    f->chunks[f->nchunks++ - f->base] = c;
    atomic_fetch_add_explicit(&f->body_bytes, n, memory_order_relaxed);
    f->total = f->total > SIZE_MAX - cost ? SIZE_MAX : f->total + cost;
    f->kept += cost;
    if (f->joinable && f->total > max_bytes) {
        f->joinable = 0;        /* too big to replay to newcomers */
        f->trim_at = max_bytes;
    }
    if (!f->joinable && f->kept >= f->trim_at)
        trim_locked(f, max_bytes, max_lag);
    gw_mutex_unlock(&f->lock);
    return 0;
}

int
flight_append(struct flight *f, const char *p, size_t n, size_t max_bytes,
              size_t max_lag)
{
    return append(f, p, n, 0, max_bytes, max_lag);
}

int
flight_append_usage(struct flight *f, const char *p, size_t n,
                    size_t max_bytes, size_t max_lag)
{
    return append(f, p, n, 1, max_bytes, max_lag);
}

void
flight_finish(struct flight *f, const struct call_outcome *o)
{
    gw_mutex_lock(&f->lock);
    assert(f->state == FLIGHT_RUNNING);
    f->state = o->kind == CALL_OK ? FLIGHT_DONE : FLIGHT_FAILED;
    f->outcome = *o;
    /* A whole log stays joinable: the cache (coalesce.h) may let hits
     * replay it.  Out of the map, nobody can reach it to join. */
    if (f->state != FLIGHT_DONE)
        f->joinable = 0;
    gw_mutex_unlock(&f->lock);
}

int
flight_replayable(struct flight *f, uint64_t *bytes)
{
    int ok;

    gw_mutex_lock(&f->lock);
    ok = f->state == FLIGHT_DONE && f->joinable && f->head_set;
    *bytes = (uint64_t)f->total + sizeof(*f)
             + f->cap * sizeof(struct flight_chunk *);
    gw_mutex_unlock(&f->lock);
    return ok;
}

void
flight_set_usage(struct flight *f, int64_t prompt, int64_t completion)
{
    gw_mutex_lock(&f->lock);
    f->has_usage = 1;
    f->usage_prompt = prompt;
    f->usage_completion = completion;
    gw_mutex_unlock(&f->lock);
}

int
flight_usage(struct flight *f, int64_t *prompt, int64_t *completion)
{
    int ok;

    gw_mutex_lock(&f->lock);
    ok = f->state == FLIGHT_DONE && f->has_usage;
    if (ok) {
        *prompt = f->usage_prompt;
        *completion = f->usage_completion;
    }
    gw_mutex_unlock(&f->lock);
    return ok;
}

void
flight_set_charge(struct flight *f, uint64_t tokens, int counted)
{
    gw_mutex_lock(&f->lock);
    f->has_charge = 1;
    f->charge = tokens;
    f->charge_counted = counted;
    gw_mutex_unlock(&f->lock);
}

int
flight_charge(struct flight *f, uint64_t *tokens, int *counted)
{
    int ok;

    gw_mutex_lock(&f->lock);
    ok = f->state != FLIGHT_RUNNING && f->has_charge;
    if (ok) {
        *tokens = f->charge;
        *counted = f->charge_counted;
    }
    gw_mutex_unlock(&f->lock);
    return ok;
}

static void
snap_locked(struct flight *f, size_t lo, struct flight_snap *s)
{
    assert(gw_mutex_held(&f->lock));
    assert(lo >= f->first || lo >= f->nchunks);
    s->cut = 0;
    s->head = f->head_set ? &f->head : NULL;
    s->state = f->state;
    s->outcome = f->outcome;
    s->nchunks = f->nchunks;
    s->lo = lo;
    s->n = 0;
    while (lo + s->n < f->nchunks && s->n < FLIGHT_SNAP_MAX) {
        s->chunk[s->n] = f->chunks[lo + s->n - f->base];
        s->n++;
    }
}

#ifdef INFERGW_UNIT_TEST
void
flight_snap(struct flight *f, size_t lo, struct flight_snap *s)
{
    gw_mutex_lock(&f->lock);
    snap_locked(f, lo, s);
    gw_mutex_unlock(&f->lock);
}
#endif

static void
snap_reader_locked(struct flight *f, struct flight_reader *r,
                   struct flight_snap *s)
{
    assert(gw_mutex_held(&f->lock));
    if (r->cut) {
        s->cut = 1;             /* and no chunk: they may be gone */
        s->head = NULL;
        s->n = 0;
        return;
    }
    /* Relaxed: the trimmer reads it under the lock we hold. */
    atomic_store_explicit(&r->reading, 1, memory_order_relaxed);
    snap_locked(f, atomic_load_explicit(&r->pos, memory_order_relaxed), s);
}

void
flight_snap_reader(struct flight *f, struct flight_reader *r,
                   struct flight_snap *s)
{
    gw_mutex_lock(&f->lock);
    snap_reader_locked(f, r, s);
    gw_mutex_unlock(&f->lock);
}

void
flight_read_done(struct flight_reader *r)
{
    /* Release: our reads of its chunks come before the trimmer's free. */
    atomic_store_explicit(&r->reading, 0, memory_order_release);
}

#ifdef INFERGW_UNIT_TEST
size_t
flight_kept_bytes(struct flight *f)
{
    size_t n;

    gw_mutex_lock(&f->lock);
    n = f->kept;
    gw_mutex_unlock(&f->lock);
    return n;
}
#endif

/* ---- the reader's state ---- */

void
flight_reader_init(struct flight_reader *r)
{
    memset(r, 0, sizeof(*r));
    atomic_init(&r->pos, 0);
    atomic_init(&r->reading, 0);
    r->state = FLIGHT_READER_RUNNING;
    gw_cond_init(&r->cv);
}

void
flight_reader_release(struct flight_reader *r)
{
    assert(r->state == FLIGHT_READER_RUNNING && !r->helper);
    pthread_cond_destroy(&r->cv);
}

size_t
flight_reader_pos(const struct flight_reader *r)
{
    /* Relaxed: only its holder moves it. */
    return atomic_load_explicit(&r->pos, memory_order_relaxed);
}

void
flight_reader_advance(struct flight_reader *r, size_t pos)
{
    assert(pos >= flight_reader_pos(r));
    /* Release: the chunks before 'pos' are no longer read (flight.h). */
    atomic_store_explicit(&r->pos, pos, memory_order_release);
}

size_t
flight_reader_cut_lag(const struct flight_reader *r)
{
    return r->cut_lag;          /* immutable once a snapshot said 'cut' */
}

void
flight_reader_set_parkable(struct flight_reader *r, int parkable)
{
    r->parkable = parkable;
}

struct flight_reader *
flight_batch_next(const struct flight_reader *r)
{
    return r->qnext;
}

/* Queue 'r' at the tail: it has everything (the FIFO invariant). */
static void
park_locked(struct flight *f, struct flight_reader *r)
{
    assert(gw_mutex_held(&f->lock));
    assert(flight_reader_pos(r) == f->nchunks && !r->cut);
    r->state = FLIGHT_READER_PARKED;
    r->qnext = NULL;
    r->qprev = f->parked_tail;
    if (f->parked_tail != NULL)
        f->parked_tail->qnext = r;
    else
        f->parked = r;
    f->parked_tail = r;
    f->nparked++;
}

/* Take 'r' out of the FIFO; it keeps its state. */
static void
unlink_locked(struct flight *f, struct flight_reader *r)
{
    assert(gw_mutex_held(&f->lock));
    assert(r->state == FLIGHT_READER_PARKED);
    if (r->qprev != NULL)
        r->qprev->qnext = r->qnext;
    else
        f->parked = r->qnext;
    if (r->qnext != NULL)
        r->qnext->qprev = r->qprev;
    else
        f->parked_tail = r->qprev;
    r->qnext = r->qprev = NULL;
    f->nparked--;
}

/* Hand a parked (unlinked) or claimed reader back to its thread. */
static void
hand_back_locked(struct flight *f, struct flight_reader *r)
{
    assert(gw_mutex_held(&f->lock));
    assert(r->state != FLIGHT_READER_RUNNING);
    r->state = FLIGHT_READER_RUNNING;
    r->qnext = r->qprev = NULL;
    pthread_cond_signal(&r->cv);
}

/* Is 'r' (may be NULL) behind the newest chunk? */
static int
behind_locked(struct flight *f, const struct flight_reader *r)
{
    assert(gw_mutex_held(&f->lock));
    return r != NULL && flight_reader_pos(r) < f->nchunks;
}

static int
is_stopping(const _Atomic int *stopping)
{
    return atomic_load_explicit(stopping, memory_order_relaxed);
}

enum flight_wait
flight_wait(struct flight *f, struct flight_reader *r,
            const _Atomic int *stopping, struct flight_snap *s)
{
    int help;

    gw_mutex_lock(&f->lock);
    assert(r->state == FLIGHT_READER_RUNNING && !r->helper);
    if (f->state == FLIGHT_RUNNING && f->nchunks <= flight_reader_pos(r)
        && !r->cut && !is_stopping(stopping)) {
        park_locked(f, r);
        while (r->state != FLIGHT_READER_RUNNING) {
            /* Claimed, it is its holder's until given back: wait for that. */
            if (r->state == FLIGHT_READER_PARKED && is_stopping(stopping)) {
                unlink_locked(f, r);
                r->state = FLIGHT_READER_RUNNING;
                break;
            }
            gw_cond_wait(&r->cv, &f->lock);
        }
    }
    help = r->helper;
    r->helper = 0;
    if (!help)
        snap_reader_locked(f, r, s);
    gw_mutex_unlock(&f->lock);
    return help ? FLIGHT_WAIT_HELP : FLIGHT_WAIT_NEWS;
}

struct flight_reader *
flight_take(struct flight *f, size_t max, struct flight_snap *s, int helper)
{
    struct flight_reader *batch = NULL, **tail = &batch, *r;

    gw_mutex_lock(&f->lock);
    for (size_t n = 0; n < max && behind_locked(f, f->parked); n++) {
        r = f->parked;
        unlink_locked(f, r);
        r->state = FLIGHT_READER_CLAIMED;
        assert(!r->cut);        /* a parked reader is never behind */
        /* Relaxed: the trimmer reads it under the lock we hold. */
        atomic_store_explicit(&r->reading, 1, memory_order_relaxed);
        *tail = r;
        tail = &r->qnext;
    }
    if (batch != NULL) {
        snap_locked(f, flight_reader_pos(batch), s);
    } else if (helper) {
        assert(f->helping > 0);
        f->helping--;
    }
    gw_mutex_unlock(&f->lock);
    return batch;
}

struct flight_reader *
flight_claim_parked(struct flight *f)
{
    struct flight_reader *batch;

    gw_mutex_lock(&f->lock);
    batch = f->parked;
    for (struct flight_reader *r = batch; r != NULL; r = r->qnext)
        r->state = FLIGHT_READER_CLAIMED;
    f->parked = f->parked_tail = NULL;
    f->nparked = 0;
    gw_mutex_unlock(&f->lock);
    return batch;
}

void
flight_give_back(struct flight *f, struct flight_reader *batch)
{
    struct flight_reader *r, *next;

    if (batch == NULL)
        return;
    gw_mutex_lock(&f->lock);
    for (r = batch; r != NULL; r = next) {
        next = r->qnext;
        assert(r->state == FLIGHT_READER_CLAIMED);
        if (r->parkable && f->state == FLIGHT_RUNNING
            && flight_reader_pos(r) == f->nchunks && !r->cut)
            park_locked(f, r);
        else
            hand_back_locked(f, r);
    }
    gw_mutex_unlock(&f->lock);
}

size_t
flight_call_helpers(struct flight *f, size_t max, size_t per)
{
    struct flight_reader *r;
    size_t n, room;

    gw_mutex_lock(&f->lock);
    n = f->nparked / per;
    room = max > f->helping ? max - f->helping : 0;
    if (n > room)
        n = room;
    for (size_t i = 0; i < n; i++) {
        r = f->parked;
        if (!behind_locked(f, r)) {
            n = i;
            break;
        }
        unlink_locked(f, r);
        r->helper = 1;
        hand_back_locked(f, r);
    }
    f->helping += (unsigned)n;
    gw_mutex_unlock(&f->lock);
    return n;
}

void
flight_wake_all(struct flight *f)
{
    struct flight_reader *r, *next;

    gw_mutex_lock(&f->lock);
    for (r = f->parked; r != NULL; r = next) {
        next = r->qnext;
        hand_back_locked(f, r);
    }
    f->parked = f->parked_tail = NULL;
    f->nparked = 0;
    gw_mutex_unlock(&f->lock);
}

#ifdef INFERGW_UNIT_TEST
size_t
flight_parked(struct flight *f)
{
    size_t n;

    gw_mutex_lock(&f->lock);
    n = f->nparked;
    gw_mutex_unlock(&f->lock);
    return n;
}
#endif
