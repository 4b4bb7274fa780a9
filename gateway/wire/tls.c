/* SPDX-License-Identifier: MIT */
/*
 * tls.c - server-side TLS connections with mbedTLS 2.28 (API and
 * contracts in tls.h): the handshake, reads, writes, and the net.h
 * stream over them.  The server they run on (its chain, key, shared
 * configuration and session-ticket keys) is tls_server.c's.
 *
 * Design.  Reads: mbedTLS asks its receive callback for exactly one
 * record at a time (a 5-byte header, then the body it announces), so
 * whatever else the client sent stays in the kernel, where poll() sees
 * it.  Only the decrypted rest of the current record is buffered:
 * tls_pending().
 *
 * Writes: after MBEDTLS_ERR_SSL_WANT_WRITE, mbedTLS holds a whole
 * encrypted record of which only part was sent, and requires the same
 * mbedtls_ssl_write() call again; a later call with other arguments would
 * only flush the old record yet return its own length (ssl_write_real()
 * in ssl_msg.c), losing or repeating data.  So the plaintext of that
 * record is copied to c->wbuf, it is not reported as taken, and the next
 * write first repeats the call from the copy.  mbedTLS itself also sends
 * alerts from inside mbedtls_ssl_read() (no_renegotiation, when a client
 * tries to renegotiate), and such an alert would flush our half-sent
 * record instead; so reads wait until no record is pending, and a read
 * that would itself leave output pending ends the connection.
 */
#include "wire/tls.h"

#include <assert.h>
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include <mbedtls/error.h>
#include <mbedtls/net_sockets.h>
#include <mbedtls/ssl.h>

#include "alloc.h"
#include "net.h"
#include "wire/tls_server.h"

struct tls_conn {
    mbedtls_ssl_context ssl;
    int fd;                     /* borrowed */
    short want;                 /* POLLIN or POLLOUT, after GW_EAGAIN */
    int dead;                   /* 0, or the code every later call returns */
    int sys_err;                /* errno of the last failed recv/send */
    unsigned char first[8];     /* the first bytes received, for a hint */
    size_t nfirst;
    size_t wlen;                /* bytes in wbuf whose record is pending */
    unsigned char wbuf[TLS_RECORD_MAX]; /* gathers iovecs; copy of the
                                           pending record's plaintext */
};

/* ---- counters and messages -------------------------------------------- */

/* One handshake's outcome 'rc' in s->stats; 'resumed': from a ticket. */
static void
count(struct tls_server *s, int rc, int resumed)
{
    _Atomic uint64_t *n;

    if (s->stats == NULL)
        return;
    if (resumed)
        atomic_fetch_add_explicit(&s->stats->resumed, 1,
                                  memory_order_relaxed);
    if (rc == 0)
        n = &s->stats->handshakes;
    else if (rc == GW_ETIMEDOUT)
        n = &s->stats->failed_timeout;
    else if (rc == GW_EPARSE)
        n = &s->stats->failed_protocol;
    else
        n = &s->stats->failed_other;
    atomic_fetch_add_explicit(n, 1, memory_order_relaxed);
}

void
tls_set_err(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;

    if (errlen == 0)
        return;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

const char *
tls_mbed_text(int ret, char *buf, size_t len)
{
    mbedtls_strerror(ret, buf, len);
    return buf;
}

/* ---- the socket under mbedTLS ----------------------------------------- */

/* mbedTLS's send callback: never blocks, never raises SIGPIPE. */
static int
bio_send(void *ctx, const unsigned char *p, size_t len)
{
    struct tls_conn *c = ctx;
    ssize_t w;

    do
        w = send(c->fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    while (w == -1 && errno == EINTR);
    if (w >= 0)
        return (int)w;          /* mbedTLS never asks for more than INT_MAX */
    if (errno == EAGAIN || errno == EWOULDBLOCK)
        return MBEDTLS_ERR_SSL_WANT_WRITE;
    c->sys_err = errno;
    return errno == EPIPE || errno == ECONNRESET
           ? MBEDTLS_ERR_NET_CONN_RESET : MBEDTLS_ERR_NET_SEND_FAILED;
}

/* mbedTLS's receive callback; 0 is EOF to mbedTLS too. */
static int
bio_recv(void *ctx, unsigned char *p, size_t len)
{
    struct tls_conn *c = ctx;
    ssize_t r;

    do
        r = recv(c->fd, p, len, MSG_DONTWAIT);
    while (r == -1 && errno == EINTR);
    if (r > 0) {
        for (ssize_t i = 0; i < r && c->nfirst < sizeof(c->first); i++)
            c->first[c->nfirst++] = p[i];
        return (int)r;
    }
    if (r == 0)
        return 0;
    if (errno == EAGAIN || errno == EWOULDBLOCK)
        return MBEDTLS_ERR_SSL_WANT_READ;
    c->sys_err = errno;
    return errno == ECONNRESET ? MBEDTLS_ERR_NET_CONN_RESET
                               : MBEDTLS_ERR_NET_RECV_FAILED;
}

/*
 * Do the first bytes look like an HTTP request line ("GET /", "POST ")?
 * A TLS record starts with a byte in 20..23, so no handshake looks so.
 */
static int
looks_like_http(const unsigned char *p, size_t n)
{
    size_t i;

    if (n < 4)
        return 0;
    for (i = 0; i < n && p[i] != ' '; i++)
        if (p[i] < 'A' || p[i] > 'Z')
            return 0;
    return i >= 3;
}

/*
 * The GW_E* code for mbedTLS's 'ret' after a failed read or write (not
 * WANT_READ/WANT_WRITE); the connection is dead from now on.
 */
static int
conn_failed(struct tls_conn *c, int ret)
{
    if (ret == 0 || ret == MBEDTLS_ERR_SSL_PEER_CLOSE_NOTIFY
        || ret == MBEDTLS_ERR_SSL_CONN_EOF
        || ret == MBEDTLS_ERR_NET_CONN_RESET)
        c->dead = GW_ECLOSED;
    else
        c->dead = GW_EIO;
    return c->dead;
}

/*
 * The fatal alert with which the client ended the handshake, or -1.
 * Either mbedTLS read it (FATAL_ALERT_MESSAGE; 2.28 leaves the record in
 * ssl.in_msg: level, description), or the client closed right after
 * sending it while we were still sending our flight, so that our send
 * failed first: then it is still unread, a plaintext record 21 (alert),
 * version 3.x, length 2, level 2 (fatal), description.
 */
static int
client_alert(struct tls_conn *c, int ret)
{
    unsigned char b[7];

    if (ret == MBEDTLS_ERR_SSL_FATAL_ALERT_MESSAGE)
        return c->ssl.in_msg[1];
    if ((ret == MBEDTLS_ERR_NET_CONN_RESET
         || ret == MBEDTLS_ERR_NET_SEND_FAILED)
        && recv(c->fd, b, sizeof(b), MSG_PEEK | MSG_DONTWAIT) == sizeof(b)
        && b[0] == 21 && b[1] == 3 && b[3] == 0 && b[4] == 2 && b[5] == 2)
        return b[6];
    return -1;
}

/* The alerts that say the client does not accept our certificate. */
static const char *
cert_alert_name(int alert)
{
    switch (alert) {
    case MBEDTLS_SSL_ALERT_MSG_BAD_CERT:
        return "bad_certificate";
    case MBEDTLS_SSL_ALERT_MSG_UNSUPPORTED_CERT:
        return "unsupported_certificate";
    case MBEDTLS_SSL_ALERT_MSG_CERT_REVOKED:
        return "certificate_revoked";
    case MBEDTLS_SSL_ALERT_MSG_CERT_EXPIRED:
        return "certificate_expired";
    case MBEDTLS_SSL_ALERT_MSG_CERT_UNKNOWN:
        return "certificate_unknown";
    case MBEDTLS_SSL_ALERT_MSG_UNKNOWN_CA:
        return "unknown_ca";
    }
    return NULL;
}

/* Why the handshake failed, as a GW_E* code and a line in 'err'. */
static int
handshake_failed(struct tls_conn *c, int ret, char *err, size_t errlen)
{
    const char *name;
    char ebuf[128];
    int rc = conn_failed(c, ret), alert = client_alert(c, ret);

    if (alert >= 0) {
        name = cert_alert_name(alert);
        if (name != NULL)
            tls_set_err(err, errlen, "client refused our certificate "
                        "(alert %d %s)", alert, name);
        else
            tls_set_err(err, errlen, "client aborted the handshake (alert %d)",
                        alert);
        return c->dead = GW_EPARSE;
    }
    if (rc == GW_ECLOSED) {
        tls_set_err(err, errlen, "client closed the connection during the "
                    "handshake");
        return rc;
    }
    if (ret == MBEDTLS_ERR_NET_SEND_FAILED
        || ret == MBEDTLS_ERR_NET_RECV_FAILED) {
        tls_set_err(err, errlen, "socket error during the handshake: %s",
                    strerror_r(c->sys_err, ebuf, sizeof(ebuf)));
        return rc;
    }
    if (ret == MBEDTLS_ERR_SSL_ALLOC_FAILED) {
        tls_set_err(err, errlen, "out of memory during the handshake");
        return c->dead = GW_ENOMEM;
    }
    rc = c->dead = GW_EPARSE;
    if (looks_like_http(c->first, c->nfirst))
        tls_set_err(err, errlen, "plain HTTP request on the TLS port");
    else if (ret == MBEDTLS_ERR_SSL_BAD_HS_PROTOCOL_VERSION)
        tls_set_err(err, errlen, "client offered no TLS version >= 1.2");
    else if (ret == MBEDTLS_ERR_SSL_BAD_HS_CLIENT_HELLO
             && c->ssl.out_msgtype == MBEDTLS_SSL_MSG_ALERT
             && c->ssl.out_msg[1]
                == MBEDTLS_SSL_ALERT_MSG_NO_APPLICATION_PROTOCOL)
        /* The alert mbedTLS just sent (2.28 leaves it in ssl.out_msg). */
        tls_set_err(err, errlen, "client offered ALPN without http/1.1");
    else if (ret == MBEDTLS_ERR_SSL_NO_CIPHER_CHOSEN
             || ret == MBEDTLS_ERR_SSL_NO_USABLE_CIPHERSUITE)
        /* NO_USABLE: suites in common, but none for our key or curves. */
        tls_set_err(err, errlen, "no cipher suite in common with the client "
                    "(offered: ECDHE with ChaCha20-Poly1305 or AES-GCM, "
                    "signed by the certificate's key)");
    else
        tls_set_err(err, errlen, "TLS handshake failed (%s)",
                    tls_mbed_text(ret, ebuf, sizeof(ebuf)));
    return rc;
}

/* ---- connections ------------------------------------------------------ */

/*
 * The connection whose handshake this thread is running (handshake_steps()
 * sets it), for tls_handshake_hello(); NULL outside a handshake.
 */
static _Thread_local const struct tls_conn *handshaking;

const unsigned char *
tls_handshake_hello(void)
{
    return handshaking != NULL ? handshaking->ssl.in_msg : NULL;
}

/*
 * mbedtls_ssl_handshake(), which is this same loop, but looking at the
 * state after each step to tell a resumed handshake from a full one: a
 * full TLS 1.2 handshake reads the client's key exchange, an abbreviated
 * one (RFC 5246 section 7.3, figure 2) has none.  OUT *full: set to 1
 * once mbedTLS is in the state that reads it (it stays there while it
 * waits for it, so a WANT_READ cannot hide it).  Returns 0,
 * MBEDTLS_ERR_SSL_WANT_READ/WRITE or mbedTLS's error.
 */
static int
handshake_steps(struct tls_conn *c, int *full)
{
    int ret = 0;

    handshaking = c;
    while (ret == 0 && c->ssl.state != MBEDTLS_SSL_HANDSHAKE_OVER) {
        ret = mbedtls_ssl_handshake_step(&c->ssl);
        if (c->ssl.state == MBEDTLS_SSL_CLIENT_KEY_EXCHANGE)
            *full = 1;
    }
    handshaking = NULL;
    return ret;
}

int
tls_accept(struct tls_server *s, int fd, int64_t deadline, int wake_fd,
           struct tls_conn **out, char *err, size_t errlen)
{
    struct tls_conn *c = NULL;
    int64_t start = gw_now_ms(), end = start + s->handshake_timeout_ms;
    int ret, full = 0, rc = GW_ENOMEM;

    *out = NULL;
    tls_set_err(err, errlen, "%s", "");
    if (deadline >= 0 && deadline < end)
        end = deadline;
    c = gw_calloc(1, sizeof(*c));
    if (c == NULL) {
        tls_set_err(err, errlen, "out of memory");
        goto out;
    }
    mbedtls_ssl_init(&c->ssl);
    c->fd = fd;
    c->want = POLLIN;
    ret = mbedtls_ssl_setup(&c->ssl, &s->conf);
    if (ret != 0) {
        tls_set_err(err, errlen, "out of memory");
        goto out;
    }
    mbedtls_ssl_set_bio(&c->ssl, c, bio_send, bio_recv, NULL);
    for (;;) {
        ret = handshake_steps(c, &full);
        if (ret == 0)
            break;
        if (ret != MBEDTLS_ERR_SSL_WANT_READ
            && ret != MBEDTLS_ERR_SSL_WANT_WRITE) {
            rc = handshake_failed(c, ret, err, errlen);
            goto out;
        }
        rc = net_wait(fd, ret == MBEDTLS_ERR_SSL_WANT_READ ? POLLIN : POLLOUT,
                      end, wake_fd);
        if (rc != 0) {
            if (rc == GW_ETIMEDOUT)
                tls_set_err(err, errlen, "TLS handshake not done in %lld ms",
                            (long long)(end - start));
            else
                tls_set_err(err, errlen, "TLS handshake abandoned: %s",
                            rc == GW_EABORTED ? "the server is draining"
                                              : "poll failed");
            goto out;
        }
    }
    *out = c;
    c = NULL;
    rc = 0;

out:
    count(s, rc, rc == 0 && !full);
    if (c != NULL) {
        mbedtls_ssl_free(&c->ssl);
        gw_free(c);
    }
    return rc;
}

/*
 * Decrypted bytes already buffered: while this is > 0, tls_read() returns
 * data without touching the socket, so do not poll() before reading.
 */
GW_TESTABLE size_t
tls_pending(const struct tls_conn *c)
{
    return mbedtls_ssl_get_bytes_avail(&c->ssl);
}

#ifdef INFERGW_UNIT_TEST
short
tls_want(const struct tls_conn *c)
{
    return c->want;
}
#endif

/*
 * Read at most 'len' (> 0) bytes of application data without waiting.
 * OUT *got: bytes read, > 0 exactly when 0 is returned.
 * Returns 0; GW_EAGAIN (nothing now: wait for c->want on the socket);
 * GW_ECLOSED (close_notify, EOF or reset); GW_EIO (a broken record or a
 * socket error).  After GW_ECLOSED or GW_EIO every later call returns the
 * same code.
 * Not while a write is unfinished: after a write that took fewer bytes
 * than offered, the next call on 'c' must be a write offering the rest
 * (or tls_close()), since mbedTLS may still hold part of a record
 * (asserted).  An HTTP/1.1 server finishes its response before it reads
 * the next request anyway.
 */
GW_TESTABLE int
tls_read(struct tls_conn *c, void *p, size_t len, size_t *got)
{
    int ret;

    assert(len > 0);
    assert(c->wlen == 0);       /* tls.h: finish the write first */
    *got = 0;
    if (c->dead != 0)
        return c->dead;
    ret = mbedtls_ssl_read(&c->ssl, p, len);
    if (ret > 0) {
        *got = (size_t)ret;
        return 0;
    }
    if (ret == MBEDTLS_ERR_SSL_WANT_READ)
        c->want = POLLIN;
    else
        /*
         * WANT_WRITE: mbedTLS had to answer something (a renegotiation
         * attempt) and the socket is full.  Its alert would then be
         * flushed in place of our next record (see the top), so give up
         * on the connection instead.
         */
        conn_failed(c, ret == MBEDTLS_ERR_SSL_WANT_WRITE
                       ? MBEDTLS_ERR_SSL_INTERNAL_ERROR : ret);
    return c->dead != 0 ? c->dead : GW_EAGAIN;
}

/*
 * The same, waiting until 'deadline' (net_read's contract).  OUT *n.
 * Returns 0, GW_ECLOSED, GW_ETIMEDOUT, GW_EABORTED or GW_EIO.
 */
GW_TESTABLE int
tls_read_deadline(struct tls_conn *c, void *p, size_t len, int64_t deadline,
                  int wake_fd, size_t *n)
{
    int rc;

    for (;;) {
        rc = tls_read(c, p, len, n);
        if (rc != GW_EAGAIN)
            return rc;
        rc = net_wait(c->fd, c->want, deadline, wake_fd);
        if (rc != 0)
            return rc;
    }
}

/* Does 'iov' start with the 'len' bytes at 'p'?  (tls.h's retry rule.) */
static int
iov_starts_with(const struct iovec *iov, int iovcnt, const unsigned char *p,
                size_t len)
{
    size_t k;

    for (int i = 0; i < iovcnt && len > 0; i++) {
        k = iov[i].iov_len < len ? iov[i].iov_len : len;
        if (memcmp(iov[i].iov_base, p, k) != 0)
            return 0;
        p += k;
        len -= k;
    }
    return len == 0;
}

/*
 * The next record's plaintext: up to 'max' bytes of 'iov' from byte 'off'.
 * OUT *p: where they are - in place when one iovec holds them all, else
 * gathered into c->wbuf.  Returns their count (0: nothing left).
 */
static size_t
next_record(struct tls_conn *c, const struct iovec *iov, int iovcnt,
            size_t off, size_t max, const unsigned char **p)
{
    size_t n = 0, k;
    int i;

    for (i = 0; i < iovcnt && off >= iov[i].iov_len; i++)
        off -= iov[i].iov_len;
    if (i == iovcnt)
        return 0;
    if (iov[i].iov_len - off >= max || i == iovcnt - 1) {
        *p = (const unsigned char *)iov[i].iov_base + off;
        return iov[i].iov_len - off < max ? iov[i].iov_len - off : max;
    }
    for (; i < iovcnt && n < max; i++, off = 0) {
        k = iov[i].iov_len - off < max - n ? iov[i].iov_len - off : max - n;
        memcpy(c->wbuf + n, (const char *)iov[i].iov_base + off, k);
        n += k;
    }
    *p = c->wbuf;
    return n;
}

/*
 * One non-blocking attempt to write the bytes of 'iov' (not modified),
 * gathered into records of at most TLS_RECORD_MAX bytes; net_write_some's
 * contract.  OUT *n: plaintext bytes taken, i.e. whose records the kernel
 * has taken in full; 0 when the socket is full (then wait for
 * c->want)).  Bytes not taken must be offered again, first thing, by
 * the next write on 'c' (through any iovec split: their content counts,
 * not the pointers).  The caller's own pending buffer does exactly this;
 * internally, a record mbedTLS could only partly send is finished from a
 * copy, so the caller may move or rebuild its buffer meanwhile.
 * Returns 0, GW_ECLOSED (peer gone: EPIPE, reset or close_notify seen) or
 * GW_EIO.  An error met after some bytes were taken is returned by the
 * next call.
 */
GW_TESTABLE int
tls_writev_some(struct tls_conn *c, const struct iovec *iov, int iovcnt,
                size_t *n)
{
    const unsigned char *p;
    size_t taken = 0, max, k;
    int ret;

    *n = 0;
    if (c->dead != 0)
        return c->dead;
    ret = mbedtls_ssl_get_max_out_record_payload(&c->ssl);
    max = ret > 0 && ret < TLS_RECORD_MAX ? (size_t)ret : TLS_RECORD_MAX;
    c->want = POLLOUT;
    if (c->wlen > 0) {
        /* The record mbedTLS half sent: the same call again, from the copy. */
        assert(iov_starts_with(iov, iovcnt, c->wbuf, c->wlen));
        ret = mbedtls_ssl_write(&c->ssl, c->wbuf, c->wlen);
        if (ret == MBEDTLS_ERR_SSL_WANT_WRITE)
            return 0;
        if (ret < 0)
            return conn_failed(c, ret);
        taken = c->wlen;
        c->wlen = 0;
    }
    while ((k = next_record(c, iov, iovcnt, taken, max, &p)) > 0) {
        ret = mbedtls_ssl_write(&c->ssl, p, k);
        if (ret > 0) {
            taken += (size_t)ret;
            continue;
        }
        /* (No WANT_READ: without renegotiation, writes never read.) */
        if (ret == MBEDTLS_ERR_SSL_WANT_WRITE) {
            /* Encrypted and partly sent: keep its plaintext for the retry. */
            if (p != c->wbuf)
                memcpy(c->wbuf, p, k);
            c->wlen = k;
        } else if (taken == 0) {
            return conn_failed(c, ret);
        } else {
            conn_failed(c, ret);        /* the next call reports it */
        }
        break;
    }
    *n = taken;
    return 0;
}

#ifdef INFERGW_UNIT_TEST
int
tls_write(struct tls_conn *c, const void *p, size_t len, size_t *n)
{
    struct iovec iov;
    int rc;

    iov.iov_base = (void *)p;
    iov.iov_len = len;
    rc = tls_writev_some(c, &iov, 1, n);
    if (rc == 0 && *n == 0 && len > 0)
        return GW_EAGAIN;
    return rc;
}
#endif

/* The same for an iovec array (modified as it is consumed). */
static int
tls_writev_all(struct tls_conn *c, struct iovec *iov, int iovcnt,
               int64_t deadline, int wake_fd)
{
    size_t w;
    int rc;

    for (;;) {
        while (iovcnt > 0 && iov[0].iov_len == 0) {
            iov++;
            iovcnt--;
        }
        if (iovcnt == 0)
            return 0;
        rc = tls_writev_some(c, iov, iovcnt, &w);
        if (rc != 0)
            return rc;
        if (w == 0) {
            rc = net_wait(c->fd, c->want, deadline, wake_fd);
            if (rc != 0)
                return rc;
            continue;
        }
        while (iovcnt > 0 && w >= iov[0].iov_len) {
            w -= iov[0].iov_len;
            iov++;
            iovcnt--;
        }
        if (iovcnt > 0) {
            iov[0].iov_base = (char *)iov[0].iov_base + w;
            iov[0].iov_len -= w;
        }
    }
}

#ifdef INFERGW_UNIT_TEST
int
tls_write_all(struct tls_conn *c, const void *p, size_t len,
              int64_t deadline, int wake_fd)
{
    struct iovec iov;

    iov.iov_base = (void *)p;
    iov.iov_len = len;
    return tls_writev_all(c, &iov, 1, deadline, wake_fd);
}
#endif

void
tls_close(struct tls_conn *c)
{
    if (c == NULL)
        return;
    /*
     * Best effort: a socket that cannot take the alert now does not get
     * it.  After a broken record mbedTLS must not be used at all.
     */
    if (c->dead == 0 || c->dead == GW_ECLOSED)
        mbedtls_ssl_close_notify(&c->ssl);
    mbedtls_ssl_free(&c->ssl);
    gw_free(c);
}

/* ---- as a net.h stream ---- */

static int
stream_read(struct net_stream *s, void *p, size_t len, int64_t deadline,
            int wake_fd, size_t *n)
{
    return tls_read_deadline(s->impl, p, len, deadline, wake_fd, n);
}

static int
stream_writev_some(struct net_stream *s, const struct iovec *iov, int iovcnt,
                   size_t *n)
{
    return tls_writev_some(s->impl, iov, iovcnt, n);
}

static int
stream_writev_all(struct net_stream *s, struct iovec *iov, int iovcnt,
                  int64_t deadline, int wake_fd)
{
    return tls_writev_all(s->impl, iov, iovcnt, deadline, wake_fd);
}

static size_t
stream_pending(const struct net_stream *s)
{
    return tls_pending(s->impl);
}

static const struct net_stream_ops stream_ops = {
    stream_read, stream_writev_some, stream_writev_all, stream_pending,
};

void
tls_stream_init(struct net_stream *s, struct tls_conn *c)
{
    net_stream_init_ops(s, c->fd, &stream_ops, c);
}

