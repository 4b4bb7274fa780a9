/* SPDX-License-Identifier: MIT */
/*
 * redisutil.h - a real redis-server for a unit test: started in a
 * temporary directory on a unix socket (no port, so no test collides
 * with another), without persistence, killed with the test.
 *
 * Each test runs in a process of its own (Check's fork mode), and the
 * server dies with that process (PR_SET_PDEATHSIG), so a failing test
 * leaves no server behind.
 */
#ifndef INFERGW_TEST_REDISUTIL_H
#define INFERGW_TEST_REDISUTIL_H

#include <check.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "base/cluster.h"
#include "base/config.h"
#include "util.h"

struct test_redis {
    pid_t pid;
    char dir[64];
    char sock[128];
    char url[160];              /* "unix:/tmp/.../redis.sock" */
    int port;                   /* loopback TCP too, found free first */
    char tcp_url[64];           /* "redis://127.0.0.1:PORT" */
};

/* A loopback port nobody listens on now: bound on port 0, then freed. */
static inline int
test_free_port(void)
{
    struct sockaddr_in a = { 0 };
    socklen_t n = sizeof(a);
    int fd = socket(AF_INET, SOCK_STREAM, 0);

    ck_assert_int_ne(fd, -1);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&a, &n), 0);
    close(fd);
    return ntohs(a.sin_port);
}

/* A connection of the test's own, to look at the server from outside. */
static inline redisContext *
test_redis_connect(const struct test_redis *r, const char *password)
{
    struct timeval tv = { 2, 0 };
    redisContext *c = redisConnectUnixWithTimeout(r->sock, tv);
    redisReply *rep;

    ck_assert_ptr_nonnull(c);
    ck_assert_msg(c->err == 0, "connect %s: %s", r->sock, c->errstr);
    if (password != NULL) {
        rep = redisCommand(c, "AUTH %s", password);
        ck_assert_ptr_nonnull(rep);
        freeReplyObject(rep);
    }
    return c;
}

/* An integer field of INFO ("connected_clients"), from a fresh client. */
static inline long
test_redis_info(const struct test_redis *r, const char *password,
                const char *field)
{
    redisContext *c = test_redis_connect(r, password);
    redisReply *rep = redisCommand(c, "INFO");
    const char *p;
    long v = -1;
    size_t n = strlen(field);

    ck_assert_ptr_nonnull(rep);
    ck_assert_int_eq(rep->type, REDIS_REPLY_STRING);
    for (p = rep->str; p != NULL; p = strchr(p, '\n')) {
        if (*p == '\n')
            p++;
        if (strncmp(p, field, n) == 0 && p[n] == ':') {
            v = strtol(p + n + 1, NULL, 10);
            break;
        }
    }
    freeReplyObject(rep);
    redisFree(c);
    return v;
}

/* Start redis-server (requirepass 'password' unless NULL); wait for it. */
static inline void
test_redis_start(struct test_redis *r, const char *password)
{
    int64_t deadline = gw_now_ms() + 10000;
    pid_t parent = getpid();

    snprintf(r->dir, sizeof(r->dir), "/tmp/infergw-redis-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(r->dir));
    snprintf(r->sock, sizeof(r->sock), "%s/redis.sock", r->dir);
    snprintf(r->url, sizeof(r->url), "unix:%s", r->sock);
    r->port = test_free_port();
    snprintf(r->tcp_url, sizeof(r->tcp_url), "redis://127.0.0.1:%d",
             r->port);
    r->pid = fork();
    ck_assert_int_ne(r->pid, -1);
    if (r->pid == 0) {
        const char *argv[20];
        char port[16];
        int n = 0;

        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(1);
        argv[n++] = "redis-server";
        snprintf(port, sizeof(port), "%d", r->port);
        argv[n++] = "--port";
        argv[n++] = port;
        argv[n++] = "--bind";
        argv[n++] = "127.0.0.1";
        argv[n++] = "--unixsocket";
        argv[n++] = r->sock;
        argv[n++] = "--save";
        argv[n++] = "";
        argv[n++] = "--appendonly";
        argv[n++] = "no";
        argv[n++] = "--dir";
        argv[n++] = r->dir;
        if (password != NULL) {
            argv[n++] = "--requirepass";
            argv[n++] = password;
        }
        argv[n] = NULL;
        freopen("/dev/null", "w", stdout);
        execvp(argv[0], (char *const *)argv);
        _exit(127);
    }
    for (;;) {
        struct timeval tv = { 1, 0 };
        redisContext *c = redisConnectUnixWithTimeout(r->sock, tv);
        int ok = c != NULL && c->err == 0;

        redisFree(c);
        if (ok)
            return;
        ck_assert_msg(gw_now_ms() < deadline, "redis-server did not start");
        usleep(5000);
    }
}

/* Kill it (SIGKILL) and wait for it; the directory is removed. */
static inline void
test_redis_kill(struct test_redis *r)
{
    char path[160];

    if (r->pid <= 0)
        return;
    kill(r->pid, SIGKILL);
    waitpid(r->pid, NULL, 0);
    r->pid = 0;
    unlink(r->sock);
    snprintf(path, sizeof(path), "%s/dump.rdb", r->dir);
    unlink(path);
    rmdir(r->dir);
}

/*
 * A cluster on 'url' for a test (no after_beat): node "me", lease 30 s,
 * two connections, then 'more' (the rest of [cluster], and the
 * tenants); *c loaded from it (config_release() it).
 */
static inline struct cluster *
test_cluster_start(struct gw_config *c, const char *url, const char *more)
{
    char text[1024], err[256];
    struct cluster_self self = { 1, 1700000000000, NULL, NULL };
    struct cluster *cl;

    snprintf(text, sizeof(text), "[server]\nlisten = 127.0.0.1:0\n"
             "[cluster]\nredis = %s\nlease = 30s\nredis_connections = 2\n"
             "node = me\n%s\n", url, more);
    ck_assert_msg(config_load_text("g.conf", text, c, err, sizeof(err))
                  == 0, "%s", err);
    cl = cluster_start(c, &self);
    ck_assert_ptr_nonnull(cl);
    return cl;
}

/* Poll until the beat has had Redis answer, seeing 'n' gateways (the
 * count alone is 1 before the first heartbeat, too). */
static inline void
test_cluster_wait(struct cluster *cl, size_t n)
{
    struct cluster_status *st = calloc(1, sizeof(*st));
    int64_t deadline = gw_now_ms() + 8000;

    ck_assert_ptr_nonnull(st);
    for (;;) {
        cluster_status(cl, st);
        if (st->up && cluster_alive(cl) == n)
            break;
        ck_assert_msg(gw_now_ms() < deadline, "never %zu alive", n);
        usleep(10000);
    }
    free(st);
}

#endif
