/* SPDX-License-Identifier: MIT */
/*
 * outcome.h - what became of an upstream call, described once.
 *
 * A call's outcome is one small value, made where the cause is known and
 * passed up unchanged:
 *
 *   upstream.c   makes one per attempt (libcurl's code, a callback's
 *                stop, a refused response head);
 *   dispatch.c   keeps the last attempt's, or makes one when the pool
 *                refuses before any attempt (no upstream, all full), and
 *                marks a poison request's as the request's fault;
 *   flight.c     keeps it for every client of a flight;
 *   pool         judges it for the upstream's health (pool_outcome_of,
 *                in pool_breaker.c);
 *   reply.c      renders it as the clients' answer (reply_failure).
 *
 * Text derives from the kind only at the edge (call_kind_text(), for a
 * log line or an error message), so nothing parses a reason back.
 * Immutable values; no state, no locks.
 */
#ifndef INFERGW_GATEWAY_BASE_OUTCOME_H
#define INFERGW_GATEWAY_BASE_OUTCOME_H

#include "http_response.h"

enum call_kind {
    CALL_OK = 0,                /* complete: an answer (any status) */

    /* The upstream never answered: counted against it. */
    CALL_CONNECT,               /* refused, unreachable, DNS */
    CALL_TLS,                   /* handshake or verification failed */
    CALL_CONNECT_TIMEOUT,
    CALL_FIRST_BYTE_TIMEOUT,
    CALL_IDLE_TIMEOUT,          /* between body bytes */
    CALL_TOTAL_TIMEOUT,

    /* It answered 429/502/503/504 and the call stopped there, unheard,
     * so that another upstream may be tried; 'status' says which. */
    CALL_STATUS,

    /* A lost or refused response (upstream.h, "strict heads"). */
    CALL_EMPTY_REPLY,
    CALL_BAD_HEAD,              /* status line or head syntax */
    CALL_BAD_HEADER,            /* a field line */
    CALL_BAD_LENGTH,            /* Content-Length not one decimal */
    CALL_CONFLICTING_LENGTH,    /* two different Content-Lengths */
    CALL_LENGTH_AND_CHUNKED,    /* Content-Length with chunked */
    CALL_BAD_TRANSFER_ENCODING, /* anything but chunked */
    CALL_BAD_CONTENT_ENCODING,  /* anything but identity */
    CALL_HEAD_TOO_LARGE,
    CALL_HEADER_TOO_LARGE,      /* one field past our buffer */
    CALL_STALE_408,             /* 408 on a kept connection */
    CALL_BROKEN,                /* the connection broke */

    /* Stopped by the sink (upstream.h): its doing, it reports why. */
    CALL_CLIENT_GONE,           /* nobody listens any more */
    CALL_TOO_BIG,               /* more than the sink takes */
    CALL_STOPPED,               /* any other stop of the sink's */
    CALL_LOST_HEDGE,            /* the other attempt won: ended */

    /* The gateway's. */
    CALL_NOMEM,
    CALL_STOPPING,              /* the process is stopping */
    CALL_BAD_METHOD,            /* a request we cannot send: */
    CALL_BAD_REQUEST_HEADER,
    CALL_REQUEST_HEADERS_TOO_LARGE,
    CALL_BAD_URL,
    CALL_OPTION_REFUSED,        /* libcurl refused an option */
    CALL_MULTI_FAILED,          /* libcurl's multi handle failed */
    CALL_NOT_RESENT,            /* a kept connection failed before an
                                   answer (upstream.h on_resend), and the
                                   request had no attempt left to be sent
                                   again on a fresh one */

    /* The pool's refusal, before any attempt (dispatch.h). */
    CALL_NO_UPSTREAM,           /* every one ejected or held back */
    CALL_ALL_FULL,              /* every one at max_inflight, past
                                   queue_timeout */
    CALL_NOT_SERVED,            /* no upstream serves the model */
    CALL_QUEUE_GONE,            /* the clients left while it queued */
    CALL_SHED,                  /* all busy; the tenant is sheddable */

    CALL_KIND_COUNT
};

/* Whose doing an outcome is. */
enum call_fault {
    CALL_FAULT_NONE = 0,        /* an answer (its status may still be a
                                   5xx, which the pool judges) */
    CALL_FAULT_UPSTREAM,        /* it failed to answer */
    CALL_FAULT_CLIENT,          /* the clients left */
    CALL_FAULT_GATEWAY,         /* ours: memory, stopping, the request
                                   we built, the pool's refusal */
    CALL_FAULT_REQUEST,         /* the request's own: it failed the same
                                   way on two upstreams (poison) */
};

struct call_outcome {
    enum call_kind kind;
    int status;                 /* the upstream's HTTP status; 0 none */
    int retry_after_s;          /* the upstream's Retry-After on a 429 or
                                   503 (capped), or the pool's for its
                                   refusal; 0 none */
    enum call_fault fault;
};

/* An outcome of 'kind' with its usual fault, no status, no Retry-After. */
struct call_outcome call_outcome_make(enum call_kind kind);

/*
 * The GW_E* code 'kind' stands for: 0 (OK), GW_ETIMEDOUT, GW_EUPSTREAM,
 * GW_EABORTED, GW_ENOMEM, GW_ESTOPPING, GW_ETOOBIG, GW_EINVAL,
 * GW_EUNAVAIL or GW_ENOTFOUND.  The control flow above upstream.c
 * branches on these; the answer is reply.c's, from the kind.
 */
int call_kind_rc(enum call_kind kind);

/* Its usual fault (the poison mark is dispatch.c's to set). */
enum call_fault call_kind_fault(enum call_kind kind);

/* Static text for logs and error messages: "connect failed", ... */
const char *call_kind_text(enum call_kind kind);

/* The kind of a sink's stop code (struct upstream_sink). */
enum call_kind call_kind_of_stop(int rc);

/* The kind of a refused upstream response head (common/http_response.h's
 * http_response_head_line()): CALL_BAD_HEAD for one it has no kind for. */
enum call_kind call_kind_of_head(enum http_head_error e);

/* Is it one of the timeouts?  (Answered 504.) */
int call_kind_is_timeout(enum call_kind kind);

#endif
