/* SPDX-License-Identifier: MIT */
/*
 * check_http_chunked.c - unit tests for common/http_chunked.c, the
 * chunked body decoder.
 *
 * A table of (input, expected result, note).  Every input is copied so
 * that its last byte sits right before a PROT_NONE page (testutil.h's
 * arena), and fed whole, a byte at a time, and cut in two at every
 * offset.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "buf.h"
#include "http_chunked.h"
#include "testutil.h"
#include "util.h"

/* A string literal as (pointer, length), so inputs may hold NUL bytes. */
#define S(lit) lit, sizeof(lit) - 1

/* ---- chunked decoder ----------------------------------------------- */

struct chunk_case {
    const char *in;
    size_t len;
    const char *out;            /* decoded data (rc 1 and 0 only) */
    size_t out_len;
    size_t rest;                /* rc 1: bytes after the message */
    int rc;                     /* 1 complete, 0 incomplete, or GW_E* */
    size_t limit;               /* limit of the output buffer, 0: 1 MiB */
    const char *note;
};

#define OK(in, out, rest, note) { S(in), S(out), rest, 1, 0, note }
#define MORE(in, out, note) { S(in), S(out), 0, 0, 0, note }
#define BAD(in, rc, note) { S(in), NULL, 0, 0, rc, 0, note }
#define BIG(in, limit, note) { S(in), NULL, 0, 0, GW_ETOOBIG, limit, note }

static const struct chunk_case chunk_cases[] = {
    OK("0\r\n\r\n", "", 0, "empty body"),
    OK("5\r\nhello\r\n0\r\n\r\n", "hello", 0, "one chunk"),
    OK("5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n", "hello world", 0,
       "two chunks"),
    OK("1\r\na\r\n1\r\nb\r\n1\r\nc\r\n0\r\n\r\n", "abc", 0, "tiny chunks"),
    OK("A\r\n0123456789\r\n0\r\n\r\n", "0123456789", 0, "upper-case hex"),
    OK("a\r\n0123456789\r\n0\r\n\r\n", "0123456789", 0, "lower-case hex"),
    OK("10\r\n0123456789abcdef\r\n0\r\n\r\n", "0123456789abcdef", 0,
       "two-digit size"),
    OK("0005\r\nhello\r\n000\r\n\r\n", "hello", 0, "leading zeros"),
    OK("4\r\n\r\n\r\n\r\n0\r\n\r\n", "\r\n\r\n", 0, "CRLF inside the data"),
    OK("3\r\na\0b\r\n0\r\n\r\n", "a\0b", 0, "NUL inside the data"),
    OK("5;a\r\nhello\r\n0\r\n\r\n", "hello", 0, "extension name"),
    OK("5;a=b\r\nhello\r\n0\r\n\r\n", "hello", 0, "extension with token"),
    OK("5;a=b;c;d=e\r\nhello\r\n0\r\n\r\n", "hello", 0, "several extensions"),
    OK("5 ;a\r\nhello\r\n0\r\n\r\n", "hello", 0, "BWS before ;"),
    OK("5 \t; a = b ;c\r\nhello\r\n0\r\n\r\n", "hello", 0,
       "BWS around ; and ="),
    OK("5;a=\"q d \\\" \\\\ x\"\r\nhello\r\n0\r\n\r\n", "hello", 0,
       "quoted extension value with quoted-pairs"),
    OK("5;a=\"\"\r\nhello\r\n0\r\n\r\n", "hello", 0, "empty quoted value"),
    OK("5;a=\"x\";b=\"\xff\"\r\nhello\r\n0\r\n\r\n", "hello", 0,
       "obs-text in a quoted value"),
    OK("5;a=\"x\" ;b\r\nhello\r\n0\r\n\r\n", "hello", 0,
       "BWS after a quoted value"),
    OK("0;last=1\r\n\r\n", "", 0, "extension on the last chunk"),
    OK("0\r\nX-Trailer: v\r\n\r\n", "", 0, "trailer field"),
    OK("2\r\nab\r\n0\r\nA: 1\r\nB:\r\nC: x y \xfe\r\n\r\n", "ab", 0,
       "several trailer fields"),
    OK("0\r\n\r\nGET / HTTP/1.1\r\n", "", 16, "the next request is left"),
    OK("1\r\nx\r\n0\r\n\r\n0\r\n\r\n", "x", 5, "a second body is left"),
    MORE("", "", "nothing yet"),
    MORE("5", "", "size only"),
    MORE("5\r\nhel", "hel", "partial data is delivered"),
    MORE("5\r\nhello\r\n", "hello", "waiting for the next size"),
    MORE("5;a=\"x", "", "inside a quoted extension"),
    MORE("0\r\nX: y\r\n", "", "inside the trailer section"),
    MORE("0\r\n\r", "", "before the last LF"),
    BAD("x\r\n", GW_EPARSE, "not hex"),
    BAD("\r\n", GW_EPARSE, "empty size"),
    BAD(" 5\r\n", GW_EPARSE, "space before the size"),
    BAD("5 \r\nhello\r\n0\r\n\r\n", GW_EPARSE, "space after the size"),
    BAD("5\t\r\n", GW_EPARSE, "HTAB after the size"),
    BAD("-5\r\n", GW_EPARSE, "negative"),
    BAD("+5\r\n", GW_EPARSE, "plus sign"),
    BAD("0x5\r\n", GW_EPARSE, "0x prefix"),
    BAD("5g\r\n", GW_EPARSE, "junk after hex"),
    BAD("5\nhello\r\n", GW_EPARSE, "bare LF after the size"),
    BAD("5\rhello\r\n", GW_EPARSE, "bare CR after the size"),
    BAD("5\r\nhello0\r\n\r\n", GW_EPARSE, "no CRLF after data"),
    BAD("5\r\nhello\n0\r\n\r\n", GW_EPARSE, "bare LF after data"),
    BAD("5\r\nhello\r\r\n", GW_EPARSE, "CR CR after data"),
    BAD("5\r\nhelloo\r\n0\r\n\r\n", GW_EPARSE, "data longer than size"),
    BAD("ffffffffffffffffff\r\n", GW_EPARSE, "chunk-size overflow"),
    BAD("10000000000000000\r\n", GW_EPARSE, "2^64 overflows"),
    BAD("5;\r\nhello\r\n", GW_EPARSE, "empty extension name"),
    BAD("5;=b\r\n", GW_EPARSE, "extension without a name"),
    BAD("5;a=\r\n", GW_EPARSE, "extension without a value"),
    BAD("5;a \r\n", GW_EPARSE, "BWS before CRLF"),
    BAD("5;a=b \r\n", GW_EPARSE, "BWS after a value before CRLF"),
    BAD("5;a b\r\n", GW_EPARSE, "two names"),
    BAD("5;a=b c\r\n", GW_EPARSE, "two values"),
    BAD("5;a=(b)\r\n", GW_EPARSE, "value not a token"),
    BAD("5;a=b(\r\n", GW_EPARSE, "junk after a token value"),
    BAD("5;a=b=c\r\n", GW_EPARSE, "two equals signs"),
    BAD("5;a=\"x\"y\r\n", GW_EPARSE, "junk after a quoted value"),
    BAD("5;a=\"\x01\"\r\n", GW_EPARSE, "CTL in a quoted value"),
    BAD("5;a=\"x\r\n", GW_EPARSE, "CR in a quoted value"),
    BAD("5;a=\"\\\x7f\"\r\n", GW_EPARSE, "quoted-pair of DEL"),
    BAD("5;a\x00\r\n", GW_EPARSE, "NUL in an extension"),
    BAD("0\r\nX: a\r\n b\r\n\r\n", GW_EPARSE, "obs-fold in trailers"),
    BAD("0\r\nX : a\r\n\r\n", GW_EPARSE, "space before colon in trailer"),
    BAD("0\r\nX\r\n\r\n", GW_EPARSE, "trailer without colon"),
    BAD("0\r\n: a\r\n\r\n", GW_EPARSE, "trailer without a name"),
    BAD("0\r\nX: a\x01\r\n\r\n", GW_EPARSE, "CTL in a trailer value"),
    BAD("0\r\nX: a\n\r\n", GW_EPARSE, "bare LF ending a trailer"),
    BAD("0\r\nX: a\rX\r\n\r\n", GW_EPARSE, "bare CR in a trailer"),
    BAD("0\r\n\n", GW_EPARSE, "bare LF as the last line"),
    BAD("0\r\n\r\r", GW_EPARSE, "CR CR at the end"),
    BIG("5\r\nhello\r\n0\r\n\r\n", 4, "chunk larger than the limit"),
    BIG("3\r\nabc\r\n3\r\ndef\r\n0\r\n\r\n", 5, "sum larger than the limit"),
    BIG("ffffffffffffffff\r\n", 0, "largest size: valid, but too big"),
    { S("5\r\nhello\r\n0\r\n\r\n"), S("hello"), 0, 1, 5,
      "body exactly at the limit" },
};

/*
 * Feed c->in cut into pieces that start at the offsets in cuts[] (the
 * first is 0), each piece copied against the guard page.  OUT *consumed.
 */
static int
feed_pieces(const struct chunk_case *c, const size_t *cuts, size_t ncuts,
            struct buf *out, size_t *consumed)
{
    struct http_chunked d;
    size_t i, used, from, to;
    int rc = 0;

    http_chunked_init(&d);
    *consumed = 0;
    for (i = 0; i < ncuts; i++) {
        from = cuts[i];
        to = i + 1 < ncuts ? cuts[i + 1] : c->len;
        rc = http_chunked_feed(&d, guarded(c->in + from, to - from),
                               to - from, out, &used);
        ck_assert_uint_le(used, to - from);
        *consumed += used;
        if (rc != 0)
            break;
        ck_assert_uint_eq(used, to - from);     /* all taken if not done */
    }
    return rc;
}

static void
check_chunk_result(const struct chunk_case *c, int rc, size_t consumed,
                   const struct buf *out, const char *how)
{
    ck_assert_msg(rc == c->rc, "%s (%s): rc %d, want %d", c->note, how, rc,
                  c->rc);
    if (rc == 1)
        ck_assert_uint_eq(consumed, c->len - c->rest);
    if (rc == 0)
        ck_assert_uint_eq(consumed, c->len);
    if (rc >= 0) {
        ck_assert_msg(buf_len(out) == c->out_len
                      && memcmp(buf_ptr(out), c->out, c->out_len) == 0,
                      "%s (%s): output", c->note, how);
    }
}

START_TEST(test_chunked_table)
{
    const struct chunk_case *c = &chunk_cases[_i];
    size_t cuts[3], consumed, k, *bytes;
    struct buf out;
    int rc;

    buf_init(&out, c->limit != 0 ? c->limit : 1 << 20);

    cuts[0] = 0;
    rc = feed_pieces(c, cuts, 1, &out, &consumed);
    check_chunk_result(c, rc, consumed, &out, "whole");

    /* byte at a time */
    bytes = malloc((c->len + 1) * sizeof(*bytes));
    ck_assert_ptr_nonnull(bytes);
    bytes[0] = 0;
    for (k = 0; k < c->len; k++)
        bytes[k] = k;
    buf_reset(&out);
    rc = feed_pieces(c, bytes, c->len > 0 ? c->len : 1, &out, &consumed);
    check_chunk_result(c, rc, consumed, &out, "byte at a time");
    free(bytes);

    /* two pieces, cut at every offset */
    for (k = 1; k < c->len; k++) {
        cuts[1] = k;
        buf_reset(&out);
        rc = feed_pieces(c, cuts, 2, &out, &consumed);
        check_chunk_result(c, rc, consumed, &out, "two pieces");
    }
    buf_release(&out);
}
END_TEST

START_TEST(test_chunked_done)
{
    struct http_chunked d;
    struct buf out;
    size_t used;

    buf_init(&out, 64);
    http_chunked_init(&d);
    ck_assert_int_eq(http_chunked_feed(&d, GUARDED("0\r\n\r\n"), &out,
                                       &used), 1);
    ck_assert_uint_eq(used, 5);
    /* A finished decoder takes nothing more. */
    ck_assert_int_eq(http_chunked_feed(&d, GUARDED("1\r\n"), &out,
                                       &used), 1);
    ck_assert_uint_eq(used, 0);
    buf_release(&out);
}
END_TEST

START_TEST(test_chunked_line_limits)
{
    static char in[20000];
    struct http_chunked d;
    struct buf out;
    size_t used, n;
    int rc;

    buf_init(&out, 1 << 20);

    /* leading zeros beyond the line bound */
    memset(in, '0', 5000);
    http_chunked_init(&d);
    rc = http_chunked_feed(&d, guarded(in, 5000), 5000, &out, &used);
    ck_assert_int_eq(rc, GW_EPARSE);

    /* a long extension, fed in small pieces: still bounded */
    http_chunked_init(&d);
    ck_assert_int_eq(http_chunked_feed(&d, GUARDED("1;a="), &out, &used),
                     0);
    memset(in, 'x', 100);
    for (n = 0; n < 100; n++) {
        rc = http_chunked_feed(&d, guarded(in, 100), 100, &out, &used);
        if (rc != 0)
            break;
    }
    ck_assert_int_eq(rc, GW_EPARSE);
    ck_assert_uint_lt(n, 45);

    /* an extension just inside the bound is fine */
    n = (size_t)snprintf(in, sizeof(in), "1;a=");
    memset(in + n, 'x', 4094 - n);
    memcpy(in + 4094, "\r\nx\r\n0\r\n\r\n", 11);
    http_chunked_init(&d);
    buf_reset(&out);
    rc = http_chunked_feed(&d, guarded(in, 4094 + 10), 4094 + 10, &out,
                           &used);
    ck_assert_int_eq(rc, 1);

    /* the trailer section is bounded as a whole */
    n = (size_t)snprintf(in, sizeof(in), "0\r\n");
    while (n < 10000)
        n += (size_t)snprintf(in + n, sizeof(in) - n, "X-T: 0123456789\r\n");
    http_chunked_init(&d);
    rc = http_chunked_feed(&d, guarded(in, n), n, &out, &used);
    ck_assert_int_eq(rc, GW_ETOOBIG);
    buf_release(&out);
}
END_TEST

START_TEST(test_chunked_enomem)
{
    struct http_chunked d;
    struct buf out;
    size_t used;

    buf_init(&out, 1 << 20);
    http_chunked_init(&d);
    alloc_fail_after(1, 0);
    ck_assert_int_eq(http_chunked_feed(&d, GUARDED("5\r\nhello\r\n"),
                                       &out, &used), GW_ENOMEM);
    ck_assert_int_eq(alloc_failures(), 1);
    alloc_fail_after(0, 0);
    buf_release(&out);
}
END_TEST

static Suite *
http_chunked_suite(void)
{
    Suite *s = suite_create("http_chunked");
    TCase *tc;

    tc = tcase_create("chunked");
    tcase_add_checked_fixture(tc, arena_setup, arena_teardown);
    tcase_add_loop_test(tc, test_chunked_table, 0,
                        (int)GW_ARRAY_LEN(chunk_cases));
    tcase_add_test(tc, test_chunked_done);
    tcase_add_test(tc, test_chunked_line_limits);
    tcase_add_test(tc, test_chunked_enomem);
    tcase_set_timeout(tc, 30);
    suite_add_tcase(s, tc);

    return s;
}

int
main(void)
{
    return test_run(srunner_create(http_chunked_suite()));
}
