/*
 * check_metrics.c - unit tests for gateway/metrics.c's rendering of its
 * own counters.
 *
 * What is checked: a histogram scraped while requests land stays a
 * histogram (every cumulative bucket at most the next, +Inf, which is
 * the count, at least the last finite one), as Prometheus requires.
 */
#include <check.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "config.h"
#include "metrics.h"
#include "testutil.h"

static atomic_int stop;

/* Requests landing in the second bucket, as fast as they come. */
static void *
observer(void *arg)
{
    (void)arg;
    while (!atomic_load(&stop))
        metrics_request(METRICS_ROUTE_CHAT, 200, 2000, 2000);
    return NULL;
}

/*
 * In text, the chat route's buckets of 'family': is each at most the
 * next?  Returns the number of buckets seen (0 none), or -1 at the
 * first that is above the next.
 */
static int
cumulative(const char *text, const char *family)
{
    char prefix[128];
    const char *p = text;
    unsigned long long prev = 0;
    int n = 0;

    snprintf(prefix, sizeof(prefix),
             "%s_bucket{route=\"chat_completions\",le=\"", family);
    while ((p = strstr(p, prefix)) != NULL) {
        const char *v = strchr(p, '}');
        unsigned long long cur;

        ck_assert_ptr_nonnull(v);
        cur = strtoull(v + 2, NULL, 10);
        if (cur < prev)
            return -1;
        prev = cur;
        n++;
        p = v;
    }
    return n;
}

START_TEST(test_histogram_scraped_under_traffic_stays_cumulative)
{
    struct gw_config cfg;
    struct buf out;
    pthread_t t;
    int seen = 0;

    ck_assert_int_eq(config_defaults(&cfg), 0);
    buf_init(&out, 1 << 20);
    atomic_store(&stop, 0);
    ck_assert_int_eq(pthread_create(&t, NULL, observer, NULL), 0);
    for (int i = 0; i < 3000; i++) {
        int n;

        buf_reset(&out);
        ck_assert_int_eq(metrics_render(&out, &cfg), 0);
        ck_assert_int_eq(buf_append(&out, "", 1), 0);
        n = cumulative(buf_ptr(&out), "infergw_request_duration_seconds");
        ck_assert_msg(n != -1, "scrape %d: a bucket above the next (or "
                      "above +Inf, the count)", i);
        n = cumulative(buf_ptr(&out), "infergw_time_to_first_byte_seconds");
        ck_assert_msg(n != -1, "scrape %d: a ttfb bucket above the next",
                      i);
        if (n > 0)
            seen++;
    }
    atomic_store(&stop, 1);
    pthread_join(t, NULL);
    /* The test saw the histogram it checks. */
    ck_assert_int_gt(seen, 0);
    buf_release(&out);
    config_release(&cfg);
}
END_TEST

static Suite *
metrics_suite(void)
{
    Suite *s = suite_create("metrics");
    TCase *tc = tcase("render");

    tcase_add_test(tc, test_histogram_scraped_under_traffic_stays_cumulative);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    return test_run(srunner_create(metrics_suite()));
}
