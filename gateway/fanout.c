/*
 * fanout.c - parking, taking, pushing and relaying a flight's chunks to
 * its clients.  Design, the state diagram and the FIFO invariant: see
 * fanout.h.
 */
#include "fanout.h"

#include <assert.h>
#include <poll.h>
#include <string.h>

#include "log.h"
#include "metrics.h"
#include "net.h"
#include "reply.h"

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

int
fanout_begin(struct reply *r, const struct flight_head *h)
{
    char extra[40];

    r->upstream_status = h->status;
    reply_retry_after_line(extra, sizeof(extra), h->retry_after_s);
    return reply_begin(r, h->status, h->content_type[0] != '\0'
                       ? h->content_type : NULL, h->content_length,
                       extra[0] != '\0' ? extra : NULL);
}

void
fanout_reader_init(struct fanout_reader *r, struct reply *reply,
                   int64_t timeout_ms, const char *key_hex)
{
    memset(r, 0, sizeof(*r));
    atomic_init(&r->fr.pos, 0);
    atomic_init(&r->fr.reading, 0);
    gw_cond_init(&r->cv);
    r->where = FANOUT_RUNNING;
    r->reply = reply;
    r->timeout_ms = timeout_ms;
    r->key_hex = key_hex;
    buf_init(&r->pending, SIZE_MAX);    /* at most one snapshot's bytes */
}

void
fanout_reader_release(struct fanout_reader *r)
{
    assert(r->where == FANOUT_RUNNING && !r->helper);
    pthread_cond_destroy(&r->cv);
    buf_release(&r->pending);
}

static size_t
get_pos(struct fanout_reader *r)
{
    return atomic_load_explicit(&r->fr.pos, memory_order_relaxed);
}

/* Release: the chunks before 'pos' are no longer read (flight.h). */
static void
set_pos(struct fanout_reader *r, size_t pos)
{
    atomic_store_explicit(&r->fr.pos, pos, memory_order_release);
}

static int
stopping(const struct fanout_opts *o)
{
    return atomic_load_explicit(o->stopping, memory_order_relaxed);
}

/* ---- the parked FIFO, under the flight's lock ---- */

/* Queue 'r' at the tail: it has everything (the FIFO invariant). */
static void
park_locked(struct flight *f, struct fanout_reader *r)
{
    assert(get_pos(r) == f->nchunks && !r->fr.cut);
    r->where = FANOUT_PARKED;
    r->next = NULL;
    r->prev = f->parked_tail;
    if (f->parked_tail != NULL)
        f->parked_tail->next = r;
    else
        f->parked = r;
    f->parked_tail = r;
    f->nparked++;
}

/* Take 'r' out of the FIFO; it keeps its 'where'. */
static void
unlink_locked(struct flight *f, struct fanout_reader *r)
{
    assert(r->where == FANOUT_PARKED);
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

/* Hand a parked (unlinked) or claimed reader back to its thread. */
static void
hand_back_locked(struct fanout_reader *r)
{
    r->where = FANOUT_RUNNING;
    r->next = r->prev = NULL;
    metrics_parked_add(-1);
    pthread_cond_signal(&r->cv);
}

static int
behind_locked(const struct flight *f, struct fanout_reader *r)
{
    return r != NULL && get_pos(r) < f->nchunks;
}

/*
 * Take up to 'max' parked readers that are behind, oldest first (the
 * front of the FIFO, by its invariant): they become CLAIMED, linked by
 * 'next', each marked as being read.  OUT *s: the snapshot from the
 * first one's position, the lowest.  NULL when nobody is behind; a
 * helper then stops helping.
 */
GW_TESTABLE struct fanout_reader *
take(struct flight *f, size_t max, struct flight_snap *s, int helper)
{
    struct fanout_reader *list = NULL, **tail = &list, *r;

    gw_mutex_lock(&f->lock);
    for (size_t n = 0; n < max && behind_locked(f, f->parked); n++) {
        r = f->parked;
        unlink_locked(f, r);
        r->where = FANOUT_CLAIMED;
        flight_reading_locked(f, &r->fr);
        *tail = r;
        tail = &r->next;
    }
    if (list != NULL) {
        flight_snap_locked(f, get_pos(list), s);
    } else if (helper) {
        assert(f->helping > 0);
        f->helping--;
    }
    gw_mutex_unlock(&f->lock);
    return list;
}

/* Claim every parked reader, as a list linked by 'next'. */
GW_TESTABLE struct fanout_reader *
claim_all(struct flight *f, size_t *count)
{
    struct fanout_reader *list;

    gw_mutex_lock(&f->lock);
    list = f->parked;
    for (struct fanout_reader *r = list; r != NULL; r = r->next)
        r->where = FANOUT_CLAIMED;
    *count = f->nparked;
    f->parked = f->parked_tail = NULL;
    f->nparked = 0;
    gw_mutex_unlock(&f->lock);
    return list;
}

/*
 * Give claimed readers back: a 'parkable' one that has everything (and
 * the flight still runs) is parked again, still asleep; the others (a
 * cut one among them) go back to their threads.  They must not be
 * touched afterwards.
 */
GW_TESTABLE void
release(struct flight *f, struct fanout_reader *list)
{
    struct fanout_reader *r, *next;

    if (list == NULL)
        return;
    gw_mutex_lock(&f->lock);
    for (r = list; r != NULL; r = next) {
        next = r->next;
        assert(r->where == FANOUT_CLAIMED);
        if (r->parkable && f->state == FLIGHT_RUNNING
            && get_pos(r) == f->nchunks && !r->fr.cut)
            park_locked(f, r);
        else
            hand_back_locked(r);
    }
    gw_mutex_unlock(&f->lock);
}

/*
 * Hand back one oldest parked reader per 'per' parked, as helpers, so
 * that at most 'max' work on the flight at a time.  Right after an
 * append, when every parked reader is behind.  Returns how many.
 */
GW_TESTABLE size_t
call_helpers(struct flight *f, size_t max, size_t per)
{
    struct fanout_reader *r;
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
        hand_back_locked(r);
    }
    f->helping += (unsigned)n;
    gw_mutex_unlock(&f->lock);
    return n;
}

void
fanout_wake_all(struct flight *f)
{
    struct fanout_reader *r, *next;

    gw_mutex_lock(&f->lock);
    for (r = f->parked; r != NULL; r = next) {
        next = r->next;
        hand_back_locked(r);
    }
    f->parked = f->parked_tail = NULL;
    f->nparked = 0;
    gw_mutex_unlock(&f->lock);
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
    size_t w;

    if (buf_len(&r->pending) == 0)
        return 0;
    if (net_write_some(r->reply->fd, buf_ptr(&r->pending),
                       buf_len(&r->pending), &w) != 0) {
        reply_gone(r->reply);
        return GW_ECLOSED;
    }
    buf_consume(&r->pending, w);
    return 0;
}

/*
 * The chunk (an index into the snapshot, 'first' or after) that the
 * socket did not take whole when it took 'w' of the bytes in iov[]:
 * chunk k's iovecs end before ends[k].  The head's iovec counts with
 * the first chunk.  'w' is less than all of them.
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
 * let go of the chunks right after.
 */
static enum push_result
push(struct fanout_reader *r, const struct flight_snap *s, int whole)
{
    struct reply *rp = r->reply;
    struct iovec iov[1 + 3 * FLIGHT_SNAP_MAX];
    char size_line[FLIGHT_SNAP_MAX][REPLY_SIZE_LINE];
    int ends[FLIGHT_SNAP_MAX];
    size_t pos = get_pos(r), w, total = 0, k, end;
    const struct flight_head *h = s->head;
    int cnt = 0, upto;

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
        if (rp->status == 0 && fanout_begin(rp, h) != 0)
            goto nomem;
        iov[cnt].iov_base = (void *)buf_ptr(&rp->head);
        iov[cnt++].iov_len = buf_len(&rp->head);
    }
    for (k = pos - s->lo; k < s->n; k++) {
        cnt += reply_frame_iov(rp, s->chunk[k]->data, s->chunk[k]->len,
                               &iov[cnt], size_line[k]);
        ends[k] = cnt;
    }
    for (int i = 0; i < cnt; i++)
        total += iov[i].iov_len;
    w = 0;
    if (cnt > 0 && net_writev_some(rp->fd, iov, cnt, &w) != 0)
        goto gone;
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
        reply_note_sent(rp, s->chunk[k]->len);
    set_pos(r, s->lo + end);
    r->deadline = gw_now_ms() + r->timeout_ms;
    return w < total ? PUSH_BLOCKED : PUSH_CAUGHT_UP;

nomem:
    log_msg(GW_LOG_ERROR, "fanout: out of memory writing for a client, "
            "dropped req=%s", rp->request_id);
gone:
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
push_list(struct flight *f, struct fanout_reader *list,
          const struct flight_snap *s)
{
    uint64_t pushed = 0;

    for (struct fanout_reader *r = list; r != NULL; r = r->next) {
        size_t before = get_pos(r);

        r->parkable = push(r, s, 1) == PUSH_CAUGHT_UP;
        flight_read_done(&r->fr);
        pushed += get_pos(r) - before;
    }
    release(f, list);
    metrics_pushed(pushed);
}

void
fanout_after_append(struct flight *f, const struct fanout_opts *o)
{
    struct fanout_reader *list;
    struct flight_snap s;

    if (!o->leader_writes) {
        fanout_wake_all(f);
        return;
    }
    metrics_helpers(call_helpers(f, o->ncpu, PER_HELPER));
    while ((list = take(f, PUSH_TAKE, &s, 0)) != NULL)
        push_list(f, list, &s);
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
    struct fanout_reader *list;
    struct flight_snap s;

    r->helper = 0;
    for (;;) {
        if (!r->reply->broken)
            fanout_push(f, r);
        list = take(f, PUSH_TAKE, &s, 1);
        if (list == NULL)
            return;
        push_list(f, list, &s);
    }
}

void
fanout_sweep(struct flight *f, int64_t now)
{
    struct fanout_reader *list, *r, *batch;
    struct pollfd pfd[SWEEP_POLL];
    size_t n, k;

    list = claim_all(f, &n);
    /* A poll() per SWEEP_POLL readers, with no allocation to fail. */
    for (batch = list; batch != NULL; batch = r) {
        for (r = batch, k = 0; r != NULL && k < SWEEP_POLL;
             r = r->next, k++)
            pfd[k].fd = r->reply->fd;
        net_peers_gone(pfd, k);
        for (r = batch, k = 0; r != NULL && k < SWEEP_POLL;
             r = r->next, k++) {
            r->parkable = 1;
            if (pfd[k].revents) {
                reply_gone(r->reply);
                r->parkable = 0;
            } else if (now >= r->deadline) {
                r->expired = 1;
                r->parkable = 0;
            }
        }
    }
    release(f, list);
}

/*
 * Write all of r's 'pending' bytes (the rest of what someone pushed for
 * it), waiting for the client up to send_timeout.  Returns 0, or an
 * error with the reply broken.  Its own thread only.
 */
static int
flush_all(struct fanout_reader *r)
{
    struct reply *rp = r->reply;
    int rc;

    if (buf_len(&r->pending) == 0)
        return 0;
    rc = net_write_all(rp->fd, buf_ptr(&r->pending), buf_len(&r->pending),
                       reply_deadline(rp), rp->stop_fd);
    if (rc != 0)
        reply_gone(rp);
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
            rp->role != NULL ? rp->role : "-", r->key_hex, f->id,
            r->fr.cut_lag);
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
 * Wait until there is something for 'r': chunks past its position, the
 * final state, being handed back (to help, or timed out, or with its
 * client gone), or the stop.  Parked meanwhile, so the leader may push
 * for it (its position moves then).  OUT *s: the snapshot from its
 * position (flight_snap_reader(): r is marked as being read, or s->cut
 * is set); none when handed back to help.  Called with nothing of its
 * own left to write.
 */
GW_TESTABLE void
wait_for_news(struct flight *f, struct fanout_reader *r,
              const struct fanout_opts *o, struct flight_snap *s)
{
    gw_mutex_lock(&f->lock);
    assert(r->where == FANOUT_RUNNING && !r->helper);
    if (f->state == FLIGHT_RUNNING && f->nchunks <= get_pos(r)
        && !r->fr.cut && !stopping(o)) {
        park_locked(f, r);
        metrics_parked_add(1);
        while (r->where != FANOUT_RUNNING) {
            if (r->where == FANOUT_PARKED && stopping(o)) {
                unlink_locked(f, r);
                r->where = FANOUT_RUNNING;
                metrics_parked_add(-1);
                break;
            }
            gw_cond_wait(&r->cv, &f->lock);
        }
    }
    if (!r->helper)
        flight_snap_reader_locked(f, &r->fr, s);
    gw_mutex_unlock(&f->lock);
}

enum relay_next {
    RELAY_MORE,
    RELAY_END,
};

/*
 * One turn of fanout_relay() with what wait_for_news() gave.  A push
 * never waits; before anything that may wait on the client, the
 * snapshot's chunks are let go (flight_read_done()).
 */
static enum relay_next
relay_step(struct flight *f, struct fanout_reader *r,
           const struct fanout_opts *o, const struct flight_snap *s)
{
    struct reply *rp = r->reply;

    if (r->helper) {
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
        && fanout_begin(rp, s->head) != 0) {
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
        struct reply_failure fail = { s->err_rc, s->err_reason,
                                      s->err_status, s->err_retry_after_s };

        reply_failure(rp, &fail);
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

    r->deadline = gw_now_ms() + r->timeout_ms;
    do {
        if (rp->broken)
            return;             /* gone: a write, or the sweep, saw it */
        if (flush_all(r) != 0)
            return;
        if (stopping(o)) {
            /*
             * Every stream still open ends alike at the stop, even one
             * whose flight is complete but not yet all sent: it could
             * not be sent now without waiting on this client.
             */
            reply_upstream_error(rp, GW_ESTOPPING, NULL);
            return;
        }
        wait_for_news(f, r, o, &s);
        next = relay_step(f, r, o, &s);
        flight_read_done(&r->fr);
    } while (next == RELAY_MORE);
}
