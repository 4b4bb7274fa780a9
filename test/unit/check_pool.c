/* SPDX-License-Identifier: MIT */
/*
 * check_pool.c - the upstream pool (gateway/fleet/pool.c and its parts,
 * pool_impl.h): the breaker and its half-open trial, late and poison
 * verdicts, max_ejected and panic over a model's set of upstreams, the
 * admission FIFO (granted, timed out, stopped, told at once when
 * hopeless), the retry budget, the balancers, model routing.
 * The queue cases run real threads, so TSan sees the locking.
 */
#include <check.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "buf.h"
#include "base/config.h"
#include "base/tenant.h"
#include "fleet/pool.h"
#include "testutil.h"
#include "util.h"

static struct gw_config cfg;
static struct pool *pool;
static struct tenants *tenants;     /* what the queue reports, per tenant */


/*
 * For the breaker alone: with panic_below at its default, a pool whose
 * one upstream is ejected is in panic and calls go to it anyway (tested
 * in "sets" below; one held back by its Retry-After gets none).
 */
#define NO_PANIC "panic_below = 0%\n"

/*
 * A pool over 'n' upstreams u0.. with [routing] and per-upstream text;
 * the health beat off unless 'routing' sets health_interval (the pool
 * runs no beat: a test plays the probes' part).
 */
static void
make_pool(int n, const char *routing, const char *per)
{
    char text[4096], err[256];
    int len;

    len = snprintf(text, sizeof(text), "[routing]\n%s%s",
                   strstr(routing, "health_interval") != NULL
                   ? "" : "health_interval = 0\n", routing);
    for (int i = 0; i < n; i++)
        len += snprintf(text + len, sizeof(text) - (size_t)len,
                        "[upstream u%d]\nurl = http://127.0.0.1:%d\n%s", i,
                        9000 + i, per);
    ck_assert_msg(config_load_text("t.conf", text, &cfg, err,
                                   sizeof(err)) == 0, "%s", err);
    pool = pool_new(&cfg);
    ck_assert_ptr_nonnull(pool);
    if (tenants == NULL)
        tenants = tenants_new();
    ck_assert_ptr_nonnull(tenants);
}

static void
teardown(void)
{
    pool_free(pool);
    pool = NULL;
    config_release(&cfg);
    tenants_free(tenants);
    tenants = NULL;
}

static int
take(struct pool_slot *s)
{
    struct pool_want w = { .tenant = CONFIG_MAX_TENANTS };
    int ra;

    return pool_acquire(pool, &w, s, &ra);
}

/* Poll (with a deadline) until upstream 0 is in state 'want'. */
static void
wait_state(enum pool_state want)
{
    int64_t end = gw_now_ms() + 5000;

    while (pool_state_of(pool, 0) != want) {
        ck_assert_msg(gw_now_ms() < end, "state %d, want %d",
                      pool_state_of(pool, 0), want);
        poll(NULL, 0, 5);
    }
}

/* The value of the series 'name' (with its labels, if any) in the text
 * 'b' holds, which must have it; 'b' is released. */
static long
value_in(struct buf *b, const char *name)
{
    char want[160];
    long v;

    ck_assert_int_eq(buf_append(b, "", 1), 0);
    snprintf(want, sizeof(want), "%s ", name);
    v = (long)sample(buf_ptr(b), want);
    buf_release(b);
    return v;
}

/* The value of the pool's series 'name' (with its labels, if any). */
static long
pool_metric(const char *name)
{
    struct buf b;

    buf_init(&b, 1 << 20);
    ck_assert_int_eq(pool_render_metrics(pool, &b), 0);
    return value_in(&b, name);
}

/*
 * The value of a tenant's series 'name' (with its labels): tenant.h
 * renders every tenant's number, the queue's too, as the pool reported
 * them (its report of a call entering the queue follows the call into
 * it: wait_tenant_metric()).
 */
static long
tenant_metric(const char *name)
{
    struct buf b;

    buf_init(&b, 1 << 20);
    ck_assert_int_eq(tenants_render_metrics(tenants, &cfg, 0, &b), 0);
    return value_in(&b, name);
}

static void
wait_tenant_metric(const char *name, long n)
{
    for (int64_t end = gw_now_ms() + 5000; tenant_metric(name) != n;
         poll(NULL, 0, 5))
        ck_assert_msg(gw_now_ms() < end, "%s never %ld", name, n);
}

/* Does the pool's /metrics text lack 's' altogether? */
static int
pool_metric_absent(const char *s)
{
    struct buf b;
    int absent;

    buf_init(&b, 1 << 20);
    ck_assert_int_eq(pool_render_metrics(pool, &b), 0);
    ck_assert_int_eq(buf_append(&b, "", 1), 0);
    absent = strstr(buf_ptr(&b), s) == NULL;
    buf_release(&b);
    return absent;
}

/* The value of the series 'name' of upstream 'up'. */
static long
upstream_metric(const char *name, const char *up)
{
    char want[160];

    snprintf(want, sizeof(want), "%s{upstream=\"%s\"}", name, up);
    return pool_metric(want);
}

/* Fail one call on upstream 'idx' (the others excluded). */
static void
fail_on(int idx, enum pool_outcome o)
{
    struct pool_want w = { .no_wait = 1, .tenant = CONFIG_MAX_TENANTS };
    struct pool_slot s;
    int ra;

    w.exclude = ~(UINT64_C(1) << idx);
    ck_assert_int_eq(pool_acquire(pool, &w, &s, &ra), 0);
    ck_assert_int_eq(s.idx, idx);
    pool_give_back(pool, &s, o, 0);
}

/* ---- the breaker ---- */

START_TEST(test_eject_half_open_close)
{
    struct pool_slot s, t;
    int ra;
    struct pool_want w = { .tenant = CONFIG_MAX_TENANTS };

    make_pool(1, "eject_after = 2\neject_time = 1s\n" NO_PANIC, "");
    ck_assert_int_eq(take(&s), 0);
    pool_give_back(pool, &s, POOL_FAIL_CONNECT, 0);
    ck_assert_int_eq(pool_state_of(pool, 0), POOL_CLOSED);
    ck_assert_int_eq(take(&s), 0);
    pool_give_back(pool, &s, POOL_FAIL_TIMEOUT, 0);
    ck_assert_int_eq(pool_state_of(pool, 0), POOL_OPEN);
    ck_assert(!pool_ready(pool));
    ck_assert_int_eq(pool_acquire(pool, &w, &s, &ra), GW_EUNAVAIL);
    ck_assert_int_ge(ra, 1);
    ck_assert_int_eq(pool_metric("infergw_upstream_unavailable_total"), 1);
    /* A retry finding none: not a request answered 503. */
    w.no_wait = 1;
    ck_assert_int_eq(pool_acquire(pool, &w, &s, &ra), GW_EUNAVAIL);
    ck_assert_int_eq(pool_metric("infergw_upstream_unavailable_total"), 1);
    w.no_wait = 0;
    wait_state(POOL_HALF_OPEN);
    ck_assert(pool_ready(pool));
    ck_assert_int_eq(take(&s), 0);          /* the trial */
    ck_assert_uint_ne(s.trial, 0);
    ck_assert_int_eq(take(&t), GW_EUNAVAIL);    /* one trial at a time */
    pool_note_answer(pool, &s);             /* its first body byte */
    ck_assert_int_eq(pool_state_of(pool, 0), POOL_CLOSED);
    ck_assert_int_eq(take(&t), 0);
    pool_give_back(pool, &t, POOL_OK, 0);
    pool_give_back(pool, &s, POOL_OK, 0);
}
END_TEST

START_TEST(test_failed_trial_doubles_eject_time)
{
    struct pool_slot s;
    int64_t t0, first, second;

    make_pool(1, "eject_after = 1\neject_time = 200ms\n", "");
    ck_assert_int_eq(take(&s), 0);
    t0 = gw_now_ms();
    pool_give_back(pool, &s, POOL_FAIL_STATUS, 0);
    wait_state(POOL_HALF_OPEN);
    first = gw_now_ms() - t0;
    ck_assert_int_ge(first, 200);
    ck_assert_int_eq(take(&s), 0);
    t0 = gw_now_ms();
    pool_give_back(pool, &s, POOL_FAIL_BROKEN, 0);     /* the trial fails */
    ck_assert_int_eq(pool_state_of(pool, 0), POOL_OPEN);
    wait_state(POOL_HALF_OPEN);
    second = gw_now_ms() - t0;
    ck_assert_int_ge(second, 400);
}
END_TEST

/*
 * One bound for eject_time and for what it doubles to
 * (CONFIG_MAX_EJECT_MS): the longest eject_time the configuration takes
 * is the longest ejection, however often it repeats.
 */
START_TEST(test_eject_time_doubles_up_to_its_own_bound)
{
    struct pool_upstream_status st;
    struct pool_slot s;

    ck_assert_int_eq(eject_ms(10000, 0), 10000);
    ck_assert_int_eq(eject_ms(10000, 3), 80000);
    ck_assert_int_eq(eject_ms(10000, 16), CONFIG_MAX_EJECT_MS);
    ck_assert_int_eq(eject_ms(CONFIG_MAX_EJECT_MS, 1), CONFIG_MAX_EJECT_MS);
    /* The configuration takes that bound, 5m, and not a millisecond
     * more (check_cfg's table). */
    make_pool(1, "eject_after = 1\neject_time = 5m\n" NO_PANIC, "");
    ck_assert_int_eq(cfg.eject_time_ms, CONFIG_MAX_EJECT_MS);
    ck_assert_int_eq(take(&s), 0);
    pool_give_back(pool, &s, POOL_FAIL_STATUS, 0);
    ck_assert_uint_eq(pool_status(pool, &st, 1), 1);
    ck_assert_int_eq(st.state, POOL_OPEN);
    ck_assert_int_le(st.state_left_ms, CONFIG_MAX_EJECT_MS);
    ck_assert_int_gt(st.state_left_ms, CONFIG_MAX_EJECT_MS - 5000);
}
END_TEST

START_TEST(test_stale_trial_clears_nothing)
{
    struct pool_slot old, d, a, b;

    make_pool(1, "eject_after = 1\neject_time = 500ms\n" NO_PANIC, "");
    ck_assert_int_eq(take(&old), 0);        /* taken while closed */
    ck_assert_int_eq(take(&d), 0);
    pool_give_back(pool, &d, POOL_FAIL_CONNECT, 0);
    wait_state(POOL_HALF_OPEN);
    ck_assert_int_eq(take(&a), 0);          /* trial 1 */
    pool_give_back(pool, &old, POOL_FAIL_CONNECT, 0);  /* ejects again */
    ck_assert_int_eq(pool_state_of(pool, 0), POOL_OPEN);
    wait_state(POOL_HALF_OPEN);
    ck_assert_int_eq(take(&b), 0);          /* trial 2 */
    pool_give_back(pool, &a, POOL_NEUTRAL, 0);    /* trial 1 ends late */
    ck_assert_int_eq(take(&d), GW_EUNAVAIL);    /* trial 2 still out */
    pool_give_back(pool, &b, POOL_OK, 0);
    ck_assert_int_eq(pool_state_of(pool, 0), POOL_CLOSED);
}
END_TEST

START_TEST(test_retry_after_holds_and_counts_once)
{
    struct pool_slot s, t;

    make_pool(1, "eject_after = 2\n" NO_PANIC, "");
    ck_assert_int_eq(take(&s), 0);
    ck_assert_int_eq(take(&t), 0);
    pool_give_back(pool, &s, POOL_FAIL_THROTTLED, 2000);
    ck_assert_int_eq(take(&s), GW_EUNAVAIL);    /* held back */
    ck_assert(!pool_ready(pool));
    /* The second 429 of the same hold is not a second failure. */
    pool_give_back(pool, &t, POOL_FAIL_THROTTLED, 2000);
    ck_assert_int_eq(pool_state_of(pool, 0), POOL_CLOSED);
    while (take(&s) != 0)
        poll(NULL, 0, 10);
    pool_give_back(pool, &s, POOL_OK, 0);
}
END_TEST

START_TEST(test_late_verdict_and_poison)
{
    struct pool_slot s, t;

    make_pool(1, "eject_after = 1\neject_time = 500ms\n" NO_PANIC, "");
    /* Given back without a verdict, then judged poison: counted as a
     * failure, not toward ejection. */
    ck_assert_int_eq(take(&s), 0);
    pool_give_back(pool, &s, POOL_NEUTRAL, 0);
    pool_judge(pool, 0, POOL_FAIL_STATUS, 1);
    ck_assert_int_eq(pool_state_of(pool, 0), POOL_CLOSED);
    ck_assert_int_eq(pool_metric("infergw_upstream_failures_total{upstream="
                                 "\"u0\",kind=\"status\"}"), 1);
    /* Judged the upstream's: as pool_give_back would have. */
    pool_judge(pool, 0, POOL_FAIL_STATUS, 0);
    ck_assert_int_eq(pool_state_of(pool, 0), POOL_OPEN);
    wait_state(POOL_HALF_OPEN);
    /* A trial given back without a verdict is over at once: the next
     * call is a trial too, and a late failure of the first ejects. */
    ck_assert_int_eq(take(&s), 0);
    ck_assert_uint_ne(s.trial, 0);
    pool_give_back(pool, &s, POOL_NEUTRAL, 0);
    ck_assert_int_eq(take(&t), 0);
    ck_assert_uint_ne(t.trial, 0);
    pool_judge(pool, 0, POOL_FAIL_STATUS, 0);
    ck_assert_int_eq(pool_state_of(pool, 0), POOL_OPEN);
    pool_give_back(pool, &t, POOL_OK, 0);
    ck_assert_int_eq(pool_metric("infergw_upstream_poison_requests_total"),
                     0);
    pool_note_poison(pool);
    ck_assert_int_eq(pool_metric("infergw_upstream_poison_requests_total"),
                     1);
    teardown();

    /* A poison verdict between two failures of the upstream's own
     * neither counts nor breaks their run. */
    make_pool(1, "eject_after = 2\n" NO_PANIC, "");
    pool_judge(pool, 0, POOL_FAIL_STATUS, 0);
    pool_judge(pool, 0, POOL_FAIL_STATUS, 1);
    ck_assert_int_eq(pool_state_of(pool, 0), POOL_CLOSED);
    pool_judge(pool, 0, POOL_FAIL_STATUS, 0);
    ck_assert_int_eq(pool_state_of(pool, 0), POOL_OPEN);
}
END_TEST

/* ---- sets: max_ejected and panic ---- */

START_TEST(test_max_ejected_per_model)
{
    char err[256];
    const char *text = "[routing]\nhealth_interval = 0\neject_after = 1\n"
                       "eject_time = 1m\n" NO_PANIC
                       "[upstream a0]\nurl = http://h:1\nmodels = a\n"
                       "[upstream a1]\nurl = http://h:2\nmodels = a\n"
                       "[upstream b0]\nurl = http://h:3\nmodels = b, a\n"
                       "[upstream b1]\nurl = http://h:4\nmodels = b\n"
                       "[upstream b2]\nurl = http://h:5\nmodels = b\n"
                       "[upstream c0]\nurl = http://h:6\nmodels = c\n";

    ck_assert_msg(config_load_text("t", text, &cfg, err, sizeof(err)) == 0,
                  "%s", err);
    pool = pool_new(&cfg);
    ck_assert_ptr_nonnull(pool);
    /* a: a0 a1 b0 (one of 3 may be out); b: b0 b1 b2 (one of 3). */
    fail_on(0, POOL_FAIL_CONNECT);
    ck_assert_int_eq(pool_state_of(pool, 0), POOL_OPEN);
    fail_on(1, POOL_FAIL_CONNECT);          /* a would have 2 of 3 out */
    ck_assert_int_eq(pool_state_of(pool, 1), POOL_CLOSED);
    ck_assert_int_eq(upstream_metric("infergw_upstream_ejections_capped_"
                                     "total", "a1"), 1);
    fail_on(1, POOL_FAIL_CONNECT);          /* asks again, refused again */
    ck_assert_int_eq(upstream_metric("infergw_upstream_ejections_capped_"
                                     "total", "a1"), 2);
    fail_on(2, POOL_FAIL_STATUS);           /* b0 serves a too: no */
    ck_assert_int_eq(pool_state_of(pool, 2), POOL_CLOSED);
    fail_on(3, POOL_FAIL_STATUS);           /* b has none out: yes */
    ck_assert_int_eq(pool_state_of(pool, 3), POOL_OPEN);
    fail_on(4, POOL_FAIL_STATUS);
    ck_assert_int_eq(pool_state_of(pool, 4), POOL_CLOSED);
    fail_on(5, POOL_FAIL_TIMEOUT);          /* c's only one: it may go */
    ck_assert_int_eq(pool_state_of(pool, 5), POOL_OPEN);
    ck_assert_int_eq(upstream_metric("infergw_upstream_ejections_total",
                                     "a1"), 0);
}
END_TEST

START_TEST(test_max_ejected_unlisted_and_share)
{
    /* No models listed and none reported: one set of all four; 50% of
     * 4 is 2, and 100% lets every one go. */
    make_pool(4, "eject_after = 1\neject_time = 1m\n" NO_PANIC, "");
    for (int i = 0; i < 4; i++)
        fail_on(i, POOL_FAIL_CONNECT);
    ck_assert_int_eq(pool_state_of(pool, 0), POOL_OPEN);
    ck_assert_int_eq(pool_state_of(pool, 1), POOL_OPEN);
    ck_assert_int_eq(pool_state_of(pool, 2), POOL_CLOSED);
    ck_assert_int_eq(pool_state_of(pool, 3), POOL_CLOSED);
    teardown();
    make_pool(3, "eject_after = 1\neject_time = 1m\nmax_ejected = 100%\n"
              NO_PANIC, "");
    for (int i = 0; i < 3; i++) {
        fail_on(i, POOL_FAIL_CONNECT);
        ck_assert_int_eq(pool_state_of(pool, (size_t)i), POOL_OPEN);
    }
    ck_assert(!pool_ready(pool));
}
END_TEST

START_TEST(test_panic_routes_across_all)
{
    struct pool_want w = { .tenant = CONFIG_MAX_TENANTS };
    struct pool_slot s, t;
    int ra;

    make_pool(2, "eject_after = 1\neject_time = 1m\nmax_ejected = 100%\n",
              "");
    fail_on(0, POOL_FAIL_CONNECT);
    /* One of two usable: 50% is not below 50%. */
    ck_assert_int_eq(take(&s), 0);
    ck_assert_int_eq(s.idx, 1);
    pool_give_back(pool, &s, POOL_OK, 0);
    ck_assert_int_eq(pool_metric("infergw_upstream_panic"), 0);
    fail_on(1, POOL_FAIL_STATUS);
    ck_assert_int_eq(pool_state_of(pool, 1), POOL_OPEN);
    /* None usable: calls go to both, ejected as they are, and are no
     * trials. */
    ck_assert_int_eq(take(&s), 0);
    ck_assert_uint_eq(s.trial, 0);
    ck_assert_int_eq(s.other, 1);           /* the other, in panic too */
    ck_assert_int_eq(pool_metric("infergw_upstream_panic"), 1);
    w.exclude = UINT64_C(1) << s.idx;
    ck_assert_int_eq(pool_acquire(pool, &w, &t, &ra), 0);
    ck_assert_int_ne(t.idx, s.idx);
    ck_assert_int_eq(t.other, 0);
    ck_assert(pool_has_other(pool, &w, (size_t)t.idx) == 0);
    w.exclude = 0;
    ck_assert(pool_has_other(pool, &w, (size_t)t.idx));
    pool_give_back(pool, &s, POOL_OK, 0);
    pool_give_back(pool, &t, POOL_OK, 0);
    ck_assert_int_eq(pool_state_of(pool, 0), POOL_OPEN);
    ck_assert(!pool_ready(pool));
    ck_assert_int_eq(pool_metric("infergw_upstream_panic"), 1);
    teardown();

    /* 0% turns it off. */
    make_pool(2, "eject_after = 1\neject_time = 1m\nmax_ejected = 100%\n"
              NO_PANIC, "");
    fail_on(0, POOL_FAIL_CONNECT);
    fail_on(1, POOL_FAIL_CONNECT);
    ck_assert_int_eq(take(&s), GW_EUNAVAIL);
    ck_assert_int_eq(pool_metric("infergw_upstream_panic"), 0);
}
END_TEST

START_TEST(test_panic_call_is_no_trial)
{
    struct pool_slot s, t;

    make_pool(1, "eject_after = 1\neject_time = 50ms\n", "");
    fail_on(0, POOL_FAIL_CONNECT);
    wait_state(POOL_HALF_OPEN);
    ck_assert_int_eq(take(&s), 0);          /* the trial */
    ck_assert_uint_ne(s.trial, 0);
    ck_assert_int_eq(take(&t), 0);          /* trial out: none usable */
    ck_assert_uint_eq(t.trial, 0);          /* no second trial */
    pool_give_back(pool, &t, POOL_NEUTRAL, 0);
    ck_assert_int_eq(pool_state_of(pool, 0), POOL_HALF_OPEN);
    pool_give_back(pool, &s, POOL_OK, 0);
    ck_assert_int_eq(pool_state_of(pool, 0), POOL_CLOSED);
}
END_TEST

START_TEST(test_panic_leaves_a_held_upstream_alone)
{
    struct pool_slot s;
    int ra = 0;
    struct pool_want w = { .tenant = CONFIG_MAX_TENANTS };

    /* Held back by its Retry-After, the only upstream takes no call,
     * panic (the default 50%) or not: refused at once, told the time
     * the hold has left. */
    make_pool(1, "eject_after = 100\n", "");
    ck_assert_int_eq(take(&s), 0);
    pool_give_back(pool, &s, POOL_FAIL_THROTTLED, 30000);
    ck_assert(!pool_ready(pool));
    ck_assert_int_eq(pool_acquire(pool, &w, &s, &ra), GW_EUNAVAIL);
    ck_assert_int_ge(ra, 29);
    ck_assert_int_le(ra, 30);
    ck_assert_int_eq(upstream_metric("infergw_upstream_calls_total", "u0"),
                     1);
    ck_assert_int_eq(pool_metric("infergw_upstream_unavailable_total"), 1);
    /* No call went anywhere in panic: nothing to note. */
    ck_assert_int_eq(pool_metric("infergw_upstream_panic"), 0);
    teardown();

    /* Once the hold is over it takes calls again. */
    make_pool(1, "eject_after = 100\n", "");
    ck_assert_int_eq(take(&s), 0);
    pool_give_back(pool, &s, POOL_FAIL_THROTTLED, 200);
    ck_assert_int_eq(take(&s), GW_EUNAVAIL);
    for (int64_t end = gw_now_ms() + 5000; take(&s) != 0; poll(NULL, 0, 10))
        ck_assert_msg(gw_now_ms() < end, "still held back");
    pool_give_back(pool, &s, POOL_OK, 0);
    ck_assert(pool_ready(pool));
}
END_TEST

START_TEST(test_panic_routes_across_ejected_never_across_held)
{
    struct pool_want w = { .tenant = CONFIG_MAX_TENANTS };
    struct pool_slot s;
    int ra = 0;

    /* u0 held back by its Retry-After, u1 ejected: none usable, so the
     * set is in panic, and every call goes to u1, none to u0. */
    make_pool(2, "eject_after = 1\neject_time = 1m\nmax_ejected = 100%\n",
              "");
    w.exclude = UINT64_C(1) << 1;
    ck_assert_int_eq(pool_acquire(pool, &w, &s, &ra), 0);
    ck_assert_int_eq(s.idx, 0);
    pool_give_back(pool, &s, POOL_FAIL_STATUS, 30000);
    ck_assert_int_eq(pool_state_of(pool, 0), POOL_OPEN);
    fail_on(1, POOL_FAIL_CONNECT);
    ck_assert_int_eq(pool_state_of(pool, 1), POOL_OPEN);
    for (int i = 0; i < 8; i++) {
        ck_assert_int_eq(take(&s), 0);
        ck_assert_int_eq(s.idx, 1);
        ck_assert_uint_eq(s.trial, 0);
        pool_give_back(pool, &s, POOL_NEUTRAL, 0);
    }
    ck_assert_int_eq(pool_metric("infergw_upstream_panic"), 1);
    /* A retry from u1 has nowhere to go: u0 is held back, and its
     * ejection (1m) does not lengthen the wait panic would have. */
    w.exclude = UINT64_C(1) << 1;
    ck_assert_int_eq(pool_acquire(pool, &w, &s, &ra), GW_EUNAVAIL);
    ck_assert_int_ge(ra, 29);
    ck_assert_int_le(ra, 30);
    ck_assert(!pool_has_other(pool, &w, 1));
}
END_TEST

/* ---- readiness (/readyz) ---- */

/* The health beat on, for the pool's judgement; nothing runs it. */
#define BEAT_ON "health_interval = 1h\n"

/* One probe of upstream 'idx' with outcome 'o' and answer 'status'. */
static void
probe(size_t idx, enum pool_outcome o, int status)
{
    uint64_t trial;

    ck_assert(pool_probe_begin(pool, idx, &trial));
    pool_probe_end(pool, idx, trial, o, status);
}

/* Upstream 'idx' as the status view sees it. */
static struct pool_upstream_status
status_of(size_t idx)
{
    struct pool_upstream_status v[4];

    ck_assert_uint_gt(pool_status(pool, v, 4), idx);
    return v[idx];
}

START_TEST(test_ready_from_a_passing_probe_to_a_failed_one)
{
    struct pool_slot s;

    make_pool(1, BEAT_ON NO_PANIC, "");
    /* Not probed yet: no call is known to go anywhere. */
    ck_assert(!pool_ready(pool));
    ck_assert_int_eq(status_of(0).probe, POOL_PROBE_PENDING);
    ck_assert(!status_of(0).ready);
    probe(0, POOL_OK, 200);
    ck_assert(pool_ready(pool));
    ck_assert(status_of(0).ready);
    /* One failed probe is enough, three (eject_after) are not needed. */
    probe(0, POOL_FAIL_STATUS, 503);
    ck_assert_int_eq(pool_state_of(pool, 0), POOL_CLOSED);
    ck_assert(!pool_ready(pool));
    ck_assert_int_eq(status_of(0).probe, POOL_PROBE_FAILED);
    /* A call's answer is no probe's. */
    ck_assert_int_eq(take(&s), 0);
    pool_give_back(pool, &s, POOL_OK, 0);
    ck_assert(!pool_ready(pool));
    /* A probe stopped before any answer says nothing. */
    probe(0, POOL_NEUTRAL, 0);
    ck_assert(!pool_ready(pool));
    /* A server without /health answers all the same. */
    probe(0, POOL_NEUTRAL, 404);
    ck_assert(pool_ready(pool));
    ck_assert_int_eq(status_of(0).probe, POOL_PROBE_PASSED);
    probe(0, POOL_FAIL_CONNECT, 0);
    ck_assert(!pool_ready(pool));
    probe(0, POOL_OK, 200);
    ck_assert(pool_ready(pool));
}
END_TEST

START_TEST(test_half_open_needs_a_passing_probe)
{
    make_pool(1, BEAT_ON NO_PANIC "eject_after = 1\neject_time = 100ms\n",
              "");
    probe(0, POOL_OK, 200);
    probe(0, POOL_FAIL_CONNECT, 0);
    ck_assert_int_eq(pool_state_of(pool, 0), POOL_OPEN);
    wait_state(POOL_HALF_OPEN);
    /* Its time is up, but the last word on it is still the failure. */
    ck_assert(!pool_ready(pool));
    ck_assert(!status_of(0).ready);
    probe(0, POOL_OK, 200);                 /* the trial */
    ck_assert_int_eq(pool_state_of(pool, 0), POOL_CLOSED);
    ck_assert(pool_ready(pool));
}
END_TEST

START_TEST(test_ejected_is_not_ready_though_its_probe_passes)
{
    struct pool_slot s;

    make_pool(1, BEAT_ON NO_PANIC "eject_after = 1\neject_time = 100ms\n",
              "");
    probe(0, POOL_OK, 200);
    ck_assert_int_eq(take(&s), 0);
    pool_give_back(pool, &s, POOL_FAIL_STATUS, 0);
    ck_assert_int_eq(pool_state_of(pool, 0), POOL_OPEN);
    probe(0, POOL_OK, 200);                 /* while ejected */
    ck_assert_int_eq(pool_state_of(pool, 0), POOL_OPEN);
    ck_assert(!pool_ready(pool));
    wait_state(POOL_HALF_OPEN);
    ck_assert(pool_ready(pool));            /* it may take the trial */
    ck_assert_int_eq(take(&s), 0);
    pool_give_back(pool, &s, POOL_OK, 0);
    ck_assert_int_eq(pool_state_of(pool, 0), POOL_CLOSED);
}
END_TEST

START_TEST(test_held_is_not_ready_though_its_probe_passes)
{
    struct pool_slot s;

    /* Held back by Retry-After (and not ejected): no call goes there
     * until the hold is over. */
    make_pool(1, BEAT_ON NO_PANIC "eject_after = 100\n", "");
    probe(0, POOL_OK, 200);
    ck_assert(pool_ready(pool));
    ck_assert_int_eq(take(&s), 0);
    pool_give_back(pool, &s, POOL_FAIL_THROTTLED, 300);
    ck_assert(!pool_ready(pool));
    ck_assert_int_eq(pool_state_of(pool, 0), POOL_CLOSED);
    ck_assert_int_gt(status_of(0).held_left_ms, 0);
    ck_assert(!status_of(0).ready);
    for (int64_t end = gw_now_ms() + 5000; !pool_ready(pool);
         poll(NULL, 0, 10))
        ck_assert_msg(gw_now_ms() < end, "still held back");
}
END_TEST

START_TEST(test_beat_off_ready_until_ejected)
{
    /* Nothing will ever probe it: the breaker alone decides. */
    make_pool(2, "eject_after = 1\neject_time = 5m\nmax_ejected = 100%\n"
              NO_PANIC, "");
    ck_assert(pool_ready(pool));
    ck_assert(status_of(0).ready && status_of(1).ready);
    fail_on(0, POOL_FAIL_CONNECT);
    ck_assert(pool_ready(pool));            /* u1 can */
    ck_assert(!status_of(0).ready && status_of(1).ready);
    fail_on(1, POOL_FAIL_CONNECT);
    ck_assert(!pool_ready(pool));
}
END_TEST

#define URL "url = http://127.0.0.1:"

START_TEST(test_any_upstream_of_any_model_makes_it_ready)
{
    char err[256];

    /* /readyz is the gateway's, not a model's: b's upstream is enough,
     * though no call for a could go anywhere. */
    ck_assert_msg(config_load_text("t.conf", "[routing]\n" BEAT_ON NO_PANIC
                                   "[upstream ua]\n" URL "9000\nmodels = a\n"
                                   "[upstream ub]\n" URL "9001\nmodels = b\n",
                                   &cfg, err, sizeof(err)) == 0, "%s", err);
    pool = pool_new(&cfg);
    ck_assert_ptr_nonnull(pool);
    ck_assert(!pool_ready(pool));
    probe(1, POOL_OK, 200);
    ck_assert(pool_ready(pool));
    ck_assert(!status_of(0).ready && status_of(1).ready);
    probe(1, POOL_FAIL_TIMEOUT, 0);
    ck_assert(!pool_ready(pool));
}
END_TEST

START_TEST(test_a_reload_carries_the_probe_verdicts)
{
    struct gw_config cfg2;
    struct pool *next;
    struct pool_upstream_status v[4];
    char err[256];

    make_pool(3, BEAT_ON, "");
    probe(0, POOL_OK, 200);
    probe(1, POOL_FAIL_CONNECT, 0);
    probe(2, POOL_OK, 200);
    /* u0 as it was, u1 too, u2 elsewhere now, u3 new. */
    ck_assert_msg(config_load_text("t2.conf", "[routing]\n" BEAT_ON
                                   "[upstream u1]\n" URL "9001\n"
                                   "[upstream u0]\n" URL "9000\n"
                                   "[upstream u2]\n" URL "9999\n"
                                   "[upstream u3]\n" URL "9003\n",
                                   &cfg2, err, sizeof(err)) == 0, "%s", err);
    next = pool_new(&cfg2);
    ck_assert_ptr_nonnull(next);
    pool_carry_probes(next, pool);
    ck_assert_uint_eq(pool_status(next, v, 4), 4);
    ck_assert_int_eq(v[0].probe, POOL_PROBE_FAILED);    /* u1 */
    ck_assert_int_eq(v[1].probe, POOL_PROBE_PASSED);    /* u0 */
    ck_assert(v[1].ready);
    ck_assert_int_eq(v[2].probe, POOL_PROBE_PENDING);   /* u2 moved */
    ck_assert_int_eq(v[3].probe, POOL_PROBE_PENDING);   /* u3 */
    ck_assert(pool_ready(next));
    pool_free(next);
    config_release(&cfg2);
}
END_TEST

/* ---- admission ---- */

struct waiter_arg {
    int rc;
    struct pool_slot slot;
    int ra;                     /* its Retry-After */
    int gone;                   /* its client has left (want.gone) */
};

static int
waiter_gone(void *arg)
{
    const struct waiter_arg *a = arg;

    return __atomic_load_n(&a->gone, __ATOMIC_ACQUIRE);
}

/* A call of the default tenant, reported to 'tenants', on its own
 * thread. */
static void *
waiter(void *arg)
{
    struct waiter_arg *a = arg;
    struct pool_want w = { .tenant = CONFIG_MAX_TENANTS,
                           .tenants = tenants, .gone = waiter_gone,
                           .gone_arg = a };

    a->rc = pool_acquire(pool, &w, &a->slot, &a->ra);
    return NULL;
}

/* However its wait ended, a call that waited is one wait of its tenant
 * and no longer one that waits now (tenant.h's gauge). */
static void
assert_one_wait_over(void)
{
    ck_assert_int_eq(tenant_metric("infergw_tenant_queue_waits_total"
                                   "{tenant=\"default\",priority=\"0\"}"),
                     1);
    ck_assert_int_eq(tenant_metric("infergw_tenant_queued"
                                   "{tenant=\"default\",priority=\"0\"}"),
                     0);
}

/* Poll until the pool says 'n' calls wait (for u0: these tests' pools
 * have that one upstream). */
static void
wait_queued(int n)
{
    char want[64];
    int64_t end = gw_now_ms() + 5000;
    struct buf b;

    snprintf(want, sizeof(want), "\ninfergw_upstream_queued"
             "{upstream=\"u0\"} %d\n", n);
    for (;;) {
        buf_init(&b, 1 << 20);
        ck_assert_int_eq(pool_render_metrics(pool, &b), 0);
        ck_assert_int_eq(buf_append(&b, "", 1), 0);
        if (strstr(buf_ptr(&b), want) != NULL) {
            buf_release(&b);
            return;
        }
        buf_release(&b);
        ck_assert_msg(gw_now_ms() < end, "never %d queued", n);
        poll(NULL, 0, 5);
    }
}

/* A waiter for 'model' (NULL: any), on its own thread. */
struct model_waiter {
    const char *model;
    int rc;
    struct pool_slot slot;
};

static void *
model_waiter(void *arg)
{
    struct model_waiter *a = arg;
    struct pool_want w = { .model = a->model,
                           .tenant = CONFIG_MAX_TENANTS };
    int ra;

    a->rc = pool_acquire(pool, &w, &a->slot, &ra);
    return NULL;
}

/* Poll until upstream 'up''s queued gauge is 'n'. */
static void
wait_upstream_queued(const char *up, long n)
{
    for (int64_t end = gw_now_ms() + 5000;
         upstream_metric("infergw_upstream_queued", up) != n;
         poll(NULL, 0, 5))
        ck_assert_msg(gw_now_ms() < end, "%s never had %ld queued", up, n);
}

/*
 * infergw_upstream_queued{upstream}: a waiter counts under each upstream
 * that may take it: a call for a model two serve under both, one for a
 * model one serves under that one alone.
 */
START_TEST(test_queued_per_upstream)
{
    char err[256];
    const char *text = "[routing]\nhealth_interval = 0\nqueue_timeout = 5s\n"
                       "[upstream a]\nurl = http://h:1\nmodels = alpha, both\n"
                       "max_inflight = 1\n"
                       "[upstream b]\nurl = http://h:2\nmodels = both\n"
                       "max_inflight = 1\n";
    struct model_waiter hold_a = { "alpha", -1, { -1, 0, 0, 0, 0 } };
    struct model_waiter hold_b = { "both", -1, { -1, 0, 0, 0, 0 } };
    struct model_waiter w1 = { "both", -1, { -1, 0, 0, 0, 0 } };
    struct model_waiter w2 = { "alpha", -1, { -1, 0, 0, 0, 0 } };
    pthread_t t1, t2;

    ck_assert_int_eq(config_load_text("t", text, &cfg, err, sizeof(err)), 0);
    pool = pool_new(&cfg);
    ck_assert_ptr_nonnull(pool);
    model_waiter(&hold_a);
    model_waiter(&hold_b);
    ck_assert_int_eq(hold_a.rc, 0);
    ck_assert_int_eq(hold_b.rc, 0);
    ck_assert_int_eq(hold_a.slot.idx, 0);
    ck_assert_int_eq(hold_b.slot.idx, 1);
    ck_assert_int_eq(upstream_metric("infergw_upstream_queued", "a"), 0);
    ck_assert_int_eq(pthread_create(&t1, NULL, model_waiter, &w1), 0);
    wait_upstream_queued("a", 1);
    wait_upstream_queued("b", 1);
    ck_assert_int_eq(pthread_create(&t2, NULL, model_waiter, &w2), 0);
    wait_upstream_queued("a", 2);
    ck_assert_int_eq(upstream_metric("infergw_upstream_queued", "b"), 1);
    /* b's slot goes to the one waiter b may take. */
    pool_give_back(pool, &hold_b.slot, POOL_OK, 0);
    pthread_join(t1, NULL);
    ck_assert_int_eq(w1.rc, 0);
    ck_assert_int_eq(w1.slot.idx, 1);
    wait_upstream_queued("a", 1);
    ck_assert_int_eq(upstream_metric("infergw_upstream_queued", "b"), 0);
    pool_give_back(pool, &hold_a.slot, POOL_OK, 0);
    pthread_join(t2, NULL);
    ck_assert_int_eq(w2.rc, 0);
    ck_assert_int_eq(upstream_metric("infergw_upstream_queued", "a"), 0);
    pool_give_back(pool, &w1.slot, POOL_OK, 0);
    pool_give_back(pool, &w2.slot, POOL_OK, 0);
}
END_TEST

START_TEST(test_queue_granted_in_order)
{
    struct waiter_arg a = { 1, { -1, 0, 0, 0, 0 }, 0, 0 };
    struct waiter_arg b = { 1, { -1, 0, 0, 0, 0 }, 0, 0 };
    struct pool_slot s;
    pthread_t ta, tb;

    make_pool(1, "queue_timeout = 5s\n", "max_inflight = 1\n");
    ck_assert_int_eq(take(&s), 0);
    ck_assert_int_eq(pthread_create(&ta, NULL, waiter, &a), 0);
    wait_queued(1);
    ck_assert_int_eq(pthread_create(&tb, NULL, waiter, &b), 0);
    wait_queued(2);
    pool_give_back(pool, &s, POOL_OK, 0);     /* to the first in line */
    pthread_join(ta, NULL);
    ck_assert_int_eq(a.rc, 0);
    ck_assert(a.slot.queued);
    wait_queued(1);
    pool_give_back(pool, &a.slot, POOL_OK, 0);
    pthread_join(tb, NULL);
    ck_assert_int_eq(b.rc, 0);
    pool_give_back(pool, &b.slot, POOL_OK, 0);
}
END_TEST

/*
 * pool_acquire answers, with the slot, what pool_has_other() would: is
 * there an upstream a retry could go to at once?  Not one that is full,
 * nor one the call excludes; for a waiter, asked as it is granted.
 */
START_TEST(test_acquire_says_whether_a_retry_could_go_elsewhere)
{
    struct pool_want w = { .tenant = CONFIG_MAX_TENANTS };
    struct waiter_arg c = { 1, { -1, 0, 0, 0, 0 }, 0, 0 };
    struct pool_slot a, b;
    pthread_t tc;
    int ra;

    make_pool(2, "queue_timeout = 5s\n", "max_inflight = 1\n");
    w.exclude = UINT64_C(1) << 1;
    ck_assert_int_eq(pool_acquire(pool, &w, &a, &ra), 0);
    ck_assert_int_eq(a.idx, 0);
    ck_assert_int_eq(a.other, 0);           /* u1 excluded */
    pool_give_back(pool, &a, POOL_OK, 0);
    ck_assert_int_eq(take(&a), 0);
    ck_assert_int_eq(a.other, 1);           /* the other has room */
    ck_assert_int_eq(take(&b), 0);
    ck_assert_int_eq(b.other, 0);           /* the other is full */
    ck_assert_int_eq(pthread_create(&tc, NULL, waiter, &c), 0);
    wait_queued(1);
    pool_give_back(pool, &a, POOL_OK, 0);
    pthread_join(tc, NULL);
    ck_assert_int_eq(c.rc, 0);
    ck_assert(c.slot.queued);
    ck_assert_int_eq(c.slot.other, 0);      /* b still holds the other */
    pool_give_back(pool, &b, POOL_OK, 0);
    pool_give_back(pool, &c.slot, POOL_OK, 0);
}
END_TEST

START_TEST(test_queue_timeout_and_no_wait)
{
    struct pool_want w = { .no_wait = 1, .tenant = CONFIG_MAX_TENANTS };
    struct pool_want tw = { .tenant = CONFIG_MAX_TENANTS };
    struct pool_slot s, t;
    int64_t t0;
    int ra;

    make_pool(1, "queue_timeout = 100ms\n", "max_inflight = 1\n");
    tw.tenants = tenants;
    ck_assert_int_eq(take(&s), 0);
    ck_assert_int_eq(pool_acquire(pool, &w, &t, &ra), GW_EUNAVAIL);
    t0 = gw_now_ms();
    ck_assert_int_eq(take(&t), GW_ETIMEDOUT);
    ck_assert_int_ge(gw_now_ms() - t0, 100);
    /* The same for a tenant's call: what became of it is reported
     * (tenant.h); the retry (no_wait) was no wait. */
    ck_assert_int_eq(pool_acquire(pool, &tw, &t, &ra), GW_ETIMEDOUT);
    ck_assert_int_eq(tenant_metric("infergw_tenant_queue_timeouts_total"
                                   "{tenant=\"default\",priority=\"0\"}"),
                     1);
    assert_one_wait_over();
    pool_give_back(pool, &s, POOL_OK, 0);
}
END_TEST

/*
 * A pool of one upstream with max_inflight = 1 ('pool_text' its
 * [routing]), its slot taken (OUT *s), and a waiter (*a, on thread *ta)
 * queued behind it.
 */
static void
queue_behind(const char *pool_text, struct pool_slot *s,
             struct waiter_arg *a, pthread_t *ta)
{
    make_pool(1, pool_text, "max_inflight = 1\n");
    ck_assert_int_eq(take(s), 0);
    a->rc = 1;
    ck_assert_int_eq(pthread_create(ta, NULL, waiter, a), 0);
    wait_queued(1);
}

START_TEST(test_queue_stop_and_hopeless)
{
    struct waiter_arg a = { 1, { -1, 0, 0, 0, 0 }, 0, 0 };
    struct pool_slot s;
    pthread_t ta;

    /* Every upstream it could use is ejected: told at once. */
    queue_behind("queue_timeout = 10s\neject_after = 1\neject_time = 1m\n"
                 NO_PANIC, &s, &a, &ta);
    pool_give_back(pool, &s, POOL_FAIL_CONNECT, 0);
    pthread_join(ta, NULL);
    ck_assert_int_eq(a.rc, GW_EUNAVAIL);
    assert_one_wait_over();
    teardown();

    /* Held back by its Retry-After while a call waits for it: in panic
     * too (the default), the waiter is told at once, with the hold's
     * time left. */
    queue_behind("queue_timeout = 10s\neject_after = 100\n", &s, &a, &ta);
    pool_give_back(pool, &s, POOL_FAIL_STATUS, 30000);
    pthread_join(ta, NULL);
    ck_assert_int_eq(a.rc, GW_EUNAVAIL);
    ck_assert_int_ge(a.ra, 29);
    ck_assert_int_le(a.ra, 30);
    ck_assert_int_eq(upstream_metric("infergw_upstream_calls_total", "u0"),
                     1);
    assert_one_wait_over();
    teardown();

    /* Its client leaves while it waits: no slot. */
    queue_behind("queue_timeout = 10s\n", &s, &a, &ta);
    __atomic_store_n(&a.gone, 1, __ATOMIC_RELEASE);
    pthread_join(ta, NULL);
    a.gone = 0;
    ck_assert_int_eq(a.rc, GW_EABORTED);
    assert_one_wait_over();
    pool_give_back(pool, &s, POOL_OK, 0);
    teardown();

    /* The stop ends the wait. */
    queue_behind("queue_timeout = 10s\n", &s, &a, &ta);
    pool_stop(pool);
    pthread_join(ta, NULL);
    ck_assert_int_eq(a.rc, GW_ESTOPPING);
    assert_one_wait_over();
    pool_give_back(pool, &s, POOL_OK, 0);
}
END_TEST

START_TEST(test_panic_grants_a_waiter_an_ejected_slot)
{
    struct waiter_arg a = { 1, { -1, 0, 0, 0, 0 }, 0, 0 };
    struct pool_slot s;
    pthread_t ta;

    /* Its one upstream full, a call waits; the upstream is ejected
     * meanwhile: in panic the waiter still gets the freed slot. */
    queue_behind("queue_timeout = 10s\neject_after = 1\neject_time = 1m\n", &s, &a, &ta);
    pool_give_back(pool, &s, POOL_FAIL_CONNECT, 0);
    pthread_join(ta, NULL);
    ck_assert_int_eq(a.rc, 0);
    ck_assert_int_eq(a.slot.idx, 0);
    ck_assert_int_eq(pool_state_of(pool, 0), POOL_OPEN);
    pool_give_back(pool, &a.slot, POOL_OK, 0);
}
END_TEST

/* ---- the budget ---- */

START_TEST(test_budget_share_and_minimum)
{
    struct pool_upstream_status st[2];
    struct pool_slot s;
    int i, n = 0;

    make_pool(2, "retry_budget = 20%\nretry_budget_min = 3\n", "");
    ck_assert_int_eq(take(&s), 0);
    for (i = 0; i < 10; i++)
        pool_note_request(pool);
    while (pool_budget_take(pool, &s, 0))
        n++;
    ck_assert_int_eq(n, 3);                 /* max(3, 20% of 10) */
    ck_assert(!pool_budget_peek(pool));
    for (i = 0; i < 20; i++)
        pool_note_request(pool);
    while (pool_budget_take(pool, &s, 1))
        n++;
    ck_assert_int_eq(n, 6);                 /* 20% of 30 */
    /* Each went to the slot's upstream, for the status view. */
    pool_note_hedge_won(pool, &s);
    ck_assert_uint_eq(pool_status(pool, st, 2), 2);
    ck_assert_uint_eq(st[s.idx].retries, 3);
    ck_assert_uint_eq(st[s.idx].hedges, 3);
    ck_assert_uint_eq(st[s.idx].hedges_won, 1);
    ck_assert_uint_eq(st[1 - s.idx].retries + st[1 - s.idx].hedges, 0);
    pool_give_back(pool, &s, POOL_OK, 0);
}
END_TEST

/* ---- balancing and models ---- */

START_TEST(test_round_robin_weights)
{
    struct pool_slot s;
    int count[2] = { 0, 0 };

    char err[256];
    const char *text = "[routing]\nbalance = round_robin\n"
                       "health_interval = 0\n"
                       "[upstream u0]\nurl = http://h:1\nweight = 3\n"
                       "[upstream u1]\nurl = http://h:2\n";

    ck_assert_int_eq(config_load_text("t", text, &cfg, err, sizeof(err)), 0);
    pool = pool_new(&cfg);
    for (int i = 0; i < 40; i++) {
        ck_assert_int_eq(take(&s), 0);
        count[s.idx]++;
        pool_give_back(pool, &s, POOL_OK, 0);
    }
    ck_assert_int_eq(count[0], 30);
    ck_assert_int_eq(count[1], 10);
}
END_TEST

START_TEST(test_prefix_sticks_and_bounds)
{
    struct pool_want w = { .prefix_hash = UINT64_C(0x1234567890abcdef),
                           .tenant = CONFIG_MAX_TENANTS };
    struct pool_slot s[12];
    int count[3] = { 0, 0, 0 }, first, ra;

    make_pool(3, "balance = prefix\nprefix_epsilon = 0.25\n", "");
    ck_assert_int_eq(pool_acquire(pool, &w, &s[0], &ra), 0);
    first = s[0].idx;
    pool_give_back(pool, &s[0], POOL_OK, 0);
    for (int i = 0; i < 5; i++) {           /* idle: always the same one */
        ck_assert_int_eq(pool_acquire(pool, &w, &s[0], &ra), 0);
        ck_assert_int_eq(s[0].idx, first);
        pool_give_back(pool, &s[0], POOL_OK, 0);
    }
    for (int i = 0; i < 12; i++) {          /* loaded: spills, bounded */
        ck_assert_int_eq(pool_acquire(pool, &w, &s[i], &ra), 0);
        count[s[i].idx]++;
    }
    for (int i = 0; i < 3; i++)
        ck_assert_int_le(count[i], 5);      /* ceil(1.25 x 12 / 3) */
    ck_assert_int_ge(count[first], 4);
    for (int i = 0; i < 12; i++)
        pool_give_back(pool, &s[i], POOL_OK, 0);
}
END_TEST

START_TEST(test_models_route)
{
    char err[256];
    char **ids = gw_calloc(1, sizeof(*ids));
    char **texts = gw_calloc(1, sizeof(*texts));
    struct pool_want w = { .model = "beta", .tenant = CONFIG_MAX_TENANTS };
    struct pool_slot s;
    struct buf b;
    int ra;
    const char *text = "[routing]\nhealth_interval = 0\n"
                       "[upstream a]\nurl = http://h:1\nmodels = alpha\n"
                       "[upstream b]\nurl = http://h:2\n";

    ck_assert_int_eq(config_load_text("t", text, &cfg, err, sizeof(err)), 0);
    pool = pool_new(&cfg);
    /* b has not answered yet: it may take any model. */
    ck_assert(pool_serves(pool, "anything", NULL));
    ids[0] = gw_strdup("beta");
    texts[0] = gw_strdup("{\"id\":\"beta\",\"object\":\"model\"}");
    pool_set_models(pool, 1, ids, NULL, texts, 1);
    ck_assert(!pool_serves(pool, "anything", NULL));
    ck_assert(pool_serves(pool, "alpha", NULL)
              && pool_serves(pool, "beta", NULL));
    ck_assert_int_eq(pool_acquire(pool, &w, &s, &ra), 0);
    ck_assert_int_eq(s.idx, 1);
    pool_give_back(pool, &s, POOL_OK, 0);
    w.exclude = 2;
    ck_assert_int_eq(pool_acquire(pool, &w, &s, &ra), GW_ENOTFOUND);
    buf_init(&b, 1 << 16);
    ck_assert_int_eq(pool_models_json(pool, &b), 0);
    ck_assert_int_eq(buf_append(&b, "", 1), 0);
    ck_assert_str_eq(buf_ptr(&b), "{\"object\":\"list\",\"data\":["
                     "{\"id\":\"alpha\",\"object\":\"model\",\"created\":0,"
                     "\"owned_by\":\"a\"},"
                     "{\"id\":\"beta\",\"object\":\"model\"}]}");
    buf_release(&b);
}
END_TEST

/* Upstream idx reported serving 'model' alone (GET /v1/models). */
static void
set_model(size_t idx, const char *model)
{
    char **ids = gw_calloc(1, sizeof(*ids));
    char **texts = gw_calloc(1, sizeof(*texts));

    ck_assert(ids != NULL && texts != NULL);
    ids[0] = gw_strdup(model);
    texts[0] = gw_strdup("{}");
    pool_set_models(pool, idx, ids, NULL, texts, 1);
}

/*
 * One admission per request (pool_admission): pool_serves() computes
 * the model's set, and pool_acquire() takes it as it is while no
 * upstream's models changed (no second computation), and computes it
 * again once they did, so the slot is the one it would have been.
 */
START_TEST(test_admission_holds_until_the_models_change)
{
    struct pool_admission adm, other;
    struct pool_want w = { .model = "m", .tenant = CONFIG_MAX_TENANTS };
    struct pool_slot s;
    uint64_t before;
    struct pool *second;
    int ra;

    make_pool(2, "", "");
    set_model(0, "m");
    set_model(1, "n");
    ck_assert(pool_serves(pool, "m", &adm));
    ck_assert_uint_eq(adm.set, 1);
    w.admission = &adm;
    before = pool_sets_computed();
    ck_assert_int_eq(pool_acquire(pool, &w, &s, &ra), 0);
    ck_assert_uint_eq(pool_sets_computed(), before);   /* none again */
    ck_assert_int_eq(s.idx, 0);
    pool_give_back(pool, &s, POOL_OK, 0);
    /* Now upstream 0 serves "n" and 1 serves "m": the admission made
     * before no longer holds. */
    set_model(0, "n");
    set_model(1, "m");
    before = pool_sets_computed();
    ck_assert_int_eq(pool_acquire(pool, &w, &s, &ra), 0);
    ck_assert_uint_eq(pool_sets_computed(), before + 1);
    ck_assert_int_eq(s.idx, 1);
    pool_give_back(pool, &s, POOL_OK, 0);
    /* Nor does another pool's (a generation's pool is its own). */
    second = pool_new(&cfg);
    ck_assert_ptr_nonnull(second);
    ck_assert(pool_serves(second, "m", &other));   /* not asked: any */
    ck_assert_uint_eq(other.set, 3);
    w.admission = &other;
    ck_assert_int_eq(pool_acquire(pool, &w, &s, &ra), 0);
    ck_assert_int_eq(s.idx, 1);
    pool_give_back(pool, &s, POOL_OK, 0);
    pool_free(second);
}
END_TEST

/* Upstream 0's models change, over and over, from another thread. */
static void *
models_churn(void *arg)
{
    const int *stop = arg;

    for (unsigned i = 0; !__atomic_load_n(stop, __ATOMIC_ACQUIRE); i++)
        set_model(0, i % 2 ? "m" : "n");
    return NULL;
}

/*
 * The models have a lock of their own (pool_impl.h): pool_serves()
 * reads them under it alone while the health beat's pool_set_models()
 * writes them under both.  Admissions going on meanwhile see a set that
 * was true at some moment: "m" is served by upstream 1 throughout, by 0
 * at times, never by nothing (under TSan: no race).
 */
START_TEST(test_models_change_under_admissions)
{
    struct pool_admission adm;
    struct pool_want w = { .model = "m", .tenant = CONFIG_MAX_TENANTS };
    struct pool_slot s;
    pthread_t t;
    int stop = 0, ra;

    make_pool(2, "", "");
    set_model(1, "m");
    ck_assert_int_eq(pthread_create(&t, NULL, models_churn, &stop), 0);
    for (int i = 0; i < 2000; i++) {
        ck_assert(pool_serves(pool, "m", &adm));
        ck_assert(adm.set == 2 || adm.set == 3);
        w.admission = &adm;
        ck_assert_int_eq(pool_acquire(pool, &w, &s, &ra), 0);
        ck_assert(s.idx == 0 || s.idx == 1);
        pool_give_back(pool, &s, POOL_OK, 0);
    }
    __atomic_store_n(&stop, 1, __ATOMIC_RELEASE);
    pthread_join(t, NULL);
}
END_TEST

/* ---- the engines' load (engine.h) ---- */

/* Upstream idx's engine reports 'waiting' queued and 'running'. */
static void
report(size_t idx, double waiting, double running, double kv)
{
    const struct engine_report r = { waiting, running, kv };
    const struct engine_mark sent = pool_load_mark(pool, idx);

    pool_set_load(pool, idx, &r, &sent);
}

/* Two reads in a row that show the batch full with a queue: the room
 * is known from then on (engine.h). */
static void
report_full(size_t idx, double waiting, double running, double kv)
{
    report(idx, waiting, running, kv);
    report(idx, waiting, running, kv);
}

/* Hold n calls (default tenant); count those that went to each of 2. */
static void
hold(struct pool_slot *s, int n, int got[2])
{
    got[0] = got[1] = 0;
    for (int i = 0; i < n; i++) {
        ck_assert_int_eq(take(&s[i]), 0);
        got[s[i].idx]++;
    }
}

static void
release_all(struct pool_slot *s, int n)
{
    for (int i = 0; i < n; i++)
        pool_give_back(pool, &s[i], POOL_OK, 0);
}

START_TEST(test_least_load_reads_the_engines)
{
    struct pool_slot s[16];
    int got[2];

    make_pool(2, "max_waiting = 1000\n", "");
    /* u0's engine is loaded from elsewhere: 10 waiting, 8 running. */
    report(0, 10, 8, 0.5);
    report(1, 0, 2, 0.1);
    hold(s, 16, got);
    /* u1 scores 2 + started; u0 48: all 16 go to u1. */
    ck_assert_int_eq(got[1], 16);
    release_all(s, 16);
    ck_assert_int_eq(upstream_metric("infergw_upstream_engine_running",
                                     "u0"), 8);
}
END_TEST

/*
 * balance = prefix bounds the load with the engines' own numbers: the
 * prefix's upstream, loaded from elsewhere, is past (1 + epsilon) times
 * the mean, so the call spills to the next on the ring.
 */
START_TEST(test_prefix_bounds_on_the_engines_load)
{
    struct pool_want w = { .prefix_hash = UINT64_C(0x1234567890abcdef),
                           .tenant = CONFIG_MAX_TENANTS };
    struct pool_slot s;
    int first, ra;

    make_pool(3, "balance = prefix\nprefix_epsilon = 0.25\n"
              "max_waiting = 1000\n", "");
    for (size_t i = 0; i < 3; i++)
        report(i, 0, 0, 0.1);
    ck_assert_int_eq(pool_acquire(pool, &w, &s, &ra), 0);
    first = s.idx;
    pool_give_back(pool, &s, POOL_OK, 0);
    report((size_t)first, 0, 0, 0.1);
    ck_assert_int_eq(pool_acquire(pool, &w, &s, &ra), 0);
    ck_assert_int_eq(s.idx, first);         /* idle: it sticks */
    pool_give_back(pool, &s, POOL_OK, 0);
    /* 10 running from another client: bound 1.25 x (10 + 1) / 3. */
    report((size_t)first, 0, 10, 0.1);
    for (int i = 0; i < 5; i++) {
        ck_assert_int_eq(pool_acquire(pool, &w, &s, &ra), 0);
        ck_assert_int_ne(s.idx, first);
        pool_give_back(pool, &s, POOL_OK, 0);
    }
}
END_TEST

START_TEST(test_least_load_without_metrics_is_least_inflight)
{
    struct pool_slot s[8];
    int got[2];

    make_pool(2, "load_stale = 500ms\n", "");
    hold(s, 8, got);
    ck_assert_int_eq(got[0], 4);        /* never scraped: open calls */
    ck_assert_int_eq(got[1], 4);
    release_all(s, 8);
    /* A report, then no other: once stale, open calls again. */
    report(0, 0, 100, 0);
    hold(s, 4, got);
    ck_assert_int_eq(got[1], 4);
    release_all(s, 4);
    poll(NULL, 0, 600);                 /* past load_stale, on purpose */
    hold(s, 8, got);
    ck_assert_int_eq(got[0], 4);
    release_all(s, 8);
    /* A failed scrape forgets at once. */
    report(0, 0, 100, 0);
    pool_set_load(pool, 0, NULL, NULL);
    hold(s, 8, got);
    ck_assert_int_eq(got[0], 4);
    release_all(s, 8);
}
END_TEST

/*
 * A scrape's answer tells the engine's state when the engine read it,
 * after it was sent: a call that ended in between is not in it or is,
 * and either way the answer must not bring it back to life.
 */
START_TEST(test_a_report_counts_from_when_it_was_sent)
{
    const struct engine_report r = { 0, 1, 0 };
    struct engine_mark sent;
    struct pool_slot busy, quick, s;
    size_t idle;

    make_pool(2, "", "");
    report(0, 0, 0, 0);
    report(1, 0, 0, 0);
    ck_assert_int_eq(take(&busy), 0);   /* held on one of them */
    report((size_t)busy.idx, 0, 1, 0);
    /* A tie is broken at random: 20 rounds, or a mutant passes by luck. */
    for (int i = 0; i < 20; i++) {
        ck_assert_int_eq(take(&quick), 0);      /* to the idle one */
        ck_assert_int_ne(quick.idx, busy.idx);
        idle = (size_t)quick.idx;
        /* Its scrape goes out while the quick call runs, and its engine
           counts it; the call ends before the answer comes back. */
        sent = pool_load_mark(pool, idle);
        pool_give_back(pool, &quick, POOL_OK, 0);
        pool_set_load(pool, idle, &r, &sent);
        /* Idle again, not a tie with the busy one. */
        ck_assert_int_eq(take(&s), 0);
        ck_assert_int_ne(s.idx, busy.idx);
        pool_give_back(pool, &s, POOL_OK, 0);
    }
    pool_give_back(pool, &busy, POOL_OK, 0);
}
END_TEST

/*
 * A scrape the engine answered while a call was still on its way there
 * misses that call, though the gateway counted it before the scrape
 * went out.  The engine holds at least the gateway's open calls, so the
 * upstream with one open is not scored as idle (012's prefix bound saw
 * 6 calls where 5 was the most, under ASan).
 */
START_TEST(test_a_scrape_never_counts_fewer_than_the_open_calls)
{
    struct pool_slot open, s;

    make_pool(2, "", "");
    report(0, 0, 0, 0);
    report(1, 0, 0, 0);
    ck_assert_int_eq(take(&open), 0);
    report((size_t)open.idx, 0, 0, 0);     /* it had not arrived yet */
    /* A tie is broken at random: 20 rounds, or a mutant passes by luck. */
    for (int i = 0; i < 20; i++) {
        size_t idle;

        ck_assert_int_eq(take(&s), 0);
        ck_assert_int_ne(s.idx, open.idx);
        idle = (size_t)s.idx;
        pool_give_back(pool, &s, POOL_OK, 0);     /* clears s.idx */
        report(idle, 0, 0, 0);
    }
    pool_give_back(pool, &open, POOL_OK, 0);
}
END_TEST

START_TEST(test_least_inflight_ignores_the_engines)
{
    struct pool_slot s[8];
    int got[2];

    make_pool(2, "balance = least_inflight\nmax_waiting = 1\n", "");
    report(0, 50, 100, 0.99);           /* would be saturated */
    hold(s, 8, got);
    ck_assert_int_eq(got[0], 4);
    release_all(s, 8);
}
END_TEST

START_TEST(test_kv_high_saturates)
{
    struct pool_slot s[4];
    int got[2];

    make_pool(2, "kv_high = 0.8\nmax_waiting = 100\n", "");
    report(0, 0, 1, 0.95);
    report(1, 0, 1, 0.2);
    hold(s, 4, got);
    ck_assert_int_eq(got[1], 4);
    ck_assert_int_eq(upstream_metric("infergw_upstream_saturated", "u0"), 1);
    ck_assert_int_eq(upstream_metric("infergw_upstream_saturated", "u1"), 0);
    release_all(s, 4);
}
END_TEST

START_TEST(test_saturated_fleet_waits_until_a_scrape_frees_it)
{
    struct waiter_arg a = { 1, { -1, 0, 0, 0, 0 }, 0, 0 };
    struct pool_slot s;
    pthread_t ta;

    make_pool(1, "max_waiting = 2\nqueue_timeout = 5s\nload_stale = 1m\n",
              "");
    report_full(0, 2, 8, 0.5);          /* a queue of 2: saturated */
    ck_assert_int_eq(pthread_create(&ta, NULL, waiter, &a), 0);
    wait_queued(1);
    report(0, 0, 8, 0.5);               /* the queue drained */
    pthread_join(ta, NULL);
    ck_assert_int_eq(a.rc, 0);
    ck_assert(a.slot.queued);
    pool_give_back(pool, &a.slot, POOL_OK, 0);
    /* Capacity learned (8 ran while 2 waited): with 8 running, two more
     * started calls make a queue of 2 again. */
    ck_assert_int_eq(take(&s), 0);
    ck_assert_int_eq(upstream_metric("infergw_upstream_saturated", "u0"), 0);
    ck_assert_int_eq(take(&a.slot), 0);
    ck_assert_int_eq(upstream_metric("infergw_upstream_saturated", "u0"), 1);
    pool_give_back(pool, &s, POOL_OK, 0);
    ck_assert_int_eq(upstream_metric("infergw_upstream_saturated", "u0"), 0);
    pool_give_back(pool, &a.slot, POOL_OK, 0);
}
END_TEST

START_TEST(test_a_burst_on_an_idle_engine_starts_slowly)
{
    struct pool_slot s[23], extra;

    make_pool(1, "max_waiting = 4\nqueue_timeout = 0\n", "");
    report(0, 0, 0, 0);                 /* idle, nothing known of it */
    /* Room taken to be max_waiting (4); 4 more would be a queue of 4. */
    for (int i = 0; i < 8; i++)
        ck_assert_int_eq(take(&s[i]), 0);
    ck_assert_int_eq(take(&extra), GW_ETIMEDOUT);
    /* The next read shows those 8 running without a queue: room twice
     * that, 16, and 4 past it: 12 more. */
    report(0, 0, 8, 0);
    for (int i = 8; i < 20; i++)
        ck_assert_int_eq(take(&s[i]), 0);
    ck_assert_int_eq(take(&extra), GW_ETIMEDOUT);
    /* One read with a queue of 1 proves nothing (it may have come
     * between two steps): still doubling, 40, and 24 more would fit. */
    report(0, 1, 20, 0);
    ck_assert_int_eq(take(&extra), 0);
    pool_give_back(pool, &extra, POOL_OK, 0);
    /* The second in a row: the room is known (20), no doubling; 3 more
     * make the queue 4. */
    report(0, 1, 20, 0);
    for (int i = 20; i < 23; i++)
        ck_assert_int_eq(take(&s[i]), 0);
    ck_assert_int_eq(take(&extra), GW_ETIMEDOUT);
    release_all(s, 23);
}
END_TEST

/* ---- tenants in the queue ---- */

/* (No headroom: these show the order of the queue, test_a_tenant_ahead_
 * leaves_the_headroom_to_the_others the headroom.  load_stale = 1m: a
 * report stays fresh however slow the build; none is about staleness.) */
#define TENANTS "max_waiting = 1\nqueue_timeout = 5s\nheadroom = 0%\n" \
    "load_stale = 1m\n" \
    TENANT_SECTIONS
#define TENANT_SECTIONS \
    "[tenant a]\napi_key = key-a-0123456789ab\n" \
    "[tenant b]\napi_key = key-b-0123456789ab\n" \
    "[tenant c]\napi_key = key-c-0123456789ab\npriority = 5\n" \
    "[tenant d]\napi_key = key-d-0123456789ab\npriority = -1\n" \
    "[tenant e]\napi_key = key-e-0123456789ab\nweight = 4\n"

struct tenant_waiter {
    size_t tenant;
    int rc;
    _Atomic int done;
    struct pool_slot slot;
};

static void *
tenant_waiter(void *arg)
{
    struct tenant_waiter *a = arg;
    struct pool_want w = { .tenant = a->tenant, .tenants = tenants };
    int ra;

    a->rc = pool_acquire(pool, &w, &a->slot, &ra);
    atomic_store(&a->done, 1);
    return NULL;
}

static int
take_as(size_t tenant, struct pool_slot *s)
{
    struct pool_want w = { .tenant = tenant, .tenants = tenants };
    int ra;

    return pool_acquire(pool, &w, s, &ra);
}

/* Let one call through; return which of w[0..n) got it. */
static int
admit_one(struct tenant_waiter *w, int n)
{
    int64_t end = gw_now_ms() + 5000;

    /* Capacity 8 is known: 7 running leaves one place.  (Tenants
       compete: none gets a place in the engine's queue, pool.h.) */
    report(0, 0, 7, 0.1);
    for (;;) {
        int found = -1, count = 0;

        for (int i = 0; i < n; i++)
            if (atomic_load(&w[i].done) && w[i].slot.idx >= 0) {
                found = i;
                count++;
            }
        if (count == 1) {
            ck_assert_int_eq(w[found].rc, 0);
            /* Saturated again; its end lets one of the engine's two
               waiting in, so one is still waiting. */
            report(0, 2, 8, 0.1);
            pool_give_back(pool, &w[found].slot, POOL_OK, 0);
            w[found].slot.idx = -2;     /* counted */
            return found;
        }
        ck_assert_msg(count == 0, "%d admitted at once", count);
        ck_assert_msg(gw_now_ms() < end, "nobody admitted");
        poll(NULL, 0, 2);
    }
}

START_TEST(test_priority_then_fewest_open_per_weight_then_oldest)
{
    /* Arrival order: b, b, a, e, c. */
    struct tenant_waiter w[5] = {
        { 1, 1, 0, { -1, 0, 0, 0, 0 } }, { 1, 1, 0, { -1, 0, 0, 0, 0 } },
        { 0, 1, 0, { -1, 0, 0, 0, 0 } }, { 4, 1, 0, { -1, 0, 0, 0, 0 } },
        { 2, 1, 0, { -1, 0, 0, 0, 0 } },
    };
    struct pool_slot held[3];
    pthread_t t[5];
    int order[5];

    make_pool(1, TENANTS, "");
    /* b and e hold 1 call each, a none; then the engine saturates. */
    ck_assert_int_eq(take_as(1, &held[0]), 0);
    ck_assert_int_eq(take_as(4, &held[1]), 0);
    ck_assert_int_eq(take_as(4, &held[2]), 0);
    report_full(0, 1, 8, 0.1);
    for (int i = 0; i < 5; i++) {
        ck_assert_int_eq(pthread_create(&t[i], NULL, tenant_waiter, &w[i]),
                         0);
        wait_queued(i + 1);
    }
    for (int i = 0; i < 5; i++)
        order[i] = admit_one(w, 5);
    /* c (priority 5); then per weight: a 0/1, e 2/4 = 0.5, b 1/1: a, e
     * (now 3/4 < 1), then b's two in their order. */
    ck_assert_int_eq(order[0], 4);
    ck_assert_int_eq(order[1], 2);
    ck_assert_int_eq(order[2], 3);
    ck_assert_int_eq(order[3], 0);
    ck_assert_int_eq(order[4], 1);
    for (int i = 0; i < 5; i++)
        pthread_join(t[i], NULL);
    for (int i = 0; i < 3; i++)
        pool_give_back(pool, &held[i], POOL_OK, 0);
}
END_TEST

/* Wait (with a deadline) until waiter 'w' has its answer. */
static void
wait_done(struct tenant_waiter *w)
{
    int64_t end = gw_now_ms() + 5000;

    while (!atomic_load(&w->done)) {
        ck_assert_msg(gw_now_ms() < end, "the waiter never got an answer");
        poll(NULL, 0, 2);
    }
}

/*
 * vLLM's queue is first come, first served: while tenants compete, no
 * call goes into an engine's queue, only to a place its batch has, and
 * each place goes to the waiter whose turn it is (pool.h).
 */
START_TEST(test_competing_tenants_get_no_place_in_the_engines_queue)
{
    struct tenant_waiter aw = { 0, 1, 0, { -1, 0, 0, 0, 0 } };
    struct tenant_waiter bw = { 1, 1, 0, { -1, 0, 0, 0, 0 } };
    struct tenant_waiter dw = { 3, 1, 0, { -1, 0, 0, 0, 0 } };
    struct pool_slot a, b[2];
    pthread_t ta, tb, td;

    make_pool(1, "max_waiting = 4\nqueue_timeout = 5s\nheadroom = 0%\n"
              "load_stale = 1m\n"
              TENANT_SECTIONS, "");
    report_full(0, 1, 8, 0.1);          /* capacity 8 is known */
    report(0, 0, 5, 0.1);               /* 5 running, someone else's */
    ck_assert_int_eq(take_as(0, &a), 0);
    ck_assert_int_eq(take_as(1, &b[0]), 0);
    ck_assert_int_eq(take_as(1, &b[1]), 0);     /* the batch is full */
    /* Not saturated (no queue), but b, a and d all wait here. */
    ck_assert_int_eq(pthread_create(&tb, NULL, tenant_waiter, &bw), 0);
    wait_queued(1);
    ck_assert_int_eq(pthread_create(&ta, NULL, tenant_waiter, &aw), 0);
    wait_queued(2);
    ck_assert_int_eq(pthread_create(&td, NULL, tenant_waiter, &dw), 0);
    wait_queued(3);
    /* d (priority -1) is not shed: the fleet is not saturated. */
    ck_assert_int_eq(tenant_metric("infergw_tenant_shed_total{tenant=\"d\","
                                   "priority=\"-1\"}"), 0);
    wait_tenant_metric("infergw_tenant_queued{tenant=\"d\",priority=\"-1\"}",
                       1);
    /* One place frees: a's turn (fewer open than b), though b came
       first. */
    pool_give_back(pool, &a, POOL_OK, 0);
    wait_done(&aw);
    ck_assert_int_eq(aw.rc, 0);
    wait_queued(2);
    ck_assert_int_eq(atomic_load(&bw.done), 0);
    /* Two more: b's, then d's (lower priority). */
    pool_give_back(pool, &b[0], POOL_OK, 0);
    wait_done(&bw);
    ck_assert_int_eq(atomic_load(&dw.done), 0);
    pool_give_back(pool, &b[1], POOL_OK, 0);
    wait_done(&dw);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    pthread_join(td, NULL);
    ck_assert_int_eq(bw.rc, 0);
    ck_assert_int_eq(dw.rc, 0);
    /* Each waited once, and none waits now: reported to tenant.h. */
    ck_assert_int_eq(tenant_metric("infergw_tenant_queue_waits_total"
                                   "{tenant=\"b\",priority=\"0\"}"), 1);
    ck_assert_int_eq(tenant_metric("infergw_tenant_queue_waits_total"
                                   "{tenant=\"d\",priority=\"-1\"}"), 1);
    ck_assert_int_eq(tenant_metric("infergw_tenant_queued"
                                   "{tenant=\"a\",priority=\"0\"}"), 0);
    ck_assert_int_eq(tenant_metric("infergw_tenant_queue_timeouts_total"
                                   "{tenant=\"a\",priority=\"0\"}"), 0);
    pool_give_back(pool, &aw.slot, POOL_OK, 0);
    pool_give_back(pool, &bw.slot, POOL_OK, 0);
    pool_give_back(pool, &dw.slot, POOL_OK, 0);
}
END_TEST

/* ---- the reserve (pool_share.c) ---- */

/* queue_timeout = 0: a call that finds no place is told at once
 * (GW_ETIMEDOUT), so these cases need no thread. */
#define RESERVE "max_waiting = 4\nqueue_timeout = 0\nload_stale = 1m\n"

/* Every one of 'n' upstreams' batches holds 8 (known), and is empty. */
static void
known_rooms(int n)
{
    for (int i = 0; i < n; i++) {
        report_full((size_t)i, 1, 8, 0.1);
        report((size_t)i, 0, 0, 0.1);
    }
}

/* Take calls of 'tenant' into s[from..] until one finds no place;
 * return how many were taken. */
static int
take_all(size_t tenant, struct pool_slot *s, int from, int max)
{
    int i;

    for (i = from; i < max; i++) {
        int rc = take_as(tenant, &s[i]);

        if (rc != 0) {
            ck_assert_int_eq(rc, GW_ETIMEDOUT);
            break;
        }
    }
    return i - from;
}

static void
give_all(struct pool_slot *s, int n)
{
    for (int i = 0; i < n; i++)
        pool_give_back(pool, &s[i], POOL_OK, 0);
}

START_TEST(test_demand_needs_its_mean_and_a_deviation)
{
    static const struct {
        double m, need;
        const char *note;
    } cases[] = {
        { 0, 0, "no demand, no place" },
        { 0.02, 1, "a call now and then: one place" },
        { 1, 2, "1 + 1" },
        { 2.25, 4, "2.25 + 1.5 = 3.75" },
        { 3.6, 6, "3.6 + 1.90 = 5.50" },
        { 4, 6, "4 + 2, exactly" },
        { 9, 12, "9 + 3" },
        { 100, 110, "100 + 10" },
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        ck_assert_msg(demand_need(cases[i].m) == cases[i].need,
                      "%g: %g, want %g (%s)", cases[i].m,
                      demand_need(cases[i].m), cases[i].need,
                      cases[i].note);
}
END_TEST

/* A tenant's demand is the mean of its calls open and waiting since its
 * first, not an average that starts from zero. */
START_TEST(test_demand_is_the_mean_since_the_first_call)
{
    struct pool_slot a[3];

    make_pool(1, RESERVE TENANT_SECTIONS, "");
    ck_assert(pool_demand(pool, 0) == 0);
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(take_as(0, &a[i]), 0);
    /* Three open at once (within a ms of each other): at least 2 on
     * average from the start, 3 at most. */
    ck_assert(pool_demand(pool, 0) > 2 && pool_demand(pool, 0) <= 3);
    give_all(a, 3);
    pool_demand_set(pool, 0, 3.5);
    ck_assert(pool_demand(pool, 0) > 3.4 && pool_demand(pool, 0) <= 3.5);
}
END_TEST

/*
 * While tenants compete, one ahead of its share leaves free what the
 * tenants before it need and do not hold: ceil(m + sqrt(m)) places for
 * a recent demand of m, so a light tenant beside a flood starts its
 * calls at once.
 */
START_TEST(test_a_flood_leaves_what_the_light_tenant_needs)
{
    struct pool_slot a[8], b[16];
    int na, nb;

    make_pool(2, RESERVE "headroom = 1%\n" TENANT_SECTIONS, "");
    known_rooms(2);                     /* 16 places */
    ck_assert_int_eq(take_as(0, &a[0]), 0);
    pool_demand_set(pool, 0, 3.5);      /* needs 6; holds 1: 5 free */
    nb = take_all(1, b, 0, 16);
    ck_assert_int_eq(nb, 10);
    /* The 5 left are a's at once, and none is b's. */
    na = take_all(0, a, 1, 8);
    ck_assert_int_eq(na, 5);
    ck_assert_int_eq(take_as(1, &b[nb]), GW_ETIMEDOUT);
    /* a's demand falls to 1 (needs 2): 2 of its calls end, and it still
     * holds more than that, so both places are b's. */
    pool_demand_set(pool, 0, 1);
    give_all(a, 2);
    ck_assert_int_eq(take_all(1, b, nb, 16), 2);
    ck_assert_int_eq(take_as(0, &a[0]), GW_ETIMEDOUT);
    give_all(a + 2, 4);
    give_all(b, nb + 2);
}
END_TEST

/*
 * Over 16 places, with [routing] 'routing', tenant a holding one call
 * and a demand of 'demand': how many places does b take?
 */
static int
b_takes_beside_a(const char *routing, double demand)
{
    char text[1024];
    struct pool_slot a, b[16];
    int nb;

    snprintf(text, sizeof(text), "%s%s%s", RESERVE, routing,
             TENANT_SECTIONS);
    make_pool(2, text, "");
    known_rooms(2);
    ck_assert_int_eq(take_as(0, &a), 0);
    pool_demand_set(pool, 0, demand);
    nb = take_all(1, b, 0, 16);
    give_all(b, nb);
    pool_give_back(pool, &a, POOL_OK, 0);
    return nb;
}

/* What they need is kept for them up to their share by weight of the
 * places, never more: a tenant under its share that asks for the whole
 * fleet is kept half of it (two tenants of weight 1). */
START_TEST(test_the_reserve_is_at_most_the_others_share)
{
    ck_assert_int_eq(b_takes_beside_a("headroom = 1%\n", 50), 8);
}
END_TEST

/* [routing] headroom is the least kept for them: a demand that needs
 * less (0.5 needs 2) keeps that share of the places (25 % of 16 is 4)
 * all the same; and 0 % keeps none. */
START_TEST(test_headroom_is_the_least_kept)
{
    ck_assert_int_eq(b_takes_beside_a("headroom = 25%\n", 0.5), 12);
}
END_TEST

START_TEST(test_headroom_0_keeps_no_reserve)
{
    ck_assert_int_eq(b_takes_beside_a("headroom = 0%\n", 3.5), 15);
}
END_TEST

/*
 * The reserve holds for a place that comes free too: a flood's waiting
 * call is granted one only when what is left still covers the light
 * tenant, whose own waiting call goes first.
 */
START_TEST(test_a_freed_place_goes_to_the_flood_past_the_reserve_only)
{
    struct tenant_waiter bw = { 1, 1, 0, { -1, 0, 0, 0, 0 } };
    struct pool_slot a[4], b[8];
    pthread_t tb;

    make_pool(1, "max_waiting = 4\nqueue_timeout = 5s\nload_stale = 1m\n"
              "headroom = 1%\n" TENANT_SECTIONS, "");
    known_rooms(1);                     /* 8 places */
    ck_assert_int_eq(take_as(0, &a[0]), 0);
    pool_demand_set(pool, 0, 2);        /* needs 4; holds 1: 3 free */
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(take_as(1, &b[i]), 0);
    ck_assert_int_eq(pthread_create(&tb, NULL, tenant_waiter, &bw), 0);
    wait_queued(1);
    for (int i = 1; i < 4; i++)
        ck_assert_int_eq(take_as(0, &a[i]), 0);     /* full now */
    /* One of a's ends: a needs 4 and would hold 3: the place stays a's,
     * and its next call has it at once. */
    pool_give_back(pool, &a[0], POOL_OK, 0);
    ck_assert_int_eq(take_as(0, &a[0]), 0);
    ck_assert_int_eq(atomic_load(&bw.done), 0);
    /* Its demand falls to 1 (needs 2): the next place that frees is
     * b's. */
    pool_demand_set(pool, 0, 1);
    pool_give_back(pool, &a[0], POOL_OK, 0);
    wait_done(&bw);
    pthread_join(tb, NULL);
    ck_assert_int_eq(bw.rc, 0);
    pool_give_back(pool, &bw.slot, POOL_OK, 0);
    give_all(a + 1, 3);
    give_all(b, 4);
}
END_TEST

/*
 * The flood's start: no engine's room is known yet.  The tenant ahead
 * learns it on one engine (the one seen running the most, the first of
 * equals), in the slow start there, and takes nothing else the reads
 * have not proved; once that room is known the others are presumed
 * alike, and the reserve holds on them.
 */
START_TEST(test_a_flood_learns_the_room_on_one_engine)
{
    struct pool_slot a[8], b[32];
    int nb = 0, na, first_elsewhere;

    make_pool(4, RESERVE "headroom = 1%\n" TENANT_SECTIONS, "");
    for (size_t i = 0; i < 4; i++)
        report(i, 0, 0, 0.1);           /* fresh, idle, nothing known */
    /* a is active (a call just ended), and will need 4 places. */
    ck_assert_int_eq(take_as(0, &a[0]), 0);
    pool_give_back(pool, &a[0], POOL_OK, 0);
    pool_demand_set(pool, 0, 2);
    /* b's first call is not ahead of a's share (both hold none): it goes
     * where the balancer says.  Every one after goes to u0, up to the
     * slow start's first room (max_waiting, 4). */
    ck_assert_int_eq(take_as(1, &b[nb++]), 0);
    first_elsewhere = b[0].idx != 0;
    while (take_as(1, &b[nb]) == 0) {
        ck_assert_int_eq(b[nb].idx, 0);
        nb++;
    }
    ck_assert_int_eq(nb, 4 + first_elsewhere);
    /* a is served meanwhile, elsewhere. */
    ck_assert_int_eq(take_as(0, &a[0]), 0);
    ck_assert_int_ne(a[0].idx, 0);
    /* u0's room is learned: 4 (two reads with a queue), and the others
     * are presumed to hold as many: 16 places, 11 free (a holds 1, b's
     * first 1 if not on u0), of which a needs 3 more: b takes 8 or 7. */
    report_full(0, 1, 4, 0.1);
    na = 1;
    nb += take_all(1, b, nb, 32);
    ck_assert_int_eq(nb, 4 + first_elsewhere + 8 - first_elsewhere);
    /* And the 3 left are a's. */
    na += take_all(0, a, 1, 8);
    ck_assert_int_eq(na, 4);
    give_all(a, na);
    give_all(b, nb);
}
END_TEST

/*
 * A tenant counts for the shares for POOL_TENANT_ACTIVE_MS after its
 * last call, not one second: a light tenant that paused keeps its
 * reserve, and the flood does not fill the engine's queue meanwhile
 * (a lone tenant may, up to max_waiting).
 */
START_TEST(test_a_pause_keeps_the_light_tenants_places)
{
    struct pool_slot a, b[16];
    int nb;

    make_pool(1, RESERVE "headroom = 1%\n" TENANT_SECTIONS, "");
    known_rooms(1);
    ck_assert_int_eq(take_as(0, &a), 0);
    pool_give_back(pool, &a, POOL_OK, 0);
    pool_demand_set(pool, 0, 0.5);      /* needs 2 */
    pool_tenant_age(pool, 0, 2000);     /* a's last call: 2 s ago */
    nb = take_all(1, b, 0, 16);
    ck_assert_int_eq(nb, 6);
    give_all(b, nb);
    /* Past POOL_TENANT_ACTIVE_MS b is alone: 8 places and 4 queued. */
    pool_tenant_age(pool, 0, POOL_TENANT_ACTIVE_MS);
    nb = take_all(1, b, 0, 16);
    ck_assert_int_eq(nb, 12);
    give_all(b, nb);
}
END_TEST

START_TEST(test_sheddable_tenant_gets_429_at_saturation)
{
    struct pool_slot s;

    make_pool(1, TENANTS, "");
    ck_assert_int_eq(take_as(3, &s), 0);    /* not saturated: served */
    pool_give_back(pool, &s, POOL_OK, 0);
    report_full(0, 1, 8, 0.1);
    ck_assert_int_eq(take_as(3, &s), GW_ESHED);
    ck_assert_int_eq(tenant_metric("infergw_tenant_shed_total{tenant=\"d\","
                                   "priority=\"-1\"}"), 1);
    ck_assert_int_eq(tenant_metric("infergw_tenant_queued{tenant=\"d\","
                                   "priority=\"-1\"}"), 0);
    /* The pool renders no tenant's number: tenant.h has them all. */
    ck_assert_int_eq(pool_metric_absent("tenant="), 1);
}
END_TEST

static Suite *
pool_suite(void)
{
    Suite *s = suite_create("pool");
    TCase *tc = tcase("breaker");

    tcase_add_checked_fixture(tc, NULL, teardown);
    tcase_add_test(tc, test_eject_half_open_close);
    tcase_add_test(tc, test_failed_trial_doubles_eject_time);
    tcase_add_test(tc, test_eject_time_doubles_up_to_its_own_bound);
    tcase_add_test(tc, test_stale_trial_clears_nothing);
    tcase_add_test(tc, test_retry_after_holds_and_counts_once);
    tcase_add_test(tc, test_late_verdict_and_poison);
    suite_add_tcase(s, tc);
    tc = tcase("sets");
    tcase_add_checked_fixture(tc, NULL, teardown);
    tcase_add_test(tc, test_max_ejected_per_model);
    tcase_add_test(tc, test_max_ejected_unlisted_and_share);
    tcase_add_test(tc, test_panic_routes_across_all);
    tcase_add_test(tc, test_panic_call_is_no_trial);
    tcase_add_test(tc, test_panic_leaves_a_held_upstream_alone);
    tcase_add_test(tc, test_panic_routes_across_ejected_never_across_held);
    suite_add_tcase(s, tc);
    tc = tcase("readiness");
    tcase_add_checked_fixture(tc, NULL, teardown);
    tcase_add_test(tc, test_ready_from_a_passing_probe_to_a_failed_one);
    tcase_add_test(tc, test_half_open_needs_a_passing_probe);
    tcase_add_test(tc, test_ejected_is_not_ready_though_its_probe_passes);
    tcase_add_test(tc, test_held_is_not_ready_though_its_probe_passes);
    tcase_add_test(tc, test_beat_off_ready_until_ejected);
    tcase_add_test(tc, test_any_upstream_of_any_model_makes_it_ready);
    tcase_add_test(tc, test_a_reload_carries_the_probe_verdicts);
    suite_add_tcase(s, tc);
    tc = tcase("admission");
    tcase_add_checked_fixture(tc, NULL, teardown);
    tcase_add_test(tc, test_queue_granted_in_order);
    tcase_add_test(tc, test_queued_per_upstream);
    tcase_add_test(tc, test_queue_timeout_and_no_wait);
    tcase_add_test(tc, test_acquire_says_whether_a_retry_could_go_elsewhere);
    tcase_add_test(tc, test_queue_stop_and_hopeless);
    tcase_add_test(tc, test_panic_grants_a_waiter_an_ejected_slot);
    suite_add_tcase(s, tc);
    tc = tcase("choice");
    tcase_add_checked_fixture(tc, NULL, teardown);
    tcase_add_test(tc, test_budget_share_and_minimum);
    tcase_add_test(tc, test_round_robin_weights);
    tcase_add_test(tc, test_prefix_sticks_and_bounds);
    tcase_add_test(tc, test_prefix_bounds_on_the_engines_load);
    tcase_add_test(tc, test_models_route);
    tcase_add_test(tc, test_admission_holds_until_the_models_change);
    tcase_add_test(tc, test_models_change_under_admissions);
    suite_add_tcase(s, tc);
    tc = tcase("engines");
    tcase_add_checked_fixture(tc, NULL, teardown);
    tcase_add_test(tc, test_least_load_reads_the_engines);
    tcase_add_test(tc, test_least_load_without_metrics_is_least_inflight);
    tcase_add_test(tc, test_a_report_counts_from_when_it_was_sent);
    tcase_add_test(tc, test_a_scrape_never_counts_fewer_than_the_open_calls);
    tcase_add_test(tc, test_least_inflight_ignores_the_engines);
    tcase_add_test(tc, test_kv_high_saturates);
    tcase_add_test(tc, test_saturated_fleet_waits_until_a_scrape_frees_it);
    tcase_add_test(tc, test_a_burst_on_an_idle_engine_starts_slowly);
    suite_add_tcase(s, tc);
    tc = tcase("tenants");
    tcase_add_checked_fixture(tc, NULL, teardown);
    tcase_add_test(tc, test_priority_then_fewest_open_per_weight_then_oldest);
    tcase_add_test(tc, test_competing_tenants_get_no_place_in_the_engines_queue);
    tcase_add_test(tc, test_sheddable_tenant_gets_429_at_saturation);
    suite_add_tcase(s, tc);
    tc = tcase("reserve");
    tcase_add_checked_fixture(tc, NULL, teardown);
    tcase_add_test(tc, test_demand_needs_its_mean_and_a_deviation);
    tcase_add_test(tc, test_demand_is_the_mean_since_the_first_call);
    tcase_add_test(tc, test_a_flood_leaves_what_the_light_tenant_needs);
    tcase_add_test(tc, test_the_reserve_is_at_most_the_others_share);
    tcase_add_test(tc, test_headroom_is_the_least_kept);
    tcase_add_test(tc, test_headroom_0_keeps_no_reserve);
    tcase_add_test(tc, test_a_freed_place_goes_to_the_flood_past_the_reserve_only);
    tcase_add_test(tc, test_a_flood_learns_the_room_on_one_engine);
    tcase_add_test(tc, test_a_pause_keeps_the_light_tenants_places);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    return test_run(srunner_create(pool_suite()));
}
