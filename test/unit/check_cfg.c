/* SPDX-License-Identifier: MIT */
/*
 * check_cfg.c - unit tests for common/cfg.c (syntax, value parsers) and
 * the gateway's config module, gateway/base/config.c and config_schema.c
 * (schema, validation, defaults, etc/gateway.conf).
 *
 * Every error path is driven by a table row that names the exact
 * "FILE:LINE: message" expected, so a message that drifts or points at the
 * wrong line fails here.  Allocation failures are injected at every
 * allocation in turn (alloc_fail_after) until the call succeeds.
 */
#include <check.h>

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <mbedtls/sha256.h>

#include "alloc.h"
#include "buf.h"
#include "cfg.h"
#include "base/config.h"
#include "log.h"
#include "util.h"
#include "testutil.h"

/* Tenant keys long enough to load (CONFIG_MIN_KEY_LEN); KN is a format,
 * one key per %d. */
#define K1 "sk-tenant-key-1-0a1b"
#define K2 "sk-tenant-key-2-0a1b"
#define K3 "sk-tenant-key-3-0a1b"
#define KN "sk-tenant-key-%d-0a1b"
/* printf %s sk-admin-rotated-4e1f | sha256sum */
#define ADMIN_ROTATED_SHA256 \
    "32a3ed61b450aeb6f554191b28f60301b78758cb4abf72d8fb61ddbb97fb5a54"

/* Test-only schema view, compiled into config_schema.c under
 * INFERGW_UNIT_TEST. */
int config_schema_entry(size_t i, const char **section, const char **key,
                        int *alias);

/* ---- helpers ---------------------------------------------------------- */

/* Write 'len' bytes to a new temporary file; returns its malloc'd path. */
static char *
temp_file(const char *text, size_t len)
{
    char *path = strdup("/tmp/check_cfg.XXXXXX");
    int fd;

    ck_assert_ptr_nonnull(path);
    fd = mkstemp(path);
    ck_assert_int_ne(fd, -1);
    ck_assert_int_eq(write(fd, text, len), (ssize_t)len);
    close(fd);
    return path;
}

static void
remove_temp(char *path)
{
    unlink(path);
    free(path);
}

/* "line|section|name|key|value\n" for every entry, into 'out'. */
static void
dump_entries(const struct cfg_file *f, struct buf *out)
{
    size_t i;

    for (i = 0; i < f->count; i++) {
        const struct cfg_entry *e = &f->entries[i];

        ck_assert_int_eq(buf_printf(out, "%d|%s|%s|%s|%s\n", e->line,
                                    e->section, e->name, e->key, e->value),
                         0);
    }
}

static int
config_is_empty(const struct gw_config *c)
{
    static const struct gw_config zero;

    return memcmp(c, &zero, sizeof(zero)) == 0;
}

/* ---- cfg: syntax that parses ------------------------------------------ */

static const struct {
    const char *text;
    const char *entries;        /* dump_entries() of the result */
    const char *note;
} syntax_ok[] = {
    { "", "", "empty file" },
    { "# comment\n\n   \t\n  # indented comment\n", "", "only comments" },
    { "[server]\nlisten = 127.0.0.1:8080\n",
      "1|server|||\n2|server||listen|127.0.0.1:8080\n",
      "header entry, then the key" },
    { "[tenant acme]\napi_key = k # note\n",
      "1|tenant|acme||\n2|tenant|acme|api_key|k\n", "named section" },
    { "  [ tenant \t acme ]  # c\n", "1|tenant|acme||\n",
      "blanks inside and a comment after a header" },
    { "[s]\nk = a#b\n", "1|s|||\n2|s||k|a#b\n", "'#' after a non-blank" },
    { "[s]\nk = # c\n", "1|s|||\n2|s||k|\n", "comment right after blanks" },
    { "[s]\nk =#x\n", "1|s|||\n2|s||k|#x\n", "'#' straight after '='" },
    { "[s]\nk=v\n", "1|s|||\n2|s||k|v\n", "no blanks around '='" },
    { "[s]\nk =\n", "1|s|||\n2|s||k|\n", "empty value" },
    { "[s]\nk = \"a # b\"  # c\n", "1|s|||\n2|s||k|a # b\n",
      "quotes keep '#'" },
    { "[s]\nk = \"q\\\"x\\\\y\"\n", "1|s|||\n2|s||k|q\"x\\y\n",
      "escaped quote and backslash" },
    { "[s]\nk = \"\"\n", "1|s|||\n2|s||k|\n", "empty quoted value" },
    { "[s]\nk = \"  pad  \"\n", "1|s|||\n2|s||k|  pad  \n",
      "quotes keep blanks" },
    { "[s]\nk = a b  c  \t\n", "1|s|||\n2|s||k|a b  c\n",
      "inner blanks kept, outer trimmed" },
    { "[s]\r\nk = v\r\n", "1|s|||\n2|s||k|v\n", "CRLF line ends" },
    { "[s]\nk = v", "1|s|||\n2|s||k|v\n", "no newline at the end" },
    { "[s]\nk = a=b\n", "1|s|||\n2|s||k|a=b\n", "'=' in a value" },
    { "\tk\t=\tv\t\n", "1|||k|v\n", "tabs; a key before any section" },
    { "[s]\nk = say \"hi\"\n", "1|s|||\n2|s||k|say \"hi\"\n",
      "quotes not at the start are literal" },
    { "[s]\nk = h\xc3\xa9llo\n", "1|s|||\n2|s||k|h\xc3\xa9llo\n",
      "UTF-8 value" },
    { "\n\n[a]\n\n[b x]\nk.1-x_y = 2\n",
      "3|a|||\n5|b|x||\n6|b|x|k.1-x_y|2\n", "line numbers; key chars" },
};

START_TEST(test_syntax_ok)
{
    const char *text = syntax_ok[_i].text;
    size_t len = strlen(text);
    struct cfg_file f;
    struct buf dump;
    char err[256];
    char *g = guarded_copy(text, len);
    int rc;

    buf_init(&dump, 1 << 16);
    rc = cfg_parse_text("t.conf", g, len, &f, err, sizeof(err));
    ck_assert_msg(rc == 0, "%s: rc %d err '%s'", syntax_ok[_i].note, rc, err);
    ck_assert_str_eq(f.path, "t.conf");
    dump_entries(&f, &dump);
    ck_assert_msg(strcmp(buf_ptr(&dump), syntax_ok[_i].entries) == 0,
                  "%s: got\n%s", syntax_ok[_i].note, buf_ptr(&dump));
    cfg_file_release(&f);
    ck_assert_ptr_null(f.entries);
    ck_assert_ptr_null(f.path);
    ck_assert_uint_eq(f.count, 0);
    buf_release(&dump);
    guarded_free(g, len);
}
END_TEST

/* ---- cfg: syntax errors ----------------------------------------------- */

static const struct {
    const char *text;
    size_t len;                 /* 0: strlen(text) */
    const char *err;
    const char *note;
} syntax_err[] = {
    { "[server\n", 0, "t.conf:1: unterminated section header",
      "no ']'" },
    { "# c\n\n[server]\nlisten\n", 0, "t.conf:4: expected 'key = value'",
      "no '='" },
    { "[s]\n= 5\n", 0, "t.conf:2: expected 'key = value'", "no key" },
    { "[]\n", 0, "t.conf:1: empty section header", "empty header" },
    { "[ \t ]\n", 0, "t.conf:1: empty section header", "blank header" },
    { "[server] x\n", 0, "t.conf:1: unexpected text after section header",
      "text after ']'" },
    { "[a]b]\n", 0, "t.conf:1: unexpected text after section header",
      "second ']'" },
    { "[tenant a b]\n", 0,
      "t.conf:1: bad section header '[tenant a b]': expected [section] or "
      "[section name] made of letters, digits, '_', '-' and '.'",
      "two names" },
    { "[se$rver]\n", 0,
      "t.conf:1: bad section header '[se$rver]': expected [section] or "
      "[section name] made of letters, digits, '_', '-' and '.'",
      "bad section character" },
    { "[tenant a/b]\n", 0,
      "t.conf:1: bad section header '[tenant a/b]': expected [section] or "
      "[section name] made of letters, digits, '_', '-' and '.'",
      "bad name character" },
    { "[s]\nfoo bar = 1\n", 0,
      "t.conf:2: bad key 'foo bar': use letters, digits, '_', '-' and '.'",
      "blank in a key" },
    { "[s]\n\nk = \"abc\n", 0, "t.conf:3: unterminated quoted value",
      "no closing quote" },
    { "[s]\nk = \"a\\\"\n", 0, "t.conf:2: unterminated quoted value",
      "only an escaped quote" },
    { "[s]\nk = \"a\" b\n", 0,
      "t.conf:2: unexpected text after quoted value", "text after quote" },
    { "[s]\nk = \"a\\x\"\n", 0,
      "t.conf:2: bad escape in quoted value (only \\\" and \\\\)",
      "unknown escape" },
    { "[s]\nk = \"a\\", 0,
      "t.conf:2: bad escape in quoted value (only \\\" and \\\\)",
      "backslash at the very end" },
    { "[s]\nk = a\x01" "b\n", 0, "t.conf:2: control character 0x01 in line",
      "control byte" },
    { "[s]\nk = a\x7f\n", 0, "t.conf:2: control character 0x7f in line",
      "DEL" },
    { "[s]\nk = a\rb\n", 0, "t.conf:2: control character 0x0d in line",
      "bare CR inside a line" },
    { "[s]\nk = a\0b\n", 12, "t.conf:2: control character 0x00 in line",
      "NUL byte" },
    { "[s]\n# \x1b[31m\n", 0, "t.conf:2: control character 0x1b in line",
      "escape sequence, even in a comment" },
};

START_TEST(test_syntax_err)
{
    const char *text = syntax_err[_i].text;
    size_t len = syntax_err[_i].len != 0 ? syntax_err[_i].len : strlen(text);
    struct cfg_file f;
    char err[256];
    char *g = guarded_copy(text, len);
    int rc;

    rc = cfg_parse_text("t.conf", g, len, &f, err, sizeof(err));
    ck_assert_msg(rc == GW_EPARSE, "%s: rc %d", syntax_err[_i].note, rc);
    ck_assert_msg(strcmp(err, syntax_err[_i].err) == 0, "%s: got '%s'",
                  syntax_err[_i].note, err);
    ck_assert_ptr_null(f.entries);
    ck_assert_ptr_null(f.path);
    ck_assert_uint_eq(f.count, 0);
    cfg_file_release(&f);       /* harmless on the emptied struct */
    guarded_free(g, len);
}
END_TEST

START_TEST(test_syntax_err_small_buffer)
{
    struct cfg_file f;
    char err[8];

    /* A short buffer truncates the message but still terminates it. */
    ck_assert_int_eq(cfg_parse_text("t.conf", "[x", 2, &f, err, sizeof(err)),
                     GW_EPARSE);
    ck_assert_str_eq(err, "t.conf:");
    ck_assert_int_eq(cfg_parse_text("t.conf", "[x", 2, &f, NULL, 0),
                     GW_EPARSE);
}
END_TEST

START_TEST(test_many_entries)
{
    struct buf text;
    struct cfg_file f;
    char err[256];
    int i;

    /* Enough entries to grow the array several times. */
    buf_init(&text, 1 << 20);
    ck_assert_int_eq(buf_append_str(&text, "[s]\n"), 0);
    for (i = 0; i < 1000; i++)
        ck_assert_int_eq(buf_printf(&text, "k%d = v%d\n", i, i), 0);
    ck_assert_int_eq(cfg_parse_text("t.conf", buf_ptr(&text), buf_len(&text),
                                    &f, err, sizeof(err)), 0);
    ck_assert_uint_eq(f.count, 1001);
    ck_assert_str_eq(f.entries[1000].key, "k999");
    ck_assert_str_eq(f.entries[1000].value, "v999");
    ck_assert_int_eq(f.entries[1000].line, 1001);
    cfg_file_release(&f);
    buf_release(&text);
}
END_TEST

/* ---- cfg: files -------------------------------------------------------- */

START_TEST(test_file_ok)
{
    static const char text[] = "[server]\nlisten = :1\n";
    struct cfg_file f;
    char err[256];
    char *path = temp_file(text, sizeof(text) - 1);

    ck_assert_int_eq(cfg_parse_file(path, &f, err, sizeof(err)), 0);
    ck_assert_str_eq(f.path, path);
    ck_assert_uint_eq(f.count, 2);
    ck_assert_str_eq(f.entries[1].value, ":1");
    cfg_file_release(&f);
    remove_temp(path);
}
END_TEST

START_TEST(test_file_missing)
{
    struct cfg_file f;
    char err[256];

    ck_assert_int_eq(cfg_parse_file("/nonexistent/gateway.conf", &f, err,
                                    sizeof(err)), GW_EIO);
    ck_assert_str_eq(err, "/nonexistent/gateway.conf: cannot open: "
                     "No such file or directory");
    ck_assert_ptr_null(f.entries);
    ck_assert_ptr_null(f.path);
}
END_TEST

START_TEST(test_file_directory)
{
    struct cfg_file f;
    char err[256];

    ck_assert_int_eq(cfg_parse_file("/tmp", &f, err, sizeof(err)), GW_EIO);
    ck_assert_str_eq(err, "/tmp: cannot read: Is a directory");
}
END_TEST

START_TEST(test_file_syntax_error)
{
    static const char text[] = "[server]\n\nlisten\n";
    struct cfg_file f;
    char err[256], want[300];
    char *path = temp_file(text, sizeof(text) - 1);

    ck_assert_int_eq(cfg_parse_file(path, &f, err, sizeof(err)), GW_EPARSE);
    snprintf(want, sizeof(want), "%s:3: expected 'key = value'", path);
    ck_assert_str_eq(err, want);
    remove_temp(path);
}
END_TEST

/* A file of exactly 'size' bytes: comment lines, then a setting. */
static char *
sized_file(size_t size)
{
    static const char tail[] = "[s]\nk = v\n";
    char *text = malloc(size);
    char *path;
    size_t i;

    ck_assert_ptr_nonnull(text);
    memset(text, '#', size);
    for (i = 63; i < size; i += 64)
        text[i] = '\n';
    memcpy(text + size - (sizeof(tail) - 1), tail, sizeof(tail) - 1);
    text[size - sizeof(tail)] = '\n';
    path = temp_file(text, size);
    free(text);
    return path;
}

START_TEST(test_file_size_limit)
{
    struct cfg_file f;
    char err[256], want[300];
    char *path;

    path = sized_file(1024 * 1024);
    ck_assert_int_eq(cfg_parse_file(path, &f, err, sizeof(err)), 0);
    ck_assert_str_eq(f.entries[f.count - 1].value, "v");
    cfg_file_release(&f);
    remove_temp(path);

    path = sized_file(1024 * 1024 + 1);
    ck_assert_int_eq(cfg_parse_file(path, &f, err, sizeof(err)), GW_ETOOBIG);
    snprintf(want, sizeof(want), "%s: larger than 1048576 bytes", path);
    ck_assert_str_eq(err, want);
    ck_assert_ptr_null(f.entries);
    remove_temp(path);
}
END_TEST

/* ---- cfg: value parsers ------------------------------------------------ */

static const struct {
    const char *s;
    int rc;
    uint64_t v;
} size_cases[] = {
    { "0", 0, 0 },
    { "1", 0, 1 },
    { "16k", 0, 16384 },
    { "16K", 0, 16384 },
    { "8m", 0, 8 * 1048576 },
    { "8M", 0, 8 * 1048576 },
    { "2g", 0, UINT64_C(2) << 30 },
    { "007k", 0, 7168 },
    { "18446744073709551615", 0, UINT64_MAX },
    { "17179869183g", 0, UINT64_C(17179869183) << 30 },
    { "18446744073709551616", GW_EINVAL, 0 },
    { "17179869184g", GW_EINVAL, 0 },
    { "", GW_EINVAL, 0 },
    { "k", GW_EINVAL, 0 },
    { "-1", GW_EINVAL, 0 },
    { "+1", GW_EINVAL, 0 },
    { " 1", GW_EINVAL, 0 },
    { "1 ", GW_EINVAL, 0 },
    { "1 k", GW_EINVAL, 0 },
    { "1kb", GW_EINVAL, 0 },
    { "1kk", GW_EINVAL, 0 },
    { "1.5k", GW_EINVAL, 0 },
    { "0x10", GW_EINVAL, 0 },
    { "1t", GW_EINVAL, 0 },
    { "10x", GW_EINVAL, 0 },
};

START_TEST(test_parse_size)
{
    uint64_t v = 12345;
    int rc = cfg_parse_size(size_cases[_i].s, &v);

    ck_assert_msg(rc == size_cases[_i].rc, "'%s': rc %d", size_cases[_i].s,
                  rc);
    if (rc == 0)
        ck_assert_uint_eq(v, size_cases[_i].v);
    else
        ck_assert_uint_eq(v, 12345);    /* untouched on failure */
}
END_TEST

static const struct {
    const char *s;
    int rc;
    int64_t v;
} duration_cases[] = {
    { "250ms", 0, 250 },
    { "30s", 0, 30000 },
    { "5m", 0, 300000 },
    { "1h", 0, 3600000 },
    { "10", 0, 10000 },
    { "0", 0, 0 },
    { "0ms", 0, 0 },
    { "5M", 0, 300000 },
    { "1MS", 0, 1 },
    { "2H", 0, 7200000 },
    { "9223372036854775807ms", 0, INT64_MAX },
    { "9223372036854775s", 0, INT64_C(9223372036854775000) },
    { "9223372036854775808ms", GW_EINVAL, 0 },
    { "9223372036854776s", GW_EINVAL, 0 },
    { "2562047788015216h", GW_EINVAL, 0 },
    { "", GW_EINVAL, 0 },
    { "ms", GW_EINVAL, 0 },
    { "s", GW_EINVAL, 0 },
    { "1x", GW_EINVAL, 0 },
    { "1 s", GW_EINVAL, 0 },
    { "-1s", GW_EINVAL, 0 },
    { "1.5s", GW_EINVAL, 0 },
    { "1sec", GW_EINVAL, 0 },
    { "1hh", GW_EINVAL, 0 },
    { "1d", GW_EINVAL, 0 },
    { "1m1s", GW_EINVAL, 0 },
};

START_TEST(test_parse_duration)
{
    int64_t v = -7;
    int rc = cfg_parse_duration_ms(duration_cases[_i].s, &v);

    ck_assert_msg(rc == duration_cases[_i].rc, "'%s': rc %d",
                  duration_cases[_i].s, rc);
    if (rc == 0)
        ck_assert_int_eq(v, duration_cases[_i].v);
    else
        ck_assert_int_eq(v, -7);
}
END_TEST

static const struct {
    const char *s;
    int rc;
    int v;
} bool_cases[] = {
    { "on", 0, 1 }, { "off", 0, 0 },
    { "yes", 0, 1 }, { "no", 0, 0 },
    { "true", 0, 1 }, { "false", 0, 0 },
    { "1", 0, 1 }, { "0", 0, 0 },
    { "ON", 0, 1 }, { "False", 0, 0 },
    { "", GW_EINVAL, 0 },
    { "2", GW_EINVAL, 0 },
    { "onn", GW_EINVAL, 0 },
    { "o", GW_EINVAL, 0 },
    { " on", GW_EINVAL, 0 },
    { "enabled", GW_EINVAL, 0 },
};

START_TEST(test_parse_bool)
{
    int v = 42;
    int rc = cfg_parse_bool(bool_cases[_i].s, &v);

    ck_assert_msg(rc == bool_cases[_i].rc, "'%s': rc %d", bool_cases[_i].s,
                  rc);
    ck_assert_int_eq(v, rc == 0 ? bool_cases[_i].v : 42);
}
END_TEST

static const struct {
    const char *s;
    uint64_t max;
    int rc;
    uint64_t v;
} uint_cases[] = {
    { "0", 10, 0, 0 },
    { "10", 10, 0, 10 },
    { "007", 10, 0, 7 },
    { "11", 10, GW_EINVAL, 0 },
    { "18446744073709551615", UINT64_MAX, 0, UINT64_MAX },
    { "18446744073709551616", UINT64_MAX, GW_EINVAL, 0 },
    { "99999999999999999999999", UINT64_MAX, GW_EINVAL, 0 },
    { "", 10, GW_EINVAL, 0 },
    { "1a", 10, GW_EINVAL, 0 },
    { "-0", 10, GW_EINVAL, 0 },
    { "+1", 10, GW_EINVAL, 0 },
    { "1k", UINT64_MAX, GW_EINVAL, 0 },
    { " 1", 10, GW_EINVAL, 0 },
};

START_TEST(test_parse_uint)
{
    uint64_t v = 99;
    int rc = cfg_parse_uint(uint_cases[_i].s, uint_cases[_i].max, &v);

    ck_assert_msg(rc == uint_cases[_i].rc, "'%s': rc %d", uint_cases[_i].s,
                  rc);
    ck_assert_uint_eq(v, rc == 0 ? uint_cases[_i].v : 99);
}
END_TEST

static const struct {
    const char *s;
    double lo, hi;
    int rc;
    double v;
} decimal_cases[] = {
    { "0", 0, 2, 0, 0 },
    { "0.7", 0, 2, 0, 0.7 },
    { "2.0", 0, 2, 0, 2 },
    { ".5", 0, 2, 0, 0.5 },
    { "5.", 0, 10, 0, 5 },
    { "2.01", 0, 2, GW_EINVAL, 0 },
    { "", 0, 2, GW_EINVAL, 0 },
    { ".", 0, 2, GW_EINVAL, 0 },
    { "1.2.3", 0, 9, GW_EINVAL, 0 },
    { "-1", -5, 5, GW_EINVAL, 0 },
    { "+1", 0, 5, GW_EINVAL, 0 },
    { "1e1", 0, 100, GW_EINVAL, 0 },
    { " 1", 0, 5, GW_EINVAL, 0 },
    { "nan", 0, 5, GW_EINVAL, 0 },
};

START_TEST(test_parse_decimal)
{
    double v = -7;
    int rc = cfg_parse_decimal(decimal_cases[_i].s, decimal_cases[_i].lo,
                               decimal_cases[_i].hi, &v);

    ck_assert_msg(rc == decimal_cases[_i].rc, "'%s': rc %d",
                  decimal_cases[_i].s, rc);
    if (rc == 0)
        ck_assert_double_eq_tol(v, decimal_cases[_i].v, 1e-12);
    else
        ck_assert_double_eq(v, -7);
}
END_TEST

static const struct {
    const char *s;
    int rc;
    double v;
} percent_cases[] = {
    { "20%", 0, 0.2 },
    { "12.5%", 0, 0.125 },
    { "0%", 0, 0 },
    { "100%", 0, 1 },
    { "101%", GW_EINVAL, 0 },
    { "%", GW_EINVAL, 0 },
    { "20", GW_EINVAL, 0 },
    { "20 %", GW_EINVAL, 0 },
    { "0.2", GW_EINVAL, 0 },
    { "1234567890123456789012345678901%", GW_EINVAL, 0 },
};

START_TEST(test_parse_percent)
{
    double v = -7;
    int rc = cfg_parse_percent(percent_cases[_i].s, 0, 100, &v);

    ck_assert_msg(rc == percent_cases[_i].rc, "'%s': rc %d",
                  percent_cases[_i].s, rc);
    if (rc == 0)
        ck_assert_double_eq_tol(v, percent_cases[_i].v, 1e-12);
    else
        ck_assert_double_eq(v, -7);
}
END_TEST

/* The formatters write what the parsers read back, shortest first. */
START_TEST(test_format)
{
    static const struct {
        uint64_t v;
        const char *size, *ms;
    } cases[] = {
        { 0, "0", "0ms" },
        { 1, "1", "1ms" },
        { 1000, "1000", "1s" },
        { 1024, "1k", "1024ms" },
        { 60000, "60000", "1m" },
        { 1536, "1536", "1536ms" },
        { UINT64_C(1) << 20, "1m", "1048576ms" },
        { UINT64_C(3) << 30, "3g", "3221225472ms" },
        { 3600000, "3600000", "1h" },
        { UINT64_C(24) * 3600000, "84375k", "24h" },
        { 90000, "90000", "90s" },          /* not a whole minute */
        { 5400000, "5400000", "90m" },      /* not a whole hour */
        { 1001, "1001", "1001ms" },
    };
    char out[32];
    uint64_t u;
    int64_t ms;

    for (size_t i = 0; i < GW_ARRAY_LEN(cases); i++) {
        cfg_format_size(cases[i].v, out, sizeof(out));
        ck_assert_str_eq(out, cases[i].size);
        ck_assert_int_eq(cfg_parse_size(out, &u), 0);
        ck_assert_uint_eq(u, cases[i].v);
        cfg_format_duration_ms(cases[i].v, out, sizeof(out));
        ck_assert_str_eq(out, cases[i].ms);
        ck_assert_int_eq(cfg_parse_duration_ms(out, &ms), 0);
        ck_assert_int_eq(ms, (int64_t)cases[i].v);
    }
    cfg_format_size(123456, out, 4);
    ck_assert_str_eq(out, "123");
}
END_TEST

/* ---- cfg: allocation failures ----------------------------------------- */

START_TEST(test_cfg_alloc_fail_text)
{
    static const char text[] = "[server]\nlisten = :1\n"
                               "[tenant a]\napi_key = \"k\\\"1\"\n";
    struct cfg_file f;
    char err[256];
    long n;
    int rc;

    for (n = 1;; n++) {
        alloc_fail_after(n, 0);
        rc = cfg_parse_text("t.conf", text, sizeof(text) - 1, &f, err,
                            sizeof(err));
        alloc_fail_after(0, 0);
        if (rc == 0)
            break;
        ck_assert_int_eq(rc, GW_ENOMEM);
        ck_assert_str_eq(err, "t.conf: out of memory");
        ck_assert_ptr_null(f.entries);
        ck_assert_ptr_null(f.path);
        ck_assert_uint_eq(f.count, 0);
    }
    ck_assert_int_gt(n, 3);
    ck_assert_uint_eq(f.count, 4);
    ck_assert_str_eq(f.entries[3].value, "k\"1");
    cfg_file_release(&f);
}
END_TEST

START_TEST(test_cfg_alloc_fail_file)
{
    static const char text[] = "[server]\nlisten = :1\n";
    struct cfg_file f;
    char err[256], want[300];
    char *path = temp_file(text, sizeof(text) - 1);
    long n;
    int rc;

    snprintf(want, sizeof(want), "%s: out of memory", path);
    for (n = 1;; n++) {
        alloc_fail_after(n, 0);
        rc = cfg_parse_file(path, &f, err, sizeof(err));
        alloc_fail_after(0, 0);
        if (rc == 0)
            break;
        ck_assert_int_eq(rc, GW_ENOMEM);
        ck_assert_str_eq(err, want);
        ck_assert_ptr_null(f.entries);
    }
    ck_assert_int_gt(n, 1);
    ck_assert_uint_eq(f.count, 2);
    cfg_file_release(&f);

    /* Sticky: everything fails from the first allocation on. */
    alloc_fail_after(1, 1);
    rc = cfg_parse_file(path, &f, err, sizeof(err));
    alloc_fail_after(0, 0);
    ck_assert_int_eq(rc, GW_ENOMEM);
    remove_temp(path);
}
END_TEST

/* ---- config: defaults ------------------------------------------------- */

START_TEST(test_defaults)
{
    struct gw_config c;

    ck_assert_int_eq(config_defaults(&c), 0);
    ck_assert_ptr_null(c.path);
    ck_assert_str_eq(c.listen, "127.0.0.1:8080");
    ck_assert_uint_eq(c.max_connections, 1024);
    ck_assert_uint_eq(c.thread_stack_size, 256 * 1024);
    ck_assert_uint_eq(c.max_header_size, 16 * 1024);
    ck_assert_uint_eq(c.max_request_body, 16 * 1024 * 1024);
    ck_assert_int_eq(c.header_timeout_ms, 10000);
    ck_assert_int_eq(c.body_timeout_ms, 60000);
    ck_assert_int_eq(c.idle_timeout_ms, 60000);
    ck_assert_int_eq(c.send_timeout_ms, 60000);
    ck_assert_int_eq(c.drain_timeout_ms, 30000);
    ck_assert_int_eq(c.log_level, GW_LOG_INFO);
    ck_assert_int_eq(c.log_format, GW_LOG_FORMAT_KV);
    ck_assert_int_eq(c.access_log, 1);
    ck_assert_uint_eq(c.num_trusted_proxies, 0);
    ck_assert_uint_eq(c.num_upstreams, 1);
    ck_assert_str_eq(c.upstreams[0].name, "default");
    ck_assert_str_eq(c.upstreams[0].url, "http://127.0.0.1:8000");
    ck_assert_str_eq(c.upstreams[0].api_key, "");
    ck_assert_uint_eq(c.upstreams[0].num_models, 0);
    ck_assert_uint_eq(c.upstreams[0].weight, 1);
    ck_assert_uint_eq(c.upstreams[0].max_inflight, 0);
    ck_assert_int_eq(c.upstreams[0].connect_timeout_ms, 5000);
    ck_assert_int_eq(c.upstreams[0].first_byte_timeout_ms, 60000);
    ck_assert_int_eq(c.upstreams[0].idle_timeout_ms, 30000);
    ck_assert_int_eq(c.upstreams[0].total_timeout_ms, 600000);
    ck_assert_int_eq(c.forward_client_auth, 0);
    ck_assert_int_eq(c.balance, BALANCE_LEAST_LOAD);
    ck_assert_int_eq(c.health_interval_ms, 5000);
    ck_assert_uint_eq(c.eject_after, 3);
    ck_assert_int_eq(c.eject_time_ms, 10000);
    ck_assert(c.max_ejected == 0.5);
    ck_assert(c.panic_below == 0.5);
    ck_assert_uint_eq(c.retries, 2);
    ck_assert(c.retry_budget == 0.2);
    ck_assert_uint_eq(c.retry_budget_min, 3);
    ck_assert_int_eq(c.hedge_after_ms, 0);
    ck_assert_int_eq(c.queue_timeout_ms, 2000);
    ck_assert(c.prefix_epsilon == 0.1);
    ck_assert_uint_eq(c.prefix_bytes, 1024);
    ck_assert_int_eq(c.connect_timeout_ms, 5000);
    ck_assert_int_eq(c.first_byte_timeout_ms, 60000);
    ck_assert_int_eq(c.upstream_idle_timeout_ms, 30000);
    ck_assert_int_eq(c.total_timeout_ms, 600000);
    ck_assert_int_eq(c.coalesce, 1);
    ck_assert(c.omitted_temperature == 0.0);
    ck_assert_uint_eq(c.max_followers, 4096);
    ck_assert_uint_eq(c.max_flight_bytes, 8 * 1024 * 1024);
    ck_assert_uint_eq(c.max_reader_lag, 32 * 1024 * 1024);
    ck_assert_uint_eq(c.max_flights, 1024);
    ck_assert_int_eq(c.follower_timeout_ms, 600000);
    ck_assert_int_eq(c.leader_writes, 1);
    ck_assert_uint_eq(c.num_tenants, 0);
    config_release(&c);
    ck_assert(config_is_empty(&c));
    config_release(&c);         /* a second release is harmless */
}
END_TEST

START_TEST(test_defaults_alloc_fail)
{
    struct gw_config c;
    long n;
    int rc;

    for (n = 1;; n++) {
        alloc_fail_after(n, 0);
        rc = config_defaults(&c);
        alloc_fail_after(0, 0);
        if (rc == 0)
            break;
        ck_assert_int_eq(rc, GW_ENOMEM);
        ck_assert(config_is_empty(&c));
    }
    ck_assert_int_gt(n, 1);
    config_release(&c);
}
END_TEST

/* ---- config: loading -------------------------------------------------- */

/* Every setting away from its default, in a file with the usual noise. */
static const char full_config[] =
    "# a full config\n"
    "[server]\n"
    "listen = [::1]:0\n"
    "max_connections = 1000000\n"
    "thread_stack_size = 64m\n"
    "max_header_size = 1k\n"
    "max_request_body = 1g   # a big one\n"
    "header_timeout = 1ms\n"
    "body_timeout = 2s\n"
    "idle_timeout = 3m\n"
    "send_timeout = 24h\n"
    "drain_timeout = 7\n"
    "log_level = debug\n"
    "log_format = json\n"
    "access_log = no\n"
    "trusted_proxies = 10.0.0.0/8,\t::1 , 192.168.0.7\n"
    "\r\n"
    "[upstream]\r\n"
    "url = HTTPS://api.example.com/v1//\r\n"
    "api_key = \"sk-up#stream\"\n"
    "forward_client_auth = true\n"
    "connect_timeout = 250ms\n"
    "first_byte_timeout = 90s\n"
    "idle_timeout = 45s\n"
    "total_timeout = 1h\n"
    "[coalesce]\n"
    "enabled = off\n"
    "omitted_temperature = 1.0\n"
    "max_followers = 1\n"
    "max_flight_bytes = 1024\n"
    "max_reader_lag = 4m\n"
    "max_flights = 7\n"
    "follower_timeout = 90s\n"
    "leader_writes = off\n"
    "[tenant acme]\n"
    "api_key = sk-acme-1-0123456\n"
    "api_key = sk-acme-2-0123456\n"
    "[tenant research.lab-2]\n"
    "coalesce = off\n"
    "api_key = sk-research-012345\n"
    "max_inflight = 4\n"
    "requests_per_minute = 600\n"
    "[admin]\n"
    "listen = 127.0.0.1:0\n"
    "api_key = sk-admin-0123456789\n"
    "api_key_sha256 = " ADMIN_ROTATED_SHA256 "\n";

/* Is 'digest' the SHA-256 of 'key'?  (Keys are kept only so.) */
static int
key_is(const unsigned char *digest, const char *key)
{
    unsigned char d[CONFIG_KEY_DIGEST_LEN];

    mbedtls_sha256_ret((const unsigned char *)key, strlen(key), d, 0);
    return memcmp(d, digest, sizeof(d)) == 0;
}

START_TEST(test_load_full)
{
    struct gw_config c;
    char err[256];

    ck_assert_int_eq(config_load_text("gateway.conf", full_config, &c, err,
                                      sizeof(err)), 0);
    ck_assert_str_eq(err, "");
    ck_assert_str_eq(c.path, "gateway.conf");
    ck_assert_str_eq(c.listen, "[::1]:0");
    ck_assert_uint_eq(c.max_connections, 1000000);
    ck_assert_uint_eq(c.thread_stack_size, 64 * 1024 * 1024);
    ck_assert_uint_eq(c.max_header_size, 1024);
    ck_assert_uint_eq(c.max_request_body, UINT64_C(1) << 30);
    ck_assert_int_eq(c.header_timeout_ms, 1);
    ck_assert_int_eq(c.body_timeout_ms, 2000);
    ck_assert_int_eq(c.idle_timeout_ms, 180000);
    ck_assert_int_eq(c.send_timeout_ms, 86400000);
    ck_assert_int_eq(c.drain_timeout_ms, 7000);
    ck_assert_int_eq(c.log_level, GW_LOG_DEBUG);
    ck_assert_int_eq(c.log_format, GW_LOG_FORMAT_JSON);
    ck_assert_int_eq(c.access_log, 0);
    ck_assert_uint_eq(c.num_trusted_proxies, 3);
    ck_assert_int_eq(c.trusted_proxies[0].addr.family, AF_INET);
    ck_assert_uint_eq(c.trusted_proxies[0].bits, 8);
    ck_assert_int_eq(c.trusted_proxies[1].addr.family, AF_INET6);
    ck_assert_uint_eq(c.trusted_proxies[1].bits, 128);
    ck_assert_int_eq(c.trusted_proxies[2].addr.family, AF_INET);
    ck_assert_uint_eq(c.trusted_proxies[2].bits, 32);
    ck_assert_uint_eq(c.num_upstreams, 1);
    ck_assert_str_eq(c.upstreams[0].name, "default");
    ck_assert_str_eq(c.upstreams[0].url, "HTTPS://api.example.com/v1");
    ck_assert_str_eq(c.upstreams[0].api_key, "sk-up#stream");
    ck_assert_int_eq(c.forward_client_auth, 1);
    /* The plain [upstream]'s timeouts are its own; [routing]'s stay. */
    ck_assert_int_eq(c.upstreams[0].connect_timeout_ms, 250);
    ck_assert_int_eq(c.upstreams[0].first_byte_timeout_ms, 90000);
    ck_assert_int_eq(c.upstreams[0].idle_timeout_ms, 45000);
    ck_assert_int_eq(c.upstreams[0].total_timeout_ms, 3600000);
    ck_assert_int_eq(c.connect_timeout_ms, 5000);
    ck_assert_int_eq(c.coalesce, 0);
    ck_assert(c.omitted_temperature == 1.0);
    ck_assert_uint_eq(c.max_followers, 1);
    ck_assert_uint_eq(c.max_flight_bytes, 1024);
    ck_assert_uint_eq(c.max_reader_lag, 4 * 1024 * 1024);
    ck_assert_uint_eq(c.max_flights, 7);
    ck_assert_int_eq(c.follower_timeout_ms, 90000);
    ck_assert_int_eq(c.leader_writes, 0);
    ck_assert_uint_eq(c.num_tenants, 2);
    ck_assert_str_eq(c.tenants[0].name, "acme");
    ck_assert_uint_eq(c.tenants[0].num_keys, 2);
    ck_assert(key_is(c.tenants[0].key_sha256[0], "sk-acme-1-0123456"));
    ck_assert(key_is(c.tenants[0].key_sha256[1], "sk-acme-2-0123456"));
    ck_assert_int_eq(c.tenants[0].coalesce, 1);
    ck_assert_str_eq(c.tenants[1].name, "research.lab-2");
    ck_assert_uint_eq(c.tenants[1].num_keys, 1);
    ck_assert(key_is(c.tenants[1].key_sha256[0], "sk-research-012345"));
    ck_assert_int_eq(c.tenants[1].coalesce, 0);
    ck_assert_uint_eq(c.tenants[0].max_inflight, 0);
    ck_assert_uint_eq(c.tenants[0].requests_per_minute, 0);
    ck_assert_uint_eq(c.tenants[1].max_inflight, 4);
    ck_assert_uint_eq(c.tenants[1].requests_per_minute, 600);
    ck_assert_str_eq(c.admin_listen, "127.0.0.1:0");
    ck_assert_uint_eq(c.num_admin_keys, 2);
    ck_assert(key_is(c.admin_key_sha256[0], "sk-admin-0123456789"));
    ck_assert(key_is(c.admin_key_sha256[1], "sk-admin-rotated-4e1f"));
    config_release(&c);
    ck_assert(config_is_empty(&c));
}
END_TEST

START_TEST(test_load_upstreams_and_routing)
{
    struct gw_config c;
    char err[256];
    const struct config_upstream *u;

    ck_assert_msg(config_load_text("g.conf",
        "[routing]\nbalance = prefix\nretry_budget = 12.5%\n"
        "max_ejected = 25%\npanic_below = 0%\n"
        "first_byte_timeout = 2s\nhedge_after = 150ms\n"
        "[upstream gpu-a]\nurl = http://10.0.0.5:8000/\n"
        "models = llama-3-8b, qwen2-7b\nweight = 3\nmax_inflight = 8\n"
        "idle_timeout = 5s\n"
        "[upstream gpu-b]\nurl = http://10.0.0.6:8000\n", &c, err,
        sizeof(err)) == 0, "%s", err);
    ck_assert_uint_eq(c.num_upstreams, 2);
    ck_assert_int_eq(c.balance, BALANCE_PREFIX);
    ck_assert(c.retry_budget == 0.125);
    ck_assert_int_eq(c.hedge_after_ms, 150);
    ck_assert(c.max_ejected == 0.25);
    ck_assert(c.panic_below == 0.0);
    u = config_find_upstream(&c, "gpu-a");
    ck_assert_ptr_nonnull(u);
    ck_assert_str_eq(u->url, "http://10.0.0.5:8000");
    ck_assert_uint_eq(u->num_models, 2);
    ck_assert_str_eq(u->models[0], "llama-3-8b");
    ck_assert_str_eq(u->models[1], "qwen2-7b");
    ck_assert_uint_eq(u->weight, 3);
    ck_assert_uint_eq(u->max_inflight, 8);
    ck_assert_int_eq(u->idle_timeout_ms, 5000);
    /* Unset timeouts are [routing]'s, wherever that section stands. */
    ck_assert_int_eq(u->first_byte_timeout_ms, 2000);
    u = config_find_upstream(&c, "gpu-b");
    ck_assert_uint_eq(u->num_models, 0);
    ck_assert_int_eq(u->first_byte_timeout_ms, 2000);
    ck_assert_int_eq(u->idle_timeout_ms, 30000);
    ck_assert_ptr_null(config_find_upstream(&c, "default"));
    config_release(&c);

    /* No upstream section: the built-in default, with [routing]'s
     * timeouts even when [routing] comes last. */
    ck_assert_int_eq(config_load_text("g.conf", "[routing]\n"
                                      "connect_timeout = 7s\n", &c, err,
                                      sizeof(err)), 0);
    ck_assert_uint_eq(c.num_upstreams, 1);
    ck_assert_str_eq(c.upstreams[0].name, "default");
    ck_assert_int_eq(c.upstreams[0].connect_timeout_ms, 7000);
    config_release(&c);
}
END_TEST

START_TEST(test_load_empty)
{
    struct gw_config c, d;
    char err[256];

    /* An empty file is the defaults; so are empty sections. */
    ck_assert_int_eq(config_load_text("e.conf", "", &c, err, sizeof(err)), 0);
    ck_assert_int_eq(config_defaults(&d), 0);
    ck_assert_str_eq(c.listen, d.listen);
    ck_assert_uint_eq(c.max_connections, d.max_connections);
    config_release(&c);
    ck_assert_int_eq(config_load_text("e.conf", "[server]\n[upstream]\n"
                                      "[coalesce]\n", &c, err, sizeof(err)),
                     0);
    ck_assert_str_eq(c.upstreams[0].url, d.upstreams[0].url);
    config_release(&c);
    config_release(&d);
}
END_TEST

/* Listeners that cannot clash are fine: port 0 (each picks its own),
 * or the same port on other hosts. */
START_TEST(test_listeners_apart)
{
    static const char *const ok[] = {
        "[server]\nlisten = 127.0.0.1:0\n[admin]\nlisten = 127.0.0.1:0\n",
        "[server]\nlisten = 127.0.0.1:8080\n[admin]\n"
        "listen = 127.0.0.2:8080\n",
        "[server]\nlisten = 127.0.0.1:8080\n[admin]\n"
        "listen = 127.0.0.1:8081\n",
    };
    struct gw_config c;
    char err[256];

    for (size_t i = 0; i < GW_ARRAY_LEN(ok); i++) {
        ck_assert_msg(config_load_text("g.conf", ok[i], &c, err,
                                       sizeof(err)) == 0, "%s", err);
        config_release(&c);
    }
}
END_TEST

/* [cluster]: off without the section; its defaults; the password file. */
START_TEST(test_cluster)
{
    struct gw_config c;
    char dir[] = "/tmp/infergw-cfg-XXXXXX", path[64], text[256], err[256];
    FILE *f;

    ck_assert_int_eq(config_load_text("g.conf", "[server]\n", &c, err,
                                      sizeof(err)), 0);
    ck_assert_int_eq(c.cluster, 0);
    config_release(&c);

    ck_assert_int_eq(config_load_text("g.conf", "[cluster]\nredis = "
                                      "unix:/run/r.sock\n", &c, err,
                                      sizeof(err)), 0);
    ck_assert_int_eq(c.cluster, 1);
    ck_assert_str_eq(c.redis, "unix:/run/r.sock");
    ck_assert_int_eq(c.redis_timeout_ms, 20);
    ck_assert_uint_eq(c.redis_connections, 8);
    ck_assert_str_eq(c.key_prefix, "infergw:");
    ck_assert_str_eq(c.node, "");
    ck_assert_int_eq(c.lease_ms, 10000);
    ck_assert_int_eq(c.on_error, ON_ERROR_LOCAL);
    ck_assert_str_eq(c.redis_password, "");
    config_release(&c);

    /* The first line, without its line end; read at every load. */
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/pw", dir);
    f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs("s3cret pass\r\nsecond line\n", f);
    fclose(f);
    ck_assert_int_eq(chmod(path, 0600), 0);
    snprintf(text, sizeof(text), "[cluster]\nredis = redis://h\n"
             "redis_password_file = %s\n", path);
    ck_assert_msg(config_load_text("g.conf", text, &c, err, sizeof(err))
                  == 0, "%s", err);
    ck_assert_str_eq(c.redis_password, "s3cret pass");
    config_release(&c);
    unlink(path);
    rmdir(dir);
}
END_TEST

#define OPEN_MSG(mode) "group or others may read it (mode " mode "): " \
    "chmod 0600 it (a Kubernetes secret: defaultMode 0400)"

/*
 * redis_password_file's mode and kind, and an ACL user whose password
 * is in it: (mode, URL, the error or NULL, for root, for another user).
 */
static const struct {
    mode_t mode;
    const char *url;
    const char *root_err, *user_err;
    const char *note;
} pwfile_cases[] = {
    { 0600, "redis://app@h", NULL, NULL, "a user, its password in the file" },
    { 0400, "unix:/r.sock?db=2&user=app", NULL, NULL,
      "a socket's user and db, the password in the file" },
    { 0644, "redis://h", OPEN_MSG("0644"), OPEN_MSG("0644"),
      "readable by all" },
    { 0640, "redis://h", NULL, OPEN_MSG("0640"),
      "group-readable: root's only (libpq's rule)" },
    { 0620, "redis://h", OPEN_MSG("0620"), OPEN_MSG("0620"),
      "group-writable" },
};

START_TEST(test_cluster_password_file)
{
    char dir[] = "/tmp/infergw-cfg-XXXXXX", path[64], text[256], err[256];
    char want[300];
    const char *fmt = geteuid() == 0 ? pwfile_cases[_i].root_err
                      : pwfile_cases[_i].user_err;
    struct gw_config c;
    FILE *f;
    int rc;

    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/pw", dir);
    f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs("s3cret\n", f);
    fclose(f);
    ck_assert_int_eq(chmod(path, pwfile_cases[_i].mode), 0);
    snprintf(text, sizeof(text), "[cluster]\nredis = %s\n"
             "redis_password_file = %s\n", pwfile_cases[_i].url, path);
    rc = config_load_text("g.conf", text, &c, err, sizeof(err));
    if (fmt == NULL) {
        ck_assert_msg(rc == 0, "%s: %s", pwfile_cases[_i].note, err);
        ck_assert_str_eq(c.redis_password, "s3cret");
        config_release(&c);
    } else {
        snprintf(want, sizeof(want), "g.conf:3: redis_password_file %s: "
                 "%s", path, fmt);
        ck_assert_int_eq(rc, GW_EINVAL);
        ck_assert_str_eq(err, want);
    }
    unlink(path);
    rmdir(dir);
}
END_TEST

/* Valid values at the edges of each kind of validation. */
static const struct {
    const char *text;
    const char *note;
} load_ok[] = {
    { "[server]\nlisten = :8080\n", ":PORT" },
    { "[cluster]\nredis = redis://h\n", "cluster: a host alone" },
    { "[cluster]\nredis = redis://u:p@[::1]:6380/15\nredis_timeout = 1ms\n"
      "redis_connections = 256\nkey_prefix =\nnode = gw-1:8080\n"
      "lease = 1h\non_error = deny\n", "cluster: every setting at an edge" },
    { "[server]\nlisten = 0.0.0.0:65535\n", "highest port" },
    { "[server]\nlisten = localhost:0\n", "host name, port 0" },
    { "[server]\nlisten = [::]:443\n", "IPv6 any" },
    { "[upstream]\nurl = http://h\n", "shortest URL" },
    { "[upstream]\nurl = https://h:8443/base/\n", "https with path" },
    { "[upstream]\napi_key =\n", "empty upstream key: none" },
    { "[coalesce]\nomitted_temperature = 2\n", "temperature max" },
    { "[coalesce]\nomitted_temperature = .5\n", "temperature .5" },
    { "[coalesce]\nomitted_temperature = 0.\n", "temperature 0." },
    { "[server]\nthread_stack_size = 65536\n", "size min in bytes" },
    { "[server]\nmax_connections = 1\n", "uint min" },
    { "[server]\ntls_session_timeout = 0\n", "TLS resumption off" },
    { "[server]\ntls_session_timeout = 168h\n", "TLS ticket lifetime max" },
    { "[tenant a]\napi_key = " K1 "\n[tenant b]\napi_key = " K2 "\n"
      "coalesce = off\n[tenant c]\ncoalesce = on\napi_key = " K3 "\n",
      "coalesce once per tenant" },
    { "[upstream]\napi_key = " K1 "\n[tenant a]\napi_key = " K1 "\n",
      "upstream key may equal a tenant key" },
    { "[upstream]\napi_key = k1\n", "a short upstream key: the upstream's" },
    { "[tenant a]\napi_key = 0123456789abcdef\n", "16 characters: enough" },
};

START_TEST(test_load_ok)
{
    struct gw_config c;
    char err[256];
    int rc;

    rc = config_load_text("gateway.conf", load_ok[_i].text, &c, err,
                          sizeof(err));
    ck_assert_msg(rc == 0, "%s: %s", load_ok[_i].note, err);
    config_release(&c);
}
END_TEST

START_TEST(test_url_trailing_slash)
{
    static const struct {
        const char *in, *out;
    } cases[] = {
        { "http://h:8000/", "http://h:8000" },
        { "http://h:8000///", "http://h:8000" },
        { "http://h/v1/", "http://h/v1" },
        { "http://h", "http://h" },
    };
    struct gw_config c;
    char text[128], err[256];
    size_t i;

    for (i = 0; i < GW_ARRAY_LEN(cases); i++) {
        snprintf(text, sizeof(text), "[upstream]\nurl = %s\n", cases[i].in);
        ck_assert_int_eq(config_load_text("g.conf", text, &c, err,
                                          sizeof(err)), 0);
        ck_assert_str_eq(c.upstreams[0].url, cases[i].out);
        config_release(&c);
    }
}
END_TEST

/* ---- config: errors --------------------------------------------------- */

#define SIZE_HINT "(bytes, or a number with k, m or g)"
#define DUR_HINT "(e.g. 250ms, 30s, 5m, 1h)"
#define LISTEN_HINT "HOST:PORT, [IPv6]:PORT or :PORT (PORT 0..65535), " \
    "or nothing for none"
#define URL_HINT "an http:// or https:// URL without ?query or #fragment"
#define CIDRS_HINT "IP addresses or networks (10.0.0.0/8, fd00::/8) " \
    "separated by commas, at most 64, no host bits past the prefix"
#define BOOL_HINT "on or off (or yes/no, true/false, 1/0)"
#define KEY_HINT "key without blanks, quotes or control characters"
#define REDIS_HINT "redis://[user[:password]@]host[:port][/db] or " \
    "unix:/path[?db=N&user=U]"

static const struct {
    const char *text;
    int rc;
    const char *err;
} load_err[] = {
    /* sections */
    { "[server]\n[fooo]\n", GW_EINVAL,
      "gateway.conf:2: unknown section [fooo]" },
    { "[tenants acme]\n", GW_EINVAL,
      "gateway.conf:1: unknown section [tenants]" },
    { "[server main]\n", GW_EINVAL,
      "gateway.conf:1: section [server] takes no name" },
    { "[tenant]\n", GW_EINVAL,
      "gateway.conf:1: section [tenant] needs a name, as in [tenant NAME]" },
    { "[server]\nlisten = :1\n[upstream]\n[server]\n", GW_EINVAL,
      "gateway.conf:4: duplicate section [server], first at line 1" },
    /* keys */
    { "# top\nlisten = :1\n", GW_EINVAL,
      "gateway.conf:2: 'listen' is set before any [section]" },
    { "[server]\nurl = http://x\n", GW_EINVAL,
      "gateway.conf:2: unknown key 'url' in [server]" },
    { "[upstream]\nlisten = :1\n", GW_EINVAL,
      "gateway.conf:2: unknown key 'listen' in [upstream]" },
    { "[coalesce]\ncoalesce = on\n", GW_EINVAL,
      "gateway.conf:2: unknown key 'coalesce' in [coalesce]" },
    { "[tenant acme]\napi_key = " K1 "\nenabled = on\n", GW_EINVAL,
      "gateway.conf:3: unknown key 'enabled' in [tenant acme]" },
    { "[server]\nlisten = :1\nmax_connections = 5\nlisten = :2\n", GW_EINVAL,
      "gateway.conf:4: duplicate key 'listen' in [server], first set at "
      "line 2" },
    { "[upstream]\nidle_timeout = 1s\n\nidle_timeout = 1s\n", GW_EINVAL,
      "gateway.conf:4: duplicate key 'idle_timeout' in [upstream], first "
      "set at line 2" },
    { "[tenant a]\napi_key = " K1 "\ncoalesce = on\ncoalesce = off\n",
      GW_EINVAL,
      "gateway.conf:4: duplicate key 'coalesce' in [tenant a], first set "
      "at line 3" },
    /* values: integers */
    { "# sample\n\n[server]\nlisten = :8080\n\n# how many\n"
      "max_connections = lots\n", GW_EINVAL,
      "gateway.conf:7: max_connections: expected an integer 1..1000000, "
      "got 'lots'" },
    { "[server]\nmax_connections = 0\n", GW_EINVAL,
      "gateway.conf:2: max_connections: expected an integer 1..1000000, "
      "got '0'" },
    { "[server]\nmax_connections = 1000001\n", GW_EINVAL,
      "gateway.conf:2: max_connections: expected an integer 1..1000000, "
      "got '1000001'" },
    { "[server]\nmax_connections = -1\n", GW_EINVAL,
      "gateway.conf:2: max_connections: expected an integer 1..1000000, "
      "got '-1'" },
    { "[coalesce]\nmax_followers = 1k\n", GW_EINVAL,
      "gateway.conf:2: max_followers: expected an integer 1..1000000, "
      "got '1k'" },
    { "[coalesce]\nmax_flights =\n", GW_EINVAL,
      "gateway.conf:2: max_flights: expected an integer 1..1000000, "
      "got ''" },
    /* values: sizes */
    { "[server]\nthread_stack_size = 32k\n", GW_EINVAL,
      "gateway.conf:2: thread_stack_size: expected a size 64k..64m "
      SIZE_HINT ", got '32k'" },
    { "[server]\nthread_stack_size = 65535\n", GW_EINVAL,
      "gateway.conf:2: thread_stack_size: expected a size 64k..64m "
      SIZE_HINT ", got '65535'" },
    { "[server]\nmax_header_size = 2m\n", GW_EINVAL,
      "gateway.conf:2: max_header_size: expected a size 1k..1m "
      SIZE_HINT ", got '2m'" },
    { "[server]\nmax_request_body = 16kb\n", GW_EINVAL,
      "gateway.conf:2: max_request_body: expected a size 1k..1g "
      SIZE_HINT ", got '16kb'" },
    { "[coalesce]\nmax_flight_bytes = 0\n", GW_EINVAL,
      "gateway.conf:2: max_flight_bytes: expected a size 1k..1g "
      SIZE_HINT ", got '0'" },
    { "[coalesce]\nmax_reader_lag = 2g\n", GW_EINVAL,
      "gateway.conf:2: max_reader_lag: expected a size 1k..1g "
      SIZE_HINT ", got '2g'" },
    /* values: durations */
    { "[server]\nheader_timeout = 0\n", GW_EINVAL,
      "gateway.conf:2: header_timeout: expected a duration 1ms..24h "
      DUR_HINT ", got '0'" },
    { "[server]\nbody_timeout = 25h\n", GW_EINVAL,
      "gateway.conf:2: body_timeout: expected a duration 1ms..24h "
      DUR_HINT ", got '25h'" },
    { "[server]\ntls_session_timeout = 1500ms\n", GW_EINVAL,
      "gateway.conf:2: tls_session_timeout: a whole number of seconds "
      "(session tickets count seconds), not 1500ms" },
    { "[server]\ntls_session_timeout = 169h\n", GW_EINVAL,
      "gateway.conf:2: tls_session_timeout: expected a duration 0ms..168h "
      DUR_HINT ", got '169h'" },
    { "[server]\nidle_timeout = 1.5s\n", GW_EINVAL,
      "gateway.conf:2: idle_timeout: expected a duration 1ms..24h "
      DUR_HINT ", got '1.5s'" },
    { "[server]\nsend_timeout = 10 s\n", GW_EINVAL,
      "gateway.conf:2: send_timeout: expected a duration 1ms..24h "
      DUR_HINT ", got '10 s'" },
    { "[server]\ndrain_timeout = -1\n", GW_EINVAL,
      "gateway.conf:2: drain_timeout: expected a duration 1ms..24h "
      DUR_HINT ", got '-1'" },
    { "[upstream]\nidle_timeout = soon\n", GW_EINVAL,
      "gateway.conf:2: idle_timeout: expected a duration 1ms..24h "
      DUR_HINT ", got 'soon'" },
    { "[upstream]\nconnect_timeout = 0ms\n", GW_EINVAL,
      "gateway.conf:2: connect_timeout: expected a duration 1ms..24h "
      DUR_HINT ", got '0ms'" },
    { "[upstream]\nfirst_byte_timeout = 1d\n", GW_EINVAL,
      "gateway.conf:2: first_byte_timeout: expected a duration 1ms..24h "
      DUR_HINT ", got '1d'" },
    { "[upstream]\ntotal_timeout = 1441m\n", GW_EINVAL,
      "gateway.conf:2: total_timeout: expected a duration 1ms..24h "
      DUR_HINT ", got '1441m'" },
    { "[coalesce]\nfollower_timeout = forever\n", GW_EINVAL,
      "gateway.conf:2: follower_timeout: expected a duration 1ms..24h "
      DUR_HINT ", got 'forever'" },
    /* values: booleans and words */
    { "[server]\naccess_log = maybe\n", GW_EINVAL,
      "gateway.conf:2: access_log: expected " BOOL_HINT ", got 'maybe'" },
    { "[upstream]\nforward_client_auth = 2\n", GW_EINVAL,
      "gateway.conf:2: forward_client_auth: expected " BOOL_HINT
      ", got '2'" },
    { "[coalesce]\nenabled = enabled\n", GW_EINVAL,
      "gateway.conf:2: enabled: expected " BOOL_HINT ", got 'enabled'" },
    { "[tenant a]\napi_key = " K1 "\ncoalesce = nope\n", GW_EINVAL,
      "gateway.conf:3: coalesce: expected " BOOL_HINT ", got 'nope'" },
    { "[server]\nlog_level = verbose\n", GW_EINVAL,
      "gateway.conf:2: log_level: expected error, warn, info or debug, "
      "got 'verbose'" },
    { "[server]\nlog_level = INFO\n", GW_EINVAL,
      "gateway.conf:2: log_level: expected error, warn, info or debug, "
      "got 'INFO'" },
    /* values: temperature */
    { "[coalesce]\nomitted_temperature = 2.5\n", GW_EINVAL,
      "gateway.conf:2: omitted_temperature: expected a number 0..2, "
      "got '2.5'" },
    { "[coalesce]\nomitted_temperature = -1\n", GW_EINVAL,
      "gateway.conf:2: omitted_temperature: expected a number 0..2, "
      "got '-1'" },
    { "[coalesce]\nomitted_temperature = nan\n", GW_EINVAL,
      "gateway.conf:2: omitted_temperature: expected a number 0..2, "
      "got 'nan'" },
    { "[coalesce]\nomitted_temperature = 1e0\n", GW_EINVAL,
      "gateway.conf:2: omitted_temperature: expected a number 0..2, "
      "got '1e0'" },
    { "[coalesce]\nomitted_temperature = .\n", GW_EINVAL,
      "gateway.conf:2: omitted_temperature: expected a number 0..2, "
      "got '.'" },
    { "[coalesce]\nomitted_temperature = 1.0.0\n", GW_EINVAL,
      "gateway.conf:2: omitted_temperature: expected a number 0..2, "
      "got '1.0.0'" },
    /* values: listen */
    { "[server]\nlisten = localhost\n", GW_EINVAL,
      "gateway.conf:2: listen: expected " LISTEN_HINT ", got 'localhost'" },
    { "[server]\nlisten = h:65536\n", GW_EINVAL,
      "gateway.conf:2: listen: expected " LISTEN_HINT ", got 'h:65536'" },
    { "[server]\nlisten = h:\n", GW_EINVAL,
      "gateway.conf:2: listen: expected " LISTEN_HINT ", got 'h:'" },
    { "[server]\nlisten = h:http\n", GW_EINVAL,
      "gateway.conf:2: listen: expected " LISTEN_HINT ", got 'h:http'" },
    { "[server]\nlisten = h:8080:1\n", GW_EINVAL,
      "gateway.conf:2: listen: expected " LISTEN_HINT ", got 'h:8080:1'" },
    { "[server]\nlisten = ::1:8080\n", GW_EINVAL,
      "gateway.conf:2: listen: expected " LISTEN_HINT ", got '::1:8080'" },
    { "[server]\nlisten = [::1]8080\n", GW_EINVAL,
      "gateway.conf:2: listen: expected " LISTEN_HINT ", got '[::1]8080'" },
    { "[server]\nlisten = []:80\n", GW_EINVAL,
      "gateway.conf:2: listen: expected " LISTEN_HINT ", got '[]:80'" },
    { "[server]\nlisten = [::1:80\n", GW_EINVAL,
      "gateway.conf:2: listen: expected " LISTEN_HINT ", got '[::1:80'" },
    { "[server]\nlisten = a b:80\n", GW_EINVAL,
      "gateway.conf:2: listen: expected " LISTEN_HINT ", got 'a b:80'" },
    { "[server]\nlisten = [fe80::1%eth0]:443\n", GW_EINVAL,
      "gateway.conf:2: listen: expected " LISTEN_HINT
      ", got '[fe80::1%eth0]:443'" },
    { "[server]\nlisten =\n", GW_EINVAL,
      "gateway.conf:2: nothing to listen on: set listen, tls_listen or "
      "both" },
    { "[server]\ntls_listen = :0\ntls_cert = c.pem\n", GW_EINVAL,
      "gateway.conf:2: tls_listen needs tls_cert and tls_key" },
    { "[server]\nlisten = 127.0.0.1:8080\n[admin]\nlisten = 127.0.0.1:8080\n",
      GW_EINVAL, "gateway.conf:4: two listeners on the same address: "
      "listen, tls_listen and [admin] listen must each have their own" },
    { "[server]\nlisten = :8081\n[admin]\nlisten = LocalHost:8081\n",
      GW_EINVAL, "gateway.conf:4: two listeners on the same address: "
      "listen, tls_listen and [admin] listen must each have their own" },
    { "[server]\nlisten = 127.0.0.1:8443\ntls_listen = 0.0.0.0:8443\n",
      GW_EINVAL, "gateway.conf:3: two listeners on the same address: "
      "listen, tls_listen and [admin] listen must each have their own" },
    { "[server]\ntls_min_version = 1.1\n", GW_EINVAL,
      "gateway.conf:2: tls_min_version: expected 1.2 or 1.3, got '1.1'" },
    { "[server]\ntls_cert = a\001b\n", GW_EPARSE,
      "gateway.conf:2: control character 0x01 in line" },
    { "[upstream x]\nurl = https://x\nclient_cert = c.pem\n", GW_EINVAL,
      "gateway.conf:1: upstream 'x': client_cert and client_key go "
      "together" },
    { "[upstream x]\nurl = https://x\nca_file = /nonexistent/ca.pem\n",
      GW_EINVAL, "gateway.conf:1: upstream 'x': ca_file "
      "/nonexistent/ca.pem: not a readable file" },
    { "[upstream x]\nurl = https://x\nca_file = /tmp\n", GW_EINVAL,
      "gateway.conf:1: upstream 'x': ca_file /tmp: not a readable file" },
    /* values: url */
    { "[upstream]\nurl = ftp://x\n", GW_EINVAL,
      "gateway.conf:2: url: expected " URL_HINT ", got 'ftp://x'" },
    { "[upstream]\nurl = 127.0.0.1:8000\n", GW_EINVAL,
      "gateway.conf:2: url: expected " URL_HINT ", got '127.0.0.1:8000'" },
    { "[upstream]\nurl = http://\n", GW_EINVAL,
      "gateway.conf:2: url: expected " URL_HINT ", got 'http://'" },
    { "[upstream]\nurl = http:///v1\n", GW_EINVAL,
      "gateway.conf:2: url: expected " URL_HINT ", got 'http:///v1'" },
    { "[upstream]\nurl = http://h/?a=1\n", GW_EINVAL,
      "gateway.conf:2: url: expected " URL_HINT ", got 'http://h/?a=1'" },
    { "[upstream]\nurl = http://h/#x\n", GW_EINVAL,
      "gateway.conf:2: url: expected " URL_HINT ", got 'http://h/#x'" },
    { "[upstream]\nurl = http://a b\n", GW_EINVAL,
      "gateway.conf:2: url: expected " URL_HINT ", got 'http://a b'" },
    /* values: keys, never echoed */
    { "[upstream]\napi_key = \"sk-a b\"\n", GW_EINVAL,
      "gateway.conf:2: api_key: expected a " KEY_HINT },
    { "[tenant a]\napi_key =\n", GW_EINVAL,
      "gateway.conf:2: api_key: expected a non-empty " KEY_HINT },
    { "[tenant a]\napi_key = \"sk-\\\"q\"\n", GW_EINVAL,
      "gateway.conf:2: api_key: expected a non-empty " KEY_HINT },
    { "[tenant a]\napi_key = " K1 "\n[tenant b]\napi_key = 0123456789abcde\n",
      GW_EINVAL, "gateway.conf:4: api_key: a weak key: at least 16 "
      "characters are needed" },
    { "[tenant a]\napi_key = \"sk-\\\"quoted-and-long\"\n", GW_EINVAL,
      "gateway.conf:2: api_key: expected a non-empty " KEY_HINT },
    /* tenants */
    { "[tenant a]\napi_key = " K1 "\n[tenant b]\napi_key = " K2 "\n"
      "[tenant a]\napi_key = " K3 "\n", GW_EINVAL,
      "gateway.conf:5: duplicate tenant 'a', first at line 1" },
    { "[tenant a]\napi_key = " K1 "\n[tenant b]\napi_key = " K2 "\n"
      "api_key = " K1 "\n", GW_EINVAL,
      "gateway.conf:5: this api_key is already used by tenant 'a'" },
    { "[tenant a]\napi_key = " K1 "\napi_key = " K1 "\n", GW_EINVAL,
      "gateway.conf:3: this api_key is already used by tenant 'a'" },
    { "[tenant a]\ncoalesce = off\n[server]\n", GW_EINVAL,
      "gateway.conf:1: tenant 'a' has no api_key" },
    { "[server]\n\n[tenant x]\n", GW_EINVAL,
      "gateway.conf:3: tenant 'x' has no api_key" },
    { "[tenant a]\n[tenant b]\napi_key = " K1 "\n", GW_EINVAL,
      "gateway.conf:1: tenant 'a' has no api_key" },
    /* [admin] (issue 16) */
    { "[admin]\napi_key = sk-short-admin\n", GW_EINVAL,
      "gateway.conf:2: api_key: a weak key: at least 16 characters are "
      "needed" },
    { "[tenant a]\napi_key = " K1 "\n[admin]\napi_key = " K1 "\n",
      GW_EINVAL, "gateway.conf:4: this api_key is already used by "
      "tenant 'a'" },
    { "[admin]\napi_key = " K1 "\n[tenant a]\napi_key = " K1 "\n",
      GW_EINVAL, "gateway.conf:4: this api_key is already used by [admin]" },
    { "[admin]\napi_key = " K1 "\napi_key = " K1 "\n", GW_EINVAL,
      "gateway.conf:3: this api_key is already used by [admin]" },
    { "[admin]\nlisten = nowhere\n", GW_EINVAL,
      "gateway.conf:2: listen: expected " LISTEN_HINT ", got 'nowhere'" },
    { "[admin]\nlisten = :1\nlisten = :2\n", GW_EINVAL,
      "gateway.conf:3: duplicate key 'listen' in [admin], first set at "
      "line 2" },
    { "[admin]\nport = 1\n", GW_EINVAL,
      "gateway.conf:2: unknown key 'port' in [admin]" },
    { "[admin ops]\n", GW_EINVAL,
      "gateway.conf:1: section [admin] takes no name" },
    { "[admin]\n[server]\n[admin]\n", GW_EINVAL,
      "gateway.conf:3: duplicate section [admin], first at line 1" },
    /* [cluster] (issue 28): a password in a URL is never echoed */
    { "[cluster]\n", GW_EINVAL, "gateway.conf:1: [cluster] needs redis = "
      "redis://HOST:PORT or unix:/PATH" },
    { "[cluster]\nredis =\n", GW_EINVAL, "gateway.conf:1: [cluster] needs "
      "redis = redis://HOST:PORT or unix:/PATH" },
    { "[cluster]\nredis = http://h:6379\n", GW_EINVAL,
      "gateway.conf:2: redis: expected " REDIS_HINT },
    { "[cluster]\nredis = redis://:sk-secret@h:0\n", GW_EINVAL,
      "gateway.conf:2: redis: expected " REDIS_HINT },
    { "[cluster]\nredis = redis://app:sk-secret@h:6379/x\n", GW_EINVAL,
      "gateway.conf:2: redis: expected " REDIS_HINT },
    { "[cluster]\nredis = unix:redis.sock\n", GW_EINVAL,
      "gateway.conf:2: redis: expected " REDIS_HINT },
    { "[cluster]\nredis = unix:/r.sock\nredis_timeout = 0\n", GW_EINVAL,
      "gateway.conf:3: redis_timeout: expected a duration 1ms..10s "
      DUR_HINT ", got '0'" },
    { "[cluster]\nredis = unix:/r.sock\nredis_timeout = 11s\n", GW_EINVAL,
      "gateway.conf:3: redis_timeout: expected a duration 1ms..10s "
      DUR_HINT ", got '11s'" },
    { "[cluster]\nredis = unix:/r.sock\nredis_connections = 0\n",
      GW_EINVAL, "gateway.conf:3: redis_connections: expected an integer "
      "1..256, got '0'" },
    { "[cluster]\nredis = unix:/r.sock\nredis_connections = 257\n",
      GW_EINVAL, "gateway.conf:3: redis_connections: expected an integer "
      "1..256, got '257'" },
    { "[cluster]\nredis = unix:/r.sock\nkey_prefix = gw{1}:\n", GW_EINVAL,
      "gateway.conf:3: key_prefix: expected at most 64 printable "
      "characters without blanks, quotes, backslashes or braces, got "
      "'gw{1}:'" },
    { "[cluster]\nredis = unix:/r.sock\nnode = a\"b\n", GW_EINVAL,
      "gateway.conf:3: node: expected at most 64 printable characters "
      "without blanks, quotes, backslashes or braces, got 'a\"b'" },
    { "[cluster]\nredis = unix:/r.sock\nlease = 999ms\n", GW_EINVAL,
      "gateway.conf:3: lease: expected a duration 1s..1h " DUR_HINT
      ", got '999ms'" },
    { "[cluster]\nredis = unix:/r.sock\non_error = allow\n", GW_EINVAL,
      "gateway.conf:3: on_error: expected local or deny, got 'allow'" },
    { "[cluster]\nredis = redis://app@h\n", GW_EINVAL,
      "gateway.conf:2: redis: user app needs a password, in the URL or "
      "redis_password_file" },
    { "[cluster]\nredis = unix:/r.sock?user=app\n", GW_EINVAL,
      "gateway.conf:2: redis: user app needs a password, in the URL or "
      "redis_password_file" },
    { "[cluster]\nredis = unix:/r.sock?db=1&db=2\n", GW_EINVAL,
      "gateway.conf:2: redis: expected " REDIS_HINT },
    { "[cluster]\nredis = unix:/r.sock\nredis_password_file = /\n",
      GW_EINVAL, "gateway.conf:3: redis_password_file /: not a regular "
      "file" },
    { "[cluster]\nredis = unix:/r.sock\nredis_password_file = /nonexistent"
      "\n", GW_EINVAL, "gateway.conf:3: redis_password_file /nonexistent: "
      "not a readable file" },
    { "[cluster]\nredis = redis://:sk-secret@h\nredis_password_file = "
      "/dev/null\n", GW_EINVAL, "gateway.conf:3: redis_password_file: the "
      "redis URL has a password already: give it in one place" },
    { "[cluster]\nredis = unix:/r.sock\nredis_password_file = /dev/null\n",
      GW_EINVAL, "gateway.conf:3: redis_password_file /dev/null: not a "
      "regular file" },
    { "[cluster x]\n", GW_EINVAL,
      "gateway.conf:1: section [cluster] takes no name" },
    /* upstreams and routing (issue 9) */
    { "[upstream a]\nurl = http://h\n[upstream a]\nurl = http://i\n",
      GW_EINVAL, "gateway.conf:3: duplicate upstream 'a', first at line 1" },
    { "[upstream]\n[upstream default]\nurl = http://h\n", GW_EINVAL,
      "gateway.conf:2: duplicate upstream 'default', first at line 1" },
    { "[upstream a]\nweight = 2\n[routing]\n", GW_EINVAL,
      "gateway.conf:1: upstream 'a' has no url" },
    { "[upstream a]\nurl = http://h\nmodels = x, y, x\n", GW_EINVAL,
      "gateway.conf:3: models: 'x' is listed twice" },
    { "[upstream a]\nurl = http://h\nmodels = x,,y\n", GW_EINVAL,
      "gateway.conf:3: models: expected model names separated by commas "
      "(at most 64, each at most 64 characters, without blanks or quotes)"
      ", got 'x,,y'" },
    { "[upstream a]\nurl = http://h\nforward_client_auth = on\n",
      GW_EINVAL, "gateway.conf:3: 'forward_client_auth' applies to every "
      "upstream: set it in [routing]" },
    { "[upstream]\nforward_client_auth = on\n[routing]\n"
      "forward_client_auth = off\n", GW_EINVAL,
      "gateway.conf:4: duplicate key 'forward_client_auth' in [routing], "
      "first set at line 2" },
    { "[upstream a]\nurl = http://h\nweight = 0\n", GW_EINVAL,
      "gateway.conf:3: weight: expected an integer 1..1000, got '0'" },
    { "[routing]\nbalance = random\n", GW_EINVAL,
      "gateway.conf:2: balance: expected least_load, least_inflight, "
      "round_robin or prefix, got 'random'" },
    { "[tenant a]\napi_key = 0123456789abcdef\npriority = 1001\n", GW_EINVAL,
      "gateway.conf:3: priority: expected an integer -1000..1000, got "
      "'1001'" },
    { "[tenant a]\napi_key = 0123456789abcdef\npriority = --1\n", GW_EINVAL,
      "gateway.conf:3: priority: expected an integer -1000..1000, got "
      "'--1'" },
    { "[routing]\nkv_high = 1.5\n", GW_EINVAL,
      "gateway.conf:2: kv_high: expected a number 0..1, got '1.5'" },
    { "[routing]\nmax_waiting = 0\n", GW_EINVAL,
      "gateway.conf:2: max_waiting: expected an integer 1..1000000, got "
      "'0'" },
    { "[routing]\nretry_budget = 20\n", GW_EINVAL,
      "gateway.conf:2: retry_budget: expected a share 0%..100%, as in 20%, "
      "got '20'" },
    { "[routing]\nretry_budget = 101%\n", GW_EINVAL,
      "gateway.conf:2: retry_budget: expected a share 0%..100%, as in 20%, "
      "got '101%'" },
    { "[routing]\neject_time = 6m\n", GW_EINVAL,
      "gateway.conf:2: eject_time: expected a duration 1ms..5m "
      DUR_HINT ", got '6m'" },
    { "[routing]\nretries = 64\n", GW_EINVAL,
      "gateway.conf:2: retries: expected an integer 0..63, got '64'" },
    { "[upstream a b]\n", GW_EPARSE,
      "gateway.conf:1: bad section header '[upstream a b]': expected "
      "[section] or [section name] made of letters, digits, '_', '-' and "
      "'.'" },
    /* logs (issue 19 item 4) */
    { "[server]\nlog_format = text\n", GW_EINVAL,
      "gateway.conf:2: log_format: expected kv or json, got 'text'" },
    { "[server]\n\ntrusted_proxies = 10.0.0.0/8, 10.1.0.0/8\n", GW_EINVAL,
      "gateway.conf:3: trusted_proxies: expected " CIDRS_HINT ", got "
      "'10.0.0.0/8, 10.1.0.0/8'" },
    { "[server]\ntrusted_proxies = 10.0.0.0/8,\n", GW_EINVAL,
      "gateway.conf:2: trusted_proxies: expected " CIDRS_HINT ", got "
      "'10.0.0.0/8,'" },
    { "[server]\ntrusted_proxies = ::1,,::2\n", GW_EINVAL,
      "gateway.conf:2: trusted_proxies: expected " CIDRS_HINT ", got "
      "'::1,,::2'" },
    { "[server]\ntrusted_proxies = proxy.example\n", GW_EINVAL,
      "gateway.conf:2: trusted_proxies: expected " CIDRS_HINT ", got "
      "'proxy.example'" },
    { "[server]\ntrusted_proxies = 10.0.0.0/33\n", GW_EINVAL,
      "gateway.conf:2: trusted_proxies: expected " CIDRS_HINT ", got "
      "'10.0.0.0/33'" },
    /* syntax errors come through from cfg.c */
    { "[server]\nlisten\n", GW_EPARSE,
      "gateway.conf:2: expected 'key = value'" },
    { "[server\n", GW_EPARSE, "gateway.conf:1: unterminated section header" },
    { "[tenant a/b]\n", GW_EPARSE,
      "gateway.conf:1: bad section header '[tenant a/b]': expected "
      "[section] or [section name] made of letters, digits, '_', '-' and "
      "'.'" },
};

START_TEST(test_load_err)
{
    struct gw_config c;
    char err[512];
    int rc;

    rc = config_load_text("gateway.conf", load_err[_i].text, &c, err,
                          sizeof(err));
    ck_assert_msg(rc == load_err[_i].rc, "row %d: rc %d (%s)", _i, rc, err);
    ck_assert_str_eq(err, load_err[_i].err);
    ck_assert_ptr_null(strstr(err, "sk-"));     /* keys never echoed */
    ck_assert(config_is_empty(&c));             /* released on failure */
}
END_TEST

static const struct {
    const char *header;
    const char *err;
} too_many_keys[] = {
    { "[tenant many]\n",
      "g.conf:18: tenant 'many' has more than 16 api_key lines" },
    { "[admin]\n", "g.conf:18: [admin] has more than 16 api_key lines" },
};

/* Errors about counts need generated files. */
START_TEST(test_load_err_limits)
{
    struct gw_config c;
    struct buf t;
    char err[512];
    int i;

    buf_init(&t, 1 << 20);

    /* 65 tenants: the 65th header is refused. */
    for (i = 0; i <= CONFIG_MAX_TENANTS; i++)
        ck_assert_int_eq(buf_printf(&t, "[tenant t%d]\napi_key = " KN "\n",
                                    i, i), 0);
    ck_assert_int_eq(config_load_text("g.conf", buf_ptr(&t), &c, err,
                                      sizeof(err)), GW_EINVAL);
    ck_assert_str_eq(err, "g.conf:129: too many tenants (at most 64)");
    ck_assert(config_is_empty(&c));

    /* 64 are fine. */
    buf_reset(&t);
    for (i = 0; i < CONFIG_MAX_TENANTS; i++)
        ck_assert_int_eq(buf_printf(&t, "[tenant t%d]\napi_key = " KN "\n",
                                    i, i), 0);
    ck_assert_int_eq(config_load_text("g.conf", buf_ptr(&t), &c, err,
                                      sizeof(err)), 0);
    ck_assert_uint_eq(c.num_tenants, CONFIG_MAX_TENANTS);
    config_release(&c);

    /* 17 keys in one tenant, or in [admin]: the 17th is refused. */
    for (size_t k = 0; k < GW_ARRAY_LEN(too_many_keys); k++) {
        buf_reset(&t);
        ck_assert_int_eq(buf_append_str(&t, too_many_keys[k].header), 0);
        for (i = 0; i <= CONFIG_MAX_TENANT_KEYS; i++)
            ck_assert_int_eq(buf_printf(&t, "api_key = " KN "\n", i), 0);
        ck_assert_int_eq(config_load_text("g.conf", buf_ptr(&t), &c, err,
                                          sizeof(err)), GW_EINVAL);
        ck_assert_str_eq(err, too_many_keys[k].err);
    }

    /* A 65-character tenant name is refused, 64 accepted. */
    buf_reset(&t);
    ck_assert_int_eq(buf_printf(&t, "[tenant %065d]\napi_key = " K1 "\n",
                                0), 0);
    ck_assert_int_eq(config_load_text("g.conf", buf_ptr(&t), &c, err,
                                      sizeof(err)), GW_EINVAL);
    ck_assert_str_eq(err, "g.conf:1: tenant name longer than 64 characters");
    buf_reset(&t);
    ck_assert_int_eq(buf_printf(&t, "[tenant %064d]\napi_key = " K1 "\n",
                                0), 0);
    ck_assert_int_eq(config_load_text("g.conf", buf_ptr(&t), &c, err,
                                      sizeof(err)), 0);
    config_release(&c);

    /* 65 upstreams: the 65th header is refused; 64 are fine. */
    buf_reset(&t);
    for (i = 0; i <= CONFIG_MAX_UPSTREAMS; i++)
        ck_assert_int_eq(buf_printf(&t, "[upstream u%d]\nurl = http://h%d\n",
                                    i, i), 0);
    ck_assert_int_eq(config_load_text("g.conf", buf_ptr(&t), &c, err,
                                      sizeof(err)), GW_EINVAL);
    ck_assert_str_eq(err, "g.conf:129: too many upstreams (at most 64)");
    buf_reset(&t);
    for (i = 0; i < CONFIG_MAX_UPSTREAMS; i++)
        ck_assert_int_eq(buf_printf(&t, "[upstream u%d]\nurl = http://h%d\n",
                                    i, i), 0);
    ck_assert_int_eq(config_load_text("g.conf", buf_ptr(&t), &c, err,
                                      sizeof(err)), 0);
    ck_assert_uint_eq(c.num_upstreams, CONFIG_MAX_UPSTREAMS);
    config_release(&c);
    buf_release(&t);
}
END_TEST

START_TEST(test_load_file_errors)
{
    struct gw_config c;
    char err[512], want[600];
    char *path, *big;
    size_t n = 1024 * 1024 + 1;

    ck_assert_int_eq(config_load("/nonexistent/gateway.conf", &c, err,
                                 sizeof(err)), GW_EIO);
    ck_assert_str_eq(err, "/nonexistent/gateway.conf: cannot open: "
                     "No such file or directory");
    ck_assert(config_is_empty(&c));

    path = temp_file("[server]\nlisten = :1\n\nfoo = 1\n", 30);
    ck_assert_int_eq(config_load(path, &c, err, sizeof(err)), GW_EINVAL);
    snprintf(want, sizeof(want), "%s:4: unknown key 'foo' in [server]",
             path);
    ck_assert_str_eq(err, want);
    remove_temp(path);

    big = malloc(n);
    ck_assert_ptr_nonnull(big);
    memset(big, '\n', n);
    path = temp_file(big, n);
    free(big);
    ck_assert_int_eq(config_load(path, &c, err, sizeof(err)), GW_EINVAL);
    snprintf(want, sizeof(want), "%s: larger than 1048576 bytes", path);
    ck_assert_str_eq(err, want);
    ck_assert(config_is_empty(&c));
    remove_temp(path);
}
END_TEST

START_TEST(test_load_file_ok)
{
    struct gw_config c;
    char err[512];
    static const char text[] = "[tenant a]\napi_key = " K1 "\n";
    char *path = temp_file(text, sizeof(text) - 1);

    ck_assert_int_eq(config_load(path, &c, err, sizeof(err)), 0);
    ck_assert_str_eq(c.path, path);
    ck_assert_uint_eq(c.num_tenants, 1);
    config_release(&c);
    remove_temp(path);
}
END_TEST

/* ---- config: allocation failures -------------------------------------- */

START_TEST(test_load_alloc_fail)
{
    struct gw_config c;
    char err[512];
    long n;
    int rc;

    for (n = 1;; n++) {
        alloc_fail_after(n, 0);
        rc = config_load_text("gateway.conf", full_config, &c, err,
                              sizeof(err));
        alloc_fail_after(0, 0);
        if (rc == 0)
            break;
        ck_assert_int_eq(rc, GW_ENOMEM);
        ck_assert_str_eq(err, "gateway.conf: out of memory");
        ck_assert(config_is_empty(&c));
    }
    ck_assert_int_gt(n, 10);
    ck_assert_uint_eq(c.num_tenants, 2);
    config_release(&c);
}
END_TEST

START_TEST(test_load_file_alloc_fail)
{
    struct gw_config c;
    char err[512], want[600];
    char *path = temp_file(full_config, sizeof(full_config) - 1);
    long n;
    int rc;

    snprintf(want, sizeof(want), "%s: out of memory", path);
    for (n = 1;; n++) {
        alloc_fail_after(n, 0);
        rc = config_load(path, &c, err, sizeof(err));
        alloc_fail_after(0, 0);
        if (rc == 0)
            break;
        ck_assert_int_eq(rc, GW_ENOMEM);
        ck_assert_str_eq(err, want);
        ck_assert(config_is_empty(&c));
    }
    ck_assert_int_gt(n, 10);
    config_release(&c);
    remove_temp(path);
}
END_TEST

/* ---- etc/gateway.conf ------------------------------------------------- */

/* The sample, found from the source tree (tests run from the top). */
static const char *
sample_path(void)
{
    static char path[4096];
    const char *dir = getenv("INFERGW_SRCDIR");

    snprintf(path, sizeof(path), "%s/etc/gateway.conf",
             dir != NULL ? dir : ".");
    return path;
}

/*
 * The sample with every "#key = value" line uncommented: those lines show
 * the defaults.  Prose comments ("# text") and the tenant example
 * ("#   [tenant acme]") keep their '#' because of the blank after it.
 */
static char *
uncomment_sample(void)
{
    struct buf in, out;
    const char *p, *end, *nl, *k;
    char *text;
    int fd;
    ssize_t got;
    char chunk[4096];

    buf_init(&in, 1 << 20);
    buf_init(&out, 1 << 20);
    fd = open(sample_path(), O_RDONLY);
    ck_assert_msg(fd != -1, "%s: %s", sample_path(), strerror(errno));
    while ((got = read(fd, chunk, sizeof(chunk))) > 0)
        ck_assert_int_eq(buf_append(&in, chunk, (size_t)got), 0);
    close(fd);
    p = buf_ptr(&in);
    end = p + buf_len(&in);
    for (; p < end; p = nl + 1) {
        nl = memchr(p, '\n', (size_t)(end - p));
        if (nl == NULL)
            nl = end;
        k = p + 1;
        while (k < nl && ((*k >= 'a' && *k <= 'z') || *k == '_'))
            k++;
        if (p[0] == '#' && k > p + 1 && nl - k >= 2 && k[0] == ' '
            && k[1] == '=' && (nl - k == 2 || k[2] == ' '))
            p++;
        ck_assert_int_eq(buf_append(&out, p, (size_t)(nl - p)), 0);
        ck_assert_int_eq(buf_append(&out, "\n", 1), 0);
    }
    buf_release(&in);
    text = buf_take(&out, NULL);
    ck_assert_ptr_nonnull(text);
    return text;
}

static void
assert_config_eq(const struct gw_config *a, const struct gw_config *b)
{
    ck_assert_str_eq(a->listen, b->listen);
    ck_assert_uint_eq(a->max_connections, b->max_connections);
    ck_assert_uint_eq(a->thread_stack_size, b->thread_stack_size);
    ck_assert_uint_eq(a->max_header_size, b->max_header_size);
    ck_assert_uint_eq(a->max_request_body, b->max_request_body);
    ck_assert_int_eq(a->header_timeout_ms, b->header_timeout_ms);
    ck_assert_int_eq(a->body_timeout_ms, b->body_timeout_ms);
    ck_assert_int_eq(a->idle_timeout_ms, b->idle_timeout_ms);
    ck_assert_int_eq(a->send_timeout_ms, b->send_timeout_ms);
    ck_assert_int_eq(a->drain_timeout_ms, b->drain_timeout_ms);
    ck_assert_int_eq(a->log_level, b->log_level);
    ck_assert_int_eq(a->log_format, b->log_format);
    ck_assert_int_eq(a->access_log, b->access_log);
    ck_assert_uint_eq(a->num_trusted_proxies, b->num_trusted_proxies);
    ck_assert(memcmp(a->trusted_proxies, b->trusted_proxies,
                     sizeof(a->trusted_proxies)) == 0);
    ck_assert_uint_eq(a->num_upstreams, b->num_upstreams);
    for (size_t i = 0; i < a->num_upstreams; i++) {
        const struct config_upstream *x = &a->upstreams[i];
        const struct config_upstream *y = &b->upstreams[i];

        ck_assert_str_eq(x->name, y->name);
        ck_assert_str_eq(x->url, y->url);
        ck_assert_str_eq(x->api_key, y->api_key);
        ck_assert_uint_eq(x->num_models, y->num_models);
        ck_assert_uint_eq(x->weight, y->weight);
        ck_assert_uint_eq(x->max_inflight, y->max_inflight);
        ck_assert_int_eq(x->connect_timeout_ms, y->connect_timeout_ms);
        ck_assert_int_eq(x->first_byte_timeout_ms,
                         y->first_byte_timeout_ms);
        ck_assert_int_eq(x->idle_timeout_ms, y->idle_timeout_ms);
        ck_assert_int_eq(x->total_timeout_ms, y->total_timeout_ms);
    }
    ck_assert_int_eq(a->forward_client_auth, b->forward_client_auth);
    ck_assert_int_eq(a->balance, b->balance);
    ck_assert_int_eq(a->health_interval_ms, b->health_interval_ms);
    ck_assert_uint_eq(a->eject_after, b->eject_after);
    ck_assert_int_eq(a->eject_time_ms, b->eject_time_ms);
    ck_assert(a->max_ejected == b->max_ejected);
    ck_assert(a->panic_below == b->panic_below);
    ck_assert_uint_eq(a->retries, b->retries);
    ck_assert(a->retry_budget == b->retry_budget);
    ck_assert_uint_eq(a->retry_budget_min, b->retry_budget_min);
    ck_assert_int_eq(a->hedge_after_ms, b->hedge_after_ms);
    ck_assert_int_eq(a->queue_timeout_ms, b->queue_timeout_ms);
    ck_assert(a->prefix_epsilon == b->prefix_epsilon);
    ck_assert_uint_eq(a->prefix_bytes, b->prefix_bytes);
    ck_assert_int_eq(a->connect_timeout_ms, b->connect_timeout_ms);
    ck_assert_int_eq(a->first_byte_timeout_ms, b->first_byte_timeout_ms);
    ck_assert_int_eq(a->upstream_idle_timeout_ms,
                     b->upstream_idle_timeout_ms);
    ck_assert_int_eq(a->total_timeout_ms, b->total_timeout_ms);
    ck_assert_int_eq(a->coalesce, b->coalesce);
    ck_assert(a->omitted_temperature == b->omitted_temperature);
    ck_assert_uint_eq(a->max_followers, b->max_followers);
    ck_assert_uint_eq(a->max_flight_bytes, b->max_flight_bytes);
    ck_assert_uint_eq(a->max_reader_lag, b->max_reader_lag);
    ck_assert_uint_eq(a->max_flights, b->max_flights);
    ck_assert_int_eq(a->follower_timeout_ms, b->follower_timeout_ms);
    ck_assert_uint_eq(a->num_tenants, b->num_tenants);
    ck_assert_str_eq(a->admin_listen, b->admin_listen);
    ck_assert_uint_eq(a->num_admin_keys, b->num_admin_keys);
}

/*
 * The sample binds [admin] listen to loopback, where the default is no
 * admin listener: check that, then give 'c' the default, so that the
 * rest compares.
 */
static void
sample_admin_listen(struct gw_config *c)
{
    ck_assert_str_eq(c->admin_listen, "127.0.0.1:8081");
    gw_free(c->admin_listen);
    c->admin_listen = gw_strdup("");
    ck_assert_ptr_nonnull(c->admin_listen);
}

START_TEST(test_sample_loads)
{
    struct gw_config c, d;
    char err[512];

    ck_assert_msg(config_load(sample_path(), &c, err, sizeof(err)) == 0,
                  "%s", err);
    ck_assert_int_eq(config_defaults(&d), 0);
    /* The two lines the sample sets are the defaults too. */
    ck_assert_str_eq(c.listen, "127.0.0.1:8080");
    ck_assert_str_eq(c.upstreams[0].url, "http://127.0.0.1:8000");
    sample_admin_listen(&c);
    assert_config_eq(&c, &d);
    config_release(&c);
    config_release(&d);
}
END_TEST

START_TEST(test_sample_documents_defaults)
{
    struct gw_config c, d;
    struct cfg_file f;
    const char *section, *key;
    char *text = uncomment_sample();
    char err[512];
    size_t i, k;
    int alias;

    /* Uncommented, every "#key = default" line is set: still the
     * defaults, so every value shown in the sample is the real one. */
    ck_assert_msg(config_load_text("uncommented", text, &c, err,
                                   sizeof(err)) == 0, "%s", err);
    ck_assert_int_eq(config_defaults(&d), 0);
    sample_admin_listen(&c);
    assert_config_eq(&c, &d);
    config_release(&c);
    config_release(&d);

    /* And every setting of the schema appears in it. */
    ck_assert_int_eq(cfg_parse_text("uncommented", text, strlen(text), &f,
                                    err, sizeof(err)), 0);
    for (i = 0; config_schema_entry(i, &section, &key, &alias) == 0; i++) {
        if (strcmp(section, "tenant") == 0
            || strcmp(section, "cluster") == 0
            || (strcmp(section, "admin") == 0
                && strncmp(key, "api_key", 7) == 0)) {
            /* [cluster] is off by default: its example is commented. */
            const char *from = strstr(text, section[0] == 'a'
                                            ? "\n[admin]\n"
                                            : section[0] == 'c'
                                            ? "\n#   [cluster]\n" : "\n");
            char line[64];

            /* Shown in the example sections (keys have no default). */
            snprintf(line, sizeof(line), "#   %s = ", key);
            ck_assert_msg(from != NULL && strstr(from, line) != NULL,
                          "etc/gateway.conf does not show %s.%s", section,
                          key);
            continue;
        }
        if (alias)
            continue;           /* said in words */
        for (k = 0; k < f.count; k++)
            if (strcmp(f.entries[k].section, section) == 0
                && strcmp(f.entries[k].key, key) == 0)
                break;
        ck_assert_msg(k < f.count, "etc/gateway.conf does not document "
                      "%s.%s", section, key);
    }
    ck_assert_uint_gt(i, 20);
    cfg_file_release(&f);
    ck_assert_ptr_nonnull(strstr(text, "[tenant "));
    ck_assert_ptr_nonnull(strstr(text, "api_key = "));
    free(text);
}
END_TEST

/* ---- runner ----------------------------------------------------------- */

static Suite *
cfg_suite(void)
{
    Suite *s = suite_create("cfg");
    TCase *tc;

    tc = tcase("syntax_ok");
    tcase_add_loop_test(tc, test_syntax_ok, 0, (int)GW_ARRAY_LEN(syntax_ok));
    tcase_add_test(tc, test_many_entries);
    suite_add_tcase(s, tc);

    tc = tcase("syntax_errors");
    tcase_add_loop_test(tc, test_syntax_err, 0,
                        (int)GW_ARRAY_LEN(syntax_err));
    tcase_add_test(tc, test_syntax_err_small_buffer);
    suite_add_tcase(s, tc);

    tc = tcase("files");
    tcase_add_test(tc, test_file_ok);
    tcase_add_test(tc, test_file_missing);
    tcase_add_test(tc, test_file_directory);
    tcase_add_test(tc, test_file_syntax_error);
    tcase_add_test(tc, test_file_size_limit);
    suite_add_tcase(s, tc);

    tc = tcase("value_parsers");
    tcase_add_loop_test(tc, test_parse_size, 0,
                        (int)GW_ARRAY_LEN(size_cases));
    tcase_add_loop_test(tc, test_parse_duration, 0,
                        (int)GW_ARRAY_LEN(duration_cases));
    tcase_add_loop_test(tc, test_parse_bool, 0,
                        (int)GW_ARRAY_LEN(bool_cases));
    tcase_add_loop_test(tc, test_parse_uint, 0,
                        (int)GW_ARRAY_LEN(uint_cases));
    tcase_add_loop_test(tc, test_parse_decimal, 0,
                        (int)GW_ARRAY_LEN(decimal_cases));
    tcase_add_loop_test(tc, test_parse_percent, 0,
                        (int)GW_ARRAY_LEN(percent_cases));
    tcase_add_test(tc, test_format);
    suite_add_tcase(s, tc);

    tc = tcase("alloc_failure");
    tcase_add_test(tc, test_cfg_alloc_fail_text);
    tcase_add_test(tc, test_cfg_alloc_fail_file);
    suite_add_tcase(s, tc);
    return s;
}

static Suite *
config_suite(void)
{
    Suite *s = suite_create("config");
    TCase *tc;

    tc = tcase("defaults");
    tcase_add_test(tc, test_defaults);
    tcase_add_test(tc, test_defaults_alloc_fail);
    suite_add_tcase(s, tc);

    tc = tcase("load_ok");
    tcase_add_test(tc, test_load_full);
    tcase_add_test(tc, test_load_empty);
    tcase_add_test(tc, test_listeners_apart);
    tcase_add_test(tc, test_load_upstreams_and_routing);
    tcase_add_loop_test(tc, test_load_ok, 0, (int)GW_ARRAY_LEN(load_ok));
    tcase_add_test(tc, test_cluster);
    tcase_add_loop_test(tc, test_cluster_password_file, 0,
                        (int)GW_ARRAY_LEN(pwfile_cases));
    tcase_add_test(tc, test_url_trailing_slash);
    tcase_add_test(tc, test_load_file_ok);
    suite_add_tcase(s, tc);

    tc = tcase("load_errors");
    tcase_add_loop_test(tc, test_load_err, 0, (int)GW_ARRAY_LEN(load_err));
    tcase_add_test(tc, test_load_err_limits);
    tcase_add_test(tc, test_load_file_errors);
    suite_add_tcase(s, tc);

    tc = tcase("alloc_failure");
    tcase_add_test(tc, test_load_alloc_fail);
    tcase_add_test(tc, test_load_file_alloc_fail);
    suite_add_tcase(s, tc);

    tc = tcase("sample_file");
    tcase_add_test(tc, test_sample_loads);
    tcase_add_test(tc, test_sample_documents_defaults);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    SRunner *sr = srunner_create(cfg_suite());

    srunner_add_suite(sr, config_suite());
    return test_run(sr);
}
