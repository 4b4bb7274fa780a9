/* SPDX-License-Identifier: MIT */
/*
 * tls.h - server-side TLS over a socket, with mbedTLS 2.28.
 *
 * Two objects:
 *
 *   struct tls_server  the certificate chain, its key and the mbedTLS
 *                      configuration: made once (at startup or reload),
 *                      then shared read-only by every connection thread.
 *   struct tls_conn    one client connection, owned by one thread at a
 *                      time, over a socket descriptor the caller keeps
 *                      owning (the caller closes it, after tls_close()).
 *                      About 50 KiB: mbedTLS's two record buffers, and
 *                      ours for writes (see Design).
 *
 * The I/O model is net.h's: the primitives never block (every recv/send
 * uses MSG_DONTWAIT and MSG_NOSIGNAL), and "blocking" helpers poll() until
 * a deadline (a gw_now_ms() value, -1 = none); a 'wake_fd' (or -1) that
 * becomes readable ends a wait with GW_EABORTED.
 *
 * What this build offers (Debian 12's libmbedtls 2.28):
 *   - TLS 1.2 only.  SSLv3 is not compiled in; TLS 1.0 and 1.1 are, and are
 *     refused here.  mbedTLS 2.28 has no TLS 1.3 (MBEDTLS_SSL_PROTO_TLS1_3_
 *     EXPERIMENTAL is off in Debian's config.h, and its own documentation
 *     says TLS 1.3 is not supported in 2.28), so min_version 13 is refused
 *     with a message saying so.
 *   - Six cipher suites, all ECDHE key exchange (forward secrecy) with an
 *     AEAD cipher, in this order of preference: ECDHE-ECDSA/RSA with
 *     ChaCha20-Poly1305, AES-128-GCM, then AES-256-GCM (the ECDSA or the
 *     RSA three, as the certificate's key is; tls_server.c says why this
 *     order).
 *     Of the 127 TLS 1.2 suites Debian's mbedTLS has, nothing else: no
 *     static RSA or ECDH key exchange (no forward secrecy), no DHE (its
 *     2048-bit group costs a multiple of X25519's CPU), no PSK, no CBC,
 *     CCM, CCM_8 or Camellia.  A client with none of the six fails the
 *     handshake: handshake_failure alert, "no cipher suite in common",
 *     counted as failed_protocol.
 *   - ALPN: "http/1.1" only.  A client that offers ALPN without
 *     "http/1.1" (h2 only, say) fails the handshake with the
 *     no_application_protocol alert, as RFC 7301 section 3.2 says and as
 *     nginx does since 1.21.4; a client that offers no ALPN at all
 *     proceeds (HTTP/1.1 is implied).
 *   - Session resumption with session tickets (RFC 5077) when
 *     session_timeout_s > 0: mbedTLS's ssl_ticket, AES-256-GCM under a
 *     random key that only this process knows, replaced every
 *     session_timeout_s (the one before is kept to read older tickets).
 *     A ticket older than session_timeout_s, from a key no longer kept,
 *     or for another cipher suite than the one the handshake picks (a
 *     resumed session keeps its suite: see ticket_parse() in
 *     tls_server.c) is ignored, and the handshake is a full one with a
 *     new ticket.  There is no session-ID cache: a client without
 *     tickets gets a full handshake every time.  No renegotiation.
 *   - A server made to replace another ('prev' in tls_server_opts, on a
 *     reload) takes over its ticket keys when session_timeout_s is the
 *     same, so sessions resume across a reload; a new session_timeout_s
 *     makes new keys (sessions from before make full handshakes).
 *
 * Design: mbedTLS's rule for a non-blocking write (ssl.h, on
 * mbedtls_ssl_write()): "When this function returns
 * MBEDTLS_ERR_SSL_WANT_WRITE/READ, it must be called later with the *same*
 * arguments, until it returns a value greater than or equal to 0", because
 * mbedTLS has already encrypted the record and only part of it went out.
 * tls_writev_some() hides that: it keeps a copy of the plaintext of that
 * one record (at most TLS_RECORD_MAX bytes) and reports bytes as taken only
 * once their record has been handed to the kernel in full, exactly like
 * net_write_some().  What is left to the caller is the rule every stream
 * writer follows anyway: after a write that took fewer bytes than offered,
 * offer the bytes that were not taken again, from the same position (more
 * may follow them; different ones may not - that is asserted).
 */
#ifndef INFERGW_GATEWAY_WIRE_TLS_H
#define INFERGW_GATEWAY_WIRE_TLS_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "base/metrics.h"
#include "net.h"
#include "util.h"

/* The largest plaintext record (MBEDTLS_SSL_OUT_CONTENT_LEN). */
#define TLS_RECORD_MAX 16384

/* Handshake counters: struct tls_stats, metrics.h (metrics owns them). */

struct tls_server_opts {
    const char *cert_file;      /* PEM: the leaf first, then intermediates */
    const char *key_file;       /* PEM: the leaf's private key, unencrypted */
    int min_version;            /* 12 (TLS 1.2) or 13 (refused, see above) */
    int handshake_timeout_ms;   /* > 0: the longest a handshake may take */
    struct tls_stats *stats;    /* borrowed, may be NULL; must outlive the
                                   server */
    int session_timeout_s;      /* >= 0: session tickets' lifetime; 0 = no
                                   resumption */
    const struct tls_server *prev;  /* borrowed, may be NULL: the server
                                   this one replaces, whose ticket keys it
                                   shares if session_timeout_s is the
                                   same (see above); not kept */
};

struct tls_server;
struct tls_conn;

/*
 * Load the certificate chain and key and build the shared configuration.
 * Borrows 'o' (the paths are not kept).  Checks, each with its own
 * message in 'err' (at most 'errlen' bytes, NUL-terminated if errlen > 0;
 * nothing is logged here: the caller adds its file:line): a file that
 * cannot be read, a cert_file that is not a PEM certificate chain, a
 * key_file that is not an (unencrypted) private key, a key that does not
 * match the leaf certificate, a leaf that has expired or is not valid
 * yet, min_version and session_timeout_s.  Key bytes never appear in a
 * message.
 * OUT *out: owned by the caller, free with tls_server_free().
 * Returns 0, GW_EINVAL (bad file or option), GW_EIO (file unreadable) or
 * GW_ENOMEM.
 *
 * The result is read-only and may be used by any number of threads at
 * once (mbedTLS is built with MBEDTLS_THREADING_PTHREAD, its random
 * generator locks itself, and the key is only read: see tls_server.c).  The
 * ticket keys it may share with 'prev' are freed with the last server
 * that uses them, from whichever thread frees it.
 */
int tls_server_new(const struct tls_server_opts *o, struct tls_server **out,
                   char *err, size_t errlen);

/*
 * Free the server, wiping its private key (mbedtls_pk_free() zeroises).
 * Every tls_conn made from it must have been closed.  NULL-safe.
 */
void tls_server_free(struct tls_server *s);

/*
 * Run the whole handshake on the accepted socket 'fd' (borrowed; blocking
 * or not, it is never waited on except through poll()).  It must be done
 * by 'deadline' and within the server's handshake_timeout_ms, whichever
 * comes first, however slowly the client trickles its bytes.
 * OUT *out: the connection, owned by the calling thread (tls_close()).
 * On failure 'err' (errlen bytes, may be 0) says why in one line, for the
 * caller to log with the client's address: e.g. "plain HTTP request on
 * the TLS port", "client offered no TLS version >= 1.2", "client refused
 * our certificate (alert 48 unknown_ca)".
 * Returns 0; GW_ETIMEDOUT; GW_EABORTED (wake_fd readable while waiting);
 * GW_ECLOSED (the client closed or reset); GW_EPARSE (not TLS, a TLS the
 * server refuses, or a client that refuses the server); GW_ENOMEM; GW_EIO
 * (a socket error).  Each outcome is counted in the server's tls_stats
 * (a resumed handshake in 'resumed' as well as in 'handshakes').
 */
int tls_accept(struct tls_server *s, int fd, int64_t deadline, int wake_fd,
               struct tls_conn **out, char *err, size_t errlen);

/*
 * Send close_notify if the socket takes it now (never waits), then free
 * 'c'.  The socket stays open: the caller closes it.  NULL-safe.
 */
void tls_close(struct tls_conn *c);

/*
 * 's' becomes the stream of c's socket through TLS (net.h): every
 * net_stream_* call on it goes through tls.c's reads and writes, which
 * no other module calls (the stream is the one interface).  's' borrows
 * 'c' (and its socket): tls_close() comes after the last use of 's'.
 */
void tls_stream_init(struct net_stream *s, struct tls_conn *c);

#ifdef INFERGW_UNIT_TEST
/* ---- test builds only (test/check_exports.py) ---- */

/* tls.c's own (static in other builds; documented there). */
int tls_read(struct tls_conn *c, void *p, size_t len, size_t *got);
int tls_read_deadline(struct tls_conn *c, void *p, size_t len,
                      int64_t deadline, int wake_fd, size_t *n);
size_t tls_pending(const struct tls_conn *c);
int tls_writev_some(struct tls_conn *c, const struct iovec *iov, int iovcnt,
                    size_t *n);

/* POLLIN or POLLOUT: what the last GW_EAGAIN (or short write) waits for. */
short tls_want(const struct tls_conn *c);

/*
 * tls_writev_some() for one buffer, except that a full socket is
 * GW_EAGAIN (then *n is 0).  Returns 0 with OUT *n > 0 (maybe < len),
 * GW_EAGAIN, GW_ECLOSED or GW_EIO.
 */
int tls_write(struct tls_conn *c, const void *p, size_t len, size_t *n);

/*
 * Write everything, waiting up to 'deadline' (net_write_all's contract).
 * Returns 0, GW_ETIMEDOUT, GW_EABORTED, GW_ECLOSED or GW_EIO.
 */
int tls_write_all(struct tls_conn *c, const void *p, size_t len,
                  int64_t deadline, int wake_fd);
#endif

#endif
