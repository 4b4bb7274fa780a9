/* SPDX-License-Identifier: MIT */
/*
 * check_dispatch.c - dispatch.c's decisions over a scripted upstream: what
 * is retried and where, what the retry budget stops, a hedge, poison,
 * and the pool's refusals, in milliseconds.
 *
 * upstream_perform() and upstream_retryable_status() are defined here and
 * the rest comes from the unit-test archive (Makefile: check_dispatch),
 * so upstream.o is never linked: each attempt's outcome is the script's
 * next line, and the real pool (gateway/fleet/pool*.c) chooses and
 * judges.
 */
#include <check.h>
#include <string.h>

#include "base/config.h"
#include "fleet/dispatch.h"
#include "fleet/pool.h"
#include "upstream/upstream.h"
#include "testutil.h"
#include "util.h"

/* One scripted attempt. */
struct step {
    enum call_kind kind;        /* CALL_NOT_RESENT: what a refused resend
                                   ends as (upstream.c) */
    int status;
    int head_seen;
    int hedge;                  /* ask for a hedge first; it loses */
    int resend;                 /* then ask to send it again on a fresh
                                   connection (on_resend) */
};

static struct {
    const struct step *steps;
    size_t n, next;
    size_t idx[8];              /* the upstream of each attempt */
    size_t hedged[8];           /* the hedge's upstream, or SIZE_MAX */
    int stop_on_retryable[8];
    int resend_rc[8];           /* on_resend's answer; 1 not asked */
    int stop_after_resend[8];   /* stop_on_retryable after it */
} up;

static struct gw_config cfg;
static struct pool *pool;

/* dispatch_ctx.on_upstream's calls: the names, in order. */
static struct {
    const char *name[8];
    size_t n;
} noted;

static void
note_upstream(void *arg, const char *name)
{
    (void)arg;
    ck_assert_uint_lt(noted.n, 8);
    noted.name[noted.n++] = name;
}

int
upstream_retryable_status(int status)
{
    return status == 429 || status == 502 || status == 503 || status == 504;
}

int
upstream_perform(struct upstream *u, size_t idx,
                 const struct upstream_request *req,
                 const struct upstream_opts *opts,
                 const struct upstream_sink *sink,
                 struct upstream_result *res)
{
    size_t i = up.next++, h;
    const struct step *s;

    (void)u;
    (void)req;
    (void)sink;
    ck_assert_uint_lt(i, up.n);
    s = &up.steps[i];
    up.idx[i] = idx;
    up.hedged[i] = SIZE_MAX;
    up.stop_on_retryable[i] = opts->stop_on_retryable;
    if (s->hedge && opts->hedge(opts->arg, idx, &h) == 0) {
        struct upstream_result lost = { call_outcome_make(CALL_LOST_HEDGE),
                                        0, 0, -1, -1, h };

        up.hedged[i] = h;
        opts->attempt_done(opts->arg, &lost);
    }
    up.resend_rc[i] = 1;
    if (s->resend) {
        up.resend_rc[i] = opts->on_resend(opts->arg, idx);
        up.stop_after_resend[i] = opts->stop_on_retryable;
    }
    memset(res, 0, sizeof(*res));
    res->outcome = call_outcome_make(s->kind);
    res->outcome.status = s->status;
    res->head_seen = s->head_seen;
    res->ttfb_us = -1;
    res->upstream = idx;
    return call_kind_rc(s->kind);
}

/* 'n' upstreams u0.. serving model "m", with [routing] 'routing'. */
static void
make(int n, const char *routing)
{
    char text[2048], err[256];
    int len;

    len = snprintf(text, sizeof(text), "[routing]\nhealth_interval = 0\n%s",
                   routing);
    for (int i = 0; i < n; i++)
        len += snprintf(text + len, sizeof(text) - (size_t)len,
                        "[upstream u%d]\nurl = http://127.0.0.1:%d\n"
                        "models = m\n", i, 9000 + i);
    ck_assert_msg(config_load_text("t.conf", text, &cfg, err,
                                   sizeof(err)) == 0, "%s", err);
    pool = pool_new(&cfg);
    ck_assert_ptr_nonnull(pool);
}

static void
teardown(void)
{
    pool_free(pool);
    pool = NULL;
    config_release(&cfg);
    memset(&up, 0, sizeof(up));
}

/* Run one call for model 'model' over the script. */
static int
run(const struct step *steps, size_t n, const char *model,
    struct dispatch_result *out)
{
    struct dispatch_ctx dc = { &cfg, pool, NULL, -1, note_upstream, NULL,
                               NULL };
    struct upstream_request req = { "POST", "/v1/completions", "{}", 2,
                                    "id", NULL, NULL };
    struct upstream_sink sink = { NULL, NULL, NULL, NULL, NULL };

    up.steps = steps;
    up.n = n;
    up.next = 0;
    noted.n = 0;
    return dispatch_call(&dc, &req, model, NULL, 0, CONFIG_MAX_TENANTS, &sink,
                         -1, out);
}

START_TEST(test_connect_failure_retried_elsewhere)
{
    static const struct step s[] = { { CALL_CONNECT, 0, 0, 0, 0 },
                                     { CALL_OK, 200, 1, 0, 0 } };
    struct dispatch_result out;

    struct pool_upstream_status st[2];

    make(2, "");
    ck_assert_int_eq(run(s, 2, "m", &out), 0);
    ck_assert_int_eq(out.attempts, 2);
    ck_assert_uint_ne(up.idx[0], up.idx[1]);
    ck_assert_int_eq(out.res.outcome.kind, CALL_OK);
    /* The status view follows the call: first one upstream, then the
     * one the retry went to, which counts it. */
    ck_assert_uint_eq(noted.n, 2);
    ck_assert_str_eq(noted.name[0], cfg.upstreams[up.idx[0]].name);
    ck_assert_str_eq(noted.name[1], cfg.upstreams[up.idx[1]].name);
    ck_assert_uint_eq(pool_status(pool, st, 2), 2);
    ck_assert_uint_eq(st[up.idx[1]].retries, 1);
    ck_assert_uint_eq(st[up.idx[0]].retries, 0);
}
END_TEST

START_TEST(test_no_retry_after_a_byte_reached_the_client)
{
    static const struct step s[] = { { CALL_BROKEN, 200, 1, 0, 0 } };
    struct dispatch_result out;

    make(2, "");
    ck_assert_int_eq(run(s, 1, "m", &out), GW_EUPSTREAM);
    ck_assert_int_eq(out.attempts, 1);
    ck_assert_int_eq(out.res.outcome.kind, CALL_BROKEN);
}
END_TEST

START_TEST(test_retries_zero_lets_the_failure_stand)
{
    static const struct step s[] = { { CALL_FIRST_BYTE_TIMEOUT, 0, 0, 0, 0 } };
    struct dispatch_result out;

    make(2, "retries = 0\n");
    ck_assert_int_eq(run(s, 1, "m", &out), GW_ETIMEDOUT);
    ck_assert_int_eq(out.attempts, 1);
    ck_assert_int_eq(out.res.outcome.kind, CALL_FIRST_BYTE_TIMEOUT);
    ck_assert_int_eq(up.stop_on_retryable[0], 0);
}
END_TEST

START_TEST(test_retries_bound_the_attempts)
{
    static const struct step s[] = { { CALL_CONNECT, 0, 0, 0, 0 },
                                     { CALL_CONNECT, 0, 0, 0, 0 },
                                     { CALL_CONNECT, 0, 0, 0, 0 } };
    struct dispatch_result out;

    make(4, "retries = 1\n");
    ck_assert_int_eq(run(s, 3, "m", &out), GW_EUPSTREAM);
    ck_assert_int_eq(out.attempts, 2);
}
END_TEST

START_TEST(test_a_spent_budget_stops_the_retry)
{
    static const struct step s[] = { { CALL_CONNECT, 0, 0, 0, 0 },
                                     { CALL_OK, 200, 1, 0, 0 } };
    struct dispatch_result out;

    make(2, "retry_budget = 0%\nretry_budget_min = 0\n");
    ck_assert_int_eq(run(s, 2, "m", &out), GW_EUPSTREAM);
    ck_assert_int_eq(out.attempts, 1);
    /* With no budget a retryable status is relayed, not stopped at. */
    ck_assert_int_eq(up.stop_on_retryable[0], 0);
}
END_TEST

START_TEST(test_unheard_503_is_retried_and_an_alone_one_relayed)
{
    static const struct step s[] = { { CALL_STATUS, 503, 0, 0, 0 },
                                     { CALL_OK, 200, 1, 0, 0 } };
    struct dispatch_result out;

    make(2, "");
    ck_assert_int_eq(run(s, 2, "m", &out), 0);
    ck_assert_int_eq(up.stop_on_retryable[0], 1);
    ck_assert_int_eq(out.attempts, 2);
    teardown();
    /* One upstream: nowhere to retry, so the 503 is not stopped at. */
    make(1, "");
    ck_assert_int_eq(run(s + 1, 1, "m", &out), 0);
    ck_assert_int_eq(up.stop_on_retryable[0], 0);
}
END_TEST

START_TEST(test_the_same_5xx_twice_is_the_requests_fault)
{
    static const struct step s[] = { { CALL_STATUS, 502, 0, 0, 0 },
                                     { CALL_STATUS, 502, 0, 0, 0 } };
    struct dispatch_result out;

    make(2, "");
    ck_assert_int_eq(run(s, 2, "m", &out), GW_EUPSTREAM);
    ck_assert_int_eq(out.attempts, 2);
    ck_assert_int_eq(out.res.outcome.kind, CALL_STATUS);
    ck_assert_int_eq(out.res.outcome.fault, CALL_FAULT_REQUEST);
}
END_TEST

START_TEST(test_different_5xx_stay_the_upstreams)
{
    static const struct step s[] = { { CALL_STATUS, 502, 0, 0, 0 },
                                     { CALL_STATUS, 503, 0, 0, 0 } };
    struct dispatch_result out;

    make(2, "");
    run(s, 2, "m", &out);
    ck_assert_int_eq(out.res.outcome.fault, CALL_FAULT_UPSTREAM);
}
END_TEST

START_TEST(test_a_hedge_goes_to_another_upstream)
{
    static const struct step s[] = { { CALL_OK, 200, 1, 1, 0 } };
    struct dispatch_result out;

    struct pool_upstream_status st[2];

    make(2, "hedge_after = 100ms\n");
    ck_assert_int_eq(run(s, 1, "m", &out), 0);
    ck_assert_uint_ne(up.hedged[0], SIZE_MAX);
    ck_assert_uint_ne(up.hedged[0], up.idx[0]);
    ck_assert_int_eq(out.attempts, 2);
    /* It fired on the hedge's upstream, and lost (no winner here). */
    ck_assert_uint_eq(pool_status(pool, st, 2), 2);
    ck_assert_uint_eq(st[up.hedged[0]].hedges, 1);
    ck_assert_uint_eq(st[up.hedged[0]].hedges_won, 0);
    ck_assert_uint_eq(st[up.idx[0]].hedges, 0);
}
END_TEST

/* ---- 1 + retries: every request an upstream receives ---- */

START_TEST(test_a_resend_is_one_of_the_attempts)
{
    static const struct step s[] = { { CALL_BROKEN, 0, 0, 0, 1 },
                                     { CALL_OK, 200, 1, 0, 0 } };
    struct dispatch_result out;

    /* retries = 1: the first attempt's kept connection failed and it is
     * sent again on a fresh one; that is its one retry, so its failure
     * there is the answer, and the status it might meet is relayed, not
     * stopped at for a retry that cannot come. */
    make(2, "retries = 1\n");
    ck_assert_int_eq(run(s, 2, "m", &out), GW_EUPSTREAM);
    ck_assert_int_eq(up.resend_rc[0], 0);
    ck_assert_int_eq(up.stop_on_retryable[0], 1);
    ck_assert_int_eq(up.stop_after_resend[0], 0);
    ck_assert_int_eq(out.attempts, 2);
    ck_assert_uint_eq(up.next, 1);
    ck_assert_int_eq(out.res.outcome.kind, CALL_BROKEN);
    teardown();

    /* retries = 2: one left after the resend, on the other upstream. */
    make(2, "retries = 2\n");
    ck_assert_int_eq(run(s, 2, "m", &out), 0);
    ck_assert_int_eq(up.resend_rc[0], 0);
    ck_assert_int_eq(up.stop_after_resend[0], 1);
    ck_assert_int_eq(out.attempts, 3);
    ck_assert_uint_eq(up.next, 2);
    ck_assert_uint_ne(up.idx[0], up.idx[1]);
}
END_TEST

START_TEST(test_no_resend_past_the_retries)
{
    static const struct step zero[] = {
        { CALL_NOT_RESENT, 0, 0, 0, 1 } };
    static const struct step one[] = {
        { CALL_CONNECT, 0, 0, 0, 0 }, { CALL_NOT_RESENT, 0, 0, 0, 1 },
        { CALL_OK, 200, 1, 0, 0 } };
    struct pool_upstream_status st[2];
    struct dispatch_result out;

    /* retries = 0: the request may reach an upstream once, so a kept
     * connection's failure is not made good by a resend: a 502, and no
     * verdict on the upstream (the race is not its failure). */
    make(2, "retries = 0\neject_after = 1\n");
    ck_assert_int_eq(run(zero, 1, "m", &out), GW_EUPSTREAM);
    ck_assert_int_ne(up.resend_rc[0], 0);
    ck_assert_int_eq(out.attempts, 1);
    ck_assert_int_eq(out.res.outcome.kind, CALL_NOT_RESENT);
    ck_assert_uint_eq(pool_status(pool, st, 2), 2);
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(st[i].state, POOL_CLOSED);
        for (int k = 0; k < POOL_OUTCOME_COUNT; k++)
            ck_assert_uint_eq(st[i].failures[k], 0);
    }
    teardown();

    /* retries = 1: the retry's kept connection fails; no third send. */
    make(2, "retries = 1\n");
    ck_assert_int_eq(run(one, 3, "m", &out), GW_EUPSTREAM);
    ck_assert_int_eq(up.resend_rc[0], 1);
    ck_assert_int_ne(up.resend_rc[1], 0);
    ck_assert_int_eq(out.attempts, 2);
    ck_assert_uint_eq(up.next, 2);
}
END_TEST

START_TEST(test_no_hedge_past_the_retries)
{
    static const struct step s[] = { { CALL_OK, 200, 1, 1, 0 } };
    struct dispatch_result out;

    /* A hedge is one more request for an upstream: with retries = 0,
     * none. */
    make(2, "retries = 0\nhedge_after = 100ms\n");
    ck_assert_int_eq(run(s, 1, "m", &out), 0);
    ck_assert_uint_eq(up.hedged[0], SIZE_MAX);
    ck_assert_int_eq(out.attempts, 1);
}
END_TEST

START_TEST(test_an_unserved_model_is_refused_before_any_attempt)
{
    struct dispatch_result out;

    make(2, "");
    ck_assert_int_eq(run(NULL, 0, "other", &out), GW_ENOTFOUND);
    ck_assert_int_eq(out.attempts, 0);
    ck_assert_int_eq(out.res.outcome.kind, CALL_NOT_SERVED);
    ck_assert_uint_eq(up.next, 0);
}
END_TEST

/* ---- the prompt's prefix (balance = prefix) ---- */

static uint64_t
prefix_of(const char *text)
{
    json_error_t err;
    json_t *body = json_loads(text, 0, &err);
    uint64_t h;

    ck_assert_ptr_nonnull(body);
    h = dispatch_prefix_hash(body, 256);
    json_decref(body);
    return h;
}

START_TEST(test_prefix_of_each_api)
{
    uint64_t chat = prefix_of("{\"messages\":[{\"role\":\"system\","
                              "\"content\":\"S\"},{\"role\":\"user\","
                              "\"content\":\"U\"}]}");

    /* The Responses API's instructions and input hash as the chat form. */
    ck_assert_uint_eq(prefix_of("{\"instructions\":\"S\",\"input\":\"U\"}"),
                      chat);
    ck_assert_uint_eq(prefix_of("{\"instructions\":\"S\",\"input\":"
                                "[{\"role\":\"user\",\"content\":\"U\"}]}"),
                      chat);
    ck_assert_uint_eq(prefix_of("{\"input\":[{\"role\":\"system\","
                                "\"content\":\"S\"},{\"role\":\"user\","
                                "\"content\":\"U\"}]}"), chat);
    ck_assert_uint_ne(prefix_of("{\"input\":\"a\"}"),
                      prefix_of("{\"input\":\"b\"}"));
    ck_assert_uint_ne(prefix_of("{\"input\":\"a\"}"), 0);
    /* Nothing to hash: 0, any upstream. */
    ck_assert_uint_eq(prefix_of("{\"model\":\"m\"}"), 0);
}
END_TEST

static Suite *
dispatch_suite(void)
{
    Suite *s = suite_create("dispatch");
    TCase *tc = tcase("retry");

    tcase_add_checked_fixture(tc, NULL, teardown);
    tcase_add_test(tc, test_connect_failure_retried_elsewhere);
    tcase_add_test(tc, test_no_retry_after_a_byte_reached_the_client);
    tcase_add_test(tc, test_retries_zero_lets_the_failure_stand);
    tcase_add_test(tc, test_retries_bound_the_attempts);
    tcase_add_test(tc, test_a_spent_budget_stops_the_retry);
    tcase_add_test(tc, test_unheard_503_is_retried_and_an_alone_one_relayed);
    suite_add_tcase(s, tc);

    tc = tcase("poison");
    tcase_add_checked_fixture(tc, NULL, teardown);
    tcase_add_test(tc, test_the_same_5xx_twice_is_the_requests_fault);
    tcase_add_test(tc, test_different_5xx_stay_the_upstreams);
    suite_add_tcase(s, tc);

    tc = tcase("hedge");
    tcase_add_checked_fixture(tc, NULL, teardown);
    tcase_add_test(tc, test_a_hedge_goes_to_another_upstream);
    suite_add_tcase(s, tc);

    tc = tcase("prefix");
    tcase_add_test(tc, test_prefix_of_each_api);
    suite_add_tcase(s, tc);

    tc = tcase("attempts");
    tcase_add_checked_fixture(tc, NULL, teardown);
    tcase_add_test(tc, test_a_resend_is_one_of_the_attempts);
    tcase_add_test(tc, test_no_resend_past_the_retries);
    tcase_add_test(tc, test_no_hedge_past_the_retries);
    suite_add_tcase(s, tc);

    tc = tcase("refusal");
    tcase_add_checked_fixture(tc, NULL, teardown);
    tcase_add_test(tc, test_an_unserved_model_is_refused_before_any_attempt);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    return test_run(srunner_create(dispatch_suite()));
}
