/* SPDX-License-Identifier: MIT */
/*
 * check_window.c - unit tests for common/window.c, the lock-free counts
 * over the last minute.
 *
 * What is checked: counts within a second and across seconds; a second
 * that leaves the window stops counting, and its bucket starts over
 * when the clock comes round to it; an add older than its bucket's
 * second is dropped; the span a rate divides by; and threads adding at
 * once, across second boundaries, lose no count.
 */
#include <check.h>

#include <pthread.h>
#include <stdint.h>

#include "testutil.h"
#include "window.h"

/* A time well past 0, so that no empty word is a second of the window. */
#define T0 ((int64_t)1000000 * 1000)

static struct window w;

static void
fresh(void)
{
    memset(&w, 0, sizeof(w));
    window_start(&w, T0);
}

START_TEST(test_counts_by_class)
{
    uint64_t c[WINDOW_CLASSES];

    fresh();
    window_add(&w, T0, 1);
    window_add(&w, T0 + 999, 1);
    window_add(&w, T0 + 1000, 3);
    window_add(&w, T0 + 30500, 3);
    window_add(&w, T0 + 30500, WINDOW_CLASSES);     /* no such class */
    window_read(&w, T0 + 30600, c);
    ck_assert_uint_eq(c[0], 0);
    ck_assert_uint_eq(c[1], 2);
    ck_assert_uint_eq(c[2], 0);
    ck_assert_uint_eq(c[3], 2);
    ck_assert_uint_eq(c[4], 0);
}
END_TEST

START_TEST(test_seconds_leave_the_window)
{
    uint64_t c[WINDOW_CLASSES];

    fresh();
    window_add(&w, T0, 0);                  /* second 0 */
    window_add(&w, T0 + 5000, 0);           /* second 5 */
    /* Second 59: both still in (0 .. 59). */
    window_read(&w, T0 + 59999, c);
    ck_assert_uint_eq(c[0], 2);
    /* Second 60: the first is out, its bucket not yet reused. */
    window_read(&w, T0 + 60000, c);
    ck_assert_uint_eq(c[0], 1);
    /* Second 60 reuses second 0's bucket: it starts over at 1. */
    window_add(&w, T0 + 60100, 0);
    window_read(&w, T0 + 60200, c);
    ck_assert_uint_eq(c[0], 2);
    /* Long after, nothing is left. */
    window_read(&w, T0 + 3600000, c);
    ck_assert_uint_eq(c[0], 0);
}
END_TEST

START_TEST(test_an_add_older_than_its_bucket_is_dropped)
{
    uint64_t c[WINDOW_CLASSES];

    fresh();
    window_add(&w, T0 + 60000, 2);          /* second 60, bucket 0 */
    window_add(&w, T0, 2);                  /* second 0, same bucket */
    window_read(&w, T0 + 60000, c);
    ck_assert_uint_eq(c[2], 1);
}
END_TEST

START_TEST(test_span)
{
    uint64_t c[WINDOW_CLASSES];

    fresh();
    /* Just started: at least a second. */
    ck_assert_int_eq(window_read(&w, T0 + 10, c), 1000);
    /* Under a minute: the time since the start. */
    ck_assert_int_eq(window_read(&w, T0 + 12345, c), 12345);
    /* Past a minute: 59 whole seconds and this one's part. */
    ck_assert_int_eq(window_read(&w, T0 + 3600250, c), 59250);
    ck_assert_int_eq(window_read(&w, T0 + 3600000, c), 59000);
}
END_TEST

#define THREADS 4
#define ADDS 200000

static _Atomic int64_t clock_ms = T0;

/* Every 16th add moves the shared clock on by 1 ms: the adds cross
 * some fifty second boundaries while others add. */
static void *
adder(void *arg)
{
    size_t cls = (size_t)(uintptr_t)arg;

    for (int i = 0; i < ADDS; i++) {
        int64_t now = atomic_load(&clock_ms);

        if (i % 16 == 0)
            now = atomic_fetch_add(&clock_ms, 1) + 1;
        window_add(&w, now, cls);
    }
    return NULL;
}

START_TEST(test_threads_lose_no_count)
{
    pthread_t t[THREADS];
    uint64_t c[WINDOW_CLASSES], total = 0, want = 0;
    int64_t end;

    fresh();
    atomic_store(&clock_ms, T0);
    for (int i = 0; i < THREADS; i++)
        ck_assert_int_eq(pthread_create(&t[i], NULL, adder,
                                        (void *)(uintptr_t)(i % 2)), 0);
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    end = atomic_load(&clock_ms);
    window_read(&w, end, c);
    total = c[0] + c[1];
    /* The window holds what was added in its last 60 seconds, and the
     * adds span THREADS * ADDS / 16 ms: all of them fit. */
    ck_assert_int_lt(end - T0, 59000);
    want = (uint64_t)THREADS * ADDS;
    ck_assert_uint_eq(total, want);
    ck_assert_uint_eq(c[0], want / 2);
}
END_TEST

static Suite *
window_suite(void)
{
    Suite *s = suite_create("window");
    TCase *tc = tcase("counts");

    tcase_add_test(tc, test_counts_by_class);
    tcase_add_test(tc, test_seconds_leave_the_window);
    tcase_add_test(tc, test_an_add_older_than_its_bucket_is_dropped);
    tcase_add_test(tc, test_span);
    suite_add_tcase(s, tc);
    tc = tcase("threads");
    tcase_add_test(tc, test_threads_lose_no_count);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    return test_run(srunner_create(window_suite()));
}
