/* SPDX-License-Identifier: MIT */
/*
 * pool.c - the upstream fleet: balancing, circuit breakers, admission and
 * the retry budget (pool.h).
 *
 * Locking: 'lock' guards every field of struct pool and struct member
 * past the immutable ones (cfg, n, ring).  It is never held across I/O or
 * a log line: what a call under the lock wants logged is noted in a
 * struct event and logged after the unlock.  A waiter in the admission
 * queue sleeps on its own condition variable with 'lock'.
 *
 * Sets: a model's upstreams are a uint64_t mask (serving_mask()).  Panic
 * is decided afresh by every call from the states of its set's members;
 * 'panic' only remembers which sets calls found in panic, for the log
 * lines and the gauge, and each check that may end a panic (the end of
 * a call, a probe, a scrape) drops the sets that are out of it.
 */
#include "fleet/pool.h"

#include <assert.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "base/config.h"
#include "fleet/engine.h"
#include "http.h"
#include "log.h"
#include "base/metrics.h"
#include "prom.h"
#include "util.h"

/* Ring points per unit of weight, and at most per upstream (prefix). */
#define RING_PER_WEIGHT 16
#define RING_MAX_PER_UPSTREAM 4096

/* Ejections in a row that still double eject_time (2^16 is past 5m). */
#define STREAK_MAX 16

struct member {
    const struct config_upstream *cfg;      /* immutable */

    /* The breaker (pool.h). */
    enum pool_state state;
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
    int no_engine_logged;       /* "no engine metrics" said once */
    int64_t swrr;               /* smooth weighted round robin's current */

    /* From GET /v1/models; routing uses 'ids' only without cfg models. */
    int models_known;
    char **ids;
    char **texts;
    size_t num_models;

    /* For /metrics. */
    uint64_t calls;
    uint64_t failures[POOL_OUTCOME_COUNT];
    uint64_t ejections;
    uint64_t capped_total;      /* ejections max_ejected refused */

    /* For the status view. */
    uint64_t retries;           /* retries that came here */
    uint64_t hedges;            /* hedges that came here */
    uint64_t hedges_won;        /* ... and won */
};

struct ring_point {
    uint64_t hash;
    size_t idx;
};

/* A call waiting for a slot; lives on its thread's stack. */
struct waiter {
    struct waiter *next;
    pthread_cond_t cv;
    uint64_t mask;              /* upstreams it can use */
    uint64_t serve;             /* its model's set, for panic */
    size_t tenant;              /* its tenant (pool_want.tenant) */
    int granted;                /* the upstream whose slot it was given;
                                   -1 none yet, -2 none can come, -3 its
                                   caller is gone */
    uint64_t trial;
};

struct pool {
    const struct gw_config *cfg;        /* immutable */
    size_t n;                           /* immutable */
    struct member *m;                   /* [n]; see the lock note */
    struct ring_point *ring;            /* immutable, sorted by hash */
    size_t ring_len;

    struct gw_mutex lock;
    uint64_t rng;                       /* xorshift64 state */
    struct waiter *q_head, *q_tail;     /* in arrival order */
    uint64_t q_len;

    /* Per tenant (CONFIG_MAX_TENANTS: the default one). */
    uint64_t t_open[CONFIG_MAX_TENANTS + 1];    /* slots held */
    uint64_t t_queued[CONFIG_MAX_TENANTS + 1];  /* waiting now */
    uint64_t t_waits[CONFIG_MAX_TENANTS + 1];   /* waited, ever */
    uint64_t t_wait_ms[CONFIG_MAX_TENANTS + 1]; /* their waits' sum */
    uint64_t t_shed[CONFIG_MAX_TENANTS + 1];    /* 429 at saturation */
    uint64_t t_timeouts[CONFIG_MAX_TENANTS + 1];
    int64_t t_seen_ms[CONFIG_MAX_TENANTS + 1];  /* its last call's start
                                                   or end; 0 none yet */
    int stopping;

    /* The budget window: per-second buckets. */
    int64_t bucket_s[POOL_BUDGET_WINDOW_S];
    uint64_t bucket_req[POOL_BUDGET_WINDOW_S];
    uint64_t bucket_retry[POOL_BUDGET_WINDOW_S];

    uint64_t retries, hedges, budget_refused, resends;
    uint64_t queue_waits, queue_timeouts, unavailable;
    uint64_t poison;                    /* requests found poison */

    /* The sets calls found in panic (see the file comment). */
    uint64_t panic[POOL_PANIC_MAX];
    size_t num_panic;
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

static const char *const outcome_names[POOL_OUTCOME_COUNT] = {
    [POOL_OK] = "ok",
    [POOL_NEUTRAL] = "neutral",
    [POOL_FAIL_CONNECT] = "connect",
    [POOL_FAIL_TIMEOUT] = "timeout",
    [POOL_FAIL_STATUS] = "status",
    [POOL_FAIL_THROTTLED] = "throttled",
    [POOL_FAIL_BROKEN] = "broken",
};

const char *
pool_outcome_name(enum pool_outcome o)
{
    return (unsigned)o < POOL_OUTCOME_COUNT ? outcome_names[o] : "?";
}

enum pool_outcome
pool_outcome_of(const struct call_outcome *o)
{
    if (o->kind == CALL_CONNECT || o->kind == CALL_TLS)
        return POOL_FAIL_CONNECT;
    if (call_kind_is_timeout(o->kind))
        return POOL_FAIL_TIMEOUT;
    /* Its answer was lost or refused.  (CALL_STATUS is an answer.) */
    if (o->kind != CALL_STATUS && o->fault == CALL_FAULT_UPSTREAM)
        return POOL_FAIL_BROKEN;
    /* An answer, or a stop of the client's or ours: by the status. */
    if (o->status == 429)
        return POOL_FAIL_THROTTLED;
    if (o->status >= 500)
        return POOL_FAIL_STATUS;
    /* Stopped before any head: no word on the upstream. */
    if (o->kind != CALL_OK && o->status == 0)
        return POOL_NEUTRAL;
    return POOL_OK;
}

/* FNV-1a, then splitmix64's finaliser so that near keys spread. */
static uint64_t
hash_str(const char *s, uint64_t salt)
{
    return gw_mix64(gw_fnv1a64(GW_FNV1A64_OFFSET ^ salt, s, strlen(s)));
}

static uint64_t
rng_next(struct pool *p)
{
    uint64_t x = p->rng;

    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    p->rng = x;
    return x;
}

static int
cmp_point(const void *a, const void *b)
{
    const struct ring_point *x = a, *y = b;

    if (x->hash != y->hash)
        return x->hash < y->hash ? -1 : 1;
    return x->idx < y->idx ? -1 : x->idx > y->idx;
}

/* The consistent-hash ring for balance = prefix. */
static int
ring_build(struct pool *p)
{
    size_t i, k, per, len = 0;

    for (i = 0; i < p->n; i++) {
        per = (size_t)p->m[i].cfg->weight * RING_PER_WEIGHT;
        len += per < RING_MAX_PER_UPSTREAM ? per : RING_MAX_PER_UPSTREAM;
    }
    p->ring = gw_calloc(len, sizeof(*p->ring));
    if (p->ring == NULL)
        return GW_ENOMEM;
    for (i = 0; i < p->n; i++) {
        per = (size_t)p->m[i].cfg->weight * RING_PER_WEIGHT;
        if (per > RING_MAX_PER_UPSTREAM)
            per = RING_MAX_PER_UPSTREAM;
        for (k = 0; k < per; k++) {
            p->ring[p->ring_len].hash = hash_str(p->m[i].cfg->name, k + 1);
            p->ring[p->ring_len].idx = i;
            p->ring_len++;
        }
    }
    qsort(p->ring, p->ring_len, sizeof(*p->ring), cmp_point);
    return 0;
}

struct pool *
pool_new(const struct gw_config *cfg)
{
    struct pool *p = NULL;
    struct pool *ret = NULL;
    size_t i;

    p = gw_calloc(1, sizeof(*p));
    if (p == NULL)
        goto out;
    gw_mutex_init(&p->lock);
    p->cfg = cfg;
    p->n = cfg->num_upstreams;
    p->rng = (uint64_t)gw_now_us() | 1;
    p->m = gw_calloc(p->n > 0 ? p->n : 1, sizeof(*p->m));
    if (p->m == NULL)
        goto out;
    for (i = 0; i < p->n; i++) {
        p->m[i].cfg = &cfg->upstreams[i];
        for (size_t k = 0; k < cfg->upstreams[i].num_models; k++)
            metrics_model_known(cfg->upstreams[i].models[k]);
    }
    if (ring_build(p) != 0)
        goto out;
    ret = p;
    p = NULL;

out:
    pool_free(p);
    return ret;
}

static void
models_free(struct member *m)
{
    size_t i;

    for (i = 0; i < m->num_models; i++) {
        gw_free(m->ids[i]);
        gw_free(m->texts[i]);
    }
    gw_free(m->ids);
    gw_free(m->texts);
    m->ids = m->texts = NULL;
    m->num_models = 0;
}

void
pool_free(struct pool *p)
{
    size_t i;

    if (p == NULL)
        return;
    if (p->m != NULL)
        for (i = 0; i < p->n; i++)
            models_free(&p->m[i]);
    gw_free(p->m);
    gw_free(p->ring);
    gw_mutex_destroy(&p->lock);
    gw_free(p);
}

size_t
pool_size(const struct pool *p)
{
    return p->n;
}

/* ---- state, under the lock ---- */

/* The state now: an OPEN upstream whose time is up turns HALF_OPEN. */
static enum pool_state
state_now(struct member *m, int64_t now)
{
    if (m->state == POOL_OPEN && now >= m->open_until_ms) {
        m->state = POOL_HALF_OPEN;
        m->trial_out = 0;
    }
    return m->state;
}

/* Is it held back by its own Retry-After? */
static int
held(const struct member *m, int64_t now)
{
    return now < m->hold_until_ms;
}

/* May it get a new call (ignoring max_inflight)? */
static int
usable(struct member *m, int64_t now)
{
    enum pool_state s = state_now(m, now);

    if (held(m, now))
        return 0;
    return s == POOL_CLOSED || (s == POOL_HALF_OPEN && !m->trial_out);
}

/* Can it take a call, as /readyz counts (pool_ready() says why)? */
static int
ready_locked(struct pool *p, struct member *m, int64_t now)
{
    assert(gw_mutex_held(&p->lock));
    if (state_now(m, now) == POOL_OPEN || now < m->hold_until_ms)
        return 0;
    return p->cfg->health_interval_ms == 0 || m->probe == POOL_PROBE_PASSED;
}

static int
has_room(const struct member *m)
{
    return m->cfg->max_inflight == 0 || m->inflight < m->cfg->max_inflight;
}

/* Does the balancer read the engines' load (least_load, prefix)? */
static int
engine_aware(const struct pool *p)
{
    return p->cfg->balance == BALANCE_LEAST_LOAD
           || p->cfg->balance == BALANCE_PREFIX;
}

/* Is its engine saturated, for a balancer that reads engines? */
static int
engine_full(const struct pool *p, const struct member *m, int64_t now)
{
    return engine_aware(p) && engine_saturated(&m->load, p->cfg, now);
}

/*
 * May it take no call now: at max_inflight, or its engine saturated
 * (engine.h)?  Such a call waits in the gateway's queue instead.
 */
static int
full(const struct pool *p, const struct member *m, int64_t now)
{
    return !has_room(m) || engine_full(p, m, now);
}

/* A tenant's standing among the active ones (share_locked, pool.h). */
enum share {
    SHARE_ALONE,                /* no other tenant is active */
    SHARE_FAIR,                 /* others are, none before it */
    SHARE_AHEAD,                /* one is before it */
};

/*
 * The same for a call of a tenant standing 'sh': while tenants compete,
 * no call goes into an engine's queue, only to a place its batch has
 * now (engine.h); one ahead of its share learns an engine's room only
 * one place at a time (and leaves the headroom, headroom_left).
 */
static int
full_for(const struct pool *p, const struct member *m, int64_t now,
         enum share sh)
{
    if (sh == SHARE_ALONE || !engine_aware(p))
        return full(p, m, now);
    if (!has_room(m))
        return 1;
    return sh == SHARE_AHEAD
           ? !engine_has_place_slowly(&m->load, p->cfg, now)
           : !engine_has_place(&m->load, p->cfg, now);
}

/* Does a call of a tenant standing 'sh' leave the headroom free? */
static int
keeps_headroom(const struct pool *p, enum share sh)
{
    return sh == SHARE_AHEAD && p->cfg->headroom > 0;
}

/*
 * May a call that keeps the headroom (keeps_headroom(): its tenant is
 * ahead of its share) take a place in 'fleet' (the upstreams it may
 * use)?  It leaves 'headroom' of the places those batches have (to the
 * nearest whole one) free for the others: it may take one only while
 * more than that are free.  An upstream whose engine's load is not known
 * counts as room without end: nothing says no.
 */
static int
headroom_left(const struct pool *p, uint64_t fleet, int64_t now)
{
    double room = 0, free = 0, r, f;
    size_t i;

    for (i = 0; i < p->n; i++) {
        if (!(fleet & (UINT64_C(1) << i)))
            continue;
        if (engine_places(&p->m[i].load, p->cfg, now, &r, &f) != 0)
            return 1;
        room += r;
        if (has_room(&p->m[i]))
            free += f;
    }
    return free > (double)(uint64_t)(p->cfg->headroom * room + 0.5);
}

/* Its load as the balancer scores it (engine.h), to compare per weight. */
static double
score(const struct pool *p, const struct member *m, int64_t now)
{
    if (!engine_aware(p))
        return (double)m->inflight;
    return engine_score(&m->load, p->cfg, now, m->inflight);
}

/* A tenant's priority and weight (CONFIG_MAX_TENANTS: the default's). */
static int64_t
tenant_priority(const struct pool *p, size_t t)
{
    return t < p->cfg->num_tenants ? p->cfg->tenants[t].priority : 0;
}

static uint64_t
tenant_weight(const struct pool *p, size_t t)
{
    return t < p->cfg->num_tenants ? p->cfg->tenants[t].weight : 1;
}

/* Does tenant 't' count for the shares now (pool.h)? */
static int
tenant_active(const struct pool *p, size_t t, int64_t now)
{
    return p->t_open[t] > 0 || p->t_queued[t] > 0
           || (p->t_seen_ms[t] != 0
               && now - p->t_seen_ms[t] <= POOL_TENANT_ACTIVE_MS);
}

/*
 * Tenant 't''s standing (pool.h): alone, or among other active tenants,
 * and then ahead of its share if one of them has a higher priority, or
 * its own and fewer slots held per unit of weight.
 */
static enum share
share_locked(const struct pool *p, size_t t, int64_t now)
{
    int64_t pt = tenant_priority(p, t), pu;
    enum share sh = SHARE_ALONE;
    size_t u;

    if (!engine_aware(p))
        return SHARE_ALONE;
    for (u = 0; u <= CONFIG_MAX_TENANTS; u++) {
        if (u == t || (u >= p->cfg->num_tenants && u != CONFIG_MAX_TENANTS)
            || !tenant_active(p, u, now))
            continue;
        sh = SHARE_FAIR;
        pu = tenant_priority(p, u);
        if (pu > pt || (pu == pt && p->t_open[u] * tenant_weight(p, t)
                                    < p->t_open[t] * tenant_weight(p, u)))
            return SHARE_AHEAD;
    }
    return sh;
}

static const char *
tenant_label(const struct pool *p, size_t t)
{
    return t < p->cfg->num_tenants ? p->cfg->tenants[t].name : "default";
}

/*
 * Note a change of m's engine saturation in 'ev' (one log line per
 * operation; the gauge has every upstream's).
 */
static void
saturation_note_locked(struct pool *p, struct member *m, int64_t now,
                       struct event *ev)
{
    int s = engine_full(p, m, now);

    if (s == m->saturated)
        return;
    m->saturated = s;
    if (ev->what != NULL)
        return;
    ev->what = s ? "saturated" : "no longer saturated";
    ev->name = m->cfg->name;
    snprintf(ev->detail, sizeof(ev->detail), "waiting=%g running=%g "
             "kv_usage=%.2f started=%" PRIu64 " ended=%" PRIu64,
             m->load.last.waiting, m->load.last.running,
             m->load.last.kv_usage, m->load.started - m->load.started_then,
             m->load.ended - m->load.ended_then);
}

/*
 * Milliseconds until an unusable upstream may take a call again: when
 * its hold ends and (unless its set is in 'panic', which routes across
 * ejected ones) its ejection does.
 */
static int64_t
wait_of(const struct member *m, int64_t now, int panic)
{
    int64_t w = 0;

    if (!panic && m->state == POOL_OPEN && m->open_until_ms - now > w)
        w = m->open_until_ms - now;
    if (m->hold_until_ms - now > w)
        w = m->hold_until_ms - now;
    return w;
}

static int
serves(const struct member *m, const char *model)
{
    const struct config_upstream *u = m->cfg;
    size_t i;

    if (model == NULL)
        return 1;
    if (u->num_models > 0) {
        for (i = 0; i < u->num_models; i++)
            if (strcmp(u->models[i], model) == 0)
                return 1;
        return 0;
    }
    if (!m->models_known)
        return 1;               /* not asked yet: it may */
    for (i = 0; i < m->num_models; i++)
        if (strcmp(m->ids[i], model) == 0)
            return 1;
    return 0;
}

static uint64_t
serving_mask(struct pool *p, const char *model)
{
    uint64_t mask = 0;
    size_t i;

    for (i = 0; i < p->n; i++)
        if (serves(&p->m[i], model))
            mask |= UINT64_C(1) << i;
    return mask;
}

int
pool_serves(struct pool *p, const char *model)
{
    uint64_t mask;

    gw_mutex_lock(&p->lock);
    mask = serving_mask(p, model);
    gw_mutex_unlock(&p->lock);
    return mask != 0;
}

/* ---- sets: max_ejected and panic, under the lock ---- */

static size_t
count_of(uint64_t set)
{
    return (size_t)__builtin_popcountll(set);
}

/* How many of the upstreams in 'set' are usable now. */
static size_t
usable_in_locked(struct pool *p, uint64_t set, int64_t now)
{
    size_t i, k = 0;

    assert(gw_mutex_held(&p->lock));

    for (i = 0; i < p->n; i++)
        if ((set & (UINT64_C(1) << i)) && usable(&p->m[i], now))
            k++;
    return k;
}

/* Are fewer than panic_below of the upstreams in 'set' usable now? */
static int
in_panic_locked(struct pool *p, uint64_t set, int64_t now)
{
    assert(gw_mutex_held(&p->lock));
    return (double)usable_in_locked(p, set, now)
           < p->cfg->panic_below * (double)count_of(set);
}

/*
 * Of 'cand' (upstreams of the set 'serve' a call may still try), the ones
 * it may use now: the usable ones, or while 'serve' is in panic (OUT
 * *panic, unless NULL) every one not held back.  Panic overrules the
 * breakers, which may be wrong (a poison request); a Retry-After is the
 * upstream's own word that it cannot take a call now, and calls sent
 * anyway would only earn more 429s and 503s.
 */
static uint64_t
usable_mask_locked(struct pool *p, uint64_t serve, uint64_t cand,
                   int64_t now, int *panic)
{
    uint64_t use = 0, bit;
    size_t i;
    int in = in_panic_locked(p, serve, now);

    assert(gw_mutex_held(&p->lock));

    if (panic != NULL)
        *panic = in;
    for (i = 0; i < p->n; i++) {
        bit = UINT64_C(1) << i;
        if ((cand & bit) && (in ? !held(&p->m[i], now)
                                : usable(&p->m[i], now)))
            use |= bit;
    }
    return use;
}

/*
 * The Retry-After, in seconds, for a call of the set 'serve' that finds
 * none of 'mask' usable: until the first of them may take a call again
 * (a hold's remaining time, say), at least 1.
 */
static int
retry_after_locked(struct pool *p, uint64_t serve, uint64_t mask,
                   int64_t now)
{
    int64_t soonest = INT64_MAX, w;
    int panic = in_panic_locked(p, serve, now);
    size_t i;

    assert(gw_mutex_held(&p->lock));

    for (i = 0; i < p->n; i++) {
        if (!(mask & (UINT64_C(1) << i)))
            continue;
        w = wait_of(&p->m[i], now, panic);
        if (w < soonest)
            soonest = w;
    }
    if (soonest == INT64_MAX || soonest <= 0)
        return 1;
    return (int)gw_ms_to_s_ceil((uint64_t)soonest);
}

/* A call found 'set' in panic: remember it, and log it if it is new. */
static void
panic_note_locked(struct pool *p, uint64_t set, int64_t now,
                  struct event *ev)
{
    size_t i;

    assert(gw_mutex_held(&p->lock));

    for (i = 0; i < p->num_panic; i++)
        if (p->panic[i] == set)
            return;
    if (p->num_panic == POOL_PANIC_MAX)
        return;                 /* routed so all the same, not counted */
    p->panic[p->num_panic++] = set;
    ev->what = "panic";
    ev->set = set;
    ev->usable = usable_in_locked(p, set, now);
}

/*
 * Forget the sets that are out of panic now, logging the first in 'ev'
 * (the others stay for the next sweep to log).  Returns how many sets
 * are in panic.
 */
static size_t
panic_sweep_locked(struct pool *p, int64_t now, struct event *ev)
{
    size_t i = 0, in = 0;

    assert(gw_mutex_held(&p->lock));

    while (i < p->num_panic) {
        if (in_panic_locked(p, p->panic[i], now)) {
            in++;
        } else if (ev->what == NULL) {
            ev->what = "panic over";
            ev->set = p->panic[i];
            ev->usable = usable_in_locked(p, ev->set, now);
            p->panic[i] = p->panic[--p->num_panic];
            continue;
        }
        i++;
    }
    return in;
}

/* May one more upstream of 'set' be out (not CLOSED) under max_ejected? */
static int
set_may_lose_one_locked(struct pool *p, uint64_t set, int64_t now)
{
    size_t i, out = 0, most;

    assert(gw_mutex_held(&p->lock));

    /* The share as a count, rounded down (1e-9: 0.3 x 10 is 2.99...96). */
    most = (size_t)(p->cfg->max_ejected * (double)count_of(set) + 1e-9);
    if (most < 1)
        most = 1;               /* one may always be out */
    for (i = 0; i < p->n; i++)
        if ((set & (UINT64_C(1) << i)) && state_now(&p->m[i], now)
                                             != POOL_CLOSED)
            out++;
    return out + 1 <= most;
}

/*
 * May the CLOSED upstream 'idx' be ejected under max_ejected?  For every
 * model it serves, no more than that share of the model's upstreams may
 * be out.  The models are the names upstreams list (their configured
 * models, or those their GET /v1/models gave) that 'idx' serves.  When
 * no listed name is one of them (no upstream has answered yet), the set
 * is every upstream that may serve any model, 'idx' among them.  A name
 * two upstreams list is checked twice, which costs time, not
 * correctness; this runs only when an ejection is due.
 */
static int
may_eject_locked(struct pool *p, size_t idx, int64_t now)
{
    const struct member *m = &p->m[idx], *o;
    char *const *names;
    uint64_t unlisted = 0;
    size_t j, k, num;
    int named = 0;

    assert(gw_mutex_held(&p->lock));

    if (p->cfg->max_ejected >= 1.0)
        return 1;
    for (j = 0; j < p->n; j++) {
        o = &p->m[j];
        names = o->cfg->num_models > 0 ? o->cfg->models : o->ids;
        num = o->cfg->num_models > 0 ? o->cfg->num_models : o->num_models;
        if (o->cfg->num_models == 0 && !o->models_known)
            unlisted |= UINT64_C(1) << j;
        for (k = 0; k < num; k++) {
            if (!serves(m, names[k]))
                continue;
            named = 1;
            if (!set_may_lose_one_locked(p, serving_mask(p, names[k]), now))
                return 0;
        }
    }
    return named || set_may_lose_one_locked(p, unlisted, now);
}

int
pool_has_other(struct pool *p, const struct pool_want *want, size_t idx)
{
    int64_t now = gw_now_ms();
    uint64_t serve, use;
    size_t i;
    int ok = 0;

    gw_mutex_lock(&p->lock);
    serve = serving_mask(p, want->model);
    use = usable_mask_locked(p, serve, serve & ~want->exclude
                      & ~(UINT64_C(1) << idx), now, NULL);
    for (i = 0; i < p->n && !ok; i++)
        ok = (use & (UINT64_C(1) << i)) && !full(p, &p->m[i], now);
    gw_mutex_unlock(&p->lock);
    return ok;
}

static void
take_slot(struct pool *p, struct member *m, struct pool_slot *slot,
          size_t idx, size_t tenant, int64_t now)
{
    m->inflight++;
    m->load.started++;
    m->calls++;
    p->t_open[tenant]++;
    p->t_seen_ms[tenant] = now;
    slot->idx = (int)idx;
    slot->tenant = tenant;
    slot->trial = 0;
    /* In panic a call may come while the trial is out: it is none. */
    if (m->state == POOL_HALF_OPEN && !m->trial_out) {
        m->trial_out = 1;
        slot->trial = ++m->trial_gen;
    }
}

/* Is 'trial' the half-open upstream's current trial?  Then it is over. */
static void
end_trial(struct member *m, uint64_t trial)
{
    if (trial != 0 && trial == m->trial_gen && m->state == POOL_HALF_OPEN)
        m->trial_out = 0;
}

/* ---- the balancers, under the lock; 'room' is never empty ---- */

static size_t
lowest_bit(uint64_t mask)
{
    return (size_t)__builtin_ctzll(mask);
}

/* An upstream of 'mask' at random, in proportion to weight. */
static size_t
weighted_random(struct pool *p, uint64_t mask)
{
    uint64_t total = 0, r;
    size_t i;

    for (i = 0; i < p->n; i++)
        if (mask & (UINT64_C(1) << i))
            total += p->m[i].cfg->weight;
    r = rng_next(p) % total;
    for (i = 0; i < p->n; i++) {
        if (!(mask & (UINT64_C(1) << i)))
            continue;
        if (r < p->m[i].cfg->weight)
            return i;
        r -= p->m[i].cfg->weight;
    }
    return lowest_bit(mask);
}

/*
 * Power of two choices: two weighted picks, the lighter one by score()
 * per weight (open calls for least_inflight, the engine's load for
 * least_load).
 */
static size_t
pick_two(struct pool *p, uint64_t room, int64_t now)
{
    size_t a, b;
    const struct member *ma, *mb;

    if ((room & (room - 1)) == 0)
        return lowest_bit(room);
    a = weighted_random(p, room);
    b = weighted_random(p, room & ~(UINT64_C(1) << a));
    ma = &p->m[a];
    mb = &p->m[b];
    /* score / weight, compared without dividing */
    return score(p, mb, now) * (double)ma->cfg->weight
           < score(p, ma, now) * (double)mb->cfg->weight ? b : a;
}

/* nginx's smooth weighted round robin over 'room'. */
static size_t
pick_round_robin(struct pool *p, uint64_t room)
{
    int64_t total = 0;
    size_t i, best = p->n;

    for (i = 0; i < p->n; i++) {
        if (!(room & (UINT64_C(1) << i)))
            continue;
        p->m[i].swrr += (int64_t)p->m[i].cfg->weight;
        total += (int64_t)p->m[i].cfg->weight;
        if (best == p->n || p->m[i].swrr > p->m[best].swrr)
            best = i;
    }
    p->m[best].swrr -= total;
    return best;
}

/*
 * Consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam
 * 2016): walk the ring from the key's point and take the first upstream
 * with room whose load (score(): the engine's, or its open calls), with
 * this call, stays within (1 + epsilon) times its weighted share of the
 * load on 'usable' upstreams.  The same prefix keeps landing on the same
 * upstream until that one is loaded past the bound; then it spills to
 * the next on the ring.
 */
static size_t
pick_prefix(struct pool *p, uint64_t room, uint64_t usable_mask,
            uint64_t key, int64_t now)
{
    uint64_t wsum = 0, seen = 0, bit;
    size_t lo = 0, hi = p->ring_len, mid, k, i;
    double total = 1, bound;

    for (i = 0; i < p->n; i++) {
        if (usable_mask & (UINT64_C(1) << i)) {
            total += score(p, &p->m[i], now);
            wsum += p->m[i].cfg->weight;
        }
    }
    while (lo < hi) {
        mid = lo + (hi - lo) / 2;
        if (p->ring[mid].hash < key)
            lo = mid + 1;
        else
            hi = mid;
    }
    for (k = 0; k < p->ring_len; k++) {
        i = p->ring[(lo + k) % p->ring_len].idx;
        bit = UINT64_C(1) << i;
        if (!(room & bit) || (seen & bit))
            continue;
        seen |= bit;
        bound = (1.0 + p->cfg->prefix_epsilon) * total
                * (double)p->m[i].cfg->weight / (double)wsum;
        if (score(p, &p->m[i], now) + 1 <= bound + 0.999999)
            return i;           /* within ceil(bound) */
        if (seen == room)
            break;
    }
    return pick_two(p, room, now);
}

static size_t
pick(struct pool *p, uint64_t room, uint64_t usable_mask, uint64_t key,
     int64_t now)
{
    switch (p->cfg->balance) {
    case BALANCE_ROUND_ROBIN:
        return pick_round_robin(p, room);
    case BALANCE_PREFIX:
        return pick_prefix(p, room, usable_mask, key, now);
    default:                    /* least_load, least_inflight: score() */
        return pick_two(p, room, now);
    }
}

/* ---- the log, without the lock ---- */

/* "u0,u1,..." for the upstreams of 'set' (cfg is immutable). */
static void
set_names(const struct pool *p, uint64_t set, char *out, size_t size)
{
    size_t i, len = 0;
    int n;

    out[0] = '\0';
    for (i = 0; i < p->n; i++) {
        if (!(set & (UINT64_C(1) << i)))
            continue;
        n = snprintf(out + len, size - len, "%s%s", len > 0 ? "," : "",
                     p->cfg->upstreams[i].name);
        if (n < 0 || (size_t)n >= size - len) {
            snprintf(out + len, size - len, ",...");
            return;             /* cut short: 64 names may not fit */
        }
        len += (size_t)n;
    }
}

static void
log_event(const struct pool *p, const struct event *ev)
{
    char names[256];

    if (ev->what == NULL)
        return;
    if (ev->set != 0) {
        set_names(p, ev->set, names, sizeof(names));
        log_msg(strcmp(ev->what, "panic") == 0 ? GW_LOG_WARN : GW_LOG_INFO,
                "pool: %s usable=%zu/%zu panic_below=%g%% upstreams=%s",
                ev->what, ev->usable, count_of(ev->set),
                p->cfg->panic_below * 100, names);
    } else if (ev->ms > 0) {
        log_msg(GW_LOG_WARN, "pool: upstream %s %s for %" PRId64 "ms "
                "last_failure=%s", ev->name, ev->what, ev->ms, ev->why);
    } else if (ev->detail[0] != '\0') {
        log_msg(GW_LOG_INFO, "pool: upstream %s %s %s", ev->name, ev->what,
                ev->detail);
    } else if (ev->why != NULL) {
        log_msg(GW_LOG_WARN, "pool: upstream %s %s last_failure=%s",
                ev->name, ev->what, ev->why);
    } else {
        log_msg(GW_LOG_INFO, "pool: upstream %s %s", ev->name, ev->what);
    }
}

/* ---- admission ---- */

static void queue_remove(struct pool *p, struct waiter *w);

/*
 * After an ejection or a hold: a waiter none of whose upstreams is
 * usable now would only sleep to its queue_timeout; tell it at once.
 */
static void
wake_hopeless(struct pool *p, int64_t now)
{
    struct waiter *w, *next;

    for (w = p->q_head; w != NULL; w = next) {
        next = w->next;
        if (usable_mask_locked(p, w->serve, w->mask, now, NULL) != 0)
            continue;
        w->granted = -2;
        queue_remove(p, w);
        pthread_cond_signal(&w->cv);
    }
}

static void
queue_remove(struct pool *p, struct waiter *w)
{
    struct waiter **pp, *prev = NULL;

    for (pp = &p->q_head; *pp != NULL; prev = *pp, pp = &(*pp)->next) {
        if (*pp == w) {
            *pp = w->next;
            if (p->q_tail == w)
                p->q_tail = prev;
            p->q_len--;
            return;
        }
    }
}

/*
 * Does waiter 'a' go before 'b' (DESIGN.md "Fleet-aware scheduling")?
 * The higher priority first; within a band, the tenant with fewer slots
 * held per unit of weight.  Equals: neither, so the older (the queue is
 * in arrival order) goes first, and a tenant's own calls stay in order.
 */
static int
goes_before(const struct pool *p, const struct waiter *a,
            const struct waiter *b)
{
    int64_t pa = tenant_priority(p, a->tenant);
    int64_t pb = tenant_priority(p, b->tenant);

    if (pa != pb)
        return pa > pb;
    return p->t_open[a->tenant] * tenant_weight(p, b->tenant)
           < p->t_open[b->tenant] * tenant_weight(p, a->tenant);
}

/*
 * Of the waiters that may use upstream 'idx' now (while it is not
 * usable, only one whose set is in panic, and none while it is held
 * back), the one whose turn it is.
 */
static struct waiter *
next_waiter_locked(struct pool *p, size_t idx, int64_t now)
{
    uint64_t bit = UINT64_C(1) << idx;
    struct waiter *w, *best = NULL;

    for (w = p->q_head; w != NULL; w = w->next) {
        if (!(w->mask & bit)
            || usable_mask_locked(p, w->serve, bit, now, NULL) == 0)
            continue;
        if (best == NULL || goes_before(p, w, best))
            best = w;
    }
    return best;
}

/*
 * Upstream 'idx' may take calls again (a slot came free, its engine's
 * queue shrank): hand them to the waiters whose turn it is, as long as
 * it is not full.
 */
static void
grant(struct pool *p, size_t idx, int64_t now)
{
    struct member *m = &p->m[idx];
    struct waiter *w;
    struct pool_slot s;
    enum share sh;

    while ((w = next_waiter_locked(p, idx, now)) != NULL) {
        sh = share_locked(p, w->tenant, now);
        if (full_for(p, m, now, sh))
            break;
        /* The waiter's fleet is walked only when the headroom applies. */
        if (keeps_headroom(p, sh)
            && !headroom_left(p, usable_mask_locked(p, w->serve, w->mask,
                                                    now, NULL), now))
            break;
        take_slot(p, m, &s, idx, w->tenant, now);
        w->granted = (int)idx;
        w->trial = s.trial;
        queue_remove(p, w);
        pthread_cond_signal(&w->cv);
    }
}

int
pool_acquire(struct pool *p, const struct pool_want *want,
             struct pool_slot *slot, int *retry_after_s)
{
    struct event ev = NO_EVENT, sev = NO_EVENT;
    size_t t = want->tenant <= CONFIG_MAX_TENANTS ? want->tenant
                                                   : CONFIG_MAX_TENANTS;
    uint64_t serve, cand, use, room = 0, open = 0, bit;
    int64_t now = gw_now_ms(), deadline;
    struct waiter w;
    size_t i;
    int rc, gone, panic;
    enum share sh;

    slot->idx = -1;
    slot->tenant = t;
    slot->trial = 0;
    slot->queued = 0;
    *retry_after_s = 1;
    gw_mutex_lock(&p->lock);
    serve = serving_mask(p, want->model);
    cand = serve & ~want->exclude;
    use = usable_mask_locked(p, serve, cand, now, &panic);
    /* A panic that leaves nothing to send to (every one held back) has
     * changed no call: not noted. */
    if (panic && use != 0)
        panic_note_locked(p, serve, now, &ev);
    /* A retry or hedge goes on with a request already admitted. */
    sh = want->no_wait ? SHARE_ALONE : share_locked(p, t, now);
    for (i = 0; i < p->n; i++) {
        bit = UINT64_C(1) << i;
        if (use & bit) {
            if (!full(p, &p->m[i], now))
                open |= bit;
            if (!full_for(p, &p->m[i], now, sh))
                room |= bit;
        }
    }
    if (cand == 0) {
        rc = GW_ENOTFOUND;
        goto out;
    }
    if (use == 0) {
        /* A retry or hedge (no_wait) finding none is not a 503: its
         * request is answered with the failure it retried. */
        if (!want->no_wait)
            p->unavailable++;
        *retry_after_s = retry_after_locked(p, serve, cand, now);
        rc = GW_EUNAVAIL;
        goto out;
    }
    if (room != 0 && keeps_headroom(p, sh) && !headroom_left(p, use, now))
        room = 0;
    if (room != 0) {
        i = pick(p, room, use, want->prefix_hash, now);
        take_slot(p, &p->m[i], slot, i, t, now);
        saturation_note_locked(p, &p->m[i], now, &sev);
        rc = 0;
        goto out;
    }

    /* Every usable candidate is full or saturated: wait in line. */
    rc = GW_EUNAVAIL;
    if (want->no_wait)
        goto out;
    if (tenant_priority(p, t) < 0 && open == 0) {
        /* Sheddable: the fleet is saturated, so not now (429). */
        p->t_shed[t]++;
        rc = GW_ESHED;
        goto out;
    }
    rc = GW_ETIMEDOUT;
    if (p->cfg->queue_timeout_ms == 0 || p->stopping) {
        p->queue_timeouts++;
        p->t_timeouts[t]++;
        rc = p->stopping ? GW_ESTOPPING : GW_ETIMEDOUT;
        goto out;
    }
    memset(&w, 0, sizeof(w));
    gw_cond_init(&w.cv);
    w.mask = use;
    w.serve = serve;
    w.tenant = t;
    w.granted = -1;
    if (p->q_tail != NULL)
        p->q_tail->next = &w;
    else
        p->q_head = &w;
    p->q_tail = &w;
    p->q_len++;
    p->queue_waits++;
    p->t_queued[t]++;
    deadline = now + p->cfg->queue_timeout_ms;
    while (w.granted == -1 && !p->stopping) {
        int64_t until = gw_now_ms() + POOL_QUEUE_CHECK_MS;

        if (gw_cond_timedwait(&w.cv, &p->lock,
                              until < deadline ? until : deadline) == 0)
            continue;                   /* signalled (or spurious) */
        if (gw_now_ms() >= deadline)
            break;
        if (want->gone == NULL)
            continue;
        /* Its I/O (a peek at a socket) goes without the lock. */
        gw_mutex_unlock(&p->lock);
        gone = want->gone(want->gone_arg);
        gw_mutex_lock(&p->lock);
        if (gone && w.granted == -1) {
            w.granted = -3;
            break;
        }
    }
    p->t_queued[t]--;
    p->t_waits[t]++;
    p->t_wait_ms[t] += (uint64_t)(gw_now_ms() - now);
    if (w.granted >= 0) {
        slot->idx = w.granted;
        slot->tenant = t;
        slot->trial = w.trial;
        slot->queued = 1;
        rc = 0;
    } else if (w.granted == -2) {
        /* Every upstream it could use went away (ejected, held back). */
        p->unavailable++;
        *retry_after_s = retry_after_locked(p, serve, w.mask, gw_now_ms());
        rc = GW_EUNAVAIL;
    } else if (w.granted == -3) {
        queue_remove(p, &w);
        rc = GW_EABORTED;       /* its client left: no slot, no call */
    } else {
        queue_remove(p, &w);
        p->queue_timeouts++;
        p->t_timeouts[t]++;
        rc = p->stopping ? GW_ESTOPPING : GW_ETIMEDOUT;
    }
    pthread_cond_destroy(&w.cv);

out:
    gw_mutex_unlock(&p->lock);
    log_event(p, &ev);
    log_event(p, &sev);
    return rc;
}

/* Eject 'm' (under the lock); fills 'ev' for the log line. */
static void
eject(struct pool *p, struct member *m, int64_t now, const char *why,
      struct event *ev)
{
    int64_t ms;

    if (m->closed_ms != 0 && now - m->closed_ms > POOL_EJECT_MAX_MS)
        m->streak = 0;          /* it stayed up long enough: start over */
    ms = p->cfg->eject_time_ms << m->streak;
    if (ms > POOL_EJECT_MAX_MS)
        ms = POOL_EJECT_MAX_MS;
    if (m->streak < STREAK_MAX)
        m->streak++;
    m->state = POOL_OPEN;
    m->open_until_ms = now + ms;
    m->fails = 0;
    m->trial_out = 0;
    m->capped = 0;
    m->ejections++;
    ev->what = "ejected";
    ev->name = m->cfg->name;
    ev->ms = ms;
    ev->why = why;
}

/*
 * 'm' (CLOSED) has failed eject_after times in a row: eject it, unless
 * max_ejected says no (under the lock).
 */
static void
eject_or_keep_locked(struct pool *p, struct member *m,
                     enum pool_outcome o, int64_t now, struct event *ev)
{
    assert(gw_mutex_held(&p->lock));
    if (may_eject_locked(p, (size_t)(m - p->m), now)) {
        eject(p, m, now, pool_outcome_name(o), ev);
        return;
    }
    m->capped_total++;
    if (m->capped)
        return;                 /* said once already */
    m->capped = 1;
    ev->what = "kept in: max_ejected of a model's upstreams are out";
    ev->name = m->cfg->name;
    ev->why = pool_outcome_name(o);
}

/* Judge an outcome for 'm' (under the lock). */
static void
judge(struct pool *p, struct member *m, enum pool_outcome o,
      int64_t retry_after_ms, int64_t now, struct event *ev)
{
    enum pool_state s = state_now(m, now);

    if (o == POOL_NEUTRAL)
        return;
    if (o == POOL_OK) {
        m->fails = 0;
        if (s == POOL_HALF_OPEN) {
            m->state = POOL_CLOSED;
            m->closed_ms = now;
            ev->what = "closed";
            ev->name = m->cfg->name;
            for (size_t i = 0; i < p->n; i++)
                p->m[i].capped = 0;     /* a new state of the sets */
        }
        return;
    }
    m->failures[o]++;
    if (retry_after_ms > 0) {
        /* One Retry-After counts once, however many calls bring it. */
        if (now < m->hold_until_ms)
            return;
        if (retry_after_ms > HTTP_RETRY_AFTER_MAX_MS)
            retry_after_ms = HTTP_RETRY_AFTER_MAX_MS;
        m->hold_until_ms = now + retry_after_ms;
    }
    if (s == POOL_HALF_OPEN) {
        eject(p, m, now, "the half-open trial failed", ev);
    } else if (s == POOL_CLOSED && ++m->fails >= p->cfg->eject_after) {
        eject_or_keep_locked(p, m, o, now, ev);
    }
    if (m->state == POOL_OPEN || now < m->hold_until_ms)
        wake_hopeless(p, now);
}

/*
 * Judge outcome 'o' for upstream 'idx' (and the end of trial 'trial'),
 * then hand a slot that may have come free to a waiter.  'gone': the
 * tenant of a slot given back; NULL none is.
 */
static void
settle(struct pool *p, size_t idx, uint64_t trial, const size_t *gone,
       enum pool_outcome o, int64_t retry_after_ms)
{
    struct event ev = NO_EVENT, pev = NO_EVENT, sev = NO_EVENT;
    struct member *m = &p->m[idx];
    int64_t now = gw_now_ms();

    gw_mutex_lock(&p->lock);
    if (gone != NULL) {
        m->inflight--;
        m->load.ended++;
        p->t_open[*gone]--;
        p->t_seen_ms[*gone] = now;
    }
    end_trial(m, trial);
    judge(p, m, o, retry_after_ms, now, &ev);
    saturation_note_locked(p, m, now, &sev);
    grant(p, idx, now);
    panic_sweep_locked(p, now, &pev);
    gw_mutex_unlock(&p->lock);
    log_event(p, &ev);
    log_event(p, &pev);
    log_event(p, &sev);
}

void
pool_release(struct pool *p, struct pool_slot *slot, enum pool_outcome o,
             int64_t retry_after_ms)
{
    if (slot->idx < 0)
        return;
    settle(p, (size_t)slot->idx, slot->trial, &slot->tenant, o,
           retry_after_ms);
    slot->idx = -1;
    slot->trial = 0;
}

void
pool_note_answer(struct pool *p, struct pool_slot *slot)
{
    if (slot->idx < 0)
        return;
    settle(p, (size_t)slot->idx, slot->trial, NULL, POOL_OK, 0);
    slot->trial = 0;
}

void
pool_judge(struct pool *p, size_t idx, enum pool_outcome o, int poison)
{
    if (!poison) {
        settle(p, idx, 0, NULL, o, 0);
        return;
    }
    if (o == POOL_OK || o == POOL_NEUTRAL)
        return;
    gw_mutex_lock(&p->lock);
    p->m[idx].failures[o]++;
    gw_mutex_unlock(&p->lock);
}

void
pool_note_poison(struct pool *p)
{
    gw_mutex_lock(&p->lock);
    p->poison++;
    gw_mutex_unlock(&p->lock);
}

/* ---- the budget ---- */

/* The bucket for now, emptied if it holds an older second. */
static size_t
bucket(struct pool *p)
{
    int64_t sec = gw_now_ms() / 1000;
    size_t i = (size_t)(sec % POOL_BUDGET_WINDOW_S);

    if (p->bucket_s[i] != sec) {
        p->bucket_s[i] = sec;
        p->bucket_req[i] = 0;
        p->bucket_retry[i] = 0;
    }
    return i;
}

static int
budget_allows(struct pool *p)
{
    int64_t sec = gw_now_ms() / 1000;
    uint64_t req = 0, retry = 0;
    double allowed;
    size_t i;

    for (i = 0; i < POOL_BUDGET_WINDOW_S; i++) {
        if (sec - p->bucket_s[i] < POOL_BUDGET_WINDOW_S) {
            req += p->bucket_req[i];
            retry += p->bucket_retry[i];
        }
    }
    allowed = p->cfg->retry_budget * (double)req;
    if (allowed < (double)p->cfg->retry_budget_min)
        allowed = (double)p->cfg->retry_budget_min;
    return (double)retry + 1 <= allowed;
}

void
pool_note_request(struct pool *p)
{
    gw_mutex_lock(&p->lock);
    p->bucket_req[bucket(p)]++;
    gw_mutex_unlock(&p->lock);
}

void
pool_note_resend(struct pool *p, struct pool_slot *slot)
{
    if (slot->idx < 0)
        return;
    gw_mutex_lock(&p->lock);
    p->m[slot->idx].calls++;
    p->resends++;
    p->bucket_retry[bucket(p)]++;
    gw_mutex_unlock(&p->lock);
}

int
pool_budget_take(struct pool *p, const struct pool_slot *slot, int hedge)
{
    struct member *m = slot->idx >= 0 ? &p->m[slot->idx] : NULL;
    int ok;

    gw_mutex_lock(&p->lock);
    ok = budget_allows(p);
    if (ok) {
        p->bucket_retry[bucket(p)]++;
        if (hedge)
            p->hedges++;
        else
            p->retries++;
        if (m != NULL && hedge)
            m->hedges++;
        else if (m != NULL)
            m->retries++;
    } else {
        p->budget_refused++;
    }
    gw_mutex_unlock(&p->lock);
    return ok;
}

void
pool_note_hedge_won(struct pool *p, const struct pool_slot *slot)
{
    if (slot->idx < 0)
        return;
    gw_mutex_lock(&p->lock);
    p->m[slot->idx].hedges_won++;
    gw_mutex_unlock(&p->lock);
}

int
pool_budget_peek(struct pool *p)
{
    int ok;

    gw_mutex_lock(&p->lock);
    ok = budget_allows(p);
    gw_mutex_unlock(&p->lock);
    return ok;
}

void
pool_budget_refuse(struct pool *p)
{
    gw_mutex_lock(&p->lock);
    p->budget_refused++;
    gw_mutex_unlock(&p->lock);
}

int
pool_ready(struct pool *p)
{
    int64_t now = gw_now_ms();
    size_t i;
    int ok = 0;

    gw_mutex_lock(&p->lock);
    for (i = 0; i < p->n && !ok; i++)
        ok = ready_locked(p, &p->m[i], now);
    gw_mutex_unlock(&p->lock);
    return ok;
}

void
pool_stop(struct pool *p)
{
    struct waiter *w;

    gw_mutex_lock(&p->lock);
    p->stopping = 1;
    for (w = p->q_head; w != NULL; w = w->next)
        pthread_cond_signal(&w->cv);
    gw_mutex_unlock(&p->lock);
}

/* ---- the engines' load (scrape.c) ---- */

struct engine_mark
pool_load_mark(struct pool *p, size_t idx)
{
    struct engine_mark mk;

    gw_mutex_lock(&p->lock);
    mk = engine_mark(&p->m[idx].load);
    gw_mutex_unlock(&p->lock);
    return mk;
}

void
pool_set_load(struct pool *p, size_t idx, const struct engine_report *r,
              const struct engine_mark *sent)
{
    struct event ev = NO_EVENT;
    struct member *m = &p->m[idx];
    int64_t now = gw_now_ms();

    gw_mutex_lock(&p->lock);
    if (r != NULL)
        engine_report(&m->load, r, sent, now);
    else
        engine_unknown(&m->load);
    saturation_note_locked(p, m, now, &ev);
    grant(p, idx, now);
    gw_mutex_unlock(&p->lock);
    log_event(p, &ev);
}

/* ---- health probes and models ---- */

int
pool_probe_begin(struct pool *p, size_t idx, uint64_t *trial)
{
    struct member *m = &p->m[idx];
    int ok = 1;

    *trial = 0;
    gw_mutex_lock(&p->lock);
    if (state_now(m, gw_now_ms()) == POOL_HALF_OPEN) {
        ok = !m->trial_out;
        if (ok) {
            m->trial_out = 1;
            *trial = ++m->trial_gen;
        }
    }
    gw_mutex_unlock(&p->lock);
    return ok;
}

void
pool_probe_end(struct pool *p, size_t idx, uint64_t trial,
               enum pool_outcome o, int status)
{
    struct member *m = &p->m[idx];

    /* The verdict first, in a section of its own: a reader in between
     * sees it before the failure it comes with, never the reverse. */
    gw_mutex_lock(&p->lock);
    if (o != POOL_OK && o != POOL_NEUTRAL)
        m->probe = POOL_PROBE_FAILED;
    else if (status > 0)
        m->probe = POOL_PROBE_PASSED;
    gw_mutex_unlock(&p->lock);
    settle(p, idx, trial, NULL, o, 0);
}

void
pool_carry_probes(struct pool *to, struct pool *from)
{
    enum pool_probe v[CONFIG_MAX_UPSTREAMS];
    size_t i, k;

    /* Copied out first: never two pools' locks at once. */
    gw_mutex_lock(&from->lock);
    for (k = 0; k < from->n; k++)
        v[k] = from->m[k].probe;
    gw_mutex_unlock(&from->lock);
    gw_mutex_lock(&to->lock);
    for (i = 0; i < to->n; i++)
        for (k = 0; k < from->n; k++)
            if (strcmp(to->m[i].cfg->name, from->m[k].cfg->name) == 0
                && strcmp(to->m[i].cfg->url, from->m[k].cfg->url) == 0)
                to->m[i].probe = v[k];
    gw_mutex_unlock(&to->lock);
}

void
pool_set_models(struct pool *p, size_t idx, char **ids, char **texts,
                size_t n)
{
    struct member *m = &p->m[idx];
    struct member old;

    /* Its models get their own label value in the request histograms
     * (metrics.h).  Before the pool lock: metrics takes its own (one
     * lock at a time). */
    for (size_t i = 0; i < n; i++)
        metrics_model_known(ids[i]);
    gw_mutex_lock(&p->lock);
    old.ids = m->ids;
    old.texts = m->texts;
    old.num_models = m->num_models;
    m->ids = ids;
    m->texts = texts;
    m->num_models = n;
    m->models_known = 1;
    gw_mutex_unlock(&p->lock);
    models_free(&old);          /* outside the lock */
}

/*
 * The ids put in the /v1/models answer so far: an open-addressed set of
 * borrowed strings, twice the size of what may go in, so a lookup is a
 * probe or two (64 upstreams of 320 models each stay cheap under the
 * pool lock).
 */
struct idset {
    const char **slot;
    size_t mask;
};

/* Add 'id'; 1 if it is new, 0 if it was there. */
static int
idset_add(struct idset *set, const char *id)
{
    size_t k = (size_t)hash_str(id, 0) & set->mask;

    while (set->slot[k] != NULL) {
        if (strcmp(set->slot[k], id) == 0)
            return 0;
        k = (k + 1) & set->mask;
    }
    set->slot[k] = id;
    return 1;
}

/* The cached object for 'id' from m's GET /v1/models, or NULL. */
static const char *
model_text(const struct member *m, const char *id)
{
    size_t i;

    for (i = 0; i < m->num_models; i++)
        if (strcmp(m->ids[i], id) == 0)
            return m->texts[i];
    return NULL;
}

/*
 * One entry of the union, unless its id is in already.  A configured
 * model the upstream did not list (or was not asked about) gets a
 * minimal object; names are validated by config.c (no quotes,
 * backslashes or controls), so they need no escaping.
 */
static int
add_model(struct buf *out, const struct member *m, const char *id,
          const char *text, struct idset *done, size_t *ndone)
{
    int rc;

    if (!idset_add(done, id))
        return 0;
    if ((*ndone)++ > 0 && (rc = buf_append(out, ",", 1)) != 0)
        return rc;
    if (text != NULL)
        return buf_append(out, text, strlen(text));
    return buf_printf(out, "{\"id\":\"%s\",\"object\":\"model\","
                      "\"created\":0,\"owned_by\":\"%s\"}", id,
                      m->cfg->name);
}

int
pool_models_json(struct pool *p, struct buf *out)
{
    struct idset done = { NULL, 0 };
    size_t ndone = 0, cap = 0, size = 2, i, k;
    int64_t now = gw_now_ms();
    const struct member *m;
    int rc = GW_ENOMEM;

    gw_mutex_lock(&p->lock);
    for (i = 0; i < p->n; i++)
        cap += p->m[i].cfg->num_models + p->m[i].num_models;
    while (size < 2 * cap)
        size *= 2;
    done.slot = gw_calloc(size, sizeof(*done.slot));
    done.mask = size - 1;
    if (done.slot == NULL)
        goto out;
    rc = buf_append_str(out, "{\"object\":\"list\",\"data\":[");
    for (i = 0; i < p->n && rc == 0; i++) {
        m = &p->m[i];
        if (state_now(&p->m[i], now) == POOL_OPEN)
            continue;
        if (m->cfg->num_models > 0) {
            for (k = 0; k < m->cfg->num_models && rc == 0; k++)
                rc = add_model(out, m, m->cfg->models[k],
                               model_text(m, m->cfg->models[k]), &done,
                               &ndone);
        } else {
            for (k = 0; k < m->num_models && rc == 0; k++)
                rc = add_model(out, m, m->ids[k], m->texts[k], &done,
                               &ndone);
        }
    }
    if (rc == 0)
        rc = buf_append(out, "]}", 2);

out:
    gw_mutex_unlock(&p->lock);
    gw_free(done.slot);
    return rc;
}

/* ---- /metrics ---- */

enum pool_state
pool_state_of(struct pool *p, size_t idx)
{
    enum pool_state s;

    gw_mutex_lock(&p->lock);
    s = state_now(&p->m[idx], gw_now_ms());
    gw_mutex_unlock(&p->lock);
    return s;
}

/* Calls in the queue that could take upstream 'idx'.  Locked. */
static uint64_t
queued_for_locked(struct pool *p, size_t idx)
{
    uint64_t n = 0;

    assert(gw_mutex_held(&p->lock));
    for (const struct waiter *w = p->q_head; w != NULL; w = w->next)
        n += (w->mask >> idx) & 1;
    return n;
}

size_t
pool_status(struct pool *p, struct pool_upstream_status *out, size_t max)
{
    int64_t now = gw_now_ms();
    size_t i;

    gw_mutex_lock(&p->lock);
    for (i = 0; i < p->n && i < max; i++) {
        struct member *m = &p->m[i];
        struct pool_upstream_status *st = &out[i];

        st->name = m->cfg->name;
        st->url = m->cfg->url;
        st->state = state_now(m, now);
        st->state_left_ms = st->state == POOL_OPEN ? m->open_until_ms - now
                                                   : 0;
        st->held_left_ms = m->hold_until_ms > now ? m->hold_until_ms - now
                                                  : 0;
        st->probe = m->probe;
        st->ready = ready_locked(p, m, now);
        st->inflight = m->inflight;
        st->max_inflight = m->cfg->max_inflight;
        st->queued = queued_for_locked(p, i);
        st->load_known = m->load.at_ms > 0;
        st->load = m->load.last;
        st->load_age_ms = st->load_known ? now - m->load.at_ms : 0;
        st->calls = m->calls;
        memcpy(st->failures, m->failures, sizeof(st->failures));
        st->retries = m->retries;
        st->hedges = m->hedges;
        st->hedges_won = m->hedges_won;
    }
    gw_mutex_unlock(&p->lock);
    return i;
}

/* A family with a sample per upstream: the uint64_t at 'field'.  Locked. */
static void
per_upstream(struct pool *p, struct prom *w, const char *name,
             enum prom_type type, const char *help, size_t field)
{
    prom_family(w, name, type, help);
    for (size_t i = 0; i < p->n; i++) {
        const struct member *m = &p->m[i];
        const struct prom_label l = { "upstream", m->cfg->name };

        prom_uint(w, &l, 1, *(const uint64_t *)(const void *)
                            ((const char *)m + field));
    }
}

/*
 * The calls waiting in the gateway's queue, per upstream that may take
 * them: a call several upstreams serve counts under each of them, so
 * the sum over upstreams can be more than the calls waiting
 * (sum(infergw_tenant_queued) counts each once).  Locked.
 */
static void
render_queued_locked(struct pool *p, struct prom *w)
{
    uint64_t q[CONFIG_MAX_UPSTREAMS] = { 0 };

    assert(gw_mutex_held(&p->lock));
    for (const struct waiter *wt = p->q_head; wt != NULL; wt = wt->next)
        for (size_t i = 0; i < p->n; i++)
            if (wt->mask & (UINT64_C(1) << i))
                q[i]++;
    prom_family(w, "infergw_upstream_queued", PROM_GAUGE, "Calls waiting "
                "for a slot now that this upstream may take (a call "
                "several may take counts under each).");
    for (size_t i = 0; i < p->n; i++) {
        const struct prom_label l = { "upstream", p->m[i].cfg->name };

        prom_uint(w, &l, 1, q[i]);
    }
}

/*
 * What each upstream's engine last reported (upstreams never scraped
 * well have no sample), and whether it is full now.  Locked.
 */
static void
render_engines_locked(struct pool *p, struct prom *w, int64_t now)
{
    static const struct {
        const char *name;
        const char *help;
        size_t field;           /* a double in struct engine_report */
    } reported[] = {
        { "infergw_upstream_engine_waiting", "Requests waiting in the "
          "engine's own queue at the last scrape (vllm:num_requests_"
          "waiting).", offsetof(struct engine_report, waiting) },
        { "infergw_upstream_engine_running", "Requests the engine ran at "
          "the last scrape (vllm:num_requests_running).",
          offsetof(struct engine_report, running) },
        { "infergw_upstream_engine_kv_cache_usage", "The engine's KV cache "
          "usage at the last scrape, 0..1 (vllm:kv_cache_usage_perc).",
          offsetof(struct engine_report, kv_usage) },
    };

    assert(gw_mutex_held(&p->lock));
    for (size_t k = 0; k < GW_ARRAY_LEN(reported); k++) {
        prom_family(w, reported[k].name, PROM_GAUGE, reported[k].help);
        for (size_t i = 0; i < p->n; i++) {
            const struct member *m = &p->m[i];
            const struct prom_label l = { "upstream", m->cfg->name };

            if (m->load.at_ms > 0)
                prom_double(w, &l, 1, *(const double *)(const void *)
                            ((const char *)&m->load.last
                             + reported[k].field));
        }
    }
    prom_family(w, "infergw_upstream_engine_load_age_seconds", PROM_GAUGE,
                "Age of the last good scrape of the engine's GET /metrics; "
                "past load_stale it is not used.");
    for (size_t i = 0; i < p->n; i++) {
        const struct prom_label l = { "upstream", p->m[i].cfg->name };

        if (p->m[i].load.at_ms > 0)
            prom_double(w, &l, 1, (double)(now - p->m[i].load.at_ms) / 1e3);
    }
    prom_family(w, "infergw_upstream_saturated", PROM_GAUGE, "1 while the "
                "upstream takes no new call: at max_inflight, or its engine "
                "saturated (queue at max_waiting, KV cache above kv_high).");
    for (size_t i = 0; i < p->n; i++) {
        const struct prom_label l = { "upstream", p->m[i].cfg->name };

        prom_uint(w, &l, 1, (uint64_t)full(p, &p->m[i], now));
    }
}

/*
 * Per model (the configured ones, then those upstreams listed, at most
 * POOL_MODELS_METRIC_MAX): 1 while every upstream that serves it and is
 * usable is full, so its new calls wait in the gateway.  Locked.
 */
static void
render_models_locked(struct pool *p, struct prom *w, int64_t now)
{
    const char *names[POOL_MODELS_METRIC_MAX];
    size_t n = 0;

    for (size_t i = 0; i < p->n; i++) {
        const struct member *m = &p->m[i];
        size_t k, count = m->cfg->num_models > 0 ? m->cfg->num_models
                                                 : m->num_models;

        for (k = 0; k < count && n < POOL_MODELS_METRIC_MAX; k++) {
            const char *id = m->cfg->num_models > 0 ? m->cfg->models[k]
                                                    : m->ids[k];
            size_t j;

            for (j = 0; j < n && strcmp(names[j], id) != 0; j++)
                ;
            if (j == n)
                names[n++] = id;
        }
    }
    prom_family(w, "infergw_model_saturated", PROM_GAUGE, "1 while every "
                "usable upstream serving the model is full or saturated: "
                "its new calls wait in the gateway.");
    for (size_t j = 0; j < n; j++) {
        const struct prom_label l = { "model", names[j] };
        uint64_t use = usable_mask_locked(p, serving_mask(p, names[j]),
                                          serving_mask(p, names[j]), now,
                                          NULL);
        int all = use != 0;

        for (size_t i = 0; i < p->n && all; i++)
            if (use & (UINT64_C(1) << i))
                all = full(p, &p->m[i], now);
        prom_uint(w, &l, 1, (uint64_t)all);
    }
}

/* A family with a sample per tenant (and its priority): v[t].  Locked. */
static void
per_tenant(struct pool *p, struct prom *w, const char *name,
           enum prom_type type, const char *help, const uint64_t *v,
           double scale)
{
    prom_family(w, name, type, help);
    for (size_t t = 0; t <= p->cfg->num_tenants; t++) {
        size_t i = t < p->cfg->num_tenants ? t : CONFIG_MAX_TENANTS;
        char prio[24];
        const struct prom_label l[] = { { "tenant", tenant_label(p, i) },
                                        { "priority", prio } };

        snprintf(prio, sizeof(prio), "%" PRId64, tenant_priority(p, i));
        if (scale == 1)
            prom_uint(w, l, GW_ARRAY_LEN(l), v[i]);
        else
            prom_double(w, l, GW_ARRAY_LEN(l), (double)v[i] * scale);
    }
}

/* The gateway's queue, per tenant.  Locked. */
static void
render_tenants_locked(struct pool *p, struct prom *w)
{
    assert(gw_mutex_held(&p->lock));
    per_tenant(p, w, "infergw_tenant_queued", PROM_GAUGE, "Calls of the "
               "tenant waiting in the gateway's queue now.", p->t_queued, 1);
    per_tenant(p, w, "infergw_tenant_queue_waits_total", PROM_COUNTER,
               "Calls of the tenant that waited in the queue.", p->t_waits,
               1);
    per_tenant(p, w, "infergw_tenant_queue_wait_seconds_total",
               PROM_COUNTER, "Time the tenant's calls spent in the queue.",
               p->t_wait_ms, 1e-3);
    per_tenant(p, w, "infergw_tenant_queue_timeouts_total", PROM_COUNTER,
               "Calls of the tenant that got no slot within queue_timeout "
               "(503).", p->t_timeouts, 1);
    per_tenant(p, w, "infergw_tenant_shed_total", PROM_COUNTER, "Requests "
               "of a sheddable tenant (priority < 0) answered 429 at once: "
               "every upstream for them was full.", p->t_shed, 1);
}

/* The pool's own counters and gauges, a family of one sample each. */
static void
render_totals_locked(struct pool *p, struct prom *w, size_t panics)
{
    const struct {
        const char *name;
        enum prom_type type;
        const char *help;
        uint64_t value;
    } totals[] = {
        { "infergw_upstream_retries_total", PROM_COUNTER,
          "Attempts made again on another upstream before any byte "
          "reached a client.", p->retries },
        { "infergw_upstream_hedges_total", PROM_COUNTER,
          "Second attempts started after hedge_after without a first body "
          "byte.", p->hedges },
        { "infergw_upstream_retry_budget_exhausted_total", PROM_COUNTER,
          "Retries and hedges refused by the retry budget.",
          p->budget_refused },
        { "infergw_upstream_resends_total", PROM_COUNTER,
          "Calls sent once more on a fresh connection: the reused one was "
          "closed before any answer (counted in "
          "infergw_upstream_calls_total too).", p->resends },
        { "infergw_upstream_unavailable_total", PROM_COUNTER,
          "Requests answered 503 at once: every upstream for them ejected "
          "or held back.", p->unavailable },
        { "infergw_upstream_queue_waits_total", PROM_COUNTER,
          "Calls that waited for a max_inflight slot.", p->queue_waits },
        { "infergw_upstream_queue_timeouts_total", PROM_COUNTER,
          "Calls that got no slot within queue_timeout (503).",
          p->queue_timeouts },
        { "infergw_upstream_poison_requests_total", PROM_COUNTER,
          "Requests that failed the same way on two upstreams: not "
          "counted toward ejection.", p->poison },
        { "infergw_upstream_panic", PROM_GAUGE,
          "Sets of upstreams (a model's) in panic now: fewer than "
          "panic_below usable, so calls go to all of them.", panics },
    };

    assert(gw_mutex_held(&p->lock));
    for (size_t i = 0; i < GW_ARRAY_LEN(totals); i++) {
        prom_family(w, totals[i].name, totals[i].type, totals[i].help);
        prom_uint(w, NULL, 0, totals[i].value);
    }
}

int
pool_render_metrics(struct pool *p, struct buf *out)
{
    struct event pev = NO_EVENT;
    int64_t now = gw_now_ms();
    struct prom w;
    size_t i, k, panics;

    prom_init(&w, out);
    gw_mutex_lock(&p->lock);
    panics = panic_sweep_locked(p, now, &pev);
    prom_family(&w, "infergw_upstream_state", PROM_GAUGE, "Circuit breaker: "
                "0 closed, 1 half-open, 2 open (ejected).");
    for (i = 0; i < p->n; i++) {
        const struct prom_label l = { "upstream", p->m[i].cfg->name };

        prom_int(&w, &l, 1, (int64_t)state_now(&p->m[i], now));
    }
    per_upstream(p, &w, "infergw_upstream_open_calls", PROM_GAUGE,
                 "Calls open on the upstream now.",
                 offsetof(struct member, inflight));
    per_upstream(p, &w, "infergw_upstream_calls_total", PROM_COUNTER,
                 "Calls (attempts) sent to the upstream.",
                 offsetof(struct member, calls));
    per_upstream(p, &w, "infergw_upstream_ejections_total", PROM_COUNTER,
                 "Times the upstream was ejected.",
                 offsetof(struct member, ejections));
    per_upstream(p, &w, "infergw_upstream_ejections_capped_total",
                 PROM_COUNTER, "Ejections max_ejected refused: the "
                 "upstream stayed in.",
                 offsetof(struct member, capped_total));
    prom_family(&w, "infergw_upstream_failures_total", PROM_COUNTER,
                "Failed calls and probes, by kind.");
    for (i = 0; i < p->n; i++)
        for (k = POOL_FAIL_CONNECT; k < POOL_OUTCOME_COUNT; k++) {
            const struct prom_label l[] = {
                { "upstream", p->m[i].cfg->name },
                { "kind", outcome_names[k] },
            };

            prom_uint(&w, l, GW_ARRAY_LEN(l), p->m[i].failures[k]);
        }
    render_queued_locked(p, &w);
    render_engines_locked(p, &w, now);
    render_models_locked(p, &w, now);
    render_tenants_locked(p, &w);
    render_totals_locked(p, &w, panics);
    gw_mutex_unlock(&p->lock);
    log_event(p, &pev);
    return w.rc;
}
