/* SPDX-License-Identifier: MIT */
/*
 * server.c - listen, accept, spawn one thread per connection, drain,
 * stop.
 *
 * Design: see server.h.  The connection threads are created here; the
 * only other threads are the beats' (fleet/beat.c: a health and a load
 * thread per upstream) and the keep-alive reaper (upstream/keepalive.c).
 * A connection thread receives a heap-allocated argument it owns, never
 * a pointer into the acceptor's stack.
 */
#include "client/server.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include "alloc.h"
#include "coalesce/coalesce.h"
#include "base/config.h"
#include "client/conn.h"
#include "client/generation.h"
#include "log.h"
#include "base/metrics.h"
#include "net.h"
#include "wire/reply.h"
#include "util.h"

/*
 * Listen backlogs: connections the kernel completes while the acceptor
 * is busy spawning threads.  The API ports take bursts (a fan-out's
 * clients all connect at once; past the backlog a client's final ACK is
 * dropped and it waits a second to resend, docs/BENCHMARKS.md); the
 * kernel caps this at net.core.somaxconn.  The admin port serves a few
 * scrapers and probes.
 */
#define SERVER_LISTEN_BACKLOG 1024
#define SERVER_ADMIN_BACKLOG 64

/*
 * Out of descriptors (or memory), accept() fails at once for as long as
 * the pending connection waits, so the acceptor sleeps this long before
 * the next try instead of spinning; short, because connections close all
 * the time and the backlog holds the rest meanwhile.
 */
#define SERVER_ACCEPT_BACKOFF_MS 50

struct thread_arg {
    struct server *srv;
    int fd;
    int tls;                        /* it came to tls_listen */
    int admin;                      /* ... or to [admin] listen */
};

/*
 * The configuration in force.  Only the thread that reloads it (the one
 * running server_run and then server_drain) may look without holding a
 * reference (generation.h), and only these functions do.
 */
static const struct gw_config *
cfg_of(const struct server *s)
{
    return &generation_current(s->gens)->cfg;
}

static void
close_pair(int p[2])
{
    for (int i = 0; i < 2; i++)
        if (p[i] != -1)
            close(p[i]);
}

int
server_init(struct server *s, struct generations *gens,
            struct coalescer *co, struct tenants *tenants)
{
    int wake[2] = { -1, -1 }, stop[2] = { -1, -1 }, done[2] = { -1, -1 };
    int attr = 0, rc = GW_EIO, err;
    long ncpu;

    const struct gw_config *cfg = &generation_current(gens)->cfg;

    memset(s, 0, sizeof(*s));
    s->gens = gens;
    s->listen_fd = s->tls_fd = s->admin_fd = -1;
    if (pipe2(wake, O_CLOEXEC) == -1 || pipe2(stop, O_CLOEXEC) == -1
        || pipe2(done, O_CLOEXEC | O_NONBLOCK) == -1) {
        log_errno(GW_LOG_ERROR, errno, "server: pipe");
        goto out;
    }
    rc = GW_EINVAL;
    err = pthread_attr_init(&s->attr);
    if (err == 0) {
        attr = 1;
        err = pthread_attr_setdetachstate(&s->attr, PTHREAD_CREATE_DETACHED);
    }
    if (err == 0)
        err = pthread_attr_setstacksize(&s->attr,
                                        (size_t)cfg->thread_stack_size);
    if (err != 0) {
        log_errno(GW_LOG_ERROR, err, "server: thread attributes stack=%llu",
                  (unsigned long long)cfg->thread_stack_size);
        goto out;
    }
    s->wake_rd = wake[0];
    s->wake_wr = wake[1];
    s->stop_rd = stop[0];
    s->stop_wr = stop[1];
    s->done_rd = done[0];
    s->done_wr = done[1];
    wake[0] = wake[1] = stop[0] = stop[1] = done[0] = done[1] = -1;
    ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    s->ctx.gens = gens;
    s->ctx.co = co;
    s->ctx.tenants = tenants;
    s->ctx.draining = &s->draining;
    s->ctx.stopping = &s->stopping;
    s->ctx.wake_fd = s->wake_rd;
    s->ctx.stop_fd = s->stop_rd;
    s->ctx.ncpu = ncpu >= 1 && ncpu <= 1024 ? (unsigned)ncpu : 1;
    log_repeat_init(&s->accept_failing, GW_LOG_ERROR,
                    cfg->log_repeat_interval_ms);
    rc = 0;

out:
    close_pair(wake);
    close_pair(stop);
    close_pair(done);
    if (rc != 0 && attr)
        pthread_attr_destroy(&s->attr);
    return rc;
}

int
server_listen(struct server *s)
{
    const struct gw_config *cfg = cfg_of(s);
    int rc = 0;

    if (cfg->listen[0] != '\0') {
        rc = net_listen(cfg->listen, SERVER_LISTEN_BACKLOG, &s->listen_fd,
                        &s->port);
        if (rc == 0)
            log_msg(GW_LOG_INFO, "server: listening addr=%s port=%u",
                    cfg->listen, (unsigned)s->port);
    }
    if (rc == 0 && cfg->tls_listen[0] != '\0') {
        rc = net_listen(cfg->tls_listen, SERVER_LISTEN_BACKLOG, &s->tls_fd,
                        &s->tls_port);
        if (rc == 0)
            log_msg(GW_LOG_INFO, "server: listening for TLS tls_addr=%s "
                    "tls_port=%u", cfg->tls_listen, (unsigned)s->tls_port);
    }
    if (rc == 0 && cfg->admin_listen[0] != '\0') {
        rc = net_listen(cfg->admin_listen, SERVER_ADMIN_BACKLOG,
                        &s->admin_fd, &s->admin_port);
        if (rc == 0)
            log_msg(GW_LOG_INFO, "server: listening for admin "
                    "admin_addr=%s admin_port=%u", cfg->admin_listen,
                    (unsigned)s->admin_port);
    }
    return rc;
}

static void *
conn_thread(void *p)
{
    struct thread_arg *ta = p;
    struct server *s = ta->srv;
    int fd = ta->fd, done_wr = s->done_wr;

    int tls = ta->tls, admin = ta->admin;

    gw_free(ta);
    conn_serve(&s->ctx, fd, tls, admin);
    metrics_connections_add(-1);
    /*
     * The last thing done with 's': once the count is down, main() may
     * free everything.  The last one out wakes server_wait() (with a copy
     * of the descriptor; the pipes stay open until the process ends).
     */
    if (atomic_fetch_sub(&s->active, 1) == 1) {
        ssize_t w = write(done_wr, "x", 1);

        (void)w;                /* a full pipe already says the same */
    }
    return NULL;
}

/*
 * Past max_connections (or out of resources): 503 from the acceptor.  A
 * TLS client is only closed: it cannot read a plain answer, and a
 * handshake here would hold up the accept loop.
 */
static void
reject(struct server *s, int fd, int tls, const char *why,
       const char *message)
{
    char id[CONN_REQUEST_ID_LEN + 1];

    metrics_connection_rejected();
    gw_random_hex(id, CONN_REQUEST_ID_LEN);
    if (tls)
        close(fd);
    else
        reply_refuse(fd, id, message);
    log_msg(GW_LOG_WARN, "server: rejected connection reason=%s max=%llu "
            "req=%s", why, (unsigned long long)cfg_of(s)->max_connections,
            id);
}

static void
spawn(struct server *s, int fd, int tls, int admin)
{
    struct thread_arg *ta;
    pthread_t t;
    int rc;

    if (atomic_load(&s->active) >= (long)cfg_of(s)->max_connections) {
        reject(s, fd, tls, "max_connections",
               "too many connections, retry later");
        return;
    }
    ta = gw_malloc(sizeof(*ta));
    if (ta == NULL) {
        reject(s, fd, tls, "out_of_memory", "out of memory, retry later");
        return;
    }
    ta->srv = s;
    ta->fd = fd;
    ta->tls = tls;
    ta->admin = admin;
    atomic_fetch_add(&s->active, 1);
    metrics_connections_add(1);
    rc = pthread_create(&t, &s->attr, conn_thread, ta);
    if (rc != 0) {
        log_errno(GW_LOG_ERROR, rc, "server: pthread_create");
        atomic_fetch_sub(&s->active, 1);
        metrics_connections_add(-1);
        gw_free(ta);
        reject(s, fd, tls, "no_thread", "out of threads, retry later");
    }
}

/* The signal waiting on 'sig_fd' (SIGHUP, SIGINT, SIGTERM), or 0. */
static int
got_signal(int sig_fd)
{
    struct signalfd_siginfo si;

    if (read(sig_fd, &si, sizeof(si)) != (ssize_t)sizeof(si))
        return 0;
    return (int)si.ssi_signo;
}

/* SIGHUP: the file again; and the coalescer's limits from it. */
static void
reload(struct server *s)
{
    log_msg(GW_LOG_INFO, "server: SIGHUP, reloading %s", cfg_of(s)->path);
    if (generations_reload(s->gens) == 0)
        coalescer_set_limits(s->ctx.co, cfg_of(s));
}

/* Is a connection waiting on listener 'lfd'? */
static int
waiting(int lfd)
{
    struct pollfd p = { .fd = lfd, .events = POLLIN };

    return poll(&p, 1, 0) == 1;
}

/*
 * Take everything pending on one listener: one poll per burst.  Out of
 * descriptors, accept() fails again after every backoff for as long as
 * that lasts: one repeating failure (log.h), not twenty lines a second.
 */
static void
accept_all(struct server *s, int lfd, int tls, int admin)
{
    char why[160], ebuf[128];
    int cfd, rc;

    while ((rc = net_accept(lfd, &cfd)) == 0) {
        log_repeat_ok(&s->accept_failing, gw_now_ms(), "server: accept");
        spawn(s, cfd, tls, admin);
    }
    if (rc == GW_EIO) {
        int err = errno;

        /*
         * Linux's accept() takes a descriptor before it looks for a
         * connection, so at the limit the try that would have found
         * none (EAGAIN) fails too.  Only a connection left waiting
         * makes it a failure; else the next one will tell.
         */
        if (!waiting(lfd))
            return;
        snprintf(why, sizeof(why), "err=\"%s\"",
                 strerror_r(err, ebuf, sizeof(ebuf)));
        /* The interval in force: a reload may have changed it. */
        s->accept_failing.every_ms = cfg_of(s)->log_repeat_interval_ms;
        log_repeat_fail(&s->accept_failing, gw_now_ms(), "server: accept",
                        why);
        if (err == EMFILE || err == ENFILE || err == ENOBUFS
            || err == ENOMEM) {
            /* Out of descriptors: back off instead of spinning. */
            poll(NULL, 0, SERVER_ACCEPT_BACKOFF_MS);
        }
    }
}

static void
close_listener(int *fd)
{
    if (*fd != -1)
        close(*fd);
    *fd = -1;
}

int
server_run(struct server *s, int sig_fd)
{
    struct pollfd pfd[4];

    for (;;) {
        /* A listener that is not there (-1) is ignored by poll(). */
        pfd[0].fd = sig_fd;
        pfd[1].fd = s->listen_fd;
        pfd[2].fd = s->tls_fd;
        pfd[3].fd = s->admin_fd;
        for (int i = 0; i < 4; i++) {
            pfd[i].events = POLLIN;
            pfd[i].revents = 0;
        }
        if (poll(pfd, 4, -1) == -1) {
            if (errno == EINTR)
                continue;
            log_errno(GW_LOG_ERROR, errno, "server: poll");
            return GW_EIO;
        }
        if (pfd[0].revents != 0) {
            int sig = got_signal(sig_fd);

            if (sig == SIGHUP) {
                reload(s);
                continue;
            }
            if (sig != 0)
                break;
        }
        if (pfd[1].revents != 0)
            accept_all(s, s->listen_fd, 0, 0);
        if (pfd[2].revents != 0)
            accept_all(s, s->tls_fd, 1, 0);
        if (pfd[3].revents != 0)
            accept_all(s, s->admin_fd, 0, 1);
    }

    /* Drain: readyz says 503 from now, idle connections wake and close. */
    atomic_store(&s->draining, 1);
    if (write(s->wake_wr, "x", 1) != 1)
        log_errno(GW_LOG_ERROR, errno, "server: wake pipe");
    close_listener(&s->listen_fd);
    close_listener(&s->tls_fd);
    close_listener(&s->admin_fd);
    log_msg(GW_LOG_INFO, "server: draining connections=%ld timeout_ms=%lld",
            atomic_load(&s->active), (long long)cfg_of(s)->drain_timeout_ms);
    return 0;
}

/*
 * Wait until no connection thread is left, 'deadline' passes
 * (GW_ETIMEDOUT) or a signal arrives on 'sig_fd' (GW_EABORTED; -1: none).
 */
static int
wait_threads(struct server *s, int64_t deadline, int sig_fd)
{
    struct pollfd pfd[2];
    char x[16];

    while (atomic_load(&s->active) > 0) {
        pfd[0].fd = s->done_rd;
        pfd[0].events = POLLIN;
        pfd[1].fd = sig_fd;
        pfd[1].events = POLLIN;
        pfd[0].revents = pfd[1].revents = 0;
        if (poll(pfd, sig_fd >= 0 ? 2 : 1, gw_ms_left(deadline)) == 0)
            return GW_ETIMEDOUT;
        if (sig_fd >= 0 && pfd[1].revents != 0) {
            int sig = got_signal(sig_fd);

            if (sig == SIGHUP)
                log_msg(GW_LOG_WARN, "server: SIGHUP while draining: "
                        "nothing is reloaded");
            else if (sig != 0)
                return GW_EABORTED;
        }
        if (pfd[0].revents != 0)
            while (read(s->done_rd, x, sizeof(x)) > 0)
                ;
    }
    return 0;
}

int
server_drain(struct server *s, int sig_fd)
{
    int rc = wait_threads(s, gw_now_ms() + cfg_of(s)->drain_timeout_ms,
                          sig_fd);

    if (rc == GW_ETIMEDOUT)
        log_msg(GW_LOG_WARN, "server: drain timeout connections=%ld",
                atomic_load(&s->active));
    else if (rc == GW_EABORTED)
        log_msg(GW_LOG_WARN, "server: second signal, exiting now "
                "connections=%ld", atomic_load(&s->active));
    else
        log_msg(GW_LOG_INFO, "server: drained");
    return rc;
}

void
server_stop(struct server *s)
{
    atomic_store(&s->stopping, 1);
    if (write(s->stop_wr, "x", 1) != 1)
        log_errno(GW_LOG_ERROR, errno, "server: stop pipe");
    log_msg(GW_LOG_WARN, "server: stopping connections=%ld: streams still "
            "open are cut", atomic_load(&s->active));
    /* Parked followers sleep without a timer: wake them to see it; and
     * the calls queued for a max_inflight slot. */
    coalescer_wake_all(s->ctx.co);
    generations_stop(s->gens);
}

int
server_wait(struct server *s, int64_t ms)
{
    return wait_threads(s, gw_now_ms() + ms, -1);
}

void
server_release(struct server *s)
{
    close_listener(&s->listen_fd);
    close_listener(&s->tls_fd);
    close_listener(&s->admin_fd);
    /* The pipes stay open: no thread may poll or write a closed (and
     * perhaps reused) descriptor, and the process ends soon after. */
    pthread_attr_destroy(&s->attr);
}
