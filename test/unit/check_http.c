/* SPDX-License-Identifier: MIT */
/*
 * check_http.c - unit tests for common/http.c: the request parser, its
 * character classes and the field helpers.  The chunked decoder, the
 * blocking reader and the response head have suites of their own
 * (check_http_chunked.c, check_http_read.c, check_http_response.c).
 *
 * Parser tests are tables of (input, expected result, note).  Every input
 * is copied so that its last byte sits right before a PROT_NONE page
 * (testutil.h's arena): a read past the end crashes the test instead of
 * passing by luck (picohttpparser's test.c).  Valid inputs are also fed
 * cut at every byte offset.
 */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http.h"
#include "testutil.h"
#include "util.h"

/* A string literal as (pointer, length), so inputs may hold NUL bytes. */
#define S(lit) lit, sizeof(lit) - 1

#define MAX_HEAD 16384

/* ---- helpers ------------------------------------------------------- */

static int
parse_guarded(const char *p, size_t n, size_t max_head,
              struct http_request *r)
{
    return http_parse_request(guarded(p, n), n, max_head, r);
}

static int
rc_for_status(int status)
{
    return status == 414 || status == 431 ? GW_ETOOBIG : GW_EPARSE;
}

static int
view_eq(const char *p, size_t n, const char *s)
{
    return p != NULL && n == strlen(s) && memcmp(p, s, n) == 0;
}

/* ---- valid requests ------------------------------------------------ */

struct ok_case {
    const char *head;           /* the request head */
    const char *rest;           /* bytes after it (body, next request) */
    const char *method;
    const char *target;
    const char *path;
    int minor;
    size_t num_headers;
    enum http_body_kind body_kind;
    uint64_t content_length;
    int keep_alive;
    int expect_continue;
    const char *hname;          /* optional: a field to look up ... */
    const char *hvalue;         /* ... and its expected value */
    const char *note;
};

#define H11 "Host: a\r\n"

static const struct ok_case ok_cases[] = {
    { "GET / HTTP/1.1\r\n" H11 "\r\n", "",
      "GET", "/", "/", 1, 1, HTTP_BODY_NONE, 0, 1, 0, "host", "a",
      "simple GET" },
    { "GET /v1/models?limit=10&after=x%2F HTTP/1.1\r\n"
      "Host: api.example.com:8080\r\nAccept: */*\r\n\r\n", "",
      "GET", "/v1/models?limit=10&after=x%2F", "/v1/models", 1, 2,
      HTTP_BODY_NONE, 0, 1, 0, "ACCEPT", "*/*",
      "query is split off the path, names are case-insensitive" },
    { "POST /v1/chat/completions HTTP/1.1\r\n" H11
      "Content-Type: application/json\r\nContent-Length: 13\r\n\r\n",
      "{\"model\":\"m\"}",
      "POST", "/v1/chat/completions", "/v1/chat/completions", 1, 3,
      HTTP_BODY_LENGTH, 13, 1, 0, "content-length", "13",
      "POST with Content-Length; the body is not part of the head" },
    { "POST /x HTTP/1.1\r\n" H11 "Transfer-Encoding: chunked\r\n\r\n",
      "5\r\nhello\r\n0\r\n\r\n",
      "POST", "/x", "/x", 1, 2, HTTP_BODY_CHUNKED, 0, 1, 0, NULL, NULL,
      "chunked" },
    { "POST /x HTTP/1.1\r\n" H11 "Transfer-Encoding:  CHUNKED \t\r\n\r\n",
      "", "POST", "/x", "/x", 1, 2, HTTP_BODY_CHUNKED, 0, 1, 0,
      "transfer-encoding", "CHUNKED",
      "coding names are case-insensitive, OWS trimmed" },
    { "POST /x HTTP/1.1\r\n" H11 "Transfer-Encoding: , chunked,\r\n\r\n",
      "", "POST", "/x", "/x", 1, 2, HTTP_BODY_CHUNKED, 0, 1, 0, NULL, NULL,
      "empty list elements are ignored (RFC 9110 5.6.1)" },
    { "POST /x HTTP/1.1\r\n" H11 "Content-Length: 0\r\n\r\n", "",
      "POST", "/x", "/x", 1, 2, HTTP_BODY_LENGTH, 0, 1, 0, NULL, NULL,
      "Content-Length: 0" },
    { "POST /x HTTP/1.1\r\n" H11 "Content-Length: 007\r\n\r\n", "",
      "POST", "/x", "/x", 1, 2, HTTP_BODY_LENGTH, 7, 1, 0, NULL, NULL,
      "leading zeros are still 1*DIGIT" },
    { "POST /x HTTP/1.1\r\n" H11
      "Content-Length: 18446744073709551615\r\n\r\n", "",
      "POST", "/x", "/x", 1, 2, HTTP_BODY_LENGTH, UINT64_MAX, 1, 0,
      NULL, NULL, "largest Content-Length that fits" },
    { "GET / HTTP/1.0\r\n\r\n", "",
      "GET", "/", "/", 0, 0, HTTP_BODY_NONE, 0, 0, 0, NULL, NULL,
      "HTTP/1.0: no Host needed, no keep-alive by default" },
    { "GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n", "",
      "GET", "/", "/", 0, 1, HTTP_BODY_NONE, 0, 1, 0, NULL, NULL,
      "HTTP/1.0 with keep-alive" },
    { "GET / HTTP/1.0\r\nConnection: keep-alive, close\r\n\r\n", "",
      "GET", "/", "/", 0, 1, HTTP_BODY_NONE, 0, 0, 0, NULL, NULL,
      "HTTP/1.0: close beats keep-alive" },
    { "GET / HTTP/1.0\r\nConnection: keep-alivex\r\n\r\n", "",
      "GET", "/", "/", 0, 1, HTTP_BODY_NONE, 0, 0, 0, NULL, NULL,
      "HTTP/1.0: tokens match whole" },
    { "GET / HTTP/1.1\r\n" H11 "Connection: close\r\n\r\n", "",
      "GET", "/", "/", 1, 2, HTTP_BODY_NONE, 0, 0, 0, NULL, NULL,
      "HTTP/1.1 with close" },
    { "GET / HTTP/1.1\r\n" H11 "Connection: Upgrade , CLOSE\r\n\r\n", "",
      "GET", "/", "/", 1, 2, HTTP_BODY_NONE, 0, 0, 0, NULL, NULL,
      "close anywhere in the list, any case" },
    { "GET / HTTP/1.1\r\n" H11 "Connection: foo\r\nConnection: close\r\n"
      "\r\n", "",
      "GET", "/", "/", 1, 3, HTTP_BODY_NONE, 0, 0, 0, "connection", "foo",
      "close in a second Connection field" },
    { "GET / HTTP/1.1\r\n" H11 "Connection: closed\r\n\r\n", "",
      "GET", "/", "/", 1, 2, HTTP_BODY_NONE, 0, 1, 0, NULL, NULL,
      "closed is not close" },
    { "POST /x HTTP/1.1\r\n" H11 "Expect: 100-continue\r\n"
      "Content-Length: 3\r\n\r\n", "abc",
      "POST", "/x", "/x", 1, 3, HTTP_BODY_LENGTH, 3, 1, 1, NULL, NULL,
      "Expect: 100-continue" },
    { "POST /x HTTP/1.1\r\n" H11 "Expect: 100-Continue\r\n\r\n", "",
      "POST", "/x", "/x", 1, 2, HTTP_BODY_NONE, 0, 1, 1, NULL, NULL,
      "Expect is case-insensitive" },
    { "POST /x HTTP/1.1\r\n" H11 "Expect: 200-ok\r\n\r\n", "",
      "POST", "/x", "/x", 1, 2, HTTP_BODY_NONE, 0, 1, 0, NULL, NULL,
      "other expectations are not 100-continue" },
    { "POST /x HTTP/1.0\r\nExpect: 100-continue\r\n\r\n", "",
      "POST", "/x", "/x", 0, 1, HTTP_BODY_NONE, 0, 0, 0, NULL, NULL,
      "Expect is ignored from HTTP/1.0 (RFC 9110 10.1.1)" },
    { "GET /a HTTP/1.1\r\n" H11 "\r\n", "GET /b HTTP/1.1\r\n" H11 "\r\n",
      "GET", "/a", "/a", 1, 1, HTTP_BODY_NONE, 0, 1, 0, NULL, NULL,
      "pipelined: only the first head is taken" },
    { "GET /a HTTP/1.1\r\n" H11 "\r\n", "GARBAGE\x01\r\n",
      "GET", "/a", "/a", 1, 1, HTTP_BODY_NONE, 0, 1, 0, NULL, NULL,
      "what follows the head is not looked at" },
    { "\r\n\r\nGET / HTTP/1.1\r\n" H11 "\r\n", "",
      "GET", "/", "/", 1, 1, HTTP_BODY_NONE, 0, 1, 0, NULL, NULL,
      "empty lines before the request line are skipped (RFC 9112 2.2)" },
    { "GET / HTTP/1.1\r\nHost:a\r\nX-A:   spaced  value \t \r\n\r\n", "",
      "GET", "/", "/", 1, 2, HTTP_BODY_NONE, 0, 1, 0, "x-a", "spaced  value",
      "OWS around values is trimmed, inner spaces kept" },
    { "GET / HTTP/1.1\r\n" H11 "X-Empty:\r\nX-Blank: \t \r\n\r\n", "",
      "GET", "/", "/", 1, 3, HTTP_BODY_NONE, 0, 1, 0, "x-blank", "",
      "empty field values" },
    { "GET / HTTP/1.1\r\n" H11 "X-U: caf\xc3\xa9 \x80\xff\r\n\r\n", "",
      "GET", "/", "/", 1, 2, HTTP_BODY_NONE, 0, 1, 0, "x-u",
      "caf\xc3\xa9 \x80\xff", "obs-text in values" },
    { "GET / HTTP/1.1\r\n" H11 "X-Q: a:b:c \"d\" (e)\r\n\r\n", "",
      "GET", "/", "/", 1, 2, HTTP_BODY_NONE, 0, 1, 0, "x-q",
      "a:b:c \"d\" (e)", "colons and quotes inside a value" },
    { "PATCH /x HTTP/1.1\r\n" H11 "\r\n", "",
      "PATCH", "/x", "/x", 1, 1, HTTP_BODY_NONE, 0, 1, 0, NULL, NULL,
      "other methods" },
    { "M-SEARCH.x!#$%&'*+^_`|~ /x HTTP/1.1\r\n" H11 "\r\n", "",
      "M-SEARCH.x!#$%&'*+^_`|~", "/x", "/x", 1, 1, HTTP_BODY_NONE, 0, 1, 0,
      NULL, NULL, "a method is any token" },
    { "GET /a%20b/%7e?q=%7E&r=/?s HTTP/1.1\r\n" H11 "\r\n", "",
      "GET", "/a%20b/%7e?q=%7E&r=/?s", "/a%20b/%7e", 1, 1, HTTP_BODY_NONE,
      0, 1, 0, NULL, NULL, "percent-encoding, ? and / in the query" },
    { "GET /a;b=c,d!$&'()*+@:~-._/ HTTP/1.1\r\n" H11 "\r\n", "",
      "GET", "/a;b=c,d!$&'()*+@:~-._/", "/a;b=c,d!$&'()*+@:~-._/", 1, 1,
      HTTP_BODY_NONE, 0, 1, 0, NULL, NULL, "sub-delims, : and @ in a path" },
    { "GET //a//b HTTP/1.1\r\n" H11 "\r\n", "",
      "GET", "//a//b", "//a//b", 1, 1, HTTP_BODY_NONE, 0, 1, 0, NULL, NULL,
      "empty segments" },
    { "GET /? HTTP/1.1\r\n" H11 "\r\n", "",
      "GET", "/?", "/", 1, 1, HTTP_BODY_NONE, 0, 1, 0, NULL, NULL,
      "empty query" },
    { "GET / HTTP/1.1\r\nHost: [::1]:8080\r\n\r\n", "",
      "GET", "/", "/", 1, 1, HTTP_BODY_NONE, 0, 1, 0, "host", "[::1]:8080",
      "IPv6 literal Host" },
    { "GET / HTTP/1.1\r\nHost:\r\n\r\n", "",
      "GET", "/", "/", 1, 1, HTTP_BODY_NONE, 0, 1, 0, "host", "",
      "empty Host is allowed (RFC 9112 3.2)" },
    { "GET / HTTP/1.1\r\nhOsT: a\r\n\r\n", "",
      "GET", "/", "/", 1, 1, HTTP_BODY_NONE, 0, 1, 0, "HOST", "a",
      "Host in any case" },
    { "GET / HTTP/1.0\r\nHost: a\r\n\r\n", "",
      "GET", "/", "/", 0, 1, HTTP_BODY_NONE, 0, 0, 0, NULL, NULL,
      "Host on HTTP/1.0" },
    { "GET / HTTP/1.1\r\n" H11 "Content-Lengtx: 5, 5\r\n"
      "Transfer-Encodinx: gzip\r\nConnectiox: close\r\nExpecx: 100-continue"
      "\r\nHosx: a\r\nContent-Length-X: 5\r\n\r\n", "",
      "GET", "/", "/", 1, 7, HTTP_BODY_NONE, 0, 1, 0, NULL, NULL,
      "look-alike names (same lengths) are plain fields" },
};

static char *
concat(const char *a, const char *b, size_t *len)
{
    size_t na = strlen(a), nb = strlen(b);
    char *p = malloc(na + nb + 1);

    ck_assert_ptr_nonnull(p);
    memcpy(p, a, na);
    memcpy(p + na, b, nb + 1);
    *len = na + nb;
    return p;
}

static void
check_ok(const struct ok_case *c, const struct http_request *r)
{
    const struct http_header *h;

    ck_assert_msg(view_eq(r->method, r->method_len, c->method),
                  "%s: method", c->note);
    ck_assert_msg(view_eq(r->target, r->target_len, c->target),
                  "%s: target", c->note);
    ck_assert_msg(view_eq(r->path, r->path_len, c->path),
                  "%s: path", c->note);
    ck_assert_int_eq(r->minor, c->minor);
    ck_assert_uint_eq(r->num_headers, c->num_headers);
    ck_assert_int_eq(r->body_kind, c->body_kind);
    ck_assert_uint_eq(r->content_length, c->content_length);
    ck_assert_msg(r->keep_alive == c->keep_alive, "%s: keep_alive %d",
                  c->note, r->keep_alive);
    ck_assert_msg(r->expect_continue == c->expect_continue,
                  "%s: expect_continue", c->note);
    ck_assert_int_eq(r->error_status, 0);
    ck_assert_ptr_null(r->error_msg);
    if (c->hname != NULL) {
        h = http_find_header(r, c->hname);
        ck_assert_msg(h != NULL, "%s: no %s", c->note, c->hname);
        ck_assert_msg(view_eq(h->value, h->value_len, c->hvalue),
                      "%s: %s value '%.*s'", c->note, c->hname,
                      (int)h->value_len, h->value);
    }
}

START_TEST(test_parse_ok)
{
    const struct ok_case *c = &ok_cases[_i];
    struct http_request r;
    size_t len, head_len = strlen(c->head), k;
    char *in = concat(c->head, c->rest, &len);
    int rc;

    rc = parse_guarded(in, len, MAX_HEAD, &r);
    ck_assert_msg(rc == (int)head_len, "%s: rc %d (%s), want %zu",
                  c->note, rc, r.error_msg ? r.error_msg : "", head_len);
    check_ok(c, &r);

    /* Every proper prefix of the head is incomplete, never an error ... */
    for (k = 0; k < head_len; k++) {
        rc = parse_guarded(in, k, MAX_HEAD, &r);
        ck_assert_msg(rc == GW_EAGAIN, "%s: prefix %zu gave %d (%s)",
                      c->note, k, rc, r.error_msg ? r.error_msg : "");
        ck_assert_int_eq(r.error_status, 0);
    }
    /* ... and the second piece completes it, whatever else follows. */
    for (k = head_len; k <= len; k++) {
        rc = parse_guarded(in, k, MAX_HEAD, &r);
        ck_assert_msg(rc == (int)head_len, "%s: %zu bytes gave %d",
                      c->note, k, rc);
        check_ok(c, &r);
    }
    free(in);
}
END_TEST

/* ---- refused requests ---------------------------------------------- */

struct bad_case {
    const char *in;
    size_t len;
    int status;
    const char *note;
};

#define RL "GET / HTTP/1.1\r\n"

static const struct bad_case bad_cases[] = {
    /* request line */
    { S("GET  / HTTP/1.1\r\n" H11 "\r\n"), 400, "two spaces after method" },
    { S("GET /  HTTP/1.1\r\n" H11 "\r\n"), 400, "two spaces after target" },
    { S(" GET / HTTP/1.1\r\n" H11 "\r\n"), 400, "leading space" },
    { S("GET / HTTP/1.1 \r\n" H11 "\r\n"), 400, "trailing space" },
    { S("GET\t/ HTTP/1.1\r\n" H11 "\r\n"), 400, "HTAB as separator" },
    { S("G(T / HTTP/1.1\r\n" H11 "\r\n"), 400, "method not a token" },
    { S("G\x80T / HTTP/1.1\r\n" H11 "\r\n"), 400, "non-ASCII method" },
    { S("GET\r\n" H11 "\r\n"), 400, "no target" },
    { S("GET /\r\n" H11 "\r\n"), 400, "HTTP/0.9 request line" },
    { S("GET http://a/ HTTP/1.1\r\n" H11 "\r\n"), 400, "absolute-form" },
    { S("CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\n\r\n"), 400,
      "CONNECT authority-form" },
    { S("CONNECT / HTTP/1.1\r\n" H11 "\r\n"), 400, "CONNECT at all" },
    { S("OPTIONS * HTTP/1.1\r\n" H11 "\r\n"), 400, "asterisk-form" },
    { S("GET a/b HTTP/1.1\r\n" H11 "\r\n"), 400, "relative target" },
    { S("GET /a#frag HTTP/1.1\r\n" H11 "\r\n"), 400, "fragment" },
    { S("GET /a%2 HTTP/1.1\r\n" H11 "\r\n"), 400, "short pct-encoding" },
    { S("GET /a%zz HTTP/1.1\r\n" H11 "\r\n"), 400, "bad pct-encoding" },
    { S("GET /a% HTTP/1.1\r\n" H11 "\r\n"), 400, "lone percent" },
    { S("GET /a\"b HTTP/1.1\r\n" H11 "\r\n"), 400, "quote in target" },
    { S("GET /a{b} HTTP/1.1\r\n" H11 "\r\n"), 400, "braces in target" },
    { S("GET /\x7f HTTP/1.1\r\n" H11 "\r\n"), 400, "DEL in target" },
    { S("GET /\xc3\xa9 HTTP/1.1\r\n" H11 "\r\n"), 400, "raw UTF-8 target" },
    { S("GET /\x00 HTTP/1.1\r\n" H11 "\r\n"), 400, "NUL in target" },
    { S("GET / HTTP/1.1\n" H11 "\r\n"), 400, "bare LF after request line" },
    { S("GET / HTTP/1.1\rHost: a\r\n\r\n"), 400, "bare CR after version" },
    { S("GET / http/1.1\r\n" H11 "\r\n"), 400, "lowercase version" },
    { S("GET / HTTP/1.10\r\n" H11 "\r\n"), 400, "two-digit minor" },
    { S("GET / HTTP/11\r\n" H11 "\r\n"), 400, "no dot" },
    { S("GET / HTTP/3\r\n" H11 "\r\n"), 400, "major only" },
    { S("GET / HTTPS/1.1\r\n" H11 "\r\n"), 400, "wrong protocol" },
    { S("GET / HTTP/2.0\r\n" H11 "\r\n"), 505, "HTTP/2.0" },
    { S("GET / HTTP/1.2\r\n" H11 "\r\n"), 505, "HTTP/1.2" },
    { S("GET / HTTP/0.9\r\n" H11 "\r\n"), 505, "HTTP/0.9" },
    { S("\r\r\nGET / HTTP/1.1\r\n" H11 "\r\n"), 400,
      "bare CR in the leading empty lines" },
    { S("\nGET / HTTP/1.1\r\n" H11 "\r\n"), 400, "leading bare LF" },
    /* field lines */
    { S(RL "Host: a\r\nX: b\n\r\n"), 400, "bare LF ending a field" },
    { S(RL "Host: a\nX: b\r\n\r\n"), 400, "bare LF ending Host" },
    { S(RL "Host: a\r\nX: b\rc\r\n\r\n"), 400, "bare CR in a value" },
    { S(RL "Host: a\r\n\n"), 400, "bare LF as the empty line" },
    { S(RL "Host: a\r\n\rX"), 400, "bare CR as the empty line" },
    { S(RL "Host : a\r\n\r\n"), 400, "space before colon" },
    { S(RL "Host\t: a\r\n\r\n"), 400, "HTAB before colon" },
    { S(RL "Host: a\r\nContent-Length : 5\r\n\r\n"), 400,
      "space before colon in Content-Length" },
    { S(RL "Host: a\r\nX: a\r\n b\r\n\r\n"), 400, "obs-fold" },
    { S(RL "Host: a\r\nX: a\r\n\tb\r\n\r\n"), 400, "obs-fold with HTAB" },
    { S(RL " Host: a\r\n\r\n"), 400, "whitespace before the first field" },
    { S(RL "Host: a\r\n: b\r\n\r\n"), 400, "empty field name" },
    { S(RL "Host: a\r\nXa\r\n\r\n"), 400, "no colon" },
    { S(RL "Host: a\r\nX(: a\r\n\r\n"), 400, "field name not a token" },
    { S(RL "Host: a\r\nX\x00: a\r\n\r\n"), 400, "NUL in a field name" },
    { S(RL "Host: a\r\nX: a\x00b\r\n\r\n"), 400, "NUL in a value" },
    { S(RL "Host: a\r\nX: a\x01\r\n\r\n"), 400, "CTL in a value" },
    { S(RL "Host: a\r\nX: a\x7f\r\n\r\n"), 400, "DEL in a value" },
    { S(RL "Host: a\r\nX: \x1b[31m\r\n\r\n"), 400, "ESC in a value" },
    /* Host */
    { S(RL "\r\n"), 400, "HTTP/1.1 without Host" },
    { S(RL "X-Host: a\r\n\r\n"), 400, "no Host, only a look-alike" },
    { S(RL "Host: a\r\nHost: a\r\n\r\n"), 400, "two identical Host" },
    { S(RL "Host: a\r\nhost: b\r\n\r\n"), 400, "two Host" },
    { S("GET / HTTP/1.0\r\nHost: a\r\nHost: b\r\n\r\n"), 400,
      "two Host on HTTP/1.0" },
    { S(RL "Host: a b\r\n\r\n"), 400, "space in Host" },
    { S(RL "Host: a/b\r\n\r\n"), 400, "slash in Host" },
    { S(RL "Host: user@a\r\n\r\n"), 400, "userinfo in Host" },
    /* Content-Length */
    { S(RL H11 "Content-Length: 5\r\nContent-Length: 5\r\n\r\n"), 400,
      "two identical Content-Length" },
    { S(RL H11 "Content-Length: 5\r\nContent-Length: 6\r\n\r\n"), 400,
      "two differing Content-Length" },
    { S(RL H11 "Content-Length: 5, 5\r\n\r\n"), 400,
      "Content-Length list form" },
    { S(RL H11 "Content-Length: 5,5\r\n\r\n"), 400,
      "Content-Length list form without space" },
    { S(RL H11 "Content-Length: -1\r\n\r\n"), 400, "negative" },
    { S(RL H11 "Content-Length: +5\r\n\r\n"), 400, "plus sign" },
    { S(RL H11 "Content-Length: 0x10\r\n\r\n"), 400, "hex" },
    { S(RL H11 "Content-Length: 1 2\r\n\r\n"), 400, "inner space" },
    { S(RL H11 "Content-Length: 5a\r\n\r\n"), 400, "trailing letter" },
    { S(RL H11 "Content-Length:\r\n\r\n"), 400, "empty" },
    { S(RL H11 "Content-Length: 18446744073709551616\r\n\r\n"), 400,
      "2^64 overflows" },
    { S(RL H11 "Content-Length: 99999999999999999999999\r\n\r\n"), 400,
      "far too large" },
    /* Transfer-Encoding */
    { S(RL H11 "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"),
      400, "CL then TE" },
    { S(RL H11 "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n"),
      400, "TE then CL" },
    { S(RL H11 "Transfer-Encoding: gzip, chunked\r\n\r\n"), 501,
      "unknown coding before chunked" },
    { S(RL H11 "Transfer-Encoding: identity, chunked\r\n\r\n"), 501,
      "identity is not a coding any more" },
    { S(RL H11 "Transfer-Encoding: gzip;level=1, chunked\r\n\r\n"), 501,
      "coding with parameters" },
    { S(RL H11 "Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n"
        "\r\n"), 501, "unknown coding in an earlier field" },
    { S(RL H11 "Transfer-Encoding: gzip\r\n\r\n"), 400,
      "chunked missing: length unknown (RFC 9112 6.3)" },
    { S(RL H11 "Transfer-Encoding: chunked, gzip\r\n\r\n"), 400,
      "chunked not final" },
    { S(RL H11 "Transfer-Encoding: chunked\r\nTransfer-Encoding: gzip\r\n"
        "\r\n"), 400, "chunked not final across fields" },
    { S(RL H11 "Transfer-Encoding: chunked, chunked\r\n\r\n"), 400,
      "chunked twice" },
    { S(RL H11 "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n"
        "\r\n"), 400, "chunked twice across fields" },
    { S(RL H11 "Transfer-Encoding: chunked;x=1\r\n\r\n"), 400,
      "chunked has no parameters" },
    { S(RL H11 "Transfer-Encoding:\r\n\r\n"), 400, "empty" },
    { S(RL H11 "Transfer-Encoding: ,\r\n\r\n"), 400, "only empty elements" },
    { S(RL H11 "Transfer-Encoding: chunked x\r\n\r\n"), 400,
      "two tokens in one element" },
    { S(RL H11 "Transfer-Encoding: xchunked\r\n\r\n"), 400,
      "look-alike coding" },
    { S(RL H11 "Transfer-Encoding: \"chunked\"\r\n\r\n"), 400,
      "quoted coding" },
    { S("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n"), 400,
      "Transfer-Encoding on HTTP/1.0 (RFC 9112 6.1)" },
};

START_TEST(test_parse_bad)
{
    const struct bad_case *c = &bad_cases[_i];
    struct http_request r;
    size_t k;
    int rc;

    rc = parse_guarded(c->in, c->len, MAX_HEAD, &r);
    ck_assert_msg(rc == rc_for_status(c->status) && r.error_status
                  == c->status, "%s: rc %d status %d (%s)", c->note, rc,
                  r.error_status, r.error_msg ? r.error_msg : "");
    ck_assert_ptr_nonnull(r.error_msg);
    ck_assert_uint_gt(strlen(r.error_msg), 0);

    /* A prefix is either incomplete or already refused the same way. */
    for (k = 0; k < c->len; k++) {
        rc = parse_guarded(c->in, k, MAX_HEAD, &r);
        if (rc == GW_EAGAIN) {
            ck_assert_int_eq(r.error_status, 0);
            continue;
        }
        ck_assert_msg(rc == rc_for_status(c->status)
                      && r.error_status == c->status,
                      "%s: prefix %zu gave %d/%d", c->note, k, rc,
                      r.error_status);
    }
}
END_TEST

/* Some refusals come with a message that says exactly what was wrong. */
START_TEST(test_parse_messages)
{
    static const struct {
        const char *in;
        const char *msg;
    } cases[] = {
        { RL "Host : a\r\n\r\n", "whitespace before colon in header field" },
        { RL "Host: a\r\nX: 1\r\n 2\r\n\r\n",
          "obs-fold or whitespace at start of field line" },
        { RL "Host: a\nX", "bare LF without CR" },
        { RL "Host: a\rX", "bare CR not followed by LF" },
        { RL "\r\n", "missing Host" },
        { "GET / HTTP/2.0\r\n", "HTTP version not supported" },
    };
    struct http_request r;
    size_t i;

    for (i = 0; i < GW_ARRAY_LEN(cases); i++) {
        parse_guarded(cases[i].in, strlen(cases[i].in), MAX_HEAD, &r);
        ck_assert_ptr_nonnull(r.error_msg);
        ck_assert_str_eq(r.error_msg, cases[i].msg);
    }
}
END_TEST

/* ---- refused before the head is complete --------------------------- */

static const struct bad_case early_cases[] = {
    { S("G(T"), 400, "bad method byte" },
    { S("GET http:"), 400, "absolute-form at its first byte" },
    { S("GET /a b"), 400, "version starts wrong" },
    { S("GET / HTTP/2.0\r"), 505, "version known at its CR" },
    { S("GET / HTTP/1.1\n"), 400, "bare LF" },
    { S(RL "Host : "), 400, "space before colon" },
    { S(RL "Host: a\r\n "), 400, "obs-fold at its first byte" },
    { S(RL "Host: a\r\nX: \x01"), 400, "CTL in a value" },
    { S(RL "Host: a\r\nHost: b\r\n"), 400, "second Host" },
    { S(RL H11 "Content-Length: 1\r\nContent-Length: 1\r\n"), 400,
      "second Content-Length" },
    { S(RL H11 "Content-Length: 1\r\nTransfer-Encoding: chunked\r\n"), 400,
      "CL and TE" },
    { S(RL H11 "Transfer-Encoding: chunked, gzip\r\n"), 400,
      "chunked not final" },
};

START_TEST(test_parse_early)
{
    const struct bad_case *c = &early_cases[_i];
    struct http_request r;
    int rc;

    rc = parse_guarded(c->in, c->len, MAX_HEAD, &r);
    ck_assert_msg(rc == rc_for_status(c->status)
                  && r.error_status == c->status,
                  "%s: rc %d status %d", c->note, rc, r.error_status);
}
END_TEST

/* ---- limits -------------------------------------------------------- */

/* "GET /aaa... HTTP/1.1" of exactly 'line_len' bytes, then fields. */
static char *
long_request(size_t line_len, const char *fields, size_t *len)
{
    size_t target_len = line_len - strlen("GET  HTTP/1.1");
    size_t n = line_len + 2 + strlen(fields);
    char *p = malloc(n + 1), *q = p;

    ck_assert_ptr_nonnull(p);
    memcpy(q, "GET /", 5);
    q += 5;
    memset(q, 'a', target_len - 1);
    q += target_len - 1;
    memcpy(q, " HTTP/1.1\r\n", 11);
    q += 11;
    strcpy(q, fields);
    *len = n;
    return p;
}

START_TEST(test_limit_request_line)
{
    struct http_request r;
    size_t len, head_len;
    char *in;
    int rc;

    in = long_request(HTTP_MAX_REQUEST_LINE, H11 "\r\n", &len);
    rc = parse_guarded(in, len, MAX_HEAD, &r);
    ck_assert_int_eq(rc, (int)len);
    ck_assert_uint_eq(r.target_len, HTTP_MAX_REQUEST_LINE - 13);
    /* Up to its CR the longest line is still only incomplete. */
    rc = parse_guarded(in, HTTP_MAX_REQUEST_LINE + 1, MAX_HEAD, &r);
    ck_assert_int_eq(rc, GW_EAGAIN);
    free(in);

    in = long_request(HTTP_MAX_REQUEST_LINE + 1, H11 "\r\n", &len);
    rc = parse_guarded(in, len, MAX_HEAD, &r);
    ck_assert_int_eq(rc, GW_ETOOBIG);
    ck_assert_int_eq(r.error_status, 414);
    free(in);

    /* Refused early: no CR yet, but already too long. */
    in = long_request(HTTP_MAX_REQUEST_LINE + 100, "", &len);
    head_len = HTTP_MAX_REQUEST_LINE;
    rc = parse_guarded(in, head_len, MAX_HEAD, &r);
    ck_assert_int_eq(rc, GW_EAGAIN);
    rc = parse_guarded(in, head_len + 1, MAX_HEAD, &r);
    ck_assert_int_eq(rc, GW_ETOOBIG);
    ck_assert_int_eq(r.error_status, 414);
    free(in);

    /* A long method is as bad as a long target. */
    in = malloc(HTTP_MAX_REQUEST_LINE + 1);
    ck_assert_ptr_nonnull(in);
    memset(in, 'G', HTTP_MAX_REQUEST_LINE + 1);
    rc = parse_guarded(in, HTTP_MAX_REQUEST_LINE + 1, MAX_HEAD, &r);
    ck_assert_int_eq(r.error_status, 414);
    free(in);
}
END_TEST

START_TEST(test_limit_head_size)
{
    struct http_request r;
    size_t len, max;
    char *in;
    int rc;

    in = long_request(100, H11 "X-Pad: 0123456789\r\n\r\n", &len);
    max = len;
    rc = parse_guarded(in, len, max, &r);
    ck_assert_int_eq(rc, (int)len);             /* exactly max_head */
    rc = parse_guarded(in, len, max - 1, &r);
    ck_assert_int_eq(rc, GW_ETOOBIG);
    ck_assert_int_eq(r.error_status, 431);
    /* Early: max_head - 1 bytes of an unfinished head is enough. */
    rc = parse_guarded(in, max - 1, max - 1, &r);
    ck_assert_int_eq(rc, GW_ETOOBIG);
    ck_assert_int_eq(r.error_status, 431);
    rc = parse_guarded(in, max - 2, max - 1, &r);
    ck_assert_int_eq(rc, GW_EAGAIN);
    /* Bytes past the head do not count against max_head. */
    free(in);
    in = long_request(100, H11 "\r\nGET / HTTP/1.1\r\n", &len);
    rc = parse_guarded(in, len, 100 + 2 + strlen(H11) + 2, &r);
    ck_assert_int_eq(rc, (int)(100 + 2 + strlen(H11) + 2));
    /* A huge max_head still works (the length is returned as an int). */
    rc = parse_guarded(in, len, SIZE_MAX, &r);
    ck_assert_int_eq(rc, (int)(100 + 2 + strlen(H11) + 2));
    free(in);
    /* A tiny one refuses at once. */
    rc = parse_guarded("GET", 3, 2, &r);
    ck_assert_int_eq(rc, GW_ETOOBIG);
    ck_assert_int_eq(r.error_status, 431);
    rc = parse_guarded("", 0, MAX_HEAD, &r);
    ck_assert_int_eq(rc, GW_EAGAIN);
}
END_TEST

/* A request with 'n' fields (Host and X-N: filler) and no end yet. */
static size_t
many_fields(char *p, size_t cap, size_t n)
{
    size_t len, i;

    len = (size_t)snprintf(p, cap, RL H11);
    for (i = 1; i < n; i++)
        len += (size_t)snprintf(p + len, cap - len, "X-%zu: v\r\n", i);
    return len;
}

START_TEST(test_limit_field_count)
{
    static char in[8192];
    struct http_request r;
    size_t len;
    int rc;

    len = many_fields(in, sizeof(in), HTTP_MAX_HEADERS);
    memcpy(in + len, "\r\n", 3);
    rc = parse_guarded(in, len + 2, MAX_HEAD, &r);
    ck_assert_int_eq(rc, (int)len + 2);
    ck_assert_uint_eq(r.num_headers, HTTP_MAX_HEADERS);
    ck_assert_ptr_nonnull(http_find_header(&r, "x-63"));

    len = many_fields(in, sizeof(in), HTTP_MAX_HEADERS + 1);
    memcpy(in + len, "\r\n", 3);
    rc = parse_guarded(in, len + 2, MAX_HEAD, &r);
    ck_assert_int_eq(rc, GW_ETOOBIG);
    ck_assert_int_eq(r.error_status, 431);

    /* Early: the first byte of field 65 is enough. */
    len = many_fields(in, sizeof(in), HTTP_MAX_HEADERS);
    rc = parse_guarded(in, len, MAX_HEAD, &r);
    ck_assert_int_eq(rc, GW_EAGAIN);
    in[len] = 'X';
    rc = parse_guarded(in, len + 1, MAX_HEAD, &r);
    ck_assert_int_eq(rc, GW_ETOOBIG);
    ck_assert_int_eq(r.error_status, 431);
}
END_TEST

/* ---- every byte value in every place ------------------------------- */

static int
in_set(int b, const char *set)
{
    return b != 0 && strchr(set, b) != NULL;
}

static int
is_alnum(int b)
{
    return (b >= 'a' && b <= 'z') || (b >= 'A' && b <= 'Z')
           || (b >= '0' && b <= '9');
}

/* RFC 9110 5.6.2 */
static int
is_tchar(int b)
{
    return is_alnum(b) || in_set(b, "!#$%&'*+-.^_`|~");
}

/* RFC 3986 2.3, 2.2 */
static int
is_unreserved_or_sub_delim(int b)
{
    return is_alnum(b) || in_set(b, "-._~") || in_set(b, "!$&'()*+,;=");
}

/* RFC 9110 5.5: VCHAR, obs-text, SP, HTAB */
static int
is_field_byte(int b)
{
    return b == '\t' || (b >= 0x20 && b <= 0x7e) || b >= 0x80;
}

static int
parse_with_byte(const char *fmt_a, int b, const char *fmt_b)
{
    char in[256];
    struct http_request r;
    size_t na = strlen(fmt_a), nb = strlen(fmt_b);

    memcpy(in, fmt_a, na);
    in[na] = (char)b;
    memcpy(in + na + 1, fmt_b, nb);
    return parse_guarded(in, na + 1 + nb, MAX_HEAD, &r);
}

START_TEST(test_parse_alphabet)
{
    int b, rc, want;

    for (b = 0; b < 256; b++) {
        rc = parse_with_byte("G", b, "T / HTTP/1.1\r\n" H11 "\r\n");
        ck_assert_msg((rc > 0) == is_tchar(b), "method byte 0x%02x", b);

        rc = parse_with_byte("GET /a", b, "b HTTP/1.1\r\n" H11 "\r\n");
        want = is_unreserved_or_sub_delim(b) || in_set(b, ":@/?");
        ck_assert_msg((rc > 0) == want, "target byte 0x%02x", b);

        rc = parse_with_byte(RL H11 "X", b, "Y: z\r\n\r\n");
        want = is_tchar(b) || b == ':';     /* "X:Y: z" is field X */
        ck_assert_msg((rc > 0) == want, "name byte 0x%02x", b);

        rc = parse_with_byte(RL H11 "X: a", b, "b\r\n\r\n");
        ck_assert_msg((rc > 0) == is_field_byte(b), "value byte 0x%02x", b);

        rc = parse_with_byte(RL "Host: a", b, "b\r\n\r\n");
        want = is_unreserved_or_sub_delim(b) || in_set(b, ":[]%");
        ck_assert_msg((rc > 0) == want, "Host byte 0x%02x", b);
    }
}
END_TEST

/* ---- small helpers ------------------------------------------------- */

START_TEST(test_has_token)
{
    ck_assert(http_has_token(S("close"), "close"));
    ck_assert(http_has_token(S("Close"), "close"));
    ck_assert(http_has_token(S("a, close"), "close"));
    ck_assert(http_has_token(S("a,close ,b"), "close"));
    ck_assert(http_has_token(S(" \tclose\t "), "close"));
    ck_assert(http_has_token(S(",,close,,"), "close"));
    ck_assert(!http_has_token(S("closed"), "close"));
    ck_assert(!http_has_token(S("xclose"), "close"));
    ck_assert(!http_has_token(S("clo se"), "close"));
    ck_assert(!http_has_token(S(""), "close"));
    ck_assert(!http_has_token(S(","), "close"));
    /* the value need not be NUL-terminated */
    ck_assert(http_has_token(GUARDED("keep-alive"), "keep-alive"));
    ck_assert(!http_has_token(GUARDED("keep-aliv"), "keep-alive"));
}
END_TEST

START_TEST(test_find_header)
{
    static const char in[] = RL "Host: a\r\nX-A: 1\r\nx-a: 2\r\n\r\n";
    struct http_request r;
    const struct http_header *h;

    ck_assert_int_gt(parse_guarded(in, sizeof(in) - 1, MAX_HEAD, &r), 0);
    h = http_find_header(&r, "X-a");
    ck_assert_ptr_nonnull(h);
    ck_assert(view_eq(h->value, h->value_len, "1"));    /* the first one */
    ck_assert_ptr_null(http_find_header(&r, "X"));
    ck_assert_ptr_null(http_find_header(&r, "X-AB"));
    ck_assert_ptr_null(http_find_header(&r, ""));
}
END_TEST

/* max-age=N as a client's Cache-Control has it (coalesce.h's cache). */
static const struct {
    const char *fields;
    int found;
    int64_t seconds;
    const char *note;
} seconds_cases[] = {
    { "Cache-Control: max-age=60\r\n", 1, 60, "plain" },
    { "Cache-Control: no-cache, MAX-AGE = 5 \r\n", 1, 5, "case, blanks" },
    { "Cache-Control: max-age=\"7\"\r\n", 1, 7, "quoted" },
    { "Cache-Control: max-age=9\r\ncache-control: max-age=3\r\n", 1, 3,
      "two lines: the smallest" },
    { "Cache-Control: max-age=soon\r\n", 0, 0, "not digits: ignored" },
    { "Cache-Control: max-age=-1\r\n", 0, 0, "negative: ignored" },
    { "Cache-Control: max-age=\r\n", 0, 0, "empty" },
    { "Cache-Control: max-age\r\n", 0, 0, "no argument" },
    { "Cache-Control: xmax-age=1, max-stale=2\r\n", 0, 0, "other names" },
    { "Pragma: max-age=1\r\n", 0, 0, "another field" },
    { "Cache-Control: max-age=99999999999999999999999\r\n", 1,
      INT64_MAX / 1000, "too large: capped" },
};

START_TEST(test_lists_seconds)
{
    char in[256];
    struct http_request r;
    int64_t v = -2;
    int found;

    snprintf(in, sizeof(in), RL "Host: a\r\n%s\r\n",
             seconds_cases[_i].fields);
    ck_assert_int_gt(parse_guarded(in, strlen(in), MAX_HEAD, &r), 0);
    found = http_lists_seconds(&r, "Cache-Control", "max-age", &v);
    ck_assert_msg(found == seconds_cases[_i].found, "%s",
                  seconds_cases[_i].note);
    if (found)
        ck_assert_msg(v == seconds_cases[_i].seconds, "%s: %lld",
                      seconds_cases[_i].note, (long long)v);
}
END_TEST

START_TEST(test_reason)
{
    ck_assert_str_eq(http_reason(200), "OK");
    ck_assert_str_eq(http_reason(400), "Bad Request");
    ck_assert_str_eq(http_reason(404), "Not Found");
    ck_assert_str_eq(http_reason(408), "Request Timeout");
    ck_assert_str_eq(http_reason(413), "Content Too Large");
    ck_assert_str_eq(http_reason(414), "URI Too Long");
    ck_assert_str_eq(http_reason(431), "Request Header Fields Too Large");
    ck_assert_str_eq(http_reason(501), "Not Implemented");
    ck_assert_str_eq(http_reason(502), "Bad Gateway");
    ck_assert_str_eq(http_reason(505), "HTTP Version Not Supported");
    ck_assert_ptr_nonnull(http_reason(299));
    ck_assert_ptr_nonnull(http_reason(-1));
}
END_TEST

static Suite *
http_suite(void)
{
    Suite *s = suite_create("http");
    TCase *tc;

    tc = tcase_create("parse_ok");
    tcase_add_checked_fixture(tc, arena_setup, arena_teardown);
    tcase_add_loop_test(tc, test_parse_ok, 0, (int)GW_ARRAY_LEN(ok_cases));
    tcase_set_timeout(tc, 30);
    suite_add_tcase(s, tc);

    tc = tcase_create("parse_refused");
    tcase_add_checked_fixture(tc, arena_setup, arena_teardown);
    tcase_add_loop_test(tc, test_parse_bad, 0, (int)GW_ARRAY_LEN(bad_cases));
    tcase_add_test(tc, test_parse_messages);
    tcase_set_timeout(tc, 30);
    suite_add_tcase(s, tc);

    tc = tcase_create("parse_refused_early");
    tcase_add_checked_fixture(tc, arena_setup, arena_teardown);
    tcase_add_loop_test(tc, test_parse_early, 0,
                        (int)GW_ARRAY_LEN(early_cases));
    tcase_set_timeout(tc, 10);
    suite_add_tcase(s, tc);

    tc = tcase_create("parse_limits");
    tcase_add_checked_fixture(tc, arena_setup, arena_teardown);
    tcase_add_test(tc, test_limit_request_line);
    tcase_add_test(tc, test_limit_head_size);
    tcase_add_test(tc, test_limit_field_count);
    tcase_set_timeout(tc, 10);
    suite_add_tcase(s, tc);

    tc = tcase_create("parse_alphabet");
    tcase_add_checked_fixture(tc, arena_setup, arena_teardown);
    tcase_add_test(tc, test_parse_alphabet);
    tcase_set_timeout(tc, 10);
    suite_add_tcase(s, tc);

    tc = tcase_create("field_helpers");
    tcase_add_checked_fixture(tc, arena_setup, arena_teardown);
    tcase_add_test(tc, test_has_token);
    tcase_add_test(tc, test_find_header);
    tcase_add_loop_test(tc, test_lists_seconds, 0,
                        (int)GW_ARRAY_LEN(seconds_cases));
    tcase_add_test(tc, test_reason);
    tcase_set_timeout(tc, 10);
    suite_add_tcase(s, tc);

    return s;
}

int
main(void)
{
    return test_run(srunner_create(http_suite()));
}
