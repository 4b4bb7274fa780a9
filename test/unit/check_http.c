/* SPDX-License-Identifier: MIT */
/*
 * check_http.c - unit tests for common/http.c: the request parser, the
 * response head checks, the chunked decoder and the blocking readers.
 *
 * Parser and decoder tests are tables of (input, expected result, note).
 * Every input is copied so that its last byte sits right before a
 * PROT_NONE page: a read past the end crashes the test instead of passing
 * by luck (picohttpparser's test.c).  Valid inputs are also fed cut at
 * every byte offset.  Reader tests run over socketpair(); timeouts are
 * short and nothing depends on a sleep being long enough.
 */
#include <check.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "alloc.h"
#include "buf.h"
#include "http.h"
#include "net.h"
#include "testutil.h"
#include "util.h"

/* A string literal as (pointer, length), so inputs may hold NUL bytes. */
#define S(lit) lit, sizeof(lit) - 1

#define MAX_HEAD 16384

/* A literal copied against the guard page, as (pointer, length). */
#define GUARDED(lit) guarded(S(lit)), sizeof(lit) - 1

/* ---- guard page ---------------------------------------------------- */

#define ARENA_LEN (256 * 1024)

static char *arena_map;
static size_t arena_map_len;
static char *arena_end;         /* first byte of the PROT_NONE page */

static void
arena_setup(void)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);

    arena_map_len = ARENA_LEN + page;
    arena_map = mmap(NULL, arena_map_len, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ck_assert_ptr_ne(arena_map, MAP_FAILED);
    arena_end = arena_map + ARENA_LEN;
    ck_assert_int_eq(mprotect(arena_end, page, PROT_NONE), 0);
}

static void
arena_teardown(void)
{
    munmap(arena_map, arena_map_len);
}

/* Copy p[0..n) so that it ends at the guard page; returns the copy. */
static const char *
guarded(const char *p, size_t n)
{
    ck_assert_uint_le(n, ARENA_LEN);
    if (n > 0)
        memmove(arena_end - n, p, n);
    return arena_end - n;
}

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

/* ---- readers over a socketpair -------------------------------------- */

struct conn_fixture {
    int rd;                     /* our end, non-blocking */
    struct net_stream stream;   /* rd, plain */
    int wr;                     /* the peer, blocking; -1 once closed */
    struct buf in;
    struct buf head;
    struct buf body;
    struct http_request r;
};

static void
conn_open(struct conn_fixture *f)
{
    int sv[2];

    ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv),
                     0);
    ck_assert_int_eq(net_set_nonblock(sv[0]), 0);
    f->rd = sv[0];
    f->wr = sv[1];
    net_stream_init(&f->stream, f->rd);
    buf_init(&f->in, 65536);
    buf_init(&f->head, MAX_HEAD);
    buf_init(&f->body, 1 << 20);
}

static void
conn_close(struct conn_fixture *f)
{
    close(f->rd);
    if (f->wr != -1)
        close(f->wr);
    buf_release(&f->in);
    buf_release(&f->head);
    buf_release(&f->body);
}

static void
peer_send(struct conn_fixture *f, const char *p, size_t n)
{
    ck_assert_int_eq(send(f->wr, p, n, MSG_NOSIGNAL), (ssize_t)n);
}

static void
peer_close(struct conn_fixture *f)
{
    close(f->wr);
    f->wr = -1;
}

static int
read_head(struct conn_fixture *f, int header_timeout_ms)
{
    return http_read_head(&f->stream, &f->in, &f->head, MAX_HEAD, -1,
                          header_timeout_ms, -1, -1, &f->r);
}

static int
read_body(struct conn_fixture *f)
{
    return http_read_body(&f->stream, &f->in, &f->r, &f->body,
                          gw_now_ms() + 5000, -1);
}

/* A peer that writes its bytes in pieces from another thread. */
struct trickle {
    int fd;
    const char *p;
    size_t len;
    size_t piece;
    pthread_t tid;
};

static void *
trickle_main(void *arg)
{
    struct trickle *t = arg;
    size_t off, n;

    for (off = 0; off < t->len; off += n) {
        n = t->len - off < t->piece ? t->len - off : t->piece;
        if (send(t->fd, t->p + off, n, MSG_NOSIGNAL) != (ssize_t)n)
            break;
        /* Only to split the bytes into segments; timing is not checked. */
        if (t->piece < 64)
            usleep(200);
    }
    return NULL;
}

static void
trickle_start(struct trickle *t, int fd, const char *p, size_t len,
              size_t piece)
{
    t->fd = fd;
    t->p = p;
    t->len = len;
    t->piece = piece;
    ck_assert_int_eq(pthread_create(&t->tid, NULL, trickle_main, t), 0);
}

static void
trickle_join(struct trickle *t)
{
    pthread_join(t->tid, NULL);
}

START_TEST(test_read_content_length)
{
    static const char req[] =
        "POST /v1/x HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello";
    struct conn_fixture f;

    conn_open(&f);
    peer_send(&f, S(req));
    ck_assert_int_eq(read_head(&f, 1000), 0);
    ck_assert(view_eq(f.r.method, f.r.method_len, "POST"));
    ck_assert(view_eq(f.r.path, f.r.path_len, "/v1/x"));
    ck_assert_int_eq(f.r.body_kind, HTTP_BODY_LENGTH);
    ck_assert_int_eq(read_body(&f), 0);
    ck_assert_str_eq(buf_ptr(&f.body), "hello");
    ck_assert_uint_eq(buf_len(&f.in), 0);
    conn_close(&f);
}
END_TEST

START_TEST(test_read_chunked)
{
    static const char req[] =
        "POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
        "5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-T: 1\r\n\r\n";
    struct conn_fixture f;

    conn_open(&f);
    peer_send(&f, S(req));
    ck_assert_int_eq(read_head(&f, 1000), 0);
    ck_assert_int_eq(f.r.body_kind, HTTP_BODY_CHUNKED);
    ck_assert_int_eq(read_body(&f), 0);
    ck_assert_str_eq(buf_ptr(&f.body), "hello world");
    ck_assert_uint_eq(buf_len(&f.in), 0);
    conn_close(&f);
}
END_TEST

START_TEST(test_read_trickle)
{
    static const char req[] =
        "POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
        "5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
        "POST /y HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc";
    struct conn_fixture f;
    struct trickle t;

    conn_open(&f);
    trickle_start(&t, f.wr, S(req), 1);
    ck_assert_int_eq(read_head(&f, 5000), 0);
    ck_assert(view_eq(f.r.path, f.r.path_len, "/x"));
    ck_assert_int_eq(read_body(&f), 0);
    ck_assert_str_eq(buf_ptr(&f.body), "hello world");
    ck_assert_int_eq(read_head(&f, 5000), 0);
    ck_assert(view_eq(f.r.path, f.r.path_len, "/y"));
    ck_assert_int_eq(read_body(&f), 0);
    ck_assert_str_eq(buf_ptr(&f.body), "abc");
    trickle_join(&t);
    conn_close(&f);
}
END_TEST

START_TEST(test_read_large_body)
{
    size_t n = 300 * 1000, i;
    char *req = malloc(n + 100);
    struct conn_fixture f;
    struct trickle t;
    int hl;

    ck_assert_ptr_nonnull(req);
    hl = snprintf(req, 100, "PUT /x HTTP/1.1\r\nHost: a\r\n"
                  "Content-Length: %zu\r\n\r\n", n);
    for (i = 0; i < n; i++)
        req[hl + (int)i] = (char)('a' + i % 26);
    conn_open(&f);
    trickle_start(&t, f.wr, req, (size_t)hl + n, 7000);
    ck_assert_int_eq(read_head(&f, 5000), 0);
    ck_assert_int_eq(read_body(&f), 0);
    ck_assert_uint_eq(buf_len(&f.body), n);
    ck_assert(memcmp(buf_ptr(&f.body), req + hl, n) == 0);
    trickle_join(&t);
    conn_close(&f);
    free(req);
}
END_TEST

START_TEST(test_read_pipelined)
{
    static const char reqs[] =
        "GET /a HTTP/1.1\r\nHost: a\r\n\r\n"
        "POST /b HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc"
        "POST /c HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
        "1\r\nx\r\n0\r\n\r\n"
        "GET /d HTTP/1.1\r\nHost: a\r\n\r\n";
    struct conn_fixture f;
    char *dst;
    size_t before;

    conn_open(&f);
    peer_send(&f, S(reqs));
    ck_assert_int_eq(read_head(&f, 1000), 0);
    ck_assert(view_eq(f.r.path, f.r.path_len, "/a"));
    before = buf_len(&f.in);
    ck_assert_uint_gt(before, 0);               /* the rest waits in 'in' */
    ck_assert_int_eq(read_body(&f), 0);
    ck_assert_uint_eq(buf_len(&f.body), 0);
    ck_assert_uint_eq(buf_len(&f.in), before);

    /* The views live in 'head': moving 'in' does not disturb them. */
    buf_compact(&f.in);
    ck_assert_int_eq(buf_reserve(&f.in, 60000, &dst), 0);
    ck_assert(view_eq(f.r.method, f.r.method_len, "GET"));
    ck_assert(view_eq(f.r.target, f.r.target_len, "/a"));
    ck_assert(view_eq(f.r.headers[0].value, f.r.headers[0].value_len, "a"));

    ck_assert_int_eq(read_head(&f, 1000), 0);
    ck_assert(view_eq(f.r.path, f.r.path_len, "/b"));
    ck_assert_int_eq(read_body(&f), 0);
    ck_assert_str_eq(buf_ptr(&f.body), "abc");
    ck_assert_int_eq(read_head(&f, 1000), 0);
    ck_assert(view_eq(f.r.path, f.r.path_len, "/c"));
    ck_assert_int_eq(read_body(&f), 0);
    ck_assert_str_eq(buf_ptr(&f.body), "x");
    peer_close(&f);
    ck_assert_int_eq(read_head(&f, 1000), 0);  /* already in 'in' */
    ck_assert(view_eq(f.r.path, f.r.path_len, "/d"));
    ck_assert_int_eq(read_head(&f, 1000), GW_ECLOSED);
    ck_assert_int_eq(f.r.error_status, 0);
    conn_close(&f);
}
END_TEST

START_TEST(test_read_closed)
{
    struct conn_fixture f;

    conn_open(&f);
    peer_close(&f);
    ck_assert_int_eq(read_head(&f, 1000), GW_ECLOSED);
    conn_close(&f);

    conn_open(&f);
    peer_send(&f, S("GET / HTTP/1.1\r\nHo"));
    peer_close(&f);
    ck_assert_int_eq(read_head(&f, 1000), GW_ECLOSED);
    conn_close(&f);

    conn_open(&f);
    peer_send(&f, S("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 9\r\n\r\n"
                    "abc"));
    peer_close(&f);
    ck_assert_int_eq(read_head(&f, 1000), 0);
    ck_assert_int_eq(read_body(&f), GW_ECLOSED);
    conn_close(&f);

    conn_open(&f);
    peer_send(&f, S("POST / HTTP/1.1\r\nHost: a\r\n"
                    "Transfer-Encoding: chunked\r\n\r\n5\r\nab"));
    peer_close(&f);
    ck_assert_int_eq(read_head(&f, 1000), 0);
    ck_assert_int_eq(read_body(&f), GW_ECLOSED);
    conn_close(&f);
}
END_TEST

START_TEST(test_read_header_timeout)
{
    struct conn_fixture f;
    int64_t t0;

    /* Some bytes, then silence: 408 after the header timeout. */
    conn_open(&f);
    peer_send(&f, S("GET / HTTP/1.1\r\nHost"));
    t0 = gw_now_ms();
    ck_assert_int_eq(http_read_head(&f.stream, &f.in, &f.head, MAX_HEAD, -1, 150,
                                    -1, -1, &f.r), GW_ETIMEDOUT);
    ck_assert_int_eq(f.r.error_status, 408);
    ck_assert_ptr_nonnull(f.r.error_msg);
    ck_assert_int_ge(gw_now_ms() - t0, 140);
    conn_close(&f);

    /* Nothing at all: the idle deadline, and no status to send. */
    conn_open(&f);
    ck_assert_int_eq(http_read_head(&f.stream, &f.in, &f.head, MAX_HEAD,
                                    gw_now_ms() + 100, 10000, -1, -1, &f.r),
                     GW_ETIMEDOUT);
    ck_assert_int_eq(f.r.error_status, 0);
    conn_close(&f);

    /*
     * A pipelined partial head counts as started: a past idle deadline
     * does not apply, the header timeout does.
     */
    conn_open(&f);
    ck_assert_int_eq(buf_append_str(&f.in, "GET / HT"), 0);
    t0 = gw_now_ms();
    ck_assert_int_eq(http_read_head(&f.stream, &f.in, &f.head, MAX_HEAD,
                                    gw_now_ms() - 1, 150, -1, -1, &f.r),
                     GW_ETIMEDOUT);
    ck_assert_int_eq(f.r.error_status, 408);
    ck_assert_int_ge(gw_now_ms() - t0, 140);
    conn_close(&f);
}
END_TEST

static const struct {
    const char *raw;            /* head and as much body as was sent */
    int rc;
    size_t got;                 /* body bytes taken */
} wake_bodies[] = {
    { "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 9\r\n\r\nabc",
      GW_EABORTED, 3 },
    { "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
      "5\r\nab", GW_EABORTED, 2 },
    { "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc", 0, 3 },
};

START_TEST(test_read_wake)
{
    struct conn_fixture f;
    int pfd[2];

    ck_assert_int_eq(pipe(pfd), 0);
    ck_assert_int_eq(write(pfd[1], "x", 1), 1);

    /* Idle and draining: give up at once. */
    conn_open(&f);
    ck_assert_int_eq(http_read_head(&f.stream, &f.in, &f.head, MAX_HEAD, -1,
                                    10000, pfd[0], -1, &f.r), GW_EABORTED);
    ck_assert_int_eq(f.r.error_status, 0);
    conn_close(&f);

    /* A request already under way is not interrupted by draining... */
    conn_open(&f);
    peer_send(&f, S("GET / HTTP/1.1\r\n"));
    ck_assert_int_eq(http_read_head(&f.stream, &f.in, &f.head, MAX_HEAD, -1,
                                    150, pfd[0], -1, &f.r), GW_ETIMEDOUT);
    ck_assert_int_eq(f.r.error_status, 408);
    conn_close(&f);

    /* ... but by stopping, at once. */
    conn_open(&f);
    peer_send(&f, S("GET / HTTP/1.1\r\n"));
    ck_assert_int_eq(http_read_head(&f.stream, &f.in, &f.head, MAX_HEAD, -1,
                                    10000, pfd[0], pfd[0], &f.r),
                     GW_EABORTED);
    conn_close(&f);

    /* A complete request is returned even while draining. */
    conn_open(&f);
    peer_send(&f, S("GET / HTTP/1.1\r\nHost: a\r\n\r\n"));
    ck_assert_int_eq(http_read_head(&f.stream, &f.in, &f.head, MAX_HEAD, -1,
                                    150, pfd[0], pfd[0], &f.r), 0);
    conn_close(&f);

    /*
     * A body wait ends at the wake (the process stops), for either
     * framing, and bytes already there are still taken; a complete body
     * is read whatever the wake says.
     */
    for (size_t i = 0; i < GW_ARRAY_LEN(wake_bodies); i++) {
        conn_open(&f);
        peer_send(&f, wake_bodies[i].raw, strlen(wake_bodies[i].raw));
        ck_assert_int_eq(read_head(&f, 1000), 0);
        ck_assert_int_eq(http_read_body(&f.stream, &f.in, &f.r, &f.body,
                                         gw_now_ms() + 10000, pfd[0]),
                         wake_bodies[i].rc);
        ck_assert_uint_eq(buf_len(&f.body), wake_bodies[i].got);
        conn_close(&f);
    }
    close(pfd[0]);
    close(pfd[1]);
}
END_TEST

START_TEST(test_read_head_errors)
{
    struct conn_fixture f;
    char big[MAX_HEAD + 10];
    int pfd[2];

    /* A refused head: the parser's status comes through. */
    conn_open(&f);
    peer_send(&f, S("GET / HTTP/1.1\r\nHost : a\r\n\r\n"));
    ck_assert_int_eq(read_head(&f, 1000), GW_EPARSE);
    ck_assert_int_eq(f.r.error_status, 400);
    conn_close(&f);

    /* Refused early: the connection stays open, nothing more is sent. */
    conn_open(&f);
    peer_send(&f, S("GET / HTTP/2.0\r"));
    ck_assert_int_eq(read_head(&f, 1000), GW_EPARSE);
    ck_assert_int_eq(f.r.error_status, 505);
    conn_close(&f);

    /* Too large for max_head. */
    conn_open(&f);
    memset(big, 'a', sizeof(big));
    memcpy(big, "GET / HTTP/1.1\r\nX: ", 19);
    peer_send(&f, big, sizeof(big));
    ck_assert_int_eq(read_head(&f, 1000), GW_ETOOBIG);
    ck_assert_int_eq(f.r.error_status, 431);
    conn_close(&f);

    /* Too large for 'in', whose limit is below max_head. */
    conn_open(&f);
    f.in.limit = 100;
    peer_send(&f, big, 200);
    ck_assert_int_eq(read_head(&f, 1000), GW_ETOOBIG);
    ck_assert_int_eq(f.r.error_status, 431);
    conn_close(&f);

    /* Too large for 'head' (a caller's mistake, still refused). */
    conn_open(&f);
    f.head.limit = 10;
    peer_send(&f, S("GET / HTTP/1.1\r\nHost: a\r\n\r\n"));
    ck_assert_int_eq(read_head(&f, 1000), GW_ETOOBIG);
    ck_assert_int_eq(f.r.error_status, 431);
    conn_close(&f);

    /* Not a socket: recv() fails, GW_EIO. */
    ck_assert_int_eq(pipe(pfd), 0);
    ck_assert_int_eq(write(pfd[1], "G", 1), 1);
    buf_init(&f.in, 1000);
    buf_init(&f.head, 1000);
    net_stream_init(&f.stream, pfd[0]);
    ck_assert_int_eq(http_read_head(&f.stream, &f.in, &f.head, MAX_HEAD, -1,
                                    1000, -1, -1, &f.r), GW_EIO);
    buf_release(&f.in);
    buf_release(&f.head);
    close(pfd[0]);
    close(pfd[1]);
}
END_TEST

START_TEST(test_read_body_errors)
{
    struct conn_fixture f;

    /* Content-Length over the limit: refused before reading it. */
    conn_open(&f);
    f.body.limit = 10;
    peer_send(&f, S("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 11\r\n"
                    "\r\n"));
    ck_assert_int_eq(read_head(&f, 1000), 0);
    ck_assert_int_eq(read_body(&f), GW_ETOOBIG);
    ck_assert_int_eq(f.r.error_status, 413);
    conn_close(&f);

    /* Exactly at the limit is fine. */
    conn_open(&f);
    f.body.limit = 10;
    peer_send(&f, S("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\n"
                    "0123456789"));
    ck_assert_int_eq(read_head(&f, 1000), 0);
    ck_assert_int_eq(read_body(&f), 0);
    ck_assert_uint_eq(buf_len(&f.body), 10);
    conn_close(&f);

    /* Chunked over the limit. */
    conn_open(&f);
    f.body.limit = 10;
    peer_send(&f, S("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked"
                    "\r\n\r\n6\r\nabcdef\r\n6\r\nghijkl\r\n0\r\n\r\n"));
    ck_assert_int_eq(read_head(&f, 1000), 0);
    ck_assert_int_eq(read_body(&f), GW_ETOOBIG);
    ck_assert_int_eq(f.r.error_status, 413);
    conn_close(&f);

    /* Bad chunked framing. */
    conn_open(&f);
    peer_send(&f, S("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked"
                    "\r\n\r\n5\r\nhelloX"));
    ck_assert_int_eq(read_head(&f, 1000), 0);
    ck_assert_int_eq(read_body(&f), GW_EPARSE);
    ck_assert_int_eq(f.r.error_status, 400);
    conn_close(&f);

    /* A body that stops coming. */
    conn_open(&f);
    peer_send(&f, S("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 9\r\n\r\n"
                    "abc"));
    ck_assert_int_eq(read_head(&f, 1000), 0);
    ck_assert_int_eq(http_read_body(&f.stream, &f.in, &f.r, &f.body,
                                     gw_now_ms() + 100, -1), GW_ETIMEDOUT);
    ck_assert_int_eq(f.r.error_status, 408);
    conn_close(&f);

    conn_open(&f);
    peer_send(&f, S("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked"
                    "\r\n\r\n5\r\nab"));
    ck_assert_int_eq(read_head(&f, 1000), 0);
    ck_assert_int_eq(http_read_body(&f.stream, &f.in, &f.r, &f.body,
                                     gw_now_ms() + 100, -1), GW_ETIMEDOUT);
    ck_assert_int_eq(f.r.error_status, 408);
    conn_close(&f);
}
END_TEST

/*
 * Make each allocation of a full request cycle fail in turn (SQLite's
 * fault simulation): every failure must come back as GW_ENOMEM, and the
 * loop must end with a run that had nothing left to fail.
 */
static void
enomem_cycle(const char *req, size_t len, const char *want_body)
{
    struct conn_fixture f;
    long n, failed;
    int rc;

    for (n = 1; n < 100; n++) {
        conn_open(&f);
        peer_send(&f, req, len);
        alloc_fail_after(n, 0);
        rc = read_head(&f, 1000);
        if (rc == 0)
            rc = read_body(&f);
        failed = alloc_failures();
        alloc_fail_after(0, 0);
        if (failed == 0) {
            ck_assert_int_eq(rc, 0);
            ck_assert_str_eq(buf_ptr(&f.body), want_body);
            conn_close(&f);
            break;
        }
        ck_assert_msg(rc == GW_ENOMEM, "allocation %ld: rc %d", n, rc);
        conn_close(&f);
    }
    ck_assert_int_gt(n, 2);         /* something was allocated and failed */
    ck_assert_int_lt(n, 100);
}

START_TEST(test_read_enomem_late_body)
{
    struct conn_fixture f;

    /* The body arrives after the head: it is read straight into 'body'. */
    conn_open(&f);
    peer_send(&f, S("PUT / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n"
                    "\r\n"));
    ck_assert_int_eq(read_head(&f, 1000), 0);
    peer_send(&f, S("hello"));
    alloc_fail_after(1, 0);
    ck_assert_int_eq(read_body(&f), GW_ENOMEM);
    ck_assert_int_eq(alloc_failures(), 1);
    alloc_fail_after(0, 0);
    ck_assert_int_eq(f.r.error_status, 0);
    ck_assert_int_eq(read_body(&f), 0);
    ck_assert_str_eq(buf_ptr(&f.body), "hello");
    conn_close(&f);
}
END_TEST

START_TEST(test_read_enomem)
{
    enomem_cycle(S("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\n"
                   "hello"), "hello");
    enomem_cycle(S("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked"
                   "\r\n\r\n5\r\nhello\r\n0\r\n\r\n"), "hello");
}
END_TEST

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
    tcase_add_test(tc, test_reason);
    tcase_set_timeout(tc, 10);
    suite_add_tcase(s, tc);

    tc = tcase_create("response_head");
    tcase_add_checked_fixture(tc, arena_setup, arena_teardown);
    tcase_add_loop_test(tc, test_response_head, 0,
                        (int)GW_ARRAY_LEN(resp_cases));
    tcase_add_test(tc, test_response_head_limit);
    tcase_set_timeout(tc, 10);
    suite_add_tcase(s, tc);

    tc = tcase_create("chunked");
    tcase_add_checked_fixture(tc, arena_setup, arena_teardown);
    tcase_add_loop_test(tc, test_chunked_table, 0,
                        (int)GW_ARRAY_LEN(chunk_cases));
    tcase_add_test(tc, test_chunked_done);
    tcase_add_test(tc, test_chunked_line_limits);
    tcase_add_test(tc, test_chunked_enomem);
    tcase_set_timeout(tc, 30);
    suite_add_tcase(s, tc);

    tc = tcase_create("read_ok");
    tcase_add_test(tc, test_read_content_length);
    tcase_add_test(tc, test_read_chunked);
    tcase_add_test(tc, test_read_trickle);
    tcase_add_test(tc, test_read_large_body);
    tcase_add_test(tc, test_read_pipelined);
    tcase_set_timeout(tc, 20);
    suite_add_tcase(s, tc);

    tc = tcase_create("read_closed");
    tcase_add_test(tc, test_read_closed);
    tcase_set_timeout(tc, 10);
    suite_add_tcase(s, tc);

    tc = tcase_create("read_timeouts");
    tcase_add_test(tc, test_read_header_timeout);
    tcase_add_test(tc, test_read_wake);
    tcase_set_timeout(tc, 10);
    suite_add_tcase(s, tc);

    tc = tcase_create("read_errors");
    tcase_add_test(tc, test_read_head_errors);
    tcase_add_test(tc, test_read_body_errors);
    tcase_set_timeout(tc, 10);
    suite_add_tcase(s, tc);

    tc = tcase_create("read_enomem");
    tcase_add_test(tc, test_read_enomem);
    tcase_add_test(tc, test_read_enomem_late_body);
    tcase_set_timeout(tc, 20);
    suite_add_tcase(s, tc);

    return s;
}

int
main(void)
{
    return test_run(srunner_create(http_suite()));
}
