/* SPDX-License-Identifier: MIT */
/*
 * http_read.c - the blocking request reader (API in http_read.h): a head
 * through http_parse_request(), then the body, counted or chunked
 * (http_chunked.h), from a net.h stream.
 *
 * Design: bytes come in through one bounded buffer, 'in', which may hold
 * the start of the next request (pipelining); the head is copied out of
 * it so that its views outlive any later read, and a body is read
 * straight into its own buffer, never past its end.
 */
#include "http_read.h"

#include <poll.h>

#include "http_chunked.h"
#include "net.h"

/* Bytes the readers ask the kernel for at a time. */
#define READ_CHUNK 16384

/* Record why a read failed in 'r': the status to answer, a static
 * message. */
static void
fail(struct http_request *r, int status, const char *msg)
{
    r->error_status = status;
    r->error_msg = msg;
}

/*
 * Read more bytes into 'in', at most READ_CHUNK and never past its limit.
 * The unread bytes are moved to the front first: nobody holds views into
 * 'in' across a read (the readers hand out views into 'head' only).
 * Returns 0, GW_ETOOBIG ('in' is full) or what net_stream_read() returns.
 */
static int
fill(struct net_stream *s, struct buf *in, int64_t deadline, int wake_fd)
{
    size_t room, n, got;
    char *dst;
    int rc;

    buf_compact(in);
    if (in->len >= in->limit)
        return GW_ETOOBIG;
    room = in->limit - in->len;
    n = room < READ_CHUNK ? room : READ_CHUNK;
    rc = buf_reserve(in, n, &dst);
    if (rc != 0)
        return rc;
    rc = net_stream_read(s, dst, n, deadline, wake_fd, &got);
    if (rc != 0)
        return rc;
    buf_commit(in, got);
    return 0;
}

/* Move a view from the bytes at 'from' to the same bytes at 'to'. */
static const char *
rebase(const char *v, const char *from, const char *to)
{
    return v == NULL ? NULL : to + (v - from);
}

int
http_read_head(struct net_stream *s, struct buf *in, struct buf *head,
               size_t max_head, int64_t idle_deadline,
               int header_timeout_ms, int wake_fd, int stop_fd,
               struct http_request *r)
{
    const char *from;
    int64_t head_deadline = -1;
    int started = 0;
    size_t i, n;
    int rc;

    for (;;) {
        if (!started && buf_len(in) > 0) {
            /* The header timeout runs from the first byte of the head. */
            started = 1;
            if (header_timeout_ms >= 0)
                head_deadline = gw_now_ms() + header_timeout_ms;
        }
        rc = http_parse_request(buf_ptr(in), buf_len(in), max_head, r);
        if (rc > 0)
            break;
        if (rc != GW_EAGAIN)
            goto out;           /* r->error_status says why */
        /*
         * Between requests the next one has rarely arrived yet: poll first
         * and read once, instead of a read that fails with EAGAIN, then
         * poll, then the read (one system call less per keep-alive
         * request).  Draining only interrupts a connection that is between
         * requests; stopping interrupts a head under way too.
         */
        rc = 0;
        if (!started)
            rc = net_stream_wait(s, POLLIN, idle_deadline, wake_fd);
        if (rc == 0)
            rc = fill(s, in, started ? head_deadline : idle_deadline,
                      started ? stop_fd : wake_fd);
        if (rc == GW_ETIMEDOUT) {
            if (started)
                fail(r, 408, "request head timed out");
            goto out;
        }
        if (rc == GW_ETOOBIG) {
            fail(r, 431, "request head too large");
            goto out;
        }
        if (rc != 0)
            goto out;
    }

    /*
     * Copy the head and move the views: one memcpy instead of parsing
     * the head a second time.
     */
    n = (size_t)rc;
    buf_reset(head);
    rc = buf_append(head, buf_ptr(in), n);
    if (rc != 0) {
        if (rc == GW_ETOOBIG)
            fail(r, 431, "request head too large");
        goto out;
    }
    from = buf_ptr(in);
    r->method = rebase(r->method, from, buf_ptr(head));
    r->target = rebase(r->target, from, buf_ptr(head));
    r->path = rebase(r->path, from, buf_ptr(head));
    for (i = 0; i < r->num_headers; i++) {
        r->headers[i].name = rebase(r->headers[i].name, from, buf_ptr(head));
        r->headers[i].value = rebase(r->headers[i].value, from,
                                     buf_ptr(head));
    }
    buf_consume(in, n);
    rc = 0;

out:
    return rc;
}

/* Content-Length framing: read exactly the announced bytes into 'body'. */
static int
read_length(struct net_stream *s, struct buf *in, uint64_t length,
            struct buf *body, int64_t deadline, int wake_fd)
{
    uint64_t left = length;
    size_t n, got;
    char *dst;
    int rc;

    /* Refuse before reading anything (RFC 9110 15.5.14). */
    if (length > body->limit)
        return GW_ETOOBIG;
    n = buf_len(in);
    if (n > left)
        n = (size_t)left;
    if (n > 0) {
        rc = buf_append(body, buf_ptr(in), n);
        if (rc != 0)
            return rc;
        buf_consume(in, n);
        left -= n;
    }
    /*
     * Read straight into 'body', never past the body's end, so the next
     * request stays in the kernel.  Growing step by step instead of
     * reserving 'length' at once keeps a client from making us allocate
     * memory it never fills.
     */
    while (left > 0) {
        n = left < READ_CHUNK ? (size_t)left : READ_CHUNK;
        rc = buf_reserve(body, n, &dst);
        if (rc != 0)
            return rc;
        rc = net_stream_read(s, dst, n, deadline, wake_fd, &got);
        if (rc != 0)
            return rc;
        buf_commit(body, got);
        left -= got;
    }
    return 0;
}

/* Chunked framing: decode what 'in' holds, then read more into it. */
static int
read_chunked(struct net_stream *s, struct buf *in, struct buf *body,
             int64_t deadline, int wake_fd)
{
    struct http_chunked d;
    size_t used;
    int rc;

    http_chunked_init(&d);
    for (;;) {
        rc = http_chunked_feed(&d, buf_ptr(in), buf_len(in), body, &used);
        buf_consume(in, used);
        if (rc == 1)
            return 0;           /* what is left in 'in' is the next request */
        if (rc != 0)
            return rc;
        /* The decoder took all of 'in', so fill() has room. */
        rc = fill(s, in, deadline, wake_fd);
        if (rc != 0)
            return rc;
    }
}

int
http_read_body(struct net_stream *s, struct buf *in,
               struct http_request *r, struct buf *body, int64_t deadline,
               int wake_fd)
{
    int rc;

    buf_reset(body);
    r->error_status = 0;
    r->error_msg = NULL;
    switch (r->body_kind) {
    case HTTP_BODY_LENGTH:
        rc = read_length(s, in, r->content_length, body, deadline,
                         wake_fd);
        break;
    case HTTP_BODY_CHUNKED:
        rc = read_chunked(s, in, body, deadline, wake_fd);
        break;
    default:
        rc = 0;
        break;
    }
    if (rc == GW_ETOOBIG)
        fail(r, 413, "request body too large");
    else if (rc == GW_EPARSE)
        fail(r, 400, "malformed chunked body");
    else if (rc == GW_ETIMEDOUT)
        fail(r, 408, "request body timed out");
    return rc;
}
