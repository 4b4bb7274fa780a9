/* SPDX-License-Identifier: MIT */
/*
 * fanout_floor.c - the least work a server can do to give N waiting
 * clients the same first bytes: a yardstick for the fan-out gap that
 * tools/bench_coalesce.sh measures, not a server for use.
 *
 *   fanout_floor [-l HOST:PORT] -c N [-f FIRST_MS] [-w WRITERS]
 *
 * prints "fanout_floor listening port=P", reads one request on each of N
 * connections, and FIRST_MS (default 100, the mock's first-token delay)
 * after the first request arrived, answers all N at once: one writev per
 * client of the head and the first event of a chunked SSE response, from
 * WRITERS threads (default: one per CPU), started together and taking
 * the clients in arrival order, the first client first, FF_TAKE at a
 * time from a shared counter (so a writer the scheduler holds back
 * leaves the rest to the others, as infergw's helpers do).  That client's
 * response carries "X-Infergw-Coalesce: leader", the others "follower",
 * so tools/loadgen reports the same leader-to-follower gap as against
 * infergw.  FF_END_MS later (as a stream's next event would come) it
 * ends every response and closes, and exits.
 *
 * Why: infergw's leader and its helpers do exactly this for a
 * fan-out's first chunk, plus the upstream read and the bookkeeping.
 * The gap measured here is what the machine (its cores, loopback TCP,
 * and the load generator sharing them) allows any server.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "http.h"
#include "net.h"
#include "util.h"

#define FF_MAX_CLIENTS 100000
#define FF_REQ_MAX 8192
#define FF_TAKE 8                   /* clients a writer takes at a time */
#define FF_END_MS 45                /* the mock's gap between events */

struct client {
    int fd;
    size_t len;
    int complete;
    char buf[FF_REQ_MAX];
};

static struct {
    struct client *clients;
    size_t *order;              /* client indexes in arrival order */
    size_t n;
    pthread_barrier_t go;
    _Atomic size_t next;            /* first client no writer took yet */
} ff;

#define FF_BODY "data: {\"floor\":true}\n\n"
#define FF_HEAD(role)                                                   \
    "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"            \
    "Transfer-Encoding: chunked\r\nX-Infergw-Coalesce: " role "\r\n"    \
    "Connection: close\r\n\r\n"

static void
answer(size_t k)
{
    static const char leader[] = FF_HEAD("leader");
    static const char follower[] = FF_HEAD("follower");
    static const char body[] = "16\r\n" FF_BODY "\r\n";
    struct iovec iov[2];

    iov[0].iov_base = (void *)(k == 0 ? leader : follower);
    iov[0].iov_len = k == 0 ? sizeof(leader) - 1 : sizeof(follower) - 1;
    iov[1].iov_base = (void *)body;
    iov[1].iov_len = sizeof(body) - 1;
    /* A few hundred bytes into an empty socket buffer: one call. */
    writev(ff.clients[ff.order[k]].fd, iov, 2);
}

static void *
writer(void *arg)
{
    size_t k, end;

    (void)arg;
    pthread_barrier_wait(&ff.go);
    while ((k = atomic_fetch_add(&ff.next, FF_TAKE)) < ff.n) {
        end = k + FF_TAKE < ff.n ? k + FF_TAKE : ff.n;
        for (; k < end; k++)
            answer(k);
    }
    return NULL;
}

/* Read what is there; 1 once the whole request (head and body) is in. */
static int
read_request(struct client *c)
{
    struct http_request r;
    ssize_t got;
    int head;

    got = read(c->fd, c->buf + c->len, sizeof(c->buf) - c->len);
    if (got <= 0)
        return got == 0 || errno != EAGAIN ? -1 : 0;
    c->len += (size_t)got;
    head = http_parse_request(c->buf, c->len, sizeof(c->buf), &r);
    if (head == GW_EAGAIN)
        return 0;
    if (head < 0)
        return -1;
    return c->len >= (size_t)head + r.content_length;
}

int
main(int argc, char **argv)
{
    const char *addr = "127.0.0.1:0";
    long n = 0, first_ms = 100, writers = sysconf(_SC_NPROCESSORS_ONLN);
    struct epoll_event ev, evs[256];
    size_t accepted = 0, complete = 0;
    int64_t start = -1;
    pthread_t *t;
    uint16_t port;
    int lfd, ep, opt, bad = 0;

    while ((opt = getopt(argc, argv, "l:c:f:w:")) != -1) {
        if (opt == 'l')
            addr = optarg;
        else if (opt == 'c')
            bad |= gw_parse_long(optarg, 1, FF_MAX_CLIENTS, &n);
        else if (opt == 'f')
            bad |= gw_parse_long(optarg, 0, 60000, &first_ms);
        else if (opt == 'w')
            bad |= gw_parse_long(optarg, 1, 256, &writers);
        else
            goto usage;
    }
    if (bad != 0 || n == 0 || optind != argc || writers < 1)
        goto usage;
    ff.n = (size_t)n;
    ff.clients = calloc(ff.n, sizeof(*ff.clients));
    ff.order = calloc(ff.n, sizeof(*ff.order));
    t = calloc((size_t)writers, sizeof(*t));
    ep = epoll_create1(EPOLL_CLOEXEC);
    if (ff.clients == NULL || ff.order == NULL || t == NULL || ep < 0
        || net_listen(addr, 4096, &lfd, &port) != 0) {
        fprintf(stderr, "fanout_floor: cannot start on %s\n", addr);
        return 1;
    }
    ev.events = EPOLLIN;
    ev.data.u64 = UINT64_MAX;
    epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev);
    /* The writers exist before the clock starts, waiting at the barrier. */
    pthread_barrier_init(&ff.go, NULL, (unsigned)writers);
    for (long w = 1; w < writers; w++)
        pthread_create(&t[w], NULL, writer, (void *)(uintptr_t)w);
    printf("fanout_floor listening port=%u\n", (unsigned)port);
    fflush(stdout);

    while (complete < ff.n || gw_now_ms() < start + first_ms) {
        int wait = complete < ff.n ? -1 : gw_ms_left(start + first_ms);
        int k = epoll_wait(ep, evs, (int)GW_ARRAY_LEN(evs), wait);

        for (int i = 0; i < k; i++) {
            struct client *c;
            int cfd;

            if (evs[i].data.u64 == UINT64_MAX) {
                while (accepted < ff.n && net_accept(lfd, &cfd) == 0) {
                    ff.clients[accepted].fd = cfd;
                    ev.events = EPOLLIN;
                    ev.data.u64 = accepted++;
                    epoll_ctl(ep, EPOLL_CTL_ADD, cfd, &ev);
                }
                continue;
            }
            c = &ff.clients[evs[i].data.u64];
            if (c->complete)
                continue;
            switch (read_request(c)) {
            case 1:
                c->complete = 1;
                epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
                if (start < 0)
                    start = gw_now_ms();
                ff.order[complete++] = (size_t)evs[i].data.u64;
                break;
            case -1:
                fprintf(stderr, "fanout_floor: a client failed\n");
                return 1;
            }
        }
    }
    writer((void *)0);          /* the main thread is writer 0 */
    for (long w = 1; w < writers; w++)
        pthread_join(t[w], NULL);
    /* The end of every body, after a stream's pause. */
    start = gw_now_ms();
    while (gw_now_ms() < start + FF_END_MS)
        poll(NULL, 0, gw_ms_left(start + FF_END_MS));
    for (size_t i = 0; i < ff.n; i++) {
        if (write(ff.clients[i].fd, "0\r\n\r\n", 5) != 5)
            bad = 1;
        close(ff.clients[i].fd);
    }
    return bad;

usage:
    fprintf(stderr, "usage: fanout_floor [-l HOST:PORT] -c N [-f FIRST_MS] "
            "[-w WRITERS]\n");
    return 2;
}
