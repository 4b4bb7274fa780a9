/* SPDX-License-Identifier: MIT */
/*
 * pool_budget.c - the retry budget (pool.h): retries and hedges
 * together, over the last POOL_BUDGET_WINDOW_S seconds, against the
 * calls started in that window; and the per-upstream counts of the
 * retries and hedges that went to each, for the status view.
 */
#include "fleet/pool_impl.h"

#include "base/config.h"
#include "util.h"

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
