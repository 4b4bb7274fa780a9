/* SPDX-License-Identifier: MIT */
/*
 * pool_pick.c - which upstream takes a call (pool.h "Balancing"): the
 * consistent-hash ring for balance = prefix, and the balancers, each
 * choosing among the upstreams pool_queue.c found to have room.
 */
#include "fleet/pool_impl.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "base/config.h"
#include "fleet/engine.h"
#include "util.h"

/* Ring points per unit of weight, and at most per upstream (prefix). */
#define RING_PER_WEIGHT 16
#define RING_MAX_PER_UPSTREAM 4096

uint64_t
pool_hash_str(const char *s, uint64_t salt)
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

int
pool_ring_build(struct pool *p)
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
            p->ring[p->ring_len].hash = pool_hash_str(p->m[i].cfg->name,
                                                      k + 1);
            p->ring[p->ring_len].idx = i;
            p->ring_len++;
        }
    }
    qsort(p->ring, p->ring_len, sizeof(*p->ring), cmp_point);
    return 0;
}

/* Its load as the balancer scores it (engine.h), to compare per weight. */
static double
score(const struct pool *p, const struct member *m, int64_t now)
{
    if (!pool_engine_aware(p))
        return (double)m->inflight;
    return engine_score(&m->load, p->cfg, now, m->inflight);
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

size_t
pool_pick_locked(struct pool *p, uint64_t room, uint64_t usable_mask,
                 uint64_t key, const char *model, int64_t now)
{
    assert(gw_mutex_held(&p->lock));
    /* A LoRA adapter's call: where it is, or has room (least_load and
     * prefix only; the others read no engine). */
    room = pool_lora_group_locked(p, room, model, now);
    switch (p->cfg->balance) {
    case BALANCE_ROUND_ROBIN:
        return pick_round_robin(p, room);
    case BALANCE_PREFIX:
        return pick_prefix(p, room, usable_mask, key, now);
    default:                    /* least_load, least_inflight: score() */
        return pick_two(p, room, now);
    }
}
