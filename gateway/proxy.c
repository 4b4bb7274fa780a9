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

/* NUL-terminated copies of the request fields libcurl needs. */
struct fwd_fields {
    char *path;
    char *content_type;
    char *accept;
    char *auth;
};

static char *
header_copy(const struct conn *c, const char *name)
{
    const struct http_header *h = http_find_header(&c->req, name);

    return h != NULL ? gw_strndup(h->value, h->value_len) : NULL;
}

static int
fields_init(struct fwd_fields *f, const struct conn *c)
{
    memset(f, 0, sizeof(*f));
    f->path = gw_strndup(c->req.target, c->req.target_len);
    f->content_type = header_copy(c, "Content-Type");
    f->accept = header_copy(c, "Accept");
    if (c->srv->cfg->forward_client_auth)
        f->auth = header_copy(c, "Authorization");
    return f->path == NULL ? GW_ENOMEM : 0;
}

static void
fields_release(struct fwd_fields *f)
{
    gw_free(f->path);
    gw_free(f->content_type);
    gw_free(f->accept);
    if (f->auth != NULL)
        explicit_bzero(f->auth, strlen(f->auth));
    gw_free(f->auth);
}

static void
request_init(struct upstream_request *ur, const struct conn *c,
             const struct fwd_fields *f)
{
    memset(ur, 0, sizeof(*ur));
    /* route.c lets only GET and POST through to here */
    ur->method = gw_strieq(c->req.method, c->req.method_len, "POST")
                 ? "POST" : "GET";
    ur->path = f->path;
    ur->body = buf_ptr(&c->body);
    ur->body_len = buf_len(&c->body);
    ur->content_type = f->content_type;
    ur->accept = f->accept;
    ur->request_id = c->request_id;
    ur->client_auth = f->auth;
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

static void
forward_direct(struct conn *c)
{
    struct upstream_sink sink = { c, relay_head, relay_data, relay_tick };
    struct upstream_request ur;
    struct upstream_result res;
    struct fwd_fields f;

    if (fields_init(&f, c) != 0) {
        conn_send_error(c, 503, "server_error", "overloaded",
                        "out of memory");
        goto out;
    }
    request_init(&ur, c, &f);
    metrics_upstream_call();
    upstream_perform(c->srv->up, &ur, &sink, &res);
    c->upstream_status = res.status;
    if (res.rc == 0) {
        conn_end(c, conn_send_deadline(c));
    } else if (res.rc == GW_EABORTED || c->broken) {
        c->broken = 1;          /* the client went away: nothing to say */
        c->keep_alive = 0;
    } else {
        upstream_error(c, res.rc, res.reason);
    }

out:
    fields_release(&f);
}

/* ---- coalescing ---- */

/* The leader's state inside its upstream callbacks. */
struct leader {
    struct conn *c;
    struct coalescer *co;
    struct flight *f;
    int attached;               /* the leader's client is still a reader */
    size_t next;                /* next chunk to frame for the client */
    struct buf pending;         /* framed bytes not yet written */
};

/* Bytes framed ahead for the leader's client before writing. */
#define LEADER_FRAME_AHEAD 65536

static void
leader_detach_client(struct leader *l)
{
    if (!l->attached)
        return;
    l->attached = 0;
    l->c->broken = 1;
    l->c->keep_alive = 0;
    coalescer_detach(l->co, l->f);
    log_msg(GW_LOG_INFO, "coalesce: leader client gone, flight continues "
            "for followers");
}

/*
 * Write what the leader's client can take now, never waiting: the
 * upstream loop must not block on any client socket, or one stalled
 * client would stall every follower.  What the socket does not take stays
 * in the flight (and in 'pending'), to be written after the transfer.
 */
static void
leader_flush(struct leader *l)
{
    struct conn *c = l->c;
    size_t n;

    while (l->attached) {
        if (buf_len(&l->pending) == 0) {
            if (l->next >= flight_leader_nchunks(l->f))
                return;         /* the head waits for the first bytes */
            if (!c->head_sent) {
                if (buf_append(&l->pending, buf_ptr(&c->out),
                               buf_len(&c->out)) != 0)
                    goto gone;
                conn_note_sent(c, 0);
            }
            while (l->next < flight_leader_nchunks(l->f)
                   && buf_len(&l->pending) < LEADER_FRAME_AHEAD) {
                const struct flight_chunk *ch;

                ch = flight_leader_chunk(l->f, l->next);
                if (conn_frame(c, ch->data, ch->len, &l->pending) != 0)
                    goto gone;
                conn_note_sent(c, ch->len);
                l->next++;
            }
            if (buf_len(&l->pending) == 0)
                return;
        }
        if (net_write_some(c->fd, buf_ptr(&l->pending),
                           buf_len(&l->pending), &n) != 0)
            goto gone;
        buf_consume(&l->pending, n);
        if (buf_len(&l->pending) > 0)
            return;             /* the socket is full: later */
    }
    return;

gone:
    leader_detach_client(l);
}

static int
lead_head(void *arg, int status, const char *content_type,
          int64_t content_length)
{
    struct leader *l = arg;

    flight_set_head(l->f, status, content_type, content_length);
    l->c->upstream_status = status;
    if (l->attached
        && conn_begin(l->c, status, content_type, content_length, NULL) != 0)
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
                      (size_t)l->c->srv->cfg->max_flight_bytes) != 0)
        return 1;
    leader_flush(l);
    return lead_nobody(l);
}

static int
lead_tick(void *arg)
{
    struct leader *l = arg;
    int done = conn_body_complete(l->c) && buf_len(&l->pending) == 0;

    if (l->attached && !done && peer_check_due(l->c)
        && net_peer_gone(l->c->fd))
        leader_detach_client(l);
    leader_flush(l);
    return lead_nobody(l);
}

/*
 * Relay the flight to this client from chunk 'index' on, at the client's
 * own pace, until the flight ends.  Used by followers from the start and
 * by the leader once its transfer is over.  The wait is sliced so that a
 * client that goes away while the flight is quiet is noticed; a flight
 * that makes no progress for follower_timeout ends the wait with 504.
 */
static void
relay_flight(struct conn *c, struct flight *f, size_t index)
{
    int64_t limit = c->srv->cfg->follower_timeout_ms;
    int64_t deadline = gw_now_ms() + limit;
    int begun = c->status != 0;
    struct flight_view v;
    int64_t jitter;
    int rc;

    /*
     * The slice is jittered per connection (1 to 2 s): thousands of
     * followers that joined together must not all time out, wake and
     * re-take the flight's mutex in the same instant every second.
     */
    jitter = (int64_t)(((unsigned)c->fd * 2654435761u) % 1000u);

    for (;;) {
        int64_t slice = gw_now_ms() + 1000 + jitter;

        rc = flight_wait(f, index, !begun, slice < deadline ? slice
                                                            : deadline, &v);
        if (!begun && v.head_set && !(v.state == FLIGHT_FAILED
                                      && v.nchunks == 0)) {
            c->upstream_status = v.status;
            if (conn_begin(c, v.status, v.content_type[0] != '\0'
                           ? v.content_type : NULL, v.content_length,
                           NULL) != 0) {
                c->broken = 1;
                return;
            }
            begun = 1;
        }
        for (size_t i = 0; i < v.count; i++) {
            if (conn_body(c, v.chunk[i]->data, v.chunk[i]->len,
                          conn_send_deadline(c)) != 0)
                return;         /* client gone or stuck: broken */
            index++;
        }
        if (v.count > 0) {
            deadline = gw_now_ms() + limit;
            continue;
        }
        if (v.state == FLIGHT_DONE && index >= v.nchunks) {
            conn_end(c, conn_send_deadline(c));
            return;
        }
        if (v.state == FLIGHT_FAILED && index >= v.nchunks) {
            upstream_error(c, v.err_rc, v.err_reason);
            return;
        }
        if (rc == GW_ETIMEDOUT) {
            if (net_peer_gone(c->fd)) {
                c->broken = 1;
                c->keep_alive = 0;
                return;
            }
            if (gw_now_ms() >= deadline) {
                upstream_error(c, GW_ETIMEDOUT, "follower wait timeout");
                return;
            }
        }
    }
}

static void
lead(struct conn *c, struct flight *f, const char *keyhex)
{
    struct leader l = { c, c->srv->co, f, 1, 0, { 0 } };
    struct upstream_sink sink = { &l, lead_head, lead_data, lead_tick };
    struct upstream_request ur;
    struct upstream_result res;
    struct fwd_fields fw;
    int rc;

    c->role = "leader";
    metrics_coalesce_leader();
    log_msg(GW_LOG_INFO, "coalesce: leader key=%s", keyhex);
    buf_init(&l.pending, LEADER_FRAME_AHEAD * 2 + 4096);
    if (fields_init(&fw, c) != 0) {
        res.rc = GW_ENOMEM;
        res.reason = "out of memory";
        coalescer_finish(c->srv->co, f, res.rc, res.reason);
    } else {
        request_init(&ur, c, &fw);
        metrics_upstream_call();
        upstream_perform(c->srv->up, &ur, &sink, &res);
        coalescer_finish(c->srv->co, f, res.rc, res.reason);
    }
    if (res.rc != 0 && res.rc != GW_EABORTED)
        log_msg(GW_LOG_INFO, "coalesce: flight failed key=%s reason=\"%s\"",
                keyhex, res.reason != NULL ? res.reason : "-");
    fields_release(&fw);

    if (l.attached) {
        /* The transfer is over: now the client may take its time. */
        rc = 0;
        if (buf_len(&l.pending) > 0) {
            rc = net_write_all(c->fd, buf_ptr(&l.pending),
                               buf_len(&l.pending), conn_send_deadline(c));
            if (rc != 0) {
                c->broken = 1;
                c->keep_alive = 0;
            }
        }
        if (rc == 0)
            relay_flight(c, f, l.next);
        coalescer_detach(c->srv->co, f);
    }
    buf_release(&l.pending);
    flight_unref(f);            /* the driver's reference */
}

static void
follow(struct conn *c, struct flight *f, size_t tenant, const char *keyhex)
{
    c->role = "follower";
    metrics_coalesce_follower(tenant);
    log_msg(GW_LOG_INFO, "coalesce: follower key=%s tenant=%s", keyhex,
            coalesce_tenant_name(c->srv->cfg, tenant));
    relay_flight(c, f, 0);
    coalescer_detach(c->srv->co, f);
}

static void
bypass(struct conn *c, enum metrics_bypass why, const char *keyhex)
{
    c->role = "bypass";
    metrics_coalesce_bypass(why);
    log_msg(GW_LOG_INFO, "coalesce: bypass key=%s reason=%s", keyhex,
            metrics_bypass_name(why));
    forward_direct(c);
}

void
proxy_forward(struct conn *c, const json_t *json, int coalescable)
{
    const struct gw_config *cfg = c->srv->cfg;
    unsigned char key[FLIGHT_KEY_LEN];
    enum metrics_bypass why;
    struct flight *f;
    char keyhex[13];
    size_t tenant;

    if (!coalescable || json == NULL) {
        forward_direct(c);
        return;
    }
    tenant = c->tenant;
    if (!coalesce_eligible(cfg, tenant, &c->req, json, &why)) {
        bypass(c, why, "-");
        return;
    }
    coalesce_key(coalesce_tenant_name(cfg, tenant), c->req.method,
                 c->req.method_len, c->req.target, c->req.target_len,
                 cfg->upstream_url, buf_ptr(&c->body), buf_len(&c->body),
                 key);
    coalesce_key_hex(key, keyhex);
    switch (coalescer_join(c->srv->co, key, &f, &why)) {
    case COALESCE_LEADER:
        lead(c, f, keyhex);
        break;
    case COALESCE_FOLLOWER:
        follow(c, f, tenant, keyhex);
        break;
    case COALESCE_BYPASS:
        bypass(c, why, keyhex);
        break;
    }
}
