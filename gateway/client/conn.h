/* SPDX-License-Identifier: MIT */
/*
 * conn.h - one client connection: the keep-alive loop of one thread.
 *
 * Design: the loop reads a request head (bounded by max_header_size and
 * the header and idle timeouts), hands the request to route.c as a
 * struct handler_req, writes the access-log line and goes round again
 * while keep-alive holds.  The access line names the client: the
 * socket's peer, or, from a peer in [server] trusted_proxies, the
 * address its X-Forwarded-For gives (conn.c says how it is read).  A head that cannot be parsed gets its error
 * (reply.c) and the connection closes, because the bytes that follow can
 * no longer be trusted to start a request (RFC 9112 section 9.3 and the
 * smuggling notes in section 11.2).
 *
 * The connection owns its client's stream (net.h): the plain socket, or
 * TLS (tls.h) once the handshake is done.  It lends the stream, through
 * its struct reply (reply.h), to whatever reads or writes for the client;
 * only this module knows which kind of connection it is.
 *
 * The connection's state is its thread's own, with one exception: while
 * its client is a parked follower of a flight, the leader or a helper may
 * write its response for it (fanout.h says when; reply.h says what).
 */
#ifndef INFERGW_GATEWAY_CLIENT_CONN_H
#define INFERGW_GATEWAY_CLIENT_CONN_H

struct handler_ctx;

/*
 * A request id the gateway makes (for a request without a usable
 * X-Request-Id, or a connection refused before any request): this many
 * random hex digits, 64 bits, enough to find one request's log lines.
 */
#define CONN_REQUEST_ID_LEN 16

/*
 * Thread body: serve requests on 'fd' until the client closes, an error,
 * the idle timeout, a drain or a stop.  Steals 'fd' (closes it).  Out of
 * memory for the connection itself answers 503 before closing.  'tls':
 * it came to tls_listen; the TLS handshake comes first, with the
 * certificate of the configuration in force.  'admin': it came to
 * [admin] listen, which serves the operator's routes alone (route.h).
 */
void conn_serve(const struct handler_ctx *ctx, int fd, int tls, int admin);

#endif
