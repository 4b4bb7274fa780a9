/* SPDX-License-Identifier: MIT */
/*
 * tenant.h - who a request belongs to, the limits that keep one tenant
 * from starving the others, and each tenant's bill.
 *
 * Who: the [tenant] one of whose keys the client presents as
 * "Authorization: Bearer KEY", or the operator, with one of [admin]'s.
 * The presented key is hashed with SHA-256 and compared with every
 * configured digest (config.h) in constant time, so neither a key's
 * prefix nor which tenant matched shows in the timing.
 *
 * Limits, per tenant, for the requests that go upstream (route.c):
 *  - max_inflight: requests under way at once; one more is refused.
 *  - requests_per_minute: a token bucket holding a minute's worth,
 *    refilled continuously (to the microsecond); a request is admitted
 *    only if a whole token is there, so a refusal never admits.
 *  - tokens_per_minute: a bucket of a minute's worth of tokens (prompt
 *    + completion), refilled continuously like requests_per_minute's.
 *    A request is admitted while it holds a whole token; the call is
 *    charged its whole usage when it ends (tenants_charge()), which may
 *    put the bucket in debt: the next is admitted once the refill has
 *    paid the debt back and a whole token is there again.  The debt
 *    stops at a day's refill, so one absurd usage object costs a day
 *    at most.
 *  - tokens_per_day, tokens_per_month: budgets per calendar period in
 *    UTC (wall clock, CLOCK_REALTIME; given by the caller, so a test
 *    crosses midnight at will).  Refused once the period's charges
 *    reach the budget, until the period ends.
 * A refused request gets 429 with Retry-After (rate_limit_exceeded, or
 * insufficient_quota for a spent budget, route.c).  The checks take
 * nothing until all pass, so a refusal costs no request of the bucket.
 * A coalesced follower is a request of its tenant like any other (it is
 * admitted here first, and charged the flight's tokens), even though it
 * costs no upstream call.
 *
 * Overshoot: a call is checked before it starts and charged when it
 * ends, so every call admitted while the tenant had room may finish.
 * A tenant goes past a token limit by at most the tokens of the calls
 * it had in flight when it reached it: with max_inflight N, at most N
 * times its largest call (prompt + n x max_tokens); with max_inflight 0
 * only max_connections bounds them.  This holds for calls charged from
 * their usage: a counted one (usage.h) can be charged below the truth.
 * Then it is refused until the refill (or the next period) has made up
 * for all of it.
 *
 * The bill: infergw_tokens_total{tenant,model,kind} counts the tokens of
 * the usage each client received (prompt and completion), and
 * infergw_coalesce_tokens_saved_total{tenant} those its followers got
 * without an upstream call of their own.  With [cluster], each tenant's
 * requests answered, billed tokens and saved tokens also go to Redis,
 * in batches from the cluster's beat (tenants_usage_flush()), and the
 * status view shows the fleet's totals beside this gateway's.
 *
 * One owner: this module owns every number about a tenant that the
 * operator sees, and renders them all (tenants_render_metrics(), and
 * tenants_status() for the status view): its requests, limits, refusals
 * and bill, its followers, and what the gateway's admission queue did
 * with its calls (pool.h "Admission": waits, their time, timeouts,
 * sheds, and how many wait now), which the pool reports here
 * (tenants_note_queue()).  The pool keeps only what it schedules by
 * (each tenant's open slots and waiters, per configuration generation,
 * under its own lock) and renders no tenant's number.
 *
 * Design: the state is kept by tenant name, not by config index, so a
 * reloaded configuration that keeps a name keeps its counts.  The limits
 * themselves are read from the config the request was admitted under.
 * One mutex guards everything; it is taken a few times per request, and
 * never while another lock is held (the pool reports after its unlock).
 * An entry lives until tenants_free(); a name that a reload removed stops
 * growing but keeps its counters (Prometheus counters must not go back).
 */
#ifndef INFERGW_GATEWAY_BASE_TENANT_H
#define INFERGW_GATEWAY_BASE_TENANT_H

#include <stddef.h>
#include <stdint.h>

#include "base/config.h"
#include "buf.h"
#include "http.h"
#include "redis.h"

struct cluster;
struct gw_config;
struct config_tenant;
struct tenants;
struct tenant_entry;

#define TENANT_DEFAULT_NAME "default"
#define TENANT_NAME_MAX (CONFIG_NAME_MAX + 1)    /* with its NUL */

/*
 * The tenant of a request: the index of the [tenant] whose key the client
 * presents, else CONFIG_MAX_TENANTS (the default tenant; with tenants
 * configured, route.c answers it 401).
 */
size_t tenant_identify(const struct gw_config *cfg,
                       const struct http_request *r);

/*
 * Does the request present one of [admin]'s keys (config.h) as
 * "Authorization: Bearer KEY"?  Hashed and compared as a tenant's key
 * is.  0 when [admin] has none.
 */
int tenant_is_admin(const struct gw_config *cfg,
                    const struct http_request *r);

/* Its name: the section's, or "default".  Borrowed from 'cfg'. */
const char *tenant_name(const struct gw_config *cfg, size_t tenant);

/* NULL on ENOMEM. */
struct tenants *tenants_new(void);
void tenants_free(struct tenants *ts);      /* NULL-safe */

/* The verdicts, in the order they are checked. */
enum tenant_limit {
    TENANT_ADMITTED = 0,
    TENANT_MAX_INFLIGHT,
    TENANT_RATE,                /* requests_per_minute */
    TENANT_TOKENS,              /* tokens_per_minute */
    TENANT_QUOTA_DAY,           /* tokens_per_day spent */
    TENANT_QUOTA_MONTH,         /* tokens_per_month spent */
    TENANT_NOMEM,
};
#define TENANT_LIMITS 5         /* the refusals: MAX_INFLIGHT..QUOTA_MONTH */

/* The limit a refusal names (its metrics label): "max_inflight", ... */
const char *tenant_limit_name(enum tenant_limit verdict);

/*
 * A tenant's requests_per_minute and tokens_per_minute buckets as
 * OpenAI's x-ratelimit-* headers tell them.
 */
struct tenant_rate {
    uint64_t limit;             /* requests_per_minute; 0: none */
    uint64_t remaining;         /* whole requests it would admit now */
    int64_t reset_us;           /* until the bucket is full again */
    uint64_t tokens_limit;      /* tokens_per_minute; 0: none */
    uint64_t tokens_remaining;  /* whole tokens in it (0 in debt) */
    int64_t tokens_reset_us;    /* until it is full again */
};

/*
 * Admit one request of tenant 'tenant' of 'cfg' at 'now_us' (gw_now_us(),
 * microseconds: a bucket must see time finer than the requests that
 * arrive within one millisecond) and 'wall_s' (seconds since the epoch,
 * CLOCK_REALTIME: the budgets' UTC periods).  TENANT_ADMITTED: '*out'
 * is its pass (give it back with tenants_leave).  Otherwise
 * *retry_after_s says when to try again, in whole seconds rounded up
 * (>= 1; for a spent budget, until its period ends), and nothing was
 * taken.  TENANT_NOMEM: the caller answers 503.  'rate' (NULL: not
 * wanted) gets the buckets as they are after the verdict, a limit 0 for
 * a bucket the tenant does not have.
 */
enum tenant_limit tenants_enter(struct tenants *ts,
                                const struct gw_config *cfg, size_t tenant,
                                int64_t now_us, int64_t wall_s,
                                struct tenant_entry **out,
                                int *retry_after_s, struct tenant_rate *rate);

/*
 * tenants_enter() for a tenant whose other limits are shared
 * (tenant_shared_enter() judges them, below): only max_inflight is
 * judged here, and 'rate' is left zero.
 */
enum tenant_limit tenants_enter_inflight(struct tenants *ts,
                                         const struct gw_config *cfg,
                                         size_t tenant, int64_t now_us,
                                         int64_t wall_s,
                                         struct tenant_entry **out,
                                         int *retry_after_s,
                                         struct tenant_rate *rate);

/*
 * The request admitted as 'e' (tenants_enter_inflight(); NULL-safe) at
 * 'now_us' was refused after all, by a shared limit ('verdict',
 * counted as tenants_enter() counts its refusals) or because Redis is
 * gone (TENANT_ADMITTED: counted nowhere): its pass is given back and
 * its admission uncounted.
 */
void tenants_refuse(struct tenants *ts, struct tenant_entry *e,
                    enum tenant_limit verdict, int64_t now_us);

/*
 * Charge the call of the request admitted as 'e' (its pass; NULL-safe)
 * under tenant 'tenant' of 'cfg' (the configuration it was admitted
 * under) 'tokens' (prompt + completion; bounded at 2^34) at 'now_us'
 * and 'wall_s' (as tenants_enter's): its tokens_per_minute bucket, and
 * the day's and month's use, which are kept for every tenant, limited
 * or not.  'counted': the tokens are the gateway's count, the response
 * having no usage (usage.h: usage_scan_charge()); counted apart in
 * infergw_tenant_tokens_charged_total{source}.  Once per request:
 * leaders, direct calls and followers alike.
 */
void tenants_charge(struct tenants *ts, const struct gw_config *cfg,
                    size_t tenant, struct tenant_entry *e, uint64_t tokens,
                    int counted, int64_t now_us, int64_t wall_s);

/* The request is over.  NULL-safe. */
void tenants_leave(struct tenants *ts, struct tenant_entry *e);

/*
 * Bill what one client received: 'prompt' and 'completion' tokens of
 * 'model' (client text; bounded and sanitised by the caller).  'saved':
 * TENANT_SAVED_COALESCE, it came from someone else's upstream call (a
 * follower); TENANT_SAVED_CACHE, from the response cache (a hit: counted
 * on this gateway only, not in the fleet's usage); 0, its own call.
 */
#define TENANT_SAVED_COALESCE 1
#define TENANT_SAVED_CACHE 2
void tenants_bill(struct tenants *ts, struct tenant_entry *e,
                  const char *model, uint64_t prompt, uint64_t completion,
                  int saved);

/* What the gateway's admission queue did with a call (pool.h). */
enum tenant_queue {
    TENANT_QUEUE_ENTERED = 0,   /* it waits in the queue now */
    TENANT_QUEUE_LEFT,          /* it left the queue after 'wait_ms',
                                   however its wait ended */
    TENANT_QUEUE_TIMED_OUT,     /* no slot within queue_timeout (503),
                                   or the gateway stopped meanwhile */
    TENANT_QUEUE_SHED,          /* sheddable (priority < 0), every
                                   upstream full: 429 at once */
};

/*
 * Note 'what' of a call of tenant 'tenant' of 'cfg' ('wait_ms': the
 * wait TENANT_QUEUE_LEFT ends; else 0).  The pool calls it without its
 * own lock.  NULL 'ts': nothing.  Out of memory: not counted.
 */
void tenants_note_queue(struct tenants *ts, const struct gw_config *cfg,
                        size_t tenant, enum tenant_queue what,
                        int64_t wait_ms);

/*
 * The request admitted as 'e' (its pass; NULL-safe) was a coalesced
 * follower: infergw_coalesce_followers_by_tenant_total.
 */
void tenants_note_follower(struct tenants *ts, struct tenant_entry *e);

/*
 * The counts shared across the fleet (tenants_usage_flush()), as the
 * hash "<key_prefix>{<tenant>}:usage" in Redis names them: requests
 * answered (refused ones too: infergw_tenant_requests_total), prompt
 * and completion tokens billed (infergw_tokens_total) and the tokens
 * followers got for nothing (infergw_coalesce_tokens_saved_total).
 */
enum tenant_usage_field {
    TENANT_USAGE_REQUESTS = 0,
    TENANT_USAGE_PROMPT,
    TENANT_USAGE_COMPLETION,
    TENANT_USAGE_SAVED,
    TENANT_USAGE_FIELDS
};

/* Its name in Redis's hash and in /status.json: "requests",
 * "prompt_tokens", "completion_tokens", "tokens_saved". */
const char *tenant_usage_field_name(enum tenant_usage_field field);

/* One tenant as the status view (status.h) shows it: a copy. */
struct tenant_status {
    char name[TENANT_NAME_MAX];
    uint64_t inflight;              /* requests under way */
    uint64_t last_minute;           /* admitted in the last 60 s */
    uint64_t rejected[TENANT_LIMITS];   /* 429s by verdict - 1 */
    int tokens_bucket;              /* has a tokens_per_minute bucket */
    int64_t tokens_credit;          /* its whole tokens (< 0: debt) */
    uint64_t tokens_day;            /* charged today (UTC) */
    uint64_t tokens_month;          /* charged this month (UTC) */
    uint64_t prompt_tokens;         /* billed, every model */
    uint64_t completion_tokens;
    uint64_t saved;                 /* tokens followers got for nothing */
    uint64_t cache_saved;           /* tokens cache hits got for nothing */
    /* Usage across the fleet: this gateway's counts, those of them not
     * yet in Redis for sure, and the fleet's totals as the beat last
     * read them, 'cluster_age_ms' ago (-1: never read). */
    uint64_t usage[TENANT_USAGE_FIELDS];
    uint64_t unsent[TENANT_USAGE_FIELDS];
    uint64_t cluster[TENANT_USAGE_FIELDS];
    int64_t cluster_age_ms;
};

/*
 * Every tenant seen so far (by name; tenant.h's design), copied under
 * the tenants' lock alone, at 'now_us' (gw_now_us()) and 'wall_s' (as
 * tenants_enter's), the buckets of 'cfg''s tenants refilled to then
 * (borrowed).  OUT *out: a new array (gw_free() it) of OUT *n entries,
 * NULL when there are none.  Returns 0 or GW_ENOMEM.
 */
int tenants_status(struct tenants *ts, const struct gw_config *cfg,
                   int64_t now_us, int64_t wall_s,
                   struct tenant_status **out, size_t *n);

struct cluster;

/*
 * Usage across the fleet: add to Redis what every tenant seen here
 * counted since the last batch Redis took (tenant_status's usage), and
 * read back the fleet's totals (its 'cluster'), in one pipelined round
 * trip of CLUSTER_OP_USAGE per 64 tenants, each by 'timeout_ms'.  The
 * cluster's beat runs it after each heartbeat that succeeded
 * (cluster_self's after_beat, 'ts' its argument; generation.c), never
 * a request.  A batch whose round trip failed, or timed out after
 * Redis had applied it, is sent again, the same and with the same
 * number, until Redis answers; Redis's script adds a number once per
 * process and tenant, so no count is lost or added twice
 * (tenant_usage.c).  Takes the tenants' lock only to take the batches
 * and to mark them done, never across the round trip; a second call
 * while one is under way (a reload's new beat beside the old) returns
 * at once.  Borrows everything.
 */
void tenants_usage_flush(void *ts, struct cluster *cl, int64_t timeout_ms);

/*
 * A request of tenant 'tenant' of 'cfg' was answered with 'status'
 * (100..599), refused ones too (401 counts under "default", 429 under
 * its tenant): infergw_tenant_requests_total{tenant,status}.  Past
 * TENANT_MAX_STATUSES statuses in a tenant's series, the rest share
 * status="other".  Out of memory: not counted.
 */
#define TENANT_MAX_STATUSES 24
void tenants_count_request(struct tenants *ts, const struct gw_config *cfg,
                           size_t tenant, int status);

/*
 * Append every per-tenant family to 'out' (Prometheus text 0.0.4), the
 * one place /metrics gets them from: of every tenant seen (by name),
 * infergw_tenant_requests_inflight, infergw_tenant_rejected_total,
 * infergw_tenant_requests_total, infergw_tokens_total,
 * infergw_coalesce_tokens_saved_total, infergw_cache_tokens_saved_total,
 * infergw_tenant_tokens_charged_total and infergw_tenant_tokens_used (the day's and month's, as of
 * 'wall_s', tenants_enter's clock); of each of cfg's tenants (and, but
 * for the limits, the default one; borrowed), its limits
 * (infergw_tenant_max_inflight, infergw_tenant_requests_per_minute_
 * limit, infergw_tenant_tokens_per_{minute,day,month}_limit), its
 * followers (infergw_coalesce_followers_by_tenant_total)
 * and its calls in the admission queue, labelled with its priority too
 * (infergw_tenant_queued, infergw_tenant_queue_waits_total,
 * infergw_tenant_queue_wait_seconds_total,
 * infergw_tenant_queue_timeouts_total, infergw_tenant_shed_total).
 * Every family is present (HELP, TYPE) even before its first sample.
 */
int tenants_render_metrics(struct tenants *ts, const struct gw_config *cfg,
                           int64_t wall_s, struct buf *out);

/*
 * Shared limits (tenant_shared.c, with [cluster]): a tenant's
 * requests_per_minute, tokens_per_minute, tokens_per_day and
 * tokens_per_month hold for the tenant as a whole across every gateway
 * on one Redis, and so does its max_inflight ("Leases" below); a
 * tenant with none of the five never touches Redis.
 *
 * The arithmetic is tenant.h's, in one Lua script run atomically on
 * Redis (by EVALSHA, EVAL on NOSCRIPT: cluster_pipeline()) with Redis's
 * TIME as the clock: the two minute buckets are token buckets in the
 * same integer units as tenant_impl.h's (a token is 60,000,000 units,
 * a microsecond refills 'per_minute' units), kept in the hash
 * "<prefix>{<tenant>}:rate" (fields rc, rt, tc, tt), which expires once
 * both would be full again (a missing bucket is a full one).  The
 * budgets are counters "<prefix>{<tenant>}:tokens:day:<end>" and
 * "...:month:<end>", <end> the period's end in seconds since the epoch
 * (UTC), each expiring a day after its period ends; which period is
 * current only moves forward ("<prefix>{<tenant>}:periods"), so a
 * gateway whose clock is behind charges the new day once another has
 * started it.  An admission takes nothing unless every limit passes;
 * a refusal names the first failing limit (day, month, tokens, then
 * requests) and its Retry-After is the longest wait of every failing
 * one.  A charge only subtracts, and a tokens_per_minute debt is
 * floored at a day's refill.
 *
 * Round trips: an admission is one, on the request path, by
 * redis_timeout; a charge is one more, at the call's end, by what is
 * left of the request's redis_timeout ('left_ms'), so no request waits
 * longer than redis_timeout on Redis in all.
 *
 * Redis gone (a round trip failed: no connection, the deadline, an
 * error reply): with [cluster] on_error = local the verdict is the
 * local share: each limit divided by the gateways the last heartbeat
 * saw alive (cluster_alive(); never below 1), in buckets of this
 * gateway's kept by tenant name, which every admission and charge also
 * runs while Redis answers (without debt then), so a gateway that used
 * more than its share starts the outage with less.  A budget's share is
 * what Redis last said was left of it, divided alike.  Charges Redis
 * did not get are added to the next one that it does (at most 2^34
 * tokens kept).  With on_error = deny the request is refused (503).
 *
 * Locking: the local shares are process-wide (kept across reloads, by
 * name), under one mutex of their own, never held with another lock nor
 * across I/O.
 */

/* Is 'tenant' of 'cfg' judged by shared limits (cl non-NULL, and the
 * tenant has one of the five)? */
int tenant_shared_wanted(const struct cluster *cl,
                         const struct gw_config *cfg, size_t tenant);

/*
 * What goes in the admission's round trip besides the limits: the
 * call's lease (NULL: none), judged and taken by the limits' script in
 * the same atomic step; and commands after it: cmds[0..n), their
 * replies into replies[0..n) (owned by the caller once the round trip
 * succeeded; all NULL otherwise).
 */
struct tenant_lease;
struct tenant_shared_with {
    struct tenant_lease *lease;
    const struct redis_cmd *cmds;
    size_t n;
    redisReply **replies;
};

/*
 * Judge a request of 'tenant' of 'cfg' by its shared limits on 'cl' at
 * 'now_us' (gw_now_us(), the local share's clock) and 'wall_s' (the
 * budgets' periods, as tenants_enter's).  'with': NULL, or commands to
 * pipeline with it.  Returns 0 with OUT *verdict (TENANT_ADMITTED, or
 * the refusal with OUT *retry_after_s, >= 1), and 'rate' (NULL: not
 * wanted) filled from Redis's answer or the local share; OUT *left_ms
 * what is left of redis_timeout for the charge.  GW_EUNAVAIL: Redis is
 * gone and on_error = deny (*retry_after_s set: answer 503).
 */
int tenant_shared_enter(struct cluster *cl, const struct gw_config *cfg,
                        size_t tenant, int64_t now_us, int64_t wall_s,
                        const struct tenant_shared_with *with,
                        enum tenant_limit *verdict, int *retry_after_s,
                        struct tenant_rate *rate, int64_t *left_ms);

/*
 * Leases (tenant_lease.c): with [cluster], a tenant's max_inflight
 * counts its open calls on every gateway.  Each call admitted holds a
 * lease, a member "<instance>:<seq>" (cluster_instance(), a number of
 * this process's) of the sorted set "<prefix>{<tenant>}:leases" scored
 * by its expiry in microseconds on Redis's clock.  The admission's
 * script (above) drops the expired members, counts the rest, refuses
 * with TENANT_MAX_INFLIGHT at max_inflight, else adds the call's lease
 * with an expiry of 'lease' from now: no round trip of its own.  The
 * call's end removes it (ZREM, after the response, by what is left of
 * redis_timeout).  The cluster's beat (every lease / 3) renews every
 * lease this process holds to 'lease' from then, one command per 60
 * leases of a tenant, in its own round trips; so a gateway that dies
 * gives its leases back within 'lease' of its last beat.
 *
 * Reconciliation: the renewal re-adds (a plain ZADD), so after Redis
 * came back empty or after a gap the first beat puts back exactly the
 * calls still open; a member is unique to its call, so re-adding never
 * counts one twice.  A release that fails (Redis gone, the deadline)
 * is retried by the beat until Redis answers or the lease has run out
 * (then Redis has dropped it anyway); one made while the beat renews
 * its lease is the beat's to send after its renewal, so no renewal
 * brings back a lease released.  None leaked, none counted twice.
 *
 * Redis gone: with on_error = local a call is admitted while this
 * gateway's open calls of the tenant (its leases, this one included)
 * are at most max_inflight divided by the gateways last seen alive
 * (never below 1), else 429; with deny, 503.  Those calls' leases are
 * added by the first beat after Redis is back.
 *
 * A coalesced follower gives its lease back as soon as it follows (the
 * leader's call holds one), so followers do not count.  A lease is
 * renewed only by the beat of the cluster it was taken on: after a
 * reload that replaced [cluster], a call admitted before it may lose
 * its lease after 'lease' (it is not stopped; the limit is then loose
 * by it).
 *
 * Locking: one mutex of the module's own guards the book of leases,
 * never held with another lock nor across I/O.
 */

/* Does a call of 'tenant' of 'cfg' take a lease (cl non-NULL, and the
 * tenant has a max_inflight)? */
int tenant_lease_wanted(const struct cluster *cl,
                        const struct gw_config *cfg, size_t tenant);

/*
 * A new lease for a call of 'tenant' of 'cfg' on 'cl' (both borrowed;
 * 'cl' must outlive it), in this process's book; the admission takes
 * it in Redis (tenant_shared_with).  NULL when none is wanted, or out
 * of memory (tenant_lease_wanted() tells which: answer 503).
 */
struct tenant_lease *tenant_lease_new(struct cluster *cl,
                                      const struct gw_config *cfg,
                                      size_t tenant);

/*
 * The call is over (or was refused, or followed another): steals 'l'
 * (NULL-safe) and removes it from Redis by 'left_ms' (<= 0: no round
 * trip here; the beat sends it).  Not for a lease whose admission is
 * still under way.
 */
void tenant_lease_release(struct cluster *cl, struct tenant_lease *l,
                          int64_t left_ms);

/*
 * cluster_self's after_beat (generation.c): the leases' part first
 * (renew, or re-add, every lease 'cl' holds, then send the releases
 * that failed, each round trip by 'timeout_ms'), then
 * tenants_usage_flush() with 'ts'.  Borrows everything.
 */
void tenants_after_beat(void *ts, struct cluster *cl, int64_t timeout_ms);

/*
 * Charge a call of 'tenant' of 'cfg' 'tokens' (tenants_charge()'s) in
 * Redis, by 'left_ms' (<= 0: no round trip: kept for the next), and in
 * its local share at 'now_us' and 'wall_s'.  Nothing for a tenant
 * without a token limit, or no tokens.
 */
void tenant_shared_charge(struct cluster *cl, const struct gw_config *cfg,
                          size_t tenant, uint64_t tokens, int64_t now_us,
                          int64_t wall_s, int64_t left_ms);

#endif
