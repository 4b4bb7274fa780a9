/* SPDX-License-Identifier: MIT */
/*
 * pool_budget.c - the retry budget (pool.h): retries and hedges
 * together, over the last POOL_BUDGET_WINDOW_S seconds, against the
 * calls started in that window; and the counts of the retries and
 * hedges that went to each upstream, for the status view.
 *
 * Locking: all of it is under the budget's own lock (struct
 * pool_budget), not the pool's: it needs nothing else the pool knows,
 * and a request asks it on its way in.  A resend is also a call the
 * upstream receives, counted under the pool's lock after the budget's
 * is let go: never both at once.
 */
#include "fleet/pool_impl.h"

#include <assert.h>
#include <string.h>

#include "base/config.h"
#include "util.h"

/* The bucket for now, emptied if it holds an older second. */
static size_t
bucket_locked(struct pool_budget *b)
{
    int64_t sec = gw_now_ms() / 1000;
    size_t i = (size_t)(sec % POOL_BUDGET_WINDOW_S);

    assert(gw_mutex_held(&b->lock));
    if (b->bucket_s[i] != sec) {
        b->bucket_s[i] = sec;
        b->bucket_req[i] = 0;
        b->bucket_retry[i] = 0;
    }
    return i;
}

static int
allows_locked(const struct pool *p, struct pool_budget *b)
{
    int64_t sec = gw_now_ms() / 1000;
    uint64_t req = 0, retry = 0;
    double allowed;
    size_t i;

    assert(gw_mutex_held(&b->lock));
    for (i = 0; i < POOL_BUDGET_WINDOW_S; i++) {
        if (sec - b->bucket_s[i] < POOL_BUDGET_WINDOW_S) {
            req += b->bucket_req[i];
            retry += b->bucket_retry[i];
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
    struct pool_budget *b = &p->budget;

    gw_mutex_lock(&b->lock);
    b->bucket_req[bucket_locked(b)]++;
    gw_mutex_unlock(&b->lock);
}

void
pool_note_resend(struct pool *p, struct pool_slot *slot)
{
    struct pool_budget *b = &p->budget;

    if (slot->idx < 0)
        return;
    gw_mutex_lock(&b->lock);
    b->c.resends++;
    b->bucket_retry[bucket_locked(b)]++;
    gw_mutex_unlock(&b->lock);
    pool_lock(p);
    p->m[slot->idx].calls++;
    pool_unlock(p);
}

int
pool_budget_take(struct pool *p, const struct pool_slot *slot, int hedge)
{
    struct pool_budget *b = &p->budget;
    int ok;

    gw_mutex_lock(&b->lock);
    ok = allows_locked(p, b);
    if (ok) {
        b->bucket_retry[bucket_locked(b)]++;
        if (hedge)
            b->c.hedges++;
        else
            b->c.retries++;
        if (slot->idx >= 0 && hedge)
            b->c.up_hedges[slot->idx]++;
        else if (slot->idx >= 0)
            b->c.up_retries[slot->idx]++;
    } else {
        b->c.refused++;
    }
    gw_mutex_unlock(&b->lock);
    return ok;
}

void
pool_note_hedge_won(struct pool *p, const struct pool_slot *slot)
{
    struct pool_budget *b = &p->budget;

    if (slot->idx < 0)
        return;
    gw_mutex_lock(&b->lock);
    b->c.up_hedges_won[slot->idx]++;
    gw_mutex_unlock(&b->lock);
}

int
pool_budget_peek(struct pool *p)
{
    struct pool_budget *b = &p->budget;
    int ok;

    gw_mutex_lock(&b->lock);
    ok = allows_locked(p, b);
    gw_mutex_unlock(&b->lock);
    return ok;
}

void
pool_budget_refuse(struct pool *p)
{
    struct pool_budget *b = &p->budget;

    gw_mutex_lock(&b->lock);
    b->c.refused++;
    gw_mutex_unlock(&b->lock);
}

void
pool_budget_read(struct pool *p, struct pool_budget_counts *out)
{
    struct pool_budget *b = &p->budget;

    gw_mutex_lock(&b->lock);
    memcpy(out, &b->c, sizeof(*out));
    gw_mutex_unlock(&b->lock);
}
