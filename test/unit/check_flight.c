/* SPDX-License-Identifier: MIT */
/*
 * check_flight.c - the flight: the shared chunk log, its readers, its
 * memory bound and its snapshots, without sockets; and the readers'
 * states (park, take, release, helpers, wake), with a thread where one
 * must sleep.
 */
#include <check.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "alloc.h"
#include "coalesce/flight.h"
#include "testutil.h"
#include "util.h"

/* How the calls behind the flights here end (outcome.h). */
static const struct call_outcome complete = { CALL_OK, 200, 0,
                                              CALL_FAULT_NONE };
static const struct call_outcome out_of_memory = { CALL_NOMEM, 0, 0,
                                                   CALL_FAULT_GATEWAY };
static const struct call_outcome overloaded = { CALL_STATUS, 503, 7,
                                                CALL_FAULT_UPSTREAM };

#define BIG ((size_t)1 << 30)       /* a bound that is never reached */

static void
set_pos(struct flight_reader *r, size_t pos)
{
    atomic_store(&r->pos, pos);
}

/* Append 'n' chunks "c<i>" (i from 'first'). */
static void
append_n(struct flight *f, int first, int n, size_t max)
{
    char b[32];

    for (int i = first; i < first + n; i++) {
        snprintf(b, sizeof(b), "c%d", i);
        ck_assert_int_eq(flight_append(f, b, strlen(b), max, BIG), 0);
    }
}

static int
chunk_is(const struct flight_chunk *c, int i)
{
    char b[32];

    snprintf(b, sizeof(b), "c%d", i);
    return c->len == strlen(b) && memcmp(c->data, b, c->len) == 0;
}

START_TEST(test_replay_from_zero)
{
    struct flight *f = flight_new();
    struct flight_reader a, b;
    struct flight_snap s;

    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(strncmp(f->id, "flight-", 7), 0);
    ck_assert_uint_eq(strlen(f->id), FLIGHT_ID_LEN);
    ck_assert_int_eq(flight_attach(f, &a), 0);
    flight_snap(f, 0, &s);
    ck_assert_ptr_null(s.head);         /* no head yet */
    ck_assert_uint_eq(s.n, 0);
    flight_set_head(f, &(struct http_head){ 200, -1, "text/event-stream",
                                           0, 0 });
    append_n(f, 0, FLIGHT_SNAP_MAX + 4, BIG);
    /* A late joiner gets everything, FLIGHT_SNAP_MAX at a time. */
    ck_assert_int_eq(flight_attach(f, &b), 0);
    ck_assert_uint_eq(flight_readers(f), 2);
    flight_snap(f, 0, &s);
    ck_assert_ptr_nonnull(s.head);
    ck_assert_int_eq(s.head->status, 200);
    ck_assert_str_eq(s.head->content_type, "text/event-stream");
    ck_assert_int_eq(s.state, FLIGHT_RUNNING);
    ck_assert_uint_eq(s.nchunks, FLIGHT_SNAP_MAX + 4);
    ck_assert_uint_eq(s.lo, 0);
    ck_assert_uint_eq(s.n, FLIGHT_SNAP_MAX);
    for (size_t i = 0; i < s.n; i++)
        ck_assert(chunk_is(s.chunk[i], (int)i));
    flight_snap(f, FLIGHT_SNAP_MAX, &s);
    ck_assert_uint_eq(s.n, 4);
    ck_assert(chunk_is(s.chunk[3], FLIGHT_SNAP_MAX + 3));
    flight_finish(f, &overloaded);
    flight_snap(f, FLIGHT_SNAP_MAX + 4, &s);
    ck_assert_int_eq(s.state, FLIGHT_FAILED);
    /* Every client is told the same, whole. */
    ck_assert_int_eq(s.outcome.kind, CALL_STATUS);
    ck_assert_int_eq(s.outcome.status, 503);
    ck_assert_int_eq(s.outcome.retry_after_s, 7);
    ck_assert_int_eq(s.outcome.fault, CALL_FAULT_UPSTREAM);
    ck_assert_uint_eq(s.n, 0);
    /* A finished flight takes no joiners. */
    ck_assert_int_eq(flight_attach(f, &b), GW_ETOOBIG);
    ck_assert_uint_eq(flight_detach(f, &b), 1);
    ck_assert_uint_eq(flight_detach(f, &a), 0);
    flight_unref(f);
}
END_TEST

/*
 * Past max_bytes the flight takes no joiners; the per-chunk overhead
 * counts, so many tiny chunks close it as surely as few big ones.
 */
START_TEST(test_bound_counts_chunk_overhead)
{
    struct flight *f = flight_new();
    struct flight_reader a, b;
    size_t max = 1024, n = 0;

    ck_assert_int_eq(flight_attach(f, &a), 0);
    flight_set_head(f, &(struct http_head){ 200, -1, "", 0, 0 });
    while (n * (1 + FLIGHT_CHUNK_OVERHEAD) <= max) {
        ck_assert_int_eq(flight_attach(f, &b), 0);  /* still joinable */
        flight_detach(f, &b);
        ck_assert_int_eq(flight_append(f, "x", 1, max, BIG), 0);
        n++;
    }
    /* 1-byte chunks: far fewer than 1024 of them closed it. */
    ck_assert_uint_lt(n, max / 8);
    ck_assert_int_eq(flight_attach(f, &b), GW_ETOOBIG);
    flight_finish(f, &complete);
    flight_detach(f, &a);
    flight_unref(f);
}
END_TEST

/*
 * Once closed, what every reader has sent is freed: memory follows the
 * slowest reader, and a reader that leaves no longer holds it back.
 */
START_TEST(test_trim_follows_the_slowest_reader)
{
    struct flight *f = flight_new();
    struct flight_reader fast, slow;
    struct flight_snap s;
    size_t max = 1024, per = 100 + FLIGHT_CHUNK_OVERHEAD, kept;
    char chunk[100];

    memset(chunk, 'z', sizeof(chunk));
    ck_assert_int_eq(flight_attach(f, &fast), 0);
    ck_assert_int_eq(flight_attach(f, &slow), 0);
    flight_set_head(f, &(struct http_head){ 200, -1, "", 0, 0 });
    for (size_t i = 0; i < 1000; i++) {
        ck_assert_int_eq(flight_append(f, chunk, sizeof(chunk), max, BIG), 0);
        set_pos(&fast, i + 1);          /* the fast one keeps up */
        if (i < 100)
            set_pos(&slow, i + 1);      /* the slow one stops at 100 */
    }
    /* Everything from the slow one's position is kept, no more than a
     * bound's worth besides. */
    kept = flight_kept_bytes(f);
    ck_assert_uint_ge(kept, 900 * per);
    ck_assert_uint_le(kept, 900 * per + max + per);
    flight_snap(f, 100, &s);            /* still there for it */
    ck_assert_uint_eq(s.n, FLIGHT_SNAP_MAX);
    ck_assert_uint_eq(s.chunk[0]->len, 100);
    /* The slow one leaves: the next appends free what it held. */
    flight_detach(f, &slow);
    for (size_t i = 1000; i < 1100; i++) {
        ck_assert_int_eq(flight_append(f, chunk, sizeof(chunk), max, BIG), 0);
        set_pos(&fast, i + 1);
    }
    ck_assert_uint_le(flight_kept_bytes(f), max + per);
    /* Indexes are still absolute after the vector was compacted. */
    flight_snap(f, 1100, &s);
    ck_assert_uint_eq(s.nchunks, 1100);
    ck_assert_uint_eq(s.n, 0);
    flight_finish(f, &complete);
    flight_detach(f, &fast);
    flight_unref(f);
}
END_TEST

/* A flight with a head and readers 'a' and 'b' attached at chunk 0. */
static struct flight *
flight_of_two(struct flight_reader *a, struct flight_reader *b)
{
    struct flight *f = flight_new();

    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(flight_attach(f, a), 0);
    ck_assert_int_eq(flight_attach(f, b), 0);
    flight_set_head(f, &(struct http_head){ 200, -1, "", 0, 0 });
    return f;
}

/* Append a chunk of 100 bytes under the bounds 'max' and 'lag'. */
static void
append_100(struct flight *f, size_t max, size_t lag)
{
    char chunk[100];

    memset(chunk, 'z', sizeof(chunk));
    ck_assert_int_eq(flight_append(f, chunk, sizeof(chunk), max, lag), 0);
}

/*
 * Append chunks 'from' to 'to' (100 bytes each): 'fast' takes each one,
 * 'slow' too up to chunk 'stop', then no more.  Returns the most bytes
 * the flight kept after an append.
 */
static size_t
fast_and_slow(struct flight *f, struct flight_reader *fast,
              struct flight_reader *slow, size_t from, size_t to, size_t stop,
              size_t max, size_t lag)
{
    size_t peak = 0;

    for (size_t i = from; i < to; i++) {
        append_100(f, max, lag);
        if (flight_kept_bytes(f) > peak)
            peak = flight_kept_bytes(f);
        set_pos(fast, i + 1);
        if (i < stop)
            set_pos(slow, i + 1);
    }
    return peak;
}

/* Finish 'f', detach 'a' and 'b', drop it. */
static void
flight_done_with_two(struct flight *f, struct flight_reader *a,
                     struct flight_reader *b)
{
    flight_finish(f, &complete);
    flight_detach(f, a);
    flight_detach(f, b);
    flight_unref(f);
}

/* Is 'r' cut?  (flight_snap_reader() says so, and reads nothing then.) */
static int
is_cut(struct flight *f, struct flight_reader *r)
{
    struct flight_snap s;

    flight_snap_reader(f, r, &s);
    flight_read_done(r);
    return s.cut;
}

/*
 * max_reader_lag bounds memory whoever reads: a reader that stops far
 * behind is cut, and the flight keeps no more than max_flight_bytes +
 * max_reader_lag (and a chunk) however long the stream goes on.
 */
START_TEST(test_lag_bound_cuts_the_slow_reader)
{
    struct flight_reader fast, slow;
    struct flight *f = flight_of_two(&fast, &slow);
    struct flight_snap s;
    size_t max = 1024, lag = 4096, per = 100 + FLIGHT_CHUNK_OVERHEAD;

    /* The slow one stops at chunk 100. */
    ck_assert_uint_le(fast_and_slow(f, &fast, &slow, 0, 1000, 100, max, lag),
                      max + lag + per);
    ck_assert(is_cut(f, &slow));
    ck_assert_uint_gt(slow.cut_lag, lag);
    ck_assert_uint_le(slow.cut_lag, lag + max + per);
    ck_assert(!is_cut(f, &fast));
    /* What is kept now is what the fast one may still need. */
    ck_assert_uint_le(flight_kept_bytes(f), max + per);
    flight_snap_reader(f, &fast, &s);
    ck_assert(!s.cut);
    ck_assert_uint_eq(s.nchunks, 1000);
    flight_read_done(&fast);
    flight_done_with_two(f, &fast, &slow);
}
END_TEST

/*
 * A reader cut while its holder reads a snapshot (a non-blocking write
 * under way) keeps its chunks until the holder is done: the chunks stay
 * readable (ASan would see a use after free), and the next append after
 * flight_read_done() frees them.
 */
START_TEST(test_lag_cut_waits_for_the_holder)
{
    struct flight_reader fast, slow;
    struct flight *f = flight_of_two(&fast, &slow);
    struct flight_snap s;
    size_t max = 1024, lag = 4096, per = 100 + FLIGHT_CHUNK_OVERHEAD;

    fast_and_slow(f, &fast, &slow, 0, 101, 100, max, lag);
    flight_snap_reader(f, &slow, &s);   /* its holder starts a write */
    ck_assert(!s.cut);
    ck_assert_uint_eq(s.lo, 100);
    ck_assert_uint_eq(s.n, 1);
    fast_and_slow(f, &fast, &slow, 101, 1000, 0, max, lag);
    /* Cut, but held: its snapshot's chunk is still there. */
    ck_assert_uint_ge(flight_kept_bytes(f), 899 * per);
    ck_assert_uint_eq(s.chunk[0]->len, 100);
    ck_assert_int_eq(s.chunk[0]->data[99], 'z');
    flight_read_done(&slow);
    ck_assert(is_cut(f, &slow));
    append_100(f, max, lag);
    ck_assert_uint_le(flight_kept_bytes(f), 2 * per);
    flight_done_with_two(f, &fast, &slow);
}
END_TEST

/*
 * A reader that had everything before an append is never behind, however
 * big the new chunk: lag leaves out the newest chunk, so a parked reader,
 * which the leader pushes to right after the append, is never cut.
 */
START_TEST(test_caught_up_reader_never_cut)
{
    struct flight *f = flight_new();
    struct flight_reader a;
    static char big[64 * 1024];
    size_t max = 1024, lag = 1024;

    memset(big, 'b', sizeof(big));
    ck_assert_int_eq(flight_attach(f, &a), 0);
    flight_set_head(f, &(struct http_head){ 200, -1, "", 0, 0 });
    for (size_t i = 0; i < 20; i++) {
        ck_assert_int_eq(flight_append(f, big, sizeof(big), max, lag), 0);
        ck_assert(!is_cut(f, &a));
        set_pos(&a, i + 1);             /* it takes each chunk */
    }
    /* Behind by one chunk, more than 'lag': the next append cuts it. */
    ck_assert_int_eq(flight_append(f, big, sizeof(big), max, lag), 0);
    ck_assert_int_eq(flight_append(f, big, sizeof(big), max, lag), 0);
    ck_assert(is_cut(f, &a));
    flight_finish(f, &complete);
    flight_detach(f, &a);
    flight_unref(f);
}
END_TEST

/* While joinable, nothing is freed: a newcomer starts at chunk 0. */
START_TEST(test_no_trim_while_joinable)
{
    struct flight *f = flight_new();
    struct flight_reader a, b;
    struct flight_snap s;

    ck_assert_int_eq(flight_attach(f, &a), 0);
    flight_set_head(f, &(struct http_head){ 200, -1, "", 0, 0 });
    for (int i = 0; i < 50; i++) {
        append_n(f, i, 1, BIG);
        set_pos(&a, (size_t)i + 1);
    }
    ck_assert_int_eq(flight_attach(f, &b), 0);
    flight_snap(f, 0, &s);
    ck_assert(chunk_is(s.chunk[0], 0));
    /* Nor is anyone cut, however tight max_reader_lag. */
    for (int i = 50; i < 100; i++) {
        ck_assert_int_eq(flight_append(f, "0123456789", 10, BIG, 1), 0);
        set_pos(&a, (size_t)i + 1);
    }
    ck_assert(!is_cut(f, &b));
    flight_snap(f, 0, &s);
    ck_assert(chunk_is(s.chunk[0], 0));
    flight_finish(f, &complete);
    flight_detach(f, &a);
    flight_detach(f, &b);
    flight_unref(f);
}
END_TEST

/* Out of memory while appending: either allocation; nothing changes. */
START_TEST(test_append_enomem_leaves_flight_unchanged)
{
    struct flight *f = flight_new();
    struct flight_reader a;
    struct flight_snap s;

    ck_assert_int_eq(flight_attach(f, &a), 0);
    flight_set_head(f, &(struct http_head){ 200, -1, "", 0, 0 });
    alloc_fail_after(1, 0);             /* the chunk */
    ck_assert_int_eq(flight_append(f, "x", 1, BIG, BIG), GW_ENOMEM);
    alloc_fail_after(2, 0);             /* the vector (its first slots) */
    ck_assert_int_eq(flight_append(f, "x", 1, BIG, BIG), GW_ENOMEM);
    alloc_fail_after(0, 0);
    flight_snap(f, 0, &s);
    ck_assert_uint_eq(s.nchunks, 0);
    ck_assert_uint_eq(flight_kept_bytes(f), 0);
    append_n(f, 0, 1, BIG);
    flight_snap(f, 0, &s);
    ck_assert_uint_eq(s.nchunks, 1);
    ck_assert(chunk_is(s.chunk[0], 0));
    flight_finish(f, &out_of_memory);
    flight_detach(f, &a);
    flight_unref(f);
    /* Out of memory for the flight itself. */
    alloc_fail_after(1, 0);
    ck_assert_ptr_null(flight_new());
    alloc_fail_after(0, 0);
}
END_TEST

/* ---- the readers' states ---- */

static _Atomic int no_stop;

/*
 * Park 'r' without a thread: claimed, brought up to date, released
 * caught up (what a holder does with a reader it pushed to).
 */
static void
park_threadless(struct flight *f, struct flight_reader *r)
{
    gw_mutex_lock(&f->lock);
    r->state = FLIGHT_READER_CLAIMED;
    r->qnext = NULL;
    gw_mutex_unlock(&f->lock);
    flight_reader_advance(r, f->nchunks);
    flight_reader_set_parkable(r, 1);
    flight_give_back(f, r);
}

/* 'n' new readers of 'f', attached and parked in order. */
static void
park_n(struct flight *f, struct flight_reader *r, int n)
{
    for (int i = 0; i < n; i++) {
        flight_reader_init(&r[i]);
        ck_assert_int_eq(flight_attach(f, &r[i]), 0);
        park_threadless(f, &r[i]);
    }
}

static void
drop_n(struct flight *f, struct flight_reader *r, int n)
{
    for (int i = 0; i < n; i++) {
        r[i].helper = 0;        /* a threadless helper never waits */
        flight_detach(f, &r[i]);
        flight_reader_release(&r[i]);
    }
}

/*
 * flight_take() hands out only readers that are behind, oldest first, at
 * most 'max' at a time, as a claimed batch with the snapshot from the
 * first; one released caught up is parked again (at the tail) and not
 * taken again until the next append.
 */
START_TEST(test_take_only_the_readers_behind)
{
    struct flight *f = flight_new();
    struct flight_reader r[3], *batch, *fr;
    struct flight_snap s;

    flight_set_head(f, &(struct http_head){ 200, -1, "", 0, 0 });
    park_n(f, r, 3);
    ck_assert_uint_eq(flight_parked(f), 3);
    ck_assert_int_eq(r[0].state, FLIGHT_READER_PARKED);
    ck_assert_ptr_null(flight_take(f, 8, &s, 0));   /* nobody is behind */
    append_n(f, 0, 1, BIG);
    batch = flight_take(f, 2, &s, 0);
    ck_assert_ptr_eq(batch, &r[0]);
    ck_assert_ptr_eq(flight_batch_next(batch), &r[1]);
    ck_assert_ptr_null(flight_batch_next(&r[1]));
    ck_assert_int_eq(r[0].state, FLIGHT_READER_CLAIMED);
    ck_assert_int_eq(r[1].state, FLIGHT_READER_CLAIMED);
    ck_assert_int_eq(atomic_load(&r[0].reading), 1);
    ck_assert_uint_eq(flight_parked(f), 1);
    ck_assert_uint_eq(s.lo, 0);
    ck_assert_uint_eq(s.n, 1);
    ck_assert(chunk_is(s.chunk[0], 0));
    for (fr = batch; fr != NULL; fr = flight_batch_next(fr)) {
        flight_reader_advance(fr, 1);
        flight_reader_set_parkable(fr, 1);
        flight_read_done(fr);
    }
    flight_give_back(f, batch);           /* parked behind the third */
    ck_assert_uint_eq(flight_parked(f), 3);
    ck_assert_int_eq(r[0].state, FLIGHT_READER_PARKED);
    batch = flight_take(f, 8, &s, 0);
    ck_assert_ptr_eq(batch, &r[2]);
    ck_assert_ptr_null(flight_batch_next(batch));
    flight_reader_advance(batch, 1);
    flight_reader_set_parkable(batch, 1);
    flight_read_done(batch);
    flight_give_back(f, batch);
    ck_assert_ptr_null(flight_take(f, 8, &s, 0));
    ck_assert_uint_eq(flight_parked(f), 3);
    flight_wake_all(f);
    ck_assert_uint_eq(flight_parked(f), 0);
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(r[i].state, FLIGHT_READER_RUNNING);
    drop_n(f, r, 3);
    flight_unref(f);
}
END_TEST

/*
 * flight_give_back() parks again only a reader that its holder found
 * caught up, that has every chunk, of a flight that still runs; every
 * other goes back to its thread.
 */
START_TEST(test_release_parks_only_the_caught_up)
{
    struct flight *f = flight_new();
    struct flight_reader r[4], *batch;

    flight_set_head(f, &(struct http_head){ 200, -1, "", 0, 0 });
    park_n(f, r, 4);
    batch = flight_claim_parked(f);
    ck_assert_ptr_eq(batch, &r[0]);
    ck_assert_uint_eq(flight_parked(f), 0);
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(r[i].state, FLIGHT_READER_CLAIMED);
    flight_reader_set_parkable(&r[0], 1);       /* caught up: parks */
    flight_reader_set_parkable(&r[1], 0);       /* its holder says no */
    flight_reader_set_parkable(&r[2], 1);
    flight_reader_set_parkable(&r[3], 1);
    append_n(f, 0, 1, BIG);                     /* r[2], r[3] behind now */
    flight_reader_advance(&r[0], 1);
    flight_reader_advance(&r[3], 1);
    flight_give_back(f, batch);
    ck_assert_int_eq(r[0].state, FLIGHT_READER_PARKED);
    ck_assert_int_eq(r[1].state, FLIGHT_READER_RUNNING);
    ck_assert_int_eq(r[2].state, FLIGHT_READER_RUNNING);
    ck_assert_int_eq(r[3].state, FLIGHT_READER_PARKED);
    ck_assert_uint_eq(flight_parked(f), 2);

    /* Once the flight is over, nobody parks again. */
    batch = flight_claim_parked(f);
    flight_finish(f, &complete);
    flight_give_back(f, batch);
    ck_assert_int_eq(r[0].state, FLIGHT_READER_RUNNING);
    ck_assert_int_eq(r[3].state, FLIGHT_READER_RUNNING);
    ck_assert_uint_eq(flight_parked(f), 0);
    drop_n(f, r, 4);
    flight_unref(f);
}
END_TEST

/* At most 'max' helpers work on a flight at a time, however many chunks
 * arrive; one whose take finds nobody behind makes room for another. */
START_TEST(test_helpers_bounded_per_flight)
{
    struct flight *f = flight_new();
    struct flight_reader r[10], *batch, *fr;
    struct flight_snap s;

    flight_set_head(f, &(struct http_head){ 200, -1, "", 0, 0 });
    park_n(f, r, 10);
    ck_assert_uint_eq(flight_call_helpers(f, 2, 1), 0); /* none behind */
    append_n(f, 0, 1, BIG);
    ck_assert_uint_eq(flight_call_helpers(f, 10, 4), 2);    /* 10 / 4 */
    ck_assert_int_eq(r[0].helper, 1);
    ck_assert_int_eq(r[1].helper, 1);
    ck_assert_int_eq(r[2].helper, 0);
    ck_assert_int_eq(r[0].state, FLIGHT_READER_RUNNING);
    ck_assert_uint_eq(flight_parked(f), 8);
    append_n(f, 1, 1, BIG);
    ck_assert_uint_eq(flight_call_helpers(f, 2, 1), 0); /* still 2 at work */
    /* A helper finishes: it takes until nobody is behind. */
    while ((batch = flight_take(f, 8, &s, 1)) != NULL) {
        for (fr = batch; fr != NULL; fr = flight_batch_next(fr)) {
            flight_reader_advance(fr, s.nchunks);
            flight_reader_set_parkable(fr, 1);
            flight_read_done(fr);
        }
        flight_give_back(f, batch);
    }
    append_n(f, 2, 1, BIG);
    ck_assert_uint_eq(flight_call_helpers(f, 2, 1), 1); /* room for one */
    ck_assert_uint_eq(flight_call_helpers(f, 2, 1), 0);
    flight_wake_all(f);
    drop_n(f, r, 10);
    flight_unref(f);
}
END_TEST

struct waiter {
    struct flight *f;
    struct flight_reader r;
    const _Atomic int *stop;
    struct flight_snap s;
    enum flight_wait got;
    _Atomic int done;
    pthread_t t;
};

static void *
wait_main(void *p)
{
    struct waiter *w = p;

    w->got = flight_wait(w->f, &w->r, w->stop, &w->s);
    if (w->got == FLIGHT_WAIT_NEWS)
        flight_read_done(&w->r);
    atomic_store(&w->done, 1);
    return NULL;
}

/* A thread in flight_wait() for a new reader of 'f' at 'pos'. */
static void
waiter_start(struct waiter *w, struct flight *f, size_t pos,
             const _Atomic int *stop)
{
    memset(w, 0, sizeof(*w));
    w->f = f;
    w->stop = stop;
    flight_reader_init(&w->r);
    ck_assert_int_eq(flight_attach(f, &w->r), 0);
    flight_reader_advance(&w->r, pos);
    ck_assert_int_eq(pthread_create(&w->t, NULL, wait_main, w), 0);
}

static void
waiter_end(struct waiter *w)
{
    pthread_join(w->t, NULL);
    flight_detach(w->f, &w->r);
    flight_reader_release(&w->r);
}

/* Poll (3 s at most) until 'n' readers of 'f' are parked. */
static int
await_parked(struct flight *f, size_t n)
{
    int64_t end = gw_now_ms() + 3000;

    while (flight_parked(f) != n) {
        if (gw_now_ms() > end)
            return 0;
        sched_yield();
    }
    return 1;
}

/*
 * flight_wait(): a reader with news does not park; one without sleeps
 * until it is handed back, and an append alone does not wake it (the
 * policy decides, fanout.h); handed back, it gets the snapshot from its
 * position.
 */
START_TEST(test_wait_parks_until_handed_back)
{
    struct flight *f = flight_new();
    struct waiter w;

    flight_set_head(f, &(struct http_head){ 200, -1, "", 0, 0 });
    append_n(f, 0, 1, BIG);
    waiter_start(&w, f, 0, &no_stop);   /* chunk 0 is news: no park */
    waiter_end(&w);
    ck_assert_int_eq(w.got, FLIGHT_WAIT_NEWS);
    ck_assert_uint_eq(w.s.n, 1);
    ck_assert_uint_eq(flight_parked(f), 0);

    waiter_start(&w, f, 1, &no_stop);   /* has everything: parks */
    ck_assert(await_parked(f, 1));
    ck_assert_int_eq(w.r.state, FLIGHT_READER_PARKED);
    append_n(f, 1, 1, BIG);
    usleep(20000);
    ck_assert_int_eq(atomic_load(&w.done), 0);      /* not woken */
    flight_wake_all(f);
    waiter_end(&w);
    ck_assert_int_eq(w.got, FLIGHT_WAIT_NEWS);
    ck_assert_uint_eq(w.s.lo, 1);
    ck_assert_uint_eq(w.s.n, 1);
    ck_assert(chunk_is(w.s.chunk[0], 1));
    ck_assert_uint_eq(flight_parked(f), 0);
    flight_unref(f);
}
END_TEST

/* A thread whose reader is made a helper returns FLIGHT_WAIT_HELP, no
 * snapshot, and its helper mark is cleared. */
START_TEST(test_wait_returns_to_help)
{
    struct flight *f = flight_new();
    struct waiter w;
    struct flight_snap s;

    flight_set_head(f, &(struct http_head){ 200, -1, "", 0, 0 });
    waiter_start(&w, f, 0, &no_stop);
    ck_assert(await_parked(f, 1));
    append_n(f, 0, 1, BIG);
    ck_assert_uint_eq(flight_call_helpers(f, 1, 1), 1);
    waiter_end(&w);
    ck_assert_int_eq(w.got, FLIGHT_WAIT_HELP);
    ck_assert_int_eq(w.r.helper, 0);
    ck_assert_int_eq(w.r.state, FLIGHT_READER_RUNNING);
    /* Its take finds nobody behind: its help ends, room for another. */
    ck_assert_ptr_null(flight_take(f, 8, &s, 1));
    ck_assert_uint_eq(f->helping, 0);
    flight_unref(f);
}
END_TEST

/* The stop: a parked reader leaves the FIFO by itself once woken, and a
 * reader does not park at all while stopping. */
START_TEST(test_wait_ends_at_the_stop)
{
    static _Atomic int stop;
    struct flight *f = flight_new();
    struct waiter w;

    flight_set_head(f, &(struct http_head){ 200, -1, "", 0, 0 });
    atomic_store(&stop, 0);
    waiter_start(&w, f, 0, &stop);
    ck_assert(await_parked(f, 1));
    atomic_store(&stop, 1);
    gw_mutex_lock(&f->lock);            /* a wake-up, not a hand-back */
    pthread_cond_signal(&w.r.cv);
    gw_mutex_unlock(&f->lock);
    waiter_end(&w);
    ck_assert_int_eq(w.got, FLIGHT_WAIT_NEWS);
    ck_assert_uint_eq(flight_parked(f), 0);
    ck_assert_ptr_null(f->parked);

    waiter_start(&w, f, 0, &stop);      /* stopping: returns at once */
    waiter_end(&w);
    ck_assert_int_eq(w.got, FLIGHT_WAIT_NEWS);
    ck_assert_uint_eq(flight_parked(f), 0);
    flight_unref(f);
}
END_TEST

static Suite *
flight_suite(void)
{
    Suite *s = suite_create("flight");
    TCase *tc = tcase("flight");

    tcase_add_test(tc, test_replay_from_zero);
    tcase_add_test(tc, test_bound_counts_chunk_overhead);
    tcase_add_test(tc, test_trim_follows_the_slowest_reader);
    tcase_add_test(tc, test_lag_bound_cuts_the_slow_reader);
    tcase_add_test(tc, test_lag_cut_waits_for_the_holder);
    tcase_add_test(tc, test_caught_up_reader_never_cut);
    tcase_add_test(tc, test_no_trim_while_joinable);
    tcase_add_test(tc, test_append_enomem_leaves_flight_unchanged);
    suite_add_tcase(s, tc);

    tc = tcase("readers");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_take_only_the_readers_behind);
    tcase_add_test(tc, test_release_parks_only_the_caught_up);
    tcase_add_test(tc, test_helpers_bounded_per_flight);
    tcase_add_test(tc, test_wait_parks_until_handed_back);
    tcase_add_test(tc, test_wait_returns_to_help);
    tcase_add_test(tc, test_wait_ends_at_the_stop);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    return test_run(srunner_create(flight_suite()));
}
