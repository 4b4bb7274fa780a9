/* SPDX-License-Identifier: MIT */
/*
 * check_fanout.c - the writer policies over parked readers: pushing,
 * helpers, the sweep, and the relay loop, with socketpairs as clients.
 * The parked FIFO itself (park, take, release, wake) is check_flight's.
 */
#include <check.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "alloc.h"
#include "buf.h"
#include "coalesce/fanout.h"
#include "coalesce/flight.h"
#include "net.h"
#include "wire/reply.h"
#include "testutil.h"
#include "util.h"

/* How the calls behind the flights here end (outcome.h). */
static const struct call_outcome complete = { CALL_OK, 200, 0,
                                              CALL_FAULT_NONE };
static const struct call_outcome out_of_memory = { CALL_NOMEM, 0, 0,
                                                   CALL_FAULT_GATEWAY };

/* fanout.c's GW_TESTABLE functions. */
void help(struct flight *f, struct fanout_reader *r);

#define BIG ((size_t)1 << 30)

static _Atomic int no;              /* never draining or stopping */

/* A client: the gateway's end (fd, in the reply) and the peer's. */
struct client {
    int fd, peer;
    struct net_stream stream;       /* fd, plain */
    struct reply reply;
    struct fanout_reader r;
    pthread_t t;
    const struct fanout_opts *o;
    struct flight *f;
};

/* A client of 'f' that asked for the usage event ('usage') or not. */
static void
client_open_as(struct client *c, struct flight *f, int64_t timeout_ms,
               int usage)
{
    int sv[2];

    memset(c, 0, sizeof(*c));
    ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv),
                     0);
    c->fd = sv[0];
    c->peer = sv[1];
    c->f = f;
    net_stream_init(&c->stream, c->fd);
    reply_init(&c->reply, &c->stream, 4096, 5000, -1, &no);
    reply_start(&c->reply, "test-id", 1, 1);
    fanout_reader_init(&c->r, &c->reply, timeout_ms, "testkey", usage);
    ck_assert_int_eq(flight_attach(f, &c->r.fr), 0);
}

static void
client_open(struct client *c, struct flight *f, int64_t timeout_ms)
{
    client_open_as(c, f, timeout_ms, 1);
}

static void
client_close(struct client *c)
{
    flight_detach(c->f, &c->r.fr);
    fanout_reader_release(&c->r);
    reply_release(&c->reply);
    close(c->fd);
    if (c->peer != -1)
        close(c->peer);
}

/* Everything the peer has received so far (non-blocking). */
static void
peer_read(struct client *c, struct buf *out)
{
    char b[65536];
    ssize_t n;

    while ((n = recv(c->peer, b, sizeof(b), MSG_DONTWAIT)) > 0)
        ck_assert_int_eq(buf_append(out, b, (size_t)n), 0);
}

static void *
relay_main(void *p)
{
    struct client *c = p;

    fanout_relay(c->f, &c->r, c->o);
    return NULL;
}

static size_t
nparked(struct flight *f)
{
    return flight_parked(f);
}

/* Poll (3 s at most) until 'n' readers of 'f' are parked. */
static int
await_parked(struct flight *f, size_t n)
{
    int64_t end = gw_now_ms() + 3000;

    while (nparked(f) != n) {
        if (gw_now_ms() > end)
            return 0;
        sched_yield();
    }
    return 1;
}

/* Park 'c' without a thread: claimed, then released caught up. */
static void
park_threadless(struct flight *f, struct client *c)
{
    gw_mutex_lock(&f->lock);
    c->r.fr.state = FLIGHT_READER_CLAIMED;
    c->r.fr.qnext = NULL;
    gw_mutex_unlock(&f->lock);
    flight_reader_advance(&c->r.fr, f->nchunks);
    flight_reader_set_parkable(&c->r.fr, 1);
    flight_give_back(f, &c->r.fr);
}

static void
append_str(struct flight *f, const char *s)
{
    ck_assert_int_eq(flight_append(f, s, strlen(s), BIG, BIG), 0);
}

/*
 * The whole path: eight followers relaying on their own threads, parked;
 * the leader appends 100 chunks and pushes them (leader_writes on), then
 * ends the flight: every client gets the same complete, cleanly ended
 * body, and most chunks were written by the leader, not the followers.
 */
START_TEST(test_every_client_gets_every_byte)
{
    struct fanout_opts o = { &fanout_push_policy, 2, &no };
    struct flight *f = flight_new();
    struct client c[8];
    struct buf got[8];
    char line[32];

    flight_set_head(f, &(struct http_head){ 200, -1, "text/event-stream",
                                           0, 0 });
    for (int i = 0; i < 8; i++) {
        client_open(&c[i], f, 60000);
        c[i].o = &o;
        ck_assert_int_eq(pthread_create(&c[i].t, NULL, relay_main, &c[i]),
                         0);
    }
    ck_assert(await_parked(f, 8));
    for (int i = 0; i < 100; i++) {
        snprintf(line, sizeof(line), "data: %d\n\n", i);
        append_str(f, line);
        fanout_after_append(f, &o);
    }
    /* Pushed, not woken: they are all parked again, caught up. */
    ck_assert_uint_eq(nparked(f), 8);
    flight_finish(f, &complete);
    flight_wake_all(f);
    for (int i = 0; i < 8; i++) {
        pthread_join(c[i].t, NULL);
        buf_init(&got[i], 1 << 20);
        peer_read(&c[i], &got[i]);
        ck_assert_uint_eq(atomic_load(&c[i].r.fr.pos), 100);
        ck_assert_int_eq(c[i].reply.broken, 0);
    }
    ck_assert(strstr(buf_ptr(&got[0]), "HTTP/1.1 200 OK\r\n") != NULL);
    ck_assert(strstr(buf_ptr(&got[0]), "data: 99\n\n\r\n0\r\n\r\n") != NULL);
    for (int i = 1; i < 8; i++) {
        ck_assert_uint_eq(buf_len(&got[i]), buf_len(&got[0]));
        ck_assert_int_eq(memcmp(buf_ptr(&got[i]), buf_ptr(&got[0]),
                                buf_len(&got[0])), 0);
    }
    for (int i = 0; i < 8; i++) {
        buf_release(&got[i]);
        client_close(&c[i]);
    }
    flight_unref(f);
}
END_TEST

/* Two clients of 'f', the second with a socket that takes 4 KiB. */
static void
open_fast_and_slow(struct flight *f, struct client *fast,
                   struct client *slow)
{
    int small = 4096;

    client_open(fast, f, 60000);
    client_open(slow, f, 60000);
    ck_assert_int_eq(setsockopt(slow->fd, SOL_SOCKET, SO_SNDBUF, &small,
                                sizeof(small)), 0);
}

/*
 * A push that the socket cannot take whole keeps the rest in 'pending'
 * and the reader goes back to its thread; one that took everything is
 * parked again.
 */
START_TEST(test_full_socket_hands_back_with_pending)
{
    struct fanout_opts o = { &fanout_push_policy, 2, &no };
    struct flight *f = flight_new();
    struct client fast, slow;
    static char big[1 << 20];

    memset(big, 'b', sizeof(big));
    flight_set_head(f, &(struct http_head){ 200, -1, "", 0, 0 });
    open_fast_and_slow(f, &fast, &slow);
    park_threadless(f, &fast);
    park_threadless(f, &slow);
    ck_assert_int_eq(flight_append(f, "small", 5, BIG, BIG), 0);
    fanout_after_append(f, &o);
    ck_assert_uint_eq(nparked(f), 2);           /* both took it */
    ck_assert_int_eq(flight_append(f, big, sizeof(big), BIG, BIG), 0);
    {
        /* The fast one's peer reads: it must take 1 MiB in pieces. */
        int big_buf = 4 << 20;

        setsockopt(fast.fd, SOL_SOCKET, SO_SNDBUF, &big_buf,
                   sizeof(big_buf));
    }
    fanout_after_append(f, &o);
    ck_assert_int_eq(slow.r.fr.state, FLIGHT_READER_RUNNING);  /* back */
    ck_assert_uint_gt(buf_len(&slow.r.pending), 0);
    ck_assert_uint_eq(atomic_load(&slow.r.fr.pos), 2);  /* its bytes */
    ck_assert_int_eq(slow.reply.broken, 0);
    flight_wake_all(f);
    client_close(&fast);
    client_close(&slow);
    flight_unref(f);
}
END_TEST

/*
 * Out of memory keeping what a full socket did not take: that client is
 * dropped (its reply broken, handed back), and nobody else is hurt.
 */
START_TEST(test_pending_enomem_drops_that_client)
{
    struct fanout_opts o = { &fanout_push_policy, 2, &no };
    struct flight *f = flight_new();
    struct client ok, slow;
    static char big[1 << 20];

    memset(big, 'b', sizeof(big));
    flight_set_head(f, &(struct http_head){ 200, -1, "", 0, 0 });
    open_fast_and_slow(f, &ok, &slow);
    park_threadless(f, &slow);
    park_threadless(f, &ok);
    ck_assert_int_eq(flight_append(f, big, sizeof(big), BIG, BIG), 0);
    alloc_fail_after(1, 0);             /* slow's pending copy */
    fanout_after_append(f, &o);
    ck_assert_int_eq(alloc_failures(), 1);
    alloc_fail_after(0, 0);
    ck_assert_int_eq(slow.r.fr.state, FLIGHT_READER_RUNNING);
    ck_assert_int_eq(slow.reply.broken, 1);
    ck_assert_int_eq(ok.reply.broken, 0);
    flight_wake_all(f);
    client_close(&ok);
    client_close(&slow);
    flight_unref(f);
}
END_TEST

struct helping {
    struct flight *f;
    struct fanout_reader *r;
};

static void *
help_main(void *p)
{
    struct helping *h = p;

    help(h->f, h->r);
    return NULL;
}

/* Is the last parked reader at 'pos' (released there by the helper)? */
static int
tail_at(struct flight *f, size_t pos)
{
    int yes;

    gw_mutex_lock(&f->lock);
    yes = f->parked_tail != NULL
          && flight_reader_pos(f->parked_tail) == pos;
    gw_mutex_unlock(&f->lock);
    return yes;
}

/*
 * A helper serves its own client between its takes: a chunk that arrives
 * while it writes for 2,000 others reaches its own client before it is
 * done, not only the chunk it was called for.
 */
START_TEST(test_helper_serves_its_own_client_between_takes)
{
    enum { N = 2000 };
    struct client *c = calloc(N + 1, sizeof(*c));
    int proved = 0;

    ck_assert_ptr_nonnull(c);
    for (int attempt = 0; attempt < 5 && !proved; attempt++) {
        struct flight *f = flight_new();
        struct helping h;
        pthread_t t;
        int busy;

        flight_set_head(f, &(struct http_head){ 200, -1, "", 0, 0 });
        for (int i = 0; i <= N; i++) {
            client_open(&c[i], f, 60000);
            park_threadless(f, &c[i]);      /* c[0] first: the helper */
        }
        append_str(f, "first");
        ck_assert_uint_eq(flight_call_helpers(f, 1, 1), 1);
        ck_assert_int_eq(c[0].r.fr.helper, 1);
        h.f = f;
        h.r = &c[0].r;
        ck_assert_int_eq(pthread_create(&t, NULL, help_main, &h), 0);
        /* Once it has written for a first batch, a second chunk comes. */
        while (!tail_at(f, 1))
            sched_yield();
        append_str(f, "second");
        /* Asked after the append: a reader still parked at 0 is one the
         * helper takes later, and before that it serves its own client. */
        gw_mutex_lock(&f->lock);
        busy = f->parked != NULL && flight_reader_pos(f->parked) == 0;
        gw_mutex_unlock(&f->lock);
        pthread_join(t, NULL);
        c[0].r.fr.helper = 0;   /* flight_wait() clears it, as it returns */
        if (busy) {
            /* It had takes left after the append: its own client got the
             * second chunk before it stopped helping. */
            ck_assert_uint_eq(atomic_load(&c[0].r.fr.pos), 2);
            proved = 1;
        }
        flight_wake_all(f);
        for (int i = 0; i <= N; i++)
            client_close(&c[i]);
        flight_unref(f);
    }
    ck_assert_msg(proved, "the helper never had work left after an append");
    free(c);
}
END_TEST

/*
 * The sweep: a client that hung up, and a reader past its deadline, go
 * back to their threads; the others sleep on.
 */
START_TEST(test_sweep_finds_gone_and_late)
{
    struct flight *f = flight_new();
    struct client ok, gone, late;
    int64_t now = gw_now_ms();

    flight_set_head(f, &(struct http_head){ 200, -1, "", 0, 0 });
    client_open(&ok, f, 60000);
    client_open(&gone, f, 60000);
    client_open(&late, f, 60000);
    ok.r.deadline = gone.r.deadline = now + 60000;
    late.r.deadline = now - 1;
    park_threadless(f, &ok);
    park_threadless(f, &gone);
    park_threadless(f, &late);
    close(gone.peer);
    gone.peer = -1;
    fanout_sweep(f, now);
    ck_assert_int_eq(ok.r.fr.state, FLIGHT_READER_PARKED);
    ck_assert_int_eq(gone.r.fr.state, FLIGHT_READER_RUNNING);
    ck_assert_int_eq(gone.reply.broken, 1);
    ck_assert_int_eq(late.r.fr.state, FLIGHT_READER_RUNNING);
    ck_assert_int_eq(late.r.expired, 1);
    ck_assert_int_eq(ok.r.expired, 0);
    ck_assert_uint_eq(nparked(f), 1);
    flight_wake_all(f);
    client_close(&ok);
    client_close(&gone);
    client_close(&late);
    flight_unref(f);
}
END_TEST

/* Read the peer until 'want' shows up or 3 s pass. */
static int
peer_await(struct client *c, struct buf *got, const char *want)
{
    int64_t end = gw_now_ms() + 3000;
    struct pollfd p = { c->peer, POLLIN, 0 };

    for (;;) {
        peer_read(c, got);
        if (buf_len(got) > 0 && memmem(buf_ptr(got), buf_len(got), want,
                                       strlen(want)) != NULL)
            return 1;
        if (gw_now_ms() > end)
            return 0;
        poll(&p, 1, 50);
    }
}

/* A parked follower's deadline is kept by the sweep: 504. */
START_TEST(test_relay_follower_timeout)
{
    struct fanout_opts o = { &fanout_push_policy, 2, &no };
    struct flight *f = flight_new();
    struct client c;
    struct buf got;

    client_open(&c, f, 10000);
    c.o = &o;
    ck_assert_int_eq(pthread_create(&c.t, NULL, relay_main, &c), 0);
    ck_assert(await_parked(f, 1));
    fanout_sweep(f, gw_now_ms());       /* not yet */
    ck_assert_uint_eq(nparked(f), 1);
    fanout_sweep(f, gw_now_ms() + 20000);
    pthread_join(c.t, NULL);
    buf_init(&got, 1 << 16);
    ck_assert(peer_await(&c, &got, "follower wait timeout"));
    ck_assert(strncmp(buf_ptr(&got), "HTTP/1.1 504 ", 13) == 0);
    ck_assert(strstr(buf_ptr(&got), "\"code\":\"upstream_timeout\"") != NULL);
    buf_release(&got);
    flight_finish(f, &complete);
    client_close(&c);
    flight_unref(f);
}
END_TEST

/*
 * The stop: a parked follower is woken and ends the defined way, an SSE
 * error event and no last chunk once its stream is under way.
 */
START_TEST(test_relay_stop_ends_stream_defined_way)
{
    static _Atomic int stop;
    struct fanout_opts o = { &fanout_push_policy, 2, &stop };
    struct flight *f = flight_new();
    struct client c;
    struct buf got;

    flight_set_head(f, &(struct http_head){ 200, -1, "text/event-stream",
                                           0, 0 });
    append_str(f, "data: 1\n\n");
    client_open(&c, f, 60000);
    c.o = &o;
    ck_assert_int_eq(pthread_create(&c.t, NULL, relay_main, &c), 0);
    ck_assert(await_parked(f, 1));
    atomic_store(&stop, 1);
    flight_wake_all(f);
    pthread_join(c.t, NULL);
    buf_init(&got, 1 << 16);
    peer_read(&c, &got);
    ck_assert(memmem(buf_ptr(&got), buf_len(&got), "data: 1\n\n", 9));
    ck_assert(memmem(buf_ptr(&got), buf_len(&got),
                     "\"code\":\"shutting_down\"", 22) != NULL);
    ck_assert(memmem(buf_ptr(&got), buf_len(&got), "0\r\n\r\n", 5) == NULL);
    ck_assert_int_eq(c.reply.broken, 1);
    buf_release(&got);
    flight_finish(f, &complete);
    client_close(&c);
    flight_unref(f);
}
END_TEST

/*
 * Wait (1 s at most) until no one is writing for 'r' from a snapshot: a
 * write never waits for the client, so it is over at once.
 */
static int
await_not_read(struct fanout_reader *r)
{
    int64_t end = gw_now_ms() + 1000;

    while (atomic_load(&r->fr.reading)) {
        if (gw_now_ms() > end)
            return 0;
        sched_yield();
    }
    return 1;
}

/*
 * max_reader_lag: a follower whose client stops reading falls behind and
 * is cut, and the flight lets go of its chunks at once, while the
 * follower's own thread still waits on the client, on a copy (the rest
 * of what the leader pushed; with leader_writes off, of the chunk its
 * own thread wrote).  When the client reads again it gets what it was
 * given, then the SSE error event, and no clean end.
 */
START_TEST(test_relay_cut_lets_go_while_its_client_blocks)
{
    struct fanout_opts o = { fanout_policy_of(_i), 2, &no };
    struct flight *f = flight_new();
    struct flight_reader fast;
    struct client slow;
    struct buf got;
    static char chunk[16 * 1024];
    size_t max = 64 * 1024, lag = 256 * 1024;
    size_t per = sizeof(chunk) + FLIGHT_CHUNK_OVERHEAD;
    int small = 4096;

    memset(chunk, 'c', sizeof(chunk));
    flight_set_head(f, &(struct http_head){ 200, -1, "text/event-stream",
                                           0, 0 });
    ck_assert_int_eq(flight_attach(f, &fast), 0);
    client_open(&slow, f, 60000);
    ck_assert_int_eq(setsockopt(slow.fd, SOL_SOCKET, SO_SNDBUF, &small,
                                sizeof(small)), 0);
    slow.o = &o;
    ck_assert_int_eq(pthread_create(&slow.t, NULL, relay_main, &slow), 0);
    ck_assert(await_parked(f, 1));
    for (size_t i = 0; i < 200; i++) {
        ck_assert_msg(await_not_read(&slow.r), "a thread kept the "
                      "flight's chunks while it waited for its client");
        ck_assert_int_eq(flight_append(f, chunk, sizeof(chunk), max, lag),
                         0);
        atomic_store(&fast.pos, i + 1);     /* a reader that keeps up */
        fanout_after_append(f, &o);
        if (i == 0) {
            /* Its head is out before it can fall behind (with
             * leader_writes off its own thread, woken, writes it): else
             * the cut comes first, and the answer is a 503. */
            struct pollfd p = { slow.peer, POLLIN, 0 };

            ck_assert_int_eq(poll(&p, 1, 3000), 1);
        }
        ck_assert_uint_le(flight_kept_bytes(f), max + lag + per);
    }
    ck_assert_uint_le(flight_kept_bytes(f), 2 * per);
    flight_finish(f, &complete);
    flight_wake_all(f);
    buf_init(&got, 16 << 20);
    ck_assert(peer_await(&slow, &got, "client_too_slow"));
    pthread_join(slow.t, NULL);
    peer_read(&slow, &got);
    ck_assert_msg(strncmp(buf_ptr(&got), "HTTP/1.1 200 OK\r\n", 17) == 0,
                  "got %zu bytes: %.200s", buf_len(&got), buf_ptr(&got));
    /* The first chunk, pushed before it fell behind, and no more. */
    ck_assert_uint_gt(buf_len(&got), sizeof(chunk));
    ck_assert_uint_lt(buf_len(&got), 2 * sizeof(chunk));
    ck_assert(memmem(buf_ptr(&got), buf_len(&got), "0\r\n\r\n", 5) == NULL);
    ck_assert(memcmp(buf_ptr(&got) + buf_len(&got) - 4, "\n\n\r\n", 4)
              == 0);
    ck_assert_int_eq(slow.reply.broken, 1);
    buf_release(&got);
    flight_detach(f, &fast);
    client_close(&slow);
    flight_unref(f);
}
END_TEST

/* A failed flight: every client gets the same error, no clean end. */
START_TEST(test_relay_failure_same_for_all)
{
    struct fanout_opts o = { &fanout_wake_policy, 2, &no };
    struct flight *f = flight_new();
    struct client c[3];
    struct buf got[3];

    flight_set_head(f, &(struct http_head){ 200, -1, "text/event-stream",
                                           0, 0 });
    for (int i = 0; i < 3; i++) {
        client_open(&c[i], f, 60000);
        c[i].o = &o;
        ck_assert_int_eq(pthread_create(&c[i].t, NULL, relay_main, &c[i]),
                         0);
    }
    ck_assert(await_parked(f, 3));
    append_str(f, "data: 1\n\n");
    fanout_after_append(f, &o);         /* off: wakes everyone */
    ck_assert(await_parked(f, 3));
    flight_finish(f, &out_of_memory);
    flight_wake_all(f);
    for (int i = 0; i < 3; i++) {
        pthread_join(c[i].t, NULL);
        buf_init(&got[i], 1 << 16);
        peer_read(&c[i], &got[i]);
        ck_assert(memmem(buf_ptr(&got[i]), buf_len(&got[i]),
                         "gateway out of memory", 21) != NULL);
        ck_assert(memmem(buf_ptr(&got[i]), buf_len(&got[i]),
                         "0\r\n\r\n", 5) == NULL);
        ck_assert_uint_eq(buf_len(&got[i]), buf_len(&got[0]));
        ck_assert_int_eq(memcmp(buf_ptr(&got[i]), buf_ptr(&got[0]),
                                buf_len(&got[0])), 0);
    }
    for (int i = 0; i < 3; i++) {
        buf_release(&got[i]);
        client_close(&c[i]);
    }
    flight_unref(f);
}
END_TEST

/*
 * A finished flight (a cache hit) whose log fits one snapshot reaches a
 * new client in one push, head to end: the body's end goes in the same
 * write as the last chunk, and reply_end() then writes nothing more.
 */
static _Atomic int stop_now;
static const struct fanout_opts stopping_opts = {
    &fanout_push_policy, 2, &stop_now,
};

START_TEST(test_finished_flight_ends_with_its_last_chunk)
{
    struct fanout_opts o = { &fanout_push_policy, 2, &no };
    struct flight *f = flight_new();
    struct client c;
    struct buf got;
    char line[32];

    flight_set_head(f, &(struct http_head){ 200, -1, "text/event-stream",
                                           0, 0 });
    for (int i = 0; i < 20; i++) {
        snprintf(line, sizeof(line), "data: %d\n\n", i);
        append_str(f, line);
    }
    flight_finish(f, &complete);
    client_open(&c, f, 60000);          /* joins the finished flight */
    ck_assert_int_eq(fanout_push(f, &c.r), 0);
    buf_init(&got, 1 << 16);
    peer_read(&c, &got);
    ck_assert(strstr(buf_ptr(&got), "HTTP/1.1 200 OK\r\n") != NULL);
    ck_assert_uint_ge(buf_len(&got), 5);
    ck_assert_int_eq(memcmp(buf_ptr(&got) + buf_len(&got) - 17,
                            "data: 19\n\n\r\n0\r\n\r\n", 17), 0);
    ck_assert_int_eq(c.reply.end_sent, 1);
    /* The relay ends the answer cleanly without another byte, even with
     * the process stopping (no "shutting down" event after the end). */
    atomic_store(&stop_now, 1);
    fanout_relay(f, &c.r, &stopping_opts);
    atomic_store(&stop_now, 0);
    ck_assert_int_eq(c.reply.broken, 0);
    buf_reset(&got);
    peer_read(&c, &got);
    ck_assert_uint_eq(buf_len(&got), 0);
    fanout_relay(f, &c.r, &o);
    peer_read(&c, &got);
    ck_assert_uint_eq(buf_len(&got), 0);
    buf_release(&got);
    client_close(&c);
    flight_unref(f);
}
END_TEST

struct relay_run {
    struct client *c;
    _Atomic int done;
};

static void *
relay_then_flag(void *p)
{
    struct relay_run *run = p;

    fanout_relay(run->c->f, &run->c->r, run->c->o);
    atomic_store(&run->done, 1);
    return NULL;
}

/*
 * The same through a socket that takes a few KiB at a time (chunk sizes
 * vary with _i, so the socket cuts the log at different places, the last
 * chunk and its end included): what the client reads is the head, every
 * chunk framed, and the end once.
 */
START_TEST(test_finished_flight_through_a_small_socket)
{
    struct fanout_opts o = { &fanout_push_policy, 2, &no };
    struct flight *f = flight_new();
    struct client c;
    struct relay_run run = { &c, 0 };
    struct buf got;
    size_t want = 0, size = 700 + 331 * (size_t)_i, head;
    int small = 4096;
    char *chunk = malloc(size);
    char line[REPLY_SIZE_LINE];
    pthread_t t;
    int64_t end;

    ck_assert_ptr_nonnull(chunk);
    memset(chunk, 'x', size);
    flight_set_head(f, &(struct http_head){ 200, -1, "text/event-stream",
                                           0, 0 });
    for (int i = 0; i < 40; i++) {
        chunk[0] = (char)('a' + i % 26);
        ck_assert_int_eq(flight_append(f, chunk, size, BIG, BIG), 0);
        want += (size_t)snprintf(line, sizeof(line), "%zx\r\n", size)
                + size + 2;
    }
    want += 5;
    flight_finish(f, &complete);
    client_open(&c, f, 60000);
    c.o = &o;
    ck_assert_int_eq(setsockopt(c.fd, SOL_SOCKET, SO_SNDBUF, &small,
                                sizeof(small)), 0);
    ck_assert_int_eq(pthread_create(&t, NULL, relay_then_flag, &run), 0);
    buf_init(&got, 1 << 22);
    end = gw_now_ms() + 5000;
    while (!atomic_load(&run.done) && gw_now_ms() < end) {
        struct pollfd p = { c.peer, POLLIN, 0 };

        (void)poll(&p, 1, 10);
        peer_read(&c, &got);
    }
    pthread_join(t, NULL);
    peer_read(&c, &got);
    ck_assert_int_eq(c.reply.broken, 0);
    ck_assert_int_eq(c.reply.end_sent, 1);
    head = (size_t)(strstr(buf_ptr(&got), "\r\n\r\n") - buf_ptr(&got)) + 4;
    ck_assert_uint_eq(buf_len(&got) - head, want);
    ck_assert_int_eq(memcmp(buf_ptr(&got) + buf_len(&got) - 7,
                            "\r\n0\r\n\r\n", 7), 0);
    buf_release(&got);
    free(chunk);
    client_close(&c);
    flight_unref(f);
}
END_TEST

/* The events of a stream with its usage event (vLLM's, abridged). */
static const char *const usage_log[] = {
    "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n",
    "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3}}\n\n",
    "data: [DONE]\n\n",
};
#define USAGE_AT 1                  /* usage_log[USAGE_AT] is flagged */

/*
 * Append usage_log[from..] to 'f': the usage event flagged ('flag'),
 * unflagged, or (skip) not at all.  Then, with 'o', push.
 */
enum usage_as { AS_FLAGGED, AS_PLAIN, AS_ABSENT };

static void
append_log(struct flight *f, size_t from, size_t to, enum usage_as as,
           const struct fanout_opts *o)
{
    for (size_t i = from; i < to; i++) {
        const char *e = usage_log[i];

        if (i == USAGE_AT && as == AS_ABSENT)
            continue;
        if (i == USAGE_AT && as == AS_FLAGGED)
            ck_assert_int_eq(flight_append_usage(f, e, strlen(e), BIG, BIG),
                             0);
        else
            append_str(f, e);
        if (o != NULL)
            fanout_after_append(f, o);
    }
}

/* What a client of a finished flight of 'as' gets, relayed alone. */
static void
reference(enum usage_as as, size_t from, struct buf *out)
{
    struct fanout_opts o = { &fanout_push_policy, 2, &no };
    struct flight *f = flight_new();
    struct client c;

    flight_set_head(f, &(struct http_head){ 200, -1, "text/event-stream",
                                           0, 0 });
    client_open(&c, f, 60000);
    append_log(f, from, GW_ARRAY_LEN(usage_log), as, NULL);
    flight_finish(f, &complete);
    fanout_relay(f, &c.r, &o);
    buf_init(out, 1 << 20);
    peer_read(&c, out);
    client_close(&c);
    flight_unref(f);
}

/*
 * A usage event appended flagged reaches only the clients that asked:
 * they get the log byte for byte, as if nothing were flagged, and the
 * others every other byte, as if it were not there at all.  Both when
 * the leader pushes to parked readers and when a late joiner's own
 * thread replays the log; with the usage event in the middle of the
 * log (_i = 0) and first of all (_i = 1: the response head goes alone
 * to a client that skips it).
 */
START_TEST(test_usage_event_only_to_who_asked)
{
    struct fanout_opts o = { &fanout_push_policy, 2, &no };
    size_t from = _i == 0 ? 0 : USAGE_AT;
    struct flight *f = flight_new();
    struct buf got[4], asked, not_asked;
    struct client c[4];             /* even: asked; 0, 1 parked early */

    reference(AS_PLAIN, from, &asked);
    reference(AS_ABSENT, from, &not_asked);
    ck_assert_uint_lt(buf_len(&not_asked), buf_len(&asked));
    flight_set_head(f, &(struct http_head){ 200, -1, "text/event-stream",
                                           0, 0 });
    for (int i = 0; i < 2; i++) {
        client_open_as(&c[i], f, 60000, i % 2 == 0);
        c[i].o = &o;
        ck_assert_int_eq(pthread_create(&c[i].t, NULL, relay_main, &c[i]),
                         0);
    }
    ck_assert(await_parked(f, 2));
    append_log(f, from, USAGE_AT + 1, AS_FLAGGED, &o);
    for (int i = 2; i < 4; i++) {   /* late: they replay from chunk 0 */
        client_open_as(&c[i], f, 60000, i % 2 == 0);
        c[i].o = &o;
        ck_assert_int_eq(pthread_create(&c[i].t, NULL, relay_main, &c[i]),
                         0);
    }
    append_log(f, USAGE_AT + 1, GW_ARRAY_LEN(usage_log), AS_FLAGGED, &o);
    flight_finish(f, &complete);
    flight_wake_all(f);
    for (int i = 0; i < 4; i++) {
        const struct buf *want = i % 2 == 0 ? &asked : &not_asked;

        pthread_join(c[i].t, NULL);
        buf_init(&got[i], 1 << 20);
        peer_read(&c[i], &got[i]);
        ck_assert_int_eq(c[i].reply.broken, 0);
        ck_assert_msg(buf_len(&got[i]) == buf_len(want)
                      && memcmp(buf_ptr(&got[i]), buf_ptr(want),
                                buf_len(want)) == 0,
                      "client %d (%s) got\n%s\nwant\n%s", i,
                      i % 2 == 0 ? "asked" : "did not ask",
                      buf_ptr(&got[i]), buf_ptr(want));
        buf_release(&got[i]);
        client_close(&c[i]);
    }
    ck_assert(strstr(buf_ptr(&asked), "\"usage\"") != NULL);
    ck_assert(strstr(buf_ptr(&not_asked), "\"usage\"") == NULL);
    buf_release(&asked);
    buf_release(&not_asked);
    flight_unref(f);
}
END_TEST

static Suite *
fanout_suite(void)
{
    Suite *s = suite_create("fanout");
    TCase *tc = tcase("fanout");

    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_every_client_gets_every_byte);
    tcase_add_test(tc, test_full_socket_hands_back_with_pending);
    tcase_add_test(tc, test_pending_enomem_drops_that_client);
    tcase_add_test(tc, test_helper_serves_its_own_client_between_takes);
    tcase_add_test(tc, test_sweep_finds_gone_and_late);
    tcase_add_test(tc, test_relay_follower_timeout);
    tcase_add_test(tc, test_relay_stop_ends_stream_defined_way);
    tcase_add_test(tc, test_relay_failure_same_for_all);
    tcase_add_test(tc, test_finished_flight_ends_with_its_last_chunk);
    tcase_add_loop_test(tc, test_finished_flight_through_a_small_socket, 0,
                        8);
    tcase_add_loop_test(tc, test_relay_cut_lets_go_while_its_client_blocks,
                        0, 2);
    suite_add_tcase(s, tc);
    tc = tcase("usage");
    tcase_add_loop_test(tc, test_usage_event_only_to_who_asked, 0, 2);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    return test_run(srunner_create(fanout_suite()));
}
