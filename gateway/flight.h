/*
 * flight.h - one upstream response shared by every client that asked for
 * it: an append-only vector of immutable chunks, the response head, a
 * state, a mutex and a condition variable.
 *
 * Design (DESIGN.md "Threads and data flow"):
 *  - The leader thread is the only writer: it sets the head once, appends
 *    chunks, and finishes the flight exactly once.  Each change is made
 *    under 'lock' and followed by a broadcast on 'cv'.
 *  - Every reader (the leader's own client included) keeps its own index
 *    into the chunk vector.  A late joiner starts at 0 and replays; a slow
 *    reader never loses a chunk and never holds anyone up, because chunks
 *    are never freed or moved while the flight lives (the vector of
 *    pointers may be reallocated, so readers copy pointers under the lock
 *    and write the bytes after unlocking).
 *  - Memory lives until the last reference is dropped (refcount under
 *    'lock'): the coalescer's map holds one, the leader thread one, and
 *    every attached reader one.
 *
 * Locking: 'lock' guards every field marked (L).  The coalescer takes its
 * map lock before a flight's lock, never the other way round.
 */
#ifndef INFERGW_GATEWAY_FLIGHT_H
#define INFERGW_GATEWAY_FLIGHT_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "util.h"

#define FLIGHT_KEY_LEN 32           /* SHA-256 */
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

struct flight {
    unsigned char key[FLIGHT_KEY_LEN];  /* immutable */
    struct flight *next;            /* coalescer map chain (map lock) */

    struct gw_mutex lock;
    pthread_cond_t cv;              /* head, append, finish */

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

    unsigned refs;                  /* (L) */
    unsigned readers;               /* (L) attached clients */
    unsigned followers;             /* (L) followers that joined */
    int linked;                     /* (L) in the coalescer's map */
    int joinable;                   /* (L) new followers may join */
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

/* New flight with one reference, state RUNNING.  NULL on ENOMEM. */
struct flight *flight_new(const unsigned char key[FLIGHT_KEY_LEN]);

/* Take / drop a reference; the last drop frees everything. */
void flight_ref(struct flight *f);
void flight_unref(struct flight *f);

/*
 * Leader only.  Set the response head once; broadcast.  'content_type'
 * may be NULL; it is truncated to FLIGHT_CTYPE_MAX - 1 bytes.
 */
void flight_set_head(struct flight *f, int status, const char *content_type,
                     int64_t content_length);

/*
 * Leader only.  Append a copy of p[0..n) as one chunk; broadcast.  When
 * the flight's bytes pass 'max_bytes' it stops taking joiners.
 * Returns 0 or GW_ENOMEM (the flight is unchanged).
 */
int flight_append(struct flight *f, const char *p, size_t n,
                  size_t max_bytes);

/*
 * Leader only.  Chunk 'i' for the leader's own flush, no lock needed: the
 * leader is the only thread that changes the vector.
 */
const struct flight_chunk *flight_leader_chunk(const struct flight *f,
                                               size_t i);
size_t flight_leader_nchunks(const struct flight *f);

/*
 * Set the final state (DONE, or FAILED with the upstream rc and reason)
 * and broadcast.  Called with f->lock held (by the coalescer, which also
 * holds its map lock so that finishing and unlinking are one step).
 */
void flight_finish_locked(struct flight *f, int rc, const char *reason);

/*
 * Wait until there is something new for a reader at 'index': the head
 * (if 'need_head'), chunks past 'index', or the final state; or until
 * 'deadline' (ms, gw_now_ms clock) passes.  OUT *v: a snapshot with up
 * to 16 chunk pointers from 'index' on.  The chunks stay valid while the
 * caller holds its reference.
 * Returns 0, or GW_ETIMEDOUT (v is still filled).
 */
int flight_wait(struct flight *f, size_t index, int need_head,
                int64_t deadline, struct flight_view *v);

#endif
