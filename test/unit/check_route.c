/* SPDX-License-Identifier: MIT */
/*
 * check_route.c - unit tests for gateway/client/route.c: which route a request
 * takes (404 and 405 with Allow, the admin listener's routes, the status
 * view there alone), the key checks (a tenant's, the [admin] one of
 * /metrics and /status.json), the body checks (413
 * before reading, 100-continue, malformed, not a JSON object), the
 * tenant's admission (429) and what is forwarded (coalescable or not,
 * the model noted for the access log).
 *
 * No socket: this test defines the functions route.c calls in reply.c
 * (they record what would be sent), proxy.c (records the forward),
 * the pool and status.c (answer as the test sets), and links the other
 * objects from an archive, from which the linker takes only the members
 * still needed, so reply.o, proxy.o, status.o and the pool's pool.o,
 * pool_models.o and pool_report.o never are (the Makefile's check_route
 * rule).
 * Every body is already in the connection's buffer when the request is
 * routed, so route.c never reads the client socket.
 */
#include <check.h>

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "alloc.h"
#include "buf.h"
#include "base/config.h"
#include "base/handler.h"
#include "http.h"
#include "base/metrics.h"
#include "fleet/pool.h"
#include "coalesce/proxy.h"
#include "wire/reply.h"
#include "client/route.h"
#include "client/status.h"
#include "base/tenant.h"
#include "util.h"
#include "testutil.h"

#define KEY_ACME "sk-acme-0123456789"
#define KEY_ADMIN "sk-admin-0123456789"
#define AUTH_ACME "Authorization: Bearer " KEY_ACME "\r\n"
#define AUTH_ADMIN "Authorization: Bearer " KEY_ADMIN "\r\n"
#define CHAT_BODY "{\"model\":\"m\",\"messages\":[]}"

/* ---- the stubs: what route.c made the reply, proxy and pool do ---- */

static struct {
    int responses;              /* reply_send, reply_*error* */
    int status;
    char type[64], code[64], message[256];
    char content_type[96];
    char body[512];
    char extra[128];            /* extra header lines, e.g. Allow */
    int retry_after_s;
    int close_unread;
    int continues;
    int gone;

    int forwards;               /* proxy_forward, proxy_forward_form */
    int form;                   /* ... the latter */
    char form_ctype[128];       /* the Content-Type it is to send */
    int coalescable;
    char model[64];             /* the forwarded body's "model" */
    size_t tenant;
    int had_pass;               /* admitted by the tenant's limits */
} seen;

/* How the stubbed pool and reply answer. */
static struct {
    int ready;                  /* pool_ready */
    int models_rc;              /* pool_models_json */
    int metrics_rc;             /* pool_render_metrics */
    int continue_rc;            /* reply_continue */
    int status_rc;              /* status_render_json */
} stub;

static void
copy(char *dst, size_t n, const char *src)
{
    snprintf(dst, n, "%s", src != NULL ? src : "");
}

static void
record(int status, const char *type, const char *code, const char *msg)
{
    seen.responses++;
    seen.status = status;
    copy(seen.type, sizeof(seen.type), type);
    copy(seen.code, sizeof(seen.code), code);
    copy(seen.message, sizeof(seen.message), msg);
}

int
reply_send(struct reply *r, int status, const char *content_type,
           const char *body, size_t len, const char *extra)
{
    (void)r;
    record(status, NULL, NULL, NULL);
    copy(seen.content_type, sizeof(seen.content_type), content_type);
    snprintf(seen.body, sizeof(seen.body), "%.*s", (int)len, body);
    copy(seen.extra, sizeof(seen.extra), extra);
    return 0;
}

int
reply_error(struct reply *r, int status, const char *type, const char *code,
            const char *message)
{
    (void)r;
    record(status, type, code, message);
    return 0;
}

int
reply_error_full(struct reply *r, int status, const char *type,
                 const char *param, const char *code, const char *message,
                 int retry_after_s)
{
    (void)r;
    (void)param;
    record(status, type, code, message);
    seen.retry_after_s = retry_after_s;
    return 0;
}

int
reply_out_of_memory(struct reply *r, const char *message)
{
    (void)r;
    record(503, "server_error", "overloaded", message);
    seen.retry_after_s = 1;
    return 0;
}

int
reply_method_not_allowed(struct reply *r, const char *allow)
{
    (void)r;
    record(405, "invalid_request_error", "method_not_allowed",
           "method not allowed on this route");
    snprintf(seen.extra, sizeof(seen.extra), "Allow: %s\r\n", allow);
    return 0;
}

int
reply_request_error(struct reply *r, int status, const char *msg)
{
    (void)r;
    record(status, NULL, NULL, msg);
    return 0;
}

void
reply_shutting_down(struct reply *r)
{
    (void)r;
    record(503, "server_error", "shutting_down", "gateway shutting down");
}

void
reply_close_unread(struct reply *r)
{
    (void)r;
    seen.close_unread++;
}

void
reply_gone(struct reply *r)
{
    (void)r;
    seen.gone++;
}

int
reply_continue(struct reply *r)
{
    (void)r;
    seen.continues++;
    return stub.continue_rc;
}

int
status_render_json(const struct handler_ctx *hctx, struct buf *out)
{
    (void)hctx;
    return stub.status_rc != 0 ? stub.status_rc
                               : buf_append_str(out, "{\"version\":\"x\"}");
}

const char *
status_page(size_t *len)
{
    static const char page[] = "<!DOCTYPE html><title>s</title>";

    *len = sizeof(page) - 1;
    return page;
}

void
proxy_forward(struct handler_req *hr, const json_t *json, int coalescable)
{
    seen.forwards++;
    seen.coalescable = coalescable;
    copy(seen.model, sizeof(seen.model),
         json_string_value(json_object_get(json, "model")));
    seen.tenant = hr->tenant;
    seen.had_pass = hr->pass != NULL;
}

void
proxy_forward_form(struct handler_req *hr, const char *model,
                   const char *content_type)
{
    seen.forwards++;
    seen.form = 1;
    copy(seen.model, sizeof(seen.model), model);
    copy(seen.form_ctype, sizeof(seen.form_ctype), content_type);
    seen.tenant = hr->tenant;
    seen.had_pass = hr->pass != NULL;
}

int
pool_ready(struct pool *p)
{
    (void)p;
    return stub.ready;
}

int
pool_models_json(struct pool *p, struct buf *out)
{
    (void)p;
    return stub.models_rc != 0 ? stub.models_rc
                               : buf_append_str(out, "{\"object\":\"list\","
                                                "\"data\":[]}");
}

int
pool_render_metrics(struct pool *p, struct buf *out)
{
    (void)p;
    (void)out;
    return stub.metrics_rc;
}

/* ---- the fixture: a server's context, and one request at a time ---- */

static struct gw_config cfg;
static struct handler_ctx ctx;
static _Atomic int draining, stopping;

/* route_raw() makes the fail_nth allocation of route_request() fail. */
static long fail_nth;

/* The last request routed: its head and what the handler noted. */
static struct {
    char raw[4096];
    struct http_request req;
    struct buf in, body;
    struct reply reply;
    struct handler_req hr;
} x;

static void
setup(void)
{
    ck_assert_int_eq(config_defaults(&cfg), 0);
    memset(&ctx, 0, sizeof(ctx));
    ctx.cfg = &cfg;
    ctx.pool = (struct pool *)&stub;    /* only the stubs see it */
    ctx.tenants = tenants_new();
    ck_assert_ptr_nonnull(ctx.tenants);
    atomic_store(&draining, 0);
    atomic_store(&stopping, 0);
    ctx.draining = &draining;
    ctx.stopping = &stopping;
    ctx.wake_fd = ctx.stop_fd = -1;
    ctx.ncpu = 1;
    memset(&seen, 0, sizeof(seen));
    memset(&stub, 0, sizeof(stub));
    stub.ready = 1;
    fail_nth = 0;
}

static void
teardown(void)
{
    tenants_free(ctx.tenants);
    config_release(&cfg);
}

/* Replace the configuration with 'text' (the loader's defaults else). */
static void
load(const char *text)
{
    char err[256];

    config_release(&cfg);
    if (config_load_text("t.conf", text, &cfg, err, sizeof(err)) != 0)
        ck_abort_msg("config: %s", err);
}

/*
 * Route the request in 'raw' (head and all of its body) as it came to
 * the API listener, or to the admin one.  'seen' is cleared first.
 */
static void
route_raw(int admin, const char *raw)
{
    size_t len = strlen(raw);
    int n;

    ck_assert_uint_lt(len, sizeof(x.raw));
    memset(&x, 0, sizeof(x));
    memcpy(x.raw, raw, len);
    n = http_parse_request(x.raw, len, sizeof(x.raw), &x.req);
    ck_assert_int_gt(n, 0);
    buf_init(&x.in, 1 << 16);
    buf_init(&x.body, 1 << 20);
    ck_assert_int_eq(buf_append(&x.in, x.raw + n, len - (size_t)n), 0);
    x.reply.keep_alive = 1;
    x.hr.ctx = &ctx;
    x.hr.req = &x.req;
    x.hr.in = &x.in;
    x.hr.body = &x.body;
    x.hr.reply = &x.reply;
    x.hr.request_id = "req-1";
    x.hr.admin = admin;
    x.hr.route = METRICS_ROUTE_OTHER;           /* as conn.c starts each one */
    x.hr.tenant = CONFIG_MAX_TENANTS;
    memset(&seen, 0, sizeof(seen));
    alloc_fail_after(fail_nth, 0);
    route_request(&x.hr);
    alloc_fail_after(0, 0);
    buf_release(&x.in);
    buf_release(&x.body);
}

/*
 * Route "METHOD PATH" with the header lines 'headers' (each ending in
 * CRLF; may be "") and, unless 'body' is NULL, 'body' with its
 * Content-Length.
 */
static void
route(int admin, const char *method, const char *path, const char *headers,
      const char *body)
{
    char raw[4096];
    int n;

    if (body != NULL)
        n = snprintf(raw, sizeof(raw), "%s %s HTTP/1.1\r\nHost: x\r\n%s"
                     "Content-Length: %zu\r\n\r\n%s", method, path, headers,
                     strlen(body), body);
    else
        n = snprintf(raw, sizeof(raw), "%s %s HTTP/1.1\r\nHost: x\r\n%s"
                     "\r\n", method, path, headers);
    ck_assert_int_lt(n, (int)sizeof(raw));
    route_raw(admin, raw);
}

/* The response was 'status' with error code 'code' (NULL: not an error). */
static void
assert_answered(int status, const char *code)
{
    ck_assert_int_eq(seen.forwards, 0);
    ck_assert_int_eq(seen.responses, 1);
    ck_assert_int_eq(seen.status, status);
    if (code != NULL)
        ck_assert_str_eq(seen.code, code);
}

static void
assert_forwarded(int coalescable)
{
    ck_assert_int_eq(seen.responses, 0);
    ck_assert_int_eq(seen.forwards, 1);
    ck_assert_int_eq(seen.coalescable, coalescable);
}

/* ---- the route table ---- */

#define FORWARD 0               /* want: proxy_forward, not a response */

static const struct route_case {
    const char *method, *path;
    int admin;                  /* came to the admin listener */
    enum metrics_route route;   /* hr->route after (the access log's) */
    int status;                 /* FORWARD, or the response's */
    int coalescable;            /* FORWARD: what proxy_forward was told */
    const char *allow;          /* 405: the Allow line */
    const char *note;
} routes[] = {
    { "POST", "/v1/chat/completions", 0, METRICS_ROUTE_CHAT, FORWARD, 1, NULL,
      "chat completions may coalesce" },
    { "POST", "/v1/completions", 0, METRICS_ROUTE_COMPLETIONS, FORWARD, 1,
      NULL, "completions may coalesce" },
    { "POST", "/v1/embeddings", 0, METRICS_ROUTE_EMBEDDINGS, FORWARD, 0, NULL,
      "embeddings never coalesce" },
    { "POST", "/v1/chat/completions?x=1", 0, METRICS_ROUTE_CHAT, FORWARD, 1,
      NULL, "the query is not part of the path" },
    { "POST", "/v1/responses", 0, METRICS_ROUTE_RESPONSES, FORWARD, 0, NULL,
      "the Responses API keeps state upstream: never coalesced" },
    { "POST", "/tokenize", 0, METRICS_ROUTE_TOKENIZE, FORWARD, 0, NULL,
      "tokenize" },
    { "POST", "/detokenize", 0, METRICS_ROUTE_DETOKENIZE, FORWARD, 0, NULL,
      "detokenize" },
    { "POST", "/v1/rerank", 0, METRICS_ROUTE_RERANK, FORWARD, 0, NULL,
      "rerank" },
    { "POST", "/rerank", 0, METRICS_ROUTE_RERANK, FORWARD, 0, NULL,
      "rerank, vLLM's first path" },
    { "POST", "/v2/rerank", 0, METRICS_ROUTE_RERANK, FORWARD, 0, NULL,
      "rerank, Cohere's v2 path" },
    { "POST", "/v1/score", 0, METRICS_ROUTE_SCORE, FORWARD, 0, NULL,
      "score" },
    { "POST", "/score", 0, METRICS_ROUTE_SCORE, FORWARD, 0, NULL,
      "score, vLLM's other path" },
    { "POST", "/pooling", 0, METRICS_ROUTE_POOLING, FORWARD, 0, NULL,
      "pooling" },
    { "GET", "/v1/responses", 0, METRICS_ROUTE_RESPONSES, 405, 0,
      "Allow: POST\r\n", "a stored response is not fetched through us" },
    { "POST", "/v1/responses", 1, METRICS_ROUTE_OTHER, 404, 0, NULL,
      "no responses on the admin listener" },
    { "GET", "/v1/audio/transcriptions", 0, METRICS_ROUTE_TRANSCRIPTIONS,
      405, 0, "Allow: POST\r\n", "an upload is POSTed" },
    { "GET", "/v1/models", 0, METRICS_ROUTE_MODELS, 200, 0, NULL,
      "models from the pool" },
    { "GET", "/healthz", 0, METRICS_ROUTE_HEALTHZ, 200, 0, NULL, "health" },
    { "GET", "/readyz", 0, METRICS_ROUTE_READYZ, 200, 0, NULL, "ready" },
    { "GET", "/metrics", 0, METRICS_ROUTE_METRICS, 200, 0, NULL, "metrics" },
    { "GET", "/healthz", 1, METRICS_ROUTE_HEALTHZ, 200, 0, NULL,
      "health on the admin listener" },
    { "GET", "/readyz", 1, METRICS_ROUTE_READYZ, 200, 0, NULL,
      "ready on the admin listener" },
    { "GET", "/metrics", 1, METRICS_ROUTE_METRICS, 200, 0, NULL,
      "metrics on the admin listener" },

    { "POST", "/v1/chat/completions", 1, METRICS_ROUTE_OTHER, 404, 0, NULL,
      "no completions on the admin listener" },
    { "GET", "/v1/models", 1, METRICS_ROUTE_OTHER, 404, 0, NULL,
      "no models on the admin listener" },
    { "GET", "/", 0, METRICS_ROUTE_OTHER, 404, 0, NULL, "no root route" },
    { "GET", "/healthz/", 0, METRICS_ROUTE_OTHER, 404, 0, NULL,
      "a trailing slash is another path" },
    { "POST", "/v1/chat/completion", 0, METRICS_ROUTE_OTHER, 404, 0, NULL,
      "a prefix is another path" },
    { "POST", "/v1/chat/completionsX", 0, METRICS_ROUTE_OTHER, 404, 0, NULL,
      "a longer path is another path" },
    { "GET", "/V1/models", 0, METRICS_ROUTE_OTHER, 404, 0, NULL,
      "paths are case-sensitive" },

    { "GET", "/v1/chat/completions", 0, METRICS_ROUTE_CHAT, 405, 0,
      "Allow: POST\r\n", "completions are POSTed" },
    { "PUT", "/v1/embeddings", 0, METRICS_ROUTE_EMBEDDINGS, 405, 0,
      "Allow: POST\r\n", "nor PUT" },
    { "post", "/v1/completions", 0, METRICS_ROUTE_COMPLETIONS, 405, 0,
      "Allow: POST\r\n", "methods are case-sensitive (RFC 9110 9.1)" },
    { "POST", "/healthz", 0, METRICS_ROUTE_HEALTHZ, 405, 0,
      "Allow: GET, HEAD\r\n", "health is a GET (or HEAD)" },
    { "HEAD", "/v1/models", 0, METRICS_ROUTE_MODELS, 200, 0, NULL,
      "HEAD is a GET without the body (RFC 9110 9.3.2)" },
    { "HEAD", "/healthz", 1, METRICS_ROUTE_HEALTHZ, 200, 0, NULL,
      "HEAD on the admin listener" },
    { "HEAD", "/v1/chat/completions", 0, METRICS_ROUTE_CHAT, 405, 0,
      "Allow: POST\r\n", "HEAD is no POST" },
    { "DELETE", "/metrics", 1, METRICS_ROUTE_METRICS, 405, 0,
      "Allow: GET, HEAD\r\n", "the admin listener checks the method too" },

    { "GET", "/status.json", 1, METRICS_ROUTE_STATUS, 200, 0, NULL,
      "the status view on the admin listener" },
    { "GET", "/status", 1, METRICS_ROUTE_STATUS, 200, 0, NULL,
      "its page on the admin listener" },
    { "GET", "/status.json", 0, METRICS_ROUTE_OTHER, 404, 0, NULL,
      "the status view is never on an API port" },
    { "GET", "/status", 0, METRICS_ROUTE_OTHER, 404, 0, NULL,
      "nor its page" },
    { "POST", "/status.json", 1, METRICS_ROUTE_STATUS, 405, 0,
      "Allow: GET, HEAD\r\n", "the status view is a GET" },
    { "GET", "/status/", 1, METRICS_ROUTE_OTHER, 404, 0, NULL,
      "a trailing slash is another path there too" },
};

START_TEST(test_route_table)
{
    const struct route_case *c = &routes[_i];
    int post = strcmp(c->method, "POST") == 0;

    route(c->admin, c->method, c->path, "", post ? CHAT_BODY : NULL);
    ck_assert_msg(x.hr.route == c->route, "%s: route %d, want %d", c->note,
                  (int)x.hr.route, (int)c->route);
    if (c->status == FORWARD) {
        ck_assert_msg(seen.forwards == 1, "%s: not forwarded", c->note);
        assert_forwarded(c->coalescable);
        ck_assert_str_eq(seen.model, "m");
        return;
    }
    ck_assert_msg(seen.status == c->status, "%s: status %d, want %d",
                  c->note, seen.status, c->status);
    assert_answered(c->status, NULL);
    if (c->status == 404) {
        ck_assert_str_eq(seen.code, "not_found");
        ck_assert_str_eq(seen.message, c->admin
                         ? "no such route on the admin listener"
                         : "no such route");
    }
    if (c->allow != NULL)
        ck_assert_str_eq(seen.extra, c->allow);
}
END_TEST

/*
 * An answer before the body was read must close the connection: the
 * unread bytes would be taken for the next request.
 */
START_TEST(test_unread_body_closes)
{
    route(0, "POST", "/nowhere", "", "{}");
    assert_answered(404, "not_found");
    ck_assert_int_eq(seen.close_unread, 1);
    route(0, "GET", "/nowhere", "", NULL);
    assert_answered(404, "not_found");
    ck_assert_int_eq(seen.close_unread, 0);

    route(0, "POST", "/v1/models", "", "{}");
    assert_answered(405, NULL);
    ck_assert_int_eq(seen.close_unread, 1);
    route(0, "PUT", "/v1/models", "", NULL);
    assert_answered(405, NULL);
    ck_assert_int_eq(seen.close_unread, 0);

    /* Read, then answered: the connection may stay. */
    route(0, "POST", "/v1/chat/completions", "", "[]");
    assert_answered(400, "invalid_json");
    ck_assert_int_eq(seen.close_unread, 0);
}
END_TEST

/* ---- audio uploads: multipart/form-data ---- */

#define FORM_CT "Content-Type: multipart/form-data; boundary=XyZ\r\n"
#define FORM_PART(name, value)                                          \
    "--XyZ\r\nContent-Disposition: form-data; name=\"" name "\"\r\n\r\n"  \
    value "\r\n"
#define FORM(model) FORM_PART("file", "RIFF") FORM_PART("model", model)    \
    "--XyZ--\r\n"

static const struct form_case {
    const char *path;
    const char *headers;        /* with the Content-Type, if any */
    const char *body;
    int status;                 /* FORWARD, or the 400's */
    const char *want;           /* FORWARD: the model; else the code */
    const char *ctype;          /* FORWARD: the Content-Type sent on */
    const char *note;
} form_cases[] = {
    { "/v1/audio/transcriptions", FORM_CT, FORM("whisper-1"), FORWARD,
      "whisper-1", "multipart/form-data; boundary=XyZ", "a transcription" },
    { "/v1/audio/translations", FORM_CT, FORM("whisper-1"), FORWARD,
      "whisper-1", "multipart/form-data; boundary=XyZ", "a translation" },
    { "/v1/audio/transcriptions",
      "Content-Type: Multipart/Form-Data; charset=x; boundary=\"XyZ\"\r\n",
      FORM("m"), FORWARD, "m", "multipart/form-data; boundary=XyZ",
      "the type sent on is rebuilt from the boundary that split the body" },
    { "/v1/audio/transcriptions",
      "Content-Type: multipart/form-data; boundary=\"a:b\"\r\n",
      "--a:b\r\nContent-Disposition: form-data; name=model\r\n\r\nm\r\n"
      "--a:b--", FORWARD, "m", "multipart/form-data; boundary=\"a:b\"",
      "a boundary that is no token stays quoted" },
    { "/v1/audio/transcriptions", "", FORM("m"), 400, "invalid_multipart",
      NULL, "no Content-Type" },
    { "/v1/audio/transcriptions", "Content-Type: application/json\r\n",
      "{\"model\":\"m\"}", 400, "invalid_multipart", NULL, "JSON" },
    { "/v1/audio/transcriptions",
      "Content-Type: multipart/form-data\r\n", FORM("m"), 400,
      "invalid_multipart", NULL, "no boundary" },
    { "/v1/audio/transcriptions", FORM_CT,
      FORM_PART("file", "RIFF") "--XyZ--\r\n", 400, "missing_model", NULL,
      "no model field" },
    { "/v1/audio/transcriptions", FORM_CT, FORM_PART("model", "a") FORM("b"),
      400, "invalid_multipart", NULL, "the model twice" },
    { "/v1/audio/transcriptions", FORM_CT, FORM_PART("model", "m"), 400,
      "invalid_multipart", NULL, "no closing boundary" },
    { "/v1/audio/transcriptions", FORM_CT, FORM(""), 400, "invalid_model",
      NULL, "an empty model" },
    { "/v1/audio/transcriptions", FORM_CT, FORM("a b"), 400,
      "invalid_model", NULL, "a blank in the model" },
};

START_TEST(test_form_routes)
{
    const struct form_case *c = &form_cases[_i];

    route(0, "POST", c->path, c->headers, c->body);
    if (c->status == FORWARD) {
        ck_assert_msg(seen.forwards == 1 && seen.form == 1,
                      "%s: not forwarded as a form", c->note);
        ck_assert_int_eq(seen.responses, 0);
        ck_assert_str_eq(seen.model, c->want);
        ck_assert_str_eq(seen.form_ctype, c->ctype);
        ck_assert(seen.had_pass);
        ck_assert_str_eq(x.hr.model, c->want);
        return;
    }
    ck_assert_msg(seen.status == c->status, "%s: status %d", c->note,
                  seen.status);
    assert_answered(c->status, c->want);
    ck_assert_str_eq(seen.type, "invalid_request_error");
    ck_assert_int_eq(seen.close_unread, 0);     /* the body was read */
}
END_TEST

START_TEST(test_form_needs_a_tenant_key)
{
    load("[tenant acme]\napi_key = " KEY_ACME "\n");
    route(0, "POST", "/v1/audio/translations", FORM_CT, FORM("m"));
    assert_answered(401, "invalid_api_key");
    ck_assert_int_eq(seen.close_unread, 1);
    route(0, "POST", "/v1/audio/translations", AUTH_ACME FORM_CT, FORM("m"));
    ck_assert_int_eq(seen.forwards, 1);
    ck_assert_uint_eq(seen.tenant, 0);
}
END_TEST

/* ---- keys ---- */

START_TEST(test_without_tenants_everyone_is_default)
{
    route(0, "POST", "/v1/chat/completions", "", CHAT_BODY);
    assert_forwarded(1);
    ck_assert_uint_eq(seen.tenant, CONFIG_MAX_TENANTS);
    ck_assert(seen.had_pass);
    /* A key nobody configured is no reason to refuse. */
    route(0, "POST", "/v1/chat/completions", AUTH_ACME, CHAT_BODY);
    assert_forwarded(1);
    ck_assert_uint_eq(seen.tenant, CONFIG_MAX_TENANTS);
}
END_TEST

START_TEST(test_tenant_key_required)
{
    char big[128];

    load("[tenant other]\napi_key = sk-other-0123456789\n"
         "[tenant acme]\napi_key = " KEY_ACME "\n");
    route(0, "POST", "/v1/chat/completions", AUTH_ACME, CHAT_BODY);
    assert_forwarded(1);
    ck_assert_uint_eq(seen.tenant, 1);
    ck_assert_uint_eq(x.hr.tenant, 1);

    route(0, "POST", "/v1/chat/completions", "", CHAT_BODY);
    assert_answered(401, "invalid_api_key");
    ck_assert_str_eq(seen.type, "authentication_error");
    ck_assert_int_eq(seen.close_unread, 1);
    route(0, "POST", "/v1/embeddings",
          "Authorization: Bearer sk-wrong-0123456789\r\n", CHAT_BODY);
    assert_answered(401, "invalid_api_key");
    route(0, "GET", "/v1/models", "", NULL);
    assert_answered(401, "invalid_api_key");
    ck_assert_int_eq(seen.close_unread, 0);

    /* Checked before the body: a stranger's oversized body gets the 401,
     * not the 413 that would mean it was looked at. */
    snprintf(big, sizeof(big), "POST /v1/chat/completions HTTP/1.1\r\n"
             "Host: x\r\nContent-Length: %lld\r\n\r\n",
             (long long)cfg.max_request_body + 1);
    route_raw(0, big);
    assert_answered(401, "invalid_api_key");

    /* Health needs no key. */
    route(0, "GET", "/healthz", "", NULL);
    assert_answered(200, NULL);
}
END_TEST

/* Who may read /metrics (route.c's metrics_allowed()). */
static const struct metrics_case {
    const char *conf;
    int admin;                  /* asked on the admin listener */
    const char *auth;           /* header line, or "" */
    int status;
    const char *note;
} metrics_cases[] = {
    { "", 0, "", 200, "no tenants, no [admin] key: open" },
    { "", 1, "", 200, "the same on the admin listener" },
    { "[tenant acme]\napi_key = " KEY_ACME "\n", 0, "", 401,
      "tenants: the API port asks for a key" },
    { "[tenant acme]\napi_key = " KEY_ACME "\n", 0, AUTH_ACME, 401,
      "and a tenant's key is not an [admin] one" },
    { "[tenant acme]\napi_key = " KEY_ACME "\n", 1, "", 200,
      "tenants but no [admin] key: the admin listener is open" },
    { "[admin]\napi_key = " KEY_ADMIN "\n", 0, "", 401,
      "an [admin] key: asked on the API port" },
    { "[admin]\napi_key = " KEY_ADMIN "\n", 0, AUTH_ADMIN, 200,
      "and given" },
    { "[admin]\napi_key = " KEY_ADMIN "\n", 1, "", 401,
      "an [admin] key: asked on the admin listener too" },
    { "[admin]\napi_key = " KEY_ADMIN "\n", 1, AUTH_ACME, 401,
      "a wrong key on the admin listener" },
    { "[tenant acme]\napi_key = " KEY_ACME "\n[admin]\napi_key = " KEY_ADMIN
      "\n", 1, AUTH_ADMIN, 200, "tenants and [admin]: the admin key" },
    { "[tenant acme]\napi_key = " KEY_ACME "\n[admin]\napi_key = " KEY_ADMIN
      "\n", 0, AUTH_ACME, 401, "tenants and [admin]: a tenant's key" },
};

START_TEST(test_metrics_allowed)
{
    const struct metrics_case *c = &metrics_cases[_i];

    load(c->conf);
    route(c->admin, "GET", "/metrics", c->auth, NULL);
    ck_assert_msg(seen.status == c->status, "%s: status %d, want %d",
                  c->note, seen.status, c->status);
    assert_answered(c->status, c->status == 401 ? "invalid_api_key" : NULL);
    if (c->status == 200)
        ck_assert_ptr_nonnull(strstr(seen.body, "infergw_"));
}
END_TEST

/*
 * /status.json names every tenant and flight: the same keys as /metrics
 * on the admin listener (it is served nowhere else).  The page holds no
 * data and asks for none.
 */
START_TEST(test_status_allowed)
{
    const struct metrics_case *c = &metrics_cases[_i];

    if (!c->admin)
        return;                 /* 404 there: test_route_table */
    load(c->conf);
    route(1, "GET", "/status.json", c->auth, NULL);
    ck_assert_msg(seen.status == c->status, "%s: status %d, want %d",
                  c->note, seen.status, c->status);
    assert_answered(c->status, c->status == 401 ? "invalid_api_key" : NULL);
    if (c->status == 200) {
        ck_assert_str_eq(seen.content_type, "application/json");
        ck_assert_str_eq(seen.body, "{\"version\":\"x\"}");
    }
    route(1, "GET", "/status", c->auth, NULL);
    ck_assert_int_eq(seen.status, 200);
    ck_assert_str_eq(seen.content_type, "text/html; charset=utf-8");
    ck_assert_ptr_nonnull(strstr(seen.body, "<!DOCTYPE html>"));
}
END_TEST

/* A status view that cannot be built is a 503, not a half document. */
START_TEST(test_status_fails_whole)
{
    stub.status_rc = GW_ENOMEM;
    route(1, "GET", "/status.json", "", NULL);
    stub.status_rc = 0;
    assert_answered(503, "overloaded");
}
END_TEST

/* ---- the body ---- */

/* A JSON object of exactly 'n' bytes (n >= 2) in 'out'. */
static const char *
object_of(char *out, size_t n)
{
    memset(out, ' ', n);
    out[0] = '{';
    out[n - 1] = '}';
    out[n] = '\0';
    return out;
}

START_TEST(test_body_size_limit)
{
    char body[66], raw[256];

    cfg.max_request_body = 64;
    route(0, "POST", "/v1/embeddings", "", object_of(body, 64));
    assert_forwarded(0);

    /* One byte more: refused from Content-Length alone, unread, and
     * with no 100 Continue first (RFC 9110 10.1.1: the client may wait
     * for it, and would send a body we refuse). */
    route(0, "POST", "/v1/embeddings", "Expect: 100-continue\r\n",
          object_of(body, 65));
    assert_answered(413, NULL);
    ck_assert_int_eq(seen.close_unread, 1);
    ck_assert_int_eq(seen.continues, 0);

    /* A chunked body has no length up front: refused once it is past. */
    snprintf(raw, sizeof(raw), "POST /v1/embeddings HTTP/1.1\r\nHost: x\r\n"
             "Transfer-Encoding: chunked\r\n\r\n41\r\n%s\r\n0\r\n\r\n",
             object_of(body, 65));
    route_raw(0, raw);
    assert_answered(413, NULL);
    snprintf(raw, sizeof(raw), "POST /v1/embeddings HTTP/1.1\r\nHost: x\r\n"
             "Transfer-Encoding: chunked\r\n\r\n40\r\n%s\r\n0\r\n\r\n",
             object_of(body, 64));
    route_raw(0, raw);
    assert_forwarded(0);
}
END_TEST

static const struct body_case {
    const char *raw;
    int status;
    const char *note;
} body_cases[] = {
    { "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: "
      "chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", FORWARD, "a chunked body" },
    { "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: "
      "chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n", 400, "a malformed chunk size" },
    { "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n"
      "\r\n{", 400, "not valid JSON" },
    { "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
      "\r\n[]", 400, "an array, not an object" },
    { "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n"
      "\r\n", 400, "an empty body" },
    { "POST /v1/completions HTTP/1.1\r\nHost: x\r\n\r\n", 400, "no body" },
    { "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 15\r\n"
      "\r\n{\"a\":1,\"a\":2}  ", 400, "a duplicate key" },
};

START_TEST(test_body_must_be_a_json_object)
{
    const struct body_case *c = &body_cases[_i];

    route_raw(0, c->raw);
    if (c->status == FORWARD) {
        assert_forwarded(1);
        return;
    }
    ck_assert_msg(seen.status == c->status, "%s: status %d, want %d",
                  c->note, seen.status, c->status);
    assert_answered(c->status, NULL);
}
END_TEST

START_TEST(test_expect_continue)
{
    /* The body came with the head: no 100 is needed. */
    route(0, "POST", "/v1/chat/completions", "Expect: 100-continue\r\n",
          CHAT_BODY);
    assert_forwarded(1);
    ck_assert_int_eq(seen.continues, 0);

    /* Nothing yet: the 100 goes out first; a client gone on it ends the
     * request with no answer. */
    stub.continue_rc = GW_ECLOSED;
    route_raw(0, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
              "Expect: 100-continue\r\nContent-Length: 10\r\n\r\n");
    ck_assert_int_eq(seen.continues, 1);
    ck_assert_int_eq(seen.gone, 1);
    ck_assert_int_eq(seen.responses, 0);
    ck_assert_int_eq(seen.forwards, 0);

    /* A GET has no body to wait for. */
    route(0, "GET", "/healthz", "Expect: 100-continue\r\n", NULL);
    ck_assert_int_eq(seen.continues, 0);
    assert_answered(200, NULL);
}
END_TEST

/*
 * Make each allocation in turn fail (common/alloc): the body buffer's
 * and the tenant's entry's.  Each is a 503 "overloaded" with nothing
 * forwarded, and the first that does not fail forwards.
 */
START_TEST(test_out_of_memory)
{
    int body_nomem = 0, tenant_nomem = 0;
    long n;

    for (n = 1;; n++) {
        ck_assert_int_lt(n, 100);
        tenants_free(ctx.tenants);      /* its entry is allocated again */
        ctx.tenants = tenants_new();
        ck_assert_ptr_nonnull(ctx.tenants);
        fail_nth = n;
        route(0, "POST", "/v1/chat/completions", "", CHAT_BODY);
        fail_nth = 0;
        if (seen.forwards == 1)
            break;
        assert_answered(503, "overloaded");
        ck_assert_str_eq(seen.type, "server_error");
        if (strcmp(seen.message, "out of memory reading the request body")
            == 0) {
            body_nomem++;
            ck_assert_int_eq(x.reply.keep_alive, 0);
        } else {
            ck_assert_str_eq(seen.message, "out of memory");
            tenant_nomem++;
        }
    }
    ck_assert_int_ge(body_nomem, 1);
    ck_assert_int_ge(tenant_nomem, 1);
}
END_TEST

/* ---- the model noted for the access log ---- */

static const struct model_case {
    const char *body;
    const char *noted;
} model_cases[] = {
    { "{\"model\":\"gpt-4o-mini\"}", "gpt-4o-mini" },
    { "{\"model\":\"a b\\\"c\\u00e9\\u0001\"}", "a_b_c___" },
    { "{\"model\":7}", "" },
    { "{\"messages\":[]}", "" },
    { "{\"model\":\"0123456789012345678901234567890123456789012345678901234567"
      "890123456789\"}",
      "012345678901234567890123456789012345678901234567890123456789012" },
};

START_TEST(test_model_noted)
{
    const struct model_case *c = &model_cases[_i];

    route(0, "POST", "/v1/chat/completions", "", c->body);
    assert_forwarded(1);
    ck_assert_str_eq(x.hr.model, c->noted);
    ck_assert_uint_lt(strlen(x.hr.model), sizeof(x.hr.model));
}
END_TEST

/* ---- admission: the tenant's limits ---- */

START_TEST(test_max_inflight)
{
    struct tenant_entry *held;
    int wait;

    load("[tenant acme]\napi_key = " KEY_ACME "\nmax_inflight = 1\n");
    /* One request of acme's under way elsewhere. */
    ck_assert_int_eq(tenants_enter(ctx.tenants, &cfg, 0, gw_now_us(), 0, &held,
                                   &wait, NULL), TENANT_ADMITTED);
    route(0, "POST", "/v1/chat/completions", AUTH_ACME, CHAT_BODY);
    assert_answered(429, "rate_limit_exceeded");
    ck_assert_str_eq(seen.type, "requests");
    ck_assert_int_eq(seen.retry_after_s, 1);
    ck_assert_str_eq(seen.message, "tenant 'acme' has max_inflight requests "
                     "under way; try again later");
    /* The body was read: the connection may stay. */
    ck_assert_int_eq(seen.close_unread, 0);
    tenants_leave(ctx.tenants, held);

    /* Admitted now, and each forward gives its place back. */
    for (int i = 0; i < 3; i++) {
        route(0, "POST", "/v1/chat/completions", AUTH_ACME, CHAT_BODY);
        assert_forwarded(1);
        ck_assert(seen.had_pass);
        ck_assert_ptr_null(x.hr.pass);
    }
}
END_TEST

START_TEST(test_requests_per_minute)
{
    char want[128];

    load("[tenant acme]\napi_key = " KEY_ACME "\nrequests_per_minute = 1\n");
    route(0, "POST", "/v1/embeddings", AUTH_ACME, CHAT_BODY);
    assert_forwarded(0);
    route(0, "POST", "/v1/embeddings", AUTH_ACME, CHAT_BODY);
    assert_answered(429, "rate_limit_exceeded");
    /* One a minute, just spent: the next in about 60 s. */
    ck_assert_int_ge(seen.retry_after_s, 59);
    ck_assert_int_le(seen.retry_after_s, 60);
    snprintf(want, sizeof(want), "tenant 'acme' is over its "
             "requests_per_minute; try again in %d s", seen.retry_after_s);
    ck_assert_str_eq(seen.message, want);
    /* Refused requests are not forwarded, so never hold a place. */
    ck_assert_ptr_null(x.hr.pass);
}
END_TEST

/* ---- what the operator's routes answer ---- */

START_TEST(test_readyz)
{
    route(0, "GET", "/readyz", "", NULL);
    assert_answered(200, NULL);
    ck_assert_str_eq(seen.body, "{\"status\":\"ready\"}");
    stub.ready = 0;
    route(0, "GET", "/readyz", "", NULL);
    assert_answered(503, NULL);
    ck_assert_str_eq(seen.body, "{\"status\":\"no_upstream\"}");
    /* Draining says so first, whatever the pool. */
    atomic_store(&draining, 1);
    route(1, "GET", "/readyz", "", NULL);
    assert_answered(503, NULL);
    ck_assert_str_eq(seen.body, "{\"status\":\"draining\"}");
    stub.ready = 1;
    route(0, "GET", "/readyz", "", NULL);
    ck_assert_str_eq(seen.body, "{\"status\":\"draining\"}");
    /* Health stays ok while draining: the process is alive. */
    route(0, "GET", "/healthz", "", NULL);
    assert_answered(200, NULL);
    ck_assert_str_eq(seen.body, "{\"status\":\"ok\"}");
}
END_TEST

START_TEST(test_models_and_metrics_errors)
{
    route(0, "GET", "/v1/models", "", NULL);
    assert_answered(200, NULL);
    ck_assert_str_eq(seen.content_type, "application/json");
    ck_assert_str_eq(seen.body, "{\"object\":\"list\",\"data\":[]}");
    stub.models_rc = GW_ENOMEM;
    route(0, "GET", "/v1/models", "", NULL);
    assert_answered(503, "overloaded");
    ck_assert_str_eq(seen.message, "out of memory");
    stub.models_rc = GW_ETOOBIG;
    route(0, "GET", "/v1/models", "", NULL);
    assert_answered(503, "overloaded");
    ck_assert_str_eq(seen.message, "the model list is too large");

    route(0, "GET", "/metrics", "", NULL);
    assert_answered(200, NULL);
    ck_assert_str_eq(seen.content_type,
                     "text/plain; version=0.0.4; charset=utf-8");
    stub.metrics_rc = GW_ETOOBIG;
    route(0, "GET", "/metrics", "", NULL);
    assert_answered(500, "internal_error");
}
END_TEST

/* x-ratelimit-reset-* as Go's time.Duration.String() writes it: a
 * table of (microseconds, text); rounded up to the millisecond. */
static const struct {
    int64_t us;
    const char *text;
} resets[] = {
    { 0, "0s" },
    { 1, "1ms" },
    { 250000, "250ms" },
    { 999000, "999ms" },
    { 1000000, "1s" },
    { 8500000, "8.5s" },
    { 8050000, "8.05s" },
    { 8005000, "8.005s" },
    { 59999000, "59.999s" },
    { 60000000, "1m0s" },
    { 7500000000, "2h5m0s" },
};

START_TEST(test_reset_as_go_writes_it)
{
    char out[32];

    format_reset(out, sizeof(out), resets[_i].us);
    ck_assert_str_eq(out, resets[_i].text);
}
END_TEST

static TCase *
fixture(const char *name)
{
    TCase *tc = tcase(name);

    tcase_add_checked_fixture(tc, setup, teardown);
    return tc;
}

static Suite *
route_suite(void)
{
    Suite *s = suite_create("route");
    TCase *tc = fixture("table");

    tcase_add_loop_test(tc, test_route_table, 0, (int)GW_ARRAY_LEN(routes));
    tcase_add_test(tc, test_unread_body_closes);
    suite_add_tcase(s, tc);

    tc = fixture("forms");
    tcase_add_loop_test(tc, test_form_routes, 0,
                        (int)GW_ARRAY_LEN(form_cases));
    tcase_add_test(tc, test_form_needs_a_tenant_key);
    suite_add_tcase(s, tc);

    tc = fixture("keys");
    tcase_add_test(tc, test_without_tenants_everyone_is_default);
    tcase_add_test(tc, test_tenant_key_required);
    tcase_add_loop_test(tc, test_metrics_allowed, 0,
                        (int)GW_ARRAY_LEN(metrics_cases));
    tcase_add_loop_test(tc, test_status_allowed, 0,
                        (int)GW_ARRAY_LEN(metrics_cases));
    suite_add_tcase(s, tc);

    tc = fixture("body");
    tcase_add_test(tc, test_body_size_limit);
    tcase_add_loop_test(tc, test_body_must_be_a_json_object, 0,
                        (int)GW_ARRAY_LEN(body_cases));
    tcase_add_test(tc, test_expect_continue);
    tcase_add_test(tc, test_out_of_memory);
    tcase_add_loop_test(tc, test_model_noted, 0,
                        (int)GW_ARRAY_LEN(model_cases));
    suite_add_tcase(s, tc);

    tc = fixture("admission");
    tcase_add_loop_test(tc, test_reset_as_go_writes_it, 0,
                        (int)GW_ARRAY_LEN(resets));
    tcase_add_test(tc, test_max_inflight);
    tcase_add_test(tc, test_requests_per_minute);
    suite_add_tcase(s, tc);

    tc = fixture("endpoints");
    tcase_add_test(tc, test_readyz);
    tcase_add_test(tc, test_models_and_metrics_errors);
    tcase_add_test(tc, test_status_fails_whole);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    return test_run(srunner_create(route_suite()));
}
