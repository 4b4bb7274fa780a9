/* SPDX-License-Identifier: MIT */
/*
 * check_upstream_session.c - unit tests for the wait of
 * gateway/upstream/upstream_session.c (the transfers themselves are the
 * integration tests', against real upstreams).
 *
 * What is checked: a wait whose session has no socket and whose libcurl
 * timer is due runs the timer without polling (the caller's descriptors
 * read as quiet although one is ready), never twice in a row (the next
 * wait polls and sees it), and a wait with a timer not yet due polls.
 */
#include <check.h>

#include <poll.h>
#include <unistd.h>

#include <curl/curl.h>

#include "testutil.h"
#include "upstream/upstream_session.h"
#include "util.h"

/* One wait of 's' with a readable pipe as the caller's descriptor:
 * what the wait said of it. */
static short
wait_with_ready_pipe(struct upstream_session *s, int fd)
{
    struct pollfd extra = { .fd = fd, .events = POLLIN };

    ck_assert_int_eq(upstream_session_wait(s, &extra, 1, gw_now_ms() + 2000),
                     CURLM_OK);
    return extra.revents;
}

START_TEST(test_a_due_timer_without_sockets_skips_one_poll)
{
    struct upstream_session_cache *sc;
    struct upstream_session *s;
    int p[2];

    ck_assert_int_eq(curl_global_init(CURL_GLOBAL_DEFAULT), CURLE_OK);
    sc = upstream_session_cache_new(1, 1, 1000);
    ck_assert_ptr_nonnull(sc);
    s = upstream_session_take(sc, 0);
    ck_assert_ptr_nonnull(s);
    ck_assert_int_eq(pipe(p), 0);
    ck_assert_int_eq(write(p[1], "x", 1), 1);
    ck_assert_int_eq(s->nsocks, 0);

    /* Due: run without a poll, so the ready pipe is not seen... */
    s->timer_ms = gw_now_ms();
    ck_assert_int_eq(wait_with_ready_pipe(s, p[0]), 0);
    /* ...but never twice in a row: this one polls. */
    s->timer_ms = gw_now_ms();
    ck_assert(wait_with_ready_pipe(s, p[0]) & POLLIN);
    /* Then it may skip again. */
    s->timer_ms = gw_now_ms();
    ck_assert_int_eq(wait_with_ready_pipe(s, p[0]), 0);
    /* A timer not yet due: a poll, which sees the pipe at once. */
    s->timer_ms = gw_now_ms() + 1000;
    ck_assert(wait_with_ready_pipe(s, p[0]) & POLLIN);

    close(p[0]);
    close(p[1]);
    upstream_session_put(sc, s, 0);
    upstream_session_cache_free(sc);
    curl_global_cleanup();
}
END_TEST

static Suite *
upstream_session_suite(void)
{
    Suite *s = suite_create("upstream_session");
    TCase *tc = tcase("wait");

    tcase_add_test(tc, test_a_due_timer_without_sockets_skips_one_poll);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    return test_run(srunner_create(upstream_session_suite()));
}
