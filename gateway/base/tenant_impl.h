/* SPDX-License-Identifier: MIT */
/*
 * tenant_impl.h - the arithmetic of a tenant's token limits: the
 * tokens_per_minute bucket, which a call's usage may put in debt, and
 * the calendar periods (UTC days and months) of the tokens_per_day and
 * tokens_per_month budgets; and the answer of the shared limits'
 * script.  Private to module tenant (tenant.c, tenant_tokens.c,
 * tenant_shared.c; test/check_includes.py, PARTS): tenant.h is the API.
 *
 * Plain functions on plain structs, no lock of their own and no clock:
 * tenant.c calls them under the tenants' lock with the times it was
 * given (tenants_enter(), tenants_charge()), so a test decides the time
 * and crosses midnight or a month's end at will.
 */
#ifndef INFERGW_GATEWAY_BASE_TENANT_IMPL_H
#define INFERGW_GATEWAY_BASE_TENANT_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "base/tenant.h"
#include "util.h"

/*
 * A token of the bucket is TENANT_TOKEN_UNITS units (the microseconds
 * in a minute) and each microsecond refills 'per_minute' units: a
 * bucket of per_minute tokens fills in exactly a minute, to the
 * microsecond, in integers (tenant.c's requests_per_minute bucket does
 * the same).  The credit is signed: a call is charged its whole usage
 * when it ends, which may be more than the bucket holds (debt), and
 * the bucket admits again once a whole token is back.
 */
#define TENANT_TOKEN_UNITS INT64_C(60000000)

/* The most one charge takes: usage.h bounds a count by 2^32. */
#define TENANT_MAX_CHARGE (UINT64_C(1) << 34)

struct tenant_bucket {
    int64_t credit;             /* units; < 0: in debt */
    int64_t refilled_us;        /* when 'credit' was last brought up */
    int filled;                 /* 0: never used, starts full */
};

/*
 * Bring 'b' up to 'now_us' for a limit of 'per_minute' (1..
 * CONFIG_MAX_TOKENS_PER_MINUTE) tokens: never above a minute's worth
 * (also when a reload lowered the limit), a debt paid back at the
 * limit's pace.  A time before the last refill refills nothing.
 */
void tenant_bucket_refill(struct tenant_bucket *b, uint64_t per_minute,
                          int64_t now_us);

/*
 * Microseconds, after a refill to 'now_us', until 'b' holds a whole
 * token again: 0 when it does (a call is admitted).
 */
uint64_t tenant_bucket_wait_us(struct tenant_bucket *b, uint64_t per_minute,
                               int64_t now_us);

/* Take 'tokens' (at most TENANT_MAX_CHARGE): may go into debt, down to
 * a day's refill (1440 * per_minute tokens) and no deeper.  No refill: a bucket
 * never used starts full (a minute of 'per_minute' at 'now_us'), and
 * 'per_minute' and 'now_us' change nothing else, so that a call ending
 * under an older config cannot refill at its rate. */
void tenant_bucket_charge(struct tenant_bucket *b, uint64_t per_minute,
                          uint64_t tokens, int64_t now_us);

/* After a refill: the whole tokens it holds (0 in debt), and the
 * microseconds until it is full. */
uint64_t tenant_bucket_remaining(const struct tenant_bucket *b);
uint64_t tenant_bucket_reset_us(const struct tenant_bucket *b,
                                uint64_t per_minute);

/*
 * Usage across the fleet (tenant_usage.c; tenant.h, "Usage across the
 * fleet"): a tenant's counts, what of them Redis surely has, and the
 * batch on its way.  'total' only grows; total - sent - batch is what
 * came since the batch was taken.  A batch whose answer was lost
 * stays the same, with its number, until an answer comes: Redis adds
 * a numbered batch once (its script remembers this process's last).
 */
struct tenant_usage {
    uint64_t total[TENANT_USAGE_FIELDS];    /* this gateway's */
    uint64_t sent[TENANT_USAGE_FIELDS];     /* of them, in Redis */
    uint64_t batch[TENANT_USAGE_FIELDS];    /* taken, not answered */
    uint64_t seq;                           /* the last batch's number */
    int pending;                            /* 'batch' awaits its answer */
    uint64_t cluster[TENANT_USAGE_FIELDS];  /* the fleet's, as last read */
    int64_t read_us;                        /* then (gw_now_us()); 0: never */
};

/* Count 'n' more of 'field' (saturating).  Under the tenants' lock. */
void tenant_usage_add(struct tenant_usage *u, enum tenant_usage_field field,
                      uint64_t n);

/* Fill the status view's usage fields of 'st' from 'u' at 'now_us'. */
void tenant_usage_show(const struct tenant_usage *u, int64_t now_us,
                       struct tenant_status *st);

/*
 * The tenants (tenant.c's, here for tenant_usage.c, which walks them).
 * 'lock' guards everything; an entry, allocated alone, lives until
 * tenants_free().
 */
struct tenants {
    struct gw_mutex lock;
    struct tenant_entry **v;    /* each allocated alone: passes point in */
    size_t n, cap;
    int flushing;               /* a usage flush is under way */
    int usage_failing;          /* the last flush left counts unsent */
    char boot[25];              /* this process's name in the usage
                                   batches' numbers (hex) */
};

/* The name and the usage of entry 'e'.  Under the tenants' lock. */
struct tenant_usage *tenant_entry_usage(struct tenant_entry *e,
                                        const char **name);

#ifdef INFERGW_UNIT_TEST
/*
 * Test builds only (GW_TESTABLE), tenant_usage.c: take the batch to
 * send into out[] and *seq: the pending one again, else what came
 * since the last answer, numbered anew; returns 1, or 0 with *seq 0
 * when there is nothing to add (the totals are only read).  Done:
 * batch 'seq' (0: a read) had its round trip; 'ok' (Redis answered
 * 'cluster', its totals) makes it sent; a failure keeps it pending, to
 * be taken again.
 */
int tenant_usage_take(struct tenant_usage *u,
                      uint64_t out[TENANT_USAGE_FIELDS], uint64_t *seq);
void tenant_usage_done(struct tenant_usage *u, uint64_t seq, int ok,
                       const uint64_t cluster[TENANT_USAGE_FIELDS],
                       int64_t now_us);

/* Test builds only: the script's reply 'r' (borrowed): 0 with
 * *applied (0 read, 1 added, 2 a batch added before) and out[] the
 * totals, or GW_EPARSE.  Any bytes: fuzzed (fuzz_tenant_usage.c). */
struct redisReply;
int tenant_usage_read(const struct redisReply *r, int *applied,
                      uint64_t out[TENANT_USAGE_FIELDS]);
#endif

enum tenant_period_kind {
    TENANT_DAY = 0,             /* 00:00:00 UTC to the next */
    TENANT_MONTH,               /* the 1st, 00:00:00 UTC, to the next */
};

/*
 * The tokens used in one period.  'key' names the period they were
 * used in (days or months since the epoch); a later period than 'key'
 * starts from nothing, without a timer.  Periods only move forward: a
 * time in an earlier one (a clock read just before midnight, a wall
 * clock stepped back) counts in the current one.
 */
struct tenant_period {
    int64_t key;
    uint64_t used;
};

/* Ready for a first period, whatever it is. */
void tenant_period_init(struct tenant_period *p);

/* The first second of the period after the one 'wall_s' is in. */
int64_t tenant_period_end_s(enum tenant_period_kind kind, int64_t wall_s);

/* The tokens used in the period of 'wall_s' (0 for a later one than
 * the current; the current one's for an earlier one). */
uint64_t tenant_period_used(const struct tenant_period *p,
                            enum tenant_period_kind kind, int64_t wall_s);

/* Add 'tokens' to the period of 'wall_s' (a later one starts at 0, an
 * earlier one is the current one; saturates rather than wraps). */
void tenant_period_add(struct tenant_period *p, enum tenant_period_kind kind,
                       int64_t wall_s, uint64_t tokens);

/*
 * What the shared limits' script answered (tenant_shared.c): the
 * verdict, its wait, the two minute buckets as the x-ratelimit-*
 * headers tell them, and the budgets' use (day, month) in Redis.
 */
struct tenant_shared_answer {
    int verdict;                /* enum tenant_limit (tenant.h) */
    int64_t wait_us;
    uint64_t remaining;         /* requests_per_minute's bucket */
    int64_t reset_us;
    uint64_t tokens_remaining;  /* tokens_per_minute's */
    int64_t tokens_reset_us;
    uint64_t used[2];           /* tokens_per_day's, tokens_per_month's */
};

/*
 * The lease of a call (tenant_lease.c), for the admission's script
 * (tenant_shared.c): its key, member, max_inflight and lease in
 * microseconds into argv[0..4), borrowed from 'l'.
 */
void tenant_lease_argv(const struct tenant_lease *l, const char *argv[4]);

/*
 * The admission of 'l' is over: 'answered' (Redis's script ran) and
 * 'admitted' (Redis's verdict).  Unanswered, returns this process's
 * leases of the tenant that may be in Redis, 'l' included: the local
 * max_inflight's count while Redis is gone; else 0.
 */
size_t tenant_lease_settle(struct tenant_lease *l, int answered,
                           int admitted);

#ifdef INFERGW_UNIT_TEST
/* Test builds only: the leases in the book, and (*gone) the releases
 * waiting for the beat, (*renewing) the leases in a renewal now. */
size_t tenant_leases_held(size_t *gone, size_t *renewing);

/* Test builds only (GW_TESTABLE): the beat's part of
 * tenants_after_beat(), alone: renew (re-add) every lease 'cl' holds,
 * then send the releases kept, each round trip by 'timeout_ms'. */
void tenant_leases_renew(struct cluster *cl, int64_t timeout_ms);

/* Test builds only (GW_TESTABLE): the period of 'kind' that 'wall_s'
 * (seconds since the epoch, UTC) is in, as a key. */
int64_t tenant_period_key(enum tenant_period_kind kind, int64_t wall_s);

/* Test builds only: the script's reply 'r' (borrowed) into *out; 0 or
 * GW_EPARSE (anything but eight integers >= 0, a verdict 0..4).  Any
 * bytes: it is fuzzed (test/fuzz/fuzz_cluster.c). */
struct redisReply;
int tenant_shared_read(const struct redisReply *r,
                       struct tenant_shared_answer *out);

/* Test builds only: the script's source, run by a test with a time of
 * its own (ARGV[2]). */
extern const char tenant_shared_src[];
#endif

#endif
