/* SPDX-License-Identifier: MIT */
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
 * A client connection's bytes go through a struct net_stream: a plain
 * socket (net_stream_init()) or a stream layered on it (TLS,
 * gateway/wire/tls.h), owned by the connection and passed explicitly to
 * whatever reads or writes for it.  The net_stream_* functions keep the
 * contracts of their raw namesakes below, so the modules above never know
 * which kind of connection they hold; only the code that makes the stream
 * (gateway/client/conn.c) does.  The peer checks look at the socket alone
 * (net_stream_fd()): a client that hangs up closes it, close_notify or
 * not.  The raw functions serve the sockets that carry no stream:
 * listening, connecting, the stream implementations themselves, tools/.
 */
#ifndef INFERGW_COMMON_NET_H
#define INFERGW_COMMON_NET_H

#include <poll.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "util.h"

/*
 * Split an address: "HOST:PORT", "[V6]:PORT" or ":PORT" (all
 * interfaces).  Borrows 's'.  OUT *host, *host_len: a view into 's',
 * without the brackets, empty for ":PORT"; OUT *port: 0..65535.  A host
 * outside brackets holds no ':' (the first one ends it, so a bare IPv6
 * address is refused), a bracketed one is not empty, and PORT is one to
 * five decimal digits.  What else a host may hold is left to the caller
 * (gateway/base/config_schema.c checks its characters) or the resolver.
 * Returns 0 or GW_EINVAL.
 */
int net_parse_hostport(const char *s, const char **host, size_t *host_len,
                       int *port);

/*
 * An IP address, for matching against trusted networks (a client's, a
 * proxy's).  An IPv4-mapped IPv6 address (::ffff:a.b.c.d, what a
 * dual-stack socket reports for an IPv4 peer) is kept as the IPv4
 * address it maps, so one rule covers a peer however it came in.
 */
struct net_addr {
    int family;                 /* AF_INET or AF_INET6 */
    unsigned char b[16];        /* network order; IPv4 in b[0..4) */
};

/* A network: 'addr' with every bit past the first 'bits' zero. */
struct net_cidr {
    struct net_addr addr;
    unsigned bits;              /* 0..32 (IPv4) or 0..128 (IPv6) */
};

/* Room for net_addr_format()'s text, NUL included. */
#define NET_ADDR_STRLEN 46

/*
 * Parse p[0..n): a dotted-quad IPv4 address or an IPv6 address (RFC
 * 4291 text, no brackets, no zone, no port), inet_pton()'s forms.
 * Borrows 'p'.  OUT *a on success.  Returns 0 or GW_EINVAL.
 */
int net_addr_parse(const char *p, size_t n, struct net_addr *a);

/*
 * The address of socket address 'sa' (AF_INET or AF_INET6; a mapped
 * IPv4 address unmapped).  OUT *a.  Returns 0 or GW_EINVAL (another
 * family, such as a Unix socket's).
 */
int net_addr_from_sockaddr(const void *sa, struct net_addr *a);

/* 'a' as text into out[0..n), n >= NET_ADDR_STRLEN ("-" if it cannot). */
void net_addr_format(const struct net_addr *a, char *out, size_t n);

/*
 * Parse p[0..n): "ADDR/BITS" or a lone ADDR (all its bits), ADDR as
 * net_addr_parse() reads it, BITS a decimal without leading zeros up
 * to the family's width.  Host bits set past BITS ("10.1.0.0/8") are
 * refused: they are almost always a typo for another network.  A mapped
 * IPv4 network of at least 96 bits becomes the IPv4 one.  Borrows 'p'.
 * OUT *c on success.  Returns 0 or GW_EINVAL.
 */
int net_cidr_parse(const char *p, size_t n, struct net_cidr *c);

/* Is 'a' inside network 'c'?  Families must agree. */
int net_cidr_match(const struct net_cidr *c, const struct net_addr *a);

/*
 * Listen on 'addr' (net_parse_hostport() forms).  Port 0 picks a free
 * port.  OUT *fd: the non-blocking, close-on-exec
 * listening socket; OUT *port: the port actually bound.
 * Returns 0, GW_EINVAL (bad address) or GW_EIO (logged).
 */
int net_listen(const char *addr, int backlog, int *fd, uint16_t *port);

/*
 * Accept one connection: OUT *cfd is non-blocking, close-on-exec, with
 * TCP_NODELAY.  Returns 0, GW_EAGAIN (nothing pending) or GW_EIO.
 */
int net_accept(int lfd, int *cfd);

/*
 * Connect to 'addr' (net_parse_hostport() forms) with a deadline; OUT *fd
 * is non-blocking.
 */
int net_connect(const char *addr, int64_t deadline, int *fd);

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
 * A stream over a socket.  Each function keeps the contract of its raw
 * namesake above (read: net_read, writev_some: net_write_some over an
 * iovec array, which it does not modify, writev_all: net_writev_all),
 * and 'pending' says how many bytes it can give without reading the
 * socket (so net_stream_wait(POLLIN) returns at once).
 */
struct net_stream;

struct net_stream_ops {
    int (*read)(struct net_stream *s, void *p, size_t len, int64_t deadline,
                int wake_fd, size_t *n);
    int (*writev_some)(struct net_stream *s, const struct iovec *iov,
                       int iovcnt, size_t *n);
    int (*writev_all)(struct net_stream *s, struct iovec *iov, int iovcnt,
                      int64_t deadline, int wake_fd);
    size_t (*pending)(const struct net_stream *s);
};

/*
 * One connection's stream: embedded in the struct of whoever owns the
 * connection, used by one thread at a time (the owner, or the thread it
 * hands its client to: gateway/coalesce/fanout.h), and valid while the socket is
 * open and 'impl' lives.  Fill it with net_stream_init() or an
 * implementation's own init (tls_stream_init()); never change it while
 * another thread may use it.
 */
struct net_stream {
    const struct net_stream_ops *ops;
    void *impl;                 /* the implementation's object, borrowed;
                                   NULL for a plain socket */
    int fd;                     /* the socket, borrowed */
};

/* 's' is the plain socket 'fd' (borrowed): the raw functions above. */
void net_stream_init(struct net_stream *s, int fd);

/* 's' is 'fd' (borrowed) through 'ops' on 'impl' (both borrowed). */
void net_stream_init_ops(struct net_stream *s, int fd,
                         const struct net_stream_ops *ops, void *impl);

/* The socket under 's': for the peer checks and socket options. */
int net_stream_fd(const struct net_stream *s);

/*
 * net_wait() on the stream: POLLIN returns at once while the stream holds
 * bytes it read ahead (decrypted, say).
 */
int net_stream_wait(struct net_stream *s, short events, int64_t deadline,
                    int wake_fd);

/* net_read(), net_write_all(), ... on the stream, with their contracts. */
int net_stream_read(struct net_stream *s, void *p, size_t len,
                    int64_t deadline, int wake_fd, size_t *n);
int net_stream_write_all(struct net_stream *s, const void *p, size_t len,
                         int64_t deadline, int wake_fd);
int net_stream_writev_all(struct net_stream *s, struct iovec *iov,
                          int iovcnt, int64_t deadline, int wake_fd);
int net_stream_writev_some(struct net_stream *s, const struct iovec *iov,
                           int iovcnt, size_t *n);

#ifdef INFERGW_UNIT_TEST
/* ---- test builds only (test/check_exports.py) ---- */

/* Set O_NONBLOCK; 0 or GW_EIO. */
int net_set_nonblock(int fd);
#endif

#endif
