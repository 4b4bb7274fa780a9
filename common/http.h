/* SPDX-License-Identifier: MIT */
/*
 * http.h - strict, zero-copy HTTP/1.1 request parsing (RFC 9112), and
 * RFC 9110's character classes and field helpers.  Its siblings: the
 * chunked body decoder (http_chunked.h), the blocking request reader
 * built on both (http_read.h), and the checks on an upstream's response
 * head (http_response.h).
 *
 * Design: http_parse_request() is a pure function over a byte range, in the
 * style of picohttpparser: it returns the length of a complete head, or
 * GW_EAGAIN when more bytes are needed, or an error with the HTTP status the
 * server should answer.  Parsed fields are (pointer, length) views into the
 * caller's bytes.  Nothing here allocates.
 *
 * Refused (with the status in r->error_status):
 *   400  bad request line, method not a token, target not origin-form (the
 *        absolute-form and CONNECT's authority-form are refused: we are not
 *        a forward proxy) or "*" (asterisk-form), whitespace before a colon
 *        (RFC 9112 5.1), obs-fold (5.2), NUL/CTL bytes in a field, bare CR,
 *        Content-Length together with Transfer-Encoding (6.1), several or
 *        differing Content-Length values, Content-Length not 1*DIGIT,
 *        Transfer-Encoding not exactly "chunked" as the final coding,
 *        HTTP/1.1 without Host or with several; and, by http_read_body()
 *        (http_read.h), malformed chunk size lines, chunk extensions with
 *        bad syntax, missing CRLF after chunk data
 *   414  request line longer than HTTP_MAX_REQUEST_LINE
 *   431  head longer than 'max_head', or more than HTTP_MAX_HEADERS fields
 *   501  a transfer coding other than chunked
 *   505  a version other than HTTP/1.0 and HTTP/1.1
 * Line endings must be CRLF; a bare LF is refused too (stricter than the
 * RFC's "MAY accept", and the safe side against smuggling).
 */
#ifndef INFERGW_COMMON_HTTP_H
#define INFERGW_COMMON_HTTP_H

#include <stddef.h>
#include <stdint.h>

#include "util.h"

#define HTTP_MAX_HEADERS 64
#define HTTP_MAX_REQUEST_LINE 8192

struct http_header {
    const char *name;
    size_t name_len;
    const char *value;          /* leading/trailing OWS removed */
    size_t value_len;
};

enum http_body_kind {
    HTTP_BODY_NONE = 0,
    HTTP_BODY_LENGTH,           /* Content-Length: content_length bytes */
    HTTP_BODY_CHUNKED,          /* Transfer-Encoding: chunked */
};

struct http_request {
    const char *method;
    size_t method_len;
    const char *target;         /* origin-form: "/path?query" */
    size_t target_len;
    const char *path;           /* target without the query */
    size_t path_len;
    int minor;                  /* HTTP/1.<minor>: 0 or 1 */
    struct http_header headers[HTTP_MAX_HEADERS];
    size_t num_headers;

    /* Derived from the headers by http_parse_request(). */
    enum http_body_kind body_kind;
    uint64_t content_length;    /* HTTP_BODY_LENGTH only */
    int keep_alive;             /* 1.1 unless "close"; 1.0 only with
                                   "keep-alive" in Connection */
    int expect_continue;        /* Expect: 100-continue (case-insensitive) */

    /* Set when a parse or read fails: status to answer, static message. */
    int error_status;
    const char *error_msg;
};

/*
 * Parse a request head from p[0..len).  Borrows 'p'; on success 'r' holds
 * views into it.  'max_head' bounds the head (request line, fields and the
 * empty line).
 * Returns the head length (> 0), GW_EAGAIN (incomplete, and nothing seen so
 * far is wrong), GW_EPARSE or GW_ETOOBIG (r->error_status and r->error_msg
 * set).  Errors are reported as early as the bytes allow: an over-long line
 * or a bad byte is refused before the head is complete.
 */
int http_parse_request(const char *p, size_t len, size_t max_head,
                       struct http_request *r);

/*
 * RFC 9110's character classes, for the other parsers of common/
 * (multipart.h, http_chunked.h): tchar (section 5.6.2); field-vchar, SP
 * or HTAB (5.5); qdtext (5.6.4); HEXDIG (RFC 5234 B.1).
 */
int http_is_tchar(unsigned char c);
int http_is_field_char(unsigned char c);
int http_is_qdtext(unsigned char c);
int http_is_hexdig(unsigned char c);

/* First field named 'name' (case-insensitive), or NULL. */
const struct http_header *http_find_header(const struct http_request *r,
                                           const char *name);

/* Does the comma-separated field value contain 'token' (case-insensitive)? */
int http_has_token(const char *value, size_t len, const char *token);

/*
 * Does any field line named 'name' list 'token'?  Repeated lines are one
 * comma-joined list (RFC 9110 section 5.3), so "Cache-Control: max-age=0"
 * then "Cache-Control: no-cache" lists no-cache.  An element matches by
 * the name before any "=argument" (RFC 9111 5.2: no-cache="x" is the
 * no-cache directive).  Case-insensitive.
 */
int http_lists_token(const struct http_request *r, const char *name,
                     const char *token);

/*
 * Does the comma-separated field value list the directive 'token', alone
 * or as "token=argument" (as http_lists_token() matches)?
 */
int http_has_directive(const char *value, size_t len, const char *token);

/*
 * The smallest delta-seconds argument of 'token' ("max-age=60", or
 * quoted, "max-age=\"60\"") in any field line named 'name', capped at
 * INT64_MAX / 1000 (RFC 9111 1.2.2: a larger one is taken as the
 * largest).  Returns 1 with OUT *seconds set, or 0 when no element has
 * one that parses (an argument that is not 1*DIGIT is ignored, never an
 * error).  Case-insensitive names.
 */
int http_lists_seconds(const struct http_request *r, const char *name,
                       const char *token, int64_t *seconds);

/*
 * The longest Retry-After the gateway believes, in ms.  A server asking
 * for days is not told to the clients (gateway/upstream/upstream.c reads every
 * head with this cap) and does not hold an upstream back for days
 * (gateway/fleet/pool_breaker.c caps what it is handed at this too).
 */
#define HTTP_RETRY_AFTER_MAX_MS (60 * 1000)

/* Reason phrase for a status code ("OK", "Not Found", ...); never NULL. */
const char *http_reason(int status);

#endif
