/* SPDX-License-Identifier: MIT */
/*
 * tenant.c - tenants: who, limits, bill (tenant.h).
 */
#include "base/tenant.h"

#include <assert.h>
#include <inttypes.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <mbedtls/platform_util.h>
#include <mbedtls/sha256.h>

#include "alloc.h"
#include "base/config.h"
#include "base/tenant_impl.h"
#include "prom.h"
#include "util.h"

/*
 * Model rows per tenant; the rest is billed in one more row.  Its label
 * has a blank, which a client's model name cannot (route.c turns blanks
 * into '_'), so the two never meet in one series.
 */
#define TENANT_MAX_MODELS 32
#define OTHER_MODEL "(other models)"

/* Admissions are counted per second over the last minute (status view). */
#define MINUTE_S 60

/* ---- who ---- */

/*
 * The SHA-256 of the key the request presents as "Authorization: Bearer
 * KEY" into 'd'; 0 when it presents none.
 */
static int
bearer_digest(const struct http_request *r,
              unsigned char d[CONFIG_KEY_DIGEST_LEN])
{
    const struct http_header *h = http_find_header(r, "Authorization");

    if (h == NULL || h->value_len < 8 || !gw_strieq(h->value, 7, "Bearer "))
        return 0;
    mbedtls_sha256_ret((const unsigned char *)h->value + 7,
                       h->value_len - 7, d, 0);
    return 1;
}

/*
 * Is 'd' one of the 'n' digests at 'keys'?  Every digest is compared,
 * all the way, with no early exit: the time says nothing of which key,
 * or how much of one, matched.
 */
static int
digest_in(const unsigned char d[CONFIG_KEY_DIGEST_LEN],
          const unsigned char (*keys)[CONFIG_KEY_DIGEST_LEN], size_t n)
{
    unsigned char all = 1;      /* stays 1 while no key matched */

    for (size_t k = 0; k < n; k++) {
        unsigned char diff = 0;

        for (size_t i = 0; i < CONFIG_KEY_DIGEST_LEN; i++)
            diff |= (unsigned char)(d[i] ^ keys[k][i]);
        all &= (unsigned char)(diff != 0);
    }
    return !all;
}

size_t
tenant_identify(const struct gw_config *cfg, const struct http_request *r)
{
    unsigned char d[CONFIG_KEY_DIGEST_LEN];
    size_t found = CONFIG_MAX_TENANTS;

    if (cfg->num_tenants == 0 || !bearer_digest(r, d))
        return CONFIG_MAX_TENANTS;
    for (size_t t = 0; t < cfg->num_tenants; t++) {
        const struct config_tenant *ct = &cfg->tenants[t];
        size_t hit = (size_t)digest_in(d, ct->key_sha256, ct->num_keys);

        /* Branch-free select; keys are unique across tenants. */
        found ^= (found ^ t) & ((size_t)0 - hit);
    }
    mbedtls_platform_zeroize(d, sizeof(d));
    return found;
}

int
tenant_is_admin(const struct gw_config *cfg, const struct http_request *r)
{
    unsigned char d[CONFIG_KEY_DIGEST_LEN];
    int yes;

    if (cfg->num_admin_keys == 0 || !bearer_digest(r, d))
        return 0;
    yes = digest_in(d, cfg->admin_key_sha256, cfg->num_admin_keys);
    mbedtls_platform_zeroize(d, sizeof(d));
    return yes;
}

const char *
tenant_name(const struct gw_config *cfg, size_t tenant)
{
    return tenant < cfg->num_tenants ? cfg->tenants[tenant].name
                                     : TENANT_DEFAULT_NAME;
}

/* ---- state ---- */

struct model_bill {
    char model[64];
    uint64_t prompt, completion;
};

/* Requests answered with one status; status 0: the others, past
 * TENANT_MAX_STATUSES. */
struct status_count {
    int status;
    uint64_t n;
};

struct tenant_entry {
    char name[TENANT_NAME_MAX];
    struct status_count answered[TENANT_MAX_STATUSES + 1];
    size_t nanswered;
    uint64_t inflight;
    uint64_t credit;            /* the rate bucket (take_token); valid
                                   once 'filled' */
    int64_t refilled_us;
    int filled;
    uint64_t rejected[TENANT_LIMITS];   /* by verdict - 1 */
    struct tenant_bucket tokens;        /* tokens_per_minute */
    struct tenant_period day, month;    /* every tenant's use */
    uint64_t charged[2];        /* tokens charged: from usage, counted */
    uint64_t saved;             /* tokens followers got for nothing */
    uint64_t cache_saved;       /* tokens cache hits got for nothing */
    uint64_t followers;         /* requests that followed a flight */
    /* Its calls in the admission queue (tenants_note_queue()). */
    uint64_t queued;            /* waiting now */
    uint64_t waits;             /* that waited, ever */
    uint64_t wait_ms;           /* their waits' sum */
    uint64_t timeouts;          /* no slot within queue_timeout */
    uint64_t shed;              /* refused at once: sheddable */
    struct model_bill bills[TENANT_MAX_MODELS + 1];  /* + "_other" */
    size_t nbills;
    /* Admitted requests per second: second minute_s[i] counted
     * minute[i], i = second % MINUTE_S. */
    int64_t minute_s[MINUTE_S];
    uint64_t minute[MINUTE_S];
    struct tenant_usage usage;  /* the fleet's share (tenant_usage.c) */
};

struct tenant_usage *
tenant_entry_usage(struct tenant_entry *e, const char **name)
{
    *name = e->name;
    return &e->usage;
}

struct tenants *
tenants_new(void)
{
    struct tenants *ts = gw_calloc(1, sizeof(*ts));

    if (ts != NULL)
        gw_mutex_init(&ts->lock);
    return ts;
}

void
tenants_free(struct tenants *ts)
{
    if (ts == NULL)
        return;
    for (size_t i = 0; i < ts->n; i++)
        gw_free(ts->v[i]);
    gw_free(ts->v);
    gw_mutex_destroy(&ts->lock);
    gw_free(ts);
}

/* The entry called 'name', or NULL: none yet.  Locked. */
static struct tenant_entry *
find_locked(struct tenants *ts, const char *name)
{
    assert(gw_mutex_held(&ts->lock));
    for (size_t i = 0; i < ts->n; i++)
        if (strcmp(ts->v[i]->name, name) == 0)
            return ts->v[i];
    return NULL;
}

/* The entry called 'name', made if new; NULL on ENOMEM.  Locked. */
static struct tenant_entry *
entry_of(struct tenants *ts, const char *name)
{
    struct tenant_entry *e = find_locked(ts, name);

    if (e != NULL)
        return e;
    if (ts->n == ts->cap) {
        size_t cap = ts->cap == 0 ? 8 : ts->cap * 2;
        struct tenant_entry **v = gw_realloc(ts->v, cap * sizeof(*v));

        if (v == NULL)
            return NULL;
        ts->v = v;
        ts->cap = cap;
    }
    e = gw_calloc(1, sizeof(*e));
    if (e == NULL)
        return NULL;
    snprintf(e->name, sizeof(e->name), "%s", name);
    tenant_period_init(&e->day);
    tenant_period_init(&e->month);
    ts->v[ts->n++] = e;
    return e;
}

/*
 * The requests_per_minute bucket, in integers so that no refill is lost
 * or rounded: a token is TOKEN_CREDIT units of credit (the microseconds
 * in a minute), and each microsecond adds 'rpm' units.  So a bucket of
 * 'rpm' tokens fills in exactly a minute, and the fraction of a token
 * that a short wait refills is kept for the next request, however many
 * arrive within one millisecond.  With rpm <= CONFIG_MAX_REQUESTS_PER_
 * MINUTE (1e9) a full bucket, rpm * TOKEN_CREDIT, is below 2^56, and a
 * refill adds at most as much again: no overflow.
 */
#define TOKEN_CREDIT UINT64_C(60000000)
_Static_assert(CONFIG_MAX_REQUESTS_PER_MINUTE
               <= UINT64_MAX / TOKEN_CREDIT / 2, "the bucket's units");

/* Refill the bucket of 'e' for a limit of 'rpm' up to 'now_us'.  Locked. */
static void
refill(struct tenant_entry *e, uint64_t rpm, int64_t now_us)
{
    uint64_t cap = rpm * TOKEN_CREDIT;

    if (!e->filled) {
        e->filled = 1;
        e->credit = cap;
    } else if (now_us > e->refilled_us) {
        /* A minute refills all of it: clamp before multiplying. */
        uint64_t dt = (uint64_t)(now_us - e->refilled_us);

        e->credit += (dt < TOKEN_CREDIT ? dt : TOKEN_CREDIT) * rpm;
    }
    if (now_us > e->refilled_us)
        e->refilled_us = now_us;
    if (e->credit > cap)
        e->credit = cap;        /* also when a reload lowered the limit */
}

/*
 * Refill the bucket of 'e' for a limit of 'rpm' at 'now_us' and take a
 * token if a whole one is there.  Returns 0 when one was taken, else the
 * whole seconds, rounded up and at least 1, until one is due.  Locked.
 */
static int
take_token(struct tenant_entry *e, uint64_t rpm, int64_t now_us)
{
    uint64_t wait_us;

    refill(e, rpm, now_us);
    /* The verdict comes from the count alone, never from the wait. */
    if (e->credit >= TOKEN_CREDIT) {
        e->credit -= TOKEN_CREDIT;
        return 0;
    }
    wait_us = (TOKEN_CREDIT - e->credit + rpm - 1) / rpm;
    return (int)gw_us_to_s_ceil(wait_us);
}

/* a + b, or UINT64_MAX: a counter that stops rather than wraps to 0. */
static uint64_t
add_sat(uint64_t a, uint64_t b)
{
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

/* One more admission of 'e' in the second of 'now_us'. */
static void
count_second_locked(struct tenants *ts, struct tenant_entry *e,
                    int64_t now_us)
{
    int64_t sec = now_us / 1000000;
    size_t i = (size_t)(sec % MINUTE_S);

    assert(gw_mutex_held(&ts->lock));
    if (e->minute_s[i] != sec) {
        e->minute_s[i] = sec;
        e->minute[i] = 0;
    }
    e->minute[i]++;
}

/* Admissions of 'e' in the last MINUTE_S seconds, this one included. */
static uint64_t
last_minute_locked(struct tenants *ts, const struct tenant_entry *e,
                   int64_t now_us)
{
    int64_t sec = now_us / 1000000;
    uint64_t n = 0;

    assert(gw_mutex_held(&ts->lock));
    for (size_t i = 0; i < MINUTE_S; i++)
        if (e->minute[i] > 0 && sec - e->minute_s[i] < MINUTE_S)
            n += e->minute[i];
    return n;
}

_Static_assert(TENANT_QUOTA_MONTH - TENANT_MAX_INFLIGHT + 1 == TENANT_LIMITS,
               "a refusal's row");

const char *
tenant_limit_name(enum tenant_limit verdict)
{
    switch (verdict) {
    case TENANT_MAX_INFLIGHT: return "max_inflight";
    case TENANT_RATE: return "requests_per_minute";
    case TENANT_TOKENS: return "tokens_per_minute";
    case TENANT_QUOTA_DAY: return "tokens_per_day";
    case TENANT_QUOTA_MONTH: return "tokens_per_month";
    case TENANT_ADMITTED:
    case TENANT_NOMEM:
        break;
    }
    return "none";
}

/* Whole seconds, rounded up, of 'us'; at least 1, at most INT_MAX. */
static int
wait_s(uint64_t us)
{
    uint64_t s = gw_us_to_s_ceil(us);

    return s < 1 ? 1 : s > INT_MAX ? INT_MAX : (int)s;
}

/*
 * Is a token budget of 'ct' spent at 'wall_s'?  TENANT_ADMITTED, or the
 * verdict with *wait the seconds until every spent one has room again:
 * the latest end of a spent period, which the verdict names (a spent
 * month outlasts a spent day; a tie names the day).  Locked.
 */
static enum tenant_limit
check_budgets_locked(struct tenants *ts, const struct tenant_entry *e,
                     const struct config_tenant *ct, int64_t wall_s,
                     int *wait)
{
    static const enum tenant_period_kind kinds[2] = { TENANT_DAY,
                                                      TENANT_MONTH };
    enum tenant_limit verdict = TENANT_ADMITTED;
    int64_t end = 0;

    assert(gw_mutex_held(&ts->lock));
    for (size_t k = 0; k < 2; k++) {
        uint64_t budget = k == 0 ? ct->tokens_per_day : ct->tokens_per_month;
        const struct tenant_period *p = k == 0 ? &e->day : &e->month;
        int64_t ends = tenant_period_end_s(kinds[k], wall_s);

        if (budget > 0 && tenant_period_used(p, kinds[k], wall_s) >= budget
            && (verdict == TENANT_ADMITTED || ends > end)) {
            end = ends;
            verdict = k == 0 ? TENANT_QUOTA_DAY : TENANT_QUOTA_MONTH;
        }
    }
    if (verdict != TENANT_ADMITTED)
        *wait = wait_s((uint64_t)(end - wall_s) * 1000000);
    return verdict;
}

/*
 * The verdict of 'ct''s limits on 'e' at the given times, *wait set for
 * a refusal.  The checks that take nothing come first, so that a
 * refusal never costs a request of the requests_per_minute bucket.
 * Locked.
 */
static enum tenant_limit
judge_locked(struct tenants *ts, struct tenant_entry *e,
             const struct config_tenant *ct, int64_t now_us, int64_t wall_s,
             int inflight_only, int *wait)
{
    enum tenant_limit verdict;
    uint64_t us;

    assert(gw_mutex_held(&ts->lock));
    if (ct == NULL)
        return TENANT_ADMITTED;
    if (ct->max_inflight > 0 && e->inflight >= ct->max_inflight) {
        /* No clock says when one ends: a second is a polite guess. */
        *wait = 1;
        return TENANT_MAX_INFLIGHT;
    }
    if (inflight_only)
        return TENANT_ADMITTED;     /* the rest is Redis's (shared) */
    verdict = check_budgets_locked(ts, e, ct, wall_s, wait);
    if (verdict != TENANT_ADMITTED)
        return verdict;
    if (ct->tokens_per_minute > 0
        && (us = tenant_bucket_wait_us(&e->tokens, ct->tokens_per_minute,
                                       now_us)) > 0) {
        *wait = wait_s(us);
        return TENANT_TOKENS;
    }
    if (ct->requests_per_minute > 0
        && (*wait = take_token(e, ct->requests_per_minute, now_us)) != 0)
        return TENANT_RATE;
    return TENANT_ADMITTED;
}

/* The buckets of 'e' for 'ct' at 'now_us' into 'rate'.  Locked. */
static void
rate_of_locked(struct tenants *ts, struct tenant_entry *e,
               const struct config_tenant *ct, int64_t now_us,
               struct tenant_rate *rate)
{
    uint64_t rpm = ct != NULL ? ct->requests_per_minute : 0;
    uint64_t tpm = ct != NULL ? ct->tokens_per_minute : 0;

    assert(gw_mutex_held(&ts->lock));
    if (rpm > 0) {
        refill(e, rpm, now_us);         /* a no-op after take_token() */
        rate->limit = rpm;
        rate->remaining = e->credit / TOKEN_CREDIT;
        rate->reset_us = (int64_t)((rpm * TOKEN_CREDIT - e->credit + rpm - 1)
                                   / rpm);
    }
    if (tpm > 0) {
        tenant_bucket_refill(&e->tokens, tpm, now_us);
        rate->tokens_limit = tpm;
        rate->tokens_remaining = tenant_bucket_remaining(&e->tokens);
        rate->tokens_reset_us = (int64_t)tenant_bucket_reset_us(&e->tokens,
                                                                 tpm);
    }
}

/* tenants_enter(), or with 'inflight_only' tenants_enter_inflight(). */
static enum tenant_limit
enter(struct tenants *ts, const struct gw_config *cfg, size_t tenant,
      int inflight_only, int64_t now_us, int64_t wall_s,
      struct tenant_entry **out, int *retry_after_s, struct tenant_rate *rate)
{
    const struct config_tenant *ct = tenant < cfg->num_tenants
                                     ? &cfg->tenants[tenant] : NULL;
    enum tenant_limit verdict = TENANT_NOMEM;
    struct tenant_entry *e;
    int wait = 0;

    *out = NULL;
    *retry_after_s = 0;
    if (rate != NULL)
        memset(rate, 0, sizeof(*rate));
    gw_mutex_lock(&ts->lock);
    e = entry_of(ts, tenant_name(cfg, tenant));
    if (e != NULL)
        verdict = judge_locked(ts, e, ct, now_us, wall_s, inflight_only,
                               &wait);
    if (verdict == TENANT_ADMITTED) {
        e->inflight++;
        count_second_locked(ts, e, now_us);
        *out = e;
    } else if (verdict != TENANT_NOMEM) {
        e->rejected[verdict - TENANT_MAX_INFLIGHT]++;
    }
    if (rate != NULL && e != NULL && !inflight_only)
        rate_of_locked(ts, e, ct, now_us, rate);
    gw_mutex_unlock(&ts->lock);
    *retry_after_s = wait < 1 && verdict != TENANT_ADMITTED ? 1 : wait;
    return verdict;
}

enum tenant_limit
tenants_enter(struct tenants *ts, const struct gw_config *cfg, size_t tenant,
              int64_t now_us, int64_t wall_s, struct tenant_entry **out,
              int *retry_after_s, struct tenant_rate *rate)
{
    return enter(ts, cfg, tenant, 0, now_us, wall_s, out, retry_after_s,
                 rate);
}

enum tenant_limit
tenants_enter_inflight(struct tenants *ts, const struct gw_config *cfg,
                       size_t tenant, int64_t now_us, int64_t wall_s,
                       struct tenant_entry **out, int *retry_after_s,
                       struct tenant_rate *rate)
{
    return enter(ts, cfg, tenant, 1, now_us, wall_s, out, retry_after_s,
                 rate);
}

void
tenants_refuse(struct tenants *ts, struct tenant_entry *e,
               enum tenant_limit verdict, int64_t now_us)
{
    int64_t sec = now_us / 1000000;
    size_t i = (size_t)(sec % MINUTE_S);

    if (e == NULL)
        return;
    gw_mutex_lock(&ts->lock);
    e->inflight--;
    /* Its second's count, unless a new second began since. */
    if (e->minute_s[i] == sec && e->minute[i] > 0)
        e->minute[i]--;
    if (verdict >= TENANT_MAX_INFLIGHT && verdict <= TENANT_QUOTA_MONTH)
        e->rejected[verdict - TENANT_MAX_INFLIGHT]++;
    gw_mutex_unlock(&ts->lock);
}

void
tenants_charge(struct tenants *ts, const struct gw_config *cfg, size_t tenant,
               struct tenant_entry *e, uint64_t tokens, int counted,
               int64_t now_us, int64_t wall_s)
{
    const struct config_tenant *ct = tenant < cfg->num_tenants
                                     ? &cfg->tenants[tenant] : NULL;

    if (e == NULL)
        return;
    if (tokens > TENANT_MAX_CHARGE)
        tokens = TENANT_MAX_CHARGE;
    gw_mutex_lock(&ts->lock);
    if (ct != NULL && ct->tokens_per_minute > 0)
        tenant_bucket_charge(&e->tokens, ct->tokens_per_minute, tokens,
                             now_us);
    tenant_period_add(&e->day, TENANT_DAY, wall_s, tokens);
    tenant_period_add(&e->month, TENANT_MONTH, wall_s, tokens);
    e->charged[counted != 0] = add_sat(e->charged[counted != 0], tokens);
    gw_mutex_unlock(&ts->lock);
}

void
tenants_leave(struct tenants *ts, struct tenant_entry *e)
{
    if (e == NULL)
        return;
    gw_mutex_lock(&ts->lock);
    e->inflight--;
    gw_mutex_unlock(&ts->lock);
}

/* The bill row of 'model' in 'e' (OTHER_MODEL once the rows are full). */
static struct model_bill *
bill_of(struct tenant_entry *e, const char *model)
{
    size_t i;

    for (i = 0; i < e->nbills; i++)
        if (strcmp(e->bills[i].model, model) == 0)
            return &e->bills[i];
    if (e->nbills >= TENANT_MAX_MODELS) {
        if (e->nbills > TENANT_MAX_MODELS)
            return &e->bills[TENANT_MAX_MODELS];
        model = OTHER_MODEL;
    }
    snprintf(e->bills[e->nbills].model, sizeof(e->bills[e->nbills].model),
             "%s", model);
    return &e->bills[e->nbills++];
}

void
tenants_bill(struct tenants *ts, struct tenant_entry *e, const char *model,
             uint64_t prompt, uint64_t completion, int saved)
{
    struct model_bill *b;

    if (e == NULL)
        return;
    gw_mutex_lock(&ts->lock);
    b = bill_of(e, model[0] != '\0' ? model : "-");
    b->prompt = add_sat(b->prompt, prompt);
    b->completion = add_sat(b->completion, completion);
    if (saved == TENANT_SAVED_CACHE)
        e->cache_saved = add_sat(e->cache_saved, add_sat(prompt,
                                                         completion));
    else if (saved)
        e->saved = add_sat(e->saved, add_sat(prompt, completion));
    tenant_usage_add(&e->usage, TENANT_USAGE_PROMPT, prompt);
    tenant_usage_add(&e->usage, TENANT_USAGE_COMPLETION, completion);
    if (saved == TENANT_SAVED_COALESCE)
        tenant_usage_add(&e->usage, TENANT_USAGE_SAVED,
                         add_sat(prompt, completion));
    gw_mutex_unlock(&ts->lock);
}

void
tenants_note_queue(struct tenants *ts, const struct gw_config *cfg,
                   size_t tenant, enum tenant_queue what, int64_t wait_ms)
{
    struct tenant_entry *e;

    if (ts == NULL)
        return;
    gw_mutex_lock(&ts->lock);
    e = entry_of(ts, tenant_name(cfg, tenant));
    if (e == NULL)
        goto out;
    switch (what) {
    case TENANT_QUEUE_ENTERED:
        e->queued++;
        break;
    case TENANT_QUEUE_LEFT:
        if (e->queued > 0)      /* its entering was counted (memory) */
            e->queued--;
        e->waits++;
        e->wait_ms += wait_ms > 0 ? (uint64_t)wait_ms : 0;
        break;
    case TENANT_QUEUE_TIMED_OUT:
        e->timeouts++;
        break;
    case TENANT_QUEUE_SHED:
        e->shed++;
        break;
    }

out:
    gw_mutex_unlock(&ts->lock);
}

void
tenants_note_follower(struct tenants *ts, struct tenant_entry *e)
{
    if (e == NULL)
        return;
    gw_mutex_lock(&ts->lock);
    e->followers++;
    gw_mutex_unlock(&ts->lock);
}

/* The row of 'status' in 'e', or e->nanswered.  Locked. */
static size_t
answered_row(const struct tenant_entry *e, int status)
{
    size_t i;

    for (i = 0; i < e->nanswered && e->answered[i].status != status; i++)
        ;
    return i;
}

void
tenants_count_request(struct tenants *ts, const struct gw_config *cfg,
                      size_t tenant, int status)
{
    struct tenant_entry *e;
    size_t i;

    if (status < 100 || status > 599)
        status = 0;
    gw_mutex_lock(&ts->lock);
    e = entry_of(ts, tenant_name(cfg, tenant));
    if (e == NULL)
        goto out;
    i = answered_row(e, status);
    if (i == e->nanswered && i >= TENANT_MAX_STATUSES) {
        /* Full: the others' row, which alone may go past the bound (so
         * with none yet, nanswered is the bound and it fits). */
        status = 0;
        i = answered_row(e, 0);
    }
    if (i == e->nanswered) {
        e->answered[i].status = status;
        e->nanswered++;
    }
    e->answered[i].n++;
    tenant_usage_add(&e->usage, TENANT_USAGE_REQUESTS, 1);

out:
    gw_mutex_unlock(&ts->lock);
}

/* The [tenant] of 'cfg' called 'name', or NULL (a reload removed it). */
static const struct config_tenant *
config_of(const struct gw_config *cfg, const char *name)
{
    for (size_t t = 0; t < cfg->num_tenants; t++)
        if (strcmp(cfg->tenants[t].name, name) == 0)
            return &cfg->tenants[t];
    return NULL;
}

int
tenants_status(struct tenants *ts, const struct gw_config *cfg,
               int64_t now_us, int64_t wall_s, struct tenant_status **out,
               size_t *n)
{
    struct tenant_status *v = NULL;
    int rc = 0;

    *out = NULL;
    *n = 0;
    gw_mutex_lock(&ts->lock);
    /* An allocation, no I/O: a few hundred bytes per tenant. */
    if (ts->n > 0 && (v = gw_calloc(ts->n, sizeof(*v))) == NULL) {
        rc = GW_ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < ts->n; i++) {
        struct tenant_entry *e = ts->v[i];
        struct tenant_status *st = &v[i];
        const struct config_tenant *ct = config_of(cfg, e->name);

        memcpy(st->name, e->name, sizeof(st->name));
        st->inflight = e->inflight;
        st->last_minute = last_minute_locked(ts, e, now_us);
        memcpy(st->rejected, e->rejected, sizeof(st->rejected));
        if (ct != NULL && ct->tokens_per_minute > 0) {
            tenant_bucket_refill(&e->tokens, ct->tokens_per_minute, now_us);
            st->tokens_bucket = 1;
            st->tokens_credit = e->tokens.credit / TENANT_TOKEN_UNITS;
        }
        st->tokens_day = tenant_period_used(&e->day, TENANT_DAY, wall_s);
        st->tokens_month = tenant_period_used(&e->month, TENANT_MONTH,
                                              wall_s);
        for (size_t b = 0; b < e->nbills; b++) {
            st->prompt_tokens = add_sat(st->prompt_tokens,
                                        e->bills[b].prompt);
            st->completion_tokens = add_sat(st->completion_tokens,
                                            e->bills[b].completion);
        }
        st->saved = e->saved;
        st->cache_saved = e->cache_saved;
        tenant_usage_show(&e->usage, now_us, st);
    }
    *out = v;
    *n = ts->n;

out:
    gw_mutex_unlock(&ts->lock);
    return rc;
}

/* One family with a sample per tenant: the uint64_t at 'offset'.  Locked. */
static void
per_tenant(const struct tenants *ts, struct prom *w, const char *name,
           enum prom_type type, const char *help, size_t offset)
{
    prom_family(w, name, type, help);
    for (size_t i = 0; i < ts->n; i++) {
        const struct prom_label l = { "tenant", ts->v[i]->name };

        prom_uint(w, &l, 1,
                  *(const uint64_t *)((const char *)ts->v[i] + offset));
    }
}

/* What a family of cfg's tenants shows of each (their index 't'). */
enum shown {
    SHOWN_MAX_INFLIGHT,         /* the configuration's ... */
    SHOWN_RPM,
    SHOWN_TPM,
    SHOWN_TPD,
    SHOWN_TPMONTH,
    SHOWN_FOLLOWERS,            /* the entry's ... */
    SHOWN_QUEUED,
    SHOWN_WAITS,
    SHOWN_WAIT_S,
    SHOWN_TIMEOUTS,
    SHOWN_SHED,
};

/*
 * A family with a sample for each of cfg's tenants, then (with
 * 'and_default') the default one, in the configuration's order, whether
 * or not it was seen yet (zero then): the configuration's limits, or
 * the count kept under its name.  With 'priority', labelled with the
 * tenant's priority too, as the queue's order is (pool.h).  Locked.
 */
static void
per_configured(struct tenants *ts, const struct gw_config *cfg,
               struct prom *w, const char *name, enum prom_type type,
               const char *help, enum shown what, int and_default,
               int priority)
{
    assert(gw_mutex_held(&ts->lock));
    prom_family(w, name, type, help);
    /* A [tenant default] is that name's row: the implicit one would be
     * a second series with the same labels (and the same entry). */
    for (size_t i = 0; i < cfg->num_tenants && and_default; i++)
        if (strcmp(cfg->tenants[i].name, TENANT_DEFAULT_NAME) == 0)
            and_default = 0;
    for (size_t i = 0; i < cfg->num_tenants + (and_default ? 1 : 0); i++) {
        size_t t = i < cfg->num_tenants ? i : CONFIG_MAX_TENANTS;
        const struct config_tenant *ct = t < cfg->num_tenants
                                         ? &cfg->tenants[t] : NULL;
        const struct tenant_entry *e = find_locked(ts, tenant_name(cfg, t));
        char prio[24];
        const struct prom_label l[] = { { "tenant", tenant_name(cfg, t) },
                                        { "priority", prio } };
        uint64_t v = 0;

        snprintf(prio, sizeof(prio), "%" PRId64,
                 ct != NULL ? ct->priority : 0);
        switch (what) {
        case SHOWN_MAX_INFLIGHT: v = ct->max_inflight; break;
        case SHOWN_RPM: v = ct->requests_per_minute; break;
        case SHOWN_TPM: v = ct->tokens_per_minute; break;
        case SHOWN_TPD: v = ct->tokens_per_day; break;
        case SHOWN_TPMONTH: v = ct->tokens_per_month; break;
        case SHOWN_FOLLOWERS: v = e != NULL ? e->followers : 0; break;
        case SHOWN_QUEUED: v = e != NULL ? e->queued : 0; break;
        case SHOWN_WAITS: v = e != NULL ? e->waits : 0; break;
        case SHOWN_WAIT_S: v = e != NULL ? e->wait_ms : 0; break;
        case SHOWN_TIMEOUTS: v = e != NULL ? e->timeouts : 0; break;
        case SHOWN_SHED: v = e != NULL ? e->shed : 0; break;
        }
        if (what == SHOWN_WAIT_S)
            prom_double(w, l, priority ? 2 : 1, (double)v * 1e-3);
        else
            prom_uint(w, l, priority ? 2 : 1, v);
    }
}

/* The families of cfg's tenants (tenants_render_metrics()).  Locked. */
static void
render_configured(struct tenants *ts, const struct gw_config *cfg,
                  struct prom *w)
{
    static const struct {
        const char *name;
        enum prom_type type;
        const char *help;
        enum shown what;
        int and_default, priority;
    } families[] = {
        { "infergw_tenant_max_inflight", PROM_GAUGE, "[tenant] "
          "max_inflight: requests under way at once; 0 none.",
          SHOWN_MAX_INFLIGHT, 0, 0 },
        { "infergw_tenant_requests_per_minute_limit", PROM_GAUGE,
          "[tenant] requests_per_minute; 0 none.", SHOWN_RPM, 0, 0 },
        { "infergw_tenant_tokens_per_minute_limit", PROM_GAUGE,
          "[tenant] tokens_per_minute; 0 none.", SHOWN_TPM, 0, 0 },
        { "infergw_tenant_tokens_per_day_limit", PROM_GAUGE,
          "[tenant] tokens_per_day, a budget per UTC day; 0 none.",
          SHOWN_TPD, 0, 0 },
        { "infergw_tenant_tokens_per_month_limit", PROM_GAUGE,
          "[tenant] tokens_per_month, a budget per UTC month; 0 none.",
          SHOWN_TPMONTH, 0, 0 },
        { "infergw_coalesce_followers_by_tenant_total", PROM_COUNTER,
          "Followers by tenant, for billing.", SHOWN_FOLLOWERS, 1, 0 },
        { "infergw_tenant_queued", PROM_GAUGE, "Calls of the tenant "
          "waiting in the gateway's queue now.", SHOWN_QUEUED, 1, 1 },
        { "infergw_tenant_queue_waits_total", PROM_COUNTER, "Calls of "
          "the tenant that waited in the queue.", SHOWN_WAITS, 1, 1 },
        { "infergw_tenant_queue_wait_seconds_total", PROM_COUNTER,
          "Time the tenant's calls spent in the queue.", SHOWN_WAIT_S,
          1, 1 },
        { "infergw_tenant_queue_timeouts_total", PROM_COUNTER, "Calls of "
          "the tenant that got no slot within queue_timeout (503).",
          SHOWN_TIMEOUTS, 1, 1 },
        { "infergw_tenant_shed_total", PROM_COUNTER, "Requests of a "
          "sheddable tenant (priority < 0) answered 429 at once: every "
          "upstream for them was full.", SHOWN_SHED, 1, 1 },
    };

    for (size_t k = 0; k < GW_ARRAY_LEN(families); k++)
        per_configured(ts, cfg, w, families[k].name, families[k].type,
                       families[k].help, families[k].what,
                       families[k].and_default, families[k].priority);
}

/*
 * The token families of every tenant seen: what its calls were charged
 * (by source) and what it used in the day and month of 'wall_s'.
 * Locked.
 */
static void
render_charged(struct tenants *ts, struct prom *w, int64_t wall_s)
{
    static const char *const sources[2] = { "usage", "counted" };

    assert(gw_mutex_held(&ts->lock));
    prom_family(w, "infergw_tenant_tokens_charged_total", PROM_COUNTER,
                "Tokens charged to the tenant's token limits, by source: "
                "the response's usage, or the gateway's count where it "
                "had none.");
    for (size_t i = 0; i < ts->n; i++)
        for (size_t k = 0; k < 2; k++) {
            const struct prom_label lv[] = { { "tenant", ts->v[i]->name },
                                             { "source", sources[k] } };

            prom_uint(w, lv, GW_ARRAY_LEN(lv), ts->v[i]->charged[k]);
        }
    prom_family(w, "infergw_tenant_tokens_used", PROM_GAUGE,
                "Tokens charged to the tenant in the current UTC day and "
                "month (its tokens_per_day and tokens_per_month "
                "budgets).");
    for (size_t i = 0; i < ts->n; i++) {
        const struct tenant_entry *e = ts->v[i];
        const struct prom_label day[] = { { "tenant", e->name },
                                          { "period", "day" } };
        const struct prom_label month[] = { { "tenant", e->name },
                                            { "period", "month" } };

        prom_uint(w, day, 2, tenant_period_used(&e->day, TENANT_DAY,
                                                wall_s));
        prom_uint(w, month, 2, tenant_period_used(&e->month, TENANT_MONTH,
                                                  wall_s));
    }
}

int
tenants_render_metrics(struct tenants *ts, const struct gw_config *cfg,
                       int64_t wall_s, struct buf *out)
{
    static const char *const kinds[2] = { "prompt", "completion" };
    struct prom w;

    prom_init(&w, out);
    gw_mutex_lock(&ts->lock);
    render_configured(ts, cfg, &w);
    per_tenant(ts, &w, "infergw_tenant_requests_inflight", PROM_GAUGE,
               "Requests under way, by tenant.",
               offsetof(struct tenant_entry, inflight));
    prom_family(&w, "infergw_tenant_rejected_total", PROM_COUNTER,
                "Requests refused with 429 by a tenant limit.");
    for (size_t i = 0; i < ts->n; i++)
        for (size_t l = 0; l < TENANT_LIMITS; l++) {
            const struct prom_label lv[] = {
                { "tenant", ts->v[i]->name },
                { "limit", tenant_limit_name((enum tenant_limit)
                                             (TENANT_MAX_INFLIGHT + l)) },
            };

            prom_uint(&w, lv, GW_ARRAY_LEN(lv), ts->v[i]->rejected[l]);
        }
    prom_family(&w, "infergw_tenant_requests_total", PROM_COUNTER,
                "Requests of the tenant's routes, refused ones too, by "
                "tenant and status (\"default\": without a tenant's "
                "key).");
    for (size_t i = 0; i < ts->n; i++)
        for (size_t k = 0; k < ts->v[i]->nanswered; k++) {
            const struct status_count *a = &ts->v[i]->answered[k];
            char status[16];
            const struct prom_label lv[] = { { "tenant", ts->v[i]->name },
                                             { "status", status } };

            if (a->status == 0)
                snprintf(status, sizeof(status), "other");
            else
                snprintf(status, sizeof(status), "%d", a->status);
            prom_uint(&w, lv, GW_ARRAY_LEN(lv), a->n);
        }
    prom_family(&w, "infergw_tokens_total", PROM_COUNTER,
                "Tokens in the usage each client received, by tenant, "
                "model and kind.");
    for (size_t i = 0; i < ts->n; i++) {
        const struct tenant_entry *e = ts->v[i];

        for (size_t b = 0; b < e->nbills; b++)
            for (size_t k = 0; k < 2; k++) {
                const struct prom_label lv[] = {
                    { "tenant", e->name },
                    { "model", e->bills[b].model },
                    { "kind", kinds[k] },
                };

                prom_uint(&w, lv, GW_ARRAY_LEN(lv),
                          k == 0 ? e->bills[b].prompt
                                 : e->bills[b].completion);
            }
    }
    per_tenant(ts, &w, "infergw_coalesce_tokens_saved_total", PROM_COUNTER,
               "Tokens that coalesced followers received without an "
               "upstream call.",
               offsetof(struct tenant_entry, saved));
    per_tenant(ts, &w, "infergw_cache_tokens_saved_total", PROM_COUNTER,
               "Tokens that response cache hits received without an "
               "upstream call.", offsetof(struct tenant_entry, cache_saved));
    render_charged(ts, &w, wall_s);
    gw_mutex_unlock(&ts->lock);
    return w.rc;
}
