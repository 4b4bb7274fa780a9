/* SPDX-License-Identifier: MIT */
/*
 * http.h - strict, zero-copy HTTP/1.1 request parsing (RFC 9112), the
 * blocking request reader shared by the gateway and the mock upstream,
 * and the checks on an upstream's response head.
 *
 * Design: http_parse_request() is a pure function over a byte range, in the
 * style of picohttpparser: it returns the length of a complete head, or
 * GW_EAGAIN when more bytes are needed, or an error with the HTTP status the
 * server should answer.  Parsed fields are (pointer, length) views into the
 * caller's bytes.  Nothing here allocates except the readers, which append
 * to caller-provided bounded buffers.
 *
 * Refused (with the status in r->error_status):
 *   400  bad request line, method not a token, target not origin-form (the
 *        absolute-form and CONNECT's authority-form are refused: we are not
 *        a forward proxy) or "*" (asterisk-form), whitespace before a colon
 *        (RFC 9112 5.1), obs-fold (5.2), NUL/CTL bytes in a field, bare CR,
 *        Content-Length together with Transfer-Encoding (6.1), several or
 *        differing Content-Length values, Content-Length not 1*DIGIT,
 *        Transfer-Encoding not exactly "chunked" as the final coding,
 *        HTTP/1.1 without Host or with several, malformed chunk size lines,
 *        chunk extensions with bad syntax, missing CRLF after chunk data
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

#include "buf.h"
#include "util.h"

struct net_stream;              /* net.h */

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
 * (multipart.h): tchar (section 5.6.2); field-vchar, SP or HTAB (5.5);
 * qdtext (5.6.4).
 */
int http_is_tchar(unsigned char c);
int http_is_field_char(unsigned char c);
int http_is_qdtext(unsigned char c);

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
 * A response head (an upstream's answer), read one line at a time as
 * libcurl's header callback hands the lines over: the status line, the
 * fields, the empty line that ends the head; then the next head after a
 * 1xx (RFC 9110 15.2: skipped, any number of them).  Read strictly (RFC
 * 9112 6.3), since an answer whose end cannot be trusted would leave
 * bytes on the connection to be read as the next request's answer:
 * refused are a status line that is not "HTTP/x NNN" with NNN 100..599,
 * a Content-Length that is not one plain decimal (1*DIGIT) or disagrees
 * with another, one together with Transfer-Encoding, a transfer coding
 * other than one "chunked", a content coding other than identity (the
 * gateway asks for identity), a Content-Type with a control character
 * but HTAB (it is relayed), and a head over 'max_head' bytes.  Other
 * fields, and lines without a colon, are passed over.
 */
/* Why a response head was refused (http_response_head_line()). */
enum http_head_error {
    HTTP_HEAD_OK = 0,
    HTTP_HEAD_TOO_LARGE,        /* over max_head */
    HTTP_HEAD_BAD_STATUS,       /* not a status line */
    HTTP_HEAD_BAD_FIELD,        /* a relayed value with a control byte */
    HTTP_HEAD_BAD_LENGTH,       /* Content-Length not one decimal */
    HTTP_HEAD_CONFLICTING_LENGTH,
    HTTP_HEAD_LENGTH_AND_CHUNKED,
    HTTP_HEAD_BAD_TRANSFER_CODING,
    HTTP_HEAD_BAD_CONTENT_CODING,
};

struct http_response_head {
    int status;                 /* of the head being read; 0 before one */
    int has_te;                 /* Transfer-Encoding: chunked */
    int has_cl;                 /* a Content-Length, in content_length */
    int64_t content_length;     /* -1 when none */
    int64_t retry_after_ms;     /* Retry-After in delay-seconds, capped at
                                   retry_after_max_ms; 0 none or not
                                   seconds (an HTTP-date) */
    /* After HTTP_RESPONSE_CTYPE: the value, a view into the line just
     * fed (OWS trimmed); NULL after any other line. */
    const char *ctype;
    size_t ctype_len;
    enum http_head_error error; /* after an error: why */

    size_t max_head;            /* private */
    int64_t retry_after_max_ms; /* private */
    int want_status_line;       /* private */
    size_t head_bytes;          /* private: of the current head */
};

/* What a line was (http_response_head_line()). */
enum http_response_event {
    HTTP_RESPONSE_FIELD = 0,    /* a field taken, or a 1xx head's end */
    HTTP_RESPONSE_STATUS,       /* a status line: a new head begins (what
                                   the caller kept of the last is stale) */
    HTTP_RESPONSE_CTYPE,        /* a Content-Type field: h->ctype */
    HTTP_RESPONSE_DONE,         /* the final head is complete */
};

/*
 * The longest Retry-After the gateway believes, in ms.  A server asking
 * for days is not told to the clients (gateway/upstream/upstream.c reads every
 * head with this cap) and does not hold an upstream back for days
 * (gateway/fleet/pool.c caps what it is handed at this too).
 */
#define HTTP_RETRY_AFTER_MAX_MS (60 * 1000)

/* Ready 'h' for a response: a head of at most 'max_head' bytes, a
 * Retry-After of at most 'retry_after_max_ms'. */
void http_response_head_init(struct http_response_head *h, size_t max_head,
                             int64_t retry_after_max_ms);

/*
 * Feed one whole line p[0..n), with its line end (CRLF or LF).  Borrows
 * 'p'.  Returns an enum http_response_event, or GW_EPARSE / GW_ETOOBIG
 * (max_head) with h->error set: the response is refused.  Lines after
 * HTTP_RESPONSE_DONE are trailers, not for this reader.
 */
int http_response_head_line(struct http_response_head *h, const char *p,
                            size_t n);

/*
 * Incremental chunked-body decoder (RFC 9112 section 7.1).  Chunk
 * extensions are parsed and ignored, trailer fields are parsed and dropped.
 */
struct http_chunked {
    int state;                  /* private */
    uint64_t left;              /* private: bytes left in this chunk */
    size_t line_len;            /* private: length of the current line */
};

void http_chunked_init(struct http_chunked *d);

/*
 * Decode from p[0..len), appending the data to 'out' (whose limit bounds
 * the body).  OUT *consumed: bytes of 'p' used; bytes after the end of the
 * message are not consumed.
 * Returns 1 when the message is complete, 0 when more input is needed,
 * GW_EPARSE (malformed), GW_ETOOBIG ('out' limit) or GW_ENOMEM.
 */
int http_chunked_feed(struct http_chunked *d, const char *p, size_t len,
                      struct buf *out, size_t *consumed);

/*
 * Read one request head from the client's stream 's' (borrowed; see
 * net.h).
 *
 * 'in' holds bytes already read (a pipelined request) and receives new
 * ones; it is bounded by the caller.  When the head is complete it is
 * copied into 'head' (reset first) and consumed from 'in', and 'r' is
 * parsed from 'head': its views stay valid until 'head' changes, whatever
 * happens to 'in' later (reading the body may move 'in').
 *
 * Deadlines: until the first byte arrives the wait ends at 'idle_deadline'
 * (or when 'wake_fd' is readable: the process is draining); from the first
 * byte the whole head must arrive within 'header_timeout_ms' (or the wait
 * ends when 'stop_fd' is readable: the process is stopping).  Either
 * descriptor may be -1.
 * Returns 0; GW_ECLOSED (peer closed or reset before a complete head);
 * GW_ETIMEDOUT (r->error_status 408 if some bytes had arrived, 0 if none);
 * GW_EABORTED (drain while idle, or stop); GW_EPARSE / GW_ETOOBIG
 * (error_status set); GW_ENOMEM; GW_EIO.
 */
int http_read_head(struct net_stream *s, struct buf *in, struct buf *head,
                   size_t max_head, int64_t idle_deadline,
                   int header_timeout_ms, int wake_fd, int stop_fd,
                   struct http_request *r);

/*
 * Read the body 'r' announces into 'body' (reset first; its limit is the
 * largest body accepted), first from 'in', then from 's', until 'deadline'
 * or until 'wake_fd' (or -1) is readable while waiting.
 * Bytes after the body stay in 'in' for the next request.
 * Returns 0; GW_ETOOBIG (r->error_status 413); GW_EPARSE (bad chunked
 * framing, 400); GW_ETIMEDOUT (408); GW_EABORTED (wake_fd); GW_ECLOSED;
 * GW_ENOMEM; GW_EIO.
 * 'r' is not const only so that the error fields can be set.
 */
int http_read_body(struct net_stream *s, struct buf *in,
                   struct http_request *r, struct buf *body,
                   int64_t deadline, int wake_fd);

/* Reason phrase for a status code ("OK", "Not Found", ...); never NULL. */
const char *http_reason(int status);

#endif
