/* SPDX-License-Identifier: MIT */
/*
 * net.c - non-blocking sockets with poll()-based deadlines, and the
 * stream interface a client connection's bytes go through.
 */
#include "net.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "log.h"

int
net_parse_hostport(const char *s, const char **host, size_t *host_len,
                   int *port)
{
    const char *h = s, *colon, *close;
    size_t n;
    uint64_t v;

    if (s[0] == '[') {
        close = strchr(s, ']');
        if (close == NULL || close == s + 1 || close[1] != ':')
            return GW_EINVAL;
        h = s + 1;
        colon = close + 1;
    } else {
        colon = strchr(s, ':');
        if (colon == NULL)
            return GW_EINVAL;
        close = colon;
    }
    n = strlen(colon + 1);
    if (n > 5 || gw_parse_uint(colon + 1, n, 65535, &v) != 0)
        return GW_EINVAL;       /* also a second ':' outside brackets */
    *host = h;
    *host_len = (size_t)(close - h);
    *port = (int)v;
    return 0;
}

/* ::ffff:0:0/96, the prefix of an IPv4-mapped IPv6 address. */
static const unsigned char v4_mapped[12] = {
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff
};

/* An IPv4-mapped IPv6 address becomes the IPv4 address it maps. */
static void
unmap(struct net_addr *a)
{
    if (a->family == AF_INET6 && memcmp(a->b, v4_mapped, 12) == 0) {
        a->family = AF_INET;
        memmove(a->b, a->b + 12, 4);
        memset(a->b + 4, 0, 12);
    }
}

int
net_addr_parse(const char *p, size_t n, struct net_addr *a)
{
    char text[NET_ADDR_STRLEN];
    struct net_addr out;

    /* inet_pton() reads a C string: copy, and refuse what cannot fit
     * (the longest IPv6 text is 45 characters). */
    if (n == 0 || n >= sizeof(text) || memchr(p, '\0', n) != NULL)
        return GW_EINVAL;
    memcpy(text, p, n);
    text[n] = '\0';
    memset(&out, 0, sizeof(out));
    if (inet_pton(AF_INET, text, out.b) == 1)
        out.family = AF_INET;
    else if (inet_pton(AF_INET6, text, out.b) == 1)
        out.family = AF_INET6;
    else
        return GW_EINVAL;
    unmap(&out);
    *a = out;
    return 0;
}

int
net_addr_from_sockaddr(const void *sa, struct net_addr *a)
{
    const struct sockaddr_in *in4 = sa;
    const struct sockaddr_in6 *in6 = sa;

    memset(a, 0, sizeof(*a));
    switch (((const struct sockaddr *)sa)->sa_family) {
    case AF_INET:
        a->family = AF_INET;
        memcpy(a->b, &in4->sin_addr, 4);
        return 0;
    case AF_INET6:
        a->family = AF_INET6;
        memcpy(a->b, &in6->sin6_addr, 16);
        unmap(a);
        return 0;
    }
    return GW_EINVAL;
}

void
net_addr_format(const struct net_addr *a, char *out, size_t n)
{
    if (n < NET_ADDR_STRLEN
        || (a->family != AF_INET && a->family != AF_INET6)
        || inet_ntop(a->family, a->b, out, (socklen_t)n) == NULL)
        snprintf(out, n, "-");
}

int
net_cidr_parse(const char *p, size_t n, struct net_cidr *c)
{
    const char *slash = memchr(p, '/', n);
    size_t alen = slash != NULL ? (size_t)(slash - p) : n;
    size_t blen = slash != NULL ? n - alen - 1 : 0;
    struct net_addr a;
    unsigned width, bits, i;
    uint64_t v;

    if (net_addr_parse(p, alen, &a) != 0)
        return GW_EINVAL;
    /* net_addr_parse() unmapped a mapped address: its width is 128. */
    width = a.family == AF_INET6 || (alen > 0 && memchr(p, ':', alen))
            ? 128 : 32;
    bits = width;
    if (slash != NULL) {
        if (blen == 0 || blen > 3 || (blen > 1 && slash[1] == '0')
            || gw_parse_uint(slash + 1, blen, width, &v) != 0)
            return GW_EINVAL;
        bits = (unsigned)v;
    }
    if (a.family == AF_INET && width == 128) {
        /* ::ffff:a.b.c.d/BITS: its IPv4 part, if the prefix covers the
         * mapping's 96 bits; a wider one spans more than IPv4. */
        if (bits < 96)
            return GW_EINVAL;
        bits -= 96;
    }
    /* No host bits past the prefix. */
    for (i = bits; i < (a.family == AF_INET ? 32u : 128u); i++)
        if (a.b[i / 8] & (0x80 >> (i % 8)))
            return GW_EINVAL;
    c->addr = a;
    c->bits = bits;
    return 0;
}

int
net_cidr_match(const struct net_cidr *c, const struct net_addr *a)
{
    unsigned whole = c->bits / 8, rest = c->bits % 8;
    unsigned char mask;

    if (c->addr.family != a->family)
        return 0;
    if (memcmp(c->addr.b, a->b, whole) != 0)
        return 0;
    if (rest == 0)
        return 1;
    mask = (unsigned char)(0xff << (8 - rest));
    return (c->addr.b[whole] & mask) == (a->b[whole] & mask);
}

static int
resolve(const char *addr, int passive, struct addrinfo **res)
{
    struct addrinfo hints;
    char host[256], port[8];
    const char *h;
    size_t hl;
    int p, rc;

    if (net_parse_hostport(addr, &h, &hl, &p) != 0 || hl >= sizeof(host))
        return GW_EINVAL;
    memcpy(host, h, hl);
    host[hl] = '\0';
    snprintf(port, sizeof(port), "%d", p);
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = passive ? AI_PASSIVE : 0;
    rc = getaddrinfo(host[0] != '\0' ? host : NULL, port, &hints, res);
    if (rc != 0) {
        log_msg(GW_LOG_ERROR, "net: cannot resolve addr=%s err=\"%s\"", addr,
                gai_strerror(rc));
        return GW_EINVAL;
    }
    return 0;
}

#ifdef INFERGW_UNIT_TEST
int
net_set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);

    if (fl == -1 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) == -1)
        return GW_EIO;
    return 0;
}
#endif

int
net_listen(const char *addr, int backlog, int *fd, uint16_t *port)
{
    struct addrinfo *res = NULL, *ai;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    int s = -1, one = 1, err = 0;
    int rc;

    *fd = -1;
    rc = resolve(addr, 1, &res);
    if (rc != 0)
        goto out;
    rc = GW_EIO;
    for (ai = res; ai != NULL; ai = ai->ai_next) {
        s = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK
                   | SOCK_CLOEXEC, ai->ai_protocol);
        if (s == -1) {
            err = errno;
            continue;
        }
        setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if (bind(s, ai->ai_addr, ai->ai_addrlen) == 0
            && listen(s, backlog) == 0)
            break;
        err = errno;
        close(s);
        s = -1;
    }
    if (s == -1) {
        log_errno(GW_LOG_ERROR, err, "net: cannot listen addr=%s", addr);
        goto out;
    }
    if (getsockname(s, (struct sockaddr *)&ss, &sl) == -1) {
        log_errno(GW_LOG_ERROR, errno, "net: getsockname addr=%s", addr);
        goto out;
    }
    if (port != NULL)
        *port = ntohs(ss.ss_family == AF_INET6
                      ? ((struct sockaddr_in6 *)&ss)->sin6_port
                      : ((struct sockaddr_in *)&ss)->sin_port);
    *fd = s;
    s = -1;
    rc = 0;

out:
    if (s != -1)
        close(s);
    if (res != NULL)
        freeaddrinfo(res);
    return rc;
}

int
net_accept(int lfd, int *cfd)
{
    int one = 1;
    int s;

    s = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (s == -1) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR
            || errno == ECONNABORTED)
            return GW_EAGAIN;
        return GW_EIO;
    }
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    *cfd = s;
    return 0;
}

int
net_connect(const char *addr, int64_t deadline, int *fd)
{
    struct addrinfo *res = NULL, *ai;
    int s = -1, one = 1, rc;

    *fd = -1;
    rc = resolve(addr, 0, &res);
    if (rc != 0)
        goto out;
    rc = GW_EIO;
    for (ai = res; ai != NULL; ai = ai->ai_next) {
        int err = 0;
        socklen_t el = sizeof(err);

        s = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK
                   | SOCK_CLOEXEC, ai->ai_protocol);
        if (s == -1)
            continue;
        if (connect(s, ai->ai_addr, ai->ai_addrlen) == 0)
            break;
        if (errno == EINPROGRESS
            && net_wait(s, POLLOUT, deadline, -1) == 0
            && getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &el) == 0
            && err == 0)
            break;
        close(s);
        s = -1;
    }
    if (s == -1)
        goto out;
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    *fd = s;
    s = -1;
    rc = 0;

out:
    if (s != -1)
        close(s);
    if (res != NULL)
        freeaddrinfo(res);
    return rc;
}

int
net_wait(int fd, short events, int64_t deadline, int wake_fd)
{
    struct pollfd pfd[2];
    int n;

    for (;;) {
        pfd[0].fd = fd;
        pfd[0].events = events;
        pfd[0].revents = 0;
        pfd[1].fd = wake_fd;
        pfd[1].events = POLLIN;
        pfd[1].revents = 0;
        n = poll(pfd, wake_fd >= 0 ? 2 : 1, gw_ms_left(deadline));
        if (n == -1) {
            if (errno == EINTR)
                continue;
            return GW_EIO;
        }
        if (n == 0)
            return GW_ETIMEDOUT;
        if (pfd[0].revents != 0)
            return 0;           /* ready, or an error the next call reports */
        if (wake_fd >= 0 && pfd[1].revents != 0)
            return GW_EABORTED;
    }
}

int
net_read(int fd, void *p, size_t len, int64_t deadline, int wake_fd,
         size_t *n)
{
    ssize_t r;
    int rc;

    *n = 0;
    for (;;) {
        r = recv(fd, p, len, 0);
        if (r > 0) {
            *n = (size_t)r;
            return 0;
        }
        if (r == 0)
            return GW_ECLOSED;
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return errno == ECONNRESET ? GW_ECLOSED : GW_EIO;
        rc = net_wait(fd, POLLIN, deadline, wake_fd);
        if (rc != 0)
            return rc;
    }
}

static int
write_error(int err)
{
    return err == EPIPE || err == ECONNRESET ? GW_ECLOSED : GW_EIO;
}

/* net_write_some() for an iovec array (not modified). */
static int
net_writev_some(int fd, const struct iovec *iov, int iovcnt, size_t *n)
{
    struct msghdr msg;
    ssize_t w;

    *n = 0;
    memset(&msg, 0, sizeof(msg));
    msg.msg_iov = (struct iovec *)iov;
    msg.msg_iovlen = (size_t)iovcnt;
    for (;;) {
        w = sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w >= 0) {
            *n = (size_t)w;
            return 0;
        }
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return 0;
        return write_error(errno);
    }
}

int
net_write_some(int fd, const void *p, size_t len, size_t *n)
{
    struct iovec iov;

    iov.iov_base = (void *)p;
    iov.iov_len = len;
    return net_writev_some(fd, &iov, 1, n);
}

int
net_write_all(int fd, const void *p, size_t len, int64_t deadline,
              int wake_fd)
{
    struct iovec iov;

    iov.iov_base = (void *)p;
    iov.iov_len = len;
    return net_writev_all(fd, &iov, 1, deadline, wake_fd);
}

int
net_writev_all(int fd, struct iovec *iov, int iovcnt, int64_t deadline,
               int wake_fd)
{
    struct msghdr msg;
    ssize_t w;
    int rc;

    while (iovcnt > 0 && iov[0].iov_len == 0) {
        iov++;
        iovcnt--;
    }
    while (iovcnt > 0) {
        memset(&msg, 0, sizeof(msg));
        msg.msg_iov = iov;
        msg.msg_iovlen = (size_t)iovcnt;
        w = sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w == -1) {
            if (errno == EINTR)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                return write_error(errno);
            rc = net_wait(fd, POLLOUT, deadline, wake_fd);
            if (rc != 0)
                return rc;
            continue;
        }
        while (iovcnt > 0 && (size_t)w >= iov[0].iov_len) {
            w -= (ssize_t)iov[0].iov_len;
            iov++;
            iovcnt--;
        }
        if (iovcnt > 0) {
            iov[0].iov_base = (char *)iov[0].iov_base + w;
            iov[0].iov_len -= (size_t)w;
        }
    }
    return 0;
}

int
net_peers_gone(struct pollfd *pfd, size_t n)
{
    int k, gone = 0;

    for (size_t i = 0; i < n; i++) {
        pfd[i].events = POLLRDHUP;
        pfd[i].revents = 0;
    }
    do
        k = poll(pfd, n, 0);
    while (k == -1 && errno == EINTR);
    for (size_t i = 0; i < n; i++) {
        pfd[i].revents = k > 0 && (pfd[i].revents
                                   & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
        gone += pfd[i].revents;
    }
    return gone;
}

int
net_peer_gone(int fd)
{
    struct pollfd pfd;

    pfd.fd = fd;
    net_peers_gone(&pfd, 1);
    return pfd.revents;
}

/* ---- streams ---- */

static int
plain_read(struct net_stream *s, void *p, size_t len, int64_t deadline,
           int wake_fd, size_t *n)
{
    return net_read(s->fd, p, len, deadline, wake_fd, n);
}

static int
plain_writev_some(struct net_stream *s, const struct iovec *iov, int iovcnt,
                  size_t *n)
{
    return net_writev_some(s->fd, iov, iovcnt, n);
}

static int
plain_writev_all(struct net_stream *s, struct iovec *iov, int iovcnt,
                 int64_t deadline, int wake_fd)
{
    return net_writev_all(s->fd, iov, iovcnt, deadline, wake_fd);
}

static size_t
plain_pending(const struct net_stream *s)
{
    (void)s;
    return 0;                   /* the kernel holds whatever there is */
}

static const struct net_stream_ops plain_ops = {
    plain_read, plain_writev_some, plain_writev_all, plain_pending,
};

void
net_stream_init(struct net_stream *s, int fd)
{
    net_stream_init_ops(s, fd, &plain_ops, NULL);
}

void
net_stream_init_ops(struct net_stream *s, int fd,
                    const struct net_stream_ops *ops, void *impl)
{
    s->ops = ops;
    s->impl = impl;
    s->fd = fd;
}

int
net_stream_fd(const struct net_stream *s)
{
    return s->fd;
}

int
net_stream_wait(struct net_stream *s, short events, int64_t deadline,
                int wake_fd)
{
    /* Bytes the stream holds (decrypted, say): readable without the
     * socket. */
    if (events == POLLIN && s->ops->pending(s) > 0)
        return 0;
    return net_wait(s->fd, events, deadline, wake_fd);
}

int
net_stream_read(struct net_stream *s, void *p, size_t len, int64_t deadline,
                int wake_fd, size_t *n)
{
    return s->ops->read(s, p, len, deadline, wake_fd, n);
}

int
net_stream_writev_some(struct net_stream *s, const struct iovec *iov,
                       int iovcnt, size_t *n)
{
    return s->ops->writev_some(s, iov, iovcnt, n);
}

int
net_stream_writev_all(struct net_stream *s, struct iovec *iov, int iovcnt,
                      int64_t deadline, int wake_fd)
{
    return s->ops->writev_all(s, iov, iovcnt, deadline, wake_fd);
}

int
net_stream_write_all(struct net_stream *s, const void *p, size_t len,
                     int64_t deadline, int wake_fd)
{
    struct iovec iov;

    iov.iov_base = (void *)p;
    iov.iov_len = len;
    return net_stream_writev_all(s, &iov, 1, deadline, wake_fd);
}
