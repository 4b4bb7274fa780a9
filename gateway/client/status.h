/* SPDX-License-Identifier: MIT */
/*
 * status.h - the status view on the admin listener: GET /status.json,
 * what the gateway is doing now (its flights, upstreams and tenants, what
 * /readyz answers, and the last errors it answered), and GET /status, a
 * page that shows it.
 *
 * Design: this module owns no numbers but the ring of recent errors.
 * Each module that does exposes a snapshot function that copies its own
 * under its own lock and nothing else (coalescer_status(),
 * pool_status(), tenants_status(), generations_status()); status.c calls
 * them one after the other, never holding two locks, and builds the JSON
 * (jansson) from the copies with no lock held.  So a poll costs each
 * module one short critical section, and the view is not one consistent
 * instant across modules (a flight may end between two copies), which a
 * page refreshed every second does not need.
 *
 * The ring of recent errors: the last STATUS_ERRORS answers with an
 * error (a status of 400 or more, or a stream that ended in an error
 * event; never /readyz's 503 nor /healthz's answer, which a balancer
 * asks for every second), noted by conn.c where it writes the access
 * line.  It is process-wide (like metrics.h's counters) and guarded by
 * its own mutex, held only to copy one entry in or all of them out.  An entry holds the
 * time, the request id, the status, the error's code and message, the
 * upstream and the path: never a query string (conn.c gives the path
 * without it) nor a key (no error message carries one).
 *
 * The summary: what an operator reads in a second, at the top of the
 * page and as "summary" in the document: requests per second over the
 * last minute, answers by class over it and since the start, upstream
 * calls per client request, what coalesced followers (and, once there
 * is a cache, its hits) saved, and how long each upstream has been in
 * its state.  Its numbers are a struct status_summary, filled from
 * metrics.h (lock-free), the tenants' copy (tokens) and the pool's
 * (states) that the tables use too, and from one function for the
 * cache's row (status.c summary_cache()).
 *
 * Bounds: at most [admin] status_flights flights are listed (the rest are
 * counted), every upstream (64 at most), every tenant seen, and
 * STATUS_ERRORS errors of bounded size.
 */
#ifndef INFERGW_GATEWAY_CLIENT_STATUS_H
#define INFERGW_GATEWAY_CLIENT_STATUS_H

#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "base/metrics.h"

struct handler_ctx;

#define STATUS_ERRORS 50            /* the ring of recent errors */

/* What conn.c knows of an answer with an error (all borrowed). */
struct status_error_note {
    const char *request_id;
    int status;                     /* the HTTP status sent */
    const char *kind;               /* the error's code ("upstream_timeout",
                                       ...), or "" */
    const char *message;            /* "" if none */
    const char *upstream;           /* the one that answered last; NULL */
    const char *path;               /* the request's, without the query */
};

/*
 * The summary's numbers (status.h "The summary"), but the upstreams'
 * states, which it takes from the pool's copy.  A share is of what the
 * requests answered without a call of their own would have cost: the
 * calls made plus the followers plus the cache's hits, and the tokens
 * every client received.
 */
struct status_summary {
    struct metrics_summary m;       /* answers, calls, requests proxied,
                                       followers */
    uint64_t tokens;                /* every client received, prompt and
                                       completion (infergw_tokens_total) */
    uint64_t tokens_saved;          /* ... of them, followers'
                                       (infergw_coalesce_tokens_saved_total) */
    /* The cache's row, filled by summary_cache() alone: */
    int cache_enabled;              /* show the row (the cache is on) */
    uint64_t cache_hits;            /* requests answered from the cache */
    uint64_t cache_tokens_saved;    /* tokens those hits received */
};

#ifdef INFERGW_UNIT_TEST
/* The "summary" object of 's' but its upstreams (status.c, GW_TESTABLE);
 * NULL out of memory. */
struct json_t;
struct json_t *summary_json(const struct status_summary *s);
#endif

/*
 * Keep 'n' as the newest of the recent errors (the oldest of
 * STATUS_ERRORS goes).  Each text is copied, cut to a bound, and any
 * byte that is not printable ASCII becomes '?'.  Any thread.
 */
void status_note_error(const struct status_error_note *n);

/*
 * Append the /status.json document for the request context 'ctx' (its
 * generation's configuration and pool, the coalescer, the tenants; all
 * borrowed) to 'out'.  Returns 0, GW_ENOMEM or a buf error.
 */
int status_render_json(const struct handler_ctx *ctx, struct buf *out);

/*
 * The /status page: one self-contained HTML document (no asset from
 * anywhere else) whose script polls status.json every second and draws
 * its tables.  Static storage; its length in OUT *len.
 */
const char *status_page(size_t *len);

#endif
