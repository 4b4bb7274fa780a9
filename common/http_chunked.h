/* SPDX-License-Identifier: MIT */
/*
 * http_chunked.h - the incremental chunked-body decoder (RFC 9112
 * section 7.1), for a request body (http_read.h) or any other chunked
 * stream (tools/loadgen.c reads the gateway's answers with it).  Chunk
 * extensions are parsed and ignored, trailer fields are parsed and
 * dropped; the framing is checked as strictly as http.h checks a head.
 * The decoder allocates nothing itself: the data goes to the caller's
 * bounded buffer.
 */
#ifndef INFERGW_COMMON_HTTP_CHUNKED_H
#define INFERGW_COMMON_HTTP_CHUNKED_H

#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "util.h"

/* A decoder's state; one per body, owned by its caller. */
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

#endif
