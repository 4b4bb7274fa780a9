/* SPDX-License-Identifier: MIT */
/*
 * check_proxy.c - the leader, follower and direct paths end to end, and
 * what they do when memory runs out (common/alloc's fault injection),
 * with socketpairs as clients and a scripted upstream in place of
 * libcurl: this test links every gateway object but upstream.o and
 * defines upstream_perform() itself.
 *
 * Also: the connection and accept-loop edges that answer without a
 * struct conn (reply_refuse(), conn_serve() out of memory).
 */
#include <check.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <jansson.h>

#include "alloc.h"
#include "buf.h"
#include "coalesce/coalesce.h"
#include "base/config.h"
#include "client/conn.h"
#include "coalesce/flight.h"
#include "client/generation.h"
#include "base/handler.h"
#include "http.h"
#include "jsonx.h"
#include "log.h"
#include "net.h"
#include "fleet/pool.h"
#include "coalesce/proxy.h"
#include "wire/reply.h"
#include "testutil.h"
#include "upstream/upstream.h"
#include "util.h"

#define CHUNK "data: {\"x\":1}\n\n"
#define NCHUNKS 4

/*
 * The scripted upstream: a 200 event stream of NCHUNKS chunks, each sent
 * only once the test has released it; the transfer ends with whatever
 * code a sink callback returned, as upstream.c's does.
 */
static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int calls;
    int released;               /* chunks the test lets through */
    const char *ctype;          /* the response's Content-Type */
} up = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0,
         "text/event-stream" };

static void
up_release(int n)
{
    pthread_mutex_lock(&up.mu);
    up.released = n;
    pthread_cond_broadcast(&up.cv);
    pthread_mutex_unlock(&up.mu);
}

static int
up_calls(void)
{
    int n;

    pthread_mutex_lock(&up.mu);
    n = up.calls;
    pthread_mutex_unlock(&up.mu);
    return n;
}

/* Wait for chunk 'i' to be released, ticking the sink meanwhile. */
static int
up_wait(const struct upstream_sink *sink, int i)
{
    struct timespec ts;
    int rc = 0;

    pthread_mutex_lock(&up.mu);
    while (up.released <= i && rc == 0) {
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 10 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&up.cv, &up.mu, &ts);
        pthread_mutex_unlock(&up.mu);
        rc = sink->on_tick != NULL ? sink->on_tick(sink->arg) : 0;
        pthread_mutex_lock(&up.mu);
    }
    pthread_mutex_unlock(&up.mu);
    return rc;
}

int
upstream_perform(struct upstream *u, size_t idx,
                 const struct upstream_request *req,
                 const struct upstream_opts *opts,
                 const struct upstream_sink *sink,
                 struct upstream_result *res)
{
    struct http_head head = { 0 };
    int rc;

    (void)u;
    (void)idx;
    (void)req;
    (void)opts;
    pthread_mutex_lock(&up.mu);
    up.calls++;
    pthread_mutex_unlock(&up.mu);
    memset(res, 0, sizeof(*res));
    res->ttfb_us = -1;
    res->outcome.status = 200;
    res->head_seen = 1;
    head.status = 200;
    head.content_length = -1;
    snprintf(head.content_type, sizeof(head.content_type), "%s", up.ctype);
    rc = sink->on_head(sink->arg, &head);
    for (int i = 0; rc == 0 && i < NCHUNKS; i++) {
        rc = up_wait(sink, i);
        if (rc == 0)
            rc = sink->on_data(sink->arg, CHUNK, strlen(CHUNK));
    }
    res->outcome.kind = rc == 0 ? CALL_OK : call_kind_of_stop(rc);
    res->outcome.fault = call_kind_fault(res->outcome.kind);
    return call_kind_rc(res->outcome.kind);
}

/*
 * generation.c makes real upstreams, so it is not linked: the requests here
 * run on the test's own ctx, and conn.c's generation calls never happen
 * (conn_serve is only driven to its out-of-memory answer).
 */
struct generation *
generation_ref_current(struct generations *l)
{
    (void)l;
    abort();
}

void
generation_unref(struct generations *l, struct generation *g)
{
    (void)l;
    (void)g;
    abort();
}

uint64_t
generation_current_id(struct generations *l)
{
    (void)l;
    abort();
}

struct generation_cert *
generation_cert_ref(struct generations *l, struct generation *g)
{
    (void)l;
    (void)g;
    abort();
}

void
generation_cert_unref(struct generations *l, struct generation_cert *c)
{
    (void)l;
    (void)c;
    abort();
}

/* status.c's view reads it; nothing here serves /status.json. */
void
generations_status(struct generations *l, struct generation_status *out)
{
    (void)l;
    (void)out;
    abort();
}

/* The scripted upstream never answers a retryable status. */
int
upstream_retryable_status(int status)
{
    (void)status;
    return 0;
}

/* ---- clients ---- */

static _Atomic int no;
static struct gw_config cfg;
static struct handler_ctx ctx;

struct client {
    int fd, peer;
    struct net_stream stream;       /* fd, plain */
    char head[256];
    char id[32];
    struct http_request req;
    struct buf in, body, got;
    struct reply reply;
    struct handler_req hr;
    pthread_t t;
};

static void
setup(void)
{
    ck_assert_int_eq(config_defaults(&cfg), 0);
    memset(&ctx, 0, sizeof(ctx));
    ctx.cfg = &cfg;
    ctx.co = coalescer_new(&cfg);
    ck_assert_ptr_nonnull(ctx.co);
    ctx.pool = pool_new(&cfg);
    ck_assert_ptr_nonnull(ctx.pool);
    ctx.draining = &no;
    ctx.stopping = &no;
    ctx.wake_fd = ctx.stop_fd = -1;
    ctx.ncpu = 2;
    up.calls = 0;
    up.released = 0;
    up.ctype = "text/event-stream";
}

static void
teardown(void)
{
    coalescer_free(ctx.co);
    pool_free(ctx.pool);
    config_release(&cfg);
}

static void
client_open(struct client *c, int n, const char *json)
{
    int sv[2], len;

    memset(c, 0, sizeof(*c));
    ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv),
                     0);
    c->fd = sv[0];
    c->peer = sv[1];
    snprintf(c->id, sizeof(c->id), "client-%d", n);
    len = snprintf(c->head, sizeof(c->head), "POST /v1/chat/completions "
                   "HTTP/1.1\r\nHost: x\r\nContent-Length: %zu\r\n\r\n",
                   strlen(json));
    ck_assert_int_eq(http_parse_request(c->head, (size_t)len, 4096, &c->req),
                     len);
    buf_init(&c->in, 1 << 16);
    buf_init(&c->body, 1 << 20);
    buf_init(&c->got, 1 << 20);
    ck_assert_int_eq(buf_append_str(&c->body, json), 0);
    net_stream_init(&c->stream, c->fd);
    reply_init(&c->reply, &c->stream, 4096, 5000, -1, &no);
    reply_start(&c->reply, c->id, 1, 1);
    c->hr.ctx = &ctx;
    c->hr.req = &c->req;
    c->hr.in = &c->in;
    c->hr.body = &c->body;
    c->hr.reply = &c->reply;
    c->hr.request_id = c->id;
    c->hr.route = METRICS_ROUTE_CHAT;
    c->hr.tenant = CONFIG_MAX_TENANTS;
}

static void
client_close(struct client *c)
{
    buf_release(&c->in);
    buf_release(&c->body);
    buf_release(&c->got);
    reply_release(&c->reply);
    close(c->fd);
    close(c->peer);
}

/* route.c's part: parse the body, forward it (as a completion, that may
 * coalesce, or not). */
static void
forward_as(struct client *c, int coalescable)
{
    json_t *j = NULL;
    char err[128];

    ck_assert_int_eq(jsonx_parse_object(buf_ptr(&c->body), buf_len(&c->body),
                                        16, &j, err, sizeof(err)), 0);
    proxy_forward(&c->hr, j, coalescable);
    json_decref(j);
}

static void
forward(struct client *c)
{
    forward_as(c, 1);
}

static void *
client_main(void *p)
{
    forward(p);
    return NULL;
}

static void
peer_read(struct client *c)
{
    char b[65536];
    ssize_t n;

    while ((n = recv(c->peer, b, sizeof(b), MSG_DONTWAIT)) > 0)
        ck_assert_int_eq(buf_append(&c->got, b, (size_t)n), 0);
}

static int
got_has(struct client *c, const char *s)
{
    return buf_len(&c->got) > 0
           && memmem(buf_ptr(&c->got), buf_len(&c->got), s, strlen(s))
              != NULL;
}

/* Read until 's' arrived (3 s at most). */
static int
await_got(struct client *c, const char *s)
{
    int64_t end = gw_now_ms() + 3000;
    struct pollfd p = { c->peer, POLLIN, 0 };

    while (peer_read(c), !got_has(c, s)) {
        if (gw_now_ms() > end)
            return 0;
        poll(&p, 1, 20);
    }
    return 1;
}

static struct flight *grabbed;

static void
grab(struct flight *f)
{
    grabbed = f;
}

static size_t
parked_now(void)
{
    size_t n = 0;

    grabbed = NULL;
    coalescer_each(ctx.co, grab);
    if (grabbed != NULL) {
        gw_mutex_lock(&grabbed->lock);
        n = grabbed->nparked;
        gw_mutex_unlock(&grabbed->lock);
    }
    return n;
}

static int
await(int (*pred)(void))
{
    int64_t end = gw_now_ms() + 3000;

    while (!pred()) {
        if (gw_now_ms() > end)
            return 0;
        sched_yield();
    }
    return 1;
}

static int
one_call(void)
{
    return up_calls() == 1;
}

static int
two_parked(void)
{
    return parked_now() == 2;
}

/* A leader in the upstream call, two followers parked on its flight. */
static void
start_trio(struct client c[3])
{
    const char *json = "{\"model\":\"m\",\"messages\":[],\"stream\":true}";

    for (int i = 0; i < 3; i++)
        client_open(&c[i], i, json);
    ck_assert_int_eq(pthread_create(&c[0].t, NULL, client_main, &c[0]), 0);
    ck_assert(await(one_call));
    for (int i = 1; i < 3; i++)
        ck_assert_int_eq(pthread_create(&c[i].t, NULL, client_main, &c[i]),
                         0);
    ck_assert(await(two_parked));
}

/* The body of a response (after the head), for comparing clients. */
static const char *
body_of(struct client *c)
{
    const char *p;

    ck_assert_int_eq(buf_append(&c->got, "", 1), 0);    /* a NUL */
    p = strstr(buf_ptr(&c->got), "\r\n\r\n");
    ck_assert_ptr_nonnull(p);
    return p + 4;
}

START_TEST(test_trio_all_complete)
{
    struct client c[3];

    start_trio(c);
    up_release(NCHUNKS);
    for (int i = 0; i < 3; i++) {
        pthread_join(c[i].t, NULL);
        peer_read(&c[i]);
        ck_assert(got_has(&c[i], "0\r\n\r\n"));
    }
    ck_assert(got_has(&c[0], "X-Infergw-Coalesce: leader"));
    ck_assert(got_has(&c[1], "X-Infergw-Coalesce: follower"));
    ck_assert_str_eq(body_of(&c[1]), body_of(&c[0]));
    ck_assert_str_eq(body_of(&c[2]), body_of(&c[0]));
    ck_assert_int_eq(up_calls(), 1);
    for (int i = 0; i < 3; i++)
        client_close(&c[i]);
}
END_TEST

/* The content line of a response's head, e.g. "Content-Type: ...\r\n". */
static const char *
head_line(struct client *c, const char *name, char *out, size_t len)
{
    const char *p, *e;

    ck_assert_int_eq(buf_append(&c->got, "", 1), 0);
    p = strstr(buf_ptr(&c->got), name);
    ck_assert_ptr_nonnull(p);
    e = strstr(p, "\r\n");
    ck_assert_ptr_nonnull(e);
    ck_assert_uint_lt((size_t)(e - p), len);
    memcpy(out, p, (size_t)(e - p));
    out[e - p] = '\0';
    c->got.len--;                       /* drop the NUL again */
    return out;
}

/*
 * The leader's client gets the same head as its followers, the
 * upstream's own, a Content-Type as long as the gateway relays included
 * (HTTP_CTYPE_MAX - 1 bytes).
 */
START_TEST(test_same_head_for_leader_and_followers)
{
    static char ctype[HTTP_CTYPE_MAX];
    char a[512], b[512];
    struct client c[3];

    snprintf(ctype, sizeof(ctype), "text/event-stream; x=%0*d",
             HTTP_CTYPE_MAX - 1 - (int)strlen("text/event-stream; x="), 7);
    ck_assert_uint_eq(strlen(ctype), HTTP_CTYPE_MAX - 1);
    up.ctype = ctype;
    start_trio(c);
    up_release(NCHUNKS);
    for (int i = 0; i < 3; i++) {
        pthread_join(c[i].t, NULL);
        peer_read(&c[i]);
    }
    head_line(&c[0], "Content-Type: ", a, sizeof(a));
    for (int i = 1; i < 3; i++)
        ck_assert_str_eq(head_line(&c[i], "Content-Type: ", b, sizeof(b)),
                         a);
    ck_assert_str_eq(a + strlen("Content-Type: "), ctype);
    for (int i = 0; i < 3; i++)
        client_close(&c[i]);
}
END_TEST

/*
 * Out of memory appending a chunk mid-stream: the flight fails, and the
 * leader's client and both followers end alike, with the same SSE error
 * event and no last chunk.  (ASan checks for leaks as the test ends.)
 */
/* Log lines go to a pipe; count the ones that contain 'what'. */
static int log_pipe[2];

static void
log_capture(void)
{
    ck_assert_int_eq(pipe2(log_pipe, O_NONBLOCK), 0);
    log_set_fd(log_pipe[1]);
}

/* What was logged since log_capture(); logging goes back to stderr. */
static const char *
log_captured(void)
{
    static char text[1 << 16];
    ssize_t n = read(log_pipe[0], text, sizeof(text) - 1);

    log_set_fd(2);
    text[n > 0 ? n : 0] = '\0';
    close(log_pipe[0]);
    close(log_pipe[1]);
    return text;
}

static int
count(const char *text, const char *what)
{
    int n = 0;

    for (const char *p = text; (p = strstr(p, what)) != NULL; p++)
        n++;
    return n;
}

START_TEST(test_append_enomem_mid_stream)
{
    struct client c[3];
    const char *log;

    log_capture();
    start_trio(c);
    up_release(1);
    for (int i = 0; i < 3; i++)
        ck_assert(await_got(&c[i], CHUNK));
    ck_assert(await(two_parked));
    alloc_fail_after(1, 0);             /* the next chunk's copy */
    up_release(2);
    for (int i = 0; i < 3; i++) {
        pthread_join(c[i].t, NULL);
        peer_read(&c[i]);
    }
    ck_assert_int_eq(alloc_failures(), 1);
    alloc_fail_after(0, 0);
    /* Said once, at error level, as what it is. */
    log = log_captured();
    ck_assert_int_eq(count(log, "level=error"), 1);
    ck_assert_int_eq(count(log, "level=error req=- coalesce: out of memory "
                                "appending a chunk"), 1);
    for (int i = 0; i < 3; i++) {
        ck_assert(got_has(&c[i], "\"message\":\"gateway out of memory\""));
        ck_assert(!got_has(&c[i], "0\r\n\r\n"));
        ck_assert_int_eq(c[i].reply.broken, 1);
    }
    ck_assert_str_eq(body_of(&c[1]), body_of(&c[0]));
    ck_assert_str_eq(body_of(&c[2]), body_of(&c[0]));
    for (int i = 0; i < 3; i++)
        client_close(&c[i]);
}
END_TEST

/* The same for the first chunk: nothing was sent, so a 503 for all. */
START_TEST(test_append_enomem_first_chunk)
{
    struct client c[3];

    start_trio(c);
    alloc_fail_after(1, 0);
    up_release(1);
    for (int i = 0; i < 3; i++) {
        pthread_join(c[i].t, NULL);
        peer_read(&c[i]);
    }
    ck_assert_int_eq(alloc_failures(), 1);
    alloc_fail_after(0, 0);
    for (int i = 0; i < 3; i++) {
        ck_assert(strncmp(buf_ptr(&c[i].got), "HTTP/1.1 503 ", 13) == 0);
        ck_assert(got_has(&c[i], "\"code\":\"overloaded\""));
        ck_assert(got_has(&c[i], "gateway out of memory"));
    }
    ck_assert_str_eq(body_of(&c[1]), body_of(&c[0]));
    for (int i = 0; i < 3; i++)
        client_close(&c[i]);
}
END_TEST

/* A forward that may not coalesce: the direct path. */
static void *
client_direct_main(void *p)
{
    forward_as(p, 0);
    return NULL;
}

/* The client, alone on its call, hangs up between two chunks. */
static void
hang_up_mid_stream(struct client *c, void *(*path)(void *))
{
    int64_t t0;

    client_open(c, 0, "{\"model\":\"m\",\"messages\":[],\"stream\":true}");
    ck_assert_int_eq(pthread_create(&c->t, NULL, path, c), 0);
    ck_assert(await(one_call));
    up_release(1);
    ck_assert(await_got(c, CHUNK));
    close(c->peer);
    c->peer = -1;
    /* No chunk comes any more: only the question "is it gone?" (asked
     * on the sink's tick, reply_client_gone()) ends the call. */
    t0 = gw_now_ms();
    pthread_join(c->t, NULL);
    ck_assert_int_lt(gw_now_ms() - t0, 3000);
    ck_assert_int_eq(c->reply.broken, 1);
    ck_assert_int_eq(c->reply.keep_alive, 0);
    ck_assert_int_eq(up_calls(), 1);
}

/* The direct path: the upstream call stops (no chunk is released). */
START_TEST(test_direct_client_gone_stops_the_call)
{
    struct client c;

    hang_up_mid_stream(&c, client_direct_main);
    ck_assert_str_eq(c.reply.role != NULL ? c.reply.role : "-", "-");
    client_close(&c);
}
END_TEST

/* A leader with no follower: the same, and its flight is gone. */
START_TEST(test_leader_client_gone_stops_the_call)
{
    struct client c;

    hang_up_mid_stream(&c, client_main);
    ck_assert_str_eq(c.reply.role, "leader");
    ck_assert_uint_eq(coalescer_count(ctx.co), 0);
    client_close(&c);
}
END_TEST

/*
 * One request, from proxy_forward() to its last chunk: a leader (no
 * follower) and a direct one, each answered in full.  The "admission"
 * case runs these alone, so that the pool's work per request can be
 * counted: one set of the model's upstreams, and the pool's lock taken
 * twice, once to take the slot (the admission: pool_serves() takes the
 * models' lock) and once to give it back.
 */
START_TEST(test_one_request_each_path)
{
    struct client c;
    uint64_t sets, holds;

    up_release(NCHUNKS);
    for (int coalescable = 1; coalescable >= 0; coalescable--) {
        client_open(&c, coalescable, "{\"model\":\"m\",\"messages\":[],"
                    "\"stream\":true}");
        sets = pool_sets_computed();
        holds = pool_lock_holds();
        if (coalescable)
            forward(&c);
        else
            client_direct_main(&c);
        /* The 404's question and the slot: one set of upstreams for the
         * model (pool_admission). */
        ck_assert_uint_eq(pool_sets_computed() - sets, 1);
        ck_assert_uint_eq(pool_lock_holds() - holds, 2);
        peer_read(&c);
        ck_assert(strncmp(buf_ptr(&c.got), "HTTP/1.1 200 ", 13) == 0);
        ck_assert(got_has(&c, CHUNK "\r\n0\r\n\r\n"));
        ck_assert_str_eq(c.reply.role != NULL ? c.reply.role : "-",
                         coalescable ? "leader" : "-");
        client_close(&c);
    }
    ck_assert_int_eq(up_calls(), 2);
}
END_TEST

/* Out of memory in the leader's own setup: a 503, no upstream call. */
START_TEST(test_leader_setup_enomem)
{
    struct client c;

    client_open(&c, 0, "{\"messages\":[]}");
    up_release(NCHUNKS);
    alloc_fail_after(1, 0);             /* the upstream request's path */
    forward(&c);
    alloc_fail_after(0, 0);
    peer_read(&c);
    ck_assert(strncmp(buf_ptr(&c.got), "HTTP/1.1 503 ", 13) == 0);
    ck_assert(got_has(&c, "\"code\":\"overloaded\""));
    ck_assert_int_eq(up_calls(), 0);
    ck_assert_uint_eq(coalescer_count(ctx.co), 0);
    client_close(&c);
}
END_TEST

/*
 * Out of memory joining the map (its entry, then its flight): the
 * request goes upstream alone and is answered in full.
 */
START_TEST(test_join_enomem_goes_direct)
{
    struct client c;

    up_release(NCHUNKS);
    for (long n = 2; n <= 3; n++) {
        client_open(&c, (int)n, "{\"messages\":[]}");
        alloc_fail_after(n, 0);
        forward(&c);
        ck_assert_int_eq(alloc_failures(), 1);
        alloc_fail_after(0, 0);
        peer_read(&c);
        ck_assert(strncmp(buf_ptr(&c.got), "HTTP/1.1 200 ", 13) == 0);
        ck_assert(got_has(&c, "X-Infergw-Coalesce: bypass"));
        ck_assert(got_has(&c, CHUNK "\r\n0\r\n\r\n"));
        client_close(&c);
    }
    ck_assert_int_eq(up_calls(), 2);
    ck_assert_uint_eq(coalescer_count(ctx.co), 0);
}
END_TEST

/* A connection that cannot get its struct conn is answered 503. */
START_TEST(test_conn_alloc_failure_is_503)
{
    struct buf got;
    char b[4096];
    ssize_t n;
    int sv[2];

    ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv),
                     0);
    alloc_fail_after(1, 0);
    conn_serve(&ctx, sv[0], 0, 0);         /* closes sv[0] */
    alloc_fail_after(0, 0);
    buf_init(&got, 1 << 16);
    while ((n = recv(sv[1], b, sizeof(b), MSG_DONTWAIT)) > 0)
        buf_append(&got, b, (size_t)n);
    ck_assert_int_eq(buf_append(&got, "", 1), 0);
    ck_assert(strncmp(buf_ptr(&got), "HTTP/1.1 503 ", 13) == 0);
    ck_assert(strstr(buf_ptr(&got), "Retry-After: 1\r\n") != NULL);
    ck_assert(strstr(buf_ptr(&got), "\"code\":\"overloaded\"") != NULL);
    ck_assert_int_eq(recv(sv[1], b, 1, MSG_DONTWAIT), 0);  /* closed */
    buf_release(&got);
    close(sv[1]);
}
END_TEST

/*
 * A refused client that keeps sending cannot hold the accept loop: at
 * most REPLY_REFUSE_DRAIN bytes of its input are read, then it is closed,
 * and it still got its 503.
 */
START_TEST(test_refuse_drain_is_bounded)
{
    static char junk[1 << 16];
    char b[512];
    size_t sent = 0, drained;
    ssize_t n;
    int sv[2], big = 4 << 20;

    memset(junk, 'j', sizeof(junk));
    ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv),
                     0);
    setsockopt(sv[1], SOL_SOCKET, SO_SNDBUF, &big, sizeof(big));
    while ((n = send(sv[1], junk, sizeof(junk), MSG_DONTWAIT)) > 0)
        sent += (size_t)n;
    ck_assert_uint_gt(sent, 2 * REPLY_REFUSE_DRAIN);
    drained = reply_refuse(sv[0], "refused-id", "too many connections");
    ck_assert_uint_eq(drained, REPLY_REFUSE_DRAIN);
    n = recv(sv[1], b, sizeof(b) - 1, MSG_DONTWAIT);
    ck_assert_int_gt(n, 0);
    b[n] = '\0';
    ck_assert(strncmp(b, "HTTP/1.1 503 ", 13) == 0);
    ck_assert(strstr(b, "X-Request-Id: refused-id\r\n") != NULL);
    close(sv[1]);
}
END_TEST

static Suite *
proxy_suite(void)
{
    Suite *s = suite_create("proxy");
    TCase *tc = tcase("paths");

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_trio_all_complete);
    tcase_add_test(tc, test_same_head_for_leader_and_followers);
    tcase_add_test(tc, test_append_enomem_mid_stream);
    tcase_add_test(tc, test_append_enomem_first_chunk);
    tcase_add_test(tc, test_leader_setup_enomem);
    tcase_add_test(tc, test_join_enomem_goes_direct);
    tcase_add_test(tc, test_direct_client_gone_stops_the_call);
    tcase_add_test(tc, test_leader_client_gone_stops_the_call);
    suite_add_tcase(s, tc);
    tc = tcase("admission");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_one_request_each_path);
    suite_add_tcase(s, tc);
    tc = tcase("edges");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_conn_alloc_failure_is_503);
    tcase_add_test(tc, test_refuse_drain_is_bounded);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    return test_run(srunner_create(proxy_suite()));
}
