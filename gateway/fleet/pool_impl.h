/* SPDX-License-Identifier: MIT */
/*
 * pool_impl.h - the pool's state (struct pool and its members) and the
 * helpers its files share: private to module pool.  Nothing outside the
 * pool's own files includes it (test/check_includes.py, PARTS).
 *
 * The pool (pool.h) is one module in several files, a job each:
 *
 *   pool.c          the members, the lock and the lifecycle; a member's
 *                   state as the others read it; the health beat's and
 *                   the load scrape's feeds; the log of events
 *   pool_pick.c     which upstream: the hash ring and the balancers
 *   pool_breaker.c  the breakers: outcomes judged, ejection, the
 *                   half-open trial, max_ejected and panic
 *   pool_share.c    the tenants' shares: their standing, their recent
 *                   demand, the places an engine has for a competing
 *                   tenant, the reserve one ahead of its share leaves
 *   pool_queue.c    admission: slots and the queue and its grants
 *                   (reported per tenant to tenant.h, which renders
 *                   them)
 *   pool_models.c   which upstreams serve a model; /v1/models
 *   pool_lora.c     LoRA adapters: the reports, a call's preference for
 *                   where its adapter is (lora.h), their metrics
 *   pool_report.c   the status view and /metrics (per upstream, engine,
 *                   model; no tenant's: tenant.h has them)
 *   pool_budget.c   the retry budget
 *
 * Locking: 'lock' guards every field of struct pool and struct member
 * past the immutable ones (cfg, n, ring) but the retry budget, which
 * has a lock of its own (struct pool_budget); no thread holds both at
 * once.  The models an upstream reported (struct member's ids, texts,
 * num_models, models_known) and models_gen are written holding 'lock'
 * and then 'models_lock' (pool_set_models(), the one writer), so either
 * lock alone is enough to read them: everything under 'lock' reads them
 * as before, and pool_serves() takes 'models_lock' alone, so that a
 * request's admission takes the pool's lock once (pool_acquire()).  Neither is held across I/O or a log line: what a call under
 * the lock wants logged is noted in a struct event and logged after the
 * unlock (pool_log_event()).  A function whose name ends in _locked is
 * called with the pool's lock held (the budget's, in pool_budget.c),
 * and asserts so.
 *
 * Sets: a model's upstreams are a uint64_t mask, bit i for upstream i
 * (pool_serving_mask_locked()).
 */
#ifndef INFERGW_GATEWAY_FLEET_POOL_IMPL_H
#define INFERGW_GATEWAY_FLEET_POOL_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "base/config.h"
#include "fleet/engine.h"
#include "fleet/lora.h"
#include "fleet/pool.h"
#include "util.h"

struct member {
    const struct config_upstream *cfg;      /* immutable */

    /* The breaker (pool.h). */
    enum pool_state state;
    int64_t state_since_ms;     /* when 'state' last changed (the pool
                                   made: its start; HALF_OPEN: when the
                                   ejection ran out, open_until_ms) */
    int64_t open_until_ms;      /* OPEN: when it turns HALF_OPEN */
    uint64_t fails;             /* failures in a row while CLOSED */
    unsigned streak;            /* ejections since it last stayed up */
    int64_t closed_ms;          /* when it last closed; 0 never ejected */
    int trial_out;              /* HALF_OPEN: the one call is out */
    uint64_t trial_gen;         /* numbers the trials */
    int64_t hold_until_ms;      /* Retry-After: no new calls before */
    int capped;                 /* max_ejected kept it in, logged; cleared
                                   when it goes, or another one comes back
                                   (the cap may let it go then) */
    enum pool_probe probe;      /* the health beat's last verdict */

    uint64_t inflight;          /* calls holding a slot */
    struct engine_load load;    /* its engine's own (engine.h) */
    int saturated;              /* as last logged */
    int64_t swrr;               /* smooth weighted round robin's current */

    /* From GET /v1/models; routing uses 'ids' only without cfg models,
     * and 'parents' (a LoRA adapter's base model; NULL: none) with. */
    int models_known;
    char **ids;
    char **parents;
    char **texts;
    size_t num_models;
    size_t num_adapters;        /* of those, with a parent (so a call
                                   for a base model looks no further) */
    struct lora_load lora;      /* its engine's LoRA adapters (lora.h) */

    /* For /metrics. */
    uint64_t calls;
    uint64_t failures[POOL_OUTCOME_COUNT];
    uint64_t ejections;
    uint64_t capped_total;      /* ejections max_ejected refused */
};

struct ring_point {
    uint64_t hash;
    size_t idx;
};

struct waiter;                          /* pool_queue.c's own */
struct prom;                            /* prom.h's writer */

/*
 * A tenant's recent demand (pool_share.c): its calls open and waiting,
 * averaged over time with a memory of POOL_TENANT_ACTIVE_MS.  'avg' and
 * 'weight' both start at 0 and move alike, so avg / weight is the mean
 * over the time since its first call while that is shorter than the
 * memory (no slow warm-up from zero).
 */
struct pool_demand {
    double avg;
    double weight;
    int64_t at_ms;              /* when last brought up to date; 0 never */
};

/* The retry budget's counts (pool_budget_read() copies them). */
struct pool_budget_counts {
    uint64_t retries, hedges, refused, resends;
    /* Per upstream, for the status view: */
    uint64_t up_retries[CONFIG_MAX_UPSTREAMS];  /* retries that went to it */
    uint64_t up_hedges[CONFIG_MAX_UPSTREAMS];   /* hedges that went to it */
    uint64_t up_hedges_won[CONFIG_MAX_UPSTREAMS];   /* ... and won */
};

/* The retry budget (pool_budget.c): every field under its 'lock'. */
struct pool_budget {
    struct gw_mutex lock;
    /* The window: per-second buckets. */
    int64_t bucket_s[POOL_BUDGET_WINDOW_S];
    uint64_t bucket_req[POOL_BUDGET_WINDOW_S];
    uint64_t bucket_retry[POOL_BUDGET_WINDOW_S];
    struct pool_budget_counts c;
};

struct pool {
    const struct gw_config *cfg;        /* immutable */
    size_t n;                           /* immutable */
    struct member *m;                   /* [n]; see the lock note */
    struct ring_point *ring;            /* immutable, sorted by hash */
    size_t ring_len;

    struct gw_mutex lock;
    uint64_t rng;                       /* xorshift64 state */
    uint64_t models_gen;                /* moves when any member's models
                                           do (pool_set_models()); from 1;
                                           see the lock note */
    struct gw_mutex models_lock;        /* see the lock note */
    struct waiter *q_head, *q_tail;     /* in arrival order */
    int learner1;                       /* the engine learning its room
                                           (pool_places_locked), + 1;
                                           0 none */

    /*
     * Per tenant (CONFIG_MAX_TENANTS: the default one), what the shares
     * are decided by (pool_queue.c); the operator's numbers of a tenant
     * are tenant.h's, which the queue reports to.
     */
    uint64_t t_open[CONFIG_MAX_TENANTS + 1];    /* slots held */
    uint64_t t_queued[CONFIG_MAX_TENANTS + 1];  /* waiting now */
    int64_t t_seen_ms[CONFIG_MAX_TENANTS + 1];  /* its last call's start
                                                   or end; 0 none yet */
    struct pool_demand t_demand[CONFIG_MAX_TENANTS + 1];
    int stopping;

    uint64_t queue_waits, queue_timeouts, unavailable;
    uint64_t poison;                    /* requests found poison */

    /* The sets calls found in panic (pool_breaker.c). */
    uint64_t panic[POOL_PANIC_MAX];
    size_t num_panic;

    struct pool_budget budget;          /* under its own lock */
};

/* What to log once the lock is dropped. */
struct event {
    const char *what;           /* NULL: nothing */
    char detail[96];            /* "": none; else logged after */
    const char *name;           /* the upstream */
    int64_t ms;                 /* "ejected": for how long */
    const char *why;
    uint64_t set;               /* "panic", "panic over": the set ... */
    size_t usable;              /* ... and how many of it are usable */
};

#define NO_EVENT { .what = NULL }

/* How many upstreams are in 'set'. */
static inline size_t
pool_count_of(uint64_t set)
{
    return (size_t)__builtin_popcountll(set);
}

/* ---- the pool's lock ---- */

#ifdef INFERGW_UNIT_TEST
void pool_count_hold(void);     /* pool.c: pool_lock_holds() (pool.h) */
#endif

/* Take the pool's lock ('lock'): every pool file takes it so, so that a
 * test build can count the holds a request costs. */
static inline void
pool_lock(struct pool *p)
{
#ifdef INFERGW_UNIT_TEST
    pool_count_hold();
#endif
    gw_mutex_lock(&p->lock);
}

static inline void
pool_unlock(struct pool *p)
{
    gw_mutex_unlock(&p->lock);
}

/* ---- pool.c: a member's state, under the lock ---- */

/* The state now: an OPEN upstream whose time is up turns HALF_OPEN. */
enum pool_state pool_state_now_locked(struct pool *p, struct member *m,
                                      int64_t now);

/* Is it held back by its own Retry-After? */
int pool_held_locked(struct pool *p, const struct member *m, int64_t now);

/* May it get a new call (ignoring max_inflight)? */
int pool_usable_locked(struct pool *p, struct member *m, int64_t now);

/* Can it take a call, as /readyz counts (pool_ready() says why)? */
int pool_ready_locked(struct pool *p, struct member *m, int64_t now);

/* Is it below max_inflight? */
int pool_has_room_locked(struct pool *p, const struct member *m);

/* Does the balancer read the engines' load (least_load, prefix)?
 * Configuration only: no lock. */
int pool_engine_aware(const struct pool *p);

/*
 * May it take no call now: at max_inflight, or its engine saturated
 * (engine.h)?  Such a call waits in the gateway's queue instead.
 */
int pool_full_locked(struct pool *p, const struct member *m, int64_t now);

/*
 * Note a change of m's engine saturation in 'ev' (one log line per
 * operation; the gauge has every upstream's).
 */
void pool_saturation_note_locked(struct pool *p, struct member *m,
                                 int64_t now, struct event *ev);

/* Log 'ev' (if it holds anything); without the lock. */
void pool_log_event(const struct pool *p, const struct event *ev);

/* ---- pool_pick.c ---- */

/* FNV-1a, then splitmix64's finaliser so that near keys spread. */
uint64_t pool_hash_str(const char *s, uint64_t salt);

/* Build the consistent-hash ring (pool_new()).  0 or GW_ENOMEM. */
int pool_ring_build(struct pool *p);

/*
 * The upstream the balancer picks of 'room' (never empty), the usable
 * upstreams being 'usable_mask', the call's prefix hash 'key' and its
 * model 'model' (NULL: none; a LoRA adapter's calls prefer where it is:
 * pool_lora_group_locked()).
 */
size_t pool_pick_locked(struct pool *p, uint64_t room, uint64_t usable_mask,
                        uint64_t key, const char *model, int64_t now);

/* ---- pool_breaker.c ---- */

/*
 * Of 'cand' (upstreams of the set 'serve' a call may still try), the ones
 * it may use now: the usable ones, or while 'serve' is in panic (OUT
 * *panic, unless NULL) every one not held back.
 */
uint64_t pool_usable_mask_locked(struct pool *p, uint64_t serve,
                                 uint64_t cand, int64_t now, int *panic);

/*
 * The Retry-After, in seconds, for a call of the set 'serve' that finds
 * none of 'mask' usable: until the first of them may take a call again,
 * at least 1.
 */
int pool_retry_after_locked(struct pool *p, uint64_t serve, uint64_t mask,
                            int64_t now);

/* A call found 'set' in panic: remember it, and log it if it is new. */
void pool_panic_note_locked(struct pool *p, uint64_t set, int64_t now,
                            struct event *ev);

/*
 * Forget the sets that are out of panic now, logging the first in 'ev'.
 * Returns how many sets are in panic.
 */
size_t pool_panic_sweep_locked(struct pool *p, int64_t now,
                               struct event *ev);

/* ---- pool_share.c: the tenants' shares, under the lock ---- */

/* A tenant's standing among the active ones (pool_share_locked()). */
enum share {
    SHARE_ALONE,                /* no other tenant is active */
    SHARE_FAIR,                 /* others are, none before it */
    SHARE_AHEAD,                /* one is before it */
};

/* A tenant's priority (CONFIG_MAX_TENANTS: the default's). */
int64_t pool_tenant_priority(const struct pool *p, size_t t);

/* Does tenant 'u' go before tenant 't' (DESIGN.md "Fleet-aware
 * scheduling"): a higher priority, or the same and fewer slots held per
 * unit of weight?  Neither of equals. */
int pool_tenant_before(const struct pool *p, size_t u, size_t t);

/* Tenant 't''s standing now (pool.h "Admission"). */
enum share pool_share_locked(struct pool *p, size_t t, int64_t now);

/* Tenant 't''s open or queued count is about to change: its demand is
 * brought up to 'now' with the count it had until then. */
void pool_demand_note_locked(struct pool *p, size_t t, int64_t now);

/*
 * What the engines of a call's fleet (the upstreams it may use) tell a
 * tenant competing with others of their places (pool_share.c "Places").
 */
struct places {
    int unknown;                /* one's load is not fresh: no reserve */
    double presumed;            /* the smallest room known among them;
                                   0 none is */
    int learner;                /* none known: the one whose room is
                                   learned; -1 none */
    double total;               /* the places proven, summed */
    double free;                /* ... and free now (below max_inflight) */
};

/* The places of 'fleet' now. */
void pool_places_locked(struct pool *p, uint64_t fleet, int64_t now,
                        struct places *pl);

/* What upstream i has for a call of a tenant standing 'sh'. */
enum place {
    PLACE_NONE,                 /* nothing: the call waits */
    PLACE_PROVEN,               /* within what its reads proved (or, for
                                   a lone tenant, not full) */
    PLACE_PROBE,                /* past that, where the room is learned */
};

/* 'pl': pool_places_locked()'s for the call's fleet (unread for
 * SHARE_ALONE). */
enum place pool_place_locked(struct pool *p, size_t i, enum share sh,
                             const struct places *pl, int64_t now);

/*
 * May a call of tenant 't', ahead of its share, take a proven place of
 * the fleet 'pl' describes, and still leave the reserve of the tenants
 * that go before it (pool_share.c "The reserve")?
 */
int pool_reserve_left_locked(struct pool *p, size_t t,
                             const struct places *pl, int64_t now);

/* ---- pool_queue.c ---- */

/*
 * Upstream 'idx' may take calls again (a slot came free, its engine's
 * queue shrank): hand them to the waiters whose turn it is.
 */
void pool_grant_locked(struct pool *p, size_t idx, int64_t now);

/*
 * After an ejection or a hold: a waiter none of whose upstreams is
 * usable now is told at once.
 */
void pool_wake_hopeless_locked(struct pool *p, int64_t now);

/* A slot on 'm' of tenant 'tenant' comes back (take_slot()'s undoing). */
void pool_slot_back_locked(struct pool *p, struct member *m, size_t tenant,
                           int64_t now);

/* OUT q[i]: the calls in the queue that upstream i could take. */
void pool_queued_locked(struct pool *p, uint64_t q[CONFIG_MAX_UPSTREAMS]);


/* ---- pool_lora.c ---- */

/*
 * Of 'room' (never empty), the upstreams a call for 'model' prefers
 * (lora.h): where it is resident, else where a slot is free, else where
 * there is room for it, else 'room' itself; 'room' too when 'model' is
 * no adapter, or lora_aware is off.  The balancer then picks within what
 * this returns.
 */
uint64_t pool_lora_group_locked(struct pool *p, uint64_t room,
                                const char *model, int64_t now);

/*
 * Should a call for 'model' wait rather than take a place in 'room'
 * now: is it a LoRA adapter resident on some upstream of 'use' (those
 * it may use) but on none of 'room' (those with a place for it now)?
 * A load elsewhere costs its whole batch the load's time; a place where
 * it is comes free soon, and goes to it first (pool_queue.c).
 */
int pool_lora_waits_locked(struct pool *p, uint64_t room, uint64_t use,
                           const char *model, int64_t now);

/*
 * The upstreams of 'set' where 'model' is a resident LoRA adapter
 * (lora.h), with a balancer that reads engines and lora_aware on; 0 when
 * it is no adapter, or resident on none of them.
 */
uint64_t pool_lora_resident_locked(struct pool *p, uint64_t set,
                                   const char *model, int64_t now);

/*
 * A call for 'model' took a slot on upstream 'idx' (after take_slot):
 * when 'model' is an adapter, it is noted there, and counted as a load
 * if it was not resident (lora.h).
 */
void pool_lora_sent_locked(struct pool *p, size_t idx, const char *model,
                           int64_t now);

/* The LoRA series of /metrics, per upstream. */
void pool_lora_render_locked(struct pool *p, struct prom *w);

/* Fill the LoRA fields of upstream 'm''s status view. */
void pool_lora_status_locked(struct pool *p, const struct member *m,
                             struct pool_upstream_status *st);

/* ---- pool_budget.c ---- */

/* A copy of the budget's counts, under its lock (not the pool's). */
void pool_budget_read(struct pool *p, struct pool_budget_counts *out);

/* ---- pool_models.c ---- */

/* Does 'm' serve 'model' (NULL: any)? */
int pool_member_serves_locked(struct pool *p, const struct member *m,
                              const char *model);

/*
 * Is 'model' a LoRA adapter: does some upstream's GET /v1/models list it
 * with a parent?
 */
int pool_is_adapter_locked(struct pool *p, const char *model);

/* The set of the upstreams that serve 'model' (NULL: any). */
uint64_t pool_serving_mask_locked(struct pool *p, const char *model);

/*
 * The same for want->model, from want->admission when that holds for
 * this pool and its models' generation now (pool.h), else computed.
 */
uint64_t pool_want_set_locked(struct pool *p, const struct pool_want *want);

/* Free m's models from GET /v1/models (pool_free(), or the ones
 * pool_set_models() replaced, after its unlock); no lock. */
void pool_models_free(struct member *m);

#endif
