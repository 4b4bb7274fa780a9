/*
 * server.c - listen, accept, spawn one thread per connection, drain.
 *
 * Design: see server.h.  The only threads in the process are created
 * here.  A connection thread receives a heap-allocated argument it owns,
 * never a pointer into the acceptor's stack.
 */
#include "server.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "alloc.h"
#include "config.h"
#include "conn.h"
#include "jsonx.h"
#include "log.h"
#include "metrics.h"
#include "net.h"

struct thread_arg {
    struct server *srv;
    int fd;
};

int
server_init(struct server *s, const struct gw_config *cfg,
            struct upstream *up, struct coalescer *co)
{
    int p[2], d[2];
    long ncpu;
    int rc;

    memset(s, 0, sizeof(*s));
    s->cfg = cfg;
    s->up = up;
    s->co = co;
    ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    s->ncpu = ncpu >= 1 && ncpu <= 1024 ? (unsigned)ncpu : 1;
    s->listen_fd = s->wake_rd = s->wake_wr = s->done_rd = s->done_wr = -1;
    if (pipe2(p, O_CLOEXEC) == -1 || pipe2(d, O_CLOEXEC | O_NONBLOCK) == -1) {
        log_errno(GW_LOG_ERROR, errno, "server: pipe");
        return GW_EIO;
    }
    s->wake_rd = p[0];
    s->wake_wr = p[1];
    s->done_rd = d[0];
    s->done_wr = d[1];
    rc = pthread_attr_init(&s->attr);
    if (rc == 0)
        rc = pthread_attr_setdetachstate(&s->attr, PTHREAD_CREATE_DETACHED);
    if (rc == 0)
        rc = pthread_attr_setstacksize(&s->attr,
                                       (size_t)cfg->thread_stack_size);
    if (rc != 0) {
        log_errno(GW_LOG_ERROR, rc, "server: thread attributes stack=%llu",
                  (unsigned long long)cfg->thread_stack_size);
        return GW_EINVAL;
    }
    return 0;
}

int
server_listen(struct server *s)
{
    int rc = net_listen(s->cfg->listen, 1024, &s->listen_fd, &s->port);

    if (rc == 0)
        log_msg(GW_LOG_INFO, "server: listening addr=%s port=%u",
                s->cfg->listen, (unsigned)s->port);
    return rc;
}

static void *
conn_thread(void *p)
{
    struct thread_arg *ta = p;
    struct server *s = ta->srv;
    int fd = ta->fd;

    gw_free(ta);
    conn_serve(s, fd);
    metrics_connections_add(-1);
    /* The last one out while draining wakes server_drain(). */
    if (atomic_fetch_sub(&s->active, 1) == 1 && server_draining(s)) {
        ssize_t w = write(s->done_wr, "x", 1);

        (void)w;                /* a full pipe already says the same */
    }
    return NULL;
}

/*
 * Past max_connections: answer 503 from the acceptor and close.  The
 * socket is fresh, so the small response fits its send buffer and the
 * write cannot block.  Reading what the client already sent before
 * close() avoids a RST that could destroy the response in flight.
 */
static void
reject(struct server *s, int fd)
{
    struct buf body;
    char drain[4096], id[17];
    size_t n;

    metrics_connection_rejected();
    buf_init(&body, 2048);
    gw_random_hex(id, 16);
    if (buf_printf(&body, "HTTP/1.1 503 Service Unavailable\r\n"
                   "Content-Type: application/json\r\n"
                   "X-Request-Id: %s\r\n"
                   "Retry-After: 1\r\nConnection: close\r\n", id) == 0) {
        struct buf json;

        buf_init(&json, 1024);
        if (jsonx_error_body(&json, "too many connections, retry later",
                             "server_error", NULL, "overloaded") == 0
            && buf_printf(&body, "Content-Length: %zu\r\n\r\n%s",
                          buf_len(&json), buf_ptr(&json)) == 0)
            net_write_some(fd, buf_ptr(&body), buf_len(&body), &n);
        buf_release(&json);
    }
    buf_release(&body);
    shutdown(fd, SHUT_WR);
    while (recv(fd, drain, sizeof(drain), MSG_DONTWAIT) > 0)
        ;
    close(fd);
    log_msg(GW_LOG_WARN, "server: rejected connection reason=max_connections"
            " max=%llu req=%s", (unsigned long long)s->cfg->max_connections,
            id);
}

static void
spawn(struct server *s, int fd)
{
    struct thread_arg *ta;
    pthread_t t;
    int rc;

    if (atomic_load(&s->active) >= (long)s->cfg->max_connections) {
        reject(s, fd);
        return;
    }
    ta = gw_malloc(sizeof(*ta));
    if (ta == NULL) {
        reject(s, fd);
        return;
    }
    ta->srv = s;
    ta->fd = fd;
    atomic_fetch_add(&s->active, 1);
    metrics_connections_add(1);
    rc = pthread_create(&t, &s->attr, conn_thread, ta);
    if (rc != 0) {
        log_errno(GW_LOG_ERROR, rc, "server: pthread_create");
        atomic_fetch_sub(&s->active, 1);
        metrics_connections_add(-1);
        gw_free(ta);
        reject(s, fd);
    }
}

static int
got_signal(int sig_fd)
{
    struct signalfd_siginfo si;

    return read(sig_fd, &si, sizeof(si)) == (ssize_t)sizeof(si);
}

int
server_run(struct server *s, int sig_fd)
{
    struct pollfd pfd[2];
    int cfd, rc;

    for (;;) {
        pfd[0].fd = s->listen_fd;
        pfd[0].events = POLLIN;
        pfd[1].fd = sig_fd;
        pfd[1].events = POLLIN;
        pfd[0].revents = pfd[1].revents = 0;
        if (poll(pfd, 2, -1) == -1) {
            if (errno == EINTR)
                continue;
            log_errno(GW_LOG_ERROR, errno, "server: poll");
            return GW_EIO;
        }
        if (pfd[1].revents != 0 && got_signal(sig_fd))
            break;
        if (pfd[0].revents == 0)
            continue;
        /* Take everything pending: one poll per burst, not per client. */
        while ((rc = net_accept(s->listen_fd, &cfd)) == 0)
            spawn(s, cfd);
        if (rc == GW_EIO) {
            int err = errno;

            log_errno(GW_LOG_ERROR, err, "server: accept");
            if (err == EMFILE || err == ENFILE || err == ENOBUFS
                || err == ENOMEM) {
                /* Out of descriptors: back off instead of spinning. */
                poll(NULL, 0, 50);
            }
        }
    }

    /* Drain: readyz says 503 from now, idle connections wake and close. */
    atomic_store(&s->draining, 1);
    if (write(s->wake_wr, "x", 1) != 1)
        log_errno(GW_LOG_ERROR, errno, "server: wake pipe");
    close(s->listen_fd);
    s->listen_fd = -1;
    log_msg(GW_LOG_INFO, "server: draining connections=%ld timeout_ms=%lld",
            atomic_load(&s->active), (long long)s->cfg->drain_timeout_ms);
    return 0;
}

int
server_drain(struct server *s, int sig_fd)
{
    int64_t deadline = gw_now_ms() + s->cfg->drain_timeout_ms;
    struct pollfd pfd[2];

    while (atomic_load(&s->active) > 0) {
        pfd[0].fd = s->done_rd;
        pfd[0].events = POLLIN;
        pfd[1].fd = sig_fd;
        pfd[1].events = POLLIN;
        pfd[0].revents = pfd[1].revents = 0;
        if (poll(pfd, 2, gw_ms_left(deadline)) == 0) {
            log_msg(GW_LOG_WARN, "server: drain timeout connections=%ld",
                    atomic_load(&s->active));
            return GW_ETIMEDOUT;
        }
        if (pfd[1].revents != 0 && got_signal(sig_fd)) {
            log_msg(GW_LOG_WARN, "server: second signal, exiting now "
                    "connections=%ld", atomic_load(&s->active));
            return GW_EABORTED;
        }
        if (pfd[0].revents != 0) {
            char x[16];

            while (read(s->done_rd, x, sizeof(x)) > 0)
                ;
        }
    }
    log_msg(GW_LOG_INFO, "server: drained");
    return 0;
}

void
server_release(struct server *s)
{
    if (s->listen_fd != -1)
        close(s->listen_fd);
    /* The pipes stay open: detached threads may still poll wake_rd. */
    pthread_attr_destroy(&s->attr);
}
