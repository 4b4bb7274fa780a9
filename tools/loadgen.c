/* SPDX-License-Identifier: MIT */
/*
 * loadgen.c - fan-out and closed-loop HTTP load for infergw's coalescing
 * benchmarks (tools/bench_coalesce.sh writes docs/BENCHMARKS.md with it).
 *
 *   loadgen -c N -u http://HOST:PORT/PATH -d BODY|@FILE [-H 'Name: v']...
 *           [-t TIMEOUT_S] [-o FILE] [--loop SECONDS]
 *           [--ready http://HOST:PORT/metrics] [--settle-ms MS]
 *
 * Fan-out (the default): open N connections, wait until every one is
 * established (and, with --ready, accepted by the gateway), then write the
 * same POST on all of them in one tight loop and read the N responses.
 * Times are measured from the release instant, taken just before the
 * first request byte is written, so a client written late in the loop
 * carries that delay in its numbers: that is what a real burst looks like.
 *
 * Closed loop (--loop S): the same start, then every client sends its
 * next request on its kept-alive connection as soon as the previous
 * response has ended, until S seconds have passed since the release;
 * requests in flight then are allowed to finish.  Times are per request,
 * from that request's own first byte.
 *
 * Output: one JSON object on stdout, the summary; with -o, one JSON
 * record per request (a JSON array, one record a line).  Exit status 0
 * when every request got a complete 2xx response, 1 otherwise, 2 for a
 * usage error.
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
 *
 * Connects: at most LG_CONNECT_BURST are outstanding at once, so the SYN
 * burst stays below the listener's backlog.  A connection the kernel has
 * completed may still sit in the gateway's accept queue, though; --ready
 * polls the gateway's own counters until it has accepted every one, so
 * the release measures coalescing rather than accept() and thread
 * creation.
 */
#include <errno.h>
#include <getopt.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "alloc.h"
#include "buf.h"
#include "http.h"
#include "http_chunked.h"
#include "net.h"
#include "util.h"

#define LG_MAX_CLIENTS 100000
#define LG_MAX_HEADERS 16
#define LG_CONNECT_BURST 256
#define LG_READ_SIZE 65536          /* one read() per wakeup, at most */
#define LG_HEAD_LIMIT (64 * 1024)   /* response head, status to blank line */
#define LG_BODY_LIMIT (64 * 1024 * 1024)    /* request body from -d @FILE */
#define LG_EVENTS 1024
#define LG_SPARE_FDS 32             /* stdio, epoll, the --ready probe */

enum client_state {
    CS_NEW = 0,                 /* no socket yet */
    CS_CONNECTING,
    CS_IDLE,                    /* connected, waiting for the release */
    CS_SENDING,                 /* request partly written */
    CS_READING,
    CS_DONE,                    /* finished for good (or failed) */
};

enum role {
    ROLE_NONE = 0,              /* no X-Infergw-Coalesce header */
    ROLE_LEADER,
    ROLE_FOLLOWER,
    ROLE_BYPASS,
    ROLE_OTHER,
    ROLE_COUNT,
};

static const char *const role_names[ROLE_COUNT] = {
    "none", "leader", "follower", "bypass", "other",
};

enum lg_error {
    LE_NONE = 0,
    LE_CONNECT,                 /* connect failed or timed out */
    LE_WRITE,                   /* the request could not be written */
    LE_RESET,                   /* connection reset or read error */
    LE_EOF,                     /* closed before the response ended */
    LE_PARSE,                   /* malformed response */
    LE_TIMEOUT,                 /* -t passed before the response ended */
    LE_REFUSED,                 /* answered or closed before the release */
    LE_COUNT,
};

static const char *const error_names[LE_COUNT] = {
    "none", "connect", "write", "reset", "eof", "parse", "timeout",
    "refused",
};

/* One request's outcome; times in microseconds, -1 when not reached. */
struct record {
    uint32_t client;
    int16_t status;             /* 0 when no status line arrived */
    uint8_t role;               /* enum role */
    uint8_t err;                /* enum lg_error */
    int64_t send_us;            /* first byte written, from the release */
    int64_t ttfb_us;            /* first body byte, see the file comment */
    int64_t arrival_us;         /* the same byte reaching the socket */
    int64_t done_us;            /* response complete */
    uint64_t hash;              /* FNV-1a 64 of the de-chunked body */
    uint64_t bytes;             /* de-chunked body length */
};

/*
 * One client connection.  'head' holds the response head until it is
 * complete and is released right after, so idle clients own no memory
 * beyond this struct.
 */
struct client {
    int fd;
    enum client_state state;
    size_t sent;                /* request bytes written so far */
    int64_t t_send;             /* gw_now_us() of the first request byte */
    int64_t t_first;            /* first body byte, -1 */
    int64_t t_arrival;          /* its kernel receive time, -1 */
    struct buf head;
    int head_done;
    int status;
    enum role role;
    int chunked;
    int64_t left;               /* Content-Length bytes to come; -1: none */
    int until_close;            /* body delimited by the connection close */
    int keep_alive;
    struct http_chunked dec;
    uint64_t hash;
    uint64_t bytes;
};

/* Command line; set in main() and read-only afterwards. */
static struct options {
    long clients;
    const char *url;
    const char *body_arg;
    const char *headers[LG_MAX_HEADERS];
    size_t num_headers;
    long timeout_s;
    const char *out_path;
    double loop_s;              /* 0: fan-out */
    const char *ready_url;
    long settle_ms;
} opt = { 0, NULL, NULL, { NULL }, 0, 60, NULL, 0.0, NULL, 50 };

/* The run's state; one thread, so no locks. */
static struct run {
    struct sockaddr_storage addr;
    socklen_t addrlen;
    struct buf request;         /* the whole request, written to every fd */
    struct client *clients;
    size_t nclients;
    int ep;
    int64_t t0;                 /* the release instant (gw_now_us) */
    int64_t real_minus_mono;    /* CLOCK_REALTIME - gw_now_us(), in us */
    int64_t loop_end;           /* closed loop: no new request after it */
    int64_t deadline;           /* -t: the run ends here regardless */
    size_t active;              /* clients not yet CS_DONE */
    size_t pending_connects;
    size_t next_connect;        /* first client still CS_NEW */
    struct record *recs;
    size_t nrecs, caprecs;
    struct buf scratch;         /* de-chunked bytes of one read, hashed */
    int64_t connect_us;         /* how long the connect phase took */
    int64_t ready_us;           /* waiting for --ready and the settle */
    int64_t spread_us;          /* release to the last request written */
    int oom;
} run;

static void
usage(FILE *out)
{
    fprintf(out,
            "usage: loadgen -c N -u http://HOST:PORT/PATH -d BODY|@FILE\n"
            "               [-H 'Name: value']... [-t TIMEOUT_S] [-o FILE]\n"
            "               [--loop SECONDS] [--ready METRICS_URL]"
            " [--settle-ms MS]\n"
            "  -c N          clients, one connection each (1..%d)\n"
            "  -u URL        http:// URL to POST to\n"
            "  -d BODY       request body, or @FILE to read it from FILE\n"
            "  -H HEADER     extra request header (up to %d)\n"
            "  -t SECONDS    give up on responses after this (default 60)\n"
            "  -o FILE       write one JSON record per request to FILE\n"
            "  --loop S      closed loop for S seconds instead of fan-out\n"
            "  --ready URL   before the release, poll this infergw /metrics"
            " until\n"
            "                it has accepted all N connections\n"
            "  --settle-ms M pause after connecting, before the release"
            " (default 50)\n",
            LG_MAX_CLIENTS, LG_MAX_HEADERS);
}

/*
 * Split "http://HOST[:PORT][/PATH]".  OUT: 'hostport' ("HOST:PORT", port
 * 80 by default) and 'path' ("/" when absent).  Only plain http: a load
 * tool that did TLS would measure mbedTLS, not coalescing.
 */
static int
split_url(const char *url, char *hostport, size_t hplen, char *path,
          size_t pathlen)
{
    const char *p, *slash;
    size_t n;

    if (strncmp(url, "http://", 7) != 0)
        return GW_EINVAL;
    p = url + 7;
    slash = strchr(p, '/');
    n = slash != NULL ? (size_t)(slash - p) : strlen(p);
    if (n == 0 || n + 4 >= hplen)
        return GW_EINVAL;
    memcpy(hostport, p, n);
    hostport[n] = '\0';
    if (strrchr(hostport, ':') == NULL
        || (hostport[0] == '[' && hostport[n - 1] == ']'))
        strcat(hostport, ":80");
    if (snprintf(path, pathlen, "%s", slash != NULL ? slash : "/")
        >= (int)pathlen)
        return GW_EINVAL;
    return 0;
}

/* Resolve "HOST:PORT" once; every client connects to the same address. */
static int
resolve_addr(const char *hostport)
{
    struct addrinfo hints, *res = NULL;
    char host[256], port[8];
    const char *h;
    size_t hl;
    int p, rc;

    if (net_parse_hostport(hostport, &h, &hl, &p) != 0
        || hl >= sizeof(host)) {
        fprintf(stderr, "loadgen: %s: not HOST:PORT\n", hostport);
        return GW_EINVAL;
    }
    snprintf(host, sizeof(host), "%.*s", (int)hl, h);
    snprintf(port, sizeof(port), "%d", p);
    memset(&hints, 0, sizeof(hints));
    hints.ai_socktype = SOCK_STREAM;
    rc = getaddrinfo(host, port, &hints, &res);
    if (rc != 0) {
        fprintf(stderr, "loadgen: %s: %s\n", hostport, gai_strerror(rc));
        return GW_EINVAL;
    }
    memcpy(&run.addr, res->ai_addr, res->ai_addrlen);
    run.addrlen = res->ai_addrlen;
    freeaddrinfo(res);
    return 0;
}

/* -d @FILE: read the body, bounded by LG_BODY_LIMIT. */
static int
read_body_file(const char *path, struct buf *out)
{
    FILE *f = fopen(path, "rb");
    char chunk[8192];
    size_t n;
    int rc = 0;

    if (f == NULL) {
        fprintf(stderr, "loadgen: %s: %s\n", path, strerror(errno));
        return GW_EIO;
    }
    while (rc == 0 && (n = fread(chunk, 1, sizeof(chunk), f)) > 0)
        rc = buf_append(out, chunk, n);
    if (rc == 0 && ferror(f))
        rc = GW_EIO;
    fclose(f);
    if (rc != 0)
        fprintf(stderr, "loadgen: %s: %s\n", path, gw_strerror(rc));
    return rc;
}

/*
 * Build the one request every client sends.  HTTP/1.1 with an explicit
 * Content-Length (no chunked upload: the gateway hashes the body either
 * way, and a fixed length keeps every request byte-identical).
 */
static int
build_request(const char *hostport, const char *path)
{
    struct buf body;
    int rc;

    buf_init(&body, LG_BODY_LIMIT);
    if (opt.body_arg[0] == '@')
        rc = read_body_file(opt.body_arg + 1, &body);
    else
        rc = buf_append_str(&body, opt.body_arg);
    if (rc != 0)
        goto out;
    buf_init(&run.request, LG_BODY_LIMIT + 64 * 1024);
    rc = buf_printf(&run.request, "POST %s HTTP/1.1\r\nHost: %s\r\n"
                    "Content-Type: application/json\r\n"
                    "Accept: text/event-stream\r\n", path, hostport);
    for (size_t i = 0; rc == 0 && i < opt.num_headers; i++)
        rc = buf_printf(&run.request, "%s\r\n", opt.headers[i]);
    if (rc == 0)
        rc = buf_printf(&run.request, "Content-Length: %zu\r\n\r\n",
                        buf_len(&body));
    if (rc == 0)
        rc = buf_append(&run.request, buf_ptr(&body), buf_len(&body));

out:
    buf_release(&body);
    return rc;
}

/*
 * Each client needs a descriptor: raise the soft limit to the hard one
 * (the benchmark script raises the hard one where it can).
 */
static int
raise_nofile(size_t need)
{
    struct rlimit rl;

    if (getrlimit(RLIMIT_NOFILE, &rl) == -1)
        return GW_EIO;
    if (rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) == -1)
            return GW_EIO;
    }
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < need) {
        fprintf(stderr, "loadgen: need %zu descriptors, RLIMIT_NOFILE hard "
                "limit is %llu\n", need, (unsigned long long)rl.rlim_max);
        return GW_ETOOBIG;
    }
    return 0;
}

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

static void
close_client(struct client *c)
{
    if (c->fd != -1) {
        epoll_ctl(run.ep, EPOLL_CTL_DEL, c->fd, NULL);
        close(c->fd);
        c->fd = -1;
    }
    buf_release(&c->head);
}

/* Store one request's outcome; the run goes on without it on ENOMEM. */
static void
add_record(struct client *c, enum lg_error err, int64_t now)
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

static void
finish_client(struct client *c)
{
    close_client(c);
    c->state = CS_DONE;
    run.active--;
}

static void
fail_client(struct client *c, enum lg_error err, int64_t now)
{
    add_record(c, err, now);
    finish_client(c);
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

/* Keep LG_CONNECT_BURST connects outstanding until every client has one. */
static void
feed_connects(int64_t now)
{
    while (run.pending_connects < LG_CONNECT_BURST
           && run.next_connect < run.nclients) {
        struct client *c = &run.clients[run.next_connect++];

        start_connect(c, now);
    }
}

/* Write what is left of the request; the socket is non-blocking. */
static void
send_request(struct client *c, int64_t now)
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
        send_request(c, now);
}

/*
 * The response has ended.  Fan-out: done.  Closed loop: the next request
 * on the same connection, or on a new one if the server asked to close.
 */
static void
complete(struct client *c, int64_t now)
{
    add_record(c, LE_NONE, now);
    if (opt.loop_s <= 0 || now >= run.loop_end) {
        finish_client(c);
        return;
    }
    c->sent = 0;
    if (c->keep_alive && !c->until_close) {
        c->state = CS_IDLE;
        send_request(c, now);
        return;
    }
    close_client(c);
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

/*
 * CLOCK_REALTIME (the kernel's receive timestamps) minus gw_now_us(),
 * read between two gw_now_us() calls to halve the error.
 */
static int64_t
real_minus_mono(void)
{
    struct timespec ts;
    int64_t a, b;

    a = gw_now_us();
    clock_gettime(CLOCK_REALTIME, &ts);
    b = gw_now_us();
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000 - (a + b) / 2;
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
        feed_connects(now);
        break;
    case CS_SENDING:
        if (events & (EPOLLIN | EPOLLERR | EPOLLHUP))
            on_readable(c, rbuf);
        else
            send_request(c, now);
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

/*
 * Run the event loop until 'until' returns true or 'deadline' passes.
 * 'rbuf' is the one read buffer, shared by all clients.
 */
static void
event_loop(int (*until)(void), int64_t deadline, char *rbuf)
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

static int
all_connected(void)
{
    return run.pending_connects == 0 && run.next_connect >= run.nclients;
}

static int
all_done(void)
{
    return run.active == 0;
}

/*
 * Value of a Prometheus sample named exactly 'name' (no labels) in
 * 'text', or -1.
 */
static long long
metric_value(const char *text, const char *name)
{
    size_t nl = strlen(name);
    const char *p = text;

    while ((p = strstr(p, name)) != NULL) {
        if ((p == text || p[-1] == '\n') && p[nl] == ' ')
            return strtoll(p + nl + 1, NULL, 10);
        p += nl;
    }
    return -1;
}

/*
 * GET the --ready URL once (a fresh connection, Connection: close) and
 * return the connections the gateway has accepted or refused so far, or
 * -1.  Blocking with a deadline: this runs before the release, when
 * nothing else is going on.
 */
static long long
probe_accepted(const char *hostport, const char *path, int64_t deadline_ms)
{
    struct buf in, req;
    char tmp[16384];
    long long total = -1, rejected;
    size_t n;
    int fd = -1, rc;

    buf_init(&in, 4 * 1024 * 1024);
    buf_init(&req, 4096);
    if (buf_printf(&req, "GET %s HTTP/1.1\r\nHost: %s\r\n"
                   "Connection: close\r\n\r\n", path, hostport) != 0)
        goto out;
    if (net_connect(hostport, deadline_ms, &fd) != 0
        || net_write_all(fd, buf_ptr(&req), buf_len(&req), deadline_ms, -1) != 0)
        goto out;
    for (;;) {
        rc = net_read(fd, tmp, sizeof(tmp), deadline_ms, -1, &n);
        if (rc == GW_ECLOSED)
            break;
        if (rc != 0 || buf_append(&in, tmp, n) != 0)
            goto out;
    }
    total = metric_value(buf_ptr(&in), "infergw_connections_total");
    rejected = metric_value(buf_ptr(&in),
                            "infergw_connections_rejected_total");
    if (total >= 0 && rejected > 0)
        total += rejected;

out:
    if (fd != -1)
        close(fd);
    buf_release(&in);
    buf_release(&req);
    return total;
}

/*
 * Before the release: poll the gateway until it has accepted all N
 * clients (each probe is one more connection it accepts: counted).
 */
static int
wait_ready(long long base, int64_t deadline_ms)
{
    char hostport[300], path[1024];
    long long polls = 1, seen;

    if (split_url(opt.ready_url, hostport, sizeof(hostport), path,
                  sizeof(path)) != 0)
        return GW_EINVAL;
    while (gw_now_ms() < deadline_ms) {
        seen = probe_accepted(hostport, path, deadline_ms);
        polls++;
        if (seen >= 0 && seen - base - (polls - 1) >= (long long)run.nclients)
            return 0;
        poll(NULL, 0, 20);
    }
    fprintf(stderr, "loadgen: --ready: the gateway did not accept all %zu "
            "connections in time\n", run.nclients);
    return GW_ETIMEDOUT;
}

static int
cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;

    return (x > y) - (x < y);
}

static int
cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

    return (x > y) - (x < y);
}

/* Nearest-rank percentile of sorted 'v' in milliseconds. */
static double
pct_ms(const int64_t *v, size_t n, double p)
{
    size_t rank;

    if (n == 0)
        return -1;
    rank = (size_t)(p / 100.0 * (double)n + 0.999999);
    if (rank < 1)
        rank = 1;
    if (rank > n)
        rank = n;
    return (double)v[rank - 1] / 1000.0;
}

/*
 * Print 'sep' then "name":{"n":..,"p50":..,"p99":..,"max":..} for the
 * values in 'v' (sorted here), in milliseconds.
 */
static void
print_dist(const char *sep, const char *name, int64_t *v, size_t n)
{
    qsort(v, n, sizeof(*v), cmp_i64);
    printf("%s\"%s\":{\"n\":%zu,\"p50\":%.3f,\"p99\":%.3f,\"max\":%.3f}",
           sep, name, n, pct_ms(v, n, 50), pct_ms(v, n, 99),
           n > 0 ? (double)v[n - 1] / 1000.0 : -1.0);
}

static int
is_ok(const struct record *r)
{
    return r->err == LE_NONE && r->status >= 200 && r->status < 300;
}

/*
 * Our own CPU time: the benchmark shares its cores with the gateway, so
 * the script subtracts it when it accounts for the machine's load.
 */
static double
self_cpu_ms(void)
{
    struct rusage ru;

    if (getrusage(RUSAGE_SELF, &ru) == -1)
        return -1;
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000.0
           + (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1000.0;
}

/*
 * "KEY":{"all":{...},"leader":{...},...}, the distribution of the good
 * requests' ttfb_us (or, with 'arrival', arrival_us) overall and per
 * role that occurred.  'v' has room for every record.
 */
static void
print_by_role(const char *key, int arrival, int64_t *v)
{
    size_t n;

    printf("\"%s\":{", key);
    for (int k = -1; k < ROLE_COUNT; k++) {
        n = 0;
        for (size_t i = 0; i < run.nrecs; i++) {
            const struct record *r = &run.recs[i];
            int64_t t = arrival ? r->arrival_us : r->ttfb_us;

            if (is_ok(r) && t >= 0 && (k < 0 || r->role == k))
                v[n++] = t;
        }
        if (k >= 0 && n == 0)
            continue;           /* roles that did not occur */
        print_dist(k < 0 ? "" : ",", k < 0 ? "all" : role_names[k], v, n);
    }
    printf("},");
}

/* The summary object on stdout.  Returns the count of bad requests. */
static size_t
print_summary(int64_t wall_us)
{
    size_t nerr[LE_COUNT] = { 0 }, nrole[ROLE_COUNT] = { 0 };
    size_t ok = 0, non2xx = 0, distinct = 0, nh = 0, n;
    unsigned long long body_len = 0;
    size_t s1xx_5xx[6] = { 0 };
    uint64_t *hashes;
    int64_t *v;

    hashes = gw_calloc(run.nrecs + 1, sizeof(*hashes));
    v = gw_calloc(run.nrecs + 1, sizeof(*v));
    if (hashes == NULL || v == NULL) {
        fprintf(stderr, "loadgen: out of memory for the summary\n");
        gw_free(hashes);
        gw_free(v);
        return run.nrecs + 1;
    }
    for (size_t i = 0; i < run.nrecs; i++) {
        const struct record *r = &run.recs[i];

        nerr[r->err]++;
        if (r->err != LE_NONE)
            continue;
        nrole[r->role]++;
        if (r->status >= 100 && r->status < 600)
            s1xx_5xx[r->status / 100]++;
        if (!is_ok(r)) {
            non2xx++;
            continue;
        }
        if (ok++ == 0)
            body_len = (unsigned long long)r->bytes;
        hashes[nh++] = r->hash;
    }
    qsort(hashes, nh, sizeof(*hashes), cmp_u64);
    for (size_t i = 0; i < nh; i++)
        if (i == 0 || hashes[i] != hashes[i - 1])
            distinct++;

    printf("{\"mode\":\"%s\",\"clients\":%zu,", opt.loop_s > 0 ? "loop"
           : "fanout", run.nclients);
    if (opt.loop_s > 0)
        printf("\"loop_s\":%.3f,\"rps\":%.1f,", opt.loop_s,
               wall_us > 0 ? (double)ok * 1e6 / (double)wall_us : 0.0);
    printf("\"requests\":%zu,\"ok\":%zu,\"errors\":%zu,\"non_2xx\":%zu,",
           run.nrecs, ok, run.nrecs - ok - non2xx, non2xx);
    printf("\"error_kinds\":{");
    for (int e = 1; e < LE_COUNT; e++)
        printf("\"%s\":%zu%s", error_names[e], nerr[e],
               e + 1 < LE_COUNT ? "," : "");
    printf("},\"status_classes\":{\"1xx\":%zu,\"2xx\":%zu,\"3xx\":%zu,"
           "\"4xx\":%zu,\"5xx\":%zu},", s1xx_5xx[1], s1xx_5xx[2],
           s1xx_5xx[3], s1xx_5xx[4], s1xx_5xx[5]);
    printf("\"distinct_bodies\":%zu,\"roles\":{", distinct);
    for (int k = 0; k < ROLE_COUNT; k++)
        printf("\"%s\":%zu%s", role_names[k], nrole[k],
               k + 1 < ROLE_COUNT ? "," : "");
    printf("},");
    print_by_role("ttfb_ms", 0, v);
    print_by_role("arrival_ms", 1, v);
    n = 0;
    for (size_t i = 0; i < run.nrecs; i++)
        if (is_ok(&run.recs[i]))
            v[n++] = run.recs[i].done_us;
    printf("\"complete_ms\":{");
    print_dist("", "all", v, n);
    printf("},\"connect_ms\":%.3f,\"ready_ms\":%.3f,\"send_spread_ms\":%.3f,"
           "\"wall_ms\":%.3f,\"body_bytes\":%llu,\"cpu_ms\":%.1f,"
           "\"records_lost\":%d}\n",
           (double)run.connect_us / 1000.0, (double)run.ready_us / 1000.0,
           (double)run.spread_us / 1000.0, (double)wall_us / 1000.0,
           body_len, self_cpu_ms(), run.oom);
    fflush(stdout);
    gw_free(hashes);
    gw_free(v);
    return run.nrecs - ok + (run.oom ? 1 : 0);
}

/* -o FILE: every record as a JSON object, one a line. */
static int
write_records(const char *path)
{
    FILE *f = fopen(path, "w");

    if (f == NULL) {
        fprintf(stderr, "loadgen: %s: %s\n", path, strerror(errno));
        return GW_EIO;
    }
    fputs("[\n", f);
    for (size_t i = 0; i < run.nrecs; i++) {
        const struct record *r = &run.recs[i];

        fprintf(f, "{\"client\":%u,\"status\":%d,\"role\":\"%s\","
                "\"error\":\"%s\",\"send_us\":%lld,\"ttfb_us\":%lld,"
                "\"arrival_us\":%lld,\"done_us\":%lld,\"hash\":\"%016llx\",\"bytes\":%llu}%s\n",
                (unsigned)r->client, (int)r->status, role_names[r->role],
                error_names[r->err], (long long)r->send_us,
                (long long)r->ttfb_us, (long long)r->arrival_us,
                (long long)r->done_us,
                (unsigned long long)r->hash, (unsigned long long)r->bytes,
                i + 1 < run.nrecs ? "," : "");
    }
    fputs("]\n", f);
    if (fclose(f) != 0) {
        fprintf(stderr, "loadgen: %s: %s\n", path, strerror(errno));
        return GW_EIO;
    }
    return 0;
}

/* Parse the command line into 'opt'; returns -1 to go on, else an exit. */
static int
parse_args(int argc, char **argv)
{
    static const struct option longopts[] = {
        { "loop", required_argument, NULL, 'L' },
        { "ready", required_argument, NULL, 'R' },
        { "settle-ms", required_argument, NULL, 'S' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    char *end;
    int ch;

    while ((ch = getopt_long(argc, argv, "c:u:d:H:t:o:h", longopts,
                             NULL)) != -1) {
        switch (ch) {
        case 'c':
            if (gw_parse_long(optarg, 1, LG_MAX_CLIENTS, &opt.clients) != 0)
                goto bad;
            break;
        case 'u':
            opt.url = optarg;
            break;
        case 'd':
            opt.body_arg = optarg;
            break;
        case 'H':
            if (opt.num_headers == LG_MAX_HEADERS
                || strchr(optarg, ':') == NULL
                || strpbrk(optarg, "\r\n") != NULL)
                goto bad;
            opt.headers[opt.num_headers++] = optarg;
            break;
        case 't':
            if (gw_parse_long(optarg, 1, 86400, &opt.timeout_s) != 0)
                goto bad;
            break;
        case 'o':
            opt.out_path = optarg;
            break;
        case 'L':
            errno = 0;
            opt.loop_s = strtod(optarg, &end);
            if (errno != 0 || end == optarg || *end != '\0'
                || !(opt.loop_s > 0 && opt.loop_s <= 86400))
                goto bad;
            break;
        case 'R':
            opt.ready_url = optarg;
            break;
        case 'S':
            if (gw_parse_long(optarg, 0, 600000, &opt.settle_ms) != 0)
                goto bad;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            goto bad;
        }
    }
    if (optind != argc || opt.clients == 0 || opt.url == NULL
        || opt.body_arg == NULL)
        goto bad;
    return -1;

bad:
    usage(stderr);
    return 2;
}

int
main(int argc, char **argv)
{
    char hostport[300], path[4096];
    char *rbuf = NULL;
    long long base = 0;
    int64_t start, t_ready, end_loop_us;
    int rc;

    rc = parse_args(argc, argv);
    if (rc >= 0)
        return rc;
    rc = 2;
    buf_init(&run.request, 0);
    buf_init(&run.scratch, LG_READ_SIZE * 2);
    run.ep = -1;
    if (split_url(opt.url, hostport, sizeof(hostport), path,
                  sizeof(path)) != 0) {
        fprintf(stderr, "loadgen: bad URL %s (http://HOST:PORT/PATH)\n",
                opt.url);
        goto out;
    }
    if (resolve_addr(hostport) != 0 || build_request(hostport, path) != 0)
        goto out;
    rc = 1;
    if (raise_nofile((size_t)opt.clients + LG_SPARE_FDS) != 0)
        goto out;
    run.nclients = (size_t)opt.clients;
    run.clients = gw_calloc(run.nclients, sizeof(*run.clients));
    rbuf = gw_malloc(LG_READ_SIZE);
    run.ep = epoll_create1(EPOLL_CLOEXEC);
    if (run.clients == NULL || rbuf == NULL || run.ep == -1) {
        fprintf(stderr, "loadgen: cannot allocate %zu clients\n",
                run.nclients);
        goto out;
    }
    for (size_t i = 0; i < run.nclients; i++) {
        run.clients[i].fd = -1;
        run.clients[i].t_send = -1;
        buf_init(&run.clients[i].head, LG_HEAD_LIMIT);
    }
    run.active = run.nclients;
    start = gw_now_us();
    run.deadline = start + (int64_t)opt.timeout_s * 1000000;
    if (opt.ready_url != NULL) {
        char rhp[300], rpath[1024];

        if (split_url(opt.ready_url, rhp, sizeof(rhp), rpath,
                      sizeof(rpath)) != 0
            || (base = probe_accepted(rhp, rpath, run.deadline / 1000))
               < 0) {
            fprintf(stderr, "loadgen: --ready %s: no infergw metrics\n",
                    opt.ready_url);
            goto out;
        }
    }

    /* Phase 1: every connection, before any request. */
    feed_connects(start);
    event_loop(all_connected, run.deadline, rbuf);
    t_ready = gw_now_us();
    run.connect_us = t_ready - start;
    if (opt.ready_url != NULL && wait_ready(base, run.deadline / 1000) != 0)
        goto out;
    if (opt.settle_ms > 0)
        poll(NULL, 0, (int)opt.settle_ms);
    run.ready_us = gw_now_us() - t_ready;

    /*
     * Phase 2, the release: every request in one tight loop, with no
     * other system call in between, so the gateway sees them as close
     * together as one thread can write them.
     */
    run.real_minus_mono = real_minus_mono();
    run.t0 = gw_now_us();
    run.loop_end = run.t0 + (int64_t)(opt.loop_s * 1e6);
    for (size_t i = 0; i < run.nclients; i++) {
        struct client *c = &run.clients[i];

        if (c->state == CS_IDLE)
            send_request(c, gw_now_us());
    }
    run.spread_us = gw_now_us() - run.t0;
    /* -t bounds the closed loop's tail, after its own length. */
    if (opt.loop_s > 0)
        run.deadline = run.loop_end + (int64_t)opt.timeout_s * 1000000;

    /* Phase 3: read everything (closed loop: send again on each end). */
    event_loop(all_done, run.deadline, rbuf);
    end_loop_us = gw_now_us();
    for (size_t i = 0; i < run.nclients; i++) {
        struct client *c = &run.clients[i];

        if (c->state == CS_DONE)
            continue;
        if (c->state == CS_SENDING || c->state == CS_READING)
            add_record(c, LE_TIMEOUT, end_loop_us);
        else if (c->state == CS_CONNECTING)
            add_record(c, LE_CONNECT, end_loop_us);
        finish_client(c);
    }
    if (opt.loop_s > 0 && end_loop_us > run.loop_end)
        end_loop_us = run.loop_end;  /* rps over the loop's own length */
    rc = print_summary(end_loop_us - run.t0) == 0 ? 0 : 1;
    if (opt.out_path != NULL && write_records(opt.out_path) != 0)
        rc = 1;

out:
    if (run.clients != NULL)
        for (size_t i = 0; i < run.nclients; i++)
            close_client(&run.clients[i]);
    if (run.ep != -1)
        close(run.ep);
    gw_free(run.clients);
    gw_free(run.recs);
    gw_free(rbuf);
    buf_release(&run.request);
    buf_release(&run.scratch);
    return rc;
}
