/*
 * upstream.c - libcurl transfers to the upstreams: one call (and, when it
 * hedges, a second attempt) driven by the calling thread in its own wait,
 * over a pool of reused sessions.
 *
 * Design: a session is a libcurl multi handle with two easy handles; its
 * multi handle owns the connection cache, at most one idle connection
 * (CURLMOPT_MAXCONNECTS 1), so an idle session is one warm connection.
 * Idle sessions wait in the keep-alive cache (keepalive.h), per upstream
 * of their connection: a call to upstream i takes i's most recently used
 * one, checked quiet, or makes a new session; after the call a session
 * whose connection libcurl kept goes back under that connection's
 * upstream, and one without any is freed (its multi handle's wake-up
 * pipe is not worth keeping for nothing).  That is simpler than a share
 * handle with CURL_LOCK_DATA_CONNECT, which libcurl 7.88 documents as
 * unsafe across threads, and a connection cannot be handed from one
 * multi handle to another: 7.88 connects a socket given to it as
 * CURL_SOCKOPT_ALREADY_CONNECTED again (curl issue 10626).  What sessions
 * do share, under locks, is the DNS cache and TLS session ids (a
 * CURLSH per struct upstream).
 *
 * Every request the upstream receives is counted.  libcurl resends a
 * request by itself, once, on a fresh connection, when a reused one
 * failed before any response byte (the upstream's idle close racing the
 * send).  That is the right thing to do (the request never reached the
 * upstream), but it used to be invisible, and capped at five per easy
 * handle for its whole life (CONN_MAX_RETRIES: a pooled handle's count
 * only grows), so the sixth race was a 502.  So every call starts with
 * curl_easy_reset(), which zeroes that count, and the pre-request
 * callback (CURLOPT_PREREQFUNCTION, called right before each request is
 * sent) tells a resend from the first send and reports it
 * (upstream_opts.on_resend), so the caller counts it as a call.
 *
 * libcurl knows the sockets it opens through CURLOPT_OPENSOCKETFUNCTION
 * and CURLOPT_CLOSESOCKETFUNCTION, so a session knows its connections
 * and the upstream of each: that is how the idle one is found, polled
 * and put under the right upstream.
 *
 * The loop (upstream_perform): the thread adds its transfer to the
 * session's multi handle and waits in one poll() of its own, on the
 * sockets libcurl asks it to watch (CURLMOPT_SOCKETFUNCTION) plus two
 * more: the client's socket (a hang-up is seen at once) and the stop
 * pipe.  It wakes for socket activity, libcurl's timer
 * (CURLMOPT_TIMERFUNCTION), the next first byte or idle deadline, the
 * hedge deadline and at least once a second for the sink's on_tick, and
 * tells libcurl which socket is ready (curl_multi_socket_action()).
 * Telling it spares libcurl a poll() of its own to find out, which
 * curl_multi_perform() and curl_easy_perform() make for every read
 * (docs/BENCHMARKS.md counts the system calls per chunk).  This keeps
 * the design card's shape, one thread per connection blocking in its own
 * wait, without an event-loop core.
 *
 * Hedging: with hedge_after set, an attempt with no first body byte after
 * that long makes the loop ask the caller for a second upstream, and the
 * second easy handle runs beside the first.  The response head is held
 * (upstream.h), so nothing reaches the sink until an attempt has its first
 * body byte: that attempt wins, and the other is removed from the multi
 * handle at once (libcurl closes its connection, so the upstream sees the
 * abort).  An attempt that answers a retryable status while the other
 * still runs just ends; so does one that fails.  The sink sees one
 * response, never bytes of two.
 *
 * Options: every one is set before every transfer, after
 * curl_easy_reset() (above), so no pointer from an earlier request is
 * ever followed and no setting of an earlier upstream stays (the TLS
 * files, say).  That costs a few setopt calls, no allocation but the
 * URL's copy.
 *
 * The response head is read strictly (RFC 9112 6.3): a Content-Length
 * that is not one plain decimal or disagrees with another, one together
 * with Transfer-Encoding, a transfer coding other than chunked, a content
 * coding (the gateway asks for identity: it reads the body for usage and
 * relays it as it is labelled), a head over UP_MAX_HEAD or a line over
 * libcurl's 100 KiB: the attempt fails as the upstream's fault before any
 * byte reaches a client, and libcurl closes the connection, so nothing
 * of that response can be read as the next request's answer.
 *
 * Hot path: a transfer on a warm session makes no allocation of its own.
 * The URL and the header lines are formatted into a per-handle scratch
 * buffer that keeps its memory, and the header list is a chain of struct
 * curl_slist nodes in the attempt's struct xfer instead of
 * curl_slist_append()'s two mallocs per line.  libcurl only reads that
 * list during the transfer.  libcurl still allocates internally (it
 * copies the URL, for one).
 *
 * Timers: libcurl enforces the connect and total timeouts (set per call:
 * they are the upstream's).  The first byte timeout (to the first body
 * byte) and the idle timeout are ours, checked by the loop, which sleeps
 * no longer than the nearest of them.
 *
 * Locking: struct upstream is immutable after upstream_new() (or
 * atomic); the keep-alive cache and the share handle lock themselves.  A
 * session, its handles and the per-call struct call and struct xfer
 * belong to one thread at a time: the caller's, or the keep-alive
 * cache's while the session idles.
 */
#include "upstream.h"

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <curl/curl.h>
#include <mbedtls/platform_util.h>
#include <openssl/ssl.h>

#include "alloc.h"
#include "buf.h"
#include "config.h"
#include "keepalive.h"
#include "log.h"
#include "util.h"

/* The longest the loop sleeps: the sink's on_tick runs this often. */
#define UP_TICK_MS 1000

/* After a client socket turned out readable but not gone (its next
 * request, pipelined), how long the loop stops watching it. */
#define UP_PEER_MUTE_MS 100

/* Attempts of one call: the first and its hedge. */
#define UP_ATTEMPTS 2

/* Scratch for the URL and the request header lines (client-sized input). */
#define UP_SCRATCH_LIMIT (256 * 1024)

/* Longest Content-Type value we pass on; real ones are tens of bytes. */
#define UP_CTYPE_LIMIT 4096

/* Content-Type, Accept, Accept-Encoding, X-Request-Id, Authorization,
 * Expect. */
#define UP_MAX_LINES 6

/* The Accept sent upstream on every call: what the gateway relays. */
#define UP_ACCEPT "application/json, text/event-stream"

/*
 * Largest upstream response head we accept, like nginx's
 * proxy_buffer_size: a vLLM head is a few hundred bytes, so anything near
 * this is broken or hostile, and a 502 beats relaying it.
 */
#define UP_MAX_HEAD (32 * 1024)

struct up_handle {
    CURL *curl;
    struct buf scratch;         /* URL and header lines, NUL-separated */
    struct buf ctype;           /* final response's Content-Type value */
    char errbuf[CURL_ERROR_SIZE];   /* libcurl's detail for the last error */
};

/* Sockets one session may have open at once: its idle connection, a
 * hedge, happy eyeballs connecting over two addresses each, a resend. */
#define UP_MAX_SOCKS 8

/* A socket libcurl opened for a session, and the upstream it goes to. */
struct up_conn {
    int fd;
    size_t idx;
};

/*
 * A multi handle and its easy handles (made on first use), the sockets
 * libcurl has open and what it asked its thread to watch: sockets with
 * events, and a timer.
 */
struct up_session {
    CURLM *multi;
    struct up_handle *h[UP_ATTEMPTS];
    struct up_conn conns[UP_MAX_SOCKS];     /* open_cb to close_cb */
    int nconns;
    struct pollfd socks[UP_MAX_SOCKS];
    int nsocks;
    int64_t timer_ms;           /* when to tell libcurl its time is up;
                                   -1 none */
};

struct upstream {
    const struct gw_config *cfg;    /* borrowed, immutable */
    /* Per upstream: "Authorization: Bearer KEY" or NULL; owned, wiped
     * before free; immutable. */
    char *auth_line[CONFIG_MAX_UPSTREAMS];
    _Atomic uint64_t created;   /* handles made so far */
    struct keepalive *ka;       /* idle sessions; owned */
    CURLSH *share;              /* DNS cache and TLS session ids; owned */
    struct gw_mutex share_lock[CURL_LOCK_DATA_LAST];
};

struct call;

/* One attempt's state; lives in its struct call. */
struct xfer {
    struct call *call;
    size_t idx;                 /* which upstream */
    const struct config_upstream *up;
    struct upstream_result res;
    struct up_handle *h;
    struct curl_slist lines[UP_MAX_LINES];  /* the request's header list */
    int wipe;                   /* the scratch holds a client credential */
    int running;                /* in the multi handle */
    int lost;                   /* the other attempt won: end it */
    int64_t start_us;           /* when it was added */
    int64_t timeout_base_ms;    /* first byte timer origin; -1 not yet */
    int request_sent;           /* whole body handed to the socket */
    curl_off_t body_len;
    uint64_t rx;                /* response bytes, head and body */
    int64_t last_rx_ms;         /* when 'rx' last moved */
    int opened;                 /* sockets libcurl opened for it */
    int sends;                  /* requests sent: the first, a resend */
    int reused;                 /* the last send went on a kept
                                   connection */
    int opened_seen;            /* 'opened' at the last send */
    int leftover;               /* TLS: bytes past the answer were read
                                   off the wire: keep no connection */
    int stale;                  /* it got a 408 there: send it again */
    int restarted;              /* ... which was done (once) */

    /* The response head being read (reset by every status line). */
    int want_status_line;
    size_t head_bytes;          /* of the current head, for UP_MAX_HEAD */
    int status;
    int has_ctype;
    int has_te;                 /* Transfer-Encoding: chunked */
    int has_cl;                 /* a Content-Length, in content_length */
    int64_t content_length;
    int64_t retry_after_ms;
    int head_done;              /* the final head is in, maybe held */

    /* Set by a callback that stops the transfer; read after it ends. */
    int fail_rc;
    const char *fail_reason;
    int sink_stopped;           /* the sink said so: it reports why */
};

/* One upstream_perform(): the attempts and which one the sink hears. */
struct call {
    struct upstream *u;
    const struct upstream_request *req;
    const struct upstream_opts *opts;
    const struct upstream_sink *sink;
    struct up_session *s;
    struct xfer x[UP_ATTEMPTS];
    int n;                      /* attempts started */
    struct xfer *winner;        /* the one the sink hears; NULL yet */
    int hedge_asked;
};

static const struct upstream_opts default_opts = {
    .watch_fd = -1,
    .stop_fd = -1,
};

static size_t header_cb(char *p, size_t size, size_t n, void *arg);
static size_t write_cb(char *p, size_t size, size_t n, void *arg);
static int other_running(const struct xfer *x);

static void
handle_free(struct up_handle *h)
{
    if (h == NULL)
        return;
    curl_easy_cleanup(h->curl);         /* closes its cached connections */
    buf_release(&h->scratch);
    buf_release(&h->ctype);
    gw_free(h);
}

/* Make a handle (its options are set per call).  NULL: no memory. */
static struct up_handle *
handle_new(struct upstream *u)
{
    struct up_handle *h = gw_calloc(1, sizeof(*h));

    if (h == NULL)
        return NULL;
    buf_init(&h->scratch, UP_SCRATCH_LIMIT);
    buf_init(&h->ctype, UP_CTYPE_LIMIT);
    h->curl = curl_easy_init();
    if (h->curl == NULL) {
        handle_free(h);
        return NULL;
    }
    atomic_fetch_add_explicit(&u->created, 1, memory_order_relaxed);
    return h;
}

static curl_socket_t open_cb(void *arg, curlsocktype purpose,
                             struct curl_sockaddr *addr);
static int close_cb(void *arg, curl_socket_t fd);
static int prereq_cb(void *arg, char *ip, char *local_ip, int port,
                     int local_port);

/*
 * Reset attempt x's handle and set the options every call has: the
 * callbacks and their data, and the constant transport settings.
 * Returns 0, or GW_EINVAL (logged) when this libcurl refuses one.
 *
 * NOSIGNAL: we run on many threads; without it a resolver timeout uses
 * SIGALRM and longjmp.  TCP_NODELAY: a request is written in one go, and
 * Nagle would hold back a body sent after the head.  PROXY "": the
 * upstream is named in our config, so a stray http_proxy variable must
 * not reroute it (it also spares libcurl reading the proxy variables on
 * every transfer).  HTTP/1.1: one request per handle gains nothing from
 * HTTP/2, and 1.1 keeps the framing the same on http and https.  No
 * CURLOPT_ACCEPT_ENCODING: bodies pass through undecoded, and the
 * Accept-Encoding line is ours (prepare()).
 *
 * CURLOPT_BUFFERSIZE stays at the default 16 KiB: SSE events are far
 * smaller, and a bigger buffer per handle would only help large
 * non-streamed bodies while costing memory on every idle session.
 */
static int
handle_setup(struct call *c, struct xfer *x)
{
    CURL *e = x->h->curl;

    curl_easy_reset(e);             /* also zeroes libcurl's resend count */
    if (curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L) != CURLE_OK
        || curl_easy_setopt(e, CURLOPT_TCP_NODELAY, 1L) != CURLE_OK
        || curl_easy_setopt(e, CURLOPT_PROXY, "") != CURLE_OK
        || curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https")
           != CURLE_OK
        || curl_easy_setopt(e, CURLOPT_HTTP_VERSION,
                            (long)CURL_HTTP_VERSION_1_1) != CURLE_OK
        || curl_easy_setopt(e, CURLOPT_ERRORBUFFER, x->h->errbuf)
           != CURLE_OK
        || curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, header_cb)
           != CURLE_OK
        || curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, write_cb) != CURLE_OK
        || curl_easy_setopt(e, CURLOPT_OPENSOCKETFUNCTION, open_cb)
           != CURLE_OK
        || curl_easy_setopt(e, CURLOPT_CLOSESOCKETFUNCTION, close_cb)
           != CURLE_OK
        || curl_easy_setopt(e, CURLOPT_PREREQFUNCTION, prereq_cb)
           != CURLE_OK
        || curl_easy_setopt(e, CURLOPT_SHARE, c->u->share) != CURLE_OK
        || curl_easy_setopt(e, CURLOPT_NOPROGRESS, 1L) != CURLE_OK) {
        /* Not memory: this libcurl lacks an option we rely on. */
        log_msg(GW_LOG_ERROR, "upstream: libcurl refused an option");
        return GW_EINVAL;
    }
    /*
     * Pointer options cannot fail.  The close callback's data is the
     * session, not the attempt: libcurl keeps it with the connection,
     * which may outlive this call in the keep-alive cache.
     */
    curl_easy_setopt(e, CURLOPT_HEADERDATA, x);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, x);
    curl_easy_setopt(e, CURLOPT_PRIVATE, x);
    curl_easy_setopt(e, CURLOPT_OPENSOCKETDATA, x);
    curl_easy_setopt(e, CURLOPT_CLOSESOCKETDATA, c->s);
    curl_easy_setopt(e, CURLOPT_PREREQDATA, x);
    return 0;
}

static void
session_free(struct up_session *s)
{
    if (s == NULL)
        return;
    /* The easy handles first: they are never in the multi handle here. */
    for (int i = 0; i < UP_ATTEMPTS; i++)
        handle_free(s->h[i]);
    curl_multi_cleanup(s->multi);       /* closes its cached connections */
    gw_free(s);
}

/*
 * CURLMOPT_SOCKETFUNCTION: watch 'fd' for 'what' from now on (or no more,
 * CURL_POLL_REMOVE).  Returns 0; -1 (libcurl then fails the transfer)
 * past UP_MAX_SOCKS.
 */
static int
sock_cb(CURL *easy, curl_socket_t fd, int what, void *arg, void *sockp)
{
    struct up_session *s = arg;
    short events = 0;
    int i;

    (void)easy;
    (void)sockp;
    for (i = 0; i < s->nsocks && s->socks[i].fd != fd; i++)
        ;
    if (what == CURL_POLL_REMOVE) {
        if (i < s->nsocks)
            s->socks[i] = s->socks[--s->nsocks];
        return 0;
    }
    if (what == CURL_POLL_IN || what == CURL_POLL_INOUT)
        events |= POLLIN;
    if (what == CURL_POLL_OUT || what == CURL_POLL_INOUT)
        events |= POLLOUT;
    if (i == s->nsocks) {
        if (s->nsocks == UP_MAX_SOCKS)
            return -1;
        s->nsocks++;
        s->socks[i].fd = fd;
    }
    s->socks[i].events = events;
    return 0;
}

/* CURLMOPT_TIMERFUNCTION: libcurl wants to be told in 'ms' (-1: never). */
static int
timer_cb(CURLM *multi, long ms, void *arg)
{
    struct up_session *s = arg;

    (void)multi;
    s->timer_ms = ms < 0 ? -1 : gw_now_ms() + ms;
    return 0;
}

static struct up_session *
session_new(void)
{
    struct up_session *s = gw_calloc(1, sizeof(*s));

    if (s == NULL)
        return NULL;
    s->timer_ms = -1;
    /* One idle connection: an idle session is one warm connection. */
    s->multi = curl_multi_init();
    if (s->multi == NULL
        || curl_multi_setopt(s->multi, CURLMOPT_MAXCONNECTS, 1L) != CURLM_OK
        || curl_multi_setopt(s->multi, CURLMOPT_SOCKETFUNCTION, sock_cb)
           != CURLM_OK
        || curl_multi_setopt(s->multi, CURLMOPT_SOCKETDATA, s) != CURLM_OK
        || curl_multi_setopt(s->multi, CURLMOPT_TIMERFUNCTION, timer_cb)
           != CURLM_OK
        || curl_multi_setopt(s->multi, CURLMOPT_TIMERDATA, s) != CURLM_OK) {
        session_free(s);
        return NULL;
    }
    return s;
}

/* keepalive_drop_fn: an idle session goes, with its connection. */
static void
session_drop(void *s)
{
    session_free(s);
}

/*
 * A session for a call to upstream 'idx': an idle one with a quiet
 * connection to it (keepalive.h checks), or a new one.  NULL: no memory.
 */
static struct up_session *
session_take(struct upstream *u, size_t idx)
{
    struct up_session *s = keepalive_take(u->ka, idx);

    return s != NULL ? s : session_new();
}

/*
 * After a call ('s' stolen): keep it under the upstream of the one
 * connection libcurl kept, or free it when it kept none, or when 'keep'
 * is 0 (call_keepable()).  No transfer is in its multi handle any more.
 */
static void
session_put(struct upstream *u, struct up_session *s, int keep)
{
    if (s->nconns == 1 && keep)
        keepalive_put(u->ka, s->conns[0].idx, s, s->conns[0].fd);
    else
        session_free(s);    /* none: nothing to keep; more: cannot be */
}

/*
 * CURLOPT_OPENSOCKETFUNCTION: a socket for attempt 'arg' (a connection,
 * or one of happy eyeballs' tries), noted in its session with the
 * attempt's upstream.  CURL_SOCKET_BAD fails the connect.
 */
static curl_socket_t
open_cb(void *arg, curlsocktype purpose, struct curl_sockaddr *addr)
{
    struct xfer *x = arg;
    struct up_session *s = x->call->s;
    int fd;

    if (purpose != CURLSOCKTYPE_IPCXN || s->nconns == UP_MAX_SOCKS)
        return CURL_SOCKET_BAD;
    fd = socket(addr->family, addr->socktype | SOCK_CLOEXEC, addr->protocol);
    if (fd == -1)
        return CURL_SOCKET_BAD;         /* libcurl reports the connect */
    s->conns[s->nconns].fd = fd;
    s->conns[s->nconns].idx = x->idx;
    s->nconns++;
    x->opened++;
    return fd;
}

/* CURLOPT_CLOSESOCKETFUNCTION: libcurl is done with 'fd' ('arg': its
 * session, which outlives every one of its connections). */
static int
close_cb(void *arg, curl_socket_t fd)
{
    struct up_session *s = arg;

    for (int i = 0; i < s->nconns; i++) {
        if (s->conns[i].fd == fd) {
            s->conns[i] = s->conns[--s->nconns];
            break;
        }
    }
    return close(fd);
}

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
 * libcurl's defaults, which handle_setup()'s curl_easy_reset() restored:
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

/*
 * Set every per-request option on 'h' for 'req' to upstream 'idx'.
 * Borrows all arguments;
 * 'lines' (UP_MAX_LINES nodes, caller's storage) becomes the header list
 * and must outlive the transfer.  OUT *wipe: the scratch now holds the
 * client's credentials.  OUT *reason: static text on failure.  Returns 0,
 * GW_EINVAL, GW_ETOOBIG or GW_ENOMEM.
 */
static int
prepare(struct upstream *u, struct up_handle *h, size_t idx,
        const struct upstream_request *req, const struct upstream_opts *opts,
        struct curl_slist *lines, int *wipe, const char **reason)
{
    const struct config_upstream *up = &u->cfg->upstreams[idx];
    struct buf *b = &h->scratch;
    size_t off[UP_MAX_LINES];           /* header lines in the scratch */
    char *shared_auth = NULL;           /* u->auth_line: read-only, shared */
    size_t url_off, n = 0, i;
    const char *body;
    CURL *c = h->curl;
    int is_post;
    int rc = GW_EINVAL;

    *wipe = 0;
    *reason = NULL;
    assert(req->path != NULL && req->path[0] == '/');
    if (strcmp(req->method, "POST") == 0) {
        is_post = 1;
    } else if (strcmp(req->method, "GET") == 0) {
        is_post = 0;
    } else {
        *reason = "unsupported method";
        goto out;
    }
    if ((req->request_id != NULL && !header_value_ok(req->request_id))
        || (req->client_auth != NULL && !header_value_ok(req->client_auth))) {
        *reason = "invalid request header";
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
     * application/x-www-form-urlencoded and accept any type.
     */
    if (is_post)
        rc = scratch_add(b, &off[n++], "Content-Type: ", "application/json");
    if (rc == 0)
        rc = scratch_add(b, &off[n++], "Accept: ", UP_ACCEPT);
    /* The body is read for usage and relayed labelled as it came: no
     * content coding (a response with one is refused, header_cb()). */
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
    } else if (u->auth_line[idx] != NULL) {
        shared_auth = u->auth_line[idx];
    }

    /* The scratch no longer moves: turn offsets into the list. */
    for (i = 0; i < n; i++)
        lines[i].data = b->data + off[i];
    if (shared_auth != NULL)
        lines[n++].data = shared_auth;
    assert(n <= UP_MAX_LINES);
    for (i = 0; i < n; i++)
        lines[i].next = i + 1 < n ? &lines[i + 1] : NULL;

    rc = tls_options(up, c);
    if (rc != 0) {
        *reason = "out of memory";
        goto out;
    }
    /* CURLOPT_URL copies the string: the one setopt here that allocates. */
    rc = GW_ENOMEM;
    if (curl_easy_setopt(c, CURLOPT_URL, b->data + url_off) != CURLE_OK
        || curl_easy_setopt(c, CURLOPT_HTTPHEADER, lines) != CURLE_OK
        || curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS,
                            (long)up->connect_timeout_ms) != CURLE_OK
        || curl_easy_setopt(c, CURLOPT_TIMEOUT_MS,
                            (long)(opts->total_timeout_ms > 0
                                   ? opts->total_timeout_ms
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
    }
    /* A GET needs nothing: curl_easy_reset() made the handle one. */
    rc = 0;

out:
    if (rc == GW_ENOMEM)
        *reason = "out of memory";
    else if (rc == GW_ETOOBIG)
        *reason = "request headers too large";
    return rc;
}

/* Stop the transfer from a callback with this outcome (first one wins). */
static void
xfer_fail(struct xfer *x, int rc, const char *reason)
{
    if (x->fail_rc == 0) {
        x->fail_rc = rc;
        x->fail_reason = reason;
    }
}

/* The sink stopped the transfer with 'rc' (struct upstream_sink). */
static void
sink_stop(struct xfer *x, int rc)
{
    const char *reason;

    switch (rc) {
    case GW_EABORTED:  reason = "aborted by client side"; break;
    case GW_ENOMEM:    reason = "out of memory"; break;
    case GW_ESTOPPING: reason = "gateway shutting down"; break;
    case GW_ETOOBIG:   reason = "response too large"; break;
    default:           reason = "stopped by the gateway"; break;
    }
    xfer_fail(x, rc, reason);
    x->sink_stopped = 1;
}

/* Parse "HTTP/1.1 200 OK" (or "HTTP/2 200"): the status, or -1. */
static int
parse_status_line(const char *p, size_t n)
{
    const char *sp = memchr(p, ' ', n);
    size_t i;
    int status = 0;

    if (n < 5 || memcmp(p, "HTTP/", 5) != 0 || sp == NULL)
        return -1;
    i = (size_t)(sp - p) + 1;
    if (n - i < 3 || (n - i > 3 && p[i + 3] != ' '))
        return -1;
    for (size_t k = i; k < i + 3; k++) {
        if (p[k] < '0' || p[k] > '9')
            return -1;
        status = status * 10 + (p[k] - '0');
    }
    /* RFC 9110 15: 1xx to 5xx; "999" is not an answer we can relay. */
    return status >= 100 && status <= 599 ? status : -1;
}

int
upstream_retryable_status(int status)
{
    return status == 429 || status == 502 || status == 503 || status == 504;
}

/*
 * Retry-After as delay-seconds (RFC 9110 10.2.3), in ms; 0 when absent,
 * malformed or an HTTP-date (vLLM and its proxies send seconds).
 */
static int64_t
parse_retry_after(const char *p, size_t n)
{
    int64_t v = 0;
    size_t i;

    if (n == 0 || n > 9)
        return 0;
    for (i = 0; i < n; i++) {
        if (p[i] < '0' || p[i] > '9')
            return 0;
        v = v * 10 + (p[i] - '0');
    }
    return v * 1000 < UPSTREAM_RETRY_AFTER_MAX_MS ? v * 1000
                                                 : UPSTREAM_RETRY_AFTER_MAX_MS;
}

/* A field value: no control character but HTAB (RFC 9110 5.5). */
static int
field_value_ok(const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)p[i] < 0x20 && p[i] != '\t')
            || (unsigned char)p[i] == 0x7f)
            return 0;
    return 1;
}

/* Content-Length value: 1*DIGIT (RFC 9110 8.6), else -1. */
static int64_t
parse_length(const char *p, size_t n)
{
    int64_t v = 0;
    size_t i;

    if (n == 0)
        return -1;
    for (i = 0; i < n; i++) {
        if (p[i] < '0' || p[i] > '9' || v > (INT64_MAX - 9) / 10)
            return -1;
        v = v * 10 + (p[i] - '0');
    }
    return v;
}

/*
 * Does TLS hold bytes of attempt x's connection that nobody has read,
 * now that its answer is whole?  libcurl reads a Content-Length body no
 * further than its end, but TLS decrypts a whole record, so bytes sent
 * after the answer in the same record (a stray response) wait in
 * OpenSSL's buffer, where poll() and keepalive.h cannot see them, to be
 * read as the next request's answer.  Only OpenSSL (Debian's libcurl's
 * backend) can be asked, while the transfer runs; any other backend is
 * taken to hold some.  A plain connection holds none.
 */
static int
tls_leftover(const struct xfer *x)
{
    struct curl_tlssessioninfo *ti = NULL;

    if (strncmp(x->up->url, "https://", 8) != 0)
        return 0;
    if (curl_easy_getinfo(x->h->curl, CURLINFO_TLS_SSL_PTR, &ti) != CURLE_OK
        || ti == NULL || ti->backend != CURLSSLBACKEND_OPENSSL
        || ti->internals == NULL)
        return 1;
    return SSL_has_pending(ti->internals);
}

/*
 * CURLOPT_PREREQFUNCTION: attempt 'arg' is about to send its request, on
 * a connection new or reused.  A second time within one attempt is
 * libcurl's resend on a fresh connection (the file comment): one more
 * request for the upstream, so it is reported.  Always goes on.
 */
static int
prereq_cb(void *arg, char *ip, char *local_ip, int port, int local_port)
{
    struct xfer *x = arg;
    const struct upstream_opts *o = x->call->opts;

    (void)ip;
    (void)local_ip;
    (void)port;
    (void)local_port;
    /* Kept, unless a socket was opened for this send. */
    x->reused = x->opened == x->opened_seen;
    x->opened_seen = x->opened;
    if (++x->sends == 1)
        return CURL_PREREQFUNC_OK;
    log_msg(GW_LOG_INFO, "upstream: resent upstream=%s reason=\"reused "
            "connection closed before an answer\" id=%s", x->up->name,
            x->call->req->request_id != NULL ? x->call->req->request_id
                                             : "-");
    if (o->on_resend != NULL)
        o->on_resend(o->arg, x->idx);
    return CURL_PREREQFUNC_OK;
}

/*
 * CURLOPT_HEADERFUNCTION: libcurl hands over every line of every response
 * head, one complete line per call with its CRLF: the status line, the
 * fields, the empty line that ends the head; then again for the next head
 * after a 1xx, and finally trailer lines of a chunked body.  The empty
 * line of the final head is where on_head runs, so it precedes every
 * on_data even when the body is empty.  Returning anything but 'n' aborts
 * with CURLE_WRITE_ERROR.
 */
static size_t
header_cb(char *p, size_t size, size_t n, void *arg)
{
    struct xfer *x = arg;
    struct up_handle *h = x->h;
    const char *colon, *v, *end;
    size_t len = n, name_len;
    int64_t cl;
    int rc;

    (void)size;                         /* always 1 */
    if (x->lost)
        return 0;                       /* the other attempt won */
    x->rx += n;
    x->last_rx_ms = gw_now_ms();
    if (x->head_done)
        return n;                       /* trailers: nothing we forward */
    x->head_bytes += n;
    if (x->head_bytes > UP_MAX_HEAD) {
        xfer_fail(x, GW_EUPSTREAM, "response head too large");
        return 0;
    }
    while (len > 0 && (p[len - 1] == '\n' || p[len - 1] == '\r'))
        len--;

    if (x->want_status_line) {
        x->status = parse_status_line(p, len);
        if (x->status < 0) {
            xfer_fail(x, GW_EUPSTREAM, "bad response head");
            return 0;
        }
        x->want_status_line = 0;
        x->head_bytes = n;
        x->has_ctype = 0;
        x->has_te = 0;
        x->has_cl = 0;
        x->content_length = -1;
        x->retry_after_ms = 0;
        buf_reset(&h->ctype);
        return n;
    }

    if (len == 0) {
        /* RFC 9110 15.2: any number of 1xx heads may precede the final
         * one; each is just skipped. */
        if (x->status < 200) {
            x->want_status_line = 1;
            return n;
        }
        /* RFC 9112 6.3: both is a smuggling attempt or a broken server;
         * either way this body's end cannot be trusted. */
        if (x->has_te && x->has_cl) {
            xfer_fail(x, GW_EUPSTREAM,
                      "content-length with transfer-encoding");
            return 0;
        }
        /*
         * A 408 on a kept connection is the upstream's idle close meeting
         * our request, or a stray answer that was on its way (keepalive.h
         * polls before, but the bytes may cross the request on the wire).
         * Either way nothing more on that connection is ours: taken as
         * this request's answer, the stray would leave the real one there
         * for the next request, and every answer after it off by one.
         * Sent again on a fresh connection (attempt_restart()), once.
         */
        if (x->status == 408 && x->reused && !x->restarted) {
            x->stale = 1;
            xfer_fail(x, GW_EUPSTREAM, "408 on a kept connection");
            return 0;
        }
        /* Held until the first body byte (upstream.h). */
        x->head_done = 1;
        if ((x->has_cl && x->content_length == 0) || x->status == 204
            || x->status == 304)
            x->leftover = tls_leftover(x);      /* the answer is whole */
        x->res.status = x->status;
        x->res.retry_after_ms = x->retry_after_ms;
        if (upstream_retryable_status(x->status)
            && (x->call->opts->stop_on_retryable || other_running(x))) {
            xfer_fail(x, GW_EUPSTREAM, "retryable status");
            return 0;
        }
        return n;
    }

    colon = memchr(p, ':', len);
    if (colon == NULL)
        return n;                       /* obs-fold or junk: libcurl's call */
    name_len = (size_t)(colon - p);
    v = colon + 1;
    end = p + len;
    while (v < end && (*v == ' ' || *v == '\t'))
        v++;
    while (end > v && (end[-1] == ' ' || end[-1] == '\t'))
        end--;
    if (gw_strieq(p, name_len, "content-type")) {
        if (!field_value_ok(v, (size_t)(end - v))) {
            /* We relay this one: a CR or NUL in it would be ours. */
            xfer_fail(x, GW_EUPSTREAM, "bad response header");
            return 0;
        }
        buf_reset(&h->ctype);
        rc = buf_append(&h->ctype, v, (size_t)(end - v));
        if (rc == GW_ENOMEM) {
            xfer_fail(x, GW_ENOMEM, "out of memory");
            return 0;
        } else if (rc != 0) {
            xfer_fail(x, GW_EUPSTREAM, "response header too large");
            return 0;
        }
        x->has_ctype = 1;
    } else if (gw_strieq(p, name_len, "content-length")) {
        /* RFC 9112 6.3: one plain decimal, the same in every field.  What
         * libcurl would make of "12abc" (12) leaves the rest of the body
         * on the connection, to be read as the next answer. */
        cl = parse_length(v, (size_t)(end - v));
        if (cl < 0 || (x->has_cl && cl != x->content_length)) {
            xfer_fail(x, GW_EUPSTREAM, cl < 0 ? "bad content-length"
                                              : "conflicting content-length");
            return 0;
        }
        x->has_cl = 1;
        x->content_length = cl;
    } else if (gw_strieq(p, name_len, "transfer-encoding")) {
        /* Only "chunked", once: any other coding leaves the body's end
         * to the connection's close (RFC 9112 6.3), or to a decoder
         * nobody runs. */
        if (x->has_te || !gw_strieq(v, (size_t)(end - v), "chunked")) {
            xfer_fail(x, GW_EUPSTREAM, "unsupported transfer-encoding");
            return 0;
        }
        x->has_te = 1;
    } else if (gw_strieq(p, name_len, "content-encoding")) {
        /* We asked for identity; a gzip body relayed as JSON is garbage
         * to the client, and unreadable for the bill. */
        if (end > v && !gw_strieq(v, (size_t)(end - v), "identity")) {
            xfer_fail(x, GW_EUPSTREAM, "unsupported content-encoding");
            return 0;
        }
    } else if (gw_strieq(p, name_len, "retry-after")) {
        x->retry_after_ms = parse_retry_after(v, (size_t)(end - v));
    }
    return n;
}

/* Does another attempt of x's call still run (and may still win)? */
static int
other_running(const struct xfer *x)
{
    const struct call *c = x->call;

    for (int i = 0; i < c->n; i++)
        if (&c->x[i] != x && c->x[i].running && !c->x[i].lost)
            return 1;
    return 0;
}

/*
 * May attempt 'x' be the one the sink hears?  The first with a body byte
 * (or a complete empty body) wins, and every other is marked lost, for
 * the loop to remove.  While another attempt still runs, one with a
 * retryable status does not win: it ends and the other goes on.
 */
static int
claim_win(struct xfer *x)
{
    struct call *c = x->call;

    if (c->winner != NULL)
        return c->winner == x;
    if (other_running(x) && upstream_retryable_status(x->status)) {
        xfer_fail(x, GW_EUPSTREAM, "retryable status");
        return 0;
    }
    c->winner = x;
    for (int i = 0; i < c->n; i++)
        if (&c->x[i] != x)
            c->x[i].lost = 1;
    if (c->opts->on_winner != NULL)
        c->opts->on_winner(c->opts->arg, x->idx, x->status);
    return 1;
}

/*
 * Tell the sink of the held head (once).  Returns 0 or the sink's code,
 * with the transfer's failure noted.
 */
static int
deliver_head(struct xfer *x)
{
    const struct upstream_sink *s = x->call->sink;
    struct upstream_head head;
    int rc;

    if (x->res.head_seen)
        return 0;
    x->res.head_seen = 1;
    head.status = x->status;
    head.content_type = x->has_ctype ? buf_ptr(&x->h->ctype) : NULL;
    head.content_length = x->has_cl ? x->content_length : -1;
    head.retry_after_s = 0;
    if (x->status == 429 || x->status == 503)
        head.retry_after_s = (int)((x->retry_after_ms + 999) / 1000);
    rc = s->on_head(s->arg, &head);
    if (rc != 0)
        sink_stop(x, rc);
    return rc;
}

/*
 * CURLOPT_WRITEFUNCTION: de-chunked body bytes.  Returning anything but
 * 'n' makes libcurl stop with CURLE_WRITE_ERROR.
 */
static size_t
write_cb(char *p, size_t size, size_t n, void *arg)
{
    struct xfer *x = arg;
    const struct upstream_sink *s = x->call->sink;
    int rc;

    (void)size;                         /* always 1 */
    if (n == 0 || x->lost)
        return 0;
    x->rx += n;
    x->last_rx_ms = gw_now_ms();
    if (!x->head_done) {
        /* Cannot happen over HTTP/1.x (0.9 is refused by default); kept
         * so that on_data can never precede on_head. */
        xfer_fail(x, GW_EUPSTREAM, "bad response head");
        return 0;
    }
    if (x->res.bytes == 0) {
        x->res.ttfb_us = gw_now_us() - x->start_us;
        if (!claim_win(x) || deliver_head(x) != 0)
            return 0;
    }
    x->res.bytes += n;
    if (x->has_cl && x->res.bytes == (uint64_t)x->content_length)
        x->leftover = tls_leftover(x);          /* the answer is whole */
    rc = s->on_data(s->arg, p, n);
    if (rc != 0) {
        sink_stop(x, rc);
        return 0;
    }
    return n;
}

/*
 * Turn the libcurl outcome into our code.  OUT *reason: static text;
 * OUT *fail: the kind, for the upstream's health.  Callback-made stops
 * carry their own code and reason in 'x'.
 */
static int
map_result(struct xfer *x, CURLcode cc, const char **reason,
           enum upstream_failure *fail)
{
    curl_off_t pretransfer_us = 0;

    *fail = UPF_BROKEN;
    switch (cc) {
    case CURLE_OK:
        if (!x->head_done)
            break;                      /* ended without a final head */
        *fail = UPF_NONE;
        /* An empty body: the held head goes now, if this one may win. */
        if (!claim_win(x)) {
            *reason = x->fail_reason;
            *fail = UPF_STATUS;
            return x->fail_rc;
        }
        if (deliver_head(x) != 0) {
            *reason = x->fail_reason;
            return x->fail_rc;
        }
        *reason = "complete";
        return 0;
    case CURLE_WRITE_ERROR:             /* a header or write callback */
    case CURLE_ABORTED_BY_CALLBACK:     /* (no progress callback is set) */
        if (x->fail_rc != 0) {
            *reason = x->fail_reason;
            if (x->sink_stopped)
                *fail = UPF_NONE;
            else if (x->fail_rc == GW_ETIMEDOUT)
                *fail = UPF_TIMEOUT;
            else if (x->fail_rc == GW_ENOMEM)
                *fail = UPF_LOCAL;
            else if (x->head_done && upstream_retryable_status(x->status)
                     && !x->res.head_seen)
                *fail = UPF_STATUS;
            return x->fail_rc;
        }
        break;
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_CONNECT:
        *reason = "connect failed";
        *fail = UPF_CONNECT;
        return GW_EUPSTREAM;
    case CURLE_OPERATION_TIMEDOUT:
        /* Raised for CONNECTTIMEOUT and TIMEOUT alike; they differ in
         * whether the connection (TLS included) was ever ready. */
        curl_easy_getinfo(x->h->curl, CURLINFO_PRETRANSFER_TIME_T,
                          &pretransfer_us);
        *reason = pretransfer_us > 0 ? "total timeout" : "connect timeout";
        *fail = UPF_TIMEOUT;
        return GW_ETIMEDOUT;
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CIPHER:
    case CURLE_SSL_ISSUER_ERROR:
        *reason = "tls failed";
        *fail = UPF_CONNECT;
        return GW_EUPSTREAM;
    case CURLE_GOT_NOTHING:
        *reason = "empty reply";
        return GW_EUPSTREAM;
    case CURLE_WEIRD_SERVER_REPLY:
        *reason = "bad response head";
        return GW_EUPSTREAM;
    case CURLE_URL_MALFORMAT:
        *reason = "invalid request url";
        *fail = UPF_LOCAL;
        return GW_EINVAL;
    case CURLE_OUT_OF_MEMORY:
        /*
         * Also what libcurl 7.88 says of a response header line over its
         * 100 KiB (CURL_MAX_HTTP_HEADER), with nothing in the error
         * buffer.  Once the request is under way and the head not yet in,
         * that is by far the likelier: the upstream's fault, a 502.
         */
        curl_easy_getinfo(x->h->curl, CURLINFO_PRETRANSFER_TIME_T,
                          &pretransfer_us);
        if (pretransfer_us > 0 && !x->head_done) {
            *reason = "response head too large";
            return GW_EUPSTREAM;
        }
        *reason = "out of memory";
        *fail = UPF_LOCAL;
        return GW_ENOMEM;
    default:
        break;                          /* RECV_ERROR, PARTIAL_FILE, ... */
    }
    *reason = "connection broken";
    return GW_EUPSTREAM;
}

/* CURLSHOPT_LOCKFUNC and UNLOCKFUNC: a mutex per kind of shared data. */
static void
share_lock(CURL *e, curl_lock_data data, curl_lock_access access,
           void *arg)
{
    struct upstream *u = arg;

    (void)e;
    (void)access;                       /* shared or single: one mutex */
    gw_mutex_lock(&u->share_lock[data]);
}

static void
share_unlock(CURL *e, curl_lock_data data, void *arg)
{
    struct upstream *u = arg;

    (void)e;
    gw_mutex_unlock(&u->share_lock[data]);
}

/*
 * The share handle: the DNS cache (a session made for a burst need not
 * resolve again) and TLS session ids (a new connection to an https://
 * upstream resumes).  Returns 0 or GW_ENOMEM.
 */
static int
share_new(struct upstream *u)
{
    u->share = curl_share_init();
    if (u->share == NULL
        || curl_share_setopt(u->share, CURLSHOPT_LOCKFUNC, share_lock)
           != CURLSHE_OK
        || curl_share_setopt(u->share, CURLSHOPT_UNLOCKFUNC, share_unlock)
           != CURLSHE_OK
        || curl_share_setopt(u->share, CURLSHOPT_USERDATA, u) != CURLSHE_OK
        || curl_share_setopt(u->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS)
           != CURLSHE_OK
        || curl_share_setopt(u->share, CURLSHOPT_SHARE,
                             CURL_LOCK_DATA_SSL_SESSION) != CURLSHE_OK)
        return GW_ENOMEM;
    return 0;
}

struct upstream *
upstream_new(const struct gw_config *cfg)
{
    struct upstream *u = NULL;
    struct upstream *ret = NULL;
    const char *key;
    size_t len, i;

    assert(cfg->num_upstreams >= 1);
    u = gw_calloc(1, sizeof(*u));
    if (u == NULL)
        goto out;
    for (i = 0; i < CURL_LOCK_DATA_LAST; i++)
        gw_mutex_init(&u->share_lock[i]);       /* aborts on failure */
    u->cfg = cfg;
    for (i = 0; i < cfg->num_upstreams; i++) {
        key = cfg->upstreams[i].api_key;
        if (key == NULL || key[0] == '\0')
            continue;
        if (!header_value_ok(key)) {
            log_msg(GW_LOG_ERROR, "upstream: api_key of %s contains a "
                    "line break", cfg->upstreams[i].name);
            goto out;
        }
        /* Formatted once: every transfer points at this line. */
        len = sizeof("Authorization: Bearer ") + strlen(key);
        u->auth_line[i] = gw_malloc(len);
        if (u->auth_line[i] == NULL)
            goto out;
        snprintf(u->auth_line[i], len, "Authorization: Bearer %s", key);
    }
    if (share_new(u) != 0)
        goto out;
    u->ka = keepalive_new(cfg->num_upstreams, cfg->keepalive,
                          cfg->keepalive_timeout_ms, session_drop);
    if (u->ka == NULL)
        goto out;
    ret = u;
    u = NULL;

out:
    upstream_free(u);
    return ret;
}

void
upstream_free(struct upstream *u)
{
    size_t i;

    if (u == NULL)
        return;
    /* The sessions first: their handles hold the share. */
    keepalive_free(u->ka);
    u->ka = NULL;
    curl_share_cleanup(u->share);
    u->share = NULL;
    for (i = 0; i < CONFIG_MAX_UPSTREAMS; i++) {
        if (u->auth_line[i] == NULL)
            continue;
        mbedtls_platform_zeroize(u->auth_line[i], strlen(u->auth_line[i]));
        gw_free(u->auth_line[i]);
        u->auth_line[i] = NULL;
    }
    for (i = 0; i < CURL_LOCK_DATA_LAST; i++)
        gw_mutex_destroy(&u->share_lock[i]);
    gw_free(u);
}

static void
result_init(struct upstream_result *res, size_t idx)
{
    memset(res, 0, sizeof(*res));
    res->rc = GW_ENOMEM;
    res->reason = "out of memory";
    res->ttfb_us = -1;
    res->failure = UPF_LOCAL;
    res->upstream = idx;
}

/*
 * Attempt 'x' is over: take it out of the multi handle and settle its
 * result, from libcurl's code 'cc' or, when own_rc != 0, from ours
 * (own_reason, own_fail).  Logs a failure, unless the sink stopped it.
 */
static void
attempt_end(struct call *c, struct xfer *x, CURLcode cc, int own_rc,
            const char *own_reason, enum upstream_failure own_fail)
{
    enum upstream_failure fail = own_fail;
    const char *reason = own_reason;
    int rc = own_rc;

    curl_multi_remove_handle(c->s->multi, x->h->curl);
    x->running = 0;
    if (rc == 0)
        rc = map_result(x, cc, &reason, &fail);
    else
        cc = CURLE_OK;
    x->res.rc = rc;
    x->res.reason = reason;
    x->res.failure = fail;
    if (rc != 0 && !x->lost) {
        /* The sink reports its own reasons; everything else is ours. */
        log_msg(x->sink_stopped || fail == UPF_STATUS ? GW_LOG_INFO
                                                      : GW_LOG_WARN,
                "upstream: failed upstream=%s reason=\"%s\" error=\"%s\" "
                "curl=\"%s\" detail=\"%s\" status=%d bytes=%" PRIu64
                " path=%.*s", x->up->name, reason, gw_strerror(rc),
                cc != CURLE_OK ? curl_easy_strerror(cc) : "",
                cc != CURLE_OK ? x->h->errbuf : "", x->res.status,
                x->res.bytes, gw_log_path_len(c->req->path), c->req->path);
    }
    /* Our copy of the client's key; libcurl's copy in its own request
     * buffer is out of our reach. */
    if (x->wipe)
        mbedtls_platform_zeroize(x->h->scratch.data, x->h->scratch.cap);
}

/*
 * Attempt x's response state as before the first header line and its
 * timers as before its first send, for a new attempt or the same request
 * sent again (attempt_restart()); what it sends, and the counts of its
 * sends and sockets, stay.
 */
static void
response_reset(struct xfer *x)
{
    result_init(&x->res, x->idx);
    x->timeout_base_ms = -1;
    x->request_sent = 0;
    x->rx = 0;
    x->leftover = 0;
    x->want_status_line = 1;
    x->head_bytes = 0;
    x->status = 0;
    x->has_ctype = x->has_te = x->has_cl = 0;
    x->content_length = -1;
    x->retry_after_ms = 0;
    x->head_done = 0;
    x->fail_rc = 0;
    x->fail_reason = NULL;
    x->sink_stopped = 0;
}

/*
 * Make 'x' the next attempt of 'c', on upstream 'idx' ('up'), with its
 * response state as before the first header line.  x->h is the caller's
 * to set.
 */
static void
xfer_init(struct call *c, struct xfer *x, size_t idx,
          const struct config_upstream *up)
{
    assert(c->n < UP_ATTEMPTS && x == &c->x[c->n]);
    memset(x, 0, sizeof(*x));
    x->call = c;
    x->idx = idx;
    x->up = up;
    x->body_len = (curl_off_t)c->req->body_len;
    response_reset(x);
    c->n++;
}

/*
 * Start the next attempt of 'c' on upstream 'idx'.  Returns 0, or a code
 * with the attempt's result filled (it never ran).
 */
static int
attempt_start(struct call *c, size_t idx)
{
    struct upstream *u = c->u;
    struct xfer *x = &c->x[c->n];
    struct up_handle **hp = &c->s->h[c->n];
    const char *reason = "out of memory";
    int rc = GW_ENOMEM;

    assert(idx < u->cfg->num_upstreams);
    xfer_init(c, x, idx, &u->cfg->upstreams[idx]);
    if (*hp == NULL)
        *hp = handle_new(u);
    x->h = *hp;
    if (x->h == NULL)
        goto out;
    rc = handle_setup(c, x);
    if (rc != 0) {
        reason = "libcurl refused an option";
        goto out;
    }
    rc = prepare(u, x->h, idx, c->req, c->opts, x->lines, &x->wipe,
                 &reason);
    if (rc != 0)
        goto out;
    x->start_us = gw_now_us();
    x->last_rx_ms = x->start_us / 1000;
    rc = GW_ENOMEM;
    if (curl_multi_add_handle(c->s->multi, x->h->curl) != CURLM_OK)
        goto out;
    x->running = 1;
    rc = 0;

out:
    if (rc != 0) {
        x->res.rc = rc;
        x->res.reason = reason;
        x->res.failure = UPF_LOCAL;
        log_msg(GW_LOG_WARN, "upstream: cannot start upstream=%s "
                "reason=\"%s\" path=%.*s", x->up->name, reason,
                gw_log_path_len(c->req->path), c->req->path);
        if (x->wipe)
            mbedtls_platform_zeroize(x->h->scratch.data, x->h->scratch.cap);
    }
    return rc;
}

/*
 * The first byte and idle timers of a running attempt (the file comment's
 * "Timers").  The first byte timer starts once the connection is up
 * (pretransfer) and starts over when the whole request body has been
 * handed to the socket, so an upstream that never reads the body is
 * caught too, not only one that never answers.  It runs to the first
 * body byte: a stream's head comes at once, its first event after the
 * prompt is processed.  Then the idle timer takes over, fed by header and
 * body bytes alike.  Ends the attempt when one passes; else OUT *next is
 * lowered to when one would.
 */
static void
check_timers(struct call *c, struct xfer *x, int64_t now, int64_t *next)
{
    const struct config_upstream *up = x->up;
    curl_off_t pretransfer_us = 0, sent = 0;
    int64_t due;

    if (x->res.bytes > 0) {
        due = x->last_rx_ms + up->idle_timeout_ms;
        if (now >= due) {
            attempt_end(c, x, CURLE_OK, GW_ETIMEDOUT, "idle timeout",
                        UPF_TIMEOUT);
            return;
        }
    } else {
        if (x->timeout_base_ms < 0) {
            if (curl_easy_getinfo(x->h->curl, CURLINFO_PRETRANSFER_TIME_T,
                                  &pretransfer_us) != CURLE_OK
                || pretransfer_us <= 0)
                return;                 /* still connecting */
            x->timeout_base_ms = x->start_us / 1000 + pretransfer_us / 1000;
        }
        if (!x->request_sent
            && curl_easy_getinfo(x->h->curl, CURLINFO_SIZE_UPLOAD_T, &sent)
               == CURLE_OK
            && sent >= x->body_len) {
            x->request_sent = 1;
            x->timeout_base_ms = now;
        }
        due = x->timeout_base_ms + up->first_byte_timeout_ms;
        if (now >= due) {
            attempt_end(c, x, CURLE_OK, GW_ETIMEDOUT, "first byte timeout",
                        UPF_TIMEOUT);
            return;
        }
    }
    if (due < *next)
        *next = due;
}

/* The sink stopped the call with 'rc': end every running attempt. */
static void
stop_all(struct call *c, int rc)
{
    for (int i = 0; i < c->n; i++) {
        struct xfer *x = &c->x[i];

        if (!x->running)
            continue;
        sink_stop(x, rc);
        attempt_end(c, x, CURLE_OK, x->fail_rc, x->fail_reason, UPF_NONE);
    }
}

/* Time for a hedge?  Ask the caller for a second upstream and start it. */
static void
maybe_hedge(struct call *c, int64_t now, int64_t *next)
{
    const struct upstream_opts *o = c->opts;
    struct xfer *x0 = &c->x[0];
    int64_t due;
    size_t idx;

    if (o->hedge_after_ms <= 0 || o->hedge == NULL || c->hedge_asked
        || c->n != 1 || !x0->running || c->winner != NULL)
        return;
    due = x0->start_us / 1000 + o->hedge_after_ms;
    if (now < due) {
        if (due < *next)
            *next = due;
        return;
    }
    c->hedge_asked = 1;
    if (o->hedge(o->arg, x0->idx, &idx) != 0)
        return;
    log_msg(GW_LOG_INFO, "upstream: hedge upstream=%s after=%" PRId64 "ms "
            "first=%s path=%.*s", c->u->cfg->upstreams[idx].name,
            o->hedge_after_ms, x0->up->name, gw_log_path_len(c->req->path),
            c->req->path);
    attempt_start(c, idx);
}

static int
any_running(const struct call *c)
{
    for (int i = 0; i < c->n; i++)
        if (c->x[i].running)
            return 1;
    return 0;
}

/*
 * Send attempt 'x' (stale: a 408 on a kept connection) again, on a fresh
 * connection: its response state as before the first header line, its
 * request as it was.  The pre-request callback reports the send, as it
 * does libcurl's own resend.  Returns 0, or GW_ENOMEM (x has ended).
 */
static int
attempt_restart(struct call *c, struct xfer *x)
{
    CURL *e = x->h->curl;

    curl_multi_remove_handle(c->s->multi, e);  /* closes the stale one */
    x->stale = 0;
    x->restarted = 1;
    x->sends = 1;
    response_reset(x);
    x->start_us = gw_now_us();
    x->last_rx_ms = x->start_us / 1000;
    if (curl_easy_setopt(e, CURLOPT_FRESH_CONNECT, 1L) != CURLE_OK
        || curl_multi_add_handle(c->s->multi, e) != CURLM_OK) {
        attempt_end(c, x, CURLE_OK, GW_ENOMEM, "out of memory", UPF_LOCAL);
        return GW_ENOMEM;
    }
    return 0;
}

/* libcurl is done with the running attempt 'x', with code 'cc'. */
static void
attempt_finished(struct call *c, struct xfer *x, CURLcode cc)
{
    /* A loser that libcurl ended (its callbacks refuse data) lost; its
     * connection did nothing wrong. */
    if (x->lost)
        attempt_end(c, x, CURLE_OK, GW_EABORTED, "lost the hedge",
                    UPF_NONE);
    else if (x->stale)
        attempt_restart(c, x);
    else
        attempt_end(c, x, cc, 0, NULL, UPF_NONE);
}

/* End the running attempts that the other one has beaten. */
static void
end_lost(struct call *c)
{
    for (int i = 0; i < c->n; i++)
        if (c->x[i].running && c->x[i].lost)
            attempt_finished(c, &c->x[i], CURLE_OK);
}

/* Read libcurl's finished transfers and end the lost ones. */
static void
reap(struct call *c)
{
    struct xfer *x;
    CURLMsg *msg;
    int left;

    while ((msg = curl_multi_info_read(c->s->multi, &left)) != NULL) {
        if (msg->msg != CURLMSG_DONE)
            continue;
        x = NULL;
        curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&x);
        if (x == NULL || !x->running)
            continue;
        attempt_finished(c, x, msg->data.result);
    }
    end_lost(c);
}

/*
 * The loop (the file comment): until no attempt runs.  Returns the
 * attempt whose result is the call's: the winner, else the one that
 * ended last.
 */
static struct xfer *
run(struct call *c)
{
    const struct upstream_opts *o = c->opts;
    const struct upstream_sink *sink = c->sink;
    struct up_session *se = c->s;
    struct pollfd pfd[UP_MAX_SOCKS + 2];
    struct xfer *last = &c->x[0];
    int64_t now, next, mute_until = 0;
    int running, n, ns, w_at, s_at, rc, ev;
    CURLMcode mc = CURLM_OK;

    for (;;) {
        for (int i = 0; i < c->n; i++)
            if (c->x[i].running)
                last = &c->x[i];        /* the last to end, if none wins */
        if (mc != CURLM_OK) {
            for (int i = 0; i < c->n; i++)
                if (c->x[i].running)
                    attempt_end(c, &c->x[i], CURLE_OK, GW_ENOMEM,
                                "libcurl multi failure", UPF_LOCAL);
        }
        reap(c);
        if (!any_running(c))
            break;
        now = gw_now_ms();
        next = now + UP_TICK_MS;
        for (int i = 0; i < c->n; i++)
            if (c->x[i].running)
                check_timers(c, &c->x[i], now, &next);
        if (sink->on_tick != NULL && (rc = sink->on_tick(sink->arg)) != 0)
            stop_all(c, rc);
        maybe_hedge(c, now, &next);
        if (!any_running(c))
            break;

        /* libcurl's sockets (a copy: telling libcurl changes the set),
         * then the client's and the stop pipe. */
        ns = se->nsocks;
        memcpy(pfd, se->socks, (size_t)ns * sizeof(pfd[0]));
        n = ns;
        w_at = s_at = -1;
        if (o->watch_fd >= 0 && now >= mute_until && sink->on_peer != NULL) {
            pfd[n].fd = o->watch_fd;
            pfd[n].events = POLLIN;
            w_at = n++;
        }
        if (o->stop_fd >= 0) {
            pfd[n].fd = o->stop_fd;
            pfd[n].events = POLLIN;
            s_at = n++;
        }
        for (int i = 0; i < n; i++)
            pfd[i].revents = 0;
        if (se->timer_ms >= 0 && se->timer_ms < next)
            next = se->timer_ms;
        if (poll(pfd, (nfds_t)n, gw_ms_left(next)) == -1 && errno != EINTR)
            mc = CURLM_INTERNAL_ERROR;  /* cannot happen with valid fds */
        for (int i = 0; i < ns && mc == CURLM_OK; i++) {
            if (pfd[i].revents == 0)
                continue;
            ev = 0;
            if (pfd[i].revents & (POLLIN | POLLHUP))
                ev |= CURL_CSELECT_IN;
            if (pfd[i].revents & POLLOUT)
                ev |= CURL_CSELECT_OUT;
            if (pfd[i].revents & (POLLERR | POLLNVAL))
                ev |= CURL_CSELECT_ERR;
            mc = curl_multi_socket_action(se->multi, pfd[i].fd, ev,
                                          &running);
            if (mc == CURLM_BAD_SOCKET)
                mc = CURLM_OK;  /* closed by the action before it */
        }
        if (mc == CURLM_OK && se->timer_ms >= 0
            && gw_now_ms() >= se->timer_ms) {
            se->timer_ms = -1;
            mc = curl_multi_socket_action(se->multi, CURL_SOCKET_TIMEOUT, 0,
                                          &running);
        }
        if (s_at >= 0 && pfd[s_at].revents != 0) {
            rc = sink->on_tick != NULL ? sink->on_tick(sink->arg) : 0;
            if (rc != 0)
                stop_all(c, rc);
        }
        if (w_at >= 0 && pfd[w_at].revents != 0 && any_running(c)) {
            /* The client's socket: readable is a hang-up, or its next
             * request already; the sink tells which. */
            rc = sink->on_peer(sink->arg);
            if (rc < 0)
                stop_all(c, rc);
            else
                mute_until = rc > 0 ? INT64_MAX : now + UP_PEER_MUTE_MS;
        }
    }
    for (int i = 0; i < c->n; i++)
        if (c->x[i].res.head_seen)
            return &c->x[i];
    return c->winner != NULL ? c->winner : last;
}

/*
 * May the connection a call leaves be kept?  Not after a 408 (the
 * upstream closes after one, RFC 9110 15.5.9, whatever its head said),
 * nor when TLS held bytes past an answer (tls_leftover()).
 */
static int
call_keepable(const struct call *c, const struct xfer *final)
{
    for (int i = 0; i < c->n; i++)
        if (c->x[i].leftover)
            return 0;
    return final->res.status != 408;
}

int
upstream_perform(struct upstream *u, size_t idx,
                 const struct upstream_request *req,
                 const struct upstream_opts *opts,
                 const struct upstream_sink *sink,
                 struct upstream_result *res)
{
    struct call c;
    struct xfer *final;

    memset(&c, 0, sizeof(c));
    c.u = u;
    c.req = req;
    c.opts = opts != NULL ? opts : &default_opts;
    c.sink = sink;
    result_init(res, idx);
    assert(idx < u->cfg->num_upstreams);

    c.s = session_take(u, idx);
    if (c.s == NULL)
        return res->rc;
    if (attempt_start(&c, idx) == 0)
        final = run(&c);
    else
        final = &c.x[0];
    *res = final->res;
    for (int i = 0; i < c.n; i++)
        if (&c.x[i] != final && c.opts->attempt_done != NULL)
            c.opts->attempt_done(c.opts->arg, &c.x[i].res);
    /*
     * Even after an error: libcurl has already closed a broken
     * connection, and kept one only after a complete answer.
     */
    session_put(u, c.s, call_keepable(&c, final));
    return res->rc;
}

uint64_t
upstream_handles_created(struct upstream *u)
{
    return atomic_load_explicit(&u->created, memory_order_relaxed);
}

#ifdef INFERGW_UNIT_TEST
/*
 * A call driven by hand (upstream.h's test-only part).  Its attempts are
 * real struct xfer values fed through the real callbacks; only libcurl is
 * missing.  The session is an empty one, so attempt_end()'s
 * curl_multi_remove_handle() on its NULL handles does nothing, and the
 * handles have no CURL: the callbacks only use their ctype buffers.
 */
struct upstream_testcall {
    struct call c;
    struct up_session s;
    struct up_handle h[UP_ATTEMPTS];
};

static const struct config_upstream testcall_upstream = {
    .name = (char *)"test",
    .url = (char *)"http://upstream.test",
};

static const struct upstream_request testcall_request = {
    "POST", "/v1/chat/completions", "{}", 2, "test-id", NULL
};

struct upstream_testcall *
upstream_testcall_new(const struct upstream_opts *opts,
                      const struct upstream_sink *sink)
{
    struct upstream_testcall *t = gw_calloc(1, sizeof(*t));

    if (t == NULL)
        return NULL;
    t->c.req = &testcall_request;
    t->c.opts = opts != NULL ? opts : &default_opts;
    t->c.sink = sink;
    t->c.s = &t->s;
    t->s.timer_ms = -1;
    for (int i = 0; i < UP_ATTEMPTS; i++)
        buf_init(&t->h[i].ctype, UP_CTYPE_LIMIT);
    return t;
}

void
upstream_testcall_free(struct upstream_testcall *t)
{
    if (t == NULL)
        return;
    for (int i = 0; i < UP_ATTEMPTS; i++)
        buf_release(&t->h[i].ctype);
    gw_free(t);
}

int
upstream_testcall_start(struct upstream_testcall *t)
{
    struct call *c = &t->c;
    struct xfer *x;
    int i = c->n;

    /* The second attempt only as maybe_hedge() starts one. */
    if (i == UP_ATTEMPTS
        || (i == 1 && (!c->x[0].running || c->winner != NULL)))
        return -1;
    x = &c->x[i];
    xfer_init(c, x, (size_t)i, &testcall_upstream);
    x->h = &t->h[i];
    x->start_us = gw_now_us();
    x->last_rx_ms = x->start_us / 1000;
    x->running = 1;
    return i;
}

size_t
upstream_testcall_header(struct upstream_testcall *t, int i, char *p,
                         size_t n)
{
    assert(i >= 0 && i < t->c.n);
    return header_cb(p, 1, n, &t->c.x[i]);
}

size_t
upstream_testcall_body(struct upstream_testcall *t, int i, char *p,
                       size_t n)
{
    assert(i >= 0 && i < t->c.n);
    return write_cb(p, 1, n, &t->c.x[i]);
}

int
upstream_testcall_running(const struct upstream_testcall *t, int i)
{
    return i >= 0 && i < t->c.n && t->c.x[i].running;
}

const struct upstream_result *
upstream_testcall_finish(struct upstream_testcall *t, int i, int curl_code)
{
    struct xfer *x = &t->c.x[i];

    assert(i >= 0 && i < t->c.n);
    if (x->running)
        attempt_finished(&t->c, x, (CURLcode)curl_code);
    return &x->res;
}

void
upstream_testcall_reap(struct upstream_testcall *t)
{
    end_lost(&t->c);
}
#endif
