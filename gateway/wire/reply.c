/* SPDX-License-Identifier: MIT */
/*
 * reply.c - one response to a client: head, framing, body, errors.
 *
 * Design: the head is formatted into r->head by reply_begin() and held
 * back until the first body bytes, so that a small response (an error,
 * a JSON completion) leaves in one writev().  Every error the gateway
 * makes itself has OpenAI's shape (DESIGN.md "Responses and errors"):
 * before the head is sent, a status and a JSON body; after it, on an
 * event stream, an SSE error event, and in every case an unclean end
 * (no last chunk, connection closed), never a fake success.
 */
#include "wire/reply.h"

#include <assert.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "http.h"
#include "jsonx.h"
#include "net.h"
#include "util.h"

/* Chunked framing's last chunk: the end of a clean body. */
#define LAST_CHUNK "0\r\n\r\n"
#define LAST_CHUNK_LEN (sizeof(LAST_CHUNK) - 1)

/* Defined below, used above (static outside test builds). */
GW_TESTABLE void reply_retry_after_line(char *out, size_t n, int seconds);

void
reply_init(struct reply *r, struct net_stream *s, size_t head_limit,
           int64_t send_timeout_ms, int stop_fd, const _Atomic int *draining)
{
    memset(r, 0, sizeof(*r));
    r->stream = s;
    r->stop_fd = stop_fd;
    r->draining = draining;
    r->send_timeout_ms = send_timeout_ms;
    buf_init(&r->head, head_limit);
}

void
reply_release(struct reply *r)
{
    buf_release(&r->head);
}

void
reply_start(struct reply *r, const char *request_id, int minor,
            int keep_alive)
{
    r->request_id = request_id;
    r->minor = minor;
    r->start_us = gw_now_us();
    r->status = 0;
    r->upstream_status = 0;
    r->bytes_out = 0;
    r->ttfb_us = -1;
    r->head_sent = 0;
    r->framing = REPLY_LENGTH;
    r->content_length = -1;
    r->keep_alive = keep_alive;
    r->event_stream = 0;
    r->broken = 0;
    r->linger = 0;
    r->role = NULL;
    r->cache = NULL;
    r->age_s = -1;
    r->head_only = 0;
    r->end_sent = 0;
    r->tenant_head[0] = '\0';
    r->error_code[0] = '\0';
    r->error_msg[0] = '\0';
    buf_reset(&r->head);
}

/* The deadline of a write the client must take within send_timeout. */
GW_TESTABLE int64_t
reply_deadline(const struct reply *r)
{
    return gw_now_ms() + r->send_timeout_ms;
}

static int
draining(const struct reply *r)
{
    return r->draining != NULL
           && atomic_load_explicit(r->draining, memory_order_relaxed);
}

/* "NAME: VALUE\r\n" (NAME with its ": "), appended to 'h'. */
static int
header_value(struct buf *h, const char *name, const char *value)
{
    int rc = buf_append_str(h, name);

    if (rc == 0)
        rc = buf_append_str(h, value);
    if (rc == 0)
        rc = buf_append(h, "\r\n", 2);
    return rc;
}

static int
header_u64(struct buf *h, const char *name, uint64_t v)
{
    char d[GW_U64_DIGITS + 1];

    d[gw_fmt_u64(v, d)] = '\0';
    return header_value(h, name, d);
}

/*
 * Prepare the response head: status, Content-Type (NULL: none), framing
 * from 'content_length' (-1: chunked, or close-delimited for HTTP/1.0),
 * X-Request-Id, X-Infergw-Coalesce when r->role is set, X-Infergw-Cache
 * and Age when r->cache and r->age_s are, 'extra' header
 * lines (each ending in CRLF; NULL for none) and Connection.  Nothing is
 * written yet.  Returns 0 or a buf error.
 */
GW_TESTABLE int
reply_begin(struct reply *r, int status, const char *content_type,
            int64_t content_length, const char *extra)
{
    struct buf *h = &r->head;
    /* RFC 9112 6.3: never a body, whatever else the upstream said. */
    int no_body = status < 200 || status == 204 || status == 304;
    int rc;

    if (no_body)
        content_length = 0;
    r->status = status;
    r->event_stream = content_type != NULL
                      && strncmp(content_type, "text/event-stream", 17) == 0;
    r->content_length = content_length;
    if (content_length >= 0) {
        r->framing = REPLY_LENGTH;
    } else if (r->minor >= 1) {
        r->framing = REPLY_CHUNKED;
    } else {
        r->framing = REPLY_CLOSE;       /* HTTP/1.0 knows no chunks */
        r->keep_alive = 0;
    }
    if (draining(r))
        r->keep_alive = 0;
    buf_reset(h);
    /* Appends, not printf: this runs for every answer. */
    rc = buf_append_str(h, "HTTP/1.1 ");
    if (rc == 0)
        rc = buf_append_u64(h, (uint64_t)status);
    if (rc == 0)
        rc = header_value(h, " ", http_reason(status));
    if (rc == 0 && content_type != NULL)
        rc = header_value(h, "Content-Type: ", content_type);
    if (rc == 0 && r->framing == REPLY_LENGTH && !no_body)
        rc = header_u64(h, "Content-Length: ", (uint64_t)content_length);
    if (rc == 0 && r->framing == REPLY_CHUNKED)
        rc = buf_append_str(h, "Transfer-Encoding: chunked\r\n");
    if (rc == 0 && r->event_stream)
        rc = buf_append_str(h, "Cache-Control: no-cache\r\n");
    if (rc == 0)
        rc = header_value(h, "X-Request-Id: ", r->request_id);
    if (rc == 0 && r->role != NULL)
        rc = header_value(h, "X-Infergw-Coalesce: ", r->role);
    if (rc == 0 && r->cache != NULL)
        rc = header_value(h, "X-Infergw-Cache: ", r->cache);
    if (rc == 0 && r->age_s >= 0)
        rc = header_u64(h, "Age: ", (uint64_t)r->age_s);
    if (rc == 0 && extra != NULL)
        rc = buf_append_str(h, extra);
    if (rc == 0 && r->tenant_head[0] != '\0')
        rc = buf_append_str(h, r->tenant_head);
    if (rc == 0) {
        if (!r->keep_alive)
            rc = buf_append_str(h, "Connection: close\r\n\r\n");
        else if (r->minor == 0)
            rc = buf_append_str(h, "Connection: keep-alive\r\n\r\n");
        else
            rc = buf_append_str(h, "\r\n");
    }
    return rc;
}

int
reply_body_complete(const struct reply *r)
{
    return r->head_sent && r->framing == REPLY_LENGTH
           && ((int64_t)r->bytes_out >= r->content_length || r->head_only);
}

/* A chunk's size line, "%zx\r\n", into 'out'; its length.  (printf's
 * cost, per chunk of every stream, is worth the loop.) */
static size_t
size_line_of(size_t n, char out[REPLY_SIZE_LINE])
{
    static const char hex[] = "0123456789abcdef";
    char rev[2 * sizeof(size_t)];
    size_t k = 0, len = 0;

    do {
        rev[k++] = hex[n & 15];
        n >>= 4;
    } while (n != 0);
    while (k > 0)
        out[len++] = rev[--k];
    out[len++] = '\r';
    out[len++] = '\n';
    return len;
}

int
reply_frame_iov(const struct reply *r, const char *p, size_t n,
                struct iovec iov[3], char size_line[REPLY_SIZE_LINE])
{
    int cnt = 0;

    if (n == 0)
        return 0;               /* an empty chunk would end the body */
    if (r->framing == REPLY_CHUNKED) {
        iov[cnt].iov_base = size_line;
        iov[cnt++].iov_len = size_line_of(n, size_line);
    }
    iov[cnt].iov_base = (void *)p;
    iov[cnt++].iov_len = n;
    if (r->framing == REPLY_CHUNKED) {
        iov[cnt].iov_base = (void *)"\r\n";
        iov[cnt++].iov_len = 2;
    }
    return cnt;
}

void
reply_note_sent(struct reply *r, size_t n)
{
    r->head_sent = 1;
    if (n > 0) {
        r->bytes_out += n;
        if (r->ttfb_us < 0)
            r->ttfb_us = gw_now_us() - r->start_us;
    }
}

void
reply_gone(struct reply *r)
{
    r->broken = 1;
    r->keep_alive = 0;
}

/* Sockets looked at in one poll() (the array is on the stack). */
#define GONE_BATCH 64

/* Look at the sockets of look[0..k) at once; mark the gone ones. */
static size_t
look_gone(struct reply *const *look, size_t k)
{
    struct pollfd pfd[GONE_BATCH];
    size_t gone = 0;

    for (size_t j = 0; j < k; j++)
        pfd[j].fd = net_stream_fd(look[j]->stream);
    net_peers_gone(pfd, k);
    for (size_t j = 0; j < k; j++)
        if (pfd[j].revents) {
            reply_gone(look[j]);
            gone++;
        }
    return gone;
}

size_t
reply_clients_gone(struct reply *const *v, size_t n)
{
    struct reply *look[GONE_BATCH];
    size_t gone = 0, k = 0;

    for (size_t i = 0; i < n; i++) {
        if (v[i]->broken)
            gone++;
        else if (!reply_body_complete(v[i]))    /* done is not gone */
            look[k++] = v[i];
        if (k == GONE_BATCH) {
            gone += look_gone(look, k);
            k = 0;
        }
    }
    if (k > 0)
        gone += look_gone(look, k);
    return gone;
}

int
reply_client_gone(struct reply *r)
{
    return reply_clients_gone(&r, 1) > 0;
}

int
reply_writev_some(struct reply *r, const struct iovec *iov, int cnt,
                  size_t *n)
{
    int rc;

    *n = 0;
    if (r->broken)
        return GW_ECLOSED;
    rc = net_stream_writev_some(r->stream, iov, cnt, n);
    if (rc != 0)
        reply_gone(r);
    return rc;
}

int
reply_write_all(struct reply *r, const char *p, size_t len)
{
    int rc;

    if (r->broken)
        return GW_ECLOSED;
    rc = net_stream_write_all(r->stream, p, len, reply_deadline(r),
                              r->stop_fd);
    if (rc != 0)
        reply_gone(r);
    return rc;
}

void
reply_close_unread(struct reply *r)
{
    r->keep_alive = 0;
    r->linger = 1;
}

int
reply_body(struct reply *r, const char *p, size_t n)
{
    struct iovec iov[4];
    char size_line[REPLY_SIZE_LINE];
    int cnt = 0, rc;

    if (r->broken)
        return GW_ECLOSED;
    if (r->head_only)
        n = 0;                  /* HEAD: what GET would say, no body */
    if (n == 0 && r->head_sent)
        return 0;
    if (!r->head_sent) {
        iov[cnt].iov_base = (void *)buf_ptr(&r->head);
        iov[cnt++].iov_len = buf_len(&r->head);
    }
    cnt += reply_frame_iov(r, p, n, &iov[cnt], size_line);
    rc = net_stream_writev_all(r->stream, iov, cnt, reply_deadline(r),
                               r->stop_fd);
    if (rc != 0) {
        reply_gone(r);
        return rc;
    }
    reply_note_sent(r, n);
    return 0;
}

int
reply_end(struct reply *r)
{
    int rc;

    if (r->broken)
        return GW_ECLOSED;
    if (!r->head_sent) {
        rc = reply_body(r, NULL, 0);
        if (rc != 0)
            return rc;
    }
    if (r->framing == REPLY_CHUNKED && !r->head_only && !r->end_sent) {
        rc = net_stream_write_all(r->stream, LAST_CHUNK, LAST_CHUNK_LEN,
                                  reply_deadline(r), r->stop_fd);
        if (rc != 0) {
            reply_gone(r);
            return rc;
        }
    }
    return 0;
}

int
reply_end_iov(const struct reply *r, struct iovec *iov)
{
    if (r->framing != REPLY_CHUNKED || r->head_only || r->end_sent)
        return 0;
    iov->iov_base = (void *)LAST_CHUNK;
    iov->iov_len = LAST_CHUNK_LEN;
    return 1;
}

void
reply_note_end(struct reply *r)
{
    r->end_sent = 1;
}

/*
 * Into 'ev', the SSE error event (unframed) for a stream that can still
 * take one: an event stream, not broken, not a Content-Length body.
 * Nothing for any other response.  Returns 0 or a buf error.
 */
static int
error_event(const struct reply *r, struct buf *ev, const char *type,
            const char *code, const char *message)
{
    int rc;

    if (r->broken || !r->event_stream || r->framing == REPLY_LENGTH)
        return 0;
    rc = buf_append_str(ev, "data: ");
    if (rc == 0)
        rc = jsonx_error_body(ev, message, type, NULL, code);
    if (rc == 0)
        rc = buf_append_str(ev, "\n\n");
    return rc;
}

/* Keep 'code' and 'message' (copied, cut to fit) as the error this
 * answer gives its client (struct reply's error_code). */
static void
note_error(struct reply *r, const char *code, const char *message)
{
    snprintf(r->error_code, sizeof(r->error_code), "%s", code);
    snprintf(r->error_msg, sizeof(r->error_msg), "%s", message);
}

/*
 * End the body uncleanly after a mid-response failure: for an event
 * stream not yet broken, an SSE error event in the OpenAI shape; then no
 * terminating chunk, and the connection closes (never a fake success).
 * A close-delimited body (HTTP/1.0) that is not an event stream has no
 * other way to tell: its connection is reset (SO_LINGER 0), not closed.
 */
GW_TESTABLE void
reply_fail_body(struct reply *r, const char *type, const char *code,
                const char *message)
{
    struct buf ev;

    note_error(r, code, message);
    buf_init(&ev, 4096);
    if (error_event(r, &ev, type, code, message) == 0 && buf_len(&ev) > 0)
        reply_body(r, buf_ptr(&ev), buf_len(&ev));
    buf_release(&ev);
    reply_fail_end(r);
}

int
reply_fail_event(struct reply *r, struct buf *out, const char *type,
                 const char *code, const char *message)
{
    char size_line[REPLY_SIZE_LINE];
    struct iovec iov[3];
    struct buf ev;
    int rc, cnt = 0;

    assert(r->head_sent);
    note_error(r, code, message);
    buf_init(&ev, 4096);
    rc = error_event(r, &ev, type, code, message);
    if (rc == 0)
        cnt = reply_frame_iov(r, buf_ptr(&ev), buf_len(&ev), iov, size_line);
    for (int i = 0; i < cnt && rc == 0; i++)
        rc = buf_append(out, iov[i].iov_base, iov[i].iov_len);
    if (rc == 0)
        reply_note_sent(r, buf_len(&ev));
    buf_release(&ev);
    return rc;
}

void
reply_fail_end(struct reply *r)
{
    struct linger reset = { 1, 0 };

    /*
     * No last chunk: the client sees a cut.  A close-delimited body would
     * look complete at a plain close, so it ends with a reset instead
     * (an event stream has said so in its last event already).
     */
    if (r->framing == REPLY_CLOSE && !r->event_stream)
        setsockopt(net_stream_fd(r->stream), SOL_SOCKET, SO_LINGER, &reset,
                   sizeof(reset));
    reply_gone(r);
}

int
reply_send(struct reply *r, int status, const char *content_type,
           const char *body, size_t len, const char *extra)
{
    int rc;

    rc = reply_begin(r, status, content_type, (int64_t)len, extra);
    if (rc == 0)
        rc = reply_body(r, body, len);
    if (rc == 0 && len == 0)
        rc = reply_end(r);
    return rc;
}

int
reply_begin_head(struct reply *r, const struct http_head *h)
{
    char extra[REPLY_EXTRA_MAX];

    r->upstream_status = h->status;
    reply_retry_after_line(extra, sizeof(extra), h->retry_after_s);
    return reply_begin(r, h->status, h->content_type[0] != '\0'
                       ? h->content_type : NULL, h->content_length,
                       extra[0] != '\0' ? extra : NULL);
}

/*
 * "Retry-After: N\r\n" into out (n >= 32, as a REPLY_EXTRA_MAX buffer
 * is), for reply_begin()'s 'extra'; "" when seconds <= 0.  N is the
 * caller's, bounded by it: a relayed 429's or 503's when it was read,
 * a failed call's in reply_failure() (both HTTP_RETRY_AFTER_MAX_MS,
 * http_response.h); a tenant's spent token budget (route.c) truly has
 * room only when its day or month ends, hours or days away.
 */
GW_TESTABLE void
reply_retry_after_line(char *out, size_t n, int seconds)
{
    if (seconds > 0)
        snprintf(out, n, "Retry-After: %d\r\n", seconds);
    else if (n > 0)
        out[0] = '\0';
}

/*
 * Every error answer the gateway makes itself ends here: the OpenAI
 * body and 'extra' (header lines, or ""), or once the head is sent the
 * unclean end of reply_fail_body().
 */
static int
error_answer(struct reply *r, int status, const char *type,
             const char *param, const char *code, const char *message,
             const char *extra)
{
    struct buf b;
    int rc;

    if (r->head_sent) {
        reply_fail_body(r, type, code, message);
        return GW_ECLOSED;
    }
    note_error(r, code, message);
    buf_init(&b, 4096);
    rc = jsonx_error_body(&b, message, type, param, code);
    if (rc == 0)
        rc = reply_send(r, status, "application/json", buf_ptr(&b),
                        buf_len(&b), extra[0] != '\0' ? extra : NULL);
    buf_release(&b);
    return rc;
}

int
reply_error_full(struct reply *r, int status, const char *type,
                 const char *param, const char *code, const char *message,
                 int retry_after_s)
{
    char extra[REPLY_EXTRA_MAX];

    reply_retry_after_line(extra, sizeof(extra), retry_after_s);
    /* RFC 9110 11.6.1: a 401 names the scheme it wants (RFC 6750). */
    if (status == 401)
        snprintf(extra, sizeof(extra), "WWW-Authenticate: Bearer\r\n");
    return error_answer(r, status, type, param, code, message, extra);
}

int
reply_out_of_memory(struct reply *r, const char *message)
{
    return reply_error(r, 503, "server_error", "overloaded", message);
}

int
reply_method_not_allowed(struct reply *r, const char *allow)
{
    char extra[REPLY_ALLOW_MAX + sizeof("Allow: \r\n")];

    snprintf(extra, sizeof(extra), "Allow: %s\r\n", allow);
    return error_answer(r, 405, "invalid_request_error", NULL,
                        "method_not_allowed",
                        "method not allowed on this route", extra);
}

int
reply_error(struct reply *r, int status, const char *type, const char *code,
            const char *message)
{
    return reply_error_full(r, status, type, NULL, code, message,
                            status == 503 || status == 429 ? 1 : 0);
}

int
reply_request_error(struct reply *r, int status, const char *msg)
{
    const char *code;

    switch (status) {
    case 408: code = "request_timeout"; break;
    case 413: code = "request_too_large"; break;
    case 414: code = "uri_too_long"; break;
    case 431: code = "headers_too_large"; break;
    case 501: code = "not_implemented"; break;
    case 505: code = "http_version_not_supported"; break;
    default:  code = "bad_request"; status = 400; break;
    }
    r->keep_alive = 0;
    return reply_error(r, status, "invalid_request_error", code,
                       msg != NULL ? msg : http_reason(status));
}

/* One mapping from a failed call to its answer (reply.h). */
void
reply_failure(struct reply *r, const struct call_outcome *o)
{
    const char *reason = call_kind_text(o->kind);
    char msg[128];
    int s = o->status, ra = o->retry_after_s > 0 ? o->retry_after_s : 1;

    /* A failed call's wait, the gateway's own (a held or ejected
     * upstream, up to eject_time's 5 m) or relayed, is said as at most
     * HTTP_RETRY_AFTER_MAX_MS: a client comes back sooner and is told
     * again, rather than staying away from an upstream that recovered. */
    if (ra > HTTP_RETRY_AFTER_MAX_MS / 1000)
        ra = HTTP_RETRY_AFTER_MAX_MS / 1000;

    if (o->kind == CALL_STATUS) {
        /* The upstream's own verdict, which no retry could change. */
        snprintf(msg, sizeof(msg), "upstream answered %d", s);
        reply_error_full(r, s, s == 429 ? "rate_limit_error"
                                        : "upstream_error", NULL,
                         s == 504 ? "upstream_timeout"
                         : s == 502 ? "upstream_error"
                                    : "upstream_overloaded", msg,
                         s == 429 || s == 503 ? ra : 0);
        return;
    }
    switch (call_kind_rc(o->kind)) {
    case GW_ETIMEDOUT:
        snprintf(msg, sizeof(msg), "upstream %s", reason);
        reply_error(r, 504, "upstream_error", "upstream_timeout", msg);
        return;
    case GW_ENOMEM:
        reply_out_of_memory(r, "gateway out of memory");
        return;
    case GW_ESTOPPING:
        reply_error(r, 503, "server_error", "shutting_down",
                    "gateway shutting down");
        return;
    case GW_EUNAVAIL:
        reply_error_full(r, 503, "server_error", NULL,
                         "upstream_unavailable", reason, ra);
        return;
    case GW_ESHED:
        reply_error_full(r, 429, "rate_limit_error", NULL,
                         "upstreams_saturated", "every upstream is "
                         "saturated; this tenant's requests are shed, not "
                         "queued", ra);
        return;
    case GW_ENOTFOUND:
        reply_error_full(r, 404, "invalid_request_error", "model",
                         "model_not_found", "the model is not served by "
                         "any upstream", 0);
        return;
    default:
        snprintf(msg, sizeof(msg), "upstream %s", reason);
        reply_error(r, 502, "upstream_error",
                    o->kind == CALL_CONNECT ? "upstream_unreachable"
                                            : "upstream_error", msg);
        return;
    }
}

void
reply_shutting_down(struct reply *r)
{
    struct call_outcome o = call_outcome_make(CALL_STOPPING);

    reply_failure(r, &o);
}

int
reply_continue(struct reply *r)
{
    static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";

    return net_stream_write_all(r->stream, cont, sizeof(cont) - 1,
                                reply_deadline(r), r->stop_fd);
}

size_t
reply_refuse(int fd, const char *request_id, const char *message)
{
    char body[256], msg[768], sink[4096];
    size_t w, drained = 0;
    ssize_t got;
    int nb, n;

    /* The message is ours, a constant: no JSON escaping is needed. */
    assert(strpbrk(message, "\"\\") == NULL);
    nb = snprintf(body, sizeof(body), "{\"error\":{\"message\":\"%s\","
                  "\"type\":\"server_error\",\"param\":null,"
                  "\"code\":\"overloaded\"}}", message);
    n = snprintf(msg, sizeof(msg), "HTTP/1.1 503 Service Unavailable\r\n"
                 "Content-Type: application/json\r\n"
                 "Content-Length: %d\r\nX-Request-Id: %s\r\n"
                 "Retry-After: 1\r\nConnection: close\r\n\r\n%s",
                 nb, request_id, body);
    /* A fresh socket's send buffer takes this in one go. */
    if (nb > 0 && (size_t)nb < sizeof(body) && n > 0
        && (size_t)n < sizeof(msg))
        net_write_some(fd, msg, (size_t)n, &w);
    shutdown(fd, SHUT_WR);
    while (drained < REPLY_REFUSE_DRAIN) {
        n = REPLY_REFUSE_DRAIN - drained < sizeof(sink)
            ? (int)(REPLY_REFUSE_DRAIN - drained) : (int)sizeof(sink);
        got = recv(fd, sink, (size_t)n, MSG_DONTWAIT);
        if (got <= 0)
            break;
        drained += (size_t)got;
    }
    close(fd);
    return drained;
}
