/* SPDX-License-Identifier: MIT */
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
 *  - The flight also keeps every reader's state (below): parking ("nothing
 *    new for me") and appending must exclude each other, or a wake-up
 *    could be lost, so the parked FIFO lives under the same lock, and
 *    only this module's functions change it.  Who writes to a parked
 *    reader's client is fanout.h's policy on top of them.
 *  - The struct lives until the last reference is dropped (an atomic
 *    count): the coalescer's map holds one, the leader one, and every
 *    attached reader one.
 *
 * The reader's states, changed only under the flight's lock:
 *
 *              park: nothing new             take, or sweep
 *     RUNNING --------------------> PARKED -----------------> CLAIMED
 *        ^  ^                        |   ^                       |  |
 *        |  |  hand back: the flight |   | give back: caught up  |  |
 *        |  |  ended, helper, stop,  |   +-----------------------+  |
 *        |  |  wake all              |                              |
 *        |  +------------------------+                              |
 *        +----------------------------------------------------------+
 *             give back: socket full or gone, behind, timed out, cut
 *
 *   RUNNING  its own thread holds it (flight_wait() parks it).
 *   PARKED   its thread sleeps on the reader's condition variable, in the
 *            flight's parked FIFO; nobody holds it.
 *   CLAIMED  the thread that took it (flight_take(), flight_claim_parked())
 *            holds it, its thread still asleep, until flight_give_back().
 *
 * Who may use a reader's position and what its holder keeps with it
 * (fanout.h: its reply and pending bytes): its holder alone.  The lock
 * orders the hand-overs.
 *
 * The FIFO invariant: a reader enters the FIFO (parking, or given back
 * caught up) only when its position equals the flight's chunk count at
 * that moment, and the count only grows.  So readers queued earlier are
 * never ahead of readers queued later: the ones behind are always the
 * front of the FIFO, and a take is O(batch) however many are parked.
 *
 * Helpers: a parked reader handed back to help (flight_call_helpers())
 * counts in the flight's helpers until its thread's take finds nobody
 * behind (flight_take() with 'helper' set); so at most 'max' work on one
 * flight at a time.
 *
 * Locking: 'lock' guards every field marked (L).  It may be taken while
 * the coalescer's map lock is held, never the other way round.  Every
 * function here takes it itself, except those named _locked, which
 * assert that the caller holds it.
 */
#ifndef INFERGW_GATEWAY_COALESCE_FLIGHT_H
#define INFERGW_GATEWAY_COALESCE_FLIGHT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "http_response.h"
#include "util.h"

#include "base/outcome.h"

#define FLIGHT_KEY_LEN 32           /* SHA-256 (coalesce.h) */
#define FLIGHT_ID_LEN 31            /* "flight-" and 24 hex digits */
#define FLIGHT_SNAP_MAX 64          /* chunk pointers in one snapshot */

enum flight_state {
    FLIGHT_RUNNING = 0,
    FLIGHT_DONE,                    /* upstream body complete */
    FLIGHT_FAILED,                  /* upstream failed; see outcome */
};

struct flight_chunk {
    size_t len;
    size_t at;                      /* the flight's bytes before it, with
                                       the overhead: readers' lag */
    int usage;                      /* a stream's usage event, alone: sent
                                       only to the clients that asked
                                       (flight_append_usage()) */
    char data[];                    /* immutable once appended */
};

/* What a chunk costs besides its bytes (counted against the bound). */
#define FLIGHT_CHUNK_OVERHEAD \
    (sizeof(struct flight_chunk) + sizeof(struct flight_chunk *) + 16)

/*
 * How far the leader's upstream call is, for the status view (status.h):
 * waiting in the pool's queue for a slot, the call sent and no body
 * byte yet, or the body arriving (the held head came with its first
 * byte, upstream.h).
 */
enum flight_phase {
    FLIGHT_PHASE_QUEUED = 0,
    FLIGHT_PHASE_WAITING,           /* for the first body byte */
    FLIGHT_PHASE_STREAMING,
};

enum flight_reader_state {
    FLIGHT_READER_RUNNING = 0,
    FLIGHT_READER_PARKED,
    FLIGHT_READER_CLAIMED,
};

/*
 * One attached client, as the flight sees it: a position and a state.
 * Embedded in the client's struct fanout_reader.  'pos' only grows; it is
 * moved by the reader's holder (flight_reader_advance()), with
 * memory_order_release once the chunks before it are no longer read, and
 * read by the trimmer.  Use the functions below, not the fields.
 */
struct flight_reader {
    struct flight_reader *prev, *next;  /* (L) the flight's readers */
    struct flight_reader *qprev, *qnext;    /* (L) the parked FIFO; qnext
                                       also links a claimed batch */
    enum flight_reader_state state; /* (L) */
    int helper;                     /* set under (L) as it is handed back
                                       to help; flight_wait() clears it */
    int parkable;                   /* CLAIMED: the holder's verdict for
                                       flight_give_back() */
    pthread_cond_t cv;              /* signalled under (L) when handed
                                       back */
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
 * position past them and the reader is marked as being read (a batch
 * from flight_take() relies on this for each reader in it, whatever the
 * others' positions).
 */
struct flight_snap {
    int cut;                        /* flight_snap_reader(): the reader
                                       was cut; nothing else is set */
    const struct http_head *head;
    enum flight_state state;
    struct call_outcome outcome;    /* DONE, FAILED: the call's */
    size_t nchunks;                 /* chunks appended so far */
    size_t lo, n;                   /* chunk[i] is chunk lo + i */
    struct flight_chunk *chunk[FLIGHT_SNAP_MAX];
};

struct flight {
    char id[FLIGHT_ID_LEN + 1];     /* immutable: the upstream call's
                                       X-Request-Id, for every client */
    struct gw_mutex lock;

    int head_set;                   /* (L) */
    struct http_head head;        /* (L) until head_set, then immutable */

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
    struct call_outcome outcome;    /* (L) set with the final state */
    int has_usage;                  /* (L) usage.h: what the call cost */
    int64_t usage_prompt, usage_completion;     /* (L) */
    int has_charge;                 /* (L) what each client's tenant is
                                       charged (tenant.h) */
    uint64_t charge;                /* (L) tokens */
    int charge_counted;             /* (L) the gateway's count */

    struct flight_reader *readers;  /* (L) every attached reader */
    _Atomic unsigned nreaders;      /* (L) to write; anyone may read */

    struct flight_reader *parked;   /* (L) FIFO, oldest first */
    struct flight_reader *parked_tail;  /* (L) */
    size_t nparked;                 /* (L) */
    unsigned helping;               /* (L) helpers at work on it */

    _Atomic unsigned refs;

    /*
     * For the status view, read without the lock (relaxed: each is a
     * value of its own, never combined with another): the phase, the
     * name of the upstream the call is on (borrowed from the leader's
     * configuration generation, which it holds while the flight is in
     * the map; NULL before the first attempt), and the body bytes
     * appended so far.  Only the leader writes them.
     */
    _Atomic int phase;              /* enum flight_phase */
    const char *_Atomic upstream;
    _Atomic uint64_t body_bytes;
};

/* A new joinable flight with one reference and a fresh id; NULL: ENOMEM. */
struct flight *flight_new(void);

/* Take / drop a reference; the last drop frees everything.  NULL-safe. */
void flight_ref(struct flight *f);
void flight_unref(struct flight *f);

/*
 * Attach 'r' (at chunk 0) if the flight still takes joiners: it runs, or
 * it is DONE with its whole log (flight_replayable()).  Returns 0, or
 * GW_ETOOBIG: it grew past max_flight_bytes (or failed), and a newcomer
 * could no longer be given everything.
 */
int flight_attach(struct flight *f, struct flight_reader *r);

/*
 * Detach 'r' (its client is done or gone); what only it still needed may
 * be freed from now on.  Returns the readers still attached.
 */
unsigned flight_detach(struct flight *f, struct flight_reader *r);

/* The flight's id (immutable, any thread). */
const char *flight_id(const struct flight *f);

/* Readers attached now (any thread; may be stale by the time it is used). */
unsigned flight_readers(struct flight *f);

/*
 * Leader only: the call is on upstream 'name' now (borrowed, see struct
 * flight), past the pool's queue: FLIGHT_PHASE_WAITING until the head
 * (flight_set_head()) makes it STREAMING.
 */
void flight_set_upstream(struct flight *f, const char *name);

/*
 * Leader only.  Set the response head once (and the phase STREAMING):
 * a copy of 'h', which every reader's reply begins with.
 */
void flight_set_head(struct flight *f, const struct http_head *h);

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
 * Leader only.  The same for p[0..n) that is a stream's usage event and
 * nothing else (usage.h's struct usage_split): the chunk is flagged
 * 'usage', and a reader whose client did not ask for the usage skips it
 * (fanout.h).  Its bytes count as any chunk's.
 */
int flight_append_usage(struct flight *f, const char *p, size_t n,
                        size_t max_bytes, size_t max_lag);

/*
 * Set the final state from the call's outcome 'o' (copied): DONE when it
 * is CALL_OK, else FAILED, and every client is told 'o' (reply.h's
 * reply_failure()).  Once.  Parked readers are not woken here: the
 * caller hands them back (flight_wake_all()).
 */
void flight_finish(struct flight *f, const struct call_outcome *o);

/*
 * Can a finished flight be replayed whole to a newcomer: DONE, with its
 * head, and never past max_flight_bytes (so no chunk was freed)?  A DONE
 * flight stays joinable for that (flight_attach()); only the coalescer's
 * cache lets anyone reach it then.  OUT *bytes: its memory, chunks with
 * their overhead, the struct and the chunk vector.
 */
int flight_replayable(struct flight *f, uint64_t *bytes);

/* Before a successful flight_finish(): the call's token usage.  The
 * driver only. */
void flight_set_usage(struct flight *f, int64_t prompt, int64_t completion);

/* The usage of a DONE flight: 1 with both set, else 0. */
int flight_usage(struct flight *f, int64_t *prompt, int64_t *completion);

/* Before flight_finish(), whatever the outcome: the tokens each of its
 * clients is charged (usage_scan_charge()).  The driver only. */
void flight_set_charge(struct flight *f, uint64_t tokens, int counted);

/* The charge of a finished flight (DONE or FAILED): 1 with both set,
 * else 0 (still running, or no charge was set). */
int flight_charge(struct flight *f, uint64_t *tokens, int *counted);

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

/* Its holder reads no more chunks for 'r' (any thread, no lock). */
void flight_read_done(struct flight_reader *r);

/* ---- the reader's state (see the diagram above) ---- */

/* A RUNNING reader, not attached yet.  Release it once it is detached. */
void flight_reader_init(struct flight_reader *r);
void flight_reader_release(struct flight_reader *r);

/*
 * Its holder's view, no lock: the position (the next chunk to send);
 * moving it on to 'pos' (not back), which lets the chunks before 'pos'
 * be freed; the lag it was cut at (once a snapshot said so); and the
 * verdict on a CLAIMED reader for flight_give_back(): 1 caught up (park
 * it again), 0 its own thread goes on.
 */
size_t flight_reader_pos(const struct flight_reader *r);
void flight_reader_advance(struct flight_reader *r, size_t pos);
size_t flight_reader_cut_lag(const struct flight_reader *r);
void flight_reader_set_parkable(struct flight_reader *r, int parkable);

/* The next reader of a claimed batch, or NULL (its holder only). */
struct flight_reader *flight_batch_next(const struct flight_reader *r);

enum flight_wait {
    FLIGHT_WAIT_NEWS,           /* OUT *s is set */
    FLIGHT_WAIT_HELP,           /* handed back to help: s is not set */
};

/*
 * The reader's own thread, RUNNING, with nothing of its own left to
 * write: when the flight runs, has no chunk past r's position, r is not
 * cut and *stopping is not set, park r and sleep until it is handed back
 * (or, still parked, until *stopping is set and the sleep is woken).
 * Then OUT *s: flight_snap_reader() from r's position, unless r was
 * handed back to help.  Meanwhile its holders may move its position.
 */
enum flight_wait flight_wait(struct flight *f, struct flight_reader *r,
                             const _Atomic int *stopping,
                             struct flight_snap *s);

/*
 * Take up to 'max' parked readers that are behind, oldest first (the
 * front of the FIFO, by its invariant): they become CLAIMED, a batch
 * linked for flight_batch_next(), each marked as being read.  OUT *s:
 * the snapshot from the first one's position, the lowest.  Returns the
 * batch, or NULL when nobody is behind; with 'helper' set (the caller is
 * a helper) that NULL also ends the caller's help.
 */
struct flight_reader *flight_take(struct flight *f, size_t max,
                                  struct flight_snap *s, int helper);

/* Claim every parked reader, oldest first, as a batch (the sweep). */
struct flight_reader *flight_claim_parked(struct flight *f);

/*
 * Give a claimed batch back: a reader whose holder found it caught up
 * (flight_reader_set_parkable()) that has every chunk, while the flight
 * runs and it is not cut, is parked again, still asleep; the others go
 * back to their threads.  The batch must not be touched afterwards.
 * NULL-safe.
 */
void flight_give_back(struct flight *f, struct flight_reader *batch);

/*
 * Right after an append, when every parked reader is behind: hand back
 * one oldest parked reader per 'per' parked, as helpers, so that at most
 * 'max' help on the flight at a time.  Returns how many.
 */
size_t flight_call_helpers(struct flight *f, size_t max, size_t per);

/* Hand every parked reader back to its thread (the flight ended, stop). */
void flight_wake_all(struct flight *f);

#ifdef INFERGW_UNIT_TEST
/* ---- test builds only (test/check_exports.py) ---- */

/*
 * OUT *s: what a reader at position 'lo' may send (see struct
 * flight_snap).  'lo' must be at or after the oldest kept chunk, which
 * the position of an attached reader that is not cut always is.
 */
void flight_snap(struct flight *f, size_t lo, struct flight_snap *s);

/* Bytes in memory now, overhead included. */
size_t flight_kept_bytes(struct flight *f);

/* Readers parked now. */
size_t flight_parked(struct flight *f);
#endif

#endif
