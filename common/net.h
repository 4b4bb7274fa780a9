/*
 * net.h - sockets with deadlines: listen, connect, read, write.
 *
 * Sockets handed to these functions are non-blocking; "blocking" behaviour
 * is poll() until a deadline (a gw_now_ms() value, -1 = none).  That one
 * model serves both the blocking connection threads and the non-blocking
 * flushes a coalescing leader does inside its upstream callback.
 *
 * 'wake_fd' arguments (or -1): a descriptor that becomes readable when the
 * process starts draining; a wait that sees it readable returns GW_EABORTED.
 *
 * A connection's bytes may go through a stream layered on the socket
 * (TLS, gateway/tls.h): once its thread attaches a struct net_stream to
 * the descriptor, net_wait(POLLIN), net_read and the net_write functions
 * on that descriptor go through the stream's functions, with the same
 * contracts.  So the modules above keep passing the descriptor they have
 * and never know which kind of connection it is; only the code that
 * attaches the stream (conn.c) does.  The peer checks look at the socket
 * alone: a client that hangs up closes it, close_notify or not.
 */
#ifndef INFERGW_COMMON_NET_H
#define INFERGW_COMMON_NET_H

#include <poll.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "util.h"

/*
 * Listen on 'addr': "HOST:PORT", "[V6]:PORT" or ":PORT" (all interfaces).
 * Port 0 picks a free port.  OUT *fd: the non-blocking, close-on-exec
 * listening socket; OUT *port: the port actually bound.
 * Returns 0, GW_EINVAL (bad address) or GW_EIO (logged).
 */
int net_listen(const char *addr, int backlog, int *fd, uint16_t *port);

/*
 * Accept one connection: OUT *cfd is non-blocking, close-on-exec, with
 * TCP_NODELAY.  Returns 0, GW_EAGAIN (nothing pending) or GW_EIO.
 */
int net_accept(int lfd, int *cfd);

/* Connect to "HOST:PORT" with a deadline; OUT *fd is non-blocking. */
int net_connect(const char *addr, int64_t deadline, int *fd);

/* Set O_NONBLOCK; 0 or GW_EIO. */
int net_set_nonblock(int fd);

/*
 * Wait until 'fd' is readable (events POLLIN) or writable (POLLOUT).
 * Returns 0, GW_ETIMEDOUT, GW_EABORTED (wake_fd readable) or GW_EIO.
 */
int net_wait(int fd, short events, int64_t deadline, int wake_fd);

/*
 * Read at most 'len' bytes.  OUT *n: bytes read, 0 only with GW_ECLOSED.
 * Returns 0, GW_ECLOSED (orderly EOF), GW_ETIMEDOUT, GW_EABORTED or GW_EIO
 * (connection reset and the like; not logged, it is the peer's doing).
 */
int net_read(int fd, void *p, size_t len, int64_t deadline, int wake_fd,
             size_t *n);

/*
 * Write everything, waiting for the socket up to 'deadline'.  A write is
 * tried before any wait, so 'wake_fd' only cuts a wait short.
 * Returns 0, GW_ETIMEDOUT, GW_EABORTED (wake_fd readable while the
 * socket was full), GW_ECLOSED (peer gone: EPIPE/ECONNRESET) or GW_EIO.
 * MSG_NOSIGNAL is used, so no SIGPIPE.
 */
int net_write_all(int fd, const void *p, size_t len, int64_t deadline,
                  int wake_fd);

/* Same for an iovec array (the array is modified as it is consumed). */
int net_writev_all(int fd, struct iovec *iov, int iovcnt, int64_t deadline,
                   int wake_fd);

/*
 * One non-blocking attempt: OUT *n gets what the kernel took (maybe 0).
 * Returns 0, GW_ECLOSED or GW_EIO.
 */
int net_write_some(int fd, const void *p, size_t len, size_t *n);

/* Same for an iovec array (not modified). */
int net_writev_some(int fd, const struct iovec *iov, int iovcnt, size_t *n);

/*
 * Has the peer gone?  Non-blocking check of a socket we are not reading
 * from: 1 if it hung up or reset, 0 if it looks alive (pending input does
 * not count as gone).
 */
int net_peer_gone(int fd);

/*
 * The same for many sockets in one poll(): set each pfd[i].fd; OUT each
 * pfd[i].revents is 1 (gone) or 0.  Returns how many look gone.
 */
int net_peers_gone(struct pollfd *pfd, size_t n);

/*
 * A stream over a socket: its functions keep the contracts of net_read,
 * net_writev_some and net_writev_all above, and 'pending' says how many
 * bytes it can give without reading the socket (so net_wait(POLLIN)
 * returns at once).  'impl' is the stream's own object.
 */
struct net_stream_ops {
    int (*read)(void *impl, void *p, size_t len, int64_t deadline,
                int wake_fd, size_t *n);
    int (*writev_some)(void *impl, const struct iovec *iov, int iovcnt,
                       size_t *n);
    int (*writev_all)(void *impl, struct iovec *iov, int iovcnt,
                      int64_t deadline, int wake_fd);
    size_t (*pending)(const void *impl);
};

struct net_stream {
    const struct net_stream_ops *ops;
    void *impl;
};

/*
 * Make room for descriptors below 'max_fds' to carry streams (once,
 * before any thread attaches).  Returns 0 or GW_ENOMEM.
 */
int net_streams_init(size_t max_fds);

/*
 * 'fd' carries 's' from now on (borrowed, until net_detach_stream).
 * Returns 0, or GW_EINVAL when fd is out of net_streams_init()'s range.
 */
int net_attach_stream(int fd, const struct net_stream *s);

/* 'fd' is a plain socket again. */
void net_detach_stream(int fd);

#endif
