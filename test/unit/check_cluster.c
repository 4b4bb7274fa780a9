/* SPDX-License-Identifier: MIT */
/*
 * check_cluster.c - unit tests for gateway/base/cluster.c and its beat
 * (cluster_beat.c): key naming and hash tags, the membership reply, and
 * against a real redis-server (redisutil.h): the beat connects and
 * lists this gateway, the request path's round trip fails at once with
 * Redis gone and keeps its deadline with Redis stopped, and the metrics.
 */
#include <check.h>

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "alloc.h"
#include "base/cluster.h"
#include "base/config.h"
#include "buf.h"
#include "redisutil.h"
#include "testutil.h"
#include "util.h"

static struct test_redis srv;

/* A configuration with [cluster] on 'url' and 'more' lines. */
static void
load(struct gw_config *c, const char *url, const char *more)
{
    char text[1024], err[256];

    snprintf(text, sizeof(text), "[server]\nlisten = 127.0.0.1:0\n"
             "[cluster]\nredis = %s\nlease = 1s\nredis_connections = 2\n"
             "%s", url, more);
    ck_assert_msg(config_load_text("g.conf", text, c, err, sizeof(err))
                  == 0, "%s", err);
}

static struct cluster *
start(const char *url, const char *more)
{
    struct gw_config c;
    struct cluster_self self = { 7, 1700000000000, NULL, NULL };
    struct cluster *cl;

    load(&c, url, more);
    cl = cluster_start(&c, &self);
    config_release(&c);
    ck_assert_ptr_nonnull(cl);
    return cl;
}

/* The last reference, and the beat's end (it frees the cluster). */
static void
unref(struct cluster *cl)
{
    cluster_unref(cl);
    ck_assert_int_eq(cluster_wait_beats(gw_now_ms() + 3000), 0);
}

/* ---- keys ---- */

START_TEST(test_keys)
{
    struct cluster *cl = start("unix:/nonexistent/r.sock",
                               "key_prefix = app:\n");
    char k[CLUSTER_KEY_MAX], small[12];

    ck_assert_int_eq(cluster_key(cl, "acme", "rpm", k, sizeof(k)), 0);
    ck_assert_str_eq(k, "app:{acme}:rpm");
    ck_assert_int_eq(cluster_key(cl, CLUSTER_TAG_GATEWAYS, "members", k,
                                 sizeof(k)), 0);
    ck_assert_str_eq(k, "app:{@gateways}:members");
    /* A brace would move the hash tag: refused, as blanks are. */
    ck_assert_int_eq(cluster_key(cl, "a}b", "rpm", k, sizeof(k)),
                     GW_EINVAL);
    ck_assert_int_eq(cluster_key(cl, "acme", "x{y", k, sizeof(k)),
                     GW_EINVAL);
    ck_assert_int_eq(cluster_key(cl, "a b", "rpm", k, sizeof(k)),
                     GW_EINVAL);
    ck_assert_int_eq(cluster_key(cl, "", "rpm", k, sizeof(k)), GW_EINVAL);
    ck_assert_int_eq(cluster_key(cl, "acme", "rpm", small, sizeof(small)),
                     GW_ETOOBIG);
    ck_assert_str_eq(small, "");
    unref(cl);
}
END_TEST

/* The default node name keeps a long host name's end (its unique part
 * in a pod's name) and the port. */
START_TEST(test_node_name)
{
    /* 46 bytes, as Kubernetes names a Deployment's pods. */
    const char *pod = "inference-gateway-production-7d9f8b6c5db-x2kq4";
    const char *h64 = "0123456789012345678901234567890123456789"
                      "012345678901234567890123";
    char out[CONFIG_NAME_MAX + 1], want[CONFIG_NAME_MAX + 1];

    ck_assert_uint_eq(strlen(pod), 46);
    cluster_node_name(pod, 8080, out, sizeof(out));
    ck_assert_str_eq(out, "inference-gateway-production-7d9f8b6c5db-x2kq4"
                     ":8080");
    cluster_node_name(h64, 65535, out, sizeof(out));
    ck_assert_uint_eq(strlen(out), CONFIG_NAME_MAX);
    ck_assert_str_eq(out, "67890123456789012345678901234567890123456789"
                     "01234567890123:65535");
    cluster_node_name("h", 0, out, sizeof(out));
    snprintf(want, sizeof(want), "h:pid%ld", (long)getpid());
    ck_assert_str_eq(out, want);
}
END_TEST

/* ---- the membership reply ---- */

/* A reply built by hiredis's reader from protocol bytes. */
static redisReply *
reply_of(const char *resp)
{
    redisReader *r = redisReaderCreate();
    void *reply = NULL;

    ck_assert_int_eq(redisReaderFeed(r, resp, strlen(resp)), REDIS_OK);
    ck_assert_int_eq(redisReaderGetReply(r, &reply), REDIS_OK);
    ck_assert_ptr_nonnull(reply);
    redisReaderFree(r);
    return reply;
}

#define HB(node) "{\"node\":\"" node "\",\"version\":\"0.1.0\"," \
                 "\"generation\":3,\"started_unix_ms\":17}"

START_TEST(test_members_read)
{
    struct cluster_member m[2];
    char resp[1024];
    redisReply *r;
    size_t n;

    snprintf(resp, sizeof(resp),
             "*8\r\n$%zu\r\n%s\r\n:900\r\n"
             "$7\r\n{\"x\":1}\r\n:5\r\n"             /* not a heartbeat */
             "$%zu\r\n%s\r\n:-2\r\n"                 /* expired */
             "$%zu\r\n%s\r\n:10\r\n",
             strlen(HB("gw-a")), HB("gw-a"), strlen(HB("gw-b")), HB("gw-b"),
             strlen(HB("gw-c")), HB("gw-c"));
    r = reply_of(resp);
    ck_assert_int_eq(cluster_members_read(r, m, 2, &n), 0);
    ck_assert_uint_eq(n, 2);
    ck_assert_str_eq(m[0].node, "gw-a");
    ck_assert_str_eq(m[0].version, "0.1.0");
    ck_assert_uint_eq(m[0].generation, 3);
    ck_assert_int_eq(m[0].started_unix_ms, 17);
    ck_assert_int_eq(m[0].ttl_ms, 900);
    ck_assert_str_eq(m[1].node, "gw-c");
    /* No room for more than 'max'. */
    ck_assert_int_eq(cluster_members_read(r, m, 1, &n), 0);
    ck_assert_uint_eq(n, 1);
    freeReplyObject(r);

    r = reply_of("*1\r\n:1\r\n");               /* odd: not pairs */
    ck_assert_int_eq(cluster_members_read(r, m, 2, &n), GW_EPARSE);
    freeReplyObject(r);
    r = reply_of("-ERR nope\r\n");
    ck_assert_int_eq(cluster_members_read(r, m, 2, &n), GW_EPARSE);
    ck_assert_uint_eq(n, 0);
    freeReplyObject(r);
    /* A node with a brace, or one twice: skipped. */
    snprintf(resp, sizeof(resp), "*4\r\n$%zu\r\n%s\r\n:1\r\n$%zu\r\n%s\r\n"
             ":1\r\n", strlen(HB("a{b")), HB("a{b"),
             strlen(HB("x\",\"node\":\"y")), HB("x\",\"node\":\"y"));
    r = reply_of(resp);
    ck_assert_int_eq(cluster_members_read(r, m, 2, &n), 0);
    ck_assert_uint_eq(n, 0);
    freeReplyObject(r);
}
END_TEST

/* ---- against a real server ---- */

static struct cluster_status *
status_of(struct cluster *cl)
{
    struct cluster_status *s = gw_calloc(1, sizeof(*s));

    ck_assert_ptr_nonnull(s);
    cluster_status(cl, s);
    return s;
}

/* Poll until the beat says 'up' (with 'members' members, unless < 0). */
static void
wait_up(struct cluster *cl, int up, int members)
{
    int64_t deadline = gw_now_ms() + 8000;

    for (;;) {
        struct cluster_status *s = status_of(cl);
        int ok = s->up == up
                 && (members < 0 || (int)s->num_members == members);

        gw_free(s);
        if (ok)
            return;
        ck_assert_msg(gw_now_ms() < deadline, "never up=%d members=%d", up,
                      members);
        usleep(10000);
    }
}

static int
ping(struct cluster *cl, int64_t timeout_ms)
{
    const char *argv[] = { "PING" };
    struct redis_cmd cmd = { NULL, 0, 1, argv, NULL };
    redisReply *r = NULL;
    int rc = cluster_pipeline(cl, CLUSTER_OP_HEARTBEAT, &cmd, 1, &r,
                              timeout_ms);

    redis_replies_free(&r, 1);
    return rc;
}

START_TEST(test_beat_lists_this_gateway)
{
    struct cluster *cl = start(srv.url, "node = gw-test\n");
    struct cluster_status *s;
    redisContext *c;
    redisReply *r;

    wait_up(cl, 1, 1);
    s = status_of(cl);
    ck_assert_str_eq(s->members[0].node, "gw-test");
    ck_assert_str_eq(s->members[0].instance, cluster_instance());
    ck_assert_uint_eq(strlen(cluster_instance()), CLUSTER_INSTANCE_LEN);
    ck_assert_uint_eq(s->members[0].generation, 7);
    ck_assert_int_eq(s->members[0].started_unix_ms, 1700000000000);
    ck_assert_int_le(s->members[0].ttl_ms, 1000);
    ck_assert_uint_eq(s->connections, 2);
    ck_assert_str_eq(s->redis, srv.url);
    gw_free(s);
    c = test_redis_connect(&srv, NULL);
    r = redisCommand(c, "PTTL infergw:{@gateways}:node:gw-test");
    ck_assert_int_gt(r->integer, 0);
    ck_assert_int_le(r->integer, 1000);
    freeReplyObject(r);
    redisFree(c);
    unref(cl);
}
END_TEST

START_TEST(test_fails_at_once_with_redis_gone)
{
    struct cluster *cl = start(srv.url, "redis_timeout = 50ms\n");
    int64_t t0;

    wait_up(cl, 1, -1);
    ck_assert_int_eq(ping(cl, 0), 0);
    test_redis_kill(&srv);
    wait_up(cl, 0, -1);
    /* The beat closed the idle connections: no wait at all. */
    t0 = gw_now_ms();
    ck_assert_int_eq(ping(cl, 0), GW_EUNAVAIL);
    ck_assert_int_lt(gw_now_ms() - t0, 5);
    unref(cl);
}
END_TEST

START_TEST(test_deadline_with_redis_stopped)
{
    struct cluster *cl = start(srv.url, "redis_timeout = 30ms\n");
    int64_t t0;
    int rc;

    wait_up(cl, 1, -1);
    kill(srv.pid, SIGSTOP);
    t0 = gw_now_ms();
    rc = ping(cl, 0);               /* redis_timeout */
    ck_assert_int_eq(rc, GW_ETIMEDOUT);
    ck_assert_int_ge(gw_now_ms() - t0, 25);
    ck_assert_int_lt(gw_now_ms() - t0, 100);
    /* Once the beat finds it stopped, its idle connection (quiet: a
     * stopped server closes nothing) is closed: no more waits. */
    wait_up(cl, 0, -1);
    t0 = gw_now_ms();
    rc = ping(cl, 0);
    kill(srv.pid, SIGCONT);
    ck_assert_int_eq(rc, GW_EUNAVAIL);
    ck_assert_int_lt(gw_now_ms() - t0, 5);
    wait_up(cl, 1, -1);
    ck_assert_int_eq(ping(cl, 0), 0);
    unref(cl);
}
END_TEST

/* Hold a connection of cl's for ~1 s: Redis blocks it (BLPOP). */
static void *
hold(void *arg)
{
    const char *argv[] = { "BLPOP", "nothing", "1" };
    struct redis_cmd cmd = { NULL, 0, 3, argv, NULL };
    redisReply *r = NULL;
    long rc = cluster_pipeline(arg, CLUSTER_OP_HEARTBEAT, &cmd, 1, &r, 3000);

    redis_replies_free(&r, 1);
    return (void *)rc;
}

/* Requests holding every connection past the beat's bound (250 ms) do
 * not make Redis look lost: the beat skips a heartbeat, the gauge stays
 * 1 and the connections stay. */
START_TEST(test_busy_pool_is_not_redis_lost)
{
    struct cluster *cl = start(srv.url, "");
    pthread_t t[2];
    struct cluster_status *s;
    void *rc;
    int64_t end;

    wait_up(cl, 1, 1);
    for (int i = 0; i < 2; i++)
        ck_assert_int_eq(pthread_create(&t[i], NULL, hold, cl), 0);
    end = gw_now_ms() + 900;
    while (gw_now_ms() < end) {
        s = status_of(cl);
        ck_assert_msg(s->up == 1, "up 0 with the pool busy: %s",
                      s->last_error);
        gw_free(s);
        usleep(10000);
    }
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(pthread_join(t[i], &rc), 0);
        ck_assert_int_eq((long)rc, 0);
    }
    s = status_of(cl);
    ck_assert_int_eq(s->up, 1);
    ck_assert_uint_eq(s->connections, 2);
    gw_free(s);
    unref(cl);
}
END_TEST

START_TEST(test_metrics)
{
    struct cluster *cl = start(srv.url, "");
    struct buf b;

    wait_up(cl, 1, 1);
    ck_assert_int_eq(ping(cl, 0), 0);
    buf_init(&b, 1 << 20);
    ck_assert_int_eq(cluster_render_metrics(cl, &b), 0);
    ck_assert_int_eq(buf_append(&b, "", 1), 0);
    ck_assert(sample(buf_ptr(&b), "infergw_cluster_up") == 1);
    ck_assert(sample(buf_ptr(&b), "infergw_cluster_members") == 1);
    ck_assert(sample(buf_ptr(&b), "infergw_cluster_errors_total"
                     "{op=\"heartbeat\"}") == 0);
    ck_assert(sample(buf_ptr(&b), "infergw_cluster_latency_seconds_count"
                     "{op=\"connect\"}") >= 1);
    ck_assert(sample(buf_ptr(&b), "infergw_cluster_latency_seconds_count"
                     "{op=\"heartbeat\"}") >= 2);
    buf_release(&b);
    unref(cl);
}
END_TEST

START_TEST(test_same_config)
{
    struct gw_config a, b;

    load(&a, "unix:/r.sock", "");
    load(&b, "unix:/r.sock", "");
    ck_assert(cluster_same_config(&a, &b));
    config_release(&b);
    load(&b, "unix:/r.sock", "node = other\n");
    ck_assert(!cluster_same_config(&a, &b));
    config_release(&b);
    load(&b, "unix:/r.sock", "on_error = deny\n");
    ck_assert(!cluster_same_config(&a, &b));
    config_release(&a);
    config_release(&b);
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

static Suite *
cluster_suite(void)
{
    Suite *s = suite_create("cluster");
    TCase *tc;

    tc = tcase("keys");
    tcase_add_test(tc, test_keys);
    tcase_add_test(tc, test_node_name);
    tcase_add_test(tc, test_same_config);
    suite_add_tcase(s, tc);

    tc = tcase("members");
    tcase_add_test(tc, test_members_read);
    suite_add_tcase(s, tc);

    tc = tcase("redis");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_beat_lists_this_gateway);
    tcase_add_test(tc, test_fails_at_once_with_redis_gone);
    tcase_add_test(tc, test_deadline_with_redis_stopped);
    tcase_add_test(tc, test_metrics);
    tcase_add_test(tc, test_busy_pool_is_not_redis_lost);
    suite_add_tcase(s, tc);

    return s;
}

int
main(void)
{
    return test_run(srunner_create(cluster_suite()));
}
