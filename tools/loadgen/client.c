/* SPDX-License-Identifier: MIT */
/*
 * client.c - loadgen's clients (client.h): connects, requests, and
 * responses read, parsed and timed.
 *
 * Design: one thread and one level-triggered epoll set.  With two cores
 * shared with the gateway under test, one thread keeps the measuring
 * side's CPU use small and its clock single; a few threads would only
 * spread the same work over cores the gateway needs.  A readable socket
 * gets one read() per wakeup rather than a read-until-EAGAIN loop, so the
 * first sockets of an epoll batch cannot delay the timestamps of the last
 * ones by draining whole responses first; each timestamp is taken right
 * after its own read().
 *
 * Two times to first byte.  'ttfb' is when loadgen's read() returned the
 * first body byte: what a client program sees, but one thread reading
 * N sockets in turn on CPUs it shares with the server adds its own queue
 * to it (at 1,000 clients on two cores, up to a few milliseconds, the
 * leader's read included).  'arrival' is
 * when that byte reached the client's socket: the kernel's receive
 * timestamp of the segment (SO_TIMESTAMPNS; on loopback it is taken as
 * the server's send hands the segment over), which no lag of the reader
 * can move.  For TCP the kernel reports the stamp of the last segment a
 * read copied from, so if the first byte's read also took later
 * segments, 'arrival' is late, never early.  Both are reported.
 *
 * A response is parsed only as far as the benchmark needs: the status
 * line, Content-Length, Transfer-Encoding, Connection and
 * X-Infergw-Coalesce.  The body is de-chunked with common/http_chunked.c
 * and hashed (FNV-1a 64) on the fly, so no body is kept and 10,000
 * clients cost a few hundred bytes each; only the head is buffered, and
 * released once parsed.
 */
#include "client.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "alloc.h"
#include "buf.h"
#include "http.h"
#include "http_chunked.h"
#include "util.h"

#define LG_CONNECT_BURST 256
#define LG_EVENTS 1024

static void
client_reset_response(struct client *c)
{
    buf_release(&c->head);
    buf_init(&c->head, LG_HEAD_LIMIT);
    c->head_done = 0;
    c->status = 0;
    c->role = ROLE_NONE;
    c->chunked = 0;
    c->left = -1;
    c->until_close = 0;
    c->keep_alive = 1;
    c->t_first = -1;
    c->t_arrival = -1;
    c->hash = GW_FNV1A64_OFFSET;
    c->bytes = 0;
    http_chunked_init(&c->dec);
}

void
client_close(struct client *c)
{
    if (c->fd != -1) {
        epoll_ctl(run.ep, EPOLL_CTL_DEL, c->fd, NULL);
        close(c->fd);
        c->fd = -1;
    }
    buf_release(&c->head);
}

void
client_record(struct client *c, enum lg_error err, int64_t now)
{
    struct record *r;
    int64_t base;

    if (run.nrecs == run.caprecs) {
        size_t cap = run.caprecs > 0 ? run.caprecs * 2 : 1024;
        struct record *v = gw_realloc(run.recs, cap * sizeof(*v));

        if (v == NULL) {
            run.oom = 1;
            return;
        }
        run.recs = v;
        run.caprecs = cap;
    }
    r = &run.recs[run.nrecs++];
    r->client = (uint32_t)(c - run.clients);
    r->status = (int16_t)c->status;
    r->role = (uint8_t)c->role;
    r->err = (uint8_t)err;
    r->send_us = c->t_send >= 0 ? c->t_send - run.t0 : -1;
    /*
     * Fan-out measures from the release instant (the burst as a whole);
     * the closed loop from each request's own send, since there the
     * clients drift apart.
     */
    base = opt.loop_s > 0 ? c->t_send : run.t0;
    r->ttfb_us = c->t_first >= 0 ? c->t_first - base : -1;
    r->arrival_us = c->t_arrival >= 0 ? c->t_arrival - base : -1;
    r->done_us = err == LE_NONE ? now - base : -1;
    r->hash = c->hash;
    r->bytes = c->bytes;
}

void
client_finish(struct client *c)
{
    client_close(c);
    c->state = CS_DONE;
    run.active--;
}

static void
fail_client(struct client *c, enum lg_error err, int64_t now)
{
    client_record(c, err, now);
    client_finish(c);
}

/* Start a non-blocking connect; the epoll set reports its end. */
static void
start_connect(struct client *c, int64_t now)
{
    struct epoll_event ev;
    int one = 1;

    c->fd = socket(run.addr.ss_family,
                   SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c->fd == -1) {
        perror("loadgen: socket");
        fail_client(c, LE_CONNECT, now);
        return;
    }
    /* Requests and SSE events are small: never wait for Nagle. */
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    /* Receive timestamps, for 'arrival' (the file comment). */
    setsockopt(c->fd, SOL_SOCKET, SO_TIMESTAMPNS, &one, sizeof(one));
    if (connect(c->fd, (struct sockaddr *)&run.addr, run.addrlen) == -1
        && errno != EINPROGRESS) {
        fail_client(c, LE_CONNECT, now);
        return;
    }
    ev.events = EPOLLOUT;
    ev.data.u64 = (uint64_t)(c - run.clients);
    if (epoll_ctl(run.ep, EPOLL_CTL_ADD, c->fd, &ev) == -1) {
        perror("loadgen: epoll_ctl");
        fail_client(c, LE_CONNECT, now);
        return;
    }
    c->state = CS_CONNECTING;
    run.pending_connects++;
}

void
client_feed_connects(int64_t now)
{
    while (run.pending_connects < LG_CONNECT_BURST
           && run.next_connect < run.nclients) {
        struct client *c = &run.clients[run.next_connect++];

        start_connect(c, now);
    }
}

void
client_send(struct client *c, int64_t now)
{
    struct epoll_event ev;
    size_t len = buf_len(&run.request);
    ssize_t n;

    if (c->sent == 0) {
        client_reset_response(c);
        c->t_send = now;
    }
    while (c->sent < len) {
        n = send(c->fd, buf_ptr(&run.request) + c->sent, len - c->sent,
                 MSG_NOSIGNAL);
        if (n > 0) {
            c->sent += (size_t)n;
            continue;
        }
        if (n == -1 && errno == EINTR)
            continue;
        if (n == -1 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        fail_client(c, LE_WRITE, now);
        return;
    }
    ev.data.u64 = (uint64_t)(c - run.clients);
    if (c->sent < len) {
        if (c->state != CS_SENDING) {
            ev.events = EPOLLOUT;
            epoll_ctl(run.ep, EPOLL_CTL_MOD, c->fd, &ev);
        }
        c->state = CS_SENDING;
        return;
    }
    if (c->state == CS_SENDING) {
        ev.events = EPOLLIN;
        epoll_ctl(run.ep, EPOLL_CTL_MOD, c->fd, &ev);
    }
    c->state = CS_READING;
}

/* The connect finished one way or the other. */
static void
on_connected(struct client *c, int64_t now)
{
    struct epoll_event ev;
    socklen_t el = sizeof(int);
    int err = 0;

    run.pending_connects--;
    if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &el) == -1 || err != 0) {
        fail_client(c, LE_CONNECT, now);
        return;
    }
    /*
     * Watch for input from now on: before the release, input can only
     * be the gateway refusing the connection (503) or closing it.
     */
    ev.events = EPOLLIN;
    ev.data.u64 = (uint64_t)(c - run.clients);
    epoll_ctl(run.ep, EPOLL_CTL_MOD, c->fd, &ev);
    c->state = CS_IDLE;
    c->sent = 0;
    if (run.t0 != 0)            /* a closed-loop reconnect: go on */
        client_send(c, now);
}

/*
 * The response has ended.  Fan-out: done.  Closed loop: the next request
 * on the same connection, or on a new one if the server asked to close.
 */
static void
complete(struct client *c, int64_t now)
{
    client_record(c, LE_NONE, now);
    if (opt.loop_s <= 0 || now >= run.loop_end) {
        client_finish(c);
        return;
    }
    c->sent = 0;
    if (c->keep_alive && !c->until_close) {
        c->state = CS_IDLE;
        client_send(c, now);
        return;
    }
    client_close(c);
    start_connect(c, now);
}

/* Parse a complete head in c->head; 0 or GW_EPARSE. */
static int
parse_head(struct client *c, size_t head_len)
{
    const char *p = buf_ptr(&c->head), *end = p + head_len, *line, *eol;
    uint64_t status;

    /* "HTTP/1.x NNN", NNN three digits from 100 */
    if (head_len < 12 || memcmp(p, "HTTP/1.", 7) != 0 || p[8] != ' '
        || p[9] == '0' || gw_parse_uint(p + 9, 3, 999, &status) != 0)
        return GW_EPARSE;
    c->status = (int)status;
    c->keep_alive = p[7] == '1';
    eol = memchr(p, '\n', head_len);
    for (line = eol + 1; line < end; line = eol + 1) {
        const char *colon, *v;
        size_t nlen, vlen;

        eol = memchr(line, '\n', (size_t)(end - line));
        if (eol == NULL || eol == line || eol[-1] != '\r')
            return GW_EPARSE;
        if (eol - line == 1)
            break;              /* the blank line */
        colon = memchr(line, ':', (size_t)(eol - line));
        if (colon == NULL)
            return GW_EPARSE;
        nlen = (size_t)(colon - line);
        v = colon + 1;
        while (v < eol - 1 && (*v == ' ' || *v == '\t'))
            v++;
        vlen = (size_t)(eol - 1 - v);
        while (vlen > 0 && (v[vlen - 1] == ' ' || v[vlen - 1] == '\t'))
            vlen--;
        if (gw_strieq(line, nlen, "content-length")) {
            uint64_t n;

            /* 18 digits at most: any fits c->left's int64_t. */
            if (vlen > 18 || gw_parse_uint(v, vlen, UINT64_MAX, &n) != 0)
                return GW_EPARSE;
            c->left = (int64_t)n;
        } else if (gw_strieq(line, nlen, "transfer-encoding")) {
            c->chunked = http_has_token(v, vlen, "chunked");
        } else if (gw_strieq(line, nlen, "connection")) {
            if (http_has_token(v, vlen, "close"))
                c->keep_alive = 0;
            else if (http_has_token(v, vlen, "keep-alive"))
                c->keep_alive = 1;
        } else if (gw_strieq(line, nlen, "x-infergw-coalesce")) {
            if (gw_strieq(v, vlen, "leader"))
                c->role = ROLE_LEADER;
            else if (gw_strieq(v, vlen, "follower"))
                c->role = ROLE_FOLLOWER;
            else if (gw_strieq(v, vlen, "bypass"))
                c->role = ROLE_BYPASS;
            else
                c->role = ROLE_OTHER;
        }
    }
    /* RFC 9112 section 6.3: chunked wins; 204 and 304 have no body. */
    if (c->chunked)
        c->left = -1;
    else if (c->status == 204 || c->status == 304)
        c->left = 0;
    else if (c->left < 0)
        c->until_close = 1;
    return 0;
}

/*
 * Hash body bytes; the first one stamps the time to first byte, and its
 * arrival ('arrival' is -1 when the kernel gave no timestamp).
 */
static void
body_bytes(struct client *c, const char *p, size_t n, int64_t now,
           int64_t arrival)
{
    if (n == 0)
        return;
    if (c->t_first < 0) {
        c->t_first = now;
        c->t_arrival = arrival;
    }
    c->hash = gw_fnv1a64(c->hash, p, n);
    c->bytes += n;
}

/*
 * Feed received bytes.  Returns 1 when the response is complete, 0 for
 * more, or an enum lg_error (as a negative) on a malformed response.
 */
static int
feed(struct client *c, const char *p, size_t n, int64_t now,
     int64_t arrival)
{
    size_t take, consumed;
    int rc;

    while (!c->head_done && n > 0) {
        size_t old = buf_len(&c->head), from, head_len = 0;
        const char *h;

        take = n;
        if (buf_append(&c->head, p, take) != 0)
            return -LE_PARSE;       /* a head over LG_HEAD_LIMIT */
        h = buf_ptr(&c->head);
        from = old >= 3 ? old - 3 : 0;
        for (size_t i = from; i + 4 <= buf_len(&c->head); i++) {
            if (memcmp(h + i, "\r\n\r\n", 4) == 0) {
                head_len = i + 4;
                break;
            }
        }
        if (head_len == 0)
            return 0;
        if (parse_head(c, head_len) != 0)
            return -LE_PARSE;
        /* The bytes after the head in this read belong to the body. */
        take = head_len - old;
        p += take;
        n -= take;
        if (c->status < 200) {      /* 1xx interim response: skip it */
            buf_reset(&c->head);
            continue;
        }
        c->head_done = 1;
        buf_release(&c->head);
        if (c->left == 0)
            return 1;
    }
    if (n == 0)
        return 0;
    if (c->chunked) {
        rc = http_chunked_feed(&c->dec, p, n, &run.scratch, &consumed);
        body_bytes(c, buf_ptr(&run.scratch), buf_len(&run.scratch), now,
                   arrival);
        buf_reset(&run.scratch);
        if (rc < 0)
            return -LE_PARSE;
        return rc == 1;
    }
    if (c->until_close) {
        body_bytes(c, p, n, now, arrival);
        return 0;
    }
    take = (int64_t)n < c->left ? n : (size_t)c->left;
    body_bytes(c, p, take, now, arrival);
    c->left -= (int64_t)take;
    return c->left == 0;
}

/*
 * The kernel's receive timestamp in a recvmsg() control buffer, on
 * gw_now_us()'s clock; -1 when there is none.
 */
static int64_t
arrival_time(struct msghdr *mh)
{
    struct cmsghdr *cm;

    for (cm = CMSG_FIRSTHDR(mh); cm != NULL; cm = CMSG_NXTHDR(mh, cm)) {
        if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_TIMESTAMPNS) {
            struct timespec ts;

            memcpy(&ts, CMSG_DATA(cm), sizeof(ts));
            return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000
                   - run.real_minus_mono;
        }
    }
    return -1;
}

/* One read() on a readable socket (see the file comment for why one). */
static void
on_readable(struct client *c, char *rbuf)
{
    union {
        struct cmsghdr align;
        char b[CMSG_SPACE(sizeof(struct timespec))];
    } ctl;
    struct iovec iov = { rbuf, LG_READ_SIZE };
    struct msghdr mh;
    ssize_t n;
    int64_t now;
    int rc;

    memset(&mh, 0, sizeof(mh));
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = ctl.b;
    mh.msg_controllen = sizeof(ctl.b);
    n = recvmsg(c->fd, &mh, 0);
    now = gw_now_us();
    if (n == -1 && (errno == EAGAIN || errno == EWOULDBLOCK
                    || errno == EINTR))
        return;
    if (c->state != CS_READING && c->state != CS_SENDING) {
        /*
         * Input (or EOF) before we asked anything: the gateway refused
         * the connection (503 past max_connections) or closed it.
         */
        fail_client(c, LE_REFUSED, now);
        return;
    }
    if (n == -1) {
        fail_client(c, LE_RESET, now);
        return;
    }
    if (n == 0) {
        if (c->head_done && c->until_close)
            complete(c, now);
        else
            fail_client(c, LE_EOF, now);
        return;
    }
    rc = feed(c, rbuf, (size_t)n, now, arrival_time(&mh));
    if (rc < 0)
        fail_client(c, (enum lg_error)-rc, now);
    else if (rc == 1)
        complete(c, now);
}

static void
dispatch(struct client *c, uint32_t events, char *rbuf, int64_t now)
{
    switch (c->state) {
    case CS_CONNECTING:
        on_connected(c, now);
        client_feed_connects(now);
        break;
    case CS_SENDING:
        if (events & (EPOLLIN | EPOLLERR | EPOLLHUP))
            on_readable(c, rbuf);
        else
            client_send(c, now);
        break;
    case CS_IDLE:
    case CS_READING:
        on_readable(c, rbuf);
        break;
    case CS_NEW:
    case CS_DONE:
        break;
    }
}

void
client_event_loop(int (*until)(void), int64_t deadline, char *rbuf)
{
    struct epoll_event evs[LG_EVENTS];
    int64_t now;
    int n, ms;

    while (!until()) {
        now = gw_now_us();
        if (now >= deadline)
            return;
        ms = (int)gw_us_to_ms_ceil((uint64_t)(deadline - now));
        n = epoll_wait(run.ep, evs, LG_EVENTS, ms);
        if (n == -1) {
            if (errno == EINTR)
                continue;
            perror("loadgen: epoll_wait");
            return;
        }
        for (int i = 0; i < n; i++) {
            struct client *c = &run.clients[evs[i].data.u64];

            dispatch(c, evs[i].events, rbuf, gw_now_us());
        }
    }
}

int
client_all_connected(void)
{
    return run.pending_connects == 0 && run.next_connect >= run.nclients;
}

int
client_all_done(void)
{
    return run.active == 0;
}
