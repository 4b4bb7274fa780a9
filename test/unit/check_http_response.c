/* SPDX-License-Identifier: MIT */
/*
 * check_http_response.c - unit tests for common/http_response.c, an
 * upstream's response head read line by line.
 *
 * A table of (lines, expected result, note); every line is copied so that
 * its last byte sits right before a PROT_NONE page (testutil.h's arena).
 */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http_response.h"
#include "testutil.h"
#include "util.h"

/* ---- response heads ------------------------------------------------- */

/*
 * A response head fed line by line, as libcurl's header callback does:
 * every line ends at the guard page.  Lines come whole from libcurl, so
 * there is no cutting at every offset here.  'rc' is the first error, or
 * HTTP_RESPONSE_DONE when the head completes; then the fields below hold.
 */
struct resp_case {
    const char *in;
    int rc;
    int status;
    int64_t content_length;     /* -1: none */
    int has_te;
    int64_t retry_after_ms;
    const char *ctype;          /* the last Content-Type seen; NULL none */
    const char *error;          /* with an error */
    const char *note;
};

/* The table's words for each refusal (the gateway's are outcome.h's). */
static const char *const head_error_names[] = {
    [HTTP_HEAD_OK] = "none",
    [HTTP_HEAD_TOO_LARGE] = "response head too large",
    [HTTP_HEAD_BAD_STATUS] = "bad response head",
    [HTTP_HEAD_BAD_FIELD] = "bad response header",
    [HTTP_HEAD_BAD_LENGTH] = "bad content-length",
    [HTTP_HEAD_CONFLICTING_LENGTH] = "conflicting content-length",
    [HTTP_HEAD_LENGTH_AND_CHUNKED] = "content-length with transfer-encoding",
    [HTTP_HEAD_BAD_TRANSFER_CODING] = "unsupported transfer-encoding",
    [HTTP_HEAD_BAD_CONTENT_CODING] = "unsupported content-encoding",
};

#define RESP_MAX_HEAD 256
#define RESP_RETRY_MAX_MS 60000

static const struct resp_case resp_cases[] = {
    { "HTTP/1.1 200 OK\r\n\r\n", HTTP_RESPONSE_DONE, 200, -1, 0, 0, NULL,
      NULL, "the least head" },
    { "HTTP/1.1 200 OK\n\n", HTTP_RESPONSE_DONE, 200, -1, 0, 0, NULL, NULL,
      "bare LF line ends (libcurl's to allow)" },
    { "HTTP/2 204\r\n\r\n", HTTP_RESPONSE_DONE, 204, -1, 0, 0, NULL, NULL,
      "no reason phrase" },
    { "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
      "Content-Length: 12\r\n\r\n", HTTP_RESPONSE_DONE, 200, 12, 0, 0,
      "application/json", NULL, "type and length" },
    { "HTTP/1.1 200 OK\r\nContent-Type:  text/event-stream \t\r\n"
      "Transfer-Encoding: chunked\r\n\r\n", HTTP_RESPONSE_DONE, 200, -1, 1,
      0, "text/event-stream", NULL, "OWS trimmed; chunked" },
    { "HTTP/1.1 200 OK\r\ncontent-length: 5\r\nCONTENT-LENGTH: 5\r\n\r\n",
      HTTP_RESPONSE_DONE, 200, 5, 0, 0, NULL, NULL,
      "the same length twice, names in any case" },
    { "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\n"
      "Retry-After: 5\r\n\r\nHTTP/1.1 429 Too Many\r\nRetry-After: 7\r\n"
      "\r\n", HTTP_RESPONSE_DONE, 429, -1, 0, 7000, NULL, NULL,
      "1xx heads skipped; the final head's Retry-After" },
    { "HTTP/1.1 503 x\r\nRetry-After: 86400\r\n\r\n", HTTP_RESPONSE_DONE,
      503, -1, 0, RESP_RETRY_MAX_MS, NULL, NULL, "Retry-After capped" },
    { "HTTP/1.1 503 x\r\nRetry-After: Wed, 21 Oct 2015 07:28:00 GMT\r\n"
      "\r\n", HTTP_RESPONSE_DONE, 503, -1, 0, 0, NULL, NULL,
      "an HTTP-date is no delay" },
    { "HTTP/1.1 503 x\r\nRetry-After: 1234567890\r\n\r\n",
      HTTP_RESPONSE_DONE, 503, -1, 0, 0, NULL, NULL,
      "ten digits are not believed" },
    { "HTTP/1.1 200 OK\r\nContent-Encoding: identity\r\n"
      "Content-Encoding:\r\nX-Junk\r\n\r\n", HTTP_RESPONSE_DONE, 200, -1, 0,
      0, NULL, NULL, "identity, empty coding and a line without a colon" },

    { "HTTP/1.1 2000 OK\r\n\r\n", GW_EPARSE, 0, -1, 0, 0, NULL,
      "bad response head", "four-digit status" },
    { "HTTP/1.1 999 What\r\n\r\n", GW_EPARSE, 0, -1, 0, 0, NULL,
      "bad response head", "status past 599" },
    { "HTTP/1.1 099 x\r\n\r\n", GW_EPARSE, 0, -1, 0, 0, NULL,
      "bad response head", "status below 100" },
    { "ICY 200 OK\r\n\r\n", GW_EPARSE, 0, -1, 0, 0, NULL,
      "bad response head", "not HTTP" },
    { "HTTP/1.1 2x0 OK\r\n\r\n", GW_EPARSE, 0, -1, 0, 0, NULL,
      "bad response head", "not digits" },
    { "HTTP/1.1\r\n\r\n", GW_EPARSE, 0, -1, 0, 0, NULL,
      "bad response head", "no status" },
    { "HTTP/1.1 200 OK\r\nContent-Length: 12abc\r\n\r\n", GW_EPARSE, 0, -1,
      0, 0, NULL, "bad content-length", "length with junk" },
    { "HTTP/1.1 200 OK\r\nContent-Length:\r\n\r\n", GW_EPARSE, 0, -1, 0, 0,
      NULL, "bad content-length", "empty length" },
    { "HTTP/1.1 200 OK\r\nContent-Length: 1, 1\r\n\r\n", GW_EPARSE, 0, -1,
      0, 0, NULL, "bad content-length", "a list of lengths" },
    { "HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999\r\n\r\n",
      GW_EPARSE, 0, -1, 0, 0, NULL, "bad content-length",
      "length past INT64_MAX" },
    { "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
      GW_EPARSE, 0, -1, 0, 0, NULL, "conflicting content-length",
      "two lengths" },
    { "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n"
      "Transfer-Encoding: chunked\r\n\r\n", GW_EPARSE, 0, -1, 0, 0, NULL,
      "content-length with transfer-encoding", "both framings" },
    { "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
      GW_EPARSE, 0, -1, 0, 0, NULL, "unsupported transfer-encoding",
      "a coding before chunked" },
    { "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n"
      "Transfer-Encoding: chunked\r\n\r\n", GW_EPARSE, 0, -1, 0, 0, NULL,
      "unsupported transfer-encoding", "chunked twice" },
    { "HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\n\r\n", GW_EPARSE, 0, -1,
      0, 0, NULL, "unsupported content-encoding", "gzip" },
    { "HTTP/1.1 200 OK\r\nContent-Type: text/plain\001\r\n\r\n", GW_EPARSE,
      0, -1, 0, 0, NULL, "bad response header", "a control byte in a type" },
    { "HTTP/1.1 200 OK\r\nX-Big: "
      "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
      "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
      "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
      "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
      "\r\n\r\n", GW_ETOOBIG, 0, -1, 0, 0, NULL, "response head too large",
      "head past max_head" },
};

START_TEST(test_response_head)
{
    const struct resp_case *c = &resp_cases[_i];
    struct http_response_head h;
    const char *p = c->in, *nl, *ctype = NULL;
    size_t ctype_len = 0;
    char seen[RESP_MAX_HEAD];
    int rc = HTTP_RESPONSE_FIELD;

    http_response_head_init(&h, RESP_MAX_HEAD, RESP_RETRY_MAX_MS);
    while (*p != '\0' && rc != HTTP_RESPONSE_DONE && rc >= 0) {
        nl = strchr(p, '\n');
        ck_assert_ptr_nonnull(nl);
        rc = http_response_head_line(&h, guarded(p, (size_t)(nl + 1 - p)),
                                     (size_t)(nl + 1 - p));
        if (rc == HTTP_RESPONSE_STATUS) {
            ctype = NULL;
        } else if (rc == HTTP_RESPONSE_CTYPE) {
            ck_assert_uint_lt(h.ctype_len, sizeof(seen));
            memcpy(seen, h.ctype, h.ctype_len);     /* a view: copy it */
            ctype = seen;
            ctype_len = h.ctype_len;
        } else {
            ck_assert_ptr_null(h.ctype);
        }
        p = nl + 1;
    }
    ck_assert_msg(rc == c->rc, "%s: rc %d, want %d", c->note, rc, c->rc);
    if (rc < 0) {
        ck_assert_msg(h.error != HTTP_HEAD_OK
                      && strcmp(head_error_names[h.error], c->error) == 0,
                      "%s: error '%s'", c->note, head_error_names[h.error]);
        return;
    }
    ck_assert_msg(*p == '\0', "%s: lines left after the head", c->note);
    ck_assert_int_eq(h.status, c->status);
    ck_assert_int_eq(h.has_cl, c->content_length >= 0);
    ck_assert_int_eq(h.content_length, c->content_length);
    ck_assert_int_eq(h.has_te, c->has_te);
    ck_assert_int_eq(h.retry_after_ms, c->retry_after_ms);
    if (c->ctype == NULL) {
        ck_assert_ptr_null(ctype);
    } else {
        ck_assert_ptr_nonnull(ctype);
        ck_assert_uint_eq(ctype_len, strlen(c->ctype));
        ck_assert_msg(memcmp(ctype, c->ctype, ctype_len) == 0, "%s",
                      c->note);
    }
}
END_TEST

/* Cache-Control: no-store or private marks the head; others do not. */
START_TEST(test_response_no_store)
{
    static const struct {
        const char *line;
        int no_store;
    } cases[] = {
        { "Cache-Control: no-store\r\n", 1 },
        { "cache-control: max-age=60, PRIVATE\r\n", 1 },
        { "Cache-Control: private=\"x\"\r\n", 1 },
        { "Cache-Control: max-age=60, no-cache\r\n", 0 },
        { "Cache-Control: no-storex\r\n", 0 },
        { "X-Cache-Control: no-store\r\n", 0 },
    };

    for (size_t i = 0; i < GW_ARRAY_LEN(cases); i++) {
        struct http_response_head h;
        const char *lines[] = { "HTTP/1.1 200 OK\r\n", cases[i].line,
                                "\r\n" };

        http_response_head_init(&h, RESP_MAX_HEAD, RESP_RETRY_MAX_MS);
        for (int k = 0; k < 3; k++)
            http_response_head_line(&h, guarded(lines[k], strlen(lines[k])),
                                    strlen(lines[k]));
        ck_assert_msg(h.no_store == cases[i].no_store, "%s", cases[i].line);
    }
}
END_TEST

/* A head that reaches max_head exactly is taken; one byte more is not. */
START_TEST(test_response_head_limit)
{
    const char *lines[] = { "HTTP/1.1 200 OK\r\n", "X: y\r\n", "\r\n" };
    size_t max = 0;
    int rc = 0;

    for (int i = 0; i < 3; i++)
        max += strlen(lines[i]);
    for (size_t cap = max - 1; cap <= max; cap++) {
        struct http_response_head h;

        http_response_head_init(&h, cap, RESP_RETRY_MAX_MS);
        for (int i = 0; i < 3; i++) {
            rc = http_response_head_line(&h, guarded(lines[i],
                                                     strlen(lines[i])),
                                         strlen(lines[i]));
            if (rc < 0)
                break;
        }
        ck_assert_int_eq(rc, cap == max ? HTTP_RESPONSE_DONE : GW_ETOOBIG);
    }
}
END_TEST

static Suite *
http_response_suite(void)
{
    Suite *s = suite_create("http_response");
    TCase *tc;

    tc = tcase_create("response_head");
    tcase_add_checked_fixture(tc, arena_setup, arena_teardown);
    tcase_add_loop_test(tc, test_response_head, 0,
                        (int)GW_ARRAY_LEN(resp_cases));
    tcase_add_test(tc, test_response_head_limit);
    tcase_add_test(tc, test_response_no_store);
    tcase_set_timeout(tc, 10);
    suite_add_tcase(s, tc);

    return s;
}

int
main(void)
{
    return test_run(srunner_create(http_response_suite()));
}
