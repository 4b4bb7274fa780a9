/*
 * conn.c - one client connection: keep-alive request loop and response
 * writing.
 *
 * Design: the loop reads a head (bounded by max_header_size and the header
 * and idle timeouts), hands the request to route.c, writes the access-log
 * line and goes round again while keep-alive holds.  Every error that
 * happens before a response head was sent becomes an OpenAI error body;
 * after a framing error the connection is closed, because the bytes that
 * follow can no longer be trusted to start a request (RFC 9112 section 9.3
 * and the smuggling notes in section 11.2).
 */
#include "conn.h"

#include <stdio.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "alloc.h"
#include "config.h"
#include "jsonx.h"
#include "log.h"
#include "net.h"
#include "route.h"
#include "server.h"

/* The first read is small; bigger bodies grow the buffer as needed. */
#define CONN_IN_LIMIT(cfg) ((size_t)(cfg)->max_header_size * 2 + 65536)

int64_t
conn_send_deadline(const struct conn *c)
{
    return gw_now_ms() + c->srv->cfg->send_timeout_ms;
}

static int
valid_request_id(const char *p, size_t n)
{
    if (n == 0 || n > 64)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char ch = p[i];

        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z')
              || (ch >= '0' && ch <= '9') || ch == '.' || ch == '_'
              || ch == '-'))
            return 0;
    }
    return 1;
}

int
conn_begin(struct conn *c, int status, const char *content_type,
           int64_t content_length, const char *extra)
{
    int rc;

    c->status = status;
    c->event_stream = content_type != NULL
                      && strncmp(content_type, "text/event-stream", 17) == 0;
    c->content_length = content_length;
    if (content_length >= 0)
        c->framing = FRAMING_LENGTH;
    else if (c->req.minor >= 1)
        c->framing = FRAMING_CHUNKED;
    else {
        c->framing = FRAMING_CLOSE;     /* HTTP/1.0 knows no chunks */
        c->keep_alive = 0;
    }
    if (server_draining(c->srv))
        c->keep_alive = 0;
    buf_reset(&c->out);
    rc = buf_printf(&c->out, "HTTP/1.1 %d %s\r\n", status,
                    http_reason(status));
    if (rc == 0 && content_type != NULL)
        rc = buf_printf(&c->out, "Content-Type: %s\r\n", content_type);
    if (rc == 0 && c->framing == FRAMING_LENGTH)
        rc = buf_printf(&c->out, "Content-Length: %lld\r\n",
                        (long long)content_length);
    if (rc == 0 && c->framing == FRAMING_CHUNKED)
        rc = buf_append_str(&c->out, "Transfer-Encoding: chunked\r\n");
    if (rc == 0 && c->event_stream)
        rc = buf_append_str(&c->out, "Cache-Control: no-cache\r\n");
    if (rc == 0)
        rc = buf_printf(&c->out, "X-Request-Id: %s\r\n", c->request_id);
    if (rc == 0 && c->role != NULL)
        rc = buf_printf(&c->out, "X-Infergw-Coalesce: %s\r\n", c->role);
    if (rc == 0 && extra != NULL)
        rc = buf_append_str(&c->out, extra);
    if (rc == 0) {
        if (!c->keep_alive)
            rc = buf_append_str(&c->out, "Connection: close\r\n\r\n");
        else if (c->req.minor == 0)
            rc = buf_append_str(&c->out, "Connection: keep-alive\r\n\r\n");
        else
            rc = buf_append_str(&c->out, "\r\n");
    }
    return rc;
}

int
conn_body_complete(const struct conn *c)
{
    return c->head_sent && c->framing == FRAMING_LENGTH
           && (int64_t)c->bytes_out >= c->content_length;
}

static void
note_first_byte(struct conn *c)
{
    if (c->ttfb_us < 0)
        c->ttfb_us = gw_now_us() - c->start_us;
}

int
conn_frame_iov(const struct conn *c, const char *p, size_t n,
               struct iovec iov[3], char size_line[CONN_SIZE_LINE])
{
    int cnt = 0;

    if (n == 0)
        return 0;               /* an empty chunk would end the body */
    if (c->framing == FRAMING_CHUNKED) {
        iov[cnt].iov_base = size_line;
        iov[cnt++].iov_len = (size_t)snprintf(size_line, CONN_SIZE_LINE,
                                              "%zx\r\n", n);
    }
    iov[cnt].iov_base = (void *)p;
    iov[cnt++].iov_len = n;
    if (c->framing == FRAMING_CHUNKED) {
        iov[cnt].iov_base = (void *)"\r\n";
        iov[cnt++].iov_len = 2;
    }
    return cnt;
}

void
conn_note_sent(struct conn *c, size_t n)
{
    c->head_sent = 1;
    if (n > 0) {
        c->bytes_out += n;
        note_first_byte(c);
    }
}

int
conn_body(struct conn *c, const char *p, size_t n, int64_t deadline)
{
    struct iovec iov[4];
    char size_line[CONN_SIZE_LINE];
    int cnt = 0, rc;

    if (c->broken)
        return GW_ECLOSED;
    if (n == 0 && c->head_sent)
        return 0;
    if (!c->head_sent) {
        iov[cnt].iov_base = (void *)buf_ptr(&c->out);
        iov[cnt++].iov_len = buf_len(&c->out);
    }
    cnt += conn_frame_iov(c, p, n, &iov[cnt], size_line);
    rc = net_writev_all(c->fd, iov, cnt, deadline);
    if (rc != 0) {
        c->broken = 1;
        c->keep_alive = 0;
        return rc;
    }
    conn_note_sent(c, n);
    return 0;
}

int
conn_end(struct conn *c, int64_t deadline)
{
    int rc;

    if (c->broken)
        return GW_ECLOSED;
    if (!c->head_sent) {
        rc = conn_body(c, NULL, 0, deadline);
        if (rc != 0)
            return rc;
    }
    if (c->framing == FRAMING_CHUNKED) {
        rc = net_write_all(c->fd, "0\r\n\r\n", 5, deadline);
        if (rc != 0) {
            c->broken = 1;
            c->keep_alive = 0;
            return rc;
        }
    }
    return 0;
}

void
conn_fail_body(struct conn *c, const char *type, const char *code,
               const char *message)
{
    struct buf ev;

    buf_init(&ev, 4096);
    if (!c->broken && c->event_stream && c->framing != FRAMING_LENGTH
        && buf_append_str(&ev, "data: ") == 0
        && jsonx_error_body(&ev, message, type, NULL, code) == 0
        && buf_append_str(&ev, "\n\n") == 0)
        conn_body(c, buf_ptr(&ev), buf_len(&ev), conn_send_deadline(c));
    buf_release(&ev);
    c->broken = 1;              /* no last chunk: the client sees a cut */
    c->keep_alive = 0;
}

int
conn_send(struct conn *c, int status, const char *content_type,
          const char *body, size_t len, const char *extra)
{
    int rc;

    rc = conn_begin(c, status, content_type, (int64_t)len, extra);
    if (rc == 0)
        rc = conn_body(c, body, len, conn_send_deadline(c));
    if (rc == 0 && len == 0)
        rc = conn_end(c, conn_send_deadline(c));
    return rc;
}

int
conn_send_error(struct conn *c, int status, const char *type,
                const char *code, const char *message)
{
    struct buf b;
    const char *extra = NULL;
    int rc;

    if (c->head_sent) {
        conn_fail_body(c, type, code, message);
        return GW_ECLOSED;
    }
    if (status == 503 || status == 429)
        extra = "Retry-After: 1\r\n";
    buf_init(&b, 4096);
    rc = jsonx_error_body(&b, message, type, NULL, code);
    if (rc == 0)
        rc = conn_send(c, status, "application/json", buf_ptr(&b),
                       buf_len(&b), extra);
    buf_release(&b);
    return rc;
}

/* Status, type and code for a request that failed to parse or arrive. */
static int
send_request_error(struct conn *c, int status, const char *msg)
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
    c->keep_alive = 0;
    return conn_send_error(c, status, "invalid_request_error", code,
                           msg != NULL ? msg : http_reason(status));
}

int
conn_read_body(struct conn *c)
{
    const struct gw_config *cfg = c->srv->cfg;
    int rc;

    buf_reset(&c->body);
    c->body.limit = (size_t)cfg->max_request_body;
    if (c->req.body_kind == HTTP_BODY_NONE)
        return 0;
    if (c->req.body_kind == HTTP_BODY_LENGTH
        && c->req.content_length > cfg->max_request_body) {
        send_request_error(c, 413, "request body exceeds max_request_body");
        return GW_ETOOBIG;
    }
    if (c->req.expect_continue && buf_len(&c->in) == 0) {
        static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";

        rc = net_write_all(c->fd, cont, sizeof(cont) - 1,
                           conn_send_deadline(c));
        if (rc != 0) {
            c->keep_alive = 0;
            return rc;
        }
    }
    rc = http_read_body(c->fd, &c->in, &c->req, &c->body,
                        gw_now_ms() + cfg->body_timeout_ms);
    if (rc == GW_ECLOSED || rc == GW_EIO) {
        c->keep_alive = 0;
        return rc;
    }
    if (rc == GW_ENOMEM) {
        c->keep_alive = 0;
        conn_send_error(c, 503, "server_error", "overloaded",
                        "out of memory reading the request body");
        return rc;
    }
    if (rc != 0) {
        send_request_error(c, c->req.error_status, c->req.error_msg);
        return rc;
    }
    return 0;
}

static void
reset_request(struct conn *c)
{
    c->start_us = gw_now_us();
    c->route = ROUTE_OTHER;
    c->status = 0;
    c->upstream_status = 0;
    c->bytes_out = 0;
    c->ttfb_us = -1;
    c->peer_check_ms = 0;
    c->head_sent = 0;
    c->framing = FRAMING_LENGTH;
    c->content_length = -1;
    c->keep_alive = 1;
    c->event_stream = 0;
    c->broken = 0;
    c->role = NULL;
    c->flight_id = NULL;
    c->tenant = CONFIG_MAX_TENANTS;
    c->model[0] = '\0';
    buf_reset(&c->out);
}

static void
set_request_id(struct conn *c)
{
    const struct http_header *h = http_find_header(&c->req, "X-Request-Id");

    if (h != NULL && valid_request_id(h->value, h->value_len)) {
        memcpy(c->request_id, h->value, h->value_len);
        c->request_id[h->value_len] = '\0';
    } else {
        gw_random_hex(c->request_id, 16);
    }
    log_set_request_id(c->request_id);
}

static void
access_log(struct conn *c)
{
    int64_t us = gw_now_us() - c->start_us;

    metrics_request(c->route, c->status, us, c->ttfb_us);
    if (!c->srv->cfg->access_log)
        return;
    log_msg(GW_LOG_INFO, "access method=%.*s path=%.*s model=%s status=%d "
            "upstream_status=%d bytes=%llu ms=%lld ttft_ms=%lld "
            "coalesce=%s%s%s%s",
            (int)c->req.method_len, c->req.method,
            (int)c->req.path_len, c->req.path,
            c->model[0] != '\0' ? c->model : "-", c->status,
            c->upstream_status, (unsigned long long)c->bytes_out,
            (long long)(us / 1000),
            (long long)(c->ttfb_us >= 0 ? c->ttfb_us / 1000 : -1),
            c->role != NULL ? c->role : "-",
            c->flight_id != NULL ? " flight=" : "",
            c->flight_id != NULL ? c->flight_id : "",
            c->broken ? " broken=1" : "");
}

static void
serve_loop(struct conn *c)
{
    const struct gw_config *cfg = c->srv->cfg;
    int rc;

    for (;;) {
        buf_compact(&c->in);
        log_set_request_id(NULL);
        reset_request(c);
        rc = http_read_head(c->fd, &c->in, &c->head,
                            (size_t)cfg->max_header_size,
                            gw_now_ms() + cfg->idle_timeout_ms,
                            (int)cfg->header_timeout_ms, c->srv->wake_rd,
                            &c->req);
        if (rc != 0) {
            /* Before any byte: a quiet close (idle, drain, peer gone). */
            if (rc == GW_ECLOSED || rc == GW_EABORTED || rc == GW_EIO
                || (rc == GW_ETIMEDOUT && c->req.error_status == 0))
                return;
            gw_random_hex(c->request_id, 16);
            log_set_request_id(c->request_id);
            if (rc == GW_ENOMEM) {
                c->keep_alive = 0;
                conn_send_error(c, 503, "server_error", "overloaded",
                                "out of memory reading the request");
            } else {
                send_request_error(c, c->req.error_status,
                                   c->req.error_msg);
            }
            log_msg(GW_LOG_INFO, "access status=%d error=\"%s\"", c->status,
                    c->req.error_msg != NULL ? c->req.error_msg : "-");
            metrics_request(ROUTE_OTHER, c->status, 0, -1);
            return;
        }
        c->start_us = gw_now_us();
        set_request_id(c);
        c->keep_alive = c->req.keep_alive && !server_draining(c->srv);
        route_request(c);
        access_log(c);
        if (!c->keep_alive || c->broken)
            return;
    }
}

void
conn_serve(struct server *srv, int fd)
{
    const struct gw_config *cfg = srv->cfg;
    struct conn *c;

    c = gw_calloc(1, sizeof(*c));
    if (c == NULL) {
        log_msg(GW_LOG_ERROR, "conn: out of memory, closing fd=%d", fd);
        close(fd);
        return;
    }
    c->srv = srv;
    c->fd = fd;
    buf_init(&c->in, CONN_IN_LIMIT(cfg));
    buf_init(&c->head, (size_t)cfg->max_header_size);
    buf_init(&c->body, (size_t)cfg->max_request_body);
    buf_init(&c->out, (size_t)cfg->max_header_size + 4096);
    serve_loop(c);
    close(c->fd);
    buf_release(&c->in);
    buf_release(&c->head);
    buf_release(&c->body);
    buf_release(&c->out);
    log_set_request_id(NULL);
    gw_free(c);
}
