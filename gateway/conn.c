/*
 * conn.c - one client connection: the keep-alive request loop and its
 * access log.  Design: see conn.h.
 */
#include "conn.h"

#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "alloc.h"
#include "config.h"
#include "generation.h"
#include "handler.h"
#include "log.h"
#include "net.h"
#include "reply.h"
#include "route.h"
#include "status.h"
#include "tls.h"

/* The first read is small; bigger bodies grow the buffer as needed. */
#define CONN_IN_LIMIT(cfg) ((size_t)(cfg)->max_header_size * 2 + 65536)

/* A lingering close reads at most this long, and this much, of what the
 * client still sends. */
#define LINGER_MS 2000
#define LINGER_BYTES ((size_t)64 << 20)

/* The longest X-Request-Id taken from a client; request_id also holds
 * the ones made here. */
#define CLIENT_REQUEST_ID_MAX 64
_Static_assert(CONN_REQUEST_ID_LEN <= CLIENT_REQUEST_ID_MAX,
               "request_id holds a made-up id too");

struct conn {
    const struct handler_ctx *base;     /* the server's */
    struct handler_ctx ctx;     /* the base, with this request's
                                   generation's config, upstream, pool */
    struct generation *gen;     /* held from the wait for a head to the
                                   access-log line */
    struct generation_cert *cert;   /* a TLS connection's: the
                                   certificate it shook hands with, held
                                   to the end */
    struct tls_conn *tls;       /* or NULL; while set, 'stream' goes
                                   through it */
    struct net_stream stream;   /* the client's bytes (net.h): the plain
                                   socket, or TLS; every module that
                                   reads or writes for the client gets
                                   this, and only here is it known which */
    int fd;                     /* owned */
    int admin;                  /* it came to [admin] listen */
    struct buf in;              /* bytes read, not yet parsed */
    struct buf head;            /* this request's head; req views it */
    struct buf body;            /* this request's body */
    struct http_request req;
    char request_id[CLIENT_REQUEST_ID_MAX + 1];
    struct reply reply;
    struct handler_req hr;
};

static int
valid_request_id(const char *p, size_t n)
{
    if (n == 0 || n > CLIENT_REQUEST_ID_MAX)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char ch = p[i];

        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z')
              || (ch >= '0' && ch <= '9') || ch == '.' || ch == '_'
              || ch == '-'))
            return 0;
    }
    return 1;
}

/* The client's X-Request-Id when it is sane, else a new one. */
static void
set_request_id(struct conn *c)
{
    const struct http_header *h = http_find_header(&c->req, "X-Request-Id");

    if (h != NULL && valid_request_id(h->value, h->value_len)) {
        memcpy(c->request_id, h->value, h->value_len);
        c->request_id[h->value_len] = '\0';
    } else {
        gw_random_hex(c->request_id, CONN_REQUEST_ID_LEN);
    }
    log_set_request_id(c->request_id);
}

static void
start_request(struct conn *c)
{
    struct handler_req *hr = &c->hr;

    memset(hr, 0, sizeof(*hr));
    hr->ctx = &c->ctx;
    hr->req = &c->req;
    hr->in = &c->in;
    hr->body = &c->body;
    hr->reply = &c->reply;
    hr->request_id = c->request_id;
    hr->admin = c->admin;
    hr->route = METRICS_ROUTE_OTHER;
    hr->tenant = CONFIG_MAX_TENANTS;
    hr->pass = NULL;
    hr->prompt_tokens = hr->completion_tokens = -1;
    reply_start(&c->reply, c->request_id, c->req.minor,
                c->req.keep_alive && !handler_draining(&c->ctx));
}

/*
 * An answer with an error (a status of 400 or more, or an error event
 * that ended a stream) goes into the status view's recent errors.  One
 * the upstream made is relayed as it came, without a code of ours.
 */
static void
note_error(struct conn *c)
{
    const struct reply *r = &c->reply;
    char path[96], msg[64];
    struct status_error_note n;

    if (r->status < 400 && r->error_code[0] == '\0')
        return;
    snprintf(path, sizeof(path), "%.*s", (int)c->req.path_len,
             c->req.path != NULL ? c->req.path : "");
    n.request_id = c->request_id;
    n.status = r->status;
    n.kind = r->error_code;
    n.message = r->error_msg;
    /* The parser's words quote the body near the error, which may be a
     * secret the client sent: the view keeps only what kind of error. */
    if (strcmp(r->error_code, "invalid_json") == 0)
        n.message = "body is not valid JSON";
    if (r->error_code[0] == '\0') {
        snprintf(msg, sizeof(msg), "upstream answered %d", r->status);
        n.kind = "upstream_status";
        n.message = msg;
    }
    n.upstream = c->hr.upstream;
    n.path = path;
    status_note_error(&n);
}

static void
access_log(struct conn *c)
{
    const struct handler_req *hr = &c->hr;
    const struct reply *r = &c->reply;
    int64_t us = gw_now_us() - r->start_us;
    char usage_field[64] = "";

    metrics_request(hr->route, r->status, us, r->ttfb_us);
    note_error(c);
    if (!c->ctx.cfg->access_log)
        return;
    if (hr->prompt_tokens >= 0)
        snprintf(usage_field, sizeof(usage_field),
                 " prompt_tokens=%lld completion_tokens=%lld",
                 (long long)hr->prompt_tokens,
                 (long long)hr->completion_tokens);
    log_msg(GW_LOG_INFO, "access method=%.*s path=%.*s model=%s status=%d "
            "upstream=%s attempts=%d upstream_status=%d bytes=%llu ms=%lld "
            "ttft_ms=%lld coalesce=%s%s%s%s%s",
            (int)c->req.method_len, c->req.method,
            (int)c->req.path_len, c->req.path,
            hr->model[0] != '\0' ? hr->model : "-", r->status,
            hr->upstream != NULL ? hr->upstream : "-", hr->attempts,
            r->upstream_status, (unsigned long long)r->bytes_out,
            (long long)(us / 1000),
            (long long)(r->ttfb_us >= 0 ? r->ttfb_us / 1000 : -1),
            r->role != NULL ? r->role : "-",
            hr->flight_id[0] != '\0' ? " flight=" : "",
            hr->flight_id, usage_field,
            r->broken ? " broken=1" : "");
}

/* A head that did not arrive whole: answer it (or not), then close. */
static void
head_failed(struct conn *c, int rc)
{
    /* The stop, with a head under way: say so (it may still be read). */
    int stopped = rc == GW_EABORTED && handler_stopping(&c->ctx)
                  && buf_len(&c->in) > 0;

    /* Before any byte: a quiet close (idle, drain, peer gone). */
    if (!stopped && (rc == GW_ECLOSED || rc == GW_EABORTED || rc == GW_EIO
                     || (rc == GW_ETIMEDOUT && c->req.error_status == 0)))
        return;
    gw_random_hex(c->request_id, CONN_REQUEST_ID_LEN);
    log_set_request_id(c->request_id);
    reply_start(&c->reply, c->request_id, 1, 0);
    /* What follows a bad head is unread: linger before the close. */
    reply_close_unread(&c->reply);
    if (stopped)
        reply_shutting_down(&c->reply);
    else if (rc == GW_ENOMEM)
        reply_error(&c->reply, 503, "server_error", "overloaded",
                    "out of memory reading the request");
    else
        reply_request_error(&c->reply, c->req.error_status,
                            c->req.error_msg);
    log_msg(GW_LOG_INFO, "access status=%d error=\"%s\"", c->reply.status,
            c->req.error_msg != NULL ? c->req.error_msg : "-");
    metrics_request(METRICS_ROUTE_OTHER, c->reply.status, 0, -1);
    c->hr.upstream = NULL;
    note_error(c);
}

/*
 * The configuration in force now, for the next request on this
 * connection: its generation, and the limits and timeouts it sets.
 */
static void
use_generation(struct conn *c)
{
    const struct gw_config *cfg;

    c->gen = generation_acquire(c->base->gens);
    cfg = &c->gen->cfg;
    c->ctx = *c->base;
    c->ctx.cfg = cfg;
    c->ctx.up = c->gen->up;
    c->ctx.pool = c->gen->pool;
    c->ctx.generation = c->gen->id;
    c->in.limit = CONN_IN_LIMIT(cfg);
    c->head.limit = (size_t)cfg->max_header_size;
    c->body.limit = (size_t)cfg->max_request_body;
    c->reply.send_timeout_ms = cfg->send_timeout_ms;
}

static void
drop_generation(struct conn *c)
{
    generation_release(c->base->gens, c->gen);
    c->gen = NULL;
    c->ctx.cfg = NULL;
    c->ctx.up = NULL;
    c->ctx.pool = NULL;
}

static void
serve_loop(struct conn *c)
{
    const struct gw_config *cfg;
    int rc;

    for (;;) {
        drop_generation(c);
        use_generation(c);
        cfg = c->ctx.cfg;
        buf_compact(&c->in);
        log_set_request_id(NULL);
        memset(&c->req, 0, sizeof(c->req));
        rc = http_read_head(&c->stream, &c->in, &c->head,
                            (size_t)cfg->max_header_size,
                            gw_now_ms() + cfg->idle_timeout_ms,
                            (int)cfg->header_timeout_ms, c->ctx.wake_fd,
                            c->ctx.stop_fd, &c->req);
        if (rc != 0) {
            head_failed(c, rc);
            return;
        }
        /* A reload while this connection waited: the request is new, so
         * it runs on the configuration in force now. */
        if (generation_current_id(c->base->gens) != c->gen->id) {
            drop_generation(c);
            use_generation(c);
        }
        set_request_id(c);
        start_request(c);
        route_request(&c->hr);
        access_log(c);
        if (!c->reply.keep_alive || c->reply.broken
            || handler_stopping(&c->ctx))
            return;
    }
}

/*
 * Close with request bytes still unread (an error answered before the
 * body was read): a close on unread input sends an RST, and the client's
 * kernel may then drop the answer before the client has read it (RFC
 * 9112 section 9.6).  So half-close, and read and drop what comes, until
 * the client closes, LINGER_MS pass, LINGER_BYTES have come, or the
 * process stops (nginx's lingering close).
 */
static void
linger_close(struct conn *c)
{
    int64_t deadline = gw_now_ms() + LINGER_MS;
    size_t total = 0, n;
    char sink[16384];

    shutdown(c->fd, SHUT_WR);
    while (total < LINGER_BYTES
           && net_read(c->fd, sink, sizeof(sink), deadline, c->ctx.stop_fd,
                       &n) == 0)
        total += n;
}

/*
 * A TLS client: the handshake, within tls_handshake_timeout, then every
 * byte through TLS ('stream').  A failed one closes this connection only
 * (counted in /metrics by tls.c).  Returns 0 or the failure.
 */
static int
start_tls(struct conn *c)
{
    const struct gw_config *cfg = &c->gen->cfg;
    char err[160];
    int rc;

    c->cert = generation_cert_acquire(c->base->gens, c->gen);
    rc = tls_accept(c->cert->tls, c->fd,
                    gw_now_ms() + cfg->tls_handshake_timeout_ms,
                    c->base->stop_fd, &c->tls, err, sizeof(err));
    if (rc == 0)
        tls_stream_init(&c->stream, c->tls);
    if (rc != 0)
        log_msg(GW_LOG_INFO, "tls: handshake failed error=\"%s\"%s%s%s",
                gw_strerror(rc), err[0] != '\0' ? " reason=\"" : "", err,
                err[0] != '\0' ? "\"" : "");
    return rc;
}

/* The TLS session ends (close_notify if the socket takes it now). */
static void
end_tls(struct conn *c)
{
    if (c->tls != NULL) {
        net_stream_init(&c->stream, c->fd);
        tls_close(c->tls);
        c->tls = NULL;
    }
    generation_cert_release(c->base->gens, c->cert);
    c->cert = NULL;
}

void
conn_serve(const struct handler_ctx *ctx, int fd, int tls, int admin)
{
    const struct gw_config *cfg;
    struct conn *c;
    char id[CONN_REQUEST_ID_LEN + 1];

    c = gw_calloc(1, sizeof(*c));
    if (c == NULL) {
        gw_random_hex(id, CONN_REQUEST_ID_LEN);
        log_msg(GW_LOG_ERROR, "conn: out of memory for a connection, "
                "%s req=%s", tls ? "closed" : "answered 503", id);
        if (tls)
            close(fd);          /* a plain 503 would be garbage there */
        else
            reply_refuse(fd, id, "out of memory, retry later");
        return;
    }
    c->base = ctx;
    c->fd = fd;
    net_stream_init(&c->stream, fd);
    c->admin = admin;
    use_generation(c);
    if (tls && start_tls(c) != 0) {
        end_tls(c);
        drop_generation(c);
        close(fd);
        gw_free(c);
        return;
    }
    cfg = c->ctx.cfg;
    buf_init(&c->in, CONN_IN_LIMIT(cfg));
    buf_init(&c->head, (size_t)cfg->max_header_size);
    buf_init(&c->body, (size_t)cfg->max_request_body);
    reply_init(&c->reply, &c->stream, (size_t)cfg->max_header_size + 4096,
               cfg->send_timeout_ms, ctx->stop_fd, ctx->draining);
    serve_loop(c);
    end_tls(c);                 /* before the linger: it reads raw bytes */
    if (c->reply.linger && !c->reply.broken)
        linger_close(c);
    drop_generation(c);
    close(c->fd);
    buf_release(&c->in);
    buf_release(&c->head);
    buf_release(&c->body);
    reply_release(&c->reply);
    log_set_request_id(NULL);
    gw_free(c);
}
