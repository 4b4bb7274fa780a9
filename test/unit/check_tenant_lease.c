/* SPDX-License-Identifier: MIT */
/*
 * check_tenant_lease.c - unit tests for gateway/base/tenant_lease.c
 * (tenant.h, "Leases"): max_inflight across gateways on a real
 * redis-server (redisutil.h), through tenant_shared_enter() as route.c
 * calls it: a lease taken by the admission, refused at max_inflight,
 * released at the call's end, another gateway's expiring, renewed by
 * the beat, re-added after Redis lost them (and never twice), a
 * release that failed sent by the beat, and the local share with Redis
 * gone.
 */
#include <check.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis/hiredis.h>

#include "base/cluster.h"
#include "base/config.h"
#include "base/tenant.h"
#include "base/tenant_impl.h"
#include "redisutil.h"
#include "testutil.h"
#include "util.h"

#define LEASES "infergw:{acme}:leases"

static struct test_redis srv;

static struct cluster *
start(struct gw_config *c, const char *url, const char *more)
{
    char text[512];

    snprintf(text, sizeof(text), "%s\n[tenant acme]\napi_key = "
             "sk-acme-0123456789\nmax_inflight = 2\n", more);
    return test_cluster_start(c, url, text);
}

/* A call's admission as route.c makes it: its lease in *out, NULL when
 * refused (the lease given back as route.c gives it). */
static enum tenant_limit
enter(struct cluster *cl, struct gw_config *c, struct tenant_lease **out,
      int *rc)
{
    struct tenant_shared_with with = { NULL, NULL, 0, NULL };
    enum tenant_limit v;
    int wait;
    int64_t left;

    ck_assert(tenant_lease_wanted(cl, c, 0));
    with.lease = tenant_lease_new(cl, c, 0);
    ck_assert_ptr_nonnull(with.lease);
    *rc = tenant_shared_enter(cl, c, 0, gw_now_us(), gw_wall_s(), &with,
                              &v, &wait, NULL, &left);
    if (*rc != 0 || v != TENANT_ADMITTED) {
        if (*rc == 0)
            ck_assert_int_eq(wait, 1);
        tenant_lease_release(cl, with.lease, 0);
        with.lease = NULL;
    }
    *out = with.lease;
    return *rc == 0 ? v : TENANT_NOMEM;
}

static long long
zcard(redisContext *rc)
{
    redisReply *r = redisCommand(rc, "ZCARD " LEASES);
    long long n;

    ck_assert_int_eq(r->type, REDIS_REPLY_INTEGER);
    n = r->integer;
    freeReplyObject(r);
    return n;
}

static double
score(redisContext *rc, const char *member)
{
    redisReply *r = redisCommand(rc, "ZSCORE " LEASES " %s", member);
    double s = r->type == REDIS_REPLY_STRING ? atof(r->str) : -1;

    freeReplyObject(r);
    return s;
}

/* The members in Redis, sorted, joined by blanks. */
static void
members(redisContext *rc, char *out, size_t n)
{
    redisReply *r = redisCommand(rc, "ZRANGE " LEASES " 0 -1");
    size_t len = 0;

    out[0] = '\0';
    ck_assert_int_eq(r->type, REDIS_REPLY_ARRAY);
    for (size_t i = 0; i < r->elements; i++)
        len += (size_t)snprintf(out + len, n - len, "%s ",
                                r->element[i]->str);
    freeReplyObject(r);
}

/* The first of members()'s list into out[0..n). */
static const char *
first(const char *list, char *out, size_t n)
{
    size_t len = strcspn(list, " ");

    snprintf(out, n, "%.*s", (int)len, list);
    return out;
}

static size_t
held(size_t *gone)
{
    size_t renewing;

    return tenant_leases_held(gone, &renewing);
}

static size_t
renewing_now(void)
{
    size_t gone, n;

    tenant_leases_held(&gone, &n);
    return n;
}

static void *
renew_thread(void *arg)
{
    tenant_leases_renew(arg, 5000);
    return NULL;
}

START_TEST(test_take_refuse_release)
{
    struct gw_config c;
    redisContext *rc = test_redis_connect(&srv, NULL);
    struct cluster *cl = start(&c, srv.url, "redis_timeout = 1s\n");
    struct tenant_lease *a, *b, *x;
    size_t gone;
    int err;

    test_cluster_wait(cl, 1);
    ck_assert(tenant_shared_wanted(cl, &c, 0));
    ck_assert_int_eq(enter(cl, &c, &a, &err), TENANT_ADMITTED);
    ck_assert_int_eq(enter(cl, &c, &b, &err), TENANT_ADMITTED);
    ck_assert_int_eq(zcard(rc), 2);
    /* At max_inflight: refused, and nothing added or kept. */
    ck_assert_int_eq(enter(cl, &c, &x, &err), TENANT_MAX_INFLIGHT);
    ck_assert_ptr_null(x);
    ck_assert_int_eq(zcard(rc), 2);
    ck_assert_uint_eq(held(&gone), 2);
    ck_assert_uint_eq(gone, 0);
    /* The call's end gives it back at once. */
    tenant_lease_release(cl, a, 1000);
    ck_assert_int_eq(zcard(rc), 1);
    ck_assert_int_eq(enter(cl, &c, &a, &err), TENANT_ADMITTED);
    tenant_lease_release(cl, a, 1000);
    tenant_lease_release(cl, b, 1000);
    ck_assert_int_eq(zcard(rc), 0);
    ck_assert_uint_eq(held(&gone), 0);
    ck_assert_uint_eq(gone, 0);
    redisFree(rc);
    cluster_unref(cl);
    config_release(&c);
}
END_TEST

START_TEST(test_other_gateways_lease_expires)
{
    struct gw_config c;
    redisContext *rc = test_redis_connect(&srv, NULL);
    struct cluster *cl = start(&c, srv.url, "redis_timeout = 1s\n");
    struct tenant_lease *a, *x;
    redisReply *r;
    int64_t deadline;
    int err;

    test_cluster_wait(cl, 1);
    /* A gateway that died holding a lease that runs out in 300 ms. */
    r = redisCommand(rc, "EVAL %s 1 " LEASES, "local t = redis.call('TIME') "
                     "return redis.call('ZADD', KEYS[1], t[1] * 1000000 "
                     "+ t[2] + 300000, 'dead:1')");
    freeReplyObject(r);
    ck_assert_int_eq(enter(cl, &c, &a, &err), TENANT_ADMITTED);
    ck_assert_int_eq(enter(cl, &c, &x, &err), TENANT_MAX_INFLIGHT);
    deadline = gw_now_ms() + 5000;
    while (enter(cl, &c, &x, &err) != TENANT_ADMITTED) {
        ck_assert_msg(gw_now_ms() < deadline, "the dead lease stayed");
        usleep(20000);
    }
    ck_assert_double_eq(score(rc, "dead:1"), -1);
    tenant_lease_release(cl, a, 1000);
    tenant_lease_release(cl, x, 1000);
    ck_assert_int_eq(zcard(rc), 0);
    redisFree(rc);
    cluster_unref(cl);
    config_release(&c);
}
END_TEST

START_TEST(test_renew_and_reconcile)
{
    struct gw_config c;
    redisContext *rc = test_redis_connect(&srv, NULL);
    struct cluster *cl = start(&c, srv.url, "redis_timeout = 1s\n");
    struct tenant_lease *a, *b, *x;
    char before[256], after[256], one[64];
    redisReply *r;
    double s0;
    size_t gone;
    int err;

    test_cluster_wait(cl, 1);
    ck_assert_int_eq(enter(cl, &c, &a, &err), TENANT_ADMITTED);
    ck_assert_int_eq(enter(cl, &c, &b, &err), TENANT_ADMITTED);
    members(rc, before, sizeof(before));
    s0 = score(rc, first(before, one, sizeof(one)));
    usleep(20000);
    /* The beat's renewal: 'lease' (30 s) from now, and no new member. */
    tenant_leases_renew(cl, 1000);
    members(rc, after, sizeof(after));
    ck_assert_str_eq(after, before);
    ck_assert_double_gt(score(rc, first(after, one, sizeof(one))),
                        s0 + 10000);
    r = redisCommand(rc, "PTTL " LEASES);
    ck_assert_int_gt(r->integer, 29000);
    freeReplyObject(r);
    /* Redis lost them all (restarted empty): the calls still open are
     * counted by nobody, so a third would pass... */
    r = redisCommand(rc, "FLUSHALL");
    freeReplyObject(r);
    ck_assert_int_eq(zcard(rc), 0);
    /* ...until the next beat puts back exactly those two. */
    tenant_leases_renew(cl, 1000);
    members(rc, after, sizeof(after));
    ck_assert_str_eq(after, before);
    ck_assert_int_eq(enter(cl, &c, &x, &err), TENANT_MAX_INFLIGHT);
    /* Twice is once: a member is its call's. */
    tenant_leases_renew(cl, 1000);
    ck_assert_int_eq(zcard(rc), 2);
    tenant_lease_release(cl, a, 1000);
    tenant_lease_release(cl, b, 1000);
    tenant_leases_renew(cl, 1000);
    ck_assert_int_eq(zcard(rc), 0);
    ck_assert_uint_eq(held(&gone), 0);
    redisFree(rc);
    cluster_unref(cl);
    config_release(&c);
}
END_TEST

START_TEST(test_failed_release_sent_by_the_beat)
{
    struct gw_config c;
    redisContext *rc = test_redis_connect(&srv, NULL);
    struct cluster *cl = start(&c, srv.url, "redis_timeout = 1s\n");
    struct tenant_lease *a, *b;
    size_t gone;
    int err;

    test_cluster_wait(cl, 1);
    ck_assert_int_eq(enter(cl, &c, &a, &err), TENANT_ADMITTED);
    ck_assert_int_eq(enter(cl, &c, &b, &err), TENANT_ADMITTED);
    /* No time left for it (as with Redis gone): kept for the beat, and
     * no longer renewed. */
    tenant_lease_release(cl, a, 0);
    ck_assert_uint_eq(held(&gone), 1);
    ck_assert_uint_eq(gone, 1);
    ck_assert_int_eq(zcard(rc), 2);
    tenant_leases_renew(cl, 1000);
    ck_assert_int_eq(zcard(rc), 1);
    ck_assert_uint_eq(held(&gone), 1);
    ck_assert_uint_eq(gone, 0);
    tenant_lease_release(cl, b, 1000);
    ck_assert_int_eq(zcard(rc), 0);
    redisFree(rc);
    cluster_unref(cl);
    config_release(&c);
}
END_TEST

START_TEST(test_release_during_renewal)
{
    struct gw_config c;
    redisContext *rc = test_redis_connect(&srv, NULL);
    struct cluster *cl = start(&c, srv.url, "redis_timeout = 1s\n");
    struct tenant_lease *a, *b;
    int64_t deadline;
    pthread_t th;
    size_t gone;
    int err;

    test_cluster_wait(cl, 1);
    ck_assert_int_eq(enter(cl, &c, &a, &err), TENANT_ADMITTED);
    ck_assert_int_eq(enter(cl, &c, &b, &err), TENANT_ADMITTED);
    /* The beat's renewal under way (Redis stopped holds it there)... */
    kill(srv.pid, SIGSTOP);
    ck_assert_int_eq(pthread_create(&th, NULL, renew_thread, cl), 0);
    deadline = gw_now_ms() + 5000;
    while (renewing_now() != 2) {
        ck_assert_msg(gw_now_ms() < deadline, "no renewal under way");
        usleep(1000);
    }
    /* ...when a call ends: its release is the beat's, after its ZADD,
     * which would otherwise bring the lease back. */
    tenant_lease_release(cl, a, 1000);
    ck_assert_uint_eq(held(&gone), 2);
    kill(srv.pid, SIGCONT);
    pthread_join(th, NULL);
    ck_assert_int_eq(zcard(rc), 1);
    ck_assert_uint_eq(held(&gone), 1);
    ck_assert_uint_eq(gone, 0);
    tenant_lease_release(cl, b, 1000);
    ck_assert_int_eq(zcard(rc), 0);
    redisFree(rc);
    cluster_unref(cl);
    config_release(&c);
}
END_TEST

START_TEST(test_local_share_then_back)
{
    struct gw_config c;
    redisContext *rc = test_redis_connect(&srv, NULL);
    struct cluster *cl;
    struct tenant_lease *v[3];
    redisReply *r;
    size_t gone;
    int err;

    /* A second gateway, as its heartbeat would list it. */
    r = redisCommand(rc, "SET infergw:{@gateways}:node:other "
                     "{\"node\":\"other\",\"version\":\"1\","
                     "\"generation\":1,\"started_unix_ms\":1} PX 60000");
    freeReplyObject(r);
    r = redisCommand(rc, "ZADD infergw:{@gateways}:members 9e15 other");
    freeReplyObject(r);
    redisFree(rc);
    rc = NULL;
    cl = start(&c, srv.url, "redis_timeout = 200ms\n");
    test_cluster_wait(cl, 2);
    rc = test_redis_connect(&srv, NULL);
    kill(srv.pid, SIGSTOP);
    /* Gone: this gateway's share, max_inflight 2 / 2 gateways = 1. */
    ck_assert_int_eq(enter(cl, &c, &v[0], &err), TENANT_ADMITTED);
    ck_assert_int_eq(enter(cl, &c, &v[1], &err), TENANT_MAX_INFLIGHT);
    ck_assert_int_eq(enter(cl, &c, &v[2], &err), TENANT_MAX_INFLIGHT);
    /* Back, and empty (what the stopped Redis got of the admissions
     * that timed out goes too): the first beat adds the call still
     * open, and removes the refused ones Redis may have added. */
    kill(srv.pid, SIGCONT);
    r = redisCommand(rc, "FLUSHALL");
    freeReplyObject(r);
    test_cluster_wait(cl, 1);
    tenant_leases_renew(cl, 1000);
    ck_assert_int_eq(zcard(rc), 1);
    ck_assert_uint_eq(held(&gone), 1);
    ck_assert_uint_eq(gone, 0);
    tenant_lease_release(cl, v[0], 1000);
    ck_assert_int_eq(zcard(rc), 0);
    redisFree(rc);
    cluster_unref(cl);
    config_release(&c);
}
END_TEST

START_TEST(test_deny)
{
    struct gw_config c;
    struct cluster *cl = start(&c, "unix:/nonexistent/r.sock",
                               "on_error = deny\n");
    struct tenant_lease *a;
    size_t gone;
    int err;

    ck_assert_int_eq(enter(cl, &c, &a, &err), TENANT_NOMEM);
    ck_assert_int_eq(err, GW_EUNAVAIL);
    /* Its lease may have reached Redis: the beat is to remove it. */
    ck_assert_uint_eq(held(&gone), 0);
    ck_assert_uint_eq(gone, 1);
    ck_assert(!tenant_lease_wanted(NULL, &c, 0));
    cluster_unref(cl);
    config_release(&c);
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
tenant_lease_suite(void)
{
    Suite *s = suite_create("tenant_lease");
    TCase *tc = tcase("leases");

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_take_refuse_release);
    tcase_add_test(tc, test_other_gateways_lease_expires);
    tcase_add_test(tc, test_renew_and_reconcile);
    tcase_add_test(tc, test_failed_release_sent_by_the_beat);
    tcase_add_test(tc, test_release_during_renewal);
    tcase_add_test(tc, test_local_share_then_back);
    tcase_add_test(tc, test_deny);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    return test_run(srunner_create(tenant_lease_suite()));
}
