/* SPDX-License-Identifier: MIT */
/*
 * relay_floor.c - the least work a thread-per-connection, blocking
 * HTTP/1.1 proxy can do: a yardstick for tools/bench_proxy.sh, not a
 * proxy for use.
 *
 *   relay_floor -l 127.0.0.1:0 -u 127.0.0.1:PORT
 *
 * prints "relay_floor listening port=N" and serves until killed.  Every
 * client connection gets a thread with its own keep-alive connection to
 * the upstream.  Per request the thread reads the request (head up to
 * the blank line, body by Content-Length), writes it upstream unchanged,
 * reads the response the same way and writes it back: four system calls
 * and two waits, on blocking sockets.  A chunked response (a stream) is
 * passed on as it arrives, one read and one write per piece, until its
 * last chunk: the least a thread-per-stream relay does per chunk
 * (tools/bench_stream_cost.sh).  Nothing else: no routing, no parsing
 * beyond the end of the head, Content-Length and a chunked
 * Transfer-Encoding, no JSON, no limits, no timeouts, no logs; any
 * surprise closes the connection.
 *
 * Why: infergw's design card fixes the model (one blocking thread per
 * client, libcurl upstream).  This program measures what that model can
 * reach on a machine before any of infergw's own work, so that the
 * benchmark can tell the model's cost from the gateway's.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "net.h"
#include "util.h"

#define FLOOR_BUF 65536

struct side {
    int fd;
    char buf[FLOOR_BUF];
    size_t len;                 /* bytes in buf */
};

struct job {
    int client;
    struct sockaddr_storage up;
    socklen_t up_len;
};

/* The message length (head + Content-Length body) once the head is in. */
static size_t
message_len(const char *p, size_t n)
{
    const char *end = memmem(p, n, "\r\n\r\n", 4);
    const char *cl;
    size_t head;

    if (end == NULL)
        return 0;
    head = (size_t)(end - p) + 4;
    cl = memmem(p, head, "\r\nContent-Length:", 17);
    if (cl == NULL)
        cl = memmem(p, head, "\r\ncontent-length:", 17);
    return head + (cl != NULL ? strtoul(cl + 17, NULL, 10) : 0);
}

/* Read one whole message into s->buf; 0 at EOF or on error. */
static size_t
read_message(struct side *s)
{
    size_t want = 0;
    ssize_t r;

    for (;;) {
        if (want == 0)
            want = message_len(s->buf, s->len);
        if (want > 0 && s->len >= want)
            return want;
        if (s->len == sizeof(s->buf))
            return 0;
        r = read(s->fd, s->buf + s->len, sizeof(s->buf) - s->len);
        if (r <= 0)
            return 0;
        s->len += (size_t)r;
    }
}

static int
write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);

        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Pass one message from 'from' to 'to'; keep any bytes after it. */
static int
relay_one(struct side *from, int to)
{
    size_t n = read_message(from);

    if (n == 0 || write_all(to, from->buf, n) != 0)
        return -1;
    memmove(from->buf, from->buf + n, from->len - n);
    from->len -= n;
    return 0;
}

/* Does the head p[0..n) say "Transfer-Encoding: chunked"? */
static int
is_chunked(const char *p, size_t n)
{
    return memmem(p, n, "\r\nTransfer-Encoding: chunked", 28) != NULL
           || memmem(p, n, "\r\ntransfer-encoding: chunked", 28) != NULL;
}

/*
 * Pass the response from 'u' to 'to': a whole message, or a chunked one
 * piece by piece as it comes, until the bytes so far end with the last
 * chunk "0\r\n\r\n" (a yardstick's shortcut: no trailers, no parse).
 */
static int
relay_response(struct side *u, int to)
{
    char tail[5] = { 0 };
    const char *end;
    size_t k;
    ssize_t r;

    while ((end = memmem(u->buf, u->len, "\r\n\r\n", 4)) == NULL) {
        if (u->len == sizeof(u->buf))
            return -1;
        r = read(u->fd, u->buf + u->len, sizeof(u->buf) - u->len);
        if (r <= 0)
            return -1;
        u->len += (size_t)r;
    }
    if (!is_chunked(u->buf, (size_t)(end - u->buf) + 4))
        return relay_one(u, to);
    for (;;) {
        if (write_all(to, u->buf, u->len) != 0)
            return -1;
        if (u->len >= sizeof(tail)) {
            memcpy(tail, u->buf + u->len - sizeof(tail), sizeof(tail));
        } else {
            k = sizeof(tail) - u->len;
            memmove(tail, tail + u->len, k);
            memcpy(tail + k, u->buf, u->len);
        }
        u->len = 0;
        if (memcmp(tail, "0\r\n\r\n", 5) == 0)
            return 0;
        r = read(u->fd, u->buf, sizeof(u->buf));
        if (r <= 0)
            return -1;
        u->len = (size_t)r;
    }
}

static void *
serve(void *arg)
{
    struct job *j = arg;
    struct side *c = calloc(1, sizeof(*c));
    struct side *u = calloc(1, sizeof(*u));
    int one = 1;

    if (c == NULL || u == NULL)
        goto out;
    c->fd = j->client;
    u->fd = socket(j->up.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (u->fd < 0
        || connect(u->fd, (struct sockaddr *)&j->up, j->up_len) != 0)
        goto out;
    setsockopt(u->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    while (relay_one(c, u->fd) == 0 && relay_response(u, c->fd) == 0)
        ;
out:
    if (u != NULL && u->fd > 0)
        close(u->fd);
    close(j->client);
    free(c);
    free(u);
    free(j);
    return NULL;
}

int
main(int argc, char **argv)
{
    const char *listen_addr = "127.0.0.1:0", *up_addr = NULL;
    struct sockaddr_storage up;
    socklen_t up_len = sizeof(up);
    pthread_attr_t attr;
    uint16_t port;
    int lfd, opt, probe;

    while ((opt = getopt(argc, argv, "l:u:")) != -1) {
        if (opt == 'l')
            listen_addr = optarg;
        else if (opt == 'u')
            up_addr = optarg;
        else
            goto usage;
    }
    if (up_addr == NULL || optind != argc)
        goto usage;
    /* Resolve the upstream once, through common/net.c's parser. */
    if (net_connect(up_addr, gw_now_ms() + 5000, &probe) != 0
        || getpeername(probe, (struct sockaddr *)&up, &up_len) != 0) {
        fprintf(stderr, "relay_floor: cannot reach %s\n", up_addr);
        return 1;
    }
    close(probe);
    if (net_listen(listen_addr, 1024, &lfd, &port) != 0) {
        fprintf(stderr, "relay_floor: cannot listen on %s\n", listen_addr);
        return 1;
    }
    printf("relay_floor listening port=%u\n", (unsigned)port);
    fflush(stdout);
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    for (;;) {
        struct job *j;
        pthread_t t;
        int cfd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        int one = 1;

        if (cfd < 0) {
            if (errno == EAGAIN || errno == EINTR)
                net_wait(lfd, POLLIN, -1, -1);
            continue;
        }
        setsockopt(cfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        j = calloc(1, sizeof(*j));
        if (j == NULL) {
            close(cfd);
            continue;
        }
        j->client = cfd;
        j->up = up;
        j->up_len = up_len;
        if (pthread_create(&t, &attr, serve, j) != 0) {
            close(cfd);
            free(j);
        }
    }

usage:
    fprintf(stderr, "usage: relay_floor [-l HOST:PORT] -u HOST:PORT\n");
    return 2;
}
