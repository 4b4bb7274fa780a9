/* SPDX-License-Identifier: MIT */
/*
 * check_http_read.c - unit tests for common/http_read.c, the blocking
 * request reader, over socketpair(): heads and bodies (counted and
 * chunked), pipelining, trickling peers, timeouts, wake-ups, errors and
 * every allocation failing in turn.  Timeouts are short and nothing
 * depends on a sleep being long enough.
 */
#include <check.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "alloc.h"
#include "buf.h"
#include "http.h"
#include "http_read.h"
#include "net.h"
#include "testutil.h"
#include "util.h"

/* A string literal as (pointer, length), so inputs may hold NUL bytes. */
#define S(lit) lit, sizeof(lit) - 1

#define MAX_HEAD 16384

static int
view_eq(const char *p, size_t n, const char *s)
{
    return p != NULL && n == strlen(s) && memcmp(p, s, n) == 0;
}

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

static Suite *
http_read_suite(void)
{
    Suite *s = suite_create("http_read");
    TCase *tc;

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
    return test_run(srunner_create(http_read_suite()));
}
