/* SPDX-License-Identifier: MIT */
/*
 * upstream.c - libcurl transfers to the upstreams: one call (and, when it
 * hedges, a second attempt) driven by the calling thread in its own wait,
 * over reused sessions.
 *
 * Design: a call runs on a session (upstream_session.h): a libcurl multi
 * handle with two easy handles and at most one warm connection, taken
 * from the session cache for the call's upstream and put back after it.
 *
 * Every request the upstream receives is counted.  libcurl resends a
 * request by itself, once, on a fresh connection, when a reused one
 * failed before any response byte (the upstream's idle close racing the
 * send).  That is the right thing to do (the request never reached the
 * upstream), but it used to be invisible, and capped at five per easy
 * handle for its whole life (CONN_MAX_RETRIES: a pooled handle's count
 * only grows), so the sixth race was a 502.  So a call starts with
 * curl_easy_reset() (upstream_session_handle()), which zeroes that
 * count, unless the handle's last transfer left it at 0 (attempt_end()
 * marks the handle ready: one send, libcurl's own code OK, a POST, no
 * one-off option such as attempt_restart()'s FRESH_CONNECT), and the
 * pre-request
 * callback (CURLOPT_PREREQFUNCTION, called right before each request is
 * sent) tells a resend from the first send and reports it
 * (upstream_opts.on_resend), so the caller counts it as an attempt, or
 * refuses it when the request has none left: an upstream that resets
 * every connection must not receive a request more often than the
 * retries allow just because each failure came on a kept connection.
 *
 * The loop (upstream_perform): the thread adds its transfer to the
 * session's multi handle and waits in its own poll() (upstream_session.h
 * says how) on libcurl's sockets plus two more: the client's socket (a
 * hang-up is seen at once) and the stop pipe.  It wakes for socket
 * activity, libcurl's timer, the next first byte or idle deadline, the
 * hedge deadline and at least once a second for the sink's on_tick.
 * This keeps the design card's shape, one thread per connection
 * blocking in its own wait, without an event-loop core.
 *
 * Hedging: with hedge_after set, an attempt with no first body byte after
 * that long makes the loop ask the caller for a second upstream, and the
 * second easy handle runs beside the first.  The response head is held
 * (upstream.h), so nothing reaches the sink until an attempt has its first
 * body byte: that attempt wins, and the other is removed from the multi
 * handle at once (libcurl closes its connection, so the upstream sees the
 * abort).  An attempt that answers a retryable status while the other
 * still runs just ends; so does one that fails.  The sink sees one
 * response, never bytes of two.
 *
 * The request: upstream_request.h sets it on the handle, every option
 * before every transfer.
 *
 * The response head is read strictly (RFC 9112 6.3,
 * common/http_response.h's http_response_head_line()): a Content-Length
 * that is not one plain decimal or disagrees with another, one together
 * with Transfer-Encoding, a transfer coding other than chunked, a content
 * coding (the gateway asks for identity: it reads the body for usage and
 * relays it as it is labelled), a head over UP_MAX_HEAD or a line over
 * libcurl's 100 KiB: the attempt fails as the upstream's fault before any
 * byte reaches a client, and libcurl closes the connection, so nothing
 * of that response can be read as the next request's answer.
 *
 * Hot path: a transfer on a warm session makes no allocation of its own
 * (upstream_request.h says how); libcurl still allocates internally (it
 * copies the URL, for one).
 *
 * Timers: libcurl enforces the connect and total timeouts (set per call:
 * they are the upstream's).  The first byte timeout (to the first body
 * byte) and the idle timeout are ours, checked by the loop, which sleeps
 * no longer than the nearest of them.
 *
 * Locking: struct upstream is immutable after upstream_new(); the session
 * cache locks itself.  A session, its handles and the per-call struct
 * call and struct xfer belong to one thread at a time: the caller's, or
 * the session cache's while the session idles.
 */
#include "upstream/upstream.h"

#include <assert.h>
#include <inttypes.h>
#include <poll.h>
#include <string.h>

#include <curl/curl.h>
#include <mbedtls/platform_util.h>

#include "alloc.h"
#include "buf.h"
#include "base/config.h"
#include "http.h"
#include "http_response.h"
#include "log.h"
#include "upstream/upstream_call.h"
#include "upstream/upstream_request.h"
#include "upstream/upstream_session.h"
#include "util.h"

/* The longest the loop sleeps: the sink's on_tick runs this often. */
#define UP_TICK_MS 1000

/* After a client socket turned out readable but not gone (its next
 * request, pipelined), how long the loop stops watching it. */
#define UP_PEER_MUTE_MS 100

/*
 * Largest upstream response head we accept, like nginx's
 * proxy_buffer_size: a vLLM head is a few hundred bytes, so anything near
 * this is broken or hostile, and a 502 beats relaying it.
 */
#define UP_MAX_HEAD (32 * 1024)

struct upstream {
    const struct gw_config *cfg;    /* borrowed, immutable */
    /* Per upstream: "Authorization: Bearer KEY" or NULL; owned, wiped
     * before free; immutable. */
    char *auth_line[CONFIG_MAX_UPSTREAMS];
    struct upstream_session_cache *sessions;    /* owned */
};

const struct upstream_opts upstream_default_opts = {
    .watch_fd = -1,
    .stop_fd = -1,
};

GW_TESTABLE size_t header_cb(char *p, size_t size, size_t n, void *arg);
GW_TESTABLE size_t write_cb(char *p, size_t size, size_t n, void *arg);
static int other_running(const struct xfer *x);

static int prereq_cb(void *arg, char *ip, char *local_ip, int port,
                     int local_port);

/*
 * Set the options of attempt x's handle that are the call's, after the
 * session's (upstream_session_handle()): the callbacks and their data.
 * Returns 0, or GW_EINVAL (logged) when this libcurl refuses one.
 */
static int
handle_setup(struct xfer *x)
{
    CURL *e = x->h->curl;

    if (curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, header_cb) != CURLE_OK
        || curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, write_cb) != CURLE_OK
        || curl_easy_setopt(e, CURLOPT_PREREQFUNCTION, prereq_cb)
           != CURLE_OK) {
        /* Not memory: this libcurl lacks an option we rely on. */
        log_msg(GW_LOG_ERROR, "upstream: libcurl refused an option");
        return GW_EINVAL;
    }
    /* Pointer options cannot fail. */
    curl_easy_setopt(e, CURLOPT_HEADERDATA, x);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, x);
    curl_easy_setopt(e, CURLOPT_PRIVATE, x);
    curl_easy_setopt(e, CURLOPT_PREREQDATA, x);
    return 0;
}

/* Stop the transfer from a callback with this outcome (first one wins). */
static void
xfer_fail(struct xfer *x, enum call_kind kind)
{
    if (x->fail == CALL_OK)
        x->fail = kind;
}

/* The sink stopped the transfer with 'rc' (struct upstream_sink). */
static void
sink_stop(struct xfer *x, int rc)
{
    xfer_fail(x, call_kind_of_stop(rc));
    x->sink_stopped = 1;
}

/* The head's Retry-After in whole seconds, for a 429 or a 503 only
 * (RFC 9110 10.2.3, RFC 6585); 0 none. */
static int
head_retry_after_s(const struct http_response_head *h)
{
    if (h->status != 429 && h->status != 503)
        return 0;
    return (int)gw_ms_to_s_ceil((uint64_t)h->retry_after_ms);
}

int
upstream_retryable_status(int status)
{
    return status == 429 || status == 502 || status == 503 || status == 504;
}

/*
 * CURLOPT_PREREQFUNCTION: attempt 'arg' is about to send its request, on
 * a connection new or reused.  A second time within one attempt is a
 * resend on a fresh connection (libcurl's, the file comment, or
 * attempt_restart()'s after a 408): one more request for the upstream,
 * so it is reported, and not sent when the caller refuses it (libcurl
 * then ends the transfer with CURLE_ABORTED_BY_CALLBACK, which
 * map_result() turns into our kind).
 */
static int
prereq_cb(void *arg, char *ip, char *local_ip, int port, int local_port)
{
    struct xfer *x = arg;
    const struct upstream_opts *o = x->call->opts;

    (void)ip;
    (void)local_ip;
    (void)port;
    (void)local_port;
    /* Kept, unless a socket was opened for this send. */
    x->reused = x->h->opened == x->opened_seen;
    x->opened_seen = x->h->opened;
    if (++x->sends == 1)
        return CURL_PREREQFUNC_OK;
    if (o->on_resend != NULL && o->on_resend(o->arg, x->idx) != 0) {
        xfer_fail(x, CALL_NOT_RESENT);
        return CURL_PREREQFUNC_ABORT;
    }
    log_msg(GW_LOG_INFO, "upstream: resent upstream=%s reason=\"reused "
            "connection closed before an answer\" id=%s", x->up->name,
            x->call->req->request_id != NULL ? x->call->req->request_id
                                             : "-");
    return CURL_PREREQFUNC_OK;
}

/*
 * CURLOPT_HEADERFUNCTION: libcurl hands over every line of every response
 * head, one complete line per call with its CRLF: the status line, the
 * fields, the empty line that ends the head; then again for the next head
 * after a 1xx, and finally trailer lines of a chunked body.  The empty
 * line of the final head is where on_head runs, so it precedes every
 * on_data even when the body is empty.  Returning anything but 'n' aborts
 * with CURLE_WRITE_ERROR.
 */
GW_TESTABLE size_t
header_cb(char *p, size_t size, size_t n, void *arg)
{
    struct xfer *x = arg;

    (void)size;                         /* always 1 */
    if (x->lost)
        return 0;                       /* the other attempt won */
    x->rx += n;
    x->last_rx_ms = gw_now_ms();
    if (x->head_done)
        return n;                       /* trailers: nothing we forward */
    switch (http_response_head_line(&x->head, p, n)) {
    case HTTP_RESPONSE_FIELD:
        return n;
    case HTTP_RESPONSE_STATUS:
        x->out.content_type[0] = '\0';
        return n;
    case HTTP_RESPONSE_CTYPE:
        /* Relayed whole or not at all (HTTP_CTYPE_MAX). */
        if (x->head.ctype_len >= sizeof(x->out.content_type)) {
            xfer_fail(x, CALL_HEADER_TOO_LARGE);
            return 0;
        }
        memcpy(x->out.content_type, x->head.ctype, x->head.ctype_len);
        x->out.content_type[x->head.ctype_len] = '\0';
        return n;
    case HTTP_RESPONSE_DONE:
        break;
    default:                            /* refused (http_response.h) */
        xfer_fail(x, call_kind_of_head(x->head.error));
        return 0;
    }

    /*
     * A 408 on a kept connection is the upstream's idle close meeting
     * our request, or a stray answer that was on its way (keepalive.h
     * polls before, but the bytes may cross the request on the wire).
     * Either way nothing more on that connection is ours: taken as this
     * request's answer, the stray would leave the real one there for the
     * next request, and every answer after it off by one.  Sent again on
     * a fresh connection (attempt_restart()), once.
     */
    if (x->head.status == 408 && x->reused && !x->restarted) {
        x->stale = 1;
        xfer_fail(x, CALL_STALE_408);
        return 0;
    }
    /* Held until the first body byte (upstream.h). */
    x->head_done = 1;
    /* The answer is whole: no body. */
    if ((x->head.has_cl && x->head.content_length == 0)
        || x->head.status == 204 || x->head.status == 304)
        x->leftover = upstream_session_tls_leftover(x->h, x->up->url);
    x->res.outcome.status = x->head.status;
    x->res.outcome.retry_after_s = head_retry_after_s(&x->head);
    if (upstream_retryable_status(x->head.status)
        && (x->call->opts->stop_on_retryable || other_running(x))) {
        xfer_fail(x, CALL_STATUS);
        return 0;
    }
    return n;
}

/* Does another attempt of x's call still run (and may still win)? */
static int
other_running(const struct xfer *x)
{
    const struct call *c = x->call;

    for (int i = 0; i < c->n; i++)
        if (&c->x[i] != x && c->x[i].running && !c->x[i].lost)
            return 1;
    return 0;
}

/*
 * May attempt 'x' be the one the sink hears?  The first with a body byte
 * (or a complete empty body) wins, and every other is marked lost, for
 * the loop to remove.  While another attempt still runs, one with a
 * retryable status does not win: it ends and the other goes on.
 */
static int
claim_win(struct xfer *x)
{
    struct call *c = x->call;

    if (c->winner != NULL)
        return c->winner == x;
    if (other_running(x) && upstream_retryable_status(x->head.status)) {
        xfer_fail(x, CALL_STATUS);
        return 0;
    }
    c->winner = x;
    for (int i = 0; i < c->n; i++)
        if (&c->x[i] != x)
            c->x[i].lost = 1;
    if (c->opts->on_winner != NULL)
        c->opts->on_winner(c->opts->arg, x->idx, x->head.status);
    return 1;
}

/*
 * Tell the sink of the held head (once).  Returns 0 or the sink's code,
 * with the transfer's failure noted.
 */
static int
deliver_head(struct xfer *x)
{
    const struct upstream_sink *s = x->call->sink;
    int rc;

    if (x->res.head_seen)
        return 0;
    x->res.head_seen = 1;
    x->out.status = x->head.status;
    x->out.content_length = x->head.has_cl ? x->head.content_length : -1;
    x->out.retry_after_s = x->res.outcome.retry_after_s;  /* header_cb() */
    x->out.no_store = x->head.no_store;
    rc = s->on_head(s->arg, &x->out);
    if (rc != 0)
        sink_stop(x, rc);
    return rc;
}

/*
 * CURLOPT_WRITEFUNCTION: de-chunked body bytes.  Returning anything but
 * 'n' makes libcurl stop with CURLE_WRITE_ERROR.
 */
GW_TESTABLE size_t
write_cb(char *p, size_t size, size_t n, void *arg)
{
    struct xfer *x = arg;
    const struct upstream_sink *s = x->call->sink;
    int rc;

    (void)size;                         /* always 1 */
    if (n == 0 || x->lost)
        return 0;
    x->rx += n;
    x->last_rx_ms = gw_now_ms();
    if (!x->head_done) {
        /* Cannot happen over HTTP/1.x (0.9 is refused by default); kept
         * so that on_data can never precede on_head. */
        xfer_fail(x, CALL_BAD_HEAD);
        return 0;
    }
    if (x->res.bytes == 0) {
        x->res.ttfb_us = gw_now_us() - x->start_us;
        if (!claim_win(x) || deliver_head(x) != 0)
            return 0;
    }
    x->res.bytes += n;
    if (x->head.has_cl && x->res.bytes == (uint64_t)x->head.content_length)
        x->leftover = upstream_session_tls_leftover(x->h, x->up->url);
    rc = s->on_data(s->arg, p, n);
    if (rc != 0) {
        sink_stop(x, rc);
        return 0;
    }
    return n;
}

/*
 * Turn the libcurl outcome into the attempt's kind (outcome.h).
 * Callback-made stops carry their own kind in x->fail.
 */
static enum call_kind
map_result(struct xfer *x, CURLcode cc)
{
    curl_off_t pretransfer_us = 0;

    switch (cc) {
    case CURLE_OK:
        if (!x->head_done)
            break;                      /* ended without a final head */
        /* An empty body: the held head goes now, if this one may win. */
        if (!claim_win(x) || deliver_head(x) != 0)
            return x->fail;
        return CALL_OK;
    case CURLE_WRITE_ERROR:             /* a header or write callback */
    case CURLE_ABORTED_BY_CALLBACK:     /* (no progress callback is set) */
        if (x->fail != CALL_OK)
            return x->fail;
        break;
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_CONNECT:
        return CALL_CONNECT;
    case CURLE_OPERATION_TIMEDOUT:
        /* Raised for CONNECTTIMEOUT and TIMEOUT alike; they differ in
         * whether the connection (TLS included) was ever ready. */
        curl_easy_getinfo(x->h->curl, CURLINFO_PRETRANSFER_TIME_T,
                          &pretransfer_us);
        return pretransfer_us > 0 ? CALL_TOTAL_TIMEOUT
                                  : CALL_CONNECT_TIMEOUT;
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CIPHER:
    case CURLE_SSL_ISSUER_ERROR:
        return CALL_TLS;
    case CURLE_GOT_NOTHING:
        return CALL_EMPTY_REPLY;
    case CURLE_WEIRD_SERVER_REPLY:
        return CALL_BAD_HEAD;
    case CURLE_URL_MALFORMAT:
        return CALL_BAD_URL;
    case CURLE_OUT_OF_MEMORY:
        /*
         * Also what libcurl 7.88 says of a response header line over its
         * 100 KiB (CURL_MAX_HTTP_HEADER), with nothing in the error
         * buffer.  Once the request is under way and the head not yet in,
         * that is by far the likelier: the upstream's fault, a 502.
         */
        curl_easy_getinfo(x->h->curl, CURLINFO_PRETRANSFER_TIME_T,
                          &pretransfer_us);
        if (pretransfer_us > 0 && !x->head_done)
            return CALL_HEAD_TOO_LARGE;
        return CALL_NOMEM;
    default:
        break;                          /* RECV_ERROR, PARTIAL_FILE, ... */
    }
    return CALL_BROKEN;
}

struct upstream *
upstream_new(const struct gw_config *cfg)
{
    struct upstream *u = NULL;
    struct upstream *ret = NULL;
    size_t i;

    assert(cfg->num_upstreams >= 1);
    u = gw_calloc(1, sizeof(*u));
    if (u == NULL)
        goto out;
    u->cfg = cfg;
    for (i = 0; i < cfg->num_upstreams; i++)
        if (upstream_request_auth_new(&cfg->upstreams[i],
                                      &u->auth_line[i]) != 0)
            goto out;
    u->sessions = upstream_session_cache_new(cfg->num_upstreams,
                                             cfg->keepalive,
                                             cfg->keepalive_timeout_ms);
    if (u->sessions == NULL)
        goto out;
    ret = u;
    u = NULL;

out:
    upstream_free(u);
    return ret;
}

void
upstream_free(struct upstream *u)
{
    size_t i;

    if (u == NULL)
        return;
    upstream_session_cache_free(u->sessions);
    u->sessions = NULL;
    for (i = 0; i < CONFIG_MAX_UPSTREAMS; i++) {
        upstream_request_auth_free(u->auth_line[i]);
        u->auth_line[i] = NULL;
    }
    gw_free(u);
}

static void
result_init(struct upstream_result *res, size_t idx)
{
    memset(res, 0, sizeof(*res));
    res->outcome = call_outcome_make(CALL_NOMEM);
    res->ttfb_us = -1;
    res->duration_us = -1;
    res->upstream = idx;
}

/*
 * Attempt 'x' is over: take it out of the multi handle and settle its
 * outcome, from libcurl's code 'cc' or, when 'own' is not CALL_OK, ours.
 * Logs a failure, unless the sink stopped it.
 */
static void
attempt_end(struct call *c, struct xfer *x, CURLcode cc, enum call_kind own)
{
    enum call_kind kind = own;
    struct call_outcome *o = &x->res.outcome;

    curl_multi_remove_handle(c->s->multi, x->h->curl);
    x->running = 0;
    x->res.duration_us = gw_now_us() - x->start_us;
    if (kind == CALL_OK)
        kind = map_result(x, cc);
    else
        cc = CURLE_OK;
    /*
     * The handle keeps its options for the next call when this transfer
     * left nothing behind: sent once (libcurl's resend count still 0),
     * ended by libcurl with an answer (200 or not), not restarted (no
     * FRESH_CONNECT), a POST (the method every call sets; a GET sets
     * HTTPGET, upstream_request.c).  Anything else: the next call resets.
     */
    x->h->ready = own == CALL_OK && (kind == CALL_OK || kind == CALL_STATUS)
                  && x->sends == 1 && !x->restarted
                  && strcmp(c->req->method, "POST") == 0;
    o->kind = kind;
    o->fault = call_kind_fault(kind);
    if (kind == CALL_CLIENT_GONE && !x->lost) {
        /* Nothing failed: nobody listens any more (a client's '| head'). */
        log_msg(GW_LOG_INFO, "upstream: call stopped, its clients hung up "
                "upstream=%s status=%d bytes=%" PRIu64 " path=%.*s",
                x->up->name, o->status, x->res.bytes,
                gw_log_path_len(c->req->path), c->req->path);
    } else if (kind != CALL_OK && !x->lost) {
        if (c->opts->detail != NULL)
            snprintf(c->opts->detail, c->opts->detail_size, "%s",
                     cc != CURLE_OK ? x->h->errbuf : "");
        /* The sink reports its own reasons; everything else is ours. */
        log_msg(c->opts->quiet ? GW_LOG_DEBUG
                : x->sink_stopped || kind == CALL_STATUS ? GW_LOG_INFO
                                                         : GW_LOG_WARN,
                "upstream: failed upstream=%s reason=\"%s\" error=\"%s\" "
                "curl=\"%s\" detail=\"%s\" status=%d bytes=%" PRIu64
                " path=%.*s", x->up->name, call_kind_text(kind),
                gw_strerror(call_kind_rc(kind)),
                cc != CURLE_OK ? curl_easy_strerror(cc) : "",
                cc != CURLE_OK ? x->h->errbuf : "", o->status,
                x->res.bytes, gw_log_path_len(c->req->path), c->req->path);
    }
    /* Our copy of the client's key; libcurl's copy in its own request
     * buffer is out of our reach. */
    if (x->wipe)
        mbedtls_platform_zeroize(x->h->scratch.data, x->h->scratch.cap);
}

/*
 * Attempt x's response state as before the first header line and its
 * timers as before its first send, for a new attempt or the same request
 * sent again (attempt_restart()); what it sends, and the counts of its
 * sends and sockets, stay.
 */
static void
response_reset(struct xfer *x)
{
    result_init(&x->res, x->idx);
    x->timeout_base_ms = -1;
    x->request_sent = 0;
    x->rx = 0;
    x->leftover = 0;
    http_response_head_init(&x->head, UP_MAX_HEAD,
                            HTTP_RETRY_AFTER_MAX_MS);
    memset(&x->out, 0, sizeof(x->out));
    x->head_done = 0;
    x->fail = CALL_OK;
    x->sink_stopped = 0;
}

/*
 * Make 'x' the next attempt of 'c', on upstream 'idx' ('up'), with its
 * response state as before the first header line.  x->h is the caller's
 * to set.
 */
GW_TESTABLE void
xfer_init(struct call *c, struct xfer *x, size_t idx,
          const struct config_upstream *up)
{
    assert(c->n < UP_ATTEMPTS && x == &c->x[c->n]);
    memset(x, 0, sizeof(*x));
    x->call = c;
    x->idx = idx;
    x->up = up;
    x->body_len = (curl_off_t)c->req->body_len;
    response_reset(x);
    c->n++;
}

/*
 * Start the next attempt of 'c' on upstream 'idx'.  Returns 0, or a code
 * with the attempt's result filled (it never ran).
 */
static int
attempt_start(struct call *c, size_t idx)
{
    struct upstream *u = c->u;
    struct xfer *x = &c->x[c->n];
    int i = c->n;                       /* its handle in the session */
    enum call_kind kind = CALL_NOMEM;
    int rc = GW_ENOMEM;

    assert(idx < u->cfg->num_upstreams);
    xfer_init(c, x, idx, &u->cfg->upstreams[idx]);
    rc = upstream_session_handle(c->s, i, idx, &x->h);
    if (rc == 0)
        rc = handle_setup(x);
    if (rc != 0) {
        if (rc == GW_EINVAL)
            kind = CALL_OPTION_REFUSED;
        goto out;
    }
    rc = upstream_request_prepare(x->h, x->up, u->auth_line[idx], c->req,
                                  c->opts->total_timeout_ms, x->lines,
                                  &x->wipe, &kind);
    if (rc != 0)
        goto out;
    x->start_us = gw_now_us();
    x->last_rx_ms = x->start_us / 1000;
    rc = GW_ENOMEM;
    if (curl_multi_add_handle(c->s->multi, x->h->curl) != CURLM_OK)
        goto out;
    x->running = 1;
    rc = 0;

out:
    if (rc != 0) {
        x->res.outcome = call_outcome_make(kind);
        log_msg(GW_LOG_WARN, "upstream: cannot start upstream=%s "
                "reason=\"%s\" path=%.*s", x->up->name,
                call_kind_text(kind),
                gw_log_path_len(c->req->path), c->req->path);
        if (x->wipe)
            mbedtls_platform_zeroize(x->h->scratch.data, x->h->scratch.cap);
    }
    return rc;
}

/*
 * The first byte and idle timers of a running attempt (the file comment's
 * "Timers").  The first byte timer starts once the connection is up
 * (pretransfer) and starts over when the whole request body has been
 * handed to the socket, so an upstream that never reads the body is
 * caught too, not only one that never answers.  It runs to the first
 * body byte: a stream's head comes at once, its first event after the
 * prompt is processed.  Then the idle timer takes over, fed by header and
 * body bytes alike.  Ends the attempt when one passes; else OUT *next is
 * lowered to when one would.
 */
static void
check_timers(struct call *c, struct xfer *x, int64_t now, int64_t *next)
{
    const struct config_upstream *up = x->up;
    curl_off_t pretransfer_us = 0, sent = 0;
    int64_t due;

    if (x->res.bytes > 0) {
        due = x->last_rx_ms + up->idle_timeout_ms;
        if (now >= due) {
            attempt_end(c, x, CURLE_OK, CALL_IDLE_TIMEOUT);
            return;
        }
    } else {
        if (x->timeout_base_ms < 0) {
            if (curl_easy_getinfo(x->h->curl, CURLINFO_PRETRANSFER_TIME_T,
                                  &pretransfer_us) != CURLE_OK
                || pretransfer_us <= 0)
                return;                 /* still connecting */
            x->timeout_base_ms = x->start_us / 1000 + pretransfer_us / 1000;
        }
        if (!x->request_sent
            && curl_easy_getinfo(x->h->curl, CURLINFO_SIZE_UPLOAD_T, &sent)
               == CURLE_OK
            && sent >= x->body_len) {
            x->request_sent = 1;
            x->timeout_base_ms = now;
        }
        due = x->timeout_base_ms + up->first_byte_timeout_ms;
        if (now >= due) {
            attempt_end(c, x, CURLE_OK, CALL_FIRST_BYTE_TIMEOUT);
            return;
        }
    }
    if (due < *next)
        *next = due;
}

/* The sink stopped the call with 'rc': end every running attempt. */
static void
stop_all(struct call *c, int rc)
{
    for (int i = 0; i < c->n; i++) {
        struct xfer *x = &c->x[i];

        if (!x->running)
            continue;
        sink_stop(x, rc);
        attempt_end(c, x, CURLE_OK, x->fail);
    }
}

/* Time for a hedge?  Ask the caller for a second upstream and start it. */
static void
maybe_hedge(struct call *c, int64_t now, int64_t *next)
{
    const struct upstream_opts *o = c->opts;
    struct xfer *x0 = &c->x[0];
    int64_t due;
    size_t idx;

    if (o->hedge_after_ms <= 0 || o->hedge == NULL || c->hedge_asked
        || c->n != 1 || !x0->running || c->winner != NULL)
        return;
    due = x0->start_us / 1000 + o->hedge_after_ms;
    if (now < due) {
        if (due < *next)
            *next = due;
        return;
    }
    c->hedge_asked = 1;
    if (o->hedge(o->arg, x0->idx, &idx) != 0)
        return;
    log_msg(GW_LOG_INFO, "upstream: hedge upstream=%s after=%" PRId64 "ms "
            "first=%s path=%.*s", c->u->cfg->upstreams[idx].name,
            o->hedge_after_ms, x0->up->name, gw_log_path_len(c->req->path),
            c->req->path);
    attempt_start(c, idx);
}

static int
any_running(const struct call *c)
{
    for (int i = 0; i < c->n; i++)
        if (c->x[i].running)
            return 1;
    return 0;
}

/*
 * Send attempt 'x' (stale: a 408 on a kept connection) again, on a fresh
 * connection: its response state as before the first header line, its
 * request as it was.  The pre-request callback reports the send, as it
 * does libcurl's own resend.  Returns 0, or GW_ENOMEM (x has ended).
 */
static int
attempt_restart(struct call *c, struct xfer *x)
{
    CURL *e = x->h->curl;

    curl_multi_remove_handle(c->s->multi, e);  /* closes the stale one */
    x->stale = 0;
    x->restarted = 1;
    x->sends = 1;
    response_reset(x);
    x->start_us = gw_now_us();
    x->last_rx_ms = x->start_us / 1000;
    if (curl_easy_setopt(e, CURLOPT_FRESH_CONNECT, 1L) != CURLE_OK
        || curl_multi_add_handle(c->s->multi, e) != CURLM_OK) {
        attempt_end(c, x, CURLE_OK, CALL_NOMEM);
        return GW_ENOMEM;
    }
    return 0;
}

/* libcurl is done with the running attempt 'x', with code 'cc'. */
GW_TESTABLE void
attempt_finished(struct call *c, struct xfer *x, CURLcode cc)
{
    /* A loser that libcurl ended (its callbacks refuse data) lost; its
     * connection did nothing wrong. */
    if (x->lost)
        attempt_end(c, x, CURLE_OK, CALL_LOST_HEDGE);
    else if (x->stale)
        attempt_restart(c, x);
    else
        attempt_end(c, x, cc, CALL_OK);
}

/* End the running attempts that the other one has beaten. */
GW_TESTABLE void
end_lost(struct call *c)
{
    for (int i = 0; i < c->n; i++)
        if (c->x[i].running && c->x[i].lost)
            attempt_finished(c, &c->x[i], CURLE_OK);
}

/* Read libcurl's finished transfers and end the lost ones. */
static void
reap(struct call *c)
{
    struct xfer *x;
    CURLMsg *msg;
    int left;

    while ((msg = curl_multi_info_read(c->s->multi, &left)) != NULL) {
        if (msg->msg != CURLMSG_DONE)
            continue;
        x = NULL;
        curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&x);
        if (x == NULL || !x->running)
            continue;
        attempt_finished(c, x, msg->data.result);
    }
    end_lost(c);
}

/*
 * The loop (the file comment): until no attempt runs.  Returns the
 * attempt whose result is the call's: the winner, else the one that
 * ended last.
 */
static struct xfer *
transfer_loop(struct call *c)
{
    const struct upstream_opts *o = c->opts;
    const struct upstream_sink *sink = c->sink;
    struct upstream_session *se = c->s;
    struct pollfd extra[UPSTREAM_SESSION_MAX_EXTRA];
    struct xfer *last = &c->x[0];
    int64_t now, next, mute_until = 0;
    int nx, w_at, s_at, rc;
    CURLMcode mc = CURLM_OK;

    for (;;) {
        for (int i = 0; i < c->n; i++)
            if (c->x[i].running)
                last = &c->x[i];        /* the last to end, if none wins */
        if (mc != CURLM_OK) {
            for (int i = 0; i < c->n; i++)
                if (c->x[i].running)
                    attempt_end(c, &c->x[i], CURLE_OK,
                                CALL_MULTI_FAILED);
        }
        reap(c);
        if (!any_running(c))
            break;
        now = gw_now_ms();
        next = now + UP_TICK_MS;
        for (int i = 0; i < c->n; i++)
            if (c->x[i].running)
                check_timers(c, &c->x[i], now, &next);
        if (sink->on_tick != NULL && (rc = sink->on_tick(sink->arg)) != 0)
            stop_all(c, rc);
        maybe_hedge(c, now, &next);
        if (!any_running(c))
            break;

        /* The client's socket and the stop pipe, beside libcurl's. */
        nx = 0;
        w_at = s_at = -1;
        if (o->watch_fd >= 0 && now >= mute_until && sink->on_peer != NULL) {
            extra[nx].fd = o->watch_fd;
            extra[nx].events = POLLIN;
            w_at = nx++;
        }
        if (o->stop_fd >= 0) {
            extra[nx].fd = o->stop_fd;
            extra[nx].events = POLLIN;
            s_at = nx++;
        }
        mc = upstream_session_wait(se, extra, nx, next);
        if (s_at >= 0 && extra[s_at].revents != 0) {
            rc = sink->on_tick != NULL ? sink->on_tick(sink->arg) : 0;
            if (rc != 0)
                stop_all(c, rc);
        }
        if (w_at >= 0 && extra[w_at].revents != 0 && any_running(c)) {
            /* The client's socket: readable is a hang-up, or its next
             * request already; the sink tells which. */
            rc = sink->on_peer(sink->arg);
            if (rc < 0)
                stop_all(c, rc);
            else
                mute_until = rc > 0 ? INT64_MAX : now + UP_PEER_MUTE_MS;
        }
    }
    for (int i = 0; i < c->n; i++)
        if (c->x[i].res.head_seen)
            return &c->x[i];
    return c->winner != NULL ? c->winner : last;
}

/*
 * May the connection a call leaves be kept?  Not after a 408 (the
 * upstream closes after one, RFC 9110 15.5.9, whatever its head said),
 * nor when TLS held bytes past an answer
 * (upstream_session_tls_leftover()).
 */
static int
call_keepable(const struct call *c, const struct xfer *final)
{
    for (int i = 0; i < c->n; i++)
        if (c->x[i].leftover)
            return 0;
    return final->res.outcome.status != 408;
}

int
upstream_perform(struct upstream *u, size_t idx,
                 const struct upstream_request *req,
                 const struct upstream_opts *opts,
                 const struct upstream_sink *sink,
                 struct upstream_result *res)
{
    struct call c;
    struct xfer *final;

    memset(&c, 0, sizeof(c));
    c.u = u;
    c.req = req;
    c.opts = opts != NULL ? opts : &upstream_default_opts;
    c.sink = sink;
    result_init(res, idx);
    assert(idx < u->cfg->num_upstreams);

    c.s = upstream_session_take(u->sessions, idx);
    if (c.s == NULL)
        return call_kind_rc(res->outcome.kind);
    if (attempt_start(&c, idx) == 0)
        final = transfer_loop(&c);
    else
        final = &c.x[0];
    *res = final->res;
    for (int i = 0; i < c.n; i++)
        if (&c.x[i] != final && c.opts->attempt_done != NULL)
            c.opts->attempt_done(c.opts->arg, &c.x[i].res);
    /*
     * Even after an error: libcurl has already closed a broken
     * connection, and kept one only after a complete answer.
     */
    upstream_session_put(u->sessions, c.s, call_keepable(&c, final));
    return call_kind_rc(res->outcome.kind);
}
