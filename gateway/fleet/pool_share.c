/* SPDX-License-Identifier: MIT */
/*
 * pool_share.c - the tenants' shares (pool.h "Admission"): where each
 * tenant stands among the active ones, what it asked for lately, the
 * places an engine has for a call while tenants compete, and the
 * reserve a tenant ahead of its share leaves the others.
 *
 * Design.  vLLM's queue knows no tenants, so while tenants compete no
 * call goes into it: a call takes a place a batch has now, or waits in
 * the gateway's queue, where the tenant that goes before (the higher
 * priority, then fewer calls per unit of weight) is served first.  That
 * order alone does not serve a light tenant beside a flood: places come
 * free only as calls end, the flood's long answers hold theirs for as
 * long as they take, and a place the light tenant frees while none of
 * its calls waits goes to the flood for that long.  Two rules close the
 * gap.
 *
 * Places.  A tenant competing with others counts only on places the
 * engines' reads have proved.  An engine's proven room is its batch's
 * room once that is known (engine.h); before, the most it was seen
 * running, or, once another engine of the call's fleet has a known
 * room, at least the smallest such: a fleet is most often replicas of
 * one deployment, so the others are presumed alike (one smaller shows a
 * queue, and is known then; one larger is used as the smaller while
 * tenants compete, and learned when a tenant is alone).  A room is
 * learned by pushing an engine until vLLM queues.  A flood that pushed
 * every engine at once would hold every place by the time the rooms
 * were known, and at its start, its calls all begun within seconds, no
 * place would come free before the first of them ended: a light tenant
 * then waited past queue_timeout (issue 29).  So while no room of its
 * fleet is known, a tenant ahead of its share goes past what an engine
 * proved on one engine only, the one seen running the most (the
 * learner: engine.h's slow start there, PLACE_PROBE), and on the others
 * takes proven places alone.  A tenant under its share may still go
 * past them on any engine whose room is not known while none is: its
 * calls are few, and it goes to the least loaded, which have places.
 *
 * The reserve.  A tenant ahead of its share takes a proven place only
 * while, after it, the places held or left free for the tenants that go
 * before it are at least what they need: their recent demand m (their
 * calls open and waiting, averaged over about the last
 * POOL_TENANT_ACTIVE_MS and summed) plus its standard deviation were
 * their calls Poisson arrivals, ceil(m + sqrt(m)); at least [routing]
 * headroom of the fleet's proven places (0 % turns the reserve off); at
 * most their share by weight of them.  So a light tenant starts each call at once while it has no
 * more calls in flight than that, and the flood keeps every place but
 * the ones the light tenant needs and does not hold: about sqrt(m) + 1
 * idle on average.  A call that finds even those taken waits for the
 * next place to come free, which is its before any of the flood's; its
 * waiting counts in its demand, so a reserve too small grows.
 *
 * A tenant counts for both (it is active) while it has calls open or
 * waiting and for POOL_TENANT_ACTIVE_MS after its last call started or
 * ended: a light tenant that pauses keeps its reserve, and the flood
 * does not fill vLLM's queue in the meantime.
 */
#include "fleet/pool_impl.h"

#include <assert.h>
#include <string.h>

#include "base/config.h"
#include "fleet/engine.h"
#include "util.h"

/* ---- the tenants' standing ---- */

/* Is 'u' a tenant of this configuration (CONFIG_MAX_TENANTS: the
 * default one)? */
static int
configured(const struct pool *p, size_t u)
{
    return u < p->cfg->num_tenants || u == CONFIG_MAX_TENANTS;
}

int64_t
pool_tenant_priority(const struct pool *p, size_t t)
{
    return t < p->cfg->num_tenants ? p->cfg->tenants[t].priority : 0;
}

/* A tenant's weight (CONFIG_MAX_TENANTS: the default's). */
static uint64_t
tenant_weight(const struct pool *p, size_t t)
{
    return t < p->cfg->num_tenants ? p->cfg->tenants[t].weight : 1;
}

int
pool_tenant_before(const struct pool *p, size_t u, size_t t)
{
    int64_t pu = pool_tenant_priority(p, u);
    int64_t pt = pool_tenant_priority(p, t);

    if (pu != pt)
        return pu > pt;
    return p->t_open[u] * tenant_weight(p, t)
           < p->t_open[t] * tenant_weight(p, u);
}

/* Does tenant 't' count for the shares now (pool.h)? */
static int
tenant_active(const struct pool *p, size_t t, int64_t now)
{
    return p->t_open[t] > 0 || p->t_queued[t] > 0
           || (p->t_seen_ms[t] != 0
               && now - p->t_seen_ms[t] <= POOL_TENANT_ACTIVE_MS);
}

enum share
pool_share_locked(struct pool *p, size_t t, int64_t now)
{
    enum share sh = SHARE_ALONE;
    size_t u;

    assert(gw_mutex_held(&p->lock));
    if (!pool_engine_aware(p))
        return SHARE_ALONE;
    for (u = 0; u <= CONFIG_MAX_TENANTS; u++) {
        if (u == t || !configured(p, u) || !tenant_active(p, u, now))
            continue;
        sh = SHARE_FAIR;
        if (pool_tenant_before(p, u, t))
            return SHARE_AHEAD;
    }
    return sh;
}

/* ---- their recent demand ---- */

/*
 * Bring 'd' up to 'now', the count having been 'x' since it was last.
 * Over a step of dt the past keeps T / (T + dt) of its weight (T =
 * POOL_TENANT_ACTIVE_MS): exp(-dt / T) to first order, without libm.
 */
static void
demand_advance(struct pool_demand *d, double x, int64_t now)
{
    double dt, a;

    if (d->at_ms != 0 && now > d->at_ms) {
        dt = (double)(now - d->at_ms);
        a = dt / ((double)POOL_TENANT_ACTIVE_MS + dt);
        d->avg += (x - d->avg) * a;
        d->weight += (1 - d->weight) * a;
    }
    if (now > d->at_ms)
        d->at_ms = now;
}

/* The mean of 'd' brought up to 'now' with 'x' (d is not changed). */
static double
demand_mean(const struct pool_demand *d, double x, int64_t now)
{
    struct pool_demand c = *d;

    demand_advance(&c, x, now);
    return c.weight > 0 ? c.avg / c.weight : x;
}

/* Tenant 't''s calls open and waiting now. */
static double
demand_now(const struct pool *p, size_t t)
{
    return (double)(p->t_open[t] + p->t_queued[t]);
}

void
pool_demand_note_locked(struct pool *p, size_t t, int64_t now)
{
    assert(gw_mutex_held(&p->lock));
    demand_advance(&p->t_demand[t], demand_now(p, t), now);
}

#ifdef INFERGW_UNIT_TEST
double
pool_demand(struct pool *p, size_t t)
{
    double m;

    pool_lock(p);
    m = demand_mean(&p->t_demand[t], demand_now(p, t), gw_now_ms());
    pool_unlock(p);
    return m;
}

void
pool_demand_set(struct pool *p, size_t t, double m)
{
    pool_lock(p);
    p->t_demand[t].avg = m;
    p->t_demand[t].weight = 1;
    p->t_demand[t].at_ms = gw_now_ms();
    pool_unlock(p);
}

void
pool_tenant_age(struct pool *p, size_t t, int64_t ms)
{
    pool_lock(p);
    if (p->t_seen_ms[t] != 0)
        p->t_seen_ms[t] -= ms;
    pool_unlock(p);
}
#endif

/*
 * The places a demand of 'm' needs: ceil(m + sqrt(m)), without libm --
 * the least whole n >= m with (n - m)^2 >= m.
 */
GW_TESTABLE double
demand_need(double m)
{
    double n = (double)(uint64_t)m;

    if (n < m)
        n += 1;
    while ((n - m) * (n - m) < m)
        n += 1;
    return n;
}

/* ---- places ---- */

/*
 * Upstream i's proven room (Places, above), given the fleet's presumed
 * one, and what its engine holds now (OUT both).  -1: its load is not
 * fresh, and neither is set.
 */
static int
proven_room(const struct pool *p, size_t i, double presumed, int64_t now,
            double *room, double *holding)
{
    const struct engine_load *l = &p->m[i].load;

    if (engine_proven(l, p->cfg, now, room, holding) != 0)
        return -1;
    if (!engine_room_known(l) && presumed > *room)
        *room = presumed;
    return 0;
}

void
pool_places_locked(struct pool *p, uint64_t fleet, int64_t now,
                   struct places *pl)
{
    double seen, holding, most = -1;
    size_t i;

    assert(gw_mutex_held(&p->lock));
    memset(pl, 0, sizeof(*pl));
    pl->learner = -1;
    for (i = 0; i < p->n; i++) {
        if (!(fleet & (UINT64_C(1) << i)))
            continue;
        if (engine_proven(&p->m[i].load, p->cfg, now, &seen,
                          &holding) != 0) {
            pl->unknown = 1;
        } else if (engine_room_known(&p->m[i].load)) {
            if (seen > 0 && (pl->presumed == 0 || seen < pl->presumed))
                pl->presumed = seen;
        } else if (seen > most && pool_has_room_locked(p, &p->m[i])) {
            most = seen;                /* ties: the first */
            pl->learner = (int)i;
        }
    }
    /* The learner stays the learner until its room is known: chosen
     * afresh at every read (the one seen running the most), a flood
     * would probe each engine in turn and fill them all. */
    if (pl->presumed > 0) {
        pl->learner = -1;
    } else if (p->learner1 > 0 && (size_t)p->learner1 <= p->n) {
        i = (size_t)p->learner1 - 1;
        if ((fleet & (UINT64_C(1) << i))
            && !engine_room_known(&p->m[i].load)
            && pool_has_room_locked(p, &p->m[i]))
            pl->learner = (int)i;
    }
    p->learner1 = pl->learner + 1;
    for (i = 0; i < p->n; i++) {
        if (!(fleet & (UINT64_C(1) << i))
            || proven_room(p, i, pl->presumed, now, &seen, &holding) != 0)
            continue;
        pl->total += seen;
        if (seen > holding && pool_has_room_locked(p, &p->m[i]))
            pl->free += seen - holding;
    }
}

enum place
pool_place_locked(struct pool *p, size_t i, enum share sh,
                  const struct places *pl, int64_t now)
{
    const struct member *m = &p->m[i];
    double room, holding;

    assert(gw_mutex_held(&p->lock));
    if (sh == SHARE_ALONE || !pool_engine_aware(p))
        return pool_full_locked(p, m, now) ? PLACE_NONE : PLACE_PROVEN;
    if (!pool_has_room_locked(p, m))
        return PLACE_NONE;
    if (proven_room(p, i, pl->presumed, now, &room, &holding) != 0)
        return PLACE_PROVEN;            /* nothing says no */
    if (engine_has_place_within(&m->load, p->cfg, now, room))
        return PLACE_PROVEN;
    if (sh == SHARE_AHEAD ? (int)i != pl->learner
                          : pl->presumed > 0
                            || engine_room_known(&m->load))
        return PLACE_NONE;
    return engine_has_place(&m->load, p->cfg, now) ? PLACE_PROBE
                                                   : PLACE_NONE;
}

/* ---- the reserve ---- */

int
pool_reserve_left_locked(struct pool *p, size_t t, const struct places *pl,
                         int64_t now)
{
    double m = 0, open = 0, need, floor, cap;
    uint64_t w = 0;
    size_t u;

    assert(gw_mutex_held(&p->lock));
    if (pl->unknown || p->cfg->headroom <= 0)
        return 1;                       /* room without end; or off */
    for (u = 0; u <= CONFIG_MAX_TENANTS; u++) {
        if (u == t || !configured(p, u) || !tenant_active(p, u, now)
            || !pool_tenant_before(p, u, t))
            continue;
        m += demand_mean(&p->t_demand[u], demand_now(p, u), now);
        open += (double)p->t_open[u];
        w += tenant_weight(p, u);
    }
    if (w == 0)
        return 1;                       /* none goes before it */
    need = demand_need(m);
    floor = (double)(uint64_t)(p->cfg->headroom * pl->total + 0.5);
    if (need < floor)
        need = floor;
    cap = (double)(uint64_t)(pl->total * (double)w
                             / (double)(w + tenant_weight(p, t)));
    if (need > cap)
        need = cap;
    /* One more taken, the free ones still cover what they need and do
     * not hold. */
    return pl->free - 1 >= need - open;
}
