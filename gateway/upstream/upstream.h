/* SPDX-License-Identifier: MIT */
/*
 * upstream.h - the libcurl side: one call per upstream_perform(), driven
 * by the calling thread in its own wait (and a hedge beside it, when
 * asked), reused connections, and a sink that receives the response as
 * it arrives.
 *
 * Design: sessions (a libcurl multi handle with its easy handles and at
 * most one warm connection, upstream_session.h) kept per upstream in the
 * keep-alive cache (keepalive.h), which never hands out a connection with
 * anything to read; sessions move between threads, so connections are
 * reused across requests and threads.  A session belongs to one thread
 * between upstream_perform()'s take and put.  Every request the upstream
 * receives is reported: libcurl's own resend on a fresh connection, too
 * (upstream_opts.on_resend), which the caller may refuse.
 *
 * The sink's callbacks run on the calling thread, inside the transfer
 * loop: they must not block for long (a coalescing leader only appends to
 * its flight and does a non-blocking flush there).
 *
 * The held head: the sink hears of the response head only with the first
 * body byte (or at the end of an empty body).  vLLM sends a stream's head
 * at once and its first event after the first token, so until then
 * nothing has reached any client and a failed attempt can still be made
 * again elsewhere (dispatch.c).  The first byte timeout is to that first
 * body byte, too.
 */
#ifndef INFERGW_GATEWAY_UPSTREAM_UPSTREAM_H
#define INFERGW_GATEWAY_UPSTREAM_UPSTREAM_H

#include <stddef.h>
#include <stdint.h>

#include "http_response.h"

#include "base/outcome.h"
#include "upstream/upstream_request.h"

struct gw_config;
struct upstream;

struct upstream_result;

/* How one call is run, beyond the upstream's configuration. */
struct upstream_opts {
    /*
     * A 429, 502, 503 or 504 head ends the transfer before the sink hears
     * of it (rc GW_EUPSTREAM, res->status set, res->head_seen 0): the
     * caller will try another upstream.  Off: it is relayed like any.
     */
    int stop_on_retryable;
    int64_t total_timeout_ms;   /* > 0: instead of the upstream's */
    int watch_fd;               /* the client's socket, watched for a
                                   hang-up (sink->on_peer); -1 none */
    int stop_fd;                /* readable: run on_tick at once; -1 */
    /*
     * Hedging: an attempt with no first body byte after hedge_after_ms
     * (0: never) calls hedge(arg, first, &idx); 0 with *idx starts a
     * second attempt on upstream *idx beside it.  The first to produce a
     * body byte is the one the sink hears; the other is aborted.  An
     * attempt that fails, or answers a retryable status, while the other
     * runs just ends.
     */
    int64_t hedge_after_ms;
    int (*hedge)(void *arg, size_t first, size_t *idx);
    /* Every attempt but the one upstream_perform() returns, when it is
     * over (the hedge that lost, one that failed): its result. */
    void (*attempt_done)(void *arg, const struct upstream_result *res);
    /* The attempt on upstream 'idx' has its first body byte (or a whole
     * empty body) of a response with 'status', and is the one the sink
     * hears.  May be NULL. */
    void (*on_winner)(void *arg, size_t idx, int status);
    /*
     * The attempt on upstream 'idx' is about to be sent again, on a fresh
     * connection: the reused one it was sent on failed before any byte
     * of an answer (the upstream's idle close raced it, or answered 408).
     * It is one more request the upstream receives: the caller counts
     * it and returns 0, or refuses it (nonzero: the request's attempts
     * are spent), and the attempt then ends unsent as CALL_NOT_RESENT.
     * At most once per attempt.  May be NULL (always sent).
     */
    int (*on_resend)(void *arg, size_t idx);
    void *arg;
    /*
     * A background feed's call (probe.h): a failed attempt is logged
     * here at debug only, since the feed logs its failures as one
     * repeating failure (log.h's log_repeat), not a line per beat.
     * 'detail' (when not NULL) gets libcurl's text for the failure,
     * NUL-terminated within 'detail_size' bytes; "" when it has none.
     */
    int quiet;
    char *detail;
    size_t detail_size;
};

/*
 * Where the response goes.  Each callback returns 0 to go on, or a GW_E*
 * code that stops the transfer with that code as its result:
 * GW_EABORTED (the client went away, or nobody listens any more),
 * GW_ENOMEM, GW_ESTOPPING (the process is stopping), GW_ETOOBIG (more
 * than the sink will take).  The sink reports
 * its own failures; upstream.c only notes them at info level.
 */
struct upstream_sink {
    void *arg;
    /* The final response's head is in (1xx skipped): once, before any
     * on_data, with the first body byte (the held head, above). */
    int (*on_head)(void *arg, const struct http_head *h);
    /* A piece of the body (de-chunked). */
    int (*on_data)(void *arg, const char *p, size_t n);
    /*
     * Called at least about once a second while the transfer waits (and
     * after every wake-up while it moves).  May be NULL.
     */
    int (*on_tick)(void *arg);
    /*
     * opts->watch_fd is readable: a hang-up, or the client's next request.
     * Returns 0 (not gone: watch again a little later), 1 (stop watching
     * it) or a GW_E code that stops the call.  May be NULL (not watched).
     */
    int (*on_peer)(void *arg);
};

/* One attempt's result. */
struct upstream_result {
    struct call_outcome outcome;    /* outcome.h: the kind (CALL_OK:
                                       complete; a sink's stop is
                                       call_kind_of_stop() of its code),
                                       the upstream's status (0 if none
                                       came) and Retry-After */
    int head_seen;          /* on_head was called: bytes may have
                               reached a client */
    uint64_t bytes;         /* body bytes received */
    int64_t ttfb_us;        /* request start to first body byte; -1 none */
    int64_t duration_us;    /* request start to the attempt's end; -1
                               when it never started */
    size_t upstream;        /* which upstream this attempt went to */
};

/*
 * Create the handle pool for the upstreams in 'cfg' (borrowed; must
 * outlive the pool).  Call after curl_global_init().  NULL on failure.
 */
struct upstream *upstream_new(const struct gw_config *cfg);

/* Free the pool and every handle; no transfer may be running.  NULL-safe. */
void upstream_free(struct upstream *u);

/*
 * Run one call to completion (blocking) on upstream 'idx' of
 * cfg->upstreams, with a hedge on another if opts says so.  Borrows
 * 'req', 'opts' (NULL: defaults) and 'sink'.
 * Request headers sent: Host (from the URL), Content-Type (POST only),
 * Accept and Accept-Encoding: identity (constants), Content-Length,
 * X-Request-Id, and
 * Authorization (req->client_auth, else the upstream's key as Bearer, else
 * none); nothing else, so no client or hop-by-hop field can leak through.
 * "Expect:" is suppressed.
 * Timeouts come from the upstream's config: connect, first byte (request
 * sent to the first body byte), idle (between body bytes) and total.
 * OUT *res is always filled: the result of the attempt the sink heard,
 * else of the one that ended last.  Returns res->rc.  Thread-safe.
 */
int upstream_perform(struct upstream *u, size_t idx,
                     const struct upstream_request *req,
                     const struct upstream_opts *opts,
                     const struct upstream_sink *sink,
                     struct upstream_result *res);

/*
 * Worth trying another upstream for: the upstream is overloaded (429,
 * RFC 6585), down behind a proxy, or timed out behind one (502, 503, 504,
 * RFC 9110 15.6.3-15.6.5).
 */
int upstream_retryable_status(int status);

#endif
