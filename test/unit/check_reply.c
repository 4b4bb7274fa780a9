/* SPDX-License-Identifier: MIT */
/*
 * check_reply.c - unit tests for gateway/wire/reply.c: the head (status line,
 * Content-Type, framing, X-Request-Id, Connection, the extra lines), the
 * body's framing (Content-Length, chunked and its last chunk, an HTTP/1.0
 * close-delimited body), OpenAI-shaped errors and their escaping,
 * Retry-After and WWW-Authenticate, the unclean end of a body that failed
 * half-way, 100 Continue, reply_refuse() and what a write does when the
 * client is gone, stuck or the process stops.
 *
 * Each test answers a client that is one end of a socketpair: the reply
 * writes to the non-blocking end through a plain net_stream, the test
 * reads the other end (every wait has a deadline) and parses what came
 * with a small HTTP/1.1 response parser of its own (resp_parse), which
 * fails the test on anything malformed, so the assertions are on parsed
 * values.  A reply write returns only once the kernel took its bytes, so
 * what a call sent is all readable when it returns.
 *
 * reply_failure() is tested here only where it must say what another
 * call says (out of memory: one answer); reply.c knows nothing of the
 * request's method, so there is no HEAD case either.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <jansson.h>

#include "buf.h"
#include "net.h"
#include "wire/reply.h"
#include "testutil.h"
#include "util.h"

#define REQ_ID "req-7f3a"
#define PEER_WAIT_MS 2000       /* how long the test waits for bytes */
#define RESP_MAX_HEADERS 24
#define RESP_MAX_BODY 8192
#define RESP_MAX_CHUNKS 16

/* ---- a response as the client sees it ---- */

enum resp_state {
    RESP_MORE,                  /* incomplete: more bytes are needed */
    RESP_DONE,                  /* a whole response */
    RESP_CUT,                   /* the connection ended inside the body */
};

struct resp {
    int status;
    char reason[64];
    int nh;
    struct {
        char name[64];
        char value[256];
    } h[RESP_MAX_HEADERS];
    char body[RESP_MAX_BODY];
    size_t body_len;
    size_t chunks[RESP_MAX_CHUNKS];     /* chunked: each chunk's size */
    int nchunks;
    size_t wire_len;            /* RESP_DONE: the bytes it took */
};

/* The value of header 'name' (case-insensitive), or NULL. */
static const char *
resp_header(const struct resp *rs, const char *name)
{
    for (int i = 0; i < rs->nh; i++)
        if (strcasecmp(rs->h[i].name, name) == 0)
            return rs->h[i].value;
    return NULL;
}

static int
resp_header_count(const struct resp *rs, const char *name)
{
    int n = 0;

    for (int i = 0; i < rs->nh; i++)
        n += strcasecmp(rs->h[i].name, name) == 0;
    return n;
}

static void
body_add(struct resp *rs, const char *p, size_t n)
{
    ck_assert_uint_le(rs->body_len + n, sizeof(rs->body) - 1);
    memcpy(rs->body + rs->body_len, p, n);
    rs->body_len += n;
    rs->body[rs->body_len] = '\0';
}

/* One "Name: value" line, p[0..n) without its CRLF. */
static void
parse_header_line(struct resp *rs, const char *p, size_t n)
{
    const char *colon = memchr(p, ':', n);
    size_t nl, vl;

    ck_assert_msg(colon != NULL && colon > p, "bad header line %.*s",
                  (int)n, p);
    ck_assert_int_lt(rs->nh, RESP_MAX_HEADERS);
    nl = (size_t)(colon - p);
    ck_assert_uint_lt(nl, sizeof(rs->h[0].name));
    memcpy(rs->h[rs->nh].name, p, nl);
    rs->h[rs->nh].name[nl] = '\0';
    p = colon + 1;
    n -= nl + 1;
    while (n > 0 && *p == ' ')
        p++, n--;
    vl = n;
    ck_assert_uint_lt(vl, sizeof(rs->h[0].value));
    memcpy(rs->h[rs->nh].value, p, vl);
    rs->h[rs->nh].value[vl] = '\0';
    rs->nh++;
}

/*
 * The chunked body at p[0..n) (RFC 9112 7.1): hex sizes, no extensions,
 * no trailers, since reply.c sends none.  OUT *used: the bytes taken.
 */
static enum resp_state
parse_chunked(struct resp *rs, const char *p, size_t n, int eof,
              size_t *used)
{
    size_t pos = 0;

    for (;;) {
        const char *crlf = memmem(p + pos, n - pos, "\r\n", 2);
        size_t size = 0, line;

        if (crlf == NULL)
            return eof ? RESP_CUT : RESP_MORE;
        line = (size_t)(crlf - (p + pos));
        ck_assert_msg(line > 0 && line <= 16, "bad chunk size line");
        for (size_t i = 0; i < line; i++) {
            char c = p[pos + i];
            int d = c >= '0' && c <= '9'   ? c - '0'
                    : c >= 'a' && c <= 'f' ? c - 'a' + 10
                    : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                           : -1;

            ck_assert_msg(d >= 0, "bad chunk size %.*s", (int)line,
                          p + pos);
            size = size * 16 + (size_t)d;
        }
        pos += line + 2;
        if (size == 0) {                /* the last chunk, no trailers */
            if (n - pos < 2)
                return eof ? RESP_CUT : RESP_MORE;
            ck_assert_msg(memcmp(p + pos, "\r\n", 2) == 0,
                          "no CRLF after the last chunk");
            *used = pos + 2;
            return RESP_DONE;
        }
        if (n - pos < size + 2)
            return eof ? RESP_CUT : RESP_MORE;
        ck_assert_msg(memcmp(p + pos + size, "\r\n", 2) == 0,
                      "chunk data not followed by CRLF");
        ck_assert_int_lt(rs->nchunks, RESP_MAX_CHUNKS);
        rs->chunks[rs->nchunks++] = size;
        body_add(rs, p + pos, size);
        pos += size + 2;
    }
}

/*
 * Parse the response at p[0..n); 'eof': the connection has ended there.
 * Fails the test on a malformed response.
 */
static enum resp_state
resp_parse(const char *p, size_t n, int eof, struct resp *rs)
{
    const char *end = memmem(p, n, "\r\n\r\n", 4), *line, *next;
    const char *te, *cl;
    size_t head, used = 0;
    enum resp_state st;

    memset(rs, 0, sizeof(*rs));
    if (end == NULL)
        return eof ? RESP_CUT : RESP_MORE;
    head = (size_t)(end - p) + 4;
    ck_assert_msg(n >= 13 && memcmp(p, "HTTP/1.1 ", 9) == 0
                  && p[9] >= '1' && p[9] <= '5' && p[12] == ' ',
                  "bad status line %.*s", (int)(n < 40 ? n : 40), p);
    rs->status = (p[9] - '0') * 100 + (p[10] - '0') * 10 + (p[11] - '0');
    next = memmem(p, head, "\r\n", 2);
    ck_assert_uint_lt((size_t)(next - (p + 13)), sizeof(rs->reason));
    memcpy(rs->reason, p + 13, (size_t)(next - (p + 13)));
    for (line = next + 2; line < end; line = next + 2) {
        next = memmem(line, (size_t)(end + 2 - line), "\r\n", 2);
        parse_header_line(rs, line, (size_t)(next - line));
    }
    te = resp_header(rs, "Transfer-Encoding");
    cl = resp_header(rs, "Content-Length");
    ck_assert_msg(te == NULL || cl == NULL,
                  "both Transfer-Encoding and Content-Length");
    ck_assert_int_le(resp_header_count(rs, "Content-Length"), 1);
    if (rs->status < 200 || rs->status == 204 || rs->status == 304) {
        ck_assert_msg(cl == NULL && te == NULL, "framing on a %d",
                      rs->status);
        st = RESP_DONE;
    } else if (te != NULL) {
        ck_assert_str_eq(te, "chunked");
        st = parse_chunked(rs, p + head, n - head, eof, &used);
    } else if (cl != NULL) {
        char *stop;
        unsigned long long len = strtoull(cl, &stop, 10);

        ck_assert_msg(*cl != '\0' && *stop == '\0', "bad Content-Length");
        if (n - head < len)
            return eof ? RESP_CUT : RESP_MORE;
        body_add(rs, p + head, (size_t)len);
        used = (size_t)len;
        st = RESP_DONE;
    } else {                    /* close-delimited (RFC 9112 6.3 item 8) */
        if (!eof)
            return RESP_MORE;
        body_add(rs, p + head, n - head);
        used = n - head;
        st = RESP_DONE;
    }
    rs->wire_len = head + used;
    return st;
}

/* ---- the client: a socketpair, the reply on one end ---- */

struct client {
    int fd;                     /* the reply's end; -1 once closed */
    int peer;                   /* the test's end */
    int eof;                    /* the peer read the end of the stream */
    _Atomic int draining;
    struct net_stream stream;
    struct reply r;
    struct buf got;             /* what the peer read */
};

static struct client cl;

/* A fresh client sending an HTTP/1.<minor> request. */
static void
client_open(struct client *c, int minor, int keep_alive)
{
    int sv[2];

    memset(c, 0, sizeof(*c));
    ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv),
                     0);
    c->fd = sv[0];
    c->peer = sv[1];
    net_stream_init(&c->stream, c->fd);
    reply_init(&c->r, &c->stream, 4096, 5000, -1, &c->draining);
    reply_start(&c->r, REQ_ID, minor, keep_alive);
    buf_init(&c->got, 1 << 20);
}

/* The connection closes on the gateway's side (as conn.c would). */
static void
client_hangup(struct client *c)
{
    if (c->fd != -1)
        close(c->fd);
    c->fd = -1;
}

static void
client_close(struct client *c)
{
    reply_release(&c->r);
    buf_release(&c->got);
    client_hangup(c);
    if (c->peer != -1)
        close(c->peer);
    c->peer = -1;
}

static void
setup(void)
{
    client_open(&cl, 1, 1);
}

static void
teardown(void)
{
    client_close(&cl);
}

/* Read what is there now; 1 if something (or the end) came. */
static int
peer_read_some(struct client *c)
{
    char b[65536];
    ssize_t n;
    int any = 0;

    while ((n = recv(c->peer, b, sizeof(b), MSG_DONTWAIT)) > 0) {
        ck_assert_int_eq(buf_append(&c->got, b, (size_t)n), 0);
        any = 1;
    }
    if (n == 0) {
        c->eof = 1;
        any = 1;
    } else {
        ck_assert_msg(errno == EAGAIN || errno == EWOULDBLOCK,
                      "recv: %s", strerror(errno));
    }
    return any;
}

/*
 * Read until 'rs' is a whole response (or the stream ended), for at most
 * PEER_WAIT_MS; the bytes it took leave c->got.  A whole response must
 * not be followed by bytes nobody asked for.
 */
static enum resp_state
peer_response(struct client *c, struct resp *rs)
{
    int64_t end = gw_now_ms() + PEER_WAIT_MS;
    struct pollfd pfd = { c->peer, POLLIN, 0 };
    enum resp_state st;

    for (;;) {
        peer_read_some(c);
        st = resp_parse(buf_len(&c->got) > 0 ? buf_ptr(&c->got) : "",
                        buf_len(&c->got), c->eof, rs);
        if (st != RESP_MORE)
            break;
        ck_assert_msg(gw_now_ms() < end, "no whole response in %d ms: "
                      "%zu bytes", PEER_WAIT_MS, buf_len(&c->got));
        poll(&pfd, 1, (int)gw_ms_left(end));
    }
    if (st == RESP_DONE) {
        ck_assert_uint_eq(rs->wire_len, buf_len(&c->got));
        buf_reset(&c->got);
    }
    return st;
}

/* What has arrived by now, parsed: no wait. */
static enum resp_state
peer_response_now(struct client *c, struct resp *rs)
{
    peer_read_some(c);
    return resp_parse(buf_len(&c->got) > 0 ? buf_ptr(&c->got) : "",
                      buf_len(&c->got), c->eof, rs);
}

/* The response, which must be whole. */
static void
expect_done(struct client *c, struct resp *rs)
{
    ck_assert_int_eq(peer_response(c, rs), RESP_DONE);
}

/*
 * The response that a failure cut: the gateway's side closes, and the
 * body must not have ended cleanly.
 */
static void
expect_cut(struct client *c, struct resp *rs)
{
    client_hangup(c);
    ck_assert_int_eq(peer_response(c, rs), RESP_CUT);
}

/* Nothing more has arrived (a reply write is done once it returns). */
static void
expect_quiet(struct client *c)
{
    char b;

    ck_assert_int_eq(recv(c->peer, &b, 1, MSG_DONTWAIT), -1);
    ck_assert_int_eq(errno, EAGAIN);
}

/* Exactly the bytes 's' arrive, and nothing else. */
static void
expect_bytes(struct client *c, const char *s)
{
    int64_t end = gw_now_ms() + PEER_WAIT_MS;
    struct pollfd pfd = { c->peer, POLLIN, 0 };
    size_t n = strlen(s);

    while (buf_len(&c->got) < n && !c->eof && gw_now_ms() < end) {
        if (!peer_read_some(c))
            poll(&pfd, 1, (int)gw_ms_left(end));
    }
    peer_read_some(c);
    ck_assert_uint_eq(buf_len(&c->got), n);
    ck_assert(memcmp(buf_ptr(&c->got), s, n) == 0);
    buf_reset(&c->got);
}

/* Fill the socket until the kernel takes no more: the client is stuck. */
static void
peer_stall(struct client *c)
{
    static char junk[1 << 16];
    size_t total = 0;

    while (send(c->fd, junk, sizeof(junk), MSG_DONTWAIT) > 0)
        total += sizeof(junk);
    for (size_t k = 1024; k > 0; k /= 2)
        while (send(c->fd, junk, k, MSG_DONTWAIT) > 0)
            total += k;
    ck_assert_int_eq(errno, EAGAIN);
    ck_assert_uint_gt(total, 0);
}

/* The keys of a JSON object, as a check that nothing else is there. */
static void
expect_keys(json_t *o, const char *const *keys, size_t n)
{
    ck_assert(json_is_object(o));
    ck_assert_uint_eq(json_object_size(o), n);
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(json_object_get(o, keys[i]) != NULL, "no \"%s\"",
                      keys[i]);
}

/* 'v' is the string 's', or null when 's' is NULL. */
static void
expect_json_str(json_t *v, const char *s)
{
    if (s == NULL) {
        ck_assert(json_is_null(v));
    } else {
        ck_assert(json_is_string(v));
        ck_assert_uint_eq(json_string_length(v), strlen(s));
        ck_assert_str_eq(json_string_value(v), s);
    }
}

/*
 * p[0..n) is exactly {"error":{"message","type","param","code"}} with
 * these values ('param' and 'code' NULL: null).
 */
static void
expect_error_json(const char *p, size_t n, const char *message,
                  const char *type, const char *param, const char *code)
{
    static const char *const top[] = { "error" };
    static const char *const fields[] = { "message", "type", "param",
                                          "code" };
    json_error_t jerr;
    json_t *j = json_loadb(p, n, 0, &jerr), *e;

    ck_assert_msg(j != NULL, "not JSON (%s): %.*s", jerr.text, (int)n, p);
    expect_keys(j, top, 1);
    e = json_object_get(j, "error");
    expect_keys(e, fields, 4);
    expect_json_str(json_object_get(e, "message"), message);
    expect_json_str(json_object_get(e, "type"), type);
    expect_json_str(json_object_get(e, "param"), param);
    expect_json_str(json_object_get(e, "code"), code);
    json_decref(j);
}

/* The error response every reply_error*() sends before the head. */
static void
expect_error_response(const struct resp *rs, int status, const char *type,
                      const char *param, const char *code,
                      const char *message)
{
    char len[32];

    ck_assert_int_eq(rs->status, status);
    ck_assert_str_eq(resp_header(rs, "Content-Type"), "application/json");
    snprintf(len, sizeof(len), "%zu", rs->body_len);
    ck_assert_str_eq(resp_header(rs, "Content-Length"), len);
    ck_assert_str_eq(resp_header(rs, "X-Request-Id"), REQ_ID);
    expect_error_json(rs->body, rs->body_len, message, type, param, code);
}

/* The next response is that error, whole. */
static void
expect_error(struct client *c, struct resp *rs, int status,
             const char *type, const char *param, const char *code,
             const char *message)
{
    expect_done(c, rs);
    expect_error_response(rs, status, type, param, code, message);
}

/* reply_error() on a fresh response, and the client gets that error. */
static void
error_round_trip(struct client *c, struct resp *rs, int status,
                 const char *type, const char *code, const char *message)
{
    ck_assert_int_eq(reply_error(&c->r, status, type, code, message), 0);
    expect_error(c, rs, status, type, NULL, code, message);
}

/* The head of a reply_begin()-only response, sent by reply_end(). */
static void
send_head_only(struct client *c, int status, const char *ctype,
               int64_t len, const char *extra)
{
    ck_assert_int_eq(reply_begin(&c->r, status, ctype, len, extra), 0);
    ck_assert_int_eq(reply_end(&c->r), 0);
}

/* ---- the head ---- */

/* A small JSON answer to an HTTP/1.1 keep-alive request, to the byte. */
START_TEST(test_head_exact_bytes)
{
    ck_assert_int_eq(reply_send(&cl.r, 200, "application/json", "{}", 2,
                                NULL), 0);
    expect_bytes(&cl, "HTTP/1.1 200 OK\r\n"
                      "Content-Type: application/json\r\n"
                      "Content-Length: 2\r\n"
                      "X-Request-Id: " REQ_ID "\r\n"
                      "\r\n"
                      "{}");
    ck_assert_int_eq(cl.r.status, 200);
    ck_assert_int_eq(cl.r.keep_alive, 1);
}
END_TEST

/* reply_begin() writes nothing: the head waits for the first body bytes. */
START_TEST(test_head_held_back)
{
    struct resp rs;

    ck_assert_int_eq(reply_begin(&cl.r, 200, "text/plain", 5, NULL), 0);
    ck_assert_int_eq(cl.r.head_sent, 0);
    expect_quiet(&cl);
    ck_assert_int_eq(reply_body(&cl.r, "hello", 5), 0);
    ck_assert_int_eq(cl.r.head_sent, 1);
    expect_done(&cl, &rs);
    ck_assert_str_eq(rs.reason, "OK");
    ck_assert_str_eq(resp_header(&rs, "Content-Type"), "text/plain");
    ck_assert_str_eq(rs.body, "hello");
}
END_TEST

/* Connection: close when the connection will not be kept; no header
 * (HTTP/1.1's default) when it will; keep-alive said for HTTP/1.0. */
static const struct {
    int minor, keep_alive, draining;
    const char *connection;     /* NULL: no Connection header */
    int kept;                   /* r->keep_alive afterwards */
} connection_cases[] = {
    { 1, 1, 0, NULL, 1 },               /* HTTP/1.1 persists by default */
    { 1, 0, 0, "close", 0 },            /* the caller closes */
    { 0, 1, 0, "keep-alive", 1 },       /* HTTP/1.0 must be told */
    { 0, 0, 0, "close", 0 },
    { 1, 1, 1, "close", 0 },            /* draining: no keep-alive */
    { 0, 1, 1, "close", 0 },
};

START_TEST(test_connection_header)
{
    struct resp rs;

    for (size_t i = 0; i < sizeof(connection_cases)
                               / sizeof(connection_cases[0]); i++) {
        reply_start(&cl.r, REQ_ID, connection_cases[i].minor,
                    connection_cases[i].keep_alive);
        cl.draining = connection_cases[i].draining;
        ck_assert_int_eq(reply_send(&cl.r, 200, "text/plain", "x", 1,
                                    NULL), 0);
        expect_done(&cl, &rs);
        ck_assert_int_le(resp_header_count(&rs, "Connection"), 1);
        if (connection_cases[i].connection == NULL)
            ck_assert_ptr_null(resp_header(&rs, "Connection"));
        else
            ck_assert_str_eq(resp_header(&rs, "Connection"),
                             connection_cases[i].connection);
        ck_assert_int_eq(cl.r.keep_alive, connection_cases[i].kept);
    }
}
END_TEST

/* The coalescing role, the caller's extra lines, no Content-Type. */
START_TEST(test_role_and_extra_headers)
{
    struct resp rs;

    cl.r.role = "leader";
    ck_assert_int_eq(reply_send(&cl.r, 405, NULL, "", 0,
                                "Allow: POST\r\nX-Extra: two\r\n"), 0);
    expect_done(&cl, &rs);
    ck_assert_int_eq(rs.status, 405);
    ck_assert_str_eq(rs.reason, "Method Not Allowed");
    ck_assert_str_eq(resp_header(&rs, "X-Infergw-Coalesce"), "leader");
    ck_assert_str_eq(resp_header(&rs, "Allow"), "POST");
    ck_assert_str_eq(resp_header(&rs, "X-Extra"), "two");
    ck_assert_ptr_null(resp_header(&rs, "Content-Type"));
    ck_assert_str_eq(resp_header(&rs, "Content-Length"), "0");
    ck_assert_uint_eq(rs.body_len, 0);
    ck_assert_int_eq(rs.nh, 5);
}
END_TEST

/* RFC 9112 6.3: 1xx, 204 and 304 have no body and no framing, whatever
 * length the caller gave. */
START_TEST(test_no_body_statuses)
{
    static const int statuses[] = { 204, 304 };
    struct resp rs;

    for (size_t i = 0; i < sizeof(statuses) / sizeof(statuses[0]); i++) {
        reply_start(&cl.r, REQ_ID, 1, 1);
        send_head_only(&cl, statuses[i], NULL, 10, NULL);
        expect_done(&cl, &rs);
        ck_assert_int_eq(rs.status, statuses[i]);
        ck_assert_ptr_null(resp_header(&rs, "Content-Length"));
        ck_assert_ptr_null(resp_header(&rs, "Transfer-Encoding"));
        ck_assert_int_eq(cl.r.content_length, 0);
        ck_assert_int_eq(reply_body_complete(&cl.r), 1);
    }
}
END_TEST

/* reply_start() forgets the previous request's response. */
START_TEST(test_start_resets)
{
    struct resp rs;

    cl.r.role = "follower";
    ck_assert_int_eq(reply_begin(&cl.r, 200, "text/event-stream", -1, NULL),
                     0);
    ck_assert_int_eq(reply_body(&cl.r, "data: x\n\n", 9), 0);
    ck_assert_int_eq(reply_end(&cl.r), 0);
    expect_done(&cl, &rs);
    reply_gone(&cl.r);
    reply_close_unread(&cl.r);
    reply_start(&cl.r, "req-next", 1, 1);
    ck_assert_int_eq(cl.r.status, 0);
    ck_assert_int_eq(cl.r.head_sent, 0);
    ck_assert_int_eq(cl.r.broken, 0);
    ck_assert_int_eq(cl.r.linger, 0);
    ck_assert_int_eq(cl.r.event_stream, 0);
    ck_assert_uint_eq(cl.r.bytes_out, 0);
    ck_assert_int_eq(cl.r.ttfb_us, -1);
    ck_assert_ptr_null(cl.r.role);
    ck_assert_int_eq(cl.r.keep_alive, 1);
    ck_assert_int_eq(reply_send(&cl.r, 200, "text/plain", "ok", 2, NULL), 0);
    expect_done(&cl, &rs);
    ck_assert_str_eq(resp_header(&rs, "X-Request-Id"), "req-next");
    ck_assert_ptr_null(resp_header(&rs, "X-Infergw-Coalesce"));
    ck_assert_ptr_null(resp_header(&rs, "Cache-Control"));
    ck_assert_str_eq(rs.body, "ok");
}
END_TEST

/* ---- the body's framing ---- */

/* Content-Length: the body in pieces; complete at the last byte. */
START_TEST(test_length_body)
{
    struct resp rs;

    ck_assert_int_eq(reply_begin(&cl.r, 200, "application/json", 7, NULL),
                     0);
    ck_assert_int_eq(cl.r.framing, REPLY_LENGTH);
    ck_assert_int_eq(reply_body_complete(&cl.r), 0);
    ck_assert_int_eq(cl.r.ttfb_us, -1);
    ck_assert_int_eq(reply_body(&cl.r, "{\"a\"", 4), 0);
    ck_assert_int_ge(cl.r.ttfb_us, 0);
    ck_assert_int_eq(reply_body_complete(&cl.r), 0);
    ck_assert_int_eq(reply_body(&cl.r, ":1}", 3), 0);
    ck_assert_int_eq(reply_body_complete(&cl.r), 1);
    ck_assert_int_eq(reply_end(&cl.r), 0);      /* nothing more to send */
    ck_assert_uint_eq(cl.r.bytes_out, 7);
    expect_done(&cl, &rs);
    ck_assert_str_eq(resp_header(&rs, "Content-Length"), "7");
    ck_assert_str_eq(rs.body, "{\"a\":1}");
}
END_TEST

/* Chunked (HTTP/1.1, length unknown): one chunk per call with its hex
 * size, the last chunk at reply_end(), body bytes counted unframed. */
START_TEST(test_chunked_body)
{
    static const char big[] = "abcdefghijklmnopqrstuvwxyz";
    struct resp rs;

    ck_assert_int_eq(reply_begin(&cl.r, 200, "application/json", -1, NULL),
                     0);
    ck_assert_int_eq(cl.r.framing, REPLY_CHUNKED);
    ck_assert_int_eq(reply_body(&cl.r, "abc", 3), 0);
    ck_assert_int_eq(reply_body(&cl.r, big, 26), 0);
    ck_assert_int_eq(peer_response_now(&cl, &rs), RESP_MORE);   /* no end */
    ck_assert_int_eq(reply_body_complete(&cl.r), 0);
    ck_assert_int_eq(reply_end(&cl.r), 0);
    expect_done(&cl, &rs);
    ck_assert_str_eq(resp_header(&rs, "Transfer-Encoding"), "chunked");
    ck_assert_ptr_null(resp_header(&rs, "Content-Length"));
    ck_assert_ptr_null(resp_header(&rs, "Connection"));
    ck_assert_int_eq(rs.nchunks, 2);
    ck_assert_uint_eq(rs.chunks[0], 3);
    ck_assert_uint_eq(rs.chunks[1], 26);
    ck_assert_str_eq(rs.body, "abcabcdefghijklmnopqrstuvwxyz");
    ck_assert_uint_eq(cl.r.bytes_out, 29);
}
END_TEST

/* The wire after the head, to the byte: "1a" is lower-case hex. */
START_TEST(test_chunked_wire_bytes)
{
    char head[512];

    ck_assert_int_eq(reply_begin(&cl.r, 200, NULL, -1, NULL), 0);
    snprintf(head, sizeof(head), "%.*s", (int)buf_len(&cl.r.head),
             buf_ptr(&cl.r.head));
    ck_assert_int_eq(reply_body(&cl.r, "abcdefghijklmnopqrstuvwxyz", 26),
                     0);
    ck_assert_int_eq(reply_end(&cl.r), 0);
    strncat(head, "1a\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\n\r\n",
            sizeof(head) - strlen(head) - 1);
    expect_bytes(&cl, head);
}
END_TEST

/* An empty piece sends nothing: an empty chunk would end the body. */
START_TEST(test_empty_piece_sends_nothing)
{
    ck_assert_int_eq(reply_begin(&cl.r, 200, NULL, -1, NULL), 0);
    ck_assert_int_eq(reply_body(&cl.r, "a", 1), 0);
    peer_read_some(&cl);
    buf_reset(&cl.got);
    ck_assert_int_eq(reply_body(&cl.r, "", 0), 0);
    expect_quiet(&cl);
    ck_assert_int_eq(reply_end(&cl.r), 0);
    expect_bytes(&cl, "0\r\n\r\n");
}
END_TEST

/* reply_end() with nothing sent: the head, then the last chunk. */
START_TEST(test_end_without_body)
{
    struct resp rs;

    send_head_only(&cl, 200, "application/json", -1, NULL);
    expect_done(&cl, &rs);
    ck_assert_str_eq(resp_header(&rs, "Transfer-Encoding"), "chunked");
    ck_assert_int_eq(rs.nchunks, 0);
    ck_assert_uint_eq(rs.body_len, 0);
    ck_assert_int_eq(cl.r.ttfb_us, -1);         /* no body byte went */
}
END_TEST

/* HTTP/1.0 knows no chunks: the body ends when the connection closes. */
START_TEST(test_http10_close_delimited)
{
    struct resp rs;

    reply_start(&cl.r, REQ_ID, 0, 1);
    ck_assert_int_eq(reply_begin(&cl.r, 200, "text/plain", -1, NULL), 0);
    ck_assert_int_eq(cl.r.framing, REPLY_CLOSE);
    ck_assert_int_eq(cl.r.keep_alive, 0);
    ck_assert_int_eq(reply_body(&cl.r, "one ", 4), 0);
    ck_assert_int_eq(reply_body(&cl.r, "two", 3), 0);
    ck_assert_int_eq(reply_end(&cl.r), 0);
    ck_assert_int_eq(peer_response_now(&cl, &rs), RESP_MORE);
    client_hangup(&cl);
    expect_done(&cl, &rs);
    ck_assert_ptr_null(resp_header(&rs, "Content-Length"));
    ck_assert_ptr_null(resp_header(&rs, "Transfer-Encoding"));
    ck_assert_str_eq(resp_header(&rs, "Connection"), "close");
    ck_assert_str_eq(rs.body, "one two");
}
END_TEST

/* An event stream: chunked, Cache-Control: no-cache, with parameters. */
START_TEST(test_event_stream)
{
    struct resp rs;

    ck_assert_int_eq(reply_begin(&cl.r, 200,
                                 "text/event-stream; charset=utf-8", -1,
                                 NULL), 0);
    ck_assert_int_eq(cl.r.event_stream, 1);
    ck_assert_int_eq(reply_body(&cl.r, "data: 1\n\n", 9), 0);
    ck_assert_int_eq(reply_body(&cl.r, "data: [DONE]\n\n", 14), 0);
    ck_assert_int_eq(reply_end(&cl.r), 0);
    expect_done(&cl, &rs);
    ck_assert_str_eq(resp_header(&rs, "Content-Type"),
                     "text/event-stream; charset=utf-8");
    ck_assert_str_eq(resp_header(&rs, "Cache-Control"), "no-cache");
    ck_assert_int_eq(rs.nchunks, 2);
    ck_assert_str_eq(rs.body, "data: 1\n\ndata: [DONE]\n\n");
}
END_TEST

/* A JSON body is not an event stream and gets no Cache-Control. */
START_TEST(test_json_not_event_stream)
{
    struct resp rs;

    send_head_only(&cl, 200, "application/json", 0, NULL);
    ck_assert_int_eq(cl.r.event_stream, 0);
    expect_done(&cl, &rs);
    ck_assert_ptr_null(resp_header(&rs, "Cache-Control"));
}
END_TEST

/* reply_frame_iov(): what reply_body() would send, for a caller that
 * writes at its own pace; reply_note_sent() counts it. */
START_TEST(test_frame_iov)
{
    char size_line[REPLY_SIZE_LINE];
    struct iovec iov[3];

    ck_assert_int_eq(reply_begin(&cl.r, 200, NULL, -1, NULL), 0);
    ck_assert_int_eq(reply_frame_iov(&cl.r, "x", 0, iov, size_line), 0);
    ck_assert_int_eq(reply_frame_iov(&cl.r, "0123456789abcdefg", 17, iov,
                                     size_line), 3);
    ck_assert_uint_eq(iov[0].iov_len, 4);
    ck_assert(memcmp(iov[0].iov_base, "11\r\n", 4) == 0);
    ck_assert_uint_eq(iov[1].iov_len, 17);
    ck_assert(memcmp(iov[1].iov_base, "0123456789abcdefg", 17) == 0);
    ck_assert_uint_eq(iov[2].iov_len, 2);
    ck_assert(memcmp(iov[2].iov_base, "\r\n", 2) == 0);
    /* The size line is printf's "%zx\r\n", at every digit count. */
    for (size_t n = 1; n != 0 && n < SIZE_MAX / 7; n = n * 7 + 3) {
        char want[REPLY_SIZE_LINE];
        int w = snprintf(want, sizeof(want), "%zx\r\n", n);

        ck_assert_int_eq(reply_frame_iov(&cl.r, "x", n, iov, size_line), 3);
        ck_assert_uint_eq(iov[0].iov_len, (size_t)w);
        ck_assert(memcmp(iov[0].iov_base, want, (size_t)w) == 0);
    }
    ck_assert_int_eq(reply_frame_iov(&cl.r, "x", SIZE_MAX, iov, size_line),
                     3);
    ck_assert_uint_eq(iov[0].iov_len, 2 * sizeof(size_t) + 2);
    reply_note_sent(&cl.r, 17);
    ck_assert_int_eq(cl.r.head_sent, 1);
    ck_assert_uint_eq(cl.r.bytes_out, 17);
    ck_assert_int_ge(cl.r.ttfb_us, 0);

    reply_start(&cl.r, REQ_ID, 1, 1);
    ck_assert_int_eq(reply_begin(&cl.r, 200, NULL, 3, NULL), 0);
    ck_assert_int_eq(reply_frame_iov(&cl.r, "abc", 3, iov, size_line), 1);
    ck_assert_uint_eq(iov[0].iov_len, 3);
    ck_assert(memcmp(iov[0].iov_base, "abc", 3) == 0);
    reply_note_sent(&cl.r, 0);                  /* the head alone */
    ck_assert_int_eq(cl.r.head_sent, 1);
    ck_assert_int_eq(cl.r.ttfb_us, -1);
    expect_quiet(&cl);                          /* it wrote nothing */
}
END_TEST

/* ---- errors ---- */

/* OpenAI's shape: exactly message, type, param (null) and code. */
START_TEST(test_error_shape)
{
    struct resp rs;

    error_round_trip(&cl, &rs, 400, "invalid_request_error",
                     "missing_model", "model is required");
    ck_assert_str_eq(rs.reason, "Bad Request");
    ck_assert_ptr_null(resp_header(&rs, "Retry-After"));
    ck_assert_ptr_null(resp_header(&rs, "WWW-Authenticate"));
    ck_assert_int_eq(cl.r.keep_alive, 1);       /* the caller decides */
}
END_TEST

/* A message with quotes, backslashes, newlines and control characters is
 * escaped: the JSON decodes to the same text, and no raw control byte is
 * on the wire. */
START_TEST(test_error_escaping)
{
    static const char msg[] = "say \"hi\"\\ then\nnew\r\tline \x01\x1f"
                              " \xc3\xa9 </script>";
    struct resp rs;

    error_round_trip(&cl, &rs, 400, "invalid_request_error", "x\"y", msg);
    for (size_t i = 0; i < rs.body_len; i++)
        ck_assert_msg((unsigned char)rs.body[i] >= 0x20,
                      "raw control byte 0x%02x at %zu",
                      (unsigned char)rs.body[i], i);
    ck_assert(strstr(rs.body, "\\u0001") != NULL);
    ck_assert(strstr(rs.body, "\\\"hi\\\"") != NULL);
}
END_TEST

/* Retry-After: 1 on reply_error()'s 429 and 503 only. */
static const struct {
    int status;
    const char *retry_after;    /* NULL: none */
} retry_cases[] = {
    { 429, "1" },
    { 503, "1" },
    { 500, NULL },
    { 502, NULL },
    { 504, NULL },
    { 404, NULL },
};

START_TEST(test_error_retry_after)
{
    struct resp rs;

    for (size_t i = 0; i < sizeof(retry_cases) / sizeof(retry_cases[0]);
         i++) {
        reply_start(&cl.r, REQ_ID, 1, 1);
        error_round_trip(&cl, &rs, retry_cases[i].status, "server_error",
                         "c", "m");
        ck_assert_int_le(resp_header_count(&rs, "Retry-After"), 1);
        if (retry_cases[i].retry_after == NULL)
            ck_assert_ptr_null(resp_header(&rs, "Retry-After"));
        else
            ck_assert_str_eq(resp_header(&rs, "Retry-After"),
                             retry_cases[i].retry_after);
    }
}
END_TEST

/* reply_error_full(): the param, a null code, Retry-After as given. */
START_TEST(test_error_full)
{
    struct resp rs;

    ck_assert_int_eq(reply_error_full(&cl.r, 429, "rate_limit_error",
                                      "model", NULL, "slow down", 17), 0);
    expect_error(&cl, &rs, 429, "rate_limit_error", "model", NULL,
                 "slow down");
    ck_assert_str_eq(resp_header(&rs, "Retry-After"), "17");

    reply_start(&cl.r, REQ_ID, 1, 1);
    ck_assert_int_eq(reply_error_full(&cl.r, 503, "server_error", NULL,
                                      "busy", "busy", 0), 0);
    expect_error(&cl, &rs, 503, "server_error", NULL, "busy", "busy");
    ck_assert_ptr_null(resp_header(&rs, "Retry-After"));
}
END_TEST

/* RFC 9110 11.6.1: a 401 names the scheme it wants. */
START_TEST(test_401_www_authenticate)
{
    struct resp rs;

    error_round_trip(&cl, &rs, 401, "invalid_request_error",
                     "invalid_api_key", "bad key");
    ck_assert_str_eq(resp_header(&rs, "WWW-Authenticate"), "Bearer");
    ck_assert_int_eq(resp_header_count(&rs, "WWW-Authenticate"), 1);

    reply_start(&cl.r, REQ_ID, 1, 1);
    error_round_trip(&cl, &rs, 403, "invalid_request_error", "forbidden",
                     "no");
    ck_assert_ptr_null(resp_header(&rs, "WWW-Authenticate"));
}
END_TEST

/*
 * The gateway out of memory is one answer wherever it happens
 * (reply_out_of_memory()): a call's outcome says it in the same bytes,
 * and reply_refuse(), which writes it without a struct reply, in the
 * same body.
 */
START_TEST(test_out_of_memory_is_one_answer)
{
    static const char msg[] = "out of memory, retry later";
    struct call_outcome nomem = call_outcome_make(CALL_NOMEM);
    struct client ref;
    struct resp rs, refused;
    struct buf first;
    char b[4096];
    ssize_t n;

    ck_assert_int_eq(reply_out_of_memory(&cl.r, "gateway out of memory"), 0);
    peer_read_some(&cl);
    buf_init(&first, 1 << 16);
    ck_assert_int_eq(buf_append(&first, buf_ptr(&cl.got), buf_len(&cl.got)),
                     0);
    expect_error(&cl, &rs, 503, "server_error", NULL, "overloaded",
                 "gateway out of memory");
    ck_assert_str_eq(resp_header(&rs, "Retry-After"), "1");
    /* A call that failed for want of memory: the same answer, to the
     * byte. */
    reply_start(&cl.r, REQ_ID, 1, 1);
    reply_failure(&cl.r, &nomem);
    peer_read_some(&cl);
    ck_assert_uint_eq(buf_len(&cl.got), buf_len(&first));
    ck_assert(memcmp(buf_ptr(&cl.got), buf_ptr(&first),
                     buf_len(&first)) == 0);
    buf_reset(&cl.got);
    buf_release(&first);
    /* reply_refuse(), without a struct reply: the same body. */
    client_open(&ref, 1, 0);
    reply_refuse(ref.fd, REQ_ID, msg);
    ref.fd = -1;                        /* closed by reply_refuse() */
    n = recv(ref.peer, b, sizeof(b), MSG_DONTWAIT);
    ck_assert_int_gt(n, 0);
    ck_assert_int_eq(resp_parse(b, (size_t)n, 0, &refused), RESP_DONE);
    reply_start(&cl.r, REQ_ID, 1, 1);
    ck_assert_int_eq(reply_out_of_memory(&cl.r, msg), 0);
    expect_error(&cl, &rs, 503, "server_error", NULL, "overloaded", msg);
    ck_assert_int_eq(refused.status, rs.status);
    ck_assert_uint_eq(refused.body_len, rs.body_len);
    ck_assert(memcmp(refused.body, rs.body, rs.body_len) == 0);
    ck_assert_str_eq(resp_header(&refused, "Retry-After"),
                     resp_header(&rs, "Retry-After"));
    client_close(&ref);
}
END_TEST

/* 405 names the methods the route takes, in Allow (RFC 9110 15.5.6). */
START_TEST(test_method_not_allowed)
{
    struct resp rs;

    ck_assert_int_eq(reply_method_not_allowed(&cl.r, "GET, HEAD"), 0);
    expect_error(&cl, &rs, 405, "invalid_request_error", NULL,
                 "method_not_allowed", "method not allowed on this route");
    ck_assert_str_eq(rs.reason, "Method Not Allowed");
    ck_assert_str_eq(resp_header(&rs, "Allow"), "GET, HEAD");
    ck_assert_int_eq(resp_header_count(&rs, "Allow"), 1);
    ck_assert_ptr_null(resp_header(&rs, "Retry-After"));
    ck_assert_str_eq(cl.r.error_code, "method_not_allowed");
}
END_TEST

/* reply_retry_after_line(): a header line, or "" for no delay. */
START_TEST(test_retry_after_line)
{
    char line[32];

    reply_retry_after_line(line, sizeof(line), 5);
    ck_assert_str_eq(line, "Retry-After: 5\r\n");
    reply_retry_after_line(line, sizeof(line), 60);
    ck_assert_str_eq(line, "Retry-After: 60\r\n");
    /* A month's budget spent on the 1st: until the next month. */
    reply_retry_after_line(line, sizeof(line), 31 * 86400);
    ck_assert_str_eq(line, "Retry-After: 2678400\r\n");
    memcpy(line, "junk", 5);
    reply_retry_after_line(line, sizeof(line), 0);
    ck_assert_str_eq(line, "");
    memcpy(line, "junk", 5);
    reply_retry_after_line(line, sizeof(line), -3);
    ck_assert_str_eq(line, "");
}
END_TEST

/* A request that failed to parse: its status and code, else 400; the
 * message defaults to the reason phrase; the connection closes. */
static const struct {
    int in, status;
    const char *reason, *code;
} request_error_cases[] = {
    { 408, 408, "Request Timeout", "request_timeout" },
    { 413, 413, "Content Too Large", "request_too_large" },
    { 414, 414, "URI Too Long", "uri_too_long" },
    { 431, 431, "Request Header Fields Too Large", "headers_too_large" },
    { 501, 501, "Not Implemented", "not_implemented" },
    { 505, 505, "HTTP Version Not Supported", "http_version_not_supported" },
    { 400, 400, "Bad Request", "bad_request" },
    { 404, 400, "Bad Request", "bad_request" },    /* not a parser's */
    { 500, 400, "Bad Request", "bad_request" },
};

START_TEST(test_request_error)
{
    struct resp rs;

    for (size_t i = 0; i < sizeof(request_error_cases)
                               / sizeof(request_error_cases[0]); i++) {
        reply_start(&cl.r, REQ_ID, 1, 1);
        ck_assert_int_eq(reply_request_error(&cl.r,
                                             request_error_cases[i].in,
                                             NULL), 0);
        expect_error(&cl, &rs, request_error_cases[i].status,
                     "invalid_request_error", NULL,
                     request_error_cases[i].code,
                     request_error_cases[i].reason);
        ck_assert_str_eq(rs.reason, request_error_cases[i].reason);
        ck_assert_str_eq(resp_header(&rs, "Connection"), "close");
        ck_assert_int_eq(cl.r.keep_alive, 0);
    }
    reply_start(&cl.r, REQ_ID, 1, 1);
    ck_assert_int_eq(reply_request_error(&cl.r, 400, "bad chunk size"), 0);
    expect_error(&cl, &rs, 400, "invalid_request_error", NULL,
                 "bad_request", "bad chunk size");
}
END_TEST

/* ---- a body that fails half-way ---- */

/* A 200 of unknown length (chunked, or close-delimited for HTTP/1.0)
 * whose body has begun with 'first'. */
static void
start_stream(struct client *c, int minor, const char *ctype,
             const char *first)
{
    reply_start(&c->r, REQ_ID, minor, 1);
    ck_assert_int_eq(reply_begin(&c->r, 200, ctype, -1, NULL), 0);
    ck_assert_int_eq(reply_body(&c->r, first, strlen(first)), 0);
}

/* An event stream that has sent one event. */
static void
start_event_stream(struct client *c, int minor)
{
    start_stream(c, minor, "text/event-stream", "data: 1\n\n");
}

/* The SSE error event a failed stream ends with, after "data: 1". */
static void
expect_error_event(const struct resp *rs, const char *type,
                   const char *code, const char *message)
{
    ck_assert_int_eq(rs->nchunks, 2);
    ck_assert_uint_eq(rs->chunks[0], 9);
    ck_assert(strncmp(rs->body, "data: 1\n\ndata: ", 15) == 0);
    ck_assert_uint_ge(rs->body_len, 17);
    ck_assert(memcmp(rs->body + rs->body_len - 2, "\n\n", 2) == 0);
    expect_error_json(rs->body + 15, rs->body_len - 17, message, type, NULL,
                      code);
}

/* After the head, reply_error() is an SSE error event and a cut: no last
 * chunk, never a fake success. */
START_TEST(test_error_after_head_event_stream)
{
    struct resp rs;

    start_event_stream(&cl, 1);
    ck_assert_int_eq(reply_error(&cl.r, 502, "upstream_error",
                                 "upstream_error", "upstream \"reset\""),
                     GW_ECLOSED);
    ck_assert_int_eq(cl.r.broken, 1);
    ck_assert_int_eq(cl.r.keep_alive, 0);
    ck_assert_int_eq(reply_end(&cl.r), GW_ECLOSED);  /* no clean end now */
    expect_cut(&cl, &rs);
    ck_assert_int_eq(rs.status, 200);
    expect_error_event(&rs, "upstream_error", "upstream_error",
                       "upstream \"reset\"");
}
END_TEST

/* A chunked body that is not an event stream has no error event: it is
 * cut after the bytes already sent. */
START_TEST(test_fail_body_chunked_json)
{
    struct resp rs;

    start_stream(&cl, 1, "application/json", "{\"a\":");
    reply_fail_body(&cl.r, "upstream_error", "upstream_error", "cut");
    ck_assert_int_eq(cl.r.broken, 1);
    expect_cut(&cl, &rs);
    ck_assert_int_eq(rs.nchunks, 1);
    ck_assert_str_eq(rs.body, "{\"a\":");
}
END_TEST

/* A Content-Length event stream cannot take an event either: its length
 * was promised. */
START_TEST(test_fail_body_length)
{
    struct resp rs;

    ck_assert_int_eq(reply_begin(&cl.r, 200, "text/event-stream", 100,
                                 NULL), 0);
    ck_assert_int_eq(reply_body(&cl.r, "data: 1\n\n", 9), 0);
    reply_fail_body(&cl.r, "upstream_error", "upstream_error", "cut");
    ck_assert_int_eq(cl.r.broken, 1);
    ck_assert_uint_eq(cl.r.bytes_out, 9);
    expect_cut(&cl, &rs);
}
END_TEST

/* OUT *l: the SO_LINGER the reply left on the client's socket. */
static int
linger_of(const struct client *c, struct linger *l)
{
    socklen_t len = sizeof(*l);

    memset(l, 0, sizeof(*l));
    return getsockopt(c->fd, SOL_SOCKET, SO_LINGER, l, &len);
}

/* A close-delimited body would look complete at a close: it is reset
 * (SO_LINGER 0) instead.  An HTTP/1.0 event stream says so in an event
 * and closes normally. */
START_TEST(test_fail_body_http10)
{
    struct client ev;
    struct linger l;
    struct resp rs;

    start_stream(&cl, 0, "application/json", "{");
    reply_fail_body(&cl.r, "upstream_error", "upstream_error", "cut");
    ck_assert_int_eq(cl.r.broken, 1);
    ck_assert_int_eq(linger_of(&cl, &l), 0);
    ck_assert_int_eq(l.l_onoff, 1);
    ck_assert_int_eq(l.l_linger, 0);

    client_open(&ev, 0, 0);
    start_event_stream(&ev, 0);
    reply_fail_body(&ev.r, "server_error", "oops", "gone");
    ck_assert_int_eq(linger_of(&ev, &l), 0);
    ck_assert_int_eq(l.l_onoff, 0);
    client_hangup(&ev);
    expect_done(&ev, &rs);              /* close-delimited: ends at EOF */
    ck_assert_str_eq(rs.body, "data: 1\n\ndata: {\"error\":{\"message\":"
                     "\"gone\",\"type\":\"server_error\",\"param\":null,"
                     "\"code\":\"oops\"}}\n\n");
    client_close(&ev);
}
END_TEST

/* reply_fail_event() gives the very bytes reply_fail_body() sends, counted
 * as sent; reply_fail_end() then ends uncleanly. */
START_TEST(test_fail_event_in_two_steps)
{
    struct client other;
    struct buf out;
    struct resp rs;

    start_event_stream(&cl, 1);
    buf_init(&out, 4096);
    ck_assert_int_eq(reply_fail_event(&cl.r, &out, "server_error", "boom",
                                      "it\nbroke"), 0);
    ck_assert_uint_gt(buf_len(&out), 0);
    ck_assert_int_eq(cl.r.broken, 0);
    ck_assert_int_eq(net_stream_write_all(&cl.stream, buf_ptr(&out),
                                          buf_len(&out), -1, -1), 0);
    reply_fail_end(&cl.r);
    ck_assert_int_eq(cl.r.broken, 1);
    ck_assert_int_eq(cl.r.keep_alive, 0);
    expect_cut(&cl, &rs);
    expect_error_event(&rs, "server_error", "boom", "it\nbroke");
    ck_assert_uint_eq(cl.r.bytes_out, rs.body_len);

    client_open(&other, 1, 1);
    start_event_stream(&other, 1);
    peer_read_some(&other);                     /* the head and event 1 */
    buf_reset(&other.got);
    reply_fail_body(&other.r, "server_error", "boom", "it\nbroke");
    ck_assert_int_eq(buf_append(&out, "", 1), 0);
    expect_bytes(&other, buf_ptr(&out));
    client_close(&other);
    buf_release(&out);
}
END_TEST

/* No event for a body that cannot take one; nothing counted. */
START_TEST(test_fail_event_none)
{
    struct buf out;

    start_stream(&cl, 1, "application/json", "{");
    buf_init(&out, 4096);
    ck_assert_int_eq(reply_fail_event(&cl.r, &out, "server_error", "boom",
                                      "x"), 0);
    ck_assert_uint_eq(buf_len(&out), 0);
    ck_assert_uint_eq(cl.r.bytes_out, 1);
    buf_release(&out);
}
END_TEST

/* ---- the client gone, stuck, or the process stopping ---- */

/* A write to a peer that closed: GW_ECLOSED, broken, and no SIGPIPE (the
 * default action would kill this test). */
START_TEST(test_closed_peer_breaks)
{
    ck_assert(signal(SIGPIPE, SIG_DFL) != SIG_ERR);
    close(cl.peer);
    cl.peer = -1;
    ck_assert_int_eq(reply_send(&cl.r, 200, "text/plain", "hi", 2, NULL),
                     GW_ECLOSED);
    ck_assert_int_eq(cl.r.broken, 1);
    ck_assert_int_eq(cl.r.keep_alive, 0);
    ck_assert_int_eq(cl.r.head_sent, 0);
    ck_assert_uint_eq(cl.r.bytes_out, 0);
    ck_assert_int_eq(reply_body(&cl.r, "more", 4), GW_ECLOSED);
    ck_assert_int_eq(reply_end(&cl.r), GW_ECLOSED);
}
END_TEST

/* The same mid-body, at the last chunk. */
START_TEST(test_closed_peer_at_end)
{
    ck_assert(signal(SIGPIPE, SIG_DFL) != SIG_ERR);
    ck_assert_int_eq(reply_begin(&cl.r, 200, NULL, -1, NULL), 0);
    ck_assert_int_eq(reply_body(&cl.r, "a", 1), 0);
    close(cl.peer);
    cl.peer = -1;
    ck_assert_int_eq(reply_end(&cl.r), GW_ECLOSED);
    ck_assert_int_eq(cl.r.broken, 1);
    ck_assert_int_eq(cl.r.keep_alive, 0);
}
END_TEST

/* A client that takes nothing: the write gives up at send_timeout. */
START_TEST(test_stuck_client_times_out)
{
    int64_t t0;

    cl.r.send_timeout_ms = 100;
    peer_stall(&cl);
    t0 = gw_now_ms();
    ck_assert_int_eq(reply_send(&cl.r, 200, "text/plain", "x", 1, NULL),
                     GW_ETIMEDOUT);
    ck_assert_int_ge(gw_now_ms() - t0, 90);
    ck_assert_int_lt(gw_now_ms() - t0, PEER_WAIT_MS);
    ck_assert_int_eq(cl.r.broken, 1);
}
END_TEST

/* The process stops: a write that must wait ends at once; one that the
 * socket takes still goes (a write is tried before any wait). */
START_TEST(test_stop_aborts_wait)
{
    struct resp rs;
    int stop[2];
    int64_t t0;

    ck_assert_int_eq(pipe(stop), 0);
    ck_assert_int_eq(write(stop[1], "x", 1), 1);
    cl.r.stop_fd = stop[0];
    ck_assert_int_eq(reply_send(&cl.r, 200, "text/plain", "ok", 2, NULL), 0);
    expect_done(&cl, &rs);
    ck_assert_str_eq(rs.body, "ok");

    reply_start(&cl.r, REQ_ID, 1, 1);
    peer_stall(&cl);
    t0 = gw_now_ms();
    ck_assert_int_eq(reply_send(&cl.r, 200, "text/plain", "x", 1, NULL),
                     GW_EABORTED);
    ck_assert_int_lt(gw_now_ms() - t0, cl.r.send_timeout_ms / 2);
    ck_assert_int_eq(cl.r.broken, 1);
    close(stop[0]);
    close(stop[1]);
}
END_TEST

/*
 * reply_client_gone(), the one answer to "is the client gone?": not
 * while it is there, nor for its next request waiting; yes once it hung
 * up mid-answer (and the reply is marked so), or was given up; no once
 * its whole body was sent (done is not gone).
 */
START_TEST(test_client_gone)
{
    struct client other;

    ck_assert_int_eq(reply_client_gone(&cl.r), 0);
    ck_assert_int_eq(send(cl.peer, "GET / HTTP/1.1\r\n", 16, 0), 16);
    ck_assert_int_eq(reply_client_gone(&cl.r), 0);  /* input is no hang-up */
    ck_assert_int_eq(reply_begin(&cl.r, 200, NULL, -1, NULL), 0);
    ck_assert_int_eq(reply_body(&cl.r, "a", 1), 0);
    ck_assert_int_eq(shutdown(cl.peer, SHUT_WR), 0);
    ck_assert_int_eq(reply_client_gone(&cl.r), 1);
    ck_assert_int_eq(cl.r.broken, 1);
    ck_assert_int_eq(cl.r.keep_alive, 0);
    ck_assert_int_eq(reply_client_gone(&cl.r), 1);  /* and stays so */

    /* A whole Content-Length body sent, then the hang-up: done. */
    client_open(&other, 1, 1);
    ck_assert_int_eq(reply_send(&other.r, 200, "text/plain", "hi", 2, NULL),
                     0);
    ck_assert_int_eq(shutdown(other.peer, SHUT_WR), 0);
    ck_assert_int_eq(reply_client_gone(&other.r), 0);
    ck_assert_int_eq(other.r.broken, 0);
    /* Given up by its writer (reply_gone()): gone, whatever the socket. */
    reply_start(&other.r, REQ_ID, 1, 1);
    reply_gone(&other.r);
    ck_assert_int_eq(reply_client_gone(&other.r), 1);
    client_close(&other);
}
END_TEST

/* The same question for many clients at once (the leader's sweep). */
START_TEST(test_clients_gone)
{
    struct client c[70];
    struct reply *v[70];

    for (int i = 0; i < 70; i++) {
        client_open(&c[i], 1, 1);
        v[i] = &c[i].r;
        if (i % 3 == 0)
            ck_assert_int_eq(shutdown(c[i].peer, SHUT_WR), 0);
    }
    reply_gone(&c[1].r);
    /* 24 hung up (0, 3, ..., 69), one given up; past one poll()'s 64. */
    ck_assert_uint_eq(reply_clients_gone(v, 70), 25);
    for (int i = 0; i < 70; i++) {
        ck_assert_int_eq(c[i].r.broken, i % 3 == 0 || i == 1);
        client_close(&c[i]);
    }
}
END_TEST

/* reply_gone() and reply_close_unread(): no keep-alive, and linger. */
START_TEST(test_gone_and_close_unread)
{
    struct resp rs;

    reply_close_unread(&cl.r);
    ck_assert_int_eq(cl.r.linger, 1);
    ck_assert_int_eq(cl.r.broken, 0);
    ck_assert_int_eq(reply_send(&cl.r, 413, NULL, "", 0, NULL), 0);
    expect_done(&cl, &rs);
    ck_assert_str_eq(resp_header(&rs, "Connection"), "close");

    reply_start(&cl.r, REQ_ID, 1, 1);
    reply_gone(&cl.r);
    ck_assert_int_eq(cl.r.broken, 1);
    ck_assert_int_eq(cl.r.keep_alive, 0);
    ck_assert_int_eq(reply_send(&cl.r, 200, NULL, "x", 1, NULL),
                     GW_ECLOSED);
    expect_quiet(&cl);
}
END_TEST

/* reply_deadline(): send_timeout from now. */
START_TEST(test_deadline)
{
    int64_t lo, d, hi;

    cl.r.send_timeout_ms = 1234;
    lo = gw_now_ms();
    d = reply_deadline(&cl.r);
    hi = gw_now_ms();
    ck_assert_int_ge(d, lo + 1234);
    ck_assert_int_le(d, hi + 1234);
}
END_TEST

/* ---- 100 Continue, and refusing a connection ---- */

/* The interim response alone, then the final one. */
START_TEST(test_continue)
{
    struct resp rs;

    ck_assert_int_eq(reply_continue(&cl.r), 0);
    expect_bytes(&cl, "HTTP/1.1 100 Continue\r\n\r\n");
    ck_assert_int_eq(cl.r.head_sent, 0);
    ck_assert_int_eq(reply_send(&cl.r, 200, "text/plain", "ok", 2, NULL), 0);
    expect_done(&cl, &rs);
    ck_assert_int_eq(rs.status, 200);
    ck_assert_str_eq(rs.body, "ok");
}
END_TEST

/* The client sends 'n' bytes of junk before it is refused. */
static void
send_junk(struct client *c, size_t n)
{
    static char junk[1 << 16];
    size_t sent = 0;
    ssize_t w;
    int big = 4 << 20;

    memset(junk, 'j', sizeof(junk));
    setsockopt(c->peer, SOL_SOCKET, SO_SNDBUF, &big, sizeof(big));
    while (sent < n) {
        w = send(c->peer, junk, n - sent < sizeof(junk) ? n - sent
                                                        : sizeof(junk),
                 MSG_DONTWAIT);
        ck_assert_int_gt(w, 0);
        sent += (size_t)w;
    }
}

/*
 * reply_refuse() closed 'fd'; the peer gets all the 503 in one read, then
 * the end of the stream: EOF when all it sent was drained, else a reset
 * (input left unread makes the close one; over a socketpair the 503 is
 * still read first, over TCP the reset may destroy it, hence the drain).
 */
static void
expect_refused(struct client *c, int fd, int drained_all)
{
    char b[4096];
    struct resp rs;
    ssize_t n;

    ck_assert_int_eq(fcntl(fd, F_GETFD), -1);
    ck_assert_int_eq(errno, EBADF);
    c->fd = -1;
    n = recv(c->peer, b, sizeof(b), MSG_DONTWAIT);
    ck_assert_int_gt(n, 0);
    ck_assert_int_eq(resp_parse(b, (size_t)n, 0, &rs), RESP_DONE);
    ck_assert_uint_eq(rs.wire_len, (size_t)n);
    ck_assert_str_eq(rs.reason, "Service Unavailable");
    expect_error_response(&rs, 503, "server_error", NULL, "overloaded",
                          "too many connections");
    ck_assert_str_eq(resp_header(&rs, "Retry-After"), "1");
    ck_assert_str_eq(resp_header(&rs, "Connection"), "close");
    n = recv(c->peer, b, sizeof(b), MSG_DONTWAIT);
    if (drained_all)
        ck_assert_msg(n == 0, "recv %zd: %s", n, strerror(errno));
    else
        ck_assert_msg(n == -1 && errno == ECONNRESET, "recv %zd", n);
}

/* What the client already sent is drained, not left to reset the close. */
START_TEST(test_refuse)
{
    send_junk(&cl, 300);
    ck_assert_uint_eq(reply_refuse(cl.fd, REQ_ID, "too many connections"),
                      300);
    expect_refused(&cl, cl.fd, 1);
}
END_TEST

/* A client that keeps sending cannot hold the accept loop: the drain
 * stops at REPLY_REFUSE_DRAIN. */
START_TEST(test_refuse_drain_bounded)
{
    send_junk(&cl, 2 * REPLY_REFUSE_DRAIN + 1000);
    ck_assert_uint_eq(reply_refuse(cl.fd, REQ_ID, "too many connections"),
                      REPLY_REFUSE_DRAIN);
    expect_refused(&cl, cl.fd, 0);
}
END_TEST

/* A client that sent nothing: nothing to drain, and no wait for it. */
START_TEST(test_refuse_silent_client)
{
    int64_t t0 = gw_now_ms();

    ck_assert_uint_eq(reply_refuse(cl.fd, REQ_ID, "too many connections"),
                      0);
    ck_assert_int_lt(gw_now_ms() - t0, 500);
    expect_refused(&cl, cl.fd, 1);
}
END_TEST

static void
add_case(Suite *s, const char *name, const TTest *const *tests, size_t n)
{
    TCase *tc = tcase(name);

    tcase_add_checked_fixture(tc, setup, teardown);
    for (size_t i = 0; i < n; i++)
        tcase_add_test(tc, tests[i]);
    suite_add_tcase(s, tc);
}

#define ADD_CASE(s, name, ...)                                              \
    do {                                                                    \
        const TTest *const t_[] = { __VA_ARGS__ };                          \
        add_case(s, name, t_, sizeof(t_) / sizeof(t_[0]));                  \
    } while (0)

static Suite *
reply_suite(void)
{
    Suite *s = suite_create("reply");

    ADD_CASE(s, "head", test_head_exact_bytes, test_head_held_back,
             test_connection_header, test_role_and_extra_headers,
             test_no_body_statuses, test_start_resets, test_continue);
    ADD_CASE(s, "framing", test_length_body, test_chunked_body,
             test_chunked_wire_bytes, test_empty_piece_sends_nothing,
             test_end_without_body, test_http10_close_delimited,
             test_event_stream, test_json_not_event_stream, test_frame_iov);
    ADD_CASE(s, "errors", test_error_shape, test_error_escaping,
             test_error_retry_after, test_error_full,
             test_401_www_authenticate, test_retry_after_line,
             test_request_error, test_out_of_memory_is_one_answer,
             test_method_not_allowed);
    ADD_CASE(s, "fail", test_error_after_head_event_stream,
             test_fail_body_chunked_json, test_fail_body_length,
             test_fail_body_http10, test_fail_event_in_two_steps,
             test_fail_event_none);
    ADD_CASE(s, "peer", test_closed_peer_breaks, test_closed_peer_at_end,
             test_stuck_client_times_out, test_stop_aborts_wait,
             test_gone_and_close_unread, test_deadline, test_client_gone,
             test_clients_gone);
    ADD_CASE(s, "refuse", test_refuse,
             test_refuse_drain_bounded, test_refuse_silent_client);
    return s;
}

int
main(void)
{
    return test_run(srunner_create(reply_suite()));
}
