/* SPDX-License-Identifier: MIT */
/*
 * upstream_request.h - the request an upstream receives: what of a
 * client's request goes (struct upstream_request), and how it is set on
 * a libcurl handle for one transfer, with the constant lines beside it.
 *
 * Design: every option of the request is set before every transfer,
 * after curl_easy_reset() (upstream_session_handle()) or on a handle
 * whose last transfer went to the same upstream and left nothing behind,
 * so no pointer from an earlier request is ever followed and no setting
 * of another upstream stays (the TLS files, say): the URL, the header
 * list, the timeouts, the body or HTTPGET are set every time, and the
 * TLS options depend on the upstream only.  That costs a few setopt
 * calls, no
 * allocation but the URL's copy: the URL and the header lines are
 * formatted into the handle's scratch buffer, which keeps its memory,
 * and the header list is a chain of struct curl_slist nodes in the
 * caller's storage instead of curl_slist_append()'s two mallocs per
 * line.  libcurl only reads that list during the transfer.  An
 * upstream's api_key line is formatted once (upstream_request_auth_new())
 * and only pointed at.
 *
 * Nothing here keeps state or locks: the handle belongs to the calling
 * thread (upstream_session.h), and an auth line is read-only once made.
 */
#ifndef INFERGW_GATEWAY_UPSTREAM_UPSTREAM_REQUEST_H
#define INFERGW_GATEWAY_UPSTREAM_UPSTREAM_REQUEST_H

#include <stddef.h>
#include <stdint.h>

#include "base/outcome.h"

struct config_upstream;
struct curl_slist;
struct upstream_session_handle;

/*
 * Everything of a client's request that reaches the upstream.  The rest
 * of the upstream request is constant (upstream_request.c): the URL's
 * origin, "Content-Type: application/json" on a POST (route.c has
 * checked that the body is a JSON object) unless content_type says
 * otherwise (an audio upload's multipart/form-data), a fixed Accept,
 * "Accept-Encoding: identity", no Expect, and the configured api_key
 * when no client credential is forwarded.
 *
 * The coalescing contract (coalesce.h) rests on this struct: a coalesced
 * call's fields are either hashed into its key (coalesce_key() hashes
 * method, path, body, content_type and client_auth) or the flight's own
 * (request_id).
 * A field added here must be added to one of the two.
 */
struct upstream_request {
    const char *method;         /* "GET" or "POST" */
    const char *path;           /* NUL-terminated origin-form target */
    const char *body;           /* POST body, sent byte-exact */
    size_t body_len;
    const char *request_id;     /* sent as X-Request-Id */
    const char *client_auth;    /* the client's Authorization value, sent
                                   as is; NULL sends the configured key */
    const char *content_type;   /* a POST body's Content-Type value;
                                   NULL: application/json */
};


/* Content-Type, Accept, Accept-Encoding, X-Request-Id, Authorization,
 * Expect. */
#define UPSTREAM_REQUEST_MAX_LINES 6

/*
 * Set every per-request option on handle 'h' for 'req' to upstream 'up'
 * (whose api_key line is 'auth_line', or NULL), with a total timeout of
 * 'total_timeout_ms' (> 0; else the upstream's).  Borrows all arguments;
 * 'lines' (UPSTREAM_REQUEST_MAX_LINES nodes, caller's storage) becomes
 * the header list and must outlive the transfer, as must 'auth_line' and
 * the body.  Refuses a method but GET and POST, and a request id, client
 * credential or content type with a line break.  OUT *wipe: the scratch
 * now holds the client's credentials.  OUT *kind: why, on failure.
 * Returns 0, GW_EINVAL, GW_ETOOBIG or GW_ENOMEM.
 */
int upstream_request_prepare(struct upstream_session_handle *h,
                             const struct config_upstream *up,
                             char *auth_line,
                             const struct upstream_request *req,
                             int64_t total_timeout_ms,
                             struct curl_slist *lines, int *wipe,
                             enum call_kind *kind);

/*
 * OUT *out: "Authorization: Bearer KEY" for up->api_key, owned by the
 * caller (upstream_request_auth_free()); NULL when it has none.  Returns
 * 0, GW_EINVAL (the key holds a line break; logged) or GW_ENOMEM.
 */
int upstream_request_auth_new(const struct config_upstream *up, char **out);

/* Wipe and free a line of upstream_request_auth_new().  NULL-safe. */
void upstream_request_auth_free(char *line);

#endif
