/* SPDX-License-Identifier: MIT */
/*
 * check_log.c - unit tests for common/log.c: both line formats, the
 * structured event (the access line's), and that no message or value,
 * however hostile, breaks a JSON line: each one is read back with
 * jansson, which refuses anything but one well-formed object in UTF-8.
 *
 * Lines go to a temporary file (log_set_fd()), read back whole.  Each
 * case runs in its own process (fork mode), so the logger's settings
 * never leak from one to the next.
 */
#include <check.h>
#include <limits.h>

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "util.h"
#include "testutil.h"

static FILE *out;

static void
setup(void)
{
    out = tmpfile();
    ck_assert_ptr_nonnull(out);
    log_set_fd(fileno(out));
    log_set_level(GW_LOG_INFO);
    log_set_request_id("req-1");
}

static void
teardown(void)
{
    fclose(out);
}

/* Everything logged so far (NUL-terminated, at most n - 1 bytes). */
static size_t
logged(char *buf, size_t n)
{
    ssize_t k;

    ck_assert_int_eq(lseek(fileno(out), 0, SEEK_SET), 0);
    k = read(fileno(out), buf, n - 1);
    ck_assert_int_ge(k, 0);
    buf[k] = '\0';
    return (size_t)k;
}

/* Forget what was logged so far. */
static void
clear(void)
{
    ck_assert_int_eq(ftruncate(fileno(out), 0), 0);
    ck_assert_int_eq(lseek(fileno(out), 0, SEEK_SET), 0);
}

/* The one line logged so far, as a JSON object (json_decref it). */
static json_t *
one_json_line(void)
{
    static char buf[16384];
    size_t n = logged(buf, sizeof(buf));
    json_error_t e;
    json_t *j;

    ck_assert_msg(n > 0 && buf[n - 1] == '\n', "a line ends in a newline");
    ck_assert_msg(memchr(buf, '\n', n - 1) == NULL, "one line: %.300s", buf);
    j = json_loadb(buf, n, 0, &e);
    ck_assert_msg(j != NULL, "not JSON (%s): %.300s", e.text, buf);
    ck_assert_msg(json_is_object(j), "not an object: %.300s", buf);
    return j;
}

static const char *
member(const json_t *j, const char *key)
{
    const char *s = json_string_value(json_object_get(j, key));

    ck_assert_msg(s != NULL, "no string \"%s\"", key);
    return s;
}

START_TEST(test_format_parse)
{
    ck_assert_int_eq(log_format_parse("kv"), GW_LOG_FORMAT_KV);
    ck_assert_int_eq(log_format_parse("json"), GW_LOG_FORMAT_JSON);
    ck_assert_int_eq(log_format_parse("JSON"), -1);
    ck_assert_int_eq(log_format_parse(""), -1);
    ck_assert_int_eq(log_format_parse("jsonl"), -1);
}
END_TEST

/*
 * Every kind of byte a message may hold: what JSON must escape, control
 * characters, well-formed UTF-8, and byte strings that are not UTF-8 (a
 * stray byte, an overlong form, a surrogate, a cut sequence), each bad
 * byte read as U+FFFD.
 */
START_TEST(test_json_escapes_everything)
{
    static const char hostile[] =
        "a\"b\\c\nd\te\x01" "f\x7f" " caf\xc3\xa9 \xf0\x9f\x98\x80 "
        "\xff|\xc0\x80|\xed\xa0\x80|\xe2\x82";
    static const char want[] =
        "a\"b\\c\nd\te\x01" "f\x7f" " caf\xc3\xa9 \xf0\x9f\x98\x80 "
        "\xef\xbf\xbd|\xef\xbf\xbd\xef\xbf\xbd|"
        "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd|\xef\xbf\xbd\xef\xbf\xbd";
    json_t *j;

    log_set_format(GW_LOG_FORMAT_JSON);
    log_msg(GW_LOG_WARN, "%s", hostile);
    j = one_json_line();
    ck_assert_str_eq(member(j, "level"), "warn");
    ck_assert_str_eq(member(j, "req"), "req-1");
    ck_assert_int_eq(strlen(member(j, "ts")), 24);  /* ...T..:..:..mmmZ */
    ck_assert_str_eq(member(j, "msg"), want);
    ck_assert_int_eq(json_object_size(j), 4);
    json_decref(j);
}
END_TEST

START_TEST(test_json_errno)
{
    char want[128];
    json_t *j;

    log_set_format(GW_LOG_FORMAT_JSON);
    log_errno(GW_LOG_ERROR, ENOENT, "open %s", "/x");
    j = one_json_line();
    ck_assert_str_eq(member(j, "level"), "error");
    ck_assert_str_eq(member(j, "msg"), "open /x");
    snprintf(want, sizeof(want), "%s", strerror(ENOENT));
    ck_assert_str_eq(member(j, "err"), want);
    json_decref(j);
}
END_TEST

/* Strings, numbers, and absent values as null; the event as "msg". */
START_TEST(test_json_fields)
{
    const struct log_field f[] = {
        log_str("path", "/v1/chat/completions"),
        log_strn("model", "m1-and-more", 2),
        log_str("flight", NULL),
        log_int("status", 429),
        log_int("bytes", 0),
        log_int("neg", -42),
        log_int("min", LLONG_MIN),
        log_int("max", LLONG_MAX),
        log_opt_int("ttft_ms", -1),
        log_opt_int("duration_ms", 12),
        log_str("odd", "q\"\\\n\xff"),
    };
    json_t *j;

    log_set_format(GW_LOG_FORMAT_JSON);
    log_fields(GW_LOG_INFO, "access", f, GW_ARRAY_LEN(f));
    j = one_json_line();
    ck_assert_str_eq(member(j, "msg"), "access");
    ck_assert_str_eq(member(j, "path"), "/v1/chat/completions");
    ck_assert_str_eq(member(j, "model"), "m1");
    ck_assert(json_is_null(json_object_get(j, "flight")));
    ck_assert(json_is_integer(json_object_get(j, "status")));
    ck_assert_int_eq(json_integer_value(json_object_get(j, "status")), 429);
    ck_assert_int_eq(json_integer_value(json_object_get(j, "bytes")), 0);
    ck_assert_int_eq(json_integer_value(json_object_get(j, "neg")), -42);
    ck_assert(json_integer_value(json_object_get(j, "min")) == LLONG_MIN);
    ck_assert(json_integer_value(json_object_get(j, "max")) == LLONG_MAX);
    ck_assert(json_is_null(json_object_get(j, "ttft_ms")));
    ck_assert_int_eq(json_integer_value(json_object_get(j, "duration_ms")),
                     12);
    ck_assert_str_eq(member(j, "odd"), "q\"\\\n\xef\xbf\xbd");
    ck_assert_int_eq(json_object_size(j), 4 + GW_ARRAY_LEN(f));
    json_decref(j);
}
END_TEST

/*
 * A line longer than the buffer is cut and still one object: a message
 * that doubles when escaped, one of two-byte characters (never cut in
 * half), and a huge field before a small one.
 */
START_TEST(test_json_cut_lines_still_parse)
{
    static char big[10000];
    const char *cases[] = { "\"", "\xc3\xa9", "\\\x01" };
    struct log_field f[2] = { log_str("huge", NULL), log_int("n", 7) };
    char line[16384];
    json_t *j;

    log_set_format(GW_LOG_FORMAT_JSON);
    for (size_t c = 0; c < GW_ARRAY_LEN(cases); c++) {
        size_t k = strlen(cases[c]);

        for (size_t i = 0; i + k < sizeof(big); i += k)
            memcpy(big + i, cases[c], k);
        big[sizeof(big) - 1 - (sizeof(big) - 1) % k] = '\0';
        clear();
        log_msg(GW_LOG_INFO, "%s", big);
        ck_assert_uint_le(logged(line, sizeof(line)), 4096);
        j = one_json_line();
        ck_assert_uint_gt(strlen(member(j, "msg")), 1000);
        json_decref(j);

        clear();
        f[0].s = big;
        f[0].len = strlen(big);
        log_fields(GW_LOG_INFO, "access", f, 2);
        ck_assert_uint_le(logged(line, sizeof(line)), 4096);
        j = one_json_line();
        ck_assert_uint_gt(strlen(member(j, "huge")), 1000);
        json_decref(j);
    }
}
END_TEST

/*
 * A field goes in whole or not at all: a first field of every length
 * around the line's end leaves every amount of room for the second.
 */
START_TEST(test_json_field_whole_or_none)
{
    static char big[4200];
    struct log_field f[2] = { log_strn("huge", big, 0),
                              log_int("duration_ms", 1234567) };
    json_t *j, *d;

    memset(big, 'x', sizeof(big));
    log_set_format(GW_LOG_FORMAT_JSON);
    for (f[0].len = 3900; f[0].len < sizeof(big); f[0].len++) {
        clear();
        log_fields(GW_LOG_INFO, "access", f, 2);
        j = one_json_line();
        d = json_object_get(j, "duration_ms");
        ck_assert(d == NULL || json_integer_value(d) == 1234567);
        json_decref(j);
    }
}
END_TEST

START_TEST(test_kv_fields)
{
    const struct log_field f[] = {
        log_str("path", "/v1/x"),
        log_str("model", "a b"),
        log_str("empty", ""),
        log_str("flight", NULL),
        log_int("status", 200),
        log_opt_int("ttft_ms", -1),
        log_opt_int("duration_ms", 0),
        log_str("odd", "q\"\\\n\xff"),
    };
    char buf[4096];
    const char *rest;

    log_fields(GW_LOG_INFO, "access", f, GW_ARRAY_LEN(f));
    logged(buf, sizeof(buf));
    ck_assert_msg(strncmp(buf, "ts=", 3) == 0, "%s", buf);
    rest = strstr(buf, " level=info req=req-1 access ");
    ck_assert_msg(rest != NULL, "%s", buf);
    ck_assert_str_eq(strchr(rest, 'a'),
                     "access path=/v1/x model=\"a b\" empty=\"\" flight=- "
                     "status=200 ttft_ms=- duration_ms=0 "
                     "odd=\"q\\\"\\\\\\x0a\\xff\"\n");
}
END_TEST

/* A kv line too long is cut, and still one line ending in a newline. */
START_TEST(test_kv_cut)
{
    static char big[5000];
    struct log_field f[3] = { log_strn("a", big, sizeof(big)),
                              log_strn("b", big, 10), log_int("n", 7) };
    char buf[8192];
    size_t n;

    memset(big, 'x', sizeof(big));
    big[100] = ' ';             /* quoted from here on */
    for (int k = 0; k < 2; k++) {
        clear();
        log_fields(GW_LOG_INFO, "access", f, 3);
        n = logged(buf, sizeof(buf));
        ck_assert_uint_eq(n, 2048);
        ck_assert_ptr_eq(strchr(buf, '\n'), buf + n - 1);
        big[100] = 'x';         /* bare */
    }
}
END_TEST

/* The kv format's lines are what they always were. */
START_TEST(test_kv_write)
{
    char buf[4096];

    log_errno(GW_LOG_WARN, ENOENT, "open %s\nnext", "/x");
    logged(buf, sizeof(buf));
    ck_assert_msg(strstr(buf, " level=warn req=req-1 open /x next err=\"")
                  != NULL, "%s", buf);
    ck_assert_int_eq(strchr(buf, '\n')[1], '\0');
}
END_TEST

/* Below the level nothing is written, in either format. */
START_TEST(test_level_off)
{
    const struct log_field f[] = { log_int("n", 1) };
    char buf[64];

    log_fields(GW_LOG_DEBUG, "access", f, 1);
    log_set_format(GW_LOG_FORMAT_JSON);
    log_fields(GW_LOG_DEBUG, "access", f, 1);
    log_msg(GW_LOG_DEBUG, "x");
    ck_assert_uint_eq(logged(buf, sizeof(buf)), 0);
}
END_TEST

/* ---- a repeating failure, on a fake clock ---- */

/*
 * The messages logged so far, one per line, each without its "ts=...
 * level=LEVEL req=req-1 " head, into lines[0..max); their number.
 * Every line must be at 'level'.
 */
static size_t
messages(const char *level, char *buf, size_t n, char **lines, size_t max)
{
    size_t k = 0;
    char *p, *nl, *msg, head[32];

    logged(buf, n);
    for (p = buf; *p != '\0' && k < max; p = nl + 1) {
        nl = strchr(p, '\n');
        ck_assert_ptr_nonnull(nl);
        *nl = '\0';
        msg = strstr(p, " req=req-1 ");
        ck_assert_msg(msg != NULL, "no head: %s", p);
        snprintf(head, sizeof(head), " level=%s ", level);
        ck_assert_msg(strstr(p, head) != NULL && strstr(p, head) < msg,
                      "not at %s: %s", level, p);
        lines[k++] = msg + strlen(" req=req-1 ");
    }
    return k;
}

/* The number after "key=" in 'line'; -1 if none. */
static long long
number_of(const char *line, const char *key)
{
    char pat[32];
    const char *p;

    snprintf(pat, sizeof(pat), " %s=", key);
    p = strstr(line, pat);
    return p != NULL ? strtoll(p + strlen(pat), NULL, 10) : -1;
}

/*
 * Start, one summary per period with the failures since the last line,
 * the end with the count and the time it lasted; then a new failure is
 * a new start.
 */
START_TEST(test_repeat_lines)
{
    static const char *const want[] = {
        "up u0 GET /health failing reason=x",
        "up u0 GET /health still failing failures=11 new=10 for_ms=1000 "
        "reason=x",
        "up u0 GET /health still failing failures=21 new=10 for_ms=2000 "
        "reason=x",
        "up u0 GET /health recovered failures=26 for_ms=2600",
        "up u0 GET /health failing",
        "up u0 GET /health recovered failures=1 for_ms=1",
    };
    const char *what = "up u0 GET /health";
    struct log_repeat r;
    char buf[4096], *lines[16];
    size_t n, i;
    int64_t t;

    log_repeat_init(&r, GW_LOG_WARN, 1000);
    log_repeat_ok(&r, 0, what);             /* not failing: nothing */
    for (t = 0; t <= 2500; t += 100)
        log_repeat_fail(&r, 10000 + t, what, "reason=x");
    log_repeat_ok(&r, 12600, what);
    log_repeat_ok(&r, 12700, what);         /* over already: nothing */
    log_repeat_fail(&r, 15000, what, "");
    log_repeat_ok(&r, 15001, what);
    n = messages("warn", buf, sizeof(buf), lines, GW_ARRAY_LEN(lines));
    ck_assert_uint_eq(n, GW_ARRAY_LEN(want));
    for (i = 0; i < n; i++)
        ck_assert_str_eq(lines[i], want[i]);
}
END_TEST

/*
 * A failure every 7 ms for 10 s: lines never closer than the period,
 * and every failure counted once, in the line that follows it.
 */
START_TEST(test_repeat_at_most_one_line_per_period)
{
    static char buf[65536];
    char *lines[64];
    struct log_repeat r;
    long long last_for = 0, sum = 1, f;
    size_t n, i;
    int64_t t, fails = 0;

    log_repeat_init(&r, GW_LOG_WARN, 1000);
    for (t = 0; t < 10000; t += 7, fails++)
        log_repeat_fail(&r, t, "u0", "");
    log_repeat_ok(&r, t, "u0");
    n = messages("warn", buf, sizeof(buf), lines, GW_ARRAY_LEN(lines));
    ck_assert_uint_eq(n, 1 + 9 + 1);        /* start, 1 s to 9 s, end */
    ck_assert_str_eq(lines[0], "u0 failing");
    for (i = 1; i + 1 < n; i++) {
        f = number_of(lines[i], "for_ms");
        ck_assert_msg(f - last_for >= 1000, "%lld ms after the last: %s",
                      f - last_for, lines[i]);
        last_for = f;
        sum += number_of(lines[i], "new");
        ck_assert_int_eq(number_of(lines[i], "failures"), sum);
    }
    ck_assert_int_eq(number_of(lines[n - 1], "failures"), fails);
    ck_assert_int_eq(number_of(lines[n - 1], "for_ms"), t);
}
END_TEST

/*
 * Below the log level the tracker still counts: a summary said once the
 * level is on has every failure since the start.  Period 0: a line per
 * failure.
 */
START_TEST(test_repeat_level_and_period_zero)
{
    struct log_repeat r;
    char buf[4096], *lines[8];

    log_repeat_init(&r, GW_LOG_DEBUG, 100);
    log_repeat_fail(&r, 0, "u0", "");
    log_repeat_fail(&r, 50, "u0", "");
    ck_assert_uint_eq(messages("debug", buf, sizeof(buf), lines, 8), 0);
    log_set_level(GW_LOG_DEBUG);
    log_repeat_fail(&r, 100, "u0", "");
    log_repeat_ok(&r, 120, "u0");
    ck_assert_uint_eq(messages("debug", buf, sizeof(buf), lines, 8), 2);
    ck_assert_str_eq(lines[0], "u0 still failing failures=3 new=2 "
                     "for_ms=100");
    ck_assert_str_eq(lines[1], "u0 recovered failures=3 for_ms=120");

    clear();
    log_repeat_init(&r, GW_LOG_INFO, 0);
    log_repeat_fail(&r, 0, "u1", "a=1");
    log_repeat_fail(&r, 0, "u1", "a=2");
    log_repeat_fail(&r, 0, "u1", "a=3");
    ck_assert_uint_eq(messages("info", buf, sizeof(buf), lines, 8), 3);
    ck_assert_str_eq(lines[0], "u1 failing a=1");
    ck_assert_str_eq(lines[2], "u1 still failing failures=3 new=1 "
                     "for_ms=0 a=3");
}
END_TEST

static Suite *
log_suite(void)
{
    Suite *s = suite_create("log");
    TCase *tc;

    tc = tcase("format_parse");
    tcase_add_test(tc, test_format_parse);
    suite_add_tcase(s, tc);
    tc = tcase("json_escapes_everything");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_json_escapes_everything);
    suite_add_tcase(s, tc);
    tc = tcase("json_errno");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_json_errno);
    suite_add_tcase(s, tc);
    tc = tcase("json_fields");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_json_fields);
    suite_add_tcase(s, tc);
    tc = tcase("json_cut_lines_still_parse");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_json_cut_lines_still_parse);
    suite_add_tcase(s, tc);
    tc = tcase("json_field_whole_or_none");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_json_field_whole_or_none);
    suite_add_tcase(s, tc);
    tc = tcase("kv_fields");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_kv_fields);
    suite_add_tcase(s, tc);
    tc = tcase("kv_cut");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_kv_cut);
    suite_add_tcase(s, tc);
    tc = tcase("kv_write");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_kv_write);
    suite_add_tcase(s, tc);
    tc = tcase("level_off");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_level_off);
    suite_add_tcase(s, tc);
    tc = tcase("repeat_lines");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_repeat_lines);
    suite_add_tcase(s, tc);
    tc = tcase("repeat_at_most_one_line_per_period");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_repeat_at_most_one_line_per_period);
    suite_add_tcase(s, tc);
    tc = tcase("repeat_level_and_period_zero");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_repeat_level_and_period_zero);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    return test_run(srunner_create(log_suite()));
}
