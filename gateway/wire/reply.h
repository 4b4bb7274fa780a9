/* SPDX-License-Identifier: MIT */
/*
 * reply.h - writing one response to a client: the held-back head, the
 * body's framing, errors in OpenAI's shape, and the facts the access log
 * reports about the response.
 *
 * Responses are HTTP/1.1 with Content-Length, chunked framing, or (an
 * HTTP/1.0 client and a body of unknown length) a close-delimited body.
 * The head is held back in 'head' and goes out with the first body bytes,
 * so a small response is one writev().
 *
 * Waits: a write waits for the client up to send_timeout, and ends at
 * once (GW_EABORTED) when the process stops (stop_fd readable).  After a
 * failed write the reply is 'broken': the body can no longer end cleanly
 * and the connection closes.
 *
 * Ownership: a struct reply belongs to its connection's thread, except
 * while that client is a parked follower claimed by the leader or a
 * helper (fanout.h says when): then that thread uses it.  Never two at
 * once; nothing in it is shared.
 */
#ifndef INFERGW_GATEWAY_WIRE_REPLY_H
#define INFERGW_GATEWAY_WIRE_REPLY_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "buf.h"
#include "http_response.h"

#include "base/outcome.h"

struct net_stream;              /* net.h */

enum reply_framing {
    REPLY_LENGTH = 0,           /* Content-Length */
    REPLY_CHUNKED,              /* Transfer-Encoding: chunked */
    REPLY_CLOSE,                /* HTTP/1.0: the body ends when we close */
};

#define REPLY_TENANT_HEAD 384
#define REPLY_ERROR_CODE 40
#define REPLY_ERROR_MSG 160

struct reply {
    /* For the connection's life (reply_init). */
    struct net_stream *stream;  /* borrowed: the client's (net.h) */
    int stop_fd;                /* readable once the process stops */
    const _Atomic int *draining;    /* set: no keep-alive */
    int64_t send_timeout_ms;
    struct buf head;            /* the response head, held back */

    /* Per request (reply_start). */
    const char *request_id;     /* borrowed; echoed as X-Request-Id */
    int minor;                  /* the request's HTTP/1.<minor> */
    int64_t start_us;           /* when the request head was complete */
    int status;                 /* status line sent (or about to be) */
    int upstream_status;        /* for the access log; 0 if none */
    uint64_t bytes_out;         /* body bytes sent */
    int64_t ttfb_us;            /* start to first body byte; -1 none */
    int head_sent;
    enum reply_framing framing;
    int64_t content_length;     /* REPLY_LENGTH: bytes promised */
    int keep_alive;             /* keep the connection after this one */
    int event_stream;           /* text/event-stream */
    int broken;                 /* the client is gone (or given up): the
                                   body cannot end cleanly, close.  Set
                                   by reply_gone() alone: a failed write
                                   here, reply_client_gone(), or a
                                   writer that drops the client */
    int linger;                 /* close with request bytes unread:
                                   drain them first (conn.c) */
    const char *role;           /* X-Infergw-Coalesce value, or NULL */
    const char *cache;          /* X-Infergw-Cache value, or NULL */
    int64_t age_s;              /* Age of a cache hit, or -1 */
    int head_only;              /* HEAD: the head GET would have, and no
                                   body (RFC 9110 9.3.2); set by route.c */
    int end_sent;               /* the body's end went out with its last
                                   bytes (reply_note_end()) */
    char tenant_head[REPLY_TENANT_HEAD];    /* header lines (CRLF each)
                                   every head of this answer carries:
                                   route.c's x-ratelimit-* for a tenant
                                   with requests_per_minute or
                                   tokens_per_minute; "" none */
    char error_code[REPLY_ERROR_CODE];  /* the last error this answer
                                   gave its client (every error answer is
                                   made by a function below, which notes
                                   it), for the status view's recent
                                   errors (conn.c); "" none */
    char error_msg[REPLY_ERROR_MSG];
};

/* Prepare 'r' for the client on 's' (borrowed, like 'draining'). */
void reply_init(struct reply *r, struct net_stream *s, size_t head_limit,
                int64_t send_timeout_ms, int stop_fd,
                const _Atomic int *draining);
void reply_release(struct reply *r);

/* Start the response to a new request (borrows 'request_id'). */
void reply_start(struct reply *r, const char *request_id, int minor,
                 int keep_alive);

/*
 * reply_begin() for a head relayed from an upstream (borrowed), written
 * the same way for every client of it, the direct one, a flight's leader
 * and each follower: its status (also noted as the upstream's, for the
 * access line), Content-Type and length, and its Retry-After.
 */
int reply_begin_head(struct reply *r, const struct http_head *h);

/*
 * Send body bytes (the held-back head first, and chunk framing), waiting
 * for the client.  Returns 0 or a net error; after an error the reply is
 * broken.  With head_only, the head alone: the bytes are not sent.
 */
int reply_body(struct reply *r, const char *p, size_t n);

/*
 * The wire bytes reply_body() would send for p[0..n), as iovecs for a
 * caller that writes at its own pace: for chunked framing the size line
 * (formatted into 'size_line'), the data and CRLF; else the data alone.
 * Returns how many of iov[0..3) it filled (0 when n is 0).
 */
#define REPLY_SIZE_LINE 24
int reply_frame_iov(const struct reply *r, const char *p, size_t n,
                    struct iovec iov[3], char size_line[REPLY_SIZE_LINE]);

/* The caller wrote the held-back head and 'n' body bytes itself. */
void reply_note_sent(struct reply *r, size_t n);

/*
 * For a caller that frames and writes at its own pace (fanout.h): what
 * the client's socket takes now of iov[0..cnt) (OUT *n bytes), never
 * waiting; reply_write_all() writes all of p[0..len), waiting for the
 * client up to send_timeout (or the stop).  The bytes are wire bytes
 * (head and framing included); the caller notes the body it sent
 * (reply_note_sent()).  Returns 0, or a net error, and then the client
 * is gone (reply_gone()): a write is how reply.c learns it, as
 * reply_client_gone() is how anyone else asks.
 */
int reply_writev_some(struct reply *r, const struct iovec *iov, int cnt,
                      size_t *n);
int reply_write_all(struct reply *r, const char *p, size_t len);

/* End the body cleanly: the head if still held, the last chunk. */
int reply_end(struct reply *r);

/*
 * For a caller that writes the body's last bytes at its own pace and
 * knows they are the last (a finished flight, fanout.h): the wire bytes
 * reply_end() would write after them (chunked framing's last chunk), as
 * iov[0], so that they go in the same write.  Returns how many iovecs it
 * filled (0 or 1).  Once they are the client's (written, or kept by the
 * caller to write), reply_note_end() says so and reply_end() writes
 * nothing more.
 */
int reply_end_iov(const struct reply *r, struct iovec *iov);
void reply_note_end(struct reply *r);

/*
 * The same in two steps, for a caller that writes at its own pace (the
 * head is sent): reply_fail_event() appends to 'out' the wire bytes of
 * the error event reply_fail_body() would send now (framed; none when it
 * would send none), counted as sent from now on; once the caller has
 * written them, reply_fail_end() ends the body uncleanly.
 * reply_fail_event() returns 0 or a buf error.
 */
int reply_fail_event(struct reply *r, struct buf *out, const char *type,
                     const char *code, const char *message);
void reply_fail_end(struct reply *r);

/* The client is gone or stuck: no more writes, close. */
void reply_gone(struct reply *r);

/*
 * Is the client gone?  The one place that says, for every path that
 * must know while it is not writing (a direct relay or a flight's
 * leader between chunks, a call waiting in the pool's queue, the
 * leader's sweep of its parked followers):
 *  - a broken reply is gone (a write failed, or its writer gave the
 *    client up: reply_gone());
 *  - one whose whole body was sent (reply_body_complete()) is not: a
 *    hang-up now is a client that is done, not one that left;
 *  - else its socket is looked at without waiting (net_peer_gone()): a
 *    hang-up or a reset is a client that left, and the reply is marked
 *    gone (reply_gone()); input (its next request) is not.
 * Costs a poll() when it looks: callers on a hot path ask at most every
 * so often (proxy.c's PEER_CHECK_MS), or when the socket is readable.
 */
int reply_client_gone(struct reply *r);

/* The same for v[0..n), one poll() for them all (the sweep); returns how
 * many are gone, each marked so. */
size_t reply_clients_gone(struct reply *const *v, size_t n);

/*
 * The response is sent (or about to be) while the request's body is
 * still unread: close afterwards, lingering (conn.c), so that the unread
 * bytes do not turn the close into a reset that destroys the answer.
 */
void reply_close_unread(struct reply *r);

/*
 * Has the client been sent its whole body?  (Only a Content-Length body
 * can be known complete before reply_end().)  A peer that hangs up after
 * that is a client that is done, not one that left.
 */
int reply_body_complete(const struct reply *r);

/*
 * Room for the one 'extra' header line of reply_begin() that a response
 * made or relayed here carries, with its NUL: "Retry-After: N\r\n"
 * (reply_retry_after_line(): 26 bytes at most, N being an int) or
 * "WWW-Authenticate: Bearer\r\n" (27).
 */
#define REPLY_EXTRA_MAX 40

/* A whole response with Content-Length in one write. */
int reply_send(struct reply *r, int status, const char *content_type,
               const char *body, size_t len, const char *extra);

/*
 * An OpenAI-shaped error: {"error":{"message","type","param","code"}},
 * with Retry-After on 429 and 503; after the head was sent,
 * reply_fail_body().  The caller decides keep-alive.
 */
int reply_error(struct reply *r, int status, const char *type,
                const char *code, const char *message);

/* The same with the error's "param" (NULL: null) and a Retry-After of
 * 'retry_after_s' seconds (0: none). */
int reply_error_full(struct reply *r, int status, const char *type,
                     const char *param, const char *code,
                     const char *message, int retry_after_s);

/*
 * The gateway ran out of memory (or past a bound on it) answering: 503,
 * type "server_error", code "overloaded", Retry-After: 1, and 'message'
 * saying where ("out of memory reading the request body").  The one
 * answer to it wherever it happens; reply_refuse() is the same answer
 * for a connection that has no struct reply.
 */
int reply_out_of_memory(struct reply *r, const char *message);

/*
 * 405 "method_not_allowed" with the Allow field RFC 9110 15.5.6 asks
 * for: 'allow' is its value ("POST", "GET, HEAD"), at most
 * REPLY_ALLOW_MAX bytes.
 */
#define REPLY_ALLOW_MAX 32
int reply_method_not_allowed(struct reply *r, const char *allow);

/*
 * A request that failed to parse or arrive: 'status' from the parser
 * (408, 413, 414, 431, 501, 505; anything else is 400) with its code, and
 * the connection closes: the bytes after it are not a request.
 */
int reply_request_error(struct reply *r, int status, const char *msg);

/*
 * What a failed upstream call (or a flight) tells its clients, from its
 * outcome 'o' (outcome.h; borrowed), the one place a failure becomes an
 * answer: the upstream's own 429/502/503/504 when the call stopped at
 * one unheard (CALL_STATUS: no retry could follow), with its Retry-After
 * (at least 1 s) on a 429 or 503; 504 for a timeout; 503 when the
 * gateway ran out of memory or is stopping or no upstream is available
 * (Retry-After: the pool's); 404 for a model no upstream serves; else
 * 502 ("upstream_unreachable" for a refused connect).  The message is
 * "upstream " and call_kind_text().  Once the head is sent, the same as
 * an SSE error event and an unclean end.
 */
void reply_failure(struct reply *r, const struct call_outcome *o);

/* reply_failure() of CALL_STOPPING: 503 "gateway shutting down". */
void reply_shutting_down(struct reply *r);

/* Send "HTTP/1.1 100 Continue" (RFC 9110 10.1.1).  0 or a net error. */
int reply_continue(struct reply *r);

/*
 * Refuse a connection that has no struct reply (over max_connections, or
 * out of memory): a whole 503 (OpenAI error "overloaded", Retry-After,
 * Connection: close) in one non-blocking write with no allocation, a
 * half-close, then at most REPLY_REFUSE_DRAIN bytes of what the client
 * already sent are read and dropped (closing on unread input would send
 * an RST that can destroy the answer in flight), and 'fd' is closed
 * (stolen).  Never waits: a client that keeps sending cannot hold the
 * caller (the accept loop).  'message' is a constant without quotes.
 * Returns the bytes drained.
 */
#define REPLY_REFUSE_DRAIN (64 * 1024)
size_t reply_refuse(int fd, const char *request_id, const char *message);

#ifdef INFERGW_UNIT_TEST
/* ---- test builds only (test/check_exports.py) ---- */

/* reply.c's own (static in other builds; documented there). */
int64_t reply_deadline(const struct reply *r);
int reply_begin(struct reply *r, int status, const char *content_type,
                int64_t content_length, const char *extra);
void reply_fail_body(struct reply *r, const char *type, const char *code,
                     const char *message);
void reply_retry_after_line(char *out, size_t n, int seconds);
#endif

#endif
