/* SPDX-License-Identifier: MIT */
/*
 * fuzz_http.c - libFuzzer target for the request parser (common/http.c)
 * and the chunked decoder (common/http_chunked.c).
 *
 * The first byte of an input picks the target: even for the parser, odd
 * for the decoder; the rest is what the target is fed (so corpus files
 * start with '0' or '1' and stay readable).  Every piece of input is
 * copied into a heap block of its exact size first, so AddressSanitizer
 * catches a read one byte past it.
 *
 * Besides crashes and sanitizer reports, the target aborts when one of
 * these properties fails:
 *   parser   views lie inside the input; an error carries its status and
 *            message; the head alone parses to the same result; a prefix
 *            gives GW_EAGAIN or the very same answer as the whole.
 *   decoder  whole, two pieces and byte-at-a-time feeds agree on the
 *            result, the bytes consumed and the decoded data.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "buf.h"
#include "http.h"
#include "http_chunked.h"
#include "util.h"

#define FUZZ_MAX_HEAD 16384
#define FUZZ_BODY_LIMIT 4096        /* small, so GW_ETOOBIG is reachable */


static int
inside(const char *v, size_t n, const char *p, size_t len)
{
    return v != NULL && v >= p && n <= len && v - p <= (ptrdiff_t)(len - n);
}

static void
check_request(const struct http_request *r, const char *p, size_t head)
{
    size_t i;

    REQUIRE(r->error_status == 0 && r->error_msg == NULL);
    REQUIRE(r->method_len > 0 && inside(r->method, r->method_len, p, head));
    REQUIRE(r->target_len > 0 && inside(r->target, r->target_len, p, head));
    REQUIRE(r->target[0] == '/');
    REQUIRE(r->path == r->target && r->path_len <= r->target_len);
    REQUIRE(r->minor == 0 || r->minor == 1);
    REQUIRE(r->num_headers <= HTTP_MAX_HEADERS);
    for (i = 0; i < r->num_headers; i++) {
        const struct http_header *h = &r->headers[i];

        REQUIRE(h->name_len > 0 && inside(h->name, h->name_len, p, head));
        REQUIRE(inside(h->value, h->value_len, p, head));
    }
    REQUIRE(r->body_kind != HTTP_BODY_CHUNKED || r->minor == 1);
    REQUIRE(r->body_kind == HTTP_BODY_LENGTH || r->content_length == 0);
}

static void
check_error(int rc, const struct http_request *r)
{
    REQUIRE(r->error_msg != NULL && r->error_msg[0] != '\0');
    switch (r->error_status) {
    case 400:
    case 501:
    case 505:
        REQUIRE(rc == GW_EPARSE);
        break;
    case 414:
    case 431:
        REQUIRE(rc == GW_ETOOBIG);
        break;
    default:
        abort();
    }
}

/* Parse p[0..n) from an exact-size copy. */
static int
parse_copy(const char *p, size_t n, struct http_request *r)
{
    char *q = dup_exact(p, n);
    int rc;

    rc = http_parse_request(q, n, FUZZ_MAX_HEAD, r);
    free(q);                    /* r's views dangle now: compare scalars */
    return rc;
}

static void
fuzz_parse(const char *p, size_t len)
{
    static struct http_request r, r2;   /* 2 KiB each: keep off the stack */
    size_t cuts[3], i;
    int rc, rc2;

    rc = http_parse_request(p, len, FUZZ_MAX_HEAD, &r);
    if (rc > 0) {
        REQUIRE((size_t)rc <= len && rc <= FUZZ_MAX_HEAD);
        check_request(&r, p, (size_t)rc);
        rc2 = parse_copy(p, (size_t)rc, &r2);
        REQUIRE(rc2 == rc && r2.num_headers == r.num_headers
                && r2.body_kind == r.body_kind
                && r2.content_length == r.content_length
                && r2.keep_alive == r.keep_alive
                && r2.expect_continue == r.expect_continue);
    } else if (rc == GW_EAGAIN) {
        REQUIRE(r.error_status == 0 && len < FUZZ_MAX_HEAD);
    } else {
        check_error(rc, &r);
    }

    cuts[0] = len / 2;
    cuts[1] = len > 0 ? len - 1 : 0;
    cuts[2] = len > 0 ? (unsigned char)p[0] % len : 0;
    for (i = 0; i < 3; i++) {
        rc2 = parse_copy(p, cuts[i], &r2);
        REQUIRE(rc2 == GW_EAGAIN
                || (rc2 == rc && r2.error_status == r.error_status));
    }
}

/*
 * Decode p[0..len) in pieces of 'step' bytes (each an exact-size copy).
 * OUT *consumed: bytes the decoder took.
 */
static int
decode(const char *p, size_t len, size_t step, struct buf *out,
       size_t *consumed)
{
    struct http_chunked d;
    size_t off = 0, n, used;
    char *q;
    int rc = 0;

    http_chunked_init(&d);
    *consumed = 0;
    do {
        n = len - off < step ? len - off : step;
        q = dup_exact(p + off, n);
        rc = http_chunked_feed(&d, q, n, out, &used);
        free(q);
        REQUIRE(used <= n);
        *consumed += used;
        if (rc != 0)
            break;
        REQUIRE(used == n);
        off += n;
    } while (off < len);
    return rc;
}

static void
fuzz_chunked(const char *p, size_t len)
{
    struct buf whole, other;
    size_t c_whole, c_other, steps[2], i;
    int rc_whole, rc_other;

    buf_init(&whole, FUZZ_BODY_LIMIT);
    buf_init(&other, FUZZ_BODY_LIMIT);
    rc_whole = decode(p, len, len > 0 ? len : 1, &whole, &c_whole);
    REQUIRE(rc_whole == 0 || rc_whole == 1 || rc_whole == GW_EPARSE
            || rc_whole == GW_ETOOBIG);
    REQUIRE(rc_whole != 0 || c_whole == len);
    REQUIRE(buf_len(&whole) <= FUZZ_BODY_LIMIT);

    steps[0] = 1;
    steps[1] = len / 2 + 1;
    for (i = 0; i < 2; i++) {
        buf_reset(&other);
        rc_other = decode(p, len, steps[i], &other, &c_other);
        REQUIRE(rc_other == rc_whole && c_other == c_whole);
        if (rc_whole >= 0) {
            REQUIRE(buf_len(&other) == buf_len(&whole));
            REQUIRE(memcmp(buf_ptr(&other), buf_ptr(&whole),
                           buf_len(&whole)) == 0);
        }
    }
    buf_release(&whole);
    buf_release(&other);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *p;

    if (size == 0)
        return 0;
    p = (const char *)data + 1;
    if ((data[0] & 1) == 0)
        fuzz_parse(p, size - 1);
    else
        fuzz_chunked(p, size - 1);
    return 0;
}
