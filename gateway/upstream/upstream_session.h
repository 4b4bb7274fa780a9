/* SPDX-License-Identifier: MIT */
/*
 * upstream_session.h - the libcurl handles an upstream call runs on, and
 * the cache that keeps them, with their connections, warm between calls.
 *
 * A session is a libcurl multi handle with UPSTREAM_SESSION_HANDLES easy
 * handles (a call's attempt and its hedge, upstream.h), the sockets
 * libcurl has open for it and what libcurl asked its thread to watch.
 * upstream.c drives a session's transfers in its own wait; this module
 * makes sessions and handles, knows their connections, and keeps them.
 *
 * Design: the multi handle owns the connection cache, at most one idle
 * connection (CURLMOPT_MAXCONNECTS 1), so an idle session is one warm
 * connection.  Idle sessions wait in the keep-alive cache (keepalive.h),
 * per upstream of their connection: a call to upstream i takes i's most
 * recently used one, checked quiet, or makes a new session; after the
 * call a session whose connection libcurl kept goes back under that
 * connection's upstream, and one without any is freed (its multi
 * handle's wake-up pipe is not worth keeping for nothing).  That is
 * simpler than a share handle with CURL_LOCK_DATA_CONNECT, which libcurl
 * 7.88 documents as unsafe across threads, and a connection cannot be
 * handed from one multi handle to another: 7.88 connects a socket given
 * to it as CURL_SOCKOPT_ALREADY_CONNECTED again (curl issue 10626).  What
 * sessions do share, under locks, is the DNS cache (a CURLSH per cache;
 * not TLS session ids, upstream_session.c says why).
 *
 * libcurl knows the sockets it opens through CURLOPT_OPENSOCKETFUNCTION
 * and CURLOPT_CLOSESOCKETFUNCTION, so a session knows its connections
 * and the upstream of each: that is how the idle one is found, polled
 * and put under the right upstream.
 *
 * The wait: a thread drives its session's transfers in one poll() of its
 * own, on the sockets libcurl asks it to watch (CURLMOPT_SOCKETFUNCTION)
 * plus the caller's own, until libcurl's timer (CURLMOPT_TIMERFUNCTION)
 * or the caller's deadline, and tells libcurl which socket is ready
 * (curl_multi_socket_action()).  Telling it spares libcurl a poll() of
 * its own to find out, which curl_multi_perform() and
 * curl_easy_perform() make for every read (docs/BENCHMARKS.md counts the
 * system calls per chunk).
 *
 * Ownership and locking: the cache owns the idle sessions and the share
 * handle; both lock themselves (keepalive.h; a mutex per kind of shared
 * data), so every cache function is thread-safe.  A session, and its
 * handles, belong to one thread at a time: the caller's from
 * upstream_session_take() to upstream_session_put(), else the cache's.
 * Sessions move between threads, so connections are reused across
 * requests and threads.
 */
#ifndef INFERGW_GATEWAY_UPSTREAM_UPSTREAM_SESSION_H
#define INFERGW_GATEWAY_UPSTREAM_UPSTREAM_SESSION_H

#include <poll.h>
#include <stddef.h>
#include <stdint.h>

#include <curl/curl.h>

#include "buf.h"

/* Descriptors upstream_session_wait() watches beside libcurl's. */
#define UPSTREAM_SESSION_MAX_EXTRA 2

/* Easy handles per session: a call's first attempt and its hedge. */
#define UPSTREAM_SESSION_HANDLES 2

/* Sockets one session may have open at once: its idle connection, a
 * hedge, happy eyeballs connecting over two addresses each, a resend. */
#define UPSTREAM_SESSION_MAX_SOCKS 8

/* Scratch for the URL and the request header lines (client-sized input). */
#define UPSTREAM_SESSION_SCRATCH_LIMIT (256 * 1024)

struct upstream_session;
struct upstream_session_cache;

/*
 * An easy handle and the memory its transfers reuse (the hot path makes
 * no allocation of its own, upstream.c).  Owned by its session.
 */
struct upstream_session_handle {
    CURL *curl;
    struct upstream_session *s;     /* its session, for the socket
                                       callbacks; immutable */
    size_t idx;                 /* the upstream of its transfer */
    int opened;                 /* sockets libcurl opened for it since
                                   upstream_session_handle() */
    int ready;                  /* set by the caller after a transfer that
                                   left nothing behind (upstream.c): the
                                   next upstream_session_handle() for the
                                   same upstream keeps the options */
    struct buf scratch;         /* URL and header lines, NUL-separated */
    char errbuf[CURL_ERROR_SIZE];   /* libcurl's detail for the last error */
};

/* A socket libcurl opened for a session, and the upstream it goes to. */
struct upstream_session_conn {
    int fd;
    size_t idx;
};

/*
 * A multi handle and its easy handles (made on first use), the sockets
 * libcurl has open and what it asked its thread to watch: sockets with
 * events, and a timer.  The caller adds and removes its transfers on
 * 'multi' and waits in upstream_session_wait(); everything else is this
 * module's.
 */
struct upstream_session {
    CURLM *multi;
    struct upstream_session_cache *cache;   /* made it; NULL: a test's */
    struct upstream_session_handle *h[UPSTREAM_SESSION_HANDLES];
    struct upstream_session_conn conns[UPSTREAM_SESSION_MAX_SOCKS];
    int nconns;                 /* open_cb to close_cb */
    struct pollfd socks[UPSTREAM_SESSION_MAX_SOCKS];
    int nsocks;
    int64_t timer_ms;           /* when to tell libcurl its time is up;
                                   -1 none */
    int skipped;                /* the last wait ran the due timer without
                                   a poll (upstream_session_wait()) */
};

/*
 * A cache for 'num_upstreams' upstreams: at most 'max_idle' idle
 * sessions each, dropped after 'idle_timeout_ms' (keepalive_new()), and
 * the share handle.  Call after curl_global_init().  NULL on failure.
 */
struct upstream_session_cache *upstream_session_cache_new(
    size_t num_upstreams, uint64_t max_idle, int64_t idle_timeout_ms);

/*
 * Free the cache, every idle session and the share handle.  No session
 * taken from it may be left.  NULL-safe.
 */
void upstream_session_cache_free(struct upstream_session_cache *sc);

/*
 * A session for a call to upstream 'idx', owned by the caller until
 * upstream_session_put(): an idle one with a quiet connection to it
 * (keepalive.h checks), or a new one.  NULL: no memory.
 */
struct upstream_session *upstream_session_take(
    struct upstream_session_cache *sc, size_t idx);

/*
 * After a call ('s' stolen): keep it under the upstream of the one
 * connection libcurl kept, or free it when it kept none, or when 'keep'
 * is 0.  No transfer may be in its multi handle any more.
 */
void upstream_session_put(struct upstream_session_cache *sc,
                          struct upstream_session *s, int keep);

/*
 * OUT *out: easy handle 'i' of 's' (made on first use; borrowed, owned
 * by 's'), reset for a transfer to upstream 'idx' with every option that
 * is the session's: the transport settings, the error buffer, the socket
 * callbacks and the share handle.  The caller then sets its own
 * callbacks and the request.  Returns 0, GW_ENOMEM (*out NULL) or
 * GW_EINVAL (logged) when this libcurl refuses an option.
 *
 * The reset (curl_easy_reset() and every option again) is skipped when
 * the handle is 'ready' for 'idx': its last transfer was to the same
 * upstream and left nothing behind (upstream.c says when), so its options
 * are the session's and that upstream's already, and libcurl's resend
 * count is still 0.  Either way 'ready' is 0 again until the caller sets
 * it after this transfer.
 */
int upstream_session_handle(struct upstream_session *s, int i, size_t idx,
                            struct upstream_session_handle **out);

/*
 * Wait until 'deadline_ms' (a gw_now_ms() value) or libcurl's timer, for
 * the session's sockets and the caller's 'extra' (borrowed; 'nextra' of
 * them, at most UPSTREAM_SESSION_MAX_EXTRA; OUT: their revents), then
 * tell libcurl what is ready and whether its timer is due.  Returns
 * CURLM_OK, or the CURLMcode that says the multi handle failed.
 *
 * When libcurl has no socket yet and its timer is already due (a
 * transfer just added: it asks to be run at once), the wait runs the
 * timer without a poll(), whose zero timeout would only have looked at
 * 'extra' (their revents are then 0); never twice in a row, so the
 * caller's descriptors are polled at least every other wait.
 */
CURLMcode upstream_session_wait(struct upstream_session *s,
                                struct pollfd *extra, int nextra,
                                int64_t deadline_ms);

/*
 * Does TLS hold bytes of h's connection that nobody has read,
 * now that its answer is whole?  libcurl reads a Content-Length body no
 * further than its end, but TLS decrypts a whole record, so bytes sent
 * after the answer in the same record (a stray response) wait in
 * OpenSSL's buffer, where poll() and keepalive.h cannot see them, to be
 * read as the next request's answer.  Only OpenSSL (Debian's libcurl's
 * backend) can be asked, while the transfer runs; any other backend is
 * taken to hold some.  A plain connection holds none.
 * Asked of the transfer to 'url' (borrowed) that runs on 'h'.
 */
int upstream_session_tls_leftover(const struct upstream_session_handle *h,
                                  const char *url);

#endif
