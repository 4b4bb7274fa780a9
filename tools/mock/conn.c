/* SPDX-License-Identifier: MIT */
/*
 * conn.c - mock_upstream's HTTP side (conn.h): the connection threads,
 * the routing table, the counting of requests and connections, the
 * access log and the lingering close.
 *
 * Design: each connection gets a detached thread that owns a
 * heap-allocated struct conn and serves requests on it until the client
 * closes or asks to (keep-alive).  Requests are read with
 * common/http_read.c, the reader and parser the gateway uses for its own
 * clients, so every test also runs that parser against libcurl's
 * requests.
 */
#include "conn.h"

#include <inttypes.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <jansson.h>

#include "alloc.h"
#include "buf.h"
#include "control.h"
#include "http.h"
#include "http_read.h"
#include "log.h"
#include "mock.h"
#include "net.h"
#include "post.h"
#include "record.h"
#include "send.h"
#include "util.h"
#include "vllm.h"

#define MOCK_IN_LIMIT (256 * 1024)          /* read ahead of the parser */
#define MOCK_HDR_LIMIT (128 * 1024)         /* response head (big_headers) */
#define MOCK_IDLE_MS 60000          /* keep-alive wait for the next request */
#define MOCK_HEADER_MS 10000        /* a whole head, from its first byte */
#define MOCK_BODY_MS 60000          /* a whole body */
#define MOCK_LINGER_MS 1000         /* lingering close after an error */
#define MOCK_LINGER_BYTES (1024 * 1024)

/* Which route a method and path take (route_find()). */
static const struct route_def {
    const char *method;
    const char *path;
    enum route route;
    int control;                /* 1: not counted in "requests";
                                   2: a probe, counted in "probes" */
} routes[] = {
    { "POST", "/v1/chat/completions", R_CHAT, 0 },
    { "POST", "/v1/completions", R_TEXT, 0 },
    { "POST", "/v1/embeddings", R_EMBED, 0 },
    { "POST", "/v1/responses", R_RESPONSES, 0 },
    { "POST", "/tokenize", R_TOKENIZE, 0 },
    { "POST", "/detokenize", R_DETOKENIZE, 0 },
    { "POST", "/v1/rerank", R_RERANK, 0 },
    { "POST", "/rerank", R_RERANK, 0 },
    { "POST", "/v2/rerank", R_RERANK, 0 },
    { "POST", "/v1/score", R_SCORE, 0 },
    { "POST", "/score", R_SCORE, 0 },
    { "POST", "/pooling", R_POOLING, 0 },
    { "POST", "/v1/audio/transcriptions", R_TRANSCRIBE, 0 },
    { "POST", "/v1/audio/translations", R_TRANSLATE, 0 },
    { "GET", "/v1/models", R_MODELS, 2 },
    { "GET", "/health", R_HEALTH, 2 },
    { "GET", "/stats", R_STATS, 1 },
    { "POST", "/control", R_CONTROL, 1 },
    { "GET", "/metrics", R_METRICS, 1 },
    { "GET", "/recorded", R_RECORDED, 1 },
    { "POST", "/stats/reset", R_RESET, 1 },
    { "POST", "/release", R_RELEASE, 1 },
    { "POST", "/gate", R_GATE, 1 },
    { "POST", "/v1/load_lora_adapter", R_LORA_LOAD, 1 },
    { "POST", "/v1/unload_lora_adapter", R_LORA_UNLOAD, 1 },
};

/*
 * Count the connection in connections_open and connections_total, once,
 * at its first request that is not a control request: a test asking
 * /stats then sees only the connections the gateway made.
 */
static void
count_conn(struct conn *c)
{
    if (c->counted)
        return;
    c->counted = 1;
    mock_lock();
    st.connections_open++;
    st.connections_total++;
    mock_unlock();
}

/* Add 'delta' to the counter or gauge '*field' (a member of st). */
static void
count(uint64_t *field, int delta)
{
    mock_lock();
    *field += (uint64_t)(int64_t)delta;     /* wraps back for delta < 0 */
    mock_unlock();
}

/* Is the view p[0..n) exactly the C string 's' (case-sensitive)? */
static int
view_eq(const char *p, size_t n, const char *s)
{
    return strlen(s) == n && memcmp(p, s, n) == 0;
}

/*
 * One access-log line per request (-q turns them off), but for what a
 * gateway's beats ask on their own all the time (-v logs those too): its
 * health probes (GET /health, GET /v1/models) and its load scrapes (GET
 * /metrics, ten a second by default).  Under 'make run' those buried
 * the completions the demo asks you to watch.
 */
static void
access_log(const struct req *q)
{
    const struct http_request *r = q->r;
    char model[65];

    if (opt.quiet)
        return;
    if (!opt.verbose && (q->route == R_HEALTH || q->route == R_MODELS
                         || q->route == R_METRICS))
        return;
    mock_log_safe(model, sizeof(model), q->model != NULL ? q->model : "-",
                  strlen(q->model != NULL ? q->model : "-"));
    log_msg(GW_LOG_INFO, "mock: method=%.*s path=%.*s model=%s stream=%d "
            "status=%d chunks=%ld bytes=%" PRIu64 " ms=%" PRId64 "%s%s%s",
            r->method != NULL ? (int)r->method_len : 1,
            r->method != NULL ? r->method : "-",
            r->path != NULL ? (int)r->path_len : 1,
            r->path != NULL ? r->path : "-", model, q->stream, q->status,
            q->json != NULL ? q->chunks : 0L, q->bytes,
            (gw_now_us() - q->t0_us) / 1000,
            q->fault != FAULT_NONE ? " fault=" : "", mock_fault_name(q->fault),
            q->gone ? " aborted=1" : "");
}

static void
req_init(struct req *q, struct conn *c, struct http_request *r)
{
    memset(q, 0, sizeof(*q));
    q->c = c;
    q->r = r;
    q->close = !r->keep_alive;
    q->chunked = r->minor >= 1;
    q->head_only = r->method != NULL && view_eq(r->method, r->method_len,
                                                "HEAD");
    q->t0_us = gw_now_us();
}

/* Answer a head that could not be parsed; the connection then closes. */
static void
refuse(struct conn *c, struct http_request *r)
{
    struct req q;

    req_init(&q, c, r);
    q.close = 1;
    c->linger = 1;
    count_conn(c);
    count(&st.requests, 1);
    send_error(&q, r->error_status,
               r->error_msg != NULL ? r->error_msg : "bad request", NULL,
               "invalid_request");
    access_log(&q);
}

/* Which route, by path then method; sets q->allow for a 405. */
static void
route_find(struct req *q, int *control)
{
    const struct http_request *r = q->r;
    size_t i;

    q->route = R_NOT_FOUND;
    *control = 0;
    for (i = 0; i < GW_ARRAY_LEN(routes); i++) {
        if (!view_eq(r->path, r->path_len, routes[i].path))
            continue;
        *control = routes[i].control;
        if (view_eq(r->method, r->method_len, routes[i].method)) {
            q->route = routes[i].route;
        } else {
            q->route = R_BAD_METHOD;
            q->allow = routes[i].method;
        }
        return;
    }
}

/*
 * Serve one request whose head is parsed: read its body, answer it.
 * Returns 1 when the connection must close afterwards, else 0.
 */
static int
handle_request(struct conn *c, struct http_request *r)
{
    const struct http_header *h;
    struct req q;
    char rid[65];
    int control, rc;

    req_init(&q, c, r);
    h = http_find_header(r, "x-request-id");
    if (h != NULL) {
        mock_log_safe(rid, sizeof(rid), h->value, h->value_len);
        log_set_request_id(rid);
    }
    route_find(&q, &control);
    if (control == 0) {
        count_conn(c);
        mock_lock();
        st.requests++;
        if (q.route == R_CHAT || q.route == R_TEXT)
            st.completions++;
        mock_unlock();
    } else if (control == 2) {
        count(&st.probes, 1);
    }
    if (control == 0) {
        record_headers(r);
        record_request(r);
    }

    buf_reset(&c->body);
    if (r->body_kind != HTTP_BODY_NONE) {
        /* RFC 9110 10.1.1: a client that asked may wait for this. */
        if (r->expect_continue && r->minor >= 1
            && net_write_all(c->fd, "HTTP/1.1 100 Continue\r\n\r\n", 25,
                             gw_now_ms() + MOCK_SEND_MS, -1) != 0) {
            q.close = 1;
            goto out;
        }
        rc = http_read_body(&c->stream, &c->in, r, &c->body,
                            gw_now_ms() + MOCK_BODY_MS, -1);
        if (rc != 0) {
            q.close = 1;        /* the framing is lost */
            c->linger = 1;
            if (r->error_status != 0)
                send_error(&q, r->error_status,
                           r->error_msg != NULL ? r->error_msg
                                                : "bad request body",
                           NULL, "invalid_request");
            goto out;
        }
    }

    switch (q.route) {
    case R_CHAT:
    case R_TEXT:
    case R_EMBED:
    case R_RESPONSES:
    case R_TOKENIZE:
    case R_DETOKENIZE:
    case R_RERANK:
    case R_SCORE:
    case R_POOLING:
    case R_TRANSCRIBE:
    case R_TRANSLATE:
        post_answer(&q);
        break;
    case R_MODELS:
        vllm_models(&q);
        break;
    case R_HEALTH:
        vllm_health(&q);
        break;
    case R_CONTROL:
        control_set(&q);
        break;
    case R_STATS:
        control_stats(&q);
        break;
    case R_RECORDED:
        record_answer(&q);
        break;
    case R_RESET:
        control_reset(&q);
        break;
    case R_RELEASE:
        control_release(&q);
        break;
    case R_GATE:
        control_gate(&q);
        break;
    case R_BAD_METHOD:
        send_error(&q, 405, "method not allowed on this route", NULL,
                   "method_not_allowed");
        break;
    case R_METRICS:
        control_metrics(&q);
        break;
    case R_LORA_LOAD:
        vllm_load_lora(&q);
        break;
    case R_LORA_UNLOAD:
        vllm_unload_lora(&q);
        break;
    case R_NOT_FOUND:
        send_not_found(&q);
        break;
    }

out:
    access_log(&q);
    log_set_request_id(NULL);
    json_decref(q.json);
    return q.close;
}

/*
 * Close after an error answer while the client may still be sending (a
 * refused head, a body not read to its end).  Closing a socket that holds
 * unread input sends an RST, and the client's kernel may then drop our
 * answer before the client reads it (RFC 9112 section 9.6).  So half-close
 * and discard input until the client closes, MOCK_LINGER_MS pass or
 * MOCK_LINGER_BYTES arrive.
 */
static void
linger_close(int fd)
{
    int64_t deadline = gw_now_ms() + MOCK_LINGER_MS;
    char sink[4096];
    size_t n, total = 0;

    shutdown(fd, SHUT_WR);
    while (total < MOCK_LINGER_BYTES
           && net_read(fd, sink, sizeof(sink), deadline, -1, &n) == 0)
        total += n;
    close(fd);
}

static void
conn_free(struct conn *c)
{
    if (c == NULL)
        return;
    buf_release(&c->in);
    buf_release(&c->head);
    buf_release(&c->body);
    buf_release(&c->hdr);
    buf_release(&c->out);
    gw_free(c);
}

/* A connection thread: requests until close, error or idle timeout. */
static void *
conn_main(void *arg)
{
    struct conn *c = arg;
    struct http_request r;
    int rc;

    for (;;) {
        memset(&r, 0, sizeof(r));
        buf_compact(&c->in);
        rc = http_read_head(&c->stream, &c->in, &c->head, MOCK_MAX_HEAD,
                            gw_now_ms() + MOCK_IDLE_MS, MOCK_HEADER_MS, -1,
                            -1, &r);
        if (rc != 0) {
            /* A close or idle timeout between requests is no error. */
            if (r.error_status != 0)
                refuse(c, &r);
            break;
        }
        if (handle_request(c, &r) != 0)
            break;
    }
    if (c->linger)
        linger_close(c->fd);
    else
        close(c->fd);
    if (c->counted)
        count(&st.connections_open, -1);
    conn_free(c);
    return NULL;
}

void
conn_spawn(int fd, const pthread_attr_t *attr)
{
    struct conn *c;
    pthread_t tid;
    int err;

    c = gw_calloc(1, sizeof(*c));
    if (c == NULL) {
        log_msg(GW_LOG_ERROR, "mock: out of memory for a connection");
        close(fd);
        return;
    }
    c->fd = fd;
    net_stream_init(&c->stream, fd);
    buf_init(&c->in, MOCK_IN_LIMIT);
    buf_init(&c->head, MOCK_MAX_HEAD);
    buf_init(&c->body, MOCK_MAX_BODY);
    buf_init(&c->hdr, MOCK_HDR_LIMIT);
    buf_init(&c->out, MOCK_OUT_LIMIT);
    err = pthread_create(&tid, attr, conn_main, c);
    if (err != 0) {
        log_errno(GW_LOG_ERROR, err, "mock: pthread_create");
        close(fd);
        conn_free(c);
    }
}
