/*
 * flight.h - one upstream response shared by every client that asked for
 * it: the response head, an append-only log of immutable chunks, the
 * final state, the readers attached to it, and one lock.
 *
 * Design (DESIGN.md "Threads and data flow"):
 *  - One writer: the leader thread sets the head once, appends chunks,
 *    and finishes the flight exactly once.
 *  - Readers, one per client (the leader's own included), attach while
 *    the flight is joinable, each at chunk 0: a late joiner replays
 *    everything.  Each keeps its own position, so a slow reader never
 *    loses a chunk and never holds anyone else up.  How the chunks get
 *    from here to the clients' sockets is fanout.h's business.
 *  - Memory is bounded by max_flight_bytes.  Each chunk counts its bytes
 *    plus FLIGHT_CHUNK_OVERHEAD (its header, its slot in the vector and
 *    the allocator's share), so an upstream sending tiny chunks cannot
 *    multiply the bound.  Past the bound the flight takes no more
 *    joiners (a newcomer would need everything from chunk 0), and from
 *    then on the chunks that every attached reader has sent are freed:
 *    what stays is about what the slowest reader has still to send, plus
 *    at most max_flight_bytes appended since the last look.
 *  - And that is bounded too: a reader further behind than max_reader_lag
 *    (its lag: the bytes, counted the same way, from its position to the
 *    newest chunk but one, so a reader that had everything before this
 *    append is never behind) is CUT.  The flight stops keeping chunks
 *    for it, and its holder, told by its next snapshot, ends its client's
 *    response with an error.  So a flight keeps at most max_flight_bytes
 *    + max_reader_lag (and one chunk).
 *  - So a chunk lives while some reader that is not cut has its position
 *    at or before it, and a reader may hold pointers only to chunks from
 *    its own position on (flight_snap() gives exactly those).  A cut
 *    reader's holder may be reading such chunks at the moment of the cut
 *    (a non-blocking write of a snapshot): the snapshot marks the reader
 *    as being read, and until its holder is done (flight_read_done()) the
 *    cut reader's position still holds its chunks.  No holder waits on a
 *    client while it reads chunks (fanout.c), so that is brief.
 *  - The parked readers (fanout.h) are queued here too, under the same
 *    lock: parking ("nothing new for me") and appending must exclude
 *    each other, or a wake-up could be lost.  Only fanout.c touches them.
 *  - The struct lives until the last reference is dropped (an atomic
 *    count): the coalescer's map holds one, the leader one, and every
 *    attached reader one.
 *
 * Locking: 'lock' guards every field marked (L).  It may be taken while
 * the coalescer's map lock is held, never the other way round.
 */
#ifndef INFERGW_GATEWAY_FLIGHT_H
#define INFERGW_GATEWAY_FLIGHT_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "util.h"

#define FLIGHT_KEY_LEN 32           /* SHA-256 (coalesce.h) */
#define FLIGHT_ID_LEN 31            /* "flight-" and 24 hex digits */
#define FLIGHT_CTYPE_MAX 128
#define FLIGHT_SNAP_MAX 16          /* chunk pointers in one snapshot */

enum flight_state {
    FLIGHT_RUNNING = 0,
    FLIGHT_DONE,                    /* upstream body complete */
    FLIGHT_FAILED,                  /* upstream failed; see err_rc */
};

struct flight_chunk {
    size_t len;
    size_t at;                      /* the flight's bytes before it, with
                                       the overhead: readers' lag */
    char data[];                    /* immutable once appended */
};

/* What a chunk costs besides its bytes (counted against the bound). */
#define FLIGHT_CHUNK_OVERHEAD \
    (sizeof(struct flight_chunk) + sizeof(struct flight_chunk *) + 16)

/* The response head, as the upstream sent it. */
struct flight_head {
    int status;
    int64_t content_length;         /* -1 unknown */
    char content_type[FLIGHT_CTYPE_MAX];    /* "" if none */
    int retry_after_s;              /* the upstream's, on a 429/503; 0 */
};

/*
 * One attached client, as the flight sees it: a position.  Embedded in
 * the client's struct fanout_reader.  'pos' only grows; it is moved by
 * whoever holds the reader (fanout.h), with memory_order_release once
 * the chunks before it are no longer read, and read by the trimmer.
 */
struct flight_reader {
    struct flight_reader *prev, *next;  /* (L) the flight's readers */
    _Atomic size_t pos;             /* next chunk to send; the chunks
                                       before it are the flight's to free */
    _Atomic int reading;            /* set under (L) with a snapshot its
                                       holder reads chunks of; cleared by
                                       the holder, with release, when done
                                       (flight_read_done()) */
    int cut;                        /* (L) further behind than
                                       max_reader_lag: no chunk is kept
                                       for it any more */
    size_t cut_lag;                 /* (L) its lag then; immutable once
                                       'cut' is set */
};

/*
 * What a reader may send next, copied under the lock: the head (NULL
 * until it came; then immutable), the state, and up to FLIGHT_SNAP_MAX
 * chunk pointers from 'lo' on.  A chunk is freed only once every attached
 * reader's position is past it (a cut reader's only while it is being
 * read), so the holder of a reader may read the snapshot's chunks from
 * that reader's own position on, as long as it has not moved the
 * position past them and the reader is marked as being read (fanout.c's
 * batches rely on this for each reader they hold, whatever the others'
 * positions).
 */
struct flight_snap {
    int cut;                        /* flight_snap_reader(): the reader
                                       was cut; nothing else is set */
    const struct flight_head *head;
    enum flight_state state;
    int err_rc;                     /* FAILED: GW_ETIMEDOUT, ... */
    const char *err_reason;         /* FAILED: static-like text, or "" */
    int err_status;                 /* FAILED: flight_set_failure() */
    int err_retry_after_s;
    size_t nchunks;                 /* chunks appended so far */
    size_t lo, n;                   /* chunk[i] is chunk lo + i */
    struct flight_chunk *chunk[FLIGHT_SNAP_MAX];
};

struct fanout_reader;               /* fanout.h */

struct flight {
    char id[FLIGHT_ID_LEN + 1];     /* immutable: the upstream call's
                                       X-Request-Id, for every client */
    struct gw_mutex lock;

    int head_set;                   /* (L) */
    struct flight_head head;        /* (L) until head_set, then immutable */

    /* The log: chunk i is chunks[i - base]; [first, nchunks) are kept. */
    struct flight_chunk **chunks;   /* (L) */
    size_t base, first, nchunks;    /* (L) */
    size_t cap;                     /* (L) slots in 'chunks' */
    size_t total;                   /* (L) bytes ever appended, with the
                                       overhead: the joining bound */
    size_t kept;                    /* (L) bytes in memory, with overhead */
    size_t trim_at;                 /* (L) 'kept' that makes the next
                                       append free what it can */
    int joinable;                   /* (L) takes new readers */

    enum flight_state state;        /* (L) */
    int err_rc;                     /* (L) */
    char err_reason[64];            /* (L) */
    int err_status;                 /* (L) */
    int err_retry_after_s;          /* (L) */
    int has_usage;                  /* (L) usage.h: what the call cost */
    int64_t usage_prompt, usage_completion;     /* (L) */

    struct flight_reader *readers;  /* (L) every attached reader */
    _Atomic unsigned nreaders;      /* (L) to write; anyone may read */

    /* fanout.c's, under 'lock' (see the design note above). */
    struct fanout_reader *parked;   /* (L) FIFO, oldest first */
    struct fanout_reader *parked_tail;  /* (L) */
    size_t nparked;                 /* (L) */
    unsigned helping;               /* (L) helpers at work on it */

    _Atomic unsigned refs;
};

/* A new joinable flight with one reference and a fresh id; NULL: ENOMEM. */
struct flight *flight_new(void);

/* Take / drop a reference; the last drop frees everything.  NULL-safe. */
void flight_ref(struct flight *f);
void flight_unref(struct flight *f);

/*
 * Attach 'r' (at chunk 0) if the flight still takes joiners.  Returns 0,
 * or GW_ETOOBIG: it grew past max_flight_bytes (or ended), and a newcomer
 * could no longer be given everything.
 */
int flight_attach(struct flight *f, struct flight_reader *r);

/*
 * Detach 'r' (its client is done or gone); what only it still needed may
 * be freed from now on.  Returns the readers still attached.
 */
unsigned flight_detach(struct flight *f, struct flight_reader *r);

/* Readers attached now (any thread; may be stale by the time it is used). */
unsigned flight_readers(struct flight *f);

/*
 * Leader only.  Set the response head once.  'content_type' may be NULL;
 * it is truncated to FLIGHT_CTYPE_MAX - 1 bytes.
 */
void flight_set_head(struct flight *f, int status, const char *content_type,
                     int64_t content_length, int retry_after_s);

/*
 * Leader only.  Append a copy of p[0..n) as one chunk.  Past 'max_bytes'
 * (total, with the overhead) the flight takes no more joiners, and then
 * frees the chunks every reader has sent, cutting the readers further
 * behind than 'max_lag' (see the design note).  Parked readers are not
 * woken: fanout_after_append() decides.
 * Returns 0 or GW_ENOMEM (the flight is unchanged).
 */
int flight_append(struct flight *f, const char *p, size_t n,
                  size_t max_bytes, size_t max_lag);

/*
 * Set the final state: DONE (rc 0), or FAILED with the upstream's rc and
 * 'reason' (copied).  Once.  Parked readers are not woken here: the
 * caller hands them back (fanout_wake_all()).
 */
void flight_finish(struct flight *f, int rc, const char *reason);

/*
 * Before a failing flight_finish(): the upstream status its last attempt
 * stopped at unheard (429/502/503/504, else 0) and the Retry-After
 * seconds for the clients' answer (0: none), as reply_failure() takes
 * them.  The driver only.
 */
void flight_set_failure(struct flight *f, int status, int retry_after_s);

/* Before a successful flight_finish(): the call's token usage.  The
 * driver only. */
void flight_set_usage(struct flight *f, int64_t prompt, int64_t completion);

/* The usage of a DONE flight: 1 with both set, else 0. */
int flight_usage(struct flight *f, int64_t *prompt, int64_t *completion);

/*
 * OUT *s: what a reader at position 'lo' may send (see struct
 * flight_snap).  'lo' must be at or after the oldest kept chunk, which
 * the position of an attached reader that is not cut always is.  The
 * _locked form is for fanout.c, which holds the lock already; it marks
 * the readers it sends a snapshot for with flight_reading_locked().
 */
void flight_snap(struct flight *f, size_t lo, struct flight_snap *s);
void flight_snap_locked(struct flight *f, size_t lo, struct flight_snap *s);

/*
 * The holder of 'r', about to send from its position: OUT *s is
 * flight_snap() from there, and 'r' is marked as being read, so that a cut
 * cannot free the snapshot's chunks under the holder until it calls
 * flight_read_done(r).  For a reader that was cut, s->cut is set and
 * nothing else: its holder must end its client's response, and never
 * read a chunk for it again.
 */
void flight_snap_reader(struct flight *f, struct flight_reader *r,
                        struct flight_snap *s);
void flight_snap_reader_locked(struct flight *f, struct flight_reader *r,
                               struct flight_snap *s);

/* Mark 'r' (not cut) as being read, for a snapshot taken for several
 * readers (fanout.c's batches). */
void flight_reading_locked(struct flight *f, struct flight_reader *r);

/* Its holder reads no more chunks for 'r' (any thread, no lock). */
void flight_read_done(struct flight_reader *r);

/* Bytes in memory now, overhead included (tests, benchmarks). */
size_t flight_kept_bytes(struct flight *f);

#endif
