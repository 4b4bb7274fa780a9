/*
 * net.c - non-blocking sockets with poll()-based deadlines.
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
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "log.h"

/*
 * The stream each descriptor carries, or NULL (net.h).  A slot is written
 * by the connection's own thread, before anyone else can know of the
 * descriptor and after everyone is done with it; other threads that write
 * for a parked client (fanout.h) read it after a lock handed them the
 * client, so relaxed atomics are enough.
 */
static _Atomic(const struct net_stream *) *stream_slots;
static size_t stream_nslots;

static const struct net_stream *
stream_of(int fd)
{
    if (fd < 0 || (size_t)fd >= stream_nslots)
        return NULL;
    return atomic_load_explicit(&stream_slots[fd], memory_order_relaxed);
}

int
net_streams_init(size_t max_fds)
{
    if (stream_slots != NULL)
        return 0;
    stream_slots = calloc(max_fds, sizeof(*stream_slots));
    if (stream_slots == NULL)
        return GW_ENOMEM;
    stream_nslots = max_fds;
    return 0;
}

int
net_attach_stream(int fd, const struct net_stream *s)
{
    if (fd < 0 || (size_t)fd >= stream_nslots)
        return GW_EINVAL;
    atomic_store_explicit(&stream_slots[fd], s, memory_order_relaxed);
    return 0;
}

void
net_detach_stream(int fd)
{
    if (fd >= 0 && (size_t)fd < stream_nslots)
        atomic_store_explicit(&stream_slots[fd], NULL,
                              memory_order_relaxed);
}

/*
 * Split "HOST:PORT" / "[V6]:PORT" / ":PORT" into host (NULL = any) and port.
 */
static int
split_addr(const char *addr, char *host, size_t hostlen, char *port,
           size_t portlen)
{
    const char *colon;
    size_t hl;

    if (addr[0] == '[') {
        const char *end = strchr(addr, ']');

        if (end == NULL || end[1] != ':')
            return GW_EINVAL;
        hl = (size_t)(end - addr - 1);
        if (hl >= hostlen)
            return GW_EINVAL;
        memcpy(host, addr + 1, hl);
        host[hl] = '\0';
        colon = end + 1;
    } else {
        colon = strrchr(addr, ':');
        if (colon == NULL)
            return GW_EINVAL;
        hl = (size_t)(colon - addr);
        if (hl >= hostlen)
            return GW_EINVAL;
        memcpy(host, addr, hl);
        host[hl] = '\0';
    }
    if (colon[1] == '\0' || strlen(colon + 1) >= portlen)
        return GW_EINVAL;
    for (const char *q = colon + 1; *q != '\0'; q++)
        if (*q < '0' || *q > '9')
            return GW_EINVAL;
    if (strtol(colon + 1, NULL, 10) > 65535)
        return GW_EINVAL;
    strcpy(port, colon + 1);
    return 0;
}

static int
resolve(const char *addr, int passive, struct addrinfo **res)
{
    struct addrinfo hints;
    char host[256], port[8];
    int rc;

    if (split_addr(addr, host, sizeof(host), port, sizeof(port)) != 0)
        return GW_EINVAL;
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

int
net_set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);

    if (fl == -1 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) == -1)
        return GW_EIO;
    return 0;
}

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
    const struct net_stream *st = stream_of(fd);
    struct pollfd pfd[2];
    int n;

    /* Bytes the stream holds (decrypted, say): readable without the
     * socket. */
    if (st != NULL && events == POLLIN && st->ops->pending(st->impl) > 0)
        return 0;
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
    const struct net_stream *st = stream_of(fd);
    ssize_t r;
    int rc;

    if (st != NULL)
        return st->ops->read(st->impl, p, len, deadline, wake_fd, n);
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

int
net_writev_some(int fd, const struct iovec *iov, int iovcnt, size_t *n)
{
    const struct net_stream *st = stream_of(fd);
    struct msghdr msg;
    ssize_t w;

    if (st != NULL)
        return st->ops->writev_some(st->impl, iov, iovcnt, n);
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
    const struct net_stream *st = stream_of(fd);
    struct msghdr msg;
    ssize_t w;
    int rc;

    if (st != NULL)
        return st->ops->writev_all(st->impl, iov, iovcnt, deadline, wake_fd);
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
