/* SPDX-License-Identifier: MIT */
/*
 * http.c - strict HTTP/1.1 request heads (RFC 9112), the chunked body
 * decoder and the blocking request readers built on net.c.
 *
 * Design: http_parse_request() rescans the head from its first byte on
 * every call, like picohttpparser.  It keeps no state between calls, so
 * the caller can move its buffer freely and a prefix of any input yields
 * either GW_EAGAIN or the same answer as the whole input.  Each byte is
 * looked at once per call, classified through one 256-entry table, and
 * every rule that a field line can break (duplicate Content-Length, a
 * second Host, ...) is checked as soon as that line is complete, so bad
 * input is refused as early as its bytes allow.  The price of rescanning
 * is quadratic work for a head that trickles in byte by byte; the head is
 * bounded by 'max_head' and by the header timeout, and an incremental
 * state machine would be much harder to read.  Bytes are also scanned one
 * at a time, not eight or sixteen at once as picohttpparser's SSE4.2 path
 * does: about 0.4 us for a typical 300-byte head, noise next to an
 * upstream round trip.
 *
 * The chunked decoder is the opposite: a byte-at-a-time state machine
 * (except for chunk data, which is copied in bulk), because a body is
 * unbounded in length and must not be rescanned.
 */
#include "http.h"

#include <limits.h>
#include <poll.h>
#include <string.h>

#include "net.h"

/*
 * Character classes: RFC 9110 5.6.2 (token), 5.5 (field values), 5.6.4
 * (quoted-string); RFC 3986 3.3 and 3.4 (origin-form path and query) and
 * 3.2.2 (host).
 */
#define CC_TCHAR 0x01       /* tchar */
#define CC_TARGET 0x02      /* pchar or "/", but not "%" or "?" */
#define CC_FIELD 0x04       /* field-vchar, SP or HTAB */
#define CC_HOST 0x08        /* unreserved, sub-delims, ":", "[", "]", "%" */
#define CC_HEX 0x10         /* HEXDIG */
#define CC_QDTEXT 0x20      /* qdtext */

/*
 * Generated from the ABNF rather than written by hand; check_http.c feeds
 * every byte value through each place a class is used and compares the
 * outcome with the grammar.
 */
static const unsigned char char_class[256] = {
    /* 00: control characters */
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x24, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    /* 10: control characters */
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    /* 20: SP ! " # $ % & ' ( ) * + , - . / */
    0x24, 0x2f, 0x04, 0x25, 0x2f, 0x2d, 0x2f, 0x2f,
    0x2e, 0x2e, 0x2f, 0x2f, 0x2e, 0x2f, 0x2f, 0x26,
    /* 30: 0 1 2 3 4 5 6 7 8 9 : ; < = > ? */
    0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f,
    0x3f, 0x3f, 0x2e, 0x2e, 0x24, 0x2e, 0x24, 0x24,
    /* 40: @ A B C D E F G H I J K L M N O */
    0x26, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x2f,
    0x2f, 0x2f, 0x2f, 0x2f, 0x2f, 0x2f, 0x2f, 0x2f,
    /* 50: P Q R S T U V W X Y Z [ \ ] ^ _ */
    0x2f, 0x2f, 0x2f, 0x2f, 0x2f, 0x2f, 0x2f, 0x2f,
    0x2f, 0x2f, 0x2f, 0x2c, 0x04, 0x2c, 0x25, 0x2f,
    /* 60: ` a b c d e f g h i j k l m n o */
    0x25, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x2f,
    0x2f, 0x2f, 0x2f, 0x2f, 0x2f, 0x2f, 0x2f, 0x2f,
    /* 70: p q r s t u v w x y z { | } ~ DEL */
    0x2f, 0x2f, 0x2f, 0x2f, 0x2f, 0x2f, 0x2f, 0x2f,
    0x2f, 0x2f, 0x2f, 0x24, 0x25, 0x24, 0x2f, 0x00,
    /* 80-ff: obs-text */
    0x24, 0x24, 0x24, 0x24, 0x24, 0x24, 0x24, 0x24,
    0x24, 0x24, 0x24, 0x24, 0x24, 0x24, 0x24, 0x24,
    0x24, 0x24, 0x24, 0x24, 0x24, 0x24, 0x24, 0x24,
    0x24, 0x24, 0x24, 0x24, 0x24, 0x24, 0x24, 0x24,
    0x24, 0x24, 0x24, 0x24, 0x24, 0x24, 0x24, 0x24,
    0x24, 0x24, 0x24, 0x24, 0x24, 0x24, 0x24, 0x24,
    0x24, 0x24, 0x24, 0x24, 0x24, 0x24, 0x24, 0x24,
    0x24, 0x24, 0x24, 0x24, 0x24, 0x24, 0x24, 0x24,
    0x24, 0x24, 0x24, 0x24, 0x24, 0x24, 0x24, 0x24,
    0x24, 0x24, 0x24, 0x24, 0x24, 0x24, 0x24, 0x24,
    0x24, 0x24, 0x24, 0x24, 0x24, 0x24, 0x24, 0x24,
    0x24, 0x24, 0x24, 0x24, 0x24, 0x24, 0x24, 0x24,
    0x24, 0x24, 0x24, 0x24, 0x24, 0x24, 0x24, 0x24,
    0x24, 0x24, 0x24, 0x24, 0x24, 0x24, 0x24, 0x24,
    0x24, 0x24, 0x24, 0x24, 0x24, 0x24, 0x24, 0x24,
    0x24, 0x24, 0x24, 0x24, 0x24, 0x24, 0x24, 0x24,
};

#define IS(c, cls) ((char_class[(unsigned char)(c)] & (cls)) != 0)

/* Line and section bounds of the chunked framing (not the data). */
#define CHUNK_LINE_MAX 4096         /* chunk-size, extensions and CRLF */
#define TRAILER_MAX 8192            /* whole trailer section */

/* Bytes the readers ask the kernel for at a time. */
#define READ_CHUNK 16384

static const char msg_bare_cr[] = "bare CR not followed by LF";
static const char msg_bare_lf[] = "bare LF without CR";

/* What the field lines said about framing, collected for the final checks. */
struct fields {
    int host_count;
    int cl_seen;
    int te_seen;
    int te_last_chunked;        /* the last coding seen so far is chunked */
    int te_other;               /* some coding other than chunked */
    int conn_close;
    int conn_keep_alive;
    int expect_continue;
};

/*
 * Record an error in 'r'.  414 and 431 are size limits (GW_ETOOBIG), the
 * rest malformed or unsupported input (GW_EPARSE).  'msg' must be static.
 */
static int
fail(struct http_request *r, int status, const char *msg)
{
    r->error_status = status;
    r->error_msg = msg;
    return status == 414 || status == 431 ? GW_ETOOBIG : GW_EPARSE;
}

static int
is_ows(char c)
{
    return c == ' ' || c == '\t';
}

/* Message for a byte that cannot end a line where a line should end. */
static const char *
line_end_msg(char c, const char *otherwise)
{
    return c == '\n' ? msg_bare_lf : otherwise;
}

/*
 * request-line = method SP request-target SP HTTP-version CRLF
 * (RFC 9112 3), with the target in origin-form (3.2.1):
 * absolute-path [ "?" query ], percent-encoding checked.
 * OUT *stop: where the scan stopped - the CR ending the line, the byte at
 * fault, or 'end'.  The caller measures the line from there, which gives
 * the same answer as a length check at every byte.
 * Returns 0 (CRLF seen), GW_EAGAIN or an error.
 */
static int
parse_request_line(const char *line, const char *end,
                   struct http_request *r, const char **stop)
{
    static const char proto[] = "HTTP/";
    const char *cur = line, *query = NULL, *version;
    int rc, i;

    while (cur < end && IS(*cur, CC_TCHAR))
        cur++;
    if (cur == end)
        goto more;
    if (*cur != ' ' || cur == line) {
        rc = fail(r, 400, line_end_msg(*cur, "method is not a token"));
        goto out;
    }
    r->method = line;
    r->method_len = (size_t)(cur - line);
    if (r->method_len == 7 && memcmp(line, "CONNECT", 7) == 0) {
        /* Its authority-form target is for forward proxies (RFC 9112 3.2.3). */
        rc = fail(r, 400, "CONNECT is not supported");
        goto out;
    }

    r->target = ++cur;
    if (cur == end)
        goto more;
    if (*cur != '/') {
        /* absolute-form, authority-form, asterisk-form or garbage */
        rc = fail(r, 400, "request target is not in origin-form");
        goto out;
    }
    for (;;) {
        while (cur < end && IS(*cur, CC_TARGET))
            cur++;
        if (cur == end)
            goto more;
        if (*cur == ' ')
            break;
        if (*cur == '?') {
            if (query == NULL)
                query = cur;
            cur++;
        } else if (*cur == '%') {
            /* pct-encoded = "%" HEXDIG HEXDIG; look no further than 'end' */
            for (i = 1; i <= 2; i++) {
                if (cur + i == end) {
                    cur = end;      /* all of it is request-line content */
                    goto more;
                }
                if (!IS(cur[i], CC_HEX)) {
                    cur += i;
                    rc = fail(r, 400, "bad percent-encoding in request target");
                    goto out;
                }
            }
            cur += 3;
        } else {
            rc = fail(r, 400, line_end_msg(*cur,
                      "invalid character in request target"));
            goto out;
        }
    }
    r->target_len = (size_t)(cur - r->target);
    r->path = r->target;
    r->path_len = (size_t)((query != NULL ? query : cur) - r->target);

    /* HTTP-version = "HTTP/" DIGIT "." DIGIT, case-sensitive (2.3) */
    version = ++cur;
    for (i = 0; i < 8; i++) {
        int ok;

        if (cur == end)
            goto more;
        if (i < 5)
            ok = *cur == proto[i];
        else if (i == 6)
            ok = *cur == '.';
        else
            ok = *cur >= '0' && *cur <= '9';
        if (!ok) {
            rc = fail(r, 400, line_end_msg(*cur, "malformed HTTP version"));
            goto out;
        }
        cur++;
    }
    if (cur == end)
        goto more;
    if (*cur != '\r') {
        rc = fail(r, 400, line_end_msg(*cur, "malformed HTTP version"));
        goto out;
    }
    if (version[5] != '1' || (version[7] != '0' && version[7] != '1')) {
        rc = fail(r, 505, "HTTP version not supported");
        goto out;
    }
    r->minor = version[7] - '0';
    if (cur + 1 == end)
        goto more;
    if (cur[1] != '\n') {
        rc = fail(r, 400, msg_bare_cr);
        goto out;
    }
    rc = 0;
    goto out;

more:
    rc = GW_EAGAIN;
out:
    *stop = cur;
    return rc;
}

/*
 * Transfer-Encoding = #transfer-coding (RFC 9112 6.1).  Several fields
 * form one list, so the state lives in 'f'.  Parameters are skipped up to
 * the next comma without parsing: a coding that has any is not a bare
 * "chunked", and every such request is refused anyway (400 or 501), so a
 * comma inside a quoted parameter cannot change the outcome.
 */
static int
on_transfer_encoding(struct fields *f, const struct http_header *h,
                     struct http_request *r)
{
    const char *p = h->value, *end = h->value + h->value_len, *tok;
    size_t tok_len;
    int params, codings = 0;

    if (r->minor == 0) {
        /* RFC 9112 6.1: the framing of such a message is faulty. */
        return fail(r, 400, "Transfer-Encoding in an HTTP/1.0 request");
    }
    if (f->cl_seen)
        return fail(r, 400, "both Content-Length and Transfer-Encoding");
    f->te_seen = 1;
    while (p < end) {
        if (*p == ',' || is_ows(*p)) {
            p++;                /* empty list elements are allowed (5.6.1) */
            continue;
        }
        tok = p;
        while (p < end && IS(*p, CC_TCHAR))
            p++;
        tok_len = (size_t)(p - tok);
        while (p < end && is_ows(*p))
            p++;
        params = p < end && *p == ';';
        if (tok_len == 0 || (p < end && *p != ',' && !params))
            return fail(r, 400, "malformed Transfer-Encoding");
        while (p < end && *p != ',')
            p++;
        if (f->te_last_chunked) {
            /* chunked is applied once and last (RFC 9112 6.1, 6.3) */
            return fail(r, 400, "chunked is not the final transfer coding");
        }
        if (gw_strieq(tok, tok_len, "chunked")) {
            if (params)
                return fail(r, 400, "malformed Transfer-Encoding");
            f->te_last_chunked = 1;
        } else {
            f->te_other = 1;
        }
        codings++;
    }
    if (codings == 0)
        return fail(r, 400, "empty Transfer-Encoding");
    return 0;
}

/* Content-Length = 1*DIGIT (RFC 9110 8.6); no lists, no repeats. */
static int
on_content_length(struct fields *f, const struct http_header *h,
                  struct http_request *r)
{
    uint64_t v;
    int rc;

    if (f->cl_seen) {
        /* Even identical repeats: refusing is simpler than comparing. */
        return fail(r, 400, "several Content-Length fields");
    }
    if (f->te_seen)
        return fail(r, 400, "both Content-Length and Transfer-Encoding");
    rc = gw_parse_uint(h->value, h->value_len, UINT64_MAX, &v);
    if (rc == GW_ETOOBIG)
        return fail(r, 400, "Content-Length out of range");
    if (rc != 0)
        return fail(r, 400, "invalid Content-Length");
    f->cl_seen = 1;
    r->content_length = v;
    return 0;
}

/*
 * Host = uri-host [ ":" port ] (RFC 9110 7.2).  Only the alphabet is
 * checked; what the host names is the router's business.
 */
static int
on_host(struct fields *f, const struct http_header *h,
        struct http_request *r)
{
    size_t i;

    if (++f->host_count > 1)
        return fail(r, 400, "several Host fields");     /* RFC 9112 3.2 */
    for (i = 0; i < h->value_len; i++)
        if (!IS(h->value[i], CC_HOST))
            return fail(r, 400, "invalid Host");
    return 0;
}

/*
 * The rules one complete field line can break on its own.  Dispatching on
 * the name length first keeps the common fields to one compare each.
 */
static int
check_field(struct fields *f, const struct http_header *h,
            struct http_request *r)
{
    switch (h->name_len) {
    case 4:
        if (gw_strieq(h->name, 4, "host"))
            return on_host(f, h, r);
        break;
    case 6:
        if (gw_strieq(h->name, 6, "expect")
            && http_has_token(h->value, h->value_len, "100-continue"))
            f->expect_continue = 1;
        break;
    case 10:
        if (gw_strieq(h->name, 10, "connection")) {
            if (http_has_token(h->value, h->value_len, "close"))
                f->conn_close = 1;
            if (http_has_token(h->value, h->value_len, "keep-alive"))
                f->conn_keep_alive = 1;
        }
        break;
    case 14:
        if (gw_strieq(h->name, 14, "content-length"))
            return on_content_length(f, h, r);
        break;
    case 17:
        if (gw_strieq(h->name, 17, "transfer-encoding"))
            return on_transfer_encoding(f, h, r);
        break;
    default:
        break;
    }
    return 0;
}

/*
 * field-line = field-name ":" OWS field-value OWS CRLF (RFC 9112 5), or
 * the empty line ending the head.  OUT *curp: just past the line.
 * Returns 0 (a field was added to 'r'), 1 (end of the head), GW_EAGAIN or
 * an error.
 */
static int
parse_field_line(const char **curp, const char *end, struct fields *f,
                 struct http_request *r)
{
    const char *cur = *curp, *name, *colon, *value, *vend;
    struct http_header *h;

    if (cur == end)
        return GW_EAGAIN;
    if (*cur == '\r') {
        if (cur + 1 == end)
            return GW_EAGAIN;
        if (cur[1] != '\n')
            return fail(r, 400, msg_bare_cr);
        *curp = cur + 2;
        return 1;
    }
    if (is_ows(*cur)) {
        /* obs-fold (5.2), or whitespace after the request line (2.2) */
        return fail(r, 400, "obs-fold or whitespace at start of field line");
    }
    if (r->num_headers == HTTP_MAX_HEADERS)
        return fail(r, 431, "too many header fields");

    name = cur;
    while (cur < end && IS(*cur, CC_TCHAR))
        cur++;
    if (cur == end)
        return GW_EAGAIN;
    if (*cur != ':') {
        if (is_ows(*cur))
            return fail(r, 400, "whitespace before colon in header field");
        if (*cur == '\r')
            return fail(r, 400, "header field without colon");
        return fail(r, 400, line_end_msg(*cur,
                    "invalid character in header field name"));
    }
    if (cur == name)
        return fail(r, 400, "empty header field name");
    colon = cur++;
    while (cur < end && is_ows(*cur))
        cur++;
    value = cur;
    while (cur < end && IS(*cur, CC_FIELD))
        cur++;
    if (cur == end)
        return GW_EAGAIN;
    if (*cur != '\r') {
        return fail(r, 400, line_end_msg(*cur,
                    "invalid character in header field value"));
    }
    vend = cur;
    while (vend > value && is_ows(vend[-1]))
        vend--;
    if (cur + 1 == end)
        return GW_EAGAIN;
    if (cur[1] != '\n')
        return fail(r, 400, msg_bare_cr);

    h = &r->headers[r->num_headers++];
    h->name = name;
    h->name_len = (size_t)(colon - name);
    h->value = value;
    h->value_len = (size_t)(vend - value);
    *curp = cur + 2;
    return check_field(f, h, r);
}

/* The framing and connection rules that need the whole head. */
static int
check_head(const struct fields *f, struct http_request *r)
{
    if (r->minor == 1 && f->host_count == 0)
        return fail(r, 400, "missing Host");            /* RFC 9112 3.2 */
    if (f->te_seen) {
        if (!f->te_last_chunked)                        /* RFC 9112 6.3 */
            return fail(r, 400, "chunked is not the final transfer coding");
        if (f->te_other)                                /* RFC 9112 6.1 */
            return fail(r, 501, "unsupported transfer coding");
        r->body_kind = HTTP_BODY_CHUNKED;
    } else if (f->cl_seen) {
        r->body_kind = HTTP_BODY_LENGTH;
    }
    /* RFC 9112 9.3; 1.0 persistence is the keep-alive extension (C.2.2) */
    if (r->minor == 1)
        r->keep_alive = !f->conn_close;
    else
        r->keep_alive = f->conn_keep_alive && !f->conn_close;
    /* RFC 9110 10.1.1: a 1.0 client cannot expect a 100 response */
    r->expect_continue = r->minor == 1 && f->expect_continue;
    return 0;
}

int
http_parse_request(const char *p, size_t len, size_t max_head,
                   struct http_request *r)
{
    struct fields f;
    const char *cur = p, *end, *line, *stop;
    int truncated, rc;

    /* Everything but the header array, which num_headers guards. */
    r->method = r->target = r->path = NULL;
    r->method_len = r->target_len = r->path_len = 0;
    r->minor = 0;
    r->num_headers = 0;
    r->body_kind = HTTP_BODY_NONE;
    r->content_length = 0;
    r->keep_alive = 0;
    r->expect_continue = 0;
    r->error_status = 0;
    r->error_msg = NULL;
    memset(&f, 0, sizeof(f));

    if (len == 0)
        return GW_EAGAIN;
    if (max_head > INT_MAX)
        max_head = INT_MAX;     /* the head length is returned as an int */
    /*
     * Look no further than max_head bytes.  Running out of bytes there
     * means the head is longer than max_head whatever comes next.
     */
    truncated = len >= max_head;
    end = p + (truncated ? max_head : len);

    /* RFC 9112 2.2: ignore empty lines before the request line. */
    while (cur < end && *cur == '\r') {
        if (cur + 1 == end)
            goto more;
        if (cur[1] != '\n')
            return fail(r, 400, msg_bare_cr);
        cur += 2;
    }
    line = cur;
    rc = parse_request_line(line, end, r, &stop);
    if (stop - line > HTTP_MAX_REQUEST_LINE)
        return fail(r, 414, "request line too long");
    if (rc == GW_EAGAIN)
        goto more;
    if (rc != 0)
        return rc;
    cur = stop + 2;

    for (;;) {
        rc = parse_field_line(&cur, end, &f, r);
        if (rc == 1)
            break;
        if (rc == GW_EAGAIN)
            goto more;
        if (rc != 0)
            return rc;
    }
    rc = check_head(&f, r);
    if (rc != 0)
        return rc;
    return (int)(cur - p);

more:
    if (truncated)
        return fail(r, 431, "request head too large");
    return GW_EAGAIN;
}

const struct http_header *
http_find_header(const struct http_request *r, const char *name)
{
    size_t i;

    for (i = 0; i < r->num_headers; i++)
        if (gw_strieq(r->headers[i].name, r->headers[i].name_len, name))
            return &r->headers[i];
    return NULL;
}

/*
 * Is 'token' an element of the comma-separated list value[0..len)?  With
 * 'args', an element "token=argument" counts too.
 */
static int
list_has(const char *value, size_t len, const char *token, int args)
{
    const char *p = value, *end = value + len, *elem, *elem_end, *eq;

    while (p < end) {
        elem = p;
        while (p < end && *p != ',')
            p++;
        elem_end = p;
        if (args && (eq = memchr(elem, '=', (size_t)(elem_end - elem)))
                    != NULL)
            elem_end = eq;
        while (elem < elem_end && is_ows(*elem))
            elem++;
        while (elem_end > elem && is_ows(elem_end[-1]))
            elem_end--;
        if (gw_strieq(elem, (size_t)(elem_end - elem), token))
            return 1;
        if (p < end)
            p++;                /* the comma */
    }
    return 0;
}

int
http_has_token(const char *value, size_t len, const char *token)
{
    return list_has(value, len, token, 0);
}

int
http_lists_token(const struct http_request *r, const char *name,
                 const char *token)
{
    for (size_t i = 0; i < r->num_headers; i++) {
        const struct http_header *h = &r->headers[i];

        if (gw_strieq(h->name, h->name_len, name)
            && list_has(h->value, h->value_len, token, 1))
            return 1;
    }
    return 0;
}

/* ---- Response heads ---- */

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
    } else if (gw_strieq(p, name_len, "retry-after")) {
        h->retry_after_ms = parse_retry_after(v, (size_t)(end - v),
                                              h->retry_after_max_ms);
    }
    return HTTP_RESPONSE_FIELD;
}

/*
 * Chunked decoder states (RFC 9112 7.1):
 *
 *   chunk      = chunk-size [ chunk-ext ] CRLF chunk-data CRLF
 *   chunk-ext  = *( BWS ";" BWS chunk-ext-name
 *                   [ BWS "=" BWS chunk-ext-val ] )
 *   last-chunk = 1*("0") [ chunk-ext ] CRLF
 *   then trailer-section CRLF
 *
 * BWS is allowed only before ";" and "=" and after them, never before the
 * CRLF: "5 \r\n" is refused, as the grammar says.
 */
enum {
    CH_SIZE_START,          /* first HEXDIG of chunk-size */
    CH_SIZE,                /* more HEXDIG, or what follows the size */
    CH_EXT,                 /* after size or quoted value: ";", BWS, CR */
    CH_EXT_BWS,             /* BWS that must lead to ";" */
    CH_EXT_NAME_START,      /* BWS, then the first tchar of a name */
    CH_EXT_NAME,
    CH_EXT_NAME_BWS,        /* BWS that must lead to "=" or ";" */
    CH_EXT_VALUE_START,     /* BWS, then a token or a quoted-string */
    CH_EXT_TOKEN,
    CH_EXT_QUOTED,
    CH_EXT_QUOTED_PAIR,     /* the byte after a backslash */
    CH_SIZE_LF,
    CH_DATA,
    CH_DATA_CR,
    CH_DATA_LF,
    CH_TRAILER,             /* start of a trailer line, or the final CRLF */
    CH_TRAILER_NAME,
    CH_TRAILER_VALUE,
    CH_TRAILER_LF,
    CH_END_LF,
    CH_DONE,
};

void
http_chunked_init(struct http_chunked *d)
{
    d->state = CH_SIZE_START;
    d->left = 0;
    d->line_len = 0;
}

static unsigned
hex_value(unsigned char c)
{
    return c <= '9' ? (unsigned)(c - '0') : (unsigned)((c | 0x20) - 'a' + 10);
}

/*
 * Room left in 'out' before its limit, counting the reset buf_reserve()
 * does when every byte has been consumed.
 */
static size_t
buf_room(const struct buf *out)
{
    if (out->off == out->len)
        return out->limit;
    return out->limit - out->len;
}

/*
 * One framing byte (anything but chunk data).  Returns 0 to go on, 1 when
 * the message is complete, GW_EPARSE or GW_ETOOBIG.
 */
static int
chunked_step(struct http_chunked *d, unsigned char c, const struct buf *out)
{
    if (d->state < CH_DATA) {
        if (++d->line_len > CHUNK_LINE_MAX)
            return GW_EPARSE;       /* RFC 9112 7.1.1 lets us bound this */
    } else if (d->state >= CH_TRAILER) {
        /* line_len counts the whole trailer section there */
        if (++d->line_len > TRAILER_MAX)
            return GW_ETOOBIG;
    }

    switch (d->state) {
    case CH_SIZE_START:
        if (!IS(c, CC_HEX))
            return GW_EPARSE;
        d->left = hex_value(c);
        d->state = CH_SIZE;
        return 0;
    case CH_SIZE:
        if (IS(c, CC_HEX)) {
            if (d->left > UINT64_MAX >> 4)
                return GW_EPARSE;           /* chunk-size overflow */
            d->left = d->left << 4 | hex_value(c);
            return 0;
        }
        /* c ends the size and starts what follows it */
        /* FALLTHROUGH */
    case CH_EXT:
        if (c == ';')
            d->state = CH_EXT_NAME_START;
        else if (c == ' ' || c == '\t')
            d->state = CH_EXT_BWS;
        else if (c == '\r')
            d->state = CH_SIZE_LF;
        else
            return GW_EPARSE;
        return 0;
    case CH_EXT_BWS:
        if (c == ';')
            d->state = CH_EXT_NAME_START;
        else if (c != ' ' && c != '\t')
            return GW_EPARSE;
        return 0;
    case CH_EXT_NAME_START:
        if (IS(c, CC_TCHAR))
            d->state = CH_EXT_NAME;
        else if (c != ' ' && c != '\t')
            return GW_EPARSE;
        return 0;
    case CH_EXT_NAME:
        if (IS(c, CC_TCHAR))
            return 0;
        /* c ends the name */
        /* FALLTHROUGH */
    case CH_EXT_NAME_BWS:
        if (c == ';')
            d->state = CH_EXT_NAME_START;
        else if (c == '=')
            d->state = CH_EXT_VALUE_START;
        else if (c == '\r' && d->state == CH_EXT_NAME)
            d->state = CH_SIZE_LF;
        else if (c == ' ' || c == '\t')
            d->state = CH_EXT_NAME_BWS;
        else
            return GW_EPARSE;
        return 0;
    case CH_EXT_VALUE_START:
        if (c == '"')
            d->state = CH_EXT_QUOTED;
        else if (IS(c, CC_TCHAR))
            d->state = CH_EXT_TOKEN;
        else if (c != ' ' && c != '\t')
            return GW_EPARSE;
        return 0;
    case CH_EXT_TOKEN:
        if (IS(c, CC_TCHAR))
            return 0;
        if (c == ';')
            d->state = CH_EXT_NAME_START;
        else if (c == ' ' || c == '\t')
            d->state = CH_EXT_BWS;
        else if (c == '\r')
            d->state = CH_SIZE_LF;
        else
            return GW_EPARSE;
        return 0;
    case CH_EXT_QUOTED:
        if (c == '"')
            d->state = CH_EXT;
        else if (c == '\\')
            d->state = CH_EXT_QUOTED_PAIR;
        else if (!IS(c, CC_QDTEXT))
            return GW_EPARSE;
        return 0;
    case CH_EXT_QUOTED_PAIR:
        /* quoted-pair = "\" ( HTAB / SP / VCHAR / obs-text ) */
        if (!IS(c, CC_FIELD))
            return GW_EPARSE;
        d->state = CH_EXT_QUOTED;
        return 0;
    case CH_SIZE_LF:
        if (c != '\n')
            return GW_EPARSE;
        d->line_len = 0;
        if (d->left == 0) {
            d->state = CH_TRAILER;
            return 0;
        }
        /* Refuse an oversized chunk before its data arrives. */
        if (d->left > buf_room(out))
            return GW_ETOOBIG;
        d->state = CH_DATA;
        return 0;
    case CH_DATA_CR:
        if (c != '\r')
            return GW_EPARSE;
        d->state = CH_DATA_LF;
        return 0;
    case CH_DATA_LF:
        if (c != '\n')
            return GW_EPARSE;
        d->state = CH_SIZE_START;
        return 0;
    case CH_TRAILER:
        /* Trailer fields follow the header field rules (RFC 9112 7.1.2). */
        if (c == '\r')
            d->state = CH_END_LF;
        else if (IS(c, CC_TCHAR))
            d->state = CH_TRAILER_NAME;
        else
            return GW_EPARSE;       /* obs-fold, empty name, bare LF, ... */
        return 0;
    case CH_TRAILER_NAME:
        if (c == ':')
            d->state = CH_TRAILER_VALUE;
        else if (!IS(c, CC_TCHAR))
            return GW_EPARSE;       /* including whitespace before ':' */
        return 0;
    case CH_TRAILER_VALUE:
        if (c == '\r')
            d->state = CH_TRAILER_LF;
        else if (!IS(c, CC_FIELD))
            return GW_EPARSE;
        return 0;
    case CH_TRAILER_LF:
        if (c != '\n')
            return GW_EPARSE;
        d->state = CH_TRAILER;
        return 0;
    case CH_END_LF:
        if (c != '\n')
            return GW_EPARSE;
        d->state = CH_DONE;
        return 1;
    default:
        return GW_EPARSE;           /* CH_DATA and CH_DONE never get here */
    }
}

int
http_chunked_feed(struct http_chunked *d, const char *p, size_t len,
                  struct buf *out, size_t *consumed)
{
    const char *cur = p, *end = p + len;
    size_t n;
    int rc = 0;

    if (d->state == CH_DONE) {
        rc = 1;
        goto out;
    }
    while (cur < end) {
        if (d->state == CH_DATA) {
            n = (size_t)(end - cur);
            if (d->left < n)
                n = (size_t)d->left;
            rc = buf_append(out, cur, n);
            if (rc != 0)
                goto out;
            cur += n;
            d->left -= n;
            if (d->left == 0)
                d->state = CH_DATA_CR;
            continue;
        }
        rc = chunked_step(d, (unsigned char)*cur, out);
        if (rc < 0)
            goto out;
        cur++;
        if (rc == 1)
            goto out;           /* bytes after the message are not ours */
    }

out:
    *consumed = (size_t)(cur - p);
    return rc;
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

int
http_is_tchar(unsigned char c)
{
    return IS(c, CC_TCHAR);
}

int
http_is_field_char(unsigned char c)
{
    return IS(c, CC_FIELD);
}

int
http_is_qdtext(unsigned char c)
{
    return IS(c, CC_QDTEXT);
}

const char *
http_reason(int status)
{
    switch (status) {
    case 100: return "Continue";
    case 101: return "Switching Protocols";
    case 200: return "OK";
    case 201: return "Created";
    case 202: return "Accepted";
    case 204: return "No Content";
    case 206: return "Partial Content";
    case 301: return "Moved Permanently";
    case 302: return "Found";
    case 303: return "See Other";
    case 304: return "Not Modified";
    case 307: return "Temporary Redirect";
    case 308: return "Permanent Redirect";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 406: return "Not Acceptable";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 410: return "Gone";
    case 411: return "Length Required";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 415: return "Unsupported Media Type";
    case 417: return "Expectation Failed";
    case 422: return "Unprocessable Content";
    case 426: return "Upgrade Required";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    case 505: return "HTTP Version Not Supported";
    default: return "Unknown";
    }
}
