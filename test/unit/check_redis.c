/* SPDX-License-Identifier: MIT */
/*
 * check_redis.c - unit tests for common/redis.c: URLs, and the pool and
 * its round trips against a real redis-server (redisutil.h): the bound
 * on connections, a deadline kept against a stopped server, failing at
 * once with no connection, EVAL after NOSCRIPT, AUTH and SELECT.
 */
#include <check.h>

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "redis.h"
#include "redisutil.h"
#include "testutil.h"
#include "util.h"

/* ---- URLs ---- */

static const struct {
    const char *in;
    int ok;
    int unix_socket;
    const char *host;
    int port;
    const char *user, *password;
    long db;
    const char *note;
} url_cases[] = {
    { "redis://127.0.0.1:6380/2", 1, 0, "127.0.0.1", 6380, "", "", 2,
      "all parts" },
    { "redis://localhost", 1, 0, "localhost", 6379, "", "", 0,
      "port and db default" },
    { "redis://h:1/", 1, 0, "h", 1, "", "", 0, "empty db" },
    { "redis://:s3cret@h:7000", 1, 0, "h", 7000, "", "s3cret", 0,
      "password alone" },
    { "redis://app:pw@h/15", 1, 0, "h", 6379, "app", "pw", 15,
      "user and password" },
    { "redis://app:p%40ss%3Aw@h", 1, 0, "h", 6379, "app", "p@ss:w", 0,
      "escapes" },
    { "redis://app:p@ss@h", 1, 0, "h", 6379, "app", "p@ss", 0,
      "the last @ ends the user info" },
    { "redis://[::1]:6390/1", 1, 0, "::1", 6390, "", "", 1, "IPv6" },
    { "unix:/run/redis/redis.sock", 1, 1, "/run/redis/redis.sock", 0, "",
      "", 0, "socket" },
    { "unix:run/redis.sock", 0, 0, NULL, 0, NULL, NULL, 0,
      "relative path" },
    { "unix:", 0, 0, NULL, 0, NULL, NULL, 0, "no path" },
    { "unix:/r\xc6.sock", 0, 0, NULL, 0, NULL, NULL, 0,
      "a path byte past ASCII (shown as it is: refused)" },
    { "http://h:6379", 0, 0, NULL, 0, NULL, NULL, 0, "another scheme" },
    { "rediss://h", 0, 0, NULL, 0, NULL, NULL, 0, "TLS is not built in" },
    { "redis://", 0, 0, NULL, 0, NULL, NULL, 0, "no host" },
    { "redis://:6379", 0, 0, NULL, 0, NULL, NULL, 0, "no host, a port" },
    { "redis://h:0", 0, 0, NULL, 0, NULL, NULL, 0, "port 0" },
    { "redis://h:65536", 0, 0, NULL, 0, NULL, NULL, 0, "port too big" },
    { "redis://h:", 0, 0, NULL, 0, NULL, NULL, 0, "empty port" },
    { "redis://h:12x", 0, 0, NULL, 0, NULL, NULL, 0, "port not a number" },
    { "redis://h/x", 0, 0, NULL, 0, NULL, NULL, 0, "db not a number" },
    { "redis://h/-1", 0, 0, NULL, 0, NULL, NULL, 0, "negative db" },
    { "redis://h/1000001", 0, 0, NULL, 0, NULL, NULL, 0, "db too big" },
    { "redis://user@h", 1, 0, "h", 6379, "user", "", 0,
      "a user, its password from the pool (redis_password_file)" },
    { "redis://@h", 0, 0, NULL, 0, NULL, NULL, 0, "empty user info" },
    { "unix:/r.sock?db=3&user=a%40b", 1, 1, "/r.sock", 0, "a@b", "", 3,
      "a socket's db and user" },
    { "unix:/r.sock?user=app", 1, 1, "/r.sock", 0, "app", "", 0,
      "a socket's user" },
    { "unix:/r.sock?", 1, 1, "/r.sock", 0, "", "", 0, "an empty query" },
    { "unix:/r.sock?db=1&", 0, 0, NULL, 0, NULL, NULL, 0, "a trailing &" },
    { "unix:/r.sock?db=1&db=2", 0, 0, NULL, 0, NULL, NULL, 0, "db twice" },
    { "unix:/r.sock?password=x", 0, 0, NULL, 0, NULL, NULL, 0,
      "no password in a socket's URL" },
    { "unix:/r.sock?db=x", 0, 0, NULL, 0, NULL, NULL, 0, "a bad db" },
    { "unix:/r.sock#x", 0, 0, NULL, 0, NULL, NULL, 0, "a fragment" },
    { "redis://user:@h", 0, 0, NULL, 0, NULL, NULL, 0, "empty password" },
    { "redis://:p%4@h", 0, 0, NULL, 0, NULL, NULL, 0, "short escape" },
    { "redis://:p%zz@h", 0, 0, NULL, 0, NULL, NULL, 0, "bad escape" },
    { "redis://:p%00@h", 0, 0, NULL, 0, NULL, NULL, 0, "escaped NUL" },
    { "redis://h a", 0, 0, NULL, 0, NULL, NULL, 0, "a blank" },
    { "redis://h?db=1", 0, 0, NULL, 0, NULL, NULL, 0, "a query" },
    { "redis://h#x", 0, 0, NULL, 0, NULL, NULL, 0, "a fragment" },
    { "redis://[::1", 0, 0, NULL, 0, NULL, NULL, 0, "open bracket" },
    { "redis://[::1]x", 0, 0, NULL, 0, NULL, NULL, 0, "junk after ]" },
    { "redis://h*st", 0, 0, NULL, 0, NULL, NULL, 0, "bad host byte" },
    { "redis://h:1/2/3", 0, 0, NULL, 0, NULL, NULL, 0, "a path" },
};

START_TEST(test_url_table)
{
    struct redis_url u;
    int rc = redis_url_parse(url_cases[_i].in, &u);

    ck_assert_msg((rc == 0) == url_cases[_i].ok, "%s: %s: rc %d",
                  url_cases[_i].note, url_cases[_i].in, rc);
    if (rc != 0) {
        ck_assert_str_eq(u.host, "");       /* wiped */
        return;
    }
    ck_assert_int_eq(u.unix_socket, url_cases[_i].unix_socket);
    ck_assert_str_eq(u.host, url_cases[_i].host);
    if (!u.unix_socket)
        ck_assert_int_eq(u.port, url_cases[_i].port);
    ck_assert_str_eq(u.user, url_cases[_i].user);
    ck_assert_str_eq(u.password, url_cases[_i].password);
    ck_assert_int_eq(u.db, url_cases[_i].db);
}
END_TEST

START_TEST(test_url_show_hides_the_password)
{
    struct redis_url u;
    char out[256];

    ck_assert_int_eq(redis_url_parse("redis://app:hunter2@h:7/3", &u), 0);
    redis_url_show(&u, out, sizeof(out));
    ck_assert_str_eq(out, "redis://app@h:7/3");
    ck_assert_int_eq(redis_url_parse("redis://:hunter2@[::1]", &u), 0);
    redis_url_show(&u, out, sizeof(out));
    ck_assert_str_eq(out, "redis://[::1]:6379/0");
    /* A user's odd bytes are shown escaped, as the URL would have them. */
    ck_assert_int_eq(redis_url_parse("redis://a%C3%A9%40:pw@h", &u), 0);
    redis_url_show(&u, out, sizeof(out));
    ck_assert_str_eq(out, "redis://a%C3%A9%40@h:6379/0");
    ck_assert_int_eq(redis_url_parse("unix:/s", &u), 0);
    redis_url_show(&u, out, sizeof(out));
    ck_assert_str_eq(out, "unix:/s");
    ck_assert_int_eq(redis_url_parse("unix:/s?user=a%26b&db=2", &u), 0);
    redis_url_show(&u, out, sizeof(out));
    ck_assert_str_eq(out, "unix:/s?db=2&user=a%26b");
    ck_assert_int_eq(redis_url_parse("unix:/s?user=a", &u), 0);
    redis_url_show(&u, out, sizeof(out));
    ck_assert_str_eq(out, "unix:/s?user=a");
}
END_TEST

START_TEST(test_script_sha1)
{
    struct redis_script s;

    /* sha1("return 1"), as Redis's SCRIPT LOAD answers it. */
    redis_script_init(&s, "return 1");
    ck_assert_str_eq(s.sha1, "e0e1f9fabfc9d4800c877a703b823ac0578ff8db");
}
END_TEST

/* ---- the pool, against a real server ---- */

static struct test_redis srv;

static struct redis_pool *
pool_for(const char *url, const char *password, size_t n)
{
    struct redis_url u;
    struct redis_pool_opts o = { &u, password, n };
    struct redis_pool *p;

    ck_assert_int_eq(redis_url_parse(url, &u), 0);
    p = redis_pool_new(&o);
    ck_assert_ptr_nonnull(p);
    redis_url_wipe(&u);
    return p;
}

static void
fill(struct redis_pool *p, int want)
{
    char err[256];
    int rc = redis_pool_fill(p, gw_now_ms() + 2000, err, sizeof(err));

    ck_assert_msg(rc == want, "fill: %d (%s)", rc, err);
}

/* PING on the pool by 'deadline'; 0 or the error. */
static int
ping(struct redis_pool *p, int64_t deadline)
{
    const char *argv[] = { "PING" };
    struct redis_cmd cmd = { NULL, 0, 1, argv, NULL };
    redisReply *r;
    int rc = redis_pool_pipeline(p, &cmd, 1, &r, deadline);

    if (rc == 0) {
        ck_assert_int_eq(r->type, REDIS_REPLY_STATUS);
        ck_assert_str_eq(r->str, "PONG");
        redis_replies_free(&r, 1);
    }
    return rc;
}

/* ---- the pool, against a fake server ---- */

/*
 * A fake Redis on a unix socket, one connection, in a thread: after each
 * read it writes the next of 'answers' (none left: it only reads).  The
 * test's process ends the thread (Check's fork mode).
 */
struct fake {
    int lfd;
    char path[108];
    const char *const *answers;
    size_t n;
    void (*after)(int fd);      /* once the answers are out, or NULL */
    pthread_t thread;
};

static void *
fake_serve(void *arg)
{
    struct fake *f = arg;
    char buf[4096];
    size_t turn = 0;
    int fd = accept(f->lfd, NULL, NULL);

    for (;;) {
        ssize_t n = read(fd, buf, sizeof(buf));

        if (n <= 0)
            break;
        if (turn < f->n) {
            (void)!write(fd, f->answers[turn], strlen(f->answers[turn]));
            if (++turn == f->n && f->after != NULL)
                f->after(fd);
        }
    }
    close(fd);
    return NULL;
}

/* Start fake 'f' (answers set); its pool of one connection, unfilled. */
static struct redis_pool *
fake_start(struct fake *f)
{
    struct sockaddr_un a = { .sun_family = AF_UNIX };
    char url[140];

    snprintf(f->path, sizeof(f->path), "/tmp/check-redis-%d.sock",
             (int)getpid());
    unlink(f->path);
    snprintf(a.sun_path, sizeof(a.sun_path), "%s", f->path);
    f->lfd = socket(AF_UNIX, SOCK_STREAM, 0);
    ck_assert_int_ne(f->lfd, -1);
    ck_assert_int_eq(bind(f->lfd, (struct sockaddr *)&a, sizeof(a)), 0);
    ck_assert_int_eq(listen(f->lfd, 4), 0);
    ck_assert_int_eq(pthread_create(&f->thread, NULL, fake_serve, f), 0);
    snprintf(url, sizeof(url), "unix:%s", f->path);
    return pool_for(url, NULL, 1);
}

/* After the pool is freed: its connection closed, the thread ends. */
static void
fake_stop(struct fake *f)
{
    ck_assert_int_eq(pthread_join(f->thread, NULL), 0);
    close(f->lfd);
    unlink(f->path);
}

/* GET k on 'p'; its reply's text in out[0..n), or "" on an error. */
static int
get_k(struct redis_pool *p, char *out, size_t n)
{
    const char *argv[] = { "GET", "k" };
    struct redis_cmd cmd = { NULL, 0, 2, argv, NULL };
    redisReply *r;
    int rc = redis_pool_pipeline(p, &cmd, 1, &r, gw_now_ms() + 500);

    snprintf(out, n, "%s", rc == 0 && r->str != NULL ? r->str : "");
    redis_replies_free(&r, 1);
    return rc;
}

/* A reply nobody asked for, in the same read as the last one asked for,
 * must not answer the next caller: the connection is closed instead. */
START_TEST(test_stale_reply_never_reaches_the_next_caller)
{
    static const char *const after_get[] = {
        "+PONG\r\n", "$5\r\nREAL!\r\n+STALE\r\n", "$5\r\nREAL!\r\n",
    };
    static const char *const after_hello[] = {
        "+PONG\r\n+STALE\r\n", "$5\r\nREAL!\r\n",
    };
    struct fake f = { .answers = after_get, .n = 3 };
    struct redis_pool *p = fake_start(&f);
    char got[32], err[128];

    fill(p, 1);
    ck_assert_int_eq(get_k(p, got, sizeof(got)), 0);
    ck_assert_str_eq(got, "REAL!");
    /* Not "STALE": the connection that held it is gone. */
    ck_assert_int_eq(get_k(p, got, sizeof(got)), GW_EUNAVAIL);
    ck_assert_int_eq(redis_pool_connected(p), 0);
    redis_pool_free(p);
    fake_stop(&f);

    /* The same in the hello: that connection never joins the pool. */
    f = (struct fake){ .answers = after_hello, .n = 2 };
    p = fake_start(&f);
    ck_assert_int_eq(redis_pool_fill(p, gw_now_ms() + 1000, err,
                                     sizeof(err)), GW_EPARSE);
    ck_assert_int_eq(get_k(p, got, sizeof(got)), GW_EUNAVAIL);
    redis_pool_free(p);
    fake_stop(&f);
}
END_TEST

/*
 * A proxy that echoes a command's arguments in its error, as Redis does
 * for an unknown command: AUTH gets "-ERR unknown command 'AUTH', with
 * args beginning with: 'a' 'b' ", anything else +PONG.  One connection.
 */
static void *
echo_serve(void *arg)
{
    struct fake *f = arg;
    char in[8192], out[9000];
    size_t have = 0;
    int fd = accept(f->lfd, NULL, NULL);

    for (;;) {
        ssize_t n = read(fd, in + have, sizeof(in) - have - 1);
        char *p = in;

        if (n <= 0)
            break;
        have += (size_t)n;
        in[have] = '\0';
        /* Whole commands only: "*N\r\n" then N of "$L\r\n<L bytes>\r\n". */
        for (;;) {
            char *q = p, *e;
            long argc, len;
            size_t o;
            int auth = 0, whole = 1;

            if (*q != '*' || (e = strstr(q, "\r\n")) == NULL)
                break;
            argc = strtol(q + 1, NULL, 10);
            q = e + 2;
            o = (size_t)snprintf(out, sizeof(out), "-ERR unknown command");
            for (long i = 0; i < argc && whole; i++) {
                if (*q != '$' || (e = strstr(q, "\r\n")) == NULL) {
                    whole = 0;
                    break;
                }
                len = strtol(q + 1, NULL, 10);
                q = e + 2;
                if (q + len + 2 > in + have) {
                    whole = 0;
                    break;
                }
                if (i == 0)
                    auth = len == 4 && strncmp(q, "AUTH", 4) == 0;
                o += (size_t)snprintf(out + o, sizeof(out) - o, i == 0
                                      ? " '%.*s', with args beginning "
                                      "with:" : " '%.*s'", (int)len, q);
                q += len + 2;
            }
            if (!whole)
                break;
            if (auth)
                snprintf(out + o, sizeof(out) - o, "\r\n");
            else
                snprintf(out, sizeof(out), "+PONG\r\n");
            (void)!write(fd, out, strlen(out));
            p = q;
        }
        have -= (size_t)(p - in);
        memmove(in, p, have);
    }
    close(fd);
    return NULL;
}

/* The password never reaches err[] (and so the log and the status
 * view's last_error), even from a proxy that echoes it. */
START_TEST(test_auth_error_never_echoes_the_password)
{
    struct fake f = { 0 };
    struct sockaddr_un a = { .sun_family = AF_UNIX };
    const char *query[] = { "", "?user=app" };
    char url[160], err[256];

    for (size_t k = 0; k < GW_ARRAY_LEN(query); k++) {
        struct redis_pool *p;

        snprintf(f.path, sizeof(f.path), "/tmp/check-redis-%d.sock",
                 (int)getpid());
        unlink(f.path);
        snprintf(a.sun_path, sizeof(a.sun_path), "%s", f.path);
        f.lfd = socket(AF_UNIX, SOCK_STREAM, 0);
        ck_assert_int_eq(bind(f.lfd, (struct sockaddr *)&a, sizeof(a)), 0);
        ck_assert_int_eq(listen(f.lfd, 4), 0);
        ck_assert_int_eq(pthread_create(&f.thread, NULL, echo_serve, &f),
                         0);
        snprintf(url, sizeof(url), "unix:%s%s", f.path, query[k]);
        p = pool_for(url, "hunter2-secret", 1);
        ck_assert_int_eq(redis_pool_fill(p, gw_now_ms() + 1000, err,
                                         sizeof(err)), GW_EUPSTREAM);
        ck_assert_str_eq(err, "AUTH: ERR");
        ck_assert_ptr_null(strstr(err, "hunter2"));
        redis_pool_free(p);
        pthread_join(f.thread, NULL);
        close(f.lfd);
        unlink(f.path);
    }
}
END_TEST

/* After the answers: ":1\r\n" for as long as the client reads. */
static void
flood_ones(int fd)
{
    static char chunk[65536];

    for (size_t i = 0; i < sizeof(chunk); i += 4)
        memcpy(chunk + i, ":1\r\n", 4);
    while (write(fd, chunk, sizeof(chunk)) > 0)
        continue;
}

/* An array header asks for 100 million elements, and they come: the
 * round trip fails by its deadline without the memory growing. */
START_TEST(test_array_bomb)
{
    static const char *const answers[] = { "+PONG\r\n", "*100000000\r\n" };
    struct fake f = { .answers = answers, .n = 2, .after = flood_ones };
    struct redis_pool *p;
    struct rusage ru0, ru1;
    char got[32];
    int64_t t0;

    signal(SIGPIPE, SIG_IGN);
    p = fake_start(&f);
    fill(p, 1);
    getrusage(RUSAGE_SELF, &ru0);
    t0 = gw_now_ms();
    ck_assert_int_eq(get_k(p, got, sizeof(got)), GW_ETOOBIG);
    ck_assert_int_lt(gw_now_ms() - t0, 500);
    getrusage(RUSAGE_SELF, &ru1);
    ck_assert_int_lt(ru1.ru_maxrss - ru0.ru_maxrss, 50 * 1024);   /* KB */
    ck_assert_int_eq(redis_pool_connected(p), 0);
    redis_pool_free(p);
    fake_stop(&f);
}
END_TEST

/* The budget is the reply's, not each array's: two arrays of 40,000
 * together are past it.  Any one reply under it reads (the next). */
START_TEST(test_reply_budget_is_per_reply)
{
    static char nested[2 * 16 + 2 * 40000 * 4 + 16], flat[16 + 30000 * 4];
    const char *answers[] = { "+PONG\r\n", nested };
    struct fake f = { .answers = answers, .n = 2 };
    struct redis_pool *p;
    redisReader *r = redisReaderCreate();
    struct redis_reply_budget b;
    void *reply = NULL;
    size_t o;
    char got[32];

    o = (size_t)snprintf(nested, sizeof(nested), "*2\r\n");
    for (int k = 0; k < 2; k++) {
        o += (size_t)snprintf(nested + o, sizeof(nested) - o, "*40000\r\n");
        for (int i = 0; i < 40000; i++, o += 4)
            memcpy(nested + o, ":1\r\n", 4);
    }
    nested[o] = '\0';
    p = fake_start(&f);
    fill(p, 1);
    ck_assert_int_eq(get_k(p, got, sizeof(got)), GW_ETOOBIG);
    redis_pool_free(p);
    fake_stop(&f);

    /* On a reader of one's own (the fuzzer's way): two replies of
     * 30,000 each read one after the other. */
    o = (size_t)snprintf(flat, sizeof(flat), "*30000\r\n");
    for (int i = 0; i < 30000; i++, o += 4)
        memcpy(flat + o, ":1\r\n", 4);
    redis_reader_bound(r, &b);
    for (int k = 0; k < 2; k++) {
        ck_assert_int_eq(redisReaderFeed(r, flat, o), REDIS_OK);
        ck_assert_int_eq(redisReaderGetReply(r, &reply), REDIS_OK);
        ck_assert_ptr_nonnull(reply);
        ck_assert_uint_eq(((redisReply *)reply)->elements, 30000);
        freeReplyObject(reply);
    }
    ck_assert_int_eq(redisReaderFeed(r, nested, strlen(nested)), REDIS_OK);
    ck_assert_int_eq(redisReaderGetReply(r, &reply), REDIS_ERR);
    ck_assert(b.over);
    redisReaderFree(r);
}
END_TEST

START_TEST(test_no_connection_fails_at_once)
{
    struct redis_pool *p = pool_for(srv.url, NULL, 4);
    int64_t t0 = gw_now_ms();

    /* Nothing filled: a caller never connects on its own thread. */
    ck_assert_int_eq(ping(p, t0 + 5000), GW_EUNAVAIL);
    ck_assert_int_lt(gw_now_ms() - t0, 50);
    ck_assert_int_eq(test_redis_info(&srv, NULL, "connected_clients"), 1);
    redis_pool_free(p);
}
END_TEST

START_TEST(test_pool_bound)
{
    struct redis_pool *p = pool_for(srv.url, NULL, 2);
    struct redis_conn *a, *b, *c;
    int64_t t0;

    fill(p, 2);
    ck_assert_int_eq(redis_pool_connected(p), 2);
    ck_assert_int_eq(redis_pool_take(p, gw_now_ms() + 1000, &a), 0);
    ck_assert_int_eq(redis_pool_take(p, gw_now_ms() + 1000, &b), 0);
    t0 = gw_now_ms();
    ck_assert_int_eq(redis_pool_take(p, t0 + 60, &c), GW_EBUSY);
    ck_assert_int_ge(gw_now_ms() - t0, 55);
    ck_assert_int_lt(gw_now_ms() - t0, 500);
    redis_pool_put(p, a);
    ck_assert_int_eq(redis_pool_take(p, gw_now_ms() + 1000, &c), 0);
    ck_assert_ptr_eq(c, a);
    redis_pool_put(p, b);
    redis_pool_put(p, c);
    /* Ours two, and test_redis_info()'s own. */
    ck_assert_int_eq(test_redis_info(&srv, NULL, "connected_clients"), 3);
    redis_pool_free(p);
}
END_TEST

#define HAMMER_THREADS 8
#define HAMMER_ROUNDS 200

static void *
hammer(void *arg)
{
    struct redis_pool *p = arg;
    long ok = 0;

    for (int i = 0; i < HAMMER_ROUNDS; i++)
        ok += ping(p, gw_now_ms() + 2000) == 0;
    return (void *)ok;
}

START_TEST(test_threads_share_the_bound)
{
    struct redis_pool *p = pool_for(srv.url, NULL, 2);
    pthread_t t[HAMMER_THREADS];
    void *ok;

    fill(p, 2);
    for (int i = 0; i < HAMMER_THREADS; i++)
        ck_assert_int_eq(pthread_create(&t[i], NULL, hammer, p), 0);
    for (int i = 0; i < HAMMER_THREADS; i++) {
        ck_assert_int_eq(pthread_join(t[i], &ok), 0);
        ck_assert_int_eq((long)ok, HAMMER_ROUNDS);
    }
    /* Eight threads, never more than the pool's two connections (the
     * others: test_redis_start()'s and test_redis_info()'s). */
    ck_assert_int_eq(test_redis_info(&srv, NULL, "total_connections_"
                                     "received"), 2 + 2);
    redis_pool_free(p);
}
END_TEST

START_TEST(test_deadline_against_a_stopped_server)
{
    struct redis_pool *p = pool_for(srv.url, NULL, 2);
    int64_t t0;

    fill(p, 2);
    ck_assert_int_eq(ping(p, gw_now_ms() + 1000), 0);
    kill(srv.pid, SIGSTOP);
    t0 = gw_now_ms();
    ck_assert_int_eq(ping(p, t0 + 40), GW_ETIMEDOUT);
    ck_assert_int_ge(gw_now_ms() - t0, 35);
    ck_assert_int_lt(gw_now_ms() - t0, 140);
    /* The late PONG must never answer someone else: closed. */
    ck_assert_int_eq(redis_pool_connected(p), 1);
    /* Filling does not hang on it either: its hello has a deadline. */
    t0 = gw_now_ms();
    ck_assert_int_eq(redis_pool_fill(p, t0 + 80, NULL, 0), GW_ETIMEDOUT);
    ck_assert_int_lt(gw_now_ms() - t0, 300);
    kill(srv.pid, SIGCONT);
    ck_assert_int_eq(ping(p, gw_now_ms() + 1000), 0);
    redis_pool_free(p);
}
END_TEST

START_TEST(test_dead_server_fails_at_once)
{
    struct redis_pool *p = pool_for(srv.url, NULL, 3);
    int64_t t0;

    fill(p, 3);
    test_redis_kill(&srv);
    /* Each idle connection is found closed when taken, and none is
     * made in its place. */
    t0 = gw_now_ms();
    ck_assert_int_eq(ping(p, t0 + 1000), GW_EUNAVAIL);
    ck_assert_int_lt(gw_now_ms() - t0, 50);
    ck_assert_int_eq(redis_pool_connected(p), 0);
    ck_assert_int_lt(redis_pool_fill(p, gw_now_ms() + 500, NULL, 0), 0);
    redis_pool_free(p);
}
END_TEST

START_TEST(test_drop_idle)
{
    struct redis_pool *p = pool_for(srv.url, NULL, 3);
    struct redis_conn *c;

    fill(p, 3);
    ck_assert_int_eq(redis_pool_take(p, gw_now_ms() + 100, &c), 0);
    redis_pool_drop_idle(p);
    ck_assert_int_eq(redis_pool_connected(p), 1);   /* the taken one */
    redis_pool_put(p, c);
    ck_assert_int_eq(ping(p, gw_now_ms() + 1000), 0);
    fill(p, 3);
    redis_pool_free(p);
}
END_TEST

static const char echo_src[] =
    "return {KEYS[1], ARGV[1], redis.call('INCR', KEYS[1])}";

/*
 * The echo script and a plain GET in one round trip: the script returns
 * 'want', the GET sees 'get'.
 */
static void
run_echo(struct redis_pool *p, const struct redis_script *s, long want,
         long get)
{
    const char *sargv[] = { "k", "hello" };
    const char *gargv[] = { "GET", "k" };
    struct redis_cmd cmds[2] = {
        { s, 1, 2, sargv, NULL },
        { NULL, 0, 2, gargv, NULL },
    };
    redisReply *r[2];
    char want_s[16];

    ck_assert_int_eq(redis_pool_pipeline(p, cmds, 2, r,
                                         gw_now_ms() + 1000), 0);
    ck_assert_int_eq(r[0]->type, REDIS_REPLY_ARRAY);
    ck_assert_int_eq(r[0]->elements, 3);
    ck_assert_str_eq(r[0]->element[0]->str, "k");
    ck_assert_str_eq(r[0]->element[1]->str, "hello");
    ck_assert_int_eq(r[0]->element[2]->integer, want);
    snprintf(want_s, sizeof(want_s), "%ld", get);
    ck_assert_int_eq(r[1]->type, REDIS_REPLY_STRING);
    ck_assert_str_eq(r[1]->str, want_s);
    redis_replies_free(r, 2);
}

START_TEST(test_noscript_falls_back_to_eval)
{
    struct redis_pool *p = pool_for(srv.url, NULL, 1);
    struct redis_script s;
    redisContext *c;
    redisReply *r;

    redis_script_init(&s, echo_src);
    fill(p, 1);
    run_echo(p, &s, 1, 1);      /* new connection: EVAL, in its place */
    run_echo(p, &s, 2, 2);      /* known now: EVALSHA alone */
    c = test_redis_connect(&srv, NULL);
    r = redisCommand(c, "SCRIPT FLUSH");
    freeReplyObject(r);
    /* A flushed cache: NOSCRIPT, then EVAL after the GET (redis.h). */
    run_echo(p, &s, 3, 2);
    run_echo(p, &s, 4, 4);
    r = redisCommand(c, "INFO commandstats");
    ck_assert_msg(strstr(r->str, "cmdstat_eval:calls=2,") != NULL, "%s",
                  r->str);
    ck_assert_msg(strstr(r->str, "cmdstat_evalsha:calls=3,") != NULL,
                  "%s", r->str);
    freeReplyObject(r);
    redisFree(c);
    redis_pool_free(p);
}
END_TEST

START_TEST(test_error_reply_is_a_reply)
{
    struct redis_pool *p = pool_for(srv.url, NULL, 1);
    const char *bad[] = { "NOSUCHCOMMAND" };
    const char *ping_argv[] = { "PING" };
    struct redis_cmd cmds[2] = {
        { NULL, 0, 1, bad, NULL },
        { NULL, 0, 1, ping_argv, NULL },
    };
    redisReply *r[2];

    fill(p, 1);
    ck_assert_int_eq(redis_pool_pipeline(p, cmds, 2, r,
                                         gw_now_ms() + 1000), 0);
    ck_assert(redis_reply_is_error(r[0], "ERR"));
    ck_assert(!redis_reply_is_error(r[0], "ER"));
    ck_assert_str_eq(r[1]->str, "PONG");
    redis_replies_free(r, 2);
    ck_assert_int_eq(redis_pool_connected(p), 1);   /* still good */
    redis_pool_free(p);
}
END_TEST

START_TEST(test_select_db)
{
    char url[200];
    struct redis_pool *p;
    const char *set[] = { "SET", "where", "db3" };
    struct redis_cmd cmd = { NULL, 0, 3, set, NULL };
    redisReply *r;
    redisContext *c;

    /* Over TCP, with SELECT in the hello. */
    snprintf(url, sizeof(url), "%s/3", srv.tcp_url);
    p = pool_for(url, NULL, 1);
    fill(p, 1);
    ck_assert_int_eq(redis_pool_pipeline(p, &cmd, 1, &r,
                                         gw_now_ms() + 1000), 0);
    redis_replies_free(&r, 1);
    c = test_redis_connect(&srv, NULL);
    r = redisCommand(c, "GET where");
    ck_assert_int_eq(r->type, REDIS_REPLY_NIL);     /* not in db 0 */
    freeReplyObject(r);
    r = redisCommand(c, "SELECT 3");
    freeReplyObject(r);
    r = redisCommand(c, "GET where");
    ck_assert_str_eq(r->str, "db3");
    freeReplyObject(r);
    redisFree(c);
    redis_pool_free(p);
}
END_TEST

static void
setup(void)
{
    test_redis_start(&srv, NULL);
}

static void
teardown(void)
{
    test_redis_kill(&srv);
}

/* ---- AUTH ---- */

#define PASSWORD "correct-horse-battery"

static void
setup_auth(void)
{
    test_redis_start(&srv, PASSWORD);
}

START_TEST(test_auth)
{
    struct redis_pool *p = pool_for(srv.url, PASSWORD, 2);
    char err[256];

    fill(p, 2);
    ck_assert_int_eq(ping(p, gw_now_ms() + 1000), 0);
    redis_pool_free(p);

    p = pool_for(srv.url, "wrong-password", 2);
    ck_assert_int_eq(redis_pool_fill(p, gw_now_ms() + 1000, err,
                                     sizeof(err)), GW_EUPSTREAM);
    ck_assert_msg(strncmp(err, "AUTH: WRONGPASS", 15) == 0, "%s", err);
    ck_assert_ptr_null(strstr(err, "wrong-password"));
    ck_assert_int_eq(redis_pool_connected(p), 0);
    redis_pool_free(p);

    p = pool_for(srv.url, NULL, 1);     /* no password at all */
    ck_assert_int_eq(redis_pool_fill(p, gw_now_ms() + 1000, err,
                                     sizeof(err)), GW_EUPSTREAM);
    ck_assert_msg(strncmp(err, "PING: NOAUTH", 12) == 0, "%s", err);
    redis_pool_free(p);
}
END_TEST

START_TEST(test_auth_user_from_url)
{
    char url[300];
    struct redis_pool *p;

    /* "default" is the user requirepass sets the password of; AUTH
     * sends both, as Redis 6's ACLs read them. */
    snprintf(url, sizeof(url), "redis://default:%s@127.0.0.1:%d",
             PASSWORD, srv.port);
    p = pool_for(url, NULL, 1);
    fill(p, 1);
    ck_assert_int_eq(ping(p, gw_now_ms() + 1000), 0);
    redis_pool_free(p);
    /* An ACL user in the URL, its password from elsewhere (the file). */
    snprintf(url, sizeof(url), "redis://default@127.0.0.1:%d", srv.port);
    p = pool_for(url, PASSWORD, 1);
    fill(p, 1);
    ck_assert_int_eq(ping(p, gw_now_ms() + 1000), 0);
    redis_pool_free(p);
    snprintf(url, sizeof(url), "redis://nobody:%s@127.0.0.1:%d",
             PASSWORD, srv.port);
    p = pool_for(url, NULL, 1);
    ck_assert_int_eq(redis_pool_fill(p, gw_now_ms() + 1000, NULL, 0),
                     GW_EUPSTREAM);
    redis_pool_free(p);
}
END_TEST

static Suite *
redis_suite(void)
{
    Suite *s = suite_create("redis");
    TCase *tc;

    tc = tcase("urls");
    tcase_add_loop_test(tc, test_url_table, 0, (int)GW_ARRAY_LEN(url_cases));
    tcase_add_test(tc, test_url_show_hides_the_password);
    tcase_add_test(tc, test_script_sha1);
    suite_add_tcase(s, tc);

    tc = tcase("pool");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_no_connection_fails_at_once);
    tcase_add_test(tc, test_pool_bound);
    tcase_add_test(tc, test_threads_share_the_bound);
    tcase_add_test(tc, test_deadline_against_a_stopped_server);
    tcase_add_test(tc, test_dead_server_fails_at_once);
    tcase_add_test(tc, test_drop_idle);
    tcase_add_test(tc, test_error_reply_is_a_reply);
    tcase_add_test(tc, test_select_db);
    suite_add_tcase(s, tc);

    tc = tcase("scripts");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_noscript_falls_back_to_eval);
    suite_add_tcase(s, tc);

    tc = tcase("fake");
    tcase_add_test(tc, test_stale_reply_never_reaches_the_next_caller);
    tcase_add_test(tc, test_array_bomb);
    tcase_add_test(tc, test_auth_error_never_echoes_the_password);
    tcase_add_test(tc, test_reply_budget_is_per_reply);
    suite_add_tcase(s, tc);

    tc = tcase("auth");
    tcase_add_checked_fixture(tc, setup_auth, teardown);
    tcase_add_test(tc, test_auth);
    tcase_add_test(tc, test_auth_user_from_url);
    suite_add_tcase(s, tc);

    return s;
}

int
main(void)
{
    return test_run(srunner_create(redis_suite()));
}
