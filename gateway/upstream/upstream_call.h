/* SPDX-License-Identifier: MIT */
/*
 * upstream_call.h - one call's state (struct call and its attempts,
 * struct xfer): private to upstream.c, which runs calls, and to
 * upstream_testcall.c, which drives one by hand in test builds.  Nothing
 * else includes it.
 *
 * Ownership and locking: a struct call lives on the stack of the thread
 * in upstream_perform() (or in a struct upstream_testcall) and is only
 * ever touched by that thread; its attempts live inside it.
 */
#ifndef INFERGW_GATEWAY_UPSTREAM_UPSTREAM_CALL_H
#define INFERGW_GATEWAY_UPSTREAM_UPSTREAM_CALL_H

#include <stddef.h>
#include <stdint.h>

#include <curl/curl.h>

#include "base/config.h"
#include "http_response.h"
#include "base/outcome.h"
#include "upstream/upstream.h"
#include "upstream/upstream_request.h"
#include "upstream/upstream_session.h"
#include "util.h"

/* Attempts of one call: the first and its hedge, each on its handle. */
#define UP_ATTEMPTS UPSTREAM_SESSION_HANDLES

struct call;

/* One attempt's state; lives in its struct call. */
struct xfer {
    struct call *call;
    size_t idx;                 /* which upstream */
    const struct config_upstream *up;
    struct upstream_result res;
    struct upstream_session_handle *h;
    struct curl_slist lines[UPSTREAM_REQUEST_MAX_LINES];  /* its header
                                                         list */
    int wipe;                   /* the scratch holds a client credential */
    int running;                /* in the multi handle */
    int lost;                   /* the other attempt won: end it */
    int64_t start_us;           /* when it was added */
    int64_t timeout_base_ms;    /* first byte timer origin; -1 not yet */
    int request_sent;           /* whole body handed to the socket */
    curl_off_t body_len;
    uint64_t rx;                /* response bytes, head and body */
    int64_t last_rx_ms;         /* when 'rx' last moved */
    int sends;                  /* requests sent: the first, a resend */
    int reused;                 /* the last send went on a kept
                                   connection */
    int opened_seen;            /* h->opened at the last send */
    int leftover;               /* TLS: bytes past the answer were read
                                   off the wire: keep no connection */
    int stale;                  /* it got a 408 there: send it again */
    int restarted;              /* ... which was done (once) */

    /* The response head being read (reset by every status line). */
    struct http_response_head head;
    struct http_head out;       /* the final head as the sink gets it:
                                   its Content-Type from the lines */
    int head_done;              /* the final head is in, maybe held */

    /* Set by a callback that stops the transfer; read after it ends. */
    enum call_kind fail;        /* CALL_OK: none */
    int sink_stopped;           /* the sink said so: it reports why */
};

/* One upstream_perform(): the attempts and which one the sink hears. */
struct call {
    struct upstream *u;
    const struct upstream_request *req;
    const struct upstream_opts *opts;
    const struct upstream_sink *sink;
    struct upstream_session *s;
    struct xfer x[UP_ATTEMPTS];
    int n;                      /* attempts started */
    struct xfer *winner;        /* the one the sink hears; NULL yet */
    int hedge_asked;
};

/* upstream_perform()'s options when the caller gives none. */
extern const struct upstream_opts upstream_default_opts;

#ifdef INFERGW_UNIT_TEST
/* upstream.c's own, visible to its test driver (GW_TESTABLE). */
size_t header_cb(char *p, size_t size, size_t n, void *arg);
size_t write_cb(char *p, size_t size, size_t n, void *arg);
void xfer_init(struct call *c, struct xfer *x, size_t idx,
               const struct config_upstream *up);
void attempt_finished(struct call *c, struct xfer *x, CURLcode cc);
void end_lost(struct call *c);
#endif

#endif
