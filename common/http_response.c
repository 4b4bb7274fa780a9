/* SPDX-License-Identifier: MIT */
/*
 * http_response.c - an upstream's response head, checked line by line
 * (API and the rules it enforces in http_response.h).
 *
 * Design: libcurl hands over whole lines, so each one is read once, in
 * place, and only what the head said is kept (its status, its framing,
 * Retry-After); a Content-Type is handed back as a view into the line.
 */
#include "http_response.h"

#include <stdint.h>
#include <string.h>

#include "http.h"

/* Parse "HTTP/1.1 200 OK" (or "HTTP/2 200"): the status, or -1. */
static int
parse_status_line(const char *p, size_t n)
{
    const char *sp = memchr(p, ' ', n);
    size_t i;
    uint64_t status;

    if (n < 5 || memcmp(p, "HTTP/", 5) != 0 || sp == NULL)
        return -1;
    i = (size_t)(sp - p) + 1;
    /* status-code = 3DIGIT (RFC 9112 4), then a space or the end */
    if (n - i < 3 || (n - i > 3 && p[i + 3] != ' ')
        || gw_parse_uint(p + i, 3, 999, &status) != 0)
        return -1;
    /* RFC 9110 15: 1xx to 5xx; "999" is not an answer we can relay. */
    return status >= 100 && status <= 599 ? (int)status : -1;
}

/*
 * Retry-After as delay-seconds (RFC 9110 10.2.3), in ms, at most 'max_ms';
 * 0 when absent, malformed or an HTTP-date (vLLM and its proxies send
 * seconds).
 */
static int64_t
parse_retry_after(const char *p, size_t n, int64_t max_ms)
{
    uint64_t v;
    int64_t ms;

    /* Nine digits at most, leading zeros counted: a longer value is
     * refused, not capped, and seconds * 1000 cannot overflow. */
    if (n > 9 || gw_parse_uint(p, n, UINT64_MAX, &v) != 0)
        return 0;
    ms = (int64_t)v * 1000;
    return ms < max_ms ? ms : max_ms;
}

/* A field value: no control character but HTAB (RFC 9110 5.5). */
static int
field_value_ok(const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)p[i] < 0x20 && p[i] != '\t')
            || (unsigned char)p[i] == 0x7f)
            return 0;
    return 1;
}

/*
 * The largest response Content-Length taken.  Any int64_t would do (no
 * body nears either); this one is where the reader has always stopped,
 * and test/fuzz/fuzz_upstream.c's model of it stops there too.
 */
#define RESPONSE_LENGTH_MAX (INT64_MAX - 8)

/* Content-Length value: 1*DIGIT (RFC 9110 8.6), else -1. */
static int64_t
parse_length(const char *p, size_t n)
{
    uint64_t v;

    if (gw_parse_uint(p, n, RESPONSE_LENGTH_MAX, &v) != 0)
        return -1;
    return (int64_t)v;
}

void
http_response_head_init(struct http_response_head *h, size_t max_head,
                        int64_t retry_after_max_ms)
{
    memset(h, 0, sizeof(*h));
    h->max_head = max_head;
    h->retry_after_max_ms = retry_after_max_ms;
    h->want_status_line = 1;
    h->content_length = -1;
}

/* Fail the head: 'why'. */
static int
response_fail(struct http_response_head *h, int rc, enum http_head_error why)
{
    h->error = why;
    return rc;
}

int
http_response_head_line(struct http_response_head *h, const char *p,
                        size_t n)
{
    const char *colon, *v, *end;
    size_t len = n, name_len;
    int64_t cl;

    h->ctype = NULL;
    h->ctype_len = 0;
    h->head_bytes += n;
    if (h->head_bytes > h->max_head)
        return response_fail(h, GW_ETOOBIG, HTTP_HEAD_TOO_LARGE);
    while (len > 0 && (p[len - 1] == '\n' || p[len - 1] == '\r'))
        len--;

    if (h->want_status_line) {
        h->status = parse_status_line(p, len);
        if (h->status < 0)
            return response_fail(h, GW_EPARSE, HTTP_HEAD_BAD_STATUS);
        h->want_status_line = 0;
        h->head_bytes = n;
        h->has_te = 0;
        h->has_cl = 0;
        h->content_length = -1;
        h->retry_after_ms = 0;
        h->no_store = 0;
        return HTTP_RESPONSE_STATUS;
    }

    if (len == 0) {
        /* RFC 9110 15.2: any number of 1xx heads may precede the final
         * one; each is just skipped. */
        if (h->status < 200) {
            h->want_status_line = 1;
            return HTTP_RESPONSE_FIELD;
        }
        /* RFC 9112 6.3: both is a smuggling attempt or a broken server;
         * either way this body's end cannot be trusted. */
        if (h->has_te && h->has_cl)
            return response_fail(h, GW_EPARSE,
                                 HTTP_HEAD_LENGTH_AND_CHUNKED);
        return HTTP_RESPONSE_DONE;
    }

    colon = memchr(p, ':', len);
    if (colon == NULL)
        return HTTP_RESPONSE_FIELD;     /* obs-fold or junk: libcurl's call */
    name_len = (size_t)(colon - p);
    v = colon + 1;
    end = p + len;
    while (v < end && (*v == ' ' || *v == '\t'))
        v++;
    while (end > v && (end[-1] == ' ' || end[-1] == '\t'))
        end--;
    if (gw_strieq(p, name_len, "content-type")) {
        if (!field_value_ok(v, (size_t)(end - v))) {
            /* We relay this one: a CR or NUL in it would be ours. */
            return response_fail(h, GW_EPARSE, HTTP_HEAD_BAD_FIELD);
        }
        h->ctype = v;
        h->ctype_len = (size_t)(end - v);
        return HTTP_RESPONSE_CTYPE;
    } else if (gw_strieq(p, name_len, "content-length")) {
        /* RFC 9112 6.3: one plain decimal, the same in every field.  What
         * libcurl would make of "12abc" (12) leaves the rest of the body
         * on the connection, to be read as the next answer. */
        cl = parse_length(v, (size_t)(end - v));
        if (cl < 0 || (h->has_cl && cl != h->content_length))
            return response_fail(h, GW_EPARSE,
                                 cl < 0 ? HTTP_HEAD_BAD_LENGTH
                                        : HTTP_HEAD_CONFLICTING_LENGTH);
        h->has_cl = 1;
        h->content_length = cl;
    } else if (gw_strieq(p, name_len, "transfer-encoding")) {
        /* Only "chunked", once: any other coding leaves the body's end
         * to the connection's close (RFC 9112 6.3), or to a decoder
         * nobody runs. */
        if (h->has_te || !gw_strieq(v, (size_t)(end - v), "chunked"))
            return response_fail(h, GW_EPARSE,
                                 HTTP_HEAD_BAD_TRANSFER_CODING);
        h->has_te = 1;
    } else if (gw_strieq(p, name_len, "content-encoding")) {
        /* We asked for identity; a gzip body relayed as JSON is garbage
         * to the client, and unreadable for the bill. */
        if (end > v && !gw_strieq(v, (size_t)(end - v), "identity"))
            return response_fail(h, GW_EPARSE,
                                 HTTP_HEAD_BAD_CONTENT_CODING);
    } else if (gw_strieq(p, name_len, "cache-control")) {
        if (http_has_directive(v, (size_t)(end - v), "no-store")
            || http_has_directive(v, (size_t)(end - v), "private"))
            h->no_store = 1;
    } else if (gw_strieq(p, name_len, "retry-after")) {
        h->retry_after_ms = parse_retry_after(v, (size_t)(end - v),
                                              h->retry_after_max_ms);
    }
    return HTTP_RESPONSE_FIELD;
}
