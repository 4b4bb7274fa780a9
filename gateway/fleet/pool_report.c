/* SPDX-License-Identifier: MIT */
/*
 * pool_report.c - what the pool shows (pool.h): the status view's copy
 * of each upstream, and the pool's series of /metrics (per upstream,
 * per engine, per model, and its own totals).  No tenant's: what the
 * queue did with a tenant's calls is reported to tenant.h, the one
 * renderer of a tenant's numbers.  The retry
 * budget's counts are copied under its own lock first, then the rest is
 * read under the pool's: never both at once.
 */
#include "fleet/pool_impl.h"

#include <assert.h>
#include <stddef.h>
#include <string.h>

#include "base/config.h"
#include "base/metrics.h"
#include "buf.h"
#include "fleet/engine.h"
#include "prom.h"
#include "util.h"

size_t
pool_status(struct pool *p, struct pool_upstream_status *out, size_t max)
{
    uint64_t queued[CONFIG_MAX_UPSTREAMS];
    struct pool_budget_counts bc;
    int64_t now = gw_now_ms();
    size_t i;

    pool_budget_read(p, &bc);
    pool_lock(p);
    pool_queued_locked(p, queued);
    for (i = 0; i < p->n && i < max; i++) {
        struct member *m = &p->m[i];
        struct pool_upstream_status *st = &out[i];

        st->name = m->cfg->name;
        st->url = m->cfg->url;
        st->state = pool_state_now_locked(p, m, now);
        st->state_for_ms = now - m->state_since_ms;
        st->state_left_ms = st->state == POOL_OPEN ? m->open_until_ms - now
                                                   : 0;
        st->held_left_ms = m->hold_until_ms > now ? m->hold_until_ms - now
                                                  : 0;
        st->probe = m->probe;
        st->ready = pool_ready_locked(p, m, now);
        st->inflight = m->inflight;
        st->max_inflight = m->cfg->max_inflight;
        st->queued = queued[i];
        st->load_known = m->load.at_ms > 0;
        st->load = m->load.last;
        st->load_age_ms = st->load_known ? now - m->load.at_ms : 0;
        st->calls = m->calls;
        memcpy(st->failures, m->failures, sizeof(st->failures));
        st->retries = bc.up_retries[i];
        st->hedges = bc.up_hedges[i];
        st->hedges_won = bc.up_hedges_won[i];
        pool_lora_status_locked(p, m, st);
    }
    pool_unlock(p);
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
    uint64_t q[CONFIG_MAX_UPSTREAMS];

    pool_queued_locked(p, q);
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

        prom_uint(w, &l, 1, (uint64_t)pool_full_locked(p, &p->m[i], now));
    }
}

/*
 * Per model (the configured ones, then those upstreams listed, at most
 * METRICS_MODELS_MAX, the request metrics' bound too): 1 while every
 * upstream that serves it and is usable is full, so its new calls wait
 * in the gateway.  Locked.
 */
static void
render_models_locked(struct pool *p, struct prom *w, int64_t now)
{
    const char *names[METRICS_MODELS_MAX];
    size_t n = 0;

    for (size_t i = 0; i < p->n; i++) {
        const struct member *m = &p->m[i];
        size_t k, count = m->cfg->num_models > 0 ? m->cfg->num_models
                                                 : m->num_models;

        for (k = 0; k < count && n < METRICS_MODELS_MAX; k++) {
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
        uint64_t set = pool_serving_mask_locked(p, names[j]);
        uint64_t use = pool_usable_mask_locked(p, set, set, now, NULL);
        int all = use != 0;

        for (size_t i = 0; i < p->n && all; i++)
            if (use & (UINT64_C(1) << i))
                all = pool_full_locked(p, &p->m[i], now);
        prom_uint(w, &l, 1, (uint64_t)all);
    }
}

/*
 * The pool's own counters and gauges, a family of one sample each; the
 * budget's from 'bc'.
 */
static void
render_totals_locked(struct pool *p, struct prom *w,
                     const struct pool_budget_counts *bc, size_t panics)
{
    const struct {
        const char *name;
        enum prom_type type;
        const char *help;
        uint64_t value;
    } totals[] = {
        { "infergw_upstream_retries_total", PROM_COUNTER,
          "Attempts made again on another upstream before any byte "
          "reached a client.", bc->retries },
        { "infergw_upstream_hedges_total", PROM_COUNTER,
          "Second attempts started after hedge_after without a first body "
          "byte.", bc->hedges },
        { "infergw_upstream_retry_budget_exhausted_total", PROM_COUNTER,
          "Retries and hedges refused by the retry budget.",
          bc->refused },
        { "infergw_upstream_resends_total", PROM_COUNTER,
          "Calls sent once more on a fresh connection: the reused one was "
          "closed before any answer (counted in "
          "infergw_upstream_calls_total too).", bc->resends },
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
    struct pool_budget_counts bc;
    int64_t now = gw_now_ms();
    struct prom w;
    size_t i, k, panics;

    prom_init(&w, out);
    pool_budget_read(p, &bc);
    pool_lock(p);
    panics = pool_panic_sweep_locked(p, now, &pev);
    prom_family(&w, "infergw_upstream_state", PROM_GAUGE, "Circuit breaker: "
                "0 closed, 1 half-open, 2 open (ejected).");
    for (i = 0; i < p->n; i++) {
        const struct prom_label l = { "upstream", p->m[i].cfg->name };

        prom_int(&w, &l, 1,
                 (int64_t)pool_state_now_locked(p, &p->m[i], now));
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
                { "kind", pool_outcome_name((enum pool_outcome)k) },
            };

            prom_uint(&w, l, GW_ARRAY_LEN(l), p->m[i].failures[k]);
        }
    render_queued_locked(p, &w);
    render_engines_locked(p, &w, now);
    pool_lora_render_locked(p, &w);
    render_models_locked(p, &w, now);
    render_totals_locked(p, &w, &bc, panics);
    pool_unlock(p);
    pool_log_event(p, &pev);
    return w.rc;
}
