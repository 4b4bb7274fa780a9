/*
 * conn.h - one client connection: the keep-alive request loop and the
 * helpers that write responses.
 *
 * A struct conn is created by its own connection thread and owned by it;
 * no other thread ever touches it.  Responses are HTTP/1.1 with either
 * Content-Length, chunked framing, or (HTTP/1.0 clients with a body of
 * unknown length) a close-delimited body.  The head of a response is held
 * back and sent together with the first body bytes: a small response goes
 * out in one writev().
 */
#ifndef INFERGW_GATEWAY_CONN_H
#define INFERGW_GATEWAY_CONN_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "buf.h"
#include "http.h"
#include "metrics.h"

struct server;

enum conn_framing {
    FRAMING_LENGTH = 0,         /* Content-Length */
    FRAMING_CHUNKED,            /* Transfer-Encoding: chunked */
    FRAMING_CLOSE,              /* HTTP/1.0: body ends when we close */
};

struct conn {
    struct server *srv;         /* borrowed */
    int fd;                     /* owned */
    struct buf in;              /* bytes read, not yet parsed */
    struct buf head;            /* this request's head; req views it */
    struct buf body;            /* this request's body */
    struct buf out;             /* response head held back, see above */
    struct http_request req;
    char request_id[65];

    /* Per request; reset by the loop. */
    int64_t start_us;           /* head complete */
    enum metrics_route route;
    int status;                 /* status line sent (or about to be) */
    int upstream_status;        /* 0 if none */
    uint64_t bytes_out;         /* body bytes sent */
    int64_t ttfb_us;            /* start to first body byte; -1 none */
    int64_t peer_check_ms;      /* last net_peer_gone() during a relay */
    int head_sent;
    enum conn_framing framing;
    int64_t content_length;     /* FRAMING_LENGTH: bytes promised */
    int keep_alive;             /* keep the connection after this one */
    int event_stream;           /* response is text/event-stream */
    int broken;                 /* body ended uncleanly: must close */
    const char *role;           /* coalescing role for header and log */
    const char *flight_id;      /* leader or follower: the flight's id
                                   (the upstream's X-Request-Id), for the
                                   access log; NULL otherwise */
    size_t tenant;              /* config index, CONFIG_MAX_TENANTS for
                                   "default" */
    char model[64];             /* for the access log */
};

/*
 * Thread body: serve requests on 'fd' until the client closes, an error,
 * idle timeout or drain.  Steals 'fd' (closes it).
 */
void conn_serve(struct server *srv, int fd);

/* Deadline for a write that the client must accept within send_timeout. */
int64_t conn_send_deadline(const struct conn *c);

/*
 * Prepare the response head: status, Content-Type (NULL: none), framing
 * from 'content_length' (-1: chunked, or close-delimited for HTTP/1.0),
 * X-Request-Id, X-Infergw-Coalesce when c->role is set, 'extra' header
 * lines (each ending in CRLF; NULL for none) and Connection.  Nothing is
 * written yet.  Returns 0 or GW_ENOMEM.
 */
int conn_begin(struct conn *c, int status, const char *content_type,
               int64_t content_length, const char *extra);

/*
 * Send body bytes (with the held-back head first, and chunk framing),
 * waiting for the client up to 'deadline'.  Returns 0 or a net error;
 * after an error the connection is marked broken.
 */
int conn_body(struct conn *c, const char *p, size_t n, int64_t deadline);

/*
 * The wire bytes conn_body() would send for p[0..n), as iovecs for a
 * caller that writes at its own pace: for chunked framing the size line
 * (formatted into 'size_line'), the data and CRLF; else the data alone.
 * Returns how many of iov[0..3) it filled (0 when n is 0).
 */
#define CONN_SIZE_LINE 24
int conn_frame_iov(const struct conn *c, const char *p, size_t n,
                   struct iovec iov[3], char size_line[CONN_SIZE_LINE]);

/*
 * Note that the held-back head and 'n' body bytes were written by the
 * caller (after conn_frame_iov()), for accounting.
 */
void conn_note_sent(struct conn *c, size_t n);

/* End the body cleanly: the head if still held, the last chunk. */
int conn_end(struct conn *c, int64_t deadline);

/*
 * End the body uncleanly after a mid-response failure: for an event
 * stream, an SSE error event in the OpenAI shape; then no terminating
 * chunk, and the connection is closed (never a fake success).
 */
void conn_fail_body(struct conn *c, const char *type, const char *code,
                    const char *message);

/*
 * Has the client been sent its whole response body?  (Only a
 * Content-Length body can be known complete before conn_end().)  A peer
 * that hangs up after that is a client that is done, not one that left.
 */
int conn_body_complete(const struct conn *c);

/* A whole response with Content-Length in one write. */
int conn_send(struct conn *c, int status, const char *content_type,
              const char *body, size_t len, const char *extra);

/*
 * An OpenAI-shaped error: {"error":{"message","type","param","code"}}.
 * The caller decides keep-alive (set c->keep_alive = 0 to close).
 */
int conn_send_error(struct conn *c, int status, const char *type,
                    const char *code, const char *message);

/*
 * Read the request body (Expect: 100-continue answered first; a
 * Content-Length over max_request_body refused with 413 before reading).
 * Returns 0, or a negative code after the error response was sent and
 * keep-alive turned off.
 */
int conn_read_body(struct conn *c);

#endif
