/* SPDX-License-Identifier: MIT */
/*
 * pool.c - the upstream fleet (pool.h): the members, the lock and the
 * lifecycle; a member's state as the pool's other files read it; what
 * the health beat and the load scrape feed in; and the log lines noted
 * under the lock.  The pool's other jobs have a file each
 * (pool_impl.h).
 */
#include "fleet/pool.h"

#include <assert.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "base/config.h"
#include "base/metrics.h"
#include "fleet/engine.h"
#include "fleet/pool_impl.h"
#include "log.h"
#include "util.h"

#ifdef INFERGW_UNIT_TEST
static _Atomic uint64_t lock_holds;

void
pool_count_hold(void)
{
    atomic_fetch_add(&lock_holds, 1);
}

uint64_t
pool_lock_holds(void)
{
    return atomic_load(&lock_holds);
}
#endif

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
    gw_mutex_init(&p->models_lock);
    gw_mutex_init(&p->budget.lock);
    p->cfg = cfg;
    p->n = cfg->num_upstreams;
    p->rng = (uint64_t)gw_now_us() | 1;
    p->models_gen = 1;
    p->m = gw_calloc(p->n > 0 ? p->n : 1, sizeof(*p->m));
    if (p->m == NULL)
        goto out;
    for (i = 0; i < p->n; i++) {
        p->m[i].cfg = &cfg->upstreams[i];
        p->m[i].state_since_ms = gw_now_ms();   /* CLOSED from now */
        for (size_t k = 0; k < cfg->upstreams[i].num_models; k++)
            metrics_model_known(cfg->upstreams[i].models[k]);
    }
    if (pool_ring_build(p) != 0)
        goto out;
    ret = p;
    p = NULL;

out:
    pool_free(p);
    return ret;
}

void
pool_free(struct pool *p)
{
    size_t i;

    if (p == NULL)
        return;
    if (p->m != NULL) {
        for (i = 0; i < p->n; i++) {
            pool_models_free(&p->m[i]);
            lora_report_release(&p->m[i].lora.last);
        }
    }
    gw_free(p->m);
    gw_free(p->ring);
    gw_mutex_destroy(&p->budget.lock);
    gw_mutex_destroy(&p->models_lock);
    gw_mutex_destroy(&p->lock);
    gw_free(p);
}

size_t
pool_size(const struct pool *p)
{
    return p->n;
}

/* ---- state, under the lock ---- */

enum pool_state
pool_state_now_locked(struct pool *p, struct member *m, int64_t now)
{
    assert(gw_mutex_held(&p->lock));
    if (m->state == POOL_OPEN && now >= m->open_until_ms) {
        m->state = POOL_HALF_OPEN;
        m->state_since_ms = m->open_until_ms;   /* not when first seen */
        m->trial_out = 0;
    }
    return m->state;
}

int
pool_held_locked(struct pool *p, const struct member *m, int64_t now)
{
    assert(gw_mutex_held(&p->lock));
    return now < m->hold_until_ms;
}

int
pool_usable_locked(struct pool *p, struct member *m, int64_t now)
{
    enum pool_state s = pool_state_now_locked(p, m, now);

    if (pool_held_locked(p, m, now))
        return 0;
    return s == POOL_CLOSED || (s == POOL_HALF_OPEN && !m->trial_out);
}

int
pool_ready_locked(struct pool *p, struct member *m, int64_t now)
{
    if (pool_state_now_locked(p, m, now) == POOL_OPEN || now < m->hold_until_ms)
        return 0;
    return p->cfg->health_interval_ms == 0 || m->probe == POOL_PROBE_PASSED;
}

int
pool_has_room_locked(struct pool *p, const struct member *m)
{
    assert(gw_mutex_held(&p->lock));
    return m->cfg->max_inflight == 0 || m->inflight < m->cfg->max_inflight;
}

int
pool_engine_aware(const struct pool *p)
{
    return p->cfg->balance == BALANCE_LEAST_LOAD
           || p->cfg->balance == BALANCE_PREFIX;
}

/* Is its engine saturated, for a balancer that reads engines? */
static int
engine_full(const struct pool *p, const struct member *m, int64_t now)
{
    return pool_engine_aware(p) && engine_saturated(&m->load, p->cfg, now);
}

int
pool_full_locked(struct pool *p, const struct member *m, int64_t now)
{
    return !pool_has_room_locked(p, m) || engine_full(p, m, now);
}

void
pool_saturation_note_locked(struct pool *p, struct member *m, int64_t now,
                            struct event *ev)
{
    int s = engine_full(p, m, now);

    assert(gw_mutex_held(&p->lock));

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

void
pool_log_event(const struct pool *p, const struct event *ev)
{
    char names[256];

    if (ev->what == NULL)
        return;
    if (ev->set != 0) {
        set_names(p, ev->set, names, sizeof(names));
        log_msg(strcmp(ev->what, "panic") == 0 ? GW_LOG_WARN : GW_LOG_INFO,
                "pool: %s usable=%zu/%zu panic_below=%g%% upstreams=%s",
                ev->what, ev->usable, pool_count_of(ev->set),
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

int
pool_ready(struct pool *p)
{
    int64_t now = gw_now_ms();
    size_t i;
    int ok = 0;

    pool_lock(p);
    for (i = 0; i < p->n && !ok; i++)
        ok = pool_ready_locked(p, &p->m[i], now);
    pool_unlock(p);
    return ok;
}

/* ---- the engines' load (scrape.c) ---- */

struct engine_mark
pool_load_mark(struct pool *p, size_t idx)
{
    struct engine_mark mk;

    pool_lock(p);
    mk = engine_mark(&p->m[idx].load);
    pool_unlock(p);
    return mk;
}

void
pool_set_load(struct pool *p, size_t idx, const struct engine_report *r,
              const struct engine_mark *sent)
{
    struct event ev = NO_EVENT;
    struct member *m = &p->m[idx];
    int64_t now = gw_now_ms();

    pool_lock(p);
    if (r != NULL)
        engine_report(&m->load, r, sent, now);
    else
        engine_unknown(&m->load);
    pool_saturation_note_locked(p, m, now, &ev);
    pool_grant_locked(p, idx, now);
    pool_unlock(p);
    pool_log_event(p, &ev);
}

/* ---- a reload ---- */

void
pool_carry_probes(struct pool *to, struct pool *from)
{
    enum pool_probe v[CONFIG_MAX_UPSTREAMS];
    size_t i, k;

    /* Copied out first: never two pools' locks at once. */
    pool_lock(from);
    for (k = 0; k < from->n; k++)
        v[k] = from->m[k].probe;
    pool_unlock(from);
    pool_lock(to);
    for (i = 0; i < to->n; i++)
        for (k = 0; k < from->n; k++)
            if (strcmp(to->m[i].cfg->name, from->m[k].cfg->name) == 0
                && strcmp(to->m[i].cfg->url, from->m[k].cfg->url) == 0)
                to->m[i].probe = v[k];
    pool_unlock(to);
}

#ifdef INFERGW_UNIT_TEST
enum pool_state
pool_state_of(struct pool *p, size_t idx)
{
    enum pool_state s;

    pool_lock(p);
    s = pool_state_now_locked(p, &p->m[idx], gw_now_ms());
    pool_unlock(p);
    return s;
}
#endif
