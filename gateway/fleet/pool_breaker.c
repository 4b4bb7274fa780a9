/* SPDX-License-Identifier: MIT */
/*
 * pool_breaker.c - each upstream's circuit breaker and what bounds the
 * breakers over a model's set (pool.h): a call's or a probe's outcome
 * judged, ejection and its doubling time, Retry-After holds, the
 * half-open trial, max_ejected and panic.
 *
 * Panic is decided afresh by every call from the states of its set's
 * members; 'panic' (struct pool) only remembers which sets calls found
 * in panic, for the log lines and the gauge, and each check that may
 * end a panic (the end of a call or a probe, a render of /metrics)
 * drops the sets that are out of it.
 */
#include "fleet/pool_impl.h"

#include <assert.h>
#include <stdint.h>

#include "base/config.h"
#include "base/outcome.h"
#include "http.h"
#include "util.h"

/* Ejections in a row that still double eject_time (2^16 is past 5m). */
#define STREAK_MAX 16

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

/* ---- sets: max_ejected and panic, under the lock ---- */

/* How many of the upstreams in 'set' are usable now. */
static size_t
usable_in_locked(struct pool *p, uint64_t set, int64_t now)
{
    size_t i, k = 0;

    assert(gw_mutex_held(&p->lock));

    for (i = 0; i < p->n; i++)
        if ((set & (UINT64_C(1) << i))
            && pool_usable_locked(p, &p->m[i], now))
            k++;
    return k;
}

/* Are fewer than panic_below of the upstreams in 'set' usable now? */
static int
in_panic_locked(struct pool *p, uint64_t set, int64_t now)
{
    assert(gw_mutex_held(&p->lock));
    return (double)usable_in_locked(p, set, now)
           < p->cfg->panic_below * (double)pool_count_of(set);
}

/*
 * Of 'cand' (upstreams of the set 'serve' a call may still try), the ones
 * it may use now: the usable ones, or while 'serve' is in panic (OUT
 * *panic, unless NULL) every one not held back.  Panic overrules the
 * breakers, which may be wrong (a poison request); a Retry-After is the
 * upstream's own word that it cannot take a call now, and calls sent
 * anyway would only earn more 429s and 503s.
 */
uint64_t
pool_usable_mask_locked(struct pool *p, uint64_t serve, uint64_t cand,
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
        if ((cand & bit) && (in ? !pool_held_locked(p, &p->m[i], now)
                                : pool_usable_locked(p, &p->m[i], now)))
            use |= bit;
    }
    return use;
}

int
pool_retry_after_locked(struct pool *p, uint64_t serve, uint64_t mask,
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

void
pool_panic_note_locked(struct pool *p, uint64_t set, int64_t now,
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
size_t
pool_panic_sweep_locked(struct pool *p, int64_t now, struct event *ev)
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
    most = (size_t)(p->cfg->max_ejected * (double)pool_count_of(set)
                    + 1e-9);
    if (most < 1)
        most = 1;               /* one may always be out */
    for (i = 0; i < p->n; i++)
        if ((set & (UINT64_C(1) << i))
            && pool_state_now_locked(p, &p->m[i], now) != POOL_CLOSED)
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
            if (!pool_member_serves_locked(p, m, names[k]))
                continue;
            named = 1;
            if (!set_may_lose_one_locked(p, pool_serving_mask_locked(
                                                p, names[k]), now))
                return 0;
        }
    }
    return named || set_may_lose_one_locked(p, unlisted, now);
}

/* Is 'trial' the half-open upstream's current trial?  Then it is over. */
static void
end_trial(struct member *m, uint64_t trial)
{
    if (trial != 0 && trial == m->trial_gen && m->state == POOL_HALF_OPEN)
        m->trial_out = 0;
}

/*
 * How long an ejection lasts after 'streak' others in a row: eject_time,
 * doubled each time, up to the bound eject_time itself has
 * (CONFIG_MAX_EJECT_MS).
 */
GW_TESTABLE int64_t
eject_ms(int64_t eject_time_ms, unsigned streak)
{
    int64_t ms = eject_time_ms << streak;

    return ms > CONFIG_MAX_EJECT_MS ? CONFIG_MAX_EJECT_MS : ms;
}

/* Eject 'm' (under the lock); fills 'ev' for the log line. */
static void
eject(struct pool *p, struct member *m, int64_t now, const char *why,
      struct event *ev)
{
    int64_t ms;

    if (m->closed_ms != 0 && now - m->closed_ms > CONFIG_MAX_EJECT_MS)
        m->streak = 0;          /* it stayed up long enough: start over */
    ms = eject_ms(p->cfg->eject_time_ms, m->streak);
    if (m->streak < STREAK_MAX)
        m->streak++;
    m->state = POOL_OPEN;
    m->state_since_ms = now;
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
    enum pool_state s = pool_state_now_locked(p, m, now);

    if (o == POOL_NEUTRAL)
        return;
    if (o == POOL_OK) {
        m->fails = 0;
        if (s == POOL_HALF_OPEN) {
            m->state = POOL_CLOSED;
            m->state_since_ms = now;
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
        pool_wake_hopeless_locked(p, now);
}

/* Whether settle() gives a call's slot back. */
enum settle_slot {
    SLOT_KEPT,                  /* a verdict alone: the call goes on
                                   (its answer is in), or it has no slot
                                   (a late verdict, a probe) */
    SLOT_BACK,                  /* the call is over: its slot comes back */
};

/*
 * Judge outcome 'o' for upstream 'idx' (and the end of trial 'trial'),
 * then hand a slot that may have come free to a waiter.  With SLOT_BACK
 * the slot, of tenant 'tenant', comes back first ('tenant' is not read
 * otherwise).
 */
static void
settle(struct pool *p, size_t idx, uint64_t trial, enum settle_slot slot,
       size_t tenant, enum pool_outcome o, int64_t retry_after_ms)
{
    struct event ev = NO_EVENT, pev = NO_EVENT, sev = NO_EVENT;
    struct member *m = &p->m[idx];
    int64_t now = gw_now_ms();

    pool_lock(p);
    if (slot == SLOT_BACK)
        pool_slot_back_locked(p, m, tenant, now);
    end_trial(m, trial);
    judge(p, m, o, retry_after_ms, now, &ev);
    pool_saturation_note_locked(p, m, now, &sev);
    pool_grant_locked(p, idx, now);
    pool_panic_sweep_locked(p, now, &pev);
    pool_unlock(p);
    pool_log_event(p, &ev);
    pool_log_event(p, &pev);
    pool_log_event(p, &sev);
}

void
pool_give_back(struct pool *p, struct pool_slot *slot, enum pool_outcome o,
               int64_t retry_after_ms)
{
    if (slot->idx < 0)
        return;
    settle(p, (size_t)slot->idx, slot->trial, SLOT_BACK, slot->tenant, o,
           retry_after_ms);
    slot->idx = -1;
    slot->trial = 0;
}

void
pool_note_answer(struct pool *p, struct pool_slot *slot)
{
    if (slot->idx < 0)
        return;
    settle(p, (size_t)slot->idx, slot->trial, SLOT_KEPT, 0, POOL_OK, 0);
    slot->trial = 0;
}

void
pool_judge(struct pool *p, size_t idx, enum pool_outcome o, int poison)
{
    if (!poison) {
        settle(p, idx, 0, SLOT_KEPT, 0, o, 0);
        return;
    }
    if (o == POOL_OK || o == POOL_NEUTRAL)
        return;
    pool_lock(p);
    p->m[idx].failures[o]++;
    pool_unlock(p);
}

void
pool_note_poison(struct pool *p)
{
    pool_lock(p);
    p->poison++;
    pool_unlock(p);
}

/* ---- the health beat's probes: trials too ---- */

int
pool_probe_begin(struct pool *p, size_t idx, uint64_t *trial)
{
    struct member *m = &p->m[idx];
    int ok = 1;

    *trial = 0;
    pool_lock(p);
    if (pool_state_now_locked(p, m, gw_now_ms()) == POOL_HALF_OPEN) {
        ok = !m->trial_out;
        if (ok) {
            m->trial_out = 1;
            *trial = ++m->trial_gen;
        }
    }
    pool_unlock(p);
    return ok;
}

void
pool_probe_end(struct pool *p, size_t idx, uint64_t trial,
               enum pool_outcome o, int status)
{
    struct member *m = &p->m[idx];

    /* The verdict first, in a section of its own: a reader in between
     * sees it before the failure it comes with, never the reverse. */
    pool_lock(p);
    if (o != POOL_OK && o != POOL_NEUTRAL)
        m->probe = POOL_PROBE_FAILED;
    else if (status > 0)
        m->probe = POOL_PROBE_PASSED;
    pool_unlock(p);
    settle(p, idx, trial, SLOT_KEPT, 0, o, 0);
}
