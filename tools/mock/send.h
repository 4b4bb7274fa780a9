/* SPDX-License-Identifier: MIT */
/*
 * send.h - mock_upstream's answers on the wire: a response head and a
 * body with its Content-Length, a streamed body's pieces and its end, an
 * OpenAI error body, a JSON body and one SSE event.
 *
 * Every function writes to the request's client socket with a deadline
 * of MOCK_SEND_MS and builds in its connection's buffers (c->hdr,
 * c->out); only send_close_call() takes a lock (st.mu, briefly).  A write that fails marks the request gone and the
 * connection to close (q->gone, q->close); each returns 0 or that error,
 * which the caller needs only to stop writing.
 */
#ifndef INFERGW_TOOLS_MOCK_SEND_H
#define INFERGW_TOOLS_MOCK_SEND_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

struct req;

/*
 * Write the response head and the first 'n' body bytes at 'p' in one go.
 * 'clen' is the Content-Length to announce, or -1 for a streamed body:
 * chunked for HTTP/1.1, delimited by closing the connection for HTTP/1.0
 * (RFC 9112 section 6.3 rule 8; 1.0 clients know no chunked coding).
 * For chunked bodies 'n' must be 0: pieces go through send_piece().
 * Borrows 'ctype' (NULL: no Content-Type) and 'p'.  Returns 0, or an
 * error with q->close set (and q->gone on a write error).
 */
int send_head(struct req *q, int status, const char *ctype, int64_t clen,
              const char *p, size_t n);

/*
 * Write one piece of a streamed body: its own HTTP chunk when chunked
 * (so each SSE event is one chunk, as vLLM sends them), else raw.
 * Empty pieces are skipped: a zero-size chunk would end the body.
 */
int send_piece(struct req *q, const char *p, size_t n);

/*
 * Take the call 'q' out of st.in_progress (and completing), once: a call
 * counted in by post_answer() (q->open set) is counted out just before
 * the write that carries its last byte, not after it, so a client that
 * reads its answer and sends its next call never finds both counted at
 * once (a test of max_inflight reads the peak).  send_head() with the
 * whole body and send_end() call it; post_answer() calls it at the end
 * for every call that ended otherwise.
 */
void send_close_call(struct req *q);

/* End a streamed body: the last chunk, or the close that ends 1.0 ones. */
int send_end(struct req *q);

/* A complete response with Content-Length.  'ctype' may be NULL. */
int send_simple(struct req *q, int status, const char *ctype, const char *p,
                size_t n);

/*
 * An OpenAI error body: {"error":{"message":...,"type":...,"param":...,
 * "code":...}}.  'type' is "invalid_request_error" below 500, else
 * "server_error", as the gateway's own errors are.  'param' and 'code'
 * may be NULL.
 */
int send_error(struct req *q, int status, const char *msg, const char *param,
               const char *code);

/*
 * Send 'o' (stolen) as a JSON body with 'status', dumped compact with
 * the json_dump flags 'flags' added; a 500 if it is NULL.
 */
int send_json(struct req *q, int status, json_t *o, size_t flags);

/* Send 'o' (stolen) as one SSE event "data: {json}\n\n". */
int send_event(struct req *q, json_t *o);

/* The 404 of a path the mock does not serve. */
void send_not_found(struct req *q);

#endif
