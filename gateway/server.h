/*
 * server.h - listening socket, accept loop, one thread per connection,
 * and the drain that ends the process.
 *
 * Design: main() blocks SIGINT and SIGTERM in every thread and hands the
 * accept loop a signalfd, so no signal handler exists at all.  The accept
 * loop poll()s the listener and the signalfd.  Each accepted connection
 * gets a detached thread with the configured small stack; past
 * max_connections the acceptor answers 503 itself instead of spawning.
 *
 * Drain: 'draining' is set, the wake pipe becomes readable (every idle
 * keep-alive connection polls it and closes), the listener is closed, and
 * server_drain() waits until the last connection thread has gone or
 * drain_timeout passes.  Requests already accepted run to completion.
 */
#ifndef INFERGW_GATEWAY_SERVER_H
#define INFERGW_GATEWAY_SERVER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

struct gw_config;
struct upstream;
struct coalescer;

struct server {
    const struct gw_config *cfg;    /* borrowed; immutable */
    struct upstream *up;            /* borrowed; thread-safe */
    struct coalescer *co;           /* borrowed; thread-safe */
    int listen_fd;
    uint16_t port;                  /* the port actually bound */
    int wake_rd, wake_wr;           /* pipe; readable once draining */
    int done_rd, done_wr;           /* pipe; a byte when the last
                                       connection ends while draining */
    _Atomic int draining;
    _Atomic long active;            /* connection threads alive */
    pthread_attr_t attr;            /* detached, configured stack size */
    unsigned ncpu;                  /* CPUs online at start, >= 1 */
};

/* Prepare 's'; borrows everything.  0, GW_EIO or GW_EINVAL (logged). */
int server_init(struct server *s, const struct gw_config *cfg,
                struct upstream *up, struct coalescer *co);

/* Bind and listen; logs "server: listening addr=... port=N". */
int server_listen(struct server *s);

/*
 * Accept connections until SIGINT/SIGTERM arrives on 'sig_fd' (a
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

/* Close what is still open (not the borrowed objects). */
void server_release(struct server *s);

static inline int
server_draining(struct server *s)
{
    return atomic_load_explicit(&s->draining, memory_order_relaxed);
}

#endif
