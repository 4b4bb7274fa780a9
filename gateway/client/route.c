/* SPDX-License-Identifier: MIT */
/*
 * route.c - the route table and the checks a request passes before it is
 * forwarded: method, API key, body size and framing, body is a JSON
 * object (or, for an audio upload, a sound multipart/form-data body with
 * a model field).  The admin listener serves the operator's routes alone,
 * and the status view is served nowhere else.
 */
#include "client/route.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "base/cluster.h"
#include "base/config.h"
#include "base/handler.h"
#include "http_read.h"
#include "jsonx.h"
#include "log.h"
#include "base/metrics.h"
#include "multipart.h"
#include "fleet/pool.h"
#include "coalesce/coalesce.h"
#include "coalesce/proxy.h"
#include "wire/reply.h"
#include "client/status.h"
#include "base/tenant.h"
#include "util.h"

enum route_kind {
    KIND_COMPLETION,        /* POST JSON object, may coalesce */
    KIND_JSON,              /* POST JSON object, never coalesced */
    KIND_FORM,              /* POST multipart/form-data with a model
                               field, never coalesced */
    KIND_MODELS,            /* GET, answered from the pool's cache */
    KIND_HEALTHZ,
    KIND_READYZ,
    KIND_METRICS,
    KIND_STATUS_JSON,       /* the status view (status.h) */
    KIND_STATUS_PAGE,
};

/* Which listeners serve a route. */
enum route_where {
    ON_API,                 /* listen, tls_listen */
    ON_BOTH,                /* those and [admin] listen */
    ON_ADMIN,               /* [admin] listen alone */
};

struct route_def {
    const char *path;
    const char *method;     /* GET routes take HEAD too (RFC 9110 9.3.2) */
    enum metrics_route id;
    enum route_kind kind;
    enum route_where where;
};

static const struct route_def routes[] = {
    { "/v1/chat/completions", "POST", METRICS_ROUTE_CHAT, KIND_COMPLETION,
      ON_API },
    { "/v1/completions", "POST", METRICS_ROUTE_COMPLETIONS, KIND_COMPLETION,
      ON_API },
    { "/v1/embeddings", "POST", METRICS_ROUTE_EMBEDDINGS, KIND_JSON,
      ON_API },
    /*
     * The Responses API keeps state upstream (store, previous_response_id,
     * background): two identical requests are two responses, so it is
     * relayed like the others here, never coalesced.
     */
    { "/v1/responses", "POST", METRICS_ROUTE_RESPONSES, KIND_JSON, ON_API },
    { "/tokenize", "POST", METRICS_ROUTE_TOKENIZE, KIND_JSON, ON_API },
    { "/detokenize", "POST", METRICS_ROUTE_DETOKENIZE, KIND_JSON, ON_API },
    { "/v1/rerank", "POST", METRICS_ROUTE_RERANK, KIND_JSON, ON_API },
    { "/rerank", "POST", METRICS_ROUTE_RERANK, KIND_JSON, ON_API },
    { "/v2/rerank", "POST", METRICS_ROUTE_RERANK, KIND_JSON, ON_API },
    { "/v1/score", "POST", METRICS_ROUTE_SCORE, KIND_JSON, ON_API },
    { "/score", "POST", METRICS_ROUTE_SCORE, KIND_JSON, ON_API },
    { "/pooling", "POST", METRICS_ROUTE_POOLING, KIND_JSON, ON_API },
    { "/v1/audio/transcriptions", "POST", METRICS_ROUTE_TRANSCRIPTIONS,
      KIND_FORM, ON_API },
    { "/v1/audio/translations", "POST", METRICS_ROUTE_TRANSLATIONS,
      KIND_FORM, ON_API },
    { "/v1/models", "GET", METRICS_ROUTE_MODELS, KIND_MODELS, ON_API },
    { "/healthz", "GET", METRICS_ROUTE_HEALTHZ, KIND_HEALTHZ, ON_BOTH },
    { "/readyz", "GET", METRICS_ROUTE_READYZ, KIND_READYZ, ON_BOTH },
    { "/metrics", "GET", METRICS_ROUTE_METRICS, KIND_METRICS, ON_BOTH },
    /* What every flight, tenant and upstream is doing: the operator's,
     * never on a port the clients reach. */
    { "/status.json", "GET", METRICS_ROUTE_STATUS, KIND_STATUS_JSON,
      ON_ADMIN },
    { "/status", "GET", METRICS_ROUTE_STATUS, KIND_STATUS_PAGE, ON_ADMIN },
};

static const struct route_def *
find_route(const char *path, size_t len)
{
    for (size_t i = 0; i < GW_ARRAY_LEN(routes); i++)
        if (strlen(routes[i].path) == len
            && memcmp(routes[i].path, path, len) == 0)
            return &routes[i];
    return NULL;
}

static void
send_json_status(struct reply *r, int status, const char *body)
{
    reply_send(r, status, "application/json", body, strlen(body), NULL);
}

/*
 * /metrics names every tenant and counts its traffic.  With tenants or
 * an [admin] key configured, the API ports show it only to a request
 * with an [admin] key; the admin listener (meant for loopback) asks for
 * one only if [admin] has one.  Without either, nothing is asked.
 */
static int
metrics_allowed(const struct handler_req *hr)
{
    const struct gw_config *cfg = hr->ctx->cfg;
    int ask = cfg->num_admin_keys > 0
              || (!hr->admin && cfg->num_tenants > 0);

    return !ask || tenant_is_admin(cfg, hr->req);
}

static void
serve_metrics(struct handler_req *hr)
{
    struct coalesce_cache_status cs;
    struct buf b;

    /* The cache's gauges without what has expired since its last join. */
    if (hr->ctx->co != NULL)
        coalescer_cache_status(hr->ctx->co, &cs);
    buf_init(&b, 4 << 20);
    if (metrics_render(&b, hr->ctx->cfg) == 0
        && pool_render_metrics(hr->ctx->pool, &b) == 0
        && tenants_render_metrics(hr->ctx->tenants, hr->ctx->cfg,
                                  gw_wall_s(), &b) == 0
        && (hr->ctx->cluster == NULL
            || cluster_render_metrics(hr->ctx->cluster, &b) == 0))
        reply_send(hr->reply, 200, "text/plain; version=0.0.4; charset=utf-8",
                   buf_ptr(&b), buf_len(&b), NULL);
    else
        reply_error(hr->reply, 500, "server_error", "internal_error",
                    "cannot render metrics");
    buf_release(&b);
}

/* GET /status.json on the admin listener (status.h). */
static void
serve_status(struct handler_req *hr)
{
    struct buf b;

    buf_init(&b, 16 << 20);
    if (status_render_json(hr->ctx, &b) == 0)
        reply_send(hr->reply, 200, "application/json", buf_ptr(&b),
                   buf_len(&b), "Cache-Control: no-store\r\n");
    else
        reply_out_of_memory(hr->reply, "cannot render the status");
    buf_release(&b);
}

/*
 * GET /status: the page.  It holds no data (its script asks
 * status.json, with the key if one is needed), so it needs no key.
 */
static void
serve_status_page(struct handler_req *hr)
{
    size_t len;
    const char *page = status_page(&len);

    reply_send(hr->reply, 200, "text/html; charset=utf-8", page, len,
               "Cache-Control: no-store\r\n");
}

/*
 * GET /v1/models: the union of the models of the upstreams that are not
 * ejected (pool.h), never an upstream call per request.
 */
static void
serve_models(struct handler_req *hr)
{
    struct buf b;
    int rc;

    /* 64 upstreams x 256 models of 4 KiB each could pass this; the ids
     * are deduplicated first, so a real fleet is far below it. */
    buf_init(&b, 16 << 20);
    rc = pool_models_json(hr->ctx->pool, &b);
    if (rc == 0)
        reply_send(hr->reply, 200, "application/json", buf_ptr(&b),
                   buf_len(&b), NULL);
    else
        reply_out_of_memory(hr->reply, rc == GW_ENOMEM
                                       ? "out of memory"
                                       : "the model list is too large");
    buf_release(&b);
}

/* Keep the model name for the access log (bounded, printable). */
static void
note_model_str(struct handler_req *hr, const char *m)
{
    size_t i;

    if (m == NULL)
        return;
    for (i = 0; m[i] != '\0' && i < sizeof(hr->model) - 1; i++)
        hr->model[i] = (m[i] > ' ' && m[i] < 0x7f && m[i] != '"')
                       ? m[i] : '_';
    hr->model[i] = '\0';
}

/* The same from a JSON body, and whether it asks for a stream (the
 * metrics' label; an audio form's stream field is not read for it). */
static void
note_model(struct handler_req *hr, const json_t *body)
{
    hr->stream = json_is_true(json_object_get(body, "stream"));
    note_model_str(hr, json_string_value(json_object_get(body, "model")));
}

/* The longest model name a form may route by: the pool's. */
#define FORM_MODEL_MAX POOL_MODEL_ID_MAX

/*
 * An audio upload (KIND_FORM): its Content-Type must be
 * multipart/form-data with a boundary, its body a sound form
 * (multipart.h) with one "model" field of 1 to FORM_MODEL_MAX printable
 * characters.  OUT model (FORM_MODEL_MAX + 1 bytes): the field, for
 * routing; OUT ctype (sizeof "multipart/form-data; boundary=\"...\""):
 * the Content-Type to send upstream, rebuilt from the boundary that split
 * the body, so that the upstream splits it the same way.  Returns 0, or
 * GW_EPARSE after the 400 was sent.
 */
static int
read_form(struct handler_req *hr, char *model, char *ctype, size_t ctype_len)
{
    const struct http_header *h = http_find_header(hr->req, "Content-Type");
    char boundary[MULTIPART_MAX_BOUNDARY + 1];
    const char *why = NULL, *v;
    size_t blen, vlen, i;
    int rc, token = 1;

    if (h == NULL) {
        why = "an audio upload needs Content-Type: multipart/form-data";
        goto bad;
    }
    if (multipart_boundary(h->value, h->value_len, boundary, &blen,
                           &why) != 0)
        goto bad;
    rc = multipart_find(buf_ptr(hr->body), buf_len(hr->body), boundary,
                        blen, "model", &v, &vlen, &why);
    if (rc == GW_ENOTFOUND) {
        reply_error_full(hr->reply, 400, "invalid_request_error", "model",
                         "missing_model", "the form has no model field", 0);
        return GW_EPARSE;
    }
    if (rc != 0)
        goto bad;
    for (i = 0; i < vlen; i++)
        if ((unsigned char)v[i] <= 0x20 || (unsigned char)v[i] >= 0x7f)
            break;
    if (vlen == 0 || vlen > FORM_MODEL_MAX || i < vlen) {
        reply_error_full(hr->reply, 400, "invalid_request_error", "model",
                         "invalid_model", "the model field must be 1 to 256 "
                         "printable characters", 0);
        return GW_EPARSE;
    }
    memcpy(model, v, vlen);
    model[vlen] = '\0';
    for (i = 0; i < blen; i++)
        if (!http_is_tchar((unsigned char)boundary[i]))
            token = 0;
    snprintf(ctype, ctype_len, "multipart/form-data; boundary=%s%s%s",
             token ? "" : "\"", boundary, token ? "" : "\"");
    return 0;

bad:
    reply_error(hr->reply, 400, "invalid_request_error", "invalid_multipart",
                why);
    return GW_EPARSE;
}

/* Is the request's method 'm'? */
static int
method_is(const struct http_request *req, const char *m)
{
    return strlen(m) == req->method_len
           && memcmp(m, req->method, req->method_len) == 0;
}

/* 405: the route's method, and HEAD wherever GET goes. */
static void
send_405(struct reply *r, const char *allowed)
{
    reply_method_not_allowed(r, strcmp(allowed, "GET") == 0 ? "GET, HEAD"
                                                           : allowed);
}

/*
 * A duration as OpenAI's x-ratelimit-reset-* write it (Go's
 * time.Duration.String(), to the millisecond): 0s, 250ms, 8s, 8.5s,
 * 1m0s, and, for a token bucket deep in debt, 2h5m0s.
 */
GW_TESTABLE void
format_reset(char *out, size_t n, int64_t us)
{
    int64_t ms = (us + 999) / 1000, s = (ms + 999) / 1000;
    int64_t frac = ms % 1000;
    int digits = 3;

    while (frac != 0 && frac % 10 == 0) {       /* Go trims the zeros */
        frac /= 10;
        digits--;
    }
    if (ms == 0)
        snprintf(out, n, "0s");
    else if (ms < 1000)
        snprintf(out, n, "%" PRId64 "ms", ms);
    else if (ms < 60000 && frac == 0)
        snprintf(out, n, "%" PRId64 "s", ms / 1000);
    else if (ms < 60000)
        snprintf(out, n, "%" PRId64 ".%0*" PRId64 "s", ms / 1000, digits,
                 frac);
    else if (s < 3600)          /* whole seconds, rounded up */
        snprintf(out, n, "%" PRId64 "m%" PRId64 "s", s / 60, s % 60);
    else
        snprintf(out, n, "%" PRId64 "h%" PRId64 "m%" PRId64 "s", s / 3600,
                 s / 60 % 60, s % 60);
}

/*
 * OpenAI's rate-limit header lines, on every answer to a tenant with
 * requests_per_minute (the -requests ones) or tokens_per_minute (the
 * -tokens ones), into the reply: the openai SDKs read them.
 */
static void
note_rate(struct reply *r, const struct tenant_rate *rate)
{
    char reset[32];
    size_t len = 0;
    int w;

    if (rate->limit > 0) {
        format_reset(reset, sizeof(reset), rate->reset_us);
        w = snprintf(r->tenant_head, sizeof(r->tenant_head),
                     "x-ratelimit-limit-requests: %" PRIu64 "\r\n"
                     "x-ratelimit-remaining-requests: %" PRIu64 "\r\n"
                     "x-ratelimit-reset-requests: %s\r\n",
                     rate->limit, rate->remaining, reset);
        len = w > 0 ? (size_t)w : 0;
    }
    if (rate->tokens_limit > 0 && len < sizeof(r->tenant_head)) {
        format_reset(reset, sizeof(reset), rate->tokens_reset_us);
        snprintf(r->tenant_head + len, sizeof(r->tenant_head) - len,
                 "x-ratelimit-limit-tokens: %" PRIu64 "\r\n"
                 "x-ratelimit-remaining-tokens: %" PRIu64 "\r\n"
                 "x-ratelimit-reset-tokens: %s\r\n",
                 rate->tokens_limit, rate->tokens_remaining, reset);
    }
}

/*
 * The call admitted by admit() is over, its response sent: its pass,
 * and its lease (a follower's went when it followed) by what is left
 * of the request's redis_timeout.
 */
static void
leave(struct handler_req *hr)
{
    tenants_leave(hr->ctx->tenants, hr->pass);
    hr->pass = NULL;
    tenant_lease_release(hr->ctx->cluster, hr->lease, hr->redis_left_ms);
    hr->lease = NULL;
}

/*
 * The tenant's limits (tenant.h): 0 and hr->pass set (and hr->lease,
 * with [cluster] and a max_inflight), or the 429 (or 503) is sent.  Keep-alive stays: the body was read.
 */
static int
admit(struct handler_req *hr)
{
    const char *name = tenant_name(hr->ctx->cfg, hr->tenant);
    const char *type = "requests", *code = "rate_limit_exceeded";
    char msg[200];
    struct tenant_rate rate;
    int wait;
    enum tenant_limit verdict;
    int64_t now_us = gw_now_us(), wall_s = gw_wall_s();
    int shared = tenant_shared_wanted(hr->ctx->cluster, hr->ctx->cfg,
                                      hr->tenant);
    struct tenant_shared_with with = { NULL, NULL, 0, NULL };

    hr->redis_left_ms = 0;
    hr->lease = NULL;
    if (shared)
        verdict = tenants_enter_inflight(hr->ctx->tenants, hr->ctx->cfg,
                                         hr->tenant, now_us, wall_s,
                                         &hr->pass, &wait, &rate);
    else
        verdict = tenants_enter(hr->ctx->tenants, hr->ctx->cfg, hr->tenant,
                                now_us, wall_s, &hr->pass, &wait, &rate);
    if (shared && verdict == TENANT_ADMITTED
        && tenant_lease_wanted(hr->ctx->cluster, hr->ctx->cfg, hr->tenant)) {
        hr->lease = tenant_lease_new(hr->ctx->cluster, hr->ctx->cfg,
                                     hr->tenant);
        if (hr->lease == NULL) {
            /* Out of memory: the pass goes back, counted nowhere. */
            tenants_refuse(hr->ctx->tenants, hr->pass, TENANT_ADMITTED,
                           now_us);
            hr->pass = NULL;
            verdict = TENANT_NOMEM;
        }
        with.lease = hr->lease;
    }
    if (shared && verdict == TENANT_ADMITTED
        && (tenant_shared_enter(hr->ctx->cluster, hr->ctx->cfg, hr->tenant,
                                now_us, wall_s, &with, &verdict, &wait,
                                &rate, &hr->redis_left_ms) != 0
            || verdict != TENANT_ADMITTED)) {
        /* Refused by the shared limits, or Redis gone and on_error =
         * deny (then 'verdict' is still TENANT_ADMITTED). */
        tenants_refuse(hr->ctx->tenants, hr->pass, verdict, now_us);
        hr->pass = NULL;
        tenant_lease_release(hr->ctx->cluster, hr->lease, 0);
        hr->lease = NULL;
        if (verdict == TENANT_ADMITTED) {
            reply_error_full(hr->reply, 503, "server_error", NULL,
                             "cluster_unavailable", "the shared limits' "
                             "store (Redis) is unavailable and [cluster] "
                             "on_error = deny; try again later", wait);
            return GW_EUNAVAIL;
        }
    }
    note_rate(hr->reply, &rate);
    switch (verdict) {
    case TENANT_ADMITTED:
        return 0;
    case TENANT_MAX_INFLIGHT:
        snprintf(msg, sizeof(msg), "tenant '%s' has max_inflight requests "
                 "under way; try again later", name);
        break;
    case TENANT_RATE:
        snprintf(msg, sizeof(msg), "tenant '%s' is over its "
                 "requests_per_minute; try again in %d s", name, wait);
        break;
    case TENANT_TOKENS:
        /* OpenAI's type for a tokens-per-minute limit. */
        type = "tokens";
        snprintf(msg, sizeof(msg), "tenant '%s' is over its "
                 "tokens_per_minute (limit %" PRIu64 "); try again in %d s",
                 name, rate.tokens_limit, wait);
        break;
    case TENANT_QUOTA_DAY:
    case TENANT_QUOTA_MONTH:
        /* A spent budget is OpenAI's insufficient_quota, also a 429. */
        type = code = "insufficient_quota";
        snprintf(msg, sizeof(msg), "tenant '%s' has used its %s; it renews "
                 "%s00:00 UTC, in %d s", name, tenant_limit_name(verdict),
                 verdict == TENANT_QUOTA_DAY ? "at " : "on the 1st, ", wait);
        break;
    case TENANT_NOMEM:
        reply_out_of_memory(hr->reply, "out of memory");
        return GW_ENOMEM;
    }
    reply_error_full(hr->reply, 429, type, NULL, code, msg, wait);
    return GW_EUNAVAIL;
}

/*
 * Read the request body (Expect: 100-continue answered first; a
 * Content-Length over max_request_body refused with 413 before reading).
 * Returns 0, or a negative code after the error response was sent (or
 * the client is gone) and keep-alive turned off.
 */
static int
read_body(struct handler_req *hr)
{
    const struct gw_config *cfg = hr->ctx->cfg;
    struct http_request *req = hr->req;
    struct reply *r = hr->reply;
    int rc;

    buf_reset(hr->body);
    hr->body->limit = (size_t)cfg->max_request_body;
    if (req->body_kind == HTTP_BODY_NONE)
        return 0;
    if (req->body_kind == HTTP_BODY_LENGTH
        && req->content_length > cfg->max_request_body) {
        reply_close_unread(r);
        reply_request_error(r, 413, "request body exceeds max_request_body");
        return GW_ETOOBIG;
    }
    if (req->expect_continue && buf_len(hr->in) == 0) {
        rc = reply_continue(r);
        if (rc != 0) {
            reply_gone(r);
            return rc;
        }
    }
    rc = http_read_body(r->stream, hr->in, req, hr->body,
                        gw_now_ms() + cfg->body_timeout_ms,
                        hr->ctx->stop_fd);
    if (rc == GW_EABORTED) {
        /* The stop came while the body was arriving. */
        r->keep_alive = 0;
        reply_shutting_down(r);
        return rc;
    }
    if (rc == GW_ECLOSED || rc == GW_EIO) {
        reply_gone(r);
        return rc;
    }
    if (rc == GW_ENOMEM) {
        r->keep_alive = 0;
        reply_out_of_memory(r, "out of memory reading the request body");
        return rc;
    }
    if (rc != 0) {
        reply_request_error(r, req->error_status, req->error_msg);
        return rc;
    }
    return 0;
}

static void
serve(struct handler_req *hr)
{
    const struct gw_config *cfg = hr->ctx->cfg;
    const struct http_request *req = hr->req;
    struct reply *r = hr->reply;
    const struct route_def *rt;
    json_t *body = NULL;
    char err[160];
    char model[FORM_MODEL_MAX + 1];
    char ctype[sizeof("multipart/form-data; boundary=\"\"")
               + MULTIPART_MAX_BOUNDARY];

    /* HEAD: every answer, errors too, without its body (RFC 9110 9.3.2:
     * a client reads none, so one sent would pass for the next answer). */
    r->head_only = method_is(req, "HEAD");
    rt = find_route(req->path, req->path_len);
    if (rt == NULL || (hr->admin && rt->where == ON_API)
        || (!hr->admin && rt->where == ON_ADMIN)) {
        /* An unread body would be taken for the next request: close. */
        if (req->body_kind != HTTP_BODY_NONE)
            reply_close_unread(r);
        reply_error(r, 404, "invalid_request_error", "not_found",
                    hr->admin ? "no such route on the admin listener"
                              : "no such route");
        return;
    }
    hr->route = rt->id;
    if (!method_is(req, rt->method)
        && !(r->head_only && strcmp(rt->method, "GET") == 0)) {
        if (req->body_kind != HTTP_BODY_NONE)
            reply_close_unread(r);
        send_405(r, rt->method);
        return;
    }
    if (rt->kind == KIND_COMPLETION || rt->kind == KIND_JSON
        || rt->kind == KIND_FORM || rt->kind == KIND_MODELS) {
        /*
         * With tenants configured, a client must present one of their
         * keys; without, everyone is tenant "default".  Checked before
         * the body is read, so a stranger cannot make us buffer it.
         */
        hr->tenant = tenant_identify(cfg, req);
        hr->tenant_route = 1;
        if (cfg->num_tenants > 0 && hr->tenant >= CONFIG_MAX_TENANTS) {
            if (req->body_kind != HTTP_BODY_NONE)
                reply_close_unread(r);
            reply_error(r, 401, "authentication_error", "invalid_api_key",
                        "missing or unknown API key");
            return;
        }
    }
    if ((rt->kind == KIND_METRICS || rt->kind == KIND_STATUS_JSON)
        && !metrics_allowed(hr)) {
        if (req->body_kind != HTTP_BODY_NONE)
            reply_close_unread(r);
        reply_error(r, 401, "authentication_error", "invalid_api_key",
                    rt->kind == KIND_METRICS
                    ? "/metrics needs an [admin] api_key"
                    : "/status.json needs an [admin] api_key");
        return;
    }
    if (read_body(hr) != 0)
        return;

    switch (rt->kind) {
    case KIND_HEALTHZ:
        send_json_status(r, 200, "{\"status\":\"ok\"}");
        return;
    case KIND_READYZ:
        if (handler_draining(hr->ctx))
            send_json_status(r, 503, "{\"status\":\"draining\"}");
        else if (!pool_ready(hr->ctx->pool))
            send_json_status(r, 503, "{\"status\":\"no_upstream\"}");
        else
            send_json_status(r, 200, "{\"status\":\"ready\"}");
        return;
    case KIND_METRICS:
        serve_metrics(hr);
        return;
    case KIND_STATUS_JSON:
        serve_status(hr);
        return;
    case KIND_STATUS_PAGE:
        serve_status_page(hr);
        return;
    case KIND_MODELS:
        serve_models(hr);
        return;
    case KIND_COMPLETION:
    case KIND_JSON:
        if (jsonx_parse_object(buf_ptr(hr->body), buf_len(hr->body),
                               JSONX_MAX_DEPTH, &body, err,
                               sizeof(err)) != 0) {
            reply_error(r, 400, "invalid_request_error", "invalid_json",
                        err);
            return;
        }
        note_model(hr, body);
        if (admit(hr) == 0) {
            proxy_forward(hr, body, rt->kind == KIND_COMPLETION);
            leave(hr);
        }
        json_decref(body);
        return;
    case KIND_FORM:
        if (read_form(hr, model, ctype, sizeof(ctype)) != 0)
            return;
        note_model_str(hr, model);
        if (admit(hr) == 0) {
            proxy_forward_form(hr, model, ctype);
            leave(hr);
        }
        return;
    }
}

void
route_request(struct handler_req *hr)
{
    serve(hr);
    if (hr->tenant_route)
        tenants_count_request(hr->ctx->tenants, hr->ctx->cfg, hr->tenant,
                              hr->reply->status);
}
