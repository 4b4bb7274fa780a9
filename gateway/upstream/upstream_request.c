/* SPDX-License-Identifier: MIT */
/*
 * upstream_request.c - the request an upstream receives, set on a libcurl
 * handle (upstream_request.h).
 */
#include "upstream/upstream_request.h"

#include <assert.h>
#include <stdio.h>
#include <string.h>

#include <curl/curl.h>

#include "alloc.h"
#include "buf.h"
#include "base/config.h"
#include "log.h"
#include "upstream/upstream_session.h"
#include "util.h"

/* The Accept sent upstream on every call: what the gateway relays. */
#define ACCEPT "application/json, text/event-stream"

/* A value we splice into a header line must not carry a line break. */
static int
header_value_ok(const char *v)
{
    return strpbrk(v, "\r\n") == NULL;
}

/*
 * Append the line 'first' 'second' with its NUL to the scratch 'sb' and
 * store where it starts in *off (an offset, not a pointer: a later append
 * may move the buffer).  Plain copies rather than buf_printf(), whose two
 * vsnprintf() passes per line showed up in profiles of this path.
 */
static int
scratch_add(struct buf *sb, size_t *off, const char *first,
            const char *second)
{
    size_t n1 = strlen(first), n2 = strlen(second), n;
    char *dst;
    int rc;

    if (gw_add_overflows(n1, n2, &n) || gw_add_overflows(n, 1, &n))
        return GW_ETOOBIG;
    rc = buf_reserve(sb, n, &dst);
    if (rc != 0)
        return rc;
    memcpy(dst, first, n1);
    memcpy(dst + n1, second, n2 + 1);   /* with its NUL */
    *off = sb->len;
    buf_commit(sb, n);
    return 0;
}

/*
 * The TLS settings of an https:// upstream (config.h) that differ from
 * libcurl's defaults, which upstream_session_handle()'s curl_easy_reset()
 * restored (or the same upstream's last call set, on a handle kept):
 * its CA bundle (else libcurl's built-in one), its client certificate,
 * verification.  libcurl reuses a cached connection only for the same
 * TLS settings.  An http:// call needs none.  Returns 0 or GW_ENOMEM.
 */
static int
tls_options(const struct config_upstream *up, CURL *c)
{
    if (strncmp(up->url, "https://", 8) != 0)
        return 0;
    if ((up->ca_file[0] != '\0'
         && curl_easy_setopt(c, CURLOPT_CAINFO, up->ca_file) != CURLE_OK)
        || (up->client_cert[0] != '\0'
            && curl_easy_setopt(c, CURLOPT_SSLCERT, up->client_cert)
               != CURLE_OK)
        || (up->client_key[0] != '\0'
            && curl_easy_setopt(c, CURLOPT_SSLKEY, up->client_key)
               != CURLE_OK)
        || curl_easy_setopt(c, CURLOPT_SSL_VERIFYPEER,
                            (long)up->tls_verify) != CURLE_OK
        || curl_easy_setopt(c, CURLOPT_SSL_VERIFYHOST,
                            up->tls_verify ? 2L : 0L) != CURLE_OK)
        return GW_ENOMEM;
    return 0;
}

int
upstream_request_prepare(struct upstream_session_handle *h,
                         const struct config_upstream *up, char *auth_line,
                         const struct upstream_request *req,
                         int64_t total_timeout_ms, struct curl_slist *lines,
                         int *wipe, enum call_kind *kind)
{
    struct buf *b = &h->scratch;
    size_t off[UPSTREAM_REQUEST_MAX_LINES];     /* lines in the scratch */
    char *shared_auth = NULL;           /* auth_line: read-only, shared */
    size_t url_off, n = 0, i;
    const char *body;
    CURL *c = h->curl;
    int is_post;
    int rc = GW_EINVAL;

    *wipe = 0;
    *kind = CALL_OK;
    assert(req->path != NULL && req->path[0] == '/');
    if (strcmp(req->method, "POST") == 0) {
        is_post = 1;
    } else if (strcmp(req->method, "GET") == 0) {
        is_post = 0;
    } else {
        *kind = CALL_BAD_METHOD;
        goto out;
    }
    if ((req->request_id != NULL && !header_value_ok(req->request_id))
        || (req->client_auth != NULL && !header_value_ok(req->client_auth))
        || (req->content_type != NULL
            && !header_value_ok(req->content_type))) {
        *kind = CALL_BAD_REQUEST_HEADER;
        goto out;
    }

    buf_reset(b);
    rc = scratch_add(b, &url_off, up->url, req->path);
    if (rc != 0)
        goto out;
    /*
     * Constants, never the client's values: a follower's response must
     * not depend on what its leader's client put in these fields.  Every
     * POST body has been checked to be a JSON object (route.c), and the
     * answer is JSON or an SSE stream, which is all we relay.  Without
     * the lines libcurl would label a POSTFIELDS body
     * application/x-www-form-urlencoded and accept any type.  The one
     * other body is an audio upload's form, never coalesced, whose type
     * carries the boundary route.c split it at.
     */
    if (is_post)
        rc = scratch_add(b, &off[n++], "Content-Type: ",
                         req->content_type != NULL ? req->content_type
                                                   : "application/json");
    if (rc == 0)
        rc = scratch_add(b, &off[n++], "Accept: ", ACCEPT);
    /* The body is read for usage and relayed labelled as it came: no
     * content coding (a response with one is refused, http.h). */
    if (rc == 0)
        rc = scratch_add(b, &off[n++], "Accept-Encoding: ", "identity");
    if (rc != 0)
        goto out;
    if (req->request_id != NULL) {
        rc = scratch_add(b, &off[n++], "X-Request-Id: ", req->request_id);
        if (rc != 0)
            goto out;
    }
    /*
     * libcurl 7.88 sends "Expect: 100-continue" for bodies over 1 KiB and
     * then waits up to a second for the 100 (EXPECT_100_TIMEOUT_MS): a
     * round trip wasted on an upstream that reads every body anyway.
     */
    rc = scratch_add(b, &off[n++], "Expect:", "");
    if (rc != 0)
        goto out;
    /*
     * The caller passes the client's credentials only with
     * forward_client_auth on, and only when the client sent some; else
     * the configured key (if any) goes, as for every other client.
     */
    if (req->client_auth != NULL) {
        *wipe = 1;
        rc = scratch_add(b, &off[n++], "Authorization: ", req->client_auth);
        if (rc != 0)
            goto out;
    } else if (auth_line != NULL) {
        shared_auth = auth_line;
    }

    /* The scratch no longer moves: turn offsets into the list. */
    for (i = 0; i < n; i++)
        lines[i].data = b->data + off[i];
    if (shared_auth != NULL)
        lines[n++].data = shared_auth;
    assert(n <= UPSTREAM_REQUEST_MAX_LINES);
    for (i = 0; i < n; i++)
        lines[i].next = i + 1 < n ? &lines[i + 1] : NULL;

    rc = tls_options(up, c);
    if (rc != 0)
        goto out;                       /* GW_ENOMEM */
    /* CURLOPT_URL copies the string: the one setopt here that allocates. */
    rc = GW_ENOMEM;
    if (curl_easy_setopt(c, CURLOPT_URL, b->data + url_off) != CURLE_OK
        || curl_easy_setopt(c, CURLOPT_HTTPHEADER, lines) != CURLE_OK
        || curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS,
                            (long)up->connect_timeout_ms) != CURLE_OK
        || curl_easy_setopt(c, CURLOPT_TIMEOUT_MS,
                            (long)(total_timeout_ms > 0
                                   ? total_timeout_ms
                                   : up->total_timeout_ms)) != CURLE_OK)
        goto out;
    if (is_post) {
        /*
         * POSTFIELDS points at the caller's body, no copy.  The size is
         * set, and first: without it libcurl would strlen() the body, and
         * a zero-length POST would not be a POST at all.
         */
        body = req->body != NULL ? req->body : "";
        if (curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE,
                             (curl_off_t)req->body_len) != CURLE_OK
            || curl_easy_setopt(c, CURLOPT_POSTFIELDS, body) != CURLE_OK)
            goto out;
    } else if (curl_easy_setopt(c, CURLOPT_HTTPGET, 1L) != CURLE_OK) {
        goto out;                       /* a kept handle's last was a POST */
    }
    rc = 0;

out:
    if (rc == GW_ENOMEM)
        *kind = CALL_NOMEM;
    else if (rc == GW_ETOOBIG)
        *kind = CALL_REQUEST_HEADERS_TOO_LARGE;
    return rc;
}

int
upstream_request_auth_new(const struct config_upstream *up, char **out)
{
    const char *key = up->api_key;
    size_t len;

    *out = NULL;
    if (key == NULL || key[0] == '\0')
        return 0;
    if (!header_value_ok(key)) {
        log_msg(GW_LOG_ERROR, "upstream: api_key of %s contains a "
                "line break", up->name);
        return GW_EINVAL;
    }
    /* Formatted once: every transfer points at this line. */
    len = sizeof("Authorization: Bearer ") + strlen(key);
    *out = gw_malloc(len);
    if (*out == NULL)
        return GW_ENOMEM;
    snprintf(*out, len, "Authorization: Bearer %s", key);
    return 0;
}

void
upstream_request_auth_free(char *line)
{
    gw_wipe_free_str(line);
}
