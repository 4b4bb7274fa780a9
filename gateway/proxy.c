/*
 * proxy.c - relay one request upstream and the answer back.
 *
 * Error mapping (DESIGN.md "Responses and errors"): nothing sent yet ->
 * 502 (unreachable or broken upstream) or 504 (a timeout) as an OpenAI
 * error body; already streaming -> an SSE error event and an unclean end
 * of the body, never a fake success.
 */
#include "proxy.h"

#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "coalesce.h"
#include "config.h"
#include "conn.h"
#include "log.h"
#include "metrics.h"
#include "net.h"
#include "server.h"
#include "upstream.h"

/*
 * The upstream request for c's request (upstream.h says what of the
 * client's request reaches the upstream): NUL-terminated copies of the
 * target and, with forward_client_auth, of the client's credential.
 */
struct fwd {
    struct upstream_request ur;
    char *path;                 /* owned */
    char *auth;                 /* owned, wiped before free; or NULL */
};

static int
fwd_init(struct fwd *f, const struct conn *c)
{
    const struct http_header *h = NULL;

    memset(f, 0, sizeof(*f));
    f->path = gw_strndup(c->req.target, c->req.target_len);
    /* An empty value is no credential: the configured key goes. */
    if (c->srv->cfg->forward_client_auth)
        h = http_find_header(&c->req, "Authorization");
    if (h != NULL && h->value_len == 0)
        h = NULL;
    if (h != NULL)
        f->auth = gw_strndup(h->value, h->value_len);
    if (f->path == NULL || (h != NULL && f->auth == NULL))
        return GW_ENOMEM;
    /* route.c lets only GET and POST through to here */
    f->ur.method = gw_strieq(c->req.method, c->req.method_len, "POST")
                   ? "POST" : "GET";
    f->ur.path = f->path;
    f->ur.body = buf_ptr(&c->body);
    f->ur.body_len = buf_len(&c->body);
    f->ur.request_id = c->request_id;
    f->ur.client_auth = f->auth;
    return 0;
}

static void
fwd_release(struct fwd *f)
{
    gw_free(f->path);
    if (f->auth != NULL)
        explicit_bzero(f->auth, strlen(f->auth));
    gw_free(f->auth);
}

/*
 * The client-facing error for a failed transfer: 502 or 504 as an OpenAI
 * error body if nothing was sent yet, else an SSE error event and an
 * unclean end.
 */
static void
upstream_error(struct conn *c, int rc, const char *reason)
{
    int timeout = rc == GW_ETIMEDOUT;
    const char *code = timeout ? "upstream_timeout"
                       : (reason != NULL
                          && strcmp(reason, "connect failed") == 0)
                         ? "upstream_unreachable" : "upstream_error";
    char msg[128];

    snprintf(msg, sizeof(msg), "upstream %s",
             reason != NULL && reason[0] != '\0' ? reason : "failed");
    if (c->head_sent)
        conn_fail_body(c, "upstream_error", code, msg);
    else
        conn_send_error(c, timeout ? 504 : 502, "upstream_error", code, msg);
}

/* Direct relay: the client's own socket is the sink. */
static int
relay_head(void *arg, int status, const char *content_type,
           int64_t content_length)
{
    struct conn *c = arg;

    c->upstream_status = status;
    return conn_begin(c, status, content_type, content_length, NULL) != 0;
}

static int
relay_data(void *arg, const char *p, size_t n)
{
    struct conn *c = arg;

    return conn_body(c, p, n, conn_send_deadline(c)) != 0;
}

/*
 * How often, at most, a relay looks for a client that hung up.  libcurl
 * calls the progress callback after every read and write (six to eight
 * times for a small request) and about once a second while the upstream
 * is quiet; one poll() per call was the largest share of the gateway's
 * system calls.  A client that goes away is still noticed within this
 * long during a quiet wait, and at once by the next write.
 */
#define PEER_CHECK_MS 100

static int
peer_check_due(struct conn *c)
{
    int64_t now = gw_now_ms();

    if (c->peer_check_ms == 0) {
        c->peer_check_ms = now;         /* first tick: just start the clock */
        return 0;
    }
    if (now - c->peer_check_ms < PEER_CHECK_MS)
        return 0;
    c->peer_check_ms = now;
    return 1;
}

static int
relay_tick(void *arg)
{
    struct conn *c = arg;

    return !conn_body_complete(c) && peer_check_due(c)
           && net_peer_gone(c->fd);
}

/* Direct relay: this client alone, with its own request id. */
static void
forward_direct(struct conn *c, const struct upstream_request *ur)
{
    struct upstream_sink sink = { c, relay_head, relay_data, relay_tick };
    struct upstream_result res;

    metrics_upstream_call();
    upstream_perform(c->srv->up, ur, &sink, &res);
    c->upstream_status = res.status;
    if (res.rc == 0) {
        conn_end(c, conn_send_deadline(c));
    } else if (res.rc == GW_EABORTED || c->broken) {
        c->broken = 1;          /* the client went away: nothing to say */
        c->keep_alive = 0;
    } else {
        upstream_error(c, res.rc, res.reason);
    }
}

/* ---- coalescing ---- */

/*
 * One client reading a flight.  Whoever holds the reader (flight.h,
 * "where") owns the connection and 'pending'.
 */
struct relay {
    struct flight_reader fr;    /* fr.index: the next chunk to send */
    struct conn *c;
    struct buf pending;         /* framed bytes the socket did not take */
};

enum push_result {
    PUSH_CAUGHT_UP,             /* everything written */
    PUSH_BLOCKED,               /* the socket is full; rest in 'pending' */
    PUSH_GONE,                  /* the client is gone */
};

/* Chunks framed into one writev() by push(). */
#define PUSH_BATCH 16

/*
 * Readers the leader or a helper takes at a time (flight_take).  Small,
 * so that a writer the scheduler holds back holds few readers up; each
 * take is one turn at the flight's lock.
 */
#define PUSH_TAKE 8

/* One helper per this many parked readers, at most one per CPU. */
#define PUSH_PER_HELPER 64

static void
relay_init(struct relay *r, struct conn *c)
{
    flight_reader_init(&r->fr);
    r->c = c;
    buf_init(&r->pending, SIZE_MAX);
}

static void
relay_release(struct relay *r)
{
    flight_reader_destroy(&r->fr);
    buf_release(&r->pending);
}

/* Keep the bytes of iov[0..cnt) past the first 'skip' in r->pending. */
static int
keep_unsent(struct relay *r, const struct iovec *iov, int cnt, size_t skip)
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

/*
 * Write what the client of 'r' can take now of the chunks
 * [r->fr.index, span->hi), never waiting: the upstream loop must not
 * block on any client socket, or one stalled client would stall every
 * other.  The head goes with the first bytes (conn_begin() from 'h' if
 * the reader has not begun).  What the socket does not take of a batch
 * stays in r->pending, for the reader's own thread (or a later push).
 * The caller holds the reader (the leader, a helper, or its thread).
 */
static enum push_result
push(struct relay *r, const struct flight_span *span,
     const struct flight_head *h)
{
    struct conn *c = r->c;
    struct iovec iov[1 + 3 * PUSH_BATCH];
    char size_line[PUSH_BATCH][CONN_SIZE_LINE];
    size_t w, total, k, first;
    int cnt;

    if (c->broken)
        return PUSH_GONE;
    if (buf_len(&r->pending) > 0) {
        if (net_write_some(c->fd, buf_ptr(&r->pending),
                           buf_len(&r->pending), &w) != 0)
            goto gone;
        buf_consume(&r->pending, w);
        if (buf_len(&r->pending) > 0)
            return PUSH_BLOCKED;
    }
    while (r->fr.index < span->hi) {
        if (r->fr.index < span->lo)
            return PUSH_BLOCKED;    /* not in this span: its thread's job */
        cnt = 0;
        if (!c->head_sent) {
            if (c->status == 0) {
                c->upstream_status = h->status;
                if (conn_begin(c, h->status, h->content_type[0] != '\0'
                               ? h->content_type : NULL,
                               h->content_length, NULL) != 0)
                    goto gone;
            }
            iov[cnt].iov_base = (void *)buf_ptr(&c->out);
            iov[cnt++].iov_len = buf_len(&c->out);
        }
        first = r->fr.index;
        for (k = 0; k < PUSH_BATCH && first + k < span->hi; k++) {
            const struct flight_chunk *ch = span->v[first + k - span->lo];

            cnt += conn_frame_iov(c, ch->data, ch->len, &iov[cnt],
                                  size_line[k]);
        }
        total = 0;
        for (int i = 0; i < cnt; i++)
            total += iov[i].iov_len;
        w = 0;
        if (cnt > 0 && net_writev_some(c->fd, iov, cnt, &w) != 0)
            goto gone;
        if (w < total && keep_unsent(r, iov, cnt, w) != 0)
            goto gone;
        /* Every byte of the batch is now the client's: sent or pending. */
        conn_note_sent(c, 0);
        for (size_t i = first; i < first + k; i++)
            conn_note_sent(c, span->v[i - span->lo]->len);
        r->fr.index = first + k;
        if (w < total)
            return PUSH_BLOCKED;
    }
    return PUSH_CAUGHT_UP;

gone:
    c->broken = 1;
    c->keep_alive = 0;
    return PUSH_GONE;
}

/*
 * Push to every reader of a claimed list and give the list back: a
 * reader that took everything sleeps on, the others go back to their
 * threads.  'writes' 0 ([coalesce] leader_writes = off): push to nobody.
 */
static void
push_list(struct flight *f, struct flight_reader *list,
          const struct flight_span *span, const struct flight_head *h,
          int writes)
{
    uint64_t pushed = 0;

    for (struct flight_reader *fr = list; fr != NULL; fr = fr->next) {
        struct relay *r = (struct relay *)fr;   /* fr is its first member */
        size_t before = fr->index;

        fr->parkable = writes && push(r, span, h) == PUSH_CAUGHT_UP;
        pushed += fr->index - before;
    }
    flight_release(f, list);
    metrics_pushed(pushed);
}

/*
 * A helper's job (flight_call_helpers), on its own thread: its own
 * client first, as the leader does, then the parked readers that are
 * behind, a few at a time, alongside the leader until none is left.
 * Its own client's leftovers (r->pending) are for relay_flight().
 */
static void
help(struct relay *r, struct flight *f)
{
    struct flight_reader *list, *fr;
    struct flight_span span;
    struct flight_head h;
    size_t lo, left;

    r->fr.helper = 0;
    if (flight_copy_span(f, r->fr.index, &h, &span) == 0) {
        push(r, &span, &h);
        flight_span_release(&span);
    }
    while ((list = flight_take(f, PUSH_TAKE, &left)) != NULL) {
        lo = SIZE_MAX;
        for (fr = list; fr != NULL; fr = fr->next)
            if (fr->index < lo)
                lo = fr->index;
        if (flight_copy_span(f, lo, &h, &span) != 0) {
            push_list(f, list, &span, &h, 0);   /* each on its own, then */
            continue;
        }
        push_list(f, list, &span, &h, 1);
        flight_span_release(&span);
    }
}

/* The leader's state inside its upstream callbacks. */
struct leader {
    struct relay self;          /* the leader's own client */
    struct coalescer *co;
    struct flight *f;
    int attached;               /* the leader's client is still a reader */
    int writes;                 /* [coalesce] leader_writes */
    unsigned ncpu;              /* parts to share a claimed list into */
    int64_t parked_check_ms;    /* last look for parked clients gone */
    struct flight_head head;
};

/* How often the leader looks for parked clients that hung up. */
#define PARKED_CHECK_MS 1000

static void
leader_detach_client(struct leader *l)
{
    if (!l->attached)
        return;
    l->attached = 0;
    l->self.c->broken = 1;
    l->self.c->keep_alive = 0;
    coalescer_detach(l->co, l->f);
    log_msg(GW_LOG_INFO, "coalesce: leader client gone, flight continues "
            "for followers");
}

/*
 * After an append: the leader's own client first, then every parked
 * follower, each as far as its socket takes without waiting, a few at a
 * time.  With many, the threads of some of them are woken first to help
 * (help()), one per CPU, so that the writes run on every core.  That is
 * one writer more than there are cores, on purpose: waking a helper
 * often costs the leader its core for milliseconds (the scheduler runs
 * the woken thread in its place), and with the work shared a few at a
 * time, whichever writers run meanwhile do it all.  A follower that
 * could not take everything, or is gone, goes back to its own thread.
 * With leader_writes off, every parked follower goes back to its own
 * thread at once.
 */
static void
leader_flush(struct leader *l)
{
    struct flight_reader *list;
    struct flight_span span;
    size_t n;

    flight_leader_span(l->f, &span);
    if (l->attached && push(&l->self, &span, &l->head) == PUSH_GONE)
        leader_detach_client(l);
    if (!l->writes) {
        list = flight_claim(l->f, &n);
        push_list(l->f, list, &span, &l->head, 0);
        return;
    }
    metrics_helpers(flight_call_helpers(l->f, l->ncpu, PUSH_PER_HELPER));
    while ((list = flight_take(l->f, PUSH_TAKE, &n)) != NULL)
        push_list(l->f, list, &span, &l->head, 1);
}

/*
 * Parked followers sleep until there is something to write, so a client
 * that hangs up while the flight is quiet (a long wait for the first
 * token) would go unnoticed, and keep the upstream call alive for
 * nobody.  So the leader, at most once a PARKED_CHECK_MS, claims them
 * and polls all their sockets in one system call; the gone ones go back
 * to their threads, which detach.
 */
static void
leader_check_parked(struct leader *l)
{
    struct flight_reader *list, *fr;
    struct pollfd *pfd;
    int64_t now = gw_now_ms();
    size_t n, i;

    if (now - l->parked_check_ms < PARKED_CHECK_MS)
        return;
    l->parked_check_ms = now;
    list = flight_claim(l->f, &n);
    if (list == NULL)
        return;
    pfd = gw_malloc(n * sizeof(*pfd));
    if (pfd != NULL) {
        for (fr = list, i = 0; fr != NULL; fr = fr->next, i++)
            pfd[i].fd = ((struct relay *)fr)->c->fd;
        net_peers_gone(pfd, n);
    }
    for (fr = list, i = 0; fr != NULL; fr = fr->next, i++) {
        struct conn *c = ((struct relay *)fr)->c;

        fr->parkable = 1;
        if (pfd != NULL && pfd[i].revents) {
            c->broken = 1;
            c->keep_alive = 0;
            fr->parkable = 0;
        }
    }
    gw_free(pfd);
    flight_release(l->f, list);
}

static int
lead_head(void *arg, int status, const char *content_type,
          int64_t content_length)
{
    struct leader *l = arg;
    struct conn *c = l->self.c;

    flight_set_head(l->f, status, content_type, content_length);
    l->head.status = status;
    l->head.content_length = content_length;
    snprintf(l->head.content_type, sizeof(l->head.content_type), "%s",
             content_type != NULL ? content_type : "");
    c->upstream_status = status;
    if (l->attached
        && conn_begin(c, status, content_type, content_length, NULL) != 0)
        leader_detach_client(l);
    return 0;
}

/* Nonzero (abort) once no client at all is listening. */
static int
lead_nobody(struct leader *l)
{
    return !l->attached && coalescer_readers(l->f) == 0;
}

static int
lead_data(void *arg, const char *p, size_t n)
{
    struct leader *l = arg;

    if (flight_append(l->f, p, n,
                      (size_t)l->self.c->srv->cfg->max_flight_bytes) != 0)
        return 1;
    leader_flush(l);
    return lead_nobody(l);
}

static int
lead_tick(void *arg)
{
    struct leader *l = arg;
    struct conn *c = l->self.c;
    int done = conn_body_complete(c) && buf_len(&l->self.pending) == 0;

    if (l->attached && !done && peer_check_due(c) && net_peer_gone(c->fd))
        leader_detach_client(l);
    leader_check_parked(l);
    if (l->attached && buf_len(&l->self.pending) > 0) {
        struct flight_span span;

        flight_leader_span(l->f, &span);
        if (push(&l->self, &span, &l->head) == PUSH_GONE)
            leader_detach_client(l);
    }
    return lead_nobody(l);
}

/*
 * Relay the flight to this client from r->fr.index on, at the client's
 * own pace, until the flight ends.  Used by followers from the start and
 * by the leader once its transfer is over.  While the client has sent
 * everything it parks in the flight: the leader writes the next chunks
 * for it, or hands it back to write them itself, and notices when its
 * client hangs up (leader_check_parked).  A flight that makes no progress
 * for follower_timeout ends the wait with 504.
 */
static void
relay_flight(struct relay *r, struct flight *f)
{
    struct conn *c = r->c;
    int64_t limit = c->srv->cfg->follower_timeout_ms;
    int64_t deadline = gw_now_ms() + limit;
    struct flight_view v;
    size_t before;
    int rc;

    for (;;) {
        if (c->broken)
            return;             /* the leader found the client gone */
        if (buf_len(&r->pending) > 0) {
            /* Handed back with bytes its socket did not take. */
            if (net_write_all(c->fd, buf_ptr(&r->pending),
                              buf_len(&r->pending),
                              conn_send_deadline(c)) != 0) {
                c->broken = 1;
                c->keep_alive = 0;
                return;
            }
            buf_reset(&r->pending);
        }
        before = r->fr.index;
        rc = flight_wait(f, &r->fr, deadline, &v);
        if (r->fr.helper) {
            help(r, f);
            deadline = gw_now_ms() + limit;
            continue;           /* 'v' is from before help() wrote */
        }
        if (r->fr.index != before)
            deadline = gw_now_ms() + limit;     /* the leader wrote some */
        if (c->broken || buf_len(&r->pending) > 0)
            continue;
        if (c->status == 0 && v.head_set && !(v.state == FLIGHT_FAILED
                                              && v.nchunks == 0)) {
            c->upstream_status = v.status;
            if (conn_begin(c, v.status, v.content_type[0] != '\0'
                           ? v.content_type : NULL, v.content_length,
                           NULL) != 0) {
                c->broken = 1;
                return;
            }
        }
        for (size_t i = 0; i < v.count; i++) {
            if (conn_body(c, v.chunk[i]->data, v.chunk[i]->len,
                          conn_send_deadline(c)) != 0)
                return;         /* client gone or stuck: broken */
            r->fr.index++;
        }
        if (v.count > 0) {
            deadline = gw_now_ms() + limit;
            continue;
        }
        if (v.state == FLIGHT_DONE && r->fr.index >= v.nchunks) {
            conn_end(c, conn_send_deadline(c));
            return;
        }
        if (v.state == FLIGHT_FAILED && r->fr.index >= v.nchunks) {
            upstream_error(c, v.err_rc, v.err_reason);
            return;
        }
        if (rc == GW_ETIMEDOUT && gw_now_ms() >= deadline) {
            upstream_error(c, GW_ETIMEDOUT, "follower wait timeout");
            return;
        }
    }
}

/*
 * The leader: one upstream call for the flight.  The request id it sends
 * is the flight's, not its client's: vLLM builds the completion's "id"
 * from it, and every client of the flight gets those same bytes.
 */
static void
lead(struct conn *c, struct flight *f, const struct upstream_request *ur0,
     const char *keyhex)
{
    struct leader l;
    struct upstream_sink sink = { &l, lead_head, lead_data, lead_tick };
    struct upstream_request ur = *ur0;
    struct upstream_result res;

    memset(&l, 0, sizeof(l));
    relay_init(&l.self, c);
    l.co = c->srv->co;
    l.f = f;
    l.attached = 1;
    l.writes = c->srv->cfg->leader_writes;
    l.ncpu = c->srv->ncpu;
    c->role = "leader";
    c->flight_id = f->id;
    metrics_coalesce_leader();
    log_msg(GW_LOG_INFO, "coalesce: leader key=%s flight=%s", keyhex, f->id);
    ur.request_id = f->id;
    metrics_upstream_call();
    upstream_perform(c->srv->up, &ur, &sink, &res);
    coalescer_finish(c->srv->co, f, res.rc, res.reason);
    if (res.rc != 0 && res.rc != GW_EABORTED)
        log_msg(GW_LOG_INFO, "coalesce: flight failed key=%s flight=%s "
                "reason=\"%s\"", keyhex, f->id,
                res.reason != NULL ? res.reason : "-");

    if (l.attached) {
        /* The transfer is over: now the client may take its time. */
        relay_flight(&l.self, f);
        coalescer_detach(c->srv->co, f);
    }
    relay_release(&l.self);
    flight_unref(f);            /* the driver's reference */
}

static void
follow(struct conn *c, struct flight *f, size_t tenant, const char *keyhex)
{
    struct relay r;

    c->role = "follower";
    c->flight_id = f->id;
    metrics_coalesce_follower(tenant);
    log_msg(GW_LOG_INFO, "coalesce: follower key=%s flight=%s tenant=%s",
            keyhex, f->id, coalesce_tenant_name(c->srv->cfg, tenant));
    relay_init(&r, c);
    relay_flight(&r, f);
    relay_release(&r);
    coalescer_detach(c->srv->co, f);
}

static void
bypass(struct conn *c, const struct upstream_request *ur,
       enum metrics_bypass why, const char *keyhex)
{
    c->role = "bypass";
    metrics_coalesce_bypass(why);
    log_msg(GW_LOG_INFO, "coalesce: bypass key=%s reason=%s", keyhex,
            metrics_bypass_name(why));
    forward_direct(c, ur);
}

void
proxy_forward(struct conn *c, const json_t *json, int coalescable)
{
    const struct gw_config *cfg = c->srv->cfg;
    unsigned char key[FLIGHT_KEY_LEN];
    enum metrics_bypass why;
    struct flight *f;
    struct fwd fw;
    char keyhex[13];

    if (fwd_init(&fw, c) != 0) {
        conn_send_error(c, 503, "server_error", "overloaded",
                        "out of memory");
        goto out;
    }
    if (!coalescable || json == NULL) {
        forward_direct(c, &fw.ur);
        goto out;
    }
    if (!coalesce_eligible(cfg, c->tenant, &c->req, json, &why)) {
        bypass(c, &fw.ur, why, "-");
        goto out;
    }
    coalesce_key(coalesce_tenant_name(cfg, c->tenant), cfg->upstream_url,
                 &fw.ur, key);
    coalesce_key_hex(key, keyhex);
    switch (coalescer_join(c->srv->co, key, &f, &why)) {
    case COALESCE_LEADER:
        lead(c, f, &fw.ur, keyhex);
        break;
    case COALESCE_FOLLOWER:
        follow(c, f, c->tenant, keyhex);
        break;
    case COALESCE_BYPASS:
        bypass(c, &fw.ur, why, keyhex);
        break;
    }

out:
    fwd_release(&fw);
}
