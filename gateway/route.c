/*
 * route.c - the route table and the checks a request passes before it is
 * forwarded: method, body framing, body is a JSON object.
 */
#include "route.h"

#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "alloc.h"
#include "coalesce.h"
#include "config.h"
#include "conn.h"
#include "jsonx.h"
#include "log.h"
#include "metrics.h"
#include "proxy.h"
#include "server.h"

enum route_kind {
    KIND_COMPLETION,        /* POST JSON object, may coalesce */
    KIND_JSON,              /* POST JSON object */
    KIND_PROXY_GET,         /* GET forwarded as is */
    KIND_HEALTHZ,
    KIND_READYZ,
    KIND_METRICS,
};

struct route_def {
    const char *path;
    const char *method;     /* also the Allow header */
    enum metrics_route id;
    enum route_kind kind;
};

static const struct route_def routes[] = {
    { "/v1/chat/completions", "POST", ROUTE_CHAT, KIND_COMPLETION },
    { "/v1/completions", "POST", ROUTE_COMPLETIONS, KIND_COMPLETION },
    { "/v1/embeddings", "POST", ROUTE_EMBEDDINGS, KIND_JSON },
    { "/v1/models", "GET", ROUTE_MODELS, KIND_PROXY_GET },
    { "/healthz", "GET", ROUTE_HEALTHZ, KIND_HEALTHZ },
    { "/readyz", "GET", ROUTE_READYZ, KIND_READYZ },
    { "/metrics", "GET", ROUTE_METRICS, KIND_METRICS },
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
send_json_status(struct conn *c, int status, const char *body)
{
    conn_send(c, status, "application/json", body, strlen(body), NULL);
}

static void
serve_metrics(struct conn *c)
{
    struct buf b;

    buf_init(&b, 4 << 20);
    if (metrics_render(&b, c->srv->cfg) == 0)
        conn_send(c, 200, "text/plain; version=0.0.4; charset=utf-8",
                  buf_ptr(&b), buf_len(&b), NULL);
    else
        conn_send_error(c, 500, "server_error", "internal_error",
                        "cannot render metrics");
    buf_release(&b);
}

/* Keep the model name for the access log (bounded, printable). */
static void
note_model(struct conn *c, const json_t *body)
{
    const char *m = json_string_value(json_object_get(body, "model"));
    size_t i;

    if (m == NULL)
        return;
    for (i = 0; m[i] != '\0' && i < sizeof(c->model) - 1; i++)
        c->model[i] = (m[i] > ' ' && m[i] < 0x7f && m[i] != '"')
                      ? m[i] : '_';
    c->model[i] = '\0';
}

/* 405 with the Allow field RFC 9110 section 15.5.6 requires. */
static void
send_405(struct conn *c, const char *allowed)
{
    char allow[64];
    struct buf b;

    snprintf(allow, sizeof(allow), "Allow: %s\r\n", allowed);
    buf_init(&b, 1024);
    if (jsonx_error_body(&b, "method not allowed on this route",
                         "invalid_request_error", NULL,
                         "method_not_allowed") == 0)
        conn_send(c, 405, "application/json", buf_ptr(&b), buf_len(&b),
                  allow);
    buf_release(&b);
}

void
route_request(struct conn *c)
{
    const struct route_def *r;
    json_t *body = NULL;
    char err[160];

    r = find_route(c->req.path, c->req.path_len);
    if (r == NULL) {
        /* An unread body would be taken for the next request: close. */
        if (c->req.body_kind != HTTP_BODY_NONE)
            c->keep_alive = 0;
        conn_send_error(c, 404, "invalid_request_error", "not_found",
                        "no such route");
        return;
    }
    c->route = r->id;
    if (strlen(r->method) != c->req.method_len
        || memcmp(r->method, c->req.method, c->req.method_len) != 0) {
        if (c->req.body_kind != HTTP_BODY_NONE)
            c->keep_alive = 0;
        send_405(c, r->method);
        return;
    }
    if (r->kind == KIND_COMPLETION || r->kind == KIND_JSON
        || r->kind == KIND_PROXY_GET) {
        /*
         * With tenants configured, a client must present one of their
         * keys; without, everyone is tenant "default".  Checked before
         * the body is read, so a stranger cannot make us buffer it.
         */
        c->tenant = coalesce_tenant(c->srv->cfg, &c->req);
        if (c->srv->cfg->num_tenants > 0 && c->tenant >= CONFIG_MAX_TENANTS) {
            if (c->req.body_kind != HTTP_BODY_NONE)
                c->keep_alive = 0;
            conn_send_error(c, 401, "authentication_error",
                            "invalid_api_key",
                            "missing or unknown API key");
            return;
        }
    }
    if (conn_read_body(c) != 0)
        return;

    switch (r->kind) {
    case KIND_HEALTHZ:
        send_json_status(c, 200, "{\"status\":\"ok\"}");
        return;
    case KIND_READYZ:
        if (server_draining(c->srv))
            send_json_status(c, 503, "{\"status\":\"draining\"}");
        else
            send_json_status(c, 200, "{\"status\":\"ready\"}");
        return;
    case KIND_METRICS:
        serve_metrics(c);
        return;
    case KIND_PROXY_GET:
        proxy_forward(c, NULL, 0);
        return;
    case KIND_COMPLETION:
    case KIND_JSON:
        if (jsonx_parse_object(buf_ptr(&c->body), buf_len(&c->body),
                               JSONX_MAX_DEPTH, &body, err,
                               sizeof(err)) != 0) {
            conn_send_error(c, 400, "invalid_request_error", "invalid_json",
                            err);
            return;
        }
        note_model(c, body);
        proxy_forward(c, body, r->kind == KIND_COMPLETION);
        json_decref(body);
        return;
    }
}
