/* SPDX-License-Identifier: MIT */
/*
 * check_buf.c - unit tests for common/buf.c, common/util.c and
 * common/alloc.c: the bounded buffer, the small helpers and the fault
 * injection that every other test relies on.
 *
 * The buffer's promises checked here: never past 'limit'; a failed append
 * (GW_ETOOBIG or GW_ENOMEM) leaves it exactly as it was; a NUL always
 * follows the bytes; views survive buf_consume() but not buf_compact().
 */
#include <check.h>

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "buf.h"
#include "util.h"
#include "testutil.h"

/* The invariant every operation keeps: a NUL right after the bytes. */
static void
assert_terminated(const struct buf *b)
{
    ck_assert_uint_le(b->off, b->len);
    ck_assert_uint_le(b->len, b->limit);
    if (b->data != NULL) {
        ck_assert_uint_lt(b->len, b->cap);
        ck_assert_int_eq(b->data[b->len], '\0');
    }
    ck_assert_uint_eq(strlen(buf_ptr(b)), buf_len(b));
}

/* A snapshot to prove that a failed call changed nothing. */
struct snap {
    char *data;
    size_t off, len, cap, limit;
    char bytes[256];
};

static void
take_snap(const struct buf *b, struct snap *s)
{
    s->data = b->data;
    s->off = b->off;
    s->len = b->len;
    s->cap = b->cap;
    s->limit = b->limit;
    snprintf(s->bytes, sizeof(s->bytes), "%s", buf_ptr(b));
}

static void
assert_unchanged(const struct buf *b, const struct snap *s)
{
    ck_assert_ptr_eq(b->data, s->data);
    ck_assert_uint_eq(b->cap, s->cap);
    ck_assert_uint_eq(b->limit, s->limit);
    ck_assert_uint_eq(buf_len(b), s->len - s->off);
    ck_assert_str_eq(buf_ptr(b), s->bytes);
    assert_terminated(b);
}

/* ---- buf: lifecycle --------------------------------------------------- */

START_TEST(test_init_release)
{
    struct buf b;

    buf_init(&b, 100);
    ck_assert_ptr_null(b.data);
    ck_assert_uint_eq(buf_len(&b), 0);
    ck_assert_str_eq(buf_ptr(&b), "");     /* usable before any append */
    ck_assert_uint_eq(b.limit, 100);
    buf_release(&b);                        /* nothing allocated: fine */
    ck_assert_int_eq(buf_append_str(&b, "abc"), 0);
    assert_terminated(&b);
    buf_release(&b);
    ck_assert_ptr_null(b.data);
    ck_assert_uint_eq(b.len, 0);
    ck_assert_uint_eq(b.cap, 0);
    ck_assert_uint_eq(b.limit, 100);        /* the limit stays */
    ck_assert_int_eq(buf_append_str(&b, "again"), 0);  /* reusable */
    ck_assert_str_eq(buf_ptr(&b), "again");
    buf_release(&b);
}
END_TEST

START_TEST(test_new_free)
{
    struct buf *b = buf_new(16);

    ck_assert_ptr_nonnull(b);
    ck_assert_uint_eq(b->limit, 16);
    ck_assert_int_eq(buf_append_str(b, "x"), 0);
    buf_free(b);
    buf_free(NULL);

    alloc_fail_after(1, 0);
    ck_assert_ptr_null(buf_new(16));
    alloc_fail_after(0, 0);
}
END_TEST

START_TEST(test_reset)
{
    struct buf b;
    char *data;
    size_t cap;

    buf_init(&b, 100);
    ck_assert_int_eq(buf_append_str(&b, "hello"), 0);
    buf_consume(&b, 2);
    data = b.data;
    cap = b.cap;
    buf_reset(&b);
    ck_assert_uint_eq(buf_len(&b), 0);
    ck_assert_ptr_eq(b.data, data);         /* memory kept */
    ck_assert_uint_eq(b.cap, cap);
    assert_terminated(&b);
    buf_reset(&b);
    ck_assert_int_eq(buf_append_str(&b, "x"), 0);
    ck_assert_str_eq(buf_ptr(&b), "x");
    buf_release(&b);

    buf_init(&b, 10);
    buf_reset(&b);                          /* never allocated: fine */
    ck_assert_ptr_null(b.data);
}
END_TEST

/* ---- buf: limits ------------------------------------------------------ */

START_TEST(test_limit_exact)
{
    struct buf b;
    struct snap s;

    buf_init(&b, 10);
    ck_assert_int_eq(buf_append(&b, "0123456789", 10), 0);
    ck_assert_uint_eq(buf_len(&b), 10);
    assert_terminated(&b);
    ck_assert_uint_le(b.cap, 11);           /* never allocates past limit+1 */
    take_snap(&b, &s);
    ck_assert_int_eq(buf_append(&b, "x", 1), GW_ETOOBIG);
    assert_unchanged(&b, &s);
    ck_assert_int_eq(buf_append(&b, "", 0), 0);     /* nothing fits */
    assert_unchanged(&b, &s);
    ck_assert_int_eq(buf_printf(&b, "%d", 1), GW_ETOOBIG);
    assert_unchanged(&b, &s);
    buf_release(&b);
}
END_TEST

START_TEST(test_limit_one_call)
{
    struct buf b;
    struct snap s;

    /* A single append past the limit is refused whole, not truncated. */
    buf_init(&b, 10);
    ck_assert_int_eq(buf_append_str(&b, "abc"), 0);
    take_snap(&b, &s);
    ck_assert_int_eq(buf_append(&b, "defghijkl", 9), GW_ETOOBIG);
    assert_unchanged(&b, &s);
    ck_assert_int_eq(buf_append(&b, "defghij", 7), 0);
    ck_assert_str_eq(buf_ptr(&b), "abcdefghij");
    buf_release(&b);

    /* The first append can fail too, before anything is allocated. */
    buf_init(&b, 4);
    ck_assert_int_eq(buf_append_str(&b, "12345"), GW_ETOOBIG);
    ck_assert_ptr_null(b.data);
    ck_assert_str_eq(buf_ptr(&b), "");
    buf_release(&b);
}
END_TEST

START_TEST(test_limit_zero)
{
    struct buf b;

    buf_init(&b, 0);
    ck_assert_int_eq(buf_append(&b, "", 0), 0);
    assert_terminated(&b);
    ck_assert_int_eq(buf_append(&b, "x", 1), GW_ETOOBIG);
    ck_assert_str_eq(buf_ptr(&b), "");
    buf_release(&b);
}
END_TEST

START_TEST(test_limit_huge_request)
{
    struct buf b;
    struct snap s;
    char *dst = NULL;

    /* Sizes that would overflow len + n are refused, not wrapped. */
    buf_init(&b, SIZE_MAX);
    ck_assert_int_eq(buf_append_str(&b, "abc"), 0);
    take_snap(&b, &s);
    ck_assert_int_eq(buf_reserve(&b, SIZE_MAX, &dst), GW_ETOOBIG);
    ck_assert_int_eq(buf_reserve(&b, SIZE_MAX - 3, &dst), GW_ETOOBIG);
    ck_assert_ptr_null(dst);
    assert_unchanged(&b, &s);
    buf_release(&b);
}
END_TEST

START_TEST(test_limit_counts_consumed)
{
    struct buf b;
    struct snap s;

    /* 'limit' bounds len, consumed bytes included, until buf_compact()
     * (buf.h: "hard limit on len"); then the space is back. */
    buf_init(&b, 10);
    ck_assert_int_eq(buf_append_str(&b, "01234567"), 0);
    buf_consume(&b, 5);
    take_snap(&b, &s);
    ck_assert_int_eq(buf_append_str(&b, "abcde"), GW_ETOOBIG);
    assert_unchanged(&b, &s);
    buf_compact(&b);
    ck_assert_int_eq(buf_append_str(&b, "abcde"), 0);
    ck_assert_str_eq(buf_ptr(&b), "567abcde");
    buf_release(&b);
}
END_TEST

START_TEST(test_toobig_after_consume_all)
{
    struct buf b;

    /* All consumed, then a refused append: the buffer must still read as
     * an empty C string (regression: the old bytes showed through). */
    buf_init(&b, 10);
    ck_assert_int_eq(buf_append_str(&b, "abc"), 0);
    buf_consume(&b, 3);
    ck_assert_int_eq(buf_append_str(&b, "0123456789x"), GW_ETOOBIG);
    ck_assert_uint_eq(buf_len(&b), 0);
    ck_assert_str_eq(buf_ptr(&b), "");
    assert_terminated(&b);
    /* And the whole limit is usable again. */
    ck_assert_int_eq(buf_append_str(&b, "0123456789"), 0);
    ck_assert_str_eq(buf_ptr(&b), "0123456789");
    buf_release(&b);
}
END_TEST

/* ---- buf: growth and allocation failure ------------------------------- */

START_TEST(test_growth)
{
    struct buf b;
    char expect[5001];
    int i;

    buf_init(&b, 1 << 20);
    for (i = 0; i < 5000; i++) {
        ck_assert_int_eq(buf_append(&b, &"abcdefghij"[i % 10], 1), 0);
        expect[i] = (char)('a' + i % 10);
    }
    expect[5000] = '\0';
    ck_assert_str_eq(buf_ptr(&b), expect);
    assert_terminated(&b);
    buf_release(&b);
}
END_TEST

START_TEST(test_alloc_fail_unchanged)
{
    struct buf b;
    struct snap s;
    char big[300];

    memset(big, 'z', sizeof(big));
    buf_init(&b, 4096);
    ck_assert_int_eq(buf_append_str(&b, "keep"), 0);
    take_snap(&b, &s);
    alloc_fail_after(1, 0);
    ck_assert_int_eq(buf_append(&b, big, sizeof(big)), GW_ENOMEM);
    alloc_fail_after(0, 0);
    assert_unchanged(&b, &s);

    alloc_fail_after(1, 0);
    ck_assert_int_eq(buf_printf(&b, "%0300d", 7), GW_ENOMEM);
    alloc_fail_after(0, 0);
    assert_unchanged(&b, &s);

    /* Appends that fit the current capacity need no allocation. */
    alloc_fail_after(1, 1);
    ck_assert_int_eq(buf_append_str(&b, "!"), 0);
    alloc_fail_after(0, 0);
    ck_assert_str_eq(buf_ptr(&b), "keep!");
    buf_release(&b);

    /* The first allocation failing leaves a never-allocated buffer. */
    buf_init(&b, 4096);
    alloc_fail_after(1, 0);
    ck_assert_int_eq(buf_append_str(&b, "x"), GW_ENOMEM);
    alloc_fail_after(0, 0);
    ck_assert_ptr_null(b.data);
    ck_assert_uint_eq(b.len, 0);
    buf_release(&b);
}
END_TEST

/* ---- buf: reserve / commit -------------------------------------------- */

START_TEST(test_reserve_commit)
{
    struct buf b;
    struct snap s;
    char *dst;

    buf_init(&b, 16);
    ck_assert_int_eq(buf_append_str(&b, "ab"), 0);
    ck_assert_int_eq(buf_reserve(&b, 10, &dst), 0);
    ck_assert_ptr_eq(dst, b.data + 2);
    memcpy(dst, "cdefghijkl", 10);
    buf_commit(&b, 3);                      /* fewer than reserved */
    ck_assert_str_eq(buf_ptr(&b), "abcde");
    assert_terminated(&b);

    ck_assert_int_eq(buf_reserve(&b, 11, &dst), 0);     /* up to limit */
    buf_commit(&b, 0);
    ck_assert_str_eq(buf_ptr(&b), "abcde");
    take_snap(&b, &s);
    ck_assert_int_eq(buf_reserve(&b, 12, &dst), GW_ETOOBIG);
    assert_unchanged(&b, &s);

    ck_assert_int_eq(buf_reserve(&b, 11, &dst), 0);
    memcpy(dst, "fghijklmnop", 11);
    buf_commit(&b, 11);
    ck_assert_str_eq(buf_ptr(&b), "abcdefghijklmnop");
    ck_assert_uint_eq(buf_len(&b), 16);
    assert_terminated(&b);
    buf_release(&b);
}
END_TEST

START_TEST(test_reserve_reuses_consumed)
{
    struct buf b;
    char *dst, *data;

    /* Once everything is consumed, reserve writes from the start again,
     * as a read() loop on a connection buffer wants. */
    buf_init(&b, 8);
    ck_assert_int_eq(buf_append_str(&b, "12345678"), 0);
    data = b.data;
    buf_consume(&b, 8);
    ck_assert_int_eq(buf_reserve(&b, 8, &dst), 0);
    ck_assert_ptr_eq(dst, data);
    memcpy(dst, "abcdefgh", 8);
    buf_commit(&b, 8);
    ck_assert_str_eq(buf_ptr(&b), "abcdefgh");
    buf_release(&b);
}
END_TEST

/* ---- buf: consume / compact ------------------------------------------- */

START_TEST(test_consume_compact)
{
    struct buf b;
    const char *view;

    buf_init(&b, 64);
    ck_assert_int_eq(buf_append_str(&b, "GET / HTTP/1.1\r\nrest"), 0);
    view = buf_ptr(&b);
    buf_consume(&b, 16);
    /* Consuming moves nothing: the earlier view still reads the same. */
    ck_assert_int_eq(memcmp(view, "GET / HTTP/1.1\r\n", 16), 0);
    ck_assert_str_eq(buf_ptr(&b), "rest");
    ck_assert_uint_eq(buf_len(&b), 4);
    assert_terminated(&b);

    buf_compact(&b);
    ck_assert_uint_eq(b.off, 0);
    ck_assert_str_eq(b.data, "rest");
    ck_assert_str_eq(buf_ptr(&b), "rest");
    assert_terminated(&b);
    buf_compact(&b);                        /* nothing to move */
    ck_assert_str_eq(buf_ptr(&b), "rest");

    buf_consume(&b, 4);
    buf_compact(&b);
    ck_assert_uint_eq(buf_len(&b), 0);
    ck_assert_str_eq(buf_ptr(&b), "");
    assert_terminated(&b);
    ck_assert_int_eq(buf_append_str(&b, "next"), 0);
    ck_assert_str_eq(buf_ptr(&b), "next");
    buf_release(&b);

    buf_init(&b, 8);
    buf_compact(&b);                        /* never allocated: fine */
    ck_assert_ptr_null(b.data);
}
END_TEST

START_TEST(test_consume_zero)
{
    struct buf b;

    buf_init(&b, 8);
    ck_assert_int_eq(buf_append_str(&b, "ab"), 0);
    buf_consume(&b, 0);
    ck_assert_str_eq(buf_ptr(&b), "ab");
    buf_release(&b);
}
END_TEST

/* ---- buf: take -------------------------------------------------------- */

START_TEST(test_take)
{
    struct buf b;
    size_t len = 99;
    char *s;

    buf_init(&b, 64);
    ck_assert_ptr_null(buf_take(&b, &len));    /* never allocated */
    ck_assert_uint_eq(len, 0);

    ck_assert_int_eq(buf_append_str(&b, "xxhello"), 0);
    buf_consume(&b, 2);
    s = buf_take(&b, &len);
    ck_assert_str_eq(s, "hello");              /* compacted first */
    ck_assert_uint_eq(len, 5);
    ck_assert_ptr_null(b.data);
    ck_assert_uint_eq(buf_len(&b), 0);
    ck_assert_uint_eq(b.limit, 64);
    gw_free(s);

    /* Usable again after a take; NULL len is allowed. */
    ck_assert_int_eq(buf_append_str(&b, "again"), 0);
    s = buf_take(&b, NULL);
    ck_assert_str_eq(s, "again");
    gw_free(s);

    /* An allocated but empty buffer hands over "". */
    ck_assert_int_eq(buf_append_str(&b, "x"), 0);
    buf_reset(&b);
    s = buf_take(&b, &len);
    ck_assert_ptr_nonnull(s);
    ck_assert_str_eq(s, "");
    ck_assert_uint_eq(len, 0);
    gw_free(s);
}
END_TEST

/* ---- buf: printf ------------------------------------------------------ */

START_TEST(test_printf)
{
    struct buf b;
    struct snap s;
    int i;

    buf_init(&b, 1 << 16);
    ck_assert_int_eq(buf_printf(&b, "%s=%d", "a", 1), 0);
    ck_assert_int_eq(buf_printf(&b, "%s", ""), 0);
    ck_assert_int_eq(buf_printf(&b, " %05.1f|%c", 2.25, 'z'), 0);
    ck_assert_str_eq(buf_ptr(&b), "a=1 002.2|z");
    for (i = 0; i < 1000; i++)
        ck_assert_int_eq(buf_printf(&b, "%04d", i), 0);
    ck_assert_uint_eq(buf_len(&b), 11 + 4000);
    ck_assert_int_eq(memcmp(buf_ptr(&b) + buf_len(&b) - 4, "0999", 4), 0);
    assert_terminated(&b);
    buf_release(&b);

    /* Exactly to the limit, then one past it. */
    buf_init(&b, 8);
    ck_assert_int_eq(buf_printf(&b, "%08d", 42), 0);
    ck_assert_str_eq(buf_ptr(&b), "00000042");
    buf_reset(&b);
    ck_assert_int_eq(buf_printf(&b, "%s", "abc"), 0);
    take_snap(&b, &s);
    ck_assert_int_eq(buf_printf(&b, "%06d", 1), GW_ETOOBIG);
    assert_unchanged(&b, &s);
    buf_release(&b);
}
END_TEST

/*
 * buf_printf() formats into the room the buffer has when the line fits
 * it, else measures and grows: every length around the room's edge
 * (one less than the room, the room, one more) comes out whole.
 */
START_TEST(test_printf_at_the_room_edge)
{
    struct buf b;
    char want[400];

    for (size_t n = 1; n < 300; n++) {
        buf_init(&b, 1 << 16);
        ck_assert_int_eq(buf_append(&b, "ab", 2), 0);     /* cap 64 */
        buf_consume(&b, 1);                     /* partly read */
        ck_assert_int_eq(buf_printf(&b, "%0*d", (int)n, 7), 0);
        memset(want, '0', n);
        want[0] = n == 1 ? '7' : '0';
        want[n - 1] = '7';
        ck_assert_uint_eq(buf_len(&b), 1 + n);
        ck_assert_int_eq(buf_ptr(&b)[0], 'b');
        ck_assert_int_eq(memcmp(buf_ptr(&b) + 1, want, n), 0);
        assert_terminated(&b);
        ck_assert_int_eq(buf_printf(&b, "|%s", "z"), 0);
        ck_assert_str_eq(buf_ptr(&b) + 1 + n, "|z");
        buf_release(&b);
    }
}
END_TEST

START_TEST(test_append_u64_and_hex)
{
    struct buf b;
    char d[GW_U64_DIGITS + 1];
    char h[9];
    const unsigned char bytes[4] = { 0x00, 0x9f, 0xa0, 0xff };

    buf_init(&b, 64);
    ck_assert_int_eq(buf_append_u64(&b, 0), 0);
    ck_assert_int_eq(buf_append_str(&b, " "), 0);
    ck_assert_int_eq(buf_append_u64(&b, UINT64_MAX), 0);
    ck_assert_int_eq(buf_append_str(&b, " "), 0);
    ck_assert_int_eq(buf_append_u64(&b, 1000000007), 0);
    ck_assert_str_eq(buf_ptr(&b), "0 18446744073709551615 1000000007");
    buf_release(&b);
    d[gw_fmt_u64(10, d)] = '\0';
    ck_assert_str_eq(d, "10");
    ck_assert_uint_eq(gw_fmt_u64(UINT64_MAX, d), GW_U64_DIGITS);
    gw_hex(bytes, sizeof(bytes), h);
    ck_assert_str_eq(h, "009fa0ff");
    gw_hex(bytes, 0, h);
    ck_assert_str_eq(h, "");
}
END_TEST

/* ---- util ------------------------------------------------------------- */

static const struct {
    const char *p;
    size_t n;
    const char *s;
    int eq;
} strieq_cases[] = {
    { "Content-Length", 14, "content-length", 1 },
    { "CONTENT-LENGTH", 14, "content-length", 1 },
    { "content-length", 14, "Content-Length", 1 },
    { "", 0, "", 1 },
    { "abc", 0, "", 1 },                    /* only n bytes count */
    { "hostname", 4, "host", 1 },
    { "host", 4, "hostname", 0 },           /* s longer than the view */
    { "hostname", 8, "host", 0 },           /* view longer than s */
    { "abc", 3, "abd", 0 },
    { "a\0c", 3, "a", 0 },                  /* NUL inside the view */
    { "[", 1, "{", 0 },                     /* not folded: '[' is 'A'-6 */
    { "@", 1, "`", 0 },                     /* 'A'-1 vs 'a'-1 */
    { "\xc3\x89", 2, "\xc3\xa9", 0 },       /* ASCII folding only */
};

START_TEST(test_strieq)
{
    ck_assert_int_eq(gw_strieq(strieq_cases[_i].p, strieq_cases[_i].n,
                               strieq_cases[_i].s), strieq_cases[_i].eq);
}
END_TEST

static const struct {
    const char *s;
    long lo, hi;
    int rc;
    long v;
    const char *note;
} long_cases[] = {
    { "0", 0, 10, 0, 0, "lower bound" },
    { "10", 0, 10, 0, 10, "upper bound" },
    { "11", 0, 10, GW_EINVAL, 0, "above range" },
    { "-1", 0, 10, GW_EINVAL, 0, "below range" },
    { "-5", -10, 10, 0, -5, "negative in range" },
    { "", 0, 10, GW_EINVAL, 0, "empty" },
    { "3x", 0, 10, GW_EINVAL, 0, "trailing bytes" },
    { "-", -10, 10, GW_EINVAL, 0, "sign only" },
    { "99999999999999999999", 0, 10, GW_EINVAL, 0, "overflow" },
};

START_TEST(test_parse_long)
{
    long v = -12345;

    ck_assert_msg(gw_parse_long(long_cases[_i].s, long_cases[_i].lo,
                                long_cases[_i].hi, &v) == long_cases[_i].rc,
                  "%s", long_cases[_i].note);
    if (long_cases[_i].rc == 0)
        ck_assert_int_eq(v, long_cases[_i].v);
    else
        ck_assert_int_eq(v, -12345);        /* untouched on failure */
}
END_TEST

/* gw_parse_uint(): 1*DIGIT up to 'max', the first bad byte deciding. */
static const struct {
    const char *s;
    uint64_t max;
    int rc;
    uint64_t v;
    const char *note;
} uint_cases[] = {
    { "0", 10, 0, 0, "zero" },
    { "7", 10, 0, 7, "one digit" },
    { "007", 10, 0, 7, "leading zeros are digits" },
    { "65535", 65535, 0, 65535, "max itself" },
    { "65536", 65535, GW_ETOOBIG, 0, "max + 1" },
    { "655350", 65535, GW_ETOOBIG, 0, "a digit past max" },
    { "18446744073709551615", UINT64_MAX, 0, UINT64_MAX, "UINT64_MAX" },
    { "18446744073709551616", UINT64_MAX, GW_ETOOBIG, 0, "UINT64_MAX + 1" },
    { "99999999999999999999999", UINT64_MAX, GW_ETOOBIG, 0, "far over" },
    { "0", 0, 0, 0, "max 0: zero" },
    { "1", 0, GW_ETOOBIG, 0, "max 0: one" },
    { "9", 5, GW_ETOOBIG, 0, "a digit above a one-digit max" },
    { "", 10, GW_EPARSE, 0, "empty" },
    { "+1", 10, GW_EPARSE, 0, "plus sign" },
    { "-1", 10, GW_EPARSE, 0, "minus sign" },
    { " 1", 10, GW_EPARSE, 0, "leading blank" },
    { "1 ", 10, GW_EPARSE, 0, "trailing blank" },
    { "1x", 10, GW_EPARSE, 0, "trailing byte" },
    { "x", 10, GW_EPARSE, 0, "no digit" },
    { "1/", 10, GW_EPARSE, 0, "the byte below '0'" },
    { "1:", 10, GW_EPARSE, 0, "the byte above '9'" },
    { "0x1f", UINT64_MAX, GW_EPARSE, 0, "no hex" },
    { "99999999999999999999x", UINT64_MAX, GW_ETOOBIG, 0,
      "too big before the bad byte: too big" },
    { "1x99999999999999999999", UINT64_MAX, GW_EPARSE, 0,
      "a bad byte before too big: malformed" },
};

START_TEST(test_parse_uint)
{
    size_t n = strlen(uint_cases[_i].s);
    char *p = guarded_copy(uint_cases[_i].s, n);    /* no NUL after it */
    uint64_t v = 12345;

    ck_assert_msg(gw_parse_uint(p, n, uint_cases[_i].max, &v)
                  == uint_cases[_i].rc, "%s", uint_cases[_i].note);
    if (uint_cases[_i].rc == 0)
        ck_assert_msg(v == uint_cases[_i].v, "%s", uint_cases[_i].note);
    else
        ck_assert_msg(v == 12345, "%s: untouched", uint_cases[_i].note);
    guarded_free(p, n);
}
END_TEST

/* Only the 'n' bytes given are read: a view into a longer text. */
START_TEST(test_parse_uint_view)
{
    uint64_t v = 0;

    ck_assert_int_eq(gw_parse_uint("8080/x", 4, 65535, &v), 0);
    ck_assert(v == 8080);
    ck_assert_int_eq(gw_parse_uint("200 OK", 3, 999, &v), 0);
    ck_assert(v == 200);
}
END_TEST

/*
 * gw_ms_to_s_ceil() and friends, each at the edges of its unit: rounded
 * up, 0 stays 0, and exact up to UINT64_MAX (where "n + 999" would wrap).
 */
static const struct {
    uint64_t (*f)(uint64_t);
    uint64_t unit;
    const char *name;
} ceil_fns[] = {
    { gw_ms_to_s_ceil, 1000, "ms to s" },
    { gw_us_to_s_ceil, 1000000, "us to s" },
    { gw_us_to_ms_ceil, 1000, "us to ms" },
};

START_TEST(test_ceil)
{
    uint64_t (*f)(uint64_t) = ceil_fns[_i].f, u = ceil_fns[_i].unit;
    const char *name = ceil_fns[_i].name;

    ck_assert_msg(f(0) == 0, "%s: nothing is no wait", name);
    ck_assert_msg(f(1) == 1, "%s: the least is a whole unit", name);
    ck_assert_msg(f(u - 1) == 1, "%s: just under one", name);
    ck_assert_msg(f(u) == 1, "%s: exactly one", name);
    ck_assert_msg(f(u + 1) == 2, "%s: just over one", name);
    ck_assert_msg(f(UINT64_MAX / u * u) == UINT64_MAX / u,
                  "%s: the largest whole multiple", name);
    ck_assert_msg(f(UINT64_MAX) == UINT64_MAX / u + 1,
                  "%s: no wrap at the top", name);
}
END_TEST

START_TEST(test_ms_left)
{
    int64_t now = gw_now_ms();
    int left;

    ck_assert_int_eq(gw_ms_left(-1), -1);          /* never */
    ck_assert_int_eq(gw_ms_left(0), 0);            /* long past */
    ck_assert_int_eq(gw_ms_left(now - 1000), 0);
    left = gw_ms_left(now + 5000);
    ck_assert_int_le(left, 5000);
    ck_assert_int_gt(left, 4000);
    ck_assert_int_eq(gw_ms_left(now + (INT64_C(1) << 40)), INT_MAX);
    ck_assert_int_eq(gw_ms_left(INT64_MAX), INT_MAX);
}
END_TEST

START_TEST(test_clocks)
{
    int64_t a = gw_now_us(), b = gw_now_us();

    ck_assert_int_ge(b, a);
    ck_assert_int_ge(gw_now_ms(), a / 1000);
}
END_TEST

static const struct {
    size_t a, b;
    int overflows;
} add_cases[] = {
    { 0, 0, 0 },
    { 1, 2, 0 },
    { SIZE_MAX, 0, 0 },
    { 0, SIZE_MAX, 0 },
    { SIZE_MAX - 1, 1, 0 },
    { SIZE_MAX, 1, 1 },
    { 1, SIZE_MAX, 1 },
    { SIZE_MAX, SIZE_MAX, 1 },
    { SIZE_MAX / 2 + 1, SIZE_MAX / 2 + 1, 1 },
    { SIZE_MAX / 2, SIZE_MAX / 2 + 1, 0 },
};

START_TEST(test_add_overflows)
{
    size_t out = 12345;
    int o = gw_add_overflows(add_cases[_i].a, add_cases[_i].b, &out);

    ck_assert_int_eq(o, add_cases[_i].overflows);
    if (o == 0)
        ck_assert_uint_eq(out, add_cases[_i].a + add_cases[_i].b);
    else
        ck_assert_uint_eq(out, 12345);     /* untouched on overflow */
}
END_TEST

START_TEST(test_strerror)
{
    int rc;

    for (rc = 0; rc >= GW_ESTOPPING; rc--) {
        ck_assert_ptr_nonnull(gw_strerror(rc));
        ck_assert_str_ne(gw_strerror(rc), "unknown error");
    }
    ck_assert_str_eq(gw_strerror(GW_ENOMEM), "out of memory");
    ck_assert_str_eq(gw_strerror(GW_ETOOBIG), "too large");
    ck_assert_str_eq(gw_strerror(1), "unknown error");
    ck_assert_str_eq(gw_strerror(-1000), "unknown error");
}
END_TEST

START_TEST(test_random_hex)
{
    char a[33], b[33];
    size_t i;

    gw_random_hex(a, 32);
    gw_random_hex(b, 32);
    ck_assert_uint_eq(strlen(a), 32);
    for (i = 0; i < 32; i++)
        ck_assert_ptr_nonnull(strchr("0123456789abcdef", a[i]));
    ck_assert_str_ne(a, b);
    gw_random_hex(a, 0);
    ck_assert_str_eq(a, "");
}
END_TEST

/* Published FNV-1a 64 vectors, and a key hashed in pieces is the same. */
START_TEST(test_fnv1a64)
{
    uint64_t h = GW_FNV1A64_OFFSET;

    ck_assert_uint_eq(gw_fnv1a64(GW_FNV1A64_OFFSET, "", 0),
                      UINT64_C(0xcbf29ce484222325));
    ck_assert_uint_eq(gw_fnv1a64(GW_FNV1A64_OFFSET, "a", 1),
                      UINT64_C(0xaf63dc4c8601ec8c));
    ck_assert_uint_eq(gw_fnv1a64(GW_FNV1A64_OFFSET, "foobar", 6),
                      UINT64_C(0x85944171f73967e8));
    h = gw_fnv1a64(h, "foo", 3);
    ck_assert_uint_eq(gw_fnv1a64(h, "bar", 3), UINT64_C(0x85944171f73967e8));
    /* Bytes are unsigned: 0xff is not folded in as -1. */
    ck_assert_uint_eq(gw_fnv1a64(0, "\xff", 1),
                      UINT64_C(0xff) * UINT64_C(0x100000001b3));
}
END_TEST

/* splitmix64's finaliser; and the pool's ring points keep their places. */
START_TEST(test_mix64)
{
    ck_assert_uint_eq(gw_mix64(0), 0);
    ck_assert_uint_eq(gw_mix64(1), UINT64_C(0x5692161d100b05e5));
    ck_assert_uint_eq(gw_mix64(gw_fnv1a64(GW_FNV1A64_OFFSET ^ 1, "u0", 2)),
                      UINT64_C(0x30ff23dce78cf08c));
}
END_TEST

/* ---- alloc ------------------------------------------------------------ */

START_TEST(test_alloc_nth)
{
    void *p1, *p2, *p3;

    alloc_fail_after(2, 0);
    p1 = gw_malloc(8);
    p2 = gw_malloc(8);
    p3 = gw_malloc(8);
    ck_assert_ptr_nonnull(p1);
    ck_assert_ptr_null(p2);                 /* the 2nd from now */
    ck_assert_ptr_nonnull(p3);              /* not sticky: back to normal */
    ck_assert_int_eq(alloc_failures(), 1);
    alloc_fail_after(0, 0);
    ck_assert_int_eq(alloc_failures(), 0);  /* re-arming resets the count */
    gw_free(p1);
    gw_free(p3);
}
END_TEST

START_TEST(test_alloc_sticky)
{
    char *s;
    void *p;
    int i;

    alloc_fail_after(1, 1);
    for (i = 0; i < 5; i++)
        ck_assert_ptr_null(gw_malloc(1));
    ck_assert_ptr_null(gw_calloc(1, 1));
    ck_assert_ptr_null(gw_strdup("x"));
    ck_assert_ptr_null(gw_strndup("xy", 1));
    ck_assert_int_eq(alloc_failures(), 8);
    alloc_fail_after(0, 0);
    s = gw_strdup("ok");
    ck_assert_str_eq(s, "ok");
    gw_free(s);

    /* gw_realloc failing keeps the old block, like realloc(). */
    p = gw_malloc(4);
    memcpy(p, "abc", 4);
    alloc_fail_after(1, 0);
    ck_assert_ptr_null(gw_realloc(p, 1 << 20));
    alloc_fail_after(0, 0);
    ck_assert_str_eq(p, "abc");
    gw_free(p);
}
END_TEST

START_TEST(test_alloc_off)
{
    int i;

    alloc_fail_after(0, 0);
    for (i = 0; i < 100; i++) {
        void *p = gw_malloc(16);

        ck_assert_ptr_nonnull(p);
        gw_free(p);
    }
    ck_assert_int_eq(alloc_failures(), 0);
}
END_TEST

START_TEST(test_alloc_funcs)
{
    unsigned char *z;
    char *s;
    void *p;
    size_t i;

    p = gw_malloc(0);                       /* non-NULL, like glibc */
    ck_assert_ptr_nonnull(p);
    gw_free(p);
    gw_free(NULL);

    z = gw_calloc(16, 4);
    ck_assert_ptr_nonnull(z);
    for (i = 0; i < 64; i++)
        ck_assert_int_eq(z[i], 0);
    gw_free(z);
    ck_assert_ptr_null(gw_calloc(SIZE_MAX / 2, 3));     /* overflow */
    ck_assert_ptr_null(gw_calloc(3, SIZE_MAX / 2));
    p = gw_calloc(0, 8);
    ck_assert_ptr_nonnull(p);
    gw_free(p);

    s = gw_strndup("hello world", 5);
    ck_assert_str_eq(s, "hello");
    gw_free(s);
    s = gw_strndup("", 0);
    ck_assert_str_eq(s, "");
    gw_free(s);
}
END_TEST

START_TEST(test_strndup_stops_at_nul)
{
    char *src = gw_malloc(3);
    char *s;

    /* Like strndup(): n is a maximum, the copy stops at the string's NUL
     * (regression: it copied n bytes and read past the source). */
    memcpy(src, "ab", 3);
    s = gw_strndup(src, 100);
    ck_assert_str_eq(s, "ab");
    gw_free(s);
    gw_free(src);
}
END_TEST

/*
 * gw_wipe_free() and gw_wipe_free_str() free what they are given (a
 * sanitizer build sees a leak or a bad free) and take NULL.  That the
 * bytes were zeroed cannot be seen after the free without reading freed
 * memory; explicit_bzero() is trusted for that.
 */
START_TEST(test_wipe_free)
{
    char *key = gw_strdup("sk-secret");
    unsigned char *pem = gw_malloc(64);

    ck_assert_ptr_nonnull(key);
    ck_assert_ptr_nonnull(pem);
    memset(pem, 'k', 64);
    gw_wipe_free_str(key);
    gw_wipe_free(pem, 64);
    gw_wipe_free_str(gw_strdup(""));
    gw_wipe_free(gw_malloc(1), 0);
    gw_wipe_free_str(NULL);
    gw_wipe_free(NULL, 0);
    gw_wipe_free(NULL, 64);
}
END_TEST

/* ---- runner ----------------------------------------------------------- */

static Suite *
buf_suite(void)
{
    Suite *s = suite_create("buf");
    TCase *tc;

    tc = tcase("lifecycle");
    tcase_add_test(tc, test_init_release);
    tcase_add_test(tc, test_new_free);
    tcase_add_test(tc, test_reset);
    suite_add_tcase(s, tc);

    tc = tcase("limits");
    tcase_add_test(tc, test_limit_exact);
    tcase_add_test(tc, test_limit_one_call);
    tcase_add_test(tc, test_limit_zero);
    tcase_add_test(tc, test_limit_huge_request);
    tcase_add_test(tc, test_limit_counts_consumed);
    tcase_add_test(tc, test_toobig_after_consume_all);
    suite_add_tcase(s, tc);

    tc = tcase("growth_and_alloc_failure");
    tcase_add_test(tc, test_growth);
    tcase_add_test(tc, test_alloc_fail_unchanged);
    suite_add_tcase(s, tc);

    tc = tcase("reserve_commit");
    tcase_add_test(tc, test_reserve_commit);
    tcase_add_test(tc, test_reserve_reuses_consumed);
    suite_add_tcase(s, tc);

    tc = tcase("consume_compact");
    tcase_add_test(tc, test_consume_compact);
    tcase_add_test(tc, test_consume_zero);
    suite_add_tcase(s, tc);

    tc = tcase("take");
    tcase_add_test(tc, test_take);
    suite_add_tcase(s, tc);

    tc = tcase("printf");
    tcase_add_test(tc, test_printf);
    tcase_add_test(tc, test_printf_at_the_room_edge);
    tcase_add_test(tc, test_append_u64_and_hex);
    suite_add_tcase(s, tc);
    return s;
}

static Suite *
util_suite(void)
{
    Suite *s = suite_create("util");
    TCase *tc;

    tc = tcase("strieq");
    tcase_add_loop_test(tc, test_strieq, 0, (int)GW_ARRAY_LEN(strieq_cases));
    suite_add_tcase(s, tc);

    tc = tcase("parse_long");
    tcase_add_loop_test(tc, test_parse_long, 0,
                        (int)GW_ARRAY_LEN(long_cases));
    suite_add_tcase(s, tc);

    tc = tcase("parse_uint");
    tcase_add_loop_test(tc, test_parse_uint, 0,
                        (int)GW_ARRAY_LEN(uint_cases));
    tcase_add_test(tc, test_parse_uint_view);
    suite_add_tcase(s, tc);

    tc = tcase("ceil");
    tcase_add_loop_test(tc, test_ceil, 0, (int)GW_ARRAY_LEN(ceil_fns));
    suite_add_tcase(s, tc);

    tc = tcase("clocks");
    tcase_add_test(tc, test_ms_left);
    tcase_add_test(tc, test_clocks);
    suite_add_tcase(s, tc);

    tc = tcase("add_overflows");
    tcase_add_loop_test(tc, test_add_overflows, 0,
                        (int)GW_ARRAY_LEN(add_cases));
    suite_add_tcase(s, tc);

    tc = tcase("hash");
    tcase_add_test(tc, test_fnv1a64);
    tcase_add_test(tc, test_mix64);
    suite_add_tcase(s, tc);

    tc = tcase("misc");
    tcase_add_test(tc, test_strerror);
    tcase_add_test(tc, test_random_hex);
    suite_add_tcase(s, tc);
    return s;
}

static Suite *
alloc_suite(void)
{
    Suite *s = suite_create("alloc");
    TCase *tc;

    tc = tcase("injection");
    tcase_add_test(tc, test_alloc_nth);
    tcase_add_test(tc, test_alloc_sticky);
    tcase_add_test(tc, test_alloc_off);
    suite_add_tcase(s, tc);

    tc = tcase("functions");
    tcase_add_test(tc, test_alloc_funcs);
    tcase_add_test(tc, test_strndup_stops_at_nul);
    tcase_add_test(tc, test_wipe_free);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    SRunner *sr = srunner_create(buf_suite());

    srunner_add_suite(sr, util_suite());
    srunner_add_suite(sr, alloc_suite());
    return test_run(sr);
}
