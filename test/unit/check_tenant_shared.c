/* SPDX-License-Identifier: MIT */
/*
 * check_tenant_shared.c - unit tests for gateway/base/tenant_shared.c
 * (tenant.h, "Shared limits"): the script's arithmetic run on a real
 * redis-server (redisutil.h) at times the test chooses, the reading of
 * its answer, and tenant_shared_enter() through a cluster: Redis's
 * verdict, the local share with Redis gone, and on_error = deny.
 */
#include <check.h>

#include <stdio.h>
#include <string.h>

#include <hiredis/hiredis.h>

#include "base/cluster.h"
#include "base/config.h"
#include "base/tenant.h"
#include "base/tenant_impl.h"
#include "redisutil.h"
#include "testutil.h"
#include "util.h"

/* The test's time, now (Redis expires the budgets' keys by its own
 * clock), and the ends of its day and month, in seconds (setup()). */
static int64_t T0, DAY_END, MONTH_END;

static struct test_redis srv;

struct answer {
    long long v[8];
};

/*
 * Run the script as the gateway would, at 'now_us', for 'op' with the
 * limits given and 'day_end' the gateway's day's end.
 */
static struct answer
run(redisContext *c, const char *op, int64_t now_us, long long rpm,
    long long tpm, long long tpd, long long tokens, int64_t day_end)
{
    char now[24], a[6][24];
    const char *argv[15];
    struct answer out;
    redisReply *r;

    snprintf(now, sizeof(now), "%lld", (long long)now_us);
    snprintf(a[0], sizeof(a[0]), "%lld", rpm);
    snprintf(a[1], sizeof(a[1]), "%lld", tpm);
    snprintf(a[2], sizeof(a[2]), "%lld", tpd);
    snprintf(a[3], sizeof(a[3]), "%lld", (long long)day_end);
    snprintf(a[4], sizeof(a[4]), "%lld", (long long)MONTH_END);
    snprintf(a[5], sizeof(a[5]), "%lld", tokens);
    argv[0] = "EVAL";
    argv[1] = tenant_shared_src;
    argv[2] = "2";
    argv[3] = "p:{t}:rate";
    argv[4] = "p:{t}:periods";
    argv[5] = op;
    argv[6] = now;
    argv[7] = a[0];
    argv[8] = a[1];
    argv[9] = a[2];
    argv[10] = "0";
    argv[11] = a[3];
    argv[12] = a[4];
    argv[13] = a[5];
    argv[14] = "p:{t}:tokens:";
    r = redisCommandArgv(c, 15, argv, NULL);
    ck_assert_ptr_nonnull(r);
    ck_assert_msg(r->type == REDIS_REPLY_ARRAY, "%s",
                  r->type == REDIS_REPLY_ERROR ? r->str : "not an array");
    ck_assert_uint_eq(r->elements, 8);
    for (size_t i = 0; i < 8; i++)
        out.v[i] = r->element[i]->integer;
    freeReplyObject(r);
    return out;
}

#define ADMIT(c, t, rpm, tpm, tpd) \
    run(c, "admit", t, rpm, tpm, tpd, 0, DAY_END)
#define CHARGE(c, t, tpm, tpd, n) \
    run(c, "charge", t, 0, tpm, tpd, n, DAY_END)

START_TEST(test_requests_bucket)
{
    redisContext *c = test_redis_connect(&srv, NULL);
    struct answer a;
    redisReply *r;

    /* A minute's worth at once, then one per second, to the us. */
    for (int i = 0; i < 60; i++) {
        a = ADMIT(c, T0, 60, 0, 0);
        ck_assert_int_eq(a.v[0], 0);
        ck_assert_int_eq(a.v[2], 59 - i);
    }
    a = ADMIT(c, T0, 60, 0, 0);
    ck_assert_int_eq(a.v[0], 1);
    ck_assert_int_eq(a.v[1], 1000000);
    a = ADMIT(c, T0 + 999999, 60, 0, 0);
    ck_assert_int_eq(a.v[0], 1);
    ck_assert_int_eq(a.v[1], 1);
    a = ADMIT(c, T0 + 1000000, 60, 0, 0);
    ck_assert_int_eq(a.v[0], 0);
    ck_assert_int_eq(a.v[3], 60000000);         /* empty: a minute */
    /* A clock that goes back refills nothing. */
    a = ADMIT(c, T0, 60, 0, 0);
    ck_assert_int_eq(a.v[0], 1);
    /* The hash expires once full again (a minute), not never. */
    r = redisCommand(c, "PTTL p:{t}:rate");
    ck_assert(r->integer > 60000 && r->integer <= 61000);
    freeReplyObject(r);
    redisFree(c);
}
END_TEST

START_TEST(test_tokens_debt)
{
    redisContext *c = test_redis_connect(&srv, NULL);
    struct answer a;
    redisReply *r;

    a = ADMIT(c, T0, 0, 100, 0);
    ck_assert_int_eq(a.v[0], 0);
    ck_assert_int_eq(a.v[4], 100);
    /* 250 charged: 150 in debt, admitted again after 151 tokens' refill
     * (a token is 0.6 s at 100 per minute). */
    a = CHARGE(c, T0, 100, 0, 250);
    ck_assert_int_eq(a.v[4], 0);
    a = ADMIT(c, T0, 0, 100, 0);
    ck_assert_int_eq(a.v[0], 2);
    ck_assert_int_eq(a.v[1], 151 * 600000);
    a = ADMIT(c, T0 + 151 * 600000, 0, 100, 0);
    ck_assert_int_eq(a.v[0], 0);
    /* The debt stops at a day's refill. */
    a = CHARGE(c, T0 + 151 * 600000, 100, 0, 100000000);
    a = ADMIT(c, T0 + 151 * 600000, 0, 100, 0);
    ck_assert_int_eq(a.v[0], 2);
    ck_assert_int_eq(a.v[1], (1440 * 100 + 1) * INT64_C(600000));
    /* A charge only subtracts: a lower limit's higher floor lifts no
     * debt. */
    a = CHARGE(c, T0 + 151 * 600000, 10, 0, 1);
    a = ADMIT(c, T0 + 151 * 600000, 0, 100, 0);
    ck_assert_int_eq(a.v[1], (1440 * 100 + 1) * INT64_C(600000));
    r = redisCommand(c, "PTTL p:{t}:rate");
    ck_assert(r->integer > 86400000);
    freeReplyObject(r);
    redisFree(c);
}
END_TEST

START_TEST(test_budgets_and_waits)
{
    redisContext *c = test_redis_connect(&srv, NULL);
    struct answer a;
    redisReply *r;

    a = CHARGE(c, T0, 0, 1000, 600);
    ck_assert_int_eq(a.v[6], 600);
    ck_assert_int_eq(ADMIT(c, T0, 0, 0, 1000).v[0], 0);
    CHARGE(c, T0, 0, 1000, 500);
    a = ADMIT(c, T0 + 1000000, 0, 0, 1000);
    ck_assert_int_eq(a.v[0], 3);
    ck_assert_int_eq(a.v[1], DAY_END * 1000000 - T0 - 1000000);
    ck_assert_int_eq(a.v[6], 1100);
    /* The counter expires a day after its day. */
    r = redisCommand(c, "EXPIRETIME p:{t}:tokens:day:%lld",
                     (long long)DAY_END);
    ck_assert_int_eq(r->integer, DAY_END + 86400);
    freeReplyObject(r);
    /* A new day (a gateway's clock passed midnight): room again; a
     * gateway still before midnight counts in the new day too. */
    a = run(c, "admit", T0 + 2000000, 0, 0, 1000, 0, DAY_END + 86400);
    ck_assert_int_eq(a.v[0], 0);
    a = run(c, "admit", T0 + 2000000, 0, 0, 1000, 0, DAY_END);
    ck_assert_int_eq(a.v[0], 0);
    ck_assert_int_eq(a.v[6], 0);
    /* Every failing limit's wait, the first one's name: the day is
     * spent (hours) and the requests too (a second). */
    run(c, "charge", T0 + 2000000, 0, 0, 1000, 1000, DAY_END);
    ADMIT(c, T0 + 2000000, 1, 0, 0);
    a = run(c, "admit", T0 + 2000000, 1, 0, 1000, 0, DAY_END);
    ck_assert_int_eq(a.v[0], 3);
    ck_assert_int_eq(a.v[1], (DAY_END + 86400) * 1000000 - T0 - 2000000);
    /* ... and a refusal took nothing: the requests' bucket is as it was
     * (empty: admitted 60 s later, not 120). */
    ck_assert_int_eq(ADMIT(c, T0 + 2000000 + 60000000, 1, 0, 0).v[0], 0);
    redisFree(c);
}
END_TEST

/* ---- the answer ---- */

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

static const struct {
    const char *resp;
    int rc;
    int verdict;
    const char *note;
} read_cases[] = {
    { "*8\r\n:0\r\n:0\r\n:5\r\n:7\r\n:0\r\n:0\r\n:1\r\n:2\r\n", 0,
      TENANT_ADMITTED, "admitted" },
    { "*8\r\n:4\r\n:9\r\n:0\r\n:0\r\n:0\r\n:0\r\n:1\r\n:2\r\n", 0,
      TENANT_QUOTA_MONTH, "the month spent" },
    { "*8\r\n:5\r\n:9\r\n:0\r\n:0\r\n:0\r\n:0\r\n:1\r\n:2\r\n", 0,
      TENANT_MAX_INFLIGHT, "max_inflight (a lease)" },
    { "*8\r\n:6\r\n:9\r\n:0\r\n:0\r\n:0\r\n:0\r\n:1\r\n:2\r\n", GW_EPARSE,
      0, "no such verdict" },
    { "*8\r\n:1\r\n:-1\r\n:0\r\n:0\r\n:0\r\n:0\r\n:1\r\n:2\r\n", GW_EPARSE,
      0, "a negative wait" },
    { "*7\r\n:0\r\n:0\r\n:0\r\n:0\r\n:0\r\n:0\r\n:1\r\n", GW_EPARSE, 0,
      "seven" },
    { "*8\r\n:0\r\n:0\r\n$1\r\n5\r\n:0\r\n:0\r\n:0\r\n:1\r\n:2\r\n",
      GW_EPARSE, 0, "a string" },
    { "-NOSCRIPT x\r\n", GW_EPARSE, 0, "an error" },
    { ":1\r\n", GW_EPARSE, 0, "an integer" },
};

START_TEST(test_read)
{
    struct tenant_shared_answer a;
    redisReply *r = reply_of(read_cases[_i].resp);

    ck_assert_msg(tenant_shared_read(r, &a) == read_cases[_i].rc, "%s",
                  read_cases[_i].note);
    if (read_cases[_i].rc == 0) {
        ck_assert_int_eq(a.verdict, read_cases[_i].verdict);
        ck_assert_uint_eq(a.used[1], 2);
    }
    freeReplyObject(r);
}
END_TEST

/* ---- through a cluster ---- */

static struct cluster *
start(struct gw_config *c, const char *url, const char *more)
{
    char text[512];

    snprintf(text, sizeof(text), "%s\n[tenant acme]\napi_key = "
             "sk-acme-0123456789\nrequests_per_minute = 10\n", more);
    return test_cluster_start(c, url, text);
}

/* How many of 'tries' admissions at 'now_us' pass. */
static int
admitted(struct cluster *cl, struct gw_config *c, int tries, int64_t now_us,
         int *rc)
{
    enum tenant_limit v;
    int n = 0, wait;
    int64_t left;

    for (int i = 0; i < tries; i++) {
        *rc = tenant_shared_enter(cl, c, 0, now_us, now_us / 1000000, NULL,
                                  &v, &wait, NULL, &left);
        if (*rc == 0 && v == TENANT_ADMITTED)
            n++;
        else if (*rc == 0)
            ck_assert_int_ge(wait, 1);
    }
    return n;
}

START_TEST(test_enter_and_local_share)
{
    struct gw_config c;
    redisContext *rc = test_redis_connect(&srv, NULL);
    struct cluster *cl;
    redisReply *r;
    int err;

    /* A second gateway, as its heartbeat would list it. */
    r = redisCommand(rc, "SET infergw:{@gateways}:node:other "
                     "{\"node\":\"other\",\"version\":\"1\","
                     "\"generation\":1,\"started_unix_ms\":1} PX 60000");
    freeReplyObject(r);
    r = redisCommand(rc, "ZADD infergw:{@gateways}:members 9e15 other");
    freeReplyObject(r);
    cl = start(&c, srv.url, "");
    ck_assert(tenant_shared_wanted(cl, &c, 0));
    ck_assert(!tenant_shared_wanted(NULL, &c, 0));
    test_cluster_wait(cl, 2);
    /* Redis judges: 10 a minute for the two. */
    ck_assert_int_eq(admitted(cl, &c, 3, gw_now_us(), &err), 3);
    ck_assert_int_eq(err, 0);
    r = redisCommand(rc, "HGET infergw:{acme}:rate rc");
    ck_assert_int_eq(r->type, REDIS_REPLY_STRING);
    /* 7 tokens left, and the refill since (well under one). */
    ck_assert_int_ge(atoll(r->str), 7 * INT64_C(60000000));
    ck_assert_int_lt(atoll(r->str), 8 * INT64_C(60000000));
    freeReplyObject(r);
    redisFree(rc);
    test_redis_kill(&srv);
    /* Gone: the local share, 10 / 2 a minute, which followed Redis's
     * three admissions: 2 left. */
    ck_assert_int_eq(admitted(cl, &c, 8, gw_now_us(), &err), 2);
    ck_assert_int_eq(err, 0);
    cluster_unref(cl);
    config_release(&c);
}
END_TEST

START_TEST(test_deny)
{
    struct gw_config c;
    struct cluster *cl = start(&c, "unix:/nonexistent/r.sock",
                               "on_error = deny\n");
    enum tenant_limit v;
    int wait;
    int64_t left, t0 = gw_now_ms();

    ck_assert_int_eq(tenant_shared_enter(cl, &c, 0, gw_now_us(), 0, NULL,
                                         &v, &wait, NULL, &left),
                     GW_EUNAVAIL);
    ck_assert_int_eq(wait, 1);
    ck_assert_int_lt(gw_now_ms() - t0, 20);     /* at once */
    cluster_unref(cl);
    config_release(&c);
}
END_TEST

START_TEST(test_local_share_alone)
{
    struct gw_config c;
    struct cluster *cl = start(&c, "unix:/nonexistent/r.sock", "");
    int err;
    int64_t now = gw_now_us();

    /* One gateway seen: the whole limit, then a token per 6 s. */
    ck_assert_int_eq(admitted(cl, &c, 12, now, &err), 10);
    ck_assert_int_eq(admitted(cl, &c, 2, now + 6000000, &err), 1);
    cluster_unref(cl);
    config_release(&c);
}
END_TEST

static void
setup(void)
{
    T0 = gw_wall_ms() * 1000;
    DAY_END = tenant_period_end_s(TENANT_DAY, T0 / 1000000);
    MONTH_END = tenant_period_end_s(TENANT_MONTH, T0 / 1000000);
    test_redis_start(&srv, NULL);
}

static void
teardown(void)
{
    test_redis_kill(&srv);
}

static Suite *
tenant_shared_suite(void)
{
    Suite *s = suite_create("tenant_shared");
    TCase *tc;

    tc = tcase("script");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_requests_bucket);
    tcase_add_test(tc, test_tokens_debt);
    tcase_add_test(tc, test_budgets_and_waits);
    suite_add_tcase(s, tc);

    tc = tcase("read");
    tcase_add_loop_test(tc, test_read, 0, GW_ARRAY_LEN(read_cases));
    suite_add_tcase(s, tc);

    tc = tcase("enter");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_enter_and_local_share);
    tcase_add_test(tc, test_deny);
    tcase_add_test(tc, test_local_share_alone);
    suite_add_tcase(s, tc);

    return s;
}

int
main(void)
{
    return test_run(srunner_create(tenant_shared_suite()));
}
