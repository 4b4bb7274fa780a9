/* SPDX-License-Identifier: MIT */
/*
 * http_response.h - an upstream's response head, checked line by line.
 *
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
 * but HTAB (it is relayed), and a head over 'max_head' bytes.  Of
 * Cache-Control, only no-store and private are noted (no_store).  Other
 * fields, and lines without a colon, are passed over.
 *
 * Nothing here allocates.  The gateway reads every head with its cap on
 * Retry-After, HTTP_RETRY_AFTER_MAX_MS (http.h).
 */
#ifndef INFERGW_COMMON_HTTP_RESPONSE_H
#define INFERGW_COMMON_HTTP_RESPONSE_H

#include <stddef.h>
#include <stdint.h>

#include "util.h"

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
    int no_store;               /* Cache-Control lists no-store or
                                   private: a cache must not keep it */
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
 * The longest Content-Type the gateway relays, with its NUL.  A longer
 * one makes the upstream's head refused as too large, not cut: a media
 * type cut short could say something else.
 */
#define HTTP_CTYPE_MAX 256

/*
 * A final response head as the gateway passes it on, described once:
 * what an upstream answered (its sink is told, upstream.h), what a
 * flight keeps for every reader (flight.h), and what each client's reply
 * begins with (reply_begin_head(), reply.h).  Plain data, copied whole.
 */
struct http_head {
    int status;
    int64_t content_length;             /* -1 when unknown */
    char content_type[HTTP_CTYPE_MAX];  /* "" when absent */
    int retry_after_s;                  /* of a 429 or 503, capped at
                                           HTTP_RETRY_AFTER_MAX_MS; 0
                                           none */
    int no_store;                       /* its Cache-Control said
                                           no-store or private: never
                                           kept by the response cache */
};

#endif
