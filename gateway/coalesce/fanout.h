/* SPDX-License-Identifier: MIT */
/*
 * fanout.h - how a flight's chunks reach its clients: the writer policy
 * on top of the flight's readers, and the loop each client's own thread
 * runs.
 *
 * The readers' states (RUNNING, PARKED, CLAIMED), the parked FIFO and
 * its invariant, and every change of state belong to the flight: see the
 * state diagram in flight.h.  This module decides who writes what, and
 * when, using flight.h's calls (flight_wait, flight_take,
 * flight_give_back, flight_call_helpers, flight_claim_parked,
 * flight_wake_all); it touches no field of struct flight.
 *
 * Design.  A reader (one client of a flight, fanout_reader) that has
 * sent its client everything there is so far PARKS: its thread sleeps in
 * flight_wait().  Two policies, chosen once from [coalesce]
 * leader_writes (fanout_policy_of()), say what happens after each
 * append:
 *
 *   fanout_push_policy (on, the default): the leader writes the new
 *   bytes to parked readers' sockets itself, never blocking, a few at a
 *   time: it TAKES a batch (they become CLAIMED), pushes to each with one
 *   non-blocking writev, and RELEASES them: a reader that took
 *   everything is parked again, still asleep; one whose socket was full
 *   (the rest kept in its 'pending'), or whose client is gone, is handed
 *   back to its own thread, which goes on at its client's pace.  With
 *   many parked readers, the leader first hands a few back as HELPERS
 *   (one per PER_HELPER parked, at most one per CPU at work on a flight
 *   at a time): each serves its own client, then takes and writes
 *   alongside the leader, its own client again between takes, until
 *   nobody is behind.  So the writes run on every core, and a writer the
 *   scheduler holds back leaves its share to the others.  Why: a thread
 *   wake-up costs two context switches and a turn at the flight's lock;
 *   with 1,000 followers on two cores, waking each to write for itself
 *   got the first chunk to the last follower 26-29 ms after the leader,
 *   pushing gets it there in 7-9 ms for half the CPU
 *   (docs/BENCHMARKS.md).
 *
 *   fanout_wake_policy (off): the leader wakes everyone after each
 *   append instead: the design card's shape, where every follower
 *   writes its own bytes.
 *
 * Who may use a reader's reply and 'pending': whoever holds the reader
 * (flight.h: its own thread when RUNNING, nobody when PARKED, the thread
 * that took it when CLAIMED).
 *
 * Nobody waits on a client while reading the flight's chunks: a holder
 * writes them without waiting, and what the socket does not take is
 * copied into the reader's 'pending' (a reader's own thread copies only
 * the rest of one chunk, then waits on that copy, as it waited on the
 * chunk itself before).  So no thread holds a pointer to a chunk while
 * a slow client keeps it waiting, and a reader that is cut (too far
 * behind, flight.h) lets go of the flight's memory at once, however
 * slow its client: the snapshot it is written from marks it as being
 * read only until the write returns.  Its holder learns of the cut from
 * its next snapshot and ends the response with fanout_cut_begin() and
 * fanout_cut_end().  A cut reader is never parked: a parked one had
 * everything before the newest chunk, so it is never behind.
 *
 * Timeouts: a parked reader waits without a timer.  The leader looks at
 * the parked readers at most once a second (fanout_sweep(), from its
 * sink's on_tick, which the transfer loop calls at least that often):
 * one poll() of all their sockets finds clients that hung up, and a
 * reader past its deadline (follower_timeout without progress) is handed
 * back to answer 504.  A stop wakes everyone (flight_wake_all(), through
 * coalescer_wake_all()).
 */
#ifndef INFERGW_GATEWAY_COALESCE_FANOUT_H
#define INFERGW_GATEWAY_COALESCE_FANOUT_H

#include <stdatomic.h>
#include <stdint.h>

#include "buf.h"
#include "coalesce/flight.h"

struct reply;

struct fanout_reader {
    struct flight_reader fr;        /* its state and position (flight.h) */
    int expired;                    /* set by the sweep that holds it:
                                       no progress for follower_timeout */
    int64_t deadline;               /* progress by then, or 504 */
    int64_t timeout_ms;             /* follower_timeout */
    struct reply *reply;            /* the client; borrowed */
    const char *key_hex;            /* the flight's key, for log lines;
                                       borrowed */
    int usage;                      /* its client asked for a stream's
                                       usage event: the chunks flagged
                                       'usage' (flight.h) are its too */
    struct buf pending;             /* framed bytes its socket did not
                                       take when someone pushed for it */
};

struct fanout_opts;

/*
 * Who writes a flight's new chunks to its parked readers (see Design):
 * the leader calls 'after_append' right after each append.  Chosen once
 * per request from the configuration; immutable, shared by every thread.
 */
struct fanout_policy {
    const char *name;               /* for log lines and tests */
    void (*after_append)(struct flight *f, const struct fanout_opts *o);
};

extern const struct fanout_policy fanout_push_policy;  /* leader writes */
extern const struct fanout_policy fanout_wake_policy;  /* each its own */

/* The policy for [coalesce] leader_writes = on (1) or off (0). */
const struct fanout_policy *fanout_policy_of(int leader_writes);

/* How the leader fans out, from [coalesce] and the machine. */
struct fanout_opts {
    const struct fanout_policy *policy;
    unsigned ncpu;                  /* helpers at most, per flight */
    const _Atomic int *stopping;    /* set: every wait ends */
};

/*
 * A RUNNING reader for 'reply' (borrowed, like 'key_hex', the flight
 * key's prefix for log lines), not yet attached.  'usage': its client
 * asked for the usage event (usage_asked()); else every chunk flagged
 * 'usage' is skipped, never written to it, and its client gets the
 * stream it asked for, byte for byte.
 */
void fanout_reader_init(struct fanout_reader *r, struct reply *reply,
                        int64_t timeout_ms, const char *key_hex, int usage);
void fanout_reader_release(struct fanout_reader *r);

/*
 * The holder of 'r' (the leader, for its own client): write what r's
 * client takes now of the flight from r's position, head first, without
 * waiting; the rest stays for later.  Returns 0, GW_ECLOSED when the
 * client is gone (its reply is then broken), or GW_ETOOBIG when 'r' was
 * cut (nothing written: fanout_cut_begin() is next).
 */
int fanout_push(struct flight *f, struct fanout_reader *r);

/*
 * The holder of 'r': write what r's client takes now of r's 'pending'
 * bytes, without waiting.  Returns 0, or GW_ECLOSED when the client is
 * gone (its reply is then broken).
 */
int fanout_flush(struct fanout_reader *r);

/*
 * End the response of 'r', which was cut (fanout_push() or a snapshot
 * said so) and which 'f' no longer holds chunks for: its client gets the
 * bytes that are already its own ('pending'), then an honest error, as
 * for a stream broken mid-way (reply_fail_body(): an SSE error event,
 * code "client_too_slow", and no clean end; a 503 if nothing was sent).
 * The holder calls fanout_cut_begin() once, when it learns of the cut:
 * it logs and counts the cut, queues the error event after 'pending' and
 * writes what the socket takes, never waiting (the leader calls it while
 * its transfer runs); then fanout_cut_end(), when it may wait for the
 * client, sends the rest and ends the response.
 */
void fanout_cut_begin(struct flight *f, struct fanout_reader *r);
void fanout_cut_end(struct fanout_reader *r);

/* Leader, right after each append: o->policy's after_append. */
void fanout_after_append(struct flight *f, const struct fanout_opts *o);

/*
 * Leader, about once a second while its transfer runs: readers whose
 * client hung up, or whose deadline passed by 'now', go back to their
 * threads; the others sleep on.  One poll() for all of them.
 */
void fanout_sweep(struct flight *f, int64_t now);

/*
 * A client's own thread (a follower's, or the leader's once its transfer
 * is over): relay the flight from r's position to its client until the
 * flight ends, parking whenever it has sent everything; help when called
 * to.  Ends with the response complete; or its error: the flight's
 * failure (the same for every client), 504 after follower_timeout
 * without progress, 503 or an SSE error event when stopping, the cut
 * (fanout_cut_begin()); or with the client gone.  'r' must be attached
 * to 'f'.
 */
void fanout_relay(struct flight *f, struct fanout_reader *r,
                  const struct fanout_opts *o);

#endif
