/* SPDX-License-Identifier: MIT */
/*
 * check_prom.c - unit tests for common/prom.c, the Prometheus text
 * exposition format (0.0.4) that /metrics is written in.
 *
 * Each case writes through the API and compares the whole text with the
 * exposition it must be, so a stray or missing byte anywhere fails.
 * What is checked: one HELP and one TYPE line per family, and a family
 * may have no samples; label values escape \ " and newline, HELP text \
 * and newline; a histogram's buckets are cumulative, end in le="+Inf"
 * (the count), then _sum and _count; floats; the first error sticks.
 */
#include <check.h>

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "alloc.h"
#include "buf.h"
#include "prom.h"
#include "util.h"
#include "testutil.h"

static struct buf b;
static struct prom w;

static void
setup(void)
{
    buf_init(&b, 1 << 16);
    prom_init(&w, &b);
}

static void
teardown(void)
{
    alloc_fail_after(0, 0);
    buf_release(&b);
}

/* What was written, and no error on the way. */
static void
assert_text(const char *want)
{
    ck_assert_int_eq(w.rc, 0);
    ck_assert_str_eq(buf_ptr(&b), want);
}

/* ---- families ----------------------------------------------------------- */

START_TEST(test_help_and_type_once_per_family)
{
    const struct prom_label u0 = { "upstream", "u0" };
    const struct prom_label u1 = { "upstream", "u1" };

    prom_family(&w, "x_total", PROM_COUNTER, "Things.");
    prom_uint(&w, NULL, 0, 7);
    prom_family(&w, "x_open", PROM_GAUGE, "Open now.");
    prom_int(&w, &u0, 1, -2);
    prom_int(&w, &u1, 1, 3);
    prom_uint(&w, NULL, 0, 0);
    assert_text("# HELP x_total Things.\n"
                "# TYPE x_total counter\n"
                "x_total 7\n"
                "# HELP x_open Open now.\n"
                "# TYPE x_open gauge\n"
                "x_open{upstream=\"u0\"} -2\n"
                "x_open{upstream=\"u1\"} 3\n"
                "x_open 0\n");
}
END_TEST

START_TEST(test_a_family_with_no_samples)
{
    prom_family(&w, "t_inflight", PROM_GAUGE, "By tenant.");
    prom_family(&w, "h_seconds", PROM_HISTOGRAM, "Latency.");
    assert_text("# HELP t_inflight By tenant.\n"
                "# TYPE t_inflight gauge\n"
                "# HELP h_seconds Latency.\n"
                "# TYPE h_seconds histogram\n");
}
END_TEST

START_TEST(test_integers_whole_range)
{
    prom_family(&w, "n", PROM_GAUGE, "Extremes.");
    prom_uint(&w, NULL, 0, UINT64_MAX);
    prom_int(&w, NULL, 0, INT64_MIN);
    assert_text("# HELP n Extremes.\n# TYPE n gauge\n"
                "n 18446744073709551615\n"
                "n -9223372036854775808\n");
}
END_TEST

/* HELP escapes \ and newline; a " stays as it is there. */
START_TEST(test_help_is_escaped)
{
    prom_family(&w, "e", PROM_COUNTER, "a\\b \"q\"\nnext");
    assert_text("# HELP e a\\\\b \"q\"\\nnext\n# TYPE e counter\n");
}
END_TEST

/* ---- labels ------------------------------------------------------------- */

START_TEST(test_label_values_are_escaped)
{
    const struct prom_label l[] = {
        { "model", "we\\ird \"m\"\nx" },
        { "kind", "" },
        { "tail", "\\" },
    };

    prom_family(&w, "tok_total", PROM_COUNTER, "Tokens.");
    prom_uint(&w, l, GW_ARRAY_LEN(l), 1);
    assert_text("# HELP tok_total Tokens.\n# TYPE tok_total counter\n"
                "tok_total{model=\"we\\\\ird \\\"m\\\"\\nx\",kind=\"\","
                "tail=\"\\\\\"} 1\n");
}
END_TEST

/* ---- histograms --------------------------------------------------------- */

START_TEST(test_histogram_buckets_are_cumulative)
{
    static const double le[] = { 0.005, 0.25, 1, 120 };
    static const uint64_t counts[] = { 2, 0, 3, 1 };
    const struct prom_histogram h = {
        .le = le, .counts = counts, .n = 4, .count = 9, .sum = 1410.514232,
    };
    const struct prom_label route = { "route", "a\"b" };

    prom_family(&w, "d_seconds", PROM_HISTOGRAM, "Latency.");
    prom_histogram(&w, &route, 1, &h);
    assert_text("# HELP d_seconds Latency.\n"
                "# TYPE d_seconds histogram\n"
                "d_seconds_bucket{route=\"a\\\"b\",le=\"0.005\"} 2\n"
                "d_seconds_bucket{route=\"a\\\"b\",le=\"0.25\"} 2\n"
                "d_seconds_bucket{route=\"a\\\"b\",le=\"1\"} 5\n"
                "d_seconds_bucket{route=\"a\\\"b\",le=\"120\"} 6\n"
                "d_seconds_bucket{route=\"a\\\"b\",le=\"+Inf\"} 9\n"
                "d_seconds_sum{route=\"a\\\"b\"} 1410.514232\n"
                "d_seconds_count{route=\"a\\\"b\"} 9\n");
}
END_TEST

/* Without labels: le alone in the braces, _sum and _count bare. */
START_TEST(test_histogram_without_labels)
{
    static const double le[] = { 0.001 };
    static const uint64_t counts[] = { 0 };
    const struct prom_histogram h = {
        .le = le, .counts = counts, .n = 1, .count = 0, .sum = 0,
    };

    prom_family(&w, "h", PROM_HISTOGRAM, "H.");
    prom_histogram(&w, NULL, 0, &h);
    assert_text("# HELP h H.\n# TYPE h histogram\n"
                "h_bucket{le=\"0.001\"} 0\n"
                "h_bucket{le=\"+Inf\"} 0\n"
                "h_sum 0\n"
                "h_count 0\n");
}
END_TEST

/*
 * Floats, seen as bounds and sums: %g, with more digits only where six
 * do not read back as the same double; the infinities and NaN by name.
 */
START_TEST(test_gauge_as_a_float)
{
    const struct prom_label l = { "upstream", "u0" };

    prom_family(&w, "g", PROM_GAUGE, "G.");
    prom_double(&w, &l, 1, 0.42);
    prom_double(&w, NULL, 0, 0.1 + 0.2);
    assert_text("# HELP g G.\n# TYPE g gauge\n"
                "g{upstream=\"u0\"} 0.42\n"
                "g 0.30000000000000004\n");
}
END_TEST

START_TEST(test_floats_shortest_that_reads_back)
{
    static const double le[] = { 1e-6, 0.1 + 0.2, 1e6, 1234567, 30 };
    static const uint64_t counts[] = { 0, 0, 0, 0, 0 };
    struct prom_histogram h = {
        .le = le, .counts = counts, .n = 5, .count = 0, .sum = 2.6e-05,
    };

    prom_family(&w, "f", PROM_HISTOGRAM, "F.");
    prom_histogram(&w, NULL, 0, &h);
    h.n = 0;
    h.sum = INFINITY;
    prom_histogram(&w, NULL, 0, &h);
    h.sum = -INFINITY;
    prom_histogram(&w, NULL, 0, &h);
    h.sum = NAN;
    prom_histogram(&w, NULL, 0, &h);
    assert_text("# HELP f F.\n# TYPE f histogram\n"
                "f_bucket{le=\"1e-06\"} 0\n"
                "f_bucket{le=\"0.30000000000000004\"} 0\n"
                "f_bucket{le=\"1e+06\"} 0\n"
                "f_bucket{le=\"1234567\"} 0\n"
                "f_bucket{le=\"30\"} 0\n"
                "f_bucket{le=\"+Inf\"} 0\nf_sum 2.6e-05\nf_count 0\n"
                "f_bucket{le=\"+Inf\"} 0\nf_sum +Inf\nf_count 0\n"
                "f_bucket{le=\"+Inf\"} 0\nf_sum -Inf\nf_count 0\n"
                "f_bucket{le=\"+Inf\"} 0\nf_sum NaN\nf_count 0\n");
}
END_TEST

/* ---- errors ------------------------------------------------------------- */

/* Past the buffer's limit: GW_ETOOBIG, and nothing more is written. */
START_TEST(test_first_error_sticks_too_big)
{
    size_t len;

    buf_release(&b);
    buf_init(&b, 40);
    prom_family(&w, "c_total", PROM_COUNTER, "A counter.");   /* 49 bytes */
    ck_assert_int_eq(w.rc, GW_ETOOBIG);
    len = buf_len(&b);
    ck_assert_uint_lt(len, 40);
    prom_uint(&w, NULL, 0, 1);
    prom_family(&w, "d", PROM_GAUGE, "D.");
    ck_assert_int_eq(w.rc, GW_ETOOBIG);
    ck_assert_uint_eq(buf_len(&b), len);
}
END_TEST

/* An allocation failure: GW_ENOMEM, kept after allocations work again. */
START_TEST(test_first_error_sticks_nomem)
{
    alloc_fail_after(1, 0);
    prom_family(&w, "c_total", PROM_COUNTER, "A counter.");
    ck_assert_int_eq(alloc_failures(), 1);
    ck_assert_int_eq(w.rc, GW_ENOMEM);
    prom_uint(&w, NULL, 0, 1);
    ck_assert_int_eq(w.rc, GW_ENOMEM);
    ck_assert_uint_eq(buf_len(&b), 0);
}
END_TEST

static Suite *
prom_suite(void)
{
    Suite *s = suite_create("prom");
    TCase *tc = tcase("families");

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_help_and_type_once_per_family);
    tcase_add_test(tc, test_a_family_with_no_samples);
    tcase_add_test(tc, test_integers_whole_range);
    tcase_add_test(tc, test_help_is_escaped);
    suite_add_tcase(s, tc);

    tc = tcase("labels");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_label_values_are_escaped);
    suite_add_tcase(s, tc);

    tc = tcase("histograms");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_histogram_buckets_are_cumulative);
    tcase_add_test(tc, test_histogram_without_labels);
    tcase_add_test(tc, test_floats_shortest_that_reads_back);
    tcase_add_test(tc, test_gauge_as_a_float);
    suite_add_tcase(s, tc);

    tc = tcase("errors");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_first_error_sticks_too_big);
    tcase_add_test(tc, test_first_error_sticks_nomem);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    return test_run(srunner_create(prom_suite()));
}
