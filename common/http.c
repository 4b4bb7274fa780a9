/* SPDX-License-Identifier: MIT */
/*
 * http.c - strict HTTP/1.1 request heads (RFC 9112) and RFC 9110's
 * character classes (API in http.h).
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
 * The chunked decoder (http_chunked.c) is the opposite: a state machine,
 * over the same table (http_is_tchar() and its siblings below).
 */
#include "http.h"

#include <limits.h>
#include <string.h>

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
http_has_directive(const char *value, size_t len, const char *token)
{
    return list_has(value, len, token, 1);
}

/* delta-seconds p[0..n), quotes taken off; -1 when it is not 1*DIGIT. */
static int64_t
parse_seconds(const char *p, size_t n)
{
    int64_t v = 0;

    if (n >= 2 && p[0] == '"' && p[n - 1] == '"') {
        p++;
        n -= 2;
    }
    if (n == 0)
        return -1;
    for (size_t i = 0; i < n; i++) {
        if (p[i] < '0' || p[i] > '9')
            return -1;
        if (v < INT64_MAX / 1000)
            v = v * 10 + (p[i] - '0');
    }
    return v < INT64_MAX / 1000 ? v : INT64_MAX / 1000;
}

/* The smallest "token=seconds" in value[0..len), or -1 (list_has's
 * element rules). */
static int64_t
list_seconds(const char *value, size_t len, const char *token)
{
    const char *p = value, *end = value + len, *elem, *elem_end, *eq, *a;
    int64_t best = -1, v;

    while (p < end) {
        elem = p;
        while (p < end && *p != ',')
            p++;
        elem_end = p;
        eq = memchr(elem, '=', (size_t)(elem_end - elem));
        if (eq != NULL) {
            a = eq + 1;
            while (elem < eq && is_ows(*elem))
                elem++;
            while (eq > elem && is_ows(eq[-1]))
                eq--;
            while (a < elem_end && is_ows(*a))
                a++;
            while (elem_end > a && is_ows(elem_end[-1]))
                elem_end--;
            v = gw_strieq(elem, (size_t)(eq - elem), token)
                ? parse_seconds(a, (size_t)(elem_end - a)) : -1;
            if (v >= 0 && (best < 0 || v < best))
                best = v;
        }
        if (p < end)
            p++;                /* the comma */
    }
    return best;
}

int
http_lists_seconds(const struct http_request *r, const char *name,
                   const char *token, int64_t *seconds)
{
    int64_t best = -1, v;

    for (size_t i = 0; i < r->num_headers; i++) {
        const struct http_header *h = &r->headers[i];

        if (!gw_strieq(h->name, h->name_len, name))
            continue;
        v = list_seconds(h->value, h->value_len, token);
        if (v >= 0 && (best < 0 || v < best))
            best = v;
    }
    if (best < 0)
        return 0;
    *seconds = best;
    return 1;
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

int
http_is_hexdig(unsigned char c)
{
    return IS(c, CC_HEX);
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
