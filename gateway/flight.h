/*
 * flight.h - one upstream response shared by every client that asked for
 * it: an append-only vector of immutable chunks, the response head, a
 * state, a mutex, and the readers that wait for more.
 *
 * Design (DESIGN.md "Threads and data flow"):
 *  - The leader thread is the only writer: it sets the head once, appends
 *    chunks, and finishes the flight exactly once, each under 'lock'.
 *  - Every reader (the leader's own client included) keeps its own index
 *    into the chunk vector.  A late joiner starts at 0 and replays; a slow
 *    reader never loses a chunk and never holds anyone up, because chunks
 *    are never freed or moved while the flight lives (the vector of
 *    pointers may be reallocated, so readers copy pointers under the lock
 *    and write the bytes after unlocking).
 *  - A reader that has sent everything there is PARKS: it sleeps on its
 *    own condition variable in the flight's parked list.  After each
 *    append the leader TAKES the parked readers a few at a time (CLAIMS
 *    them), writes the new bytes to each one's socket itself, without
 *    ever blocking (proxy.c), and RELEASES them: a reader that took
 *    everything is parked again, still asleep; one whose socket was full
 *    (or gone) is handed back to its own thread and signalled, and goes
 *    on at its own pace.  When many readers are behind, the leader first
 *    wakes the threads of a few of them (HELPERS, one per CPU), which
 *    take and write alongside it until nobody is behind, so the writes
 *    run on every core and a writer the scheduler holds back leaves its
 *    share to the others.  With [coalesce] leader_writes = off the
 *    leader hands every parked reader back at once, and each writes its
 *    own bytes: the design card's shape.  Why: a thread wake-up costs two
 *    context switches and a turn at the flight's mutex; with 1,000
 *    followers on two cores that made the first chunk reach the last
 *    follower 26-29 ms after the leader, and the leader and its helpers
 *    take 7-9 ms, for half the CPU (docs/BENCHMARKS.md).
 *  - The flight's end hands every parked reader back.
 *  - Memory lives until the last reference is dropped (an atomic
 *    count): the coalescer's map holds one, the leader thread one, and
 *    every attached reader one.
 *
 * Locking: 'lock' guards every field marked (L); the coalescer's map lock
 * those marked (M).  Only finishing takes both: the map lock first, never
 * the other way round.
 */
#ifndef INFERGW_GATEWAY_FLIGHT_H
#define INFERGW_GATEWAY_FLIGHT_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "util.h"

#define FLIGHT_KEY_LEN 32           /* SHA-256 */
#define FLIGHT_ID_LEN 31            /* "flight-" and 24 hex digits */
#define FLIGHT_CTYPE_MAX 128

enum flight_state {
    FLIGHT_RUNNING = 0,
    FLIGHT_DONE,                    /* upstream body complete */
    FLIGHT_FAILED,                  /* upstream failed; see err_* */
};

struct flight_chunk {
    size_t len;
    char data[];                    /* immutable once appended */
};

/*
 * Where a reader is, and so who may touch its client and 'index':
 * RUNNING - its own thread; PARKED - nobody (its thread sleeps, the
 * leader or a helper may claim it); CLAIMED - the leader or the helper
 * that claimed it, until it releases it.
 * 'where' changes only under the flight's lock, which orders the two
 * threads' accesses to the rest.
 */
enum flight_where {
    FLIGHT_READER_RUNNING = 0,
    FLIGHT_READER_PARKED,
    FLIGHT_READER_CLAIMED,
};

struct flight_reader {
    struct flight_reader *next;     /* (L) parked list, or claimed batch */
    struct flight_reader *prev;     /* (L) parked list */
    pthread_cond_t cv;              /* signalled when handed back */
    enum flight_where where;        /* (L) */
    int waiting;                    /* (L) timed out while claimed */
    int parkable;                   /* set by the claimer: caught up */
    size_t index;                   /* next chunk to send (see 'where') */
    int helper;                     /* set under the lock as it is
                                       handed back to help take and write
                                       (flight_call_helpers); then its
                                       own thread's, which clears it */
};

struct flight {
    unsigned char key[FLIGHT_KEY_LEN];  /* immutable */
    char id[FLIGHT_ID_LEN + 1];     /* immutable: the upstream call's
                                       X-Request-Id, for every client */
    struct flight *next;            /* coalescer map chain (map lock) */

    struct gw_mutex lock;
    struct flight_reader *parked;   /* (L) FIFO, oldest first */
    struct flight_reader *parked_tail;  /* (L) */
    size_t nparked;                 /* (L) */

    int head_set;                   /* (L) */
    int status;                     /* (L) upstream status */
    char content_type[FLIGHT_CTYPE_MAX];    /* (L) "" if none */
    int64_t content_length;         /* (L) -1 unknown */

    struct flight_chunk **chunks;   /* (L) */
    size_t nchunks;                 /* (L) */
    size_t cap;                     /* (L) */
    size_t bytes;                   /* (L) body bytes appended */

    enum flight_state state;        /* (L) */
    int err_rc;                     /* (L) GW_ETIMEDOUT, GW_EUPSTREAM... */
    char err_reason[64];            /* (L) upstream_result.reason */

    /*
     * Membership, (M): under the coalescer's map lock (coalesce.c), so
     * that joining and leaving never wait for the flight's lock.
     */
    unsigned followers;             /* (M) followers that joined */
    int linked;                     /* (M) in the coalescer's map */
    _Atomic unsigned readers;       /* (M) attached clients; any may read */
    _Atomic int joinable;           /* (M), or cleared by the leader when
                                       the flight grows too big */
    _Atomic unsigned refs;          /* atomic */
};

/* A reader's view of what it may send next (copied under the lock). */
struct flight_view {
    int head_set;
    int status;
    char content_type[FLIGHT_CTYPE_MAX];
    int64_t content_length;
    enum flight_state state;
    int err_rc;
    char err_reason[64];
    size_t nchunks;                 /* chunks available to this reader */
    struct flight_chunk *chunk[16]; /* chunks [index .. index+count) */
    size_t count;
};

/* The response head, as set by the leader. */
struct flight_head {
    int status;
    int64_t content_length;         /* -1 unknown */
    char content_type[FLIGHT_CTYPE_MAX];    /* "" if none */
};

/* Chunks [lo, hi) of a flight: chunk i is v[i - lo]. */
struct flight_span {
    struct flight_chunk *const *v;
    size_t lo, hi;
    struct flight_chunk **copy;     /* flight_copy_span()'s, or NULL */
};

/* A reader that is RUNNING at index 0; destroy it once it is done. */
void flight_reader_init(struct flight_reader *r);
void flight_reader_destroy(struct flight_reader *r);

/* New flight with one reference, state RUNNING.  NULL on ENOMEM. */
struct flight *flight_new(const unsigned char key[FLIGHT_KEY_LEN]);

/* Take / drop a reference; the last drop frees everything. */
void flight_ref(struct flight *f);
void flight_unref(struct flight *f);

/*
 * Leader only.  Set the response head once.  'content_type' may be NULL;
 * it is truncated to FLIGHT_CTYPE_MAX - 1 bytes.
 */
void flight_set_head(struct flight *f, int status, const char *content_type,
                     int64_t content_length);

/*
 * Leader only.  Append a copy of p[0..n) as one chunk.  When the flight's
 * bytes pass 'max_bytes' it stops taking joiners.  Parked readers are not
 * woken: the leader claims them next.
 * Returns 0 or GW_ENOMEM (the flight is unchanged).
 */
int flight_append(struct flight *f, const char *p, size_t n,
                  size_t max_bytes);

/*
 * Leader only.  Every chunk so far, no lock needed: the leader is the
 * only thread that changes the vector.  Valid until its next append.
 */
void flight_leader_span(const struct flight *f, struct flight_span *s);

/*
 * Anyone holding a reference: OUT *h the head and *s a copy of the chunk
 * pointers [lo, nchunks) (the chunks stay valid while the reference is
 * held).  Returns 0, or GW_ENOMEM.  Free with flight_span_release().
 */
int flight_copy_span(struct flight *f, size_t lo, struct flight_head *h,
                     struct flight_span *s);
void flight_span_release(struct flight_span *s);

/*
 * Leader only.  Take every parked reader: they become CLAIMED and are
 * returned as a list linked by 'next' (NULL if none).  The caller may
 * write to their clients and move their 'index', sets each one's
 * 'parkable' (1: it took everything and may sleep on), and must give the
 * whole list back with flight_release() before it appends again or
 * finishes.
 */
struct flight_reader *flight_claim(struct flight *f, size_t *count);

/*
 * Leader or helper.  Take up to 'max' of the parked readers that are
 * behind (index < nchunks), oldest first: they become CLAIMED and are
 * returned as a list linked by 'next' (NULL when none is behind).  The
 * caller owns them as with flight_claim() and gives them back with
 * flight_release(); a helper may still hold some when the leader
 * appends again, and they are then handed back (not caught up).
 * OUT *left: readers still parked, behind or not.
 */
struct flight_reader *flight_take(struct flight *f, size_t max,
                                  size_t *left);

/*
 * Leader only, right after an append.  Share the writing: hand up to
 * 'max' of the oldest parked readers, one per 'per' (> 0) parked readers,
 * back to their threads with 'helper' set; such a thread serves its own
 * client, then takes and writes (flight_take) alongside the leader until
 * nobody is behind, then clears 'helper'.  Returns how many it called.
 */
size_t flight_call_helpers(struct flight *f, size_t max, size_t per);

/*
 * Leader or helper.  Give claimed readers back: 'parkable' ones that are
 * caught up with the flight (and it is still running) are parked again,
 * still asleep; the others are handed back to their threads (RUNNING)
 * and signalled.  The readers must not be touched afterwards.
 */
void flight_release(struct flight *f, struct flight_reader *list);

/*
 * Set the final state (DONE, or FAILED with the upstream rc and reason).
 * Called with f->lock held (by the coalescer, which also holds its map
 * lock so that finishing and unlinking are one step).  Parked readers
 * are not woken yet: call flight_wake_all() after dropping the map lock.
 */
void flight_finish_locked(struct flight *f, int rc, const char *reason);

/* Hand every parked reader back to its thread and signal it. */
void flight_wake_all(struct flight *f);

/*
 * Reader: wait until there is something new at r->index (chunks past it,
 * or the final state) or until 'deadline' (ms, gw_now_ms clock) passes,
 * parked in the meantime, so the leader may send chunks for it (r->index
 * and the client's state move then).  OUT *v: a snapshot with up to 16
 * chunk pointers from r->index on; they stay valid while the caller holds
 * its reference.  Call only with nothing of the reader's own left to
 * write, and with r->helper handled (a helper's first job after the
 * wait).  A wait that times out while the leader holds the reader ends
 * when the leader releases it.
 * Returns 0, or GW_ETIMEDOUT (v is still filled).
 */
int flight_wait(struct flight *f, struct flight_reader *r, int64_t deadline,
                struct flight_view *v);

#endif
