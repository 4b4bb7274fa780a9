/* SPDX-License-Identifier: MIT */
/*
 * pool_queue.c - admission (pool.h "Admission"): a call's slot on the
 * upstream the balancer picks among those with a place for it
 * (pool_share.c: the tenants' standing, the places, the reserve), and
 * the queue of calls that found none, with the grants that end their
 * waits.  What the queue does with a tenant's call is the operator's to
 * see: it is reported to tenant.h (tenants_note_queue()), after the
 * unlock.
 *
 * A waiter sleeps on its own condition variable with the pool's lock;
 * whoever frees what it waits for (a slot back, a scrape that shows
 * room) grants it under that lock and signals it there.
 */
#include "fleet/pool_impl.h"

#include <assert.h>
#include <pthread.h>
#include <string.h>

#include "base/config.h"
#include "base/tenant.h"
#include "fleet/engine.h"
#include "util.h"

/* How a waiter's wait stands (what ends it is told under the lock). */
enum wait_state {
    WAIT_WAITING = 0,           /* nothing yet: it times out, or the pool
                                   stops, if nothing comes */
    WAIT_GRANTED,               /* a slot was taken for it (grant) */
    WAIT_HOPELESS,              /* none can come: every upstream it could
                                   use went (ejected, held back) */
    WAIT_GONE,                  /* its caller is gone (pool_want.gone) */
};

/* A call waiting for a slot; lives on its thread's stack. */
struct waiter {
    struct waiter *next;
    pthread_cond_t cv;
    uint64_t mask;              /* upstreams it can use */
    uint64_t serve;             /* its model's set, for panic */
    const char *model;          /* its model (pool_want.model) */
    int64_t since;              /* when it began to wait */
    size_t tenant;              /* its tenant (pool_want.tenant) */
    enum wait_state state;      /* how its wait stands */
    size_t granted;             /* WAIT_GRANTED: the upstream whose slot
                                   it was given ... */
    uint64_t trial;             /* ... and its trial (pool_slot.trial) */
};

/* ---- slots ---- */

/*
 * Is there an upstream of the set 'serve', other than 'idx' and those in
 * 'exclude', that is usable now and has room (pool_slot.other)?
 */
static int
has_other_locked(struct pool *p, uint64_t serve, uint64_t exclude,
                 size_t idx, int64_t now)
{
    uint64_t use;
    size_t i;
    int ok = 0;

    assert(gw_mutex_held(&p->lock));
    use = pool_usable_mask_locked(p, serve, serve & ~exclude
                                  & ~(UINT64_C(1) << idx), now, NULL);
    for (i = 0; i < p->n && !ok; i++)
        ok = (use & (UINT64_C(1) << i)) && !pool_full_locked(p, &p->m[i],
                                                             now);
    return ok;
}

#ifdef INFERGW_UNIT_TEST
int
pool_has_other(struct pool *p, const struct pool_want *want, size_t idx)
{
    int ok;

    pool_lock(p);
    ok = has_other_locked(p, pool_want_set_locked(p, want), want->exclude,
                          idx, gw_now_ms());
    pool_unlock(p);
    return ok;
}
#endif

/* A slot on 'm' (upstream 'idx') for tenant 'tenant', into 'slot'. */
static void
take_slot(struct pool *p, struct member *m, struct pool_slot *slot,
          size_t idx, size_t tenant, int64_t now)
{
    assert(gw_mutex_held(&p->lock));
    m->inflight++;
    m->load.started++;
    m->calls++;
    pool_demand_note_locked(p, tenant, now);
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

void
pool_slot_back_locked(struct pool *p, struct member *m, size_t tenant,
                      int64_t now)
{
    assert(gw_mutex_held(&p->lock));
    m->inflight--;
    m->load.ended++;
    pool_demand_note_locked(p, tenant, now);
    p->t_open[tenant]--;
    p->t_seen_ms[tenant] = now;
}

/* ---- the queue ---- */

static void queue_remove(struct pool *p, struct waiter *w);

/*
 * After an ejection or a hold: a waiter none of whose upstreams is
 * usable now would only sleep to its queue_timeout; tell it at once.
 */
void
pool_wake_hopeless_locked(struct pool *p, int64_t now)
{
    struct waiter *w, *next;

    assert(gw_mutex_held(&p->lock));
    for (w = p->q_head; w != NULL; w = next) {
        next = w->next;
        if (pool_usable_mask_locked(p, w->serve, w->mask, now, NULL) != 0)
            continue;
        w->state = WAIT_HOPELESS;
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
    return pool_tenant_before(p, a->tenant, b->tenant);
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
            || pool_usable_mask_locked(p, w->serve, bit, now, NULL) == 0)
            continue;
        if (best == NULL || goes_before(p, w, best))
            best = w;
    }
    return best;
}

/*
 * Which call of tenant w->tenant takes upstream idx's place (w is its
 * oldest that may use idx; which tenant gets a place is goes_before()'s,
 * and this does not change it): w, when its LoRA adapter is resident
 * there, or nowhere it may go (or it is no adapter); else the oldest of
 * the tenant's calls whose adapter is resident there (it loads
 * nothing), else whose adapter is resident nowhere (it loads somewhere
 * anyway); else w once it has waited POOL_LORA_SPILL_MS, else none:
 * the place waits for a call that loads nothing, or for w's wait to be
 * as long as a load (pool.h "LoRA adapters").
 */
static struct waiter *
lora_waiter_locked(struct pool *p, size_t idx, struct waiter *w,
                   int64_t now)
{
    uint64_t bit = UINT64_C(1) << idx;
    struct waiter *v, *homeless = NULL;

    if (pool_lora_resident_locked(p, bit, w->model, now) != 0
        || pool_lora_resident_locked(p, pool_usable_mask_locked(
               p, w->serve, w->mask, now, NULL), w->model, now) == 0)
        return w;
    for (v = w->next; v != NULL; v = v->next) {
        if (v->tenant != w->tenant || !(v->mask & bit)
            || pool_usable_mask_locked(p, v->serve, bit, now, NULL) == 0)
            continue;
        if (pool_lora_resident_locked(p, bit, v->model, now) != 0)
            return v;
        if (homeless == NULL
            && pool_lora_resident_locked(p, pool_usable_mask_locked(
                   p, v->serve, v->mask, now, NULL), v->model, now) == 0)
            homeless = v;
    }
    if (homeless != NULL)
        return homeless;
    return now - w->since >= POOL_LORA_SPILL_MS ? w : NULL;
}

/*
 * Upstream 'idx' may take calls again (a slot came free, its engine's
 * queue shrank): hand them to the waiters whose turn it is, as long as
 * it is not full.
 */
void
pool_grant_locked(struct pool *p, size_t idx, int64_t now)
{
    struct member *m = &p->m[idx];
    struct waiter *w;
    struct pool_slot s;
    struct places pl = { .learner = -1 };
    enum share sh;
    enum place pk;

    assert(gw_mutex_held(&p->lock));
    while ((w = next_waiter_locked(p, idx, now)) != NULL) {
        sh = pool_share_locked(p, w->tenant, now);
        /* The waiter's fleet is walked only while tenants compete. */
        if (sh != SHARE_ALONE)
            pool_places_locked(p, pool_usable_mask_locked(p, w->serve,
                                                          w->mask, now,
                                                          NULL),
                               now, &pl);
        pk = pool_place_locked(p, idx, sh, &pl, now);
        if (pk == PLACE_NONE
            || (pk == PLACE_PROVEN && sh == SHARE_AHEAD
                && !pool_reserve_left_locked(p, w->tenant, &pl, now)))
            break;
        w = lora_waiter_locked(p, idx, w, now);
        if (w == NULL)
            break;              /* the place waits (lora_waiter_locked) */
        take_slot(p, m, &s, idx, w->tenant, now);
        pool_lora_sent_locked(p, idx, w->model, now);
        w->state = WAIT_GRANTED;
        w->granted = idx;
        w->trial = s.trial;
        queue_remove(p, w);
        pthread_cond_signal(&w->cv);
    }
}

/* ---- admission ---- */

int
pool_acquire(struct pool *p, const struct pool_want *want,
             struct pool_slot *slot, int *retry_after_s)
{
    struct event ev = NO_EVENT, sev = NO_EVENT;
    size_t t = want->tenant <= CONFIG_MAX_TENANTS ? want->tenant
                                                   : CONFIG_MAX_TENANTS;
    uint64_t serve, cand, use, room, open = 0, proven = 0, probe = 0, bit;
    struct places pl = { .learner = -1 };   /* read only while competing */
    int64_t now = gw_now_ms(), deadline;
    struct waiter w;
    size_t i;
    int rc, gone, panic, shed = 0, timed_out = 0;
    int64_t waited_ms = -1;     /* >= 0: it waited in the queue so long */
    enum share sh;

    slot->idx = -1;
    slot->tenant = t;
    slot->trial = 0;
    slot->queued = 0;
    slot->other = 0;
    *retry_after_s = 1;
    pool_lock(p);
    serve = pool_want_set_locked(p, want);
    cand = serve & ~want->exclude;
    use = pool_usable_mask_locked(p, serve, cand, now, &panic);
    /* A panic that leaves nothing to send to (every one held back) has
     * changed no call: not noted. */
    if (panic && use != 0)
        pool_panic_note_locked(p, serve, now, &ev);
    /* A retry or hedge goes on with a request already admitted. */
    sh = want->no_wait ? SHARE_ALONE : pool_share_locked(p, t, now);
    if (sh != SHARE_ALONE)
        pool_places_locked(p, use, now, &pl);
    for (i = 0; i < p->n; i++) {
        bit = UINT64_C(1) << i;
        if (!(use & bit))
            continue;
        if (!pool_full_locked(p, &p->m[i], now))
            open |= bit;
        switch (pool_place_locked(p, i, sh, &pl, now)) {
        case PLACE_PROVEN:
            proven |= bit;
            break;
        case PLACE_PROBE:
            probe |= bit;
            break;
        case PLACE_NONE:
            break;
        }
    }
    /* One ahead of its share leaves the others' reserve; where a room
     * is learned it takes nothing they were counting on. */
    if (proven != 0 && sh == SHARE_AHEAD
        && !pool_reserve_left_locked(p, t, &pl, now))
        proven = 0;
    room = proven != 0 ? proven : probe;
    if (cand == 0) {
        rc = GW_ENOTFOUND;
        goto out;
    }
    if (use == 0) {
        /* A retry or hedge (no_wait) finding none is not a 503: its
         * request is answered with the failure it retried. */
        if (!want->no_wait)
            p->unavailable++;
        *retry_after_s = pool_retry_after_locked(p, serve, cand, now);
        rc = GW_EUNAVAIL;
        goto out;
    }
    /* A LoRA adapter waits for a place where it is, rather than load
     * elsewhere (pool.h); a retry or hedge, or a call that may not wait,
     * goes on where it can. */
    if (room != 0 && !want->no_wait && p->cfg->queue_timeout_ms > 0
        && pool_lora_waits_locked(p, room, use, want->model, now))
        room = 0;
    if (room != 0) {
        i = pool_pick_locked(p, room, use, want->prefix_hash, want->model,
                             now);
        take_slot(p, &p->m[i], slot, i, t, now);
        pool_lora_sent_locked(p, i, want->model, now);
        pool_saturation_note_locked(p, &p->m[i], now, &sev);
        /* The question its caller asks next, in the same hold of the
         * lock and of the same set. */
        slot->other = has_other_locked(p, serve, want->exclude, i, now);
        rc = 0;
        goto out;
    }

    /* Every usable candidate is full or saturated: wait in line. */
    rc = GW_EUNAVAIL;
    if (want->no_wait)
        goto out;
    if (pool_tenant_priority(p, t) < 0 && open == 0) {
        /* Sheddable: the fleet is saturated, so not now (429). */
        shed = 1;
        rc = GW_ESHED;
        goto out;
    }
    rc = GW_ETIMEDOUT;
    if (p->cfg->queue_timeout_ms == 0 || p->stopping) {
        p->queue_timeouts++;
        timed_out = 1;
        rc = p->stopping ? GW_ESTOPPING : GW_ETIMEDOUT;
        goto out;
    }
    memset(&w, 0, sizeof(w));
    gw_cond_init(&w.cv);
    w.mask = use;
    w.serve = serve;
    w.model = want->model;
    w.since = now;
    w.tenant = t;
    w.state = WAIT_WAITING;
    if (p->q_tail != NULL)
        p->q_tail->next = &w;
    else
        p->q_head = &w;
    p->q_tail = &w;
    p->queue_waits++;
    pool_demand_note_locked(p, t, now);
    p->t_queued[t]++;
    if (want->tenants != NULL) {
        /* The operator's count of it (tenant.h), not under this lock:
         * nothing is missed meanwhile, as the loop looks before it
         * waits. */
        pool_unlock(p);
        tenants_note_queue(want->tenants, p->cfg, t, TENANT_QUEUE_ENTERED,
                           0);
        pool_lock(p);
    }
    deadline = now + p->cfg->queue_timeout_ms;
    while (w.state == WAIT_WAITING && !p->stopping) {
        int64_t until = gw_now_ms() + POOL_QUEUE_CHECK_MS;

        if (gw_cond_timedwait(&w.cv, &p->lock,
                              until < deadline ? until : deadline) == 0)
            continue;                   /* signalled (or spurious) */
        if (gw_now_ms() >= deadline)
            break;
        if (want->gone == NULL)
            continue;
        /* Its I/O (a peek at a socket) goes without the lock. */
        pool_unlock(p);
        gone = want->gone(want->gone_arg);
        pool_lock(p);
        if (gone && w.state == WAIT_WAITING) {
            w.state = WAIT_GONE;
            break;
        }
    }
    waited_ms = gw_now_ms() - now;
    pool_demand_note_locked(p, t, now + waited_ms);
    p->t_queued[t]--;
    if (w.state == WAIT_GRANTED) {
        slot->idx = (int)w.granted;
        slot->tenant = t;
        slot->trial = w.trial;
        slot->queued = 1;
        /* Asked afresh: the set may have changed while it waited (then
         * the admission's no longer holds, and it is computed). */
        slot->other = has_other_locked(p, pool_want_set_locked(p, want),
                                       want->exclude, w.granted,
                                       gw_now_ms());
        rc = 0;
    } else if (w.state == WAIT_HOPELESS) {
        /* Every upstream it could use went away (ejected, held back). */
        p->unavailable++;
        *retry_after_s = pool_retry_after_locked(p, serve, w.mask,
                                                 gw_now_ms());
        rc = GW_EUNAVAIL;
    } else if (w.state == WAIT_GONE) {
        queue_remove(p, &w);
        rc = GW_EABORTED;       /* its client left: no slot, no call */
    } else {
        queue_remove(p, &w);
        p->queue_timeouts++;
        timed_out = 1;
        rc = p->stopping ? GW_ESTOPPING : GW_ETIMEDOUT;
    }
    pthread_cond_destroy(&w.cv);

out:
    pool_unlock(p);
    pool_log_event(p, &ev);
    pool_log_event(p, &sev);
    if (shed)
        tenants_note_queue(want->tenants, p->cfg, t, TENANT_QUEUE_SHED, 0);
    if (waited_ms >= 0)
        tenants_note_queue(want->tenants, p->cfg, t, TENANT_QUEUE_LEFT,
                           waited_ms);
    if (timed_out)
        tenants_note_queue(want->tenants, p->cfg, t, TENANT_QUEUE_TIMED_OUT,
                           0);
    return rc;
}

void
pool_stop(struct pool *p)
{
    struct waiter *w;

    pool_lock(p);
    p->stopping = 1;
    for (w = p->q_head; w != NULL; w = w->next)
        pthread_cond_signal(&w->cv);
    pool_unlock(p);
}

void
pool_queued_locked(struct pool *p, uint64_t q[CONFIG_MAX_UPSTREAMS])
{
    assert(gw_mutex_held(&p->lock));
    memset(q, 0, CONFIG_MAX_UPSTREAMS * sizeof(*q));
    for (const struct waiter *w = p->q_head; w != NULL; w = w->next)
        for (size_t i = 0; i < p->n; i++)
            if (w->mask & (UINT64_C(1) << i))
                q[i]++;
}
