/* SPDX-License-Identifier: MIT */
/*
 * check_status.c - unit tests for the status view's summary arithmetic
 * (gateway/client/status.c summary_json()).
 *
 * What is checked: the rate over the window's span; the answers by
 * class; calls per request; each saving's share of the calls that
 * would have been made (calls, followers and hits) and of the tokens
 * the clients received; null for a share of nothing; and the cache's
 * row in the followers' shape.
 */
#include <check.h>

#include <jansson.h>
#include <string.h>

#include "client/status.h"
#include "testutil.h"

static double
real_at(const json_t *o, const char *path)
{
    char key[64];
    const char *dot = strchr(path, '.');
    const json_t *v;

    if (dot == NULL) {
        v = json_object_get(o, path);
    } else {
        snprintf(key, sizeof(key), "%.*s", (int)(dot - path), path);
        v = json_object_get(json_object_get(o, key), dot + 1);
    }
    ck_assert_msg(json_is_number(v), "%s is not a number", path);
    return json_number_value(v);
}

START_TEST(test_figures)
{
    struct status_summary s;
    json_t *o;

    memset(&s, 0, sizeof(s));
    s.m.minute_ms = 30000;
    s.m.minute[1] = 40;                 /* 2xx */
    s.m.minute[3] = 15;                 /* 4xx */
    s.m.minute[4] = 5;                  /* 5xx */
    s.m.minute[2] = 30;                 /* 3xx: in the total only */
    s.m.total[1] = 400;
    s.m.total[4] = 7;
    s.m.upstream_calls = 6;
    s.m.proxied = 20;
    s.m.followers = 14;
    s.tokens = 3000;
    s.tokens_saved = 2000;
    o = summary_json(&s);
    ck_assert_ptr_nonnull(o);
    ck_assert_double_eq_tol(real_at(o, "window_s"), 30, 1e-9);
    ck_assert_double_eq_tol(real_at(o, "requests_per_s"), 3, 1e-9);
    ck_assert_double_eq(real_at(o, "last_minute.requests"), 90);
    ck_assert_double_eq(real_at(o, "last_minute.2xx"), 40);
    ck_assert_double_eq(real_at(o, "last_minute.4xx"), 15);
    ck_assert_double_eq(real_at(o, "last_minute.5xx"), 5);
    ck_assert_double_eq(real_at(o, "since_start.requests"), 407);
    ck_assert_double_eq(real_at(o, "since_start.4xx"), 0);
    ck_assert_double_eq_tol(real_at(o, "calls_per_request"), 0.3, 1e-9);
    ck_assert_double_eq(real_at(o, "coalesced.requests"), 14);
    /* 14 of the 20 calls there would have been. */
    ck_assert_double_eq_tol(real_at(o, "coalesced.calls_saved_share"), 0.7,
                            1e-9);
    ck_assert_double_eq(real_at(o, "coalesced.tokens_saved"), 2000);
    ck_assert_double_eq_tol(real_at(o, "coalesced.tokens_saved_share"),
                            2.0 / 3, 1e-9);
    ck_assert(json_is_false(json_object_get(o, "cache_enabled")));
    ck_assert_double_eq(real_at(o, "cache.requests"), 0);
    ck_assert_double_eq(real_at(o, "cache.calls_saved_share"), 0);
    json_decref(o);

    /* With hits, they are a share of the same whole. */
    s.cache_enabled = 1;
    s.cache_hits = 20;
    s.cache_tokens_saved = 600;
    o = summary_json(&s);
    ck_assert(json_is_true(json_object_get(o, "cache_enabled")));
    ck_assert_double_eq_tol(real_at(o, "cache.calls_saved_share"), 0.5,
                            1e-9);
    ck_assert_double_eq_tol(real_at(o, "coalesced.calls_saved_share"),
                            0.35, 1e-9);
    ck_assert_double_eq_tol(real_at(o, "cache.tokens_saved_share"), 0.2,
                            1e-9);
    ck_assert_int_eq(json_object_size(json_object_get(o, "cache")),
                     json_object_size(json_object_get(o, "coalesced")));
    json_decref(o);
}
END_TEST

START_TEST(test_nothing_yet)
{
    struct status_summary s;
    json_t *o, *c;

    memset(&s, 0, sizeof(s));
    s.m.minute_ms = 1000;
    o = summary_json(&s);
    ck_assert_ptr_nonnull(o);
    ck_assert_double_eq(real_at(o, "requests_per_s"), 0);
    ck_assert(json_is_null(json_object_get(o, "calls_per_request")));
    c = json_object_get(o, "coalesced");
    ck_assert(json_is_null(json_object_get(c, "calls_saved_share")));
    ck_assert(json_is_null(json_object_get(c, "tokens_saved_share")));
    json_decref(o);
}
END_TEST

static Suite *
status_suite(void)
{
    Suite *s = suite_create("status");
    TCase *tc = tcase("summary");

    tcase_add_test(tc, test_figures);
    tcase_add_test(tc, test_nothing_yet);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    return test_run(srunner_create(status_suite()));
}
