/* SPDX-License-Identifier: MIT */
/*
 * tenant_tokens.c - a tenant's token bucket and budget periods
 * (tenant_impl.h), part of module tenant.
 *
 * Design: all integers.  The bucket's credit is bounded above by a
 * minute's worth (per_minute * TENANT_TOKEN_UNITS <= 6e16 with
 * per_minute <= 1e9) and below by debt_floor() (>= -2^62); one charge
 * takes at most TENANT_MAX_CHARGE * TENANT_TOKEN_UNITS (about 1e18),
 * so no step leaves int64_t.  The calendar is Howard Hinnant's civil-date
 * arithmetic (days_from_civil), proleptic Gregorian in UTC: no time
 * zone, no libc state, leap years by the rule (2000 and 2024 are, 1900
 * and 2100 are not).
 */
#include "base/tenant_impl.h"

#include <stdint.h>

#include "base/config.h"
#include "util.h"

#define DEBT_FLOOR (-(INT64_C(1) << 62))
#define DAY_S INT64_C(86400)

GW_TESTABLE int64_t tenant_period_key(enum tenant_period_kind kind,
                                      int64_t wall_s);

_Static_assert(CONFIG_MAX_TOKENS_PER_MINUTE
               <= INT64_MAX / 8 / TENANT_TOKEN_UNITS, "the bucket's units");
_Static_assert(TENANT_MAX_CHARGE <= INT64_MAX / 4 / TENANT_TOKEN_UNITS,
               "a charge's units");

static int64_t
cap_of(uint64_t per_minute)
{
    return (int64_t)per_minute * TENANT_TOKEN_UNITS;
}

void
tenant_bucket_refill(struct tenant_bucket *b, uint64_t per_minute,
                     int64_t now_us)
{
    int64_t cap = cap_of(per_minute);

    if (!b->filled) {
        b->filled = 1;
        b->credit = cap;
        b->refilled_us = now_us;
        return;
    }
    if (now_us > b->refilled_us && b->credit < cap) {
        /* Clamp the time to what fills the bucket before multiplying:
         * a long idle, or a deep debt, cannot overflow. */
        uint64_t need = (uint64_t)(cap - b->credit);
        uint64_t dt = (uint64_t)(now_us - b->refilled_us);

        if (dt >= (need + per_minute - 1) / per_minute)
            b->credit = cap;
        else
            b->credit += (int64_t)(dt * per_minute);
    }
    if (now_us > b->refilled_us)
        b->refilled_us = now_us;
    if (b->credit > cap)
        b->credit = cap;        /* also when a reload lowered the limit */
}

uint64_t
tenant_bucket_wait_us(struct tenant_bucket *b, uint64_t per_minute,
                      int64_t now_us)
{
    tenant_bucket_refill(b, per_minute, now_us);
    if (b->credit >= TENANT_TOKEN_UNITS)
        return 0;
    return ((uint64_t)(TENANT_TOKEN_UNITS - b->credit) + per_minute - 1)
           / per_minute;
}

/*
 * Only subtracts: the refill is the admission's (tenant_bucket_wait_us(),
 * at the config of the time).  A call admitted before a reload ends
 * under the old config, and refilling at its rate and cap would wipe a
 * debt run up under the new, lower limit.
 */
/*
 * The deepest debt of a bucket of 'per_minute': what a day refills, so
 * that no usage object (a count may be 2^32, from a broken or hostile
 * upstream) shuts a tenant out for more than a day.  Past 53 million a
 * minute a day's refill does not fit: DEBT_FLOOR, which refills sooner.
 */
static int64_t
debt_floor(uint64_t per_minute)
{
    const int64_t day_us = DAY_S * 1000000;

    if (per_minute > (uint64_t)(-DEBT_FLOOR / day_us))
        return DEBT_FLOOR;
    return -(int64_t)per_minute * day_us;
}

void
tenant_bucket_charge(struct tenant_bucket *b, uint64_t per_minute,
                     uint64_t tokens, int64_t now_us)
{
    int64_t units;

    if (!b->filled)
        tenant_bucket_refill(b, per_minute, now_us);    /* starts full */
    if (tokens > TENANT_MAX_CHARGE)
        tokens = TENANT_MAX_CHARGE;
    units = (int64_t)tokens * TENANT_TOKEN_UNITS;
    b->credit -= units;         /* >= DEBT_FLOOR - 2^60: no overflow */
    if (b->credit < debt_floor(per_minute))
        b->credit = debt_floor(per_minute);
}

uint64_t
tenant_bucket_remaining(const struct tenant_bucket *b)
{
    return b->credit > 0 ? (uint64_t)(b->credit / TENANT_TOKEN_UNITS) : 0;
}

uint64_t
tenant_bucket_reset_us(const struct tenant_bucket *b, uint64_t per_minute)
{
    int64_t cap = cap_of(per_minute);

    if (b->credit >= cap)
        return 0;
    return ((uint64_t)(cap - b->credit) + per_minute - 1) / per_minute;
}

/* floor(a / b) for b > 0: a second before the epoch is in day -1. */
static int64_t
floor_div(int64_t a, int64_t b)
{
    return a / b - (a % b != 0 && a < 0);
}

/* Days since 1970-01-01 of year 'y', month 'm' (1..12), day 'd'. */
static int64_t
days_from_civil(int64_t y, int64_t m, int64_t d)
{
    int64_t era, yoe, doy, doe;

    y -= m <= 2;
    era = floor_div(y, 400);
    yoe = y - era * 400;
    doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1;
    doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

/* The year and month (1..12) of day 'z' since 1970-01-01. */
static void
civil_from_days(int64_t z, int64_t *y, int64_t *m)
{
    int64_t era, doe, yoe, doy, mp;

    z += 719468;
    era = floor_div(z, 146097);
    doe = z - era * 146097;
    yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    mp = (5 * doy + 2) / 153;
    *m = mp < 10 ? mp + 3 : mp - 9;
    *y = yoe + era * 400 + (*m <= 2);
}

/* The period of 'kind' that 'wall_s' (seconds since the epoch, UTC,
 * CLOCK_REALTIME) is in, as a key. */
GW_TESTABLE int64_t
tenant_period_key(enum tenant_period_kind kind, int64_t wall_s)
{
    int64_t day = floor_div(wall_s, DAY_S), y, m;

    if (kind == TENANT_DAY)
        return day;
    civil_from_days(day, &y, &m);
    return y * 12 + (m - 1);
}

int64_t
tenant_period_end_s(enum tenant_period_kind kind, int64_t wall_s)
{
    int64_t day = floor_div(wall_s, DAY_S), y, m;

    if (kind == TENANT_DAY)
        return (day + 1) * DAY_S;
    civil_from_days(day, &y, &m);
    return days_from_civil(m == 12 ? y + 1 : y, m == 12 ? 1 : m + 1, 1)
           * DAY_S;
}

void
tenant_period_init(struct tenant_period *p)
{
    p->key = INT64_MIN;         /* before any period: the first is new */
    p->used = 0;
}

/*
 * Periods only move forward.  A time in a period before the current
 * one (a thread that read the clock at 23:59:59 but took the lock after
 * another charged in the new day; a wall clock stepped back across
 * midnight) counts in the current period: going back would forget what
 * the new one already used, and hand the budget out twice.
 */
uint64_t
tenant_period_used(const struct tenant_period *p,
                   enum tenant_period_kind kind, int64_t wall_s)
{
    return tenant_period_key(kind, wall_s) <= p->key ? p->used : 0;
}

void
tenant_period_add(struct tenant_period *p, enum tenant_period_kind kind,
                  int64_t wall_s, uint64_t tokens)
{
    int64_t key = tenant_period_key(kind, wall_s);

    if (key > p->key) {
        /* A charge that ends after midnight counts in the new day: the
         * period is the one the tokens were charged in. */
        p->key = key;
        p->used = 0;
    }
    p->used = p->used > UINT64_MAX - tokens ? UINT64_MAX : p->used + tokens;
}
