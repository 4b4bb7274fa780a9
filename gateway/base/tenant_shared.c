/* SPDX-License-Identifier: MIT */
/*
 * tenant_shared.c - a tenant's limits shared across gateways through
 * Redis (tenant.h, "Shared limits"), part of module tenant: the script
 * that judges and charges them in one atomic step, the reading of its
 * answer, and the local share that stands in while Redis is gone.
 *
 * Design: the script is tenant.h's arithmetic on Redis's clock, so a
 * tenant's limit means the same with one gateway or ten.  It keeps
 * integer units (a token is TENANT_TOKEN_UNITS units) in Lua's doubles,
 * exact below 2^53: a bucket of up to 150 million per minute, and a
 * debt of up to 100,000 tokens per minute floored at a day's refill;
 * past that the doubles round by a few units in 60 million, which no
 * verdict notices.  The local share uses tenant_impl.h's buckets and
 * periods, the same arithmetic again, at each limit divided by the
 * gateways alive.
 */
#include "base/tenant_impl.h"
#include "base/tenant.h"

#include <assert.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "base/cluster.h"
#include "base/config.h"
#include "log.h"
#include "util.h"

#define DAY_S INT64_C(86400)
#define MINUTES_PER_DAY 1440
/* The local shares kept: every tenant, and as many more names that a
 * reload brought (the least recently used one goes past that). */
#define SHARES_MAX (2 * CONFIG_MAX_TENANTS)
#define SHARED_ARGS 12
#define LEASE_ARGS 4            /* the lease's key and three arguments */

/*
 * The script.  KEYS[1] the rate hash, KEYS[2] the periods hash.  ARGV:
 * [1] "admit" or "charge"; [2] now in microseconds ("" : Redis's TIME;
 * a test gives its own); [3] requests_per_minute, [4] tokens_per_minute,
 * [5] tokens_per_day, [6] tokens_per_month (0: none); [7] the end of
 * the gateway's UTC day and [8] of its month (seconds since the epoch);
 * [9] the tokens to charge; [10] the budget keys' prefix
 * ("<prefix>{<tenant>}:tokens:"), which shares KEYS' hash tag.
 * With a lease (item 4; tenant_lease.c), KEYS[3] the tenant's leases
 * (a sorted set of members scored by their expiry in microseconds on
 * Redis's clock), [11] this call's member, [12] max_inflight, [13] the
 * lease in microseconds; without KEYS[3] (a charge) no lease.
 *
 * Returns { verdict, wait_us, requests remaining, requests reset_us,
 * tokens remaining, tokens reset_us, day used, month used }; verdict 0
 * admitted (or charged), 1 requests_per_minute, 2 tokens_per_minute,
 * 3 tokens_per_day, 4 tokens_per_month, 5 max_inflight: the first
 * failing in that order of checks (leases, budgets, tokens, requests),
 * with the longest wait of all that fail (a second for max_inflight,
 * as tenants_enter() says).  An admission adds its lease only when
 * every limit passes, in the same atomic step, so a lease refused
 * takes no request and a request refused holds no lease.
 *
 * Rules (tenant.h, tenant_impl.h): a bucket missing is full; a refill
 * never goes past a minute's worth, nor back in time; an admission
 * takes nothing unless all pass, and then one request; a charge only
 * subtracts, and a debt stops at a day's refill (1440 minutes' worth);
 * the period in force only moves forward, whichever gateway's clock
 * says; a budget counter expires a day after its period ends, the rate
 * hash once both its buckets would be full again.
 */
GW_TESTABLE const char tenant_shared_src[] =
    "local U = 60000000\n"
    "local now\n"
    "if ARGV[2] ~= '' then now = tonumber(ARGV[2]) else\n"
    "  local t = redis.call('TIME')\n"
    "  now = tonumber(t[1]) * 1000000 + tonumber(t[2])\n"
    "end\n"
    "local charge = ARGV[1] == 'charge'\n"
    "local rpm, tpm = tonumber(ARGV[3]), tonumber(ARGV[4])\n"
    "local tpd, tpmo = tonumber(ARGV[5]), tonumber(ARGV[6])\n"
    "local n = tonumber(ARGV[9])\n"
    "local verdict, wait = 0, 0\n"
    "local function fail(v, w)\n"
    "  if verdict == 0 then verdict = v end\n"
    "  if w > wait then wait = w end\n"
    "end\n"
    "local lk, lmax = KEYS[3], tonumber(ARGV[12] or '0')\n"
    "if lk and lmax > 0 and not charge then\n"
    "  redis.call('ZREMRANGEBYSCORE', lk, '-inf', now)\n"
    "  if redis.call('ZCARD', lk) >= lmax then fail(5, 1000000) end\n"
    "else lk = nil end\n"
    "local function bucket(f, per)\n"
    "  local cap = per * U\n"
    "  local v = redis.call('HMGET', KEYS[1], f .. 'c', f .. 't')\n"
    "  local c, t = tonumber(v[1]), tonumber(v[2])\n"
    "  if c == nil or t == nil then return cap, now end\n"
    "  if now > t then c = math.min(cap, c + (now - t) * per); t = now end\n"
    "  if c > cap then c = cap end\n"
    "  return c, t\n"
    "end\n"
    "local function period(f, ends)\n"
    "  local cur = tonumber(redis.call('HGET', KEYS[2], f) or '0')\n"
    "  if ends > cur then\n"
    "    redis.call('HSET', KEYS[2], f, ends)\n"
    "    redis.call('EXPIREAT', KEYS[2], ends + 86400)\n"
    "    cur = ends\n"
    "  end\n"
    "  return cur, ARGV[10] .. f .. ':' .. cur\n"
    "end\n"
    "local used = { 0, 0 }\n"
    "local budgets = { { 'day', tpd, tonumber(ARGV[7]) },\n"
    "                  { 'month', tpmo, tonumber(ARGV[8]) } }\n"
    "for i, b in ipairs(budgets) do\n"
    "  if b[2] > 0 then\n"
    "    local ends, k = period(b[1], b[3])\n"
    "    if charge and n > 0 then\n"
    "      used[i] = redis.call('INCRBY', k, n)\n"
    "      redis.call('EXPIREAT', k, ends + 86400)\n"
    "    else\n"
    "      used[i] = tonumber(redis.call('GET', k) or '0')\n"
    "    end\n"
    "    if not charge and used[i] >= b[2] then\n"
    "      fail(2 + i, ends * 1000000 - now)\n"
    "    end\n"
    "  end\n"
    "end\n"
    "local tc, tt, rc, rt\n"
    "if tpm > 0 then\n"
    "  tc, tt = bucket('t', tpm)\n"
    "  if charge then\n"
    "    local floor = -1440 * tpm * U\n"
    "    tc = math.min(tc, math.max(tc - n * U, floor))\n"
    "  elseif tc < U then\n"
    "    fail(2, math.ceil((U - tc) / tpm))\n"
    "  end\n"
    "end\n"
    "if rpm > 0 and not charge then\n"
    "  rc, rt = bucket('r', rpm)\n"
    "  if rc < U then fail(1, math.ceil((U - rc) / rpm)) end\n"
    "end\n"
    "local full = 0\n"
    "if verdict == 0 and (rc or charge and tc) then\n"
    "  if rc then\n"
    "    rc = rc - U\n"
    "    redis.call('HSET', KEYS[1], 'rc', rc, 'rt', rt)\n"
    "    full = math.max(full, (rpm * U - rc) / rpm)\n"
    "  end\n"
    "  if charge and tc then\n"
    "    redis.call('HSET', KEYS[1], 'tc', tc, 'tt', tt)\n"
    "  end\n"
    "  if tc then full = math.max(full, (tpm * U - tc) / tpm) end\n"
    "  local ttl = redis.call('PTTL', KEYS[1])\n"
    "  local want = math.ceil(full / 1000) + 1000\n"
    "  if ttl < want then redis.call('PEXPIRE', KEYS[1], want) end\n"
    "end\n"
    "if verdict == 0 and lk then\n"
    "  local lease = tonumber(ARGV[13])\n"
    "  redis.call('ZADD', lk, now + lease, ARGV[11])\n"
    "  local want = math.ceil(lease / 1000) + 1000\n"
    "  if redis.call('PTTL', lk) < want then\n"
    "    redis.call('PEXPIRE', lk, want)\n"
    "  end\n"
    "end\n"
    "local out = { verdict, math.max(wait, 0), 0, 0, 0, 0, used[1],\n"
    "              used[2] }\n"
    "if rc then\n"
    "  out[3] = math.max(math.floor(rc / U), 0)\n"
    "  out[4] = math.ceil((rpm * U - rc) / rpm)\n"
    "end\n"
    "if tc then\n"
    "  out[5] = math.max(math.floor(tc / U), 0)\n"
    "  out[6] = math.ceil((tpm * U - tc) / tpm)\n"
    "end\n"
    "return out\n";

_Static_assert(MINUTES_PER_DAY == 1440, "the script's day of refill");

static struct redis_script shared_script;
static pthread_once_t script_once = PTHREAD_ONCE_INIT;

static void
script_init(void)
{
    redis_script_init(&shared_script, tenant_shared_src);
}

/* ---- the local share ---- */

struct share {
    char name[TENANT_NAME_MAX];
    int64_t touched_us;         /* least recently used goes first */
    struct tenant_bucket requests, tokens;
    /* A budget's figures as Redis last said, and what this gateway
     * charged since that Redis has not had. */
    struct tenant_period seen[2];
    struct tenant_period unsent[2];
    uint64_t pending;           /* tokens to add to the next charge */
};

static struct {
    struct gw_mutex lock;
    struct share v[SHARES_MAX];
    size_t n;
} shares;
static pthread_once_t shares_once = PTHREAD_ONCE_INIT;

static void
shares_init(void)
{
    gw_mutex_init(&shares.lock);
}

/* The share of 'name', made (or the least recent one reused) if new. */
static struct share *
share_of_locked(const char *name, int64_t now_us)
{
    struct share *s = NULL;

    assert(gw_mutex_held(&shares.lock));
    for (size_t i = 0; i < shares.n; i++)
        if (strcmp(shares.v[i].name, name) == 0) {
            s = &shares.v[i];
            goto out;
        }
    if (shares.n < SHARES_MAX) {
        s = &shares.v[shares.n++];
    } else {
        s = &shares.v[0];
        for (size_t i = 1; i < shares.n; i++)
            if (shares.v[i].touched_us < s->touched_us)
                s = &shares.v[i];
    }
    memset(s, 0, sizeof(*s));
    snprintf(s->name, sizeof(s->name), "%s", name);

out:
    s->touched_us = now_us;
    return s;
}

/* A limit's share among 'alive' gateways: never 0 for a limit. */
static uint64_t
part(uint64_t limit, size_t alive)
{
    uint64_t p = limit / (alive > 0 ? alive : 1);

    return limit == 0 ? 0 : p < 1 ? 1 : p;
}

/* The lowest a local bucket's credit goes: a day's refill of debt. */
static void
floor_debt(struct tenant_bucket *b, uint64_t per_minute)
{
    int64_t floor = -(INT64_C(1) << 62);

    if (per_minute <= (uint64_t)(INT64_MAX / MINUTES_PER_DAY
                                 / TENANT_TOKEN_UNITS))
        floor = -(int64_t)per_minute * MINUTES_PER_DAY * TENANT_TOKEN_UNITS;
    if (b->credit < floor)
        b->credit = floor;
}

static const enum tenant_period_kind kinds[2] = { TENANT_DAY, TENANT_MONTH };

/* Redis answered with a budget's 'used' (day, month) at 'wall_s'. */
static void
note_seen_locked(struct share *s, const uint64_t used[2], int64_t wall_s)
{
    for (size_t k = 0; k < 2; k++) {
        s->seen[k].key = 0;
        s->seen[k].used = 0;
        tenant_period_add(&s->seen[k], kinds[k], wall_s, used[k]);
    }
}

static uint64_t
ct_budget(const struct config_tenant *ct, size_t k)
{
    return k == 0 ? ct->tokens_per_day : ct->tokens_per_month;
}

/*
 * The verdict of the local share of 'ct''s limits, 'alive' gateways, at
 * the given times; an admission takes its request.  Locked.
 */
static enum tenant_limit
judge_share_locked(struct share *s, const struct config_tenant *ct,
                   size_t alive, int64_t now_us, int64_t wall_s,
                   int *wait, struct tenant_rate *rate)
{
    enum tenant_limit verdict = TENANT_ADMITTED;
    uint64_t rpm = part(ct->requests_per_minute, alive);
    uint64_t tpm = part(ct->tokens_per_minute, alive);
    uint64_t us, longest = 0;

    for (size_t k = 0; k < 2; k++) {
        uint64_t budget = ct_budget(ct, k);
        uint64_t seen = tenant_period_used(&s->seen[k], kinds[k], wall_s);
        uint64_t mine = tenant_period_used(&s->unsent[k], kinds[k], wall_s);

        if (budget == 0)
            continue;
        if (seen >= budget || mine >= part(budget - seen, alive)) {
            us = (uint64_t)(tenant_period_end_s(kinds[k], wall_s) - wall_s)
                 * 1000000;
            if (verdict == TENANT_ADMITTED)
                verdict = k == 0 ? TENANT_QUOTA_DAY : TENANT_QUOTA_MONTH;
            longest = us > longest ? us : longest;
        }
    }
    if (tpm > 0 && (us = tenant_bucket_wait_us(&s->tokens, tpm, now_us)) > 0) {
        if (verdict == TENANT_ADMITTED)
            verdict = TENANT_TOKENS;
        longest = us > longest ? us : longest;
    }
    if (rpm > 0 && (us = tenant_bucket_wait_us(&s->requests, rpm, now_us))
                   > 0) {
        if (verdict == TENANT_ADMITTED)
            verdict = TENANT_RATE;
        longest = us > longest ? us : longest;
    }
    if (verdict == TENANT_ADMITTED && rpm > 0)
        tenant_bucket_charge(&s->requests, rpm, 1, now_us);
    *wait = (int)(gw_us_to_s_ceil(longest) > INT_MAX ? INT_MAX
                  : gw_us_to_s_ceil(longest));
    if (rate != NULL && rpm > 0) {
        rate->limit = rpm;
        rate->remaining = tenant_bucket_remaining(&s->requests);
        rate->reset_us = (int64_t)tenant_bucket_reset_us(&s->requests, rpm);
    }
    if (rate != NULL && tpm > 0) {
        rate->tokens_limit = tpm;
        rate->tokens_remaining = tenant_bucket_remaining(&s->tokens);
        rate->tokens_reset_us = (int64_t)tenant_bucket_reset_us(&s->tokens,
                                                                tpm);
    }
    return verdict;
}

/*
 * Redis admitted: the local share follows, taking its request if it
 * has one (never into debt: Redis is the judge now).  Locked.
 */
static void
shadow_admit_locked(struct share *s, const struct config_tenant *ct,
                    size_t alive, int64_t now_us)
{
    uint64_t rpm = part(ct->requests_per_minute, alive);

    if (rpm > 0 && tenant_bucket_wait_us(&s->requests, rpm, now_us) == 0)
        tenant_bucket_charge(&s->requests, rpm, 1, now_us);
}

/* ---- Redis ---- */

int
tenant_shared_wanted(const struct cluster *cl, const struct gw_config *cfg,
                     size_t tenant)
{
    const struct config_tenant *ct;

    if (cl == NULL || tenant >= cfg->num_tenants)
        return 0;
    ct = &cfg->tenants[tenant];
    return ct->requests_per_minute > 0 || ct->tokens_per_minute > 0
           || ct->tokens_per_day > 0 || ct->tokens_per_month > 0
           || ct->max_inflight > 0;
}

GW_TESTABLE int tenant_shared_read(const redisReply *r,
                                   struct tenant_shared_answer *out);

/* The script's answer 'r' (borrowed) into *out: 0, or GW_EPARSE for
 * anything but eight integers >= 0 with a verdict 0..5. */
GW_TESTABLE int
tenant_shared_read(const redisReply *r, struct tenant_shared_answer *out)
{
    long long v[8];

    memset(out, 0, sizeof(*out));
    if (r == NULL || r->type != REDIS_REPLY_ARRAY || r->elements != 8)
        return GW_EPARSE;
    for (size_t i = 0; i < 8; i++) {
        const redisReply *e = r->element[i];

        if (e == NULL || e->type != REDIS_REPLY_INTEGER || e->integer < 0)
            return GW_EPARSE;
        v[i] = e->integer;
    }
    if (v[0] > 5)
        return GW_EPARSE;
    out->verdict = v[0] == 5 ? TENANT_MAX_INFLIGHT
                   : v[0] == 0 ? TENANT_ADMITTED
                   : v[0] == 1 ? TENANT_RATE
                   : v[0] == 2 ? TENANT_TOKENS
                   : v[0] == 3 ? TENANT_QUOTA_DAY : TENANT_QUOTA_MONTH;
    out->wait_us = v[1];
    out->remaining = (uint64_t)v[2];
    out->reset_us = v[3];
    out->tokens_remaining = (uint64_t)v[4];
    out->tokens_reset_us = v[5];
    out->used[0] = (uint64_t)v[6];
    out->used[1] = (uint64_t)v[7];
    return 0;
}

/* Keys and arguments of one call of the script. */
struct call {
    char rate[CLUSTER_KEY_MAX], periods[CLUSTER_KEY_MAX];
    char budgets[CLUSTER_KEY_MAX];
    char nums[7][24];
    const char *argv[SHARED_ARGS + LEASE_ARGS];
    struct redis_cmd cmd;
};

/* Fill 'c' for 'op' of 'ct' at 'wall_s', 'tokens' to charge, and
 * 'lease' (NULL: none) to take. */
static int
call_init(struct call *c, struct cluster *cl, const struct config_tenant *ct,
          const char *op, int64_t wall_s, uint64_t tokens,
          const struct tenant_lease *lease)
{
    const char *l[LEASE_ARGS];

    const uint64_t nums[7] = {
        ct->requests_per_minute, ct->tokens_per_minute, ct->tokens_per_day,
        ct->tokens_per_month,
        (uint64_t)tenant_period_end_s(TENANT_DAY, wall_s),
        (uint64_t)tenant_period_end_s(TENANT_MONTH, wall_s), tokens,
    };

    pthread_once(&script_once, script_init);
    if (cluster_key(cl, ct->name, "rate", c->rate, sizeof(c->rate)) != 0
        || cluster_key(cl, ct->name, "periods", c->periods,
                       sizeof(c->periods)) != 0
        || cluster_key(cl, ct->name, "tokens:", c->budgets,
                       sizeof(c->budgets)) != 0)
        return GW_EINVAL;
    for (size_t i = 0; i < 7; i++)
        snprintf(c->nums[i], sizeof(c->nums[i]), "%" PRIu64, nums[i]);
    c->argv[0] = c->rate;
    c->argv[1] = c->periods;
    c->argv[2] = op;
    c->argv[3] = "";
    for (size_t i = 0; i < 7; i++)
        c->argv[4 + i] = c->nums[i];
    c->argv[11] = c->budgets;
    c->cmd.script = &shared_script;
    c->cmd.nkeys = 2;
    c->cmd.argc = SHARED_ARGS;
    if (lease != NULL) {
        /* KEYS[3] goes among the keys, the rest after ARGV[10]. */
        tenant_lease_argv(lease, l);
        memmove(&c->argv[3], &c->argv[2],
                (SHARED_ARGS - 2) * sizeof(c->argv[0]));
        c->argv[2] = l[0];
        c->argv[SHARED_ARGS + 1] = l[1];
        c->argv[SHARED_ARGS + 2] = l[2];
        c->argv[SHARED_ARGS + 3] = l[3];
        c->cmd.nkeys = 3;
        c->cmd.argc = SHARED_ARGS + LEASE_ARGS;
    }
    c->cmd.argv = c->argv;
    c->cmd.argvlen = NULL;
    return 0;
}

int
tenant_shared_enter(struct cluster *cl, const struct gw_config *cfg,
                    size_t tenant, int64_t now_us, int64_t wall_s,
                    const struct tenant_shared_with *with,
                    enum tenant_limit *verdict, int *retry_after_s,
                    struct tenant_rate *rate, int64_t *left_ms)
{
    const struct config_tenant *ct = &cfg->tenants[tenant];
    struct redis_cmd cmds[1 + REDIS_PIPELINE_MAX];
    redisReply *replies[1 + REDIS_PIPELINE_MAX] = { NULL };
    struct tenant_lease *lease = with != NULL ? with->lease : NULL;
    struct tenant_shared_answer a;
    size_t n = 1, alive = cluster_alive(cl), held = 0;
    struct call c;
    struct share *s;
    int rc, wait = 0;
    int64_t t0 = gw_now_ms();

    *verdict = TENANT_ADMITTED;
    *retry_after_s = 0;
    *left_ms = 0;
    memset(&a, 0, sizeof(a));
    if (rate != NULL)
        memset(rate, 0, sizeof(*rate));
    rc = call_init(&c, cl, ct, "admit", wall_s, 0, lease);
    if (rc == 0) {
        cmds[0] = c.cmd;
        assert(with == NULL || with->n < REDIS_PIPELINE_MAX);
        if (with != NULL && with->n > 0) {
            memcpy(&cmds[1], with->cmds, with->n * sizeof(cmds[0]));
            n += with->n;
        }
        rc = cluster_pipeline(cl, CLUSTER_OP_ADMIT, cmds, n, replies, 0);
    }
    if (rc == 0)
        rc = tenant_shared_read(replies[0], &a);
    *left_ms = cfg->redis_timeout_ms - (gw_now_ms() - t0);
    if (with != NULL)
        for (size_t i = 0; i < with->n && i + 1 < n; i++) {
            with->replies[i] = rc == 0 ? replies[1 + i] : NULL;
            if (rc == 0)
                replies[1 + i] = NULL;
        }
    redis_replies_free(replies, n);
    if (lease != NULL)
        held = tenant_lease_settle(lease, rc == 0,
                                   rc == 0 && a.verdict == TENANT_ADMITTED);
    if (rc != 0 && cfg->on_error == ON_ERROR_DENY) {
        /* The beat tries again within 100 ms .. 5 s: a second is a
         * fair first guess. */
        *retry_after_s = 1;
        return GW_EUNAVAIL;
    }
    pthread_once(&shares_once, shares_init);
    gw_mutex_lock(&shares.lock);
    s = share_of_locked(ct->name, now_us);
    if (rc != 0 && lease != NULL && held > part(ct->max_inflight, alive)) {
        /* Redis gone: this gateway's share of max_inflight is full. */
        *verdict = TENANT_MAX_INFLIGHT;
        wait = 1;
    } else if (rc != 0) {
        *verdict = judge_share_locked(s, ct, alive, now_us, wall_s, &wait,
                                      rate);
    } else {
        note_seen_locked(s, a.used, wall_s);
        if (a.verdict == TENANT_ADMITTED)
            shadow_admit_locked(s, ct, alive, now_us);
    }
    gw_mutex_unlock(&shares.lock);
    if (rc == 0) {
        *verdict = a.verdict;
        wait = (int)(gw_us_to_s_ceil((uint64_t)a.wait_us) > INT_MAX
                     ? INT_MAX : gw_us_to_s_ceil((uint64_t)a.wait_us));
        if (rate != NULL && ct->requests_per_minute > 0) {
            rate->limit = ct->requests_per_minute;
            rate->remaining = a.remaining;
            rate->reset_us = a.reset_us;
        }
        if (rate != NULL && ct->tokens_per_minute > 0) {
            rate->tokens_limit = ct->tokens_per_minute;
            rate->tokens_remaining = a.tokens_remaining;
            rate->tokens_reset_us = a.tokens_reset_us;
        }
    }
    if (*verdict != TENANT_ADMITTED)
        *retry_after_s = wait < 1 ? 1 : wait;
    return 0;
}

void
tenant_shared_charge(struct cluster *cl, const struct gw_config *cfg,
                     size_t tenant, uint64_t tokens, int64_t now_us,
                     int64_t wall_s, int64_t left_ms)
{
    const struct config_tenant *ct;
    struct tenant_shared_answer a;
    redisReply *r = NULL;
    uint64_t pending, tpm;
    struct call c;
    struct share *s;
    int rc = GW_EUNAVAIL;

    if (cl == NULL || tenant >= cfg->num_tenants || tokens == 0)
        return;
    ct = &cfg->tenants[tenant];
    if (ct->tokens_per_minute == 0 && ct->tokens_per_day == 0
        && ct->tokens_per_month == 0)
        return;
    if (tokens > TENANT_MAX_CHARGE)
        tokens = TENANT_MAX_CHARGE;
    pthread_once(&shares_once, shares_init);
    gw_mutex_lock(&shares.lock);
    s = share_of_locked(ct->name, now_us);
    pending = s->pending;
    s->pending = 0;
    gw_mutex_unlock(&shares.lock);
    if (pending > TENANT_MAX_CHARGE - tokens)
        pending = TENANT_MAX_CHARGE - tokens;
    if (left_ms > 0 && call_init(&c, cl, ct, "charge", wall_s,
                                 tokens + pending, NULL) == 0) {
        rc = cluster_pipeline(cl, CLUSTER_OP_CHARGE, &c.cmd, 1, &r, left_ms);
        if (rc == 0)
            rc = tenant_shared_read(r, &a);
        redis_replies_free(&r, 1);
    }
    tpm = part(ct->tokens_per_minute, cluster_alive(cl));
    gw_mutex_lock(&shares.lock);
    s = share_of_locked(ct->name, now_us);
    if (tpm > 0) {
        tenant_bucket_charge(&s->tokens, tpm, tokens, now_us);
        /* Redis judged: its share keeps no debt; else a day's at most. */
        if (rc == 0 && s->tokens.credit < 0)
            s->tokens.credit = 0;
        floor_debt(&s->tokens, tpm);
    }
    if (rc == 0) {
        note_seen_locked(s, a.used, wall_s);
        for (size_t k = 0; k < 2; k++)
            memset(&s->unsent[k], 0, sizeof(s->unsent[k]));
    } else {
        for (size_t k = 0; k < 2; k++)
            tenant_period_add(&s->unsent[k], kinds[k], wall_s, tokens);
        /* Each term is at most 2^34: the sum cannot wrap. */
        s->pending += tokens + pending;
        if (s->pending > TENANT_MAX_CHARGE)
            s->pending = TENANT_MAX_CHARGE;
    }
    gw_mutex_unlock(&shares.lock);
}
