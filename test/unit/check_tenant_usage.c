/* SPDX-License-Identifier: MIT */
/*
 * check_tenant_usage.c - unit tests for gateway/base/tenant_usage.c,
 * usage across the fleet: the batches' accounting (take, a failure, the
 * same batch taken again, the answer), the script's reply reader, and
 * against a real redis-server (redisutil.h) the flush: counts arrive
 * once, a batch Redis applied but whose answer was lost (Redis stopped
 * past the deadline) is not added again, a Redis emptied meanwhile gets
 * it once, and two processes' batches of one tenant both count.
 */
#include <check.h>

#include <signal.h>
#include <stdio.h>
#include <string.h>

#include <hiredis/hiredis.h>

#include "alloc.h"
#include "base/cluster.h"
#include "base/config.h"
#include "base/tenant.h"
#include "base/tenant_impl.h"
#include "redisutil.h"
#include "testutil.h"
#include "util.h"

#define R TENANT_USAGE_REQUESTS
#define P TENANT_USAGE_PROMPT
#define C TENANT_USAGE_COMPLETION
#define S TENANT_USAGE_SAVED

static struct test_redis srv;

/* ---- the accounting ---- */

static void
expect(const uint64_t *got, uint64_t r, uint64_t p, uint64_t c, uint64_t s)
{
    ck_assert_uint_eq(got[R], r);
    ck_assert_uint_eq(got[P], p);
    ck_assert_uint_eq(got[C], c);
    ck_assert_uint_eq(got[S], s);
}

START_TEST(test_take_fail_retake_success)
{
    struct tenant_usage u;
    struct tenant_status st;
    uint64_t out[TENANT_USAGE_FIELDS], seq;
    const uint64_t fleet[TENANT_USAGE_FIELDS] = { 9, 90, 45, 3 };

    memset(&u, 0, sizeof(u));
    ck_assert_int_eq(tenant_usage_take(&u, out, &seq), 0);  /* nothing */
    ck_assert_uint_eq(seq, 0);
    tenant_usage_add(&u, R, 2);
    tenant_usage_add(&u, P, 10);
    tenant_usage_add(&u, S, 4);
    ck_assert_int_eq(tenant_usage_take(&u, out, &seq), 1);
    ck_assert_uint_eq(seq, 1);
    expect(out, 2, 10, 0, 4);
    /* Counted while the batch is on its way: not in it. */
    tenant_usage_add(&u, R, 1);
    tenant_usage_add(&u, C, 7);
    /* No answer: the same batch, the same number, not merged. */
    tenant_usage_done(&u, seq, 0, fleet, 5);
    ck_assert_int_eq(tenant_usage_take(&u, out, &seq), 1);
    ck_assert_uint_eq(seq, 1);
    expect(out, 2, 10, 0, 4);
    /* Taken again before any answer (a second beat): still the same. */
    ck_assert_int_eq(tenant_usage_take(&u, out, &seq), 1);
    ck_assert_uint_eq(seq, 1);
    expect(out, 2, 10, 0, 4);
    tenant_usage_show(&u, 1000, &st);
    expect(st.unsent, 3, 10, 7, 4);
    ck_assert_int_eq(st.cluster_age_ms, -1);        /* never read */
    /* The answer: sent; the fleet's totals kept with their time. */
    tenant_usage_done(&u, seq, 1, fleet, 1000);
    tenant_usage_show(&u, 3000, &st);
    expect(st.usage, 3, 10, 7, 4);
    expect(st.unsent, 1, 0, 7, 0);
    expect(st.cluster, 9, 90, 45, 3);
    ck_assert_int_eq(st.cluster_age_ms, 2);
    /* The next batch: what came since, numbered anew. */
    ck_assert_int_eq(tenant_usage_take(&u, out, &seq), 1);
    ck_assert_uint_eq(seq, 2);
    expect(out, 1, 0, 7, 0);
    tenant_usage_done(&u, seq, 1, fleet, 4000);
    ck_assert_int_eq(tenant_usage_take(&u, out, &seq), 0);
    tenant_usage_show(&u, 4000, &st);
    expect(st.unsent, 0, 0, 0, 0);
}
END_TEST

START_TEST(test_done_of_another_batch)
{
    struct tenant_usage u;
    struct tenant_status st;
    uint64_t out[TENANT_USAGE_FIELDS], seq;
    const uint64_t fleet[TENANT_USAGE_FIELDS] = { 1, 2, 3, 4 };

    memset(&u, 0, sizeof(u));
    tenant_usage_add(&u, R, 5);
    ck_assert_int_eq(tenant_usage_take(&u, out, &seq), 1);
    /* A read's answer, or an older batch's, is not this one's. */
    tenant_usage_done(&u, 0, 1, fleet, 10);
    tenant_usage_done(&u, seq + 1, 1, fleet, 10);
    tenant_usage_show(&u, 10, &st);
    expect(st.unsent, 5, 0, 0, 0);
    expect(st.cluster, 1, 2, 3, 4);
    ck_assert_int_eq(tenant_usage_take(&u, out, &seq), 1);
    ck_assert_uint_eq(seq, 1);
}
END_TEST

/* ---- the reply reader ---- */

static const struct {
    const char *wire;           /* the server's bytes */
    int rc;
    int applied;
    uint64_t v[TENANT_USAGE_FIELDS];
    const char *note;
} replies[] = {
    { "*2\r\n:1\r\n*4\r\n$8\r\nrequests\r\n$1\r\n5\r\n"
      "$17\r\ncompletion_tokens\r\n$1\r\n7\r\n", 0, 1, { 5, 0, 7, 0 },
      "added; fields absent are 0" },
    { "*2\r\n:0\r\n*0\r\n", 0, 0, { 0, 0, 0, 0 },
      "a read of a tenant with no hash yet" },
    { "*2\r\n:2\r\n*6\r\n$13\r\nprompt_tokens\r\n"
      "$19\r\n9223372036854775807\r\n$5\r\nother\r\n$3\r\nxyz\r\n"
      "$12\r\ntokens_saved\r\n$1\r\n3\r\n", 0, 2,
      { 0, UINT64_C(9223372036854775807), 0, 3 },
      "added before; HINCRBY's largest; another field skipped" },
    { "*3\r\n:1\r\n*0\r\n:1\r\n", GW_EPARSE, 0, { 0 },
      "three elements" },
    { "*2\r\n:3\r\n*0\r\n", GW_EPARSE, 0, { 0 }, "no such state" },
    { "*2\r\n$1\r\n1\r\n*0\r\n", GW_EPARSE, 0, { 0 },
      "a state as a string" },
    { "*2\r\n:1\r\n$-1\r\n", GW_EPARSE, 0, { 0 }, "no hash array" },
    { "*2\r\n:1\r\n*1\r\n$8\r\nrequests\r\n", GW_EPARSE, 0, { 0 },
      "a field without its value" },
    { "*2\r\n:1\r\n*2\r\n:1\r\n$1\r\n5\r\n", GW_EPARSE, 0, { 0 },
      "a field name not a string" },
    { "*2\r\n:1\r\n*2\r\n$8\r\nrequests\r\n:5\r\n", GW_EPARSE, 0,
      { 0 }, "an integer total (HGETALL gives strings)" },
    { "*2\r\n:1\r\n*2\r\n$8\r\nrequests\r\n$-1\r\n", GW_EPARSE, 0,
      { 0 }, "a nil total" },
    { "*2\r\n:1\r\n*2\r\n$8\r\nrequests\r\n$2\r\n5a\r\n",
      GW_EPARSE, 0, { 0 }, "not digits" },
    { "*2\r\n:1\r\n*2\r\n$8\r\nrequests\r\n$0\r\n\r\n", GW_EPARSE,
      0, { 0 }, "an empty total" },
    { "*2\r\n:1\r\n*2\r\n$8\r\nrequests\r\n"
      "$20\r\n18446744073709551615\r\n", GW_EPARSE, 0, { 0 },
      "twenty digits" },
    { "-ERR oops\r\n", GW_EPARSE, 0, { 0 }, "an error" },
    { ":1\r\n", GW_EPARSE, 0, { 0 }, "not an array" },
};

START_TEST(test_read)
{
    redisReader *rd = redisReaderCreate();
    void *r = NULL;
    uint64_t v[TENANT_USAGE_FIELDS];
    int applied = -1, rc;

    ck_assert_ptr_nonnull(rd);
    ck_assert_int_eq(redisReaderFeed(rd, replies[_i].wire,
                                     strlen(replies[_i].wire)), REDIS_OK);
    ck_assert_int_eq(redisReaderGetReply(rd, &r), REDIS_OK);
    ck_assert_ptr_nonnull(r);
    rc = tenant_usage_read(r, &applied, v);
    ck_assert_msg(rc == replies[_i].rc, "%s: rc %d", replies[_i].note, rc);
    if (rc == 0) {
        ck_assert_int_eq(applied, replies[_i].applied);
        for (size_t f = 0; f < TENANT_USAGE_FIELDS; f++)
            ck_assert_msg(v[f] == replies[_i].v[f], "%s: field %zu",
                          replies[_i].note, f);
    }
    freeReplyObject(r);
    redisReaderFree(rd);
}
END_TEST

/* ---- against Redis ---- */

static struct gw_config cfg;        /* no [tenant]: every one "default" */

/* A cluster on the test's Redis; its beat flushes 'ts' (NULL: not). */
static struct cluster *
start_flushing(struct tenants *ts)
{
    char text[512], err[256];
    struct cluster_self self = { 1, 1700000000000,
                                 ts != NULL ? tenants_usage_flush : NULL,
                                 ts };
    struct gw_config c;
    struct cluster *cl;

    snprintf(text, sizeof(text), "[server]\nlisten = 127.0.0.1:0\n"
             "[cluster]\nredis = %s\nlease = 1s\nredis_connections = 2\n",
             srv.url);
    ck_assert_msg(config_load_text("g.conf", text, &c, err, sizeof(err))
                  == 0, "%s", err);
    cl = cluster_start(&c, &self);
    config_release(&c);
    ck_assert_ptr_nonnull(cl);
    return cl;
}

static struct cluster *
start(void)
{
    return start_flushing(NULL);
}

/* One answered request of 'prompt' + 'completion' tokens. */
static void
serve(struct tenants *ts, uint64_t prompt, uint64_t completion)
{
    struct tenant_entry *e = NULL;
    int wait;

    ck_assert_int_eq(tenants_enter(ts, &cfg, CONFIG_MAX_TENANTS,
                                   gw_now_us(), gw_wall_s(), &e, &wait,
                                   NULL), TENANT_ADMITTED);
    tenants_bill(ts, e, "m", prompt, completion, 0);
    tenants_leave(ts, e);
    tenants_count_request(ts, &cfg, CONFIG_MAX_TENANTS, 200);
}

/* The "default" tenant's status (there is one). */
static struct tenant_status
status_of(struct tenants *ts)
{
    struct tenant_status *v, out;
    size_t n;

    ck_assert_int_eq(tenants_status(ts, &cfg, gw_now_us(), gw_wall_s(),
                                    &v, &n), 0);
    ck_assert_uint_eq(n, 1);
    out = v[0];
    gw_free(v);
    return out;
}

/* A field of the hash in Redis, read from outside (-1: none). */
static long long
in_redis(const char *field)
{
    redisContext *c = test_redis_connect(&srv, NULL);
    redisReply *r = redisCommand(c, "HGET infergw:{default}:usage %s",
                                 field);
    long long v = -1;

    ck_assert_ptr_nonnull(r);
    if (r->type == REDIS_REPLY_STRING)
        v = strtoll(r->str, NULL, 10);
    freeReplyObject(r);
    redisFree(c);
    return v;
}

/* Flush until nothing is unsent (a connection may be refilling). */
static void
flush_all(struct tenants *ts, struct cluster *cl)
{
    int64_t deadline = gw_now_ms() + 8000;

    for (;;) {
        struct tenant_status st;

        tenants_usage_flush(ts, cl, 500);
        st = status_of(ts);
        if (st.unsent[R] == 0 && st.unsent[P] == 0 && st.unsent[C] == 0
            && st.cluster_age_ms >= 0)
            return;
        ck_assert_msg(gw_now_ms() < deadline, "never flushed");
        usleep(10000);
    }
}

static void
wait_in_redis(const char *field, long long want)
{
    int64_t deadline = gw_now_ms() + 8000;

    while (in_redis(field) != want) {
        ck_assert_msg(gw_now_ms() < deadline, "%s never %lld (%lld)", field,
                      want, in_redis(field));
        usleep(10000);
    }
}

START_TEST(test_flush_adds_once)
{
    struct tenants *ts = tenants_new();
    struct cluster *cl = start();
    struct tenant_status st;

    serve(ts, 10, 5);
    serve(ts, 1, 2);
    flush_all(ts, cl);
    ck_assert_int_eq(in_redis("requests"), 2);
    ck_assert_int_eq(in_redis("prompt_tokens"), 11);
    ck_assert_int_eq(in_redis("completion_tokens"), 7);
    st = status_of(ts);
    expect(st.cluster, 2, 11, 7, 0);
    /* Nothing new: a read, nothing added. */
    tenants_usage_flush(ts, cl, 500);
    ck_assert_int_eq(in_redis("requests"), 2);
    serve(ts, 100, 0);
    flush_all(ts, cl);
    ck_assert_int_eq(in_redis("requests"), 3);
    ck_assert_int_eq(in_redis("prompt_tokens"), 111);
    cluster_unref(cl);
    tenants_free(ts);
}
END_TEST

/*
 * One request of 10 + 5 tokens in Redis, then a batch of one of 20 that
 * Redis applies but whose answer is lost: the round trip times out with
 * Redis stopped, which runs it when it goes on.
 */
static void
lose_an_answer(struct tenants *ts, struct cluster *cl)
{
    serve(ts, 10, 5);
    flush_all(ts, cl);
    serve(ts, 20, 0);
    kill(srv.pid, SIGSTOP);
    tenants_usage_flush(ts, cl, 100);
    ck_assert_uint_eq(status_of(ts).unsent[R], 1);  /* no answer */
    kill(srv.pid, SIGCONT);
    wait_in_redis("prompt_tokens", 30);             /* it was applied */
}

/* The lost answer's batch is sent again, and not added twice. */
START_TEST(test_lost_answer_not_added_twice)
{
    struct tenants *ts = tenants_new();
    struct cluster *cl = start();
    struct tenant_status st;

    lose_an_answer(ts, cl);
    serve(ts, 300, 0);                              /* and one more */
    /* The same batch ("added before"), then the one more. */
    flush_all(ts, cl);
    ck_assert_int_eq(in_redis("requests"), 3);
    ck_assert_int_eq(in_redis("prompt_tokens"), 330);
    st = status_of(ts);
    expect(st.cluster, 3, 330, 5, 0);
    cluster_unref(cl);
    tenants_free(ts);
}
END_TEST

/* Redis lost everything (restarted empty) with a batch unanswered: the
 * batch is added to the new totals, once. */
START_TEST(test_emptied_redis_gets_batch_once)
{
    struct tenants *ts = tenants_new();
    struct cluster *cl = start();
    redisContext *c;

    lose_an_answer(ts, cl);
    c = test_redis_connect(&srv, NULL);
    freeReplyObject(redisCommand(c, "FLUSHALL"));
    redisFree(c);
    flush_all(ts, cl);
    ck_assert_int_eq(in_redis("requests"), 1);
    ck_assert_int_eq(in_redis("prompt_tokens"), 20);
    flush_all(ts, cl);
    ck_assert_int_eq(in_redis("prompt_tokens"), 20);
    cluster_unref(cl);
    tenants_free(ts);
}
END_TEST

/* Two gateways' batches number alike (1, 2, ...): both count. */
START_TEST(test_two_processes_both_count)
{
    struct tenants *a = tenants_new(), *b = tenants_new();
    struct cluster *cl = start();

    serve(a, 1, 1);
    serve(b, 2, 2);
    flush_all(a, cl);
    flush_all(b, cl);
    ck_assert_int_eq(in_redis("requests"), 2);
    ck_assert_int_eq(in_redis("prompt_tokens"), 3);
    flush_all(a, cl);           /* a reads b's too */
    ck_assert_uint_eq(status_of(a).cluster[P], 3);
    cluster_unref(cl);
    tenants_free(a);
    tenants_free(b);
}
END_TEST

/* The beat flushes by itself, while requests count (TSan's case). */
START_TEST(test_the_beat_flushes)
{
    struct tenants *ts = tenants_new();
    struct cluster *cl = start_flushing(ts);
    int64_t deadline = gw_now_ms() + 8000;
    struct tenant_status st;

    for (int i = 0; i < 200; i++)
        serve(ts, 1, 2);
    for (;;) {
        st = status_of(ts);
        if (st.cluster_age_ms >= 0 && st.cluster[R] == 200)
            break;
        ck_assert_msg(gw_now_ms() < deadline, "the beat never flushed");
        usleep(10000);
    }
    expect(st.cluster, 200, 200, 400, 0);
    expect(st.unsent, 0, 0, 0, 0);
    ck_assert_int_eq(in_redis("completion_tokens"), 400);
    cluster_unref(cl);          /* joins the beat */
    tenants_free(ts);
}
END_TEST

static void
setup(void)
{
    char err[256];

    test_redis_start(&srv, NULL);
    ck_assert_msg(config_load_text("t.conf", "[server]\nlisten = "
                                   "127.0.0.1:0\n", &cfg, err, sizeof(err))
                  == 0, "%s", err);
}

static void
teardown(void)
{
    config_release(&cfg);
    test_redis_kill(&srv);
}

static Suite *
tenant_usage_suite(void)
{
    Suite *s = suite_create("tenant_usage");
    TCase *tc;

    tc = tcase("accounting");
    tcase_add_test(tc, test_take_fail_retake_success);
    tcase_add_test(tc, test_done_of_another_batch);
    suite_add_tcase(s, tc);

    tc = tcase("read");
    tcase_add_loop_test(tc, test_read, 0,
                        (int)(sizeof(replies) / sizeof(replies[0])));
    suite_add_tcase(s, tc);

    tc = tcase("redis");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_flush_adds_once);
    tcase_add_test(tc, test_lost_answer_not_added_twice);
    tcase_add_test(tc, test_emptied_redis_gets_batch_once);
    tcase_add_test(tc, test_two_processes_both_count);
    tcase_add_test(tc, test_the_beat_flushes);
    suite_add_tcase(s, tc);

    return s;
}

int
main(void)
{
    return test_run(srunner_create(tenant_usage_suite()));
}
