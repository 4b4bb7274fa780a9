/* SPDX-License-Identifier: MIT */
/*
 * server.h - listening socket, accept loop, one thread per connection,
 * and the drain and stop that end the process.
 *
 * Design: main() blocks SIGHUP, SIGINT and SIGTERM in every thread and
 * hands the
 * accept loop a signalfd, so no signal handler exists at all.  The accept
 * loop poll()s the listener and the signalfd.  Each accepted connection
 * gets a detached thread with the configured small stack and the
 * server's struct handler_ctx; past max_connections the acceptor answers
 * 503 itself (reply_refuse(), which never waits) instead of spawning.
 *
 * Ending, in two steps:
 *  - Drain (the first signal): 'draining' is set, the wake pipe becomes
 *    readable (every idle keep-alive connection polls it and closes), the
 *    listener is closed, and server_drain() waits until the last
 *    connection thread has gone or drain_timeout passes.  Requests
 *    already accepted run to completion.
 *  - Stop (drain_timeout passed): server_stop() sets 'stopping', makes
 *    the stop pipe readable and wakes every parked follower.  Every wait
 *    a connection thread can be in then ends: a client write, or a
 *    request head or body still arriving (answered 503), at once through
 *    the pipe; a parked follower at once, or, if the
 *    leader had it claimed just then, when its leader's upstream
 *    transfer stops, which its loop does at once: it watches the stop
 *    pipe (GW_ESTOPPING).  Every stream still open ends the defined
 *    way: an SSE error event once a stream is under way, else a 503, and
 *    no clean end.  server_wait() then waits for the threads to leave.
 *
 * Lifetime: a connection thread uses the server (its ctx) until it has
 * counted itself out of 'active', and nothing of it after; so once
 * 'active' is 0 the server may go.
 */
#ifndef INFERGW_GATEWAY_CLIENT_SERVER_H
#define INFERGW_GATEWAY_CLIENT_SERVER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "base/handler.h"
#include "log.h"

struct generations;
struct coalescer;
struct tenants;

struct server {
    struct handler_ctx ctx;         /* immutable once server_init() is
                                       done; given to every connection */
    struct generations *gens;       /* borrowed: the configuration */
    int listen_fd;                  /* plain HTTP; -1 if none */
    uint16_t port;                  /* the port actually bound */
    int tls_fd;                     /* tls_listen; -1 if none */
    uint16_t tls_port;
    int admin_fd;                   /* [admin] listen; -1 if none */
    uint16_t admin_port;
    int wake_rd, wake_wr;           /* pipe; readable once draining */
    int stop_rd, stop_wr;           /* pipe; readable once stopping */
    int done_rd, done_wr;           /* pipe; a byte whenever the last
                                       connection thread leaves */
    _Atomic int draining;
    _Atomic int stopping;
    _Atomic long active;            /* connection threads alive */
    pthread_attr_t attr;            /* detached, configured stack size */
    struct log_repeat accept_failing;   /* the acceptor's alone: out of
                                           descriptors, accept() fails
                                           every backoff (log.h) */
};

/*
 * Prepare 's'; borrows everything.  Returns 0, or GW_EIO or GW_EINVAL
 * (logged) with nothing left open.
 */
int server_init(struct server *s, struct generations *gens,
                struct coalescer *co, struct tenants *tenants);

/*
 * Bind and listen on listen, tls_listen and [admin] listen (those set);
 * logs "server: listening addr=... port=N", "server: listening for TLS
 * tls_addr=... tls_port=N" and "server: listening for admin
 * admin_addr=... admin_port=N".  The admin listener is plain HTTP and
 * serves /metrics, /healthz, /readyz and the status view (status.h)
 * alone (route.h).
 */
int server_listen(struct server *s);

/*
 * Accept connections until SIGINT/SIGTERM arrives on 'sig_fd' (a
 * SIGHUP reloads the configuration, generation.h, and accepting goes on) (a
 * signalfd).  Then starts the drain (readyz 503, wake pipe, listener
 * closed) and returns 0.  GW_EIO on a fatal accept error.
 */
int server_run(struct server *s, int sig_fd);

/*
 * Wait for connection threads to finish, at most drain_timeout.
 * Returns 0 when all are done, GW_ETIMEDOUT, or GW_EABORTED if a second
 * signal arrived on 'sig_fd' (the caller exits at once).
 */
int server_drain(struct server *s, int sig_fd);

/* The stop (see above): every wait ends, every open stream is cut. */
void server_stop(struct server *s);

/* Wait for connection threads to finish, at most 'ms'.  0 or
 * GW_ETIMEDOUT. */
int server_wait(struct server *s, int64_t ms);

/* Close what is still open (not the borrowed objects). */
void server_release(struct server *s);

#endif
