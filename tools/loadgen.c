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
 * This file is the program: its command line, the request every client
 * sends, the --ready probe and the run's three phases.  The clients
 * (connect, send, read, time) are in tools/loadgen/client.c, which says
 * how the times are taken; the summary and the records in
 * tools/loadgen/report.c; what they share in tools/loadgen/lg.h.
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
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "alloc.h"
#include "buf.h"
#include "loadgen/client.h"
#include "loadgen/lg.h"
#include "loadgen/report.h"
#include "net.h"
#include "util.h"

#define LG_MAX_CLIENTS 100000
#define LG_BODY_LIMIT (64 * 1024 * 1024)    /* request body from -d @FILE */
#define LG_SPARE_FDS 32             /* stdio, epoll, the --ready probe */

struct lg_options opt = { 0, NULL, NULL, { NULL }, 0, 60, NULL, 0.0, NULL,
                          50 };

struct lg_run run;

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
        || net_write_all(fd, buf_ptr(&req), buf_len(&req), deadline_ms,
                         -1) != 0)
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
    client_feed_connects(start);
    client_event_loop(client_all_connected, run.deadline, rbuf);
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
            client_send(c, gw_now_us());
    }
    run.spread_us = gw_now_us() - run.t0;
    /* -t bounds the closed loop's tail, after its own length. */
    if (opt.loop_s > 0)
        run.deadline = run.loop_end + (int64_t)opt.timeout_s * 1000000;

    /* Phase 3: read everything (closed loop: send again on each end). */
    client_event_loop(client_all_done, run.deadline, rbuf);
    end_loop_us = gw_now_us();
    for (size_t i = 0; i < run.nclients; i++) {
        struct client *c = &run.clients[i];

        if (c->state == CS_DONE)
            continue;
        if (c->state == CS_SENDING || c->state == CS_READING)
            client_record(c, LE_TIMEOUT, end_loop_us);
        else if (c->state == CS_CONNECTING)
            client_record(c, LE_CONNECT, end_loop_us);
        client_finish(c);
    }
    if (opt.loop_s > 0 && end_loop_us > run.loop_end)
        end_loop_us = run.loop_end;  /* rps over the loop's own length */
    rc = report_summary(end_loop_us - run.t0) == 0 ? 0 : 1;
    if (opt.out_path != NULL && report_records(opt.out_path) != 0)
        rc = 1;

out:
    if (run.clients != NULL)
        for (size_t i = 0; i < run.nclients; i++)
            client_close(&run.clients[i]);
    if (run.ep != -1)
        close(run.ep);
    gw_free(run.clients);
    gw_free(run.recs);
    gw_free(rbuf);
    buf_release(&run.request);
    buf_release(&run.scratch);
    return rc;
}
