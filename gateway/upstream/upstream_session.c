/* SPDX-License-Identifier: MIT */
/*
 * upstream_session.c - sessions of libcurl handles, their sockets, and the
 * cache that keeps them warm (upstream_session.h).
 */
#include "upstream/upstream_session.h"

#include <assert.h>
#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <curl/curl.h>
#include <openssl/ssl.h>

#include "alloc.h"
#include "buf.h"
#include "upstream/keepalive.h"
#include "log.h"
#include "util.h"

/*
 * Idle sessions and what every session shares.  Immutable after
 * upstream_session_cache_new(); 'ka' and 'share' lock themselves.
 */
struct upstream_session_cache {
    struct keepalive *ka;       /* idle sessions; owned */
    CURLSH *share;              /* the DNS cache; owned */
    struct gw_mutex share_lock[CURL_LOCK_DATA_LAST];
};

static void
handle_free(struct upstream_session_handle *h)
{
    if (h == NULL)
        return;
    curl_easy_cleanup(h->curl);         /* closes its cached connections */
    buf_release(&h->scratch);
    gw_free(h);
}

/* Make a handle of session 's' (its options are set per transfer).  NULL:
 * no memory. */
static struct upstream_session_handle *
handle_new(struct upstream_session *s)
{
    struct upstream_session_handle *h = gw_calloc(1, sizeof(*h));

    if (h == NULL)
        return NULL;
    h->s = s;
    buf_init(&h->scratch, UPSTREAM_SESSION_SCRATCH_LIMIT);
    h->curl = curl_easy_init();
    if (h->curl == NULL) {
        handle_free(h);
        return NULL;
    }
    return h;
}

/*
 * CURLOPT_OPENSOCKETFUNCTION: a socket for handle 'arg''s transfer (a
 * connection, or one of happy eyeballs' tries), noted in its session with
 * the transfer's upstream.  CURL_SOCKET_BAD fails the connect.
 */
static curl_socket_t
open_cb(void *arg, curlsocktype purpose, struct curl_sockaddr *addr)
{
    struct upstream_session_handle *h = arg;
    struct upstream_session *s = h->s;
    int fd;

    if (purpose != CURLSOCKTYPE_IPCXN
        || s->nconns == UPSTREAM_SESSION_MAX_SOCKS)
        return CURL_SOCKET_BAD;
    fd = socket(addr->family, addr->socktype | SOCK_CLOEXEC, addr->protocol);
    if (fd == -1)
        return CURL_SOCKET_BAD;         /* libcurl reports the connect */
    s->conns[s->nconns].fd = fd;
    s->conns[s->nconns].idx = h->idx;
    s->nconns++;
    h->opened++;
    return fd;
}

/* CURLOPT_CLOSESOCKETFUNCTION: libcurl is done with 'fd' ('arg': its
 * session, which outlives every one of its connections). */
static int
close_cb(void *arg, curl_socket_t fd)
{
    struct upstream_session *s = arg;

    for (int i = 0; i < s->nconns; i++) {
        if (s->conns[i].fd == fd) {
            s->conns[i] = s->conns[--s->nconns];
            break;
        }
    }
    return close(fd);
}

/*
 * The options every transfer on a session has, after curl_easy_reset():
 * the transport settings, the error buffer, the socket callbacks and the
 * share handle.  Returns 0, or GW_EINVAL (logged) when this libcurl
 * refuses one.
 *
 * NOSIGNAL: we run on many threads; without it a resolver timeout uses
 * SIGALRM and longjmp.  TCP_NODELAY: a request is written in one go, and
 * Nagle would hold back a body sent after the head.  PROXY "": the
 * upstream is named in our config, so a stray http_proxy variable must
 * not reroute it (it also spares libcurl reading the proxy variables on
 * every transfer).  HTTP/1.1: one request per handle gains nothing from
 * HTTP/2, and 1.1 keeps the framing the same on http and https.  No
 * CURLOPT_ACCEPT_ENCODING: bodies pass through undecoded, and the
 * Accept-Encoding line is upstream.c's.
 *
 * CURLOPT_BUFFERSIZE stays at the default 16 KiB: SSE events are far
 * smaller, and a bigger buffer per handle would only help large
 * non-streamed bodies while costing memory on every idle session.
 */
static int
transport_setup(struct upstream_session *s, struct upstream_session_handle *h)
{
    CURL *e = h->curl;

    curl_easy_reset(e);             /* also zeroes libcurl's resend count */
    if (curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L) != CURLE_OK
        || curl_easy_setopt(e, CURLOPT_TCP_NODELAY, 1L) != CURLE_OK
        || curl_easy_setopt(e, CURLOPT_PROXY, "") != CURLE_OK
        || curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https")
           != CURLE_OK
        || curl_easy_setopt(e, CURLOPT_HTTP_VERSION,
                            (long)CURL_HTTP_VERSION_1_1) != CURLE_OK
        || curl_easy_setopt(e, CURLOPT_ERRORBUFFER, h->errbuf)
           != CURLE_OK
        || curl_easy_setopt(e, CURLOPT_OPENSOCKETFUNCTION, open_cb)
           != CURLE_OK
        || curl_easy_setopt(e, CURLOPT_CLOSESOCKETFUNCTION, close_cb)
           != CURLE_OK
        || curl_easy_setopt(e, CURLOPT_SHARE, s->cache->share) != CURLE_OK
        || curl_easy_setopt(e, CURLOPT_NOPROGRESS, 1L) != CURLE_OK) {
        /* Not memory: this libcurl lacks an option we rely on. */
        log_msg(GW_LOG_ERROR, "upstream: libcurl refused an option");
        return GW_EINVAL;
    }
    /*
     * Pointer options cannot fail.  The close callback's data is the
     * session, not the handle's transfer: libcurl keeps it with the
     * connection, which may outlive this call in the keep-alive cache.
     */
    curl_easy_setopt(e, CURLOPT_OPENSOCKETDATA, h);
    curl_easy_setopt(e, CURLOPT_CLOSESOCKETDATA, s);
    return 0;
}

int
upstream_session_handle(struct upstream_session *s, int i, size_t idx,
                        struct upstream_session_handle **out)
{
    struct upstream_session_handle *h;
    int keep;

    assert(i >= 0 && i < UPSTREAM_SESSION_HANDLES);
    if (s->h[i] == NULL)
        s->h[i] = handle_new(s);
    h = s->h[i];
    *out = h;
    if (h == NULL)
        return GW_ENOMEM;
    keep = h->ready && h->idx == idx;
    h->ready = 0;
    h->idx = idx;
    h->opened = 0;
    return keep ? 0 : transport_setup(s, h);
}

static void
session_free(struct upstream_session *s)
{
    if (s == NULL)
        return;
    /* The easy handles first: they are never in the multi handle here. */
    for (int i = 0; i < UPSTREAM_SESSION_HANDLES; i++)
        handle_free(s->h[i]);
    curl_multi_cleanup(s->multi);       /* closes its cached connections */
    gw_free(s);
}

/*
 * CURLMOPT_SOCKETFUNCTION: watch 'fd' for 'what' from now on (or no more,
 * CURL_POLL_REMOVE).  Returns 0; -1 (libcurl then fails the transfer)
 * past UPSTREAM_SESSION_MAX_SOCKS.
 */
static int
sock_cb(CURL *easy, curl_socket_t fd, int what, void *arg, void *sockp)
{
    struct upstream_session *s = arg;
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
        if (s->nsocks == UPSTREAM_SESSION_MAX_SOCKS)
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
    struct upstream_session *s = arg;

    (void)multi;
    s->timer_ms = ms < 0 ? -1 : gw_now_ms() + ms;
    return 0;
}

static struct upstream_session *
session_new(struct upstream_session_cache *sc)
{
    struct upstream_session *s = gw_calloc(1, sizeof(*s));

    if (s == NULL)
        return NULL;
    s->cache = sc;
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

/* CURLSHOPT_LOCKFUNC and UNLOCKFUNC: a mutex per kind of shared data. */
static void
share_lock(CURL *e, curl_lock_data data, curl_lock_access access,
           void *arg)
{
    struct upstream_session_cache *sc = arg;

    (void)e;
    (void)access;                       /* shared or single: one mutex */
    gw_mutex_lock(&sc->share_lock[data]);
}

static void
share_unlock(CURL *e, curl_lock_data data, void *arg)
{
    struct upstream_session_cache *sc = arg;

    (void)e;
    gw_mutex_unlock(&sc->share_lock[data]);
}

/*
 * The share handle: the DNS cache, so a session made for a burst need not
 * resolve again.  Not TLS session ids: libcurl 7.88 (Debian 12's) hands
 * one OpenSSL SSL_SESSION to handshakes on several threads at once,
 * which OpenSSL does not allow (fixed in a later libcurl, curl PR 14751;
 * ThreadSanitizer saw it here, a health probe's handshake racing a
 * call's).  A warm connection needs no handshake anyway; a new one to
 * an https:// upstream makes a full one.  Returns 0 or GW_ENOMEM.
 */
static int
share_new(struct upstream_session_cache *sc)
{
    sc->share = curl_share_init();
    if (sc->share == NULL
        || curl_share_setopt(sc->share, CURLSHOPT_LOCKFUNC, share_lock)
           != CURLSHE_OK
        || curl_share_setopt(sc->share, CURLSHOPT_UNLOCKFUNC, share_unlock)
           != CURLSHE_OK
        || curl_share_setopt(sc->share, CURLSHOPT_USERDATA, sc) != CURLSHE_OK
        || curl_share_setopt(sc->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS)
           != CURLSHE_OK)
        return GW_ENOMEM;
    return 0;
}

struct upstream_session_cache *
upstream_session_cache_new(size_t num_upstreams, uint64_t max_idle,
                           int64_t idle_timeout_ms)
{
    struct upstream_session_cache *sc = gw_calloc(1, sizeof(*sc));
    struct upstream_session_cache *ret = NULL;

    if (sc == NULL)
        goto out;
    for (int i = 0; i < CURL_LOCK_DATA_LAST; i++)
        gw_mutex_init(&sc->share_lock[i]);      /* aborts on failure */
    if (share_new(sc) != 0)
        goto out;
    sc->ka = keepalive_new(num_upstreams, max_idle, idle_timeout_ms,
                           session_drop);
    if (sc->ka == NULL)
        goto out;
    ret = sc;
    sc = NULL;

out:
    upstream_session_cache_free(sc);
    return ret;
}

void
upstream_session_cache_free(struct upstream_session_cache *sc)
{
    if (sc == NULL)
        return;
    /* The sessions first: their handles hold the share. */
    keepalive_free(sc->ka);
    sc->ka = NULL;
    curl_share_cleanup(sc->share);
    sc->share = NULL;
    for (int i = 0; i < CURL_LOCK_DATA_LAST; i++)
        gw_mutex_destroy(&sc->share_lock[i]);
    gw_free(sc);
}

struct upstream_session *
upstream_session_take(struct upstream_session_cache *sc, size_t idx)
{
    struct upstream_session *s = keepalive_take(sc->ka, idx);

    return s != NULL ? s : session_new(sc);
}

void
upstream_session_put(struct upstream_session_cache *sc,
                     struct upstream_session *s, int keep)
{
    if (s->nconns == 1 && keep)
        keepalive_put(sc->ka, s->conns[0].idx, s, s->conns[0].fd);
    else
        session_free(s);    /* none: nothing to keep; more: cannot be */
}

CURLMcode
upstream_session_wait(struct upstream_session *s, struct pollfd *extra,
                      int nextra, int64_t deadline_ms)
{
    struct pollfd pfd[UPSTREAM_SESSION_MAX_SOCKS
                      + UPSTREAM_SESSION_MAX_EXTRA];
    CURLMcode mc = CURLM_OK;
    int running, n, ns, ev;

    assert(nextra >= 0 && nextra <= UPSTREAM_SESSION_MAX_EXTRA);
    /* libcurl's sockets (a copy: telling libcurl changes the set), then
     * the caller's. */
    ns = s->nsocks;
    memcpy(pfd, s->socks, (size_t)ns * sizeof(pfd[0]));
    memcpy(pfd + ns, extra, (size_t)nextra * sizeof(pfd[0]));
    n = ns + nextra;
    for (int i = 0; i < n; i++)
        pfd[i].revents = 0;
    if (s->timer_ms >= 0 && s->timer_ms < deadline_ms)
        deadline_ms = s->timer_ms;
    /* The header says when the poll is skipped: one system call less
     * per call, at its start. */
    s->skipped = ns == 0 && !s->skipped && s->timer_ms >= 0
                 && gw_ms_left(s->timer_ms) == 0;
    if (!s->skipped && poll(pfd, (nfds_t)n, gw_ms_left(deadline_ms)) == -1
        && errno != EINTR)
        mc = CURLM_INTERNAL_ERROR;      /* cannot happen with valid fds */
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
        mc = curl_multi_socket_action(s->multi, pfd[i].fd, ev, &running);
        if (mc == CURLM_BAD_SOCKET)
            mc = CURLM_OK;      /* closed by the action before it */
    }
    if (mc == CURLM_OK && s->timer_ms >= 0 && gw_now_ms() >= s->timer_ms) {
        s->timer_ms = -1;
        mc = curl_multi_socket_action(s->multi, CURL_SOCKET_TIMEOUT, 0,
                                      &running);
    }
    for (int i = 0; i < nextra; i++)
        extra[i].revents = pfd[ns + i].revents;
    return mc;
}

int
upstream_session_tls_leftover(const struct upstream_session_handle *h,
                              const char *url)
{
    struct curl_tlssessioninfo *ti = NULL;

    if (strncmp(url, "https://", 8) != 0)
        return 0;
    if (curl_easy_getinfo(h->curl, CURLINFO_TLS_SSL_PTR, &ti) != CURLE_OK
        || ti == NULL || ti->backend != CURLSSLBACKEND_OPENSSL
        || ti->internals == NULL)
        return 1;
    return SSL_has_pending(ti->internals);
}
