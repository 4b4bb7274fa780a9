/* SPDX-License-Identifier: MIT */
/*
 * send.c - mock_upstream's answers on the wire (send.h).
 *
 * Responses copy vLLM's wire format: compact JSON with vLLM's key order,
 * one SSE event per HTTP chunk, "data: [DONE]" last (complete.c).
 */
#include "send.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/uio.h>

#include "buf.h"
#include "http.h"
#include "jsonx.h"
#include "log.h"
#include "mock.h"
#include "net.h"
#include "util.h"

#define MOCK_BIG_HEADER (64 * 1024)

/* Append a 64 KiB header field, for the big_headers fault. */
static int
append_big_header(struct buf *h)
{
    char *p;
    int rc;

    rc = buf_append_str(h, "X-Mock-Big: ");
    if (rc == 0)
        rc = buf_reserve(h, MOCK_BIG_HEADER, &p);
    if (rc != 0)
        return rc;
    memset(p, 'x', MOCK_BIG_HEADER);
    buf_commit(h, MOCK_BIG_HEADER);
    return buf_append_str(h, "\r\n");
}

int
send_head(struct req *q, int status, const char *ctype, int64_t clen,
          const char *p, size_t n)
{
    struct buf *h = &q->c->hdr;
    struct iovec iov[2];
    int rc;

    if (clen < 0 && !q->chunked)
        q->close = 1;
    buf_reset(h);
    rc = buf_printf(h, "HTTP/1.1 %d %s\r\n", status, http_reason(status));
    if (rc == 0 && ctype != NULL)
        rc = buf_printf(h, "Content-Type: %s\r\n", ctype);
    if (rc == 0 && clen >= 0)
        rc = buf_printf(h, "Content-Length: %" PRId64 "\r\n", clen);
    if (rc == 0 && clen < 0 && q->chunked)
        rc = buf_append_str(h, "Transfer-Encoding: chunked\r\n");
    if (rc == 0 && q->allow != NULL)
        rc = buf_printf(h, "Allow: %s\r\n", q->allow);
    if (rc == 0 && q->retry_after > 0)
        rc = buf_printf(h, "Retry-After: %ld\r\n", q->retry_after);
    if (rc == 0 && q->close)
        rc = buf_append_str(h, "Connection: close\r\n");
    else if (rc == 0 && q->r->minor == 0)
        rc = buf_append_str(h, "Connection: keep-alive\r\n");
    if (rc == 0 && q->fault == FAULT_BIG_HEADERS)
        rc = append_big_header(h);
    if (rc == 0 && (q->fault == FAULT_NO_STORE || q->fault == FAULT_PRIVATE))
        rc = buf_printf(h, "Cache-Control: %s\r\n",
                        q->fault == FAULT_NO_STORE ? "no-store"
                                                   : "private, max-age=60");
    if (rc == 0)
        rc = buf_append_str(h, "\r\n");
    if (rc != 0) {
        log_msg(GW_LOG_ERROR, "mock: response head: %s", gw_strerror(rc));
        q->close = 1;
        return rc;
    }
    q->status = status;
    if (clen >= 0 && (uint64_t)clen == (uint64_t)n)
        send_close_call(q);     /* the whole answer goes now */
    iov[0].iov_base = h->data + h->off;
    iov[0].iov_len = buf_len(h);
    iov[1].iov_base = (void *)p;
    iov[1].iov_len = q->head_only ? 0 : n;  /* RFC 9110 9.3.2 */
    rc = net_writev_all(q->c->fd, iov, 2, gw_now_ms() + MOCK_SEND_MS, -1);
    if (rc != 0) {
        q->gone = 1;
        q->close = 1;
        return rc;
    }
    q->bytes += n;
    return 0;
}

int
send_piece(struct req *q, const char *p, size_t n)
{
    char size[24];
    struct iovec iov[3];
    int cnt = 0, k, rc;

    if (n == 0)
        return 0;
    if (q->chunked) {
        k = snprintf(size, sizeof(size), "%zx\r\n", n);
        iov[cnt].iov_base = size;
        iov[cnt++].iov_len = (size_t)k;
    }
    iov[cnt].iov_base = (void *)p;
    iov[cnt++].iov_len = n;
    if (q->chunked) {
        iov[cnt].iov_base = (void *)"\r\n";
        iov[cnt++].iov_len = 2;
    }
    rc = net_writev_all(q->c->fd, iov, cnt, gw_now_ms() + MOCK_SEND_MS,
                        -1);
    if (rc != 0) {
        q->gone = 1;
        q->close = 1;
        return rc;
    }
    q->bytes += n;
    return 0;
}

void
send_close_call(struct req *q)
{
    if (!q->open)
        return;
    q->open = 0;
    mock_lock();
    st.in_progress--;
    if (mock_is_completion(q->route))
        st.completing--;
    mock_unlock();
}

int
send_end(struct req *q)
{
    int rc;

    send_close_call(q);
    if (!q->chunked) {
        q->close = 1;
        return 0;
    }
    rc = net_write_all(q->c->fd, "0\r\n\r\n", 5, gw_now_ms() + MOCK_SEND_MS,
                       -1);
    if (rc != 0) {
        q->gone = 1;
        q->close = 1;
    }
    return rc;
}

int
send_simple(struct req *q, int status, const char *ctype, const char *p,
            size_t n)
{
    return send_head(q, status, ctype, (int64_t)n, p, n);
}

int
send_error(struct req *q, int status, const char *msg, const char *param,
           const char *code)
{
    struct buf *b = &q->c->out;
    const char *type = status < 500 ? "invalid_request_error"
                                     : "server_error";

    buf_reset(b);
    if (jsonx_error_body(b, msg, type, param, code) != 0) {
        buf_reset(b);
        q->close = 1;           /* out of memory: say as little as we can */
    }
    return send_simple(q, status, "application/json", buf_ptr(b),
                       buf_len(b));
}

int
send_json(struct req *q, int status, json_t *o, size_t flags)
{
    struct buf *b = &q->c->out;
    int rc;

    buf_reset(b);
    rc = o != NULL ? json_dump_callback(o, mock_dump_to_buf, b,
                                        JSON_COMPACT | flags)
                   : -1;
    json_decref(o);
    if (rc != 0)
        return send_error(q, 500, "mock: cannot build the response",
                          NULL, "internal_error");
    return send_simple(q, status, "application/json", buf_ptr(b),
                       buf_len(b));
}

int
send_event(struct req *q, json_t *o)
{
    struct buf *b = &q->c->out;
    int rc = -1;

    buf_reset(b);
    if (o != NULL && buf_append_str(b, "data: ") == 0
        && json_dump_callback(o, mock_dump_to_buf, b, JSON_COMPACT) == 0)
        rc = buf_append_str(b, "\n\n");
    json_decref(o);
    if (rc != 0) {
        log_msg(GW_LOG_ERROR, "mock: cannot build an SSE event");
        q->close = 1;           /* the body cannot end cleanly now */
        return GW_ENOMEM;
    }
    return send_piece(q, buf_ptr(b), buf_len(b));
}

void
send_not_found(struct req *q)
{
    send_error(q, 404, "no such route on the mock upstream", NULL,
               "not_found");
}
