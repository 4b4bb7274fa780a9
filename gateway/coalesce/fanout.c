/* SPDX-License-Identifier: MIT */
/*
 * fanout.c - the writer policies and the relay loop: pushing and relaying
 * a flight's chunks to its clients.  Design: see fanout.h; the readers'
 * states and the parked FIFO are the flight's (flight.h), changed here
 * only through its calls.
 */
#include "coalesce/fanout.h"

#include <assert.h>
#include <stddef.h>
#include <string.h>
#include <sys/uio.h>

#include "log.h"
#include "base/metrics.h"
#include "wire/reply.h"

/* Readers taken at a time.  Small, so a writer the scheduler holds back
 * holds few readers up; each take is one turn at the flight's lock. */
#define PUSH_TAKE 8

/* One helper per this many parked readers (and at most one per CPU). */
#define PER_HELPER 64

/* Sockets the sweep polls at a time (its pollfd array is on the stack). */
#define SWEEP_POLL 64

/* What a cut client is told (fanout_cut_begin()). */
#define CUT_TYPE "server_error"
#define CUT_CODE "client_too_slow"
#define CUT_MESSAGE "client too slow: it fell further behind the stream " \
    "than max_reader_lag, and the gateway does not keep the stream for it"

enum push_result {
    PUSH_CAUGHT_UP,             /* wrote all the snapshot had for it */
    PUSH_BLOCKED,               /* socket full (rest in 'pending'), or
                                   behind the snapshot: its thread's job */
    PUSH_GONE,                  /* the client is gone */
};

void
fanout_reader_init(struct fanout_reader *r, struct reply *reply,
                   int64_t timeout_ms, const char *key_hex, int usage)
{
    memset(r, 0, sizeof(*r));
    flight_reader_init(&r->fr);
    r->reply = reply;
    r->timeout_ms = timeout_ms;
    r->key_hex = key_hex;
    r->usage = usage;
    buf_init(&r->pending, SIZE_MAX);    /* at most one snapshot's bytes */
}

void
fanout_reader_release(struct fanout_reader *r)
{
    flight_reader_release(&r->fr);
    buf_release(&r->pending);
}

/* The fanout_reader a flight reader (of a batch, say) is embedded in. */
static struct fanout_reader *
reader_of(struct flight_reader *fr)
{
    return fr == NULL ? NULL
                      : (struct fanout_reader *)((char *)fr
                          - offsetof(struct fanout_reader, fr));
}

static size_t
get_pos(struct fanout_reader *r)
{
    return flight_reader_pos(&r->fr);
}

static int
stopping(const struct fanout_opts *o)
{
    return atomic_load_explicit(o->stopping, memory_order_relaxed);
}

/* ---- pushing: writes that never wait ---- */

/* Keep the bytes of iov[0..cnt) past the first 'skip' in r->pending. */
static int
keep_unsent(struct fanout_reader *r, const struct iovec *iov, int cnt,
            size_t skip)
{
    for (int i = 0; i < cnt; i++) {
        const char *p = iov[i].iov_base;
        size_t n = iov[i].iov_len;

        if (skip >= n) {
            skip -= n;
            continue;
        }
        if (buf_append(&r->pending, p + skip, n - skip) != 0)
            return GW_ENOMEM;
        skip = 0;
    }
    return 0;
}

int
fanout_flush(struct fanout_reader *r)
{
    struct iovec iov;
    size_t w;

    if (buf_len(&r->pending) == 0)
        return 0;
    iov.iov_base = (void *)buf_ptr(&r->pending);
    iov.iov_len = buf_len(&r->pending);
    if (reply_writev_some(r->reply, &iov, 1, &w) != 0)
        return GW_ECLOSED;      /* the reply says the client is gone */
    buf_consume(&r->pending, w);
    return 0;
}

/*
 * The chunk (an index into the snapshot, 'first' or after) that the
 * socket did not take whole when it took 'w' of the bytes in iov[]:
 * chunk k's iovecs end before ends[k] (a chunk skipped has none: its
 * end is the one before's).  The head's iovec counts with the first
 * chunk.  'w' is less than all of them.
 */
static size_t
chunk_cut(const struct iovec *iov, const int *ends, size_t first,
          size_t n, size_t w)
{
    int i = 0;
    size_t k = first;

    while (w >= iov[i].iov_len)
        w -= iov[i++].iov_len;
    while (k + 1 < n && ends[k] <= i)
        k++;
    return k;
}

/*
 * Write what r's client takes now of the chunks in 's' from r's
 * position, never waiting: the upstream loop must not block on any
 * client socket, or one stalled client would stall every other.  The
 * head goes with the first bytes.  What the socket does not take is
 * copied into r->pending, for the next push or the reader's own thread:
 * with 'whole', all of it (a reader that goes back to its thread);
 * else only the rest of the first chunk not taken whole, and the chunks
 * after it wait for the next snapshot (the reader's own thread, which
 * then waits on that copy for the client, as it would have on the chunk
 * itself).  The caller holds the reader, marked as being read, and may
 * let go of the chunks right after.  When these are the last chunks of a
 * finished flight, the body's end goes in the same write, counted with
 * the last chunk (a cache hit is one write, head to end, where it fits).
 */
static enum push_result
push(struct fanout_reader *r, const struct flight_snap *s, int whole)
{
    struct reply *rp = r->reply;
    struct iovec iov[1 + 3 * FLIGHT_SNAP_MAX + 1];
    char size_line[FLIGHT_SNAP_MAX][REPLY_SIZE_LINE];
    int ends[FLIGHT_SNAP_MAX];
    size_t pos = get_pos(r), w, total = 0, k, end;
    const struct http_head *h = s->head;
    int cnt = 0, upto, last;

    if (rp->broken)
        return PUSH_GONE;
    if (buf_len(&r->pending) > 0) {
        if (fanout_flush(r) != 0)
            return PUSH_GONE;
        if (buf_len(&r->pending) > 0)
            return PUSH_BLOCKED;
    }
    if (pos < s->lo)
        return PUSH_BLOCKED;
    if (pos >= s->lo + s->n)
        return PUSH_CAUGHT_UP;
    assert(h != NULL);          /* the head comes before any chunk */
    if (!rp->head_sent) {
        if (rp->status == 0 && reply_begin_head(rp, h) != 0)
            goto nomem;
        iov[cnt].iov_base = (void *)buf_ptr(&rp->head);
        iov[cnt++].iov_len = buf_len(&rp->head);
    }
    for (k = pos - s->lo; k < s->n; k++) {
        /* A usage event its client did not ask for: no iovec, so no
         * byte of it is written, kept or counted, and the position
         * moves past it with the rest. */
        if (!s->chunk[k]->usage || r->usage)
            cnt += reply_frame_iov(rp, s->chunk[k]->data, s->chunk[k]->len,
                                   &iov[cnt], size_line[k]);
        ends[k] = cnt;
    }
    last = s->state == FLIGHT_DONE && s->lo + s->n == s->nchunks;
    if (last) {
        cnt += reply_end_iov(rp, &iov[cnt]);
        ends[s->n - 1] = cnt;
    }
    for (int i = 0; i < cnt; i++)
        total += iov[i].iov_len;
    w = 0;
    if (cnt > 0 && reply_writev_some(rp, iov, cnt, &w) != 0)
        return PUSH_GONE;       /* the reply says the client is gone */
    end = s->n;
    upto = cnt;
    if (w < total && !whole) {
        end = chunk_cut(iov, ends, pos - s->lo, s->n, w) + 1;
        upto = ends[end - 1];
    }
    if (w < total && keep_unsent(r, iov, upto, w) != 0)
        goto nomem;
    /* Every byte up to 'end' is now the client's: sent, or pending. */
    reply_note_sent(rp, 0);
    for (k = pos - s->lo; k < end; k++)
        if (!s->chunk[k]->usage || r->usage)
            reply_note_sent(rp, s->chunk[k]->len);
    if (last && end == s->n)
        reply_note_end(rp);
    flight_reader_advance(&r->fr, s->lo + end);
    r->deadline = gw_now_ms() + r->timeout_ms;
    return w < total ? PUSH_BLOCKED : PUSH_CAUGHT_UP;

nomem:
    log_msg(GW_LOG_ERROR, "fanout: out of memory writing for a client, "
            "dropped req=%s", rp->request_id);
    reply_gone(rp);
    return PUSH_GONE;
}

int
fanout_push(struct flight *f, struct fanout_reader *r)
{
    struct flight_snap s;
    enum push_result res;

    do {
        flight_snap_reader(f, &r->fr, &s);
        if (s.cut)
            return GW_ETOOBIG;
        res = push(r, &s, 1);
        flight_read_done(&r->fr);
    } while (res == PUSH_CAUGHT_UP && get_pos(r) < s.nchunks);
    return res == PUSH_GONE ? GW_ECLOSED : 0;
}

/* Push 's' to every reader of a taken batch, then give the batch back. */
static void
push_batch(struct flight *f, struct flight_reader *batch,
           const struct flight_snap *s)
{
    uint64_t pushed = 0;

    for (struct flight_reader *fr = batch; fr != NULL;
         fr = flight_batch_next(fr)) {
        struct fanout_reader *r = reader_of(fr);
        size_t before = get_pos(r);

        flight_reader_set_parkable(fr, push(r, s, 1) == PUSH_CAUGHT_UP);
        flight_read_done(fr);
        pushed += get_pos(r) - before;
    }
    flight_give_back(f, batch);
    metrics_pushed(pushed);
}

/* leader_writes = on: helpers when many are parked, then push. */
static void
push_after_append(struct flight *f, const struct fanout_opts *o)
{
    struct flight_reader *batch;
    struct flight_snap s;

    metrics_helpers(flight_call_helpers(f, o->ncpu, PER_HELPER));
    while ((batch = flight_take(f, PUSH_TAKE, &s, 0)) != NULL)
        push_batch(f, batch, &s);
}

/* leader_writes = off: every parked reader writes its own bytes. */
static void
wake_after_append(struct flight *f, const struct fanout_opts *o)
{
    (void)o;
    flight_wake_all(f);
}

const struct fanout_policy fanout_push_policy = {
    "push", push_after_append,
};

const struct fanout_policy fanout_wake_policy = {
    "wake", wake_after_append,
};

const struct fanout_policy *
fanout_policy_of(int leader_writes)
{
    return leader_writes ? &fanout_push_policy : &fanout_wake_policy;
}

void
fanout_after_append(struct flight *f, const struct fanout_opts *o)
{
    o->policy->after_append(f, o);
}

/*
 * A helper's job, on its own thread: take and write for the parked
 * readers that are behind, alongside the leader, until none is left;
 * before each take, its own client, so that it is never starved while
 * it writes for others.  Its own leftovers are for fanout_relay().
 */
GW_TESTABLE void
help(struct flight *f, struct fanout_reader *r)
{
    struct flight_reader *batch;
    struct flight_snap s;

    for (;;) {
        if (!r->reply->broken)
            fanout_push(f, r);
        batch = flight_take(f, PUSH_TAKE, &s, 1);
        if (batch == NULL)
            return;
        push_batch(f, batch, &s);
    }
}

void
fanout_sweep(struct flight *f, int64_t now)
{
    struct flight_reader *batch, *fr, *from;
    struct reply *rv[SWEEP_POLL];
    struct fanout_reader *r;
    size_t k;

    batch = flight_claim_parked(f);
    /* One question (one poll()) per SWEEP_POLL readers, with no
     * allocation to fail. */
    for (from = batch; from != NULL; from = fr) {
        for (fr = from, k = 0; fr != NULL && k < SWEEP_POLL;
             fr = flight_batch_next(fr), k++)
            rv[k] = reader_of(fr)->reply;
        reply_clients_gone(rv, k);
        for (fr = from, k = 0; fr != NULL && k < SWEEP_POLL;
             fr = flight_batch_next(fr), k++) {
            r = reader_of(fr);
            flight_reader_set_parkable(fr, 1);
            if (r->reply->broken) {
                flight_reader_set_parkable(fr, 0);
            } else if (now >= r->deadline) {
                r->expired = 1;
                flight_reader_set_parkable(fr, 0);
            }
        }
    }
    flight_give_back(f, batch);
}

/*
 * Write all of r's 'pending' bytes (the rest of what someone pushed for
 * it), waiting for the client up to send_timeout.  Returns 0, or an
 * error with the reply broken.  Its own thread only.
 */
static int
flush_all(struct fanout_reader *r)
{
    int rc;

    if (buf_len(&r->pending) == 0)
        return 0;
    rc = reply_write_all(r->reply, buf_ptr(&r->pending),
                         buf_len(&r->pending));
    buf_reset(&r->pending);
    return rc;
}

/* ---- a cut reader ---- */

void
fanout_cut_begin(struct flight *f, struct fanout_reader *r)
{
    struct reply *rp = r->reply;

    metrics_reader_cut_lag();
    log_msg(GW_LOG_WARN, "coalesce: client cut, too far behind the "
            "stream role=%s key=%s flight=%s behind=%zu",
            rp->role != NULL ? rp->role : "-", r->key_hex, flight_id(f),
            flight_reader_cut_lag(&r->fr));
    if (rp->broken || !rp->head_sent)
        return;                 /* fanout_cut_end() answers whole */
    /* Out of memory: no event, and the end is just as unclean. */
    reply_fail_event(rp, &r->pending, CUT_TYPE, CUT_CODE, CUT_MESSAGE);
    fanout_flush(r);
}

void
fanout_cut_end(struct fanout_reader *r)
{
    struct reply *rp = r->reply;

    if (rp->broken)
        return;
    if (!rp->head_sent) {
        reply_error(rp, 503, CUT_TYPE, CUT_CODE, CUT_MESSAGE);
        return;
    }
    if (flush_all(r) == 0)
        reply_fail_end(rp);
}

/* ---- the reader's own thread ---- */

/*
 * Wait until there is something for 'r' (flight_wait()): chunks past its
 * position, the final state, being handed back (to help, or timed out,
 * or with its client gone), or the stop.  Parked meanwhile, so the
 * leader may push for it (its position moves then).  OUT *s: the
 * snapshot from its position (r is marked as being read, or s->cut is
 * set); none when handed back to help (then 1 is returned, else 0).
 * Called with nothing of its own left to write.
 *
 * The parked gauge counts the reader while its thread is in the wait:
 * from just before it may park until it is back (a cheaper count than
 * one under the flight's lock, and the same once the thread sleeps).
 */
GW_TESTABLE int
wait_for_news(struct flight *f, struct fanout_reader *r,
              const struct fanout_opts *o, struct flight_snap *s)
{
    enum flight_wait w;

    metrics_parked_add(1);
    w = flight_wait(f, &r->fr, o->stopping, s);
    metrics_parked_add(-1);
    return w == FLIGHT_WAIT_HELP;
}

enum relay_next {
    RELAY_MORE,
    RELAY_END,
};

/*
 * One turn of fanout_relay() with what wait_for_news() gave: 'helping'
 * (and no snapshot), or 's'.  A push never waits; before anything that
 * may wait on the client, the snapshot's chunks are let go
 * (flight_read_done()).
 */
static enum relay_next
relay_step(struct flight *f, struct fanout_reader *r,
           const struct fanout_opts *o, int helping,
           const struct flight_snap *s)
{
    struct reply *rp = r->reply;

    if (helping) {
        help(f, r);
        return RELAY_MORE;      /* 's' is not set: a new wait */
    }
    if (rp->broken || buf_len(&r->pending) > 0 || stopping(o))
        return RELAY_MORE;
    if (s->cut) {
        fanout_cut_begin(f, r);
        fanout_cut_end(r);
        return RELAY_END;
    }
    if (r->expired) {
        /* This client's own wait: the flight itself goes on. */
        flight_read_done(&r->fr);
        reply_error(rp, 504, "upstream_error", "upstream_timeout",
                    "follower wait timeout: nothing new from the "
                    "upstream for follower_timeout");
        return RELAY_END;
    }
    if (rp->status == 0 && s->head != NULL
        && !(s->state == FLIGHT_FAILED && s->nchunks == 0)
        && reply_begin_head(rp, s->head) != 0) {
        log_msg(GW_LOG_ERROR, "fanout: out of memory for a response "
                "head, dropped req=%s", rp->request_id);
        reply_gone(rp);
        return RELAY_END;
    }
    if (s->n > 0)
        return push(r, s, 0) == PUSH_GONE ? RELAY_END : RELAY_MORE;
    flight_read_done(&r->fr);
    if (s->state == FLIGHT_DONE) {
        reply_end(rp);
        return RELAY_END;
    }
    if (s->state == FLIGHT_FAILED) {
        reply_failure(rp, &s->outcome);
        return RELAY_END;
    }
    return RELAY_MORE;
}

void
fanout_relay(struct flight *f, struct fanout_reader *r,
             const struct fanout_opts *o)
{
    struct reply *rp = r->reply;
    struct flight_snap s;
    enum relay_next next;
    int helping;

    r->deadline = gw_now_ms() + r->timeout_ms;
    do {
        if (rp->broken)
            return;             /* gone: a write, or the sweep, saw it */
        if (flush_all(r) != 0)
            return;
        if (rp->end_sent)
            return;             /* whole: the end went with the last chunk
                                   (push()); nothing may follow it */
        if (stopping(o)) {
            /*
             * Every stream still open ends alike at the stop, even one
             * whose flight is complete but not yet all sent: it could
             * not be sent now without waiting on this client.
             */
            reply_shutting_down(rp);
            return;
        }
        helping = wait_for_news(f, r, o, &s);
        next = relay_step(f, r, o, helping, &s);
        flight_read_done(&r->fr);
    } while (next == RELAY_MORE);
}
