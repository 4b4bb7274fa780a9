/* SPDX-License-Identifier: MIT */
/*
 * conn.c - one client connection: the keep-alive request loop and its
 * access log.  Design: see conn.h.
 */
#include "client/conn.h"

#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "alloc.h"
#include "base/config.h"
#include "client/generation.h"
#include "base/handler.h"
#include "http_read.h"
#include "log.h"
#include "net.h"
#include "wire/reply.h"
#include "client/route.h"
#include "client/status.h"
#include "base/tenant.h"
#include "wire/tls.h"

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
    struct net_addr peer;       /* the socket's peer ... */
    int peer_known;             /* ... unless getpeername() failed */
    char peer_text[NET_ADDR_STRLEN];    /* 'peer' formatted, once: the
                                   usual client of every request */
    char client[NET_ADDR_STRLEN];   /* this request's client, as the
                                   access log names it (set_client()) */
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

/* Is 'a' one of the configuration's trusted_proxies? */
static int
trusted_proxy(const struct gw_config *cfg, const struct net_addr *a)
{
    for (size_t i = 0; i < cfg->num_trusted_proxies; i++)
        if (net_cidr_match(&cfg->trusted_proxies[i], a))
            return 1;
    return 0;
}

/*
 * Walk one X-Forwarded-For value, v[0..len), from its right end, the
 * way nginx's realip module with real_ip_recursive on reads it: every
 * trusted proxy's address is skipped, and the first address that is
 * not one is the client.  An empty element is skipped (RFC 9110 section
 * 5.6.1); one that is not an address (a port, a name, "unknown") ends
 * the walk with the peer: past it the list says nothing we can check.
 * OUT *who: the client, or, when every address is trusted, the
 * left-most.  Returns 1 when the walk ended, 0 to go on to the field
 * line before.
 */
static int
walk_forwarded(const struct gw_config *cfg, const char *v, size_t len,
               const struct net_addr *peer, struct net_addr *who)
{
    struct net_addr a;
    size_t end = len, start, b, e;

    for (;;) {
        for (start = end; start > 0 && v[start - 1] != ','; start--)
            ;
        for (b = start; b < end && (v[b] == ' ' || v[b] == '\t'); b++)
            ;
        for (e = end; e > b && (v[e - 1] == ' ' || v[e - 1] == '\t'); e--)
            ;
        if (b < e) {
            if (net_addr_parse(v + b, e - b, &a) != 0) {
                *who = *peer;
                return 1;
            }
            *who = a;
            if (!trusted_proxy(cfg, &a))
                return 1;
        }
        if (start == 0)
            return 0;
        end = start - 1;
    }
}

/*
 * The client of this request, for the access log: the socket's peer,
 * or, when the peer is one of trusted_proxies and 'headers' is set,
 * whom its X-Forwarded-For names (walk_forwarded()).  Several field
 * lines are one list (RFC 9110 section 5.3), so the walk goes on from
 * the last line to the first.  From any other peer the header is
 * ignored: anyone can send one.  Only the log believes it.
 */
static void
set_client(struct conn *c, int headers)
{
    const struct gw_config *cfg = c->ctx.cfg;
    const struct http_request *req = &c->req;
    struct net_addr who = c->peer;
    size_t h;

    if (!c->peer_known) {
        snprintf(c->client, sizeof(c->client), "-");
        return;
    }
    if (headers && trusted_proxy(cfg, &c->peer)) {
        for (h = req->num_headers; h-- > 0;)
            if (gw_strieq(req->headers[h].name, req->headers[h].name_len,
                          "X-Forwarded-For")
                && walk_forwarded(cfg, req->headers[h].value,
                                  req->headers[h].value_len, &c->peer,
                                  &who))
                break;
    }
    if (memcmp(&who, &c->peer, sizeof(who)) == 0)
        memcpy(c->client, c->peer_text, sizeof(c->client));
    else
        net_addr_format(&who, c->client, sizeof(c->client));
}

/*
 * The request's access line (log.h's structured event, so json gets
 * numbers as numbers).  The same fields on every line, whatever the
 * outcome, a 401 or a 429 too; what does not apply is absent ("-", or
 * null).  'us': the time since the head was in.  'error': why a head
 * could not be read, else NULL; such a head's views may point into
 * bytes since moved, so its method and path are absent too.  The path
 * never has its query: a client may put a key there.
 */
static void
write_access(struct conn *c, int64_t us, const char *error)
{
    const struct handler_req *hr = &c->hr;
    const struct gw_config *cfg = c->ctx.cfg;
    const struct reply *r = &c->reply;
    struct log_field f[19];     /* every one below */
    size_t n = 0;

    f[n++] = log_strn("method", error == NULL ? c->req.method : NULL,
                      c->req.method_len);
    f[n++] = log_strn("path", error == NULL ? c->req.path : NULL,
                      c->req.path_len);
    /* Without [tenant] sections every client is "default". */
    f[n++] = log_str("tenant", hr->tenant < CONFIG_MAX_TENANTS
                               || cfg->num_tenants == 0
                               ? tenant_name(cfg, hr->tenant) : NULL);
    f[n++] = log_str("client", c->client);
    f[n++] = log_str("model", hr->model[0] != '\0' ? hr->model : NULL);
    f[n++] = log_int("status", r->status);
    f[n++] = log_str("upstream", hr->upstream);
    f[n++] = log_int("attempts", hr->attempts);
    f[n++] = log_opt_int("upstream_status",
                         r->upstream_status > 0 ? r->upstream_status : -1);
    f[n++] = log_int("bytes", (long long)r->bytes_out);
    f[n++] = log_int("duration_ms", (long long)(us / 1000));
    f[n++] = log_opt_int("ttft_ms", r->ttfb_us >= 0
                                    ? (long long)(r->ttfb_us / 1000) : -1);
    f[n++] = log_str("role", r->role);
    if (r->cache != NULL)
        f[n++] = log_str("cache", r->cache);
    f[n++] = log_str("flight", hr->flight_id[0] != '\0' ? hr->flight_id
                                                        : NULL);
    if (hr->prompt_tokens >= 0) {
        f[n++] = log_int("prompt_tokens", (long long)hr->prompt_tokens);
        f[n++] = log_int("completion_tokens",
                         (long long)hr->completion_tokens);
    }
    if (r->broken)
        f[n++] = log_int("broken", 1);
    if (error != NULL)
        f[n++] = log_str("error", error);
    log_fields(GW_LOG_INFO, "access", f, n);
}

/*
 * An answer with an error (a status of 400 or more, or an error event
 * that ended a stream) goes into the status view's recent errors.  One
 * the upstream made is relayed as it came, without a code of ours.
 * /readyz's 503 (and /healthz's answer) is no error but the verdict a
 * balancer asks for, every second or so: noted, it would push every
 * real error out of the ring.  An error on those routes (a 405) has a
 * code and is noted.
 */
static void
note_error(struct conn *c)
{
    const struct reply *r = &c->reply;
    char path[96], msg[64];
    struct status_error_note n;
    int probe = c->hr.route == METRICS_ROUTE_READYZ
                || c->hr.route == METRICS_ROUTE_HEALTHZ;

    if (r->error_code[0] == '\0' && (r->status < 400 || probe))
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
        /* Only an upstream's answer is relayed without a code of ours;
         * should one of ours lack it, it is not blamed on an upstream. */
        snprintf(msg, sizeof(msg), "%s answered %d",
                 r->upstream_status > 0 ? "upstream" : "gateway", r->status);
        n.kind = r->upstream_status > 0 ? "upstream_status" : "";
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

    metrics_request(hr->route, hr->model, hr->stream, r->status, us,
                    r->ttfb_us);
    note_error(c);
    if (!c->ctx.cfg->access_log)
        return;
    write_access(c, us, NULL);
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
        reply_out_of_memory(&c->reply, "out of memory reading the request");
    else
        reply_request_error(&c->reply, c->req.error_status,
                            c->req.error_msg);
    /* No request to speak of: what the head gave, and the peer. */
    memset(&c->hr, 0, sizeof(c->hr));
    c->hr.tenant = CONFIG_MAX_TENANTS;
    c->hr.prompt_tokens = -1;
    set_client(c, 0);
    write_access(c, gw_now_us() - c->reply.start_us,
                 c->req.error_msg != NULL ? c->req.error_msg : "-");
    metrics_request(METRICS_ROUTE_OTHER, NULL, 0, c->reply.status, 0, -1);
    /* The head's views may point into bytes since moved or freed, so
     * the recent error has no path either. */
    c->req.path = NULL;
    c->req.path_len = 0;
    note_error(c);
}

/* OUT *a: the peer of socket 'fd'.  Returns 1, or 0 if there is none. */
static int
find_peer(int fd, struct net_addr *a)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);

    return getpeername(fd, (struct sockaddr *)&ss, &len) == 0
           && net_addr_from_sockaddr(&ss, a) == 0;
}

/*
 * The configuration in force now, for the next request on this
 * connection: its generation, and the limits and timeouts it sets.
 */
static void
use_generation(struct conn *c)
{
    const struct gw_config *cfg;

    c->gen = generation_ref_current(c->base->gens);
    cfg = &c->gen->cfg;
    c->ctx = *c->base;
    c->ctx.cfg = cfg;
    c->ctx.up = c->gen->up;
    c->ctx.pool = c->gen->pool;
    c->ctx.cluster = c->gen->cluster;
    c->ctx.generation = c->gen->id;
    c->in.limit = CONN_IN_LIMIT(cfg);
    c->head.limit = (size_t)cfg->max_header_size;
    c->body.limit = (size_t)cfg->max_request_body;
    c->reply.send_timeout_ms = cfg->send_timeout_ms;
}

static void
drop_generation(struct conn *c)
{
    generation_unref(c->base->gens, c->gen);
    c->gen = NULL;
    c->ctx.cfg = NULL;
    c->ctx.up = NULL;
    c->ctx.pool = NULL;
    c->ctx.cluster = NULL;
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
        set_client(c, 1);
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

    c->cert = generation_cert_ref(c->base->gens, c->gen);
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
    generation_cert_unref(c->base->gens, c->cert);
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
    c->peer_known = find_peer(fd, &c->peer);
    if (c->peer_known)
        net_addr_format(&c->peer, c->peer_text, sizeof(c->peer_text));
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
