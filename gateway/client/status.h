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
 * Bounds: at most [admin] status_flights flights are listed (the rest are
 * counted), every upstream (64 at most), every tenant seen, and
 * STATUS_ERRORS errors of bounded size.
 */
#ifndef INFERGW_GATEWAY_CLIENT_STATUS_H
#define INFERGW_GATEWAY_CLIENT_STATUS_H

#include <stddef.h>
#include <stdint.h>

#include "buf.h"

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
