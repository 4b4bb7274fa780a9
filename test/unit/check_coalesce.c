/*
 * check_coalesce.c - the flight (shared chunk vector) and the coalescer
 * (eligibility, key, map) without any sockets.
 */
#include <check.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "coalesce.h"
#include "config.h"
#include "flight.h"
#include "util.h"

static struct gw_config cfg;

static void
setup(void)
{
    ck_assert_int_eq(config_defaults(&cfg), 0);
}

static void
teardown(void)
{
    config_release(&cfg);
}

/* An upstream request as proxy.c builds it; 'auth' may be NULL. */
static struct upstream_request
ureq(const char *method, const char *path, const char *body,
     const char *auth)
{
    struct upstream_request ur;

    memset(&ur, 0, sizeof(ur));
    ur.method = method;
    ur.path = path;
    ur.body = body;
    ur.body_len = strlen(body);
    ur.request_id = "client-id";
    ur.client_auth = auth;
    return ur;
}

static void
key_of(const char *body, unsigned char key[FLIGHT_KEY_LEN])
{
    struct upstream_request ur = ureq("POST", "/v1/chat/completions", body,
                                      NULL);

    coalesce_key("default", "http://127.0.0.1:8000", &ur, key);
}

/* ---- the map ---- */

START_TEST(test_leader_then_follower)
{
    struct coalescer *co = coalescer_new(&cfg);
    unsigned char k[FLIGHT_KEY_LEN];
    struct flight *a, *b;
    enum metrics_bypass why;

    key_of("{\"x\":1}", k);
    ck_assert_int_eq(coalescer_join(co, k, &a, &why), COALESCE_LEADER);
    ck_assert_int_eq(coalescer_join(co, k, &b, &why), COALESCE_FOLLOWER);
    ck_assert_ptr_eq(a, b);
    ck_assert_uint_eq(coalescer_readers(a), 2);
    ck_assert_uint_eq(coalescer_count(co), 1);

    coalescer_finish(co, a, 0, NULL);
    ck_assert_uint_eq(coalescer_count(co), 0);      /* checkpoint 4 */
    coalescer_detach(co, b);                        /* follower */
    coalescer_detach(co, a);                        /* leader's client */
    flight_unref(a);                                /* leader's driver */
    coalescer_free(co);
}
END_TEST

START_TEST(test_after_finish_is_fresh_call)
{
    struct coalescer *co = coalescer_new(&cfg);
    unsigned char k[FLIGHT_KEY_LEN];
    struct flight *a, *b;
    enum metrics_bypass why;

    key_of("{\"x\":1}", k);
    ck_assert_int_eq(coalescer_join(co, k, &a, &why), COALESCE_LEADER);
    coalescer_finish(co, a, 0, NULL);
    /* Not a cache: the same key now leads a new flight. */
    ck_assert_int_eq(coalescer_join(co, k, &b, &why), COALESCE_LEADER);
    ck_assert_ptr_ne(a, b);
    coalescer_finish(co, b, 0, NULL);
    coalescer_detach(co, a);
    flight_unref(a);
    coalescer_detach(co, b);
    flight_unref(b);
    coalescer_free(co);
}
END_TEST

START_TEST(test_stale_flight_keeps_successor)
{
    struct coalescer *co = coalescer_new(&cfg);
    unsigned char k[FLIGHT_KEY_LEN];
    struct flight *a, *b, *c;
    enum metrics_bypass why;

    key_of("{\"x\":1}", k);
    ck_assert_int_eq(coalescer_join(co, k, &a, &why), COALESCE_LEADER);
    /* A's only client leaves: A is unlinked while its leader still runs. */
    coalescer_detach(co, a);
    ck_assert_uint_eq(coalescer_count(co), 0);
    ck_assert_int_eq(coalescer_join(co, k, &b, &why), COALESCE_LEADER);
    ck_assert_ptr_ne(a, b);
    /* A's leader finishes late: B must stay in the map. */
    coalescer_finish(co, a, GW_EABORTED, "no readers");
    flight_unref(a);
    ck_assert_uint_eq(coalescer_count(co), 1);
    ck_assert_int_eq(coalescer_join(co, k, &c, &why), COALESCE_FOLLOWER);
    ck_assert_ptr_eq(c, b);
    coalescer_finish(co, b, 0, NULL);
    coalescer_detach(co, c);
    coalescer_detach(co, b);
    flight_unref(b);
    coalescer_free(co);
}
END_TEST

START_TEST(test_bounds_bypass)
{
    struct coalescer *co;
    unsigned char k1[FLIGHT_KEY_LEN], k2[FLIGHT_KEY_LEN];
    struct flight *a, *b, *x;
    enum metrics_bypass why;

    cfg.max_followers = 1;
    cfg.max_flights = 1;
    cfg.max_flight_bytes = 10;
    co = coalescer_new(&cfg);
    key_of("{\"x\":1}", k1);
    key_of("{\"x\":2}", k2);
    ck_assert_int_eq(coalescer_join(co, k1, &a, &why), COALESCE_LEADER);
    ck_assert_int_eq(coalescer_join(co, k2, &x, &why), COALESCE_BYPASS);
    ck_assert_int_eq(why, BYPASS_MAX_FLIGHTS);
    ck_assert_ptr_null(x);
    ck_assert_int_eq(coalescer_join(co, k1, &b, &why), COALESCE_FOLLOWER);
    ck_assert_int_eq(coalescer_join(co, k1, &x, &why), COALESCE_BYPASS);
    ck_assert_int_eq(why, BYPASS_MAX_FOLLOWERS);
    coalescer_finish(co, a, 0, NULL);
    coalescer_detach(co, b);
    coalescer_detach(co, a);
    flight_unref(a);

    /* Past max_flight_bytes the flight stops taking joiners. */
    ck_assert_int_eq(coalescer_join(co, k1, &a, &why), COALESCE_LEADER);
    flight_set_head(a, 200, "text/event-stream", -1);
    ck_assert_int_eq(flight_append(a, "0123456789ab", 12, 10), 0);
    ck_assert_int_eq(coalescer_join(co, k1, &x, &why), COALESCE_BYPASS);
    ck_assert_int_eq(why, BYPASS_MAX_FLIGHT_BYTES);
    coalescer_finish(co, a, 0, NULL);
    coalescer_detach(co, a);
    flight_unref(a);
    coalescer_free(co);
}
END_TEST

/* ---- flight replay and waiting ---- */

START_TEST(test_late_joiner_replays_everything)
{
    struct coalescer *co = coalescer_new(&cfg);
    unsigned char k[FLIGHT_KEY_LEN];
    struct flight *a, *b;
    struct flight_reader r;
    struct flight_view v;
    enum metrics_bypass why;

    key_of("{}", k);
    ck_assert_int_eq(coalescer_join(co, k, &a, &why), COALESCE_LEADER);
    flight_set_head(a, 200, "text/event-stream", -1);
    ck_assert_int_eq(flight_append(a, "data: 1\n\n", 9, 1 << 20), 0);
    ck_assert_int_eq(flight_append(a, "data: 2\n\n", 9, 1 << 20), 0);
    ck_assert_int_eq(coalescer_join(co, k, &b, &why), COALESCE_FOLLOWER);
    flight_reader_init(&r);
    ck_assert_int_eq(flight_wait(b, &r, gw_now_ms() + 1000, &v), 0);
    ck_assert_int_eq(v.head_set, 1);
    ck_assert_int_eq(v.status, 200);
    ck_assert_str_eq(v.content_type, "text/event-stream");
    ck_assert_uint_eq(v.count, 2);
    ck_assert_int_eq(memcmp(v.chunk[0]->data, "data: 1\n\n", 9), 0);
    ck_assert_int_eq(memcmp(v.chunk[1]->data, "data: 2\n\n", 9), 0);
    ck_assert_int_eq(v.state, FLIGHT_RUNNING);
    /* Nothing new past index 2: the wait times out, state unchanged. */
    r.index = 2;
    ck_assert_int_eq(flight_wait(b, &r, gw_now_ms() + 50, &v), GW_ETIMEDOUT);
    ck_assert_int_eq(r.where, FLIGHT_READER_RUNNING);
    ck_assert_uint_eq(v.count, 0);
    coalescer_finish(co, a, GW_EUPSTREAM, "connection broken");
    ck_assert_int_eq(flight_wait(b, &r, gw_now_ms() + 1000, &v), 0);
    ck_assert_int_eq(v.state, FLIGHT_FAILED);
    ck_assert_int_eq(v.err_rc, GW_EUPSTREAM);
    ck_assert_str_eq(v.err_reason, "connection broken");
    flight_reader_destroy(&r);
    coalescer_detach(co, b);
    coalescer_detach(co, a);
    flight_unref(a);
    coalescer_free(co);
}
END_TEST

struct waiter {
    struct flight *f;
    struct flight_reader r;
    int64_t deadline;           /* of one wait; 0: +5 s */
    int once;                   /* return after one wait */
    _Atomic int returned;
    int helped;                 /* readers it wrote for as a helper */
    int rc;
    size_t got;
    size_t count;
    int state;
};

static void *
wait_all(void *p)
{
    struct waiter *w = p;
    struct flight_view v;

    for (;;) {
        w->rc = flight_wait(w->f, &w->r, w->deadline != 0 ? w->deadline
                                                      : gw_now_ms() + 5000,
                            &v);
        if (w->r.helper) {
            /* A helper: "write" to the readers behind, one at a time. */
            struct flight_reader *list;
            size_t left;

            w->r.helper = 0;
            while ((list = flight_take(w->f, 1, &left)) != NULL) {
                ck_assert_ptr_null(list->next);
                list->index = v.nchunks;
                list->parkable = 1;
                w->helped++;
                flight_release(w->f, list);
            }
        }
        w->count = v.count;
        w->r.index += v.count;
        if (w->once || (v.count == 0 && v.state != FLIGHT_RUNNING
                        && w->r.index >= v.nchunks))
            break;
    }
    w->got = w->r.index;
    w->state = v.state;
    atomic_store(&w->returned, 1);
    return NULL;
}

static size_t
parked_count(struct flight *f)
{
    size_t n;

    gw_mutex_lock(&f->lock);
    n = f->nparked;
    gw_mutex_unlock(&f->lock);
    return n;
}

/* Poll (2 s at most) until 'n' readers of 'f' are parked. */
static int
await_parked(struct flight *f, size_t n)
{
    int64_t end = gw_now_ms() + 2000;

    while (parked_count(f) != n) {
        if (gw_now_ms() > end)
            return 0;
        sched_yield();
    }
    return 1;
}

/*
 * Join 'n' followers to the flight for 'k', each waiting in a thread;
 * 'once' and 'deadline' as in struct waiter.
 */
static void
spawn_followers(struct coalescer *co, const unsigned char *k,
                struct waiter *w, pthread_t *t, int n, int once,
                int64_t deadline)
{
    enum metrics_bypass why;
    struct flight *b;

    memset(w, 0, (size_t)n * sizeof(*w));
    for (int i = 0; i < n; i++) {
        ck_assert_int_eq(coalescer_join(co, k, &b, &why),
                         COALESCE_FOLLOWER);
        w[i].f = b;
        w[i].once = once;
        w[i].deadline = deadline;
        flight_reader_init(&w[i].r);
        ck_assert_int_eq(pthread_create(&t[i], NULL, wait_all, &w[i]), 0);
    }
}

/* Tear down a test with leader flight 'a' and one returned waiter. */
static void
finish_one(struct coalescer *co, struct flight *a, struct waiter *w)
{
    flight_reader_destroy(&w->r);
    coalescer_finish(co, a, 0, NULL);
    coalescer_detach(co, w->f);
    coalescer_detach(co, a);
    flight_unref(a);
    coalescer_free(co);
}

START_TEST(test_every_waiter_wakes_on_finish)
{
    struct coalescer *co = coalescer_new(&cfg);
    unsigned char k[FLIGHT_KEY_LEN];
    struct waiter w[8];
    pthread_t t[8];
    struct flight *a;
    enum metrics_bypass why;

    key_of("{}", k);
    ck_assert_int_eq(coalescer_join(co, k, &a, &why), COALESCE_LEADER);
    flight_set_head(a, 200, NULL, -1);
    spawn_followers(co, k, w, t, 8, 0, 0);
    ck_assert(await_parked(a, 8));
    /* Appends alone wake nobody: the leader hands readers back. */
    for (int i = 0; i < 100; i++)
        ck_assert_int_eq(flight_append(a, "x", 1, 1 << 20), 0);
    ck_assert_uint_eq(parked_count(a), 8);
    coalescer_finish(co, a, 0, NULL);
    for (int i = 0; i < 8; i++) {
        pthread_join(t[i], NULL);
        ck_assert_uint_eq(w[i].got, 100);
        ck_assert_int_eq(w[i].state, FLIGHT_DONE);
        flight_reader_destroy(&w[i].r);
        coalescer_detach(co, w[i].f);
    }
    ck_assert_uint_eq(parked_count(a), 0);
    coalescer_detach(co, a);
    flight_unref(a);
    coalescer_free(co);
}
END_TEST

/*
 * The leader claims parked readers, "writes" for them (moves their
 * index) and releases them: a caught-up one sleeps on, one that is not
 * is handed back to its thread with the rest of the flight to send.
 */
START_TEST(test_claim_release_hands_back_only_the_blocked)
{
    struct coalescer *co = coalescer_new(&cfg);
    unsigned char k[FLIGHT_KEY_LEN];
    struct waiter w;
    pthread_t t;
    struct flight *a;
    struct flight_reader *list;
    enum metrics_bypass why;
    size_t n;

    key_of("{}", k);
    ck_assert_int_eq(coalescer_join(co, k, &a, &why), COALESCE_LEADER);
    spawn_followers(co, k, &w, &t, 1, 1, 0);
    ck_assert(await_parked(a, 1));
    ck_assert_int_eq(flight_append(a, "one", 3, 1 << 20), 0);
    ck_assert_uint_eq(parked_count(a), 1);      /* an append wakes nobody */
    ck_assert_int_eq(atomic_load(&w.returned), 0);
    list = flight_claim(a, &n);
    ck_assert_uint_eq(n, 1);
    ck_assert_ptr_eq(list, &w.r);
    ck_assert_ptr_null(list->next);
    ck_assert_int_eq(list->where, FLIGHT_READER_CLAIMED);
    list->index = 1;                            /* "sent" chunk 0 */
    list->parkable = 1;
    flight_release(a, list);
    ck_assert_uint_eq(parked_count(a), 1);
    ck_assert_int_eq(atomic_load(&w.returned), 0);  /* still asleep */
    ck_assert_int_eq(flight_append(a, "two", 3, 1 << 20), 0);
    list = flight_claim(a, &n);
    ck_assert_uint_eq(n, 1);
    ck_assert_ptr_eq(list, &w.r);
    list->parkable = 0;                         /* its socket was full */
    flight_release(a, list);
    pthread_join(t, NULL);
    ck_assert_int_eq(w.rc, 0);
    ck_assert_uint_eq(w.count, 1);              /* chunk 1, from index 1 */
    ck_assert_uint_eq(w.got, 2);
    ck_assert_int_eq(w.r.where, FLIGHT_READER_RUNNING);
    finish_one(co, a, &w);
}
END_TEST

/*
 * A reader whose wait times out while the leader holds it must not run
 * (the leader may be writing to its client) before the release; released
 * (even as parkable) it leaves with the timeout, and its index shows
 * what the leader wrote meanwhile.
 */
START_TEST(test_timeout_while_claimed_waits_for_release)
{
    struct coalescer *co = coalescer_new(&cfg);
    unsigned char k[FLIGHT_KEY_LEN];
    struct waiter w;
    pthread_t t;
    struct flight *a;
    struct flight_reader *list;
    enum metrics_bypass why;
    int64_t end;
    size_t n;

    key_of("{}", k);
    ck_assert_int_eq(coalescer_join(co, k, &a, &why), COALESCE_LEADER);
    spawn_followers(co, k, &w, &t, 1, 1, gw_now_ms() + 100);
    ck_assert(await_parked(a, 1));
    ck_assert_int_eq(flight_append(a, "one", 3, 1 << 20), 0);
    list = flight_claim(a, &n);
    ck_assert_uint_eq(n, 1);
    ck_assert_ptr_eq(list, &w.r);
    /* Well past its deadline, it is still waiting. */
    end = w.deadline + 300;
    while (gw_now_ms() < end) {
        ck_assert_int_eq(atomic_load(&w.returned), 0);
        sched_yield();
    }
    list->index = 1;
    list->parkable = 1;
    flight_release(a, list);
    pthread_join(t, NULL);
    ck_assert_int_eq(w.rc, GW_ETIMEDOUT);
    ck_assert_uint_eq(w.got, 1);
    ck_assert_int_eq(w.r.where, FLIGHT_READER_RUNNING);
    ck_assert_uint_eq(parked_count(a), 0);
    finish_one(co, a, &w);
}
END_TEST

/*
 * flight_take() hands out only readers that are behind, oldest first, at
 * most 'max' at a time; one released caught up is parked again and not
 * taken again until the next append.
 */
START_TEST(test_take_only_the_readers_behind)
{
    struct coalescer *co = coalescer_new(&cfg);
    unsigned char k[FLIGHT_KEY_LEN];
    struct waiter w[3];
    pthread_t t[3];
    struct flight *a;
    struct flight_reader *list, *third;
    enum metrics_bypass why;
    size_t left;

    key_of("{}", k);
    ck_assert_int_eq(coalescer_join(co, k, &a, &why), COALESCE_LEADER);
    flight_set_head(a, 200, NULL, -1);
    spawn_followers(co, k, w, t, 3, 0, 0);
    ck_assert(await_parked(a, 3));
    /* Nobody is behind before the first chunk. */
    ck_assert_ptr_null(flight_take(a, 8, &left));
    ck_assert_uint_eq(left, 3);
    ck_assert_int_eq(flight_append(a, "x", 1, 1 << 20), 0);
    list = flight_take(a, 2, &left);
    ck_assert_ptr_nonnull(list);
    ck_assert_ptr_nonnull(list->next);
    ck_assert_ptr_null(list->next->next);
    ck_assert_uint_eq(left, 1);
    ck_assert_int_eq(list->where, FLIGHT_READER_CLAIMED);
    for (struct flight_reader *fr = list; fr != NULL; fr = fr->next) {
        fr->index = 1;
        fr->parkable = 1;
    }
    flight_release(a, list);                /* parked behind the third */
    third = flight_take(a, 8, &left);
    ck_assert_ptr_nonnull(third);
    ck_assert_ptr_null(third->next);
    ck_assert_uint_eq(third->index, 0);
    ck_assert_uint_eq(left, 2);
    third->index = 1;
    third->parkable = 1;
    flight_release(a, third);
    ck_assert_ptr_null(flight_take(a, 8, &left));
    ck_assert_uint_eq(left, 3);
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(atomic_load(&w[i].returned), 0);
    coalescer_finish(co, a, 0, NULL);
    for (int i = 0; i < 3; i++) {
        pthread_join(t[i], NULL);
        ck_assert_uint_eq(w[i].got, 1);
        flight_reader_destroy(&w[i].r);
        coalescer_detach(co, w[i].f);
    }
    coalescer_detach(co, a);
    flight_unref(a);
    coalescer_free(co);
}
END_TEST

/*
 * The leader calls a helper: one reader's thread is handed back, takes
 * the other readers that are behind, writes for them and parks them
 * again, then itself; nobody else wakes.  One helper per 'per' readers.
 */
START_TEST(test_helper_writes_for_the_others)
{
    struct coalescer *co = coalescer_new(&cfg);
    unsigned char k[FLIGHT_KEY_LEN];
    struct waiter w[3];
    pthread_t t[3];
    struct flight *a;
    enum metrics_bypass why;
    int helpers = 0, helped = 0;

    key_of("{}", k);
    ck_assert_int_eq(coalescer_join(co, k, &a, &why), COALESCE_LEADER);
    flight_set_head(a, 200, NULL, -1);
    spawn_followers(co, k, w, t, 3, 0, 0);
    ck_assert(await_parked(a, 3));
    ck_assert_int_eq(flight_append(a, "x", 1, 1 << 20), 0);
    ck_assert_uint_eq(flight_call_helpers(a, 5, 4), 0);    /* 3 / 4 */
    ck_assert_uint_eq(flight_call_helpers(a, 5, 2), 1);    /* 3 / 2 */
    /* The helper parks the other two and then itself, all at index 1. */
    ck_assert(await_parked(a, 3));
    coalescer_finish(co, a, 0, NULL);
    for (int i = 0; i < 3; i++) {
        pthread_join(t[i], NULL);
        ck_assert_uint_eq(w[i].got, 1);
        ck_assert_int_eq(w[i].state, FLIGHT_DONE);
        helpers += w[i].helped > 0;
        helped += w[i].helped;
        flight_reader_destroy(&w[i].r);
        coalescer_detach(co, w[i].f);
    }
    ck_assert_int_eq(helpers, 1);
    ck_assert_int_eq(helped, 2);
    coalescer_detach(co, a);
    flight_unref(a);
    coalescer_free(co);
}
END_TEST

/* ---- key and eligibility ---- */

/* Key of tenant 't', upstream 'u' and the request fields. */
static void
key5(const char *t, const char *u, const char *method, const char *path,
     const char *body, const char *auth, unsigned char key[FLIGHT_KEY_LEN])
{
    struct upstream_request ur = ureq(method, path, body, auth);

    coalesce_key(t, u, &ur, key);
}

START_TEST(test_key_separates_fields)
{
    unsigned char a[FLIGHT_KEY_LEN], b[FLIGHT_KEY_LEN];
    struct upstream_request ur;

    key5("t1", "http://u", "POST", "/v1/completions", "{}", NULL, a);
    key5("t2", "http://u", "POST", "/v1/completions", "{}", NULL, b);
    ck_assert_int_ne(memcmp(a, b, FLIGHT_KEY_LEN), 0);     /* tenant */
    key5("t1", "http://u", "POST", "/v1/chat/completions", "{}", NULL, b);
    ck_assert_int_ne(memcmp(a, b, FLIGHT_KEY_LEN), 0);     /* path */
    key5("t1", "http://u", "POST", "/v1/completions?x=1", "{}", NULL, b);
    ck_assert_int_ne(memcmp(a, b, FLIGHT_KEY_LEN), 0);     /* query */
    key5("t1", "http://v", "POST", "/v1/completions", "{}", NULL, b);
    ck_assert_int_ne(memcmp(a, b, FLIGHT_KEY_LEN), 0);     /* upstream */
    key5("t1", "http://u", "POST", "/v1/completions", "{ }", NULL, b);
    ck_assert_int_ne(memcmp(a, b, FLIGHT_KEY_LEN), 0);     /* body bytes */
    key5("t1", "http://u", "GET", "/v1/completions", "{}", NULL, b);
    ck_assert_int_ne(memcmp(a, b, FLIGHT_KEY_LEN), 0);     /* method */
    /* A forwarded credential is part of the key; none differs from "". */
    key5("t1", "http://u", "POST", "/v1/completions", "{}", "Bearer k1", b);
    ck_assert_int_ne(memcmp(a, b, FLIGHT_KEY_LEN), 0);
    key5("t1", "http://u", "POST", "/v1/completions", "{}", "", b);
    ck_assert_int_ne(memcmp(a, b, FLIGHT_KEY_LEN), 0);
    key5("t1", "http://u", "POST", "/v1/completions", "{}", "Bearer k1", a);
    key5("t1", "http://u", "POST", "/v1/completions", "{}", "Bearer k2", b);
    ck_assert_int_ne(memcmp(a, b, FLIGHT_KEY_LEN), 0);
    key5("t1", "http://u", "POST", "/v1/completions", "{}", "Bearer k1", b);
    ck_assert_int_eq(memcmp(a, b, FLIGHT_KEY_LEN), 0);     /* stable */
    /* Length prefixes: moving a byte between fields changes the key. */
    key5("t1", "http://u", "POST", "/v1/completions", "{}", NULL, a);
    key5("t", "1http://u", "POST", "/v1/completions", "{}", NULL, b);
    ck_assert_int_ne(memcmp(a, b, FLIGHT_KEY_LEN), 0);
    /* The client's request id is not hashed: the flight sends its own. */
    ur = ureq("POST", "/v1/completions", "{}", NULL);
    ur.request_id = "another-client";
    coalesce_key("t1", "http://u", &ur, b);
    ck_assert_int_eq(memcmp(a, b, FLIGHT_KEY_LEN), 0);
}
END_TEST

static const struct {
    const char *body;
    double omitted;
    int eligible;
    const char *note;
} sampling[] = {
    { "{}", 0, 1, "omitted temperature, default config: the seed's demo" },
    { "{}", 1.0, 0, "omitted temperature, strict config (vLLM's 1.0)" },
    { "{}", 0.5, 0, "omitted counts as 0.5" },
    { "{\"temperature\":0}", 1.0, 1, "greedy" },
    { "{\"temperature\":0.0}", 1.0, 1, "greedy, real zero" },
    { "{\"temperature\":-0.0}", 1.0, 1, "negative zero is zero" },
    { "{\"temperature\":1e-400}", 1.0, 1, "underflows to zero: zero" },
    { "{\"temperature\":0e7}", 1.0, 1, "zero with an exponent" },
    { "{\"temperature\":1e-300}", 0, 0, "tiny but not zero" },
    { "{\"temperature\":0.7}", 0, 0, "random sampling, no seed" },
    { "{\"temperature\":-1}", 0, 0, "negative temperature: upstream's call" },
    { "{\"temperature\":0,\"top_p\":0.5}", 0, 1, "greedy: top_p is moot" },
    { "{\"temperature\":0.7,\"seed\":42}", 0, 1, "seed makes it repeatable" },
    { "{\"temperature\":1.5,\"seed\":0}", 0, 1, "seed 0 is a seed" },
    { "{\"temperature\":1.5,\"seed\":-0}", 0, 1, "seed -0 is 0" },
    { "{\"seed\":7}", 1.0, 1, "seed with omitted temperature" },
    { "{\"seed\":7,\"top_p\":0.1}", 0, 1, "seed makes top_p repeatable" },
    { "{\"temperature\":0.7,\"seed\":-1}", 0, 0, "negative seed: random" },
    { "{\"temperature\":0,\"seed\":-1}", 0, 0, "negative seed, greedy" },
    { "{\"seed\":-42}", 0, 0, "negative seed, omitted temperature" },
    { "{\"temperature\":0.7,\"seed\":4.2}", 0, 0, "non-integer seed" },
    { "{\"temperature\":0.7,\"seed\":42.0}", 0, 0, "real seed" },
    { "{\"temperature\":0.7,\"seed\":\"42\"}", 0, 0, "string seed" },
    { "{\"seed\":null}", 0, 0, "null seed is no seed" },
    { "{\"seed\":true}", 0, 0, "boolean seed" },
    { "{\"temperature\":\"0\"}", 0, 0, "string temperature" },
    { "{\"temperature\":null}", 0, 0, "null temperature" },
    { "{\"temperature\":false}", 0, 0, "boolean temperature" },
    { "{\"temperature\":[0]}", 0, 0, "array temperature" },
    /* Omitted temperature: every other control must leave greedy alone. */
    { "{\"top_p\":1}", 0, 1, "top_p 1 is neutral" },
    { "{\"top_p\":1.0,\"top_k\":0,\"min_p\":0,\"n\":1}", 0, 1,
      "all neutral" },
    { "{\"top_k\":-1}", 0, 1, "top_k -1 is vLLM's off" },
    { "{\"min_p\":1e-400}", 0, 1, "min_p underflows to 0" },
    { "{\"top_p\":0.9}", 0, 0, "nucleus sampling" },
    { "{\"top_p\":0.9999}", 0, 0, "nucleus sampling, barely" },
    { "{\"typical_p\":0.5}", 0, 0, "typical sampling" },
    { "{\"top_k\":40}", 0, 0, "top-k sampling" },
    { "{\"top_k\":1}", 0, 0, "top_k 1: counted as sampling" },
    { "{\"min_p\":0.05}", 0, 0, "min-p sampling" },
    { "{\"n\":3}", 0, 0, "several choices" },
    { "{\"best_of\":2}", 0, 0, "best of several candidates" },
    { "{\"top_p\":\"0.9\"}", 0, 0, "string top_p" },
    { "{\"top_k\":null}", 0, 0, "null top_k" },
    { "{\"min_p\":true}", 0, 0, "boolean min_p" },
    { "{\"top_p\":0.9}", 1.0, 0, "strict config too" },
};

START_TEST(test_sampling_rule)
{
    struct http_request r;
    enum metrics_bypass why = BYPASS_COUNT;
    json_t *j;

    memset(&r, 0, sizeof(r));
    cfg.omitted_temperature = sampling[_i].omitted;
    j = json_loads(sampling[_i].body, 0, NULL);
    ck_assert_ptr_nonnull(j);
    ck_assert_msg(coalesce_eligible(&cfg, CONFIG_MAX_TENANTS, &r, j, &why)
                  == sampling[_i].eligible, "%s: %s", sampling[_i].body,
                  sampling[_i].note);
    if (!sampling[_i].eligible)
        ck_assert_int_eq(why, BYPASS_SAMPLING);
    json_decref(j);
}
END_TEST

static int
parse(const char *raw, struct http_request *r)
{
    return http_parse_request(raw, strlen(raw), 16384, r);
}

static const struct {
    const char *fields;         /* header field lines, CRLF-terminated */
    int opted_out;
    const char *note;
} opt_outs[] = {
    { "X-Infergw-Coalesce: off\r\n", 1, "the gateway's own switch" },
    { "Cache-Control: no-cache\r\n", 1, "no-cache" },
    { "Cache-Control: max-age=0, no-store\r\n", 1, "no-store in a list" },
    { "Cache-Control: max-age=0\r\nCache-Control: no-cache\r\n", 1,
      "RFC 9110 5.3: a second line continues the list" },
    { "Cache-Control: max-age=0\r\ncache-control: No-Store\r\n", 1,
      "names and directives are case-insensitive" },
    { "X-Infergw-Coalesce: on\r\nX-Infergw-Coalesce: OFF\r\n", 1,
      "off on a second line" },
    { "Cache-Control: no-cache=\"x\"\r\n", 1, "no-cache with an argument" },
    { "", 0, "no opt-out header" },
    { "Cache-Control: max-age=0\r\n", 0, "another directive" },
    { "Cache-Control: no-cachex, x-no-cache\r\n", 0, "substrings only" },
    { "X-Infergw-Coalesce: offline\r\n", 0, "not the token off" },
    { "X-Infergw-Coalesce: on\r\n", 0, "explicitly on" },
};

START_TEST(test_opt_out_headers)
{
    struct http_request r;
    enum metrics_bypass why = BYPASS_COUNT;
    json_t *j = json_loads("{\"temperature\":0}", 0, NULL);
    char raw[512];

    snprintf(raw, sizeof(raw), "POST / HTTP/1.1\r\nHost: x\r\n%s\r\n",
             opt_outs[_i].fields);
    ck_assert_int_gt(parse(raw, &r), 0);
    ck_assert_msg(coalesce_eligible(&cfg, CONFIG_MAX_TENANTS, &r, j, &why)
                  == !opt_outs[_i].opted_out, "%s", opt_outs[_i].note);
    if (opt_outs[_i].opted_out)
        ck_assert_int_eq(why, BYPASS_OPT_OUT);
    json_decref(j);
}
END_TEST

START_TEST(test_global_switch)
{
    struct http_request r;
    enum metrics_bypass why;
    json_t *j = json_loads("{\"temperature\":0}", 0, NULL);

    ck_assert_int_gt(parse("POST / HTTP/1.1\r\nHost: x\r\n\r\n", &r), 0);
    ck_assert_int_eq(coalesce_eligible(&cfg, CONFIG_MAX_TENANTS, &r, j,
                                       &why), 1);
    cfg.coalesce = 0;
    ck_assert_int_eq(coalesce_eligible(&cfg, CONFIG_MAX_TENANTS, &r, j,
                                       &why), 0);
    ck_assert_int_eq(why, BYPASS_DISABLED);
    json_decref(j);
}
END_TEST

START_TEST(test_tenants)
{
    struct gw_config c;
    struct http_request r;
    enum metrics_bypass why;
    char err[256];
    json_t *j = json_loads("{}", 0, NULL);
    static const char conf[] =
        "[tenant acme]\napi_key = sk-acme\n"
        "[tenant globex]\napi_key = sk-globex\napi_key = sk-g2\n"
        "coalesce = off\n";

    config_release(&cfg);
    ck_assert_int_eq(config_load_text("t.conf", conf, &c, err, sizeof(err)),
                     0);
    ck_assert_int_gt(parse("POST / HTTP/1.1\r\nHost: x\r\n"
                           "Authorization: Bearer sk-acme\r\n\r\n", &r), 0);
    ck_assert_uint_eq(coalesce_tenant(&c, &r), 0);
    ck_assert_str_eq(coalesce_tenant_name(&c, 0), "acme");
    ck_assert_int_gt(parse("POST / HTTP/1.1\r\nHost: x\r\n"
                           "Authorization: Bearer sk-g2\r\n\r\n", &r), 0);
    ck_assert_uint_eq(coalesce_tenant(&c, &r), 1);
    ck_assert_int_eq(coalesce_eligible(&c, 1, &r, j, &why), 0);
    ck_assert_int_eq(why, BYPASS_TENANT);
    ck_assert_int_gt(parse("POST / HTTP/1.1\r\nHost: x\r\n"
                           "Authorization: Bearer sk-acm\r\n\r\n", &r), 0);
    ck_assert_uint_eq(coalesce_tenant(&c, &r), CONFIG_MAX_TENANTS);
    ck_assert_str_eq(coalesce_tenant_name(&c, CONFIG_MAX_TENANTS),
                     "default");
    ck_assert_int_gt(parse("POST / HTTP/1.1\r\nHost: x\r\n\r\n", &r), 0);
    ck_assert_uint_eq(coalesce_tenant(&c, &r), CONFIG_MAX_TENANTS);
    json_decref(j);
    config_release(&c);
    config_defaults(&cfg);          /* for teardown */
}
END_TEST

static Suite *
coalesce_suite(void)
{
    Suite *s = suite_create("coalesce");
    TCase *tc;

    tc = tcase_create("map");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 10);
    tcase_add_test(tc, test_leader_then_follower);
    tcase_add_test(tc, test_after_finish_is_fresh_call);
    tcase_add_test(tc, test_stale_flight_keeps_successor);
    tcase_add_test(tc, test_bounds_bypass);
    suite_add_tcase(s, tc);

    tc = tcase_create("flight");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 20);
    tcase_add_test(tc, test_late_joiner_replays_everything);
    tcase_add_test(tc, test_every_waiter_wakes_on_finish);
    tcase_add_test(tc, test_claim_release_hands_back_only_the_blocked);
    tcase_add_test(tc, test_timeout_while_claimed_waits_for_release);
    tcase_add_test(tc, test_take_only_the_readers_behind);
    tcase_add_test(tc, test_helper_writes_for_the_others);
    suite_add_tcase(s, tc);

    tc = tcase_create("policy");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 10);
    tcase_add_test(tc, test_key_separates_fields);
    tcase_add_loop_test(tc, test_sampling_rule, 0,
                        (int)(sizeof(sampling) / sizeof(sampling[0])));
    tcase_add_loop_test(tc, test_opt_out_headers, 0,
                        (int)(sizeof(opt_outs) / sizeof(opt_outs[0])));
    tcase_add_test(tc, test_global_switch);
    tcase_add_test(tc, test_tenants);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    SRunner *sr = srunner_create(coalesce_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
